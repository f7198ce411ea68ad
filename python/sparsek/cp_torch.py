"""Context parallelism over torch.distributed: one rank's forward
(sparsek.cp_attention; its docstring, in context_parallel.py, is the API).

A rank's run, from the plan (cp_blob.PlanBlob) and torch ops only:
  1. pack: for every peer, the units it needs (K rows then V rows of one
     key block, batch, KV head; the pair's plan order) into one send buffer
     in peer order;
  2. exchange, started asynchronously: all_to_all_single with the pairs'
     byte counts (a collective: every rank takes part, empty pairs
     included), or batch_isend_irecv of one send and one receive per peer
     with a non-empty pair ("p2p");
  3. meanwhile, per chunk, the local pass: sparsek.attention over the
     shard's own keys (a prefix of the shard: with causal, up to the
     chunk's end, which keeps the bottom-right mask right) with the chunk's
     local layout and the plan's mask;
  4. wait, unpack the received units into the remote K/V buffers
     [B, remote_keys, Hkv, D] at their slots (zeros elsewhere: never read);
  5. per chunk, the remote pass (received blocks, slot layout, no mask: with
     causal every planned remote block lies below the diagonal) and the LSE
     merge in fp32, O rounded once to the dtype.

CUDA tensors: the passes run in the dtype (the CUDA kernels take f16/bf16
and write O in it), so a merged row carries the partials' rounding too.
CPU tensors: the passes run in fp32 (as the C CPU run: cp_run.c), so f16 /
bf16 results are one rounding of an fp32-exact merge.

What is prepared once per (plan, rank, device) is cached on the plan: the
library's check of the whole plan, the pack/unpack indices, the chunks'
Layouts (so sparsek's plan cache keeps their attention plans).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ._arrays import _torch_dtype
from ._lib import DType
from .attention import attention
from .layout import Layout

_EXCHANGES = ("all_to_all", "p2p", "library")
_MERGE_ROWS = 1 << 15  # tokens per merge step: bounds the fp32 temporaries


class _Pack:
    """Where one pair's units sit: full blocks as (batch, block, head)
    index tensors over a [B, blocks, block, Hkv, D] view, and the tail
    block's units (the global last block, if short) as (batch, head)."""

    def __init__(self, units: np.ndarray, block_of, tail_block: int, device):
        # The plan sorts units by block, so the tail block's come last and
        # this is the plan's order; sender and receiver split alike anyway.
        tail = units[:, 0] == tail_block
        full, last = units[~tail], units[tail]
        as_t = lambda a: torch.as_tensor(np.ascontiguousarray(a, dtype=np.int64), device=device)  # noqa: E731
        self.b, self.j, self.h = as_t(full[:, 1]), as_t(block_of(full)), as_t(full[:, 2])
        self.tail_b, self.tail_h = as_t(last[:, 1]), as_t(last[:, 2])
        self.n_full, self.n_tail = len(full), len(last)


class _RankView:
    """Rank r's part of a plan, ready for torch on one device."""

    def __init__(self, plan, r: int, device):
        plan.check(r)  # the library's check of all of the plan, once
        blob = plan.blob()
        R, blk = plan.ranks, blob.block
        self.r = r
        rp = blob.rank(r)
        self.tokens = int(rp["tokens"])
        self.remote_keys = int(rp["remote_keys"])
        self.send_bytes = int(rp["send_bytes"])
        self.recv_bytes = int(rp["recv_bytes"])
        nb = -(-blob.seq // blk)
        tail = blob.seq - (nb - 1) * blk
        self.tail_tokens = tail if tail < blk else 0
        self.tail_block = nb - 1 if self.tail_tokens else -1
        # Own blocks -> shard block index (block_of for packing).
        chunks = [rp["chunk"][c] for c in range(int(rp["chunks"]))]
        lblock = np.full(nb, -1, dtype=np.int64)
        for ch in chunks:
            g, n = int(ch["global_block"]), int(ch["blocks"])
            lblock[g:g + n] = int(ch["q_start"]) // blk + np.arange(n)
        esize = int(blob.header["elem_bytes"])
        row_bytes = int(blob.header["head_dim"]) * esize
        self.send, self.recv, self.send_splits, self.recv_splits = {}, {}, [], []
        for p in range(R):
            out_b, in_b = blob.pair_bytes(r, p), blob.pair_bytes(p, r)
            self.send_splits.append(out_b)
            self.recv_splits.append(in_b)
            if p == r:
                continue
            if out_b:
                units = blob.pair_units(r, p)
                self.send[p] = _Pack(units, lambda u: lblock[u[:, 0]], self.tail_block, device)
            if in_b:
                units = blob.pair_units(p, r)
                self.recv[p] = _Pack(units, lambda u: u[:, 3], self.tail_block, device)
            # The units' own bytes against the plan's pair totals (the
            # mirror of cp_plan.h against the library's accessor).
            for src, dst, nbytes in ((r, p, out_b), (p, r, in_b)):
                u = blob.pair_units(src, dst)
                own = int(2 * blob.unit_tokens(u[:, 0]).sum() * row_bytes)
                if own != nbytes or plan.pair(src, dst)[0] != nbytes:
                    raise ValueError(f"plan: pair {src} -> {dst} units add up to {own} bytes, "
                                     f"the plan says {nbytes}")
        # Full slots come first in the remote buffer, the tail slot (if
        # received) last (cp_plan.c: slots in increasing block order).
        self.remote_full = int(rp["slots"]) - (1 if self.remote_keys % blk else 0)
        lb, lh = int(blob.header["layout_batch"]), int(blob.header["layout_heads"])
        self.chunks = []
        for c, ch in enumerate(chunks):
            entry = {"q_start": int(ch["q_start"]), "tokens": int(ch["tokens"]),
                     "local_keys": int(ch["local_keys"]), "local": None, "remote": None}
            for remote, keys in ((False, entry["local_keys"]), (True, self.remote_keys)):
                offsets, indices = blob.chunk_arrays(r, c, remote)
                if len(indices):
                    entry["remote" if remote else "local"] = Layout.from_bsr(
                        offsets, indices, entry["tokens"], keys, block=blk, batch=lb, heads=lh)
            self.chunks.append(entry)


def _rank_view(plan, r: int, device) -> _RankView:
    cache = plan.__dict__.setdefault("_torch_views", {})
    key = (r, str(device))
    if key not in cache:
        cache[key] = _RankView(plan, r, device)
    return cache[key]


# ---------------------------------------------------------------------------
# Checks (all before any communication)
# ---------------------------------------------------------------------------


def _check_group(plan, group) -> tuple:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("group: torch.distributed is not initialized (init_process_group first)")
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the group")
    if size != plan.ranks:
        raise ValueError(f"group has {size} ranks but the plan was made for ranks = {plan.ranks}")
    return rank, size


def _check_tensors(q, k, v, plan, rank: int, view_tokens) -> None:
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if _torch_dtype(t.dtype) != plan.dtype:
            raise TypeError(f"{name}.dtype = {t.dtype}; the plan was made for "
                            f"{DType(plan.dtype).name} (CpPlan(dtype=...))")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    B, Hq, Hkv, D = plan.dims[:4]
    S = view_tokens
    for t, name, want in ((q, "q", (B, S, Hq, D)), (k, "k", (B, S, Hkv, D)), (v, "v", (B, S, Hkv, D))):
        if tuple(t.shape) != want:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; rank {rank}'s shard of this plan is "
                f"{list(want)} ([B, S_r, H, D], S_r = {S} tokens: {plan.shard(rank)} as "
                f"(start, length) global ranges)")


def _check_device(q, group) -> None:
    backend = str(dist.get_backend(group))
    if q.device.type == "cpu" and backend == "nccl":
        raise ValueError("group: an NCCL group cannot exchange CPU tensors (use gloo)")
    if q.device.type == "cuda" and backend == "gloo":
        raise ValueError("group: a gloo group for CUDA tensors (use NCCL)")
    if q.device.type == "cuda" and q.dtype == torch.float32:
        raise TypeError("q.dtype = torch.float32: CUDA runs float16 or bfloat16")


def _check_out(t, name, shape, dtype, device, others):
    """An output: its shape, dtype, device, and no storage shared with the
    inputs or the other output (rows are written while q is still read)."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} is {tuple(t.shape)} {t.dtype} on {t.device}; it must be "
                         f"{list(shape)} {dtype} on {device}")
    for other, other_name in others:
        if other is not None and t.untyped_storage().data_ptr() == other.untyped_storage().data_ptr():
            raise ValueError(f"{name} shares its storage with {other_name}: pass separate tensors")


# ---------------------------------------------------------------------------
# Pack, exchange, unpack
# ---------------------------------------------------------------------------


def _blocks_view(x: torch.Tensor, n: int, blk: int) -> torch.Tensor:
    """[B, S, H, D] -> its first n blocks as [B, n, blk, H, D] (a view when
    x is packed)."""
    B, _, H, D = x.shape
    return x[:, :n * blk].reshape(B, n, blk, H, D)


def _runs(packs: dict, buf: torch.Tensor, blk: int, tail_tokens: int, D: int):
    """The runs of a send or receive buffer in its order (peers in rank
    order; per peer its full-block units, then its tail-block units):
    (view [n, 2, tokens, D] of buf, index of the units in the K / V view
    they come from or go to, tail?). Full units index a [B, blocks, blk,
    Hkv, D] view by (batch, block, :, head); tail units a [B, tail, Hkv, D]
    view by (batch, :, head)."""
    at = 0
    for p in sorted(packs):
        pk = packs[p]
        for n, t, idx, tail in ((pk.n_full, blk, (pk.b, pk.j, slice(None), pk.h), False),
                                (pk.n_tail, tail_tokens, (pk.tail_b, slice(None), pk.tail_h), True)):
            if n:
                yield buf[at:at + n * 2 * t * D].view(n, 2, t, D), idx, tail
                at += n * 2 * t * D


def _pack(rv: _RankView, k, v, blk: int) -> torch.Tensor:
    """The send buffer: every peer's units in peer order, each unit its K
    rows then its V rows."""
    buf = torch.empty(rv.send_bytes // k.element_size(), dtype=k.dtype, device=k.device)
    n_blocks = rv.tokens // blk
    full = (_blocks_view(k, n_blocks, blk), _blocks_view(v, n_blocks, blk))
    tail = (k[:, n_blocks * blk:], v[:, n_blocks * blk:])
    for out, idx, is_tail in _runs(rv.send, buf, blk, rv.tail_tokens, k.shape[3]):
        ks, vs = tail if is_tail else full
        torch.stack((ks[idx], vs[idx]), dim=1, out=out)
    return buf


def _unpack(rv: _RankView, recv: torch.Tensor, B, Hkv, D, blk: int) -> tuple:
    """The remote K / V [B, remote_keys, Hkv, D]: received units at their
    slots (full slots first, the tail slot last), zeros elsewhere."""
    kr = torch.zeros((B, rv.remote_keys, Hkv, D), dtype=recv.dtype, device=recv.device)
    vr = torch.zeros_like(kr)
    full = (_blocks_view(kr, rv.remote_full, blk), _blocks_view(vr, rv.remote_full, blk))
    s0 = rv.remote_full * blk
    tail = (kr[:, s0:], vr[:, s0:])
    for x, idx, is_tail in _runs(rv.recv, recv, blk, rv.tail_tokens, D):
        kd, vd = tail if is_tail else full
        kd[idx] = x[:, 0]
        vd[idx] = x[:, 1]
    return kr, vr


def _start_exchange(rv: _RankView, send: torch.Tensor, group, how: str):
    """Start the exchange; returns (receive buffer, works to wait on,
    bytes handed to torch.distributed to send)."""
    return _start_bytes(rv.r, send, rv.send_splits, rv.recv_splits, group, how)


def _start_bytes(r: int, send: torch.Tensor, send_splits, recv_splits, group, how: str):
    """Start an exchange of per-peer byte counts (send_splits[p] to peer p,
    recv_splits[p] from it; the backward's gradients travel the reverse of
    the forward's pairs); returns (receive buffer of send's dtype, works to
    wait on, bytes handed to torch.distributed to send)."""
    recv = torch.empty(sum(recv_splits) // send.element_size(), dtype=send.dtype, device=send.device)
    sb, rb = send.view(torch.uint8), recv.view(torch.uint8)
    if how == "all_to_all":
        work = dist.all_to_all_single(rb, sb, list(recv_splits), list(send_splits), group=group,
                                      async_op=True)
        return recv, [work], sb.numel()
    ops, so, ro = [], 0, 0
    for p in range(len(send_splits)):
        if p == r:
            continue
        peer = p if group is None else dist.get_global_rank(group, p)
        n_out, n_in = send_splits[p], recv_splits[p]
        if n_out:
            ops.append(dist.P2POp(dist.isend, sb[so:so + n_out], peer, group))
            so += n_out
        if n_in:
            ops.append(dist.P2POp(dist.irecv, rb[ro:ro + n_in], peer, group))
            ro += n_in
    works = dist.batch_isend_irecv(ops) if ops else []
    return recv, works, so


# ---------------------------------------------------------------------------
# The merge
# ---------------------------------------------------------------------------


def _merge_into(o_dst, lse_dst, oa, la, ob, lb) -> None:
    """o_dst [B, T, Hq, D], lse_dst [B, Hq, T] = the LSE merge of partials
    a and b (b may be None), in fp32, O rounded once; rows empty on both
    sides get O = 0, LSE = -inf. Steps of _MERGE_ROWS tokens bound the
    temporaries."""
    T = o_dst.shape[1]
    for t0 in range(0, T, _MERGE_ROWS):
        t1 = min(T, t0 + _MERGE_ROWS)
        l_a = la[:, :, t0:t1]
        if ob is None:
            if oa.data_ptr() != o_dst.data_ptr():  # else the local pass wrote o_dst itself
                o_dst[:, t0:t1] = oa[:, t0:t1]
            lse_dst[:, :, t0:t1] = l_a
            continue
        l_b = lb[:, :, t0:t1]
        m = torch.maximum(l_a, l_b)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        wa, wb = torch.exp(l_a - m), torch.exp(l_b - m)
        s = wa + wb
        inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
        ca = (wa * inv).transpose(1, 2).unsqueeze(-1)
        cb = (wb * inv).transpose(1, 2).unsqueeze(-1)
        o_dst[:, t0:t1] = oa[:, t0:t1].float() * ca + ob[:, t0:t1].float() * cb
        lse_dst[:, :, t0:t1] = torch.where(s > 0, m + torch.log(s), torch.full_like(s, -float("inf")))


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def cp_attention(q, k, v, plan, group=None, *, out=None, lse=None, exchange="all_to_all",
                 stats=None):
    """sparsek.cp_attention (context_parallel.py documents it)."""
    from .context_parallel import CpPlan

    if not isinstance(plan, CpPlan):
        raise TypeError(f"plan must be a sparsek.CpPlan, got {type(plan).__name__}")
    if exchange not in _EXCHANGES:
        raise ValueError(f"exchange = {exchange!r} must be one of {_EXCHANGES}")
    rank, _ = _check_group(plan, group)
    shard_tokens = sum(n for _, n in plan.shard(rank))
    _check_tensors(q, k, v, plan, rank, shard_tokens)
    _check_device(q, group)
    B, Hq, Hkv, D = plan.dims[:4]
    inputs = [(q, "q"), (k, "k"), (v, "v")]
    _check_out(out, "out", (B, shard_tokens, Hq, D), q.dtype, q.device, inputs)
    _check_out(lse, "lse", (B, Hq, shard_tokens), torch.float32, q.device, inputs + [(out, "out")])
    if exchange == "library":
        from .cp_library import run as run_library

        if out is None:
            out = torch.empty((B, shard_tokens, Hq, D), dtype=q.dtype, device=q.device)
        if lse is None:
            lse = torch.empty((B, Hq, shard_tokens), dtype=torch.float32, device=q.device)
        elif not lse.is_contiguous():
            raise ValueError("lse must be contiguous with exchange = 'library'")
        run_library(q, k, v, plan, group, rank, out, lse)
        if stats is not None:  # the library sends exactly the plan's units
            sent, received = plan.send_bytes(rank), plan.recv_bytes(rank)
            stats.update(sent_bytes=sent, recv_bytes=received, plan_send_bytes=sent,
                         plan_recv_bytes=received, exchange=exchange)
        return out, lse
    rv = _rank_view(plan, rank, q.device)
    blk, causal, scale = plan.block, plan.causal, plan.dims[5]
    # CPU: fp32 passes (the CPU backend's exact type); CUDA: the dtype.
    cdt = torch.float32 if q.device.type == "cpu" else q.dtype
    if out is None:
        out = torch.empty((B, shard_tokens, Hq, D), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((B, Hq, shard_tokens), dtype=torch.float32, device=q.device)

    with torch.no_grad():
        send = _pack(rv, k, v, blk)
        recv, works, sent = _start_exchange(rv, send, group, exchange)
        qc, kc, vc = (x.to(cdt) for x in (q, k, v))
        partial = []
        for ch in rv.chunks:
            q0, n = ch["q_start"], ch["tokens"]
            qi = qc[:, q0:q0 + n]
            if ch["local"] is None:
                oa = torch.zeros((B, n, Hq, D), dtype=cdt, device=q.device)
                la = torch.full((B, Hq, n), -float("inf"), device=q.device)
            else:
                # With the output's dtype the local partial goes straight into
                # out's rows (merged in place below).
                dst = out[:, q0:q0 + n] if cdt == out.dtype else None
                kl, vl = kc[:, :ch["local_keys"]], vc[:, :ch["local_keys"]]
                oa, la = attention(qi, kl, vl, ch["local"], causal=causal, scale=scale,
                                   return_lse=True, out=dst)
            partial.append((oa, la))
        for w in works:
            w.wait()
        del send  # the process group keeps it until its stream is done
        kr, vr = _unpack(rv, recv, B, Hkv, D, blk)
        recv_bytes = recv.numel() * recv.element_size()
        del recv
        krc, vrc = kr.to(cdt), vr.to(cdt)
        for ch, (oa, la) in zip(rv.chunks, partial):
            q0, n = ch["q_start"], ch["tokens"]
            ob = lb = None
            if ch["remote"] is not None:
                ob, lb = attention(qc[:, q0:q0 + n], krc, vrc, ch["remote"], causal=False,
                                   scale=scale, return_lse=True)
            _merge_into(out[:, q0:q0 + n], lse[:, :, q0:q0 + n], oa, la, ob, lb)
    if stats is not None:
        stats.update(sent_bytes=sent, recv_bytes=recv_bytes,
                     plan_send_bytes=rv.send_bytes, plan_recv_bytes=rv.recv_bytes,
                     exchange=exchange)
    return out, lse
