"""Benchmark of the MLP family against torch, in one run on one GPU: the source network
100-128-64-10 (ReLU), float32 forward, at batch 32 and 2^20.

torch as eager nn.Sequential and as a CUDA-graph replay of it (the issue's numbers, H100:
118 us eager and 52 us graphed at batch 32, 1.96 ms eager at 2^20; targets: >= 5x eager at
32, >= 2x eager at 2^20). rawops through torch_adapter.seed_mlp (one launch, raw pointers).
CUDA events, median of 50 after warm-up. FLOPs: 42,752 per sample; bytes: x read and y
written (440 B per sample; the 87 KB of weights are in L2).

    python bench/bench_mlp.py [--out bench/results]
"""
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, start, write_results  # noqa: E402

BATCHES = (32, 1 << 20)
FLOPS_PER_SAMPLE = 2 * (100 * 128 + 128 * 64 + 64 * 10)
BYTES_PER_SAMPLE = 4 * (100 + 10)
TARGET_X_EAGER = {32: 5.0, 1 << 20: 2.0}
FP32_PEAK_TFLOPS = 66.9  # H100 SXM: 132 SMs x 128 FFMA lanes x 2 x 1.98 GHz


def _graphed(fn):
    """fn captured once in a CUDA graph; the returned callable replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def device_rows(ta, ceiling):
    net = torch.nn.Sequential(torch.nn.Linear(100, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10)).cuda()
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    weights = [m.weight.detach() for m in linears]
    biases = [m.bias.detach() for m in linears]
    reference = copy.deepcopy(net).double()
    rows = []
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, 100, device="cuda")
            ref = reference(x.double())
            error = (ta.seed_mlp(x, weights, biases).double() - ref).norm() / ref.norm()
            us_ours = device_time_us(lambda: ta.seed_mlp(x, weights, biases))
            us_eager = device_time_us(lambda: net(x))
            us_graph = device_time_us(_graphed(lambda: net(x)))
            tflops = FLOPS_PER_SAMPLE * batch / us_ours / 1e6
            compute_floor_us = FLOPS_PER_SAMPLE * batch / FP32_PEAK_TFLOPS / 1e6
            memory_floor_us = BYTES_PER_SAMPLE * batch / ceiling / 1e6
            speedup = us_eager / us_ours
            rows.append({"batch": batch, "rawops us": us_ours, "torch eager us": us_eager,
                         "torch graph us": us_graph, "x eager": speedup, "x graph": us_graph / us_ours,
                         "rawops TFLOP/s": tflops, "FFMA floor us": compute_floor_us,
                         "memory floor us": memory_floor_us, "rel error vs f64": error.item(),
                         "meets target": speedup >= TARGET_X_EAGER[batch]})
            print(f"batch {batch:8d}: rawops {us_ours:9.1f} us ({tflops:5.1f} TFLOP/s) | eager {us_eager:9.1f} us | "
                  f"graph {us_graph:9.1f} us | {speedup:4.2f}x eager | rel error {error.item():.2g}", flush=True)
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import torch_adapter as ta

    rows = device_rows(ta, ceiling)
    header = ["batch", "rawops us", "torch eager us", "torch graph us", "x eager", "x graph", "rawops TFLOP/s",
              "FFMA floor us", "memory floor us", "rel error vs f64", "meets target"]
    text = write_results(out_dir, "mlp", "python bench/bench_mlp.py", [
        ("Source network 100-128-64-10, float32 forward", header, rows,
         {"copy ceiling TB/s": round(ceiling, 3),
          "targets": ">= 5x torch eager at batch 32, >= 2x at 2^20",
          "floors": f"FFMA peak {FP32_PEAK_TFLOPS} TFLOP/s (42,752 FLOPs per sample); memory 440 B per sample at "
                    "the copy ceiling"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
