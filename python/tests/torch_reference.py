"""Dense masked attention in torch, differentiated by torch.autograd: the
independent reference for the gradients of the sparsek op (test_autograd.py),
and the tolerance rule of conftest applied to gradients. Imported only where
torch is installed."""

from __future__ import annotations

import numpy as np
import torch

from conftest import head_slice, token_allow

# Small absolute terms of the rule, per dtype (as the numpy tests use).
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def token_mask(layout, B, Hq, Hkv, Sq, Sk, causal) -> torch.Tensor:
    """bool [B, Hq, Sq, Sk]: the admissible (query, key) pairs of the op."""
    mask, g = layout.to_mask(), layout.grid
    out = np.zeros((B, Hq, Sq, Sk), bool)
    for b in range(B):
        sb = b if g.batch > 1 else 0
        for h in range(Hq):
            s = sb * g.heads + head_slice(h, Hq, Hkv, g.heads)
            out[b, h] = token_allow(mask[s], Sq, Sk, g.block_rows, g.block_cols, causal)
    return torch.from_numpy(out)


def dense_attention(q, k, v, allow, scale=None):
    """out [B, Sq, Hq, D] of dense attention over the pairs `allow`, in q's
    dtype; rows with no pair give 0 (and no gradient)."""
    B, Sq, Hq, D = q.shape
    group = Hq // k.shape[2]
    scale = 1.0 / D**0.5 if scale is None else scale
    kr = k.repeat_interleave(group, dim=2)
    vr = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    rows = allow.any(dim=-1, keepdim=True)
    # Empty rows get finite scores, so that softmax and its gradient stay
    # finite there; their probabilities are then zeroed.
    s = torch.where(allow, s, torch.where(rows, float("-inf"), 0.0))
    p = torch.where(allow, torch.softmax(s, dim=-1), 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vr)


def dense_grads(q, k, v, dout, allow, scale=None, dtype=torch.float64):
    """(out, dq, dk, dv) of dense_attention computed on the CPU in `dtype`
    from the values of q, k, v, dout."""
    q_, k_, v_ = (x.detach().to("cpu", dtype).requires_grad_(True) for x in (q, k, v))
    out = dense_attention(q_, k_, v_, allow.cpu(), scale)
    out.backward(dout.detach().to("cpu", dtype))
    return out.detach(), q_.grad, k_.grad, v_.grad


def assert_grads_rule(got, q, k, v, dout, allow, scale=None, atol=None):
    """Each of got = (dq, dk, dv) against the fp64 chain rule: error at most
    2 x that of a naive float32 dense implementation rounded to the inputs'
    dtype, plus atol; no NaN."""
    dtype = q.dtype
    atol = ATOL[dtype] if atol is None else atol
    ref = dense_grads(q, k, v, dout, allow, scale)[1:]
    naive = dense_grads(q, k, v, dout, allow, scale, torch.float32)[1:]
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert g.dtype == dtype and g.shape == r.shape, f"{name}: {g.dtype} {tuple(g.shape)}"
        g = g.detach().to("cpu", torch.float64)
        assert not torch.isnan(g).any(), f"{name} has NaN"
        naive_err = (n.to(dtype).to(torch.float64) - r).abs().max().item()
        err = (g - r).abs().max().item()
        assert err <= 2 * naive_err + atol, f"{name}: max error {err:.3g} > 2 x naive {naive_err:.3g} + {atol}"
