"""float32 GEMMs at float32's accuracy on the Hopper tensor cores (config.f32_3xtf32;
rawops/_gemm_tf32.py split3_plan, kernels/gemm_tf32.cu split_tf32_*, kernels/gemm_sm90.cu
gemm_sm90_nt_3xtf32_*).

Without a GPU: which shapes the plan takes, its tiles, the padded K, the split kernels' grids, and
that the switch is off by default. With one (marker `gpu`, sm_90 only): matmul, linear_gelu and
their gradients through the 3xTF32 path (its routing checked), in every layout and at odd sizes,
against float64 on fresh random data: within 2x torch float32's own error on the same data (TF32
off) or FLOOR; NaN and inf inputs propagate; the output's every element is written."""
import pytest

import rawops
from rawops import _gemm_sm90 as hopper
from rawops import _gemm_tf32 as tf
from test_validation import OTHER

import rawops.gemm as mm  # noqa: E402

C_PTR = OTHER * 2
FLOOR = 4 * 2.0 ** -24  # four float32 roundings: both sides (nearly) exact


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(rawops.config, "f32_3xtf32", True)
    monkeypatch.setattr(mm, "_plans", {})  # routing is read from the plans this test makes


# ------------------------------------------------------------------------------ plan
def test_the_switch_is_on_by_default_and_off_nothing_takes_the_path(monkeypatch):
    assert rawops.config.SWITCHES["f32_3xtf32"][0] is True
    monkeypatch.setattr(rawops.config, "f32_3xtf32", False)
    assert tf.split3_plan("nn", 8192, 8192, 8192, 90, C_PTR, 0) is None


def test_large_products_on_sm90_take_the_128_wide_tiles_over_three_times_the_padded_k(on):
    for layout in tf.LAYOUTS:  # the splits read any layout: the parts are K-major
        assert tf.split3_plan(layout, 8192, 8192, 8192, 90, C_PTR, 0) == (
            "gemm_sm90_nt_3xtf32_n128", (132,), hopper.shared_bytes(128), 128, 1, 8192)
    assert tf.split3_plan("nt", 8192, 3072, 1000, 90, C_PTR, 0)[5] == 1024, "K padded to the 32-column stage"
    assert tf.split3_plan("nt", 8192, 3072, 769, 90, C_PTR, 0)[5] == 800
    # narrow outputs: the cost model over the 128 and 64 wide tiles, K splits allowed
    name, grid, shared, bn, splits, kp = tf.split3_plan("nt", 256, 1024, 8192, 90, C_PTR, 0)
    assert bn in hopper.SPLIT3_WIDTHS and name == hopper.split3_entry_name(bn) and shared == hopper.shared_bytes(bn)
    assert splits > 1 and kp == 8192
    assert tf.split3_plan("nt", 8192, 3072, 768, 90, C_PTR, 0, flags=mm.EPI_BIAS_GELU)[0] == "gemm_sm90_nt_3xtf32_n128"


def test_a_forced_wide_tile_is_held_to_128(on, monkeypatch):
    monkeypatch.setattr(rawops.config, "gemm_sm90_shape", (256, 1))
    assert tf.split3_plan("nt", 8192, 8192, 8192, 90, C_PTR, 0)[3] == 128


@pytest.mark.parametrize("why, args, kwargs", [
    ("not sm_90", ("nn", 8192, 8192, 8192, 80, C_PTR, 0), {}),
    ("sm_100", ("nn", 8192, 8192, 8192, 100, C_PTR, 0), {}),
    ("under 2^30 FLOP: the exact kernels' microseconds", ("nn", 512, 512, 512, 90, C_PTR, 0), {}),
    ("N % 4: c's rows are the TMA store's", ("nn", 8192, 8190, 8192, 90, C_PTR, 0), {}),
    ("c off 16 bytes", ("nn", 8192, 8192, 8192, 90, C_PTR + 4, 0), {}),
    ("the pre-activation off 16 bytes", ("nt", 8192, 8192, 8192, 90, C_PTR, C_PTR + 4), {}),
    ("the GELU-gradient epilogue (not in the Hopper kernel)", ("nt", 8192, 3072, 768, 90, C_PTR, 0),
     {"flags": mm.EPI_BIAS_GELU_GRAD}),
    ("not built", ("nn", 8192, 8192, 8192, 90, C_PTR, 0), {"built": False}),
])
def test_everything_else_stays_exact(on, why, args, kwargs):
    assert tf.split3_plan(*args, **kwargs) is None, why


def test_the_odd_operand_sizes_and_alignments_do_not_matter(on):
    # the split kernels read the operands as they are: only c, pre and N are the GEMM's
    assert tf.split3_plan("tn", 8191, 8192, 8191, 90, C_PTR, 0) is not None


def test_split_grids_cover_the_padded_k():
    assert tf.split_launch(True, 100, 70, 96) == (0, (1, 100))
    assert tf.split_launch(True, 1 << 20, 3000, 3008) == (0, (12, 65535)), "rows strided past 65535"
    assert tf.split_launch(False, 100, 70, 96) == (1, (2, 2)), "(row tiles, column tiles) of 64"


@pytest.mark.parametrize("layout, split_kernels, bits", [("nt", (0, 0), 3), ("nn", (0, 1), 1), ("tn", (1, 1), 0)])
def test_the_launches_of_one_call_in_order_with_their_scratch(monkeypatch, layout, split_kernels, bits):
    # pointers and sizes of launch_split3's five launches (no GPU: the launches recorded)
    launches, scratch = [], []
    monkeypatch.setattr(tf, "launch", lambda fn, grid, block, shared, stream, args, kinds, device: launches.append(
        (fn, grid, block, args, kinds)))
    monkeypatch.setattr(hopper, "launch_gemm", lambda *args, **kwargs: launches.append(("gemm", args, kwargs)))

    def workspace(nbytes):
        scratch.append(nbytes)
        return 1 << (40 + len(scratch)), None
    m, n, k, kp = 300, 200, 100, 128
    found = ("F", (132,), 1000, 128, 1, kp, ("split", "split_t", "fill", "fixup"), 132)
    a, b, c, bias, pre, flags = 16, 32, 48, 64, 80, mm.EPI_BIAS_GELU
    tf.launch_split3(0, layout, a, b, c, bias, pre, m, n, k, flags, 7, workspace, found)
    a2 = 1 << 41
    b2 = a2 + m * 2 * kp * 4
    marks = b2 + n * 2 * kp * 4
    assert scratch == [(m + n) * 2 * kp * 4 + (1 + m + n) * 4], "one scratch a call (no split K here)"
    assert b2 % 256 == 0, "B's parts keep the tensor maps' 16-byte alignment"
    fill, split_a, split_b, gemm, fixup = launches
    assert fill[0] == "fill" and fill[3] == (marks, 1 + m + n) and len(fill[4]) == 2
    for (fn, _, _, args, kinds), which, source, rows, out, row_marks in (
            (split_a, split_kernels[0], a, m, a2, marks + 4), (split_b, split_kernels[1], b, n, b2, marks + 4 + 4 * m)):
        assert fn == ("split", "split_t")[which] and args == (source, out, rows, k, kp, row_marks, marks)
        assert len(kinds) == len(args)
    assert gemm[1][6:14] == (a2, b2, c, bias, pre, m, n, 3 * kp) and gemm[2] == {"k_inner": 2 * kp}
    assert fixup[0] == "fixup" and fixup[1] == (2 * 132,) and len(fixup[4]) == len(fixup[3])
    assert fixup[3] == (a, b, c, bias, pre, m, n, k, flags, bits, marks + 4, marks + 4 + 4 * m, marks)


def test_the_hopper_plan_refuses_split3_for_anything_but_float32_nt():
    assert hopper.plan("nn", 0, 8192, 8192, 8192, 90, 0, 0, 132, split3=True) is None
    assert hopper.plan("nt", 2, 8192, 8192, 8192, 90, 0, 0, 132, split3=True) is None


# ------------------------------------------------------------------------------ on the GPU
def _sm90():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the 3xTF32 path is sm_90's")
    if not hopper.built(torch.cuda.current_device()):
        pytest.skip("gemm_sm90 not built")
    return torch


def _torch_error(torch, a64, b64, ref):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        c = a64.float() @ b64.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return ((c.double() - ref).norm() / ref.norm()).item()


def _routed(m, n, k):
    return any(p[4] == -1 and p[5] is not None for key, p in mm._plans.items() if key[2:5] == (m, n, k))


# (M, K, N): K padded (1000 -> 1024, 769 -> 800), partial tiles, narrow outputs with K splits, N % 4
SHAPES = [(2048, 1024, 1024), (1000, 1000, 1028), (4097, 769, 516), (256, 8192, 512), (8192, 768, 3072)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_gemm_matches_float64_within_torch_float32s_error(on, layout, m, k, n):
    torch = _sm90()
    import cupy
    from gpu_reference import poison_pool, random, to_torch

    a = random((m, k) if layout[0] == "n" else (k, m), torch.float32, 1.0)
    b = random((k, n) if layout[1] == "n" else (n, k), torch.float32, 1.0)
    a64 = a.double() if layout[0] == "n" else a.double().t()
    b64 = b.double() if layout[1] == "n" else b.double().t()
    ref = a64 @ b64
    poison_pool(m * n * 4)
    c = cupy.full((m, n), cupy.nan, dtype=cupy.float32)
    torch.cuda.synchronize()
    mm.launch_gemm(torch.cuda.current_device(), layout, 0, a.data_ptr(), b.data_ptr(), c.data.ptr, 0, 0, 0, m, n, k,
                   mm.EPI_NONE, cupy.cuda.get_current_stream().ptr, mm._cupy_workspace)
    cupy.cuda.get_current_stream().synchronize()
    assert _routed(m, n, k), f"{layout} {m}x{k}x{n} did not take the 3xTF32 path"
    out = to_torch(c)
    assert not torch.isnan(out).any(), "NaN in the output: an element left unwritten"
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= max(2 * _torch_error(torch, a64, b64, ref), FLOOR), f"{layout} {m}x{k}x{n}: {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_nan_and_inf_inputs_give_torchs_nan_and_inf(on, layout):
    # a split meets inf with a zero small part (inf x 0): the fixup sums what they reach again exactly
    torch = _sm90()
    import cupy
    from gpu_reference import to_torch

    m = k = n = 1024
    a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda")
    b = torch.randn((k, n) if layout[1] == "n" else (n, k), device="cuda")
    a2 = a if layout[0] == "n" else a.t()
    b2 = b if layout[1] == "n" else b.t()
    a2[3, 7] = float("nan")
    a2[10, 20] = float("inf")
    a2[11, 20] = float("-inf")
    b2[20, 5] = 1.0  # exactly TF32: small part 0, so inf meets 0 in big_a small_b
    b2[30, 9] = float("inf")
    b2[31, 9] = float("inf")
    a2[12, 30], a2[12, 31] = 1.0, -1.0  # row 12, column 9: inf - inf
    b2[40, 700] = 0.0
    a2[13, 40] = float("inf")  # row 13, column 700: inf x 0
    c = cupy.full((m, n), cupy.nan, dtype=cupy.float32)
    torch.cuda.synchronize()
    mm.launch_gemm(torch.cuda.current_device(), layout, 0, a.data_ptr(), b.data_ptr(), c.data.ptr, 0, 0, 0, m, n, k,
                   mm.EPI_NONE, cupy.cuda.get_current_stream().ptr, mm._cupy_workspace)
    cupy.cuda.get_current_stream().synchronize()
    assert _routed(m, n, k)
    ours = to_torch(c)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        theirs = a2 @ b2
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs)), "NaN where torch has none, or none where it has"
    assert torch.equal(torch.isposinf(ours), torch.isposinf(theirs)) and torch.equal(torch.isneginf(ours),
                                                                                      torch.isneginf(theirs))
    assert torch.isnan(ours[3]).all() and torch.isnan(ours[12, 9]) and torch.isnan(ours[13, 700])
    finite = torch.isfinite(theirs)
    err = ((ours[finite].double() - theirs[finite].double()).norm() / theirs[finite].double().norm()).item()
    assert err < 1e-5, err


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4096, 8192])
def test_adapter_linear_gelu_forward_and_backward_within_torch_float32s_error(on, m):
    torch = _sm90()
    from rawops import torch_adapter as ta

    k, n = 768, 3072
    x = torch.randn(m, k, device="cuda", requires_grad=True)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).requires_grad_()
    bias = torch.randn(n, device="cuda", requires_grad=True)
    dy = torch.randn(m, n, device="cuda")
    y = ta.linear_gelu(x, w, bias)
    y.backward(dy)
    assert _routed(m, n, k) and _routed(m, k, n) and _routed(n, k, m), "forward, dx and dW on the 3xTF32 path"
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    y64 = torch.nn.functional.gelu(torch.nn.functional.linear(x64, w64, b64))
    y64.backward(dy.double())
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        x32, w32, b32 = (t.detach().clone().requires_grad_() for t in (x, w, bias))
        y32 = torch.nn.functional.gelu(torch.nn.functional.linear(x32, w32, b32))
        y32.backward(dy)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    rel = lambda t, r: ((t.double() - r).norm() / r.norm()).item()  # noqa: E731
    for what, ours, theirs, ref in [("y", y, y32, y64), ("dx", x.grad, x32.grad, x64.grad),
                                    ("dweight", w.grad, w32.grad, w64.grad), ("dbias", bias.grad, b32.grad, b64.grad)]:
        assert rel(ours, ref) <= max(2 * rel(theirs, ref), FLOOR), f"{what}: {rel(ours, ref):.2e} vs torch's " \
            f"{rel(theirs, ref):.2e}"
