"""Launching: the generic launcher and the elementwise map kernels' launch shape and calls."""
from libc.stdint cimport uintptr_t

from rawops._launch.arrays cimport DeviceArray, N_FLOAT
from rawops._launch.driver cimport MAX_DEVICES


cdef class MapKernel:
    cdef readonly str family
    cdef readonly str name
    cdef readonly tuple arg_names
    cdef readonly bint reads_b
    cdef readonly bint reads_c
    cdef readonly bint capped  # the light ops' launch shape where measured (map_shape)
    cdef uintptr_t _functions[MAX_DEVICES][N_FLOAT]
    cdef unsigned _threads[MAX_DEVICES]
    cdef unsigned _shared[MAX_DEVICES]

    cdef uintptr_t function(self, int device, int dtype) except 0
    cdef object _call(self, a, b, c, float alpha, out, stream, bint check_only)
    cdef DeviceArray _operand(self, object obj, str name, DeviceArray like)
    cdef int _check_overlap(self, DeviceArray o, DeviceArray x) except -1
    cdef object _run(self, DeviceArray A, DeviceArray B, DeviceArray C, DeviceArray O, float alpha,
                     object stream, uintptr_t s, int device)
    cpdef int launch_pointers(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c,
                              uintptr_t out, long long n, long long inner, float alpha,
                              uintptr_t stream) except -1


cdef class _MapEntry:
    cdef dict kernels
    cdef MapKernel plain  # kernels[None], when the op has no mode
    cdef readonly object fallback
    cdef MapKernel _mode(self, approximate)
