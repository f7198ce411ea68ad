"""Context parallelism, the host-side pieces (numpy, CPU backend).

One self-attention (Sq = Sk = seq) with the token axis split over R ranks
(include/sparsek.h "Context parallel", docs/perf/context_parallel.md):

- ``cp_shard``: a rank's chunks as global token ranges;
- ``cp_balance``: chunk boundaries balanced by the library's cost model
  (sk_cp_balance), for ``CpPlan(chunk_starts=...)``; ``CpPlan.predict``
  gives each rank's predicted time and blocks (sk_cp_predict);
- ``CpPlan``: from the GLOBAL layout, which remote K/V blocks each rank
  needs (deduplicated), and the bytes every ordered pair of ranks
  exchanges;
- ``cp_attention_simulated``: the whole R-rank run on the CPU backend, one
  thread per rank through the simulated communicator, gathered back into
  global O and LSE (for checking the C path from Python);
- ``cp_attention_backward_simulated``: the same for sk_cp_backward, with
  global dQ, dK, dV and the bytes each rank sent;
- ``cp_attention``: one rank's run over a torch.distributed process group
  (gloo for CPU tensors, NCCL for CUDA tensors), in cp_torch.py (imported
  on the first call: numpy users do not need torch);
- ``cp_attention_backward``: its backward over the same group (and
  cp_attention's autograd), in cp_torch_backward.py.
"""

from __future__ import annotations

import threading
from ctypes import byref, c_int32, c_int64, c_size_t, c_void_p, sizeof

import numpy as np

from ._arrays import _numpy_dtype, _torch_dtype
from ._lib import (
    Backend,
    CpSharding,
    DType,
    F,
    Mask,
    SkCpCost,
    SkCpDesc,
    SparseKError,
    check,
    status_name,
)
from .cp_blob import PlanBlob
from .layout import Layout

_SHARDINGS = {"contiguous": CpSharding.CONTIGUOUS, "zigzag": CpSharding.ZIGZAG}


def _sharding(name) -> CpSharding:
    if name not in _SHARDINGS:
        raise ValueError(f"sharding = {name!r} must be 'contiguous' or 'zigzag'")
    return _SHARDINGS[name]


def _plan_dtype(dtype) -> DType:
    """A numpy dtype (float16, float32, ml_dtypes' bfloat16), a torch dtype
    (float16, bfloat16, float32) or the name of one, as an sk dtype."""
    if type(dtype).__module__ == "torch":
        sk = _torch_dtype(dtype)
    elif dtype in ("bfloat16", "bf16"):
        sk = DType.BF16
    else:
        try:
            sk = _numpy_dtype(np.dtype(dtype))
        except TypeError:
            sk = None
    if sk is None:
        raise TypeError(f"dtype {dtype} is not float16, bfloat16 or float32")
    return sk


def _desc(ranks, rank, sharding, batch, seq, heads_q, heads_kv, head_dim, dtype, causal, scale,
          chunk_starts=None):
    """chunk_starts: None (equal chunks) or a C-contiguous int32 numpy
    array the caller keeps alive while the descriptor is used."""
    d = SkCpDesc()
    check(F.sk_cp_desc_init(byref(d), sizeof(d)))
    d.ranks = ranks
    d.rank = rank
    d.sharding = _sharding(sharding)
    d.backend = Backend.CPU
    d.dtype = dtype
    d.batch = batch
    d.seq = seq
    d.heads_q = heads_q
    d.heads_kv = heads_kv
    d.head_dim = head_dim
    d.scale = 0.0 if scale is None else scale
    d.mask = Mask.CAUSAL if causal else Mask.NONE
    if chunk_starts is not None:
        d.chunk_starts = chunk_starts.ctypes.data
    return d


def _starts_array(chunk_starts, ranks, sharding):
    """chunk_starts as an int32 array of C + 1 entries (C = ranks, or
    2 ranks for zigzag), or None; the library checks the values."""
    if chunk_starts is None:
        return None
    want = (2 if _sharding(sharding) == CpSharding.ZIGZAG else 1) * ranks + 1
    try:
        values = [int(x) for x in chunk_starts]
    except TypeError:
        raise TypeError(f"chunk_starts must be None, 'balanced' or a sequence of {want} block "
                        f"indices, got {type(chunk_starts).__name__}") from None
    if len(values) != want:
        raise ValueError(f"chunk_starts has {len(values)} entries; {ranks} ranks "
                         f"({sharding}) need C + 1 = {want}")
    if any(v < -2**31 or v >= 2**31 for v in values):
        raise ValueError(f"chunk_starts = {values} must be int32 block indices")
    return np.ascontiguousarray(values, dtype=np.int32)


def cp_shard(seq, ranks, rank, block=128, sharding="contiguous", chunk_starts=None) -> list:
    """Rank `rank`'s chunks, in its local order, as (start, length) global
    token ranges (their lengths add up to its shard's tokens). chunk_starts:
    None for equal chunks, or the C + 1 chunk starts in blocks (cp_balance)."""
    starts = _starts_array(chunk_starts, ranks, sharding)
    d = _desc(ranks, rank, sharding, 1, seq, 1, 1, 64, 1, False, None, starts)
    tokens, n = c_int64(), c_int32()
    starts, lengths = (c_int64 * 2)(), (c_int64 * 2)()
    check(F.sk_cp_shard(byref(d), rank, block, byref(tokens), byref(n), starts, lengths))
    return [(starts[c], lengths[c]) for c in range(n.value)]


class CpPlan:
    """sk_cp_plan over a global host Layout (seq x seq tokens, square
    blocks), for `ranks` ranks and the problem's sizes. dtype: a numpy dtype
    (float16, float32, or ml_dtypes' bfloat16), a torch dtype or "bfloat16",
    which sets the bytes (and, for cp_attention, the tensors' dtype).
    chunk_starts: None (equal chunks), "balanced" (cp_balance with the
    library's default costs) or the C + 1 chunk starts in blocks; the
    shards (plan.shard), every rank's descriptor and the run follow them."""

    def __init__(self, layout: Layout, ranks, *, batch, heads_q, heads_kv, head_dim,
                 dtype=np.float16, causal=False, sharding="contiguous", scale=None,
                 chunk_starts=None):
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a sparsek.Layout, got {type(layout).__name__}")
        sk_dtype = _plan_dtype(dtype)
        self.dtype = sk_dtype
        self._blob = None
        self.layout = layout
        self.ranks = ranks
        self.block = layout.grid.block_rows
        self.seq = layout.grid.rows
        self.sharding = sharding
        self.causal = causal
        self.dims = (batch, heads_q, heads_kv, head_dim, sk_dtype, scale)
        # The chunk boundaries every rank's descriptor points at (kept alive
        # with the plan): None = equal chunks.
        self._starts = None
        if isinstance(chunk_starts, str):
            if chunk_starts != "balanced":
                raise ValueError(f"chunk_starts = {chunk_starts!r}: None, 'balanced' or a "
                                 "sequence of block indices")
            chunk_starts = cp_balance(layout, ranks, batch=batch, heads_q=heads_q,
                                      heads_kv=heads_kv, head_dim=head_dim, dtype=dtype,
                                      causal=causal, sharding=sharding)
        self._starts = _starts_array(chunk_starts, ranks, sharding)
        d = self.desc(0)
        size = c_size_t()
        view = layout.view()
        check(F.sk_cp_plan_size(byref(d), byref(view), byref(size)))
        # 8-byte aligned host memory that lives with the plan.
        self._buf = np.zeros((size.value + 7) // 8, dtype=np.uint64)
        self.nbytes = size.value
        check(F.sk_cp_plan(byref(d), byref(view), self._buf.ctypes.data, self.nbytes))

    def desc(self, rank) -> SkCpDesc:
        """Rank's descriptor (it points at the plan's chunk starts: keep
        the plan alive while it is used)."""
        batch, hq, hkv, dim, sk_dtype, scale = self.dims
        return _desc(self.ranks, rank, self.sharding, batch, self.seq, hq, hkv, dim, sk_dtype,
                     self.causal, scale, self._starts)

    @property
    def chunk_starts(self):
        """The chunk starts in blocks (C + 1 of them), or None for equal
        chunks."""
        return None if self._starts is None else [int(x) for x in self._starts]

    def predict(self, cost=None) -> list:
        """sk_cp_predict for every rank under this plan's chunks: a list of
        dicts (ns, local_blocks, remote_blocks, tiles). cost: None for
        the library's defaults or (local_block, remote_block, tile) ns."""
        R = self.ranks
        ns = np.zeros(R, dtype=np.float64)
        counts = [np.zeros(R, dtype=np.int64) for _ in range(3)]
        view = self.layout.view()
        check(F.sk_cp_predict(byref(self.desc(0)), byref(view), _cost(cost), ns.ctypes.data,
                              *(c.ctypes.data for c in counts)))
        return [{"ns": float(ns[r]), "local_blocks": int(counts[0][r]),
                 "remote_blocks": int(counts[1][r]), "tiles": int(counts[2][r])}
                for r in range(R)]

    @property
    def address(self) -> int:
        return self._buf.ctypes.data

    def pair(self, src, dst) -> tuple:
        """(bytes, units) rank src sends rank dst (a unit: the K and V rows
        of one key block of one batch and KV head)."""
        b, u = c_int64(), c_int64()
        check(F.sk_cp_plan_bytes(self.address, self.nbytes, src, dst, byref(b), byref(u)))
        return b.value, u.value

    def recv_bytes(self, rank) -> int:
        return sum(self.pair(src, rank)[0] for src in range(self.ranks))

    def send_bytes(self, rank) -> int:
        return sum(self.pair(rank, dst)[0] for dst in range(self.ranks))

    def shard(self, rank) -> list:
        return cp_shard(self.seq, self.ranks, rank, self.block, self.sharding, self.chunk_starts)

    def blob(self) -> PlanBlob:
        """The plan's contents (cp_blob.PlanBlob: units, chunks, layouts)."""
        if self._blob is None:
            self._blob = PlanBlob(self._buf, self.nbytes)
        return self._blob

    def check(self, rank) -> None:
        """The library's whole-plan check (sk_cp_plan_check: sections,
        shards, layouts, units) against rank's descriptor, through
        sk_cp_workspace_size on the CPU backend (its size is not used)."""
        ws = c_size_t()
        check(F.sk_cp_workspace_size(byref(self.desc(rank)), self.address, self.nbytes, byref(ws)))


def _cost(cost):
    """None, or an SkCpCost from (local_block, remote_block, tile) ns."""
    if cost is None:
        return None
    try:
        local, remote, tile = (float(x) for x in cost)
    except (TypeError, ValueError):
        raise TypeError(f"cost must be None or (local_block, remote_block, tile) in ns, "
                        f"got {cost!r}") from None
    return byref(SkCpCost(local, remote, tile))


def cp_balance(layout: Layout, ranks, *, batch, heads_q, heads_kv, head_dim, dtype=np.float16,
               causal=False, sharding="contiguous", cost=None) -> list:
    """Chunk starts (C + 1 block indices, C = ranks or 2 ranks for zigzag)
    that give every chunk the same predicted time under the library's cost
    model (sk_cp_balance, include/sparsek.h): local and remote blocks and
    per-(query block, head) tiles of each rank's rows over the GLOBAL
    layout. Pass them as CpPlan(chunk_starts=...) (or say
    chunk_starts="balanced"); every rank must use the same ones. cost: None
    for the library's defaults, or (local_block, remote_block, tile) ns."""
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a sparsek.Layout, got {type(layout).__name__}")
    d = _desc(ranks, 0, sharding, batch, layout.grid.rows, heads_q, heads_kv, head_dim,
              _plan_dtype(dtype), causal, None)
    n = (2 if _sharding(sharding) == CpSharding.ZIGZAG else 1) * ranks + 1
    out = (c_int32 * n)()
    view = layout.view()
    check(F.sk_cp_balance(byref(d), byref(view), _cost(cost), out, n))
    return list(out)


def _simulated(plan, ranks, size_fn, make_job, call) -> list:
    """Every rank's job on its own thread through one simulated
    communicator: make_job(r, rows) gives the rank's arrays (rows: its
    global token indices), size_fn the workspace call, call(job, comm,
    workspace address) the run. Raises the first rank's error; returns the
    jobs, each with "sent" (sk_comm_info's bytes)."""
    comms = (c_void_p * ranks)()
    check(F.sk_comm_create_simulated(ranks, comms))
    jobs = []
    try:
        for r in range(ranks):
            rows = np.concatenate([np.arange(s, s + n) for s, n in plan.shard(r)])
            d = plan.desc(r)
            ws = c_size_t()
            check(size_fn(byref(d), plan.address, plan.nbytes, byref(ws)))
            job = dict(make_job(r, rows), desc=d, rows=rows, ws_bytes=ws.value,
                       ws=np.empty(ws.value // 8 + 16, dtype=np.uint64))
            jobs.append(job)

        def run(r):
            j = jobs[r]
            aligned = (j["ws"].ctypes.data + 63) // 64 * 64  # the CPU workspace wants 64 bytes
            st = call(j, comms[r], aligned)
            message = F.sk_last_error()
            j["status"] = (st, message.decode("utf-8", "replace") if message else "")

        threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r, j in enumerate(jobs):
            st, message = j["status"]
            if st != 0:
                raise SparseKError(st, status_name(st), f"rank {r}: {message}")
            sent = c_int64()
            check(F.sk_comm_info(comms[r], None, None, byref(sent)))
            j["sent"] = sent.value
    finally:
        for r in range(ranks):
            F.sk_comm_destroy(comms[r])
    return jobs


def cp_attention_simulated(q, k, v, layout: Layout, ranks, *, causal=False,
                           sharding="contiguous", scale=None, chunk_starts=None):
    """The R-rank run on the CPU backend with the simulated communicator:
    shards the global numpy arrays q [B, S, Hq, D], k, v [B, S, Hkv, D],
    runs every rank's sk_cp_forward on its own thread, and returns the
    global (o, lse, plan). Equals sparsek.attention on the same layout up to
    one rounding of the dtype (see include/sparsek.h). chunk_starts: as
    CpPlan's."""
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    plan = CpPlan(layout, ranks, batch=B, heads_q=Hq, heads_kv=Hkv, head_dim=D, dtype=q.dtype,
                  causal=causal, sharding=sharding, scale=scale, chunk_starts=chunk_starts)
    o = np.full_like(q, np.nan)
    lse = np.full((B, Hq, S), np.nan, dtype=np.float32)

    def make_job(r, rows):
        return {"q": np.ascontiguousarray(q[:, rows]), "k": np.ascontiguousarray(k[:, rows]),
                "v": np.ascontiguousarray(v[:, rows]),
                "o": np.empty((B, len(rows), Hq, D), dtype=q.dtype),
                "lse": np.empty((B, Hq, len(rows)), dtype=np.float32)}

    def call(j, comm, ws):
        return F.sk_cp_forward(byref(j["desc"]), plan.address, plan.nbytes, comm,
                               j["q"].ctypes.data, j["k"].ctypes.data, j["v"].ctypes.data,
                               j["o"].ctypes.data, j["lse"].ctypes.data, ws, j["ws_bytes"], None)

    for j in _simulated(plan, ranks, F.sk_cp_workspace_size, make_job, call):
        o[:, j["rows"]] = j["o"]
        lse[:, :, j["rows"]] = j["lse"]
    return o, lse, plan


def cp_attention_backward_simulated(q, k, v, o, lse, do, layout: Layout, ranks, *, causal=False,
                                    sharding="contiguous", scale=None, chunk_starts=None):
    """The R-rank backward on the CPU backend with the simulated
    communicator: shards the global numpy arrays (q, o, do [B, S, Hq, D];
    k, v [B, S, Hkv, D]; the forward's GLOBAL lse [B, Hq, S] fp32), runs
    every rank's sk_cp_backward on its own thread, and returns the global
    (dq, dk, dv, plan, sent): sent[r] the bytes rank r sent (the forward's
    K/V plus the fp32 dK/dV of the units it received). Equals
    sparsek.attention_backward up to one rounding of the dtype plus fp32
    noise (include/sparsek.h)."""
    q, k, v, o, do = (np.ascontiguousarray(x) for x in (q, k, v, o, do))
    lse = np.ascontiguousarray(lse, dtype=np.float32)
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    plan = CpPlan(layout, ranks, batch=B, heads_q=Hq, heads_kv=Hkv, head_dim=D, dtype=q.dtype,
                  causal=causal, sharding=sharding, scale=scale, chunk_starts=chunk_starts)
    grads = [np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)]

    def make_job(r, rows):
        job = {n: np.ascontiguousarray(x[:, rows]) for n, x in
               (("q", q), ("k", k), ("v", v), ("o", o), ("do", do))}
        job["lse"] = np.ascontiguousarray(lse[:, :, rows])
        job["grads"] = [np.empty((B, len(rows)) + g.shape[2:], dtype=q.dtype) for g in grads]
        return job

    def call(j, comm, ws):
        st = F.sk_cp_backward_prepare(byref(j["desc"]), plan.address, plan.nbytes, ws,
                                      j["ws_bytes"], None)
        if st != 0:
            return st
        return F.sk_cp_backward(byref(j["desc"]), plan.address, plan.nbytes, comm,
                                *(j[n].ctypes.data for n in ("q", "k", "v", "o", "lse", "do")),
                                *(g.ctypes.data for g in j["grads"]), ws, j["ws_bytes"], None)

    jobs = _simulated(plan, ranks, F.sk_cp_backward_workspace_size, make_job, call)
    for j in jobs:
        for g, part in zip(grads, j["grads"]):
            g[:, j["rows"]] = part
    return grads[0], grads[1], grads[2], plan, [j["sent"] for j in jobs]


def cp_attention(q, k, v, plan: CpPlan, group=None, *, out=None, lse=None, exchange="all_to_all",
                 stats=None):
    """This rank's share of one context-parallel attention forward, over a
    torch.distributed process group. Call it on every rank of `group`.

    q [B, S_r, Hq, D], k and v [B, S_r, Hkv, D]: this rank's shard (its
    chunks' tokens in global order, packed along S: plan.shard(rank) gives
    them as (start, length) global token ranges; sk_cp_shard). Torch
    tensors of the plan's dtype: CPU tensors (any of float16, bfloat16,
    float32; CPU backend, passes in fp32) with a gloo group, or CUDA tensors
    (float16 / bfloat16) with an NCCL group on the current device
    (torch.cuda.set_device(local_rank) first). The last dimension must be
    contiguous.

    plan: the CpPlan of the GLOBAL layout (seq x seq, square blocks),
    identical on every rank (build it on each from the same layout and
    arguments); ranks = the group's size. It fixes the mask (causal) and the
    scale. group: None for the default group.

    Returns (o [B, S_r, Hq, D] in the dtype, lse float32 [B, Hq, S_r],
    natural log, -inf where a row has no admissible key and then o = 0),
    equal to the rows of sparsek.attention on the global tensors up to
    one rounding of the dtype (CPU) or that plus the rounding of the two
    partial outputs (CUDA: the kernels write O in the dtype before the
    fp32 merge). out, lse: optional outputs of those shapes and dtypes.

    The exchange moves exactly the plan's bytes (plan.send_bytes(rank) out,
    plan.recv_bytes(rank) in): exchange="all_to_all" (one
    all_to_all_single with the pairs' byte counts, the default) or "p2p"
    (batch_isend_irecv, one send and one receive per non-empty pair; with
    NCCL make one collective on the group before its first use, torch's
    rule for a first batch_isend_irecv). It runs asynchronously while the
    local passes compute. exchange="library" (CUDA tensors, an NCCL group,
    torch >= 2.8) hands the rank's whole run to the library's sk_cp_forward
    over the group's own NCCL communicator (ProcessGroupNCCL._comm_ptr()):
    packing and exchange on a side stream under the local passes, the
    remote passes merged in the kernel on Hopper; the same result rule
    (cp_library.py). Its stats report the plan's bytes, which is what the
    library sends. stats: an optional dict, filled with sent_bytes,
    recv_bytes (what was handed to torch.distributed), plan_send_bytes,
    plan_recv_bytes, exchange.

    Every argument is checked before any communication (TypeError /
    ValueError naming it: plan, group, q/k/v shape, dtype and device, out,
    lse); the plan itself is checked whole by the library on its first use
    for a rank (sk_cp_plan_check), so ranks sharing a corrupt plan refuse
    together.

    Autograd: when grad mode is on and q, k or v requires grad, o is
    differentiable (its backward is cp_attention_backward over the same
    group, so every rank must run its backward; exchange="library"
    forwards take their gradients over "all_to_all"); lse is returned
    without a gradient, and out= / lse= are refused (ValueError naming
    them). Otherwise it runs under torch.no_grad.
    """
    from .cp_torch_backward import cp_attention as run

    return run(q, k, v, plan, group, out=out, lse=lse, exchange=exchange, stats=stats)


def cp_attention_backward(q, k, v, o, lse, do, plan: CpPlan, group=None, *, exchange="all_to_all",
                          dq=None, dk=None, dv=None, stats=None):
    """This rank's share of the context-parallel attention backward over a
    torch.distributed process group. Call it on every rank of `group`.

    q, k, v, plan, group as given to cp_attention; o [B, S_r, Hq, D] and
    lse float32 [B, Hq, S_r] as cp_attention returned them (the rows of the
    GLOBAL forward: the backward needs no merge); do = dL/do, o's shape and
    dtype. Returns (dq [B, S_r, Hq, D], dk, dv [B, S_r, Hkv, D]) in the
    dtype: the rows of sparsek.attention_backward on the global tensors up
    to one rounding of the dtype plus fp32 noise (CPU; CUDA: plus the
    passes' own rounding in the dtype). dk, dv sum every rank's share of
    this rank's keys (GQA: over the query heads of each KV head).
    dq, dk, dv: optional outputs of those shapes and the dtype.

    The run (cp_torch_backward.py; docs/perf/context_parallel.md): K/V
    exchanged again as in the forward, the backward of each chunk's local
    and remote pass, the received blocks' dK/dV returned to their owners in
    fp32 along the reverse of the plan's pairs, sums in a fixed order
    (bitwise repeatable). Bytes sent: plan.send_bytes(rank) (K/V) +
    plan.recv_bytes(rank) x 4 / esize (gradients). exchange: "all_to_all"
    (default) or "p2p" as in cp_attention. stats: an optional dict, filled
    with sent_bytes, kv_sent_bytes, grad_sent_bytes, grad_recv_bytes,
    exchange.

    Every argument is checked before any communication (TypeError /
    ValueError naming it).
    """
    from .cp_torch_backward import cp_attention_backward as run

    return run(q, k, v, o, lse, do, plan, group, exchange=exchange, dq=dq, dk=dk, dv=dv, stats=stats)
