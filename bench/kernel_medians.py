#!/usr/bin/env python3
"""kernel_medians.py - per-kernel device times from a CUPTI trace
(bench/cupti_trace.c) of any program: for each kernel name, how many ran,
the median and the minimum duration in microseconds; with --split NAME, a
kernel that runs several times per step (the decode selection's score and
select kernels with two levels) is reported per position within the step,
a step starting at each launch of NAME.

    cc -O2 -shared -fPIC -I/usr/local/cuda/include -o build/libsk_cupti_trace.so \\
        bench/cupti_trace.c -L/usr/local/cuda/lib64 -lcupti
    CUDA_INJECTION64_PATH=$PWD/build/libsk_cupti_trace.so SK_TRACE_OUT=t.csv \\
        build/decode_select_speed --reps 20 --group-blocks 16 --top-groups 16
    python3 bench/kernel_medians.py t.csv --split sk_dsel_place_kernel

Rows of the CSV: kind, name, start_ns, end_ns, ... (kernel rows only are
read). With --split, a step is the kernels from just after one launch of
NAME to the next one inclusive; each kernel is keyed by its name and its
rank among the step's kernels of that name, and the step's span (first
start to last end) and busy time are reported too.
"""
import csv
import statistics
import sys


def kernels(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if len(r) >= 4 and r[0] == "kernel":
                rows.append((r[1], int(r[2]), int(r[3])))
    rows.sort(key=lambda k: k[1])
    return rows


def report(times):
    for name, us in sorted(times.items()):
        print(f"  {name[:70]:70s} n={len(us):5d} med={statistics.median(us):9.2f} us "
              f"min={min(us):9.2f}")


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    rows = kernels(argv[0])
    split = argv[argv.index("--split") + 1] if "--split" in argv else None
    times = {}
    if split is None:
        for name, t0, t1 in rows:
            times.setdefault(name, []).append((t1 - t0) / 1e3)
        report(times)
        return 0
    spans, busy, step = [], [], []
    for row in rows:
        step.append(row)
        if split not in row[0]:
            continue
        seen = {}
        for name, t0, t1 in step:
            seen[name] = seen.get(name, 0) + 1
            times.setdefault(f"{name} #{seen[name]}", []).append((t1 - t0) / 1e3)
        spans.append((step[-1][2] - step[0][1]) / 1e3)
        busy.append(sum(t1 - t0 for _, t0, t1 in step) / 1e3)
        step = []
    report(times)
    if spans:
        print(f"  steps {len(spans)}: span med={statistics.median(spans):.2f} us, "
              f"kernels busy med={statistics.median(busy):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
