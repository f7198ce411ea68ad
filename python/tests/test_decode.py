"""sparsek.decode: q_len new tokens per sequence over the paged KV cache
(paged_kv_from_dense's caches: shuffled pages, NaN in unused slots),
dense and with decode layouts (per KV head or shared, blocks of 16 and 32,
empty rows), against a numpy fp64 reference; torch CPU equals numpy bit
for bit; CUDA against the CPU backend; bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import SparseKError

from conftest import cu_of, requires_cuda, requires_torch, seeded_rng

LENS = [70, 5, 200]
Q_LEN, HQ, HKV, D = 3, 8, 2, 32


def case(rng, dtype, lens=LENS, page_size=16):
    q = rng.standard_normal((len(lens), Q_LEN, HQ, D)).astype(dtype)
    k = rng.standard_normal((sum(lens), HKV, D)).astype(dtype)
    v = rng.standard_normal((sum(lens), HKV, D)).astype(dtype)
    kc, vc, table, seq_lens = sparsek.paged_kv_from_dense(k, v, cu_of(lens), page_size, extra_pages=2, seed=3, fill=np.nan)
    return q, k, v, kc, vc, table, seq_lens


def random_layout(rng, lens, block_k, heads, density=0.5):
    """(row_offsets, col_indices, selected(b, hkv, block)) of a decode layout."""
    rows, offsets, indices = [], [0], []
    for b, n in enumerate(lens):
        for h in range(heads):
            sel = [j for j in range(-(-n // block_k)) if rng.random() < density]
            rows.append(set(sel))
            indices += sel
            offsets.append(len(indices))
    def selected(b, hkv, j):
        return j in rows[b * heads + (hkv if heads > 1 else 0)]
    return np.array(offsets, np.int32), np.array(indices, np.int32), selected


def reference(q, k, v, lens, causal, selected=None, block_k=None):
    """fp64 decode: out [B, q_len, Hq, D], lse [B, Hq, q_len]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, L, H, Dh = q.shape
    group = H // k.shape[1]
    out = np.zeros(q.shape)
    lse = np.full((B, H, L), -np.inf)
    start = 0
    for b, n in enumerate(lens):
        for h in range(H):
            hk = h // group
            for t in range(L):
                keys = [j for j in range(n) if (not causal or j <= n - L + t)
                        and (selected is None or selected(b, hk, j // block_k))]
                if not keys:
                    continue
                s = np.array([q[b, t, h] @ k[start + j, hk] for j in keys]) / np.sqrt(Dh)
                m = s.max()
                p = np.exp(s - m)
                out[b, t, h] = (p[:, None] * v[start + np.array(keys), hk]).sum(0) / p.sum()
                lse[b, h, t] = m + np.log(p.sum())
        start += n
    return out, lse


def assert_close(got, want, dtype):
    tol = 2e-5 if dtype == np.float32 else 4e-3
    assert not np.isnan(np.asarray(got, np.float64)).any()
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dense_matches_reference(dtype, causal):
    rng = seeded_rng(3101)
    q, k, v, kc, vc, table, lens = case(rng, dtype)
    out, lse = sparsek.decode(q, kc, vc, table, lens, causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (3, HQ, Q_LEN)
    ref_o, ref_lse = reference(q, k, v, LENS, causal)
    assert_close(out, ref_o, dtype)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-3)


@pytest.mark.parametrize("heads", [HKV, 1])
@pytest.mark.parametrize("block_k", [16, 32, 128])
def test_layout_matches_reference(block_k, heads):
    rng = seeded_rng(3102 + block_k + heads)
    q, k, v, kc, vc, table, lens = case(rng, np.float32)
    off, idx, selected = random_layout(rng, LENS, block_k, heads)
    out, lse = sparsek.decode(q, kc, vc, table, lens, (off, idx), block_k=block_k, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, LENS, True, selected, block_k)
    assert_close(out, ref_o, np.float32)
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=1e-4)


def test_empty_selection_gives_zero_and_minus_inf():
    rng = seeded_rng(3103)
    q, k, v, kc, vc, table, lens = case(rng, np.float32)
    off = np.zeros(3 * HKV + 1, np.int32)
    out, lse = sparsek.decode(q, kc, vc, table, lens, (off, np.zeros(0, np.int32)), block_k=16, return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


@requires_torch
def test_torch_cpu_equals_numpy():
    import torch

    rng = seeded_rng(3104)
    q, k, v, kc, vc, table, lens = case(rng, np.float32)
    off, idx, _ = random_layout(rng, LENS, 32, HKV)
    want = sparsek.decode(q, kc, vc, table, lens, (off, idx), block_k=32)
    got = sparsek.decode(
        torch.from_numpy(q), torch.from_numpy(kc), torch.from_numpy(vc), torch.from_numpy(table),
        torch.from_numpy(lens), (torch.from_numpy(off), torch.from_numpy(idx)), block_k=32,
    )
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want)


def test_bad_inputs():
    rng = seeded_rng(3105)
    q, k, v, kc, vc, table, lens = case(rng, np.float32)
    off, idx, _ = random_layout(rng, LENS, 16, HKV)
    with pytest.raises(ValueError, match="block_k"):
        sparsek.decode(q, kc, vc, table, lens, (off, idx))
    with pytest.raises(ValueError, match="row_offsets has"):
        sparsek.decode(q, kc, vc, table, lens, (off[:-1], idx), block_k=16)
    with pytest.raises(ValueError, match="4 dimensions"):
        sparsek.decode(q[0], kc, vc, table, lens)
    bad = idx.copy()
    bad[-1] = 50  # past sequence 2's 13 blocks: refused on the CPU
    with pytest.raises(SparseKError, match="outside"):
        sparsek.decode(q, kc, vc, table, lens, (off, bad), block_k=16)
    with pytest.raises(SparseKError, match="q_len"):
        q17 = np.zeros((3, 17, HQ, D), np.float32)
        sparsek.decode(q17, kc, vc, table, lens)


@requires_cuda
@pytest.mark.parametrize("num_splits", [0, 1, 5])
def test_cuda_matches_cpu(num_splits):
    import torch

    rng = seeded_rng(3106)
    lens = [3000, 17, 700]
    D128 = 128
    q = rng.standard_normal((3, 4, 16, D128)).astype(np.float32)
    k = rng.standard_normal((sum(lens), 2, D128)).astype(np.float32)
    v = rng.standard_normal((sum(lens), 2, D128)).astype(np.float32)
    kc, vc, table, seq = sparsek.paged_kv_from_dense(k, v, cu_of(lens), 64, seed=1, fill=np.nan)
    off, idx, _ = random_layout(rng, lens, 64, 2, density=0.6)
    t = lambda x, dt=torch.bfloat16: torch.from_numpy(x).to("cuda", dt)  # noqa: E731
    qd, kd, vd = t(q), t(kc), t(vc)
    got, lse = sparsek.decode(
        qd, kd, vd, t(table, torch.int32), t(seq, torch.int32), (t(off, torch.int32), t(idx, torch.int32)),
        block_k=64, max_seqlen_k=max(lens), return_lse=True, num_splits=num_splits,
    )
    f32 = lambda x: x.float().cpu().numpy()  # noqa: E731
    want, want_lse = sparsek.decode(f32(qd), f32(kd), f32(vd), table, seq, (off, idx), block_k=64, return_lse=True)
    np.testing.assert_allclose(f32(got), want, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(lse.cpu().numpy(), want_lse, atol=2e-2)
