"""The softmax family's contract (softmax, log_softmax), through the CuPy API and the torch
adapter, against torch in float64."""
import cupy
import pytest

torch = pytest.importorskip("torch")

import rawops  # noqa: E402
from gpu_reference import DTYPES, NORM_FLOOR, TOLERANCE, poison_pool, random, to_cupy, to_torch  # noqa: E402
from test_norm import IDS, ROW_VIEWS, ROW_WIDTHS, SHAPES, check, row_view  # noqa: E402

pytestmark = pytest.mark.gpu

OPS = {
    "softmax": (rawops.softmax, rawops.softmax_backward, torch.softmax),
    "log_softmax": (rawops.log_softmax, rawops.log_softmax_backward, torch.log_softmax),
}


def _reference(op, x, dy):
    leaf = x.double().requires_grad_()
    y = OPS[op][2](leaf, -1)
    if y.numel() == 0:
        return y.detach(), torch.zeros_like(leaf)
    return y.detach(), torch.autograd.grad(y, leaf, dy.double())[0]


def _run(op, x, dy):
    forward, backward, _ = OPS[op]
    poison_pool(x.numel() * x.element_size())
    y = forward(to_cupy(x))
    poison_pool(x.numel() * x.element_size())
    return y, backward(to_cupy(dy), y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", SHAPES, ids=IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_forward_and_backward_match_torch_float64(op, rows, n, dtype):
    dt = DTYPES[dtype]
    x, dy = random((rows, n), dt), random((rows, n), dt)
    y, dx = _run(op, x, dy)
    ry, rdx = _reference(op, x, dy)
    assert isinstance(y, cupy.ndarray), "CuPy in, CuPy out"
    check(y, ry, dt, f"{op} y")
    check(dx, rdx, dt, f"{op} dx", factor=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [31, 4096, 65536])
@pytest.mark.parametrize("op", list(OPS))
def test_large_magnitude_inputs_neither_overflow_nor_give_nan(op, n, dtype):
    """exp(1e4) overflows float32: only the max subtraction keeps these finite."""
    dt = DTYPES[dtype]
    # float16 tops out at 65504: log_softmax's x - max must stay finite there too.
    scale = 3e3 if dt is torch.float16 else 1e4
    x = random((8, n), dt, scale=scale)
    # A runner-up per row at a growing distance from the max (a tie first): without one every
    # row is one-hot at this scale, and softmax's dx is exactly 0, which a dx left 0 would pass.
    top, where = x.float().max(-1)
    rows = torch.arange(8, device=x.device)
    x[rows, (where + n // 2) % n] = (top - torch.tensor([0, 0.25, 1, 2, 4, 8, 16, 32], device=x.device)).to(dt)
    dy = random((8, n), dt)
    y, dx = _run(op, x, dy)
    ry, _ = _reference(op, x, dy)
    for got, name in ((y, "y"), (dx, "dx")):
        assert not cupy.isnan(got).any() and not cupy.isinf(got).any(), f"{op} {name}: NaN or inf"
    check(y, ry, dt, f"{op} y, large inputs")
    # The backward's input is y as stored (torch's backward takes the same): near one-hot,
    # float16's rounding of y ~ 1 decides 1 - y, so dx is checked against float64 math on
    # that stored y, not on the exact one (which would test y's rounding, not the kernel).
    # Near one-hot, softmax's dx at the max cancels: y_m (dy_m - sum(y dy)) with sum(y dy) ~ dy_m,
    # so any backward in the storage type (torch's too) is off by ~eps |dy_m| there while dx
    # itself can be far smaller (float32 at n=65536 measured 6e-5 of |dx| in norm, H100, session
    # 15). So each element is held to the size of the terms it is the difference of: an element
    # that does not cancel is held to the dtype's tolerance of itself, and a zero or stale dx fails.
    ref, terms = _backward_reference(op, y, dy)
    error = (to_torch(dx).double() - ref).abs()
    bound = 2 * TOLERANCE[dt] * (terms + NORM_FLOOR[dt])
    worst = (error / bound).max().item()
    assert worst <= 1, f"{op} dx, large inputs: an element off by {worst:.3g}x its bound (2 x tolerance x its terms)"


def _backward_reference(op, y, dy):
    """dx in float64 from the stored y, and per element the size of the terms dx is the
    difference of: |y dy| + y sum|y dy| (softmax), |dy| + exp(y) sum|dy| (log_softmax)."""
    y64, dy64 = to_torch(y).double(), dy.double()
    if op == "softmax":
        product = y64 * dy64
        return product - y64 * product.sum(-1, keepdim=True), product.abs() + y64 * product.abs().sum(-1, keepdim=True)
    p = y64.exp()
    return dy64 - p * dy64.sum(-1, keepdim=True), dy64.abs() + p * dy64.abs().sum(-1, keepdim=True)


def test_minus_infinity_entries_get_zero_probability():
    x = random((4, 1000), torch.float32)
    x[:, ::3] = float("-inf")
    y = rawops.softmax(to_cupy(x))
    check(y, torch.softmax(x.double(), -1), torch.float32, "masked softmax")
    assert (cupy.asarray(y)[:, ::3] == 0).all()


@pytest.mark.parametrize("op", list(OPS))
def test_deterministic(op):
    x, dy = random((4096, 4097), torch.float32), random((4096, 4097), torch.float32)
    a, b = _run(op, x, dy), _run(op, x, dy)
    assert cupy.array_equal(a[0], b[0]) and cupy.array_equal(a[1], b[1])


def test_in_place_out():
    x = random((16, 65536), torch.bfloat16)
    expected = torch.softmax(x.double(), -1)
    xc = to_cupy(x)
    assert rawops.softmax(xc, out=xc).data.ptr == x.data_ptr()
    check(x, expected, torch.bfloat16, "in place")


# ------------------------------------------------------------------------------ torch adapter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(OPS))
def test_adapter_autograd_matches_torch(op, dtype):
    from rawops import torch_adapter as ta

    dt = DTYPES[dtype]
    x, dy = random((67, 1000), dt), random((67, 1000), dt)
    leaf = x.clone().requires_grad_()
    y = getattr(ta, op)(leaf, -1)
    y.backward(dy)
    ry, rdx = _reference(op, x, dy)
    check(y.detach(), ry, dt, "adapter y")
    check(leaf.grad, rdx, dt, "adapter dx", factor=2)
    with torch.no_grad():
        assert torch.equal(getattr(ta, op)(x, -1), y.detach()), "no-grad path == autograd path"


def test_adapter_module_and_compile():
    from rawops import torch_adapter as ta

    x = random((32, 768), torch.float32)
    check(ta.Softmax(-1)(x), torch.nn.Softmax(-1)(x.double()), torch.float32, "Softmax module")
    compiled = torch.compile(lambda x: ta.log_softmax(ta.softmax(x, -1), -1), fullgraph=True)
    leaf = x.clone().requires_grad_()
    compiled(leaf).sum().backward()
    ref = x.double().requires_grad_()
    torch.log_softmax(torch.softmax(ref, -1), -1).sum().backward()
    check(leaf.grad, ref.grad, torch.float32, "compiled grad", factor=2)


def test_adapter_gradcheck():
    from rawops import torch_adapter as ta

    x = random((3, 9), torch.float32).requires_grad_()
    assert torch.autograd.gradcheck(ta.log_softmax, (x,), eps=1e-2, atol=3e-2, rtol=3e-2)


# ------------------------------------------------------------------------------ row-strided layouts
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROW_WIDTHS + [65536])
@pytest.mark.parametrize("layout", sorted(ROW_VIEWS))
@pytest.mark.parametrize("op", list(OPS))
def test_row_strided_views_match_torch_float64(op, layout, n, dtype):
    # x, y and dy as views of wider bases (no copy); dy then broadcast over the rows (stride 0);
    # and out= a row-strided view of a NaN base, whose other elements stay NaN.
    dt = DTYPES[dtype]
    forward, backward, _ = OPS[op]
    shape = (3, 5, n) if layout == "offset_three_dims" else (7 if n == 65536 else 67, n)
    xc, x, _ = row_view(layout, shape, dt)
    dyc, dy, _ = row_view(layout, shape, dt)
    ry, rdx = _reference(op, x, dy)
    poison_pool(x.numel() * x.element_size())
    y = forward(xc)
    assert y.flags.c_contiguous
    check(to_torch(y), ry, dt, f"{op} {layout} n={n} y")
    # the backward on y as a row-strided view too: y copied into the same layout
    yc, y_view, _ = row_view(layout, shape, dt, fill=0.0)
    y_view.copy_(to_torch(y))
    for gradient in ("strided", "broadcast"):
        if gradient == "broadcast":
            g = random((n,), dt)
            dyc, dy = cupy.broadcast_to(to_cupy(g), shape), g.expand(shape)
        out, out_view, base = row_view(layout, shape, dt, fill=float("nan"))
        assert backward(dyc, yc, out=out) is out
        _, rdx = _reference(op, x, dy)
        check(out_view, rdx, dt, f"{op} {layout} n={n} dx ({gradient} dy)", factor=2)
        inside = torch.zeros(base.shape, dtype=torch.bool, device="cuda")
        ROW_VIEWS[layout][1](inside, shape)[...] = True
        assert torch.isnan(base[~inside]).all(), "wrote outside out's rows"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced_columns", "every_other_row", "broadcast_gradient",
                                    "other_dim"])
@pytest.mark.parametrize("op", list(OPS))
def test_adapter_takes_row_strided_tensors_and_copies_the_rest(op, layout, dtype):
    # ta.softmax / ta.log_softmax with autograd over the last dim (and over dim 0: moved last in a
    # copy): a transposed input is copied, sliced columns and every other row run as they are,
    # the broadcast gradient of y.sum(0) is read at row stride 0.
    from rawops import torch_adapter as ta

    dt = DTYPES[dtype]
    rows, n = 67, 1000
    x = {"transposed": lambda: random((n, rows), dt).t(),
         "sliced_columns": lambda: random((rows, n + 24), dt)[:, 24:],
         "every_other_row": lambda: random((2 * rows, n), dt)[::2],
         "broadcast_gradient": lambda: random((rows, n), dt),
         "other_dim": lambda: random((n, rows), dt).t()}[layout]()
    dim = 0 if layout == "other_dim" else -1
    leaf, ref = x.detach().requires_grad_(), x.detach().double().requires_grad_()
    y, ry = getattr(ta, op)(leaf, dim), OPS[op][2](ref, dim)
    check(y.detach(), ry.detach(), dt, f"adapter {op} {layout} y")
    if layout == "broadcast_gradient":
        g = random((n,), dt)
        y.sum(0).backward(g)
        ry.sum(0).backward(g.double())
    else:
        dy = random(y.shape, dt)
        y.backward(dy)
        ry.backward(dy.double())
    check(leaf.grad, ref.grad, dt, f"adapter {op} {layout} dx", factor=2)
    with torch.no_grad():
        assert torch.equal(getattr(ta, op)(x, dim), y.detach()), "no-grad path == autograd path"
