"""TF32 GEMMs on the H100: the Hopper kernel (kernels/matmul_sm90.cu, WGMMA; nn and tn after
their M/N-major operands are copied transposed) against the mma.sync kernels
(rawops._gemm_tf32.HOPPER off) and cuBLAS TF32 (torch with allow_tf32), in each layout, with
each result's relative error against float64.

    python bench/explore_tf32_hopper.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 768, 3072)]  # (M, K, N)


def main():
    sys.path.insert(0, HERE)
    from timing import device_times_us, start, switched, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import _gemm_tf32 as tf
    from rawops import torch_adapter as ta

    rows = []
    for m, k, n in SHAPES:
        a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        ref = a.double() @ b.double()
        stored = {"nn": (a, b), "nt": (a, b.t().contiguous()), "tn": (a.t().contiguous(), b)}
        for layout, (x, y) in stored.items():
            ours = lambda layout=layout, x=x, y=y: _ours(ta, layout, x, y, m, n, k)  # noqa: E731
            theirs = {"nn": lambda x=x, y=y: x @ y, "nt": lambda x=x, y=y: x @ y.t(),
                      "tn": lambda x=x, y=y: x.t() @ y}[layout]

            def cublas(theirs=theirs):
                torch.backends.cuda.matmul.allow_tf32 = True
                try:
                    return theirs()
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = False

            def mma(ours=ours):
                tf._plans.clear()
                return switched(tf, "HOPPER", False, ours)()

            # Plans are cached without the switch's state: clear them whenever it flips.
            tf._plans.clear()
            errors = {"hopper": ours(), "mma.sync": mma(), "cuBLAS": cublas()}
            errors = {name: ((c.double() - ref).norm() / ref.norm()).item() for name, c in errors.items()}
            tf._plans.clear()
            times = device_times_us({"hopper": ours, "cuBLAS": cublas}, warmup=3, reps=10, rounds=3)
            tf._plans.clear()
            with_mma = device_times_us({"mma.sync": switched(tf, "HOPPER", False, ours)}, warmup=2, reps=5, rounds=1)
            tf._plans.clear()
            flops = 2 * m * n * k
            row = {"layout": layout, "shape": f"{m}x{k}x{n}", "hopper us": times["hopper"],
                   "mma.sync us": with_mma["mma.sync"], "cuBLAS us": times["cuBLAS"],
                   "hopper TFLOP/s": flops / times["hopper"] / 1e6, "x cuBLAS": times["cuBLAS"] / times["hopper"],
                   "hopper err": errors["hopper"], "mma.sync err": errors["mma.sync"], "cuBLAS err": errors["cuBLAS"]}
            rows.append(row)
            print(row, flush=True)
        del a, b, ref, stored
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_tf32_hopper", "python bench/explore_tf32_hopper.py", [
        ("float32 GEMM on TF32 tensor cores, H100: the Hopper kernel, mma.sync, cuBLAS",
         list(rows[0]), rows, {"flops": "2MNK", "nn, tn": "include the transposed copies of b (nn), a and b (tn)"})])
    return 0


def _ours(ta, layout, x, y, m, n, k):
    """C = A B through the adapter's GEMM launcher with tf32 on, operands stored for `layout`."""
    c = torch.empty(m, n, device="cuda")
    ta._gemm(0, layout, 0, x.data_ptr(), y.data_ptr(), c.data_ptr(), m, n, k, tf32=True)
    return c


if __name__ == "__main__":
    sys.exit(main())
