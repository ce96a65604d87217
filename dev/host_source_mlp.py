"""Host time of the source network's forward + backward (100-128-64-10, float32) at a small batch
through FusedMLP, against nn.Sequential's, with the GPU kept busy so no call waits for the device;
then cProfile's top entries of rawops' step (issue 26 item 5: >= 3x eager at batch 32 is a host-time
bar: bench_mlp's row is host-bound).

    python dev/host_source_mlp.py [--batch 32]
"""
import sys

# this folder's profile.py would shadow the standard library's, which cProfile imports
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from rawops import torch_adapter as ta  # noqa: E402


def host_us(fn, reps=200):
    """Median host time of fn() with the GPU busy (a long sleep kernel ahead of every 10 calls)."""
    out = []
    for i in range(reps):
        if i % 10 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    batch = parser.parse_args().batch
    net = torch.nn.Sequential(torch.nn.Linear(100, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10)).cuda()
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(batch, 100, device="cuda")
    dy = torch.randn(batch, 10, device="cuda")
    fused_params, net_params = list(fused.parameters()), list(net.parameters())
    cases = {
        "rawops fwd+bwd": lambda: torch.autograd.grad(fused(x), fused_params, dy),
        "eager fwd+bwd": lambda: torch.autograd.grad(net(x), net_params, dy),
        "rawops fwd (grad on)": lambda: fused(x),
        "eager fwd (grad on)": lambda: net(x),
    }
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        print(f"batch {batch} {name:24s} host {host_us(fn):8.1f} us", flush=True)
    step = cases["rawops fwd+bwd"]
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    profiler.enable()
    for _ in range(200):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(28)
        print(f"---- cProfile of 200 rawops steps, by {key} (us = s / 200 x 1e6)")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
