# cython: language_level=3, boundscheck=False, wraparound=False
"""Launching: the generic launcher (any kernel, its arguments described by kind letters) and the
elementwise map kernels — their launch shape, their checked calls and the CuPy API's C-level
entries (rawops.gelu and the other elementwise functions are bound methods of CupyMapEntry, so
a call reaches the kernel's checks with no Python frame in front).
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport uintptr_t

from rawops._launch.arrays cimport (BF16, F16, F32, N_FLOAT, DeviceArray, as_array, check_element_aligned,
                                    real_scalar, resolve_device)
from rawops._launch.driver cimport MAX_DEVICES, import_cupy, launch_dependent, launch_kernel, load_driver, sm_count
from rawops._launch.streams cimport stream_pointer, wait_for_producer

from rawops import _modules
from rawops._launch.arrays import FLOAT_SUFFIXES, NUMPY_DTYPES
from rawops._launch.streams import allocating_on

cdef object _cupy_ndarray = None
cdef object _get_device = None


cdef object _cupy():
    global _cupy_ndarray, _get_device
    cupy = import_cupy()
    if _cupy_ndarray is None:
        _cupy_ndarray = cupy.ndarray
        _get_device = cupy.cuda.runtime.getDevice
    return cupy


def launch(uintptr_t function, tuple grid, unsigned block, unsigned shared, uintptr_t stream,
           tuple args, str kinds, int device, bint dependent=False):
    """Generic launch: `kinds` gives each argument's C type, 'p' pointer, 'q' int64, 'f' float,
    'b' a struct passed by value, given as bytes (a TMA tensor map). dependent: a programmatic
    dependent launch (driver.launch_dependent; only for kernels that wait, on sm_90+)."""
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
        return launch_dependent(function, gx, gy, gz, block, shared, stream, params, device)
    return launch_kernel(function, gx, gy, gz, block, shared, stream, params, device)


# ---------------------------------------------------------------------------- the map kernels' shape
cdef enum:
    MAP_THREADS = 256
    MAP_CAPPED_THREADS = 128
    MAP_CAPPED_SMEM = 16384
    MAP_UNROLL = 1   # must match RAWOPS_MAP_UNROLL in kernels/elementwise.cu
    MAP_BLOCKS_PER_SM = 8

# The map kernels' launch shape, for tests and tools.
MAP_SHAPE = {"threads": MAP_THREADS, "unroll": MAP_UNROLL}
# The light ops' shape on sm_90: blocks of 128 with 16 KB of dynamic shared memory they never
# touch, so that an SM holds 13 blocks (52 warps) instead of 64 warps: the ops that read and
# write little per element keep the memory system busier that way (docs/performance.md).
MAP_CAPPED_SHAPE = {"threads": MAP_CAPPED_THREADS, "shared": MAP_CAPPED_SMEM, "cc": 90}


def map_shape(bint capped, int cc):
    """(threads, dynamic shared bytes) of a map kernel's launch on a GPU of compute
    capability cc (major * 10 + minor)."""
    if capped and cc == 90:
        return MAP_CAPPED_THREADS, MAP_CAPPED_SMEM
    return MAP_THREADS, 0


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


# ---------------------------------------------------------------------------- the map kernels
cdef class MapKernel:
    """One elementwise op over float32/float16/bfloat16, dispatching on dtype.

    Kernel signature (see kernels/elementwise.cu):
      (const T* a, const T* b, const T* c, T* out, int64 n, int64 head, int64 inner, float alpha)
    `b` is read elementwise when reads_b, `c` as a row vector over the last dim when reads_c.
    """

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
            load_driver()
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
        check_element_aligned(A)
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

        cupy = _cupy()
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
        check_element_aligned(x)
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

    cpdef int launch_pointers(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c,
                              uintptr_t out, long long n, long long inner, float alpha,
                              uintptr_t stream) except -1:
        """Launch on raw pointers already checked by the caller, on `stream`, with `device`'s
        context current (the torch adapter's path too)."""
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
        return launch_kernel(function, <unsigned>blocks, 1, 1, threads, shared, stream, params, device)


# ---------------------------------------------------------------------------- the CuPy API's entries
cdef class _MapEntry:
    """One elementwise op as C-level callables (bound methods: no Python frame a call).
    `kernels`: {mode: MapKernel} (gelu's 'tanh' / 'none'; the key None for ops without a
    mode); `fallback`: the Python function with the same signature, which takes whatever
    the entry does not (and raises the errors, worded in one place)."""

    def __init__(self, dict kernels, fallback):
        self.kernels = kernels
        self.plain = kernels.get(None)
        self.fallback = fallback

    cdef MapKernel _mode(self, approximate):
        # Anything but a string (a list would not even hash) goes to the fallback, which names it.
        return self.kernels.get(approximate) if type(approximate) is str else None


cdef class CupyMapEntry(_MapEntry):
    """One elementwise op of the CuPy API (rawops.gelu, ...): the call MapKernel makes, without
    a Python wrapper's frames in front of it. Each method's docstring starts with its signature
    (`name(...)\\n--\\n\\n`), which inspect.signature reads."""

    @cython.binding(False)
    def gelu(self, x, approximate="none", *, out=None, stream=None):
        """gelu($self, x, approximate='none', *, out=None, stream=None)
--

GELU: x * Phi(x) with approximate='none' (erf), or 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
with approximate='tanh' (torch.nn.functional.gelu's argument and default)."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(x, approximate, out=out, stream=stream)
        return kernel._call(x, None, None, 0.0, out, stream, False)

    @cython.binding(False)
    def gelu_backward(self, dy, x, approximate="none", *, out=None, stream=None):
        """gelu_backward($self, dy, x, approximate='none', *, out=None, stream=None)
--

dx = dy * gelu'(x)."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(dy, x, approximate, out=out, stream=stream)
        return kernel._call(dy, x, None, 0.0, out, stream, False)

    @cython.binding(False)
    def bias_gelu(self, x, bias, approximate="none", *, out=None, stream=None):
        """bias_gelu($self, x, bias, approximate='none', *, out=None, stream=None)
--

gelu(x + bias), bias of shape (x.shape[-1],) broadcast over the leading dims, in one pass."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(x, bias, approximate, out=out, stream=stream)
        return kernel._call(x, None, bias, 0.0, out, stream, False)

    @cython.binding(False)
    def relu(self, x, *, out=None, stream=None):
        """relu($self, x, *, out=None, stream=None)
--

max(x, 0); NaN stays NaN, as in torch.relu."""
        return self.plain._call(x, None, None, 0.0, out, stream, False)

    @cython.binding(False)
    def relu_backward(self, dy, x, *, out=None, stream=None):
        """relu_backward($self, dy, x, *, out=None, stream=None)
--

dx = dy where x > 0, else 0."""
        return self.plain._call(dy, x, None, 0.0, out, stream, False)

    @cython.binding(False)
    def relu_scale(self, x, alpha, *, out=None, stream=None):
        """relu_scale($self, x, alpha, *, out=None, stream=None)
--

relu(x) * alpha in one pass."""
        return self.plain._call(x, None, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def relu_scale_backward(self, dy, x, alpha, *, out=None, stream=None):
        """relu_scale_backward($self, dy, x, alpha, *, out=None, stream=None)
--

dx = dy * alpha where x > 0, else 0."""
        return self.plain._call(dy, x, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def relu_scale_add(self, x, alpha, y, *, out=None, stream=None):
        """relu_scale_add($self, x, alpha, y, *, out=None, stream=None)
--

relu(x) * alpha + y in one pass."""
        return self.plain._call(x, y, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def add(self, a, b, *, out=None, stream=None):
        """add($self, a, b, *, out=None, stream=None)
--

a + b, same shape and dtype (no broadcasting)."""
        return self.plain._call(a, b, None, 0.0, out, stream, False)
