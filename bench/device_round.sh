#!/usr/bin/env bash
# One round on a GPU machine: build for its architecture, run every test, run the
# benchmarks. Logs and results go to $OUT (the device tool's folder) or bench/results.
#   bash bench/device_round.sh [pytest args...]
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
arch=$(python3 -c "import cupy; d=cupy.cuda.Device(0).compute_capability; print(d[:-1]+'.'+d[-1])")
echo "building for $arch"
start=$(date +%s)
RAWOPS_CUDA_ARCH_LIST=$arch python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
echo "build took $(( $(date +%s) - start )) s"; grep "rawops:" "$OUT/build.log"
python3 -m rawops info | tee "$OUT/info.txt"
python3 -m pytest tests -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$OUT/tests.log" | tail -40
tests_rc=${PIPESTATUS[0]}
python3 bench/bench_elementwise.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -60
echo "tests exit code: $tests_rc"
exit $tests_rc
