"""fuzz_reference.py - tiny naive numpy fp64 references for fuzz_binding.py,
written from the header's definitions (not from the library's code), and
their error bounds.

- attention(): dense softmax over the keys of each row's selected blocks
  (sk_bsr slice rules: batch 1 or B, heads 1, Hkv or Hq), tails dropped,
  the causal mask bottom-right aligned; an empty row gives O = 0 and
  LSE = -inf.
- gemm(): C = alpha * A * B + beta * C0 with A from the BSR layout (C0 not
  read when beta is 0).
- pool(): block means of Q or K ([B, H, blocks, D]).
- close(): |got - want| <= atol + rtol * |want|, inf / NaN positions equal.

The bounds follow the tolerance rule's spirit: the error of a naive
same-precision computation (fp32 sums over D or K terms, the output's
rounding) with a margin, scaled by the sizes of the values involved.
"""

from __future__ import annotations

import numpy as np

EPS = {np.dtype(np.float32): 2.0**-23, np.dtype(np.float16): 2.0**-10}


def slice_of(b, h, batch, heads_q, heads_kv, lay_batch, lay_heads):
    sb = b if lay_batch > 1 else 0
    if lay_heads == 1:
        sh = 0
    elif lay_heads == heads_q:
        sh = h
    else:
        sh = h // (heads_q // heads_kv)
    return sb * lay_heads + sh


def attention(q, k, v, mask, grid, causal, scale):
    """(o, lse) in fp64. q [B, Sq, Hq, D], k / v [B, Sk, Hkv, D] as float64;
    mask: the layout's block mask [slices, rb, cb]."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    rows, cols, bq, bk, lb, lh = grid
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    o = np.zeros(q.shape)
    lse = np.full((B, Hq, Sq), -np.inf)
    qi = np.arange(Sq)[:, None]
    ki = np.arange(Sk)[None, :]
    for b in range(B):
        for h in range(Hq):
            s = slice_of(b, h, B, Hq, Hkv, lb, lh)
            allow = np.repeat(np.repeat(mask[s].astype(bool), bq, 0), bk, 1)[:Sq, :Sk]
            if causal:
                allow = allow & (ki <= qi + (Sk - Sq))
            hk = h // (Hq // Hkv)
            logits = (q[b, :, h, :] @ k[b, :, hk, :].T) * scale
            logits = np.where(allow, logits, -np.inf)
            m = logits.max(axis=1)
            live = np.isfinite(m)
            p = np.exp(logits[live] - m[live, None])
            den = p.sum(axis=1)
            o[b, live, h, :] = (p @ v[b, :, hk, :]) / den[:, None]
            lse[b, h, live] = m[live] + np.log(den)
    return o, lse


def attention_bounds(q, k, v, scale, dtype):
    """(atol of O, atol of LSE, largest |logit|) for fp32 math on inputs
    already in `dtype`, the output rounded to `dtype`."""
    D = q.shape[-1]
    mq, mk, mv = (float(np.abs(x).max(initial=0.0)) for x in (q, k, v))
    sc = 1.0 / np.sqrt(D) if scale is None else abs(float(scale))
    max_logit = sc * D * mq * mk
    # A logit's fp32 error grows with D terms; exp turns it into a relative
    # weight error, which moves O by up to twice that times max |v|.
    logit_err = 4.0 * D * 2.0**-23 * max_logit + 1e-6
    o_atol = (2.0 * logit_err + 8.0 * EPS[np.dtype(dtype)]) * max(mv, 1e-30) + 1e-6
    lse_atol = 4.0 * logit_err + 1e-4
    return o_atol, lse_atol, max_logit


def gemm(values, row_offsets, col_indices, block, m, kdim, b, alpha, beta, c0):
    """C in fp64: values [nnz, bm, bk] in col_indices order."""
    bm, bk = block
    rb = -(-m // bm)
    a = np.zeros((rb * bm, -(-kdim // bk) * bk))
    for r in range(rb):
        for idx in range(row_offsets[r], row_offsets[r + 1]):
            c = col_indices[idx]
            a[r * bm : (r + 1) * bm, c * bk : (c + 1) * bk] = values[idx]
    c = alpha * (a[:m, :kdim] @ b)
    if beta != 0.0:
        c = c + beta * c0
    return c


def gemm_atol(values, b, alpha, beta, c0, kdim, c_dtype):
    """(atol, the largest magnitude a term of C can reach) for fp32 sums
    over kdim products and the rounding to c_dtype."""
    ma = float(np.abs(values).max(initial=0.0))
    mb = float(np.abs(b).max(initial=0.0))
    mc = float(np.abs(c0).max(initial=0.0)) if beta != 0.0 else 0.0
    big = abs(alpha) * kdim * ma * mb + abs(beta) * mc
    return 4.0 * (kdim * 2.0**-23 + EPS[np.dtype(c_dtype)]) * big + 1e-6, big


def pool(x, block):
    """Block means: x [B, S, H, D] -> [B, H, ceil(S / block), D]."""
    B, S, H, D = x.shape
    nb = -(-S // block)
    out = np.zeros((B, H, nb, D))
    for i in range(nb):
        out[:, :, i, :] = x[:, i * block : (i + 1) * block].mean(axis=1)
    return out


def close(got, want, atol, rtol=0.0):
    """None when every element agrees (inf / NaN positions equal), else a
    text saying where it does not."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    fin = np.isfinite(want)
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return "NaN positions differ"
    if not np.array_equal(np.where(fin, 0, got), np.where(fin, 0, want), equal_nan=True):
        return "inf positions differ"
    err = np.abs(got[fin] - want[fin])
    bound = atol + rtol * np.abs(want[fin])
    if err.size and (err > bound).any():
        i = int(np.argmax(err - bound))
        return f"error {err[i]:.3g} > bound {bound[i]:.3g} (max |want| {np.abs(want[fin]).max():.3g})"
    return None
