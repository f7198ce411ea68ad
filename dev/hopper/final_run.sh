#!/bin/bash
# The evidence run: GPU suite on the Hopper kernel, dev harness timings (JSON),
# the CLI through the public API, SASS facts, the harness checks, then the
# sanitizers (full hazard reports). Logs to $OUT.
B=build/dev_hopper
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv; } > $OUT/gpu.txt 2>&1
timeout 120 build/sk_gpu_tests --backend sm90 > $OUT/suite.log 2>&1; echo "suite rc=$?"
grep -E "^(PASS|FAIL)|passed" $OUT/suite.log; echo "non-NOT_SUPPORTED failures: $(grep 'CHECK' $OUT/suite.log | grep -vc NOT_SUPPORTED)"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 > $OUT/clocks.log 2>&1 &
smi=$!
SK_BENCH_JSON=$OUT/bench.json timeout 120 $B/harness bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
timeout 40 build/sparsek run --backend sm90 --json > $OUT/cli.json 2>&1; echo "cli rc=$?"
kill $smi
cut -c1-100 $OUT/bench.log; head -c 400 $OUT/cli.json; echo
cuobjdump --dump-sass build/obj/cuda/attention/fwd_sm90.o > /tmp/sass.txt 2>&1
{ echo "HGMMA: $(grep -c HGMMA /tmp/sass.txt)  LDL/STL: $(grep -c -E 'LDL|STL' /tmp/sass.txt)";
  grep -o -E "USETMAXREG[^;]*" /tmp/sass.txt | sort | uniq -c; } >> $OUT/gpu.txt
SK_VARIANT_ONLY=lib timeout 60 $B/harness check > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "FAIL|check:" $OUT/check.log
export SK_VARIANT_ONLY=lib SK_HARNESS_TIMEOUT=150
{
  echo "== memcheck harness"; timeout 60 compute-sanitizer --tool memcheck $B/harness check quick 2>&1 | tail -3
  echo "== memcheck suite"; timeout 60 compute-sanitizer --tool memcheck build/sk_gpu_tests --backend sm90 --quick 2>&1 | tail -3
  echo "== synccheck harness"; timeout 60 compute-sanitizer --tool synccheck $B/harness check quick 2>&1 | tail -3
  echo "== racecheck suite"; timeout 90 compute-sanitizer --tool racecheck --print-limit 12 build/sk_gpu_tests --backend sm90 --quick 2>&1 | grep -v "^    \|CHECK" | head -80
  echo "== racecheck harness"; timeout 170 compute-sanitizer --tool racecheck --print-limit 12 $B/harness check dense_f16_d128_s1024 2>&1 | head -60
} > $OUT/sanitizer.log 2>&1
grep -E "^==|SUMMARY|check:|passed" $OUT/sanitizer.log
