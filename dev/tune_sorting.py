"""The sorting family's launch tables, measured: every compiled block tile in both cub rankings
at its full length (2**26 elements), and both long-row paths (merge with either chunk ranking,
segmented), torch.sort beside, the current choice of rawops/sorting.py marked. What it shows
sets TILES / RANKING / WIDE_RANKING / LONG_PATH there. Scratch, not a bench: prints its tables.

    python dev/tune_sorting.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from timing import ROW_HEADER, device_times_us, render, row_result, start  # noqa: E402
from bench_sorting import DTYPES, _bytes, _input  # noqa: E402


def _variant(rs, x, values, indices, **choice):
    """One launch_sort on x's rows with a choice of tile, ranking or long-row path."""
    suffix = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int64: "i64"}[x.dtype]
    stream = torch.cuda.current_stream().cuda_stream
    held = []

    def scratch(nbytes):
        held[:] = [torch.empty(nbytes, dtype=torch.uint8, device="cuda")]
        return held[0].data_ptr()

    return lambda: rs.launch_sort(0, suffix, x.data_ptr(), values.data_ptr(), indices.data_ptr(), x.shape[0],
                                  x.shape[1], x.shape[1], False, stream, scratch, **choice)


def _variant_rows(rs, name, x, choices, ceiling, chosen, **timing):
    values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64, device="cuda")
    fns = {label: _variant(rs, x, values, indices, **choice) for label, choice in choices.items()}
    fns["torch"] = lambda: torch.sort(x)
    times = device_times_us(fns, **timing)
    return [row_result(f"sort {label}{' (chosen)' if label == chosen else ''}", name, "x".join(map(str, x.shape)),
                       _bytes(x), times[label], times["torch"], {}, ceiling, "-") for label in choices]


def tile_rows(rs, ceiling):
    """Every compiled tile in both rankings at its full length (2**26 elements): float32 at
    every size, bfloat16 and int64 at 1024."""
    rows = []
    for name, sizes in (("f32", sorted({t * i for t, i in rs.TILE_CANDIDATES})), ("bf16", [1024]), ("i64", [1024])):
        dtype = DTYPES[name]
        candidates = rs.WIDE_CANDIDATES if name == "i64" else rs.TILE_CANDIDATES
        for size in sizes:
            x = _input(((1 << 26) // size, size), dtype)
            choices = {f"tile {t}x{i} {r}": {"tile": (t, i), "ranking": r}
                       for t, i in candidates if t * i == size for r in rs.RANKINGS}
            bits = rs.BITS_OF[name]
            tile = rs.tile_for(size, bits)
            chosen = f"tile {tile[0]}x{tile[1]} {(rs.WIDE_RANKING if bits == 64 else rs.RANKING)[tile]}"
            rows += _variant_rows(rs, name, x, choices, ceiling, chosen)
    return rows


def long_rows(rs, ceiling):
    """The long-row paths: merge (both chunk rankings) and segmented, float32 at 2**24 elements
    and a few rows of 2**20, bfloat16 and int64 at 256 x 65536."""
    rows = []
    for name, shape in (("f32", (1024, 16384)), ("f32", (256, 65536)), ("f32", (4, 1 << 20)), ("bf16", (256, 65536)),
                        ("i64", (256, 65536))):
        x = _input(shape, DTYPES[name])
        bits = rs.BITS_OF[name]
        chunk = rs.chunk_tile(bits)
        choices = {f"merge {r}": {"long_path": "merge", "ranking": r} for r in rs.RANKINGS}
        choices["segmented"] = {"long_path": "segmented"}
        ranking = (rs.WIDE_RANKING if bits == 64 else rs.RANKING)[chunk]
        chosen = "segmented" if rs.long_path_for(shape[1], bits) == "segmented" else f"merge {ranking}"
        timing = {"reps": 5, "rounds": 2} if shape[0] < 16 else {}
        rows += _variant_rows(rs, name, x, choices, ceiling, chosen, **timing)
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 0
    _, ceiling = started
    import rawops.sorting as rs

    print(render({"command": "python dev/tune_sorting.py"}, [
        ("block tiles", ROW_HEADER, tile_rows(rs, ceiling), {}),
        ("long rows", ROW_HEADER, long_rows(rs, ceiling), {}),
    ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
