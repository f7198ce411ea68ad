"""Block-sparse layouts: the Layout class over sk_layout_t.

A Layout owns a validated host BSR layout made by one of the library's
builders (sk_layout_create_*). It is freed by a finalizer when the object is
collected. Its arrays never change. For the CUDA backend (and the torch op,
on any device) they are copied into torch tensors once per device, on first
use, and cached on the object (torch_arrays). DeviceLayout, a layout on a
CUDA device, is in device_layout.py.

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


def bsr_view(row_offsets, col_indices, grid: Grid) -> tuple:
    """(an sk_bsr over int32 copies of the arrays, the copies to keep alive
    while it is used), after the library's grid checks and the count of
    row_offsets (batch*heads*row_blocks + 1)."""
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
    return view, (ro, ci)


def _device_key(device) -> str:
    """"cpu" or "cuda:N" (the current device for a bare "cuda")."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


# id -> Layout, for every Layout alive: what torch.compile's constant
# functions (torch_ops.layout_args) look a Layout up by, as they may take
# only constants (an id) as arguments.
_LIVE = weakref.WeakValueDictionary()


def live_layout(ident: int) -> "Layout":
    """The Layout alive with this id()."""
    return _LIVE[ident]


class Layout:
    """An owned block-sparse layout (sk_layout_t). Build one with a
    classmethod: dense, causal, window, sinks_window, strided, random, topk,
    from_mask, from_bsr, from_flex or from_block_mask."""

    __slots__ = ("_handle", "_view", "_finalizer", "_device_views", "_traced", "_op_grid", "__weakref__")

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
        # device key -> (SkBsr over the tensors, row_offsets, col_indices)
        self._device_views = {}
        self._traced = {}  # the same, made during a torch.compile trace
        _LIVE[id(self)] = self
        g = self._view.grid
        # Plain ints: torch.compile reads them (it cannot read ctypes fields).
        self._op_grid = (g.rows, g.cols, g.block_rows, g.block_cols, g.batch, g.heads, self._view.nnz)
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
        view, _arrays = bsr_view(row_offsets, col_indices, grid)
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

    def torch_arrays(self, device) -> tuple:
        """(row_offsets, col_indices) as int32 torch tensors on `device`
        (CUDA or CPU), the layout arrays the torch op takes; col_indices
        has one element when nnz = 0. Made once per device and cached (the
        CUDA copy is what device_view hands to the library). Read-only:
        writing them would make them disagree with this Layout."""
        key = _device_key(device)
        hit = self._device_views.get(key)
        if hit is None:
            hit = self._traced.pop(key, None) or self._upload(key)
            self._device_views[key] = hit
        return hit[1], hit[2]

    def torch_arrays_for_trace(self, device) -> tuple:
        """torch_arrays for a torch.compile trace that found none made: the
        same tensors, kept aside until the next torch_arrays call adopts
        them, because the trace has just guarded on their absence."""
        key = _device_key(device)
        hit = self._device_views.get(key) or self._traced.get(key)
        if hit is None:
            hit = self._traced[key] = self._upload(key)
        return hit[1], hit[2]

    def _upload(self, key: str) -> tuple:
        import torch

        ro = torch.from_numpy(self.row_offsets).to(key)
        ci = torch.from_numpy(self.col_indices if self.nnz else np.zeros(1, np.int32)).to(key)
        view = SkBsr()
        view.grid = self._view.grid
        view.nnz = self._view.nnz
        view.row_offsets = ctypes.cast(c_void_p(ro.data_ptr()), POINTER(c_int32))
        view.col_indices = ctypes.cast(c_void_p(ci.data_ptr()), POINTER(c_int32))
        return view, ro, ci

    def op_grid(self) -> list:
        """[rows, cols, block_rows, block_cols, batch, heads, nnz], the
        grid argument of the torch ops."""
        return list(self._op_grid)

    def has_torch_arrays(self, device) -> bool:
        """Whether torch_arrays(device) has been made (no upload needed)."""
        return _device_key(device) in self._device_views

    def device_view(self, device) -> SkBsr:
        """An sk_bsr whose arrays live on torch CUDA `device`, uploaded once
        and cached on this Layout (torch_arrays)."""
        self.torch_arrays(device)
        return self._device_views[_device_key(device)][0]

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
