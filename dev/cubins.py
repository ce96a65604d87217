"""Cubins of kernels/<family>.cu (or of an experiment's own .cu that includes it) built with nvcc,
one per set of -D macros, for timing variants side by side in one process without a library
build. The nvcc runs go in parallel, with the library's own flags and constants (rawops/_nvcc.py:
every rawops/_constants.py value as -DRAWOPS_<NAME>; a variant's macro of the same name replaces
it) and, for a family with an arch directive (`// rawops-arch: 90a`), its specific target. Cached
by content (sources, shared headers, macros and constants, architecture) under dev/.cubins: build
them where nvcc is (`python dev/cubins.py 90 elementwise RAWOPS_MAP_UNROLL=2`) and carry
dev/.cubins to the GPU machine instead of compiling on its time; `xz dev/.cubins/*.cubin` first where
they would pass the carry's 64 MiB (a <name>.cubin.xz is unpacked on first use).

    from cubins import build_modules
    modules = build_modules("elementwise", {"shipped": [], "unroll2": ["RAWOPS_MAP_UNROLL=2"]})
    relu = {key: m.get_function("relu_fwd_f16") for key, m in modules.items()}
"""
import glob
import hashlib
import importlib.util
import lzma
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "dev", ".cubins")
INCLUDE = os.path.join(ROOT, "kernels", "include")


def _nvcc_helpers():
    # By path, as setup.py does: rawops need not be built or importable here.
    spec = importlib.util.spec_from_file_location("_rawops_nvcc", os.path.join(ROOT, "rawops", "_nvcc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def device_arch():
    """The current GPU's architecture as nvcc spells it ('90' on the H100)."""
    import cupy

    return cupy.cuda.Device().compute_capability


def _target(source, arch):
    """sm_<arch>, or the source's specific target on that base ('90' -> 'sm_90a')."""
    with open(source) as f:
        directive = re.search(r"//\s*rawops-arch:\s*(\S+)", f.readline())
    if directive:
        for target in directive.group(1).split(","):
            if re.match(rf"{arch}\D*$", target.strip()):
                return f"sm_{target.strip()}"
    return f"sm_{arch}"


def _defines(helpers, macros):
    """The library's constants as -D flags, less those a variant's macros name, then the macros."""
    named = {m.split("=", 1)[0] for m in macros}
    constants = [d for d in helpers.CONSTANT_DEFINES if d[2:].split("=", 1)[0] not in named]
    return [*constants, *(f"-D{m}" for m in macros)]


def _digest(sources, defines, arch):
    digest = hashlib.sha256(f"{arch} {sorted(defines)}".encode())
    for path in [*sources, *sorted(glob.glob(os.path.join(INCLUDE, "rawops", "*.cuh")))]:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def unpacked(path):
    """path, unpacked first from path + '.xz' where only that is here (cubins carried compressed: a
    19 MB cubin is ~1.5 MB)."""
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        with lzma.open(path + ".xz") as packed, open(path + ".tmp", "wb") as f:
            f.write(packed.read())
        os.replace(path + ".tmp", path)
    return path


def build_cubins(source, variants, arch):
    """{key: cubin path} for {key: [macro, ...]} (each 'NAME' or 'NAME=VALUE') of `source`: a
    family name (kernels/<family>.cu) or a path to a .cu file. Compiles only those not cached."""
    path = source if source.endswith(".cu") else os.path.join(ROOT, "kernels", f"{source}.cu")
    stem = os.path.splitext(os.path.basename(path))[0]
    # an experiment's own source may include any kernel file: all of them are in its key
    sources = ([path] if not source.endswith(".cu")
               else [path, *sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cu")))])
    helpers = _nvcc_helpers()
    target = _target(path, arch)
    os.makedirs(CACHE, exist_ok=True)
    paths = {key: os.path.join(CACHE, f"{stem}-{target}-{_digest(sources, _defines(helpers, macros), arch)}.cubin")
             for key, macros in variants.items()}
    for out in paths.values():
        unpacked(out)
    missing = [key for key, out in paths.items() if not os.path.exists(out)]
    jobs = {}
    if missing:  # nvcc (and the CuTe headers) only for what the cache lacks: carried cubins need neither
        nvcc = helpers.find_nvcc()
        if nvcc is None:
            raise RuntimeError("nvcc not found (set CUDA_HOME or put it on PATH)")
        extra = []
        if helpers.uses_cutlass(path):
            cutlass = helpers.cutlass_include()
            if cutlass is None:
                raise RuntimeError(f"{path} needs the CuTe headers: pip install nvidia-cutlass "
                                   f"or set {helpers.CUTLASS_ENV}")
            extra = [f"-I{cutlass}", *helpers.CUTLASS_FLAGS]
        flags = [f for f in helpers.NVCC_FLAGS if f != "--compress-mode=size"]
        for key in missing:
            jobs[key] = subprocess.Popen([nvcc, *flags, f"-I{INCLUDE}", *extra, "--cubin", f"-arch={target}",
                                          *_defines(helpers, variants[key]), path, "-o", paths[key] + ".tmp"])
    for key, proc in jobs.items():
        if proc.wait() != 0:
            raise RuntimeError(f"nvcc failed for {stem} {key}: {variants[key]}")
        os.replace(paths[key] + ".tmp", paths[key])
    return paths


def build_modules(source, variants, arch=None):
    """{key: cupy.RawModule} for {key: [macro, ...]}, built or found in the cache."""
    import cupy

    paths = build_cubins(source, variants, arch or device_arch())
    return {key: cupy.RawModule(path=path) for key, path in paths.items()}


def function_of(module):
    """A stand-in for rawops._gemm_sm90.function (name, device, shared) -> CUfunction pointer that
    takes the kernels from `module` (a cupy.RawModule of a cubin); the RawKernels stay alive with it."""
    kept = {}

    def function(name, device, shared=0):
        kernel = kept.get(name)
        if kernel is None:
            kernel = kept[name] = module.get_function(name)
        if shared > kernel.max_dynamic_shared_size_bytes:
            kernel.max_dynamic_shared_size_bytes = shared
        return kernel.kernel.ptr
    return function


if __name__ == "__main__":
    # python dev/cubins.py <arch> <family or .cu> [MACRO[=VALUE] ...]: build one variant, print its path
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    print(build_cubins(sys.argv[2], {"variant": sys.argv[3:]}, sys.argv[1])["variant"])
