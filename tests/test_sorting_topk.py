"""topk (the sorting family's selection), through the CuPy API and the torch adapter, against
torch.topk: every argument check before a launch and the launch plan without a GPU; with one,
every key dtype on fresh random data, ties, NaN and infinities, both paths and both regimes of
the radix select, views, another dim, the adapter's autograd and torch.compile."""
import random as pyrandom

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rawops._sorting_topk as tk  # noqa: E402
import rawops.torch_adapter._sorting_topk as ta  # noqa: E402
from test_validation import FakeCAI, assert_passes_validation  # noqa: E402

H100_SMS = 132
TYPESTRS = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8"}
KEY_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
              "int32": torch.int32, "int64": torch.int64}


# ------------------------------------------------------------------------------ the plan
def test_plan_many_short_rows_small_k_take_a_warp_per_row():
    p = tk.plan(65536, 1024, 8, "float32", H100_SMS)
    assert p == tk.Plan("topk_warp", 65536 // 8, 256, 1)
    for k, dtype in ((1, "float32"), (9, "bfloat16"), (32, "int64")):
        assert tk.plan(65536, 1024, k, dtype, H100_SMS).kernel == "topk_warp"
    assert tk.plan(8 * H100_SMS, 31, 3, "float16", H100_SMS).blocks == H100_SMS


def test_plan_large_k_or_few_rows_take_the_radix_select():
    assert tk.plan(65536, 1024, 33, "float32", H100_SMS) == tk.Plan("topk_radix", 65536, 256, 1)
    assert tk.plan(1000, 1024, 8, "float32", H100_SMS) == tk.Plan("topk_radix", 1000, 256, 1)
    assert tk.plan(8 * H100_SMS - 1, 1024, 8, "float32", H100_SMS).kernel == "topk_radix"


def test_plan_few_long_rows_split_over_blocks():
    p = tk.plan(64, 128256, 50, "float32", H100_SMS)
    assert p.kernel == "topk_radix" and p.chunks == 9 and p.blocks == 64 * 9
    # chunks of at least MIN_CHUNK_BYTES: a 16-bit row holds twice the elements
    assert tk.plan(1, 128256, 50, "float16", H100_SMS).chunks == 128256 // (tk.MIN_CHUNK_BYTES // 2)
    assert tk.plan(1, 4099, 8, "float32", H100_SMS).chunks == 1  # too short to split
    assert tk.plan(1, 128256, 1024, "float32", H100_SMS).chunks == 128256 // 8192


def test_plan_chunks_always_hold_k_and_fill_the_grid():
    rng = pyrandom.Random(0)
    for _ in range(2000):
        rows, n = rng.randint(1, 5000), rng.randint(1, 1 << 20)
        k = rng.randint(1, min(n, tk.MAX_K))
        dtype = rng.choice(list(tk.ITEMSIZE))
        p = tk.plan(rows, n, k, dtype, H100_SMS)
        if p.kernel == "topk_radix":
            assert n // p.chunks >= k, (rows, n, k, dtype, p)  # the shortest chunk
            assert p.blocks == rows * p.chunks
            assert p.chunks == 1 or rows < tk.BLOCK_MIN_ROWS_PER_SM * H100_SMS
        else:
            assert p.kernel == "topk_warp" and k <= tk.WARP_MAX_K and p.chunks == 1
            assert p.blocks * tk.WARP_ROWS >= rows


def test_table_names_every_entry_of_the_kernel_file():
    import os
    import re

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "sorting_topk.cu")) as f:
        source = f.read()
    suffixes = re.findall(r"^RAWOPS_TOPK_FAMILY\([\w ]+,\s*(\w+)\)", source, flags=re.M)
    assert tuple(suffixes) == tk.SUFFIXES
    entries = set(re.findall(r"__global__ void __launch_bounds__\([^)]*\) (\w+)_##suffix\(", source))
    assert entries == set(tk.KERNELS)


# ------------------------------------------------------------------------------ checks, no GPU
def _fake(shape=(4, 16), typestr="<f4", **kw):
    return FakeCAI(shape, typestr, **kw)


@pytest.mark.parametrize("typestr", list(TYPESTRS.values()))
def test_valid_calls_pass_validation(typestr):
    assert_passes_validation(tk.topk, _fake(typestr=typestr), 3)
    assert_passes_validation(tk.topk, _fake(typestr=typestr), 16, dim=1, largest=False, sorted=False)
    assert_passes_validation(tk.topk, _fake((5, 16), typestr), 5, dim=0)


@pytest.mark.parametrize("k,error,words", [
    (17, ValueError, "k (17) is larger than the row length (16)"),
    (0, ValueError, "k must be at least 1"),
    (-1, ValueError, "k must be at least 1"),
    (2.0, TypeError, "k must be an int"),
    (True, TypeError, "k must be an int"),
    ("3", TypeError, "k must be an int"),
    (None, TypeError, "k must be an int"),
])
def test_bad_k_is_refused_before_launch(k, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        tk.topk(_fake(), k)


def test_k_past_1024_is_refused_naming_k():
    with pytest.raises(ValueError, match=r"k \(1025\) is larger than 1024"):
        tk.topk(_fake((2, 4096)), 1025)
    assert_passes_validation(tk.topk, _fake((2, 4096)), 1024)


def test_k_counts_along_dim():
    with pytest.raises(ValueError, match="row length"):
        tk.topk(_fake((4, 16)), 5, dim=0)


@pytest.mark.parametrize("typestr,words", [("|b1", "bool"), ("<f8", "<f8"), ("|u1", "uint8"), ("<u2", "uint16"),
                                           ("<i2", "<i2")])
def test_unsupported_dtypes_are_refused_naming_x(typestr, words):
    with pytest.raises(TypeError, match=f"x has dtype .*{words}"):
        tk.topk(_fake(typestr=typestr), 2)


@pytest.mark.parametrize("dim", [2, -3, 7])
def test_dim_out_of_range_is_refused(dim):
    with pytest.raises(ValueError, match=f"dim {dim} is out of range"):
        tk.topk(_fake(), 2, dim=dim)


def test_dim_must_be_an_int():
    with pytest.raises(TypeError, match="dim must be an int"):
        tk.topk(_fake(), 2, dim=1.0)


def test_largest_and_sorted_must_be_bools():
    with pytest.raises(TypeError, match="largest must be a bool"):
        tk.topk(_fake(), 2, largest=1)
    with pytest.raises(TypeError, match="sorted must be a bool"):
        tk.topk(_fake(), 2, sorted="yes")


def test_zero_dim_array_is_refused():
    with pytest.raises(ValueError, match="at least one dimension"):
        tk.topk(_fake(()), 1)


def test_layouts_that_are_not_row_strided_are_refused_along_the_last_dim():
    # a transpose along the last dim: the row kernels cannot read it in place
    with pytest.raises(ValueError, match="not row-strided"):
        tk.topk(_fake((4, 16), strides=(4, 64)), 2)
    # the same layout along dim 0 is copied first (documented): it passes validation
    assert_passes_validation(tk.topk, _fake((4, 16), strides=(4, 64)), 2, dim=0)


def test_misaligned_pointer_is_refused():
    with pytest.raises(ValueError, match="misaligned"):
        tk.topk(_fake(ptr=0x100000000002), 2)


def test_host_arrays_are_refused():
    with pytest.raises(TypeError, match="host"):
        tk.topk(np.zeros((4, 16), np.float32), 2)


# the adapter's checks run before the device is looked at: CPU tensors show them
def test_adapter_checks_name_the_argument():
    x = torch.zeros(4, 16)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        ta.topk(np.zeros((4, 16)), 2)
    with pytest.raises(TypeError, match="input has dtype torch.bool"):
        ta.topk(x.bool(), 2)
    with pytest.raises(TypeError, match="input has dtype torch.float64"):
        ta.topk(x.double(), 2)
    with pytest.raises(ValueError, match=r"k \(17\) is larger than the row length"):
        ta.topk(x, 17)
    with pytest.raises(ValueError, match="k must be at least 1"):
        ta.topk(x, 0)
    with pytest.raises(TypeError, match="k must be an int"):
        ta.topk(x, 2.5)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        ta.topk(x, 2, dim=2)
    with pytest.raises(TypeError, match="largest must be a bool"):
        ta.topk(x, 2, largest=None)
    with pytest.raises(ValueError, match="input is on cpu"):
        ta.topk(x, 2)


# ------------------------------------------------------------------------------ GPU
def _bits(t):
    """t's bit patterns (exact comparison, NaN included)."""
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return t.view(view[t.dtype]) if t.dtype in view else t


def _same_values(a, b):
    """a == b elementwise, NaN equal to NaN, -0.0 to +0.0."""
    if a.dtype.is_floating_point:
        nan = torch.isnan(a)
        return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])
    return torch.equal(a, b)


def check_topk(x, k, dim, largest, sorted, values, indices, what=""):
    """values / indices (torch tensors) are a topk of x along dim: shapes and dtypes, each index
    gathering its value, no index twice, the multiset of torch.topk's values (in its order
    when sorted)."""
    what = f"{what} {tuple(x.shape)} k={k} dim={dim} largest={largest} sorted={sorted} {x.dtype}"
    shape = list(x.shape)
    shape[dim] = k
    assert tuple(values.shape) == tuple(shape) and tuple(indices.shape) == tuple(shape), what
    assert values.dtype == x.dtype and indices.dtype == torch.int64, what
    if values.numel() == 0:
        return
    n = x.shape[dim]
    assert int(indices.min()) >= 0 and int(indices.max()) < n, f"{what}: index out of range (unwritten?)"
    assert torch.equal(_bits(x.gather(dim, indices)), _bits(values)), f"{what}: values do not gather from indices"
    ordered = indices.sort(dim).values
    assert bool((ordered.diff(dim=dim) > 0).all()), f"{what}: an index taken twice"
    ref = torch.topk(x, k, dim, largest, True).values
    if sorted:
        assert _same_values(values, ref), f"{what}: sorted values differ from torch.topk's"
    else:
        assert _same_values(values.sort(dim, descending=largest).values, ref), f"{what}: another set of values"


def _cupy_topk(x, k, dim=-1, largest=True, sorted=True):
    from gpu_reference import poison_pool, to_cupy, to_torch

    count = x.numel() // max(x.shape[dim], 1) * k if x.dim() else k
    poison_pool(count * x.element_size(), count * 8)
    v, i = tk.topk(to_cupy(x), k, dim, largest, sorted)
    return to_torch(v), to_torch(i)


def _fresh(shape, dtype, ties=False):
    """Fresh random keys: normal floats (ties=False: few repeats), or integers in a small range
    (many ties), in any key dtype."""
    if ties:
        return torch.randint(-3, 4, shape, device="cuda").to(dtype)
    if dtype in (torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, device="cuda", dtype=dtype)
    return (torch.randn(shape, device="cuda") * 100).to(dtype)


ROW_COUNTS = (0, 1, 3, 64, 1000)
ROW_LENGTHS = (1, 2, 31, 1000, 1024, 4099, 128256)
KS = (1, 2, 8, 50, 64, 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_matches_torch_topk_on_every_shape(dtype, largest):
    dt = KEY_DTYPES[dtype]
    for n in ROW_LENGTHS:
        for rows in ROW_COUNTS:
            if rows * n > 64 * 128256:
                continue
            x = _fresh((rows, n), dt)
            for k in sorted({k for k in KS + (n,) if k <= min(n, tk.MAX_K)}):
                v, i = _cupy_topk(x, k, -1, largest, True)
                check_topk(x, k, 1, largest, True, v, i, "cupy")
            k = min(n, 50)
            v, i = _cupy_topk(x, k, -1, largest, False)
            check_topk(x, k, 1, largest, False, v, i, "cupy")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_warp_path_many_rows(dtype):
    import cupy
    from rawops._launch import sm_count

    dt = KEY_DTYPES[dtype]
    sms = sm_count(cupy.cuda.Device().id)
    rows = tk.WARP_MIN_ROWS_PER_SM * sms + 3
    for n in (1, 2, 31, 33, 1000, 1024, 4099):
        for ties in (False, True):
            x = _fresh((rows, n), dt, ties)
            for k in sorted({1, 2, 5, 8, 16, 17, 32, n} & set(range(1, min(n, 32) + 1))):
                assert tk.plan(rows, n, k, dtype, sms).kernel == "topk_warp"
                for largest in (True, False):
                    v, i = _cupy_topk(x, k, -1, largest, True)
                    check_topk(x, k, 1, largest, True, v, i, f"warp ties={ties}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_split_rows_with_ties(dtype):
    dt = KEY_DTYPES[dtype]
    for rows, n in ((1, 128256), (3, 200000), (64, 128256)):
        for ties in (False, True):
            x = _fresh((rows, n), dt, ties)
            for k in (1, 50, 1024):
                for largest in (True, False):
                    v, i = _cupy_topk(x, k, -1, largest, True)
                    check_topk(x, k, 1, largest, True, v, i, f"split ties={ties}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_nan_infinities_and_signed_zeros(dtype):
    dt = KEY_DTYPES[dtype]
    for rows, n in ((2048, 100), (5, 1000), (2, 70000)):
        x = _fresh((rows, n), dt)
        special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], device="cuda").to(dt)
        where = torch.rand(rows, n, device="cuda") < 0.2
        x[where] = special[torch.randint(0, 5, (int(where.sum()),), device="cuda")]
        x[0] = float("nan")  # a row of NaN only
        x[1, :n // 2] = -0.0
        x[1, n // 2:] = 0.0
        for k in (1, 7, 32, 50, min(n, 1024)):
            for largest in (True, False):
                v, i = _cupy_topk(x, k, -1, largest, True)
                check_topk(x, k, 1, largest, True, v, i, "special")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_all_equal_rows(dtype):
    dt = KEY_DTYPES[dtype]
    for rows, n in ((2048, 64), (7, 4099), (1, 128256)):
        x = torch.full((rows, n), 5, device="cuda").to(dt)
        for k in (1, 8, 32, min(n, 1024)):
            v, i = _cupy_topk(x, k, -1, True, True)
            check_topk(x, k, 1, True, True, v, i, "all equal")


@pytest.mark.gpu
def test_extreme_integers():
    for dt in (torch.int32, torch.int64):
        info = torch.iinfo(dt)
        x = torch.tensor([[info.min, info.max, 0, -1, 1, info.max, info.min] * 10] * 3, device="cuda", dtype=dt)
        for k in (1, 2, 3, 70):
            for largest in (True, False):
                v, i = _cupy_topk(x, k, -1, largest, True)
                check_topk(x, k, 1, largest, True, v, i, "extremes")


@pytest.mark.gpu
def test_views_are_read_in_place_and_other_dims_copied():
    from gpu_reference import to_cupy, to_torch

    wide = _fresh((64, 1030), torch.float32)
    many = _fresh((4096, 1030), torch.float16)  # the warp path
    for x in (wide[:, 3:1027], wide[::2, :1000], wide[5, 1:], many[:, 3:1027], many[::2, 1:]):
        for k in (1, 8, 50):
            v, i = tk.topk(to_cupy(x), k)
            check_topk(x, k, x.dim() - 1, True, True, to_torch(v), to_torch(i), "view")
    x = _fresh((30, 7, 1000), torch.bfloat16)
    for dim in (0, 1, -2):
        k = min(x.shape[dim], 5)
        v, i = tk.topk(to_cupy(x), k, dim)
        assert v.flags.c_contiguous and i.flags.c_contiguous
        check_topk(x, k, dim % 3, True, True, to_torch(v), to_torch(i), "dim")


@pytest.mark.gpu
def test_runs_on_the_given_stream():
    import cupy
    from gpu_reference import to_cupy, to_torch, written_late

    source = _fresh((64, 128256), torch.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    x = written_late(source, stream)
    v, i = tk.topk(to_cupy(x), 50, stream=stream)
    stream.synchronize()
    check_topk(source, 50, 1, True, True, to_torch(v), to_torch(i), "stream")


# ------------------------------------------------------------------------------ the adapter
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(KEY_DTYPES))
def test_adapter_matches_torch(dtype):
    from gpu_reference import poison_torch_pool

    dt = KEY_DTYPES[dtype]
    for shape, dim, k in (((4096, 300), -1, 8), ((64, 128256), 1, 50), ((5, 6, 7), 0, 3), ((3, 1000), -1, 1000)):
        x = _fresh(shape, dt)
        for largest in (True, False):
            out_shape = list(shape)
            out_shape[dim] = k
            count = int(np.prod(out_shape))
            poison_torch_pool(count * x.element_size(), count * 8)
            result = ta.topk(x, k, dim, largest)
            assert type(result) is torch.return_types.topk
            check_topk(x, k, dim % x.dim(), largest, True, result.values, result.indices, "adapter")
    x = _fresh((), dt)
    v, i = ta.topk(x, 1)
    assert v.shape == () and i.shape == () and int(i) == 0 and _same_values(v, x)


@pytest.mark.gpu
def test_adapter_strided_input():
    wide = _fresh((64, 1030), torch.float32)
    for x in (wide[:, 2:1002], wide.t(), wide[::3]):
        v, i = ta.topk(x, 10)
        check_topk(x, 10, 1, True, True, v, i, "adapter view")


def _distinct(shape, dtype):
    """Values without ties (a random permutation), so that torch and rawops pick the same ones."""
    n = int(np.prod(shape))
    return (torch.randperm(n, device="cuda").float().reshape(shape) / 7).to(dtype).requires_grad_()


@pytest.mark.gpu
def test_adapter_autograd_scatters_to_the_indices():
    for shape, dim, k in (((64, 1000), -1, 8), ((3, 128256), -1, 50), ((100, 40), 0, 20)):
        x = _distinct(shape, torch.float32)
        v, i = ta.topk(x, k, dim)
        grad = torch.randn_like(v)
        v.backward(grad)
        ref = x.detach().clone().requires_grad_()
        torch.topk(ref, k, dim).values.backward(grad)
        assert torch.equal(x.grad, ref.grad)
        assert not i.requires_grad


@pytest.mark.gpu
def test_adapter_under_torch_compile_fullgraph():
    def f(x):
        v, i = ta.topk(x, 8, -1, True, True)
        return v * 2, i

    compiled = torch.compile(f, fullgraph=True)
    x = _distinct((256, 1000), torch.float32)
    v, i = compiled(x)
    grad = torch.randn_like(v)
    v.backward(grad)
    ref = x.detach().clone().requires_grad_()
    ref_v, ref_i = torch.topk(ref, 8)
    (ref_v * 2).backward(grad)
    assert torch.equal(v.detach(), ref_v.detach() * 2) and torch.equal(i, ref_i)
    assert torch.equal(x.grad, ref.grad)
