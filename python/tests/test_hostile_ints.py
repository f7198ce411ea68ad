"""Numbers that ctypes would truncate (issue 27, defect 6): every integer
is range-checked against its C type before it reaches ctypes (ValueError
naming the argument and the range), a bool or a float where an int is
meant is a TypeError, and a float32 field refuses a finite value that
would become inf (or, for the scale, 0: "the default" to the library).
Before the fix, k = 2**32 selected nothing, k = 2**32 + 3 selected 3
blocks, and a grid of 2**64 + 128 rows had 128."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import sparsek
from sparsek import Layout, _lib

from conftest import make_qkv, seeded_rng

INT32 = r"outside int32 \[-2147483648, 2147483647\]"
INT64 = r"outside int64 \[-9223372036854775808, 9223372036854775807\]"

SCORES = np.arange(16, dtype=np.float32).reshape(4, 4)


@pytest.mark.parametrize("k", [2**32, 2**32 + 3, -(2**31) - 1, 2**64])
def test_k_outside_int32(k):
    with pytest.raises(ValueError, match="k = .*" + INT32):
        Layout.random(256, 256, k=k, block=64)
    with pytest.raises(ValueError, match="k = .*" + INT32):
        Layout.topk(SCORES, k=k, block=64)
    with pytest.raises(ValueError, match="k = .*" + INT32):
        sparsek.layout_from_scores(SCORES, k, block_q=64, block_k=64)
    pq = np.ones((1, 1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="k = .*" + INT32):
        sparsek.select_topk(pq, pq, k, block_q=64, block_k=64)
    q, kk, v = make_qkv(seeded_rng(278), 1, 128, 128, 1, 1, 8)
    with pytest.raises(ValueError, match="k_blocks = .*" + INT32):
        sparsek.pool_select_topk(q, kk, k, block_q=64, block_k=64)
    with pytest.raises(ValueError, match="k_blocks = .*" + INT32):
        sparsek.attention_topk(q, kk, v, k, block_q=64, block_k=64)
    with pytest.raises(ValueError, match="k = .*" + INT32):
        sparsek.topk_capacity(1, 128, 128, 1, 1, k)


def test_grid_sizes_outside_their_c_types():
    with pytest.raises(ValueError, match="rows = 18446744073709551744 is " + INT64):
        sparsek.grid_blocks(sparsek.make_grid(2**64 + 128, 128, block=64))
    with pytest.raises(ValueError, match="cols = .*" + INT64):
        Layout.causal(128, 2**63, block=64)
    with pytest.raises(ValueError, match="block = .*" + INT32):
        Layout.dense(128, block=2**32 + 64)
    with pytest.raises(ValueError, match=r"block\[1\] = .*" + INT32):
        Layout.dense(128, block=(64, 2**32 + 64))
    for name in ("batch", "heads"):
        with pytest.raises(ValueError, match=f"{name} = .*" + INT32):
            Layout.dense(128, block=64, **{name: 2**32 + 1})
    with pytest.raises(ValueError, match="batch = .*" + INT64):
        sparsek.topk_capacity(2**64 + 1, 128, 128, 1, 1, 1)


def test_pattern_parameters_outside_their_c_types():
    with pytest.raises(ValueError, match="left = .*" + INT64):
        Layout.window(256, left=2**64 + 1, block=64)
    with pytest.raises(ValueError, match="window_tokens = .*" + INT64):
        Layout.sinks_window(256, sink_tokens=64, window_tokens=2**63, block=64)
    with pytest.raises(ValueError, match="stride = .*" + INT32):
        Layout.strided(256, stride=2**32 + 1, block=64)
    with pytest.raises(ValueError, match="local_blocks = .*" + INT32):
        Layout.strided(256, stride=2, local_blocks=2**32, block=64)
    with pytest.raises(ValueError, match="sink_blocks = .*" + INT32):
        sparsek.layout_from_scores(SCORES, 1, sink_blocks=2**32, block_q=64, block_k=64)
    with pytest.raises(ValueError, match=r"seed = -1 is outside uint64 \[0, 18446744073709551615\]"):
        Layout.random(256, k=1, seed=-1, block=64)


def test_bools_and_floats_are_not_ints():
    with pytest.raises(TypeError, match="k must be an int, got a bool"):
        Layout.random(256, k=True, block=64)
    with pytest.raises(TypeError, match="rows must be an int, got float"):
        Layout.dense(256.0, block=64)
    with pytest.raises(TypeError, match="heads must be an int, got float"):
        # Before: int(2.7) = 2, silently.
        Layout.from_mask(np.ones((4, 2, 2), np.uint8), block=64, heads=2.7)
    with pytest.raises(TypeError, match="backend must be an int, got float"):
        sparsek.attention(*make_qkv(seeded_rng(279), 1, 64, 64, 1, 1, 8), Layout.dense(64, block=64), backend=1.5)
    # numpy integers and anything with __index__ are ints.
    lay = Layout.random(np.int64(256), k=np.array(2), block=np.int32(64))
    assert lay.nnz == 2 * 4


def test_float32_values_that_would_change_meaning():
    q, k, v = make_qkv(seeded_rng(280), 1, 64, 64, 1, 1, 8)
    lay = Layout.dense(64, block=64)
    # Before: 1e-50 became 0.0 in the descriptor, which means 1/sqrt(D).
    with pytest.raises(ValueError, match="scale = 1e-50 rounds to 0 in float32"):
        sparsek.attention(q, k, v, lay, scale=1e-50)
    with pytest.raises(ValueError, match="scale = 1e-50 rounds to 0 in float32"):
        sparsek.attention_topk(q, k, v, 1, block_q=64, block_k=64, scale=1e-50)
    with pytest.raises(ValueError, match="scale = 1e\\+39 is outside float32's range"):
        sparsek.attention(q, k, v, lay, scale=1e39)
    a, b = np.ones((1, 64, 64), np.float32), np.ones((64, 8), np.float32)
    for name in ("alpha", "beta"):
        c = np.zeros((64, 8), np.float32)
        with pytest.raises(ValueError, match=f"{name} = 1e\\+39 is outside float32's range"):
            sparsek.bsr_gemm(a, b, lay, c=c, **{name: 1e39})
        assert (c == 0).all()
    with pytest.raises(TypeError, match="alpha must be a real number"):
        sparsek.bsr_gemm(a, b, lay, alpha="2")


def test_status_name_range():
    # Before: 2**32 arrived as 0, SK_STATUS_SUCCESS.
    with pytest.raises(ValueError, match="status = 4294967296 is " + INT32):
        sparsek.status_name(2**32)


def test_every_struct_field_and_argument_is_checked():
    # The last line of defence: mirrored structs and declared functions
    # check each numeric value against its C type, naming the C field.
    g = _lib.SkGrid()
    with pytest.raises(ValueError, match="sk_grid.rows = .*" + INT64):
        g.rows = 2**63
    with pytest.raises(ValueError, match="sk_grid.block_rows = .*" + INT32):
        _lib.SkGrid(128, 128, 2**31, 64, 1, 1)
    d = _lib.SkAttentionDesc()
    with pytest.raises(ValueError, match=r"sk_attention_desc.q_strides\[1\] = .*" + INT64):
        d.q_strides = (1, 2**63, 3)
    with pytest.raises(ValueError, match="sk_attention_desc.scale = 1e\\+39 is outside float32's range"):
        d.scale = 1e39
    with pytest.raises(TypeError, match="sk_topk_desc.k must be an int, got float"):
        _lib.SkTopkDesc().k = 3.0
    grid = sparsek.make_grid(256, block=64).to_c()
    out = ctypes.c_void_p()
    with pytest.raises(ValueError, match="sk_layout_create_window argument 3 = .*" + INT64):
        _lib.F.sk_layout_create_window(ctypes.byref(out), ctypes.byref(grid), 2**64, 0)
    assert out.value is None


def test_complex_scores_are_not_real_numbers():
    # Found by tests/fuzz/python: Layout.topk dropped the imaginary part
    # of complex scores (a ComplexWarning, then a layout from the real part).
    with pytest.raises(TypeError, match="scores.dtype = complex64 must be a real number type"):
        Layout.topk(SCORES.astype(np.complex64) * 1j, k=1, block=64)


@pytest.mark.parametrize("block", [0, -64, (64, 0)])
def test_block_sizes_go_to_the_library_checks_first(block):
    # Found by tests/fuzz/python: Layout.topk, from_mask and from_flex
    # derived block counts in Python first (ZeroDivisionError for block 0).
    with pytest.raises(sparsek.SparseKError, match="block_"):
        Layout.topk(SCORES, 256, 256, k=1, block=block)
    with pytest.raises(sparsek.SparseKError, match="block_"):
        Layout.from_mask(np.ones((4, 4), np.uint8), 256, 256, block=block)
    with pytest.raises(sparsek.SparseKError, match="block_"):
        Layout.from_flex(np.ones((1, 4), np.int32), np.zeros((1, 4, 4), np.int32), 256, block=block)


def test_grids_at_int64_max_are_refused_by_the_library():
    # Issue 27's example: the grid check overflowed and the causal builder
    # wrote past a one-element array (a segfault from Python). Now the
    # library refuses the grid before it allocates or writes anything.
    for build in (Layout.causal, Layout.dense):
        with pytest.raises(sparsek.SparseKError, match="OVERFLOW"):
            build(1, 2**63 - 1, block=64)
    with pytest.raises(sparsek.SparseKError, match="OVERFLOW"):
        Layout.strided(2**63 - 1, 1, stride=2, block=64)
