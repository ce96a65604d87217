"""Whether the elementwise rows held to ">= 1.0x torch" are wins, losses or ties: the ratio of each
row measured many times in one run, beside two controls of the timer's own spread, an A/A pair
(torch's op against itself; the library's against itself) timed the same way. A row whose ratios
spread like the A/A pair's around 1.0 is a tie that the bench's single reading settles by chance.

Each repetition is one bench reading (timing.device_times_us: 5 interleaved rounds of 20 calls,
the median); the rows and operands are bench_elementwise's, at 64M elements, in two layouts: the
bench's three buffers (x, y, dy, made in that order) and, for float16, two (x, dy; y = dy), the
layout of this script's first run, where the float16 backwards read 1.002-1.005x against the
bench's 0.999-1.00x in the same session.

    python bench/explore_ties.py [--reps 20] [--out bench/results]
"""
import os
import statistics
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_times_us, start, write_results  # noqa: E402

N = 64 << 20
COLS = 4096  # bench_elementwise's last dim for the bias ops
REPS = 20
LAYOUTS = ("bench", "two buffers")
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def cases(ta, x, y, dy, bias):
    """The rows without a fused win to show (the bar is 1.0x), and bias_gelu erf's backward:
    name -> (rawops call, torch call), on bench_elementwise's operands."""
    gelu_bwd = torch.ops.aten.gelu_backward
    x2, dy2 = x.view(-1, COLS), dy.view(-1, COLS)

    def torch_bias_gelu_erf_bwd():
        dx = gelu_bwd(dy2, x2 + bias)
        return dx, dx.sum(0)
    return {
        "relu": (lambda: ta.relu(x), lambda: F.relu(x)),
        "gelu tanh": (lambda: ta.gelu(x, "tanh"), lambda: F.gelu(x, approximate="tanh")),
        "gelu tanh bwd": (lambda: ta._gelu_bwd(dy, x, "tanh"), lambda: gelu_bwd(dy, x, approximate="tanh")),
        "gelu erf bwd": (lambda: ta._gelu_bwd(dy, x, "none"), lambda: gelu_bwd(dy, x)),
        "add": (lambda: ta.add(x, y), lambda: x + y),
        "bias_gelu erf bwd (dx+dbias)": (lambda: ta._bias_gelu_bwd(dy2, x2, bias, "none"), torch_bias_gelu_erf_bwd),
    }


def operands(dtype, layout):
    """x, y, dy, bias. "bench": three buffers made in bench_elementwise's order (x, y, dy);
    "two buffers": x and dy only, y being dy (the first version of this script)."""
    x = torch.randn(N, device="cuda", dtype=dtype)
    y = torch.randn(N, device="cuda", dtype=dtype) if layout == "bench" else None
    dy = torch.randn(N, device="cuda", dtype=dtype)
    return x, dy if y is None else y, dy, torch.randn(COLS, device="cuda", dtype=dtype)


def spread(ratios):
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            ">= 1.0": f"{sum(r >= 1.0 for r in ratios)} of {len(ratios)}"}


def main():
    reps = REPS
    if "--reps" in sys.argv:  # start() parses --out only
        at = sys.argv.index("--reps")
        reps = int(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import torch_adapter as ta

    header = ["layout", "row", "dtype", "pair", "median x", "min x", "max x", ">= 1.0", "median us (first)", "median us (second)"]
    rows = []
    for layout in LAYOUTS:
        for dtype_name in ("f16", "bf16", "f32"):
            if layout != "bench" and dtype_name != "f16":
                continue  # the second layout for the float16 rows only
            x, y, dy, bias = operands(DTYPES[dtype_name], layout)
            for name, (ours, theirs) in cases(ta, x, y, dy, bias).items():
                if dtype_name == "f32" and name not in ("relu", "gelu erf bwd"):
                    continue  # two float32 rows as controls (1.01x in every bench run)
                pairs = {"rawops / torch": (ours, theirs), "torch / torch (A/A)": (theirs, theirs),
                         "rawops / rawops (A/A)": (ours, ours)}
                if dtype_name != "f16" or name not in ("relu", "gelu erf bwd"):
                    del pairs["rawops / rawops (A/A)"]  # one library A/A per kind of row is enough
                for pair, (first, second) in pairs.items():
                    ratios, firsts, seconds = [], [], []
                    for _ in range(reps):
                        # "second" over "first" as the bench's "x torch": > 1 means the first is faster.
                        t1, t2 = device_times_us({"first": first, "second": second}).values()
                        ratios.append(t2 / t1)
                        firsts.append(t1)
                        seconds.append(t2)
                    s = spread(ratios)
                    rows.append({"layout": layout, "row": name, "dtype": dtype_name, "pair": pair,
                                 "median x": f"{s['median']:.4f}", "min x": f"{s['min']:.4f}",
                                 "max x": f"{s['max']:.4f}", ">= 1.0": s[">= 1.0"],
                                 "median us (first)": f"{statistics.median(firsts):.2f}",
                                 "median us (second)": f"{statistics.median(seconds):.2f}",
                                 "ratios": [round(r, 5) for r in ratios]})
                    print({k: v for k, v in rows[-1].items() if k != "ratios"}, flush=True)
            del x, y, dy, bias
            torch.cuda.empty_cache()
    write_results(out_dir, "explore_ties", f"python bench/explore_ties.py --reps {reps}", [
        (f"Each row's ratio over {reps} bench readings in one run, 64M elements", header, rows,
         {"x": "the second's time over the first's (the bench's 'x torch' for rawops / torch)",
          "A/A": "the same call on both sides: the spread the timer alone gives a ratio"})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
