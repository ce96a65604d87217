"""Benchmark of the softmaxes family (softmax, log_softmax over the last dim) against torch
eager, in one run on one GPU.

Rows of 4096 (16384 rows), 768 and 1000 (a transformer's width and an odd one), each over
64M elements (256 MB of float32, past L2); forward and backward, every dtype. CUDA events,
median of 50 after warm-up, rawops then torch. Bytes count each tensor read once and written
once: forward x + y; backward dy + y + dx. torch's backward is aten's _softmax_backward_data /
_log_softmax_backward_data on the same y. The bar at width 4096: forward >= 90% of the copy
ceiling measured in the same run, backward >= 2.0x torch's (log_softmax's: torch's backward
already streams at the copy ceiling, so 2x is beyond the hardware and the row is judged against
the ceiling instead); the other widths are reported. At width 4096 torch.compile's kernels and
Liger-Kernel's softmax (where installed) are timed too; their backwards through autograd.grad
replayed on a graph built once.

    python bench/bench_softmaxes.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import DTYPES, ROW_HEADER, compiled, device_time_us, liger, row_result, start, write_results  # noqa: E402

WIDTHS = (4096, 768, 1000)
ELEMENTS = 16384 * 4096
BAR_WIDTH = 4096


def rows_of(width):
    return ELEMENTS // width


def _backward(fn, x, dy):
    """A backward alone: the forward graph built once, autograd.grad replayed."""
    leaf = x.detach().clone().requires_grad_()
    out = fn(leaf)
    return lambda: torch.autograd.grad(out, (leaf,), dy, retain_graph=True)


def _others(x, dy):
    """op -> {torch.compile: call, liger: call} at the bar's width."""
    lig = liger()
    sm, lsm = compiled(lambda x: torch.softmax(x, -1)), compiled(lambda x: torch.log_softmax(x, -1))
    others = {"softmax fwd": {"torch.compile": lambda: sm(x)}, "softmax bwd": {"torch.compile": _backward(sm, x, dy)},
              "log_softmax fwd": {"torch.compile": lambda: lsm(x)},
              "log_softmax bwd": {"torch.compile": _backward(lsm, x, dy)}}
    if lig is not None:
        others["softmax fwd"]["liger"] = lambda: lig.liger_softmax(x)
        others["softmax bwd"]["liger"] = _backward(lig.liger_softmax, x, dy)
    return others


def _cases(ta_sm, x, dy):
    """op -> (rawops call, torch call, bytes moved, forward?)."""
    rows_bytes = x.numel() * x.element_size()
    y_sm, y_lsm = ta_sm.forward("softmax", x), ta_sm.forward("log_softmax", x)
    aten = torch.ops.aten
    return {
        "softmax fwd": (lambda: ta_sm.forward("softmax", x), lambda: torch.softmax(x, -1), 2 * rows_bytes, True),
        "softmax bwd": (lambda: ta_sm.backward("softmax", dy, y_sm),
                        lambda: aten._softmax_backward_data(dy, y_sm, -1, x.dtype), 3 * rows_bytes, False),
        "log_softmax fwd": (lambda: ta_sm.forward("log_softmax", x), lambda: torch.log_softmax(x, -1),
                            2 * rows_bytes, True),
        "log_softmax bwd": (lambda: ta_sm.backward("log_softmax", dy, y_lsm),
                            lambda: aten._log_softmax_backward_data(dy, y_lsm, -1, x.dtype), 3 * rows_bytes, False),
    }


def device_rows(ta_sm, ceiling):
    rows = []
    for n in WIDTHS:
        for dtype_name, dtype in DTYPES.items():
            x, dy = (torch.randn(rows_of(n), n, device="cuda", dtype=dtype) for _ in range(2))
            others = _others(x, dy) if n == BAR_WIDTH else {}
            for name, (ours, theirs, nbytes, forward) in _cases(ta_sm, x, dy).items():
                us_ours, us_torch = device_time_us(ours), device_time_us(theirs)
                extra = {k: device_time_us(fn) for k, fn in others.get(name, {}).items()}
                # 2x torch, where that is within the copy ceiling; at the ceiling otherwise
                bar_tbps = 0.9 * ceiling if forward else min(2.0 * nbytes / us_torch / 1e6, 0.9 * ceiling)
                meets = nbytes / us_ours / 1e6 >= bar_tbps if n == BAR_WIDTH else "-"
                rows.append(row_result(name, dtype_name, f"{rows_of(n)}x{n}", nbytes, us_ours, us_torch, extra,
                                       ceiling, meets))
            del x, dy
            torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops.torch_adapter import softmaxes as ta_sm

    text = write_results(out_dir, "softmaxes", "python bench/bench_softmaxes.py", [
        (f"Device time, {ELEMENTS} elements a tensor", ROW_HEADER, device_rows(ta_sm, ceiling),
         {"copy ceiling TB/s": round(ceiling, 3),
          f"targets (width {BAR_WIDTH})": "forward >= 90% of the copy ceiling; backward >= 2.0x torch's backward "
                                          "or, where that exceeds the copy ceiling, >= 90% of the ceiling",
          "bytes": "forward x + y; backward dy + y + dx"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
