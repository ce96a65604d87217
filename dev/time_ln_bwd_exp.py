"""The 16-bit layer_norm backward's per-row overhead (issue 26: 0.74 of the H200's copy ceiling at
16384 x 4096, bar 0.85): dev/ln_bwd_exp.cu's entries (incremental row pointers, RAWOPS_EXP_PTR; a
butterfly row reduction, RAWOPS_EXP_RED; both; neither, the rewrite's own baseline) in place of
the shipped layer_norm_bwd_<dtype> (and layer_norm_bwd_full_<dtype>, which the plan takes at
4096), timed beside it in interleaved rounds through rawops.norm.layer_norm_backward (so the
launch plan, grid and partial rows are the shipped ones).
Each variant's dx, dweight and dbias must equal the shipped kernel's bit for bit. Prints us and
the fraction of the copy ceiling (dy, x read; dx written). Experiment, not a bench.
    python dev/time_ln_bwd_exp.py     (cubins built where nvcc is: carry dev/.cubins)
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_cubins  # noqa: E402

from rawops import _modules, norm  # noqa: E402

ROWS, N = 16384, 4096
SOURCE = os.path.join(HERE, "ln_bwd_exp.cu")
VARIANTS = {
    "rewrite": [],
    "ptr": ["RAWOPS_EXP_PTR=1"],
    "red": ["RAWOPS_EXP_RED=1"],
    "ptr+red": ["RAWOPS_EXP_PTR=1", "RAWOPS_EXP_RED=1"],
}
CACHES = ((_modules, "_functions"), (_modules, "_pointers"), (_modules, "_shared_allowed"), (norm, "_backward_configs"),
          (norm, "_bulk_plans"))


class Variant:
    """The experiment's entry served as layer_norm_bwd_<suffix>: rawops' caches of its own,
    swapped in around each call, with the entry under the shipped name."""

    def __init__(self, path):
        self.module = cupy.RawModule(path=path)
        self.caches = [{} for _ in CACHES]
        for suffix in ("bf16", "f16"):
            kernel = self.module.get_function(f"layer_norm_bwd_exp_{suffix}")
            for name in (f"layer_norm_bwd_{suffix}", f"layer_norm_bwd_full_{suffix}"):  # what the plan may pick
                key = ("norm", name, 0)
                self.caches[0][key] = kernel
                self.caches[1][key] = kernel.kernel.ptr

    def __call__(self, fn):
        saved = [getattr(m, n) for m, n in CACHES]
        for (m, n), cache in zip(CACHES, self.caches):
            setattr(m, n, cache)
        try:
            return fn()
        finally:
            for (m, n), cache in zip(CACHES, saved):
                setattr(m, n, cache)


def same_bits(a, b):
    return a is None and b is None or bool((a.view(cupy.uint16) == b.view(cupy.uint16)).all())


def main():
    paths = build_cubins(SOURCE, VARIANTS, "90")
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s; {ROWS} x {N}")
    variants = {k: Variant(p) for k, p in paths.items()}
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(ROWS, N, device="cuda", dtype=dtype) * 2 + 3
        dy = torch.randn_like(x)
        w = (torch.rand(N, device="cuda") + 0.5).to(dtype)
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        X, DY, W, M, R = (cupy.from_dlpack(t) for t in (x, dy, w, mean, rstd))
        call = lambda: norm.layer_norm_backward(DY, X, W, M, R)  # noqa: E731
        shipped = call()
        fns = {"shipped": call}
        print(f"== {dtype}")
        for name, variant in variants.items():
            out = variant(call)
            same = [same_bits(a, b) for a, b in zip(out, shipped)]
            print(f"  {name:8s} dx, dweight, dbias bit-identical to the shipped kernel's: {same}")
            fns[name] = lambda v=variant: v(call)
        nbytes = 3 * x.numel() * x.element_size()
        times = timing.device_times_us(fns, reps=20, rounds=7)
        for name, us in times.items():
            tbps = nbytes / us / 1e6
            print(f"  {name:8s} {us:8.1f} us  {tbps:5.2f} TB/s  {tbps / ceiling:.3f} of ceiling")
        del fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
