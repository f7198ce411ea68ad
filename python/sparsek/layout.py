"""Block-sparse layouts: the Layout class over sk_layout_t.

A Layout owns a validated host BSR layout made by one of the library's
builders (sk_layout_create_*). It is freed by a finalizer when the object is
collected. For the CUDA backend its arrays are uploaded to each device once,
on first use, and cached on the object.

Geometry (sk_grid): `rows` query tokens and `cols` key tokens, cut into
blocks of `block_rows` x `block_cols` (64 or 128), with `batch * heads`
slices (batch 1 or B; heads 1, Hkv or Hq; 1 broadcasts).
"""

from __future__ import annotations

import ctypes
import weakref
from ctypes import POINTER, byref, c_float, c_int32, c_uint8, c_void_p
from typing import NamedTuple

import numpy as np

from ._arrays import packed
from ._cvalues import int32, int64, uint64
from ._lib import F, SkBsr, SkGrid, SkTopkOptions, check


class Grid(NamedTuple):
    """The block grid of a layout (the fields of sk_grid)."""

    rows: int
    cols: int
    block_rows: int
    block_cols: int
    batch: int
    heads: int

    @property
    def row_blocks(self) -> int:
        return -(-self.rows // self.block_rows)

    @property
    def col_blocks(self) -> int:
        return -(-self.cols // self.block_cols)

    @property
    def slices(self) -> int:
        return self.batch * self.heads

    def to_c(self) -> SkGrid:
        return SkGrid(
            self.rows, self.cols, self.block_rows, self.block_cols, self.batch, self.heads
        )


def _block_pair(block) -> tuple:
    if isinstance(block, (tuple, list)):
        if len(block) != 2:
            raise ValueError(f"block must be an int or a pair (block_rows, block_cols), got {block!r}")
        return int32(block[0], "block[0]"), int32(block[1], "block[1]")
    b = int32(block, "block")
    return b, b


def make_grid(rows, cols=None, block=128, batch=1, heads=1) -> Grid:
    """A Grid from Python values (cols defaults to rows). Here each value is
    checked to be an int in its C type's range (rows, cols int64; the rest
    int32); the library checks the grid itself when the layout is built."""
    rows = int64(rows, "rows")
    cols = rows if cols is None else int64(cols, "cols")
    br, bc = _block_pair(block)
    return Grid(rows, cols, br, bc, int32(batch, "batch"), int32(heads, "heads"))


def grid_blocks(grid: Grid) -> tuple:
    """(row_blocks, col_blocks, slices) as sk_grid_blocks computes them, with
    its checks (SparseKError on a bad grid)."""
    c = grid.to_c()
    rb, cb, ns = c_int32(), c_int32(), c_int32()
    check(F.sk_grid_blocks(byref(c), byref(rb), byref(cb), byref(ns)))
    return rb.value, cb.value, ns.value


def _i32_ptr(a: np.ndarray):
    return a.ctypes.data_as(POINTER(c_int32))


def _slices_array(a, grid: Grid, name: str, dtype) -> np.ndarray:
    """Accept [slices, rb, cb], [batch, heads, rb, cb] or (one slice)
    [rb, cb]; return a packed, aligned [slices, rb, cb] array of dtype."""
    a = np.asarray(a)
    rb, cb, ns = grid_blocks(grid)  # the library's grid checks first
    want = (ns, rb, cb)
    if a.ndim == 2 and ns == 1:
        a = a[None]
    elif a.ndim == 4:
        a = a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])
    if a.shape != want:
        raise ValueError(
            f"{name} has shape {tuple(np.shape(a))}; this grid needs [batch*heads, row_blocks, "
            f"col_blocks] = {list(want)} (or [batch, heads, row_blocks, col_blocks])"
        )
    return packed(a, dtype)


class Layout:
    """An owned block-sparse layout (sk_layout_t). Build one with a
    classmethod: dense, causal, window, sinks_window, strided, random, topk,
    from_mask, from_bsr, from_flex or from_block_mask."""

    __slots__ = ("_handle", "_view", "_finalizer", "_device_views", "__weakref__")

    def __init__(self, *args, **kwargs):
        # A raw sk_layout_t from Python (an int) could point anywhere, and
        # the library would read through it: only the builders make one.
        raise TypeError(
            "sparsek.Layout is made by its builders (Layout.dense, causal, window, sinks_window, "
            "strided, random, topk, from_mask, from_bsr, from_flex, from_block_mask), not from a handle"
        )

    @classmethod
    def _create(cls, fn, *args):
        """Call builder fn(&out, *args) and own the sk_layout_t it made."""
        out = c_void_p()
        check(fn(byref(out), *args))
        self = object.__new__(cls)
        self._handle = out
        self._finalizer = weakref.finalize(self, F.sk_layout_destroy, c_void_p(out.value))
        self._view = SkBsr()
        check(F.sk_layout_view(self._handle, byref(self._view)))
        # device key -> (SkBsr with device pointers, keep-alive tensors)
        self._device_views = {}
        return self

    # A copy would share the handle that the original's finalizer frees;
    # a Layout never changes, so a copy is the object itself, and a pickle
    # rebuilds it from its arrays.
    def __copy__(self) -> "Layout":
        return self

    def __deepcopy__(self, memo) -> "Layout":
        return self

    def __reduce__(self):
        return (_rebuild_layout, (self.row_offsets, self.col_indices, tuple(self.grid)))

    # ------------------------------------------------------------------
    # Builders
    # ------------------------------------------------------------------

    @classmethod
    def dense(cls, rows, cols=None, *, block=128, batch=1, heads=1) -> "Layout":
        """Every block."""
        g = make_grid(rows, cols, block, batch, heads).to_c()
        return cls._create(F.sk_layout_create_dense, byref(g))

    @classmethod
    def causal(cls, rows, cols=None, *, block=128, batch=1, heads=1) -> "Layout":
        """Blocks holding at least one causal pair (k <= q + cols - rows)."""
        g = make_grid(rows, cols, block, batch, heads).to_c()
        return cls._create(F.sk_layout_create_causal, byref(g))

    @classmethod
    def window(cls, rows, cols=None, *, left, right=0, block=128, batch=1, heads=1) -> "Layout":
        """Sliding window: key k visible to position p iff p-left <= k <= p+right."""
        g = make_grid(rows, cols, block, batch, heads).to_c()
        return cls._create(
            F.sk_layout_create_window, byref(g), int64(left, "left"), int64(right, "right")
        )

    @classmethod
    def sinks_window(
        cls, rows, cols=None, *, sink_tokens, window_tokens, block=128, batch=1, heads=1
    ) -> "Layout":
        """StreamingLLM: the first sink_tokens keys plus the window_tokens most
        recent positions, causal."""
        g = make_grid(rows, cols, block, batch, heads).to_c()
        return cls._create(
            F.sk_layout_create_sinks_window,
            byref(g),
            int64(sink_tokens, "sink_tokens"),
            int64(window_tokens, "window_tokens"),
        )

    @classmethod
    def strided(
        cls, rows, cols=None, *, stride, local_blocks=1, causal=True, block=128, batch=1, heads=1
    ) -> "Layout":
        """Sparse Transformer strided pattern (block level)."""
        g = make_grid(rows, cols, block, batch, heads).to_c()
        return cls._create(
            F.sk_layout_create_strided,
            byref(g),
            int32(stride, "stride"),
            int32(local_blocks, "local_blocks"),
            1 if causal else 0,
        )

    @classmethod
    def random(
        cls, rows, cols=None, *, k, seed=0, causal=False, block=128, batch=1, heads=1
    ) -> "Layout":
        """k distinct key blocks per row drawn at random (per slice), from seed."""
        g = make_grid(rows, cols, block, batch, heads).to_c()
        return cls._create(
            F.sk_layout_create_random, byref(g), int32(k, "k"), uint64(seed, "seed"), 1 if causal else 0
        )

    @classmethod
    def topk(
        cls,
        scores,
        rows=None,
        cols=None,
        *,
        k,
        sink_blocks=0,
        local_blocks=0,
        causal=False,
        block=128,
        batch=1,
        heads=1,
    ) -> "Layout":
        """Top-k key blocks per row from block scores, float32
        [batch*heads, row_blocks, col_blocks] (or [batch, heads, rb, cb], or
        [rb, cb] for one slice). rows/cols default to the full blocks."""
        s = np.asarray(scores)
        if s.dtype.kind not in "fiub":
            raise TypeError(f"scores.dtype = {s.dtype} must be a real number type")
        br, bc = _block_pair(block)
        if s.ndim == 4:
            batch, heads = s.shape[0], s.shape[1]
        if s.ndim < 2:
            raise ValueError(f"scores must have 2 to 4 dimensions, got shape {s.shape}")
        rows = s.shape[-2] * br if rows is None else rows
        cols = s.shape[-1] * bc if cols is None else cols
        grid = make_grid(rows, cols, (br, bc), batch, heads)
        s = _slices_array(s, grid, "scores", np.float32)
        opts = SkTopkOptions(
            int32(k, "k"),
            int32(sink_blocks, "sink_blocks"),
            int32(local_blocks, "local_blocks"),
            1 if causal else 0,
        )
        g = grid.to_c()
        return cls._create(
            F.sk_layout_create_topk,
            byref(g),
            s.ctypes.data_as(POINTER(c_float)),
            byref(opts),
        )

    @classmethod
    def from_mask(cls, mask, rows=None, cols=None, *, block=128, batch=None, heads=None) -> "Layout":
        """From a dense 0/1 block mask: [batch, heads, rb, cb], [slices, rb, cb]
        (batch 1, heads = slices unless given) or [rb, cb]. Any non-zero
        selects the block. rows/cols default to the full blocks."""
        m = np.asarray(mask)
        br, bc = _block_pair(block)
        batch = None if batch is None else int32(batch, "batch")
        heads = None if heads is None else int32(heads, "heads")
        if m.ndim == 4:
            batch = m.shape[0] if batch is None else batch
            heads = m.shape[1] if heads is None else heads
        elif m.ndim == 3:
            if batch is None and heads is None:
                batch, heads = 1, m.shape[0]
            elif batch is None:
                batch = m.shape[0] // max(heads, 1)
            elif heads is None:
                heads = m.shape[0] // max(batch, 1)
        elif m.ndim == 2:
            batch = 1 if batch is None else batch
            heads = 1 if heads is None else heads
        else:
            raise ValueError(f"mask must have 2 to 4 dimensions, got shape {m.shape}")
        rows = m.shape[-2] * br if rows is None else rows
        cols = m.shape[-1] * bc if cols is None else cols
        grid = make_grid(rows, cols, (br, bc), batch, heads)
        if m.dtype == np.bool_:
            m = m.view(np.uint8)
        elif m.dtype != np.uint8:
            m = m != 0
        m = _slices_array(m, grid, "mask", np.uint8)
        g = grid.to_c()
        return cls._create(F.sk_layout_create_from_mask, byref(g), m.ctypes.data_as(POINTER(c_uint8)))

    @classmethod
    def from_bsr(cls, row_offsets, col_indices, rows, cols=None, *, block=128, batch=1, heads=1) -> "Layout":
        """A validated copy of a BSR layout given as arrays: row_offsets
        [batch*heads*row_blocks + 1] and col_indices [nnz] (int32 values)."""
        grid = make_grid(rows, cols, block, batch, heads)
        grid_blocks(grid)  # the library's grid checks first
        ro = np.ascontiguousarray(np.asarray(row_offsets).reshape(-1), dtype=np.int64)
        ci = np.ascontiguousarray(np.asarray(col_indices).reshape(-1), dtype=np.int64)
        for a, name in ((ro, "row_offsets"), (ci, "col_indices")):
            if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
                raise ValueError(f"{name} has values outside int32")
        ro = ro.astype(np.int32)
        ci = ci.astype(np.int32)
        want = grid.slices * grid.row_blocks + 1
        if ro.size != want:
            raise ValueError(
                f"row_offsets has {ro.size} entries; this grid needs "
                f"batch*heads*row_blocks + 1 = {want}"
            )
        view = SkBsr()
        view.grid = grid.to_c()
        view.nnz = int32(ci.size, "len(col_indices)")
        view.row_offsets = _i32_ptr(ro)
        view.col_indices = _i32_ptr(ci) if ci.size else ctypes.cast(None, POINTER(c_int32))
        return cls._create(F.sk_layout_create_from_bsr, byref(view))

    @classmethod
    def from_flex(cls, counts, indices, rows, cols=None, *, block=128, batch=1, heads=1) -> "Layout":
        """From FlexAttention's padded form: counts [slices, row_blocks] and
        indices [slices, row_blocks, width] (int32; 4-D [B, H, ...] also
        accepted), each row's first counts entries selected, in any order."""
        grid = make_grid(rows, cols, block, batch, heads)
        rb, _, ns = grid_blocks(grid)  # the library's grid checks first
        c = np.asarray(counts)
        i = np.asarray(indices)
        if c.ndim == 3:
            c = c.reshape(-1, c.shape[-1])
        if i.ndim == 4:
            i = i.reshape((-1,) + i.shape[-2:])
        if c.shape != (ns, rb) or i.ndim != 3 or i.shape[:2] != c.shape:
            raise ValueError(
                f"counts {tuple(c.shape)} / indices {tuple(i.shape)} do not fit this grid: "
                f"counts must be [{ns}, {rb}] and indices [{ns}, {rb}, width]"
            )
        c = packed(c, np.int32)
        i = packed(i, np.int32)
        g = grid.to_c()
        return cls._create(F.sk_layout_create_from_flex, byref(g), _i32_ptr(c), _i32_ptr(i), int32(i.shape[2], "indices.shape[-1]"))

    @classmethod
    def from_block_mask(cls, block_mask) -> "Layout":
        """From a torch FlexAttention BlockMask: the partial (kv_*) and full
        (full_kv_*) block lists are merged. The BlockMask's mask_mod is not
        carried over: pass causal=True to attention() where it is causal."""
        from .flex import layout_from_block_mask

        return layout_from_block_mask(cls, block_mask)

    # ------------------------------------------------------------------
    # Properties
    # ------------------------------------------------------------------

    @property
    def grid(self) -> Grid:
        g = self._view.grid
        return Grid(g.rows, g.cols, g.block_rows, g.block_cols, g.batch, g.heads)

    rows = property(lambda self: self._view.grid.rows)
    cols = property(lambda self: self._view.grid.cols)
    block_rows = property(lambda self: self._view.grid.block_rows)
    block_cols = property(lambda self: self._view.grid.block_cols)
    batch = property(lambda self: self._view.grid.batch)
    heads = property(lambda self: self._view.grid.heads)
    row_blocks = property(lambda self: self.grid.row_blocks)
    col_blocks = property(lambda self: self.grid.col_blocks)
    slices = property(lambda self: self.grid.slices)

    @property
    def nnz(self) -> int:
        """Selected blocks over all slices."""
        return int(self._view.nnz)

    @property
    def row_offsets(self) -> np.ndarray:
        """A copy, int32 [slices*row_blocks + 1]."""
        n = self.slices * self.row_blocks + 1
        return np.ctypeslib.as_array(self._view.row_offsets, shape=(n,)).copy()

    @property
    def col_indices(self) -> np.ndarray:
        """A copy, int32 [nnz]."""
        if self.nnz == 0:
            return np.zeros(0, np.int32)
        return np.ctypeslib.as_array(self._view.col_indices, shape=(self.nnz,)).copy()

    @property
    def density(self) -> float:
        """Selected blocks / all blocks of the grid."""
        return self.nnz / float(self.slices * self.row_blocks * self.col_blocks)

    def selected_blocks(self, batch: int, heads_q: int) -> int:
        """Blocks computed by an attention of `batch` x `heads_q` (b, h)
        pairs with this layout (broadcast slices counted once per use)."""
        if self.batch not in (1, batch):
            raise ValueError(f"layout batch = {self.batch} does not fit batch = {batch}")
        if heads_q % self.heads:
            raise ValueError(f"layout heads = {self.heads} does not divide heads_q = {heads_q}")
        return self.nnz * (batch // self.batch) * (heads_q // self.heads)

    def view(self) -> SkBsr:
        """The host sk_bsr view (borrowed: valid while this Layout lives)."""
        return self._view

    def validate(self) -> None:
        """sk_layout_validate (always passes for builder-made layouts)."""
        check(F.sk_layout_validate(byref(self._view)))

    # ------------------------------------------------------------------
    # Conversions
    # ------------------------------------------------------------------

    def to_mask(self) -> np.ndarray:
        """Dense 0/1 block mask, uint8 [slices, row_blocks, col_blocks]."""
        shape = (self.slices, self.row_blocks, self.col_blocks)
        out = np.zeros(shape, np.uint8)
        check(F.sk_layout_to_mask(byref(self._view), out.ctypes.data_as(POINTER(c_uint8)), out.size))
        return out

    def to_flex(self) -> tuple:
        """FlexAttention's padded form: (counts int32 [slices, row_blocks],
        indices int32 [slices, row_blocks, col_blocks]); each row lists its
        selected blocks in increasing order, then the others."""
        counts = np.zeros((self.slices, self.row_blocks), np.int32)
        indices = np.zeros((self.slices, self.row_blocks, self.col_blocks), np.int32)
        check(F.sk_layout_to_flex(byref(self._view), _i32_ptr(counts), counts.size, _i32_ptr(indices), indices.size))
        return counts, indices

    def to_block_mask(
        self, *, causal=False, split_full=True, device=None, num_heads=None, mask_mod=None
    ):
        """This layout as a torch FlexAttention BlockMask (BlockMask.from_kv_blocks).

        split_full: put blocks that need no token-level mask (off the causal
            diagonal and not a sequence-tail block) in the full_kv_* lists, so
            FlexAttention skips mask_mod there; the rest go in kv_*.
        causal: the token-level mask of the attention (bottom-right aligned);
            the default mask_mod implements it.
        num_heads: expand a per-KV-head layout (heads = Hkv) to Hq heads.
        device: where the BlockMask tensors go (default cpu).
        mask_mod: None (the causal rule when causal, else none), a callable,
            or "layout": look every token pair's block up in this layout, so
            that FlexAttention paths that evaluate mask_mod densely (eager
            mode) give the same result as the block lists.
        """
        from .flex import layout_to_block_mask

        return layout_to_block_mask(
            self, causal=causal, split_full=split_full, device=device, num_heads=num_heads, mask_mod=mask_mod
        )

    # ------------------------------------------------------------------
    # Device copies (CUDA backend)
    # ------------------------------------------------------------------

    def device_view(self, device) -> SkBsr:
        """An sk_bsr whose arrays live on torch CUDA `device`, uploaded once
        and cached on this Layout."""
        import torch

        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = str(device)
        hit = self._device_views.get(key)
        if hit is not None:
            return hit[0]
        ro = torch.from_numpy(self.row_offsets).to(device)
        ci = torch.from_numpy(self.col_indices if self.nnz else np.zeros(1, np.int32)).to(device)
        view = SkBsr()
        view.grid = self._view.grid
        view.nnz = self._view.nnz
        view.row_offsets = ctypes.cast(c_void_p(ro.data_ptr()), POINTER(c_int32))
        view.col_indices = ctypes.cast(c_void_p(ci.data_ptr()), POINTER(c_int32))
        self._device_views[key] = (view, ro, ci)
        return view

    def __repr__(self) -> str:
        g = self.grid
        return (
            f"Layout(rows={g.rows}, cols={g.cols}, block=({g.block_rows}, {g.block_cols}), "
            f"batch={g.batch}, heads={g.heads}, nnz={self.nnz}, density={self.density:.4f})"
        )


def _rebuild_layout(row_offsets, col_indices, grid) -> Layout:
    """Layout.__reduce__'s inverse: a validated copy from the arrays."""
    rows, cols, br, bc, batch, heads = grid
    return Layout.from_bsr(row_offsets, col_indices, rows, cols, block=(br, bc), batch=batch, heads=heads)


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

    def device_view(self, device) -> SkBsr:
        """The sk_bsr over the device arrays (nnz = capacity; the kernels
        clamp the row offsets). Only for the layout's own device."""
        import torch

        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device != self.device:
            raise ValueError(
                f"this layout lives on {self.device}, not {device}; use .to_host() to move it"
            )
        return self._view

    def __repr__(self) -> str:
        g = self._grid
        nnz = "not read" if self._nnz is None else str(self._nnz)
        return (
            f"DeviceLayout(rows={g.rows}, cols={g.cols}, block=({g.block_rows}, {g.block_cols}), "
            f"batch={g.batch}, heads={g.heads}, capacity={self._capacity}, nnz={nnz}, device={self.device})"
        )
