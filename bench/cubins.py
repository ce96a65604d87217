"""Cubins of kernels/<family>.cu built here with nvcc for the exploration and profiling scripts
(no library build needed): one per set of -D macros, the nvcc runs in parallel, each loaded
through cupy.RawModule."""
import os
import subprocess

import cupy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def device_arch():
    """The current GPU's sm_XY number as nvcc spells it ('90' on the H100)."""
    return cupy.cuda.Device().compute_capability


def build_modules(family, variants, out_dir, arch=None):
    """{key: cupy.RawModule} for {key: [macro, ...]} (each 'NAME' or 'NAME=VALUE')."""
    arch = arch or device_arch()
    os.makedirs(out_dir, exist_ok=True)
    jobs = {}
    for i, (key, macros) in enumerate(variants.items()):
        path = os.path.join(out_dir, f"{family}_{i}.cubin")
        jobs[key] = path, subprocess.Popen(
            ["nvcc", "-O3", "-std=c++17", f"-I{ROOT}/kernels/include", "--cubin", f"-arch=sm_{arch}",
             *(f"-D{m}" for m in macros), os.path.join(ROOT, "kernels", f"{family}.cu"), "-o", path])
    modules = {}
    for key, (path, proc) in jobs.items():
        if proc.wait() != 0:
            raise RuntimeError(f"nvcc failed for {family} {key}: {variants[key]}")
        modules[key] = cupy.RawModule(path=path)
    return modules
