"""Where an adapter op's forward + backward through autograd spends the time its kernels do not
(issue 26 item 3): for a few cases of bench/bench_autograd.py, the call timed with and without the
L2 flush, the host time of one call (perf_counter, GPU idle), and one flushed call's timeline from
torch.profiler (CPU runtime/driver calls and GPU kernels, microseconds from the call's start).

    python dev/profile_autograd.py [op dtype ...]   e.g. rms_norm bf16 bias_gelu bf16
"""
import os
import sys
import time

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch  # noqa: E402

import bench_autograd as ba  # noqa: E402
from rawops import torch_adapter as ta  # noqa: E402


def main(argv):
    want = list(zip(argv[::2], argv[1::2])) or [("rms_norm", "bf16"), ("bias_gelu", "bf16"), ("layer_norm", "f32"),
                                                ("linear_gelu", "bf16")]
    flush = ba.flusher()
    for op, dtype, shape, ours, theirs, make in ba.cases(ta):
        if (op, dtype) not in want:
            continue
        leaves = make()
        out = ours(*leaves)
        grad = torch.randn_like(out)
        del out

        def step():
            torch.autograd.backward(ours(*leaves), grad)
        with_flush = ba.call_us(step, leaves, flush)
        without = ba.call_us(step, leaves, lambda: None)
        kernels = ba.kernels_us(step, leaves)
        hosts = []
        for _ in range(20):
            torch.cuda.synchronize()
            for t in leaves:
                t.grad = None
            t0 = time.perf_counter()
            step()
            hosts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        hosts.sort()
        print(f"\n== {op} {dtype} {shape}: call {with_flush:.1f} us (flushed), {without:.1f} (not), kernels "
              f"{kernels:.1f}, host {hosts[len(hosts) // 2]:.1f} us (min {hosts[0]:.1f})", flush=True)
        import cProfile
        import pstats
        prof_host = cProfile.Profile()
        torch.cuda.synchronize()
        prof_host.enable()
        for _ in range(30):
            for t in leaves:
                t.grad = None
            step()
        prof_host.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof_host).sort_stats("tottime").print_stats(18)
        from torch.profiler import ProfilerActivity, profile
        for t in leaves:
            t.grad = None
        flush()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  or e.name.startswith(("cuda", "cu", "aten::empty", "aten::zeros", "Accumulate", "aten::fill"))]
        events.sort(key=lambda e: e.time_range.start)
        t0 = min(e.time_range.start for e in events)
        for e in events:
            where = "GPU" if e.device_type == torch.autograd.DeviceType.CUDA else "cpu"
            print(f"  {where} {e.time_range.start - t0:9.1f} +{e.time_range.elapsed_us():8.1f}  {e.name[:90]}")
        leaves = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
