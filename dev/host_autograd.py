"""Host time of an adapter op's forward + backward through autograd, in pieces (issue 26 item 3): each
measured with the GPU kept busy (torch.cuda._sleep queued ahead) so no call waits for the device;
a host time longer than the kernels' device time is what makes a call alone host-bound.

    python dev/host_autograd.py
"""
import os
import statistics
import sys
import time

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch  # noqa: E402

import bench_autograd as ba  # noqa: E402
from rawops import torch_adapter as ta  # noqa: E402


def host_us(fn, reps=100):
    """Median host time of fn() with the GPU busy (a long sleep kernel ahead of it)."""
    out = []
    for i in range(reps):
        if i % 10 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)  # ~25 ms of GPU work ahead of the next 10 calls
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


class Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, dy):
        return dy.new_empty(dy.shape), None


def main():
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    xd = x.detach()
    y = ta.rms_norm(x, (4096,), w, 1e-6)
    from rawops.torch_adapter import norm as tn
    _, _, rstd = tn.forward("rms_norm", xd, w.detach(), None, 1e-6)

    def clear():
        x.grad = w.grad = None

    cases = {
        "no-op Function fwd+bwd (engine floor)": lambda: (clear(), torch.autograd.backward(Noop.apply(x, w), dy)),
        "torch F.rms_norm fwd+bwd": lambda: (clear(), torch.autograd.backward(
            torch.nn.functional.rms_norm(x, (4096,), w, 1e-6), dy)),
        "ta.rms_norm fwd+bwd": lambda: (clear(), torch.autograd.backward(ta.rms_norm(x, (4096,), w, 1e-6), dy)),
        "ta.rms_norm fwd (grad on)": lambda: ta.rms_norm(x, (4096,), w, 1e-6),
        "norm.forward (no autograd)": lambda: tn.forward("rms_norm", xd, w.detach(), None, 1e-6),
        "norm.backward (no autograd)": lambda: tn.backward("rms_norm", dy, xd, w.detach(), rstd, rstd, True, False),
        "ta.gelu fwd+bwd": lambda: (clear(), torch.autograd.backward(ta.gelu(x, approximate="tanh"), dy)),
        "ta.bias_gelu fwd+bwd": lambda: (clear(), torch.autograd.backward(ta.bias_gelu(x, w, approximate="tanh"), dy)),
        "torch.empty x3": lambda: (torch.empty(16), torch.empty(16, device="cuda"), x.new_empty(x.shape)),
    }
    del y
    for name, fn in cases.items():
        for _ in range(5):
            fn()
        print(f"{name:50s} host {host_us(fn):8.1f} us", flush=True)
    flush = ba.flusher()
    for op, dtype, shape, ours, theirs, make in ba.cases(ta):
        if dtype != "bf16" or op in ("linear_gelu", "fused_mlp"):
            continue
        leaves = make()
        out = ours(*leaves)
        grad = torch.randn_like(out)
        del out

        def step(fn=ours, leaves=leaves, grad=grad):
            for t in leaves:
                t.grad = None
            torch.autograd.backward(fn(*leaves), grad)
        print(f"{op} {dtype}: call {ba.call_us(step, leaves, flush):.1f} us, kernels {ba.kernels_us(step, leaves):.1f},"
              f" host {host_us(step):.1f}", flush=True)


if __name__ == "__main__" and not os.environ.get("TIMELINE"):
    main()


def timeline(reps=200):
    """Where ta.rms_norm's forward + backward spends its host time: perf_counter stamps at the entry and
    exit of the autograd Function's forward and backward (GPU kept busy), medians in us from the step's
    start."""
    from rawops.torch_adapter import norm as tn
    stamps = {}

    def wrap(cls, name):
        original = getattr(cls, name)

        def timed(*args):
            stamps[name + " in"] = time.perf_counter()
            out = original(*args)
            stamps[name + " out"] = time.perf_counter()
            return out
        setattr(cls, name, staticmethod(timed))
    wrap(tn._Norm, "forward")
    wrap(tn._Norm, "backward")
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    rows = []
    for i in range(reps):
        if i % 10 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)
        x.grad = w.grad = None
        t0 = time.perf_counter()
        y = ta.rms_norm(x, (4096,), w, 1e-6)
        stamps["apply returned"] = time.perf_counter()
        torch.autograd.backward(y, dy)
        stamps["backward returned"] = time.perf_counter()
        rows.append({k: (v - t0) * 1e6 for k, v in stamps.items()})
    torch.cuda.synchronize()
    for key in ("forward in", "forward out", "apply returned", "backward in", "backward out", "backward returned"):
        print(f"  rms_norm bf16 {key:18s} {statistics.median(r[key] for r in rows[10:]):8.1f} us", flush=True)


if __name__ == "__main__" and os.environ.get("TIMELINE"):
    timeline()
