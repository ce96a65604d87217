"""Benchmark of the mlp family (fused_mlp / FusedMLP) against torch, in one run on one GPU:
  * the source network 100-128-64-10 (ReLU), float32, at batch 32 and 2^20: forward
    (torch eager and a CUDA-graph replay of it) and forward+backward (eager);
  * a tiny-cuda-nn-style network, 64 inputs, 4 hidden layers of 64 (ReLU), 64 outputs,
    float16, at batch 2^20: forward and forward+backward (eager; graph for the forward);
  * the forward across hidden widths 16..128 in both half types (64 in, 4 hidden, 64 out).
rawops through rawops.torch_adapter.FusedMLP built from the same nn.Sequential. Forward+backward:
the weight and bias gradients (x needs none, for both), through torch.autograd.grad. CUDA events,
median of 100 after warm-up, rawops and torch eager timed in 5 interleaved rounds of 20. Beside
the default path, the same call through the library's other paths (rawops.config switches and
the tile kernels' residency limit): the source network's exact FFMA kernels (config.mlp_tf32 =
False; by default it runs 3xTF32 with promoted sums beyond 4096 rows), the WMMA tile kernels
(weights resident or streamed) and the chain + weight-gradient backward.
Bars (docs/performance.md, issue 26): source network >= 5x eager at batch 32 and >= 2x at 2^20
(forward), forward+backward >= 3x at batch 32 and >= 1.5x at 2^20; 64-wide f16 >= 5x eager
forward and >= 3x eager forward+backward. Each forward+backward row also times its limit (bench_autograd's):
rawops' kernels replayed from CUDA graphs in a bare Python autograd.Function; where eager over that
limit is short of the bar too (a host-bound batch), a call within 1.1x of the limit is met at the limit.

    python bench/bench_mlp.py [--out bench/results]
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import compiled, device_time_us, device_times_us, graphed, replayed, start, write_results  # noqa: E402

SOURCE_SIZES = (100, 128, 64, 10)
SOURCE_FLOPS = 2 * (100 * 128 + 128 * 64 + 64 * 10)  # forward, per sample
# backward without dx: g2, g1 (2 x (10x64 + 64x128)) and the three weight gradients
SOURCE_BWD_FLOPS = 2 * (10 * 64 + 64 * 128) + 2 * (100 * 128 + 128 * 64 + 64 * 10)
SOURCE_BYTES = 4 * (100 + 10)
TC_SIZES = (64, 64, 64, 64, 64, 64)
TC_FLOPS = 2 * 5 * 64 * 64
FP32_PEAK_TFLOPS = 66.9  # H100/H200 SXM: 132 SMs x 128 FFMA lanes x 2 x 1.98 GHz
HALF_PEAK_TFLOPS = 989.0  # dense tensor cores, H100/H200 SXM
DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
LIMIT_BAR = 1.1
TARGETS = {("source", 32, "fwd"): 5.0, ("source", 1 << 20, "fwd"): 2.0, ("source", 32, "fwd+bwd"): 3.0,
           ("source", 1 << 20, "fwd+bwd"): 1.5, ("tc", 1 << 20, "fwd"): 5.0, ("tc", 1 << 20, "fwd+bwd"): 3.0}


def plans_module():
    """rawops._mlp_plans, the module of the MLP family's plans (its tunables and plan cache)."""
    return importlib.import_module("rawops._mlp_plans")


def sequential(sizes, dtype):
    """nn.Sequential of Linear layers with ReLU between them, on the GPU in dtype."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda().to(dtype)


def drop_launch_cache(fused):
    """Forget FusedMLP's validated plan and its per-batch launches, so that the next call plans
    again under the current switches (the typed fast path runs before any plan check)."""
    names = [name for name in ("_fast_key", "_source_state") if hasattr(fused, name)]
    if not names:
        raise RuntimeError("FusedMLP's launch caches are not where bench_mlp.drop_launch_cache looks")
    for name in names:
        setattr(fused, name, None)


def with_switch(fused, fn, **switches):
    """fn() under rawops.config.override(**switches), FusedMLP's launch cache dropped on both sides."""
    from rawops import config

    drop_launch_cache(fused)
    try:
        with config.override(**switches):
            return fn()
    finally:
        drop_launch_cache(fused)


def tile_kernels_us(fused, ours):
    """(resident, streaming) times of the WMMA tile kernels on the same call (fast forward off)."""
    plans = plans_module()

    def timed(resident_max):
        saved = plans.RESIDENT_MAX_SMEM
        plans.RESIDENT_MAX_SMEM = resident_max
        plans._plans.clear()
        try:
            return with_switch(fused, lambda: device_time_us(ours), mlp_fast_forward=False)
        finally:
            plans.RESIDENT_MAX_SMEM = saved
            plans._plans.clear()

    return timed(plans.RESIDENT_MAX_SMEM), timed(0)


def _rows(ta, name, sizes, dtype, batch, ceiling, flops_fwd, flops_bwd, bytes_fwd, bytes_fwdbwd, graph):
    net = sequential(sizes, dtype)
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(batch, sizes[0], device="cuda", dtype=dtype)
    dy = torch.randn(batch, sizes[-1], device="cuda", dtype=dtype)
    large_source = name == "source" and batch > 4096  # where the 3xTF32 kernels (config.mlp_tf32) run
    net64 = copy.deepcopy(net).double()
    with torch.no_grad():
        ref = net64(x.double())
        error = ((fused(x).double() - ref).norm() / ref.norm()).item()
        torch_error = ((net(x).double() - ref).norm() / ref.norm()).item()  # torch's own, same data
        ffma_error = float("nan")
        if large_source:
            ffma_out = with_switch(fused, lambda: fused(x), mlp_tf32=False)
            ffma_error = ((ffma_out.double() - ref).norm() / ref.norm()).item()
    # the parameters' gradients (the largest relative-norm error of any), rawops' and torch's own
    grads64 = torch.autograd.grad(net64(x.double()), list(net64.parameters()), dy.double())

    def grad_error(grads):
        return max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(grads, grads64))

    fused_params = [p for pair in zip(fused.weights, fused.biases) for p in pair]  # nn.Sequential's order
    grad_err = grad_error(torch.autograd.grad(fused(x), fused_params, dy))
    torch_grad_err = grad_error(torch.autograd.grad(net(x), list(net.parameters()), dy))
    rows = []
    inductor = compiled(net)
    for mode in ("fwd", "fwd+bwd"):
        if mode == "fwd":
            def ours():
                with torch.no_grad():
                    fused(x)

            def eager():
                with torch.no_grad():
                    net(x)

            def compiled_call():
                with torch.no_grad():
                    inductor(x)
        else:
            fused_params, net_params = list(fused.parameters()), list(net.parameters())

            def ours():
                torch.autograd.grad(fused(x), fused_params, dy)

            def eager():
                torch.autograd.grad(net(x), net_params, dy)

            def compiled_call():
                torch.autograd.grad(inductor(x), net_params, dy)
        candidates = {"ours": ours, "eager": eager}
        if mode == "fwd+bwd":  # the least a Python autograd.Function launching these kernels takes here
            bare = replayed(lambda *params: fused(x), fused_params, dy)
            candidates["limit"] = lambda: torch.autograd.grad(bare(*fused_params), fused_params, dy)
        timed = device_times_us(candidates)
        timed["compile"] = device_time_us(compiled_call)  # apart: interleaved, it slowed the autograd rows
        us_ours, us_eager = timed["ours"], timed["eager"]
        us_graph = device_time_us(graphed(eager)) if graph and mode == "fwd" else float("nan")
        # the library's call replayed from a CUDA graph: the kernel's time without the host's
        us_ours_graph = device_time_us(graphed(ours)) if mode == "fwd" else float("nan")
        us_streaming = us_tile = us_ffma = float("nan")
        if name == "tc" and mode == "fwd":  # the WMMA tile kernels (resident, streaming)
            us_tile, us_streaming = tile_kernels_us(fused, ours)
        if name == "tc" and mode == "fwd+bwd":  # the chain + wgrad tile kernels instead of the fused backward
            us_tile = with_switch(fused, lambda: device_time_us(ours), mlp_fast_backward=False)
        if large_source:  # the exact FFMA kernels instead of the 3xTF32 ones
            us_ffma = with_switch(fused, lambda: device_time_us(ours), mlp_tf32=False)
        flops = (flops_fwd + (flops_bwd if mode == "fwd+bwd" else 0)) * batch
        moved = (bytes_fwd if mode == "fwd" else bytes_fwdbwd) * batch
        speedup = us_eager / us_ours
        us_limit = timed.get("limit", float("nan"))
        target = TARGETS.get((name, batch, mode))
        meets = "-"
        if target:  # a bar past what the limit allows is met at the limit (within LIMIT_BAR of it)
            meets = (True if speedup >= target else "at the limit"
                     if us_eager / us_limit < target and us_ours <= LIMIT_BAR * us_limit else False)
        rows.append({"op": f"fused_mlp {mode}", "dtype": DTYPE_NAMES[dtype],
                     "shape": f"{batch}x{'-'.join(map(str, sizes))}",
                     "rawops us": us_ours, "rawops graph us": us_ours_graph, "rawops FFMA us": us_ffma,
                     "rawops tile us": us_tile, "rawops streaming us": us_streaming,
                     "rawops limit us": us_limit, "limit x torch": us_eager / us_limit,
                     "torch us": us_eager, "torch graph us": us_graph, "torch.compile us": timed["compile"],
                     "x torch": speedup, "x torch graph": us_graph / us_ours, "rawops TFLOP/s": flops / us_ours / 1e6,
                     "compute floor us": flops / (FP32_PEAK_TFLOPS if dtype == torch.float32 else HALF_PEAK_TFLOPS)
                     / 1e6, "memory floor us": moved / ceiling / 1e6, "rel error vs f64": error,
                     "FFMA rel error vs f64": ffma_error, "torch rel error vs f64": torch_error,
                     "grad rel error vs f64": grad_err if mode == "fwd+bwd" else float("nan"),
                     "torch grad rel error vs f64": torch_grad_err if mode == "fwd+bwd" else float("nan"),
                     "target x torch": target if target else "-",
                     "meets target": meets})
        r = rows[-1]
        print(f"{r['shape']:28s} {r['dtype']:4s} {mode:8s}: rawops {us_ours:9.1f} us (graph {us_ours_graph:7.1f}) "
              f"| eager {us_eager:9.1f} us | graph {us_graph:9.1f} us | {speedup:5.2f}x eager | "
              f"{r['rawops TFLOP/s']:6.1f} TFLOP/s | err {error:.2g} (torch {torch_error:.2g})", flush=True)
    return rows


def width_sweep(ta, batch=1 << 20):
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for width in (16, 32, 64, 128):
            sizes = (64,) + (width,) * 4 + (64,)
            net = sequential(sizes, dtype)
            fused = ta.FusedMLP.from_sequential(net)
            x = torch.randn(batch, 64, device="cuda", dtype=dtype)

            def ours():
                with torch.no_grad():
                    fused(x)

            def eager():
                with torch.no_grad():
                    net(x)

            fast = device_time_us(ours)
            tile = tile_kernels_us(fused, ours)[0]
            us_eager = device_time_us(eager)
            rows.append({"op": "fused_mlp fwd (widths)", "dtype": DTYPE_NAMES[dtype],
                         "shape": f"{batch}x{'-'.join(map(str, sizes))}", "rawops us": fast, "rawops tile us": tile,
                         "torch us": us_eager, "x torch": us_eager / fast, "x tile": tile / fast,
                         "rawops TB/s (x+y)": batch * 2 * 128 / fast / 1e6})
            print(f"{rows[-1]['shape']:28s} {DTYPE_NAMES[dtype]:4s} fast {fast:8.1f} us | tile {tile:8.1f} us | "
                  f"eager {us_eager:8.1f} us | {us_eager / fast:5.2f}x eager", flush=True)
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import torch_adapter as ta

    rows = []
    for batch in (32, 1 << 20):
        # forward+backward bytes: x, y, dy and the two kept activations written and read back
        rows += _rows(ta, "source", SOURCE_SIZES, torch.float32, batch, ceiling, SOURCE_FLOPS, SOURCE_BWD_FLOPS,
                      SOURCE_BYTES, 4 * (100 + 10 + 10 + 2 * 192 + 100), True)
    rows += _rows(ta, "tc", TC_SIZES, torch.float16, 1 << 20, ceiling, TC_FLOPS, 2 * TC_FLOPS - 2 * 64 * 64,
                  2 * (64 + 64), 2 * (64 + 64 + 64 + 64), True)
    sweep = width_sweep(ta)
    header = ["op", "dtype", "shape", "rawops us", "rawops graph us", "rawops FFMA us", "rawops tile us",
              "rawops streaming us", "rawops limit us", "torch us", "torch graph us", "torch.compile us", "x torch",
              "limit x torch", "x torch graph",
              "rawops TFLOP/s",
              "compute floor us", "memory floor us", "rel error vs f64", "FFMA rel error vs f64",
              "torch rel error vs f64", "grad rel error vs f64", "torch grad rel error vs f64", "target x torch",
              "meets target"]
    text = write_results(out_dir, "mlp", "python bench/bench_mlp.py", [
        ("fused_mlp against torch nn.Sequential (shape: batch x layer sizes)", header, rows,
         {"copy ceiling TB/s": round(ceiling, 3),
          "targets": "source network f32: >= 5x eager at batch 32, >= 2x at 2^20 (forward), forward+backward "
                     ">= 3x at batch 32, >= 1.5x at 2^20; 64-wide 4-hidden f16 at 2^20: >= 5x eager forward, >= 3x "
                     "eager forward+backward",
          "floors": f"compute: float32 at the FFMA peak {FP32_PEAK_TFLOPS} TFLOP/s, half types at "
                    f"{HALF_PEAK_TFLOPS} TFLOP/s dense tensor cores; memory: x and y once (forward), plus dy and x "
                    "again (f16 forward+backward) or the kept activations written and read (f32), at the copy ceiling",
          "columns": "rawops us: what fused_mlp runs by default (float32 beyond 4096 rows: 3xTF32 with promoted "
                     "sums); torch us: nn.Sequential eager; FFMA us / FFMA rel error: the source network's exact FFMA "
                     "kernels (config.mlp_tf32 = False) on the same call; grad rel error: the largest relative-norm "
                     "error of any weight or bias gradient against float64 (torch's: nn.Sequential's own); "
                     "tile us / streaming us: the WMMA tile kernels (config.mlp_fast_forward = False), weights "
                     "resident / streamed; fwd+bwd tile us: the chain + weight-gradient tile kernels "
                     "(config.mlp_fast_backward = False); torch rel error: nn.Sequential's own output against "
                     "float64; limit us (fwd+bwd): rawops' kernels of the call, each direction captured into a CUDA "
                     "graph and replayed from a bare Python autograd.Function (bench/timing.py replayed), the least "
                     "any autograd Function defined in Python (rawops builds nothing against torch) takes on this "
                     "host; limit x torch: eager over it; a row short of its target where the limit is too, and "
                     f"within {LIMIT_BAR}x of the limit, is met at the limit"}),
        ("forward across widths (64 in, 4 hidden, 64 out, ReLU, batch 2^20, inference)",
         ["op", "dtype", "shape", "rawops us", "rawops tile us", "torch us", "x torch", "x tile",
          "rawops TB/s (x+y)"], sweep,
         {"columns": "rawops us: the default forward (registers-resident activations); tile us: the WMMA tile "
                     "kernel; torch us: nn.Sequential eager"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
