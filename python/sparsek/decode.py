"""Decode (sparsek.h, "Decode"): q_len new query tokens per sequence over
the paged KV cache, every key or only the key blocks a selection picked
per (sequence, KV head).

- decode(q, k_cache, v_cache, page_table, seq_lens, layout=None, ...):
  q [B, q_len, Hq, D] (q_len 1 .. 16; strided, D contiguous), the caches
  [num_pages, page_size, Hkv, D] as attention_paged takes them,
  page_table int32 [B, max_pages], seq_lens int32 [B] (each sequence's
  keys, its q_len new tokens included as the last ones). layout: None
  (all keys) or the decode layout as two int32 arrays (row_offsets,
  col_indices): one row per sequence and KV head (B x Hkv + 1 offsets) or
  per sequence (B + 1), each row's key blocks of block_k (16, 32, 64 or
  128) keys, sorted and unique. Indices past a sequence's blocks are
  skipped on CUDA and refused on the CPU.

numpy arrays and torch CPU tensors run on the CPU backend (the
reference); torch CUDA tensors on the CUDA backend (split-KV kernel, on
torch's current stream, graph capturable when max_seqlen_k is given).

The descriptor, the workspace size and the workspace (CUDA) are made once
per problem and stream and then reused (DecodePlan, from the plan cache:
plan_cache.cached_unowned): the key holds every shape, stride, dtype,
option, max_seqlen_k and the layout's geometry (rows per sequence,
block_k, nnz), so a decode loop that passes a fixed max_seqlen_k (a
capacity) plans once. The layout's content and the lengths may change
freely between calls: each call runs sk_decode, whose plan step follows
them.
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_int32, c_size_t, cast, sizeof

import numpy as np

from ._arrays import adapt, check_family, outer_strides
from ._cvalues import as_int, int32, int64
from ._lib import Backend, F, Mask, SkBsr, SkDecodeDesc, check
from .attention import _empty_like, _empty_lse, _options, needs_grad
from .paged import page_fields
from .plan_cache import cached_unowned
from .varlen import _device_int32, _host_int32, out_and_lse


def _check_tensors(q, k_cache, v_cache):
    aq, ak, av = adapt(q, "q"), adapt(k_cache, "k_cache"), adapt(v_cache, "v_cache")
    check_family((aq, ak, av))
    if len(aq.shape) != 4:
        raise ValueError(f"q must have 4 dimensions [B, q_len, Hq, D]; got shape {aq.shape}")
    for a, name in ((ak, "k_cache"), (av, "v_cache")):
        if len(a.shape) != 4:
            raise ValueError(f"{name} must have 4 dimensions [num_pages, page_size, Hkv, D]; got shape {a.shape}")
    if not (aq.dtype == ak.dtype == av.dtype):
        raise TypeError(f"q, k_cache, v_cache dtypes differ: {aq.dtype_name}, {ak.dtype_name}, {av.dtype_name}")
    if not (aq.device == ak.device == av.device):
        raise ValueError(f"q, k_cache, v_cache are on different devices: {aq.device}, {ak.device}, {av.device}")
    if ak.shape != av.shape:
        raise ValueError(f"k_cache {ak.shape} and v_cache {av.shape} must have the same shape")
    if ak.shape[3] != aq.shape[3]:
        raise ValueError(f"head_dim differs: q has {aq.shape[3]}, the caches {ak.shape[3]}")
    if min(aq.shape) < 1 or min(ak.shape) < 1:
        raise ValueError(f"every dimension must be >= 1: q {aq.shape}, k_cache {ak.shape}")
    if aq.shape[2] % ak.shape[2]:
        raise ValueError(f"q heads ({aq.shape[2]}) must be a multiple of the caches' heads ({ak.shape[2]})")
    return aq, ak, av


def _int32_arg(be, aq, x, name, ndim, allow_empty=False):
    """(array as the backend reads it, its address)."""
    if be == Backend.CPU:
        a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        if allow_empty and a.size == 0:
            return np.zeros(0, np.int32), None
        a = _host_int32(x, name, ndim, 1, f"{ndim}-D int32")
        return a, a.ctypes.data
    t = _device_int32(x, name, aq, ndim)
    return t, (t.data_ptr() if t.numel() > 0 else None)


def _layout_view(be, aq, layout, block_k, batch, heads_kv, q_len, max_seqlen_k):
    """The sk_bsr of a decode layout (row_offsets, col_indices), its arrays
    kept alive by the returned tuple."""
    if not (isinstance(layout, (tuple, list)) and len(layout) == 2):
        raise TypeError("layout must be None or (row_offsets, col_indices), two int32 arrays")
    if block_k is None:
        raise ValueError("block_k (16, 32, 64 or 128 keys) is required with a layout")
    offsets, off_ptr = _int32_arg(be, aq, layout[0], "row_offsets", 1)
    indices, idx_ptr = _int32_arg(be, aq, layout[1], "col_indices", 1, allow_empty=True)
    rows = offsets.shape[0] - 1
    if rows == batch * heads_kv:
        heads = heads_kv
    elif rows == batch:
        heads = 1
    else:
        raise ValueError(
            f"row_offsets has {rows + 1} entries: B x Hkv + 1 = {batch * heads_kv + 1} (a row per KV head) "
            f"or B + 1 = {batch + 1} (shared by the KV heads)"
        )
    view = SkBsr()
    view.grid.rows, view.grid.cols = q_len, max_seqlen_k
    view.grid.block_rows, view.grid.block_cols = 64, as_int(block_k, "block_k")
    view.grid.batch, view.grid.heads = batch, heads
    view.nnz = int32(indices.shape[0], "nnz")
    view.row_offsets = cast(off_ptr, POINTER(c_int32))
    view.col_indices = cast(idx_ptr, POINTER(c_int32)) if idx_ptr else None
    return view, (offsets, indices)


class DecodePlan:
    """What every decode call of one problem shares, made on a cache miss
    (plan_cache.cached_unowned): the descriptor, the workspace size and,
    on CUDA, the workspace (torch, on the current stream's device). The
    first run is sk_decode, its plan included; later runs are sk_decode_run
    alone (one plan per workspace and problem: sparsek.h "Decode"). The
    lengths and the layout's content may change between calls: the run
    reads them, and on the CPU checks them as the plan does."""

    __slots__ = ("desc", "workspace", "workspace_size", "workspace_ptr", "planned")

    def __init__(self, be, aq, ak, av, ao, table, row_stride, sc, causal, max_seqlen_k, num_splits, lay):
        batch, q_len, heads_q, dim = aq.shape
        desc = SkDecodeDesc()
        check(F.sk_decode_desc_init(byref(desc), sizeof(desc)))
        desc.backend, desc.dtype = int(be), int(aq.dtype)
        desc.batch, desc.q_len = batch, q_len
        desc.heads_q, desc.heads_kv, desc.head_dim = heads_q, ak.shape[2], dim
        desc.scale = 0.0 if sc is None else sc
        desc.mask = int(Mask.CAUSAL if causal else Mask.NONE)
        desc.max_seqlen_k = int64(max_seqlen_k, "max_seqlen_k")
        desc.num_splits = int32(num_splits, "num_splits")
        page_fields(desc, ak, av, table, row_stride, batch)
        desc.q_strides = outer_strides(aq, "q")
        desc.o_strides = outer_strides(ao, "out")
        size = c_size_t()
        check(F.sk_decode_workspace_size(byref(desc), lay, byref(size)))
        self.desc, self.workspace_size = desc, size.value
        self.workspace, self.workspace_ptr = None, None
        self.planned = False
        if be != Backend.CPU and size.value > 0:
            import torch

            self.workspace = torch.empty(size.value, dtype=torch.uint8, device=aq.obj.device)
            self.workspace_ptr = self.workspace.data_ptr()

    def run(self, lay, args, stream) -> None:
        call = F.sk_decode_run if self.planned else F.sk_decode
        check(call(byref(self.desc), lay, *args, self.workspace_ptr, self.workspace_size, stream))
        self.planned = True


def decode(
    q, k_cache, v_cache, page_table, seq_lens, layout=None, *, block_k=None, causal=True,
    scale=None, max_seqlen_k=None, return_lse=False, out=None, backend=None, num_splits=0,
):
    """Decode attention of q [B, q_len, Hq, D] over the paged caches.

    page_table int32 [B, max_pages]; seq_lens int32 [B]; layout None (every
    key) or (row_offsets, col_indices) with block_k; causal: query t sees
    keys up to len_k - q_len + t (bottom-right). max_seqlen_k: a bound on
    seq_lens (from the host array when None; required with CUDA tensors,
    which are never read on the host). num_splits: 0 lets the library
    choose (CUDA), 1 .. 128 forces it. Returns out [B, q_len, Hq, D] or
    (out, lse) with lse float32 [B, Hq, q_len] (natural log; -inf and O = 0
    for a query with no admissible key).
    """
    aq, ak, av = _check_tensors(q, k_cache, v_cache)
    be, sc = _options(aq, scale, backend)
    if aq.kind == "torch" and needs_grad(q, k_cache, v_cache):
        raise ValueError("decode has no backward: call it under torch.no_grad() or on detached tensors")
    batch, q_len, heads_q, dim = aq.shape
    lens, lens_ptr = _int32_arg(be, aq, seq_lens, "seq_lens", 1)
    table, table_ptr = _int32_arg(be, aq, page_table, "page_table", 2)
    if lens.shape[0] != batch or table.shape[0] != batch:
        raise ValueError(f"q has {batch} sequences, seq_lens {lens.shape[0]} and page_table {table.shape[0]} rows")
    if max_seqlen_k is None:
        if be != Backend.CPU:
            raise ValueError("max_seqlen_k is required with CUDA tensors (no host sync)")
        max_seqlen_k = max(int(np.max(lens, initial=1)), 1)
    # As the key holds them (a hit skips the descriptor's own checks).
    max_seqlen_k, num_splits = int64(max_seqlen_k, "max_seqlen_k"), int32(num_splits, "num_splits")
    if out is None:
        out = _empty_like(q, aq)
    out, ao, _, _ = out_and_lse(q, aq, out, False)
    lse = _empty_lse(q, aq, (batch, heads_q, q_len)) if return_lse else None
    lse_ptr = None if lse is None else (lse.ctypes.data if aq.kind == "numpy" else lse.data_ptr())
    keep = None
    view = None
    if layout is not None:
        view, keep = _layout_view(be, aq, layout, block_k, batch, ak.shape[2], q_len, max_seqlen_k)
    lay = byref(view) if view is not None else None
    row_stride = table.strides[0] // table.itemsize if be == Backend.CPU else table.stride(0)
    # Everything the descriptor and the workspace size are made of (the
    # layout's geometry: its rows, block_k and nnz, which the split count
    # reads), so that a hit may skip both.
    geometry = None if view is None else (view.grid.heads, view.grid.block_cols, view.nnz)
    key = ("decode", aq.kind, int(be), int(aq.dtype), aq.shape, ak.shape, aq.strides, ak.strides, av.strides,
           ao.strides, table.shape, row_stride, sc, bool(causal), max_seqlen_k, num_splits, geometry)
    args = (lens_ptr, table_ptr, aq.ptr, ak.ptr, av.ptr, ao.ptr, lse_ptr)

    def make():
        return DecodePlan(be, aq, ak, av, ao, table, row_stride, sc, causal, max_seqlen_k, num_splits, lay)

    if be == Backend.CPU:
        cached_unowned(key, "cpu", make).run(lay, args, None)
    else:
        import torch

        with torch.cuda.device(q.device):
            plan = cached_unowned(key, aq.device, make)
            plan.run(lay, args, torch.cuda.current_stream(q.device).cuda_stream)
    del keep
    return (out, lse) if return_lse else out


__all__ = ["DecodePlan", "decode"]
