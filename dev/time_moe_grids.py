"""The moe row kernels' grid (issue 28: permute at 0.67-0.73 of the H100's copy ceiling, bar 0.85):
one wave of resident blocks walking the rows grid-stride (shipped, rawops/moe.py warp_grid) against a
grid covering every row once (a warp a row, short blocks handed out in order: the image maps gained
4-9% from it on the H100, docs/performance.md). permute, unpermute + combine and its backward at
bench_moe's shapes, each call with both grids, interleaved (timing.py). Experiment, not a bench.
    python dev/time_moe_grids.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

from rawops import moe as _moe  # noqa: E402
from rawops.torch_adapter import moe as ta_moe  # noqa: E402

SHAPES = [("qwen3", 16384, 2048, 128, 8), ("mixtral", 16384, 4096, 64, 2)]


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    shipped = _moe._modules.resident_blocks
    flags = _moe.score_flags("softmax", True)
    for name, tokens, hidden, experts, k in SHAPES:
        logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        weights, ids, _ = ta_moe.route(logits, k, flags)
        y, offsets, counts, index = ta_moe.permute(x, ids, experts, 1)
        dout = torch.randn_like(x)
        e = x.element_size()
        calls = {  # (call, bytes it must move)
            "permute": (lambda: ta_moe.permute(x, ids, experts, 1), tokens * hidden * e * (1 + k)),
            "unpermute": (lambda: ta_moe.unpermute(y, weights, index), tokens * hidden * e * (1 + k)),
            "unpermute bwd": (lambda: ta_moe.unpermute_backward(dout, y, weights, index, offsets, counts),
                              tokens * hidden * e * (1 + 2 * k)),
        }
        for op, (call, nbytes) in calls.items():
            def covering(call=call):
                _moe._modules.resident_blocks = lambda *args: 1 << 30
                try:
                    call()
                finally:
                    _moe._modules.resident_blocks = shipped
            times = timing.device_times_us({"resident": call, "covering": covering}, reps=20, rounds=5)
            print(f"{name:8s} {op:14s} " + "  ".join(f"{g} {us:7.1f} us {nbytes / us / 1e6 / ceiling:.3f}"
                                                     for g, us in times.items()))


if __name__ == "__main__":
    main()
