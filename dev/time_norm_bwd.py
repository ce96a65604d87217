"""The 16-bit norm backward's launch shapes side by side (issue 26: rms_norm / add_rms_norm bwd at
0.77-0.79 of the H200's copy ceiling, 0.87 of the H100's): rms_norm_backward (CuPy API) of bf16
16384 x 4096 under every (mode, threads, blocks an SM) the plan could take, each as a fraction of
the copy ceiling measured in the same run (bytes: dy and x read, dx written; the partial rows and
their sum are the kernel's own). The plan is forced by replacing rawops.norm.backward_plan for the
call. Experiment, not a bench.
    python dev/time_norm_bwd.py

`layer_norm` as the argument times the 16-bit layer_norm backward instead (0.844 / 0.840 of the H100's
ceiling at 16384 x 4096, bar 0.85): its call writes a float32 partial row of dweight and one of dbias
a block (at the shipped 4 blocks of 512 an SM, 528 x 4096 x 2: 17 MB written and read back by
norm_param_grad, ~11 us at the H100's ceiling); layer_norm_backward at 1-4 blocks an SM for each
entry (config.norm_full_rows False / True) beside torch's backward; dx checked equal across one
entry's grids, dx, dweight and dbias against torch's.
    python dev/time_norm_bwd.py layer_norm
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

from rawops import _rows, config, norm  # noqa: E402
from rawops._launch import sm_count  # noqa: E402

ROWS, N = 16384, 4096


def start():
    """(copy ceiling TB/s, SMs), printed with the device's name."""
    ceiling = timing.copy_ceiling_tbps()
    sms = sm_count(0)
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy ceiling {ceiling:.2f} TB/s")
    return ceiling, sms


def operands(dtype):
    """x, dy (ROWS x N, normal) and a weight in [0.5, 1.5)."""
    x = torch.randn(ROWS, N, device="cuda", dtype=dtype)
    return x, torch.randn_like(x), torch.rand(N, device="cuda", dtype=dtype) + 0.5


def forcing(original, forced):
    """norm.backward_plan with (mode, blocks, threads) = forced (None: original's plan), the
    alignment as original finds it."""
    def plan(rows, n, itemsize, sms_, *args, **kw):
        if forced is None:
            return original(rows, n, itemsize, sms_, *args, **kw)
        mode, blocks, threads = forced
        aligned = original(rows, n, itemsize, sms_, *args, **kw)[4]
        return mode, blocks, threads, _rows.chunks(mode, blocks, threads), aligned
    return plan


def main():
    ceiling, sms = start()
    for dtype in (torch.bfloat16, torch.float32):
        x, dy, w = operands(dtype)
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
            plan = forcing(original, forced)

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


def layer_norm_blocks():
    ceiling, sms = start()
    for dtype in (torch.bfloat16, torch.float16):
        x, dy, w = operands(dtype)
        b = torch.rand(N, device="cuda", dtype=dtype)
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        X, DY, W, M, R = (cupy.from_dlpack(t) for t in (x, dy, w, mean, rstd))
        nbytes = 3 * x.numel() * x.element_size()
        original = norm.backward_plan
        default = original(ROWS, N, x.element_size(), sms, DY.data.ptr, X.data.ptr, W.data.ptr, 0)
        xt = x.detach().requires_grad_()
        wt, bt = w.detach().requires_grad_(), b.detach().requires_grad_()
        yt = torch.nn.functional.layer_norm(xt, (N,), wt, bt)
        fns = {"torch": lambda: torch.autograd.grad(yt, (xt, wt, bt), dy, retain_graph=True)}
        ref = fns["torch"]()
        for full in (False, True):
            for per_sm in (4, 3, 2, 1):
                plan = forcing(original, (default[0], sms * per_sm, default[2]))

                def call(plan=plan, full=full):
                    norm.backward_plan, saved = plan, config.norm_full_rows
                    config.norm_full_rows = full
                    try:
                        return norm.layer_norm_backward(DY, X, W, M, R)
                    finally:
                        norm.backward_plan, config.norm_full_rows = original, saved
                got = [torch.from_dlpack(a) for a in call()]
                if per_sm == 4:
                    want = got[0]  # dx: each row's own sums, the same bits at any grid of one entry
                errors = [float((g.float() - r.float()).norm() / r.float().norm()) for g, r in zip(got, ref)]
                label = f"{'full rows' if full else 'block a row'} x{per_sm}/SM"
                print(f"  {dtype} {label}: dx {'equal' if torch.equal(got[0], want) else 'DIFFERS'} to x4's; "
                      f"relative error against torch dx {errors[0]:.1e}, dw {errors[1]:.1e}, db {errors[2]:.1e}",
                      flush=True)
                fns[label] = call
        times = timing.device_times_us(fns, reps=10, rounds=5)
        print(f"== layer_norm bwd {dtype} {ROWS}x{N} (default plan {default[:3]})")
        for label, us in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"  {label:24s} {us:8.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of the ceiling  "
                  f"{times['torch'] / us:.2f}x torch", flush=True)


if __name__ == "__main__":
    layer_norm_blocks() if sys.argv[1:] == ["layer_norm"] else main()
