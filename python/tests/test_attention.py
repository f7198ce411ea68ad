"""sparsek.attention on numpy arrays (CPU backend) against the fp64 reference,
and bad inputs raising the right error before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError

from conftest import assert_close_rule, make_qkv, seeded_rng

try:
    import ml_dtypes
except ImportError:  # optional
    ml_dtypes = None


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dense_layout_equals_dense_attention(dtype):
    rng = seeded_rng(1)
    q, k, v = make_qkv(rng, 2, 192, 192, 3, 3, 32, dtype)
    lay = Layout.dense(192, block=64)
    out, lse = sparsek.attention(q, k, v, lay, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (2, 3, 192)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, lse=lse)


@pytest.mark.parametrize("sq,sk", [(256, 256), (130, 300), (300, 130)])
def test_causal(sq, sk):
    rng = seeded_rng(2)
    q, k, v = make_qkv(rng, 1, sq, sk, 2, 2, 32)
    lay = Layout.causal(sq, sk, block=64)
    out, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, causal=True, lse=lse)
    if sq > sk:
        # The first Sq - Sk queries see no key: O = 0, LSE = -inf.
        assert (out[:, : sq - sk] == 0).all()
        assert np.isneginf(lse[:, :, : sq - sk]).all()


@pytest.mark.parametrize("layout_heads", ["kv", "q", "one"])
def test_gqa(layout_heads):
    rng = seeded_rng(3)
    B, S, Hq, Hkv, D = 2, 256, 6, 2, 32
    q, k, v = make_qkv(rng, B, S, S, Hq, Hkv, D)
    heads = {"kv": Hkv, "q": Hq, "one": 1}[layout_heads]
    lay = Layout.random(S, k=2, seed=5, block=64, batch=B, heads=heads)
    out, lse = sparsek.attention(q, k, v, lay, return_lse=True)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, lse=lse)


def test_gqa_equals_repeated_kv_heads():
    rng = seeded_rng(4)
    q, k, v = make_qkv(rng, 1, 128, 128, 4, 2, 32)
    lay = Layout.causal(128, block=64)
    a = sparsek.attention(q, k, v, lay, causal=True)
    b = sparsek.attention(q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2), lay, causal=True)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sq,sk,block", [(150, 190, (64, 128)), (100, 77, (128, 64)), (1, 1, 64)])
def test_tails(sq, sk, block):
    rng = seeded_rng(5)
    q, k, v = make_qkv(rng, 2, sq, sk, 2, 1, 16)
    lay = Layout.dense(sq, sk, block=block)
    out, lse = sparsek.attention(q, k, v, lay, return_lse=True)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, lse=lse)
    out, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, causal=True, lse=lse)


def test_empty_rows_give_zero_and_neg_inf():
    rng = seeded_rng(6)
    q, k, v = make_qkv(rng, 1, 256, 256, 2, 2, 32)
    mask = np.ones((2, 4, 4), np.uint8)
    mask[0, 1] = 0  # head 0, query block 1: empty
    mask[1] = 0  # head 1: all empty
    lay = Layout.from_mask(mask, block=64)
    out, lse = sparsek.attention(q, k, v, lay, return_lse=True)
    assert (out[0, 64:128, 0] == 0).all() and (out[0, :, 1] == 0).all()
    assert np.isneginf(lse[0, 0, 64:128]).all() and np.isneginf(lse[0, 1]).all()
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, lse=lse)


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 1), (1, 3), (2, 3)])
def test_broadcast_layouts(batch, heads):
    rng = seeded_rng(7)
    q, k, v = make_qkv(rng, 2, 192, 256, 3, 3, 16)
    lay = Layout.random(192, 256, k=2, seed=11, block=64, batch=batch, heads=heads)
    out = sparsek.attention(q, k, v, lay)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid)


@pytest.mark.parametrize("pattern", ["window", "sinks", "strided", "topk"])
def test_patterns_with_causal(pattern):
    rng = seeded_rng(8)
    S = 320
    q, k, v = make_qkv(rng, 1, S, S, 2, 1, 32, np.float16)
    lay = {
        "window": lambda: Layout.window(S, left=100, block=64),
        "sinks": lambda: Layout.sinks_window(S, sink_tokens=8, window_tokens=64, block=64),
        "strided": lambda: Layout.strided(S, stride=2, local_blocks=1, block=64),
        "topk": lambda: Layout.topk(rng.random((2, 5, 5)).astype(np.float32), S, S, k=1, local_blocks=1, causal=True, block=64, heads=2),
    }[pattern]()
    out = sparsek.attention(q, k, v, lay, causal=True)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, causal=True)


def test_strided_inputs_out_and_scale():
    rng = seeded_rng(9)
    B, S, H, D = 2, 200, 2, 32
    qkv = rng.standard_normal((B, S, 3, H, D)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    lay = Layout.random(S, k=2, seed=1, block=64)
    big = np.full((B, S, H, 2 * D), np.nan, np.float32)
    out = big[..., :D]
    res = sparsek.attention(q, k, v, lay, scale=0.3, out=out)
    assert res is out
    assert np.isnan(big[..., D:]).all()  # nothing written outside out
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, scale=0.3)


def test_broadcast_kv_strides():
    # A single KV head broadcast to two through a zero stride.
    rng = seeded_rng(10)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 1, 16)
    kb = np.broadcast_to(k, (1, 128, 2, 16))
    vb = np.broadcast_to(v, (1, 128, 2, 16))
    lay = Layout.dense(128, block=64)
    np.testing.assert_allclose(sparsek.attention(q, kb, vb, lay), sparsek.attention(q, k, v, lay), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
def test_bfloat16_via_ml_dtypes():
    rng = seeded_rng(12)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 32, ml_dtypes.bfloat16)
    lay = Layout.causal(128, block=64)
    out = sparsek.attention(q, k, v, lay, causal=True)
    assert out.dtype == q.dtype
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, causal=True, atol=1e-2)


def test_plan_runs_many_times():
    rng = seeded_rng(13)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.causal(128, block=64)
    plan = sparsek.plan_attention(q, k, v, lay, causal=True)
    a = plan.run(q, k, v)
    q2, k2, v2 = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    b = plan.run(q2, k2, v2)
    assert_close_rule(a, q, k, v, lay.to_mask(), lay.grid, causal=True)
    assert_close_rule(b, q2, k2, v2, lay.to_mask(), lay.grid, causal=True)
    with pytest.raises(ValueError, match="plan was made"):
        plan.run(q[:, :64], k, v)


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


@pytest.fixture
def qkv():
    rng = seeded_rng(100)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    return q, k, v, Layout.dense(128, block=64)


def poisoned(q):
    return np.full(q.shape, np.nan, q.dtype)


def test_bad_ndim(qkv):
    q, k, v, lay = qkv
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        sparsek.attention(q[0], k, v, lay)
    with pytest.raises(ValueError, match="k must have 4 dimensions"):
        sparsek.attention(q, k[..., None], v, lay)


def test_bad_dtypes(qkv):
    q, k, v, lay = qkv
    with pytest.raises(TypeError, match="dtypes differ"):
        sparsek.attention(q, k.astype(np.float16), v, lay)
    with pytest.raises(TypeError, match="float64"):
        sparsek.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), lay)
    with pytest.raises(TypeError, match="out.dtype"):
        sparsek.attention(q, k, v, lay, out=poisoned(q).astype(np.float16))
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        sparsek.attention(q.tolist(), k, v, lay)


def test_bad_shapes(qkv):
    q, k, v, lay = qkv
    with pytest.raises(ValueError, match="same shape"):
        sparsek.attention(q, k, v[:, :64], lay)
    with pytest.raises(ValueError, match="head_dim differs"):
        sparsek.attention(q, k[..., :8], v[..., :8], lay)
    with pytest.raises(ValueError, match="batch differs"):
        sparsek.attention(q, np.concatenate([k, k]), np.concatenate([v, v]), lay)
    q3 = np.concatenate([q, q[:, :, :1]], axis=2)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        sparsek.attention(q3, k, v, lay)


def test_bad_last_dim(qkv):
    q, k, v, lay = qkv
    qt = np.swapaxes(np.swapaxes(q, 1, 3).copy(), 1, 3)  # same shape, D not contiguous
    with pytest.raises(ValueError, match="last dimension"):
        sparsek.attention(qt, k, v, lay)
    with pytest.raises(ValueError, match="negative strides"):
        sparsek.attention(q[:, ::-1], k, v, lay)


def test_bad_out(qkv):
    q, k, v, lay = qkv
    with pytest.raises(ValueError, match="out has shape"):
        sparsek.attention(q, k, v, lay, out=poisoned(q)[:, :64])
    ro = poisoned(q)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        sparsek.attention(q, k, v, lay, out=ro)


def test_bad_layout_argument(qkv):
    q, k, v, lay = qkv
    with pytest.raises(TypeError, match="sparsek.Layout"):
        sparsek.attention(q, k, v, lay.to_mask())
    with pytest.raises(ValueError, match="backend"):
        sparsek.attention(q, k, v, lay, backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        sparsek.attention(q, k, v, lay, backend="tpu")
    with pytest.raises(ValueError, match="scale"):
        sparsek.attention(q, k, v, lay, scale=0.0)


def test_layout_mismatch_is_a_library_error_and_writes_nothing(qkv):
    q, k, v, _ = qkv
    out = poisoned(q)
    for lay in (
        Layout.dense(256, 128, block=64),  # rows != Sq
        Layout.dense(128, 192, block=64),  # cols != Sk
        Layout.dense(128, block=64, heads=3),  # heads not 1 / Hkv / Hq
        Layout.dense(128, block=64, batch=2),  # batch not 1 / B
    ):
        with pytest.raises(SparseKError) as e:
            sparsek.attention(q, k, v, lay, out=out)
        assert e.value.status_name == "SK_STATUS_BAD_LAYOUT_MISMATCH", e.value
        assert np.isnan(out).all()


def test_overlapping_out_is_a_library_error(qkv):
    q, k, v, lay = qkv
    qc = q.copy()
    with pytest.raises(SparseKError) as e:
        sparsek.attention(qc, k, v, lay, out=qc)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_STRIDE"
    np.testing.assert_array_equal(qc, q)
