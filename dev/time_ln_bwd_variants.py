"""The 16-bit layer_norm backward's variants side by side (issue 26: 0.69-0.71 of the H200's copy
ceiling at 16384 x 4096, bar 0.85), from cubins built by dev/cubins.py with kernels/norm.cu's
switches: RAWOPS_DEV_NORM_FMA (x-hat and dx as two FMAs each), RAWOPS_DEV_LN_BULK (the bulk path
rms_norm takes), RAWOPS_DEV_LN_K2 (two row sums, not three: torch's formula), RAWOPS_DEV_LN_MAXNREG
(__maxnreg__ in place of the (512, 2) bound) and RAWOPS_ROW_BWD_VECTORS (vectors a thread holds; the
plan's _rows.BWD_BYTES set to match), each with 0, 1 and 2 bulk stages
(rawops.norm.STAGES["layer_norm"]). Each variant's kernels replace the shipped module's by swapping
rawops._modules' and rawops.norm's caches per call. Prints us and the fraction of the copy ceiling
(dy, x read; dx written), and each variant's relative-norm error of dx, dweight, dbias against
float64. Experiment, not a bench.
    python dev/cubins.py 90 norm RAWOPS_DEV_LN_BULK=1 ...   (where nvcc is; carry dev/.cubins)
    python dev/time_ln_bwd_variants.py"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_cubins  # noqa: E402

from rawops import _modules, _rows, norm  # noqa: E402

ROWS, N = 16384, 4096
VARIANTS = {
    "ship": [],
    "k2": ["RAWOPS_DEV_LN_K2=1"],
    "bulk64": ["RAWOPS_DEV_LN_BULK=1"],
    "bulk64k2": ["RAWOPS_DEV_LN_BULK=1", "RAWOPS_DEV_LN_K2=1"],
    "bulk80": ["RAWOPS_DEV_LN_BULK=1", "RAWOPS_DEV_LN_MAXNREG=80"],
    "bulk80k2": ["RAWOPS_DEV_LN_BULK=1", "RAWOPS_DEV_LN_K2=1", "RAWOPS_DEV_LN_MAXNREG=80"],
    "reg80k2": ["RAWOPS_DEV_LN_K2=1", "RAWOPS_DEV_LN_MAXNREG=80"],
    "fma": ["RAWOPS_DEV_NORM_FMA=1"],
    "fmak2": ["RAWOPS_DEV_NORM_FMA=1", "RAWOPS_DEV_LN_K2=1"],
    "vec4fmak2": ["RAWOPS_ROW_BWD_VECTORS=4", "RAWOPS_DEV_NORM_FMA=1", "RAWOPS_DEV_LN_K2=1"],
    "vec4r96fmak2": ["RAWOPS_ROW_BWD_VECTORS=4", "RAWOPS_DEV_NORM_FMA=1", "RAWOPS_DEV_LN_K2=1",
                     "RAWOPS_DEV_LN_MAXNREG=96"],
    "bulk80fmak2": ["RAWOPS_DEV_LN_BULK=1", "RAWOPS_DEV_LN_K2=1", "RAWOPS_DEV_LN_MAXNREG=80", "RAWOPS_DEV_NORM_FMA=1"],
}
CACHES = ((_modules, "_functions"), (_modules, "_pointers"), (_modules, "_shared_allowed"),
          (norm, "_backward_configs"), (norm, "_bulk_plans"))


class Variant:
    """A cubin's norm kernels with caches of their own, swapped in around each call."""

    def __init__(self, path, macros):
        self.module = cupy.RawModule(path=path)
        self.caches = [{} for _ in CACHES]
        vectors = [int(m.split("=")[1]) for m in macros if m.startswith("RAWOPS_ROW_BWD_VECTORS=")]
        self.bwd_bytes = 16 * vectors[0] if vectors else _rows.BWD_BYTES  # the plan's, to match the kernel's

    def __call__(self, fn, stages):
        saved = [getattr(m, n) for m, n in CACHES]
        saved_module = _modules._modules.get(("norm", 0))
        for (m, n), cache in zip(CACHES, self.caches):
            setattr(m, n, cache)
        _modules._modules[("norm", 0)] = self.module
        norm.STAGES["layer_norm"] = (stages, stages)
        shipped_bytes, _rows.BWD_BYTES = _rows.BWD_BYTES, self.bwd_bytes
        try:
            return fn()
        finally:
            for (m, n), cache in zip(CACHES, saved):
                setattr(m, n, cache)
            _modules._modules[("norm", 0)] = saved_module
            _rows.BWD_BYTES = shipped_bytes
            norm.STAGES.pop("layer_norm", None)


def rel(a, b):
    a = torch.from_dlpack(a.astype(cupy.float32)).double()
    return float((a - b).norm() / b.norm())


def main():
    paths = build_cubins("norm", VARIANTS, "90")
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s; {ROWS} x {N}")
    variants = {k: Variant(p, VARIANTS[k]) for k, p in paths.items()}
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(ROWS, N, device="cuda", dtype=dtype) * 2 + 3
        dy = torch.randn_like(x)
        w = (torch.rand(N, device="cuda") + 0.5).to(dtype)
        b = torch.randn(N, device="cuda").to(dtype)
        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        b64 = b.double().requires_grad_()
        torch.nn.functional.layer_norm(x64, (N,), w64, b64, 1e-5).backward(dy.double())
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        X, DY, W, M, R = (cupy.from_dlpack(t) for t in (x, dy, w, mean, rstd))
        call = lambda: norm.layer_norm_backward(DY, X, W, M, R)  # noqa: E731
        fns = {}
        print(f"== {dtype}")
        for name, variant in variants.items():
            for stages in (0, 1, 2) if "bulk" in name else (0,):  # stages: the bulk path's alone
                dx, dw, db = variant(call, stages)
                print(f"  {name:9s} stages {stages}: rel err dx {rel(dx, x64.grad):.2e} dw {rel(dw, w64.grad):.2e} "
                      f"db {rel(db, b64.grad):.2e}")
                fns[f"{name} stages {stages}"] = lambda v=variant, s=stages: v(call, s)
        nbytes = 3 * x.numel() * x.element_size()
        times = timing.device_times_us(fns, reps=20, rounds=5)
        for name, us in times.items():
            tbps = nbytes / us / 1e6
            print(f"  {name:20s} {us:8.1f} us  {tbps:5.2f} TB/s  {tbps / ceiling:.3f} of ceiling")
        del fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
