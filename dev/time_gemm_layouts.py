"""rawops' GEMM in each layout a Linear's training runs (forward "nt", dgrad "nn", wgrad "tn") against
torch.matmul on the same operands, at bench_model's MLP shapes (8192 tokens, 1024 <-> 4096) and
bench_gemm's (768 <-> 3072), bf16 (issue 26 item 6: the bf16 "blocks" stack, LinearGELU for the MLP's
first Linear, read 0.92x stock's step on the H100; is it the backward's GEMMs?). Device time a call
(events, median of interleaved rounds, operands beyond L2), TFLOP/s beside it.

    python dev/time_gemm_layouts.py [--dtype bf16|f16] [--sweep]

--sweep: each plain layout also under every forced Hopper tile shape (config.gemm_sm90_shape = (tile
width, K splits)): which shape the planner should pick where rawops trails cuBLAS (the 768-wide outputs:
3 tiles of 256 across, 192 or 72 tiles for 132 SMs).
"""
import argparse
import os
import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch  # noqa: E402

from timing import device_times_us  # noqa: E402
from rawops import config  # noqa: E402
from rawops.torch_adapter import gemm as ta_gemm  # noqa: E402

SHAPES = [(8192, 1024, 4096), (8192, 4096, 1024), (8192, 768, 3072), (8192, 3072, 768)]  # tokens, in, out
FORCED = [(256, 1), (128, 1), (128, 2), (128, 3), (64, 1), (64, 2), (64, 4)]  # (tile width, K splits)


def forced_us(fn):
    """{(width, splits): device us} of fn under each forced Hopper tile shape."""
    out = {}
    for shape in FORCED:
        with config.override(gemm_sm90_shape=shape):
            out[shape] = device_times_us({"x": fn})["x"]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    code = {torch.bfloat16: 2, torch.float16: 1}[dtype]
    device = torch.cuda.current_device()
    print(f"{torch.cuda.get_device_name()}, {dtype}")
    for tokens, n_in, n_out in SHAPES:
        x = torch.randn(tokens, n_in, device="cuda", dtype=dtype)
        w = torch.randn(n_out, n_in, device="cuda", dtype=dtype) * n_in ** -0.5
        dy = torch.randn(tokens, n_out, device="cuda", dtype=dtype)
        y, dx, dw = x.new_empty(tokens, n_out), x.new_empty(tokens, n_in), x.new_empty(n_out, n_in)
        cases = {  # layout: (rawops launch, torch's, its output, the reference)
            "fwd nt": (lambda: ta_gemm._launch(device, "nt", code, x.data_ptr(), w.data_ptr(), y.data_ptr(), tokens,
                                               n_out, n_in),
                       lambda: torch.matmul(x, w.t(), out=y), y, lambda: x.float() @ w.float().t()),
            "dgrad nn": (lambda: ta_gemm._launch(device, "nn", code, dy.data_ptr(), w.data_ptr(), dx.data_ptr(),
                                                 tokens, n_in, n_out),
                         lambda: torch.matmul(dy, w, out=dx), dx, lambda: dy.float() @ w.float()),
            "wgrad tn": (lambda: ta_gemm._launch(device, "tn", code, dy.data_ptr(), x.data_ptr(), dw.data_ptr(),
                                                 n_out, n_in, tokens),
                         lambda: torch.matmul(dy.t(), x, out=dw), dw, lambda: dy.float().t() @ x.float()),
            "fwd nt, bias + GELU (erf) + pre": (  # linear_gelu's forward, as LinearGELU runs it
                lambda: ta_gemm.linear_gelu_forward(x, w, bias, "none", True),
                lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias)), None, None),
            "fwd nt, bias + GELU (erf) + pre, x 3-D": (
                lambda: ta_gemm.linear_gelu_forward(x.view(8, -1, n_in), w, bias, "none", True),
                lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias)), None, None),
            "fwd nt, bias + GELU (erf)": (lambda: ta_gemm.linear_gelu_forward(x, w, bias, "none", False),
                                         lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias)),
                                         None, None),
            "fwd nt, bias + GELU (tanh) + pre": (lambda: ta_gemm.linear_gelu_forward(x, w, bias, "tanh", True),
                                                lambda: torch.nn.functional.linear(x, w, bias), None, None),
        }
        bias = torch.randn(n_out, device="cuda", dtype=dtype) * 0.1
        flops = 2 * tokens * n_in * n_out
        for name, (ours, theirs, out, ref) in cases.items():
            ours()
            torch.cuda.synchronize()
            error = float("nan")
            if out is not None:
                want = ref()
                error = ((out.float() - want).norm() / want.norm()).item()
            t = device_times_us({"rawops": ours, "torch": theirs})
            print(f"{tokens}x{n_in}->{n_out} {name:33s} rawops {t['rawops']:7.1f} us ({flops / t['rawops'] / 1e6:5.0f} "
                  f"TFLOP/s) | torch {t['torch']:7.1f} us ({flops / t['torch'] / 1e6:5.0f}) | x torch "
                  f"{t['torch'] / t['rawops']:5.2f} | rel err {error:.2g}", flush=True)
            if args.sweep and out is not None:
                forced = forced_us(ours)
                print("    forced (width, splits): " + "  ".join(f"{w}x{k} {us:6.1f}" for (w, k), us in forced.items()),
                      flush=True)


if __name__ == "__main__":
    main()
