"""rawops for PyTorch: functions, autograd, torch.library ops (torch.compile) and modules.

The only file of rawops that imports torch. It launches the same kernels as the CuPy API,
straight from tensors' raw pointers on torch's current stream of the tensor's device: no
DLPack round trip, nothing copied. Three paths, cheapest first:
  no grad needed, not compiling   launch directly (a native op's host cost or less);
  grad needed, eager              an autograd.Function around the same launches;
  inside torch.compile            the torch.library custom ops `rawops::<op>`, with fake
                                  (meta) kernels and registered autograd, so fullgraph works.
Everything is capturable in torch.cuda.graph: launches only, no allocation outside torch.
"""
import torch

from . import elementwise as _ew
from ._launch import sm_count

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# torch's raw queries cost far less than torch.cuda.current_stream(); CPU builds lack them.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _code(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(f"{name} has dtype {t.dtype}; rawops supports float32, float16, bfloat16")
    if not t.is_cuda:
        raise ValueError(f"{name} is on {t.device}; rawops runs on CUDA tensors")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; rawops never copies behind your back: pass {name}.contiguous()")
    return code


def _same(t, name, like, like_name):
    _code(t, name)
    if t.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {like.dtype} like {like_name}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, {like_name} on {like.device}; all arguments must be on one GPU")


def _map(kernel, a, b=None, c=None, alpha=0.0, out=None):
    """Check tensors and launch one elementwise kernel; returns out."""
    names = kernel.arg_names
    code = _code(a, names[0])
    if b is not None:
        _same(b, names[1], a, names[0])
        if b.shape != a.shape:
            raise ValueError(f"{names[1]} has shape {tuple(b.shape)}, expected {tuple(a.shape)} like {names[0]}")
    if c is not None:
        _same(c, names[-1], a, names[0])
        if a.dim() == 0 or c.shape != a.shape[-1:]:
            raise ValueError(f"{names[-1]} has shape {tuple(c.shape)}, expected ({a.shape[-1] if a.dim() else '?'},)")
    if out is None:
        out = torch.empty_like(a)
    else:
        _same(out, "out", a, names[0])
        if out.shape != a.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(a.shape)}")
    n = a.numel()
    if n:
        device = a.device.index
        launch_args = (code, a.data_ptr(), b.data_ptr() if b is not None else 0,
                       c.data_ptr() if c is not None else 0, out.data_ptr(), n,
                       c.numel() if c is not None else 1, alpha)
        if device == _current_device():
            kernel.launch_pointers(device, *launch_args, _raw_stream(device))
        else:
            with torch.cuda.device(device):
                kernel.launch_pointers(device, *launch_args, _raw_stream(device))
    return out


def _column_sum(x):
    """Deterministic sum over the leading dims (dbias), same kernels as rawops.column_sum."""
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    if rows == 0 or cols == 0:
        return torch.zeros(cols, dtype=x.dtype, device=x.device)
    device = x.device.index
    chunks, rows_per_chunk = _ew.column_sum_plan(rows, cols, sm_count(device))
    partial = torch.empty((chunks, cols), dtype=torch.float32, device=x.device)
    out = torch.empty(cols, dtype=x.dtype, device=x.device)
    with torch.cuda.device(device):
        _ew.launch_column_sum(device, _DTYPE_CODES[x.dtype], x.data_ptr(), partial.data_ptr(), out.data_ptr(),
                              rows, cols, chunks, rows_per_chunk, _raw_stream(device))
    return out


def _contiguous(grad):
    # Autograd may hand a broadcast (stride-0) gradient, e.g. from .sum(); kernels need dense.
    return grad if grad.is_contiguous() else grad.contiguous()


def _gelu_kernel(approximate, direction, bias=False):
    return _ew.MAP[f"{'bias_' if bias else ''}gelu_{_ew._gelu_mode(approximate)}_{direction}"]


# ------------------------------------------------------------------- raw launches (no autograd)
def _gelu_fwd(x, approximate):
    return _map(_gelu_kernel(approximate, "fwd"), x)


def _gelu_bwd(dy, x, approximate):
    return _map(_gelu_kernel(approximate, "bwd"), _contiguous(dy), x)


def _relu_fwd(x):
    return _map(_ew.MAP["relu_fwd"], x)


def _relu_bwd(dy, x):
    return _map(_ew.MAP["relu_bwd"], _contiguous(dy), x)


def _relu_scale_fwd(x, alpha):
    return _map(_ew.MAP["relu_scale_fwd"], x, alpha=alpha)


def _relu_scale_bwd(dy, x, alpha):
    return _map(_ew.MAP["relu_scale_bwd"], _contiguous(dy), x, alpha=alpha)


def _relu_scale_add_fwd(x, alpha, y):
    return _map(_ew.MAP["relu_scale_add_fwd"], x, y, alpha=alpha)


def _add_fwd(a, b):
    return _map(_ew.MAP["add_fwd"], a, b)


def _bias_gelu_fwd(x, bias, approximate):
    return _map(_gelu_kernel(approximate, "fwd", bias=True), x, c=bias)


def _bias_gelu_bwd(dy, x, bias, approximate):
    dx = _map(_gelu_kernel(approximate, "bwd", bias=True), _contiguous(dy), x, c=bias)
    return dx, _column_sum(dx)


# ------------------------------------------------------------------- eager autograd
class _GELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return _gelu_fwd(x, approximate)

    @staticmethod
    def backward(ctx, dy):
        return _gelu_bwd(dy, ctx.saved_tensors[0], ctx.approximate), None


class _ReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _relu_fwd(x)

    @staticmethod
    def backward(ctx, dy):
        return _relu_bwd(dy, ctx.saved_tensors[0])


class _ReLUScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return _relu_scale_fwd(x, alpha)

    @staticmethod
    def backward(ctx, dy):
        return _relu_scale_bwd(dy, ctx.saved_tensors[0], ctx.alpha), None


class _ReLUScaleAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, y):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return _relu_scale_add_fwd(x, alpha, y)

    @staticmethod
    def backward(ctx, dy):
        return _relu_scale_bwd(dy, ctx.saved_tensors[0], ctx.alpha), None, dy


class _Add(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return _add_fwd(a, b)

    @staticmethod
    def backward(ctx, dy):
        return dy, dy


class _BiasGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate):
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        return _bias_gelu_fwd(x, bias, approximate)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, dbias = _bias_gelu_bwd(dy, x, bias, ctx.approximate)
        return dx, dbias, None


# ------------------------------------------------------------------- torch.library ops (compile)
def _custom_op(name, schema, impl, fake, backward=None, setup=None):
    op = torch.library.custom_op(f"rawops::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup)
    return op


def _save_inputs(ctx, inputs, output):
    """setup_context: save the tensor inputs, keep the others (alpha, approximate) on ctx."""
    ctx.save_for_backward(*[value for value in inputs if isinstance(value, torch.Tensor)])
    ctx.scalars = [value for value in inputs if not isinstance(value, torch.Tensor)]


def _like(x, *rest):
    return torch.empty_like(x)


_gelu_bwd_op = _custom_op("gelu_backward", "(Tensor dy, Tensor x, str approximate) -> Tensor",
                          _gelu_bwd, lambda dy, x, approximate: torch.empty_like(x))
_gelu_op = _custom_op(
    "gelu", "(Tensor x, str approximate) -> Tensor", _gelu_fwd, _like,
    lambda ctx, dy: (_gelu_bwd_op(dy, ctx.saved_tensors[0], ctx.scalars[0]), None), _save_inputs)
_relu_bwd_op = _custom_op("relu_backward", "(Tensor dy, Tensor x) -> Tensor", _relu_bwd,
                          lambda dy, x: torch.empty_like(x))
_relu_op = _custom_op("relu", "(Tensor x) -> Tensor", _relu_fwd, _like,
                      lambda ctx, dy: (_relu_bwd_op(dy, ctx.saved_tensors[0]),), _save_inputs)
_relu_scale_bwd_op = _custom_op("relu_scale_backward", "(Tensor dy, Tensor x, float alpha) -> Tensor",
                                _relu_scale_bwd, lambda dy, x, alpha: torch.empty_like(x))
_relu_scale_op = _custom_op(
    "relu_scale", "(Tensor x, float alpha) -> Tensor", _relu_scale_fwd, _like,
    lambda ctx, dy: (_relu_scale_bwd_op(dy, ctx.saved_tensors[0], ctx.scalars[0]), None), _save_inputs)
_relu_scale_add_op = _custom_op(
    "relu_scale_add", "(Tensor x, float alpha, Tensor y) -> Tensor", _relu_scale_add_fwd, _like,
    lambda ctx, dy: (_relu_scale_bwd_op(dy, ctx.saved_tensors[0], ctx.scalars[0]), None, dy),
    _save_inputs)
_add_op = _custom_op("add", "(Tensor a, Tensor b) -> Tensor", _add_fwd, _like,
                     lambda ctx, dy: (dy, dy), _save_inputs)
_bias_gelu_bwd_op = _custom_op(
    "bias_gelu_backward", "(Tensor dy, Tensor x, Tensor bias, str approximate) -> (Tensor, Tensor)",
    _bias_gelu_bwd, lambda dy, x, bias, approximate: (torch.empty_like(x), torch.empty_like(bias)))
_bias_gelu_op = _custom_op(
    "bias_gelu", "(Tensor x, Tensor bias, str approximate) -> Tensor", _bias_gelu_fwd, _like,
    lambda ctx, dy: (*_bias_gelu_bwd_op(dy, *ctx.saved_tensors, ctx.scalars[0]), None), _save_inputs)


# ------------------------------------------------------------------- public functions
def _path(*tensors):
    """'raw' when nothing needs autograd and we are not being compiled."""
    if torch.compiler.is_compiling():
        return "op"
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        return "function"
    return "raw"


def gelu(x, approximate="tanh"):
    """torch.nn.functional.gelu(x, approximate) on rawops kernels ('tanh' or 'none')."""
    path = _path(x)
    if path == "raw":
        return _gelu_fwd(x, approximate)
    return _GELU.apply(x, approximate) if path == "function" else _gelu_op(x, approximate)


def relu(x):
    path = _path(x)
    if path == "raw":
        return _relu_fwd(x)
    return _ReLU.apply(x) if path == "function" else _relu_op(x)


def relu_scale(x, alpha):
    """relu(x) * alpha in one kernel."""
    alpha = float(alpha)
    path = _path(x)
    if path == "raw":
        return _relu_scale_fwd(x, alpha)
    return _ReLUScale.apply(x, alpha) if path == "function" else _relu_scale_op(x, alpha)


def relu_scale_add(x, alpha, y):
    """relu(x) * alpha + y in one kernel."""
    alpha = float(alpha)
    path = _path(x, y)
    if path == "raw":
        return _relu_scale_add_fwd(x, alpha, y)
    return _ReLUScaleAdd.apply(x, alpha, y) if path == "function" else _relu_scale_add_op(x, alpha, y)


def add(a, b):
    path = _path(a, b)
    if path == "raw":
        return _add_fwd(a, b)
    return _Add.apply(a, b) if path == "function" else _add_op(a, b)


def bias_gelu(x, bias, approximate="tanh"):
    """gelu(x + bias), bias broadcast over the last dim, in one kernel."""
    path = _path(x, bias)
    if path == "raw":
        return _bias_gelu_fwd(x, bias, approximate)
    return _BiasGELU.apply(x, bias, approximate) if path == "function" else _bias_gelu_op(x, bias, approximate)


# ------------------------------------------------------------------- modules
class GELU(torch.nn.Module):
    """Drop-in torch.nn.GELU."""

    def __init__(self, approximate="none"):
        super().__init__()
        _ew._gelu_mode(approximate)
        self.approximate = approximate

    def forward(self, x):
        return gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class ReLU(torch.nn.Module):
    """Drop-in torch.nn.ReLU (out of place)."""

    def forward(self, x):
        return relu(x)


class ReLUScale(torch.nn.Module):
    """relu(x) * alpha."""

    def __init__(self, alpha):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        return relu_scale(x, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class BiasGELU(torch.nn.Module):
    """gelu(x + bias) with a learnable bias of `features` values (zeros at start)."""

    def __init__(self, features, approximate="tanh", device=None, dtype=None):
        super().__init__()
        _ew._gelu_mode(approximate)
        self.approximate = approximate
        self.bias = torch.nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x):
        return bias_gelu(x, self.bias, self.approximate)
