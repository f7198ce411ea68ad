"""sparsek.topk_varlen / topk_paged: each sequence's rows equal
sparsek.pool_select_topk on the sequence alone; the paged form (every page
size, shuffled pages, NaN in unused slots) equals the packed one; the
layout runs through attention_varlen; bad inputs; torch CPU and CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import SparseKError, VarlenLayout

from conftest import cu_of, float_dtypes, requires_cuda, requires_torch, seeded_rng

DTYPES = float_dtypes()

LENS_Q = [130, 0, 64, 1, 200]
LENS_K = [300, 40, 64, 0, 260]


def case(rng, dtype, hq=4, hkv=2, d=16):
    q = rng.standard_normal((sum(LENS_Q), hq, d)).astype(dtype)
    k = rng.standard_normal((sum(LENS_K), hkv, d)).astype(dtype)
    return q, k, cu_of(LENS_Q), cu_of(LENS_K)


OPTS = dict(sink_blocks=1, local_blocks=1, causal=True, block_q=64, block_k=64)


@pytest.mark.parametrize("per_kv_head", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_fixed_per_sequence(dtype, per_kv_head):
    rng = seeded_rng(61)
    q, k, cu_q, cu_k = case(rng, dtype)
    vl = sparsek.topk_varlen(q, k, cu_q, cu_k, 2, per_kv_head=per_kv_head, **OPTS)
    assert isinstance(vl, VarlenLayout)
    assert vl.heads == (2 if per_kv_head else 4)
    assert vl.row_blocks == sparsek.varlen_max_row_blocks(len(LENS_Q), sum(LENS_Q), max(LENS_Q), 64)
    vl.validate()
    checked = 0
    for b in range(len(LENS_Q)):
        seq = vl.sequence(b)
        if LENS_Q[b] == 0 or LENS_K[b] == 0:
            assert seq is None
            continue
        qs = q[cu_q[b]:cu_q[b + 1]][None]
        ks = k[cu_k[b]:cu_k[b + 1]][None]
        fixed = sparsek.pool_select_topk(qs, ks, 2, per_kv_head=per_kv_head, **OPTS)
        assert np.array_equal(seq.row_offsets, fixed.row_offsets), b
        assert np.array_equal(seq.col_indices, fixed.col_indices), b
        checked += 1
    assert checked == 3
    # Rows past the sequences' own are empty.
    start = int(vl.row_starts[-1])
    off = vl.row_offsets
    for s in range(vl.heads):
        rows = slice(s * vl.row_blocks + start, (s + 1) * vl.row_blocks)
        assert np.all(np.diff(off)[rows] == 0)


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_paged_equals_varlen(page_size):
    rng = seeded_rng(62)
    q, k, cu_q, cu_k = case(rng, np.float32)
    want = sparsek.topk_varlen(q, k, cu_q, cu_k, 3, **OPTS)
    kc, _, table, lens = sparsek.paged_kv_from_dense(k, k, cu_k, page_size, extra_pages=2, seed=5, fill=np.nan)
    got = sparsek.topk_paged(q, kc, cu_q, lens, table, 3, **OPTS)
    assert np.array_equal(got.row_offsets, want.row_offsets)
    assert np.array_equal(got.col_indices, want.col_indices)
    assert np.array_equal(got.cu_seqlens_k, cu_k)


def test_layout_feeds_attention_varlen():
    rng = seeded_rng(63)
    q, k, cu_q, cu_k = case(rng, np.float32)
    v = rng.standard_normal(k.shape).astype(np.float32)
    vl = sparsek.topk_varlen(q, k, cu_q, cu_k, 2, **OPTS)
    out = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=True)
    assert out.shape == q.shape and np.isfinite(out).all()


def test_bad_inputs():
    rng = seeded_rng(64)
    q, k, cu_q, cu_k = case(rng, np.float32)
    with pytest.raises(SparseKError, match="desc->k"):
        sparsek.topk_varlen(q, k, cu_q, cu_k, -1)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        sparsek.topk_varlen(q, k, cu_q, cu_k[:-1], 2)
    bad = cu_k.copy()
    bad[2] = bad[1] - 1
    with pytest.raises(SparseKError, match="cu_seqlens_k"):
        sparsek.topk_varlen(q, k, cu_q, bad, 2)
    kc, _, table, lens = sparsek.paged_kv_from_dense(k, k, cu_k, 16)
    table = table.copy()
    table[0, 0] = kc.shape[0]
    with pytest.raises(SparseKError, match=r"page_table\[0\]\[0\]"):
        sparsek.topk_paged(q, kc, cu_q, lens, table, 2)


@requires_torch
def test_torch_cpu_equals_numpy():
    import torch

    rng = seeded_rng(65)
    q, k, cu_q, cu_k = case(rng, np.float32)
    want = sparsek.topk_varlen(q, k, cu_q, cu_k, 2, **OPTS)
    got = sparsek.topk_varlen(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(cu_q),
                              torch.from_numpy(cu_k), 2, **OPTS)
    assert np.array_equal(got.row_offsets, want.row_offsets)
    assert np.array_equal(got.col_indices, want.col_indices)


@requires_cuda
@pytest.mark.parametrize("page_size", [16, 64])
def test_cuda_equals_cpu(page_size):
    import torch

    rng = seeded_rng(66)
    q, k, cu_q, cu_k = case(rng, np.float16, d=64)
    want = sparsek.topk_varlen(q, k, cu_q, cu_k, 2, **OPTS)
    dev = torch.device("cuda")
    tq, tk = torch.from_numpy(q).to(dev), torch.from_numpy(k).to(dev)
    mq, mk = max(LENS_Q), max(LENS_K)
    got = sparsek.topk_varlen(tq, tk, torch.from_numpy(cu_q).to(dev), torch.from_numpy(cu_k).to(dev), 2,
                              max_seqlen_q=mq, max_seqlen_k=mk, **OPTS)
    assert np.array_equal(got.row_offsets, want.row_offsets)
    assert np.array_equal(got.col_indices, want.col_indices)
    kc, _, table, lens = sparsek.paged_kv_from_dense(tk, tk, torch.from_numpy(cu_k).to(dev), page_size, seed=3)
    got = sparsek.topk_paged(tq, kc, torch.from_numpy(cu_q).to(dev), lens, table, 2, max_seqlen_q=mq,
                             max_seqlen_k=mk, **OPTS)
    assert np.array_equal(got.row_offsets, want.row_offsets)
    assert np.array_equal(got.col_indices, want.col_indices)
