"""Raw handles (issue 27, defect 8, the Python part): sparsek.Layout cannot
be made from a handle (before: Layout(12345) read through the address and
crashed), every builder still works, and a copy or a pickle never shares
the handle that the original's finalizer frees."""

from __future__ import annotations

import copy
import ctypes
import gc
import pickle

import numpy as np

import sparsek
from sparsek import Layout

from conftest import assert_refused, run_python


def test_a_raw_handle_is_refused(tmp_path):
    # In a subprocess: before, Layout(12345) read through the address, and
    # Layout(another_layout._handle) made a second owner (a double free).
    r = run_python(
        """
        import ctypes, sparsek
        real = sparsek.Layout.dense(128, block=64)._handle
        for handle in (12345, ctypes.c_void_p(12345), 0, real):
            attempt(lambda: sparsek.Layout(handle))
        """,
        tmp_path,
    )
    assert_refused(r, "TypeError: sparsek.Layout is made by its builders")
    assert r.stdout.count("TypeError") == 4, r.stdout


def test_every_builder_still_makes_a_layout():
    mask = np.ones((2, 2), np.uint8)
    made = [
        Layout.dense(128, block=64),
        Layout.causal(128, block=64),
        Layout.window(128, left=64, block=64),
        Layout.sinks_window(128, sink_tokens=64, window_tokens=64, block=64),
        Layout.strided(128, stride=2, block=64),
        Layout.random(128, k=1, block=64),
        Layout.topk(np.ones((2, 2), np.float32), k=1, block=64),
        Layout.from_mask(mask, block=64),
        Layout.from_bsr([0, 2, 4], [0, 1, 0, 1], 128, block=64),
        Layout.from_flex(np.full((1, 2), 2, np.int32), np.array([[[0, 1], [1, 0]]], np.int32), 128, block=64),
    ]
    for lay in made:
        assert isinstance(lay, Layout) and lay.nnz >= 1
        lay.validate()


def test_copies_and_pickles_do_not_share_a_freed_handle():
    lay = Layout.random(256, 192, k=2, seed=5, block=64, heads=3)
    ro, ci = lay.row_offsets, lay.col_indices
    assert copy.copy(lay) is lay and copy.deepcopy(lay) is lay
    back = pickle.loads(pickle.dumps(lay))
    assert back is not lay and back.grid == lay.grid
    del lay
    gc.collect()
    np.testing.assert_array_equal(back.row_offsets, ro)
    np.testing.assert_array_equal(back.col_indices, ci)
    back.validate()
    assert isinstance(back.view(), sparsek._lib.SkBsr) and ctypes.addressof(back.view())
