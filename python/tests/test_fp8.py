"""sparsek.quantize_e4m3 and sparsek.attention_fp8: the e4m3 codes against an
independent numpy codec (and torch's own float8 cast), the CPU attention on
e4m3 inputs against a numpy fp64 reference on the dequantized values, the
argument checks, and (with a GPU) the CUDA paths against the CPU ones."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek

from conftest import requires_cuda, requires_torch, seeded_rng

# e4m3fn by its definition, all 256 codes (NaN: S.1111.111).
_CODES = np.arange(256, dtype=np.int64)
_E, _M = (_CODES >> 3) & 15, _CODES & 7
_VALUES = np.where(_E == 0, _M / 8.0 * 2.0**-6, (1 + _M / 8.0) * 2.0 ** (_E - 7.0))
_VALUES = np.where(_CODES >= 128, -_VALUES, _VALUES)
_VALUES[(_E == 15) & (_M == 7)] = np.nan


def decode(y: np.ndarray) -> np.ndarray:
    return _VALUES[y.astype(np.int64)]


def encode(x: np.ndarray) -> np.ndarray:
    """Nearest code among the 127 non-negative finite ones, ties to the even
    code, |x| >= 448 saturating; NaN to 0x7F; sign bit from x."""
    a = np.abs(x.astype(np.float64))
    grid = _VALUES[:127]
    err = np.abs(a[..., None] - grid)
    best = err.min(axis=-1, keepdims=True)
    cand = np.where(err == best, np.arange(127), 10**6)
    even = np.where((cand % 2 == 0) & (cand < 10**6), cand, 10**6).min(axis=-1)
    code = np.where(even < 10**6, even, cand.min(axis=-1))
    code = np.where(a >= 448.0, 0x7E, code)
    code = np.where(np.isnan(a), 0x7F, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantize_reference(x: np.ndarray):
    """x [B, S, H, D] -> (codes, descale [B, H]) by the rule of sparsek.h."""
    xf = x.astype(np.float32)
    amax = np.nanmax(np.abs(xf), axis=(1, 3))
    scaled = (amax > 0) & np.isfinite(amax)
    inv = np.where(scaled, np.float32(448.0) / np.where(scaled, amax, 1), np.float32(1)).astype(np.float32)
    ds = np.where(scaled, amax / np.float32(448.0), np.float32(1)).astype(np.float32)
    y = encode((xf * inv[:, None, :, None]).astype(np.float32))
    return y, ds


def attention_reference(q, k, v, causal, scale=None):
    """fp64 dense attention, K/V heads repeated for GQA. q [B, Sq, Hq, D]."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * (scale if scale is not None else 1 / np.sqrt(D))
    if causal:
        allow = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq)
        s = np.where(allow, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(axis=-1, keepdims=True), vv)


def test_quantize_numpy_matches_reference():
    rng = seeded_rng(3201)
    x = (rng.standard_normal((2, 45, 3, 32)) * 5).astype(np.float16)
    x[0, :, 1, :] = 0  # a zero head: descale 1
    x[1, 7, 2, 3] = np.inf  # inf: scale 1, saturation
    y, ds = sparsek.quantize_e4m3(x)
    yr, dsr = quantize_reference(x)
    np.testing.assert_array_equal(ds, dsr)
    np.testing.assert_array_equal(y, yr)
    assert ds[0, 1] == 1.0 and y[1, 7, 2, 3] == 0x7E


def test_decode_table_and_ties():
    # The reference codec itself: landmarks, and ties to even between 1 and 1.125.
    assert decode(np.array([0x7E, 0x01, 0x08, 0x38]))[:].tolist() == [448.0, 2.0**-9, 2.0**-6, 1.0]
    assert np.isnan(decode(np.array([0x7F, 0xFF]))).all()
    assert encode(np.array([1.0625, 1.1875, -500.0])).tolist() == [0x38, 0x3A, 0xFE]


@requires_torch
def test_quantize_torch_matches_torch_cast():
    import torch

    rng = seeded_rng(3202)
    x = torch.from_numpy(rng.standard_normal((2, 64, 4, 64)).astype(np.float32) * 3).to(torch.bfloat16)
    y, ds = sparsek.quantize_e4m3(x)
    assert y.dtype == torch.float8_e4m3fn and ds.dtype == torch.float32
    amax = x.float().abs().amax(dim=(1, 3))
    torch.testing.assert_close(ds, amax / 448.0, rtol=0, atol=0)
    # In range by construction, so torch's RNE cast is the reference.
    want = (x.float() * (448.0 / amax)[:, None, :, None]).to(torch.float8_e4m3fn)
    assert torch.equal(y.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_fp8_numpy_cpu(causal):
    rng = seeded_rng(3203 + causal)
    B, S, Hq, Hkv, D = 2, 150, 4, 2, 64
    x = {n: (rng.standard_normal((B, S, h, D)) * 2).astype(np.float16) for n, h in (("q", Hq), ("k", Hkv), ("v", Hkv))}
    codes = {n: sparsek.quantize_e4m3(a) for n, a in x.items()}
    deq = {n: decode(y) * ds[:, None, :, None].astype(np.float64) for n, (y, ds) in codes.items()}
    layout = sparsek.Layout.dense(S, S, block=64)
    o, lse = sparsek.attention_fp8(
        codes["q"][0], codes["k"][0], codes["v"][0], layout, q_descale=codes["q"][1],
        k_descale=codes["k"][1], v_descale=codes["v"][1], causal=causal, return_lse=True,
    )
    assert o.dtype == np.float16 and lse.shape == (B, Hq, S)
    ref = attention_reference(deq["q"], deq["k"], deq["v"], causal)
    np.testing.assert_allclose(o.astype(np.float64), ref, rtol=2e-3, atol=2e-3)
    # The descales matter: without V's the output is off by its scale.
    o_wrong = sparsek.attention_fp8(codes["q"][0], codes["k"][0], codes["v"][0], layout,
                                    q_descale=codes["q"][1], k_descale=codes["k"][1], causal=causal)
    assert np.abs(o_wrong.astype(np.float64) - ref).max() > 1.0
    # V pre-transposed (layout="vt"): O and LSE bit for bit.
    vt, vds = sparsek.quantize_e4m3(x["v"], layout="vt")
    ot, lset = sparsek.attention_fp8(
        codes["q"][0], codes["k"][0], vt, layout, q_descale=codes["q"][1], k_descale=codes["k"][1],
        v_descale=vds, causal=causal, return_lse=True, v_layout="vt",
    )
    np.testing.assert_array_equal(o.view(np.uint16), ot.view(np.uint16))
    np.testing.assert_array_equal(lse, lset)


@requires_torch
def test_attention_fp8_torch_cpu_bf16_out():
    import torch

    rng = seeded_rng(3205)
    B, S, H, D = 1, 200, 2, 128
    xs = [torch.from_numpy(rng.standard_normal((B, S, H, D)).astype(np.float32)).to(torch.bfloat16) for _ in range(3)]
    (q, qs), (k, ks), (v, vs) = (sparsek.quantize_e4m3(x) for x in xs)
    layout = sparsek.Layout.causal(S, block=128)
    o = sparsek.attention_fp8(q, k, v, layout, q_descale=qs, k_descale=ks, v_descale=vs, causal=True)
    assert o.dtype == torch.bfloat16
    # V pre-transposed (layout="vt"): the same O bit for bit.
    vt, vts = sparsek.quantize_e4m3(xs[2], layout="vt")
    assert vt.dtype == torch.float8_e4m3fn and tuple(vt.shape) == (B, H, D, 256)
    ot = sparsek.attention_fp8(q, k, vt, layout, q_descale=qs, k_descale=ks, v_descale=vts, causal=True,
                               v_layout="vt")
    assert torch.equal(o.view(torch.int16), ot.view(torch.int16))
    deq = [(t.float() * s[:, None, :, None]).double().numpy() for t, s in ((q, qs), (k, ks), (v, vs))]
    ref = attention_reference(*deq, causal=True)
    np.testing.assert_allclose(o.double().numpy(), ref, rtol=1e-2, atol=1e-2)


def test_attention_fp8_bad_arguments():
    q = np.zeros((1, 64, 1, 64), np.uint8)
    layout = sparsek.Layout.dense(64, 64, block=64)
    with pytest.raises(TypeError, match="e4m3"):
        sparsek.attention_fp8(q.astype(np.float16), q, q, layout)
    with pytest.raises(ValueError, match="q_descale"):
        sparsek.attention_fp8(q, q, q, layout, q_descale=np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match="out_dtype"):
        sparsek.attention_fp8(q, q, q, layout, out_dtype="float32")
    with pytest.raises(ValueError, match="cannot run on data on cpu"):
        sparsek.attention_fp8(q, q, q, layout, backend="cuda")
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        sparsek.quantize_e4m3(np.zeros((1, 4, 1, 8), np.float32))


@requires_cuda
def test_fp8_cuda_against_cpu():
    import torch

    rng = seeded_rng(3206)
    B, S, Hq, Hkv, D = 2, 700, 4, 2, 128
    xs = [torch.from_numpy(rng.standard_normal((B, S, h, D)).astype(np.float32)).to(torch.bfloat16)
          for h in (Hq, Hkv, Hkv)]
    cpu = [sparsek.quantize_e4m3(x) for x in xs]
    gpu = [sparsek.quantize_e4m3(x.cuda()) for x in xs]
    for (yc, dc), (yg, dg) in zip(cpu, gpu):
        assert torch.equal(yc.view(torch.uint8), yg.view(torch.uint8).cpu())
        assert torch.equal(dc, dg.cpu())
    layout = sparsek.Layout.causal(S, block=128)
    oc = sparsek.attention_fp8(cpu[0][0], cpu[1][0], cpu[2][0], layout, q_descale=cpu[0][1],
                               k_descale=cpu[1][1], v_descale=cpu[2][1], causal=True)
    og = sparsek.attention_fp8(gpu[0][0], gpu[1][0], gpu[2][0], layout, q_descale=gpu[0][1],
                               k_descale=gpu[1][1], v_descale=gpu[2][1], causal=True)
    torch.cuda.synchronize()
    # The GPU rounds P to e4m3 before P V (the CPU does not): FP8-sized error.
    err = (og.cpu().float() - oc.float()).abs()
    assert err.max().item() < 0.1 and err.mean().item() < 0.01, (err.max().item(), err.mean().item())
    # V pre-transposed (layout="vt"): both quantizers give the same bytes, and
    # the same P registers times the same V codes give O and LSE bit for bit.
    vt_cpu, vd_cpu = sparsek.quantize_e4m3(xs[2], layout="vt")
    vt_gpu, vd_gpu = sparsek.quantize_e4m3(xs[2].cuda(), layout="vt")
    assert torch.equal(vt_cpu.view(torch.uint8), vt_gpu.view(torch.uint8).cpu())
    assert torch.equal(vd_cpu, vd_gpu.cpu())
    args = dict(q_descale=gpu[0][1], k_descale=gpu[1][1], causal=True, return_lse=True)
    o, lse = sparsek.attention_fp8(gpu[0][0], gpu[1][0], gpu[2][0], layout, v_descale=gpu[2][1], **args)
    ot, lset = sparsek.attention_fp8(gpu[0][0], gpu[1][0], vt_gpu, layout, v_descale=vd_gpu, v_layout="vt", **args)
    torch.cuda.synchronize()
    assert torch.equal(o.view(torch.int16), ot.view(torch.int16))
    assert torch.equal(lse, lset)


@requires_cuda
@pytest.mark.parametrize("block", [(128, 64), (64, 128), (64, 64)])
def test_fp8_cuda_blocks_of_64(block):
    """Blocks of 64 on the FP8 Hopper kernel (the _k64 and _pair kernels):
    against the CPU on the same codes (11 query blocks of 64: an odd one),
    and V^T bit for bit equal to rows V."""
    import torch

    rng = seeded_rng(3210 + block[0] + block[1])
    B, S, Hq, Hkv, D = 1, 700, 4, 2, 64
    xs = [torch.from_numpy(rng.standard_normal((B, S, h, D)).astype(np.float32)).to(torch.bfloat16)
          for h in (Hq, Hkv, Hkv)]
    cpu = [sparsek.quantize_e4m3(x) for x in xs]
    layout = sparsek.Layout.random(S, k=4, seed=11, causal=True, block=block, heads=Hq)
    kw = dict(q_descale=cpu[0][1], k_descale=cpu[1][1], causal=True, return_lse=True)
    oc, lc = sparsek.attention_fp8(cpu[0][0], cpu[1][0], cpu[2][0], layout, v_descale=cpu[2][1], **kw)
    gpu = [(y.cuda(), d.cuda()) for y, d in cpu]
    kw = dict(q_descale=gpu[0][1], k_descale=gpu[1][1], causal=True, return_lse=True)
    og, lg = sparsek.attention_fp8(gpu[0][0], gpu[1][0], gpu[2][0], layout, v_descale=gpu[2][1], **kw)
    vt, vd = sparsek.quantize_e4m3(xs[2].cuda(), layout="vt")
    ot, lt = sparsek.attention_fp8(gpu[0][0], gpu[1][0], vt, layout, v_descale=vd, v_layout="vt", **kw)
    torch.cuda.synchronize()
    # The GPU rounds P to e4m3 before P V (the CPU does not): FP8-sized error.
    err = (og.cpu().float() - oc.float()).abs()
    assert err.max().item() < 0.1 and err.mean().item() < 0.01, (err.max().item(), err.mean().item())
    finite = torch.isfinite(lc)
    assert torch.equal(finite, torch.isfinite(lg.cpu()))
    assert (lg.cpu()[finite] - lc[finite]).abs().max().item() < 0.05
    assert torch.equal(og.view(torch.int16), ot.view(torch.int16))
    assert torch.equal(lg, lt)




def vt_col(s: np.ndarray) -> np.ndarray:
    """The column of key s in V^T (sparsek.h, SK_QUANT_LAYOUT_VT_FP8)."""
    k = s % 32
    return s - k + (k & 16) + 4 * ((k >> 1) & 3) + 2 * ((k >> 3) & 1) + (k & 1)


@pytest.mark.parametrize("S", [1, 33, 150, 256])
def test_quantize_vt_numpy_is_rows_permuted(S):
    rng = seeded_rng(3210 + S)
    B, H, D = 2, 3, 24
    x = (rng.standard_normal((B, S, H, D)) * 3).astype(np.float16)
    y, ds = sparsek.quantize_e4m3(x)
    yt, dst = sparsek.quantize_e4m3(x, layout="vt")
    pad = (S + 127) // 128 * 128
    assert yt.shape == (B, H, D, pad) == sparsek.fp8.vt_shape(B, S, H, D)
    np.testing.assert_array_equal(ds, dst)
    cols = vt_col(np.arange(pad))
    assert sorted(cols) == list(range(pad))
    want = np.zeros((B, H, D, pad), np.uint8)
    want[..., cols[:S]] = y.transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(yt, want)


def test_attention_fp8_vt_bad_arguments():
    q = np.zeros((1, 64, 1, 64), np.uint8)
    vt = np.zeros((1, 1, 64, 128), np.uint8)
    layout = sparsek.Layout.dense(64, 64, block=64)
    with pytest.raises(ValueError, match="V\\^T"):
        sparsek.attention_fp8(q, q, q, layout, v_layout="vt")  # rows shape given as V^T
    with pytest.raises(ValueError, match="v_layout"):
        sparsek.attention_fp8(q, q, vt, layout, v_layout="cols")
    with pytest.raises(ValueError, match="contiguous"):
        sparsek.attention_fp8(q, q, np.zeros((1, 1, 128, 64), np.uint8).transpose(0, 1, 3, 2), layout, v_layout="vt")
    with pytest.raises(ValueError, match="layout"):
        sparsek.quantize_e4m3(np.zeros((1, 4, 1, 8), np.float16), layout="t")
    sparsek.attention_fp8(q, q, vt, layout, v_layout="vt")  # the right shape runs


def test_plan_attention_fp8_runs_like_attention_fp8():
    """plan_attention_fp8: planned once, each run() equals attention_fp8
    bit for bit (new inputs of the planned shapes included); inputs of
    other shapes or strides are refused."""
    rng = seeded_rng(3209)
    B, S, H, D = 1, 200, 2, 64
    x = [(rng.standard_normal((B, S, H, D))).astype(np.float16) for _ in range(4)]
    (q, qd), (k, kd), (v, vd), (q2, _) = (sparsek.quantize_e4m3(a) for a in x)
    layout = sparsek.Layout.window(S, left=100, block=64)
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, causal=True)
    plan = sparsek.plan_attention_fp8(q, k, v, layout, **kw)
    for qq in (q, q2, q):
        o, lse = plan.run(qq, k, v, return_lse=True)
        o1, lse1 = sparsek.attention_fp8(qq, k, v, layout, return_lse=True, **kw)
        np.testing.assert_array_equal(o.view(np.uint16), o1.view(np.uint16))
        np.testing.assert_array_equal(lse, lse1)
    assert np.isfinite(o.astype(np.float32)).all()
    with pytest.raises(ValueError, match="the plan was made for"):
        plan.run(q[:, :100], k, v)
    with pytest.raises(ValueError, match="the plan was made for"):
        plan.run(np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3), k, v)


@requires_cuda
def test_plan_attention_fp8_cuda_runs_like_attention_fp8():
    """The planned FP8 call on the GPU (what bench/run.py --fp8 times): each
    run() bit for bit attention_fp8's O and LSE, rows V and V^T."""
    import torch

    rng = seeded_rng(3210)
    B, S, H, D = 2, 640, 4, 128
    xs = [torch.from_numpy(rng.standard_normal((B, S, H, D)).astype(np.float32)).to(torch.bfloat16).cuda()
          for _ in range(3)]
    (q, qd), (k, kd), (v, vd) = (sparsek.quantize_e4m3(x) for x in xs)
    vt, vtd = sparsek.quantize_e4m3(xs[2], layout="vt")
    layout = sparsek.Layout.random(S, k=2, seed=7, block=128, batch=B, heads=H)
    for vv, dd, vl in ((v, vd, "rows"), (vt, vtd, "vt")):
        kw = dict(q_descale=qd, k_descale=kd, v_descale=dd, v_layout=vl)
        plan = sparsek.plan_attention_fp8(q, k, vv, layout, **kw)
        runs = [plan.run(q, k, vv, return_lse=True) for _ in range(2)]
        o1, lse1 = sparsek.attention_fp8(q, k, vv, layout, return_lse=True, **kw)
        torch.cuda.synchronize()
        for o, lse in runs:
            assert torch.equal(o.view(torch.int16), o1.view(torch.int16)) and torch.equal(lse, lse1), vl
        assert torch.isfinite(o1.float()).all()
