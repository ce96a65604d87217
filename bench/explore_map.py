"""Launch-shape exploration for the map kernels (kernels/elementwise.cu): unroll depth,
block size and grid policy, timed at 64M elements on the GPU it runs on. Needs nvcc.

    python bench/explore_map.py [--out DIR]
    python bench/explore_map.py --sweep [--out DIR]   # only: rawops vs torch across sizes (same tensors)

Each variant is the real kernel built with -DRAWOPS_MAP_UNROLL=U (and -DRAWOPS_PLAIN_LOADS
for ld.global instead of ld.global.nc, -DRAWOPS_STREAMING_HINTS for evict-first ld/st.cs,
-DRAWOPS_L2_256B for loads that fetch 256-byte L2 lines, -DRAWOPS_L1_NO_ALLOCATE for loads
that skip L1, -DRAWOPS_MAP_MINIMAL for torch's kernel structure: 32-bit index, no head, tail
or loop),
launched with one block per chunk of U x block vectors. (An earlier round also tried a resident grid-stride grid: 5-15% slower everywhere.)
The winner goes into rawops/_launch.pyx; the table goes into bench/NOTES.md.
"""
import argparse
import os
import statistics
import subprocess
import sys

import cupy
import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N = 64 << 20
KERNELS = [  # (name, dtype, reads b, reads c (row of 4096), bytes moved per element in units of itemsize)
    ("relu_fwd_f32", numpy.float32, False, False, 2),
    ("relu_fwd_f16", numpy.float16, False, False, 2),
    ("gelu_tanh_fwd_bf16", "bfloat16", False, False, 2),
    ("gelu_erf_fwd_f16", numpy.float16, False, False, 2),
    ("add_fwd_f16", numpy.float16, True, False, 3),
    ("gelu_tanh_bwd_bf16", "bfloat16", True, False, 3),
    ("bias_gelu_tanh_fwd_bf16", "bfloat16", False, True, 2),
    ("gelu_erf_bwd_f16", numpy.float16, True, False, 3),
    ("gelu_erf_bwd_bf16", "bfloat16", True, False, 3),
]


def build(unroll, variant, arch, out_dir):
    path = os.path.join(out_dir, f"elementwise_u{unroll}_{variant}.cubin")
    flags = [f"-DRAWOPS_MAP_UNROLL={unroll}", "-DRAWOPS_MAP_MAX_THREADS=512"]
    flags += {"nc": [], "plain": ["-DRAWOPS_PLAIN_LOADS"], "cs": ["-DRAWOPS_STREAMING_HINTS"],
              "l2_256": ["-DRAWOPS_L2_256B"], "noalloc": ["-DRAWOPS_L1_NO_ALLOCATE"],
              "minimal": ["-DRAWOPS_MAP_MINIMAL"], "minimal_plain": ["-DRAWOPS_MAP_MINIMAL", "-DRAWOPS_PLAIN_LOADS"]}[variant]
    subprocess.run(["nvcc", "-O3", "-std=c++17", f"-I{ROOT}/kernels/include", "--cubin", f"-arch=sm_{arch}",
                    *flags, f"{ROOT}/kernels/elementwise.cu", "-o", path], check=True)
    return cupy.RawModule(path=path)


def time_us(fn, reps=40):
    """Median of per-launch event pairs, recorded back to back (a synchronize between them
    would add the host's launch latency to every sample)."""
    for _ in range(5):
        fn()
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in events)


def torch_times():
    """torch eager's time for each kernel's op at the same size, timed the same way."""
    import torch
    import torch.nn.functional as F

    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    result = {}
    for name, *_ in KERNELS:
        dtype = dtypes[name.rsplit("_", 1)[1]]
        a, b = (torch.randn(N, device="cuda", dtype=dtype) for _ in range(2))
        c = torch.randn(4096, device="cuda", dtype=dtype)
        op = {"relu_fwd": lambda: F.relu(a), "gelu_tanh_fwd": lambda: F.gelu(a, approximate="tanh"),
              "gelu_erf_fwd": lambda: F.gelu(a), "add_fwd": lambda: a + b,
              "gelu_tanh_bwd": lambda: torch.ops.aten.gelu_backward(a, b, approximate="tanh"),
              "gelu_erf_bwd": lambda: torch.ops.aten.gelu_backward(a, b),
              "bias_gelu_tanh_fwd": lambda: F.gelu(a.view(-1, 4096) + c, approximate="tanh")}[name.rsplit("_", 1)[0]]
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        with stream:
            result[name] = time_us(op)
        del a, b, c
    return result


def size_sweep(out_dir):
    """The shipped kernels through the torch adapter against torch's op on the same input, each
    allocating its output, interleaved, across sizes: a constant gap in us is a fixed cost
    (launch, first wave, tail), a constant ratio a streaming-rate difference."""
    import torch
    import torch.nn.functional as F

    from rawops import torch_adapter as ta

    ops = {"relu": (ta.relu, F.relu), "gelu_tanh": (lambda a: ta.gelu(a, "tanh"), lambda a: F.gelu(a, approximate="tanh"))}
    lines = ["| op | dtype | elements | rawops us | torch us | x torch | rawops - torch us |", "|---|---|---|---|---|---|---|"]
    for dtype in (torch.float16, torch.float32):
        for n in (1 << 22, 1 << 24, 1 << 26, 1 << 28):
            a = torch.randn(n, device="cuda", dtype=dtype)
            for name, (ours, theirs) in ops.items():
                samples = {"ours": [], "torch": []}
                for _ in range(5):  # interleaved rounds: drift falls on both
                    for key, fn in (("ours", ours), ("torch", theirs)):
                        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
                        with stream:
                            samples[key].append(time_us(lambda: fn(a), reps=20))
                us, ref = statistics.median(samples["ours"]), statistics.median(samples["torch"])
                lines.append(f"| {name} | {str(dtype)[6:]} | {n} | {us:.2f} | {ref:.2f} | {ref / us:.4f} | {us - ref:+.2f} |")
                print(lines[-1], flush=True)
            del a
    with open(os.path.join(out_dir, "explore_map_sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def torch_launch_configs(out_dir):
    """The kernel torch runs for each explored op at 64M elements, with its grid and block
    (torch.profiler's trace): the launch shape to compare ours with."""
    import json

    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    lines = ["| op | torch kernel | grid | block |", "|---|---|---|---|"]
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        a, b = torch.randn(N, device="cuda", dtype=dtype), torch.randn(N, device="cuda", dtype=dtype)
        for name, op in (("relu", lambda: F.relu(a)), ("gelu_tanh", lambda: F.gelu(a, approximate="tanh")),
                         ("add", lambda: a + b)):
            op()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                op()
                torch.cuda.synchronize()
            path = os.path.join(out_dir, "trace.json")
            prof.export_chrome_trace(path)
            for event in json.load(open(path))["traceEvents"]:
                if event.get("cat") == "kernel":
                    args = event.get("args", {})
                    lines.append(f"| {name} {str(dtype)[6:]} | {event['name'][:90]} | {args.get('grid')} | "
                                 f"{args.get('block')} |")
                    print(lines[-1], flush=True)
            os.remove(path)
    with open(os.path.join(out_dir, "explore_map_torch.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def occupancy_sweep(out_dir, torch_us):
    """The shipped kernels at blocks of 128 threads with unused dynamic shared memory capping
    the blocks a SM holds (ncu: torch's half-type kernels ran 61-63% of the warp slots, ours
    84-87%, same bytes): fewer warps in flight, less DRAM contention?"""
    import ml_dtypes

    major, minor = cupy.cuda.Device().compute_capability
    module = build(1, "nc", f"{major}{minor}", "/tmp")
    lines = ["| kernel | dynamic smem KB | blocks/SM | us | x torch |", "|---|---|---|---|---|"]
    for name, dtype, reads_b, reads_c, units in KERNELS:
        dtype = numpy.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else numpy.dtype(dtype)
        a, b, out = (cupy.random.standard_normal(N, dtype=numpy.float32).astype(dtype) for _ in range(3))
        c = cupy.random.standard_normal(4096, dtype=numpy.float32).astype(dtype)
        kernel = module.get_function(name)
        kargs = (a, b if reads_b else 0, c if reads_c else 0, out, numpy.int64(N), numpy.int64(0),
                 numpy.int64(4096 if reads_c else 1), numpy.float32(0.5))
        grid = N // (16 // dtype.itemsize) // 128
        for kb in (0, 14, 16, 18, 20, 24, 32):
            kernel.max_dynamic_shared_size_bytes = kb * 1024
            try:
                per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.ptr, 128, kb * 1024)
            except AttributeError:
                per_sm = None
            us = time_us(lambda: kernel((grid,), (128,), kargs, shared_mem=kb * 1024))
            lines.append(f"| {name} | {kb} | {per_sm or '-'} | {us:.1f} | {torch_us[name] / us:.3f} |")
            print(lines[-1], flush=True)
        del a, b, out
    with open(os.path.join(out_dir, "explore_map_occupancy.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/rawops_explore")
    parser.add_argument("--sweep", action="store_true", help="only the size sweep of the shipped kernels vs torch")
    parser.add_argument("--occupancy", action="store_true", help="only the shipped kernels with capped blocks per SM")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        torch_launch_configs(args.out)
        return size_sweep(args.out)
    if args.occupancy:
        return occupancy_sweep(args.out, torch_times())
    import ml_dtypes

    major, minor = cupy.cuda.Device().compute_capability
    buffers = {}
    rows = []
    torch_us = torch_times()
    for unroll, loads in ((1, "nc"), (1, "minimal"), (1, "minimal_plain"), (1, "nc")):
        module = build(unroll, loads, f"{major}{minor}", "/tmp")
        for name, dtype, reads_b, reads_c, units in KERNELS:
            dtype = numpy.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else numpy.dtype(dtype)
            if dtype not in buffers:
                buffers[dtype] = [cupy.random.standard_normal(N, dtype=numpy.float32).astype(dtype) for _ in range(3)]
                buffers[dtype].append(cupy.random.standard_normal(4096, dtype=numpy.float32).astype(dtype))
            a, b, out, c = buffers[dtype]
            kernel = module.get_function(name)
            vec = 16 // dtype.itemsize
            for block in (128, 256, 512):
                per_block = block * unroll
                cover = (N // vec + per_block - 1) // per_block
                for policy, grid in (("cover", cover),):
                    kargs = (a, b if reads_b else 0, c if reads_c else 0, out, numpy.int64(N), numpy.int64(0),
                             numpy.int64(4096 if reads_c else 1), numpy.float32(0.5))
                    try:
                        us = time_us(lambda: kernel((grid,), (block,), kargs))
                    except cupy.cuda.driver.CUDADriverError as error:
                        print(f"{name} U{unroll} B{block} {policy}: {error}", flush=True)
                        continue
                    tbps = units * N * dtype.itemsize / us / 1e6
                    rows.append((name, unroll, block, loads, grid, us, tbps, torch_us[name] / us))
                    print(f"{name:26s} U{unroll} B{block:4d} {loads:5s} grid {grid:6d} {us:8.1f} us {tbps:5.3f} TB/s "
                          f"{torch_us[name] / us:5.3f}x torch", flush=True)
    best = {}
    for row in rows:
        if row[0] not in best or row[6] > best[row[0]][6]:
            best[row[0]] = row
    lines = ["torch eager us (same run): " + ", ".join(f"{k} {v:.1f}" for k, v in torch_us.items()), "",
             "| kernel | unroll | block | loads | grid | us | TB/s | x torch |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.1f} | {r[6]:.3f} | {r[7]:.3f} |" for r in rows]
    lines += ["", "best per kernel:"] + [f"- {k}: U{r[1]} B{r[2]} {r[3]} {r[6]:.3f} TB/s {r[7]:.3f}x torch"
                                         for k, r in best.items()]
    with open(os.path.join(args.out, "explore_map.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-len(best) - 1:]))


if __name__ == "__main__":
    sys.exit(main())
