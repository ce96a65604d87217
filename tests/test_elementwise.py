"""The elementwise family's contract, through the CuPy API, against torch in float64."""
import cupy
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rawops  # noqa: E402
from gpu_reference import (DTYPES, assert_close, poison_pool, poison_torch_pool, random, to_cupy, to_torch,  # noqa: E402
                           written_late)

pytestmark = pytest.mark.gpu
ALPHA = 0.37


def _grad(fn, dy, *inputs):
    """d(fn)/d(first input) . dy, in float64."""
    leaves = [t.double().requires_grad_(i == 0) for i, t in enumerate(inputs)]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves[0], dy.double())[0]


# name -> (input names, rawops call on CuPy arrays, float64 torch reference on torch tensors)
OPS = {
    "gelu_tanh": (("x",), lambda x: rawops.gelu(x, "tanh"), lambda x: F.gelu(x.double(), approximate="tanh")),
    "gelu_erf": (("x",), lambda x: rawops.gelu(x, "none"), lambda x: F.gelu(x.double())),
    "relu": (("x",), rawops.relu, lambda x: F.relu(x.double())),
    "relu_scale": (("x",), lambda x: rawops.relu_scale(x, ALPHA), lambda x: F.relu(x.double()) * ALPHA),
    "relu_scale_add": (("x", "y"), lambda x, y: rawops.relu_scale_add(x, ALPHA, y),
                       lambda x, y: F.relu(x.double()) * ALPHA + y.double()),
    "add": (("a", "b"), rawops.add, lambda a, b: a.double() + b.double()),
    "bias_gelu_tanh": (("x", "bias"), lambda x, b: rawops.bias_gelu(x, b, "tanh"),
                       lambda x, b: F.gelu(x.double() + b.double(), approximate="tanh")),
    "bias_gelu_erf": (("x", "bias"), lambda x, b: rawops.bias_gelu(x, b, "none"),
                      lambda x, b: F.gelu(x.double() + b.double())),
    "gelu_tanh_bwd": (("dy", "x"), lambda dy, x: rawops.gelu_backward(dy, x, "tanh"),
                      lambda dy, x: _grad(lambda x: F.gelu(x, approximate="tanh"), dy, x)),
    "gelu_erf_bwd": (("dy", "x"), lambda dy, x: rawops.gelu_backward(dy, x, "none"),
                     lambda dy, x: _grad(F.gelu, dy, x)),
    "relu_bwd": (("dy", "x"), rawops.relu_backward, lambda dy, x: _grad(F.relu, dy, x)),
    "relu_scale_bwd": (("dy", "x"), lambda dy, x: rawops.relu_scale_backward(dy, x, ALPHA),
                       lambda dy, x: _grad(lambda x: F.relu(x) * ALPHA, dy, x)),
    "bias_gelu_tanh_bwd_dx": (("dy", "x", "bias"), lambda dy, x, b: rawops.bias_gelu_backward(dy, x, b, "tanh")[0],
                              lambda dy, x, b: _grad(lambda x, b: F.gelu(x + b, approximate="tanh"), dy, x, b)),
    "bias_gelu_erf_bwd_dx": (("dy", "x", "bias"), lambda dy, x, b: rawops.bias_gelu_backward(dy, x, b, "none")[0],
                             lambda dy, x, b: _grad(lambda x, b: F.gelu(x + b), dy, x, b)),
}
SIZES = [0, 1, 7, 4097, (1 << 20) + 3]
ROW_SHAPES = [(0, 8), (1, 1), (1, 7), (17, 241), (1025, 1023), (3, 5, 768)]


def _inputs(names, shape, dtype):
    return [random(shape[-1:] if name == "bias" else shape, dtype) for name in names]


def _shapes(name):
    return ROW_SHAPES if "bias" in name else [(n,) for n in SIZES]


CASES = [(name, shape) for name in OPS for shape in _shapes(name)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
def test_matches_torch_float64(name, shape, dtype):
    names, call, reference = OPS[name]
    inputs = _inputs(names, shape, DTYPES[dtype])
    poison_pool(inputs[0].numel() * inputs[0].element_size())
    out = call(*[to_cupy(t) for t in inputs])
    assert isinstance(out, cupy.ndarray), "CuPy in, CuPy out"
    # A backward's terms scale with dy (gelu'(u) = 0.5 (1 + tanh) + ..., each term ~0.5): where they
    # cancel (gelu' crosses 0 near u = -0.75) one element's relative error measured 1.9e-5 in
    # float32 at an absolute error of 4e-9, so the error is held relative to 1% of |dy| at least.
    floor = 0.01 * inputs[0].double().norm().item() if "bwd" in name else 0.0
    assert_close(to_torch(out), reference(*inputs), DTYPES[dtype], name, floor=floor)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(OPS))
def test_out_argument_overwrites_poisoned_output(name, dtype):
    names, call, reference = OPS[name]
    shape = (33, 257) if "bias" in name else (4099,)
    inputs = _inputs(names, shape, DTYPES[dtype])
    out = torch.full(shape, float("nan"), dtype=DTYPES[dtype], device="cuda")
    base = name.removesuffix("_dx")
    if base.endswith("bwd") and "bias" in base:
        result = rawops.bias_gelu_backward(*[to_cupy(t) for t in inputs], "tanh" if "tanh" in base else "none",
                                           out=to_cupy(out))[0]
        assert result.data.ptr == out.data_ptr()
        assert_close(out, reference(*inputs), DTYPES[dtype], name)
        return
    kwargs = {"out": to_cupy(out)}
    fn = {"gelu_tanh": lambda *a, **k: rawops.gelu(*a, "tanh", **k),
          "gelu_erf": lambda *a, **k: rawops.gelu(*a, "none", **k),
          "relu": rawops.relu, "relu_scale": lambda *a, **k: rawops.relu_scale(*a, ALPHA, **k),
          "relu_scale_add": lambda x, y, **k: rawops.relu_scale_add(x, ALPHA, y, **k), "add": rawops.add,
          "bias_gelu_tanh": lambda x, b, **k: rawops.bias_gelu(x, b, "tanh", **k),
          "bias_gelu_erf": lambda x, b, **k: rawops.bias_gelu(x, b, "none", **k),
          "gelu_tanh_bwd": lambda dy, x, **k: rawops.gelu_backward(dy, x, "tanh", **k),
          "gelu_erf_bwd": lambda dy, x, **k: rawops.gelu_backward(dy, x, "none", **k),
          "relu_bwd": rawops.relu_backward,
          "relu_scale_bwd": lambda dy, x, **k: rawops.relu_scale_backward(dy, x, ALPHA, **k)}[name]
    result = fn(*[to_cupy(t) for t in inputs], **kwargs)
    assert result.data.ptr == out.data_ptr(), "out= is returned, not a copy"
    assert_close(out, reference(*inputs), DTYPES[dtype], name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_out_equals_input(dtype):
    x = random((10007,), DTYPES[dtype])
    expected = F.gelu(x.double(), approximate="tanh")
    xc = to_cupy(x)
    assert rawops.gelu(xc, out=xc, approximate="tanh").data.ptr == x.data_ptr()
    assert_close(x, expected, DTYPES[dtype], "in place")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_offset,out_offset", [(1, 1), (2, 2), (3, 3), (5, 0), (0, 3)])
def test_offset_views_vector_and_scalar_paths(dtype, x_offset, out_offset):
    """Equal offsets take the vector path with a scalar head; unequal ones the scalar path."""
    n = 100003
    base = random((n + 8,), DTYPES[dtype])
    y = random((n + 8,), DTYPES[dtype])
    out = torch.full((n + 8,), float("nan"), dtype=DTYPES[dtype], device="cuda")
    x_view, y_view = base[x_offset:x_offset + n], y[x_offset:x_offset + n]
    out_view = out[out_offset:out_offset + n]
    rawops.relu_scale_add(to_cupy(x_view), ALPHA, to_cupy(y_view), out=to_cupy(out_view))
    assert_close(out_view, F.relu(x_view.double()) * ALPHA + y_view.double(), DTYPES[dtype], "offset view")
    untouched = torch.cat([out[:out_offset], out[out_offset + n:]])
    assert torch.isnan(untouched).all(), "wrote outside the view"


def test_bias_gelu_backward_dbias_is_deterministic_and_correct():
    dy, x = random((4096, 768), torch.float32), random((4096, 768), torch.float32)
    bias = random((768,), torch.float32)
    dx1, db1 = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate="tanh")
    dx2, db2 = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate="tanh")
    assert cupy.array_equal(db1, db2) and cupy.array_equal(dx1, dx2), "same input, same bits"
    b64 = bias.double().requires_grad_()
    F.gelu(x.double() + b64, approximate="tanh").backward(dy.double())
    assert_close(to_torch(db1), b64.grad, torch.float32, "dbias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16384, 4096), (70001, 64), (129, 2112), (3, 5, 192)],
                         ids=["16384x4096", "70001x64", "129x2112", "3x5x192"])
def test_tile_and_walker_backwards_agree(monkeypatch, dtype, shape):
    # The short tiles (bias_bwd_tile) and the walkers (bias_bwd_partial) on the same data: dx the
    # same bits (the same formula and rounding), dbias deterministic in each and within rounding
    # of the other (the sums' order differs), both against float64. Rows not a whole tile included;
    # the tiles take whole 64-column tiles only.
    dy, x = random(shape, DTYPES[dtype]), random(shape, DTYPES[dtype])
    bias = random(shape[-1:], DTYPES[dtype])
    results = {}
    for tiles in (True, False):
        monkeypatch.setattr(rawops.config, "bias_gelu_backward_tiles", tiles)
        poison_pool(dy.numel() * dy.element_size() * 2)
        first = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate="tanh")
        again = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate="tanh")
        assert cupy.array_equal(first[1], again[1]), f"tiles={tiles}: dbias not repeatable"
        results[tiles] = first
    assert cupy.array_equal(results[True][0], results[False][0]), "dx differs between the two kernels"
    dx64, db64 = _bias_gelu_grads64(dy, x, bias, "tanh")
    for tiles, (dx, db) in results.items():
        assert_close(to_torch(dx), dx64, DTYPES[dtype], f"dx, tiles={tiles}")
        assert_close(to_torch(db), db64, DTYPES[dtype], f"dbias, tiles={tiles}")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(16384, 4096), (70001, 64), (129, 2112), (3, 5, 192)],
                         ids=["16384x4096", "70001x64", "129x2112", "3x5x192"])
def test_exact_half_dbias_is_dx_summed_then_rounded_once(monkeypatch, shape, approximate):
    # float16's tiles sum dbias in int64 fixed point (config.exact_half_dbias): the tiles'
    # float32 sums of a tile's rows, added exactly, rounded once. Against the float64 sum of the dx it
    # returned, rounded to float16: equal but where the tiles' float32 rounding (at most ~20
    # additions deep, each off by 2^-24 of what it adds up) crosses a rounding boundary, and then
    # off by one float16 step plus that rounding (a sum that cancels to near 0 can be several of
    # its own steps away: 16384 x 4096 measured).
    from rawops.elementwise import TILES_EXACT, bias_gelu_bwd_plan

    monkeypatch.setattr(rawops.elementwise, "EXACT_MIN_ELEMENTS", 0)  # the small shapes too
    dtype = torch.float16
    dy, x = random(shape, dtype), random(shape, dtype)
    bias = random(shape[-1:], dtype)
    cols = shape[-1]
    rows = dy.numel() // cols
    plan = bias_gelu_bwd_plan(rows, cols, 1, (dy.data_ptr(), x.data_ptr(), bias.data_ptr()), 132)
    assert plan[3] == TILES_EXACT
    poison_pool(dy.numel() * dy.element_size() * 2)
    dx, dbias = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate)
    again = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate)[1]
    assert cupy.array_equal(dbias, again), "dbias not repeatable"
    monkeypatch.setattr(rawops.config, "exact_half_dbias", False)
    dx_partial = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate)[0]
    assert cupy.array_equal(dx, dx_partial), "dx differs from the partial-row tiles'"
    dx64, db64 = _bias_gelu_grads64(dy, x, bias, approximate)
    assert_close(to_torch(dx), dx64, dtype, "dx")
    assert_close(to_torch(dbias), db64, dtype, "dbias")
    dx_rows = to_torch(dx).double().reshape(rows, cols)
    ref, magnitude = dx_rows.sum(0), dx_rows.abs().sum(0)
    got = to_torch(dbias).double()
    rounded = ref.to(dtype).double()
    exponent = torch.frexp(rounded)[1]  # |rounded| in [2^(e-1), 2^e): float16's step is 2^(e-11)
    step = torch.where(rounded == 0, 2.0 ** -24, torch.pow(2.0, (exponent - 11).double()).clamp(min=2 ** -24))
    tiles_rounding = 32 * 2.0 ** -24 * magnitude
    assert ((got - rounded).abs() <= step + tiles_rounding).all(), "dbias further from dx's sum than rounding"
    # the tiles' rounding moves ~0.2% of the columns across a boundary (70001 x 64: 1 of 64 seen)
    off = int((got != rounded).sum().item())
    assert off <= max(3, 0.01 * cols), f"{off} of {cols} columns are not dx's sum rounded once"


def test_exact_half_dbias_carries_inf_nan_and_range_as_torch_does(monkeypatch):
    # A tile's Inf or NaN sum goes to a float accumulator beside the integer (the order does not
    # change Inf + x, NaN + x or Inf + -Inf); a finite total past 65504 rounds to Inf, as torch's
    # float32 sum cast to float16 does; subnormal dx keeps its value (the integer's unit is 2^-24).
    monkeypatch.setattr(rawops.elementwise, "EXACT_MIN_ELEMENTS", 0)
    dtype = torch.float16
    rows, cols = 4096, 256
    dy, x = random((rows, cols), dtype), random((rows, cols), dtype)
    bias = random((cols,), dtype)
    x[:, :5], bias[:5] = 4.0, 0.0  # gelu'(4) ~ 1.0005: dx ~ dy in these columns
    dy[5, 0] = float("inf")
    dy[100, 1] = float("nan")
    dy[0, 2], dy[2000, 2] = float("inf"), float("-inf")  # two row tiles: NaN however they meet
    dy[:, 3] = 60000.0  # every tile finite, the total past the range
    dy[:, 4] = 2.0 ** -20  # subnormal dx
    dx, dbias = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate="tanh")
    torch_dbias = to_torch(dx).float().sum(0).to(dtype)
    got = to_torch(dbias)
    assert got[0].item() == float("inf") and torch_dbias[0].item() == float("inf")
    assert got[1].isnan() and got[2].isnan() and torch_dbias[1].isnan() and torch_dbias[2].isnan()
    assert got[3].item() == float("inf") and torch_dbias[3].item() == float("inf")
    tiny = to_torch(dx)[:, 4].double().sum()
    assert tiny > 0 and abs(got[4].double() - tiny) <= tiny * 2.0 ** -7, f"tiny column: {got[4].item()} vs {tiny}"
    _, db64 = _bias_gelu_grads64(dy[:, 5:], x[:, 5:], bias[5:], "tanh")
    assert_close(got[5:], db64, dtype, "finite columns")


def _bias_gelu_grads64(dy, x, bias, approximate):
    x64, b64 = x.double().requires_grad_(), bias.double().requires_grad_()
    F.gelu(x64 + b64, approximate=approximate).backward(dy.double())
    return x64.grad, b64.grad


# (shape, fused?): the one-pass kernel where rows are whole 16-byte vectors (one strip of
# several rows a block, many strips a row, a tail chunk), the dx + column_sum pair elsewhere.
BIAS_BWD_SHAPES = [((4096, 768), True), ((1000, 64), True), ((7, 8), True), ((70001, 8), True), ((5, 1 << 17), True),
                   ((3, 5, 2048), True), ((33, 257), False), ((1, 7), False)]


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,fused", BIAS_BWD_SHAPES, ids=["x".join(map(str, s)) for s, _ in BIAS_BWD_SHAPES])
def test_bias_gelu_backward_dx_and_dbias_match_float64(shape, fused, dtype, approximate):
    dy, x = random(shape, DTYPES[dtype]), random(shape, DTYPES[dtype])
    bias = random(shape[-1:], DTYPES[dtype])
    rows, cols = dy.numel() // shape[-1], shape[-1]
    code = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dy.dtype]
    plan = rawops.elementwise.bias_gelu_bwd_plan(rows, cols, code, (dy.data_ptr(), x.data_ptr(),
                                                 bias.data_ptr()), 132)
    assert (plan is not None) == fused
    poison_pool(dy.numel() * dy.element_size())
    dx, dbias = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), approximate)
    dx64, db64 = _bias_gelu_grads64(dy, x, bias, approximate)
    assert_close(to_torch(dx), dx64, DTYPES[dtype], "dx")
    assert_close(to_torch(dbias), db64, DTYPES[dtype], "dbias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", ["out", "out=dy", "out=x", "foreign out"])
@pytest.mark.parametrize("cols", [512, 510], ids=["fused", "unfused"])
def test_fused_bias_gelu_backward_out_and_in_place(dtype, in_place, cols):
    dy, x = random((2000, cols), DTYPES[dtype]), random((2000, cols), DTYPES[dtype])
    bias = random((cols,), DTYPES[dtype])
    dx64, db64 = _bias_gelu_grads64(dy, x, bias, "tanh")
    out = {"out": torch.full_like(dy, float("nan")), "out=dy": dy, "out=x": x,
           "foreign out": torch.full_like(dy, float("nan"))}[in_place]
    # "foreign out": any __cuda_array_interface__ producer (here the torch tensor itself) is written
    # through its checked pointer and handed back as it came.
    given = out if in_place == "foreign out" else to_cupy(out)
    if in_place == "foreign out" and dtype == "bfloat16":
        # __cuda_array_interface__ has no bfloat16 typestr (torch gives '<V2'): refused, by name.
        with pytest.raises(TypeError, match=r"^out has dtype '<V2' .*pass bfloat16 as a CuPy array"):
            rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), out=given, approximate="tanh")
        assert torch.isnan(out).all()
        return
    dx, dbias = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), out=given, approximate="tanh")
    assert dx is given
    assert_close(out, dx64, DTYPES[dtype], "dx")
    assert_close(to_torch(dbias), db64, DTYPES[dtype], "dbias")


def test_fused_bias_gelu_backward_on_an_explicit_stream():
    dy, x = random((3000, 1024), torch.float16), random((3000, 1024), torch.float16)
    bias = random((1024,), torch.float16)
    dx64, db64 = _bias_gelu_grads64(dy, x, bias, "tanh")
    stream = cupy.cuda.Stream(non_blocking=True)
    dy = written_late(dy, stream)  # NaN unless the launch waits behind `stream`'s work
    dx, dbias = rawops.bias_gelu_backward(to_cupy(dy), to_cupy(x), to_cupy(bias), stream=stream, approximate="tanh")
    stream.synchronize()
    assert_close(to_torch(dx), dx64, torch.float16, "dx")
    assert_close(to_torch(dbias), db64, torch.float16, "dbias")


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sum_half_types(dtype):
    x = random((3000, 129), DTYPES[dtype])
    assert_close(to_torch(rawops.column_sum(to_cupy(x))), x.double().sum(0), DTYPES[dtype], "column_sum")


def test_runs_on_current_cupy_stream_and_explicit_stream():
    x = random((1 << 22,), torch.float32)
    expected = F.gelu(x.double(), approximate="tanh")
    stream = cupy.cuda.Stream(non_blocking=True)
    late = written_late(x, stream)  # NaN unless the launch waits behind `stream`'s work
    with stream:
        y = rawops.gelu(to_cupy(late), approximate="tanh")
    stream.synchronize()
    assert_close(to_torch(y), expected, torch.float32, "current stream")
    other = cupy.cuda.Stream(non_blocking=True)
    out = cupy.full(x.shape, cupy.nan, dtype=cupy.float32)
    late = written_late(x, other)
    rawops.gelu(to_cupy(late), out=out, stream=other, approximate="tanh")
    other.synchronize()
    assert_close(to_torch(out), expected, torch.float32, "stream=")


class _StreamProtocol:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@pytest.mark.parametrize("form", ["cupy", "torch", "int"])
def test_a_given_stream_in_every_form_is_the_one_launched_on(form):
    """stream= as a CuPy stream, a torch stream or a raw handle (the driver is asked its GPU)."""
    x = random((1 << 20,), torch.float32)
    side = torch.cuda.Stream()
    late = written_late(x, side)  # NaN unless the launch waits behind `side`'s work
    given = {"cupy": cupy.cuda.Stream.from_external(_StreamProtocol(side.cuda_stream)), "torch": side,
             "int": side.cuda_stream}[form]
    y = rawops.gelu(to_cupy(late), stream=given, approximate="tanh")
    side.synchronize()
    assert_close(to_torch(y), F.gelu(x.double(), approximate="tanh"), torch.float32, f"stream= as {form}")


def test_waits_for_producer_stream_of_cuda_array_interface_v3():
    """An array still being written on a side stream, announced by the v3 `stream` key:
    rawops must order its launch after that stream's work."""
    n = 1 << 24
    source = random((n,), torch.float32)
    x = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy for tens of ms
        x.copy_(source)

    class Producer:  # a v3 producer whose data is ready only once `side` gets there
        __cuda_array_interface__ = {**x.__cuda_array_interface__, "version": 3, "stream": side.cuda_stream}

    y = rawops.relu(Producer())  # launched on CuPy's current stream, not `side`
    cupy.cuda.get_current_stream().synchronize()
    assert_close(to_torch(y), F.relu(source.double()), torch.float32, "producer stream")


def test_tensor_past_2_pow_31_elements():
    n = (1 << 31) + 5
    if torch.cuda.mem_get_info()[0] < 3 * n * 2 + (1 << 30):
        pytest.skip("not enough GPU memory for three 4 GiB tensors")
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    rawops.relu_scale(to_cupy(x), 2.0, out=to_cupy(out))
    torch.cuda.synchronize()
    assert torch.equal(out, torch.relu(x) * 2), "relu*2 is exact in bfloat16"
    assert not torch.isnan(out[-8:]).any()


def test_strided_cupy_view_runs_as_it_is_not_copied():
    # A stepped view in, a stepped out: the kernel reads and writes every other element in place,
    # the elements between stay as they were (a hidden copy would not touch them either, but a
    # kernel indexing the view as dense would).
    x = random((4096,), torch.float32)
    untouched = torch.full((4096,), float("nan"), device="cuda")
    y = rawops.gelu(to_cupy(x)[::2], approximate="tanh")
    assert y.flags.c_contiguous and y.shape == (2048,)
    assert_close(to_torch(y), F.gelu(x[::2].double(), approximate="tanh"), torch.float32, "x[::2]")
    rawops.relu(to_cupy(x)[1::2], out=to_cupy(untouched)[::2])
    assert_close(untouched[::2], F.relu(x[1::2].double()), torch.float32, "out=[::2]")
    assert torch.isnan(untouched[1::2]).all(), "wrote between the view's elements"


# ------------------------------------------------------------------------------ strided layouts
# Views of a contiguous base, made the same way in CuPy (what rawops gets) and torch (the float64
# reference): name -> (base shape for a logical (rows, cols), CuPy view, torch view of the base).
# "reversed" has negative strides (CuPy only: torch flips a copy for the reference); "broadcast"
# repeats one row (stride 0, an input only).
VIEWS = {
    "transposed": (lambda r, c: (c, r), lambda b, r, c: b.T, lambda b, r, c: b.t()),
    "stepped": (lambda r, c: (2 * r, 3 * c), lambda b, r, c: b[::2, ::3], lambda b, r, c: b[::2, ::3]),
    "offset": (lambda r, c: (r + 1, c + 3), lambda b, r, c: b[1:, 3:], lambda b, r, c: b[1:, 3:]),
    "sliced_columns": (lambda r, c: (r, 2 * c + 1), lambda b, r, c: b[:, c + 1:], lambda b, r, c: b[:, c + 1:]),
    "reversed": (lambda r, c: (r, c), lambda b, r, c: b[::-1, ::-1], lambda b, r, c: b.flip(0, 1)),
    "broadcast": (lambda r, c: (1, c), lambda b, r, c: cupy.broadcast_to(b, (r, c)), lambda b, r, c: b.expand(r, c)),
}
OUT_VIEWS = [name for name in VIEWS if name != "broadcast"]
STRIDED_SHAPE = (67, 45)  # rows x cols: odd sizes, several blocks of the strided kernel


def _view(name, dtype, shape=STRIDED_SHAPE, fill=None):
    """(CuPy view, torch view, torch base) of a fresh random base (or one full of `fill`)."""
    base_shape, cupy_view, torch_view = VIEWS[name]
    r, c = shape
    base = random(base_shape(r, c), dtype) if fill is None else torch.full(base_shape(r, c), fill, dtype=dtype,
                                                                            device="cuda")
    return cupy_view(to_cupy(base), r, c), torch_view(base, r, c), base


def _strided_inputs(names, layout, dtype, shape=STRIDED_SHAPE):
    """(CuPy operands, torch float64 references): every operand of the op's shape in `layout`,
    the bias every other element of a longer vector."""
    given, refs = [], []
    for name in names:
        if name == "bias":
            base = random((2 * shape[-1],), dtype)
            given.append(to_cupy(base)[::2])
            refs.append(base[::2].double())
        else:
            view, ref, _ = _view(layout, dtype, shape)
            given.append(view)
            refs.append(ref.double())
    return given, refs


def _strided_reference(name, refs):
    # OPS' references round their inputs to the storage type first; refs are already float64 views.
    return OPS[name][2](*refs)


def _floor(name, refs):
    return 0.01 * refs[0].norm().item() if "bwd" in name else 0.0


@pytest.mark.parametrize("layout", sorted(VIEWS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(OPS))
def test_every_op_takes_strided_views_of_every_operand(name, dtype, layout):
    names, call, _ = OPS[name]
    given, refs = _strided_inputs(names, layout, DTYPES[dtype])
    poison_pool(STRIDED_SHAPE[0] * STRIDED_SHAPE[1] * refs[0].element_size())
    out = call(*given)
    assert isinstance(out, cupy.ndarray) and out.flags.c_contiguous and out.shape == STRIDED_SHAPE
    assert_close(to_torch(out), _strided_reference(name, refs), DTYPES[dtype], f"{name} {layout}",
                 floor=_floor(name, refs))


@pytest.mark.parametrize("layout", sorted(VIEWS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_strided_operand_beside_contiguous_ones(dtype, layout):
    # Only the second operand strided (autograd's broadcast gradient as dy, a transposed y): the
    # others stay contiguous and the launch still takes the strided kernel.
    x = random(STRIDED_SHAPE, DTYPES[dtype])
    view, ref, _ = _view(layout, DTYPES[dtype])
    for name, call in (("add", lambda a, b: rawops.add(a, b)),
                       ("relu_scale_add", lambda a, b: rawops.relu_scale_add(a, ALPHA, b)),
                       ("gelu_tanh_bwd", lambda a, b: rawops.gelu_backward(b, a, "tanh"))):
        got = to_torch(call(to_cupy(x), view))
        want = OPS[name][2](*((x.double(), ref.double()) if name != "gelu_tanh_bwd" else (ref.double(), x.double())))
        assert_close(got, want, DTYPES[dtype], f"{name} {layout}", floor=_floor(name, [ref.double()]))


@pytest.mark.parametrize("out_layout", OUT_VIEWS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["gelu_erf", "relu_scale_add", "bias_gelu_tanh", "gelu_erf_bwd"])
def test_strided_out_is_written_in_place_and_nothing_else(name, dtype, out_layout):
    # out= a view of a NaN base: its elements get the result, every other element of the base
    # stays NaN. Inputs contiguous and transposed.
    names, call, _ = OPS[name]
    fn = {"gelu_erf": lambda x, **k: rawops.gelu(x, "none", **k),
          "relu_scale_add": lambda x, y, **k: rawops.relu_scale_add(x, ALPHA, y, **k),
          "bias_gelu_tanh": lambda x, b, **k: rawops.bias_gelu(x, b, "tanh", **k),
          "gelu_erf_bwd": lambda dy, x, **k: rawops.gelu_backward(dy, x, "none", **k)}[name]
    for in_layout in ("offset", "transposed"):
        given, refs = _strided_inputs(names, in_layout, DTYPES[dtype])
        out, out_ref, base = _view(out_layout, DTYPES[dtype], fill=float("nan"))
        outside = _outside(out_layout, base)
        result = fn(*given, out=out)
        assert result is out
        written = VIEWS[out_layout][2](base, *STRIDED_SHAPE)  # torch's view (a flipped copy for reversed)
        assert_close(written, _strided_reference(name, refs), DTYPES[dtype], f"{name} out {out_layout}",
                     floor=_floor(name, refs))
        assert torch.isnan(base[outside]).all(), f"{name}: wrote outside out's view ({out_layout})"


def _outside(layout, base):
    """The elements of `base` that the layout's view of it does not cover, as a torch mask."""
    mask = cupy.zeros(base.shape, dtype=cupy.uint8)
    VIEWS[layout][1](mask, *STRIDED_SHAPE)[...] = 1
    return to_torch(mask) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", OUT_VIEWS)
def test_in_place_on_a_strided_view(dtype, layout):
    x, x_ref, base = _view(layout, DTYPES[dtype])
    expected = F.gelu(x_ref.double(), approximate="tanh")
    before, outside = base.clone(), _outside(layout, base)
    assert rawops.gelu(x, "tanh", out=x) is x
    assert_close(VIEWS[layout][2](base, *STRIDED_SHAPE), expected, DTYPES[dtype], f"in place {layout}")
    assert torch.equal(base[outside], before[outside]), "wrote outside the view"


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_launch_past_one_grid_of_blocks(dtype):
    # A transposed 2300 x 2300: more elements than the strided kernels' bounded grid covers in one
    # pass (132 SMs x 32 blocks x 1024 elements), so blocks loop over chunks.
    x = random((2300, 2300), DTYPES[dtype])
    poison_pool(x.numel() * x.element_size())
    y = rawops.gelu(to_cupy(x).T, approximate="tanh")
    assert_close(to_torch(y), F.gelu(x.t().double(), approximate="tanh"), DTYPES[dtype], "transposed 2300^2")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "stepped", "broadcast", "reversed"])
@pytest.mark.parametrize("out_layout", [None, "transposed", "offset"])
def test_bias_gelu_backward_of_strided_operands(dtype, layout, out_layout):
    # dx through the strided kernel, dbias summed from dx where it was written (out's rows).
    given, refs = _strided_inputs(("dy", "x", "bias"), layout, DTYPES[dtype])
    dx64, db64 = _bias_gelu_grads64(*refs, "tanh")
    out = None
    if out_layout is not None:
        out, _, base = _view(out_layout, DTYPES[dtype], fill=float("nan"))
    dx, dbias = rawops.bias_gelu_backward(*given, approximate="tanh", out=out)
    if out is not None:
        assert dx is out
        dx = VIEWS[out_layout][2](base, *STRIDED_SHAPE)
    else:
        dx = to_torch(dx)
    assert_close(dx, dx64, DTYPES[dtype], f"dx {layout} out={out_layout}")
    assert_close(to_torch(dbias), db64, DTYPES[dtype], f"dbias {layout} out={out_layout}", factor=2)


# ------------------------------------------------------------------------------ torch adapter, strided
TORCH_VIEWS = [name for name in VIEWS if name != "reversed"]  # torch has no negative strides
ADAPTER_OPS = {  # name -> (input names, adapter call, float64 reference)
    "gelu_tanh": (("x",), lambda ta, x: ta.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "gelu_erf": (("x",), lambda ta, x: ta.gelu(x), F.gelu),
    "relu": (("x",), lambda ta, x: ta.relu(x), F.relu),
    "relu_scale": (("x",), lambda ta, x: ta.relu_scale(x, ALPHA), lambda x: F.relu(x) * ALPHA),
    "relu_scale_add": (("x", "y"), lambda ta, x, y: ta.relu_scale_add(x, ALPHA, y), lambda x, y: F.relu(x) * ALPHA + y),
    "add": (("a", "b"), lambda ta, a, b: ta.add(a, b), lambda a, b: a + b),
    "bias_gelu_tanh": (("x", "bias"), lambda ta, x, b: ta.bias_gelu(x, b, "tanh"),
                       lambda x, b: F.gelu(x + b, approximate="tanh")),
    "bias_gelu_erf": (("x", "bias"), lambda ta, x, b: ta.bias_gelu(x, b), lambda x, b: F.gelu(x + b)),
}


def _torch_strided(names, layout, dtype):
    out = []
    for name in names:
        if name == "bias":
            out.append(random((2 * STRIDED_SHAPE[-1],), dtype)[::2])
        else:
            out.append(_view(layout, dtype)[1])
    return out


@pytest.mark.parametrize("layout", TORCH_VIEWS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(ADAPTER_OPS))
def test_adapter_takes_strided_tensors_forward_and_backward(name, dtype, layout):
    # No grad: the C-level entry launches the strided kernel on the views. With grad: the forward
    # on the views, the backward on autograd's gradient (strided too: the broadcast of y.sum()'s
    # gradient, then a transposed one) and on the saved strided input.
    from rawops import torch_adapter as ta

    names, call, reference = ADAPTER_OPS[name]
    dt = DTYPES[dtype]
    inputs = _torch_strided(names, layout, dt)
    refs = [t.double() for t in inputs]
    with torch.no_grad():
        poison_torch_pool(STRIDED_SHAPE[0] * STRIDED_SHAPE[1] * inputs[0].element_size())
        y = call(ta, *inputs)
    assert y.shape == STRIDED_SHAPE
    assert_close(y, reference(*refs), dt, f"{name} {layout}")
    for gradient in ("sum", "transposed"):
        leaves = [t.detach().requires_grad_() for t in inputs]  # the same views, strides kept
        leaves64 = [t.double().requires_grad_() for t in inputs]
        out = call(ta, *leaves)
        if gradient == "sum":
            out.sum().backward()  # dy: ones broadcast at stride 0
            reference(*leaves64).sum().backward()
            dy_norm = (STRIDED_SHAPE[0] * STRIDED_SHAPE[1]) ** 0.5
        else:
            dy = random(STRIDED_SHAPE[::-1], dt).t()
            out.backward(dy)
            reference(*leaves64).backward(dy.double())
            dy_norm = dy.double().norm().item()
        for leaf, leaf64, input_name in zip(leaves, leaves64, names):
            assert leaf.grad is not None, f"{name}: no gradient for {input_name}"
            # the gradients' terms scale with dy (test_matches_torch_float64 says why the floor)
            assert_close(leaf.grad, leaf64.grad, dt, f"{name} {layout} d{input_name} ({gradient})", factor=2,
                         floor=0.01 * dy_norm)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adapter_in_place_relu_on_a_strided_view_writes_the_view(dtype):
    from rawops import torch_adapter as ta

    base = random((40, 90), DTYPES[dtype])
    view = base[::2, 1::3]
    expected, untouched = F.relu(view.double()), base.clone()
    assert ta.relu(view, inplace=True) is view
    assert_close(view, expected, DTYPES[dtype], "relu_ in place on a view")
    mask = torch.ones_like(base, dtype=torch.bool)
    mask[::2, 1::3] = False
    assert torch.equal(base[mask], untouched[mask])


def test_a_transposed_tensor_through_rawops_gelu_and_ta_gelu_gives_torchs_answer():
    from rawops import torch_adapter as ta

    for dt in DTYPES.values():
        base = random((257, 300), dt)
        x = base.t()
        expected = F.gelu(x.double())
        assert_close(to_torch(rawops.gelu(to_cupy(base).T)), expected, dt, "rawops.gelu(x.t())")
        y = ta.gelu(x)
        assert y.stride() == x.stride(), "torch.empty_like's layout: the transposed one, as torch gives"
        assert_close(y, expected, dt, "ta.gelu(x.t())")


# (dtype, bits of the significand after the point, the fraction of the result the math may miss
# beyond the result's rounding): float32 uses Numerical Recipes' erfc fit (1.2e-7) and expf; the
# half types a degree-5 fit (8.3e-6) and ex2.approx.
ERF_ACCURACY = [(torch.float32, 23, 1e-6), (torch.float16, 10, 2e-5), (torch.bfloat16, 7, 2e-5)]


@pytest.mark.parametrize("dtype, bits, math", ERF_ACCURACY, ids=["float32", "float16", "bfloat16"])
def test_erf_gelu_is_relatively_accurate_into_the_negative_tail(dtype, bits, math):
    # Element by element against float64, down to where the result leaves the type's normal range
    # (bfloat16: x = -13, gelu ~ -1e-37): 1 + erf(x) cancels there, so an erfc that is only
    # absolutely accurate fails by orders of magnitude (Abramowitz-Stegun 7.1.26 did: ~40%).
    x = torch.linspace(-14, 8, 8001, device="cuda", dtype=torch.float64).to(dtype)
    x64 = x.double()
    normal = torch.finfo(dtype).tiny
    # x Phi(x) through erfc: torch's float64 gelu adds 1 + erf(x / sqrt 2), which cancels below
    # x ~ -8 (at x = -8.34 it read -4.6e-16 where mpmath gives -3.0e-16, as the kernel did)
    ref = x64 * 0.5 * torch.special.erfc(-x64 / 2 ** 0.5)
    out = to_torch(rawops.gelu(to_cupy(x), "none")).double()
    # while float32's intermediates stay normal: below x ~ -13 Phi(x) is float32-subnormal (the
    # half types' ex2.approx.ftz flushes it), which costs float32 at x = -13.14 7e-6 of its result
    float32_normal = torch.finfo(torch.float32).tiny
    cdf, pdf = 0.5 * torch.erfc(-x64 / 2 ** 0.5), torch.exp(-x64 * x64 / 2) / (2 * torch.pi) ** 0.5
    keep = (ref.abs() >= normal) & (cdf >= float32_normal)
    # exp(-x^2 / 2) from float32's x^2: its rounding (2^-24 relative) is x^2 2^-24 absolute in the
    # exponent, so as much relative in the result (1e-5 at x = -13: float32 at -12.9 read 2.5e-6)
    argument = x64 * x64 * 2.0 ** -23
    allowed = (2.0 ** -bits + math + argument) * ref.abs()
    bad = ((out - ref).abs() > allowed) & keep
    assert not bad.any(), f"gelu erf at x = {x64[bad][:4].tolist()}: {out[bad][:4].tolist()} vs {ref[bad][:4].tolist()}"
    # The backward with dy = 1: gelu'(x) = Phi(x) + x phi(x); near its root (x ~ -0.75) the two
    # terms cancel, so the error is also allowed relative to the terms.
    grad = cdf + x64 * pdf
    dgrad = to_torch(rawops.gelu_backward(to_cupy(torch.ones_like(x)), to_cupy(x), "none")).double()
    keep = (grad.abs() >= normal) & (cdf >= float32_normal) & (pdf >= float32_normal)
    allowed = 2.0 ** -bits * grad.abs() + (math + argument) * (cdf + (x64 * pdf).abs())
    bad = ((dgrad - grad).abs() > allowed) & keep
    assert not bad.any(), (f"gelu' erf at x = {x64[bad][:4].tolist()}: {dgrad[bad][:4].tolist()} "
                           f"vs {grad[bad][:4].tolist()}")


def test_accepts_foreign_cuda_array_interface_objects():
    x = random((1000,), torch.float16)

    class Foreign:  # any producer: only the protocol, no CuPy, no torch type
        __cuda_array_interface__ = x.__cuda_array_interface__

    y = rawops.gelu(Foreign(), approximate="tanh")
    assert_close(to_torch(y), F.gelu(x.double(), approximate="tanh"), torch.float16, "foreign CAI")


def test_host_pointer_in_cuda_array_interface_is_refused():
    import numpy

    host = numpy.ones(16, dtype=numpy.float32)

    class Lying:
        __cuda_array_interface__ = {"shape": (16,), "typestr": "<f4", "data": (host.ctypes.data, False),
                                    "version": 3, "strides": None, "stream": None}

    with pytest.raises(ValueError, match="x"):
        rawops.gelu(Lying(), approximate="tanh")


def test_bfloat16_through_dlpack_producer():
    x = random((5000,), torch.bfloat16)

    class OnlyDLPack:
        def __dlpack__(self, **kwargs):
            return x.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return x.__dlpack_device__()

    y = rawops.relu(OnlyDLPack())
    assert_close(to_torch(y), F.relu(x.double()), torch.bfloat16, "DLPack")


def test_dlpack_producer_is_ordered_before_a_given_stream():
    """A DLPack producer orders its pending work before the stream its consumer names. torch's
    __dlpack__ orders its current stream's work; launched on another stream (stream=), rawops must
    wait for the stream it named on import (before: CuPy's current one, which the launch did not
    wait for, so the kernel read the NaN still being overwritten)."""
    x = random((1 << 20,), torch.float32)
    given = cupy.cuda.Stream(non_blocking=True)
    # A warm-up on the given stream: the kernel loaded and an output-sized block in that stream's
    # pool, so that neither a module load nor a fresh allocation synchronizes the device below
    # (either would order the launch after the copy whatever rawops does).
    rawops.gelu(to_cupy(x), stream=given, approximate="tanh")
    given.synchronize()
    side = torch.cuda.Stream()
    late = written_late(x, side)

    class OnlyDLPack:
        def __dlpack__(self, **kwargs):
            return late.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return late.__dlpack_device__()

    with torch.cuda.stream(side):  # torch's __dlpack__ orders the side stream's copy
        y = rawops.gelu(OnlyDLPack(), stream=given, approximate="tanh")
    given.synchronize()
    assert_close(to_torch(y), F.gelu(x.double(), approximate="tanh"), torch.float32, "DLPack on stream=")


def test_nvrtc_fallback_compiles_and_matches(monkeypatch):
    """The path taken when the build had no nvcc: sources compiled by NVRTC at first use."""
    from rawops import _modules

    monkeypatch.setattr(rawops.config, "force_nvrtc", True)
    monkeypatch.setattr(_modules, "_modules", {})
    monkeypatch.setattr(_modules, "_functions", {})
    with pytest.warns(RuntimeWarning, match="NVRTC"):
        kernel = _modules.get_function("elementwise", "gelu_tanh_fwd_f32", 0)
    x = random((4097,), torch.float32)
    y = torch.full_like(x, float("nan"))
    import numpy

    kernel((8,), (256,), (to_cupy(x), 0, 0, to_cupy(y), numpy.int64(x.numel()), numpy.int64(-1),
                          numpy.int64(1), numpy.float32(0)))
    cupy.cuda.Device().synchronize()
    assert_close(y, F.gelu(x.double(), approximate="tanh"), torch.float32, "NVRTC build")


def _launch_relu_f32(kernel, n=4097):
    import numpy

    x = random((n,), torch.float32)
    y = torch.full_like(x, float("nan"))
    kernel((8,), (256,), (to_cupy(x), 0, 0, to_cupy(y), numpy.int64(n), numpy.int64(-1), numpy.int64(1),
                          numpy.float32(0)))
    cupy.cuda.Device().synchronize()
    assert_close(y, F.relu(x.double()), torch.float32, "relu")


def test_dev_mode_rebuilds_the_checkout_kernels_once_per_content(monkeypatch, tmp_path):
    """config.dev_kernels: kernels/<family>.cu compiled by nvcc for this GPU, cached by content hash."""
    from rawops import _modules, _nvcc

    if _nvcc.find_nvcc() is None or not _modules._is_checkout_kernels(_modules.CHECKOUT_KERNELS):
        pytest.skip("dev mode needs nvcc and a source checkout")
    monkeypatch.setattr(rawops.config, "dev_kernels", True)
    monkeypatch.setattr(_modules, "DEV_CACHE", str(tmp_path))
    for attempt in range(2):  # the second load finds the cached build
        monkeypatch.setattr(_modules, "_modules", {})
        monkeypatch.setattr(_modules, "_functions", {})
        _launch_relu_f32(_modules.get_function("elementwise", "relu_fwd_f32", 0))
        assert len(list(tmp_path.glob("elementwise-sm*.fatbin"))) == 1


def test_first_use_from_many_threads_loads_each_module_once(monkeypatch):
    import threading

    from rawops import _modules

    monkeypatch.setattr(_modules, "_modules", {})
    monkeypatch.setattr(_modules, "_functions", {})
    monkeypatch.setattr(_modules, "_pointers", {})
    pointers, errors = [], []

    def first_use():
        try:
            cupy.cuda.Device(0).use()
            pointers.append(_modules.function_pointer("elementwise", "relu_fwd_f32", 0))
        except Exception as error:  # reported below: a thread's exception would vanish
            errors.append(error)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(pointers)) == 1 and len(_modules._modules) == 1
    _launch_relu_f32(_modules.get_function("elementwise", "relu_fwd_f32", 0))


def test_launch_from_a_thread_that_never_touched_cuda():
    import threading

    x = to_cupy(random((10007,), torch.float32))
    results = []
    thread = threading.Thread(target=lambda: results.append(rawops.gelu(x, approximate="tanh")))
    thread.start()
    thread.join()
    cupy.cuda.Device().synchronize()
    assert_close(to_torch(results[0]), F.gelu(to_torch(x).double(), approximate="tanh"), torch.float32, "thread")
