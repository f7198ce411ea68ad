"""sparsek.attention_varlen_backward (numpy and torch CPU): bit for bit
against sparsek.attention_backward on each sequence alone (the CPU
reference runs the same code per sequence), those per-sequence gradients
against the fp64 chain rule (test_backward.py's rule), empty sequences
giving zero gradients, and bad inputs raising before the library runs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import VarlenLayout

from conftest import cu_of, float_dtypes, requires_torch, seeded_rng
from test_backward import assert_backward_rule

DTYPES = float_dtypes()
LENS_Q = [100, 0, 70, 1, 64, 30]
LENS_K = [150, 20, 80, 0, 64, 130]


def make_case(rng, dtype, hq, hkv, d=32, causal=True, layout_heads=1):
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    vl = VarlenLayout.random(cu_q, cu_k, k=2, seed=int(rng.integers(1 << 30)), causal=causal, block=64,
                             heads=layout_heads)
    q = rng.standard_normal((sum(LENS_Q), hq, d)).astype(dtype)
    k = rng.standard_normal((sum(LENS_K), hkv, d)).astype(dtype)
    v = rng.standard_normal((sum(LENS_K), hkv, d)).astype(dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    o, lse = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=causal, return_lse=True)
    return cu_q, cu_k, vl, q, k, v, o, lse, do


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(2, 2, 1), (4, 1, 4)])
def test_equals_fixed_backward_per_sequence(dtype, causal, heads):
    hq, hkv, lh = heads
    rng = seeded_rng(3000 + 10 * hq + causal)
    cu_q, cu_k, vl, q, k, v, o, lse, do = make_case(rng, dtype, hq, hkv, causal=causal, layout_heads=lh)
    dq, dk, dv = sparsek.attention_varlen_backward(q, k, v, o, do, lse, cu_q, cu_k, vl, causal=causal)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for b, (lq, lk) in enumerate(zip(LENS_Q, LENS_K)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        seq = vl.sequence(b)
        if seq is None:  # no query or no key: nothing admissible
            assert not np.asarray(dq[sq]).astype(np.float64).any(), f"sequence {b}: dq not 0"
            assert not np.asarray(dk[sk]).astype(np.float64).any(), f"sequence {b}: dk not 0"
            assert not np.asarray(dv[sk]).astype(np.float64).any(), f"sequence {b}: dv not 0"
            continue
        qb, kb, vb, dob = q[sq][None], k[sk][None], v[sk][None], do[sq][None]
        ob, lseb = sparsek.attention(qb, kb, vb, seq, causal=causal, return_lse=True)
        want = sparsek.attention_backward(qb, kb, vb, ob, dob, lseb, seq, causal=causal)
        for name, got, w in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), want):
            assert np.array_equal(np.asarray(got).view(np.uint8), np.asarray(w[0]).view(np.uint8)), (
                f"sequence {b}: {name} differs from the fixed-batch backward"
            )
        if dtype != np.float16:  # one rule check per case is enough; f16 is covered by the C tests
            assert_backward_rule(want, qb, kb, vb, dob, ob, lseb, seq.to_mask(), seq.grid, causal)


@requires_torch
def test_torch_cpu_tensors_give_the_numpy_gradients():
    import torch

    rng = seeded_rng(3100)
    cu_q, cu_k, vl, q, k, v, o, lse, do = make_case(rng, np.float32, 4, 2)
    want = sparsek.attention_varlen_backward(q, k, v, o, do, lse, cu_q, cu_k, vl, causal=True)
    t = [torch.from_numpy(x) for x in (q, k, v, o, do, lse)]
    got = sparsek.attention_varlen_backward(*t, torch.from_numpy(cu_q), torch.from_numpy(cu_k), vl, causal=True)
    for g, w in zip(got, want):
        assert isinstance(g, torch.Tensor) and np.array_equal(g.numpy(), w)


def test_bad_inputs_raise():
    rng = seeded_rng(3200)
    cu_q, cu_k, vl, q, k, v, o, lse, do = make_case(rng, np.float32, 2, 1)
    with pytest.raises(ValueError, match="lse"):
        sparsek.attention_varlen_backward(q, k, v, o, do, lse.T.copy(), cu_q, cu_k, vl)
    with pytest.raises(TypeError, match="lse"):
        sparsek.attention_varlen_backward(q, k, v, o, do, lse.astype(np.float64), cu_q, cu_k, vl)
    with pytest.raises(ValueError, match="do"):
        sparsek.attention_varlen_backward(q, k, v, o, do[:-1], lse, cu_q, cu_k, vl)
    with pytest.raises(ValueError, match="lengths"):
        other = cu_of(LENS_Q[::-1])
        sparsek.attention_varlen_backward(q, k, v, o, do, lse, other, cu_k, vl)
    with pytest.raises(ValueError, match="cpu"):
        sparsek.attention_varlen_backward(q, k, v, o, do, lse, cu_q, cu_k, vl, backend="cuda")
