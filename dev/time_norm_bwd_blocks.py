"""The 16-bit layer_norm backward (issue 26: 0.844 / 0.840 of the H100's copy ceiling at 16384 x 4096,
bar 0.85) by grid size: its call writes one float32 partial row of dweight and one of dbias a block
(the shipped grid, 4 blocks of 512 an SM: 528 x 4096 x 2 rows, 17 MB written and read back by
norm_param_grad, ~11 us of traffic at the H100's ceiling, 8% of the rows' own). Fewer blocks an SM
write fewer partial rows and keep fewer rows in flight; this times layer_norm_backward (CuPy API,
both partials wanted) at 1-4 blocks an SM for each entry (config.norm_full_rows False / True), the
plan forced by replacing rawops.norm.backward_plan for the call, beside torch's backward in the same
rounds. Bytes: dy and x read, dx written. Experiment, not a bench.
    python dev/time_norm_bwd_blocks.py
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


def main():
    ceiling = timing.copy_ceiling_tbps()
    sms = sm_count(0)
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy ceiling {ceiling:.2f} TB/s")
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(ROWS, N, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
        b = torch.rand(N, device="cuda", dtype=dtype)
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        X, DY, W, M, R = (cupy.from_dlpack(t) for t in (x, dy, w, mean, rstd))
        want = None
        nbytes = 3 * x.numel() * x.element_size()
        original = norm.backward_plan
        default = original(ROWS, N, x.element_size(), sms, DY.data.ptr, X.data.ptr, W.data.ptr, 0)
        xt = x.detach().requires_grad_()
        wt, bt = w.detach().requires_grad_(), b.detach().requires_grad_()
        yt = torch.nn.functional.layer_norm(xt, (N,), wt, bt)
        fns = {"torch": lambda: torch.autograd.grad(yt, (xt, wt, bt), dy, retain_graph=True)}
        for full in (False, True):
            for per_sm in (4, 3, 2, 1):
                forced = (default[0], sms * per_sm, default[2])

                def plan(rows, n, itemsize, sms_, *args, forced=forced, **kw):
                    mode, blocks, threads = forced
                    aligned = original(rows, n, itemsize, sms_, *args, **kw)[4]
                    return mode, blocks, threads, _rows.chunks(mode, blocks, threads), aligned

                def call(plan=plan, full=full):
                    norm.backward_plan, saved = plan, config.norm_full_rows
                    config.norm_full_rows = full
                    try:
                        return norm.layer_norm_backward(DY, X, W, M, R)
                    finally:
                        norm.backward_plan, config.norm_full_rows = original, saved
                got = [torch.from_dlpack(a) for a in call()]
                if want is None:
                    want = got
                same = all(torch.equal(g, h) for g, h in zip(got[:1], want[:1]))
                close = all(torch.allclose(g.float(), h.float(), rtol=1e-3, atol=1e-2) for g, h in zip(got, want))
                label = f"{'full rows' if full else 'block a row'} x{per_sm}/SM"
                print(f"  {dtype} {label}: dx {'equal' if same else 'DIFFERS'}, dw/db {'close' if close else 'FAR'}",
                      flush=True)
                fns[label] = call
        times = timing.device_times_us(fns, reps=10, rounds=5)
        print(f"== layer_norm bwd {dtype} {ROWS}x{N} (default plan {default[:3]})")
        for label, us in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"  {label:24s} {us:8.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of the ceiling  "
                  f"{times['torch'] / us:.2f}x torch", flush=True)


if __name__ == "__main__":
    main()
