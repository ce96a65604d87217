"""GEMM launches straight through rawops.matmul.launch_gemm, for Nsight Compute and for
isolating the layout from the epilogue: `python bench/profile_sm90.py <layout> M N K [gelu]
[--time]`; with --time prints the median device time instead of running twice for ncu."""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import device_time_us  # noqa: E402

mm = importlib.import_module("rawops.matmul")
layout, m, n, k = sys.argv[1], *map(int, sys.argv[2:5])
gelu = "gelu" in sys.argv[5:]
dtype = torch.bfloat16
a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda", dtype=dtype)
b = torch.randn((k, n) if layout[1] == "n" else (n, k), device="cuda", dtype=dtype)
bias = torch.randn(n, device="cuda", dtype=dtype)
c = torch.empty(m, n, device="cuda", dtype=dtype)
flags = mm.EPI_BIAS_GELU if gelu else mm.EPI_NONE
stream = torch.cuda.current_stream().cuda_stream


def once():
    mm.launch_gemm(0, layout, 2, a.data_ptr(), b.data_ptr(), c.data_ptr(), bias.data_ptr() if gelu else 0, 0, 0,
                   m, n, k, flags, stream, None)


if "--time" in sys.argv:
    us = device_time_us(once, warmup=3, reps=20)
    print(f"{layout} {m}x{n}x{k} {'bias+gelu' if gelu else 'plain'}: {us:.1f} us, {2 * m * n * k / us / 1e6:.0f} TFLOP/s")
else:
    once()
    once()
    torch.cuda.synchronize()
