"""Device timeline of the top-k selection (docs/perf/topk_log.md step 14).

Runs sparsek.pool_select_topk (the selection sk_attention_topk runs) and the
two-call chain block_pool + select_topk at the issue 7 shape under
torch.profiler (CUPTI), per call (a host sync before each call, two CUDA
events around it) and back to back, and prints one JSON object per call:
its kernels (name, start relative to the call's first kernel, duration),
the gap from the start event to the first kernel, and the span from the
first kernel's start to the last one's end.

    SPARSEK_LIBRARY=build/libsparsek.so PYTHONPATH=python \\
        python3 bench/topk_timeline.py --reps 8 > timeline.jsonl

Needs a CUDA device and PyTorch; the shape is B1 H32 S128K D128 bf16, k 16,
2 sinks, 8 local blocks, causal (--seq to shrink it).
"""

import argparse
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import sparsek

OPTS = dict(sink_blocks=2, local_blocks=8, causal=True)


def pool_select(q, k, kk):
    return sparsek.pool_select_topk(q, k, kk, **OPTS)


def two_calls(q, k, kk):
    pq, pk = sparsek.block_pool(q, k)
    return sparsek.select_topk(pq, pk, kk, **OPTS)


def annotate_library_calls():
    """Wrap the library entry points in record_function ranges, so that a
    trace shows each call's host time before its first CUDA call."""
    from sparsek import _lib

    for name in ("sk_pool_select_topk", "sk_block_pool", "sk_select_topk"):
        f = getattr(_lib.F, name)

        def wrapped(*args, _f=f, _n=name):
            with torch.profiler.record_function(_n):
                return _f(*args)

        setattr(_lib.F, name, wrapped)


def run(fn, q, k, kk, reps, per_call):
    """reps calls, each between two events, with a host sync before each
    one when per_call (else all enqueued back to back)."""
    marks = []
    torch.cuda.synchronize()
    for _ in range(reps):
        if per_call:
            torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn(q, k, kk)
        e1.record()
        marks.append((e0, e1))
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) * 1000.0 for e0, e1 in marks]


def kernels_of(prof):
    """Every device activity (kernels, and memsets or copies if any) as
    (start, end, name), in start order."""
    out = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out.append((ev.time_range.start, ev.time_range.end, ev.name))
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--tag", default="")
    ap.add_argument("--trace-dir", default="", help="also write Chrome traces with the host's calls")
    a = ap.parse_args()
    if a.trace_dir:
        annotate_library_calls()
    torch.manual_seed(0)
    q = torch.randn(1, a.seq, a.heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, a.seq, a.heads, 128, device="cuda", dtype=torch.bfloat16)
    cases = [("pool_select", pool_select), ("two_calls", two_calls)]
    for name, fn in cases:  # warm-up, outside the profile
        run(fn, q, k, a.k, 3, True)
    for mode in ("per_call", "back_to_back"):
        for name, fn in cases:
            acts = [ProfilerActivity.CUDA]
            if a.trace_dir:  # the host's runtime calls as well
                acts.append(ProfilerActivity.CPU)
            with profile(activities=acts) as prof:
                ev_us = run(fn, q, k, a.k, a.reps, mode == "per_call")
            if a.trace_dir:
                prof.export_chrome_trace(f"{a.trace_dir}/{name}_{mode}.json")
            ks = kernels_of(prof)
            # A call's kernels: from one pooling kernel to the next.
            calls, cur = [], None
            for s, e, n in ks:
                if "pool_kernel" in n:
                    cur = []
                    calls.append(cur)
                if cur is not None:
                    cur.append((s, e, n))
            for i, c in enumerate(calls):
                t0 = c[0][0]
                print(json.dumps({
                    "tag": a.tag, "case": name, "mode": mode, "call": i,
                    "event_us": round(ev_us[i], 1) if i < len(ev_us) else None,
                    "span_us": round(max(e for _, e, _ in c) - t0, 1),
                    "kernel_sum_us": round(sum(e - s for s, e, _ in c), 1),
                    "kernels": [[n.split("(")[0][:40], round(s - t0, 1), round(e - s, 1)]
                                for s, e, n in c],
                }))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
