"""Where a small call's time goes, on the GPU machine it runs on: host time per call of the
torch adapter's paths and their parts (interleaved rounds), and for the source network at
batch 32 the event-timed call, its CUDA-graph replay and the kernel alone (torch.profiler).
Torch's own op is timed in the same rounds.

    python bench/explore_host.py [--out DIR]   # writes DIR/explore_host.md
"""
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, graphed, host_times_us, start  # noqa: E402


def kernel_us(fn, name_part, calls=50):
    """Median device duration of the kernels whose name contains name_part (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events() if name_part in e.name and e.device_time > 0]
    return statistics.median(times) if times else float("nan")


def elementwise_host(ta, lines):
    from rawops import elementwise

    t = torch.randn(1024, device="cuda")
    kernel = elementwise.MAP["gelu_tanh_fwd"]
    measured = host_times_us({
        "torch F.gelu(t)": lambda: F.gelu(t, approximate="tanh"),
        "ta.gelu(t) (C entry)": lambda: ta.gelu(t, "tanh"),
        "ta._gelu_python(t) (the Python wrapper it replaced)": lambda: ta._gelu_python(t, "tanh"),
        "MapKernel.torch_call(t)": lambda: kernel.torch_call(t),
        "torch F.relu(t)": lambda: F.relu(t),
        "ta.relu(t) (C entry)": lambda: ta.relu(t),
        "  part: torch.empty_like(t)": lambda: torch.empty_like(t),
        "  part: t.new_empty(1024)": lambda: t.new_empty(1024),
        "  part: torch.compiler.is_compiling()": torch.compiler.is_compiling,
    })
    lines += ["", "## Host time per call, 1K float32 elements (interleaved rounds)", "",
              "| call | host us |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in measured.items()]


def cupy_host(lines):
    """The CuPy API's call (rawops.gelu: a C-level entry since session 18) beside the Python
    wrapper it replaced, the kernel's call alone and a bare cupy.RawKernel launch, and the
    CuPy pieces every call pays."""
    import cupy
    import numpy

    import rawops
    from rawops import _modules, elementwise

    n = 1024
    c = cupy.random.standard_normal(n, dtype=cupy.float32)
    c_out = cupy.empty_like(c)
    bare = _modules.get_function("elementwise", "gelu_tanh_fwd_f32", 0)
    args = (c, 0, 0, c_out, numpy.int64(n), numpy.int64(0), numpy.int64(1), numpy.float32(0))
    kernel = elementwise.MAP["gelu_tanh_fwd"]
    f32 = numpy.dtype(numpy.float32)
    measured = host_times_us({
        "bare cupy.RawKernel launch (out preallocated)": lambda: bare((1,), (256,), args),
        "rawops.gelu(c) (C entry)": lambda: rawops.gelu(c),
        "elementwise._gelu_python(c) (the Python wrapper it replaced)": lambda: elementwise._gelu_python(c),
        "MapKernel.__call__(c)": lambda: kernel(c),
        "rawops.gelu(c, out=c_out) (C entry)": lambda: rawops.gelu(c, out=c_out),
        "rawops.relu(c) (C entry)": lambda: rawops.relu(c),
        "  part: cupy.ndarray((n,), numpy dtype)": lambda: cupy.ndarray((n,), f32),
        "  part: cupy.empty((n,), numpy dtype)": lambda: cupy.empty((n,), f32),
        "  part: cupy.cuda.get_current_stream(0).ptr": lambda: cupy.cuda.get_current_stream(0).ptr,
        "  part: cupy.cuda.runtime.getDevice()": cupy.cuda.runtime.getDevice,
    })
    lines += ["", "## CuPy API, host time per call, 1K float32 elements (interleaved rounds)", "",
              "| call | host us |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in measured.items()]


def seed_batch32(ta, lines):
    from rawops._launch import torch_seed_forward

    from bench_mlp import sequential

    net = sequential((100, 128, 64, 10), torch.float32)
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(32, 100, device="cuda")
    with torch.no_grad():
        ref = copy.deepcopy(net).double()(x.double())
        err = ((fused(x).double() - ref).norm() / ref.norm()).item()
    weights = list(fused._modules["weights"]._parameters.values())
    biases = list(fused._modules["biases"]._parameters.values())
    params = [weights[0], biases[0], weights[1], biases[1], weights[2], biases[2]]

    def ours():
        with torch.no_grad():
            fused(x)

    def eager():
        with torch.no_grad():
            net(x)

    torch.set_grad_enabled(False)
    host = host_times_us({
        "torch nn.Sequential(x)": lambda: net(x),
        "FusedMLP(x)": lambda: fused(x),
        "nn.Module.__call__(FusedMLP, x) (the path before the typed call)": lambda: torch.nn.Module.__call__(fused, x),
        "FusedMLP.forward(x) (no Module.__call__)": lambda: fused.forward(x),
        "_launch.torch_seed_forward(x, ...) alone": lambda: torch_seed_forward(x, params, fused._seed_state),
        "  part: x.new_empty(32, 10)": lambda: x.new_empty(32, 10),
        "  part: torch.no_grad() enter+exit": lambda: torch.no_grad().__enter__() or None,
    })
    torch.set_grad_enabled(True)
    rows = {
        "rawops by events (bench_mlp's row)": device_time_us(ours),
        "torch eager by events": device_time_us(eager),
        "rawops graph replay by events": device_time_us(graphed(ours)),
        "rawops kernel alone (torch.profiler)": kernel_us(ours, "seed_mlp"),
    }
    lines += ["", f"## Source network, batch 32, float32 (rel error vs float64 {err:.3g})", "",
              "| what | us |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in rows.items()]
    lines += ["", "host time per call (interleaved rounds, no grad):", "", "| call | host us |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in host.items()]


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import torch_adapter as ta

    lines = [f"- device: {torch.cuda.get_device_name()} (torch {torch.__version__})",
             "- command: python bench/explore_host.py",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"]
    cupy_host(lines)
    elementwise_host(ta, lines)
    seed_batch32(ta, lines)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(out_dir, "explore_host.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
