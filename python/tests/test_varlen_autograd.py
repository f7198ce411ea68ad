"""sparsek.attention_varlen under torch.autograd (torch CPU tensors):
loss.backward() gives bit for bit what attention_varlen_backward gives for
the forward's O and LSE, and matches torch.autograd through a dense masked
reference per sequence (the fp64 rule of torch_reference.py); empty
sequences, GQA, causal; out= with grad is refused. On a CUDA device
(skipped without one): the CUDA varlen backward through autograd against
the CPU backend on the same fp16 / bf16 inputs, and bitwise repeatable."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import VarlenLayout

from conftest import HAVE_CUDA, cu_of, requires_torch, seeded_rng

pytestmark = requires_torch

LENS_Q = [100, 0, 70, 1, 64, 30]
LENS_K = [150, 20, 80, 0, 64, 130]


def _case(seed, hq, hkv, causal, layout_heads, d=32):
    import torch

    rng = seeded_rng(seed)
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    vl = VarlenLayout.random(cu_q, cu_k, k=2, seed=int(rng.integers(1 << 30)), causal=causal, block=64,
                             heads=layout_heads)
    q = torch.from_numpy(rng.standard_normal((sum(LENS_Q), hq, d)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((sum(LENS_K), hkv, d)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((sum(LENS_K), hkv, d)).astype(np.float32))
    do = torch.from_numpy(rng.standard_normal(q.shape).astype(np.float32))
    return cu_q, cu_k, vl, q, k, v, do


def _grads(q, k, v, cu_q, cu_k, vl, causal, do, scale=None):
    """(o, lse, dq, dk, dv) from loss = sum(o * do) through autograd."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    o, lse = sparsek.attention_varlen(*leaves, cu_q, cu_k, vl, causal=causal, scale=scale, return_lse=True)
    assert o.requires_grad and not lse.requires_grad
    (o * do).sum().backward()
    return (o.detach(), lse) + tuple(x.grad for x in leaves)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(2, 2, 1), (4, 1, 4), (6, 2, 2)])
def test_backward_equals_varlen_backward(causal, heads):
    """The gradients autograd accumulates are attention_varlen_backward's,
    bit for bit (the same O and LSE, the same library call)."""
    hq, hkv, lh = heads
    cu_q, cu_k, vl, q, k, v, do = _case(4000 + 10 * hq + causal, hq, hkv, causal, lh)
    o, lse, dq, dk, dv = _grads(q, k, v, cu_q, cu_k, vl, causal, do)
    want_o, want_lse = sparsek.attention_varlen(q, k, v, cu_q, cu_k, vl, causal=causal, return_lse=True)
    assert np.array_equal(o.numpy(), want_o.numpy()) and np.array_equal(lse.numpy(), want_lse.numpy())
    want = sparsek.attention_varlen_backward(q, k, v, want_o, do, want_lse, cu_q, cu_k, vl, causal=causal)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert np.array_equal(g.numpy(), w.numpy()), f"{name} differs from attention_varlen_backward"
    # A second run repeats bitwise (deterministic backward).
    again = _grads(q, k, v, cu_q, cu_k, vl, causal, do)
    for g, w in zip(again[2:], (dq, dk, dv)):
        assert np.array_equal(g.numpy(), w.numpy())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(2, 2, 1), (4, 1, 4)])
def test_backward_matches_dense_reference_per_sequence(causal, heads):
    """Each sequence's slice of dq, dk, dv against torch.autograd through
    dense masked attention over that sequence alone (fp64 chain rule, the
    tolerance of torch_reference.assert_grads_rule); empty sequences give
    zero gradients."""
    import torch

    from torch_reference import assert_grads_rule, token_mask

    hq, hkv, lh = heads
    scale = 0.3
    cu_q, cu_k, vl, q, k, v, do = _case(4100 + 10 * hq + causal, hq, hkv, causal, lh)
    _, _, dq, dk, dv = _grads(q, k, v, cu_q, cu_k, vl, causal, do, scale=scale)
    reached_k = torch.zeros(k.shape[0], dtype=torch.bool)
    for b in range(len(LENS_Q)):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        lay = vl.sequence(b)
        if lay is None:
            # No query or no key: nothing to attend, zero gradients.
            assert not dq[qs:qe].any(), f"sequence {b}: dq not 0"
            continue
        allow = token_mask(lay, 1, hq, hkv, qe - qs, ke - ks, causal)
        reached_k[ks:ke] = True
        got = (dq[qs:qe][None], dk[ks:ke][None], dv[ks:ke][None])
        assert_grads_rule(got, q[qs:qe][None], k[ks:ke][None], v[ks:ke][None], do[qs:qe][None], allow, scale)
    # Keys of sequences with no query get no gradient.
    assert not dk[~reached_k].any() and not dv[~reached_k].any()


def test_gqa_gradient_through_a_graph():
    """attention_varlen inside a larger graph (a projection before, a
    non-trivial loss after): the chain rule reaches the projection's
    weight, and gradcheck-style finite differences agree in float64-ish
    tolerance on a small case."""
    import torch

    rng = seeded_rng(4200)
    lens = [5, 0, 9]
    cu = cu_of(lens)
    vl = VarlenLayout.causal(cu, cu, block=64, heads=1)
    x = torch.from_numpy(rng.standard_normal((sum(lens), 2, 8)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((8, 8)).astype(np.float32)).requires_grad_(True)
    k = torch.from_numpy(rng.standard_normal((sum(lens), 1, 8)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((sum(lens), 1, 8)).astype(np.float32))

    def loss_of(weight):
        o = sparsek.attention_varlen(x @ weight, k, v, cu, cu, vl, causal=True)
        return (o.square()).sum()

    loss = loss_of(w)
    loss.backward()
    g = w.grad.clone()
    assert g.abs().sum() > 0
    eps, worst = 1e-2, 0.0
    with torch.no_grad():
        for i, j in [(0, 0), (3, 5), (7, 2)]:
            wp, wm = w.detach().clone(), w.detach().clone()
            wp[i, j] += eps
            wm[i, j] -= eps
            fd = (loss_of(wp) - loss_of(wm)).item() / (2 * eps)
            worst = max(worst, abs(fd - g[i, j].item()) / max(1.0, abs(fd)))
    assert worst < 2e-2, f"finite differences disagree: {worst}"


def test_refusals():
    """out= with grad is refused (non-differentiable); without grad (or
    under no_grad) the call is the plain forward."""
    import torch

    cu_q, cu_k, vl, q, k, v, _ = _case(4300, 2, 2, True, 1)
    tq = q.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="out="):
        sparsek.attention_varlen(tq, k, v, cu_q, cu_k, vl, causal=True, out=torch.empty_like(q))
    with torch.no_grad():
        o = sparsek.attention_varlen(tq, k, v, cu_q, cu_k, vl, causal=True)
    assert not o.requires_grad


def _cuda_grads(q, k, v, do, cu_q, cu_k, vl, causal, dt, backend=None):
    """(o, lse, dq, dk, dv) of loss = sum(o * do) through autograd on CUDA
    tensors of dtype dt (device length arrays), back on the host in fp32."""
    import torch

    dev = torch.device("cuda")
    leaves = [x.to(dev, dt).requires_grad_(True) for x in (q, k, v)]
    dcu_q, dcu_k = torch.from_numpy(cu_q).to(dev), torch.from_numpy(cu_k).to(dev)
    o, lse = sparsek.attention_varlen(*leaves, dcu_q, dcu_k, vl, max(LENS_Q), max(LENS_K), causal=causal,
                                      return_lse=True, backend=backend)
    assert o.requires_grad and not lse.requires_grad
    (o.float() * do.to(dev)).sum().backward()
    torch.cuda.synchronize()
    return (o.detach(), lse) + tuple(x.grad for x in leaves)


@pytest.mark.skipif(not HAVE_CUDA, reason="no torch CUDA device (or library built without CUDA)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 2, 2), (8, 1, 8)])
def test_cuda_autograd_matches_the_cpu_backend(causal, heads):
    """CUDA tensors requiring grad: loss.backward() runs the CUDA varlen
    backward (the default and the portable backend) and gives the CPU
    backend's gradients for the same fp16 / bf16 inputs, O and LSE (within
    the dtype's rounding), with empty sequences, GQA and causal."""
    import torch

    hq, hkv, lh = heads
    cu_q, cu_k, vl, q, k, v, do = _case(4400 + hq + causal, hq, hkv, causal, lh, d=64)
    for dt in (torch.float16, torch.bfloat16):
        for backend in (None, "cuda_sm80"):
            o, lse, dq, dk, dv = _cuda_grads(q, k, v, do, cu_q, cu_k, vl, causal, dt, backend)
            host = [x.detach().cpu() for x in (q.to(dt), k.to(dt), v.to(dt), o, do.to(dt), lse)]
            want = sparsek.attention_varlen_backward(*host, cu_q, cu_k, vl, causal=causal)
            scale = max(float(w.float().abs().max()) for w in want) + 1.0
            for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
                assert g.dtype == dt and g.shape == w.shape, name
                torch.testing.assert_close(g.cpu().float(), w.float(), atol=3e-2 * scale, rtol=3e-2,
                                           msg=lambda m, n=name, b=backend: f"{n} ({b}): {m}")


@pytest.mark.skipif(not HAVE_CUDA, reason="no torch CUDA device (or library built without CUDA)")
def test_cuda_autograd_is_repeatable():
    """Two CUDA backward passes on the same inputs: bitwise equal gradients
    (one CTA owns each output tile)."""
    import torch

    cu_q, cu_k, vl, q, k, v, do = _case(4500, 4, 1, True, 1, d=128)
    first = _cuda_grads(q, k, v, do, cu_q, cu_k, vl, True, torch.bfloat16)
    second = _cuda_grads(q, k, v, do, cu_q, cu_k, vl, True, torch.bfloat16)
    for name, a, b in zip(("dq", "dk", "dv"), first[2:], second[2:]):
        assert torch.equal(a, b), f"{name} differs between two runs"
