"""The Hopper GEMM (kernels/gemm_sm90.cu, rawops/_gemm_sm90.py): WGMMA + TMA on sm_90.

Without a GPU: when the plan takes it, its launch shape (tile width, K splits), the kernel
table against the source and the fatbin (one sm_90a ELF with every entry point), the arch
directive of the build. With an sm_90 GPU (marker `gpu`): every layout and epilogue against
torch in float64 on every tile width, with and without K splits, forced onto small and odd
shapes too; and the planner's own choices on the medium-batch shapes it was fitted on.
"""
import os
import re

import pytest

import rawops
from rawops import _gemm_sm90 as hopper
from rawops import _launch, _modules, _nvcc
from test_build import elf_entry_symbols, list_elf_archs, list_ptx_archs, needs_cuobjdump
from test_validation import BASE, OTHER

import rawops.gemm as mm  # noqa: E402
F32, F16, BF16 = 0, 1, 2
SMS = 132


# ------------------------------------------------------------------------------ plan (pure)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_large_half_gemms_on_sm90_take_the_hopper_kernel_persistently(layout):
    name, grid, shared, bn, splits = hopper.plan(layout, BF16, 8192, 8192, 8192, 90, BASE, OTHER, SMS)
    assert name == f"gemm_sm90_{layout}_bf16" and (bn, splits) == (256, 1) and hopper.THREADS == 384
    assert grid == (SMS,), "one persistent block per SM: 64 x 32 tiles of 128 x 256"
    # 4 stages of 48 KB, two 16 KB output buffers, the bias (1 KB), the barriers (64 bytes),
    # rounded up to 1 KB, and 1 KB to align the base: every byte of the 227 KB a block may have.
    assert shared == 4 * (128 + 256) * 64 * 2 + 2 * 128 * 64 * 2 + 1024 + 1024 + 1024 == 227 * 1024
    assert hopper.plan(layout, F16, 8192, 3072, 768, 90, BASE, OTHER, SMS)[0] == f"gemm_sm90_{layout}_f16"


# (m, n, k) of an output -> the fastest unsplit width of dev/time_gemm_layouts.py --sweep at bench_model's
# and bench_gemm's Linear shapes, forward, dgrad and wgrad (H100, 8a41b57: us at 256 / 128 / 64 wide).
SWEPT_WIDTHS = {
    (8192, 4096, 1024): 256,  # 112.9 / 122.1 / 165.4   1024 -> 4096 fwd, 4096 -> 1024 dgrad (116.9 / 123.9)
    (8192, 1024, 4096): 256,  # 108.3 / 110.1 / 166.2   1024 -> 4096 dgrad, 4096 -> 1024 fwd (109.6 / 115.8)
    (4096, 1024, 8192): 256,  # 101.5 / 110.3 / 154.5   1024 -> 4096 wgrad
    (1024, 4096, 8192): 256,  # 102.6 / 110.0 / 126.6   4096 -> 1024 wgrad
    (8192, 3072, 768): 256,  # 69.8 / 73.8 / 97.0      768 -> 3072 fwd, 3072 -> 768 dgrad (70.3 / 74.5)
    (8192, 768, 3072): 128,  # 73.4 / 67.5 / 93.9      768 -> 3072 dgrad, 3072 -> 768 fwd (73.9 / 66.0)
    (3072, 768, 8192): 256,  # 81.9 / 96.1 / 115.5     768 -> 3072 wgrad
    (768, 3072, 8192): 256,  # 83.6 / 87.3 / 86.7      3072 -> 768 wgrad
}


@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_outputs_of_enough_tiles_take_the_faster_of_256_and_128_wide(layout):
    """The planner's width against what the sweep measured fastest: a 768-wide output of 64 x 3 tiles of
    256 (192 units on 132 SMs, two waves) runs faster as 64 x 6 of 128; everything else keeps 256, as
    does a shape the model puts 128 ahead of by less than WIDE_MARGIN."""
    for (m, n, k), width in SWEPT_WIDTHS.items():
        name, grid, shared, bn, splits = hopper.plan(layout, BF16, m, n, k, 90, BASE, OTHER, SMS)
        assert (bn, splits) == (width, 1), (m, n, k)
        assert name == hopper.entry_name(layout, BF16, bn) and shared == hopper.shared_bytes(bn)
        assert grid == (min(-(-m // 128) * -(-n // bn), SMS),)
        with rawops.config.override(gemm_sm90_narrow=False):  # the switch keeps every such output 256 wide
            assert hopper.plan(layout, BF16, m, n, k, 90, BASE, OTHER, SMS)[3:] == (256, 1)
    # a modelled gain under the margin keeps 256 (5.3 waves of 256-wide tiles: 2.8% by the model)
    m, n, k = 4096, 5632, 4096
    gain = 1 - hopper.estimate_us(m, n, k, BF16, 128, 1, SMS) / hopper.estimate_us(m, n, k, BF16, 256, 1, SMS)
    assert 0 < gain < 1 - hopper.WIDE_MARGIN and hopper.plan(layout, BF16, m, n, k, 90, BASE, OTHER, SMS)[3] == 256


def test_the_grid_is_the_work_unit_count_when_units_are_fewer_than_sms():
    # 8192 x 3072 -> 64 x 12 tiles (linear_gelu's forward); 128 x 3072 -> 48 tiles 64 wide.
    assert hopper.plan("nt", BF16, 8192, 3072, 768, 90, BASE, OTHER, SMS)[1] == (SMS,)
    name, grid, shared, bn, splits = hopper.plan("nt", BF16, 128, 3072, 768, 90, BASE, OTHER, SMS)
    assert (name, grid, shared, bn, splits) == ("gemm_sm90_nt_bf16_n64", (48,), hopper.shared_bytes(64), 64, 1)
    name, grid, shared, bn, splits = hopper.plan("nn", BF16, 32, 768, 3072, 90, BASE, OTHER, SMS)
    assert splits > 1 and grid == (-(-768 // bn) * splits,), "a 32 x 768 output over K = 3072: split K"


def test_medium_outputs_take_the_modelled_fastest_narrow_tile():
    """The model's picks on the shapes it was fitted to (docs/performance.md, GEMM): 64-wide unsplit
    tiles from 64 to 256 rows at 768 -> 3072 (5.4-6.3 us against 7.7 at 128 wide and 12.3 at
    256), 128 wide at 512 rows, the widest at 1024, and a K split for a 32-row dx over K = 3072."""
    picks = {(64, 3072, 768): (64, 1), (128, 3072, 768): (64, 1), (256, 3072, 768): (64, 1),
             (512, 3072, 768): (128, 1), (1024, 3072, 768): (256, 1), (512, 4096, 4096): (128, 1)}
    for (m, n, k), expected in picks.items():
        assert hopper.narrow_shape(m, n, k, BF16, SMS) == expected, (m, n, k)
    bn, splits = hopper.narrow_shape(32, 768, 3072, BF16, SMS)
    assert splits >= 4
    assert hopper.estimate_us(128, 3072, 768, BF16, 64, 2, SMS) > hopper.estimate_us(128, 3072, 768, BF16, 64, 1, SMS)
    assert hopper.estimate_us(256, 3072, 768, F32, 64, 1, SMS) > hopper.estimate_us(256, 3072, 768, BF16, 64, 1, SMS), \
        "TF32 runs at half the 16-bit rate"


@pytest.mark.parametrize("m, n, k, dtype", [(32, 768, 3072, BF16), (1, 8, 64, F16), (100, 1000, 65536, BF16),
                                            (300, 520, 1000, F32), (1000, 4096, 136, BF16)])
def test_splits_leave_no_split_empty_fill_one_wave_and_never_split_the_widest_tile(m, n, k, dtype):
    for bn in hopper.TILE_WIDTHS:
        for wanted in (1, 2, 3, 5, 7, 16, 1000):
            rawops.config.gemm_sm90_shape = (bn, wanted)
            try:
                _, grid, shared, got_bn, splits = hopper.plan("nt", dtype, m, n, k, 90, BASE, OTHER, SMS)
            finally:
                rawops.config.gemm_sm90_shape = None
            k_tiles = -(-k // hopper.tile_k(dtype))
            per_split = -(-k_tiles // splits)
            assert got_bn == bn and shared == hopper.shared_bytes(bn)
            assert splits == 1 if bn == 256 else 1 <= splits <= min(wanted, k_tiles)
            assert (splits - 1) * per_split < k_tiles, "the last split has a K stage"
            assert grid == (min(-(-m // 128) * -(-n // bn) * splits, SMS),)
    bn, splits = hopper.narrow_shape(m, n, k, dtype, SMS)
    k_tiles = -(-k // hopper.tile_k(dtype))
    assert (splits - 1) * -(-k_tiles // splits) < k_tiles
    assert splits == 1 or -(-m // 128) * -(-n // bn) * splits <= SMS


def test_shared_memory_of_every_tile_width_fits_a_block():
    for bn, stages in hopper.STAGES_OF.items():
        assert hopper.shared_bytes(bn) <= 232448
        assert hopper.shared_bytes(bn) >= stages * (128 + bn) * 128 + 2 * 128 * 128 + bn * 4 + 1024
    assert hopper.shared_bytes(256) == hopper.SHARED_BYTES == 227 * 1024


def test_float32_means_tf32_and_takes_the_nt_layout_alone():
    """dtype 0 here is TF32 (only rawops/_gemm_tf32.py asks): WGMMA reads TF32 operands K-major."""
    assert hopper.plan("nt", F32, 8192, 8192, 8192, 90, BASE, OTHER, SMS)[0] == "gemm_sm90_nt_tf32"
    assert hopper.plan("nt", F32, 8192, 8192, 8188, 90, BASE, OTHER, SMS)[0] == "gemm_sm90_nt_tf32", "16-byte rows"
    assert hopper.plan("nt", F32, 8192, 8192, 8190, 90, BASE, OTHER, SMS) is None, "K % 4: rows off 16 bytes"
    assert hopper.plan("nt", F32, 8192, 8190, 8192, 90, BASE, OTHER, SMS) is None, "N % 4: c's rows"
    assert hopper.tile_k(F32) == 32 and hopper.tile_k(BF16) == 64, "a stage is 128 bytes of K"
    assert hopper.operand_maps("nt", 1000, 520, 256, F32) == ((256, 1000, 32, 128), (256, 520, 32, 256))


@pytest.mark.parametrize("why, args", [
    ("float32 (TF32) in nn: WGMMA reads TF32 K-major only", ("nn", F32, 8192, 8192, 8192, 90, BASE, OTHER, SMS)),
    ("float32 (TF32) in tn", ("tn", F32, 8192, 8192, 8192, 90, BASE, OTHER, SMS)),
    ("sm_80 has no WGMMA", ("nn", BF16, 8192, 8192, 8192, 80, BASE, OTHER, SMS)),
    ("sm_100 runs other tensor-core instructions", ("nn", BF16, 8192, 8192, 8192, 100, BASE, OTHER, SMS)),
    ("K % 8: a's rows are not 16-byte multiples", ("nn", BF16, 8192, 8192, 8188, 90, BASE, OTHER, SMS)),
    ("N % 8 in nn: b's rows", ("nn", BF16, 8192, 8190, 8192, 90, BASE, OTHER, SMS)),
    ("M % 8 in tn: a's rows", ("tn", BF16, 8190, 8192, 8192, 90, BASE, OTHER, SMS)),
    ("a off 16 bytes", ("nt", BF16, 8192, 8192, 8192, 90, BASE + 2, OTHER, SMS)),
    ("b off 16 bytes", ("nt", BF16, 8192, 8192, 8192, 90, BASE, OTHER + 8, SMS)),
    ("N % 8: c's rows are not 16-byte multiples for the TMA store", ("nt", BF16, 8192, 8190, 8192, 90, BASE, OTHER,
                                                                       SMS)),
    ("k == 0: nothing for the copy engine", ("nn", BF16, 8192, 8192, 0, 90, BASE, OTHER, SMS)),
    ("empty output", ("nn", BF16, 0, 8192, 64, 90, BASE, OTHER, SMS)),
])
def test_everything_else_stays_on_the_portable_kernels(why, args):
    assert hopper.plan(*args) is None, why


def test_outputs_off_16_bytes_stay_on_the_portable_kernels():
    args = ("nt", BF16, 8192, 3072, 768, 90, BASE, OTHER, SMS)
    assert hopper.plan(*args, c_ptr=BASE * 3) is not None
    assert hopper.plan(*args, c_ptr=BASE * 3 + 2) is None
    assert hopper.plan(*args, flags=mm.EPI_BIAS_GELU, c_ptr=BASE * 3, pre_ptr=BASE * 4 + 8) is None


def test_not_built_means_not_planned():
    assert hopper.plan("nn", BF16, 8192, 8192, 8192, 90, BASE, OTHER, SMS, built=False) is None


def test_the_gelu_gradient_epilogue_stays_on_the_portable_kernels():
    assert hopper.EPI_BIAS_GELU_GRAD == mm.EPI_BIAS_GELU_GRAD
    assert hopper.plan("nt", BF16, 8192, 3072, 768, 90, BASE, OTHER, SMS, flags=mm.EPI_BIAS_GELU_GRAD) is None
    for flags in (mm.EPI_NONE, mm.EPI_BIAS, mm.EPI_BIAS_GELU, mm.EPI_BIAS_GELU | mm.EPI_ERF):
        assert hopper.plan("nt", BF16, 8192, 3072, 768, 90, BASE, OTHER, SMS, flags=flags) is not None


def test_operand_maps_read_k_major_tiles_in_one_box_and_mn_major_in_64_wide_slabs():
    a, b = hopper.operand_maps("nt", 1000, 520, 256)
    assert a == (256, 1000, 64, 128) and b == (256, 520, 64, 256)
    a, b = hopper.operand_maps("nn", 1000, 520, 256)
    assert b == (520, 256, 64, 64)
    a, b = hopper.operand_maps("tn", 1000, 520, 256)
    assert a == (1000, 256, 64, 64) and b == (520, 256, 64, 64)
    assert hopper.operand_maps("nt", 1000, 520, 256, BF16, 64)[1] == (256, 520, 64, 64), "B's box: the tile width"
    assert hopper.operand_maps("nn", 1000, 520, 256, BF16, 64)[1] == (520, 256, 64, 64)
    # a K-major A's last tile-row box: the rows left, rounded up to 8 (the kernel's tail_rows)
    assert [hopper.a_tail_rows(m) for m in (1, 33, 128, 129, 192, 1000, 1024)] == [8, 40, 128, 8, 64, 104, 128]
    source = _source()
    assert "A_KM ? int((M - int64_t(tiles_m - 1) * kBM + 7) / 8 * 8) : kBM" in source
    assert "(tail_rows + kBN) * kBK" in source


# ------------------------------------------------------------------------------ source, build
def _source():
    with open(os.path.join(_modules.kernel_source_dir(), "gemm_sm90.cu")) as f:
        return f.read()


def test_python_constants_match_the_kernel():
    # The kernel reads its shapes from rawops/_constants.py, as the planner does.
    from rawops import _constants

    source = _source()
    constants = dict(re.findall(r"\b(k\w+) = (\d+)", source))
    assert int(constants["kConsumers"]) == hopper.THREADS - 128
    macro = dict(re.findall(r"\b(k\w+) = RAWOPS_(\w+)\b", source))
    planner = {"kBM": hopper.TILE_M, "kSpanBytes": hopper.SPAN, "kThreads": hopper.THREADS, "kBox": hopper.BOX,
               "kFlagPre": hopper.FLAG_PRE}
    assert {name: getattr(_constants, macro[name]) for name in planner} == planner
    stages = re.search(r"kStagesOf = BN == 256 +\? RAWOPS_(\w+)\s+: BN == 128 \? RAWOPS_(\w+)\s+: RAWOPS_(\w+);",
                       source).groups()
    assert dict(zip((256, 128, 64), (getattr(_constants, name) for name in stages))) == hopper.STAGES_OF
    assert "if (BN == 256) splits = 1;" in source and hopper.TILE_N == 256, "the widest tile never splits"
    assert "kBKOf = kSpanBytes / int(sizeof(E))" in source


def test_entry_points_take_two_tensor_maps_then_the_matmul_arguments():
    source = _source()
    params = re.search(r"kThreads, 1\) name\((.*?)\)\s*\{", source, re.S).group(1)
    params = [p.strip() for p in params.replace("\\", " ").split(",")]
    kinds = "".join("b" if "CUtensorMap" in p else "p" if "*" in p else "q" for p in params)
    assert kinds == hopper.KINDS
    assert [p.split()[-1].lstrip("*") for p in params] == ["map_a", "map_b", "map_c", "map_pre", "map_a_tail", "bias",
                                                           "m", "n", "k", "flags", "partial", "splits"]
    widths = re.search(r"#define RAWOPS_SM90\(layout, A_KM, B_KM, T, suffix\)(.*?)\n#", source, re.S).group(1)
    assert re.findall(r"suffix, (\d+), gemm_sm90_##layout##_##suffix([#\w]*)\)", widths) == [
        (str(bn), "" if bn == 256 else f"##_n{bn}") for bn in hopper.TILE_WIDTHS]
    assert hopper.FLAG_PRE > mm.EPI_ERF | 3, "the pre-activation bit is above the epilogue's flags"
    family = re.search(r"#define RAWOPS_SM90_FAMILY\(T, suffix\)(.*?)\n\n", source, re.S).group(1)
    layouts = re.findall(r"RAWOPS_SM90\((\w+),", family)
    assert sorted(layouts) == sorted(mm.LAYOUTS)
    suffixes = re.findall(r"^RAWOPS_SM90_FAMILY\(\w+, (\w+)\)", source, re.M)
    singles = re.findall(r"^RAWOPS_SM90\((\w+), \w+, \w+, \w+, (\w+)\)", source, re.M)
    assert singles == [(layout, "tf32") for layout in hopper.TF32_LAYOUTS]
    bases = {f"gemm_sm90_{layout}_{s}" for layout in layouts for s in suffixes} | \
        {f"gemm_sm90_{layout}_{s}" for layout, s in singles}
    grouped = {hopper.grouped_entry_name(layout, d) for layout in hopper.GROUPED_LAYOUTS + ("tn",) for d in (1, 2)}
    split3 = re.findall(r"^RAWOPS_SM90_ENTRY\(true, true, float, (\d+), true, (\w+)\)", source, re.M)
    assert split3 == [(str(bn), hopper.split3_entry_name(bn)) for bn in hopper.SPLIT3_WIDTHS], "the 3xTF32 entries"
    assert {base + ("" if bn == 256 else f"_n{bn}") for base in bases for bn in hopper.TILE_WIDTHS} | grouped | {
        name for _, name in split3} == set(hopper.entry_points())
    # the grouped entries: four tensor maps, then the groups' table and the GEMM's sizes
    params = re.search(r"gemm_sm90_grouped_##layout##_##suffix\((.*?)\)\s*\{", source, re.S).group(1)
    params = [p.strip() for p in params.replace("\\", " ").split(",")]
    kinds = "".join("b" if "CUtensorMap" in p else "p" if "*" in p else "q" for p in params)
    assert kinds == hopper.GROUPED_KINDS
    assert re.findall(r"^RAWOPS_SM90_GROUPED\((\w+), \w+, \w+, \w+, (\w+)\)", source, re.M) == [
        (layout, s) for layout in ("nt", "nn") for s in ("f16", "bf16")]
    assert re.findall(r"^RAWOPS_SM90_GROUPED_TN\(\w+, (\w+)\)", source, re.M) == ["f16", "bf16"]
    params = re.search(r"gemm_sm90_grouped_tn_##suffix\((.*?)\)\s*\{", source, re.S).group(1)
    params = [p.strip() for p in params.replace("\\", " ").split(",")]
    assert "".join("b" if "CUtensorMap" in p else "p" if "*" in p else "q" for p in params) == \
        hopper.GROUPED_TN_KINDS


def test_the_source_asks_for_sm90a_only():
    path = os.path.join(_modules.kernel_source_dir(), "gemm_sm90.cu")
    assert _nvcc.arch_directive(path) == ["90a"]
    assert _nvcc.uses_cutlass(path)
    assert _nvcc.arch_directive(os.path.join(_modules.kernel_source_dir(), "gemm.cu")) is None


@pytest.mark.parametrize("archs, expected", [
    ([(75, False), (90, False), (120, True)], ["90a"]),
    ([(80, False), (86, False)], []),
    ([(90, True)], ["90a"]),
])
def test_specific_targets_follow_the_build_list(archs, expected):
    assert _nvcc.specific_targets(["90a"], archs) == expected
    assert _nvcc.specific_gencode_flags(expected) == [f"-gencode=arch=compute_{t},code=sm_{t}" for t in expected]


@needs_cuobjdump
def test_fatbin_is_one_sm90a_elf_with_every_entry_point():
    path = _modules.fatbin_path(hopper.FAMILY)
    if not os.path.exists(path):
        if os.environ.get("CI") and _nvcc.cutlass_include() is not None:
            pytest.fail("CI has nvcc and the CuTe headers but the build made no gemm_sm90.fatbin")
        pytest.skip(f"{path} absent (no CuTe headers, sm_90 not targeted, or RAWOPS_FAMILIES left it out)")
    assert list_elf_archs(path) == ["sm_90a"] and list_ptx_archs(path) == []
    assert {arch: sorted(names) for arch, names in elf_entry_symbols(path).items()} == {
        "sm_90a": hopper.entry_points()}
    manifest = _nvcc.read_manifest(_modules.FATBIN_DIR)
    assert manifest["specific"][hopper.FAMILY] == ["sm_90a"]


def test_launch_takes_tensor_maps_as_bytes_only():
    with pytest.raises(TypeError, match="argument 0 of kind 'b' must be bytes"):
        _launch.launch(0, (1,), 1, 0, 0, (1234,), "b", 0)


# ------------------------------------------------------------------------------ on an H100
def _need_sm90():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no GPU")
    if int(cupy.cuda.Device(0).compute_capability) != 90:
        pytest.skip("the Hopper kernel runs on sm_90 only")
    if not hopper.built(0):
        pytest.fail("sm_90 GPU but the Hopper kernels are not built (gemm_sm90.fatbin missing)")


# (BN, K splits) forced on every shape: each tile width, and split K on the narrow ones (a
# split count past the shape's K stages is cut so that none is empty).
FORCED = [(256, 1), (128, 1), (64, 1), (128, 3), (64, 7)]


@pytest.fixture(params=FORCED, ids=lambda f: f"bn{f[0]}-split{f[1]}")
def every_shape_on_hopper(request, monkeypatch):
    """Route every eligible half-type GEMM to the Hopper kernel (x @ W^T at 32 rows too), however
    few its tiles, with the tile width and split count forced."""
    _need_sm90()
    monkeypatch.setattr(rawops.config, "gemm_sm90_shape", request.param)
    monkeypatch.setattr(mm, "SMALL_MMA_BEFORE_HOPPER_M", 0)
    mm._plans.clear()
    yield request.param
    mm._plans.clear()


def _assert_hopper_planned(layout, dtype, m, n, k):
    plan = mm._launch_plan(layout, dtype, m, n, k, BASE, OTHER, 0)
    assert plan[4] == 0, f"{layout} {m}x{n}x{k} did not take the Hopper kernel"
    if rawops.config.gemm_sm90_shape is not None:
        assert plan[5][0] == rawops.config.gemm_sm90_shape[0], "the forced tile width"


# (M, K, N): one row, odd rows, K not a multiple of 64, one tile, many tiles per block
# (176 tiles > 132 SMs), N not a multiple of 256.
SHAPES = [(1, 64, 8), (33, 72, 40), (1000, 256, 520), (257, 1000, 264), (128, 4096, 256), (2000, 136, 2600),
          (300, 8, 2056)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matmul_nn_matches_float64(every_shape_on_hopper, dtype, m, k, n):
    import torch
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    dt = getattr(torch, dtype)
    _assert_hopper_planned("nn", 1 if dtype == "float16" else 2, m, n, k)
    a, b = random((m, k), dt, 1.0), random((k, n), dt, 1.0)
    poison_pool(m * n * 2)
    c = rawops.matmul(to_cupy(a), to_cupy(b))
    assert_close(c, a.double() @ b.double(), dt, f"hopper matmul {dtype} {m}x{k}x{n}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m, k, n", SHAPES + [(1000, 64, 10), (77, 128, 1001)])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_linear_gelu_nt_with_its_epilogue_matches_float64(every_shape_on_hopper, dtype, m, k, n, approximate):
    """x @ W^T (+ bias, GELU, the pre-activation kept): odd N exercises the unpaired stores."""
    import torch
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    dt = getattr(torch, dtype)
    if n % 8 == 0:  # else c's rows are not 16-byte multiples: the portable kernels run it
        _assert_hopper_planned("nt", 1 if dtype == "float16" else 2, m, n, k)
    x, w, bias = random((m, k), dt, 1.0), random((n, k), dt, k ** -0.5), random((n,), dt, 1.0)
    poison_pool(m * n * 2, m * n * 2)  # y and pre
    y, pre = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(bias), approximate, save_preactivation=True)
    pre64 = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    assert_close(pre, pre64, dt, f"hopper pre-activation {dtype} {m}x{k}->{n}")
    ref = torch.nn.functional.gelu(pre64, approximate=approximate)
    assert_close(y, ref, dt, f"hopper linear_gelu {dtype} {m}x{k}->{n} {approximate}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m, k, n", [(1000, 256, 520), (2048, 512, 1024)])
@pytest.mark.parametrize("saved", [True, False])
def test_linear_backward_nn_and_tn_match_float64(every_shape_on_hopper, dtype, m, k, n, saved):
    """dx = dpre @ W (nn) and dW = dpre^T @ x (tn) on the Hopper kernel; dpre from the saved
    pre-activation, or recomputed by the portable kernel's GELU-gradient epilogue."""
    import torch
    from gpu_reference import assert_close, random, to_cupy

    dt = getattr(torch, dtype)
    code = 1 if dtype == "float16" else 2
    _assert_hopper_planned("nn", code, m, k, n)
    _assert_hopper_planned("tn", code, n, k, m)
    x, w, bias = random((m, k), dt, 1.0), random((n, k), dt, k ** -0.5), random((n,), dt, 1.0)
    dy = random((m, n), dt, 1.0)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, bias))
    torch.nn.functional.gelu(torch.nn.functional.linear(x64, w64, b64), approximate="tanh").backward(dy.double())
    pre = None
    if saved:
        _, pre = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(bias), save_preactivation=True, approximate="tanh")
    dx, dw, db = rawops.linear_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(w), to_cupy(bias), preactivation=pre,
                                             approximate="tanh")
    assert_close(dx, x64.grad, dt, f"hopper dx {dtype}", 2)
    assert_close(dw, w64.grad, dt, f"hopper dweight {dtype}", 2)
    assert_close(db, b64.grad, dt, f"hopper dbias {dtype}", 2)


@pytest.mark.gpu
def test_large_gemm_takes_the_hopper_kernel_by_default_and_is_deterministic():
    _need_sm90()
    import torch
    from gpu_reference import assert_close, random, to_cupy

    mm._plans.clear()
    m = n = k = 4096
    _assert_hopper_planned("nn", 2, m, n, k)
    a, b = random((m, k), torch.bfloat16, 1.0), random((k, n), torch.bfloat16, 1.0)
    c1 = rawops.matmul(to_cupy(a), to_cupy(b))
    c2 = rawops.matmul(to_cupy(a), to_cupy(b))
    assert (c1 == c2).all(), "same input, same bits"
    assert_close(c1, a.double() @ b.double(), torch.bfloat16, "hopper matmul 4096^3")


def _launched_twice_against_float64(layout, m, n, k, what):
    """The library's launch on raw pointers (every layout without transposed views) of fresh bf16
    operands, twice into poisoned memory: the same bits both times, and float64's product within
    bf16's tolerance. Returns the operands (torch) and the float64 product."""
    import cupy
    import torch
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    a = random((m, k) if layout[0] == "n" else (k, m), torch.bfloat16, 1.0)
    b = random((n, k) if layout[1] == "t" else (k, n), torch.bfloat16, k ** -0.5)
    ref = (a.double() if layout[0] == "n" else a.double().t()) @ (b.double().t() if layout[1] == "t" else b.double())
    A, B = to_cupy(a), to_cupy(b)
    runs = []
    for _ in range(2):
        poison_pool(m * n * 2)
        c = cupy.empty((m, n), dtype=A.dtype)
        owner = mm.launch_gemm(0, layout, BF16, A.data.ptr, B.data.ptr, c.data.ptr, 0, 0, 0, m, n, k, mm.EPI_NONE,
                               cupy.cuda.get_current_stream().ptr, mm._cupy_workspace)
        runs.append(c)
        del owner
    assert (runs[0] == runs[1]).all(), "same input, same bits"
    assert_close(runs[0], ref, torch.bfloat16, f"hopper {layout} {m}x{n}x{k} {what}")
    return a, b, ref


@pytest.mark.gpu
@pytest.mark.parametrize("layout, m, n, k", [("nt", 64, 3072, 768), ("nt", 256, 3072, 768), ("nt", 512, 4096, 4096),
                                             ("nn", 32, 768, 3072), ("tn", 3072, 768, 512)])
def test_medium_outputs_run_the_planners_narrow_choice_deterministically(layout, m, n, k):
    """Unforced: the medium-batch shapes the cost model was fitted to run the tile and
    split narrow_shape picks (a split among them), match float64 and repeat bit for bit."""
    _need_sm90()

    mm._plans.clear()
    bn, splits = hopper.narrow_shape(m, n, k, BF16, SMS)
    plan = mm._launch_plan(layout, BF16, m, n, k, BASE, OTHER, 0)
    assert plan[4] == 0 and plan[5] == (bn, splits)
    _launched_twice_against_float64(layout, m, n, k, f"BN {bn} splits {splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("layout, m, n, k", [("nn", 8192, 768, 3072), ("nt", 8192, 768, 3072), ("tn", 3072, 768, 8192)])
def test_wide_outputs_run_the_planners_width(layout, m, n, k):
    """Unforced, at the swept shapes: the width the planner's model picks (128 for the 8192 x 768 outputs on
    132 SMs, 256 for the wgrad) runs, matches float64 and repeats bit for bit; the nt case also through
    linear_gelu's training forward (bias + erf GELU + the pre-activation stored)."""
    _need_sm90()
    import torch
    from gpu_reference import assert_close, random
    from rawops._launch import sm_count
    from rawops.torch_adapter import gemm as ta_gemm

    mm._plans.clear()
    sms = sm_count(0)
    bn = hopper.plan(layout, BF16, m, n, k, 90, BASE, OTHER, sms)[3]
    if sms == SMS:
        assert bn == SWEPT_WIDTHS[(m, n, k)]
    plan = mm._launch_plan(layout, BF16, m, n, k, BASE, OTHER, 0)
    assert plan[4] == 0 and plan[5] == (bn, 1)
    a, b, ref = _launched_twice_against_float64(layout, m, n, k, f"BN {bn}")
    if layout == "nt":
        bias = random((n,), torch.bfloat16, 0.5)
        y, pre = ta_gemm.linear_gelu_forward(a, b, bias, "none", True)
        want_pre = ref + bias.double()
        assert_close(pre, want_pre, torch.bfloat16, "pre-activation, 128 wide")
        assert_close(y, torch.nn.functional.gelu(want_pre), torch.bfloat16, "erf GELU epilogue, 128 wide")
