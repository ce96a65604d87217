"""torch's own error of a 16-bit fused-linear cross-entropy gradient against float64, over fresh
draws (tests/test_losses_linear.py: native(), the case that failed a fixed tolerance: T=130, H=72,
V=32001, smoothing 0.1, z 1e-3, mean). Experiment, not a bench.
    python dev/losses_linear_torch_error.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_losses_linear as T  # noqa: E402
from gpu_reference import random  # noqa: E402

for dtype in (torch.float16, torch.bfloat16):
    errors = []
    for _ in range(30):
        x, w, b, t = T._problem(130, 72, 32001, dtype, True)
        go = random((), dtype)
        ref = T.reference(x, w, b, t, -100, 0.1, "mean", 1e-3, go)
        own = T.native(x, w, b, t, -100, 0.1, "mean", 1e-3, go)
        errors.append([float((o.double() - r).norm() / r.norm()) for o, r in zip(own[1:], ref[1:])])
    for i, name in enumerate(("grad_input", "grad_weight", "grad_bias")):
        col = sorted(e[i] for e in errors)
        print(f"{dtype} {name}: torch's own relative error over 30 draws min {col[0]:.3g} "
              f"median {col[15]:.3g} max {col[-1]:.3g}")
