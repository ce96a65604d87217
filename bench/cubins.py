"""Cubins of kernels/<family>.cu built with nvcc for the exploration and profiling scripts
(no library build needed): one per set of -D macros, the nvcc runs in parallel, each loaded
through cupy.RawModule. Cached by content (sources, macros, architecture) under bench/.cubins,
so that they can be built on a machine without a GPU (`python bench/cubins.py 90`) and carried
to the GPU machine instead of compiled on its time."""
import glob
import hashlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "bench", ".cubins")


def device_arch():
    """The current GPU's sm_XY number as nvcc spells it ('90' on the H100)."""
    import cupy

    return cupy.cuda.Device().compute_capability


def _cubin_path(family, macros, arch):
    digest = hashlib.sha256(f"{arch} {sorted(macros)}".encode())
    for source in [os.path.join(ROOT, "kernels", f"{family}.cu"),
                   *sorted(glob.glob(os.path.join(ROOT, "kernels", "include", "rawops", "*.cuh")))]:
        with open(source, "rb") as f:
            digest.update(f.read())
    return os.path.join(CACHE, f"{family}-sm{arch}-{digest.hexdigest()[:16]}.cubin")


def build_cubins(family, variants, arch):
    """{key: cubin path} for {key: [macro, ...]} (each 'NAME' or 'NAME=VALUE'), compiling
    only those not cached."""
    os.makedirs(CACHE, exist_ok=True)
    paths, jobs = {}, {}
    for key, macros in variants.items():
        paths[key] = path = _cubin_path(family, macros, arch)
        if not os.path.exists(path):
            jobs[key] = subprocess.Popen(
                ["nvcc", "-O3", "-std=c++17", f"-I{ROOT}/kernels/include", "--cubin", f"-arch=sm_{arch}",
                 *(f"-D{m}" for m in macros), os.path.join(ROOT, "kernels", f"{family}.cu"), "-o", path + ".tmp"])
    for key, proc in jobs.items():
        if proc.wait() != 0:
            raise RuntimeError(f"nvcc failed for {family} {key}: {variants[key]}")
        os.replace(paths[key] + ".tmp", paths[key])
    return paths


def build_source(source, arch):
    """The cubin of an exploration source (bench/explore/*.cu, which may include kernels/*.cu) for
    sm_<arch>, built unless cached by the content of it, kernels/*.cu and the shared headers."""
    digest = hashlib.sha256(arch.encode())
    for path in [source, *sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cu"))),
                 *sorted(glob.glob(os.path.join(ROOT, "kernels", "include", "rawops", "*.cuh")))]:
        with open(path, "rb") as f:
            digest.update(f.read())
    stem = os.path.splitext(os.path.basename(source))[0]
    path = os.path.join(CACHE, f"{stem}-sm{arch}-{digest.hexdigest()[:16]}.cubin")
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run(["nvcc", "-O3", "-std=c++17", f"-I{ROOT}/kernels/include", "--cubin", f"-arch=sm_{arch}",
                        source, "-o", path + ".tmp"], check=True)
        os.replace(path + ".tmp", path)
    return path


def build_modules(family, variants, arch=None):
    """{key: cupy.RawModule} for {key: [macro, ...]}, built or found in the cache."""
    import cupy

    paths = build_cubins(family, variants, arch or device_arch())
    return {key: cupy.RawModule(path=path) for key, path in paths.items()}


if __name__ == "__main__":
    # Pre-build the exploration scripts' cubins for an architecture: python bench/cubins.py 90
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import explore_bias_bwd
    import explore_timeline

    for module in (explore_timeline, explore_bias_bwd):
        for family, variants in module.CUBINS.items():
            print(family, list(build_cubins(family, variants, sys.argv[1]).values()))
