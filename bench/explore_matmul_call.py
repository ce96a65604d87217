"""torch_adapter.matmul without gradients: the typed path (one Cython call: checks, cached plan,
output from torch's allocator, launch; the Hopper GEMM's tensor maps and a K split's scratch
included) against the adapter's Python path and torch.mm, one event pair a call, interleaved
rounds (timing.device_times_us), on shapes where the host's time shows.

    python bench/explore_matmul_call.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(torch.bfloat16, 256, 768, 3072), (torch.bfloat16, 32, 3072, 768), (torch.float32, 1000, 256, 520),
          (torch.float16, 64, 64, 64)]


def main():
    sys.path.insert(0, HERE)
    from timing import device_times_us, start, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import _launch
    from rawops import torch_adapter as ta

    rows = []
    for dtype, m, k, n in SHAPES:
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = (torch.randn(k, n, device="cuda") * k ** -0.5).to(dtype)
        with torch.no_grad():
            assert _launch.torch_matmul(a, b) is not None, "the typed path declined"
            times = device_times_us({"typed path (ta.matmul)": lambda: ta.matmul(a, b),
                                     "Python path (_matmul_python)": lambda: ta._matmul_python(a, b),
                                     "torch.mm": lambda: torch.mm(a, b)})
        name = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
        for route, us in times.items():
            rows.append({"shape": f"{m}x{k}x{n} {name}", "route": route, "us a call": us,
                         "x torch.mm": times["torch.mm"] / us})
            print(f"{m}x{k}x{n} {name:5s} {route:30s} {us:8.2f} us", flush=True)
    write_results(out_dir, "explore_matmul_call", "python bench/explore_matmul_call.py", [
        ("torch_adapter.matmul, no grad: one event pair a call", ["shape", "route", "us a call", "x torch.mm"],
         rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
