"""Normalisation ops over the last dim: layer_norm, rms_norm and add_rms_norm, forward and backward.

float32, float16 or bfloat16 arrays of any shape with at least one dimension (leading dims
are rows), any row width, any number of rows including 0; math in float32. weight/bias are
optional, of shape (x.shape[-1],) and x's dtype. The forward also returns the per-row
float32 statistics the backward needs. Kernels: kernels/norm.cu.

Layouts: x, dy and out= may be views whose last dim is contiguous and whose leading dims
collapse to one row stride (`x[:, :n]` of a wider matrix, `x[::2]`, a broadcast of one row):
launched as they are, no copy; the 16-byte path is kept wherever every row starts 16-byte
aligned. Any other layout (a transpose, a step in the last dim) is a ValueError naming the
argument. weight, bias, mean and rstd must be contiguous; y and dx are new contiguous arrays
(y: out= when given).

add_rms_norm(x, residual, weight, eps) -> (y, new_residual): a transformer block's residual add and
its next norm in one pass: new_residual = x + residual (rounded to x's dtype, as torch's add), y =
rms_norm(new_residual, weight, eps). Its backward takes the gradients of both outputs, dy and
d_new_residual (None: 0), and returns dx, the gradient of x and of residual alike (one array: the
same gradient reaches both operands of an add), and dweight. residual, residual_out= and
d_new_residual may be row-strided views like x.
"""
from ._launch import (NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, real_scalar, sm_count,
                      stream_pointer, wait_for_producer)
from . import _constants, _modules, _rows, config

FAMILY = "norm"

# The family's table: kernel base name -> argument names. Each exists once per dtype in the
# fatbin (<name>_f32, _f16, _bf16); the launch kinds are those of launch_forward/_backward.
_FWD_ARGS = ("x", "weight", "bias", "y", "mean", "rstd", "rows", "n", "x_stride", "y_stride", "mode", "vec", "eps")
_BWD_ARGS = ("dy", "x", "weight", "mean", "rstd", "dx", "partial_dw", "partial_db", "rows", "n", "dy_stride",
             "x_stride", "dx_stride", "mode", "vec")
_ADD_FWD_ARGS = ("x", "residual", "weight", "y", "residual_out", "rstd", "rows", "n", "x_stride", "residual_stride",
                 "y_stride", "residual_out_stride", "mode", "vec", "eps")
_ADD_BWD_ARGS = ("dy", "h", "weight", "rstd", "d_residual_out", "dx", "partial_dw", "rows", "n", "dy_stride",
                 "h_stride", "d_residual_out_stride", "dx_stride", "mode", "vec")
KERNELS = {
    "add_rms_norm_fwd": _ADD_FWD_ARGS,
    "add_rms_norm_bwd": _ADD_BWD_ARGS,
    "layer_norm_fwd": _FWD_ARGS,
    "layer_norm_bwd": _BWD_ARGS,
    "layer_norm_bwd_full": _BWD_ARGS,  # 16-bit rows that fill the block (full_rows): f16, bf16 only
    "rms_norm_fwd": _FWD_ARGS,
    "rms_norm_bwd": _BWD_ARGS,
    # Second stage of dweight/dbias: the per-block partial rows summed in a fixed order.
    "norm_param_grad": ("partial_dw", "partial_db", "dweight", "dbias", "chunks", "n"),
}
SUFFIXES_OF = {"layer_norm_bwd_full": ("f16", "bf16")}  # entries not built for every dtype
ENTRY_POINTS = sorted(f"{base}_{suffix}" for base in KERNELS
                      for suffix in SUFFIXES_OF.get(base, ("f32", "f16", "bf16")))
FWD_KINDS = "ppppppqqqqqqf"
BWD_KINDS = "ppppppppqqqqqqq"
PARAM_GRAD_KINDS = "ppppqq"
ADD_FWD_KINDS = "ppppppqqqqqqqqf"
ADD_BWD_KINDS = "pppppppqqqqqqqq"
PARAM_GRAD_COLUMNS = _constants.NORM_PARAM_GRAD_COLUMNS  # columns per block of norm_param_grad
PARAM_GRAD_THREADS = PARAM_GRAD_COLUMNS * _constants.NORM_PARAM_GRAD_LANES  # x lanes over the partial rows
FLAG_VECTORS, FLAG_WEIGHT, FLAG_BIAS = (_constants.NORM_FLAG_VECTORS, _constants.NORM_FLAG_WEIGHT,
                                        _constants.NORM_FLAG_BIAS)
FLAG_ADD = _constants.NORM_FLAG_ADD
STAGES_SHIFT = _constants.NORM_STAGES_SHIFT
# The backward's bulk path (kernels/norm.cu): on sm_90, in block mode, each block's next rows are
# copied into shared-memory stages by the bulk copy engine while it computes the current one,
# wherever those stages cost no occupancy. STAGES[op]: rows in flight ahead (0: the register path),
# as (on most devices, for 16-bit rows on a device with fast memory: _modules.fast_memory, 30 GB/s an
# SM or more): the faster memory needs more bytes in flight for the same latency. Measured
# (dev/norm_bwd_limits.py, 16384 x 4096, of the copy ceiling): rms_norm bf16/f16 on the H100 SXM (25
# GB/s an SM) 1 stage 0.893, 2 stages 0.831; on the H200 (37 GB/s an SM) 1 stage 0.801-0.806, 2
# stages 0.874-0.880; add_rms_norm 1 stage best on both (H200 0.903-0.907 against 0.877-0.889);
# float32 rows 1 stage (H200: 0.922 against 2 stages' 0.887). Module-level so dev scripts can compare.
STAGES = {"rms_norm": (1, 2), "add_rms_norm": (1, 1)}  # layer_norm's kernel has no bulk path
compute_capability = _modules.compute_capability  # module-level: tests replace these here
fast_memory = _modules.fast_memory

# eps=None (torch.nn.RMSNorm's default): the storage dtype's machine epsilon, as torch.
MACHINE_EPS = (2.0 ** -23, 2.0 ** -10, 2.0 ** -7)


# ------------------------------------------------------------------------------ launches on raw pointers
def forward_plan(rows, n, itemsize, aligned):
    return _rows.row_plan(rows, n, _rows.FWD_BYTES // itemsize, itemsize, aligned)


# The backward kernels' launch bounds (kernels/norm.cu: ROW_MIN_BLOCKS blocks of ROW_MAX_THREADS)
# guarantee this many of their threads an SM; the occupancy API refines it at launch.
BWD_THREADS_PER_SM = _constants.ROW_MIN_BLOCKS * _constants.ROW_MAX_THREADS


def backward_plan(rows, n, itemsize, sms, dy, x, weight, dx, strides=(), extra=()):
    """(mode, blocks, threads, chunks, aligned) for pointers dy, x, weight (0: none), dx and the
    row strides of dy, x, dx (`strides`; default dense rows): the grid fills each SM once
    (each block or warp accumulates dw/db over its rows); chunks is the number of partial rows
    of dweight / dbias. extra: (pointer, row stride) of further row operands (add_rms_norm's
    d_new_residual), which the 16-byte path needs aligned too."""
    if extra:
        aligned = _rows.vectors(n, itemsize, dy, x, weight, dx, *(p for p, _ in extra),
                                strides=tuple(strides) + tuple(st for p, st in extra if p))
    else:
        aligned = _rows.vectors(n, itemsize, dy, x, weight, dx, strides=strides)
    key = (rows, n, itemsize, sms, aligned)
    plan = _backward_plans.get(key)  # the rest depends on these alone: every autograd backward asks
    if plan is None:
        if len(_backward_plans) >= 4096:  # many batch sizes: start over rather than grow
            _backward_plans.clear()
        mode, blocks, threads = _rows.row_plan(rows, n, _rows.BWD_BYTES // itemsize, itemsize, aligned)
        blocks = min(blocks, _rows.resident_blocks(sms, threads, BWD_THREADS_PER_SM))
        plan = _backward_plans[key] = (mode, blocks, threads, _rows.chunks(mode, blocks, threads), aligned)
    return plan


_backward_plans = {}  # backward_plan's answers by (rows, n, itemsize, sms, aligned)


def column_smem(mode, threads, itemsize, partials, n=0, weight=False):
    """Dynamic shared memory of a backward launch: in the register modes each thread keeps a
    float32 running sum per column it holds for each of `partials` (dweight, dbias) wanted, and the
    block a copy of the weight (n elements) when there is one."""
    if mode == _rows.STREAM_ROW:
        return 0
    return partials * threads * (_rows.BWD_BYTES // itemsize) * 4 + (n * itemsize if weight else 0)


def bulk_stages(op, name, device, mode, threads, smem, n, itemsize, operands):
    """(stages, dynamic shared memory) of a backward launch: STAGES[op] rows of `operands` rows of n
    each after the partials, or (0, smem) where the bulk path does not apply: off Hopper (sm_90, where
    it was measured; sm_120 compiles cp.async.bulk to a toolkit call), outside block mode, or where
    the stages would leave fewer blocks an SM than registers and partials do."""
    if op not in STAGES or mode != _rows.BLOCK_PER_ROW or not 90 <= compute_capability(device) < 100:
        return 0, smem
    stages = min(stage_count(op, itemsize, device), _constants.ROW_BWD_MAX_STAGES)
    if not stages:
        return 0, smem
    key = (name, device, threads, smem, n, itemsize, operands, stages)
    plan = _bulk_plans.get(key)  # every launch asks: the occupancy queries once a shape
    if plan is None:
        total = smem + stages * operands * n * itemsize
        fits = _allow_smem(name, device, total) and resident(name, device, threads, total) >= resident(
            name, device, threads, smem)
        plan = _bulk_plans[key] = (stages, total) if fits else (0, smem)
    return plan


_bulk_plans = {}  # bulk_stages' answers


def stage_count(op, itemsize, device):
    """The bulk path's rows in flight for op's rows of itemsize bytes on device (STAGES)."""
    usual, fast = STAGES[op]
    return fast if itemsize == 2 and fast_memory(device) else usual


def _allow_smem(name, device, smem):
    """Whether kernel `name` may take `smem` bytes of dynamic shared memory on `device`
    (16-bit rows of 4097 to 8192: 64 KB; more than sm_75's 64 KB a block once its reduction
    storage is added)."""
    return _modules.allow_dynamic_shared(FAMILY, name, device, smem)


def resident(name, device, threads, smem):
    """Blocks of kernel `name` that `device` runs at once (rawops._modules.resident: the
    occupancy API, per SM, times the SMs); at least one per SM."""
    return _modules.resident(FAMILY, name, device, threads, smem)


_forward_configs = {}  # forward_config's answers


def forward_config(op, device, dtype, itemsize, rows, n, aligned, flags):
    """(kernel, mode, blocks, threads) of a forward launch; all but the grid cached by the row width,
    type and flags (never by the row count: a model's varying batch sizes would grow the cache):
    launchers ask on every call (the autograd path's host time is what a 16-bit row's kernels are
    short of)."""
    key = (op, device, dtype, n, aligned, flags)
    cached = _forward_configs.get(key)
    if cached is None:
        mode, _, threads = forward_plan(1, n, itemsize, aligned)
        cached = _forward_configs[key] = (_modules.function_pointer(FAMILY, _rows.kernel_name(f"{op}_fwd", dtype),
                                                                    device), mode, threads)
    function, mode, threads = cached
    return function, mode, _rows.row_blocks(rows, mode), threads


def launch_forward(op, device, dtype, itemsize, x, weight, bias, y, mean, rstd, rows, n, eps, stream, x_stride=None,
                   y_stride=None):
    """One forward launch (op: 'layer_norm' or 'rms_norm'); pointers checked by the caller,
    0 for an absent weight / bias / mean; x_stride / y_stride: the row strides of x and y in
    elements (None: n, dense rows). rows > 0 and n > 0."""
    x_stride = n if x_stride is None else x_stride
    y_stride = n if y_stride is None else y_stride
    aligned = _rows.vectors(n, itemsize, x, weight, bias, y, strides=(x_stride, y_stride))
    # Flags, not null pointers, say what is absent (see the note in kernels/norm.cu).
    flags = (FLAG_VECTORS if aligned else 0) | (FLAG_WEIGHT if weight else 0) | (FLAG_BIAS if bias else 0)
    function, mode, blocks, threads = forward_config(op, device, dtype, itemsize, rows, n, aligned, flags)
    launch(function, (blocks,), threads, 0, stream,
           (x, weight or x, bias or x, y, mean, rstd, rows, n, x_stride, y_stride, mode, flags, eps), FWD_KINDS, device)


_backward_configs = {}  # backward_config's answers


def full_rows(op, itemsize, mode, threads, n, aligned, stages):
    """Whether a backward launch takes layer_norm_bwd_full_<dtype> (kernels/norm.cu): 16-bit
    layer_norm rows in block mode that fill every thread's vectors (n = threads x
    ROW_BWD_VECTORS x 16 bytes: 2048, 4096, 8192 at 128, 256, 512 threads), 16-byte aligned,
    a multiple of 4 warps, no bulk stages. The same work an element, less a row: its row pointers
    advance by the grid's step and its row sums take one barrier (docs/performance.md)."""
    return (op == "layer_norm" and itemsize == 2 and mode == _rows.BLOCK_PER_ROW and not stages and aligned
            and threads % 128 == 0 and n == threads * _constants.ROW_BWD_VECTORS * (16 // itemsize))


def backward_config(op, device, dtype, itemsize, plan, n, has_weight, partials):
    """(kernel, mode, blocks, threads, dynamic shared bytes, chunks, stage flags) of a backward launch
    of plan = backward_plan(...) with `partials` (0-2: dweight, dbias) wanted: the shared memory of its
    partials, the bulk stages, and the grid the occupancy API says the device holds at once (at most
    the plan's), whose partial rows (`chunks`, fewer) are the ones summed. All but the grid cached by
    the plan's mode and block, the row width and what is wanted (never by the row count)."""
    mode, blocks, threads, _, aligned = plan
    full_allowed = config.norm_full_rows
    if full_allowed is None:  # the device's choice: bench_norm's entries table, H100 and H200
        full_allowed = fast_memory(device)
    key = (op, device, dtype, mode, threads, n, has_weight, partials, aligned, full_allowed)
    cached = _backward_configs.get(key)
    if cached is None:
        name = _rows.kernel_name(f"{op}_bwd", dtype)
        smem = column_smem(mode, threads, itemsize, partials, n, has_weight)
        run_mode = mode
        if not _allow_smem(name, device, smem):
            # The streaming mode keeps its partials in the global rows instead (one block per
            # chunk either way: the same partial buffers serve).
            run_mode, smem = _rows.STREAM_ROW, 0
        stages, smem = bulk_stages(op, name, device, run_mode, threads, smem, n, itemsize, 2)
        if full_allowed and full_rows(op, itemsize, run_mode, threads, n, aligned, stages):
            full = _rows.kernel_name("layer_norm_bwd_full", dtype)
            if _allow_smem(full, device, smem):
                name = full
        cached = _backward_configs[key] = (_modules.function_pointer(FAMILY, name, device), run_mode, threads, smem,
                                           resident(name, device, threads, smem), stages << STAGES_SHIFT)
    function, run_mode, threads, smem, held, stage_flags = cached
    blocks = min(blocks, held)
    return function, run_mode, blocks, threads, smem, _rows.chunks(run_mode, blocks, threads), stage_flags


def launch_backward(op, device, dtype, itemsize, dy, x, weight, mean, rstd, dx, partial_dw, partial_db, dweight,
                    dbias, rows, n, plan, stream, strides=None, launch_config=None):
    """dx, and dweight / dbias (0: not wanted) through partial buffers of plan[3] x n float32
    each (0 where not wanted; backward_config's chunks x n suffice), plan = backward_plan(...) of
    the same pointers and strides; strides: the row strides of dy, x and dx in elements (None: n
    each, dense rows); launch_config: backward_config's answer for them where the caller has it.
    rows > 0, n > 0."""
    dy_stride, x_stride, dx_stride = strides if strides is not None else (n, n, n)
    function, mode, blocks, threads, smem, chunks, stage_flags = launch_config or backward_config(
        op, device, dtype, itemsize, plan, n, bool(weight), bool(partial_dw) + bool(partial_db))
    flags = (FLAG_VECTORS if plan[4] else 0) | (FLAG_WEIGHT if weight else 0) | stage_flags
    launch(function, (blocks,), threads, smem, stream,
           (dy, x, weight or x, mean, rstd, dx, partial_dw, partial_db, rows, n, dy_stride, x_stride, dx_stride, mode,
            flags), BWD_KINDS, device)
    if dweight or dbias:
        launch(_modules.function_pointer(FAMILY, _rows.kernel_name("norm_param_grad", dtype), device),
               (-(-n // PARAM_GRAD_COLUMNS), 2), PARAM_GRAD_THREADS, 0, stream,
               (partial_dw, partial_db, dweight, dbias, chunks, n), PARAM_GRAD_KINDS, device)


def launch_add_forward(device, dtype, itemsize, x, residual, weight, y, residual_out, rstd, rows, n, eps, stream,
                       strides=None):
    """add_rms_norm's forward on pointers checked by the caller (weight 0: none); strides: the row
    strides of x, residual, y, residual_out in elements (None: n each). rows > 0 and n > 0."""
    strides = (n, n, n, n) if strides is None else tuple(strides)
    aligned = _rows.vectors(n, itemsize, x, residual, weight, y, residual_out, strides=strides)
    mode, blocks, threads = forward_plan(rows, n, itemsize, aligned)
    flags = (FLAG_VECTORS if aligned else 0) | (FLAG_WEIGHT if weight else 0)
    launch(_modules.function_pointer(FAMILY, _rows.kernel_name("add_rms_norm_fwd", dtype), device), (blocks,),
           threads, 0, stream, (x, residual, weight or x, y, residual_out, rstd, rows, n, *strides, mode, flags, eps),
           ADD_FWD_KINDS, device)


def launch_add_backward(device, dtype, itemsize, dy, h, weight, rstd, d_residual_out, dx, partial_dw, dweight, rows,
                        n, plan, stream, strides=None):
    """add_rms_norm's backward: dx = rms_norm's dx at h (the forward's new residual) + d_residual_out
    (0: none), and dweight (0: not wanted) through plan[3] x n float32 partial rows; plan =
    backward_plan(...) of dy, h, weight, dx with extra=((d_residual_out, its stride),); strides: the
    row strides of dy, h, d_residual_out, dx (None: n each). rows > 0, n > 0."""
    dy_stride, h_stride, dr_stride, dx_stride = strides if strides is not None else (n, n, n, n)
    mode, blocks, threads, chunks, aligned = plan
    name = _rows.kernel_name("add_rms_norm_bwd", dtype)
    smem = column_smem(mode, threads, itemsize, bool(partial_dw), n, bool(weight))
    if not _allow_smem(name, device, smem):
        mode, smem = _rows.STREAM_ROW, 0
    stages, smem = bulk_stages("add_rms_norm", name, device, mode, threads, smem, n, itemsize,
                               3 if d_residual_out else 2)
    blocks = min(blocks, resident(name, device, threads, smem))
    chunks = _rows.chunks(mode, blocks, threads)
    flags = ((FLAG_VECTORS if aligned else 0) | (FLAG_WEIGHT if weight else 0) | (FLAG_ADD if d_residual_out else 0)
             | (stages << STAGES_SHIFT))
    launch(_modules.function_pointer(FAMILY, name, device), (blocks,), threads, smem, stream,
           (dy, h, weight or h, rstd, d_residual_out or dy, dx, partial_dw, rows, n, dy_stride, h_stride, dr_stride,
            dx_stride, mode, flags), ADD_BWD_KINDS, device)
    if dweight:
        launch(_modules.function_pointer(FAMILY, _rows.kernel_name("norm_param_grad", dtype), device),
               (-(-n // PARAM_GRAD_COLUMNS), 2), PARAM_GRAD_THREADS, 0, stream,
               (partial_dw, 0, dweight, 0, chunks, n), PARAM_GRAD_KINDS, device)


# ------------------------------------------------------------------------------ CuPy API
def _rows_of(a):
    n = a.shape[-1]
    return (a.size // n if n else 0), n


def check_eps(eps, code):
    """eps as a float: None is the dtype's machine epsilon (torch's rms_norm default); it must
    be a real number >= 0 (a negative one turns rows of small variance into NaN)."""
    if eps is None:
        return MACHINE_EPS[code]
    value = real_scalar(eps, "eps")
    if not value >= 0.0:
        raise ValueError(f"eps must be >= 0, got {value}")
    return value


def _forward(op, x, weight, bias, eps, out, stream):
    import cupy

    X = _rows.rows_array(x, "x", op)
    W = _rows.vector_array(weight, "weight", X) if weight is not None else None
    B = _rows.vector_array(bias, "bias", X) if bias is not None else None
    O = _rows.out_array(out, X, (W, B)) if out is not None else None
    eps = check_eps(eps, X.dtype)
    device = _rows.one_device(X, W, B, O)
    rows, n = _rows_of(X)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (X, W, B):
            if a is not None:
                wait_for_producer(a, s)
        y = O.obj if O is not None else cupy.ndarray(X.shape, NUMPY_DTYPES[X.dtype])
        stats_shape = X.shape[:-1]
        mean = cupy.ndarray(stats_shape, cupy.float32) if op == "layer_norm" else None
        rstd = cupy.ndarray(stats_shape, cupy.float32)
        if rows and n:
            launch_forward(op, device, X.dtype, X.itemsize, X.ptr, W.ptr if W else 0, B.ptr if B else 0,
                           O.ptr if O is not None else y.data.ptr, mean.data.ptr if mean is not None else 0,
                           rstd.data.ptr, rows, n, eps, s, _rows.row_stride(X),
                           _rows.row_stride(O) if O is not None else n)
        elif rows:  # rows of width 0: statistics of nothing, as torch gives them
            if mean is not None:
                mean.fill(float("nan"))
            rstd.fill(float("nan"))
    return y, mean, rstd


def _backward(op, dy, x, weight, mean, rstd, want_dbias, stream):
    import cupy

    X = _rows.rows_array(x, "x", op)
    DY = _rows.rows_array(dy, "dy", op, like=X)
    W = _rows.vector_array(weight, "weight", X) if weight is not None else None
    M = _rows.stats_array(mean, "mean", X) if op == "layer_norm" else None
    R = _rows.stats_array(rstd, "rstd", X)
    device = _rows.one_device(X, DY, W, M, R)
    rows, n = _rows_of(X)
    dtype = NUMPY_DTYPES[X.dtype]
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (DY, X, W, M, R):
            if a is not None:
                wait_for_producer(a, s)
        dx = cupy.ndarray(X.shape, dtype)
        dweight = cupy.zeros((n,), dtype) if W is not None else None
        dbias = cupy.zeros((n,), dtype) if want_dbias else None
        if rows and n:
            strides = (_rows.row_stride(DY), _rows.row_stride(X), n)
            plan = backward_plan(rows, n, X.itemsize, sm_count(device), DY.ptr, X.ptr, W.ptr if W else 0,
                                 dx.data.ptr, strides)
            partial_dw = cupy.ndarray((plan[3], n), cupy.float32) if dweight is not None else None
            partial_db = cupy.ndarray((plan[3], n), cupy.float32) if dbias is not None else None
            launch_backward(op, device, X.dtype, X.itemsize, DY.ptr, X.ptr, W.ptr if W else 0,
                            M.ptr if M else 0, R.ptr, dx.data.ptr,
                            partial_dw.data.ptr if partial_dw is not None else 0,
                            partial_db.data.ptr if partial_db is not None else 0,
                            dweight.data.ptr if dweight is not None else 0,
                            dbias.data.ptr if dbias is not None else 0, rows, n, plan, s, strides)
            hold_if_capturing(s, partial_dw, partial_db)
    return dx, dweight, dbias


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, *, out=None, stream=None):
    """(y, mean, rstd): y = (x - mean) * rstd * weight + bias over the last dim, with
    rstd = 1 / sqrt(biased variance + eps); mean and rstd float32 of shape x.shape[:-1].
    x and out= may be row-strided views (the module docstring)."""
    return _forward("layer_norm", x, weight, bias, eps, out, stream)


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, out=None, stream=None):
    """torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps); x and out= may be
    row-strided views (the module docstring)."""
    return _forward("layer_norm", x, weight, bias, eps, out, stream)[0]


def layer_norm_backward(dy, x, weight, mean, rstd, *, stream=None):
    """(dx, dweight, dbias) from the forward's mean and rstd; dweight is None without
    weight. dweight and dbias are summed over rows deterministically (same bits every run).
    dy and x may be row-strided views (dy broadcast over the rows included)."""
    return _backward("layer_norm", dy, x, weight, mean, rstd, True, stream)


def rms_norm_forward(x, weight=None, eps=None, *, out=None, stream=None):
    """(y, rstd): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), float32 of shape
    x.shape[:-1]. x and out= may be row-strided views (the module docstring)."""
    y, _, rstd = _forward("rms_norm", x, weight, None, eps, out, stream)
    return y, rstd


def rms_norm(x, weight=None, eps=None, *, out=None, stream=None):
    """torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps); eps=None is x's
    dtype's machine epsilon, as in torch. x and out= may be row-strided views."""
    return _forward("rms_norm", x, weight, None, eps, out, stream)[0]


def rms_norm_backward(dy, x, weight, rstd, *, stream=None):
    """(dx, dweight) from the forward's rstd; dweight is None without weight. dy and x may be
    row-strided views."""
    dx, dweight, _ = _backward("rms_norm", dy, x, weight, None, rstd, False, stream)
    return dx, dweight


def add_rms_norm_forward(x, residual, weight=None, eps=None, *, out=None, residual_out=None, stream=None):
    """(y, new_residual, rstd): new_residual = x + residual (x's dtype), y = rms_norm(new_residual,
    weight, eps), rstd float32 of shape x.shape[:-1]. out= (y) and residual_out= may be row-strided
    views; residual_out may be exactly x or residual (in place: the block's residual stream updated
    where it lies)."""
    import cupy

    X = _rows.rows_array(x, "x", "add_rms_norm")
    R = _rows.rows_array(residual, "residual", "add_rms_norm", like=X)
    W = _rows.vector_array(weight, "weight", X) if weight is not None else None
    RO = _residual_out(residual_out, X, R, W) if residual_out is not None else None
    O = _rows.out_array(out, X, (R, W, RO)) if out is not None else None
    eps = check_eps(eps, X.dtype)
    device = _rows.one_device(X, R, W, RO, O)
    rows, n = _rows_of(X)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (X, R, W):
            if a is not None:
                wait_for_producer(a, s)
        dtype = NUMPY_DTYPES[X.dtype]
        y = O.obj if O is not None else cupy.ndarray(X.shape, dtype)
        h = RO.obj if RO is not None else cupy.ndarray(X.shape, dtype)
        rstd = cupy.ndarray(X.shape[:-1], cupy.float32)
        if rows and n:
            strides = (_rows.row_stride(X), _rows.row_stride(R), _rows.row_stride(O) if O is not None else n,
                       _rows.row_stride(RO) if RO is not None else n)
            launch_add_forward(device, X.dtype, X.itemsize, X.ptr, R.ptr, W.ptr if W else 0,
                               O.ptr if O is not None else y.data.ptr, RO.ptr if RO is not None else h.data.ptr,
                               rstd.data.ptr, rows, n, eps, s, strides)
        elif rows:
            rstd.fill(float("nan"))
    return y, h, rstd


def _residual_out(obj, x, residual, weight):
    """residual_out=: like x; exactly x or residual (in place: each element is read, then written, by
    one thread) or disjoint from both and from weight."""
    ro = as_array(obj, "residual_out")
    if ro.dtype != x.dtype:
        raise TypeError(f"residual_out has dtype {ro.dtype_text}, expected {x.dtype_text} like x")
    if ro.shape != x.shape:
        raise ValueError(f"residual_out has shape {ro.shape}, expected {x.shape} like x")
    stride = _rows.row_stride(ro)
    _rows._aligned(ro)
    if ro.readonly:
        raise ValueError("residual_out is read-only")
    n = ro.shape[-1]
    if ro.size // max(n, 1) > 1 and abs(stride) < n:
        raise ValueError(f"residual_out has rows {stride} elements apart, {n} wide: its rows overlap each other")
    span = _rows.extent(ro, stride)
    for a in (x, residual, weight):
        if a is None:
            continue
        exact = a is not weight and ro.ptr == a.ptr and stride == _rows.row_stride(a)
        if not exact and _rows._overlap(span, _rows.extent(a)):
            raise ValueError(f"residual_out overlaps {a.name}; pass residual_out={a.name} exactly, or a separate "
                             "array" if a is not weight else "residual_out overlaps weight")
    return ro


def add_rms_norm(x, residual, weight=None, eps=None, *, out=None, residual_out=None, stream=None):
    """(y, new_residual): new_residual = x + residual, y = rms_norm(new_residual, weight, eps)."""
    y, h, _ = add_rms_norm_forward(x, residual, weight, eps, out=out, residual_out=residual_out, stream=stream)
    return y, h


def add_rms_norm_backward(dy, d_new_residual, new_residual, weight, rstd, *, stream=None):
    """(dx, dweight): dx = rms_norm's dx (of dy, at new_residual, the forward's) + d_new_residual
    (None: 0), the gradient of x and of residual both; dweight None without weight (deterministic,
    as rms_norm's). dy, d_new_residual and new_residual may be row-strided views."""
    import cupy

    H = _rows.rows_array(new_residual, "new_residual", "add_rms_norm_backward")
    DY = _rows.rows_array(dy, "dy", "add_rms_norm_backward", like=H)
    DR = _rows.rows_array(d_new_residual, "d_new_residual", "add_rms_norm_backward", like=H) \
        if d_new_residual is not None else None
    W = _rows.vector_array(weight, "weight", H) if weight is not None else None
    R = _rows.stats_array(rstd, "rstd", H)
    device = _rows.one_device(H, DY, DR, W, R)
    rows, n = _rows_of(H)
    dtype = NUMPY_DTYPES[H.dtype]
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (DY, H, DR, W, R):
            if a is not None:
                wait_for_producer(a, s)
        dx = cupy.ndarray(H.shape, dtype)
        dweight = cupy.zeros((n,), dtype) if W is not None else None
        if rows and n:
            dr_stride = _rows.row_stride(DR) if DR is not None else n
            strides = (_rows.row_stride(DY), _rows.row_stride(H), dr_stride, n)
            plan = backward_plan(rows, n, H.itemsize, sm_count(device), DY.ptr, H.ptr, W.ptr if W else 0,
                                 dx.data.ptr, (strides[0], strides[1], n),
                                 extra=((DR.ptr if DR is not None else 0, dr_stride),))
            partial_dw = cupy.ndarray((plan[3], n), cupy.float32) if dweight is not None else None
            launch_add_backward(device, H.dtype, H.itemsize, DY.ptr, H.ptr, W.ptr if W else 0, R.ptr,
                                DR.ptr if DR is not None else 0, dx.data.ptr,
                                partial_dw.data.ptr if partial_dw is not None else 0,
                                dweight.data.ptr if dweight is not None else 0, rows, n, plan, s, strides)
            hold_if_capturing(s, partial_dw)
    return dx, dweight
