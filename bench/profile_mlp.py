"""One launch of each MLP kernel the bench rows time, for Nsight Compute (no timing here):

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        -k regex:'tc_mlp|seed_mlp|mlp_' python bench/profile_mlp.py

Runs the 64-wide 4-hidden float16 network at batch 2^20 (inference forward, training
forward, backward) and the source network at batch 32 and 2^20, once each after a warm-up
outside the profiled range (ncu --launch-skip counts the warm-up launches).

    python bench/profile_mlp.py --breakdown   # no ncu: every kernel of the 64x4 float16
                                              # forward+backward at 2^20, device us per call
    python bench/profile_mlp.py --padded      # the same with the backward's partial rows padded
    python bench/profile_mlp.py --dependent   # fwd+bwd by events, the layers' reduce launched
                                              # programmatically dependent or plainly (interleaved)
"""
import os
import sys

import torch

from rawops import torch_adapter as ta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mlp import sequential  # noqa: E402


def main():
    cases = [((64,) * 6, torch.float16, 1 << 20), ((100, 128, 64, 10), torch.float32, 32),
             ((100, 128, 64, 10), torch.float32, 1 << 20)]
    for sizes, dtype, batch in cases:
        fused = ta.FusedMLP.from_sequential(sequential(sizes, dtype))
        x = torch.randn(batch, sizes[0], device="cuda", dtype=dtype)
        dy = torch.randn(batch, sizes[-1], device="cuda", dtype=dtype)
        with torch.no_grad():
            fused(x)
        torch.autograd.grad(fused(x), list(fused.parameters()), dy)
    torch.cuda.synchronize()


def breakdown():
    """torch.profiler's view of the 64x4 float16 forward+backward (the bench's fwd+bwd row):
    each kernel's device time per call, and the call's time by events."""
    fused = ta.FusedMLP.from_sequential(sequential((64,) * 6, torch.float16))
    x = torch.randn(1 << 20, 64, device="cuda", dtype=torch.float16)
    dy = torch.randn(1 << 20, 64, device="cuda", dtype=torch.float16)
    breakdown_of(fused, x, dy, list(fused.parameters()))


def padded_partials():
    """The breakdown with the fused backward's partial rows padded by a few floats (stride not a
    multiple of 256 bytes): does the reduce's 11 us come from every chunk's row starting in the
    same L2 slice? The gradients must be the same bits at every padding. (Session 9: 11.0-11.2 us
    at every padding, so no.)"""
    from rawops import mlp

    shipped = mlp.fast_bwd_partials
    fused = ta.FusedMLP.from_sequential(sequential((64,) * 6, torch.float16))
    x = torch.randn(1 << 20, 64, device="cuda", dtype=torch.float16)
    dy = torch.randn(1 << 20, 64, device="cuda", dtype=torch.float16)
    params = list(fused.parameters())
    reference = torch.autograd.grad(fused(x), params, dy)
    for pad in (0, 4, 16, 32, 64, 96):
        mlp.fast_bwd_partials = lambda plan, pad=pad: (lambda lo: (lo[0], lo[1] + pad))(shipped(plan))
        grads = torch.autograd.grad(fused(x), params, dy)
        same = all(torch.equal(a, b) for a, b in zip(grads, reference))
        print(f"pad {pad} floats, gradients bit-identical: {same}")
        breakdown_of(fused, x, dy, params)
    mlp.fast_bwd_partials = shipped


def dependent_reduce():
    """The 64x4 float16 forward+backward by events with mlp.DEPENDENT_REDUCE on and off, in
    interleaved rounds (the gradients must be the same bits either way)."""
    from rawops import mlp
    from timing import device_times_us

    fused = ta.FusedMLP.from_sequential(sequential((64,) * 6, torch.float16))
    x = torch.randn(1 << 20, 64, device="cuda", dtype=torch.float16)
    dy = torch.randn(1 << 20, 64, device="cuda", dtype=torch.float16)
    params = list(fused.parameters())

    def step(dependent):
        def call():
            mlp.DEPENDENT_REDUCE = dependent
            try:
                return torch.autograd.grad(fused(x), params, dy)
            finally:
                mlp.DEPENDENT_REDUCE = True
        return call

    same = all(torch.equal(a, b) for a, b in zip(step(True)(), step(False)()))
    print(f"gradients bit-identical both ways: {same}")
    for name, t in device_times_us({"dependent": step(True), "plain": step(False)}, rounds=8).items():
        print(f"  fwd+bwd, reduce launched {name}: {t:.1f} us")


def breakdown_of(fused, x, dy, params, calls=10):
    from torch.profiler import ProfilerActivity, profile

    from timing import device_time_us

    def step():
        torch.autograd.grad(fused(x), params, dy)

    print(f"  fwd+bwd by events: {device_time_us(step):.1f} us")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_time > 0:
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time / calls
    for name, t in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {t:9.1f} us  {name[:80]}")


if __name__ == "__main__":
    if "--padded" in sys.argv:
        padded_partials()
    elif "--dependent" in sys.argv:
        dependent_reduce()
    else:
        breakdown() if "--breakdown" in sys.argv else main()
