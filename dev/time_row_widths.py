"""Threads a row for the row kernels' forwards (issue 26: on the H200 the 16-bit softmax forward
runs at 0.78 of the copy ceiling, layer_norm's at 0.79-0.80, while Liger's Triton softmax, 256
threads a 4096-wide row, reaches 0.94; the float32 rows, 256 threads a row, are at 0.92-0.94).
The plan gives a thread _rows.FWD_BYTES of its row in registers (64 shipped: 128 threads a
4096-wide 16-bit row); the kernels loop over what they hold, so 32 and 16 (256 and 512 threads)
run the same kernels. Likewise _rows.BWD_BYTES (32 shipped) for layer_norm's backward. Each op at
bench_norm's shapes, bf16 / f16 / f32, outputs checked against the shipped plan's, a copy of the
same bytes beside (bench/timing.py, interleaved). Experiment, not a bench.
    python dev/time_row_widths.py
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

from rawops import _rows, norm, softmaxes  # noqa: E402

SHAPES = [(16384, 4096), (87381, 768)]
FWD = (64, 32, 16)
BWD = (32, 16)


def with_bytes(attr, value, fn):
    def call():
        saved = getattr(_rows, attr)
        setattr(_rows, attr, value)
        try:
            return fn()
        finally:
            setattr(_rows, attr, saved)
    return call


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    for rows, n in SHAPES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            xt = torch.randn(rows, n, device="cuda", dtype=dtype)
            x, dy = cupy.from_dlpack(xt), cupy.from_dlpack(torch.randn_like(xt))
            w, b = (cupy.from_dlpack(torch.randn(n, device="cuda", dtype=dtype)) for _ in range(2))
            _, mean, rstd = norm.layer_norm_forward(x, w, b)
            ops = {  # (call, tensor passes)
                "layer_norm fwd": (lambda: norm.layer_norm(x, w, b), 2),
                "rms_norm fwd": (lambda: norm.rms_norm(x, w), 2),
                "softmax fwd": (lambda: softmaxes.softmax(x), 2),
                "log_softmax fwd": (lambda: softmaxes.log_softmax(x), 2),
                "layer_norm bwd": (lambda: norm.layer_norm_backward(dy, x, w, mean, rstd)[0], 3),
            }
            nbytes = xt.numel() * xt.element_size()
            src, dst = (torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(2))
            print(f"== {rows} x {n} {dtype}")
            for op, (fn, passes) in ops.items():
                attr, values = ("BWD_BYTES", BWD) if op.endswith("bwd") else ("FWD_BYTES", FWD)
                shipped = fn()
                calls = {}
                for v in values:
                    got = with_bytes(attr, v, fn)()
                    err = float(cupy.abs(got.astype(cupy.float32) - shipped.astype(cupy.float32)).max())
                    calls[f"{attr} {v} (max diff {err:.1e})"] = with_bytes(attr, v, fn)
                times = timing.device_times_us(calls, reps=20, rounds=5)
                for label, us in times.items():
                    print(f"  {op:16s} {label:34s} {us:7.1f} us  {passes * nbytes / us / 1e6 / ceiling:.3f} of ceiling")
            copy = timing.device_times_us({"copy": lambda: dst.copy_(src)}, reps=20, rounds=5)["copy"]
            print(f"  copy of one tensor pass each way {copy:7.1f} us  "
                  f"{2 * nbytes / copy / 1e6 / ceiling:.3f} of ceiling")
            ops.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
