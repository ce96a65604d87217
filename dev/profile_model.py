"""Where bench_model's training step spends its time, per configuration (issue 26 item 6: the bf16
"blocks" stack, rawops' LayerNorm + LinearGELU, read 0.93x stock's step on the H100): the step
between CUDA events, the GPU's kernel time within it (torch.profiler; their ratio says whether the
step is host-bound), and the kernels that differ, by total device time a step.

    python dev/profile_model.py [--host] [stock-bf16 blocks-bf16 ...]

--host: also the host's side of a step: the time to enqueue it (perf_counter around the step's
calls, the GPU still busy with the previous ones), the CUDA runtime and driver calls by total
host time a step (a synchronisation, an allocation or an attribute query that idles the GPU), and
where the GPU idles between kernels (summed by the kernels around each gap).
"""
import time
import collections
import os
import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import bench_model as bm  # noqa: E402

STEPS = 3


def kernels_of(config):
    kind, dt = config.rsplit("-", 1)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
    torch.backends.cuda.matmul.allow_tf32 = False
    model = bm.build_model(kind, dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=bm.LR, fused=True)
    data = torch.randint(0, bm.VOCAB, (bm.BATCH, bm.SEQ + 1), generator=torch.Generator().manual_seed(1)).cuda()
    ids, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        model(ids, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(STEPS):
        step()
    end.record()
    torch.cuda.synchronize()
    step_us = start.elapsed_time(end) * 1e3 / STEPS
    if HOST:
        enqueue = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            step()
            enqueue.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        print(f"== {config}: host enqueue a step {sorted(enqueue)[STEPS // 2]:9.1f} us (median of {STEPS})", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        api, api_n = collections.Counter(), collections.Counter()
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("cu"):
                api[event.name] += event.cpu_time_total / STEPS
                api_n[event.name] += 1 / STEPS
        for name, us in api.most_common(15):
            print(f"   host {name[:60]:60s} {us:9.1f} us a step ({api_n[name]:5.0f} calls)", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    totals, counts = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:90]
            totals[name] += event.device_time / STEPS if hasattr(event, "device_time") else event.cuda_time / STEPS
            counts[name] += 1 / STEPS
    kernel_us = sum(totals.values())
    print(f"== {config}: step {step_us:9.1f} us (events, no profiler), kernels {kernel_us:9.1f} us a step "
          f"({kernel_us / step_us:.2f} of the step busy)", flush=True)
    if HOST:
        idle_gaps(prof, config)
    return totals, counts, step_us


def idle_gaps(prof, config):
    """Where the GPU idles inside the profiled steps (--host): each gap between one kernel's end and
    the next one's start (streams merged), summed by the pair of kernels around it, largest first:
    the kernel after a gap is the one whose launch the GPU waited for."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name[:44]) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps, idle, end, before = collections.Counter(), 0.0, None, None
    for start, stop, name in spans:
        if end is not None and start > end:
            gaps[(before, name)] += (start - end) / STEPS
            idle += (start - end) / STEPS
        if end is None or stop > end:
            end, before = stop, name
    print(f"   idle {idle:9.1f} us a step between kernels (the last step's tail and the syncs included)")
    for (after, name), us in gaps.most_common(12):
        print(f"   idle {us:9.1f} us a step  after {after:44s} before {name}", flush=True)


HOST = False


def main(argv):
    global HOST
    HOST = "--host" in argv
    argv = [a for a in argv if a != "--host"]
    configs = argv or ["stock-bf16", "blocks-bf16"]
    results = {config: kernels_of(config) for config in configs}
    names = set().union(*(totals for totals, _, _ in results.values()))
    rows = sorted(names, key=lambda n: -max(results[c][0].get(n, 0.0) for c in configs))
    print("\nkernel (first 90 chars)".ljust(92) + "".join(f"{c:>16s}" for c in configs) + "   (us a step, launches)")
    for name in rows[:40]:
        cells = "".join(f"{results[c][0].get(name, 0.0):9.1f} ({results[c][1].get(name, 0):4.0f})" for c in configs)
        print(f"{name:92s}{cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
