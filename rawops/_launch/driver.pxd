"""The CUDA driver, as the other layers call it: symbols resolved from libcuda at first use."""
from libc.stdint cimport uint32_t, uint64_t, uintptr_t

ctypedef int CUresult

cdef enum:
    MAX_DEVICES = 64  # per-device tables are this long; an ordinal past it takes the slow paths

cdef int load_driver() except -1
cdef str error_name(CUresult rc)
cdef int check(CUresult rc, str what) except -1
cdef object import_cupy()

# A kernel launch on `stream` (the device's primary context made current when the thread has
# none); launch_dependent: as a programmatic dependent launch (sm_90+, kernels that wait).
cdef int launch_kernel(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned shared, uintptr_t stream, void** params, int device) except -1
cdef int launch_dependent(uintptr_t function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned shared, uintptr_t stream, void** params, int device) except -1

cdef bint device_is_current(int device) except -1
cpdef int sm_count(int device) except -1
# (memory type, device ordinal) of a pointer: memory type 0 when the driver does not know it.
cdef CUresult pointer_attributes(uintptr_t ptr, int* memtype, int* ordinal) except? -1
# Order `waiter` after the work queued so far on `producer`, without blocking the host.
cdef int stream_wait(uintptr_t waiter, uintptr_t producer) except -1
