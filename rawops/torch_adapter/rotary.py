"""The rotary family for torch: rope in place on q and k (autograd marks them dirty, as torch's own
in-place ops do), its `rawops::` custom ops for torch.compile, and apply_rotary_pos_emb, a drop-in
for transformers' function of that name.

rope(q, k, cos, sin, layout="neox", qk_layout="bshd") -> (q, k), rotated where they lie (rawops.rotary
explains the layouts: "neox" is HF's rotate_half, "llama" Meta's interleaved pairs). Autograd: the
gradients of q and k are rotated back in place too (the incoming gradient's own buffer, as Liger
does), unless its layout is one the kernel cannot write (a broadcast, a non-contiguous last dim) or
dq and dk share memory: then that gradient is copied first. cos and sin get no gradient. Under
torch.compile the op runs out of place (a copy of q and k rotated, then copied back into q and k:
two more passes), through custom ops whose schema has no mutation.

apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) returns new tensors, as
transformers' does: q and k copied, then rotated in place ("neox"); unsqueeze_dim 1 is HF's q (B, H,
S, D), 2 is (B, S, H, D).
"""
import torch

from .. import rotary as _rot
from .._launch import tensor_code
from .._launch.launch import layout_overlaps_itself
from ._common import compiling, custom_op, fast_apply, needs_grad, on_device, raw_stream


def _check_heads(t, name, like=None, like_name="q"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    code = tensor_code(t, name, like, like_name, False)
    if t.dim() != 4:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 4 dims, (B, S, H, D) or with qk_layout='bhsd' "
                         "(B, H, S, D)")
    if t.shape[-1] % 2:
        raise ValueError(f"{name} has a head dim of {t.shape[-1]}; rope rotates pairs: it must be even")
    return code


def _writable_in_place(t):
    """Whether the kernel can rotate t where it lies: last dim contiguous, no two elements sharing memory."""
    return (t.shape[-1] <= 1 or t.stride(-1) == 1) and not (t.numel() and layout_overlaps_itself(tuple(t.shape),
                                                                                              t.stride()))


def _overlap(a, b):
    if a is None or b is None or not a.numel() or not b.numel():
        return False
    def span(t):
        low = sum(s * (d - 1) for d, s in zip(t.shape, t.stride()) if s < 0)
        high = sum(s * (d - 1) for d, s in zip(t.shape, t.stride()) if s > 0)
        e = t.element_size()
        return t.data_ptr() + low * e, t.data_ptr() + (high + 1) * e
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _table(t, name, q, order):
    """cos / sin made last-dim contiguous (a copy otherwise: it is only read); (tensor, (b, s) strides)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    tensor_code(t, name, q, "q", False)
    batch, seq, dim = q.shape[order[0]], q.shape[order[1]], q.shape[3]
    shape = tuple(t.shape)
    if not (shape == (seq, dim) or (len(shape) == 3 and shape[1:] == (seq, dim) and shape[0] in (1, batch))):
        raise ValueError(f"{name} has shape {shape}; expected ({seq}, {dim}), (1, {seq}, {dim}) or ({batch}, {seq}, "
                         f"{dim}): one row of D per position (and batch row)")
    if dim > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    return t, (t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else 0, t.stride(-2) if seq > 1 else 0)


def _check_pair(q, k, bhsd):
    """k's batch, sequence and head dim like q's, both writable in place, and no element in both."""
    order = (0, 2, 1) if bhsd else (0, 1, 2)
    _check_heads(k, "k", like=q)
    for i, what in ((0, "batch"), (1, "sequence")):
        if k.shape[order[i]] != q.shape[order[i]]:
            raise ValueError(f"k has {what} {k.shape[order[i]]}, expected {q.shape[order[i]]} like q")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"k has head dim {k.shape[3]}, expected {q.shape[3]} like q")
    _check_writable(k, "k")
    if _overlap(q, k) and not _rot.heads_disjoint(q.data_ptr(), k.data_ptr(), q.element_size(),
                                                  tuple(q.shape[d] for d in order) + (q.shape[3],),
                                                  tuple(k.shape[d] for d in order) + (k.shape[3],),
                                                  tuple(q.stride(d) for d in order), tuple(k.stride(d) for d in order)):
        raise ValueError("q and k overlap; rope writes both in place: they need memory of their own")


def _check_writable(t, name):
    if not _writable_in_place(t):
        raise ValueError(f"{name} cannot be rotated in place: its last dim is not contiguous or its elements "
                         "share memory (pass a contiguous tensor)")


def launch(direction, q, k, cos, sin, interleaved, bhsd):
    """rope's forward or backward in place on q and k (k None: q alone); the caller made them
    writable in place (_writable_in_place) and disjoint."""
    order = (0, 2, 1) if bhsd else (0, 1, 2)
    code = _check_heads(q, "q")
    cos, c_strides = _table(cos, "cos", q, order)
    sin, s_strides = _table(sin, "sin", q, order)
    _check_writable(q, "q")
    if k is not None:
        _check_pair(q, k, bhsd)
    dims = (q.shape[order[0]], q.shape[order[1]], q.shape[order[2]], k.shape[order[2]] if k is not None else 0,
            q.shape[3])
    q_strides = tuple(q.stride(d) for d in order)
    k_strides = tuple(k.stride(d) for d in order) if k is not None else (0, 0, 0)
    device = q.get_device()
    on_device(device, _rot.launch_rope, direction, device, code, q.element_size(), q.data_ptr(),
              k.data_ptr() if k is not None else 0, cos.data_ptr(), sin.data_ptr(), dims,
              (*q_strides, *k_strides, *c_strides, *s_strides), interleaved, raw_stream(device))


def _gradient(t, other=None):
    """t itself where the kernel can rotate it in place and it shares no memory with `other`, else a
    contiguous copy."""
    if t is None:
        return None
    if _writable_in_place(t) and not _overlap(t, other):
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()


# ------------------------------------------------------------------- autograd and custom ops
class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, interleaved, bhsd):
        launch("fwd", q, k, cos, sin, interleaved, bhsd)
        ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        ctx.save_for_backward(cos, sin)
        ctx.interleaved, ctx.bhsd, ctx.has_k = interleaved, bhsd, k is not None
        return q, k

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq = _gradient(dq)
        dk = _gradient(dk, dq) if ctx.has_k else None
        launch("bwd", dq, dk, cos, sin, ctx.interleaved, ctx.bhsd)
        return dq, dk, None, None, None, None


class _RopeOne(torch.autograd.Function):
    """One tensor rotated in place: autograd refuses a Function that modifies a view in place and
    returns more than one tensor, so q and k that are views (HF's q_proj(x).view(...).transpose(1, 2))
    go through this, one launch each."""

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, bhsd):
        launch("fwd", x, None, cos, sin, interleaved, bhsd)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin)
        ctx.interleaved, ctx.bhsd = interleaved, bhsd
        return x

    @staticmethod
    def backward(ctx, dx):
        cos, sin = ctx.saved_tensors
        dx = _gradient(dx)
        launch("bwd", dx, None, cos, sin, ctx.interleaved, ctx.bhsd)
        return dx, None, None, None, None


_rope_apply = fast_apply(_Rope)
_rope_one_apply = fast_apply(_RopeOne)


def _out_of_place(direction, q, k, cos, sin, interleaved, bhsd):
    q2 = q.clone()
    k2 = k.clone() if k is not None else None
    if k2 is not None and _overlap(q2, k2):  # clones of overlapping views of one buffer stay apart
        k2 = k2.contiguous()
    launch(direction, q2, k2, cos, sin, interleaved, bhsd)
    return q2, (k2 if k2 is not None else q.new_empty(0))


def _fake(q, k, cos, sin, interleaved, bhsd):
    return torch.empty_like(q), (torch.empty_like(k) if k is not None else q.new_empty(0))


_SCHEMA = "(Tensor q, Tensor? k, Tensor cos, Tensor sin, bool interleaved, bool bhsd) -> (Tensor, Tensor)"
_backward_op = custom_op(
    "rope_out_backward", _SCHEMA.replace("Tensor q, Tensor? k", "Tensor dq, Tensor? dk"),
    lambda dq, dk, cos, sin, interleaved, bhsd: _out_of_place("bwd", dq, dk, cos, sin, interleaved, bhsd), _fake)


def _setup(ctx, inputs, output):
    q, k, cos, sin, interleaved, bhsd = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved, ctx.bhsd, ctx.has_k = interleaved, bhsd, k is not None


def _formula(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    dq2, dk2 = _backward_op(dq, dk if ctx.has_k else None, cos, sin, ctx.interleaved, ctx.bhsd)
    return dq2, (dk2 if ctx.has_k else None), None, None, None, None


_forward_op = custom_op(
    "rope_out", _SCHEMA, lambda q, k, cos, sin, interleaved, bhsd: _out_of_place("fwd", q, k, cos, sin, interleaved,
                                                                                 bhsd),
    _fake, _formula, _setup)


# ------------------------------------------------------------------- public functions
def rope(q, k, cos, sin, layout="neox", qk_layout="bshd"):
    """q, k <- x * cos + R(x) * sin in place (rawops.rotary: 'neox' is HF's rotate_half, 'llama'
    Meta's interleaved pairs; qk_layout 'bshd' or 'bhsd'); returns (q, k). k may be None."""
    interleaved = _rot.interleaved_of(layout)
    bhsd = _rot.qk_order(qk_layout) != (0, 1, 2)
    if not compiling():  # errors name the arguments (the custom ops check for themselves)
        _check_heads(q, "q")
        if k is not None:
            _check_heads(k, "k", like=q)
    if compiling():
        q2, k2 = _forward_op(q, k, cos, sin, interleaved, bhsd)
        q.copy_(q2)
        if k is not None:
            k.copy_(k2)
        return q, k
    if needs_grad(q, k):
        if k is not None and (q._is_view() or k._is_view()):
            # checked together first (shapes, overlap), as the one-launch path does
            _check_pair(q, k, bhsd)
            return (_rope_one_apply(q, cos, sin, interleaved, bhsd), _rope_one_apply(k, cos, sin, interleaved, bhsd))
        return _rope_apply(q, k, cos, sin, interleaved, bhsd)
    launch("fwd", q, k, cos, sin, interleaved, bhsd)
    return q, k


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb on rawops: new tensors q_embed, k_embed (q and k copied
    contiguous, then rotated in place, "neox"). unsqueeze_dim 1: q (B, H, S, D) (HF's); 2: (B, S, H,
    D). position_ids is ignored, as in transformers (cos and sin are already per position)."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"unsqueeze_dim must be 1 (q of shape (B, H, S, D)) or 2 ((B, S, H, D)), got {unsqueeze_dim}")
    qk_layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
    q_embed = q.clone(memory_format=torch.contiguous_format)
    k_embed = k.clone(memory_format=torch.contiguous_format) if k is not None else None
    return rope(q_embed, k_embed, cos, sin, "neox", qk_layout)
