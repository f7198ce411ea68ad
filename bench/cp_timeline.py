#!/usr/bin/env python3
"""cp_timeline.py - the kernel timeline of one context-parallel run per GPU,
from a CUPTI trace (bench/cupti_trace.c, which records device and stream per
kernel) of build/cp_speed.

    CUDA_INJECTION64_PATH=$PWD/build/libsk_cupti_trace.so SK_TRACE_OUT=t.csv \\
        build/cp_speed --seq 1048576 --reps 3
    python3 bench/cp_timeline.py t.csv

The last run on a device is its last kernels back to an idle gap of more than
2 ms (the bench's host barrier between runs). Prints one JSON object: per device, each
kernel of that run (short name, stream, start and duration in microseconds
from the run's first kernel) and the run's span.
"""
import csv
import json
import sys

GAP_NS = 2_000_000


def short(name):
    for plain in ("sk_cp_copy_kernel", "sk_cp_merge_kernel", "sk_cp_lse_copy_kernel",
                  "sk_attention_sm90_kernel", "sk_attention_sm80", "nccl", "sk_schedule"):
        if plain.lower() in name.lower():
            return plain
    return name[:48]


def main(path):
    kernels = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] != "kernel":
                continue
            kernels.setdefault(row["device"], []).append(
                (int(row["start_ns"]), int(row["end_ns"]), short(row["name"]), row["stream"]))
    out = {}
    for dev, ks in sorted(kernels.items()):
        ks.sort()
        # The last run: walk back from the last kernel while the device was
        # busy (runs are separated by the bench's host barrier, > 2 ms idle).
        i = len(ks) - 1
        busy_until = max(k[1] for k in ks[:i]) if i else 0
        while i > 0 and ks[i][0] - busy_until < GAP_NS:
            i -= 1
            busy_until = max(k[1] for k in ks[:i]) if i else 0
        run = ks[i:]
        t0 = run[0][0]
        out[dev] = {
            "span_us": round((max(k[1] for k in run) - t0) / 1e3, 1),
            "kernels": [[n, s, round((a - t0) / 1e3, 1), round((b - a) / 1e3, 1)]
                        for a, b, n, s in run],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
