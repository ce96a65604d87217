"""The MLP family's source network: fused_mlp on the float32 100-128-64-10 ReLU network (the
network the project grew from): launch arithmetic, every argument check before any launch (fake
__cuda_array_interface__ producers, as in test_validation.py), and with a GPU (marker `gpu`) the
FFMA, small-batch and 3xTF32 forwards and the backward against torch.nn.Sequential in float64."""
import re

import pytest

import rawops
from test_validation import BASE, OTHER, FakeCAI, assert_passes_validation, f16, f32

import rawops._mlp_plans as plans  # noqa: E402
import rawops.mlp as mlp  # noqa: E402
from mlp_reference import (grads64, net_params, offset_weight_views, reference,  # noqa: E402
                           source_mlp, source_network, source_weights)

SHAPES = {"w1": (128, 100), "b1": (128,), "w2": (64, 128), "b2": (64,), "w3": (10, 64), "b3": (10,)}
NAMES = list(SHAPES)
# The source network's parameters by their names in fused_mlp's arguments.
ARGUMENT = {"w1": "weights[0]", "b1": "biases[0]", "w2": "weights[1]", "b2": "biases[1]", "w3": "weights[2]",
            "b3": "biases[2]"}


def _params(**replace):
    """Valid fake parameters, each in its own allocation; `replace` swaps one by name."""
    params = {name: f32(shape, ptr=OTHER + i * 0x10000) for i, (name, shape) in enumerate(SHAPES.items())}
    params.update(replace)
    return [params[name] for name in NAMES]


# ------------------------------------------------------------------------------ launch arithmetic
@pytest.mark.parametrize("batch, blocks", [(1, 1), (64, 1), (65, 2), (1 << 20, 1 << 14),
                                          ((1 << 20) + 3, (1 << 14) + 1)])
def test_one_block_per_tile_of_64_samples(batch, blocks):
    assert plans.source_blocks(batch) == blocks


def test_a_batch_past_one_grid_is_refused():
    with pytest.raises(ValueError, match="exceeds one launch's grid"):
        plans.source_blocks(plans.SOURCE_TILE * plans.MAX_GRID + 1)


def test_launch_kinds_are_one_per_table_argument():
    assert len(mlp.SOURCE_FWD_KINDS) == len(mlp.KERNELS["source_mlp_fwd"])


# ------------------------------------------------------------------------------ validation
def test_valid_calls_get_past_validation():
    assert_passes_validation(source_mlp, f32((32, 100)), *_params())
    assert_passes_validation(source_mlp, f32((0, 100)), *_params())
    assert_passes_validation(source_mlp, f32((32, 100)), *_params(), out=f32((32, 10), ptr=OTHER * 2))
    assert_passes_validation(source_mlp, f32((3, 100)), *_params(), output_activation="relu")
    assert_passes_validation(source_mlp, f32((3, 100), readonly=True), *_params())


@pytest.mark.parametrize("shape", [(32, 99), (32,), (100,), (2, 16, 100), ()])
def test_x_of_the_wrong_shape_is_a_value_error_naming_x(shape):
    # A 2-D x of the wrong width disagrees with the first weight, which the error names.
    expected = r"^weights\[0\] has shape \(128, 100\), expected \(out, 99\)" if len(shape) == 2 else \
        r"^x has shape .*, expected \(batch, n_in\)"
    with pytest.raises(ValueError, match=expected):
        source_mlp(f32(shape), *_params())


@pytest.mark.parametrize("name", NAMES)
def test_a_parameter_of_the_wrong_shape_is_a_value_error_naming_it(name):
    shape = SHAPES[name]
    wrong = shape[::-1] if len(shape) == 2 else (shape[0] + 1,)
    with pytest.raises(ValueError, match=rf"^{re.escape(ARGUMENT[name])} has shape {re.escape(str(wrong))}, expected"):
        source_mlp(f32((4, 100)), *_params(**{name: f32(wrong, ptr=OTHER + 0x100000)}))


@pytest.mark.parametrize("name", ["x", *NAMES])
def test_an_argument_that_is_not_float32_is_a_type_error_naming_it(name):
    x = f32((4, 100))
    if name == "x":
        x = FakeCAI((4, 100), "<i4")
        params, pattern = _params(), r"^x has dtype (int32|<i4); fused_mlp supports float32, float16, bfloat16"
    else:
        params = _params(**{name: f16(SHAPES[name], ptr=OTHER + 0x100000)})
        pattern = rf"^{re.escape(ARGUMENT[name])} has dtype float16, expected float32 like x"
    with pytest.raises(TypeError, match=pattern):
        source_mlp(x, *params)


@pytest.mark.parametrize("name", ["x", *NAMES])
def test_a_non_contiguous_or_misaligned_argument_is_a_value_error_naming_it(name):
    shape = (4, 100) if name == "x" else SHAPES[name]
    strides = tuple(8 * s for s in ((shape[1], 1) if len(shape) == 2 else (1,)))
    for bad, message in [(FakeCAI(shape, ptr=OTHER + 0x100000, strides=strides), "is not C-contiguous"),
                         (FakeCAI(shape, ptr=OTHER + 0x100002), "is misaligned")]:
        x = bad if name == "x" else f32((4, 100))
        params = _params() if name == "x" else _params(**{name: bad})
        with pytest.raises(ValueError, match=rf"^{re.escape(ARGUMENT.get(name, name))} {message}"):
            source_mlp(x, *params)


def test_an_argument_in_host_memory_is_a_type_error_naming_it():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"^weights\[1\] is (a host array|in host memory)"):
        source_mlp(f32((4, 100)), *_params(w2=np.zeros((64, 128), np.float32)))


def test_out_must_be_batch_by_10_float32_writable_and_apart_from_every_input():
    x = f32((4, 100))
    with pytest.raises(ValueError, match=r"^out has shape \(4, 11\), expected \(4, 10\)"):
        source_mlp(x, *_params(), out=f32((4, 11), ptr=OTHER * 2))
    with pytest.raises(TypeError, match=r"^out has dtype float16, expected float32 like x"):
        source_mlp(x, *_params(), out=f16((4, 10), ptr=OTHER * 2))
    with pytest.raises(ValueError, match=r"^out is read-only"):
        source_mlp(x, *_params(), out=f32((4, 10), ptr=OTHER * 2, readonly=True))
    with pytest.raises(ValueError, match=r"^out overlaps x; pass a separate array"):
        source_mlp(x, *_params(), out=f32((4, 10), ptr=BASE + 64))
    with pytest.raises(ValueError, match=r"^out overlaps biases\[2\]"):
        source_mlp(x, *_params(), out=f32((4, 10), ptr=OTHER + 5 * 0x10000 + 16))


def test_out_right_after_x_does_not_count_as_overlap():
    assert_passes_validation(source_mlp, f32((4, 100)), *_params(), out=f32((4, 10), ptr=BASE + 4 * 400))


@pytest.mark.parametrize("activation", ["gelu", "Relu"])
def test_an_unknown_output_activation_is_a_value_error(activation):
    with pytest.raises(ValueError, match=r"^output_activation must be one of \['none', 'relu'\]"):
        source_mlp(f32((4, 100)), *_params(), output_activation=activation)


@pytest.mark.parametrize("activation", [None, ["relu"]])
def test_an_output_activation_that_is_not_a_string_is_a_type_error(activation):
    with pytest.raises(TypeError, match=r"^output_activation must be a string, got "):
        source_mlp(f32((4, 100)), *_params(), output_activation=activation)


# ------------------------------------------------------------------------------ on the GPU
BATCHES = [0, 1, 32, 63, 64, 65, 1000, (1 << 20) + 3]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("output_activation", ["none", "relu"])
def test_source_network_matches_torch_float64(batch, output_activation):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    net = source_network(torch, output_activation == "relu")  # fresh random weights every call
    x = random((batch, 100), torch.float32)
    poison_pool(batch * 10 * 4)
    y = source_mlp(to_cupy(x), *(to_cupy(t) for t in source_weights(net)), output_activation=output_activation)
    assert y.shape == (batch, 10) and y.dtype == "float32"
    assert_close(y, reference(net, x), torch.float32, f"source network batch {batch}")


@pytest.mark.gpu
def test_source_network_writes_into_out_and_touches_nothing_past_it():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random, to_cupy

    net = source_network(torch)
    x = random((1000, 100), torch.float32)
    buffer = torch.full((1000 * 10 + 64,), float("nan"), device="cuda")
    out = buffer[: 1000 * 10].view(1000, 10)
    y = source_mlp(to_cupy(x), *(to_cupy(t) for t in source_weights(net)), out=to_cupy(out))
    torch.cuda.synchronize()
    assert_close(out, reference(net, x), torch.float32, "out=")
    assert torch.isnan(buffer[1000 * 10:]).all(), "wrote past out"
    assert y.data.ptr == out.data_ptr()


@pytest.mark.gpu
def test_source_network_on_offset_views_and_a_given_stream():
    """Inputs that start off 16-byte alignment (a sliced parameter buffer) and a non-default stream."""
    torch = pytest.importorskip("torch")
    import cupy
    from gpu_reference import assert_close, random, to_cupy, written_late

    net = source_network(torch)
    views = offset_weight_views(torch, net)
    source = random((77, 100), torch.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    # An offset view, NaN unless the launch waits behind `stream`'s work.
    x = written_late(source, stream, into=torch.empty(77 * 100 + 1, device="cuda")[1:].view(77, 100))
    y = source_mlp(to_cupy(x), *(to_cupy(v) for v in views), stream=stream)
    stream.synchronize()
    assert_close(y, reference(net, x), torch.float32, "offset views")


@pytest.mark.gpu
def test_source_network_propagates_nan_like_torch():
    torch = pytest.importorskip("torch")
    from gpu_reference import to_cupy

    net = source_network(torch)
    x = torch.randn(70, 100, device="cuda")
    x[3, 7] = float("nan")
    y = torch.from_dlpack(source_mlp(to_cupy(x), *(to_cupy(t) for t in source_weights(net))))
    assert torch.isnan(y[3]).all() and not torch.isnan(y[torch.arange(70, device="cuda") != 3]).any()


# ------------------------------------------------------------------------------ torch adapter (forward only)
def test_adapter_refuses_bad_arguments_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    weights = [torch.ones(s) for s in ((128, 100), (64, 128), (10, 64))]
    biases = [torch.ones(s) for s in (128, 64, 10)]
    with pytest.raises(ValueError, match=r"^x is on cpu"):
        ta.fused_mlp(torch.ones(4, 100), weights, biases)
    with pytest.raises(TypeError, match=r"^x has dtype torch.int32"):
        ta.fused_mlp(torch.ones(4, 100, dtype=torch.int32), weights, biases)
    with pytest.raises(ValueError, match=r"^biases must be None or a list of 2 tensors, one per weight"):
        ta.fused_mlp(torch.ones(4, 100), weights[:2], biases)
    with pytest.raises(ValueError, match=r"^output_activation must be one of"):
        ta.fused_mlp(torch.ones(4, 100), weights, biases, output_activation="gelu")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 32, 1000])
def test_adapter_matches_torch_float64_on_torch_current_stream(batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random, written_late
    from rawops import torch_adapter as ta

    net = source_network(torch)
    w1, b1, w2, b2, w3, b3 = source_weights(net)
    stream = torch.cuda.Stream()
    x = written_late(random((batch, 100), torch.float32), stream)  # NaN unless the launch waits behind `stream`
    with torch.cuda.stream(stream), torch.no_grad():
        y = ta.fused_mlp(x, (w1, w2, w3), (b1, b2, b3))
    stream.synchronize()
    assert_close(y, reference(net, x), torch.float32, f"adapter batch {batch}")


@pytest.mark.gpu
def test_adapter_source_network_checks_shapes_and_has_a_gradient():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    net = source_network(torch)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    x = torch.randn(4, 100, device="cuda", requires_grad=True)
    ta.fused_mlp(x, [m.weight for m in linears], [m.bias for m in linears]).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match=r"^weights\[1\] has shape \(128, 64\), expected \(out, 128\)"):
        ta.fused_mlp(torch.randn(4, 100, device="cuda"), [linears[0].weight, linears[1].weight.t().contiguous(),
                                                         linears[2].weight], [m.bias for m in linears])


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 8, 32, 33, 127, 128, 129, 1000, 4096, 4097, 70000])
@pytest.mark.parametrize("output_activation", ["none", "relu"])
@pytest.mark.parametrize("use_tc", [True, False])
@pytest.mark.parametrize("need_dx", [True, False])
def test_source_backward_matches_torch_float64(batch, output_activation, use_tc, need_dx, monkeypatch):
    # use_tc: config.mlp_tf32 (the default), the tensor pipe beyond SMALL_BATCH_MAX; else FFMA.
    # Up to SMALL_BWD_ROWS one launch (its dx blocks only where dx is wanted), beyond it the chain,
    # the weight-gradient partials and their reduces.
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random, to_cupy, to_torch

    monkeypatch.setattr(rawops.config, "mlp_tf32", use_tc)
    if not use_tc and batch not in (4097, 70000):
        pytest.skip("the same kernels either way up to SMALL_BATCH_MAX")
    if not need_dx and batch > 2 * plans.SMALL_BWD_ROWS:
        pytest.skip("dx is one more launch of the same chain beyond SMALL_BWD_ROWS")
    names = _launched_kernels(monkeypatch)

    net = source_network(torch, output_activation == "relu")
    weights, biases = net_params(net)
    x = random((batch, 100), torch.float32)
    dy = random((batch, 10), torch.float32)
    cw, cb = [to_cupy(w) for w in weights], [to_cupy(b) for b in biases]
    y, saved = rawops.fused_mlp_forward(to_cupy(x), cw, cb, "relu", output_activation)
    forward = len(names)
    dx, dws, dbs = rawops.fused_mlp_backward(to_cupy(dy), to_cupy(x), y, saved, cw, cb, "relu", output_activation,
                                             need_dx=need_dx)
    assert (dx is None) == (not need_dx)
    one_launch = names[forward:] == ["source_mlp_small_bwd_f32"]
    assert one_launch == (0 < batch <= plans.SMALL_BWD_ROWS), names[forward:]
    y64 = grads64(net, x, dy)[0]
    assert_close(y, y64, torch.float32, "y")
    # The backward against float64 math on our own forward's ReLU masks and activations: at
    # large batches a z within float32 rounding of 0 flips its mask between any float32
    # forward and the float64 one, which would test the forward's rounding, not the backward.
    h1, h2, y32 = (to_torch(a).double() for a in (*saved, y))
    w1, w2, w3 = (w.double() for w in weights)
    g3 = dy.double() * (y32 > 0) if output_activation == "relu" else dy.double()
    g2 = (g3 @ w3) * (h2 > 0)
    g1 = (g2 @ w2) * (h1 > 0)
    if need_dx:
        assert_close(dx, g1 @ w1, torch.float32, "dx")
    for i, (g, a) in enumerate([(g1, x.double()), (g2, h1), (g3, h2)]):
        assert_close(dws[i], g.T @ a, torch.float32, f"dW{i}")
        assert_close(dbs[i], g.sum(0), torch.float32, f"db{i}")
    # and within float32 rounding of the float64 network's, on the rows whose ReLU masks the two
    # forwards agree on: a z within float32 rounding of 0 flips one (measured: one flip in a batch
    # of 1000 put the whole dx 5.3e-3 off), and those rows must stay rare.
    _, dx64, dw64, _ = grads64(net, x, dy)
    b1, b2, b3 = (b.double() for b in biases)
    z1 = x.double() @ w1.T + b1
    z2 = torch.relu(z1) @ w2.T + b2
    z3 = torch.relu(z2) @ w3.T + b3
    flipped = ((z1 > 0) != (h1 > 0)).any(1) | ((z2 > 0) != (h2 > 0)).any(1)
    if output_activation == "relu":
        flipped |= ((z3 > 0) != (y32 > 0)).any(1)
    assert int(flipped.sum()) <= max(1, batch // 100), f"{int(flipped.sum())} of {batch} rows flipped a ReLU mask"
    kept = ~flipped
    if need_dx:
        assert_close(to_torch(dx).double()[kept], dx64[kept], torch.float32, "dx vs the float64 network",
                     factor=300)
    tc = use_tc and batch > plans.SMALL_BATCH_MAX
    assert ("source_mlp_tc_dgrad_bwd_f32" in names) == tc and ("source_mlp_tc_wgrad0_bwd_f32" in names) == tc, names


def _launched_kernels(monkeypatch):
    """Names of the mlp kernels launched from now on (the routing the GPU tests rely on)."""
    import rawops._modules as modules

    names, launch = [], mlp.launch
    by_pointer = {}

    def recording(function, *args):
        if not by_pointer:
            for name in mlp.ENTRY_POINTS:
                if mlp.FAMILY_OF[name] in ("mlp_source", "mlp_source_tc"):
                    by_pointer[modules.function_pointer(mlp.FAMILY_OF[name], name, args[-1])] = name
        names.append(by_pointer.get(function, function))
        return launch(function, *args)

    monkeypatch.setattr(mlp, "launch", recording)
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 33, 4097, 70000])
@pytest.mark.parametrize("output_activation", ["none", "relu"])
@pytest.mark.parametrize("variant", sorted(plans.SOURCE_TC_VARIANTS))
def test_3xtf32_forward_matches_torch_float64(variant, batch, output_activation, monkeypatch):
    # Every batch through the 3xTF32 kernel (SMALL_BATCH_MAX 0): one row, a partial tile, one
    # row past a whole number of tiles, more tiles than the grid's warps. 1e-5 is the float32
    # tolerance: a single TF32 product (no split) is off by ~1e-3.
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    monkeypatch.setattr(plans, "SMALL_BATCH_MAX", 0)
    monkeypatch.setattr(rawops.config, "mlp_tf32", True)  # the default
    monkeypatch.setattr(plans, "SOURCE_TC", variant)
    names = _launched_kernels(monkeypatch)
    net = source_network(torch, output_activation == "relu")
    x = random((batch, 100), torch.float32)
    poison_pool(batch * 40)
    y = source_mlp(to_cupy(x), *(to_cupy(t) for t in source_weights(net)), output_activation=output_activation)
    assert names == [f"{variant}_f32"]
    assert_close(y, reference(net, x), torch.float32, f"{variant} batch {batch}")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(plans.SOURCE_TC_VARIANTS))
def test_3xtf32_forward_on_misaligned_views_nan_and_out(variant, monkeypatch):
    """x off 16-byte alignment (the 4-byte cp.async path), y 4-byte aligned (scalar stores),
    weights in one flat buffer, a NaN in two rows of different tiles: NaN stays in its row."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random, to_cupy

    monkeypatch.setattr(rawops.config, "mlp_tf32", True)  # the default
    monkeypatch.setattr(plans, "SOURCE_TC", variant)
    names = _launched_kernels(monkeypatch)
    net = source_network(torch)
    views = offset_weight_views(torch, net)
    batch = 5003
    x = random((batch * 100 + 1,), torch.float32)[1:].view(batch, 100)
    x[3, 7] = float("nan")
    x[4999, 99] = float("nan")
    buffer = torch.full((batch * 10 + 1 + 64,), float("nan"), device="cuda")
    out = buffer[1: 1 + batch * 10].view(batch, 10)
    source_mlp(to_cupy(x), *(to_cupy(v) for v in views), out=to_cupy(out))
    torch.cuda.synchronize()
    assert names == [f"{variant}_f32"]
    assert torch.isnan(buffer[1 + batch * 10:]).all() and torch.isnan(buffer[0]), "wrote outside out"
    nan_rows = torch.zeros(batch, dtype=torch.bool, device="cuda")
    nan_rows[[3, 4999]] = True
    assert torch.isnan(out[nan_rows]).all()
    assert_close(out[~nan_rows], reference(net, x)[~nan_rows], torch.float32, "misaligned")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [4097, 70001])
@pytest.mark.parametrize("use_tc", [True, False])
def test_large_batch_forwards_match_torch_float64(batch, use_tc, monkeypatch):
    """Inference and the training forward (h1, h2 kept) take the 3xTF32 kernel with
    config.mlp_tf32 (the default), else the exact FFMA kernel."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    monkeypatch.setattr(rawops.config, "mlp_tf32", use_tc)
    names = _launched_kernels(monkeypatch)
    net = source_network(torch, True)
    weights, biases = net_params(net)
    x = random((batch, 100), torch.float32)
    cw, cb = [to_cupy(w) for w in weights], [to_cupy(b) for b in biases]
    poison_pool(batch * 40)
    y = rawops.fused_mlp(to_cupy(x), cw, cb, "relu", "relu")
    assert_close(y, reference(net, x), torch.float32, f"inference, tc={use_tc}")
    poison_pool(batch * 40)
    y, saved = rawops.fused_mlp_forward(to_cupy(x), cw, cb, "relu", "relu")
    assert names == [f"{plans.SOURCE_TC}_f32" if use_tc else "source_mlp_fwd_f32"] * 2
    assert_close(y, reference(net, x), torch.float32, "training")
    h1 = torch.relu(x.double() @ weights[0].double().T + biases[0].double())
    assert_close(saved[0], h1, torch.float32, "kept h1")
    assert_close(saved[1], torch.relu(h1 @ weights[1].double().T + biases[1].double()), torch.float32, "kept h2")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 32, 33, 1000, 4096, 4097, (1 << 20) + 3])
def test_fused_mlp_float32_is_the_source_network(batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_pool, random, to_cupy

    net = source_network(torch)
    weights, biases = net_params(net)
    x = random((batch, 100), torch.float32)
    poison_pool(batch * 40)
    y = rawops.fused_mlp(to_cupy(x), [to_cupy(w) for w in weights], [to_cupy(b) for b in biases])
    assert_close(y, reference(net, x), torch.float32, f"fused_mlp f32 batch {batch}")
