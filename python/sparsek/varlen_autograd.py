"""Autograd for sparsek.attention_varlen on torch tensors: a
torch.autograd.Function whose forward is attention_varlen (O and LSE kept)
and whose backward is attention_varlen_backward (sk_attention_varlen_backward:
the CPU backend for CPU tensors, the CUDA one, src/cuda/attention/
bwd_varlen.cu, for CUDA tensors, on torch's current stream). Imported only
when a torch tensor requires grad, so numpy users never import torch."""

from __future__ import annotations

import numpy as np

_FUNCTION = None


def _function():
    """The autograd.Function, made on first use (torch imported then)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    from .varlen import attention_varlen
    from .varlen_backward import attention_varlen_backward

    class AttentionVarlen(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, layout, max_q, max_k, causal, scale, backend):
            o, lse = attention_varlen(q, k, v, cu_q, cu_k, layout, max_q, max_k, causal=causal, scale=scale,
                                      return_lse=True, backend=backend)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.args = (cu_q, cu_k, layout, max_q, max_k, causal, scale, backend)
            # lse is returned for the caller to read; no gradient flows
            # through it (as for the fixed attention op).
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(ctx, do, _dlse):
            q, k, v, o, lse = ctx.saved_tensors
            cu_q, cu_k, layout, max_q, max_k, causal, scale, backend = ctx.args
            if do is None:
                do = torch.zeros_like(o)
            # autograd may hand over an expanded or strided gradient; the
            # library needs the head_dim contiguous and non-negative strides.
            do = do.contiguous()
            dq, dk, dv = attention_varlen_backward(
                q, k, v, o, do, lse, cu_q, cu_k, layout, max_q, max_k, causal, scale, backend=backend,
            )
            return dq, dk, dv, None, None, None, None, None, None, None, None

    _FUNCTION = AttentionVarlen
    return _FUNCTION


def attention_varlen_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, layout, max_seqlen_q, max_seqlen_k,
                          causal, scale, return_lse, out, backend):
    """attention_varlen for torch tensors that require grad (CPU or CUDA):
    recorded by autograd; refused (before any work) with out=."""
    if out is not None:
        raise ValueError("out= makes attention_varlen non-differentiable, but q, k or v requires grad: "
                         "leave out=None")
    import torch

    def host(cu):
        # Freeze the lengths now (a copy on their own device, ordered on the
        # stream for CUDA tensors) so that the backward sees the forward's
        # even if the caller's array changes.
        return cu.detach().clone() if isinstance(cu, torch.Tensor) else np.array(cu)

    o, lse = _function().apply(q, k, v, host(cu_seqlens_q), host(cu_seqlens_k), layout, max_seqlen_q, max_seqlen_k,
                               causal, scale, backend)
    return (o, lse) if return_lse else o


__all__ = ["attention_varlen_grad"]
