"""The norm forwards of full rows (issue 26: 16-bit layer_norm forward 0.87-0.88 of the H200's
copy ceiling, rms_norm float32 0.87, bar 0.92): <op>_fwd_full_<dtype> (a resident grid looping
over rows, weight and bias in shared memory, stepped row pointers, butterfly row sums) beside the
block-a-row <op>_fwd_<dtype> it replaces, both shipped in the norm fatbin: rawops/norm.py's
fwd_full_rows switched off for the second, interleaved rounds, 16384 x 4096. Prints us, the
fraction of the copy ceiling (x read, y written) and the largest difference of y between the two
(the sums' order differs: ulps). Experiment, not a bench.
    python dev/time_norm_fwd_full.py
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
CASES = [("layer_norm", torch.bfloat16), ("layer_norm", torch.float16), ("rms_norm", torch.bfloat16),
         ("rms_norm", torch.float16), ("rms_norm", torch.float32)]
FULL = norm.fwd_full_rows


_OLD_CONFIGS = {}  # the block-a-row launches' cache, kept across calls (no planning in the timed loop)


def block_a_row(fn):
    """fn() with the full-rows entries switched off (and the launch cache of its own)."""
    saved = norm._forward_configs
    norm.fwd_full_rows, norm._forward_configs = (lambda *a: False), _OLD_CONFIGS
    try:
        return fn()
    finally:
        norm.fwd_full_rows, norm._forward_configs = FULL, saved


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s; {ROWS} x {N}")
    for op, dtype in CASES:
        x = torch.randn(ROWS, N, device="cuda", dtype=dtype) * 2 + 3
        w = (torch.rand(N, device="cuda") + 0.5).to(dtype)
        b = torch.randn(N, device="cuda").to(dtype)
        X, W, B = (cupy.from_dlpack(t) for t in (x, w, b))
        if op == "layer_norm":
            call = lambda: norm.layer_norm_forward(X, W, B, 1e-5)  # noqa: E731
        else:
            call = lambda: norm.rms_norm_forward(X, W, 1e-5)  # noqa: E731
        full, old = call(), block_a_row(call)
        ref = (torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5) if op == "layer_norm"
               else torch.nn.functional.rms_norm(x.double(), (N,), w.double(), 1e-5))
        diffs = [float(abs(torch.from_dlpack(a).double() - torch.from_dlpack(c).double()).max())
                 for a, c in zip(full, old)]
        errs = [float((torch.from_dlpack(o[0]).double() - ref).norm() / ref.norm()) for o in (full, old)]
        print(f"== {op} {dtype}: max |full - block a row| of y, stats {diffs}; "
              f"y rel error vs float64 full {errs[0]:.3g} / block a row {errs[1]:.3g}")
        nbytes = 2 * x.numel() * x.element_size()
        times = timing.device_times_us({"block a row": lambda: block_a_row(call), "full rows": call}, reps=20,
                                       rounds=7)
        for name, us in times.items():
            tbps = nbytes / us / 1e6
            print(f"  {name:12s} {us:8.1f} us  {tbps:5.2f} TB/s  {tbps / ceiling:.3f} of ceiling")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
