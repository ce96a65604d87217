"""bias_gelu's fused backward (dx + dbias in one pass) against the blocks a SM its plan aims
for: device time at 16384 x 4096 (64M elements) per dtype, next to the unfused pair (dx,
then column_sum) and torch, in one run.

    python bench/explore_bias_bwd.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, start, write_results  # noqa: E402

ROWS, COLS = 16384, 4096
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    shipped = ew.BIAS_BWD_BLOCKS_PER_SM
    rows = []
    for name, dtype in DTYPES.items():
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        nbytes = 3 * dy.numel() * dy.element_size()

        def unfused():
            dx = ta._GELU_KERNELS[("tanh", "bwd", True)].torch_call(dy, x, c=bias)
            return dx, ta._column_sum(dx)

        def torch_eager():
            dx = torch.ops.aten.gelu_backward(dy, x + bias, approximate="tanh")
            return dx, dx.sum(0)

        candidates = {"unfused (dx, column_sum)": unfused, "torch": torch_eager}
        for blocks in (1, 2, 3, 4, 8):
            ew.BIAS_BWD_BLOCKS_PER_SM = blocks
            candidates[f"fused, {blocks} blocks/SM"] = (lambda b: lambda: (setattr(ew, "BIAS_BWD_BLOCKS_PER_SM", b),
                                                                            ta._bias_gelu_bwd(dy, x, bias, "tanh")))(blocks)
        for label, fn in candidates.items():
            us = device_time_us(fn)
            rows.append({"dtype": name, "variant": label, "us": us, "TB/s": nbytes / us / 1e6,
                         "of copy ceiling": nbytes / us / 1e6 / ceiling})
            print(f"{name:5s} {label:28s} {us:8.1f} us {nbytes / us / 1e6:5.2f} TB/s", flush=True)
        ew.BIAS_BWD_BLOCKS_PER_SM = shipped
        del dy, x
        torch.cuda.empty_cache()
    text = write_results(out_dir, "explore_bias_bwd", "python bench/explore_bias_bwd.py", [
        (f"bias_gelu backward (dx + dbias), {ROWS}x{COLS}, tanh", ["dtype", "variant", "us", "TB/s", "of copy ceiling"],
         rows, {"copy ceiling TB/s": round(ceiling, 3), "shipped blocks/SM": shipped,
                "bytes": "dy + x read, dx written (bias, dbias and the partials not counted)"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
