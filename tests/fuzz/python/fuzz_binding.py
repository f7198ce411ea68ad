#!/usr/bin/env python3
"""fuzz_binding.py - an atheris (libFuzzer) harness for the Python binding's
argument handling, on the CPU backend.

Each input drives one call of the binding, picked by its first byte: a
layout builder, Grid / grid_blocks / status_name, a raw Layout handle,
attention, a plan and its runs, attention_topk, bsr_gemm, block_pool,
select_topk, pool_select_topk, layout_from_scores, topk_capacity, or the
layout conversions (from_mask / from_bsr / from_flex, to_mask / to_flex,
copy and pickle). The arguments come from the rest of the bytes
(fuzz_values.py): integers of every size and some non-integers, floats
that change meaning in float32, dtypes, shapes, strides (Fortran order,
reversed, sliced, transposed, stride 0), read-only and misaligned arrays,
outputs aliasing inputs.

Every call must:
- not crash: run it against the ASan + UBSan build of the library
  (`make fuzz-python` does), so a stray read in C is a crash too;
- either be refused with ValueError, TypeError or sparsek.SparseKError
  (any other exception is a finding), leaving its inputs and outputs
  untouched;
- or succeed with its inputs untouched and a result that agrees with a
  tiny naive numpy fp64 reference (fuzz_reference.py): attention (O and
  LSE), GEMM, pooling; every returned Layout validates and round-trips
  through its dense mask.

Usage (libFuzzer's flags pass through):
  SPARSEK_LIBRARY=build/libsparsek.so PYTHONPATH=python \
      python3 tests/fuzz/python/fuzz_binding.py [-runs=N] [-max_total_time=S] [CORPUS_DIR ...]
"""

from __future__ import annotations

import copy
import ctypes
import os
import pickle
import shlex
import sys

import atheris

with atheris.instrument_imports(include=["sparsek"]):
    import sparsek
    from sparsek import Layout

import numpy as np

import fuzz_reference as ref
from fuzz_values import DTYPES, array, hostile_float, hostile_int, values

ALLOWED = (ValueError, TypeError, sparsek.SparseKError)


class Finding(AssertionError):
    """A broken promise of the binding (not a refused call)."""


def expect(call, inputs=(), outputs=()):
    """(True, result) when call() succeeds with `inputs` untouched;
    (False, None) when it raises an allowed exception with `inputs` and
    `outputs` untouched. Anything else raises (a finding)."""
    watched = [(a, np.array(a, copy=True)) for a in list(inputs) + list(outputs) if isinstance(a, np.ndarray)]
    n_in = sum(isinstance(a, np.ndarray) for a in inputs)
    try:
        result = call()
    except ALLOWED:
        for a, before in watched:
            if not _same(a, before):
                raise Finding("a refused call wrote into an argument")
        return False, None
    for a, before in watched[:n_in]:
        if not _same(a, before):
            raise Finding("a call wrote into an input")
    return True, result


def _same(a, before) -> bool:
    try:
        return np.array_equal(a, before, equal_nan=a.dtype.kind in "fc")
    except TypeError:  # object arrays
        return np.array_equal(a, before)


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Finding(what)


def check_layout(lay) -> None:
    """A Layout the binding returned: valid, consistent, and equal to its
    own dense mask rebuilt."""
    check(isinstance(lay, Layout), f"got {type(lay).__name__}, not a Layout")
    lay.validate()
    g = lay.grid
    if g.batch * g.heads * g.row_blocks * g.col_blocks > 1 << 22:
        return  # a dense mask of this grid is too large to check quickly
    mask = lay.to_mask()
    check(mask.shape == (g.batch * g.heads, g.row_blocks, g.col_blocks), "to_mask shape")
    check(int(mask.sum()) == lay.nnz, "to_mask count differs from nnz")
    if lay.nnz <= 4096:
        again = Layout.from_mask(mask, g.rows, g.cols, block=(g.block_rows, g.block_cols), batch=g.batch, heads=g.heads)
        check(np.array_equal(again.row_offsets, lay.row_offsets), "mask round trip: row_offsets")
        check(np.array_equal(again.col_indices, lay.col_indices), "mask round trip: col_indices")


def small_grid_blocks(rows, cols, block, batch, heads) -> int:
    """Blocks of the layout these Python values describe, when they are ints
    of sensible sign (else 0: the call is refused before any allocation)."""
    try:
        br, bc = (block, block) if not isinstance(block, tuple) else block
        vals = [int(x) for x in (rows, cols, br, bc, batch, heads)]
    except (TypeError, ValueError):
        return 0
    if any(isinstance(x, (bool, float)) for x in (rows, cols, batch, heads)) or min(vals) < 1:
        return 0
    r, c, br, bc, b, h = vals
    return -(-r // br) * -(-c // bc) * b * h


def huge_valid_grid(rows, cols, block, batch, heads) -> bool:
    """A grid the library accepts (slices x row_blocks + 1 and col_blocks
    fit int32; the dense count need not, since issue 33) with more than
    2^22 dense blocks: slow to build and check, and not the binding's
    argument handling."""
    if small_grid_blocks(rows, cols, block, batch, heads) <= 1 << 22:
        return False
    br, bc = (block, block) if not isinstance(block, tuple) else block
    r, c, br, bc, b, h = (int(x) for x in (rows, cols, br, bc, batch, heads))
    return b * h * -(-r // br) < 2**31 - 1 and -(-c // bc) <= 2**31 - 1


def hostile_block(fdp):
    r = fdp.ConsumeIntInRange(0, 7)
    if r < 5:
        return fdp.PickValueInList([64, 128])
    if r == 5:
        return (fdp.PickValueInList([64, 128]), fdp.PickValueInList([64, 128]))
    if r == 6:
        return (hostile_int(fdp, 63, 129), hostile_int(fdp, 63, 129))
    return hostile_int(fdp, 63, 129)


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------


def op_builders(fdp, rng):
    rows = hostile_int(fdp, 1, 300)
    cols = hostile_int(fdp, 1, 300) if fdp.ConsumeBool() else None
    block = hostile_block(fdp)
    batch, heads = hostile_int(fdp, 1, 3), hostile_int(fdp, 1, 3)
    if huge_valid_grid(rows, rows if cols is None else cols, block, batch, heads):
        return  # a valid but huge layout: slow, and not the binding's argument handling
    causal = fdp.ConsumeBool()
    kw = dict(block=block, batch=batch, heads=heads)
    which = fdp.ConsumeIntInRange(0, 6)
    calls = [
        lambda: Layout.dense(rows, cols, **kw),
        lambda: Layout.causal(rows, cols, **kw),
        lambda: Layout.window(rows, cols, left=hostile_int(fdp, 0, 300), right=hostile_int(fdp, 0, 300), **kw),
        lambda: Layout.sinks_window(
            rows, cols, sink_tokens=hostile_int(fdp, 0, 300), window_tokens=hostile_int(fdp, 0, 300), **kw
        ),
        lambda: Layout.strided(
            rows, cols, stride=hostile_int(fdp, 1, 5), local_blocks=hostile_int(fdp, 0, 3), causal=causal, **kw
        ),
        lambda: Layout.random(rows, cols, k=hostile_int(fdp, 0, 5), seed=hostile_int(fdp, 0, 99), causal=causal, **kw),
    ]
    if which < len(calls):
        ok, lay = expect(calls[which])
    else:
        rb, cb = fdp.ConsumeIntInRange(1, 5), fdp.ConsumeIntInRange(1, 5)
        scores, _ = array(fdp, rng, (rb, cb), np.float32)
        ok, lay = expect(
            lambda: Layout.topk(
                scores, k=hostile_int(fdp, 0, 6), sink_blocks=hostile_int(fdp, 0, 2),
                local_blocks=hostile_int(fdp, 0, 2), causal=causal, block=block,
            ),
            inputs=[scores],
        )
    if ok:
        check_layout(lay)


def op_grid(fdp, rng):
    vals = [hostile_int(fdp, -1, 300) for _ in range(6)]
    which = fdp.ConsumeIntInRange(0, 2)
    if which == 0:
        ok, res = expect(lambda: sparsek.grid_blocks(sparsek.Grid(*vals)))
        if ok:
            check(all(isinstance(x, int) and x >= 1 for x in res), f"grid_blocks gave {res}")
    elif which == 1:
        expect(lambda: sparsek.make_grid(vals[0], vals[1], block=(vals[2], vals[3]), batch=vals[4], heads=vals[5]))
    else:
        ok, name = expect(lambda: sparsek.status_name(vals[0]))
        if ok:
            check(isinstance(name, str) and name.startswith("SK_STATUS_"), f"status_name gave {name!r}")


def op_handle(fdp, rng):
    value = hostile_int(fdp, 0, 1 << 20)
    handle = ctypes.c_void_p(value) if fdp.ConsumeBool() and isinstance(value, int) and 0 <= value < 2**64 else value
    try:
        Layout(handle)
    except TypeError:
        return
    raise Finding(f"Layout({handle!r}) was accepted")


def op_conversions(fdp, rng):
    block = fdp.PickValueInList([64, 128])
    rb, cb, ns = fdp.ConsumeIntInRange(1, 4), fdp.ConsumeIntInRange(1, 4), fdp.ConsumeIntInRange(1, 3)
    rows, cols = hostile_int(fdp, 1, rb * block), hostile_int(fdp, 1, cb * block)
    if huge_valid_grid(rows, cols, block, ns, 1):
        return
    which = fdp.ConsumeIntInRange(0, 3)
    if which == 0:
        m = (rng.random((ns, rb, cb)) < 0.5).astype(fdp.PickValueInList([np.uint8, bool, np.float32, np.int64]))
        ok, lay = expect(lambda: Layout.from_mask(m, rows, cols, block=block, heads=hostile_int(fdp, 1, 3)), inputs=[m])
    elif which == 1:
        counts = rng.integers(-1, cb + 2, (ns, rb)).astype(np.int32)
        idx = rng.integers(-1, cb + 1, (ns, rb, cb + fdp.ConsumeIntInRange(-1, 1))).astype(np.int32)
        ok, lay = expect(lambda: Layout.from_flex(counts, idx, rows, cols, block=block, heads=ns), inputs=[counts, idx])
    elif which == 2:
        per_row = rng.integers(0, cb + 1, ns * rb)
        ro = np.concatenate([[0], np.cumsum(per_row)]) + fdp.ConsumeIntInRange(-1, 1) * fdp.ConsumeBool()
        ci = np.concatenate([np.sort(rng.choice(cb, n, replace=False)) for n in per_row] + [np.zeros(0, int)])
        if fdp.ConsumeBool():
            ci = ci + fdp.PickValueInList([-1, 1, 2**31, -(2**33)])
        ok, lay = expect(lambda: Layout.from_bsr(ro, ci, rows, cols, block=block, heads=ns), inputs=[ro, ci])
    else:
        ok, lay = expect(lambda: Layout.random(rows, cols, k=hostile_int(fdp, 0, cb), seed=3, block=block, heads=ns))
        if ok:
            check(copy.copy(lay) is lay and copy.deepcopy(lay) is lay, "a copy is not the layout itself")
            back = pickle.loads(pickle.dumps(lay))
            check(np.array_equal(back.row_offsets, lay.row_offsets), "pickle: row_offsets")
            check(np.array_equal(back.col_indices, lay.col_indices), "pickle: col_indices")
            counts, indices = lay.to_flex()
            again = Layout.from_flex(counts, indices, rows, cols, block=block, heads=ns)
            check(np.array_equal(again.col_indices, lay.col_indices), "flex round trip")
    if ok:
        check_layout(lay)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def qkv(fdp, rng, weird=True):
    """Small q, k, v (sometimes hostile) and their sizes."""
    B, Sq, Sk = fdp.ConsumeIntInRange(1, 2), fdp.ConsumeIntInRange(1, 200), fdp.ConsumeIntInRange(1, 200)
    Hkv = fdp.ConsumeIntInRange(1, 2)
    Hq = Hkv * fdp.ConsumeIntInRange(1, 2)
    D = fdp.ConsumeIntInRange(1, 24)
    dtype = fdp.PickValueInList(DTYPES)
    amp = fdp.PickValueInList([1.0, 1.0, 10.0, 300.0])
    q, kq = array(fdp, rng, (B, Sq, Hq, D), dtype, amp, weird)
    k, kk = array(fdp, rng, (B, Sk, Hkv, D), dtype, amp, weird)
    v, kv = array(fdp, rng, (B, Sk, Hkv, D), dtype, amp, weird)
    return (q, k, v), (B, Sq, Sk, Hq, Hkv, D, dtype), {kq, kk, kv}


def out_for(fdp, rng, q, shape, dtype, inputs):
    """None (the binding allocates), or an out array: fresh and NaN-filled
    (any layout), or an input itself (aliasing)."""
    r = fdp.ConsumeIntInRange(0, 5)
    if r < 2:
        return None
    if r == 5:
        return fdp.PickValueInList(list(inputs))
    out, _ = array(fdp, rng, shape, dtype)
    if isinstance(out, np.ndarray) and out.flags.writeable and out.dtype.kind == "f":
        out[...] = np.nan
    return out


def attention_layout(fdp, Sq, Sk, Hq, Hkv, B):
    block = fdp.PickValueInList([64, 128, (64, 128), (128, 64)])
    heads = fdp.PickValueInList([1, Hkv, Hq, 3])
    batch = fdp.PickValueInList([1, B, 1, 3])
    rows = Sq if fdp.ConsumeIntInRange(0, 7) else Sq + 1
    return Layout.random(rows, Sk, k=fdp.ConsumeIntInRange(0, 4), seed=fdp.ConsumeIntInRange(0, 9),
                         causal=fdp.ConsumeBool(), block=block, batch=batch, heads=heads)


def check_attention(q, k, v, out, lse, lay, causal, scale):
    dtype = q.dtype
    qf, kf, vf = (np.asarray(x, np.float64) for x in (q, k, v))
    o_atol, lse_atol, max_logit = ref.attention_bounds(qf, kf, vf, scale, dtype)
    if max_logit > 1e38:
        return  # float32 logits overflow: issue 27 defect 8 (scale), the library's call
    g = lay.grid
    want_o, want_lse = ref.attention(qf, kf, vf, lay.to_mask(), (g.rows, g.cols, g.block_rows, g.block_cols, g.batch, g.heads), causal, scale)
    check(out.shape == q.shape and out.dtype == dtype, "out shape / dtype")
    bad = ref.close(out, want_o, o_atol)
    check(bad is None, f"attention O: {bad}")
    if lse is not None:
        bad = ref.close(lse, want_lse, lse_atol, 1e-6)
        check(bad is None, f"attention LSE: {bad}")


def op_attention(fdp, rng):
    (q, k, v), (B, Sq, Sk, Hq, Hkv, D, dtype), _ = qkv(fdp, rng)
    lay = attention_layout(fdp, Sq, Sk, Hq, Hkv, B)
    out = out_for(fdp, rng, q, (B, Sq, Hq, D), dtype, (q, k, v))
    causal, scale, want_lse = fdp.ConsumeBool(), hostile_float(fdp, None, allow_none=True), fdp.ConsumeBool()
    backend = fdp.PickValueInList([None, None, "cpu", "CPU", "cuda", 1, 2, 1.0, 99, True])
    ok, res = expect(
        lambda: sparsek.attention(q, k, v, lay, causal=causal, scale=scale, return_lse=want_lse, out=out, backend=backend),
        inputs=[x for x in (q, k, v) if x is not out], outputs=[out],
    )
    if ok:
        o, lse = res if want_lse else (res, None)
        check(out is None or o is out, "attention did not return out")
        check_attention(q, k, v, o, lse, lay, causal, scale)


def op_plan(fdp, rng):
    (q, k, v), (B, Sq, Sk, Hq, Hkv, D, dtype), _ = qkv(fdp, rng, weird=fdp.ConsumeBool())
    lay = attention_layout(fdp, Sq, Sk, Hq, Hkv, B)
    causal, scale = fdp.ConsumeBool(), hostile_float(fdp, None, allow_none=True)
    ok, plan = expect(lambda: sparsek.plan_attention(q, k, v, lay, causal=causal, scale=scale), inputs=[q, k, v])
    if not ok:
        return
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        r = fdp.ConsumeIntInRange(0, 2)
        if r == 0:
            q2, k2, v2 = q, k, v
        elif r == 1:  # other arrays: other shapes, dtypes, layouts
            (q2, k2, v2), _, _ = qkv(fdp, rng)
        else:  # new values for q in any layout
            q2, k2, v2 = array(fdp, rng, q.shape, dtype)[0], k, v
        out = out_for(fdp, rng, q2, q.shape, dtype, (q2, k2, v2))
        if fdp.ConsumeBool():
            expect(plan.replan)
        ok, res = expect(lambda: plan.run(q2, k2, v2, out=out, return_lse=True),
                         inputs=[x for x in (q2, k2, v2) if x is not out], outputs=[out])
        if ok:
            check_attention(q2, k2, v2, res[0], res[1], lay, causal, scale)


def op_attention_topk(fdp, rng):
    (q, k, v), (B, Sq, Sk, Hq, Hkv, D, dtype), _ = qkv(fdp, rng)
    out = out_for(fdp, rng, q, (B, Sq, Hq, D), dtype, (q, k, v))
    causal, scale = fdp.ConsumeBool(), hostile_float(fdp, None, allow_none=True)
    kb, sinks, local = hostile_int(fdp, 0, 3), hostile_int(fdp, 0, 2), hostile_int(fdp, 0, 2)
    bq, bk = hostile_int(fdp, 64, 64) if fdp.ConsumeBool() else 128, fdp.PickValueInList([64, 128, 96])
    ok, res = expect(
        lambda: sparsek.attention_topk(q, k, v, kb, sink_blocks=sinks, local_blocks=local, causal=causal,
                                       per_kv_head=fdp.ConsumeBool(), scale=scale, block_q=bq, block_k=bk,
                                       return_lse=True, out=out),
        inputs=[x for x in (q, k, v) if x is not out], outputs=[out],
    )
    if ok:
        o, lay, lse = res
        check_layout(lay)
        check_attention(q, k, v, o, lse, lay, causal, scale)


# ---------------------------------------------------------------------------
# GEMM
# ---------------------------------------------------------------------------


def op_gemm(fdp, rng):
    block = fdp.PickValueInList([64, 128, (64, 128), (128, 64)])
    bm, bk = block if isinstance(block, tuple) else (block, block)
    m, kdim, n = fdp.ConsumeIntInRange(1, 200), fdp.ConsumeIntInRange(1, 200), fdp.ConsumeIntInRange(0, 40)
    lay = Layout.random(m, kdim, k=fdp.ConsumeIntInRange(0, 3), seed=fdp.ConsumeIntInRange(0, 9), block=block,
                        heads=fdp.PickValueInList([1, 1, 1, 2]))
    dtype = fdp.PickValueInList(DTYPES)
    a, _ = array(fdp, rng, (lay.nnz, bm, bk), dtype)
    b, _ = array(fdp, rng, (kdim, n), dtype)
    c_dtype = fdp.PickValueInList([np.float32, np.float16])
    r = fdp.ConsumeIntInRange(0, 4)
    if r < 2:
        c = None
    elif r == 4:  # b and c in one buffer, overlapping unless c starts past b
        buf = values(rng, kdim * n + m * n, dtype, 1.0)
        b = buf[: kdim * n].reshape(kdim, n)
        shift = fdp.ConsumeIntInRange(0, kdim * n)
        c = buf[shift : shift + m * n].reshape(m, n)
    else:
        c, _ = array(fdp, rng, (m, n), c_dtype)
    alpha, beta = hostile_float(fdp, 1.0), hostile_float(fdp, 0.0)
    c0 = np.array(c, np.float64, copy=True) if isinstance(c, np.ndarray) and c.dtype.kind == "f" else None
    ok, res = expect(
        lambda: sparsek.bsr_gemm(a, b, lay, c=c, alpha=alpha, beta=beta,
                                 c_dtype=fdp.PickValueInList([None, "float16", "float32", "float64"])),
        inputs=[x for x in (a, b) if x is not c], outputs=[c],
    )
    if not ok:
        return
    check(c is None or res is c, "bsr_gemm did not return c")
    al, be = float(alpha), float(beta)
    if not (np.isfinite(al) and np.isfinite(be)) or (be != 0.0 and c0 is not None and not np.isfinite(c0).all()):
        return  # inf / NaN scalars or C: no crash is the promise
    af, bf = np.asarray(a, np.float64), np.asarray(b, np.float64)
    base = c0 if c0 is not None else np.zeros(res.shape)
    atol, big = ref.gemm_atol(af, bf, al, be, base, kdim, res.dtype)
    if big > 0.25 * float(np.finfo(res.dtype).max):
        return  # C or a partial sum may pass the output type's range: inf is right there
    want = ref.gemm(af, lay.row_offsets, lay.col_indices, (bm, bk), m, kdim, bf, al, be, base)
    bad = ref.close(res, want, atol)
    check(bad is None, f"bsr_gemm: {bad}")


# ---------------------------------------------------------------------------
# Top-k
# ---------------------------------------------------------------------------


def op_block_pool(fdp, rng):
    (q, k, _), (B, Sq, Sk, Hq, Hkv, D, dtype), _ = qkv(fdp, rng)
    bq, bk = hostile_int(fdp, 64, 64), fdp.PickValueInList([64, 128, 0])
    ok, res = expect(lambda: sparsek.block_pool(q, k, bq, bk), inputs=[q, k])
    if ok:
        for got, x, blk in ((res[0], q, bq), (res[1], k, bk)):
            want = ref.pool(np.asarray(x, np.float64), int(blk))
            bad = ref.close(got, want, 1e-5 * max(float(np.abs(want).max(initial=0)), 1.0))
            check(bad is None, f"block_pool: {bad}")


def op_select_topk(fdp, rng):
    B, Hkv = fdp.ConsumeIntInRange(1, 2), fdp.ConsumeIntInRange(1, 2)
    Hq, rb, cb, D = Hkv * fdp.ConsumeIntInRange(1, 2), fdp.ConsumeIntInRange(1, 4), fdp.ConsumeIntInRange(1, 4), fdp.ConsumeIntInRange(1, 16)
    pq, _ = array(fdp, rng, (B, Hq, rb, D), np.float32)
    pk, _ = array(fdp, rng, (B, Hkv, cb, D), np.float32)
    seq_q = None if fdp.ConsumeBool() else hostile_int(fdp, 1, rb * 128)
    seq_k = None if fdp.ConsumeBool() else hostile_int(fdp, 1, cb * 128)
    ok, lay = expect(
        lambda: sparsek.select_topk(pq, pk, hostile_int(fdp, 0, 4), hostile_int(fdp, 0, 2), hostile_int(fdp, 0, 2),
                                    fdp.ConsumeBool(), fdp.ConsumeBool(), hostile_float(fdp, None, allow_none=True),
                                    seq_q, seq_k, block_q=fdp.PickValueInList([64, 128]), block_k=128),
        inputs=[pq, pk],
    )
    if ok:
        check_layout(lay)


def op_pool_select(fdp, rng):
    (q, k, _), _, _ = qkv(fdp, rng)
    ok, lay = expect(
        lambda: sparsek.pool_select_topk(q, k, hostile_int(fdp, 0, 4), sink_blocks=hostile_int(fdp, 0, 2),
                                         local_blocks=hostile_int(fdp, 0, 2), causal=fdp.ConsumeBool(),
                                         per_kv_head=fdp.ConsumeBool(), scale=hostile_float(fdp, None, allow_none=True),
                                         block_q=fdp.PickValueInList([64, 128]), block_k=hostile_block(fdp)),
        inputs=[q, k],
    )
    if ok:
        check_layout(lay)


def op_layout_from_scores(fdp, rng):
    nd = fdp.ConsumeIntInRange(1, 5)
    shape = tuple(fdp.ConsumeIntInRange(1, 4) for _ in range(nd))
    scores, _ = array(fdp, rng, shape, np.float32)
    if isinstance(scores, np.ndarray) and scores.dtype.kind == "f" and scores.size and fdp.ConsumeBool():
        scores = np.where(rng.random(scores.shape) < 0.2, fdp.PickValueInList([np.nan, -np.inf, np.inf]), scores)
    ok, lay = expect(
        lambda: sparsek.layout_from_scores(scores, hostile_int(fdp, 0, 5), hostile_int(fdp, 0, 2),
                                           hostile_int(fdp, 0, 2), fdp.ConsumeBool(),
                                           None if fdp.ConsumeBool() else hostile_int(fdp, 1, 512),
                                           None if fdp.ConsumeBool() else hostile_int(fdp, 1, 512),
                                           block_q=fdp.PickValueInList([64, 128]), block_k=hostile_block(fdp),
                                           batch=None if fdp.ConsumeBool() else hostile_int(fdp, 1, 4),
                                           heads=None if fdp.ConsumeBool() else hostile_int(fdp, 1, 4)),
        inputs=[scores],
    )
    if ok:
        check_layout(lay)


def op_topk_capacity(fdp, rng):
    args = [hostile_int(fdp, 1, 300) for _ in range(5)] + [hostile_int(fdp, 0, 5), hostile_int(fdp, 0, 2), hostile_int(fdp, 0, 2)]
    ok, res = expect(lambda: sparsek.topk_capacity(*args, fdp.ConsumeBool(), fdp.ConsumeBool(),
                                                   block_q=hostile_block(fdp), block_k=128))
    if ok:
        grid, cap = res
        check(isinstance(cap, int) and cap >= 0, f"capacity {cap}")
        check(cap <= grid.row_blocks * grid.col_blocks * grid.batch * grid.heads, "capacity above the grid's blocks")


OPS = [
    op_builders, op_grid, op_handle, op_conversions, op_attention, op_plan, op_attention_topk,
    op_gemm, op_block_pool, op_select_topk, op_pool_select, op_layout_from_scores, op_topk_capacity,
]


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    op = OPS[fdp.ConsumeIntInRange(0, len(OPS) - 1)]
    rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 2**16))
    op(fdp, rng)


def main() -> None:
    np.seterr(all="ignore")
    # libFuzzer runs argv[0] through sh for -merge / -fork: make it this
    # interpreter on this file, not the bare script name.
    argv0 = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))}"
    atheris.Setup([argv0] + sys.argv[1:], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
