"""topk, the sorting family's selection (kernels/sorting_topk.cu): the k largest (or smallest)
elements of every row and their indices, as torch.topk. rawops.sorting re-exports `topk`.

Keys: float32, float16, bfloat16, int32, int64; order as torch's (NaN above +inf, so NaN
counts among the largest; -0.0 == +0.0). k from 1 to 1024 and at most the row length (torch
also takes k=0: here a ValueError). values have x's dtype, indices are int64 positions in the
row. sorted=True: values descending for largest (ascending for smallest); equal values in any
order, each index gathering its value. sorted=False: the same k, in no promised order.

Layouts: x over its last dim may be a view whose last dim is contiguous and whose leading dims
collapse to one row stride (`x[:, :n]` of a wider matrix, `x[::2]`): read as it is. Another
`dim` costs a transposed contiguous copy of x (one extra read and write of it) and of the
results back (values and indices, moved into place). Any other layout is a ValueError naming
x. Results are new contiguous arrays.

Kernels (plan() chooses, a pure function of rows, n, k, dtype and the SM count): a warp per
row filtering the row against its running k-th smallest for k <= 32 over many rows; else a block radix
select per row, each row cut over several blocks when the rows are too few to fill the GPU,
the chunks' candidates merged by a second launch (scratch: rows * chunks * k values and
int64 indices, allocated on the launch's stream).
"""
import collections

import numpy

from ._launch import allocating_on, as_array, hold_if_capturing, launch, resolve_device, sm_count
from ._launch import stream_pointer, wait_for_producer
from . import _modules, _rows
from ._sorting_keys import KEY_TYPES, MAX_GRID, checked_bool, checked_dim, checked_rows, key_type
from ._sorting_keys import SUFFIXES  # noqa: F401  (the table's dtypes: rawops info and the build test read it)

FAMILY = "sorting_topk"
WARP_MAX_K = 32  # topk_warp: the warp's list is one pair per lane
_WARP_ARGS = ("x", "values", "indices", "rows", "n", "x_stride", "k", "largest")
_RADIX_ARGS = ("x", "in_idx", "values", "indices", "rows", "n", "x_stride", "chunks", "k", "largest", "sorted")
# The family's table: kernel base name -> argument names; each exists once per suffix.
KERNELS = {"topk_warp": _WARP_ARGS, "topk_radix": _RADIX_ARGS}
WARP_KINDS = "pppqqqqq"
RADIX_KINDS = "ppppqqqqqqq"

MAX_K = 1024  # the radix select's sort of the winners: 256 threads x 4
THREADS = 256  # both kernels' block
WARP_ROWS = THREADS // 32  # rows a warp-kernel block takes
# Warp per row when rows give every SM this many warps (latency hidden by rows in flight).
WARP_MIN_ROWS_PER_SM = 8
# Radix select: one block per row when the rows give every SM this many blocks; fewer rows
# are cut into chunks until about SPLIT_BLOCKS_PER_SM blocks a SM run, every chunk holding at
# least k elements and MIN_CHUNK_BYTES of the row (a smaller one costs more in its passes'
# fixed work than it saves).
BLOCK_MIN_ROWS_PER_SM = 2
SPLIT_BLOCKS_PER_SM = 4
MIN_CHUNK_BYTES = 32768

ITEMSIZE = {name: bits // 8 for name, (_, _, bits) in KEY_TYPES.items()}

Plan = collections.namedtuple("Plan", "kernel blocks threads chunks")
Plan.__doc__ = """A launch plan: kernel base name, grid, block, chunks per row (radix: a second
launch merges the chunks' candidates when chunks > 1)."""


def plan(rows, n, k, dtype, sms):
    """The launch of topk over `rows` rows of `n` elements of `dtype` (a name of KEY_TYPES),
    1 <= k <= min(n, MAX_K), rows > 0, on a GPU of `sms` multiprocessors."""
    itemsize = ITEMSIZE[dtype]
    if k <= WARP_MAX_K and rows >= WARP_MIN_ROWS_PER_SM * sms:
        return Plan("topk_warp", min(-(-rows // WARP_ROWS), MAX_GRID), THREADS, 1)
    chunks = 1
    if rows < BLOCK_MIN_ROWS_PER_SM * sms:
        want = -(-SPLIT_BLOCKS_PER_SM * sms // rows)
        chunks = max(1, min(want, n // max(k, MIN_CHUNK_BYTES // itemsize)))
    return Plan("topk_radix", min(rows * chunks, MAX_GRID), THREADS, chunks)


# ------------------------------------------------------------------------------ checks
def checked_k(k, n):
    """k as an int in [1, min(n, MAX_K)], TypeError / ValueError naming it."""
    if isinstance(k, bool) or not isinstance(k, (int, numpy.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if k > n:
        raise ValueError(f"k ({k}) is larger than the row length ({n}) along dim")
    if k > MAX_K:
        raise ValueError(f"k ({k}) is larger than {MAX_K}, the most topk selects; sort the rows instead "
                         "(rawops.sorting.sort) and take the first k")
    return k


# ------------------------------------------------------------------------------ launches
def launch_topk(device, suffix, dtype, x_ptr, values_ptr, indices_ptr, rows, n, x_stride, k, largest, sorted,
                stream, scratch):
    """The launches of topk on checked pointers (rows > 0, 1 <= k <= min(n, MAX_K));
    scratch(count) -> (values, indices) device arrays of `count` elements each, for the
    candidates of a split row (a CuPy allocation on the launch's stream)."""
    p = plan(rows, n, k, dtype, sm_count(device))
    function = _modules.function_pointer(FAMILY, f"{p.kernel}_{suffix}", device)
    if p.kernel != "topk_radix":
        launch(function, (p.blocks,), p.threads, 0, stream,
               (x_ptr, values_ptr, indices_ptr, rows, n, x_stride, k, int(largest)), WARP_KINDS, device)
        return None
    if p.chunks == 1:
        launch(function, (p.blocks,), p.threads, 0, stream,
               (x_ptr, 0, values_ptr, indices_ptr, rows, n, x_stride, 1, k, int(largest), int(sorted)),
               RADIX_KINDS, device)
        return None
    cand_values, cand_indices = scratch(rows * p.chunks * k)
    cv, ci = _pointer(cand_values), _pointer(cand_indices)
    launch(function, (p.blocks,), p.threads, 0, stream,
           (x_ptr, 0, cv, ci, rows, n, x_stride, p.chunks, k, int(largest), 0), RADIX_KINDS, device)
    m = p.chunks * k
    launch(function, (min(rows, MAX_GRID),), p.threads, 0, stream,
           (cv, ci, values_ptr, indices_ptr, rows, m, m, 1, k, int(largest), int(sorted)), RADIX_KINDS, device)
    return cand_values, cand_indices


def _pointer(a):
    return a.data.ptr if hasattr(a, "data") and hasattr(a.data, "ptr") else a.data_ptr()


# ------------------------------------------------------------------------------ CuPy API
def topk(x, k, dim=-1, largest=True, sorted=True, *, stream=None):
    """(values, indices): the k largest (largest=False: smallest) elements of x along dim and
    their int64 positions, as torch.topk; values in x's dtype (module docstring for layouts
    and what another dim costs)."""
    import cupy

    a = as_array(x, "x")
    dtype = key_type(a, "topk")
    if len(a.shape) == 0:
        raise ValueError("x must have at least one dimension (topk selects along dim)")
    dim = checked_dim(dim, len(a.shape))
    k = checked_k(k, a.shape[dim])
    largest = checked_bool(largest, "largest")
    sorted = checked_bool(sorted, "sorted")
    suffix, np_dtype, _ = KEY_TYPES[dtype]
    n = a.shape[dim]
    checked_rows(a, n, np_dtype.itemsize, "topk")
    last = dim == len(a.shape) - 1
    if last:
        x_stride = _rows.row_stride(a)
    device = resolve_device(a)
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(a, s)
        source = a
        if not last:  # the documented transposed copy, on the launch's stream
            moved = cupy.ascontiguousarray(cupy.moveaxis(a.obj if a.is_cupy else cupy.asarray(a.obj), dim, -1))
            source = as_array(moved, "x")
            x_stride = n
        shape = source.shape[:-1] + (k,)
        values = cupy.empty(shape, np_dtype)
        indices = cupy.empty(shape, numpy.int64)
        rows = source.size // n
        if rows:
            scratch = launch_topk(device, suffix, dtype, source.ptr, values.data.ptr, indices.data.ptr, rows, n,
                                  x_stride, k, largest, sorted, s,
                                  lambda count: (cupy.empty(count, np_dtype), cupy.empty(count, numpy.int64)))
            if scratch is not None:
                hold_if_capturing(s, *scratch)
        if not last:
            values = cupy.ascontiguousarray(cupy.moveaxis(values, -1, dim))
            indices = cupy.ascontiguousarray(cupy.moveaxis(indices, -1, dim))
    return values, indices
