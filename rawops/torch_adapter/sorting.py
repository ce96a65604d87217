"""The sorting family for torch: sort and argsort with torch.sort's and torch.argsort's signatures
(sort returns a torch.return_types.sort of values and int64 indices), sort's autograd (the
gradient of values scattered back to the indices) and `rawops::sort` / `rawops::argsort` custom
ops that torch.compile(fullgraph=True) traces; and topk (rawops.torch_adapter._sorting_topk).

float32, float16, bfloat16, int32 and int64 inputs, NaN placed as torch places it (last
ascending, first descending). Every sort is stable, whatever `stable` says. A 0-dim input is one
element. Results are new contiguous tensors from torch's allocator, launched on torch's current
stream (the long-row path's scratch comes from torch's allocator too, so CUDA graphs capture it).

What is copied first (one extra read and write of the input): another `dim` than the last
(moved last in a contiguous copy; the results are moved back into the input's shape, one more
read and write of each); along the last dim, an input whose last dim is not contiguous or whose
leading dims have no single row stride (a view whose rows are evenly spaced, `x[:, :n]` or
`x[::2]`, is read as it is).
"""
import torch

from .. import _rows
from .._sorting_keys import KEY_TYPES, MAX_ROW, checked_bool, tensor_key_type
from ..sorting import launch_sort
from ._common import compiling, custom_op, fast_apply, last_dim, needs_grad, on_device, raw_stream


def _checked(input, dim, descending, stable, op):
    """dim as an index into input's dims (0 for a 0-dim input) after every check, TypeError /
    ValueError / IndexError naming the argument."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    tensor_key_type(input, op)
    dim = last_dim(input, dim, op)
    checked_bool(descending, "descending")
    checked_bool(stable, "stable")
    if input.device.type != "cuda":
        raise ValueError(f"input is on {input.device}; rawops kernels need a CUDA tensor")
    if input.dim() and input.shape[dim] > MAX_ROW:
        raise ValueError(f"input has {input.shape[dim]} elements along dim; {op} takes fewer than 2**31")
    return dim


# ------------------------------------------------------------------- raw launches (no autograd)
def _launch(x, descending, with_values):
    """Sort over the last dim of x (a CUDA tensor of a key dtype, at least one dim)."""
    stride = x.shape[-1] if x.is_contiguous() else _rows.collapsed_row_stride(tuple(x.shape), x.stride())
    if stride is None:
        x = x.contiguous()
        stride = x.shape[-1]
    n = x.shape[-1]
    values = torch.empty(x.shape, dtype=x.dtype, device=x.device) if with_values else None
    indices = torch.empty(x.shape, dtype=torch.int64, device=x.device)
    rows = x.numel() // n if n else 0
    if rows:
        device = x.get_device()

        def scratch(nbytes):
            block = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
            held.append(block)
            return block.data_ptr()

        held = []
        on_device(device, launch_sort, device, KEY_TYPES[tensor_key_type(x, "sort")][0], x.data_ptr(),
                  values.data_ptr() if with_values else 0, indices.data_ptr(), rows, n, stride, bool(descending),
                  raw_stream(device), scratch)
    return values, indices


def forward(input, dim, descending, with_values=True):
    """(values, indices) of input sorted along `dim` (an index into input's dims; at least one
    dim); values None unless with_values."""
    if dim == input.dim() - 1:
        return _launch(input, descending, with_values)
    values, indices = _launch(input.movedim(dim, -1).contiguous(), descending, with_values)
    indices = indices.movedim(-1, dim).contiguous()
    return (values.movedim(-1, dim).contiguous() if with_values else None), indices


def _grad_input(grad_values, indices, shape, dim):
    return grad_values.new_zeros(shape).scatter(dim, indices, grad_values)


# ------------------------------------------------------------------- autograd and custom ops
class _Sort(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, dim, descending):
        values, indices = forward(input, dim, descending)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.shape, ctx.dim = input.shape, dim
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        indices, = ctx.saved_tensors
        return _grad_input(grad_values, indices, ctx.shape, ctx.dim), None, None


_sort_apply = fast_apply(_Sort)


def _fake_sort(x, dim, descending):
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.int64)


def _setup(ctx, inputs, output):
    x, dim, _ = inputs
    ctx.save_for_backward(output[1])
    ctx.shape, ctx.dim = x.shape, dim


def _backward(ctx, grad_values, grad_indices):
    indices, = ctx.saved_tensors
    return _grad_input(grad_values, indices, ctx.shape, ctx.dim), None, None


_SORT_OP = custom_op("sort", "(Tensor x, int dim, bool descending) -> (Tensor, Tensor)",
                     lambda x, dim, descending: forward(x, dim, descending), _fake_sort, _backward, _setup)
_ARGSORT_OP = custom_op("argsort", "(Tensor x, int dim, bool descending) -> Tensor",
                        lambda x, dim, descending: forward(x, dim, descending, False)[1],
                        lambda x, dim, descending: x.new_empty(x.shape, dtype=torch.int64))


# ------------------------------------------------------------------- public functions
def sort(input, dim=-1, descending=False, *, stable=False):
    """torch.sort on rawops kernels: (values, indices) along dim as torch.return_types.sort,
    always stable (module docstring for the order and what copies)."""
    dim = _checked(input, dim, descending, stable, "sort")
    descending = bool(descending)
    if input.dim() == 0:  # one element: itself, at index 0
        values, indices = sort(input.reshape(1), 0, descending)
        return torch.return_types.sort((values.reshape(()), indices.reshape(())))
    if compiling():
        values, indices = _SORT_OP(input, dim, descending)
    elif needs_grad(input):
        values, indices = _sort_apply(input, dim, descending)
    else:
        values, indices = forward(input, dim, descending)
    return torch.return_types.sort((values, indices))


def argsort(input, dim=-1, descending=False, *, stable=False):
    """torch.argsort on rawops kernels: the int64 indices that sort input along dim (stable)."""
    dim = _checked(input, dim, descending, stable, "argsort")
    descending = bool(descending)
    if input.dim() == 0:
        return argsort(input.reshape(1), 0, descending).reshape(())
    if compiling():
        return _ARGSORT_OP(input, dim, descending)
    return forward(input, dim, descending, False)[1]


from ._sorting_topk import topk  # noqa: E402,F401  (kernels/sorting_topk.cu)
