"""Rotary position embeddings: rope, in place on q and k, forward and backward. Kernels: kernels/rotary.cu.

rope(q, k, cos, sin, layout="neox", *, qk_layout="bshd") rotates every head row x of q and k with its
position's cos and sin rows:  x <- x * cos + R(x) * sin,  R pairing the elements two ways:
  layout "neox" (alias "half"): pairs (i, i + D/2), R(x) = cat(-x[D/2:], x[:D/2]): HF's
      rotate_half, exactly transformers' apply_rotary_pos_emb, which every HF Llama, Mistral, Qwen
      model uses (and GPT-NeoX, where the name comes from). HF's LlamaRotaryEmbedding returns cos and
      sin of this form: cat(freqs, freqs), each half repeated.
  layout "llama" (alias "interleaved"): pairs (2p, 2p + 1), R(x)[2p] = -x[2p + 1], R(x)[2p + 1] = x[2p]:
      Meta's original Llama code (view_as_complex on consecutive pairs) and GPT-J's
      rotate_every_two. Its cos / sin are each frequency repeated in place: cos[..., 2p] =
      cos[..., 2p + 1] = cos(theta_p), i.e. half_cos.repeat_interleave(2, -1). HF converts Meta's
      checkpoints by permuting the q / k projection rows so that "neox" applies: a checkpoint in HF
      form takes "neox", whatever the model is called.
cos and sin are applied element by element as given (D wide each), so any table of either form
works; the backward is the exact transpose (rotation by -sin where the halves, or the pair's two
entries, are equal, as every table built from frequencies has them).
rope_backward(dq, dk, cos, sin, layout) rotates the gradients back, in place on dq and dk.

Shapes: q (B, S, Hq, D) and k (B, S, Hk, D) with qk_layout "bshd" (flash-attention's layout, a
Linear's output viewed as heads); qk_layout "bhsd" takes (B, H, S, D) instead (HF's q after
transpose(1, 2)). The layout is a keyword, never guessed from the shape (B, H, S, D with H == S
reads either way). Hq and Hk may differ (grouped-query attention); k may be None (q alone). D even.
cos, sin: (S, D), (1, S, D) or (B, S, D) (HF's LlamaRotaryEmbedding returns (B, S, D)), of q's dtype.
float32, float16 or bfloat16, math in float32 with one rounding.

Layouts: q, k, cos and sin may be any strided views whose last dim is contiguous (a (B, S, H, D)
view of a fused qkv projection's output, a transpose to (B, H, S, D)): rotated where they lie, no
copy. 16-byte vectors where every pointer is 16-byte aligned, every stride a whole number of vectors
and D / 2 ("neox") or D ("llama") whole vectors; otherwise pair by pair (correct, slower). A view
whose rows share memory, q and k sharing an element (the head slices of one buffer, as a fused qkv
projection's output viewed as heads, are fine: heads_disjoint), or cos / sin overlapping either is a
ValueError naming them. Returns (q, k), the same arrays. Launches go on CuPy's current stream of the data's device, or
on `stream=`; every check raises a TypeError / ValueError naming the argument before any launch.
"""
from ._launch import (FLOAT_SUFFIXES, allocating_on, as_array, launch, resolve_device, stream_pointer,
                      wait_for_producer)
from ._launch.launch import layout_overlaps_itself
from . import _constants, _modules

FAMILY = "rotary"

_ARGS = ("q", "k", "cos", "sin", "batch", "seq", "q_heads", "k_heads", "dim", "q_b", "q_s", "q_h", "k_b", "k_s",
         "k_h", "cos_b", "cos_s", "sin_b", "sin_s", "flags")
# The family's table: kernel base name -> argument names; each exists once per dtype.
KERNELS = {"rope_fwd": _ARGS, "rope_bwd": _ARGS}
KINDS = "pppp" + "q" * 16

THREADS = _constants.ROPE_THREADS
HEADS = _constants.ROPE_HEADS
FLAG_VECTORS, FLAG_INTERLEAVED = _constants.ROPE_FLAG_VECTORS, _constants.ROPE_FLAG_INTERLEAVED
# layout -> interleaved pairs
LAYOUTS = {"neox": False, "half": False, "llama": True, "interleaved": True}
QK_LAYOUTS = ("bshd", "bhsd")


# ------------------------------------------------------------------------------ launch plans (pure)
def rope_plan(batch, seq, q_heads, k_heads, dim, itemsize, pointers, strides, interleaved, resident):
    """(blocks, flags) of one launch: 16-byte units (FLAG_VECTORS) where every pointer is 16-byte
    aligned, every stride (elements) a whole number of vectors and a head's unit span (D / 2 for the
    half split, D interleaved) whole vectors; one thread a unit (the vectors at i and i + D / 2, or
    one vector where interleaved halves are not whole vectors, or one pair without vectors) of
    HEADS heads, a grid-stride loop over at most `resident` blocks (those the
    device holds at once)."""
    per_vector = 16 // itemsize
    span = dim if interleaved else dim // 2
    vec = (span % per_vector == 0 and all(p % 16 == 0 for p in pointers)
           and all((s * itemsize) % 16 == 0 for s in strides))
    # interleaved with whole vectors in each half: two vectors a unit (at i and i + D / 2), as the half split's
    two = interleaved and (dim // 2) % per_vector == 0
    per_head = ((dim // 2 if two else span) // per_vector) if vec else dim // 2
    units = batch * seq * -(-(q_heads + k_heads) // HEADS) * per_head
    blocks = max(1, min(-(-units // THREADS), resident))
    return blocks, (FLAG_VECTORS if vec else 0) | (FLAG_INTERLEAVED if interleaved else 0)


def interleaved_of(layout):
    """True for the interleaved pairs ("llama" / "interleaved"), False for the half split ("neox" /
    "half"); TypeError / ValueError naming layout."""
    if not isinstance(layout, str):  # plain Python: the torch adapter calls it inside torch.compile
        raise TypeError(f"layout must be a string, got {type(layout).__name__}")
    value = LAYOUTS.get(layout)
    if value is None:
        raise ValueError(f"layout must be 'neox' (alias 'half': HF's rotate_half) or 'llama' (alias 'interleaved': "
                         f"Meta's and GPT-J's pairs), got {layout!r}")
    return value


def qk_order(qk_layout):
    """The dims of (batch, seq, heads) in q's shape for qk_layout 'bshd' or 'bhsd'."""
    if not isinstance(qk_layout, str):
        raise TypeError(f"qk_layout must be a string, got {type(qk_layout).__name__}")
    if qk_layout not in QK_LAYOUTS:
        raise ValueError(f"qk_layout must be 'bshd' (q of shape (B, S, H, D)) or 'bhsd' ((B, H, S, D)), got "
                         f"{qk_layout!r}")
    return (0, 1, 2) if qk_layout == "bshd" else (0, 2, 1)


def launch_rope(direction, device, dtype, itemsize, q, k, cos, sin, dims, strides, interleaved, stream):
    """One launch on raw pointers checked by the caller (k 0: q alone). dims: (batch, seq, q_heads,
    k_heads, dim); strides: (q_b, q_s, q_h, k_b, k_s, k_h, cos_b, cos_s, sin_b, sin_s) in elements."""
    batch, seq, q_heads, k_heads, dim = dims
    if not (batch and seq and (q_heads + k_heads) and dim):
        return
    function = _modules.function_pointer(FAMILY, f"rope_{direction}_{FLOAT_SUFFIXES[dtype]}", device)
    blocks, flags = rope_plan(batch, seq, q_heads, k_heads, dim, itemsize, (q, k if k else q, cos, sin),
                              strides if k_heads else strides[:3] + strides[6:], interleaved,
                              _modules.resident_blocks(function, THREADS, 0, device))
    launch(function, (blocks,),
           THREADS, 0, stream, (q, k if k else q, cos, sin, *dims, *strides, flags), KINDS, device)


# ------------------------------------------------------------------------------ argument checks
def _strides(a):
    strides = a.element_strides()
    if strides is None:
        raise ValueError(f"{a.name} has strides that are not a whole number of its {a.itemsize}-byte elements; no "
                         "kernel can index it: pass a contiguous copy")
    return strides


def _span(a, strides):
    """[first byte, past the last byte) of a's elements (None when empty)."""
    if a.size == 0:
        return None
    low = sum(s * (d - 1) for d, s in zip(a.shape, strides) if s < 0)
    high = sum(s * (d - 1) for d, s in zip(a.shape, strides) if s > 0)
    return a.ptr + low * a.itemsize, a.ptr + (high + 1) * a.itemsize


def _overlap(a, b):
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def heads_disjoint(q_ptr, k_ptr, itemsize, q_dims, k_dims, q_strides, k_strides):
    """True where q and k, whose spans overlap, provably share no element: the head slices of one
    (B, S, W) buffer, as q and k viewed from a fused qkv projection's output. q_dims / k_dims (batch,
    seq, heads, dim), strides (b, s, h) in elements: the same b and s strides, each position's heads
    of q and of k in disjoint ranges inside one row of the s stride, and the rows of different
    positions apart (b stride at least S rows)."""
    batch, seq, q_heads, dim = q_dims
    k_heads = k_dims[2]
    (qb, qs, qh), (kb, ks, kh) = q_strides, k_strides
    delta, rem = divmod(k_ptr - q_ptr, itemsize)
    if rem or qb != kb or qs != ks or qs <= 0 or qh < 0 or kh < 0:
        return False
    q_end = (q_heads - 1) * qh + dim
    k_lo, k_end = delta, delta + (k_heads - 1) * kh + dim
    if not (q_end <= k_lo or k_end <= 0):
        return False
    if max(q_end, k_end) - min(0, k_lo) > qs:
        return False
    return batch == 1 or qb >= seq * qs


def heads_operand(obj, name, order, like=None, like_dims=None):
    """(array, (batch, seq, heads, dim), (b, s, h) strides) of q / k: a float 4-D array, last dim
    contiguous and even, writable, rows not sharing memory; with `like` (and its dims), like's dtype,
    batch, seq and dim."""
    a = as_array(obj, name)
    if like is not None:
        if a.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {a.dtype_text}, expected {like.dtype_text} like {like.name}")
    elif a.dtype < 0 or a.dtype >= len(FLOAT_SUFFIXES):
        raise TypeError(f"{name} has dtype {a.dtype_text}; rope supports float32, float16, bfloat16")
    if len(a.shape) != 4:
        raise ValueError(f"{name} has shape {a.shape}; expected 4 dims, (B, S, H, D) or with qk_layout='bhsd' "
                         "(B, H, S, D)")
    strides = _strides(a)
    dims = tuple(a.shape[d] for d in order) + (a.shape[3],)
    if dims[3] % 2:
        raise ValueError(f"{name} has a head dim of {dims[3]}; rope rotates pairs: it must be even")
    if dims[3] > 1 and strides[3] != 1:
        raise ValueError(f"{name}'s last dim is not contiguous (stride {strides[3]} elements); rope needs each "
                         f"head's elements consecutive: pass a copy (e.g. {name}.copy())")
    if a.itemsize and a.ptr % a.itemsize:
        raise ValueError(f"{name} is misaligned: address 0x{a.ptr:x} is not a multiple of its {a.itemsize}-byte "
                         "element")
    if a.readonly:
        raise ValueError(f"{name} is read-only; rope writes it in place")
    if a.size and layout_overlaps_itself(a.shape, strides):
        raise ValueError(f"{name} has strides {strides} (elements) under which elements share memory; rope writes "
                         "it in place: every element needs memory of its own")
    if like is not None:
        for i, what in ((0, "batch"), (1, "sequence"), (3, "head dim")):
            if dims[i] != like_dims[i]:
                raise ValueError(f"{name} has {what} {dims[i]}, expected {like_dims[i]} like {like.name}")
    return a, dims, tuple(strides[d] for d in order)


def table_operand(obj, name, q, q_dims):
    """(array, (b, s) strides) of cos / sin: q's dtype, (S, D), (1, S, D) or (B, S, D), last dim
    contiguous."""
    a = as_array(obj, name)
    batch, seq, _, dim = q_dims
    if a.dtype != q.dtype:
        raise TypeError(f"{name} has dtype {a.dtype_text}, expected {q.dtype_text} like {q.name}")
    shape = a.shape
    if not (shape == (seq, dim) or (len(shape) == 3 and shape[1:] == (seq, dim) and shape[0] in (1, batch))):
        raise ValueError(f"{name} has shape {shape}; expected ({seq}, {dim}), (1, {seq}, {dim}) or ({batch}, {seq}, "
                         f"{dim}): one row of D per position (and batch row)")
    strides = _strides(a)
    if dim > 1 and strides[-1] != 1:
        raise ValueError(f"{name}'s last dim is not contiguous (stride {strides[-1]} elements): pass a copy")
    if a.itemsize and a.ptr % a.itemsize:
        raise ValueError(f"{name} is misaligned: address 0x{a.ptr:x} is not a multiple of its {a.itemsize}-byte "
                         "element")
    batch_stride = strides[0] if len(shape) == 3 and shape[0] > 1 else 0
    return a, (batch_stride, strides[-2] if seq > 1 else 0)


# ------------------------------------------------------------------------------ CuPy API
def _run(direction, q, k, cos, sin, layout, qk_layout, stream, names):
    import cupy

    interleaved = interleaved_of(layout)
    order = qk_order(qk_layout)
    Q, q_dims, q_strides = heads_operand(q, names[0], order)
    if k is not None:
        K, k_dims, k_strides = heads_operand(k, names[1], order, like=Q, like_dims=q_dims)
    else:
        K, k_dims, k_strides = None, (0, 0, 0, 0), (0, 0, 0)
    C, c_strides = table_operand(cos, "cos", Q, q_dims)
    S, s_strides = table_operand(sin, "sin", Q, q_dims)
    spans = {names[0]: _span(Q, _strides(Q))}
    if K is not None:
        spans[names[1]] = _span(K, _strides(K))
        if _overlap(spans[names[0]], spans[names[1]]) and not heads_disjoint(Q.ptr, K.ptr, Q.itemsize, q_dims,
                                                                             k_dims, q_strides, k_strides):
            raise ValueError(f"{names[0]} and {names[1]} overlap; rope writes both in place: they need memory of "
                             "their own")
    for table in (C, S):
        for written, span in spans.items():
            if _overlap(_span(table, _strides(table)), span):
                raise ValueError(f"{table.name} overlaps {written}, which rope writes in place")
    device = resolve_device(Q)
    for other in (K, C, S):
        if other is not None and resolve_device(other) != device:
            raise ValueError(f"{other.name} is on device {other.device}, {Q.name} on device {device}; all arguments "
                             "must be on one GPU")
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (Q, K, C, S):
            if a is not None:
                wait_for_producer(a, s)
        dims = (q_dims[0], q_dims[1], q_dims[2], k_dims[2], q_dims[3])
        launch_rope(direction, device, Q.dtype, Q.itemsize, Q.ptr, K.ptr if K is not None else 0, C.ptr, S.ptr,
                    dims, (*q_strides, *k_strides, *c_strides, *s_strides), interleaved, s)
    return q, k


def rope(q, k, cos, sin, layout="neox", *, qk_layout="bshd", stream=None):
    """q, k <- x * cos + R(x) * sin in place, R per layout ('neox': HF's rotate_half; 'llama':
    interleaved pairs; the module docstring); returns (q, k). k may be None."""
    return _run("fwd", q, k, cos, sin, layout, qk_layout, stream, ("q", "k"))


def rope_backward(dq, dk, cos, sin, layout="neox", *, qk_layout="bshd", stream=None):
    """The gradients of rope rotated back in place (the transpose: x * cos - R(x * sin)); returns
    (dq, dk). dk may be None."""
    return _run("bwd", dq, dk, cos, sin, layout, qk_layout, stream, ("dq", "dk"))
