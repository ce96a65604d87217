"""The source network (100-128-64-10, float32) trained through FusedMLP, split by kernel: each
kernel's device time under torch.profiler (the third of three steps), the step's time by events,
and torch eager's beside it, with config.mlp_tf32 on (the tensor pipe) and off (FFMA).

    python dev/profile_source_mlp.py [--batch 1048576]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from timing import device_times_us  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1 << 20)
    batch = parser.parse_args().batch
    from rawops import config
    from rawops import torch_adapter as ta

    torch.backends.cuda.matmul.allow_tf32 = False
    net = torch.nn.Sequential(torch.nn.Linear(100, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10)).cuda()
    fused = ta.FusedMLP.from_sequential(net)
    x = torch.randn(batch, 100, device="cuda")
    dy = torch.randn(batch, 10, device="cuda")
    fused_params, net_params = list(fused.parameters()), list(net.parameters())

    def ours():
        torch.autograd.grad(fused(x), fused_params, dy)

    def eager():
        torch.autograd.grad(net(x), net_params, dy)

    for on in (True, False):
        for name in ("_fast_key", "_source_state"):
            if hasattr(fused, name):
                setattr(fused, name, None)
        with config.override(mlp_tf32=on):
            times = device_times_us({"ours": ours, "eager": eager})
            for _ in range(2):
                ours()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                ours()
                torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels.sort(key=lambda e: e.time_range.start)
        print(f"== mlp_tf32={on}: fwd+bwd {times['ours']:.1f} us, eager {times['eager']:.1f} us "
              f"({times['eager'] / times['ours']:.2f}x); kernels in launch order:")
        for e in kernels:
            print(f"   {e.time_range.elapsed_us():9.1f} us  {e.name[:80]}")


if __name__ == "__main__":
    main()
