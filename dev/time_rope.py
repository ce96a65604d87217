"""Time kernels/rotary.cu's rope forward with RAWOPS_ROPE_HEADS = 1, 2, 4 (heads a thread takes),
each compiled here by nvcc for this GPU, on the bench's bf16 / f32 shape (q (B, H, S, D) views of a
(B, S, H, D) projection), beside a same-bytes copy. Experiment: not a bench.
    python dev/time_rope.py"""
import os
import subprocess
import sys
import tempfile

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from rawops import _constants  # noqa: E402


def cubin(heads, arch):
    out = os.path.join(tempfile.gettempdir(), f"rope_h{heads}.cubin")
    defines = [f"-DRAWOPS_{k}={v}" for k, v in vars(_constants).items() if k.startswith("ROPE_") and k != "ROPE_HEADS"]
    subprocess.run(["nvcc", "-std=c++17", "-O3", f"-arch=sm_{arch}", "-cubin", "-Ikernels/include", *defines,
                    f"-DRAWOPS_ROPE_HEADS={heads}", "kernels/rotary.cu", "-o", out], check=True)
    return out


def time_us(fn, reps=50):
    for _ in range(5):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return float(np.median(times))


def main():
    arch = cp.cuda.Device().compute_capability
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    B, S, HQ, HK, D = 8, 4096, 32, 8, 128
    for dtype, suffix in ((cp.float32, "f32"), (cp.float16, "bf16")):  # bf16 kernel on 2-byte data
        q = cp.random.standard_normal((B, S, HQ * D)).astype(dtype)
        k = cp.random.standard_normal((B, S, HK * D)).astype(dtype)
        cos = cp.random.standard_normal((B, S, D)).astype(dtype)
        sin = cp.random.standard_normal((B, S, D)).astype(dtype)
        dst = cp.empty_like(q)
        nbytes = 2 * (q.nbytes + k.nbytes) + cos.nbytes + sin.nbytes
        copy = time_us(lambda: cp.copyto(dst, q)) * (2 * (q.nbytes + k.nbytes)) / (2 * q.nbytes)
        it = q.itemsize
        for heads in (1, 2, 4):
            fn = cp.RawModule(path=cubin(heads, arch)).get_function(f"rope_fwd_{suffix}")
            per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, _constants.ROPE_THREADS, 0)
            units = B * S * -(-(HQ + HK) // heads) * (D // 2 // (16 // it))
            blocks = min(-(-units // _constants.ROPE_THREADS), per_sm * sms)
            args = (q, k, cos, sin, *map(np.int64, (B, S, HQ, HK, D, S * HQ * D, HQ * D, D, S * HK * D, HK * D, D,
                                                     S * D, D, S * D, D, _constants.ROPE_FLAG_VECTORS)))
            us = time_us(lambda: fn((blocks,), (_constants.ROPE_THREADS,), args))
            print(f"rope fwd {suffix:4} heads/thread {heads}: {fn.num_regs} regs, {per_sm} blocks/SM, {us:7.1f} us, "
                  f"{nbytes / us / 1e6:.2f} TB/s; copy of q+k's bytes {copy:.1f} us -> {us and copy / us:.3f} of it")


if __name__ == "__main__":
    main()
