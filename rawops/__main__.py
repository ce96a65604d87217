"""`python -m rawops info`: the build, how each family gets its kernels, the GPU, the kernels.

What needs no GPU is printed first (the build's manifest, each family's status in this
installation); without a usable GPU or driver, one line on stderr says so and the exit code is 1.
"""
import importlib
import inspect
import sys

from . import _modules
from ._nvcc import read_manifest

# Which launch values come from the device (docs/api.md, "Launch shapes").
LAUNCH_SHAPES = ("launch shapes from the device: grid-stride grids = the blocks of each kernel the GPU holds at "
                 "once (the driver's occupancy API, asked once per kernel, block and device, kept in memory: "
                 "no disk cache); SM count, threads an SM, L2 size (cross_entropy's re-read budget) and "
                 "opt-in shared memory from device attributes")


def _fail(message):
    print(f"rawops: {message}", file=sys.stderr)
    return 1


def status_line(family, arch=None):
    """'  elementwise: prebuilt fatbin [...]', or for a family that cannot run here what its ops run."""
    kind, detail = _modules.family_status(family, arch)
    if kind != "unavailable":
        return kind, f"  {family}: {detail}"
    portable = _modules.portable_family(family)
    fallback = f"its ops run the portable {portable} kernels" if portable else "its ops cannot run"
    return kind, f"  {family}: unavailable ({detail}); {fallback}"


def entry_points(family):
    """The kernel names the Python tables launch from the fatbin of kernel file `family`: the
    tables of rawops.<family> or rawops._<family> (gemm_sm90, gemm_tf32), else of the family
    module its name starts with (gemm_small: rawops.gemm; mlp_tiles: rawops.mlp)."""
    from ._launch import FLOAT_SUFFIXES

    for name in (f"rawops.{family}", f"rawops._{family}", f"rawops.{family.split('_')[0]}"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(module, "FAMILY_OF"):  # one table for several kernel files
            return sorted(kernel for kernel, home in module.FAMILY_OF.items() if home == family)
        if hasattr(module, "entry_points"):
            takes_family = "family" in inspect.signature(module.entry_points).parameters
            return list(module.entry_points(family) if takes_family else module.entry_points())
        if hasattr(module, "ENTRY_POINTS"):
            return sorted(module.ENTRY_POINTS)
        suffixes = getattr(module, "SUFFIXES", FLOAT_SUFFIXES)
        return [f"{base}_{suffix}" for base in getattr(module, "KERNELS", {}) for suffix in suffixes]
    return []


def info():
    print(f"rawops {__import__('rawops').__version__} at {_modules.PACKAGE_DIR}")
    manifest = read_manifest(_modules.FATBIN_DIR)
    if manifest:
        print(f"built by nvcc {manifest['nvcc']} for {' '.join(manifest['archs'])} "
              f"(+PTX {' '.join(manifest['ptx']) or 'none'})")
    else:
        print("built without nvcc: no fatbins")
    print("kernel families in this installation:")
    for family in _modules.families():
        print(status_line(family)[1])
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
              f"{props['multiProcessorCount']} SMs, {props['totalGlobalMem'] / 2**30:.1f} GiB, "
              f"{_modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM)} threads an SM, "
              f"{_modules.l2_bytes(device) / 2**20:.0f} MiB L2")
    print(LAUNCH_SHAPES)
    arch = _modules.compute_capability(0)
    print(f"on device 0 (sm_{arch}):")
    failed = False
    for family in _modules.families():
        kind, line = status_line(family, arch)
        if kind == "unavailable":
            print(line)
            continue
        loaded, error = [], None
        for name in entry_points(family):
            try:
                _modules.get_function(family, name, 0)
                loaded.append(name)
            except cupy.cuda.driver.CUDADriverError as failure:
                if "NOT_FOUND" not in str(failure):  # else: an op not instantiated for this dtype
                    error = failure
                    break
            except Exception as failure:  # NVRTC or nvcc rejected the source, a missing file, ...
                error = failure
                break
        if error is not None:
            failed = True
            print(f"{line}; loading failed: {type(error).__name__}: {str(error).splitlines()[0]}")
        else:
            print(f"{line}; {len(loaded)} kernels loaded")
    return 1 if failed else 0


def main(argv):
    if argv[1:] != ["info"]:
        print("usage: python -m rawops info", file=sys.stderr)
        return 2
    return info()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
