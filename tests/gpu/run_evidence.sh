#!/bin/bash
# The GPU evidence run, on the lent GPU machine, from binaries built on the
# CPU machine (carry build/sk_gpu_tests, build/sparsek, build/obj/cuda;
# BUILD=build-xyz for another build directory).
# Runs the GPU suite for each CUDA backend, compute-sanitizer (memcheck,
# racecheck, synccheck) on the quick cases, the BSR GEMM tests on their own
# under the same tools with the portable kernel (sm80), and collects the
# SASS facts of the Hopper attention and GEMM kernels and the portable GEMM kernel.
# Logs go to $OUT; a summary is printed last.
set -u
OUT=${OUT:-/tmp/sk_out}
BUILD=${BUILD:-build}
mkdir -p "$OUT"
{
    date -u
    git rev-parse HEAD 2>/dev/null
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
} > "$OUT/gpu.txt" 2>&1

for b in cuda sm80 sm90; do
    timeout 200 "$BUILD/sk_gpu_tests" --backend $b > "$OUT/suite_$b.log" 2>&1
    echo "suite $b: rc=$? $(grep -E '^[0-9]+ passed' "$OUT/suite_$b.log") $(grep -E '^cases:' "$OUT/suite_$b.log") $(grep -E '^gemm cases:' "$OUT/suite_$b.log")"
done

{
    for b in sm80 sm90; do
        for tool in memcheck racecheck synccheck; do
            echo "== $tool $b"
            timeout 150 compute-sanitizer --tool $tool --print-limit 20 \
                "$BUILD/sk_gpu_tests" --backend $b --quick 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|passed" | tail -4
        done
    done
    # The BSR GEMM tests alone, each kernel: their own verdict line.
    for b in sm80 sm90; do
        for tool in memcheck racecheck synccheck; do
            echo "== $tool $b gemm"
            timeout 150 compute-sanitizer --tool $tool --print-limit 20 \
                "$BUILD/sk_gpu_tests" --backend $b --quick gemm 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|passed|^gemm cases" | tail -5
        done
    done
} > "$OUT/sanitizer.log" 2>&1
cat "$OUT/sanitizer.log"

if [ -f "$BUILD/obj/cuda/attention/fwd_sm90.o" ]; then
    cuobjdump --dump-sass "$BUILD/obj/cuda/attention/fwd_sm90.o" > /tmp/sass90.txt 2>&1
    echo "sm90 SASS: HGMMA $(grep -c HGMMA /tmp/sass90.txt), LDL/STL $(grep -c -E '\bLDL|\bSTL' /tmp/sass90.txt), $(grep -o -E 'USETMAXREG[^;]*' /tmp/sass90.txt | sort | uniq -c | tr '\n' ' ')" | tee -a "$OUT/gpu.txt"
fi

if [ -f "$BUILD/obj/cuda/gemm/gemm_sm90.o" ]; then
    cuobjdump --dump-sass "$BUILD/obj/cuda/gemm/gemm_sm90.o" > /tmp/sass_gemm90.txt 2>&1
    echo "sm90 GEMM SASS: HGMMA $(grep -c HGMMA /tmp/sass_gemm90.txt), STSM $(grep -c STSM /tmp/sass_gemm90.txt), UTMALDG $(grep -c UTMALDG /tmp/sass_gemm90.txt), UTMASTG $(grep -c UTMASTG /tmp/sass_gemm90.txt), LDL/STL $(grep -c -E '\bLDL|\bSTL' /tmp/sass_gemm90.txt)" | tee -a "$OUT/gpu.txt"
fi

if [ -f "$BUILD/obj/cuda/gemm/gemm_sm80.o" ]; then
    cuobjdump --dump-sass "$BUILD/obj/cuda/gemm/gemm_sm80.o" > /tmp/sass_gemm80.txt 2>&1
    echo "sm80 GEMM SASS: HMMA $(grep -c HMMA /tmp/sass_gemm80.txt), LDSM $(grep -c LDSM /tmp/sass_gemm80.txt), LDGSTS $(grep -c LDGSTS /tmp/sass_gemm80.txt), LDL/STL $(grep -c -E '\bLDL|\bSTL' /tmp/sass_gemm80.txt)" | tee -a "$OUT/gpu.txt"
fi

if [ -f "$BUILD/obj/cuda/attention/bwd_sm90_dkv.o" ]; then
    cuobjdump --dump-sass "$BUILD/obj/cuda/attention/bwd_sm90_dkv.o" > /tmp/sass_bkv90.txt 2>&1
    echo "sm90 backward dK/dV SASS: HGMMA $(grep -c HGMMA /tmp/sass_bkv90.txt), UTMALDG $(grep -c UTMALDG /tmp/sass_bkv90.txt), LDL/STL $(grep -c -E '\bLDL|\bSTL' /tmp/sass_bkv90.txt), $(grep -o -E 'USETMAXREG[^;]*' /tmp/sass_bkv90.txt | sort | uniq -c | tr '\n' ' ')" | tee -a "$OUT/gpu.txt"
fi
