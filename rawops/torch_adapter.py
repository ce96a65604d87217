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
from ._launch import register_torch, sm_count

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# torch's raw queries cost far less than torch.cuda.current_stream(); CPU builds lack them.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
# The tensor checks and launches run in the Cython launcher (MapKernel.torch_call); it gets
# torch's types and entry points from here, so that rawops itself never imports torch.
register_torch(torch.Tensor, (torch.float32, torch.float16, torch.bfloat16), torch.empty_like, _raw_stream,
               _current_device, torch.cuda.device)


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


_GELU_KERNELS = {(approximate, direction, bias): _ew.MAP[f"{'bias_' if bias else ''}gelu_{mode}_{direction}"]
                 for approximate, mode in _ew._GELU_MODES.items()
                 for direction in ("fwd", "bwd") for bias in (False, True)}
_RELU, _RELU_BWD = _ew.MAP["relu_fwd"], _ew.MAP["relu_bwd"]
_RELU_SCALE, _RELU_SCALE_BWD = _ew.MAP["relu_scale_fwd"], _ew.MAP["relu_scale_bwd"]
_RELU_SCALE_ADD, _ADD = _ew.MAP["relu_scale_add_fwd"], _ew.MAP["add_fwd"]


def _gelu_kernel(approximate, direction, bias=False):
    kernel = _GELU_KERNELS.get((approximate, direction, bias))
    if kernel is None:
        _ew._gelu_mode(approximate)  # raises the ValueError naming the choices
    return kernel


# ------------------------------------------------------------------- raw launches (no autograd)
def _gelu_fwd(x, approximate):
    return _gelu_kernel(approximate, "fwd").torch_call(x)


def _gelu_bwd(dy, x, approximate):
    return _gelu_kernel(approximate, "bwd").torch_call(_contiguous(dy), x)


def _relu_fwd(x):
    return _RELU.torch_call(x)


def _relu_bwd(dy, x):
    return _RELU_BWD.torch_call(_contiguous(dy), x)


def _relu_scale_fwd(x, alpha):
    return _RELU_SCALE.torch_call(x, alpha=alpha)


def _relu_scale_bwd(dy, x, alpha):
    return _RELU_SCALE_BWD.torch_call(_contiguous(dy), x, alpha=alpha)


def _relu_scale_add_fwd(x, alpha, y):
    return _RELU_SCALE_ADD.torch_call(x, y, alpha=alpha)


def _add_fwd(a, b):
    return _ADD.torch_call(a, b)


def _bias_gelu_fwd(x, bias, approximate):
    return _gelu_kernel(approximate, "fwd", bias=True).torch_call(x, c=bias)


def _bias_gelu_bwd(dy, x, bias, approximate):
    dx = _gelu_kernel(approximate, "bwd", bias=True).torch_call(_contiguous(dy), x, c=bias)
    return dx, _column_sum(dx)


# ------------------------------------------------------------------- eager autograd
class _GELU(torch.autograd.Function):
    # The kernels travel as arguments: the hottest path (gelu on a tensor that requires grad)
    # then runs no Python between the C++ apply and the launch but this forward.
    @staticmethod
    def forward(ctx, x, forward_kernel, backward_kernel):
        ctx.save_for_backward(x)
        ctx.backward_kernel = backward_kernel
        return forward_kernel.torch_call(x)

    @staticmethod
    def backward(ctx, dy):
        return ctx.backward_kernel.torch_call(_contiguous(dy), ctx.saved_tensors[0]), None, None


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
# Each function picks the cheapest path that is correct: the raw launch when no autograd is
# needed; else the autograd.Function, entered through the C++ apply (Function.apply's Python
# preamble, default-arg binding and functorch unwrapping, costs ~2 us and does nothing when
# no functorch transform is active); under torch.compile the custom op.
_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_functorch_active = torch._C._are_functorch_transforms_active
_c_apply = torch._C._FunctionBase.__dict__["apply"]


def _apply(function):
    fast = _c_apply.__get__(None, function)
    return lambda *args: fast(*args) if not _functorch_active() else function.apply(*args)


_gelu_c_apply = _c_apply.__get__(None, _GELU)
_relu_apply, _relu_scale_apply = _apply(_ReLU), _apply(_ReLUScale)
_relu_scale_add_apply, _add_apply, _bias_gelu_apply = _apply(_ReLUScaleAdd), _apply(_Add), _apply(_BiasGELU)


def _needs_grad(*tensors):
    return _grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def gelu(x, approximate="tanh"):
    """torch.nn.functional.gelu(x, approximate) on rawops kernels ('tanh' or 'none')."""
    if _compiling():
        return _gelu_op(x, approximate)
    forward_kernel = _gelu_kernel(approximate, "fwd")
    if getattr(x, "requires_grad", False) and _grad_enabled():
        backward_kernel = _GELU_KERNELS[approximate, "bwd", False]
        if _functorch_active():
            return _GELU.apply(x, forward_kernel, backward_kernel)
        return _gelu_c_apply(x, forward_kernel, backward_kernel)
    return forward_kernel.torch_call(x)


def relu(x):
    if _compiling():
        return _relu_op(x)
    if getattr(x, "requires_grad", False) and _grad_enabled():
        return _relu_apply(x)
    return _RELU.torch_call(x)


def relu_scale(x, alpha):
    """relu(x) * alpha in one kernel."""
    alpha = float(alpha)
    if _compiling():
        return _relu_scale_op(x, alpha)
    if getattr(x, "requires_grad", False) and _grad_enabled():
        return _relu_scale_apply(x, alpha)
    return _RELU_SCALE.torch_call(x, alpha=alpha)


def relu_scale_add(x, alpha, y):
    """relu(x) * alpha + y in one kernel."""
    alpha = float(alpha)
    if _compiling():
        return _relu_scale_add_op(x, alpha, y)
    if _needs_grad(x, y):
        return _relu_scale_add_apply(x, alpha, y)
    return _RELU_SCALE_ADD.torch_call(x, y, alpha=alpha)


def add(a, b):
    if _compiling():
        return _add_op(a, b)
    if _needs_grad(a, b):
        return _add_apply(a, b)
    return _ADD.torch_call(a, b)


def bias_gelu(x, bias, approximate="tanh"):
    """gelu(x + bias), bias broadcast over the last dim, in one kernel."""
    if _compiling():
        return _bias_gelu_op(x, bias, approximate)
    if _needs_grad(x, bias):
        return _bias_gelu_apply(x, bias, approximate)
    return _gelu_kernel(approximate, "fwd", bias=True).torch_call(x, c=bias)


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
