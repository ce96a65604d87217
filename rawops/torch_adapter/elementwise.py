"""The elementwise family for torch: gelu, relu, relu_scale, relu_scale_add, add, bias_gelu
(functions with torch.nn.functional's signatures where it has one), their autograd, their
`rawops::` custom ops and the modules GELU, ReLU, ReLUScale, BiasGELU.

Tensors of any layout run the kernels in place of torch's, no copy: contiguous ones the
contiguous kernels, strided ones (views with steps or offsets, transposes, autograd's broadcast
stride-0 gradients, an in-place relu on a view) the strided kernels. A result takes
torch.empty_like of the first operand, as torch's own ops do (the operand's strides where it is
dense, else contiguous); bias_gelu's backward returns a contiguous dx. What still copies: the
fused bias_gelu backward (one pass for dx and dbias) takes contiguous operands only, so strided
ones run dx then its column sums instead; and a strided tensor of more dims of more than one
element than the strided kernels take (rawops._constants.MAP_MAX_DIMS) is copied first.
"""
import torch

from .. import _constants, _modules, elementwise as _ew
from .._launch import TorchMapEntry, map_call, sm_count
from ._common import (checked, compiling, custom_op, dense, fast_apply, functorch_active, grad_enabled, like,
                      needs_grad, on_device, raw_stream, real_scalar, save_inputs, substitute_in_graph)

_GELU_KERNELS = {(approximate, direction, bias): _ew.MAP[f"{'bias_' if bias else ''}gelu_{mode}_{direction}"]
                 for approximate, mode in _ew.GELU_MODES.items()
                 for direction in ("fwd", "bwd") for bias in (False, True)}
_GELU_FWD = {a: _GELU_KERNELS[(a, "fwd", False)] for a in _ew.GELU_MODES}  # by approximate: the hot lookup
_GELU_BWD = {a: _GELU_KERNELS[(a, "bwd", False)] for a in _ew.GELU_MODES}
_RELU, _RELU_BWD = _ew.MAP["relu_fwd"], _ew.MAP["relu_bwd"]
_RELU_SCALE, _RELU_SCALE_BWD = _ew.MAP["relu_scale_fwd"], _ew.MAP["relu_scale_bwd"]
_RELU_SCALE_ADD, _ADD = _ew.MAP["relu_scale_add_fwd"], _ew.MAP["add_fwd"]
# The operands' names in the public signatures (torch's), for the errors of the public paths.
_INPUT, _INPUT_OTHER, _INPUT_BIAS = ("input",), ("input", "other"), ("input", "bias")


def gelu_kernel(approximate, direction, bias=False):
    """The MapKernel of gelu / bias_gelu in `direction` ('fwd', 'bwd'); ValueError naming
    approximate unless it is 'none' or 'tanh'."""
    try:
        kernel = _GELU_KERNELS.get((approximate, direction, bias))
    except TypeError:  # unhashable: gelu_mode names the argument
        kernel = None
    if kernel is None:
        _ew.gelu_mode(approximate)
    return kernel


# ------------------------------------------------------------------- raw launches (no autograd)
# Operands of any layout (map_call: the strided kernels where one is strided); each result is
# torch.empty_like(first operand), as the custom ops' fake kernels below say.
def gelu_forward(x, approximate):
    return map_call(gelu_kernel(approximate, "fwd"), x)


def gelu_backward(dy, x, approximate):
    """dx = dy * gelu'(x)."""
    return map_call(gelu_kernel(approximate, "bwd"), dy, x)


def relu_forward(x):
    return map_call(_RELU, x)


def relu_backward(dy, y):
    """dx = dy where y > 0 (y: relu's input or output; the same sign), else 0."""
    return map_call(_RELU_BWD, dy, y)


def relu_scale_forward(x, alpha):
    return map_call(_RELU_SCALE, x, alpha=alpha)


def relu_scale_backward(dy, x, alpha):
    """dx = dy * alpha where x > 0, else 0."""
    return map_call(_RELU_SCALE_BWD, dy, x, alpha=alpha)


def relu_scale_add_forward(x, alpha, y):
    return map_call(_RELU_SCALE_ADD, x, y, alpha=alpha)


def add_forward(a, b):
    return map_call(_ADD, a, b)


def bias_gelu_forward(x, bias, approximate):
    return map_call(gelu_kernel(approximate, "fwd", bias=True), x, c=bias)


def bias_gelu_backward(dy, x, bias, approximate):
    """(dx, dbias): dx = dy * gelu'(x + bias) and its sum over the leading dims, in one pass over
    dy and x where the fused kernel applies (contiguous operands: rawops.elementwise.
    bias_gelu_bwd_plan), else dx (strided operands: the strided kernel) and then its column sums;
    deterministic either way. dx and dbias are contiguous."""
    kernel = gelu_kernel(approximate, "bwd", bias=True)
    fused = bias_gelu_backward_fused(dy, x, bias, approximate)
    if fused is not None:
        return fused
    dx = map_call(kernel, dy, x, c=bias, out=_contiguous_like(dy)) if isinstance(dy, torch.Tensor) else \
        map_call(kernel, dy, x, c=bias)  # not a tensor: map_call names it
    return dx, column_sum(dx)


def _contiguous_like(t):
    return t.new_empty(t.shape)


def bias_gelu_backward_fused(dy, x, bias, approximate):
    """(dx, dbias) in one pass over dy and x, or None where the fused kernel does not apply (an
    operand that is not contiguous, a width or alignment it does not take) or a shape differs
    (the unfused path then raises the errors). bias None: dx = dy * gelu'(x) and its column
    sums (linear_gelu's dpre and dbias)."""
    if any(isinstance(t, torch.Tensor) and not t.is_contiguous() for t in (dy, x, bias)):
        return None
    code = checked(dy, "dy")
    checked(x, "x", dy, "dy")
    if bias is not None:
        checked(bias, "bias", dy, "dy")
    if x.shape != dy.shape or x.dim() == 0 or (bias is not None and (bias.dim() != 1 or bias.shape[0] != x.shape[-1])):
        return None
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    device = x.get_device()
    bias_ptr = bias.data_ptr() if bias is not None else 0
    plan = _ew.bias_gelu_bwd_plan(rows, cols, code, (dy.data_ptr(), x.data_ptr(), bias_ptr), sm_count(device),
                                  _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM))
    if plan is None:
        return None
    dx, dbias = x.new_empty(*x.shape), x.new_empty(cols)  # sizes as ints: the cheapest allocation
    partial = x.new_empty(plan[1], cols, dtype=torch.float32)
    on_device(device, _ew.launch_bias_gelu_backward, device, code, approximate, plan, dy.data_ptr(), x.data_ptr(),
              bias_ptr, dx.data_ptr(), partial.data_ptr(), dbias.data_ptr(), rows, cols, raw_stream(device))
    return dx, dbias


def column_sum(x):
    """Deterministic sum over the leading dims (dbias), the kernels of rawops.column_sum."""
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    if rows == 0 or cols == 0:
        return torch.zeros(cols, dtype=x.dtype, device=x.device)
    device = x.get_device()
    chunks, rows_per_chunk = _ew.column_sum_plan(rows, cols, _modules.device_threads(device))
    partial = torch.empty((chunks, cols), dtype=torch.float32, device=x.device)
    out = torch.empty(cols, dtype=x.dtype, device=x.device)
    on_device(device, _ew.launch_column_sum, device, checked(x, "dx"), x.data_ptr(), partial.data_ptr(),
              out.data_ptr(), rows, cols, chunks, rows_per_chunk, raw_stream(device))
    return out


# ------------------------------------------------------------------- eager autograd
class _GELU(torch.autograd.Function):
    # The kernels travel as arguments: the hottest path (gelu on a tensor that requires grad)
    # then runs no Python between the C++ apply and the launch but this forward.
    @staticmethod
    def forward(ctx, x, forward_kernel, backward_kernel):
        ctx.save_for_backward(x)
        ctx.backward_kernel = backward_kernel
        return map_call(forward_kernel, x, names=_INPUT)

    @staticmethod
    def backward(ctx, dy):  # dy of any layout (a broadcast stride-0 gradient included)
        return map_call(ctx.backward_kernel, dy, ctx.saved_tensors[0]), None, None


class _ReLU(torch.autograd.Function):
    # The backward reads the output (positive exactly where the input is), so the in-place
    # form, which overwrites the input, has what it needs.
    @staticmethod
    def forward(ctx, x, inplace):
        if inplace:
            ctx.mark_dirty(x)
            y = map_call(_RELU, x, out=x, names=_INPUT)
        else:
            y = map_call(_RELU, x, names=_INPUT)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        return relu_backward(dy, ctx.saved_tensors[0]), None


class _ReLUScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return map_call(_RELU_SCALE, x, alpha=alpha, names=_INPUT)

    @staticmethod
    def backward(ctx, dy):
        return relu_scale_backward(dy, ctx.saved_tensors[0], ctx.alpha), None


class _ReLUScaleAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, y):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return map_call(_RELU_SCALE_ADD, x, y, alpha=alpha, names=_INPUT_OTHER)

    @staticmethod
    def backward(ctx, dy):
        return relu_scale_backward(dy, ctx.saved_tensors[0], ctx.alpha), None, dy


class _Add(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return map_call(_ADD, a, b, names=_INPUT_OTHER)

    @staticmethod
    def backward(ctx, dy):
        return dy, dy


class _BiasGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate):
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        return map_call(gelu_kernel(approximate, "fwd", bias=True), x, c=bias, names=_INPUT_BIAS)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, dbias = bias_gelu_backward(dy, x, bias, ctx.approximate)
        return dx, dbias, None


_gelu_c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _GELU)
_relu_apply, _relu_scale_apply = fast_apply(_ReLU), fast_apply(_ReLUScale)
_relu_scale_add_apply, _add_apply, _bias_gelu_apply = fast_apply(_ReLUScaleAdd), fast_apply(_Add), fast_apply(_BiasGELU)

# ------------------------------------------------------------------- torch.library ops (compile)
_gelu_bwd_op = custom_op("gelu_backward", "(Tensor dy, Tensor x, str approximate) -> Tensor",
                         gelu_backward, lambda dy, x, approximate: torch.empty_like(dy))
_gelu_op = custom_op(
    "gelu", "(Tensor x, str approximate) -> Tensor", gelu_forward, like,
    lambda ctx, dy: (_gelu_bwd_op(dy, ctx.saved_tensors[0], ctx.scalars[0]), None), save_inputs)
_relu_bwd_op = custom_op("relu_backward", "(Tensor dy, Tensor y) -> Tensor", relu_backward,
                         lambda dy, y: torch.empty_like(dy))
_relu_op = custom_op("relu", "(Tensor x) -> Tensor", relu_forward, like,
                     lambda ctx, dy: (_relu_bwd_op(dy, ctx.saved_tensors[0]),),
                     lambda ctx, inputs, output: ctx.save_for_backward(output))
_relu_scale_bwd_op = custom_op("relu_scale_backward", "(Tensor dy, Tensor x, float alpha) -> Tensor",
                               relu_scale_backward, lambda dy, x, alpha: torch.empty_like(dy))
_relu_scale_op = custom_op(
    "relu_scale", "(Tensor x, float alpha) -> Tensor", relu_scale_forward, like,
    lambda ctx, dy: (_relu_scale_bwd_op(dy, ctx.saved_tensors[0], ctx.scalars[0]), None), save_inputs)
_relu_scale_add_op = custom_op(
    "relu_scale_add", "(Tensor x, float alpha, Tensor y) -> Tensor", relu_scale_add_forward, like,
    lambda ctx, dy: (_relu_scale_bwd_op(dy, ctx.saved_tensors[0], ctx.scalars[0]), None, dy), save_inputs)
_add_op = custom_op("add", "(Tensor a, Tensor b) -> Tensor", add_forward, like,
                    lambda ctx, dy: (dy, dy), save_inputs)
_bias_gelu_bwd_op = custom_op(
    "bias_gelu_backward", "(Tensor dy, Tensor x, Tensor bias, str approximate) -> (Tensor, Tensor)",
    bias_gelu_backward, lambda dy, x, bias, approximate: (_contiguous_like(dy), _contiguous_like(bias)))
_bias_gelu_op = custom_op(
    "bias_gelu", "(Tensor x, Tensor bias, str approximate) -> Tensor", bias_gelu_forward, like,
    lambda ctx, dy: (*_bias_gelu_bwd_op(dy, *ctx.saved_tensors, ctx.scalars[0]), None), save_inputs)


# ------------------------------------------------------------------- public functions
# Each Python function picks the cheapest correct path: under torch.compile the custom op; the
# autograd.Function through the C++ apply when a gradient is needed; else the raw launch. They
# are what the C-level entries below defer to (gradients, compile, layouts of too many dims,
# errors) and what dynamo traces in the entries' place. Strided operands go to the kernels as
# they are; only a layout the strided kernels cannot take is copied first (_strided_ok).
def _gelu_python(input, approximate="none"):
    if compiling():
        return _gelu_op(input, approximate)
    forward_kernel = gelu_kernel(approximate, "fwd")
    input = _launchable(input)
    if getattr(input, "requires_grad", False) and grad_enabled():
        backward_kernel = _GELU_BWD[approximate]
        if functorch_active():
            return _GELU.apply(input, forward_kernel, backward_kernel)
        return _gelu_c_apply(input, forward_kernel, backward_kernel)
    return map_call(forward_kernel, input, names=_INPUT)


def _relu_python(input, inplace=False):
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {type(inplace).__name__}")
    if compiling():
        y = _relu_op(input)
        return input.copy_(y) if inplace else y
    if inplace and not _strided_ok(input):  # the kernel writes a dense copy, then back
        return input.copy_(_relu_python(input.contiguous()))
    if getattr(input, "requires_grad", False) and grad_enabled():
        return _relu_apply(input if inplace else _launchable(input), inplace)
    return map_call(_RELU, input, out=input, names=_INPUT) if inplace else map_call(_RELU, _launchable(input),
                                                                                    names=_INPUT)


def _relu_scale_python(input, alpha):
    alpha = real_scalar(alpha, "alpha")
    if compiling():
        return _relu_scale_op(input, alpha)
    input = _launchable(input)
    if getattr(input, "requires_grad", False) and grad_enabled():
        return _relu_scale_apply(input, alpha)
    return map_call(_RELU_SCALE, input, alpha=alpha, names=_INPUT)


def _relu_scale_add_python(input, alpha, other):
    alpha = real_scalar(alpha, "alpha")
    if compiling():
        return _relu_scale_add_op(input, alpha, other)
    input, other = _launchable(input, other)
    if needs_grad(input, other):
        return _relu_scale_add_apply(input, alpha, other)
    return map_call(_RELU_SCALE_ADD, input, other, alpha=alpha, names=_INPUT_OTHER)


def _add_python(input, other):
    if compiling():
        return _add_op(input, other)
    input, other = _launchable(input, other)
    if needs_grad(input, other):
        return _add_apply(input, other)
    return map_call(_ADD, input, other, names=_INPUT_OTHER)


def _bias_gelu_python(input, bias, approximate="none"):
    if compiling():
        return _bias_gelu_op(input, bias, approximate)
    kernel = gelu_kernel(approximate, "fwd", bias=True)
    input, bias = _launchable(input, bias)
    if needs_grad(input, bias):
        return _bias_gelu_apply(input, bias, approximate)
    return map_call(kernel, input, c=bias, names=_INPUT_BIAS)


def _strided_ok(t):
    """Whether the map kernels take t as it is, whatever the other operands' layouts: contiguous,
    or at most rawops._constants.MAP_MAX_DIMS dims of more than one element (anything that is
    not a tensor too: the launcher's checks name it)."""
    if not isinstance(t, torch.Tensor) or t.is_contiguous():
        return True
    return sum(size != 1 for size in t.shape) <= _constants.MAP_MAX_DIMS


def _launchable(*tensors):
    """Each tensor as it is, or a contiguous copy where its layout is more than the strided
    kernels take; one tensor, or a tuple for several."""
    out = tuple(t if _strided_ok(t) else dense(t) for t in tensors)
    return out[0] if len(out) == 1 else out


# The public functions: bound methods of rawops._launch.TorchMapEntry (C-level callables: the
# no-grad eager call, strided tensors included, is one C call into the kernel's launch).
# Everything else goes to the Python functions above.
gelu = TorchMapEntry(dict(_GELU_FWD), _gelu_python).gelu
relu = TorchMapEntry({None: _RELU}, _relu_python).relu
relu_scale = TorchMapEntry({None: _RELU_SCALE}, _relu_scale_python).relu_scale
relu_scale_add = TorchMapEntry({None: _RELU_SCALE_ADD}, _relu_scale_add_python).relu_scale_add
add = TorchMapEntry({None: _ADD}, _add_python).add
bias_gelu = TorchMapEntry({a: gelu_kernel(a, "fwd", bias=True) for a in _ew.GELU_MODES}, _bias_gelu_python).bias_gelu
for _entry in (gelu, relu, relu_scale, relu_scale_add, add, bias_gelu):
    substitute_in_graph(_entry, _entry.__self__.fallback)


# ------------------------------------------------------------------- modules
class GELU(torch.nn.Module):
    """Drop-in torch.nn.GELU."""

    def __init__(self, approximate="none"):
        super().__init__()
        _ew.gelu_mode(approximate)
        self.approximate = approximate

    def forward(self, input):
        return gelu(input, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class ReLU(torch.nn.Module):
    """Drop-in torch.nn.ReLU."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return relu(input, self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLUScale(torch.nn.Module):
    """relu(x) * alpha."""

    def __init__(self, alpha):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, input):
        return relu_scale(input, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class BiasGELU(torch.nn.Module):
    """gelu(x + bias) with a learnable bias of `features` values (zeros at start)."""

    def __init__(self, features, approximate="none", device=None, dtype=None):
        super().__init__()
        _ew.gelu_mode(approximate)
        self.approximate = approximate
        self.bias = torch.nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, input):
        return bias_gelu(input, self.bias, self.approximate)

    def extra_repr(self):
        return f"{self.bias.shape[0]}, approximate={self.approximate!r}"
