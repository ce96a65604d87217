"""What the row-wise families (norm, softmax) share: the launch shape of their kernels and
the checks of their arguments. Kernels: kernels/include/rawops/rows.cuh.

Every row kernel runs in one of three modes (rows.cuh explains them); the mode, block and
grid are pure arithmetic of the row width, tested without a GPU (tests/test_rows.py).

Layouts: each row operand (x, y, dy, dx, out) is read through its own row stride, so a view
whose last dim is contiguous and whose leading dims collapse to one row index with one stride
(`x[:, :n]` of a wider matrix, `x[::2]`, `x[2:, 1:5]`) is launched as it is; any other layout is
refused naming the argument. weight, bias and the statistics are dense vectors.
"""
from . import _constants
from ._launch import FLOAT_SUFFIXES, as_array, resolve_device

MAX_ROW_THREADS = _constants.ROW_MAX_THREADS  # the widest block, and the kernels' launch bound
MIN_ROW_THREADS = 64  # narrowest block-per-row block (a single warp is warp mode)
MIN_STREAM_THREADS = 32
WARP_BLOCK = 256  # warp-per-row blocks
WARP_ROWS = WARP_BLOCK // 32  # rows per warp-mode block
FWD_BYTES = 16 * _constants.ROW_FWD_VECTORS  # bytes of a row a thread holds in registers, forward
BWD_BYTES = 16 * _constants.ROW_BWD_VECTORS  # backward, of each of its two operands
WARP_PER_ROW, BLOCK_PER_ROW, STREAM_ROW = (_constants.ROW_MODE_WARP, _constants.ROW_MODE_BLOCK,
                                           _constants.ROW_MODE_STREAM)
MAX_GRID = (1 << 31) - 1  # gridDim.x; kernels loop over rows past it


def _pow2_at_least(k):
    return 1 << max(0, k - 1).bit_length()


def row_plan(rows, n, elems, itemsize, aligned):
    """(mode, blocks, threads) for `rows` rows of `n` elements of `itemsize` bytes, `elems`
    per thread in registers; `aligned`: every operand's rows on 16-byte boundaries (vectors()).

    Aligned rows: a warp per row while the row fits a warp's registers; then one row per
    block of the fewest threads (a power of two, 64..512) that hold it, so that small blocks
    share an SM and one row's reductions overlap others' loads; then a 512-thread block per
    row streaming from memory. Rows off 16-byte boundaries always stream, in a block of about
    one thread per 16 bytes of the row (32..512). One block per row (warp mode: per 8 rows);
    norm's backward caps the grid itself (norm.backward_plan).
    """
    need = -(-n // elems)
    if not aligned:
        per_vector = 16 // itemsize
        mode = STREAM_ROW
        threads = min(MAX_ROW_THREADS, max(MIN_STREAM_THREADS, _pow2_at_least(-(-n // per_vector))))
    elif need <= 32:
        mode, threads = WARP_PER_ROW, WARP_BLOCK
    elif need <= MAX_ROW_THREADS:
        mode, threads = BLOCK_PER_ROW, max(MIN_ROW_THREADS, _pow2_at_least(need))
    else:
        mode, threads = STREAM_ROW, MAX_ROW_THREADS
    return mode, row_blocks(rows, mode), threads


def row_blocks(rows, mode):
    """row_plan's grid for `rows` rows in `mode`: a block a row (warp mode: WARP_ROWS rows a block),
    at most MAX_GRID (the kernels loop over rows past it)."""
    blocks = -(-rows // WARP_ROWS) if mode == WARP_PER_ROW else rows
    return max(1, min(blocks, MAX_GRID))


def resident_blocks(sms, threads, threads_per_sm):
    """Blocks of `threads` threads that fill every SM once, `threads_per_sm` of them fitting an SM
    (a bound a kernel's launch bounds guarantee: norm's backward plans its partial rows with it,
    and launches the fewer the occupancy API gives, rawops._modules.resident_blocks)."""
    return sms * max(1, threads_per_sm // threads)


def chunks(mode, blocks, threads):
    """Partial rows a norm backward writes: one per warp in warp mode, else one per block."""
    return blocks * (threads // 32) if mode == WARP_PER_ROW else blocks


def vectors(n, itemsize, *pointers, strides=()):
    """1 when every row of every operand starts on a 16-byte boundary (16-byte accesses),
    else 0 (element by element): n a whole number of vectors, every pointer 16-byte aligned and
    every row stride (elements) a whole number of vectors. Null pointers (absent operands) do
    not count."""
    if (n * itemsize) % 16:
        return 0
    for s in strides:  # plain loops: every launch asks, and generators cost a call each
        if (s * itemsize) % 16:
            return 0
    for p in pointers:  # a null pointer (0) passes
        if p % 16:
            return 0
    return 1


def kernel_name(base, dtype):
    return f"{base}_{FLOAT_SUFFIXES[dtype]}"


# ------------------------------------------------------------------------------ argument checks
def rows_array(obj, name, op, like=None):
    """A float array of at least one dimension, row-strided (row_stride) and element-aligned;
    with `like`, of its dtype and shape."""
    a = as_array(obj, name)
    if like is not None:
        if a.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {a.dtype_text}, expected {like.dtype_text} like {like.name}")
        if a.shape != like.shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {like.shape} like {like.name}")
    elif a.dtype < 0 or a.dtype >= len(FLOAT_SUFFIXES):
        raise TypeError(f"{name} has dtype {a.dtype_text}; {op} supports float32, float16, bfloat16")
    elif len(a.shape) == 0:
        raise ValueError(f"{name} must have at least one dimension ({op} works over the last dim)")
    row_stride(a)
    _aligned(a)
    return a


def collapsed_row_stride(shape, strides):
    """The row stride (elements) of a layout of at least one dim whose last dim is contiguous
    and whose leading dims collapse to one row index with one stride; None for any other. Dims
    of one element have no say (their strides are arbitrary)."""
    n = shape[-1]
    if n > 1 and strides[-1] != 1:
        return None
    lead = [(d, s) for d, s in zip(shape[:-1], strides[:-1]) if d != 1]
    for (_, outer), (size, inner) in zip(lead, lead[1:]):
        if outer != inner * size:
            return None
    return lead[-1][1] if lead else n


def row_stride(a):
    """The elements between consecutive rows of `a` (its leading dims collapsed into one row
    index): n for a C-contiguous array; for a view, the stride that its leading dims collapse
    to, any value (0 and negative ones included). ValueError naming the array where its last
    dim is not contiguous or its leading dims have no single stride."""
    shape = a.shape
    if a.contiguous:
        return shape[-1]
    strides = a.strides
    if strides is None:
        raise ValueError(f"{a.name} has strides that are not a whole number of its {a.itemsize}-byte elements; "
                         f"no kernel can index it: pass a contiguous copy")
    stride = collapsed_row_stride(shape, strides)
    if stride is None:
        raise ValueError(f"{a.name} is not row-strided: shape {shape} with strides {strides} (elements); the row "
                         f"kernels need each row's elements consecutive and the leading dims at one row stride: "
                         f"pass a contiguous copy (e.g. {a.name}.copy())")
    return stride


def vector_array(obj, name, like):
    """weight / bias: one value per element of like's last dim, of like's dtype, dense."""
    a = as_array(obj, name)
    if a.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {a.dtype_text}, expected {like.dtype_text} like {like.name}")
    n = like.shape[-1]
    if a.shape != (n,):
        raise ValueError(f"{name} has shape {a.shape}, expected ({n},): one value per element of "
                         f"{like.name}'s last dim")
    _dense(a)
    return a


def stats_array(obj, name, like):
    """mean / rstd from a forward: float32, one value per row of like, dense."""
    a = as_array(obj, name)
    if a.dtype != 0:
        raise TypeError(f"{name} has dtype {a.dtype_text}, expected float32 (as the forward returns it)")
    rows = like.size // like.shape[-1] if like.shape[-1] else 0
    if a.size != rows:
        raise ValueError(f"{name} has {a.size} values, expected one per row of {like.name} ({rows})")
    _dense(a)
    return a


def out_array(obj, like, others):
    """out=: like's dtype and shape, writable, row-strided with rows that do not overlap each
    other; the same memory as like (in place: the same pointer and row stride) or none of it,
    and disjoint from every other operand."""
    o = as_array(obj, "out")
    if o.dtype != like.dtype:
        raise TypeError(f"out has dtype {o.dtype_text}, expected {like.dtype_text} like {like.name}")
    if o.shape != like.shape:
        raise ValueError(f"out has shape {o.shape}, expected {like.shape} like {like.name}")
    stride = row_stride(o)
    _aligned(o)
    if o.readonly:
        raise ValueError("out is read-only")
    n = o.shape[-1]
    rows = o.size // n if n else 0
    if rows > 1 and abs(stride) < n:
        raise ValueError(f"out has rows {stride} elements apart, {n} wide: its rows overlap each other; every "
                         "element of out needs memory of its own")
    span = extent(o, stride)
    for x in (like, *others):
        if x is None:
            continue
        exact = x is like and o.ptr == x.ptr and stride == row_stride(x)
        if not exact and _overlap(span, extent(x)):
            hint = f"pass out={x.name} exactly, or a separate array" if x is like else "pass a separate array"
            raise ValueError(f"out overlaps {x.name}; {hint}")
    return o


def extent(a, stride=None):
    """[first byte, past the last byte) that the rows of `a` touch (None for no elements)."""
    if a.size == 0:
        return None
    if a.contiguous:
        return a.ptr, a.ptr + a.nbytes
    if stride is None:
        stride = row_stride(a) if len(a.shape) else 0
    n = a.shape[-1]
    rows = a.size // n
    low = min(0, stride * (rows - 1))
    high = max(0, stride * (rows - 1)) + n
    return a.ptr + low * a.itemsize, a.ptr + high * a.itemsize


def _overlap(a, b):
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def _aligned(a):
    if a.itemsize and a.ptr % a.itemsize:
        raise ValueError(f"{a.name} is misaligned: address 0x{a.ptr:x} is not a multiple of its "
                         f"{a.itemsize}-byte element")


def _dense(a):
    """C-contiguous and element-aligned, else a ValueError naming the array (the layout every
    dense operand needs: weight, bias, statistics, and the gemm and mlp families' arrays)."""
    if not a.contiguous:
        raise ValueError(f"{a.name} is not C-contiguous; rawops never copies behind your back: "
                         f"pass a contiguous array (e.g. {a.name}.copy())")
    _aligned(a)


def one_device(first, *others):
    """The device of every array (None entries skipped); ValueError naming a stray one."""
    device = resolve_device(first)
    for other in others:
        if other is not None and resolve_device(other) != device:
            raise ValueError(f"{other.name} is on device {other.device}, {first.name} on device {device}; "
                             "all arguments must be on one GPU")
    return device
