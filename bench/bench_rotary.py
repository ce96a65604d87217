"""Benchmark of the rotary family (rope in place on q and k) against torch eager, torch.compile and
Liger-Kernel, in one run on one GPU.

Llama-3-8B's attention shapes: batch 8, sequence 4096, 32 q heads and 8 k heads of 128, q and k held
as HF holds them, (B, H, S, D) transposes of a projection's (B, S, H, D) output, cos / sin (B, S, D)
as LlamaRotaryEmbedding returns them. Forward and backward, every dtype for the half split ("neox",
HF's rotate_half), bfloat16 for the interleaved pairs ("llama"). Bytes are what the op must move:
q and k read and written once, cos and sin read once. torch eager is transformers'
apply_rotary_pos_emb as written there (out of place: q * cos + rotate_half(q) * sin; GPT-J's
rotate_every_two for "llama"), its backward autograd's; torch.compile compiles the same function;
Liger is liger_rope (in place, "neox" only). Backwards are timed alone (the forward graph built once,
autograd.grad replayed). CUDA events, interleaved rounds, medians. Bar: >= 90% of the copy ceiling
measured in the same run, forward and backward.

    python bench/bench_rotary.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import DTYPES, ROW_HEADER, compiled, device_times_us, liger, row_result, start, write_results  # noqa: E402

BATCH, SEQ, HQ, HK, DIM = 8, 4096, 32, 8, 128
BAR = 0.90
COMPILE_DTYPE = "bf16"


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def torch_rope(layout):
    """transformers' apply_rotary_pos_emb (unsqueeze_dim 1), or its interleaved counterpart."""
    rot = rotate_half if layout == "neox" else rotate_every_two

    def fn(q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin
    return fn


def torch_backward_pair(fn, inputs, grads, constants):
    """fn's backward alone, given both outputs' gradients."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves, *constants)
    return lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)


def tables(layout, dtype):
    inv = 1.0 / (10000.0 ** (torch.arange(0, DIM, 2, device="cuda", dtype=torch.float32) / DIM))
    pos = torch.arange(SEQ, device="cuda", dtype=torch.float32)[None].expand(BATCH, SEQ)
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), -1) if layout == "neox" else freqs.repeat_interleave(2, -1)
    return emb.cos().to(dtype).contiguous(), emb.sin().to(dtype).contiguous()


def heads(n, dtype):
    """(B, H, S, D) as HF holds it: the transpose of a (B, S, H, D) buffer."""
    return torch.randn(BATCH, SEQ, n, DIM, device="cuda", dtype=dtype).transpose(1, 2)


def case_rows(ta_rot, lig, layout, dtype_name, dtype, ceiling):
    """The forward and backward rows of one layout and dtype (its tensors freed on return)."""
    q, k, dq, dk = heads(HQ, dtype), heads(HK, dtype), heads(HQ, dtype), heads(HK, dtype)
    cos, sin = tables(layout, dtype)
    e = q.element_size()
    nbytes = 2 * (q.numel() + k.numel()) * e + (cos.numel() + sin.numel()) * e
    interleaved = layout == "llama"
    fn = torch_rope(layout)
    fwd = {"rawops": lambda: ta_rot.launch("fwd", q, k, cos, sin, interleaved, True),
           "torch": lambda: fn(q, k, cos, sin)}
    bwd = {"rawops": lambda: ta_rot.launch("bwd", dq, dk, cos, sin, interleaved, True),
           "torch": torch_backward_pair(fn, (q, k), (dq, dk), (cos, sin))}
    if dtype_name == COMPILE_DTYPE:
        cf = compiled(fn)
        fwd["torch.compile"] = lambda: cf(q, k, cos, sin)
        bwd["torch.compile"] = torch_backward_pair(cf, (q, k), (dq, dk), (cos, sin))
    if lig is not None and layout == "neox" and hasattr(lig, "liger_rope"):
        fwd["liger"] = lambda: lig.liger_rope(q, k, cos, sin)
        bwd["liger"] = torch_backward_pair(lambda q, k, c, s: lig.liger_rope(q, k, c, s), (q, k), (dq, dk),
                                           (cos, sin))
    rows = []
    for direction, fns in (("fwd", fwd), ("bwd", bwd)):
        times = device_times_us(fns)
        others = {name: us for name, us in times.items() if name not in ("rawops", "torch")}
        tbps = nbytes / times["rawops"] / 1e6
        rows.append(row_result(f"rope {layout} {direction}", dtype_name, f"{BATCH}x{SEQ}x({HQ}+{HK})x{DIM}", nbytes,
                               times["rawops"], times["torch"], others, ceiling, tbps >= BAR * ceiling))
    return rows


def device_rows(ta_rot, ceiling):
    lig = liger()
    rows = []
    cases = [("neox", name, dtype) for name, dtype in DTYPES.items()] + [("llama", "bf16", torch.bfloat16)]
    for layout, dtype_name, dtype in cases:
        rows += case_rows(ta_rot, lig, layout, dtype_name, dtype, ceiling)
        torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops.torch_adapter import rotary as ta_rot

    text = write_results(out_dir, "rotary", "python bench/bench_rotary.py", [
        (f"Device time, q (B, H, S, D) views, batch {BATCH}, sequence {SEQ}, {HQ} q and {HK} k heads of {DIM}",
         ROW_HEADER, device_rows(ta_rot, ceiling),
         {"copy ceiling TB/s": round(ceiling, 3), "target": f">= {BAR:.0%} of the copy ceiling, forward and backward",
          "bytes": "q and k read and written once, cos and sin (B, S, D) read once",
          "torch": "transformers' apply_rotary_pos_emb (out of place); liger_rope in place"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
