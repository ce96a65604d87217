"""One launch of each MLP kernel the bench rows time, for Nsight Compute (no timing here):

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        -k regex:'tc_mlp|seed_mlp|mlp_' python bench/profile_mlp.py

Runs the 64-wide 4-hidden float16 network at batch 2^20 (inference forward, training
forward, backward) and the source network at batch 32 and 2^20, once each after a warm-up
outside the profiled range (ncu --launch-skip counts the warm-up launches).
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


if __name__ == "__main__":
    main()
