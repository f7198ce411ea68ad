"""Input layouts the C API cannot take as they are (issue 27, defect 5):
the arrays the library reads without strides must be packed whatever
their size (a_values with one block included), and the GEMM's C must be
row-major in the library's sense even with one row. Each is refused with
a ValueError naming the array, before any C call. The arrays the binding
converts itself reach the library aligned; misaligned arrays given by
pointer are refused by the library."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError, _lib

from conftest import assert_refused, run_python, seeded_rng


def one_block_layout():
    return Layout.dense(64, 64, block=64)  # nnz = 1


def test_one_block_transposed_a_values_is_refused():
    # Before: accepted (strides were checked only when nnz > 1) and C = A^T B.
    rng = seeded_rng(275)
    a = rng.standard_normal((1, 64, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="a_values must be contiguous"):
        sparsek.bsr_gemm(a.transpose(0, 2, 1), np.eye(64, dtype=np.float32), one_block_layout())


def test_one_block_reversed_a_values_is_refused(tmp_path):
    # Before: the library read 64 x 64 elements forward from the view's
    # first element, the last row of the buffer: past its end.
    r = run_python(
        """
        import numpy as np, sparsek
        a = np.ones((1, 64, 64), np.float32)[:, ::-1, :]
        attempt(lambda: sparsek.bsr_gemm(a, np.ones((64, 8), np.float32), sparsek.Layout.dense(64, 64, block=64)))
        """,
        tmp_path,
    )
    assert_refused(r, "ValueError: a_values must be contiguous")


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[:, :, ::-1],  # reversed columns
        lambda a: np.lib.stride_tricks.as_strided(a, a.shape, (0, a.strides[1], a.strides[2])),  # nnz = 1: free
    ],
)
def test_one_block_views(view):
    # A reversed axis is refused; the stride of the one-block axis is never
    # used, so any value there is accepted and the result is right.
    rng = seeded_rng(276)
    a = rng.standard_normal((1, 64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    v = view(a)
    if v.strides[2] < 0:
        with pytest.raises(ValueError, match="a_values must be contiguous"):
            sparsek.bsr_gemm(v, b, one_block_layout())
    else:
        np.testing.assert_allclose(sparsek.bsr_gemm(v, b, one_block_layout()), a[0] @ b, rtol=1e-4, atol=1e-4)


def test_a_values_of_several_blocks_still_checked():
    a = np.ones((4, 64, 64), np.float32)
    with pytest.raises(ValueError, match="a_values must be contiguous"):
        sparsek.bsr_gemm(a[::-1], np.ones((128, 8), np.float32), Layout.dense(128, block=64))


def test_single_row_c_with_a_stride_is_refused():
    # Before: a [1, n] C whose elements are 8 apart passed as "column-major"
    # with ldc = 8 >= n, and the library wrote n packed elements: the
    # wrong ones, silently.
    lay = Layout.dense(1, 64, block=64)
    base = np.zeros((1, 64), np.float32)
    c = base[:, ::8]
    with pytest.raises(ValueError, match=r"c \(shape \(1, 8\).*must be row-major"):
        sparsek.bsr_gemm(np.ones((1, 64, 64), np.float32), np.ones((64, 8), np.float32), lay, c=c)
    assert (base == 0).all()


def test_single_row_and_column_c_that_are_row_major_work():
    rng = seeded_rng(277)
    a = rng.standard_normal((1, 64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 1)).astype(np.float32)
    big = np.zeros((64, 3), np.float32)
    c = big[:, 1:2]  # a column with stride 3: ldc = 3
    res = sparsek.bsr_gemm(a, b, Layout.dense(64, 64, block=64), c=c)
    assert res is c
    np.testing.assert_allclose(big[:, 1:2], a[0] @ b, rtol=1e-4, atol=1e-4)
    assert (big[:, 0] == 0).all() and (big[:, 2] == 0).all()
    row = sparsek.bsr_gemm(a, rng.standard_normal((64, 8)).astype(np.float32), Layout.dense(1, 64, block=64))
    assert row.shape == (1, 8)


def misaligned(shape, dtype):
    """Values in a numpy array one byte past an aligned address."""
    a = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    raw = bytearray(a.nbytes + 1)
    m = np.frombuffer(raw, dtype=dtype, count=a.size, offset=1).reshape(shape)
    m[...] = a
    assert not m.flags.aligned
    return m


def record_pointer(monkeypatch, name, index):
    """Wrap sparsek's F.<name> to record the address of argument `index`."""
    seen = []
    real = getattr(_lib.F, name)

    def call(*args):
        arg = args[index]
        seen.append(ctypes.cast(arg, ctypes.c_void_p).value if not isinstance(arg, int) else arg)
        return real(*args)

    monkeypatch.setattr(_lib.F, name, call)
    return seen


def test_converted_arrays_reach_the_library_aligned(monkeypatch):
    # Found by tests/fuzz/python (UBSan: a misaligned float load in
    # sk_layout_create_topk): np.ascontiguousarray kept a misaligned array
    # as it was. The arrays the binding converts are now aligned copies.
    scores = misaligned((2, 3), np.float32)
    seen = record_pointer(monkeypatch, "sk_layout_create_topk", 2)
    lay = Layout.topk(scores, k=2, block=64)
    assert seen and seen[0] % 4 == 0
    assert np.array_equal(lay.to_mask()[0], [[0, 1, 1], [0, 1, 1]])
    seen = record_pointer(monkeypatch, "sk_layout_from_scores", 1)
    sparsek.layout_from_scores(scores, 2, block_q=64, block_k=64)
    assert seen and seen[0] % 4 == 0
    counts = misaligned((1, 2), np.int32)
    counts[...] = 1
    seen = record_pointer(monkeypatch, "sk_layout_create_from_flex", 2)
    Layout.from_flex(counts, misaligned((1, 2, 2), np.int32) * 0, 128, block=64)
    assert seen and seen[0] % 4 == 0


def test_misaligned_arrays_given_by_pointer_are_refused():
    q = misaligned((1, 128, 2, 16), np.float32)
    with pytest.raises(SparseKError, match="aligned"):
        sparsek.attention(q, q.copy(), q.copy(), Layout.dense(128, block=64))
    with pytest.raises(SparseKError, match="aligned"):
        sparsek.bsr_gemm(misaligned((1, 64, 64), np.float32), np.ones((64, 8), np.float32), one_block_layout())
