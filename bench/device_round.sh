#!/usr/bin/env bash
# One round on a GPU machine: build for its architecture, run every test, run the
# benchmarks. Logs and results go to $OUT (the device tool's folder) or bench/results.
#   bash bench/device_round.sh [pytest args...]      (RAWOPS_EXPLORE=1 adds explore_map.py)
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
arch=$(python3 -c "import cupy; d=cupy.cuda.Device(0).compute_capability; print(d[:-1]+'.'+d[-1])")
start=$(date +%s)
RAWOPS_CUDA_ARCH_LIST=$arch python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
echo "build for $arch took $(( $(date +%s) - start )) s" | tee -a "$OUT/build.log"
python3 -m rawops info 2>&1 | tee -a "$OUT/build.log" | head -3
(cuobjdump --version; cuobjdump --dump-elf-symbols rawops/_fatbin/elementwise.fatbin | head -30) >>"$OUT/build.log" 2>&1
python3 -m pytest tests -q -rs -p no:cacheprovider "$@" >"$OUT/tests.log" 2>&1
tests_rc=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -40
if [ "${RAWOPS_EXPLORE:-0}" = 1 ]; then python3 bench/explore_map.py --out "$OUT" 2>&1 | tail -12; fi
# At most 8 files come back from the device tool: the tables (.md/.json/.png) carry the results.
python3 bench/bench_elementwise.py --out "$OUT" 2>&1 | tail -25
python3 bench/bench_norm.py --out "$OUT" 2>&1 | tail -40
echo "tests exit code: $tests_rc"
exit $tests_rc
