"""DeviceLayout: a block-sparse layout whose arrays are torch int32 tensors
on a CUDA device, as the top-k selection writes them (topk.py); nothing is
copied to the host unless asked. See the class text.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_int32, c_void_p

import numpy as np

from ._cvalues import int32
from ._lib import SkBsr
from .layout import Grid, Layout, _device_key, grid_blocks


class DeviceLayout:
    """A block-sparse layout written on a CUDA device by the top-k selection
    (sparsek.select_topk, layout_from_scores or attention_topk on torch CUDA
    tensors).

    Its arrays are torch int32 tensors on that device, allocated at the
    capacity that sk_topk_layout_capacity gives, so the selection never
    waits for the host. The real block count is row_offsets[-1] (equal to
    the capacity unless NaN / -inf scores left rows short).

    Nothing here copies to the host unless asked:
    - device_view(device) (what sparsek.attention uses) hands the arrays to
      the library as they are, with nnz = capacity; the kernels clamp the
      row offsets, so the real count is not needed there;
    - `nnz`, `density`, `col_indices` (trimmed to nnz) and `to_host()` copy
      row_offsets[-1] (and for to_host() the arrays) back: each waits for
      the selection to finish on the stream it was enqueued on. `nnz` is
      read once and cached.
    - to_host() returns a validated host sparsek.Layout (cached); to_mask,
      to_flex, to_block_mask and validate go through it.
    The tensors are borrowed by the library on the stream of the selection;
    using them on another stream needs the usual torch stream care
    (record_stream / synchronisation).
    """

    __slots__ = ("_grid", "_capacity", "_ro", "_ci", "_view", "_stream", "_nnz", "_host", "__weakref__")

    def __init__(self, grid: Grid, capacity: int, row_offsets, col_indices, stream=None):
        """grid: the layout's Grid; capacity: max nnz (col_indices holds at
        least max(capacity, 1) entries); row_offsets / col_indices: int32
        torch CUDA tensors; stream: the torch stream that writes them (None:
        the current stream of their device)."""
        import torch

        if not isinstance(grid, Grid):
            raise TypeError(f"grid must be a sparsek.Grid, got {type(grid).__name__}")
        capacity = int32(capacity, "capacity")
        if capacity < 0:
            raise ValueError(f"capacity = {capacity} must be >= 0")
        if not (isinstance(row_offsets, torch.Tensor) and isinstance(col_indices, torch.Tensor)):
            raise TypeError("row_offsets and col_indices must be torch tensors")
        if row_offsets.dtype != torch.int32 or col_indices.dtype != torch.int32:
            raise TypeError("row_offsets and col_indices must be int32 tensors")
        if row_offsets.device != col_indices.device or row_offsets.device.type != "cuda":
            raise ValueError("row_offsets and col_indices must be on the same CUDA device")
        rb, _, ns = grid_blocks(grid)  # the library's grid checks first
        want = ns * rb + 1
        if row_offsets.numel() != want or not row_offsets.is_contiguous():
            raise ValueError(f"row_offsets must be a contiguous tensor of {want} entries")
        if col_indices.numel() < max(capacity, 1) or not col_indices.is_contiguous():
            raise ValueError(f"col_indices must be a contiguous tensor of at least {max(capacity, 1)} entries")
        self._grid = grid
        self._capacity = capacity
        self._ro = row_offsets
        self._ci = col_indices
        self._stream = stream if stream is not None else torch.cuda.current_stream(row_offsets.device)
        view = SkBsr()
        view.grid = grid.to_c()
        view.nnz = self._capacity
        view.row_offsets = ctypes.cast(c_void_p(row_offsets.data_ptr()), POINTER(c_int32))
        view.col_indices = ctypes.cast(c_void_p(col_indices.data_ptr()), POINTER(c_int32))
        self._view = view
        self._nnz = None
        self._host = None

    # Geometry (no device access) -----------------------------------------
    grid = property(lambda self: self._grid)
    rows = property(lambda self: self._grid.rows)
    cols = property(lambda self: self._grid.cols)
    block_rows = property(lambda self: self._grid.block_rows)
    block_cols = property(lambda self: self._grid.block_cols)
    batch = property(lambda self: self._grid.batch)
    heads = property(lambda self: self._grid.heads)
    row_blocks = property(lambda self: self._grid.row_blocks)
    col_blocks = property(lambda self: self._grid.col_blocks)
    slices = property(lambda self: self._grid.slices)

    @property
    def capacity(self) -> int:
        """The most blocks the selection can write (sk_topk_layout_capacity)."""
        return self._capacity

    @property
    def device(self):
        return self._ro.device

    @property
    def row_offsets(self):
        """The device tensor, int32 [slices*row_blocks + 1] (no copy)."""
        return self._ro

    @property
    def col_indices(self):
        """The device tensor's first nnz entries (reads nnz: one host copy)."""
        return self._ci[: self.nnz]

    @property
    def col_indices_buffer(self):
        """The whole device buffer, int32 [max(capacity, 1)]; entries past
        nnz are unspecified (no copy)."""
        return self._ci

    # The real count, copied back on request -------------------------------
    @property
    def nnz(self) -> int:
        """The real number of selected blocks, row_offsets[-1]. The first
        access copies it to the host (waiting for the selection); cached."""
        if self._nnz is None:
            import torch

            with torch.cuda.stream(self._stream):
                self._nnz = int(self._ro[-1].item())
        return self._nnz

    @property
    def density(self) -> float:
        """Selected blocks / all blocks of the grid (reads nnz)."""
        return self.nnz / float(self.slices * self.row_blocks * self.col_blocks)

    def selected_blocks(self, batch: int, heads_q: int) -> int:
        """As Layout.selected_blocks (reads nnz)."""
        if self.batch not in (1, batch):
            raise ValueError(f"layout batch = {self.batch} does not fit batch = {batch}")
        if heads_q % self.heads:
            raise ValueError(f"layout heads = {self.heads} does not divide heads_q = {heads_q}")
        return self.nnz * (batch // self.batch) * (heads_q // self.heads)

    def to_host(self) -> "Layout":
        """A validated host copy (sparsek.Layout) with the real count;
        waits for the selection. Cached."""
        if self._host is None:
            import torch

            with torch.cuda.stream(self._stream):
                ro = self._ro.cpu().numpy()
                nnz = int(ro[-1])
                if not 0 <= nnz <= self._capacity:
                    raise RuntimeError(f"row_offsets[-1] = {nnz} is outside [0, capacity = {self._capacity}]")
                ci = self._ci[:nnz].cpu().numpy()
            self._nnz = nnz
            g = self._grid
            self._host = Layout.from_bsr(
                ro, ci, g.rows, g.cols, block=(g.block_rows, g.block_cols), batch=g.batch, heads=g.heads
            )
        return self._host

    def validate(self) -> None:
        """sk_layout_validate on the host copy."""
        self.to_host().validate()

    def to_mask(self) -> np.ndarray:
        return self.to_host().to_mask()

    def to_flex(self) -> tuple:
        return self.to_host().to_flex()

    def to_block_mask(self, **kwargs):
        return self.to_host().to_block_mask(**kwargs)

    # Library views ---------------------------------------------------------
    def view(self) -> SkBsr:
        raise TypeError(
            f"this layout lives on {self.device}: the CPU backend needs a host layout; use .to_host()"
        )

    def op_grid(self) -> list:
        """[rows, cols, block_rows, block_cols, batch, heads, capacity], the
        grid argument of the torch ops (nnz = capacity, as device_view)."""
        return list(self._grid) + [self._capacity]

    def torch_arrays(self, device) -> tuple:
        """(row_offsets, col_indices_buffer), the device tensors themselves,
        for the torch op. Only for the layout's own device."""
        key = _device_key(device)
        if key != str(self.device):
            raise ValueError(f"this layout lives on {self.device}, not {key}; use .to_host() to move it")
        return self._ro, self._ci

    def device_view(self, device) -> SkBsr:
        """The sk_bsr over the device arrays (nnz = capacity; the kernels
        clamp the row offsets). Only for the layout's own device."""
        self.torch_arrays(device)
        return self._view

    def __repr__(self) -> str:
        g = self._grid
        nnz = "not read" if self._nnz is None else str(self._nnz)
        return (
            f"DeviceLayout(rows={g.rows}, cols={g.cols}, block=({g.block_rows}, {g.block_cols}), "
            f"batch={g.batch}, heads={g.heads}, capacity={self._capacity}, nnz={nnz}, device={self.device})"
        )
