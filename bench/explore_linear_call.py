"""Where a small linear_gelu call's time goes (32x768->3072, float32 and bfloat16, no grad), and
what the timer itself adds: one event pair around each call, fresh (the benches' timing before
session 11: the event's creation and a current-stream query fall inside the interval) and made
beforehand (timing.event_pairs, the benches' timing since), a loop of 20 calls between one pair,
the host's time per call, and the kernel's time (a CUDA graph of 20 calls), beside torch eager.
Interleaved rounds. (The runs of 02:22-02:32 on 2026-11-24 also had a variant that allocated the
next call's output after the launch: not kept, see bench/NOTES.md.)

    python bench/explore_linear_call.py [--out bench/results]
"""
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import (device_times_us, event_pairs, host_times_us, loop_times_us, start, switched,  # noqa: E402
                    write_results)

F = torch.nn.functional
SHAPES = ((torch.float32, "f32"), (torch.bfloat16, "bf16"))
M, K, N = 32, 768, 3072


def fresh_pair_times_us(fns, reps=20, rounds=5):
    """The benches' timing before session 11: a fresh event pair around each call, recorded
    without a stream (the event's creation and a current-stream query inside the interval)."""
    samples = {name: [] for name in fns}
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for s, e in events:
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            samples[name] += [s.elapsed_time(e) * 1e3 for s, e in events]
    return {name: statistics.median(v) for name, v in samples.items()}


def empty_pair_us(reps=200):
    """An event pair with nothing between: fresh events recorded without a stream, and pairs
    created beforehand recorded on a stream fetched once."""
    stream = torch.cuda.current_stream()
    fresh = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in fresh:
        s.record()
        e.record()
    torch.cuda.synchronize()
    made = event_pairs(reps, stream)
    for s, e in made:
        s.record(stream)
        e.record(stream)
    torch.cuda.synchronize()
    return {"fresh, record()": statistics.median(s.elapsed_time(e) * 1e3 for s, e in fresh),
            "created beforehand, record(stream)": statistics.median(s.elapsed_time(e) * 1e3 for s, e in made)}


EMPTY = r'''
extern "C" __global__ void empty_kernel() {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 1023) smem[0] = 0;  // never true: keeps the dynamic shared memory
}
'''


def launch_shape_rows():
    """Per-call event pair, loop and host time of an empty kernel launched with linear_small_tf32's
    shape (128 blocks of 512 threads) with and without its 80 KB of dynamic shared memory, and with
    128 threads: whether the launch's shape, not its work, adds to a call's time."""
    import cupy

    fn = cupy.RawKernel(EMPTY, "empty_kernel")
    fn.max_dynamic_shared_size_bytes = 81920
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def launcher(threads, shared):
        def launch():
            with stream:
                fn((128,), (threads,), (), shared_mem=shared)
        return launch

    fns = {"128 x 512 threads, 80 KB dynamic shared": launcher(512, 81920),
           "128 x 512 threads, no shared": launcher(512, 0), "128 x 128 threads, no shared": launcher(128, 0)}
    made, loop = device_times_us(fns), loop_times_us(fns)
    host = host_times_us(fns, calls=300, rounds=7)
    rows = [{"launch": label, "pair made beforehand, a call us": made[label], "loop of 20, per call us": loop[label],
             "host per call us": host[label]} for label in fns]
    for row in rows:
        print(row, flush=True)
    return rows


def host_part_rows():
    """Host time of the torch calls _launch.torch_linear makes, one by one, beside the whole call:
    which of them a shorter host path would have to avoid."""
    from rawops import _launch
    from rawops import torch_adapter as ta

    x = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda") * K ** -0.5
    b = torch.randn(N, device="cuda")
    flags = ta._LINEAR_GELU_FLAGS["tanh"]
    raw_stream, current = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
    # Alternatives to what torch_linear reads (session 13): an output from torch.empty_like of a
    # cached 1-element template expanded to the output's shape (empty_like of a tensor that is not
    # dense gives a contiguous one), shape reads other than x.shape, and the launch alone.
    template = x.new_empty(1).expand(M, N)
    made = torch.empty_like(template)
    assert made.shape == (M, N) and made.is_contiguous() and made.data_ptr() != template.data_ptr()
    import cupy

    empty = cupy.RawKernel(EMPTY, "empty_kernel")
    function = empty.kernel.ptr
    side = torch.cuda.Stream()

    def bare_launch(stream_of):
        def launch():
            _launch.launch(function, (128,), 512, 0, stream_of(), (), "", 0)
        return launch
    fns = {"nothing (the loop)": lambda: None, "x.dtype": lambda: x.dtype, "x.get_device()": lambda: x.get_device(),
           "x.is_contiguous()": lambda: x.is_contiguous(), "x.shape": lambda: x.shape,
           "x.data_ptr()": lambda: x.data_ptr(), "x.requires_grad": lambda: x.requires_grad,
           "torch.is_grad_enabled()": torch.is_grad_enabled, "current raw stream": lambda: raw_stream(0),
           "current device": current, "x.new_empty(m, n)": lambda: x.new_empty(M, N),
           "x.new_empty((m, n))": lambda: x.new_empty((M, N)),
           "torch.empty_like(expanded template)": lambda: torch.empty_like(template),
           "x.size()": lambda: x.size(), "x.dim()": lambda: x.dim(), "x.size(1)": lambda: x.size(1),
           "x.stride()": lambda: x.stride(),
           "bare launch, empty kernel (_launch.launch), default stream": bare_launch(lambda: raw_stream(0)),
           "bare launch, empty kernel (_launch.launch), side stream": bare_launch(lambda: side.cuda_stream),
           "torch.empty((m, n), device, dtype)": lambda: torch.empty((M, N), device=x.device, dtype=x.dtype),
           "_launch.torch_linear": lambda: _launch.torch_linear(x, w, b, flags),
           "torch_adapter.linear_gelu": lambda: ta.linear_gelu(x, w, b)}
    with torch.no_grad():
        host = host_times_us(fns, calls=2000, rounds=9)
    rows = [{"part": label, "host us": us} for label, us in host.items()]
    for row in rows:
        print(row, flush=True)
    return rows


def graph_of(fn, calls=20):
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    import importlib

    from rawops import _launch
    mm = importlib.import_module("rawops.matmul")  # rawops.matmul is also the op's name
    from rawops import torch_adapter as ta

    rows = []
    for dtype, name in SHAPES:
        x = torch.randn(M, K, device="cuda").to(dtype)
        w = (torch.randn(N, K, device="cuda") * K ** -0.5).to(dtype)
        b = torch.randn(N, device="cuda").to(dtype)

        def call():
            return ta.linear_gelu(x, w, b)

        def eager():
            return F.gelu(F.linear(x, w, b), approximate="tanh")

        def new_empty():
            return x.new_empty(M, N)

        flags = ta._LINEAR_GELU_FLAGS["tanh"]

        def direct():
            return _launch.torch_linear(x, w, b, flags)

        fns = {"rawops": call, "torch eager": eager}
        if dtype == torch.float32:
            fns["exact FFMA kernel (LINEAR_TF32 off)"] = switched(mm, "LINEAR_TF32", False, call)
        with torch.no_grad():
            fresh = fresh_pair_times_us(fns)
            made = device_times_us(fns)
            loop = loop_times_us(fns)
            extra = {"x.new_empty alone": new_empty, "_launch.torch_linear direct (no Python wrapper)": direct}
            host = host_times_us({**fns, **extra}, calls=300, rounds=7)
            graphs = {label: graph_of(fn) for label, fn in fns.items()}
            kernel = device_times_us(graphs, reps=10)
        for label in fns:
            rows.append({"dtype": name, "call": label, "fresh event pair a call us": fresh[label],
                         "pair made beforehand, a call us": made[label], "loop of 20, per call us": loop[label],
                         "host per call us": host[label],
                         "graph of 20, per call us": kernel[label] / 20})
            print(rows[-1], flush=True)
        for label in extra:
            rows.append({"dtype": name, "call": label, "fresh event pair a call us": float("nan"),
                         "pair made beforehand, a call us": float("nan"), "loop of 20, per call us": float("nan"),
                         "host per call us": host[label], "graph of 20, per call us": float("nan")})
    empty = empty_pair_us()
    print(empty, flush=True)
    latency = launch_shape_rows()
    parts = host_part_rows()
    write_results(out_dir, "explore_linear_call", "python bench/explore_linear_call.py", [
        (f"linear_gelu {M}x{K}->{N}, no grad: where a call's time goes",
         ["dtype", "call", "fresh event pair a call us", "pair made beforehand, a call us", "loop of 20, per call us",
          "host per call us", "graph of 20, per call us"], rows,
         {f"empty event pair, {k}": f"{v:.2f} us" for k, v in empty.items()}),
        ("An empty kernel's call by its launch shape (CuPy launch on torch's stream; host and GPU)",
         list(latency[0]), latency, {"note": "the same host path for each: differences are the launch's own"}),
        ("The host's parts of a float32 call (each a Python call in a loop, the loop's own cost included)",
         list(parts[0]), parts, {"note": "_launch.torch_linear reads each accessor once, from Cython"})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
