"""The TF32 GEMM's contract (kernels/gemm_tf32.cu, rawops/_gemm_tf32.py): matmul(tf32=True).

Without a GPU: which shapes the TF32 kernel takes and which go to the exact kernels, its grid
and shared memory (pure arithmetic), argument checks, the fatbin holding its entry points on
every architecture. With one (marker `gpu`): against torch in float64 on fresh random data,
held to TF32's ~1e-3 relative-norm tolerance *and* shown to be TF32 (its error is far above
exact float32's) where the kernel runs, exact where it does not; every layout, the epilogues,
odd and empty shapes, out=, poisoned outputs, NaN inputs; the torch adapter with autograd."""
import os
import re

import pytest

import rawops
from rawops import _gemm_tf32 as tf
from test_build import elf_entry_symbols, expected_elf_archs, needs_cuobjdump
from test_validation import BASE, OTHER, f32

import rawops.gemm as mm  # noqa: E402
C_PTR = OTHER * 2
TF32_TOLERANCE = 1e-3  # relative norm (issue 4); TF32 rounding alone is ~2^-11 per operand
EXACT_TOLERANCE = 1e-5  # exact float32 FFMA at these K: ~1e-7


# ------------------------------------------------------------------------------ plan
def test_wide_kernels_are_compiled_exactly_where_the_planner_may_pick_them():
    # kernels/gemm_tf32.cu traps in the wide entries for every other target (build time):
    # its list of architectures must be the planner's WIDE_CCS.
    path = os.path.join(os.path.dirname(__file__), "..", "kernels", "gemm_tf32.cu")
    source = open(path).read()
    guard = re.search(r"#if defined\(__CUDA_ARCH__\)((?: && __CUDA_ARCH__ != \d+)+)\n"
                      r"#define RAWOPS_TF32_WIDE\(A_KM, B_KM\) __trap\(\)", source)
    assert guard, "kernels/gemm_tf32.cu no longer guards the wide entries by architecture"
    assert sorted(int(a) // 10 for a in re.findall(r"!= (\d+)", guard.group(1))) == sorted(tf.WIDE_CCS)


def test_large_nn_outputs_take_the_wide_kernel_where_a_block_may_have_120_kb(monkeypatch):
    for layout in ("nt", "tn"):  # measured faster (nt) or as fast (tn) with 128 x 128 tiles
        assert tf.plan(layout, 8192, 8192, 8192, 90, BASE, OTHER, C_PTR)[0] == f"gemm_tf32_{layout}_f32"
    assert tf.WIDE_LAYOUTS == ("nn",)
    monkeypatch.setattr(tf, "WIDE_LAYOUTS", tf.LAYOUTS)
    for layout in tf.LAYOUTS:
        name, grid, block, shared, splits = tf.plan(layout, 8192, 8192, 8192, 90, BASE, OTHER, C_PTR)
        assert name == f"gemm_tf32_wide_{layout}_f32" and grid == (32, 64) and block == 256 and splits == 1
        assert shared == tf.shared_bytes(layout, 256, tf.WIDE_STAGES)
        for cc in (80, 100):
            assert tf.plan(layout, 8192, 8192, 8192, cc, BASE, OTHER, C_PTR)[0] == name
        for cc in (86, 89, 120):  # 99 KB a block
            name, grid, _, shared, _ = tf.plan(layout, 8192, 8192, 8192, cc, BASE, OTHER, C_PTR)
            assert name == f"gemm_tf32_{layout}_f32" and grid == (64, 64) and shared == tf.shared_bytes(layout)
    # 16 x 8 = 128 wide tiles for 132 SMs: the 128 x 128 kernel (256 tiles) fills the GPU better.
    assert tf.plan("nn", 1024, 4096, 1024, 90, BASE, OTHER, C_PTR)[0] == "gemm_tf32_nn_f32"
    assert tf.plan("nn", 1024, 4096, 1024, 90, BASE, OTHER, C_PTR, sms=128)[0] == "gemm_tf32_wide_nn_f32"


def test_aligned_float32_on_sm80_and_later_takes_the_tf32_kernel_in_every_layout():
    for layout in tf.LAYOUTS:
        name, grid, block, shared, splits = tf.plan(layout, 1000, 1000, 256, 90, BASE, OTHER, C_PTR)
        assert name == f"gemm_tf32_{layout}_f32" and grid == (8, 8) and block == 256 and splits == 1
        assert shared == tf.shared_bytes(layout)
    assert tf.plan("nn", 1000, 520, 256, 80, BASE, OTHER, C_PTR)[1] == (5, 8), "sm_80, partial tiles"
    assert tf.plan("nt", 33, 10, 100, 120, BASE, OTHER, C_PTR)[0] == "gemm_tf32_nt_f32", "nt: N is free"


def test_large_outputs_on_sm90_take_the_hopper_gemm_with_m_n_major_operands_transposed_first():
    from rawops import _gemm_sm90

    shared = _gemm_sm90.SHARED_BYTES
    expect = {"nt": (False, False), "nn": (False, True), "tn": (True, True)}
    for layout, transpose in expect.items():
        assert tf.hopper_plan(layout, 8192, 8192, 8192, 90, BASE, OTHER, C_PTR) == (
            "gemm_sm90_nt_tf32", (132,), shared, 256, 1, transpose), layout
    # a copied operand's own alignment does not matter; one read in place must be 16-byte aligned
    assert tf.hopper_plan("nn", 8192, 8192, 8192, 90, BASE, OTHER + 4, C_PTR) is not None
    assert tf.hopper_plan("tn", 8192, 8192, 8192, 90, BASE + 4, OTHER + 4, C_PTR) is not None
    assert tf.hopper_plan("nt", 8192, 8192, 8192, 90, BASE, OTHER + 4, C_PTR) is None
    assert tf.hopper_plan("tn", 8190, 8192, 8192, 90, BASE, OTHER, C_PTR) is not None, "tn: M is a copy's column count"
    for why, args in [("sm_80", ("nn", 8192, 8192, 8192, 80)), ("sm_100", ("nn", 8192, 8192, 8192, 100)),
                      ("N % 4: c's rows", ("nn", 8192, 8190, 8192, 90)),
                      ("K % 4: the K-major rows", ("nt", 8192, 8192, 8190, 90)),
                      ("a copy's grid.y past 65535", ("nn", 8192, 256, 65536 * 64 + 4, 90))]:
        assert tf.hopper_plan(*args, BASE, OTHER, C_PTR) is None, why
    assert tf.hopper_plan("nn", 8192, 8192, 8192, 90, BASE, OTHER, C_PTR, built=False) is None
    # every size takes the Hopper kernel, on its narrow tiles (and K splits) below half a wave
    assert tf.hopper_plan("nt", 256, 3072, 768, 90, BASE, OTHER, C_PTR)[:5] == (
        "gemm_sm90_nt_tf32_n64", (96,), _gemm_sm90.shared_bytes(64), 64, 1)
    assert tf.hopper_plan("nn", 32, 768, 3072, 90, BASE, OTHER, C_PTR)[4] > 1, "a 32 x 768 output over K = 3072"
    assert tf.hopper_plan("nt", 1, 8, 4, 90, BASE, OTHER, C_PTR) is not None
    assert tf.hopper_plan("nt", 8192, 3072, 768, 90, BASE, OTHER, C_PTR, flags=mm.EPI_BIAS_GELU_GRAD) is None
    assert tf.transpose_grid(100, 70) == (2, 2) and tf.transpose_grid(100, 130) == (3, 2), "(column, row tiles) of 64"


def test_the_hopper_switch_turns_it_off(monkeypatch):
    monkeypatch.setattr(rawops.config, "tf32_sm90", False)
    assert tf.hopper_plan("nt", 8192, 8192, 8192, 90, BASE, OTHER, C_PTR) is None


def test_shared_memory_is_stages_of_padded_tiles_and_fits_the_gpus_each_kernel_runs_on():
    kmajor, mnmajor = 128 * 20 * 4, 16 * 136 * 4
    assert tf.shared_bytes("nt") == 4 * 2 * kmajor == 81920
    assert tf.shared_bytes("nn") == 4 * (kmajor + mnmajor)
    assert tf.shared_bytes("tn") == 4 * 2 * mnmajor
    assert all(tf.shared_bytes(layout) <= 99 * 1024 for layout in tf.LAYOUTS), "sm_86/89/120 give 99 KB a block"
    wide = {layout: tf.shared_bytes(layout, 256, tf.WIDE_STAGES) for layout in tf.LAYOUTS}
    assert wide["nt"] == 4 * (kmajor + 256 * 20 * 4) == 122880 and wide["tn"] == 4 * (mnmajor + 16 * 264 * 4)
    assert all(99 * 1024 < size <= 163 * 1024 for size in wide.values()), "sm_80's 163 KB, not sm_86's 99"


@pytest.mark.parametrize("why, args", [
    ("sm_75: no TF32 mma.sync, no cp.async", ("nn", 8192, 8192, 8192, 75, BASE, OTHER, C_PTR)),
    ("K % 4 (nn): a's rows not whole 16-byte vectors", ("nn", 1000, 512, 100 + 2, 90, BASE, OTHER, C_PTR)),
    ("N % 4 (nn): b's rows", ("nn", 1000, 10, 256, 90, BASE, OTHER, C_PTR)),
    ("K % 4 (nt): both operands' rows", ("nt", 1000, 512, 255, 90, BASE, OTHER, C_PTR)),
    ("M % 4 (tn): a's rows", ("tn", 33, 256, 256, 90, BASE, OTHER, C_PTR)),
    ("N % 4 (tn): b's rows", ("tn", 256, 10, 256, 90, BASE, OTHER, C_PTR)),
    ("a off 16 bytes", ("nn", 1000, 512, 256, 90, BASE + 4, OTHER, C_PTR)),
    ("b off 16 bytes", ("nn", 1000, 512, 256, 90, BASE, OTHER + 8, C_PTR)),
    ("c off 16 bytes", ("nn", 1000, 512, 256, 90, BASE, OTHER, C_PTR + 4)),
    ("empty output", ("nn", 0, 512, 256, 90, BASE, OTHER, C_PTR)),
    ("K == 0: nothing to multiply (the exact kernel writes the epilogue of 0)", ("nn", 8, 8, 0, 90, BASE, OTHER,
                                                                                  C_PTR)),
])
def test_everything_else_is_left_to_the_exact_kernels(why, args):
    assert tf.plan(*args) is None, why


def test_odd_matmul_shapes_of_issue_4_run_exact():
    # matmul is nn: K (a's rows) and N (b's rows) must be multiples of 4.
    for m, k, n in [(1, 100, 10), (33, 100, 10), (1000, 100, 10)]:
        assert tf.plan("nn", m, n, k, 90, BASE, OTHER, C_PTR) is None, "N = 10"
    assert tf.plan("nn", 33, 12, 100, 90, BASE, OTHER, C_PTR)[0] == "gemm_tf32_nn_f32", "M is free, K = 100 is 4k"


def test_skinny_outputs_split_k_like_the_half_type_tensor_core_gemm():
    name, grid, _, _, splits = tf.plan("nn", 32, 768, 3072, 90, BASE, OTHER, C_PTR, sms=132)
    assert name == "gemm_tf32_nn_f32" and splits == 3072 // tf.SPLIT_CHUNK == 12 and grid == (6, 1, 12)
    assert splits == mm.mma_split_count(6, 3072, 132), "same policy as gemm_mma"
    assert tf.plan("tn", 3072, 768, 8192, 90, BASE, OTHER, C_PTR, sms=132)[4] == 6
    assert tf.plan("nn", 32, 768, 1000, 90, BASE, OTHER, C_PTR, sms=132)[4] == 1, "short K: no split"
    assert tf.split_count(1, 1 << 20, 132) == tf.MAX_SPLITS
    assert tf.plan("nn", 8192, 8192, 1 << 16, 90, BASE, OTHER, C_PTR)[4] == 1, "enough tiles"


def test_plan_refuses_an_unknown_layout_and_outputs_past_one_grid():
    with pytest.raises(ValueError, match="layout must be one of"):
        tf.plan("tt", 8, 8, 8, 90, BASE, OTHER, C_PTR)
    assert tf.plan("nn", 128 * 65535 + 4, 8, 8, 90, BASE, OTHER, C_PTR) is None, "the exact kernel refuses it"


def test_matmul_tf32_must_be_a_bool_naming_the_argument():
    with pytest.raises(TypeError, match=r"^tf32 must be a bool, got str"):
        rawops.matmul(f32((4, 8)), f32((8, 4), ptr=OTHER), tf32="yes")


def test_adapter_tf32_must_be_a_bool():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    with pytest.raises(TypeError, match=r"^tf32 must be a bool, got int"):
        ta.matmul(torch.ones(4, 8), torch.ones(8, 4), tf32=1)


# ------------------------------------------------------------------------------ the source and the build
def _source():
    from rawops import _modules

    with open(os.path.join(_modules.kernel_source_dir(), "gemm_tf32.cu")) as f:
        return f.read()


def test_planner_constants_match_the_kernel():
    # The kernel reads its shapes from rawops/_constants.py, as the planner does.
    from rawops import _constants

    source = _source()
    macro = dict(re.findall(r"\b(k\w+) = RAWOPS_(\w+)\b", source))
    planner = {"kTf32Tile": tf.TILE, "kTf32K": tf.TILE_K, "kTf32Stages": tf.STAGES, "kTf32Threads": tf.THREADS,
               "kTf32WideN": tf.WIDE_N, "kTf32WideStages": tf.WIDE_STAGES, "kTf32MnMajorPad": tf.MNMAJOR_PAD,
               "kTransposeTile": tf.TRANSPOSE_TILE, "kTransposeThreads": tf.TRANSPOSE_THREADS}
    assert {name: getattr(_constants, macro[name]) for name in planner} == planner
    assert "kTf32KMajorStride = kTf32K + RAWOPS_GEMM_TF32_KMAJOR_PAD;" in source
    assert tf.KMAJOR_STRIDE == tf.TILE_K + _constants.GEMM_TF32_KMAJOR_PAD
    assert "KM ? kTf32KMajorStride : ROWS + kTf32MnMajorPad;" in source
    assert "gemm_tf32<A_KM, B_KM, rawops::kTf32WideN, rawops::kTf32WideStages>" in source, "the wide kernel's tile"
    assert "gemm_tf32<A_KM, B_KM, rawops::kTf32Tile, rawops::kTf32Stages>" in source


def test_entry_points_take_the_matrix_family_arguments():
    source = _source()
    # the matrix family's parameters (RAWOPS_GEMM_ARGS, tests/test_gemm.py checks them against mm.ARGS)
    assert re.findall(r"gemm_tf32_(?:wide_)?##layout##_f32\((\w+\(\w+\))\)", source) == ["RAWOPS_GEMM_ARGS(float)"] * 2
    assert mm.KINDS == tf.KINDS
    layouts = re.findall(r"^RAWOPS_TF32\((\w+),", source, re.M)
    assert (f'extern "C" __global__ void __launch_bounds__(kTransposeThreads)\n    {tf.TRANSPOSE_KERNEL}('
            in source)
    for name in tf.SPLIT_KERNELS:  # the 3xTF32 operands' splits (tests/test_gemm_3xtf32.py)
        assert re.search(rf'extern "C" __global__ void __launch_bounds__\(\w+\)\n    {name}\(const float\* in, '
                         r"float\* out, long long rows, long long k, long long kp,\s+int\* row_flags, int\* any\)",
                         source), name
    assert f"void __launch_bounds__(256) {tf.FILL_KERNEL}(unsigned* p, long long count)" in source
    assert re.search(rf"{tf.FIXUP_KERNEL}\(const float\* a, const float\* b, float\* c, const float\* bias, "
                     r"float\* pre, long long m,\s+long long n, long long k, long long flags, long long layout, "
                     r"const int\* flags_a,\s+const int\* flags_b, const int\* any\)", source)
    assert sorted([f"gemm_tf32_{kind}{layout}_f32" for kind in ("", "wide_") for layout in layouts]
                  + [tf.TRANSPOSE_KERNEL, *tf.SPLIT_KERNELS, tf.FILL_KERNEL, tf.FIXUP_KERNEL]) == tf.entry_points()
    from rawops import _gemm_reduce

    assert _gemm_reduce.FAMILY == mm.FAMILY and _gemm_reduce.KINDS == mm.KINDS
    assert {_gemm_reduce.kernel_name(d) for d in range(3)} <= set(mm.entry_points()), \
        "split K reuses matmul's reduction"


@needs_cuobjdump
def test_fatbin_has_every_entry_point_on_every_architecture():
    from rawops import _modules

    path = _modules.fatbin_path(tf.FAMILY)
    if not os.path.exists(path):
        pytest.skip(f"{path} absent (built without nvcc, or RAWOPS_FAMILIES left it out)")
    per_arch = elf_entry_symbols(path)
    assert sorted(per_arch) == expected_elf_archs()
    for arch, names in sorted(per_arch.items()):
        assert sorted(names) == tf.entry_points(), arch


# ------------------------------------------------------------------------------ on the GPU
# (M, K, N). Taken by the TF32 kernel in every layout: partial block tiles, a K tile cut short
# (K % 16 != 0), split K (32 x 3072 -> 768, 8 x 4096 -> 8), one block. Left to the exact
# kernel: the odd sizes of issue 4.
TF32_SHAPES = [(128, 128, 128), (1000, 256, 520), (300, 2048, 264), (257, 252, 132), (132, 36, 1028),
               (32, 3072, 768), (8, 4096, 8), (4, 4, 4), (1000, 100, 12)]
EXACT_SHAPES = [(1, 100, 10), (33, 100, 10), (1000, 100, 10), (257, 255, 129)]


def _operands(torch, layout, m, k, n):
    """(a, b as stored for `layout`, float64 reference of A B)."""
    from gpu_reference import random

    a = random((m, k) if layout[0] == "n" else (k, m), torch.float32, 1.0)
    b = random((k, n) if layout[1] == "n" else (n, k), torch.float32, 1.0)
    a64 = a.double() if layout[0] == "n" else a.double().t()
    b64 = b.double() if layout[1] == "n" else b.double().t()
    return a, b, a64 @ b64


def _run(layout, a, b, m, n, k, bias=None, aux=None, pre=None, flags=0):
    """C through the TF32 launcher, the exact kernel where it refuses: (c as a tensor, taken)."""
    import cupy
    import torch
    from gpu_reference import poison_pool, to_torch

    poison_pool(m * n * 4)
    c = cupy.empty((m, n), dtype=cupy.float32)
    ptr = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731
    args = (a.data_ptr(), b.data_ptr(), c.data.ptr, ptr(bias), ptr(aux), ptr(pre), m, n, k, flags)
    stream, device = cupy.cuda.get_current_stream().ptr, torch.cuda.current_device()
    torch.cuda.synchronize()
    taken, _ = tf.launch_gemm(device, layout, *args, stream, mm._cupy_workspace)
    if not taken:
        mm.launch_gemm(device, layout, 0, *args, stream, mm._cupy_workspace)
    cupy.cuda.get_current_stream().synchronize()
    return to_torch(c), taken


def _relative_error(torch, out, ref):
    assert not torch.isnan(out).any(), "NaN in output (an element left unwritten?)"
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.fixture(params=["narrow", "wide", "hopper"])
def kernel(request, monkeypatch):
    """Every shape through gemm_tf32 (config.tf32_wide off), then through gemm_tf32_wide wherever it runs,
    then through the Hopper GEMM wherever it runs (sm_90: nt, and nn through b^T), its tile
    threshold lowered so that small and odd shapes reach it too (on its narrow tiles and K
    splits, as rawops._gemm_sm90.narrow_shape picks them)."""
    monkeypatch.setattr(rawops.config, "tf32_wide", request.param == "wide")
    monkeypatch.setattr(tf, "WIDE_LAYOUTS", tf.LAYOUTS)
    monkeypatch.setattr(tf, "WIDE_MIN_TILES_PER_SM", 0)
    monkeypatch.setattr(rawops.config, "tf32_sm90", request.param == "hopper")
    monkeypatch.setattr(tf, "_plans", {})
    return request.param


def _hopper_runs(torch, layout, m, n, k, a, c_ptr=0):
    from rawops import _gemm_sm90

    cc = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    return tf.hopper_plan(layout, m, n, k, cc, a.data_ptr(), 0, c_ptr, built=_gemm_sm90.built(0)) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
@pytest.mark.parametrize("m, k, n", TF32_SHAPES + EXACT_SHAPES + [(2048, 256, 4096)])
def test_tf32_gemm_matches_float64_within_tf32_and_is_really_tf32(kernel, layout, m, k, n):
    torch = pytest.importorskip("torch")
    a, b, ref = _operands(torch, layout, m, k, n)
    c, taken = _run(layout, a, b, m, n, k)
    cc = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    planned = tf.plan(layout, m, n, k, cc, a.data_ptr(), b.data_ptr(), 0)
    hopper = kernel == "hopper" and _hopper_runs(torch, layout, m, n, k, a)
    # The Hopper GEMM takes shapes mma.sync cannot: tn copies a, so M need not be a multiple of 4.
    expected = planned is not None or hopper
    if planned is not None and kernel != "hopper":
        assert ("_wide_" in planned[0]) == (kernel == "wide" and cc in tf.WIDE_CCS)
    assert taken == expected, f"{layout} {m}x{k}x{n}: routed {'to' if taken else 'away from'} TF32"
    if kernel == "hopper":
        ran = any(p is not None and p[0] == "hopper" for p in tf._plans.values())
        assert ran == hopper, f"{layout} {m}x{k}x{n}: the Hopper GEMM's routing"
    error = _relative_error(torch, c, ref)
    what = f"{layout} {m}x{k}x{n} ({'tf32' if taken else 'exact'}): relative error {error:.3g}"
    if taken:
        assert error < TF32_TOLERANCE, what
        if k >= 32:  # 10-bit operands: ~2e-4 on random data, 100x exact float32's error
            assert error > 2e-5, f"{what}: as exact as float32, so TF32 did not run"
    else:
        assert error < EXACT_TOLERANCE, what


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_tf32_operands_are_rounded_to_nearest_not_truncated(kernel, layout):
    """a = 1 + 3 x 2^-12 has bits below TF32's 10-bit mantissa, more than half its last place:
    rounded to nearest it is 1 + 2^-10, truncated 1. With b = 1, c = K a exactly in float32
    accumulation: K (1 + 2^-10) from every TF32 path, K if a path drops the bits instead (a
    systematic -2^-11 per operand, ~1e-3 relative on random data: TF32's whole tolerance)."""
    torch = pytest.importorskip("torch")
    m, k, n = 256, 64, 256
    value = 1 + 3 * 2.0 ** -12
    a = torch.full((m, k) if layout[0] == "n" else (k, m), value, device="cuda")
    b = torch.ones((k, n) if layout[1] == "n" else (n, k), device="cuda")
    c, taken = _run(layout, a, b, m, n, k)
    assert taken
    expected = torch.full((m, n), k * (1 + 2.0 ** -10), device="cuda")
    assert torch.equal(c, expected), f"{layout}: c {c.flatten()[0].item()!r}, expected {expected[0, 0].item()!r}"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
@pytest.mark.parametrize("flags", [mm.EPI_BIAS, mm.EPI_BIAS_GELU, mm.EPI_BIAS_GELU | mm.EPI_ERF,
                                   mm.EPI_BIAS_GELU_GRAD])
@pytest.mark.parametrize("m, k, n", [(1000, 256, 520), (32, 3072, 768)])
def test_tf32_gemm_epilogues_match_the_matrix_family(kernel, layout, flags, m, k, n):
    torch = pytest.importorskip("torch")
    from gpu_reference import random

    a, b, ref = _operands(torch, layout, m, k, n)
    bias = random((n,), torch.float32, 1.0)
    aux = random((m, n), torch.float32, 1.0)
    pre = torch.full((m, n), float("nan"), device="cuda") if flags & 3 == mm.EPI_BIAS_GELU else None
    c, taken = _run(layout, a, b, m, n, k, bias, aux if flags & 3 == mm.EPI_BIAS_GELU_GRAD else None, pre, flags)
    assert taken
    v = ref + bias.double()
    approximate = "none" if flags & mm.EPI_ERF else "tanh"
    if flags & 3 == mm.EPI_BIAS:
        expected = v
    elif flags & 3 == mm.EPI_BIAS_GELU:
        # The pre-activation against float64 at TF32's tolerance, the output against GELU of
        # that very pre-activation at float32's: GELU shrinks the negative half, so the TF32
        # error of gelu(v) relative to its smaller norm drew up to 2.0e-3 (flaky at 2x).
        assert _relative_error(torch, pre, v) < TF32_TOLERANCE, "pre-activation"
        expected = torch.nn.functional.gelu(pre.double(), approximate=approximate)
        assert _relative_error(torch, c, expected) < EXACT_TOLERANCE, f"{layout} flags {flags}: gelu(pre)"
        return
    else:
        # dy * gelu'(v): against float64 the TF32 error of v, through gelu'' and relative to this
        # smaller norm, reaches 2.1e-3 (flaky at 2x TF32's tolerance). So v is taken as the
        # kernel sums it (the same main loop under the bias epilogue), held to TF32's tolerance,
        # and the gradient epilogue is checked on it at float32's.
        # The gradient epilogue never runs on the Hopper GEMM (_gemm_sm90.plan refuses it): v from
        # the kernel that does run it.
        hopper, rawops.config.tf32_sm90 = rawops.config.tf32_sm90, False
        tf._plans.clear()
        try:
            v_kernel, taken = _run(layout, a, b, m, n, k, bias, None, None, mm.EPI_BIAS)
        finally:
            rawops.config.tf32_sm90 = hopper
            tf._plans.clear()
        assert taken
        assert _relative_error(torch, v_kernel, v) < TF32_TOLERANCE, "pre-activation"
        x = v_kernel.double().requires_grad_()
        torch.nn.functional.gelu(x, approximate=approximate).backward(aux.double())
        assert _relative_error(torch, c, x.grad) < EXACT_TOLERANCE, f"{layout} flags {flags}: gelu'(pre) * dy"
        return
    assert _relative_error(torch, c, expected) < TF32_TOLERANCE, f"{layout} flags {flags}"


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(1, 100, 10), (33, 100, 10), (1000, 100, 10), (1000, 100, 12), (33, 64, 40),
                                     (300, 2048, 264), (0, 5, 8), (5, 0, 8), (5, 8, 0)])
def test_matmul_tf32_matches_float64_on_odd_aligned_and_empty_shapes(m, k, n):
    torch = pytest.importorskip("torch")
    from gpu_reference import poison_pool, random, to_cupy, to_torch

    a, b = random((m, k), torch.float32, 1.0), random((k, n), torch.float32, 1.0)
    poison_pool(m * n * 4)
    c = to_torch(rawops.matmul(to_cupy(a), to_cupy(b), tf32=True))
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert c.shape == (m, n)
    if m * n == 0:
        return
    if k == 0:
        assert (c == 0).all()
        return
    error = _relative_error(torch, c, ref)
    assert error < TF32_TOLERANCE, f"{m}x{k}x{n}: {error:.3g}"
    exact = to_torch(rawops.matmul(to_cupy(a), to_cupy(b)))
    torch.cuda.synchronize()
    if tf.plan("nn", m, n, k, 90, a.data_ptr(), b.data_ptr(), c.data_ptr()) is None:
        assert torch.equal(c, exact), "the exact kernel serves what TF32 cannot take"
    elif k >= 64:
        assert not torch.equal(c, exact) and error > 2e-5, "TF32 ran"


@pytest.mark.gpu
def test_matmul_tf32_writes_out_only_and_every_element_of_it():
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy

    m, k, n = 300, 512, 264
    a, b = random((m, k), torch.float32), random((k, n), torch.float32)
    buffer = torch.full((m * n + 64,), float("nan"), device="cuda")
    out = buffer[: m * n].view(m, n)
    result = rawops.matmul(to_cupy(a), to_cupy(b), tf32=True, out=to_cupy(out))
    torch.cuda.synchronize()
    assert result.data.ptr == out.data_ptr()
    ref = a.double() @ b.double()
    assert _relative_error(torch, out, ref) < TF32_TOLERANCE
    assert torch.isnan(buffer[m * n:]).all(), "wrote past out"


@pytest.mark.gpu
def test_matmul_tf32_propagates_nan_and_inf_inputs():
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy, to_torch

    a, b = random((256, 128), torch.float32, 1.0), random((128, 256), torch.float32, 1.0)
    a[3, 7] = float("nan")
    b[5, 9] = float("inf")
    c = to_torch(rawops.matmul(to_cupy(a), to_cupy(b), tf32=True))
    torch.cuda.synchronize()
    assert torch.isnan(c[3]).all(), "a NaN in row 3 of a poisons row 3 of c"
    assert not torch.isfinite(c[:, 9]).any(), "an inf in column 9 of b reaches every row"
    rest = torch.ones_like(c, dtype=torch.bool)
    rest[3] = False
    rest[:, 9] = False
    assert torch.isfinite(c[rest]).all()


@pytest.mark.gpu
def test_matmul_tf32_on_a_given_stream_with_split_k_scratch():
    torch = pytest.importorskip("torch")
    import cupy
    from gpu_reference import random, to_cupy, to_torch, written_late

    a, b = random((32, 4096), torch.float32, 1.0), random((4096, 520), torch.float32, 1.0)
    stream = cupy.cuda.Stream(non_blocking=True)
    late = written_late(a, stream)  # NaN unless the launch waits behind `stream`'s work
    c = rawops.matmul(to_cupy(late), to_cupy(b), tf32=True, stream=stream)
    stream.synchronize()
    assert _relative_error(torch, to_torch(c), a.double() @ b.double()) < TF32_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(200, 136, 72), (33, 100, 10)])
def test_adapter_matmul_tf32_forward_and_backward(m, k, n):
    torch = pytest.importorskip("torch")
    from gpu_reference import random
    from rawops import torch_adapter as ta

    a = random((m, k), torch.float32, 1.0).requires_grad_()
    b = random((k, n), torch.float32, 1.0).requires_grad_()
    dy = random((m, n), torch.float32, 1.0)
    c = ta.matmul(a, b, tf32=True)
    c.backward(dy)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (a64 @ b64).backward(dy.double())
    aligned = k % 4 == 0 and n % 4 == 0
    for what, out, ref in (("c", c.detach(), (a64 @ b64).detach()), ("da", a.grad, a64.grad), ("db", b.grad, b64.grad)):
        error = _relative_error(torch, out, ref)
        assert error < TF32_TOLERANCE, f"{what}: {error:.3g}"
        if aligned:
            assert error > 2e-5, f"{what}: exact-level error {error:.3g}: TF32 did not run"
    with torch.no_grad():
        c2 = ta.matmul(a, b, tf32=True)
    assert _relative_error(torch, c2, (a64 @ b64).detach()) < TF32_TOLERANCE


@pytest.mark.gpu
def test_adapter_matmul_tf32_compiles_with_fullgraph_and_keeps_tf32_in_the_backward():
    torch = pytest.importorskip("torch")
    from gpu_reference import random
    from rawops import torch_adapter as ta

    a = random((256, 128), torch.float32, 1.0).requires_grad_()
    b = random((128, 96), torch.float32, 1.0).requires_grad_()
    dy = random((256, 96), torch.float32, 1.0)
    compiled = torch.compile(lambda x, y: ta.matmul(x, y, tf32=True), fullgraph=True)
    c = compiled(a, b)
    c.backward(dy)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (a64 @ b64).backward(dy.double())
    for what, out, ref in (("c", c.detach(), (a64 @ b64).detach()), ("da", a.grad, a64.grad), ("db", b.grad, b64.grad)):
        error = _relative_error(torch, out, ref)
        assert 2e-5 < error < TF32_TOLERANCE, f"compiled {what}: {error:.3g} (TF32 expected)"
