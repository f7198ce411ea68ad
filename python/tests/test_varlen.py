"""Varlen batches: VarlenLayout's builders against the fixed-batch builders
on each sequence, and sparsek.attention_varlen (numpy and torch CPU)
against the fp64 reference on each sequence's unpacked rows and bit for
bit against sparsek.attention on each sequence alone; bad inputs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError, VarlenLayout

from conftest import assert_close_rule, cu_of, float_dtypes, requires_cuda, requires_torch, seeded_rng

DTYPES = float_dtypes()


LENS_Q = [100, 0, 200, 1, 64, 130]
LENS_K = [150, 20, 80, 0, 64, 300]


def packed_qkv(rng, lens_q, lens_k, hq, hkv, d, dtype=np.float32):
    q = rng.standard_normal((sum(lens_q), hq, d)).astype(dtype)
    k = rng.standard_normal((sum(lens_k), hkv, d)).astype(dtype)
    v = rng.standard_normal((sum(lens_k), hkv, d)).astype(dtype)
    return q, k, v


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------

BUILDERS = {
    "dense": ({}, {}),
    "causal": ({}, {}),
    "window": ({"left": 90, "right": 20}, {"left": 90, "right": 20}),
    "sinks_window": ({"sink_tokens": 30, "window_tokens": 100}, {"sink_tokens": 30, "window_tokens": 100}),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("block", [64, (128, 64)])
def test_builders_equal_fixed_builders_per_sequence(name, block):
    kw, fixed_kw = BUILDERS[name]
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    vl = getattr(VarlenLayout, name)(cu_q, cu_k, block=block, heads=2, **kw)
    vl.validate()
    assert vl.batch == 1 and vl.heads == 2 and vl.num_seqs == len(LENS_Q)
    assert tuple(vl.grid) == tuple(sparsek.varlen_layout_grid(cu_q, cu_k, block=block, heads=2))
    assert vl.row_blocks == vl.row_starts[-1]
    for b, (lq, lk) in enumerate(zip(LENS_Q, LENS_K)):
        seq = vl.sequence(b)
        if lq == 0 or lk == 0:
            assert seq is None
            continue
        want = getattr(Layout, name)(lq, lk, block=block, heads=2, **fixed_kw)
        assert np.array_equal(seq.to_mask(), want.to_mask()), f"sequence {b}"
    # A sequence with queries but no key has empty rows.
    start = int(vl.row_starts[3])
    off = vl.row_offsets
    assert off[start + 1] == off[start]


def test_random_is_reproducible_and_per_sequence():
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    a = VarlenLayout.random(cu_q, cu_k, k=2, seed=7, block=64, heads=3, causal=True)
    b = VarlenLayout.random(cu_q, cu_k, k=2, seed=7, block=64, heads=3, causal=True)
    c = VarlenLayout.random(cu_q, cu_k, k=2, seed=8, block=64, heads=3, causal=True)
    a.validate()
    assert np.array_equal(a.col_indices, b.col_indices) and np.array_equal(a.row_offsets, b.row_offsets)
    assert not np.array_equal(a.col_indices, c.col_indices)
    counts = np.diff(a.row_offsets)
    assert counts.max() <= 2


def test_from_masks_and_from_layouts_round_trip():
    rng = seeded_rng(11)
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    masks = [rng.random((2, -(-lq // 64), -(-lk // 128))) < 0.5 for lq, lk in zip(LENS_Q, LENS_K)]
    vl = VarlenLayout.from_masks(masks, cu_q, cu_k, block=(64, 128), heads=2)
    vl.validate()
    seqs = [vl.sequence(b) for b in range(vl.num_seqs)]
    for b, s in enumerate(seqs):
        if s is not None:
            assert np.array_equal(s.to_mask(), masks[b].astype(np.uint8)), f"sequence {b}"
    again = VarlenLayout.from_layouts(seqs, cu_q, cu_k)
    assert np.array_equal(again.row_offsets, vl.row_offsets)
    assert np.array_equal(again.col_indices, vl.col_indices)
    copy = pickle.loads(pickle.dumps(vl))
    assert isinstance(copy, VarlenLayout)
    assert np.array_equal(copy.col_indices, vl.col_indices) and np.array_equal(copy.cu_seqlens_k, cu_k)
    spare = VarlenLayout.from_bsr(
        np.concatenate([vl.row_offsets[: vl.row_blocks + 1], [vl.row_offsets[vl.row_blocks]],
                        vl.row_offsets[vl.row_blocks + 1:], [vl.nnz]]),
        vl.col_indices, cu_q, cu_k, block=(64, 128), heads=2, row_blocks=vl.row_blocks + 1,
    )
    assert spare.row_blocks == vl.row_blocks + 1
    spare.validate()


def test_max_row_blocks():
    assert sparsek.varlen_max_row_blocks(2, 130, 128, 64) == 4
    assert sparsek.varlen_max_row_blocks(3, 2, 1, 64) == 2
    assert sparsek.varlen_max_row_blocks(64, 64 * 16384, 16384, 128) == 64 * 128
    with pytest.raises(SparseKError) as e:
        sparsek.varlen_max_row_blocks(0, 10, 10)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_SHAPE"


def test_layout_errors():
    with pytest.raises(SparseKError) as e:
        VarlenLayout.causal([0, 10, 5], block=64)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_SHAPE" and "cu_seqlens_q[2]" in e.value.message
    with pytest.raises(ValueError):
        VarlenLayout.causal([0, 10, 20], [0, 10], block=64)
    with pytest.raises(TypeError):
        VarlenLayout.causal(np.array([0.0, 1.0]), block=64)
    with pytest.raises(ValueError, match="masks"):
        VarlenLayout.from_masks([np.ones((1, 1))], [0, 10, 20], block=64)
    with pytest.raises(SparseKError) as e:
        VarlenLayout.from_layouts([Layout.dense(10, 11, block=64)], [0, 10], [0, 10])
    assert e.value.status_name == "SK_STATUS_BAD_LAYOUT_MISMATCH"


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def check_against_reference(out, lse, q, k, v, vl, causal, scale=None):
    """Each sequence's rows against the fp64 reference of its own problem."""
    cu_q, cu_k = vl.cu_seqlens_q, vl.cu_seqlens_k
    for b in range(vl.num_seqs):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0:
            continue
        if k1 == k0:
            assert (np.asarray(out[q0:q1]).astype(np.float64) == 0).all()
            assert np.isneginf(lse[:, q0:q1]).all()
            continue
        seq = vl.sequence(b)
        assert_close_rule(
            out[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], seq.to_mask(), seq.grid,
            causal=causal, scale=scale, lse=lse[None, :, q0:q1],
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference_and_fixed_batch(dtype, causal):
    rng = seeded_rng(21)
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    q, k, v = packed_qkv(rng, LENS_Q, LENS_K, 4, 2, 32, dtype)
    vl = VarlenLayout.random(cu_q, cu_k, k=2, seed=3, block=64, heads=2, causal=causal)
    out, lse = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=causal, return_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (4, q.shape[0])
    check_against_reference(out, lse, q, k, v, vl, causal)
    # Bit for bit the fixed-batch forward on each sequence alone.
    for b in range(vl.num_seqs):
        seq = vl.sequence(b)
        if seq is None:
            continue
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        o1, l1 = sparsek.attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], seq, causal=causal, return_lse=True)
        assert np.array_equal(o1[0].view(np.uint8), out[q0:q1].view(np.uint8)), f"sequence {b}"
        assert np.array_equal(l1[0], lse[:, q0:q1])


def test_gqa_window_scale_and_strided_inputs():
    rng = seeded_rng(22)
    lens_q, lens_k = [70, 300, 5], [200, 310, 5]
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    big = rng.standard_normal((sum(lens_q), 8, 80)).astype(np.float32)
    q = big[:, :, 8:72]  # strided: token stride 640, head stride 80
    _, k, v = packed_qkv(rng, lens_q, lens_k, 8, 1, 64)
    vl = VarlenLayout.window(cu_q, cu_k, left=100, right=10, block=(128, 64), heads=8)
    out = np.full(q.shape, np.nan, np.float32)
    res, lse = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, scale=0.3, out=out, return_lse=True)
    assert res is out and not np.isnan(out).any()
    check_against_reference(out, lse, q, k, v, vl, False, scale=0.3)


def test_lengths_must_match_the_layout_and_add_up():
    rng = seeded_rng(23)
    cu = cu_of([64, 64])
    q, k, v = packed_qkv(rng, [64, 64], [64, 64], 2, 2, 16)
    vl = VarlenLayout.causal(cu, block=64)
    with pytest.raises(ValueError, match="differ from the lengths"):
        sparsek.attention_varlen(q, k, v, cu_of([32, 96]), cu, vl)
    # A plain Layout of the same arrays: the library checks the lengths.
    plain = Layout.from_bsr(vl.row_offsets, vl.col_indices, vl.rows, vl.cols, block=64)
    with pytest.raises(SparseKError) as e:
        sparsek.attention_varlen(q, k, v, np.array([0, 70, 60], np.int32), cu, plain)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_SHAPE" and "cu_seqlens_q[2] = 60" in e.value.message
    with pytest.raises(SparseKError) as e:
        sparsek.attention_varlen(q, k, v, cu, cu, plain, max_seqlen_q=10)
    assert "max_seqlen_q = 10" in e.value.message
    with pytest.raises(ValueError, match="3 dimensions"):
        sparsek.attention_varlen(q[None], k, v, cu, cu, vl)
    with pytest.raises(TypeError, match="VarlenLayout"):
        sparsek.attention_varlen(q, k, v, cu, cu, "causal")


@requires_torch
def test_torch_cpu_equals_numpy():
    import torch

    rng = seeded_rng(24)
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    q, k, v = packed_qkv(rng, LENS_Q, LENS_K, 4, 1, 64)
    vl = VarlenLayout.causal(cu_q, cu_k, block=64, heads=1)
    want, want_lse = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=True, return_lse=True)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    got, lse = sparsek.attention_varlen(
        tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k), vl, causal=True, return_lse=True,
        max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K),
    )
    assert isinstance(got, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert np.array_equal(got.numpy(), want) and np.array_equal(lse.numpy(), want_lse)
    for dt in (torch.float16, torch.bfloat16):
        o = sparsek.attention_varlen(tq.to(dt), tk.to(dt), tv.to(dt), cu_q, cu_k, vl, causal=True)
        assert o.dtype == dt and not torch.isnan(o.float()).any()
    # Differentiable now (test_varlen_autograd.py checks the gradients).
    assert sparsek.attention_varlen(tq.requires_grad_(True), tk, tv, cu_q, cu_k, vl).requires_grad


@requires_cuda
def test_cuda_matches_the_cpu_backend():
    """The CUDA kernels (torch CUDA tensors, device length arrays, the
    portable and the default backend) against the CPU backend on the same
    fp16 / bf16 inputs: causal, two layout head slices, GQA, LSE (-inf
    where a query has no key). SK_BACKEND_CUDA_SM90 (the Hopper kernel)
    declines these blocks of 64 and says so."""
    import torch

    rng = seeded_rng(30)
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    q, k, v = packed_qkv(rng, LENS_Q, LENS_K, 4, 2, 64)
    vl = VarlenLayout.window(cu_q, cu_k, left=100, block=64, heads=2)
    dcu_q, dcu_k = torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda()
    for dt in (torch.float16, torch.bfloat16):
        tq, tk, tv = (torch.from_numpy(x).to(dt) for x in (q, k, v))
        want, want_lse = sparsek.attention_varlen(tq, tk, tv, cu_q, cu_k, vl, causal=True, return_lse=True)
        for backend in (None, "cuda_sm80"):
            got, lse = sparsek.attention_varlen(
                tq.cuda(), tk.cuda(), tv.cuda(), dcu_q, dcu_k, vl, max_seqlen_q=max(LENS_Q),
                max_seqlen_k=max(LENS_K), causal=True, return_lse=True, backend=backend,
            )
            torch.cuda.synchronize()
            torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(lse.cpu(), want_lse, atol=2e-3, rtol=2e-3)
    with pytest.raises(SparseKError) as e:
        sparsek.attention_varlen(
            tq.cuda(), tk.cuda(), tv.cuda(), dcu_q, dcu_k, vl, max_seqlen_q=max(LENS_Q),
            max_seqlen_k=max(LENS_K), backend="cuda_sm90",
        )
    assert e.value.status_name == "SK_STATUS_NOT_SUPPORTED"