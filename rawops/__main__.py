"""`python -m rawops info`: the GPU, the driver, what each fatbin holds, the kernels."""
import os
import sys

from . import _modules
from ._fatbin_info import fatbin_architectures
from ._nvcc import read_manifest


def _fail(message):
    print(f"rawops: {message}", file=sys.stderr)
    return 1


def info():
    print(f"rawops {__import__('rawops').__version__} at {_modules.PACKAGE_DIR}")
    manifest = read_manifest(_modules.FATBIN_DIR)
    if manifest:
        print(f"  built by {manifest['nvcc']} for {' '.join(manifest['archs'])} (+PTX {' '.join(manifest['ptx'])})")
    for family in _modules.families():
        path = _modules.fatbin_path(family)
        if os.path.exists(path):
            print(f"  {family}: {os.path.basename(path)} [{' '.join(fatbin_architectures(path))}]")
        else:
            print(f"  {family}: no fatbin; compiled from source with NVRTC at first use")
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return _fail("no NVIDIA driver (libcuda.so.1) on this machine, so no GPU to run kernels on")
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no driver, no GPU, or a driver too old for this CUDA
        return _fail(f"no usable CUDA GPU here ({type(error).__name__}: {str(error).splitlines()[0]})")
    if count == 0:
        return _fail("no CUDA GPU found")
    driver = cupy.cuda.runtime.driverGetVersion()
    print(f"driver: CUDA {driver // 1000}.{driver % 1000 // 10}")
    for device in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(device)
        print(f"device {device}: {props['name'].decode()} sm_{props['major']}{props['minor']}, "
              f"{props['multiProcessorCount']} SMs, {props['totalGlobalMem'] / 2**30:.1f} GiB")
    import importlib

    from ._launch import FLOAT_SUFFIXES

    for family in _modules.families():  # every kernel each family's table lists, per dtype
        table = getattr(importlib.import_module(f"rawops.{family}"), "KERNELS", {})
        loaded = []
        for base in table:
            for suffix in FLOAT_SUFFIXES:
                try:
                    _modules.get_function(family, f"{base}_{suffix}", 0)
                    loaded.append(f"{base}_{suffix}")
                except cupy.cuda.driver.CUDADriverError as error:
                    if "NOT_FOUND" not in str(error):  # else: an op not instantiated for this dtype
                        raise
        print(f"{family}: {len(loaded)} kernels loaded on device 0: {' '.join(loaded)}")
    return 0


def main(argv):
    if argv[1:] != ["info"]:
        print("usage: python -m rawops info", file=sys.stderr)
        return 2
    return info()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
