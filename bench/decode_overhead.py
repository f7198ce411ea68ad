"""The Python cost of one sparsek.decode / decode_select call, with the
cached plan (descriptor, workspace size, workspace: plan_cache.
cached_unowned) and without it (the cache emptied before every call, which
is what every call paid before: a workspace-size query, a descriptor built
field by field, a fresh workspace tensor).

    PYTHONPATH=python SPARSEK_LIBRARY=$PWD/build/libsparsek.so \\
        python3 bench/decode_overhead.py [--device cuda] [--reps 200] [--out FILE]

Case (CUDA): B = 1, context 4096, GQA 32/8, D 128, bf16, pages of 64,
q_len 1 (a decode step whose kernel takes a few microseconds, so the host
cost is what shows), dense and with a sinks + window layout of 64-key
blocks; decode_select with k = 8 on the same cache. CPU (--device cpu):
the same heads at context 512 in float32. Per variant, one JSON line:
  host_us   median wall time of the call on the host (no synchronisation)
  loop_us   CUDA events around `reps` back-to-back calls / reps (CUDA only:
            the steady cost per call, host and GPU overlapped)
  single_us median of events around one call after a synchronisation
            (decode_peers.py's method) (CUDA only)
and the ratio cold / cached of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

import sparsek


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def case(device, ctx):
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(31)
    page, hq, hkv, d = 64, 32, 8, 128
    pages = ctx // page
    q = torch.randn(1, 1, hq, d, device=device, dtype=dt, generator=g)
    kc = torch.randn(pages, page, hkv, d, device=device, dtype=dt, generator=g)
    vc = torch.randn(pages, page, hkv, d, device=device, dtype=dt, generator=g)
    table = torch.randperm(pages, device=device, generator=g).to(torch.int32).view(1, pages)
    lens = torch.full((1,), ctx, dtype=torch.int32, device=device)
    blocks = [0] + list(range(pages - 4, pages))  # 1 sink + 4 recent blocks of 64
    layout = (torch.tensor([0, len(blocks)], dtype=torch.int32, device=device),
              torch.tensor(blocks, dtype=torch.int32, device=device))
    summary = sparsek.kv_summary_build(kc, table, lens, block_k=64)
    return q, kc, vc, table, lens, layout, summary


def measure(fn, cold, reps, cuda):
    """(host_us, loop_us, single_us) medians."""
    def call():
        if cold:
            sparsek.clear_plan_cache()
        fn()

    for _ in range(5):
        call()
    if cuda:
        torch.cuda.synchronize()
    host = []
    for _ in range(reps):
        if cold:
            sparsek.clear_plan_cache()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    if not cuda:
        return statistics.median(host), None, None
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    loops = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        loops.append(start.elapsed_time(end) * 1e3 / reps)
    single = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if cold:
            sparsek.clear_plan_cache()
        start.record()
        fn()
        end.record()
        end.synchronize()
        single.append(start.elapsed_time(end) * 1e3)
    return statistics.median(host), statistics.median(loops), statistics.median(single)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    ctx = 4096 if cuda else 512
    q, kc, vc, table, lens, layout, summary = case(args.device, ctx)
    calls = {
        "decode dense": lambda: sparsek.decode(q, kc, vc, table, lens, causal=True, max_seqlen_k=ctx),
        "decode layout": lambda: sparsek.decode(q, kc, vc, table, lens, layout, block_k=64, max_seqlen_k=ctx),
        "decode_select": lambda: sparsek.decode_select(q, summary, lens, k=8, block_k=64),
    }
    rows = []
    with torch.no_grad():
        for name, fn in calls.items():
            cached = measure(fn, False, args.reps, cuda)
            cold = measure(fn, True, args.reps, cuda)
            row = {"commit": commit(), "device": torch.cuda.get_device_name() if cuda else "cpu", "call": name,
                   "context": ctx, "reps": args.reps}
            for i, fig in enumerate(("host_us", "loop_us", "single_us")):
                if cached[i] is not None:
                    row[fig] = {"cached": round(cached[i], 2), "cold": round(cold[i], 2),
                                "cold_over_cached": round(cold[i] / cached[i], 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
