"""Elementwise ops: gelu, relu, relu_scale, relu_scale_add, bias_gelu, add, and backwards.

All take float32, float16 or bfloat16 arrays (math in float32), of any shape and size
including 0. Output is a new C-contiguous CuPy array unless `out=` is given (in-place with
`out=x` is allowed). Launches go on CuPy's current stream of the data's device, or on
`stream=`. Kernels: kernels/elementwise.cu.

Layouts: every array argument may be any strided view (offsets, steps such as `x[::3]`, a
transposed matrix, a broadcast stride-0 input such as `cupy.broadcast_to(y, x.shape)`, the bias
a view with a step): such calls run the strided kernels on the views as they are, no copy.
out= may be strided too, as long as no two of its elements share memory (a stride of 0 in out
is refused), and it must not partly overlap an input (out=x exactly is in place). Contiguous
calls take the contiguous kernels only. A view whose byte strides are not whole elements is a
ValueError naming it. bias_gelu_backward's out= must have its rows at one stride (dbias is summed
from it); column_sum takes C-contiguous arrays.
"""
from ._launch import (CupyMapEntry, MapKernel, allocating_on, as_array, hold_if_capturing, launch, require_str,
                      resolve_device, sm_count, stream_pointer, wait_for_producer)
from ._launch import FLOAT_SUFFIXES, NUMPY_DTYPES
from . import _constants, _modules, config

FAMILY = "elementwise"

# The family's table: kernel base name -> (argument names, reads b, reads c (row vector)).
# Each base name exists once per dtype in the fatbin: <name>_f32, <name>_f16, <name>_bf16.
KERNELS = {
    "gelu_tanh_fwd": (("x",), False, False),
    "gelu_tanh_bwd": (("dy", "x"), True, False),
    "gelu_erf_fwd": (("x",), False, False),
    "gelu_erf_bwd": (("dy", "x"), True, False),
    "relu_fwd": (("x",), False, False),
    "relu_bwd": (("dy", "x"), True, False),
    "relu_scale_fwd": (("x",), False, False),
    "relu_scale_bwd": (("dy", "x"), True, False),
    "relu_scale_add_fwd": (("x", "y"), True, False),
    "add_fwd": (("a", "b"), True, False),
    "bias_gelu_tanh_fwd": (("x", "bias"), False, True),
    "bias_gelu_tanh_bwd": (("dy", "x", "bias"), True, True),
    "bias_gelu_erf_fwd": (("x", "bias"), False, True),
    "bias_gelu_erf_bwd": (("dy", "x", "bias"), True, True),
}
# Each also exists as <name>_strided_<dtype> (any layout of every operand: MapKernel).
STRIDED = {name: f"{name}_strided" for name in KERNELS}
# Two-stage deterministic column sum (dbias); launched through the generic launcher.
COLUMN_SUM_KERNELS = ("column_sum_part", "column_sum_final")
COLUMN_SUM_THREADS = 256  # column_sum_part: a thread a column, a block of them a chunk of rows
# column_sum_final: a block of FINAL_COLUMNS columns x their chunk groups
FINAL_COLUMNS = _constants.COLUMN_SUM_FINAL_COLUMNS
FINAL_THREADS = FINAL_COLUMNS * _constants.COLUMN_SUM_FINAL_GROUPS
# bias_gelu's backward with the column sums' first stage fused in (dx and dbias in one pass
# over dy and x), by approximate; launched through the generic launcher.
BIAS_BWD_PARTIAL = {"tanh": "bias_gelu_tanh_bwd_partial", "none": "bias_gelu_erf_bwd_partial"}
# The same kernel without a bias: linear_gelu's backward, dpre = dy * gelu'(pre) and its column
# sums (dbias) in one pass.
GELU_BWD_PARTIAL = {"tanh": "gelu_tanh_bwd_partial", "none": "gelu_erf_bwd_partial"}
BIAS_BWD_THREADS = _constants.BIAS_BWD_THREADS
# By itemsize: (vector bytes per thread and row, blocks resident an SM by the launch bounds) of
# kernels/elementwise.cu BiasBwdShape. The grid is one wave of those blocks.
BIAS_BWD_SHAPE = {4: (_constants.BIAS_BWD_F32_BYTES, _constants.BIAS_BWD_F32_BLOCKS),
                  2: (_constants.BIAS_BWD_HALF_BYTES, _constants.BIAS_BWD_HALF_BLOCKS)}
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (the column sums' chunks)
# The same backward from short tiles (kernels/elementwise.cu bias_bwd_tile, faster than the walkers:
# docs/performance.md), wherever the last dim is whole 16-byte vectors and every operand 16-byte
# aligned; the walkers above keep what is only 8-byte aligned.
BIAS_BWD_TILE = {"tanh": "bias_gelu_tanh_bwd_tile", "none": "bias_gelu_erf_bwd_tile"}
GELU_BWD_TILE = {"tanh": "gelu_tanh_bwd_tile", "none": "gelu_erf_bwd_tile"}
# By dtype code: (threads, rows a tile, rows a thread) of kernels/elementwise.cu BiasBwdTile.
BIAS_BWD_TILE_SHAPE = {
    0: (_constants.BIAS_BWD_TILE_F32_THREADS, _constants.BIAS_BWD_TILE_F32_ROWS, _constants.BIAS_BWD_TILE_F32_PER),
    1: (_constants.BIAS_BWD_TILE_F16_THREADS, _constants.BIAS_BWD_TILE_F16_ROWS, _constants.BIAS_BWD_TILE_F16_PER),
    2: (_constants.BIAS_BWD_TILE_BF16_THREADS, _constants.BIAS_BWD_TILE_BF16_ROWS,
        _constants.BIAS_BWD_TILE_BF16_PER)}
# float16's tiles can sum dbias exactly instead (kernels/elementwise.cu bias_bwd_tile's kExact):
# each tile adds its column sums to int64 fixed-point accumulators (every float16 is a whole
# multiple of 2^-24), so no partial rows are written or read again and dbias is the same bits in
# any order. Three launches (zero the accumulators, the tiles, one rounding a column), the last
# two programmatically dependent on sm_90. Up to EXACT_MAX_ROWS rows (each float16 below 2^40 in fixed
# point, the int64 total below 2^63), EXACT_MAX_ROW_TILES tiles of them.
BIAS_BWD_TILE_EXACT = {approximate: f"{name}_exact" for approximate, name in BIAS_BWD_TILE.items()}
GELU_BWD_TILE_EXACT = {approximate: f"{name}_exact" for approximate, name in GELU_BWD_TILE.items()}
FIXED_SUM_KERNELS = ("fixed_sum_zero", "fixed_sum_final_f16")
FIXED_SUM_THREADS = _constants.FIXED_SUM_THREADS  # their blocks (and launch bound)
EXACT_MAX_ROWS = 1 << 23
EXACT_MAX_ROW_TILES = EXACT_MAX_ROWS // BIAS_BWD_TILE_SHAPE[1][1]
# From 2^24 elements: below that the third launch costs more than the partial rows it saves
# (docs/performance.md).
EXACT_MIN_ELEMENTS = 1 << 24
EXACT_WORKSPACE_ROWS = 3  # float32 rows of cols: the int64 sums (two), the Inf / NaN sums (one)
TILES, TILES_EXACT = 0, -1  # the plan's strip for the short tiles (partial rows / exact sums)

# The ops launched in the capped shape on sm_90 (_launch.map_shape), each measured faster so
# (docs/performance.md): the light ones and the erf GELU backward; the erf GELU forward and
# bias_gelu do more math per byte read and measured slower capped.
CAPPED = {"gelu_tanh_fwd", "gelu_tanh_bwd", "gelu_erf_bwd", "relu_fwd", "relu_bwd", "relu_scale_fwd",
          "relu_scale_bwd", "relu_scale_add_fwd", "add_fwd"}

# The heavier forwards' entries of U 16-byte vectors a thread (<name>_x<U>_<dtype>,
# kernels/elementwise.cu), FAST_UNROLL[name] = (U for float32, U for the 16-bit dtypes; 1: none),
# taken on devices with fast memory an SM (_modules.fast_memory): on the H200 one vector a thread
# left too few bytes in flight behind their arithmetic (dev/time_map_shapes.py, of the copy ceiling:
# bf16 / f16 gelu erf 0.891 -> 0.928, bias_gelu tanh 0.900 -> 0.913, its erf form 0.832 -> 0.868;
# f32 gelu erf 0.961 -> 0.977, bias_gelu erf 0.898 -> 0.939; docs/performance.md).
FAST_UNROLL = {"gelu_erf_fwd": (2, 2), "bias_gelu_tanh_fwd": (1, 2), "bias_gelu_erf_fwd": (4, 4)}

MAP = {name: MapKernel(FAMILY, name, names, reads_b, reads_c, name in CAPPED, *FAST_UNROLL.get(name, (1, 1))[::-1])
       for name, (names, reads_b, reads_c) in KERNELS.items()}

GELU_MODES = {"tanh": "tanh", "none": "erf"}


def gelu_mode(approximate):
    require_str(approximate, "approximate")
    mode = GELU_MODES.get(approximate)
    if mode is None:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return mode


def _by_mode(pattern):
    return {approximate: MAP[pattern.format(mode)] for approximate, mode in GELU_MODES.items()}


# Looked up per call: a dict hit is cheaper than formatting the kernel's name.
_GELU_FWD, _GELU_BWD = _by_mode("gelu_{}_fwd"), _by_mode("gelu_{}_bwd")
_BIAS_GELU_FWD, _BIAS_GELU_BWD = _by_mode("bias_gelu_{}_fwd"), _by_mode("bias_gelu_{}_bwd")


def _gelu_kernel(table, approximate):
    try:
        kernel = table.get(approximate)
    except TypeError:  # unhashable: gelu_mode names the argument
        kernel = None
    if kernel is None:
        gelu_mode(approximate)
    return kernel


def _gelu_python(x, approximate="none", *, out=None, stream=None):
    return _gelu_kernel(_GELU_FWD, approximate)(x, out=out, stream=stream)


def _gelu_backward_python(dy, x, approximate="none", *, out=None, stream=None):
    return _gelu_kernel(_GELU_BWD, approximate)(dy, x, out=out, stream=stream)


def _bias_gelu_python(x, bias, approximate="none", *, out=None, stream=None):
    return _gelu_kernel(_BIAS_GELU_FWD, approximate)(x, c=bias, out=out, stream=stream)


# The public functions: bound methods of _launch.CupyMapEntry (C-level callables, documented
# there), which go straight into the kernel's checked launch. An approximate that is not exactly
# the string 'tanh' or 'none' goes to the Python functions above, which name it (or accept a str
# subclass). The plain ops need no fallback: the kernel's call raises their errors.
gelu = CupyMapEntry(dict(_GELU_FWD), _gelu_python).gelu
gelu_backward = CupyMapEntry(dict(_GELU_BWD), _gelu_backward_python).gelu_backward
bias_gelu = CupyMapEntry(dict(_BIAS_GELU_FWD), _bias_gelu_python).bias_gelu
relu = CupyMapEntry({None: MAP["relu_fwd"]}, None).relu
relu_backward = CupyMapEntry({None: MAP["relu_bwd"]}, None).relu_backward
relu_scale = CupyMapEntry({None: MAP["relu_scale_fwd"]}, None).relu_scale
relu_scale_backward = CupyMapEntry({None: MAP["relu_scale_bwd"]}, None).relu_scale_backward
relu_scale_add = CupyMapEntry({None: MAP["relu_scale_add_fwd"]}, None).relu_scale_add
add = CupyMapEntry({None: MAP["add_fwd"]}, None).add


def relu_scale_add_backward(dy, x, alpha, *, out=None, stream=None):
    """(dx, dy_for_y): dx as relu_scale_backward; y's gradient is dy itself (no copy)."""
    return relu_scale_backward(dy, x, alpha, out=out, stream=stream), dy


def bias_gelu_backward(dy, x, bias, approximate="none", *, out=None, stream=None):
    """(dx, dbias): dx = dy * gelu'(x + bias), dbias = dx summed over the leading dims
    (deterministic: the same input gives the same bits). One pass over dy and x when every
    operand is contiguous, the last dim whole vectors and every operand aligned to them
    (bias_gelu_bwd_plan: 16-byte vectors, or 8-byte ones for the half types); otherwise dx (the
    strided kernel for strided operands), then its column sums. dy, x, bias may be any strided
    views; out= any layout whose leading dims collapse to one row stride. Checked once."""
    import cupy

    kernel = _gelu_kernel(_BIAS_GELU_BWD, approximate)
    # dbias is summed from dx where it is written: (row stride, column stride) of out's rows,
    # checked before anything else asks the GPU.
    dx_strides = _out_matrix_strides(out)
    a_dy, a_x, a_bias, a_out, device = kernel.check(dy, x, bias, out)
    cols = a_bias.size
    rows = a_dy.size // cols if cols else 0
    dtype = NUMPY_DTYPES[a_dy.dtype]
    dense = a_dy.contiguous and a_x.contiguous and a_bias.contiguous and (a_out is None or a_out.contiguous)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for operand in (a_dy, a_x, a_bias):
            wait_for_producer(operand, s)
        # out= may be any GPU array (Numba, JAX, torch): only its checked pointer is used.
        dx = a_out.obj if a_out is not None else cupy.empty(a_dy.shape, dtype=dtype)
        dx_ptr = a_out.ptr if a_out is not None else dx.data.ptr
        if rows == 0:
            return dx, cupy.zeros((cols,), dtype=dtype)
        dbias = cupy.empty((cols,), dtype=dtype)
        plan = bias_gelu_bwd_plan(rows, cols, a_dy.dtype, (a_dy.ptr, a_x.ptr, a_bias.ptr, dx_ptr), sm_count(device),
                                  _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM)) if dense else None
        if plan is not None:
            partial = cupy.empty((plan[1], cols), dtype="float32")
            launch_bias_gelu_backward(device, a_dy.dtype, approximate, plan, a_dy.ptr, a_x.ptr, a_bias.ptr,
                                      dx_ptr, partial.data.ptr, dbias.data.ptr, rows, cols, s)
            hold_if_capturing(s, partial)
        else:  # the map kernel (scalar head and tail where misaligned; strided), then dx's column sums
            kernel.launch_arrays(device, a_dy, a_x, a_bias, a_out, dx_ptr, 0.0, s)
            chunks, rows_per_chunk = column_sum_plan(rows, cols, _modules.device_threads(device))
            partial = cupy.empty((chunks, cols), dtype="float32")
            launch_column_sum(device, a_dy.dtype, dx_ptr, partial.data.ptr, dbias.data.ptr, rows, cols, chunks,
                              rows_per_chunk, s, *(dx_strides or (cols, 1)))
            hold_if_capturing(s, partial)
    return dx, dbias


def _out_matrix_strides(out):
    """(row stride, column stride) in elements of a strided out= seen as (rows, last dim); None
    for no out, a C-contiguous one, or one the launcher's checks refuse (they name it)."""
    if out is None:
        return None
    try:
        a = as_array(out, "out")
    except (TypeError, ValueError):
        return None
    if a.contiguous or a.strides is None or not a.shape:
        return None
    shape, strides = a.shape, a.strides
    lead = [(d, s) for d, s in zip(shape[:-1], strides[:-1]) if d != 1]
    for (_, outer), (size, inner) in zip(lead, lead[1:]):
        if outer != inner * size:
            raise ValueError(f"{a.name} has leading dims {shape[:-1]} with strides {strides[:-1]} (elements) that do "
                             "not collapse to one row stride; bias_gelu_backward sums dbias from out's rows: pass an "
                             "out whose rows are at one stride, or none")
    return (lead[-1][1] if lead else shape[-1] * strides[-1]), strides[-1]


def bias_gelu_bwd_plan(rows, cols, dtype, pointers, sms, threads_per_sm=2048):
    """(grid, chunks, threads, strip) of the fused backward in dtype code `dtype`, or None where
    it does not apply (nothing to do, a last dim that is not whole vectors, a pointer off their
    alignment). chunks: the rows of float32 workspace it needs (per column): the partial sums
    it writes for column_sum_final. strip TILES (0) is the short-tile kernel (bias_bwd_tile:
    BIAS_BWD_TILE_SHAPE, 16-byte vectors, whole 64-column tiles; a block a tile, grid = row
    tiles x column tiles, a row tile a chunk); TILES_EXACT (-1) the same tiles for float16 with
    dbias summed exactly in EXACT_WORKSPACE_ROWS rows of accumulators;
    otherwise the walkers (bias_bwd_partial, BIAS_BWD_SHAPE): a block is `strip` column vectors
    x threads / strip rows (`by`), grid (strips, chunks), chunk c taking rows (i * chunks + c) *
    by + ty: at most one wave of the resident blocks (a few blocks of a second wave cost a whole
    block's time), and so few chunks for the final sum to add: those the launch bounds keep
    resident, as far as the device's `threads_per_sm` (cudaDevAttrMaxThreadsPerMultiProcessor)
    hold them."""
    itemsize = 4 if dtype == 0 else 2
    if rows <= 0 or cols <= 0:
        return None
    vector = 16 // itemsize
    threads, tile_rows, per = BIAS_BWD_TILE_SHAPE[dtype]
    tile_cols = threads * per // tile_rows * vector  # whole column tiles only (the kernel has no guard)
    if config.bias_gelu_backward_tiles and cols % tile_cols == 0 and not any(p % 16 for p in pointers):
        chunks = -(-rows // tile_rows)
        blocks = chunks * (cols // tile_cols)
        if blocks <= 0x7FFFFFFF:
            if (dtype == 1 and config.exact_half_dbias and chunks <= EXACT_MAX_ROW_TILES
                    and rows * cols >= EXACT_MIN_ELEMENTS):
                return (blocks,), EXACT_WORKSPACE_ROWS, threads, TILES_EXACT
            return (blocks,), chunks, threads, TILES
    vector_bytes, blocks_per_sm = BIAS_BWD_SHAPE[itemsize]
    blocks_per_sm = max(1, min(blocks_per_sm, threads_per_sm // BIAS_BWD_THREADS))
    vector = vector_bytes // itemsize
    if cols % vector or any(p % vector_bytes for p in pointers):
        return None
    vectors = cols // vector
    strip = min(vectors, BIAS_BWD_THREADS)
    by = BIAS_BWD_THREADS // strip
    strips = -(-vectors // strip)
    chunks = max(1, min(-(-rows // by), MAX_GRID_Y, blocks_per_sm * sms // strips))
    return (strips, chunks), chunks, strip * by, strip


def launch_bias_gelu_backward(device, dtype, approximate, plan, dy_ptr, x_ptr, bias_ptr, dx_ptr, partial_ptr,
                              dbias_ptr, rows, cols, stream):
    """The fused backward (plan: bias_gelu_bwd_plan) on raw pointers checked by the caller: dx,
    plan[1] x cols float32 partial sums, then dbias from them (column_sum_final). bias_ptr 0:
    no bias, dx = dy * gelu'(x) (linear_gelu's dpre) and its column sums."""
    grid, chunks, threads, strip = plan
    suffix = FLOAT_SUFFIXES[dtype]
    args = (dy_ptr, x_ptr, bias_ptr, dx_ptr, partial_ptr, rows, cols)
    if strip == TILES_EXACT:
        _launch_exact_tiles(device, approximate, grid, threads, args, dbias_ptr, stream)
        return
    if strip == TILES:  # the short tiles
        names, kinds = (BIAS_BWD_TILE if bias_ptr else GELU_BWD_TILE), "pppppqq"
    else:  # the walkers take their strip width too
        names, kinds, args = (BIAS_BWD_PARTIAL if bias_ptr else GELU_BWD_PARTIAL), "pppppqqq", args + (strip,)
    fused = _modules.function_pointer(FAMILY, f"{names[approximate]}_{suffix}", device)
    launch(fused, grid, threads, 0, stream, args, kinds, device)
    _launch_column_sum_final(device, suffix, partial_ptr, dbias_ptr, chunks, cols, stream)


def _launch_exact_tiles(device, approximate, grid, threads, args, dbias_ptr, stream):
    """float16's tiles with dbias summed exactly: zero the accumulators (args[4], the workspace),
    the tiles (waiting for the zeroing only before their adds), then dbias rounded from them."""
    workspace, cols = args[4], args[6]
    dependent = _modules.compute_capability(device) >= 90
    words = EXACT_WORKSPACE_ROWS * cols
    zero = _modules.function_pointer(FAMILY, FIXED_SUM_KERNELS[0], device)
    launch(zero, (-(-words // FIXED_SUM_THREADS),), FIXED_SUM_THREADS, 0, stream, (workspace, words), "pq", device)
    names = BIAS_BWD_TILE_EXACT if args[2] else GELU_BWD_TILE_EXACT
    tiles = _modules.function_pointer(FAMILY, f"{names[approximate]}_f16", device)
    launch(tiles, grid, threads, 0, stream, args, "pppppqq", device, dependent)
    final = _modules.function_pointer(FAMILY, FIXED_SUM_KERNELS[1], device)
    launch(final, (-(-cols // FIXED_SUM_THREADS),), FIXED_SUM_THREADS, 0, stream, (workspace, dbias_ptr, cols), "ppq",
           device, dependent)


def column_sum_plan(rows, cols, device_threads):
    """(chunks, rows_per_chunk): enough (chunk, column) threads to fill the GPU (`device_threads`
    at once: rawops._modules.device_threads); chunks is column_sum_part's grid.y, so at most
    MAX_GRID_Y (a few columns over many rows reached it)."""
    chunks = max(1, min(rows, device_threads // max(cols, 1), MAX_GRID_Y))
    rows_per_chunk = (rows + chunks - 1) // chunks
    return (rows + rows_per_chunk - 1) // rows_per_chunk, rows_per_chunk


def launch_column_sum(device, dtype, x_ptr, partial_ptr, out_ptr, rows, cols, chunks, rows_per_chunk, stream,
                      row_stride=None, col_stride=1):
    """Both column-sum stages on raw pointers; partial holds chunks x cols float32. Element (r,
    c) of x is at r * row_stride + c * col_stride elements (row_stride None: cols, dense rows)."""
    suffix = FLOAT_SUFFIXES[dtype]
    part = _modules.function_pointer(FAMILY, f"column_sum_part_{suffix}", device)
    launch(part, (-(-cols // COLUMN_SUM_THREADS), chunks), COLUMN_SUM_THREADS, 0, stream,
           (x_ptr, partial_ptr, rows, cols, rows_per_chunk, cols if row_stride is None else row_stride, col_stride),
           "ppqqqqq", device)
    _launch_column_sum_final(device, suffix, partial_ptr, out_ptr, chunks, cols, stream)


# column_sum_final waits for the kernel before it (kernels/include/rawops/dependent_launch.cuh), so on
# sm_90+ it is launched programmatically dependent (config.dependent_launch): its launch overlaps
# that kernel's end.


def _launch_column_sum_final(device, suffix, partial_ptr, out_ptr, chunks, cols, stream):
    final = _modules.function_pointer(FAMILY, f"column_sum_final_{suffix}", device)
    launch(final, (-(-cols // FINAL_COLUMNS),), FINAL_THREADS, 0, stream, (partial_ptr, out_ptr, chunks, cols),
           "ppqq", device, config.dependent_launch and _modules.compute_capability(device) >= 90)


def column_sum(x, *, stream=None):
    """Sum of a (..., cols) array over its leading dims, in float32, returned as x's dtype.

    Two launches and no atomics: partial sums over chunks of rows, then the chunks in
    order, so results are bitwise reproducible.
    """
    import cupy

    a = as_array(x, "x")
    if a.dtype < 0 or a.dtype >= len(FLOAT_SUFFIXES):
        raise TypeError(f"x has dtype {a.dtype_text}; column_sum supports float32, float16, bfloat16")
    if not a.contiguous or len(a.shape) == 0:
        raise ValueError("x must be a C-contiguous array with at least one dimension")
    if a.ptr % a.itemsize:
        raise ValueError(f"x is misaligned: address 0x{a.ptr:x} is not a multiple of its {a.itemsize}-byte element")
    cols = a.shape[-1]
    rows = a.size // cols if cols else 0
    device = resolve_device(a)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(a, s)
        if rows == 0 or cols == 0:
            return cupy.zeros((cols,), dtype=NUMPY_DTYPES[a.dtype])
        result = cupy.empty((cols,), dtype=NUMPY_DTYPES[a.dtype])
        chunks, rows_per_chunk = column_sum_plan(rows, cols, _modules.device_threads(device))
        partial = cupy.empty((chunks, cols), dtype="float32")
        launch_column_sum(device, a.dtype, a.ptr, partial.data.ptr, result.data.ptr, rows, cols, chunks,
                          rows_per_chunk, s)
        hold_if_capturing(s, partial)
    return result
