"""What bounds the 16-bit norm backward (issue 26: 0.71-0.79 of the H200's copy ceiling, 0.87-0.89
of the H100's): the backward beside the streams that move its exact bytes, timed in the same
rounds at bf16 16384 x 4096:
  copy 1 GiB         the copy ceiling (bench/timing.py)
  copy same bytes    a device copy of half the backward's bytes (half read, half written)
  torch add          dy + x -> out: a 2:1 map of exactly the backward's reads and writes
  rms_norm bwd       with weight (dweight partials in shared memory) and without (none)
  layer_norm bwd     with weight and bias, and without
  add_rms_norm bwd   d_residual_out read too (4 tensor passes)
each backward with 0 (the register path), 1 and 2 bulk-path stages (rawops.norm.STAGES, where the
path applies), bf16, f16 and f32.
Each row: us, TB/s counted on the backward's bytes (dy, x read; dx written; add_rms_norm adds
d_residual_out), of the ceiling, of the 2:1 map. Experiment, not a bench.
    python dev/norm_bwd_limits.py            (NCU=1: one call of each backward, bf16, for ncu;
                                              NORM_OPS=layer_norm, NORM_DTYPES=bfloat16: a subset)
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

from rawops import norm  # noqa: E402

ROWS, N = 16384, 4096


def _cases(dtype):
    x = torch.randn(ROWS, N, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    dr = torch.randn_like(x)
    out = torch.empty_like(x)
    w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
    rstd = torch.rand(ROWS, device="cuda", dtype=torch.float32) + 0.5
    mean = torch.randn(ROWS, device="cuda", dtype=torch.float32) * 0.1
    X, DY, DR, W, R, M = (cupy.from_dlpack(t) for t in (x, dy, dr, w, rstd, mean))
    ops = {
        "rms_norm bwd": lambda: norm.rms_norm_backward(DY, X, W, R),
        "rms_norm bwd, no weight": lambda: norm.rms_norm_backward(DY, X, None, R),
        "layer_norm bwd": lambda: norm.layer_norm_backward(DY, X, W, M, R),
        "layer_norm bwd, no weight": lambda: norm.layer_norm_backward(DY, X, None, M, R),
        "add_rms_norm bwd": lambda: norm.add_rms_norm_backward(DY, DR, X, W, R),
    }
    only = os.environ.get("NORM_OPS")  # e.g. NORM_OPS=layer_norm: those ops' rows alone
    ops = {name: fn for name, fn in ops.items() if not only or name.split()[0] in only.split(",")}
    fns = {}
    for name, fn in ops.items():  # each backward with 0 (registers), 1 and 2 bulk stages
        op = name.split()[0]
        for stages in (0, 1, 2):
            def call(fn=fn, op=op, stages=stages):
                saved = dict(norm.STAGES)
                norm.STAGES[op] = (stages, stages)  # layer_norm: no bulk path (kernels/norm.cu), stages ignored
                try:
                    return fn()
                finally:
                    norm.STAGES.clear()
                    norm.STAGES.update(saved)
            fns[f"{name}, stages {stages}"] = call
        dx0 = fns[f"{name}, stages 0"]()[0].astype(cupy.float32)
        for stages in (1, 2):  # the staged path's dx against the register path's
            diff = float(cupy.abs(fns[f"{name}, stages {stages}"]()[0].astype(cupy.float32) - dx0).max())
            print(f"  {name}, stages {stages}: dx max |diff| from stages 0: {diff:.2e}")
    nbytes = 3 * x.numel() * x.element_size()
    half = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    half_out = torch.empty_like(half)
    fns["copy same bytes"] = lambda: half_out.copy_(half)
    fns["torch add (2:1 map)"] = lambda: torch.add(dy, x, out=out)
    return fns, nbytes


def main():
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    if os.environ.get("NORM_DTYPES"):  # e.g. NORM_DTYPES=bfloat16
        dtypes = [getattr(torch, d) for d in os.environ["NORM_DTYPES"].split(",")]
    if os.environ.get("NCU"):
        fns, _ = _cases(torch.bfloat16)
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        return
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s; {ROWS} x {N}")
    for dtype in dtypes:
        fns, nbytes = _cases(dtype)
        times = timing.device_times_us(fns, reps=20, rounds=5)
        base = times["torch add (2:1 map)"]
        print(f"== {dtype}")
        for name, us in times.items():
            moved = nbytes * (4 / 3 if name.startswith("add_rms") else 1)
            print(f"  {name:38s} {us:8.1f} us  {moved / us / 1e6:5.2f} TB/s  {moved / us / 1e6 / ceiling:.3f} of "
                  f"ceiling  {base * moved / nbytes / us:.3f} of the 2:1 map")
        del fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
