#!/usr/bin/env bash
# One round on a GPU machine: build for its architecture, run every test, run the
# benchmarks. Results go to $OUT (the device tool's folder) or bench/results: one log
# (build, `rawops info`, tests) plus each benchmark's .md/.json (and the elementwise .png);
# the device tool returns at most 8 files: RAWOPS_BUNDLE=1 packs them into $OUT/results.tgz.
#   bash bench/device_round.sh [pytest args...]
#   RAWOPS_BENCH="norm mlp"   which bench/bench_<name>.py to run (default: every one)
#   RAWOPS_TESTS="tests/test_norm.py ..."   which test files (default: all but packaging, nvrtc)
#   RAWOPS_FAMILIES="norm softmax"   build only these kernel families (setup.py); "none_such" builds
#     none and keeps the fatbins in rawops/_fatbin: build them on the CPU machine first
#     (RAWOPS_CUDA_ARCH_LIST=9.0 python setup.py build_ext --inplace) and carry rawops/_fatbin, so the
#     GPU machine's time goes to tests and timings (its build then takes ~30 s instead of ~150)
#   RAWOPS_SKIP_BUILD=1   reuse the last build (a second call while the machine is warm)
#   RAWOPS_EXPLORE="timeline bias_bwd"   also run bench/explore_<name>.py (after the benchmarks); their
#     cubins can be built here beforehand (python bench/cubins.py 90) and carried (bench/.cubins)
#   .whl/nvidia_cutlass-*.whl (carried): CuTe headers for the Hopper GEMM (no network there)
# Each test file runs in its own pytest process: a kernel fault poisons the CUDA context
# of its process only, so one broken family cannot fail the others' tests.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
FINAL_OUT=$OUT
if [ "${RAWOPS_BUNDLE:-0}" = 1 ]; then OUT=$(mktemp -d); fi
LOG="$OUT/round.log"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
# The Hopper GEMM's CuTe headers: the GPU machine has no network, so the nvidia-cutlass wheel
# travels in .whl/ (carried) and its headers are unpacked from it.
if [ -z "${RAWOPS_CUTLASS_INCLUDE:-}" ] && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e "$(ls .whl/nvidia_cutlass-*.whl | head -1)" /tmp/cutlass-wheel \
    && export RAWOPS_CUTLASS_INCLUDE=/tmp/cutlass-wheel/cutlass_library/source/include
fi
arch=$(python3 -c "import cupy; d=cupy.cuda.Device(0).compute_capability; print(d[:-1]+'.'+d[-1])")
start=$(date +%s)
if [ "${RAWOPS_SKIP_BUILD:-0}" = 1 ]; then  # a second call on the same warm machine
  echo "build skipped (RAWOPS_SKIP_BUILD=1)" | tee "$LOG"
else
  RAWOPS_CUDA_ARCH_LIST=$arch python3 -m pip install --no-build-isolation --no-deps -e . >"$LOG" 2>&1 \
    || { tail -50 "$LOG"; exit 1; }
  echo "build for $arch took $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi
python3 -m rawops info 2>&1 | tee -a "$LOG" | head -4
tests_rc=0
# test_packaging and test_nvrtc need no GPU (CI runs them) and take two minutes: skipped here.
for f in ${RAWOPS_TESTS:-$(ls tests/test_*.py | grep -v -e test_packaging -e test_nvrtc)}; do
  echo "== $f" >>"$LOG"
  python3 -m pytest "$f" -q -rs -p no:cacheprovider "$@" >>"$LOG" 2>&1 || tests_rc=1
  echo "$f: $(tail -1 "$LOG")"
done
grep -E "^(FAILED|ERROR)" "$LOG" | head -40
for b in ${RAWOPS_BENCH:-$(cd bench && ls bench_*.py | sed "s/^bench_//; s/\.py$//")}; do
  echo "== bench_$b"
  python3 "bench/bench_$b.py" --out "$OUT" 2>&1 | tail -40
done
for e in ${RAWOPS_EXPLORE:-}; do
  echo "== explore_$e"
  python3 "bench/explore_$e.py" --out "$OUT" 2>&1 | tail -40
done
echo "tests exit code: $tests_rc"
if [ "$OUT" != "$FINAL_OUT" ]; then
  tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . && cp "$LOG" "$FINAL_OUT/round.log"
fi
exit $tests_rc
