"""bias_gelu's forward (the map kernel with a row vector) in its two launch shapes: 256 threads
(what ships) and the capped one of the light ops on sm_90 (_launch.map_shape: 128 threads with
unused dynamic shared memory holding 13 blocks an SM), at bench_elementwise's shape (64M elements
as 16384 x 4096), both GELU forms, every dtype, torch beside, interleaved rounds. The same kernel
both ways (MapKernel built with capped on and off), so the outputs must be the same bits.

    python bench/explore_bias_gelu_fwd.py [--out bench/results]
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_times_us, start, write_results  # noqa: E402

ROWS, COLS = 16384, 4096
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import elementwise as ew
    import rawops.torch_adapter  # noqa: F401  (hands torch's tensor type to the launcher)

    rows = []
    for name, dtype in DTYPES.items():
        x = torch.randn(ROWS, COLS, device="cuda", dtype=dtype)
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        nbytes = 2 * x.numel() * x.element_size()
        for mode, approximate in (("tanh", "tanh"), ("erf", "none")):
            kernel_name = f"bias_gelu_{mode}_fwd"
            names, reads_b, reads_c = ew.KERNELS[kernel_name]
            shapes = {capped: ew.MapKernel(ew.FAMILY, kernel_name, names, reads_b, reads_c, capped)
                      for capped in (False, True)}
            candidates = {f"{'capped 128 + 16 KB' if capped else '256 threads'}":
                          (lambda kernel=kernel: kernel.torch_call(x, c=bias)) for capped, kernel in shapes.items()}
            candidates["torch"] = lambda approximate=approximate: F.gelu(x + bias, approximate=approximate)
            same = torch.equal(candidates["256 threads"](), candidates["capped 128 + 16 KB"]())
            times = device_times_us(candidates, rounds=8)
            for label, us in times.items():
                row = {"dtype": name, "gelu": mode, "launch": label, "us": us, "TB/s": nbytes / us / 1e6,
                       "of copy ceiling": nbytes / us / 1e6 / ceiling, "x torch": times["torch"] / us,
                       "same bits": same if label != "torch" else "-"}
                rows.append(row)
                print(row, flush=True)
        del x
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_bias_gelu_fwd", "python bench/explore_bias_gelu_fwd.py", [
        (f"bias_gelu forward, {ROWS}x{COLS}: the map kernel's two launch shapes",
         ["dtype", "gelu", "launch", "us", "TB/s", "of copy ceiling", "x torch", "same bits"], rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
