"""linear_gelu's backward (bfloat16, torch adapter) on the Hopper GEMM's narrow tiles and K splits
against session 15's routing (outputs under half a wave of 128 x 256 tiles on the portable
kernels), and each of its parts alone: dpre + dbias (the fused elementwise pass), dx = dpre @ W
(nn), dW = dpre^T @ x (tn). CUDA graphs of one call; both routings in the same run.

    python bench/explore_bwd_routing.py [--out bench/results]
"""
import importlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(32, 768, 3072), (256, 768, 3072), (8192, 768, 3072)]


def main():
    sys.path.insert(0, HERE)
    from timing import device_time_us, graphed, start, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import torch_adapter as ta
    mm = importlib.import_module("rawops.matmul")
    h = importlib.import_module("rawops._gemm_sm90")
    routings = {"narrow tiles + split K (planner)": {}, "session 15 (portable under 0.5 wave)": {(h, "NARROW"): False}}
    rows = []
    for m, k, n in SHAPES:
        dt = torch.bfloat16
        x = torch.randn(m, k, device="cuda", dtype=dt)
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dt)
        b = torch.randn(n, device="cuda", dtype=dt)
        dy = torch.randn(m, n, device="cuda", dtype=dt)
        pre = torch.nn.functional.linear(x, w, b)
        dpre = torch.randn(m, n, device="cuda", dtype=dt)
        dx, dw = torch.empty(m, k, device="cuda", dtype=dt), torch.empty(n, k, device="cuda", dtype=dt)
        parts = {"whole backward": lambda: ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh"),
                 "dpre + dbias": lambda: ta._bias_gelu_bwd_fused(dy, pre, None, "tanh"),
                 "dx (nn)": lambda: ta._gemm(0, "nn", 2, dpre.data_ptr(), w.data_ptr(), dx.data_ptr(), m, k, n),
                 "dW (tn)": lambda: ta._gemm(0, "tn", 2, dpre.data_ptr(), x.data_ptr(), dw.data_ptr(), n, k, m)}
        for label, settings in routings.items():
            saved = {key: getattr(*key) for key in settings}
            for (module, name), value in settings.items():
                setattr(module, name, value)
            mm._plans.clear()
            try:
                replays = {part: graphed(fn) for part, fn in parts.items()}
                plans = {"dx": mm._launch_plan("nn", 2, m, k, n, dpre.data_ptr(), w.data_ptr(), 0),
                         "dW": mm._launch_plan("tn", 2, n, k, m, dpre.data_ptr(), x.data_ptr(), 0)}
            finally:
                for (module, name), value in saved.items():
                    setattr(module, name, value)
                mm._plans.clear()
            routes = ", ".join(f"{g}: " + (f"Hopper BN {p[5][0]} x{p[5][1]}" if p[4] == 0 else f"portable x{p[4]}")
                               for g, p in plans.items())
            for part, replay in replays.items():
                us = device_time_us(replay)
                rows.append({"shape": f"{m}x{k}->{n}", "routing": label, "part": part, "us": us, "routes": routes})
                print(f"{m}x{k}->{n} {label:38s} {part:16s} {us:8.2f} us  ({routes})", flush=True)
    write_results(out_dir, "explore_bwd_routing", "python bench/explore_bwd_routing.py", [
        ("linear_gelu backward bf16 by routing (CUDA graph of one call)", ["shape", "routing", "part", "us", "routes"],
         rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
