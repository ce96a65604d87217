"""moe_permute's index kernels (issue 28: on the H100 the Qwen3 permute call is 246 us against a copy
kernel of 219; count, scan and place and the gaps between them took ~27 us). The scan now runs
inside moe_place, every block its own prefix. (Launching place and the copy programmatically
dependent on sm_90 was measured at df11b21 / d7dbe80 here: Qwen3 246.2 us against 239.5 launched in
order, Mixtral 161.6 against 164.2; the copy's blocks triggered at place's start or at its end alike:
not kept. Each block's scan walking the buckets from 0 rather than from its own place, a variant
measured at 85b7f9b: Qwen3 241.0 against 240.5 us, Mixtral 162.7 / 162.6.) Variants of the whole
permute call (the bench's unit), interleaved (bench/timing.py):
  shipped            as built
  chunk=C            the index kernels' chunks at least C entries (fewer blocks: fewer counts each
                     block's scan reads; shipped 512, at most a block an SM)
Outputs checked equal to the shipped call's. Experiment, not a bench.
    python dev/time_moe_index.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402

from rawops import moe as _moe  # noqa: E402
from rawops.torch_adapter import moe as ta_moe  # noqa: E402

SHAPES = [("qwen3", 16384, 2048, 128, 8), ("mixtral", 16384, 4096, 64, 2)]
CHUNKS = (2048,)


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    for name, tokens, hidden, experts, k in SHAPES:
        logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        _, ids, _ = ta_moe.route(logits, k, _moe.score_flags("softmax", True))
        nbytes = tokens * hidden * 2 * (1 + k)

        def shipped():
            return ta_moe.permute(x, ids, experts, 1)

        calls = {"shipped": shipped}
        for chunk in CHUNKS:
            def chunked(chunk=chunk):
                saved = _moe.INDEX_MIN_CHUNK
                _moe.INDEX_MIN_CHUNK = chunk
                try:
                    return ta_moe.permute(x, ids, experts, 1)
                finally:
                    _moe.INDEX_MIN_CHUNK = saved
            calls[f"chunk={chunk}"] = chunked
        ref = shipped()
        same = {label: all(torch.equal(a, b) for a, b in zip(fn(), ref)) for label, fn in calls.items()}
        print(f"== {name}: T {tokens} H {hidden} E {experts} k {k}; equal to shipped: {same}")
        times = timing.device_times_us(calls, reps=20, rounds=5)
        for label, us in times.items():
            print(f"  {label:12s} {us:8.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of ceiling")


if __name__ == "__main__":
    main()
