"""Decode page selection, Quest-style (sparsek.h, "Decode page selection").

    summary = sparsek.kv_summary_build(k_cache, page_table, seq_lens_k, block_k=64)
    sparsek.kv_summary_append(summary, k_cache, page_table, old_lens, new_lens, block_k=64)
    sel = sparsek.decode_select(q, summary, seq_lens_k, k=64, block_k=64,
                                sink_blocks=1, recent_blocks=2)

- k_cache [num_pages, page_size, Hkv, D] (strided over pages, slots and
  heads; D contiguous), page_table int32 [B, max_pages] (its row stride is
  passed on), seq_lens_k / old_lens / new_lens int32 [B], q [B, q_len, Hq,
  D] (strided).
- summary: the cache's dtype, [B, Hkv, max_blocks, 2, D] (per key block of
  block_k positions, the per-channel min then max of its keys), with
  max_blocks = ceil(max_seqlen_k / block_k); max_seqlen_k defaults to
  max_pages * page_size for the build and the append, and is read back
  from the summary's shape (max_blocks * block_k) when selecting, unless
  given.
- decode_select returns a DecodeSelection: the decode layout's arrays
  (row_offsets [B * Hkv + 1], col_indices at the capacity; one row per
  sequence and KV head, row_offsets[-1] the real count), its grid and
  capacity, and rows() (host lists of each row's blocks).

numpy arrays (and torch CPU tensors) run on the CPU backend; torch CUDA
tensors on the CUDA backend, on torch's current stream of their device,
allocating the summary, the layout buffers and the workspace with torch,
never waiting for the host (the lengths and the page table stay on the
device): usable inside a CUDA graph when the caller passes `out` buffers.
decode_select's descriptor, grid, capacity and workspace come from the
plan cache (SelectPlan, plan_cache.cached_unowned; keyed by q's shape,
strides and dtype, the summary's geometry, the options and the stream);
each call still allocates the layout arrays it returns.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_int32, c_size_t, sizeof

import numpy as np

from ._arrays import adapt, check_family, check_output, outer_strides
from ._cvalues import int32, int64
from ._lib import Backend, DType, F, SkBsr, SkDecodeSelectDesc, SkGrid, check
from .attention import _parse_backend
from .layout import Grid
from .plan_cache import cached_unowned
from .topk import _scale
from .varlen import _device_int32, _host_int32

__all__ = ["DecodeSelection", "SelectPlan", "kv_summary_build", "kv_summary_append", "decode_select"]


def _block_k(value) -> int:
    b = int32(value, "block_k")
    if b not in (16, 32, 64, 128):
        raise ValueError(f"block_k = {b} must be 16, 32, 64 or 128")
    return b


def _backend(a, backend) -> Backend:
    be = _parse_backend(backend, a.device)
    if a.kind == "numpy" and be != Backend.CPU:
        raise ValueError("numpy arrays run on the CPU backend only")
    if be != Backend.CPU and a.dtype == DType.F32:
        raise TypeError("float32 inputs are for the CPU backend only; use float16 or bfloat16 on CUDA")
    return be


def _ints(be, a, args):
    """int32 arrays [(value, name, ndim)]: packed host arrays on the CPU,
    int32 tensors on a's device on CUDA. Returns (arrays, addresses)."""
    if be == Backend.CPU:
        arrays = [
            _host_int32(x, name, 1, 1, "1-D [B]") if ndim == 1 else _host_int32(x, name, 2, 1, "2-D [B, max_pages]")
            for x, name, ndim in args
        ]
        return arrays, [x.ctypes.data for x in arrays]
    arrays = [_device_int32(x, name, a, ndim) for x, name, ndim in args]
    return arrays, [x.data_ptr() for x in arrays]


def _desc(be, a, batch, heads_kv, head_dim, max_seqlen_k, block_k) -> SkDecodeSelectDesc:
    d = SkDecodeSelectDesc()
    check(F.sk_decode_select_desc_init(byref(d), sizeof(d)))
    d.backend, d.dtype = int(be), int(a.dtype)
    d.batch, d.heads_kv, d.head_dim = int64(batch, "batch"), heads_kv, head_dim
    d.heads_q, d.q_len = heads_kv, 1
    d.max_seqlen_k = int64(max_seqlen_k, "max_seqlen_k")
    d.block_k = block_k
    return d


def _stream(be, a):
    if be == Backend.CPU:
        return None
    import torch

    return torch.cuda.current_stream(a.obj.device).cuda_stream


def _empty(a, shape, dtype=None):
    """An empty array like a's family and device (a's dtype unless given)."""
    if a.kind == "numpy":
        return np.empty(shape, a.obj.dtype if dtype is None else dtype)
    import torch

    return torch.empty(shape, dtype=a.obj.dtype if dtype is None else dtype, device=a.obj.device)


def _cache_call(k_cache, page_table, lens_args, block_k, max_seqlen_k, summary, backend):
    """The checks and descriptor of a summary call; returns (desc, cache
    Arr, int arrays, their addresses, summary, stream)."""
    ac = adapt(k_cache, "k_cache")
    if len(ac.shape) != 4:
        raise ValueError(f"k_cache must be [num_pages, page_size, Hkv, D]; got shape {ac.shape}")
    be = _backend(ac, backend)
    bk = _block_k(block_k)
    arrays, ptrs = _ints(be, ac, [(page_table, "page_table", 2)] + lens_args)
    table = arrays[0]
    num_pages, page_size, hkv, dim = ac.shape
    batch, max_pages = table.shape
    if any(len(x) != batch for x in arrays[1:]):
        raise ValueError(f"page_table has {batch} rows, but the length arrays have {[len(x) for x in arrays[1:]]}")
    msk = max_pages * page_size if max_seqlen_k is None else max_seqlen_k
    d = _desc(be, ac, batch, hkv, dim, msk, bk)
    d.num_pages, d.page_size, d.max_pages = num_pages, int32(page_size, "page_size"), int32(max_pages, "max_pages")
    d.page_table_stride = table.strides[0] // table.itemsize if be == Backend.CPU else table.stride(0)
    d.k_strides = outer_strides(ac, "k_cache")
    max_blocks = -(-int(msk) // bk)
    shape = (batch, hkv, max_blocks, 2, dim)
    if summary is None:
        summary = _empty(ac, shape)
    asum = adapt(summary, "summary")
    check_family((ac, asum))
    if asum.shape != shape or asum.dtype != ac.dtype or asum.device != ac.device:
        raise ValueError(f"summary must be {ac.dtype_name} {shape} on {ac.device}; got {asum.dtype_name} {asum.shape}")
    if asum.strides != tuple(int(np.prod(shape[i + 1:])) for i in range(5)):
        raise ValueError("summary must be contiguous")
    check_output(asum, "summary")
    return d, ac, arrays, ptrs, summary, asum, _stream(be, ac)


def kv_summary_build(k_cache, page_table, seq_lens_k, *, block_k=64, max_seqlen_k=None, out=None,
                     backend=None):
    """The key block summaries of every sequence (sk_kv_summary_build):
    returns `out` (or a new array) [B, Hkv, max_blocks, 2, D] in the cache's
    dtype; blocks past a sequence's length hold +inf / -inf."""
    d, ac, _, ptrs, summary, asum, stream = _cache_call(
        k_cache, page_table, [(seq_lens_k, "seq_lens_k", 1)], block_k, max_seqlen_k, out, backend
    )
    i32 = POINTER(c_int32)
    check(F.sk_kv_summary_build(byref(d), ac.ptr, ctypes.cast(ptrs[0], i32), ctypes.cast(ptrs[1], i32),
                                asum.ptr, stream))
    return summary


def kv_summary_append(summary, k_cache, page_table, old_lens, new_lens, *, block_k=64, max_seqlen_k=None,
                      backend=None):
    """Update `summary` in place after keys old_lens[b] .. new_lens[b] - 1
    were written to the cache (sk_kv_summary_append); returns it."""
    d, ac, _, ptrs, summary, asum, stream = _cache_call(
        k_cache, page_table, [(old_lens, "old_lens", 1), (new_lens, "new_lens", 1)], block_k, max_seqlen_k,
        summary, backend,
    )
    i32 = POINTER(c_int32)
    check(F.sk_kv_summary_append(byref(d), ac.ptr, ctypes.cast(ptrs[0], i32), ctypes.cast(ptrs[1], i32),
                                 ctypes.cast(ptrs[2], i32), asum.ptr, stream))
    return summary


class DecodeSelection:
    """The decode layout (sparsek.h): row_offsets [B * Hkv + 1] and
    col_indices [capacity] (numpy, or torch on the CUDA device), one row per
    (sequence, KV head), row_offsets[-1] the real count; grid (block_rows
    64, block_cols = block_k) and capacity. to_c() gives the sk_bsr view
    (nnz = capacity) for the C API."""

    def __init__(self, grid: Grid, capacity: int, row_offsets, col_indices):
        self.grid, self.capacity = grid, capacity
        self.row_offsets, self.col_indices = row_offsets, col_indices

    def _host(self, x):
        return x if isinstance(x, np.ndarray) else x.cpu().numpy()

    @property
    def nnz(self) -> int:
        """The real count (copied back from the device, waiting for it)."""
        return int(self._host(self.row_offsets[-1:])[0])

    def rows(self) -> list:
        """Each row's selected blocks as a host int32 array, row b * Hkv + h."""
        ro, ci = self._host(self.row_offsets), self._host(self.col_indices)
        return [ci[ro[r]:ro[r + 1]].copy() for r in range(len(ro) - 1)]

    def to_c(self) -> SkBsr:
        ptr = (lambda x: x.ctypes.data) if isinstance(self.row_offsets, np.ndarray) else (lambda x: x.data_ptr())
        bsr = SkBsr()
        bsr.grid = self.grid.to_c()
        bsr.nnz = self.capacity
        bsr.row_offsets = ctypes.cast(ptr(self.row_offsets), POINTER(c_int32))
        bsr.col_indices = ctypes.cast(ptr(self.col_indices), POINTER(c_int32))
        return bsr


class SelectPlan:
    """What every decode_select call of one problem shares, made on a cache
    miss (plan_cache.cached_unowned): the descriptor, the layout's grid and
    capacity, the workspace size and, on CUDA, the workspace (torch, on
    the current stream's device; a run writes it, and the key holds the
    stream)."""

    __slots__ = ("desc", "grid", "capacity", "workspace", "workspace_size", "workspace_ptr")

    def __init__(self, be, aq, hkv, msk, bk, options):
        batch, q_len, hq, dim = aq.shape
        d = _desc(be, aq, batch, hkv, dim, msk, bk)
        d.heads_q, d.q_len = hq, q_len
        d.q_strides = outer_strides(aq, "q")
        d.k, d.sink_blocks, d.recent_blocks, d.scale = options
        # The page fields are not read here; any geometry that holds max_seqlen_k.
        d.num_pages, d.page_size, d.max_pages = 1, 128, int32(-(-int(msk) // 128), "max_pages")
        g, cap = SkGrid(), c_int32()
        check(F.sk_decode_select_capacity(byref(d), byref(g), byref(cap)))
        size = c_size_t()
        check(F.sk_decode_select_workspace_size(byref(d), byref(size)))
        self.desc, self.capacity, self.workspace_size = d, cap.value, size.value
        self.grid = Grid(g.rows, g.cols, g.block_rows, g.block_cols, g.batch, g.heads)
        self.workspace, self.workspace_ptr = None, None
        if be != Backend.CPU and size.value > 0:
            self.workspace = _empty(aq, (size.value,), _torch_uint8())
            self.workspace_ptr = self.workspace.data_ptr()


def _torch_uint8():
    import torch

    return torch.uint8


def decode_select(q, summary, seq_lens_k, k=64, *, block_k=64, sink_blocks=1, recent_blocks=2, scale=None,
                  max_seqlen_k=None, backend=None):
    """Quest selection for decode (sk_decode_select): per (sequence, KV
    head) the forced sinks, the recent blocks ending at the last key's, and
    the k blocks with the highest summed upper bound. q [B, q_len, Hq, D];
    summary as kv_summary_build made it. Returns a DecodeSelection."""
    aq, asum = adapt(q, "q"), adapt(summary, "summary")
    check_family((aq, asum))
    if len(aq.shape) != 4 or len(asum.shape) != 5:
        raise ValueError(f"q must be [B, q_len, Hq, D] and summary [B, Hkv, max_blocks, 2, D]; got {aq.shape}, "
                         f"{asum.shape}")
    be = _backend(aq, backend)
    bk = _block_k(block_k)
    batch, q_len, hq, dim = aq.shape
    sb, hkv, max_blocks, two, sdim = asum.shape
    if (sb, two, sdim) != (batch, 2, dim) or asum.dtype != aq.dtype or asum.device != aq.device:
        raise ValueError(f"summary {asum.dtype_name} {asum.shape} does not match q {aq.dtype_name} {aq.shape}")
    (lens,), (lens_ptr,) = _ints(be, aq, [(seq_lens_k, "seq_lens_k", 1)])
    if len(lens) != batch:
        raise ValueError(f"seq_lens_k has {len(lens)} entries for {batch} sequences")
    msk = int64(max_blocks * bk if max_seqlen_k is None else max_seqlen_k, "max_seqlen_k")
    options = (int32(k, "k"), int32(sink_blocks, "sink_blocks"), int32(recent_blocks, "recent_blocks"), _scale(scale))
    # Everything the descriptor, the grid, the capacity and the workspace
    # size are made of: a hit skips them all.
    key = ("decode_select", aq.kind, int(be), int(aq.dtype), aq.shape, aq.strides, hkv, msk, bk) + options
    plan = cached_unowned(key, aq.device, lambda: SelectPlan(be, aq, hkv, msk, bk, options))
    grid, cap = plan.grid, plan.capacity
    rows = batch * hkv
    if be == Backend.CPU:
        ro, ci = np.empty(rows + 1, np.int32), np.empty(max(cap, 1), np.int32)
    else:
        import torch

        ro = torch.empty(rows + 1, dtype=torch.int32, device=aq.obj.device)
        ci = torch.empty(max(cap, 1), dtype=torch.int32, device=aq.obj.device)
    sel = DecodeSelection(grid, cap, ro, ci)
    bsr = sel.to_c()
    check(F.sk_decode_select(byref(plan.desc), aq.ptr, asum.ptr, ctypes.cast(lens_ptr, POINTER(c_int32)), byref(bsr),
                             plan.workspace_ptr, plan.workspace_size, _stream(be, aq)))
    return sel
