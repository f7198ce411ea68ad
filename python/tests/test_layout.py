"""Layout builders against token-level definitions written here from the
header, conversions and their round trips, and bad layouts."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError

from conftest import block_any, positions, seeded_rng

GEOMS = [
    # (Sq, Sk, block)
    (256, 256, 64),
    (200, 330, (64, 128)),
    (330, 200, (128, 64)),
    (64, 64, 64),
]


def _blocks(block):
    return block if isinstance(block, tuple) else (block, block)


def check_uniform(layout, expected_2d):
    """Every slice equals the expected [rb, cb] block mask."""
    m = layout.to_mask()
    assert m.shape == (layout.slices,) + expected_2d.shape
    for s in range(layout.slices):
        np.testing.assert_array_equal(m[s].astype(bool), expected_2d)


@pytest.mark.parametrize("sq,sk,block", GEOMS)
def test_dense(sq, sk, block):
    lay = Layout.dense(sq, sk, block=block, batch=2, heads=3)
    bq, bk = _blocks(block)
    rb, cb = -(-sq // bq), -(-sk // bk)
    assert lay.grid == sparsek.Grid(sq, sk, bq, bk, 2, 3)
    assert (lay.row_blocks, lay.col_blocks, lay.slices) == (rb, cb, 6)
    assert lay.nnz == 6 * rb * cb and lay.density == 1.0
    check_uniform(lay, np.ones((rb, cb), bool))
    assert lay.selected_blocks(2, 6) == 2 * 6 * rb * cb


@pytest.mark.parametrize("sq,sk,block", GEOMS)
def test_causal(sq, sk, block):
    bq, bk = _blocks(block)
    lay = Layout.causal(sq, sk, block=block)
    p, k = positions(sq, sk)
    check_uniform(lay, block_any(k <= p, bq, bk))


@pytest.mark.parametrize("sq,sk,block", GEOMS)
@pytest.mark.parametrize("left,right", [(0, 0), (70, 0), (100, 30), (1000, 1000)])
def test_window(sq, sk, block, left, right):
    bq, bk = _blocks(block)
    lay = Layout.window(sq, sk, left=left, right=right, block=block, heads=2)
    p, k = positions(sq, sk)
    check_uniform(lay, block_any((p - left <= k) & (k <= p + right), bq, bk))


@pytest.mark.parametrize("sq,sk,block", GEOMS)
@pytest.mark.parametrize("sinks,window", [(0, 1), (10, 64), (64, 100), (1, 500)])
def test_sinks_window(sq, sk, block, sinks, window):
    bq, bk = _blocks(block)
    lay = Layout.sinks_window(sq, sk, sink_tokens=sinks, window_tokens=window, block=block)
    p, k = positions(sq, sk)
    allow = (k <= p) & ((k < sinks) | (k > p - window))
    check_uniform(lay, block_any(allow, bq, bk))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("stride,local", [(1, 0), (2, 1), (3, 2), (4, 0)])
def test_strided_square(causal, stride, local):
    # Square grid without tails: the diagonal block of row i is i.
    n = 8
    lay = Layout.strided(n * 64, stride=stride, local_blocks=local, causal=causal, block=64)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    dist = np.abs(i - j)
    keep = (dist < local) | (dist % stride == 0)
    if causal:
        keep &= j <= i
    check_uniform(lay, keep)


def test_random():
    lay = Layout.random(512, 768, k=3, seed=7, block=64, batch=2, heads=4)
    m = lay.to_mask()
    assert m.shape == (8, 8, 12)
    assert (m.sum(-1) == 3).all()
    assert lay.nnz == 8 * 8 * 3
    # Reproducible, and seeded.
    np.testing.assert_array_equal(Layout.random(512, 768, k=3, seed=7, block=64, batch=2, heads=4).to_mask(), m)
    assert not np.array_equal(Layout.random(512, 768, k=3, seed=8, block=64, batch=2, heads=4).to_mask(), m)
    # Slices draw independently.
    assert any(not np.array_equal(m[0], m[s]) for s in range(1, 8))
    # k is clipped to the candidates.
    big = Layout.random(256, 256, k=100, seed=1, block=64)
    assert big.nnz == 16


def test_random_causal():
    lay = Layout.random(512, 512, k=2, seed=3, causal=True, block=64, heads=3)
    p, k = positions(512, 512)
    allowed = block_any(k <= p, 64, 64)
    m = lay.to_mask().astype(bool)
    assert not (m & ~allowed).any()
    # Row i has i+1 candidates: min(2, i+1) picked.
    np.testing.assert_array_equal(m.sum(-1), np.minimum(2, np.arange(8) + 1)[None].repeat(3, 0))


def test_topk_picks_highest_scores():
    rng = seeded_rng(11)
    scores = rng.standard_normal((2, 6, 6)).astype(np.float32)
    lay = Layout.topk(scores, k=2, block=64, heads=2)
    assert (lay.rows, lay.cols, lay.heads) == (384, 384, 2)
    want = np.zeros(scores.shape, bool)
    top = np.argsort(-scores, axis=-1, kind="stable")[..., :2]
    np.put_along_axis(want, top, True, axis=-1)
    np.testing.assert_array_equal(lay.to_mask().astype(bool), want)


def test_topk_forced_blocks_causal_and_nan():
    n = 6
    scores = np.zeros((1, n, n), np.float32)
    scores[0] = np.arange(n)[None, :] * 1.0  # prefer high columns
    scores[0, :, 3] = np.nan  # never picked by score
    lay = Layout.topk(scores, k=1, sink_blocks=1, local_blocks=1, causal=True, block=64)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    want = (j == 0) | (j == i)  # forced: sink block 0, diagonal block
    # Then one more by score among j < i, j not 0, not NaN: the highest index.
    for r in range(n):
        cands = [c for c in range(1, r) if c != 3]
        if cands:
            want[r, max(cands)] = True
    np.testing.assert_array_equal(lay.to_mask()[0].astype(bool), want)


def test_topk_ties_go_to_lower_index():
    scores = np.ones((4, 4), np.float32)
    lay = Layout.topk(scores, k=2, block=128)
    np.testing.assert_array_equal(lay.to_mask()[0], np.array([[1, 1, 0, 0]] * 4, np.uint8))


def test_mask_round_trip_and_arrays():
    rng = seeded_rng(5)
    mask = (rng.random((2, 3, 5, 7)) < 0.4).astype(np.uint8)
    mask[0, 0, 2] = 0  # an empty row
    lay = Layout.from_mask(mask, block=(64, 128))
    assert (lay.batch, lay.heads, lay.rows, lay.cols) == (2, 3, 320, 896)
    np.testing.assert_array_equal(lay.to_mask(), mask.reshape(6, 5, 7))
    flat = mask.reshape(-1, 7)
    ro = np.concatenate([[0], np.cumsum(flat.sum(-1))]).astype(np.int32)
    ci = np.concatenate([np.nonzero(r)[0] for r in flat]).astype(np.int32)
    np.testing.assert_array_equal(lay.row_offsets, ro)
    np.testing.assert_array_equal(lay.col_indices, ci)
    assert lay.nnz == int(mask.sum())
    assert lay.density == pytest.approx(mask.mean())
    # Copies, not views into the layout.
    lay.row_offsets[:] = -1
    np.testing.assert_array_equal(lay.row_offsets, ro)
    # bool and 3-D / 2-D forms, tails given explicitly.
    lay3 = Layout.from_mask(mask.reshape(6, 5, 7).astype(bool), 300, 850, block=(64, 128), batch=2)
    assert (lay3.batch, lay3.heads, lay3.rows, lay3.cols) == (2, 3, 300, 850)
    np.testing.assert_array_equal(lay3.to_mask(), mask.reshape(6, 5, 7))
    lay2 = Layout.from_mask(mask[0, 0], block=(64, 128))
    assert lay2.slices == 1


def test_bsr_round_trip():
    src = Layout.random(700, 500, k=2, seed=9, block=128, heads=2)
    copy = Layout.from_bsr(src.row_offsets, src.col_indices, 700, 500, block=128, heads=2)
    np.testing.assert_array_equal(copy.to_mask(), src.to_mask())
    copy.validate()


def test_flex_round_trip():
    rng = seeded_rng(21)
    mask = (rng.random((3, 4, 6)) < 0.5).astype(np.uint8)
    lay = Layout.from_mask(mask, block=64)
    counts, indices = lay.to_flex()
    np.testing.assert_array_equal(counts, mask.sum(-1))
    for s in range(3):
        for r in range(4):
            n = counts[s, r]
            np.testing.assert_array_equal(indices[s, r, :n], np.nonzero(mask[s, r])[0])
            assert sorted(indices[s, r]) == list(range(6))  # a permutation
    # Shuffled selected entries and extra padding are accepted.
    shuffled = np.full((3, 4, 9), 99, np.int32)
    for s in range(3):
        for r in range(4):
            sel = np.nonzero(mask[s, r])[0]
            shuffled[s, r, : len(sel)] = rng.permutation(sel)
    back = Layout.from_flex(counts, shuffled, 256, 384, block=64, heads=3)
    np.testing.assert_array_equal(back.to_mask(), mask)


def test_finalizer_frees_the_handle():
    lay = Layout.dense(128)
    fin = lay._finalizer
    assert fin.alive
    del lay
    gc.collect()
    assert not fin.alive


def test_repr():
    assert "nnz=4" in repr(Layout.dense(256, block=128))


# ---------------------------------------------------------------------------
# Bad layouts and bad builder arguments: SparseKError with the right status
# ---------------------------------------------------------------------------


def _bsr_error(ro, ci, rows=256, cols=256, block=128):
    with pytest.raises(SparseKError) as e:
        Layout.from_bsr(np.array(ro), np.array(ci), rows, cols, block=block)
    return e.value


def test_bad_bsr_statuses():
    # 2 x 2 blocks, one slice: row_offsets has 3 entries.
    assert _bsr_error([0, 2, 3], [1, 0, 1]).status_name == "SK_STATUS_BAD_LAYOUT_UNSORTED"
    assert _bsr_error([0, 2, 3], [1, 1, 1]).status_name == "SK_STATUS_BAD_LAYOUT_DUPLICATE"
    assert _bsr_error([0, 1, 2], [0, 2]).status_name == "SK_STATUS_BAD_LAYOUT_INDEX_RANGE"
    assert _bsr_error([0, 2, 1], [0, 1]).status_name == "SK_STATUS_BAD_LAYOUT_OFFSETS"
    assert _bsr_error([1, 1, 2], [0, 1]).status_name == "SK_STATUS_BAD_LAYOUT_OFFSETS"
    assert _bsr_error([0, 1, 2], [0, 1, 1]).status_name == "SK_STATUS_BAD_LAYOUT_COUNT"
    err = _bsr_error([0, 1, 2], [0, 1], block=96)
    assert err.status_name == "SK_STATUS_BAD_PARAM_VALUE" and "96" in err.message


def test_bad_bsr_binding_checks():
    with pytest.raises(ValueError, match="row_offsets has 2 entries"):
        Layout.from_bsr([0, 1], [0], 256, 256, block=128)
    with pytest.raises(TypeError):
        Layout.dense(256.0)
    with pytest.raises(TypeError):
        Layout.dense(256, block="128")
    with pytest.raises(ValueError):
        Layout.from_mask(np.ones((2, 2, 2), np.uint8), block=64, batch=1, heads=3)


def test_bad_flex_duplicate():
    counts = np.array([[2, 1]], np.int32)
    indices = np.array([[[1, 1], [0, 0]]], np.int32)
    with pytest.raises(SparseKError) as e:
        Layout.from_flex(counts, indices, 128, 128, block=64)
    assert e.value.status_name == "SK_STATUS_BAD_LAYOUT_DUPLICATE"


@pytest.mark.parametrize(
    "build",
    [
        lambda: Layout.random(256, k=-1, block=64),
        lambda: Layout.window(256, left=-1, block=64),
        lambda: Layout.sinks_window(256, sink_tokens=0, window_tokens=0, block=64),
        lambda: Layout.strided(256, stride=0, block=64),
        lambda: Layout.topk(np.zeros((4, 4), np.float32), k=-1, block=64),
    ],
)
def test_bad_builder_values(build):
    with pytest.raises(SparseKError) as e:
        build()
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_VALUE"


def test_bad_grid_shape():
    with pytest.raises(SparseKError) as e:
        Layout.dense(0, 128)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_SHAPE"
    with pytest.raises(SparseKError) as e:
        Layout.dense(128, heads=0)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_SHAPE"
