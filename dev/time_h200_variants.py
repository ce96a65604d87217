"""Launch-bound and tile-shape variants of the rows still under 0.92 of the H200's copy ceiling
(issue 26): log_softmax's f32 backward at 4096 columns (0.897, softmax's of the same bytes 1.02),
rms_norm's f32 forward (0.864, layer_norm's 0.94), the 16-bit bias_gelu backwards (0.85, erf 0.78).
Each variant is a cubin of the shipped source built with -D macros (dev/cubins.py), launched through
the library's own plan with the Python constants the macros stand for patched to match; outputs
checked against the shipped kernels', times in interleaved rounds (bench/timing.py) beside torch and
a copy of the same bytes. Experiment, not a bench.
    python dev/time_h200_variants.py            (VARIANT_OPS="softmax bwd,norm fwd": rows whose label holds one)
"""
import contextlib
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import _modules, elementwise, norm, softmaxes  # noqa: E402

# family -> variant -> (macros, {(module, attribute): value} patched for its calls). Measured at f9b7df3
# (H200, docs/performance.md): the row kernels at 3 blocks an SM (log_softmax bwd f32 209.5 -> 186.9 us;
# softmax's 16-bit backward spilled, 95 -> 118), 4 vectors a thread in the softmax backward, the norms
# at 1 block; the 16-bit bias_gelu backward tiles at 2 and 4 rows a thread and 256 threads. Now: the
# shipped choices (log_softmax bwd at 3 blocks; float16 tiles 4 rows a thread; bfloat16's at 3 blocks,
# decoded a word a pair) against the ones they replaced and the next candidates.
TILE = elementwise.BIAS_BWD_TILE_SHAPE
VARIANTS = {
    "softmaxes": {
        "log bwd at 2 blocks": (["RAWOPS_ROW_LOG_SOFTMAX_BWD_MIN_BLOCKS=2"], {}),
    },
    "norm": {},
    "elementwise": {
        "f16 2 rows a thread": (["RAWOPS_BIAS_BWD_TILE_F16_ROWS=128", "RAWOPS_BIAS_BWD_TILE_F16_PER=2"],
                                {(elementwise, "BIAS_BWD_TILE_SHAPE"): {**TILE, 1: (512, 128, 2)}}),
        "f16 1 row a thread": (["RAWOPS_BIAS_BWD_TILE_F16_ROWS=64", "RAWOPS_BIAS_BWD_TILE_F16_PER=1"],
                               {(elementwise, "BIAS_BWD_TILE_SHAPE"): {**TILE, 1: (512, 64, 1)}}),
        "bf16 unbounded": (["RAWOPS_BIAS_BWD_TILE_BF16_BLOCKS=1"], {}),
        "bf16 4 rows 2 blocks": (["RAWOPS_BIAS_BWD_TILE_BF16_ROWS=256", "RAWOPS_BIAS_BWD_TILE_BF16_PER=4",
                                  "RAWOPS_BIAS_BWD_TILE_BF16_BLOCKS=2"],
                                 {(elementwise, "BIAS_BWD_TILE_SHAPE"): {**TILE, 2: (512, 256, 4)}}),
    },
}
CACHES = [(norm, "_forward_configs"), (norm, "_backward_configs"), (norm, "_bulk_plans")]


@contextlib.contextmanager
def patched(values):
    saved = {key: getattr(*key) for key in values}
    for (module, attr), value in values.items():
        setattr(module, attr, value)
    try:
        yield
    finally:
        for (module, attr), value in saved.items():
            setattr(module, attr, value)


def variant_call(fn, family, module, constants):
    """fn with `family`'s kernels taken from `module` and `constants` patched; the norm family's
    launch caches kept apart from the shipped kernels'."""
    shipped_pointer, shipped_function = _modules.function_pointer, _modules.get_function
    caches = {key: {} for key in CACHES}

    def pointer(fam, name, device):
        return module.get_function(name).kernel.ptr if fam == family else shipped_pointer(fam, name, device)

    def function(fam, name, device):
        return module.get_function(name) if fam == family else shipped_function(fam, name, device)

    def call():
        with patched({(_modules, "function_pointer"): pointer, (_modules, "get_function"): function,
                      **constants, **caches}):
            return fn()
    return call


def cases():
    """(op, family, bytes moved, call, torch call or None) per row of the table; a generator, so that
    each row runs on its own operands before the next row's are made."""
    for rows, n in ((16384, 4096), (87381, 768)):
        for dtype in (torch.float32, torch.bfloat16):
            x, dy = (torch.randn(rows, n, device="cuda", dtype=dtype) for _ in range(2))
            w, b = (torch.randn(n, device="cuda", dtype=dtype) for _ in range(2))
            y = torch.log_softmax(x.float(), -1).to(dtype)
            p = torch.softmax(x.float(), -1).to(dtype)
            X, DY, W, B, Y, P = (cupy.from_dlpack(v) for v in (x, dy, w, b, y, p))
            e, shape = x.numel() * x.element_size(), f"{dtype} {rows}x{n}"
            yield (f"log_softmax bwd {shape}", "softmaxes", 3 * e, lambda: softmaxes.log_softmax_backward(DY, Y),
                   lambda: torch._log_softmax_backward_data(dy, y, -1, dtype))
            yield (f"softmax bwd {shape}", "softmaxes", 3 * e, lambda: softmaxes.softmax_backward(DY, P),
                   lambda: torch._softmax_backward_data(dy, p, -1, dtype))
            yield (f"rms_norm fwd {shape}", "norm", 2 * e, lambda: norm.rms_norm(X, W),
                   lambda: torch.nn.functional.rms_norm(x, (n,), w))
            yield (f"layer_norm fwd {shape}", "norm", 2 * e, lambda: norm.layer_norm(X, W, B),
                   lambda: torch.nn.functional.layer_norm(x, (n,), w, b))
            if dtype != torch.float32 and n == 4096:
                _, mean, rstd = norm.layer_norm_forward(X, W, B)
                yield (f"layer_norm bwd {shape}", "norm", 3 * e,
                       lambda: norm.layer_norm_backward(DY, X, W, mean, rstd), None)
    for dtype in (torch.bfloat16, torch.float16):
        x, dy = (torch.randn(16384, 4096, device="cuda", dtype=dtype) for _ in range(2))
        X, DY, BIAS = (cupy.from_dlpack(v) for v in (x, dy, torch.randn(4096, device="cuda", dtype=dtype)))
        for approximate in ("tanh", "none"):
            yield (f"bias_gelu bwd {approximate} {dtype}", "elementwise", 3 * x.numel() * x.element_size(),
                   lambda: elementwise.bias_gelu_backward(DY, X, BIAS, approximate=approximate), None)


def first(result):
    return result[0] if isinstance(result, tuple) else result


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    modules = {fam: build_modules(fam, {name: macros for name, (macros, _) in table.items()})
               for fam, table in VARIANTS.items()}
    only = os.environ.get("VARIANT_OPS")
    for op, family, nbytes, fn, torch_fn in cases():
        if only and not any(o in op for o in only.split(",")):
            continue
        ref = first(fn()).astype(cupy.float32)
        calls = {"shipped": fn}
        for name, (_, constants) in VARIANTS[family].items():
            call = variant_call(fn, family, modules[family][name], constants)
            err = float(cupy.abs(first(call()).astype(cupy.float32) - ref).max())
            calls[f"{name} (max diff {err:.1e})"] = call
        if torch_fn is not None:
            calls["torch"] = torch_fn
        src, dst = (torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in range(2))
        calls["copy same bytes"] = lambda: dst.copy_(src)
        times = timing.device_times_us(calls, reps=20, rounds=5)
        print(f"== {op}")
        for label, us in times.items():
            print(f"  {label:32s} {us:8.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of ceiling")
        sys.stdout.flush()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
