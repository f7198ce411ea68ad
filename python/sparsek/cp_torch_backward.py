"""Context parallelism over torch.distributed, the backward: one rank's
sparsek.cp_attention_backward, and the autograd Function that makes
sparsek.cp_attention differentiable (context_parallel.py documents both).

The same math as the C CPU run (src/core/cp_backward.c; design in
docs/perf/context_parallel.md section 6), with torch ops: given the GLOBAL
O and LSE rows, every term of the single-process backward belongs to one
admissible (row, key) pair, and the forward's passes split the pairs, so
each pass's backward with the global O / LSE rows gives its exact share:
  1. the forward's K/V exchange again (cp_torch's pack / exchange / unpack);
  2. meanwhile, per chunk, the backward of its local pass (the shard's own
     keys, a prefix of the shard, the plan's mask);
  3. per chunk, the backward of its remote pass (received slots, no mask);
  4. the received slots' dK/dV, fp32, packed per peer in the plan's unit
     order (the forward's receive order) and returned to their owners along
     the reverse of the forward's pairs (recv bytes x 4 / esize out);
  5. sums in a fixed order: dQ = local + remote; dK, dV = chunk 0's local +
     chunk 1's local + the returned shares in increasing source rank; then
     each gradient is rounded once to the dtype.
Fixed order, so a repeat is bitwise equal. fp32 on the way back: a share
rounded to bf16 before the owner's sum would add one rounding per rank.
"""

from __future__ import annotations

import torch

from .backward import attention_backward
from .cp_torch import (
    _blocks_view,
    _check_device,
    _check_group,
    _check_out,
    _check_tensors,
    _pack,
    _rank_view,
    _runs,
    _start_bytes,
    _start_exchange,
    _unpack,
)
from .cp_torch import cp_attention as _forward

_BACKWARD_EXCHANGES = ("all_to_all", "p2p")


def _check_backward_args(q, k, v, o, lse, do, plan, group, exchange):
    """Everything before any communication; returns (rank, shard tokens)."""
    from .context_parallel import CpPlan

    if not isinstance(plan, CpPlan):
        raise TypeError(f"plan must be a sparsek.CpPlan, got {type(plan).__name__}")
    if exchange not in _BACKWARD_EXCHANGES:
        raise ValueError(f"exchange = {exchange!r} must be one of {_BACKWARD_EXCHANGES} (the backward "
                         "runs over torch.distributed: the library's CUDA backward is not built)")
    rank, _ = _check_group(plan, group)
    S = sum(n for _, n in plan.shard(rank))
    _check_tensors(q, k, v, plan, rank, S)
    _check_device(q, group)
    B, Hq, _, D = plan.dims[:4]
    for t, name in ((o, "o"), (do, "do")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != (B, S, Hq, D) or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {tuple(t.shape)} {t.dtype} on {t.device}; it must be q's: "
                             f"{[B, S, Hq, D]} {q.dtype} on {q.device}")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor, got {type(lse).__name__}")
    if tuple(lse.shape) != (B, Hq, S) or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(f"lse is {tuple(lse.shape)} {lse.dtype} on {lse.device}; it must be the "
                         f"forward's: {[B, Hq, S]} torch.float32 on {q.device}")
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do")):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous")
    return rank, S


def _returned_order(rv, dk_r, dv_r, blk: int, D: int, esize: int) -> torch.Tensor:
    """The received slots' dK/dV in the forward's receive order (peers in
    rank order, each pair's units in the plan's order, a unit's dK rows
    then its dV rows), fp32: the gradients' send buffer."""
    buf = torch.empty(rv.recv_bytes // esize, dtype=torch.float32, device=dk_r.device)
    full = (_blocks_view(dk_r, rv.remote_full, blk), _blocks_view(dv_r, rv.remote_full, blk))
    s0 = rv.remote_full * blk
    tail = (dk_r[:, s0:], dv_r[:, s0:])
    for out, idx, is_tail in _runs(rv.recv, buf, blk, rv.tail_tokens, D):
        ks, vs = tail if is_tail else full
        torch.stack((ks[idx], vs[idx]), dim=1, out=out)
    return buf


def _add_returned(rv, got: torch.Tensor, dk, dv, blk: int, D: int) -> None:
    """The owner's sum: each peer's returned shares (in the forward's send
    order, peers in increasing rank) added at their blocks' shard rows."""
    n_blocks = rv.tokens // blk
    full = (_blocks_view(dk, n_blocks, blk), _blocks_view(dv, n_blocks, blk))
    tail = (dk[:, n_blocks * blk:], dv[:, n_blocks * blk:])
    for x, idx, is_tail in _runs(rv.send, got, blk, rv.tail_tokens, D):
        kd, vd = tail if is_tail else full
        # One pair's units are distinct (block, batch, head): no index
        # repeats within one assignment.
        kd[idx] += x[:, 0]
        vd[idx] += x[:, 1]


def cp_attention_backward(q, k, v, o, lse, do, plan, group=None, *, exchange="all_to_all", dq=None, dk=None,
                          dv=None, stats=None):
    """sparsek.cp_attention_backward (context_parallel.py documents it)."""
    rank, S = _check_backward_args(q, k, v, o, lse, do, plan, group, exchange)
    B, Hq, Hkv, D = plan.dims[:4]
    inputs = [(q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"), (do, "do")]
    _check_out(dq, "dq", (B, S, Hq, D), q.dtype, q.device, inputs + [(dk, "dk"), (dv, "dv")])
    _check_out(dk, "dk", (B, S, Hkv, D), q.dtype, q.device, inputs + [(dv, "dv")])
    _check_out(dv, "dv", (B, S, Hkv, D), q.dtype, q.device, inputs)
    rv = _rank_view(plan, rank, q.device)
    esize = q.element_size()  # the plan's (checked)
    blk, causal, scale = plan.block, plan.causal, plan.dims[5]
    # CPU: fp32 passes (the CPU backend's exact type); CUDA: the dtype,
    # with fp32 sums.
    cdt = torch.float32 if q.device.type == "cpu" else q.dtype
    f32 = torch.float32
    with torch.no_grad():
        send = _pack(rv, k, v, blk)
        recv, works, sent = _start_exchange(rv, send, group, exchange)
        qc, kc, vc, oc, doc = (x.to(cdt) for x in (q, k, v, o, do))
        dq32 = torch.zeros((B, S, Hq, D), dtype=f32, device=q.device)
        dk32 = torch.zeros((B, S, Hkv, D), dtype=f32, device=q.device)
        dv32 = torch.zeros_like(dk32)
        lse_rows = []
        for ch in rv.chunks:  # local passes, chunk order (the fixed sum)
            q0, n = ch["q_start"], ch["tokens"]
            lse_rows.append(lse[:, :, q0:q0 + n].contiguous())
            if ch["local"] is None:
                continue
            nk = ch["local_keys"]
            gq, gk, gv = attention_backward(qc[:, q0:q0 + n], kc[:, :nk], vc[:, :nk], oc[:, q0:q0 + n],
                                            doc[:, q0:q0 + n], lse_rows[-1], ch["local"], causal=causal,
                                            scale=scale)
            dq32[:, q0:q0 + n] += gq
            dk32[:, :nk] += gk
            dv32[:, :nk] += gv
        for w in works:
            w.wait()
        del send
        kr, vr = _unpack(rv, recv, B, Hkv, D, blk)
        del recv
        krc, vrc = kr.to(cdt), vr.to(cdt)
        dkr = torch.zeros((B, rv.remote_keys, Hkv, D), dtype=f32, device=q.device)
        dvr = torch.zeros_like(dkr)
        for ch, lr in zip(rv.chunks, lse_rows):  # remote passes
            if ch["remote"] is None:
                continue
            q0, n = ch["q_start"], ch["tokens"]
            gq, gk, gv = attention_backward(qc[:, q0:q0 + n], krc, vrc, oc[:, q0:q0 + n], doc[:, q0:q0 + n], lr,
                                            ch["remote"], causal=False, scale=scale)
            dq32[:, q0:q0 + n] += gq
            dkr += gk
            dvr += gv
        del krc, vrc, kr, vr
        gsend = _returned_order(rv, dkr, dvr, blk, D, esize)
        # The reverse of the forward's pairs, in fp32 (4 / esize the bytes).
        widen = lambda splits: [n * 4 // esize for n in splits]  # noqa: E731
        grecv, works, gsent = _start_bytes(rank, gsend, widen(rv.recv_splits), widen(rv.send_splits), group,
                                           exchange)
        for w in works:
            w.wait()
        del gsend
        _add_returned(rv, grecv, dk32, dv32, blk, D)
        outs = []
        for g32, given in ((dq32, dq), (dk32, dk), (dv32, dv)):
            if given is None:
                outs.append(g32.to(q.dtype))  # rounded once
            else:
                given.copy_(g32)
                outs.append(given)
    if stats is not None:
        stats.update(sent_bytes=sent + gsent, kv_sent_bytes=sent, grad_sent_bytes=gsent,
                     grad_recv_bytes=grecv.numel() * grecv.element_size(), exchange=exchange)
    return tuple(outs)


class _CpAttention(torch.autograd.Function):
    """cp_attention with a backward: every rank of the group must run the
    backward too (it exchanges). The LSE output carries no gradient."""

    @staticmethod
    def forward(ctx, q, k, v, plan, group, exchange, stats):
        o, lse = _forward(q, k, v, plan, group, exchange=exchange, stats=stats)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan, ctx.group = plan, group
        # The library's run has no backward: its gradients use all_to_all.
        ctx.exchange = "all_to_all" if exchange == "library" else exchange
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        elif do.stride(-1) != 1:
            do = do.contiguous()
        dq, dk, dv = cp_attention_backward(q, k, v, o, lse, do, ctx.plan, ctx.group, exchange=ctx.exchange)
        return dq, dk, dv, None, None, None, None


def cp_attention(q, k, v, plan, group=None, *, out=None, lse=None, exchange="all_to_all", stats=None):
    """sparsek.cp_attention: differentiable when grad mode is on and any of
    q, k, v requires grad (then out= and lse= are refused: autograd owns
    its outputs); otherwise the torch.no_grad forward of cp_torch.py."""
    needs = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if not needs:
        return _forward(q, k, v, plan, group, out=out, lse=lse, exchange=exchange, stats=stats)
    for t, name in ((out, "out"), (lse, "lse")):
        if t is not None:
            raise ValueError(f"{name}: outputs cannot be given when q, k or v requires grad (autograd "
                             "allocates them); pass None or run under torch.no_grad()")
    return _CpAttention.apply(q, k, v, plan, group, exchange, stats)
