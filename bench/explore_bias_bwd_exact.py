"""float16's fused GELU backward with dbias summed exactly (int64 fixed-point accumulators, no
partial rows: rawops.elementwise.USE_EXACT_HALF_SUM) against the same tiles writing partial rows
for column_sum_final (the switch off), through the library's call (torch_adapter._bias_gelu_bwd,
as bench_elementwise times it), in interleaved rounds beside torch, at bench_elementwise's shape
(64M elements as 16384 x 4096, both GELU forms) and at linear_gelu's backward shapes (no bias).
Checked in the same run: dx the same bits both ways, dbias repeatable, and each dbias's error
against the float64 sum of dx.

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
          (4096, 4096, True, "tanh"), (2048, 4096, True, "tanh"), (4096, 768, True, "tanh"),
          (256, 3072, False, "tanh"), (32, 3072, False, "tanh")]


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    ceiling = copy_ceiling_tbps()
    rows = []
    for r, c, with_bias, approximate in SHAPES:
        dy, x = (torch.randn(r, c, device="cuda", dtype=torch.float16) for _ in range(2))
        bias = torch.randn(c, device="cuda", dtype=torch.float16) if with_bias else None

        def call(exact):  # the size threshold off: both ways at every shape
            return switched(ew, "EXACT_MIN_ELEMENTS", 0, switched(
                ew, "USE_EXACT_HALF_SUM", exact, lambda: ta._bias_gelu_bwd_fused(dy, x, bias, approximate)))

        def torch_call():
            dx = torch.ops.aten.gelu_backward(dy, x + bias if with_bias else x, approximate=approximate)
            return dx, dx.sum(0)

        (dx_e, db_e), (dx_p, db_p) = call(True)(), call(False)()
        repeat = call(True)()[1]
        ref = dx_e.double().sum(0)
        errors = {name: ((db.double() - ref).norm() / ref.norm()).item() for name, db in (("exact", db_e),
                                                                                          ("partial", db_p))}
        times = device_times_us({"exact": call(True), "partial": call(False), "torch": torch_call}, rounds=8)
        nbytes = 3 * dy.numel() * dy.element_size()
        row = {"shape": f"{r}x{c}", "bias": with_bias, "gelu": approximate,
               "exact us": times["exact"], "partial rows us": times["partial"], "torch us": times["torch"],
               "exact of copy ceiling": nbytes / times["exact"] / 1e6 / ceiling,
               "partial of copy ceiling": nbytes / times["partial"] / 1e6 / ceiling,
               "x partial": times["partial"] / times["exact"], "x torch": times["torch"] / times["exact"],
               "dx same bits": torch.equal(dx_e, dx_p), "dbias repeatable": torch.equal(db_e, repeat),
               "dbias rel err exact": errors["exact"], "dbias rel err partial": errors["partial"],
               "dbias columns differing": (db_e != db_p).double().mean().item()}
        rows.append(row)
        print(row, flush=True)
        del dy, x, bias, dx_e, dx_p
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_bias_bwd_exact", "python bench/explore_bias_bwd_exact.py", [
        ("float16 GELU backward + dbias: exact fixed-point sums vs partial rows (the library's call)",
         list(rows[0]), rows, {"copy ceiling TB/s": ceiling})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
