"""FP8 (e4m3) inputs: sparsek.quantize_e4m3 and sparsek.attention_fp8.

    y, ds = sparsek.quantize_e4m3(x)              # x bf16/fp16 [B, S, H, D]
    o = sparsek.attention_fp8(q8, k8, v8, layout, q_descale=qs, k_descale=ks, v_descale=vs)

e4m3 arrays are torch.float8_e4m3fn tensors (CPU: CPU backend; CUDA: the
FP8 Hopper kernel, head_dim 64 or 128, blocks of 64 or 128 rows and keys), or
numpy arrays of uint8 codes / ml_dtypes float8_e4m3fn (CPU backend). The attention runs on
descale x code (sparsek.h, "sk_attention_desc": FlashAttention-3's
q/k/v_descale), descales float32 [B, Hq] for Q and [B, Hkv] for K and V
(None: 1). O is bfloat16 or float16 (out_dtype; default bfloat16 for
torch, float16 for numpy, whose bfloat16 needs ml_dtypes). Each call plans
and runs (sk_attention_forward); these calls are not differentiable and
have no plan cache.

Pre-transposed V (docs/perf/fp8.md, "Round 4"): quantize_e4m3(v, layout="vt")
returns V^T [B, Hkv, D, Sk_pad] (Sk rounded up to 128, keys permuted inside
each 32 in the FP8 kernel's order, zeros past Sk: sparsek.h,
SK_QUANT_LAYOUT_VT_FP8), which attention_fp8(..., v_layout="vt") takes as V:
the Hopper kernel then loads it as its P V operand with no transpose.
"""

from __future__ import annotations

import math
from ctypes import byref, c_int64, c_size_t, sizeof

import numpy as np

from ._arrays import check_packed, is_torch, outer_strides, Arr
from ._cvalues import float32
from ._lib import Backend, DType, F, Mask, SkAttentionDesc, SkQuantizeDesc, check
from .attention import _check_layout, _parse_backend


def _fp8(x, name: str) -> Arr:
    """An e4m3 array as the library sees it (1-byte elements)."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint8 and x.dtype.name != "float8_e4m3fn":
            raise TypeError(f"{name}.dtype = {x.dtype}: e4m3 numpy arrays are uint8 codes or ml_dtypes float8_e4m3fn")
        return Arr("numpy", x.ctypes.data, tuple(x.shape), tuple(x.strides), DType.E4M3, "e4m3", "cpu", 1, x)
    if is_torch(x):
        import torch

        if x.dtype not in (torch.float8_e4m3fn, torch.uint8):
            raise TypeError(f"{name}.dtype = {x.dtype}: e4m3 tensors are torch.float8_e4m3fn (or uint8 codes)")
        dev = x.device
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {dev}; only CPU and CUDA tensors are supported")
        device = "cpu" if dev.type == "cpu" else f"cuda:{dev.index if dev.index is not None else 0}"
        return Arr("torch", x.data_ptr(), tuple(x.shape), tuple(x.stride()), DType.E4M3, "e4m3", device, 1, x)
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def _descale(x, name: str, shape: tuple, like: Arr):
    """A float32 [B, H] descale on q's device, contiguous; its pointer (None: NULL)."""
    if x is None:
        return None, None
    if like.kind == "numpy":
        a = np.require(np.asarray(x, dtype=np.float32), requirements=["C_CONTIGUOUS", "ALIGNED"])
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}; it must be {shape}")
        return a, a.ctypes.data
    import torch

    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=torch.float32)
    a = x.to(device=like.obj.device, dtype=torch.float32).contiguous()
    if tuple(a.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(a.shape)}; it must be {shape}")
    return a, a.data_ptr()


def _out_dtype(out_dtype, kind: str):
    """(library dtype, numpy or torch dtype) of O."""
    name = out_dtype if isinstance(out_dtype, str) or out_dtype is None else str(out_dtype).replace("torch.", "")
    if name is None:
        name = "bfloat16" if kind == "torch" else "float16"
    if name not in ("bfloat16", "float16"):
        raise ValueError(f"out_dtype = {out_dtype!r}: O of FP8 inputs is bfloat16 or float16")
    if kind == "torch":
        import torch

        return (DType.BF16, torch.bfloat16) if name == "bfloat16" else (DType.F16, torch.float16)
    if name == "float16":
        return DType.F16, np.float16
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise TypeError("out_dtype='bfloat16' on numpy needs the ml_dtypes package; use 'float16'") from e
    return DType.BF16, ml_dtypes.bfloat16


def _v_layout(v_layout) -> bool:
    """True for "vt" (V^T), False for "rows"."""
    if v_layout not in ("rows", "vt"):
        raise ValueError(f"v_layout = {v_layout!r}: 'rows' or 'vt'")
    return v_layout == "vt"


def vt_shape(batch: int, seq: int, heads: int, head_dim: int) -> tuple:
    """The shape of quantize_e4m3(..., layout="vt")'s y: [B, H, D, S_pad]."""
    n = c_int64()
    check(F.sk_quantize_vt_elems(batch, seq, heads, head_dim, byref(n)))
    return (batch, heads, head_dim, n.value // (batch * heads * head_dim))


def attention_fp8(q, k, v, layout, *, q_descale=None, k_descale=None, v_descale=None, causal=False,
                  scale=None, out_dtype=None, return_lse=False, backend=None, v_layout="rows"):
    """Block-sparse attention forward on e4m3 q [B, Sq, Hq, D], k and v
    [B, Sk, Hkv, D] (see the module text; v_layout="vt": v is V^T [B, Hkv,
    D, Sk_pad] from quantize_e4m3(..., layout="vt"), contiguous). Returns O
    [B, Sq, Hq, D] in out_dtype, or (O, lse) with lse float32 [B, Hq, Sq]
    when return_lse. Plans and runs (plan_attention_fp8 plans once)."""
    plan = AttentionFp8Plan(q, k, v, layout, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                            causal=causal, scale=scale, out_dtype=out_dtype, backend=backend, v_layout=v_layout)
    return plan.run(q, k, v, return_lse=return_lse)


class AttentionFp8Plan:
    """A planned FP8 attention (sk_attention_plan once; run() only calls
    sk_attention_run): for timing and repeated calls on tensors of the same
    shapes and strides. The descales are fixed at plan time (the plan keeps
    them); run() takes q, k, v with the planned shapes, strides, dtype and
    device. On CUDA the plan is enqueued on torch's current stream."""

    def __init__(self, q, k, v, layout, *, q_descale=None, k_descale=None, v_descale=None, causal=False,
                 scale=None, out_dtype=None, backend=None, v_layout="rows"):
        _check_layout(layout)
        aq, ak, av = _fp8(q, "q"), _fp8(k, "k"), _fp8(v, "v")
        if len({aq.kind, ak.kind, av.kind}) > 1:
            raise TypeError("q, k, v must all be numpy arrays or all torch tensors")
        if len({aq.device, ak.device, av.device}) > 1:
            raise ValueError(f"q, k, v are on different devices: {aq.device}, {ak.device}, {av.device}")
        for a, name in ((aq, "q"), (ak, "k"), (av, "v")):
            if len(a.shape) != 4:
                raise ValueError(f"{name} must have 4 dimensions; got shape {a.shape}")
        vt = _v_layout(v_layout)
        B, Sq, Hq, D = aq.shape
        _, Sk, Hkv, _ = ak.shape
        if vt:
            want = vt_shape(B, Sk, Hkv, D)
            if av.shape != want:
                raise ValueError(f"v {av.shape} must be V^T {want} [B, Hkv, D, Sk_pad] (v_layout='vt')")
            check_packed(av, "v", "[B, Hkv, D, Sk_pad] (v_layout='vt')")
        elif ak.shape != av.shape:
            raise ValueError(f"k {ak.shape} and v {av.shape} must have the same shape [B, Sk, Hkv, D]")
        if ak.shape[0] != B or ak.shape[3] != D:
            raise ValueError(f"q {aq.shape} and k {ak.shape} differ in batch or head_dim")
        be = _parse_backend(backend, aq.device)
        if aq.kind == "numpy" and be != Backend.CPU:
            raise ValueError("numpy arrays run on the CPU backend only")
        if scale is not None:
            scale = float32(scale, "scale", nonzero=True)
            if not math.isfinite(scale):
                raise ValueError(f"scale = {scale} must be finite")
        odt, self._o_np = _out_dtype(out_dtype, aq.kind)
        # Kept alive with the plan: the descriptor holds their pointers.
        self._descales = [_descale(x, name, shape, aq) for x, name, shape in
                          ((q_descale, "q_descale", (B, Hq)), (k_descale, "k_descale", (B, Hkv)),
                           (v_descale, "v_descale", (B, Hkv)))]

        desc = SkAttentionDesc()
        check(F.sk_attention_desc_init(byref(desc), sizeof(desc)))
        desc.backend = int(be)
        desc.dtype = int(DType.E4M3)
        desc.out_dtype = int(odt)
        desc.batch, desc.seq_q, desc.seq_k = B, Sq, Sk
        desc.heads_q, desc.heads_kv, desc.head_dim = Hq, Hkv, D
        desc.scale = 0.0 if scale is None else scale
        desc.mask = int(Mask.CAUSAL if causal else Mask.NONE)
        for field, a, name in (("q_strides", aq, "q"), ("k_strides", ak, "k"), ("v_strides", av, "v")):
            if not (vt and name == "v"):  # V^T: packed, strides 0
                setattr(desc, field, outer_strides(a, name))
        desc.v_layout = 1 if vt else 0
        desc.o_strides = (Sq * Hq * D, Hq * D, D)  # run() allocates O packed
        desc.q_descale, desc.k_descale, desc.v_descale = (d[1] for d in self._descales)
        self.desc, self.backend, self.workspace_size = desc, be, 0
        self._spec = tuple((a.kind, a.device, a.shape, a.strides) for a in (aq, ak, av))
        self._shape = (B, Sq, Hq)
        if be == Backend.CPU:
            self.bsr, self.workspace, self._device = layout.view(), None, None
            check(F.sk_attention_plan(byref(desc), byref(self.bsr), None, 0, None))
            return
        import torch

        self._device = q.device
        with torch.cuda.device(q.device):
            self.bsr = layout.device_view(q.device)
            size = c_size_t()
            check(F.sk_attention_workspace_size(byref(desc), byref(self.bsr), byref(size)))
            self.workspace_size = size.value
            self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
            stream = torch.cuda.current_stream(q.device).cuda_stream
            check(F.sk_attention_plan(byref(desc), byref(self.bsr), self.workspace.data_ptr(), size.value, stream))

    def run(self, q, k, v, *, return_lse=False):
        """Enqueue sk_attention_run on q, k, v (the planned shapes and
        strides). Returns O, or (O, lse) when return_lse."""
        arrs = (_fp8(q, "q"), _fp8(k, "k"), _fp8(v, "v"))
        got = tuple((a.kind, a.device, a.shape, a.strides) for a in arrs)
        if got != self._spec:
            raise ValueError(f"run() got q, k, v as {got}; the plan was made for {self._spec}")
        aq, ak, av = arrs
        B, Sq, Hq = self._shape
        D = aq.shape[3]
        if aq.kind == "numpy":
            out = np.empty((B, Sq, Hq, D), dtype=self._o_np)
            lse = np.empty((B, Hq, Sq), dtype=np.float32) if return_lse else None
            o_ptr, lse_ptr = out.ctypes.data, (lse.ctypes.data if return_lse else None)
        else:
            import torch

            out = torch.empty((B, Sq, Hq, D), dtype=self._o_np, device=q.device)
            lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if return_lse else None
            o_ptr, lse_ptr = out.data_ptr(), (lse.data_ptr() if return_lse else None)
        if self.backend == Backend.CPU:
            check(F.sk_attention_run(byref(self.desc), byref(self.bsr), aq.ptr, ak.ptr, av.ptr, o_ptr, lse_ptr,
                                     None, 0, None))
        else:
            import torch

            with torch.cuda.device(self._device):
                stream = torch.cuda.current_stream(self._device).cuda_stream
                check(F.sk_attention_run(byref(self.desc), byref(self.bsr), aq.ptr, ak.ptr, av.ptr, o_ptr, lse_ptr,
                                         self.workspace.data_ptr(), self.workspace_size, stream))
        return (out, lse) if return_lse else out


def plan_attention_fp8(q, k, v, layout, **kwargs) -> AttentionFp8Plan:
    """Plan an FP8 attention once (attention_fp8's arguments, less
    return_lse); call .run(q, k, v) as often as needed."""
    return AttentionFp8Plan(q, k, v, layout, **kwargs)


def quantize_e4m3(x, *, backend=None, layout="rows"):
    """x bfloat16 / float16 [B, S, H, D] -> (y, descale): y e4m3 [B, S, H, D]
    (torch.float8_e4m3fn for torch, uint8 codes for numpy), descale float32
    [B, H] with x ~ descale[b, h] * y (sparsek.h, sk_quantize_e4m3).
    layout="vt": y is V^T [B, H, D, S_pad] for attention_fp8(...,
    v_layout="vt") (see the module text)."""
    from ._arrays import adapt

    ax = adapt(x, "x")
    if ax.dtype not in (DType.F16, DType.BF16):
        raise TypeError(f"x.dtype = {ax.dtype_name}: quantize_e4m3 takes float16 or bfloat16")
    if len(ax.shape) != 4:
        raise ValueError(f"x must have 4 dimensions [B, S, H, D]; got shape {ax.shape}")
    B, S, H, D = ax.shape
    be = _parse_backend(backend, ax.device)
    if ax.kind == "numpy" and be != Backend.CPU:
        raise ValueError("numpy arrays run on the CPU backend only")
    desc = SkQuantizeDesc()
    check(F.sk_quantize_desc_init(byref(desc), sizeof(desc)))
    desc.backend = int(be)
    desc.dtype = int(ax.dtype)
    desc.batch, desc.seq, desc.heads, desc.head_dim = B, S, H, D
    desc.x_strides = outer_strides(ax, "x")
    vt = _v_layout(layout)
    desc.layout = 1 if vt else 0
    y_shape = vt_shape(B, S, H, D) if vt else (B, S, H, D)
    if ax.kind == "numpy":
        y = np.empty(y_shape, dtype=np.uint8)
        ds = np.empty((B, H), dtype=np.float32)
        check(F.sk_quantize_e4m3(byref(desc), ax.ptr, y.ctypes.data, ds.ctypes.data, None, 0, None))
        return y, ds
    import torch

    y = torch.empty(y_shape, dtype=torch.uint8, device=x.device)
    ds = torch.empty((B, H), dtype=torch.float32, device=x.device)
    if be == Backend.CPU:
        check(F.sk_quantize_e4m3(byref(desc), ax.ptr, y.data_ptr(), ds.data_ptr(), None, 0, None))
    else:
        with torch.cuda.device(x.device):
            size = c_size_t()
            check(F.sk_quantize_e4m3_workspace_size(byref(desc), byref(size)))
            ws = torch.empty(max(size.value, 16), dtype=torch.uint8, device=x.device)
            stream = torch.cuda.current_stream(x.device).cuda_stream
            check(F.sk_quantize_e4m3(byref(desc), ax.ptr, y.data_ptr(), ds.data_ptr(), ws.data_ptr(), size.value, stream))
    return y.view(torch.float8_e4m3fn), ds


__all__ = ["AttentionFp8Plan", "attention_fp8", "plan_attention_fp8", "quantize_e4m3", "vt_shape"]
