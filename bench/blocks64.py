#!/usr/bin/env python3
"""Blocks of 64 on the Hopper kernel (issue 28's row "top-k at S128K with
blocks of 64: >= 85 % of the 128x128 rate on the same layout's tokens").

    python3 bench/blocks64.py --out bench/results/blocks64_<commit>_<gpu>.jsonl
    python3 bench/blocks64.py --quick          # a 16K smoke run of the same grid
    python3 bench/blocks64.py --backends sm90 --patterns random --dtype e4m3 \
        [--v-layout vt]        # the FP8 kernel (issue 32; topk takes no e4m3)

For each kernel (--backend sm90: the Hopper kernel forced; sm80: the
portable one forced) and each (block_q, block_k) in 128x128, 128x64,
64x128, 64x64, the CLI (build/sparsek run --json) runs B1 H32 D128 bf16
S 131072 on a causal layout of the same token density at every block size:
`random` (k = round(density x key blocks) random causal blocks per row, per
(b, h)) and `topk` (blocks chosen by sk_attention_topk from the workload's
own Q and K; its attention alone, `attention_only_ms`, is what is compared).
One process per run; the rows are interleaved (all block sizes of a kernel
and pattern back to back) so that the card's state drifts across all of
them alike. Prints, per kernel and pattern, TFLOPS (actual: 4 D bq bk x
selected blocks / time) and the rate relative to 128x128 on the same kernel,
the figure the issue's row is judged by. Needs no torch; stdlib only.
"""
import argparse
import json
import subprocess
import sys

BLOCKS = [(128, 128), (128, 64), (64, 128), (64, 64)]


def run_one(cli, backend, bq, bk, pattern, args):
    cmd = [cli, "run", "--json", "--quiet", "--backend", backend,
           "--batch", "1", "--heads", "32", "--dim", "128", "--dtype", args.dtype,
           "--seq", str(args.seq), "--block-q", str(bq), "--block-k", str(bk),
           "--pattern", pattern, "--causal", "on", "--density", str(args.density),
           "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--check-rows", str(args.check_rows)]
    if args.dtype == "e4m3":
        cmd += ["--v-layout", args.v_layout]
    p = subprocess.run(cmd, capture_output=True, text=True)
    row = {"backend": backend, "dtype": args.dtype, "block_q": bq, "block_k": bk,
           "pattern": pattern,
           "cmd": " ".join(cmd), "rc": p.returncode}
    if p.returncode != 0:
        row["error"] = (p.stderr or p.stdout).strip()[-400:]
        return row
    try:
        row["result"] = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        row["error"] = f"unparsable output ({e}): {p.stdout[-300:]}"
    return row


def attention_ms(res):
    """The attention's own time: topk runs time selection + attention."""
    return res.get("attention_only_ms") or res["time_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/sparsek")
    ap.add_argument("--out", default=None, help="JSON lines, one per run")
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "e4m3"],
                    help="e4m3: the FP8 kernel (the CLI quantizes the bf16 workload)")
    ap.add_argument("--v-layout", default="rows", choices=["rows", "vt"],
                    help="e4m3: V as rows (the in-kernel transposer) or V^T")
    ap.add_argument("--density", type=float, default=0.03)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check-rows", type=int, default=1)
    ap.add_argument("--backends", default="sm90,sm80")
    ap.add_argument("--patterns", default="random,topk")
    ap.add_argument("--quick", action="store_true", help="S 16K, 5 iterations")
    args = ap.parse_args()
    if args.quick:
        args.seq, args.iters, args.warmup = 16384, 5, 1

    rows = []
    out = open(args.out, "w") if args.out else None
    for backend in args.backends.split(","):
        for pattern in args.patterns.split(","):
            for bq, bk in BLOCKS:
                row = run_one(args.cli, backend, bq, bk, pattern, args)
                rows.append(row)
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                status = row.get("error", "")
                if not status:
                    r = row["result"]
                    status = (f"{attention_ms(r):.3f} ms, {r['tflops_actual']:.1f} TFLOPS "
                              f"(time incl. selection), {r['blocks_selected']} blocks, "
                              f"check {r.get('check_passed')}")
                print(f"{backend} {pattern} {bq}x{bk}: {status}", file=sys.stderr)
    if out:
        out.close()

    print("| kernel | pattern | blocks | attention ms | TFLOPS (actual) | vs 128x128 |")
    print("|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        for pattern in args.patterns.split(","):
            base = None
            for bq, bk in BLOCKS:
                row = next(x for x in rows if x["backend"] == backend and
                           x["pattern"] == pattern and x["block_q"] == bq and x["block_k"] == bk)
                if "error" in row:
                    print(f"| {backend} | {pattern} | {bq}x{bk} | error | {row['error'][:60]} | |")
                    continue
                r = row["result"]
                ms = attention_ms(r)
                tf = 4.0 * 128 * bq * bk * r["blocks_selected"] / (ms * 1e-3) / 1e12
                if (bq, bk) == (128, 128):
                    base = tf
                rel = f"{100.0 * tf / base:.1f} %" if base else "-"
                print(f"| {backend} | {pattern} | {bq}x{bk} | {ms:.3f} | {tf:.1f} | {rel} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
