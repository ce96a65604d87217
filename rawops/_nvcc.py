"""Compile kernels/<family>.cu into one fatbin with nvcc.

Standalone on purpose (standard library only): setup.py loads this file by path at build
time, before rawops or its dependencies are importable, and the development mode in
`_modules.py` reuses it at import to rebuild edited kernels.
"""
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess


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


def find_nvcc():
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")


def source_digest(cu_path, include_dir):
    """Hash of a kernel source, every shared header and the constants it is compiled with:
    the dev-mode cache key."""
    digest = hashlib.sha256(open(cu_path, "rb").read())
    digest.update(" ".join(CONSTANT_DEFINES).encode())
    for root, _, files in sorted(os.walk(include_dir)):
        for name in sorted(files):
            digest.update(name.encode())
            digest.update(open(os.path.join(root, name), "rb").read())
    return digest.hexdigest()[:16]


def compile_fatbin(nvcc, cu_path, include_dir, out_path, archs, log=print, targets=None, cutlass=None):
    """nvcc -> out_path; raises RuntimeError with nvcc's output on failure. `targets`
    (['90a']) replaces `archs` for a file with an arch directive; `cutlass` adds that
    include folder and the flags CuTe needs."""
    gencode = specific_gencode_flags(targets) if targets else gencode_flags(archs)
    extra = [f"-I{cutlass}", *CUTLASS_FLAGS] if cutlass else []
    cmd = [nvcc, *NVCC_FLAGS, *CONSTANT_DEFINES, f"-I{include_dir}", *extra, "--fatbin", *gencode, cu_path, "-o",
           out_path]
    names = (" ".join(f"sm_{t}" for t in targets) if targets
             else " ".join(f"sm_{sm}" + ("+PTX" if ptx else "") for sm, ptx in archs))
    log(f"rawops: nvcc {os.path.basename(cu_path)} -> {os.path.basename(out_path)} [{names}]")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {cu_path}:\n{' '.join(cmd)}\n{done.stdout}{done.stderr}")
    return out_path


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


def write_manifest(fatbin_dir, archs, nvcc, specific=None):
    """Record what the build compiled, for `rawops info` and the build tests; `specific`
    maps a family built for its own targets to them ({"gemm_sm90": ["sm_90a"]})."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    manifest = {**manifest_targets(archs),
                "nvcc": version[-1] if version else "unknown", "flags": list(NVCC_FLAGS),
                "specific": specific or {}}
    with open(os.path.join(fatbin_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def read_manifest(fatbin_dir):
    path = os.path.join(fatbin_dir, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
