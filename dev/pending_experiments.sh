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
run flce_chunks python3 dev/time_flce_chunks.py            # the fused loss at bench_model's head
run profile_model python3 dev/profile_model.py --host rawops-bf16 blocks-bf16
run sort_occupancy python3 dev/time_sort_occupancy.py      # the 1024-key tile at 8 blocks an SM
run norm_bwd_old python3 dev/time_norm_bwd_old.py          # the H100's 16-bit layer_norm bwd, 154 -> 166 us
run gray_small python3 dev/time_gray_small.py              # rgb_to_gray u8 4K's 14-32 us between runs
run gemm_layouts python3 dev/time_gemm_layouts.py          # the 256 / 128 planner at 768-wide outputs
