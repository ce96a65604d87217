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
# (none pending: the six of 2026-12-07 ran at 92e3ed1 on the H100, their conclusions in docs/performance.md)
