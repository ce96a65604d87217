"""The one-block-a-row sort tile of 1024 keys (sort_rows_128x8_match: the 65536 x 1024 bar row, 2.44x
torch.sort on the H100 against 3x) at more blocks an SM: shipped, float32's tile takes 66 registers, so
7 blocks of 128 fit an SM (the 16-bit one 64: 8). RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=B builds the tiles
with __launch_bounds__(128, B): B 8 holds float32's to 64 registers, no spill; B 10 to 48 with a
72-byte stack (cuobjdump -res-usage). Each variant's cubin (dev/cubins.py, carried in dev/.cubins)
beside the shipped kernel and torch.sort in interleaved rounds; indices and values checked equal to
torch.sort(stable=True)'s first. Experiment, not a bench.

    python dev/cubins.py 90 sorting RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=8   # (and =10) where nvcc is
    python dev/time_sort_occupancy.py
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

VARIANTS = {"shipped": [], "8 blocks": ["RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=8"],
            "10 blocks": ["RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=10"]}
SHAPES = [(65536, 1024, torch.float32, "f32"), (65536, 1024, torch.int32, "i32"), (65536, 1024, torch.bfloat16, "bf16")]


def main():
    modules = build_modules("sorting", VARIANTS)
    print(f"{torch.cuda.get_device_name()}: sort_rows_128x8_match by occupancy, us a launch")
    for rows, n, dtype, suffix in SHAPES:
        if dtype.is_floating_point:
            x = torch.randn(rows, n, device="cuda").to(dtype)
        else:
            x = torch.randint(-(1 << 30), 1 << 30, (rows, n), device="cuda", dtype=dtype)
        want = torch.sort(x, stable=True)
        fns = {"torch.sort": lambda x=x: torch.sort(x)}
        stream = torch.cuda.current_stream().cuda_stream
        for name, module in modules.items():
            kernel = module.get_function(f"sort_rows_128x8_match_{suffix}")
            values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64, device="cuda")
            args = (x.data_ptr(), values.data_ptr(), indices.data_ptr(), rows, n, n, 0)

            def call(kernel=kernel, args=args):
                launch(kernel.kernel.ptr, (min(rows, rs.MAX_GRID),), 128, 0, stream, args, rs.ROWS_KINDS, 0)
            values.fill_(0)
            call()
            torch.cuda.synchronize()
            ok = torch.equal(indices, want.indices) and torch.equal(values, want.values)
            print(f"  {suffix} {name:10s} registers {kernel.num_regs:3d}, local {kernel.local_size_bytes:3d} B: "
                  f"{'equal to torch.sort(stable=True)' if ok else 'WRONG, not timed'}", flush=True)
            if ok:
                fns[name] = call
        times = timing.device_times_us(fns)
        for name, us in times.items():
            print(f"  {suffix} {rows}x{n} {name:10s} {us:8.1f} us  {times['torch.sort'] / us:5.2f}x torch.sort",
                  flush=True)
        del x, want
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
