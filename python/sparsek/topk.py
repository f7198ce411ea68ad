"""Dynamic top-k block selection (sparsek.h, "Dynamic top-k block selection").

    pooled_q, pooled_k = sparsek.block_pool(q, k, block_q=128, block_k=128)
    layout = sparsek.select_topk(pooled_q, pooled_k, 16, sink_blocks=2,
                                 local_blocks=8, causal=True, seq_q=S, seq_k=S)
    layout = sparsek.layout_from_scores(scores, 16, causal=True)
    layout = sparsek.pool_select_topk(q, k, 16, sink_blocks=2, local_blocks=8,
                                      causal=True)
    out, layout = sparsek.attention_topk(q, k, v, 16, causal=True)

- numpy arrays (and torch CPU tensors) run on the CPU backend and give a
  host sparsek.Layout with the real block count.
- torch CUDA tensors run on the CUDA backend, on torch's current stream of
  their device: the workspace, the pooled arrays and the layout buffers are
  allocated with torch on that device, and nothing waits for the host. The
  result is a sparsek.DeviceLayout over the device buffers (allocated at the
  capacity, sk_topk_layout_capacity); its real count row_offsets[-1] is
  copied back only when asked (.nnz, .density, .to_host(), conversions).
  It can be passed to sparsek.attention on the same device as it is.

Arguments are checked here first (TypeError / ValueError, as
sparsek.attention does); what the library finds (k < 0, a head_dim the CUDA
backend cannot take, ...) raises SparseKError.
"""

from __future__ import annotations

import math
from ctypes import byref, c_int32, c_size_t, sizeof

import numpy as np

from ._lib import Backend, DType, F, Mask, SkAttentionDesc, SkBsr, SkGrid, SkTopkDesc, check
from ._arrays import adapt, check_family, check_packed, outer_strides, packed
from ._cvalues import float32, int32, int64
from .attention import _check_out, _check_qkv, _empty_like, _empty_lse, _parse_backend, needs_grad
from .device_layout import DeviceLayout
from .layout import Grid, Layout

__all__ = ["block_pool", "select_topk", "pool_select_topk", "layout_from_scores", "attention_topk", "topk_capacity"]


# ---------------------------------------------------------------------------
# Checks shared by the entry points
# ---------------------------------------------------------------------------


def _block(value, name: str) -> int:
    b = int32(value, name)
    if b not in (64, 128):
        raise ValueError(f"{name} = {b} must be 64 or 128")
    return b


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _scale(scale) -> float:
    """0.0 (the library's 1/sqrt(D)) for None; else a finite non-zero float."""
    if scale is None:
        return 0.0
    s = float32(scale, "scale", nonzero=True)
    if s == 0.0 or not math.isfinite(s):
        raise ValueError(f"scale = {s} must be finite and non-zero (None means 1/sqrt(D))")
    return s


def _options(k, sink_blocks, local_blocks, k_name="k"):
    """int32 values (TypeError / ValueError here); their ranges are the
    library's to check (SparseKError)."""
    return int32(k, k_name), int32(sink_blocks, "sink_blocks"), int32(local_blocks, "local_blocks")


def _check_qk(q, k):
    aq, ak = adapt(q, "q"), adapt(k, "k")
    check_family((aq, ak))
    for a, name in ((aq, "q"), (ak, "k")):
        if len(a.shape) != 4:
            what = "[B, Sq, Hq, D]" if name == "q" else "[B, Sk, Hkv, D]"
            raise ValueError(f"{name} must have 4 dimensions {what}; got shape {a.shape}")
    if aq.dtype != ak.dtype:
        raise TypeError(f"q and k dtypes differ: {aq.dtype_name}, {ak.dtype_name}")
    if aq.device != ak.device:
        raise ValueError(f"q and k are on different devices: {aq.device}, {ak.device}")
    if min(aq.shape) < 1 or min(ak.shape) < 1:
        raise ValueError(f"every dimension must be >= 1: q {aq.shape}, k {ak.shape}")
    if ak.shape[0] != aq.shape[0]:
        raise ValueError(f"batch differs: q has {aq.shape[0]}, k has {ak.shape[0]}")
    if ak.shape[3] != aq.shape[3]:
        raise ValueError(f"head_dim differs: q has {aq.shape[3]}, k has {ak.shape[3]}")
    if aq.shape[2] % ak.shape[2]:
        raise ValueError(f"q heads ({aq.shape[2]}) must be a multiple of k heads ({ak.shape[2]})")
    return aq, ak


def _backend_for(a, backend) -> Backend:
    be = _parse_backend(backend, a.device)
    if a.kind == "numpy" and be != Backend.CPU:
        raise ValueError("numpy arrays run on the CPU backend only")
    return be


def _qk_backend(aq, backend) -> Backend:
    """The backend for q and k tokens: float16 / bfloat16, or float32 on the CPU."""
    be = _backend_for(aq, backend)
    if be != Backend.CPU and aq.dtype == DType.F32:
        raise TypeError("float32 inputs are for the CPU backend only; use float16 or bfloat16 on CUDA")
    return be


def _desc(be, dtype, B, Sq, Sk, Hq, Hkv, D, block_q, block_k, scale, k, sinks, local, causal, per_kv_head,
          q_strides=None, k_strides=None) -> SkTopkDesc:
    d = SkTopkDesc()
    check(F.sk_topk_desc_init(byref(d), sizeof(d)))
    d.backend = int(be)
    d.dtype = int(dtype)
    d.batch, d.seq_q, d.seq_k = B, Sq, Sk
    d.heads_q, d.heads_kv, d.head_dim = Hq, Hkv, D
    if q_strides is not None:
        d.q_strides = q_strides
    if k_strides is not None:
        d.k_strides = k_strides
    d.block_q, d.block_k = block_q, block_k
    d.scale = scale
    d.k, d.sink_blocks, d.local_blocks = k, sinks, local
    d.mask = int(Mask.CAUSAL if causal else Mask.NONE)
    d.per_kv_head = 1 if per_kv_head else 0
    return d


def _capacity(desc: SkTopkDesc):
    """(Grid, capacity) from sk_topk_layout_capacity (checks the descriptor)."""
    g = SkGrid()
    cap = c_int32()
    check(F.sk_topk_layout_capacity(byref(desc), byref(g), byref(cap)))
    return Grid(g.rows, g.cols, g.block_rows, g.block_cols, g.batch, g.heads), cap.value


class _Out:
    """Layout buffers at the capacity, on the host (numpy) or a torch device."""

    def __init__(self, grid: Grid, capacity: int, torch_device=None):
        n = grid.slices * grid.row_blocks + 1
        self.grid, self.capacity, self.torch_device = grid, capacity, torch_device
        if torch_device is None:
            self.ro = np.empty(n, np.int32)
            self.ci = np.empty(max(capacity, 1), np.int32)
            ro_ptr, ci_ptr = self.ro.ctypes.data, self.ci.ctypes.data
        else:
            import torch

            self.ro = torch.empty(n, dtype=torch.int32, device=torch_device)
            self.ci = torch.empty(max(capacity, 1), dtype=torch.int32, device=torch_device)
            ro_ptr, ci_ptr = self.ro.data_ptr(), self.ci.data_ptr()
        import ctypes

        self.bsr = SkBsr()
        self.bsr.grid = grid.to_c()
        self.bsr.nnz = capacity
        self.bsr.row_offsets = ctypes.cast(ctypes.c_void_p(ro_ptr), ctypes.POINTER(c_int32))
        self.bsr.col_indices = ctypes.cast(ctypes.c_void_p(ci_ptr), ctypes.POINTER(c_int32))

    def result(self, stream=None):
        """The Layout (host: validated copy with the real count) or
        DeviceLayout (device buffers, nothing copied)."""
        if self.torch_device is not None:
            return DeviceLayout(self.grid, self.capacity, self.ro, self.ci, stream)
        nnz = int(self.ro[-1])
        if not 0 <= nnz <= self.capacity:  # the library guarantees it; never trust blindly
            raise RuntimeError(f"row_offsets[-1] = {nnz} is outside [0, capacity = {self.capacity}]")
        g = self.grid
        return Layout.from_bsr(
            self.ro, self.ci[:nnz], g.rows, g.cols, block=(g.block_rows, g.block_cols), batch=g.batch, heads=g.heads
        )


def _torch_stream(device):
    import torch

    return torch.cuda.current_stream(device)


def _select(grid, cap, device, size_call, call):
    """A selection into fresh layout buffers: on the host (device None) with
    no workspace, or on a torch CUDA device with a workspace of
    size_call's bytes and torch's current stream. call(out, workspace,
    size, stream) runs the library call."""
    if device is None:
        out = _Out(grid, cap)
        check(call(out, None, 0, None))
        return out.result()
    import torch

    with torch.cuda.device(device):
        size = c_size_t()
        check(size_call(byref(size)))
        out = _Out(grid, cap, device)
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=device)
        stream = _torch_stream(device)
        check(call(out, ws.data_ptr(), size.value, stream.cuda_stream))
    return out.result(stream)


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def block_pool(q, k, block_q=128, block_k=128, *, backend=None):
    """Block means of Q and K (sk_block_pool).

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D] (any strides, last dimension
    contiguous), float16 / bfloat16 (float32 on the CPU backend).
    Returns (pooled_q float32 [B, Hq, ceil(Sq / block_q), D],
    pooled_k float32 [B, Hkv, ceil(Sk / block_k), D]): each the mean of the
    block's valid tokens (a tail block averages fewer). numpy in, numpy out;
    torch in, torch out on the same device.
    """
    aq, ak = _check_qk(q, k)
    be = _qk_backend(aq, backend)
    bq, bk = _block(block_q, "block_q"), _block(block_k, "block_k")
    B, Sq, Hq, D = aq.shape
    _, Sk, Hkv, _ = ak.shape
    desc = _desc(be, aq.dtype, B, Sq, Sk, Hq, Hkv, D, bq, bk, 0.0, 0, 0, 0, False, False,
                 outer_strides(aq, "q"), outer_strides(ak, "k"))
    pq_shape = (B, Hq, _ceil_div(Sq, bq), D)
    pk_shape = (B, Hkv, _ceil_div(Sk, bk), D)
    if aq.kind == "numpy":
        pq, pk = np.empty(pq_shape, np.float32), np.empty(pk_shape, np.float32)
        check(F.sk_block_pool(byref(desc), aq.ptr, ak.ptr, pq.ctypes.data, pk.ctypes.data, None))
        return pq, pk
    import torch

    pq = torch.empty(pq_shape, dtype=torch.float32, device=q.device)
    pk = torch.empty(pk_shape, dtype=torch.float32, device=q.device)
    if be == Backend.CPU:
        check(F.sk_block_pool(byref(desc), aq.ptr, ak.ptr, pq.data_ptr(), pk.data_ptr(), None))
        return pq, pk
    with torch.cuda.device(q.device):
        stream = _torch_stream(q.device).cuda_stream
        check(F.sk_block_pool(byref(desc), aq.ptr, ak.ptr, pq.data_ptr(), pk.data_ptr(), stream))
    return pq, pk


def _pooled_pair(pooled_q, pooled_k):
    apq, apk = adapt(pooled_q, "pooled_q"), adapt(pooled_k, "pooled_k")
    check_family((apq, apk))
    for a, name, what in ((apq, "pooled_q", "[B, Hq, row_blocks, D]"), (apk, "pooled_k", "[B, Hkv, col_blocks, D]")):
        if len(a.shape) != 4:
            raise ValueError(f"{name} must have 4 dimensions {what}; got shape {a.shape}")
        if a.dtype != DType.F32:
            raise TypeError(f"{name}.dtype = {a.dtype_name}; pooled blocks are float32 (as block_pool returns them)")
        if min(a.shape) < 1:
            raise ValueError(f"every dimension of {name} must be >= 1, got shape {a.shape}")
        check_packed(a, name, what)
    if apq.device != apk.device:
        raise ValueError(f"pooled_q and pooled_k are on different devices: {apq.device}, {apk.device}")
    if apq.shape[0] != apk.shape[0]:
        raise ValueError(f"batch differs: pooled_q has {apq.shape[0]}, pooled_k has {apk.shape[0]}")
    if apq.shape[3] != apk.shape[3]:
        raise ValueError(f"head_dim differs: pooled_q has {apq.shape[3]}, pooled_k has {apk.shape[3]}")
    if apq.shape[1] % apk.shape[1]:
        raise ValueError(f"pooled_q heads ({apq.shape[1]}) must be a multiple of pooled_k heads ({apk.shape[1]})")
    return apq, apk


def _seq(seq, blocks: int, block: int, name: str, what: str) -> int:
    if seq is None:
        return blocks * block
    s = int64(seq, name)
    if s < 1 or _ceil_div(s, block) != blocks:
        raise ValueError(
            f"{name} = {s} does not fit {what}'s {blocks} blocks of {block} tokens "
            f"(needs ceil({name} / {block}) = {blocks})"
        )
    return s


def select_topk(
    pooled_q,
    pooled_k,
    k,
    sink_blocks=0,
    local_blocks=0,
    causal=False,
    per_kv_head=False,
    scale=None,
    seq_q=None,
    seq_k=None,
    *,
    block_q=128,
    block_k=128,
    backend=None,
):
    """Score pooled blocks and pick the top k per layout row (sk_select_topk).

    pooled_q float32 [B, Hq, row_blocks, D], pooled_k float32
    [B, Hkv, col_blocks, D], contiguous (as block_pool returns them).
    score(b, h, i, j) = scale * dot(pooled_q[b, h, i], pooled_k[b, h // group, j]),
    scale None = 1/sqrt(D); per_kv_head sums the scores over each KV head's
    query heads and gives one layout slice per KV head (heads = Hkv), else
    one per query head (heads = Hq). Per row: sinks 0 .. sink_blocks-1 and
    the local_blocks blocks ending at the diagonal are forced, then the k
    best remaining candidates (ties to the lower index; NaN / -inf never
    picked); causal drops blocks with no causal pair. seq_q / seq_k: the
    token counts (default row_blocks * block_q, col_blocks * block_k; they
    set the diagonal and the causal candidates). Returns a Layout (CPU) or
    a DeviceLayout (CUDA tensors).
    """
    apq, apk = _pooled_pair(pooled_q, pooled_k)
    be = _backend_for(apq, backend)
    bq, bk = _block(block_q, "block_q"), _block(block_k, "block_k")
    kk, sinks, local = _options(k, sink_blocks, local_blocks)
    B, Hq, rb, D = apq.shape
    _, Hkv, cb, _ = apk.shape
    Sq = _seq(seq_q, rb, bq, "seq_q", "pooled_q")
    Sk = _seq(seq_k, cb, bk, "seq_k", "pooled_k")
    # Q and K's dtype plays no part in the selection; F16 satisfies the
    # CUDA backend's dtype rule.
    dtype = DType.F32 if be == Backend.CPU else DType.F16
    desc = _desc(be, dtype, B, Sq, Sk, Hq, Hkv, D, bq, bk, _scale(scale), kk, sinks, local, causal, per_kv_head)
    grid, cap = _capacity(desc)
    return _select(
        grid, cap, None if be == Backend.CPU else pooled_q.device,
        lambda size: F.sk_topk_workspace_size(byref(desc), size),
        lambda out, ws, n, st: F.sk_select_topk(byref(desc), apq.ptr, apk.ptr, byref(out.bsr), ws, n, st),
    )


def pool_select_topk(
    q,
    k,
    k_blocks,
    *,
    sink_blocks=0,
    local_blocks=0,
    causal=False,
    per_kv_head=False,
    scale=None,
    block_q=128,
    block_k=128,
    backend=None,
):
    """Pool and select in one call (sk_pool_select_topk): the layout that
    block_pool then select_topk give, bit for bit, without returning the
    pooled arrays. It is the selection attention_topk runs; use it to select
    once and run sparsek.attention on the layout.

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D] (any strides, last dimension
    contiguous), float16 / bfloat16 (float32 on the CPU backend); the
    selection options as select_topk's. Returns a Layout (CPU) or a
    DeviceLayout (CUDA tensors).
    """
    aq, ak = _check_qk(q, k)
    be = _qk_backend(aq, backend)
    bq, bk = _block(block_q, "block_q"), _block(block_k, "block_k")
    kk, sinks, local = _options(k_blocks, sink_blocks, local_blocks, "k_blocks")
    B, Sq, Hq, D = aq.shape
    _, Sk, Hkv, _ = ak.shape
    desc = _desc(be, aq.dtype, B, Sq, Sk, Hq, Hkv, D, bq, bk, _scale(scale), kk, sinks, local, causal,
                 per_kv_head, outer_strides(aq, "q"), outer_strides(ak, "k"))
    grid, cap = _capacity(desc)
    return _select(
        grid, cap, None if be == Backend.CPU else q.device,
        lambda size: F.sk_pool_select_topk_workspace_size(byref(desc), size),
        lambda out, ws, n, st: F.sk_pool_select_topk(byref(desc), aq.ptr, ak.ptr, byref(out.bsr), ws, n, st),
    )


def layout_from_scores(
    scores,
    k,
    sink_blocks=0,
    local_blocks=0,
    causal=False,
    seq_q=None,
    seq_k=None,
    *,
    block_q=128,
    block_k=128,
    batch=None,
    heads=None,
    backend=None,
):
    """The same selection from caller scores (sk_layout_from_scores).

    scores float32 [batch, heads, row_blocks, col_blocks], [slices,
    row_blocks, col_blocks] (batch 1 and heads = slices unless given) or
    [row_blocks, col_blocks]; numpy (any float dtype, converted to float32
    as Layout.topk does) or a torch float32 tensor (CUDA: CUDA backend).
    Same rules as Layout.topk / select_topk. Returns a Layout or a
    DeviceLayout.
    """
    if isinstance(scores, np.ndarray) or not hasattr(scores, "data_ptr"):
        arr = np.asarray(scores)
        if arr.dtype.kind != "f":
            raise TypeError(f"scores.dtype = {arr.dtype} must be a floating type")
        scores = packed(arr, np.float32)
    a = adapt(scores, "scores")
    if a.dtype != DType.F32:
        raise TypeError(f"scores.dtype = {a.dtype_name} must be float32")
    if a.kind == "torch" and not scores.is_contiguous():
        scores = scores.contiguous()
        a = adapt(scores, "scores")
    shape = a.shape
    if len(shape) == 4:
        B, H = shape[0], shape[1]
        if (batch is not None and int32(batch, "batch") != B) or (heads is not None and int32(heads, "heads") != H):
            raise ValueError(f"batch / heads ({batch}, {heads}) disagree with scores' shape {shape}")
    elif len(shape) == 3:
        ns = shape[0]
        if batch is None and heads is None:
            B, H = 1, ns
        elif heads is None:
            B = int32(batch, "batch")
            H = ns // B if B > 0 and ns % B == 0 else 0
        elif batch is None:
            H = int32(heads, "heads")
            B = ns // H if H > 0 and ns % H == 0 else 0
        else:
            B, H = int32(batch, "batch"), int32(heads, "heads")
        if B < 1 or H < 1 or B * H != ns:
            raise ValueError(f"scores has {ns} slices; batch x heads = {batch} x {heads} does not match")
    elif len(shape) == 2:
        B, H = int32(batch if batch is not None else 1, "batch"), int32(heads if heads is not None else 1, "heads")
        if B * H != 1:
            raise ValueError(f"2-D scores are one slice; got batch = {B}, heads = {H}")
    else:
        raise ValueError(f"scores must have 2 to 4 dimensions, got shape {shape}")
    if min(shape) < 1:
        raise ValueError(f"every dimension of scores must be >= 1, got shape {shape}")
    be = _backend_for(a, backend)
    bq, bk = _block(block_q, "block_q"), _block(block_k, "block_k")
    kk, sinks, local = _options(k, sink_blocks, local_blocks)
    rb, cb = shape[-2], shape[-1]
    Sq = _seq(seq_q, rb, bq, "seq_q", "scores")
    Sk = _seq(seq_k, cb, bk, "seq_k", "scores")
    dtype = DType.F32 if be == Backend.CPU else DType.F16
    # One layout slice per score slice: heads_q = heads_kv = H. head_dim is
    # not used by this call (8 satisfies the CUDA backend's rule).
    desc = _desc(be, dtype, B, Sq, Sk, H, H, 8, bq, bk, 0.0, kk, sinks, local, causal, False)
    grid, cap = _capacity(desc)
    return _select(
        grid, cap, None if be == Backend.CPU else scores.device,
        lambda size: F.sk_topk_workspace_size(byref(desc), size),
        lambda out, ws, n, st: F.sk_layout_from_scores(byref(desc), a.ptr, byref(out.bsr), ws, n, st),
    )


def topk_capacity(batch, seq_q, seq_k, heads_q, heads_kv, k, sink_blocks=0, local_blocks=0, causal=False,
                  per_kv_head=False, *, block_q=128, block_k=128):
    """(Grid, capacity) of the layout a selection of these sizes writes
    (sk_topk_layout_capacity): the most blocks it can select."""
    kk, sinks, local = _options(k, sink_blocks, local_blocks)
    desc = _desc(Backend.CPU, DType.F32, int64(batch, "batch"), int64(seq_q, "seq_q"), int64(seq_k, "seq_k"),
                 int64(heads_q, "heads_q"), int64(heads_kv, "heads_kv"), 8, int32(block_q, "block_q"),
                 int32(block_k, "block_k"), 0.0, kk, sinks, local, causal, per_kv_head)
    return _capacity(desc)


def attention_topk(
    q,
    k,
    v,
    k_blocks,
    *,
    sink_blocks=0,
    local_blocks=0,
    causal=False,
    per_kv_head=False,
    scale=None,
    block_q=128,
    block_k=128,
    return_layout=True,
    return_lse=False,
    out=None,
    backend=None,
):
    """Selection followed by the attention forward (sk_attention_topk).

    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] as for sparsek.attention.
    The layout is selected from q and k themselves: block means, scores
    scale * pooled_q . pooled_k, k_blocks best blocks per row plus the
    forced sinks / local blocks (see select_topk); causal is both the
    selection rule and the token mask; scale (None = 1/sqrt(D)) is both the
    score and the softmax scale.

    Returns (out, layout) or (out, layout, lse) with return_lse; without
    return_layout, out or (out, lse). layout is a Layout (CPU) or a
    DeviceLayout (CUDA: nothing copied back). lse float32 [B, Hq, Sq].

    Gradients (torch tensors): out is differentiable with respect to q, k
    and v through the attention alone. The selection has no gradient: it is
    a discrete choice, so the gradient is that of sparsek.attention on the
    selected layout held fixed, and nothing flows through the block scores
    into q or k. When q, k or v requires grad, the call runs the selection
    (pool_select_topk, the same layout bit for bit) and then the
    differentiable op (sparsek::attention_fwd); out= is refused then. lse
    carries no gradient.
    """
    aq, ak, av = _check_qkv(q, k, v)
    be = _qk_backend(aq, backend)
    bq, bk = _block(block_q, "block_q"), _block(block_k, "block_k")
    kk, sinks, local = _options(k_blocks, sink_blocks, local_blocks, "k_blocks")
    sc = _scale(scale)
    B, Sq, Hq, D = aq.shape
    _, Sk, Hkv, _ = ak.shape
    if aq.kind == "torch" and needs_grad(q, k, v):
        if out is not None:
            raise ValueError("out= makes the call non-differentiable, but q, k or v requires grad: leave out=None")
        from .torch_ops import attention as op_attention

        layout = pool_select_topk(q.detach(), k.detach(), k_blocks, sink_blocks=sink_blocks, local_blocks=local_blocks,
                                  causal=causal, per_kv_head=per_kv_head, scale=scale, block_q=block_q,
                                  block_k=block_k, backend=backend)
        out, lse = op_attention(q, k, v, layout, causal=causal, scale=scale, backend=backend)
        lse = lse if return_lse else None
        return _topk_result(out, layout, lse, return_layout)
    if out is None:
        out = _empty_like(q, aq)
    ao = _check_out(out, aq)

    qs, ks, vs, os_ = (outer_strides(a, n) for a, n in ((aq, "q"), (ak, "k"), (av, "v"), (ao, "out")))
    attn = SkAttentionDesc()
    check(F.sk_attention_desc_init(byref(attn), sizeof(attn)))
    attn.backend = int(be)
    attn.dtype = int(aq.dtype)
    attn.batch, attn.seq_q, attn.seq_k = B, Sq, Sk
    attn.heads_q, attn.heads_kv, attn.head_dim = Hq, Hkv, D
    attn.scale = sc
    attn.mask = int(Mask.CAUSAL if causal else Mask.NONE)
    attn.q_strides, attn.k_strides, attn.v_strides, attn.o_strides = qs, ks, vs, os_
    topk = _desc(be, aq.dtype, B, Sq, Sk, Hq, Hkv, D, bq, bk, sc, kk, sinks, local, causal, per_kv_head, qs, ks)
    grid, cap = _capacity(topk)

    lse = _empty_lse(q, aq, (B, Hq, Sq)) if return_lse else None
    lse_ptr = None if lse is None else (lse.ctypes.data if aq.kind == "numpy" else lse.data_ptr())
    if be == Backend.CPU:
        res = _Out(grid, cap)
        check(F.sk_attention_topk(byref(attn), byref(topk), aq.ptr, ak.ptr, av.ptr, ao.ptr, lse_ptr, byref(res.bsr), None, 0, None))
        layout = res.result()
    else:
        import torch

        dev = q.device
        with torch.cuda.device(dev):
            size = c_size_t()
            check(F.sk_attention_topk_workspace_size(byref(attn), byref(topk), byref(size)))
            res = _Out(grid, cap, dev)
            ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=dev)
            stream = _torch_stream(dev)
            check(
                F.sk_attention_topk(
                    byref(attn), byref(topk), aq.ptr, ak.ptr, av.ptr, ao.ptr, lse_ptr, byref(res.bsr),
                    ws.data_ptr(), size.value, stream.cuda_stream,
                )
            )
        layout = res.result(stream)
    return _topk_result(out, layout, lse, return_layout)


def _topk_result(out, layout, lse, return_layout):
    """attention_topk's return value (lse None: not asked for)."""
    if return_layout:
        return (out, layout) if lse is None else (out, layout, lse)
    return out if lse is None else (out, lse)
