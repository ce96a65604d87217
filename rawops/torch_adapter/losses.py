"""The losses family for torch: cross_entropy with torch.nn.functional.cross_entropy's signature
(class-index targets, no class weights) plus z_loss, its autograd, `rawops::` custom ops for
torch.compile and the module CrossEntropyLoss. Formula, reductions, ignored rows and bad targets:
rawops/losses.py.

The gradient is computed in the forward, in the same launch as the loss (the logits read twice,
the gradient written once), into a buffer the backward hands to autograd after multiplying it by
the loss's gradient on the GPU (rows whose factor is exactly 1, the usual `loss.backward()`, are
not touched: no host synchronisation, no extra pass). The buffer is a new tensor, or, with
inplace_backward=True, the logits' own memory: no second (N, V) tensor exists, but the logits
hold their gradient from the forward on, so pass it only when nothing else reads the logits
afterwards (the usual `F.cross_entropy(model(x), y)`; not when the logits are also returned or
logged). Its backward runs once: a second backward through the same graph (retain_graph=True) is
a RuntimeError, since the first handed the buffer to autograd.

Under torch.compile the custom ops keep the fused forward but allocate (inplace_backward is
ignored there: a custom op cannot hand back memory it was given), and the backward scales into a
new tensor; check_targets=True is refused there (it synchronises).

Layouts: input (N, C) or (C,) runs as it is when its rows are row-strided; (N, C, d1, ...) (torch's
class dim 1) is moved to (N * d1 * ..., C) in a contiguous copy (one extra read and write), as is
a layout whose rows are not row-strided. int64 targets (torch's), int32 taken too.
"""
import torch

from .. import _rows, losses as _ce
from .._launch import tensor_code
from ._common import compiling, custom_op, fast_apply, needs_grad, on_device, raw_stream

_TARGET_TYPES = (torch.int64, torch.int32)


# ------------------------------------------------------------------- checks
def _logits(x):
    """(x row-strided, dtype code, rows, n, row stride) of 2-D CUDA float logits (a copy where
    the rows are not row-strided)."""
    code = tensor_code(x, "input", None, "x", False)
    if not x.is_contiguous() and _rows.collapsed_row_stride(tuple(x.shape), x.stride()) is None:
        x = x.contiguous()
    rows, n = x.shape
    if n == 0:
        raise ValueError(f"input has shape {tuple(x.shape)}: C = 0 classes; cross_entropy needs at least one")
    stride = n if x.is_contiguous() else _rows.collapsed_row_stride(tuple(x.shape), x.stride())
    return x, code, rows, n, stride


def _target(t, x, rows):
    """(is int32, element stride) of a (rows,) int64 / int32 tensor on x's GPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _TARGET_TYPES:
        if t.is_floating_point():
            raise TypeError(f"target has dtype {t.dtype}: class-probability targets are not supported by rawops' "
                            "cross_entropy; pass class indices (int64)")
        raise TypeError(f"target has dtype {t.dtype}; cross_entropy takes class indices as int64 (or int32)")
    if t.device != x.device:
        raise ValueError(f"target is on {t.device}, input on {x.device}; all arguments must be on one GPU")
    if tuple(t.shape) != (rows,):
        raise ValueError(f"target has shape {tuple(t.shape)}, expected ({rows},): one class index per row of input")
    return t.dtype == torch.int32, (t.stride(0) if rows else 1)


def _refuse_check_while_capturing():
    if torch.cuda.is_current_stream_capturing():
        raise ValueError("check_targets=True reads a flag back from the GPU, which a stream being captured into a "
                         "CUDA graph cannot do: pass check_targets=False while capturing")


# ------------------------------------------------------------------- raw launches (no autograd)
def forward(x, target, ignore_index, smoothing, reduction, z_loss, grad=None, check_targets=False):
    """(loss, gradient) of 2-D logits x: the gradient None when grad is None, else written into a
    new tensor (grad='new') or into x itself (grad='inplace'; x row-strided, rows apart)."""
    x2, code, rows, n, stride = _logits(x)
    i32, t_stride = _target(target, x2, rows)
    if grad == "inplace" and x2 is not x:
        grad = "new"  # a copy was made: it is ours to overwrite, but nobody would see it
    if check_targets:
        _refuse_check_while_capturing()
    device = x2.get_device()
    counts = torch.empty(_ce.COUNTS, dtype=torch.int64, device=x2.device)
    loss_rows = torch.empty(rows, dtype=torch.float32, device=x2.device)
    loss = torch.empty((rows,) if reduction == "none" else (), dtype=x2.dtype, device=x2.device)
    if grad == "new":
        g, g_stride = torch.empty((rows, n), dtype=x2.dtype, device=x2.device), n
    elif grad == "inplace":
        if rows > 1 and abs(stride) < n:
            raise ValueError("input has rows that share memory: inplace_backward=True cannot write their gradients "
                             "there; pass inplace_backward=False")
        g, g_stride = x2, stride
    else:
        g, g_stride = None, n
    on_device(device, _launch_forward, device, code, x2, target, i32, g, g_stride, loss_rows, counts, loss, rows,
              n, stride, t_stride, ignore_index, smoothing, reduction, z_loss, check_targets)
    if check_targets:
        _, bad, value = counts.tolist()
        if bad >= 0:
            raise ValueError(_ce.bad_target_message(bad, value, n, ignore_index))
    return loss, g


def _launch_forward(device, code, x, target, i32, g, g_stride, loss_rows, counts, loss, rows, n, stride, t_stride,
                    ignore_index, smoothing, reduction, z_loss, check_targets):
    s = raw_stream(device)
    mean = reduction == "mean"
    if mean or check_targets:
        _ce.launch_targets(device, code, target.data_ptr(), i32, counts.data_ptr(), rows, n, t_stride,
                           ignore_index, s)
    if rows:
        _ce.launch_rows(device, code, x.element_size(), x.data_ptr(), target.data_ptr(), i32,
                        g.data_ptr() if g is not None else 0, loss_rows.data_ptr(), 0, counts.data_ptr(), 0, False,
                        rows, n, stride, t_stride, g_stride if g is not None else n, ignore_index, mean, smoothing,
                        z_loss, s)
    _ce.launch_reduce(device, code, loss_rows.data_ptr(), counts.data_ptr(), loss.data_ptr(), rows, reduction, s)


def scale(grad, grad_output, target, ignore_index, out=None):
    """grad * grad_output (one value, or one a row: grad_output of one dim), 0 on ignored rows;
    into `out` (grad itself: in place, rows whose factor is 1 untouched), else a new tensor."""
    code = tensor_code(grad, "grad", None, "x", False)
    rows, n = grad.shape
    per_row = grad_output.dim() == 1
    grad_output = grad_output.to(grad.dtype).contiguous()
    out = grad.new_empty(grad.shape) if out is None else out
    i32, t_stride = _target(target, grad, rows)
    if rows and n:
        device = grad.get_device()
        on_device(device, _ce.launch_scale, device, code, grad.element_size(), grad.data_ptr(), out.data_ptr(),
                  target.data_ptr(), i32, grad_output.data_ptr(), per_row, rows, n, _row_stride(grad),
                  _row_stride(out), t_stride, ignore_index, raw_stream(device))
    return out


def _row_stride(t):
    """The row stride of a 2-D tensor whose rows are row-strided (the gradient buffers are)."""
    return t.shape[1] if t.is_contiguous() else _rows.collapsed_row_stride(tuple(t.shape), t.stride())


# ------------------------------------------------------------------- autograd and custom ops
class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, ignore_index, smoothing, reduction, z_loss, inplace, check_targets):
        loss, grad = forward(x, target, ignore_index, smoothing, reduction, z_loss,
                             "inplace" if inplace else "new", check_targets)
        # detached: autograd may then keep the buffer as the input's .grad rather than copy it
        ctx.save_for_backward(grad.detach() if grad is x else grad, target)
        ctx.ignore_index = ignore_index
        ctx.used = False
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.used:
            raise RuntimeError("rawops cross_entropy: backward ran twice through one graph (retain_graph=True); its "
                               "gradient buffer was handed to autograd by the first run. Compute the loss again")
        ctx.used = True
        grad, target = ctx.saved_tensors
        scale(grad, grad_output, target, ctx.ignore_index, out=grad)
        return grad, None, None, None, None, None, None, None


_apply = fast_apply(_CrossEntropy)

_OPTIONS = "int ignore_index, float label_smoothing, str reduction, float z_loss"


def _fake_loss(input, target, ignore_index, label_smoothing, reduction, z_loss):
    return input.new_empty((input.shape[0],) if reduction == "none" else ())


def _scale_impl(grad, grad_output, target, ignore_index):
    return scale(grad, grad_output, target, ignore_index)


def _scale_fake(grad, grad_output, target, ignore_index):
    return grad.new_empty(grad.shape)


_scale_op = custom_op("cross_entropy_scale", "(Tensor grad, Tensor grad_output, Tensor target, int ignore_index) "
                      "-> Tensor", _scale_impl, _scale_fake)


def _fused_backward(ctx, dloss, dgrad):
    grad, target = ctx.saved_tensors
    return _scale_op(grad, dloss, target, ctx.ignore_index), None, None, None, None, None


def _fused_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], inputs[1])
    ctx.ignore_index = inputs[2]


def _fused_impl(input, target, ignore_index, label_smoothing, reduction, z_loss):
    return forward(input, target, ignore_index, label_smoothing, reduction, z_loss, "new")


def _fused_fake(input, target, ignore_index, label_smoothing, reduction, z_loss):
    return _fake_loss(input, target, ignore_index, label_smoothing, reduction, z_loss), input.new_empty(input.shape)


def _loss_impl(input, target, ignore_index, label_smoothing, reduction, z_loss):
    return forward(input, target, ignore_index, label_smoothing, reduction, z_loss)[0]


_fused_op = custom_op("cross_entropy_fused", f"(Tensor input, Tensor target, {_OPTIONS}) -> (Tensor, Tensor)",
                      _fused_impl, _fused_fake, _fused_backward, _fused_setup)
_loss_op = custom_op("cross_entropy", f"(Tensor input, Tensor target, {_OPTIONS}) -> Tensor", _loss_impl,
                     _fake_loss)


# ------------------------------------------------------------------- public functions
def _reduction(size_average, reduce, reduction):
    if size_average is not None or reduce is not None:
        from torch.nn import _reduction as legacy

        return legacy.legacy_get_string(size_average, reduce)
    return reduction


def _rows_of(input, target):
    """input as (rows, C) and target as (rows,), and the shape of a 'none' loss: (N, C) as it is,
    (C,) as one row, (N, C, d1, ...) with the class dim moved last (a copy)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if input.dim() == 0:
        raise ValueError("input must have at least one dimension (the classes)")
    if input.dim() == 1:
        if target.dim() != 0:
            raise ValueError(f"target has shape {tuple(target.shape)}, expected () for input of shape "
                             f"{tuple(input.shape)}")
        return input.unsqueeze(0), target.reshape(1), ()
    if input.dim() == 2:
        return input, target, (input.shape[0],)
    expected = (input.shape[0], *input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(f"target has shape {tuple(target.shape)}, expected {expected} for input of shape "
                         f"{tuple(input.shape)}")
    return input.movedim(1, -1).reshape(-1, input.shape[1]), target.reshape(-1), expected


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0, *, z_loss=0.0, inplace_backward=False, check_targets=False):
    """torch.nn.functional.cross_entropy on rawops kernels, class-index targets without class
    weights, plus z_loss (z_loss * logsumexp^2 per row, Liger's lse_square_scale). With
    inplace_backward=True the gradient overwrites input's memory from the forward on (module
    docstring: only when nothing else reads input afterwards). check_targets=True raises
    ValueError on a target outside [0, C) that is not ignore_index (a synchronising read);
    without it such a row's loss is NaN."""
    if weight is not None:
        raise ValueError("weight: class weights are not supported by rawops' cross_entropy; pass weight=None")
    reduction = _reduction(size_average, reduce, reduction)
    ignore_index, smoothing, reduction, z = _ce.check_options(ignore_index, label_smoothing, reduction, z_loss)
    inplace = _ce.check_bool(inplace_backward, "inplace_backward")
    check_targets = _ce.check_bool(check_targets, "check_targets")
    x, t, none_shape = _rows_of(input, target)
    if compiling():
        if check_targets:
            raise ValueError("check_targets=True reads a flag back from the GPU, which torch.compile cannot trace: "
                             "pass check_targets=False inside compiled code")
        if needs_grad(x):
            loss = _fused_op(x, t, ignore_index, smoothing, reduction, z)[0]
        else:
            loss = _loss_op(x, t, ignore_index, smoothing, reduction, z)
    elif needs_grad(x):
        loss = _apply(x, t, ignore_index, smoothing, reduction, z, inplace, check_targets)
    else:
        loss = forward(x, t, ignore_index, smoothing, reduction, z, None, check_targets)[0]
    return loss.reshape(none_shape) if reduction == "none" and tuple(loss.shape) != tuple(none_shape) else loss


# ------------------------------------------------------------------- module
class CrossEntropyLoss(torch.nn.Module):
    """Drop-in torch.nn.CrossEntropyLoss (weight=None only) with z_loss, inplace_backward and
    check_targets (cross_entropy); loads torch.nn.CrossEntropyLoss's state_dict (it has none)."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0, *, z_loss=0.0, inplace_backward=False, check_targets=False):
        super().__init__()
        if weight is not None:
            raise ValueError("weight: class weights are not supported by rawops' CrossEntropyLoss; pass weight=None")
        self.register_buffer("weight", None)
        reduction = _reduction(size_average, reduce, reduction)
        self.ignore_index, self.label_smoothing, self.reduction, self.z_loss = _ce.check_options(
            ignore_index, label_smoothing, reduction, z_loss)
        self.inplace_backward = _ce.check_bool(inplace_backward, "inplace_backward")
        self.check_targets = _ce.check_bool(check_targets, "check_targets")

    def forward(self, input, target):
        return cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                             inplace_backward=self.inplace_backward, check_targets=self.check_targets)

    def extra_repr(self):
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
                f"inplace_backward={self.inplace_backward}")
