#!/usr/bin/env python3
"""cp_timeline.py - the kernel timeline of one context-parallel run per GPU,
from a CUPTI trace (bench/cupti_trace.c, which records device and stream per
kernel) of build/cp_speed.

    CUDA_INJECTION64_PATH=$PWD/build/libsk_cupti_trace.so SK_TRACE_OUT=t.csv \\
        build/cp_speed --seq 1048576 --reps 3
    python3 bench/cp_timeline.py t.csv

The last run on a device starts at the packing before its last NCCL kernel (or
at that NCCL kernel, on a rank that sends nothing) and runs to the device's
last kernel. Prints one JSON object: per device, each
kernel of that run (short name, stream, start and duration in microseconds
from the run's first kernel) and the run's span.
"""
import csv
import json
import sys



def short(name):
    for plain in ("sk_cp_copy_kernel", "sk_cp_merge_kernel", "sk_cp_lse_copy_kernel",
                  "sk_attention_sm90_carry_kernel", "sk_attention_sm90_kernel", "sk_attention_sm80", "nccl", "sk_schedule"):
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
        # The last run starts at the packing before its NCCL kernel (on the
        # side stream, after the previous run's NCCL), or at the NCCL
        # kernel itself on a rank that sends nothing.
        nccl = [i for i, k in enumerate(ks) if k[2] == "nccl"]
        start = nccl[-1] if nccl else 0
        prev = nccl[-2] if len(nccl) > 1 else -1
        for i in range(start - 1, prev, -1):
            if ks[i][2] == "sk_cp_copy_kernel" and ks[i][3] == ks[start][3]:
                start = i
        run = ks[start:]
        t0 = run[0][0]
        out[dev] = {
            "span_us": round((max(k[1] for k in run) - t0) / 1e3, 1),
            "kernels": [[n, s, round((a - t0) / 1e3, 1), round((b - a) / 1e3, 1)]
                        for a, b, n, s in run],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
