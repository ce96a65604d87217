"""Scratch timing of topk (rawops.torch_adapter's, CuPy API's) against torch.topk on the two
bar shapes and a few others: CUDA events, warm-up, interleaved medians (bench/timing.py), the
copy ceiling measured in the same run. Not a bench: bench/bench_sorting.py holds the rows."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import timing  # noqa: E402

import rawops._sorting_topk as tk  # noqa: E402
import rawops.torch_adapter._sorting_topk as ta  # noqa: E402
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


def forced(x, k, kernel):
    """topk of x (2-D, contiguous, float32) through one named kernel of the fatbin (topk_warp or
    topk_radix, one launch), for comparing kernels on one shape."""
    from rawops import _modules
    from rawops._launch import launch

    rows, n = x.shape
    values = torch.empty(rows, k, device="cuda")
    indices = torch.empty(rows, k, dtype=torch.int64, device="cuda")
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    function = _modules.function_pointer(tk.FAMILY, f"{kernel}_f32", device)
    if kernel == "topk_radix":
        args, kinds, grid = (x.data_ptr(), 0, values.data_ptr(), indices.data_ptr(), rows, n, n, 1, k, 1, 1), \
            tk.RADIX_KINDS, rows
    else:
        args, kinds, grid = (x.data_ptr(), values.data_ptr(), indices.data_ptr(), rows, n, n, k, 1), tk.WARP_KINDS, \
            -(-rows // 8)
    return lambda: launch(function, (grid,), 256, 0, stream, args, kinds, device)


def compare_kernels():
    for rows, n, k in ((65536, 1024, 8), (65536, 1024, 32), (4096, 8192, 8), (1000, 1024, 8), (1000, 32000, 8),
                       (264, 4099, 16)):
        x = torch.randn(rows, n, device="cuda")
        fns = {name: forced(x, k, name) for name in ("topk_warp", "topk_radix")}
        fns["torch"] = lambda: torch.topk(x, k)
        us = timing.device_times_us(fns)
        print(f"{str((rows, n)):>16} k={k:<3} " + "  ".join(f"{name} {t:.1f}" for name, t in us.items()), flush=True)


if __name__ == "__main__":
    main()
    compare_kernels()
