"""The Python around ta.rms_norm / ta.layer_norm's forward + backward through autograd, on the CPU
machine: the GPU's leaves stubbed (the dtype checks, the launches, the device queries; tensors on
the CPU, so torch's allocations are the CPU's, cheaper than CUDA's caching allocator), so what is
left is the adapter's own glue plus autograd's, timed beside a bare autograd.Function that only
allocates the same outputs (the floor any Python Function pays). Where the glue goes, per call, is
printed by cProfile. No GPU needed; the numbers are this machine's, not the GPU host's.

    python dev/host_norm_glue.py [--profile]
"""
import sys

HERE = sys.path[0]
sys.path = [p for p in sys.path if not p.rstrip("/").endswith("dev")]  # dev/profile.py is not the stdlib's
sys.path.insert(0, HERE.rstrip("/")[:-len("dev")] or ".")  # the checkout's rawops, not an installed one
import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from rawops import norm as _norm  # noqa: E402
from rawops.torch_adapter import norm as ta_norm  # noqa: E402

ROWS, COLS = 64, 1024
CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def stub():
    """The GPU's leaves replaced: checks answer the dtype code, the driver's launch and the device
    queries return at once; rawops/norm.py's launch_* and their plans run as on the GPU."""
    from rawops import _modules

    ta_norm.checked = lambda t, name, like=None, like_name="x": CODES[t.dtype]
    ta_norm.tensor_code = lambda t, name, like=None, like_name="x", contiguous=True: CODES[t.dtype]
    ta_norm.on_device = lambda device, launch, *args: launch(*args)
    ta_norm.sm_count = lambda device: 132
    ta_norm.raw_stream = lambda device: 0
    _norm.launch = lambda *args: None
    _modules.function_pointer = lambda family, name, device: 0
    fixed = {}

    def backward_config(op, device, dtype, itemsize, plan, n, has_weight, partials, shipped=_norm.backward_config):
        key = (op, dtype, n, has_weight, partials)  # the shipped function's cache, without its device queries
        if key not in fixed:
            fixed[key] = (0, plan[0], min(plan[1], 132), plan[2], 0, _norm._rows.chunks(plan[0], min(plan[1], 132),
                                                                                         plan[2]), 0)
        return fixed[key]
    _norm.backward_config = backward_config


class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return x.new_empty(x.shape), w.new_empty(w.shape)


def timed(step, reps=2000, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        best = min(best, (time.perf_counter() - t0) / reps * 1e6)
    return best


def main():
    stub()
    from rawops import torch_adapter as ta

    x = torch.randn(ROWS, COLS, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(COLS, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(COLS, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(ROWS, COLS, dtype=torch.bfloat16)
    steps = {
        "bare Function": lambda: torch.autograd.backward(Bare.apply(x, w), dy),
        "ta.rms_norm": lambda: torch.autograd.backward(ta.rms_norm(x, (COLS,), w, 1e-6), dy),
        "ta.layer_norm": lambda: torch.autograd.backward(ta.layer_norm(x, (COLS,), w, b), dy),
        "F.rms_norm (CPU kernels)": lambda: torch.autograd.backward(torch.nn.functional.rms_norm(x, (COLS,), w), dy),
    }
    for name, step in steps.items():
        print(f"{name:26s} {timed(step):7.2f} us a forward + backward", flush=True)
    if "--profile" in sys.argv:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(5000):
            steps["ta.layer_norm"]()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
