#!/bin/bash
# Step 9's device call (docs/perf/hopper.md): everything from binaries built
# on the CPU machine into build/hopper_run/ (carried): harness checks of every
# variant, timings with N(0,1) inputs (variants interleaved launch by launch,
# median of SK_BENCH_REPS), the GPU suite and the sanitizers on the library
# build, the CLI (public API) with the library and with the committed kernel
# (sparsek_step8), SASS facts. At most 8 logs to $OUT.
# Usage: dev/hopper/step9_run.sh [bench-filter (substrings, comma-separated)]
# Env: REPS, CHECK_FILTER, NO_SUITE, NO_CLI, CLI_QUICK (one lib/step8 pair).
R=build/hopper_run
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
t0=$(date +%s)
ts() { echo "[t+$(($(date +%s) - t0))s] $*"; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  if command -v cuobjdump > /dev/null; then
    for o in $R/attention_sm90.o $R/step8/attention_sm90.o; do
      cuobjdump --dump-sass $o > /tmp/sass.txt 2>&1
      echo "$o: HGMMA $(grep -c HGMMA /tmp/sass.txt), LDL/STL $(grep -c -E '\bLDL|\bSTL' /tmp/sass.txt)," \
        "$(grep -o -E 'USETMAXREG[^;]*' /tmp/sass.txt | sort | uniq -c | tr '\n' ' ')"
    done
  fi
} > $OUT/gpu.txt 2>&1

ts "harness check (all variants)"
SK_HARNESS_TIMEOUT=20 timeout ${CHECK_TIMEOUT:-60} $R/harness check ${CHECK_FILTER:-} > $OUT/check.log 2>&1
echo "check rc=$? ok=$(grep -c ' ok ' $OUT/check.log) FAIL=$(grep -c FAIL $OUT/check.log)"
grep -E "FAIL|HANG|error|failed" $OUT/check.log | head -12

ts "bench"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 500 > $OUT/clocks.log 2>&1 &
smi=$!
SK_BENCH_RANDN=1 SK_HARNESS_TIMEOUT=20 SK_BENCH_REPS=${REPS:-21} SK_BENCH_JSON=$OUT/bench.jsonl \
  timeout ${BENCH_TIMEOUT:-200} $R/harness bench $1 > $OUT/bench.log 2>&1
echo "bench rc=$?"
kill $smi
cut -c1-118 $OUT/bench.log
awk -F', ' '{c[$2]++} END {for (k in c) print k, c[k]}' $OUT/clocks.log | sort -n | tail -6 | tr '\n' ';'
echo

if [ -z "$NO_SUITE" ]; then
  ts "suite"
  timeout 120 $R/sk_gpu_tests --backend sm90 > $OUT/suite.log 2>&1
  echo "suite rc=$? $(grep -E '^[0-9]+ passed' $OUT/suite.log) $(grep -E '^cases:' $OUT/suite.log)"
  ts "sanitizers"
  {
    echo "== racecheck suite --quick"
    timeout 150 compute-sanitizer --tool racecheck --print-limit 12 $R/sk_gpu_tests --backend sm90 --quick 2>&1 |
      grep -v "^    " | tail -40
    echo "== memcheck suite --quick"
    timeout 90 compute-sanitizer --tool memcheck --print-limit 12 $R/sk_gpu_tests --backend sm90 --quick 2>&1 | tail -6
  } > $OUT/sanitizer.log 2>&1
  grep -E "^==|SUMMARY|passed|cases:" $OUT/sanitizer.log
fi

if [ -z "$NO_CLI" ]; then
  ts "cli"
  {
    pats=("--pattern random --density 0.25" "--pattern window --window 1024")
    [ -n "$CLI_QUICK" ] && pats=("--pattern random --density 0.25")
    for a in "${pats[@]}"; do
      bins="sparsek sparsek_step8 sparsek_step8 sparsek"
      case "$a" in *random*) bins="$bins sparsek sparsek_step8" ;; esac
      [ -n "$CLI_QUICK" ] && bins="sparsek sparsek_step8"
      for bin in $bins; do
        echo "== $bin $a"
        timeout 40 $R/$bin run --json --backend sm90 --seq 4096 --batch 16 --heads 96 --dim 128 \
          --check-rows 1 $a > /tmp/cli.json 2>&1
        echo "rc=$?"
        cat /tmp/cli.json
        echo "-- $bin $a: $(grep -o -E '"(time_ms|tflops_actual|density|check_passed)": [^,}]*' /tmp/cli.json | tr '\n' ' ')"
      done
    done
  } > $OUT/cli.log 2>&1
  grep -E '^-- ' $OUT/cli.log
fi
ts done
