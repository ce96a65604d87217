"""fused_linear_cross_entropy at bench_model's head (8192 tokens, H 1024, V 32768, bf16, no bias): the
`rawops` configuration's step read 0.956x stock's where the `blocks` one read 1.02x (H100, 8a41b57),
so the fused loss costs ~0.8 ms a step there, though it skips the softmax passes torch makes. Times
forward + backward (autograd, the same call bench_model makes) at each chunk size against torch's
F.cross_entropy(F.linear(x, w), t), then lists each one's kernels by device time a call
(torch.profiler), so the chunked GEMMs show beside torch's whole-batch ones. Experiment, not a bench.

    python dev/time_flce_chunks.py [--tokens 8192 --hidden 1024 --vocab 32768]
"""
import argparse
import collections
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

from rawops import torch_adapter as ta  # noqa: E402

CHUNKS = (None, 1024, 2048, 8192)  # None: the default plan (256 MiB of logits)


def kernels(step, calls=3):
    totals = collections.Counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:70]] += event.device_time / calls
    return totals


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32768)
    args = parser.parse_args()
    t, h, v = args.tokens, args.hidden, args.vocab
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(v, h, device="cuda") * h ** -0.5).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, v, (t,), device="cuda")

    def step_of(chunk):
        def step():
            x.grad = w.grad = None
            if chunk == "torch":
                loss = F.cross_entropy(F.linear(x, w), target)  # bf16 logits, as bench_model's stock head
            else:
                loss = ta.fused_linear_cross_entropy(x, w, target, chunk_rows=chunk)
            loss.backward()
        return step

    steps = {"torch": step_of("torch"), **{f"rawops chunk {c or 'default'}": step_of(c) for c in CHUNKS}}
    times = timing.device_times_us(steps, warmup=3, reps=5, rounds=3)
    print(f"{torch.cuda.get_device_name()}, {t} x {h} x {v} bf16, forward + backward a call")
    for name, us in times.items():
        print(f"  {name:24s} {us:9.1f} us  ({times['torch'] / us:4.2f}x torch)", flush=True)
    for name in ("torch", "rawops chunk default"):
        print(f"\n{name}: kernels, us a call")
        for kernel, us in kernels(steps[name]).most_common(12):
            print(f"  {kernel:70s} {us:8.1f}")


if __name__ == "__main__":
    main()
