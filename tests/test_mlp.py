"""The MLP family's tensor-core networks: fused_mlp on tiny-cuda-nn-style float16 / bfloat16
networks (the WMMA tile kernels, the register-resident forward, the fused backward), their
plans and checks without a GPU, and the torch adapter (autograd, custom ops, FusedMLP) against
torch.nn.Sequential in float64 with one (marker `gpu`). The source network: test_mlp_source.py."""
import re

import pytest

import rawops
from test_validation import OTHER, FakeCAI, assert_passes_validation, f16, f32

import rawops._mlp_plans as plans  # noqa: E402
import rawops.mlp as mlp  # noqa: E402
from mlp_reference import (away_from_relu_kinks, grads64, kernel_source, net_params, reference,  # noqa: E402
                           sequential, source_network)


# ============================================================================== fused_mlp: CPU contract
TC_SIZES = (64, 64, 64, 64, 64, 64)  # 64 in, 4 hidden layers of 64, 64 out


def _fake_net(sizes, maker=f16, bias=True):
    ws = [maker((b, a), ptr=OTHER + i * 0x100000) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
    bs = [maker((b,), ptr=OTHER + 0x4000000 + i * 0x10000) for i, b in enumerate(sizes[1:])] if bias else None
    return ws, bs


@pytest.mark.parametrize("dtype, sizes, activation", [
    (0, (100, 128, 64, 10), "relu"), (1, (64, 64, 64, 64, 64, 64), "relu"), (2, (3, 16, 16, 1), "gelu"),
    (1, (128,) + (128,) * 8 + (128,), "none"), (1, (1, 32, 1), "relu")])
def test_supported_networks_get_a_plan(dtype, sizes, activation):
    plan = plans.make_plan(dtype, sizes, activation, "none", True)
    assert plan.regime == ("source" if dtype == 0 else "tc")
    assert plan.layers == len(sizes) - 1 and plan.n_in == sizes[0] and plan.n_out == sizes[-1]


@pytest.mark.parametrize("dtype, sizes, activation, bias, fragment", [
    (0, (100, 128, 64, 11), "relu", True, "float32 network of sizes (100, 128, 64, 11)"),
    (0, (100, 128, 64, 10), "gelu", True, "activation 'gelu'"),
    (0, (100, 128, 64, 10), "relu", False, "no biases"),
    (1, (64, 48, 48, 64), "relu", True, "hidden widths (48, 48)"),
    (1, (64, 64, 32, 64), "relu", True, "hidden widths (64, 32)"),
    (1, (129, 64, 64), "relu", True, "n_in 129"),
    (1, (64, 64, 0), "relu", True, "n_out 0"),
    (1, (64,) + (64,) * 9 + (64,), "relu", True, "9 hidden layers"),
    (2, (64, 64), "relu", True, "0 hidden layers"),
])
def test_unsupported_networks_are_a_value_error_naming_what_is_supported(dtype, sizes, activation, bias, fragment):
    with pytest.raises(ValueError, match="fused_mlp supports: float32 with sizes") as info:
        plans.make_plan(dtype, sizes, activation, "none", bias)
    assert fragment in str(info.value)


@pytest.mark.parametrize("activation, output_activation, match", [
    ("tanh", "none", r"^activation must be one of \['gelu', 'none', 'relu'\]"),
    ("relu", "gelu", r"^output_activation must be one of \['none', 'relu'\]")])
def test_unknown_activations_are_a_value_error(activation, output_activation, match):
    with pytest.raises(ValueError, match=match):
        plans.make_plan(1, TC_SIZES, activation, output_activation, True)


def test_shared_memory_of_the_tile_kernels():
    # 8 warps x 256 float scratch + 128 float biases + [128][72] tile + [64][72] weights, 2 bytes
    assert plans.tc_smem_bytes(64, 64, 64) == 8192 + 512 + 2 * (128 * 72 + 64 * 72)
    assert plans.tc_smem_bytes(3, 16, 1) == 8192 + 512 + 2 * (128 * 24 + 16 * 24)
    assert plans.tc_smem_bytes(128, 128, 128) > 48 * 1024  # needs the opt-in attribute (sm_80+)
    # resident: 5 layers' biases, every layer's weights stacked (4 x 64 rows + 64 output rows)
    assert plans.tc_smem_bytes(64, 64, 64, 4) == 8192 + 5 * 512 + 2 * (128 * 72 + 320 * 72)


@pytest.mark.parametrize("limit, fit", [(232448, (True, 75264)), (101376, (True, 75264)),
                                        (65536, (False, 8192 + 512 + 2 * (128 * 72 + 64 * 72))), (30000, None)])
def test_weights_stay_resident_only_where_the_device_holds_them(monkeypatch, limit, fit):
    # H100 227 KB, sm_86 99 KB: resident; sm_75 64 KB: streamed; too little: a ValueError before launch
    monkeypatch.setattr(mlp, "optin_smem", lambda device: limit)
    monkeypatch.setattr(mlp, "_fits", {})
    plan = plans.make_plan(1, (64,) * 6, "relu", "none", True)
    if fit is None:
        with pytest.raises(ValueError, match=r"needs 36352 bytes of shared memory per block; device 0 allows 30000"):
            mlp.tc_fit(plan, 0)
    else:
        assert mlp.tc_fit(plan, 0) == fit


def test_bfloat16_before_sm80_is_refused_before_any_launch(monkeypatch):
    monkeypatch.setattr(mlp, "compute_capability", lambda device: 75)
    plan = plans.make_plan(2, (64,) * 6, "relu", "none", True)
    with pytest.raises(RuntimeError, match=r"bfloat16 needs sm_80\+ .* device 0 is sm_75: use float16"):
        mlp.prepare(plan, 0)


def test_fast_forward_shared_memory():
    # 5 layers' float biases, weights with rows padded by 8 ([64][72] x 5), 16 warps x 32 rows
    # of x and y staging ([32][72] each)
    assert plans.fast_smem_bytes(64, 64, 64, 4, 16) == 5 * 512 + 2 * 5 * 64 * 72 + 2 * 16 * 32 * 144 == 196096
    # odd sizes pad to 16: [16][24] in, [16][24] out, one hidden layer (no hidden-to-hidden weights)
    assert plans.fast_smem_bytes(3, 16, 1, 1, 4) == 2 * 512 + 2 * (16 * 24 + 16 * 24) + 2 * 4 * 32 * 48
    # 128 wide: 16-row warp tiles
    assert plans.fast_smem_bytes(128, 128, 128, 2, 1) == 3 * 512 + 2 * 3 * 128 * 136 + 2 * 16 * 272


@pytest.mark.parametrize("sizes, cc, limit, fit", [
    ((64,) * 6, 90, 232448, (16, 196096)),                     # H100: 16 warps
    ((64,) * 6, 86, 101376, (5, 48640 + 5 * 9216)),            # sm_86's 99 KB: 5 warps
    ((64,) * 6, 75, 65536, None),                              # no mma.sync m16n8k16 / cp.async
    ((128,) * 10, 90, 232448, None),                           # 8 x 128 wide: the weights alone exceed it
    ((128,) + (128,) * 4 + (128,), 90, 232448, (6, 5 * 512 + 2 * 5 * 128 * 136 + 6 * 8704)),
])
def test_fast_forward_runs_where_its_weights_and_four_warps_fit(monkeypatch, sizes, cc, limit, fit):
    monkeypatch.setattr(mlp, "optin_smem", lambda device: limit)
    monkeypatch.setattr(mlp, "compute_capability", lambda device: cc)
    monkeypatch.setattr(mlp, "_fast_fits", {})
    assert mlp.fast_fit(plans.make_plan(1, sizes, "relu", "none", True), 0) == fit


def test_a_kernels_shared_memory_limit_is_only_ever_raised(monkeypatch):
    # one kernel serves networks of different sizes: a smaller one must not lower the limit a
    # larger one set (the next launch of the larger one would fail with CUDA_ERROR_INVALID_VALUE)
    kernel = type("Kernel", (), {"max_dynamic_shared_size_bytes": 0, "preferred_shared_memory_carveout": 0})()
    monkeypatch.setattr(mlp._modules, "get_function", lambda family, name, device: kernel)
    monkeypatch.setattr(mlp._modules, "function_pointer", lambda family, name, device: name)
    monkeypatch.setattr(mlp, "_ready", {})
    monkeypatch.setattr(mlp, "_smem_set", {})
    plan = plans.make_plan(1, (64,) * 6, "relu", "none", True)
    for smem in (196096, 100000, 196096, 200000):
        mlp._tc_function("tc_mlp_w64_relu_fwd", plan, 0, smem)
        assert kernel.max_dynamic_shared_size_bytes >= smem
    assert kernel.max_dynamic_shared_size_bytes == 200000


def test_fast_forward_entries_match_the_table():
    source = kernel_source("mlp_fused_fwd")
    assert "tc_mlp_w##W##_##ACT##_fwd_##suffix(" in source
    widths = re.findall(r"^  RAWOPS_TC_FAST_ACTS\(suffix, T, (\d+), (\d+)\)", source, flags=re.M)
    acts = re.findall(r"^  RAWOPS_TC_FAST\(suffix, T, W, MT, (\w+), rawops::kAct(\w+)\)", source, flags=re.M)
    assert all(name == code.lower() and plans.FAST_ACTIVATIONS[plans.ACTIVATIONS[name]] == name for name, code in acts)
    assert {f"tc_mlp_w{w}_{a}_fwd" for w, _ in widths for a, _ in acts} == set(mlp.TC_FAST_KERNELS)
    assert all(int(mt) * 16 == plans.fast_rows(int(w)) for w, mt in widths), "kMT x 16 = fast_rows(width)"
    assert all(args == mlp._TC_FWD_ARGS for args in mlp.TC_FAST_KERNELS.values())
    assert len(mlp.TC_FWD_KINDS) == len(mlp._TC_FWD_ARGS)
    for w in (16, 32, 64, 128):
        for a in ("relu", "gelu", "none"):
            assert {f"tc_mlp_w{w}_{a}_fwd_f16", f"tc_mlp_w{w}_{a}_fwd_bf16"} <= mlp.ENTRY_POINTS


def test_fused_backward_shared_memory():
    # float accumulators [64][64 + 2 x 8 db slots] x 5, weights [64][72] x 5, 8 warps x 32 rows of
    # G and A ([72] each)
    assert plans.fast_bwd_smem_bytes(64, 64, 64, 4, 8) == 4 * 5 * 64 * 80 + 2 * 5 * 64 * 72 + 2 * 8 * 32 * 144 == 222208
    # inputs and outputs wider than the hidden width: layer 0 [32][128 + 4 x 8], output layer
    # [128][32 + 8]; G and A rows as wide as the widest side
    assert plans.fast_bwd_smem_bytes(128, 32, 128, 2, 2) == (4 * (32 * 160 + 32 * 40 + 128 * 40)
                                                           + 2 * (32 * 136 + 32 * 40 + 128 * 40) + 2 * 2 * 32 * 272)
    layout, stride = plans.fast_bwd_partials(plans.make_plan(1, (17, 32, 5), "relu", "none", True))
    assert layout == [(0, 32, 17, 32, 32), (32 * 32 + 32, 5, 32, 16, 32)] and stride == 32 * 33 + 16 * 33


@pytest.mark.parametrize("sizes, cc, limit, fit", [
    ((64,) * 6, 90, 232448, (8, 222208)),                      # H100: 8 warps, one block per SM
    ((64,) * 6, 86, 101376, None),                             # sm_86's 99 KB: not even the accumulators
    ((64,) * 6, 75, 65536, None),                              # no mma.sync m16n8k16
    ((64, 128, 128, 64), 90, 232448, None),                    # 128 wide: the tile kernels
    ((128,) + (32,) * 8 + (128,), 90, 232448, (6, 218112)),     # 6 warps beside 8 hidden layers' accumulators
    ((64,) + (64,) * 8 + (64,), 90, 232448, None),             # 8 hidden layers of 64: 9 accumulators too many
])
def test_fused_backward_runs_where_its_accumulators_and_two_warps_fit(monkeypatch, sizes, cc, limit, fit):
    monkeypatch.setattr(mlp, "optin_smem", lambda device: limit)
    monkeypatch.setattr(mlp, "compute_capability", lambda device: cc)
    monkeypatch.setattr(mlp, "_fast_bwd_fits", {})
    assert mlp.fast_bwd_fit(plans.make_plan(1, sizes, "relu", "none", True), 0) == fit


def test_fused_backward_entries_match_the_table():
    source = kernel_source("mlp_fused_bwd")
    assert "tc_mlp_w##W##_##ACT##_bwd_##suffix(" in source
    widths = re.findall(r"^  RAWOPS_TC_FAST_BWD_ACTS\(suffix, T, (\d+)\)", source, flags=re.M)
    acts = re.findall(r"^  RAWOPS_TC_FAST_BWD\(suffix, T, W, (\w+), rawops::kAct(\w+)\)", source, flags=re.M)
    assert all(name == code.lower() for name, code in acts)
    assert {f"tc_mlp_w{w}_{a}_bwd" for w in widths for a, _ in acts} == set(mlp.TC_FAST_BWD_KERNELS)
    assert tuple(int(w) for w in widths) == plans.FAST_BWD_WIDTHS
    signature = re.search(r"tc_mlp_w##W##_##ACT##_bwd_##suffix\((.*?)\)\s*\{", source.replace("\\\n", " "),
                          flags=re.S).group(1)
    params = [p.strip() for p in signature.replace("RAWOPS_TC_PARAMS(T)", ", ".join(f"const T *w{i}" for i in range(9)))
              .split(",")]
    assert [p.split()[-1].lstrip("*") for p in params] == list(mlp._TC_FAST_BWD_ARGS)
    assert "".join("p" if "*" in p else "q" for p in params) == mlp.TC_FAST_BWD_KINDS
    for w in plans.FAST_BWD_WIDTHS:
        for a in ("relu", "gelu", "none"):
            assert {f"tc_mlp_w{w}_{a}_bwd_f16", f"tc_mlp_w{w}_{a}_bwd_bf16"} <= mlp.ENTRY_POINTS


@pytest.mark.parametrize("sizes, nf", [((64,) * 6, 4), ((3, 16, 16, 1), 4), ((17, 32, 5), 4), ((100, 128, 10), 8),
                                       ((128,) + (32,) * 8 + (128,), 8), ((48, 32, 32, 33), 4)])
def test_the_tile_kernels_hold_the_widest_layer(sizes, nf):
    assert plans.make_plan(1, sizes, "relu", "none", True).nf == nf


def test_small_networks_keep_their_weights_resident_and_large_ones_stream():
    assert plans.make_plan(1, (64,) * 6, "relu", "none", True).resident
    assert plans.make_plan(2, (3, 16, 16, 1), "gelu", "none", True).resident
    assert not plans.make_plan(1, (128,) * 10, "relu", "none", True).resident
    plan = plans.make_plan(1, (128,) * 10, "relu", "none", True)
    assert plan.smem == plans.tc_smem_bytes(128, 128, 128)
    assert plans.tc_wgrad_smem_bytes(10, 100) == 2 * 64 * (16 + 8 + 112 + 8)


@pytest.mark.parametrize("batch", [1, 31, 32, 33, 1000, 4096, (1 << 20) + 3, 1 << 22])
@pytest.mark.parametrize("unit", [32, 64])
def test_weight_gradient_chunks_cover_the_batch_once(batch, unit):
    chunks, rows = plans.wgrad_plan(batch, 264, unit)
    assert rows % unit == 0 and 1 <= chunks <= 264
    assert (chunks - 1) * rows < batch <= chunks * rows


def test_batch_zero_has_no_chunks():
    assert plans.wgrad_plan(0, 264, 64) == (0, 64)


@pytest.mark.parametrize("batch, kernel", [(1, "small"), (4096, "small"), (4097, "tiled")])
def test_small_batches_take_the_small_kernel(batch, kernel):
    assert (batch <= plans.SMALL_BATCH_MAX) == (kernel == "small")
    assert plans.small_blocks(batch) == -(-batch // 2)


def test_shared_memory_of_the_3xtf32_source_kernels():
    # W1 [128][104], W2 [64][136], W3 [16][72], biases 128 + 64 + 16, floats; x rows [rows][104] a warp
    assert plans.SOURCE_TC_WEIGHT_BYTES == 4 * 23376 == 93504
    assert plans.source_tc_smem(16, 16) == 93504 + 16 * 16 * 416 == 200000
    assert plans.source_tc_smem(32, 8) == 200000 <= 232448  # the H100's opt-in


def _route(monkeypatch, cc, limit, sms=132):
    """source_launch on a fake device: (kernel name, grid, block, shared bytes)."""
    kernel = type("Kernel", (), {"max_dynamic_shared_size_bytes": 0})()
    monkeypatch.setattr(mlp, "compute_capability", lambda device: cc)
    monkeypatch.setattr(mlp, "optin_smem", lambda device: limit)
    monkeypatch.setattr(mlp, "sm_count", lambda device: sms)
    monkeypatch.setattr(mlp, "_source_tc_fits", {})
    monkeypatch.setattr(mlp._modules, "get_function", lambda family, name, device: kernel)
    monkeypatch.setattr(mlp._modules, "function_pointer", lambda family, name, device: name)
    return kernel


@pytest.mark.parametrize("batch, cc, limit, expected", [
    (1, 90, 232448, ("source_mlp_small_fwd_f32", 1, 256, 0)),
    (4096, 90, 232448, ("source_mlp_small_fwd_f32", 2048, 256, 0)),
    (4097, 90, 232448, ("source_mlp_tc32_fwd_f32", 17, 256, 200000)),          # 129 tiles of 32 rows / 8 warps
    (1 << 20, 90, 232448, ("source_mlp_tc32_fwd_f32", 132, 256, 200000)),      # H100: persistent, one block per SM
    (1 << 20, 80, 166912, ("source_mlp_tc32_fwd_f32", 132, 128, 93504 + 4 * 13312)),  # A100's 163 KB: 4 warps, not 5
    (1 << 20, 86, 101376, ("source_mlp_fwd_f32", 1 << 14, 128, 0)),          # ~99 KB: no room beside the weights
    (1 << 20, 75, 65536, ("source_mlp_fwd_f32", 1 << 14, 128, 0)),           # no tf32 mma.sync / cp.async
])
def test_the_source_network_picks_its_kernel_by_batch_and_device(monkeypatch, batch, cc, limit, expected):
    # the default (config.mlp_tf32): the routing by batch and by what the device fits
    kernel = _route(monkeypatch, cc, limit)
    assert rawops.config.SWITCHES["mlp_tf32"][0] is True
    monkeypatch.setattr(rawops.config, "mlp_tf32", True)
    assert mlp.source_launch(batch, 0) == expected
    if "tc" in expected[0]:
        assert kernel.max_dynamic_shared_size_bytes == expected[3], "the shared-memory limit is set before launch"


def test_the_training_forward_takes_the_inference_kernel_and_the_switch_the_exact_ffma_one(monkeypatch):
    _route(monkeypatch, 90, 232448)
    monkeypatch.setattr(rawops.config, "mlp_tf32", True)
    launched = []
    monkeypatch.setattr(mlp, "launch", lambda function, *args: launched.append(function))
    mlp.launch_source_forward(0, 1, 2, 3, 4, 5, 6, 7, 8, 1 << 20, 0, 0, h1s=9, h2s=10)
    mlp.launch_source_forward(0, 1, 2, 3, 4, 5, 6, 7, 8, 1 << 20, 0, 0)
    mlp.launch_source_forward(0, 1, 2, 3, 4, 5, 6, 7, 8, 4096, 0, 0, h1s=9, h2s=10)
    assert launched == ["source_mlp_tc32_fwd_f32", "source_mlp_tc32_fwd_f32", "source_mlp_small_fwd_f32"]
    monkeypatch.setattr(rawops.config, "mlp_tf32", False)
    assert mlp.source_launch(1 << 20, 0)[0] == "source_mlp_fwd_f32"


def _backward_launches(monkeypatch, batch, cc=90, dx=0):
    """(kernel, grid, block) of every launch of the source network's backward on a fake device."""
    _route(monkeypatch, cc, 232448)
    launched = []
    monkeypatch.setattr(mlp, "launch", lambda function, grid, block, *args: launched.append((function, grid, block)))
    plan = mlp.plans.make_plan(0, (100, 128, 64, 10), "relu", "none", True)
    counter = iter(range(1000, 100000, 1000))
    mlp.launch_backward(plan, 0, 1, 2, 3, (4, 5), (6, 7, 8), dx, (11, 12, 13), (14, 15, 16), batch, 0,
                        lambda shape, dtype: (None, next(counter)))
    return launched


def test_the_source_backward_runs_on_the_tensor_pipe_where_the_forward_does(monkeypatch):
    monkeypatch.setattr(rawops.config, "mlp_tf32", True)
    tc = _backward_launches(monkeypatch, 1 << 20)
    assert [k for k, _, _ in tc] == ["source_mlp_tc_dgrad_bwd_f32"] + [
        name for l in range(3) for name in (f"source_mlp_tc_wgrad{l}_bwd_f32", "mlp_wgrad_reduce_bwd_f32")]
    assert tc[0][1:] == ((132,), 32 * plans.SOURCE_TC_DGRAD_WARPS) and tc[1][2] == plans.WGRAD_TC_THREADS
    with_dx = [k for k, _, _ in _backward_launches(monkeypatch, 1 << 20, dx=99)]
    assert with_dx[:2] == ["source_mlp_tc_dgrad_bwd_f32", "mlp_dgrad_bwd_f32"], "dx by the FFMA chain's last step"
    for batch, cc in ((4096, 90), (1 << 20, 75)):  # the small batches and pre-sm_80: FFMA, as the forward
        ffma = [k for k, _, _ in _backward_launches(monkeypatch, batch, cc)]
        assert ffma == ["mlp_dgrad_bwd_f32"] * 2 + ["mlp_wgrad_bwd_f32", "mlp_wgrad_reduce_bwd_f32"] * 3, (batch, cc)
    monkeypatch.setattr(rawops.config, "mlp_tf32", False)
    assert "source_mlp_tc_dgrad_bwd_f32" not in [k for k, _, _ in _backward_launches(monkeypatch, 1 << 20)]


@pytest.mark.parametrize("tf32", [True, False])
def test_a_small_batch_backward_is_one_launch_and_larger_ones_are_not(monkeypatch, tf32):
    # 16 weight blocks (8 of layer 1's units each), then, where dx is wanted, one block per 8 rows
    monkeypatch.setattr(rawops.config, "mlp_tf32", tf32)
    for batch, dx, grid in ((1, 0, 16), (1, 99, 17), (32, 0, 16), (33, 99, 21), (128, 0, 16), (128, 99, 32)):
        assert _backward_launches(monkeypatch, batch, dx=dx) == [("source_mlp_small_bwd_f32", (grid,), 256)], batch
    for batch in (0, 129):  # nothing to launch but the reduces' zeros, or past the kernel's shared memory
        names = [k for k, _, _ in _backward_launches(monkeypatch, batch)]
        assert "source_mlp_small_bwd_f32" not in names and names[-1] == "mlp_wgrad_reduce_bwd_f32", batch
    # the torch adapter's typed backward asks the same question (None: launch_backward's other kernels)
    for batch, dx, grid in ((1, True, 17), (33, True, 21), (128, False, 16)):
        assert mlp.source_small_backward_launch(batch, dx, 0) == ("source_mlp_small_bwd_f32", grid, 256), batch
    assert mlp.source_small_backward_launch(0, True, 0) is None
    assert mlp.source_small_backward_launch(129, False, 0) is None


def test_the_small_batch_backward_gets_every_pointer_in_its_place(monkeypatch):
    _route(monkeypatch, 90, 232448)
    calls = []
    monkeypatch.setattr(mlp, "launch", lambda function, grid, block, smem, stream, args, kinds, device:
                        calls.append((function, args, kinds)))
    for out_act, ym in (("none", 0), ("relu", 3)):
        plan = mlp.plans.make_plan(0, (100, 128, 64, 10), "relu", out_act, True)
        keep = mlp.launch_backward(plan, 0, 1, 2, 3, (4, 5), (6, 7, 8), 9, (11, 12, 13), (14, 15, 16), 32, 0,
                                   lambda shape, dtype: pytest.fail("no temporaries"))
        args = (1, ym, 6, 7, 8, 2, 4, 5, 9, 11, 14, 12, 15, 13, 16, 32)
        assert keep == [] and calls[-1] == ("source_mlp_small_bwd_f32", args, mlp.SMALL_BWD_KINDS)


def test_float32_without_the_switch_is_exact_ffma_at_every_batch_and_device(monkeypatch):
    # config.mlp_tf32 = False (RAWOPS_MLP_TF32=0): the exact FFMA kernels everywhere.
    monkeypatch.setattr(rawops.config, "mlp_tf32", False)
    for cc, limit in ((90, 232448), (80, 166912), (100, 232448), (120, 101376)):
        _route(monkeypatch, cc, limit)
        for batch in (1, 4096, 4097, 8192, 65536, 1 << 20):
            name = mlp.source_launch(batch, 0)[0]
            assert name == ("source_mlp_small_fwd_f32" if batch <= plans.SMALL_BATCH_MAX else "source_mlp_fwd_f32"), \
                (cc, batch, name)


def test_the_switch_reads_its_environment_variable(monkeypatch):
    saved = rawops.config.mlp_tf32
    try:
        monkeypatch.setenv("RAWOPS_MLP_TF32", "0")
        rawops.config.reset()
        assert rawops.config.mlp_tf32 is False
        monkeypatch.setenv("RAWOPS_MLP_TF32", "1")
        rawops.config.reset()
        assert rawops.config.mlp_tf32 is True
        monkeypatch.delenv("RAWOPS_MLP_TF32", raising=False)
        rawops.config.reset()
        assert rawops.config.mlp_tf32 is True, "on by default"
    finally:
        monkeypatch.delenv("RAWOPS_MLP_TF32", raising=False)
        rawops.config.reset()
        rawops.config.mlp_tf32 = saved


@pytest.mark.parametrize("variant, batch, grid", [("source_mlp_tc16_fwd", 4097, 17),
                                                  ("source_mlp_tc16_fwd", 1 << 20, 132),
                                                  ("source_mlp_tc32_fwd", 4097, 17),
                                                  ("source_mlp_tc32_fwd", 40000, 132)])
def test_both_3xtf32_variants_launch_with_their_own_tiles(monkeypatch, variant, batch, grid):
    _route(monkeypatch, 90, 232448)
    monkeypatch.setattr(rawops.config, "mlp_tf32", True)
    monkeypatch.setattr(plans, "SOURCE_TC", variant)
    rows, warps = plans.SOURCE_TC_VARIANTS[variant]
    assert mlp.source_launch(batch, 0) == (f"{variant}_f32", grid, 32 * warps, plans.source_tc_smem(rows, warps))


def test_3xtf32_entries_match_the_table_and_trap_before_sm80():
    # Each variant's launch bounds name its warps in rawops/_constants.py (the table's source
    # too), and its template its rows: 16 x kMT.
    from rawops import _constants

    source = kernel_source("mlp_source_tc")
    entries = re.findall(r"__launch_bounds__\(32 \* RAWOPS_(\w+), 1\)\s+(source_mlp_tc\w+?_fwd)_f32\(.*?"
                         r"source_tc_fwd<(\d+), (\d+)>", source, flags=re.S)
    assert {name for _, name, _, _ in entries} == set(plans.SOURCE_TC_VARIANTS)
    for constant, name, mt, chunk in entries:
        rows, warps = plans.SOURCE_TC_VARIANTS[name]
        assert (getattr(_constants, constant), int(mt) * 16) == (warps, rows), name
        assert 128 % int(chunk) == 0
    assert re.search(r"__CUDA_ARCH__ >= 800\n#define RAWOPS_SOURCE_TC_CALL\(call\) call\n#else\n"
                     r"#define RAWOPS_SOURCE_TC_CALL\(call\) __trap\(\)", source), "sm_80+ only, a trap below"


def test_fused_mlp_valid_calls_get_past_validation():
    ws, bs = _fake_net(TC_SIZES)
    assert_passes_validation(rawops.fused_mlp, f16((1000, 64)), ws, bs)
    assert_passes_validation(rawops.fused_mlp, f16((0, 64)), ws, None and bs)
    ws32, bs32 = _fake_net((100, 128, 64, 10), f32)
    assert_passes_validation(rawops.fused_mlp, f32((5, 100)), ws32, bs32, output_activation="relu")


def test_fused_mlp_refuses_bad_networks_before_any_launch():
    ws, bs = _fake_net(TC_SIZES)
    with pytest.raises(ValueError, match=r"^x has shape \(64,\), expected \(batch, n_in\)"):
        rawops.fused_mlp(f16((64,)), ws, bs)
    with pytest.raises(ValueError, match=r"^weights\[0\] has shape \(64, 64\), expected \(out, 32\)"):
        rawops.fused_mlp(f16((4, 32)), ws, bs)
    with pytest.raises(TypeError, match=r"^weights\[2\] has dtype float32, expected float16 like x"):
        rawops.fused_mlp(f16((4, 64)), ws[:2] + [f32((64, 64), ptr=OTHER + 0x8000000)] + ws[3:], bs)
    with pytest.raises(ValueError, match=r"^biases\[1\] has shape \(63,\), expected \(64,\)"):
        rawops.fused_mlp(f16((4, 64)), ws, bs[:1] + [f16((63,), ptr=OTHER + 0x8000000)] + bs[2:])
    with pytest.raises(ValueError, match=r"^biases must be None or a list of 5"):
        rawops.fused_mlp(f16((4, 64)), ws, bs[:4])
    with pytest.raises(ValueError, match=r"^weights must be a non-empty list"):
        rawops.fused_mlp(f16((4, 64)), [], None)
    with pytest.raises(TypeError, match=r"^x has dtype uint8; fused_mlp supports float32, float16, bfloat16"):
        rawops.fused_mlp(FakeCAI((4, 64), "|u1"), ws, bs)
    with pytest.raises(ValueError, match=r"^weights\[1\] is not C-contiguous"):
        rawops.fused_mlp(f16((4, 64)), ws[:1] + [FakeCAI((64, 64), "<f2", OTHER + 0x8000000, strides=(2, 128))] +
                         ws[2:], bs)
    with pytest.raises(ValueError, match=r"hidden widths \(48,\)"):
        rawops.fused_mlp(f16((4, 64)), [f16((48, 64), ptr=OTHER), f16((8, 48), ptr=OTHER + 0x100000)], None)


def test_fused_mlp_out_is_checked():
    ws, bs = _fake_net(TC_SIZES)
    with pytest.raises(ValueError, match=r"^out has shape \(4, 63\), expected \(4, 64\)"):
        rawops.fused_mlp(f16((4, 64)), ws, bs, out=f16((4, 63), ptr=OTHER * 2))
    with pytest.raises(ValueError, match=r"^out overlaps weights\[0\]"):
        rawops.fused_mlp(f16((4, 64)), ws, bs, out=f16((4, 64), ptr=OTHER + 64))
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.fused_mlp(f16((4, 64)), ws, bs, out=f16((4, 64), ptr=OTHER * 2, readonly=True))


def test_fused_mlp_backward_checks_dy_and_saved():
    ws, bs = _fake_net(TC_SIZES)
    x, y = f16((4, 64)), f16((4, 64), ptr=OTHER * 2)
    saved = (f16((4, 4, 64), ptr=OTHER * 3),)
    with pytest.raises(ValueError, match=r"^dy has shape \(4, 63\), expected \(4, 64\)"):
        rawops.fused_mlp_backward(f16((4, 63), ptr=OTHER * 4), x, y, saved, ws, bs)
    with pytest.raises(ValueError, match=r"^saved\[0\] has shape \(3, 4, 64\)"):
        rawops.fused_mlp_backward(f16((4, 64), ptr=OTHER * 4), x, y, (f16((3, 4, 64), ptr=OTHER * 3),), ws, bs)
    with pytest.raises(ValueError, match=r"^saved must be the 1 array"):
        rawops.fused_mlp_backward(f16((4, 64), ptr=OTHER * 4), x, y, (), ws, bs)
    assert_passes_validation(rawops.fused_mlp_backward, f16((4, 64), ptr=OTHER * 4), x, y, saved, ws, bs)


def test_adapter_fused_mlp_refuses_bad_networks_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    ws = [torch.ones(64, 64, dtype=torch.float16) for _ in range(3)]
    with pytest.raises(ValueError, match=r"^x is on cpu"):
        ta.fused_mlp(torch.ones(4, 64, dtype=torch.float16), ws, None)
    with pytest.raises(ValueError, match="fused_mlp supports"):
        ta.FusedMLP((64, 48, 64), dtype=torch.float16)
    with pytest.raises(ValueError, match="fused_mlp supports"):
        ta.FusedMLP((100, 128, 64, 11))
    seq = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 8))
    with pytest.raises(ValueError, match="got Tanh"):
        ta.FusedMLP.from_sequential(seq)
    seq = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                              torch.nn.Linear(64, 8))
    with pytest.raises(ValueError, match="one hidden activation"):
        ta.FusedMLP.from_sequential(seq)


def test_from_sequential_reads_the_structure():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    seq = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                              torch.nn.Linear(64, 3), torch.nn.ReLU()).half()
    m = ta.FusedMLP.from_sequential(seq)
    assert m.sizes == (32, 64, 64, 3) and m.activation == "gelu" and m.output_activation == "relu"
    linears = [l for l in seq if isinstance(l, torch.nn.Linear)]
    for i, l in enumerate(linears):
        assert torch.equal(m.weights[i], l.weight) and torch.equal(m.biases[i], l.bias)
        assert m.weights[i].data_ptr() != l.weight.data_ptr()  # copied once, not shared


# ============================================================================== fused_mlp: on the GPU
def _grads_torch(net, x, dy):
    """The same in torch's own precision (the half-type reference error to measure ours by)."""
    xt = x.detach().clone().requires_grad_(True)
    for p in net.parameters():
        p.grad = None
    y = net(xt)
    y.backward(dy)
    linears = [m for m in net if m.__class__.__name__ == "Linear"]
    out = (y.detach(), xt.grad, [m.weight.grad.clone() for m in linears],
           [m.bias.grad.clone() for m in linears] if linears[0].bias is not None else None)
    for p in net.parameters():
        p.grad = None
    return out


def _rel(out, ref):
    import torch

    out64 = (torch.from_dlpack(out) if not isinstance(out, torch.Tensor) else out).double()
    return ((out64 - ref).norm() / max(ref.norm().item(), 1e-30)).item() if ref.numel() else 0.0


def _assert_like_torch(out, ref64, torch_out, dtype, what, factor=4):
    """Half types: our relative error against float64 within 2x torch's own (same dtype,
    rounding each layer's output and gradient too), or within factor x the dtype tolerance;
    never above 50%, whatever torch's error (a garbage result, ~100% off or NaN, cannot hide
    behind a large reference error). Deep float16 backwards reach 3-5% in torch itself on
    fresh data (dx at batch 1000: 0.030 for the 64x4 network, 0.051 for 100-128x3-10 with a
    relu output), and a single output that cancels is worse: batch 1 of 3-16-16-1 in
    bfloat16 put torch 26.5% off and rawops 31%. So the cap sits above what torch itself
    reaches and below garbage."""
    from gpu_reference import assert_close

    ours, theirs = _rel(out, ref64), _rel(torch_out, ref64)
    if ours <= 2 * theirs and ours <= 0.5:
        return
    assert_close(out, ref64, dtype, f"{what} (torch's own error {theirs:.3g})", factor=factor)


TC_CASES = [  # (sizes, activation, output_activation, dtype, bias)
    ((64, 64, 64, 64, 64, 64), "relu", "none", "float16", True),
    ((3, 16, 16, 1), "gelu", "none", "bfloat16", True),
    ((100, 128, 128, 128, 10), "relu", "relu", "float16", True),
    ((17, 32, 5), "none", "none", "bfloat16", False),
    ((128,) + (32,) * 8 + (128,), "gelu", "none", "float16", True),
]
TC_IDS = ["64x4-f16", "3-16-16-1-gelu-bf16", "100-128x3-10-relu-out", "17-32-5-nobias-bf16", "128-32x8-128-gelu"]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 33, 1000])
@pytest.mark.parametrize("case", TC_CASES, ids=TC_IDS)
def test_tc_forward_matches_torch_float64(case, batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import DTYPES, poison_pool, random, to_cupy

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    x = random((batch, sizes[0]), dtype, scale=1.0)
    poison_pool(batch * sizes[-1] * 2)
    y = rawops.fused_mlp(to_cupy(x), [to_cupy(w) for w in weights], [to_cupy(b) for b in biases] if bias else None,
                         act, out_act)
    assert y.shape == (batch, sizes[-1])
    # float32 accumulation, activations rounded to the half type between layers, as torch does
    with torch.no_grad():
        _assert_like_torch(y, reference(net, x), net(x), dtype, f"{sizes} batch {batch}")


# The fast forward (tc_mlp_w<W>_<act>_fwd) on every width, 1..8 hidden layers, both half types and
# every activation; n_in / n_out odd (element-wise x and y paths), 16-byte (cp.async and vector
# stores), 128 wide. Each case also names whether fast_fit must pick the fast kernel on an H100.
FAST_CASES = []
for _i, (_w, _h) in enumerate([(w, h) for w in (16, 32, 64, 128) for h in (1, 2, 4, 8)]):
    _n_in, _n_out = [(3, 1), (64, 64), (17, 5), (128, 128), (32, 16), (24, 40)][_i % 6]
    _act = ("relu", "gelu", "none")[_i % 3]
    FAST_CASES.append(((_n_in,) + (_w,) * _h + (_n_out,), _act, ("none", "relu")[_i % 2],
                       ("float16", "bfloat16")[_i % 2], _i % 5 != 4))
FAST_IDS = [f"{'-'.join(map(str, c[0][:2]))}x{len(c[0]) - 2}-{c[0][-1]}-{c[1]}-{c[2]}-{c[3]}" +
            ("" if c[4] else "-nobias") for c in FAST_CASES]


def _fast_on_this_gpu(sizes, dtype_code):
    import cupy

    plan = plans.make_plan(dtype_code, sizes, "relu", "none", True)
    return mlp.fast_fit(plan, cupy.cuda.Device().id) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 33, 1000, 65537])
@pytest.mark.parametrize("case", FAST_CASES, ids=FAST_IDS)
def test_fast_forward_matches_torch_float64(case, batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import DTYPES, poison_pool, random, to_cupy

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    if sizes[1] < 128 or len(sizes) < 8:  # 8 x 128-wide weights exceed any device's shared memory
        assert _fast_on_this_gpu(sizes, 1 if dtype == torch.float16 else 2), "expected the fast forward here"
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    x = random((batch, sizes[0]), dtype, scale=1.0)
    poison_pool(batch * sizes[-1] * 2)
    y = rawops.fused_mlp(to_cupy(x), [to_cupy(w) for w in weights], [to_cupy(b) for b in biases] if bias else None,
                         act, out_act)
    assert y.shape == (batch, sizes[-1])
    with torch.no_grad():
        _assert_like_torch(y, reference(net, x), net(x), dtype, f"{sizes} batch {batch}")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [33, 1000])
@pytest.mark.parametrize("case", FAST_CASES, ids=FAST_IDS)
def test_training_forward_saves_every_pre_activation(case, batch):
    """The training forward's kept z of every hidden layer (16-byte row segments from the quad
    transpose), every width and activation, n_out narrower and wider than the hidden width;
    batch 33 ends in a partial warp tile."""
    torch = pytest.importorskip("torch")
    import cupy
    from gpu_reference import DTYPES, poison_pool, random, to_cupy, to_torch

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    if sizes[1] < 128 or len(sizes) < 8:
        plan = plans.make_plan(1 if dtype == torch.float16 else 2, sizes, act, out_act, bias)
        assert mlp.fast_fit(plan, cupy.cuda.Device().id) is not None, "expected the fast forward"
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    x = random((batch, sizes[0]), dtype, scale=1.0)
    poison_pool(batch * max(sizes) * 2 * len(sizes))
    y, saved = rawops.fused_mlp_forward(to_cupy(x), [to_cupy(w) for w in weights],
                                        [to_cupy(b) for b in biases] if bias else None, act, out_act)
    activation = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "none": lambda v: v}[act]
    with torch.no_grad():
        _assert_like_torch(y, reference(net, x), net(x), dtype, "y")
        z = to_torch(saved[0])
        assert z.shape == (len(sizes) - 2, batch, sizes[1])
        h64, h = x.double(), x
        for l in range(len(sizes) - 2):
            b = biases[l] if bias else None
            z64 = h64 @ weights[l].double().T + (b.double() if bias else 0)
            zt = torch.nn.functional.linear(h, weights[l], b)
            _assert_like_torch(z[l], z64, zt, dtype, f"z{l}")
            h64, h = activation(z64), activation(zt)


@pytest.mark.gpu
def test_fast_forward_many_tiles_per_warp_and_the_saved_pre_activations():
    """2^20 + 3 rows: every warp walks many tiles (the prefetch of the next x while the
    current one computes), the last one partial; the training forward's kept z per layer."""
    torch = pytest.importorskip("torch")
    from gpu_reference import poison_pool, random, to_cupy, to_torch

    sizes = (64,) * 6
    net = sequential(torch, sizes, "gelu", "relu", torch.float16)
    weights, biases = net_params(net)
    batch = (1 << 20) + 3
    x = random((batch, 64), torch.float16, scale=1.0)
    poison_pool(batch * 64 * 2 * 5)
    y, saved = rawops.fused_mlp_forward(to_cupy(x), [to_cupy(w) for w in weights], [to_cupy(b) for b in biases],
                                        "gelu", "relu")
    with torch.no_grad():
        _assert_like_torch(y, reference(net, x), net(x), torch.float16, "y")
        z = to_torch(saved[0])
        h64, h16 = x.double(), x
        for l in range(4):
            w, b = weights[l], biases[l]
            z64, z16 = h64 @ w.double().T + b.double(), torch.nn.functional.linear(h16, w, b)
            _assert_like_torch(z[l], z64, z16, torch.float16, f"z{l}")
            h64, h16 = torch.nn.functional.gelu(z64), torch.nn.functional.gelu(z16)
    y2 = rawops.fused_mlp(to_cupy(x), [to_cupy(w) for w in weights], [to_cupy(b) for b in biases], "gelu", "relu")
    assert (y2 == y).all(), "inference and training forward compute the same numbers"


@pytest.mark.gpu
@pytest.mark.parametrize("n_in", [64, 24])
def test_fast_forward_on_misaligned_views(n_in):
    """x and out starting 2 bytes off 16-byte alignment (element-wise staging and stores)."""
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy

    net = sequential(torch, (n_in, 32, 32, 16), "relu", "none", torch.bfloat16)
    weights, biases = net_params(net)
    x = random((777 * n_in + 1,), torch.bfloat16, scale=1.0)[1:].view(777, n_in)
    buffer = torch.full((777 * 16 + 9,), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = buffer[1: 1 + 777 * 16].view(777, 16)
    rawops.fused_mlp(to_cupy(x), [to_cupy(w) for w in weights], [to_cupy(b) for b in biases], out=to_cupy(out))
    torch.cuda.synchronize()
    with torch.no_grad():
        _assert_like_torch(out, reference(net, x), net(x), torch.bfloat16, "misaligned")
    assert torch.isnan(buffer[0]) and torch.isnan(buffer[1 + 777 * 16:]).all(), "wrote outside out"


@pytest.mark.gpu
@pytest.mark.parametrize("case", TC_CASES[:3], ids=TC_IDS[:3])
def test_fast_and_tile_forwards_agree(case, monkeypatch):
    torch = pytest.importorskip("torch")
    from gpu_reference import DTYPES, assert_close, random, to_cupy, to_torch

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    args = ([to_cupy(w) for w in weights], [to_cupy(b) for b in biases] if bias else None, act, out_act)
    x = to_cupy(random((5000, sizes[0]), dtype, scale=1.0))
    fast = to_torch(rawops.fused_mlp(x, *args))
    monkeypatch.setattr(rawops.config, "mlp_fast_forward", False)
    tile = to_torch(rawops.fused_mlp(x, *args))
    assert_close(fast, tile.double(), dtype, "fast vs tile kernel")


def _gradient_bytes(batch, sizes, itemsize, bias):
    """The bytes of dx, each dW and each db of a network of layer `sizes`, for poison_pool."""
    layers = list(zip(sizes, sizes[1:]))
    return ([batch * sizes[0] * itemsize] + [n_in * n_out * itemsize for n_in, n_out in layers]
            + ([n_out * itemsize for _, n_out in layers] if bias else []))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 33, 1000, 70000])
@pytest.mark.parametrize("case", TC_CASES, ids=TC_IDS)
def test_tc_backward_matches_torch_float64(case, batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import DTYPES, poison_pool, random, to_cupy

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    x = random((batch, sizes[0]), dtype, scale=1.0)
    dy = random((batch, sizes[-1]), dtype, scale=1.0)
    cw = [to_cupy(w) for w in weights]
    cb = [to_cupy(b) for b in biases] if bias else None
    y, saved = rawops.fused_mlp_forward(to_cupy(x), cw, cb, act, out_act)
    poison_pool(*_gradient_bytes(batch, sizes, x.element_size(), bias))
    dx, dws, dbs = rawops.fused_mlp_backward(to_cupy(dy), to_cupy(x), y, saved, cw, cb, act, out_act)
    y64, dx64, dw64, db64 = grads64(net, x, dy)
    yt, dxt, dwt, dbt = _grads_torch(net, x, dy)
    _assert_like_torch(y, y64, yt, dtype, "y")
    _assert_like_torch(dx, dx64, dxt, dtype, "dx")
    for i, (got, ref) in enumerate(zip(dws, dw64, strict=True)):
        _assert_like_torch(got, ref, dwt[i], dtype, f"dW{i}")
    if bias:
        for i, (got, ref) in enumerate(zip(dbs, db64, strict=True)):
            _assert_like_torch(got, ref, dbt[i], dtype, f"db{i}")
    else:
        assert dbs is None


# The fused backward (tc_mlp_w<W>_<act>_bwd) on widths 16/32/64, every activation, both half
# types, odd n_in / n_out (element-wise staging, dx stored element by element), inputs or
# outputs wider than the hidden width (synchronous staging, dx in two column blocks), an
# output ReLU, no biases, 1 to 4 hidden layers; and 128 wide, which the tile kernels keep.
FAST_BWD_CASES = [  # (sizes, activation, output_activation, dtype, bias)
    ((64,) * 6, "relu", "none", "float16", True),
    ((64,) * 6, "gelu", "relu", "bfloat16", True),
    ((3, 16, 16, 1), "none", "none", "float16", True),
    ((17, 32, 32, 5), "relu", "relu", "bfloat16", False),
    ((128, 32, 32, 32, 128), "gelu", "none", "float16", True),
    ((24, 64, 40), "none", "relu", "bfloat16", True),
    ((100, 64, 64, 10), "relu", "none", "bfloat16", True),
    ((64, 128, 128, 64), "relu", "none", "float16", True),
]
FAST_BWD_IDS = ["-".join(map(str, c[0])) + f"-{c[1]}-{c[2]}-{c[3]}" + ("" if c[4] else "-nobias")
                for c in FAST_BWD_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("need_dx", [True, False], ids=["dx", "no-dx"])
@pytest.mark.parametrize("batch", [1, 33, 1000, 70001])
@pytest.mark.parametrize("case", FAST_BWD_CASES, ids=FAST_BWD_IDS)
def test_fused_backward_matches_torch_float64(case, batch, need_dx):
    """Fresh random weights and data each case; outputs poisoned (NaN) before the launch."""
    torch = pytest.importorskip("torch")
    import cupy
    from gpu_reference import DTYPES, assert_close, poison_pool, random, to_cupy, to_torch

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    plan = plans.make_plan(1 if dtype == torch.float16 else 2, sizes, act, out_act, bias)
    assert (mlp.fast_bwd_fit(plan, cupy.cuda.Device().id) is not None) == (sizes[1] <= 64)
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    x = random((batch, sizes[0]), dtype, scale=1.0)
    dy = random((batch, sizes[-1]), dtype, scale=1.0)
    cw = [to_cupy(w) for w in weights]
    cb = [to_cupy(b) for b in biases] if bias else None
    y, saved = rawops.fused_mlp_forward(to_cupy(x), cw, cb, act, out_act)
    # The reference below is built on this forward's own z and y: check them first, so that a
    # wrong kept z (which would feed the kernel and the reference alike) cannot pass.
    with torch.no_grad():
        _assert_like_torch(to_torch(y), reference(net, x), net(x), dtype, "training forward y")
        kept = to_torch(saved[0])
        for l, (z64, z_torch) in enumerate(_pre_activations(weights, biases if bias else None, x, act)):
            _assert_like_torch(kept[l], z64, z_torch, dtype, f"kept z{l}")
    poison_pool(*_gradient_bytes(batch, sizes, x.element_size(), bias))
    dx, dws, dbs = rawops.fused_mlp_backward(to_cupy(dy), to_cupy(x), y, saved, cw, cb, act, out_act,
                                             need_dx=need_dx)
    # Against float64 math on our own forward's z and y: a pre-activation within rounding of
    # a ReLU kink (or of the output ReLU's) flips its mask between any half-type forward and
    # the float64 one, which would test the forward's rounding, not the backward.
    dx64, dw64, db64 = _backward64_on(to_torch(saved[0]).double(), to_torch(y).double(), x, dy, weights, act,
                                      out_act, dtype)
    if need_dx:
        assert_close(dx, dx64, dtype, "dx", factor=4)
    else:
        assert dx is None
    for i, (got, ref) in enumerate(zip(dws, dw64, strict=True)):
        assert_close(got, ref, dtype, f"dW{i}", factor=4)
    if bias:
        for i, (got, ref) in enumerate(zip(dbs, db64, strict=True)):
            assert_close(got, ref, dtype, f"db{i}", factor=4)
    else:
        assert dbs is None


def _pre_activations(weights, biases, x, act):
    """Each hidden layer's pre-activation [batch][width] in float64 and in torch's own dtype."""
    import torch

    def act_of(v):
        return torch.relu(v) if act == "relu" else torch.nn.functional.gelu(v) if act == "gelu" else v

    h64, h, pairs = x.double(), x, []
    for l, w in enumerate(weights[:-1]):
        b = biases[l] if biases is not None else None
        z64 = h64 @ w.double().T + (b.double() if b is not None else 0)
        z = torch.nn.functional.linear(h, w, b)
        pairs.append((z64, z))
        h64, h = act_of(z64), act_of(z)
    return pairs


def _backward64_on(z, y, x, dy, weights, act, out_act, dtype):
    """dx, [dW], [db] in float64 given the kept pre-activations z [hidden][batch][width] and y,
    with g and act(z) rounded to dtype where the kernel keeps them in it (as torch does): a
    sum over rows of a rank-one g (n_out = 1) cancels, and then the roundings alone left
    db 1% off the unrounded float64 sum (batch 33, H100 round of 02:38)."""
    import torch

    def rounded(v):
        return v.to(dtype).double()

    def act_of(v):
        return torch.relu(v) if act == "relu" else torch.nn.functional.gelu(v) if act == "gelu" else v

    def grad_of(v):
        if act == "relu":
            return (v > 0).double()
        if act == "gelu":
            return 0.5 * (1 + torch.erf(v / 2 ** 0.5)) + v * torch.exp(-0.5 * v * v) / (2 * torch.pi) ** 0.5
        return torch.ones_like(v)

    g = dy.double() * (y > 0) if out_act == "relu" else dy.double()
    dws, dbs = [None] * len(weights), [None] * len(weights)
    for l in range(len(weights) - 1, -1, -1):
        a = x.double() if l == 0 else rounded(act_of(z[l - 1]))
        dws[l], dbs[l] = g.T @ a, g.sum(0)
        g = rounded(g @ weights[l].double() * grad_of(z[l - 1])) if l > 0 else g @ weights[0].double()
    return g, dws, dbs


@pytest.mark.gpu
@pytest.mark.parametrize("case", FAST_BWD_CASES[:2], ids=FAST_BWD_IDS[:2])
def test_fused_and_tile_backwards_agree(case, monkeypatch):
    torch = pytest.importorskip("torch")
    from gpu_reference import DTYPES, assert_close, random, to_cupy, to_torch

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    weights, biases = net_params(net)
    cw, cb = [to_cupy(w) for w in weights], [to_cupy(b) for b in biases]
    x, dy = to_cupy(random((5000, sizes[0]), dtype, scale=1.0)), to_cupy(random((5000, sizes[-1]), dtype, scale=1.0))
    y, saved = rawops.fused_mlp_forward(x, cw, cb, act, out_act)
    fused = rawops.fused_mlp_backward(dy, x, y, saved, cw, cb, act, out_act)
    monkeypatch.setattr(rawops.config, "mlp_fast_backward", False)
    tile = rawops.fused_mlp_backward(dy, x, y, saved, cw, cb, act, out_act)
    for i, (a, b) in enumerate(zip([fused[0]] + fused[1] + fused[2], [tile[0]] + tile[1] + tile[2], strict=True)):
        assert_close(a, to_torch(b).double(), dtype, f"gradient {i}: fused vs tile kernels", factor=4)


@pytest.mark.gpu
def test_weight_gradients_are_deterministic():
    torch = pytest.importorskip("torch")
    from gpu_reference import random, to_cupy

    for sizes, dtype in [((100, 128, 64, 10), torch.float32), ((64,) * 6, torch.float16)]:
        net = sequential(torch, sizes, "relu", "none", dtype)
        weights, biases = net_params(net)
        cw, cb = [to_cupy(w) for w in weights], [to_cupy(b) for b in biases]
        x, dy = to_cupy(random((100003, sizes[0]), dtype)), to_cupy(random((100003, sizes[-1]), dtype))
        y, saved = rawops.fused_mlp_forward(x, cw, cb)
        first = rawops.fused_mlp_backward(dy, x, y, saved, cw, cb)
        second = rawops.fused_mlp_backward(dy, x, y, saved, cw, cb)
        for a, b in zip(first[1] + first[2], second[1] + second[2], strict=True):
            assert (a == b).all()

@pytest.mark.gpu
@pytest.mark.parametrize("case", TC_CASES[:3] + [((100, 128, 64, 10), "relu", "relu", "float32", True)],
                         ids=TC_IDS[:3] + ["source"])
@pytest.mark.parametrize("batch", [0, 33, 1000])
def test_adapter_autograd_matches_torch_float64(case, batch):
    torch = pytest.importorskip("torch")
    from gpu_reference import DTYPES, assert_close, random
    from rawops import torch_adapter as ta

    sizes, act, out_act, dtype_name, bias = case
    dtype = DTYPES[dtype_name]
    net = sequential(torch, sizes, act, out_act, dtype, bias)
    module = ta.FusedMLP.from_sequential(net)
    x = random((batch, sizes[0]), dtype, scale=1.0).requires_grad_(True)
    dy = random((batch, sizes[-1]), dtype, scale=1.0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = module(x)
        y.backward(dy)
    stream.synchronize()
    y64, dx64, dw64, db64 = grads64(net, x, dy)
    if dtype == torch.float32:
        assert_close(y, y64, dtype, "y")
        assert_close(x.grad, dx64, dtype, "dx")
        for i in range(len(dw64)):
            assert_close(module.weights[i].grad, dw64[i], dtype, f"dW{i}")
            assert_close(module.biases[i].grad, db64[i], dtype, f"db{i}")
    else:
        yt, dxt, dwt, dbt = _grads_torch(net, x, dy)
        _assert_like_torch(y, y64, yt, dtype, "y")
        _assert_like_torch(x.grad, dx64, dxt, dtype, "dx")
        for i in range(len(dw64)):
            _assert_like_torch(module.weights[i].grad, dw64[i], dwt[i], dtype, f"dW{i}")
            _assert_like_torch(module.biases[i].grad, db64[i], dbt[i], dtype, f"db{i}")
    with torch.no_grad():  # the inference kernels compute the same numbers as the training forward
        assert torch.equal(module(x), y)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 33, 128, 129, 3000])
@pytest.mark.parametrize("output_relu", [False, True])
@pytest.mark.parametrize("need_dx", [False, True])
def test_fused_mlp_source_training_takes_the_typed_calls_with_autograd_semantics(batch, output_relu, need_dx):
    """FusedMLP's source-network training (_SourceMLP: typed forward, and up to SMALL_BWD_ROWS
    a typed backward; past it, or with dy strided, the general backward) against float64, on
    poisoned allocations; and torch's saved-tensor checks still guard it."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, poison_torch_pool, random
    from rawops import torch_adapter as ta

    net = source_network(torch, output_relu)
    module = ta.FusedMLP.from_sequential(net)
    params = [p for pair in zip(module.weights, module.biases) for p in pair]
    # every ReLU's pre-activation away from 0: a mask flipped by float32 rounding read 2.3e-4 in dW0
    # at 3000 rows once (H100, 92e3ed1): chance, not the kernels' precision
    x = away_from_relu_kinks(torch, net, batch).requires_grad_(need_dx)
    dy = random((batch, 10), torch.float32, scale=1.0)
    y64, dx64, dw64, db64 = grads64(net, x, dy)
    want = [dx64] * need_dx + [g for pair in zip(dw64, db64) for g in pair]
    for step in range(2):  # the first call validates the parameters, the second reuses them
        poison_torch_pool(batch * 10 * 4, batch * 128 * 4, batch * 64 * 4)
        y = module(x)
        assert type(y.grad_fn).__name__ == "_SourceMLPBackward", type(y.grad_fn).__name__
        poison_torch_pool(batch * 100 * 4, 128 * 100 * 4, 64 * 128 * 4, 10 * 64 * 4, 128 * 4, 64 * 4, 10 * 4)
        got = torch.autograd.grad(y, [x] * need_dx + params, dy)
        assert_close(y, y64, torch.float32, f"y, call {step}")
        names = ["dx"] * need_dx + [f"{kind}{i}" for i in range(3) for kind in ("dW", "db")]
        for name, g, r in zip(names, got, want, strict=True):
            assert_close(g, r, torch.float32, f"{name}, call {step}")
    # dy as autograd hands it from a sum: a stride-0 broadcast, made dense by the general backward
    y = module(x)
    got = torch.autograd.grad(y.sum(), params)
    _, _, dw_ones, db_ones = grads64(net, x, torch.ones_like(dy))
    for i in range(3):
        assert_close(got[2 * i], dw_ones[i], torch.float32, f"dW{i} of a sum")
        assert_close(got[2 * i + 1], db_ones[i], torch.float32, f"db{i} of a sum")
    # a weight changed in place between forward and backward: torch's saved-tensor version check
    y = module(x)
    with torch.no_grad():
        module.weights[1].mul_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, params, dy)


@pytest.mark.gpu
def test_adapter_gradcheck_small_source_network():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    net = source_network(torch)
    weights, biases = net_params(net)
    eps = 1e-3
    x = _x_away_from_relu_kinks(torch, weights, biases, 3, eps)
    b3 = biases[2].clone().requires_grad_(True)
    b1 = biases[0].clone().requires_grad_(True)

    def f(x, b1, b3):
        return ta.fused_mlp(x, weights, [b1, biases[1], b3])

    assert torch.autograd.gradcheck(f, (x, b1, b3), eps=eps, atol=2e-2, rtol=2e-2, nondet_tol=1e-6)


def _x_away_from_relu_kinks(torch, weights, biases, batch, eps):
    """Fresh random x whose hidden pre-activations all lie farther from 0 than twice what a
    gradcheck step (one element of x or b1 moved by eps) can shift them: finite differences
    across a ReLU kink disagree with any correct gradient (a flaky failure otherwise)."""
    w1, w2 = weights[0].double(), weights[1].double()
    b1, b2 = biases[0].double(), biases[1].double()
    for _ in range(1000):
        x = torch.randn(batch, w1.shape[1], device="cuda")
        z1 = x.double() @ w1.T + b1
        mask1 = (z1 > 0).double()
        z2 = torch.relu(z1) @ w2.T + b2
        shift1 = eps * max(1.0, w1.abs().max().item())
        # z2's shift through z1: by x[k] (all of column k of W1) or by b1[j] (one unit)
        through_x = ((w2 * mask1[:, None, :]) @ w1).abs().amax(dim=2)  # (batch, units of layer 2)
        through_b1 = (w2 * mask1[:, None, :]).abs().amax(dim=2)
        shift2 = eps * torch.maximum(through_x, through_b1)
        if (z1.abs() > 2 * shift1).all() and (z2.abs() > 2 * shift2).all():
            return x.requires_grad_(True)
    raise AssertionError("no x away from the ReLU kinks in 1000 draws")


@pytest.mark.gpu
def test_fused_mlp_trains_like_the_sequential():
    """200 Adam steps on a small regression task: the same loss as nn.Sequential within 2%."""
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    torch.manual_seed(0)
    seq = source_network(torch)
    fused = ta.FusedMLP.from_sequential(seq)
    x = torch.randn(2048, 100, device="cuda")
    target = torch.sin(x[:, :10] * 1.5) + 0.1 * x[:, 10:20]
    losses = []
    for model in (seq, fused):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(200):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
        with torch.no_grad():
            losses.append(torch.nn.functional.mse_loss(model(x), target).item())
    assert abs(losses[1] - losses[0]) <= 0.02 * losses[0], losses


@pytest.mark.gpu
def test_fused_mlp_under_torch_compile_fullgraph():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close
    from rawops import torch_adapter as ta

    net = sequential(torch, (64, 64, 64, 64, 64, 64), "relu", "none", torch.float16)
    module = ta.FusedMLP.from_sequential(net)
    x = torch.randn(1000, 64, device="cuda", dtype=torch.float16, requires_grad=True)

    def step(x):
        return module(x).float().square().sum() / 1000

    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(x)
    loss.backward()
    got = [x.grad.clone()] + [w.grad.clone() for w in module.weights]
    x.grad = None
    module.zero_grad()
    step(x).backward()
    want = [x.grad] + [w.grad for w in module.weights]
    for a, b in zip(got, want, strict=True):
        assert_close(a, b.double(), torch.float16, "compiled vs eager")
    with torch.no_grad():
        y = torch.compile(module, fullgraph=True)(x)
    assert_close(y, module(x).double(), torch.float16, "compiled inference")


@pytest.mark.gpu
def test_fused_mlp_typed_call_keeps_module_semantics():
    """FusedMLP.__call__'s one-C-call path (source network, no grad) must behave exactly like
    nn.Module.__call__: hooks (the module's and the global ones) run, a gradient goes through
    autograd, torch.compile traces the module, and the output is the forward's."""
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random
    from rawops import torch_adapter as ta
    from rawops import _launch

    net = source_network(torch)
    module = ta.FusedMLP.from_sequential(net)
    x = random((33, 100), torch.float32)
    want = reference(net, x)
    with torch.no_grad():
        module(x)  # validates the parameters once: the typed path is armed
        assert module._source_state is not None
        assert_close(_launch.torch_source_module_call(module, (x,), {}), want, torch.float32, "typed call")
        seen = []
        handle = module.register_forward_hook(lambda m, args, out: seen.append(out.shape))
        assert _launch.torch_source_module_call(module, (x,), {}) is None  # a hook: nn.Module.__call__
        assert_close(module(x), want, torch.float32, "with a hook")
        handle.remove()
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, args: seen.append("pre"))
        try:
            assert _launch.torch_source_module_call(module, (x,), {}) is None
            module(x)
        finally:
            handle.remove()
        assert seen == [(33, 10), "pre"]
        assert _launch.torch_source_module_call(module, (x,), {}) is not None
        assert _launch.torch_source_module_call(module, (x, x), {}) is None
        assert _launch.torch_source_module_call(module, (), {"x": x}) is None
        assert_close(module(x=x), want, torch.float32, "keyword x")
    # grad mode: the training Function, through the typed call too (no hook), through forward with one
    y = _launch.torch_source_module_call(module, (x,), {})
    assert y is not None and type(y.grad_fn).__name__ == "_SourceMLPBackward"
    handle = module.register_forward_hook(lambda m, args, out: seen.append("train"))
    assert _launch.torch_source_module_call(module, (x,), {}) is None
    assert type(module(x).grad_fn).__name__ == "_SourceMLPBackward" and seen[-1] == "train"
    handle.remove()
    y = module(x)
    assert y.requires_grad and y.grad_fn is not None
    y.sum().backward()
    assert all(w.grad is not None for w in module.weights)
    with torch.no_grad():
        assert_close(torch.compile(module, fullgraph=True)(x), want, torch.float32, "compiled")


def test_the_typed_module_call_routes_training_to_the_source_function():
    """FusedMLP.__call__'s C call on CPU tensors (a state made for device -1), the training Function's
    apply replaced by a recorder: a gradient needed takes it with (x, state, plan, *parameters); a hook,
    another x, or parameters replaced or re-viewed since validation take nn.Module.__call__ (None)."""
    torch = pytest.importorskip("torch")
    from rawops import _launch
    from rawops.torch_adapter import mlp as ta_mlp

    module = ta_mlp.FusedMLP((100, 128, 64, 10))  # CPU parameters, requiring grad
    params = [p for pair in zip(module.weights, module.biases) for p in pair]
    plan = object()
    module._source_state = (torch.float32, -1, tuple(p.data_ptr() for p in params), 0, {}, None, {}, None, plan)
    hooks = ta_mlp._GLOBAL_MODULE_HOOKS
    calls = []
    _launch.register_torch_modules(hooks, torch._C._get_tracing_state, lambda *args: calls.append(args) or "trained")
    try:
        x = torch.randn(3, 100)
        assert _launch.torch_source_module_call(module, (x,), {}) == "trained"
        got = calls[-1]
        assert got[0] is x and got[1] is module._source_state and got[2] is plan
        assert all(a is b for a, b in zip(got[3:], params, strict=True))
        assert _launch.torch_source_module_call(module, (torch.randn(3, 99),), {}) is None
        assert _launch.torch_source_module_call(module, (torch.randn(3, 100).t().contiguous().t(),), {}) is None
        assert _launch.torch_source_module_call(module, (torch.randn(0, 100),), {}) is None
        handle = module.register_forward_pre_hook(lambda m, args: None)
        assert _launch.torch_source_module_call(module, (x,), {}) is None
        handle.remove()
        w3 = module.weights[2].data
        with torch.no_grad():  # the validated storage at its pointer, but as a transposed view: not validated
            module.weights[2].data = w3.view(64, 10).t()
        assert module.weights[2].data_ptr() == w3.data_ptr() and module.weights[2].shape == w3.shape
        assert _launch.torch_source_module_call(module, (x,), {}) is None
        with torch.no_grad():
            module.weights[2].data = w3
        assert _launch.torch_source_module_call(module, (x,), {}) == "trained"
        with torch.no_grad():
            module.weights[1].data = module.weights[1].data.clone()  # new storage: not the validated one
        assert _launch.torch_source_module_call(module, (x,), {}) is None
        assert len(calls) == 2
    finally:
        _launch.register_torch_modules(hooks, torch._C._get_tracing_state, ta_mlp._source_mlp_apply)


@pytest.mark.gpu
def test_fused_mlp_captures_in_a_cuda_graph():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close
    from rawops import torch_adapter as ta

    net = sequential(torch, (64, 64, 64, 64, 64, 64), "relu", "none", torch.float16)
    module = ta.FusedMLP.from_sequential(net)
    x = torch.randn(4096, 64, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        module(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = module(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(y, module(x).double(), torch.float16, "graph replay")


@pytest.mark.gpu
def test_fused_mlp_module_inference_fast_path_rechecks_what_changes():
    torch = pytest.importorskip("torch")
    from gpu_reference import assert_close, random
    from rawops import torch_adapter as ta

    net = source_network(torch)
    module = ta.FusedMLP.from_sequential(net)
    x = random((33, 100), torch.float32)
    with torch.no_grad():
        first = module(x)
        assert torch.equal(module(x), first)  # second call: the cached plan
        assert module._source_state is not None, "the source network takes the typed fast path"
        state, module._source_state = module._source_state, None
        assert torch.equal(module(x), first), "the Python path and the typed one agree"
        module._source_state = state
        big = random((5000, 100), torch.float32)  # past the small-batch kernel
        assert_close(module(big), reference(net, big), torch.float32, "typed fast path, batch 5000")
        assert_close(first, reference(net, x), torch.float32, "typed fast path, batch 33")
        with pytest.raises(ValueError, match=r"^x has shape \(33, 99\), expected \(batch, 100\)"):
            module(x[:, :99].contiguous())
        with pytest.raises(TypeError, match=r"^x has dtype torch.float16"):
            module(x.half())
        module.weights[0].data = module.weights[0].data * 2  # new storage: validated again
        net[0].weight.mul_(2)
        assert_close(module(x), reference(net, x), torch.float32, "after the weight changed")
        w3 = module.weights[2].data  # the validated pointer and shape, now a transposed view: validated again
        module.weights[2].data = w3.view(64, 10).t()
        with pytest.raises(ValueError, match=r"^weights\[2\] .*contiguous"):
            module(x)
        module.weights[2].data = w3
        assert_close(module(x), reference(net, x), torch.float32, "the validated layout back")


def test_launch_sequences_on_a_fake_launcher(monkeypatch):
    """What launch_forward / launch_backward ask of the driver, without a GPU: kernel names,
    grids, shared memory, one kind per argument, the resident flag."""
    calls, dependent = [], []
    monkeypatch.setattr(mlp, "launch", lambda fn, grid, block, smem, stream, args, kinds, device, dep=False:
                        (calls.append((fn, grid, block, smem, len(args) == len(kinds), args)), dependent.append(dep)))
    monkeypatch.setattr(mlp._modules, "function_pointer", lambda family, name, device: name)
    monkeypatch.setattr(mlp, "sm_count", lambda device: 132)
    monkeypatch.setattr(mlp, "optin_smem", lambda device: 232448)
    monkeypatch.setattr(mlp, "compute_capability", lambda device: 90)
    monkeypatch.setattr(mlp, "_fits", {})
    monkeypatch.setattr(mlp, "_ready", {})

    class Kernel:
        num_regs = 96
        max_dynamic_shared_size_bytes = 0
        preferred_shared_memory_carveout = 0

    monkeypatch.setattr(mlp._modules, "get_function", lambda family, name, device: Kernel())
    monkeypatch.setattr(mlp, "_fast_fits", {})
    plan = plans.make_plan(1, (64,) * 6, "relu", "none", True)
    monkeypatch.setitem(mlp._per_sm, ("tc_mlp_w64_relu_fwd", "f16", 0, 196096, 512), 1)
    monkeypatch.setitem(mlp._per_sm, ("tc_mlp_nf4_fwd", "f16", 0, 75264, 256), 2)
    monkeypatch.setitem(mlp._per_sm, ("tc_mlp_nf4_bwd", "f16", 0, 75264, 256), 2)
    # the fast forward: one block of 16 warps per SM, 32-row warp tiles, no resident flag
    mlp.launch_forward(plan, 0, 1, [2] * 5, [3] * 5, 4, 1 << 20, 0, saved=[5])
    fn, grid, block, smem, ok, args = calls[-1]
    assert (fn, grid, block, smem, ok) == ("tc_mlp_w64_relu_fwd_f16", (132,), 512, 196096, True)
    assert args[-1] == 1 and args[2] == 5 and args[-5:-1] == (64, 64, 64, 4)
    mlp.launch_forward(plan, 0, 1, [2] * 5, [3] * 5, 4, 1000, 0)
    assert calls[-1][1] == (2,)  # 32 tiles of 32 rows over 16 warps
    monkeypatch.setattr(rawops.config, "mlp_fast_forward", False)  # the WMMA tile kernel, as before
    mlp.launch_forward(plan, 0, 1, [2] * 5, [3] * 5, 4, 1 << 20, 0, saved=[5])
    fn, grid, block, smem, ok, args = calls[-1]
    assert (fn, grid, block, smem, ok) == ("tc_mlp_nf4_fwd_f16", (264,), 256, 75264, True)
    assert args[-1] == 1 | plans.TC_RESIDENT and args[2] == 5
    calls.clear()
    # the fused backward: one block of 8 warps per SM, then one ordered reduce per layer
    monkeypatch.setattr(mlp, "_fast_bwd_fits", {})
    monkeypatch.setitem(mlp._per_sm, ("tc_mlp_w64_relu_bwd", "f16", 0, 222208, 256), 1)
    keep = mlp.launch_backward(plan, 0, 10, 11, 12, [13], [2] * 5, 0, [20 + i for i in range(5)],
                               [30 + i for i in range(5)], 1 << 20, 0, lambda shape, dt: (shape, 1000))
    fn, grid, block, smem, ok, args = calls[0]
    assert (fn, grid, block, smem, ok) == ("tc_mlp_w64_relu_bwd_f16", (132,), 256, 222208, True)
    assert args[:6] == (10, 0, 11, 13, 0, 1000) and args[-6:] == (1 << 20, 64, 64, 4, 1, 5 * 64 * 65)
    assert keep == [(132, 5 * 64 * 65)]  # the partials: one row of floats per block
    fn, grid, block, smem, ok, args = calls[1]  # one reduce for every layer
    assert (fn, grid, block, ok, len(calls)) == ("mlp_wgrad_reduce_layers_bwd_f16", (130, 5), 256, True, 2)
    assert args[:7] == (1000, 132, 5 * 64 * 65, 64, 64, 64, 4)
    assert args[7:] == (20, 21, 22, 23, 24, 0, 0, 0, 0, 30, 31, 32, 33, 34, 0, 0, 0, 0)
    # the reduce waits for the backward (griddepcontrol.wait): a programmatic dependent launch on sm_90
    assert dependent[-2:] == [False, True]
    monkeypatch.setattr(mlp, "compute_capability", lambda device: 89)  # no griddepcontrol: a plain launch
    mlp.launch_backward(plan, 0, 10, 11, 12, [13], [2] * 5, 0, [20 + i for i in range(5)],
                        [30 + i for i in range(5)], 1 << 20, 0, lambda shape, dt: (shape, 1000))
    assert calls[-1][0] == "mlp_wgrad_reduce_layers_bwd_f16" and dependent[-1] is False
    monkeypatch.setattr(mlp, "compute_capability", lambda device: 90)
    calls.clear()
    monkeypatch.setattr(rawops.config, "mlp_fast_backward", False)  # the chain + wgrad tile kernels, as before
    keep = mlp.launch_backward(plan, 0, 10, 11, 12, [13], [2] * 5, 14, [20 + i for i in range(5)],
                               [30 + i for i in range(5)], 1000, 0, lambda shape, dt: (shape, 100))
    names = [c[0] for c in calls]
    assert names[0] == "tc_mlp_nf4_bwd_f16" and calls[0][1] == (8,)  # 63 tiles of 16 rows / 8 warps
    assert names[1:] == ["tc_mlp_wgrad_nf4_bwd_f16", "mlp_wgrad_reduce_bwd_f16"] * 5
    assert all(c[4] for c in calls) and len(keep) == 2
    calls.clear()
    source = plans.make_plan(0, (100, 128, 64, 10), "relu", "relu", True)
    mlp.launch_backward(source, 0, 10, 11, 12, [13, 14], [2, 3, 4], 0, [20, 21, 22], [30, 31, 32], 70000, 0,
                        lambda shape, dt: (shape, 100))
    assert [c[0] for c in calls] == ["source_mlp_tc_dgrad_bwd_f32"] + [
        name for l in range(3) for name in (f"source_mlp_tc_wgrad{l}_bwd_f32", "mlp_wgrad_reduce_bwd_f32")]
    g3 = calls[0][5][6]
    assert calls[0][5][1] == 12 and g3 not in (0, 10), "the output ReLU masks dy by y, into g3"
    assert calls[5][5][:2] == (g3, 0), "dW3's G: the masked g3"
    calls.clear()
    monkeypatch.setattr(rawops.config, "mlp_tf32", False)  # the FFMA chain and weight gradients
    mlp.launch_backward(source, 0, 10, 11, 12, [13, 14], [2, 3, 4], 0, [20, 21, 22], [30, 31, 32], 70000, 0,
                        lambda shape, dt: (shape, 100))
    assert [c[0] for c in calls] == ["mlp_dgrad_bwd_f32"] * 2 + ["mlp_wgrad_bwd_f32", "mlp_wgrad_reduce_bwd_f32"] * 3
    assert calls[0][5][1] == 12
