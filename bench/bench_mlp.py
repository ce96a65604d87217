"""Benchmark of the MLP family against torch, in one run on one GPU (issue 4's rows):
  * the source network 100-128-64-10 (ReLU), float32, at batch 32 and 2^20: forward
    (torch eager and a CUDA-graph replay of it) and forward+backward (eager);
  * a tiny-cuda-nn-style network, 64 inputs, 4 hidden layers of 64 (ReLU), 64 outputs,
    float16, at batch 2^20: forward and forward+backward (eager; graph for the forward).
Targets (issue 4): source network >= 5x eager at 32, >= 2x at 2^20 (forward); 64-wide f16
>= 5x eager forward, >= 3x eager forward+backward. rawops through torch_adapter (FusedMLP
built from the same nn.Sequential, one launch forward). Forward+backward: the weight and
bias gradients (x needs none, for both), through torch.autograd.grad. CUDA events, median of
100 after warm-up, rawops and torch eager timed in 5 interleaved rounds of 20. A second table times the fast forward across hidden widths 16..128 in both
half types against the WMMA tile kernel and torch eager.

    python bench/bench_mlp.py [--out bench/results]
    RAWOPS_MLP_WARPS_SWEEP=1 python bench/bench_mlp.py   # also print the fast forward at 4..16 warps a block
    RAWOPS_MLP_SEED_SWEEP=1 python bench/bench_mlp.py    # also print each 3xTF32 source-network variant
"""
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, device_times_us, graphed, start, write_results  # noqa: E402

SEED_FLOPS = 2 * (100 * 128 + 128 * 64 + 64 * 10)  # forward, per sample
# backward without dx: g2, g1 (2 x (10x64 + 64x128)) and the three weight gradients
SEED_BWD_FLOPS = 2 * (10 * 64 + 64 * 128) + 2 * (100 * 128 + 128 * 64 + 64 * 10)
SEED_BYTES = 4 * (100 + 10)
TC_SIZES = (64, 64, 64, 64, 64, 64)
TC_FLOPS = 2 * 5 * 64 * 64
FP32_PEAK_TFLOPS = 66.9  # H100 SXM: 132 SMs x 128 FFMA lanes x 2 x 1.98 GHz
TARGETS = {("seed", 32, "fwd"): 5.0, ("seed", 1 << 20, "fwd"): 2.0, ("tc", 1 << 20, "fwd"): 5.0,
           ("tc", 1 << 20, "fwd+bwd"): 3.0}


def sequential(sizes, dtype):
    """nn.Sequential of Linear layers with ReLU between them, on the GPU in dtype."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda().to(dtype)


def _rows(ta, name, sizes, dtype, batch, ceiling, flops_fwd, flops_bwd, bytes_fwd, bytes_fwdbwd, graph):
    net = sequential(sizes, dtype)
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(batch, sizes[0], device="cuda", dtype=dtype)
    dy = torch.randn(batch, sizes[-1], device="cuda", dtype=dtype)
    with torch.no_grad():
        ref = copy.deepcopy(net).double()(x.double())
        error = ((fused(x).double() - ref).norm() / ref.norm()).item()
        torch_error = ((net(x).double() - ref).norm() / ref.norm()).item()  # torch's own, same data
        ffma_error = float("nan")
        if name == "seed" and batch > 4096:
            ffma_error = ((with_exact_ffma(fused, lambda: fused(x)).double() - ref).norm() / ref.norm()).item()
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        if mode == "fwd":
            def ours():
                with torch.no_grad():
                    fused(x)

            def eager():
                with torch.no_grad():
                    net(x)
        else:
            fused_params, net_params = list(fused.parameters()), list(net.parameters())

            def ours():
                torch.autograd.grad(fused(x), fused_params, dy)

            def eager():
                torch.autograd.grad(net(x), net_params, dy)
        timed = device_times_us({"ours": ours, "eager": eager})  # interleaved: drift falls on both
        us_ours, us_eager = timed["ours"], timed["eager"]
        us_graph = device_time_us(graphed(eager)) if graph and mode == "fwd" else float("nan")
        # our own call replayed from a CUDA graph: the kernel's time without the host's
        us_ours_graph = device_time_us(graphed(ours)) if mode == "fwd" else float("nan")
        us_streaming = us_tile = float("nan")
        if name == "tc" and mode == "fwd":  # the WMMA tile kernels (resident, streaming) beside the fast one
            us_tile, us_streaming = tile_kernels_us(fused, ours)
        if name == "tc" and mode == "fwd+bwd":  # the chain + wgrad tile kernels beside the fused backward
            import rawops.mlp as mlp

            mlp.USE_FAST_BWD = False
            us_tile = device_time_us(ours)
            mlp.USE_FAST_BWD = True
        us_ffma = float("nan")
        if name == "seed" and mode == "fwd" and batch > 4096:  # the exact FFMA kernel beside 3xTF32 (the default)
            us_ffma = with_exact_ffma(fused, lambda: device_time_us(ours))
        flops = (flops_fwd + (flops_bwd if mode == "fwd+bwd" else 0)) * batch
        moved = (bytes_fwd if mode == "fwd" else bytes_fwdbwd) * batch
        speedup = us_eager / us_ours
        target = TARGETS.get((name, batch, mode))
        rows.append({"network": f"{'-'.join(map(str, sizes))} {str(dtype)[6:]}", "batch": batch, "pass": mode,
                     "rawops us": us_ours, "rawops graph us": us_ours_graph, "rawops FFMA us": us_ffma,
                     "rawops tile us": us_tile, "rawops streaming us": us_streaming,
                     "torch eager us": us_eager, "torch graph us": us_graph,
                     "x eager": speedup, "x graph": us_graph / us_ours, "rawops TFLOP/s": flops / us_ours / 1e6,
                     "compute floor us": flops / (FP32_PEAK_TFLOPS if dtype == torch.float32 else 990.0) / 1e6,
                     "memory floor us": moved / ceiling / 1e6, "rel error vs f64": error,
                     "FFMA rel error vs f64": ffma_error, "torch rel error vs f64": torch_error,
                     "target x eager": target if target else "-",
                     "meets target": (speedup >= target) if target else "-"})
        r = rows[-1]
        print(f"{r['network']:24s} batch {batch:8d} {mode:8s}: rawops {us_ours:9.1f} us (graph {us_ours_graph:7.1f}) | eager {us_eager:9.1f} us | "
              f"graph {us_graph:9.1f} us | {speedup:5.2f}x eager | {r['rawops TFLOP/s']:6.1f} TFLOP/s | "
              f"err {error:.2g} (torch {torch_error:.2g})"
              + (f" | exact FFMA {us_ffma:.1f} us, err {ffma_error:.2g}" if us_ffma == us_ffma else ""), flush=True)
    return rows


def drop_launch_cache(fused):
    """Forget FusedMLP's validated plan and the source network's per-batch launches (its typed
    fast path runs before any plan check), so the next call asks the planner again."""
    fused._fast_key = None
    fused._seed_state = None


def with_exact_ffma(fused, fn):
    """fn() with the source network's large-batch forward forced to the exact FFMA kernel
    (mlp.USE_SEED_TC off), the launch cache dropped on both sides of the switch (the old bench
    flipped USE_TF32 without that and timed the FFMA kernel in both columns)."""
    import rawops.mlp as mlp

    mlp.USE_SEED_TC = False
    drop_launch_cache(fused)
    try:
        return fn()
    finally:
        mlp.USE_SEED_TC = True
        drop_launch_cache(fused)


def tile_kernels_us(fused, ours):
    """(resident, streaming) times of the WMMA tile kernels on the same call (fast forward off)."""
    import rawops.mlp as mlp

    def timed(resident_max):
        saved_max, mlp.RESIDENT_MAX_SMEM, mlp.USE_FAST = mlp.RESIDENT_MAX_SMEM, resident_max, False
        mlp._plans.clear()
        drop_launch_cache(fused)
        try:
            return device_time_us(ours)
        finally:
            mlp.RESIDENT_MAX_SMEM, mlp.USE_FAST = saved_max, True
            mlp._plans.clear()
            drop_launch_cache(fused)

    return timed(mlp.RESIDENT_MAX_SMEM), timed(0)


SWEEP_HEADER = ["network", "fast us", "tile us", "torch eager us", "x eager", "x tile", "fast TB/s (x+y)"]


def width_sweep(ta, ceiling, batch=1 << 20):
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
            rows.append({"network": f"{'-'.join(map(str, sizes))} {str(dtype)[6:]}", "fast us": fast, "tile us": tile,
                         "torch eager us": us_eager, "x eager": us_eager / fast, "x tile": tile / fast,
                         "fast TB/s (x+y)": batch * 2 * 128 / fast / 1e6})
            r = rows[-1]
            print(f"{r['network']:24s} fast {fast:8.1f} us | tile {tile:8.1f} us | eager {us_eager:8.1f} us | "
                  f"{r['x eager']:5.2f}x eager", flush=True)
    return rows


def warps_sweep(ta, batch=1 << 20):
    """Printed only: the 64x4 f16 fast forward with at most 4..16 warps a block (RAWOPS_MLP_WARPS_SWEEP=1)."""
    import rawops.mlp as mlp

    net = sequential(TC_SIZES, torch.float16)
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(batch, 64, device="cuda", dtype=torch.float16)

    def ours():
        with torch.no_grad():
            fused(x)

    default = mlp.FAST_MAX_WARPS
    for warps in (4, 8, 12, 16):
        mlp.FAST_MAX_WARPS = warps
        mlp._fast_fits.clear()
        print(f"fast forward 64x4 f16, {warps:2d} warps a block: {device_time_us(ours):8.1f} us", flush=True)
    mlp.FAST_MAX_WARPS = default
    mlp._fast_fits.clear()


def seed_variants(ta, batch=1 << 20):
    """Printed only (RAWOPS_MLP_SEED_SWEEP=1): the source network's forward at 2^20 through each
    3xTF32 variant and warp count, the exact FFMA kernel and torch eager, in one run."""
    import rawops.mlp as mlp

    net = sequential((100, 128, 64, 10), torch.float32)
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(batch, 100, device="cuda")
    with torch.no_grad():
        ref = copy.deepcopy(net).double()(x.double())

    def ours():
        with torch.no_grad():
            return fused(x)

    def error(y):
        return ((y.double() - ref).norm() / ref.norm()).item()

    def eager():
        with torch.no_grad():
            return net(x)

    print(f"source f32 2^20: torch eager {device_time_us(eager):8.1f} us, err {error(eager()):.2g}", flush=True)
    print(f"source f32 2^20: exact FFMA  {with_exact_ffma(fused, lambda: device_time_us(ours)):8.1f} us, "
          f"err {with_exact_ffma(fused, lambda: error(ours())):.2g}", flush=True)
    default_variant, variants = mlp.SEED_TC, dict(mlp.SEED_TC_VARIANTS)
    for variant, (rows, most) in variants.items():
        for warps in sorted({most, most // 2, 8} - {0}, reverse=True):
            mlp.SEED_TC, mlp.SEED_TC_VARIANTS[variant] = variant, (rows, warps)
            mlp._seed_tc_fits.clear()
            drop_launch_cache(fused)
            us = device_time_us(ours)
            launched = fused._seed_state[4][batch][1:]  # (grid, block, shared bytes) FusedMLP launched
            print(f"source f32 2^20: {variant} {warps:2d} warps {us:8.1f} us, err {error(ours()):.2g}, "
                  f"launch {launched}", flush=True)
    mlp.SEED_TC, mlp.SEED_TC_VARIANTS = default_variant, variants
    mlp._seed_tc_fits.clear()
    drop_launch_cache(fused)


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import torch_adapter as ta

    rows = []
    for batch in (32, 1 << 20):
        # forward+backward bytes: x, y, dy and the two kept activations written and read back
        rows += _rows(ta, "seed", (100, 128, 64, 10), torch.float32, batch, ceiling, SEED_FLOPS, SEED_BWD_FLOPS,
                      SEED_BYTES, 4 * (100 + 10 + 10 + 2 * 192 + 100), True)
    rows += _rows(ta, "tc", TC_SIZES, torch.float16, 1 << 20, ceiling, TC_FLOPS, 2 * TC_FLOPS - 2 * 64 * 64,
                  2 * (64 + 64), 2 * (64 + 64 + 64 + 64), True)
    if os.environ.get("RAWOPS_MLP_WARPS_SWEEP"):
        warps_sweep(ta)
    if os.environ.get("RAWOPS_MLP_SEED_SWEEP"):
        seed_variants(ta)
    sweep = width_sweep(ta, ceiling)
    header = ["network", "batch", "pass", "rawops us", "rawops graph us", "rawops FFMA us", "rawops tile us",
              "rawops streaming us",
              "torch eager us", "torch graph us", "x eager", "x graph",
              "rawops TFLOP/s", "compute floor us", "memory floor us", "rel error vs f64", "FFMA rel error vs f64",
              "torch rel error vs f64", "target x eager",
              "meets target"]
    text = write_results(out_dir, "mlp", "python bench/bench_mlp.py", [
        ("fused_mlp against torch nn.Sequential", header, rows,
         {"copy ceiling TB/s": round(ceiling, 3),
          "targets": "source network f32: >= 5x eager at batch 32, >= 2x at 2^20 (forward); 64-wide 4-hidden f16 "
                     "at 2^20: >= 5x eager forward, >= 3x eager forward+backward",
          "floors": f"compute: float32 at the FFMA peak {FP32_PEAK_TFLOPS} TFLOP/s, float16 at ~990 TFLOP/s dense "
                    "tensor cores; memory: x and y once (forward), plus dy and x again (f16 forward+backward) or "
                    "the kept activations written and read (f32), at the copy ceiling",
          "columns": "rawops us: what fused_mlp runs (f16/bf16: the fast forward tc_mlp_w<W>_<act>_fwd where it fits; "
                     "source network beyond batch 4096: 3xTF32 seed_mlp_tc*_fwd); FFMA us / FFMA rel error: the exact "
                     "FFMA kernel seed_mlp_fwd on the same call (mlp.USE_SEED_TC = False); torch rel error: "
                     "nn.Sequential's own float32 output against float64; "
                     "tile us / streaming us: the WMMA tile kernels tc_mlp_nf*_fwd, weights resident / streamed; "
                     "fwd+bwd tile us: the backward through tc_mlp_nf*_bwd + tc_mlp_wgrad_nf*_bwd instead of the fused "
                     "tc_mlp_w<W>_<act>_bwd"}),
        ("fast forward across widths (64 in, 4 hidden, 64 out, ReLU, batch 2^20, inference)", SWEEP_HEADER, sweep,
         {"columns": "fast us: tc_mlp_w<W>_<act>_fwd; tile us: the WMMA tile kernel; eager: torch nn.Sequential"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
