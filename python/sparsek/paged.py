"""The paged KV cache (sparsek.h, "Paged KV cache"): packed queries against
keys and values kept in caches of pages, as vLLM and flashinfer keep them.

- attention_paged(q, k_cache, v_cache, cu_seqlens_q, seq_lens_k,
  page_table, layout, ...): q [total_q, Hq, D] packed as in
  attention_varlen, the caches [num_pages, page_size, Hkv, D] (strided over
  pages, slots and heads; D contiguous), seq_lens_k int32 [B], page_table
  int32 [B, max_pages] (vLLM's block_table; its row stride is passed on).
  The layout is the VarlenLayout of cu_seqlens_q and the key lengths
  (cumulative: cu_seqlens_k = [0, cumsum(seq_lens_k)]). Chunked prefill is
  causal=True: the new queries are the last len_q keys of each sequence.
- paged_kv_from_dense(k, v, cu_seqlens_k, page_size, ...): the caches,
  page table and lengths holding packed K and V, for tests and examples.

numpy arrays and torch CPU tensors run on the CPU backend; torch CUDA
tensors run on the CUDA backend (the portable kernel; "cuda_sm90"
answers NOT_SUPPORTED for now).
"""

from __future__ import annotations

from ctypes import byref, sizeof

import numpy as np

from ._arrays import is_torch, outer_strides
from ._cvalues import as_int, int32, int64
from ._lib import Backend, F, SkAttentionPagedDesc, check
from .varlen import (
    _token_strides,
    check_layout_lengths,
    check_packed_tensors,
    fill_common,
    int32_args,
    launch,
    max_len,
    out_and_lse,
    packed_call_options,
)


def page_fields(desc, ak, av, table, row_stride: int, batch: int) -> None:
    """The cache and page-table fields that the paged forward's and the
    decode's descriptors share (ak, av: the caches' Arr; table: the page
    table as the backend reads it, row_stride its row stride)."""
    desc.num_pages = int64(ak.shape[0], "num_pages")
    desc.page_size = int32(ak.shape[1], "page_size")
    desc.max_pages = int32(table.shape[1], "max_pages")
    desc.page_table_stride = row_stride if batch > 1 else 0
    desc.k_strides = outer_strides(ak, "k_cache")
    desc.v_strides = outer_strides(av, "v_cache")


def attention_paged(
    q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, page_table, layout, max_seqlen_q=None,
    max_seqlen_k=None, causal=False, scale=None, return_lse=False, out=None, backend=None,
):
    """Block-sparse attention of packed queries over a paged KV cache.

    q [total_q, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]
    (page_size 16, 32, 64 or 128); cu_seqlens_q int32 [B + 1]; seq_lens_k
    int32 [B] (each sequence's keys, FlashAttention's seqused_k);
    page_table int32 [B, max_pages] (sequence b's key k in page
    page_table[b, k // page_size]); layout: the VarlenLayout of
    cu_seqlens_q and [0, cumsum(seq_lens_k)]. max_seqlen_q / max_seqlen_k:
    computed from host arrays when None (required with CUDA tensors).
    causal: bottom-right per sequence (chunked prefill). Returns out, or
    (out, lse) with lse float32 [Hq, total_q].
    """
    aq, ak, av = check_packed_tensors(
        q, k_cache, v_cache, ("q", "k_cache", "v_cache"), "[num_pages, page_size, Hkv, D]"
    )
    be, sc = packed_call_options(q, k_cache, v_cache, aq, layout, scale, backend, "attention_paged")
    (cu_q, lens, table), ptrs = int32_args(
        be, aq, [(cu_seqlens_q, "cu_seqlens_q", 1), (seq_lens_k, "seq_lens_k", 1), (page_table, "page_table", 2)]
    )
    batch = len(cu_q) - 1
    if len(lens) != batch or table.shape[0] != batch:
        raise ValueError(
            f"{batch} sequences (cu_seqlens_q), but seq_lens_k has {len(lens)} entries and "
            f"page_table {table.shape[0]} rows"
        )
    if be == Backend.CPU:
        lens64 = lens.astype(np.int64)
        check_layout_lengths(layout, cu_q, np.concatenate([[0], np.cumsum(lens64)]))
        max_seqlen_q = max_len(np.diff(cu_q.astype(np.int64)), max_seqlen_q)
        max_seqlen_k = max_len(lens64, max_seqlen_k)
    elif max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("max_seqlen_q and max_seqlen_k are required with CUDA tensors (no host sync)")
    out, ao, lse, lse_ptr = out_and_lse(q, aq, out, return_lse)
    row_stride = table.strides[0] // table.itemsize if be == Backend.CPU else table.stride(0)
    desc = SkAttentionPagedDesc()
    check(F.sk_attention_paged_desc_init(byref(desc), sizeof(desc)))
    fill_common(desc, be, aq, ak.shape[2], batch, max_seqlen_q, max_seqlen_k, sc, causal)
    page_fields(desc, ak, av, table, row_stride, batch)
    desc.q_strides = _token_strides(aq, "q")
    desc.o_strides = _token_strides(ao, "out")
    pointers = (ptrs[0], ptrs[1], ptrs[2], aq.ptr, ak.ptr, av.ptr, ao.ptr, lse_ptr)
    launch(q, be, layout, desc, F.sk_attention_paged_workspace_size, F.sk_attention_paged_forward, pointers)
    return (out, lse) if return_lse else out


def paged_kv_from_dense(k, v, cu_seqlens_k, page_size, *, extra_pages=0, seed=None, fill=0.0):
    """Caches holding packed K and V [total_k, Hkv, D] (numpy or torch):
    (k_cache, v_cache [num_pages, page_size, Hkv, D], page_table int32
    [B, max_pages], seq_lens_k int32 [B]). Each sequence gets
    ceil(len / page_size) pages, in order or, with a seed, shuffled among
    all of them; extra_pages unused pages are added; every slot no sequence
    uses holds `fill` (NaN to prove it is never read); the page table
    entries past each sequence's pages are -1 (never read either)."""
    cu = np.asarray(cu_seqlens_k.cpu() if is_torch(cu_seqlens_k) else cu_seqlens_k).astype(np.int64)
    page_size = as_int(page_size, "page_size")
    if cu.ndim != 1 or cu.size < 2 or (np.diff(cu) < 0).any() or cu[0] != 0:
        raise ValueError("cu_seqlens_k must be 1-D [B + 1], 0 first, non-decreasing")
    if page_size < 1:
        raise ValueError(f"page_size = {page_size} must be >= 1")
    lens = np.diff(cu)
    pages = -(-lens // page_size)
    num_pages = int(pages.sum()) + as_int(extra_pages, "extra_pages")
    num_pages = max(num_pages, 1)
    order = np.arange(num_pages) if seed is None else np.random.default_rng(seed).permutation(num_pages)
    table = np.full((len(lens), max(int(pages.max(initial=1)), 1)), -1, np.int32)
    slot_of = np.zeros(int(cu[-1]), np.int64)  # packed key -> flat cache slot
    next_page = 0
    for b, (start, n) in enumerate(zip(cu[:-1], pages)):
        table[b, :n] = order[next_page : next_page + n]
        next_page += n
        kk = np.arange(lens[b])
        slot_of[start : start + lens[b]] = table[b, kk // page_size].astype(np.int64) * page_size + kk % page_size
    caches = []
    for x in (k, v):
        if is_torch(x):
            import torch

            cache = torch.full((num_pages * page_size,) + tuple(x.shape[1:]), fill, dtype=x.dtype, device=x.device)
            cache[torch.from_numpy(slot_of).to(x.device)] = x
            caches.append(cache.reshape((num_pages, page_size) + tuple(x.shape[1:])))
        else:
            x = np.asarray(x)
            cache = np.full((num_pages * page_size,) + x.shape[1:], fill, dtype=x.dtype)
            cache[slot_of] = x
            caches.append(cache.reshape((num_pages, page_size) + x.shape[1:]))
    seq_lens = lens.astype(np.int32)
    if is_torch(k):
        import torch

        table, seq_lens = torch.from_numpy(table).to(k.device), torch.from_numpy(seq_lens).to(k.device)
    return caches[0], caches[1], table, seq_lens


__all__ = ["attention_paged", "paged_kv_from_dense"]
