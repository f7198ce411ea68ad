"""sparsek.attention_backward on numpy arrays (CPU backend) against a numpy
fp64 backward written here from the forward's definition (dense masked
softmax, gradients by the chain rule), under the tolerance rule; bad
inputs raising before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError

from conftest import head_slice, make_qkv, seeded_rng, token_allow

try:
    import ml_dtypes
except ImportError:  # optional
    ml_dtypes = None


def ref_backward(q, k, v, do, mask, grid, causal=False, scale=None, compute=np.float64, o=None, lse=None):
    """(dq, dk, dv) of dense masked attention in `compute` precision. With
    o and lse (the library's forward), P = exp(s - lse) and the row term
    rowsum(do * o), as a same-precision implementation of the library's
    scheme; without them, P from an exact softmax and rowsum(P * dP), the
    chain rule alone."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    q_, k_, v_, do_ = (np.asarray(x).astype(compute) for x in (q, k, v, do))
    dq = np.zeros((B, Sq, Hq, D), compute)
    dk = np.zeros((B, Sk, Hkv, D), compute)
    dv = np.zeros((B, Sk, Hkv, D), compute)
    for b in range(B):
        sb = b if grid.batch > 1 else 0
        for h in range(Hq):
            hk = h // group
            s_idx = sb * grid.heads + head_slice(h, Hq, Hkv, grid.heads)
            allow = token_allow(mask[s_idx], Sq, Sk, grid.block_rows, grid.block_cols, causal)
            rows = allow.any(axis=1)
            s = (q_[b, :, h, :] @ k_[b, :, hk, :].T) * compute(scale)
            s = np.where(allow, s, -np.inf)
            p = np.zeros_like(s)
            if lse is None:
                m = np.where(rows, s.max(axis=1), 0)
                e = np.exp(s - m[:, None])
                p[rows] = e[rows] / e[rows].sum(axis=1, keepdims=True)
            else:
                lse_h = np.asarray(lse)[b, h].astype(compute)
                p[rows] = np.exp(s[rows] - lse_h[rows, None])
            dp = do_[b, :, h, :] @ v_[b, :, hk, :].T
            if o is None:
                dl = (p * dp).sum(axis=1)
            else:
                dl = (do_[b, :, h, :] * np.asarray(o)[b, :, h, :].astype(compute)).sum(axis=1)
            ds = np.where(allow, p * (dp - dl[:, None]), 0)
            dq[b, :, h, :] = compute(scale) * (ds @ k_[b, :, hk, :])
            dk[b, :, hk, :] += compute(scale) * (ds.T @ q_[b, :, h, :])
            dv[b, :, hk, :] += p.T @ do_[b, :, h, :]
    return dq, dk, dv


def assert_backward_rule(grads, q, k, v, do, o, lse, mask, grid, causal=False, scale=None, atol=None):
    """Each gradient against the fp64 chain rule: error <= 2 x the error of
    a naive float32 implementation of the same scheme (from the library's
    o and lse, rounded to the output dtype) + atol. No NaN anywhere."""
    ref = ref_backward(q, k, v, do, mask, grid, causal, scale)
    naive = ref_backward(q, k, v, do, mask, grid, causal, scale, np.float32, o=o, lse=lse)
    out_dtype = np.asarray(grads[0]).dtype
    if atol is None:
        atol = 1e-5 if out_dtype == np.float32 else 1e-3
    for name, got, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        got = np.asarray(got).astype(np.float64)
        assert not np.isnan(got).any(), f"{name} has NaN"
        naive_err = np.abs(n.astype(out_dtype).astype(np.float64) - r).max(initial=0.0)
        err = np.abs(got - r).max(initial=0.0)
        assert err <= 2 * naive_err + atol, f"{name}: max error {err:.3g} > 2 x naive {naive_err:.3g} + {atol}"


def forward_and_backward(q, k, v, lay, rng, causal=False, scale=None):
    o, lse = sparsek.attention(q, k, v, lay, causal=causal, scale=scale, return_lse=True)
    do = rng.standard_normal(q.shape).astype(q.dtype)
    grads = sparsek.attention_backward(q, k, v, o, do, lse, lay, causal=causal, scale=scale)
    return o, lse, do, grads


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dense_layout_equals_dense_backward(dtype):
    rng = seeded_rng(201)
    q, k, v = make_qkv(rng, 2, 192, 160, 2, 2, 32, dtype)
    lay = Layout.dense(192, 160, block=64)
    o, lse, do, grads = forward_and_backward(q, k, v, lay, rng)
    for g, like in zip(grads, (q, k, v)):
        assert g.shape == like.shape and g.dtype == dtype
    assert_backward_rule(grads, q, k, v, do, o, lse, lay.to_mask(), lay.grid)


@pytest.mark.parametrize("sq,sk", [(256, 256), (130, 300), (300, 130)])
def test_causal(sq, sk):
    rng = seeded_rng(202)
    q, k, v = make_qkv(rng, 1, sq, sk, 2, 1, 32)
    lay = Layout.causal(sq, sk, block=64)
    o, lse, do, grads = forward_and_backward(q, k, v, lay, rng, causal=True, scale=0.3)
    assert_backward_rule(grads, q, k, v, do, o, lse, lay.to_mask(), lay.grid, causal=True, scale=0.3)
    if sq > sk:
        # The first Sq - Sk queries see no key: dq = 0.
        assert (grads[0][:, : sq - sk] == 0).all()


@pytest.mark.parametrize("layout_heads", ["kv", "q", "one"])
def test_gqa(layout_heads):
    rng = seeded_rng(203)
    B, S, Hq, Hkv, D = 2, 256, 8, 2, 16
    q, k, v = make_qkv(rng, B, S, S, Hq, Hkv, D)
    heads = {"kv": Hkv, "q": Hq, "one": 1}[layout_heads]
    lay = Layout.random(S, k=2, seed=5, block=64, batch=B, heads=heads)
    o, lse, do, grads = forward_and_backward(q, k, v, lay, rng)
    assert_backward_rule(grads, q, k, v, do, o, lse, lay.to_mask(), lay.grid)


def test_gqa_equals_summed_repeated_heads():
    rng = seeded_rng(204)
    q, k, v = make_qkv(rng, 1, 128, 128, 4, 2, 16)
    lay = Layout.causal(128, block=64)
    o, lse, do, (dq, dk, dv) = forward_and_backward(q, k, v, lay, rng, causal=True)
    kr, vr = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    dq2, dk2, dv2 = sparsek.attention_backward(q, kr, vr, o, do, lse, lay, causal=True)
    np.testing.assert_allclose(dq, dq2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dk, dk2.reshape(1, 128, 2, 2, 16).sum(axis=3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dv, dv2.reshape(1, 128, 2, 2, 16).sum(axis=3), rtol=1e-5, atol=1e-6)


def test_empty_rows_and_unreached_keys():
    rng = seeded_rng(205)
    q, k, v = make_qkv(rng, 1, 256, 256, 2, 2, 32)
    mask = np.zeros((2, 4, 4), np.uint8)
    mask[0, 0, 0] = mask[0, 2, 1] = 1  # head 0: two blocks; key blocks 2, 3 unreached
    lay = Layout.from_mask(mask, block=64)
    o, lse, do, (dq, dk, dv) = forward_and_backward(q, k, v, lay, rng)
    assert (dq[0, 64:128, 0] == 0).all() and (dq[0, :, 1] == 0).all()
    assert (dk[0, 128:, 0] == 0).all() and (dv[0, :, 1] == 0).all()
    assert_backward_rule((dq, dk, dv), q, k, v, do, o, lse, mask, lay.grid)


@pytest.mark.parametrize("sq,sk,block", [(150, 190, (64, 128)), (100, 77, (128, 64)), (1, 1, 64)])
def test_tails(sq, sk, block):
    rng = seeded_rng(206)
    q, k, v = make_qkv(rng, 2, sq, sk, 2, 1, 16)
    lay = Layout.dense(sq, sk, block=block)
    for causal in (False, True):
        o, lse, do, grads = forward_and_backward(q, k, v, lay, rng, causal=causal)
        assert_backward_rule(grads, q, k, v, do, o, lse, lay.to_mask(), lay.grid, causal=causal)


def test_strided_inputs_and_outputs():
    rng = seeded_rng(207)
    B, S, H, D = 2, 200, 2, 32
    qkv = rng.standard_normal((B, S, 3, H, D)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    lay = Layout.random(S, k=2, seed=1, block=64)
    o, lse = sparsek.attention(q, k, v, lay, scale=0.3, return_lse=True)
    do = rng.standard_normal((B, S, H, 2 * D)).astype(np.float32)[..., :D]
    big = np.full((3, B, S, H, 2 * D), np.nan, np.float32)
    outs = big[0, ..., :D], big[1, ..., :D], big[2, ..., :D]
    res = sparsek.attention_backward(q, k, v, o, do, lse, lay, scale=0.3, dq=outs[0], dk=outs[1], dv=outs[2])
    assert all(r is w for r, w in zip(res, outs))
    assert np.isnan(big[..., D:]).all()  # nothing written outside the outputs
    assert_backward_rule(res, q, k, v, do, o, lse, lay.to_mask(), lay.grid, scale=0.3)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
def test_bfloat16_via_ml_dtypes():
    rng = seeded_rng(208)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 32, ml_dtypes.bfloat16)
    lay = Layout.causal(128, block=64)
    o, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    do = rng.standard_normal(q.shape).astype(q.dtype)
    grads = sparsek.attention_backward(q, k, v, o, do, lse, lay, causal=True)
    assert grads[0].dtype == q.dtype
    assert_backward_rule(grads, q, k, v, do, o, lse, lay.to_mask(), lay.grid, causal=True, atol=1e-2)


def test_plan_runs_many_times_and_repeats_bitwise():
    rng = seeded_rng(209)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.causal(128, block=64)
    o, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    do = rng.standard_normal(q.shape).astype(np.float32)
    plan = sparsek.plan_attention_backward(q, k, v, lay, causal=True)
    a = plan.run(q, k, v, o, do, lse)
    b = plan.run(q, k, v, o, do, lse)
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes()
    assert_backward_rule(a, q, k, v, do, o, lse, lay.to_mask(), lay.grid, causal=True)
    with pytest.raises(ValueError, match="plan was made"):
        plan.run(q[:, :64], k, v, o[:, :64], do[:, :64], lse[..., :64])


# ---------------------------------------------------------------------------
# Bad inputs: nothing is written
# ---------------------------------------------------------------------------


@pytest.fixture
def case():
    rng = seeded_rng(210)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.dense(128, block=64)
    o, lse = sparsek.attention(q, k, v, lay, return_lse=True)
    do = rng.standard_normal(q.shape).astype(np.float32)
    return q, k, v, o, do, lse, lay


def nan_like(x, dtype=None):
    return np.full(x.shape, np.nan, dtype or x.dtype)


def test_bad_o_do_lse(case):
    q, k, v, o, do, lse, lay = case
    with pytest.raises(ValueError, match="do has shape"):
        sparsek.attention_backward(q, k, v, o, do[:, :64], lse, lay)
    with pytest.raises(TypeError, match="o.dtype"):
        sparsek.attention_backward(q, k, v, o.astype(np.float16), do, lse, lay)
    with pytest.raises(ValueError, match="lse has shape"):
        sparsek.attention_backward(q, k, v, o, do, lse[:, :1], lay)
    with pytest.raises(TypeError, match="lse.dtype"):
        sparsek.attention_backward(q, k, v, o, do, lse.astype(np.float16), lay)
    with pytest.raises(ValueError, match="lse must be contiguous"):
        sparsek.attention_backward(q, k, v, o, do, np.asfortranarray(lse), lay)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        sparsek.attention_backward(q, k, v, o, do.tolist(), lse, lay)


def test_bad_outputs_are_refused_untouched(case):
    q, k, v, o, do, lse, lay = case
    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
    with pytest.raises(TypeError, match="dq.dtype"):
        sparsek.attention_backward(q, k, v, o, do, lse, lay, dq=nan_like(q, np.float16), dk=dk, dv=dv)
    with pytest.raises(ValueError, match="dk has shape"):
        sparsek.attention_backward(q, k, v, o, do, lse, lay, dq=dq, dk=dk[:, :64], dv=dv)
    ro = nan_like(v)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dv is read-only"):
        sparsek.attention_backward(q, k, v, o, do, lse, lay, dq=dq, dk=dk, dv=ro)
    # Overlapping outputs: the library's aliasing rule.
    with pytest.raises(SparseKError, match="overlaps") as e:
        sparsek.attention_backward(q, k, v, o, do, lse, lay, dq=dq, dk=dk, dv=dk)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_STRIDE"
    for x in (dq, dk, dv):
        assert np.isnan(x).all()


def test_bad_plan_arguments(case):
    q, k, v, o, do, lse, lay = case
    with pytest.raises(ValueError, match="cannot run on data on cpu"):
        sparsek.attention_backward(q, k, v, o, do, lse, lay, backend="cuda")
    with pytest.raises(TypeError, match="layout must be"):
        sparsek.attention_backward(q, k, v, o, do, lse, lay.to_mask())
    with pytest.raises(ValueError, match="scale"):
        sparsek.attention_backward(q, k, v, o, do, lse, lay, scale=float("inf"))
    with pytest.raises(SparseKError, match="layout grid") as e:
        sparsek.attention_backward(q, k, v, o, do, lse, Layout.dense(256, block=64))
    assert e.value.status_name == "SK_STATUS_BAD_LAYOUT_MISMATCH"


def test_deterministic_false_reaches_the_descriptor():
    # bwd->deterministic = 0 selects the fused Hopper pass (fp32 atomic
    # dQ) on CUDA; the CPU backend has no such mode and must give the same
    # bits as the default.
    rng = seeded_rng(2909)
    q, k, v = make_qkv(rng, 1, 130, 100, 4, 2, 16)
    lay = Layout.random(130, 100, k=1, seed=3, causal=True, block=64)
    o, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    do = rng.standard_normal(q.shape).astype(np.float32)
    fast = sparsek.plan_attention_backward(q, k, v, lay, causal=True, deterministic=False)
    assert fast.bwd.deterministic == 0
    assert sparsek.plan_attention_backward(q, k, v, lay, causal=True).bwd.deterministic == 1
    a = fast.run(q, k, v, o, do, lse)
    b = sparsek.attention_backward(q, k, v, o, do, lse, lay, causal=True, deterministic=False)
    c = sparsek.attention_backward(q, k, v, o, do, lse, lay, causal=True)
    for x, y, z in zip(a, b, c):
        assert x.tobytes() == z.tobytes() and y.tobytes() == z.tobytes()
