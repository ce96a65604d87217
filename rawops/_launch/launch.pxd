"""Launching: the generic launcher and the elementwise map kernels' launch shape and calls."""
from libc.stdint cimport uintptr_t

from rawops._launch.arrays cimport DeviceArray, N_FLOAT
from rawops._launch.driver cimport MAX_DEVICES

cdef enum:
    # Dims a layout holds while it is planned (NumPy's and CuPy's most); the strided kernels take
    # rawops._constants.MAP_MAX_DIMS once size-1 dims are dropped and contiguous ones merged.
    LAYOUT_CAPACITY = 64
    OPERANDS = 4  # a, b, c, out: the map kernels' operands, in the kernels' order


# The iteration space of a strided map launch (kernels/elementwise.cu MapLayout): dims outermost
# first, each operand's stride of each dim in elements (0 for an operand the op does not read).
cdef struct MapLayout:
    int ndim
    long long shape[LAYOUT_CAPACITY]
    long long stride[OPERANDS][LAYOUT_CAPACITY]


cdef int plan_layout(MapLayout* layout, object shape, object a, object b, object c, object out) except -1
cdef bint overlaps_itself(object shape, object strides) except -1
cdef bint extents_overlap(uintptr_t p, object shape, object strides, int itemsize,
                          uintptr_t q, object q_shape, object q_strides) except -1


cdef class MapKernel:
    cdef readonly str family
    cdef readonly str name
    cdef readonly tuple arg_names
    cdef readonly bint reads_b
    cdef readonly bint reads_c
    cdef readonly bint capped  # the light ops' launch shape where measured (map_shape)
    cdef readonly int fast_unroll  # vectors a thread of its 16-bit <name>_x<U> entries on fast memory (1: none)
    cdef readonly int fast_unroll_f32  # the same of its float32 entry
    cdef uintptr_t _functions[MAX_DEVICES][N_FLOAT]
    cdef uintptr_t _strided[MAX_DEVICES][N_FLOAT]
    cdef unsigned _threads[MAX_DEVICES]
    cdef unsigned _shared[MAX_DEVICES]
    # The blocks of each entry the device holds at once (the grid-stride paths' grid bound),
    # filled with the function pointer.
    cdef long long _resident[MAX_DEVICES][N_FLOAT]
    cdef long long _strided_resident[MAX_DEVICES][N_FLOAT]
    cdef long long _unroll[MAX_DEVICES][N_FLOAT]  # vectors a thread of the entry function() loaded

    cdef uintptr_t function(self, int device, int dtype) except 0
    cdef uintptr_t strided_function(self, int device, int dtype) except 0
    cdef object _call(self, a, b, c, float alpha, out, stream, bint check_only)
    cdef DeviceArray _operand(self, object obj, str name, DeviceArray like)
    cdef int _check_overlap(self, DeviceArray o, DeviceArray x) except -1
    cdef int _check_strided_out(self, DeviceArray o, DeviceArray x) except -1
    cdef int _plan(self, MapLayout* layout, DeviceArray A, DeviceArray B, DeviceArray C, DeviceArray O) except -1
    cdef object _run(self, DeviceArray A, DeviceArray B, DeviceArray C, DeviceArray O, float alpha,
                     object stream, uintptr_t s, int device, MapLayout* layout)
    cpdef int launch_pointers(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c,
                              uintptr_t out, long long n, long long inner, float alpha,
                              uintptr_t stream) except -1
    cdef int launch_layout(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t out,
                           long long n, MapLayout* layout, float alpha, uintptr_t stream) except -1


cdef class _MapEntry:
    cdef dict kernels
    cdef MapKernel plain  # kernels[None], when the op has no mode
    cdef readonly object fallback
    cdef MapKernel _mode(self, approximate)
