"""Benchmark of the norm and softmax families against torch eager, in one run on one GPU.

16384 rows x 4096 (the issue's shape), and widths 768 and 1000 (a transformer's and an odd
one) over as many elements (87381 and 67108 rows: 256 MB of float32, past the 50 MB L2);
forward and backward of layer_norm, rms_norm, softmax, log_softmax; every dtype. CUDA
events, median of 50 after warm-up. Bandwidth counts each tensor read once and written once:
forward x + y; norm backward dy + x + dx (torch's "three passes"); softmax backward dy + y + dx.
weight/bias and the float32 statistics are counted too (small next to the rows).

    python bench/bench_norm.py [--out bench/results]
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, start, write_results  # noqa: E402

ROWS = 16384
WIDTHS = (4096, 768, 1000)
ELEMENTS = ROWS * 4096  # every width runs over about as many elements


def rows_of(n):
    return ELEMENTS // n
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _torch_backward(fn, inputs, dy):
    """torch's backward alone: the forward graph built once, backward replayed."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)


def _cases(ta, x, dy, w, b):
    """name -> (rawops call, torch call, bytes moved, forward?)."""
    n, e = x.shape[-1], x.element_size()
    rows_bytes = x.numel() * e
    vec = n * e
    stats = x.shape[0] * 4
    y_ln, mean, rstd = ta._norm_fwd("layer_norm", x, w, b, 1e-5)
    _, _, rstd_rms = ta._norm_fwd("rms_norm", x, w, None, 1e-5)
    y_sm, y_lsm = ta._softmax_fwd("softmax", x), ta._softmax_fwd("log_softmax", x)
    return {
        "layer_norm fwd": (lambda: ta._norm_fwd("layer_norm", x, w, b, 1e-5),
                           lambda: F.layer_norm(x, (n,), w, b, 1e-5), 2 * rows_bytes + 2 * vec + 2 * stats, True),
        "layer_norm bwd": (lambda: ta._norm_bwd("layer_norm", dy, x, w, mean, rstd, True, True),
                           _torch_backward(lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), (x, w, b), dy),
                           3 * rows_bytes + 3 * vec + 2 * stats, False),
        "rms_norm fwd": (lambda: ta._norm_fwd("rms_norm", x, w, None, 1e-5),
                         lambda: F.rms_norm(x, (n,), w, 1e-5), 2 * rows_bytes + vec + stats, True),
        "rms_norm bwd": (lambda: ta._norm_bwd("rms_norm", dy, x, w, None, rstd_rms, True, False),
                         _torch_backward(lambda x, w: F.rms_norm(x, (n,), w, 1e-5), (x, w), dy),
                         3 * rows_bytes + 2 * vec + stats, False),
        "softmax fwd": (lambda: ta._softmax_fwd("softmax", x), lambda: torch.softmax(x, -1), 2 * rows_bytes, True),
        "softmax bwd": (lambda: ta._softmax_bwd("softmax", dy, y_sm),
                        lambda: torch.ops.aten._softmax_backward_data(dy, y_sm, -1, x.dtype), 3 * rows_bytes, False),
        "log_softmax fwd": (lambda: ta._softmax_fwd("log_softmax", x), lambda: torch.log_softmax(x, -1),
                            2 * rows_bytes, True),
        "log_softmax bwd": (lambda: ta._softmax_bwd("log_softmax", dy, y_lsm),
                            lambda: torch.ops.aten._log_softmax_backward_data(dy, y_lsm, -1, x.dtype),
                            3 * rows_bytes, False),
    }


def device_rows(ta, ceiling):
    rows = []
    for n in WIDTHS:
        for dtype_name, dtype in DTYPES.items():
            x, dy = (torch.randn(rows_of(n), n, device="cuda", dtype=dtype) for _ in range(2))
            w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
            for name, (ours, theirs, nbytes, forward) in _cases(ta, x, dy, w, b).items():
                us_ours, us_torch = device_time_us(ours), device_time_us(theirs)
                tbps = nbytes / us_ours / 1e6
                speedup = us_torch / us_ours
                # The targets, at its shape (16384 x 4096); other widths are reported.
                meets = ((tbps >= 0.9 * ceiling if forward else speedup >= 2.0) if n == 4096 else "-")
                rows.append({"op": name, "width": n, "rows": rows_of(n), "dtype": dtype_name, "rawops us": us_ours, "torch us": us_torch,
                             "rawops TB/s": tbps, "torch TB/s": nbytes / us_torch / 1e6,
                             "of copy ceiling": tbps / ceiling, "x torch": speedup, "meets target": meets})
                print(f"{name:16s} {n:5d} {dtype_name:5s} rawops {us_ours:8.1f} us {tbps:5.2f} TB/s | "
                      f"torch {us_torch:8.1f} us | {speedup:4.2f}x", flush=True)
            del x, dy
            torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import torch_adapter as ta

    rows = device_rows(ta, ceiling)
    header = ["op", "width", "rows", "dtype", "rawops us", "torch us", "rawops TB/s", "torch TB/s", "of copy ceiling",
              "x torch", "meets target"]
    text = write_results(out_dir, "norm", "python bench/bench_norm.py", [
        (f"Device time, {ELEMENTS} elements a tensor", header, rows,
         {"copy ceiling TB/s": round(ceiling, 3),
          "targets (width 4096)": "forward >= 90% of the copy ceiling; backward >= 2.0x torch's backward",
          "bytes": "forward x + y (+ weight, bias, stats); backward dy + x + dx (+ weight, stats, dweight, dbias)"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
