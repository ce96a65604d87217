"""Where the extra (N, V) allocation of cross_entropy(inplace_backward=True) comes from when it
appears (tests/test_losses.py's peak check failed under compute-sanitizer memcheck on the H200,
every case, while it passes in a plain run): the in-place forward + backward of 67 x 32001 float32
logits with torch's allocator recording, then every allocation of 1 MB or more in that window
with the Python frames that made it. Run it plain and under the tool:
    python dev/losses_inplace_peak.py
    compute-sanitizer --tool memcheck python dev/losses_inplace_peak.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rawops.torch_adapter import losses as ta  # noqa: E402


def main():
    rows, n = 67, 32001
    x = torch.randn(rows, n, device="cuda")
    t = torch.randint(0, n, (rows,), device="cuda")
    for reduction in ("mean", "none"):
        leaf = x.clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        ta.cross_entropy(leaf, t, reduction=reduction, inplace_backward=True).sum().backward()
        extra = torch.cuda.max_memory_allocated() - before
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        print(f"{reduction}: {extra} bytes more at the peak (logits {x.numel() * 4}); grad is the input's memory: "
              f"{leaf.grad is not None and leaf.grad.data_ptr() == leaf.data_ptr()}")
        for trace in snapshot["device_traces"]:
            for event in trace:
                if event["action"] == "alloc" and event["size"] >= 1 << 20:
                    frames = [f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in event["frames"]]
                    print(f"  alloc {event['size']} bytes at", " <- ".join(frames[:8]) or "(no Python frames)")


if __name__ == "__main__":
    main()
