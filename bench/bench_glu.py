"""Benchmark of the glu family (swiglu, geglu, split and packed) against torch eager, torch.compile and
Liger-Kernel, in one run on one GPU.

A Llama-2-7B MLP's activation over 8192 tokens: gate and up (8192, 11008) each, or packed (8192, 22016)
(gate the first half). Forward and backward, every dtype (torch.compile in bfloat16). Bytes are what
the op must move, each once: forward gate + up + out (3 x T x F elements), backward dy + gate + up +
d_gate + d_up (5 x T x F). torch eager is F.silu(gate) * up (F.gelu for geglu; the packed form
chunks x first, as HF's Phi3MLP), its backward autograd's; Liger is liger_swiglu / liger_geglu
(split only: Liger has no packed form; its geglu is the tanh GELU, and its backward writes the
gradients into the saved inputs). Backwards are timed alone: the forward graph built once,
autograd.grad replayed. CUDA events, interleaved rounds, medians. Bar: forward and backward >= 92%
of the copy ceiling measured in the same run.

    python bench/bench_glu.py [--out bench/results]
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import DTYPES, ROW_HEADER, compiled, device_times_us, liger, row_result, start, write_results  # noqa: E402

TOKENS, WIDTH = 8192, 11008
BAR = 0.92
COMPILE_DTYPE = "bf16"


def torch_backward(fn, inputs, dy):
    """fn's backward alone: the forward graph built once, autograd.grad replayed."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)


def _torch_ops():
    """op -> (eager split function of (gate, up), packed function of x)."""
    def packed(act):
        def fn(x):
            gate, up = x.chunk(2, dim=-1)
            return act(gate) * up
        return fn

    silu, gelu_tanh = F.silu, (lambda g: F.gelu(g, approximate="tanh"))
    gelu_none = F.gelu
    return {"swiglu": (lambda g, u: silu(g) * u, packed(silu)),
            "geglu tanh": (lambda g, u: gelu_tanh(g) * u, packed(gelu_tanh)),
            "geglu none": (lambda g, u: gelu_none(g) * u, packed(gelu_none))}


def _cases(ta_glu, lig, dtype_name, gate, up, x, dy):
    """(op, rawops call, torch call, {other: call}, bytes) per row."""
    e, n = gate.element_size(), gate.numel()
    fwd_bytes, bwd_bytes = 3 * n * e, 5 * n * e
    ops = _torch_ops()
    rows = []
    bases = {"swiglu": "swiglu", "geglu tanh": "geglu_tanh", "geglu none": "geglu_erf"}
    for op, base in bases.items():
        if op == "geglu none" and dtype_name != "bf16":
            continue
        split, packed = ops[op]
        with_compile = dtype_name == COMPILE_DTYPE
        others_fwd, others_bwd, others_pfwd, others_pbwd = {}, {}, {}, {}
        if with_compile:
            cs, cp = compiled(split), compiled(packed)
            others_fwd["torch.compile"] = lambda cs=cs: cs(gate, up)
            others_bwd["torch.compile"] = torch_backward(cs, (gate, up), dy)
            others_pfwd["torch.compile"] = lambda cp=cp: cp(x)
            others_pbwd["torch.compile"] = torch_backward(cp, (x,), dy)
        if lig is not None and op != "geglu none":
            fn = lig.liger_swiglu if op == "swiglu" else lig.liger_geglu
            others_fwd["liger"] = lambda fn=fn: fn(gate, up)
            others_bwd["liger"] = torch_backward(fn, (gate, up), dy)
        rows += [
            (f"{op} fwd", lambda base=base: ta_glu.forward(base, gate, up), lambda split=split: split(gate, up),
             others_fwd, fwd_bytes),
            (f"{op} bwd", lambda base=base: ta_glu.backward(base, dy, gate, up), torch_backward(split, (gate, up), dy),
             others_bwd, bwd_bytes),
            (f"{op} packed fwd", lambda base=base: ta_glu.forward_packed(base, x), lambda packed=packed: packed(x),
             others_pfwd, fwd_bytes),
            (f"{op} packed bwd", lambda base=base: ta_glu.backward_packed(base, dy, x),
             torch_backward(packed, (x,), dy), others_pbwd, bwd_bytes),
        ]
    return rows


def device_rows(ta_glu, ceiling):
    lig = liger()
    rows = []
    for dtype_name, dtype in DTYPES.items():
        gate, up, dy = (torch.randn(TOKENS, WIDTH, device="cuda", dtype=dtype) for _ in range(3))
        x = torch.cat([gate, up], -1)
        for op, ours, theirs, others, nbytes in _cases(ta_glu, lig, dtype_name, gate, up, x, dy):
            times = device_times_us({"rawops": ours, "torch": theirs, **others})
            extra = {k: times[k] for k in others}
            tbps = nbytes / times["rawops"] / 1e6
            shape = f"{TOKENS}x{2 * WIDTH}" if "packed" in op else f"{TOKENS}x{WIDTH}"
            rows.append(row_result(op, dtype_name, shape, nbytes, times["rawops"], times["torch"], extra, ceiling,
                                   tbps >= BAR * ceiling))
        del gate, up, dy, x
        torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops.torch_adapter import glu as ta_glu

    text = write_results(out_dir, "glu", "python bench/bench_glu.py", [
        (f"Device time, {TOKENS} tokens x {WIDTH} (Llama-2-7B's intermediate width)", ROW_HEADER,
         device_rows(ta_glu, ceiling),
         {"copy ceiling TB/s": round(ceiling, 3),
          "target": f"forward and backward >= {BAR:.0%} of the copy ceiling",
          "bytes": "forward gate + up + out; backward dy + gate + up + d_gate + d_up (each T x F)",
          "liger": "liger_swiglu / liger_geglu (tanh), split only; its backward writes into the saved inputs"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
