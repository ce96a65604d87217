"""The Hopper GEMM against the portable mma.sync kernel and torch, same run: the shapes of
issue 4 (matmul 8192^3, linear_gelu 8192x768->3072 and its backward GEMMs), one line each.

    python bench/explore_sm90.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us  # noqa: E402

F = torch.nn.functional


def _both_paths(fn):
    """(Hopper us, portable us) of fn, the plan cache cleared around each."""
    import importlib

    from rawops import _gemm_sm90

    matmul = importlib.import_module("rawops.matmul")  # the module: rawops.matmul is also the function

    times = []
    for portable in (False, True):
        matmul._plans.clear()
        _gemm_sm90._built.pop(0, None)
        if portable:
            _gemm_sm90._built[0] = False
        times.append(device_time_us(fn, warmup=3, reps=20))
    _gemm_sm90._built.pop(0, None)
    matmul._plans.clear()
    return times


def main():
    from rawops import torch_adapter as ta

    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), flush=True)
    for dtype in (torch.bfloat16, torch.float16):
        for m, k, n, layout in ((8192, 8192, 8192, "nn"), (8192, 768, 3072, "nt"), (8192, 3072, 768, "nn"),
                                (4096, 4096, 4096, "nn")):
            a = torch.randn(m, k, device="cuda").to(dtype)
            if layout == "nn":
                b = torch.randn(k, n, device="cuda").to(dtype)
                ours, theirs = (lambda: ta.matmul(a, b)), (lambda: torch.matmul(a, b))
                err = ((ta.matmul(a[:64], b).double() - a[:64].double() @ b.double()).norm()
                       / (a[:64].double() @ b.double()).norm()).item()
            else:
                w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype)
                bias = torch.randn(n, device="cuda").to(dtype)
                ours = lambda: ta.linear_gelu(a, w, bias)  # noqa: E731
                theirs = lambda: torch._addmm_activation(bias, a, w.t(), use_gelu=True)  # noqa: E731
                eager = device_time_us(lambda: F.gelu(F.linear(a, w, bias), approximate="tanh"), warmup=3, reps=20)
                ref = F.gelu(F.linear(a[:64].double(), w.double(), bias.double()), approximate="tanh")
                err = ((ta.linear_gelu(a[:64], w, bias).double() - ref).norm() / ref.norm()).item()
            with torch.no_grad():
                hopper, portable = _both_paths(ours)
                torch_us = device_time_us(theirs, warmup=3, reps=20)
            tflops = 2 * m * k * n / 1e6
            extra = f" eager {eager:.1f} us" if layout == "nt" else ""
            print(f"{str(dtype)[6:]:8} {layout} {m}x{k}x{n}: hopper {hopper:.1f} us ({tflops / hopper:.0f} TFLOP/s) "
                  f"portable {portable:.1f} us ({tflops / portable:.0f}) torch {torch_us:.1f} us "
                  f"({tflops / torch_us:.0f}){extra} -> {torch_us / hopper:.2f}x torch, err {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
