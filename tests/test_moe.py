"""The moe family's contract (moe_route, moe_permute, moe_unpermute and their backwards), through the
CuPy API and the torch adapter: launch plans, tables and argument checks without a GPU; on a GPU
against float64 torch references on fresh random data (HF's router math: softmax in float32, top-k,
renormalise; a stable sort by expert for the permutation), poisoned outputs, ties, empty experts,
one expert for every token, odd sizes, k = 1 and k = E, padding on and off, invalid ids, gradients."""
import itertools
import os
import re

import pytest

from test_validation import BASE, FAR, OTHER, FakeCAI, assert_passes_validation

import rawops
from rawops import _constants, moe

T, E, K, H = 6, 16, 2, 32


def f32(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<f4", ptr, **kw)


def f16(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<f2", ptr, **kw)


def i32(shape, ptr=OTHER, **kw):
    return FakeCAI(shape, "<i4", ptr, **kw)


def i64(shape, ptr=OTHER, **kw):
    return FakeCAI(shape, "<i8", ptr, **kw)


# ------------------------------------------------------------------------------ plans and tables (pure)
def test_index_plan_chunks_whole_steps_and_caps_the_blocks():
    assert moe.index_plan(1) == (1, moe.INDEX_MIN_CHUNK)
    assert moe.index_plan(16384 * 8) == (16384 * 8 // moe.INDEX_MIN_CHUNK, moe.INDEX_MIN_CHUNK)
    for n in (7, 513, 1 << 20, 10_000_019, (1 << 31) - 1):
        blocks, chunk = moe.index_plan(n)
        assert chunk % moe.INDEX_THREADS == 0 and chunk >= moe.INDEX_MIN_CHUNK
        assert blocks <= moe.INDEX_MAX_BLOCKS and blocks * chunk >= n > (blocks - 1) * chunk
    # at most a block an SM where the SMs are given: Qwen3's 131072 entries in 128 blocks on 132 SMs
    assert moe.index_plan(16384 * 8, 132) == (128, 1024)
    assert moe.index_plan(16384 * 2, 132) == (64, 512)  # Mixtral's: the smallest chunks already
    for n, sms in itertools.product((7, 513, 131072, 10_000_019, (1 << 31) - 1), (1, 80, 132, 148)):
        blocks, chunk = moe.index_plan(n, sms)
        assert chunk % moe.INDEX_THREADS == 0 and chunk >= moe.INDEX_MIN_CHUNK and blocks <= moe.INDEX_MAX_BLOCKS
        assert blocks <= sms or chunk == moe.INDEX_MIN_CHUNK
        assert blocks * chunk >= n > (blocks - 1) * chunk


def test_permuted_rows_leave_room_for_the_most_padding():
    assert moe.permuted_rows(100, 8, 128, 1) == 800
    assert moe.permuted_rows(100, 8, 128, 16) == 800 + 128 * 15
    # the padding the rows must hold at most: every group one row past a multiple
    counts = [1] * 128
    assert sum(-(-c // 16) * 16 for c in counts) <= moe.permuted_rows(1, 128, 128, 16)


def test_warp_grid_is_a_warp_a_token_up_to_the_resident_blocks():
    warps = moe.ROWS_THREADS // 32
    assert moe.warp_grid(1, moe.ROWS_THREADS, 792) == 1
    assert moe.warp_grid(37, moe.ROWS_THREADS, 792) == -(-37 // warps)
    assert moe.warp_grid(16384 * 8, moe.ROWS_THREADS, 792) == 792  # the resident blocks (the occupancy API's)
    assert moe.warp_grid(16384 * 8, moe.ROWS_THREADS) == 16384 * 8 // warps  # the row kernels: a covering grid


def test_row_flags_take_vectors_only_where_every_row_is_16_byte_aligned():
    assert moe.row_flags(2048, 2, (0, 256), (2048,)) == moe.FLAG_VECTORS
    assert moe.row_flags(2044, 2, (0, 256), (2044,)) == 0, "a row of 4088 bytes"
    assert moe.row_flags(2048, 2, (2, 256), (2048,)) == 0, "x off 16 bytes"
    assert moe.row_flags(2048, 2, (0, 256), (2052,)) == 0, "a row stride off 16 bytes"


def test_tables_name_every_entry_point_once():
    suffixes = ("f32", "f16", "bf16")
    assert set(moe.FAMILY_OF) == ({f"{b}_{s}" for b in moe.KERNELS for s in suffixes} | set(moe.INDEX_KERNELS))
    for base, args in {**moe.KERNELS, **moe.INDEX_KERNELS}.items():
        assert len(moe.KINDS[base]) == len(args), base
    assert set(moe.FAMILY_OF.values()) == {"moe"}


def test_the_source_defines_exactly_the_table():
    from rawops import _modules

    with open(os.path.join(_modules.kernel_source_dir(), "moe.cu")) as f:
        source = f.read()
    per_dtype = set(re.findall(r"^\s+(moe_\w+)_##suffix\(", source, flags=re.M))
    plain = set(re.findall(r"^\s+(moe_\w+)\(", source, flags=re.M))
    assert per_dtype == set(moe.KERNELS)
    assert plain - per_dtype == set(moe.INDEX_KERNELS)
    instantiated = re.findall(r"^RAWOPS_MOE\(([\w ]+),\s*(\w+)\)", source, flags=re.M)
    assert [suffix for _, suffix in instantiated] == ["f32", "f16", "bf16"]


def test_constants_fit_the_kernels():
    assert _constants.MOE_MAX_EXPERTS % 32 == 0, "a warp's lanes hold MAX_EXPERTS / 32 scores each"
    assert _constants.MOE_MAX_K <= 32, "a lane a choice"
    items = (_constants.MOE_MAX_EXPERTS + _constants.MOE_SCAN_THREADS) // _constants.MOE_SCAN_THREADS
    assert items * _constants.MOE_SCAN_THREADS >= _constants.MOE_MAX_EXPERTS + 1, "the scan holds E + 1 buckets"
    assert moe.MAX_ROWS == (1 << 31) - 1
    assert _constants.MOE_INDEX_MAX_BLOCKS % 32 == 0 and moe.INDEX_MAX_BLOCKS == _constants.MOE_INDEX_MAX_BLOCKS


# ------------------------------------------------------------------------------ argument checks (no GPU)
@pytest.mark.parametrize("make", [f32, f16], ids=["f32", "f16"])
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_valid_route_calls_get_past_validation(make, score):
    assert_passes_validation(rawops.moe_route, make((T, E)), K, score)
    assert_passes_validation(rawops.moe_route, make((T, E)), E, score, False)
    size = 2 if make is f16 else 4
    assert_passes_validation(rawops.moe_route, make((T, E), strides=(2 * E * size, size)), 1)  # rows of a wider array
    assert_passes_validation(rawops.moe_route_backward, make((T, E)), i32((T, K)), f32((T, K), ptr=FAR), score)


@pytest.mark.parametrize("args,error,match", [
    ((FakeCAI((T, E), "<i4"), K), TypeError, r"^logits has dtype <i4; the moe ops support float32"),
    ((f32((T * E,)), K), ValueError, r"^logits has shape \(96,\); expected 2 dims"),
    ((f32((T, E)), E + 1), ValueError, r"^k must be between 1 and 16 \(at most the 16 experts"),
    ((f32((T, 64)), 33), ValueError, r"^k must be between 1 and 32"),
    ((f32((T, E)), 0), ValueError, r"^k must be between 1"),
    ((f32((T, E)), 2.0), TypeError, r"^k must be an int"),
    ((f32((T, E)), True), TypeError, r"^k must be an int"),
    ((f32((T, 2048)), 2), ValueError, r"^logits' experts \(its last dim\) must be between 1 and 1024"),
    ((f32((T, 0)), 1), ValueError, r"^logits' experts \(its last dim\) must be between 1 and 1024"),
    ((f32((T, E)), K, "relu"), ValueError, r"^score must be 'softmax' or 'sigmoid'"),
    ((f32((T, E)), K, None), TypeError, r"^score must be a string"),
    ((f32((T, E)), K, "softmax", 1), TypeError, r"^normalize must be a bool"),
    ((f32((T, E), ptr=BASE + 2), K), ValueError, r"^logits is misaligned"),
])
def test_route_checks_name_the_argument(args, error, match):
    with pytest.raises(error, match=match):
        rawops.moe_route(*args)


def test_route_backward_checks_name_the_argument():
    x = f32((T, E))
    with pytest.raises(TypeError, match=r"^ids has dtype <i8; expected int32"):
        rawops.moe_route_backward(x, i64((T, K)), f32((T, K), ptr=FAR))
    with pytest.raises(ValueError, match=r"^ids has 5 rows, expected 6"):
        rawops.moe_route_backward(x, i32((T - 1, K)), f32((T, K), ptr=FAR))
    with pytest.raises(ValueError, match=r"^grad_weights has shape \(6, 3\), expected \(6, 2\)"):
        rawops.moe_route_backward(x, i32((T, K)), f32((T, 3), ptr=FAR))
    with pytest.raises(TypeError, match=r"^grad_weights has dtype float16; expected float32"):
        rawops.moe_route_backward(x, i32((T, K)), f16((T, K), ptr=FAR))
    with pytest.raises(ValueError, match=r"^k must be between 1 and 16"):
        rawops.moe_route_backward(x, i32((T, E + 1)), f32((T, E + 1), ptr=FAR))


@pytest.mark.parametrize("make", [f32, f16], ids=["f32", "f16"])
@pytest.mark.parametrize("ids", [i32, i64], ids=["i32", "i64"])
@pytest.mark.parametrize("pad_to", [1, 128])
def test_valid_permute_calls_get_past_validation(make, ids, pad_to):
    assert_passes_validation(rawops.moe_permute, make((T, H)), ids((T, K)), E, pad_to)
    assert_passes_validation(rawops.moe_permute, make((T, H), strides=(4 * H * 4, 4) if make is f32 else
                                                      (4 * H * 2, 2)), ids((T, K)), E, pad_to)


@pytest.mark.parametrize("args,error,match", [
    ((FakeCAI((T, H), "<i4"), i32((T, K)), E), TypeError, r"^x has dtype <i4; the moe ops support"),
    ((f32((T, H, 1)), i32((T, K)), E), ValueError, r"^x has shape \(6, 32, 1\); expected 2 dims"),
    ((f32((T, H)), f32((T, K), ptr=OTHER), E), TypeError, r"^ids has dtype float32; expected int32 or int64"),
    ((f32((T, H)), FakeCAI((T, K), "<i2", OTHER), E), TypeError, r"^ids has dtype <i2"),
    ((f32((T, H)), i32((T * K,)), E), ValueError, r"^ids has shape \(12,\); expected 2 dims, \(T, k\)"),
    ((f32((T, H)), i32((T + 1, K)), E), ValueError, r"^ids has 7 rows, expected 6: one a token"),
    ((f32((T, H)), i32((T, 33)), 64), ValueError, r"^ids' k \(its columns\) must be between 1 and 32"),
    ((f32((T, H)), i32((T, 0)), E), ValueError, r"^ids' k \(its columns\) must be between 1 and 32"),
    ((f32((T, H)), i32((T, K), strides=(4, 4 * T)), E), ValueError, r"^ids is not C-contiguous"),
    ((f32((T, H)), i32((T, K)), 0), ValueError, r"^num_experts must be between 1 and 1024"),
    ((f32((T, H)), i32((T, K)), 1025), ValueError, r"^num_experts must be between 1 and 1024"),
    ((f32((T, H)), i32((T, K)), 8.0), TypeError, r"^num_experts must be an int"),
    ((f32((T, H)), i32((T, K)), E, 0), ValueError, r"^pad_to must be between 1 and 65536"),
    ((f32((T, H)), i32((T, K)), E, None), TypeError, r"^pad_to must be an int"),
    ((f32((1 << 28, H)), i32((1 << 28, 8)), E), ValueError, r"^the permuted rows .* rows are int32"),
])
def test_permute_checks_name_the_argument(args, error, match):
    with pytest.raises(error, match=match):
        rawops.moe_permute(*args)


def test_valid_unpermute_calls_get_past_validation():
    y, w, index = f32((T * K + 5, H)), f32((T, K), ptr=FAR), i32((T, K))
    assert_passes_validation(rawops.moe_unpermute, y, w, index)
    assert_passes_validation(rawops.moe_unpermute, y, None, index)
    assert_passes_validation(rawops.moe_permute_backward, y, index)
    assert_passes_validation(rawops.moe_unpermute_backward, f32((T, H), ptr=FAR + 0x10000), y, w, index)
    assert_passes_validation(rawops.moe_unpermute_backward, f32((T, H), ptr=FAR + 0x10000), y, w, index,
                             i32((E + 1,), ptr=FAR + 0x20000), i32((E,), ptr=FAR + 0x30000))


@pytest.mark.parametrize("args,error,match", [
    ((f32((T * K - 1, H)), None, i32((T, K))), ValueError, r"^y has 11 rows; the index of 6 tokens x k = 2 needs "
                                                         r"at least 12"),
    ((f16((T * K, H)), None, i64((T, K))), TypeError, r"^index has dtype <i8; expected int32"),
    ((f16((T * K, H)), f16((T, K), ptr=FAR), i32((T, K))), TypeError, r"^weights has dtype float16; expected float32"),
    ((f16((T * K, H)), f32((T, K + 1), ptr=FAR), i32((T, K))), ValueError,
     r"^weights has shape \(6, 3\), expected \(6, 2\)"),
    ((FakeCAI((T * K, H), "<i4"), None, i32((T, K))), TypeError, r"^y has dtype <i4"),
    ((f32((T * K, H)), None, i32((T, K), strides=(4, 4 * T))), ValueError, r"^index is not C-contiguous"),
])
def test_unpermute_checks_name_the_argument(args, error, match):
    with pytest.raises(error, match=match):
        rawops.moe_unpermute(*args)


def test_unpermute_backward_checks_name_the_argument():
    y, w, index = f32((T * K, H)), f32((T, K), ptr=FAR), i32((T, K))
    g = f32((T, H), ptr=FAR + 0x10000)
    with pytest.raises(TypeError, match=r"^grad_out has dtype float16, expected float32 like y"):
        rawops.moe_unpermute_backward(f16((T, H), ptr=FAR + 0x10000), y, w, index)
    with pytest.raises(ValueError, match=r"^grad_out has shape \(6, 16\), expected \(6, 32\)"):
        rawops.moe_unpermute_backward(f32((T, H // 2), ptr=FAR + 0x10000), y, w, index)
    with pytest.raises(TypeError, match=r"^weights must be a float32 array"):
        rawops.moe_unpermute_backward(g, y, None, index)
    with pytest.raises(ValueError, match=r"^offsets and counts go together"):
        rawops.moe_unpermute_backward(g, y, w, index, i32((E + 1,), ptr=FAR + 0x20000))
    with pytest.raises(TypeError, match=r"^offsets has dtype <i8; expected int32"):
        rawops.moe_unpermute_backward(g, y, w, index, i64((E + 1,), ptr=FAR + 0x20000), i32((E,), ptr=FAR + 0x30000))
    with pytest.raises(ValueError, match=r"^counts has shape \(15,\), expected \(16,\)"):
        rawops.moe_unpermute_backward(g, y, w, index, i32((E + 1,), ptr=FAR + 0x20000),
                                      i32((E - 1,), ptr=FAR + 0x30000))


def test_adapter_refuses_bad_arguments_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops.torch_adapter import moe as ta_moe

    logits, x = torch.ones(T, E), torch.ones(T, H)
    with pytest.raises(ValueError, match=r"^score must be 'softmax' or 'sigmoid'"):
        ta_moe.moe_route(logits, K, "relu")
    with pytest.raises(TypeError, match=r"^normalize must be a bool"):
        ta_moe.moe_route(logits, K, "softmax", None)
    with pytest.raises((TypeError, ValueError), match=r"^logits"):  # a CPU tensor
        ta_moe.moe_route(logits, K)
    with pytest.raises(TypeError, match=r"^logits must be a torch.Tensor"):
        ta_moe.moe_route([1.0], K)
    with pytest.raises(ValueError, match=r"^num_experts must be between 1"):
        ta_moe.moe_permute(x, torch.zeros(T, K, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match=r"^pad_to must be between 1"):
        ta_moe.moe_permute(x, torch.zeros(T, K, dtype=torch.int32), E, 0)
    with pytest.raises((TypeError, ValueError), match=r"^x"):  # a CPU tensor
        ta_moe.moe_permute(x, torch.zeros(T, K, dtype=torch.int32), E)
    with pytest.raises((TypeError, ValueError), match=r"^y"):  # a CPU tensor
        ta_moe.moe_unpermute(torch.ones(T * K, H), None, torch.zeros(T, K, dtype=torch.int32))


# ------------------------------------------------------------------------------ GPU: against float64 references
torch = pytest.importorskip("torch")

gpu = pytest.mark.gpu
DTYPES = ["float32", "float16", "bfloat16"]


def scores64(logits, score):
    x = logits.double()
    return torch.softmax(x, dim=-1) if score == "softmax" else torch.sigmoid(x)


def check_route(logits, k, score, normalize, weights, ids, counts, what=""):
    """ids: k distinct experts a token among the k best scores (float64; equal scores either way), in
    descending order; weights: those experts' float64 scores (renormalised); counts: bincount."""
    from gpu_reference import assert_close

    t, e = logits.shape
    s = scores64(logits, score)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and counts.dtype == torch.int32
    ids64 = ids.long()
    assert ((ids64 >= 0) & (ids64 < e)).all(), f"{what}: ids out of range"
    assert (ids64.sort(dim=1).values.diff(dim=1) != 0).all(), f"{what}: an expert chosen twice"
    chosen = s.gather(1, ids64)
    kth = torch.topk(s, k, dim=1).values[:, -1:]
    slack = 1e-6 * kth + 1e-30
    assert (chosen >= kth - slack).all(), f"{what}: an expert outside the top {k}"
    assert (chosen[:, :-1] >= chosen[:, 1:] - slack).all(), f"{what}: not in descending score order"
    ref = chosen / chosen.sum(dim=1, keepdim=True) if normalize else chosen
    assert_close(weights, ref, torch.float32, f"{what} weights")
    assert torch.equal(counts.long(), torch.bincount(ids64.flatten(), minlength=e)), f"{what}: counts"


def reference_ids(logits, k, score):
    """The k best experts a row, equal scores to the lower id (a stable descending sort in float64)."""
    return torch.sort(scores64(logits, score), dim=1, descending=True, stable=True).indices[:, :k]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 8, 8), (513, 64, 2), (1000, 128, 8), (77, 256, 4),
                                   (33, 1000, 32), (300, 60, 6)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("score,normalize", [("softmax", True), ("softmax", False), ("sigmoid", True),
                                             ("sigmoid", False)])
def test_route_matches_float64(shape, dtype, score, normalize):
    from gpu_reference import DTYPES as DT, poison_pool, random, to_cupy

    t, e, k = shape
    logits = random((t, e), DT[dtype])
    poison_pool(t * k * 4, t * k * 4)
    w, ids, counts = rawops.moe_route(to_cupy(logits), k, score, normalize)
    check_route(logits, k, score, normalize, torch.from_dlpack(w), torch.from_dlpack(ids), torch.from_dlpack(counts),
                f"{score} {normalize}")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_route_ties_go_to_the_lower_expert_id(dtype, score):
    """Integer logits from a range of 3: most rows hold equal scores at the top-k boundary."""
    from gpu_reference import DTYPES as DT, to_cupy

    t, e, k = 500, 64, 8
    logits = torch.randint(0, 3, (t, e), device="cuda").to(DT[dtype])
    w, ids, counts = rawops.moe_route(to_cupy(logits), k, score)
    assert torch.equal(torch.from_dlpack(ids).long(), reference_ids(logits, k, score))
    check_route(logits, k, score, True, torch.from_dlpack(w), torch.from_dlpack(ids), torch.from_dlpack(counts))
    # a row of equal logits: experts 0..k-1, equal weights
    w, ids, _ = rawops.moe_route(to_cupy(torch.zeros(3, e, device="cuda", dtype=DT[dtype])), k, score)
    assert torch.equal(torch.from_dlpack(ids).long().cpu(), torch.arange(k).expand(3, k))
    assert torch.allclose(torch.from_dlpack(w), torch.full((3, k), 1.0 / k, device="cuda"))


@gpu
def test_route_on_a_row_strided_view_and_nan_rows():
    from gpu_reference import random, to_cupy

    base = random((200, 96), torch.bfloat16)
    logits = base[:, :64]
    w, ids, counts = rawops.moe_route(to_cupy(logits), 4)
    check_route(logits, 4, "softmax", True, torch.from_dlpack(w), torch.from_dlpack(ids), torch.from_dlpack(counts))
    bad = random((4, 64), torch.float32)
    bad[1, 7] = float("nan")
    w, ids, _ = rawops.moe_route(to_cupy(bad), 4)
    w = torch.from_dlpack(w)
    assert torch.isnan(w[1]).all() and not torch.isnan(w[[0, 2, 3]]).any(), "a NaN logit makes its row NaN alone"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("score,normalize", [("softmax", True), ("softmax", False), ("sigmoid", True),
                                             ("sigmoid", False)])
def test_route_backward_matches_float64(dtype, score, normalize):
    from gpu_reference import DTYPES as DT, assert_close, random, to_cupy

    t, e, k = 300, 128, 8
    logits = random((t, e), DT[dtype])
    w, ids, _ = rawops.moe_route(to_cupy(logits), k, score, normalize)
    ids = torch.from_dlpack(ids)
    g = random((t, k), torch.float32)
    d = torch.from_dlpack(rawops.moe_route_backward(to_cupy(logits), to_cupy(ids), to_cupy(g), score, normalize))
    x64 = logits.double().requires_grad_()
    chosen = scores64(x64, score).gather(1, ids.long())
    ref_w = chosen / chosen.sum(dim=1, keepdim=True) if normalize else chosen
    (ref,) = torch.autograd.grad(ref_w, x64, g.double())
    assert d.dtype == logits.dtype
    assert_close(d, ref, DT[dtype], f"d logits {score} {normalize}", floor=1e-3 * ref.numel() ** 0.5)


def stable_groups(ids, experts, pad_to):
    """(order of the flat entries by expert then token, counts, padded offsets) in torch."""
    flat = ids.flatten().long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + pad_to - 1) // pad_to * pad_to
    offsets = torch.zeros(experts + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = padded.cumsum(0)
    return order, counts, offsets


def random_ids(t, e, k, distinct=True, high=None):
    if distinct:
        return torch.rand(t, e, device="cuda").topk(k, dim=1).indices.to(torch.int32)
    return torch.randint(0, high or e, (t, k), device="cuda", dtype=torch.int32)


def check_permuted(x, ids, experts, pad_to, out, offsets, counts, index, what=""):
    t, k = ids.shape
    order, ref_counts, ref_offsets = stable_groups(ids, experts, pad_to)
    assert torch.equal(counts.long(), ref_counts), f"{what}: counts"
    assert torch.equal(offsets.long(), ref_offsets), f"{what}: offsets"
    assert out.shape == (moe.permuted_rows(t, k, experts, pad_to), x.shape[1])
    # the entry at position p of group e sits at row offsets[e] + p
    expert_of = ids.flatten().long()[order]
    start = torch.zeros(experts + 1, dtype=torch.long, device=x.device)
    start[1:] = ref_counts.cumsum(0)
    rank = torch.arange(order.numel(), device=x.device) - start[expert_of]
    rows = ref_offsets[expert_of] + rank
    flat_index = index.flatten().long()
    assert torch.equal(flat_index[order], rows), f"{what}: index (token order within each group)"
    assert torch.equal(out[rows], x[order // k]), f"{what}: rows"
    owned = torch.zeros(out.shape[0], dtype=torch.bool, device=x.device)
    owned[rows] = True
    assert (out[~owned] == 0).all(), f"{what}: padding rows not zero"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    (1, 1, 1, 8, "distinct"), (37, 8, 8, 40, "distinct"), (1000, 128, 8, 256, "distinct"),
    (513, 64, 2, 33, "distinct"), (300, 64, 4, 128, "few"), (129, 16, 3, 24, "one"), (257, 1000, 6, 64, "distinct"),
    (2000, 32, 2, 8, "repeats")], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("pad_to", [1, 16])
def test_permute_matches_a_stable_sort(case, dtype, pad_to):
    from gpu_reference import DTYPES as DT, poison_pool, random, to_cupy

    t, e, k, h, kind = case
    x = random((t, h), DT[dtype])
    ids = {"distinct": lambda: random_ids(t, e, k), "few": lambda: random_ids(t, e, k, False, 5),
           "one": lambda: torch.full((t, k), e - 1, device="cuda", dtype=torch.int32),
           "repeats": lambda: random_ids(t, e, k, False)}[kind]()
    rows = moe.permuted_rows(t, k, e, pad_to)
    poison_pool(rows * h * x.element_size(), t * k * 4)
    out, offsets, counts, index = rawops.moe_permute(to_cupy(x), to_cupy(ids), e, pad_to)
    check_permuted(x, ids, e, pad_to, *(torch.from_dlpack(a) for a in (out, offsets, counts, index)),
                   what=f"{kind} pad {pad_to}")
    out2, _, _, index2 = rawops.moe_permute(to_cupy(x), to_cupy(ids.long()), e, pad_to)  # int64 ids
    assert torch.equal(torch.from_dlpack(index2), torch.from_dlpack(index))
    assert torch.equal(torch.from_dlpack(out2), torch.from_dlpack(out))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [(1, 4, 1, 8), (37, 8, 8, 40), (1000, 128, 8, 256), (513, 64, 2, 33),
                                  (200, 16, 4, 1000)], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("pad_to", [1, 8])
def test_unpermute_and_backwards_match_float64(case, dtype, pad_to):
    from gpu_reference import DTYPES as DT, assert_close, poison_pool, random, to_cupy

    t, e, k, h = case
    dt = DT[dtype]
    x = random((t, h), dt)
    ids = random_ids(t, e, k)
    out, offsets, counts, index = rawops.moe_permute(to_cupy(x), to_cupy(ids), e, pad_to)
    index, offsets, counts = (torch.from_dlpack(a) for a in (index, offsets, counts))
    n_rows = torch.from_dlpack(out).shape[0]
    y = random((n_rows, h), dt)
    w = torch.rand(t, k, device="cuda")
    g = random((t, h), dt)
    rows = index.long()
    y64 = y.double().requires_grad_()
    w64 = w.double().requires_grad_()
    ref = (w64[..., None] * y64[rows]).sum(1)
    dy_ref, dw_ref = torch.autograd.grad(ref, (y64, w64), g.double())
    poison_pool(t * h * y.element_size())
    combined = torch.from_dlpack(rawops.moe_unpermute(to_cupy(y), to_cupy(w), to_cupy(index)))
    assert_close(combined, ref.detach(), dt, "combine")
    summed = torch.from_dlpack(rawops.moe_permute_backward(to_cupy(y), to_cupy(index)))
    assert_close(summed, y.double()[rows].sum(1), dt, "permute backward (the plain sum)")
    for table in ((to_cupy(offsets), to_cupy(counts)), (None, None)):
        poison_pool(n_rows * h * y.element_size(), t * k * 4)
        dy, dw = rawops.moe_unpermute_backward(to_cupy(g), to_cupy(y), to_cupy(w), to_cupy(index), *table)
        assert_close(torch.from_dlpack(dy), dy_ref, dt, f"d y (table {table[0] is not None})")
        assert_close(torch.from_dlpack(dw), dw_ref, torch.float32, "d weights", factor=10 if dt != torch.float32 else 1,
                     floor=1e-2)


@gpu
def test_unpermute_is_deterministic_and_reads_strided_rows():
    from gpu_reference import random, to_cupy

    t, e, k, h = 4096, 64, 8, 512
    ids = random_ids(t, e, k)
    x = random((t, h), torch.bfloat16)
    _, _, _, index = rawops.moe_permute(to_cupy(x), to_cupy(ids), e)
    ybuf = random((t * k, h + 64), torch.bfloat16)
    y = ybuf[:, :h]
    w = torch.rand(t, k, device="cuda")
    a = torch.from_dlpack(rawops.moe_unpermute(to_cupy(y), to_cupy(w), index))
    b = torch.from_dlpack(rawops.moe_unpermute(to_cupy(y.contiguous()), to_cupy(w), index))
    assert torch.equal(a, b), "the same bits from a strided view and a copy, run after run"


@gpu
def test_invalid_ids_are_nan_never_a_silent_number():
    from gpu_reference import random, to_cupy

    t, e, k, h = 64, 8, 2, 64
    x = random((t, h), torch.float32)
    ids = random_ids(t, e, k)
    ids[5, 1] = e
    ids[9, 0] = -1
    out, offsets, counts, index = rawops.moe_permute(to_cupy(x), to_cupy(ids), e)
    offsets, counts, index = (torch.from_dlpack(a) for a in (offsets, counts, index))
    assert int(offsets[-1]) == t * k - 2 and int(counts.sum()) == t * k - 2
    assert int(index[5, 1]) < 0 and int(index[9, 0]) < 0
    y = torch.from_dlpack(out).clone()
    combined = torch.from_dlpack(rawops.moe_unpermute(to_cupy(y), to_cupy(torch.ones(t, k, device="cuda")), index))
    bad = torch.isnan(combined).any(dim=1)
    assert bad[5] and bad[9] and int(bad.sum()) == 2


# ------------------------------------------------------------------------------ the torch adapter
def hf_router(logits, k, normalize=True):
    """Hugging Face's Qwen3MoeSparseMoeBlock router math (float64 here)."""
    p = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(p, k, dim=-1)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids


def moe_pipeline(ta_moe, x, logits, e, k, pad_to, scale):
    """route, permute, a per-expert scaling standing in for the experts, combine."""
    w, ids, counts = ta_moe.moe_route(logits, k)
    permuted, offsets, counts, index = ta_moe.moe_permute(x, ids, e, pad_to)
    group = torch.searchsorted(offsets[1:].long(), torch.arange(permuted.shape[0], device=x.device), right=True)
    y = permuted * scale[group.clamp(max=e - 1)][:, None].to(x.dtype)
    return ta_moe.moe_unpermute(y, w, index, offsets, counts), ids


def reference_pipeline(x, logits, k, scale, ids):
    x64, l64 = x.double().requires_grad_(), logits.double().requires_grad_()
    p = torch.softmax(l64, dim=-1).gather(1, ids.long())
    w = p / p.sum(dim=-1, keepdim=True)
    scale = scale.to(x.dtype).double()  # the experts' stand-in scales x's rows in x's dtype
    out = (w[..., None] * x64[:, None, :] * scale[ids.long()][..., None]).sum(1)
    return out, x64, l64


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad_to", [1, 16])
def test_adapter_pipeline_forward_and_gradients(dtype, pad_to):
    from gpu_reference import DTYPES as DT, assert_close, random
    from rawops.torch_adapter import moe as ta_moe

    dt = DT[dtype]
    t, e, k, h = 333, 32, 4, 128
    x = random((t, h), dt).requires_grad_()
    logits = random((t, e), dt).requires_grad_()
    scale = torch.rand(e, device="cuda") + 0.5
    out, ids = moe_pipeline(ta_moe, x, logits, e, k, pad_to, scale)
    g = random((t, h), dt)
    out.backward(g)
    ref, x64, l64 = reference_pipeline(x.detach(), logits.detach(), k, scale, ids)
    dx_ref, dl_ref = torch.autograd.grad(ref, (x64, l64), g.double())
    _, hf_ids = hf_router(logits.detach().double(), k)
    top = torch.topk(torch.softmax(logits.detach().double(), -1), k + 1).values
    untied = top[:, k - 1] != top[:, k]  # rows whose k-th and (k+1)-th scores differ: one right answer
    assert torch.equal(ids.long().sort(1).values[untied], hf_ids.sort(1).values[untied]), "HF's router's experts"
    assert_close(out, ref.detach(), dt, "adapter out", factor=2)
    assert_close(x.grad, dx_ref, dt, "adapter d x", factor=2)
    assert_close(logits.grad, dl_ref, dt, "adapter d logits", factor=4, floor=1e-3 * dl_ref.numel() ** 0.5)


@gpu
def test_adapter_compiles_fullgraph():
    from gpu_reference import assert_close, random
    from rawops.torch_adapter import moe as ta_moe

    dt, (t, e, k, h) = torch.float32, (128, 16, 2, 64)
    x = random((t, h), dt).requires_grad_()
    logits = random((t, e), dt).requires_grad_()
    scale = torch.rand(e, device="cuda") + 0.5

    def fn(x, logits):
        out, ids = moe_pipeline(ta_moe, x, logits, e, k, 8, scale)
        return out, ids

    out, ids = torch.compile(fn, fullgraph=True)(x, logits)
    g = random((t, h), dt)
    out.backward(g)
    ref, x64, l64 = reference_pipeline(x.detach(), logits.detach(), k, scale, ids)
    dx_ref, dl_ref = torch.autograd.grad(ref, (x64, l64), g.double())
    assert_close(out, ref.detach(), dt, "compiled out")
    assert_close(x.grad, dx_ref, dt, "compiled d x")
    assert_close(logits.grad, dl_ref, dt, "compiled d logits", factor=4, floor=1e-3 * dl_ref.numel() ** 0.5)


@gpu
def test_adapter_captures_in_a_cuda_graph():
    """route, permute (padded) and combine captured once, replayed on new data: the eager result's bits."""
    from gpu_reference import random
    from rawops.torch_adapter import moe as ta_moe

    t, e, k, h = 512, 32, 4, 256
    x, logits = random((t, h), torch.bfloat16), random((t, e), torch.bfloat16)

    def run():
        w, ids, _ = ta_moe.moe_route(logits, k)
        permuted, offsets, counts, index = ta_moe.moe_permute(x, ids, e, 8)
        return ta_moe.moe_unpermute(permuted, w, index, offsets, counts)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    x.copy_(random((t, h), torch.bfloat16))
    logits.copy_(random((t, e), torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run())


# ------------------------------------------------------------------------------ grouped GEMM (sm_90)
def test_grouped_gemm_entry_points_are_in_the_hopper_table():
    from rawops import _gemm_sm90

    names = _gemm_sm90.entry_points()
    for layout in _gemm_sm90.GROUPED_LAYOUTS:
        for dtype in (1, 2):
            assert _gemm_sm90.grouped_entry_name(layout, dtype) in names
    assert len(_gemm_sm90.GROUPED_KINDS) == 10


def test_valid_grouped_mm_calls_get_past_validation():
    rows, k, n = 3 * 128, 64, 96
    assert_passes_validation(rawops.moe_grouped_mm, f16((rows, k)), f16((E, n, k), ptr=FAR), i32((E + 1,)))
    assert_passes_validation(rawops.moe_grouped_mm, f16((rows, k)), f16((E, k, n), ptr=FAR), i32((E + 1,)),
                             transpose=False)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((f32((256, 64)), f32((E, 96, 64), ptr=FAR), i32((E + 1,))), {}, TypeError,
     r"^x has dtype float32; moe_grouped_mm"),
    ((f16((256, 64)), f32((E, 96, 64), ptr=FAR), i32((E + 1,))), {}, TypeError,
     r"^weight has dtype float32, expected float16"),
    ((f16((256, 64)), f16((96, 64), ptr=FAR), i32((E + 1,))), {}, ValueError, r"^weight has shape \(96, 64\)"),
    ((f16((256, 64)), f16((E, 96, 32), ptr=FAR), i32((E + 1,))), {}, ValueError, r"K must match x's last dim 64"),
    ((f16((256, 64)), f16((E, 96, 64), ptr=FAR), i32((E,))), {}, ValueError, r"^offsets has shape \(16,\)"),
    ((f16((256, 64)), f16((E, 96, 64), ptr=FAR), i64((E + 1,))), {}, TypeError, r"^offsets has dtype <i8"),
    ((f16((256, 60)), f16((E, 96, 60), ptr=FAR), i32((E + 1,))), {}, ValueError, r"16-byte vectors"),
    ((f16((256, 72)), f16((E, 72, 96), ptr=FAR), i32((E + 1,))), {"transpose": False}, ValueError,
     r"nn: K a multiple of 64"),
])
def test_grouped_mm_checks_name_the_argument(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        rawops.moe_grouped_mm(*args, **kwargs)


@pytest.mark.gpu
def test_adapter_grouped_mm_checks_name_the_argument():
    torch = pytest.importorskip("torch")
    from rawops.torch_adapter import moe as ta_moe

    x = torch.zeros(256, 64, dtype=torch.float16, device="cuda")
    w = torch.zeros(E, 96, 64, dtype=torch.float16, device="cuda")
    off = torch.zeros(E + 1, dtype=torch.int32, device="cuda")
    g = torch.zeros(256, 128, dtype=torch.float16, device="cuda")
    for call, error, match in [
        (lambda: ta_moe.grouped_mm(x, w.float(), off), TypeError, r"^weight has dtype torch.float32"),
        (lambda: ta_moe.grouped_mm(x, w[0], off), ValueError, r"^weight has shape \(96, 64\)"),
        (lambda: ta_moe.grouped_mm(x, w, off.long()), TypeError, r"^offsets has dtype torch.int64"),
        (lambda: ta_moe.grouped_mm(x, w, off[:-1]), ValueError, r"^offsets has shape \(16,\)"),
        (lambda: ta_moe.grouped_mm(x, w, off.cpu()), ValueError, r"^offsets is on cpu"),
        (lambda: ta_moe.grouped_mm_weight_grad(x, g.bfloat16(), off, E), TypeError, r"^grad_y has dtype"),
        (lambda: ta_moe.grouped_mm_weight_grad(x, g[:255], off, E), ValueError, r"^grad_y has 255 rows"),
        (lambda: ta_moe.grouped_mm_weight_grad(x, g, off[:-1], E), ValueError, r"^offsets has shape"),
    ]:
        with pytest.raises(error, match=match):
            call()


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_grouped_mm_matches_each_experts_matmul(dtype, transpose):
    import cupy
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped Hopper kernel: sm_90")
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda")
    g.seed()
    experts, k, n = 12, 256, 320
    counts = torch.randint(0, 300, (experts,), generator=g, device="cuda")
    counts[3] = 0                       # an expert with no tokens
    counts[7] = 128                     # exactly one tile
    padded = (counts + 127) // 128 * 128
    offsets = torch.zeros(experts + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = torch.cumsum(padded, 0)
    rows = int(offsets[-1]) + 200       # rows past the groups (as moe_permute leaves): zeros out
    x = torch.randn(rows, k, generator=g, device="cuda").to(dt)
    for e in range(experts):            # each group's padding rows zero, as moe_permute writes them
        x[int(offsets[e]) + int(counts[e]):int(offsets[e + 1])] = 0
    w = (torch.randn(experts, n, k, generator=g, device="cuda") * k ** -0.5).to(dt)
    weight = w if transpose else w.transpose(1, 2).contiguous()
    y = torch.from_dlpack(rawops.moe_grouped_mm(cupy.from_dlpack(x), cupy.from_dlpack(weight),
                                                cupy.from_dlpack(offsets), transpose=transpose))
    ref = torch.zeros(rows, n, dtype=torch.float64, device="cuda")
    for e in range(experts):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        ref[lo:hi] = x[lo:hi].double() @ w[e].double().T
    assert not torch.isnan(y).any()
    err = ((y.double() - ref).norm() / ref.norm()).item()
    assert err < (4e-3 if dtype == "bfloat16" else 5e-4), f"relative error {err:.2e}"
    assert torch.equal(y[int(offsets[-1]):], torch.zeros_like(y[int(offsets[-1]):])), "rows past the groups"


def test_valid_grouped_weight_gradient_calls_get_past_validation():
    rows, k, n = 3 * 128, 64, 256
    assert_passes_validation(rawops.moe_grouped_mm_backward_weight, f16((rows, k)), f16((rows, n), ptr=FAR),
                             i32((E + 1,)))
    assert_passes_validation(rawops.moe_grouped_mm_backward_weight, f16((rows, 128)), f16((rows, 72), ptr=FAR),
                             i32((E + 1,)), transpose=False)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((f32((256, 64)), f32((256, 256), ptr=FAR), i32((E + 1,))), {}, TypeError, r"^x has dtype float32"),
    ((f16((256, 64)), f16((255, 256), ptr=FAR), i32((E + 1,))), {}, ValueError, r"^grad_y has 255 rows"),
    ((f16((256, 64)), f16((256, 200), ptr=FAR), i32((E + 1,))), {}, ValueError, r"rows a multiple of 128"),
    ((f16((256, 64)), f16((256, 256), ptr=FAR), i32((E + 1,))), {"transpose": False}, ValueError,
     r"rows a multiple of 128"),
    ((f16((256, 64)), f16((256, 256), ptr=FAR), i32((1,))), {}, ValueError, r"^offsets has shape \(1,\)"),
])
def test_grouped_weight_gradient_checks_name_the_argument(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        rawops.moe_grouped_mm_backward_weight(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_grouped_weight_gradient_matches_each_experts(dtype, transpose):
    import cupy
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped Hopper kernel: sm_90")
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda")
    g.seed()
    experts, k, n = 10, 256, 384
    counts = torch.randint(0, 300, (experts,), generator=g, device="cuda")
    counts[2] = 0                       # an expert without rows: zeros
    padded = (counts + 127) // 128 * 128
    offsets = torch.zeros(experts + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = torch.cumsum(padded, 0)
    rows = int(offsets[-1]) + 64        # rows past the groups: not read
    x = torch.randn(rows, k, generator=g, device="cuda").to(dt)
    dy = torch.randn(rows, n, generator=g, device="cuda").to(dt)
    got = torch.from_dlpack(rawops.moe_grouped_mm_backward_weight(
        cupy.from_dlpack(x), cupy.from_dlpack(dy), cupy.from_dlpack(offsets), transpose=transpose))
    for e in range(experts):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        ref = dy[lo:hi].double().T @ x[lo:hi].double() if transpose else x[lo:hi].double().T @ dy[lo:hi].double()
        ours = got[e].double()
        assert ours.shape == ref.shape
        if hi == lo:
            assert torch.equal(ours, torch.zeros_like(ours)), f"expert {e} without rows"
            continue
        err = ((ours - ref).norm() / ref.norm()).item()
        assert err < (4e-3 if dtype == "bfloat16" else 5e-4), f"expert {e}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_moe_mlp_forward_and_gradients_match_a_per_expert_reference(dtype):
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped Hopper kernel: sm_90")
    import torch.nn.functional as F

    from rawops.torch_adapter import moe_mlp

    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda")
    g.seed()
    tokens, hidden, inter, experts, k = 700, 256, 128, 16, 4
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(dt)
    wr = (torch.randn(experts, hidden, generator=g, device="cuda") * hidden ** -0.5).to(dt)
    wgu = (torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") * hidden ** -0.5).to(dt)
    wd = (torch.randn(experts, hidden, inter, generator=g, device="cuda") * inter ** -0.5).to(dt)
    dout = torch.randn(tokens, hidden, generator=g, device="cuda").to(dt)
    leaves = [t.clone().requires_grad_(True) for t in (x, wr, wgu, wd)]
    out, _ = moe_mlp(*leaves, k)
    ours = torch.autograd.grad(out, leaves, dout)
    def reference(leaves):  # the per-expert loop in the leaves' dtype; the router's softmax in float32
        rx, rwr, rwgu, rwd = leaves
        p = torch.softmax(F.linear(rx, rwr).float(), -1)
        w, ids = torch.topk(p, k, -1)
        w = w / w.sum(-1, keepdim=True)
        ref = torch.zeros_like(rx)
        for e in range(experts):
            t, j = torch.nonzero(ids == e, as_tuple=True)
            if t.numel() == 0:
                continue
            h = F.linear(rx[t], rwgu[e])
            y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], rwd[e])
            ref = ref.index_add(0, t, (y * w[t, j, None]).to(ref.dtype))
        return ref

    ref_leaves = [t.float().requires_grad_(True) for t in (x, wr, wgu, wd)]
    ref = reference(ref_leaves)
    theirs = torch.autograd.grad(ref, ref_leaves, dout.float())
    # torch's own error in the leaves' dtype (the same loop): the router's gradient goes through the
    # differences of the renormalised top-k weights (a cancellation), so its 16-bit error is several
    # times the others'; ours is held to 3x torch's, never tighter than tol
    torch_leaves = [t.clone().requires_grad_(True) for t in (x, wr, wgu, wd)]
    torch_out = reference(torch_leaves)
    torch_grads = torch.autograd.grad(torch_out, torch_leaves, dout)

    def rel(a, b):
        return ((a.float() - b).norm() / b.norm()).item()
    tol = 3e-2 if dtype == "bfloat16" else 1e-2
    err = rel(out, ref)
    assert err < max(tol, 3 * rel(torch_out, ref)), f"output: relative error {err:.2e}"
    for name, o, t, r in zip(("x", "router", "gate_up", "down"), ours, torch_grads, theirs):
        assert not torch.isnan(o).any(), name
        e, te = rel(o, r), rel(t, r)
        assert e < max(tol, 3 * te), f"d {name}: relative error {e:.2e} (torch {dtype}: {te:.2e})"


@pytest.mark.gpu
def test_moe_mlp_compiles_fullgraph_forward_and_backward():
    """torch.compile(fullgraph=True) traces the whole layer (route, permute, the grouped GEMMs as custom
    ops, swiglu, the combine) and its backward; the same kernels run, so the results equal eager's."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped Hopper kernel: sm_90")
    from rawops.torch_adapter import moe_mlp

    g = torch.Generator(device="cuda")
    g.seed()
    tokens, hidden, inter, experts, k = 300, 128, 64, 8, 2
    dt = torch.bfloat16
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(dt)
    wr = (torch.randn(experts, hidden, generator=g, device="cuda") * hidden ** -0.5).to(dt)
    wgu = (torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") * hidden ** -0.5).to(dt)
    wd = (torch.randn(experts, hidden, inter, generator=g, device="cuda") * inter ** -0.5).to(dt)
    dout = torch.randn(tokens, hidden, generator=g, device="cuda").to(dt)

    def run(fn):
        leaves = [t.clone().requires_grad_(True) for t in (x, wr, wgu, wd)]
        out = fn(*leaves)[0]
        return [out, *torch.autograd.grad(out, leaves, dout)]
    eager = run(lambda *a: moe_mlp(*a, k))
    compiled = run(torch.compile(lambda *a: moe_mlp(*a, k), fullgraph=True))
    for name, e, c in zip(("out", "d x", "d router", "d gate_up", "d down"), eager, compiled):
        assert not torch.isnan(c).any(), name
        err = ((c.float() - e.float()).norm() / e.float().norm()).item()
        assert err < 1e-2, f"{name}: compiled against eager, relative error {err:.2e}"


def test_moe_module_takes_a_qwen3_blocks_parameters_and_state_dict():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
    from rawops.torch_adapter import MoE

    config = modeling.Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                     norm_topk_prob=True)
    block = modeling.Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in block.parameters():  # (the block leaves them uninitialised)
            p.normal_()
    swapped = MoE.from_qwen3(block)
    ours, theirs = dict(swapped.named_parameters()), dict(block.named_parameters())
    assert ours.keys() == theirs.keys() and all(ours[k] is theirs[k] for k in ours), "the block's own Parameters"
    assert swapped.top_k == 2 and swapped.normalize
    fresh = MoE(64, 32, 8, 2)
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in block.state_dict().items()}
    fresh.load_state_dict(block.state_dict())  # strict: the same keys, layouts
    assert torch.equal(fresh.experts.gate_up_proj, block.experts.gate_up_proj)


@pytest.mark.gpu
def test_moe_module_matches_the_qwen3_block_it_was_built_from():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped Hopper kernel: sm_90")
    from rawops.torch_adapter import MoE

    config = modeling.Qwen3MoeConfig(hidden_size=256, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                                     norm_topk_prob=True)
    block = modeling.Qwen3MoeSparseMoeBlock(config).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=256 ** -0.5)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        theirs, ours = block(x).float(), MoE.from_qwen3(block)(x).float()
    err = ((ours - theirs).norm() / theirs.norm()).item()
    assert err < 2e-2, f"relative error {err:.2e} against the block (bf16 routing weights there, float32 here)"


# ------------------------------------------------------------------------------ expert parallel (CPU, gloo)
def _reference_experts(rows, expert_ids, wgu, wd):
    """Qwen3-MoE's SwiGLU experts, one at a time (torch), rows (N, H) and their expert ids (N,)."""
    import torch
    import torch.nn.functional as F

    out = rows.new_zeros((rows.shape[0], wd.shape[1]))
    inter = wd.shape[2]
    for e in range(wgu.shape[0]):
        sel = torch.nonzero(expert_ids == e).flatten()
        if sel.numel():
            h = F.linear(rows[sel], wgu[e])
            out = out.index_add(0, sel, F.linear(F.silu(h[:, :inter]) * h[:, inter:], wd[e]))
    return out


def _expert_parallel_worker(rank, world, port, equal, exchange, micro_batches=1):
    import torch
    import torch.distributed as dist

    from rawops.torch_adapter._moe_parallel import expert_parallel

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        experts, k, hidden, inter = 8, 2, 16, 8
        g = torch.Generator().manual_seed(1234)  # the same draws on every rank
        wgu = torch.randn(experts, 2 * inter, hidden, generator=g, dtype=torch.float64)
        wd = torch.randn(experts, hidden, inter, generator=g, dtype=torch.float64)
        xs = [torch.randn(37 + (0 if equal else 5 * r), hidden, generator=g, dtype=torch.float64) for r in range(world)]
        routes = [torch.topk(torch.softmax(torch.randn(x.shape[0], experts, generator=g, dtype=torch.float64), -1), k)
                  for x in xs]
        douts = [torch.randn(x.shape[0], hidden, generator=g, dtype=torch.float64) for x in xs]
        lo, hi = rank * experts // world, (rank + 1) * experts // world
        local_wgu, local_wd = wgu[lo:hi].clone().requires_grad_(True), wd[lo:hi].clone().requires_grad_(True)
        x = xs[rank].clone().requires_grad_(True)
        w = routes[rank].values.clone().requires_grad_(True)

        def local(rows, ids, weights, entries):  # each row's weighted sum over its slots here (id >= 0)
            assert entries == int((ids >= 0).sum()) and bool(((ids >= 0) | (weights == 0)).all())
            return sum(_reference_experts(rows, ids[:, j].clamp(min=0), local_wgu, local_wd)
                       * torch.where(ids[:, j] >= 0, weights[:, j], 0)[:, None] for j in range(ids.shape[1]))
        with pytest.raises(ValueError, match="exchange must be one of"):
            expert_parallel(x, w, routes[rank].indices, experts, local, exchange="ring")
        for bad in (0, 1.0, True):
            with pytest.raises(ValueError, match="micro_batches must be an int >= 1"):
                expert_parallel(x, w, routes[rank].indices, experts, local, micro_batches=bad)
        with pytest.raises(ValueError, match="micro_batches > 1 overlaps the gather"):
            expert_parallel(x, w, routes[rank].indices, experts, local, exchange="all_to_all", micro_batches=2)
        import rawops.torch_adapter._moe_parallel as parallel

        gathered, shipped_gathered = [], parallel._gathered
        overlapped, shipped_overlapped = [], parallel._gathered_overlapped
        parallel._gathered = lambda *args: gathered.append(1) or shipped_gathered(*args)
        parallel._gathered_overlapped = lambda *args: overlapped.append(1) or shipped_overlapped(*args)
        out = expert_parallel(x, w, routes[rank].indices, experts, local, exchange=exchange,
                              micro_batches=micro_batches)
        assert bool(gathered) == (equal and exchange == "auto"), "auto takes the gather where T is equal"
        assert bool(overlapped) == (micro_batches > 1), "micro_batches > 1: the overlapped gather"
        dx, dw, dwgu, dwd = torch.autograd.grad(out, [x, w, local_wgu, local_wd], douts[rank])
        # the one-process reference over every rank's tokens with every expert
        full = [t.clone().requires_grad_(True) for t in (wgu, wd)]
        leaves = [t.clone().requires_grad_(True) for t in xs] + [r.values.clone().requires_grad_(True) for r in routes]
        total = 0
        for r in range(world):
            xr, wr, ids = leaves[r], leaves[world + r], routes[r].indices
            y = _reference_experts(xr[torch.arange(xr.shape[0]).repeat_interleave(k)], ids.reshape(-1), *full)
            ref = (y.reshape(xr.shape[0], k, hidden) * wr[..., None]).sum(1)
            if r == rank:
                ref_out = ref
            total = total + (ref * douts[r]).sum()
        grads = torch.autograd.grad(total, [leaves[rank], leaves[world + rank], *full])
        assert torch.allclose(out, ref_out, atol=1e-10), "output"
        for name, ours, theirs in zip(("x", "weights"), (dx, dw), grads[:2]):
            assert torch.allclose(ours, theirs, atol=1e-10), f"d {name}"
        assert torch.allclose(dwgu, grads[2][lo:hi], atol=1e-10), "d gate_up (this rank's experts)"
        assert torch.allclose(dwd, grads[3][lo:hi], atol=1e-10), "d down (this rank's experts)"
        if micro_batches > 1:  # the one-slice gather's output and input gradients (CPU BLAS blocks a GEMM by
            # its row count, so the reference experts round each slice's rows apart from the whole batch's)
            single = expert_parallel(x, w, routes[rank].indices, experts, local, exchange="gather")
            assert torch.allclose(out, single, rtol=0, atol=1e-12), "overlapped gather against one slice"
            for a, b in zip((dx, dw), torch.autograd.grad(single, [x, w], douts[rank])):
                assert torch.allclose(a, b, rtol=0, atol=1e-12), "overlapped gather's gradients against one slice"
    finally:
        dist.destroy_process_group()


# unequal tokens a rank: "auto" takes all_to_all; equal: "auto" takes the gather, all_to_all asked for;
# the gather in 2 and 3 overlapped slices (37 tokens a rank: slices of 18 / 19 and 12 / 12 / 13)
@pytest.mark.parametrize("equal, exchange, micro_batches", [(False, "auto", 1), (True, "auto", 1),
                                                            (True, "all_to_all", 1), (True, "gather", 2),
                                                            (True, "gather", 3)])
@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_equals_one_process_forward_and_backward(world, equal, exchange, micro_batches):
    torch = pytest.importorskip("torch")
    import socket

    import torch.multiprocessing as mp

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_expert_parallel_worker, args=(world, port, equal, exchange, micro_batches), nprocs=world, join=True)


def test_expert_parallel_overlapped_gather_starts_each_slice_exchange_before_the_other_slices_experts():
    """The order micro_batches=2 puts things on the wire (one gloo rank in this process, the collectives
    and the experts logged): forward, both slices' gathers before the first experts and slice 0's
    reduce_scatter before slice 1's experts; backward, both output gradients' gathers before any
    experts' backward and slice 1's input-gradient reduce_scatters before slice 0's experts' backward."""
    torch = pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    import rawops.torch_adapter._moe_parallel as parallel

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = []

    class Experts(torch.autograd.Function):  # each slice's experts: rows times its weights' sum, logged
        @staticmethod
        def forward(ctx, rows, weights):
            ctx.slice = sum(1 for e in log if e.startswith("experts "))
            log.append(f"experts {ctx.slice}")
            ctx.save_for_backward(rows, weights)
            return rows * weights.sum(1, keepdim=True)

        @staticmethod
        def backward(ctx, grad):
            rows, weights = ctx.saved_tensors
            log.append(f"experts {ctx.slice} backward")
            return grad * weights.sum(1, keepdim=True), (grad * rows).sum(1, keepdim=True).expand_as(weights)

    shipped = dict(parallel._COLLECTIVES)

    def logged(name, fn):
        return lambda t, group: log.append(f"{name} {tuple(t.shape)}") or fn(t, group)
    gather, scatter = logged("gather", parallel._all_gather_async), logged("scatter", parallel._reduce_scatter_async)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        parallel._COLLECTIVES.update(gather=(gather, scatter), scatter=(scatter, gather))
        x = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
        w = torch.rand(10, 2, dtype=torch.float64, requires_grad=True)
        ids = torch.randint(0, 4, (10, 2))
        out = parallel.expert_parallel(x, w, ids, 4, lambda rows, ids, weights, n: Experts.apply(rows, weights),
                                       exchange="gather", micro_batches=2)
        assert log == ["gather (5, 4)", "gather (5, 2)", "gather (5, 4)", "gather (5, 2)", "experts 0",
                       "scatter (5, 4)", "experts 1", "scatter (5, 4)"], log
        del log[:]
        dout = torch.randn_like(out)
        out.backward(dout)
        assert log[:2] == ["gather (5, 4)", "gather (5, 4)"], log  # both slices' output gradients first
        assert log.index("experts 1 backward") < log.index("experts 0 backward"), log
        slice1_back = log[log.index("experts 1 backward") + 1:log.index("experts 0 backward")]
        assert sorted(slice1_back) == ["scatter (5, 2)", "scatter (5, 4)"], log  # slice 1's dx, dweights
        assert sorted(log[log.index("experts 0 backward") + 1:]) == ["scatter (5, 2)", "scatter (5, 4)"], log
        assert torch.allclose(x.grad, dout * w.detach().sum(1, keepdim=True))
    finally:
        parallel._COLLECTIVES.update(shipped)
        dist.destroy_process_group()


def _expert_parallel_gpu_worker(rank, world, port):
    import torch
    import torch.distributed as dist

    from rawops.torch_adapter import moe_mlp, moe_route
    from rawops.torch_adapter._moe_parallel import expert_parallel, local_moe_experts

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        experts, k, hidden, inter, tokens = 16, 4, 256, 128, 600
        g = torch.Generator(device="cuda").manual_seed(99)  # the same draws on every rank
        dt = torch.bfloat16
        wr = (torch.randn(experts, hidden, generator=g, device="cuda") * hidden ** -0.5).to(dt)
        wgu = (torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") * hidden ** -0.5).to(dt)
        wd = (torch.randn(experts, hidden, inter, generator=g, device="cuda") * inter ** -0.5).to(dt)
        xs = [torch.randn(tokens, hidden, generator=g, device="cuda").to(dt) for _ in range(world)]
        lo, hi = rank * experts // world, (rank + 1) * experts // world
        x = xs[rank].clone().requires_grad_(True)
        local_wgu, local_wd = wgu[lo:hi].clone().requires_grad_(True), wd[lo:hi].clone().requires_grad_(True)
        dout = torch.randn(x.shape, generator=g, device="cuda").to(dt)
        weights, ids, _ = moe_route(torch.nn.functional.linear(x, wr), k)
        out = expert_parallel(x, weights, ids, experts, local_moe_experts(local_wgu, local_wd))
        dx, dwgu, dwd = torch.autograd.grad(out, [x, local_wgu, local_wd], dout)
        x_ref = xs[rank].clone().requires_grad_(True)
        ref, _ = moe_mlp(x_ref, wr, wgu, wd, k)  # the one-GPU layer on this rank's tokens
        (dx_ref,) = torch.autograd.grad(ref, [x_ref], dout)
        for name, ours, theirs in (("out", out, ref), ("d x", dx, dx_ref)):
            err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
            assert err < 1e-2, f"rank {rank}: {name} relative error {err:.2e} against the one-GPU layer"
        # the experts' gradients take every rank's tokens (each rank drew the same dout): the one-GPU
        # layer over all of them
        full = [t.clone().requires_grad_(True) for t in (wgu, wd)]
        ref_all, _ = moe_mlp(torch.cat(xs), wr, *full, k)
        dwgu_ref, dwd_ref = torch.autograd.grad(ref_all, full, torch.cat([dout] * world))
        for name, ours, theirs in (("d gate_up", dwgu, dwgu_ref[lo:hi]), ("d down", dwd, dwd_ref[lo:hi])):
            err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
            assert err < 1e-2, f"rank {rank}: {name} relative error {err:.2e} against the one-GPU layer"
        # the gather overlapped over 2 slices (NCCL's async collectives, the waits on the stream): the same layer
        weights, ids, _ = moe_route(torch.nn.functional.linear(x, wr), k)  # (the first graph is freed)
        out2 = expert_parallel(x, weights, ids, experts, local_moe_experts(local_wgu, local_wd), micro_batches=2)
        grads2 = torch.autograd.grad(out2, [x, local_wgu, local_wd], dout)
        for name, ours, theirs in zip(("out", "d x", "d gate_up", "d down"), (out2, *grads2), (out, dx, dwgu, dwd)):
            err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
            assert err < 1e-2, f"rank {rank}: micro_batches=2 {name} relative error {err:.2e} against one slice"
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_expert_parallel_on_two_gpus_equals_the_one_gpu_layer():
    torch = pytest.importorskip("torch")
    import socket

    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2 or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("two sm_90 GPUs (the grouped Hopper kernel)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_expert_parallel_gpu_worker, args=(2, port), nprocs=2, join=True)
