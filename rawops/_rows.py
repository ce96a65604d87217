"""What the row-wise families (norm, softmax) share: the launch shape of their kernels and
the checks of their arguments. Kernels: kernels/include/rawops/rows.cuh.

Every row kernel runs in one of three modes (rows.cuh explains them); the mode, block and
grid are pure arithmetic of the row width, tested without a GPU (tests/test_rows.py).
"""
from ._launch import FLOAT_SUFFIXES, as_array, resolve_device

MAX_ROW_THREADS = 512  # kMaxRowThreads: the widest block, and the kernels' launch bound
MIN_ROW_THREADS = 64  # narrowest block-per-row block (a single warp is warp mode)
MIN_STREAM_THREADS = 32
WARP_BLOCK = 256  # warp-per-row blocks
WARP_ROWS = WARP_BLOCK // 32  # rows per warp-mode block
FWD_BYTES = 64  # kFwdVectors x 16 bytes a thread holds in registers, forward
BWD_BYTES = 32  # kBwdVectors x 16, backward
WARP_PER_ROW, BLOCK_PER_ROW, STREAM_ROW = 0, 1, 2
MAX_GRID = (1 << 31) - 1  # gridDim.x; kernels loop over rows past it
THREADS_PER_SM = 2048  # resident threads per SM (sm_75 has 1024: extra blocks queue, correct)


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
        mode, blocks = STREAM_ROW, rows
        threads = min(MAX_ROW_THREADS, max(MIN_STREAM_THREADS, _pow2_at_least(-(-n // per_vector))))
    elif need <= 32:
        mode, threads, blocks = WARP_PER_ROW, WARP_BLOCK, -(-rows // WARP_ROWS)
    elif need <= MAX_ROW_THREADS:
        mode, threads, blocks = BLOCK_PER_ROW, max(MIN_ROW_THREADS, _pow2_at_least(need)), rows
    else:
        mode, threads, blocks = STREAM_ROW, MAX_ROW_THREADS, rows
    return mode, max(1, min(blocks, MAX_GRID)), threads


def resident_blocks(sms, threads, threads_per_sm=THREADS_PER_SM):
    """Blocks of `threads` threads that fill every SM once, `threads_per_sm` of them fitting
    an SM (by the thread limit unless the kernel's registers allow fewer)."""
    return sms * max(1, threads_per_sm // threads)


def chunks(mode, blocks, threads):
    """Partial rows a norm backward writes: one per warp in warp mode, else one per block."""
    return blocks * (threads // 32) if mode == WARP_PER_ROW else blocks


def vectors(n, itemsize, *pointers):
    """1 when every row of every operand starts on a 16-byte boundary (16-byte accesses),
    else 0 (element by element). Null pointers (absent operands) do not count."""
    if (n * itemsize) % 16:
        return 0
    return int(all(p % 16 == 0 for p in pointers if p))


def kernel_name(base, dtype):
    return f"{base}_{FLOAT_SUFFIXES[dtype]}"


# ------------------------------------------------------------------------------ argument checks
def rows_array(obj, name, op, like=None):
    """A float array of at least one dimension, C-contiguous and element-aligned; with
    `like`, of its dtype and shape."""
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
    _dense(a)
    return a


def vector_array(obj, name, like):
    """weight / bias: one value per element of like's last dim, of like's dtype."""
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
    """mean / rstd from a forward: float32, one value per row of like."""
    a = as_array(obj, name)
    if a.dtype != 0:
        raise TypeError(f"{name} has dtype {a.dtype_text}, expected float32 (as the forward returns it)")
    rows = like.size // like.shape[-1] if like.shape[-1] else 0
    if a.size != rows:
        raise ValueError(f"{name} has {a.size} values, expected one per row of {like.name} ({rows})")
    _dense(a)
    return a


def out_array(obj, like, others):
    """out=: like's dtype and shape, writable; the same memory as like (in place) or none of
    it, and disjoint from every other operand."""
    o = as_array(obj, "out")
    if o.dtype != like.dtype:
        raise TypeError(f"out has dtype {o.dtype_text}, expected {like.dtype_text} like {like.name}")
    if o.shape != like.shape:
        raise ValueError(f"out has shape {o.shape}, expected {like.shape} like {like.name}")
    _dense(o)
    if o.readonly:
        raise ValueError("out is read-only")
    for x in (like, *others):
        if x is None:
            continue
        exact = x is like and o.ptr == x.ptr and o.nbytes == x.nbytes
        if not exact and o.nbytes and x.nbytes and o.ptr < x.ptr + x.nbytes and x.ptr < o.ptr + o.nbytes:
            hint = f"pass out={x.name} exactly, or a separate array" if x is like else "pass a separate array"
            raise ValueError(f"out overlaps {x.name}; {hint}")
    return o


def _dense(a):
    if not a.contiguous:
        raise ValueError(f"{a.name} is not C-contiguous; rawops never copies behind your back: "
                         f"pass a contiguous array (e.g. {a.name}.copy())")
    if a.itemsize and a.ptr % a.itemsize:
        raise ValueError(f"{a.name} is misaligned: address 0x{a.ptr:x} is not a multiple of its "
                         f"{a.itemsize}-byte element")


def one_device(first, *others):
    """The device of every array (None entries skipped); ValueError naming a stray one."""
    device = resolve_device(first)
    for other in others:
        if other is not None and resolve_device(other) != device:
            raise ValueError(f"{other.name} is on device {other.device}, {first.name} on device {device}; "
                             "all arguments must be on one GPU")
    return device
