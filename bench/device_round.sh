#!/usr/bin/env bash
# One round on a GPU machine: build for its architecture, run every test file, run the
# benchmarks. Results go to $OUT (the device tool's folder) or bench/results: one log (build,
# `rawops info`, tests) in $OUT/round.log, each benchmark's $OUT/<gpu>/<family>.md|json (and the
# elementwise .png), and $OUT/history.csv with the run's rows appended. When $OUT is not
# bench/results, bench/results/history.csv is copied there first, so the history.csv that comes
# back is the whole file to commit over bench/results/history.csv.
#   bash bench/device_round.sh [pytest args...]
#   RAWOPS_BENCH="norm mlp"   which bench/bench_<family>.py to run (default: every one; "none": none)
#   RAWOPS_TESTS="tests/test_norm.py ..."   which test files (default: all but packaging, nvrtc)
#   RAWOPS_FAMILIES="norm softmaxes"   build only these kernel families (setup.py); "none_such" builds
#     none and keeps the fatbins in rawops/_fatbin. Unset, and rawops/_fatbin holds a fatbin for every
#     kernels/*.cu family with this GPU's architecture in each (built on the CPU machine with
#     RAWOPS_CUDA_ARCH_LIST=9.0 python setup.py build_ext --inplace and carried), it is none_such: the
#     GPU's time then goes to tests and timings. Set it (to the family names) to rebuild with nvcc.
#   RAWOPS_SKIP_BUILD=1   reuse the last build (a second call while the machine is warm)
#   RAWOPS_COMMIT=<sha>   the commit the rows are recorded under (default: git rev-parse, else unknown;
#     the device tool's copy of the tree may carry an older .git: pass it from the CPU machine)
#   RAWOPS_BUNDLE=1   pack $OUT into $OUT/results.tgz (+ round.log beside it): the device tool brings
#     back few files
#   RAWOPS_SANITIZE="memcheck racecheck"   run test files under compute-sanitizer too (see below)
#   RAWOPS_DEADLINE_S=540   stop starting tests and benches this many seconds after the script's start,
#     and cut the one running then (timeout): the results so far still come back bundled
#   .whl/nvidia_cutlass-*.whl (carried): CuTe headers for the Hopper GEMM (no network there)
#   .whl/liger_kernel-*.whl (carried): installed without dependencies for the benches' Liger column
# Each test file runs in its own pytest process: a kernel fault poisons the CUDA context
# of its process only, so one broken family cannot fail the others' tests.
set -o pipefail
export PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${RAWOPS_DEADLINE_S:-1000000} ))
left() { echo $(( deadline - $(date +%s) )); }
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
FINAL_OUT=$OUT
if [ "${RAWOPS_BUNDLE:-0}" = 1 ]; then OUT=$(mktemp -d); fi
LOG="$OUT/round.log"
mkdir -p "$OUT"
if [ "$(realpath "$OUT")" != "$(realpath bench/results)" ] && [ ! -e "$OUT/history.csv" ] \
  && [ -e bench/results/history.csv ]; then
  cp bench/results/history.csv "$OUT/history.csv"
fi
if [ -z "${RAWOPS_COMMIT:-}" ]; then
  RAWOPS_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  export RAWOPS_COMMIT
fi
echo "commit: $RAWOPS_COMMIT" | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
# The Hopper GEMM's CuTe headers: the GPU machine has no network, so the nvidia-cutlass wheel
# travels in .whl/ (carried) and its headers are unpacked from it.
if [ -z "${RAWOPS_CUTLASS_INCLUDE:-}" ] && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e "$(ls .whl/nvidia_cutlass-*.whl | head -1)" /tmp/cutlass-wheel \
    && export RAWOPS_CUTLASS_INCLUDE=/tmp/cutlass-wheel/cutlass_library/source/include
fi
# Liger-Kernel for the benches' side-by-side column, from its carried wheel (no network there; no
# dependencies: triton and torch are on the machine). Absent, the column reads nan.
if ls .whl/liger_kernel-*.whl >/dev/null 2>&1 && ! python3 -c "import liger_kernel" 2>/dev/null; then
  python3 -m pip install -q --no-deps "$(ls .whl/liger_kernel-*.whl | head -1)" >>"$LOG" 2>&1 \
    || echo "liger-kernel: wheel not installed (its column reads nan)" | tee -a "$LOG"
fi
arch=$(python3 -c "import cupy; d=cupy.cuda.Device(0).compute_capability; print(d[:-1]+'.'+d[-1])")
# Prebuilt fatbins: every family's fatbin present and holding sm_<arch> (an arch-specific family,
# `// rawops-arch: 90a`, only where this GPU is one of its targets).
prebuilt() {
  python3 - "$arch" <<'PY'
import glob, os, re, sys
sys.path.insert(0, "rawops")
from _fatbin_info import fatbin_architectures
sm = "sm_" + sys.argv[1].replace(".", "")
for source in sorted(glob.glob("kernels/*.cu")):
    family = os.path.splitext(os.path.basename(source))[0]
    directive = re.search(r"//\s*rawops-arch:\s*(\S+)", open(source).read())
    if directive and sys.argv[1].replace(".", "") not in re.findall(r"\d+", directive.group(1)):
        continue
    path = f"rawops/_fatbin/{family}.fatbin"
    if not os.path.exists(path) or not any(a == sm or a == sm + "a" for a in fatbin_architectures(path)):
        sys.exit(1)
PY
}
if [ -z "${RAWOPS_FAMILIES+set}" ] && prebuilt; then
  export RAWOPS_FAMILIES=none_such
  echo "rawops/_fatbin holds every family for sm_${arch/./}: building without nvcc" | tee -a "$LOG"
fi
start=$(date +%s)
if [ "${RAWOPS_SKIP_BUILD:-0}" = 1 ]; then  # a second call on the same warm machine
  echo "build skipped (RAWOPS_SKIP_BUILD=1)" | tee -a "$LOG"
else
  RAWOPS_CUDA_ARCH_LIST=$arch python3 -m pip install --no-build-isolation --no-deps -e . >>"$LOG" 2>&1 \
    || { tail -50 "$LOG"; exit 1; }
  echo "build for $arch took $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi
python3 -m rawops info 2>&1 | tee -a "$LOG" | head -4
tests_rc=0
# test_packaging and test_nvrtc need no GPU (CI runs them) and take two minutes: skipped here.
default_tests=$(ls tests/test_*.py | grep -v -e test_packaging -e test_nvrtc)
for f in ${RAWOPS_TESTS:-$default_tests}; do
  if [ "$(left)" -lt 15 ]; then echo "$f: not run (RAWOPS_DEADLINE_S)" | tee -a "$LOG"; tests_rc=1; continue; fi
  echo "== $f" >>"$LOG"
  timeout "$(left)" python3 -m pytest "$f" -q -rs -p no:cacheprovider "$@" >>"$LOG" 2>&1 || tests_rc=1
  echo "$f: $(tail -1 "$LOG")"
done
grep -E "^(FAILED|ERROR)" "$LOG" | head -40
# compute-sanitizer (issue 26, item 7): each tool of RAWOPS_SANITIZE (memcheck, racecheck, synccheck,
# initcheck; "tool:tests/a.py,tests/b.py" gives a tool its own files) over each file of
# RAWOPS_SANITIZE_TESTS (default: the test files above), one process a file, pytest args from
# RAWOPS_SANITIZE_ARGS (say -k to narrow a slow tool), each file cut at RAWOPS_SANITIZE_FILE_S (exit
# 124: the table says how far it got); a tool's error makes the file's exit code 86.
# --target-processes all: the processes a test spawns (test_moe's expert-parallel ranks) run under the tool too.
# Logs in $OUT/sanitizer/, the table in $OUT/<gpu>/sanitizer.md. RAWOPS_UNDER_SANITIZER=1 tells the tests
# (tests/test_losses.py skips a peak-memory check that torch's autograd fails under memcheck).
if [ -n "${RAWOPS_SANITIZE:-}" ]; then
  gpu=$(python3 -c "import sys; sys.path.insert(0, 'bench'); from timing import gpu_key; print(gpu_key())")
  mkdir -p "$OUT/sanitizer" "$OUT/$gpu"
  table="$OUT/$gpu/sanitizer.md"
  { echo "# compute-sanitizer over the GPU tests ($gpu)"; echo
    echo "- commit: $RAWOPS_COMMIT"; echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- command: RAWOPS_SANITIZE=\"$RAWOPS_SANITIZE\" RAWOPS_SANITIZE_TESTS=\"${RAWOPS_SANITIZE_TESTS:-}\" RAWOPS_SANITIZE_ARGS=\"${RAWOPS_SANITIZE_ARGS:-}\" bash bench/device_round.sh"
    echo "- $(compute-sanitizer --version | tail -1)"; echo
    echo "| tool | test file | pytest | tool summary | exit | seconds |"; echo "|---|---|---|---|---|---|"; } >"$table"
  for entry in $RAWOPS_SANITIZE; do
    tool=${entry%%:*}
    files=${RAWOPS_SANITIZE_TESTS:-${RAWOPS_TESTS:-$default_tests}}
    [ "$entry" != "$tool" ] && files=${entry#*:} && files=${files//,/ }
    for f in $files; do
      if [ "$(left)" -lt 30 ]; then echo "| $tool | $f | not run (RAWOPS_DEADLINE_S) | | | |" >>"$table"; tests_rc=1; continue; fi
      log="$OUT/sanitizer/${tool}_$(basename "$f" .py).log"
      t0=$(date +%s)
      cap=${RAWOPS_SANITIZE_FILE_S:-600}
      RAWOPS_UNDER_SANITIZER=1 timeout "$(( $(left) < cap ? $(left) : cap ))" compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 86 --report-api-errors no \
        $( [ "$tool" = racecheck ] && echo --racecheck-report hazard ) \
        python3 -m pytest "$f" -q -p no:cacheprovider ${RAWOPS_SANITIZE_ARGS:-} >"$log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || tests_rc=1
      result=$(grep -E "[0-9]+ (passed|failed)|no tests ran" "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
      if [ $rc -eq 124 ]; then  # cut: how far pytest got, or that only the tool's exit was cut
        done_at=$(grep -o '\[ *[0-9]*%\]' "$log" | tail -1 | tr -d '[] ')
        if [ -n "$result" ]; then result="$result (the tool cut while exiting)"
        else result="cut at ${done_at:-0%} of the file's tests"; fi
      fi
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
      echo "| $tool | $f | ${result:-see log} | ${summary:-none printed} | $rc | $(( $(date +%s) - t0 )) |" | tee -a "$table"
    done
  done
fi
bench_rc=0
for b in ${RAWOPS_BENCH:-$(cd bench && ls bench_*.py | sed "s/^bench_//; s/\.py$//")}; do
  [ "$b" = none ] && continue
  if [ "$(left)" -lt 15 ]; then echo "bench_$b: not run (RAWOPS_DEADLINE_S)"; bench_rc=1; continue; fi
  echo "== bench_$b ($(left) s left)"
  timeout "$(left)" python3 "bench/bench_$b.py" --out "$OUT" 2>&1 | tail -40 || bench_rc=1
done
echo "tests exit code: $tests_rc, benches: $bench_rc"
if [ "$OUT" != "$FINAL_OUT" ]; then
  mkdir -p "$FINAL_OUT"
  tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . && cp "$LOG" "$FINAL_OUT/round.log"
fi
exit $(( tests_rc | bench_rc ))
