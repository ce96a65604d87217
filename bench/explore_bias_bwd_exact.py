"""The half types' fused GELU backward with dbias summed exactly (int64 fixed-point accumulators,
no partial rows: rawops.elementwise.USE_EXACT_HALF_SUM; float16 in units of 2^-24, bfloat16 in 32-bit
digits, and float16 through the digits too: DIGITS_FOR_F16) against the same tiles writing partial
rows for column_sum_final (the switch off), through the library's call (torch_adapter._bias_gelu_bwd,
as bench_elementwise times it), in interleaved rounds beside torch, at bench_elementwise's shape
(64M elements as 16384 x 4096, both GELU forms), around the 2^24-element threshold and at
linear_gelu's backward shapes (no bias). Checked in the same run: dx the same bits every way, dbias
repeatable, and each dbias's error against the float64 sum of dx.

    python bench/explore_bias_bwd_exact.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import copy_ceiling_tbps, device_times_us, start, switched, write_results  # noqa: E402

# (rows, cols, bias?, approximate): bench_elementwise's row first, then linear_gelu's backward
# (dpre and dbias without a bias) at 8192, 256 and 32 tokens of 3072 features, and a 768-wide one.
SHAPES = [(16384, 4096, True, "tanh"), (16384, 4096, True, "none"), (8192, 3072, False, "tanh"),
          (4096, 4096, True, "tanh"), (2048, 4096, True, "tanh"), (4096, 768, True, "tanh")]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    ceiling = copy_ceiling_tbps()
    rows = []
    for name, dtype in DTYPES.items():
        for r, c, with_bias, approximate in SHAPES:
            dy, x = (torch.randn(r, c, device="cuda", dtype=dtype) for _ in range(2))
            bias = torch.randn(c, device="cuda", dtype=dtype) if with_bias else None

            def call(exact, digits=False):  # the size threshold off: every way at every shape
                def fused():
                    return ta._bias_gelu_bwd_fused(dy, x, bias, approximate)
                return switched(ew, "EXACT_MIN_ELEMENTS", 0, switched(ew, "USE_EXACT_HALF_SUM", exact, switched(
                    ew, "DIGITS_FOR_F16", digits, fused)))

            def torch_call():
                dx = torch.ops.aten.gelu_backward(dy, x + bias if with_bias else x, approximate=approximate)
                return dx, dx.sum(0)

            variants = {"exact": call(True), "partial": call(False), "torch": torch_call}
            if name == "f16":
                variants["f16 digits"] = call(True, True)
            results = {v: variants[v]() for v in variants if v != "torch"}
            repeat = call(True)()[1]
            ref = results["exact"][0].double().sum(0)
            times = device_times_us(variants, rounds=8)
            nbytes = 3 * dy.numel() * dy.element_size()
            row = {"dtype": name, "shape": f"{r}x{c}", "bias": with_bias, "gelu": approximate,
                   "exact us": times["exact"], "f16 digits us": times.get("f16 digits"),
                   "partial rows us": times["partial"], "torch us": times["torch"],
                   "exact of copy ceiling": nbytes / times["exact"] / 1e6 / ceiling,
                   "partial of copy ceiling": nbytes / times["partial"] / 1e6 / ceiling,
                   "x partial": times["partial"] / times["exact"], "x torch": times["torch"] / times["exact"],
                   "dx same bits": all(torch.equal(results["exact"][0], dx) for dx, _ in results.values()),
                   "dbias repeatable": torch.equal(results["exact"][1], repeat)}
            for v in ("exact", "partial", "f16 digits"):
                db = results[v][1] if v in results else None
                row[f"dbias rel err {v}"] = None if db is None else ((db.double() - ref).norm() / ref.norm()).item()
            row["dbias columns differing from partial"] = (results["exact"][1] != results["partial"][1]).double().mean().item()
            rows.append(row)
            print(row, flush=True)
            del dy, x, bias, results
            torch.cuda.empty_cache()
    write_results(out_dir, "explore_bias_bwd_exact", "python bench/explore_bias_bwd_exact.py", [
        ("half-type GELU backward + dbias: exact fixed-point sums vs partial rows (the library's call)",
         list(rows[0]), rows, {"copy ceiling TB/s": ceiling})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
