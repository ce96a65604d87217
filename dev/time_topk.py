"""Scratch timing of topk (rawops.torch_adapter's, CuPy API's) against torch.topk on the two
bar shapes and a few others: CUDA events, warm-up, interleaved medians (bench/timing.py), the
copy ceiling measured in the same run. Not a bench: bench/bench_sort.py holds the rows."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import timing  # noqa: E402

import rawops._sort_topk as tk  # noqa: E402
import rawops.torch_adapter._sort_topk as ta  # noqa: E402
from rawops._launch import sm_count  # noqa: E402

SHAPES = [  # (rows, n, k, dtype)
    (65536, 1024, 8, torch.float32),   # bar 1: >= 5x torch
    (64, 128256, 50, torch.float32),   # bar 2: >= 2x torch
    (65536, 1024, 8, torch.bfloat16),
    (65536, 1024, 32, torch.float32),
    (65536, 1024, 64, torch.float32),
    (4096, 32000, 50, torch.float32),
    (1, 128256, 50, torch.float32),
    (64, 128256, 1024, torch.float32),
    (1000, 4099, 1024, torch.float32),
]


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"copy ceiling {ceiling:.3f} TB/s on {torch.cuda.get_device_name()}")
    sms = sm_count(torch.cuda.current_device())
    print(f"{'shape':>22} {'k':>5} {'dtype':>9} {'plan':>22} {'rawops us':>10} {'torch us':>9} {'ratio':>6} "
          f"{'ceiling':>7}")
    for rows, n, k, dt in SHAPES:
        x = torch.randn(rows, n, device="cuda").to(dt)
        nbytes = rows * n * x.element_size() + rows * k * (x.element_size() + 8)
        p = tk.plan(rows, n, k, str(dt).split(".")[1], sms)
        us = timing.device_times_us({"rawops": lambda: ta.topk(x, k), "torch": lambda: torch.topk(x, k)})
        frac = nbytes / us["rawops"] / 1e6 / ceiling
        print(f"{str((rows, n)):>22} {k:>5} {str(dt).split('.')[1]:>9} {p.kernel + '/' + str(p.chunks):>22} "
              f"{us['rawops']:>10.1f} {us['torch']:>9.1f} {us['torch'] / us['rawops']:>6.2f} {frac:>7.2f}",
              flush=True)


if __name__ == "__main__":
    main()
