"""The one-block-a-row sort tiles with positions packed into the keys' low 16 bits (issue 27: f32
65536 x 1024 at 2.44x torch.sort on the H100 against 3x; the tile is bound by the shared-memory pipe,
dev/ncu_targets.sh sort). RAWOPS_DEV_SORT_PACK=1 (kernels/sorting.cu, BlockSort::kPack): where the keys'
bits are not wanted back, once the passes over the keys' low bits are ranked each item's position
replaces them (8 bits in tiles of <= 256 keys, else 16), so that pass and every later one but the last
exchange one word an item instead of a key and a 16-bit position (1024-key f32 / i32 tiles: 2 of 4
passes; i64: 6 of 8; 256-key f32: 3 of 4; bf16: 1 of 2). Each
variant's cubin (dev/cubins.py, carried in dev/.cubins) beside the shipped kernel and torch.sort in
interleaved rounds ("packed 8bl": also held to 8 blocks an SM, 64 registers, on the 1024-key tile
only; dev/time_sort_occupancy.py: 913 against 929 us unpacked), on the tile rawops' plan takes for
each shape; values and indices checked equal to torch.sort(stable=True)'s first (and the descending
order's for f32 1024). Experiment, not a bench.

    python dev/cubins.py 90 sorting RAWOPS_DEV_SORT_PACK=1   # where nvcc is; the same with
    python dev/cubins.py 90 sorting RAWOPS_DEV_SORT_PACK=1 RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=8
    python dev/time_sort_pack.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE, os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import sorting as rs  # noqa: E402
from rawops._launch import launch  # noqa: E402

VARIANTS = {"shipped": [], "packed": ["RAWOPS_DEV_SORT_PACK=1"],
            "packed 8bl": ["RAWOPS_DEV_SORT_PACK=1", "RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=8"]}
ONLY = {"packed 8bl": "sort_rows_128x8_match"}  # variant -> the one tile it is timed on (its bounds fit no other)
SHAPES = [(65536, 1024, torch.float32, "f32"), (65536, 1024, torch.int32, "i32"), (65536, 1024, torch.int64, "i64"),
          (16384, 4096, torch.float32, "f32"), (8192, 8192, torch.float32, "f32"), (262144, 256, torch.float32, "f32"),
          (262144, 256, torch.bfloat16, "bf16"), (131072, 128, torch.float32, "f32")]


def operand(rows, n, dtype):
    if dtype.is_floating_point:
        return torch.randn(rows, n, device="cuda").to(dtype)
    return torch.randint(-(1 << 30), 1 << 30, (rows, n), device="cuda", dtype=dtype)


def main():
    modules = build_modules("sorting", VARIANTS)
    print(f"{torch.cuda.get_device_name()}: one-block sort tiles, positions packed into the keys or not, us a launch")
    stream = torch.cuda.current_stream().cuda_stream
    for rows, n, dtype, suffix in SHAPES:
        x = operand(rows, n, dtype)
        plan = rs.plan(rows, n, rs.BITS_OF[suffix])
        fns = {"torch.sort": lambda x=x: torch.sort(x)}
        for descending in ((False, True) if (n, suffix) == (1024, "f32") else (False,)):
            want = torch.sort(x, stable=True, descending=descending)
            for name, module in modules.items():
                if ONLY.get(name, plan.kernel) != plan.kernel:
                    continue
                kernel = module.get_function(f"{plan.kernel}_{suffix}")
                values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64, device="cuda")
                args = (x.data_ptr(), values.data_ptr(), indices.data_ptr(), rows, n, n, int(descending))

                def call(kernel=kernel, args=args):
                    launch(kernel.kernel.ptr, (plan.blocks,), plan.threads, 0, stream, args, rs.ROWS_KINDS, 0)
                values.fill_(0)
                indices.fill_(-1)
                call()
                torch.cuda.synchronize()
                ok = torch.equal(indices, want.indices) and torch.equal(values, want.values)
                print(f"  {suffix} {rows}x{n} {plan.kernel} {name:8s}{' descending' if descending else ''}: registers "
                      f"{kernel.num_regs:3d}, local {kernel.local_size_bytes:3d} B: "
                      f"{'equal to torch.sort(stable=True)' if ok else 'WRONG, not timed'}", flush=True)
                if ok and not descending:
                    fns[name] = call
        times = timing.device_times_us(fns)
        for name, us in times.items():
            print(f"  {suffix} {rows}x{n} {name:10s} {us:8.1f} us  {times['torch.sort'] / us:5.2f}x torch.sort",
                  flush=True)
        del x, want, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
