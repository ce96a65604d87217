"""Compile kernels/<family>.cu into one fatbin with nvcc: which nvcc (locate_nvcc), with what
arguments, and the build cache that reuses a fatbin whose inputs are unchanged (build_fatbin).

Standalone on purpose (standard library only): setup.py loads this file by path at build
time, before rawops or its dependencies are importable, and the development mode in
`_modules.py` reuses it at import to rebuild edited kernels.
"""
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading


def _load_constants():
    # By path, as setup.py loads this file: the constants every kernel is compiled with.
    spec = importlib.util.spec_from_file_location(
        "_rawops_constants", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_constants.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONSTANT_DEFINES = tuple(_load_constants().defines())

# SASS for every generation we ship, PTX of the newest so that later GPUs JIT it.
DEFAULT_ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
ARCH_ENV = "RAWOPS_CUDA_ARCH_LIST"
# Development only: build just these families ("norm softmax"), e.g. a GPU round on one
# family; the others' fatbins are left as they are (absent on a fresh machine).
FAMILIES_ENV = "RAWOPS_FAMILIES"
# --compress-mode=size: nvcc's default left gemm_tf32.s fatbin uncompressed (9.7 MB for
# sm_90, 6.8 MB of it -lineinfo's PTX text; 1.0 MB compressed); the driver decompresses at load.
NVCC_FLAGS = ("-O3", "-lineinfo", "-std=c++17", "--threads", "0", "--compress-mode=size")
# A family that needs an architecture-specific target says so on its first line,
# `// rawops-arch: 90a`: it is built only for those, when the build's list names their base.
ARCH_DIRECTIVE = "// rawops-arch:"
# CuTe/CUTLASS headers (the Hopper GEMM): this folder, else the nvidia-cutlass package's.
CUTLASS_ENV = "RAWOPS_CUTLASS_INCLUDE"
CUTLASS_FLAGS = ("--expt-relaxed-constexpr", "-DNDEBUG")


def parse_arch_list(text):
    """'7.5;8.0 9.0+PTX' or '75,90' -> [(75, False), (80, False), (90, True)].

    The format follows TORCH_CUDA_ARCH_LIST: separators ';', ',' or space, '+PTX' also
    embeds PTX for that architecture.
    """
    archs = []
    for token in text.replace(",", ";").replace(" ", ";").split(";"):
        token = token.strip()
        if not token:
            continue
        ptx = token.upper().endswith("+PTX")
        number = token[:-4] if ptx else token
        digits = number.replace(".", "")
        if not digits.isdigit() or len(digits) < 2:
            raise ValueError(f"{ARCH_ENV}: cannot read architecture {token!r}; expected e.g. 8.0 or 9.0+PTX")
        archs.append((int(digits), ptx))
    if not archs:
        raise ValueError(f"{ARCH_ENV} is empty; expected e.g. {DEFAULT_ARCHS!r}")
    return archs


def selected_families():
    """The families named by RAWOPS_FAMILIES, or None (build all)."""
    text = os.environ.get(FAMILIES_ENV, "").replace(",", " ").split()
    return set(text) if text else None


def target_archs():
    return parse_arch_list(os.environ.get(ARCH_ENV) or DEFAULT_ARCHS)


def gencode_flags(archs):
    flags = []
    for sm, ptx in archs:
        codes = f"sm_{sm},compute_{sm}" if ptx else f"sm_{sm}"
        flags.append(f"-gencode=arch=compute_{sm},code=[{codes}]")
    return flags


def arch_directive(cu_path):
    """The specific targets a kernel file asks for ('90a' -> ['90a']), or None."""
    if not os.path.exists(cu_path):
        return None
    with open(cu_path) as f:
        first = f.readline()
    if not first.startswith(ARCH_DIRECTIVE):
        return None
    return first[len(ARCH_DIRECTIVE):].split()


def specific_targets(directive, archs):
    """The directive's targets whose base architecture the build targets: (['90a'], [(90, False)])
    -> ['90a']; [] when the build targets none of them."""
    bases = {sm for sm, _ in archs}
    return [target for target in directive if int(target.rstrip("abf")) in bases]


def specific_gencode_flags(targets):
    return [f"-gencode=arch=compute_{t},code=sm_{t}" for t in targets]


def uses_cutlass(cu_path):
    with open(cu_path) as f:
        return "#include <cute/" in f.read()


def cutlass_include():
    """The folder holding cute/ and cutlass/ headers, or None: $RAWOPS_CUTLASS_INCLUDE, else
    the `nvidia-cutlass` package's (found without importing it: it imports heavy modules)."""
    folder = os.environ.get(CUTLASS_ENV)
    if not folder:
        import importlib.util

        try:
            spec = importlib.util.find_spec("cutlass_library")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = os.path.join(list(spec.submodule_search_locations)[0], "source", "include")
    return folder if os.path.isfile(os.path.join(folder, "cute", "tensor.hpp")) else None


NVCC_ENV = "RAWOPS_NVCC"
# The toolkit the build installs where no nvcc is found (the in-tree backend, _build/backend.py),
# pinned to the CUDA release the project builds and tests its fatbins with, so that a build with
# it compiles the same SASS. nvidia-cuda-nvcc alone pulls nvvm (cicc), crt and the runtime headers
# unpinned; the kernels also include CUB (nvidia-cuda-cccl) and cuda.h / mma.h / cuda_fp16.h
# (nvidia-cuda-runtime). The test extra in pyproject.toml pins the same.
NVCC_WHEELS = ("nvidia-cuda-nvcc==13.0.88", "nvidia-nvvm==13.0.88", "nvidia-cuda-crt==13.0.88",
               "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cccl==13.0.85")
NVCC_WHEEL_ORIGIN = "the nvidia-cuda-nvcc wheel"


def _wheel_nvcc():
    """nvidia/cu<major>/bin/nvcc of an installed nvidia-cuda-nvcc wheel (the newest major), or None.
    Looked up on sys.path without importing anything: the `nvidia` namespace holds heavy packages."""
    found = []
    for entry in sys.path:
        for candidate in glob.glob(os.path.join(entry or ".", "nvidia", "cu*", "bin", "nvcc")):
            major = os.path.basename(os.path.dirname(os.path.dirname(candidate)))[2:]
            if major.isdigit() and os.access(candidate, os.X_OK):
                found.append((int(major), candidate))
    return max(found, key=lambda item: item[0])[1] if found else None  # first on sys.path within a major


def locate_nvcc():
    """(path, where it was found) of the nvcc to build with, or (None, why none). First match wins:
    $RAWOPS_NVCC (a path, or `none`: build without nvcc), $CUDA_HOME/bin, $CUDA_PATH/bin, PATH,
    the nvidia-cuda-nvcc wheel."""
    chosen = os.environ.get(NVCC_ENV, "").strip()
    if chosen.lower() == "none":
        return None, f"{NVCC_ENV}=none"
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise FileNotFoundError(f"{NVCC_ENV}={chosen!r} is not an executable nvcc")
        return chosen, NVCC_ENV
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(variable)
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc"), variable
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path, "PATH"
    wheel = _wheel_nvcc()
    if wheel:
        return wheel, NVCC_WHEEL_ORIGIN
    return None, "looked in CUDA_HOME, CUDA_PATH, PATH and for the nvidia-cuda-nvcc wheel"


def find_nvcc():
    """The nvcc to build with (locate_nvcc's order), or None."""
    return locate_nvcc()[0]


_versions = {}


def nvcc_version(nvcc):
    """`nvcc --version` as printed (asked once per path): part of the build cache's key."""
    version = _versions.get(nvcc)
    if version is None:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{nvcc} --version failed:\n{done.stdout}{done.stderr}")
        version = _versions[nvcc] = done.stdout.strip()
    return version


def nvcc_arguments(archs, targets=None, cutlass=False):
    """nvcc's arguments other than paths: flags, constants, targets. The build cache's key holds
    exactly these, so a flag added here invalidates every cached fatbin."""
    gencode = specific_gencode_flags(targets) if targets else gencode_flags(archs)
    return [*NVCC_FLAGS, *CONSTANT_DEFINES, *(CUTLASS_FLAGS if cutlass else ()), "--fatbin", *gencode]


def _cutlass_version(cutlass):
    path = os.path.join(cutlass, "cutlass", "version.h")
    if not os.path.isfile(path):
        return b"unversioned " + cutlass.encode()
    with open(path, "rb") as f:
        return f.read()


def fatbin_digest(nvcc_version_text, cu_path, include_dir, archs, targets=None, cutlass=None):
    """The key of a compiled fatbin, for the build cache and the development rebuild alike: the
    kernel source, every shared header (name and bytes), nvcc's arguments (flags, constants,
    targets), nvcc's version and, for a CuTe family, the CuTe/CUTLASS headers' version. The
    toolkit's own headers (CUB, cuda_fp16.h) come with its nvcc and are keyed by its version."""
    digest = hashlib.sha256()

    def part(label, data):
        digest.update(b"%s %d\n" % (label.encode(), len(data)))
        digest.update(data)

    with open(cu_path, "rb") as f:
        part("source", f.read())
    for root, dirs, files in os.walk(include_dir):
        dirs.sort()
        for name in sorted(files):
            with open(os.path.join(root, name), "rb") as f:
                part(os.path.relpath(os.path.join(root, name), include_dir).replace(os.sep, "/"), f.read())
    part("arguments", "\0".join(nvcc_arguments(archs, targets, cutlass is not None)).encode())
    part("nvcc", nvcc_version_text.encode())
    if cutlass:
        part("cutlass", _cutlass_version(cutlass))
    return digest.hexdigest()[:16]


def target_names(archs, targets=None):
    """'sm_75 sm_90+PTX' (or 'sm_90a' for specific targets), as the build's log lines print them."""
    if targets:
        return " ".join(f"sm_{t}" for t in targets)
    return " ".join(f"sm_{sm}" + ("+PTX" if ptx else "") for sm, ptx in archs)


def compile_fatbin(nvcc, cu_path, include_dir, out_path, archs, log=print, targets=None, cutlass=None, note=""):
    """nvcc -> out_path; raises RuntimeError with nvcc's output on failure. `targets`
    (['90a']) replaces `archs` for a file with an arch directive; `cutlass` adds that
    include folder and the flags CuTe needs. `note` ends the log line."""
    cmd = [nvcc, *nvcc_arguments(archs, targets, cutlass is not None), f"-I{include_dir}",
           *([f"-I{cutlass}"] if cutlass else []), cu_path, "-o", out_path]
    log(f"rawops: nvcc {os.path.basename(cu_path)} -> {os.path.basename(out_path)} [{target_names(archs, targets)}]"
        f"{note}")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {cu_path}:\n{' '.join(cmd)}\n{done.stdout}{done.stderr}")
    return out_path


# ------------------------------------------------------------------------------ the build cache
CACHE_ENV = "RAWOPS_BUILD_CACHE"
# Fatbins kept per family, newest used first: a few source versions x the architecture lists
# in use (the default list, a packaging test's 9.0, a development rebuild's one GPU).
CACHE_KEEP = 8


def cache_dir():
    """Where compiled fatbins are kept by key: $RAWOPS_BUILD_CACHE, else
    $XDG_CACHE_HOME/rawops/fatbin, else ~/.cache/rawops/fatbin."""
    folder = os.environ.get(CACHE_ENV)
    if folder:
        return os.path.abspath(os.path.expanduser(folder))
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rawops", "fatbin")


def cached_fatbin_path(cache, family, digest):
    return os.path.join(cache, f"{family}-{digest}.fatbin")


def _copy_atomically(src, dst):
    # Concurrent builds (pip and a test, two checkouts) never see half a file.
    tmp = f"{dst}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def prune_cache(cache, family, keep=CACHE_KEEP):
    """Delete all but the `keep` most recently used fatbins of `family` (a hit refreshes its time)."""
    entries = []
    for path in glob.glob(os.path.join(glob.escape(cache), f"{glob.escape(family)}-*.fatbin")):
        try:
            entries.append((os.path.getmtime(path), path))
        except OSError:  # pruned by a concurrent build
            pass
    for _, path in sorted(entries, reverse=True)[keep:]:
        try:
            os.remove(path)
        except OSError:
            pass


def build_fatbin(nvcc, cu_path, include_dir, out_path, archs, targets=None, cutlass=None, cache=None, log=print):
    """out_path for this source, these targets and this nvcc: copied from the cache when it holds
    the same key (fatbin_digest), else compiled and stored there. One log line says which.
    Returns (digest, 'reused' or 'compiled'). cache=None compiles without the cache."""
    family = os.path.splitext(os.path.basename(cu_path))[0]
    digest = fatbin_digest(nvcc_version(nvcc), cu_path, include_dir, archs, targets, cutlass)
    names = target_names(archs, targets)
    cached = cached_fatbin_path(cache, family, digest) if cache else None
    if cached and os.path.isfile(cached):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
            _copy_atomically(cached, out_path)
            os.utime(cached)  # most recently used: pruned last
            log(f"rawops: reused {family}.fatbin [{names}] from the build cache: {cached}")
            return digest, "reused"
        except FileNotFoundError:  # pruned meanwhile by a concurrent build: compile it
            pass
    note = f", to the build cache as {os.path.basename(cached)}" if cached else ", no build cache"
    compile_fatbin(nvcc, cu_path, include_dir, out_path, archs, log=log, targets=targets, cutlass=cutlass, note=note)
    if cached:
        try:
            os.makedirs(cache, exist_ok=True)
            _copy_atomically(out_path, cached)
            prune_cache(cache, family)
        except OSError as error:  # a read-only or full cache costs the next build a compile, nothing more
            log(f"rawops: could not store {family}.fatbin in the build cache {cache}: {error}")
    return digest, "compiled"


MANIFEST = "manifest.json"


def manifest_targets(archs):
    """The manifest's record of a build's targets: {'archs': ['sm_80', ...], 'ptx': ['compute_90']}."""
    return {"archs": [f"sm_{sm}" for sm, _ in archs], "ptx": [f"compute_{sm}" for sm, ptx in archs if ptx]}


def kept_fatbins_conflict(fatbin_dir, archs, kept):
    """Why a build of some families (RAWOPS_FAMILIES) cannot keep the fatbins of the others
    (`kept`) under one manifest: they were built for other targets than `archs`; None if it can."""
    if not kept:
        return None
    old = read_manifest(fatbin_dir)
    old_targets = {key: old.get(key) for key in ("archs", "ptx")} if old else None
    if old_targets == manifest_targets(archs):
        return None
    built = f"{old_targets['archs']} + PTX {old_targets['ptx']}" if old_targets else "unrecorded targets"
    new = manifest_targets(archs)
    return (f"{FAMILIES_ENV} keeps {', '.join(sorted(kept))} as built for {built}, but this build targets "
            f"{new['archs']} + PTX {new['ptx']}: set {ARCH_ENV} as for that build, or build every family")


def write_manifest(fatbin_dir, archs, nvcc, specific=None, unavailable=None, digests=None):
    """Record what the build made, for `rawops info` and the build tests: the targets, nvcc's
    version and flags (a fatbin reused from the cache was compiled with the same: they are in its
    key), `specific`: a family built for its own targets ({"gemm_sm90": ["sm_90a"]}),
    `unavailable`: a family not built and why, `digests`: each fatbin's build-cache key."""
    version = nvcc_version(nvcc).splitlines()
    manifest = {**manifest_targets(archs),
                "nvcc": version[-1] if version else "unknown", "flags": list(NVCC_FLAGS),
                "specific": specific or {}, "unavailable": unavailable or {}, "digests": digests or {}}
    with open(os.path.join(fatbin_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def read_manifest(fatbin_dir):
    path = os.path.join(fatbin_dir, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
