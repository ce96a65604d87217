"""bias_gelu's backward, float16 and float32 at 16384 x 4096, for Nsight Compute (no timing
here): the fused kernel (dx + column partials, then column_sum_final) beside the plain map
kernel that writes the same dx from the same bytes (bias_gelu_tanh_bwd, the unfused path's
first kernel), on the same buffers. The fused kernel streams ~5% slower than the map kernel
(bench/NOTES.md); this puts the two side by side.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats \
        --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg \
        -k regex:bias_gelu_tanh_bwd python bench/profile_bias_bwd.py
"""
import sys

import torch

ROWS, COLS = 16384, 4096


def main():
    from rawops import torch_adapter as ta

    for dtype in (torch.float16, torch.float32):
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        unfused = ta._gelu_kernel("tanh", "bwd", bias=True)
        for _ in range(2):  # the second pass is the one to read (warm clocks and caches)
            ta._bias_gelu_bwd_fused(dy, x, bias, "tanh")
            unfused.torch_call(dy, x, c=bias)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
