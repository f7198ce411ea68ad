#!/bin/bash
# One device call: correctness (every variant), sanitizers (the library
# variant), timings (variants interleaved), clocks, ncu, SASS evidence.
# Logs go to $OUT (at most 8 files come back).
# Usage: dev/hopper/gpu_run.sh [bench-filter] ; NCU_CASE=name adds an ncu profile.
B=build/dev_hopper
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv > $OUT/gpu.txt 2>&1
timeout 200 $B/harness check > $OUT/check.log 2>&1
rc=$?
grep -E "FAIL|check:|HANG|error" $OUT/check.log | head -40
echo "check rc=$rc"
{
  echo "== memcheck"; SK_VARIANT_ONLY=lib timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $B/harness check quick 2>&1 | tail -12
  echo "== synccheck"; SK_VARIANT_ONLY=lib timeout 90 compute-sanitizer --tool synccheck --print-limit 20 $B/harness check one_tile 2>&1 | tail -6
  echo "== racecheck"; SK_VARIANT_ONLY=lib SK_HARNESS_TIMEOUT=100 timeout 200 compute-sanitizer --tool racecheck --print-limit 20 $B/harness check one_tile 2>&1 | tail -8
} >> $OUT/check.log 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|HANG|==" $OUT/check.log | tail -8
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 250 > $OUT/clocks.log 2>&1 &
smi=$!
SK_BENCH_JSON=$OUT/bench.json timeout ${BENCH_TIMEOUT:-300} $B/harness bench $1 > $OUT/bench.log 2>&1
echo "bench rc=$?"
kill $smi
cat $OUT/bench.log
awk -F', ' '{c[$2]++} END {for (k in c) print k, c[k]}' $OUT/clocks.log | sort -n | tail -12
if [ -n "$NCU_CASE" ]; then
  for v in ${NCU_VARIANTS:-lib}; do
    SK_VARIANT_ONLY=$v SK_BENCH_REPS=1 timeout 200 ncu --clock-control none -k regex:sk_attention_sm90 \
     --launch-skip 1 --launch-count 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" \
     $B/harness bench $NCU_CASE > $OUT/ncu_$v.log 2>&1
    echo "ncu $v rc=$?"; grep -E "^\s+(sm|smsp|lts|dram|gpu)__" $OUT/ncu_$v.log | awk '$NF+0 > 0.05 || /hmma|xu|fma|alu|issue_active|per_second|inst_executed|hit|dram|duration/' | sed 's/smsp__average_warps_issue_stalled_//'
  done
fi
cuobjdump --dump-sass $B/fwd_sm90.o > /tmp/sass.txt 2>&1
{ echo "HGMMA count: $(grep -c HGMMA /tmp/sass.txt)"; echo "LDL/STL: $(grep -c -E 'LDL|STL' /tmp/sass.txt)";
  grep -o -E "USETMAXREG[^;]*" /tmp/sass.txt | sort | uniq -c; } >> $OUT/gpu.txt
tail -4 $OUT/gpu.txt
