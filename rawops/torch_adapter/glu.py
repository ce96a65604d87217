"""The glu family for torch: swiglu, geglu and their packed forms (one (..., 2F) gate/up tensor),
their autograd, `rawops::` custom ops, and SwiGLUMLP, which loads a transformers LlamaMLP
state_dict unchanged.

swiglu(gate, up) = F.silu(gate) * up; geglu(gate, up, approximate="tanh") = F.gelu(gate,
approximate=approximate) * up (default "tanh", as Liger-Kernel and Gemma; F.gelu's default is
"none"); swiglu_fused(x) / geglu_fused(x, approximate) take gate = x[..., :F] (the first half) and
up = x[..., F:] (HF's Phi3MLP `gate_up_proj` split). gate and up have one shape (no broadcasting).
The backward recomputes the activation from gate and up: autograd saves only them.

Layouts: gate, up, x and the incoming gradient run as they are where their rows are consecutive
elements at one stride (a contiguous tensor, `t[:, :F]`, `t[::2]`); any other layout is copied
first (one extra read and write of it). Results and gradients are new contiguous tensors.
"""
import torch

from .. import _rows, glu as _glu
from .._launch import tensor_code
from ._common import compiling, custom_op, fast_apply, needs_grad, on_device, raw_stream
from .norm import row_strided


def checked(t, name, like=None, like_name="gate"):
    """The dtype code of a tensor operand after the launcher's checks (CUDA; float32, float16 or
    bfloat16; with `like`, its dtype and GPU), any layout; TypeError / ValueError naming it."""
    return tensor_code(t, name, like, like_name, False)


def _row_stride(t):
    n = t.shape[-1]
    return n if t.is_contiguous() else _rows.collapsed_row_stride(tuple(t.shape), t.stride())


def _operand(t, name, like=None, like_name="gate", shape=None):
    """t row-strided (or copied), checked; (t, dtype code, row stride)."""
    t = row_strided(t)
    code = checked(t, name, like, like_name)
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the op works over the last dim)")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t, code, _row_stride(t)


def _packed_width(x, name="x"):
    if x.shape[-1] % 2:
        raise ValueError(f"{name} has {x.shape[-1]} columns in its last dim; a packed gate/up tensor has 2F: gate "
                         "the first F, up the last F")
    return x.shape[-1] // 2


# ------------------------------------------------------------------- raw launches (no autograd)
def forward(base, gate, up):
    """act(gate) * up (base: 'swiglu', 'geglu_tanh', 'geglu_erf'), a new contiguous tensor."""
    gate, code, gs = _operand(gate, "gate")
    up, _, us = _operand(up, "up", like=gate, shape=gate.shape)
    out = gate.new_empty(gate.shape)
    f = gate.shape[-1]
    rows = gate.numel() // f if f else 0
    if rows and f:
        device = gate.get_device()
        on_device(device, _glu.launch_forward, base, device, code, gate.element_size(), gate.data_ptr(),
                  up.data_ptr(), out.data_ptr(), rows, f, (gs, us, f), raw_stream(device))
    return out


def backward(base, dy, gate, up, inplace=False):
    """(d_gate, d_up): new contiguous tensors, or, inplace, written over gate and up themselves
    (each element read before it is written, by the same thread)."""
    gate, code, gs = _operand(gate, "gate")
    up, _, us = _operand(up, "up", like=gate, shape=gate.shape)
    dy, _, ds = _operand(dy, "dy", like=gate, shape=gate.shape)
    f = gate.shape[-1]
    if inplace:
        dgate, dup, out_strides = gate, up, (gs, us)
    else:
        dgate, dup, out_strides = gate.new_empty(gate.shape), gate.new_empty(gate.shape), (f, f)
    rows = gate.numel() // f if f else 0
    if rows and f:
        device = gate.get_device()
        on_device(device, _glu.launch_backward, base, device, code, gate.element_size(), dy.data_ptr(),
                  gate.data_ptr(), up.data_ptr(), dgate.data_ptr(), dup.data_ptr(), rows, f, (ds, gs, us, *out_strides),
                  raw_stream(device))
    return dgate, dup


def forward_packed(base, x):
    """act(x[..., :F]) * x[..., F:] -> (..., F), a new contiguous tensor."""
    x, code, xs = _operand(x, "x", like_name="x")
    f = _packed_width(x)
    out = x.new_empty((*x.shape[:-1], f))
    rows = out.numel() // f if f else 0
    if rows and f:
        device = x.get_device()
        e = x.element_size()
        on_device(device, _glu.launch_forward, base, device, code, e, x.data_ptr(), x.data_ptr() + f * e,
                  out.data_ptr(), rows, f, (xs, xs, f), raw_stream(device))
    return out


def backward_packed(base, dy, x):
    """dx (..., 2F): d_gate in the first F columns, d_up in the last F; a new contiguous tensor."""
    x, code, xs = _operand(x, "x", like_name="x")
    f = _packed_width(x)
    dy, _, ds = _operand(dy, "dy", like=x, like_name="x", shape=(*x.shape[:-1], f))
    dx = x.new_empty(x.shape)
    rows = dy.numel() // f if f else 0
    if rows and f:
        device = x.get_device()
        e = x.element_size()
        on_device(device, _glu.launch_backward, base, device, code, e, dy.data_ptr(), x.data_ptr(),
                  x.data_ptr() + f * e, dx.data_ptr(), dx.data_ptr() + f * e, rows, f, (ds, xs, xs, 2 * f, 2 * f),
                  raw_stream(device))
    return dx


# ------------------------------------------------------------------- autograd and custom ops
class _GLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, base, inplace):
        ctx.save_for_backward(gate, up)
        ctx.base, ctx.inplace = base, inplace
        return forward(base, gate, up)

    @staticmethod
    def backward(ctx, dy):
        if ctx.inplace:
            if ctx.base is None:
                raise RuntimeError("SwiGLUMLP's backward wrote its gradients over the saved gate and up: it runs once "
                                   "per forward (no retain_graph=True second backward)")
            base, ctx.base = ctx.base, None
        else:
            base = ctx.base
        gate, up = ctx.saved_tensors
        dgate, dup = backward(base, dy, gate, up, ctx.inplace)
        return dgate, dup, None, None


class _GLUPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, base):
        ctx.save_for_backward(x)
        ctx.base = base
        return forward_packed(base, x)

    @staticmethod
    def backward(ctx, dy):
        return backward_packed(ctx.base, dy, ctx.saved_tensors[0]), None


_glu_apply, _packed_apply = fast_apply(_GLU), fast_apply(_GLUPacked)


def _custom_ops(base):
    """(split op, packed op) of one activation, each with its backward op and autograd formula."""
    split_backward = custom_op(
        f"{base}_backward", "(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)",
        lambda dy, gate, up: backward(base, dy, gate, up),
        lambda dy, gate, up: (gate.new_empty(gate.shape), gate.new_empty(gate.shape)))

    def split_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def split_formula(ctx, dy):
        return split_backward(dy, *ctx.saved_tensors)

    split = custom_op(base, "(Tensor gate, Tensor up) -> Tensor", lambda gate, up: forward(base, gate, up),
                      lambda gate, up: gate.new_empty(gate.shape), split_formula, split_setup)

    packed_backward = custom_op(
        f"{base}_fused_backward", "(Tensor dy, Tensor x) -> Tensor", lambda dy, x: backward_packed(base, dy, x),
        lambda dy, x: x.new_empty(x.shape))

    def packed_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def packed_formula(ctx, dy):
        return packed_backward(dy, ctx.saved_tensors[0])

    packed = custom_op(f"{base}_fused", "(Tensor x) -> Tensor", lambda x: forward_packed(base, x),
                       lambda x: x.new_empty((*x.shape[:-1], x.shape[-1] // 2)), packed_formula, packed_setup)
    return split, packed


_OPS = {base: _custom_ops(base) for base in _glu.ACTIVATIONS}


# ------------------------------------------------------------------- public functions
def _tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _split(base, gate, up, inplace_backward=False):
    _tensor(gate, "gate")
    _tensor(up, "up")
    if gate.shape != up.shape:
        raise ValueError(f"up has shape {tuple(up.shape)}, expected {tuple(gate.shape)} like gate (no broadcasting)")
    if gate.dim() == 0:
        return _split(base, gate.reshape(1), up.reshape(1)).reshape(())
    gate, up = row_strided(gate), row_strided(up)  # a layout the kernels cannot take: copied once, here
    if not compiling():  # errors name the public arguments (the custom ops check for themselves)
        checked(gate, "gate")
        checked(up, "up", like=gate)
    if compiling():
        return _OPS[base][0](gate, up)
    if needs_grad(gate, up):
        return _glu_apply(gate, up, base, inplace_backward)
    return forward(base, gate, up)


def _packed(base, x):
    _tensor(x, "x")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (a packed gate/up tensor's last dim is 2F)")
    _packed_width(x)
    x = row_strided(x)
    if not compiling():
        checked(x, "x", like_name="x")
    if compiling():
        return _OPS[base][1](x)
    if needs_grad(x):
        return _packed_apply(x, base)
    return forward_packed(base, x)


def swiglu(gate, up):
    """F.silu(gate) * up on one rawops kernel (float32 math, one rounding)."""
    return _split("swiglu", gate, up)


def geglu(gate, up, approximate="tanh"):
    """F.gelu(gate, approximate=approximate) * up on one rawops kernel; approximate 'tanh' (the
    default) or 'none'."""
    return _split(_glu.kernel_base("geglu", approximate), gate, up)


def swiglu_fused(x):
    """swiglu(x[..., :F], x[..., F:]) of a packed (..., 2F) tensor -> (..., F)."""
    return _packed("swiglu", x)


def geglu_fused(x, approximate="tanh"):
    """geglu(x[..., :F], x[..., F:], approximate) of a packed (..., 2F) tensor -> (..., F)."""
    return _packed(_glu.kernel_base("geglu", approximate), x)


# ------------------------------------------------------------------- modules
class SwiGLUMLP(torch.nn.Module):
    """transformers' LlamaMLP with its activation on rawops: down_proj(swiglu(gate_proj(x),
    up_proj(x))). The same parameters (gate_proj, up_proj, down_proj: Linear, bias optional as
    LlamaMLP's config.mlp_bias), so it loads a LlamaMLP state_dict unchanged (LlamaMLP's act_fn
    must be silu, config.hidden_act == "silu", as every Llama checkpoint has).

    Its backward writes d_gate and d_up over the gate and up projections it saved (they are its
    own intermediates: nothing else holds them, a Linear keeps its input, not its output), so
    training holds no second pair of (T, F) tensors, as Liger's SwiGLU does; a second backward
    through one forward (retain_graph=True) is a RuntimeError."""

    def __init__(self, hidden_size, intermediate_size, bias=False, device=None, dtype=None):
        super().__init__()
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    def forward(self, x):
        return self.down_proj(_split("swiglu", self.gate_proj(x), self.up_proj(x), inplace_backward=True))

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}"
