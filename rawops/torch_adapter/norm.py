"""The norm family for torch: layer_norm and rms_norm with torch.nn.functional's signatures, their
autograd (deterministic dweight / dbias), `rawops::` custom ops, and the modules LayerNorm and
RMSNorm, which load torch.nn.LayerNorm / torch.nn.RMSNorm state_dicts unchanged; add_rms_norm (a
transformer block's residual add and its next RMSNorm in one pass) and its module AddRMSNorm, which
loads a transformers LlamaRMSNorm state_dict unchanged.

The kernels normalise rows, each row's elements consecutive, the rows at any one stride: a
contiguous tensor, or a row-strided view (`x[:, :n]` of a wider tensor, `x[::2]`, autograd's
gradient broadcast over the rows) runs as it is, input and gradient alike. What is copied first
(one extra read and write of it): an input whose last dim is not contiguous or whose leading
dims have no single stride (a transpose: ta.layer_norm(x.t(), ...) copies x.t()), and a weight
or bias that is not contiguous. normalized_shape of several dims normalises their product as one
row (torch's reshape: a view where it can be one, else a copy). The outputs (y, dx, dweight,
dbias) are new contiguous tensors.
"""
import math

import torch

from .. import _rows, norm as _norm
from .._launch import sm_count, tensor_code
from ._common import compiling, custom_op, dense, fast_apply, needs_grad, on_device, raw_stream

_KINDS = ("layer_norm", "rms_norm")


def checked(t, name, like=None, like_name="x"):
    """The dtype code of a tensor operand after the launcher's checks (CUDA; float32, float16 or
    bfloat16; with `like`, its dtype and GPU), TypeError / ValueError naming it; any layout
    (the callers decide what each operand's layout must be)."""
    return tensor_code(t, name, like, like_name, False)


def _row_layout(t):
    """(rows, n, row stride) of a row-strided tensor (row_strided's; _run's reshape of one is one too)."""
    n = t.shape[-1]
    stride = n if t.is_contiguous() else _rows.collapsed_row_stride(tuple(t.shape), t.stride())
    return (t.numel() // n if n else 0), n, stride


def _rows_of(x, name="x"):
    """(dtype code, rows, n, row stride) of a row operand: its checks (CUDA, dtype), and the
    stride its rows are read at (rawops._rows.collapsed_row_stride); the caller made it
    row-strided (row_strided)."""
    code = checked(x, name)
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the op works over the last dim)")
    return (code, *_row_layout(x))


def row_strided(t):
    """t itself where the row kernels take it (contiguous, or rows of consecutive elements at one
    stride), else a contiguous copy (anything that is not a tensor too: the checks name it)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.is_contiguous():
        return t
    return t if _rows.collapsed_row_stride(tuple(t.shape), t.stride()) is not None else t.contiguous()


def _contiguous_like(t):
    return t.new_empty(t.shape)


def _row_vector(t, name, x):
    if t is None:
        return 0
    checked(t, name, like=x)
    if t.shape != x.shape[-1:]:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({x.shape[-1]},): one value per element "
                         "of x's last dim")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; the kernels read one value per column, densely")
    return t.data_ptr()


# ------------------------------------------------------------------- raw launches (no autograd)
# The raw functions check every operand (the custom ops are called with anything), then launch as
# the autograd path does (_checked_forward / _checked_backward below).
def forward(op, x, weight, bias, eps):
    """(y, mean, rstd) of op ('layer_norm' or 'rms_norm') over x's last dim; mean and rstd are
    float32, one per row (mean is an empty tensor for rms_norm). x row-strided or copied (the
    module docstring); weight and bias copied where not contiguous; y contiguous."""
    x = row_strided(x)
    _rows_of(x)
    weight, bias = dense(weight), dense(bias)
    _row_vector(weight, "weight", x)
    _row_vector(bias, "bias", x)
    y, mean, rstd = _checked_forward(op, x, weight, bias, eps)
    return y, (mean if mean is not None else rstd.new_empty((0,))), rstd


def _stats(t, name, x):
    """The forward's float32 mean/rstd as the backward reads them: one per row of x, dense, on
    x's GPU (the rawops::*_backward ops can be called with anything)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} has dtype {t.dtype}, expected torch.float32 (the forward's statistics)")
    if t.shape != x.shape[:-1]:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(x.shape[:-1])} (one per row of x)")
    if t.get_device() != x.get_device():
        raise ValueError(f"{name} is on {t.device}, expected {x.device} like x")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; the kernels read one value per row, densely")


def backward(op, dy, x, weight, mean, rstd, need_dweight, need_dbias):
    """(dx, dweight, dbias) of op from the forward's statistics; dweight / dbias are empty
    tensors where not wanted. dweight and dbias are the same bits on every run. dy and x
    row-strided or copied (a broadcast gradient's rows at stride 0 are read as they are)."""
    dy, x = row_strided(dy), row_strided(x)
    _rows_of(x)
    checked(dy, "dy", like=x)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {tuple(x.shape)} like x")
    _rows_of(dy, "dy")
    if op == "layer_norm":
        _stats(mean, "mean", x)
    _stats(rstd, "rstd", x)
    weight = dense(weight)
    _row_vector(weight, "weight", x)
    dx, dweight, dbias = _checked_backward(op, dy, x, weight, mean if op == "layer_norm" else None, rstd,
                                           need_dweight, need_dbias)
    return (dx, dweight if dweight is not None else x.new_empty((0,)),
            dbias if dbias is not None else x.new_empty((0,)))


# ------------------------------------------------------------------- autograd (eager)
# The autograd Function's forward and backward on operands _run has checked (x row-strided, weight and
# bias dense, each of x's dtype and GPU; the backward's from the forward): each check, allocation and
# plan of the raw functions above costs host time, and a 16-bit row's forward + backward (183-213 us of
# kernels at 16384 x 4096 on the H200) is shorter than the Python around it (bench/bench_autograd.py).
# Only what autograd hands over unchecked is looked at: dy's layout (its shape, dtype and GPU are y's,
# the engine's checks).
_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _checked_forward(op, x, weight, bias, eps):
    """(y, mean (None for rms_norm), rstd) of operands _run checked."""
    code = _CODES[x.dtype]
    rows, n, x_stride = _row_layout(x)
    eps = _norm.check_eps(eps, code)
    y = x.new_empty(x.shape)
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
    mean = x.new_empty(x.shape[:-1], dtype=torch.float32) if op == "layer_norm" else None
    if rows and n:
        device = x.get_device()
        on_device(device, _norm.launch_forward, op, device, code, x.element_size(), x.data_ptr(),
                  weight.data_ptr() if weight is not None else 0, bias.data_ptr() if bias is not None else 0,
                  y.data_ptr(), mean.data_ptr() if mean is not None else 0, rstd.data_ptr(), rows, n, eps,
                  raw_stream(device), x_stride, n)
    elif rows:
        rstd.fill_(float("nan"))
        if mean is not None:
            mean.fill_(float("nan"))
    return y, mean, rstd


def _checked_backward(op, dy, x, weight, mean, rstd, need_dweight, need_dbias):
    """(dx, dweight or None, dbias or None) from _checked_forward's operands and statistics; the
    partial rows of dweight and dbias in one buffer."""
    dy = row_strided(dy)
    code = _CODES[x.dtype]
    rows, n, x_stride = _row_layout(x)
    dy_stride = _row_layout(dy)[2]
    need_dweight = need_dweight and weight is not None
    dx = x.new_empty(x.shape)
    dweight = x.new_empty((n,)) if need_dweight else None
    dbias = x.new_empty((n,)) if need_dbias else None
    if not (rows and n):
        return dx, dweight.zero_() if need_dweight else None, dbias.zero_() if need_dbias else None
    device = x.get_device()
    itemsize = x.element_size()
    w = weight.data_ptr() if weight is not None else 0
    strides = (dy_stride, x_stride, n)
    plan = _norm.backward_plan(rows, n, itemsize, sm_count(device), dy.data_ptr(), x.data_ptr(), w, dx.data_ptr(),
                               strides)
    wanted = need_dweight + need_dbias
    partial_dw = partial_db = 0
    config = _norm.backward_config(op, device, code, itemsize, plan, n, bool(w), wanted)
    if wanted:
        chunks = config[5]
        partials = x.new_empty(wanted * chunks * n, dtype=torch.float32)
        base = partials.data_ptr()
        partial_dw = base if need_dweight else 0
        partial_db = (base + chunks * n * 4 * need_dweight) if need_dbias else 0
    on_device(device, _norm.launch_backward, op, device, code, itemsize, dy.data_ptr(), x.data_ptr(), w,
              mean.data_ptr() if mean is not None else 0, rstd.data_ptr(), dx.data_ptr(), partial_dw, partial_db,
              dweight.data_ptr() if need_dweight else 0, dbias.data_ptr() if need_dbias else 0, rows, n, plan,
              raw_stream(device), strides, config)
    return dx, dweight, dbias


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, op):
        y, mean, rstd = _checked_forward(op, x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.op, ctx.has_bias = op, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dweight, dbias = _checked_backward(ctx.op, dy, x, weight, mean, rstd, need[1], ctx.has_bias and need[2])
        return dx, dweight, dbias, None, None


_norm_apply = fast_apply(_Norm)


# ------------------------------------------------------------------- custom ops (torch.compile)


def _stats_like(x, op):
    return x.new_empty(x.shape[:-1] if op == "layer_norm" else (0,), dtype=torch.float32)


def _custom_ops(op):
    """The custom ops of one norm: forward -> (y, mean, rstd), backward -> (dx, dw, db)."""
    backward_op = custom_op(
        f"{op}_backward",
        "(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool need_dweight, bool need_dbias)"
        " -> (Tensor, Tensor, Tensor)",
        lambda dy, x, weight, mean, rstd, need_dw, need_db: backward(op, dy, x, weight, mean, rstd, need_dw, need_db),
        lambda dy, x, weight, mean, rstd, need_dw, need_db: (
            _contiguous_like(x), x.new_empty(x.shape[-1] if need_dw and weight is not None else 0),
            x.new_empty(x.shape[-1] if need_db else 0)))

    def setup(ctx, inputs, output):
        x, weight, bias, _ = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None

    def backward_formula(ctx, dy, _dmean, _drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = backward_op(dy, x, weight, mean, rstd, ctx.has_weight, ctx.has_bias)
        return dx, dweight if ctx.has_weight else None, dbias if ctx.has_bias else None, None

    forward_op = custom_op(
        f"{op}_forward", "(Tensor x, Tensor? weight, Tensor? bias, float? eps) -> (Tensor, Tensor, Tensor)",
        lambda x, weight, bias, eps: forward(op, x, weight, bias, eps),
        lambda x, weight, bias, eps: (_contiguous_like(x), _stats_like(x, op),
                                      x.new_empty(x.shape[:-1], dtype=torch.float32)),
        backward_formula, setup)
    return forward_op


_FORWARD_OPS = {op: _custom_ops(op) for op in _KINDS}


# ------------------------------------------------------------------- public functions
def _normalized(normalized_shape):
    """normalized_shape as a tuple of ints (an int is one dim), as torch reads it."""
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        return (normalized_shape,)
    try:
        shape = tuple(normalized_shape)
    except TypeError:
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got "
                        f"{type(normalized_shape).__name__}") from None
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"normalized_shape must be a non-empty sequence of ints, got {normalized_shape!r}")
    return shape


def _run(op, input, normalized_shape, weight, bias, eps):
    shape = _normalized(normalized_shape)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() < len(shape) or tuple(input.shape[input.dim() - len(shape):]) != shape:
        raise ValueError(f"{op}: normalized_shape={list(shape)} expects input of shape [*, "
                         f"{', '.join(map(str, shape))}], got {list(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a tensor of normalized_shape {shape}, got {got}")
    # A layout the kernels cannot take is copied once, here (autograd saves the copy); so is a
    # weight or bias that is not contiguous.
    input, weight, bias = row_strided(input), dense(weight), dense(bias)
    traced = compiling()
    if not traced:  # errors name the public arguments (the custom ops check for themselves)
        checked(input, "input")
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None:
                checked(t, name, like=input, like_name="input")
    folded = len(shape) > 1  # several trailing dims: one row of their product (reshape: a view or a copy)
    if folded:
        n = math.prod(shape)
        out_shape = input.shape
        input = input.reshape(*input.shape[:input.dim() - len(shape)], n)
        weight = weight.reshape(n) if weight is not None else None
        bias = bias.reshape(n) if bias is not None else None
    if traced:
        y = _FORWARD_OPS[op](input, weight, bias, eps)[0]
    elif needs_grad(input, weight, bias):
        y = _norm_apply(input, weight, bias, eps, op)
    else:
        y = forward(op, input, weight, bias, eps)[0]
    return y.reshape(out_shape) if folded else y


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm on rawops kernels: (input - mean) / sqrt(var + eps) over the
    trailing dims of normalized_shape, times weight, plus bias."""
    return _run("layer_norm", input, normalized_shape, weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm on rawops kernels: input / sqrt(mean(input^2) + eps) over the
    trailing dims of normalized_shape, times weight; eps=None is the dtype's machine epsilon."""
    return _run("rms_norm", input, normalized_shape, weight, None, eps)


# ------------------------------------------------------------------- modules
class LayerNorm(torch.nn.Module):
    """Drop-in torch.nn.LayerNorm: same arguments, same parameters (`weight`, `bias`), so it
    loads a torch.nn.LayerNorm state_dict unchanged."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _normalized(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, **factory))
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, **factory)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(torch.nn.Module):
    """Drop-in torch.nn.RMSNorm (parameter `weight`; eps=None is the dtype's machine epsilon, as
    in torch)."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _normalized(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


# ------------------------------------------------------------------- add_rms_norm
def add_forward(x, residual, weight, eps):
    """(y, new_residual, rstd): new_residual = x + residual, y = rms_norm(new_residual) * weight;
    rstd float32, one per row. x, residual row-strided or copied; weight copied where not
    contiguous; y and new_residual contiguous."""
    x, residual = row_strided(x), row_strided(residual)
    code, rows, n, x_stride = _rows_of(x)
    checked(residual, "residual", like=x)
    if residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}, expected {tuple(x.shape)} like x")
    r_stride = _rows_of(residual, "residual")[3]
    weight = dense(weight)
    w = _row_vector(weight, "weight", x)
    eps = _norm.check_eps(eps, code)
    y, h = _contiguous_like(x), _contiguous_like(x)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if rows and n:
        device = x.get_device()
        on_device(device, _norm.launch_add_forward, device, code, x.element_size(), x.data_ptr(),
                  residual.data_ptr(), w, y.data_ptr(), h.data_ptr(), rstd.data_ptr(), rows, n, eps,
                  raw_stream(device), (x_stride, r_stride, n, n))
    elif rows:
        rstd.fill_(float("nan"))
    return y, h, rstd


def add_backward(dy, d_new_residual, new_residual, weight, rstd, need_dweight):
    """(dx, dweight): dx = rms_norm's dx (of dy, at new_residual) + d_new_residual (None: 0), the
    gradient of both x and residual; dweight an empty tensor where not wanted."""
    h = row_strided(new_residual)
    code, rows, n, h_stride = _rows_of(h, "new_residual")
    dy = row_strided(dy)
    checked(dy, "dy", like=h, like_name="new_residual")
    if dy.shape != h.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {tuple(h.shape)} like new_residual")
    dy_stride = _rows_of(dy, "dy")[3]
    dr, dr_stride = 0, n
    if d_new_residual is not None:
        d_new_residual = row_strided(d_new_residual)
        checked(d_new_residual, "d_new_residual", like=h, like_name="new_residual")
        if d_new_residual.shape != h.shape:
            raise ValueError(f"d_new_residual has shape {tuple(d_new_residual.shape)}, expected {tuple(h.shape)}")
        dr, dr_stride = d_new_residual.data_ptr(), _rows_of(d_new_residual, "d_new_residual")[3]
    _stats(rstd, "rstd", h)
    weight = dense(weight)
    w = _row_vector(weight, "weight", h)
    need_dweight = need_dweight and weight is not None
    dx = _contiguous_like(h)
    dweight = (torch.zeros if not (rows and n) else torch.empty)(n if need_dweight else 0, dtype=h.dtype,
                                                                  device=h.device)
    if rows and n:
        device = h.get_device()
        plan = _norm.backward_plan(rows, n, h.element_size(), sm_count(device), dy.data_ptr(), h.data_ptr(), w,
                                   dx.data_ptr(), (dy_stride, h_stride, n), extra=((dr, dr_stride),))
        partial_dw = torch.empty((plan[3], n) if need_dweight else (0,), dtype=torch.float32, device=h.device)
        on_device(device, _norm.launch_add_backward, device, code, h.element_size(), dy.data_ptr(), h.data_ptr(), w,
                  rstd.data_ptr(), dr, dx.data_ptr(), partial_dw.data_ptr() if need_dweight else 0,
                  dweight.data_ptr() if need_dweight else 0, rows, n, plan, raw_stream(device),
                  (dy_stride, h_stride, dr_stride, n))
    return dx, dweight


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, h, rstd = add_forward(x, residual, weight, eps)
        ctx.save_for_backward(h, weight, rstd)
        ctx.set_materialize_grads(False)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, rstd = ctx.saved_tensors
        if dy is None:  # only the new residual was used: its gradient passes through the add
            dx = dh if dh is not None else torch.zeros_like(h)
            return dx, dx, None, None
        dx, dweight = add_backward(dy, dh, h, weight, rstd, weight is not None and ctx.needs_input_grad[2])
        return dx, dx, dweight if weight is not None and ctx.needs_input_grad[2] else None, None


_add_apply = fast_apply(_AddRMSNorm)


def _add_custom_ops():
    backward_op = custom_op(
        "add_rms_norm_backward",
        "(Tensor dy, Tensor? d_new_residual, Tensor new_residual, Tensor? weight, Tensor rstd, bool need_dweight)"
        " -> (Tensor, Tensor)",
        lambda dy, dh, h, weight, rstd, need_dw: add_backward(dy, dh, h, weight, rstd, need_dw),
        lambda dy, dh, h, weight, rstd, need_dw: (_contiguous_like(h),
                                                  h.new_empty(h.shape[-1] if need_dw and weight is not None else 0)))

    def setup(ctx, inputs, output):
        _, _, weight, _ = inputs
        _, h, rstd = output
        ctx.save_for_backward(h, weight, rstd)
        ctx.has_weight = weight is not None

    def backward_formula(ctx, dy, dh, _drstd):
        h, weight, rstd = ctx.saved_tensors
        dy = torch.zeros_like(h) if dy is None else dy
        dx, dweight = backward_op(dy, dh, h, weight, rstd, ctx.has_weight)
        return dx, dx, dweight if ctx.has_weight else None, None

    return custom_op(
        "add_rms_norm_forward", "(Tensor x, Tensor residual, Tensor? weight, float? eps) -> (Tensor, Tensor, Tensor)",
        add_forward,
        lambda x, residual, weight, eps: (_contiguous_like(x), _contiguous_like(x),
                                          x.new_empty(x.shape[:-1], dtype=torch.float32)),
        backward_formula, setup)


_ADD_FORWARD_OP = _add_custom_ops()


def add_rms_norm(x, residual, weight=None, eps=None):
    """(normed, new_residual): new_residual = x + residual (x's dtype, as torch's add), normed =
    rms_norm(new_residual) * weight over the last dim, in one pass (Liger's fused_add_rms_norm; HF's
    `residual = residual + h; h = norm(residual)`). eps=None is the dtype's machine epsilon, as
    F.rms_norm. Gradients flow to x, residual (the same tensor: an add passes its gradient to both)
    and weight; deterministic dweight."""
    for name, t in (("x", x), ("residual", residual)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}, expected {tuple(x.shape)} like x")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the norm works over the last dim)")
    x, residual, weight = row_strided(x), row_strided(residual), dense(weight)
    if not compiling():
        checked(x, "x")
        checked(residual, "residual", like=x)
        if weight is not None:
            checked(weight, "weight", like=x)
    if compiling():
        y, h, _ = _ADD_FORWARD_OP(x, residual, weight, eps)
        return y, h
    if needs_grad(x, residual, weight):
        return _add_apply(x, residual, weight, eps)
    y, h, _ = add_forward(x, residual, weight, eps)
    return y, h


class AddRMSNorm(torch.nn.Module):
    """A transformer block's residual add and its next RMSNorm: forward(x, residual) -> (normed,
    new_residual). One parameter, `weight` (ones), so it loads a transformers LlamaRMSNorm (or
    torch.nn.RMSNorm) state_dict unchanged; eps as LlamaRMSNorm's (1e-6 by default)."""

    def __init__(self, hidden_size, eps=1e-6, device=None, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x, residual):
        return add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
