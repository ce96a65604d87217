"""The map kernels' launch shape on this GPU (issue 26: on the H200 the f16/bf16 forwards run at
0.88-0.90 of the copy ceiling and the f32 rows at 0.96x torch, with the shape chosen on the H100:
blocks of 128 threads + 16 KB of unused shared memory for the light ops, 13 blocks / 52 warps an SM;
256 threads, 64 warps, for the others). Each op at bench_elementwise's size (2^26 elements), its
contiguous entry launched directly with each (threads, dynamic shared bytes, unroll), beside torch's
op and a copy of the same bytes, interleaved (bench/timing.py). Unroll > 1 from cubins of
kernels/elementwise.cu built with RAWOPS_MAP_UNROLL (dev/cubins.py). Experiment, not a bench.
    python dev/time_map_shapes.py
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import _modules, elementwise  # noqa: E402
from rawops._launch import launch  # noqa: E402

N = 1 << 26
SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# (threads, dynamic shared bytes): warps an SM 64, 64, 52 (shipped capped), 40, 48
SHAPES = [(256, 0), (128, 0), (128, 16384), (128, 20480), (256, 32768)]
UNROLLS = (2, 4)
INNER = 4096  # bias_gelu's row width
# op -> (operands read, torch's op); bias_gelu's bias (c) is a row of INNER
OPS = {
    "relu_fwd": (1, torch.relu),
    "gelu_tanh_fwd": (1, lambda a: F.gelu(a, approximate="tanh")),
    "gelu_erf_fwd": (1, F.gelu),
    "add_fwd": (2, torch.add),
    "gelu_tanh_bwd": (2, None),
    "gelu_erf_bwd": (2, None),
    "bias_gelu_tanh_fwd": (1, None),
    "bias_gelu_erf_fwd": (1, None),
}
ONLY = os.environ.get("MAP_OPS")  # e.g. MAP_OPS=gelu_erf_fwd,bias_gelu_tanh_fwd
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s, {N} elements")
    modules = build_modules("elementwise", {u: [f"RAWOPS_MAP_UNROLL={u}"] for u in UNROLLS})
    stream = torch.cuda.current_stream().cuda_stream
    for dtype in (DTYPES[d] for d in os.environ.get("MAP_DTYPES", "f32,f16").split(",")):
        a, b = (torch.randn(N, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(INNER, device="cuda", dtype=dtype)
        out = torch.empty_like(a)
        vec = 16 // a.element_size()
        for op, (reads, theirs) in OPS.items():
            if ONLY and op not in ONLY.split(","):
                continue
            name = f"{op}_{SUFFIX[dtype]}"
            shipped = _modules.function_pointer("elementwise", name, 0)
            c, inner = (bias.data_ptr(), INNER) if op.startswith("bias_") else (0, 1)
            args = (a.data_ptr(), b.data_ptr() if reads == 2 else 0, c, out.data_ptr(), N, 0, inner, 1.0)

            def run(function, threads, shared, unroll=1):
                blocks = -(-(N // vec) // (threads * unroll))
                return lambda: launch(function, (blocks,), threads, shared, stream, args, "ppppqqqf", 0)
            calls = {f"{t}t {s // 1024}K": run(shipped, t, s) for t, s in SHAPES}
            for u, module in modules.items():
                pointer = module.get_function(name).kernel.ptr
                calls[f"256t 0K u{u}"] = run(pointer, 256, 0, u)
                calls[f"128t 0K u{u}"] = run(pointer, 128, 0, u)
                calls[f"128t 16K u{u}"] = run(pointer, 128, 16384, u)
            mine = elementwise.MAP[op]
            calls["shipped " + ("capped" if op in elementwise.CAPPED else "256t")] = run(shipped, *(
                (128, 16384) if op in elementwise.CAPPED else (256, 0)))
            if theirs is not None:
                calls["torch"] = (lambda: theirs(a)) if reads == 1 else (lambda: theirs(a, b))
            nbytes = N * a.element_size() * (reads + 1)
            src, dst = (torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in range(2))
            calls["copy same bytes"] = lambda: dst.copy_(src)
            del mine
            times = timing.device_times_us(calls, reps=20, rounds=5)
            best = min((us, k) for k, us in times.items() if k not in ("torch", "copy same bytes"))
            print(f"== {name}: best {best[1]} {best[0]:.1f} us")
            for label, us in times.items():
                print(f"  {label:18s} {us:7.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of ceiling")


if __name__ == "__main__":
    main()
