#!/usr/bin/env bash
# The GPU experiments written since the last device round that ran them, each under a time cap, one
# log each in $1 (default /tmp), so one device call answers all of them:
#   bash dev/pending_experiments.sh "$OUT"          (CAP=120: seconds each at most)
# On a machine dev/device_resume.sh has built: `echo 'bash dev/pending_experiments.sh $S/out' >
# dev/extra_next.sh` runs them before its round. Carry dev/.cubins (xz-compressed cubins) for the
# first two. Delete a line once its conclusion is in docs/performance.md.
out=${1:-/tmp}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
run() {
  local name=$1
  shift
  timeout "${CAP:-120}" "$@" >"$out/$name.log" 2>&1
  echo "$name: rc $? ($(tail -1 "$out/$name.log" | cut -c1-100))"
}
# Queued 2026-12-08 (stop 55, no GPU lent): the sort tiles with positions packed into the keys (issue 27;
# cubins in dev/.cubins), the 16-bit layer_norm backward at 1-4 blocks an SM (issue 26), the MoE call by kernel
# (issue 28: the permute's ~20 us of index kernels).
run sort_pack python dev/time_sort_pack.py
run norm_blocks python dev/time_norm_bwd.py layer_norm
run profile_moe python dev/profile_moe.py
