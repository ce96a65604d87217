#!/usr/bin/env bash
# Nsight Compute (full set, text) of the kernels under their bars on the H200: the 1024-key row
# sort (issue 27) and the 64-wide f16 fused MLP forward (issue 26). Writes $1/ncu_<name>.txt.
#   bash dev/ncu_targets.sh "$OUT" [names...]   (names: sort mlp; default both)
out=${1:?output folder}; shift
names=${*:-sort mlp}
mlp_setup="import torch.nn as nn
net = nn.Sequential(*[m for i in range(5) for m in (nn.Linear(64, 64), nn.ReLU())][:-1]).cuda().half()
m = ta.FusedMLP.from_sequential(net)"
prof() {
  local name=$1; shift
  timeout 240 ncu --profile-from-start off --set full "$@" > "$out/ncu_$name.txt" 2>&1
  echo "ncu $name rc=$?"
}
for name in $names; do
  case $name in
    sort) prof sort python dev/profile.py "ta.sort(x)" --shape 65536x1024 --dtype f32 ;;
    mlp) prof mlp python dev/profile.py "with torch.no_grad(): m(x)" --shape 1048576x64 --dtype f16 --setup "$mlp_setup" ;;
  esac
done
