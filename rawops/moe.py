"""Mixture of experts: routing and token permutation, forward and backward. Kernels: kernels/moe.cu.

moe_route(logits, k, score="softmax", normalize=True) -> (weights, ids, counts), one kernel a call
(plus the zeroing of counts): for each token row of E logits (T, E), the scores in float32 (softmax
over the E experts, or each expert's sigmoid), the k largest (equal scores go to the lower expert
id; a NaN score ranks above every number, so a NaN logit makes its row's weights NaN), their
weights (the k scores over their sum when normalize, else the scores themselves: Hugging Face's
Qwen3-MoE / Mixtral router is softmax, top-k, normalize; norm_topk_prob=False is normalize=False),
and the tokens each expert got. weights (T, k) float32 and ids (T, k) int32 in descending score
order (as torch.topk's sorted output); counts (E,) int32 (torch.bincount's are int64: a GEMM's
group sizes are int32). E up to MAX_EXPERTS, 1 <= k <= min(E, MAX_K). logits float32, float16 or
bfloat16, any row stride (the last dim contiguous). moe_route_backward(logits, ids, grad_weights,
score, normalize) gives d logits (T, E) in the logits' dtype, recomputing the scores.

moe_permute(x, ids, num_experts, pad_to=1) -> (permuted, offsets, counts, index): the k copies of
every token row x[t] (T, H) grouped by expert, in token order within each group (a stable counting
sort of the ids: a histogram a chunk of entries, then a scan and a stable placement; no float atomics,
the same layout every run). Group e is rows [offsets[e], offsets[e + 1]) of permuted; its first
counts[e] rows are its tokens, the rest (pad_to > 1: each group rounded up to a multiple of pad_to
rows, a GEMM's tile) zero. permuted has T k + E (pad_to - 1) rows when pad_to > 1 (the most the
padding can take, so that its size needs no read-back of the counts), T k otherwise; rows past
offsets[E] are zero. index (T, k) int32 is the row of each copy: permuted[index[t, j]] = x[t].
The copy is a gather: the placement also records each row's entry, and a warp writes each output
row from its token's row, the groups' rows taken interleaved (the i-th row of every group, then
the next), so the warps in flight read nearby tokens: x's rows come k times from L2, out is
written once.
ids int32 or int64 (torch.topk's). An id outside [0, E) is never a silent number: its copy goes
to a row past offsets[E] (no group reads it) and its index is stored as -(row + 1), which
moe_unpermute and the backwards read as NaN for that token.

moe_unpermute(y, weights, index) -> (T, H): out[t] = sum_j weights[t, j] y[index[t, j]], in
float32, j in order (no atomics: the same bits every run); weights None sums the copies (the
permute's backward: moe_permute_backward). y (N, H) of any row stride, N at least T k.
moe_unpermute_backward(grad_out, y, weights, index, offsets=None, counts=None) -> (d y, d weights):
d y[index[t, j]] = weights[t, j] grad_out[t], d weights[t, j] = <grad_out[t], y[index[t, j]]>
(float32). d y has y's rows; rows that no copy owns (padding) are zeroed from offsets and counts
(those moe_permute returned) when given, else d y is zero-filled first (one more write of it).

Layouts: logits, x, y and grad_out may be row-strided views (last dim contiguous); ids, index,
weights, grad_weights, offsets and counts C-contiguous; results are new C-contiguous arrays. Rows
move as 16-byte vectors where every row of every operand is 16-byte aligned, else element by
element. Launches go on CuPy's current stream of the data's device, or on `stream=`; every check
raises a TypeError / ValueError naming the argument before any launch.
"""
import numpy

from . import _constants, _modules, _rows
from ._launch import (FLOAT_SUFFIXES, NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, sm_count,
                      stream_pointer, wait_for_producer)

FAMILY = "moe"

MAX_EXPERTS = _constants.MOE_MAX_EXPERTS
MAX_K = _constants.MOE_MAX_K
ROUTE_THREADS = _constants.MOE_ROUTE_THREADS
ROWS_THREADS = _constants.MOE_ROWS_THREADS
INDEX_THREADS = _constants.MOE_INDEX_THREADS
SCAN_THREADS = _constants.MOE_SCAN_THREADS
FLAG_SIGMOID, FLAG_NORMALIZE = _constants.MOE_FLAG_SIGMOID, _constants.MOE_FLAG_NORMALIZE
FLAG_IDS_I64, FLAG_VECTORS = _constants.MOE_FLAG_IDS_I64, _constants.MOE_FLAG_VECTORS
SCORES = {"softmax": 0, "sigmoid": FLAG_SIGMOID}
ID_TYPES = {"int32": 4, "<i4": 4, "int64": 8, "<i8": 8}
INT32_TYPES = ("int32", "<i4")
MAX_ROWS = (1 << 31) - 1  # rows are int32
MAX_PAD = 1 << 16

# The family's tables: kernel base name -> argument names; KERNELS exist once per float dtype,
# INDEX_KERNELS once (they move ids and int32 rows, or bytes).
KERNELS = {
    "moe_route": ("logits", "weights", "ids", "counts", "tokens", "experts", "stride", "k", "flags"),
    "moe_route_bwd": ("logits", "ids", "grad_w", "grad_logits", "tokens", "experts", "stride", "k", "flags"),
    "moe_permute": ("x", "entry_of_row", "offsets", "out", "rows", "hidden", "k", "x_stride", "experts", "flags"),
    "moe_unpermute": ("y", "weights", "index", "out", "tokens", "hidden", "k", "y_stride", "y_rows", "flags"),
    "moe_unpermute_bwd": ("dout", "y", "weights", "index", "dy", "dw", "tokens", "hidden", "k", "dout_stride",
                          "y_stride", "y_rows", "flags"),
}
INDEX_KERNELS = {
    "moe_count": ("ids", "block_counts", "n", "experts", "chunk", "flags"),
    "moe_place": ("ids", "block_counts", "offsets", "counts", "index", "entry_of_row", "n", "experts", "chunk",
                  "pad_to", "flags"),
    "moe_pad_zero": ("out", "offsets", "counts", "n", "experts", "rows", "row_bytes", "flags"),
}
KINDS = {"moe_route": "pppp" + "q" * 5, "moe_route_bwd": "pppp" + "q" * 5, "moe_permute": "pppp" + "q" * 6,
         "moe_unpermute": "pppp" + "q" * 6, "moe_unpermute_bwd": "pppppp" + "q" * 7, "moe_count": "pp" + "q" * 4,
         "moe_place": "pppppp" + "q" * 5, "moe_pad_zero": "ppp" + "q" * 5}
# Every entry point of kernels/moe.cu (tests/test_build.py checks the fatbin holds exactly these).
FAMILY_OF = {**{f"{base}_{suffix}": FAMILY for base in KERNELS for suffix in FLOAT_SUFFIXES},
             **{base: FAMILY for base in INDEX_KERNELS}}

# Launch shapes: the index kernels' chunks are at least INDEX_MIN_CHUNK entries and at most
# INDEX_MAX_BLOCKS of them (moe_place's scan reads every block's counts); route takes at most the
# blocks the device holds at once (the occupancy API: _modules.resident_blocks) and walks the tokens
# grid-stride; the row kernels (permute, unpermute and its backward) a grid covering every row once,
# short blocks handed out in order (dev/time_moe_grids.py, H100 bf16: Qwen3 permute 299.9 -> 256.9 us,
# Mixtral 184.3 -> 175.7, unpermute backward 560 -> 545 and 292 -> 284, unpermute level).
INDEX_MIN_CHUNK = 512
INDEX_MAX_BLOCKS = _constants.MOE_INDEX_MAX_BLOCKS
MAX_GRID = (1 << 31) - 1


# ------------------------------------------------------------------------------ launch plans (pure)
def warp_grid(tokens, threads, resident=MAX_GRID):
    """Blocks of a warp-a-token launch: one warp a token, at most `resident` blocks (route: those the
    device holds at once, one wave walking grid-stride; the row kernels: uncapped, a covering grid)."""
    return max(1, min(-(-tokens // (threads // 32)), resident, MAX_GRID))


def index_plan(n, sms=0):
    """(blocks, chunk) of the counting sort over n entries: chunks of whole INDEX_THREADS steps, at
    least INDEX_MIN_CHUNK entries, at most a block an SM (sms > 0: the scan reads every block's counts,
    so more blocks than SMs cost it more than they give the rest; with the scan a one-block kernel of
    its own, H200 Qwen3 permute 198.9 us at 256 blocks, 192.4 at 128; Mixtral 129.6 at 64, 132.2 at 32,
    dev/moe_permute_limits.py) and at most INDEX_MAX_BLOCKS."""
    chunk = max(INDEX_MIN_CHUNK, -(-n // sms) if sms > 0 else 0, -(-n // INDEX_MAX_BLOCKS))
    chunk = -(-chunk // INDEX_THREADS) * INDEX_THREADS
    return max(1, -(-n // chunk)), chunk


def permuted_rows(tokens, k, experts, pad_to):
    """Rows of moe_permute's output: T k, plus E (pad_to - 1) when groups are padded (the most the
    padding can take: every group at most pad_to - 1 rows short of a multiple)."""
    return tokens * k + (experts * (pad_to - 1) if pad_to > 1 else 0)


def row_flags(hidden, itemsize, pointers, strides):
    """FLAG_VECTORS where every row of every operand is 16-byte aligned (rawops/_rows.py's rule)."""
    return FLAG_VECTORS if _rows.vectors(hidden, itemsize, *pointers, strides=strides) else 0


# ------------------------------------------------------------------------------ launches (raw pointers)
def _fn(name, device, code=None):
    return _modules.function_pointer(FAMILY, name if code is None else f"{name}_{FLOAT_SUFFIXES[code]}", device)


def _warp_launch(name, device, code, tokens, threads, stream, args, resident=False):
    """A warp-a-token kernel on warp_grid's grid: one wave of the blocks this device holds at once
    (resident) or a grid covering every token once."""
    function = _fn(name, device, code)
    grid = warp_grid(tokens, threads, _modules.resident_blocks(function, threads, 0, device) if resident else MAX_GRID)
    launch(function, (grid,), threads, 0, stream, args, KINDS[name], device)


def launch_route(device, code, logits, weights, ids, counts, tokens, experts, stride, k, flags, stream):
    """moe_route: counts must be zero (the kernel adds to it). tokens > 0."""
    _warp_launch("moe_route", device, code, tokens, ROUTE_THREADS, stream,
                 (logits, weights, ids, counts, tokens, experts, stride, k, flags), resident=True)


def launch_route_bwd(device, code, logits, ids, grad_w, grad_logits, tokens, experts, stride, k, flags, stream):
    _warp_launch("moe_route_bwd", device, code, tokens, ROUTE_THREADS, stream,
                 (logits, ids, grad_w, grad_logits, tokens, experts, stride, k, flags), resident=True)


def index_scratch_ints(n, experts, sms):
    """int32 scratch of the counting sort on a device of `sms` SMs: every block's E + 1 bucket counts."""
    return index_plan(n, sms)[0] * (experts + 1)


def launch_index(device, ids, i64, scratch, offsets, counts, index, n, experts, pad_to, stream, entry_of_row=0):
    """The counting sort of n > 0 ids: offsets (E + 1), counts (E) and index (n) int32; entry_of_row
    (a pointer, 0: none): each row's entry t k + j written (rows no entry owns left as they are)."""
    blocks, chunk = index_plan(n, sm_count(device))
    flags = FLAG_IDS_I64 if i64 else 0
    launch(_fn("moe_count", device), (blocks,), INDEX_THREADS, 0, stream, (ids, scratch, n, experts, chunk, flags),
           KINDS["moe_count"], device)
    launch(_fn("moe_place", device), (blocks,), INDEX_THREADS, 0, stream,
           (ids, scratch, offsets, counts, index, entry_of_row, n, experts, chunk, pad_to, flags), KINDS["moe_place"],
           device)


def launch_pad_zero(device, out, offsets, counts, n, experts, rows, row_bytes, stream):
    """Zero the rows of out (rows of row_bytes) that no entry owns, per offsets and counts."""
    vec = FLAG_VECTORS if row_bytes % 16 == 0 and out % 16 == 0 else 0
    launch(_fn("moe_pad_zero", device), (max(1, sm_count(device) * 2),), SCAN_THREADS, 0, stream,
           (out, offsets, counts, n, experts, rows, row_bytes, vec), KINDS["moe_pad_zero"], device)


def launch_permute(device, code, itemsize, x, entry_of_row, offsets, out, rows, hidden, k, x_stride, experts,
                   stream):
    """out's rows (a warp each, the groups of offsets interleaved) gathered from x by entry_of_row
    (-1: zeros)."""
    flags = row_flags(hidden, itemsize, (x, out), (x_stride,))
    _warp_launch("moe_permute", device, code, rows, ROWS_THREADS, stream,
                 (x, entry_of_row, offsets, out, rows, hidden, k, x_stride, experts, flags))


def launch_unpermute(device, code, itemsize, y, weights, index, out, tokens, hidden, k, y_stride, y_rows, stream):
    """weights 0: the copies summed."""
    flags = row_flags(hidden, itemsize, (y, out), (y_stride,))
    _warp_launch("moe_unpermute", device, code, tokens, ROWS_THREADS, stream,
                 (y, weights, index, out, tokens, hidden, k, y_stride, y_rows, flags))


def launch_unpermute_bwd(device, code, itemsize, dout, y, weights, index, dy, dw, tokens, hidden, k, dout_stride,
                         y_stride, y_rows, stream):
    flags = row_flags(hidden, itemsize, (dout, y, dy), (dout_stride, y_stride))
    _warp_launch("moe_unpermute_bwd", device, code, tokens, ROWS_THREADS, stream,
                 (dout, y, weights, index, dy, dw, tokens, hidden, k, dout_stride, y_stride, y_rows, flags))


# ------------------------------------------------------------------------------ argument checks
# Pure Python on plain values (the torch adapter runs these inside torch.compile too).
def checked_int(value, name, low, high=None, why=""):
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, (int, numpy.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be {bound}{why}, got {value}")
    return value


def checked_k(k, experts):
    return checked_int(k, "k", 1, min(experts, MAX_K), f" (at most the {experts} experts and MAX_K = {MAX_K})")


def checked_experts(experts, name="num_experts"):
    return checked_int(experts, name, 1, MAX_EXPERTS, f" (MAX_EXPERTS = {MAX_EXPERTS})")


def score_flags(score, normalize):
    """The route kernels' flags for score ('softmax' / 'sigmoid') and normalize (a bool)."""
    if not isinstance(score, str):
        raise TypeError(f"score must be a string, got {type(score).__name__}")
    if score not in SCORES:
        raise ValueError(f"score must be 'softmax' or 'sigmoid', got {score!r}")
    if not isinstance(normalize, (bool, numpy.bool_)):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    return SCORES[score] | (FLAG_NORMALIZE if normalize else 0)


def checked_pad_to(pad_to):
    return checked_int(pad_to, "pad_to", 1, MAX_PAD)


def check_rows_fit(tokens, k, experts, pad_to):
    rows = permuted_rows(tokens, k, experts, pad_to)
    if rows > MAX_ROWS:
        raise ValueError(f"the permuted rows ({tokens} tokens x k = {k}, + padding) number {rows}; rows are int32: "
                         f"at most {MAX_ROWS}")
    return rows


def float_rows(obj, name, like=None, ndim_text="(T, H)"):
    """(array, rows, n, row stride) of a 2-D float array whose rows are row-strided; with like, its dtype."""
    a = as_array(obj, name)
    if like is not None:
        if a.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {a.dtype_text}, expected {like.dtype_text} like {like.name}")
    elif a.dtype < 0 or a.dtype >= len(FLOAT_SUFFIXES):
        raise TypeError(f"{name} has dtype {a.dtype_text}; the moe ops support float32, float16, bfloat16")
    if len(a.shape) != 2:
        raise ValueError(f"{name} has shape {a.shape}; expected 2 dims, {ndim_text}")
    stride = _rows.row_stride(a)
    _rows._aligned(a)
    return a, a.shape[0], a.shape[1], stride


def id_array(obj, name, tokens=None, int32_only=False):
    """(array, is int64, k) of a C-contiguous (T, k) int32 (or int64) array; T checked against tokens."""
    a = as_array(obj, name)
    width = ID_TYPES.get(a.dtype_text)
    if width is None or a.itemsize != width or (int32_only and a.dtype_text not in INT32_TYPES):
        expected = "int32" if int32_only else "int32 or int64"
        raise TypeError(f"{name} has dtype {a.dtype_text}; expected {expected} expert rows / ids")
    if len(a.shape) != 2:
        raise ValueError(f"{name} has shape {a.shape}; expected 2 dims, (T, k): k entries a token")
    if tokens is not None and a.shape[0] != tokens:
        raise ValueError(f"{name} has {a.shape[0]} rows, expected {tokens}: one a token")
    _rows._dense(a)
    return a, width == 8, a.shape[1]


def f32_array(obj, name, shape):
    a = as_array(obj, name)
    if a.dtype_text not in ("float32", "<f4"):
        raise TypeError(f"{name} has dtype {a.dtype_text}; expected float32")
    if a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    _rows._dense(a)
    return a


def int32_vector(obj, name, length):
    a = as_array(obj, name)
    if a.dtype_text not in INT32_TYPES:
        raise TypeError(f"{name} has dtype {a.dtype_text}; expected int32")
    if a.shape != (length,):
        raise ValueError(f"{name} has shape {a.shape}, expected ({length},)")
    _rows._dense(a)
    return a


def check_index_rows(index_k, k_name, k):
    if index_k != k:
        raise ValueError(f"{k_name} has {index_k} columns, expected k = {k}")


# ------------------------------------------------------------------------------ CuPy API
def _begin(stream, first, *others):
    device = _rows.one_device(first, *others)
    return device, stream_pointer(stream, device)


def moe_route(logits, k, score="softmax", normalize=True, *, stream=None):
    """(weights (T, k) float32, ids (T, k) int32, counts (E,) int32) of the router logits (T, E)
    (module docstring)."""
    import cupy

    flags = score_flags(score, normalize)
    x, tokens, experts, stride = float_rows(logits, "logits", ndim_text="(T, E): one row of expert logits a token")
    checked_experts(experts, "logits' experts (its last dim)")
    k = checked_k(k, experts)
    device, s = _begin(stream, x)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(x, s)
        weights = cupy.empty((tokens, k), numpy.float32)
        ids = cupy.empty((tokens, k), numpy.int32)
        counts = cupy.zeros(experts, numpy.int32)
        if tokens:
            launch_route(device, x.dtype, x.ptr, weights.data.ptr, ids.data.ptr, counts.data.ptr, tokens, experts,
                         stride, k, flags, s)
    return weights, ids, counts


def moe_route_backward(logits, ids, grad_weights, score="softmax", normalize=True, *, stream=None):
    """d logits (T, E), logits' dtype, of moe_route's weights given their gradient (T, k) float32."""
    import cupy

    flags = score_flags(score, normalize)
    x, tokens, experts, stride = float_rows(logits, "logits", ndim_text="(T, E): one row of expert logits a token")
    checked_experts(experts, "logits' experts (its last dim)")
    i, _, k = id_array(ids, "ids", tokens, int32_only=True)
    checked_k(k, experts)
    g = f32_array(grad_weights, "grad_weights", (tokens, k))
    device, s = _begin(stream, x, i, g)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (x, i, g):
            wait_for_producer(a, s)
        out = cupy.empty((tokens, experts), NUMPY_DTYPES[x.dtype])
        if tokens:
            launch_route_bwd(device, x.dtype, x.ptr, i.ptr, g.ptr, out.data.ptr, tokens, experts, stride, k, flags, s)
    return out


def moe_permute(x, ids, num_experts, pad_to=1, *, stream=None):
    """(permuted, offsets (E + 1,) int32, counts (E,) int32, index (T, k) int32): x's rows copied to
    their experts' groups (module docstring)."""
    import cupy

    experts = checked_experts(num_experts)
    pad_to = checked_pad_to(pad_to)
    a, tokens, hidden, x_stride = float_rows(x, "x")
    i, i64, k = id_array(ids, "ids", tokens)
    checked_int(k, "ids' k (its columns)", 1, MAX_K, f" (MAX_K = {MAX_K})")
    rows = check_rows_fit(tokens, k, experts, pad_to)
    device, s = _begin(stream, a, i)
    n = tokens * k
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(a, s)
        wait_for_producer(i, s)
        out = cupy.empty((rows, hidden), NUMPY_DTYPES[a.dtype])
        index = cupy.empty((tokens, k), numpy.int32)
        if n == 0:
            return out, cupy.zeros(experts + 1, numpy.int32), cupy.zeros(experts, numpy.int32), index
        offsets = cupy.empty(experts + 1, numpy.int32)
        counts = cupy.empty(experts, numpy.int32)
        scratch = cupy.empty(index_scratch_ints(n, experts, sm_count(device)), numpy.int32)
        # each output row's entry (-1: a padding row, zeroed by the permute)
        entry_of_row = cupy.full(rows, -1, numpy.int32) if pad_to > 1 else cupy.empty(rows, numpy.int32)
        hold_if_capturing(s, scratch, entry_of_row)
        launch_index(device, i.ptr, i64, scratch.data.ptr, offsets.data.ptr, counts.data.ptr, index.data.ptr, n,
                     experts, pad_to, s, entry_of_row.data.ptr if hidden else 0)
        if hidden:
            launch_permute(device, a.dtype, a.itemsize, a.ptr, entry_of_row.data.ptr, offsets.data.ptr, out.data.ptr,
                           rows, hidden, k, x_stride, experts, s)
    return out, offsets, counts, index


def _unpermute_operands(y, weights, index, need_weights):
    b, y_rows, hidden, y_stride = float_rows(y, "y", ndim_text="(N, H): the permuted rows")
    idx, _, k = id_array(index, "index", int32_only=True)
    checked_int(k, "index's k (its columns)", 1, MAX_K, f" (MAX_K = {MAX_K})")
    tokens = idx.shape[0]
    if y_rows < tokens * k:
        raise ValueError(f"y has {y_rows} rows; the index of {tokens} tokens x k = {k} needs at least {tokens * k}")
    w = None
    if weights is not None:
        w = f32_array(weights, "weights", (tokens, k))
    elif need_weights:
        raise TypeError("weights must be a float32 array (T, k), got None")
    return b, y_rows, hidden, y_stride, idx, tokens, k, w


def moe_unpermute(y, weights, index, *, stream=None):
    """out (T, H) = sum_j weights[t, j] y[index[t, j]] (weights None: the plain sum), y's dtype."""
    import cupy

    b, y_rows, hidden, y_stride, idx, tokens, k, w = _unpermute_operands(y, weights, index, False)
    device, s = _begin(stream, b, idx, w)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (b, idx, w):
            if a is not None:
                wait_for_producer(a, s)
        out = cupy.empty((tokens, hidden), NUMPY_DTYPES[b.dtype])
        if tokens and hidden:
            launch_unpermute(device, b.dtype, b.itemsize, b.ptr, w.ptr if w is not None else 0, idx.ptr,
                             out.data.ptr, tokens, hidden, k, y_stride, y_rows, s)
    return out


def moe_permute_backward(grad_permuted, index, *, stream=None):
    """d x (T, H) of moe_permute: each token's k gradient rows summed (moe_unpermute without weights)."""
    return moe_unpermute(grad_permuted, None, index, stream=stream)


def moe_unpermute_backward(grad_out, y, weights, index, offsets=None, counts=None, *, stream=None):
    """(d y (N, H) in y's dtype, d weights (T, k) float32) of moe_unpermute (module docstring)."""
    import cupy

    b, y_rows, hidden, y_stride, idx, tokens, k, w = _unpermute_operands(y, weights, index, True)
    g, g_rows, g_hidden, g_stride = float_rows(grad_out, "grad_out", like=b)
    if (g_rows, g_hidden) != (tokens, hidden):
        raise ValueError(f"grad_out has shape {g.shape}, expected ({tokens}, {hidden}): one row a token of y's width")
    if (offsets is None) != (counts is None):
        raise ValueError("offsets and counts go together (both from moe_permute), or neither")
    off = cnt = None
    if offsets is not None:
        off = as_array(offsets, "offsets")
        experts = off.shape[0] - 1 if len(off.shape) == 1 else -1
        if experts < 1 or experts > MAX_EXPERTS:
            raise ValueError(f"offsets has shape {off.shape}; expected (E + 1,) with 1 <= E <= {MAX_EXPERTS}")
        off = int32_vector(offsets, "offsets", experts + 1)
        cnt = int32_vector(counts, "counts", experts)
    device, s = _begin(stream, b, idx, w, g, off, cnt)
    n = tokens * k
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (b, idx, w, g, off, cnt):
            if a is not None:
                wait_for_producer(a, s)
        padded = y_rows > n
        dtype = NUMPY_DTYPES[b.dtype]
        dy = (cupy.zeros if padded and off is None else cupy.empty)((y_rows, hidden), dtype)
        dw = cupy.empty((tokens, k), numpy.float32)
        if tokens and hidden:
            launch_unpermute_bwd(device, b.dtype, b.itemsize, g.ptr, b.ptr, w.ptr, idx.ptr, dy.data.ptr, dw.data.ptr,
                                 tokens, hidden, k, g_stride, y_stride, y_rows, s)
        elif tokens:
            dw.fill(0)
        if padded and off is not None and hidden:
            launch_pad_zero(device, dy.data.ptr, off.ptr, cnt.ptr, n, off.shape[0] - 1, y_rows, hidden * b.itemsize, s)
    return dy, dw


# ------------------------------------------------------------------------------ grouped GEMM (sm_90)
def moe_grouped_mm(x, weight, offsets, *, transpose=True, stream=None):
    """y (N_rows, out) with each expert's rows y[offsets[e]:offsets[e + 1]] = x[those rows] @ weight[e].T
    (transpose=True: weight (E, out, K), each expert's nn.Linear weight) or @ weight[e] (transpose=False:
    weight (E, K, out)), in one persistent launch of the Hopper GEMM (sm_90; float16 / bfloat16).
    x: moe_permute's rows with pad_to=TILE_M (128: every group a whole number of tiles; other offsets
    give wrong rows, unchecked on the device), C-contiguous (N_rows, K); offsets its (E + 1,) int32.
    Rows past offsets[E] come back zero. Its backward: d x is this call with the other layout on the
    same weight (transpose=not transpose), d weight moe_grouped_mm_backward_weight."""
    import cupy

    from . import _gemm_sm90

    a, rows, k, a_stride = float_rows(x, "x", ndim_text="(N, K): the permuted rows")
    if a.dtype not in (1, 2):
        raise TypeError(f"x has dtype {a.dtype_text}; moe_grouped_mm supports float16 and bfloat16")
    w = as_array(weight, "weight")
    if w.dtype != a.dtype:
        raise TypeError(f"weight has dtype {w.dtype_text}, expected {a.dtype_text} like x")
    if len(w.shape) != 3:
        raise ValueError(f"weight has shape {w.shape}; expected 3 dims, (E, out, K) or (E, K, out)")
    experts = checked_experts(w.shape[0], "weight's experts (its first dim)")
    if (w.shape[2] if transpose else w.shape[1]) != k:
        raise ValueError(f"weight has shape {w.shape}; its K must match x's last dim {k}")
    n = w.shape[1] if transpose else w.shape[2]
    _rows._dense(w)
    if a_stride != k:
        raise ValueError("x must be C-contiguous (its rows read by the copy engine as one matrix)")
    off = int32_vector(offsets, "offsets", experts + 1)
    layout = "nt" if transpose else "nn"
    why = _gemm_sm90.grouped_check(layout, a.dtype, rows, n, k, a.ptr, w.ptr, 0, off.ptr)
    if why is not None:
        raise ValueError(f"moe_grouped_mm: {why}")
    device, s = _begin(stream, a, w, off)
    from ._modules import compute_capability

    if compute_capability(device) != _gemm_sm90.CC or not _gemm_sm90.built(device):
        raise NotImplementedError("moe_grouped_mm runs the Hopper kernel (sm_90) only, for now")
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for t in (a, w, off):
            wait_for_producer(t, s)
        out = cupy.empty((rows, n), NUMPY_DTYPES[a.dtype])  # (CuPy's allocations: 256-byte aligned)
        if rows and n:
            name = _gemm_sm90.grouped_entry_name(layout, a.dtype)
            function = _gemm_sm90.function(name, device)
            _gemm_sm90.launch_grouped(function, sm_count(device), device, layout, a.dtype, a.ptr, w.ptr,
                                      out.data.ptr, off.ptr, experts, rows, n, k, s)
    return out


def moe_grouped_mm_backward_weight(x, grad_y, offsets, *, transpose=True, stream=None):
    """The experts' weight gradients of y = moe_grouped_mm(x, weight, offsets, transpose=...): for each
    expert e over its rows [offsets[e], offsets[e + 1]), grad_y_e^T x_e (transpose=True: (E, out, K), as
    weight) or x_e^T grad_y_e ((E, K, out)), in one persistent launch of the Hopper GEMM (sm_90; float16
    / bfloat16). The gradient's rows (out, or K) must be a multiple of 128; x (N, K) and grad_y (N, out)
    C-contiguous; offsets as moe_grouped_mm's. An expert without rows gets zeros."""
    import cupy

    from . import _gemm_sm90

    a, rows, k, a_stride = float_rows(x, "x", ndim_text="(N, K): the permuted rows")
    if a.dtype not in (1, 2):
        raise TypeError(f"x has dtype {a.dtype_text}; moe_grouped_mm_backward_weight supports float16 and bfloat16")
    g, g_rows, n, g_stride = float_rows(grad_y, "grad_y", like=a, ndim_text="(N, out): d y")
    if g_rows != rows:
        raise ValueError(f"grad_y has {g_rows} rows, expected {rows} like x")
    if a_stride != k or g_stride != n:
        raise ValueError("x and grad_y must be C-contiguous (read by the copy engine as whole matrices)")
    off = as_array(offsets, "offsets")
    if len(off.shape) != 1 or off.shape[0] < 2:
        raise ValueError(f"offsets has shape {off.shape}; expected (E + 1,) with E >= 1")
    experts = checked_experts(off.shape[0] - 1, "offsets' experts (its length - 1)")
    off = int32_vector(offsets, "offsets", experts + 1)
    # dW = A^T B with A, B the operands whose columns are the gradient's rows, columns
    (first, m), (second, cols) = ((g, n), (a, k)) if transpose else ((a, k), (g, n))
    why = _gemm_sm90.grouped_wgrad_check(a.dtype, m, cols, first.ptr, second.ptr, 0, off.ptr)
    if why is not None:
        raise ValueError(f"moe_grouped_mm_backward_weight: {why}")
    device, s = _begin(stream, a, g, off)
    from ._modules import compute_capability

    if compute_capability(device) != _gemm_sm90.CC or not _gemm_sm90.built(device):
        raise NotImplementedError("moe_grouped_mm_backward_weight runs the Hopper kernel (sm_90) only, for now")
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for t in (a, g, off):
            wait_for_producer(t, s)
        out = cupy.empty((experts, m, cols), NUMPY_DTYPES[a.dtype])
        if m and cols:
            function = _gemm_sm90.function(_gemm_sm90.grouped_entry_name("tn", a.dtype), device)
            _gemm_sm90.launch_grouped_wgrad(function, sm_count(device), device, a.dtype, first.ptr, second.ptr,
                                            out.data.ptr, off.ptr, experts, rows, m, cols, s)
    return out
