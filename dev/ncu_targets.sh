#!/usr/bin/env bash
# Nsight Compute (full set, text) of the kernels under their bars on the H200: the 1024-key row
# sort (issue 27), the 64-wide f16 fused MLP forward and the 16-bit norm backwards (layer_norm's
# beside rms_norm's, bf16 16384 x 4096; issue 26), the 16-bit softmax and rms_norm forwards beside
# Liger's Triton kernels (faster in the benches; under ncu on 2026-12-03 our softmax 65.3 us against 67.3,
# rms_norm 70.6 against 66.5: docs/performance.md), the source network's backward on the tensor pipe
# (float32 2^20 rows: its chain and weight-gradient kernels, issue 26). Writes $1/ncu_<name>.txt.
#   bash dev/ncu_targets.sh "$OUT" [names...]   (names: sort mlp norm rows source; default sort mlp)
out=${1:?output folder}; shift
names=${*:-sort mlp}
mlp_setup="import torch.nn as nn
net = nn.Sequential(*[m for i in range(5) for m in (nn.Linear(64, 64), nn.ReLU())][:-1]).cuda().half()
m = ta.FusedMLP.from_sequential(net)"
norm_setup="import cupy
from rawops import norm
mean = torch.randn(16384, device='cuda') * 0.1
rstd = torch.rand(16384, device='cuda') + 0.5
X, DY, W, M, R = (cupy.from_dlpack(t) for t in (x, dy, w, mean, rstd))"
rows_setup="from liger_kernel.transformers import functional as lig"
source_setup="import torch.nn as nn
net = nn.Sequential(nn.Linear(100, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
m = ta.FusedMLP.from_sequential(net)
p = list(m.parameters())
dy = torch.randn(x.shape[0], 10, device='cuda')"
prof() {
  local name=$1; shift
  timeout 240 ncu --profile-from-start off --set full "$@" > "$out/ncu_$name.txt" 2>&1
  echo "ncu $name rc=$?"
}
for name in $names; do
  case $name in
    sort) prof sort python dev/profile.py "ta.sort(x)" --shape 65536x1024 --dtype f32 ;;
    norm) prof norm -k regex:'(layer|rms)_norm_bwd' python dev/profile.py "norm.layer_norm_backward(DY, X, W, M, R)" \
      "norm.rms_norm_backward(DY, X, W, R)" --shape 16384x4096 --dtype bf16 --setup "$norm_setup" ;;
    rows) prof rows -k regex:'softmax|rms_norm' python dev/profile.py "ta.softmax(x, -1)" "lig.liger_softmax(x)" \
      "ta.rms_norm(x, (4096,), w, 1e-6)" "lig.liger_rms_norm(x, w, 1e-6)" --shape 16384x4096 --dtype bf16 --setup "$rows_setup" ;;
    mlp) prof mlp python dev/profile.py "with torch.no_grad(): m(x)" --shape 1048576x64 --dtype f16 --setup "$mlp_setup" ;;
    source) prof source -k regex:'source_mlp_tc_(dgrad|wgrad)' python dev/profile.py "torch.autograd.grad(m(x), p, dy)" \
      --shape 1048576x100 --dtype f32 --setup "$source_setup" ;;
  esac
done
