"""The light map kernels' capped launch with the L1 left to them chosen too. On sm_90 they run as
blocks of 128 with 16 KB of unused dynamic shared memory (13 blocks an SM), which measured faster
than no cap (bench/results/explore_map_occupancy.md); 20 KB (10 blocks) fell off a cliff (0.957x).
The driver takes the shared-memory carveout that fits the most blocks, 228 KB at 16 and 20 KB, which
leaves L1 28 KB: about the 26 KB that 52 warps' 16-byte loads hold in flight. The preferred carveout
(a percentage of 228 KB) can leave more: 14 KB blocks fit 13 in 196 KB (L1 60 KB). Each shape below
launches the library's own kernel (its fatbin) on torch's buffers, timed beside torch's op in
interleaved rounds; the driver's occupancy for each shape is printed.

    python bench/explore_map_carveout.py [--out bench/results]
"""
import os
import sys

import numpy
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_times_us, start, write_results  # noqa: E402

N = 64 << 20
# (threads, dynamic shared KB, preferred carveout %: -1 = the driver's choice)
SHAPES = [(128, 0, -1), (128, 16, -1), (128, 14, 86), (128, 16, 86), (128, 18, 86), (256, 38, 86), (256, 30, 86)]
GELU_BWD = torch.ops.aten.gelu_backward
CASES = [  # kernel, dtype, operands read (x, then dy as b), torch's op
    ("relu_fwd", torch.float16, 1, lambda x, y: F.relu(x)),
    ("gelu_erf_bwd", torch.float16, 2, lambda x, y: GELU_BWD(y, x)),
    ("gelu_tanh_bwd", torch.float16, 2, lambda x, y: GELU_BWD(y, x, approximate="tanh")),
    ("add_fwd", torch.float16, 2, lambda x, y: x + y),
    ("relu_fwd", torch.bfloat16, 1, lambda x, y: F.relu(x)),
    ("relu_fwd", torch.float32, 1, lambda x, y: F.relu(x)),
]
SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def map_call(kernel, x, y, reads, threads, kb):
    """One launch of a map kernel (a cupy.RawKernel) over x (and y when it reads two operands) into a
    new tensor, as the library launches it: 16-byte vectors from element 0, blocks of `threads`
    covering them, `kb` KB of dynamic shared memory."""
    out = torch.empty_like(x)
    vec = 16 // x.element_size()
    args = (x.data_ptr(), y.data_ptr() if reads == 2 else 0, 0, out.data_ptr(), numpy.int64(x.numel()),
            numpy.int64(0), numpy.int64(1), numpy.float32(0.5))
    kernel(((x.numel() // vec + threads - 1) // threads,), (threads,), args, shared_mem=kb * 1024)
    return out


def blocks_per_sm(kernel, threads, kb):
    """The driver's occupancy for a launch shape (cupy.RawKernel, threads, KB of dynamic shared memory)."""
    import cupy

    return cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, kb * 1024)


def check_bits(name, fns, ref):
    """Every shape of a kernel gives torch's bits (GELU's math differs from torch's in the last bits)."""
    for key, fn in fns.items():
        if key != "torch":
            assert torch.equal(fn(), ref) or name.startswith("gelu"), f"{name} {key}: not torch's bits"


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import _modules

    header = ["kernel", "threads", "dynamic smem KB", "carveout %", "blocks/SM", "us", "torch us", "x torch"]
    rows = []
    for name, dtype, reads, theirs in CASES:
        x, y = (torch.randn(N, device="cuda", dtype=dtype) for _ in range(2))
        kernel = _modules.get_function("elementwise", f"{name}_{SUFFIX[dtype]}", 0)
        fns = {"torch": lambda x=x, y=y: theirs(x, y)}
        occupancy = {}
        for threads, kb, carveout in SHAPES:
            def ours(threads=threads, kb=kb, carveout=carveout, x=x, y=y, reads=reads):
                kernel.preferred_shared_memory_carveout = carveout
                return map_call(kernel, x, y, reads, threads, kb)
            kernel.preferred_shared_memory_carveout = carveout
            occupancy[(threads, kb, carveout)] = blocks_per_sm(kernel, threads, kb)
            fns[(threads, kb, carveout)] = ours
        ref = theirs(x, y)
        check_bits(name, fns, ref)
        times = device_times_us(fns)
        for key in SHAPES:
            threads, kb, carveout = key
            rows.append(dict(zip(header, (f"{name}_{SUFFIX[dtype]}", threads, kb, carveout, occupancy[key],
                                          f"{times[key]:.2f}", f"{times['torch']:.2f}",
                                          f"{times['torch'] / times[key]:.4f}"))))
            print(rows[-1], flush=True)
        kernel.preferred_shared_memory_carveout = -1
        del x, y, fns, ref
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_map_carveout", "python bench/explore_map_carveout.py", [
        ("The capped map launch's shapes and carveouts, 64M elements", header, rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
