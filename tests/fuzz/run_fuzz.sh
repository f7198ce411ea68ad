#!/bin/sh
# Runs the libFuzzer harnesses of tests/fuzz/ (docs/reliability.md).
#
#   sh tests/fuzz/run_fuzz.sh check
#       exit 0 when $FUZZ_CC builds a libFuzzer + ASan + UBSan + OpenMP
#       program (what .ci/run installs when it does not)
#   sh tests/fuzz/run_fuzz.sh test MAKE SECONDS HARNESS...
#       make test's suite: replay every tests/fuzz/regressions/<harness>/*
#       (one check each), then run each harness for SECONDS on a scratch
#       copy of tests/fuzz/corpus/<harness> (one check each); prints
#       "N passed, M failed". Missing tools are a failure, not a skip.
#   sh tests/fuzz/run_fuzz.sh fuzz MAKE SECONDS HARNESS...
#       make fuzz: each harness for SECONDS on build/fuzz/work/<harness>
#       (seeded from the corpus, kept between runs), all at once when
#       FUZZ_PARALLEL=1; findings in build/fuzz/findings/<harness>/.
# A finding prints its reproducer; rerun it with build/fuzz/<harness> FILE
# (FZ_TRACE=1 prints every checked call).
MODE=$1
MAKE_CMD=${2:-make}
SECONDS_EACH=${3:-30}
[ $# -ge 3 ] && shift 3
FUZZ_CC=${FUZZ_CC:-clang}
FUZZ_DIR=${FUZZ_DIR:-build/fuzz}
FLAGS="-timeout=10 -rss_limit_mb=2560 -print_final_stats=1"

have_tools() {
    dir=$(mktemp -d) || return 1
    cat >"$dir/t.c" <<'PROG'
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)data;
    return (int)size * 0 + omp_get_max_threads() * 0;
}
PROG
    "$FUZZ_CC" -fsanitize=fuzzer,address,undefined -fopenmp "$dir/t.c" -o "$dir/t" >"$dir/log" 2>&1 &&
        "$dir/t" -runs=1 >>"$dir/log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && sed -n 1,5p "$dir/log" >&2
    rm -rf "$dir"
    return $rc
}

require_tools() {
    if ! have_tools; then
        echo "FAIL fuzz: '$FUZZ_CC' cannot build libFuzzer harnesses (-fsanitize=fuzzer,address,undefined" \
            "-fopenmp). On Debian: apt-get install clang libclang-rt-dev libomp-dev (.ci/run does)."
        echo "0 passed, 1 failed"
        exit 1
    fi
    mkdir -p "$FUZZ_DIR"
    if ! $MAKE_CMD --no-print-directory -s FUZZ_DIR="$FUZZ_DIR" fuzz-build >"$FUZZ_DIR/build.log" 2>&1; then
        echo "FAIL fuzz: the harnesses do not build; see $FUZZ_DIR/build.log"
        tail -5 "$FUZZ_DIR/build.log"
        echo "0 passed, 1 failed"
        exit 1
    fi
}

# The first line that says what broke, from a harness log.
why() {
    grep -m1 -E "FINDING:|runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer|ERROR: libFuzzer|SUMMARY:" "$1" |
        cut -c1-300
}

stat() { # name, log
    grep -m1 "stat::$1:" "$2" | awk '{print $2}'
}

# One timed run: harness, corpus dir (written), findings dir, log.
run_one() {
    h=$1
    work=$2
    art=$3
    log=$4
    mkdir -p "$work" "$art"
    t0=$(date +%s)
    "$FUZZ_DIR/$h" $FLAGS -max_total_time="$SECONDS_EACH" -artifact_prefix="$art/" "$work" >"$log" 2>&1
    rc=$?
    echo "elapsed: $(($(date +%s) - t0))" >>"$log"
    return $rc
}

report_one() { # harness, rc, work, log
    h=$1
    rc=$2
    n=$(stat number_of_executed_units "$4")
    rate=$(stat average_exec_per_sec "$4")
    seed=$(grep -m1 -oE "Seed: [0-9]+" "$4" | awk '{print $2}')
    files=$(ls "$3" | wc -l)
    if [ "$rc" -eq 0 ]; then
        echo "PASS $h: ${SECONDS_EACH} s, ${n:-?} executions (${rate:-?}/s), corpus $files inputs, seed ${seed:-?}"
        return 0
    fi
    unit=$(grep -m1 -oE "Test unit written to [^ ]+" "$4" | awk '{print $5}')
    echo "FAIL $h after $(grep -m1 '^elapsed:' "$4" | awk '{print $2}') s: $(why "$4")"
    echo "    reproducer: ${unit:-none written} (run: $FUZZ_DIR/$h ${unit:-FILE}); log: $4"
    return 1
}

case "$MODE" in
check)
    have_tools
    exit $?
    ;;
test)
    require_tools
    pass=0
    fail=0
    for h in "$@"; do
        for f in tests/fuzz/regressions/"$h"/*; do
            [ -f "$f" ] || continue
            log="$FUZZ_DIR/replay-$h-$(basename "$f").log"
            if "$FUZZ_DIR/$h" "$f" >"$log" 2>&1; then
                pass=$((pass + 1))
            else
                fail=$((fail + 1))
                echo "FAIL regression $f: $(why "$log")"
            fi
        done
    done
    for h in "$@"; do
        work="$FUZZ_DIR/test-work/$h"
        rm -rf "$work"
        mkdir -p "$work"
        cp tests/fuzz/corpus/"$h"/* "$work"/
        run_one "$h" "$work" "$FUZZ_DIR/findings/$h" "$FUZZ_DIR/test-$h.log"
        if report_one "$h" $? "$work" "$FUZZ_DIR/test-$h.log"; then
            pass=$((pass + 1))
        else
            fail=$((fail + 1))
        fi
    done
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    ;;
fuzz)
    require_tools
    pids=""
    for h in "$@"; do
        work="$FUZZ_DIR/work/$h"
        if [ ! -d "$work" ]; then
            mkdir -p "$work"
            cp tests/fuzz/corpus/"$h"/* "$work"/
        fi
        if [ "${FUZZ_PARALLEL:-0}" = 1 ]; then
            (run_one "$h" "$work" "$FUZZ_DIR/findings/$h" "$FUZZ_DIR/fuzz-$h.log"
             echo $? >"$FUZZ_DIR/fuzz-$h.rc") &
            pids="$pids $!"
        else
            run_one "$h" "$work" "$FUZZ_DIR/findings/$h" "$FUZZ_DIR/fuzz-$h.log"
            echo $? >"$FUZZ_DIR/fuzz-$h.rc"
        fi
    done
    [ -n "$pids" ] && wait $pids
    bad=0
    for h in "$@"; do
        report_one "$h" "$(cat "$FUZZ_DIR/fuzz-$h.rc")" "$FUZZ_DIR/work/$h" "$FUZZ_DIR/fuzz-$h.log" ||
            bad=1
    done
    exit $bad
    ;;
*)
    sed -n 2,20p "$0"
    exit 2
    ;;
esac
