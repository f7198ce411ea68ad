"""The layout arrays a plan reads, as the plan cache (plan_cache.py) sees
them: who owns them, their content version, the part of a cache key that
tells two layouts apart, and a borrowed sk_bsr view for the plan.

- A host sparsek.Layout on the CPU backend: owned by the Layout itself,
  whose arrays are the library's validated copy and never change (version
  ()).
- A layout on a CUDA device (a Layout's cached upload, a DeviceLayout's
  buffers) and the tensors given to the torch op: owned by the storages of
  the row_offsets and col_indices tensors, versioned by their torch
  version counters (bumped by every in-place write), keyed by their data
  pointers and the grid.

BorrowedLayout points at arrays it does not own: a cached plan holds one,
so that the cache never keeps a caller's layout alive (the cache drops the
plan when an owner is collected).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_int32, c_void_p
from typing import NamedTuple

from ._lib import SkBsr, SkGrid
from .device_layout import DeviceLayout
from .layout import Grid, Layout, grid_blocks


class BorrowedLayout:
    """An sk_bsr over arrays owned elsewhere (see the module text), with the
    attributes the plans read."""

    __slots__ = ("_bsr", "device")

    def __init__(self, bsr: SkBsr, device: str):
        self._bsr = bsr
        self.device = device

    grid = property(lambda self: Grid(*(getattr(self._bsr.grid, f) for f, _ in SkGrid._fields_)))
    nnz = property(lambda self: int(self._bsr.nnz))

    def view(self) -> SkBsr:
        return self._bsr

    def device_view(self, device) -> SkBsr:
        return self._bsr


class LayoutArrays(NamedTuple):
    owners: tuple  # objects held weakly by the cache
    versions: tuple  # content versions of the owners
    key: tuple  # what tells two layouts of the same owners apart
    borrow: object  # () -> BorrowedLayout, called to make a plan (a miss)


def _bsr(grid: SkGrid, nnz: int, ro_ptr: int, ci_ptr: int) -> SkBsr:
    view = SkBsr()
    view.grid = grid
    view.nnz = nnz
    view.row_offsets = ctypes.cast(c_void_p(ro_ptr), POINTER(c_int32))
    view.col_indices = ctypes.cast(c_void_p(ci_ptr), POINTER(c_int32))
    return view


def _row_offsets_entries(grid: Grid) -> int:
    """slices * row_blocks + 1; the library's grid checks (SparseKError)
    where the grid is not plainly valid."""
    if min(grid) < 1:
        grid_blocks(grid)  # raises
    return grid.batch * grid.heads * -(-grid.rows // grid.block_rows) + 1


def of_tensors(ro, ci, grid: Grid, nnz: int, device: str) -> LayoutArrays:
    """row_offsets / col_indices torch tensors (int32, contiguous, on
    `device`, of the sizes the grid and nnz need: checked here, as the
    library reads that many entries) as LayoutArrays."""
    import torch

    for t, name, want in ((ro, "row_offsets", _row_offsets_entries(grid)), (ci, "col_indices", max(nnz, 1))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 torch tensor")
        dev = "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index}"
        if dev != device:
            raise ValueError(f"{name} is on {dev} but q is on {device}")
        if not t.is_contiguous() or (t.numel() != want if name == "row_offsets" else t.numel() < want):
            raise ValueError(f"{name} must be a contiguous tensor of {'' if name == 'row_offsets' else 'at least '}{want} entries")
    ro_ptr, ci_ptr = ro.data_ptr(), ci.data_ptr()
    return LayoutArrays(
        (ro.untyped_storage(), ci.untyped_storage()), (ro._version, ci._version), (ro_ptr, ci_ptr, tuple(grid), nnz),
        lambda: BorrowedLayout(_bsr(grid.to_c(), nnz, ro_ptr, ci_ptr), device),
    )


def of_layout(layout, device: str) -> LayoutArrays:
    """The arrays of a Layout or DeviceLayout that the library reads on
    `device` ("cpu" or "cuda:N"); a Layout is uploaded to a CUDA device
    once (Layout.torch_arrays)."""
    if not isinstance(layout, (Layout, DeviceLayout)):
        raise TypeError(f"layout must be a sparsek.Layout (or DeviceLayout), got {type(layout).__name__}")
    if device == "cpu":
        view = layout.view()  # a DeviceLayout refuses here

        def borrow():
            ro, ci = (ctypes.cast(p, c_void_p).value or 0 for p in (view.row_offsets, view.col_indices))
            return BorrowedLayout(_bsr(view.grid, view.nnz, ro, ci), device)

        return LayoutArrays((layout,), (), (), borrow)
    ro, ci = layout.torch_arrays(device)
    nnz = layout.capacity if isinstance(layout, DeviceLayout) else layout.nnz
    return of_tensors(ro, ci, layout.grid, nnz, device)


__all__ = ["BorrowedLayout", "LayoutArrays", "of_layout", "of_tensors"]
