"""sort and argsort (the sorting family), through the CuPy API and the torch adapter, against
torch.sort: every argument check before a launch and the launch plan without a GPU; with one,
every key dtype on fresh random data at row lengths on both sides of every path's boundary,
ties, NaN, infinities and signed zeros, stability, both rankings of the block tiles, views,
another dim, the adapter's autograd and torch.compile.

Every sort here is stable, so its indices must equal torch.sort(stable=True)'s exactly, and its
values must be the input gathered at them, bit for bit."""
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rawops.sorting as rs  # noqa: E402
from test_validation import FakeCAI, assert_passes_validation  # noqa: E402

TYPESTRS = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8"}
KEY_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
              "int32": torch.int32, "int64": torch.int64}


# ------------------------------------------------------------------------------ the plan
def test_rows_up_to_32_take_groups_of_lanes():
    assert rs.plan(1000, 32, 32) == rs.Plan("warp", "sort_warp", -(-1000 // 8), 256, 0)
    assert rs.plan(1000, 2, 32).blocks == -(-1000 // (8 * 16))  # 16 rows a warp
    assert rs.plan(1000, 3, 16).blocks == -(-1000 // (8 * 8))  # groups of 4 lanes
    assert rs.plan(5, 1, 64).kind == "warp"


@pytest.mark.parametrize("n,tile,wide", [(33, (32, 4), (32, 4)), (128, (32, 4), (32, 4)), (129, (32, 8), (32, 8)),
                                         (512, (64, 8), (64, 8)), (513, (128, 8), (64, 16)),
                                         (1024, (128, 8), (64, 16)), (1025, (256, 8), (256, 8)),
                                         (4096, (256, 16), (256, 16)), (4097, (512, 16), None),
                                         (8192, (512, 16), None)])
def test_the_smallest_tile_that_holds_the_row(n, tile, wide):
    for bits in (16, 32):
        p = rs.plan(77, n, bits)
        assert p == rs.Plan("tile", rs.tile_kernel(tile), 77, tile[0], 0)
        assert p.kernel.endswith("_" + rs.RANKING[tile])
    assert rs.tile_for(n, 64) == wide
    if wide:
        assert rs.plan(77, n, 64).kernel == f"sort_rows_{wide[0]}x{wide[1]}_{rs.WIDE_RANKING[wide]}"


@pytest.mark.parametrize("bits,chunk", [(16, 8192), (32, 8192), (64, 4096)])
def test_longer_rows_merge_chunks_of_the_largest_tile(bits, chunk):
    threads = 512 if bits < 64 else 256
    cases = ((chunk + 1, 1), (2 * chunk, 1), (2 * chunk + 1, 2), (8 * chunk, 3), (8 * chunk + 1, 4))
    for n, rounds in cases:
        p = rs.plan(3, n, bits)
        if bits == 16 and rounds >= rs.SEGMENTED_FROM_ROUNDS[16]:
            assert p.kind == "segmented" and rs.long_path_for(n, bits) == "segmented"
            continue
        chunks = -(-n // chunk)
        assert p == rs.Plan(rs.MERGE_PATH, rs.tile_kernel((threads, 16), chunks=True, bits=bits), 3 * chunks,
                            threads, rounds), n
        assert rs.plan(3, n, bits, long_path="merge") == p._replace(kind="merge")
        assert rs.plan(3, n, bits, long_path="block_merge") == p._replace(kind="block_merge")
        assert chunk << p.passes >= n > chunk << (p.passes - 1)  # the last round's runs cover the row
        assert rs.scratch_bytes(3, n, bits) == 2 * 3 * n * (bits // 8 + 4)
    assert rs.plan(3, chunk, bits).kind == "tile" and rs.scratch_bytes(3, chunk, bits) == 0


def test_the_merge_path_is_the_block_merge_and_unknown_paths_are_refused():
    assert rs.MERGE_PATH == "block_merge" and set(rs.LONG_PATHS) == {"block_merge", "merge", "segmented"}
    assert rs.long_path_for(20000, 32) == rs.long_path_for(20000, 64) == "block_merge"
    with pytest.raises(ValueError, match="long_path must be one of"):
        rs.plan(3, 20000, 32, long_path="radix")


@pytest.mark.parametrize("bits", [16, 32, 64])
def test_a_block_merge_window_never_spans_two_run_pairs(bits):
    # the kernel takes a window's run pair from its first output: the window (a power of two)
    # must divide 2 x the first round's run, the chunk, and so every later round's
    chunk = rs.chunk_tile(bits)[0] * rs.chunk_tile(bits)[1]
    window = rs.BMERGE_WINDOW
    assert window & (window - 1) == 0 and (2 * chunk) % window == 0
    assert rs.BMERGE_THREADS >= 64 and rs.BMERGE_THREADS % 32 == 0  # warps 0 and 1 find the splits


@pytest.mark.parametrize("kind", ["block_merge", "merge"])
@pytest.mark.parametrize("bits", [16, 32, 64])
def test_merge_rounds_double_the_run_and_the_last_writes_the_results(kind, bits):
    chunk = rs.chunk_tile(bits)[0] * rs.chunk_tile(bits)[1]
    n, rows = 8 * chunk + 5, 7
    p = rs.plan(rows, n, bits, long_path=kind)
    rounds = rs.merge_rounds(kind, rows, n, bits, p.passes)
    assert len(rounds) == p.passes == 4
    assert [run for *_, run in rounds] == [chunk, 2 * chunk, 4 * chunk, 8 * chunk]
    stem = "bmerge" if kind == "block_merge" else "merge"
    assert [name for name, *_ in rounds] == [f"sort_{stem}_k{bits}"] * 3 + [f"sort_{stem}_final"]
    names = set(rs.FAMILY_OF)
    assert all(f"sort_{stem}_k{bits}" in names for _ in rounds)
    assert all(f"sort_{stem}_final_{suffix}" in names for suffix in rs.SUFFIXES)
    for _, grid, threads, _ in rounds:
        if kind == "block_merge":
            assert (grid, threads) == (rows * -(-n // rs.BMERGE_WINDOW), rs.BMERGE_THREADS)
        else:
            assert (grid, threads) == (-(-rows * -(-n // rs.MERGE_ITEMS) // rs.STREAM_THREADS), rs.STREAM_THREADS)
    assert rs.merge_rounds("block_merge", 1 << 40, n, bits, 1)[0][1] == rs.MAX_GRID


@pytest.mark.parametrize("bits", [16, 32])
def test_the_merge_network_takes_the_smallest_lane_share_when_asked(bits):
    for n, items in ((1, 4), (33, 4), (128, 4), (129, 8), (256, 8), (257, 16), (512, 16), (513, 32), (1024, 32)):
        assert rs.network_items(n, bits) == items
        p = rs.plan(1000, n, bits, network=True)
        assert p == rs.Plan("network", f"sort_net_{rs.NETWORK_EXCHANGE}_{items}", -(-1000 // (rs.NET_THREADS // 32)),
                            rs.NET_THREADS, 0)
        for exchange in rs.NETWORK_EXCHANGES:
            assert rs.plan(1000, n, bits, network=exchange) == p._replace(kernel=f"sort_net_{exchange}_{items}")
            assert f"sort_net_{exchange}_{items}_f32" in rs.FAMILY_OF
        assert rs.scratch_bytes(1000, n, bits) == 0
    assert rs.network_items(1025, bits) is None and rs.network_items(100, 64) is None
    with pytest.raises(ValueError, match="no merge network sorts rows of 1025 keys"):
        rs.plan(3, 1025, bits, network=True)
    with pytest.raises(ValueError, match="no merge network sorts rows of 100 keys 64 bits"):
        rs.plan(3, 100, 64, network=True)
    with pytest.raises(ValueError, match="network must be a bool or one of"):
        rs.plan(3, 100, bits, network="bitonic")
    assert rs.NETWORK_EXCHANGE in rs.NETWORK_EXCHANGES
    assert rs.plan(1 << 40, 1000, bits, network=True).blocks == rs.MAX_GRID
    assert rs.plan(3, 1000, bits, network=False).kind == "tile"


def test_the_network_table_decides_which_rows_take_it(monkeypatch):
    assert set(rs.NETWORK_MAX) == {16, 32, 64} and rs.NETWORK_MAX[64] == 0
    assert all(v <= 32 * rs.NETWORK_ITEMS[-1] for v in rs.NETWORK_MAX.values())
    monkeypatch.setitem(rs.NETWORK_MAX, 32, 1024)
    assert rs.plan(5, 1024, 32).kind == "network" and rs.plan(5, 1025, 32).kind == "tile"
    assert rs.plan(5, 32, 32).kind == "warp"  # the lane groups keep the shortest rows
    assert rs.plan(5, 1024, 32, tile=(128, 8)).kind == "tile"  # a tile asked for is a tile
    assert rs.plan(5, 1024, 32, network=False).kind == "tile"
    monkeypatch.setitem(rs.NETWORK_MAX, 32, 0)
    assert rs.plan(5, 1024, 32).kind == "tile"


@pytest.mark.parametrize("bits,passes", [(16, 3), (32, 6), (64, 11)])
def test_the_segmented_alternative_takes_one_pass_a_digit(bits, passes):
    n = 8193 if bits < 64 else 4097
    p = rs.plan(3, n, bits, long_path="segmented")
    assert p == rs.Plan("segmented", f"sort_pass_k{bits}", 3, rs.SEGMENT_THREADS, passes)
    assert rs.plan(3, n - 1, bits, long_path="segmented").kind == "tile"
    assert rs.scratch_bytes(3, n, bits, "segmented") == 2 * 3 * n * (bits // 8 + 4)
    assert passes * rs.RADIX_BITS >= bits > (passes - 1) * rs.RADIX_BITS


def test_grids_are_capped_and_the_kernels_loop_over_rows():
    assert rs.plan(1 << 40, 1024, 32).blocks == rs.MAX_GRID
    assert rs.plan(1 << 40, 5, 32).blocks == rs.MAX_GRID
    assert rs.plan(1 << 30, 70000, 32).blocks == rs.MAX_GRID


def test_tiles_hold_16_bit_positions_and_grow():
    for tiles in (rs.TILES, rs.WIDE_TILES):
        sizes = [t * i for t, i in tiles]
        assert sizes == sorted(set(sizes)) and sizes[-1] < 1 << 16
        assert set(tiles) <= set(rs.TILE_CANDIDATES)
    assert set(rs.WIDE_TILES) <= set(rs.WIDE_CANDIDATES)
    assert all(t % 32 == 0 for t, _ in rs.TILE_CANDIDATES)
    assert set(rs.RANKING) == set(rs.TILE_CANDIDATES) and set(rs.RANKING.values()) <= set(rs.RANKINGS)
    assert set(rs.WIDE_RANKING) == set(rs.WIDE_CANDIDATES) and set(rs.WIDE_RANKING.values()) <= set(rs.RANKINGS)
    assert {rs.long_path_for(n, bits) for n in (8193, 1 << 20) for bits in (16, 32, 64)} <= set(rs.LONG_PATHS)


def test_table_names_every_entry_of_the_kernel_file():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "sorting.cu")) as f:
        source = f.read()
    common = re.search(r"#define RAWOPS_SORT_TILES_UP_TO_4096.*?\n\n", source, flags=re.S).group(0)
    narrow = common + re.search(r"#define RAWOPS_SORT_TILES_NARROW.*?\n\n", source, flags=re.S).group(0)
    wide = common + re.search(r"#define RAWOPS_SORT_TILES_WIDE.*?\n\n", source, flags=re.S).group(0)
    pairs = r"RAWOPS_SORT_TILE_PAIR\(T, suffix, (\d+), (\d+)\)"
    assert [(int(t), int(i)) for t, i in re.findall(pairs, narrow)] == list(rs.TILE_CANDIDATES)
    assert [(int(t), int(i)) for t, i in re.findall(pairs, wide)] == list(rs.WIDE_CANDIDATES)
    chunks = r"RAWOPS_SORT_CHUNKS\(T, suffix, (\d+), (\d+)\)"
    assert [(int(t), int(i)) for t, i in re.findall(chunks, narrow)] == [rs.TILES[-1]]
    assert [(int(t), int(i)) for t, i in re.findall(chunks, wide)] == [rs.WIDE_TILES[-1]]
    nets = r"RAWOPS_SORT_NET\(T, suffix, (\d+)\)"
    assert tuple(int(i) for i in re.findall(nets, narrow)) == rs.NETWORK_ITEMS and not re.findall(nets, wide)
    instantiated = re.findall(r"^RAWOPS_SORT_TILES_(NARROW|WIDE)\([\w ]+,\s*(\w+)\)", source, flags=re.M)
    assert tuple(s for _, s in instantiated) == rs.SUFFIXES
    assert [s for kind, s in instantiated if kind == "WIDE"] == ["i64"]
    for kind in ("PASS", "MERGE", "BMERGE"):
        found = re.findall(rf"^RAWOPS_SORT_{kind}\([\w ]+,\s*(k\d+)\)", source, flags=re.M)
        assert found == ["k16", "k32", "k64"]


def test_launch_kinds_match_the_kernel_signatures():
    # the generic launcher marshals one slot per kind: a count or type mismatch passes garbage
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "sorting.cu")) as f:
        source = re.sub(r"\\\n", " ", f.read())
    args = re.search(r"#define RAWOPS_SORT_ARGS\(T\)\s*(.*?)\n", source).group(1)
    source = source.replace("RAWOPS_SORT_ARGS(T)", args)
    # (the tiles' bounds through RAWOPS_SORT_TILE_BOUNDS: __launch_bounds__ unless a dev build caps registers)
    signatures = re.findall(r'extern "C" __global__ void (?:__launch_bounds__|RAWOPS_SORT_TILE_BOUNDS)\([^)]*\)\s*'
                            r'([\w#]+)\(([^)]*)\)', source)
    kinds = {"sort_bmerge_final_": rs.BMERGE_FINAL_KINDS, "sort_bmerge_": rs.MERGE_KINDS,
             "sort_merge_final_": rs.MERGE_FINAL_KINDS, "sort_merge_": rs.MERGE_KINDS, "sort_net_": rs.ROWS_KINDS,
             "sort_warp_": rs.ROWS_KINDS, "sort_rows_": rs.ROWS_KINDS, "sort_chunks_": rs.ROWS_KINDS,
             "sort_keys_": rs.KEYS_KINDS, "sort_gather_": rs.GATHER_KINDS, "sort_pass_": rs.PASS_KINDS}
    seen = set()
    for name, params in signatures:
        prefix = next(k for k in kinds if name.startswith(k))
        seen.add(prefix)
        expected = "".join("p" if "*" in p else "q" for p in params.split(","))
        assert kinds[prefix] == expected, f"{name}: launch kinds {kinds[prefix]!r}, signature {expected!r}"
    assert seen == set(kinds)


# ------------------------------------------------------------------------------ checks, no GPU
def _fake(shape=(4, 16), typestr="<f4", **kw):
    return FakeCAI(shape, typestr, **kw)


@pytest.mark.parametrize("op", [rs.sort, rs.argsort])
@pytest.mark.parametrize("typestr", list(TYPESTRS.values()))
def test_valid_calls_pass_validation(op, typestr):
    assert_passes_validation(op, _fake(typestr=typestr))
    assert_passes_validation(op, _fake(typestr=typestr), dim=0, descending=True, stable=True)
    assert_passes_validation(op, _fake((3, 70000), typestr))
    assert_passes_validation(op, _fake((), typestr), dim=-1)


@pytest.mark.parametrize("op", [rs.sort, rs.argsort])
@pytest.mark.parametrize("typestr,words", [("|b1", "|b1"), ("<f8", "<f8"), ("<c8", "<c8"), ("|u1", "uint8"),
                                           ("<u2", "uint16"), ("<i2", "<i2")])
def test_unsupported_dtypes_are_refused_naming_x(op, typestr, words):
    name = op.__name__
    with pytest.raises(TypeError, match=f"x has dtype .*{re.escape(words)}.*; {name} supports float32"):
        op(_fake(typestr=typestr))


@pytest.mark.parametrize("shape,dim", [((4, 16), 2), ((4, 16), -3), ((16,), 1), ((), 1), ((), -2)])
def test_dim_out_of_range_is_refused(shape, dim):
    with pytest.raises(ValueError, match=f"dim {dim} is out of range"):
        rs.sort(_fake(shape), dim=dim)


def test_scalar_arguments_are_checked():
    with pytest.raises(TypeError, match="dim must be an int"):
        rs.sort(_fake(), dim=1.0)
    with pytest.raises(TypeError, match="dim must be an int"):
        rs.sort(_fake(), dim=True)
    with pytest.raises(TypeError, match="descending must be a bool"):
        rs.sort(_fake(), descending=1)
    with pytest.raises(TypeError, match="stable must be a bool"):
        rs.argsort(_fake(), stable=None)


def test_misaligned_pointer_is_refused():
    with pytest.raises(ValueError, match="misaligned"):
        rs.sort(_fake(ptr=0x100000000002))


def test_host_arrays_are_refused():
    with pytest.raises(TypeError, match="host"):
        rs.sort(np.zeros((4, 16), np.float32))
    with pytest.raises(TypeError, match="GPU array"):
        rs.argsort([3, 1, 2])


def test_row_strided_views_pass_and_other_layouts_are_refused_naming_x():
    # a row-strided view is read as it is; a transpose along the last dim is refused (no hidden
    # copy), and along dim 0 it is the documented moved copy
    assert_passes_validation(rs.sort, _fake((4, 16), strides=(128, 4)))
    with pytest.raises(ValueError, match="x is not row-strided"):
        rs.sort(_fake((4, 16), strides=(4, 64)))
    with pytest.raises(ValueError, match="x is not row-strided"):
        rs.argsort(_fake((4, 16), strides=(4, 64)), dim=-1)
    assert_passes_validation(rs.sort, _fake((4, 16), strides=(4, 64)), dim=0)


# the adapter's checks run before the device is looked at: CPU tensors show them
def test_adapter_checks_name_the_argument():
    import rawops.torch_adapter.sorting as ta

    x = torch.zeros(4, 16)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        ta.sort(np.zeros((4, 16)))
    for dtype in (torch.bool, torch.float64, torch.complex64, torch.uint8, torch.int16):
        with pytest.raises(TypeError, match=f"input has dtype {dtype}; sort supports"):
            ta.sort(x.to(dtype))
        with pytest.raises(TypeError, match=f"input has dtype {dtype}; argsort supports"):
            ta.argsort(x.to(dtype))
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        ta.sort(x, 2)
    with pytest.raises(IndexError, match="dim 1 is out of range"):
        ta.sort(torch.zeros(()), 1)
    with pytest.raises(TypeError, match="dim must be an int"):
        ta.argsort(x, 0.0)
    with pytest.raises(TypeError, match="descending must be a bool"):
        ta.sort(x, -1, None)
    with pytest.raises(TypeError, match="stable must be a bool"):
        ta.sort(x, stable=1)
    with pytest.raises(ValueError, match="input is on cpu"):
        ta.sort(x)
    with pytest.raises(TypeError):  # stable is keyword-only, as in torch.sort
        ta.sort(x, -1, False, True)


def test_adapter_signatures_are_torchs():
    import inspect

    import rawops.torch_adapter.sorting as ta

    for ours, name in ((ta.sort, "sort"), (ta.argsort, "argsort")):
        params = inspect.signature(ours).parameters
        assert list(params) == ["input", "dim", "descending", "stable"], name
        assert params["stable"].kind is inspect.Parameter.KEYWORD_ONLY
        assert (params["dim"].default, params["descending"].default, params["stable"].default) == (-1, False, False)


# ------------------------------------------------------------------------------ GPU
def _data(rows, n, dtype, kind="random"):
    """Fresh data in dtype: "random" (normal floats, ints over a range as wide as the row),
    "ties" (a handful of distinct values), "special" (floats: NaN, +-inf, +-0.0 among ties),
    "bits" (floats: every bit pattern equally likely, NaN payloads and subnormals included)."""
    g = torch.Generator(device="cuda")
    g.seed()
    if dtype.is_floating_point and kind == "bits":
        wide = dtype == torch.float32
        raw = torch.randint(-(1 << 31) if wide else -(1 << 15), (1 << 31) if wide else (1 << 15), (rows, n),
                            device="cuda", generator=g, dtype=torch.int32 if wide else torch.int16)
        return raw.view(dtype)
    if dtype.is_floating_point:
        if kind == "random":
            return torch.randn(rows, n, device="cuda", generator=g).to(dtype)
        x = torch.randint(-3, 4, (rows, n), device="cuda", generator=g).to(dtype)
        if kind == "special":
            pick = torch.randint(0, 8, (rows, n), device="cuda", generator=g)
            specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, float("nan")],
                                    device="cuda").to(dtype)
            x = torch.where(pick < 6, specials[pick.clamp(max=5)], x)
        return x
    info = torch.iinfo(dtype)
    if kind == "random":  # int64: 2**62 either side (randint's range must fit an int64)
        bound = 1 << min(info.bits - 1, 62)
        return torch.randint(-bound, bound, (rows, n), device="cuda", generator=g, dtype=dtype)
    x = torch.randint(-3, 4, (rows, n), device="cuda", generator=g, dtype=dtype)
    if kind == "special":  # the extremes, whose keys sit next to the padding's
        pick = torch.randint(0, 8, (rows, n), device="cuda", generator=g)
        x = torch.where(pick == 0, info.max, torch.where(pick == 1, info.min, x))
    return x


def _bits(t):
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return t.view(view[t.dtype]) if t.dtype in view else t


def check_sort(x, dim, descending, values, indices, what=""):
    """indices equal torch's stable sort's; values are x gathered at them, bit for bit. torch's
    sort runs on every NaN made the positive quiet NaN: torch's CUDA radix path places a NaN whose
    sign bit is set first ascending (pytorch/pytorch#190781), its CPU sort and docs after +inf, as
    rawops does ("bits" data has such NaNs)."""
    canonical = torch.where(torch.isnan(x), torch.full_like(x, float("nan")), x) if x.is_floating_point() else x
    ref = torch.sort(canonical, dim=dim, descending=descending, stable=True)
    assert indices.dtype == torch.int64 and indices.shape == x.shape, what
    assert torch.equal(indices, ref.indices), f"{what}: indices differ from torch.sort(stable=True)'s"
    if values is not None:
        assert values.dtype == x.dtype and values.shape == x.shape, what
        assert torch.equal(_bits(values), _bits(x.gather(dim, indices) if x.dim() else x)), f"{what}: values"


def _poison(*tensors_like):
    from gpu_reference import poison_pool

    poison_pool(*[t.numel() * t.element_size() for t in tensors_like])
    poison_pool(*[t.numel() * 8 for t in tensors_like])


LENGTHS = [1, 2, 3, 5, 16, 31, 32, 33, 100, 128, 129, 1000, 1024, 1025, 2049, 4096, 4097, 8191, 8192, 8193, 70000]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "ties", "special"])
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_sort_matches_torch_at_every_row_length(dtype, kind):
    import cupy

    dt = KEY_DTYPES[dtype]
    for n in LENGTHS:
        rows = 3 if n > 8192 else 37
        x = _data(rows, n, dt, kind)
        for descending in (False, True):
            what = f"{dtype} {kind} n={n} descending={descending}"
            _poison(x)
            values, indices = rs.sort(cupy.from_dlpack(x), descending=descending)
            assert isinstance(values, cupy.ndarray) and isinstance(indices, cupy.ndarray)
            check_sort(x, -1, descending, torch.from_dlpack(values), torch.from_dlpack(indices), what)
            _poison(x)
            only = rs.argsort(cupy.from_dlpack(x), descending=descending, stable=True)
            check_sort(x, -1, descending, None, torch.from_dlpack(only), what + " argsort")


def _launch(x, descending, **choice):
    """rs.launch_sort on a dense CUDA tensor's rows with another choice than the tables' (the
    outputs filled with garbage first, the scratch from torch)."""
    rows, n = x.shape
    values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64, device="cuda")
    values.view(torch.uint8).fill_(0xFF), indices.fill_(-1)
    held = []

    def scratch(nbytes):
        held.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF))
        return held[-1].data_ptr()

    rs.launch_sort(0, rs.KEY_TYPES[str(x.dtype).replace("torch.", "")][0], x.data_ptr(), values.data_ptr(),
                   indices.data_ptr(), rows, n, n, descending, torch.cuda.current_stream().cuda_stream, scratch,
                   **choice)
    return values, indices


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_every_tile_in_both_rankings(dtype):
    # the plan takes one tile a size and one ranking a tile; the others are launched here, so
    # that the benchmark's choice may be any of them
    dt = KEY_DTYPES[dtype]
    wide = rs.BITS_OF[rs.KEY_TYPES[dtype][0]] == 64
    for tile in rs.WIDE_CANDIDATES if wide else rs.TILE_CANDIDATES:
        for n in (tile[0] * tile[1] - 3, tile[0] * tile[1] // 2 + 1):
            for kind in ("random", "special"):
                x = _data(5, n, dt, kind)
                for ranking in rs.RANKINGS:
                    for descending in (False, True):
                        values, indices = _launch(x, descending, ranking=ranking, tile=tile)
                        check_sort(x, -1, descending, values, indices, f"{dtype} {tile} {ranking} {kind} n={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_every_long_row_path_and_both_chunk_rankings(dtype):
    dt = KEY_DTYPES[dtype]
    chunk = (rs.WIDE_TILES if rs.BITS_OF[rs.KEY_TYPES[dtype][0]] == 64 else rs.TILES)[-1]
    chunk = chunk[0] * chunk[1]
    for n in (chunk + 1, 2 * chunk, 2 * chunk + 7, 5 * chunk - 1, 70000):
        for kind in ("random", "ties", "special"):
            x = _data(2, n, dt, kind)
            for descending in (False, True):
                for choice in ({"long_path": "segmented"}, {"long_path": "merge", "ranking": "match"},
                               {"long_path": "merge", "ranking": "early"}, {"long_path": "block_merge"},
                               {"long_path": "block_merge", "ranking": "early"}):
                    values, indices = _launch(x, descending, **choice)
                    check_sort(x, -1, descending, values, indices, f"{dtype} {choice} {kind} n={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_block_merge_windows_ties_and_many_rows(dtype):
    # windows that end inside runs of equal keys (two distinct values: every split is a tie),
    # rows of a few windows past a chunk and up to 2**17, more rows than one wave of blocks, and
    # the block merge's output equal to the thread merge's
    dt = KEY_DTYPES[dtype]
    chunk = (rs.WIDE_TILES if rs.BITS_OF[rs.KEY_TYPES[dtype][0]] == 64 else rs.TILES)[-1]
    chunk = chunk[0] * chunk[1]
    for rows, n in ((300, chunk + rs.BMERGE_WINDOW + 1), (2, 3 * chunk + rs.BMERGE_WINDOW - 1), (1, 1 << 17)):
        two = torch.randint(0, 2, (rows, n), device="cuda").to(dt)
        for x in (two, _data(rows, n, dt, "special"), _data(rows, n, dt, "bits" if dt.is_floating_point else "random")):
            for descending in (False, True):
                values, indices = _launch(x, descending, long_path="block_merge")
                check_sort(x, -1, descending, values, indices, f"{dtype} block_merge {rows}x{n}")
                thread_values, thread_indices = _launch(x, descending, long_path="merge")
                assert torch.equal(indices, thread_indices) and torch.equal(_bits(values), _bits(thread_values))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [d for d in KEY_DTYPES if d != "int64"])
def test_the_merge_network_at_every_lane_share(dtype):
    # every compiled network at full, half and odd lengths, the shortest rows too; ties, NaN,
    # +-inf, -0/+0 and the integer extremes (keys beside the padding's); equal to the tile path
    dt = KEY_DTYPES[dtype]
    lengths = {1, 2, 31, 33} | {n for items in rs.NETWORK_ITEMS for n in (16 * items + 1, 32 * items - 3, 32 * items)}
    assert {rs.network_items(n, 32) for n in lengths} == set(rs.NETWORK_ITEMS)
    for n in sorted(lengths):
        for kind in ("random", "ties", "special") + (("bits",) if dt.is_floating_point else ()):
            x = _data(517, n, dt, kind)
            for descending in (False, True):
                for exchange in rs.NETWORK_EXCHANGES:
                    values, indices = _launch(x, descending, network=exchange)
                    check_sort(x, -1, descending, values, indices, f"{dtype} network {exchange} {kind} n={n}")
                if n > rs.WARP_MAX:
                    tile_values, tile_indices = _launch(x, descending, network=False)
                    assert torch.equal(indices, tile_indices) and torch.equal(_bits(values), _bits(tile_values))


@pytest.mark.gpu
def test_the_merge_network_through_the_api(monkeypatch):
    # the table switched on: the CuPy API and the adapter take the network (argsort too)
    import cupy

    import rawops.torch_adapter.sorting as ta

    monkeypatch.setitem(rs.NETWORK_MAX, 32, 1024)
    monkeypatch.setitem(rs.NETWORK_MAX, 16, 1024)
    for dt in (torch.float32, torch.bfloat16, torch.int32):
        x = _data(333, 1000, dt, "special")
        for descending in (False, True):
            values, indices = rs.sort(cupy.from_dlpack(x), descending=descending)
            check_sort(x, -1, descending, torch.from_dlpack(values), torch.from_dlpack(indices), f"{dt} api")
            result = ta.sort(x, -1, descending)
            check_sort(x, -1, descending, result.values, result.indices, f"{dt} adapter")
            check_sort(x, -1, descending, None, ta.argsort(x, -1, descending), f"{dt} adapter argsort")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_all_equal_rows_keep_their_order(dtype):
    import cupy

    dt = KEY_DTYPES[dtype]
    for n in (7, 32, 1000, 8192, 20000):
        x = torch.full((4, n), 3, dtype=dt, device="cuda")
        for descending in (False, True):
            values, indices = rs.sort(cupy.from_dlpack(x), descending=descending)
            assert torch.equal(torch.from_dlpack(indices), torch.arange(n, device="cuda").expand(4, n))
            assert torch.equal(torch.from_dlpack(values), x)


@pytest.mark.gpu
def test_nan_last_ascending_first_descending_and_signed_zeros_kept():
    import cupy

    x = torch.tensor([[float("nan"), 1.0, -0.0, float("-inf"), 0.0, float("inf"), -float("nan"), -0.0, 2.0]],
                     device="cuda")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        xt = x.to(dt)
        values, indices = rs.sort(cupy.from_dlpack(xt))
        assert torch.from_dlpack(indices).tolist() == [[3, 2, 4, 7, 1, 8, 5, 0, 6]]
        assert torch.equal(_bits(torch.from_dlpack(values)), _bits(xt[:, [3, 2, 4, 7, 1, 8, 5, 0, 6]]))
        values, indices = rs.sort(cupy.from_dlpack(xt), descending=True)
        assert torch.from_dlpack(indices).tolist() == [[0, 6, 5, 8, 1, 2, 4, 7, 3]]


@pytest.mark.gpu
def test_empty_and_zero_dim_and_length_one():
    import cupy

    for shape in [(0, 5), (5, 0), (0,), (3, 0, 4)]:
        x = cupy.empty(shape, dtype=cupy.float32)
        for dim in range(len(shape)):
            values, indices = rs.sort(x, dim=dim)
            assert values.shape == shape and indices.shape == shape and indices.dtype == cupy.int64
    x = torch.tensor(2.5, device="cuda")
    values, indices = rs.sort(cupy.from_dlpack(x))
    assert values.shape == () and float(values) == 2.5 and int(indices) == 0
    x = _data(1000, 1, torch.float32)
    values, indices = rs.sort(cupy.from_dlpack(x))
    assert torch.equal(torch.from_dlpack(values), x) and not torch.from_dlpack(indices).any()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5, 700, 9000])
def test_views_and_other_dims(n):
    import cupy

    base = _data(20, n + 24, torch.float32, "ties")
    with pytest.raises(ValueError, match="x is not row-strided"):  # refused before any launch
        rs.sort(cupy.from_dlpack(base[:, :n].t().contiguous().t()))
    for what, x in (("sliced columns", base[:, 24:]), ("every other row", base[::2, :n]),
                    ("row broadcast", base[:1, :n].expand(6, n))):
        xc = cupy.from_dlpack(x) if what != "row broadcast" else cupy.broadcast_to(cupy.from_dlpack(base[0, :n]),
                                                                                   (6, n))
        values, indices = rs.sort(xc, descending=True)
        assert values.flags.c_contiguous and indices.flags.c_contiguous
        check_sort(x, -1, True, torch.from_dlpack(values), torch.from_dlpack(indices), what)
    x3 = _data(n, 6, torch.bfloat16, "special").reshape(n, 2, 3)
    for dim in (0, 1, -2):
        values, indices = rs.sort(cupy.from_dlpack(x3), dim=dim)
        assert values.flags.c_contiguous
        check_sort(x3, dim, False, torch.from_dlpack(values), torch.from_dlpack(indices), f"dim {dim}")


@pytest.mark.gpu
def test_stream_argument_orders_the_launch():
    import cupy

    from gpu_reference import written_late

    source = _data(64, 5000, torch.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    x = written_late(source, stream)
    values, indices = rs.sort(cupy.from_dlpack(x), stream=stream)
    stream.synchronize()
    check_sort(source, -1, False, torch.from_dlpack(values), torch.from_dlpack(indices), "on stream")


# ------------------------------------------------------------------------------ torch adapter
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_adapter_matches_torch(dtype):
    import rawops.torch_adapter.sorting as ta
    from gpu_reference import poison_torch_pool

    dt = KEY_DTYPES[dtype]
    for shape, dim in (((67, 1000), -1), ((67, 1000), 0), ((9, 20000), 1), ((3, 4, 33), 1), ((5,), 0), ((), 0)):
        x = _data(1, int(np.prod(shape)), dt, "special").reshape(shape)
        for descending in (False, True):
            poison_torch_pool(x.numel() * x.element_size(), x.numel() * 8)
            result = ta.sort(x, dim, descending)
            assert isinstance(result, torch.return_types.sort)
            check_sort(x, dim, descending, result.values, result.indices, f"adapter {shape} dim={dim}")
            indices = ta.argsort(x, dim, descending, stable=True)
            check_sort(x, dim, descending, None, indices, f"adapter argsort {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [20, 1000, 10000])
def test_adapter_autograd_matches_torchs_backward(dtype, n):
    import rawops.torch_adapter.sorting as ta

    dt = KEY_DTYPES[dtype]
    x = _data(6, n, dt, "ties")
    for dim, descending in ((-1, False), (0, True)):
        leaf, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        grad = torch.randn(x.shape, device="cuda").to(dt)
        values, indices = ta.sort(leaf, dim, descending)
        values.backward(grad)
        expected = torch.sort(ref, dim=dim, descending=descending, stable=True)
        expected.values.backward(grad)
        assert torch.equal(indices, expected.indices)
        assert torch.equal(leaf.grad, ref.grad), f"grad, dim {dim}"
        assert not indices.requires_grad
        with torch.no_grad():
            assert torch.equal(ta.sort(x, dim, descending).values, values.detach())


@pytest.mark.gpu
def test_adapter_gradcheck():
    import rawops.torch_adapter.sorting as ta

    # values 0.5 apart: the finite differences never reorder them
    x = (torch.randperm(27, device="cuda").float() * 0.5).reshape(3, 9).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ta.sort(t, 1).values, (x,), eps=1e-2, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
def test_adapter_under_torch_compile_fullgraph():
    import rawops.torch_adapter.sorting as ta

    def f(x):
        values, indices = ta.sort(x * 2, -1, True)
        return values.sum(-1) + ta.argsort(x, 0).float().sum(0)[:1], indices

    compiled = torch.compile(f, fullgraph=True)
    x = _data(16, 300, torch.float32, "ties")
    leaf, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, indices = compiled(leaf)
    out.sum().backward()
    expected = torch.sort(ref * 2, dim=-1, descending=True, stable=True)
    (expected.values.sum(-1) + torch.argsort(ref, dim=0, stable=True).float().sum(0)[:1]).sum().backward()
    assert torch.equal(indices, expected.indices)
    assert torch.equal(leaf.grad, ref.grad)
