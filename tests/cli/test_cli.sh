#!/bin/sh
# CLI tests for build/sparsek: info, run on the CPU backend (every pattern,
# every dtype, GQA, tails), --json output, progress lines, and every kind of
# bad flag; first the check's own test (build/test_cli_check: corrupted
# outputs must fail the check), whose counts join this script's.
# Small shapes: the whole script takes seconds.
#
# Usage: sh tests/cli/test_cli.sh build/sparsek [build/test_cli_check]
# Prints one line per test and a closing "N passed, M failed"; exits
# non-zero when any test failed.

BIN=${1:-build/sparsek}
CHECK_TEST=${2:-$(dirname "$BIN")/test_cli_check}
PYTHON=${PYTHON:-python3}
pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sk_cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out
err=$tmp/err

# A tiny CPU workload shared by most tests.
TINY="--backend cpu --batch 1 --heads 2 --seq 256 --dim 32 --block 64"

ok() {
    pass=$((pass + 1))
    echo "PASS $1"
}

bad() { # name, reason
    fail=$((fail + 1))
    echo "FAIL $1: $2"
    sed 's/^/    stdout: /' "$out" | head -20
    sed 's/^/    stderr: /' "$err" | head -20
}

# run_cmd args...: runs the CLI, stdout to $out, stderr to $err, status in $rc.
run_cmd() {
    "$BIN" "$@" >"$out" 2>"$err"
    rc=$?
}

# expect_ok name args...: exit 0 and "result     PASS" in the text output.
expect_ok() {
    name=$1
    shift
    run_cmd "$@"
    if [ "$rc" -ne 0 ]; then
        bad "$name" "exit status $rc, expected 0"
    elif ! grep -q "^result  *PASS" "$out"; then
        bad "$name" "no PASS line"
    else
        ok "$name"
    fi
}

# expect_usage name args...: exit 2 and "usage" on stderr, nothing on stdout.
expect_usage() {
    name=$1
    shift
    run_cmd "$@"
    if [ "$rc" -ne 2 ]; then
        bad "$name" "exit status $rc, expected 2"
    elif ! grep -q "usage" "$err"; then
        bad "$name" "no usage message on stderr"
    elif [ -s "$out" ]; then
        bad "$name" "unexpected output on stdout"
    else
        ok "$name"
    fi
}

# json_ok python-expression-on-d args...: runs with --json; succeeds when the
# exit status is 0 and stdout parses as one JSON object for which the
# expression holds; else says why in $why.
json_ok() {
    expr=$1
    shift
    run_cmd "$@" --json
    if [ "$rc" -ne 0 ]; then
        why="exit status $rc, expected 0"
        return 1
    fi
    if ! "$PYTHON" -c "
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if ($expr) else 1)
" <"$out" 2>>"$err"; then
        why="JSON did not parse or did not satisfy: $expr"
        return 1
    fi
}

# json_check name python-expression-on-d args...
json_check() {
    name=$1
    expr=$2
    shift 2
    if json_ok "$expr" "$@"; then ok "$name"; else bad "$name" "$why"; fi
}

if [ ! -x "$BIN" ]; then
    echo "FAIL setup: $BIN is not an executable"
    echo "0 passed, 1 failed"
    exit 1
fi

# --- the check fails on a wrong output (tests/cli/test_check.c) ---------------
if [ -x "$CHECK_TEST" ]; then
    "$CHECK_TEST" >"$out" 2>"$err"
    rc=$?
    grep -E "^(PASS|FAIL) " "$out"
    p=$(grep -oE "^[0-9]+ passed" "$out" | grep -oE "[0-9]+")
    f=$(grep -oE "[0-9]+ failed" "$out" | grep -oE "[0-9]+")
    pass=$((pass + ${p:-0}))
    fail=$((fail + ${f:-0}))
    if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then bad "$CHECK_TEST" "exit status $rc"; fi
else
    fail=$((fail + 1))
    echo "FAIL setup: $CHECK_TEST is not an executable"
fi

# --- help and commands -------------------------------------------------------
run_cmd --help
if [ "$rc" -eq 0 ] && grep -q "usage" "$out" && grep -q -- "--check-rows" "$out"; then
    ok "--help prints the usage, exit 0"
else
    bad "--help prints the usage, exit 0" "status $rc"
fi

run_cmd run --help
if [ "$rc" -eq 0 ] && grep -q -- "--pattern" "$out"; then
    ok "run --help, exit 0"
else
    bad "run --help, exit 0" "status $rc"
fi

expect_usage "no command: usage, exit 2"
expect_usage "unknown command" frobnicate

# --- info --------------------------------------------------------------------
run_cmd info
if [ "$rc" -eq 0 ] && grep -q "^sparsek [0-9]" "$out" && grep -q "^build" "$out" &&
    grep -q -E "^GPU" "$out"; then
    ok "info: version, build, GPUs"
else
    bad "info: version, build, GPUs" "status $rc"
fi
no_gpu=0
grep -q "no GPU found" "$out" && no_gpu=1

json_check "info --json parses" "'version' in d and 'build' in d and isinstance(d['gpus'], list)" info

# --- run on the CPU ----------------------------------------------------------
expect_ok "run, CPU backend, tiny shape" run $TINY
expect_ok "run, default pattern at 10% density" run $TINY --density 0.1

# Auto picks CUDA when there is a GPU; D=64 suits both backends.
expect_ok "run --backend auto, small shape" run --batch 1 --heads 2 --seq 256 --dim 64
if [ "$no_gpu" -eq 1 ]; then
    run_cmd run --batch 1 --heads 2 --seq 256 --dim 64
    if grep -q "CPU" "$out" && grep -q "no GPU found" "$out"; then
        ok "auto without a GPU says it runs on the CPU backend"
    else
        bad "auto without a GPU says it runs on the CPU backend" "no note"
    fi
    run_cmd run --backend cuda --seq 256 --dim 64
    if [ "$rc" -eq 1 ] && grep -q "^sparsek: " "$err"; then
        ok "--backend cuda without a GPU: error, exit 1"
    else
        bad "--backend cuda without a GPU: error, exit 1" "status $rc"
    fi
fi

for p in dense causal window sinks strided random topk; do
    json_check "pattern $p" \
        "d['pattern'] == '$p' and d['check_passed'] is True and 0 < d['density'] <= 1" \
        run $TINY --pattern $p
done
expect_ok "pattern topk with sinks, local window and causal" \
    run $TINY --pattern topk --sinks 64 --window 128 --causal

# topk: the selection from the workload's own Q and K (sk_attention_topk).
json_check "topk: default k = round(density * col blocks), real count, timings" \
    "d['pattern'] == 'topk' and d['check_passed'] is True and d['topk_k'] == 1 and d['layout_nnz'] == 8 and d['layout_capacity'] == 8 and d['blocks_selected'] == 8 and abs(d['density'] - 0.25) < 1e-9 and d['attention_only_ms'] > 0 and abs(d['selection_ms'] - (d['time_ms'] - d['attention_only_ms'])) < 1e-3" \
    run $TINY --pattern topk
json_check "topk: --topk-k, --sinks-blocks, --local-blocks, causal" \
    "d['check_passed'] is True and (d['topk_k'], d['sink_blocks'], d['local_blocks']) == (1, 1, 1) and d['causal'] is True and d['layout_nnz'] == 18 and d['blocks_selected'] == 18" \
    run $TINY --pattern topk --topk-k 1 --sinks-blocks 1 --local-blocks 1 --causal
json_check "topk: --sinks / --window still set the forced blocks (tokens)" \
    "d['sink_blocks'] == 1 and d['local_blocks'] == 2 and d['check_passed'] is True" \
    run $TINY --pattern topk --sinks 10 --window 100 --causal
json_check "topk: per KV head with GQA, the group shares the layout" \
    "d['per_kv_head'] is True and d['check_passed'] is True and d['blocks_selected'] == 2 * d['layout_nnz'] and d['layout_nnz'] == 2 * 4 * 2" \
    run --backend cpu --batch 1 --heads 4 --heads-kv 2 --seq 256 --dim 32 --block 64 --pattern topk --topk-k 2 --per-kv-head --check-rows 4
json_check "topk: k above the key blocks takes every block (density 1)" \
    "d['density'] == 1 and d['check_passed'] is True" run $TINY --pattern topk --topk-k 9
expect_ok "topk: tails, Sq != Sk, 64 x 128 blocks, batch 2, bf16" \
    run --backend cpu --batch 2 --heads 2 --seq-q 200 --seq-k 333 --dim 40 --block-q 64 \
    --block-k 128 --pattern topk --topk-k 1 --local-blocks 1 --causal --dtype bf16 --check-rows 4
json_check "topk: f32, several iterations" "d['dtype'] == 'f32' and d['iters'] == 2 and d['check_passed'] is True" \
    run $TINY --pattern topk --dtype f32 --iters 2 --warmup 1
run_cmd run $TINY --pattern topk --topk-k 2
if [ "$rc" -eq 0 ] && grep -q "^attention .* ms alone" "$out" && grep -q "^selection .* ms" "$out" &&
    grep -q "^layout .* capacity" "$out" && grep -q "sk_attention_topk" "$out"; then
    ok "topk: text report has the attention, selection and layout lines"
else
    bad "topk: text report has the attention, selection and layout lines" "status $rc"
fi
expect_ok "pattern window without the causal mask" run $TINY --pattern window --window 100 --causal off
expect_ok "pattern strided, causal, stride 2" run $TINY --pattern strided --stride 2 --causal=on
expect_ok "random with the causal mask" run $TINY --causal

json_check "dtype f32" "d['dtype'] == 'f32' and d['check_passed'] is True" run $TINY --dtype f32
json_check "dtype bf16" "d['dtype'] == 'bf16' and d['check_passed'] is True" run $TINY --dtype bf16
expect_ok "dtype bf16, text" run $TINY --dtype bf16
expect_ok "GQA, batch 2, tails, Sq != Sk, 64 x 128 blocks" \
    run --backend cpu --batch 2 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --dim 40 \
    --block-q 64 --block-k 128 --pattern causal --check-rows 8
expect_ok "several iterations and warm-up" run $TINY --iters 3 --warmup 1

# --- FP8 (--dtype e4m3): bf16 values quantized by sk_quantize_e4m3 ------------
json_check "dtype e4m3: the codes, V rows, O bf16, checked by the FP8 rule" \
    "d['dtype'] == 'e4m3' and d['v_layout'] == 'rows' and d['out_dtype'] == 'bf16' and d['tolerance'] == 'fp8 yardstick rule' and d['check_passed'] is True and 0 < d['max_abs_err'] < 0.05" \
    run $TINY --dtype e4m3
FP8_GQA="run --backend cpu --batch 2 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --dim 64 --block-q 64 --block-k 128 --pattern causal --dtype e4m3 --check-rows 8"
json_check "dtype e4m3, GQA, batch 2, tails, Sq != Sk, 64 x 128 blocks, causal" \
    "d['check_passed'] is True and d['checked_heads'] == 8" $FP8_GQA
cp "$out" "$tmp/fp8_rows.json"
json_check "dtype e4m3 --v-layout vt: V^T from the quantizer, the same errors as rows V" \
    "d['v_layout'] == 'vt' and d['check_passed'] is True and (d['max_abs_err'], d['max_abs_err_lse']) == (lambda r: (r['max_abs_err'], r['max_abs_err_lse']))(json.load(open('$tmp/fp8_rows.json')))" \
    $FP8_GQA --v-layout vt
run_cmd run $TINY --dtype e4m3 --v-layout vt
if [ "$rc" -eq 0 ] && grep -q "^dtype  *e4m3 .*V as V^T; O bf16" "$out" && grep -q "rule: FP8" "$out" &&
    grep -q "^result  *PASS" "$out"; then
    ok "dtype e4m3, text: the dtype line and the FP8 rule"
else
    bad "dtype e4m3, text: the dtype line and the FP8 rule" "status $rc"
fi
if [ "$no_gpu" -eq 0 ]; then # the library's refusals pass through (exit 1)
    run_cmd run --backend sm80 --batch 1 --heads 2 --seq 256 --dim 64 --dtype e4m3
    if [ "$rc" -eq 1 ] && grep -q "^sparsek: sk_attention_.*SK_STATUS_NOT_SUPPORTED" "$err"; then
        ok "dtype e4m3 on the portable kernel (sm80): the library's NOT_SUPPORTED, exit 1"
    else
        bad "dtype e4m3 on the portable kernel (sm80): the library's NOT_SUPPORTED, exit 1" "status $rc"
    fi
    run_cmd run --backend cuda --batch 1 --heads 2 --seq 256 --dim 32 --dtype e4m3
    if [ "$rc" -eq 1 ] && grep -q "^sparsek: sk_attention_.*SK_STATUS_NOT_SUPPORTED" "$err"; then
        ok "dtype e4m3 with head_dim 32 on CUDA: the library's NOT_SUPPORTED, exit 1"
    else
        bad "dtype e4m3 with head_dim 32 on CUDA: the library's NOT_SUPPORTED, exit 1" "status $rc"
    fi
    # Blocks of 64 run on the FP8 kernel (the _k64 and _pair kernels).
    run_cmd run --backend cuda --batch 1 --heads 2 --seq 256 --dim 64 --block 64 --dtype e4m3
    if [ "$rc" -eq 0 ] && grep -q "^result  *PASS" "$out"; then
        ok "dtype e4m3 with 64 x 64 blocks on CUDA: runs, its check passes"
    else
        bad "dtype e4m3 with 64 x 64 blocks on CUDA: runs, its check passes" "status $rc"
    fi
fi

# The text report carries every figure.
run_cmd run $TINY
missing=""
for key in "^backend" "^shape" "^dtype" "^blocks" "^pattern" "^density" "^time .* ms" \
    "actual" "dense-equivalent" "^per head .* us" "^max error"; do
    grep -q "$key" "$out" || missing="$missing '$key'"
done
if [ -z "$missing" ]; then ok "text report has every field"; else bad "text report has every field" "missing$missing"; fi

# --- JSON --------------------------------------------------------------------
KEYS="['version','backend','device','batch','heads_q','heads_kv','seq_q','seq_k','head_dim','dtype','block_q','block_k','pattern','density','causal','seed','iters','time_ms','tflops_actual','tflops_dense_equiv','us_per_head','max_abs_err','check_passed']"
json_check "--json: one object with every key" "all(k in d for k in $KEYS)" run $TINY
json_check "--json: values" \
    "d['backend'] == 'cpu' and d['batch'] == 1 and d['heads_q'] == 2 and d['seq_q'] == 256 and d['head_dim'] == 32 and d['dtype'] == 'f16' and d['block_q'] == 64 and d['pattern'] == 'random' and d['check_passed'] is True and d['max_abs_err'] < 0.02 and d['time_ms'] > 0" \
    run $TINY
json_check "--json: density = selected / total, k = round(density * col blocks)" \
    "abs(d['density'] - 0.5) < 1e-9 and d['blocks_selected'] * 2 == d['blocks_total']" \
    run $TINY --density 0.5
json_check "--json: dense pattern, density 1, dense TFLOPS = actual" \
    "d['density'] == 1 and abs(d['tflops_actual'] - d['tflops_dense_equiv']) <= 1e-9 * d['tflops_actual']" \
    run $TINY --pattern dense
json_check "--json: causal default on for window, off for random" \
    "d['causal'] is True" run $TINY --pattern window
json_check "--json: --check-rows 0 skips the check" \
    "d['check_passed'] is None and d['max_abs_err'] is None" run $TINY --check-rows 0
json_check "--json: the seed is reported" "d['seed'] == 42" run $TINY --seed 42

json_check "--json: the CPU check compares with fp64, not with the CPU backend (error > 0)" \
    "d['backend'] == 'cpu' and d['max_abs_err'] > 0 and d['max_abs_err_lse'] > 0" run $TINY
json_check "--json: median, minimum and plan times" \
    "d['iters'] == 5 and 0 < d['time_min_ms'] <= d['time_ms'] and d['plan_ms'] >= 0" \
    run $TINY --iters 5
json_check "--json: energy and power are null on the CPU backend (not measured)" \
    "'energy_j_per_call' in d and d['energy_j_per_call'] is None and d['power_w'] is None" run $TINY

# --- progress lines on stderr ------------------------------------------------
# progress_check name grep-pattern-on-stderr (empty: stderr must be empty)
# args...: the run's stdout must still be one JSON object.
progress_check() {
    name=$1
    pattern=$2
    shift 2
    if ! json_ok True "$@"; then
        bad "$name" "$why"
    elif [ -z "$pattern" ] && [ -s "$err" ]; then
        bad "$name" "unexpected output on stderr"
    elif [ -n "$pattern" ] && ! grep -q -E "$pattern" "$err"; then
        bad "$name" "no '$pattern' on stderr"
    else
        ok "$name"
    fi
}
progress_check "a quick run prints no progress" "" run $TINY
progress_check "--progress: built, timed, checked, on stderr only" \
    "^sparsek \[ *[0-9.]+ s\] workload built" run $TINY --progress
for line in "expected to take" "call 1 of 1 done" "checking 2 heads" "check done .*: pass"; do
    grep -q "$line" "$err" || bad "--progress: '$line'" "missing"
done
progress_check "--progress with topk" "sk_attention_topk: call 1 of 1" run $TINY --pattern topk --progress
progress_check "--progress: one line per call at most 4 a second" "call 50 of 50 done" \
    run $TINY --progress --iters 50
n=$(grep -c "call [0-9]* of 50 done" "$err")
if [ "$n" -ge 1 ] && [ "$n" -le 6 ]; then ok "--progress: $n call lines for 50 quick calls"; else
    bad "--progress: at most 4 call lines a second" "$n lines"; fi
# A run expected to pass 2 s (one thread: 6 calls of about 0.5 s estimated
# each) prints progress unasked; --quiet silences it.
LONG="run --backend cpu --batch 1 --heads 2 --seq 4096 --dim 64 --iters 6 --check-rows 0"
OMP_NUM_THREADS=1 progress_check "a run expected to take over 2 s prints progress unasked" \
    "expected to take about [0-9.]+ s" $LONG
OMP_NUM_THREADS=1 progress_check "--quiet silences it" "" $LONG --quiet

# --- bad flags: usage on stderr, exit 2 ----------------------------------------
expect_usage "unknown flag" run --frobnicate
expect_usage "non-numeric --dim abc" run --dim abc
expect_usage "--dim 0" run --dim 0
expect_usage "--density 2" run --density 2
expect_usage "--density 0" run --density 0
expect_usage "--density nan" run --density nan
expect_usage "--pattern nope" run --pattern nope
expect_usage "--dtype f8" run --dtype f8
expect_usage "--backend tpu" run --backend tpu
expect_usage "missing value at the end" run --dim
expect_usage "missing value before a flag" run --seq --dim 64
expect_usage "--block 96" run --block 96
expect_usage "--block-k 256" run --block-k 256
expect_usage "--heads-kv must divide --heads" run --backend cpu --heads 6 --heads-kv 4
expect_usage "negative --seed" run --seed -1
expect_usage "--iters 0" run --iters 0
expect_usage "trailing garbage 12x" run --seq 12x
expect_usage "stray argument" run extra
expect_usage "--causal with a bad value" run --causal=maybe
expect_usage "--json takes no value" run --json=1
expect_usage "--quiet takes no value" run --quiet=yes
expect_usage "--quiet and --progress together" run --quiet --progress
expect_usage "info: unknown argument" info --bogus
expect_usage "--topk-k -1" run --pattern topk --topk-k -1
expect_usage "--topk-k abc" run --pattern topk --topk-k abc
expect_usage "--local-blocks -2" run --pattern topk --local-blocks -2
expect_usage "--topk-k is for the topk pattern" run --backend cpu --pattern random --topk-k 2
expect_usage "--sinks-blocks is for the topk pattern" run --backend cpu --pattern causal --sinks-blocks 1
expect_usage "--per-kv-head is for the topk pattern" run --backend cpu --per-kv-head
expect_usage "--per-kv-head takes no value" run --backend cpu --pattern topk --per-kv-head=1
expect_usage "topk: --sinks-blocks and --sinks together" run --backend cpu --pattern topk --sinks-blocks 1 --sinks 64
expect_usage "topk: --local-blocks and --window together" run --backend cpu --pattern topk --local-blocks 1 --window 64
expect_usage "topk: nothing to select" run --backend cpu --pattern topk --topk-k 0
expect_usage "--v-layout is for --dtype e4m3" run --backend cpu --v-layout vt
expect_usage "--v-layout nope" run --backend cpu --dtype e4m3 --v-layout nope
expect_usage "--dtype e4m3 with --pattern topk" run --backend cpu --dtype e4m3 --pattern topk

# --- numbers derived from the flags stay in range (issue 27) -----------------
# strided's default stride is round(1 / density): a density so small that the
# stride passes --stride's maximum is a usage error naming both (before:
# 1e-30 ran dense and reported density 1; 2.5e-10 failed with a negative
# int32 stride from the library).
for d in 1e-30 2.5e-10 5.9e-8; do
    name="strided: --density $d gives a stride past --stride's maximum: usage, exit 2"
    run_cmd run $TINY --pattern strided --density $d
    if [ "$rc" -eq 2 ] && grep -q "above --stride's maximum 16777216" "$err" && grep -q "usage" "$err" &&
        [ ! -s "$out" ]; then ok "$name"; else bad "$name" "status $rc"; fi
done
json_check "strided: --density 1e-7 gives stride 10000000 (in range)" \
    "'stride 10000000 blocks' in d['pattern_detail'] and d['check_passed'] is True" \
    run $TINY --pattern strided --density 1e-7
json_check "strided: --stride given, a tiny --density sets no stride" \
    "'stride 2 blocks' in d['pattern_detail'] and d['check_passed'] is True" \
    run $TINY --pattern strided --density 1e-30 --stride 2
# Sizes whose products pass 2^63 stop before any estimate or count is made
# from them (before: the expected time was printed from a wrapped int64).
for dim in 1024 1; do
    name="sizes past 2^63 (--dim $dim): error before the estimate, exit 1"
    run_cmd run --backend cpu --batch 1048576 --heads 65536 --seq 4194304 --dim $dim --block 64 \
        --pattern window --window 64 --check-rows 0 --progress
    if [ "$rc" -eq 1 ] && grep -q -E "^sparsek: the (tensors are too large|workload has too many blocks)" "$err" &&
        ! grep -q "expected to take" "$err"; then ok "$name"; else bad "$name" "status $rc"; fi
done

# --- a library failure is reported with its status ---------------------------
run_cmd run --backend cpu --seq 16777216 --block 64 --dim 8 --pattern dense
if [ "$rc" -eq 1 ] && grep -q "^sparsek: sk_layout_create_dense: SK_STATUS_BAD_LAYOUT_OVERFLOW: " "$err"; then
    ok "library error: 'sparsek: <call>: <status>: <text>', exit 1"
else
    bad "library error: 'sparsek: <call>: <status>: <text>', exit 1" "status $rc"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
