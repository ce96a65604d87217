"""topk for torch, the sorting family's selection: torch.topk's signature and result (a
torch.return_types.topk of values and int64 indices), its autograd (the gradient of values
scattered to the indices, zeros elsewhere) and a `rawops::topk` custom op that
torch.compile(fullgraph=True) traces. rawops.torch_adapter.sorting re-exports `topk`.

float32, float16, bfloat16, int32 and int64 inputs; 1 <= k <= min(1024, size along dim)
(torch's k=0 is a ValueError here); NaN counts among the largest, as in torch. A 0-dim input
is one element. Results are new contiguous tensors from torch's allocator, launched on torch's
current stream (CUDA graphs capture them; a split row's candidate scratch comes from torch's
allocator too).

What is copied first (one extra read and write of the input): another `dim` than the last
(moved last in a contiguous copy, its results moved back into place, two small extra
passes); along the last dim, an input whose leading dims have no single row stride (a view
whose rows are evenly spaced, `x[:, :n]` or `x[::2]`, is read as it is).
"""
import torch

from .. import _rows, _sorting_topk as _tk
from .._sorting_keys import KEY_TYPES, checked_bool, tensor_key_type
from ._common import compiling, custom_op, fast_apply, last_dim, needs_grad, on_device, raw_stream


def _checked(input, k, dim, largest, sorted):
    """(dtype name, dim as an index, k) after every check, TypeError / ValueError / IndexError
    naming the argument."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    dtype = tensor_key_type(input, "topk")
    dim = last_dim(input, dim, "topk")
    k = _tk.checked_k(k, input.shape[dim] if input.dim() else 1)
    checked_bool(largest, "largest")
    checked_bool(sorted, "sorted")
    if input.device.type != "cuda":
        raise ValueError(f"input is on {input.device}; rawops kernels need a CUDA tensor")
    return dtype, dim, k


def _launch(x, k, largest, sorted):
    """topk over the last dim of x (a CUDA tensor of a key dtype, at least one dim), k checked."""
    if x.dim() > 1 and not x.is_contiguous() and _rows.collapsed_row_stride(tuple(x.shape), x.stride()) is None:
        x = x.contiguous()
    n = x.shape[-1]
    stride = n if x.is_contiguous() else _rows.collapsed_row_stride(tuple(x.shape), x.stride())
    shape = tuple(x.shape[:-1]) + (k,)
    values = torch.empty(shape, dtype=x.dtype, device=x.device)
    indices = torch.empty(shape, dtype=torch.int64, device=x.device)
    rows = x.numel() // n if n else 0
    if rows:
        device = x.get_device()
        dtype = tensor_key_type(x, "topk")

        def scratch(count):
            return (torch.empty(count, dtype=x.dtype, device=x.device),
                    torch.empty(count, dtype=torch.int64, device=x.device))

        on_device(device, _tk.launch_topk, device, KEY_TYPES[dtype][0], dtype, x.data_ptr(), values.data_ptr(),
                  indices.data_ptr(), rows, n, stride, k, largest, sorted, raw_stream(device), scratch)
    return values, indices


def forward(input, k, dim, largest, sorted):
    """(values, indices) along `dim` (an index into input's dims; input of at least one dim)."""
    if dim == input.dim() - 1:
        return _launch(input, k, largest, sorted)
    values, indices = _launch(input.movedim(dim, -1).contiguous(), k, largest, sorted)
    return values.movedim(-1, dim).contiguous(), indices.movedim(-1, dim).contiguous()


def _grad_input(grad_values, indices, shape, dtype, dim):
    return torch.zeros(shape, dtype=dtype, device=grad_values.device).scatter(dim, indices, grad_values)


class _TopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, k, dim, largest, sorted):
        values, indices = forward(input, k, dim, largest, sorted)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.shape, ctx.dtype, ctx.dim = input.shape, input.dtype, dim
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        indices, = ctx.saved_tensors
        return _grad_input(grad_values, indices, ctx.shape, ctx.dtype, ctx.dim), None, None, None, None


_topk_apply = fast_apply(_TopK)


def _fake(x, k, dim, largest, sorted):
    shape = list(x.shape)
    shape[dim] = k
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


def _setup(ctx, inputs, output):
    x, _, dim, _, _ = inputs
    ctx.save_for_backward(output[1])
    ctx.shape, ctx.dtype, ctx.dim = x.shape, x.dtype, dim


def _backward(ctx, grad_values, grad_indices):
    indices, = ctx.saved_tensors
    return _grad_input(grad_values, indices, ctx.shape, ctx.dtype, ctx.dim), None, None, None, None


_OP = custom_op("topk", "(Tensor x, int k, int dim, bool largest, bool sorted) -> (Tensor, Tensor)",
                forward, _fake, _backward, _setup)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk on rawops kernels: the k largest (largest=False: smallest) elements along dim
    and their int64 indices, as torch.return_types.topk (module docstring for what copies)."""
    _, dim, k = _checked(input, k, dim, largest, sorted)
    largest, sorted = bool(largest), bool(sorted)
    if input.dim() == 0:  # one element: itself, at index 0
        values, indices = topk(input.reshape(1), k, 0, largest, sorted)
        return torch.return_types.topk((values.reshape(()), indices.reshape(())))
    if compiling():
        values, indices = _OP(input, k, dim, largest, sorted)
    elif needs_grad(input):
        values, indices = _topk_apply(input, k, dim, largest, sorted)
    else:
        values, indices = forward(input, k, dim, largest, sorted)
    return torch.return_types.topk((values, indices))
