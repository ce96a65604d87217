"""The gemm family for torch: matmul and linear_gelu (F.gelu(F.linear(...)) in one kernel), their
autograd, `rawops::` custom ops and the module LinearGELU (loads an nn.Linear state_dict).

The launches of rawops.gemm on data_ptr(), on torch's current stream, outputs from torch's
allocator. Under autograd, linear_gelu's forward also writes the pre-activation (one extra store
from the same kernel), so the backward is one elementwise pass and two GEMMs instead of three
GEMMs. Operands that are not contiguous are copied into contiguous tensors first.
"""
import torch

from .. import _gemm_reduce, _gemm_sm90, _gemm_tf32, config
from .. import gemm as _gemm
from .._launch import TorchLinearEntry, TorchMatmulEntry, register_torch_gemm
from ._common import checked, compiling, custom_op, dense, fast_apply, needs_grad, on_device, raw_stream, save_inputs
from ._common import substitute_in_graph
from .elementwise import bias_gelu_backward_fused, column_sum, gelu_backward

# The no-grad calls go through the launcher's typed path (checks, cached plan, output, launch in
# one call); it answers None for anything else and the Python functions below run.
register_torch_gemm(_gemm.linear_launch_plan, config, _gemm_reduce.THREADS, _gemm_sm90.launch_gemm)
_LINEAR_GELU_FLAGS = {approximate: flags | _gemm.EPI_BIAS_GELU for approximate, flags in _gemm.GELU_FLAGS.items()}


def _launch(device, layout, code, a, b, c, m, n, k, bias=0, aux=0, pre=0, flags=_gemm.EPI_NONE, tf32=False):
    """c = epilogue(A B) on pointers; tf32: float32 on the TF32 GEMM where its plan takes the
    shape, else exact."""
    def workspace(nbytes):  # split-K partials, from torch's allocator on the launch stream
        scratch = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))
        return scratch.data_ptr(), scratch

    if tf32 and code == 0 and on_device(device, _gemm_tf32.launch_gemm, device, layout, a, b, c, bias, aux, pre,
                                        m, n, k, flags, raw_stream(device), workspace)[0]:
        return
    on_device(device, _gemm.launch_gemm, device, layout, code, a, b, c, bias, aux, pre, m, n, k, flags,
              raw_stream(device), workspace)


# ------------------------------------------------------------------- raw launches (no autograd)
def _matmul_operands(a, b):
    code = checked(a, "a")
    checked(b, "b", like=a, like_name="a")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul takes 2-D a (M, K) and b (K, N), got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"b has shape {tuple(b.shape)}, expected ({a.shape[1]}, N): its rows must match a's columns")
    return code, a.shape[0], b.shape[1], a.shape[1]


def matmul_forward(a, b, tf32=False):
    """a (M, K) @ b (K, N), 2-D contiguous tensors of one dtype."""
    code, m, n, k = _matmul_operands(a, b)
    c = a.new_empty(m, n)  # sizes as ints: torch parses them faster than a tuple or kwargs
    if m and n:
        _launch(a.get_device(), "nn", code, a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, tf32=tf32)
    return c


def matmul_backward(dy, a, b, tf32=False):
    """(da, db) = (dy @ b^T, a^T @ dy); tf32 as the forward's (nt and tn TF32 kernels)."""
    dy = dense(dy)
    code, m, n, k = _matmul_operands(a, b)
    checked(dy, "dy", like=a, like_name="a")
    if tuple(dy.shape) != (m, n):
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {(m, n)}")
    da, db = a.new_empty(m, k), a.new_empty(k, n)
    device = a.get_device()
    if m and k:
        _launch(device, "nt", code, dy.data_ptr(), b.data_ptr(), da.data_ptr(), m, k, n, tf32=tf32)
    if k and n:
        _launch(device, "tn", code, a.data_ptr(), dy.data_ptr(), db.data_ptr(), k, n, m, tf32=tf32)
    return da, db


def _linear_operands(x, weight, bias):
    code = checked(x, "x")
    checked(weight, "weight", like=x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (its last is in_features)")
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected (out_features, {k}): torch.nn.Linear "
                         "layout, in_features = x's last dim")
    n = weight.shape[0]
    if bias is not None:
        checked(bias, "bias", like=x)
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({n},): one value per output feature")
    m = 1
    for d in x.shape[:-1]:
        m *= d
    return code, m, n, k


def linear_gelu_forward(x, weight, bias, approximate, save_preactivation):
    """(y, pre): y = gelu(x @ weight^T + bias); pre (the argument of gelu) when
    save_preactivation, else None."""
    flags = _gemm.gelu_flags(approximate) | _gemm.EPI_BIAS_GELU
    code, m, n, k = _linear_operands(x, weight, bias)
    shape = (*x.shape[:-1], n)
    y = x.new_empty(*shape)  # sizes as ints: torch parses them faster than a tuple or kwargs
    pre = x.new_empty(*shape) if save_preactivation else None
    if m and n:
        _launch(x.get_device(), "nt", code, x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, n, k,
                bias=bias.data_ptr() if bias is not None else 0, pre=pre.data_ptr() if save_preactivation else 0,
                flags=flags)
    return y, pre


def linear_gelu_backward(dy, x, weight, bias, pre, approximate, need_dx=True, need_dweight=True):
    """(dx, dweight, dbias): empty tensors for those not needed (dbias: when bias is None).
    dpre from the saved pre-activation (one elementwise pass) when `pre` holds it, else
    recomputed by a GEMM whose epilogue yields dpre directly."""
    flags = _gemm.gelu_flags(approximate)
    code, m, n, k = _linear_operands(x, weight, bias)
    dy = dense(dy)
    checked(dy, "dy", like=x)
    shape = tuple(x.shape[:-1]) + (n,)
    if tuple(dy.shape) != shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {shape}")
    device = x.get_device()
    dbias = None
    if pre is not None and pre.numel() == m * n and m * n:
        # With a bias, dpre and its column sums (dbias) in one pass where the fused kernel applies.
        fused = bias_gelu_backward_fused(dy, pre, None, approximate) if bias is not None else None
        dpre, dbias = fused if fused is not None else (gelu_backward(dy, pre, approximate), None)
    else:
        dpre = x.new_empty(*shape)
        if m and n:
            _launch(device, "nt", code, x.data_ptr(), weight.data_ptr(), dpre.data_ptr(), m, n, k,
                    bias=bias.data_ptr() if bias is not None else 0, aux=dy.data_ptr(),
                    flags=flags | _gemm.EPI_BIAS_GELU_GRAD)
    dx = x.new_empty(*x.shape) if need_dx else x.new_empty(0)
    dweight = x.new_empty(n, k) if need_dweight else x.new_empty(0)
    if need_dx and m and k:
        _launch(device, "nn", code, dpre.data_ptr(), weight.data_ptr(), dx.data_ptr(), m, k, n)
    if need_dweight and n and k:
        _launch(device, "tn", code, dpre.data_ptr(), x.data_ptr(), dweight.data_ptr(), n, k, m)
    if dbias is None:
        dbias = column_sum(dpre) if bias is not None else x.new_empty(0)
    return dx, dweight, dbias


# ------------------------------------------------------------------- autograd and custom ops
class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, tf32):
        ctx.save_for_backward(a, b)
        ctx.tf32 = tf32
        return matmul_forward(a, b, tf32)

    @staticmethod
    def backward(ctx, dy):
        return (*matmul_backward(dy, *ctx.saved_tensors, ctx.tf32), None)


class _LinearGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, approximate):
        y, pre = linear_gelu_forward(x, weight, bias, approximate, True)
        ctx.save_for_backward(x, weight, bias, pre)
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, pre = ctx.saved_tensors
        need_dx, need_dweight, need_dbias = ctx.needs_input_grad[:3]
        dx, dweight, dbias = linear_gelu_backward(dy, x, weight, bias, pre, ctx.approximate, need_dx, need_dweight)
        return (dx if need_dx else None, dweight if need_dweight else None,
                dbias if bias is not None and need_dbias else None, None)


_matmul_apply, _linear_gelu_apply = fast_apply(_Matmul), fast_apply(_LinearGELU)

_matmul_bwd_op = custom_op("matmul_backward", "(Tensor dy, Tensor a, Tensor b) -> (Tensor, Tensor)", matmul_backward,
                           lambda dy, a, b: (torch.empty_like(a), torch.empty_like(b)))
_matmul_op = custom_op(
    "matmul", "(Tensor a, Tensor b) -> Tensor", matmul_forward,
    lambda a, b: a.new_empty((a.shape[0], b.shape[1])),
    lambda ctx, dy: _matmul_bwd_op(dy, *ctx.saved_tensors), save_inputs)
# tf32=True under torch.compile: its own ops (the flag is part of what the op computes).
_matmul_tf32_bwd_op = custom_op("matmul_tf32_backward", "(Tensor dy, Tensor a, Tensor b) -> (Tensor, Tensor)",
                                lambda dy, a, b: matmul_backward(dy, a, b, True),
                                lambda dy, a, b: (torch.empty_like(a), torch.empty_like(b)))
_matmul_tf32_op = custom_op(
    "matmul_tf32", "(Tensor a, Tensor b) -> Tensor", lambda a, b: matmul_forward(a, b, True),
    lambda a, b: a.new_empty((a.shape[0], b.shape[1])),
    lambda ctx, dy: _matmul_tf32_bwd_op(dy, *ctx.saved_tensors), save_inputs)


def _linear_gelu_setup(ctx, inputs, output):
    x, weight, bias, approximate = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, bias if bias is not None else x.new_empty(0), output[1])
    ctx.approximate = approximate


def _linear_gelu_op_backward(ctx, dy, dpre):
    x, weight, bias, pre = ctx.saved_tensors
    dx, dweight, dbias = _linear_gelu_bwd_op(dy, x, weight, bias if ctx.has_bias else None, pre, ctx.approximate)
    return dx, dweight, (dbias if ctx.has_bias else None), None


_linear_gelu_bwd_op = custom_op(
    "linear_gelu_backward",
    "(Tensor dy, Tensor x, Tensor weight, Tensor? bias, Tensor pre, str approximate) -> (Tensor, Tensor, Tensor)",
    lambda dy, x, weight, bias, pre, approximate: linear_gelu_backward(dy, x, weight, bias, pre, approximate),
    lambda dy, x, weight, bias, pre, approximate: (torch.empty_like(x), torch.empty_like(weight),
                                                   torch.empty_like(bias) if bias is not None else x.new_empty(0)))
_linear_gelu_op = custom_op(
    "linear_gelu", "(Tensor x, Tensor weight, Tensor? bias, str approximate) -> (Tensor, Tensor)",
    lambda x, weight, bias, approximate: linear_gelu_forward(x, weight, bias, approximate, True),
    lambda x, weight, bias, approximate: (x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],)),
                                          x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))),
    _linear_gelu_op_backward, _linear_gelu_setup)


# ------------------------------------------------------------------- public functions
def _matmul_2d(a, b, tf32):
    if compiling():
        return _matmul_tf32_op(a, b) if tf32 else _matmul_op(a, b)
    if needs_grad(a, b):
        return _matmul_apply(a, b, tf32)
    return matmul_forward(a, b, tf32)


def _matmul_python(input, other, *, tf32=False):
    """torch.matmul's shapes on the 2-D kernel: input (..., K) or (K,), other (K, N) or (K,).
    The path of torch.compile, gradients, tf32=True, other layouts and errors."""
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32 must be a bool, got {type(tf32).__name__}")
    for name, t in (("input", input), ("other", other)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if other.dim() > 2 or input.dim() == 0 or other.dim() == 0:
        raise ValueError(f"matmul multiplies input (..., K) or (K,) by other (K, N) or (K,); got shapes "
                         f"{tuple(input.shape)} and {tuple(other.shape)} (batched other: use torch.matmul)")
    b = dense(other if other.dim() == 2 else other.unsqueeze(-1))
    if input.dim() == 2:
        c = _matmul_2d(dense(input), b, tf32)
    else:
        a = dense(input).reshape(-1, input.shape[-1]) if input.dim() > 1 else dense(input).unsqueeze(0)
        c = _matmul_2d(a, b, tf32).reshape(*input.shape[:-1], b.shape[1])
    return c if other.dim() == 2 else c.squeeze(-1)


def _linear_gelu_python(input, weight, bias=None, approximate="none"):
    """F.gelu(F.linear(input, weight, bias), approximate=approximate) in one kernel: the path of
    torch.compile, gradients, other layouts and errors."""
    input, weight = dense(input), dense(weight)
    bias = dense(bias) if bias is not None else None
    if compiling():
        return _linear_gelu_op(input, weight, bias, approximate)[0]
    if needs_grad(input, weight, bias):
        return _linear_gelu_apply(input, weight, bias, approximate)
    return linear_gelu_forward(input, weight, bias, approximate, False)[0]


# Bound methods of rawops._launch.TorchLinearEntry / TorchMatmulEntry (C-level callables: the
# no-grad eager call is one C call); dynamo traces the Python functions in their place.
linear_gelu = TorchLinearEntry(_LINEAR_GELU_FLAGS, _linear_gelu_python).linear_gelu
matmul = TorchMatmulEntry(_matmul_python).matmul
substitute_in_graph(linear_gelu, _linear_gelu_python)
substitute_in_graph(matmul, _matmul_python)


# ------------------------------------------------------------------- modules
class LinearGELU(torch.nn.Module):
    """torch.nn.Linear followed by GELU, fused: parameters named and shaped as nn.Linear's
    (weight [out_features, in_features], bias [out_features]), so an nn.Linear's state_dict
    loads unchanged, and initialised the same way."""

    def __init__(self, in_features, out_features, bias=True, approximate="none", device=None, dtype=None):
        super().__init__()
        _gemm.gelu_flags(approximate)
        self.in_features, self.out_features, self.approximate = in_features, out_features, approximate
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.Linear.reset_parameters(self)

    def forward(self, input):
        return linear_gelu(input, self.weight, self.bias, self.approximate)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, approximate={self.approximate!r}")
