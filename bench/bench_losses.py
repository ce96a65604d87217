"""Benchmark of the losses family (cross_entropy, forward and backward) against torch eager,
torch.compile and Liger-Kernel, in one run on one GPU.

Language-model shapes: 8192 tokens x V = 32768 and 128256 classes, bf16 logits (and float32 at
32768), targets with every 10th row ignored. Each row times one training use: forward and backward
(`loss = f(logits, target); loss.backward()` on a leaf that requires grad, its .grad reset first),
CUDA events, interleaved rounds, median. Candidates in the same run: rawops (the gradient in a new
buffer), rawops with inplace_backward=True (the gradient in the logits' memory, as Liger does),
F.cross_entropy eager, torch.compile of it, Liger's liger_cross_entropy (where installed). Each
also reports its extra peak memory: torch.cuda.max_memory_allocated during one call minus what was
allocated before it (the logits and targets).

Bytes: the least a fused forward + backward moves, the logits read twice and the gradient written
once (3 x N x V x itemsize), over the time, as a fraction of the copy ceiling measured in the same
run. Bars (issue 29): 8192 x 128256 bf16 at or under 2.1 ms and >= 1.2x Liger; 8192 x 32768 bf16
>= 1.2x Liger; extra peak memory no more than Liger's. Forward alone (no gradient: the logits read
once) is reported against torch eager.

    python bench/bench_losses.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import DTYPES, compiled, device_times_us, liger, start, write_results  # noqa: E402

TOKENS = 8192
CASES = (("bf16", 32768), ("bf16", 128256), ("f32", 32768))
BAR_US = {128256: 2100.0}  # fwd+bwd at or under, bf16
BAR_VS_LIGER = 1.2
IGNORE_EVERY = 10
HEADER = ["op", "dtype", "shape", "rawops us", "rawops inplace us", "torch us", "torch.compile us", "liger us",
          "rawops TB/s", "of copy ceiling", "x torch", "x liger", "rawops extra MiB", "inplace extra MiB",
          "torch extra MiB", "compile extra MiB", "liger extra MiB", "meets target"]


def _train_step(fn, x, t):
    """One forward + backward on a fresh leaf each call (x's storage, .grad reset)."""
    leaf = x.detach().requires_grad_()

    def step():
        leaf.grad = None
        fn(leaf, t).backward()
    step.leaf = leaf
    return step


def _extra_mib(step):
    """Peak memory one call adds to what is allocated before it (the logits and targets, and no
    gradient), MiB; after one call first (torch.compile compiles there)."""
    step()
    step.leaf.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def _candidates(ta, x, t):
    F = torch.nn.functional
    found = {
        "rawops": _train_step(lambda x, t: ta.cross_entropy(x, t), x, t),
        "rawops inplace": _train_step(lambda x, t: ta.cross_entropy(x, t, inplace_backward=True), x.clone(), t),
        "torch": _train_step(lambda x, t: F.cross_entropy(x, t), x, t),
        "torch.compile": _train_step(compiled(lambda x, t: F.cross_entropy(x, t)), x, t),
    }
    lig = liger()
    if lig is not None:
        found["liger"] = _train_step(lambda x, t: lig.liger_cross_entropy(x, t), x.clone(), t)
    return found


def device_rows(ta, ceiling):
    rows = []
    for dtype_name, n in CASES:
        dtype = DTYPES[dtype_name]
        x = torch.randn(TOKENS, n, device="cuda", dtype=dtype)
        t = torch.randint(0, n, (TOKENS,), device="cuda")
        t[::IGNORE_EVERY] = -100
        nbytes = 3 * x.numel() * x.element_size()
        steps = _candidates(ta, x, t)
        memory = {name: _extra_mib(step) for name, step in steps.items()}
        times = device_times_us(steps, reps=10, rounds=3)
        nan = float("nan")
        us, lig = times["rawops"], times.get("liger", nan)
        best = min(us, times["rawops inplace"])
        vs_liger = lig / best if lig == lig else nan
        meets = "-"
        if dtype_name == "bf16":
            meets = vs_liger >= BAR_VS_LIGER if lig == lig else "no liger"
            if n in BAR_US:
                meets = meets is True and best <= BAR_US[n]
            if "liger" in memory and meets is True:
                meets = memory["rawops inplace"] <= memory["liger"]
        row = {"op": "cross_entropy fwd+bwd", "dtype": dtype_name, "shape": f"{TOKENS}x{n}", "rawops us": us,
               "rawops inplace us": times["rawops inplace"], "torch us": times["torch"],
               "torch.compile us": times["torch.compile"], "liger us": lig, "rawops TB/s": nbytes / best / 1e6,
               "of copy ceiling": nbytes / best / 1e6 / ceiling, "x torch": times["torch"] / us, "x liger": vs_liger,
               "rawops extra MiB": memory["rawops"], "inplace extra MiB": memory["rawops inplace"],
               "torch extra MiB": memory["torch"], "compile extra MiB": memory["torch.compile"],
               "liger extra MiB": memory.get("liger", nan), "meets target": meets}
        print(f"cross_entropy fwd+bwd {row['shape']:>12s} {dtype_name:5s} rawops {us:8.1f} us (inplace "
              f"{times['rawops inplace']:8.1f}) {row['rawops TB/s']:5.2f} TB/s | torch {times['torch']:8.1f} | "
              f"compile {times['torch.compile']:8.1f} | liger {lig:8.1f} | extra MiB {memory}", flush=True)
        rows.append(row)
        # forward alone: the logits read once
        with torch.no_grad():
            fwd = device_times_us({"rawops": lambda x=x, t=t: ta.cross_entropy(x, t),
                                   "torch": lambda x=x, t=t: torch.nn.functional.cross_entropy(x, t)},
                                  reps=10, rounds=3)
        fbytes = x.numel() * x.element_size()
        rows.append({"op": "cross_entropy fwd", "dtype": dtype_name, "shape": f"{TOKENS}x{n}",
                     "rawops us": fwd["rawops"], "torch us": fwd["torch"], "rawops TB/s": fbytes / fwd["rawops"] / 1e6,
                     "of copy ceiling": fbytes / fwd["rawops"] / 1e6 / ceiling, "x torch": fwd["torch"] / fwd["rawops"],
                     "meets target": "-"})
        print(f"cross_entropy fwd     {row['shape']:>12s} {dtype_name:5s} rawops {fwd['rawops']:8.1f} us | torch "
              f"{fwd['torch']:8.1f}", flush=True)
        del x, t, steps
        torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops.torch_adapter import losses as ta

    text = write_results(out_dir, "losses", "python bench/bench_losses.py", [
        (f"Device time, {TOKENS} tokens, forward + backward", HEADER, device_rows(ta, ceiling),
         {"copy ceiling TB/s": round(ceiling, 3),
          "targets": "8192x128256 bf16 fwd+bwd <= 2.1 ms and >= 1.2x Liger; 8192x32768 bf16 >= 1.2x Liger; "
                     "extra peak memory (inplace) <= Liger's",
          "bytes": "fwd+bwd: logits read twice + gradient written once; fwd: logits read once",
          "rawops": "gradient into a new buffer; inplace: into the logits' memory (inplace_backward=True)"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
