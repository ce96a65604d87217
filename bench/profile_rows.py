"""One launch of a row kernel for Nsight Compute: `ncu -k regex:<kernel> python bench/profile_rows.py
<op> <dtype> [rows] [n]`, op one of layer_norm_bwd, rms_norm_bwd, layer_norm_fwd, softmax_fwd."""
import sys

import torch

from rawops import torch_adapter as ta

op, dtype = sys.argv[1], {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[sys.argv[2]]
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
n = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
x, dy = torch.randn(rows, n, device="cuda", dtype=dtype), torch.randn(rows, n, device="cuda", dtype=dtype)
w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
kind = op.rsplit("_", 1)[0]
for _ in range(2):
    if kind == "layer_norm":
        y = ta.layer_norm(x, w, b, 1e-5)
    elif kind == "rms_norm":
        y = ta.rms_norm(x, w, 1e-5)
    else:
        y = ta.softmax(x)
    if op.endswith("bwd"):
        y.backward(dy)
torch.cuda.synchronize()
