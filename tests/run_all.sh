#!/bin/sh
# Runs every test suite that needs no GPU, even when one fails, and prints a
# closing line that CI can read: "N passed, M failed" summed over the suites.
# Usage: sh tests/run_all.sh [make]
MAKE_CMD=${1:-make}
total_pass=0
total_fail=0
failed_suites=""
log_dir=build/test-logs
mkdir -p "$log_dir"

run_suite() { # name, make target
    name=$1
    target=$2
    log="$log_dir/$name.log"
    echo "=== $name"
    $MAKE_CMD --no-print-directory "$target" >"$log" 2>&1
    rc=$?
    grep -E "^(FAIL|    )|passed|failed|error" "$log" | tail -40
    # C runners print "N passed, M failed"; pytest prints "N passed" and/or "M failed".
    p=$(grep -oE "[0-9]+ passed" "$log" | tail -1 | grep -oE "[0-9]+")
    f=$(grep -oE "[0-9]+ failed" "$log" | tail -1 | grep -oE "[0-9]+")
    e=$(grep -oE "[0-9]+ errors?" "$log" | tail -1 | grep -oE "[0-9]+")
    p=${p:-0}
    f=${f:-0}
    e=${e:-0}
    f=$((f + e))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1 # it failed before any test could report (build error, crash)
        echo "    $name: exit status $rc; see $log"
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    [ "$f" -ne 0 ] && failed_suites="$failed_suites $name"
    echo "    $name: $p passed, $f failed"
}

run_suite c-tests test-c
run_suite asan-ubsan test-asan
run_suite cli test-cli
run_suite python test-python
run_suite install test-install
run_suite fuzz test-fuzz
run_suite fuzz-python test-fuzz-python

echo "=== summary"
[ -n "$failed_suites" ] && echo "failing suites:$failed_suites"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
