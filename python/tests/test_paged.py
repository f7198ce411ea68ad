"""The paged KV cache: sparsek.attention_paged over caches made by
paged_kv_from_dense (every page size, shuffled pages, NaN in unused slots)
must equal sparsek.attention_varlen on the packed keys bit for bit, and
the fp64 reference on chunked prefill; bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import SparseKError, VarlenLayout

from conftest import assert_close_rule, cu_of, float_dtypes, requires_cuda, requires_torch, seeded_rng

DTYPES = float_dtypes()


LENS_Q = [30, 0, 64, 1, 100]
LENS_K = [300, 40, 64, 0, 257]


def case(rng, dtype, hq=4, hkv=2, d=32, lens_q=LENS_Q, lens_k=LENS_K):
    q = rng.standard_normal((sum(lens_q), hq, d)).astype(dtype)
    k = rng.standard_normal((sum(lens_k), hkv, d)).astype(dtype)
    v = rng.standard_normal((sum(lens_k), hkv, d)).astype(dtype)
    return q, k, v, cu_of(lens_q), cu_of(lens_k)


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_varlen_bitwise(page_size, dtype):
    rng = seeded_rng(31)
    q, k, v, cu_q, cu_k = case(rng, dtype)
    vl = VarlenLayout.random(cu_q, cu_k, k=3, seed=5, block=64, heads=2, causal=True)
    want, want_lse = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=True, return_lse=True)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_k, page_size, extra_pages=3, seed=7, fill=np.nan)
    pages = sum(-(-n // page_size) for n in LENS_K)
    assert kc.shape == vc.shape == (pages + 3, page_size, 2, 32)
    # Every slot no sequence uses holds the fill, and only those.
    assert np.isnan(kc.astype(np.float32)).sum() == (kc.shape[0] * page_size - sum(LENS_K)) * 2 * 32
    assert np.array_equal(lens, np.diff(cu_k)) and table.dtype == np.int32
    got, lse = sparsek.attention_paged(q, kc, vc, cu_q, lens, table, vl, causal=True, return_lse=True)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.array_equal(lse, want_lse)


def test_one_sequence_equals_varlen_bitwise():
    """B = 1 (one length in seq_lens_k, two in cu_seqlens_q): the CPU
    binding once wanted B + 1 >= 2 lengths in seq_lens_k too."""
    rng = seeded_rng(34)
    q, k, v, cu_q, cu_k = case(rng, np.float32, lens_q=[90], lens_k=[90])
    vl = VarlenLayout.causal(cu_q, cu_k, block=64)
    want = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=True)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_k, 16, extra_pages=1, seed=2, fill=np.nan)
    assert lens.shape == (1,)
    got = sparsek.attention_paged(q, kc, vc, cu_q, lens, table, vl, causal=True)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_chunked_prefill_against_the_reference():
    """New queries (the last len_q of each sequence's keys) over a cached
    context, causal: each sequence against the dense fp64 reference."""
    rng = seeded_rng(32)
    lens_q, lens_k = [64, 1, 17], [640, 300, 17]
    q, k, v, cu_q, cu_k = case(rng, np.float32, hq=8, hkv=1, d=64, lens_q=lens_q, lens_k=lens_k)
    vl = VarlenLayout.sinks_window(cu_q, cu_k, sink_tokens=64, window_tokens=128, block=64)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_k, 16, seed=1, fill=np.nan)
    out, lse = sparsek.attention_paged(q, kc, vc, cu_q, lens, table, vl, causal=True, return_lse=True)
    assert not np.isnan(out).any()
    for b in range(3):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        seq = vl.sequence(b)
        assert_close_rule(
            out[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], seq.to_mask(), seq.grid,
            causal=True, lse=lse[None, :, q0:q1],
        )


def test_strided_table_and_caches():
    """A page table that is a column slice of a wider one, caches that are
    views of a larger buffer: the strides reach the library."""
    rng = seeded_rng(33)
    q, k, v, cu_q, cu_k = case(rng, np.float32)
    vl = VarlenLayout.causal(cu_q, cu_k, block=64, heads=2)
    want = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=True)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_k, 32, seed=2, fill=np.nan)
    wide = np.full((table.shape[0], table.shape[1] + 4), 12345, np.int32)
    wide[:, 2 : 2 + table.shape[1]] = table
    big = np.full(kc.shape[:3] + (48,), np.nan, np.float32)
    big[..., 8:40] = kc
    got = sparsek.attention_paged(q, big[..., 8:40], vc, cu_q, lens, wide[:, 2 : 2 + table.shape[1]], vl, causal=True)
    assert np.array_equal(got, want)


def test_bad_inputs():
    rng = seeded_rng(34)
    q, k, v, cu_q, cu_k = case(rng, np.float32)
    vl = VarlenLayout.causal(cu_q, cu_k, block=64, heads=2)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_k, 16)
    bad = table.copy()
    bad[0, 3] = kc.shape[0]
    with pytest.raises(SparseKError) as e:
        sparsek.attention_paged(q, kc, vc, cu_q, lens, bad, vl)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_VALUE" and "page_table[0][3]" in e.value.message
    kc8, vc8, table8, lens8 = sparsek.paged_kv_from_dense(k, v, cu_k, 8)
    with pytest.raises(SparseKError) as e:
        sparsek.attention_paged(q, kc8, vc8, cu_q, lens8, table8, vl)
    assert "page_size = 8" in e.value.message
    with pytest.raises(ValueError, match="differ from the lengths"):
        sparsek.attention_paged(q, kc, vc, cu_q, lens[::-1].copy(), table, vl)
    with pytest.raises(ValueError, match="4 dimensions"):
        sparsek.attention_paged(q, k, v, cu_q, lens, table, vl)
    with pytest.raises(ValueError, match="seq_lens_k has"):
        sparsek.attention_paged(q, kc, vc, cu_q, lens[:-1], table, vl)


@requires_torch
def test_torch_cpu_equals_numpy():
    import torch

    rng = seeded_rng(35)
    q, k, v, cu_q, cu_k = case(rng, np.float32)
    vl = VarlenLayout.window(cu_q, cu_k, left=100, block=64, heads=2)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_k, 64, seed=3)
    want = sparsek.attention_paged(q, kc, vc, cu_q, lens, table, vl)
    tk, tv = torch.from_numpy(k), torch.from_numpy(v)
    tkc, tvc, ttable, tlens = sparsek.paged_kv_from_dense(tk, tv, torch.from_numpy(cu_k), 64, seed=3)
    assert torch.equal(tkc, torch.from_numpy(kc)) and torch.equal(ttable, torch.from_numpy(table))
    got = sparsek.attention_paged(torch.from_numpy(q), tkc, tvc, torch.from_numpy(cu_q), tlens, ttable, vl)
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want)


@requires_cuda
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_cuda_matches_the_cpu_backend(page_size):
    """The CUDA paged kernel (caches, table and lengths on the device,
    shuffled pages, NaN in every unused slot) against the CPU backend on
    the same bf16 inputs, causal chunked-prefill style (len_q <= len_k)."""
    import torch

    rng = seeded_rng(36)
    lens_q, lens_k = [30, 0, 64, 1, 100], [200, 20, 64, 130, 300]
    q, k, v, cu_q, cu_k = case(rng, np.float32, d=64, lens_q=lens_q, lens_k=lens_k)
    vl = VarlenLayout.random(cu_q, cu_k, k=3, seed=5, block=64, heads=2, causal=True)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    kc, vc, table, lens = sparsek.paged_kv_from_dense(
        tk, tv, torch.from_numpy(cu_k), page_size, extra_pages=2, seed=4, fill=float("nan")
    )
    want, want_lse = sparsek.attention_paged(tq, kc, vc, cu_q, lens, table, vl, causal=True, return_lse=True)
    got, lse = sparsek.attention_paged(
        tq.cuda(), kc.cuda(), vc.cuda(), torch.from_numpy(cu_q).cuda(), lens.cuda(), table.cuda(), vl,
        max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), causal=True, return_lse=True,
    )
    torch.cuda.synchronize()
    assert not torch.isnan(got.float()).any()
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=2e-3, rtol=2e-3)