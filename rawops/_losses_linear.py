"""fused_linear_cross_entropy, the losses family's second op: cross_entropy(input @ weight.T + bias,
target) with its gradients for input, weight and bias, the (tokens, V) logits never existing whole.
rawops.losses holds the cross-entropy kernels (kernels/losses.cu) this module launches.

    logits = input @ weight.T + bias        input (..., H) as T rows, weight (V, H) as nn.Linear's
    loss   = cross_entropy(logits, target, ignore_index, label_smoothing, reduction, z_loss)

(rawops/losses.py: the formula, label smoothing, z_loss, ignored rows, "mean" over the rows not
ignored, NaN for a target outside [0, V) that is not ignore_index; check_targets=True makes that a
ValueError naming the first such row, raised before any GEMM after a synchronising read.)

The tokens run in chunks of `chunk_rows` rows (chunk_plan); for each chunk, on one stream:
  1. logits_c = input_c @ weight.T (+ bias): cuBLAS, into one (chunk_rows, V) buffer reused by
     every chunk;
  2. cross_entropy_fwd: the chunk's per-row losses and, in the same launch, d loss / d logits_c
     written over logits_c in place, scaled for the WHOLE batch's reduction: 1 / N_valid for
     "mean" (N_valid counted once up front on the GPU by cross_entropy_targets, read by every
     chunk's launch on the device: no host synchronisation), times grad_output where given (one
     value, or one a row for "none");
  3. grad_input_c = dlogits_c @ weight: cuBLAS, straight into grad_input's rows of the chunk;
  4. grad_weight += dlogits_c.T @ input_c: cuBLAS with beta = 1 into one accumulator (beta = 0
     for the first chunk: no zero fill); grad_bias += the column sums of dlogits_c (a GEMV
     against a vector of ones, float32 accumulator).
Then cross_entropy_reduce turns the per-row losses into the loss (a fixed-order sum: the same
bits every run). FLOPs: 3 GEMMs of 2 T H V each (forward only: one); bytes beyond the GEMMs':
each chunk's logits read twice and written once by the loss kernel.

Chunk size (chunk_plan): by default the largest multiple of CHUNK_ALIGN rows whose logits take at
most CHUNK_BYTES (8192 x 128256 bf16: 1024 rows, 8 chunks), never under CHUNK_ALIGN rows (a
GEMM of fewer rows runs the tensor cores badly; a vocabulary wider than CHUNK_BYTES / CHUNK_ALIGN
bytes a row takes CHUNK_ALIGN rows over the budget), never more than the tokens. Larger chunks
make the grad_weight accumulation cheaper (each chunk reads and writes the (V, H) accumulator once)
for more memory; chunk_rows= sets it.

Memory beyond the inputs and the gradients themselves: the chunk buffer (chunk_rows x V), the
per-row losses (T float32), V float32 for grad_bias's accumulator. grad_weight accumulates in
weight's dtype by default (as Liger-Kernel does): each chunk's GEMM sums in float32 and rounds
once into the accumulator, so a 16-bit grad_weight takes one rounding a chunk. accum_dtype=
"float32" accumulates in a float32 (V, H) buffer instead (V x H x 4 bytes more, and at the end
V x H x itemsize for the conversion): one rounding in all, for float16 / bfloat16 weights.

dtypes: input, weight and bias float32, float16 or bfloat16, all alike (float32: plain float32
GEMMs, no TF32); target int64 or int32. The loss is float32 (as Liger's and transformers' losses:
the per-row losses are float32 already); the gradients have input's, weight's and bias's dtypes.

Layouts: input any (..., H) view whose leading dims collapse to one row stride (at least H) with
H contiguous, read as it is; weight (V, H) with rows at least H apart and H contiguous; bias and
grad_output dense; target (T,) at any stride, or input's leading shape when C-contiguous.
Gradients: new C-contiguous arrays (grad_input in input's shape).
"""
import numpy

from . import _rows, losses as _ce
from ._launch import NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, stream_pointer, wait_for_producer

FAMILY = "losses"  # no kernels of its own: the cross-entropy kernels of kernels/losses.cu

CHUNK_BYTES = 256 << 20  # the default chunk's logits at most (bytes)
CHUNK_ALIGN = 256  # the default chunk's rows: a multiple of this, and at least this

# cuBLAS: cudaDataType by dtype code (float32, float16, bfloat16), the float32 compute type (no
# TF32: float32 inputs stay float32, as torch's default), the default algorithm, the operations.
_CUDA_TYPES = (0, 2, 14)  # CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
_CUDA_R_32F = 0
_COMPUTE_32F = 68  # CUBLAS_COMPUTE_32F
_GEMM_DEFAULT = -1  # CUBLAS_GEMM_DEFAULT
_OP_N, _OP_T = 0, 1
_POINTER_MODE_HOST = 0
_ONE = numpy.ones(1, numpy.float32)
_ONE_BITS = ((numpy.uint32, 0x3F800000), (numpy.uint16, 0x3C00), (numpy.uint16, 0x3F80))
_ZERO = numpy.zeros(1, numpy.float32)


# ------------------------------------------------------------------------------ the chunk plan (pure)
def chunk_plan(tokens, vocab, itemsize, chunk_rows=None):
    """Rows of a chunk: chunk_rows when given, else the largest multiple of CHUNK_ALIGN whose
    logits (rows x vocab x itemsize bytes) fit CHUNK_BYTES, at least CHUNK_ALIGN; at most
    `tokens` (and at least 1)."""
    if chunk_rows is None:
        chunk_rows = max(CHUNK_ALIGN, CHUNK_BYTES // (vocab * itemsize) // CHUNK_ALIGN * CHUNK_ALIGN)
    return max(1, min(chunk_rows, tokens))


def chunks(tokens, rows):
    """[(start, stop)] of the chunks covering [0, tokens), `rows` each, the last one shorter."""
    return [(start, min(start + rows, tokens)) for start in range(0, tokens, rows)]


# ------------------------------------------------------------------------------ argument checks (pure)
def check_chunk_rows(chunk_rows):
    if chunk_rows is None:
        return None
    if isinstance(chunk_rows, (bool, numpy.bool_)) or not isinstance(chunk_rows, (int, numpy.integer)):
        raise TypeError(f"chunk_rows must be None or an int, got {type(chunk_rows).__name__}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
    return int(chunk_rows)


def check_accum_dtype(accum_dtype):
    """True for a float32 grad_weight accumulator, False for weight's dtype (None)."""
    if accum_dtype is None:
        return False
    if isinstance(accum_dtype, str):
        name = accum_dtype
    elif type(accum_dtype).__module__ == "torch":  # torch.float32 (rawops never imports torch)
        name = str(accum_dtype).replace("torch.", "")
    else:
        try:
            name = numpy.dtype(accum_dtype).name
        except TypeError:
            raise TypeError(f"accum_dtype must be None or float32, got {accum_dtype!r}") from None
    if name != "float32":
        raise ValueError(f"accum_dtype must be None (weight's dtype) or float32, got {accum_dtype!r}")
    return True


def check_options(ignore_index, label_smoothing, reduction, z_loss, chunk_rows, accum_dtype):
    """The scalar arguments checked (losses.check_options, chunk_rows, accum_dtype)."""
    ignore_index, smoothing, reduction, z = _ce.check_options(ignore_index, label_smoothing, reduction, z_loss)
    return ignore_index, smoothing, reduction, z, check_chunk_rows(chunk_rows), check_accum_dtype(accum_dtype)


def check_dims(input_shape, weight_shape, target_shape, bias_shape):
    """(tokens, H, V) from the shapes, ValueError naming the argument: input (..., H) with at least
    2 dims, weight (V, H), target (tokens,) or input's leading shape, bias (V,)."""
    if len(input_shape) < 2:
        raise ValueError(f"input has shape {input_shape}; fused_linear_cross_entropy expects (..., H): rows of H "
                         "hidden features")
    h = input_shape[-1]
    if h == 0:
        raise ValueError(f"input has shape {input_shape}: H = 0 features")
    if len(weight_shape) != 2:
        raise ValueError(f"weight has shape {weight_shape}, expected (V, H) as nn.Linear's weight")
    v = weight_shape[0]
    if weight_shape[1] != h:
        raise ValueError(f"weight has shape {weight_shape}, expected (V, {h}): its H must match input's last dim")
    if v == 0:
        raise ValueError(f"weight has shape {weight_shape}: V = 0 classes; cross_entropy needs at least one")
    tokens = 1
    for d in input_shape[:-1]:
        tokens *= d
    if tuple(target_shape) not in ((tokens,), tuple(input_shape[:-1])):
        raise ValueError(f"target has shape {target_shape}, expected ({tokens},): one class index per row of input")
    if bias_shape is not None and tuple(bias_shape) != (v,):
        raise ValueError(f"bias has shape {bias_shape}, expected ({v},): one value per class (weight's rows)")
    return tokens, h, v


def _float_array(obj, name, like=None):
    a = as_array(obj, name)
    if like is None and not 0 <= a.dtype <= 2:
        raise TypeError(f"{name} has dtype {a.dtype_text}; fused_linear_cross_entropy supports float32, float16, "
                        "bfloat16")
    if like is not None and a.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {a.dtype_text}, expected {like.dtype_text} like {like.name}")
    _rows._aligned(a)
    return a


def _gemm_rows(a, h):
    """The row stride (elements) of a GEMM operand of rows of h elements: at least h (cuBLAS's
    leading dimension), ValueError naming it otherwise."""
    stride = _rows.row_stride(a)
    rows = a.size // h
    if rows > 1 and stride < h:
        raise ValueError(f"{a.name} has rows {stride} elements apart, {h} wide: a GEMM operand needs rows at least "
                         f"{h} apart, in ascending order; pass a contiguous copy")
    return max(stride, h)


def _target(obj, tokens):
    t = as_array(obj, "target")
    width = _ce.TARGET_TYPES.get(t.dtype_text)
    if width is None or t.itemsize != width:
        raise TypeError(f"target has dtype {t.dtype_text}; cross_entropy takes class indices as int64 (or int32)")
    if len(t.shape) == 1:
        stride = 1 if t.contiguous else t.strides[0] if t.strides is not None else None
        if stride is None:
            raise ValueError(f"target has a stride that is not a whole number of its {t.itemsize}-byte elements")
    elif t.contiguous:
        stride = 1
    else:
        raise ValueError(f"target has shape {t.shape} and is not C-contiguous; pass target.reshape(-1) of a "
                         "contiguous array")
    _rows._aligned(t)
    return t, width == 4, stride


def _grad_output(obj, like, reduction, tokens, leading):
    g = as_array(obj, "grad_output")
    if g.dtype != like.dtype:
        raise TypeError(f"grad_output has dtype {g.dtype_text}, expected {like.dtype_text} like input")
    if reduction == "none":
        if g.shape not in ((tokens,), tuple(leading)):
            raise ValueError(f"grad_output has shape {g.shape}, expected ({tokens},) for reduction='none'")
    elif g.size != 1:
        raise ValueError(f"grad_output has shape {g.shape}, expected one value for reduction={reduction!r}")
    _rows._dense(g)
    return g


# ------------------------------------------------------------------------------ cuBLAS
def _gemm(cublas, handle, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate, ab_type, c_type):
    """Row-major C (m, n; row stride ldc) = op(A) @ op(B) (+ C where accumulate): op(A) (m, k) is
    A (m, k; row stride lda), or A (k, m) transposed where ta; op(B) (k, n) likewise. cuBLAS is
    column-major: it computes C^T = op(B)^T op(A)^T, the row-major arrays read as their
    transposes."""
    cublas.gemmEx(handle, _OP_T if tb else _OP_N, _OP_T if ta else _OP_N, n, m, k, _ONE.ctypes.data, b, ab_type,
                  ldb, a, ab_type, lda, (_ONE if accumulate else _ZERO).ctypes.data, c, c_type, ldc, _COMPUTE_32F,
                  _GEMM_DEFAULT)


# ------------------------------------------------------------------------------ CuPy API
def fused_linear_cross_entropy(input, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                               reduction="mean", z_loss=0.0, *, grad=True, grad_output=None, accum_dtype=None,
                               chunk_rows=None, check_targets=False, stream=None):
    """cross_entropy(input @ weight.T + bias, target, ...) without the whole logits (module
    docstring: the chunks, memory, layouts).

    Returns (loss, grad_input, grad_weight, grad_bias) (grad_bias None without bias): the
    gradients of the loss times grad_output (None: 1; one value for 'mean' / 'sum', one per row
    for 'none'), all from one pass over the chunks. grad=False: the loss alone
    (one GEMM a chunk). The loss is float32, 0-d for 'mean' / 'sum', input's leading shape for 'none'."""
    import cupy

    ignore_index, smoothing, reduction, z, chunk_rows, fp32_acc = check_options(
        ignore_index, label_smoothing, reduction, z_loss, chunk_rows, accum_dtype)
    _ce.check_bool(grad, "grad")
    grad = bool(grad)
    check_targets = _ce.check_bool(check_targets, "check_targets")
    x = _float_array(input, "input")
    w = _float_array(weight, "weight", like=x)
    b = _float_array(bias, "bias", like=x) if bias is not None else None
    t_shape = as_array(target, "target").shape
    tokens, h, v = check_dims(x.shape, w.shape, t_shape, b.shape if b is not None else None)
    t, i32, t_stride = _target(target, tokens)
    x_stride = _gemm_rows(x, h)
    w_stride = _gemm_rows(w, h)
    if b is not None:
        _rows._dense(b)
    g = _grad_output(grad_output, x, reduction, tokens, x.shape[:-1]) if grad_output is not None else None
    device = _rows.one_device(x, w, t, b, g)
    s = stream_pointer(stream, device)
    dtype = NUMPY_DTYPES[x.dtype]
    itemsize, code = x.itemsize, x.dtype
    ab_type = _CUDA_TYPES[code]
    fp32_acc = fp32_acc and code != 0
    mean = reduction == "mean"
    rows = chunk_plan(tokens, v, itemsize, chunk_rows)
    from cupy_backends.cuda.libs import cublas  # loads libcublas: after the checks

    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (x, w, t, b, g):
            if a is not None:
                wait_for_producer(a, s)
        handle = cupy.cuda.device.get_cublas_handle()
        counts = cupy.empty(_ce.COUNTS, numpy.int64)
        loss_rows = cupy.empty(tokens, numpy.float32)
        loss = cupy.empty(tuple(x.shape[:-1]) if reduction == "none" else (), numpy.float32)
        buf = cupy.empty((rows, v), dtype)
        # 1.0 by its bits (float32, float16, bfloat16): the bias's GEMMs' vector of ones
        ones = cupy.full(rows, _ONE_BITS[code][1], _ONE_BITS[code][0]) if b is not None else None
        gi = gw = gb = gw_acc = gb_acc = None
        if grad:
            gi = cupy.empty(x.shape, dtype)
            gw = gw_acc = cupy.empty((v, h), numpy.float32 if fp32_acc else dtype)
            if b is not None:
                gb = gb_acc = cupy.empty(v, numpy.float32)
        hold_if_capturing(s, counts, loss_rows, buf, ones, gw_acc if fp32_acc else None, gb_acc)
        if check_targets:  # before any GEMM: a bad target is a ValueError, not NaN (a synchronising read)
            _ce._refuse_check_while_capturing(s)
            _ce.launch_targets(device, code, t.ptr, i32, counts.data.ptr, tokens, v, t_stride, ignore_index, s)
            _ce._check_targets(counts, v, ignore_index)
        mode = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, _POINTER_MODE_HOST)
        try:
            if mean and not check_targets:  # (check_targets counted them already)
                _ce.launch_targets(device, code, t.ptr, i32, counts.data.ptr, tokens, v, t_stride, ignore_index, s)
            per_row = reduction == "none"
            for start, stop in chunks(tokens, rows):
                r = stop - start
                xp = x.ptr + start * x_stride * itemsize
                if b is not None:  # the bias in every row (ones (r, 1) @ bias (1, v)), the product added to it
                    _gemm(cublas, handle, False, False, r, v, 1, ones.data.ptr, 1, b.ptr, v, buf.data.ptr, v, False,
                          ab_type, ab_type)
                _gemm(cublas, handle, False, True, r, v, h, xp, x_stride, w.ptr, w_stride, buf.data.ptr, v,
                      b is not None, ab_type, ab_type)
                go = 0 if g is None else g.ptr + (start * itemsize if per_row else 0)
                _ce.launch_rows(device, code, itemsize, buf.data.ptr, t.ptr + start * t_stride * t.itemsize, i32,
                                buf.data.ptr if grad else 0, loss_rows.data.ptr + start * 4, 0, counts.data.ptr, go,
                                per_row, r, v, v, t_stride, v, ignore_index, mean, smoothing, z, s)
                if not grad:
                    continue
                _gemm(cublas, handle, False, False, r, h, v, buf.data.ptr, v, w.ptr, w_stride,
                      gi.data.ptr + start * h * itemsize, h, False, ab_type, ab_type)
                _gemm(cublas, handle, True, False, v, h, r, buf.data.ptr, v, xp, x_stride, gw_acc.data.ptr, h,
                      start > 0, ab_type, _CUDA_R_32F if fp32_acc else ab_type)
                if b is not None:
                    _gemm(cublas, handle, False, False, 1, v, r, ones.data.ptr, r, buf.data.ptr, v, gb_acc.data.ptr,
                          v, start > 0, ab_type, _CUDA_R_32F)
        finally:
            cublas.setPointerMode(handle, mode)
        _ce.launch_reduce(device, 0, loss_rows.data.ptr, counts.data.ptr, loss.data.ptr, tokens, reduction, s)
        if not grad:
            return loss
        if tokens == 0:  # no chunk wrote them
            gw_acc.fill(0)
            if gb_acc is not None:
                gb_acc.fill(0)
        if fp32_acc:
            gw = gw_acc.astype(dtype)
        if gb_acc is not None and code != 0:
            gb = gb_acc.astype(dtype)
    return loss, gi, gw, gb
