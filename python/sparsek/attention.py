"""sparsek.attention and AttentionPlan over numpy arrays and torch tensors.

- numpy arrays run on the CPU backend (float16, float32, and bfloat16 where
  the ml_dtypes package provides it);
- torch CUDA tensors run on the CUDA backend, on torch's current stream of
  the tensors' device, with workspace allocated by torch and the layout's
  arrays uploaded once per device (cached on the Layout);
- torch CPU tensors run on the CPU backend.

On torch tensors (without out=) sparsek.attention goes through the torch
op sparsek::attention_fwd (torch_ops.py, imported on that first call), which
is differentiable and traced by torch.compile; its gradients are
sparsek.attention_backward's (backward.py). Plans come from the plan cache
(plan_cache.py), one per layout, problem and stream.

Every argument is checked here before the library is called (types, ndim,
dtypes, devices, shapes, strides, `out`), with ValueError / TypeError; what
the library finds itself (a layout that does not fit, ...) raises
SparseKError. sparsek.bsr_gemm lives in gemm.py.
"""

from __future__ import annotations

import math
from ctypes import byref, c_size_t, sizeof
from typing import NamedTuple

import numpy as np

from ._arrays import Arr, adapt, check_family, check_output, is_torch, outer_strides
from ._cvalues import as_int, float32
from ._lib import Backend, DType, F, Mask, SkAttentionDesc, check
from .device_layout import DeviceLayout
from .layout import Layout
from .layout_arrays import BorrowedLayout, of_layout
from .plan_cache import cached_plan

# ---------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------


_BACKEND_NAMES = {
    "cpu": Backend.CPU,
    "cuda": Backend.CUDA,
    "cuda_sm80": Backend.CUDA_SM80,
    "cuda_sm90": Backend.CUDA_SM90,
}


def _parse_backend(backend, device: str) -> Backend:
    if backend is None:
        return Backend.CPU if device == "cpu" else Backend.CUDA
    if isinstance(backend, str):
        key = backend.lower()
        if key not in _BACKEND_NAMES:
            raise ValueError(f"backend = {backend!r}: use one of {sorted(_BACKEND_NAMES)}")
        b = _BACKEND_NAMES[key]
    else:
        value = as_int(backend, "backend")
        if value not in Backend.__members__.values():
            raise ValueError(f"backend = {value} is not a sparsek.Backend")
        b = Backend(value)
    if (b == Backend.CPU) != (device == "cpu"):
        raise ValueError(f"backend {b.name} cannot run on data on {device}")
    return b


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


class _Spec(NamedTuple):
    kind: str
    device: str
    dtype: DType
    dtype_name: str
    q_shape: tuple
    kv_shape: tuple


def _check_qkv(q, k, v):
    aq, ak, av = adapt(q, "q"), adapt(k, "k"), adapt(v, "v")
    check_family((aq, ak, av))
    for a, name in ((aq, "q"), (ak, "k"), (av, "v")):
        if len(a.shape) != 4:
            what = "[B, Sq, Hq, D]" if name == "q" else "[B, Sk, Hkv, D]"
            raise ValueError(f"{name} must have 4 dimensions {what}; got shape {a.shape}")
    if not (aq.dtype == ak.dtype == av.dtype):
        raise TypeError(f"q, k, v dtypes differ: {aq.dtype_name}, {ak.dtype_name}, {av.dtype_name}")
    if not (aq.device == ak.device == av.device):
        raise ValueError(f"q, k, v are on different devices: {aq.device}, {ak.device}, {av.device}")
    B, Sq, Hq, D = aq.shape
    if ak.shape != av.shape:
        raise ValueError(f"k {ak.shape} and v {av.shape} must have the same shape [B, Sk, Hkv, D]")
    if ak.shape[0] != B:
        raise ValueError(f"batch differs: q has {B}, k and v have {ak.shape[0]}")
    if ak.shape[3] != D:
        raise ValueError(f"head_dim differs: q has {D}, k and v have {ak.shape[3]}")
    Hkv = ak.shape[2]
    if min(aq.shape) < 1 or min(ak.shape) < 1:
        raise ValueError(f"every dimension must be >= 1: q {aq.shape}, k {ak.shape}")
    if Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv})")
    return aq, ak, av


def _check_like(x, like: Arr, like_name: str, name: str, output: bool) -> Arr:
    """x has like's kind, shape, dtype and device; an output must also be
    writable (check_output)."""
    a = adapt(x, name)
    if a.kind != like.kind:
        raise TypeError(f"{name} is a {a.kind} array but {like_name} is a {like.kind} array")
    if a.shape != like.shape:
        raise ValueError(f"{name} has shape {a.shape}; it must be {like_name}'s shape {like.shape}")
    if a.dtype != like.dtype:
        raise TypeError(f"{name}.dtype = {a.dtype_name} must be {like_name}'s dtype {like.dtype_name}")
    if a.device != like.device:
        raise ValueError(f"{name} is on {a.device} but {like_name} is on {like.device}")
    if output:
        check_output(a, name)
    return a


def _check_out(out, aq: Arr) -> Arr:
    """`out` must match q and be writable."""
    return _check_like(out, aq, "q", "out", True)


def _options(aq: Arr, scale, backend):
    """The backend and scale checks a plan makes before any C call:
    (backend, scale as a float32 value or None for 1/sqrt(D))."""
    be = _parse_backend(backend, aq.device)
    if be != Backend.CPU and aq.dtype == DType.F32:
        raise TypeError("float32 inputs are for the CPU backend only; use float16 or bfloat16 on CUDA")
    if aq.kind == "numpy" and be != Backend.CPU:
        raise ValueError("numpy arrays run on the CPU backend only")
    if scale is not None:
        scale = float32(scale, "scale", nonzero=True)
        if scale == 0.0 or not math.isfinite(scale):
            raise ValueError(f"scale = {scale} must be finite and non-zero (None means 1/sqrt(D))")
    return be, scale


def _check_layout(layout) -> None:
    if not isinstance(layout, (Layout, DeviceLayout, BorrowedLayout)):
        raise TypeError(f"layout must be a sparsek.Layout (or DeviceLayout), got {type(layout).__name__}")


def write_strides(struct, fields, strides, last):
    """Set struct's stride fields (each write is range-checked, which costs)
    unless they hold these values already (last: what was written last).
    Returns strides."""
    if strides != last:
        for field, value in zip(fields, strides):
            setattr(struct, field, value)
    return strides


def _attention_desc(aq: Arr, ak: Arr, layout, causal, scale, backend):
    """The checks a plan makes before any C call, and the forward's
    descriptor (strides left packed: run() sets them). Returns (backend,
    desc); shared with the backward's plan."""
    _check_layout(layout)
    be, scale = _options(aq, scale, backend)
    B, Sq, Hq, D = aq.shape
    _, Sk, Hkv, _ = ak.shape
    desc = SkAttentionDesc()
    check(F.sk_attention_desc_init(byref(desc), sizeof(desc)))
    desc.backend = int(be)
    desc.dtype = int(aq.dtype)
    desc.batch, desc.seq_q, desc.seq_k = B, Sq, Sk
    desc.heads_q, desc.heads_kv, desc.head_dim = Hq, Hkv, D
    desc.scale = 0.0 if scale is None else scale
    desc.mask = int(Mask.CAUSAL if causal else Mask.NONE)
    return be, desc


class AttentionPlan:
    """A planned attention: descriptor, layout on the data's device, workspace
    and the plan (sk_attention_plan), made once; run() then only calls
    sk_attention_run. Inputs to run() must have the planned shapes, dtype and
    device (strides may differ; the last dimension is contiguous). The plan
    is enqueued on torch's current stream when the plan is made: run on that
    stream too, or synchronise first."""

    def __init__(self, q, k, v, layout, *, causal=False, scale=None, backend=None):
        aq, ak, _ = _check_qkv(q, k, v)
        self.backend, self.desc = _attention_desc(aq, ak, layout, causal, scale, backend)
        self.layout = layout
        self.causal = bool(causal)
        self.spec = _Spec(aq.kind, aq.device, aq.dtype, aq.dtype_name, aq.shape, ak.shape)
        self._strides = None  # what run() wrote into desc last
        desc = self.desc

        self._torch_device = None
        if self.backend == Backend.CPU:
            self.bsr = layout.view()
            self.workspace, self.workspace_size, ws_ptr = None, 0, None
            check(F.sk_attention_plan(byref(desc), byref(self.bsr), None, 0, None))
        else:
            import torch

            self._torch_device = q.device
            with torch.cuda.device(q.device):
                self.bsr = layout.device_view(q.device)
                size = c_size_t()
                check(F.sk_attention_workspace_size(byref(desc), byref(self.bsr), byref(size)))
                self.workspace_size = size.value
                self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
                ws_ptr = self.workspace.data_ptr()
                stream = torch.cuda.current_stream(q.device).cuda_stream
                check(F.sk_attention_plan(byref(desc), byref(self.bsr), ws_ptr, self.workspace_size, stream))

    def replan(self) -> None:
        """Enqueue sk_attention_plan again (after the layout's device arrays
        changed content, or to time planning alone)."""
        if self.backend == Backend.CPU:
            check(F.sk_attention_plan(byref(self.desc), byref(self.bsr), None, 0, None))
            return
        import torch

        with torch.cuda.device(self._torch_device):
            stream = torch.cuda.current_stream(self._torch_device).cuda_stream
            check(
                F.sk_attention_plan(
                    byref(self.desc), byref(self.bsr), self.workspace.data_ptr(), self.workspace_size, stream
                )
            )

    def run(self, q, k, v, *, out=None, return_lse=False):
        """Enqueue sk_attention_run. Returns out, or (out, lse) with lse
        float32 [B, Hq, Sq] when return_lse."""
        aq, ak, av = _check_qkv(q, k, v)
        sp = self.spec
        if (aq.kind, aq.device, aq.dtype, aq.shape, ak.shape) != (sp.kind, sp.device, sp.dtype, sp.q_shape, sp.kv_shape):
            raise ValueError(
                f"run() got q {aq.shape} / k {ak.shape} {aq.dtype_name} on {aq.device}; the plan was made "
                f"for q {sp.q_shape} / k {sp.kv_shape} {sp.dtype_name} on {sp.device}"
            )
        B, Sq, Hq, D = aq.shape
        if out is None:
            out = _empty_like(q, aq)
            ao = adapt(out, "out")  # ours: nothing to check
        else:
            ao = _check_out(out, aq)
        desc = self.desc
        strides = tuple(outer_strides(a, name) for a, name in ((aq, "q"), (ak, "k"), (av, "v"), (ao, "out")))
        self._strides = write_strides(desc, ("q_strides", "k_strides", "v_strides", "o_strides"), strides, self._strides)
        lse = None
        lse_ptr = None
        if return_lse:
            lse = _empty_lse(q, aq, (B, Hq, Sq))
            lse_ptr = lse.ctypes.data if aq.kind == "numpy" else lse.data_ptr()
        if self.backend == Backend.CPU:
            check(F.sk_attention_run(byref(desc), byref(self.bsr), aq.ptr, ak.ptr, av.ptr, ao.ptr, lse_ptr, None, 0, None))
        else:
            import torch

            with torch.cuda.device(self._torch_device):
                stream = torch.cuda.current_stream(self._torch_device).cuda_stream
                check(
                    F.sk_attention_run(
                        byref(desc),
                        byref(self.bsr),
                        aq.ptr,
                        ak.ptr,
                        av.ptr,
                        ao.ptr,
                        lse_ptr,
                        self.workspace.data_ptr(),
                        self.workspace_size,
                        stream,
                    )
                )
        return (out, lse) if return_lse else out


def _empty_like(q, aq: Arr):
    if aq.kind == "numpy":
        return np.empty(aq.shape, dtype=q.dtype)
    import torch

    return torch.empty(aq.shape, dtype=q.dtype, device=q.device)


def _empty_lse(q, aq: Arr, shape):
    if aq.kind == "numpy":
        return np.empty(shape, dtype=np.float32)
    import torch

    return torch.empty(shape, dtype=torch.float32, device=q.device)


def plan_attention(q, k, v, layout, *, causal=False, scale=None, backend=None) -> AttentionPlan:
    """Plan once (descriptor, device layout, workspace, sk_attention_plan);
    call .run(q, k, v, out=...) as often as needed."""
    return AttentionPlan(q, k, v, layout, causal=causal, scale=scale, backend=backend)


def _problem_key(aq: Arr, ak: Arr, av: Arr, causal, scale, be) -> tuple:
    """What a plan depends on besides the layout and the stream."""
    return (aq.kind, aq.device, aq.dtype, aq.shape, ak.shape, aq.strides, ak.strides, av.strides,
            bool(causal), scale, int(be))


def cached_attention_plan(q, k, v, arrays, *, causal=False, scale=None, backend=None, out_strides=None):
    """The AttentionPlan for these inputs over `arrays`
    (layout_arrays.LayoutArrays), from the plan cache (plan_cache.py).
    out_strides: those of a caller's `out` (None: allocated packed)."""
    aq, ak, av = _check_qkv(q, k, v)
    be, sc = _options(aq, scale, backend)
    key = ("fwd", out_strides) + _problem_key(aq, ak, av, causal, sc, be)
    return cached_plan(
        arrays, key, aq.device,
        lambda: AttentionPlan(q, k, v, arrays.borrow(), causal=causal, scale=scale, backend=backend),
    )


def needs_grad(*tensors) -> bool:
    """Whether autograd would record an op on these torch tensors."""
    import torch

    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def attention(q, k, v, layout, causal=False, scale=None, return_lse=False, out=None, backend=None):
    """Block-sparse attention forward.

    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (Hq a multiple of Hkv), all
    numpy arrays (CPU backend) or all torch tensors (CUDA backend for CUDA
    tensors, on the current stream; CPU backend for CPU tensors).
    layout: a sparsek.Layout over (Sq, Sk) with batch 1 or B and heads 1,
    Hkv or Hq. causal: bottom-right aligned token mask inside selected
    blocks. scale: softmax scale, None for 1/sqrt(D). out: optional output
    array (q's shape and dtype; last dimension contiguous). backend: None
    (from the data), or "cpu", "cuda", "cuda_sm80", "cuda_sm90".

    Returns out, or (out, lse) with lse float32 [B, Hq, Sq] (natural log;
    -inf for a row with no admissible key, whose output is 0).

    torch tensors: differentiable with respect to q, k and v (the op
    sparsek::attention_fwd, whose backward is sparsek::attention_bwd; see
    torch_ops.py); torch.compile traces it. lse carries no gradient. With
    out= the call is not differentiable: it is refused when q, k or v
    requires grad. Plans are cached per layout (plan_cache.py).
    """
    if out is None and is_torch(q):
        from .torch_ops import attention as op_attention

        o, lse = op_attention(q, k, v, layout, causal=causal, scale=scale, backend=backend)
        return (o, lse) if return_lse else o
    aq = _check_qkv(q, k, v)[0]
    out_strides = None
    if out is not None:
        out_strides = _check_out(out, aq).strides
        if aq.kind == "torch" and needs_grad(q, k, v):
            raise ValueError("out= makes the call non-differentiable, but q, k or v requires grad: leave out=None")
    plan = cached_attention_plan(
        q, k, v, of_layout(layout, aq.device), causal=causal, scale=scale, backend=backend, out_strides=out_strides
    )
    return plan.run(q, k, v, out=out, return_lse=return_lse)


__all__ = ["attention", "plan_attention", "AttentionPlan", "cached_attention_plan"]
