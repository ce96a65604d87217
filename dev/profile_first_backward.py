"""Where the first backward through a rawops adapter op spends its time (bench_first_call shows
seconds for rms_norm, swiglu and rope, milliseconds for cross_entropy): cProfile of the first
backward in a fresh process, top entries by cumulative time. Experiment, not a bench.
    python dev/profile_first_backward.py [rms_norm|swiglu|rope] [single]
single: autograd on the calling thread (cProfile sees only its own thread)."""
import os
import sys

# dev/profile.py (this folder's) would shadow the standard library's, which cProfile imports
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

op = sys.argv[1] if len(sys.argv) > 1 else "rms_norm"
torch.cuda.init()
if "single" in sys.argv:
    torch.autograd.set_multithreading_enabled(False)
warm = torch.ones(8, device="cuda", requires_grad=True)
(warm * 2).sum().backward()
import rawops.torch_adapter as ta  # noqa: E402

bf16 = torch.bfloat16
x = torch.randn(512, 2048, device="cuda", dtype=bf16, requires_grad=True)
w = torch.randn(2048, device="cuda", dtype=bf16, requires_grad=True)
g = torch.randn(512, 2048, device="cuda", dtype=bf16)
if op == "rms_norm":
    y = ta.rms_norm(x, (2048,), w, 1e-6)
elif op == "swiglu":
    y = ta.swiglu(x, x.detach().clone().requires_grad_())
else:
    q = torch.randn(1, 512, 16, 128, device="cuda", dtype=bf16, requires_grad=True)
    cos = torch.randn(1, 512, 128, device="cuda", dtype=bf16)
    y, _ = ta.rope(q.clone(), None, cos, cos, "neox", "bshd")
    g = torch.randn_like(y)
torch.cuda.synchronize()
t = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
torch.autograd.backward(y, g)
torch.cuda.synchronize()
profile.disable()
print(f"{op}: first backward {1e3 * (time.perf_counter() - t):.1f} ms")
pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
