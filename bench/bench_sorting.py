"""Benchmark of the sorting family (sort, argsort, topk) against torch, in one run on one GPU.

sort at 65536 x 1024 (float32, bfloat16, int64; float32 argsort too) and a sweep of row
lengths 2 .. 65536 at a fixed 2**24 float32 elements; topk at 65536 x 1024 k=8 and 64 x 128256
k=50 (float32). (The launch tables' tuning, every tile and long-row path side by side, is
dev/tune_sorting.py.) CUDA events, interleaved
rounds, medians after warm-up; rawops through the torch adapter's no-grad path, torch.sort /
torch.argsort / torch.topk with their defaults (stable=False), on the same tensors.
Bytes: keys read once, values and int64 indices written once (argsort: indices only; topk: k
values and indices a row), over the time, and as a fraction of the copy ceiling measured in the
same run. Bars: sort >= 3x torch at 65536 x 1024 float32; >= 1x torch at every sweep length;
topk >= 5x torch at 65536 x 1024 k=8, >= 2x at 64 x 128256 k=50.

    python bench/bench_sorting.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import ROW_HEADER, device_times_us, row_result, start, write_results  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "i64": torch.int64, "f16": torch.float16,
          "i32": torch.int32}
MAIN_SHAPE = (65536, 1024)
MAIN_DTYPES = ("f32", "bf16", "i64")
SWEEP_ELEMENTS = 1 << 24
SWEEP_LENGTHS = (2, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
TOPK_CASES = (((65536, 1024), 8, 5.0), ((64, 128256), 50, 2.0))


def _input(shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
    return torch.randint(-(1 << 30), 1 << 30, shape, device="cuda", dtype=dtype)


def _bytes(x, values=True):
    return x.numel() * ((2 * x.element_size() if values else x.element_size()) + 8)


def _row(op, dtype_name, x, nbytes, fns, ceiling, bar):
    times = device_times_us(fns)
    us, torch_us = times["rawops"], times["torch"]
    meets = torch_us / us >= bar if bar is not None else "-"
    return row_result(op, dtype_name, "x".join(map(str, x.shape)), nbytes, us, torch_us, {}, ceiling, meets)


def main_rows(ta, ceiling):
    rows = []
    for name in MAIN_DTYPES:
        x = _input(MAIN_SHAPE, DTYPES[name])
        rows.append(_row("sort", name, x, _bytes(x), {"rawops": lambda: ta.sort(x), "torch": lambda: torch.sort(x)},
                         ceiling, 3.0 if name == "f32" else None))
        if name == "f32":
            rows.append(_row("argsort", name, x, _bytes(x, False),
                             {"rawops": lambda: ta.argsort(x), "torch": lambda: torch.argsort(x)}, ceiling, None))
    return rows


def sweep_rows(ta, ceiling):
    rows = []
    for n in SWEEP_LENGTHS:
        x = _input((SWEEP_ELEMENTS // n, n), torch.float32)
        rows.append(_row("sort", "f32", x, _bytes(x), {"rawops": lambda: ta.sort(x), "torch": lambda: torch.sort(x)},
                         ceiling, 1.0))
    return rows


def topk_rows(rs, ta, ceiling):
    from rawops import _modules

    if not hasattr(rs, "topk"):
        print("bench: rawops.sorting has no topk here; its rows are skipped", flush=True)
        return []
    if not os.path.exists(_modules.fatbin_path("sorting_topk")):
        print("bench: the sorting_topk fatbin is not built here; the topk rows are skipped", flush=True)
        return []
    rows = []
    for shape, k, bar in TOPK_CASES:
        x = _input(shape, torch.float32)
        nbytes = x.numel() * 4 + shape[0] * k * 12
        try:
            rows.append(_row(f"topk k={k}", "f32", x, nbytes,
                             {"rawops": lambda: ta.topk(x, k), "torch": lambda: torch.topk(x, k)}, ceiling, bar))
        except Exception as error:  # the topk family is built separately; its failure is not sort's
            print(f"bench: topk not available yet ({error}); its rows are skipped", flush=True)
            return rows
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    import rawops.sorting as rs
    import rawops.torch_adapter.sorting as ta

    notes = {"copy ceiling TB/s": round(ceiling, 3),
             "bytes": "keys read + values and int64 indices written (argsort: indices only)"}
    text = write_results(out_dir, "sorting", "python bench/bench_sorting.py", [
        (f"sort, {MAIN_SHAPE[0]}x{MAIN_SHAPE[1]}", ROW_HEADER, main_rows(ta, ceiling),
         {**notes, "target": "float32 sort >= 3x torch.sort"}),
        (f"sort, row lengths at {SWEEP_ELEMENTS} float32 elements", ROW_HEADER, sweep_rows(ta, ceiling),
         {**notes, "target": ">= 1x torch.sort at every length"}),
        ("topk (float32)", ROW_HEADER, topk_rows(rs, ta, ceiling),
         {"bytes": "x read + k values and int64 indices a row written",
          "targets": "65536x1024 k=8 >= 5x torch.topk; 64x128256 k=50 >= 2x"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
