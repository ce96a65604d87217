"""The experts' weight gradients (gemm_sm90_grouped_tn) with more of the output tile staged for its TMA
stores (issue 28: Mixtral's dW at 0.78 of cuBLAS dense, an expert's ~570 rows only 9 stages before
each tile's 64 KB store). Variants of kernels/gemm_sm90.cu as cubins (dev/cubins.py): stages x staging
buffers; each launched through the library with its shared memory; outputs checked against the shipped
kernel's, times in interleaved rounds beside torch._grouped_mm and cuBLAS dense of the same M N K.
Experiment, not a bench.
    python dev/time_wgrad.py
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

# name: (stages, staging buffers); the shipped kernel is (GEMM_SM90_WGRAD_STAGES, GEMM_SM90_WGRAD_OUTS)
VARIANTS = {"4 stages, 2 buffers (before)": (4, 2), "3 stages, 3 buffers": (3, 3)}
SHAPES = [("mixtral", 16384, 4096, 14336, 64, 2), ("qwen3", 16384, 2048, 768, 128, 8)]


def variant_call(fn, module, stages, outs):
    shipped_function, shipped_bytes = _gemm_sm90.function, _gemm_sm90.WGRAD_SHARED_BYTES
    nbytes = _gemm_sm90.shared_bytes(_gemm_sm90.TILE_N, stages, outs)

    def function(name, device, shared=None):
        kernel = module.get_function(name)
        kernel.max_dynamic_shared_size_bytes = nbytes
        return kernel.ptr

    def call():
        _gemm_sm90.function, _gemm_sm90.WGRAD_SHARED_BYTES = function, nbytes
        try:
            return fn()
        finally:
            _gemm_sm90.function, _gemm_sm90.WGRAD_SHARED_BYTES = shipped_function, shipped_bytes
    return call


def main():
    print(torch.cuda.get_device_name())
    macros = {name: [f"RAWOPS_GEMM_SM90_WGRAD_STAGES={s}", f"RAWOPS_GEMM_SM90_WGRAD_OUTS={o}"]
              for name, (s, o) in VARIANTS.items()}
    modules = build_modules("gemm_sm90", macros)
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
            ref = fn()
            calls = {"shipped": fn}
            for label, (stages, outs) in VARIANTS.items():
                call = variant_call(fn, modules[label], stages, outs)
                err = float((call().float() - ref.float()).abs().max())
                calls[f"{label} (max diff {err:.1e})"] = call
            calls["torch._grouped_mm"] = lambda: torch._grouped_mm(b.t(), a, offs=ends)
            calls["cuBLAS dense"] = lambda: torch.mm(b[:used].t(), a[:used])
            times = timing.device_times_us(calls, reps=5, rounds=5)
            dense = times["cuBLAS dense"]
            print(f"== {name} {op}: M {m} N {n} K {used}")
            for label, us in times.items():
                tflops = 2 * m * n * used / us / 1e6
                print(f"  {label:40s} {us:9.1f} us  {tflops:6.1f} TFLOP/s  {dense / us:.3f} of dense")
            sys.stdout.flush()
        del xp, hp, dgu, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
