"""The rotary family's contract (rope in place on q and k), through the CuPy API and the torch adapter:
launch plans and argument checks without a GPU; against transformers' apply_rotary_pos_emb (re-implemented
here in float64) and Meta's interleaved pairs with one."""
import pytest

from test_validation import BASE, FAR, OTHER, FakeCAI, assert_passes_validation

import rawops
from rawops import rotary

B, S, HQ, HK, D = 2, 5, 4, 2, 16


def f32(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<f4", ptr, **kw)


def f16(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<f2", ptr, **kw)


def _args(make=f32, cos_shape=(S, D)):
    return (make((B, S, HQ, D)), make((B, S, HK, D), ptr=OTHER), make(cos_shape, ptr=FAR),
            make(cos_shape, ptr=FAR + 0x10000))


# ------------------------------------------------------------------------------ launch plans (pure)
def test_aligned_heads_take_16_byte_units():
    strides = (S * 40 * 128, 40 * 128, 128, 0, 0, 0, 0, 128, 0, 128)
    blocks, flags = rotary.rope_plan(B, S, 32, 8, 128, 2, (0, 0, 0, 0), strides, False, 792)
    assert flags == rotary.FLAG_VECTORS
    # half split: a unit is the vectors at i and i + 64 of HEADS heads
    units = B * S * -(-40 // rotary.HEADS) * (64 // 8)
    assert blocks == min(-(-units // rotary.THREADS), 792)
    blocks_interleaved, flags = rotary.rope_plan(B, S, 32, 8, 128, 2, (0, 0, 0, 0), strides, True, 792)
    assert flags == rotary.FLAG_VECTORS | rotary.FLAG_INTERLEAVED
    assert blocks_interleaved == blocks, "interleaved with whole vectors in each half: the half split's units"
    # interleaved, 24 wide in 16-bit: 3 vectors a head, halves of 12 not whole vectors: a vector a unit
    strides24 = (S * 40 * 24, 40 * 24, 24, 0, 0, 0, 0, 24, 0, 24)
    blocks, flags = rotary.rope_plan(B, S, 32, 8, 24, 2, (0, 0, 0, 0), strides24, True, 792)
    assert flags == rotary.FLAG_VECTORS | rotary.FLAG_INTERLEAVED
    assert blocks == -(-(B * S * -(-40 // rotary.HEADS) * 3) // rotary.THREADS)


@pytest.mark.parametrize("dim,pointers,strides,interleaved,why", [
    (12, (0, 0, 0, 0), (12 * 4, 12, 12) * 2 + (0, 12, 0, 12), False, "half of 12 is not a whole vector of 8"),
    (12, (0, 0, 0, 0), (12 * 4, 12, 12) * 2 + (0, 12, 0, 12), True, "12 is not a whole vector of 8"),
    (16, (2, 0, 0, 0), (64, 16, 16) * 2 + (0, 16, 0, 16), False, "q off 16 bytes"),
    (16, (0, 0, 0, 0), (64, 20, 16) * 2 + (0, 16, 0, 16), False, "a stride of 20 half elements"),
    (16, (0, 0, 0, 0), (64, 16, 16) * 2 + (0, 16, 0, 17), False, "sin's stride"),
])
def test_pair_by_pair_where_vectors_do_not_fit(dim, pointers, strides, interleaved, why):
    blocks, flags = rotary.rope_plan(2, 3, 4, 4, dim, 2, pointers, strides, interleaved, 792)
    assert not flags & rotary.FLAG_VECTORS, why
    assert blocks == -(-(2 * 3 * -(-8 // rotary.HEADS) * (dim // 2)) // rotary.THREADS)


def test_the_grid_is_bounded_by_the_resident_blocks():
    blocks, _ = rotary.rope_plan(64, 8192, 32, 8, 128, 2, (0,) * 4, (0,) * 10, False, 792)
    assert blocks == 792


def test_layout_names():
    assert rotary.interleaved_of("neox") is False and rotary.interleaved_of("half") is False
    assert rotary.interleaved_of("llama") is True and rotary.interleaved_of("interleaved") is True
    assert rotary.qk_order("bshd") == (0, 1, 2) and rotary.qk_order("bhsd") == (0, 2, 1)


def test_heads_of_one_fused_buffer_are_disjoint_and_overlapping_ones_are_not():
    # (B, S, 8 + 2 + 2, 64) qkv: q heads 0-7, k heads 8-9, each position a row of 768
    dims_q, dims_k, strides = (2, 5, 8, 64), (2, 5, 2, 64), (5 * 768, 768, 64)
    assert rotary.heads_disjoint(0, 8 * 64 * 2, 2, dims_q, dims_k, strides, strides)
    assert not rotary.heads_disjoint(0, 7 * 64 * 2, 2, dims_q, dims_k, strides, strides), "k starts inside q's heads"
    assert not rotary.heads_disjoint(0, 8 * 64 * 2, 2, dims_q, dims_k, strides, (5 * 768, 768, 640)), "k's heads spill"
    assert not rotary.heads_disjoint(0, 8 * 64 * 2, 2, dims_q, dims_k, strides, (5 * 768, 512, 64)), "other strides"


# ------------------------------------------------------------------------------ argument checks
@pytest.mark.parametrize("layout", ["neox", "llama", "half", "interleaved"])
@pytest.mark.parametrize("make", [f32, f16], ids=["f32", "f16"])
def test_valid_calls_get_past_validation(layout, make):
    assert_passes_validation(rawops.rope, *_args(make), layout)
    assert_passes_validation(rawops.rope_backward, *_args(make), layout)
    assert_passes_validation(rawops.rope, *_args(make, (1, S, D)), layout)
    assert_passes_validation(rawops.rope, *_args(make, (B, S, D)), layout)
    q, _, cos, sin = _args(make)
    assert_passes_validation(rawops.rope, q, None, cos, sin, layout)


def test_bhsd_and_strided_views_get_past_validation():
    # (B, H, S, D) as HF holds q: the transpose of a (B, S, H, D) buffer
    q = f32((B, HQ, S, D), strides=(S * HQ * D * 4, D * 4, HQ * D * 4, 4))
    k = f32((B, HK, S, D), ptr=OTHER, strides=(S * HK * D * 4, D * 4, HK * D * 4, 4))
    assert_passes_validation(rawops.rope, q, k, f32((S, D), ptr=FAR), f32((S, D), ptr=FAR + 0x10000),
                             qk_layout="bhsd")
    # q and k as views of one fused qkv buffer (B, S, HQ + 2 HK, D): disjoint heads
    row = (HQ + 2 * HK) * D
    q = f32((B, S, HQ, D), strides=(S * row * 4, row * 4, D * 4, 4))
    k = f32((B, S, HK, D), ptr=BASE + HQ * D * 4, strides=(S * row * 4, row * 4, D * 4, 4))
    assert_passes_validation(rawops.rope, q, k, f32((S, D), ptr=FAR), f32((S, D), ptr=FAR + 0x10000))


@pytest.mark.parametrize("bad,error,match", [
    ("gptj", ValueError, r"^layout must be 'neox'"), (None, TypeError, r"^layout must be a string"),
])
def test_layout_is_checked_first(bad, error, match):
    with pytest.raises(error, match=match):
        rawops.rope(FakeCAI((2,), "<i4"), None, None, None, bad)


def test_qk_layout_is_checked():
    with pytest.raises(ValueError, match=r"^qk_layout must be 'bshd'"):
        rawops.rope(*_args(), qk_layout="sbhd")


def test_q_checks_name_q():
    _, k, cos, sin = _args()
    with pytest.raises(TypeError, match=r"^q has dtype <i4; rope supports float32, float16, bfloat16"):
        rawops.rope(FakeCAI((B, S, HQ, D), "<i4"), k, cos, sin)
    with pytest.raises(ValueError, match=r"^q has shape \(5, 4, 16\); expected 4 dims"):
        rawops.rope(f32((S, HQ, D)), k, cos, sin)
    with pytest.raises(ValueError, match=r"^q has a head dim of 15; rope rotates pairs"):
        rawops.rope(f32((B, S, HQ, 15)), None, f32((S, 15), ptr=FAR), f32((S, 15), ptr=FAR + 0x10000))
    with pytest.raises(ValueError, match=r"^q's last dim is not contiguous"):
        rawops.rope(f32((B, S, HQ, D), strides=(S * HQ * D * 4, HQ * D * 4, 4, HQ * 4)), k, cos, sin)
    with pytest.raises(ValueError, match=r"^q is read-only"):
        rawops.rope(f32((B, S, HQ, D), readonly=True), k, cos, sin)
    with pytest.raises(ValueError, match=r"^q has strides .* under which elements share memory"):
        rawops.rope(f32((B, S, HQ, D), strides=(S * D * 4, D * 4, 0, 4)), k, cos, sin)  # a broadcast over heads
    with pytest.raises(ValueError, match=r"^q is misaligned"):
        rawops.rope(f32((B, S, HQ, D), ptr=BASE + 2), k, cos, sin)


def test_k_must_match_q_but_its_heads():
    q, _, cos, sin = _args()
    with pytest.raises(TypeError, match=r"^k has dtype float16, expected float32 like q"):
        rawops.rope(q, f16((B, S, HK, D), ptr=OTHER), cos, sin)
    with pytest.raises(ValueError, match=r"^k has sequence 6, expected 5 like q"):
        rawops.rope(q, f32((B, S + 1, HK, D), ptr=OTHER), cos, sin)
    with pytest.raises(ValueError, match=r"^k has head dim 8, expected 16 like q"):
        rawops.rope(q, f32((B, S, HK, 8), ptr=OTHER), cos, sin)
    with pytest.raises(ValueError, match=r"^q and k overlap; rope writes both in place"):
        rawops.rope(q, f32((B, S, HK, D), ptr=BASE + 64), cos, sin)


def test_cos_and_sin_checks_name_them():
    q, k, _, _ = _args()
    sin = f32((S, D), ptr=FAR + 0x10000)
    with pytest.raises(ValueError, match=r"^cos has shape \(5, 8\); expected \(5, 16\), \(1, 5, 16\) or \(2, 5, 16\)"):
        rawops.rope(q, k, f32((S, 8), ptr=FAR), sin)
    with pytest.raises(ValueError, match=r"^cos has shape \(3, 5, 16\)"):
        rawops.rope(q, k, f32((3, S, D), ptr=FAR), sin)
    with pytest.raises(TypeError, match=r"^sin has dtype float16, expected float32 like q"):
        rawops.rope(q, k, f32((S, D), ptr=FAR), f16((S, D), ptr=FAR + 0x10000))
    with pytest.raises(ValueError, match=r"^cos overlaps q, which rope writes in place"):
        rawops.rope(q, k, f32((S, D), ptr=BASE + 64), sin)
    with pytest.raises(ValueError, match=r"^sin's last dim is not contiguous"):
        rawops.rope(q, k, f32((S, D), ptr=FAR), f32((S, D), ptr=FAR + 0x10000, strides=(4, S * 4)))


def test_backward_names_dq_and_dk():
    _, k, cos, sin = _args()
    with pytest.raises(TypeError, match=r"^dq has dtype <i4"):
        rawops.rope_backward(FakeCAI((B, S, HQ, D), "<i4"), k, cos, sin)
    with pytest.raises(ValueError, match=r"^dq and dk overlap"):
        rawops.rope_backward(f32((B, S, HQ, D)), f32((B, S, HK, D), ptr=BASE + 4 * D), cos, sin)


def test_adapter_refuses_bad_arguments_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops.torch_adapter import rotary as ta_rot

    q, k, cos, sin = torch.ones(B, S, HQ, D), torch.ones(B, S, HK, D), torch.ones(S, D), torch.ones(S, D)
    with pytest.raises(ValueError, match=r"^layout must be 'neox'"):
        ta_rot.rope(q, k, cos, sin, "gptj")
    with pytest.raises(TypeError, match=r"^q must be a torch.Tensor"):
        ta_rot.rope([1.0], k, cos, sin)
    with pytest.raises((TypeError, ValueError), match=r"^q"):  # a CPU tensor
        ta_rot.rope(q, k, cos, sin)
    with pytest.raises(ValueError, match=r"^unsqueeze_dim must be 1"):
        ta_rot.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)


# ------------------------------------------------------------------------------ GPU: against float64 references
torch = pytest.importorskip("torch")

gpu = pytest.mark.gpu
LAYOUTS = ["neox", "llama"]
# (batch, seq, q heads, k heads, head dim): vectors and pairs, grouped-query, odd sizes
SHAPES = [(1, 1, 1, 1, 2), (2, 7, 3, 1, 6), (2, 9, 3, 2, 24), (2, 33, 4, 2, 64), (3, 17, 5, 5, 80),
          (2, 128, 32, 8, 128), (1, 300, 2, 0, 256)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]


def hf_rotate_half(x):
    """transformers' rotate_half (models/llama/modeling_llama.py)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb, as it is written there (q, k (B, H, S, D) for unsqueeze_dim 1)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + hf_rotate_half(q) * sin, k * cos + hf_rotate_half(k) * sin


def rotate_every_two(x):
    """GPT-J's rotate_every_two: pairs (2p, 2p + 1) -> (-x[2p + 1], x[2p])."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def tables(batch, seq, dim, layout, dtype, per_batch=False, base=10000.0):
    """cos, sin as HF's LlamaRotaryEmbedding builds them (float64, then dtype): halves repeated for
    "neox", each frequency repeated in place for "llama" (Meta's / GPT-J's pairs)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, device="cuda", dtype=torch.float64) / dim))
    pos = torch.arange(seq, device="cuda", dtype=torch.float64)
    if per_batch:  # HF's position_ids per batch row: shifted positions
        pos = pos[None] + torch.arange(batch, device="cuda", dtype=torch.float64)[:, None] * 3
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), -1) if layout == "neox" else freqs.repeat_interleave(2, -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def reference(q, k, cos, sin, layout, dq=None, dk=None):
    """(q_out, k_out[, dq_in, dk_in]) in float64 for q, k (B, S, H, D), cos / sin (S, D) or (B, S, D)."""
    q64, k64 = q.double().requires_grad_(), (k.double().requires_grad_() if k is not None else None)
    c, s = cos.double(), sin.double()
    c, s = (c[None] if c.dim() == 2 else c), (s[None] if s.dim() == 2 else s)
    if layout == "neox":  # HF's own function on (B, H, S, D)
        qo, ko = hf_apply_rotary_pos_emb(q64.transpose(1, 2), (k64 if k64 is not None else q64).transpose(1, 2), c, s)
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    else:
        c, s = c[:, :, None], s[:, :, None]
        qo = q64 * c + rotate_every_two(q64) * s
        ko = (k64 if k64 is not None else q64) * c + rotate_every_two(k64 if k64 is not None else q64) * s
    if dq is None:
        return qo.detach(), (ko.detach() if k is not None else None)
    outs, grads, leaves = [qo], [dq.double()], [q64]
    if k is not None:
        outs.append(ko), grads.append(dk.double()), leaves.append(k64)
    g = torch.autograd.grad(outs, leaves, grads)
    return qo.detach(), (ko.detach() if k is not None else None), g[0], (g[1] if k is not None else None)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_and_backward_match_float64(layout, shape, dtype):
    from gpu_reference import DTYPES, assert_close, random, to_cupy

    dt = DTYPES[dtype]
    b, s, hq, hk, d = shape
    q, dq = random((b, s, hq, d), dt), random((b, s, hq, d), dt)
    k, dk = (random((b, s, hk, d), dt), random((b, s, hk, d), dt)) if hk else (None, None)
    cos, sin = tables(b, s, d, layout, dt)
    rq, rk, rdq, rdk = reference(q, k, cos, sin, layout, dq, dk)
    qc, kc = q.clone(), (k.clone() if k is not None else None)
    out = rawops.rope(to_cupy(qc), to_cupy(kc) if kc is not None else None, to_cupy(cos), to_cupy(sin), layout)
    assert out[0] is not None and int(out[0].data.ptr) == qc.data_ptr(), "in place: q itself comes back"
    assert_close(qc, rq, dt, f"{layout} q")
    if k is not None:
        assert_close(kc, rk, dt, f"{layout} k")
    rawops.rope_backward(to_cupy(dq), to_cupy(dk) if dk is not None else None, to_cupy(cos), to_cupy(sin), layout)
    assert_close(dq, rdq, dt, f"{layout} dq")
    if k is not None:
        assert_close(dk, rdk, dt, f"{layout} dk")


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_batch_tables_bhsd_views_and_untouched_padding(layout):
    """cos / sin (B, S, D); q, k as (B, H, S, D) transposes of (B, S, H, D + 8) buffers whose last 8
    columns are NaN: the heads rotate where they lie and the padding is never written."""
    from gpu_reference import assert_close, random, to_cupy

    dt, (b, s, hq, hk, d) = torch.bfloat16, (2, 40, 4, 2, 64)
    qbuf = torch.full((b, s, hq, d + 8), float("nan"), device="cuda", dtype=dt)
    kbuf = torch.full((b, s, hk, d + 8), float("nan"), device="cuda", dtype=dt)
    q0, k0 = random((b, s, hq, d), dt), random((b, s, hk, d), dt)
    qbuf[..., :d], kbuf[..., :d] = q0, k0
    cos, sin = tables(b, s, d, layout, dt, per_batch=True)
    rq, rk = reference(q0, k0, cos, sin, layout)
    q, k = qbuf[..., :d].transpose(1, 2), kbuf[..., :d].transpose(1, 2)  # (B, H, S, D) views
    rawops.rope(to_cupy(q), to_cupy(k), to_cupy(cos), to_cupy(sin), layout, qk_layout="bhsd")
    assert_close(qbuf[..., :d], rq, dt, "q through a bhsd view")
    assert_close(kbuf[..., :d], rk, dt, "k through a bhsd view")
    assert torch.isnan(qbuf[..., d:]).all() and torch.isnan(kbuf[..., d:]).all(), "padding written"


@gpu
def test_views_of_one_fused_qkv_buffer():
    from gpu_reference import assert_close, random, to_cupy

    dt, (b, s, hq, hk, d) = torch.float16, (2, 64, 8, 2, 128)
    qkv = random((b, s, hq + 2 * hk, d), dt)
    q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
    v0 = v.clone()
    cos, sin = tables(b, s, d, "neox", dt)
    rq, rk = reference(q.clone(), k.clone(), cos, sin, "neox")
    rawops.rope(to_cupy(q), to_cupy(k), to_cupy(cos), to_cupy(sin))
    assert_close(q, rq, dt, "q in qkv")
    assert_close(k, rk, dt, "k in qkv")
    assert torch.equal(v, v0), "v untouched"


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_adapter_autograd_on_views_of_a_projection(layout, dtype):
    """HF's pattern: q = q_proj(x).view(B, S, H, D).transpose(1, 2), rotated in place (mark_dirty)."""
    from gpu_reference import DTYPES, assert_close, random
    from rawops.torch_adapter import rotary as ta_rot

    dt = DTYPES[dtype]
    b, s, hq, hk, d = 2, 33, 4, 2, 64
    x = random((b, s, hq * d), dt).requires_grad_()
    y = random((b, s, hk * d), dt).requires_grad_()
    cos, sin = tables(b, s, d, layout, dt)
    q = (x * 1).view(b, s, hq, d).transpose(1, 2)
    k = (y * 1).view(b, s, hk, d).transpose(1, 2)
    qo, ko = ta_rot.rope(q, k, cos, sin, layout, qk_layout="bhsd")
    assert qo is q and ko is k
    dq, dk = random(qo.shape, dt), random(ko.shape, dt)
    torch.autograd.backward((qo, ko), (dq.clone(), dk.clone()))  # the backward may rotate them in place
    rq, rk, rdq, rdk = reference(x.detach().view(b, s, hq, d), y.detach().view(b, s, hk, d), cos, sin, layout,
                                 dq.transpose(1, 2), dk.transpose(1, 2))
    assert_close(qo.transpose(1, 2), rq, dt, "adapter q")
    assert_close(ko.transpose(1, 2), rk, dt, "adapter k")
    assert_close(x.grad.view(b, s, hq, d), rdq, dt, "adapter dq")
    assert_close(y.grad.view(b, s, hk, d), rdk, dt, "adapter dk")


@gpu
def test_adapter_apply_rotary_pos_emb_is_a_drop_in():
    from gpu_reference import assert_close, random
    from rawops.torch_adapter import rotary as ta_rot

    dt, (b, s, hq, hk, d) = torch.bfloat16, (2, 50, 4, 2, 128)
    q, k = random((b, hq, s, d), dt), random((b, hk, s, d), dt)
    cos, sin = tables(b, s, d, "neox", dt, per_batch=True)
    q0, k0 = q.clone(), k.clone()
    qe, ke = ta_rot.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(q, q0) and torch.equal(k, k0), "out of place, as transformers'"
    rq, rk = hf_apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    assert_close(qe, rq, dt, "q_embed")
    assert_close(ke, rk, dt, "k_embed")
    try:  # the real one, where transformers is installed
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        return
    hq_, hk_ = apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    assert_close(qe, hq_, dt, "q_embed vs transformers")
    assert_close(ke, hk_, dt, "k_embed vs transformers")


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_adapter_compiles_fullgraph(layout):
    from gpu_reference import assert_close, random
    from rawops.torch_adapter import rotary as ta_rot

    dt, (b, s, hq, hk, d) = torch.float32, (2, 16, 4, 2, 64)
    x, y = random((b, s, hq, d), dt).requires_grad_(), random((b, s, hk, d), dt).requires_grad_()
    cos, sin = tables(b, s, d, layout, dt)

    def fn(x, y):
        q, k = x * 1, y * 1
        q, k = ta_rot.rope(q, k, cos, sin, layout)
        return (q * 2).sum() + (k * 3).sum()

    torch.compile(fn, fullgraph=True)(x, y).backward()
    rq, rk, rdq, rdk = reference(x.detach(), y.detach(), cos, sin, layout, torch.full_like(x, 2),
                                 torch.full_like(y, 3))
    assert_close(x.grad, rdq, dt, "compiled dq")
    assert_close(y.grad, rdk, dt, "compiled dk")


@gpu
def test_rope_then_backward_is_the_identity_for_frequency_tables():
    """Rotation by sin then by -sin: the forward's transpose is its inverse for a table of angles."""
    from gpu_reference import assert_close, random, to_cupy

    for layout in LAYOUTS:
        q = random((2, 64, 8, 128), torch.float32)
        cos, sin = tables(2, 64, 128, layout, torch.float32)
        x = q.clone()
        rawops.rope(to_cupy(x), None, to_cupy(cos), to_cupy(sin), layout)
        rawops.rope_backward(to_cupy(x), None, to_cupy(cos), to_cupy(sin), layout)
        assert_close(x, q.double(), torch.float32, f"{layout} round trip", factor=2)
