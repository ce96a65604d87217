"""bias_gelu's fused backward (dx + dbias in one pass): variants (vector bytes per thread, blocks
an SM by launch bounds, rows of loads in flight per thread) built from kernels/elementwise.cu with nvcc, timed at
16384 x 4096 (64M elements) per dtype beside the unfused pair (dx, then column_sum) and
torch, in one run. Needs nvcc.

    python bench/explore_bias_bwd.py [--out bench/results]
"""
import os
import sys

import cupy
import numpy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubins import build_modules  # noqa: E402
from timing import device_time_us, start, switched, write_results  # noqa: E402

ROWS, COLS = 16384, 4096
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
CODES = {"f32": 0, "f16": 1, "bf16": 2}
# (vector bytes, blocks an SM, rows ahead, threads a block, waves): the shipped shapes. waves > 1
# deals the rows to that many times the resident blocks (shorter blocks, more partial sums).
# Session 8 also measured rows in flight through shared memory (cp.async; a kernel variant
# since removed, bench/NOTES.md): 5-10% slower at every depth. Session 9 measured a kernel fed by
# the copy engine (cp.async.bulk into 3-10 shared-memory stages, a producer warp) and a skewed row
# order (chunk c takes row group i * chunks + (c + i * k) % chunks): both slower; their code is
# in git history at cf5fae8 (bench/results/explore_bias_bwd_bulk.md). So did many short blocks
# whose column sums are chained in a fixed order behind flags (git history, 14151b2;
# bench/results/explore_bias_bwd_chained.md).
VARIANTS = [(8, 6, 1, 256, 1), (16, 3, 2, 256, 1)]


def macros(vec_bytes, blocks, ahead, threads):
    return [f"RAWOPS_BIAS_BWD_BYTES={vec_bytes}", f"RAWOPS_BIAS_BWD_BLOCKS={blocks}",
            f"RAWOPS_BIAS_BWD_AHEAD={ahead}", f"RAWOPS_BIAS_BWD_THREADS={threads}"]


CUBINS = {"elementwise": {v[:4]: macros(*v[:4]) for v in VARIANTS}}  # bench/cubins.py builds these


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    modules = build_modules("elementwise", CUBINS["elementwise"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, dtype in DTYPES.items():
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        dx = torch.empty_like(x)
        dbias = torch.empty(COLS, device="cuda", dtype=dtype)
        nbytes = 3 * dy.numel() * dy.element_size()
        ref_dx, ref_db = ta._bias_gelu_bwd(dy, x, bias, "tanh")

        def unfused():
            out = ta._GELU_KERNELS[("tanh", "bwd", True)].torch_call(dy, x, c=bias)
            return out, ta._column_sum(out)

        def torch_eager():
            out = torch.ops.aten.gelu_backward(dy, x + bias, approximate="tanh")
            return out, out.sum(0)

        final_not_dependent = switched(ew, "DEPENDENT_FINAL", False, lambda: ta._bias_gelu_bwd(dy, x, bias, "tanh"))

        candidates = {"shipped build": lambda: ta._bias_gelu_bwd(dy, x, bias, "tanh"),
                      "shipped build, final sum launched plainly": final_not_dependent,
                      "unfused (dx, column_sum)": unfused, "torch": torch_eager}
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        for vec_bytes, blocks, ahead, block_threads, waves in VARIANTS:
            module = modules[(vec_bytes, blocks, ahead, block_threads)]
            fused = module.get_function(f"bias_gelu_tanh_bwd_partial_{name}")
            final = module.get_function(f"column_sum_final_{name}")
            saved = dict(ew.BIAS_BWD_SHAPE), ew.BIAS_BWD_THREADS, ew.USE_BIAS_BWD_TILE
            ew.BIAS_BWD_SHAPE[dy.element_size()] = (vec_bytes, blocks * waves)
            ew.BIAS_BWD_THREADS, ew.USE_BIAS_BWD_TILE = block_threads, False  # the walkers' plan
            (strips, chunks), _, threads, strip = ew.bias_gelu_bwd_plan(ROWS, COLS, CODES[name], (0, 0, 0), sms)
            ew.BIAS_BWD_SHAPE.update(saved[0])
            ew.BIAS_BWD_THREADS, ew.USE_BIAS_BWD_TILE = saved[1], saved[2]
            partial = torch.empty(chunks, COLS, device="cuda", dtype=torch.float32)
            args = tuple(numpy.uint64(t.data_ptr()) for t in (dy, x, bias, dx, partial)) + tuple(
                numpy.int64(v) for v in (ROWS, COLS, strip))

            def run(fused=fused, final=final, args=args, partial=partial, chunks=chunks, strips=strips,
                    threads=threads):
                with stream:
                    fused((strips, chunks), (threads,), args)
                    final((-(-COLS // ew.FINAL_COLUMNS),), (ew.FINAL_THREADS,),
                          (numpy.uint64(partial.data_ptr()), numpy.uint64(dbias.data_ptr()), numpy.int64(chunks),
                           numpy.int64(COLS)))

            dx.fill_(float("nan"))  # every row must be written
            run()
            torch.cuda.synchronize()
            assert torch.equal(dx, ref_dx), f"{name} {vec_bytes}:{blocks}x{ahead}: dx differs from the shipped kernel's"
            assert torch.allclose(dbias.float(), ref_db.float(), rtol=1e-2, atol=1e-2), f"{name}: dbias"
            candidates[f"{vec_bytes} B x {block_threads} threads, {blocks} blocks/SM, {ahead} ahead, {waves} wave(s) "
                       f"({strips} strips x {chunks} chunks)"] = run
        for label, fn in candidates.items():
            us = device_time_us(fn)
            rows.append({"dtype": name, "variant": label, "us": us, "TB/s": nbytes / us / 1e6,
                         "of copy ceiling": nbytes / us / 1e6 / ceiling})
            print(f"{name:5s} {label:42s} {us:8.1f} us {nbytes / us / 1e6:5.2f} TB/s", flush=True)
        del dy, x, dx
        torch.cuda.empty_cache()
    # Where the shipped call's time goes: each kernel's device time (torch.profiler).
    from torch.profiler import ProfilerActivity, profile

    for name, dtype in DTYPES.items():
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        for _ in range(3):
            ta._bias_gelu_bwd(dy, x, bias, "tanh")
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                ta._bias_gelu_bwd(dy, x, bias, "tanh")
            torch.cuda.synchronize()
        totals = {}
        for e in prof.events():
            if e.device_time > 0:
                totals[e.name] = totals.get(e.name, 0.0) + e.device_time / 10
        for kernel, us in sorted(totals.items(), key=lambda kv: -kv[1]):
            rows.append({"dtype": name, "variant": f"shipped, kernel {kernel} (profiler)", "us": us,
                         "TB/s": float("nan"), "of copy ceiling": float("nan")})
            print(f"{name:5s} shipped kernel {kernel:40s} {us:8.1f} us", flush=True)
        del dy, x
        torch.cuda.empty_cache()
    text = write_results(out_dir, "explore_bias_bwd", "python bench/explore_bias_bwd.py", [
        (f"bias_gelu backward (dx + dbias), {ROWS}x{COLS}, tanh", ["dtype", "variant", "us", "TB/s", "of copy ceiling"],
         rows, {"copy ceiling TB/s": round(ceiling, 3),
                "bytes": "dy + x read, dx written (bias, dbias and the partials not counted)"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
