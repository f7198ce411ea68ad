#!/bin/bash
# sm80 v7 run 2: base (HEAD = v6), B (= final source, v7), C (B + per-tile
# K/V offsets). Seed rounds alternate; full table for B and C; then suite
# on C and sanitizers on B and C, concurrently.
set -u
V=build/variants
T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
el "seed rounds"
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="base B C"; else order="C B base"; fi
  for v in $order; do
    timeout 25 $V/sk_gpu_tests_$v --backend sm80 --bench seed_f16 > $OUT/tmp.txt 2>&1 || { echo "$v round $r rc=$?"; tail -3 $OUT/tmp.txt; }
    grep '^{' $OUT/tmp.txt | sed "s/^{/{\"variant\": \"$v\", \"round\": $r, /" >> $OUT/sm80_ab.jsonl
  done
done
el "full tables"
for v in C B; do
  timeout 45 $V/sk_gpu_tests_$v --backend sm80 --bench > $OUT/tmp.txt 2>&1 || echo "$v full rc=$?"
  grep '^{' $OUT/tmp.txt | sed "s/^{/{\"variant\": \"$v\", \"round\": 0, /" >> $OUT/sm80_ab.jsonl
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv >> $OUT/gpu.txt 2>&1
el "bench done"
python3 - <<'PY'
import json,os,collections
rows=[json.loads(l) for l in open(os.environ['OUT']+'/sm80_ab.jsonl')]
d=collections.defaultdict(list)
for r in rows: d[(r['name'],r['variant'])].append((r['round'],r['actual_tflops'],round(r['min_us']),r['ok']))
for k in sorted(d): print(k[0][:26], k[1], d[k])
PY
el "suite C + sanitizers B, C (concurrent)"
( timeout 120 $V/sk_gpu_tests_C --backend sm80 > $OUT/suite_C.log 2>&1; echo "rc=$?" >> $OUT/suite_C.log ) &
for v in B C; do for tool in memcheck synccheck racecheck; do
  ( timeout 130 compute-sanitizer --tool $tool --print-limit 20 $V/sk_gpu_tests_$v --backend sm80 --quick > $OUT/san_${tool}_$v.log 2>&1; echo "rc=$?" >> $OUT/san_${tool}_$v.log ) &
done; done
wait
for f in suite_C san_memcheck_B san_synccheck_B san_racecheck_B san_memcheck_C san_synccheck_C san_racecheck_C; do
  echo "== $f: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^[0-9]+ passed|^cases|rc=' $OUT/$f.log | tr '\n' ' ')"
  grep -E "^FAIL|hazard|Race reported|Invalid|Barrier" $OUT/$f.log | grep -v "RACECHECK SUMMARY" | head -4
done
rm -f $OUT/tmp.txt
el done
