# cython: language_level=3, boundscheck=False, wraparound=False
"""The CUDA driver layer: libcuda's entry points resolved with dlopen/dlsym at first use, so a
launch pays neither CuPy's nor torch's per-call argument handling, and importing rawops needs
no GPU. Everything above it (arrays, streams, launch, torch fast path) calls these functions.
"""
cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memset
from posix.dlfcn cimport dlopen, dlsym, RTLD_NOW, RTLD_LOCAL

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
    CUDA_ERROR_INVALID_CONTEXT = 201
    CU_EVENT_DISABLE_TIMING = 2
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
    TENSOR_MAP_BYTES = 128


class NoDeviceError(RuntimeError):
    """No CUDA driver or GPU is available."""


cdef object _cupy = None


cdef object import_cupy():
    # CuPy is imported at first use, not at `import rawops`.
    global _cupy
    if _cupy is None:
        import cupy
        _cupy = cupy
    return _cupy


cdef void* _symbol(void* handle, const char* name) except NULL:
    cdef void* p = dlsym(handle, name)
    if p == NULL:
        raise NoDeviceError(f"rawops: the CUDA driver lacks {name.decode()}; update the NVIDIA driver")
    return p


cdef int load_driver() except -1:
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
    _cuLaunchKernel = <LaunchKernel_t>_symbol(handle, b"cuLaunchKernel")  # last: marks the table complete
    return 0


cdef str error_name(CUresult rc):
    cdef const char* name = NULL
    if _cuGetErrorName != NULL and _cuGetErrorName(rc, &name) == 0 and name != NULL:
        return name.decode()
    return f"CUDA error {rc}"


cdef int check(CUresult rc, str what) except -1:
    if rc != 0:
        raise RuntimeError(f"rawops: {what} failed: {error_name(rc)}")
    return 0


# ---------------------------------------------------------------------------- launching
cdef int launch_kernel(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned shared, uintptr_t stream, void** params, int device) except -1:
    load_driver()
    cdef CUresult rc = _cuLaunchKernel(<void*>function, gx, gy, gz, bx, 1, 1, shared,
                                       <void*>stream, params, NULL)
    if rc == CUDA_ERROR_INVALID_CONTEXT:
        # A thread that never touched CUDA has no current context: make the device's
        # primary context current (what the runtime does lazily), then retry once.
        import_cupy().cuda.runtime.setDevice(device)
        rc = _cuLaunchKernel(<void*>function, gx, gy, gz, bx, 1, 1, shared, <void*>stream, params, NULL)
    return check(rc, "kernel launch")


cdef int launch_dependent(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned shared, uintptr_t stream, void** params, int device) except -1:
    """launch_kernel as a programmatic dependent launch (sm_90+): the grid may be scheduled
    before the stream's previous kernel ends; the kernel itself waits for that kernel's results
    (griddepcontrol.wait, kernels/include/rawops/dependent_launch.cuh), so only the launch's
    latency is hidden. The caller checks the device's compute capability."""
    load_driver()
    if _cuLaunchKernelEx == NULL:
        return launch_kernel(function, gx, gy, gz, bx, shared, stream, params, device)
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
        import_cupy().cuda.runtime.setDevice(device)
        rc = _cuLaunchKernelEx(&config, <void*>function, params, NULL)
    return check(rc, "kernel launch")


# ---------------------------------------------------------------------------- devices
cdef int _sm_count[MAX_DEVICES]
# Each ordinal's CUdevice handle + 1 (0: not asked yet), for device_is_current.
cdef int _device_handles[MAX_DEVICES]


cpdef int sm_count(int device) except -1:
    """The device's multiprocessor count, asked once."""
    if device < 0 or device >= MAX_DEVICES:
        raise ValueError(f"device {device} is out of range")
    if _sm_count[device] == 0:
        _sm_count[device] = import_cupy().cuda.runtime.deviceGetAttribute(16, device)  # MultiProcessorCount
    return _sm_count[device]


cdef bint device_is_current(int device) except -1:
    """Whether the thread's current CUDA context is on GPU `device` (what torch's current-device
    query answers), asked of the driver from C: cheaper than a Python query on every launch.
    No current context (a new thread) or an ordinal past MAX_DEVICES: False (the caller then
    takes its device guard)."""
    if device < 0 or device >= MAX_DEVICES:
        return False
    load_driver()
    cdef int current = -1, handle
    if _device_handles[device] == 0:
        check(_cuDeviceGet(&handle, device), "cuDeviceGet")
        _device_handles[device] = handle + 1
    if _cuCtxGetDevice(&current) != 0:
        return False
    return current + 1 == _device_handles[device]


cdef CUresult pointer_attributes(uintptr_t ptr, int* memtype, int* ordinal) except? -1:
    load_driver()
    cdef int attrs[2]
    cdef void* values[2]
    attrs[0] = CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    values[0] = memtype
    values[1] = ordinal
    return _cuPointerGetAttributes(2, attrs, values, ptr)


cdef int stream_wait(uintptr_t waiter, uintptr_t producer) except -1:
    load_driver()
    cdef void* event = NULL
    check(_cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    try:
        check(_cuEventRecord(event, <void*>producer), "cuEventRecord on the producer's stream")
        check(_cuStreamWaitEvent(<void*>waiter, event, 0), "cuStreamWaitEvent")
    finally:
        _cuEventDestroy(event)
    return 0


# ---------------------------------------------------------------------------- TMA descriptors
# CUtensorMap enums (cuda.h)
TENSOR_MAP_FLOAT16, TENSOR_MAP_FLOAT32, TENSOR_MAP_BFLOAT16, TENSOR_MAP_TFLOAT32 = 6, 7, 9, 11
TENSOR_MAP_SWIZZLE_128B = 3
TENSOR_MAP_L2_256B = 3


def encode_tensor_map_2d(int data_type, uintptr_t address, uint64_t inner, uint64_t outer,
                         uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, int swizzle):
    """A 2-D TMA descriptor (CUtensorMap, 128 bytes) of a row-major matrix: `outer` rows of
    `inner` elements, rows `row_bytes` apart, read in boxes of box_outer x box_inner;
    out-of-bounds elements read as zero. Built by the driver (cuTensorMapEncodeTiled)."""
    load_driver()
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
                         f"(row {row_bytes} bytes, box {box_outer} x {box_inner}): {error_name(rc)}")
    return PyBytes_FromStringAndSize(map_, TENSOR_MAP_BYTES)
