"""fused_linear_cross_entropy for torch, the losses family's second op: F.cross_entropy(F.linear(input,
weight, bias), target) with the logits never whole, its autograd for input, weight and bias, the
module FusedLinearCrossEntropyLoss and `rawops::` custom ops for torch.compile. The chunks, the
memory and accum_dtype: rawops/_losses_linear.py; the loss's formula: rawops/losses.py.

The GEMMs are torch's (torch.mm / torch.addmm: cuBLAS, on torch's current stream, into buffers
from torch's allocator); the cross-entropy kernel is rawops', launched on the same stream, writing
each chunk's d loss / d logits over the chunk's logits.

reduction "mean" / "sum": every gradient is computed in the forward (as Liger-Kernel does), for a
loss gradient of 1; the backward multiplies them by grad_output in place on the GPU, and leaves
them untouched when grad_output is exactly 1 (the usual `loss.backward()`), checked on the device
without a host synchronisation (cross_entropy_scale). Only the gradients autograd asks for are
computed (a frozen weight: no grad_weight GEMM). That backward runs once: a second one through the
same graph (retain_graph=True) is a RuntimeError. reduction "none": the forward computes the losses
alone (one GEMM a chunk) and keeps input, weight and bias; the backward runs the chunks again with
grad_output per row (three GEMMs a chunk): four GEMMs in all rather than three.

Under torch.compile the custom ops do the same work in new tensors, and the backward of "mean" /
"sum" multiplies the gradients by grad_output with torch's ops (one pass over each, even when it
is 1), with every gradient computed.

Layouts: input (..., H) as (T, H) through reshape (a copy only where torch's reshape makes one),
(H,) as one row with a 0-dim target; weight (V, H) and bias any layout torch.mm takes; target (T,)
or input's leading shape, int64 (or int32). Bad targets: NaN loss and NaN gradients (no check that
synchronises).
"""
import torch

from .. import _losses_linear as _fl, losses as _ce
from . import losses as _ta_ce
from ._common import compiling, custom_op, fast_apply, needs_grad, on_device, raw_stream

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_TARGET_TYPES = (torch.int64, torch.int32)


# ------------------------------------------------------------------- checks (Python: dynamo traces them)
def _checked(input, weight, target, bias):
    """(input as (T, H), target as (T,), bias, the 'none' loss's shape), every tensor argument
    checked: TypeError / ValueError naming it, before any launch."""
    tensors = (("input", input), ("weight", weight), ("target", target), ("bias", bias))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) and not (t is None and name == "bias"):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dtype not in _FLOATS:
        raise TypeError(f"input has dtype {input.dtype}; fused_linear_cross_entropy supports float32, float16, "
                        "bfloat16")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != input.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, expected {input.dtype} like input")
    if target.dtype not in _TARGET_TYPES:
        raise TypeError(f"target has dtype {target.dtype}; fused_linear_cross_entropy takes class indices as int64 "
                        "(or int32)")
    if input.dim() == 1:  # one row, a 0-dim target (F.cross_entropy's unbatched form)
        if target.dim() != 0:
            raise ValueError(f"target has shape {tuple(target.shape)}, expected () for input of shape "
                             f"{tuple(input.shape)}")
        input, target = input.unsqueeze(0), target.reshape(1)
        none_shape = ()
    else:
        none_shape = tuple(input.shape[:-1])
    _fl.check_dims(tuple(input.shape), tuple(weight.shape), tuple(target.shape),
                   tuple(bias.shape) if bias is not None else None)
    for name, t in tensors:
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; rawops kernels need CUDA tensors")
        if t.device != input.device:
            raise ValueError(f"{name} is on {t.device}, input on {input.device}; all arguments must be on one GPU")
    return input.reshape(-1, input.shape[-1]), target.reshape(-1), none_shape


def _accum_dtype(accum_dtype):
    if accum_dtype is not None and not isinstance(accum_dtype, (torch.dtype, str)):
        raise TypeError(f"accum_dtype must be None or torch.float32, got {type(accum_dtype).__name__}")
    return _fl.check_accum_dtype(accum_dtype)


# ------------------------------------------------------------------- the chunks (no autograd)
def forward(x, weight, target, bias, ignore_index, smoothing, reduction, z_loss, chunk_rows=None, fp32_acc=False,
            need=(True, True, True), grad_output=None):
    """(loss, grad_input, grad_weight, grad_bias) of checked 2-D x (T, H), weight (V, H), target
    (T,), bias (V,) or None: the gradients of `need` (input, weight, bias: None for the others,
    and for all when none is needed) for the loss times grad_output (None: 1; 0-dim, or (T,) for
    'none')."""
    tokens, h = x.shape
    v = weight.shape[0]
    itemsize = x.element_size()
    rows = _fl.chunk_plan(tokens, v, itemsize, chunk_rows)
    need_x, need_w, need_b = need[0], need[1], need[2] and bias is not None
    grad = need_x or need_w or need_b
    fp32_acc = fp32_acc and x.dtype != torch.float32
    device = x.get_device()
    new = dict(device=x.device)
    counts = torch.empty(_ce.COUNTS, dtype=torch.int64, **new)
    loss_rows = torch.empty(tokens, dtype=torch.float32, **new)
    loss = torch.empty((tokens,) if reduction == "none" else (), dtype=torch.float32, **new)  # module docstring
    buf = torch.empty((rows, v), dtype=x.dtype, **new)
    gi = torch.empty((tokens, h), dtype=x.dtype, **new) if need_x else None
    gw = gw_acc = None
    if need_w:
        gw = gw_acc = torch.empty((v, h), dtype=torch.float32 if fp32_acc else x.dtype, **new)
    gb_acc = torch.empty(v, dtype=torch.float32, **new) if need_b else None
    go = None
    if grad_output is not None:
        go = grad_output.to(x.dtype).contiguous()
    i32 = target.dtype == torch.int32
    t_stride = target.stride(0) if tokens else 1
    code = _fl_code(x.dtype)
    mean = reduction == "mean"
    s = raw_stream(device)
    if mean:
        on_device(device, _ce.launch_targets, device, code, target.data_ptr(), i32, counts.data_ptr(), tokens, v,
                  t_stride, ignore_index, s)
    for start, stop in _fl.chunks(tokens, rows):
        r = stop - start
        xc, logits = x[start:stop], buf[:r]
        if bias is not None:
            torch.addmm(bias, xc, weight.t(), out=logits)
        else:
            torch.mm(xc, weight.t(), out=logits)
        go_ptr = 0
        if go is not None:
            go_ptr = go.data_ptr() + (start * itemsize if reduction == "none" else 0)
        on_device(device, _ce.launch_rows, device, code, itemsize, logits.data_ptr(),
                  target.data_ptr() + start * t_stride * target.element_size(), i32,
                  logits.data_ptr() if grad else 0, loss_rows.data_ptr() + start * 4, 0, counts.data_ptr(), go_ptr,
                  reduction == "none", r, v, v, t_stride, v, ignore_index, mean, smoothing, z_loss, s)
        if need_x:
            torch.mm(logits, weight, out=gi[start:stop])
        if need_w:
            if fp32_acc:
                _accumulate_fp32(gw_acc, logits.t(), xc, start == 0)
            elif start == 0:
                torch.mm(logits.t(), xc, out=gw_acc)
            else:
                torch.addmm(gw_acc, logits.t(), xc, out=gw_acc)
        if need_b:
            if start == 0:
                torch.sum(logits, 0, dtype=torch.float32, out=gb_acc)
            else:
                gb_acc.add_(logits.sum(0, dtype=torch.float32))
    on_device(device, _ce.launch_reduce, device, _fl_code(torch.float32), loss_rows.data_ptr(), counts.data_ptr(),
              loss.data_ptr(), tokens, reduction, s)
    del buf
    if tokens == 0:  # no chunk wrote them
        for a in (gw_acc, gb_acc):
            if a is not None:
                a.zero_()
    if need_w and fp32_acc:
        gw = gw_acc.to(x.dtype)
    gb = gb_acc.to(x.dtype) if need_b else None
    return loss, gi, gw, gb


def _accumulate_fp32(acc, a, b, first):
    """acc (float32) = a @ b (first), else acc += a @ b, for 16-bit a and b: cuBLAS writing float32
    (torch.mm / torch.addmm with out_dtype, and a float32 `input` to addmm)."""
    try:
        if first:
            torch.mm(a, b, out_dtype=torch.float32, out=acc)
        else:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError) as error:
        raise RuntimeError(f"accum_dtype=torch.float32 needs torch.addmm(float32 input, 16-bit mat1, mat2, "
                           f"out_dtype=torch.float32), which this torch ({torch.__version__}) refuses ({error}); "
                           "pass accum_dtype=None") from error


def _fl_code(dtype):
    return _FLOATS.index(dtype)


def _scale_in_place(grad, grad_output):
    """grad (2-D, C-contiguous) *= grad_output (0-dim) on the GPU, no pass when it is exactly 1:
    cross_entropy_scale over rows none of which is ignored (a target 0 at stride 0, ignore_index -1)."""
    rows, n = grad.shape
    if not rows or not n:
        return
    device = grad.get_device()
    keep = torch.zeros(1, dtype=torch.int64, device=grad.device)
    factor = grad_output.to(grad.dtype).contiguous()
    on_device(device, _ce.launch_scale, device, _fl_code(grad.dtype), grad.element_size(), grad.data_ptr(),
              grad.data_ptr(), keep.data_ptr(), False, factor.data_ptr(), False, rows, n, n, n, 0, -1,
              raw_stream(device))


def _check_targets(target, v, ignore_index):
    """ValueError naming the first target outside [0, v) that is not ignore_index (one launch and a
    synchronising read)."""
    if compiling():
        raise ValueError("check_targets=True reads a flag back from the GPU, which torch.compile cannot trace: "
                         "pass check_targets=False inside compiled code")
    _ta_ce._refuse_check_while_capturing()
    counts = torch.empty(_ce.COUNTS, dtype=torch.int64, device=target.device)
    device = target.get_device()
    on_device(device, _ce.launch_targets, device, 0, target.data_ptr(), target.dtype == torch.int32,
              counts.data_ptr(), target.shape[0], v, target.stride(0) if target.shape[0] else 1, ignore_index,
              raw_stream(device))
    _, bad, value = counts.tolist()
    if bad >= 0:
        raise ValueError(_ce.bad_target_message(bad, value, v, ignore_index))


# ------------------------------------------------------------------- autograd
class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, bias, ignore_index, smoothing, reduction, z_loss, chunk_rows, fp32_acc):
        ctx.options = (ignore_index, smoothing, reduction, z_loss, chunk_rows, fp32_acc)
        ctx.has_bias = bias is not None
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3])
        if reduction == "none":
            loss = forward(x, weight, target, bias, ignore_index, smoothing, reduction, z_loss, chunk_rows,
                           fp32_acc, need=(False, False, False))[0]
            ctx.save_for_backward(x, weight, target, bias)
            ctx.need = need
            return loss
        loss, gi, gw, gb = forward(x, weight, target, bias, ignore_index, smoothing, reduction, z_loss, chunk_rows,
                                   fp32_acc, need=need)
        ctx.save_for_backward(gi, gw, gb, target)
        ctx.used = False
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        ignore_index, smoothing, reduction, z_loss, chunk_rows, fp32_acc = ctx.options
        if reduction == "none":
            x, weight, target, bias = ctx.saved_tensors
            _, gi, gw, gb = forward(x, weight, target, bias, ignore_index, smoothing, reduction, z_loss, chunk_rows,
                                    fp32_acc, need=ctx.need, grad_output=grad_output)
            return gi, gw, None, gb, None, None, None, None, None, None
        if ctx.used:
            raise RuntimeError("rawops fused_linear_cross_entropy: backward ran twice through one graph "
                               "(retain_graph=True); its gradients were handed to autograd by the first run. Compute "
                               "the loss again")
        ctx.used = True
        gi, gw, gb, target = ctx.saved_tensors
        if gi is not None:
            _ta_ce.scale(gi, grad_output, target, ignore_index, out=gi)
        if gw is not None:
            _scale_in_place(gw, grad_output)
        if gb is not None:
            _scale_in_place(gb.view(1, -1), grad_output)
        return gi, gw, None, gb, None, None, None, None, None, None


_apply = fast_apply(_FusedLinearCrossEntropy)


# ------------------------------------------------------------------- custom ops (torch.compile)
_OPTIONS = "int ignore_index, float label_smoothing, str reduction, float z_loss, int chunk_rows, bool fp32_acc"
_ARGS = f"Tensor input, Tensor weight, Tensor target, Tensor? bias, {_OPTIONS}"


def _rows_arg(chunk_rows):
    return chunk_rows or None  # 0 in the schema: the default plan


def _fused_impl(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss, chunk_rows, fp32_acc):
    loss, gi, gw, gb = forward(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss,
                               _rows_arg(chunk_rows), fp32_acc)
    return loss, gi, gw, gb if gb is not None else input.new_empty(0)


def _loss_fake(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss, chunk_rows, fp32_acc):
    return input.new_empty((input.shape[0],) if reduction == "none" else (), dtype=torch.float32)


def _fused_fake(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss, chunk_rows, fp32_acc):
    return (_loss_fake(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss, chunk_rows,
                       fp32_acc), input.new_empty(input.shape), weight.new_empty(weight.shape),
            input.new_empty(bias.shape if bias is not None else (0,)))


def _fused_setup(ctx, inputs, output):
    ctx.has_bias = inputs[3] is not None
    ctx.save_for_backward(output[1], output[2], output[3])


def _fused_backward(ctx, dloss, dgi, dgw, dgb):
    gi, gw, gb = ctx.saved_tensors
    return gi * dloss, gw * dloss, None, (gb * dloss if ctx.has_bias else None), None, None, None, None, None, None


def _loss_impl(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss, chunk_rows, fp32_acc):
    return forward(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss,
                   _rows_arg(chunk_rows), fp32_acc, need=(False, False, False))[0]


def _backward_impl(input, weight, target, bias, grad_output, ignore_index, label_smoothing, reduction, z_loss,
                   chunk_rows, fp32_acc):
    _, gi, gw, gb = forward(input, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss,
                            _rows_arg(chunk_rows), fp32_acc, grad_output=grad_output)
    return gi, gw, gb if gb is not None else input.new_empty(0)


def _backward_fake(input, weight, target, bias, grad_output, ignore_index, label_smoothing, reduction, z_loss,
                   chunk_rows, fp32_acc):
    return input.new_empty(input.shape), weight.new_empty(weight.shape), input.new_empty(
        bias.shape if bias is not None else (0,))


_backward_op = custom_op("fused_linear_cross_entropy_backward",
                         f"(Tensor input, Tensor weight, Tensor target, Tensor? bias, Tensor grad_output, {_OPTIONS}) "
                         "-> (Tensor, Tensor, Tensor)", _backward_impl, _backward_fake)


def _loss_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3], inputs[3])
    ctx.scalars = inputs[4:]


def _loss_backward(ctx, dloss):
    input, weight, target, bias = ctx.saved_tensors
    gi, gw, gb = _backward_op(input, weight, target, bias, dloss, *ctx.scalars)
    return gi, gw, None, (gb if bias is not None else None), None, None, None, None, None, None


_fused_op = custom_op("fused_linear_cross_entropy_fused", f"({_ARGS}) -> (Tensor, Tensor, Tensor, Tensor)",
                      _fused_impl, _fused_fake, _fused_backward, _fused_setup)
_loss_op = custom_op("fused_linear_cross_entropy", f"({_ARGS}) -> Tensor", _loss_impl, _loss_fake, _loss_backward,
                     _loss_setup)


# ------------------------------------------------------------------- public
def fused_linear_cross_entropy(input, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                               reduction="mean", z_loss=0.0, *, chunk_rows=None, accum_dtype=None,
                               check_targets=False):
    """F.cross_entropy(F.linear(input, weight, bias), target, ignore_index=..., reduction=...,
    label_smoothing=...) plus z_loss (z_loss * logsumexp^2 a row, Liger's lse_square_scale), the
    (tokens, V) logits never whole: chunks of chunk_rows tokens (None: logits of at most 256 MiB a
    chunk, rawops/_losses_linear.py). Autograd for input, weight and bias. accum_dtype=torch.float32:
    grad_weight of a 16-bit weight accumulated in float32 (V x H x 4 bytes more; torch.addmm's
    out_dtype, which needs a recent torch); None: in weight's dtype, one rounding a chunk.
    check_targets=True: a target outside [0, V) that is not ignore_index raises ValueError before
    any GEMM (a synchronising read; refused under torch.compile and CUDA graph capture); without
    it such a row's loss and gradients are NaN."""
    ignore_index, smoothing, reduction, z, chunk_rows, _ = _fl.check_options(
        ignore_index, label_smoothing, reduction, z_loss, chunk_rows, None)
    fp32_acc = _accum_dtype(accum_dtype)
    check_targets = _ce.check_bool(check_targets, "check_targets")
    x, t, none_shape = _checked(input, weight, target, bias)
    if check_targets:
        _check_targets(t, weight.shape[0], ignore_index)
    if compiling():
        options = (ignore_index, smoothing, reduction, z, chunk_rows or 0, fp32_acc)
        if reduction != "none" and needs_grad(x, weight, bias):
            loss = _fused_op(x, weight, t, bias, *options)[0]
        else:
            loss = _loss_op(x, weight, t, bias, *options)
    elif needs_grad(x, weight, bias):
        loss = _apply(x, weight, t, bias, ignore_index, smoothing, reduction, z, chunk_rows, fp32_acc)
    else:
        loss = forward(x, weight, t, bias, ignore_index, smoothing, reduction, z, chunk_rows, fp32_acc,
                       need=(False, False, False))[0]
    return loss.reshape(none_shape) if reduction == "none" and tuple(loss.shape) != none_shape else loss


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """cross_entropy(F.linear(input, weight, bias), target) without the whole logits: forward(input,
    weight, target, bias=None) (input first, as F.linear; Liger's module takes the weight first).
    Options as fused_linear_cross_entropy; no parameters, no state_dict entries."""

    def __init__(self, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0, *, chunk_rows=None,
                 accum_dtype=None, check_targets=False):
        super().__init__()
        (self.ignore_index, self.label_smoothing, self.reduction, self.z_loss, self.chunk_rows,
         _) = _fl.check_options(ignore_index, label_smoothing, reduction, z_loss, chunk_rows, None)
        _accum_dtype(accum_dtype)
        self.accum_dtype = accum_dtype
        self.check_targets = _ce.check_bool(check_targets, "check_targets")

    def forward(self, input, weight, target, bias=None):
        return fused_linear_cross_entropy(input, weight, target, bias, self.ignore_index, self.label_smoothing,
                                          self.reduction, self.z_loss, chunk_rows=self.chunk_rows,
                                          accum_dtype=self.accum_dtype, check_targets=self.check_targets)

    def extra_repr(self):
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, chunk_rows={self.chunk_rows}, "
                f"accum_dtype={self.accum_dtype}")
