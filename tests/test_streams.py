"""The CuPy API's streams. With `stream=`, what a call allocates (outputs, scratch) comes from
CuPy's pool on the given stream, so that it is ordered with the launches that write it: a block
the pool hands out on the *current* stream is only ordered with that stream's work. Calls
captured on a CuPy stream replay on new inputs, and the scratch a captured call uses is never
handed to a later array while its graph may replay."""

import cupy
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rawops  # noqa: E402
from gpu_reference import assert_close, random, to_cupy, to_torch  # noqa: E402
from rawops import _modules, elementwise  # noqa: E402
from rawops._launch import sm_count  # noqa: E402
from rawops._modules import compute_capability  # noqa: E402

import rawops.gemm as matmul_module  # noqa: E402

pytestmark = pytest.mark.gpu

ROWS, COLS = 1031, 1024  # an odd row count: pool block sizes the other tests' arrays do not have
SIZES = [(128, 100), (64, 128), (10, 64)]  # the source network



def _threads_per_sm(device):
    return _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM)

def _blocks_still_in_use(nbytes):
    """Free blocks of these sizes into the pool of the current (legacy) stream while that stream
    will still write NaN into them, 50 ms from now: whatever a kernel on another stream writes
    into them at once is overwritten later."""
    blocks = [cupy.empty(n, dtype=cupy.uint8) for n in nbytes]
    torch.cuda._sleep(50_000_000)  # torch's default stream is the legacy stream, CuPy's null
    for block in blocks:
        block.fill(0xFF)  # queued behind the sleep
    del blocks, block


def _case(name):
    """(call(stream) -> results, float64 expectations, bytes of what the call allocates)."""
    x, dy = random((ROWS, COLS), torch.float32), random((ROWS, COLS), torch.float32)
    bias, w, b = random((COLS,), torch.float32), random((COLS,), torch.float32), random((COLS,), torch.float32)
    x64, dy64 = x.double(), dy.double()
    X, DY, BIAS, W, B = (to_cupy(t) for t in (x, dy, bias, w, b))
    f32 = 4
    if name == "gelu":
        return lambda s: [rawops.gelu(X, stream=s)], [F.gelu(x64, approximate="tanh")], [x.nbytes]
    if name == "bias_gelu_backward":
        pre = (x64 + bias.double()).requires_grad_()
        dx64, = torch.autograd.grad(F.gelu(pre, approximate="tanh"), pre, dy64)
        chunks = elementwise.bias_gelu_bwd_plan(ROWS, COLS, 0, (X.data.ptr, DY.data.ptr, BIAS.data.ptr),
                                              sm_count(X.device.id), _threads_per_sm(X.device.id))[1]
        return (lambda s: rawops.bias_gelu_backward(DY, X, BIAS, stream=s, approximate="tanh"), [dx64, dx64.sum(0)],
                [x.nbytes, COLS * f32, chunks * COLS * f32])
    if name == "column_sum":
        chunks = elementwise.column_sum_plan(ROWS, COLS, _modules.device_threads(X.device.id))[0]
        return lambda s: [rawops.column_sum(X, stream=s)], [x64.sum(0)], [COLS * f32, chunks * COLS * f32]
    if name == "layer_norm":
        return (lambda s: [rawops.layer_norm(X, W, B, stream=s)],
                [F.layer_norm(x64, (COLS,), w.double(), b.double())], [x.nbytes])
    if name == "softmax":
        return lambda s: [rawops.softmax(X, stream=s)], [torch.softmax(x64, -1)], [x.nbytes]
    weights = [random(shape, torch.float32, shape[1] ** -0.5) for shape in SIZES]
    biases = [random(shape[:1], torch.float32) for shape in SIZES]
    xm = random((ROWS, 100), torch.float32)
    Xm, Ws, Bs = to_cupy(xm), [to_cupy(t) for t in weights], [to_cupy(t) for t in biases]
    if name == "matmul":
        Wt = to_cupy(weights[0].t().contiguous())
        return lambda s: [rawops.matmul(Xm, Wt, stream=s)], [xm.double() @ weights[0].double().t()], [ROWS * 128 * f32]
    if name == "fused_mlp":
        h = xm.double()
        for i, (wi, bi) in enumerate(zip(weights, biases)):
            h = F.linear(h, wi.double(), bi.double())
            h = F.relu(h) if i < len(SIZES) - 1 else h
        return lambda s: [rawops.fused_mlp(Xm, Ws, Bs, stream=s)], [h], [ROWS * 10 * f32]
    raise KeyError(name)


@pytest.mark.parametrize("name", ["gelu", "bias_gelu_backward", "column_sum", "layer_norm", "softmax", "matmul",
                                  "fused_mlp"])
def test_a_given_stream_allocates_from_its_own_pool_blocks(name):
    call, expected, nbytes = _case(name)
    side = cupy.cuda.Stream(non_blocking=True)  # not ordered with the legacy stream
    # Warm up: a module's first load (the op's, CuPy's fill) synchronizes the device, which would
    # let the legacy stream finish before the call launches and hide any sharing.
    call(side)
    cupy.empty(8, dtype=cupy.uint8).fill(0xFF)
    torch.cuda.synchronize()  # the inputs are ready; nothing but the poisoning runs on the legacy stream now
    _blocks_still_in_use(nbytes)
    results = call(side)
    cupy.cuda.Device().synchronize()  # both streams done: a block the two shared now holds NaN
    for i, (got, want) in enumerate(zip(results, expected, strict=True)):
        assert_close(to_torch(got), want, torch.float32, f"{name} output {i}", factor=20)


def _graph_case(name):
    """(call() -> results on CuPy's current stream, torch inputs, reference(inputs) -> float64 results)."""
    if name in ("gelu", "layer_norm", "softmax", "bias_gelu_backward"):
        x, dy = random((ROWS, COLS), torch.float32), random((ROWS, COLS), torch.float32)
        bias = random((COLS,), torch.float32)
        X, DY, BIAS = to_cupy(x), to_cupy(dy), to_cupy(bias)
        if name == "gelu":
            return lambda: [rawops.gelu(X)], [x], lambda: [F.gelu(x.double(), approximate="tanh")]
        if name == "layer_norm":
            return lambda: [rawops.layer_norm(X)], [x], lambda: [F.layer_norm(x.double(), (COLS,))]
        if name == "softmax":
            return lambda: [rawops.softmax(X)], [x], lambda: [torch.softmax(x.double(), -1)]

        def bias_gelu_grads():
            pre = (x.double() + bias.double()).requires_grad_()
            dx, = torch.autograd.grad(F.gelu(pre, approximate="tanh"), pre, dy.double())
            return [dx, dx.sum(0)]
        return lambda: list(rawops.bias_gelu_backward(DY, X, BIAS, approximate="tanh")), [x, dy, bias], bias_gelu_grads
    if name == "matmul split-K":  # 64 x 64 x 8192: split along K, partials in scratch, then gemm_reduce
        a, b = random((64, 8192), torch.float32), random((8192, 64), torch.float32)
        A, B = to_cupy(a), to_cupy(b)
        return lambda: [rawops.matmul(A, B)], [a, b], lambda: [a.double() @ b.double()]
    if name == "linear_gelu f32 32x768->3072":
        x, w, bias = random((32, 768), torch.float32), random((3072, 768), torch.float32, 768 ** -0.5), \
            random((3072,), torch.float32)
        X, W, BIAS = to_cupy(x), to_cupy(w), to_cupy(bias)
        return (lambda: [rawops.linear_gelu(X, W, BIAS, approximate="tanh")], [x, w, bias],
                lambda: [F.gelu(F.linear(x.double(), w.double(), bias.double()), approximate="tanh")])
    if name == "fused_mlp":
        weights = [random(shape, torch.float32, shape[1] ** -0.5) for shape in SIZES]
        biases = [random(shape[:1], torch.float32) for shape in SIZES]
        xm = random((ROWS, 100), torch.float32)
        Xm, Ws, Bs = to_cupy(xm), [to_cupy(t) for t in weights], [to_cupy(t) for t in biases]

        def mlp64():
            h = xm.double()
            for i, (wi, bi) in enumerate(zip(weights, biases)):
                h = F.linear(h, wi.double(), bi.double())
                h = F.relu(h) if i < len(SIZES) - 1 else h
            return [h]
        return lambda: [rawops.fused_mlp(Xm, Ws, Bs)], [xm, *weights, *biases], mlp64
    raise KeyError(name)


@pytest.mark.parametrize("name", ["gelu", "bias_gelu_backward", "layer_norm", "softmax", "matmul split-K",
                                  "linear_gelu f32 32x768->3072", "fused_mlp"])
def test_a_cupy_stream_capture_replays_on_new_inputs(name):
    """DESIGN: capture into a CUDA graph works. Captured on a CuPy stream (the CuPy API's way), then
    replayed twice after the inputs were overwritten in place: the graph must read them anew."""
    call, inputs, reference = _graph_case(name)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        call()  # warm-up on this stream: module loads, and pool blocks for the capture's allocations
        stream.synchronize()
        stream.begin_capture()
        results = call()
        graph = stream.end_capture()
    for trial in range(2):
        with torch.no_grad():
            for t in inputs:
                t.copy_(random(t.shape, t.dtype))
        torch.cuda.synchronize()
        graph.launch(stream)
        stream.synchronize()
        for i, (got, want) in enumerate(zip(results, reference(), strict=True)):
            assert_close(to_torch(got), want, torch.float32, f"{name} replay {trial}, output {i}", factor=20)
    rawops.release_captured_scratch()  # the graph is done with


def _scratch_case(name):
    """(call() -> results, reference() -> float64 results, bytes of the call's scratch)."""
    if name == "bias_gelu_backward":
        x, dy, bias = random((ROWS, COLS), torch.float32), random((ROWS, COLS), torch.float32), \
            random((COLS,), torch.float32)
        X, DY, BIAS = to_cupy(x), to_cupy(dy), to_cupy(bias)
        chunks = elementwise.bias_gelu_bwd_plan(ROWS, COLS, 0, (X.data.ptr, DY.data.ptr, BIAS.data.ptr),
                                                sm_count(X.device.id), _threads_per_sm(X.device.id))[1]

        def grads():
            pre = (x.double() + bias.double()).requires_grad_()
            dx, = torch.autograd.grad(F.gelu(pre, approximate="tanh"), pre, dy.double())
            return [dx, dx.sum(0)]
        return lambda: list(rawops.bias_gelu_backward(DY, X, BIAS, approximate="tanh")), grads, chunks * COLS * 4
    a, b = random((64, 8192), torch.float32), random((8192, 64), torch.float32)
    A, B = to_cupy(a), to_cupy(b)
    device = A.device.id
    splits = matmul_module.plan("nn", 0, 64, 64, 8192, compute_capability(device), A.data.ptr, B.data.ptr,
                                sm_count(device))[4]
    assert splits > 1, "this shape is meant to split K"
    return lambda: [rawops.matmul(A, B)], lambda: [a.double() @ b.double()], splits * 64 * 64 * 4


@pytest.mark.parametrize("name", ["bias_gelu_backward", "matmul split-K"])
def test_a_captured_calls_scratch_is_not_handed_to_later_arrays(name):
    """The partial sums a captured call wrote are rewritten by every replay: arrays allocated after
    the capture, on the same stream, must not get their blocks (rawops holds them)."""
    call, reference, nbytes = _scratch_case(name)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        call()  # warm-up: module loads are not allowed while capturing
        stream.synchronize()
        stream.begin_capture()
        results = call()
        graph = stream.end_capture()
        later = [cupy.full(nbytes // 4, 7.0, dtype=cupy.float32) for _ in range(4)]  # the pool's free blocks
    try:
        graph.launch(stream)
        stream.synchronize()
        for i, (got, want) in enumerate(zip(results, reference(), strict=True)):
            assert_close(to_torch(got), want, torch.float32, f"{name} replay, output {i}", factor=20)
        assert all(bool((a == 7.0).all()) for a in later), "a replay wrote into an array allocated after the capture"
    finally:
        assert rawops.release_captured_scratch() > 0, "the captured call's scratch was not held"
    assert rawops.release_captured_scratch() == 0
