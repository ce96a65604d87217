"""What every family of the torch adapter shares: torch's entry points handed to the launcher,
the custom-op and autograd plumbing, and dynamo's view of the C-level entries."""
import importlib.abc
import importlib.util
import sys
import warnings

import torch

from .._launch import register_torch, tensor_code

# torch's raw queries cost far less than torch.cuda.current_stream(); CPU builds lack them.
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
# The tensor checks and launches run in the Cython launcher (rawops._launch.torch_fast); it gets
# torch's types and entry points from here, so that rawops itself never imports torch.
register_torch(torch.Tensor, (torch.float32, torch.float16, torch.bfloat16), torch.empty_like, raw_stream,
               torch.cuda.device, torch.is_grad_enabled, torch.compiler)

compiling = torch.compiler.is_compiling
grad_enabled = torch.is_grad_enabled
functorch_active = torch._C._are_functorch_transforms_active
_c_apply = torch._C._FunctionBase.__dict__["apply"]


def fast_apply(function):
    """function.apply through the C++ apply: Function.apply's Python preamble (default-argument
    binding, functorch unwrapping) does nothing unless a functorch transform is active."""
    fast = _c_apply.__get__(None, function)
    return lambda *args: fast(*args) if not functorch_active() else function.apply(*args)


def needs_grad(*tensors):
    if not grad_enabled():
        return False
    for t in tensors:  # a loop, not any(generator): every adapter call asks
        if getattr(t, "requires_grad", False):
            return True
    return False


def on_device(device, launch, *args):
    """launch(*args) with `device` current (the kernels belong to that device's context)."""
    if device == current_device():
        return launch(*args)
    with torch.cuda.device(device):
        return launch(*args)


def dense(t):
    """t itself when C-contiguous (or not a tensor: the launcher's checks name it), else a
    contiguous copy: a strided view, or the broadcast (stride-0) gradient autograd may hand over."""
    return t.contiguous() if isinstance(t, torch.Tensor) and not t.is_contiguous() else t


def checked(t, name, like=None, like_name="x"):
    """The dtype code of a tensor operand after the launcher's checks (CUDA; float32, float16 or
    bfloat16; contiguous; with `like`, its dtype and GPU), TypeError / ValueError naming it."""
    return tensor_code(t, name, like, like_name)


def real_scalar(value, name):
    """A float for a kernel's scalar argument, in Python so that dynamo traces it."""
    if value is None or isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def last_dim(input, dim, name):
    """dim as a non-negative index of input's dims (IndexError naming it when out of range)."""
    ndim = max(input.dim(), 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise IndexError(f"{name}: dim {dim} is out of range for a tensor of {input.dim()} dims")
    return dim % ndim


# ------------------------------------------------------------------- torch.library ops (compile)
def custom_op(name, schema, impl, fake, backward=None, setup=None):
    """A torch.library custom op `rawops::<name>` with its fake (meta) kernel and, when given,
    its autograd formula: what torch.compile(fullgraph=True) traces."""
    op = torch.library.custom_op(f"rawops::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup)
    return op


def save_inputs(ctx, inputs, output):
    """setup_context: save the tensor inputs, keep the others (alpha, approximate) on ctx."""
    ctx.save_for_backward(*[value for value in inputs if isinstance(value, torch.Tensor)])
    ctx.scalars = [value for value in inputs if not isinstance(value, torch.Tensor)]


def like(x, *rest):
    return torch.empty_like(x)


# ------------------------------------------------------------------- dynamo and the C-level entries
# The no-grad eager call of the elementwise ops, linear_gelu, matmul and FusedMLP is a C-level
# entry (rawops._launch.torch_fast), a builtin dynamo cannot look into: each family registers
# (entry, the Python function dynamo traces in its place) here.
_SUBSTITUTES = []


def substitute_in_graph(entry, python_function):
    _SUBSTITUTES.append((entry, python_function))


def _register_substitutes():
    try:
        for entry, python_function in _SUBSTITUTES:
            torch.compiler.substitute_in_graph(entry, skip_signature_check=True)(python_function)
    except Exception as error:  # a torch whose dynamo lacks this: torch.compile graph-breaks on them
        warnings.warn(f"rawops.torch_adapter: torch.compile cannot trace the C-level entries ({error})")


class _AfterDynamoImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Registers the substitutes when torch._dynamo is first imported (torch.compile imports
    it): importing it with the adapter would make `import rawops.torch_adapter` seconds slower."""

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
        _register_substitutes()


def install_substitutes():
    """Called once every family has registered its entries."""
    if "torch._dynamo" in sys.modules:
        _register_substitutes()
    else:
        sys.meta_path.insert(0, _AfterDynamoImport())
