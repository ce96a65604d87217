"""Benchmark of the norm family (layer_norm, rms_norm, add_rms_norm) against torch eager, in one run on one GPU.

Rows of 4096 (16384 rows), 768 and 1000 (a transformer's width and an odd one), each over
64M elements (256 MB of float32, past L2); forward and backward, every dtype. CUDA events,
median of 50 after warm-up, rawops then torch. Bytes count each tensor read once and written
once: forward x + y; backward dy + x + dx (torch's three passes); weight, bias, dweight, dbias
and the float32 statistics too (small beside the rows). torch's backward is timed alone: its
forward graph built once, autograd.grad replayed. At width 4096 torch.compile's and
Liger-Kernel's kernels (where installed; its defaults) are timed too, the same way. The bar at
width 4096: forward >= 90% of the copy ceiling measured in the same run, backward >= 2.0x
torch's; the other widths are reported. add_rms_norm (residual add + rms_norm; torch: x + residual
then F.rms_norm, its backward given the gradients of both outputs; Liger: liger_fused_add_rms_norm)
moves x, residual in and y, new residual out forward, dy, d_new_residual, new residual in and dx out
backward: its bar is >= 92% of the copy ceiling both ways at width 4096. The 16-bit layer_norm
backward at 4096 is also timed by each of its entries, interleaved (full rows and a block a row:
rawops.config.norm_full_rows True / False; the default picks by the device's memory speed an SM):
which one each GPU's rows should take.

    python bench/bench_norm.py [--out bench/results]
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import (DTYPES, ROW_HEADER, compiled, device_time_us, device_times_us, liger, row_result, start,  # noqa: E402
                    write_results)

WIDTHS = (4096, 768, 1000)
ADD_BAR = 0.92
ELEMENTS = 16384 * 4096
BAR_WIDTH = 4096
EPS = 1e-5


def rows_of(width):
    return ELEMENTS // width


def torch_backward(fn, inputs, dy):
    """torch's backward alone: the forward graph built once, backward replayed."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)


def torch_backward_pair(fn, inputs, grads):
    """The backward alone of fn returning two tensors, given both their gradients."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    return lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)


def _torch_add_rms(n):
    def fn(x, r, w):
        h = x + r
        return F.rms_norm(h, (n,), w, EPS), h
    return fn


def _others(x, dy, w, b):
    """op -> {torch.compile: call, liger: call} at the bar's width (the compiled functions are
    compiled at their first call, inside the warm-up)."""
    n, lig = x.shape[-1], liger()
    ln = compiled(lambda x, w, b: F.layer_norm(x, (n,), w, b, EPS))
    rms = compiled(lambda x, w: F.rms_norm(x, (n,), w, EPS))
    others = {"layer_norm fwd": {"torch.compile": lambda: ln(x, w, b)},
              "layer_norm bwd": {"torch.compile": torch_backward(ln, (x, w, b), dy)},
              "rms_norm fwd": {"torch.compile": lambda: rms(x, w)},
              "rms_norm bwd": {"torch.compile": torch_backward(rms, (x, w), dy)}}
    add = compiled(_torch_add_rms(n))
    others["add_rms_norm fwd"] = {"torch.compile": lambda: add(x, dy, w)}
    others["add_rms_norm bwd"] = {"torch.compile": torch_backward_pair(add, (x, dy, w), (dy, x))}
    if lig is not None and hasattr(lig, "liger_fused_add_rms_norm"):
        fused = lig.liger_fused_add_rms_norm
        others["add_rms_norm fwd"]["liger"] = lambda: fused(x, dy, w, EPS, in_place=False)
        others["add_rms_norm bwd"]["liger"] = torch_backward_pair(lambda x, r, w: fused(x, r, w, EPS, in_place=False),
                                                                  (x, dy, w), (dy, x))
    if lig is not None:
        others["layer_norm fwd"]["liger"] = lambda: lig.liger_layer_norm(x, w, b, EPS)
        others["layer_norm bwd"]["liger"] = torch_backward(lambda x, w, b: lig.liger_layer_norm(x, w, b, EPS),
                                                           (x, w, b), dy)
        others["rms_norm fwd"]["liger"] = lambda: lig.liger_rms_norm(x, w, EPS)
        others["rms_norm bwd"]["liger"] = torch_backward(lambda x, w: lig.liger_rms_norm(x, w, EPS), (x, w), dy)
    return others


def _cases(ta_norm, x, dy, w, b):
    """op -> (rawops call, torch call, bytes moved, forward?)."""
    n, e = x.shape[-1], x.element_size()
    rows_bytes, vec, stats = x.numel() * e, n * e, x.shape[0] * 4
    _, mean, rstd = ta_norm.forward("layer_norm", x, w, b, EPS)
    _, _, rstd_rms = ta_norm.forward("rms_norm", x, w, None, EPS)
    _, h, rstd_add = ta_norm.add_forward(x, dy, w, EPS)
    return {
        "layer_norm fwd": (lambda: ta_norm.forward("layer_norm", x, w, b, EPS),
                           lambda: F.layer_norm(x, (n,), w, b, EPS), 2 * rows_bytes + 2 * vec + 2 * stats, True),
        "layer_norm bwd": (lambda: ta_norm.backward("layer_norm", dy, x, w, mean, rstd, True, True),
                           torch_backward(lambda x, w, b: F.layer_norm(x, (n,), w, b, EPS), (x, w, b), dy),
                           3 * rows_bytes + 3 * vec + 2 * stats, False),
        "rms_norm fwd": (lambda: ta_norm.forward("rms_norm", x, w, None, EPS),
                         lambda: F.rms_norm(x, (n,), w, EPS), 2 * rows_bytes + vec + stats, True),
        "rms_norm bwd": (lambda: ta_norm.backward("rms_norm", dy, x, w, None, rstd_rms, True, False),
                         torch_backward(lambda x, w: F.rms_norm(x, (n,), w, EPS), (x, w), dy),
                         3 * rows_bytes + 2 * vec + stats, False),
        # residual = dy, d_new_residual = x: any tensors of the shape
        "add_rms_norm fwd": (lambda: ta_norm.add_forward(x, dy, w, EPS), lambda: _torch_add_rms(n)(x, dy, w),
                             4 * rows_bytes + vec + stats, True),
        "add_rms_norm bwd": (lambda: ta_norm.add_backward(dy, x, h, w, rstd_add, True),
                             torch_backward_pair(_torch_add_rms(n), (x, dy, w), (dy, x)),
                             4 * rows_bytes + 2 * vec + stats, False),
    }


def device_rows(ta_norm, ceiling):
    rows = []
    for n in WIDTHS:
        for dtype_name, dtype in DTYPES.items():
            x, dy = (torch.randn(rows_of(n), n, device="cuda", dtype=dtype) for _ in range(2))
            w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
            others = _others(x, dy, w, b) if n == BAR_WIDTH else {}
            for name, (ours, theirs, nbytes, forward) in _cases(ta_norm, x, dy, w, b).items():
                us_ours, us_torch = device_time_us(ours), device_time_us(theirs)
                extra = {k: device_time_us(fn) for k, fn in others.get(name, {}).items()}
                tbps, speedup = nbytes / us_ours / 1e6, us_torch / us_ours
                if name.startswith("add_rms_norm"):
                    meets = tbps >= ADD_BAR * ceiling if n == BAR_WIDTH else "-"
                else:
                    meets = (tbps >= 0.9 * ceiling if forward else speedup >= 2.0) if n == BAR_WIDTH else "-"
                rows.append(row_result(name, dtype_name, f"{rows_of(n)}x{n}", nbytes, us_ours, us_torch, extra,
                                       ceiling, meets))
            del x, dy
            torch.cuda.empty_cache()
    return rows


ENTRY_HEADER = ["op", "dtype", "shape", "rawops us", "full rows us", "block a row us", "torch us",
                "full rows of copy ceiling", "block a row of copy ceiling"]


def entry_rows(ta_norm, ceiling):
    """The 16-bit layer_norm backward at width BAR_WIDTH by each of its entries, interleaved: full
    rows (rawops.config.norm_full_rows=True), a block a row (False) and the default ("rawops us":
    None, the device's choice), so that each GPU's run says which its rows should take."""
    from rawops import config

    rows = []
    for dtype_name in ("f16", "bf16"):
        dtype = DTYPES[dtype_name]
        x, dy = (torch.randn(rows_of(BAR_WIDTH), BAR_WIDTH, device="cuda", dtype=dtype) for _ in range(2))
        w, b = torch.randn(BAR_WIDTH, device="cuda", dtype=dtype), torch.randn(BAR_WIDTH, device="cuda", dtype=dtype)
        ours, theirs, nbytes, _ = _cases(ta_norm, x, dy, w, b)["layer_norm bwd"]

        def entry(**switches):
            def call():
                with config.override(**switches):
                    ours()
            return call
        times = device_times_us({"full": entry(norm_full_rows=True), "block": entry(norm_full_rows=False),
                                 "default": ours, "torch": theirs})
        shape = f"{rows_of(BAR_WIDTH)}x{BAR_WIDTH}"
        row = {"op": "layer_norm bwd (entries)", "dtype": dtype_name, "shape": shape, "rawops us": times["default"],
               "full rows us": times["full"], "block a row us": times["block"], "torch us": times["torch"]}
        for name, column in (("full", "full rows"), ("block", "block a row")):
            row[f"{column} of copy ceiling"] = nbytes / times[name] / 1e6 / ceiling
        rows.append(row)
        print(rows[-1], flush=True)
        del x, dy
        torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops.torch_adapter import norm as ta_norm

    text = write_results(out_dir, "norm", "python bench/bench_norm.py", [
        (f"Device time, {ELEMENTS} elements a tensor", ROW_HEADER, device_rows(ta_norm, ceiling),
         {"copy ceiling TB/s": round(ceiling, 3),
          f"targets (width {BAR_WIDTH})": "forward >= 90% of the copy ceiling; backward >= 2.0x torch's backward; "
                                          f"add_rms_norm both ways >= {ADD_BAR:.0%} of the copy ceiling",
          "bytes": "forward x + y (+ weight, bias, stats); backward dy + x + dx (+ weight, stats, dweight, dbias)"}),
        ("The 16-bit layer_norm backward by each entry", ENTRY_HEADER, entry_rows(ta_norm, ceiling),
         {"entries": "rawops us: the default (config.norm_full_rows None: full rows on fast memory an SM, else a "
                     "block a row); full rows / block a row: the switch True / False; interleaved rounds"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
