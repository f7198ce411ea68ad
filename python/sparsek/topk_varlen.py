"""Top-k block selection on varlen and paged inputs (sparsek.h, "Top-k
selection on varlen and paged inputs").

    layout = sparsek.topk_varlen(q, k, cu_seqlens_q, cu_seqlens_k, 8,
                                 sink_blocks=1, local_blocks=2, causal=True)
    layout = sparsek.topk_paged(q, k_cache, cu_seqlens_q, seq_lens_k,
                                page_table, 8, causal=True)
    out = sparsek.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, layout,
                                   causal=True)

Each sequence gets the fixed selection (sparsek.pool_select_topk) on its own
tokens; the result is a sparsek.VarlenLayout over the sequences' rows (R =
varlen_max_row_blocks rows per slice), which attention_varlen and
attention_paged take. numpy arrays and torch CPU tensors run on the CPU
backend; torch CUDA tensors run on the CUDA backend on torch's current
stream, then the layout is copied back to the host to build the
VarlenLayout (that copy waits for the stream). On CUDA the length arrays
and the page table must be int32 tensors on q's device and max_seqlen_q /
max_seqlen_k must be given.
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_int32, c_size_t, c_void_p, cast, sizeof

import numpy as np

from ._arrays import outer_strides
from ._cvalues import int32, int64
from ._lib import Backend, F, Mask, SkBsr, SkGrid, SkTopkVarlenDesc, check
from .attention import _options
from .varlen import VarlenLayout, _token_strides, check_packed_tensors, int32_args, max_len

__all__ = ["topk_varlen", "topk_paged"]


def _desc(be, aq, ak_heads, batch, max_q, max_k, sc, k_blocks, sink_blocks, local_blocks, causal,
          per_kv_head, block_q, block_k) -> SkTopkVarlenDesc:
    d = SkTopkVarlenDesc()
    check(F.sk_topk_varlen_desc_init(byref(d), sizeof(d)))
    d.backend, d.dtype = int(be), int(aq.dtype)
    d.batch, d.total_q = batch, aq.shape[0]
    d.max_seqlen_q = int64(max_q, "max_seqlen_q")
    d.max_seqlen_k = int64(max_k, "max_seqlen_k")
    d.heads_q, d.heads_kv, d.head_dim = aq.shape[1], ak_heads, aq.shape[2]
    d.q_strides = _token_strides(aq, "q")
    d.block_q, d.block_k = int32(block_q, "block_q"), int32(block_k, "block_k")
    d.scale = 0.0 if sc is None else sc
    d.k = int32(k_blocks, "k_blocks")
    d.sink_blocks = int32(sink_blocks, "sink_blocks")
    d.local_blocks = int32(local_blocks, "local_blocks")
    d.mask = int(Mask.CAUSAL if causal else Mask.NONE)
    d.per_kv_head = 1 if per_kv_head else 0
    return d


def _run(q, be, desc, ws_fn, select_fn, pointers, cu_q_host, cu_k_host):
    """Run the selection into capacity-sized buffers; the VarlenLayout of
    its real rows."""
    grid, cap = SkGrid(), c_int32()
    check(F.sk_topk_varlen_layout_capacity(byref(desc), byref(grid), byref(cap)))
    rows = grid.rows // grid.block_rows
    n_off = grid.heads * rows + 1
    if be == Backend.CPU:
        off = np.empty(n_off, np.int32)
        idx = np.empty(max(cap.value, 1), np.int32)
        bsr = SkBsr()
        bsr.row_offsets = off.ctypes.data_as(type(bsr.row_offsets))
        bsr.col_indices = idx.ctypes.data_as(type(bsr.col_indices))
        check(select_fn(byref(desc), *pointers, byref(bsr), None, 0, None))
    else:
        import torch

        with torch.cuda.device(q.device):
            size = c_size_t()
            check(ws_fn(byref(desc), byref(size)))
            ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
            d_off = torch.empty(n_off, dtype=torch.int32, device=q.device)
            d_idx = torch.empty(max(cap.value, 1), dtype=torch.int32, device=q.device)
            bsr = _device_bsr(d_off, d_idx)
            stream = torch.cuda.current_stream(q.device).cuda_stream
            check(select_fn(byref(desc), *pointers, byref(bsr), ws.data_ptr(), size.value, stream))
            off, idx = d_off.cpu().numpy(), d_idx.cpu().numpy()
    nnz = int(off[-1])
    return VarlenLayout.from_bsr(
        off, idx[:nnz], cu_q_host, cu_k_host, block=(grid.block_rows, grid.block_cols), heads=grid.heads,
        row_blocks=rows,
    )


def _device_bsr(d_off, d_idx) -> SkBsr:
    """An sk_bsr over two int32 device tensors."""
    bsr = SkBsr()
    bsr.row_offsets = cast(c_void_p(d_off.data_ptr()), POINTER(c_int32))
    bsr.col_indices = cast(c_void_p(d_idx.data_ptr()), POINTER(c_int32))
    return bsr


def _host_copy(x) -> np.ndarray:
    """A length array as host int64 (a device tensor is copied back)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x).astype(np.int64)


def topk_varlen(
    q, k, cu_seqlens_q, cu_seqlens_k, k_blocks, *, sink_blocks=0, local_blocks=0, causal=False,
    per_kv_head=False, scale=None, block_q=128, block_k=128, max_seqlen_q=None, max_seqlen_k=None,
    backend=None,
) -> VarlenLayout:
    """Select per sequence from packed q [total_q, Hq, D] and k [total_k,
    Hkv, D] (sk_topk_varlen_select): k_blocks key blocks by score per row,
    plus sink_blocks leading and local_blocks diagonal blocks; causal is
    bottom-right per sequence; per_kv_head: one layout per KV head (scores
    summed over its query heads). Returns a VarlenLayout of cu_seqlens_q /
    cu_seqlens_k with heads Hq (or Hkv)."""
    aq, ak, _ = check_packed_tensors(q, k, k, ("q", "k", "k"))
    be, sc = _options(aq, scale, backend)
    (cu_q, cu_k), ptrs = int32_args(be, aq, [(cu_seqlens_q, "cu_seqlens_q", 1), (cu_seqlens_k, "cu_seqlens_k", 1)])
    batch = len(cu_q) - 1
    if len(cu_k) != batch + 1:
        raise ValueError(f"cu_seqlens_q has {len(cu_q)} entries, cu_seqlens_k {len(cu_k)}: both are [B + 1]")
    hq, hk = _host_copy(cu_q), _host_copy(cu_k)
    if be == Backend.CPU:
        max_seqlen_q = max_len(np.diff(hq), max_seqlen_q)
        max_seqlen_k = max_len(np.diff(hk), max_seqlen_k)
    elif max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("max_seqlen_q and max_seqlen_k are required with CUDA tensors")
    desc = _desc(be, aq, ak.shape[1], batch, max_seqlen_q, max_seqlen_k, sc, k_blocks, sink_blocks, local_blocks,
                 causal, per_kv_head, block_q, block_k)
    desc.total_k = ak.shape[0]
    desc.k_strides = _token_strides(ak, "k")
    return _run(q, be, desc, F.sk_topk_varlen_workspace_size, F.sk_topk_varlen_select,
                (ptrs[0], ptrs[1], aq.ptr, ak.ptr), hq, hk)


def topk_paged(
    q, k_cache, cu_seqlens_q, seq_lens_k, page_table, k_blocks, *, sink_blocks=0, local_blocks=0,
    causal=False, per_kv_head=False, scale=None, block_q=128, block_k=128, max_seqlen_q=None,
    max_seqlen_k=None, backend=None,
) -> VarlenLayout:
    """topk_varlen with K in a paged cache [num_pages, page_size, Hkv, D]
    (sk_topk_paged_select), read through page_table [B, max_pages] for
    seq_lens_k [B] keys per sequence, as attention_paged reads it. Returns
    the VarlenLayout of cu_seqlens_q and [0, cumsum(seq_lens_k)]."""
    aq, ak, _ = check_packed_tensors(q, k_cache, k_cache, ("q", "k_cache", "k_cache"), "[num_pages, page_size, Hkv, D]")
    be, sc = _options(aq, scale, backend)
    (cu_q, lens, table), ptrs = int32_args(
        be, aq, [(cu_seqlens_q, "cu_seqlens_q", 1), (seq_lens_k, "seq_lens_k", 1), (page_table, "page_table", 2)]
    )
    batch = len(cu_q) - 1
    if len(lens) != batch or table.shape[0] != batch:
        raise ValueError(
            f"{batch} sequences (cu_seqlens_q), but seq_lens_k has {len(lens)} entries and "
            f"page_table {table.shape[0]} rows"
        )
    hq, hl = _host_copy(cu_q), _host_copy(lens)
    if be == Backend.CPU:
        max_seqlen_q = max_len(np.diff(hq), max_seqlen_q)
        max_seqlen_k = max_len(hl, max_seqlen_k)
    elif max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("max_seqlen_q and max_seqlen_k are required with CUDA tensors")
    desc = _desc(be, aq, ak.shape[2], batch, max_seqlen_q, max_seqlen_k, sc, k_blocks, sink_blocks, local_blocks,
                 causal, per_kv_head, block_q, block_k)
    row_stride = table.strides[0] // table.itemsize if be == Backend.CPU else table.stride(0)
    desc.num_pages = int64(ak.shape[0], "num_pages")
    desc.page_size = int32(ak.shape[1], "page_size")
    desc.max_pages = int32(table.shape[1], "max_pages")
    desc.page_table_stride = row_stride if batch > 1 else 0
    desc.k_cache_strides = outer_strides(ak, "k_cache")
    return _run(q, be, desc, F.sk_topk_paged_workspace_size, F.sk_topk_paged_select,
                (ptrs[0], ptrs[1], ptrs[2], aq.ptr, ak.ptr), hq, np.concatenate([[0], np.cumsum(hl)]))
