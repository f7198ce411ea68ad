"""sparsek.attention, AttentionPlan and bsr_gemm over numpy arrays and torch tensors.

- numpy arrays run on the CPU backend (float16, float32, and bfloat16 where
  the ml_dtypes package provides it);
- torch CUDA tensors run on the CUDA backend, on torch's current stream of
  the tensors' device, with workspace allocated by torch and the layout's
  arrays uploaded once per device (cached on the Layout);
- torch CPU tensors run on the CPU backend.

Every argument is checked here before the library is called (types, ndim,
dtypes, devices, shapes, strides, `out`), with ValueError / TypeError; what
the library finds itself (a layout that does not fit, ...) raises
SparseKError. Nothing here is differentiable: the gradients are
sparsek.attention_backward (backward.py), not an autograd op yet.
"""

from __future__ import annotations

import math
from ctypes import byref, c_size_t, sizeof
from typing import NamedTuple

import numpy as np

from ._arrays import Arr, adapt, check_family, check_output, check_packed, outer_strides
from ._cvalues import as_int, float32
from ._lib import Backend, DType, F, Mask, Order, SkAttentionDesc, SkBsrGemmDesc, check
from .layout import DeviceLayout, Layout

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


def _check_out(out, aq: Arr) -> Arr:
    """`out` must match q: kind, shape, dtype, device, and be writable
    (check_output)."""
    ao = adapt(out, "out")
    if ao.kind != aq.kind:
        raise TypeError(f"out is a {ao.kind} array but q is a {aq.kind} array")
    if ao.shape != aq.shape:
        raise ValueError(f"out has shape {ao.shape}; it must be q's shape {aq.shape}")
    if ao.dtype != aq.dtype:
        raise TypeError(f"out.dtype = {ao.dtype_name} must be q's dtype {aq.dtype_name}")
    if ao.device != aq.device:
        raise ValueError(f"out is on {ao.device} but q is on {aq.device}")
    check_output(ao, "out")
    return ao


def _attention_desc(aq: Arr, ak: Arr, layout, causal, scale, backend):
    """The checks a plan makes before any C call, and the forward's
    descriptor (strides left packed: run() sets them). Returns (backend,
    desc); shared with the backward's plan."""
    if not isinstance(layout, (Layout, DeviceLayout)):
        raise TypeError(f"layout must be a sparsek.Layout (or DeviceLayout), got {type(layout).__name__}")
    be = _parse_backend(backend, aq.device)
    if be != Backend.CPU and aq.dtype == DType.F32:
        raise TypeError("float32 inputs are for the CPU backend only; use float16 or bfloat16 on CUDA")
    if aq.kind == "numpy" and be != Backend.CPU:
        raise ValueError("numpy arrays run on the CPU backend only")
    if scale is not None:
        scale = float32(scale, "scale", nonzero=True)
        if scale == 0.0 or not math.isfinite(scale):
            raise ValueError(f"scale = {scale} must be finite and non-zero (None means 1/sqrt(D))")
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
        ao = _check_out(out, aq)
        desc = self.desc
        for field, a, name in (("q_strides", aq, "q"), ("k_strides", ak, "k"), ("v_strides", av, "v"), ("o_strides", ao, "out")):
            setattr(desc, field, outer_strides(a, name))
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
    """
    plan = AttentionPlan(q, k, v, layout, causal=causal, scale=scale, backend=backend)
    return plan.run(q, k, v, out=out, return_lse=return_lse)


# ---------------------------------------------------------------------------
# BSR GEMM
# ---------------------------------------------------------------------------


def _matrix(a: Arr, name: str):
    """(order, leading dimension) of a 2-D matrix with one contiguous axis."""
    if len(a.shape) != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    r, c = a.shape
    s0, s1 = a.strides
    if (s1 == 1 or c == 1) and s0 >= c:
        return Order.ROW_MAJOR, s0 if r > 1 else c
    if (s0 == 1 or r == 1) and s1 >= r:
        return Order.COL_MAJOR, s1 if c > 1 else r
    raise ValueError(f"{name} (shape {a.shape}, element strides {a.strides}) must be row- or column-major with one contiguous axis")


_C_DTYPES_NUMPY = {"float16": np.float16, "float32": np.float32}


def bsr_gemm(a_values, b, layout, *, c=None, alpha=1.0, beta=0.0, c_dtype=None, backend=None):
    """C = alpha * A * B + beta * C with A block-sparse (sk_bsr_gemm).

    layout: A's layout (rows = m, cols = k, batch = heads = 1).
    a_values: [nnz, block_rows, block_cols] contiguous, in col_indices order.
    b: [k, n], row- or column-major. c: [m, n] row-major (leading dimension
    from its strides), read when beta != 0; allocated (c_dtype, default
    float32) when None; a caller's c must be writable (check_output).
    alpha, beta: floats that keep their value in float32.
    numpy arrays -> CPU backend; torch CUDA tensors -> CUDA backend on the
    current stream. Returns c.
    """
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a sparsek.Layout, got {type(layout).__name__}")
    aa, ab = adapt(a_values, "a_values"), adapt(b, "b")
    check_family((aa, ab))
    if aa.dtype != ab.dtype:
        raise TypeError(f"a_values ({aa.dtype_name}) and b ({ab.dtype_name}) must have the same dtype")
    if aa.device != ab.device:
        raise ValueError(f"a_values is on {aa.device} but b is on {ab.device}")
    be = _parse_backend(backend, aa.device)
    if layout.batch != 1 or layout.heads != 1:
        raise ValueError(f"a layout for bsr_gemm must have batch = heads = 1 (got {layout.batch}, {layout.heads})")
    m, k = layout.rows, layout.cols
    want = (layout.nnz, layout.block_rows, layout.block_cols)
    if aa.shape != want:
        raise ValueError(f"a_values has shape {aa.shape}; this layout needs [nnz, block_rows, block_cols] = {want}")
    check_packed(aa, "a_values", "[nnz, block_rows, block_cols]")
    b_order, ldb = _matrix(ab, "b")
    if ab.shape[0] != k:
        raise ValueError(f"b has {ab.shape[0]} rows; A has k = {k} columns")
    n = ab.shape[1]
    if c is None:
        if aa.kind == "numpy":
            name = c_dtype or "float32"
            if name not in _C_DTYPES_NUMPY:
                raise TypeError(f"c_dtype = {c_dtype!r} is not supported for numpy (float16, float32)")
            c = np.zeros((m, n), dtype=_C_DTYPES_NUMPY[name])
        else:
            import torch

            c = torch.zeros((m, n), dtype=c_dtype or torch.float32, device=b.device)
    ac = adapt(c, "c")
    check_family((aa, ac))
    if ac.device != aa.device:
        raise ValueError(f"c is on {ac.device} but a_values is on {aa.device}")
    if ac.shape != (m, n):
        raise ValueError(f"c has shape {ac.shape}; it must be [m, n] = {(m, n)}")
    c_order, ldc = _matrix(ac, "c")
    if c_order != Order.ROW_MAJOR:
        # Also a single row with a non-unit stride: the library writes it packed.
        raise ValueError(f"c (shape {ac.shape}, element strides {ac.strides}) must be row-major")
    check_output(ac, "c")
    if be != Backend.CPU and aa.dtype == DType.F32:
        raise TypeError("float32 A and B are for the CPU backend only")

    desc = SkBsrGemmDesc()
    check(F.sk_bsr_gemm_desc_init(byref(desc), sizeof(desc)))
    desc.backend = int(be)
    desc.ab_dtype = int(aa.dtype)
    desc.c_dtype = int(ac.dtype)
    desc.m, desc.n, desc.k = m, n, k
    desc.b_order = int(b_order)
    desc.ldb = ldb
    desc.ldc = ldc
    desc.alpha = float32(alpha, "alpha")
    desc.beta = float32(beta, "beta")
    a_ptr = aa.ptr if layout.nnz else None
    if be == Backend.CPU:
        check(F.sk_bsr_gemm(byref(desc), byref(layout.view()), a_ptr, ab.ptr, ac.ptr, None, 0, None))
        return c
    import torch

    with torch.cuda.device(b.device):
        bsr = layout.device_view(b.device)
        size = c_size_t()
        check(F.sk_bsr_gemm_workspace_size(byref(desc), byref(bsr), byref(size)))
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=b.device)
        stream = torch.cuda.current_stream(b.device).cuda_stream
        check(F.sk_bsr_gemm(byref(desc), byref(bsr), a_ptr, ab.ptr, ac.ptr, ws.data_ptr(), size.value, stream))
    return c


__all__ = ["attention", "plan_attention", "AttentionPlan", "bsr_gemm"]
