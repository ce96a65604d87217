"""The normalisation family's contract (layer_norm, rms_norm), through the CuPy API and the
torch adapter, against torch in float64."""

import cupy
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rawops  # noqa: E402
from gpu_reference import DTYPES, TOLERANCE, assert_close, poison_pool, random, to_cupy, to_torch  # noqa: E402

pytestmark = pytest.mark.gpu
import rawops.norm as norm_module  # noqa: E402

WIDTHS = [1, 31, 768, 1000, 4096, 4097, 65536]
# Every width at 0, 1 and 3 rows; 16384 rows where the width keeps the case under ~1 GB.
SHAPES = [(rows, n) for n in WIDTHS for rows in (0, 1, 3)] + [(16384, n) for n in (1, 31, 768, 1000, 4096, 4097)]
SHAPES += [(64, 65536)]
IDS = [f"{r}x{n}" for r, n in SHAPES]
# float32 sums over thousands of rows (dweight, dbias) round more than one element does.
SUM_FACTOR = 5


check = assert_close  # float32 sums over many rows get `factor` x the elementwise tolerance


def _inputs(rows, n, dtype, offset=0.0):
    x = (random((rows, n), dtype, scale=1.0).float() + offset).to(dtype)
    return x, random((rows, n), dtype), random((n,), dtype, scale=0.5) + 1, random((n,), dtype, scale=0.5)


def _reference(op, x, dy, w, b, eps):
    """(y, dx, dw, db) in float64 through torch's autograd."""
    leaves = [t.double().requires_grad_() for t in (x, w, b)]
    n = x.shape[-1]
    if op == "layer_norm":
        y = F.layer_norm(leaves[0], (n,), leaves[1], leaves[2], eps)
    else:
        y = F.rms_norm(leaves[0], (n,), leaves[1], eps)
    if y.numel() == 0:
        return y.detach(), torch.zeros_like(leaves[0]), torch.zeros_like(leaves[1]), torch.zeros_like(leaves[2])
    dx, dw, db = torch.autograd.grad(y, leaves, dy.double(), allow_unused=True)
    return y.detach(), dx, dw, db if db is not None else torch.zeros_like(leaves[2])


def _run(op, x, dy, w, b, eps):
    """rawops forward then backward on CuPy views of the tensors; outputs poisoned first."""
    xc, dyc, wc, bc = (to_cupy(t) for t in (x, dy, w, b))
    size, rows, n = x.element_size(), x.numel() // x.shape[-1], x.shape[-1]
    if op == "layer_norm":
        poison_pool(x.numel() * size, rows * 4, rows * 4)  # y, mean, rstd
        y, mean, rstd = rawops.layer_norm_forward(xc, wc, bc, eps)
        poison_pool(x.numel() * size, n * size, n * size)  # dx, dweight, dbias
        dx, dw, db = rawops.layer_norm_backward(dyc, xc, wc, mean, rstd)
    else:
        poison_pool(x.numel() * size, rows * 4)  # y, rstd
        y, rstd = rawops.rms_norm_forward(xc, wc, eps)
        poison_pool(x.numel() * size, n * size)  # dx, dweight
        dx, dw = rawops.rms_norm_backward(dyc, xc, wc, rstd)
        db = None
    return y, dx, dw, db


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", SHAPES, ids=IDS)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_forward_and_backward_match_torch_float64(op, rows, n, dtype):
    dt = DTYPES[dtype]
    x, dy, w, b = _inputs(rows, n, dt)
    y, dx, dw, db = _run(op, x, dy, w, b, 1e-5)
    ry, rdx, rdw, rdb = _reference(op, x, dy, w, b, 1e-5)
    assert isinstance(y, cupy.ndarray), "CuPy in, CuPy out"
    check(y, ry, dt, f"{op} y")
    # rms_norm over one element: dx = w dy rstd * eps / (x^2 + eps) comes out of 1 - x^2 rstd^2,
    # two nearly equal terms: in float32 (torch's kernel too) only its magnitude survives, so
    # that one case is held to 10%, not to the float64 reference.
    check(dx, rdx, dt, f"{op} dx", factor=0.1 / TOLERANCE[dt] if (op == "rms_norm" and n == 1) else 2)
    check(dw, rdw, dt, f"{op} dweight", factor=SUM_FACTOR)
    if op == "layer_norm":
        check(db, rdb, dt, f"{op} dbias", factor=SUM_FACTOR)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_statistics_are_float32_per_row(op, dtype):
    x = random((5, 7, 300), DTYPES[dtype])
    if op == "layer_norm":
        _, mean, rstd = rawops.layer_norm_forward(to_cupy(x), eps=1e-5)
        assert mean.dtype == cupy.float32 and mean.shape == (5, 7)
        check(mean, x.double().mean(-1), torch.float32, "mean")
        var = x.double().var(-1, unbiased=False)
    else:
        _, rstd = rawops.rms_norm_forward(to_cupy(x), eps=1e-5)
        var = x.double().pow(2).mean(-1)
    assert rstd.dtype == cupy.float32 and rstd.shape == (5, 7)
    check(rstd, (var + 1e-5).rsqrt(), torch.float32, "rstd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [768, 4096, 65536])
def test_layer_norm_with_a_1e4_offset_stays_accurate(n, dtype):
    """Variance from sums of squares would cancel to noise here; two-pass / shifted sums do not."""
    dt = DTYPES[dtype]
    x, dy, w, b = _inputs(8, n, dt, offset=1e4)
    y, dx, dw, db = _run("layer_norm", x, dy, w, b, 1e-5)
    ry, rdx, rdw, rdb = _reference("layer_norm", x, dy, w, b, 1e-5)
    check(y, ry, dt, "y, offset 1e4")
    check(dx, rdx, dt, "dx, offset 1e4", factor=2)
    check(dw, rdw, dt, "dweight, offset 1e4", factor=SUM_FACTOR)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("n", [768, 4096, 65536])
def test_backward_is_deterministic(op, n, dtype):
    x, dy, w, b = _inputs(4096 if n < 65536 else 256, n, DTYPES[dtype])
    first = _run(op, x, dy, w, b, 1e-5)
    second = _run(op, x, dy, w, b, 1e-5)
    for a, c, name in zip(first, second, ("y", "dx", "dweight", "dbias")):
        if a is not None:
            assert cupy.array_equal(a, c), f"{op} {name}: two runs differ"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])  # float32 rows this wide always stream
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_backward_of_the_widest_register_rows(op, dtype, monkeypatch):
    """8192-wide 16-bit rows: 512-thread blocks whose dweight/dbias columns take 64 KB of
    shared memory (over the 48 KB default: opted in); then the same rows as if the device
    could not give it, which streams them through the same partial buffers."""
    dt = DTYPES[dtype]
    x, dy, w, b = _inputs(1000, 8192, dt)
    ry, rdx, rdw, rdb = _reference(op, x, dy, w, b, 1e-5)
    allow = norm_module._allow_smem
    for streamed in (False, True):
        asked = []  # (shared bytes asked for, granted) of each backward launch

        def spy(name, device, smem, streamed=streamed):
            granted = smem == 0 if streamed else allow(name, device, smem)
            asked.append((smem, granted))
            return granted

        monkeypatch.setattr(norm_module, "_allow_smem", spy)
        monkeypatch.setattr(norm_module, "_backward_configs", {})  # the launch configurations planned anew
        y, dx, dw, db = _run(op, x, dy, w, b, 1e-5)
        assert asked and all(smem > 0 for smem, _ in asked), f"register mode not planned: {asked}"
        assert all(granted != streamed for _, granted in asked), f"streamed={streamed}: {asked}"
        how = "streamed" if streamed else "register mode"
        check(dx, rdx, dt, f"{op} dx, {how}", factor=2)
        check(dw, rdw, dt, f"{op} dweight, {how}", factor=SUM_FACTOR)
        if op == "layer_norm":
            check(db, rdb, dt, f"{op} dbias, {how}", factor=SUM_FACTOR)


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows,n", [(1, 4096), (3, 2048), (1000, 2048), (16384, 4096), (1000, 8192)])
def test_layer_norm_backward_of_full_rows(rows, n, dtype, weighted, monkeypatch):
    """16-bit rows that fill every thread's vectors (4, 8 and 16 warps) take layer_norm_bwd_full_<dtype>
    (its row pointers stepped, its row sums by a butterfly and one barrier) with config.norm_full_rows
    on (by default only on fast memory: the H200): against float64, with and without weight and
    bias, fewer rows than the grid and more."""
    monkeypatch.setattr(rawops.config, "norm_full_rows", True)
    dt = DTYPES[dtype]
    x, dy, w, b = _inputs(rows, n, dt)
    names = []
    pointer = norm_module._modules.function_pointer
    monkeypatch.setattr(norm_module._modules, "function_pointer",
                        lambda family, name, device: names.append(name) or pointer(family, name, device))
    monkeypatch.setattr(norm_module, "_backward_configs", {})
    if weighted:
        _, dx, dw, db = _run("layer_norm", x, dy, w, b, 1e-5)
        _, rdx, rdw, rdb = _reference("layer_norm", x, dy, w, b, 1e-5)
        check(dw, rdw, dt, "dweight, full rows", factor=SUM_FACTOR)
    else:
        leaf = x.double().requires_grad_()
        (rdx,) = torch.autograd.grad(F.layer_norm(leaf, (n,), eps=1e-5), leaf, dy.double())
        rdb = dy.double().sum(0)
        _, mean, rstd = rawops.layer_norm_forward(to_cupy(x))
        poison_pool(x.numel() * 2, n * 2)
        dx, dw, db = rawops.layer_norm_backward(to_cupy(dy), to_cupy(x), None, mean, rstd)
        assert dw is None
    assert f"layer_norm_bwd_full_{'f16' if dtype == 'float16' else 'bf16'}" in names, names
    check(dx, rdx, dt, "dx, full rows", factor=2)
    check(db, rdb, dt, "dbias, full rows", factor=SUM_FACTOR)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_without_weight_and_bias(op):
    x, dy, _, _ = _inputs(33, 1000, torch.float32)
    n = x.shape[-1]
    leaf = x.double().requires_grad_()
    ref = F.layer_norm(leaf, (n,), eps=1e-5) if op == "layer_norm" else F.rms_norm(leaf, (n,), eps=1e-5)
    (rdx,) = torch.autograd.grad(ref, leaf, dy.double())
    if op == "layer_norm":
        y, mean, rstd = rawops.layer_norm_forward(to_cupy(x))
        dx, dw, db = rawops.layer_norm_backward(to_cupy(dy), to_cupy(x), None, mean, rstd)
        check(db, dy.double().sum(0), torch.float32, "dbias", factor=SUM_FACTOR)
    else:
        y, rstd = rawops.rms_norm_forward(to_cupy(x), eps=1e-5)
        dx, dw = rawops.rms_norm_backward(to_cupy(dy), to_cupy(x), None, rstd)
    assert dw is None
    check(y, ref.detach(), torch.float32, "y")
    check(dx, rdx, torch.float32, "dx", factor=2)


def test_rms_norm_default_eps_is_the_dtype_epsilon_like_torch():
    x = random((4, 64), torch.float16, scale=1e-2)
    check(rawops.rms_norm(to_cupy(x)), F.rms_norm(x.double(), (64,), eps=torch.finfo(torch.float16).eps),
          torch.float16, "eps=None")


@pytest.mark.parametrize("offset", [0, 1, 3])
def test_misaligned_rows_take_the_scalar_path(offset):
    base = random((3 * 768 + 8,), torch.float16)
    x = base[offset:offset + 3 * 768].view(3, 768)
    out = torch.full((3 * 768 + 8,), float("nan"), dtype=torch.float16, device="cuda")
    view = out[offset:offset + 3 * 768].view(3, 768)
    rawops.layer_norm(to_cupy(x), out=to_cupy(view))
    check(view, F.layer_norm(x.double(), (768,)), torch.float16, "offset view")
    assert torch.isnan(torch.cat([out[:offset], out[offset + 3 * 768:]])).all(), "wrote outside the view"


def test_in_place_out_equals_x():
    x = random((64, 65536), torch.float32)
    expected = F.layer_norm(x.double(), (65536,))
    xc = to_cupy(x)
    assert rawops.layer_norm(xc, out=xc).data.ptr == x.data_ptr()
    check(x, expected, torch.float32, "in place, streaming mode")


# ------------------------------------------------------------------------------ torch adapter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_adapter_autograd_matches_torch(op, dtype):
    from rawops import torch_adapter as ta

    dt = DTYPES[dtype]
    x, dy, w, b = _inputs(67, 1000, dt)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = (ta.layer_norm(leaves[0], (1000,), *leaves[1:], eps=1e-5) if op == "layer_norm"
         else ta.rms_norm(leaves[0], (1000,), leaves[1], eps=1e-5))
    y.backward(dy)
    ry, rdx, rdw, rdb = _reference(op, x, dy, w, b, 1e-5)
    check(y.detach(), ry, dt, "adapter y")
    check(leaves[0].grad, rdx, dt, "adapter dx", factor=2)
    check(leaves[1].grad, rdw, dt, "adapter dweight", factor=SUM_FACTOR)
    if op == "layer_norm":
        check(leaves[2].grad, rdb, dt, "adapter dbias", factor=SUM_FACTOR)


def test_adapter_modules_load_torch_state_dicts_and_match():
    from rawops import torch_adapter as ta

    x = random((16, 768), torch.float32)
    for theirs, ours in [(torch.nn.LayerNorm(768), ta.LayerNorm(768)), (torch.nn.RMSNorm(768), ta.RMSNorm(768)),
                         (torch.nn.LayerNorm(768, bias=False), ta.LayerNorm(768, bias=False))]:
        theirs = theirs.cuda()
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(random(p.shape, torch.float32))
        ours = ours.cuda()
        ours.load_state_dict(theirs.state_dict())
        check(ours(x), theirs.double()(x.double()).detach(), torch.float32, type(ours).__name__)


def test_adapter_torch_compile_fullgraph():
    from rawops import torch_adapter as ta

    x, dy, w, b = _inputs(32, 768, torch.float32)
    compiled = torch.compile(lambda x, w, b: ta.rms_norm(ta.layer_norm(x, (768,), w, b), (768,), w, 1e-5),
                             fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    compiled(*leaves).backward(dy)
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    F.rms_norm(F.layer_norm(ref[0], (768,), ref[1], ref[2]), (768,), ref[1], 1e-5).backward(dy.double())
    for got, want in zip(leaves, ref):
        check(got.grad, want.grad, torch.float32, "compiled grad", factor=SUM_FACTOR)


def test_adapter_gradcheck():
    from rawops import torch_adapter as ta

    x, _, w, b = _inputs(3, 9, torch.float32)
    inputs = [t.requires_grad_() for t in (x, w, b)]
    assert torch.autograd.gradcheck(lambda x, w, b: ta.layer_norm(x, (9,), w, b), inputs, eps=1e-2, atol=3e-2,
                                    rtol=3e-2)


# ------------------------------------------------------------------------------ row-strided layouts
# Views whose rows are consecutive elements at one stride, made the same way in CuPy and torch:
# name -> (base shape for the logical shape, the view of a base). "padded_aligned" keeps every
# row on 16 bytes (the vector path); "padded_misaligned" puts rows off it (the element path).
ROW_VIEWS = {
    "padded_aligned": (lambda s: s[:-1] + (s[-1] + 8,), lambda b, s: b[..., :s[-1]]),
    "padded_misaligned": (lambda s: s[:-1] + (s[-1] + 1,), lambda b, s: b[..., 1:]),
    "every_other_row": (lambda s: (2 * s[0],) + s[1:], lambda b, s: b[::2]),
    "offset_three_dims": (lambda s: (s[0] + 1,) + s[1:-1] + (s[-1] + 16,), lambda b, s: b[1:, ..., 16:]),
}
ROW_WIDTHS = [31, 768, 1000, 4097]


def row_view(layout, shape, dtype, scale=2.0, fill=None):
    """(CuPy view, torch view, torch base) of a fresh random base (or one full of `fill`)."""
    base_shape, view = ROW_VIEWS[layout]
    base = (random(base_shape(shape), dtype, scale) if fill is None
            else torch.full(base_shape(shape), fill, dtype=dtype, device="cuda"))
    return view(to_cupy(base), shape), view(base, shape), base


def _shape_of(layout, n):
    return (3, 23, n) if layout == "offset_three_dims" else (67, n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROW_WIDTHS)
@pytest.mark.parametrize("layout", sorted(ROW_VIEWS))
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_row_strided_views_match_torch_float64(op, layout, n, dtype):
    # x and dy as views of wider bases (no copy), y / dx contiguous; then dy broadcast over the
    # rows (row stride 0, the gradient of y.sum(0)).
    dt = DTYPES[dtype]
    shape = _shape_of(layout, n)
    xc, x, _ = row_view(layout, shape, dt, scale=1.0)
    dyc, dy, _ = row_view(layout, shape, dt)
    w, b = random((n,), dt, scale=0.5) + 1, random((n,), dt, scale=0.5)
    x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)  # torch's reference works on rows
    ry, rdx, rdw, rdb = _reference(op, x2, dy2, w, b, 1e-5)
    rows = x2.shape[0]
    for gradient in ("strided", "broadcast"):
        if gradient == "broadcast":
            g = random((n,), dt)
            dyc, dy2 = cupy.broadcast_to(to_cupy(g), shape), g.expand(rows, n)
            ry, rdx, rdw, rdb = _reference(op, x2, dy2, w, b, 1e-5)
        size = rows * n * x.element_size()
        if op == "layer_norm":
            poison_pool(size, rows * 4, rows * 4)
            y, mean, rstd = rawops.layer_norm_forward(xc, to_cupy(w), to_cupy(b), 1e-5)
            poison_pool(size, n * x.element_size(), n * x.element_size())
            dx, dw, db = rawops.layer_norm_backward(dyc, xc, to_cupy(w), mean, rstd)
        else:
            poison_pool(size, rows * 4)
            y, rstd = rawops.rms_norm_forward(xc, to_cupy(w), 1e-5)
            poison_pool(size, n * x.element_size())
            dx, dw = rawops.rms_norm_backward(dyc, xc, to_cupy(w), rstd)
        assert y.flags.c_contiguous and dx.flags.c_contiguous and y.shape == shape
        what = f"{op} {layout} n={n} ({gradient} dy)"
        check(to_torch(y).reshape(-1, n), ry, dt, f"{what} y")
        check(to_torch(dx).reshape(-1, n), rdx, dt, f"{what} dx", factor=2)
        check(dw, rdw, dt, f"{what} dweight", factor=SUM_FACTOR)
        if op == "layer_norm":
            check(db, rdb, dt, f"{what} dbias", factor=SUM_FACTOR)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["padded_aligned", "padded_misaligned", "every_other_row"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_row_strided_out_is_written_and_nothing_else(op, layout, dtype):
    dt = DTYPES[dtype]
    shape = (67, 1000)
    x = random(shape, dt, scale=1.0)
    out, view, base = row_view(layout, shape, dt, fill=float("nan"))
    fn = rawops.layer_norm if op == "layer_norm" else rawops.rms_norm
    assert fn(to_cupy(x), eps=1e-5, out=out) is out
    ref = F.layer_norm(x.double(), (1000,), eps=1e-5) if op == "layer_norm" else F.rms_norm(x.double(), (1000,),
                                                                                            eps=1e-5)
    check(view, ref, dt, f"{op} out {layout}")
    inside = torch.zeros(base.shape, dtype=torch.bool, device="cuda")
    ROW_VIEWS[layout][1](inside, shape)[...] = True
    assert torch.isnan(base[~inside]).all(), "wrote outside out's rows"


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_on_a_row_strided_view(dtype):
    dt = DTYPES[dtype]
    xc, x, base = row_view("padded_aligned", (40, 4096), dt)
    expected, before = F.layer_norm(x.double(), (4096,)), base.clone()
    assert rawops.layer_norm(xc, out=xc) is xc
    check(x, expected, dt, "in place on x[:, :4096]")
    assert torch.equal(base[:, 4096:], before[:, 4096:]), "wrote into the padding"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced_columns", "every_other_row", "broadcast_gradient"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_adapter_takes_row_strided_tensors_and_copies_the_rest(op, layout, dtype):
    # ta.layer_norm / ta.rms_norm with autograd: a transposed input cannot be row-strided and is
    # copied; sliced columns and every other row run as they are; the broadcast gradient (of
    # y.sum(0)) is read at row stride 0. Every result is torch's.
    from rawops import torch_adapter as ta

    dt = DTYPES[dtype]
    rows, n = 67, 1000
    base = {"transposed": lambda: random((n, rows), dt, 1.0).t(),
            "sliced_columns": lambda: random((rows, n + 24), dt, 1.0)[:, 24:],
            "every_other_row": lambda: random((2 * rows, n), dt, 1.0)[::2],
            "broadcast_gradient": lambda: random((rows, n), dt, 1.0)}[layout]()
    w, b = random((n,), dt, scale=0.5) + 1, random((n,), dt, scale=0.5)
    leaves = [t.detach().requires_grad_() for t in (base, w, b)]
    refs = [t.detach().double().requires_grad_() for t in (base, w, b)]
    if op == "layer_norm":
        y, ry = ta.layer_norm(leaves[0], (n,), leaves[1], leaves[2]), F.layer_norm(refs[0], (n,), refs[1], refs[2])
    else:
        y, ry = ta.rms_norm(leaves[0], (n,), leaves[1], 1e-5), F.rms_norm(refs[0], (n,), refs[1], 1e-5)
    check(y.detach(), ry.detach(), dt, f"adapter {op} {layout} y")
    if layout == "broadcast_gradient":
        g = random((n,), dt)
        y.sum(0).backward(g)
        ry.sum(0).backward(g.double())
    else:
        dy = random((rows, n), dt)
        y.backward(dy)
        ry.backward(dy.double())
    check(leaves[0].grad, refs[0].grad, dt, f"adapter {op} {layout} dx", factor=2)
    check(leaves[1].grad, refs[1].grad, dt, f"adapter {op} {layout} dweight", factor=SUM_FACTOR)
    if op == "layer_norm":
        check(leaves[2].grad, refs[2].grad, dt, f"adapter {op} {layout} dbias", factor=SUM_FACTOR)
    with torch.no_grad():  # the no-grad path: the same kernels, the same layouts
        again = ta.layer_norm(base, (n,), w, b) if op == "layer_norm" else ta.rms_norm(base, (n,), w, 1e-5)
    assert torch.equal(again, y.detach())


# ------------------------------------------------------------------------------ add_rms_norm
ADD_SHAPES = [(0, 768), (1, 1), (3, 31), (3, 4097), (16384, 768), (16384, 4096), (4096, 4097), (64, 65536)]
ADD_IDS = [f"{r}x{n}" for r, n in ADD_SHAPES]


def _add_reference(x, residual, dy, dh, w, eps):
    """(h, y, dx, dw): h = x + residual as torch adds it in the storage type; y, dx, dw in float64
    from that h (dx = rms_norm's dx + dh, dh None: 0)."""
    h = x + residual
    y, rdx, rdw, _ = _reference("rms_norm", h, dy, w, w, eps)
    return h, y, rdx + (dh.double() if dh is not None else 0), rdw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", ADD_SHAPES, ids=ADD_IDS)
@pytest.mark.parametrize("with_dh", [True, False], ids=["dh", "no_dh"])
def test_add_rms_norm_matches_torch_float64(rows, n, dtype, with_dh):
    dt = DTYPES[dtype]
    x, dy, w, _ = _inputs(rows, n, dt)
    residual, dh = random((rows, n), dt), random((rows, n), dt) if with_dh else None
    size = x.element_size()
    poison_pool(x.numel() * size, x.numel() * size, rows * 4)  # y, new residual, rstd
    y, h, rstd = rawops.add_rms_norm_forward(to_cupy(x), to_cupy(residual), to_cupy(w), 1e-5)
    poison_pool(x.numel() * size, n * size)  # dx, dweight
    dx, dw = rawops.add_rms_norm_backward(to_cupy(dy), to_cupy(dh) if dh is not None else None, h, to_cupy(w), rstd)
    rh, ry, rdx, rdw = _add_reference(x, residual, dy, dh, w, 1e-5)
    assert torch.equal(to_torch(h), rh), "new residual == torch's x + residual, bit for bit"
    check(y, ry, dt, "add_rms_norm y")
    # one-element rows: rms_norm's dx cancels (test_forward_and_backward_match_torch_float64), dh or not
    check(dx, rdx, dt, "add_rms_norm dx", factor=0.1 / TOLERANCE[dt] if n == 1 else 2)
    check(dw, rdw, dt, "add_rms_norm dweight", factor=SUM_FACTOR)
    if rows and n:
        check(rstd, 1 / (rh.double().pow(2).mean(-1) + 1e-5).sqrt(), torch.float32, "add_rms_norm rstd", factor=2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [4096, 65536])  # register rows and streamed rows
@pytest.mark.parametrize("where", ["residual", "x"])
def test_add_rms_norm_in_place_on_the_residual_stream(where, n, dtype):
    """residual_out=residual (or =x): the streaming mode reads back what it wrote, from L2."""
    dt = DTYPES[dtype]
    x, _, w, _ = _inputs(64, n, dt)
    residual = random((64, n), dt)
    rh, ry, _, _ = _add_reference(x, residual, x, None, w, 1e-6)
    target = residual if where == "residual" else x
    y, h = rawops.add_rms_norm(to_cupy(x), to_cupy(residual), to_cupy(w), 1e-6, residual_out=to_cupy(target))
    assert h.data.ptr == target.data_ptr()
    assert torch.equal(target, rh)
    check(y, ry, dt, f"add_rms_norm in place on {where}")
    y2, _ = rawops.add_rms_norm(to_cupy(rh.clone()), to_cupy(torch.zeros_like(rh)), to_cupy(w), 1e-6,
                                out=to_cupy(rh.clone()))
    check(y2, ry, dt, "zero residual: plain rms_norm")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["padded_aligned", "padded_misaligned", "every_other_row"])
def test_add_rms_norm_row_strided_views(layout, dtype):
    dt = DTYPES[dtype]
    shape = (67, 1000)
    (cx, tx, _), (cr, tr, _), (cd, td, _), (cdh, tdh, _) = (row_view(layout, shape, dt) for _ in range(4))
    w = random((1000,), dt, scale=0.5) + 1
    y, h, rstd = rawops.add_rms_norm_forward(cx, cr, to_cupy(w), 1e-5)
    dx, dw = rawops.add_rms_norm_backward(cd, cdh, h, to_cupy(w), rstd)
    rh, ry, rdx, rdw = _add_reference(tx, tr, td, tdh, w, 1e-5)
    assert torch.equal(to_torch(h), rh)
    check(y, ry, dt, f"{layout} y")
    check(dx, rdx, dt, f"{layout} dx", factor=2)
    check(dw, rdw, dt, f"{layout} dweight", factor=SUM_FACTOR)


def test_add_rms_norm_backward_is_deterministic():
    x, dy, w, _ = _inputs(8192, 4096, torch.bfloat16)
    residual = random((8192, 4096), torch.bfloat16)
    _, h, rstd = rawops.add_rms_norm_forward(to_cupy(x), to_cupy(residual), to_cupy(w), 1e-6)
    a = rawops.add_rms_norm_backward(to_cupy(dy), to_cupy(x), h, to_cupy(w), rstd)
    b = rawops.add_rms_norm_backward(to_cupy(dy), to_cupy(x), h, to_cupy(w), rstd)
    assert cupy.array_equal(a[0], b[0]) and cupy.array_equal(a[1], b[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_adapter_add_rms_norm_autograd_matches_torch(dtype):
    from rawops import torch_adapter as ta

    dt = DTYPES[dtype]
    x, dy, w, _ = _inputs(67, 1000, dt)
    residual, dh = random((67, 1000), dt), random((67, 1000), dt)
    leaves = [t.clone().requires_grad_() for t in (x, residual, w)]
    y, h = ta.add_rms_norm(*leaves, eps=1e-6)
    torch.autograd.backward((y, h), (dy, dh))
    rh, ry, rdx, rdw = _add_reference(x, residual, dy, dh, w, 1e-6)
    assert torch.equal(h.detach(), rh)
    check(y.detach(), ry, dt, "adapter y")
    check(leaves[0].grad, rdx, dt, "adapter dx", factor=2)
    check(leaves[1].grad, rdx, dt, "adapter dresidual", factor=2)
    check(leaves[2].grad, rdw, dt, "adapter dweight", factor=SUM_FACTOR)
    # only one output used: the other's gradient is 0
    leaves = [t.clone().requires_grad_() for t in (x, residual, w)]
    ta.add_rms_norm(*leaves, eps=1e-6)[1].backward(dh)
    check(leaves[0].grad, dh.double(), dt, "only the new residual used")
    with torch.no_grad():
        y2, h2 = ta.add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(y2, y.detach()) and torch.equal(h2, h.detach()), "no-grad path == autograd path"


def test_adapter_add_rms_norm_compiles_fullgraph_and_loads_llama_rms_norm():
    from rawops import torch_adapter as ta

    x, dy, w, _ = _inputs(32, 768, torch.float32)
    residual = random((32, 768), torch.float32)
    norm = ta.AddRMSNorm(768, eps=1e-6).cuda()
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        stock = LlamaRMSNorm(768, eps=1e-6)
    except ImportError:  # no transformers here: torch.nn.RMSNorm has the same `weight`
        stock = torch.nn.RMSNorm(768, eps=1e-6)
    with torch.no_grad():
        stock.weight.copy_(w)
    norm.load_state_dict(stock.state_dict())
    compiled = torch.compile(lambda x, r: norm(x, r)[0] + norm(x, r)[1], fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (x, residual)]
    compiled(*leaves).backward(dy)
    ref = [t.double().requires_grad_() for t in (x, residual, w)]
    h = ref[0] + ref[1]
    (F.rms_norm(h, (768,), ref[2], 1e-6) + h).backward(dy.double())
    for got, want in zip(leaves, ref):
        check(got.grad, want.grad, torch.float32, "compiled add_rms_norm grad", factor=2)
    check(norm.weight.grad, ref[2].grad, torch.float32, "compiled add_rms_norm dweight", factor=SUM_FACTOR)
