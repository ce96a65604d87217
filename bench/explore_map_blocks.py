"""The light map kernels' warps an SM capped by block size instead of shared memory. On sm_90 they
run as blocks of 128 with 16 KB of unused dynamic shared memory (13 blocks, 52 warps an SM), which
beat no cap (64 warps; bench/results/explore_map_occupancy.md); but the driver then takes the
228 KB carveout and leaves L1 28 KB (bench/results/explore_map_carveout.md), and at 20 KB (40 warps)
the library fell to 0.957x torch, whose kernel runs ~40 warps an SM with the whole L1. Blocks of
640-832 threads and no shared memory hold 44-60 warps an SM (2-3 blocks of 2048 threads) and leave
L1 alone. elementwise.cu is built here with -DRAWOPS_MAP_MAX_THREADS=1024 (the library's bound is
256); each shape launches that build's kernel on torch's buffers (the library's own kernel for the
shipped shape), beside torch's op, all interleaved; each row is the median of READINGS bench
readings (timing.device_times_us).

    python bench/explore_map_blocks.py [--out bench/results]
"""
import os
import statistics
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cubins import build_modules  # noqa: E402
from explore_map_carveout import CASES as CARVEOUT_CASES, SUFFIX, blocks_per_sm, check_bits, map_call  # noqa: E402
from timing import device_times_us, start, write_results  # noqa: E402

N = 64 << 20
READINGS = 5
WIDE = ["RAWOPS_MAP_MAX_THREADS=1024"]
# (threads, dynamic shared KB) of the wide build; ("library", 128, 16) is the shipped kernel and shape.
SHAPES = [("library", 128, 16), ("wide", 128, 16), ("wide", 128, 0), ("wide", 512, 0), ("wide", 640, 0),
          ("wide", 704, 0), ("wide", 768, 0), ("wide", 832, 0), ("wide", 1024, 0)]
# explore_map_carveout's kernels, and tanh GELU's forward after relu f16.
CASES = CARVEOUT_CASES[:1] + [("gelu_tanh_fwd", torch.float16, 1, lambda x, y: F.gelu(x, approximate="tanh"))] \
    + CARVEOUT_CASES[1:]


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import _modules

    wide = build_modules("elementwise", {"wide": WIDE})["wide"]
    header = ["kernel", "build", "threads", "dynamic smem KB", "blocks/SM", "warps/SM", "us", "torch us",
              "x torch (median of readings)", "min x", "max x"]
    rows = []
    for name, dtype, reads, theirs in CASES:
        x, y = (torch.randn(N, device="cuda", dtype=dtype) for _ in range(2))
        kernels = {"library": _modules.get_function("elementwise", f"{name}_{SUFFIX[dtype]}", 0),
                   "wide": wide.get_function(f"{name}_{SUFFIX[dtype]}")}
        fns, occupancy = {"torch": lambda x=x, y=y: theirs(x, y)}, {}
        for build, threads, kb in SHAPES:
            kernel = kernels[build]

            def ours(kernel=kernel, threads=threads, kb=kb, x=x, y=y, reads=reads):
                return map_call(kernel, x, y, reads, threads, kb)
            occupancy[(build, threads, kb)] = blocks_per_sm(kernel, threads, kb)
            fns[(build, threads, kb)] = ours
        ref = theirs(x, y)
        check_bits(name, fns, ref)
        readings = [device_times_us(fns) for _ in range(READINGS)]
        torch_us = statistics.median(r["torch"] for r in readings)
        for key in SHAPES:
            build, threads, kb = key
            ratios = [r["torch"] / r[key] for r in readings]
            blocks = occupancy[key]
            rows.append(dict(zip(header, (f"{name}_{SUFFIX[dtype]}", build, threads, kb, blocks, blocks * threads // 32,
                                          f"{statistics.median(r[key] for r in readings):.2f}", f"{torch_us:.2f}",
                                          f"{statistics.median(ratios):.4f}", f"{min(ratios):.4f}",
                                          f"{max(ratios):.4f}"))))
            print(rows[-1], flush=True)
        del x, y, fns, ref
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_map_blocks", "python bench/explore_map_blocks.py", [
        (f"Warps an SM capped by block size (no shared memory) against the shipped cap, 64M elements, "
         f"medians of {READINGS} bench readings", header, rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
