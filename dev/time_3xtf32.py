"""The float32 3xTF32 GEMM (config.f32_3xtf32, gemm_sm90_nt_3xtf32_*) with its stages' sums promoted
every stage (shipped: each stage's WGMMAs waited on before their FADD) against cubins of variants
(dev/cubins.py): RAWOPS_GEMM_SM90_PROMOTE_STAGES=2 / 3 pipeline that many stages in the partial
sums before the FADD (fewer waits; the tensor core sums 64 / 96 terms). Through rawops.gemm.launch_gemm
on the linear_gelu and matmul bench shapes, each variant's error against float64 beside torch
float32's (TF32 off), times in interleaved rounds beside torch. Experiment, not a bench.
    python dev/cubins.py 90 gemm_sm90 RAWOPS_GEMM_SM90_PROMOTE_STAGES=3   (or carry dev/.cubins)
    python dev/time_3xtf32.py [stages ...]   (default: 3)
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
import rawops.gemm as mm  # noqa: E402

# (what, layout, m, n, k): C (m, n) = A B as rawops.gemm.launch_gemm takes it
SHAPES = [("linear fwd x W^T", "nt", 8192, 3072, 768), ("linear dx dpre W", "nn", 8192, 768, 3072),
          ("linear dW dpre^T x", "tn", 3072, 768, 8192), ("matmul", "nn", 4096, 4096, 4096),
          ("matmul", "nn", 8192, 8192, 8192)]


def operands(layout, m, n, k):
    a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda")
    b = torch.randn((k, n) if layout[1] == "n" else (n, k), device="cuda")
    a2 = a if layout[0] == "n" else a.t()
    b2 = b if layout[1] == "n" else b.t()
    return a, b, a2, b2


def variant(layout, a, b, c, m, n, k, module=None):
    """The 3xTF32 launch with its kernel from `module` (a cubin) or the library; each variant keeps
    its own plan caches (they hold the function pointer), so no call plans again."""
    plans, split3 = {}, {}
    shipped = _gemm_sm90.function
    function = function_of(module) if module is not None else None

    def workspace(nbytes):
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return t.data_ptr(), t

    def call():
        saved = mm._plans, _gemm_tf32._split3_plans
        mm._plans, _gemm_tf32._split3_plans = plans, split3
        if module is not None:
            _gemm_sm90.function = function
        try:
            owners = mm.launch_gemm(0, layout, 0, a.data_ptr(), b.data_ptr(), c.data_ptr(), 0, 0, 0, m, n, k,
                                    mm.EPI_NONE, torch.cuda.current_stream().cuda_stream, workspace)
        finally:
            _gemm_sm90.function = shipped
            mm._plans, _gemm_tf32._split3_plans = saved
        assert any(p[4] == -1 for p in plans.values()), "not the 3xTF32 path"
        return owners
    return call


def main():
    config.f32_3xtf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    stages = [int(s) for s in sys.argv[1:]] or [3]
    modules = build_modules("gemm_sm90", {s: [f"RAWOPS_GEMM_SM90_PROMOTE_STAGES={s}"] for s in stages})
    print(torch.cuda.get_device_name())
    for what, layout, m, n, k in SHAPES:
        a, b, a2, b2 = operands(layout, m, n, k)
        ref = a2.double() @ b2.double()
        rel = lambda c: float((c.double() - ref).norm() / ref.norm())  # noqa: E731
        outs = {"shipped (1 stage)": torch.empty(m, n, device="cuda")}
        calls = {"shipped (1 stage)": variant(layout, a, b, outs["shipped (1 stage)"], m, n, k)}
        for s in stages:
            outs[f"{s} stages"] = torch.empty(m, n, device="cuda")
            calls[f"{s} stages"] = variant(layout, a, b, outs[f"{s} stages"], m, n, k, modules[s])
        calls["torch f32"] = lambda: a2 @ b2
        errors = {"torch f32": rel(a2 @ b2)}
        for name, fn in calls.items():
            if name != "torch f32":
                fn()
                torch.cuda.synchronize()
                errors[name] = rel(outs[name])
        times = timing.device_times_us(calls, warmup=3, reps=5, rounds=3)
        print(f"== {what} ({layout}) M {m} N {n} K {k}")
        for name, us in times.items():
            print(f"  {name:20s} {us:9.1f} us {2 * m * n * k / us / 1e6:6.1f} TFLOP/s {times['torch f32'] / us:5.2f}x "
                  f"torch  error {errors[name]:.2e} ({errors[name] / errors['torch f32']:.2f}x torch's)")


if __name__ == "__main__":
    main()
