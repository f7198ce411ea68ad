"""Context parallelism over torch.distributed (NCCL): sparsek.cp_attention
on R GPUs of one host (issue 33), checked, then timed.

    PYTHONPATH=python SPARSEK_LIBRARY=$PWD/build/libsparsek.so \\
        torchrun --nproc-per-node 2 bench/cp_torch.py --seq 1048576 [--single] \\
        [--out $OUT/cp_torch.json]

The layout (the issue's): causal; per KV head, every row block selects the
sink blocks (--sinks tokens), the blocks of the last --window tokens (its
diagonal included) and --topk random blocks below the window (a top-k
stand-in; distinct, seeded by --seed, drawn per KV head), at blocks of
--block. H32/8 D128 bf16 B1 and zigzag sharding by default.

1. Check (--check-seq, default 16384; 0 skips): the same kind of layout at
   a small S, global q, k, v drawn on every rank from one seed, each rank
   runs cp_attention on its shard into NaN-poisoned out / lse, rank 0
   gathers O and LSE and compares them with the single-GPU sparsek.attention
   on the global tensors: |O - O_ref| <= 2u|O_ref| + 4u vmax (u the dtype's
   unit roundoff; both sides round P to the dtype before P V (u vmax each)
   and the sharded one also rounds its two partials before the fp32 merge
   (u vmax) and O once more), |LSE - LSE_ref| <= 2^-12 + 2^-16|LSE_ref|,
   -inf at the same places, nothing NaN. Not bitwise: the single GPU
   sums each row in one online softmax, the sharded run in two parts.
2. Timing, for each --seq: each rank draws its shard (random, values do not
   matter), builds the plan from the global layout (identical on all
   ranks), warms up (plans, uploads), then CUDA events around each
   cp_attention call on its current stream (the exchange runs on NCCL's
   stream, joined before the merge), the median of --repeat; and the
   exchange alone (all_to_all_single of the plan's byte counts) timed the
   same way. --single: rank 0 then also times sparsek.attention on the
   whole problem on one GPU (OOM is reported, not fatal).

One JSON line per rank and --seq on stdout (--out: rank 0 writes all of
them, the check and the single-GPU lines as a JSON list):
  seq, rank, ranks, ms (median), ms_min, ms_max, tflops (4 D bq bk x the
  blocks this rank's rows select, over ms), sent_bytes / recv_bytes (what
  was handed to torch.distributed) and the plan's, needed_ratio (sent over
  plan bytes: 1.0), xchg_ms (the exchange alone), local_blocks /
  remote_blocks (selected blocks of its rows: own keys / received), the
  shape, layout and torch / NCCL versions. --balance: the plan's chunk
  boundaries from sparsek.cp_balance (CpPlan(chunk_starts="balanced")),
  for the check and the timing alike.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

try:
    import sparsek
except ImportError:  # run from the checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import sparsek

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
# f32: the --cpu smoke mode only (fp32 passes, no P rounding: the bound
# below is loose there, the CPU tests hold the tight one).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-20}


def ragged_arange(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each c of counts, concatenated."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts


def issue_layout(seq, block, sinks, window, topk, heads, seed) -> sparsek.Layout:
    """Causal sinks + window + topk random blocks below the window, per
    head (slice); every row sorted, its diagonal block included."""
    nb = -(-seq // block)
    rng = np.random.default_rng(seed)
    i = np.arange(nb, dtype=np.int64)
    sb, wb = -(-sinks // block), window // block
    lo = np.maximum(0, i - wb)  # first window block
    s_cnt = np.minimum(sb, lo)
    r_n = np.maximum(0, lo - sb)  # candidates for the random picks: [sb, lo)
    r_cnt = np.minimum(topk, r_n)
    w_cnt = i - lo + 1
    per_row = s_cnt + r_cnt + w_cnt
    offsets, cols = [np.zeros(1, dtype=np.int64)], []
    for _ in range(heads):
        row_start = np.concatenate(([0], np.cumsum(per_row)))[:-1]
        col = np.empty(int(per_row.sum()), dtype=np.int64)
        # sinks: 0 .. s_cnt-1
        col[np.repeat(row_start, s_cnt) + ragged_arange(s_cnt)] = ragged_arange(s_cnt)
        # random: r_cnt distinct sorted picks in [sb, lo): sorted draws from
        # [0, r_n - r_cnt] plus 0..r_cnt-1 (all of them where r_n <= topk)
        u = rng.random((nb, topk))
        span = (r_n - r_cnt + 1)[:, None]
        picks = np.sort(np.floor(u * span).astype(np.int64), axis=1) + np.arange(topk) + sb
        keep = np.arange(topk)[None, :] < r_cnt[:, None]
        col[np.repeat(row_start + s_cnt, r_cnt) + ragged_arange(r_cnt)] = picks[keep]
        # window: lo .. i
        col[np.repeat(row_start + s_cnt + r_cnt, w_cnt) + ragged_arange(w_cnt)] = (
            np.repeat(lo, w_cnt) + ragged_arange(w_cnt))
        offsets.append(offsets[-1][-1] + np.cumsum(per_row))
        cols.append(col)
    return sparsek.Layout.from_bsr(np.concatenate(offsets), np.concatenate(cols), seq, block=block,
                                   heads=heads)


def make_plan(args, seq, dtype) -> tuple:
    layout = issue_layout(seq, args.block, args.sinks, args.window, args.topk, args.heads_kv, args.seed)
    plan = sparsek.CpPlan(layout, dist.get_world_size(), batch=args.batch, heads_q=args.heads_q,
                          heads_kv=args.heads_kv, head_dim=args.dim, dtype=dtype, causal=True,
                          sharding=args.sharding, chunk_starts="balanced" if args.balance else None)
    return layout, plan


def rows_of(plan, rank, device):
    return torch.cat([torch.arange(s, s + n, device=device) for s, n in plan.shard(rank)])


def rank_blocks(plan, rank, args) -> tuple:
    """Selected blocks of rank's rows over all (b, h): own keys, received."""
    blob = plan.blob()
    rp = blob.rank(rank)
    per_slice = args.batch * args.heads_q // (int(blob.header["layout_batch"]) * int(blob.header["layout_heads"]))
    local = sum(int(rp["chunk"][c]["local_nnz"]) for c in range(int(rp["chunks"])))
    remote = sum(int(rp["chunk"][c]["remote_nnz"]) for c in range(int(rp["chunks"])))
    return local * per_slice, remote * per_slice


CPU_MODE = False  # --cpu: wall-clock timing


def timed(fn, warmup, repeat) -> list:
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(repeat):
        if CPU_MODE:
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return ms


def check(args, dtype, device) -> dict:
    """The sharded result against the single-GPU forward (rank 0 decides,
    every rank gets the verdict)."""
    rank, R = dist.get_rank(), dist.get_world_size()
    seq = args.check_seq
    layout, plan = make_plan(args, seq, dtype)
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    B, Hq, Hkv, D = args.batch, args.heads_q, args.heads_kv, args.dim
    q = torch.randn(B, seq, Hq, D, generator=g, device=device).to(dtype)
    k = torch.randn(B, seq, Hkv, D, generator=g, device=device).to(dtype)
    v = torch.randn(B, seq, Hkv, D, generator=g, device=device).to(dtype)
    rows = rows_of(plan, rank, device)
    o = torch.full((B, len(rows), Hq, D), float("nan"), dtype=dtype, device=device)
    lse = torch.full((B, Hq, len(rows)), float("nan"), device=device)
    stats = {}
    sparsek.cp_attention(q[:, rows].contiguous(), k[:, rows].contiguous(), v[:, rows].contiguous(), plan,
                         out=o, lse=lse, exchange=args.exchange, stats=stats)
    # Gather (shards differ in length by the tail: pad to the longest).
    longest = max(sum(n for _, n in plan.shard(r)) for r in range(R))
    po = torch.zeros((B, longest, Hq, D), dtype=dtype, device=device)
    pl = torch.zeros((B, Hq, longest), device=device)
    po[:, :len(rows)] = o
    pl[:, :, :len(rows)] = lse
    all_o, all_l = [torch.empty_like(po) for _ in range(R)], [torch.empty_like(pl) for _ in range(R)]
    dist.all_gather(all_o, po)
    dist.all_gather(all_l, pl)
    verdict = torch.zeros(1, device=device)
    result = {"mode": "check", "seq": seq, "ranks": R, "sent_bytes": stats["sent_bytes"],
              "plan_send_bytes": stats["plan_send_bytes"]}
    if rank == 0:
        got_o = torch.empty_like(q)
        got_l = torch.empty((B, Hq, seq), device=device)
        for r in range(R):
            rr = rows_of(plan, r, device)
            got_o[:, rr] = all_o[r][:, :len(rr)]
            got_l[:, :, rr] = all_l[r][:, :, :len(rr)]
        ref, ref_l = sparsek.attention(q, k, v, layout, causal=True, return_lse=True)
        u = UNIT_ROUNDOFF[dtype]
        r64, o64 = ref.double(), got_o.double()
        vmax = v.double().abs().max()
        tol = 2 * u * r64.abs() + 4 * u * vmax
        err = (o64 - r64).abs()
        fin = torch.isfinite(ref_l)
        lerr = (got_l - ref_l).abs()[fin]
        ltol = 2.0**-12 + 2.0**-16 * ref_l.abs()[fin]
        ok = bool((err <= tol).all()) and not bool(torch.isnan(got_o).any() or torch.isnan(got_l).any())
        ok = ok and torch.equal(torch.isneginf(got_l), torch.isneginf(ref_l)) and bool((lerr <= ltol).all())
        result.update(ok=ok, max_abs_err=float(err.max()), max_err_over_tol=float((err / tol).max()),
                      max_lse_err=float(lerr.max()) if lerr.numel() else 0.0, tol_u=u, vmax=float(vmax))
        verdict[0] = 1.0 if ok else 0.0
    dist.broadcast(verdict, 0)
    result["ok"] = bool(verdict.item())
    return result


def run_seq(args, seq, dtype, device) -> dict:
    rank, R = dist.get_rank(), dist.get_world_size()
    _, plan = make_plan(args, seq, dtype)
    S_r = sum(n for _, n in plan.shard(rank))
    B, Hq, Hkv, D = args.batch, args.heads_q, args.heads_kv, args.dim
    g = torch.Generator(device=device).manual_seed(args.seed + 100 + rank)
    q = torch.randn(B, S_r, Hq, D, generator=g, device=device, dtype=dtype)
    k = torch.randn(B, S_r, Hkv, D, generator=g, device=device, dtype=dtype)
    v = torch.randn(B, S_r, Hkv, D, generator=g, device=device, dtype=dtype)
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S_r), device=device)
    stats = {}

    def call():
        sparsek.cp_attention(q, k, v, plan, out=o, lse=lse, exchange=args.exchange, stats=stats)

    dist.barrier()
    ms = timed(call, args.warmup, args.repeat)
    # The exchange alone, same byte counts.
    rv_send = [plan.pair(rank, p)[0] for p in range(R)]
    rv_recv = [plan.pair(p, rank)[0] for p in range(R)]
    sb = torch.empty(sum(rv_send), dtype=torch.uint8, device=device)
    rb = torch.empty(sum(rv_recv), dtype=torch.uint8, device=device)
    dist.barrier()
    xms = timed(lambda: dist.all_to_all_single(rb, sb, rv_recv, rv_send), 1, args.repeat)
    local, remote = rank_blocks(plan, rank, args)
    med = statistics.median(ms)
    flops = 4.0 * D * args.block * args.block * (local + remote)
    return {
        "mode": "sharded", "seq": seq, "rank": rank, "ranks": R, "ms": med, "ms_min": min(ms),
        "ms_max": max(ms), "tflops": flops / (med * 1e-3) * 1e-12, "sent_bytes": stats["sent_bytes"],
        "recv_bytes": stats["recv_bytes"], "plan_send_bytes": plan.send_bytes(rank),
        "plan_recv_bytes": plan.recv_bytes(rank),
        "needed_ratio": stats["sent_bytes"] / max(1, plan.send_bytes(rank)),
        "xchg_ms": statistics.median(xms), "local_blocks": local, "remote_blocks": remote,
        "shard_tokens": S_r, "exchange": args.exchange,
    }


def run_single(args, seq, dtype, device) -> dict:
    """Rank 0: sparsek.attention on the whole problem on one GPU."""
    layout = issue_layout(seq, args.block, args.sinks, args.window, args.topk, args.heads_kv, args.seed)
    B, Hq, Hkv, D = args.batch, args.heads_q, args.heads_kv, args.dim
    out = {"mode": "single", "seq": seq, "rank": 0}
    try:
        q = torch.randn(B, seq, Hq, D, device=device, dtype=dtype)
        k = torch.randn(B, seq, Hkv, D, device=device, dtype=dtype)
        v = torch.randn(B, seq, Hkv, D, device=device, dtype=dtype)
        o = torch.empty_like(q)
        plan = sparsek.plan_attention(q, k, v, layout, causal=True)
        ms = timed(lambda: plan.run(q, k, v, out=o, return_lse=True), args.warmup, args.repeat)
    except torch.cuda.OutOfMemoryError as e:
        return dict(out, skipped=f"out of memory: {str(e).splitlines()[0]}")
    med = statistics.median(ms)
    flops = 4.0 * D * args.block * args.block * layout.selected_blocks(B, Hq)
    return dict(out, ms=med, ms_min=min(ms), ms_max=max(ms), tflops=flops / (med * 1e-3) * 1e-12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[1 << 20])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--sinks", type=int, default=128, help="sink tokens")
    ap.add_argument("--window", type=int, default=4096, help="window tokens")
    ap.add_argument("--topk", type=int, default=16, help="random blocks per row below the window")
    ap.add_argument("--sharding", choices=["zigzag", "contiguous"], default="zigzag")
    ap.add_argument("--exchange", choices=["all_to_all", "p2p", "library"], default="all_to_all")
    ap.add_argument("--balance", action="store_true",
                    help="chunk boundaries from sparsek.cp_balance (default: equal chunks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--check-seq", type=int, default=16384, help="0 skips the check")
    ap.add_argument("--single", action="store_true", help="rank 0 also times the one-GPU forward")
    ap.add_argument("--out", help="rank 0 writes every line here (JSON list)")
    ap.add_argument("--cpu", action="store_true",
                    help="smoke test of this script without GPUs: gloo, CPU tensors (use --dtype f32)")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(minutes=10)
    if args.cpu:
        global CPU_MODE
        CPU_MODE = True
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    dist.barrier()  # the communicator exists before any batch_isend_irecv
    rank = dist.get_rank()
    dtype = DTYPES[args.dtype]
    common = {"batch": args.batch, "heads_q": args.heads_q, "heads_kv": args.heads_kv, "dim": args.dim,
              "dtype": args.dtype, "block": args.block, "sinks": args.sinks, "window": args.window,
              "topk": args.topk, "sharding": args.sharding, "balance": args.balance, "torch": torch.__version__}
    if not args.cpu:
        common.update(device=torch.cuda.get_device_name(device),
                      nccl=".".join(map(str, torch.cuda.nccl.version())))
    lines, failed = [], False

    def emit(line):
        line = dict(line, **common)
        print(json.dumps(line), flush=True)
        lines.append(line)

    if args.check_seq:
        res = check(args, dtype, device)
        failed = not res["ok"]
        if rank == 0:
            emit(res)
    for seq in args.seq:
        emit(run_seq(args, seq, dtype, device))
        torch.cuda.empty_cache()
        if args.single:
            dist.barrier()
            if rank == 0:
                emit(run_single(args, seq, dtype, device))
                torch.cuda.empty_cache()
            dist.barrier()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, lines)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump([x for part in gathered for x in part], f, indent=1)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
