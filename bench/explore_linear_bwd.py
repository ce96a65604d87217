"""linear_gelu's backward GEMMs at bf16 8192x768->3072 on the Hopper kernel against the portable
split-K kernel (rawops._gemm_sm90.MIN_TILES_PER_SM moved; plans re-made): dW (3072 x 768 over
K = 8192) is 72 output tiles of 128 x 256 for 132 SMs there, dx 192. CUDA graphs, median of 50,
torch's aten ops in the same run.

    python bench/explore_linear_bwd.py [--out bench/results]
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import device_time_us, graphed, start, write_results  # noqa: E402

M, K, N = 8192, 768, 3072
THRESHOLDS = (0.5, 1.0, 1.5)  # MIN_TILES_PER_SM; 0.5 ships


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import _gemm_sm90
    from rawops import torch_adapter as ta

    matmul = ta._mm  # the module (the package's attribute rawops.matmul is the function)

    dtype = torch.bfloat16
    x = torch.randn(M, K, device="cuda").to(dtype)
    w = (torch.randn(N, K, device="cuda") * K ** -0.5).to(dtype)
    b = torch.randn(N, device="cuda").to(dtype)
    dy = torch.randn(M, N, device="cuda").to(dtype)
    pre = F.linear(x, w, b)
    dpre = torch.ops.aten.gelu_backward(dy, pre, approximate="tanh")
    ref_dx, ref_dw = (dpre.double() @ w.double()), (dpre.double().t() @ x.double())
    rows = []
    shipped = _gemm_sm90.MIN_TILES_PER_SM
    try:
        for threshold in THRESHOLDS:
            _gemm_sm90.MIN_TILES_PER_SM = threshold
            matmul._plans.clear()
            with torch.no_grad():
                dx, dw, _ = ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh")
                err_dx = ((dx.double() - ref_dx).norm() / ref_dx.norm()).item()
                err_dw = ((dw.double() - ref_dw).norm() / ref_dw.norm()).item()
                times = {
                    "backward (rawops)": device_time_us(graphed(lambda: ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh"))),
                    "dx = dpre @ W": device_time_us(graphed(lambda: ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh",
                                                                                         need_dweight=False))),
                    "dW = dpre^T @ x": device_time_us(graphed(lambda: ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh",
                                                                                           need_dx=False))),
                }
            for what, us in times.items():
                rows.append({"MIN_TILES_PER_SM": threshold, "what": what, "us": us,
                             "rel err dx": err_dx, "rel err dW": err_dw})
                print(rows[-1], flush=True)
    finally:
        _gemm_sm90.MIN_TILES_PER_SM = shipped
        matmul._plans.clear()

    def torch_bwd():
        d = torch.ops.aten.gelu_backward(dy, pre, approximate="tanh")
        return d @ w, d.t() @ x, d.sum(0)

    rows.append({"MIN_TILES_PER_SM": "-", "what": "torch (gelu_backward, 2 matmuls, sum)",
                 "us": device_time_us(graphed(torch_bwd)), "rel err dx": float("nan"), "rel err dW": float("nan")})
    print(rows[-1], flush=True)
    text = write_results(out_dir, "explore_linear_bwd", "python bench/explore_linear_bwd.py", [
        (f"linear_gelu backward bf16 {M}x{K}->{N}", ["MIN_TILES_PER_SM", "what", "us", "rel err dx", "rel err dW"],
         rows, {"note": "dx/dW-only rows include dpre + dbias (one fused pass)"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
