"""The experts' weight gradients (gemm_sm90_grouped_tn) with the epilogue moved under the next tile's
main loop (issue 28: Mixtral's dW at 0.78 of cuBLAS dense; an expert's ~570 rows are 9 stages a tile,
then the consumers stop the tensor cores for the tile's 64 KB store). Variants of kernels/gemm_sm90.cu
as cubins (dev/cubins.py):
  before       the store of every slab at the tile's end, generic (64-bit) stores into shared memory
  sts          the same, st.shared at 32-bit addresses (RAWOPS_GEMM_SM90_STS: every Hopper entry)
  defer        the tile's values packed into 64 registers, one slab stored a stage during the next
               tile's main loop (RAWOPS_GEMM_SM90_WGRAD_DEFER: the grouped tn entries only)
  defer + sts  both
each launched through the library (its function swapped), outputs checked against the library's
(max |diff|, 0 when bit-identical), times in interleaved rounds beside torch._grouped_mm and cuBLAS
dense of the same M N K; the grouped forward (nt) too, which `sts` changes. Experiment, not a bench.
    python dev/cubins.py 90 gemm_sm90 ...   (or carry dev/.cubins)
    python dev/time_wgrad.py [variant ...]   (default: all four; names as in VARIANTS)
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import _gemm_sm90  # noqa: E402
from rawops import moe as _moe  # noqa: E402
from rawops.torch_adapter import moe as ta_moe  # noqa: E402

OFF = ["RAWOPS_GEMM_SM90_WGRAD_DEFER=0", "RAWOPS_GEMM_SM90_STS=0"]
VARIANTS = {"before": OFF,
            "sts": ["RAWOPS_GEMM_SM90_WGRAD_DEFER=0", "RAWOPS_GEMM_SM90_STS=1"],
            "defer": ["RAWOPS_GEMM_SM90_WGRAD_DEFER=1", "RAWOPS_GEMM_SM90_STS=0"],
            "defer + sts": ["RAWOPS_GEMM_SM90_WGRAD_DEFER=1", "RAWOPS_GEMM_SM90_STS=1"]}
SHAPES = [("mixtral", 16384, 4096, 14336, 64, 2), ("qwen3", 16384, 2048, 768, 128, 8)]


def variant_call(fn, module):
    shipped = _gemm_sm90.function

    kept = {}  # RawKernel objects stay alive while their CUfunction pointers are used

    def function(name, device, shared=_gemm_sm90.SHARED_BYTES):
        kernel = kept.get(name)
        if kernel is None:
            kernel = kept[name] = module.get_function(name)
        if shared > kernel.max_dynamic_shared_size_bytes:
            kernel.max_dynamic_shared_size_bytes = shared
        return kernel.kernel.ptr

    def call():
        _gemm_sm90.function = function
        try:
            return fn()
        finally:
            _gemm_sm90.function = shipped
    return call


def report(title, calls, flops, ref):
    for label in list(calls):
        if label in VARIANTS:
            err = float((calls[label]().float() - ref.float()).abs().max())
            calls[f"{label} (max diff {err:.1e})"] = calls.pop(label)
    times = timing.device_times_us(calls, reps=5, rounds=5)
    dense = times.get("cuBLAS dense")
    print(f"== {title}")
    for label, us in times.items():
        of = f"  {dense / us:.3f} of dense" if dense else ""
        print(f"  {label:34s} {us:9.1f} us  {flops / us / 1e6:6.1f} TFLOP/s{of}")
    sys.stdout.flush()


def main():
    print(torch.cuda.get_device_name())
    for label in [v for v in VARIANTS if sys.argv[1:] and v not in sys.argv[1:]]:
        del VARIANTS[label]
    modules = build_modules("gemm_sm90", VARIANTS)
    dtype = torch.bfloat16
    for name, tokens, hidden, inter, experts, k in SHAPES:
        logits = torch.randn(tokens, experts, device="cuda", dtype=dtype)
        _, ids, _ = ta_moe.route(logits, k, _moe.score_flags("softmax", True))
        xp, offsets, _, _ = ta_moe.permute(torch.randn(tokens, hidden, device="cuda", dtype=dtype), ids, experts, 128)
        rows, ends, used = xp.shape[0], offsets[1:].contiguous(), int(offsets[-1])
        hp = torch.randn(rows, inter, device="cuda", dtype=dtype)
        dgu = torch.randn(rows, 2 * inter, device="cuda", dtype=dtype)
        dy = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        for op, a, b, m, n in (("gate_up dW", xp, dgu, 2 * inter, hidden), ("down dW", hp, dy, hidden, inter)):
            fn = lambda: ta_moe.grouped_mm_weight_grad(a, b, offsets, experts, True)  # noqa: E731
            calls = {"library": fn, **{label: variant_call(fn, modules[label]) for label in VARIANTS}}
            calls["torch._grouped_mm"] = lambda: torch._grouped_mm(b.t(), a, offs=ends)
            calls["cuBLAS dense"] = lambda: torch.mm(b[:used].t(), a[:used])
            report(f"{name} {op}: M {m} N {n} K {used}", calls, 2 * m * n * used, fn())
        w = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=dtype) / hidden ** 0.5
        fn = lambda: ta_moe.grouped_mm(xp, w, offsets)  # noqa: E731
        calls = {"library": fn, **{label: variant_call(fn, modules[label])
                                   for label in ("before", "sts") if label in VARIANTS}}
        calls["cuBLAS dense"] = lambda: torch.mm(xp[:used], w[0].t())
        report(f"{name} gate_up forward (nt): M {used} N {2 * inter} K {hidden}", calls,
               2 * used * 2 * inter * hidden, fn())
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
