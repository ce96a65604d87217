"""Variants of the norm kernels side by side, in one run on one GPU: each variant is a cubin
of kernels/norm.cu built with other switches (or from another commit), loaded directly and
launched with its own plan, checked against torch in float64 and timed against torch.

    python bench/sweep_norm.py NAME=PATH[:PLAN] ... [--rows 16384] [--n 4096] [--out DIR]

PLAN is `resident` (the grid the occupancy API says fills each SM once; register modes get
their dweight/dbias columns in dynamic shared memory, as rawops/norm.py launches them) or
`v6` (the grid and launch of commit 47f7af2: 2048 threads an SM, no dynamic shared memory).
Times: CUDA events, median of 40 after warm-up; backward = the row kernel + norm_param_grad.
"""
import argparse
import os
import statistics
import sys

import cupy
import torch
import torch.nn.functional as F
from cupy_backends.cuda.api import driver

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from rawops import _rows, norm  # noqa: E402
from rawops._launch import launch  # noqa: E402
from timing import device_time_us  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def rel_err(got, ref):
    got = got.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).norm() / ref.norm()).item()


class Variant:
    def __init__(self, name, path, plan):
        self.name, self.plan = name, plan
        self.module = cupy.RawModule(path=path)
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def function(self, name, smem=0):
        f = self.module.get_function(name)
        if smem > 48 * 1024:
            f.max_dynamic_shared_size_bytes = smem
        return f

    def backward(self, op, dtype, dy, x, w, mean, rstd, want_db):
        rows, n = x.shape
        itemsize = x.element_size()
        aligned = _rows.vectors(n, itemsize, dy.data_ptr(), x.data_ptr(), w.data_ptr())
        mode, blocks, threads = _rows.row_plan(rows, n, _rows.BWD_BYTES // itemsize, itemsize, aligned)
        partials = 1 + int(want_db)
        if self.plan == "v6":
            smem = 0
            blocks = min(blocks, _rows.resident_blocks(self.sms, threads))
        else:
            smem = norm.column_smem(mode, threads, itemsize, partials)
        f = self.function(f"{op}_bwd_{dtype}", smem)
        if self.plan != "v6":
            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, threads, smem)
            blocks = min(blocks, self.sms * max(1, per_sm))
        chunks = _rows.chunks(mode, blocks, threads)
        g = self.function(f"norm_param_grad_{dtype}")
        dx = torch.empty_like(x)
        pdw = torch.empty((chunks, n), dtype=torch.float32, device="cuda")
        pdb = torch.empty((chunks, n), dtype=torch.float32, device="cuda") if want_db else None
        dw = torch.empty_like(w)
        db = torch.empty_like(w) if want_db else None
        stream = torch.cuda.current_stream().cuda_stream
        args = (dy.data_ptr(), x.data_ptr(), w.data_ptr(), mean.data_ptr() if mean is not None else 0,
                rstd.data_ptr(), dx.data_ptr(), pdw.data_ptr(), pdb.data_ptr() if want_db else 0, rows, n, mode,
                aligned | 2)
        gargs = (pdw.data_ptr(), pdb.data_ptr() if want_db else 0, dw.data_ptr(), db.data_ptr() if want_db else 0,
                 chunks, n)

        def rows_kernel():
            launch(f.kernel.ptr, (blocks,), threads, smem, stream, args, norm.BWD_KINDS, 0)

        def param_grad():
            launch(g.kernel.ptr, (-(-n // norm.PARAM_GRAD_COLUMNS), 2), norm.PARAM_GRAD_THREADS, 0, stream, gargs,
                   norm.PARAM_GRAD_KINDS, 0)

        def run():
            rows_kernel()
            param_grad()
        split = f"rows kernel {device_time_us(rows_kernel, reps=20):.1f} + param_grad {device_time_us(param_grad, reps=20):.1f} us"
        return run, (dx, dw, db), f"{blocks}x{threads} smem {smem} regs {f.num_regs} | {split}"

    def forward(self, op, dtype, x, w, b):
        rows, n = x.shape
        itemsize = x.element_size()
        aligned = _rows.vectors(n, itemsize, x.data_ptr(), w.data_ptr(), b.data_ptr())
        mode, blocks, threads = norm.forward_plan(rows, n, itemsize, aligned)
        f = self.function(f"{op}_fwd_{dtype}")
        y = torch.empty_like(x)
        mean = torch.empty(rows, dtype=torch.float32, device="cuda")
        rstd = torch.empty(rows, dtype=torch.float32, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        has_b = op == "layer_norm"
        args = (x.data_ptr(), w.data_ptr(), b.data_ptr() if has_b else x.data_ptr(), y.data_ptr(), mean.data_ptr(),
                rstd.data_ptr(), rows, n, mode, aligned | 2 | (4 if has_b else 0), 1e-5)

        def run():
            launch(f.kernel.ptr, (blocks,), threads, 0, stream, args, norm.FWD_KINDS, 0)
        return run, y, f"{blocks}x{threads} regs {f.num_regs}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--dtypes", default="f16,bf16,f32")
    parser.add_argument("--skip-forward", action="store_true")
    args = parser.parse_args()
    variants = []
    for spec in args.variants:
        name, rest = spec.split("=", 1)
        path, _, plan = rest.partition(":")
        variants.append(Variant(name, path, plan or "resident"))
    rows, n = args.rows, args.n
    table = []
    for dname in args.dtypes.split(","):
        dt = DTYPES[dname]
        torch.manual_seed(0)
        x, dy = torch.randn(rows, n, device="cuda", dtype=dt), torch.randn(rows, n, device="cuda", dtype=dt)
        w = (torch.randn(n, device="cuda") * 0.5 + 1).to(dt)
        b = (torch.randn(n, device="cuda") * 0.5).to(dt)
        xf = x.float()
        mean = xf.mean(-1)
        rstd_ln = (xf.var(-1, unbiased=False) + 1e-5).rsqrt()
        rstd_rms = (xf.pow(2).mean(-1) + 1e-5).rsqrt()
        del xf
        nbytes_bwd = 3 * x.numel() * x.element_size()
        nbytes_fwd = 2 * x.numel() * x.element_size()
        for op in ("layer_norm", "rms_norm"):
            ln = op == "layer_norm"
            leaves = [t.double().requires_grad_() for t in (x, w, b)]
            y64 = (F.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5) if ln
                   else F.rms_norm(leaves[0], (n,), leaves[1], 1e-5))
            ref = torch.autograd.grad(y64, leaves[:3] if ln else leaves[:2], dy.double())
            y64 = y64.detach()
            del leaves
            tl = [t.detach().clone().requires_grad_() for t in (x, w, b)]
            ty = F.layer_norm(tl[0], (n,), tl[1], tl[2], 1e-5) if ln else F.rms_norm(tl[0], (n,), tl[1], 1e-5)
            torch_bwd = device_time_us(lambda: torch.autograd.grad(ty, tl[:3] if ln else tl[:2], dy,
                                                                   retain_graph=True), reps=40)
            torch_fwd = device_time_us(lambda: (F.layer_norm(x, (n,), w, b, 1e-5) if ln
                                                else F.rms_norm(x, (n,), w, 1e-5)), reps=40)
            del ty, tl
            for v in variants:
                run, outs, info = v.backward(op, dname, dy, x, w, mean if ln else None, rstd_ln if ln else rstd_rms,
                                             ln)
                run()
                torch.cuda.synchronize()
                errs = [rel_err(o, r) for o, r in zip(outs, ref) if o is not None]
                us = device_time_us(run, reps=40)
                row = (f"{op[:2]} bwd {dname:4s} {v.name:10s} {us:7.1f} us {nbytes_bwd / us / 1e6:5.2f} TB/s "
                       f"{torch_bwd / us:4.2f}x torch({torch_bwd:6.1f}) err " + " ".join(f"{e:.1e}" for e in errs)
                       + f" | {info}")
                print(row, flush=True)
                table.append(row)
                if not args.skip_forward:
                    run, y, info = v.forward(op, dname, x, w, b)
                    run()
                    torch.cuda.synchronize()
                    err = rel_err(y, y64)
                    us = device_time_us(run, reps=40)
                    row = (f"{op[:2]} fwd {dname:4s} {v.name:10s} {us:7.1f} us {nbytes_fwd / us / 1e6:5.2f} TB/s "
                           f"{torch_fwd / us:4.2f}x torch({torch_fwd:6.1f}) err {err:.1e} | {info}")
                    print(row, flush=True)
                    table.append(row)
            del ref, y64
            torch.cuda.empty_cache()
    print("\n".join(["", "== summary"] + table))


if __name__ == "__main__":
    main()
