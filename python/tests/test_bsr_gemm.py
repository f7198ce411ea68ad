"""sparsek.bsr_gemm on numpy arrays (CPU backend) against a dense fp64 GEMM."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError

from conftest import seeded_rng


def dense_a(layout, values):
    """The dense m x k matrix of a BSR A (tail elements dropped)."""
    bm, bk = layout.block_rows, layout.block_cols
    a = np.zeros((layout.row_blocks * bm, layout.col_blocks * bk))
    ro, ci = layout.row_offsets, layout.col_indices
    for r in range(layout.row_blocks):
        for idx in range(ro[r], ro[r + 1]):
            c = ci[idx]
            a[r * bm : (r + 1) * bm, c * bk : (c + 1) * bk] = values[idx]
    return a[: layout.rows, : layout.cols]


@pytest.mark.parametrize("m,k,n,block", [(256, 384, 48, 128), (200, 150, 33, (64, 128))])
@pytest.mark.parametrize("col_major_b", [False, True])
def test_bsr_gemm_matches_dense(m, k, n, block, col_major_b):
    rng = seeded_rng(31)
    lay = Layout.random(m, k, k=2, seed=4, block=block)
    vals = rng.standard_normal((lay.nnz, lay.block_rows, lay.block_cols)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if col_major_b:
        b = np.asfortranarray(b)
    c = sparsek.bsr_gemm(vals, b, lay)
    assert c.dtype == np.float32 and c.shape == (m, n)
    want = dense_a(lay, vals.astype(np.float64)) @ b.astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


def test_bsr_gemm_alpha_beta_and_strided_c():
    rng = seeded_rng(32)
    lay = Layout.random(128, 256, k=1, seed=2, block=64)
    vals = rng.standard_normal((lay.nnz, 64, 64)).astype(np.float16)
    b = rng.standard_normal((256, 40)).astype(np.float16)
    big = rng.standard_normal((128, 64)).astype(np.float32)
    c0 = big[:, :40].copy()
    c = big[:, :40]
    res = sparsek.bsr_gemm(vals, b, lay, c=c, alpha=0.5, beta=2.0)
    assert res is c
    want = 0.5 * dense_a(lay, vals.astype(np.float64)) @ b.astype(np.float64) + 2.0 * c0
    np.testing.assert_allclose(c, want, rtol=2e-3, atol=2e-3)


def test_bsr_gemm_empty_rows_keep_beta_c():
    mask = np.array([[1, 0], [0, 0]], np.uint8)
    lay = Layout.from_mask(mask, block=64)
    vals = np.ones((1, 64, 64), np.float32)
    b = np.ones((128, 8), np.float32)
    c = sparsek.bsr_gemm(vals, b, lay, c_dtype="float32")
    assert (c[:64] == 64).all() and (c[64:] == 0).all()


def test_bsr_gemm_bad_inputs():
    lay = Layout.dense(128, 128, block=64)
    vals = np.zeros((4, 64, 64), np.float32)
    b = np.zeros((128, 16), np.float32)
    with pytest.raises(ValueError, match="a_values has shape"):
        sparsek.bsr_gemm(vals[:3], b, lay)
    with pytest.raises(ValueError, match="rows"):
        sparsek.bsr_gemm(vals, b[:64], lay)
    with pytest.raises(TypeError, match="same dtype"):
        sparsek.bsr_gemm(vals, b.astype(np.float16), lay)
    with pytest.raises(ValueError, match="batch = heads = 1"):
        sparsek.bsr_gemm(vals, b, Layout.dense(128, block=64, heads=2))
    with pytest.raises(ValueError, match=r"c has shape"):
        sparsek.bsr_gemm(vals, b, lay, c=np.zeros((128, 8), np.float32))
    with pytest.raises(ValueError, match="backend"):
        sparsek.bsr_gemm(vals, b, lay, backend="cuda")


def test_bsr_gemm_overlap_is_a_library_error():
    lay = Layout.dense(64, 64, block=64)
    buf = np.zeros((64, 64), np.float32)
    with pytest.raises(SparseKError) as e:
        sparsek.bsr_gemm(np.zeros((1, 64, 64), np.float32), buf, lay, c=buf)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_STRIDE"
