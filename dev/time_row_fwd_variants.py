"""The row forwards' register layout (issue 26: on the H200 the 16-bit softmax forward runs at 0.78 of
the copy ceiling while Liger's Triton softmax reaches 0.94; layer_norm's 16-bit forward 0.79-0.82).
Variants of kernels/softmaxes.cu and kernels/norm.cu built as cubins (dev/cubins.py), each launched
through the library's own plan with _rows.FWD_BYTES set to what the variant holds a thread:
  shipped     the library's plan (softmax: its wide entries where planned, rawops/softmaxes.py)
  v4          4 16-byte vectors a thread (128 threads a 4096-wide 16-bit row), 64 registers: the norms'
              shipped kernels, the softmaxes' with the wide entries off
  then (efe88fc) 8 and 2 vectors a thread and 128 registers; now (VARIANTS) the 16-bit rows' bodies
(A softmax holding its exps in registers for the output, not computing them again, was slower on the
H200 at every shape: 81.3 -> 88.5 us bf16 16384 x 4096 with 128 registers; docs/performance.md.)
Outputs checked against the shipped kernels'; interleaved rounds (bench/timing.py), beside a copy of
the same bytes. Experiment, not a bench.
    python dev/time_row_fwd_variants.py          (ROW_OPS=softmax,log_softmax: those ops alone;
                                                 ROW_SHAPES=4096: 16384 x 4096 alone)
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_cubins, build_modules  # noqa: E402

from rawops import _modules, _rows, norm, softmaxes  # noqa: E402

# name: (macros, FWD_BYTES, families, wide, source): source None builds kernels/<family>.cu, else
# {family: an experiment's .cu that includes it}. Measured so far (docs/performance.md, "The row
# forwards against Liger's"): 8 and 2 vectors a thread and 128 registers (efe88fc, H200); the 16-bit
# bodies with fewer instructions an element (a3504c4, H100); on 2026-12-03 (H200) Liger's layout (2
# vectors a thread), evict-first stores, the register caps (RAWOPS_ROW_MIN_BLOCKS 3, 4), the norms'
# weight loaded with x and x's loads kept out of L1: every one slower or equal. Their sources and
# macros are at aa88283 (dev/row_store_cs.cu, dev/row_loads.cu, RAWOPS_NORM_FWD_EARLY_WEIGHTS).
VARIANTS = {}
SHAPES = [(16384, 4096)] + ([] if os.environ.get("ROW_SHAPES") == "4096" else [(87381, 768)])


def variant_call(fn, family, module, fwd_bytes):
    shipped = _modules.function_pointer

    def pointer(fam, name, device):
        return module.get_function(name).kernel.ptr if fam == family else shipped(fam, name, device)

    def call():
        # norm caches each width's kernel and plan (norm._forward_configs): emptied around the call
        saved, configs = _rows.FWD_BYTES, dict(norm._forward_configs)
        _modules.function_pointer, _rows.FWD_BYTES = pointer, fwd_bytes
        norm._forward_configs.clear()
        try:
            return fn()
        finally:
            _modules.function_pointer, _rows.FWD_BYTES = shipped, saved
            norm._forward_configs.clear()
            norm._forward_configs.update(configs)
    return call


def without_wide(fn):
    def call():
        saved = softmaxes.WIDE_MAX_THREADS
        softmaxes.WIDE_MAX_THREADS = 0
        try:
            return fn()
        finally:
            softmaxes.WIDE_MAX_THREADS = saved
    return call


def builds():
    """(variant, family) -> (the source cubins.py builds, its macros)."""
    return {(name, fam): (source[fam] if source else fam, macros)
            for name, (macros, _, fams, _, source) in VARIANTS.items() for fam in fams}


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    modules = {key: build_modules(source, {key[0]: macros})[key[0]] for key, (source, macros) in builds().items()}
    for rows, n in SHAPES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            xt = torch.randn(rows, n, device="cuda", dtype=dtype)
            x = cupy.from_dlpack(xt)
            w, b = (cupy.from_dlpack(torch.randn(n, device="cuda", dtype=dtype)) for _ in range(2))
            wt, bt = torch.from_dlpack(w), torch.from_dlpack(b)
            torch_ops = {"softmax": lambda: torch.softmax(xt, -1), "log_softmax": lambda: torch.log_softmax(xt, -1),
                         "layer_norm": lambda: torch.nn.functional.layer_norm(xt, (n,), wt, bt),
                         "rms_norm": lambda: torch.nn.functional.rms_norm(xt, (n,), wt)}
            ops = {"softmax": ("softmaxes", lambda: softmaxes.softmax(x)),
                   "log_softmax": ("softmaxes", lambda: softmaxes.log_softmax(x)),
                   "layer_norm": ("norm", lambda: norm.layer_norm(x, w, b)),
                   "rms_norm": ("norm", lambda: norm.rms_norm(x, w))}
            nbytes = 2 * xt.numel() * xt.element_size()
            src, dst = (torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in range(2))
            print(f"== {rows} x {n} {dtype}")
            only = os.environ.get("ROW_OPS")  # e.g. ROW_OPS=softmax,log_softmax
            for op, (family, fn) in ops.items():
                if only and op not in only.split(","):
                    continue
                ref = fn().astype(cupy.float32)
                calls = {"shipped": fn}
                if family == "softmaxes":  # the shipped plan without its wide entries: 4 vectors a thread
                    calls["v4 (wide off)"] = without_wide(fn)
                for name, (_, fwd_bytes, fams, wide, _) in VARIANTS.items():
                    if family not in fams:
                        continue
                    call = variant_call(fn, family, modules[(name, family)], fwd_bytes)
                    call = call if wide else without_wide(call)
                    err = float(cupy.abs(call().astype(cupy.float32) - ref).max())
                    calls[f"{name} (max diff {err:.1e})"] = call
                calls["torch"] = torch_ops[op]
                calls["copy same bytes"] = lambda: dst.copy_(src)
                times = timing.device_times_us(calls, reps=20, rounds=5)
                for label, us in times.items():
                    print(f"  {op:12s} {label:32s} {us:7.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of ceiling")
            ops.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--build"]:  # --build 90: the cubins only (on the CPU machine; carry dev/.cubins)
        for (name, _), (source, macros) in builds().items():
            print(build_cubins(source, {name: macros}, sys.argv[2])[name])
    else:
        main()
