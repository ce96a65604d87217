"""Why bias_gelu's backward (dx + dbias, 16384 x 4096, tanh) reads 0.94-0.95 of the copy ceiling in
bench_elementwise but 0.96-0.97 in explore_bias_bwd_tiles (the same library call, the same
shape): the library call timed (a) as bench_elementwise does (x, y, dy allocated in that order as
flat 64M-element tensors, viewed as rows; interleaved with torch's eager backward), (b) on the
same tensors interleaved with nothing, (c) on dy, x allocated one after the other, (d) on (c)'s
tensors interleaved with torch. Same process, same run.

    python bench/explore_bias_bwd_context.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_times_us, start, write_results  # noqa: E402

N, COLS = 64 << 20, 4096
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _torch_bias_gelu_bwd(dy, x, bias):
    dx = torch.ops.aten.gelu_backward(dy, x + bias, approximate="tanh")
    return dx, dx.sum(0)


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops import torch_adapter as ta

    rows = []
    for name, dtype in DTYPES.items():
        nbytes = 3 * N * torch.tensor([], dtype=dtype).element_size()
        x, y, dy = (torch.randn(N, device="cuda", dtype=dtype) for _ in range(3))  # bench_elementwise's order
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        x2, dy2 = x.view(-1, COLS), dy.view(-1, COLS)
        times = {}
        times["(a) bench layout, with torch"] = device_times_us({
            "rawops": lambda: ta._bias_gelu_bwd(dy2, x2, bias, "tanh"),
            "torch": lambda: _torch_bias_gelu_bwd(dy2, x2, bias)})["rawops"]
        times["(b) bench layout, alone"] = device_times_us({
            "rawops": lambda: ta._bias_gelu_bwd(dy2, x2, bias, "tanh")})["rawops"]
        del x, y, dy, x2, dy2
        torch.cuda.empty_cache()
        dy3, x3 = (torch.randn(N // COLS, COLS, device="cuda", dtype=dtype) for _ in range(2))  # the explorer's
        times["(c) dy, x one after the other, alone"] = device_times_us({
            "rawops": lambda: ta._bias_gelu_bwd(dy3, x3, bias, "tanh")})["rawops"]
        times["(d) dy, x one after the other, with torch"] = device_times_us({
            "rawops": lambda: ta._bias_gelu_bwd(dy3, x3, bias, "tanh"),
            "torch": lambda: _torch_bias_gelu_bwd(dy3, x3, bias)})["rawops"]
        del dy3, x3
        torch.cuda.empty_cache()
        for label, us in times.items():
            rows.append({"dtype": name, "context": label, "us": us, "TB/s": nbytes / us / 1e6,
                         "of copy ceiling": nbytes / us / 1e6 / ceiling})
            print(rows[-1], flush=True)
    write_results(out_dir, "explore_bias_bwd_context", "python bench/explore_bias_bwd_context.py", [
        (f"bias_gelu backward (dx + dbias), {N // COLS}x{COLS}, tanh: the library call in four contexts",
         ["dtype", "context", "us", "TB/s", "of copy ceiling"], rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
