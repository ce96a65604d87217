"""One launch of the float32 small-batch linear_gelu kernel at 32x768->3072 as the library runs
it (rawops.torch_adapter.linear_gelu, warm L2 like the benchmark), for Nsight Compute:

    ncu --set full -k regex:linear_small --launch-skip 3 --launch-count 1 python bench/profile_linear_small.py
"""
import torch

from rawops import torch_adapter as ta

m, k, n = 32, 768, 3072
x = torch.randn(m, k, device="cuda")
w = torch.randn(n, k, device="cuda") * k ** -0.5
b = torch.randn(n, device="cuda")
for _ in range(5):
    ta.linear_gelu(x, w, b)
torch.cuda.synchronize()
