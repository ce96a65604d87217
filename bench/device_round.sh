#!/usr/bin/env bash
# One round on a GPU machine: build for its architecture, run every test, run every
# benchmark. Results go to $OUT (the device tool's folder) or bench/results: one log
# (build, `rawops info`, tests) plus each benchmark's .md/.json (and the elementwise .png),
# 8 files in all, the most the device tool returns.
#   bash bench/device_round.sh [pytest args...]      (RAWOPS_EXPLORE=1 adds explore_map.py,
#                                                     a 9th file: drop a benchmark then)
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
LOG="$OUT/round.log"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
arch=$(python3 -c "import cupy; d=cupy.cuda.Device(0).compute_capability; print(d[:-1]+'.'+d[-1])")
start=$(date +%s)
RAWOPS_CUDA_ARCH_LIST=$arch python3 -m pip install --no-build-isolation --no-deps -e . >"$LOG" 2>&1 \
  || { tail -50 "$LOG"; exit 1; }
echo "build for $arch took $(( $(date +%s) - start )) s" | tee -a "$LOG"
python3 -m rawops info 2>&1 | tee -a "$LOG" | head -4
python3 -m pytest tests -q -rs -p no:cacheprovider "$@" >>"$LOG" 2>&1
tests_rc=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -40
if [ "${RAWOPS_EXPLORE:-0}" = 1 ]; then python3 bench/explore_map.py --out "$OUT" 2>&1 | tail -12; fi
python3 bench/bench_elementwise.py --out "$OUT" 2>&1 | tail -25
python3 bench/bench_norm.py --out "$OUT" 2>&1 | tail -30
python3 bench/bench_mlp.py --out "$OUT" 2>&1 | tail -12
echo "tests exit code: $tests_rc"
exit $tests_rc
