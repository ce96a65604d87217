"""Losses over the rows of logits: cross_entropy, its gradient fused into the forward (written into
a new array or into the logits' own buffer), and its backward. Kernels: kernels/losses.cu.

cross_entropy(logits, target) is torch.nn.functional.cross_entropy for (N, V) logits and (N,)
class indices, without class weights:

    loss_i = lse_i - (1 - eps) x_i,target_i - (eps / V) sum_j x_ij + z_loss * lse_i^2
    lse_i  = log(sum_j exp(x_ij))

eps = label_smoothing, as torch defines it ((1 - eps) times the negative log-likelihood plus eps
times the mean over the V classes of -log_softmax). z_loss is PaLM's auxiliary loss, Liger-Kernel's
`lse_square_scale` (its definition: z_loss * lse^2 added to each row's loss before the reduction,
so that "mean" divides it by the rows not ignored too). Rows whose target is ignore_index count
for nothing: loss 0, gradient 0. reduction "mean" divides the sum by the rows not ignored (torch's
definition, label smoothing included); when every row is ignored that is 0 / 0 = NaN, as torch
gives. "sum" adds the rows, "none" returns one loss per row. The sums are in a fixed order (per-row
losses, then one block's reduction): the same bits on every run.

dtypes: logits float32, float16 or bfloat16 (math in float32; the loss has the logits' dtype, as
torch's), target int64 (torch's) or int32. V up to any size (64-bit indexing); N of any size.

Targets out of range: a target that is neither ignore_index nor in [0, V) gives that row a NaN
loss (so "mean" and "sum" are NaN too) and a NaN gradient row: never a silent wrong number, and no
host synchronisation. check_targets=True adds a check that raises ValueError naming the first bad
row; it reads a device flag back after the launches, so it synchronises with the launch's stream
(and is refused while the stream is being captured into a CUDA graph), and with grad="inplace"
the logits are already overwritten when it raises.

The gradient (grad=): d loss / d logits for the reduction chosen, with the loss's own gradient 1
(cross_entropy_backward takes another): reading the logits twice and writing the gradient once in
one launch, the second read of each row following the first closely enough to come from L2
(plan()). grad="new" writes a new C-contiguous array; grad="inplace" overwrites the logits with
their gradient (no second V-sized array: the logits are gone afterwards, so only when nothing else
needs them). cross_entropy_backward recomputes the gradient from the logits for a given
grad_output (one value, or one per row for "none"), into out= (the logits themselves allowed).

Layouts: logits may be any row-strided view (last dim contiguous, rows at one stride: a slice of
a wider matrix runs as it is); target may be any 1-D view. The gradient and the loss are new
contiguous arrays (or the logits themselves in place).
"""
import numpy

from . import _constants, _modules, _rows
from ._launch import (NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, sm_count, stream_pointer,
                      wait_for_producer)

FAMILY = "losses"

KERNELS = {
    "cross_entropy_fwd": ("logits", "target", "grad", "loss_rows", "lse_rows", "counts", "grad_output", "rows", "n",
                          "x_stride", "target_stride", "grad_stride", "ignore_index", "flags", "label_smoothing",
                          "z_loss"),
    "cross_entropy_scale": ("grad", "out", "target", "grad_output", "rows", "n", "grad_stride", "out_stride",
                            "target_stride", "ignore_index", "flags"),
    "cross_entropy_targets": ("target", "counts", "rows", "n", "target_stride", "ignore_index", "flags"),
    "cross_entropy_reduce": ("loss_rows", "counts", "out", "rows", "mode"),
}
FWD_KINDS = "ppppppp" + "qqqqqqq" + "ff"
SCALE_KINDS = "pppp" + "qqqqqqq"
TARGETS_KINDS = "pp" + "qqqqq"
REDUCE_KINDS = "ppp" + "qq"

REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}  # cross_entropy_reduce's mode
GRAD_MODES = (False, "new", "inplace")
TARGET_TYPES = {"int64": 8, "<i8": 8, "int32": 4, "<i4": 4}

MAX_THREADS = _constants.CE_MAX_THREADS
WARP_THREADS = _constants.CE_WARP_THREADS
WARP_VECTORS = _constants.CE_WARP_VECTORS
UNROLL = _constants.CE_UNROLL
SMALL_THREADS = _constants.CE_SMALL_THREADS
RESIDENT_L2_PERCENT = _constants.CE_RESIDENT_L2_PERCENT
FLAG_VECTORS = _constants.CE_FLAG_VECTORS
FLAG_TARGET_I32 = _constants.CE_FLAG_TARGET_I32
FLAG_MEAN = _constants.CE_FLAG_MEAN
FLAG_GRAD_OUTPUT = _constants.CE_FLAG_GRAD_OUTPUT
FLAG_PER_ROW_GRAD_OUTPUT = _constants.CE_FLAG_PER_ROW_GRAD_OUTPUT
FLAG_WARP = _constants.CE_FLAG_WARP
MIN_BLOCK_THREADS = 64
MAX_GRID = _rows.MAX_GRID


# ------------------------------------------------------------------------------ launch plan
def row_shape(n, itemsize):
    """(mode flag, threads) of a row launch over rows of `n` elements of `itemsize` bytes.

    Rows of at most WARP_VECTORS 16-byte vectors: a warp per row (FLAG_WARP), WARP_THREADS-thread
    blocks. Wider rows: a block per row of about one thread per UNROLL vectors (a power of two,
    MIN_BLOCK_THREADS..MAX_THREADS)."""
    nvec = -(-n // (16 // itemsize))
    if nvec <= WARP_VECTORS:
        return FLAG_WARP, WARP_THREADS
    return 0, min(MAX_THREADS, max(MIN_BLOCK_THREADS, _pow2_at_least(-(-nvec // UNROLL))))


def resident_bytes(l2_bytes):
    """Bytes of rows in flight a re-reading launch aims for: RESIDENT_L2_PERCENT of the device's L2
    (the rest left to the gradient's writes and the other traffic that shares it)."""
    return l2_bytes * RESIDENT_L2_PERCENT // 100


def plan(rows, n, itemsize, sms, per_sm, reread=True, l2_resident_bytes=0):
    """(mode flag, blocks, threads) of a row launch (cross_entropy_fwd, cross_entropy_scale) over
    `rows` rows of `n` elements of `itemsize` bytes on `sms` multiprocessors, each holding `per_sm`
    blocks of the kernel at row_shape's threads at once (the occupancy API at launch).

    Both modes grid-stride: the grid is what the SMs hold at once (one wave), and, where each row
    is read twice (`reread`: the forward with the gradient) in block-per-row mode, no more rows at
    once than `l2_resident_bytes` hold (resident_bytes of the device's L2; at least one a
    multiprocessor), so that a row's second read finds it in L2.
    """
    mode, threads = row_shape(n, itemsize)
    per_sm = max(1, per_sm)
    if mode == FLAG_WARP:
        blocks = min(-(-rows // (WARP_THREADS // 32)), sms * per_sm)
        return FLAG_WARP, max(1, min(blocks, MAX_GRID)), WARP_THREADS
    if reread:
        per_sm = min(per_sm, max(1, l2_resident_bytes // (n * itemsize * sms)))
    return 0, max(1, min(rows, sms * per_sm, MAX_GRID)), threads


def _pow2_at_least(k):
    return 1 << max(0, k - 1).bit_length()


def row_flags(n, itemsize, pointers, strides, target_i32):
    """The flags every row launch shares: 16-byte accesses where every row of every operand is on
    16-byte boundaries (rawops/_rows.py's rule), the target's width."""
    flags = FLAG_VECTORS if _rows.vectors(n, itemsize, *pointers, strides=strides) else 0
    return flags | (FLAG_TARGET_I32 if target_i32 else 0)


# ------------------------------------------------------------------------------ launches (raw pointers)
def _fn(name, code, device):
    return _modules.function_pointer(FAMILY, _rows.kernel_name(name, code), device)


def device_plan(function, device, rows, n, itemsize, reread):
    """plan() on `device` for kernel `function`: its SMs, the blocks of it an SM holds at
    row_shape's threads (occupancy API) and, re-reading, resident_bytes of its L2."""
    threads = row_shape(n, itemsize)[1]
    return plan(rows, n, itemsize, sm_count(device), _modules.blocks_per_sm(function, threads, 0, device), reread,
                resident_bytes(_modules.l2_bytes(device)) if reread else 0)


def launch_targets(device, code, target, target_i32, counts, rows, n, target_stride, ignore_index, stream):
    """counts (COUNTS int64): rows not ignored, the first bad target's row (or -1), its value."""
    launch(_fn("cross_entropy_targets", code, device), (1,), SMALL_THREADS, 0, stream,
           (target, counts, rows, n, target_stride, ignore_index, FLAG_TARGET_I32 if target_i32 else 0),
           TARGETS_KINDS, device)


def launch_rows(device, code, itemsize, logits, target, target_i32, grad, loss_rows, lse_rows, counts, grad_output,
                per_row, rows, n, x_stride, target_stride, grad_stride, ignore_index, mean, smoothing, z_loss,
                stream):
    """cross_entropy_fwd: per-row losses (and lse) into float32 loss_rows (lse_rows), the gradient
    into grad where given (0: none), scaled by 1 / counts[0] when `mean` and by grad_output (0:
    none; per_row: one value a row) where given. rows > 0, n > 0."""
    function = _fn("cross_entropy_fwd", code, device)
    mode, blocks, threads = device_plan(function, device, rows, n, itemsize, bool(grad))
    flags = mode | row_flags(n, itemsize, (logits, grad), (x_stride, grad_stride) if grad else (x_stride,),
                             target_i32)
    flags |= (FLAG_MEAN if mean else 0) | (FLAG_GRAD_OUTPUT if grad_output else 0)
    flags |= FLAG_PER_ROW_GRAD_OUTPUT if per_row else 0
    launch(function, (blocks,), threads, 0, stream,
           (logits, target, grad, loss_rows, lse_rows, counts, grad_output, rows, n, x_stride, target_stride,
            grad_stride, ignore_index, flags, smoothing, z_loss), FWD_KINDS, device)


def launch_reduce(device, code, loss_rows, counts, out, rows, reduction, stream):
    launch(_fn("cross_entropy_reduce", code, device), (1,), SMALL_THREADS, 0, stream,
           (loss_rows, counts, out, rows, REDUCTIONS[reduction]), REDUCE_KINDS, device)


def launch_scale(device, code, itemsize, grad, out, target, target_i32, grad_output, per_row, rows, n, grad_stride,
                 out_stride, target_stride, ignore_index, stream):
    """out = grad * grad_output (one value, or one a row), 0 on ignored rows; in place (out ==
    grad) rows whose factor is 1, or that are ignored, are left untouched. rows > 0, n > 0."""
    function = _fn("cross_entropy_scale", code, device)
    mode, blocks, threads = device_plan(function, device, rows, n, itemsize, False)
    flags = mode | row_flags(n, itemsize, (grad, out), (grad_stride, out_stride), target_i32)
    flags |= FLAG_PER_ROW_GRAD_OUTPUT if per_row else 0
    launch(function, (blocks,), threads, 0, stream,
           (grad, out, target, grad_output, rows, n, grad_stride, out_stride, target_stride, ignore_index, flags),
           SCALE_KINDS, device)


# ------------------------------------------------------------------------------ argument checks
# Pure Python (no Cython): the torch adapter runs these inside torch.compile, which traces them.
def _real(value, name):
    if value is None or isinstance(value, (str, bytes, bool)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def check_options(ignore_index, label_smoothing, reduction, z_loss):
    """(ignore_index, label_smoothing, reduction, z_loss) checked: TypeError / ValueError naming
    the argument, before anything touches the GPU."""
    if isinstance(ignore_index, (bool, numpy.bool_)) or not isinstance(ignore_index, (int, numpy.integer)):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    ignore_index = int(ignore_index)
    if not -(1 << 63) <= ignore_index < (1 << 63):
        raise ValueError(f"ignore_index {ignore_index} does not fit int64")
    smoothing = _real(label_smoothing, "label_smoothing")
    if not 0.0 <= smoothing <= 1.0:  # NaN fails too
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    if not isinstance(reduction, str):
        raise TypeError(f"reduction must be a string, got {type(reduction).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    z = _real(z_loss, "z_loss")
    if not 0.0 <= z < float("inf"):
        raise ValueError(f"z_loss must be a finite number >= 0, got {z_loss}")
    return ignore_index, smoothing, reduction, z


def check_grad_mode(grad):
    if grad is not False and not isinstance(grad, str):
        raise TypeError(f"grad must be False, 'new' or 'inplace', got {grad!r}")
    if grad not in GRAD_MODES:
        raise ValueError(f"grad must be False, 'new' or 'inplace', got {grad!r}")
    return grad


def check_bool(value, name):
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def logits_array(obj, name="logits"):
    """(DeviceArray, rows, n, row stride): float32/float16/bfloat16 of shape (N, V), V >= 1, rows
    at one stride with each row's elements consecutive."""
    a = as_array(obj, name)
    if a.dtype < 0 or a.dtype > 2:
        raise TypeError(f"{name} has dtype {a.dtype_text}; cross_entropy supports float32, float16, bfloat16")
    if len(a.shape) != 2:
        raise ValueError(f"{name} has shape {a.shape}; cross_entropy expects (N, V): one row of V class scores "
                         f"per sample")
    rows, n = a.shape
    if n == 0:
        raise ValueError(f"{name} has shape {a.shape}: V = 0 classes; cross_entropy needs at least one")
    stride = _rows.row_stride(a)
    _rows._aligned(a)
    return a, rows, n, stride


def target_array(obj, rows, name="target"):
    """(DeviceArray, int32?, element stride): int64 or int32 of shape (rows,), any stride."""
    t = as_array(obj, name)
    text = t.dtype_text
    width = TARGET_TYPES.get(text)
    if width is None or t.itemsize != width:
        raise TypeError(f"{name} has dtype {text}; cross_entropy takes class indices as int64 (or int32)")
    if len(t.shape) != 1 or t.shape[0] != rows:
        raise ValueError(f"{name} has shape {t.shape}, expected ({rows},): one class index per row of logits")
    if t.contiguous:
        stride = 1
    else:
        if t.strides is None:
            raise ValueError(f"{name} has a stride that is not a whole number of its {t.itemsize}-byte elements")
        stride = t.strides[0]
    _rows._aligned(t)
    return t, width == 4, stride


def grad_output_array(obj, like, reduction, rows):
    """grad_output: the loss's gradient, of like's dtype; one value (shape () or (1,)) for
    'mean' / 'sum', one a row ((rows,), C-contiguous) for 'none'. Returns (array, per_row)."""
    g = as_array(obj, "grad_output")
    if g.dtype != like.dtype:
        raise TypeError(f"grad_output has dtype {g.dtype_text}, expected {like.dtype_text} like {like.name}")
    if reduction == "none":
        if g.shape != (rows,):
            raise ValueError(f"grad_output has shape {g.shape}, expected ({rows},) for reduction='none'")
    elif g.size != 1:
        raise ValueError(f"grad_output has shape {g.shape}, expected one value for reduction={reduction!r}")
    _rows._dense(g)
    return g, reduction == "none"


def gradient_out(obj, logits, rows, n, others):
    """out= of the gradient: logits' dtype and shape, writable, rows that do not overlap; the
    logits themselves exactly (in place) or memory apart from every operand. Returns (array, stride)."""
    o = _rows.out_array(obj, logits, others)
    return o, _rows.row_stride(o)


def _writable_rows(a, rows, n, stride):
    """The logits overwritten in place: writable, rows that do not share memory."""
    if a.readonly:
        raise ValueError(f"{a.name} is read-only; grad='inplace' overwrites it with its gradient")
    if rows > 1 and abs(stride) < n:
        raise ValueError(f"{a.name} has rows {stride} elements apart, {n} wide: its rows overlap, so its memory "
                         "cannot hold their gradients (grad='inplace'); use grad='new'")


# ------------------------------------------------------------------------------ CuPy API
COUNTS = 3  # the targets kernel's results: rows not ignored, the first bad row (or -1), its target


def bad_target_message(row, value, n, ignore_index):
    return f"target[{row}] = {value} is outside [0, {n}) and is not ignore_index ({ignore_index})"


def _check_targets(counts, n, ignore_index):
    """Raise ValueError naming the first bad row (reads counts back: synchronises)."""
    _, bad, value = (int(v) for v in counts.get())
    if bad >= 0:
        raise ValueError(bad_target_message(bad, value, n, ignore_index))


def _refuse_check_while_capturing(s):
    import cupy

    if s > 1 and cupy.cuda.runtime.streamIsCapturing(s):
        raise ValueError("check_targets=True reads a flag back from the GPU, which a stream being captured into "
                         "a CUDA graph cannot do: pass check_targets=False while capturing")


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0, *,
                  grad=False, check_targets=False, stream=None):
    """torch.nn.functional.cross_entropy of (N, V) logits against (N,) class indices (module
    docstring for the formula, label smoothing, z_loss, ignored rows and bad targets).

    Returns the loss (a 0-d array for 'mean' / 'sum', (N,) for 'none', in the logits' dtype); with
    grad='new' or 'inplace', (loss, d loss / d logits): a new array, or the logits overwritten by
    their gradient (no second V-sized array), both for a loss gradient of 1."""
    import cupy

    ignore_index, smoothing, reduction, z = check_options(ignore_index, label_smoothing, reduction, z_loss)
    grad = check_grad_mode(grad)
    check_targets = check_bool(check_targets, "check_targets")
    x, rows, n, x_stride = logits_array(logits)
    t, i32, t_stride = target_array(target, rows)
    if grad == "inplace":
        _writable_rows(x, rows, n, x_stride)
    device = _rows.one_device(x, t)
    s = stream_pointer(stream, device)
    dtype = NUMPY_DTYPES[x.dtype]
    mean = reduction == "mean"
    with cupy.cuda.Device(device), allocating_on(stream, s):
        if check_targets:
            _refuse_check_while_capturing(s)
        wait_for_producer(x, s)
        wait_for_producer(t, s)
        counts = cupy.empty(COUNTS, numpy.int64)
        loss_rows = cupy.empty(rows, numpy.float32)
        loss = cupy.empty((rows,) if reduction == "none" else (), dtype)
        if grad == "new":
            g_obj, g_stride = cupy.empty((rows, n), dtype), n
            g_ptr = g_obj.data.ptr
        elif grad == "inplace":
            g_obj, g_ptr, g_stride = x.obj, x.ptr, x_stride
        else:
            g_obj, g_ptr, g_stride = None, 0, n
        hold_if_capturing(s, counts, loss_rows)
        if mean or check_targets:
            launch_targets(device, x.dtype, t.ptr, i32, counts.data.ptr, rows, n, t_stride, ignore_index, s)
        if rows:
            launch_rows(device, x.dtype, x.itemsize, x.ptr, t.ptr, i32, g_ptr, loss_rows.data.ptr, 0,
                        counts.data.ptr, 0, False, rows, n, x_stride, t_stride, g_stride, ignore_index, mean,
                        smoothing, z, s)
        launch_reduce(device, x.dtype, loss_rows.data.ptr, counts.data.ptr, loss.data.ptr, rows, reduction, s)
        if check_targets:
            _check_targets(counts, n, ignore_index)
    return loss if grad is False else (loss, g_obj)


def cross_entropy_backward(logits, target, grad_output=None, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", z_loss=0.0, *, out=None, check_targets=False, stream=None):
    """d loss / d logits of cross_entropy(logits, target, ...) times grad_output (the loss's
    gradient: one value for 'mean' / 'sum', one a row for 'none', in the logits' dtype; None: 1),
    recomputed from the logits (read twice, the gradient written once). out= may be the logits
    themselves (overwritten in place) or an array apart from them; else a new array."""
    import cupy

    ignore_index, smoothing, reduction, z = check_options(ignore_index, label_smoothing, reduction, z_loss)
    check_targets = check_bool(check_targets, "check_targets")
    x, rows, n, x_stride = logits_array(logits)
    t, i32, t_stride = target_array(target, rows)
    g, per_row = grad_output_array(grad_output, x, reduction, rows) if grad_output is not None else (None, False)
    o, o_stride = gradient_out(out, x, rows, n, [t, g]) if out is not None else (None, n)
    device = _rows.one_device(x, t, g, o)
    s = stream_pointer(stream, device)
    mean = reduction == "mean"
    with cupy.cuda.Device(device), allocating_on(stream, s):
        if check_targets:
            _refuse_check_while_capturing(s)
        for a in (x, t, g):
            if a is not None:
                wait_for_producer(a, s)
        counts = cupy.empty(COUNTS, numpy.int64)
        loss_rows = cupy.empty(max(rows, 1), numpy.float32)
        result = o.obj if o is not None else cupy.empty((rows, n), NUMPY_DTYPES[x.dtype])
        out_ptr = o.ptr if o is not None else result.data.ptr
        hold_if_capturing(s, counts, loss_rows)
        if mean or check_targets:
            launch_targets(device, x.dtype, t.ptr, i32, counts.data.ptr, rows, n, t_stride, ignore_index, s)
        if rows:
            launch_rows(device, x.dtype, x.itemsize, x.ptr, t.ptr, i32, out_ptr, loss_rows.data.ptr, 0,
                        counts.data.ptr, g.ptr if g is not None else 0, per_row, rows, n, x_stride, t_stride,
                        o_stride, ignore_index, mean, smoothing, z, s)
        if check_targets:
            _check_targets(counts, n, ignore_index)
    return result


from ._losses_linear import fused_linear_cross_entropy  # noqa: E402,F401  (rawops/_losses_linear.py)
