"""The MLP family's contract, first slice: seed_mlp, the source network 100-128-64-10.

Without a GPU: launch arithmetic, and every argument check firing before any launch (fake
__cuda_array_interface__ producers, as in test_validation.py). With one (marker `gpu`):
against torch.nn.Sequential in float64 on fresh random weights and inputs."""
import importlib
import re

import pytest

import rawops
from test_validation import BASE, OTHER, FakeCAI, assert_passes_validation, f16, f32

mlp = importlib.import_module("rawops.mlp")

SHAPES = {"w1": (128, 100), "b1": (128,), "w2": (64, 128), "b2": (64,), "w3": (10, 64), "b3": (10,)}
NAMES = list(SHAPES)


def _params(**replace):
    """Valid fake parameters, each in its own allocation; `replace` swaps one by name."""
    params = {name: f32(shape, ptr=OTHER + i * 0x10000) for i, (name, shape) in enumerate(SHAPES.items())}
    params.update(replace)
    return [params[name] for name in NAMES]


# ------------------------------------------------------------------------------ launch arithmetic
@pytest.mark.parametrize("batch, blocks", [(1, 1), (64, 1), (65, 2), (1 << 20, 1 << 14), ((1 << 20) + 3, (1 << 14) + 1)])
def test_one_block_per_tile_of_64_samples(batch, blocks):
    assert mlp.seed_blocks(batch) == blocks


def test_a_batch_past_one_grid_is_refused():
    with pytest.raises(ValueError, match="exceeds one launch's grid"):
        mlp.seed_blocks(mlp.SEED_TILE * mlp._rows.MAX_GRID + 1)


def test_launch_kinds_are_one_per_table_argument():
    assert len(mlp.SEED_FWD_KINDS) == len(mlp.KERNELS["seed_mlp_fwd"])


# ------------------------------------------------------------------------------ validation
def test_valid_calls_get_past_validation():
    assert_passes_validation(rawops.seed_mlp, f32((32, 100)), *_params())
    assert_passes_validation(rawops.seed_mlp, f32((0, 100)), *_params())
    assert_passes_validation(rawops.seed_mlp, f32((32, 100)), *_params(), out=f32((32, 10), ptr=OTHER * 2))
    assert_passes_validation(rawops.seed_mlp, f32((3, 100)), *_params(), output_activation="relu")
    assert_passes_validation(rawops.seed_mlp, f32((3, 100), readonly=True), *_params())


@pytest.mark.parametrize("shape", [(32, 99), (32,), (100,), (2, 16, 100), ()])
def test_x_of_the_wrong_shape_is_a_value_error_naming_x(shape):
    with pytest.raises(ValueError, match=r"^x has shape .*, expected \(B, 100\)"):
        rawops.seed_mlp(f32(shape), *_params())


@pytest.mark.parametrize("name", NAMES)
def test_a_parameter_of_the_wrong_shape_is_a_value_error_naming_it(name):
    shape = SHAPES[name]
    wrong = shape[::-1] if len(shape) == 2 else (shape[0] + 1,)
    expected = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    with pytest.raises(ValueError, match=rf"^{name} has shape .*, expected {re.escape(expected)}"):
        rawops.seed_mlp(f32((4, 100)), *_params(**{name: f32(wrong, ptr=OTHER + 0x100000)}))


@pytest.mark.parametrize("name", ["x", *NAMES])
def test_an_argument_that_is_not_float32_is_a_type_error_naming_it(name):
    x = f32((4, 100))
    if name == "x":
        x = f16((4, 100))
        params = _params()
    else:
        params = _params(**{name: f16(SHAPES[name], ptr=OTHER + 0x100000)})
    with pytest.raises(TypeError, match=rf"^{name} has dtype float16; seed_mlp supports float32"):
        rawops.seed_mlp(x, *params)


@pytest.mark.parametrize("name", ["x", *NAMES])
def test_a_non_contiguous_or_misaligned_argument_is_a_value_error_naming_it(name):
    shape = (4, 100) if name == "x" else SHAPES[name]
    strides = tuple(8 * s for s in ((shape[1], 1) if len(shape) == 2 else (1,)))
    for bad, message in [(FakeCAI(shape, ptr=OTHER + 0x100000, strides=strides), "is not C-contiguous"),
                         (FakeCAI(shape, ptr=OTHER + 0x100002), "is misaligned")]:
        x = bad if name == "x" else f32((4, 100))
        params = _params() if name == "x" else _params(**{name: bad})
        with pytest.raises(ValueError, match=rf"^{name} {message}"):
            rawops.seed_mlp(x, *params)


def test_an_argument_in_host_memory_is_a_type_error_naming_it():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"^w2 is (a host array|in host memory)"):
        rawops.seed_mlp(f32((4, 100)), *_params(w2=np.zeros((64, 128), np.float32)))


def test_out_must_be_batch_by_10_float32_writable_and_apart_from_every_input():
    x = f32((4, 100))
    with pytest.raises(ValueError, match=r"^out has shape \(4, 11\), expected \(4, 10\)"):
        rawops.seed_mlp(x, *_params(), out=f32((4, 11), ptr=OTHER * 2))
    with pytest.raises(TypeError, match=r"^out has dtype float16; seed_mlp supports float32"):
        rawops.seed_mlp(x, *_params(), out=f16((4, 10), ptr=OTHER * 2))
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.seed_mlp(x, *_params(), out=f32((4, 10), ptr=OTHER * 2, readonly=True))
    with pytest.raises(ValueError, match=r"^out overlaps x; pass a separate array"):
        rawops.seed_mlp(x, *_params(), out=f32((4, 10), ptr=BASE + 64))
    with pytest.raises(ValueError, match=r"^out overlaps b3"):
        rawops.seed_mlp(x, *_params(), out=f32((4, 10), ptr=OTHER + 5 * 0x10000 + 16))


def test_out_right_after_x_does_not_count_as_overlap():
    assert_passes_validation(rawops.seed_mlp, f32((4, 100)), *_params(), out=f32((4, 10), ptr=BASE + 4 * 400))


@pytest.mark.parametrize("activation", ["gelu", "Relu", None])
def test_an_unknown_output_activation_is_a_value_error(activation):
    with pytest.raises(ValueError, match=r"^output_activation must be one of \['none', 'relu'\]"):
        rawops.seed_mlp(f32((4, 100)), *_params(), output_activation=activation)


# ------------------------------------------------------------------------------ on the GPU
BATCHES = [0, 1, 32, 63, 64, 65, 1000, (1 << 20) + 3]


def _network(torch, output_relu=False):
    layers = [torch.nn.Linear(100, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
              torch.nn.Linear(64, 10)]
    if output_relu:
        layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def _weights(net):
    linears = [m for m in net if m.__class__.__name__ == "Linear"]
    return [t.detach() for m in linears for t in (m.weight, m.bias)]


def _reference(net, x):
    """float64 on the same float32 numbers."""
    import copy

    return copy.deepcopy(net).double()(x.double()).detach()


@pytest.mark.gpu
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("output_activation", ["none", "relu"])
def test_seed_mlp_matches_torch_float64(batch, output_activation):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    net = _network(torch, output_activation == "relu")  # fresh random weights every call
    x = random((batch, 100), torch.float32)
    poison_pool(batch * 10 * 4)
    y = rawops.seed_mlp(to_cupy(x), *(to_cupy(t) for t in _weights(net)), output_activation=output_activation)
    assert y.shape == (batch, 10) and y.dtype == "float32"
    assert_close(y, _reference(net, x), torch.float32, f"seed_mlp batch {batch}")


@pytest.mark.gpu
def test_seed_mlp_writes_into_out_and_touches_nothing_past_it():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random, to_cupy

    net = _network(torch)
    x = random((1000, 100), torch.float32)
    buffer = torch.full((1000 * 10 + 64,), float("nan"), device="cuda")
    out = buffer[: 1000 * 10].view(1000, 10)
    y = rawops.seed_mlp(to_cupy(x), *(to_cupy(t) for t in _weights(net)), out=to_cupy(out))
    torch.cuda.synchronize()
    assert_close(out, _reference(net, x), torch.float32, "out=")
    assert torch.isnan(buffer[1000 * 10:]).all(), "wrote past out"
    assert y.data.ptr == out.data_ptr()


@pytest.mark.gpu
def test_seed_mlp_on_offset_views_and_a_given_stream():
    """Inputs that start off 16-byte alignment (a sliced parameter buffer) and a non-default stream."""
    torch = pytest.importorskip("torch")
    import cupy
    from gpu_reference import assert_close, random, to_cupy

    net = _network(torch)
    flat = torch.cat([torch.zeros(1, device="cuda")] + [t.reshape(-1) for t in _weights(net)])
    views, offset = [], 1
    for t in _weights(net):
        views.append(flat[offset: offset + t.numel()].view(t.shape))
        offset += t.numel()
    x = random((77 * 100 + 1,), torch.float32)[1:].view(77, 100)
    stream = cupy.cuda.Stream(non_blocking=True)
    y = rawops.seed_mlp(to_cupy(x), *(to_cupy(v) for v in views), stream=stream)
    stream.synchronize()
    assert_close(y, _reference(net, x), torch.float32, "offset views")


@pytest.mark.gpu
def test_seed_mlp_propagates_nan_like_torch():
    torch = pytest.importorskip("torch")
    from gpu_reference import to_cupy

    net = _network(torch)
    x = torch.randn(70, 100, device="cuda")
    x[3, 7] = float("nan")
    y = torch.from_dlpack(rawops.seed_mlp(to_cupy(x), *(to_cupy(t) for t in _weights(net))))
    assert torch.isnan(y[3]).all() and not torch.isnan(y[torch.arange(70, device="cuda") != 3]).any()


# ------------------------------------------------------------------------------ torch adapter (forward only)
def test_adapter_refuses_bad_arguments_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    weights = [torch.ones(s) for s in ((128, 100), (64, 128), (10, 64))]
    biases = [torch.ones(s) for s in (128, 64, 10)]
    with pytest.raises(ValueError, match=r"^x is on cpu"):
        ta.seed_mlp(torch.ones(4, 100), weights, biases)
    with pytest.raises(TypeError, match=r"^x has dtype torch.int32"):
        ta.seed_mlp(torch.ones(4, 100, dtype=torch.int32), weights, biases)
    with pytest.raises(ValueError, match=r"^seed_mlp takes 3 weights and 3 biases, got 2 and 3"):
        ta.seed_mlp(torch.ones(4, 100), weights[:2], biases)
    with pytest.raises(ValueError, match=r"^output_activation must be one of"):
        ta.seed_mlp(torch.ones(4, 100), weights, biases, output_activation="gelu")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 32, 1000])
def test_adapter_matches_torch_float64_on_torch_current_stream(batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random
    from rawops import torch_adapter as ta

    net = _network(torch)
    w1, b1, w2, b2, w3, b3 = _weights(net)
    x = random((batch, 100), torch.float32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        y = ta.seed_mlp(x, (w1, w2, w3), (b1, b2, b3))
    stream.synchronize()
    assert_close(y, _reference(net, x), torch.float32, f"adapter batch {batch}")


@pytest.mark.gpu
def test_adapter_refuses_inputs_that_need_a_gradient():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    net = _network(torch)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    with pytest.raises(NotImplementedError, match="no backward yet"):
        ta.seed_mlp(torch.randn(4, 100, device="cuda"), [m.weight for m in linears], [m.bias for m in linears])
    with pytest.raises(ValueError, match=r"^w2 has shape \(128, 64\), expected \(64, 128\)"):
        ta.seed_mlp(torch.randn(4, 100, device="cuda"), [linears[0].weight, linears[1].weight.t().contiguous(),
                                                        linears[2].weight], [m.bias for m in linears])
