"""The sorting family's old and new paths side by side, in one run, torch.sort beside: the merge
network (sort_net_*) against the block tiles (the plan's tile, its ranking) at row lengths up to
1024, and the block merge (sort_bmerge_*) against the thread merge (sort_merge_*) and the
segmented passes on rows past the largest tile; on issue 27's bar shapes (65536 x 1024 and 256 x
65536) and a sweep of row lengths 64 .. 131072 at 2**24 elements. Every variant's indices are
first checked equal to torch.sort(stable=True)'s on the timed tensor (a wrong kernel is flagged,
not timed). Ends with what to set in rawops/sorting.py: NETWORK_MAX (the longest row from
which down the network wins at every timed length) and MERGE_PATH. Scratch, not a bench: it
prints its tables.

    python dev/time_sort_paths.py [--quick]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from timing import ROW_HEADER, device_times_us, render, row_result, start  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
          "i64": torch.int64}
SWEEP_ELEMENTS = 1 << 24
# (rows, n, dtype): the bar shapes first
NETWORK_SHAPES = [(65536, 1024, "f32"), (65536, 1024, "bf16"), (65536, 1024, "i32")] + [
    (SWEEP_ELEMENTS // n, n, dt) for dt in ("f32", "bf16") for n in (64, 128, 256, 512, 1024)]
LONG_SHAPES = [(256, 65536, "f32"), (256, 65536, "bf16"), (256, 65536, "i64")] + [
    (SWEEP_ELEMENTS // n, n, "f32") for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)]
QUICK = {(65536, 1024, "f32"), (256, 65536, "f32"), (SWEEP_ELEMENTS // 512, 512, "f32"),
         (SWEEP_ELEMENTS // 16384, 16384, "f32")}


def _input(shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
    return torch.randint(-(1 << 30), 1 << 30, shape, device="cuda", dtype=dtype)


def _variant(rs, x, values, indices, choice):
    """One launch_sort on x's rows with a choice of path (rs.plan's keywords)."""
    suffix = rs.KEY_TYPES[str(x.dtype).removeprefix("torch.")][0]
    stream = torch.cuda.current_stream().cuda_stream
    held = []

    def scratch(nbytes):
        held[:] = [torch.empty(nbytes, dtype=torch.uint8, device="cuda")]
        return held[0].data_ptr()

    return lambda: rs.launch_sort(0, suffix, x.data_ptr(), values.data_ptr(), indices.data_ptr(), x.shape[0],
                                  x.shape[1], x.shape[1], False, stream, scratch, **choice)


def _rows(rs, shape, name, choices, ceiling, chosen):
    """Times every choice valid for this shape (plan() raises for the others) beside torch.sort;
    {label: us} of the correct ones, and their table rows."""
    x = _input(shape[:2], DTYPES[name])
    values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64, device="cuda")
    bits = rs.BITS_OF[name]
    expected = torch.sort(x, stable=True).indices
    fns = {}
    for label, choice in choices.items():
        try:
            rs.plan(shape[0], shape[1], bits, **choice)
        except ValueError:
            continue
        fn = _variant(rs, x, values, indices, choice)
        indices.fill_(-1)
        fn()
        if not torch.equal(indices, expected):
            print(f"WRONG: {label} at {shape[0]}x{shape[1]} {name}: indices differ from torch.sort(stable=True)'s",
                  flush=True)
            continue
        fns[label] = fn
    fns["torch"] = lambda: torch.sort(x)
    timing = {"reps": 5, "rounds": 3} if shape[0] * shape[1] > SWEEP_ELEMENTS else {}
    times = device_times_us(fns, **timing)
    nbytes = x.numel() * (2 * x.element_size() + 8)
    rows = [row_result(f"sort {label}{' (plan)' if label == chosen else ''}", name, f"{shape[0]}x{shape[1]}",
                       nbytes, times[label], times["torch"], {}, ceiling, "-") for label in fns if label != "torch"]
    return {label: us for label, us in times.items()}, rows


def network_section(rs, ceiling, quick):
    rows, results = [], {}
    for rows_, n, name in NETWORK_SHAPES:
        if quick and (rows_, n, name) not in QUICK:
            continue
        bits = rs.BITS_OF[name]
        tile = rs.tile_for(n, bits)
        choices = {"tile": {"network": False}, **{f"network {ex}": {"network": ex} for ex in rs.NETWORK_EXCHANGES}}
        p = rs.plan(rows_, n, bits)
        chosen = "tile" if p.kind == "tile" else f"network {p.kernel.split('_')[2]}" if p.kind == "network" else p.kind
        times, found = _rows(rs, (rows_, n), name, choices, ceiling, chosen)
        rows += found
        results[(bits, n, name, rows_)] = times
        print(f"  {rows_}x{n} {name}: tile {tile} -> " + ", ".join(f"{k} {v:.1f} us" for k, v in times.items()),
              flush=True)
    return rows, results


def long_section(rs, ceiling, quick):
    rows, results = [], {}
    for rows_, n, name in LONG_SHAPES:
        if quick and (rows_, n, name) not in QUICK:
            continue
        bits = rs.BITS_OF[name]
        if rs.tile_for(n, bits) is not None:  # not a long row: the tile beside the network (if any) and torch
            choices = {"tile": {"network": False}, **{f"network {ex}": {"network": ex} for ex in rs.NETWORK_EXCHANGES}}
            chosen = "tile"
        else:
            choices = {"block_merge": {"long_path": "block_merge"}, "merge": {"long_path": "merge"},
                       "segmented": {"long_path": "segmented"}}
            chosen = rs.long_path_for(n, bits)
        times, found = _rows(rs, (rows_, n), name, choices, ceiling, chosen)
        rows += found
        results[(bits, n, name, rows_)] = times
    return rows, results


def advice(rs, network, long):
    lines = []
    for (bits, n, name, rows), t in sorted(network.items()):
        nets = {label: us for label, us in t.items() if label.startswith("network")}
        if nets and "tile" in t:
            fastest = min(nets, key=nets.get)
            listed = ", ".join(f"{k} {v:.1f}" for k, v in nets.items())
            lines.append(f"  {rows}x{n} {name}: tile {t['tile']:.1f} us, {listed}"
                         + f", torch {t['torch']:.1f} ({t['torch'] / min(t['tile'], nets[fastest]):.2f}x torch at "
                         f"the faster)")
    for exchange in rs.NETWORK_EXCHANGES:
        label = f"network {exchange}"
        for bits in (16, 32):
            timed = [(n, t) for (b, n, _, _), t in network.items() if b == bits and label in t and "tile" in t]
            best = 0
            for n, _ in timed:  # the longest n with the network faster at it and every shorter timed length
                if all(t[label] < t["tile"] for m, t in timed if m <= n):
                    best = max(best, n)
            lines.append(f"with NETWORK_EXCHANGE = {exchange!r}: NETWORK_MAX[{bits}] = {best}  "
                         f"(now {rs.NETWORK_EXCHANGE!r}, {rs.NETWORK_MAX[bits]})")
    wins = {label: 0 for label in ("block_merge", "merge")}
    for (bits, n, name, rows), t in long.items():
        if "block_merge" in t and "merge" in t:
            wins["block_merge" if t["block_merge"] < t["merge"] else "merge"] += 1
            lines.append(f"  {rows}x{n} {name}: block_merge {t['block_merge']:.1f} us, merge {t['merge']:.1f}, "
                         f"segmented {t.get('segmented', float('nan')):.1f}, torch {t['torch']:.1f} "
                         f"({t['torch'] / min(t['block_merge'], t['merge']):.2f}x torch at the faster)")
    lines.append(f"MERGE_PATH: block_merge faster at {wins['block_merge']} of {sum(wins.values())} long shapes "
                 f"(now {rs.MERGE_PATH!r})")
    return lines


def main():
    quick = "--quick" in sys.argv
    if quick:
        sys.argv.remove("--quick")  # start() parses the rest
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 0
    _, ceiling = started
    import rawops.sorting as rs

    network_rows, network = network_section(rs, ceiling, quick)
    long_rows, long = long_section(rs, ceiling, quick)
    print(render({"command": "python dev/time_sort_paths.py", "copy ceiling TB/s": round(ceiling, 3)}, [
        ("merge network against the block tiles", ROW_HEADER, network_rows, {}),
        ("long rows: block merge, thread merge, segmented (and the tiles' lengths)", ROW_HEADER, long_rows, {}),
    ]))
    print("\n".join(advice(rs, network, long)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
