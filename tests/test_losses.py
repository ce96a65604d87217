"""The losses family's contract (cross_entropy, its fused gradient, cross_entropy_backward), through
the CuPy API and the torch adapter: the launch plan and every argument check without a GPU; on a
GPU, against torch's F.cross_entropy (and the z-loss formula) in float64 on fresh random data."""
import math
import os
import re

import pytest

from rawops import _modules, losses
from rawops.losses import cross_entropy, cross_entropy_backward, plan
from test_validation import BASE, FAR, OTHER, FakeCAI, assert_passes_validation

SMS = 132
H100_L2 = 50 << 20  # cudaDevAttrL2CacheSize of an H100 / H200
RESIDENT = losses.resident_bytes(H100_L2)


def logits(shape=(4, 8), ptr=BASE, typestr="<f4", **kw):
    return FakeCAI(shape, typestr, ptr, **kw)


def labels(n=4, ptr=OTHER, typestr="<i8", **kw):
    return FakeCAI((n,), typestr, ptr, **kw)


# ------------------------------------------------------------------------------ the launch plan (CPU)
def test_plan_takes_a_warp_per_short_row_and_a_block_per_long_one():
    mode, blocks, threads = plan(1000, 64 * 8, 2, SMS, 8)  # 64 bf16 vectors: the widest warp row
    assert (mode, threads) == (losses.FLAG_WARP, losses.WARP_THREADS)
    assert blocks == -(-1000 // (losses.WARP_THREADS // 32))
    mode, blocks, threads = plan(1000, 64 * 8 + 1, 2, SMS, 8, l2_resident_bytes=RESIDENT)
    assert mode == 0 and threads == losses.MIN_BLOCK_THREADS and blocks == 1000
    for n in (1, 3, 1000, 32000, 128256, 256 * 1024):
        for itemsize in (2, 4):
            mode, blocks, threads = plan(8192, n, itemsize, SMS, 2, l2_resident_bytes=RESIDENT)
            assert (mode, threads) == losses.row_shape(n, itemsize)
            assert 1 <= blocks <= 8192 and threads % 32 == 0 and threads <= losses.MAX_THREADS
            if mode == 0:
                nvec = -(-n // (16 // itemsize))
                # about UNROLL vectors a thread, a power of two
                assert threads & (threads - 1) == 0
                assert threads == losses.MAX_THREADS or threads * losses.UNROLL >= nvec


def test_plan_keeps_the_rows_in_flight_within_l2_when_it_reads_them_twice():
    assert RESIDENT == 24 << 20  # the H100's 50 MiB L2: 24 MiB of rows in flight
    assert losses.resident_bytes(96 << 20) == losses.resident_bytes(48 << 20) * 2  # scales with the L2
    # 8192 x 128256 bf16: 256 KB rows, one a multiprocessor; the forward alone fills the SMs
    _, blocks, threads = plan(8192, 128256, 2, SMS, 1, l2_resident_bytes=RESIDENT)
    assert (blocks, threads) == (SMS, 1024)
    _, blocks, _ = plan(8192, 128256, 2, SMS, 1, reread=False)
    assert blocks == SMS  # one 1024-thread block an SM: what the occupancy API gives a 58-register kernel
    _, blocks, _ = plan(8192, 128256, 2, SMS, 2, reread=False)
    assert blocks == 2 * SMS
    # 64 KB rows: as many as fit the budget, at most what the SMs hold
    _, blocks, threads = plan(8192, 32768, 2, SMS, 8, l2_resident_bytes=RESIDENT)
    assert blocks * 32768 * 2 <= RESIDENT and blocks >= SMS
    assert plan(8192, 32768, 2, SMS, 1, l2_resident_bytes=RESIDENT)[1] == SMS  # never past the SMs' blocks
    # a larger L2 keeps more rows in flight
    assert plan(8192, 32768, 2, SMS, 8, l2_resident_bytes=2 * RESIDENT)[1] > blocks
    # never more blocks than rows, never fewer than one
    assert plan(3, 128256, 4, SMS, 2, l2_resident_bytes=RESIDENT)[1] == 3
    assert plan(0, 10, 4, SMS, 8)[1] == 1
    assert plan(10 ** 6, 10, 4, SMS, 0)[1] == SMS  # a zero from the occupancy API still launches


def test_the_warp_grid_is_the_resident_blocks():
    # resident blocks of 256 threads an SM, as the occupancy API gives them
    for per_sm in (1, 5, 8):
        mode, blocks, threads = plan(10 ** 6, 128, 2, SMS, per_sm)
        assert (mode, blocks, threads) == (losses.FLAG_WARP, SMS * per_sm, losses.WARP_THREADS)


def test_vector_flag_only_where_every_row_is_on_16_byte_boundaries():
    assert losses.row_flags(1024, 2, (256, 512), (1024,), False) & losses.FLAG_VECTORS
    assert not losses.row_flags(1001, 2, (256,), (1001,), False) & losses.FLAG_VECTORS
    assert not losses.row_flags(1024, 2, (258,), (1024,), False) & losses.FLAG_VECTORS
    assert not losses.row_flags(1024, 2, (256,), (1028,), False) & losses.FLAG_VECTORS
    assert losses.row_flags(8, 4, (256,), (8,), True) & losses.FLAG_TARGET_I32


def test_table_matches_the_kernels_the_source_defines():
    with open(f"{_modules.kernel_source_dir()}/losses.cu") as f:
        source = f.read()
    defined = set(re.findall(r"(cross_entropy_\w+)_##suffix\(", source))
    assert defined == set(losses.KERNELS)
    instantiated = set(re.findall(r"^RAWOPS_CROSS_ENTROPY\([^,]+,\s*(\w+)\)", source, flags=re.M))
    assert instantiated == {"f32", "f16", "bf16"}
    for name, kinds in (("cross_entropy_fwd", losses.FWD_KINDS), ("cross_entropy_scale", losses.SCALE_KINDS),
                        ("cross_entropy_targets", losses.TARGETS_KINDS), ("cross_entropy_reduce", losses.REDUCE_KINDS)):
        assert len(kinds) == len(losses.KERNELS[name])


def test_launch_kinds_and_names_match_the_kernel_signatures():
    # The generic launcher marshals one slot per kind: a count or type mismatch passes garbage.
    with open(f"{_modules.kernel_source_dir()}/losses.cu") as f:
        source = re.sub(r"\\\n", " ", f.read())
    signatures = dict(re.findall(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*(\w+)_##suffix\(([^)]*)\)',
                                 source))
    kinds = {"cross_entropy_fwd": losses.FWD_KINDS, "cross_entropy_scale": losses.SCALE_KINDS,
             "cross_entropy_targets": losses.TARGETS_KINDS, "cross_entropy_reduce": losses.REDUCE_KINDS}
    assert set(signatures) == set(kinds)
    for name, params in signatures.items():
        params = [p.strip() for p in params.split(",")]
        got = "".join("p" if "*" in p else "f" if p.split()[0] == "float" else "q" for p in params)
        assert got == kinds[name], f"{name}: launch kinds {kinds[name]!r}, signature {got!r}"
        assert [p.split()[-1].lstrip("*") for p in params] == list(losses.KERNELS[name]), "the table names them"


def test_adapter_signature_extends_torchs_with_keywords_only():
    import inspect

    import torch.nn.functional as F

    from rawops.torch_adapter import losses as ta

    ours = list(inspect.signature(ta.cross_entropy).parameters.values())
    theirs = list(inspect.signature(F.cross_entropy).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == [(p.name, p.kind, p.default) for p in theirs]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in ours[len(theirs):])


# ------------------------------------------------------------------------------ argument checks (CPU)
def test_a_valid_call_gets_past_validation():
    assert_passes_validation(cross_entropy, logits(), labels())
    assert_passes_validation(cross_entropy, logits(typestr="<f2"), labels(typestr="<i4"), grad="new")
    assert_passes_validation(cross_entropy, logits(), labels(), 3, 0.1, "none", 1e-4, grad="inplace")
    # a row-strided view of a wider matrix, a strided target
    assert_passes_validation(cross_entropy, logits(strides=(64, 4)), labels(strides=(16,)))
    assert_passes_validation(cross_entropy_backward, logits(), labels(), logits((), ptr=FAR), reduction="sum")
    assert_passes_validation(cross_entropy_backward, logits(), labels(), logits((4,), ptr=FAR), reduction="none",
                             out=logits())


@pytest.mark.parametrize("bad,error,words", [
    (dict(logits=logits(typestr="|u1")), TypeError, "logits has dtype"),
    (dict(logits=logits((4, 8, 2))), ValueError, "logits has shape"),
    (dict(logits=logits((8,))), ValueError, "logits has shape"),
    (dict(logits=logits((4, 0))), ValueError, "V = 0"),
    (dict(logits=logits(strides=(4, 32))), ValueError, "logits is not row-strided"),
    (dict(logits=logits(ptr=BASE + 2)), ValueError, "logits is misaligned"),
    (dict(logits=[[1.0]]), TypeError, "logits"),
    (dict(target=labels(typestr="<f4")), TypeError, "target has dtype"),
    (dict(target=labels(typestr="<i2")), TypeError, "target has dtype"),
    (dict(target=labels(typestr="|u1")), TypeError, "target has dtype"),
    (dict(target=labels(5)), ValueError, "target has shape"),
    (dict(target=FakeCAI((4, 1), "<i8", OTHER)), ValueError, "target has shape"),
    (dict(target=labels(ptr=OTHER + 4)), ValueError, "target is misaligned"),
    (dict(ignore_index=1.0), TypeError, "ignore_index must be an int"),
    (dict(ignore_index=True), TypeError, "ignore_index must be an int"),
    (dict(ignore_index=1 << 63), ValueError, "ignore_index"),
    (dict(label_smoothing=-0.1), ValueError, "label_smoothing must be between 0.0 and 1.0"),
    (dict(label_smoothing=1.5), ValueError, "label_smoothing must be between 0.0 and 1.0"),
    (dict(label_smoothing=float("nan")), ValueError, "label_smoothing"),
    (dict(label_smoothing="0.1"), TypeError, "label_smoothing must be a real number"),
    (dict(reduction="avg"), ValueError, "reduction must be 'mean', 'sum' or 'none'"),
    (dict(reduction=None), TypeError, "reduction must be a string"),
    (dict(z_loss=-1e-4), ValueError, "z_loss must be a finite number >= 0"),
    (dict(z_loss=float("inf")), ValueError, "z_loss"),
    (dict(z_loss=None), TypeError, "z_loss must be a real number"),
    (dict(grad=True), TypeError, "grad must be False, 'new' or 'inplace'"),
    (dict(grad="in-place"), ValueError, "grad must be False, 'new' or 'inplace'"),
    (dict(check_targets=1), TypeError, "check_targets must be a bool"),
    (dict(grad="inplace", logits=logits(readonly=True)), ValueError, "read-only"),
    (dict(grad="inplace", logits=logits(strides=(0, 4))), ValueError, "rows overlap"),
])
def test_cross_entropy_checks_fire_before_any_launch(bad, error, words):
    kwargs = dict(logits=logits(), target=labels())
    kwargs.update(bad)
    with pytest.raises(error, match=re.escape(words)):
        cross_entropy(**kwargs)


@pytest.mark.parametrize("bad,error,words", [
    (dict(grad_output=logits((), typestr="<f2", ptr=FAR)), TypeError, "grad_output has dtype"),
    (dict(grad_output=logits((4,), ptr=FAR)), ValueError, "expected one value for reduction='mean'"),
    (dict(grad_output=logits((), ptr=FAR), reduction="none"), ValueError, "expected (4,) for reduction='none'"),
    (dict(grad_output=logits((4,), ptr=FAR, strides=(8,)), reduction="none"), ValueError, "not C-contiguous"),
    (dict(out=logits(typestr="<f2", ptr=FAR)), TypeError, "out has dtype"),
    (dict(out=logits((4, 9), ptr=FAR)), ValueError, "out has shape"),
    (dict(out=logits(ptr=BASE + 16)), ValueError, "out overlaps logits"),
    (dict(out=logits(ptr=OTHER)), ValueError, "out overlaps target"),
    (dict(out=logits(ptr=FAR, readonly=True)), ValueError, "out is read-only"),
])
def test_cross_entropy_backward_checks_fire_before_any_launch(bad, error, words):
    kwargs = dict(logits=logits(), target=labels())
    kwargs.update(bad)
    with pytest.raises(error, match=re.escape(words)):
        cross_entropy_backward(**kwargs)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(weight=torch.ones(8)), ValueError, "weight"),
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(label_smoothing=2.0), ValueError, "label_smoothing"),
    (dict(ignore_index=0.5), TypeError, "ignore_index"),
    (dict(z_loss=-1.0), ValueError, "z_loss"),
    (dict(inplace_backward="yes"), TypeError, "inplace_backward"),
    (dict(check_targets=None), TypeError, "check_targets"),
])
def test_adapter_checks_its_arguments_before_the_tensors(kwargs, error, words):
    from rawops.torch_adapter import losses as ta

    with pytest.raises(error, match=words):
        ta.cross_entropy(torch.zeros(4, 8), torch.zeros(4, dtype=torch.int64), **kwargs)
    with pytest.raises(error, match=words):
        if "weight" in kwargs:
            ta.CrossEntropyLoss(weight=kwargs["weight"])
        else:
            ta.CrossEntropyLoss(**kwargs)


def test_adapter_refuses_probability_targets_and_other_shapes():
    from rawops.torch_adapter import losses as ta

    with pytest.raises(ValueError, match="target has shape"):
        ta.cross_entropy(torch.zeros(8), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="target has shape"):
        ta.cross_entropy(torch.zeros(2, 8, 3), torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        ta.cross_entropy([[0.0]], torch.zeros(1, dtype=torch.int64))


def test_adapter_maps_the_legacy_reduction_arguments_as_torch_does():
    from rawops.torch_adapter import losses as ta

    assert ta._reduction(None, None, "none") == "none"
    with pytest.warns(UserWarning, match="deprecated"):
        assert ta._reduction(False, None, "mean") == "sum"
    with pytest.warns(UserWarning, match="deprecated"):
        assert ta._reduction(None, False, "mean") == "none"


def test_module_state_dict_is_torchs():
    from rawops.torch_adapter import losses as ta

    ours, theirs = ta.CrossEntropyLoss(ignore_index=3, label_smoothing=0.1), torch.nn.CrossEntropyLoss()
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    assert ours.ignore_index == 3 and ours.label_smoothing == 0.1 and ours.reduction == "mean"


# ================================================================================== GPU
gpu = pytest.mark.gpu
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
REDUCTIONS = ("mean", "sum", "none")


def _gpu_imports():
    import cupy

    from gpu_reference import TOLERANCE, assert_close, poison_pool, random, to_cupy, to_torch
    return cupy, TOLERANCE, assert_close, poison_pool, random, to_cupy, to_torch


def _targets(rows, n, ignore_every=5, ignore_index=-100, dtype=torch.int64):
    """Fresh random targets with 0 and n - 1 among them and every `ignore_every`-th row ignored."""
    t = torch.randint(0, n, (rows,), device="cuda")
    if rows > 1:
        t[0], t[1] = 0, n - 1
    if ignore_every:
        t[2::ignore_every] = ignore_index
    return t.to(dtype)


def reference(x, t, ignore_index=-100, smoothing=0.0, reduction="mean", z=0.0, grad_output=None):
    """float64 loss and its gradient with respect to the stored logits x (torch's F.cross_entropy,
    plus z * logsumexp^2 on the rows not ignored), the loss's gradient grad_output (None: 1)."""
    import torch.nn.functional as F

    leaf = x.double().requires_grad_()
    t = t.long()
    rows = F.cross_entropy(leaf, t, ignore_index=ignore_index, reduction="none", label_smoothing=smoothing)
    keep = t != ignore_index
    if z:
        rows = rows + torch.where(keep, z * torch.logsumexp(leaf, -1) ** 2, torch.zeros_like(rows))
    loss = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / keep.sum()}[reduction]
    go = torch.ones_like(loss) if grad_output is None else grad_output.double()
    (g,) = torch.autograd.grad(loss, leaf, go, allow_unused=True)
    return loss.detach(), (torch.zeros_like(leaf) if g is None else g)


def _shapes():
    # V not a multiple of anything, the vocabularies of real models; rows so each case stays small
    return [(37, 1), (37, 3), (64, 1000), (33, 1001), (16, 32000), (9, 32001), (8, 128256)]


@gpu
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", _shapes())
def test_loss_and_gradient_match_torch_float64(rows, n, dtype, reduction):
    cupy, TOL, assert_close, poison_pool, random, to_cupy, to_torch = _gpu_imports()
    dt = DTYPES[dtype]
    x, t = random((rows, n), dt), _targets(rows, n)
    ref_loss, ref_grad = reference(x, t, reduction=reduction)
    poison_pool(x.numel() * x.element_size(), rows * 4, rows * x.element_size())
    loss, grad = cross_entropy(to_cupy(x), to_cupy(t), reduction=reduction, grad="new")
    assert isinstance(loss, cupy.ndarray) and loss.dtype == to_cupy(x).dtype
    assert loss.shape == ((rows,) if reduction == "none" else ())
    assert_close(loss, ref_loss, dt, f"loss {reduction}")
    assert_close(grad, ref_grad, dt, f"grad {reduction}", factor=2)
    alone = cross_entropy(to_cupy(x), to_cupy(t), reduction=reduction)
    assert cupy.array_equal(alone, loss), "the loss without the gradient == with it"
    ignored = (t == -100).nonzero().flatten()
    assert (to_torch(grad)[ignored] == 0).all(), "ignored rows: gradient exactly 0"


@gpu
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smoothing,z", [(0.1, 0.0), (1.0, 0.0), (0.0, 1e-4), (0.2, 1e-2)])
@pytest.mark.parametrize("rows,n", [(48, 1000), (16, 32001), (8, 128256)])
def test_label_smoothing_and_z_loss_match_the_float64_formula(rows, n, smoothing, z, dtype, reduction):
    _, _, assert_close, poison_pool, random, to_cupy, _ = _gpu_imports()
    dt = DTYPES[dtype]
    x, t = random((rows, n), dt), _targets(rows, n, ignore_index=7)
    ref_loss, ref_grad = reference(x, t, 7, smoothing, reduction, z)
    poison_pool(x.numel() * x.element_size())
    loss, grad = cross_entropy(to_cupy(x), to_cupy(t), 7, smoothing, reduction, z, grad="new")
    assert_close(loss, ref_loss, dt, f"loss eps={smoothing} z={z}")
    assert_close(grad, ref_grad, dt, f"grad eps={smoothing} z={z}", factor=2)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_ignored_and_empty_batches_give_what_torch_gives(dtype):
    cupy, _, _, _, random, to_cupy, to_torch = _gpu_imports()
    dt = DTYPES[dtype]
    x = random((6, 100), dt)
    t = torch.full((6,), -100, device="cuda")
    for smoothing in (0.0, 0.3):
        loss, grad = cross_entropy(to_cupy(x), to_cupy(t), label_smoothing=smoothing, grad="new")
        torch_loss = torch.nn.functional.cross_entropy(x.double(), t, label_smoothing=smoothing)
        assert math.isnan(float(loss)) and math.isnan(torch_loss.item()), "mean over no rows: NaN, as torch"
        assert (to_torch(grad) == 0).all()
        assert float(cross_entropy(to_cupy(x), to_cupy(t), reduction="sum")) == 0.0
        assert (cross_entropy(to_cupy(x), to_cupy(t), reduction="none") == 0).all()
    empty = random((0, 100), dt)
    t0 = torch.zeros(0, dtype=torch.int64, device="cuda")
    assert math.isnan(float(cross_entropy(to_cupy(empty), to_cupy(t0))))
    assert float(cross_entropy(to_cupy(empty), to_cupy(t0), reduction="sum")) == 0.0
    loss, grad = cross_entropy(to_cupy(empty), to_cupy(t0), reduction="none", grad="new")
    assert loss.shape == (0,) and grad.shape == (0, 100)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1000, 4097, 128256])
def test_minus_infinity_and_huge_logits(n, dtype):
    _, _, assert_close, poison_pool, random, to_cupy, to_torch = _gpu_imports()
    dt = DTYPES[dtype]
    rows = 12
    # float16: 500 is far past exp overflow (11), and the sum of 12 rows of losses (each about
    # max - x_t < 5 * 500) stays below its largest finite value
    x = random((rows, n), dt, scale=5e2 if dt is torch.float16 else 1e4)
    t = _targets(rows, n, ignore_every=0)
    x[:, 5::7] = float("-inf")  # masked classes (never a target below)
    t = torch.where((t - 5) % 7 == 0, t - 1, t)
    x[3] = float("-inf")
    x[3, 11] = 1.0  # one finite class: probability 1
    t[3] = 11
    # a runner-up per row close to the max, so that the gradient is not a pure one-hot
    top, where = x.float().max(-1)
    x[torch.arange(rows), (where + 2) % n] = (top - 0.5).to(dt)
    for reduction in REDUCTIONS:
        ref_loss, ref_grad = reference(x, t, reduction=reduction)
        poison_pool(x.numel() * x.element_size())
        loss, grad = cross_entropy(to_cupy(x), to_cupy(t), reduction=reduction, grad="new")
        assert_close(loss, ref_loss, dt, f"loss, huge and -inf logits ({reduction})", floor=1.0)
        assert_close(grad, ref_grad, dt, f"grad, huge and -inf logits ({reduction})", factor=2)
    # the target's class at -inf: an infinite loss, as torch
    x[0, 5], t[0] = float("-inf"), 5
    loss = cross_entropy(to_cupy(x), to_cupy(t), reduction="none")
    assert math.isinf(float(loss[0])) and float(loss[0]) > 0
    # smoothing over rows with -inf classes: +inf, as torch
    loss = to_torch(cross_entropy(to_cupy(x), to_cupy(t), label_smoothing=0.1, reduction="none")).double()
    ref = torch.nn.functional.cross_entropy(x.double(), t, label_smoothing=0.1, reduction="none")
    assert (ref == float("inf")).all() and (loss == float("inf")).all()


@gpu
def test_bad_targets_give_nan_rows_and_check_targets_names_the_first():
    cupy, _, _, _, random, to_cupy, to_torch = _gpu_imports()
    x = random((10, 50), torch.float32)
    for bad in (-1, 50, 1 << 40):
        t = _targets(10, 50)
        t[6], t[8] = bad, 60
        loss, grad = cross_entropy(to_cupy(x), to_cupy(t), reduction="none", grad="new")
        loss, grad = to_torch(loss), to_torch(grad)
        assert torch.isnan(loss[6]) and torch.isnan(loss[8]) and not torch.isnan(loss[:6]).any()
        assert torch.isnan(grad[6]).all() and not torch.isnan(grad[:6]).any()
        assert math.isnan(float(cross_entropy(to_cupy(x), to_cupy(t))))
        with pytest.raises(ValueError, match=re.escape(f"target[6] = {bad} is outside [0, 50)")):
            cross_entropy(to_cupy(x), to_cupy(t), check_targets=True)
    t = _targets(10, 50)
    cross_entropy(to_cupy(x), to_cupy(t), check_targets=True)  # passes when all are good


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3, 1001, 32768])
def test_in_place_gradient_is_the_new_one_in_the_logits_memory(n, dtype):
    cupy, _, _, _, random, to_cupy, to_torch = _gpu_imports()
    dt = DTYPES[dtype]
    x, t = random((40, n), dt), _targets(40, n)
    loss, grad = cross_entropy(to_cupy(x), to_cupy(t), label_smoothing=0.1, z_loss=1e-3, grad="new")
    xc = to_cupy(x.clone())
    loss2, same = cross_entropy(xc, to_cupy(t), label_smoothing=0.1, z_loss=1e-3, grad="inplace")
    assert same is xc and cupy.array_equal(xc, grad), "in place: bit for bit the new gradient"
    assert cupy.array_equal(loss, loss2)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_backward_with_a_grad_output_and_in_place(reduction, dtype):
    cupy, _, assert_close, poison_pool, random, to_cupy, to_torch = _gpu_imports()
    dt = DTYPES[dtype]
    rows, n = 50, 5003
    x, t = random((rows, n), dt), _targets(rows, n)
    go = random((rows,) if reduction == "none" else (), dt)
    _, ref_grad = reference(x, t, smoothing=0.05, reduction=reduction, z=1e-3, grad_output=go)
    poison_pool(x.numel() * x.element_size())
    grad = cross_entropy_backward(to_cupy(x), to_cupy(t), to_cupy(go), label_smoothing=0.05, reduction=reduction,
                                  z_loss=1e-3)
    assert_close(grad, ref_grad, dt, f"backward {reduction}", factor=2)
    xc = to_cupy(x.clone())
    assert cross_entropy_backward(to_cupy(x.clone()), to_cupy(t), to_cupy(go), label_smoothing=0.05,
                                  reduction=reduction, z_loss=1e-3, out=xc) is xc
    inplace = to_cupy(x.clone())
    cross_entropy_backward(inplace, to_cupy(t), to_cupy(go), label_smoothing=0.05, reduction=reduction, z_loss=1e-3,
                           out=inplace)
    assert cupy.array_equal(inplace, grad) and cupy.array_equal(xc, grad)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_strided_logits_strided_and_int32_targets(dtype):
    cupy, _, assert_close, _, random, to_cupy, _ = _gpu_imports()
    dt = DTYPES[dtype]
    for rows, n, pad in ((33, 1000, 8), (33, 1000, 3), (9, 32000, 24)):
        base = random((rows, n + pad), dt)
        x = base[:, pad:]
        tb = _targets(2 * rows, n)
        t = tb[::2]
        ref_loss, ref_grad = reference(x, t, smoothing=0.1)
        loss, grad = cross_entropy(to_cupy(x), to_cupy(t), label_smoothing=0.1, grad="new")
        assert_close(loss, ref_loss, dt, f"strided logits pad={pad}")
        assert_close(grad, ref_grad, dt, f"strided logits pad={pad} grad", factor=2)
        loss32 = cross_entropy(to_cupy(x), to_cupy(t.int()), label_smoothing=0.1)
        assert cupy.array_equal(loss32, loss), "int32 targets == int64 targets"


@gpu
def test_deterministic():
    cupy, _, _, _, random, to_cupy, _ = _gpu_imports()
    x, t = random((4096, 3001), torch.bfloat16), _targets(4096, 3001)
    a = cross_entropy(to_cupy(x), to_cupy(t), label_smoothing=0.1, z_loss=1e-4, grad="new")
    b = cross_entropy(to_cupy(x), to_cupy(t), label_smoothing=0.1, z_loss=1e-4, grad="new")
    assert cupy.array_equal(a[0], b[0]) and cupy.array_equal(a[1], b[1])


@gpu
def test_more_than_2_to_the_31_elements():
    # N * V past 2^31 (bf16, 4.3 GB): the last rows' losses and gradients against float64 torch
    cupy, _, assert_close, _, random, to_cupy, to_torch = _gpu_imports()
    rows, n = 16385, 131072
    assert rows * n > 2 ** 31
    x = torch.empty((rows, n), dtype=torch.bfloat16, device="cuda")
    for start in range(0, rows, 2048):
        x[start:start + 2048] = random((min(2048, rows - start), n), torch.bfloat16)
    t = _targets(rows, n)
    tail = slice(rows - 8, rows)
    ref_rows, _ = reference(x[tail], t[tail], reduction="none")
    count = (t != -100).sum()
    _, ref_tail_grad = reference(x[tail], t[tail], reduction="sum")
    loss_rows = cross_entropy(to_cupy(x), to_cupy(t), reduction="none")
    assert_close(to_torch(loss_rows)[tail], ref_rows, torch.bfloat16, "last rows' losses")
    xc = to_cupy(x)
    _, grad = cross_entropy(xc, to_cupy(t), grad="inplace")
    assert_close(to_torch(grad)[tail], ref_tail_grad / count.double(), torch.bfloat16, "last rows' gradient",
                 factor=2)
    del x, xc, grad


# ------------------------------------------------------------------------------ torch adapter (GPU)
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_adapter_autograd_matches_torch(reduction, dtype):
    from rawops.torch_adapter import losses as ta

    _, _, assert_close, _, random, _, _ = _gpu_imports()
    dt = DTYPES[dtype]
    rows, n = 67, 32001
    x, t = random((rows, n), dt), _targets(rows, n)
    go = random((rows,) if reduction == "none" else (), dt)
    leaf = x.clone().requires_grad_()
    loss = ta.cross_entropy(leaf, t, reduction=reduction, label_smoothing=0.1, z_loss=1e-4)
    loss.backward(go)
    ref_loss, ref_grad = reference(x, t, smoothing=0.1, reduction=reduction, z=1e-4, grad_output=go)
    assert loss.dtype == dt
    assert_close(loss.detach(), ref_loss, dt, "adapter loss")
    assert_close(leaf.grad, ref_grad, dt, "adapter grad", factor=2)
    with torch.no_grad():
        assert torch.equal(ta.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1, z_loss=1e-4),
                           loss.detach()), "no-grad path == autograd path"
    # the usual backward (factor 1), and in place: the same gradient, the input's memory reused
    leaf2 = x.clone().requires_grad_()
    ta.cross_entropy(leaf2, t, reduction=reduction).sum().backward()
    _, ref_grad = reference(x, t, reduction=reduction)
    assert_close(leaf2.grad, ref_grad, dt, "adapter grad, factor 1", factor=2)
    leaf3 = x.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    ta.cross_entropy(leaf3, t, reduction=reduction, inplace_backward=True).sum().backward()
    extra = torch.cuda.max_memory_allocated() - before
    # Under compute-sanitizer memcheck torch's autograd keeps a copy of the gradient as .grad, not the
    # buffer itself (dev/losses_inplace_peak.py; bench/results/h200/sanitizer.md): that one copy is
    # torch's, allowed there (bench/device_round.sh sets RAWOPS_UNDER_SANITIZER), nothing more.
    logits = leaf3.numel() * leaf3.element_size()
    copies = 1 if os.environ.get("RAWOPS_UNDER_SANITIZER") == "1" else 0
    assert extra < copies * logits + logits // 2, f"inplace_backward: {extra} bytes more at the peak"
    assert torch.equal(leaf3.grad, leaf2.grad)


@gpu
def test_adapter_shapes_as_torch_and_module():
    from rawops.torch_adapter import losses as ta

    _, _, assert_close, _, random, _, _ = _gpu_imports()
    F = torch.nn.functional
    x, t = random((4, 10, 3), torch.float32), torch.randint(0, 10, (4, 3), device="cuda")
    for reduction in REDUCTIONS:
        assert_close(ta.cross_entropy(x, t, reduction=reduction),
                     F.cross_entropy(x.double(), t, reduction=reduction), torch.float32, f"(N, C, d) {reduction}")
    x1, t1 = random((10,), torch.float32), torch.tensor(4, device="cuda")
    assert_close(ta.cross_entropy(x1, t1), F.cross_entropy(x1.double(), t1), torch.float32, "(C,)")
    module = ta.CrossEntropyLoss(ignore_index=1, label_smoothing=0.2)
    module.load_state_dict(torch.nn.CrossEntropyLoss().state_dict())
    x2, t2 = random((64, 1000), torch.float32), _targets(64, 1000, ignore_index=1)
    assert_close(module(x2, t2), F.cross_entropy(x2.double(), t2, ignore_index=1, label_smoothing=0.2),
                 torch.float32, "module")
    leaf = x2.clone().requires_grad_()
    loss = ta.cross_entropy(leaf, t2)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()
    # a row-strided view of a wider leaf, the gradient in place in its memory, scaled by 2
    base = random((64, 1024), torch.bfloat16).requires_grad_()
    view = base[:, 24:]
    ref_loss, ref_grad = reference(view.detach(), t2, smoothing=0.1, grad_output=torch.tensor(2.0, device="cuda"))
    loss = ta.cross_entropy(view, t2, label_smoothing=0.1, inplace_backward=True)
    assert_close(loss.detach(), ref_loss, torch.bfloat16, "row-strided view, in place")
    (2 * loss).backward()
    assert_close(base.grad[:, 24:], ref_grad, torch.bfloat16, "row-strided view, in place, grad", factor=2)
    assert (base.grad[:, :24] == 0).all()
    # bad targets: NaN without the check, ValueError with it
    bad = t2.clone()
    bad[5] = 1000
    assert torch.isnan(ta.cross_entropy(x2, bad))
    with pytest.raises(ValueError, match=re.escape("target[5] = 1000 is outside [0, 1000)")):
        ta.cross_entropy(x2, bad, check_targets=True)


@gpu
def test_adapter_compile_fullgraph():
    from rawops.torch_adapter import losses as ta

    _, _, assert_close, _, random, _, _ = _gpu_imports()
    x, t = random((64, 5000), torch.bfloat16), _targets(64, 5000)
    fn = torch.compile(lambda x, t: ta.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-4) * 3, fullgraph=True)
    leaf = x.clone().requires_grad_()
    loss = fn(leaf, t)
    loss.backward()
    ref_loss, ref_grad = reference(x, t, smoothing=0.1, z=1e-4, grad_output=torch.tensor(3.0, device="cuda"))
    assert_close(loss.detach(), 3 * ref_loss, torch.bfloat16, "compiled loss")
    assert_close(leaf.grad, ref_grad, torch.bfloat16, "compiled grad", factor=2)
    with torch.no_grad():
        assert_close(fn(x, t), 3 * ref_loss, torch.bfloat16, "compiled, no grad")


@gpu
def test_adapter_cuda_graph_capture():
    from rawops.torch_adapter import losses as ta

    _, _, assert_close, _, random, _, _ = _gpu_imports()
    rows, n = 256, 32000
    x = random((rows, n), torch.bfloat16).requires_grad_()
    t = _targets(rows, n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x.grad = None
            ta.cross_entropy(x, t, label_smoothing=0.1).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = ta.cross_entropy(x, t, label_smoothing=0.1)
        loss.backward()
    fresh, fresh_t = random((rows, n), torch.bfloat16), _targets(rows, n)
    with torch.no_grad():
        x.copy_(fresh)
    t.copy_(fresh_t)
    x.grad.fill_(float("nan"))
    graph.replay()
    ref_loss, ref_grad = reference(fresh, fresh_t, smoothing=0.1)
    assert_close(loss.detach(), ref_loss, torch.bfloat16, "graph loss")
    assert_close(x.grad, ref_grad, torch.bfloat16, "graph grad", factor=2)
