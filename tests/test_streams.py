"""`stream=` in the CuPy API: what a call allocates (outputs, scratch) comes from CuPy's pool
on the given stream, so that it is ordered with the launches that write it. A block the pool
hands out on the *current* stream is only ordered with that stream's work: a kernel on another
stream could write it while the current stream's last user of the block still runs."""
import cupy
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rawops  # noqa: E402
from gpu_reference import assert_close, random, to_cupy, to_torch  # noqa: E402
from rawops import elementwise  # noqa: E402
from rawops._launch import sm_count  # noqa: E402

pytestmark = pytest.mark.gpu

ROWS, COLS = 1031, 1024  # an odd row count: pool block sizes the other tests' arrays do not have
SIZES = [(128, 100), (64, 128), (10, 64)]  # the source network


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
                                              sm_count(X.device.id))[1]
        return (lambda s: rawops.bias_gelu_backward(DY, X, BIAS, stream=s), [dx64, dx64.sum(0)],
                [x.nbytes, COLS * f32, chunks * COLS * f32])
    if name == "column_sum":
        chunks = elementwise.column_sum_plan(ROWS, COLS, sm_count(X.device.id))[0]
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
