"""Two GPUs: every op family on GPU 1 while GPU 0 is current (for CuPy and for torch), through
the CuPy API and the torch adapter, against torch in float64; launches go to GPU 1's current
stream, the current device is left as it was, and arguments spread over two GPUs (or a stream
of the other GPU) are refused before any launch. Skips below two GPUs.

RAWOPS_MULTI_GPU_SELF_TEST=1 on a one-GPU machine runs the same tests with GPU 0 in both roles
(the tests' own code on real hardware; the refusals, which need two GPUs, skip)."""
import contextlib
import os

import cupy
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rawops  # noqa: E402
from gpu_reference import TOLERANCE, assert_close, written_late  # noqa: E402
from rawops import torch_adapter as ta  # noqa: E402


def _gpu_count():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver or no device
        return 0


SELF_TEST = os.environ.get("RAWOPS_MULTI_GPU_SELF_TEST") == "1" and _gpu_count() == 1
CURRENT, DATA = 0, 0 if SELF_TEST else 1  # the current GPU, the GPU that holds the data
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_gpu_count() < 2 and not SELF_TEST, reason="needs two CUDA GPUs")]
two_gpus = pytest.mark.skipif(SELF_TEST, reason="a refusal across two GPUs (self-test: one GPU)")

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
GPU1 = f"cuda:{DATA}"
GPU0 = f"cuda:{CURRENT}"


@contextlib.contextmanager
def on_gpu1():
    """GPU 1 current for CuPy and torch: for the tests' own conversions, never around a rawops call."""
    with cupy.cuda.Device(DATA), torch.cuda.device(DATA):
        yield


@pytest.fixture(autouse=True)
def gpu0_current():
    torch.cuda.set_device(CURRENT)
    cupy.cuda.Device(CURRENT).use()
    yield
    assert torch.cuda.current_device() == CURRENT, "a rawops call left torch's current device changed"
    assert cupy.cuda.runtime.getDevice() == CURRENT, "a rawops call left the current device changed"


def rand(shape, dtype, scale=1.0, device=GPU1):
    """Fresh normal data on GPU 1 (never zeros)."""
    return (torch.randn(shape, device=device) * scale).to(dtype)


def cp(t):
    with on_gpu1():
        return cupy.from_dlpack(t)


def th(a):
    """A CuPy result as a torch tensor, checked to be on GPU 1."""
    assert isinstance(a, cupy.ndarray) and a.device.id == DATA, f"result on {a.device}, expected GPU {DATA}"
    with on_gpu1():
        cupy.cuda.Device(DATA).synchronize()
        return torch.from_dlpack(a)


def poison_gpu1(*nbytes):
    """NaN blocks in GPU 1's CuPy pool and torch's, freed at once: the outputs allocated next
    start as NaN, so an element a kernel leaves unwritten cannot pass."""
    with on_gpu1():
        blocks = [cupy.full(max(n, 1), 0xFF, dtype=cupy.uint8) for n in nbytes]
        blocks += [torch.full((max(n, 1),), 0xFF, dtype=torch.uint8, device=GPU1) for n in nbytes]
        del blocks


def close(out, ref, dtype, what, factor=1):
    out = th(out) if isinstance(out, cupy.ndarray) else out
    assert out.device == torch.device(GPU1), f"{what}: on {out.device}, expected {GPU1}"
    assert_close(out.detach(), ref.detach().to(GPU1), dtype, what, factor)


def close_like_torch(out, ref64, theirs, dtype, what):
    """A half-type network's result: its error against float64 within 2x torch's own in the same
    dtype on the same data (rounding flips ReLU masks near a kink, in torch's network as in ours:
    test_mlp's criterion), or within 4x the dtype's tolerance. NaN never passes."""
    out = th(out) if isinstance(out, cupy.ndarray) else out
    assert out.device == torch.device(GPU1), f"{what}: on {out.device}, expected {GPU1}"
    ref = ref64.detach().to(GPU1)
    ours, torch_error = ((t.detach().double() - ref).norm().item() / ref.norm().item() for t in (out, theirs))
    assert ours <= max(2 * torch_error, 4 * TOLERANCE[dtype]), \
        f"{what}: relative error {ours:.3g}, torch's own in {dtype} {torch_error:.3g}"


def same_dtype_grads(reference, inputs, dy):
    """torch's own gradients of `reference` in the inputs' dtype (what close_like_torch weighs)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    return torch.autograd.grad(reference(*leaves), leaves, dy)


def grads64(reference, inputs, dy):
    """(y, grads) of `reference` in float64 on the same numbers."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    y = reference(*leaves)
    return y.detach(), torch.autograd.grad(y, leaves, dy.double())


# ------------------------------------------------------------------------------ the CuPy API
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_elementwise_family_on_gpu1(dtype):
    x, y, dy = rand((512, 768), dtype, 2.0), rand((512, 768), dtype), rand((512, 768), dtype)
    bias = rand((768,), dtype)
    nbytes = x.numel() * x.element_size()
    poison_gpu1(nbytes)
    close(rawops.gelu(cp(x)), F.gelu(x.double(), approximate="tanh"), dtype, "gelu")
    poison_gpu1(nbytes)
    close(rawops.relu_scale_add(cp(x), 1.5, cp(y)), F.relu(x.double()) * 1.5 + y.double(), dtype, "relu_scale_add")
    poison_gpu1(nbytes)
    close(rawops.add(cp(x), cp(y)), x.double() + y.double(), dtype, "add")
    poison_gpu1(nbytes)
    _, (dx,) = grads64(F.gelu, [x], dy)
    close(rawops.gelu_backward(cp(dy), cp(x), "none"), dx, dtype, "gelu_backward erf")
    poison_gpu1(nbytes)
    close(rawops.bias_gelu(cp(x), cp(bias)), F.gelu(x.double() + bias.double(), approximate="tanh"), dtype,
          "bias_gelu")
    poison_gpu1(nbytes, 768 * x.element_size())
    _, (dx, dbias) = grads64(lambda a, b: F.gelu(a + b, approximate="tanh"), [x, bias], dy)
    # the fused one-pass kernel
    got_dx, got_dbias = rawops.bias_gelu_backward(cp(dy), cp(x), cp(bias), approximate="tanh")
    close(got_dx, dx, dtype, "bias_gelu_backward dx")
    close(got_dbias, dbias, dtype, "bias_gelu_backward dbias", factor=5)
    close(rawops.column_sum(cp(y)), y.double().sum(0), dtype, "column_sum", factor=5)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_norm_and_softmax_families_on_gpu1(dtype):
    x, dy = rand((300, 1000), dtype), rand((300, 1000), dtype)
    w, b = rand((1000,), dtype, 0.5) + 1, rand((1000,), dtype, 0.5)
    y, mean, rstd = rawops.layer_norm_forward(cp(x), cp(w), cp(b))
    got = rawops.layer_norm_backward(cp(dy), cp(x), cp(w), mean, rstd)
    ry, expected = grads64(lambda a, c, d: F.layer_norm(a, (1000,), c, d), [x, w, b], dy)
    close(y, ry, dtype, "layer_norm y")
    for name, g, e in zip(("dx", "dweight", "dbias"), got, expected, strict=True):
        close(g, e, dtype, f"layer_norm {name}", factor=5)
    y, rstd = rawops.rms_norm_forward(cp(x), cp(w))
    got = rawops.rms_norm_backward(cp(dy), cp(x), cp(w), rstd)
    ry, expected = grads64(lambda a, c: F.rms_norm(a, (1000,), c, torch.finfo(dtype).eps), [x, w], dy)
    close(y, ry, dtype, "rms_norm y")
    for name, g, e in zip(("dx", "dweight"), got, expected, strict=True):
        close(g, e, dtype, f"rms_norm {name}", factor=5)
    for forward, backward, reference in ((rawops.softmax, rawops.softmax_backward, F.softmax),
                                         (rawops.log_softmax, rawops.log_softmax_backward, F.log_softmax)):
        y = forward(cp(x))
        ry, (rdx,) = grads64(lambda a: reference(a, -1), [x], dy)
        close(y, ry, dtype, f"{forward.__name__} y")
        close(backward(cp(dy), y), rdx, dtype, f"{forward.__name__} dx", factor=2)


# Each reaches another kernel of the matrix family (see rawops.gemm.plan).
MATMULS = {
    "f32 simt": (F32, 257, 129, 100, False),
    "f32 split-K + reduce": (F32, 64, 64, 8192, False),
    "f32 tf32": (F32, 512, 384, 256, True),
    "f16 mma": (F16, 300, 264, 136, False),
    "bf16 hopper": (BF16, 1024, 4096, 1024, False),
}


@pytest.mark.parametrize("case", list(MATMULS))
def test_matmul_on_gpu1(case):
    dtype, m, n, k, tf32 = MATMULS[case]
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    poison_gpu1(m * n * a.element_size())
    out = rawops.matmul(cp(a), cp(b), tf32=tf32)
    tolerance = 1e-3 / TOLERANCE[dtype] if tf32 else 1
    close(out, a.double() @ b.double(), dtype, case, factor=tolerance)


@pytest.mark.parametrize("dtype,m,n,k", [(F32, 32, 3072, 768), (BF16, 256, 1024, 512)], ids=["f32-small", "bf16"])
def test_linear_gelu_forward_and_backward_on_gpu1(dtype, m, n, k):
    x, w, b, dy = rand((m, k), dtype), rand((n, k), dtype, k ** -0.5), rand((n,), dtype), rand((m, n), dtype)
    poison_gpu1(m * n * x.element_size())
    y, pre = rawops.linear_gelu(cp(x), cp(w), cp(b), save_preactivation=True, approximate="tanh")
    ry, expected = grads64(lambda a, c, d: F.gelu(F.linear(a, c, d), approximate="tanh"), [x, w, b], dy)
    close(y, ry, dtype, "linear_gelu y")
    close(pre, F.linear(x.double(), w.double(), b.double()), dtype, "linear_gelu pre")
    for kept in (None, pre):  # the pre-activation recomputed by a GEMM, or the kept one
        got = rawops.linear_gelu_backward(cp(dy), cp(x), cp(w), cp(b), preactivation=kept, approximate="tanh")
        for name, g, e in zip(("dx", "dweight", "dbias"), got, expected, strict=True):
            close(g, e, dtype, f"linear_gelu_backward {name} (pre {'kept' if kept is not None else 'recomputed'})",
                  factor=5)


def _source_network():
    with on_gpu1():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(100, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                   torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(GPU1)


def _linears(net):
    return [m for m in net if isinstance(m, torch.nn.Linear)]


def _tcnn_weights(dtype):
    sizes = (32, 64, 64, 64, 64, 16)
    return [rand((o, i), dtype, i ** -0.5) for i, o in zip(sizes, sizes[1:])]


def test_fused_mlp_both_regimes_forward_and_backward_on_gpu1():
    net = _source_network()
    x = rand((1000, 100), F32)
    weights = [m.weight.detach() for m in _linears(net)]
    biases = [m.bias.detach() for m in _linears(net)]
    dy = rand((1000, 10), F32)
    ry, expected = grads64(lambda a, *wb: _mlp64(a, wb[:3], wb[3:], F.relu), [x, *weights, *biases], dy)
    close(rawops.fused_mlp(cp(x), [cp(t) for t in weights], [cp(t) for t in biases]), ry, F32, "source net")
    y, saved = rawops.fused_mlp_forward(cp(x), [cp(t) for t in weights], [cp(t) for t in biases])
    dx, dws, dbs = rawops.fused_mlp_backward(cp(dy), cp(x), y, saved, [cp(t) for t in weights],
                                             [cp(t) for t in biases])
    for name, g, e in zip(["dx", "dW0", "dW1", "dW2", "db0", "db1", "db2"], [dx, *dws, *dbs], expected, strict=True):
        close(g, e, F32, f"source net {name}", factor=5)

    weights = _tcnn_weights(F16)
    x, dy = rand((4096, 32), F16), rand((4096, 16), F16)
    ry, expected = grads64(lambda a, *ws: _mlp64(a, ws, None, F.relu), [x, *weights], dy)
    y, saved = rawops.fused_mlp_forward(cp(x), [cp(t) for t in weights])
    close(y, ry, F16, "64-wide f16 y", factor=10)
    dx, dws, _ = rawops.fused_mlp_backward(cp(dy), cp(x), y, saved, [cp(t) for t in weights])
    theirs = same_dtype_grads(lambda a, *ws: _mlp64(a, ws, None, F.relu), [x, *weights], dy)
    for i, (g, e, t) in enumerate(zip([dx, *dws], expected, theirs, strict=True)):
        close_like_torch(g, e, t, F16, f"64-wide f16 grad {i}")


def _mlp64(x, weights, biases, act):
    for i, w in enumerate(weights):
        x = F.linear(x, w, biases[i] if biases is not None else None)
        if i < len(weights) - 1:
            x = act(x)
    return x


def test_cupy_api_launches_on_gpu1s_current_stream():
    """GPU 1's current CuPy stream is the default for arrays on GPU 1, whichever GPU is current."""
    with on_gpu1():
        side = cupy.cuda.Stream(non_blocking=True)
    source, w = rand((64, 256), F32), rand((256, 256), F32)
    late = written_late(source, side)  # NaN unless the launch waits behind `side`'s work
    with cupy.cuda.Device(DATA):
        side.use()
    try:
        y = rawops.gelu(cp(late), approximate="tanh")
        z = rawops.matmul(cp(late), cp(w))
    finally:
        with cupy.cuda.Device(DATA):
            cupy.cuda.Stream.null.use()
    side.synchronize()
    close(y, F.gelu(source.double(), approximate="tanh"), F32, "gelu on GPU 1's stream")
    close(z, source.double() @ w.double(), F32, "matmul on GPU 1's stream")


@two_gpus
def test_a_given_stream_of_the_other_gpu_is_refused():
    x = rand((1000,), F32)
    gpu0_stream = cupy.cuda.Stream(non_blocking=True)
    for stream in (gpu0_stream, torch.cuda.Stream(device=0)):  # raw int handles are taken as given
        with pytest.raises(ValueError, match=r"^stream is on device 0, the arrays on device 1"):
            rawops.gelu(cp(x), stream=stream, approximate="tanh")
        with pytest.raises(ValueError, match=r"^stream is on device 0, the arrays on device 1"):
            rawops.matmul(cp(x.view(10, 100)), cp(rand((100, 8), F32)), stream=stream)
    with on_gpu1():
        gpu1_stream = cupy.cuda.Stream(non_blocking=True)
    y = rawops.gelu(cp(x), stream=gpu1_stream, approximate="tanh")  # its own GPU's stream, given from GPU 0: accepted
    gpu1_stream.synchronize()
    close(y, F.gelu(x.double(), approximate="tanh"), F32, "gelu on a given GPU 1 stream")


@two_gpus
def test_cupy_arrays_on_two_gpus_are_refused_naming_the_stray_one():
    a1, b1 = rand((16, 16), F32), rand((16, 16), F32)
    b0 = rand((16, 16), F32, device=GPU0)
    with pytest.raises(ValueError, match=r"^b is on device 0, a on device 1"):
        rawops.add(cp(a1), cupy.from_dlpack(b0))
    with pytest.raises(ValueError, match=r"is on device 0, .* on device 1; all arguments must be on one GPU"):
        rawops.matmul(cp(a1), cupy.from_dlpack(b0))
    with pytest.raises(ValueError, match=r"is on device 0, .* on device 1; all arguments must be on one GPU"):
        rawops.linear_gelu(cp(a1), cp(b1), cupy.from_dlpack(b0[0]), approximate="tanh")
    with pytest.raises(ValueError, match=r"is on device 0, .* on device 1; all arguments must be on one GPU"):
        rawops.layer_norm(cp(a1), cupy.from_dlpack(b0[0]))


# ------------------------------------------------------------------------------ the torch adapter
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_adapter_elementwise_rows_and_matrix_ops_with_autograd_on_gpu1(dtype):
    x, y = rand((3, 67, 128), dtype).requires_grad_(), rand((3, 67, 128), dtype).requires_grad_()
    bias, w = rand((128,), dtype).requires_grad_(), (rand((128,), dtype, 0.5) + 1).requires_grad_()
    cases = {
        "gelu": (lambda a: ta.gelu(a, "none"), F.gelu, [x]),
        "add": (ta.add, torch.add, [x, y]),
        "bias_gelu": (ta.bias_gelu, lambda a, c: F.gelu(a + c), [x, bias]),
        "layer_norm": (lambda a, c, d: ta.layer_norm(a, (128,), c, d), lambda a, c, d: F.layer_norm(a, (128,), c, d),
                       [x, w, bias]),
        "softmax": (lambda a: ta.softmax(a, -1), lambda a: F.softmax(a, -1), [x]),
        "matmul": (ta.matmul, torch.matmul, [x[0], y[0].t().detach().contiguous().requires_grad_()]),
        "linear_gelu": (ta.linear_gelu, lambda a, c, d: F.gelu(F.linear(a, c, d)),
                        [x, rand((96, 128), dtype, 128 ** -0.5).requires_grad_(), rand((96,), dtype).requires_grad_()]),
    }
    for name, (call, reference, inputs) in cases.items():
        out = call(*inputs)
        dy = rand(out.shape, dtype)
        grads = torch.autograd.grad(out, inputs, dy)
        ry, expected = grads64(reference, inputs, dy)
        close(out, ry, dtype, f"adapter {name}", factor=2)
        for i, (g, e) in enumerate(zip(grads, expected, strict=True)):
            close(g, e, dtype, f"adapter {name} grad {i}", factor=5)


def test_adapter_fast_paths_without_grad_on_gpu1():
    """The no-grad Cython paths (elementwise, small float32 linear_gelu, the source network's
    module call) launch on GPU 1 from raw pointers while GPU 0 is current."""
    x = rand((32, 768), F32)
    w, b = rand((3072, 768), F32, 768 ** -0.5), rand((3072,), F32)
    poison_gpu1(32 * 3072 * 4)
    with torch.no_grad():
        close(ta.linear_gelu(x, w, b), F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh"),
              F32, "linear_gelu small f32 (3xTF32)")
        close(ta.relu_scale(x, 2.0), F.relu(x.double()) * 2.0, F32, "relu_scale")
        net = _source_network()
        module = ta.FusedMLP.from_sequential(net)
        xs = rand((32, 100), F32)
        close(module(xs), net.double()(xs.double()), F32, "FusedMLP source network")


def test_adapter_fused_mlp_trains_on_gpu1():
    weights = [t.requires_grad_() for t in _tcnn_weights(BF16)]
    x, dy = rand((2048, 32), BF16), rand((2048, 16), BF16)
    out = ta.fused_mlp(x, weights, None, "relu", "none")
    grads = torch.autograd.grad(out, weights, dy)
    ry, expected = grads64(lambda *ws: _mlp64(x.double(), ws, None, F.relu), weights, dy)
    theirs = same_dtype_grads(lambda *ws: _mlp64(x, ws, None, F.relu), weights, dy)
    close(out, ry, BF16, "fused_mlp bf16 y", factor=2)
    for i, (g, e, t) in enumerate(zip(grads, expected, theirs, strict=True)):
        close_like_torch(g, e, t, BF16, f"fused_mlp bf16 dW{i}")


def test_adapter_launches_on_gpu1s_current_torch_stream():
    """torch keeps a current stream per GPU: GPU 1's is used for tensors on GPU 1 while GPU 0
    is current (each input is NaN until `side` has run: a launch elsewhere reads NaN)."""
    side = torch.cuda.Stream(device=DATA)
    source = rand((32, 768), F32)
    w, b = rand((3072, 768), F32, 768 ** -0.5), rand((3072,), F32)
    mlp = [t for t in _tcnn_weights(F16)]
    xs = rand((256, 32), F16)
    late, late_mlp = written_late(source, side), written_late(xs, side)
    torch.cuda.set_stream(side)  # GPU 1's current stream (set_stream switches to the stream's GPU)
    torch.cuda.set_device(CURRENT)
    try:
        with torch.no_grad():
            y = ta.gelu(late, "tanh")
            z = ta.linear_gelu(late, w, b, approximate="tanh")
            m = ta.matmul(late, w.t().contiguous())
            f = ta.fused_mlp(late_mlp, mlp, None)
    finally:
        with torch.cuda.device(DATA):
            torch.cuda.set_stream(torch.cuda.default_stream(DATA))
    side.synchronize()
    close(y, F.gelu(source.double(), approximate="tanh"), F32, "gelu on GPU 1's stream")
    close(z, F.gelu(F.linear(source.double(), w.double(), b.double()), approximate="tanh"), F32,
          "linear_gelu on GPU 1's stream")
    close(m, source.double() @ w.double().t(), F32, "matmul on GPU 1's stream")
    close(f, _mlp64(xs.double(), [t.double() for t in mlp], None, F.relu), F16, "fused_mlp on GPU 1's stream",
          factor=10)


@two_gpus
def test_adapter_refuses_tensors_on_two_gpus():
    a1, a0 = rand((8, 64), F32), rand((8, 64), F32, device=GPU0)
    with pytest.raises(ValueError, match=r"cuda:0.*cuda:1|cuda:1.*cuda:0"):
        ta.add(a1, a0)
    with pytest.raises(ValueError, match=r"cuda:0.*cuda:1|cuda:1.*cuda:0"):
        ta.linear_gelu(a1, rand((16, 64), F32, device=GPU0), approximate="tanh")
    with pytest.raises(ValueError, match=r"cuda:0.*cuda:1|cuda:1.*cuda:0"):
        ta.layer_norm(a1, (64,), rand((64,), F32, device=GPU0))
