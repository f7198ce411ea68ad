"""The context-parallel backward from Python (CPU, simulated communicator):
sk_cp_backward through ctypes against sparsek.attention_backward on the
global arrays (the rule of tests/cpu/test_cp_backward.c: one rounding of
the dtype plus fp32 noise of at most R + 2 shares), and the bytes each
rank sends (the forward's K/V plus fp32 dK/dV back)."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek


@pytest.mark.parametrize("ranks,sharding,causal", [(2, "zigzag", True), (3, "contiguous", False),
                                                   (4, "zigzag", False)])
def test_simulated_backward_matches_the_single_process_backward(ranks, sharding, causal):
    rng = np.random.default_rng(4321 + ranks)
    B, S, Hq, Hkv, D = 2, 64 * 11 + 17, 4, 2, 16
    q, do = (rng.standard_normal((B, S, Hq, D)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((B, S, Hkv, D)).astype(np.float16) for _ in range(2))
    layout = sparsek.Layout.random(S, k=3, seed=11, causal=False, block=64, batch=1, heads=Hkv)
    o, lse = sparsek.attention(q, k, v, layout, causal=causal, return_lse=True)
    ref = sparsek.attention_backward(q, k, v, o, do, lse, layout, causal=causal)
    dq, dk, dv, plan, sent = sparsek.cp_attention_backward_simulated(
        q, k, v, o, lse, do, layout, ranks, causal=causal, sharding=sharding)
    for got, want, name in zip((dq, dk, dv), ref, ("dq", "dk", "dv")):
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        amax = float(np.abs(want64).max())
        tol = 2 * 2.0**-11 * np.abs(want64) + 2.0**-24 * 4 * (ranks + 2) * amax + 2.0**-24
        assert np.isfinite(got64).all(), name
        assert (np.abs(got64 - want64) <= tol).all(), name
    for r in range(ranks):
        back = sum(plan.pair(p, r)[0] for p in range(ranks))  # K/V bytes r received
        assert sent[r] == plan.send_bytes(r) + back * 4 // 2
    assert sum(sent) == 3 * sum(plan.send_bytes(r) for r in range(ranks)) > 0

