"""sparsek.attention_varlen_backward: the gradients of
sparsek.attention_varlen with respect to q, k and v over packed sequences
(sparsek.h, "Varlen attention backward"; sk_attention_varlen_backward).

It takes what the forward took and returned: q [total_q, Hq, D], k and v
[total_k, Hkv, D], the length arrays and the layout, o and lse [Hq,
total_q] (attention_varlen(..., return_lse=True)), plus do = dL/do, and
gives (dq, dk, dv), dk and dv summed over the query heads of each KV head.
numpy arrays and torch CPU tensors run on the CPU backend; torch CUDA
tensors on the CUDA backend (fp16 / bf16, head_dim 64 / 128, blocks 64 /
128: the portable backward in varlen mode; length arrays on the device,
max_seqlen_q / max_seqlen_k required), on torch's current stream.
"""

from __future__ import annotations

from ctypes import byref, sizeof

from ._arrays import Arr, adapt, check_family, check_output, check_packed
from ._lib import DType, F, SkAttentionVarlenBackwardDesc, check
from .attention import _empty_like, _options
from .layout import Layout
from .varlen import _token_strides, check_packed_tensors, launch, varlen_desc, varlen_lengths


def _like(x, aq: Arr, name: str, written: bool) -> Arr:
    """x like q: the same family, shape, dtype and device."""
    a = adapt(x, name)
    check_family((aq, a))
    if (a.shape, a.dtype, a.device) != (aq.shape, aq.dtype, aq.device):
        raise ValueError(f"{name} must be like its input ({aq.shape} {aq.dtype_name} on {aq.device}); "
                         f"got {a.shape} {a.dtype_name} on {a.device}")
    if written:
        check_output(a, name)
    return a


def _check_lse(lse, aq: Arr) -> Arr:
    """lse: float32 [Hq, total_q], contiguous, on q's device."""
    a = adapt(lse, "lse")
    check_family((aq, a))
    if a.shape != (aq.shape[1], aq.shape[0]):
        raise ValueError(f"lse has shape {a.shape}; it must be [Hq, total_q] = {(aq.shape[1], aq.shape[0])}")
    if a.dtype != DType.F32:
        raise TypeError(f"lse.dtype = {a.dtype_name} must be float32 (as the forward returns it)")
    if a.device != aq.device:
        raise ValueError(f"lse is on {a.device} but q is on {aq.device}")
    check_packed(a, "lse", "[Hq, total_q]")
    return a


def attention_varlen_backward(
    q, k, v, o, do, lse, cu_seqlens_q, cu_seqlens_k, layout, max_seqlen_q=None, max_seqlen_k=None,
    causal=False, scale=None, *, backend=None, deterministic=True,
):
    """Gradients of sparsek.attention_varlen with respect to q, k and v.

    q, k, v, cu_seqlens_q, cu_seqlens_k, layout, max_seqlen_*, causal and
    scale as given to the forward; o and lse [Hq, total_q] (float32) as it
    returned them (return_lse=True); do = dL/do, q's shape and dtype.
    Returns (dq, dk, dv): dq q's shape, dk and dv k's shape, in the inputs'
    dtype. Rows with no admissible key (empty sequences included) get
    dq = 0; keys no row reaches get dk = dv = 0.
    """
    aq, ak, av = check_packed_tensors(q, k, v)
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a sparsek.VarlenLayout, got {type(layout).__name__}")
    be, sc = _options(aq, scale, backend)
    ao = _like(o, aq, "o", False)
    ado = _like(do, aq, "do", False)
    alse = _check_lse(lse, aq)
    ptrs, batch, max_seqlen_q, max_seqlen_k = varlen_lengths(
        be, aq, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    dq, dk, dv = _empty_like(q, aq), _empty_like(k, ak), _empty_like(v, av)
    adq, adk, adv = adapt(dq, "dq"), adapt(dk, "dk"), adapt(dv, "dv")
    desc = varlen_desc(be, aq, ak, av, ao, batch, max_seqlen_q, max_seqlen_k, sc, causal, "o")
    bwd = SkAttentionVarlenBackwardDesc()
    check(F.sk_attention_varlen_backward_desc_init(byref(bwd), sizeof(bwd)))
    bwd.deterministic = 1 if deterministic else 0
    bwd.dout_strides = _token_strides(ado, "do")
    bwd.dq_strides = _token_strides(adq, "dq")
    bwd.dk_strides = _token_strides(adk, "dk")
    bwd.dv_strides = _token_strides(adv, "dv")
    pointers = (ptrs[0], ptrs[1], aq.ptr, ak.ptr, av.ptr, ao.ptr, ado.ptr, alse.ptr, adq.ptr, adk.ptr, adv.ptr)

    def size_fn(d, bsr, size):
        return F.sk_attention_varlen_backward_workspace_size(d, byref(bwd), bsr, size)

    def call_fn(d, bsr, *rest):
        return F.sk_attention_varlen_backward(d, byref(bwd), bsr, *rest)

    launch(q, be, layout, desc, size_fn, call_fn, pointers)
    return dq, dk, dv


__all__ = ["attention_varlen_backward"]
