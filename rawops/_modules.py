"""Find each kernel family's code and load it once per device through cupy.RawModule.

Where the code comes from, first match wins:
  config.dev_kernels kernels/<family>.cu of a source checkout, rebuilt with nvcc for the
                     current GPU whenever its content hash changes (cached on disk);
  installed fatbin   rawops/_fatbin/<family>.fatbin, built by setup.py;
  NVRTC fallback     the shipped source compiled through CuPy at first use (one warning;
                     CuPy caches the result on disk). Not for a family built for specific
                     targets (`// rawops-arch: 90a`, CuTe headers): without its fatbin it
                     is unavailable (FamilyUnavailable) and its callers use portable kernels.
Kernels are looked up by their extern "C" names, `<op>_<direction>_<dtype>`.
"""
import os
import threading
import warnings

from . import _nvcc, config

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
FATBIN_DIR = os.path.join(PACKAGE_DIR, "_fatbin")
CHECKOUT_KERNELS = os.path.join(os.path.dirname(PACKAGE_DIR), "kernels")
DEV_CACHE = _nvcc.cache_dir()  # the build's cache: one key (fatbin_digest) for both

_lock = threading.Lock()
_modules = {}  # (family, device) -> cupy.RawModule
_functions = {}  # (family, name, device) -> cupy.RawKernel, kept alive with its module
_pointers = {}  # (family, name, device) -> its CUfunction handle
_nvrtc_warned = set()


class FamilyUnavailable(RuntimeError):
    """A kernel family has no code for this GPU in this installation."""


def _is_checkout_kernels(path):
    # Installed, the folder beside rawops/ is site-packages, where another distribution's
    # top-level `kernels` package may live: only rawops' own sources count.
    return os.path.isfile(os.path.join(path, "include", "rawops", "dtype.cuh")) and os.path.isfile(
        os.path.join(os.path.dirname(path), "setup.py"))


def kernel_source_dir():
    """The kernels/ folder: the checkout's in a source tree, else the copy in the package."""
    if _is_checkout_kernels(CHECKOUT_KERNELS):
        return CHECKOUT_KERNELS
    return os.path.join(PACKAGE_DIR, "_kernels")


def families():
    """Every kernel family this installation knows, by fatbin or by source."""
    names = set()
    if os.path.isdir(FATBIN_DIR):
        names.update(f[: -len(".fatbin")] for f in os.listdir(FATBIN_DIR) if f.endswith(".fatbin"))
    source_dir = kernel_source_dir()
    if os.path.isdir(source_dir):
        names.update(f[: -len(".cu")] for f in os.listdir(source_dir) if f.endswith(".cu"))
    return sorted(names)


def fatbin_path(family):
    return os.path.join(FATBIN_DIR, f"{family}.fatbin")


def portable_family(family):
    """The family whose portable kernels run the ops of an architecture-specific one
    (`<name>_sm<NN>` -> `<name>`: gemm_sm90 -> gemm), or None."""
    base, _, suffix = family.rpartition("_")
    if base and suffix.startswith("sm") and suffix[2:].isdigit() and base in families():
        return base
    return None


def _runs_on(architectures, arch):
    """Whether a fatbin holding `architectures` ('sm_80', 'compute_120') has code for sm_<arch>:
    SASS of the same major and no newer minor, or PTX of no newer architecture (JIT-compiled)."""
    for name in architectures:
        kind, _, number = name.partition("_")
        sm = int(number.rstrip("abf"))
        if (kind == "sm" and sm // 10 == arch // 10 and sm <= arch) or (kind == "compute" and sm <= arch):
            return True
    return False


def family_status(family, arch=None):
    """How `family` gets its kernels here, as `_load_module` decides: (kind, detail), kind one of
    'fatbin' (prebuilt), 'nvrtc' (the shipped source compiled at first use), 'dev'
    (config.dev_kernels) or 'unavailable'. `arch` (90 for sm_90): the GPU's, or None to judge
    the installation alone. `python -m rawops info` prints it."""
    from ._fatbin_info import fatbin_architectures

    cu_path = os.path.join(kernel_source_dir(), f"{family}.cu")
    has_source = os.path.isfile(cu_path)
    directive = _nvcc.arch_directive(cu_path)
    path = fatbin_path(family)
    if directive and arch is not None and not _nvcc.specific_targets(directive, [(arch, False)]):
        return "unavailable", f"its kernels are for {' '.join('sm_' + t for t in directive)} only, not sm_{arch}"
    if config.dev_kernels and has_source:
        return "dev", f"config.dev_kernels: {family}.cu rebuilt with nvcc for the GPU, cached in {DEV_CACHE}"
    manifest = _nvcc.read_manifest(FATBIN_DIR) or {}
    if os.path.exists(path) and (directive or not config.force_nvrtc):
        # The fatbin's entries name sm_90 for sm_90a: the manifest has the specific targets.
        architectures = (directive and manifest.get("specific", {}).get(family)) or fatbin_architectures(path)
        if arch is not None and not directive and not _runs_on(architectures, arch):
            return "unavailable", f"its fatbin holds no code for sm_{arch} ({' '.join(architectures)})"
        return "fatbin", f"prebuilt fatbin [{' '.join(architectures)}]"
    if directive:
        if not manifest:
            return "unavailable", "this installation was built without nvcc"
        return "unavailable", manifest.get("unavailable", {}).get(family, "not built in this installation")
    if has_source:
        why = "config.force_nvrtc" if config.force_nvrtc else "no fatbin: nvcc was missing at build time"
        return "nvrtc", f"NVRTC compiles the shipped source at first use ({why})"
    return "unavailable", "neither a fatbin nor its source in this installation"


def _dev_mode_fatbin(family, device):
    """Rebuild kernels/<family>.cu for this GPU when it changed; return the cached fatbin."""
    import cupy

    source_dir = kernel_source_dir()
    cu_path = os.path.join(source_dir, f"{family}.cu")
    include_dir = os.path.join(source_dir, "include")
    major, minor = cupy.cuda.Device(device).compute_capability
    arch = (int(f"{major}{minor}"), False)
    directive = _nvcc.arch_directive(cu_path)
    targets = _nvcc.specific_targets(directive, [arch]) if directive else None
    if directive and not targets:
        raise FamilyUnavailable(f"rawops: '{family}' has no code for sm_{major}{minor} (only {directive})")
    cutlass = _nvcc.cutlass_include() if _nvcc.uses_cutlass(cu_path) else None
    if _nvcc.uses_cutlass(cu_path) and cutlass is None:
        raise FamilyUnavailable(f"rawops: config.dev_kernels cannot rebuild '{family}' without CuTe headers "
                                f"(pip install nvidia-cutlass, or set {_nvcc.CUTLASS_ENV})")
    nvcc = _nvcc.find_nvcc()
    if nvcc is None:
        raise RuntimeError(f"rawops: config.dev_kernels needs nvcc (PATH, CUDA_HOME or the nvidia-cuda-nvcc wheel) "
                           f"to rebuild {cu_path}")
    digest = _nvcc.fatbin_digest(_nvcc.nvcc_version(nvcc), cu_path, include_dir, [arch], targets, cutlass)
    out_path = os.path.join(DEV_CACHE, f"{family}-sm{major}{minor}-{digest}.fatbin")
    if not os.path.exists(out_path):
        tmp_path = f"{out_path}.{os.getpid()}.tmp"
        _nvcc.compile_fatbin(nvcc, cu_path, include_dir, tmp_path, [arch], targets=targets, cutlass=cutlass)
        os.replace(tmp_path, out_path)  # atomic: concurrent processes never see half a file
    return out_path


def _nvrtc_module(family):
    import cupy

    source_dir = kernel_source_dir()
    cu_path = os.path.join(source_dir, f"{family}.cu")
    if family not in _nvrtc_warned:
        _nvrtc_warned.add(family)
        warnings.warn(
            f"rawops: no prebuilt kernels for '{family}' (was nvcc missing at build time?); "
            "compiling them with NVRTC now, cached for later runs",
            RuntimeWarning,
            stacklevel=4,
        )
    with open(cu_path) as f:
        code = f.read()
    return cupy.RawModule(code=code, options=nvrtc_options(), backend="nvrtc")


def nvrtc_options():
    """NVRTC options for the shipped sources: rawops' headers, and the CUB/Thrust/libcu++
    headers that CuPy bundles (nvcc finds CUB itself; NVRTC does not)."""
    import cupy

    options = ["-std=c++17", *_nvcc.CONSTANT_DEFINES, f"-I{os.path.join(kernel_source_dir(), 'include')}"]
    cccl = os.path.join(os.path.dirname(cupy.__file__), "_core", "include", "cupy", "_cccl")
    for part in ("cub", "thrust", "libcudacxx"):
        if os.path.isdir(os.path.join(cccl, part)):
            options.append(f"-I{os.path.join(cccl, part)}")
    return tuple(options)


def _load_module(family, device):
    import cupy

    with cupy.cuda.Device(device):
        if config.dev_kernels:
            return cupy.RawModule(path=_dev_mode_fatbin(family, device))
        path = fatbin_path(family)
        if _nvcc.arch_directive(os.path.join(kernel_source_dir(), f"{family}.cu")):
            if not os.path.exists(path):
                raise FamilyUnavailable(f"rawops: '{family}' was not built in this installation")
            return cupy.RawModule(path=path)
        if os.path.exists(path) and not config.force_nvrtc:
            return cupy.RawModule(path=path)
        return _nvrtc_module(family)


def get_function(family, name, device):
    """The cupy.RawKernel `name` of `family`, loaded on `device` (cached, thread-safe)."""
    key = (family, name, device)
    kernel = _functions.get(key)
    if kernel is not None:
        return kernel
    import cupy

    with _lock:
        kernel = _functions.get(key)
        if kernel is None:
            module = _modules.get((family, device))
            if module is None:
                module = _modules[(family, device)] = _load_module(family, device)
            with cupy.cuda.Device(device):
                kernel = module.get_function(name)
                kernel.kernel  # load now, on this device, so that .kernel.ptr is this device's
            _functions[key] = kernel
    return kernel


def function_pointer(family, name, device):
    """The CUfunction handle (an int) of a kernel on a device, for direct launches; cached,
    since launches look it up on every call."""
    key = (family, name, device)
    pointer = _pointers.get(key)
    if pointer is None:
        import cupy

        kernel = get_function(family, name, device)
        with cupy.cuda.Device(device):
            pointer = _pointers[key] = kernel.kernel.ptr
    return pointer


_capabilities = {}  # device -> compute capability as an int (90 for sm_90)


def compute_capability(device):
    """The device's compute capability as an int (75, 80, 90, ...), asked once per device."""
    cc = _capabilities.get(device)
    if cc is None:
        import cupy

        cc = _capabilities[device] = int(cupy.cuda.Device(device).compute_capability)
    return cc


# Device attributes (cudaDeviceAttr) the launch plans read.
ATTR_MULTIPROCESSORS = 16  # cudaDevAttrMultiProcessorCount
ATTR_L2_BYTES = 38  # cudaDevAttrL2CacheSize
ATTR_THREADS_PER_SM = 39  # cudaDevAttrMaxThreadsPerMultiProcessor
ATTR_MEMORY_CLOCK_KHZ = 36  # cudaDevAttrMemoryClockRate (peak, kHz)
ATTR_MEMORY_BUS_BITS = 37  # cudaDevAttrGlobalMemoryBusWidth
_attributes = {}  # (device, attribute) -> its value


def device_attribute(device, attribute):
    """A cudaDeviceAttr of a device (ATTR_*), asked once per device."""
    key = (device, attribute)
    value = _attributes.get(key)
    if value is None:
        import cupy

        value = _attributes[key] = int(cupy.cuda.runtime.deviceGetAttribute(attribute, device))
    return value


def device_threads(device):
    """Threads the whole device holds at once (its SMs times each one's thread limit)."""
    return device_attribute(device, ATTR_MULTIPROCESSORS) * device_attribute(device, ATTR_THREADS_PER_SM)


def memory_bandwidth_per_sm(device):
    """The device memory's peak bytes a second (double data rate: 2 x clock x bus width) over its
    SMs: what one SM's loads in flight must cover (Little's law), 25 GB/s on the H100 SXM, 37 on the
    H200; 0 where the device does not report its memory clock."""
    clock_hz = device_attribute(device, ATTR_MEMORY_CLOCK_KHZ) * 1000
    return 2 * clock_hz * device_attribute(device, ATTR_MEMORY_BUS_BITS) / 8 / device_attribute(
        device, ATTR_MULTIPROCESSORS)


# Memory this fast an SM (bytes a second) needs more loads in flight an SM than the H100 SXM's (25
# GB/s an SM) for the same latency: the map kernels drop their warp cap on it, the norm backwards
# stage more rows (measured on the H200, 37 GB/s an SM: docs/performance.md).
FAST_MEMORY_PER_SM = 30e9


_fast = {}  # device -> fast_memory's answer (launchers ask on every call)


def fast_memory(device):
    """Whether the device's memory delivers FAST_MEMORY_PER_SM bytes a second an SM or more."""
    fast = _fast.get(device)
    if fast is None:
        fast = _fast[device] = memory_bandwidth_per_sm(device) >= FAST_MEMORY_PER_SM
    return fast


def l2_bytes(device):
    """The device's L2 cache size in bytes."""
    return device_attribute(device, ATTR_L2_BYTES)


_per_sm = {}  # (function pointer, threads, dynamic shared bytes, device) -> blocks an SM holds at once


def blocks_per_sm(function, threads, smem, device):
    """Blocks of `threads` threads and `smem` bytes of dynamic shared memory of kernel `function`
    (a CUfunction handle: function_pointer) that one SM of `device` holds at once, by its
    registers, shared memory and thread limits (the driver's occupancy calculator,
    cuOccupancyMaxActiveBlocksPerMultiprocessor); at least 1. A driver query, cached per
    (function, threads, smem, device): nothing is measured and nothing is kept on disk."""
    key = (function, threads, smem, device)
    blocks = _per_sm.get(key)
    if blocks is None:
        from cupy_backends.cuda.api import driver

        blocks = _per_sm[key] = max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(function, threads, smem)))
    return blocks


def resident_blocks(function, threads, smem, device):
    """Blocks of kernel `function` that the whole device holds at once (blocks_per_sm times the
    SMs): the grid of a grid-stride launch, one wave in which every block does equal work."""
    return blocks_per_sm(function, threads, smem, device) * device_attribute(device, ATTR_MULTIPROCESSORS)


def resident(family, name, device, threads, smem=0):
    """resident_blocks of kernel `name` of `family` (loaded on `device` if it was not)."""
    return resident_blocks(function_pointer(family, name, device), threads, smem, device)


DEFAULT_DYNAMIC_SHARED = 48 * 1024  # what every kernel may take without opting in
_shared_allowed = {}  # (family, name, device) -> the dynamic shared memory a kernel is allowed so far


def allow_dynamic_shared(family, name, device, nbytes):
    """Let a kernel launch with `nbytes` of dynamic shared memory on `device`: False when the
    device's per-block opt-in cannot hold that beside the kernel's static shared memory.
    Above 48 KB a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize). The limit
    is only ever raised: one kernel serves launches of different sizes, and lowering it for a
    smaller one would make the next launch of a larger one fail."""
    key = (family, name, device)
    if nbytes <= _shared_allowed.get(key, -1):
        return True
    import cupy

    kernel = get_function(family, name, device)
    # Without opting in, static + dynamic must fit the 48 KB default (48 KB of dynamic memory beside
    # the kernel's static storage failed to launch: CUDA_ERROR_INVALID_VALUE).
    default = DEFAULT_DYNAMIC_SHARED - kernel.shared_size_bytes
    if nbytes <= default:
        _shared_allowed[key] = max(_shared_allowed.get(key, 0), default)
        return True
    optin = cupy.cuda.runtime.deviceGetAttribute(97, device)  # cudaDevAttrMaxSharedMemoryPerBlockOptin
    if nbytes + kernel.shared_size_bytes > optin:
        return False
    if nbytes > kernel.max_dynamic_shared_size_bytes:
        kernel.max_dynamic_shared_size_bytes = nbytes
    _shared_allowed[key] = max(_shared_allowed.get(key, 0), nbytes)
    return True


def function_with_shared(family, name, device, nbytes):
    """function_pointer of a kernel allowed `nbytes` of dynamic shared memory (RuntimeError
    when the device cannot give that much: the planners never ask it there)."""
    if not allow_dynamic_shared(family, name, device, nbytes):
        raise RuntimeError(f"{name} needs {nbytes} bytes of dynamic shared memory; device {device} allows less")
    return function_pointer(family, name, device)


def loaded_functions():
    return sorted(_functions)
