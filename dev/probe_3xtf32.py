"""Would 3xTF32 on the Hopper GEMM give float32 its accuracy at tensor-core speed (issue 26 items 4
and 5: matmul / linear_gelu float32 at 0.83-0.89x torch on FFMA)? No kernel change: each operand is
split in torch into TF32 parts, big + small, laid side by side along K, and the shipped TF32 nt
kernel (gemm_sm90_nt_tf32, through rawops.torch_adapter.gemm._launch) runs over K' = 3K:
  A' = [a_small | a_big | a_big],  B' = [b_big | b_small | b_big]   (small terms summed first)
Splits: "trunc" big = x with the low 13 bits cleared (as the tensor core reads float32 as TF32 if
it truncates), small = x - big; "rna" big = x rounded to TF32, small = (x - big) rounded too, so
the tensor core reads both exactly whatever it does with low bits. "4x" adds a_small b_small.
Prints each one's relative-norm error against float64 beside torch float32 (TF32 off) and
rawops' exact FFMA, and the times of the K' GEMM against torch float32 and single TF32.
"promoted": the same 3x rna through a cubin built with RAWOPS_GEMM_SM90_PROMOTE=1 (each stage's
WGMMAs summed apart, then added to the accumulators by FADD), 128-wide tiles (the shipped kernel
forced to them beside it: config.gemm_sm90_shape).
Experiment, not a bench.
    python dev/cubins.py 90 gemm_sm90 RAWOPS_GEMM_SM90_PROMOTE=1   (or carry dev/.cubins)
    python dev/probe_3xtf32.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules, function_of  # noqa: E402

from rawops import _gemm_sm90, _gemm_tf32, config  # noqa: E402
from rawops.torch_adapter import gemm as ta_gemm  # noqa: E402

PROMOTED = build_modules("gemm_sm90", {"promoted": ["RAWOPS_GEMM_SM90_PROMOTE=1"]})["promoted"]

SHAPES = [(1, 3072, 768), (32, 3072, 768), (8192, 3072, 768), (8192, 768, 3072), (4096, 4096, 4096),
          (8192, 8192, 8192)]
LOW = 0x1FFF  # the 13 mantissa bits TF32 drops


def trunc(x):
    return (x.view(torch.int32) & ~LOW).view(torch.float32)


def rna(x):  # round to nearest, ties away (on the magnitude: the sign bit is apart)
    return ((x.view(torch.int32) + 0x1000) & ~LOW).view(torch.float32)


def split(x, how):
    if how == "trunc":
        big = trunc(x)
        return big, x - big
    big = rna(x)
    return big, rna(x - big)


def nt(a, b, tf32=True):
    """a (M, K) @ b (N, K)^T by the Hopper TF32 kernel (or exact FFMA with tf32=False)."""
    c = a.new_empty(a.shape[0], b.shape[0])
    ta_gemm._launch(a.get_device(), "nt", 0, a.data_ptr(), b.data_ptr(), c.data_ptr(), a.shape[0], b.shape[0],
                    a.shape[1], tf32=tf32)
    return c


def narrow(fn, module=None):
    """fn on 128-wide tiles, its kernel from `module` (a cubin) when given, else the shipped one."""
    shipped = _gemm_sm90.function
    function = function_of(module) if module is not None else None

    def call():
        _gemm_tf32._plans.clear()  # the plans hold the function pointer
        config.gemm_sm90_shape = (128, 1)
        if module is not None:
            _gemm_sm90.function = function
        try:
            return fn()
        finally:
            _gemm_sm90.function = shipped
            config.gemm_sm90_shape = None
            _gemm_tf32._plans.clear()
    return call


def stacked(a, b, how):
    (ab, as_), (bb, bs) = split(a, how), split(b, how)
    if how == "4x":
        return torch.cat([as_, as_, ab, ab], 1).contiguous(), torch.cat([bs, bb, bs, bb], 1).contiguous()
    return torch.cat([as_, ab, ab], 1).contiguous(), torch.cat([bb, bs, bb], 1).contiguous()


def rel(c, ref):
    return float((c.double() - ref).norm() / ref.norm())


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name())
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", generator=g)
        b = torch.randn(n, k, device="cuda", generator=g)
        ref = a.double() @ b.double().T
        errs = {"torch f32": rel(a @ b.T, ref), "rawops FFMA": rel(nt(a, b, False), ref), "tf32": rel(nt(a, b), ref)}
        ops = {}
        for how in ("trunc", "rna", "4x"):
            a3, b3 = stacked(a, b, "rna" if how == "4x" else how)
            errs[f"3x {how}" if how != "4x" else "4x rna"] = rel(nt(a3, b3), ref)
            ops[how] = (a3, b3)
        a3, b3 = ops["rna"]
        errs["3x n128"] = rel(narrow(lambda: nt(a3, b3))(), ref)
        errs["3x promoted"] = rel(narrow(lambda: nt(a3, b3), PROMOTED)(), ref)
        line = "  ".join(f"{key} {v:.2e} ({v / errs['torch f32']:.2f}x)" for key, v in errs.items())
        print(f"M {m} N {n} K {k}: {line}")
        if m < 8192:
            continue
        a3, b3 = ops["rna"]
        a4, b4 = ops["4x"]
        flops = 2 * m * n * k
        calls = {"torch f32": lambda: a @ b.T, "rawops FFMA": lambda: nt(a, b, False),
                 "tf32 (1 pass)": lambda: nt(a, b), "3x (K' = 3K)": lambda: nt(a3, b3),
                 "4x (K' = 4K)": lambda: nt(a4, b4),
                 "tf32 n128": narrow(lambda: nt(a, b)), "3x n128": narrow(lambda: nt(a3, b3)),
                 "3x promoted n128": narrow(lambda: nt(a3, b3), PROMOTED),
                 "split a and b (torch ops)": lambda: stacked(a, b, "rna")}
        times = timing.device_times_us(calls, warmup=3, reps=5, rounds=3)
        for key, us in times.items():
            print(f"  {key:28s} {us:9.1f} us  {flops / us / 1e6:7.1f} TFLOP/s  {times['torch f32'] / us:.2f}x torch")


if __name__ == "__main__":
    main()
