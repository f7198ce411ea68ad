"""Varlen batches (sparsek.h, "Varlen batches"): sequences of different
lengths packed along the token axis, as FlashAttention's and flashinfer's
varlen calls take them.

- VarlenLayout: a Layout (one BSR, batch 1) over the sequences' query
  blocks in order, which also remembers the lengths it was built for; its
  builders (dense, causal, window, sinks_window, random, from_masks,
  from_layouts, from_bsr) take cu_seqlens_q / cu_seqlens_k as the library
  does. sequence(b) gives a sequence's own fixed-batch Layout.
- attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, layout, ...): q
  [total_q, Hq, D], k and v [total_k, Hkv, D]; numpy arrays and torch CPU
  tensors run on the CPU backend, torch CUDA tensors on the CUDA backend
  (the portable kernel; "cuda_sm90" answers NOT_SUPPORTED for now).
  Differentiable on torch CPU and CUDA tensors (varlen_autograd.py: the
  backward is attention_varlen_backward); out= with grad is refused.

The length arrays are int32 [B + 1] (lists and other integer arrays are
converted on the host; on CUDA they must be int32 tensors on q's device,
and max_seqlen_q / max_seqlen_k must be given, as reading the lengths
would synchronise). The library checks their content on the CPU.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_int32, c_size_t, c_uint8, sizeof

import numpy as np

from ._arrays import Arr, adapt, check_family, check_output, is_torch, packed
from ._cvalues import as_int, int32, int64, uint64
from ._lib import Backend, F, Mask, SkAttentionVarlenDesc, SkBsr, SkGrid, SkVarlenGrid, check
from .attention import _empty_like, _empty_lse, _options, needs_grad
from .layout import Grid, Layout, _block_pair, bsr_view


def _host_int32(x, name: str, ndim: int, min_size: int, what: str) -> np.ndarray:
    """A host integer array (numpy, torch CPU, list) as a packed int32
    numpy array of ndim dimensions (content: the library's check)."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; the CPU backend needs host arrays")
        x = x.detach().numpy()
    a = np.asarray(x)
    if a.ndim != ndim or a.size < min_size:
        raise ValueError(f"{name} must be {what}; got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}.dtype = {a.dtype} must be an integer type")
    if a.min() < -(2**31) or a.max() >= 2**31:
        raise ValueError(f"{name} has values outside int32")
    return packed(a, np.int32)


def _host_lengths(cu, name: str) -> np.ndarray:
    """A host length array [B + 1] as packed int32."""
    return _host_int32(cu, name, 1, 2, "1-D with B + 1 >= 2 entries")


def _host_pair(cu_seqlens_q, cu_seqlens_k) -> tuple:
    """Both host length arrays; cu_seqlens_k None means cu_seqlens_q's."""
    cu_q = _host_lengths(cu_seqlens_q, "cu_seqlens_q")
    return cu_q, cu_q if cu_seqlens_k is None else _host_lengths(cu_seqlens_k, "cu_seqlens_k")


def _vgrid(cu_q: np.ndarray, cu_k: np.ndarray, block, heads) -> SkVarlenGrid:
    if cu_q.size != cu_k.size:
        raise ValueError(f"cu_seqlens_q has {cu_q.size} entries, cu_seqlens_k {cu_k.size}: both are [B + 1]")
    br, bc = _block_pair(block)
    g = SkVarlenGrid()
    g.batch = int32(cu_q.size - 1, "batch")
    g.block_rows, g.block_cols, g.heads = br, bc, int32(heads, "heads")
    g.cu_seqlens_q = cu_q.ctypes.data_as(POINTER(c_int32))
    g.cu_seqlens_k = cu_k.ctypes.data_as(POINTER(c_int32))
    return g


def varlen_layout_grid(cu_seqlens_q, cu_seqlens_k=None, *, block=128, heads=1) -> Grid:
    """The grid of the layout the builders make (sk_varlen_layout_grid)."""
    cu_q, cu_k = _host_pair(cu_seqlens_q, cu_seqlens_k)
    out = SkGrid()
    check(F.sk_varlen_layout_grid(byref(_vgrid(cu_q, cu_k, block, heads)), byref(out)))
    return Grid(out.rows, out.cols, out.block_rows, out.block_cols, out.batch, out.heads)


def varlen_max_row_blocks(batch, total_q, max_seqlen_q, block_rows=128) -> int:
    """The most query block rows B sequences of total_q tokens (none above
    max_seqlen_q) can need (sk_varlen_max_row_blocks): a layout capacity
    fixed before the lengths are known."""
    out = c_int32()
    check(
        F.sk_varlen_max_row_blocks(
            int64(batch, "batch"), int64(total_q, "total_q"), int64(max_seqlen_q, "max_seqlen_q"),
            int32(block_rows, "block_rows"), byref(out),
        )
    )
    return out.value


class VarlenLayout(Layout):
    """A varlen layout (sparsek.h, "Varlen batches") with the lengths it was
    built for. Build one with a classmethod: dense, causal, window,
    sinks_window, random, from_masks, from_layouts or from_bsr; each takes
    cu_seqlens_q and cu_seqlens_k (default: the same as cu_seqlens_q), the
    block size(s) and heads (1, Hkv or Hq)."""

    __slots__ = ("_cu_q", "_cu_k")

    @classmethod
    def _build(cls, fn, cu_seqlens_q, cu_seqlens_k, block, heads, *args) -> "VarlenLayout":
        cu_q, cu_k = _host_pair(cu_seqlens_q, cu_seqlens_k)
        g = _vgrid(cu_q, cu_k, block, heads)
        self = cls._create(fn, byref(g), *args)
        self._cu_q, self._cu_k = cu_q.copy(), cu_k.copy()
        return self

    @classmethod
    def dense(cls, cu_seqlens_q, cu_seqlens_k=None, *, block=128, heads=1) -> "VarlenLayout":
        """Every block of each sequence."""
        return cls._build(F.sk_layout_create_varlen_dense, cu_seqlens_q, cu_seqlens_k, block, heads)

    @classmethod
    def causal(cls, cu_seqlens_q, cu_seqlens_k=None, *, block=128, heads=1) -> "VarlenLayout":
        """Blocks holding a causal pair of their sequence (bottom-right)."""
        return cls._build(F.sk_layout_create_varlen_causal, cu_seqlens_q, cu_seqlens_k, block, heads)

    @classmethod
    def window(cls, cu_seqlens_q, cu_seqlens_k=None, *, left, right=0, block=128, heads=1) -> "VarlenLayout":
        """Sliding window per sequence: p - left <= k <= p + right."""
        return cls._build(
            F.sk_layout_create_varlen_window, cu_seqlens_q, cu_seqlens_k, block, heads,
            int64(left, "left"), int64(right, "right"),
        )

    @classmethod
    def sinks_window(
        cls, cu_seqlens_q, cu_seqlens_k=None, *, sink_tokens, window_tokens, block=128, heads=1
    ) -> "VarlenLayout":
        """StreamingLLM per sequence: its first sink_tokens keys and the
        window_tokens most recent positions, causal."""
        return cls._build(
            F.sk_layout_create_varlen_sinks_window, cu_seqlens_q, cu_seqlens_k, block, heads,
            int64(sink_tokens, "sink_tokens"), int64(window_tokens, "window_tokens"),
        )

    @classmethod
    def random(
        cls, cu_seqlens_q, cu_seqlens_k=None, *, k, seed=0, causal=False, block=128, heads=1
    ) -> "VarlenLayout":
        """k distinct key blocks of its sequence per row, drawn from seed."""
        return cls._build(
            F.sk_layout_create_varlen_random, cu_seqlens_q, cu_seqlens_k, block, heads,
            int32(k, "k"), uint64(seed, "seed"), 1 if causal else 0,
        )

    @classmethod
    def from_masks(cls, masks, cu_seqlens_q, cu_seqlens_k=None, *, block=128, heads=1) -> "VarlenLayout":
        """From one 0/1 block mask per sequence, [heads, nb_q, nb_k] (or
        [nb_q, nb_k] when heads is 1); any non-zero selects the block."""
        cu_q, cu_k = _host_pair(cu_seqlens_q, cu_seqlens_k)
        br, bc = _block_pair(block)
        masks = list(masks)
        if len(masks) != cu_q.size - 1:
            raise ValueError(f"{len(masks)} masks for {cu_q.size - 1} sequences")
        parts = []
        for b, m in enumerate(masks):
            m = np.asarray(m)
            want = (heads, -(-int(cu_q[b + 1] - cu_q[b]) // br), -(-int(cu_k[b + 1] - cu_k[b]) // bc))
            if m.ndim == 2:
                m = m[None]
            if m.shape != want:
                raise ValueError(f"masks[{b}] has shape {m.shape}; sequence {b} needs {list(want)}")
            parts.append((m != 0).astype(np.uint8).reshape(-1))
        flat = packed(np.concatenate(parts) if parts else np.zeros(0, np.uint8), np.uint8)
        return cls._build(
            F.sk_layout_create_varlen_from_masks, cu_q, cu_k, (br, bc), heads,
            flat.ctypes.data_as(POINTER(c_uint8)), flat.size,
        )

    @classmethod
    def from_layouts(cls, layouts, cu_seqlens_q, cu_seqlens_k=None, *, block=None, heads=None) -> "VarlenLayout":
        """From one Layout (or None: no block) per sequence, each over its
        own len_q x len_k tokens with batch 1. block and heads default to
        the first Layout's."""
        layouts = list(layouts)
        first = next((l for l in layouts if l is not None), None)
        if block is None:
            block = (first.block_rows, first.block_cols) if first is not None else 128
        if heads is None:
            heads = first.heads if first is not None else 1
        for b, l in enumerate(layouts):
            if l is not None and not isinstance(l, Layout):
                raise TypeError(f"layouts[{b}] must be a sparsek.Layout or None, got {type(l).__name__}")
        views = [l.view() if l is not None else None for l in layouts]
        arr = (POINTER(SkBsr) * max(len(views), 1))(*[ctypes.pointer(v) if v is not None else None for v in views])
        cu_q = _host_lengths(cu_seqlens_q, "cu_seqlens_q")
        if len(layouts) != cu_q.size - 1:
            raise ValueError(f"{len(layouts)} layouts for {cu_q.size - 1} sequences")
        return cls._build(F.sk_layout_create_varlen_from_layouts, cu_q, cu_seqlens_k, block, heads, arr)

    @classmethod
    def from_bsr(
        cls, row_offsets, col_indices, cu_seqlens_q, cu_seqlens_k=None, *, block=128, heads=1, row_blocks=None
    ) -> "VarlenLayout":
        """A validated copy of a varlen BSR given as arrays (row_offsets
        [heads * R + 1], col_indices [nnz]); R = row_blocks, by default the
        rows the sequences need."""
        cu_q, cu_k = _host_pair(cu_seqlens_q, cu_seqlens_k)
        g = varlen_layout_grid(cu_q, cu_k, block=block, heads=heads)
        if row_blocks is not None:
            g = g._replace(rows=as_int(row_blocks, "row_blocks") * g.block_rows)
        view, _arrays = bsr_view(row_offsets, col_indices, g)
        vg = _vgrid(cu_q, cu_k, block, heads)
        check(F.sk_layout_validate_varlen(byref(view), byref(vg)))
        self = cls._create(F.sk_layout_create_from_bsr, byref(view))
        self._cu_q, self._cu_k = cu_q.copy(), cu_k.copy()
        return self

    # ------------------------------------------------------------------

    def __reduce__(self):
        return (
            _rebuild_varlen,
            (self.row_offsets, self.col_indices, self.cu_seqlens_q, self.cu_seqlens_k,
             (self.block_rows, self.block_cols), self.heads, self.row_blocks),
        )

    cu_seqlens_q = property(lambda self: self._cu_q.copy(), doc="A copy, int32 [B + 1].")
    cu_seqlens_k = property(lambda self: self._cu_k.copy(), doc="A copy, int32 [B + 1].")
    num_seqs = property(lambda self: self._cu_q.size - 1, doc="B, the sequences.")
    seq_lens_q = property(lambda self: np.diff(self._cu_q), doc="len_q of each sequence.")
    seq_lens_k = property(lambda self: np.diff(self._cu_k), doc="len_k of each sequence.")

    @property
    def row_starts(self) -> np.ndarray:
        """row_start(b) for b = 0 .. B: each sequence's first layout row
        (the last entry: the rows they need)."""
        rows = -(-self.seq_lens_q // self.block_rows)
        return np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)

    def validate(self) -> None:
        """sk_layout_validate_varlen against the lengths it was built for."""
        g = _vgrid(self._cu_q, self._cu_k, (self.block_rows, self.block_cols), self.heads)
        check(F.sk_layout_validate_varlen(byref(self.view()), byref(g)))

    def sequence(self, b: int):
        """Sequence b's rows as a fixed-batch Layout over its len_q x len_k
        tokens (batch 1, the same heads), or None when it has no query or
        no key."""
        b = as_int(b, "b")
        if not 0 <= b < self.num_seqs:
            raise IndexError(f"sequence {b} of {self.num_seqs}")
        lq, lk = int(self.seq_lens_q[b]), int(self.seq_lens_k[b])
        if lq == 0 or lk == 0:
            return None
        R, start = self.row_blocks, int(self.row_starts[b])
        nbq = -(-lq // self.block_rows)
        off = self.row_offsets
        rows = [np.arange(s * R + start, s * R + start + nbq) for s in range(self.heads)]
        rows = np.concatenate(rows)
        counts = off[rows + 1] - off[rows]
        ci = self.col_indices
        idx = np.concatenate([ci[off[r]:off[r + 1]] for r in rows]) if counts.sum() else np.zeros(0, np.int32)
        ro = np.concatenate([[0], np.cumsum(counts)])
        return Layout.from_bsr(ro, idx, lq, lk, block=(self.block_rows, self.block_cols), heads=self.heads)

    def __repr__(self) -> str:
        return (
            f"VarlenLayout(B={self.num_seqs}, rows={self.row_blocks} x {self.block_rows}, "
            f"block=({self.block_rows}, {self.block_cols}), heads={self.heads}, nnz={self.nnz})"
        )


def _rebuild_varlen(row_offsets, col_indices, cu_q, cu_k, block, heads, row_blocks) -> VarlenLayout:
    return VarlenLayout.from_bsr(row_offsets, col_indices, cu_q, cu_k, block=block, heads=heads, row_blocks=row_blocks)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def _token_strides(a: Arr, name: str) -> tuple:
    """The [token, head] element strides of a 3-D [total, H, D] array."""
    t, h, d = a.shape
    if min(a.strides) < 0:
        raise ValueError(f"{name} has negative strides {a.strides}; make it contiguous first")
    if d > 1 and a.strides[2] != 1:
        raise ValueError(f"{name}'s last dimension (head_dim) must be contiguous; its strides are {a.strides}")
    st = [a.strides[0] if t > 1 else h * d, a.strides[1] if h > 1 else d]
    if st == [0, 0]:
        raise ValueError(f"{name} has all-zero outer strides (a broadcast view); materialise it first")
    return tuple(st)


def check_packed_tensors(q, k, v, names=("q", "k", "v"), kv_what="[total_k, Hkv, D]"):
    """q [total_q, Hq, D] and k, v of the shape kv_what (varlen: packed
    [total_k, Hkv, D]; paged: caches [num_pages, page_size, Hkv, D]): one
    family, dtype and device, the same head_dim, Hq a multiple of Hkv."""
    aq, ak, av = (adapt(x, name) for x, name in zip((q, k, v), names))
    check_family((aq, ak, av))
    if len(aq.shape) != 3:
        raise ValueError(f"{names[0]} must have 3 dimensions [total_q, Hq, D]; got shape {aq.shape}")
    kv_ndim = kv_what.count(",") + 1
    for a, name in ((ak, names[1]), (av, names[2])):
        if len(a.shape) != kv_ndim:
            raise ValueError(f"{name} must have {kv_ndim} dimensions {kv_what}; got shape {a.shape}")
    if not (aq.dtype == ak.dtype == av.dtype):
        raise TypeError(f"{', '.join(names)} dtypes differ: {aq.dtype_name}, {ak.dtype_name}, {av.dtype_name}")
    if not (aq.device == ak.device == av.device):
        raise ValueError(f"{', '.join(names)} are on different devices: {aq.device}, {ak.device}, {av.device}")
    if ak.shape != av.shape:
        raise ValueError(f"{names[1]} {ak.shape} and {names[2]} {av.shape} must have the same shape {kv_what}")
    if ak.shape[-1] != aq.shape[2]:
        raise ValueError(f"head_dim differs: {names[0]} has {aq.shape[2]}, {names[1]} and {names[2]} {ak.shape[-1]}")
    if min(aq.shape) < 1 or min(ak.shape) < 1:
        raise ValueError(f"every dimension must be >= 1: {names[0]} {aq.shape}, {names[1]} {ak.shape}")
    if aq.shape[1] % ak.shape[-2]:
        raise ValueError(f"{names[0]} heads ({aq.shape[1]}) must be a multiple of {names[1]} heads ({ak.shape[-2]})")
    return aq, ak, av


def _device_int32(x, name: str, aq: Arr, ndim: int):
    """An int32 array on q's CUDA device (read there by the library): a
    torch tensor of ndim dimensions, its last dimension contiguous."""
    import torch

    if not isinstance(x, torch.Tensor) or x.device != aq.obj.device:
        raise ValueError(f"{name} must be an int32 torch tensor on {aq.device} (the CUDA backend reads it there)")
    if x.dtype != torch.int32 or x.dim() != ndim or (x.shape[-1] > 1 and x.stride(-1) != 1) or min(x.stride()) < 0:
        raise ValueError(f"{name} must be a {ndim}-D int32 tensor, last dimension contiguous; got {x.dtype} {tuple(x.shape)}")
    return x


def _host_arg(x, name: str, ndim: int) -> np.ndarray:
    """A host int32 argument: 2-D [B, max_pages], 1-D [B] (per-sequence
    lengths, named seq_lens_*: B may be 1) or cumulative [B + 1]."""
    if ndim == 2:
        return _host_int32(x, name, 2, 1, "2-D [B, max_pages]")
    if name.startswith("seq_lens"):
        return _host_int32(x, name, 1, 1, "1-D [B]")
    return _host_lengths(x, name)


def int32_args(be, aq: Arr, args):
    """The int32 array arguments [(value, name, ndim)] as the backend reads
    them: packed host arrays (numpy) on the CPU, tensors on q's device on
    CUDA. Returns (arrays, their addresses)."""
    if be == Backend.CPU:
        arrays = [_host_arg(x, name, ndim) for x, name, ndim in args]
        return arrays, [a.ctypes.data for a in arrays]
    arrays = [_device_int32(x, name, aq, ndim) for x, name, ndim in args]
    return arrays, [a.data_ptr() for a in arrays]


def packed_call_options(q, k, v, aq: Arr, layout, scale, backend, what: str):
    """The checks both packed calls make first: the layout's type, backend
    and scale, no autograd. Returns (backend, scale)."""
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a sparsek.VarlenLayout, got {type(layout).__name__}")
    be, sc = _options(aq, scale, backend)
    if aq.kind == "torch" and needs_grad(q, k, v):
        raise ValueError(f"{what} has no backward yet: call it under torch.no_grad() or on detached tensors")
    return be, sc


def check_layout_lengths(layout, cu_q, cu_k) -> None:
    """Host lengths against those a VarlenLayout was built for."""
    if isinstance(layout, VarlenLayout) and not (
        np.array_equal(cu_q, layout._cu_q) and np.array_equal(cu_k, layout._cu_k)
    ):
        raise ValueError("the sequence lengths differ from the lengths the layout was built for")


def max_len(lens, given) -> int:
    """given, or the longest of the host lengths lens (at least 1)."""
    return max(int(np.max(lens, initial=1)), 1) if given is None else given


def out_and_lse(q, aq: Arr, out, return_lse):
    """(out, its Arr, lse or None, lse's address or None): out made like q
    or checked to be like q and writable; lse float32 [Hq, total_q]."""
    if out is None:
        out = _empty_like(q, aq)
        ao = adapt(out, "out")
    else:
        ao = adapt(out, "out")
        if (ao.kind, ao.shape, ao.dtype, ao.device) != (aq.kind, aq.shape, aq.dtype, aq.device):
            raise ValueError(f"out must be like q ({aq.kind} {aq.shape} {aq.dtype_name} on {aq.device})")
        check_output(ao, "out")
    lse = _empty_lse(q, aq, (aq.shape[1], aq.shape[0])) if return_lse else None
    lse_ptr = None if lse is None else (lse.ctypes.data if aq.kind == "numpy" else lse.data_ptr())
    return out, ao, lse, lse_ptr


def fill_common(desc, be, aq: Arr, ak_heads: int, batch, max_q, max_k, sc, causal) -> None:
    """The fields the varlen and paged descriptors share."""
    desc.backend, desc.dtype = int(be), int(aq.dtype)
    desc.batch, desc.total_q = batch, aq.shape[0]
    desc.max_seqlen_q = int64(max_q, "max_seqlen_q")
    desc.max_seqlen_k = int64(max_k, "max_seqlen_k")
    desc.heads_q, desc.heads_kv, desc.head_dim = aq.shape[1], ak_heads, aq.shape[2]
    desc.scale = 0.0 if sc is None else sc
    desc.mask = int(Mask.CAUSAL if causal else Mask.NONE)


def varlen_desc(be, aq: Arr, ak: Arr, av: Arr, ao: Arr, batch, max_q, max_k, sc, causal,
                o_name: str) -> SkAttentionVarlenDesc:
    """The varlen forward's descriptor (the forward's own, and the one the
    backward restates); o_name names O in a stride error."""
    desc = SkAttentionVarlenDesc()
    check(F.sk_attention_varlen_desc_init(byref(desc), sizeof(desc)))
    fill_common(desc, be, aq, ak.shape[1], batch, max_q, max_k, sc, causal)
    desc.total_k = ak.shape[0]
    desc.q_strides = _token_strides(aq, "q")
    desc.k_strides = _token_strides(ak, "k")
    desc.v_strides = _token_strides(av, "v")
    desc.o_strides = _token_strides(ao, o_name)
    return desc


def launch(q, be, layout, desc, workspace_size_fn, forward_fn, pointers) -> None:
    """forward_fn(desc, layout, *pointers, workspace, size, stream): on the
    CPU directly; on CUDA with the layout's device copy, a torch workspace
    of workspace_size_fn's size and torch's current stream."""
    if be == Backend.CPU:
        check(forward_fn(byref(desc), byref(layout.view()), *pointers, None, 0, None))
        return
    import torch

    with torch.cuda.device(q.device):
        bsr = layout.device_view(q.device)
        size = c_size_t()
        check(workspace_size_fn(byref(desc), byref(bsr), byref(size)))
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        check(forward_fn(byref(desc), byref(bsr), *pointers, ws.data_ptr(), size.value, stream))


def varlen_lengths(be, aq: Arr, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The length arrays of a varlen call (the forward's and the
    backward's) as the backend reads them, checked against each other and,
    on the CPU, against the layout's lengths; the maxima from the host
    arrays where not given (required on CUDA). Returns (their two
    addresses, B, max_seqlen_q, max_seqlen_k)."""
    (cu_q, cu_k), ptrs = int32_args(be, aq, [(cu_seqlens_q, "cu_seqlens_q", 1), (cu_seqlens_k, "cu_seqlens_k", 1)])
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q has {len(cu_q)} entries, cu_seqlens_k {len(cu_k)}")
    if be == Backend.CPU:
        check_layout_lengths(layout, cu_q, cu_k)
        max_seqlen_q = max_len(np.diff(cu_q.astype(np.int64)), max_seqlen_q)
        max_seqlen_k = max_len(np.diff(cu_k.astype(np.int64)), max_seqlen_k)
    elif max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("max_seqlen_q and max_seqlen_k are required with CUDA tensors (no host sync)")
    return ptrs, len(cu_q) - 1, max_seqlen_q, max_seqlen_k


def attention_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, layout, max_seqlen_q=None, max_seqlen_k=None,
    causal=False, scale=None, return_lse=False, out=None, backend=None,
):
    """Block-sparse attention over packed sequences.

    q [total_q, Hq, D], k and v [total_k, Hkv, D] (all numpy arrays, or
    all torch tensors); cu_seqlens_q / cu_seqlens_k int32 [B + 1], 0 first,
    non-decreasing, total_q / total_k last; layout a VarlenLayout (or any
    Layout of the varlen form) whose lengths are these. max_seqlen_q /
    max_seqlen_k: bounds on the lengths (computed from host arrays when
    None; required for CUDA tensors). causal: bottom-right per sequence.
    scale: None for 1/sqrt(D). out: optional output like q (last dimension
    contiguous). backend: None (from the data), "cpu", "cuda", ...

    Returns out, or (out, lse) with lse float32 [Hq, total_q] (natural log;
    -inf and O = 0 for a query with no admissible key).

    torch tensors requiring grad (CPU or CUDA): differentiable with respect
    to q, k and v (lse carries no gradient).
    """
    aq, ak, av = check_packed_tensors(q, k, v)
    if aq.kind == "torch" and needs_grad(q, k, v):
        from .varlen_autograd import attention_varlen_grad

        return attention_varlen_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, layout, max_seqlen_q, max_seqlen_k,
                                     causal, scale, return_lse, out, backend)
    be, sc = packed_call_options(q, k, v, aq, layout, scale, backend, "attention_varlen")
    ptrs, batch, max_seqlen_q, max_seqlen_k = varlen_lengths(
        be, aq, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    out, ao, lse, lse_ptr = out_and_lse(q, aq, out, return_lse)
    desc = varlen_desc(be, aq, ak, av, ao, batch, max_seqlen_q, max_seqlen_k, sc, causal, "out")
    pointers = (ptrs[0], ptrs[1], aq.ptr, ak.ptr, av.ptr, ao.ptr, lse_ptr)
    launch(q, be, layout, desc, F.sk_attention_varlen_workspace_size, F.sk_attention_varlen_forward, pointers)
    return (out, lse) if return_lse else out


__all__ = ["VarlenLayout", "attention_varlen", "varlen_layout_grid", "varlen_max_row_blocks"]
