"""Where the time of rawops' MoE route and permute goes, kernel by kernel (torch.profiler, CUDA
activity), at bench_moe's shapes: bench_moe times each call whole (the index kernels, the row
copy, the allocations), this splits it. Experiment for issue 28, not a bench.
    python dev/profile_moe.py
"""
import os
import sys

# dev/profile.py (this folder's) would shadow the standard library's, which torch may import
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, "..")]
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile as torch_profile  # noqa: E402

from rawops import moe as _moe  # noqa: E402
from rawops.torch_adapter import moe as ta_moe  # noqa: E402

SHAPES = [("qwen3", 16384, 2048, 128, 8), ("mixtral", 16384, 4096, 64, 2)]


def show(title, fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    print(f"== {title} (per call, {reps} calls)")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total > 0:
            print(f"  {e.key[:70]:70s} {e.device_time_total / reps:9.1f} us  x{e.count // reps}")


def main():
    flags = _moe.score_flags("softmax", True)
    for name, tokens, hidden, experts, k in SHAPES:
        logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        show(f"{name} route", lambda: ta_moe.route(logits, k, flags))
        _, ids, _ = ta_moe.route(logits, k, flags)
        show(f"{name} permute", lambda: ta_moe.permute(x, ids, experts, 1))


if __name__ == "__main__":
    main()
