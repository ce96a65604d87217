"""The softmaxes family for torch: softmax and log_softmax with torch.nn.functional's signatures,
their autograd, `rawops::` custom ops and the modules Softmax and LogSoftmax.

The kernels work over the last dim, each row's elements consecutive, the rows at any one
stride: a contiguous tensor, or a row-strided view (`x[:, :n]` of a wider tensor, `x[::2]`,
autograd's gradient broadcast over the rows) runs as it is, input and gradient alike. What is
copied first (one extra read and write of it): an input whose last dim is not contiguous or
whose leading dims have no single stride; another `dim`, which moves that dim last in a
contiguous copy and the result back into input's layout (two extra passes over the tensor).
`dtype=` casts the input first, as torch does. Results are new contiguous tensors.
"""
import warnings

import torch

from .. import _rows as _row_plans, softmaxes as _sm
from .._launch import tensor_code
from ._common import compiling, custom_op, fast_apply, last_dim, needs_grad, on_device, raw_stream
from .norm import row_strided


def checked(t, name, like=None, like_name="x"):
    """The dtype code of a tensor operand after the launcher's checks (CUDA; float32, float16 or
    bfloat16; with `like`, its dtype and GPU), any layout, TypeError / ValueError naming it."""
    return tensor_code(t, name, like, like_name, False)


def _rows(x, name):
    """(dtype code, rows, n, row stride) of a row operand made row-strided (row_strided)."""
    code = checked(x, name)
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the op works over the last dim)")
    n = x.shape[-1]
    stride = n if x.is_contiguous() else _row_plans.collapsed_row_stride(tuple(x.shape), x.stride())
    return code, (x.numel() // n if n else 0), n, stride


def _contiguous_like(t, *rest):
    return t.new_empty(t.shape)


# ------------------------------------------------------------------- raw launches (no autograd)
def forward(op, x):
    """op ('softmax' or 'log_softmax') over x's last dim; x row-strided or copied, y contiguous."""
    x = row_strided(x)
    code, rows, n, stride = _rows(x, "x")
    y = _contiguous_like(x)
    if rows and n:
        device = x.get_device()
        on_device(device, _sm.launch_forward, op, device, code, x.element_size(), x.data_ptr(), y.data_ptr(),
                  rows, n, raw_stream(device), (stride, n))
    return y


def backward(op, dy, y):
    """dx of op from its output y: y * (dy - sum(dy * y)) for softmax, dy - exp(y) * sum(dy) for
    log_softmax, over the last dim."""
    dy, y = row_strided(dy), row_strided(y)
    code, rows, n, y_stride = _rows(y, "y")
    checked(dy, "dy", like=y, like_name="y")
    if dy.shape != y.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {tuple(y.shape)} like y")
    dy_stride = _rows(dy, "dy")[3]
    dx = _contiguous_like(y)
    if rows and n:
        device = y.get_device()
        on_device(device, _sm.launch_backward, op, device, code, y.element_size(), dy.data_ptr(), y.data_ptr(),
                  dx.data_ptr(), rows, n, raw_stream(device), (dy_stride, y_stride, n))
    return dx


# ------------------------------------------------------------------- autograd and custom ops
class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op):
        y = forward(op, x)
        ctx.save_for_backward(y)
        ctx.op = op
        return y

    @staticmethod
    def backward(ctx, dy):
        return backward(ctx.op, dy, ctx.saved_tensors[0]), None


_softmax_apply = fast_apply(_Softmax)


def _custom_op(op):
    backward_op = custom_op(f"{op}_backward", "(Tensor dy, Tensor y) -> Tensor",
                            lambda dy, y: backward(op, dy, y), lambda dy, y: _contiguous_like(y))
    return custom_op(
        op, "(Tensor x) -> Tensor", lambda x: forward(op, x), _contiguous_like,
        lambda ctx, dy: (backward_op(dy, ctx.saved_tensors[0]),),
        lambda ctx, inputs, output: ctx.save_for_backward(output))


_OPS = {op: _custom_op(op) for op in ("softmax", "log_softmax")}


# ------------------------------------------------------------------- public functions
def _implicit_dim(name, ndim, stacklevel):
    # torch.nn.functional's rule for dim=None, with its warning.
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  "as an argument.", stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


def _run(op, input, dim, stacklevel, dtype):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if dim is None:
        dim = _implicit_dim(op, input.dim(), stacklevel + 1)
    dim = last_dim(input, dim, op)
    if dtype is not None:
        input = input.to(dtype)
    if input.dim() == 0:  # a scalar is a row of one
        return _run(op, input.reshape(1), 0, stacklevel, None).reshape(())
    moved = dim != input.dim() - 1
    # a layout the kernels cannot take is copied once, here (autograd saves the copy)
    x = input.movedim(dim, -1).contiguous() if moved else row_strided(input)
    if not compiling():  # errors name the public argument (the custom ops check for themselves)
        checked(x, "input")
    if compiling():
        y = _OPS[op](x)
    elif needs_grad(x):
        y = _softmax_apply(x, op)
    else:
        y = forward(op, x)
    return y.movedim(-1, dim).contiguous() if moved else y


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """torch.nn.functional.softmax on rawops kernels: exp(x - max) / sum(exp(x - max)) over dim,
    the max subtracted first (no overflow at any magnitude)."""
    return _run("softmax", input, dim, _stacklevel, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """torch.nn.functional.log_softmax on rawops kernels: x - max - log(sum(exp(x - max))) over dim."""
    return _run("log_softmax", input, dim, _stacklevel, dtype)


# ------------------------------------------------------------------- modules
class Softmax(torch.nn.Module):
    """Drop-in torch.nn.Softmax."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return softmax(input, self.dim, _stacklevel=5)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    """Drop-in torch.nn.LogSoftmax."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return log_softmax(input, self.dim, _stacklevel=5)

    def extra_repr(self):
        return f"dim={self.dim}"
