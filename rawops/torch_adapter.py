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
import importlib.abc
import importlib.util
import sys
import warnings

import torch

from . import elementwise as _ew
from ._launch import (TorchLinearEntry, TorchMapEntry, TorchMatmulEntry, register_torch, register_torch_gemm, register_torch_modules,
                      require_str, sm_count, tensor_code, torch_seed_forward, torch_seed_module_call)

# torch's raw queries cost far less than torch.cuda.current_stream(); CPU builds lack them.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
# The tensor checks and launches run in the Cython launcher (MapKernel.torch_call); it gets
# torch's types and entry points from here, so that rawops itself never imports torch.
register_torch(torch.Tensor, (torch.float32, torch.float16, torch.bfloat16), torch.empty_like, _raw_stream,
               torch.cuda.device, torch.is_grad_enabled, torch.compiler)


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
        _ew.launch_column_sum(device, tensor_code(x, "dx"), x.data_ptr(), partial.data_ptr(), out.data_ptr(),
                              rows, cols, chunks, rows_per_chunk, _raw_stream(device))
    return out


def _contiguous(grad):
    # Autograd may hand a broadcast (stride-0) gradient, e.g. from .sum(); kernels need dense.
    return grad if grad.is_contiguous() else grad.contiguous()


_GELU_KERNELS = {(approximate, direction, bias): _ew.MAP[f"{'bias_' if bias else ''}gelu_{mode}_{direction}"]
                 for approximate, mode in _ew._GELU_MODES.items()
                 for direction in ("fwd", "bwd") for bias in (False, True)}
_GELU_FWD, _GELU_BWD = _ew._GELU_FWD, _ew._GELU_BWD  # by approximate: the hot path's lookup
_RELU, _RELU_BWD = _ew.MAP["relu_fwd"], _ew.MAP["relu_bwd"]
_RELU_SCALE, _RELU_SCALE_BWD = _ew.MAP["relu_scale_fwd"], _ew.MAP["relu_scale_bwd"]
_RELU_SCALE_ADD, _ADD = _ew.MAP["relu_scale_add_fwd"], _ew.MAP["add_fwd"]


def _gelu_kernel(approximate, direction, bias=False):
    try:
        kernel = _GELU_KERNELS.get((approximate, direction, bias))
    except TypeError:  # unhashable: _gelu_mode names the argument
        kernel = None
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
    dy = _contiguous(dy)
    kernel = _gelu_kernel(approximate, "bwd", bias=True)
    fused = _bias_gelu_bwd_fused(dy, x, bias, approximate)
    if fused is not None:
        return fused
    dx = kernel.torch_call(dy, x, c=bias)
    return dx, _column_sum(dx)


def _bias_gelu_bwd_fused(dy, x, bias, approximate):
    """(dx, dbias) in one pass over dy and x (rawops.elementwise.bias_gelu_bwd_plan), or None
    where it does not apply or a shape differs: the unfused path then raises the errors.
    bias None: dx = dy * gelu'(x) and its column sums (linear_gelu's dpre and dbias)."""
    code = tensor_code(dy, "dy")
    tensor_code(x, "x", dy, "dy")
    if bias is not None:
        tensor_code(bias, "bias", dy, "dy")
    if x.shape != dy.shape or x.dim() == 0 or (bias is not None and (bias.dim() != 1 or bias.shape[0] != x.shape[-1])):
        return None
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    device = x.get_device()
    bias_ptr = bias.data_ptr() if bias is not None else 0
    plan = _ew.bias_gelu_bwd_plan(rows, cols, code, (dy.data_ptr(), x.data_ptr(), bias_ptr), sm_count(device))
    if plan is None:
        return None
    dx, dbias = x.new_empty(*x.shape), x.new_empty(cols)  # sizes as ints: the cheapest allocation
    partial = x.new_empty(plan[1], cols, dtype=torch.float32)
    _on_device(device, _ew.launch_bias_gelu_backward, device, code, approximate, plan, dy.data_ptr(), x.data_ptr(),
               bias_ptr, dx.data_ptr(), partial.data_ptr(), dbias.data_ptr(), rows, cols, _raw_stream(device))
    return dx, dbias


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


def _gelu_python(x, approximate="tanh"):
    """torch.nn.functional.gelu(x, approximate) on rawops kernels ('tanh' or 'none')."""
    if _compiling():
        return _gelu_op(x, approximate)
    forward_kernel = _GELU_FWD.get(approximate) if type(approximate) is str else None  # a list would not hash
    forward_kernel = forward_kernel or _gelu_kernel(approximate, "fwd")
    if getattr(x, "requires_grad", False) and _grad_enabled():
        backward_kernel = _GELU_BWD[approximate]
        if _functorch_active():
            return _GELU.apply(x, forward_kernel, backward_kernel)
        return _gelu_c_apply(x, forward_kernel, backward_kernel)
    return forward_kernel.torch_call(x)


def _relu_python(x):
    if _compiling():
        return _relu_op(x)
    if getattr(x, "requires_grad", False) and _grad_enabled():
        return _relu_apply(x)
    return _RELU.torch_call(x)


def _real_scalar(value, name):
    """_launch.real_scalar in Python, which dynamo traces (a Cython builtin breaks the graph)."""
    if value is None or isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _relu_scale_python(x, alpha):
    """relu(x) * alpha in one kernel."""
    alpha = _real_scalar(alpha, "alpha")
    if _compiling():
        return _relu_scale_op(x, alpha)
    if getattr(x, "requires_grad", False) and _grad_enabled():
        return _relu_scale_apply(x, alpha)
    return _RELU_SCALE.torch_call(x, alpha=alpha)


def _relu_scale_add_python(x, alpha, y):
    """relu(x) * alpha + y in one kernel."""
    alpha = _real_scalar(alpha, "alpha")
    if _compiling():
        return _relu_scale_add_op(x, alpha, y)
    if _needs_grad(x, y):
        return _relu_scale_add_apply(x, alpha, y)
    return _RELU_SCALE_ADD.torch_call(x, y, alpha=alpha)


def _add_python(a, b):
    if _compiling():
        return _add_op(a, b)
    if _needs_grad(a, b):
        return _add_apply(a, b)
    return _ADD.torch_call(a, b)


def _bias_gelu_python(x, bias, approximate="tanh"):
    """gelu(x + bias), bias broadcast over the last dim, in one kernel."""
    if _compiling():
        return _bias_gelu_op(x, bias, approximate)
    if _needs_grad(x, bias):
        return _bias_gelu_apply(x, bias, approximate)
    return _gelu_kernel(approximate, "fwd", bias=True).torch_call(x, c=bias)


# The public functions: bound methods of _launch.TorchMapEntry (C-level callables: their no-grad
# eager call is one C call into the kernel's launch, no Python frame). Gradients, torch.compile
# and errors go to the Python functions above, which dynamo traces in the entries' place.
gelu = TorchMapEntry(dict(_GELU_FWD), _gelu_python).gelu
relu = TorchMapEntry({None: _RELU}, _relu_python).relu
relu_scale = TorchMapEntry({None: _RELU_SCALE}, _relu_scale_python).relu_scale
relu_scale_add = TorchMapEntry({None: _RELU_SCALE_ADD}, _relu_scale_add_python).relu_scale_add
add = TorchMapEntry({None: _ADD}, _add_python).add
bias_gelu = TorchMapEntry({a: _gelu_kernel(a, "fwd", bias=True) for a in _ew._GELU_MODES},
                          _bias_gelu_python).bias_gelu
_ENTRIES = [gelu, relu, relu_scale, relu_scale_add, add, bias_gelu]  # + linear_gelu and matmul, defined below


def _no_typed_module_call(module, args, kwargs):
    return None  # what dynamo sees of torch_seed_module_call: FusedMLP goes through nn.Module.__call__


def _register_polyfills():
    """Tell dynamo to trace each entry's Python function in its place (an entry is a builtin
    that dynamo cannot look into)."""
    try:
        for entry in _ENTRIES:
            torch.compiler.substitute_in_graph(entry, skip_signature_check=True)(entry.__self__.fallback)
        torch.compiler.substitute_in_graph(torch_seed_module_call, skip_signature_check=True)(_no_typed_module_call)
    except Exception as error:  # a torch whose dynamo lacks this: torch.compile graph-breaks on them
        warnings.warn(f"rawops.torch_adapter: torch.compile cannot trace the elementwise ops ({error})")


class _AfterDynamoImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Registers the polyfills when torch._dynamo is first imported (torch.compile imports it):
    importing it here would add ~1.5 s to importing the adapter."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        _register_polyfills()



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


# =================================================================== normalisation and softmax
# The same launches as rawops.norm / rawops.softmax, from data_ptr() on torch's current
# stream; outputs and partial buffers come from torch's allocator (CUDA-graph safe).
import importlib  # noqa: E402

from . import norm as _norm  # noqa: E402

_sm = importlib.import_module("rawops.softmax")  # the attribute rawops.softmax is the function


_rows_code = tensor_code  # the launcher's own tensor checks, for the raw-pointer families


def _row_input(x, name="x"):
    code = _rows_code(x, name)
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the op works over the last dim)")
    n = x.shape[-1]
    return code, (x.numel() // n if n else 0), n


def _row_vector(t, name, x):
    if t is None:
        return 0
    _rows_code(t, name, like=x)
    if t.shape != x.shape[-1:]:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({x.shape[-1]},): one value per element "
                         "of x's last dim")
    return t.data_ptr()


def _on_device(device, launch, *args):
    if device == _current_device():
        return launch(*args)
    with torch.cuda.device(device):
        return launch(*args)


def _norm_fwd(op, x, weight, bias, eps):
    """(y, mean, rstd); mean is an empty tensor for rms_norm."""
    code, rows, n = _row_input(x)
    w, b = _row_vector(weight, "weight", x), _row_vector(bias, "bias", x)
    eps = _norm.check_eps(eps, code)
    y = torch.empty_like(x)
    stats = x.shape[:-1]
    mean = torch.empty(stats if op == "layer_norm" else (0,), dtype=torch.float32, device=x.device)
    rstd = torch.empty(stats, dtype=torch.float32, device=x.device)
    if rows and n:
        device = x.get_device()
        _on_device(device, _norm.launch_forward, op, device, code, x.element_size(), x.data_ptr(), w, b,
                   y.data_ptr(), mean.data_ptr() if op == "layer_norm" else 0, rstd.data_ptr(), rows, n,
                   eps, _raw_stream(device))
    elif rows:
        mean.fill_(float("nan"))
        rstd.fill_(float("nan"))
    return y, mean, rstd


def _norm_stats(t, name, x):
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
        raise ValueError(f"{name} is not contiguous; rawops never copies behind your back")


def _norm_bwd(op, dy, x, weight, mean, rstd, need_dweight, need_dbias):
    """(dx, dweight, dbias), the last two empty tensors where not wanted."""
    dy = _contiguous(dy)
    code, rows, n = _row_input(x)
    _rows_code(dy, "dy", like=x)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {tuple(x.shape)} like x")
    if op == "layer_norm":
        _norm_stats(mean, "mean", x)
    _norm_stats(rstd, "rstd", x)
    w = _row_vector(weight, "weight", x)
    need_dweight = need_dweight and weight is not None
    dx = torch.empty_like(x)
    dweight = (torch.zeros if not (rows and n) else torch.empty)(n if need_dweight else 0, dtype=x.dtype,
                                                                 device=x.device)
    dbias = (torch.zeros if not (rows and n) else torch.empty)(n if need_dbias else 0, dtype=x.dtype,
                                                               device=x.device)
    if rows and n:
        device = x.get_device()
        plan = _norm.backward_plan(rows, n, x.element_size(), sm_count(device), dy.data_ptr(), x.data_ptr(), w,
                                   dx.data_ptr())
        partial_dw = torch.empty((plan[3], n) if need_dweight else (0,), dtype=torch.float32, device=x.device)
        partial_db = torch.empty((plan[3], n) if need_dbias else (0,), dtype=torch.float32, device=x.device)
        _on_device(device, _norm.launch_backward, op, device, code, x.element_size(), dy.data_ptr(),
                   x.data_ptr(), w, mean.data_ptr() if op == "layer_norm" else 0, rstd.data_ptr(), dx.data_ptr(),
                   partial_dw.data_ptr() if need_dweight else 0, partial_db.data_ptr() if need_dbias else 0,
                   dweight.data_ptr() if need_dweight else 0, dbias.data_ptr() if need_dbias else 0, rows, n,
                   plan, _raw_stream(device))
    return dx, dweight, dbias


def _softmax_fwd(op, x):
    code, rows, n = _row_input(x)
    y = torch.empty_like(x)
    if rows and n:
        device = x.get_device()
        _on_device(device, _sm.launch_forward, op, device, code, x.element_size(), x.data_ptr(), y.data_ptr(),
                   rows, n, _raw_stream(device))
    return y


def _softmax_bwd(op, dy, y):
    dy = _contiguous(dy)
    code, rows, n = _row_input(y, "y")
    _rows_code(dy, "dy", like=y)
    if dy.shape != y.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {tuple(y.shape)} like y")
    dx = torch.empty_like(y)
    if rows and n:
        device = y.get_device()
        _on_device(device, _sm.launch_backward, op, device, code, y.element_size(), dy.data_ptr(), y.data_ptr(),
                   dx.data_ptr(), rows, n, _raw_stream(device))
    return dx


def _last_dim(x, dim):
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"dim must be the last dim (-1), got {dim}; rawops' softmax works over the last dim")


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, op):
        y, mean, rstd = _norm_fwd(op, x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.op, ctx.has_bias = op, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = _norm_bwd(ctx.op, dy, x, weight, mean, rstd, ctx.needs_input_grad[1],
                                       ctx.has_bias and ctx.needs_input_grad[2])
        return (dx, dweight if ctx.needs_input_grad[1] else None,
                dbias if ctx.has_bias and ctx.needs_input_grad[2] else None, None, None)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op):
        y = _softmax_fwd(op, x)
        ctx.save_for_backward(y)
        ctx.op = op
        return y

    @staticmethod
    def backward(ctx, dy):
        return _softmax_bwd(ctx.op, dy, ctx.saved_tensors[0]), None


def _stats_like(x, op):
    stats = x.shape[:-1] if op == "layer_norm" else (0,)
    return x.new_empty(stats, dtype=torch.float32)


def _norm_ops(op):
    """The custom ops of one norm: forward -> (y, mean, rstd), backward -> (dx, dw, db)."""
    backward_op = _custom_op(
        f"{op}_backward",
        "(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool need_dweight, bool need_dbias)"
        " -> (Tensor, Tensor, Tensor)",
        lambda dy, x, weight, mean, rstd, need_dw, need_db: _norm_bwd(op, dy, x, weight, mean, rstd, need_dw, need_db),
        lambda dy, x, weight, mean, rstd, need_dw, need_db: (
            torch.empty_like(x), x.new_empty(x.shape[-1] if need_dw and weight is not None else 0),
            x.new_empty(x.shape[-1] if need_db else 0)))

    def setup(ctx, inputs, output):
        x, weight, bias, _ = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None

    def backward(ctx, dy, _dmean, _drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = backward_op(dy, x, weight, mean, rstd, ctx.has_weight, ctx.has_bias)
        return dx, dweight if ctx.has_weight else None, dbias if ctx.has_bias else None, None

    forward_op = _custom_op(
        f"{op}_forward", "(Tensor x, Tensor? weight, Tensor? bias, float? eps) -> (Tensor, Tensor, Tensor)",
        lambda x, weight, bias, eps: _norm_fwd(op, x, weight, bias, eps),
        lambda x, weight, bias, eps: (torch.empty_like(x), _stats_like(x, op),
                                      x.new_empty(x.shape[:-1], dtype=torch.float32)),
        backward, setup)
    return forward_op, backward_op


_layer_norm_op, _layer_norm_bwd_op = _norm_ops("layer_norm")
_rms_norm_op, _rms_norm_bwd_op = _norm_ops("rms_norm")


def _softmax_ops(op):
    backward_op = _custom_op(f"{op}_backward", "(Tensor dy, Tensor y) -> Tensor",
                             lambda dy, y: _softmax_bwd(op, dy, y), lambda dy, y: torch.empty_like(y))
    forward_op = _custom_op(
        op, "(Tensor x) -> Tensor", lambda x: _softmax_fwd(op, x), _like,
        lambda ctx, dy: (backward_op(dy, ctx.saved_tensors[0]),),
        lambda ctx, inputs, output: ctx.save_for_backward(output))
    return forward_op, backward_op


_softmax_op, _softmax_bwd_op = _softmax_ops("softmax")
_log_softmax_op, _log_softmax_bwd_op = _softmax_ops("log_softmax")
_norm_apply, _softmax_apply = _apply(_Norm), _apply(_Softmax)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)."""
    if _compiling():
        return _layer_norm_op(x, weight, bias, eps)[0]
    if _needs_grad(x, weight, bias):
        return _norm_apply(x, weight, bias, eps, "layer_norm")
    return _norm_fwd("layer_norm", x, weight, bias, eps)[0]


def rms_norm(x, weight=None, eps=None):
    """torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps); eps=None: x's dtype's
    machine epsilon, as in torch."""
    if _compiling():
        return _rms_norm_op(x, weight, None, eps)[0]
    if _needs_grad(x, weight):
        return _norm_apply(x, weight, None, eps, "rms_norm")
    return _norm_fwd("rms_norm", x, weight, None, eps)[0]


def softmax(x, dim=-1):
    """torch.softmax(x, dim) for the last dim."""
    _last_dim(x, dim)
    if _compiling():
        return _softmax_op(x)
    if _needs_grad(x):
        return _softmax_apply(x, "softmax")
    return _softmax_fwd("softmax", x)


def log_softmax(x, dim=-1):
    """torch.log_softmax(x, dim) for the last dim."""
    _last_dim(x, dim)
    if _compiling():
        return _log_softmax_op(x)
    if _needs_grad(x):
        return _softmax_apply(x, "log_softmax")
    return _softmax_fwd("log_softmax", x)


def _last_dim_size(normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"normalized_shape must be one dim (rawops normalises over the last dim), got {shape}")
    return shape


class LayerNorm(torch.nn.Module):
    """Drop-in torch.nn.LayerNorm over the last dim: same arguments, same parameters
    (`weight`, `bias`), so it loads a torch.nn.LayerNorm state_dict unchanged."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _last_dim_size(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, **factory))
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, **factory)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"x has shape {tuple(x.shape)}; its last dim must be {self.normalized_shape[0]}")
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(torch.nn.Module):
    """Drop-in torch.nn.RMSNorm over the last dim (parameter `weight`; eps=None is the
    dtype's machine epsilon, as in torch)."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _last_dim_size(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"x has shape {tuple(x.shape)}; its last dim must be {self.normalized_shape[0]}")
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Softmax(torch.nn.Module):
    """Drop-in torch.nn.Softmax for dim=-1 (the last dim)."""

    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


# =================================================================== MLP: fused_mlp, FusedMLP (and seed_mlp)
# The same launches as rawops.fused_mlp, from data_ptr() on torch's current stream; outputs,
# kept activations and backward temporaries come from torch's allocator (CUDA-graph safe).
# Three paths like the rest: no grad -> raw launch (inference kernels, nothing kept); grad,
# eager -> _FusedMLP (autograd.Function: training forward keeps what the backward needs);
# torch.compile -> rawops::fused_mlp / fused_mlp_train / fused_mlp_backward custom ops.
from . import mlp as _mlp  # noqa: E402

_MLP_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _mlp_plan(x, weights, biases, activation, output_activation):
    code = _rows_code(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected (batch, n_in)")
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError("weights must be a non-empty list of [out, in] tensors (torch.nn.Linear layout)")
    if biases is not None and (not isinstance(biases, (list, tuple)) or len(biases) != len(weights)):
        raise ValueError(f"biases must be None or a list of {len(weights)} tensors, one per weight")
    sizes = [x.shape[1]]
    for i, w in enumerate(weights):
        _rows_code(w, f"weights[{i}]", like=x)
        if w.dim() != 2 or w.shape[1] != sizes[-1]:
            raise ValueError(f"weights[{i}] has shape {tuple(w.shape)}, expected (out, {sizes[-1]}) "
                             "(torch.nn.Linear layout)")
        sizes.append(w.shape[0])
        if biases is not None:
            b = biases[i]
            _rows_code(b, f"biases[{i}]", like=x)
            if tuple(b.shape) != (w.shape[0],):
                raise ValueError(f"biases[{i}] has shape {tuple(b.shape)}, expected ({w.shape[0]},)")
    return _mlp.make_plan(code, sizes, activation, output_activation, biases is not None)


def _mlp_empty(device):
    def empty(shape, dtype_name):
        t = torch.empty(shape, dtype=_MLP_TORCH_DTYPES[dtype_name], device=device)
        return t, t.data_ptr()
    return empty


def _mlp_forward(x, weights, biases, plan, training):
    """(y, saved): saved is [] in inference, else the buffers of _mlp.saved_shapes."""
    batch = x.shape[0]
    y = torch.empty((batch, plan.n_out), dtype=x.dtype, device=x.device)
    saved = [torch.empty(shape, dtype=_MLP_TORCH_DTYPES[dt], device=x.device)
             for shape, dt in _mlp.saved_shapes(plan, batch)] if training else []
    device = x.get_device()
    if device == _current_device():
        _mlp_launch_forward(x, weights, biases, plan, y, saved, training, batch, device)
    else:
        with torch.cuda.device(device):
            _mlp_launch_forward(x, weights, biases, plan, y, saved, training, batch, device)
    return y, saved


def _mlp_launch_forward(x, weights, biases, plan, y, saved, training, batch, device):
    if plan.regime == "tc":
        _mlp.prepare(plan, device)
    if batch:
        _mlp.launch_forward(plan, device, x.data_ptr(), [w.data_ptr() for w in weights],
                            [b.data_ptr() for b in biases] if biases is not None else None, y.data_ptr(), batch,
                            _raw_stream(device), saved=[t.data_ptr() for t in saved] if training else None)


def _mlp_backward(dy, x, y, saved, weights, biases, plan, need_dx):
    dy = _contiguous(dy)
    batch = x.shape[0]
    dx = torch.empty_like(x) if need_dx else None
    dws = [torch.empty_like(w) for w in weights]
    dbs = [torch.empty_like(b) for b in biases] if biases is not None else None
    device = x.get_device()
    _on_device(device, lambda: _mlp.launch_backward(
        plan, device, dy.data_ptr(), x.data_ptr(), y.data_ptr(), [t.data_ptr() for t in saved],
        [w.data_ptr() for w in weights], dx.data_ptr() if dx is not None and batch else 0,
        [t.data_ptr() for t in dws], [t.data_ptr() for t in dbs] if dbs is not None else None, batch,
        _raw_stream(device), _mlp_empty(x.device)))
    return dx, dws, dbs


class _FusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan, n, *params):
        weights, biases = list(params[:n]), (list(params[n:]) if plan.has_bias else None)
        y, saved = _mlp_forward(x, weights, biases, plan, True)
        ctx.plan, ctx.n, ctx.n_saved = plan, n, len(saved)
        ctx.save_for_backward(x, y, *saved, *params)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y, *rest = ctx.saved_tensors
        saved, params = rest[:ctx.n_saved], rest[ctx.n_saved:]
        weights, biases = params[:ctx.n], (params[ctx.n:] if ctx.plan.has_bias else None)
        dx, dws, dbs = _mlp_backward(dy, x, y, saved, weights, biases, ctx.plan, ctx.needs_input_grad[0])
        return (dx, None, None, *dws, *(dbs or ()))


def _mlp_op_plan(x, weights, biases, activation, output_activation):
    """The plan of a rawops::fused_mlp* op call: every check of the eager path (the ops can be
    reached under torch.compile or called directly)."""
    return _mlp_plan(x, weights, biases, activation, output_activation)


def _mlp_backward_operands(dy, x, y, saved, plan):
    """dy (made contiguous, as autograd may hand it strided), after checking dy, y and the kept
    activations against the plan: the backward kernel reads them by shape alone."""
    dy = _contiguous(dy)
    batch = x.shape[0]
    expected = [("dy", dy, (batch, plan.n_out)), ("y", y, (batch, plan.n_out))]
    kept = _mlp.saved_shapes(plan, batch)
    expected += [(f"saved[{i}]", t, shape) for i, (t, (shape, _)) in enumerate(zip(saved, kept, strict=True))]
    for name, t, shape in expected:
        _rows_code(t, name, like=x)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return dy


def _mlp_saved_pair(x, saved):
    """The train op returns exactly two kept tensors: the tensor-core path keeps one."""
    return (saved[0], saved[1]) if len(saved) == 2 else (saved[0], x.new_empty(0))


def _fused_mlp_impl(x, weights, biases, activation, output_activation):
    return _mlp_forward(x, weights, biases, _mlp_op_plan(x, weights, biases, activation, output_activation), False)[0]


def _fused_mlp_fake(x, weights, biases, activation, output_activation):
    return x.new_empty((x.shape[0], weights[-1].shape[0]))


def _fused_mlp_train_impl(x, weights, biases, activation, output_activation):
    plan = _mlp_op_plan(x, weights, biases, activation, output_activation)
    y, saved = _mlp_forward(x, weights, biases, plan, True)
    return (y, *_mlp_saved_pair(x, saved))


def _fused_mlp_train_fake(x, weights, biases, activation, output_activation):
    plan = _mlp_op_plan(x, weights, biases, activation, output_activation)
    saved = [x.new_empty(shape, dtype=_MLP_TORCH_DTYPES[dt]) for shape, dt in _mlp.saved_shapes(plan, x.shape[0])]
    return (x.new_empty((x.shape[0], plan.n_out)), *_mlp_saved_pair(x, saved))


def _fused_mlp_backward_impl(dy, x, y, s1, s2, weights, biases, activation, output_activation, need_dx):
    plan = _mlp_op_plan(x, weights, biases, activation, output_activation)
    saved = [s1, s2] if plan.regime == "seed" else [s1]
    dy = _mlp_backward_operands(dy, x, y, saved, plan)
    dx, dws, dbs = _mlp_backward(dy, x, y, saved, weights, biases, plan, need_dx)
    return [dx if dx is not None else x.new_empty(0), *dws, *(dbs or ())]


def _fused_mlp_backward_fake(dy, x, y, s1, s2, weights, biases, activation, output_activation, need_dx):
    return [torch.empty_like(x) if need_dx else x.new_empty(0), *(torch.empty_like(w) for w in weights),
            *(torch.empty_like(b) for b in (biases or ()))]


_fused_mlp_backward_op = _custom_op(
    "fused_mlp_backward",
    "(Tensor dy, Tensor x, Tensor y, Tensor s1, Tensor s2, Tensor[] weights, Tensor[]? biases, str activation, "
    "str output_activation, bool need_dx) -> Tensor[]", _fused_mlp_backward_impl, _fused_mlp_backward_fake)
_fused_mlp_op = _custom_op(
    "fused_mlp", "(Tensor x, Tensor[] weights, Tensor[]? biases, str activation, str output_activation) -> Tensor",
    _fused_mlp_impl, _fused_mlp_fake)


def _fused_mlp_train_setup(ctx, inputs, output):
    x, weights, biases, activation, output_activation = inputs
    y, s1, s2 = output
    ctx.save_for_backward(x, y, s1, s2, *weights, *(biases or ()))
    ctx.n, ctx.has_bias, ctx.scalars = len(weights), biases is not None, (activation, output_activation)


def _fused_mlp_train_backward(ctx, dy, _ds1, _ds2):
    x, y, s1, s2, *params = ctx.saved_tensors
    weights, biases = params[:ctx.n], (params[ctx.n:] if ctx.has_bias else None)
    grads = _fused_mlp_backward_op(dy, x, y, s1, s2, weights, biases, *ctx.scalars, ctx.needs_input_grad[0])
    dx, dws, dbs = grads[0], grads[1:1 + ctx.n], grads[1 + ctx.n:]
    return (dx if ctx.needs_input_grad[0] else None, list(dws), list(dbs) if ctx.has_bias else None, None, None)


_fused_mlp_train_op = _custom_op(
    "fused_mlp_train",
    "(Tensor x, Tensor[] weights, Tensor[]? biases, str activation, str output_activation) -> (Tensor, Tensor, Tensor)",
    _fused_mlp_train_impl, _fused_mlp_train_fake, _fused_mlp_train_backward, _fused_mlp_train_setup)
_fused_mlp_apply = _apply(_FusedMLP)


def fused_mlp(x, weights, biases=None, activation="relu", output_activation="none"):
    """A whole MLP in one launch (rawops.fused_mlp on torch tensors), with autograd and a
    torch.compile custom op: weights [W_0, ..., W_L] in nn.Linear layout, biases [b_0, ...] or
    None; hidden `activation` 'relu' | 'gelu' (exact erf) | 'none', `output_activation` 'none' |
    'relu'. Supported networks: rawops.mlp.SUPPORTED_TEXT (ValueError otherwise)."""
    if _compiling():
        weights, biases = list(weights), (list(biases) if biases is not None else None)
        if _grad_enabled() and any(t.requires_grad for t in (x, *weights, *(biases or ()))):
            return _fused_mlp_train_op(x, weights, biases, activation, output_activation)[0]
        return _fused_mlp_op(x, weights, biases, activation, output_activation)
    plan = _mlp_plan(x, weights, biases, activation, output_activation)
    if _grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)
                            or (biases is not None and any(b.requires_grad for b in biases))):
        return _fused_mlp_apply(x, plan, len(weights), *weights, *(biases or ()))
    return _mlp_forward(x, weights, biases, plan, False)[0]


_MLP_ACTIVATION_MODULES = {torch.nn.ReLU: "relu", torch.nn.Identity: "none"}


def _activation_name(module):
    if isinstance(module, torch.nn.GELU):
        if module.approximate != "none":
            raise ValueError("FusedMLP supports nn.GELU(approximate='none') (exact erf), got approximate='tanh'")
        return "gelu"
    for kind, name in _MLP_ACTIVATION_MODULES.items():
        if isinstance(module, kind):
            return name
    raise ValueError(f"FusedMLP takes nn.Linear, nn.ReLU, nn.GELU and nn.Identity layers, got {type(module).__name__}")


class FusedMLP(torch.nn.Module):
    """A whole MLP as one rawops launch: FusedMLP(sizes, activation, output_activation, bias,
    device, dtype) with sizes = (n_in, hidden..., n_out), initialised like nn.Linear; or
    FusedMLP.from_sequential(nn.Sequential(Linear, act, Linear, act, ..., Linear[, ReLU])),
    which copies the weights once (same numbers). Parameters: `weights`, `biases`
    (ParameterLists, nn.Linear layout)."""

    def __init__(self, sizes, activation="relu", output_activation="none", bias=True, device=None, dtype=None):
        super().__init__()
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) < 2:
            raise ValueError(f"sizes must list at least n_in and n_out, got {sizes}")
        code = {None: 0, torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}.get(dtype)
        if code is None:
            raise TypeError(f"dtype {dtype}; FusedMLP supports float32, float16, bfloat16")
        _mlp.make_plan(code, sizes, activation, output_activation, bias)  # ValueError before allocating
        self.sizes, self.activation, self.output_activation = sizes, activation, output_activation
        linears = [torch.nn.Linear(a, b, bias=bias, device=device, dtype=dtype) for a, b in zip(sizes, sizes[1:])]
        self.weights = torch.nn.ParameterList([m.weight for m in linears])
        self.biases = torch.nn.ParameterList([m.bias for m in linears]) if bias else None

    @classmethod
    def from_sequential(cls, sequential):
        layers = list(sequential)
        linears = [m for m in layers if isinstance(m, torch.nn.Linear)]
        if not linears or not isinstance(layers[0], torch.nn.Linear):
            raise ValueError("from_sequential wants nn.Sequential(Linear, activation, Linear, ..., Linear[, ReLU])")
        acts, out_act, i = set(), "none", 1
        while i < len(layers):
            if isinstance(layers[i], torch.nn.Linear):
                raise ValueError("from_sequential wants one activation between consecutive Linear layers")
            name = _activation_name(layers[i])
            if i + 1 == len(layers):
                if name not in _mlp.OUTPUT_ACTIVATIONS:
                    raise ValueError(f"output activation {name!r}: FusedMLP supports {sorted(_mlp.OUTPUT_ACTIVATIONS)}")
                out_act = name
                i += 1
                continue
            if not isinstance(layers[i + 1], torch.nn.Linear):
                raise ValueError("from_sequential wants one activation between consecutive Linear layers")
            acts.add(name)
            i += 2
        if len(acts) > 1:
            raise ValueError(f"FusedMLP uses one hidden activation, the Sequential has {sorted(acts)}")
        has_bias = {m.bias is not None for m in linears}
        if len(has_bias) != 1:
            raise ValueError("FusedMLP wants every Linear with a bias or every one without")
        first = linears[0].weight
        sizes = (linears[0].in_features, *(m.out_features for m in linears))
        module = cls(sizes, acts.pop() if acts else "relu", out_act, has_bias.pop(), first.device, first.dtype)
        with torch.no_grad():
            for i, m in enumerate(linears):
                module.weights[i].copy_(m.weight)
                if m.bias is not None:
                    module.biases[i].copy_(m.bias)
        return module

    _fast_key = None  # inference fast path: the parameters last validated (dtype, device, pointers)
    _fast_plan = None
    _seed_state = None  # the source network's typed fast path (_launch.torch_seed_forward)

    def __call__(self, *args, **kwargs):
        # The source network's inference, when nothing needs nn.Module.__call__ (no hooks, no
        # gradient, not tracing: the C call checks), is one C call; everything else goes
        # through nn.Module.__call__ and forward.
        y = torch_seed_module_call(self, args, kwargs)
        if y is not None:
            return y
        return super().__call__(*args, **kwargs)

    def forward(self, x):
        # ParameterList's own iteration costs microseconds per call; its dict does not. The
        # lists are read from _modules directly: Module.__getattr__ costs ~0.5 us each.
        lists = self._modules
        weights = list(lists["weights"]._parameters.values())
        bias_list = lists.get("biases")  # absent when built without biases (a plain None attribute)
        biases = list(bias_list._parameters.values()) if bias_list is not None else None
        if _compiling() or (_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))):
            return fused_mlp(x, weights, biases, self.activation, self.output_activation)
        if self._seed_state is not None:  # the source network, validated before: one typed call
            y = torch_seed_forward(x, [weights[0], biases[0], weights[1], biases[1], weights[2], biases[2]],
                                   self._seed_state)
            if y is not None:
                return y
        # Inference: the parameters are validated once per (dtype, device, pointers), then only
        # x is checked per call (its dtype and device against the weights', its width).
        first = weights[0]
        key = (first.dtype, first.get_device(), *(w.data_ptr() for w in weights),
               *(b.data_ptr() for b in (biases or ())))
        if key == self._fast_key:
            _rows_code(x, "x", like=first, like_name="weights[0]")
            plan = self._fast_plan
            if x.dim() != 2 or x.shape[1] != plan.n_in:
                raise ValueError(f"x has shape {tuple(x.shape)}, expected (batch, {plan.n_in})")
        else:
            plan = _mlp_plan(x, weights, biases, self.activation, self.output_activation)
            self._fast_key, self._fast_plan = key, plan
            self._seed_state = None
            if plan.regime == "seed" and biases is not None:
                device = first.get_device()
                pointers = (weights[0].data_ptr(), biases[0].data_ptr(), weights[1].data_ptr(), biases[1].data_ptr(),
                            weights[2].data_ptr(), biases[2].data_ptr())
                self._seed_state = (first.dtype, device, pointers, plan.out_act, {},
                                    lambda batch: _mlp.seed_launch(batch, device))
        return _mlp_forward(x, weights, biases, plan, False)[0]

    def extra_repr(self):
        return f"sizes={self.sizes}, activation={self.activation!r}, output_activation={self.output_activation!r}"


def seed_mlp(x, weights, biases, output_activation="none"):
    """The 100-128-64-10 ReLU network (the first slice's name for fused_mlp on the source
    network): weights = (W1, W2, W3) and biases = (b1, b2, b3) in torch.nn.Linear layout,
    float32 CUDA tensors; x of shape (batch, 100). Autograd and torch.compile as fused_mlp."""
    require_str(output_activation, "output_activation")
    if output_activation not in _mlp.OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {sorted(_mlp.OUTPUT_ACTIVATIONS)}, "
                         f"got {output_activation!r}")
    for name, seq in (("weights", weights), ("biases", biases)):
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"seed_mlp's {name} must be a list or tuple of 3 tensors, got {type(seq).__name__}")
    if len(weights) != 3 or len(biases) != 3:
        raise ValueError(f"seed_mlp takes 3 weights and 3 biases, got {len(weights)} and {len(biases)}")
    n_in, h1, h2, n_out = _mlp.SEED_SIZES
    named = [("x", x, (None, n_in)), ("w1", weights[0], (h1, n_in)), ("b1", biases[0], (h1,)),
             ("w2", weights[1], (h2, h1)), ("b2", biases[1], (h2,)), ("w3", weights[2], (n_out, h2)),
             ("b3", biases[2], (n_out,))]
    for name, t, shape in named:
        code = _rows_code(t, name, like=None if name == "x" else x)
        if code != 0:
            raise TypeError(f"{name} has dtype {t.dtype}; seed_mlp supports float32")
        if t.dim() != len(shape) or any(w is not None and g != w for g, w in zip(t.shape, shape)):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {_mlp._shape_text(shape)}")
    return fused_mlp(x, weights, biases, "relu", output_activation)


# =================================================================== matrix: matmul, linear_gelu
# The same launches as rawops.matmul / rawops.linear_gelu (matmul.launch_gemm on data_ptr()),
# on torch's current stream; outputs from torch's allocator. Under autograd, linear_gelu's
# forward also writes the pre-activation (one extra store from the same kernel) so that the
# backward is one elementwise pass + two GEMMs, instead of recomputing x @ W^T (a third GEMM).
_mm = importlib.import_module("rawops.matmul")  # the attribute rawops.matmul is the function
from . import _gemm_sm90, _gemm_tf32  # noqa: E402
# No-grad linear_gelu goes through the launcher's typed path (checks, cached plan, output,
# launch in one call); it answers None for anything else and the Python path below runs.
register_torch_gemm(_mm.linear_launch_plan, _mm, _gemm_sm90.launch_gemm)
_module_globals = importlib.import_module("torch.nn.modules.module")
register_torch_modules(tuple(getattr(_module_globals, name, {None: None}) for name in (
    "_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks", "_global_forward_pre_hooks")),
    torch._C._get_tracing_state)
_LINEAR_GELU_FLAGS = {approximate: flags | _mm.EPI_BIAS_GELU for approximate, flags in _mm.GELU_FLAGS.items()}


def _gemm(device, layout, code, a, b, c, m, n, k, bias=0, aux=0, pre=0, flags=_mm.EPI_NONE, tf32=False):
    """tf32: float32 on the TF32 tensor-core GEMM where its plan takes the shape, else exact."""
    def workspace(nbytes):  # split-K partials, from torch's allocator on the launch stream
        scratch = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))
        return scratch.data_ptr(), scratch

    if tf32 and code == 0 and _on_device(device, _gemm_tf32.launch_gemm, device, layout, a, b, c, bias, aux, pre,
                                         m, n, k, flags, _raw_stream(device), workspace)[0]:
        return
    _on_device(device, _mm.launch_gemm, device, layout, code, a, b, c, bias, aux, pre, m, n, k, flags,
               _raw_stream(device), workspace)


def _matmul_operands(a, b):
    code = _rows_code(a, "a")
    _rows_code(b, "b", like=a, like_name="a")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul takes 2-D a (M, K) and b (K, N), got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"b has shape {tuple(b.shape)}, expected ({a.shape[1]}, N): its rows must match a's columns")
    return code, a.shape[0], b.shape[1], a.shape[1]


def _matmul_fwd(a, b, tf32=False):
    code, m, n, k = _matmul_operands(a, b)
    c = a.new_empty(m, n)  # sizes as ints: torch parses them faster than a tuple or kwargs
    if m and n:
        _gemm(a.get_device(), "nn", code, a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, tf32=tf32)
    return c


def _matmul_bwd(dy, a, b, tf32=False):
    """(da, db) = (dy @ b^T, a^T @ dy); tf32 as the forward's (nt and tn TF32 kernels)."""
    dy = _contiguous(dy)
    code, m, n, k = _matmul_operands(a, b)
    _rows_code(dy, "dy", like=a, like_name="a")
    if tuple(dy.shape) != (m, n):
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {(m, n)}")
    da, db = a.new_empty(m, k), a.new_empty(k, n)
    device = a.get_device()
    if m and k:
        _gemm(device, "nt", code, dy.data_ptr(), b.data_ptr(), da.data_ptr(), m, k, n, tf32=tf32)
    if k and n:
        _gemm(device, "tn", code, a.data_ptr(), dy.data_ptr(), db.data_ptr(), k, n, m, tf32=tf32)
    return da, db


def _linear_operands(x, weight, bias):
    code = _rows_code(x, "x")
    _rows_code(weight, "weight", like=x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (its last is in_features)")
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected (out_features, {k}): torch.nn.Linear "
                         "layout, in_features = x's last dim")
    n = weight.shape[0]
    if bias is not None:
        _rows_code(bias, "bias", like=x)
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({n},): one value per output feature")
    m = x.numel() // k if k else 0
    if not k:
        m = 1
        for d in x.shape[:-1]:
            m *= d
    return code, m, n, k


def _linear_gelu_fwd(x, weight, bias, approximate, save_preactivation):
    """(y, pre); pre is None unless save_preactivation."""
    flags = _mm.gelu_flags(approximate) | _mm.EPI_BIAS_GELU
    code, m, n, k = _linear_operands(x, weight, bias)
    shape = (*x.shape[:-1], n)
    y = x.new_empty(*shape)  # sizes as ints: torch parses them faster than a tuple or kwargs
    pre = x.new_empty(*shape) if save_preactivation else None
    if m and n:
        _gemm(x.get_device(), "nt", code, x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, n, k,
              bias=bias.data_ptr() if bias is not None else 0, pre=pre.data_ptr() if save_preactivation else 0,
              flags=flags)
    return y, pre


def _linear_gelu_bwd(dy, x, weight, bias, pre, approximate, need_dx=True, need_dweight=True):
    """(dx, dweight, dbias): empty tensors for those not needed (dbias: when bias is None).
    dpre from the saved pre-activation (one elementwise pass) when `pre` holds it, else
    recomputed by a GEMM whose epilogue yields dpre directly."""
    flags = _mm.gelu_flags(approximate)
    code, m, n, k = _linear_operands(x, weight, bias)
    dy = _contiguous(dy)
    _rows_code(dy, "dy", like=x)
    shape = tuple(x.shape[:-1]) + (n,)
    if tuple(dy.shape) != shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {shape}")
    device = x.get_device()
    dbias = None
    if pre is not None and pre.numel() == m * n and m * n:
        # With a bias, dpre and its column sums (dbias) in one pass where the fused kernel applies.
        fused = _bias_gelu_bwd_fused(dy, pre, None, approximate) if bias is not None else None
        dpre, dbias = fused if fused is not None else (_gelu_bwd(dy, pre, approximate), None)
    else:
        dpre = x.new_empty(*shape)
        if m and n:
            _gemm(device, "nt", code, x.data_ptr(), weight.data_ptr(), dpre.data_ptr(), m, n, k,
                  bias=bias.data_ptr() if bias is not None else 0, aux=dy.data_ptr(),
                  flags=flags | _mm.EPI_BIAS_GELU_GRAD)
    dx = x.new_empty(*x.shape) if need_dx else x.new_empty(0)
    dweight = x.new_empty(n, k) if need_dweight else x.new_empty(0)
    if need_dx and m and k:
        _gemm(device, "nn", code, dpre.data_ptr(), weight.data_ptr(), dx.data_ptr(), m, k, n)
    if need_dweight and n and k:
        _gemm(device, "tn", code, dpre.data_ptr(), x.data_ptr(), dweight.data_ptr(), n, k, m)
    if dbias is None:
        dbias = _column_sum(dpre) if bias is not None else x.new_empty(0)
    return dx, dweight, dbias


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, tf32):
        ctx.save_for_backward(a, b)
        ctx.tf32 = tf32
        return _matmul_fwd(a, b, tf32)

    @staticmethod
    def backward(ctx, dy):
        return (*_matmul_bwd(dy, *ctx.saved_tensors, ctx.tf32), None)


class _LinearGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, approximate):
        y, pre = _linear_gelu_fwd(x, weight, bias, approximate, True)
        ctx.save_for_backward(x, weight, bias, pre)
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, pre = ctx.saved_tensors
        need_dx, need_dweight, need_dbias = ctx.needs_input_grad[:3]
        dx, dweight, dbias = _linear_gelu_bwd(dy, x, weight, bias, pre, ctx.approximate, need_dx, need_dweight)
        return (dx if need_dx else None, dweight if need_dweight else None,
                dbias if bias is not None and need_dbias else None, None)


# Through the C++ apply (_apply): Function.apply's Python preamble cost 11.6 us a forward, and a
# forward + backward 53 us more by event pair (448 against 502 us; torch eager 448), H100 host,
# bench/results/explore_linear_grad.md.
_matmul_apply, _linear_gelu_apply = _apply(_Matmul), _apply(_LinearGELU)

_matmul_bwd_op = _custom_op("matmul_backward", "(Tensor dy, Tensor a, Tensor b) -> (Tensor, Tensor)", _matmul_bwd,
                            lambda dy, a, b: (torch.empty_like(a), torch.empty_like(b)))
_matmul_op = _custom_op(
    "matmul", "(Tensor a, Tensor b) -> Tensor", _matmul_fwd,
    lambda a, b: a.new_empty((a.shape[0], b.shape[1])),
    lambda ctx, dy: _matmul_bwd_op(dy, *ctx.saved_tensors), _save_inputs)
# tf32=True under torch.compile: its own ops (the flag is part of what the op computes).
_matmul_tf32_bwd_op = _custom_op("matmul_tf32_backward", "(Tensor dy, Tensor a, Tensor b) -> (Tensor, Tensor)",
                                 lambda dy, a, b: _matmul_bwd(dy, a, b, True),
                                 lambda dy, a, b: (torch.empty_like(a), torch.empty_like(b)))
_matmul_tf32_op = _custom_op(
    "matmul_tf32", "(Tensor a, Tensor b) -> Tensor", lambda a, b: _matmul_fwd(a, b, True),
    lambda a, b: a.new_empty((a.shape[0], b.shape[1])),
    lambda ctx, dy: _matmul_tf32_bwd_op(dy, *ctx.saved_tensors), _save_inputs)


def _linear_gelu_setup(ctx, inputs, output):
    x, weight, bias, approximate = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, bias if bias is not None else x.new_empty(0), output[1])
    ctx.approximate = approximate


def _linear_gelu_backward_op_impl(dy, x, weight, bias, pre, approximate):
    return _linear_gelu_bwd(dy, x, weight, bias, pre, approximate)


def _linear_gelu_backward_fake(dy, x, weight, bias, pre, approximate):
    return (torch.empty_like(x), torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else x.new_empty(0))


_linear_gelu_bwd_op = _custom_op(
    "linear_gelu_backward",
    "(Tensor dy, Tensor x, Tensor weight, Tensor? bias, Tensor pre, str approximate) -> (Tensor, Tensor, Tensor)",
    _linear_gelu_backward_op_impl, _linear_gelu_backward_fake)


def _linear_gelu_op_backward(ctx, dy, dpre):
    x, weight, bias, pre = ctx.saved_tensors
    dx, dweight, dbias = _linear_gelu_bwd_op(dy, x, weight, bias if ctx.has_bias else None, pre, ctx.approximate)
    return dx, dweight, (dbias if ctx.has_bias else None), None


_linear_gelu_op = _custom_op(
    "linear_gelu", "(Tensor x, Tensor weight, Tensor? bias, str approximate) -> (Tensor, Tensor)",
    lambda x, weight, bias, approximate: _linear_gelu_fwd(x, weight, bias, approximate, True),
    lambda x, weight, bias, approximate: (x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],)),
                                          x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))),
    _linear_gelu_op_backward, _linear_gelu_setup)


def _matmul_python(a, b, tf32=False):
    """a (M, K) @ b (K, N) with autograd: the path of torch.compile, gradients, tf32=True, the
    cases the entry's typed path declined (it has tried it) and errors."""
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32 must be a bool, got {type(tf32).__name__}")
    if _compiling():
        return _matmul_tf32_op(a, b) if tf32 else _matmul_op(a, b)
    if _needs_grad(a, b):
        return _matmul_apply(a, b, tf32)
    return _matmul_fwd(a, b, tf32)


def _linear_gelu_python(x, weight, bias=None, approximate="tanh"):
    """F.gelu(F.linear(x, weight, bias), approximate=approximate) in one kernel: the path of
    torch.compile, gradients, the cases the entry's typed path declined (it has tried it) and
    errors."""
    if _compiling():
        return _linear_gelu_op(x, weight, bias, approximate)[0]
    if _needs_grad(x, weight, bias):
        return _linear_gelu_apply(x, weight, bias, approximate)
    return _linear_gelu_fwd(x, weight, bias, approximate, False)[0]


# A bound method of _launch.TorchLinearEntry, like the elementwise entries (its docstring is the
# public one); dynamo traces _linear_gelu_python in its place.
linear_gelu = TorchLinearEntry(_LINEAR_GELU_FLAGS, _linear_gelu_python).linear_gelu
matmul = TorchMatmulEntry(_matmul_python).matmul  # likewise: dynamo traces _matmul_python
_ENTRIES += [linear_gelu, matmul]


class LinearGELU(torch.nn.Module):
    """torch.nn.Linear followed by GELU, fused: parameters named and shaped as nn.Linear's
    (weight [out_features, in_features], bias [out_features]), so an nn.Linear's state_dict
    loads unchanged, and initialised the same way."""

    def __init__(self, in_features, out_features, bias=True, approximate="tanh", device=None, dtype=None):
        super().__init__()
        _mm.gelu_flags(approximate)
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

    def forward(self, x):
        return linear_gelu(x, self.weight, self.bias, self.approximate)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, approximate={self.approximate!r}")


# Last: every entry of _ENTRIES exists by now.
if "torch._dynamo" in sys.modules:
    _register_polyfills()
else:
    sys.meta_path.insert(0, _AfterDynamoImport())
