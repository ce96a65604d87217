"""linear_gelu's backward at float32 32x768->3072 piece by piece, on the GPU alone (CUDA graphs of
20 calls): dpre + dbias (the fused bias-GELU backward kernel and its final sum), dx = dpre @ W
(split K), dW = dpre^T @ x, and the whole backward, beside torch's aten ops for the same pieces.

    python bench/explore_linear_bwd_small.py [--out bench/results]
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import graph_per_call_us, start, write_results  # noqa: E402

M, K, N = 32, 768, 3072
CALLS = 20
SLOTS = (1, 2, 4, 6)  # gemm_small_m_nn's blocks an SM, besides the shipped SMALL_M_SLOTS


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import torch_adapter as ta

    mm = ta._mm  # the module (the package's attribute rawops.matmul is the function)
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda") * K ** -0.5
    b = torch.randn(N, device="cuda")
    dy = torch.randn(M, N, device="cuda")
    pre = F.linear(x, w, b)
    dpre = torch.ops.aten.gelu_backward(dy, pre, approximate="tanh")
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    code = 0
    cc = int(torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plans = {layout: mm.plan(layout, code, m, n, k, cc, a.data_ptr(), bb.data_ptr(), sms, c.data_ptr())
             for layout, m, n, k, a, bb, c in (("nn", M, K, N, dpre, w, dx), ("tn", N, K, M, dpre, x, dw))}
    fns = {
        "rawops dpre + dbias (fused, + final sum)": lambda: ta._bias_gelu_bwd_fused(dy, pre, None, "tanh"),
        "rawops dx = dpre @ W": lambda: ta._gemm(0, "nn", code, dpre.data_ptr(), w.data_ptr(), dx.data_ptr(), M, K, N),
        "rawops dW = dpre^T @ x": lambda: ta._gemm(0, "tn", code, dpre.data_ptr(), x.data_ptr(), dw.data_ptr(),
                                                    N, K, M),
        "rawops whole backward": lambda: ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh"),
        "torch gelu_backward": lambda: torch.ops.aten.gelu_backward(dy, pre, approximate="tanh"),
        "torch dpre.sum(0)": lambda: dpre.sum(0),
        "torch dpre @ W": lambda: dpre @ w,
        "torch dpre^T @ x": lambda: dpre.t() @ x,
    }

    def torch_whole():
        d = torch.ops.aten.gelu_backward(dy, pre, approximate="tanh")
        return d @ w, d.t() @ x, d.sum(0)
    fns["torch whole backward"] = torch_whole

    def dx_with_slots(slots):  # gemm_small_m_nn's K splits aiming at `slots` blocks an SM
        def run():
            shipped = mm.SMALL_M_SLOTS
            mm.SMALL_M_SLOTS = slots
            mm._plans.clear()
            try:
                ta._gemm(0, "nn", code, dpre.data_ptr(), w.data_ptr(), dx.data_ptr(), M, K, N)
            finally:
                mm.SMALL_M_SLOTS = shipped
                mm._plans.clear()
        return run
    for slots in SLOTS:
        splits = max(1, min(-(-slots * sms // -(-K // mm.SMALL_M_COLS)), N // mm.SMALL_M_MIN_K, mm.MAX_SPLITS))
        fns[f"rawops dx, {slots} blocks an SM ({splits} splits)"] = dx_with_slots(slots)
    # Checks: each rawops piece against float64.
    ta._gemm(0, "nn", code, dpre.data_ptr(), w.data_ptr(), dx.data_ptr(), M, K, N)
    ta._gemm(0, "tn", code, dpre.data_ptr(), x.data_ptr(), dw.data_ptr(), N, K, M)
    torch.cuda.synchronize()
    ref_dx, ref_dw = dpre.double() @ w.double(), dpre.double().t() @ x.double()
    errors = {"dx": ((dx.double() - ref_dx).norm() / ref_dx.norm()).item(),
              "dW": ((dw.double() - ref_dw).norm() / ref_dw.norm()).item()}
    assert max(errors.values()) < 1e-5, errors
    times = {name: [] for name in fns}
    for _ in range(3):  # interleaved rounds
        for name, fn in fns.items():
            times[name].append(graph_per_call_us(fn, CALLS, reps=20))
    rows = [{"piece": name, "us a call (graph of 20)": sorted(v)[1]} for name, v in times.items()]
    for row in rows:
        print(row, flush=True)
    notes = {"plans": "; ".join(f"{layout}: {p[0]} grid {p[1]}, block {p[2]}, shared {p[3]}, splits {p[4]}"
                                for layout, p in plans.items()),
             "rel errors": ", ".join(f"{k} {v:.2e}" for k, v in errors.items())}
    write_results(out_dir, "explore_linear_bwd_small", "python bench/explore_linear_bwd_small.py",
                  [(f"linear_gelu backward float32 {M}x{K}->{N}, GPU time", ["piece", "us a call (graph of 20)"],
                    rows, notes)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
