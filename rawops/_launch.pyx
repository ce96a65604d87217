# cython: language_level=3, boundscheck=False, wraparound=False
"""Marshalling and launching: read device arrays from any producer, check them, launch.

Arrays come in as CuPy arrays (read natively, the fast path), objects with
`__cuda_array_interface__` (v2/v3, whose `stream` key is honoured) or `__dlpack__`
(through cupy.from_dlpack, zero-copy). Kernels are launched with the driver's
cuLaunchKernel, resolved from libcuda at first use, so a call pays neither CuPy's nor
torch's per-call argument handling. Policy and documentation live in the Python modules.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memset
from posix.dlfcn cimport dlopen, dlsym, RTLD_NOW, RTLD_LOCAL

from contextlib import nullcontext as _nullcontext
from operator import index as _index
import numpy
import ml_dtypes

from . import _modules

# ---------------------------------------------------------------------------- dtypes
cdef enum:
    F32 = 0
    F16 = 1
    BF16 = 2
    U8 = 3
    U16 = 4
    N_FLOAT = 3
    MAX_DEVICES = 64
    MAP_THREADS = 256
    MAP_CAPPED_THREADS = 128
    MAP_CAPPED_SMEM = 16384
    MAP_UNROLL = 1   # must match RAWOPS_MAP_UNROLL in kernels/elementwise.cu
    MAP_BLOCKS_PER_SM = 8

# The map kernels' launch shape, for tests and tools (the kernel's RAWOPS_MAP_UNROLL must match).
MAP_SHAPE = {"threads": MAP_THREADS, "unroll": MAP_UNROLL}
# The light ops' shape on sm_90: blocks of 128 with 16 KB of dynamic shared memory they never
# touch, so that an SM holds 13 blocks (52 warps) instead of 64 warps. Measured on the H100
# (bench/explore_map.py --occupancy, bench/NOTES.md): relu f16 0.993 -> 1.001x torch, add f16
# 0.994 -> 1.009x, gelu tanh bwd bf16 0.997 -> 1.005x; the compute-heavier erf GELU and
# bias_gelu got slower, so they keep the default. Other architectures were not measured.
MAP_CAPPED_SHAPE = {"threads": MAP_CAPPED_THREADS, "shared": MAP_CAPPED_SMEM, "cc": 90}


def map_shape(bint capped, int cc):
    """(threads, dynamic shared bytes) of a map kernel's launch on a GPU of compute
    capability cc (major * 10 + minor)."""
    if capped and cc == 90:
        return MAP_CAPPED_THREADS, MAP_CAPPED_SMEM
    return MAP_THREADS, 0

DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8", "uint16")
FLOAT_SUFFIXES = ("f32", "f16", "bf16")
NUMPY_DTYPES = tuple(numpy.dtype(n) if n != "bfloat16" else numpy.dtype(ml_dtypes.bfloat16)
                     for n in DTYPE_NAMES)
cdef dict _CODE_OF_NUM = {dt.num: code for code, dt in enumerate(NUMPY_DTYPES)}
cdef dict _CODE_OF_TYPESTR = {"<f4": F32, "<f2": F16, "|u1": U8, "<u1": U8, "<u2": U16}


def dtype_name(int code):
    return DTYPE_NAMES[code] if 0 <= code < len(DTYPE_NAMES) else "unsupported"


# ---------------------------------------------------------------------------- driver
ctypedef int CUresult
ctypedef CUresult (*LaunchKernel_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, void*, void**, void**) nogil
ctypedef CUresult (*PointerGetAttributes_t)(unsigned, int*, void**, uintptr_t) nogil
ctypedef CUresult (*GetErrorName_t)(CUresult, const char**) nogil
ctypedef CUresult (*EventCreate_t)(void**, unsigned) nogil
ctypedef CUresult (*EventRecord_t)(void*, void*) nogil
ctypedef CUresult (*StreamWaitEvent_t)(void*, void*, unsigned) nogil
ctypedef CUresult (*EventDestroy_t)(void*) nogil
ctypedef CUresult (*CtxGetDevice_t)(int*) nogil
ctypedef CUresult (*DeviceGet_t)(int*, int) nogil
ctypedef CUresult (*TensorMapEncodeTiled_t)(void*, int, uint32_t, void*, const uint64_t*, const uint64_t*,
                                            const uint32_t*, const uint32_t*, int, int, int, int) nogil
# cuda.h's CUlaunchAttribute (an id, padded to 8 bytes, then a 64-byte value union) and
# CUlaunchConfig, for cuLaunchKernelEx.
ctypedef struct CUlaunchAttribute:
    int id
    char pad[4]
    int value[16]
ctypedef struct CUlaunchConfig:
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes
    void* hStream
    CUlaunchAttribute* attrs
    unsigned numAttrs
ctypedef CUresult (*LaunchKernelEx_t)(const CUlaunchConfig*, void*, void**, void**) nogil

cdef LaunchKernel_t _cuLaunchKernel = NULL
cdef PointerGetAttributes_t _cuPointerGetAttributes = NULL
cdef GetErrorName_t _cuGetErrorName = NULL
cdef EventCreate_t _cuEventCreate = NULL
cdef EventRecord_t _cuEventRecord = NULL
cdef StreamWaitEvent_t _cuStreamWaitEvent = NULL
cdef EventDestroy_t _cuEventDestroy = NULL
cdef CtxGetDevice_t _cuCtxGetDevice = NULL
cdef DeviceGet_t _cuDeviceGet = NULL
cdef TensorMapEncodeTiled_t _cuTensorMapEncodeTiled = NULL  # CUDA 12+ drivers; NULL on older ones
cdef LaunchKernelEx_t _cuLaunchKernelEx = NULL  # CUDA 12+ drivers; NULL on older ones

cdef enum:
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    CU_MEMORYTYPE_HOST = 1
    CUDA_ERROR_INVALID_CONTEXT = 201
    CU_EVENT_DISABLE_TIMING = 2
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class NoDeviceError(RuntimeError):
    """No CUDA driver or GPU is available."""


cdef void* _symbol(void* handle, const char* name) except NULL:
    cdef void* p = dlsym(handle, name)
    if p == NULL:
        raise NoDeviceError(f"rawops: the CUDA driver lacks {name.decode()}; update the NVIDIA driver")
    return p


cdef int _load_driver() except -1:
    global _cuLaunchKernel, _cuPointerGetAttributes, _cuGetErrorName
    global _cuEventCreate, _cuEventRecord, _cuStreamWaitEvent, _cuEventDestroy, _cuTensorMapEncodeTiled
    global _cuLaunchKernelEx, _cuCtxGetDevice, _cuDeviceGet
    if _cuLaunchKernel != NULL:
        return 0
    cdef void* handle = dlopen(b"libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
    if handle == NULL:
        raise NoDeviceError("rawops: no CUDA driver (libcuda.so.1) on this machine; "
                            "rawops runs its kernels on an NVIDIA GPU")
    _cuPointerGetAttributes = <PointerGetAttributes_t>_symbol(handle, b"cuPointerGetAttributes")
    _cuGetErrorName = <GetErrorName_t>_symbol(handle, b"cuGetErrorName")
    _cuEventCreate = <EventCreate_t>_symbol(handle, b"cuEventCreate")
    _cuEventRecord = <EventRecord_t>_symbol(handle, b"cuEventRecord")
    _cuStreamWaitEvent = <StreamWaitEvent_t>_symbol(handle, b"cuStreamWaitEvent")
    _cuEventDestroy = <EventDestroy_t>_symbol(handle, b"cuEventDestroy_v2")
    _cuCtxGetDevice = <CtxGetDevice_t>_symbol(handle, b"cuCtxGetDevice")
    _cuDeviceGet = <DeviceGet_t>_symbol(handle, b"cuDeviceGet")
    _cuTensorMapEncodeTiled = <TensorMapEncodeTiled_t>dlsym(handle, b"cuTensorMapEncodeTiled")
    _cuLaunchKernelEx = <LaunchKernelEx_t>dlsym(handle, b"cuLaunchKernelEx")
    _cuLaunchKernel = <LaunchKernel_t>_symbol(handle, b"cuLaunchKernel")
    return 0


cdef str _error_name(CUresult rc):
    cdef const char* name = NULL
    if _cuGetErrorName != NULL and _cuGetErrorName(rc, &name) == 0 and name != NULL:
        return name.decode()
    return f"CUDA error {rc}"


cdef int _check(CUresult rc, str what) except -1:
    if rc != 0:
        raise RuntimeError(f"rawops: {what} failed: {_error_name(rc)}")
    return 0


# ---------------------------------------------------------------------------- arrays
cdef object _cupy = None
cdef object _cupy_ndarray = None
cdef object _get_device = None          # cupy.cuda.runtime.getDevice
cdef object _get_current_stream = None  # cupy.cuda.get_current_stream


cdef object _import_cupy():
    # CuPy is imported at first use, not at `import rawops`, and its entry points cached:
    # attribute chains cost more than the calls on the per-launch path.
    global _cupy, _cupy_ndarray, _get_device, _get_current_stream
    if _cupy is None:
        import cupy
        _cupy = cupy
        _cupy_ndarray = cupy.ndarray
        _get_device = cupy.cuda.runtime.getDevice
        _get_current_stream = cupy.cuda.get_current_stream
    return _cupy


cdef class DeviceArray:
    """What rawops knows of one array argument: pointer, shape, dtype, device, layout."""
    cdef readonly str name
    cdef readonly object obj        # the producer's object, kept alive for the call
    cdef readonly uintptr_t ptr
    cdef readonly tuple shape
    cdef readonly long long size
    cdef readonly int dtype         # code into DTYPE_NAMES, -1 for anything else
    cdef object _dtype_source       # numpy dtype or typestr, named only in error messages
    cdef readonly int itemsize
    cdef readonly bint contiguous
    cdef readonly bint readonly
    cdef readonly int device        # -1: not known yet (resolved by resolve_device)
    cdef readonly object stream     # CAI v3 stream to synchronise with, or None
    cdef readonly bint is_cupy

    @property
    def nbytes(self):
        return self.size * self.itemsize

    @property
    def dtype_text(self):
        source = self._dtype_source
        if isinstance(source, str):
            if source == "<V2":
                return "'<V2' (2-byte void: pass bfloat16 as a CuPy array or through DLPack)"
            return DTYPE_NAMES[self.dtype] if self.dtype >= 0 else source
        return source.name


cdef long long _product(tuple shape) except -1:
    cdef long long n = 1
    for d in shape:
        n *= <long long>d
    return n


cdef bint _c_contiguous(tuple shape, object strides, int itemsize):
    if strides is None:
        return True
    cdef long long expected = itemsize
    cdef Py_ssize_t i
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] != 1 and strides[i] != expected:
            return _product(shape) == 0
        expected *= <long long>shape[i]
    return True


cdef DeviceArray _from_cupy(object obj, str name):
    cdef DeviceArray a = DeviceArray.__new__(DeviceArray)
    a.name = name
    a.obj = obj
    a.is_cupy = True
    memory = obj.data
    a.ptr = memory.ptr
    a.shape = obj.shape
    a.size = obj.size
    dt = obj.dtype
    a.dtype = _CODE_OF_NUM.get(dt.num, -1)
    a._dtype_source = dt
    a.itemsize = dt.itemsize
    try:
        a.contiguous = obj._c_contiguous  # 35 ns; obj.flags builds an object (400 ns)
    except AttributeError:
        a.contiguous = obj.flags.c_contiguous
    a.readonly = False
    a.device = memory.device_id
    a.stream = None
    return a


cdef DeviceArray _from_cai(object obj, dict cai, str name):
    cdef DeviceArray a = DeviceArray.__new__(DeviceArray)
    a.name = name
    a.obj = obj
    a.is_cupy = False
    if cai.get("mask") is not None:
        raise ValueError(f"{name} is a masked array (__cuda_array_interface__ 'mask'); rawops does not support masks")
    data, shape, typestr = cai.get("data"), cai.get("shape"), cai.get("typestr")
    # The launch maths index these with bounds checks off (setup.py): a malformed interface
    # must stop here, not read past a tuple's end.
    try:
        shape = tuple([_index(d) for d in shape])
        ok = (len(data) == 2 and (data[0] is None or _index(data[0]) >= 0) and type(typestr) is str
              and all(d >= 0 for d in shape))
    except TypeError:
        ok = False
    if not ok:
        raise TypeError(f"{name} has a malformed __cuda_array_interface__: it needs 'data' (pointer, read-only "
                        "flag), 'shape' (a tuple of non-negative ints) and 'typestr' (a string)")
    a.ptr = _index(data[0]) if data[0] is not None else 0
    a.readonly = bool(data[1])
    a.shape = shape
    a.size = _product(a.shape)
    a.dtype = _CODE_OF_TYPESTR.get(typestr, -1)
    a._dtype_source = typestr
    a.itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
    strides = cai.get("strides")
    if strides is not None:
        try:
            strides = tuple([_index(st) for st in strides])
        except TypeError:
            strides = ()
        if len(strides) != len(shape):
            raise ValueError(f"{name} has __cuda_array_interface__ strides {cai.get('strides')!r} for shape "
                             f"{shape}: expected None or one int per dimension")
    a.contiguous = _c_contiguous(a.shape, strides, a.itemsize)
    a.device = -1
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if stream is not None and (not isinstance(stream, int) or stream < 0):
        raise TypeError(f"{name}: __cuda_array_interface__ stream must be None or a non-negative int "
                        f"(a cudaStream_t), got {stream!r}")
    if stream == 0:
        raise ValueError(f"{name}: __cuda_array_interface__ stream 0 is forbidden by the protocol "
                         "(ambiguous); use 1 for the legacy default stream")
    a.stream = stream
    return a


class _DLPackOnStream:
    """`obj` for cupy.from_dlpack, its __dlpack__ called with rawops' choice of stream."""
    __slots__ = ("obj", "stream")

    def __init__(self, obj, stream):
        self.obj, self.stream = obj, stream

    def __dlpack__(self, *, stream=None, **kwargs):
        return self.obj.__dlpack__(stream=self.stream, **kwargs)

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


cpdef DeviceArray as_array(object obj, str name):
    """Read `obj` as a device array without copying; TypeError if it is not one."""
    cupy = _import_cupy()
    if type(obj) is _cupy_ndarray:
        return _from_cupy(obj, name)
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except RuntimeError as error:  # torch: a tensor that requires grad refuses to export
        raise TypeError(f"{name} cannot be read through __cuda_array_interface__: {error}") from None
    if cai is not None:
        return _from_cai(obj, cai, name)
    if isinstance(obj, _cupy_ndarray):
        return _from_cupy(obj, name)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type, device_id = obj.__dlpack_device__()[:2]
        if device_type not in (2, 13):  # kDLCUDA, kDLCUDAManaged
            raise TypeError(f"{name} is in host memory (DLPack device type {device_type}); rawops needs "
                            "GPU memory: move it to the GPU first (e.g. cupy.asarray(x))")
        # The producer orders its pending work before the stream the consumer names: CuPy's
        # current stream of that GPU, named here rather than left to cupy.from_dlpack so that
        # a launch on another stream (stream=) knows to wait for it, as for CAI v3's key.
        consumer = cupy.cuda.get_current_stream(device_id).ptr or 1  # 0 is not allowed: 1, legacy
        a = _from_cupy(cupy.from_dlpack(_DLPackOnStream(obj, consumer)), name)
        a.stream = consumer
        return a
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        raise TypeError(f"{name} is a host array ({type(obj).__name__}); rawops needs GPU memory: "
                        "move it to the GPU first (e.g. cupy.asarray(x))")
    raise TypeError(f"{name} must be a GPU array (CuPy, or anything with __cuda_array_interface__ "
                    f"or __dlpack__), got {type(obj).__name__}")


cpdef int resolve_device(DeviceArray a) except -2:
    """Ask the driver which GPU holds a foreign pointer; host memory is refused here."""
    if a.device >= 0:
        return a.device
    if a.size == 0 or a.ptr == 0:
        _import_cupy()
        a.device = _get_device()
        return a.device
    _load_driver()
    cdef int memtype = 0
    cdef int ordinal = -1
    cdef int attrs[2]
    cdef void* values[2]
    attrs[0] = CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    values[0] = &memtype
    values[1] = &ordinal
    cdef CUresult rc = _cuPointerGetAttributes(2, attrs, values, a.ptr)
    if rc != 0 or memtype == 0:
        raise ValueError(f"{a.name} does not point to GPU memory the driver knows "
                         f"(pointer 0x{a.ptr:x}: {_error_name(rc) if rc else 'unregistered host memory'})")
    if memtype == CU_MEMORYTYPE_HOST:
        raise ValueError(f"{a.name} points to pinned host memory (0x{a.ptr:x}); rawops needs GPU memory")
    a.device = ordinal
    return ordinal


# ---------------------------------------------------------------------------- streams
def require_str(value, str name):
    """TypeError naming `name` unless value is a string (a choice such as approximate or
    activation; the caller's ValueError lists the valid ones)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")


cpdef double real_scalar(object value, str name) except? -1.0:
    """value as a float for a kernel's scalar argument (alpha, eps); TypeError naming it for
    anything that is not a real number (a string that float() would parse included)."""
    if type(value) is float:
        return value
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}") from None


cpdef uintptr_t stream_pointer(object stream, int device) except? 0:
    """A raw CUstream from None (CuPy's current stream on `device`), a CuPy/torch stream
    object, an object with __cuda_stream__, or an int handle. A stream object of another GPU
    than `device` (the arrays') is a ValueError, raised before anything is launched there."""
    if stream is None:
        _import_cupy()
        return _get_current_stream(device).ptr
    cdef uintptr_t handle
    cdef int owner = -1
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream must be a non-negative handle, got {stream}")
        handle = stream
    else:
        for attribute in ("ptr", "cuda_stream"):
            value = getattr(stream, attribute, None)
            if isinstance(value, int):
                handle = value
                break
        else:
            if not hasattr(stream, "__cuda_stream__"):
                raise TypeError(f"stream must be None, an int handle or a CUDA stream object, got {type(stream).__name__}")
            handle = stream.__cuda_stream__()[1]
        owner = _object_device(stream)
    if owner >= 0 and owner != device:
        raise ValueError(f"stream is on device {owner}, the arrays on device {device}; pass a stream of their GPU")
    return handle


class _StreamHandle:
    """A raw CUstream through the CUDA stream protocol (for CuPy's Stream.from_external, which
    does not own the stream)."""
    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_NO_STREAM_GIVEN = _nullcontext()


def allocating_on(stream, uintptr_t s):
    """A context in which CuPy allocates on the launches' stream `s` where the caller gave one
    (`stream`, as passed); enter it on the arrays' device. CuPy's pool hands out blocks per
    current stream, ordered only with that stream's work: an output or scratch block taken on
    the current stream and written on another could still be in use by the current stream's
    queued work (tests/test_streams.py)."""
    if stream is None:
        return _NO_STREAM_GIVEN
    cupy = _import_cupy()
    if isinstance(stream, cupy.cuda.Stream):
        return stream
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy 14; ExternalStream is deprecated there
    return from_external(_StreamHandle(s)) if from_external is not None else cupy.cuda.ExternalStream(s)


_captured_scratch = []  # scratch that captured launches use: their graphs may replay at any time


def hold_if_capturing(uintptr_t s, *scratch):
    """Keep `scratch` (what a call allocated for itself: partial sums, split-K slabs, an
    intermediate) alive while stream `s` is being captured into a CUDA graph. Back in CuPy's
    pool, a block could be handed to a later array while the graph's replays still write it.
    Held until release_captured_scratch(). The legacy streams (0, 1) cannot be captured."""
    if s <= 1 or not _import_cupy().cuda.runtime.streamIsCapturing(s):
        return
    _captured_scratch.extend(a for a in scratch if a is not None)


def release_captured_scratch():
    """Free the scratch of every call captured so far (see hold_if_capturing): call it once no
    graph captured from rawops' CuPy API will replay again. Returns how many buffers it freed."""
    count = len(_captured_scratch)
    _captured_scratch.clear()
    return count


cdef int _object_device(object stream) except -2:
    """The GPU a stream object says it belongs to (CuPy: device_id, torch: device_index); -1
    when it does not say. A raw int handle is taken as given: the driver dereferences what it
    is handed (cuStreamGetDevice on a stray int crashed the H100 test process)."""
    for attribute in ("device_id", "device_index"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int) and value >= 0:
            return value
    return -1


cdef bint _same_stream(uintptr_t a, uintptr_t b):
    # 0 and 1 both name the legacy default stream.
    return a == b or (a <= 1 and b <= 1)


cpdef int wait_for_producer(DeviceArray a, uintptr_t stream) except -1:
    """CAI v3: order our stream after the producer's, without blocking the host."""
    if a.stream is None or _same_stream(<uintptr_t>a.stream, stream):
        return 0
    _load_driver()
    cdef void* event = NULL
    _check(_cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    try:
        _check(_cuEventRecord(event, <void*><uintptr_t>a.stream), "cuEventRecord on the producer's stream")
        _check(_cuStreamWaitEvent(<void*>stream, event, 0), "cuStreamWaitEvent")
    finally:
        _cuEventDestroy(event)
    return 0


# ---------------------------------------------------------------------------- launching
cdef int _sm_count[MAX_DEVICES]


cpdef int sm_count(int device) except -1:
    if device < 0 or device >= MAX_DEVICES:
        raise ValueError(f"device {device} is out of range")
    if _sm_count[device] == 0:
        _sm_count[device] = _import_cupy().cuda.runtime.deviceGetAttribute(16, device)  # MultiProcessorCount
    return _sm_count[device]


cdef int _launch(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                 unsigned shared, uintptr_t stream, void** params, int device) except -1:
    _load_driver()
    cdef CUresult rc = _cuLaunchKernel(<void*>function, gx, gy, gz, bx, 1, 1, shared,
                                       <void*>stream, params, NULL)
    if rc == CUDA_ERROR_INVALID_CONTEXT:
        # A thread that never touched CUDA has no current context: make the device's
        # primary context current (what the runtime does lazily), then retry once.
        _import_cupy().cuda.runtime.setDevice(device)
        rc = _cuLaunchKernel(<void*>function, gx, gy, gz, bx, 1, 1, shared, <void*>stream, params, NULL)
    return _check(rc, "kernel launch")


cdef int _launch_dependent(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned shared, uintptr_t stream, void** params, int device) except -1:
    """_launch as a programmatic dependent launch (sm_90+): the grid may be scheduled before
    the stream's previous kernel ends; the kernel itself waits for that kernel's results
    (griddepcontrol.wait, kernels/include/rawops/dependent_launch.cuh), so only the launch's
    latency is hidden. The caller checks the device's compute capability."""
    _load_driver()
    if _cuLaunchKernelEx == NULL:
        return _launch(function, gx, gy, gz, bx, shared, stream, params, device)
    cdef CUlaunchAttribute attribute
    memset(&attribute, 0, sizeof(attribute))
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value[0] = 1  # programmaticStreamSerializationAllowed
    cdef CUlaunchConfig config
    memset(&config, 0, sizeof(config))
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, 1, 1
    config.sharedMemBytes = shared
    config.hStream = <void*>stream
    config.attrs = &attribute
    config.numAttrs = 1
    cdef CUresult rc = _cuLaunchKernelEx(&config, <void*>function, params, NULL)
    if rc == CUDA_ERROR_INVALID_CONTEXT:
        _import_cupy().cuda.runtime.setDevice(device)
        rc = _cuLaunchKernelEx(&config, <void*>function, params, NULL)
    return _check(rc, "kernel launch")


# Each ordinal's CUdevice handle + 1 (0: not asked yet), for _device_is_current.
cdef int _device_handles[MAX_DEVICES]


cdef bint _device_is_current(int device) except -1:
    """Whether the thread's current CUDA context is on GPU `device`: what torch's current-device
    query (cudaGetDevice) answers, asked of the driver from C, where torch._C._cuda_getDevice()
    costs 0.15-0.19 us a call from here (bench/results/explore_linear_call.md, host parts: 0.21-0.25
    with the loop's 0.06), on a ~7-12 us call whose margin to torch's own op is about that. No
    current context (a new thread) or an ordinal past MAX_DEVICES: False (the caller's device guard)."""
    if device < 0 or device >= MAX_DEVICES:
        return False
    _load_driver()
    cdef int current = -1, handle
    if _device_handles[device] == 0:
        _check(_cuDeviceGet(&handle, device), "cuDeviceGet")
        _device_handles[device] = handle + 1
    if _cuCtxGetDevice(&current) != 0:
        return False
    return current + 1 == _device_handles[device]


cdef int _launch_torch(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned shared,
                       void** params, int device) except -1:
    """_launch on torch's current stream of `device`. The function belongs to that device's
    context, so torch's current device is switched around the launch when it differs."""
    if _device_is_current(device):
        return _launch(function, gx, gy, gz, bx, shared, <uintptr_t>_torch_raw_stream(device), params, device)
    with _torch_device_guard(device):
        return _launch(function, gx, gy, gz, bx, shared, <uintptr_t>_torch_raw_stream(device), params, device)


def launch(uintptr_t function, tuple grid, unsigned block, unsigned shared, uintptr_t stream,
           tuple args, str kinds, int device, bint dependent=False):
    """Generic launch: `kinds` gives each argument's C type, 'p' pointer, 'q' int64, 'f' float,
    'b' a struct passed by value, given as bytes (a TMA tensor map). dependent: a programmatic
    dependent launch (_launch_dependent; only for kernels that wait, on sm_90+)."""
    if len(args) != len(kinds) or len(args) > 32:
        raise ValueError("launch: one kind per argument, at most 32 arguments")
    cdef unsigned long long slots[32]
    cdef float fslots[32]
    cdef void* params[32]
    cdef Py_ssize_t i
    for i in range(len(args)):
        if kinds[i] == "f":
            fslots[i] = args[i]
            params[i] = &fslots[i]
        elif kinds[i] == "b":
            if type(args[i]) is not bytes:
                raise TypeError(f"launch: argument {i} of kind 'b' must be bytes")
            params[i] = PyBytes_AS_STRING(args[i])  # the driver copies the kernel's parameter size
        else:
            slots[i] = <unsigned long long>(<long long>args[i]) if kinds[i] == "q" else <unsigned long long>args[i]
            params[i] = &slots[i]
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    if dependent:
        return _launch_dependent(function, gx, gy, gz, block, shared, stream, params, device)
    return _launch(function, gx, gy, gz, block, shared, stream, params, device)


# CUtensorMap enums (cuda.h)
cdef enum:
    TENSOR_MAP_BYTES = 128
TENSOR_MAP_FLOAT16, TENSOR_MAP_FLOAT32, TENSOR_MAP_BFLOAT16, TENSOR_MAP_TFLOAT32 = 6, 7, 9, 11
TENSOR_MAP_SWIZZLE_128B = 3
TENSOR_MAP_L2_256B = 3


def encode_tensor_map_2d(int data_type, uintptr_t address, uint64_t inner, uint64_t outer,
                         uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, int swizzle):
    """A 2-D TMA descriptor (CUtensorMap, 128 bytes) of a row-major matrix: `outer` rows of
    `inner` elements, rows `row_bytes` apart, read in boxes of box_outer x box_inner;
    out-of-bounds elements read as zero. Built by the driver (cuTensorMapEncodeTiled)."""
    _load_driver()
    if _cuTensorMapEncodeTiled == NULL:
        raise NoDeviceError("rawops: this CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)")
    cdef uint64_t dims[2]
    cdef uint64_t strides[1]
    cdef uint32_t box[2]
    cdef uint32_t steps[2]
    dims[0], dims[1] = inner, outer
    strides[0] = row_bytes
    box[0], box[1] = box_inner, box_outer
    steps[0], steps[1] = 1, 1
    cdef char storage[TENSOR_MAP_BYTES + 64]
    cdef char* map_ = <char*>((<uintptr_t>storage + 63) & ~(<uintptr_t>63))  # CUtensorMap is 64-byte aligned
    cdef CUresult rc = _cuTensorMapEncodeTiled(map_, data_type, 2, <void*>address,
                                               dims, strides, box, steps, 0, swizzle, TENSOR_MAP_L2_256B, 0)
    if rc != 0:
        raise ValueError(f"rawops: cuTensorMapEncodeTiled rejected a {outer} x {inner} matrix at {address:#x} "
                         f"(row {row_bytes} bytes, box {box_outer} x {box_inner}): {_error_name(rc)}")
    return PyBytes_FromStringAndSize(map_, TENSOR_MAP_BYTES)


cdef inline long long _map_head(long long n, int itemsize, uintptr_t out, uintptr_t a, uintptr_t b):
    """Elements before 16-byte alignment of every operand (b == 0: not read), or -1 when
    the operands disagree modulo 16, which sends the kernel down its scalar path."""
    cdef uintptr_t phase = out % 16
    if a % 16 != phase or (b != 0 and b % 16 != phase):
        return -1
    return min(<long long>(((16 - phase) % 16) // itemsize), n)


cdef inline long long _map_blocks(long long n, long long head, int itemsize, int sms, int threads):
    """Vector path: one block per threads * MAP_UNROLL vectors (not persistent: many
    short blocks balance better). Scalar path: a grid-stride loop over a bounded grid."""
    cdef long long per_block = threads * MAP_UNROLL
    if head >= 0:
        return max(1, ((n - head) // (16 // itemsize) + per_block - 1) // per_block)
    return max(1, min((n + per_block - 1) // per_block, <long long>sms * 32))


def map_launch_config(long long n, int itemsize, uintptr_t out, uintptr_t a, uintptr_t b, int sms,
                      int threads=MAP_THREADS):
    """(blocks, head) of a map launch; pure arithmetic, testable without a GPU."""
    cdef long long head = _map_head(n, itemsize, out, a, b)
    return _map_blocks(n, head, itemsize, sms, threads), head


cdef int _check_element_aligned(DeviceArray x) except -1:
    # A T* off its element boundary faults in the kernel (16-byte phase is handled there).
    if x.itemsize and x.ptr % x.itemsize:
        raise ValueError(f"{x.name} is misaligned: address 0x{x.ptr:x} is not a multiple of its "
                         f"{x.itemsize}-byte element")
    return 0


# ---------------------------------------------------------------------------- torch tensors
# rawops never imports torch; rawops.torch_adapter hands over what the tensor path needs.
cdef object _Tensor = None
cdef object _torch_f32 = None
cdef object _torch_f16 = None
cdef object _torch_bf16 = None
cdef object _torch_empty_like = None
cdef object _torch_raw_stream = None
cdef object _torch_device_guard = None
cdef object _torch_grad_enabled = None  # torch.is_grad_enabled
cdef object _torch_compiler = None  # torch.compiler: _is_compiling_flag is set while exporting


def register_torch(tensor_type, float_dtypes, empty_like, raw_stream, device_guard, grad_enabled, compiler_module):
    global _Tensor, _torch_f32, _torch_f16, _torch_bf16, _torch_empty_like
    global _torch_raw_stream, _torch_device_guard, _torch_grad_enabled, _torch_compiler
    _Tensor = tensor_type
    _torch_f32, _torch_f16, _torch_bf16 = float_dtypes
    _torch_empty_like = empty_like
    _torch_raw_stream = raw_stream
    _torch_device_guard = device_guard
    _torch_grad_enabled = grad_enabled
    _torch_compiler = compiler_module


cdef int _tensor_code(object t, str name, int* device=NULL) except -1:
    """The dtype code after the checks every launch makes; `device` (when given) receives
    the tensor's GPU, so the hot path asks torch for it once."""
    if not isinstance(t, _Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dt = t.dtype
    cdef int code = F32 if dt is _torch_f32 else F16 if dt is _torch_f16 else BF16 if dt is _torch_bf16 else -1
    if code < 0:
        raise TypeError(f"{name} has dtype {dt}; rawops supports float32, float16, bfloat16")
    cdef int index = t.get_device()
    if index < 0:
        raise ValueError(f"{name} is on {t.device}; rawops runs on CUDA tensors")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; rawops never copies behind your back: pass {name}.contiguous()")
    if device != NULL:
        device[0] = index
    return code


cdef int _tensor_like(object t, str name, object like, str like_name) except -1:
    cdef int code = _tensor_code(t, name)
    if t.dtype is not like.dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {like.dtype} like {like_name}")
    if t.get_device() != like.get_device():
        raise ValueError(f"{name} is on {t.device}, {like_name} on {like.device}; all arguments must be on one GPU")
    return code


def tensor_code(t, str name, like=None, str like_name="x"):
    """The dtype code of a tensor operand after the checks every rawops launch makes (CUDA,
    float32/float16/bfloat16, contiguous; with `like`, its dtype and GPU)."""
    return _tensor_code(t, name) if like is None else _tensor_like(t, name, like, like_name)


cdef bint _tensors_partially_overlap(object o, object x):
    cdef uintptr_t op = o.data_ptr(), xp = x.data_ptr()
    cdef long long on = o.numel() * o.element_size(), xn = x.numel() * x.element_size()
    return (op != xp or on != xn) and op < xp + xn and xp < op + on


cdef class MapKernel:
    """One elementwise op over float32/float16/bfloat16, dispatching on dtype.

    Kernel signature (see kernels/elementwise.cu):
      (const T* a, const T* b, const T* c, T* out, int64 n, int64 head, int64 inner, float alpha)
    `b` is read elementwise when reads_b, `c` as a row vector over the last dim when reads_c.
    """
    cdef readonly str family
    cdef readonly str name
    cdef readonly tuple arg_names
    cdef readonly bint reads_b
    cdef readonly bint reads_c
    cdef readonly bint capped  # the light ops' launch shape where measured (map_shape)
    cdef uintptr_t _functions[MAX_DEVICES][N_FLOAT]
    cdef unsigned _threads[MAX_DEVICES]
    cdef unsigned _shared[MAX_DEVICES]

    def __init__(self, str family, str name, tuple arg_names, bint reads_b=False, bint reads_c=False,
                 bint capped=False):
        self.family = family
        self.name = name
        self.arg_names = arg_names
        self.reads_b = reads_b
        self.reads_c = reads_c
        self.capped = capped

    def kernel_names(self):
        return [f"{self.name}_{s}" for s in FLOAT_SUFFIXES]

    cdef uintptr_t function(self, int device, int dtype) except 0:
        if device < 0 or device >= MAX_DEVICES:
            raise ValueError(f"device {device} is out of range")
        if self._functions[device][dtype] == 0:
            _load_driver()
            if self._threads[device] == 0:
                threads, shared = map_shape(self.capped, _modules.compute_capability(device))
                self._threads[device], self._shared[device] = threads, shared
            self._functions[device][dtype] = _modules.function_pointer(
                self.family, f"{self.name}_{FLOAT_SUFFIXES[dtype]}", device)
        return self._functions[device][dtype]

    def launch_shape(self, int device):
        """(threads, dynamic shared bytes) of this op's launches on `device`."""
        self.function(device, F32)
        return self._threads[device], self._shared[device]

    def __call__(self, a, b=None, c=None, float alpha=0.0, out=None, stream=None):
        return self._call(a, b, c, alpha, out, stream, False)

    def check(self, a, b=None, c=None, out=None):
        """(a, b, c, out, device) as checked DeviceArrays (None where absent) and their GPU:
        every check a call makes, raised as a call would raise it; nothing is launched (for
        callers that launch a fused variant of this op on the same operands)."""
        return self._call(a, b, c, 0.0, out, None, True)

    cdef object _call(self, a, b, c, float alpha, out, stream, bint check_only):
        # One body for the call and for check(): the hot path builds no tuple.
        cdef DeviceArray A = as_array(a, self.arg_names[0])
        cdef DeviceArray B = None
        cdef DeviceArray C = None
        cdef DeviceArray O = None
        cdef uintptr_t s
        if A.dtype < 0 or A.dtype >= N_FLOAT:
            raise TypeError(f"{A.name} has dtype {A.dtype_text}; {self.name} supports float32, float16, bfloat16")
        if not A.contiguous:
            raise ValueError(f"{A.name} is not C-contiguous; rawops never copies behind your back: "
                             f"pass a contiguous array (e.g. {A.name}.copy())")
        _check_element_aligned(A)
        if self.reads_b:
            B = self._operand(b, self.arg_names[1], A)
            if B.shape != A.shape:
                raise ValueError(f"{B.name} has shape {B.shape}, expected {A.shape} like {A.name}")
        if self.reads_c:
            C = self._operand(c, self.arg_names[len(self.arg_names) - 1], A)
            if len(A.shape) == 0 or C.shape != (A.shape[len(A.shape) - 1],):
                raise ValueError(f"{C.name} has shape {C.shape}, expected one value per element of "
                                 f"{A.name}'s last dim ({A.shape[len(A.shape) - 1] if A.shape else '?'},)")
        if out is not None:
            O = self._operand(out, "out", A)
            if O.shape != A.shape:
                raise ValueError(f"out has shape {O.shape}, expected {A.shape} like {A.name}")
            if O.readonly:
                raise ValueError("out is read-only")
            self._check_overlap(O, A)
            if B is not None:
                self._check_overlap(O, B)
            if C is not None:
                self._check_overlap(O, C)

        cupy = _import_cupy()
        cdef int device = resolve_device(A)
        for other in (B, C, O):
            if other is not None and resolve_device(other) != device:
                raise ValueError(f"{other.name} is on device {other.device}, {A.name} on device {device}; "
                                 "all arguments must be on one GPU")
        if check_only:
            return (A, B, C, O, device)
        s = stream_pointer(stream, device)  # refuses another GPU's stream before any CuPy call
        if _get_device() != device:
            with cupy.cuda.Device(device):
                return self._run(A, B, C, O, alpha, stream, s, device)
        return self._run(A, B, C, O, alpha, stream, s, device)

    cdef DeviceArray _operand(self, object obj, str name, DeviceArray like):
        if obj is None:
            raise TypeError(f"{self.name} needs {name}")
        cdef DeviceArray x = as_array(obj, name)
        if x.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {x.dtype_text}, expected {like.dtype_text} like {like.name}")
        if not x.contiguous:
            raise ValueError(f"{name} is not C-contiguous; rawops never copies behind your back")
        _check_element_aligned(x)
        return x

    cdef int _check_overlap(self, DeviceArray o, DeviceArray x) except -1:
        # Exact aliasing (out=x) is a supported in-place update; a partial overlap would
        # read elements this launch has already written.
        if (o.ptr != x.ptr or o.nbytes != x.nbytes) and o.ptr < x.ptr + x.nbytes and x.ptr < o.ptr + o.nbytes:
            raise ValueError(f"out partially overlaps {x.name}; pass out={x.name} exactly, or a separate array")
        return 0

    cdef object _run(self, DeviceArray A, DeviceArray B, DeviceArray C, DeviceArray O, float alpha,
                     object stream, uintptr_t s, int device):
        for x in (A, B, C):
            if x is not None and x.stream is not None:
                wait_for_producer(x, s)
        if O is None:
            if stream is None:
                result = _cupy_ndarray(A.shape, NUMPY_DTYPES[A.dtype])
            else:
                with allocating_on(stream, s):
                    result = _cupy_ndarray(A.shape, NUMPY_DTYPES[A.dtype])
            out_ptr = result.data.ptr
        else:
            result = O.obj
            out_ptr = O.ptr
        if A.size:
            self.launch_pointers(device, A.dtype, A.ptr, B.ptr if B is not None else 0,
                                 C.ptr if C is not None else 0, out_ptr, A.size,
                                 C.size if C is not None else 1, alpha, s)
        return result

    def torch_call(self, a, b=None, c=None, float alpha=0.0, out=None):
        """The same op on torch tensors, on torch's current stream; returns out (a new
        tensor unless given)."""
        return self._torch_call(a, b, c, alpha, out)

    cdef object _torch_call(self, a, b, c, float alpha, out):
        cdef tuple names = self.arg_names
        cdef int device = -1
        cdef int code = _tensor_code(a, names[0], &device)
        if self.reads_b:
            _tensor_like(b, names[1], a, names[0])
            if b.shape != a.shape:
                raise ValueError(f"{names[1]} has shape {tuple(b.shape)}, expected {tuple(a.shape)} like {names[0]}")
        if self.reads_c:
            _tensor_like(c, names[len(names) - 1], a, names[0])
            if a.dim() == 0 or c.dim() != 1 or c.shape[0] != a.shape[a.dim() - 1]:
                raise ValueError(f"{names[len(names) - 1]} has shape {tuple(c.shape)}, expected one value per "
                                 f"element of {names[0]}'s last dim ({a.shape[a.dim() - 1] if a.dim() else '?'},)")
        if out is None:
            # `a` is contiguous, so preserve_format (the default) gives a contiguous tensor too;
            # leaving out the keyword saves torch's argument parsing (~0.3 us a call).
            out = _torch_empty_like(a)
        else:
            _tensor_like(out, "out", a, names[0])
            if out.shape != a.shape:
                raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(a.shape)}")
            for other, other_name in ((a, names[0]), (b, names[1] if self.reads_b else ""),
                                      (c, names[len(names) - 1] if self.reads_c else "")):
                if other is not None and _tensors_partially_overlap(out, other):
                    raise ValueError(f"out partially overlaps {other_name}; pass out={other_name} exactly, "
                                     "or a separate tensor")
        cdef long long n = a.numel()
        if n == 0:
            return out
        cdef uintptr_t pb = b.data_ptr() if self.reads_b else 0
        cdef uintptr_t pc = c.data_ptr() if self.reads_c else 0
        cdef long long inner = c.numel() if self.reads_c else 1
        self._launch_map(device, code, a.data_ptr(), pb, pc, out.data_ptr(), n, inner, alpha, 0, True)
        return out

    cpdef int launch_pointers(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c,
                              uintptr_t out, long long n, long long inner, float alpha,
                              uintptr_t stream) except -1:
        """Launch on raw pointers already checked by the caller (the torch adapter's path)."""
        return self._launch_map(device, dtype, a, b, c, out, n, inner, alpha, stream, False)

    cdef int _launch_map(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t out,
                         long long n, long long inner, float alpha, uintptr_t stream, bint on_torch) except -1:
        # on_torch: on torch's current stream of `device` (`stream` unused)
        cdef uintptr_t function = self.function(device, dtype)
        cdef int itemsize = 4 if dtype == F32 else 2
        cdef long long head = _map_head(n, itemsize, out, a, b if self.reads_b else 0)
        cdef unsigned threads = self._threads[device], shared = self._shared[device]
        cdef long long blocks = _map_blocks(n, head, itemsize, sm_count(device), threads)
        if blocks > 0x7FFFFFFF:
            raise ValueError(f"{self.name}: {n} elements exceed one launch's grid")
        cdef void* params[8]
        params[0] = &a
        params[1] = &b
        params[2] = &c
        params[3] = &out
        params[4] = &n
        params[5] = &head
        params[6] = &inner
        params[7] = &alpha
        if on_torch:
            return _launch_torch(function, <unsigned>blocks, 1, 1, threads, shared, params, device)
        return _launch(function, <unsigned>blocks, 1, 1, threads, shared, stream, params, device)


# ---------------------------------------------------------------------------- elementwise entries
# The public elementwise functions as C-level callables: each is a bound method of an entry (a
# builtin, not a Python function) whose common call goes straight to the kernel. A Python
# wrapper's frames cost ~0.3 us a call on the torch side, the whole margin to torch's own op on a
# ~9 us call, and 0.8 us on the CuPy side (bench/results/explore_host.md). CuPy API: CupyMapEntry,
# into MapKernel._call. Torch adapter: TorchMapEntry, whose no-grad eager call goes to
# _torch_call; everything else (a gradient needed, an export trace) goes to `fallback`, the
# adapter's Python function, which dynamo traces in the entry's place (the adapter registers it
# with torch.compiler.substitute_in_graph).
cdef class _MapEntry:
    """One elementwise op as C-level callables (bound methods: no Python frame a call).
    `kernels`: {mode: MapKernel} (gelu's 'tanh' / 'none'; the key None for ops without a
    mode); `fallback`: the Python function with the same signature, which takes whatever
    the entry does not (and raises the errors, worded in one place)."""
    cdef dict kernels
    cdef MapKernel plain  # kernels[None], when the op has no mode
    cdef readonly object fallback

    def __init__(self, dict kernels, fallback):
        self.kernels = kernels
        self.plain = kernels.get(None)
        self.fallback = fallback

    cdef inline MapKernel _mode(self, approximate):
        # Anything but a string (a list would not even hash) goes to the fallback, which names it.
        return self.kernels.get(approximate) if type(approximate) is str else None


cdef class CupyMapEntry(_MapEntry):
    """One elementwise op of the CuPy API (rawops.gelu, ...): the call MapKernel makes, without
    the Python wrapper's frames in front of it."""

    @cython.binding(False)
    def gelu(self, x, approximate="tanh", *, out=None, stream=None):
        """gelu(x, approximate="tanh", *, out=None, stream=None): GELU,
        0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))), or the exact erf form with
        approximate='none' (torch.nn.functional.gelu's argument)."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(x, approximate, out=out, stream=stream)
        return kernel._call(x, None, None, 0.0, out, stream, False)

    @cython.binding(False)
    def gelu_backward(self, dy, x, approximate="tanh", *, out=None, stream=None):
        """gelu_backward(dy, x, approximate="tanh", *, out=None, stream=None): dx = dy * gelu'(x)."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(dy, x, approximate, out=out, stream=stream)
        return kernel._call(dy, x, None, 0.0, out, stream, False)

    @cython.binding(False)
    def bias_gelu(self, x, bias, approximate="tanh", *, out=None, stream=None):
        """bias_gelu(x, bias, approximate="tanh", *, out=None, stream=None): gelu(x + bias), bias
        of shape (x.shape[-1],) broadcast over the leading dims."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(x, bias, approximate, out=out, stream=stream)
        return kernel._call(x, None, bias, 0.0, out, stream, False)

    @cython.binding(False)
    def relu(self, x, *, out=None, stream=None):
        """relu(x, *, out=None, stream=None): max(x, 0); NaN stays NaN, as in torch.relu."""
        return self.plain._call(x, None, None, 0.0, out, stream, False)

    @cython.binding(False)
    def relu_backward(self, dy, x, *, out=None, stream=None):
        """relu_backward(dy, x, *, out=None, stream=None): dx = dy where x > 0, else 0."""
        return self.plain._call(dy, x, None, 0.0, out, stream, False)

    @cython.binding(False)
    def relu_scale(self, x, alpha, *, out=None, stream=None):
        """relu_scale(x, alpha, *, out=None, stream=None): relu(x) * alpha in one pass (torch
        eager runs two kernels)."""
        return self.plain._call(x, None, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def relu_scale_backward(self, dy, x, alpha, *, out=None, stream=None):
        """relu_scale_backward(dy, x, alpha, *, out=None, stream=None): dx = dy * alpha where
        x > 0, else 0."""
        return self.plain._call(dy, x, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def relu_scale_add(self, x, alpha, y, *, out=None, stream=None):
        """relu_scale_add(x, alpha, y, *, out=None, stream=None): relu(x) * alpha + y in one pass."""
        return self.plain._call(x, y, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def add(self, a, b, *, out=None, stream=None):
        """add(a, b, *, out=None, stream=None): a + b, same shape and dtype (no broadcasting)."""
        return self.plain._call(a, b, None, 0.0, out, stream, False)


cdef class TorchMapEntry(_MapEntry):
    """One elementwise op of the torch adapter; its fallback also takes grad and tracing."""

    cdef inline bint _tracing(self):
        return _torch_compiler._is_compiling_flag

    @cython.binding(False)
    def gelu(self, x, approximate="tanh"):
        """gelu(x, approximate="tanh"): torch.nn.functional.gelu on rawops kernels ('tanh' or 'none')."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None or self._tracing() or (getattr(x, "requires_grad", False) and _torch_grad_enabled()):
            return self.fallback(x, approximate)
        return kernel._torch_call(x, None, None, 0.0, None)

    @cython.binding(False)
    def relu(self, x):
        """relu(x): torch.relu on rawops kernels."""
        if self._tracing() or (getattr(x, "requires_grad", False) and _torch_grad_enabled()):
            return self.fallback(x)
        return self.plain._torch_call(x, None, None, 0.0, None)

    @cython.binding(False)
    def relu_scale(self, x, alpha):
        """relu_scale(x, alpha): relu(x) * alpha in one kernel."""
        if self._tracing() or (getattr(x, "requires_grad", False) and _torch_grad_enabled()):
            return self.fallback(x, alpha)
        return self.plain._torch_call(x, None, None, real_scalar(alpha, "alpha"), None)

    @cython.binding(False)
    def relu_scale_add(self, x, alpha, y):
        """relu_scale_add(x, alpha, y): relu(x) * alpha + y in one kernel."""
        if self._tracing() or ((getattr(x, "requires_grad", False) or getattr(y, "requires_grad", False))
                               and _torch_grad_enabled()):
            return self.fallback(x, alpha, y)
        return self.plain._torch_call(x, y, None, real_scalar(alpha, "alpha"), None)

    @cython.binding(False)
    def add(self, a, b):
        """add(a, b): a + b (same shape) in one kernel."""
        if self._tracing() or ((getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False))
                               and _torch_grad_enabled()):
            return self.fallback(a, b)
        return self.plain._torch_call(a, b, None, 0.0, None)

    @cython.binding(False)
    def bias_gelu(self, x, bias, approximate="tanh"):
        """bias_gelu(x, bias, approximate="tanh"): gelu(x + bias), bias broadcast over the last dim, in one kernel."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None or self._tracing() or (
                (getattr(x, "requires_grad", False) or getattr(bias, "requires_grad", False)) and _torch_grad_enabled()):
            return self.fallback(x, bias, approximate)
        return kernel._torch_call(x, None, bias, 0.0, None)


# ---------------------------------------------------------------------------- torch GEMM fast path
# The matrix family's no-grad torch calls (rawops.torch_adapter.linear_gelu, matmul): checks,
# the cached launch plan, the output from torch's allocator and the launch, in one typed call.
# Anything unusual (a failed check, a split-K plan that needs scratch, grad needed) returns
# None and the adapter's Python path handles it, raising its errors there: one place words them.
cdef object _gemm_planner = None
cdef object _gemm_options = None
cdef object _gemm_hopper = None
cdef dict _gemm_plans = {}


def register_torch_gemm(planner, options, hopper):
    """planner(layout, dtype, m, n, k, a_ptr, b_ptr, c_aligned, device, flags) -> (function,
    grid, block, shared, splits, extra): splits 0 marks the Hopper GEMM, extra then its (BN,
    K splits); options: the object whose LINEAR_TF32 the planner reads (rawops.matmul), read
    again on every float32 call so that plans cached here follow it; hopper: the Hopper GEMM's
    launch (rawops._gemm_sm90.launch_gemm), whose tensor maps are built from the pointers."""
    global _gemm_planner, _gemm_options, _gemm_hopper
    _gemm_planner = planner
    _gemm_options = options
    _gemm_hopper = hopper


cdef inline bint _plain_operand(object t, object dtype, int device):
    # One dtype, one GPU, dense (the dtype itself was checked on x).
    return isinstance(t, _Tensor) and t.dtype is dtype and t.get_device() == device and t.is_contiguous()


# The last x @ W^T launch of torch_linear, in C fields: a model calling one layer shape after
# another finds its plan without building a key tuple or touching Python objects.
cdef struct LinearLaunch:
    int code, device, a_aligned, b_aligned, tf32  # tf32: the switch + 2 x the epilogue mode
    long long m, n, k
    uintptr_t function
    unsigned gx, gy, gz, block, shared
cdef LinearLaunch _last_linear
_last_linear.function = 0


cdef inline bint _same_linear(int code, long long m, long long n, long long k, uintptr_t a, uintptr_t b,
                              int device, int tf32):
    return (_last_linear.function != 0 and _last_linear.m == m and _last_linear.n == n and _last_linear.k == k
            and _last_linear.code == code and _last_linear.device == device and _last_linear.tf32 == tf32
            and _last_linear.a_aligned == (a % 16 == 0) and _last_linear.b_aligned == (b % 16 == 0))


cdef tuple _gemm_plan(str layout, int code, long long m, long long n, long long k, uintptr_t a, uintptr_t b,
                      int device, int tf32, long long flags):
    # Outputs come fresh from torch's allocator: 16-byte aligned. The planner sees flags' mode
    # (bias + GELU or not) and LINEAR_TF32 itself; tf32 (what they give) keys the cache.
    key = (layout, code, m, n, k, a % 16 == 0, b % 16 == 0, device, tf32, flags & 3)
    cached = _gemm_plans.get(key)
    if cached is None:
        if len(_gemm_plans) > 4096:
            _gemm_plans.clear()
        function, grid, block, shared, splits, extra = _gemm_planner(layout, code, m, n, k, a, b, 0, device, flags)
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        cached = _gemm_plans[key] = (function, gx, gy, gz, block, shared, splits, extra)
    return cached


cdef class _TorchScratch:
    """A split-K launch's workspace(nbytes) -> (pointer, owner): one tensor from torch's allocator,
    taken before the launch on the stream it runs on (so freeing it after is stream-ordered)."""
    cdef object tensor

    def __init__(self, tensor):
        self.tensor = tensor

    def __call__(self, nbytes):
        return self.tensor.data_ptr(), self.tensor


cdef _torch_hopper_gemm(x, tuple p, str layout, int device, int code, uintptr_t a, uintptr_t b, uintptr_t c,
                        uintptr_t bias, long long m, long long n, long long k, long long flags):
    # The Hopper GEMM on torch's current stream of `device`: its launch builds (or finds) the
    # tensor maps of these pointers; the function belongs to that device's context. A K split's
    # float32 partials (splits x m x n) come from torch as elements of x's type.
    cdef long long splits = p[7][1]
    scratch = _TorchScratch(x.new_empty(splits * m * n * (1 if code == F32 else 2))) if splits > 1 else None
    if _device_is_current(device):
        _gemm_hopper(p[0], (p[1],), p[5], device, layout, code, a, b, c, bias, 0, m, n, k, flags,
                     <uintptr_t>_torch_raw_stream(device), p[7][0], splits, scratch)
        return
    with _torch_device_guard(device):
        _gemm_hopper(p[0], (p[1],), p[5], device, layout, code, a, b, c, bias, 0, m, n, k, flags,
                     <uintptr_t>_torch_raw_stream(device), p[7][0], splits, scratch)


def torch_matmul(a, b):
    """a @ b as a new tensor, launched on torch's current stream (no grad, exact float32 or the
    half types' tensor cores); None when this fast path does not apply (the caller takes the
    full path)."""
    return _torch_matmul(a, b)


cdef class TorchMatmulEntry:
    """rawops.torch_adapter.matmul as a C-level callable (as TorchLinearEntry): the no-grad eager
    call without tf32 goes straight to _torch_matmul; anything else (gradients, tf32=True,
    torch.compile, anything _torch_matmul declines) to `fallback`, the adapter's Python
    function, which dynamo traces in its place."""
    cdef readonly object fallback

    def __init__(self, fallback):
        self.fallback = fallback

    @cython.binding(False)
    def matmul(self, a, b, tf32=False):
        """matmul(a, b, tf32=False): a (M, K) @ b (K, N) on rawops kernels, with autograd.
        float32 is exact float32 math; tf32=True runs float32 on TF32 tensor cores (~1e-3
        relative error, like torch's allow_tf32) on sm_80+ where the contiguous dims are
        multiples of 4 and the tensors 16-byte aligned, else exact; the backward's two GEMMs
        follow the same flag. Half types ignore it."""
        if tf32 is False and not _torch_compiler._is_compiling_flag:
            c = _torch_matmul(a, b)
            if c is not None:
                return c
        return self.fallback(a, b, tf32)


cdef object _torch_matmul(a, b):
    # As _torch_linear: each accessor read once; None sends the call to the Python path.
    if not isinstance(a, _Tensor):
        return None
    dt = a.dtype
    cdef int code = F32 if dt is _torch_f32 else F16 if dt is _torch_f16 else BF16 if dt is _torch_bf16 else -1
    if code < 0:
        return None
    cdef int device = a.get_device()
    if device < 0 or not a.is_contiguous() or not _plain_operand(b, dt, device):
        return None
    if _torch_grad_enabled() and (a.requires_grad or b.requires_grad):
        return None
    ashape, bshape = a.shape, b.shape
    if len(ashape) != 2 or len(bshape) != 2:
        return None
    cdef long long m = ashape[0], k = ashape[1], n = bshape[1]
    if bshape[0] != k or m == 0 or n == 0 or k == 0:
        return None
    cdef uintptr_t pa = a.data_ptr(), pb = b.data_ptr()
    cdef tuple p = _gemm_plan("nn", code, m, n, k, pa, pb, device, 0, 0)
    out = a.new_empty(m, n)
    cdef uintptr_t pc = out.data_ptr()
    if p[6] == 0:
        _torch_hopper_gemm(a, p, "nn", device, code, pa, pb, pc, 0, m, n, k, 0)
        return out
    cdef long long splits = p[6], flags = 0
    cdef uintptr_t zero = 0, partial = 0
    cdef void* params[10]
    params[0] = &pa
    params[1] = &pb
    params[2] = &pc
    params[3] = &zero
    params[4] = &zero
    params[5] = &zero
    params[6] = &m
    params[7] = &n
    params[8] = &k
    params[9] = &flags
    if splits == 1:
        _launch_torch(<uintptr_t>p[0], p[1], p[2], p[3], p[4], p[5], params, device)
        return out
    # Split K: float32 partials (splits x m x n) from torch on the launch's stream, then
    # gemm_reduce adds them in order (rawops.matmul.launch_gemm's two launches).
    scratch = a.new_empty(splits * m * n * (1 if code == F32 else 2))
    partial = scratch.data_ptr()
    params[2] = &partial
    _launch_torch(<uintptr_t>p[0], p[1], p[2], p[3], p[4], p[5], params, device)
    reduce_function, reduce_grid = p[7]
    params[0] = &partial
    params[1] = &zero
    params[2] = &pc
    params[8] = &splits
    _launch_torch(<uintptr_t>reduce_function, reduce_grid[0], 1, 1, _gemm_options.REDUCE_THREADS, 0, params, device)
    return out


def torch_linear(x, weight, bias, long long flags):
    """epilogue(x @ weight^T + bias) as a new tensor (..., N), launched on torch's current
    stream; None when this fast path does not apply (the caller takes the full path)."""
    return _torch_linear(x, weight, bias, flags)


cdef class TorchLinearEntry:
    """rawops.torch_adapter.linear_gelu as a C-level callable (as TorchMapEntry for the
    elementwise ops): the no-grad eager call goes straight to _torch_linear, with no Python frame
    and no torch.compiler.is_compiling() call (8.8 us a call against 8.7 for torch_linear itself,
    where the Python wrapper added 0.4: bench/explore_linear_call.py, H100 host); anything
    else goes to `fallback`, the adapter's Python function, which dynamo traces in its place.
    `flags`: {approximate: epilogue flags}."""
    cdef dict flags
    cdef readonly object fallback

    def __init__(self, dict flags, fallback):
        self.flags = flags
        self.fallback = fallback

    @cython.binding(False)
    def linear_gelu(self, x, weight, bias=None, approximate="tanh"):
        """linear_gelu(x, weight, bias=None, approximate="tanh"): F.gelu(F.linear(x, weight, bias),
        approximate=approximate) in one kernel, with autograd (the backward uses the
        pre-activation the forward stores when a gradient is needed). float32 at <= 128 rows on
        sm_90+ runs 3xTF32 (float32-level error), unless rawops.matmul's LINEAR_TF32 is False
        (see rawops.linear_gelu)."""
        if type(approximate) is str and not _torch_compiler._is_compiling_flag:
            flags = self.flags.get(approximate)
            if flags is not None:
                y = _torch_linear(x, weight, bias, flags)
                if y is not None:
                    return y
        return self.fallback(x, weight, bias, approximate)


cdef object _torch_linear(x, weight, bias, long long flags):
    # Each torch accessor costs ~0.3 us on a slow host: every one is read once.
    if not isinstance(x, _Tensor):
        return None
    dt = x.dtype
    cdef int code = F32 if dt is _torch_f32 else F16 if dt is _torch_f16 else BF16 if dt is _torch_bf16 else -1
    if code < 0:
        return None
    cdef int device = x.get_device()
    if device < 0 or not x.is_contiguous() or not _plain_operand(weight, dt, device):
        return None
    cdef bint has_bias = bias is not None
    if has_bias and not _plain_operand(bias, dt, device):
        return None
    if _torch_grad_enabled() and (x.requires_grad or weight.requires_grad or (has_bias and bias.requires_grad)):
        return None
    shape = x.shape
    cdef Py_ssize_t nd = len(shape)
    wshape = weight.shape
    if nd == 0 or len(wshape) != 2:
        return None
    cdef long long k = shape[nd - 1], n = wshape[0]
    if wshape[1] != k or k == 0:
        return None
    if has_bias:
        bshape = bias.shape
        if len(bshape) != 1 or bshape[0] != n:
            return None
    cdef long long m = 1
    cdef Py_ssize_t i
    for i in range(nd - 1):
        m *= <long long>shape[i]
    if m == 0 or n == 0:
        return None
    cdef uintptr_t pa = x.data_ptr(), pb = weight.data_ptr()
    # The planner's switch, as it reads it: 3xTF32 for float32 bias + GELU (linear_gelu) only.
    cdef int tf32 = code == F32 and (flags & 3) == 1 and _gemm_options.LINEAR_TF32 is True
    cdef tuple p
    if not _same_linear(code, m, n, k, pa, pb, device, tf32 + 2 * (flags & 3)):
        p = _gemm_plan("nt", code, m, n, k, pa, pb, device, tf32, flags)
        if p[6] == 0:  # the Hopper GEMM (not cached in _last_linear: its launch takes tensor maps)
            out = x.new_empty(m, n) if nd == 2 else x.new_empty(tuple(shape[:nd - 1]) + (n,))
            _torch_hopper_gemm(x, p, "nt", device, code, pa, pb, out.data_ptr(), bias.data_ptr() if has_bias else 0,
                               m, n, k, flags)
            return out
        if p[6] != 1:
            return None
        _last_linear.function = 0  # invalid while its fields change
        _last_linear.code, _last_linear.device, _last_linear.m, _last_linear.n, _last_linear.k = code, device, m, n, k
        _last_linear.tf32 = tf32 + 2 * (flags & 3)
        _last_linear.a_aligned, _last_linear.b_aligned = pa % 16 == 0, pb % 16 == 0
        _last_linear.gx, _last_linear.gy, _last_linear.gz, _last_linear.block, _last_linear.shared = p[1:6]
        _last_linear.function = <uintptr_t>p[0]
    # A private copy before any torch call: x.new_empty may let another thread replace the cache.
    cdef LinearLaunch l = _last_linear
    out = x.new_empty(m, n) if nd == 2 else x.new_empty(tuple(shape[:nd - 1]) + (n,))  # ints parse faster
    cdef uintptr_t pc = out.data_ptr(), pbias = bias.data_ptr() if has_bias else 0
    cdef uintptr_t zero = 0
    cdef void* params[10]
    params[0] = &pa
    params[1] = &pb
    params[2] = &pc
    params[3] = &pbias
    params[4] = &zero
    params[5] = &zero
    params[6] = &m
    params[7] = &n
    params[8] = &k
    params[9] = &flags
    _launch_torch(l.function, l.gx, l.gy, l.gz, l.block, l.shared, params, device)
    return out


# ---------------------------------------------------------------------------- torch source-network fast path
# torch.nn.Module.__call__'s inputs, for FusedMLP.__call__'s typed path: torch's global hook
# dicts (mutated in place by the register_module_*_hook functions) and its jit-tracing query.
cdef tuple _global_module_hooks = ()
cdef object _torch_tracing_state = None
cdef tuple _MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def register_torch_modules(tuple global_hooks, tracing_state):
    global _global_module_hooks, _torch_tracing_state
    _global_module_hooks = global_hooks
    _torch_tracing_state = tracing_state


@cython.binding(False)
def torch_seed_module_call(module, tuple args, dict kwargs):
    """FusedMLP.__call__(x) for the source network's inference in one typed call: what
    torch.nn.Module.__call__ checks before it calls forward (no hooks, no compiled call, no jit
    trace), what FusedMLP.forward checks (no gradient needed, not tracing), read from the
    module's __dict__, then torch_seed_forward. None when anything differs: the caller goes
    through nn.Module.__call__ (nn.Module.__call__ and forward's Python cost ~4.5 us a call on
    the H100 host beside ~11 us for the rest)."""
    if len(args) != 1 or kwargs:
        return None
    cdef dict d = module.__dict__
    state = d.get("_seed_state")
    if state is None or d.get("_compiled_call_impl") is not None:
        return None
    cdef str name
    for name in _MODULE_HOOKS:
        hooks = d.get(name, True)  # an attribute this torch does not have: take its own path
        if hooks:
            return None
    for hooks in _global_module_hooks:
        if hooks:
            return None
    if _torch_grad_enabled() or _torch_compiler._is_compiling_flag or _torch_tracing_state() is not None:
        return None
    modules = d["_modules"]
    weights, biases = modules.get("weights"), modules.get("biases")
    if weights is None or biases is None:
        return None
    cdef list w = list((<dict>weights.__dict__["_parameters"]).values())
    cdef list b = list((<dict>biases.__dict__["_parameters"]).values())
    if len(w) != 3 or len(b) != 3:
        return None
    return _seed_forward(args[0], [w[0], b[0], w[1], b[1], w[2], b[2]], state)


def torch_seed_forward(x, list params, tuple state):
    """FusedMLP's inference of the source network (100-128-64-10) in one typed call: x's
    checks, y from torch's allocator, the launch. `params` = [w1, b1, w2, b2, w3, b3] as the
    module holds them now; `state` = (dtype, device, their pointers when the module validated
    them, flags, {batch: launch}, planner(batch) -> (function, grid, block, shared)). None
    when anything differs (parameters replaced, another dtype, device or shape): the caller's
    Python path then checks everything and raises its errors."""
    return _seed_forward(x, params, state)


cdef object _seed_forward(x, list params, tuple state):
    if not isinstance(x, _Tensor):
        return None
    dtype, device_obj, ptrs, flags_obj, plans, planner = state
    if x.dtype is not dtype:
        return None
    cdef Py_ssize_t i
    for i in range(6):
        if params[i].data_ptr() != ptrs[i]:
            return None
    cdef int device = device_obj
    if x.get_device() != device or not x.is_contiguous():
        return None
    shape = x.shape
    if len(shape) != 2 or shape[1] != 100:
        return None
    cdef long long batch = shape[0]
    if batch <= 0:
        return None
    plan = plans.get(batch)
    if plan is None:
        if len(plans) > 256:
            plans.clear()
        plan = plans[batch] = planner(batch)
    out = x.new_empty(batch, 10)  # sizes as separate ints: torch parses them faster than a tuple
    cdef uintptr_t slots[10]
    slots[0] = x.data_ptr()
    for i in range(6):
        slots[i + 1] = <uintptr_t>ptrs[i]
    slots[7] = out.data_ptr()
    slots[8] = 0
    slots[9] = 0
    cdef long long flags = flags_obj
    cdef void* args[12]
    for i in range(10):
        args[i] = &slots[i]
    args[10] = &batch
    args[11] = &flags
    function, grid, block, shared = plan
    _launch_torch(<uintptr_t>function, grid, 1, 1, block, shared, args, device)
    return out
