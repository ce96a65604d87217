"""16-bit linear_gelu between the small batch and the full GPU (32 to 2048 rows): which of the
library's kernels wins at each row count, against torch (F.linear + gelu and the cuBLASLt
epilogue). Every route is the library's own call (rawops.linear_gelu on CuPy views of torch's memory, out= and
torch's stream) with the planner's thresholds switched while the CUDA graph of 20 calls is
captured; each route's output is checked against float64.

    python bench/explore_medium_batch.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = [32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048]
SHAPES = [(m, 768, 3072, torch.bfloat16) for m in ROWS] + [(m, 4096, 4096, torch.bfloat16) for m in (64, 128, 256, 512)]
SHAPES += [(m, 768, 3072, torch.float16) for m in (128, 256)]


def routes():
    """route label -> {(module, attribute): value} set while the route's graph is captured."""
    import importlib
    mm = importlib.import_module("rawops.matmul")  # the module: rawops.matmul is the function
    sm90 = importlib.import_module("rawops._gemm_sm90")
    return {"library (planner)": {},
            "Hopper GEMM off (the portable kernels' plan)": {(sm90, "_built"): {0: False}},
            "linear_small_mma at any rows (Hopper off)": {(sm90, "_built"): {0: False}, (mm, "SMALL_MAX_M"): 1 << 40}}


def captured_with(settings, fn):
    """fn's CUDA graph of 20 calls captured with the planner switched to `settings` (the plan
    cache emptied before and after, so neither the route nor the default leaks). Warm-up and
    capture share one stream: the split-K routes take scratch from CuPy's pool, which hands
    blocks freed on a stream back to that stream without a cudaMalloc (not allowed in capture),
    so the pool first gets enough free blocks on it for the 20 captured calls' scratch."""
    import importlib

    import cupy
    mm = importlib.import_module("rawops.matmul")
    saved = {key: getattr(*key) for key in settings}
    for (module, name), value in settings.items():
        setattr(module, name, value)
    mm._plans.clear()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(21):
                fn()
        with cupy.cuda.ExternalStream(stream.cuda_stream):
            held = [cupy.cuda.alloc(64 << 20) for _ in range(24)]
        del held
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(20):
                fn()
        return graph.replay
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
        mm._plans.clear()


def main():
    sys.path.insert(0, HERE)
    from timing import device_time_us, graph_per_call_us, start, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    import cupy

    import rawops

    rows = []
    for m, k, n, dtype in SHAPES:
        suffix = "bf16" if dtype is torch.bfloat16 else "f16"
        shape = f"{m}x{k}->{n} {suffix}"
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), w.double(), bias.double()),
                                       approximate="tanh")
        y = torch.empty(m, n, device="cuda", dtype=dtype)

        # CuPy views of torch's memory (torch's __cuda_array_interface__ has no bfloat16)
        X, W, B, Y = (cupy.from_dlpack(t) for t in (x, w, bias, y))
        torch.cuda.synchronize()

        def library():
            return rawops.linear_gelu(X, W, B, out=Y, stream=torch.cuda.current_stream().cuda_stream)

        for label, settings in routes().items():
            y.fill_(float("nan"))
            replay = captured_with(settings, library)
            torch.cuda.synchronize()
            err = ((y.double() - ref).norm() / ref.norm()).item()
            us = device_time_us(replay) / 20
            rows.append({"shape": shape, "route": label, "graph us a call": us, "rel err": f"{err:.1e}"})
            print(f"{shape:22s} {label:36s} {us:8.2f} us  err {err:.1e}", flush=True)
        for label, fn in {"torch F.linear + F.gelu": lambda: torch.nn.functional.gelu(
                              torch.nn.functional.linear(x, w, bias), approximate="tanh"),
                          "torch cuBLASLt epilogue": lambda: torch._addmm_activation(bias, x, w.t(), use_gelu=True)
                          }.items():
            us = graph_per_call_us(fn)
            rows.append({"shape": shape, "route": label, "graph us a call": us, "rel err": ""})
            print(f"{shape:22s} {label:36s} {us:8.2f} us", flush=True)
    write_results(out_dir, "explore_medium_batch", "python bench/explore_medium_batch.py", [
        ("16-bit linear_gelu forward by row count: the library's routes against torch (CUDA graph of 20 calls, "
         "per call)", ["shape", "route", "graph us a call", "rel err"], rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
