"""The glu family's contract (swiglu, geglu, their packed forms), through the CuPy API and the torch
adapter: launch plans and argument checks without a GPU; against torch in float64 with one."""
import pytest

from test_validation import BASE, FAR, OTHER, FakeCAI, assert_passes_validation

import rawops
from rawops import glu

V32, V16 = 4, 8  # 16-byte vectors of float32 and of the half types


def f32(shape=(4, 8), ptr=BASE, **kw):
    return FakeCAI(shape, "<f4", ptr, **kw)


def f16(shape=(4, 8), ptr=BASE, **kw):
    return FakeCAI(shape, "<f2", ptr, **kw)


# ------------------------------------------------------------------------------ launch plans (pure)
def test_dense_rows_merge_into_one_flat_row():
    blocks, rows, cols, strides, vec = glu.launch_plan(4096, 11008, 2, (0, 0, 0), (11008,) * 3, 132)
    assert (rows, cols, strides, vec) == (1, 4096 * 11008, (4096 * 11008,) * 3, 1)
    assert blocks == -(-(4096 * 11008 // V16) // (glu.THREADS * glu.UNROLL))


def test_packed_rows_keep_their_stride_and_vectors():
    blocks, rows, cols, strides, vec = glu.launch_plan(4096, 11008, 2, (0, 11008 * 2, 0), (22016, 22016, 11008), 132)
    assert (rows, cols, strides, vec) == (4096, 11008, (22016, 22016, 11008), 1)
    assert blocks == -(-(4096 * (11008 // V16)) // (glu.THREADS * glu.UNROLL))


def test_a_row_tail_keeps_the_vectors_while_strides_are_whole_vectors():
    # rows of 9 float32 at a stride of 12: two vectors a row and one element of tail
    blocks, rows, cols, strides, vec = glu.launch_plan(5, 9, 4, (0, 48, 0), (12, 12, 12), 132)
    assert (rows, cols, vec) == (5, 9, 1) and blocks == 1


@pytest.mark.parametrize("pointers,strides,cols,why", [
    ((4, 0, 0), (8, 8, 8), 8, "a pointer off 16 bytes"),
    ((0, 0, 0), (10, 10, 9), 9, "a stride not a whole number of vectors"),
    ((0, 0, 0), (4, 4, 4), 3, "a row narrower than a vector"),
    ((0, 36, 0), (18, 18, 9), 9, "packed with F not a whole number of vectors"),
])
def test_element_by_element_where_vectors_do_not_fit(pointers, strides, cols, why):
    blocks, _, _, _, vec = glu.launch_plan(7, cols, 4, pointers, strides, 132)
    assert vec == 0, why


def test_the_element_path_grid_is_bounded_by_the_resident_blocks():
    # resident: the blocks of the kernel the device holds at once (occupancy API at launch)
    blocks, *_, vec = glu.launch_plan(1 << 20, 7, 4, (0, 0, 0), (9, 9, 7), 132 * 5)
    assert vec == 0 and blocks == 132 * 5
    assert glu.launch_plan(1 << 20, 7, 4, (0, 0, 0), (9, 9, 7), 10 ** 9)[0] == -(-(7 << 20) // glu.THREADS)
    assert glu.launch_plan(1, 3, 4, (0, 0, 0), (3, 3, 3), 132 * 5)[0] == 1


def test_table_lists_every_activation_both_ways():
    assert sorted(glu.KERNELS) == sorted(f"{a}_{d}" for a in ("swiglu", "geglu_tanh", "geglu_erf")
                                         for d in ("fwd", "bwd"))
    assert all(len(glu.FWD_KINDS) == len(glu.KERNELS[f"{a}_fwd"]) for a in glu.ACTIVATIONS)
    assert all(len(glu.BWD_KINDS) == len(glu.KERNELS[f"{a}_bwd"]) for a in glu.ACTIVATIONS)


# ------------------------------------------------------------------------------ argument checks
SPLIT = {
    "swiglu": lambda g, u, **kw: rawops.swiglu(g, u, **kw),
    "geglu": lambda g, u, **kw: rawops.geglu(g, u, **kw),
    "geglu_none": lambda g, u, **kw: rawops.geglu(g, u, "none", **kw),
}
SPLIT_BWD = {
    "swiglu_backward": lambda d, g, u, **kw: rawops.swiglu_backward(d, g, u, **kw),
    "geglu_backward": lambda d, g, u, **kw: rawops.geglu_backward(d, g, u, **kw),
}


@pytest.mark.parametrize("op", sorted(SPLIT))
@pytest.mark.parametrize("make", [f32, f16], ids=["f32", "f16"])
def test_valid_split_calls_get_past_validation(op, make):
    fn = SPLIT[op]
    assert_passes_validation(fn, make(), make(ptr=OTHER))
    assert_passes_validation(fn, make(), make(ptr=OTHER), out=make(ptr=FAR))
    assert_passes_validation(fn, make(), make(ptr=OTHER), out=make())  # in place on gate
    assert_passes_validation(fn, make(), make(ptr=OTHER), out=make(ptr=OTHER))  # in place on up


@pytest.mark.parametrize("op", sorted(SPLIT_BWD))
def test_valid_split_backward_calls_get_past_validation(op):
    fn = SPLIT_BWD[op]
    assert_passes_validation(fn, f32(ptr=FAR), f32(), f32(ptr=OTHER))
    assert_passes_validation(fn, f32(ptr=FAR), f32(), f32(ptr=OTHER), out=(f32(), f32(ptr=OTHER)))  # in place


def test_valid_packed_calls_get_past_validation():
    x = f32((4, 16))
    assert_passes_validation(rawops.swiglu_fused, x)
    assert_passes_validation(rawops.geglu_fused, x, "none", out=f32((4, 8), ptr=OTHER))
    assert_passes_validation(rawops.swiglu_fused_backward, f32((4, 8), ptr=OTHER), x)
    assert_passes_validation(rawops.swiglu_fused_backward, f32((4, 8), ptr=OTHER), x, out=x)  # in place
    assert_passes_validation(rawops.geglu_fused_backward, f32((4, 8), ptr=OTHER), x, "tanh",
                             out=f32((4, 16), ptr=FAR))


def test_row_strided_views_get_past_validation():
    # gate and up as the halves of one packed matrix (rows 16 apart), out dense
    assert_passes_validation(rawops.swiglu, f32((4, 8), strides=(64, 4)), f32((4, 8), ptr=BASE + 32, strides=(64, 4)))


@pytest.mark.parametrize("op", sorted(SPLIT))
def test_gate_of_unsupported_dtype_names_gate(op):
    with pytest.raises(TypeError, match=r"^gate has dtype <i4;.*float32, float16, bfloat16"):
        SPLIT[op](FakeCAI((4, 8), "<i4"), f32(ptr=OTHER))


@pytest.mark.parametrize("op", sorted(SPLIT))
def test_up_of_another_dtype_or_shape_names_up(op):
    with pytest.raises(TypeError, match=r"^up has dtype float16, expected float32 like gate"):
        SPLIT[op](f32(), f16(ptr=OTHER))
    with pytest.raises(ValueError, match=r"^up has shape \(4, 7\), expected \(4, 8\) like gate"):
        SPLIT[op](f32(), f32((4, 7), ptr=OTHER))


@pytest.mark.parametrize("op", sorted(SPLIT_BWD))
def test_dy_of_another_shape_names_dy(op):
    with pytest.raises(ValueError, match=r"^dy has shape \(8, 4\), expected \(4, 8\) like gate"):
        SPLIT_BWD[op](f32((8, 4), ptr=FAR), f32(), f32(ptr=OTHER))


def test_a_transposed_gate_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"^gate is not row-strided"):
        rawops.swiglu(f32((4, 8), strides=(4, 16)), f32(ptr=OTHER))


def test_a_misaligned_gate_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"^gate is misaligned"):
        rawops.swiglu(f32(ptr=BASE + 2), f32(ptr=OTHER))


def test_a_zero_dim_gate_is_refused():
    with pytest.raises(ValueError, match=r"^gate must have at least one dimension"):
        rawops.swiglu(f32(()), f32((), ptr=OTHER))


@pytest.mark.parametrize("bad,error", [("erf", ValueError), (None, TypeError), (1, TypeError)])
def test_approximate_is_checked_before_anything_else(bad, error):
    with pytest.raises(error, match=r"^approximate must be"):
        rawops.geglu(FakeCAI((4, 8), "<i4"), f32(ptr=OTHER), bad)
    with pytest.raises(error, match=r"^approximate must be"):
        rawops.geglu_fused_backward(f32(), f32((4, 16), ptr=OTHER), bad)


def test_out_of_another_shape_or_dtype_names_out():
    with pytest.raises(ValueError, match=r"^out has shape \(4, 16\), expected \(4, 8\)"):
        rawops.swiglu(f32(), f32(ptr=OTHER), out=f32((4, 16), ptr=FAR))
    with pytest.raises(TypeError, match=r"^out has dtype float16, expected float32 like gate"):
        rawops.swiglu(f32(), f32(ptr=OTHER), out=f16(ptr=FAR))
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.swiglu(f32(), f32(ptr=OTHER), out=f32(ptr=FAR, readonly=True))


def test_out_partly_overlapping_an_input_is_refused():
    with pytest.raises(ValueError, match=r"^out overlaps up; pass out=up exactly"):
        rawops.swiglu(f32(), f32(ptr=OTHER), out=f32(ptr=OTHER + 16))
    # the packed forward's out can never be x (another shape): any overlap is refused
    with pytest.raises(ValueError, match=r"^out overlaps x"):
        rawops.swiglu_fused(f32((4, 16)), out=f32((4, 8)))


def test_backward_out_must_be_a_pair_of_disjoint_arrays():
    dy, g, u = f32(ptr=FAR), f32(), f32(ptr=OTHER)
    with pytest.raises(TypeError, match=r"^out must be a pair \(d_gate, d_up\)"):
        rawops.swiglu_backward(dy, g, u, out=f32(ptr=FAR + 0x10000))
    with pytest.raises(ValueError, match=r"^d_gate and d_up overlap"):
        rawops.swiglu_backward(dy, g, u, out=(f32(ptr=FAR + 0x10000), f32(ptr=FAR + 0x10000)))
    with pytest.raises(ValueError, match=r"^d_up has shape \(4, 9\)"):
        rawops.swiglu_backward(dy, g, u, out=(f32(ptr=FAR + 0x10000), f32((4, 9), ptr=FAR + 0x20000)))
    with pytest.raises(ValueError, match=r"^d_gate overlaps dy"):
        rawops.swiglu_backward(dy, g, u, out=(f32(ptr=FAR + 8), f32(ptr=FAR + 0x20000)))


def test_packed_x_with_an_odd_last_dim_names_x():
    with pytest.raises(ValueError, match=r"^x has 15 columns in its last dim; a packed gate/up tensor has 2F"):
        rawops.swiglu_fused(f32((4, 15)))


def test_packed_backward_dy_must_have_half_of_x():
    with pytest.raises(ValueError, match=r"^dy has shape \(4, 16\), expected \(4, 8\)"):
        rawops.swiglu_fused_backward(f32((4, 16), ptr=OTHER), f32((4, 16)))
    with pytest.raises(TypeError, match=r"^dy has dtype float16, expected float32 like x"):
        rawops.swiglu_fused_backward(f16((4, 8), ptr=OTHER), f32((4, 16)))


def test_adapter_refuses_what_is_not_a_tensor_naming_it():
    torch = pytest.importorskip("torch")
    from rawops.torch_adapter import glu as ta_glu

    with pytest.raises(TypeError, match=r"^gate must be a torch.Tensor"):
        ta_glu.swiglu([1.0], torch.ones(1))
    with pytest.raises(ValueError, match=r"^up has shape \(3,\), expected \(2,\) like gate"):
        ta_glu.swiglu(torch.ones(2), torch.ones(3))
    with pytest.raises(ValueError, match=r"^x has 3 columns"):
        ta_glu.swiglu_fused(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"^approximate must be 'tanh' or 'none'"):
        ta_glu.geglu(torch.ones(2), torch.ones(2), "erf")
    with pytest.raises((TypeError, ValueError), match=r"^gate"):  # a CPU tensor
        ta_glu.swiglu(torch.ones(2), torch.ones(2))


def test_swiglu_mlp_has_llama_mlp_state_dict_keys():
    pytest.importorskip("torch")
    from rawops.torch_adapter import SwiGLUMLP

    mlp = SwiGLUMLP(16, 44)
    assert sorted(mlp.state_dict()) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]
    assert tuple(mlp.gate_proj.weight.shape) == (44, 16) and tuple(mlp.down_proj.weight.shape) == (16, 44)
    assert sorted(SwiGLUMLP(16, 44, bias=True).state_dict()) == [
        "down_proj.bias", "down_proj.weight", "gate_proj.bias", "gate_proj.weight", "up_proj.bias", "up_proj.weight"]


# ------------------------------------------------------------------------------ GPU: against torch in float64
torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

gpu = pytest.mark.gpu
ACTS = {"swiglu": ("swiglu", None), "geglu_tanh": ("geglu", "tanh"), "geglu_none": ("geglu", "none")}
SHAPES = [(0, 8), (1, 1), (3, 7), (5, 9), (37, 1000), (4096, 1024), (2, 3, 4104), (1, (1 << 20) + 3)]
IDS = ["x".join(map(str, s)) for s in SHAPES]


def _act64(act, g):
    kind, approximate = ACTS[act]
    return F.silu(g) if kind == "swiglu" else F.gelu(g, approximate=approximate)


def _reference(act, gate, up, dy):
    """(out, d_gate, d_up) in float64 from the stored inputs."""
    g, u = gate.double().requires_grad_(), up.double().requires_grad_()
    out = _act64(act, g) * u
    if out.numel() == 0:
        return out.detach(), torch.zeros_like(g), torch.zeros_like(u)
    dg, du = torch.autograd.grad(out, (g, u), dy.double())
    return out.detach(), dg, du


def _cupy_fns(act):
    kind, approximate = ACTS[act]
    extra = () if approximate is None else (approximate,)
    fwd, bwd = getattr(rawops, kind), getattr(rawops, f"{kind}_backward")
    pfwd, pbwd = getattr(rawops, f"{kind}_fused"), getattr(rawops, f"{kind}_fused_backward")
    return (lambda g, u, **kw: fwd(g, u, *extra, **kw), lambda d, g, u, **kw: bwd(d, g, u, *extra, **kw),
            lambda x, **kw: pfwd(x, *extra, **kw), lambda d, x, **kw: pbwd(d, x, *extra, **kw))


def _ta_fns(act):
    from rawops.torch_adapter import glu as ta_glu

    kind, approximate = ACTS[act]
    extra = () if approximate is None else (approximate,)
    return (lambda g, u: getattr(ta_glu, kind)(g, u, *extra), lambda x: getattr(ta_glu, f"{kind}_fused")(x, *extra))


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("act", list(ACTS))
def test_split_forward_and_backward_match_torch_float64(act, shape, dtype):
    from gpu_reference import DTYPES, assert_close, poison_pool, random, to_cupy

    dt = DTYPES[dtype]
    gate, up, dy = random(shape, dt), random(shape, dt), random(shape, dt)
    fwd, bwd, _, _ = _cupy_fns(act)
    nbytes = gate.numel() * gate.element_size()
    poison_pool(nbytes)
    out = fwd(to_cupy(gate), to_cupy(up))
    poison_pool(nbytes, nbytes)
    dgate, dup = bwd(to_cupy(dy), to_cupy(gate), to_cupy(up))
    ref, rdg, rdu = _reference(act, gate, up, dy)
    assert_close(out, ref, dt, f"{act} out")
    assert_close(dgate, rdg, dt, f"{act} d_gate", factor=2)
    assert_close(dup, rdu, dt, f"{act} d_up")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(0, 16), (1, 2), (3, 14), (37, 2000), (4096, 2 * 1376), (2, 3, 2 * 4100),
                                   (5, 2 * 11008)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("act", list(ACTS))
def test_packed_forward_and_backward_match_the_split_reference(act, shape, dtype):
    """gate is the FIRST half of the last dim, up the second (HF Phi3MLP's gate_up_proj.chunk(2))."""
    from gpu_reference import DTYPES, assert_close, poison_pool, random, to_cupy

    dt = DTYPES[dtype]
    x = random(shape, dt)
    f = shape[-1] // 2
    dy = random(shape[:-1] + (f,), dt)
    _, _, pfwd, pbwd = _cupy_fns(act)
    poison_pool(dy.numel() * dy.element_size())
    out = pfwd(to_cupy(x))
    poison_pool(x.numel() * x.element_size())
    dx = pbwd(to_cupy(dy), to_cupy(x))
    ref, rdg, rdu = _reference(act, x[..., :f], x[..., f:], dy)
    assert_close(out, ref, dt, f"{act} packed out")
    assert_close(dx, torch.cat([rdg, rdu], -1), dt, f"{act} packed dx", factor=2)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["padded_aligned", "padded_misaligned", "every_other_row", "offset_three_dims"])
def test_row_strided_views_run_as_they_are(layout, dtype):
    from gpu_reference import DTYPES, assert_close, poison_pool
    from test_norm import row_view

    dt = DTYPES[dtype]
    shape = (3, 33, 1000) if layout == "offset_three_dims" else (67, 1000)
    (cg, tg, _), (cu, tu, _), (cd, td, _) = (row_view(layout, shape, dt) for _ in range(3))
    fwd, bwd, _, _ = _cupy_fns("swiglu")
    poison_pool(tg.numel() * tg.element_size())
    out = fwd(cg, cu)
    poison_pool(tg.numel() * tg.element_size(), tg.numel() * tg.element_size())
    dgate, dup = bwd(cd, cg, cu)
    ref, rdg, rdu = _reference("swiglu", tg, tu, td)
    assert_close(out, ref, dt, f"{layout} out")
    assert_close(dgate, rdg, dt, f"{layout} d_gate", factor=2)
    assert_close(dup, rdu, dt, f"{layout} d_up")
    # out= a view of the same layout, written as it is
    co, to, base = row_view(layout, shape, dt, fill=float("nan"))
    fwd(cg, cu, out=co)
    assert_close(to, ref, dt, f"{layout} out= view")
    assert torch.isnan(base).sum() == base.numel() - to.numel(), "out= wrote outside its view"


@gpu
def test_in_place_outputs():
    from gpu_reference import assert_close, random, to_cupy

    dt = torch.bfloat16
    gate, up, dy = random((64, 4096), dt), random((64, 4096), dt), random((64, 4096), dt)
    ref, rdg, rdu = _reference("swiglu", gate, up, dy)
    g, u = gate.clone(), up.clone()
    out = rawops.swiglu(to_cupy(g), to_cupy(u), out=to_cupy(u))
    assert out.data.ptr == u.data_ptr()
    assert_close(u, ref, dt, "out=up")
    g, u = gate.clone(), up.clone()
    rawops.swiglu_backward(to_cupy(dy), to_cupy(g), to_cupy(u), out=(to_cupy(g), to_cupy(u)))
    assert_close(g, rdg, dt, "d_gate into gate", factor=2)
    assert_close(u, rdu, dt, "d_up into up")
    x, dyp = torch.cat([gate, up], -1), dy
    rawops.swiglu_fused_backward(to_cupy(dyp), to_cupy(x), out=to_cupy(x))
    assert_close(x, torch.cat([rdg, rdu], -1), dt, "packed dx into x", factor=2)


@gpu
@pytest.mark.parametrize("act", list(ACTS))
def test_saturation_and_nan(act):
    """Large |gate| saturates as torch does (no NaN from inf / inf); NaN in gate or up stays NaN."""
    from gpu_reference import to_cupy

    gate = torch.tensor([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, float("nan"), 1.0], device="cuda")
    up = torch.tensor([1.0] * 8 + [float("nan")], device="cuda")
    fwd, bwd, _, _ = _cupy_fns(act)
    out = torch.from_dlpack(fwd(to_cupy(gate), to_cupy(up)))
    ref = _act64(act, gate.double()) * up.double()
    assert torch.isnan(out[7:]).all()
    torch.testing.assert_close(out[:7].double(), ref[:7], rtol=1e-5, atol=1e-6)
    dgate, dup = (torch.from_dlpack(t) for t in bwd(to_cupy(torch.ones_like(gate)), to_cupy(gate), to_cupy(up)))
    assert not torch.isnan(dgate[:7]).any() and not torch.isnan(dup[:7]).any()
    assert torch.isnan(dgate[7:]).all()


# ------------------------------------------------------------------------------ GPU: the torch adapter
@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("act", list(ACTS))
def test_adapter_autograd_matches_torch(act, dtype):
    from gpu_reference import DTYPES, assert_close, random

    dt = DTYPES[dtype]
    split, packed = _ta_fns(act)
    gate, up, dy = random((67, 1000), dt), random((67, 1000), dt), random((67, 1000), dt)
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    out = split(g, u)
    out.backward(dy)
    ref, rdg, rdu = _reference(act, gate, up, dy)
    assert_close(out.detach(), ref, dt, "adapter out")
    assert_close(g.grad, rdg, dt, "adapter d_gate", factor=2)
    assert_close(u.grad, rdu, dt, "adapter d_up")
    with torch.no_grad():
        assert torch.equal(split(gate, up), out.detach()), "no-grad path == autograd path"
    x = torch.cat([gate, up], -1).requires_grad_()
    out = packed(x)
    out.backward(dy)
    assert_close(out.detach(), ref, dt, "adapter packed out")
    assert_close(x.grad, torch.cat([rdg, rdu], -1), dt, "adapter packed dx", factor=2)


@gpu
def test_adapter_transposed_and_broadcast_gradients():
    """A transposed gate is copied first; so is the all-stride-0 gradient of .sum()."""
    from gpu_reference import assert_close, random

    split, _ = _ta_fns("swiglu")
    gate, up = random((64, 48), torch.float32), random((48, 64), torch.float32)
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    split(g.t(), u).sum().backward()
    ref, rdg, rdu = _reference("swiglu", gate.t(), up, torch.ones(48, 64, device="cuda"))
    assert_close(g.grad, rdg.t(), torch.float32, "d_gate through a transpose")
    assert_close(u.grad, rdu, torch.float32, "d_up, broadcast dy")


@gpu
@pytest.mark.parametrize("act", list(ACTS))
def test_adapter_compiles_fullgraph(act):
    from gpu_reference import assert_close, random

    split, packed = _ta_fns(act)
    gate, up = random((32, 768), torch.bfloat16), random((32, 768), torch.bfloat16)
    fn = torch.compile(lambda g, u: split(g, u) * 2 + packed(torch.cat([g, u], -1)), fullgraph=True)
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    fn(g, u).float().sum().backward()
    g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
    (3 * _act64(act, g64) * u64).sum().backward()
    assert_close(g.grad, g64.grad, torch.bfloat16, "compiled d_gate", factor=2)
    assert_close(u.grad, u64.grad, torch.bfloat16, "compiled d_up", factor=2)


@gpu
def test_adapter_gradcheck_float64_semantics():
    """float32 through the kernels against torch.autograd.gradcheck-style finite differences of the
    float64 reference: the analytic gradients of the kernels equal the reference's analytic ones."""
    from gpu_reference import assert_close, random

    for act in ACTS:
        split, packed = _ta_fns(act)
        gate, up = random((5, 9), torch.float32), random((5, 9), torch.float32)
        jac = torch.autograd.functional.jacobian(lambda g, u: split(g, u), (gate, up))
        ref = torch.autograd.functional.jacobian(lambda g, u: _act64(act, g) * u, (gate.double(), up.double()))
        for got, want, name in zip(jac, ref, ("d/d gate", "d/d up")):
            assert_close(got, want, torch.float32, f"{act} jacobian {name}", factor=2)


@gpu
def test_adapter_cuda_graph_capture():
    from gpu_reference import assert_close, random

    split, packed = _ta_fns("swiglu")
    gate, up = random((128, 4096), torch.bfloat16), random((128, 4096), torch.bfloat16)
    x = torch.cat([gate, up], -1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        split(gate, up), packed(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a, b = split(gate, up), packed(x)
    gate.copy_(random(gate.shape, torch.bfloat16))
    x[:, :4096] = gate
    graph.replay()
    ref = F.silu(gate.double()) * up.double()
    assert_close(a, ref, torch.bfloat16, "captured split")
    assert_close(b, ref, torch.bfloat16, "captured packed")


@gpu
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_mlp_loads_a_llama_mlp_state_dict_and_matches_it(bias):
    from gpu_reference import assert_close, random
    from rawops.torch_adapter import SwiGLUMLP

    hidden, inter = 256, 688
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP

        stock = LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=inter, mlp_bias=bias, hidden_act="silu"))
    except ImportError:  # no transformers here: a module with LlamaMLP's exact layout and math
        class LlamaMLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gate_proj = torch.nn.Linear(hidden, inter, bias=bias)
                self.up_proj = torch.nn.Linear(hidden, inter, bias=bias)
                self.down_proj = torch.nn.Linear(inter, hidden, bias=bias)

            def forward(self, x):
                return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

        stock = LlamaMLP()
    stock = stock.cuda().double()
    ours = SwiGLUMLP(hidden, inter, bias=bias, device="cuda", dtype=torch.float32)
    missing = ours.load_state_dict({k: v.float() for k, v in stock.state_dict().items()})
    assert not missing.missing_keys and not missing.unexpected_keys
    x = random((4, 33, hidden), torch.float32)
    xr = x.clone().requires_grad_()
    y = ours(xr)
    y.sum().backward()
    x64 = x.double().requires_grad_()
    ref = stock(x64)
    ref.sum().backward()
    # TF32 is off by default for matmuls: float32 GEMMs, then float32 tolerance times the depth
    assert_close(y.detach(), ref.detach(), torch.float32, "SwiGLUMLP forward", factor=20)
    assert_close(xr.grad, x64.grad, torch.float32, "SwiGLUMLP dx", factor=20)
    for name in ("gate_proj", "up_proj", "down_proj"):  # d_gate, d_up written over the saved projections
        assert_close(getattr(ours, name).weight.grad, getattr(stock, name).weight.grad, torch.float32,
                     f"SwiGLUMLP d {name}.weight", factor=20)
    # the backward wrote over its saved gate and up: a second backward through one forward is refused
    y2 = ours(x.clone().requires_grad_())
    y2.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        y2.sum().backward()
