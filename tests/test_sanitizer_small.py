"""Small calls of the kernels that use shared memory, a shape or two each on their block paths, for
compute-sanitizer's racecheck (issue 26, item 7: bench/device_round.sh with
RAWOPS_SANITIZE="racecheck:tests/test_sanitizer_small.py"). Racecheck tracks every shared-memory
access, and the other files' shapes do not finish under it (test_sorting.py: no test in 150 s on the
H200). Each call is also checked against torch in float64, so the file is a plain GPU test as well.
The kernels these calls do not reach run through BORROWED: cases of the family files' own tests, called
as they are at one of the small parameter sets those files run."""
import importlib
import inspect

import pytest


def _check_forward_backward(ours, reference, inputs, dtype, what, factor=4):
    """ours(*inputs) against reference(*inputs in float64), and the gradients of both against one
    random dy, every input's."""
    import torch
    from gpu_reference import assert_close

    leaves = [t.detach().requires_grad_(True) for t in inputs]
    out = ours(*leaves)
    dy = torch.randn(out.shape, device="cuda").to(out.dtype)
    grads = torch.autograd.grad(out, leaves, dy)
    ref_leaves = [t.detach().double().requires_grad_(True) for t in inputs]
    ref = reference(*ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dy.double())
    assert_close(out.detach(), ref.detach(), dtype, what)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(g, r, dtype, f"{what}: gradient of input {i}", factor=factor)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 4096, 20000])  # block tiles of 8 and 16 keys a thread; the merge
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "int64"])
def test_sort_block_paths(dtype, n):
    import torch

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    if dt.is_floating_point:
        x = torch.randn(3, n, device="cuda").to(dt)
    else:
        x = torch.randint(-50, 50, (3, n), device="cuda", dtype=dt)  # many ties
    for descending in (False, True):
        values, indices = ta.sort(x, descending=descending)
        ref = torch.sort(x, descending=descending, stable=True)
        assert torch.equal(indices, ref.indices), f"{dtype} {n} descending={descending}: indices"
        assert torch.equal(values, ref.values), f"{dtype} {n} descending={descending}: values"


@pytest.mark.gpu
@pytest.mark.parametrize("shape,k", [((4, 1024), 8), ((2, 40000), 50)])  # a warp a row; the block select
def test_topk_paths(shape, k):
    import torch

    from rawops import torch_adapter as ta

    x = torch.randn(shape, device="cuda")
    values, indices = ta.topk(x, k)
    assert torch.equal(values, torch.topk(x, k).values)
    assert torch.equal(x.gather(-1, indices), values)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norms_forward_and_backward(dtype):
    import torch
    import torch.nn.functional as F
    from gpu_reference import random

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    x, w, b = random((8, 4096), dt), random((4096,), dt), random((4096,), dt)
    _check_forward_backward(lambda x, w, b: ta.layer_norm(x, (4096,), w, b),
                            lambda x, w, b: F.layer_norm(x, (4096,), w, b), (x, w, b), dt, f"layer_norm {dtype}")
    _check_forward_backward(lambda x, w: ta.rms_norm(x, (4096,), w, 1e-6),
                            lambda x, w: F.rms_norm(x, (4096,), w, 1e-6), (x, w), dt, f"rms_norm {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_softmaxes_forward_and_backward(dtype):
    import torch
    from gpu_reference import random

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    x = random((4, 4096), dt)
    _check_forward_backward(lambda x: ta.softmax(x, -1), lambda x: torch.softmax(x, -1), (x,), dt, "softmax")
    _check_forward_backward(lambda x: ta.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), (x,), dt,
                            "log_softmax")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bias_gelu_backward_tiles(dtype):
    import torch
    import torch.nn.functional as F
    from gpu_reference import random

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    x, b = random((512, 1024), dt), random((1024,), dt)
    _check_forward_backward(lambda x, b: ta.bias_gelu(x, b), lambda x, b: F.gelu(x + b), (x, b), dt, "bias_gelu")


@pytest.mark.gpu
def test_normalize_volume_min_max():
    import torch

    from rawops import torch_adapter as ta

    v = torch.randint(0, 256, (64, 4096), dtype=torch.uint8, device="cuda")
    f = v.float()
    ref = (f - f.min()) / (f.max() - f.min())
    assert torch.equal(ta.normalize_volume(v), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_rows(dtype):
    import torch
    import torch.nn.functional as F
    from gpu_reference import random

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    logits = random((8, 32000), dt)
    target = torch.randint(0, 32000, (8,), device="cuda")
    _check_forward_backward(lambda z: ta.cross_entropy(z, target), lambda z: F.cross_entropy(z, target), (logits,),
                            dt, f"cross_entropy {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_mlp_64_wide(dtype):
    # The register-resident forward and the fused backward (weights and partials in shared memory).
    # Gradients against float64 are held to torch's own same-dtype autograd error there: a hidden
    # pre-activation within rounding of the ReLU's kink flips its mask in any half-type forward
    # (tests/test_mlp.py builds its references on the kernel's own z for that reason).
    import torch
    from gpu_reference import TOLERANCE, assert_close, random
    from mlp_reference import grads64, sequential

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    net = sequential(torch, (64,) * 6, "relu", "none", dt)
    fused = ta.FusedMLP.from_sequential(net)  # copies the weights
    x = random((512, 64), dt, scale=1.0)
    dy = torch.randn(512, 64, device="cuda").to(dt)
    y64, dx64, dw64, db64 = grads64(net, x, dy)
    with torch.no_grad():
        assert_close(fused(x), y64, dt, f"fused_mlp {dtype} inference", factor=4)

    def gradients(model, weights, biases):
        leaf = x.detach().requires_grad_(True)
        return torch.autograd.grad(model(leaf), [leaf, *weights, *biases], dy)

    ours = gradients(fused, fused.weights, fused.biases)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    theirs = gradients(net, [m.weight for m in linears], [m.bias for m in linears])
    for i, (g, t, r) in enumerate(zip(ours, theirs, [dx64, *dw64, *db64], strict=True)):
        assert not torch.isnan(g).any(), f"fused_mlp {dtype}: NaN in gradient {i}"
        error = ((g.double() - r).norm() / r.norm()).item()
        torch_error = ((t.double() - r).norm() / r.norm()).item()
        bound = max(4 * TOLERANCE[dt], 2 * torch_error)
        assert error <= bound, f"fused_mlp {dtype}: gradient {i} error {error:.3g} > {bound:.3g} " \
                               f"(torch's {torch_error:.3g})"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matmul_tiles(dtype):
    import torch
    from gpu_reference import random

    from rawops import torch_adapter as ta

    dt = getattr(torch, dtype)
    a, b = random((192, 256), dt, scale=1.0), random((256, 320), dt, scale=1.0)
    _check_forward_backward(lambda a, b: ta.matmul(a, b), lambda a, b: a @ b, (a, b), dt, f"matmul {dtype}")


# Cases of the family files' tests, run as they are, for the shared-memory kernels the calls above do
# not reach: id -> (test module, test function, its arguments: each one of the values the function's
# own parametrize runs; a callable takes the module and returns them).
BORROWED = {
    "norm stream rows bf16": ("test_norm", "test_forward_and_backward_match_torch_float64",
                              dict(op="layer_norm", rows=3, n=65536, dtype="bfloat16")),
    "norm unaligned rows f32": ("test_norm", "test_forward_and_backward_match_torch_float64",
                                dict(op="rms_norm", rows=3, n=4097, dtype="float32")),
    "norm 768 f16": ("test_norm", "test_forward_and_backward_match_torch_float64",
                     dict(op="layer_norm", rows=3, n=768, dtype="float16")),
    "moe route permute combine": ("test_moe", "test_adapter_pipeline_forward_and_gradients",
                                  dict(dtype="float32", pad_to=16)),
    "moe layer bf16": ("test_moe", "test_moe_mlp_forward_and_gradients_match_a_per_expert_reference",
                       dict(dtype="bfloat16")),
    "moe grouped weight gradient": ("test_moe", "test_grouped_weight_gradient_matches_each_experts",
                                    dict(dtype="float16", transpose=False)),
    "source network forward": ("test_mlp_source", "test_fused_mlp_float32_is_the_source_network", dict(batch=4097)),
    "source network backward": ("test_mlp_source", "test_source_backward_matches_torch_float64",
                                dict(batch=4097, output_activation="none", use_tc=True, need_dx=True)),
    "source network backward, one launch": ("test_mlp_source", "test_source_backward_matches_torch_float64",
                                            dict(batch=33, output_activation="relu", use_tc=True, need_dx=True)),
    "mlp tiles backward": ("test_mlp", "test_tc_backward_matches_torch_float64",
                           lambda m: dict(case=m.TC_CASES[4], batch=33)),
    "mlp fused backward 128": ("test_mlp", "test_fused_backward_matches_torch_float64",
                               lambda m: dict(case=m.FAST_BWD_CASES[7], batch=1000, need_dx=True)),
    "linear_gelu small batch f32": ("test_gemm", "test_linear_gelu_backward_matches_torch_float64",
                                    dict(dtype="float32", m=33, k=100, n=10, saved=False)),
    "linear_gelu small batch bf16": ("test_gemm", "test_linear_gelu_backward_matches_torch_float64",
                                     dict(dtype="bfloat16", m=32, k=768, n=3072, saved=True)),
    "matmul tf32": ("test_gemm_tf32", "test_adapter_matmul_tf32_forward_and_backward", dict(m=200, k=136, n=72)),
    "fused linear cross entropy": ("test_losses_linear", "test_adapter_autograd_matches_torch_float64",
                                   dict(dtype="bfloat16", reduction="mean", bias=True)),
}


def _borrowed(case):
    """(the test function, its arguments) of BORROWED[case]."""
    module_name, name, args = BORROWED[case]
    module = importlib.import_module(module_name)
    return getattr(module, name), args(module) if callable(args) else args


def _parametrize_marks(fn):
    """fn's parametrize marks, each as (argument names, the rows of values it runs)."""
    marks = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == "parametrize":
            names, argvalues = mark.args[0], mark.args[1]
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
            rows = [tuple(r.values) if hasattr(r, "values") else (tuple(r) if len(names) > 1 else (r,))
                    for r in argvalues]
            marks.append((names, rows))
    return marks


@pytest.mark.parametrize("case", sorted(BORROWED))
def test_borrowed_cases_are_cases_their_files_run(case):
    """No GPU needed: each borrowed case names an existing test, every argument it takes, and for each
    of the test's parametrize marks one row of values that mark runs (names given together, such as
    "rows,n", matched together): a renamed test or a dropped case fails here, in CI."""
    pytest.importorskip("torch")
    fn, args = _borrowed(case)
    fixture = {"monkeypatch": None} if "monkeypatch" in inspect.signature(fn).parameters else {}
    inspect.signature(fn).bind(**args, **fixture)
    named = set()
    for names, rows in _parametrize_marks(fn):
        named.update(names)
        mine = tuple(args.get(n) for n in names)
        assert mine in rows, f"{case}: {dict(zip(names, mine))} is not among {fn.__name__}'s cases"
    assert set(args) <= named, f"{case}: {sorted(set(args) - named)} not parametrized by {fn.__name__}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BORROWED))
def test_borrowed_case(case, monkeypatch):
    fn, args = _borrowed(case)
    if "monkeypatch" in inspect.signature(fn).parameters:  # the borrowed test's one fixture
        args = {**args, "monkeypatch": monkeypatch}
    fn(**args)
