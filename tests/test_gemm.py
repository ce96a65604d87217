"""The matrix family's contract: matmul, linear_gelu and its backward, and their adapter.

Without a GPU: which kernel each shape gets and its grid (pure arithmetic), every argument
check firing before any launch (fake __cuda_array_interface__ producers), and the fatbin
holding every entry point on every architecture. With one (marker `gpu`): against torch in
float64 on fresh random data, weights included; odd and empty shapes; backward; gradcheck;
torch.compile(fullgraph=True)."""
import os
import re

import pytest

import rawops
from test_build import elf_entry_symbols, expected_elf_archs, needs_cuobjdump
from test_validation import BASE, OTHER, FakeCAI, assert_passes_validation, f16, f32

import rawops.gemm as mm  # noqa: E402
from rawops import _constants, _gemm_reduce  # noqa: E402
F32, F16, BF16 = 0, 1, 2


# ------------------------------------------------------------------------------ launch plan
def test_small_batch_linear_splits_the_output_features_over_the_whole_gpu():
    name, grid, block, shared, splits = mm.plan("nt", F32, 32, 3072, 768, 90, BASE, OTHER)
    assert name == "linear_small_nt_f32" and block == 384 and splits == 1
    assert grid == (3072 // 24, 1), "24 features per block: 128 blocks, one per SM"
    assert shared == 32 * 768 * 4 == 96 * 1024, "one 768-wide chunk of x's 32 rows"
    assert mm.plan("nt", F32, 33, 10, 100, 90, BASE, OTHER)[1] == (1, 2), "rows past 32: a second blockIdx.y"
    name, grid, block, shared, splits = mm.plan("nt", BF16, 128, 3072, 768, 80, BASE, OTHER)
    assert name == "linear_small_nt_bf16" and grid == (128, 4) and shared == 48 * 1024


def test_half_types_at_small_batch_take_the_tensor_pipe_on_sm90():
    """linear_small_mma: linear_small_tf32's kernel with one m16n8k16 a product, 16 features a CTA,
    8 warps along K."""
    for dtype, suffix in ((F16, "f16"), (BF16, "bf16")):
        name, grid, block, shared, splits = mm.plan("nt", dtype, 128, 3072, 768, 90, BASE, OTHER)
        assert name == f"linear_small_mma_nt_{suffix}" and grid == (192, 4) and block == 256 and splits == 1
        assert shared == mm.small_tf32_shared_bytes(8, 16) == 8 * 32 * 24 * 4, "8 warps' padded 32 x 16 partial tiles"
        assert mm.plan("nt", dtype, 32, 3072, 768, 90, BASE, OTHER, tf32_linear=True)[0] == name, "linear_gelu too"
        assert mm.plan("nt", dtype, 32, 3072, 768, 80, BASE, OTHER)[0] == f"linear_small_nt_{suffix}", "sm_80: FFMA"
        assert mm.plan("nt", dtype, 32, 3072, 764, 90, BASE, OTHER)[0] != name, "K % 8: rows not 16-byte vectors"
    source = _source("gemm_small")
    entries = re.findall(r"^RAWOPS_SMALL_TC\(linear_small_mma_nt_(\w+), \w+, 1, 1, RAWOPS_GEMM_SMALL_MMA_TILES,"
                         r"\s+RAWOPS_GEMM_SMALL_MMA_WARPS, 2\)", source, re.M)
    assert sorted(entries) == ["bf16", "f16"], "the shipped shape, from rawops/_constants.py"
    assert (mm.SMALL_MMA_TILES, mm.SMALL_MMA_WARPS) == (_constants.GEMM_SMALL_MMA_TILES,
                                                        _constants.GEMM_SMALL_MMA_WARPS)


@pytest.mark.parametrize("why, args", [
    ("more rows than SMALL_MAX_M", ("nt", F32, 129, 3072, 768, 90, BASE, OTHER)),
    ("K not a multiple of 4 floats", ("nt", F32, 32, 3072, 766, 90, BASE, OTHER)),
    ("x off 16 bytes", ("nt", F32, 32, 3072, 768, 90, BASE + 4, OTHER)),
    ("not x @ W^T", ("nn", F32, 32, 3072, 768, 90, BASE, OTHER)),
    ("sm_75: no cp.async", ("nt", F32, 32, 3072, 768, 75, BASE, OTHER)),
])
def test_small_batch_path_only_where_its_16_byte_loads_are_legal(why, args):
    assert not mm.plan(*args)[0].startswith("linear_small"), why


def test_float32_linear_gelu_at_small_batch_takes_3xtf32_on_sm90():
    name, grid, block, shared, splits = mm.plan("nt", F32, 32, 3072, 768, 90, BASE, OTHER, tf32_linear=True)
    assert name == "linear_small_tf32_nt_f32" and block == 512 and splits == 1
    assert grid == (3072 // 24, 1), "24 features per CTA: 128 CTAs, one per SM"
    assert shared == mm.small_tf32_shared_bytes() == 16 * 32 * 40 * 4, "16 warps' padded 32 x 24 partial tiles"
    assert mm.plan("nt", F32, 128, 10, 100, 100, BASE, OTHER, tf32_linear=True)[1] == (1, 4), "N = 10: one CTA"
    assert mm.plan("nt", F32, 1, 3072, 768, 90, BASE, OTHER, tf32_linear=True)[0] == "linear_small_tf32_nt_f32"


@pytest.mark.parametrize("why, args", [
    ("plain matmul / any other GEMM: exact float32", ("nt", F32, 32, 3072, 768, 90, BASE, OTHER)),
    ("sm_80: no clusters (v5 instead)", ("nt", F32, 32, 3072, 768, 80, BASE, OTHER, 132, 0, True)),
    ("half types take linear_small_mma", ("nt", BF16, 32, 3072, 768, 90, BASE, OTHER, 132, 0, True)),
    ("more rows than SMALL_MAX_M", ("nt", F32, 129, 3072, 768, 90, BASE, OTHER, 132, 0, True)),
    ("K % 4: W's rows not 16-byte vectors", ("nt", F32, 32, 3072, 765, 90, BASE, OTHER, 132, 0, True)),
    ("W off 16 bytes", ("nt", F32, 32, 3072, 768, 90, BASE, OTHER + 8, 132, 0, True)),
    ("not x @ W^T", ("nn", F32, 32, 3072, 768, 90, BASE, OTHER, 132, 0, True)),
])
def test_3xtf32_small_batch_only_where_allowed(why, args):
    assert mm.plan(*args)[0] != "linear_small_tf32_nt_f32", why


@pytest.fixture
def planned_names(monkeypatch):
    """_launch_plan with a fake GPU (sm_90, 132 SMs): records the kernel names it picks."""
    names = []
    monkeypatch.setattr(mm, "compute_capability", lambda device: 90)
    monkeypatch.setattr(mm, "sm_count", lambda device: 132)
    monkeypatch.setattr(mm, "_function", lambda name, device, shared: names.append(name) or name)

    def reduce(dtype, m, n, device):
        name = _gemm_reduce.kernel_name(dtype)
        names.append(name)
        return name, (_gemm_reduce.blocks(m, n, 132 * 8),)

    monkeypatch.setattr(mm, "reduce_function_and_grid", reduce)
    mm._plans.clear()
    yield names
    mm._plans.clear()


def test_only_linear_gelu_forward_takes_3xtf32_and_the_switch_turns_it_off(planned_names, monkeypatch):
    args = (F32, 32, 3072, 768, BASE, OTHER, 0)
    assert rawops.config.SWITCHES["linear_tf32"][0] is False, "3xTF32 is an opt-in: float32 means float32"
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS_GELU)[0] == "linear_small_nt_f32", "the default: exact"
    monkeypatch.setattr(rawops.config, "linear_tf32", True)
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS_GELU)[0] == "linear_small_tf32_nt_f32"
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS_GELU | mm.EPI_ERF)[0] == "linear_small_tf32_nt_f32"
    assert mm._launch_plan("nt", *args, mm.EPI_NONE)[0] == "linear_small_nt_f32", "matmul's backward da = dy b^T"
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS)[0] == "linear_small_nt_f32"
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS_GELU_GRAD)[0] == "linear_small_nt_f32", "backward recompute"
    assert mm.linear_launch_plan("nt", F32, 32, 3072, 768, BASE, OTHER, 0, 0, mm.EPI_BIAS_GELU)[0] == \
        "linear_small_tf32_nt_f32", "the torch fast path's planner"
    monkeypatch.setattr(rawops.config, "linear_tf32", False)
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS_GELU)[0] == "linear_small_nt_f32", "a cached plan must not win"
    monkeypatch.setattr(rawops.config, "linear_tf32", True)
    assert mm._launch_plan("nt", *args, mm.EPI_BIAS_GELU)[0] == "linear_small_tf32_nt_f32"


@pytest.mark.parametrize("layout, m, n, k, splits", [
    ("nn", 4096, 768, 3072, 3),     # linear_gelu's dx at 4096 tokens: 192 tiles fill the GPU, K = 3072 in 3
    ("tn", 3072, 768, 4096, 4),     # its dW: K = the 4096 tokens in 4
    ("tn", 3072, 768, 65536, 28),   # 65536 tokens: as many as keep the partials within 256 MiB
    ("nn", 65536, 768, 3072, 1),    # one partial would pass 256 MiB: one chain
    ("nn", 4096, 768, 1024, 1),     # K within one chain
])
def test_float32_ffma_splits_long_chains(layout, m, n, k, splits):
    name, grid, _, _, got = mm.plan(layout, F32, m, n, k, 90, BASE, OTHER, sms=132)
    assert name == f"gemm_simt_vec_{layout}_f32" and got == splits == mm.chain_split_count(m, n, k)
    assert grid == (-(-n // mm.SIMT_TILE), -(-m // mm.SIMT_TILE)) + ((splits,) if splits > 1 else ())
    assert splits * m * n * 4 <= mm.CHAIN_SPLIT_BYTES or splits == 1
    # the half types keep one chain (float32 accumulators, 16-bit results)
    assert mm.plan(layout, BF16, m, n, k, 70, BASE, OTHER, sms=132)[4] == 1


def test_plain_matmul_float32_never_plans_3xtf32(planned_names):
    for m, n, k in [(32, 3072, 768), (1, 8, 4), (128, 64, 64), (7, 5000, 9)]:
        for layout in mm.LAYOUTS:
            mm._launch_plan(layout, F32, m, n, k, BASE, OTHER, 0)
    assert planned_names and "linear_small_tf32_nt_f32" not in planned_names


def test_half_types_use_tensor_cores_on_sm80_and_later_when_aligned():
    for layout in mm.LAYOUTS:
        name, grid, block, shared, splits = mm.plan(layout, BF16, 8192, 8192, 8192, 90, BASE, OTHER)
        assert name == f"gemm_mma_{layout}_bf16" and grid == (64, 64) and block == 256 and splits == 1
        assert shared == mm.mma_shared_bytes(layout)
    assert mm.plan("nn", F16, 1000, 520, 256, 80, BASE, OTHER)[0] == "gemm_mma_nn_f16"
    name, grid, _, shared, splits = mm.plan("nt", BF16, 8192, 3072, 768, 90, BASE, OTHER)
    assert name == "gemm_mma_nt_bf16" and grid == (24, 64) and shared == mm.mma_shared_bytes("nt") and splits == 1


def test_skinny_outputs_split_k_over_the_gpu_and_reduce_in_order():
    # linear backward dx at batch 32: (32, 768) = dpre (32, 3072) @ W: 12 blocks of 32 x 64 on the
    # small-M kernel, split K for ~3 blocks an SM; 33 rows: 6 tiles of 128 x 128 on gemm_simt_vec.
    name, grid, block, shared, splits = mm.plan("nn", F32, 32, 768, 3072, 90, BASE, OTHER, sms=132)
    assert name == "gemm_small_m_nn_f32" and block == mm.SMALL_M_THREADS and shared == 0
    assert splits == 33 == mm.small_m_split_count(12, 3072, 132) and grid == (12, 1, 33)
    name, grid, block, shared, splits = mm.plan("nn", F32, 33, 768, 3072, 90, BASE, OTHER, sms=132)
    assert name == "gemm_simt_vec_nn_f32" and splits == 3072 // mm.SPLIT_MIN_K and grid == (6, 1, splits)
    assert mm.plan("nt", F32, 32, 768, 3072, 90, BASE, OTHER)[0] != "gemm_small_m_nn_f32", "nn only"
    assert mm.plan("nn", F32, 32, 770, 3072, 90, BASE, OTHER)[0] == "gemm_simt_nn_f32", "whole float4 rows only"
    assert mm.small_m_split_count(12, 100, 132) == 1, "K too short to split"
    assert mm.small_m_split_count(1, 1 << 20, 132) == mm.MAX_SPLITS
    name, grid, _, _, splits = mm.plan("nn", BF16, 32, 768, 3072, 90, BASE, OTHER, sms=132)
    assert name == "gemm_mma_nn_bf16" and splits == 12 and grid == (6, 1, 12)
    # dW = dpre^T x at 8192 tokens, 768 -> 3072: 144 tiles for 264 slots, K = 8192.
    name, grid, _, _, splits = mm.plan("tn", BF16, 3072, 768, 8192, 90, BASE, OTHER, sms=132)
    assert name == "gemm_mma_tn_bf16" and splits == 6 and grid == (6, 24, 6)
    assert mm.plan("tn", BF16, 3072, 768, 1000, 90, BASE, OTHER, sms=132)[4] == 1, "short K: no split"
    assert mm.split_count(6, 3072, 132) == 24 and mm.split_count(6, 100000, 132) == 44
    assert mm.split_count(200, 3072, 132) == 1, "enough tiles"
    assert mm.split_count(6, 255, 132) == 1, "K too short to split"
    assert mm.split_count(1, 1 << 20, 132) == mm.MAX_SPLITS
    assert mm.mma_split_count(1, 1 << 20, 132) == mm.MMA_MAX_SPLITS
    # at most the blocks the device holds at once (`resident`: the occupancy API at launch)
    from rawops._gemm_reduce import blocks as reduce_blocks

    assert reduce_blocks(32, 768, 132 * 8) == 96 and reduce_blocks(8192, 8192, 132 * 8) == 132 * 8
    assert reduce_blocks(8192, 8192, 132 * 6) == 132 * 6 and reduce_blocks(1, 1, 0) == 1


def test_float32_with_16_byte_rows_takes_the_vector_ffma_kernel():
    for layout in mm.LAYOUTS:
        name, grid, block, shared, splits = mm.plan(layout, F32, 8192, 8192, 8192, 90, BASE, OTHER)
        assert name == f"gemm_simt_vec_{layout}_f32" and grid == (64, 64) and block == 256 and shared == 0
    assert mm.plan("nt", F32, 8192, 3072, 768, 90, BASE, OTHER)[0] == "gemm_simt_vec_nt_f32"


@pytest.mark.parametrize("why, args", [
    ("K % 4: a's rows not 16-byte multiples", ("nn", F32, 1000, 512, 102, 90, BASE, OTHER)),
    ("N % 4: b's and c's rows", ("nn", F32, 1000, 514, 256, 90, BASE, OTHER)),
    ("N % 4 in nt: c's rows (b's are K-long)", ("nt", F32, 1000, 514, 256, 90, BASE, OTHER)),
    ("M % 4 in tn: a's rows", ("tn", F32, 1002, 512, 256, 90, BASE, OTHER)),
    ("a off 16 bytes", ("nn", F32, 1000, 512, 256, 90, BASE + 4, OTHER)),
    ("c off 16 bytes", ("nn", F32, 1000, 512, 256, 90, BASE, OTHER, 132, BASE + 8)),
    ("half types never: their fallback is gemm_simt", ("nn", BF16, 1000, 512, 100, 90, BASE, OTHER)),
])
def test_vector_ffma_only_where_every_row_is_whole_16_byte_vectors(why, args):
    name = mm.plan(*args)[0]
    assert name.startswith("gemm_simt_") and "_vec_" not in name, why


@pytest.mark.parametrize("why, args", [
    ("float32 is exact FFMA math", ("nn", F32, 8192, 8192, 8192, 90, BASE, OTHER)),
    ("sm_75 has no bf16 mma / cp.async", ("nn", BF16, 8192, 8192, 8192, 75, BASE, OTHER)),
    ("K % 8: a's rows not 16-byte multiples", ("nn", BF16, 1000, 512, 100, 90, BASE, OTHER)),
    ("N % 8 in nn: b's rows", ("nn", BF16, 1000, 10, 256, 90, BASE, OTHER)),
    ("M % 8 in tn: a's rows", ("tn", BF16, 33, 256, 256, 90, BASE, OTHER)),
    ("b off 16 bytes", ("nn", F16, 1000, 512, 256, 90, BASE, OTHER + 2)),
])
def test_everything_else_runs_the_ffma_kernel(why, args):
    name, grid, block, shared, splits = mm.plan(*args)
    assert name.startswith("gemm_simt_") and block == 256 and shared == 0, why
    m, n = args[2], args[3]
    assert grid[:2] == (-(-n // 128), -(-m // 128))
    assert grid[2:] == ((splits,) if splits > 1 else ())


def test_mma_shared_memory_is_three_stages_of_padded_tiles():
    kmajor, mnmajor = 128 * 40 * 2, 32 * 136 * 2
    assert mm.mma_shared_bytes("nt") == 3 * 2 * kmajor == 61440
    assert mm.mma_shared_bytes("nn") == 3 * (kmajor + mnmajor)
    assert mm.mma_shared_bytes("tn") == 3 * 2 * mnmajor
    assert all(mm.mma_shared_bytes(layout) <= 99 * 1024 for layout in mm.LAYOUTS), "fits sm_86/89's 99 KB"


def test_a_callers_stream_is_made_current_without_cupys_deprecated_external_stream():
    # CuPy 14 deprecates ExternalStream; a library call with stream= must not warn the user.
    import warnings

    from rawops._launch import allocating_on

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        current = allocating_on(object(), 0x1234)
    assert current.ptr == 0x1234


def test_an_output_past_one_grid_is_refused():
    with pytest.raises(ValueError, match="exceeds one launch's grid"):
        mm.plan("nn", F32, 128 * 65535 + 1, 8, 8, 90, BASE, OTHER)
    with pytest.raises(ValueError, match="layout must be one of"):
        mm.plan("tt", F32, 8, 8, 8, 90, BASE, OTHER)


# ------------------------------------------------------------------------------ the build
def _source(family="gemm"):
    from rawops import _modules

    with open(os.path.join(_modules.kernel_source_dir(), f"{family}.cu")) as f:
        return f.read()


def _constant_macros(source):
    """{kernel constant: the rawops/_constants.py name it is read from} of `constexpr int k.. = RAWOPS_..`."""
    return dict(re.findall(r"\b(k\w+) = RAWOPS_(\w+)\b", source))


def test_small_batch_launch_shape_matches_the_kernel_macros():
    # The kernels read their shapes from rawops/_constants.py, as the planner does.
    small, general = _constant_macros(_source("gemm_small")), _constant_macros(_source())
    assert {name: small[name] for name in ("kSmallFeatures", "kSmallGroups", "kSmallRows", "kSmallK")} == {
        "kSmallFeatures": "GEMM_SMALL_FEATURES", "kSmallGroups": "GEMM_SMALL_GROUPS", "kSmallRows": "GEMM_SMALL_ROWS",
        "kSmallK": "GEMM_SMALL_K"}
    assert (mm.SMALL_FEATURES, mm.SMALL_GROUPS, mm.SMALL_ROWS, mm.SMALL_K) == (
        _constants.GEMM_SMALL_FEATURES, _constants.GEMM_SMALL_GROUPS, _constants.GEMM_SMALL_ROWS,
        _constants.GEMM_SMALL_K)
    assert general["kVecK"] == "GEMM_SIMT_VEC_K" and mm.SIMT_VEC_K == _constants.GEMM_SIMT_VEC_K
    assert {small[k] for k in ("kSmallMRows", "kSmallMCols", "kSmallMThreads")} == {
        "GEMM_SMALL_M_ROWS", "GEMM_SMALL_M_COLS", "GEMM_SMALL_M_THREADS"}
    assert {general[k] for k in ("kSimtTile", "kSimtThreads", "kMmaTile", "kMmaK", "kMmaStages", "kMmaThreads",
                                 "kReduceThreads")} == {
        "GEMM_SIMT_TILE", "GEMM_SIMT_THREADS", "GEMM_MMA_TILE", "GEMM_MMA_K", "GEMM_MMA_STAGES", "GEMM_MMA_THREADS",
        "GEMM_REDUCE_THREADS"}
    partial_sums = mm.SMALL_GROUPS * mm.SMALL_ROWS * mm.SMALL_FEATURES * 4
    assert partial_sums <= mm.small_shared_bytes(2) <= mm.small_shared_bytes(4) <= 99 * 1024, "fits sm_86/89"


def test_3xtf32_small_batch_shape_matches_its_entry_and_traps_below_sm90():
    source = _source("gemm_small")
    entry = re.search(r"^RAWOPS_SMALL_TC\(linear_small_tf32_nt_f32, float, RAWOPS_(\w+), (\d+), RAWOPS_(\w+),\s+"
                      r"RAWOPS_(\w+), (\d+)\)", source, re.M)
    c, nwn, nt, nwk, _ = entry.groups()
    assert (c, nwn, nt, nwk) == ("GEMM_SMALL_TF32_CLUSTER", "1", "GEMM_SMALL_TF32_TILES", "GEMM_SMALL_TF32_WARPS")
    assert (mm.SMALL_TF32_CLUSTER, mm.SMALL_TF32_TILES, mm.SMALL_TF32_WARPS) == (
        _constants.GEMM_SMALL_TF32_CLUSTER, _constants.GEMM_SMALL_TF32_TILES, _constants.GEMM_SMALL_TF32_WARPS)
    body = source[source.index("__device__ __forceinline__ void linear_small_tc("):]
    assert body.index("__CUDA_ARCH__ >= 900") < body.index("__trap()"), "sm_80..89 compile a trap"
    assert mm.SMALL_TF32_MIN_CC == 90 and mm.small_tf32_shared_bytes() <= 99 * 1024, "fits sm_120's 99 KB"


def test_every_entry_point_has_the_table_signature():
    from rawops import _modules

    with open(os.path.join(_modules.kernel_source_dir(), "include", "rawops", "gemm_epilogue.cuh")) as f:
        header = f.read()
    params = re.search(r"#define RAWOPS_GEMM_ARGS\(T\)\s*\\\s*(.*?)\n#define", header, re.S).group(1)
    params = [p.strip() for p in params.replace("\\", " ").split(",")]
    assert [p.split()[-1].lstrip("*") for p in params] == list(mm.ARGS)
    assert "".join("p" if "*" in p else "q" for p in params) == mm.KINDS
    source = _source()
    macros = re.findall(r"^\s*RAWOPS_(SIMT|MMA)\((\w+),", source, re.M)
    assert sorted({layout for _, layout in macros}) == sorted(mm.LAYOUTS)
    families = re.findall(r"^RAWOPS_MATMUL_(MMA_)?FAMILY\([\w ]+, (\w+)\)", source, re.M)
    assert [s for mma, s in families if not mma] == ["f32", "f16", "bf16"]
    assert [s for mma, s in families if mma] == list(mm.MMA_SUFFIXES)


@needs_cuobjdump
@pytest.mark.parametrize("family", [mm.FAMILY, mm.SMALL_FAMILY])
def test_fatbin_has_every_entry_point_on_every_architecture(family):
    from rawops import _modules

    path = _modules.fatbin_path(family)
    if not os.path.exists(path):
        pytest.skip(f"{path} absent (built without nvcc, or RAWOPS_FAMILIES left it out)")
    per_arch = elf_entry_symbols(path)
    assert sorted(per_arch) == expected_elf_archs()
    for arch, names in sorted(per_arch.items()):
        assert sorted(names) == mm.entry_points(family), arch
    assert all(mm.family_of(name) == family for name in mm.entry_points(family))


# ------------------------------------------------------------------------------ validation
def test_valid_calls_get_past_validation():
    assert_passes_validation(rawops.matmul, f32((4, 8)), f32((8, 3), ptr=OTHER))
    assert_passes_validation(rawops.matmul, f32((0, 8)), f32((8, 3), ptr=OTHER), out=f32((0, 3), ptr=OTHER * 2))
    assert_passes_validation(rawops.linear_gelu, f32((2, 3, 8)), f32((5, 8), ptr=OTHER), f32((5,), ptr=OTHER * 2))
    assert_passes_validation(rawops.linear_gelu, f16((4, 8)), f16((5, 8), ptr=OTHER), None, approximate="none")
    assert_passes_validation(rawops.linear_gelu_backward, f32((4, 5), ptr=OTHER * 3), f32((4, 8)),
                             f32((5, 8), ptr=OTHER), f32((5,), ptr=OTHER * 2))


@pytest.mark.parametrize("a, b, message", [
    (f32((4, 8)), f32((7, 3), ptr=OTHER), r"^b has shape \(7, 3\), expected \(8, N\)"),
    (f32((4, 8, 1)), f32((8, 3), ptr=OTHER), r"^a must be 2-D, got shape \(4, 8, 1\)"),
    (f32((4, 8)), f32((8,), ptr=OTHER), r"^b must be 2-D"),
    (f32((4, 8), strides=(64, 8)), f32((8, 3), ptr=OTHER), r"^a is not C-contiguous"),
    (f32((4, 8)), f32((8, 3), ptr=OTHER + 2), r"^b is misaligned"),
])
def test_matmul_refuses_bad_shapes_and_layouts_naming_the_argument(a, b, message):
    with pytest.raises(ValueError, match=message):
        rawops.matmul(a, b)


def test_matmul_refuses_mixed_or_unsupported_dtypes():
    with pytest.raises(TypeError, match=r"^b has dtype float16, expected float32 like a"):
        rawops.matmul(f32((4, 8)), f16((8, 3), ptr=OTHER))
    with pytest.raises(TypeError, match=r"^a has dtype .*matmul supports float32, float16, bfloat16"):
        rawops.matmul(FakeCAI((4, 8), "<i4"), FakeCAI((8, 3), "<i4", ptr=OTHER))
    with pytest.raises(TypeError, match=r"^tf32 must be a bool"):
        rawops.matmul(f32((4, 8)), f32((8, 3), ptr=OTHER), tf32=1)


def test_matmul_out_must_fit_and_stay_apart_from_the_inputs():
    a, b = f32((4, 8)), f32((8, 3), ptr=OTHER)
    with pytest.raises(ValueError, match=r"^out has shape \(3, 4\), expected \(4, 3\)"):
        rawops.matmul(a, b, out=f32((3, 4), ptr=OTHER * 2))
    with pytest.raises(TypeError, match=r"^out has dtype float16"):
        rawops.matmul(a, b, out=f16((4, 3), ptr=OTHER * 2))
    with pytest.raises(ValueError, match=r"^out overlaps a"):
        rawops.matmul(a, b, out=f32((4, 3), ptr=BASE + 16))
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.matmul(a, b, out=f32((4, 3), ptr=OTHER * 2, readonly=True))


@pytest.mark.parametrize("weight, bias, message", [
    (f32((5, 7), ptr=OTHER), None, r"^weight has shape \(5, 7\), expected \(out_features, 8\)"),
    (f32((8,), ptr=OTHER), None, r"^weight must be 2-D"),
    (f32((5, 8), ptr=OTHER), f32((4,), ptr=OTHER * 2), r"^bias has shape \(4,\), expected \(5,\)"),
])
def test_linear_gelu_refuses_parameters_of_the_wrong_shape(weight, bias, message):
    with pytest.raises(ValueError, match=message):
        rawops.linear_gelu(f32((4, 8)), weight, bias, approximate="tanh")


def test_linear_gelu_refuses_bad_dtypes_approximations_and_dy():
    with pytest.raises(TypeError, match=r"^weight has dtype float16, expected float32 like x"):
        rawops.linear_gelu(f32((4, 8)), f16((5, 8), ptr=OTHER), None, approximate="tanh")
    with pytest.raises(TypeError, match=r"^bias has dtype float16, expected float32 like x"):
        rawops.linear_gelu(f32((4, 8)), f32((5, 8), ptr=OTHER), f16((5,), ptr=OTHER * 2), approximate="tanh")
    with pytest.raises(ValueError, match=r"^approximate must be 'tanh' or 'none', got 'erf'"):
        rawops.linear_gelu(f32((4, 8)), f32((5, 8), ptr=OTHER), None, approximate="erf")
    with pytest.raises(ValueError, match=r"^x must have at least one dimension"):
        rawops.linear_gelu(f32(()), f32((5, 8), ptr=OTHER), None, approximate="tanh")
    with pytest.raises(ValueError, match=r"^dy has shape \(4, 6\), expected \(4, 5\)"):
        rawops.linear_gelu_backward(f32((4, 6), ptr=OTHER * 3), f32((4, 8)), f32((5, 8), ptr=OTHER), approximate="tanh")
    with pytest.raises(ValueError, match=r"^preactivation has shape"):
        rawops.linear_gelu_backward(f32((4, 5), ptr=OTHER * 3), f32((4, 8)), f32((5, 8), ptr=OTHER),
                                    preactivation=f32((5, 4), ptr=OTHER * 4))


def test_adapter_refuses_bad_arguments_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    with pytest.raises(ValueError, match=r"^a is on cpu"):
        ta.matmul(torch.ones(4, 8), torch.ones(8, 3))
    with pytest.raises(ValueError, match=r"^x is on cpu"):
        ta.linear_gelu(torch.ones(4, 8), torch.ones(5, 8), approximate="tanh")
    with pytest.raises(ValueError, match=r"^approximate must be"):
        ta.LinearGELU(8, 5, approximate="erf")
    module = ta.LinearGELU(8, 5, approximate="tanh")
    linear = torch.nn.Linear(8, 5)
    module.load_state_dict(linear.state_dict())  # same names and shapes as nn.Linear
    assert torch.equal(module.weight, linear.weight) and torch.equal(module.bias, linear.bias)


# ------------------------------------------------------------------------------ on the GPU
DTYPES = ["float32", "float16", "bfloat16"]
# (M, K, N): odd sizes, one-row and one-column, empty, and aligned ones that take the
# tensor-core path for half types.
# (32, 3072, 768) and (7, 5000, 9) split K; half types take tensor cores on the aligned ones,
# (300, 2048, 264) with split K. float32 with K, N % 4 == 0 takes gemm_simt_vec: (257, 252, 132)
# and (130, 36, 1028) end inside a 16-wide K tile and inside a 128-wide block tile.
MATMUL_SHAPES = [(1, 100, 10), (33, 100, 10), (1000, 100, 10), (33, 64, 40), (257, 255, 129), (0, 5, 7),
                 (5, 0, 7), (5, 7, 0), (128, 128, 128), (1000, 256, 520), (300, 2048, 264), (1000, 256, 136),
                 (32, 3072, 768), (7, 5000, 9), (257, 252, 132), (130, 36, 1028),
                 # float32 on gemm_small_m_nn: a partial K tile and column block, odd rows, empty splits
                 (1, 64, 4), (32, 20, 132), (17, 4, 516), (32, 1000, 68)]
LINEAR_SHAPES = [(1, 100, 10), (33, 100, 10), (1000, 100, 10), (32, 768, 3072), (128, 64, 200), (129, 64, 200),
                 (1000, 256, 520), (0, 64, 16), (7, 64, 0), (5, 0, 9)]


def _torch_dtype(name):
    import torch

    return getattr(torch, name)


def _gelu64(torch, pre, approximate):
    return torch.nn.functional.gelu(pre, approximate=approximate)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", MATMUL_SHAPES)
def test_matmul_matches_torch_float64(dtype, m, k, n):
    pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    dt = _torch_dtype(dtype)
    a, b = random((m, k), dt, 1.0), random((k, n), dt, 1.0)
    poison_pool(m * n * a.element_size())
    c = rawops.matmul(to_cupy(a), to_cupy(b))
    assert c.shape == (m, n)
    assert_close(c, a.double() @ b.double(), dt, f"matmul {dtype} {m}x{k}x{n}")


@pytest.mark.gpu
def test_matmul_tf32_opt_in_stays_within_tf32_tolerance_and_out_is_written():
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy

    a, b = random((300, 512), torch.float32), random((512, 264), torch.float32)
    buffer = torch.full((300 * 264 + 64,), float("nan"), device="cuda")
    out = buffer[: 300 * 264].view(300, 264)
    rawops.matmul(to_cupy(a), to_cupy(b), tf32=True, out=to_cupy(out))
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-3
    assert torch.isnan(buffer[300 * 264:]).all(), "wrote past out"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_on_a_given_stream_with_split_k_scratch(dtype):
    """A caller's stream: outputs and split-K scratch come from CuPy's pool on that stream."""
    pytest.importorskip("torch")
    import cupy
    from gpu_reference import assert_close, random, to_cupy, written_late

    dt = _torch_dtype(dtype)
    a, b = random((32, 4096), dt, 1.0), random((4096, 520), dt, 1.0)
    stream = cupy.cuda.Stream(non_blocking=True)
    late = written_late(a, stream)  # NaN unless the launch waits behind `stream`'s work
    c = rawops.matmul(to_cupy(late), to_cupy(b), stream=stream)
    stream.synchronize()
    assert_close(c, a.double() @ b.double(), dt, f"matmul on a stream {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", LINEAR_SHAPES)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_linear_gelu_matches_torch_float64(dtype, m, k, n, approximate):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    dt = _torch_dtype(dtype)
    x, w, bias = random((m, k), dt, 1.0), random((n, k), dt, max(k, 1) ** -0.5), random((n,), dt, 1.0)
    poison_pool(m * n * x.element_size(), m * n * x.element_size())  # y and pre
    y, pre = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(bias), approximate, save_preactivation=True)
    pre64 = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    assert_close(pre, pre64, dt, f"pre-activation {dtype} {m}x{k}->{n}")
    assert_close(y, _gelu64(torch, pre64, approximate), dt, f"linear_gelu {dtype} {m}x{k}->{n} {approximate}")
    y2 = rawops.linear_gelu(to_cupy(x), to_cupy(w), None, approximate)  # no bias, no pre-activation
    ref2 = _gelu64(torch, x.double() @ w.double().t(), approximate)
    assert_close(y2, ref2, dt, f"linear_gelu without bias {dtype} {m}x{k}->{n}")


def _device_cc():
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def _tf32_runs_here():
    return _device_cc() >= mm.SMALL_TF32_MIN_CC


def _relative_error(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 33, 128])
@pytest.mark.parametrize("k, n", [(768, 3072), (768, 10), (100, 3072), (765, 40)])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_linear_gelu_float32_small_batch_3xtf32_matches_float64(m, k, n, approximate):
    """float32 linear_gelu at <= 128 rows takes 3xTF32 on sm_90+ (K % 4 == 0; K = 765 goes to
    the FFMA kernel): held to float32's 1e-5, which one TF32 product (~3e-4) would fail."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    expect_tf32 = k % 4 == 0 and _tf32_runs_here()
    name = mm.plan("nt", F32, m, n, k, _device_cc(), BASE, OTHER, tf32_linear=True)[0]
    assert (name == "linear_small_tf32_nt_f32") == expect_tf32
    x, w = random((m, k), torch.float32, 1.0), random((n, k), torch.float32, k ** -0.5)
    bias = random((n,), torch.float32)
    pre64 = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    y64 = _gelu64(torch, pre64, approximate)
    what = f"{m}x{k}->{n} {approximate}"
    for save in (True, False):
        poison_pool(*[m * n * 4] * (2 if save else 1))  # y, and pre when saved
        out = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(bias), approximate, save_preactivation=save)
        y = out[0] if save else out
        if save:
            assert_close(out[1], pre64, torch.float32, f"pre-activation {what}")
        assert_close(y, y64, torch.float32, f"linear_gelu {what} save={save}")
    poison_pool(m * n * 4)
    y = rawops.linear_gelu(to_cupy(x), to_cupy(w), None, approximate)
    assert_close(y, _gelu64(torch, x.double() @ w.double().t(), approximate), torch.float32, f"no bias {what}")


@pytest.mark.gpu
def test_linear_tf32_switch_forces_the_exact_kernel_in_both_paths(monkeypatch):
    """config.linear_tf32 = False: the exact FFMA kernel, also through the adapter's cached fast path;
    3xTF32 stays at float32 level next to it (both printed with -s)."""
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy
    from rawops import _launch

    if not _tf32_runs_here():
        pytest.skip("3xTF32 small-batch kernel: sm_90+")
    x, w, b = random((32, 768), torch.float32, 1.0), random((3072, 768), torch.float32, 768 ** -0.5), \
        random((3072,), torch.float32)
    ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), w.double(), b.double()), approximate="tanh")
    flags = mm.EPI_BIAS_GELU
    monkeypatch.setattr(rawops.config, "linear_tf32", True)  # the opt-in
    with torch.no_grad():
        fast_tf32 = _launch.torch_linear(x, w, b, flags)
        api_tf32 = torch.from_dlpack(rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(b), approximate="tanh"))
        monkeypatch.setattr(rawops.config, "linear_tf32", False)
        fast_exact = _launch.torch_linear(x, w, b, flags)
        api_exact = torch.from_dlpack(rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(b), approximate="tanh"))
        torch_f32 = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    torch.cuda.synchronize()
    assert torch.equal(fast_tf32, api_tf32) and torch.equal(fast_exact, api_exact), "one kernel per setting"
    assert not torch.equal(fast_tf32, fast_exact), "the switch reached the fast path's cached plan"
    e_tf32, e_exact, e_torch = (_relative_error(t, ref) for t in (fast_tf32, fast_exact, torch_f32))
    print(f"relative error vs float64: 3xTF32 {e_tf32:.2e}, exact FFMA {e_exact:.2e}, torch float32 {e_torch:.2e}")
    assert e_exact < 1e-6 and e_tf32 < 1e-5


@pytest.mark.gpu
def test_linear_gelu_keeps_leading_dims():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random, to_cupy

    x, w, b = random((3, 11, 64), torch.float32), random((40, 64), torch.float32, 0.1), random((40,), torch.float32)
    y = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(b), approximate="tanh")
    assert y.shape == (3, 11, 40)
    ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), w.double(), b.double()), approximate="tanh")
    assert_close(y, ref, torch.float32, "3-D x")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", [(33, 100, 10), (32, 768, 3072), (1000, 256, 520), (1, 64, 8), (0, 16, 8)])
@pytest.mark.parametrize("saved", [True, False])
def test_linear_gelu_backward_matches_torch_float64(dtype, m, k, n, saved):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    dt = _torch_dtype(dtype)
    x, w, bias = random((m, k), dt, 1.0), random((n, k), dt, max(k, 1) ** -0.5), random((n,), dt, 1.0)
    dy = random((m, n), dt, 1.0)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, bias))
    y64 = torch.nn.functional.gelu(torch.nn.functional.linear(x64, w64, b64), approximate="tanh")
    y64.backward(dy.double())
    pre = None
    if saved:
        _, pre = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(bias), save_preactivation=True, approximate="tanh")
    size = x.element_size()
    poison_pool(m * k * size, n * k * size, n * size)  # dx, dweight, dbias (at m = 0: dweight must be written 0)
    dx, dw, db = rawops.linear_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(w), to_cupy(bias), preactivation=pre,
                                             approximate="tanh")
    factor = 1 if dt == torch.float32 else 2  # dpre is rounded to the storage type before the GEMMs
    what = f"{dtype} {m}x{k}->{n} {'saved' if saved else 'recomputed'}"
    assert_close(dx, x64.grad, dt, f"dx {what}", factor)
    assert_close(dw, w64.grad, dt, f"dweight {what}", factor)
    assert_close(db, b64.grad, dt, f"dbias {what}", factor)


@pytest.mark.gpu
def test_linear_gelu_backward_makes_dpre_and_dbias_in_one_pass_from_a_saved_preactivation(monkeypatch):
    # Both APIs: the fused elementwise kernel without a bias (bias pointer 0), no separate column sum.
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy
    from rawops import elementwise
    from rawops import torch_adapter as ta

    fused_bias_ptrs, column_sums = [], []
    real_fused, real_sum = elementwise.launch_bias_gelu_backward, elementwise.launch_column_sum
    monkeypatch.setattr(elementwise, "launch_bias_gelu_backward",
                        lambda *args: fused_bias_ptrs.append(args[6]) or real_fused(*args))
    monkeypatch.setattr(elementwise, "launch_column_sum", lambda *args: column_sums.append(args) or real_sum(*args))
    x, w = random((64, 96), torch.float16, 1.0), random((136, 96), torch.float16, 0.1)
    bias = random((136,), torch.float16, 1.0)
    dy = random((64, 136), torch.float16, 1.0)
    _, pre = rawops.linear_gelu(to_cupy(x), to_cupy(w), to_cupy(bias), save_preactivation=True, approximate="tanh")
    rawops.linear_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(w), to_cupy(bias), preactivation=pre,
                                approximate="tanh")
    assert (fused_bias_ptrs, column_sums) == ([0], [])
    module = ta.LinearGELU(96, 136, device="cuda", dtype=torch.float16, approximate="tanh")
    module(x.requires_grad_()).backward(dy)
    assert (fused_bias_ptrs, column_sums) == ([0, 0], [])
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------ torch adapter
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", [(1000, 256, 520), (64, 8192, 64), (256, 768, 3072), (32, 3072, 768), (7, 5, 3)])
def test_adapter_no_grad_matmul_typed_path_matches_float64(dtype, m, k, n):
    """The launcher's typed no-grad matmul: one plan per shape, K split with scratch from torch
    (64 x 8192 -> 64 float32; 32 x 3072 -> 768 on the Hopper GEMM on sm_90), the Hopper GEMM's
    narrow tiles (256 x 768 -> 3072 half types on sm_90; float32 there is 3xTF32, which the typed
    path leaves to the full path), the portable kernels, odd sizes."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_torch_pool, random
    from rawops import _launch
    from rawops import torch_adapter as ta

    dt = _torch_dtype(dtype)
    a, b = random((m, k), dt, 1.0), random((k, n), dt, k ** -0.5)
    ref = a.double() @ b.double()
    poison_torch_pool(m * n * a.element_size())
    with torch.no_grad():
        c = _launch.torch_matmul(a, b)
    code = {"float32": F32, "float16": F16, "bfloat16": BF16}[dtype]
    if mm._launch_plan("nn", code, m, n, k, a.data_ptr(), b.data_ptr(), a.get_device())[4] == -1:
        # float32 as 3xTF32 (sm_90, >= 2^30 FLOP): several launches and scratch, the Python path's
        assert c is None, "the typed path declines the 3xTF32 plan"
    else:
        assert c is not None and c.shape == (m, n) and c.dtype == dt
        assert_close(c, ref, dt, f"typed matmul {dtype} {m}x{k}x{n}")
    assert_close(ta.matmul(a, b), ref, dt, "adapter matmul, typed path")
    assert _launch.torch_matmul(a, b.t()) is None, "a transposed view: the full path (which refuses it)"
    assert _launch.torch_matmul(a.requires_grad_(), b) is None, "a gradient: the full path"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_adapter_matmul_forward_and_backward_match_float64(dtype):
    pytest.importorskip("torch")
    from gpu_reference import assert_close, random
    from rawops import torch_adapter as ta

    dt = _torch_dtype(dtype)
    a, b = random((200, 136), dt, 1.0).requires_grad_(), random((136, 72), dt, 1.0).requires_grad_()
    dy = random((200, 72), dt, 1.0)
    c = ta.matmul(a, b)
    c.backward(dy)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (a64 @ b64).backward(dy.double())
    assert_close(c.detach(), a64.detach() @ b64.detach(), dt, "adapter matmul")
    assert_close(a.grad, a64.grad, dt, "adapter matmul da")
    assert_close(b.grad, b64.grad, dt, "adapter matmul db")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 32, 33, 1000])
def test_adapter_linear_gelu_module_matches_nn_linear_gelu_in_float64(dtype, m):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random
    from rawops import torch_adapter as ta

    dt = _torch_dtype(dtype)
    linear = torch.nn.Linear(96, 136).cuda().to(dt)
    module = ta.LinearGELU(96, 136, device="cuda", dtype=dt, approximate="tanh")
    module.load_state_dict(linear.state_dict())
    x = random((m, 96), dt, 1.0).requires_grad_()
    dy = random((m, 136), dt, 1.0)
    y = module(x)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    ref = torch.nn.Linear(96, 136).cuda().double()
    ref.load_state_dict({k: v.double() for k, v in linear.state_dict().items()})
    y64 = torch.nn.functional.gelu(ref(x64), approximate="tanh")
    y64.backward(dy.double())
    factor = 1 if dt == torch.float32 else 2
    assert_close(y.detach(), y64.detach(), dt, "LinearGELU forward")
    assert_close(x.grad, x64.grad, dt, "LinearGELU dx", factor)
    assert_close(module.weight.grad, ref.weight.grad, dt, "LinearGELU dweight", factor)
    assert_close(module.bias.grad, ref.bias.grad, dt, "LinearGELU dbias", factor)
    with torch.no_grad():
        assert_close(module(x.detach()), y64.detach(), dt, "LinearGELU no-grad path")


@pytest.mark.gpu
def test_adapter_gradcheck_on_small_sizes():
    torch = pytest.importorskip("torch")
    import warnings

    from rawops import torch_adapter as ta

    x = torch.randn(5, 12, device="cuda", requires_grad=True)
    w = (torch.randn(7, 12, device="cuda") * 0.3).requires_grad_()
    b = torch.randn(7, device="cuda", requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float32 inputs: gradcheck warns, tolerances below account for it
        assert torch.autograd.gradcheck(lambda x, w, b: ta.linear_gelu(x, w, b, approximate="tanh"), (x, w, b),
                                        eps=1e-2, atol=2e-2,
                                        rtol=2e-2)
        assert torch.autograd.gradcheck(lambda x, w: ta.matmul(x, w.t().contiguous()), (x, w), eps=1e-2, atol=2e-2,
                                        rtol=2e-2)


@pytest.mark.gpu
def test_adapter_ops_compile_with_fullgraph_and_keep_their_gradients():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random
    from rawops import torch_adapter as ta

    def f(x, w, b, w2):
        return ta.matmul(ta.linear_gelu(x, w, b, approximate="tanh"), w2).sum()

    x = random((64, 48), torch.float32).requires_grad_()
    w = random((80, 48), torch.float32, 0.2).requires_grad_()
    b = random((80,), torch.float32).requires_grad_()
    w2 = random((80, 24), torch.float32, 0.2).requires_grad_()
    compiled = torch.compile(f, fullgraph=True)
    loss = compiled(x, w, b, w2)
    loss.backward()
    grads = [t.grad.clone() for t in (x, w, b, w2)]
    refs = [t.detach().double().requires_grad_() for t in (x, w, b, w2)]
    ref = (torch.nn.functional.gelu(torch.nn.functional.linear(refs[0], refs[1], refs[2]), approximate="tanh")
           @ refs[3]).sum()
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-4 * max(1.0, abs(ref.item()))
    for g, r, name in zip(grads, refs, ("x", "w", "b", "w2")):
        assert_close(g, r.grad, torch.float32, f"compiled grad {name}", 10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, n", [((32, 768), 3072), ((2, 3, 100), 10), ((1, 64), 200), ((200, 96), 136),
                                      ((64, 3072), 768)])
def test_adapter_no_grad_linear_gelu_fast_path_matches_float64(dtype, shape, n):
    """The launcher's typed no-grad path (checks, cached plan, output, launch in one call) takes
    every plan; the Hopper GEMM's (the half types' 200 x 96 -> 136 and 64 x 3072 -> 768, a K split
    with its scratch from torch, on sm_90) it launches through rawops._gemm_sm90.launch_gemm,
    whose tensor maps follow the pointers."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_torch_pool, random
    from rawops import _launch
    from rawops import torch_adapter as ta

    dt = _torch_dtype(dtype)
    k = shape[-1]
    x, w, b = random(shape, dt, 1.0), random((n, k), dt, k ** -0.5), random((n,), dt, 1.0)
    flags = ta.gemm._LINEAR_GELU_FLAGS["tanh"]
    code = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dt]
    rows = x.numel() // k
    plan = mm._launch_plan("nt", code, rows, n, k, x.data_ptr(), w.data_ptr(), 0, flags)
    for bias in (b, None):
        poison_torch_pool(x.numel() // k * n * x.element_size())  # y comes from torch's allocator
        with torch.no_grad():
            y = _launch.torch_linear(x, w, bias, flags)
        ref = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
        assert y is not None and y.shape == shape[:-1] + (n,) and y.dtype == dt
        assert_close(y, torch.nn.functional.gelu(ref, approximate="tanh"), dt, f"fast path {dtype} {shape}->{n}")
        assert_close(ta.linear_gelu(x, w, bias, approximate="tanh"), torch.nn.functional.gelu(ref, approximate="tanh"),
                     dt, "adapter")
    if torch.cuda.get_device_capability() != (9, 0) or code == 0:
        assert plan[4] != 0, "the Hopper GEMM is sm_90's, for the 16-bit types here"
    elif shape == (200, 96):
        assert plan[4] == 0 and plan[5][1] == 1, "an unsplit Hopper plan: the fast path launched it"
    elif shape == (64, 3072):
        assert plan[4] == 0 and plan[5][1] > 1, "a K-split Hopper plan: the fast path launched it, scratch and all"


@pytest.mark.gpu
def test_adapter_fast_path_declines_what_the_full_path_must_handle():
    torch = pytest.importorskip("torch")
    from rawops import _launch

    x, w = torch.randn(4, 8, device="cuda"), torch.randn(16, 8, device="cuda")
    b = torch.randn(16, device="cuda")
    with torch.no_grad():
        assert _launch.torch_linear(x.t().contiguous().t(), w, b, 1) is None, "not contiguous"
        assert _launch.torch_linear(x.double(), w, b, 1) is None, "dtype"
        assert _launch.torch_linear(x, w.half(), b, 1) is None, "mixed dtypes"
        assert _launch.torch_linear(x, w, b[:8], 1) is None, "bias shape"
        assert _launch.torch_linear(x, w[:, :4].contiguous(), b, 1) is None, "in_features"
        assert _launch.torch_linear(x.cpu(), w, b, 1) is None, "host tensor"
    assert _launch.torch_linear(x, w.requires_grad_(), b, 1) is None, "autograd needs the full path"
