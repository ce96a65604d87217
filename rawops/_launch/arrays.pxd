"""Device arrays from any producer, read without copying, and the checks every launch makes."""
from libc.stdint cimport uintptr_t

cdef enum:  # dtype codes: index into DTYPE_NAMES; the kernels' <op>_<suffix> follow FLOAT_SUFFIXES
    F32 = 0
    F16 = 1
    BF16 = 2
    U8 = 3
    U16 = 4
    N_FLOAT = 3


cdef class DeviceArray:
    cdef readonly str name
    cdef readonly object obj        # the producer's object, kept alive for the call
    cdef readonly uintptr_t ptr
    cdef readonly tuple shape
    cdef readonly tuple strides     # in elements when not C-contiguous (None: not whole elements)
    cdef readonly long long size
    cdef readonly int dtype         # code into DTYPE_NAMES, -1 for anything else
    cdef object _dtype_source       # numpy dtype or typestr, named only in error messages
    cdef readonly int itemsize
    cdef readonly bint contiguous
    cdef readonly bint readonly
    cdef readonly int device        # -1: not known yet (resolved by resolve_device)
    cdef readonly object stream     # CAI v3 / DLPack stream to order after, or None
    cdef readonly bint is_cupy


cpdef DeviceArray as_array(object obj, str name)
cpdef int resolve_device(DeviceArray a) except -2
cpdef double real_scalar(object value, str name) except? -1.0
cdef int check_element_aligned(DeviceArray x) except -1
