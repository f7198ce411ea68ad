#!/usr/bin/env python3
"""SparseK against its peers, in one process, on the same inputs.

    python3 bench/run.py --out results.json [--cases seed,long,long64,mixed,gemm]
                         [--quick] [--peers sparsek,sdpa_cudnn,...] [--commit SHA]
    python3 bench/run.py --backward --out results.json [--cases NAME,...]
                         (the backward: bench/backward.py)
    python3 bench/run.py --fp8 --out results.json [--cases NAME,...]
                         (the FP8 forward against bf16 and FP8 peers: bench/fp8.py)

For every case (shape, dtype, block layout) this script
  1. builds the inputs once (torch.randn, fixed seed) in [B, S, H, D], plus
     enough rotated copies that one pass over them exceeds the L2 cache;
  2. runs SparseK (sparsek.attention on torch CUDA tensors: the layout is
     uploaded and planned once, only sk_attention_run is timed) and checks a
     slice of its output against a float32 torch reference;
  3. runs each peer, checks its output against SparseK's (max |diff|, before
     any timing) and times it the same way;
  4. times with CUDA events, one pair per run, median of >= 20 runs after
     warm-up, the runs queued behind a GPU sleep so host overhead does not
     leave gaps between them.

Peers: SDPA with the cuDNN and the flash backends (dense / causal dense),
FlexAttention compiled with the same layout as a BlockMask (full-block
lists split off), FlexAttention's FLASH backend (FA4), flashinfer's block-
sparse wrappers, and FA4's block-sparse flash_attn_func (flash_attn.cute).
A peer that is not installed, not supported for a case, or fails, is
recorded with its reason; the run goes on.

FLOP counts: actual = 4 * D * bq * bk * (selected blocks over all (b, h))
for block-sparse systems; a dense peer's own work for dense peers
(4 * B * H * Sq * Sk * D, half for causal). Dense-equivalent = the dense
work of the case's attention (half when the case is causal) / time.

See bench/README.md for the cases and for how the suite is run on the GPU
machine (and how peers that are not installed there travel as wheels).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))
if str(REPO / "bench") not in sys.path:  # bench/backward.py, when imported as a module
    sys.path.insert(0, str(REPO / "bench"))

SCHEMA = "sparsek-bench/1"
ALL_PEERS = ["sparsek", "sparsek_sm80", "sdpa_cudnn", "sdpa_flash", "flex", "flex_flash", "flashinfer", "fa4"]
# --backward only: SparseK with bwd->deterministic = 0 (the fused Hopper pass).
ALL_PEERS.append("sparsek_nondet")
# --backward only: the portable kernel's fused pass (deterministic = 0, backend cuda_sm80).
ALL_PEERS.append("sparsek_sm80_nondet")
# --fp8 only (bench/fp8.py): SparseK bf16 and FP8 (V^T, rows V), flashinfer's
# FP8 block-sparse and dense prefill, cuDNN SDPA on float8 inputs (probed).
FP8_PEERS = ["sparsek_bf16", "sparsek_fp8", "sparsek_fp8_rows", "flashinfer_fp8", "flashinfer_fp8_dense", "sdpa_cudnn_fp8"]
ALL_PEERS += FP8_PEERS
GROUPS = ["seed", "causal", "long", "long64", "mixed", "gemm"]

# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    group: str
    B: int
    H: int
    Hkv: int
    S: int
    D: int
    dtype: str  # "float16" / "bfloat16"
    pattern: str  # "random" (k per row per (b,h)), "window", "window_random"
    causal: bool  # the token-level mask inside selected blocks
    block: int = 128
    k: int = 0  # random blocks per row
    window: int = 0  # window tokens (causal: p - window < k <= p)
    note: str = ""
    dense_peers: bool = False  # also time SDPA (dense or causal dense)
    seed: int = 0

    @property
    def blocks(self) -> int:
        return -(-self.S // self.block)


def make_cases(groups, quick: bool, max_dense_seq: int, tiny: bool = False):
    """The suite's cases. quick: small shapes for a GPU smoke test; tiny:
    smaller still, for the CPU smoke test (--device cpu)."""
    cases = []
    if tiny:
        B, H, S, D = 1, 2, 512, 64
    elif quick:
        B, H, S, D = 2, 4, 1024, 128
    else:
        B, H, S, D = 16, 96, 4096, 128
    cb = -(-S // 128)
    if "seed" in groups:
        for frac, label in ((1, "100"), (2, "50"), (4, "25"), (8, "12.5"), (16, "6.25")):
            k = max(1, cb // frac)
            cases.append(
                Case(
                    f"seed_topk{label}", "seed", B, H, H, S, D, "float16", "random", False, k=k,
                    note=f"random top-{k} of {cb} key blocks per query block, per (b, h)",
                    dense_peers=(frac == 1), seed=100 + frac,
                )
            )
        w = 256 if quick or tiny else 1024
        cases.append(
            Case(
                f"seed_window{w}", "seed", B, H, H, S, D, "float16", "window", True, window=w,
                note=f"causal sliding window of {w} tokens (block granular)", dense_peers=True,
            )
        )
    if "causal" in groups:
        # Issue 28: the causal dense layout against cuDNN's causal SDPA, at
        # S = 2K, 8K and 32K, B x H such that a run takes >= 1 ms.
        shapes = [(1, 2, 512)] if tiny else [(2, 4, 1024), (1, 4, 2048)] if quick else [
            (16, 32, 2048), (2, 32, 8192), (1, 16, 32768)]
        for b, h, s in shapes:
            cases.append(
                Case(
                    f"causal_s{s // 1024}k" if s >= 1024 else f"causal_s{s}", "causal", b, h, h, s, 128, "bfloat16",
                    "window", True, window=s, note="causal dense layout (every block on or below the diagonal)",
                    dense_peers=True,
                )
            )
    long_seqs = [512, 1024] if tiny else [2048, 4096] if quick else [16384, 32768, 65536, 131072, 262144]
    lw = 256 if tiny else 512 if quick else 2048
    lh = 2 if tiny else 4 if quick else 32
    for group, d in (("long", 128), ("long64", 64)):
        if group not in groups:
            continue
        for s in long_seqs:
            cases.append(
                Case(
                    f"{group}_s{s // 1024}k", group, 1, lh, lh, s, d, "bfloat16", "window", True, window=lw,
                    note=f"causal window {lw}", dense_peers=s <= max_dense_seq,
                )
            )
    if "mixed" in groups:
        s = 1024 if tiny else 4096 if quick else 131072
        w = 256 if tiny else 1024 if quick else 4096
        r = 1 if tiny else 2 if quick else 8
        cases.append(
            Case(
                f"mixed_s{s // 1024}k", "mixed", 1, lh, lh, s, 128, "bfloat16", "window_random", True,
                window=w, k=r, note=f"causal window {w} + {r} random causal blocks per row, per head",
                dense_peers=s <= max_dense_seq, seed=7,
            )
        )
    if "gemm" in groups:
        # The seed's grouped-GEMM case: 800 active 128x128 blocks at 80%
        # sparsity, m=n=128 k=64 per group. As attention: D = 64 and 800 of
        # 4000 blocks: B1 H10 S2560 (20 x 20 blocks per head), 4 random key
        # blocks per query block (20%) -> 10 * 20 * 4 = 800 blocks.
        h, s, k = (2, 640, 1) if quick or tiny else (10, 2560, 4)
        cases.append(
            Case(
                "gemm_seed800", "gemm", 1, h, h, s, 64, "float16", "random", False, k=k,
                note="seed 000 grouped-GEMM case as attention: 800 of 4000 128x128 blocks (20%), D=64; "
                "the seed reported 0.461 ms on an H100",
                dense_peers=True, seed=800,
            )
        )
    return cases


def build_layout(case: Case):
    import sparsek

    if case.pattern == "random":
        return sparsek.Layout.random(
            case.S, k=case.k, seed=case.seed, causal=case.causal, block=case.block, batch=case.B, heads=case.H
        )
    if case.pattern == "window":
        return sparsek.Layout.window(case.S, left=case.window - 1, right=0, block=case.block)
    if case.pattern == "window_random":
        win = sparsek.Layout.window(case.S, left=case.window - 1, right=0, block=case.block).to_mask()
        rnd = sparsek.Layout.random(case.S, k=case.k, seed=case.seed, causal=True, block=case.block, heads=case.H).to_mask()
        return sparsek.Layout.from_mask(rnd | win, block=case.block, batch=1, heads=case.H)
    raise ValueError(case.pattern)


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


class Timer:
    """CUDA-event timing (median of per-run event pairs), or wall clock for
    the CPU smoke mode."""

    def __init__(self, device: str, iters: int, warmup: int, max_seconds: float):
        self.device = device
        self.iters = iters
        self.warmup = warmup
        self.max_seconds = max_seconds

    def measure(self, fn, n_rot: int) -> dict:
        import torch

        cuda = self.device == "cuda"
        # Warm-up (compiles, autotunes, caches), and the host cost of a call.
        def sync():
            if cuda:
                torch.cuda.synchronize()

        t0 = time.perf_counter()
        fn(0)
        sync()
        warmup = self.warmup
        if time.perf_counter() - t0 > 0.25:  # a slow system: fewer warm-up runs
            warmup = min(warmup, 2)
        for i in range(1, warmup):
            fn(i % n_rot)
        sync()
        warm_s = (time.perf_counter() - t0) / max(warmup, 1)
        # One more synchronous run gives the host launch time of a call.
        h0 = time.perf_counter()
        fn(0)
        host_s = time.perf_counter() - h0
        if cuda:
            torch.cuda.synchronize()
        one_s = time.perf_counter() - h0
        iters = self.iters
        if one_s * iters > self.max_seconds:
            iters = max(20, int(self.max_seconds / max(one_s, 1e-9)))
        times = []
        if cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            # Queue the runs behind a GPU sleep long enough for the host to
            # enqueue all of them, so no run waits for its launch.
            sleep_s = min(1.0, 1.5 * host_s * iters)
            torch.cuda._sleep(int(sleep_s * 1.8e9))
            for i in range(iters):
                starts[i].record()
                fn((i + 1) % n_rot)
                ends[i].record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        else:
            for i in range(iters):
                t = time.perf_counter()
                fn((i + 1) % n_rot)
                times.append((time.perf_counter() - t) * 1e3)
        return {
            "time_ms": statistics.median(times),
            "min_ms": min(times),
            "max_ms": max(times),
            "n_runs": len(times),
            "warmup_runs": warmup,
            "warmup_mean_s": warm_s,
            "host_call_ms": host_s * 1e3,
        }


# ---------------------------------------------------------------------------
# Systems
# ---------------------------------------------------------------------------


class Skip(Exception):
    """A system does not apply to a case (recorded as skipped)."""


@dataclass
class Inputs:
    q: list  # rotated copies, [B, S, H, D]
    k: list
    v: list
    layout: object
    device: str
    n_rot: int


def _sdpa(backend_name):
    def make(case: Case, inp: Inputs, ctx):
        import torch
        import torch.nn.functional as Fn
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if inp.device != "cuda":
            raise Skip("needs CUDA")
        if not case.dense_peers:
            raise Skip("dense baseline timed on another case of this group")
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend_name]
        qs = [x.transpose(1, 2) for x in inp.q]
        ks = [x.transpose(1, 2) for x in inp.k]
        vs = [x.transpose(1, 2) for x in inp.v]
        causal = case.causal

        def fn(i):
            with sdpa_kernel([backend]):
                return Fn.scaled_dot_product_attention(qs[i], ks[i], vs[i], is_causal=causal, enable_gqa=case.H != case.Hkv)

        dense = 4.0 * case.B * case.H * case.S * case.S * case.D
        flops = dense * (case.S + 1) / (2 * case.S) if causal else dense
        full_layout = inp.layout.density == 1.0
        return {
            "fn": fn,
            "output": lambda o: o.transpose(1, 2),
            "flops": flops,
            "computes": "causal dense" if causal else "dense",
            # Comparable with SparseK only when the layout selects everything.
            "comparable": full_layout,
        }

    return make


def _flex(flash_backend: bool):
    def make(case: Case, inp: Inputs, ctx):
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        if flash_backend:
            if inp.device != "cuda":
                raise Skip("needs CUDA")
            try:
                import flash_attn.cute  # noqa: F401
            except Exception as e:
                raise Skip(f"flash_attn.cute (FA4) not importable: {type(e).__name__}: {e}")
        key = "flex_flash_fn" if flash_backend else "flex_fn"
        if key not in ctx:
            ctx[key] = torch.compile(flex_attention, dynamic=False)
        compiled = ctx[key]
        t0 = time.perf_counter()
        bm = inp.layout.to_block_mask(causal=case.causal, split_full=True, device=inp.q[0].device, num_heads=case.H)
        mask_build_s = time.perf_counter() - t0
        qs = [x.transpose(1, 2) for x in inp.q]
        ks = [x.transpose(1, 2) for x in inp.k]
        vs = [x.transpose(1, 2) for x in inp.v]
        opts = {"BACKEND": "FLASH"} if flash_backend else None
        gqa = case.H != case.Hkv

        def fn(i):
            return compiled(qs[i], ks[i], vs[i], block_mask=bm, enable_gqa=gqa, kernel_options=opts)

        return {
            "fn": fn,
            "output": lambda o: o.transpose(1, 2),
            "flops": ctx["sparse_flops"],
            "computes": "same layout (BlockMask with full-block lists)",
            "comparable": True,
            "extra": {"block_mask_build_s": mask_build_s},
        }

    return make


def _flashinfer(case: Case, inp: Inputs, ctx):
    import torch

    if inp.device != "cuda":
        raise Skip("needs CUDA")
    try:
        import flashinfer
    except Exception as e:
        raise Skip(f"flashinfer not importable: {type(e).__name__}: {e}")
    lay = inp.layout
    dt = getattr(torch, case.dtype)
    dev = inp.q[0].device
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    extra = {"flashinfer_version": getattr(flashinfer, "__version__", "?")}
    if lay.heads == 1 and lay.batch == 1:
        # One BSR for every (b, h): BlockSparseAttentionWrapper, per batch.
        w = flashinfer.sparse.BlockSparseAttentionWrapper(ws)
        ro = torch.from_numpy(lay.row_offsets).to(dev)
        ci = torch.from_numpy(lay.col_indices).to(dev)
        w.plan(ro, ci, case.S, case.S, lay.block_rows, lay.block_cols, case.H, case.Hkv, case.D,
               causal=case.causal, q_data_type=dt, kv_data_type=dt)
        extra["wrapper"] = "BlockSparseAttentionWrapper"

        def fn(i):
            outs = [w.run(inp.q[i][b], inp.k[i][b], inp.v[i][b]) for b in range(case.B)]
            return outs

        def output(outs):
            return torch.stack([o if o.shape[0] == case.S else o.transpose(0, 1) for o in outs])

    else:
        # Per-head layouts: VariableBlockSparseAttentionWrapper (one mask per
        # KV head), one wrapper per batch entry, inputs in [H, S, D].
        if lay.heads not in (case.Hkv,) and not (lay.heads == case.H == case.Hkv):
            raise Skip(f"layout heads = {lay.heads}: flashinfer takes one pattern per KV head")
        mask = torch.from_numpy(lay.to_mask().astype(bool)).to(dev).reshape(lay.batch, lay.heads, lay.row_blocks, lay.col_blocks)
        rows = torch.full((lay.heads, lay.row_blocks), lay.block_rows, dtype=torch.int32)
        rows[:, -1] = case.S - (lay.row_blocks - 1) * lay.block_rows
        cols = torch.full((lay.heads, lay.col_blocks), lay.block_cols, dtype=torch.int32)
        cols[:, -1] = case.S - (lay.col_blocks - 1) * lay.block_cols
        rows, cols = rows.to(dev), cols.to(dev)
        wrappers = []
        for b in range(case.B):
            w = flashinfer.sparse.VariableBlockSparseAttentionWrapper(ws)
            w.plan(mask[b if lay.batch > 1 else 0], rows, cols, case.H, case.Hkv, case.D,
                   causal=case.causal, q_data_type=dt, kv_data_type=dt)
            wrappers.append(w)
        qh = [x.permute(0, 2, 1, 3).contiguous() for x in inp.q]
        kh = [x.permute(0, 2, 1, 3).contiguous() for x in inp.k]
        vh = [x.permute(0, 2, 1, 3).contiguous() for x in inp.v]
        extra["wrapper"] = "VariableBlockSparseAttentionWrapper (per batch entry; inputs copied to [H, S, D] beforehand)"
        ctx["_keep"] = (qh, kh, vh)

        def fn(i):
            return [wrappers[b].run(qh[i][b], kh[i][b], vh[i][b]) for b in range(case.B)]

        def output(outs):
            res = []
            for o in outs:
                if o.shape[0] == case.H and o.shape[1] == case.S:
                    o = o.transpose(0, 1)
                res.append(o)
            return torch.stack(res)

    return {
        "fn": fn,
        "output": output,
        "flops": ctx["sparse_flops"],
        "computes": "same layout",
        "comparable": True,
        "extra": extra,
    }


def _fa4(case: Case, inp: Inputs, ctx):
    import torch

    if inp.device != "cuda":
        raise Skip("needs CUDA")
    try:
        from flash_attn.cute import flash_attn_func
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    except Exception as e:
        raise Skip(f"flash_attn.cute (FA4) not importable: {type(e).__name__}: {e}")
    from sparsek.flex import _ordered, full_blocks

    lay = inp.layout
    dev = inp.q[0].device
    grid = lay.grid
    mask = lay.to_mask().astype(bool).reshape(grid.batch, grid.heads, grid.row_blocks, grid.col_blocks)
    full = full_blocks(grid, case.causal)
    kv_n, kv_i = _ordered(mask & ~full)
    f_n, f_i = _ordered(mask & full)
    t = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in (kv_n, kv_i, f_n, f_i)]

    def tensors(expand):
        ts = t
        if expand:
            ts = [x.expand(case.B, case.H, *x.shape[2:]).contiguous() for x in t]
        return BlockSparseTensorsTorch(
            mask_block_cnt=ts[0], mask_block_idx=ts[1], full_block_cnt=ts[2], full_block_idx=ts[3],
            block_size=(grid.block_rows, grid.block_cols),
        )

    bst = tensors(False)
    try:
        o = flash_attn_func(inp.q[0], inp.k[0], inp.v[0], causal=case.causal, block_sparse_tensors=bst)
        expanded = False
    except Exception:
        if grid.batch == case.B and grid.heads == case.H:
            raise
        bst = tensors(True)
        expanded = True
    del t

    def fn(i):
        o = flash_attn_func(inp.q[i], inp.k[i], inp.v[i], causal=case.causal, block_sparse_tensors=bst)
        return o[0] if isinstance(o, tuple) else o

    return {
        "fn": fn,
        "output": lambda o: o,
        "flops": ctx["sparse_flops"],
        "computes": "same layout (mask/full block lists, causal flag)",
        "comparable": True,
        "extra": {"block_lists_expanded_to_BH": expanded},
    }


PEER_MAKERS = {
    "sdpa_cudnn": _sdpa("cudnn"),
    "sdpa_flash": _sdpa("flash"),
    "flex": _flex(False),
    "flex_flash": _flex(True),
    "flashinfer": _flashinfer,
    "fa4": _fa4,
}

# ---------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------


def reference_check(case: Case, inp: Inputs, out) -> dict:
    """SparseK's output on a slice of queries (batch 0, up to 2 heads, up to
    256 queries from the middle) against float32 torch math on the same
    block mask and causal rule."""
    import torch

    lay = inp.layout
    q, k, v = inp.q[0], inp.k[0], inp.v[0]
    heads = list(range(min(2, case.H)))
    q0 = min(case.S // 2, max(0, case.S - 256))
    q1 = min(case.S, q0 + 256)
    mask = lay.to_mask().astype(bool).reshape(lay.batch, lay.heads, lay.row_blocks, lay.col_blocks)[0]
    worst = 0.0
    for h in heads:
        m = mask[h if lay.heads > 1 else 0]
        rows = np.arange(q0, q1) // lay.block_rows
        allow = np.repeat(m[rows], lay.block_cols, axis=1)[:, : case.S]
        allow = torch.from_numpy(allow).to(q.device)
        if case.causal:
            qi = torch.arange(q0, q1, device=q.device)[:, None]
            ki = torch.arange(case.S, device=q.device)[None, :]
            allow = allow & (ki <= qi)
        hk = h // (case.H // case.Hkv)
        s = (q[0, q0:q1, h].float() @ k[0, :, hk].float().T) / math.sqrt(case.D)
        s = s.masked_fill(~allow, float("-inf"))
        p = torch.softmax(s, dim=-1)
        p = torch.nan_to_num(p, nan=0.0)
        ref = p @ v[0, :, hk].float()
        worst = max(worst, (out[0, q0:q1, h].float() - ref).abs().max().item())
    tol = 2e-2 if case.dtype == "bfloat16" else 4e-3
    return {"rows": [q0, q1], "heads": heads, "max_abs_diff": worst, "tolerance": tol, "pass": worst <= tol}


def case_record(case: Case, layout) -> tuple:
    """The case's record (shape, layout, FLOP counts), printed as its header
    line; returns (rec, actual FLOPs of the selected blocks, dense-equivalent
    FLOPs)."""
    rec = {"name": case.name, "group": case.group, "case": asdict(case), "systems": {}}
    selected = layout.selected_blocks(case.B, case.H)
    sparse_flops = 4.0 * case.D * layout.block_rows * layout.block_cols * selected
    dense_flops = 4.0 * case.B * case.H * case.S * case.S * case.D
    dense_equiv = dense_flops * ((case.S + 1) / (2 * case.S) if case.causal else 1.0)
    rec.update(
        {
            "shape": {"B": case.B, "H": case.H, "Hkv": case.Hkv, "S": case.S, "D": case.D},
            "dtype": case.dtype,
            "block": [layout.block_rows, layout.block_cols],
            "layout": repr(layout),
            "layout_slices": layout.slices,
            "density": layout.density,
            "selected_blocks": selected,
            "actual_flops": sparse_flops,
            "dense_flops": dense_flops,
            "dense_equiv_flops": dense_equiv,
        }
    )
    print(f"[{case.name}] B{case.B} H{case.H} S{case.S} D{case.D} {case.dtype} {case.pattern} "
          f"causal={case.causal} density={layout.density:.4f} blocks={selected}", flush=True)
    return rec, sparse_flops, dense_equiv


def make_inputs(case: Case, args, layout) -> Inputs:
    """q, k, v drawn once (seeded) in the case's dtype, plus enough rotated
    copies that one pass over them exceeds the L2."""
    import torch

    dev = torch.device(args.device)
    dt = getattr(torch, case.dtype)
    elem = torch.finfo(dt).bits // 8
    set_bytes = 4 * case.B * case.S * case.H * case.D * elem
    n_rot = max(1, min(args.max_copies, math.ceil(args.rotate_mb * 2**20 / set_bytes)))
    gen = torch.Generator(device=dev).manual_seed(1234 + case.S + case.H)
    base = [torch.randn(case.B, case.S, h, case.D, generator=gen, device=dev, dtype=torch.float32).to(dt)
            for h in (case.H, case.Hkv, case.Hkv)]
    return Inputs(
        q=[base[0]] + [base[0].clone() for _ in range(n_rot - 1)],
        k=[base[1]] + [base[1].clone() for _ in range(n_rot - 1)],
        v=[base[2]] + [base[2].clone() for _ in range(n_rot - 1)],
        layout=layout, device=args.device, n_rot=n_rot,
    )


def rates(case: Case, meas: dict, flops: float, dense_equiv: float) -> dict:
    """A timed system's figures: the measurement, status ok, TFLOPS actual
    and dense-equivalent, us per head."""
    t = meas["time_ms"] * 1e-3
    out = dict(meas)
    out.update({"status": "ok", "flops": flops, "tflops_actual": flops / t / 1e12,
                "tflops_dense_equiv": dense_equiv / t / 1e12, "us_per_head": meas["time_ms"] * 1e3 / (case.B * case.H)})
    return out


def compare(o, ref) -> dict:
    """o against the reference output: max |diff| and RMSE (None when the
    shapes differ), and whether o holds a NaN."""
    import torch

    res = {"nan_in_output": bool(torch.isnan(o).any().item())}
    if tuple(o.shape) != tuple(ref.shape):
        res.update(max_abs_diff_vs_sparsek=None, compare_note=f"output shape {tuple(o.shape)} differs from {tuple(ref.shape)}")
        return res
    d = o.float() - ref.float()
    res.update(max_abs_diff_vs_sparsek=d.abs().max().item(), rmse_vs_sparsek=d.square().mean().sqrt().item())
    return res


def run_peer(name, maker, case: Case, inp: Inputs, ctx: dict, args, timer: Timer, ref_out, rec: dict, finish) -> None:
    """One peer: made (maker(case, inp, ctx) -> spec), run once and compared
    with ref_out before timing, then timed; a Skip or a failure is recorded
    in rec["systems"][name] with its reason."""
    import torch

    try:
        t0 = time.perf_counter()
        spec = maker(case, inp, ctx)
        first = spec["fn"](0)
        if args.device == "cuda":
            torch.cuda.synchronize()
        setup_s = time.perf_counter() - t0
        o = spec["output"](first)
        extra = dict(spec.get("extra", {}))
        extra["setup_s"] = setup_s
        extra["computes"] = spec["computes"]
        if ref_out is not None:
            extra.update(compare(o, ref_out))
            extra["comparable"] = spec["comparable"]
        else:
            extra["nan_in_output"] = bool(torch.isnan(o).any().item())
        del first, o
        meas = timer.measure(spec["fn"], inp.n_rot)
        finish(name, meas, spec["flops"], extra)
        del spec
    except Skip as s:
        rec["systems"][name] = {"status": "skipped", "reason": str(s)}
        print(f"    {name:<11} skipped: {s}", flush=True)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        rec["systems"][name] = {"status": "error", "error": msg[:2000], "traceback": traceback.format_exc(limit=6)[-4000:]}
        print(f"    {name:<11} ERROR {msg[:300]}", flush=True)
    finally:
        ctx.pop("_keep", None)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()


def run_case(case: Case, args, timer: Timer, ctx_global: dict) -> dict:
    import torch

    import sparsek

    t0 = time.perf_counter()
    layout = build_layout(case)
    layout_build_s = time.perf_counter() - t0
    rec, sparse_flops, dense_equiv = case_record(case, layout)
    rec["layout_build_s"] = layout_build_s
    inp = make_inputs(case, args, layout)
    n_rot = inp.n_rot
    rec["rotation_copies"] = n_rot
    rec["rotation_bytes"] = n_rot * 4 * case.B * case.S * case.H * case.D * inp.q[0].element_size()
    ctx = dict(ctx_global)
    ctx["sparse_flops"] = sparse_flops

    def finish(name, meas, flops, extra):
        out = rates(case, meas, flops, dense_equiv)
        out.update(extra)
        rec["systems"][name] = out
        print(f"    {name:<11} {meas['time_ms']:9.3f} ms  {out['tflops_actual']:7.1f} TFLOPS actual  "
              f"{out['tflops_dense_equiv']:7.1f} dense-equiv", flush=True)

    # --- SparseK (the reference for the peers) ---------------------------
    # "sparsek" is the library's own kernel choice (the Hopper kernel where
    # it covers the case); "sparsek_sm80" forces the portable kernel, so the
    # two are recorded side by side in the same run.
    ref_out = None
    sk_variants = [("sparsek", None)]
    if args.device == "cuda" and "sparsek_sm80" in args.peers:
        sk_variants.append(("sparsek_sm80", "cuda_sm80"))
    for sk_name, sk_backend in sk_variants:
        try:
            outs = [torch.empty_like(x) for x in inp.q]
            t0 = time.perf_counter()
            plan = sparsek.plan_attention(inp.q[0], inp.k[0], inp.v[0], layout, causal=case.causal,
                                          backend=sk_backend)
            if args.device == "cuda":
                torch.cuda.synchronize()
            setup_s = time.perf_counter() - t0

            def sk_fn(i, plan=plan, outs=outs):
                return plan.run(inp.q[i], inp.k[i], inp.v[i], out=outs[i])

            outs[0].fill_(float("nan"))
            sk_fn(0)
            if args.device == "cuda":
                torch.cuda.synchronize()
            this_out = outs[0].clone()
            extra = {"setup_s": setup_s, "workspace_bytes": getattr(plan, "workspace_size", 0),
                     "nan_in_output": bool(torch.isnan(this_out).any().item())}
            extra["reference_check"] = reference_check(case, inp, this_out)
            if ref_out is None:
                ref_out = this_out
            else:
                extra["max_abs_diff_vs_sparsek"] = (this_out.float() - ref_out.float()).abs().max().item()
            meas = timer.measure(sk_fn, n_rot)
            # Planning alone (sk_attention_plan), for the record.
            if args.device == "cuda":
                pm = timer.measure(lambda i, plan=plan: plan.replan(), 1)
                extra["plan_ms"] = pm["time_ms"]
            finish(sk_name, meas, sparse_flops, extra)
            del plan, outs
        except Exception as e:
            rec["systems"][sk_name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                                       "traceback": traceback.format_exc(limit=4)}
            print(f"    {sk_name:<11} ERROR {type(e).__name__}: {e}", flush=True)

    # --- peers -------------------------------------------------------------
    for name in args.peers:
        if name in PEER_MAKERS:  # the SparseK variants ran above; --fp8's systems run in fp8.py
            run_peer(name, PEER_MAKERS[name], case, inp, ctx, args, timer, ref_out, rec, finish)
    # Keep compiled functions for later cases.
    for key in ("flex_fn", "flex_flash_fn"):
        if key in ctx:
            ctx_global[key] = ctx[key]
    del inp, ref_out
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return rec


# ---------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------


def _cmd(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return None


def _version(mod):
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "present")
    except Exception as e:
        return f"not importable ({type(e).__name__}: {str(e)[:200]})"


def environment(args) -> dict:
    import torch

    import sparsek

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton"),
        "flashinfer": _version("flashinfer"),
        "sparsek_version": sparsek.version(),
        "sparsek_build": sparsek.build_info(),
        "sparsek_library": str(sparsek.LIBRARY_PATH),
        "sparsek_devices": [d._asdict() for d in sparsek.devices()],
    }
    try:
        import flash_attn.cute  # noqa: F401

        env["flash_attn_cute"] = "importable"
    except Exception as e:
        env["flash_attn_cute"] = f"not importable ({type(e).__name__}: {str(e)[:200]})"
    if args.device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(
            {
                "gpu": torch.cuda.get_device_name(0),
                "sm_count": p.multi_processor_count,
                "gpu_memory_bytes": p.total_memory,
                "l2_bytes": getattr(p, "L2_cache_size", None),
                "driver": _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
                "nvidia_smi": _cmd(["nvidia-smi", "--query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit", "--format=csv,noheader"]),
            }
        )
    else:
        env["gpu"] = None
    return env


def git_commit() -> str | None:
    out = _cmd(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    return out or None


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON path")
    p.add_argument("--cases", default=",".join(GROUPS),
                   help=f"comma list of groups ({','.join(GROUPS)}) or case names; default all")
    p.add_argument("--peers", default=",".join(ALL_PEERS), help=f"comma list of {','.join(ALL_PEERS)}")
    p.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of the suite")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: smoke-test the script without a GPU (SparseK CPU backend, compiled Flex on CPU)")
    p.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    p.add_argument("--iters", type=int, default=30, help="timed runs per system (>= 20)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=20.0,
                   help="cap on timed seconds per system and case (never fewer than 20 runs)")
    p.add_argument("--rotate-mb", type=float, default=512.0,
                   help="bytes of Q, K, V, O copies to rotate through (several times the 50-60 MB L2)")
    p.add_argument("--max-copies", type=int, default=64)
    p.add_argument("--max-dense-seq", type=int, default=262144,
                   help="longest sequence for which the dense SDPA baselines run")
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds: start no new case after this (0 = no limit); the JSON is written after each case")
    p.add_argument("--site", action="append", default=[],
                   help="extra site directory with carried peers (e.g. /tmp/site); its .pth files are processed")
    p.add_argument("--backward", action="store_true",
                   help="time the attention backward instead (bench/backward.py: issue 29's cases; "
                   "SparseK, Flex and cuDNN SDPA backward)")
    p.add_argument("--fp8", action="store_true",
                   help="the FP8 (e4m3) forward instead (bench/fp8.py: issue 32's cases; SparseK bf16 and FP8, "
                   "flashinfer FP8, cuDNN SDPA)")
    p.add_argument("--resume", default=None,
                   help="an earlier results JSON: its cases are kept and not run again")
    args = p.parse_args(argv)
    args.peers = [x for x in args.peers.split(",") if x]
    for x in args.peers:
        if x not in ALL_PEERS:
            p.error(f"unknown peer {x!r}")
    if "sparsek" not in args.peers:
        args.peers.insert(0, "sparsek")
    if args.backward and args.fp8:
        p.error("--backward and --fp8 are separate runs")
    if args.iters < 20:
        p.error("--iters must be >= 20")
    return args


def select_cases(args):
    wanted = [x for x in args.cases.split(",") if x]
    tiny = args.quick and args.device == "cpu"
    if args.backward:  # issue 29's cases: named ones, or all of them
        from backward import backward_cases

        all_cases = backward_cases(Case, args.quick, tiny=tiny)
        names = [w for w in wanted if w not in GROUPS and w != "backward"]
        groups = [] if names else ["backward"]
    elif args.fp8:  # issue 32's cases
        from fp8 import fp8_cases

        all_cases = fp8_cases(Case, args.quick, tiny=tiny)
        names = [w for w in wanted if w not in GROUPS and w != "fp8"]
        groups = [] if names else ["fp8"]
    else:
        all_cases = make_cases(GROUPS, args.quick, args.max_dense_seq, tiny=tiny)
        names = [w for w in wanted if w not in GROUPS]
        groups = [w for w in wanted if w in GROUPS]
    unknown = set(names) - {c.name for c in all_cases}
    if unknown:
        raise SystemExit(f"unknown cases: {sorted(unknown)}; known: {[c.name for c in all_cases]}")
    return [c for c in all_cases if c.group in groups or c.name in names]


def main(argv=None) -> int:
    args = parse_args(argv)
    import site

    for d in args.site:  # after the machine's own packages; .pth files honoured
        site.addsitedir(d)
    import torch

    cases = select_cases(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --device cpu for a smoke test")
    results = {
        "schema": SCHEMA,
        "commit": args.commit or git_commit(),
        "quick": args.quick,
        "args": {k: v for k, v in vars(args).items()},
        "env": environment(args),
        "cases": [],
    }
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.resume and Path(args.resume).exists():
        old = json.loads(Path(args.resume).read_text())
        ref_names = ("sparsek", "sparsek_bf16")  # the reference system of each mode (--fp8: sparsek_bf16)
        done = {c["name"] for c in old.get("cases", [])
                if any(c.get("systems", {}).get(n, {}).get("status") for n in ref_names)}
        results["cases"] = [c for c in old.get("cases", []) if c["name"] in done]
        results["resumed_from"] = str(args.resume)
        cases = [c for c in cases if c.name not in done]
        print(f"resuming: {len(done)} cases kept from {args.resume}")
    try:  # many shapes: keep compiled FlexAttention kernels instead of falling back to eager
        import torch._dynamo

        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
    except Exception:
        pass
    timer = Timer(args.device, args.iters, args.warmup, args.max_seconds)
    ctx_global = {}
    t_start = time.perf_counter()
    for case in cases:
        if args.time_limit and time.perf_counter() - t_start > args.time_limit:
            results.setdefault("not_run", []).append(case.name)
            print(f"[{case.name}] not run: --time-limit {args.time_limit:.0f} s reached", flush=True)
            continue
        try:
            if args.backward:
                from backward import run_backward_case

                rec = run_backward_case(case, args, timer, ctx_global, build_layout)
            elif args.fp8:
                from fp8 import run_fp8_case

                rec = run_fp8_case(case, args, timer, SimpleNamespace(**globals()))
            else:
                rec = run_case(case, args, timer, ctx_global)
        except Exception as e:  # a case that could not even be set up
            rec = {"name": case.name, "group": case.group, "case": asdict(case),
                   "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6), "systems": {}}
            print(f"[{case.name}] ERROR {type(e).__name__}: {e}", flush=True)
        results["cases"].append(rec)
        results["elapsed_s"] = time.perf_counter() - t_start
        # Written after every case, so a run cut short keeps what it measured.
        out_path.write_text(json.dumps(results, indent=1, default=str))
    results["elapsed_s"] = time.perf_counter() - t_start  # also when --resume left nothing to run
    out_path.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out_path} ({len(results['cases'])} cases, {results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
