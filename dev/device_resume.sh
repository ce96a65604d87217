#!/usr/bin/env bash
# One device round spread over several calls on the same warm machine: each call runs
# bench/device_round.sh on what the calls before it left undone, its results kept in $S
# (/tmp on the GPU machine lives as long as the machine stays warm), and packs all of them so far
# into $OUT/results.tgz. Identical commands, one after the other:
#   RAWOPS_COMMIT=<sha> RAWOPS_DEADLINE_S=540 bash dev/device_resume.sh
# Order: RESUME_TESTS_FIRST (test files run before the rest), RESUME_TESTS_ONLY (these test files and no
# others), RESUME_BENCH (the benches, in order; default every one). A test file is done once its line in
# $S/calls.log reads passed, failed, skipped or no tests ran; a bench once its .md exists. A cold machine starts over: pass RAWOPS_TESTS /
# RAWOPS_BENCH to name the rest yourself. RESUME_EXTRA: a command run once (RESUME_EXTRA_S seconds at
# most), its output in extra.log.
S=/tmp/rawops_round
mkdir -p "$S/out"
cd "$(dirname "$0")/.."
all_tests="${RESUME_TESTS_FIRST:-}"
for f in $(ls tests/test_*.py | grep -v -e test_packaging -e test_nvrtc); do
  case " $all_tests " in *" $f "*) ;; *) all_tests="$all_tests $f" ;; esac
done
[ -n "${RESUME_TESTS_ONLY:-}" ] && all_tests="$RESUME_TESTS_ONLY"
if [ -z "${RAWOPS_TESTS+set}" ]; then
  RAWOPS_TESTS=""
  for f in $all_tests; do
    grep -qE "^$f: .*(passed|failed|skipped|no tests ran)" "$S/calls.log" 2>/dev/null || RAWOPS_TESTS="$RAWOPS_TESTS $f"
  done
  [ -n "${RAWOPS_TESTS// /}" ] || RAWOPS_TESTS=tests/test_import.py
fi
if [ -z "${RAWOPS_BENCH+set}" ]; then
  gpu=$(python3 -c "import sys; sys.path.insert(0, 'bench'); from timing import gpu_key; print(gpu_key())")
  RAWOPS_BENCH=""
  for b in ${RESUME_BENCH:-$(cd bench && ls bench_*.py | sed "s/^bench_//; s/\.py$//")}; do
    [ -e "$S/out/$gpu/$b.md" ] || RAWOPS_BENCH="$RAWOPS_BENCH $b"
  done
  [ -n "${RAWOPS_BENCH// /}" ] || RAWOPS_BENCH=none
fi
[ -e "$S/built" ] && export RAWOPS_SKIP_BUILD=1
# dev/extra_next.sh (optional, untracked): a command run once, on a machine already built, before
# the round (EXTRA_NEXT_S seconds at most, output in extra_next.log); the round's deadline shrinks by
# its time.
if [ -e "$S/built" ] && [ -e dev/extra_next.sh ] && [ ! -e "$S/out/extra_next.log" ]; then
  t0=$(date +%s)
  timeout "${EXTRA_NEXT_S:-120}" bash dev/extra_next.sh >"$S/out/extra_next.log" 2>&1
  [ -n "${RAWOPS_DEADLINE_S:-}" ] && export RAWOPS_DEADLINE_S=$(( RAWOPS_DEADLINE_S - ($(date +%s) - t0) ))
fi
# Everything so far packed into $OUT/results.tgz every 20 s too: a call cut at the device's limit
# (shorter than the deadline where little device time is left) still brings back what it finished.
( while sleep 20; do tar czf "$OUT/results.part.tgz" -C "$S/out" . 2>/dev/null \
    && mv "$OUT/results.part.tgz" "$OUT/results.tgz"; done ) &
packer=$!
export RAWOPS_TESTS RAWOPS_BENCH
n=$(ls "$S"/round*.log 2>/dev/null | wc -l)
echo "call $((n + 1)): tests [$RAWOPS_TESTS] benches [$RAWOPS_BENCH]" | tee -a "$S/calls.log"
OUT="$S/out" bash bench/device_round.sh 2>&1 | tee -a "$S/calls.log"
rc=${PIPESTATUS[0]}
# RESUME_EXTRA: a command run once, after the first call's round, output in extra.log
if [ -n "${RESUME_EXTRA:-}" ] && [ ! -e "$S/out/extra.log" ]; then
  timeout "${RESUME_EXTRA_S:-90}" bash -c "$RESUME_EXTRA" >"$S/out/extra.log" 2>&1
fi
grep -q "^build for\|build skipped" "$S/out/round.log" && touch "$S/built"
cp "$S/out/round.log" "$S/round$((n + 1)).log"
cp "$S"/round*.log "$S/calls.log" "$S/out/" 2>/dev/null
kill "$packer" 2>/dev/null
wait "$packer" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$S/out" .
cp "$S/calls.log" "$OUT/calls.log"
exit "$rc"
