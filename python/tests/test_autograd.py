"""sparsek.attention as a torch autograd op (sparsek/torch_ops.py):
gradients against dense masked attention differentiated by torch.autograd
in float64 (torch_reference.py) under the tolerance rule, a directional
finite-difference check, torch.library.opcheck, torch.compile(fullgraph=True),
attention_topk's gradients. Skipped without torch.

The CUDA tests at the end need a GPU and a CUDA build of the library; they
skip without one. Until the CUDA backward is built they fail with
SK_STATUS_NOT_SUPPORTED on a GPU machine, on purpose."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import Layout

from conftest import HAVE_TORCH, requires_cuda

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch

    from torch_reference import assert_grads_rule, dense_attention, dense_grads, token_mask

    DTYPES = [torch.float32, torch.float16, torch.bfloat16]
else:
    DTYPES = []


def make_inputs(seed, B, Sq, Sk, Hq, Hkv, D, dtype, device="cpu", requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    print(f"seed = {seed}")
    q = torch.randn(B, Sq, Hq, D, generator=g)
    k = torch.randn(B, Sk, Hkv, D, generator=g)
    v = torch.randn(B, Sk, Hkv, D, generator=g)
    dout = torch.randn(B, Sq, Hq, D, generator=g)
    q, k, v, dout = (x.to(device, dtype) for x in (q, k, v, dout))
    for x in (q, k, v):
        x.requires_grad_(requires_grad)
    return q, k, v, dout


def op_grads(q, k, v, dout, lay, causal=False, scale=None):
    out = sparsek.attention(q, k, v, lay, causal=causal, scale=scale)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, dq, dk, dv


# ---------------------------------------------------------------------------
# Gradients against dense masked attention (CPU backend)
# ---------------------------------------------------------------------------

CASES = {
    # name: (B, Sq, Sk, Hq, Hkv, D, layout builder, causal)
    "random_kv_heads": (2, 192, 192, 4, 2, 16, lambda: Layout.random(192, k=2, seed=3, block=64, batch=2, heads=2), False),
    "random_causal_q_heads": (1, 256, 256, 4, 2, 16, lambda: Layout.random(256, k=2, seed=4, block=64, heads=4), True),
    "tails_broadcast": (2, 150, 190, 2, 1, 32, lambda: Layout.dense(150, 190, block=(64, 128)), True),
    "causal_sq_gt_sk": (1, 300, 130, 2, 2, 16, lambda: Layout.causal(300, 130, block=64), True),
    "mqa_sq_lt_sk": (1, 100, 333, 8, 1, 8, lambda: Layout.random(100, 333, k=3, seed=5, block=64), False),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_dense(case, dtype):
    B, Sq, Sk, Hq, Hkv, D, build, causal = CASES[case]
    lay = build()
    q, k, v, dout = make_inputs(301, B, Sq, Sk, Hq, Hkv, D, dtype)
    out, dq, dk, dv = op_grads(q, k, v, dout, lay, causal)
    allow = token_mask(lay, B, Hq, Hkv, Sq, Sk, causal)
    ref_out = dense_grads(q, k, v, dout, allow)[0]
    assert (out.detach().double() - ref_out).abs().max() <= 2e-2
    assert_grads_rule((dq, dk, dv), q, k, v, dout, allow)


def test_scale_and_empty_rows():
    mask = np.zeros((2, 4, 4), np.uint8)
    mask[0, 0, 0] = mask[0, 2, 1] = mask[0, 3, 3] = 1  # head 0: rows 1 empty; key blocks 2 unreached
    lay = Layout.from_mask(mask, block=64)  # head 1: every row empty
    q, k, v, dout = make_inputs(302, 1, 256, 256, 2, 2, 16, torch.float32)
    out, dq, dk, dv = op_grads(q, k, v, dout, lay, scale=0.3)
    assert (out[0, 64:128, 0] == 0).all() and (out[0, :, 1] == 0).all()
    assert (dq[0, 64:128, 0] == 0).all() and (dq[0, :, 1] == 0).all()
    assert (dk[0, 128:192, 0] == 0).all() and (dv[0, :, 1] == 0).all()
    allow = token_mask(lay, 1, 2, 2, 256, 256, False)
    assert_grads_rule((dq, dk, dv), q, k, v, dout, allow, scale=0.3)


def test_gqa_equals_repeated_heads():
    lay = Layout.causal(128, block=64)
    q, k, v, dout = make_inputs(303, 1, 128, 128, 4, 2, 16, torch.float32)
    _, dq, dk, dv = op_grads(q, k, v, dout, lay, causal=True)
    kr, vr = (x.detach().repeat_interleave(2, dim=2).requires_grad_(True) for x in (k, v))
    _, dq2, dk2, dv2 = op_grads(q, kr, vr, dout, lay, causal=True)
    torch.testing.assert_close(dq, dq2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dk, dk2.reshape(1, 128, 2, 2, 16).sum(3), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dv, dv2.reshape(1, 128, 2, 2, 16).sum(3), rtol=1e-5, atol=1e-6)


def test_directional_finite_differences():
    # gradcheck-style, on the op itself: the library computes in fp32 at
    # best, so torch.autograd.gradcheck's float64 tolerances do not apply
    # (and its fast mode, tried on float32, missed a zeroed dq). Central
    # differences of <w, out> along random directions of each input, with a
    # step large enough for fp32, against <grad, direction> from backward.
    lay = Layout.random(96, 80, k=1, seed=6, block=64, heads=2)
    q, k, v, w = make_inputs(304, 1, 96, 80, 2, 1, 4, torch.float32)

    def loss(q, k, v):
        return (sparsek.attention(q, k, v, lay, causal=True, scale=0.5) * w).sum()

    grads = torch.autograd.grad(loss(q, k, v), (q, k, v))
    g = torch.Generator().manual_seed(3041)
    eps = 1e-2
    with torch.no_grad():
        for i, x in enumerate((q, k, v)):
            for _ in range(3):
                u = torch.randn(x.shape, generator=g)
                plus = [y + eps * u if j == i else y for j, y in enumerate((q, k, v))]
                minus = [y - eps * u if j == i else y for j, y in enumerate((q, k, v))]
                numeric = ((loss(*plus) - loss(*minus)) / (2 * eps)).item()
                analytic = (grads[i] * u).sum().item()
                assert abs(numeric - analytic) <= 1e-3 * (1 + abs(analytic)), (i, numeric, analytic)


def test_strided_inputs_and_gradients():
    # q, k, v slices of one packed tensor; the gradient arrives as an
    # expanded scalar (out.sum()) and as a transposed tensor.
    g = torch.Generator().manual_seed(305)
    qkv = torch.randn(2, 200, 3, 2, 32, generator=g, requires_grad=True)
    q, k, v = qkv.unbind(2)
    lay = Layout.random(200, k=2, seed=1, block=64)
    allow = token_mask(lay, 2, 2, 2, 200, 200, False)
    out = sparsek.attention(q, k, v, lay)
    (dq, dk, dv) = torch.autograd.grad(out.sum(), (q, k, v))
    assert_grads_rule((dq, dk, dv), q, k, v, torch.ones_like(out), allow)
    dout_t = torch.randn(2, 2, 200, 32, generator=g).transpose(1, 2)  # last dimension contiguous
    (dq, dk, dv) = torch.autograd.grad(sparsek.attention(q, k, v, lay), (q, k, v), dout_t)
    assert_grads_rule((dq, dk, dv), q, k, v, dout_t, allow)


def test_lse_is_not_differentiable_and_partial_requires_grad():
    lay = Layout.causal(128, block=64)
    q, k, v, dout = make_inputs(306, 1, 128, 128, 2, 2, 16, torch.float32)
    out, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    (out * dout).sum().add(lse.sum()).backward()  # lse adds nothing, and raises nothing
    ref = op_grads(q, k, v, dout, lay, causal=True)[1:]
    for x, r in zip((q, k, v), ref):
        assert torch.equal(x.grad, r)
    k2 = k.detach()
    out = sparsek.attention(q, k2, v.detach(), lay, causal=True)
    out.backward(dout)
    assert k2.grad is None and q.grad is not None


def test_out_is_refused_when_grad_is_needed():
    lay = Layout.causal(128, block=64)
    q, k, v, _ = make_inputs(307, 1, 128, 128, 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="out= makes the call non-differentiable"):
        sparsek.attention(q, k, v, lay, out=torch.empty(q.shape))
    with torch.no_grad():
        out = torch.empty(q.shape)
        assert sparsek.attention(q, k, v, lay, out=out) is out


def test_backward_is_bitwise_repeatable():
    lay = Layout.random(256, k=2, seed=2, block=64, heads=4)
    q, k, v, dout = make_inputs(308, 2, 256, 256, 4, 2, 32, torch.float16)
    a = op_grads(q, k, v, dout, lay)
    b = op_grads(q, k, v, dout, lay)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_double_backward_is_refused():
    lay = Layout.causal(128, block=64)
    q, k, v, dout = make_inputs(309, 1, 128, 128, 1, 1, 16, torch.float32)
    out = sparsek.attention(q, k, v, lay, causal=True)
    (dq,) = torch.autograd.grad(out, q, dout, create_graph=True)
    with pytest.raises(RuntimeError):
        dq.sum().backward()


# ---------------------------------------------------------------------------
# The ops themselves
# ---------------------------------------------------------------------------


def op_args(lay, q, k, v, causal=False):
    from sparsek.torch_ops import layout_args

    ro, ci, grid = layout_args(lay, q.device)
    return (q, k, v, ro, ci, grid, causal, 0.0, 0)


def test_opcheck():
    # Schema, fake (meta) functions, autograd registration, AOT dispatch.
    import sparsek.torch_ops  # noqa: F401  (registers the ops)

    lay = Layout.random(192, 130, k=2, seed=7, block=64, heads=2)
    q, k, v, dout = make_inputs(310, 2, 192, 130, 4, 2, 16, torch.float32)
    torch.library.opcheck(torch.ops.sparsek.attention_fwd.default, op_args(lay, q, k, v, True))
    with torch.no_grad():
        out, lse = torch.ops.sparsek.attention_fwd(*op_args(lay, q, k, v, True))
    ro, ci, grid = op_args(lay, q, k, v)[3:6]
    bwd_args = (dout, q.detach(), k.detach(), v.detach(), out, lse, ro, ci, grid, True, 0.0, 0, True)
    torch.library.opcheck(torch.ops.sparsek.attention_bwd.default, bwd_args)


def test_op_checks_the_layout_tensors():
    import sparsek.torch_ops  # noqa: F401

    lay = Layout.causal(128, block=64)
    q, k, v, _ = make_inputs(311, 1, 128, 128, 1, 1, 16, torch.float32, requires_grad=False)
    q_, k_, v_, ro, ci, grid, *rest = op_args(lay, q, k, v)
    with pytest.raises(ValueError, match="row_offsets must be a contiguous tensor of 3 entries"):
        torch.ops.sparsek.attention_fwd(q, k, v, ro[:2], ci, grid, *rest)
    with pytest.raises(ValueError, match="col_indices must be a contiguous tensor of at least 3"):
        torch.ops.sparsek.attention_fwd(q, k, v, ro, ci[:1], grid, *rest)
    with pytest.raises(TypeError, match="col_indices must be an int32"):
        torch.ops.sparsek.attention_fwd(q, k, v, ro, ci.long(), grid, *rest)
    with pytest.raises(ValueError, match="grid must be"):
        torch.ops.sparsek.attention_fwd(q, k, v, ro, ci, grid[:6], *rest)
    bad = ro.clone()
    bad[1] = 7  # beyond nnz: the library's content check
    with pytest.raises(sparsek.SparseKError):
        torch.ops.sparsek.attention_fwd(q, k, v, bad, ci, grid, *rest)


def test_grad_preparation_traces_with_fake_cuda_tensors():
    # AOT autograd traces the backward formula with fake tensors (a CUDA
    # compile once failed on data_ptr() there): no data access, and the
    # gradient is copied only when the library could not take it.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sparsek.torch_ops import _usable_grad

    with FakeTensorMode():
        g = torch.empty(2, 64, 4, 16, device="cuda", dtype=torch.float16)
        assert _usable_grad(g) is g
        t = torch.empty(2, 4, 64, 16, device="cuda", dtype=torch.float16).transpose(1, 2)
        assert _usable_grad(t) is t
        odd = torch.empty(2, 64, 4, 17, device="cuda", dtype=torch.float16)[..., :16]  # 34-byte rows
        assert _usable_grad(odd).is_contiguous()
        scalar = torch.ones((), device="cuda", dtype=torch.float16).expand(2, 64, 4, 16)
        assert _usable_grad(scalar).is_contiguous()


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------

COMPILE_BACKENDS = ["aot_eager", "inductor"]


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
def test_compile_fullgraph(backend):
    # inductor compiles the surrounding ops with a C++ compiler on the CPU;
    # aot_eager runs the AOT-autograd graphs eagerly.
    torch._dynamo.reset()
    lay = Layout.random(256, k=2, seed=8, block=64, heads=2)
    q, k, v, dout = make_inputs(312, 1, 256, 256, 4, 2, 16, torch.float32)

    def fn(q, k, v, lay):
        out = sparsek.attention(q * 1.0, k, v, lay, causal=True)
        return (out * dout).sum()

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    got = torch.autograd.grad(compiled(q, k, v, lay), (q, k, v))
    ref = torch.autograd.grad(fn(q, k, v, lay), (q, k, v))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


def test_compile_never_reuses_another_layout():
    # Layouts of one geometry share a graph once their tensors exist; a
    # Layout first met inside a trace gets a graph guarded on it. Either
    # way each call must use its own layout, and a plan of its own.
    torch._dynamo.reset()
    q, k, v, dout = make_inputs(313, 1, 256, 256, 2, 2, 16, torch.float32)
    layouts = [Layout.random(256, k=2, seed=s, block=64, heads=2) for s in range(3)]
    layouts.append(Layout.random(256, k=3, seed=9, block=64, heads=2))
    layouts[1].torch_arrays("cpu")  # made before the trace

    def fn(q, k, v, lay):
        return sparsek.attention(q, k, v, lay, causal=True)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for lay in layouts + layouts[::-1]:
        out = compiled(q, k, v, lay)
        got = torch.autograd.grad(out, (q, k, v), dout)
        allow = token_mask(lay, 1, 2, 2, 256, 256, True)
        ref = dense_attention(q.detach().double(), k.detach().double(), v.detach().double(), allow)
        assert (out.detach().double() - ref).abs().max() < 1e-5
        assert_grads_rule(got, q, k, v, dout, allow)


# ---------------------------------------------------------------------------
# attention_topk
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_attention_topk_gradients(dtype):
    q, k, v, dout = make_inputs(314, 2, 300, 300, 4, 2, 16, dtype)
    opts = dict(sink_blocks=1, local_blocks=1, causal=True, block_q=64, block_k=64)
    with torch.no_grad():
        fused, fused_layout = sparsek.attention_topk(q, k, v, 2, **opts)
    out, lay, lse = sparsek.attention_topk(q, k, v, 2, return_lse=True, **opts)
    assert out.requires_grad and not lse.requires_grad
    np.testing.assert_array_equal(lay.to_mask(), fused_layout.to_mask())
    assert torch.equal(out.detach(), fused)
    got = torch.autograd.grad(out, (q, k, v), dout)
    # The selection is held fixed: the gradients of attention on its layout.
    allow = token_mask(lay, 2, 4, 2, 300, 300, True)
    assert_grads_rule(got, q, k, v, dout, allow)
    with pytest.raises(ValueError, match="out= makes the call non-differentiable"):
        sparsek.attention_topk(q, k, v, 2, out=torch.empty(q.shape, dtype=dtype), **opts)


# ---------------------------------------------------------------------------
# CUDA (skipped without a GPU; failing, not skipped, until the CUDA
# backward exists)
# ---------------------------------------------------------------------------


def flex_grads(q, k, v, dout, lay, causal):
    """out and gradients of FlexAttention (compiled) with the layout's
    BlockMask, for the same inputs."""
    from torch.nn.attention.flex_attention import flex_attention

    Hq, Hkv = q.shape[2], k.shape[2]
    bm = lay.to_block_mask(causal=causal, device=q.device, num_heads=Hq if lay.heads == Hkv and Hkv != Hq else None,
                           mask_mod="layout")
    qf, kf, vf = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    out = torch.compile(flex_attention)(qf, kf, vf, block_mask=bm, enable_gqa=Hq != Hkv)
    out.backward(dout.transpose(1, 2))
    return out.transpose(1, 2), qf.grad.transpose(1, 2), kf.grad.transpose(1, 2), vf.grad.transpose(1, 2)


@requires_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_gradients_against_flex(dtype, D, causal):
    dt = getattr(torch, dtype)
    B, S, Hq, Hkv = 2, 512, 4, 2
    q, k, v, dout = make_inputs(401, B, S, S, Hq, Hkv, D, dt, "cuda")
    lay = Layout.random(S, k=2, seed=4, causal=causal, block=128, batch=B, heads=Hkv)
    out, dq, dk, dv = op_grads(q, k, v, dout, lay, causal)
    fo, fdq, fdk, fdv = flex_grads(q, k, v, dout, lay, causal)
    torch.cuda.synchronize()
    allow = token_mask(lay, B, Hq, Hkv, S, S, causal)
    ref = dense_grads(q, k, v, dout, allow)
    atol = 2e-3 if dtype == "float16" else 1.6e-2
    # FlexAttention plays the same-precision implementation of the rule.
    for name, got, theirs, r in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (fo, fdq, fdk, fdv), ref):
        err = (got.detach().double().cpu() - r).abs().max().item()
        flex_err = (theirs.detach().double().cpu() - r).abs().max().item()
        assert err <= 2 * flex_err + atol, f"{name}: error {err:.3g} > 2 x Flex's {flex_err:.3g} + {atol}"


@requires_cuda
def test_cuda_graph_capture_follows_the_layout():
    # Forward and backward captured in one CUDA graph; replays with new
    # inputs and with layout content written in place between replays (the
    # plan is captured too) match eager runs.
    B, S, H, D = 1, 512, 2, 64
    q, k, v, dout = make_inputs(402, B, S, S, H, H, D, torch.float16, "cuda")
    A = Layout.random(S, k=2, seed=1, block=128, heads=H)
    Bl = Layout.random(S, k=2, seed=2, block=128, heads=H)
    ro, ci = (x.clone() for x in A.torch_arrays("cuda"))
    grid = list(A.grid) + [A.nnz]
    import sparsek.torch_ops  # noqa: F401

    def step():
        out, _ = torch.ops.sparsek.attention_fwd(q, k, v, ro, ci, grid, False, 0.0, 0)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    for lay, seed in ((A, 403), (Bl, 404), (A, 405)):
        ro.copy_(lay.torch_arrays("cuda")[0])
        ci.copy_(lay.torch_arrays("cuda")[1])
        fresh = make_inputs(seed, B, S, S, H, H, D, torch.float16, "cuda")
        with torch.no_grad():
            for x, y in zip((q, k, v, dout), fresh):
                x.copy_(y)
        g.replay()
        torch.cuda.synchronize()
        ref = op_grads(q, k, v, dout, lay)
        for x, y in zip(static, ref):
            assert torch.equal(x, y)


@requires_cuda
def test_cuda_forward_graph_capture_follows_the_layout():
    # The forward alone (runs before the CUDA backward exists): captured
    # with its plan, replayed after layouts of other block counts are
    # written into the same tensors.
    q, k, v, _ = make_inputs(407, 1, 2048, 2048, 4, 4, 64, torch.float16, "cuda", requires_grad=False)
    layouts = [Layout.random(2048, k=n, seed=n, block=128, heads=4) for n in (2, 9)]
    nnz = max(lay.nnz for lay in layouts)
    ro = torch.zeros_like(layouts[0].torch_arrays("cuda")[0])
    ci = torch.zeros(nnz, dtype=torch.int32, device="cuda")
    grid = layouts[0].op_grid()[:6] + [nnz]
    import sparsek.torch_ops  # noqa: F401

    def load(lay):
        r, c = lay.torch_arrays("cuda")
        ro.copy_(r)
        ci[: c.numel()].copy_(c)

    load(layouts[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.sparsek.attention_fwd(q, k, v, ro, ci, grid, False, 0.0, 0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static, _ = torch.ops.sparsek.attention_fwd(q, k, v, ro, ci, grid, False, 0.0, 0)
    for lay in layouts + layouts:
        load(lay)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, sparsek.attention(q, k, v, lay)), lay.nnz


@requires_cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_cuda_compile_forward(mode):
    # inductor, plain and with CUDA graph trees (the ops run between its
    # partitions): Layouts of one geometry, and a DeviceLayout written in
    # place between calls.
    torch._dynamo.reset()
    q, k, v, _ = make_inputs(408, 2, 1024, 1024, 4, 2, 128, torch.bfloat16, "cuda", requires_grad=False)

    def fn(q, k, v, lay):
        return sparsek.attention(q * 1.0, k, v, lay, causal=True) * 2

    compiled = torch.compile(fn, fullgraph=True, mode=mode)
    for lay in [Layout.random(1024, k=2, seed=s, block=128, heads=2) for s in range(3)] * 2:
        assert torch.equal(compiled(q, k, v, lay).clone(), fn(q, k, v, lay))
    sel = [sparsek.pool_select_topk(x, k, 2, sink_blocks=1, causal=True) for x in (q, -q)]
    dl = sparsek.DeviceLayout(sel[0].grid, sel[0].capacity, sel[0].row_offsets.clone(),
                              sel[0].col_indices_buffer.clone())
    for src in sel + sel:
        dl.row_offsets.copy_(src.row_offsets)
        dl.col_indices_buffer.copy_(src.col_indices_buffer)
        assert torch.equal(compiled(q, k, v, dl).clone(), fn(q, k, v, src))


@requires_cuda
def test_cuda_compile_fullgraph_and_topk():
    torch._dynamo.reset()
    q, k, v, dout = make_inputs(406, 2, 1024, 1024, 4, 2, 128, torch.bfloat16, "cuda")
    lay = sparsek.pool_select_topk(q.detach(), k.detach(), 2, sink_blocks=1, local_blocks=1, causal=True)

    def fn(q, k, v, lay):
        return (sparsek.attention(q, k, v, lay, causal=True).float() * dout.float()).sum()

    compiled = torch.compile(fn, fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v, lay), (q, k, v))
    ref = torch.autograd.grad(fn(q, k, v, lay), (q, k, v))
    for g, r in zip(got, ref):
        assert torch.equal(g, r)
    out, lay2 = sparsek.attention_topk(q, k, v, 2, sink_blocks=1, local_blocks=1, causal=True)
    np.testing.assert_array_equal(lay2.to_mask(), lay.to_mask())
    got = torch.autograd.grad(out, (q, k, v), dout)
    assert_grads_rule(got, q, k, v, dout, token_mask(lay.to_host(), 2, 4, 2, 1024, 1024, True), atol=1.6e-2)
