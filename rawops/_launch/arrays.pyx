# cython: language_level=3, boundscheck=False, wraparound=False
"""Arrays and validation: read device arrays from any producer without copying, and the checks
every launch makes before it.

Arrays come in as CuPy arrays (read natively, the fast path), objects with
`__cuda_array_interface__` (v2/v3, whose `stream` key is honoured) or `__dlpack__` (through
cupy.from_dlpack, zero-copy). Host memory, masked arrays and malformed interfaces are refused
here with a TypeError / ValueError naming the argument.
"""
from libc.stdint cimport uintptr_t
from operator import index as _index

import ml_dtypes
import numpy

from rawops._launch.driver cimport CUresult, error_name, import_cupy, pointer_attributes

DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8", "uint16")
FLOAT_SUFFIXES = ("f32", "f16", "bf16")
NUMPY_DTYPES = tuple(numpy.dtype(n) if n != "bfloat16" else numpy.dtype(ml_dtypes.bfloat16)
                     for n in DTYPE_NAMES)
cdef dict _CODE_OF_NUM = {dt.num: code for code, dt in enumerate(NUMPY_DTYPES)}
cdef dict _CODE_OF_TYPESTR = {"<f4": F32, "<f2": F16, "|u1": U8, "<u1": U8, "<u2": U16}

cdef enum:
    CU_MEMORYTYPE_HOST = 1

cdef object _cupy_ndarray = None
cdef object _get_device = None  # cupy.cuda.runtime.getDevice


cdef object _cupy():
    # Entry points cached: attribute chains cost more than the calls on the per-launch path.
    global _cupy_ndarray, _get_device
    cupy = import_cupy()
    if _cupy_ndarray is None:
        _cupy_ndarray = cupy.ndarray
        _get_device = cupy.cuda.runtime.getDevice
    return cupy


def dtype_name(int code):
    return DTYPE_NAMES[code] if 0 <= code < len(DTYPE_NAMES) else "unsupported"


cdef class DeviceArray:
    """What rawops knows of one array argument: pointer, shape, strides, dtype, device."""

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

    def element_strides(self):
        """The strides in elements (C order when contiguous); None where a byte stride is not a
        whole number of elements (no kernel can index such a view)."""
        if not self.contiguous:
            return self.strides
        strides, step = [], 1
        for d in reversed(self.shape):
            strides.append(step)
            step *= d
        return tuple(reversed(strides))


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


cdef tuple _element_strides(tuple byte_strides, int itemsize):
    # None where a byte stride is not a whole number of elements: no kernel indexes such a view.
    if itemsize == 0:
        return None
    for s in byte_strides:
        if s % itemsize:
            return None
    return tuple([s // itemsize for s in byte_strides])


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
    a.strides = None if a.contiguous else _element_strides(obj.strides, a.itemsize)
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
    # The launch maths index these with bounds checks off: a malformed interface must stop
    # here, not read past a tuple's end.
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
    a.strides = None if a.contiguous else _element_strides(strides, a.itemsize)
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
    cupy = _cupy()
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
        _cupy()
        a.device = _get_device()
        return a.device
    cdef int memtype = 0
    cdef int ordinal = -1
    cdef CUresult rc = pointer_attributes(a.ptr, &memtype, &ordinal)
    if rc != 0 or memtype == 0:
        raise ValueError(f"{a.name} does not point to GPU memory the driver knows "
                         f"(pointer 0x{a.ptr:x}: {error_name(rc) if rc else 'unregistered host memory'})")
    if memtype == CU_MEMORYTYPE_HOST:
        raise ValueError(f"{a.name} points to pinned host memory (0x{a.ptr:x}); rawops needs GPU memory")
    a.device = ordinal
    return ordinal


cdef int check_element_aligned(DeviceArray x) except -1:
    # A T* off its element boundary faults in the kernel (16-byte phase is handled there).
    if x.itemsize and x.ptr % x.itemsize:
        raise ValueError(f"{x.name} is misaligned: address 0x{x.ptr:x} is not a multiple of its "
                         f"{x.itemsize}-byte element")
    return 0


# ---------------------------------------------------------------------------- scalar arguments
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
