# cython: language_level=3, boundscheck=False, wraparound=False
"""Launching: the generic launcher (any kernel, its arguments described by kind letters) and the
elementwise map kernels — their launch shape, their checked calls, the planning of strided
layouts and the CuPy API's C-level entries (rawops.gelu and the other elementwise functions are
bound methods of CupyMapEntry, so a call reaches the kernel's checks with no Python frame in
front).
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport uintptr_t

from rawops._launch.arrays cimport (BF16, F16, F32, N_FLOAT, DeviceArray, as_array, check_element_aligned,
                                    real_scalar, resolve_device)
from rawops._launch.driver cimport MAX_DEVICES, import_cupy, launch_dependent, launch_kernel, load_driver
from rawops._launch.streams cimport stream_pointer, wait_for_producer

from rawops import _constants, _modules
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
# Shared with the kernels through rawops/_constants.py (the build passes each as -DRAWOPS_<NAME>).
cdef unsigned MAP_THREADS = _constants.MAP_THREADS
cdef long long MAP_UNROLL = _constants.MAP_UNROLL
cdef long long MAP_STRIDED_UNROLL = _constants.MAP_STRIDED_UNROLL
cdef int MAP_MAX_DIMS = _constants.MAP_MAX_DIMS
if not 1 <= MAP_MAX_DIMS <= LAYOUT_CAPACITY:
    raise ImportError(f"rawops._constants.MAP_MAX_DIMS = {MAP_MAX_DIMS}: the launcher plans at most "
                      f"{LAYOUT_CAPACITY} dims")
cdef enum:
    MAP_CAPPED_THREADS = 128
    MAP_CAPPED_SMEM = 16384

# The map kernels' launch shape, for tests and tools. The grid-stride paths (scalar, strided) launch
# at most the blocks the device holds at once (rawops._modules.resident_blocks of the kernel in its
# launch shape, asked once per kernel and device when its function is loaded): one wave.
MAP_SHAPE = {"threads": MAP_THREADS, "unroll": MAP_UNROLL, "strided_unroll": MAP_STRIDED_UNROLL,
             "max_dims": MAP_MAX_DIMS}
# The light ops' shape on sm_90: blocks of 128 with 16 KB of dynamic shared memory they never
# touch, so that an SM holds 13 blocks (52 warps) instead of 64 warps: the ops that read and
# write little per element keep the H100's memory system busier that way (docs/performance.md);
# not on a device with faster memory an SM (map_shape's fast_memory).
MAP_CAPPED_SHAPE = {"threads": MAP_CAPPED_THREADS, "shared": MAP_CAPPED_SMEM, "cc": 90}


def map_shape(bint capped, int cc, bint fast_memory=False):
    """(threads, dynamic shared bytes) of a map kernel's launch on a GPU of compute
    capability cc (major * 10 + minor); fast_memory: rawops._modules.fast_memory of the device
    (the H200: every map in 128-thread blocks, uncapped, 64 warps an SM: on it the cap cost
    4-6% and 128 threads matched or beat 256, dev/time_map_shapes.py)."""
    if fast_memory:
        return MAP_CAPPED_THREADS, 0
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


cdef inline long long _map_blocks(long long n, long long head, int itemsize, long long resident, int threads,
                                  long long unroll):
    """Vector path: one block per threads * unroll vectors (the entry's vectors a thread; not
    persistent: many short blocks balance better). Scalar path: a grid-stride loop over at most
    `resident` blocks (those the device holds at once: one wave, every block the same share)."""
    cdef long long per_block = threads * unroll
    if head >= 0:
        return max(1, ((n - head) // (16 // itemsize) + per_block - 1) // per_block)
    return max(1, min((n + per_block - 1) // per_block, resident))


cdef inline long long _strided_blocks(long long n, long long resident):
    """The strided kernels' grid: one block per MAP_THREADS * MAP_STRIDED_UNROLL elements, at most
    `resident` (the blocks of the kernel the device holds at once; a grid-stride loop takes the rest)."""
    cdef long long per_block = MAP_THREADS * MAP_STRIDED_UNROLL
    return max(1, min((n + per_block - 1) // per_block, resident))


def map_launch_config(long long n, int itemsize, uintptr_t out, uintptr_t a, uintptr_t b, long long resident,
                      int threads=MAP_THREADS, long long unroll=MAP_UNROLL):
    """(blocks, head) of a map launch, `resident` the blocks of the kernel the device holds at
    once (rawops._modules.resident_blocks), `unroll` its entry's vectors a thread; pure
    arithmetic, testable without a GPU."""
    cdef long long head = _map_head(n, itemsize, out, a, b)
    return _map_blocks(n, head, itemsize, resident, threads, unroll), head


def map_unroll(int fast_unroll, int fast_unroll_f32, int dtype, bint fast_memory):
    """Vectors a thread of a map op's contiguous entry: on a device with fast memory an SM
    (rawops._modules.fast_memory) its <name>_x<U> entry, U fast_unroll_f32 for float32 and
    fast_unroll for the 16-bit dtypes where above 1; else MAP_UNROLL."""
    cdef int unroll = fast_unroll_f32 if dtype == F32 else fast_unroll
    return unroll if unroll > 1 and fast_memory else MAP_UNROLL


def strided_launch_config(long long n, long long resident):
    """(blocks, threads) of a strided map launch, `resident` as in map_launch_config; pure
    arithmetic, testable without a GPU."""
    return _strided_blocks(n, resident), MAP_THREADS


# ---------------------------------------------------------------------------- strided layouts
cdef inline long long _abs(long long v):
    return -v if v < 0 else v


cdef int plan_layout(MapLayout* L, object shape, object a, object b, object c, object out) except -1:
    """L = the iteration space of operands of `shape` with element strides a, b, c, out (b, c:
    None when absent; c, the row vector, is its one stride (sequence of 1), over the last dim):
    dims of size 1 dropped, the others ordered by out's strides, largest first (out written in
    its own order), and neighbours merged where every operand's outer stride is its inner one
    times the inner size. 0, or 1 when more than MAP_MAX_DIMS dims remain (the kernels' limit)."""
    cdef Py_ssize_t ndim = len(shape), i, j
    cdef int d = 0, m, k
    cdef long long size, t
    cdef bint merge
    for i in range(ndim):
        size = shape[i]
        if size == 1:
            continue
        if d == LAYOUT_CAPACITY:
            return 1
        L.shape[d] = size
        L.stride[0][d] = a[i]
        L.stride[1][d] = b[i] if b is not None else 0
        L.stride[2][d] = c[0] if c is not None and i == ndim - 1 else 0
        L.stride[3][d] = out[i]
        d += 1
    if d == 0:  # one element (or none): a dense dim of one
        L.ndim = 1
        L.shape[0] = 1
        for k in range(OPERANDS):
            L.stride[k][0] = 1
        return 0
    for i in range(1, d):  # stable insertion sort, |out stride| descending
        j = i
        while j > 0 and _abs(L.stride[3][j - 1]) < _abs(L.stride[3][j]):
            size = L.shape[j]
            L.shape[j] = L.shape[j - 1]
            L.shape[j - 1] = size
            for k in range(OPERANDS):
                t = L.stride[k][j]
                L.stride[k][j] = L.stride[k][j - 1]
                L.stride[k][j - 1] = t
            j -= 1
    m = 0
    for i in range(1, d):
        merge = True
        for k in range(OPERANDS):
            if L.stride[k][m] != L.stride[k][i] * L.shape[i]:
                merge = False
                break
        if merge:
            L.shape[m] *= L.shape[i]
        else:
            m += 1
            L.shape[m] = L.shape[i]
        for k in range(OPERANDS):
            L.stride[k][m] = L.stride[k][i]
    L.ndim = m + 1
    return 1 if L.ndim > MAP_MAX_DIMS else 0


cdef inline bint _dense_layout(MapLayout* L, bint reads_b, bint reads_c):
    # One dim every operand walks with stride 1 (or a single element): the contiguous kernels.
    if L.ndim != 1:
        return False
    if L.shape[0] == 1:
        return True
    return (L.stride[0][0] == 1 and L.stride[3][0] == 1 and (not reads_b or L.stride[1][0] == 1)
            and (not reads_c or L.stride[2][0] == 1))


def map_layout(shape, a, b=None, c=None, out=None):
    """(shape, (a, b, c, out) strides) of the planned iteration space (plan_layout) of operands
    with these element strides (out None: C-contiguous), or None where the strided kernels cannot
    take it (more than rawops._constants.MAP_MAX_DIMS dims remain); for tests and tools."""
    cdef MapLayout layout
    shape = tuple(shape)
    if out is None:
        out = _c_strides(shape)
    if plan_layout(&layout, shape, a, b, c, out):
        return None
    return (tuple([layout.shape[i] for i in range(layout.ndim)]),
            tuple([tuple([layout.stride[k][i] for i in range(layout.ndim)]) for k in range(OPERANDS)]))


cdef tuple _c_strides(object shape):
    cdef list strides = []
    cdef long long step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= <long long>size
    strides.reverse()
    return tuple(strides)


cdef bint overlaps_itself(object shape, object strides) except -1:
    """Whether two elements of a layout may share memory: dims (of more than one element)
    taken by stride, smallest first, each stride must pass everything the smaller dims reach.
    A sufficient test: an interleaved layout that does not overlap may still be refused."""
    cdef list dims = sorted([(_abs(s), size) for size, s in zip(shape, strides) if size > 1])
    cdef long long reach = 0
    for s, size in dims:
        if s <= reach:
            return True
        reach += s * (size - 1)
    return False


def layout_overlaps_itself(shape, strides):
    """overlaps_itself, for tests: True where out= with these element strides is refused."""
    return overlaps_itself(tuple(shape), tuple(strides))


cdef inline tuple _span(uintptr_t p, object shape, object strides, int itemsize):
    # [first byte, past the last byte) an array touches; strides None: C-contiguous.
    cdef long long low = 0, high = 0, size
    if strides is None:
        size = 1
        for d in shape:
            size *= <long long>d
        return p, p + size * itemsize
    for d, s in zip(shape, strides):
        if s < 0:
            low += s * (d - 1)
        else:
            high += s * (d - 1)
    return p + low * itemsize, p + (high + 1) * itemsize


cdef bint extents_overlap(uintptr_t p, object shape, object strides, int itemsize,
                          uintptr_t q, object q_shape, object q_strides) except -1:
    """Whether the memory two arrays of one dtype span overlaps (neither empty)."""
    for d in shape:
        if d == 0:
            return False
    for d in q_shape:
        if d == 0:
            return False
    first, last = _span(p, shape, strides, itemsize)
    q_first, q_last = _span(q, q_shape, q_strides, itemsize)
    return first < q_last and q_first < last


cdef inline bint _same_layout(object shape, object strides, object q_shape, object q_strides):
    # The same elements at the same offsets (strides of size-1 dims do not matter).
    if tuple(shape) != tuple(q_shape):
        return False
    for size, s, t in zip(shape, strides, q_strides):
        if size > 1 and s != t:
            return False
    return True


cdef object _layout_strides(DeviceArray x):
    return x.strides if not x.contiguous else _c_strides(x.shape)


cdef int _require_elements(DeviceArray x) except -1:
    # A view whose byte strides are not whole elements (CAI allows it): no kernel can index it.
    if not x.contiguous and x.strides is None:
        raise ValueError(f"{x.name} has strides that are not a whole number of its {x.itemsize}-byte elements; "
                         "no kernel can index it: pass a contiguous copy")
    return 0


# ---------------------------------------------------------------------------- the map kernels
cdef class MapKernel:
    """One elementwise op over float32/float16/bfloat16, dispatching on dtype.

    Kernel signature (see kernels/elementwise.cu):
      (const T* a, const T* b, const T* c, T* out, int64 n, int64 head, int64 inner, float alpha)
    and the strided entry <name>_strided_<dtype>:
      (const T* a, const T* b, const T* c, T* out, int64 n, float alpha, MapLayout layout)
    `b` is read elementwise when reads_b, `c` as a row vector over the last dim when reads_c.

    Layouts: every operand may be any strided view (steps, transposes, broadcast stride-0
    inputs, offsets), launched as it is through the strided entry; out= may be strided too but
    no two of its elements may share memory. Without out= the result is a new C-contiguous
    array. All-contiguous calls take the contiguous entry and nothing else.
    """

    def __init__(self, str family, str name, tuple arg_names, bint reads_b=False, bint reads_c=False,
                 bint capped=False, int fast_unroll=1, int fast_unroll_f32=1):
        self.family = family
        self.name = name
        self.arg_names = arg_names
        self.reads_b = reads_b
        self.reads_c = reads_c
        self.capped = capped
        self.fast_unroll = fast_unroll
        self.fast_unroll_f32 = fast_unroll_f32

    def kernel_names(self):
        """The entries this op launches: <name>_<dtype>, <name>_strided_<dtype>, and its unrolled
        <name>_x<U>_<dtype> (fast_unroll_f32, fast_unroll) where U > 1."""
        names = [f"{self.name}_{s}" for s in FLOAT_SUFFIXES] + [f"{self.name}_strided_{s}" for s in FLOAT_SUFFIXES]
        if self.fast_unroll_f32 > 1:
            names.append(f"{self.name}_x{self.fast_unroll_f32}_{FLOAT_SUFFIXES[F32]}")
        if self.fast_unroll > 1:
            names += [f"{self.name}_x{self.fast_unroll}_{s}" for s in FLOAT_SUFFIXES[1:]]
        return names

    cdef uintptr_t function(self, int device, int dtype) except 0:
        if device < 0 or device >= MAX_DEVICES:
            raise ValueError(f"device {device} is out of range")
        if self._functions[device][dtype] == 0:
            load_driver()
            if self._threads[device] == 0:
                threads, shared = map_shape(self.capped, _modules.compute_capability(device),
                                            _modules.fast_memory(device))
                self._threads[device], self._shared[device] = threads, shared
            unroll = map_unroll(self.fast_unroll, self.fast_unroll_f32, dtype, _modules.fast_memory(device))
            entry = f"{self.name}_x{unroll}" if unroll != MAP_UNROLL else self.name
            function = _modules.function_pointer(self.family, f"{entry}_{FLOAT_SUFFIXES[dtype]}", device)
            self._unroll[device][dtype] = unroll
            # The scalar path's grid bound, asked once here so that a launch pays an array read.
            self._resident[device][dtype] = _modules.resident_blocks(function, self._threads[device],
                                                                     self._shared[device], device)
            self._functions[device][dtype] = function  # last: marks the entry complete
        return self._functions[device][dtype]

    cdef uintptr_t strided_function(self, int device, int dtype) except 0:
        if device < 0 or device >= MAX_DEVICES:
            raise ValueError(f"device {device} is out of range")
        if self._strided[device][dtype] == 0:
            load_driver()
            function = _modules.function_pointer(self.family, f"{self.name}_strided_{FLOAT_SUFFIXES[dtype]}", device)
            self._strided_resident[device][dtype] = _modules.resident_blocks(function, MAP_THREADS, 0, device)
            self._strided[device][dtype] = function  # last: marks the entry complete
        return self._strided[device][dtype]

    def launch_shape(self, int device):
        """(threads, dynamic shared bytes) of this op's launches on `device`."""
        self.function(device, F32)
        return self._threads[device], self._shared[device]

    def resident(self, int device, int dtype, bint strided=False):
        """The most blocks a grid-stride launch of this op's kernel for dtype code `dtype`
        (contiguous entry, or strided) takes on `device`: those the device holds at once."""
        if strided:
            self.strided_function(device, dtype)
            return self._strided_resident[device][dtype]
        self.function(device, dtype)
        return self._resident[device][dtype]

    def __call__(self, a, b=None, c=None, float alpha=0.0, out=None, stream=None):
        return self._call(a, b, c, alpha, out, stream, False)

    def check(self, a, b=None, c=None, out=None):
        """(a, b, c, out, device) as checked DeviceArrays (None where absent) and their GPU:
        every check a call makes, raised as a call would raise it; nothing is launched (for
        callers that launch a fused variant of this op on the same operands)."""
        return self._call(a, b, c, 0.0, out, None, True)

    cdef object _call(self, a, b, c, float alpha, out, stream, bint check_only):
        # One body for the call and for check(): the hot path builds no tuple. A strided
        # operand anywhere plans the layout here, so its errors come before any CUDA call.
        cdef DeviceArray A = as_array(a, self.arg_names[0])
        cdef DeviceArray B = None
        cdef DeviceArray C = None
        cdef DeviceArray O = None
        cdef uintptr_t s
        cdef MapLayout layout
        if A.dtype < 0 or A.dtype >= N_FLOAT:
            raise TypeError(f"{A.name} has dtype {A.dtype_text}; {self.name} supports float32, float16, bfloat16")
        cdef bint strided = not A.contiguous
        if strided:
            _require_elements(A)
        check_element_aligned(A)
        if self.reads_b:
            B = self._operand(b, self.arg_names[1], A)
            if B.shape != A.shape:
                raise ValueError(f"{B.name} has shape {B.shape}, expected {A.shape} like {A.name}")
            strided = strided or not B.contiguous
        if self.reads_c:
            C = self._operand(c, self.arg_names[len(self.arg_names) - 1], A)
            if len(A.shape) == 0 or C.shape != (A.shape[len(A.shape) - 1],):
                raise ValueError(f"{C.name} has shape {C.shape}, expected one value per element of "
                                 f"{A.name}'s last dim ({A.shape[len(A.shape) - 1] if A.shape else '?'},)")
            strided = strided or not C.contiguous
        if out is not None:
            O = self._operand(out, "out", A)
            if O.shape != A.shape:
                raise ValueError(f"out has shape {O.shape}, expected {A.shape} like {A.name}")
            if O.readonly:
                raise ValueError("out is read-only")
            if not O.contiguous:
                strided = True
                if overlaps_itself(O.shape, O.strides):
                    raise ValueError("out has elements that share memory (a stride of 0, or strides that overlap); "
                                     "every element of out needs memory of its own")
            if strided:
                self._check_strided_out(O, A)
                if B is not None:
                    self._check_strided_out(O, B)
                if C is not None:
                    self._check_strided_out(O, C)
            else:
                self._check_overlap(O, A)
                if B is not None:
                    self._check_overlap(O, B)
                if C is not None:
                    self._check_overlap(O, C)
        if strided:
            self._plan(&layout, A, B, C, O)

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
                return self._run(A, B, C, O, alpha, stream, s, device, &layout if strided else NULL)
        return self._run(A, B, C, O, alpha, stream, s, device, &layout if strided else NULL)

    cdef DeviceArray _operand(self, object obj, str name, DeviceArray like):
        if obj is None:
            raise TypeError(f"{self.name} needs {name}")
        cdef DeviceArray x = as_array(obj, name)
        if x.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {x.dtype_text}, expected {like.dtype_text} like {like.name}")
        _require_elements(x)
        check_element_aligned(x)
        return x

    cdef int _check_overlap(self, DeviceArray o, DeviceArray x) except -1:
        # Exact aliasing (out=x) is a supported in-place update; a partial overlap would
        # read elements this launch has already written.
        if (o.ptr != x.ptr or o.nbytes != x.nbytes) and o.ptr < x.ptr + x.nbytes and x.ptr < o.ptr + o.nbytes:
            raise ValueError(f"out partially overlaps {x.name}; pass out={x.name} exactly, or a separate array")
        return 0

    cdef int _check_strided_out(self, DeviceArray o, DeviceArray x) except -1:
        # As _check_overlap, by the memory each layout spans: out=x exactly (the same pointer,
        # shape and strides) is in place; any other overlap of the spans is refused (an
        # interleaved pair that shares no element included: the test is by span).
        cdef object o_strides = _layout_strides(o), x_strides = _layout_strides(x)
        if o.ptr == x.ptr and _same_layout(o.shape, o_strides, x.shape, x_strides):
            return 0
        if extents_overlap(o.ptr, o.shape, o_strides, o.itemsize, x.ptr, x.shape, x_strides):
            raise ValueError(f"out partially overlaps {x.name}; pass out={x.name} exactly, or a separate array")
        return 0

    cdef int _plan(self, MapLayout* layout, DeviceArray A, DeviceArray B, DeviceArray C, DeviceArray O) except -1:
        if plan_layout(layout, A.shape, _layout_strides(A), _layout_strides(B) if B is not None else None,
                       _layout_strides(C) if C is not None else None,
                       _layout_strides(O) if O is not None else _c_strides(A.shape)):
            raise ValueError(f"{A.name} and the other operands have more than {MAP_MAX_DIMS} dims once size-1 "
                             f"dims are dropped and contiguous ones merged; the strided kernels take at most "
                             f"{MAP_MAX_DIMS}: pass contiguous copies")
        return 0

    cdef object _run(self, DeviceArray A, DeviceArray B, DeviceArray C, DeviceArray O, float alpha,
                     object stream, uintptr_t s, int device, MapLayout* layout):
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
            if layout == NULL:
                self.launch_pointers(device, A.dtype, A.ptr, B.ptr if B is not None else 0,
                                     C.ptr if C is not None else 0, out_ptr, A.size,
                                     C.size if C is not None else 1, alpha, s)
            else:
                self.launch_layout(device, A.dtype, A.ptr, B.ptr if B is not None else 0,
                                   C.ptr if C is not None else 0, out_ptr, A.size, layout, alpha, s)
        return result

    def launch_arrays(self, int device, DeviceArray a, DeviceArray b, DeviceArray c, DeviceArray out,
                      uintptr_t out_ptr, float alpha, uintptr_t stream):
        """Launch on operands checked by check() (b, c, out None where absent), writing out_ptr:
        out's pointer, or a new C-contiguous array of a's shape when out is None; on `stream`,
        with `device`'s context current. The strided entry where any operand is strided."""
        cdef MapLayout layout
        if a.size == 0:
            return 0
        if a.contiguous and (b is None or b.contiguous) and (c is None or c.contiguous) and (
                out is None or out.contiguous):
            return self.launch_pointers(device, a.dtype, a.ptr, b.ptr if b is not None else 0,
                                        c.ptr if c is not None else 0, out_ptr, a.size,
                                        c.size if c is not None else 1, alpha, stream)
        self._plan(&layout, a, b, c, out)
        return self.launch_layout(device, a.dtype, a.ptr, b.ptr if b is not None else 0,
                                  c.ptr if c is not None else 0, out_ptr, a.size, &layout, alpha, stream)

    cpdef int launch_pointers(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c,
                              uintptr_t out, long long n, long long inner, float alpha,
                              uintptr_t stream) except -1:
        """Launch on raw pointers already checked by the caller, on `stream`, with `device`'s
        context current (the torch adapter's path too)."""
        cdef uintptr_t function = self.function(device, dtype)
        cdef int itemsize = 4 if dtype == F32 else 2
        cdef long long head = _map_head(n, itemsize, out, a, b if self.reads_b else 0)
        cdef unsigned threads = self._threads[device], shared = self._shared[device]
        cdef long long blocks = _map_blocks(n, head, itemsize, self._resident[device][dtype], threads,
                                            self._unroll[device][dtype])
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

    cdef int launch_layout(self, int device, int dtype, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t out,
                           long long n, MapLayout* layout, float alpha, uintptr_t stream) except -1:
        """Launch over a planned layout (plan_layout) of n elements: where it came out as one
        dim every operand walks with stride 1, the contiguous entry (same kernel, same shape as
        a contiguous call); otherwise the strided entry."""
        if not self.reads_b:
            b = 0
        if not self.reads_c:
            c = 0
        if _dense_layout(layout, self.reads_b, self.reads_c):
            return self.launch_pointers(device, dtype, a, b, c, out, n, n if self.reads_c else 1, alpha, stream)
        cdef uintptr_t function = self.strided_function(device, dtype)
        # The kernel's MapLayout: ndim, shape[MAP_MAX_DIMS], stride[4][MAP_MAX_DIMS], 64-bit words.
        cdef long long words[1 + (OPERANDS + 1) * LAYOUT_CAPACITY]
        cdef int i, k
        words[0] = layout.ndim
        for i in range(layout.ndim):
            words[1 + i] = layout.shape[i]
            for k in range(OPERANDS):
                words[1 + (k + 1) * MAP_MAX_DIMS + i] = layout.stride[k][i]
        cdef void* params[7]
        params[0] = &a
        params[1] = &b
        params[2] = &c
        params[3] = &out
        params[4] = &n
        params[5] = &alpha
        params[6] = words
        cdef long long blocks = _strided_blocks(n, self._strided_resident[device][dtype])
        return launch_kernel(function, <unsigned>blocks, 1, 1, MAP_THREADS, 0, stream, params, device)


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
with approximate='tanh' (torch.nn.functional.gelu's argument and default).
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(x, approximate, out=out, stream=stream)
        return kernel._call(x, None, None, 0.0, out, stream, False)

    @cython.binding(False)
    def gelu_backward(self, dy, x, approximate="none", *, out=None, stream=None):
        """gelu_backward($self, dy, x, approximate='none', *, out=None, stream=None)
--

dx = dy * gelu'(x).
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(dy, x, approximate, out=out, stream=stream)
        return kernel._call(dy, x, None, 0.0, out, stream, False)

    @cython.binding(False)
    def bias_gelu(self, x, bias, approximate="none", *, out=None, stream=None):
        """bias_gelu($self, x, bias, approximate='none', *, out=None, stream=None)
--

gelu(x + bias), bias of shape (x.shape[-1],) broadcast over the leading dims, in one pass.
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        cdef MapKernel kernel = self._mode(approximate)
        if kernel is None:
            return self.fallback(x, bias, approximate, out=out, stream=stream)
        return kernel._call(x, None, bias, 0.0, out, stream, False)

    @cython.binding(False)
    def relu(self, x, *, out=None, stream=None):
        """relu($self, x, *, out=None, stream=None)
--

max(x, 0); NaN stays NaN, as in torch.relu.
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        return self.plain._call(x, None, None, 0.0, out, stream, False)

    @cython.binding(False)
    def relu_backward(self, dy, x, *, out=None, stream=None):
        """relu_backward($self, dy, x, *, out=None, stream=None)
--

dx = dy where x > 0, else 0.
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        return self.plain._call(dy, x, None, 0.0, out, stream, False)

    @cython.binding(False)
    def relu_scale(self, x, alpha, *, out=None, stream=None):
        """relu_scale($self, x, alpha, *, out=None, stream=None)
--

relu(x) * alpha in one pass.
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        return self.plain._call(x, None, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def relu_scale_backward(self, dy, x, alpha, *, out=None, stream=None):
        """relu_scale_backward($self, dy, x, alpha, *, out=None, stream=None)
--

dx = dy * alpha where x > 0, else 0.
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        return self.plain._call(dy, x, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def relu_scale_add(self, x, alpha, y, *, out=None, stream=None):
        """relu_scale_add($self, x, alpha, y, *, out=None, stream=None)
--

relu(x) * alpha + y in one pass.
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        return self.plain._call(x, y, None, real_scalar(alpha, "alpha"), out, stream, False)

    @cython.binding(False)
    def add(self, a, b, *, out=None, stream=None):
        """add($self, a, b, *, out=None, stream=None)
--

a + b, same shape and dtype (no broadcasting).
Arrays of any layout (strided views run the strided kernel, no copy); a new C-contiguous
result unless out= is given."""
        return self.plain._call(a, b, None, 0.0, out, stream, False)
