"""Decode page selection (sparsek.kv_summary_build / kv_summary_append /
decode_select): summaries against a numpy brute force through the page
table, append against a rebuild, the selection against a numpy fp64
Quest bound head by head with a full sort (quantised inputs: exact sums,
many ties), torch CPU tensors equal to numpy, CUDA equal to the CPU bit for
bit (skipped without a GPU), bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import SparseKError

from conftest import requires_cuda, requires_torch, seeded_rng


def paged_case(rng, dtype, lens, page_size=16, hkv=2, d=64, quant=True, spare=3):
    """A cache with shuffled pages (NaN in unused ones and slots), the table
    (unused entries -1) and the keys per sequence, position-ordered."""
    lens = np.asarray(lens, np.int32)
    pages = [(-(-int(n) // page_size)) for n in lens]
    num_pages = sum(pages) + spare
    perm = rng.permutation(num_pages)
    max_pages = max(max(pages), 1) + 1
    table = np.full((len(lens), max_pages), -1, np.int32)
    cache = np.full((num_pages, page_size, hkv, d), np.nan, np.float32)
    keys = []
    at = 0
    for b, n in enumerate(lens):
        kb = (rng.integers(-8, 9, (int(n), hkv, d)) / 8.0) if quant else rng.standard_normal((int(n), hkv, d))
        keys.append(kb.astype(dtype).astype(np.float64))
        for i in range(pages[b]):
            table[b, i] = perm[at]
            at += 1
        for pos in range(int(n)):
            cache[table[b, pos // page_size], pos % page_size] = kb[pos]
    return cache.astype(dtype), table, lens, keys


def naive_summary(keys, lens, block_k, max_blocks, hkv, d):
    out = np.empty((len(lens), hkv, max_blocks, 2, d))
    out[..., 0, :] = np.inf
    out[..., 1, :] = -np.inf
    for b, kb in enumerate(keys):
        for j in range(-(-int(lens[b]) // block_k)):
            blk = kb[j * block_k:(j + 1) * block_k]  # [n, hkv, d]
            out[b, :, j, 0] = blk.min(axis=0)
            out[b, :, j, 1] = blk.max(axis=0)
    return out


def naive_select(q, summary, lens, k, block_k, sinks, recent, scale):
    """Rows b * Hkv + h: forced blocks, then the k best fp64 Quest bounds
    (sum over the group's heads and the tokens), ties to the lower index."""
    B, T, hq, d = q.shape
    hkv = summary.shape[1]
    g = hq // hkv
    rows = []
    for b in range(B):
        n = -(-int(lens[b]) // block_k)
        for h in range(hkv):
            qs = q[b, :, h * g:(h + 1) * g].astype(np.float64).reshape(-1, d)  # [T*g, d]
            mn, mx = summary[b, h, :n, 0], summary[b, h, :n, 1]
            bound = np.maximum(qs[:, None, :] * mn[None], qs[:, None, :] * mx[None]).sum(axis=(0, 2)) * scale
            forced = [j for j in range(n) if j < sinks or j >= n - recent]
            rest = [j for j in range(n) if j not in forced and not np.isnan(bound[j]) and bound[j] != -np.inf]
            rest.sort(key=lambda j: (-bound[j], j))
            rows.append(np.array(sorted(forced + rest[:k]), np.int32))
    return rows


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block_k,page_size", [(16, 64), (64, 16), (32, 32), (128, 64)])
def test_summary_build_and_append(dtype, block_k, page_size):
    rng = seeded_rng(block_k * 7 + page_size)
    lens = [300, 0, 129, 5]
    cache, table, lens, keys = paged_case(rng, dtype, lens, page_size)
    s = sparsek.kv_summary_build(cache, table, lens, block_k=block_k, max_seqlen_k=300)
    max_blocks = -(-300 // block_k)
    want = naive_summary(keys, lens, block_k, max_blocks, 2, 64)
    assert s.shape == want.shape and s.dtype == cache.dtype
    np.testing.assert_array_equal(s.astype(np.float64), want)
    old = np.array([250, 0, 64, 1], np.int32)
    s2 = sparsek.kv_summary_build(cache, table, old, block_k=block_k, max_seqlen_k=300)
    sparsek.kv_summary_append(s2, cache, table, old, lens, block_k=block_k, max_seqlen_k=300)
    np.testing.assert_array_equal(s2, s)


@pytest.mark.parametrize("q_len,hq", [(1, 2), (1, 8), (4, 4), (16, 16)])
def test_select_matches_naive(q_len, hq):
    rng = seeded_rng(q_len * 100 + hq)
    dtype, block_k = np.float16, 32
    lens = [1000, 31, 0, 520]
    cache, table, lens, keys = paged_case(rng, dtype, lens, 64, hkv=2)
    q = (rng.integers(-8, 9, (4, q_len, hq, 64)) / 4.0).astype(dtype)
    s = sparsek.kv_summary_build(cache, table, lens, block_k=block_k)
    for k, sinks, recent in [(5, 1, 2), (0, 0, 0), (40, 2, 1), (1000, 0, 3)]:
        sel = sparsek.decode_select(q, s, lens, k, block_k=block_k, sink_blocks=sinks, recent_blocks=recent,
                                    scale=0.5)
        want = naive_select(q, s.astype(np.float64), lens, k, block_k, sinks, recent, 0.5)
        got = sel.rows()
        assert len(got) == len(want)
        for r, (a, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(a, w, err_msg=f"row {r}, k {k}")
        assert sel.nnz == sum(len(w) for w in want) <= sel.capacity
        g = sel.grid
        assert (g.batch, g.heads, g.rows, g.block_rows, g.block_cols) == (4, 2, q_len, 64, block_k)


@requires_torch
def test_torch_cpu_equals_numpy():
    import torch

    rng = seeded_rng(5)
    cache, table, lens, _ = paged_case(rng, np.float32, [200, 77], 32, quant=False)
    q = rng.standard_normal((2, 2, 4, 64)).astype(np.float32)
    s = sparsek.kv_summary_build(cache, table, lens, block_k=16)
    st = sparsek.kv_summary_build(torch.from_numpy(cache), torch.from_numpy(table), torch.from_numpy(lens),
                                  block_k=16)
    np.testing.assert_array_equal(st.numpy(), s)
    a = sparsek.decode_select(q, s, lens, 3, block_k=16).rows()
    b = sparsek.decode_select(torch.from_numpy(q), st, torch.from_numpy(lens), 3, block_k=16).rows()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@requires_cuda
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_cuda_equals_cpu_bitwise(dtype_name):
    import torch

    dt = getattr(torch, dtype_name)
    rng = seeded_rng(11)
    cache, table, lens, _ = paged_case(rng, np.float32, [3000, 1, 0, 700], 64, hkv=4, d=128, quant=False)
    q = torch.from_numpy(rng.standard_normal((4, 1, 16, 128)).astype(np.float32)).to(dt)
    cache_t = torch.from_numpy(cache).to(dt)
    s_cpu = sparsek.kv_summary_build(cache_t, torch.from_numpy(table), torch.from_numpy(lens), block_k=32)
    s_gpu = sparsek.kv_summary_build(cache_t.cuda(), torch.from_numpy(table).cuda(), torch.from_numpy(lens).cuda(),
                                     block_k=32)
    assert torch.equal(s_gpu.cpu().view(torch.int16), s_cpu.view(torch.int16))
    a = sparsek.decode_select(q, s_cpu, torch.from_numpy(lens), 20, block_k=32)
    b = sparsek.decode_select(q.cuda(), s_gpu, torch.from_numpy(lens).cuda(), 20, block_k=32)
    assert a.nnz == b.nnz
    for x, y in zip(a.rows(), b.rows()):
        np.testing.assert_array_equal(x, y)


def test_bad_inputs():
    rng = seeded_rng(3)
    cache, table, lens, _ = paged_case(rng, np.float32, [100, 10], 16)
    with pytest.raises(ValueError, match="block_k"):
        sparsek.kv_summary_build(cache, table, lens, block_k=48)
    with pytest.raises(ValueError, match="cannot run"):
        sparsek.kv_summary_build(cache, table, lens, backend="cuda")
    with pytest.raises(ValueError, match="k_cache"):
        sparsek.kv_summary_build(cache[0], table, lens)
    bad = table.copy()
    bad[0, 0] = 10**6
    with pytest.raises(SparseKError, match=r"page_table\[0\]\[0\]"):
        sparsek.kv_summary_build(cache, bad, lens)
    s = sparsek.kv_summary_build(cache, table, lens)
    with pytest.raises(SparseKError, match=r"old_lens\[1\]"):
        sparsek.kv_summary_append(s, cache, table, np.array([100, 11], np.int32), lens)
    q = np.zeros((2, 1, 4, 48), np.float32)
    with pytest.raises(ValueError, match="does not match"):
        sparsek.decode_select(q, s, lens)
    q = np.zeros((2, 65, 4, 64), np.float32)
    with pytest.raises(SparseKError, match="q_len"):
        sparsek.decode_select(q, s, lens)
