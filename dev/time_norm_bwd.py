"""The 16-bit norm backward's launch shapes side by side (issue 26: rms_norm / add_rms_norm bwd at
0.77-0.79 of the H200's copy ceiling, 0.87 of the H100's): rms_norm_backward (CuPy API) of bf16
16384 x 4096 under every (mode, threads, blocks an SM) the plan could take, each as a fraction of
the copy ceiling measured in the same run (bytes: dy and x read, dx written; the partial rows and
their sum are the kernel's own). The plan is forced by replacing rawops.norm.backward_plan for the
call. Experiment, not a bench.
    python dev/time_norm_bwd.py
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

from rawops import _rows, norm  # noqa: E402
from rawops._launch import sm_count  # noqa: E402

ROWS, N = 16384, 4096


def main():
    ceiling = timing.copy_ceiling_tbps()
    sms = sm_count(0)
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy ceiling {ceiling:.2f} TB/s")
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(ROWS, N, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
        rstd = torch.rand(ROWS, device="cuda", dtype=torch.float32) + 0.5
        X, DY, W, R = (cupy.from_dlpack(t) for t in (x, dy, w, rstd))
        nbytes = 3 * x.numel() * x.element_size()
        original = norm.backward_plan
        default = original(ROWS, N, x.element_size(), sms, DY.data.ptr, X.data.ptr, W.data.ptr, 0)
        shapes = [("default", None)]
        held = _rows.BWD_BYTES // x.element_size()  # elements of a row a thread holds in the block mode
        for mode, name in ((_rows.BLOCK_PER_ROW, "block"), (_rows.STREAM_ROW, "stream")):
            for threads in (128, 256, 512):
                for per_sm in (1, 2, 4, 8, 16):
                    if threads * per_sm <= 2048 and (mode == _rows.STREAM_ROW or threads * held >= N):
                        shapes.append((f"{name} {threads} x{per_sm}/SM", (mode, sms * per_sm, threads)))
        fns = {}
        for label, forced in shapes:
            def plan(rows, n, itemsize, sms_, *args, forced=forced, **kw):
                if forced is None:
                    return original(rows, n, itemsize, sms_, *args, **kw)
                mode, blocks, threads = forced
                aligned = original(rows, n, itemsize, sms_, *args, **kw)[4]
                return mode, blocks, threads, _rows.chunks(mode, blocks, threads), aligned

            def call(plan=plan):
                norm.backward_plan = plan
                try:
                    norm.rms_norm_backward(DY, X, W, R)
                finally:
                    norm.backward_plan = original
            fns[label] = call
        times = timing.device_times_us(fns, reps=10, rounds=3)
        print(f"== rms_norm bwd {dtype} {ROWS}x{N} (default plan {default[:3]})")
        for label, us in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"  {label:24s} {us:8.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of the ceiling")


if __name__ == "__main__":
    main()
