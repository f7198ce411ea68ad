"""torch tensors and FlexAttention BlockMask interop. Skipped without torch;
the CUDA tests also need a GPU and a CUDA build of the library (run them on
the GPU machine: SPARSEK_LIBRARY=build/libsparsek.so PYTHONPATH=python
python3 -m pytest python/tests)."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError

from conftest import HAVE_TORCH, assert_close_rule, make_qkv, requires_cuda, seeded_rng

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch


def as_f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


# ---------------------------------------------------------------------------
# CPU tensors -> CPU backend
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cpu_tensors_use_the_cpu_backend(dtype):
    rng = seeded_rng(41)
    qn, kn, vn = make_qkv(rng, 2, 160, 200, 4, 2, 32)
    dt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(x).to(dt) for x in (qn, kn, vn))
    lay = Layout.random(160, 200, k=2, seed=3, block=64, heads=2)
    out, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
    assert out.dtype == dt and out.device.type == "cpu" and lse.dtype == torch.float32
    qr, kr, vr = (as_f64(x) for x in (q, k, v))
    atol = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}[dtype]
    # The naive run rounds to the output dtype: emulate with float32/16 and
    # compare in float64 (bf16 gets its own atol).
    assert_close_rule(
        as_f64(out).astype(np.float32 if dtype != "float16" else np.float16),
        qr, kr, vr, lay.to_mask(), lay.grid, causal=True, lse=lse.numpy(), atol=atol,
    )


def test_torch_binding_checks():
    q = torch.zeros(1, 128, 2, 16)
    lay = Layout.dense(128, block=64)
    with pytest.raises(TypeError, match="all be numpy arrays or all torch"):
        sparsek.attention(q, q.numpy(), q.numpy(), lay)
    with pytest.raises(TypeError, match="dtypes differ"):
        sparsek.attention(q, q.half(), q, lay)
    with pytest.raises(ValueError, match="last dimension"):
        qt = torch.zeros(1, 128, 16, 2).transpose(2, 3)
        sparsek.attention(qt, q, q, lay)
    with pytest.raises(TypeError, match="not supported"):
        sparsek.attention(q.double(), q.double(), q.double(), lay)
    with pytest.raises(ValueError, match="out has shape"):
        sparsek.attention(q, q, q, lay, out=torch.zeros(1, 128, 2, 8))
    with pytest.raises(ValueError, match="all-zero outer strides"):
        q2 = torch.zeros(2, 128, 2, 16)
        sparsek.attention(q2, q2, q2, lay, out=torch.zeros(1, 1, 1, 16).expand(2, 128, 2, 16))
    with pytest.raises(SparseKError) as e:  # overlapping rows: found by the library
        sparsek.attention(q, q, q, lay, out=torch.zeros(1, 1, 2, 16).expand(1, 128, 2, 16))
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_STRIDE"


# ---------------------------------------------------------------------------
# BlockMask interop
# ---------------------------------------------------------------------------


def _dense(counts, indices, ncols):
    counts = counts.cpu().numpy()
    indices = indices.cpu().numpy()
    out = np.zeros(counts.shape + (ncols,), bool)
    for idx in np.ndindex(counts.shape):
        out[idx][indices[idx][: counts[idx]]] = True
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(512, 512), (448, 700), (700, 448)])
def test_to_block_mask_splits_full_and_partial(causal, sq, sk):
    lay = (Layout.causal(sq, sk, block=128) if causal else Layout.random(sq, sk, k=2, seed=1, block=128, heads=2))
    bm = lay.to_block_mask(causal=causal)
    assert tuple(bm.BLOCK_SIZE) == (128, 128)
    assert tuple(bm.seq_lengths) == (sq, sk)
    cb = lay.col_blocks
    partial = _dense(bm.kv_num_blocks, bm.kv_indices, cb)
    full = _dense(bm.full_kv_num_blocks, bm.full_kv_indices, cb)
    assert not (partial & full).any()
    np.testing.assert_array_equal((partial | full).reshape(-1, lay.row_blocks, cb), lay.to_mask().astype(bool))
    # A full block has every token pair visible and lies inside both sequences.
    for s, i, j in zip(*np.nonzero(full.reshape(-1, lay.row_blocks, cb))):
        assert (i + 1) * 128 <= sq and (j + 1) * 128 <= sk
        if causal:
            assert (j + 1) * 128 - 1 <= i * 128 + (sk - sq)
    # Without splitting, everything is partial.
    bm2 = lay.to_block_mask(causal=causal, split_full=False)
    assert bm2.full_kv_num_blocks is None
    np.testing.assert_array_equal(_dense(bm2.kv_num_blocks, bm2.kv_indices, cb).reshape(-1, lay.row_blocks, cb), lay.to_mask().astype(bool))


@pytest.mark.parametrize("split_full", [False, True])
def test_block_mask_round_trip(split_full):
    lay = Layout.random(640, 384, k=2, seed=8, block=(128, 64), batch=2, heads=3)
    back = Layout.from_block_mask(lay.to_block_mask(split_full=split_full))
    assert back.grid == lay.grid
    np.testing.assert_array_equal(back.to_mask(), lay.to_mask())


def test_from_torch_created_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q, kv):
        return q >= kv

    bm = create_block_mask(causal, B=None, H=None, Q_LEN=1024, KV_LEN=1024, device="cpu")
    lay = Layout.from_block_mask(bm)
    np.testing.assert_array_equal(lay.to_mask(), Layout.causal(1024, block=128).to_mask())


def test_block_mask_expands_kv_heads():
    lay = Layout.random(256, 256, k=1, seed=2, block=128, heads=2)
    bm = lay.to_block_mask(num_heads=6)
    assert bm.kv_num_blocks.shape[:2] == (1, 6)
    m = lay.to_mask().astype(bool)
    full = _dense(bm.full_kv_num_blocks, bm.full_kv_indices, 2) | _dense(bm.kv_num_blocks, bm.kv_indices, 2)
    for h in range(6):
        np.testing.assert_array_equal(full[0, h], m[h // 3])


@pytest.mark.parametrize("causal", [False, True])
def test_flex_attention_agrees_on_cpu(causal):
    from torch.nn.attention.flex_attention import flex_attention

    rng = seeded_rng(43)
    S, H, D = 384, 2, 32
    qn, kn, vn = make_qkv(rng, 1, S, S, H, H, D)
    lay = Layout.random(S, k=2, seed=6, causal=causal, block=128, heads=H)
    q, k, v = (torch.from_numpy(x) for x in (qn, kn, vn))
    ours = sparsek.attention(q, k, v, lay, causal=causal)
    try:
        theirs = flex_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=lay.to_block_mask(causal=causal, mask_mod="layout")
        ).transpose(1, 2)
    except Exception as e:  # flex_attention's CPU path is optional in some builds
        pytest.skip(f"flex_attention does not run on CPU here: {e}")
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# CUDA tensors -> CUDA backend
# ---------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_matches_reference(dtype, D, causal):
    rng = seeded_rng(51)
    dt = getattr(torch, dtype)
    qn, kn, vn = make_qkv(rng, 2, 300, 430, 4, 2, D)
    q, k, v = (torch.from_numpy(x).to("cuda", dt) for x in (qn, kn, vn))
    lay = Layout.random(300, 430, k=2, seed=3, causal=causal, block=128, heads=2)
    out = torch.full_like(q, float("nan"))
    res, lse = sparsek.attention(q, k, v, lay, causal=causal, return_lse=True, out=out)
    torch.cuda.synchronize()
    assert res is out
    qr, kr, vr = (as_f64(x) for x in (q, k, v))
    o = as_f64(out)
    assert_close_rule(
        o.astype(np.float32), qr, kr, vr, lay.to_mask(), lay.grid, causal=causal, lse=lse.cpu().numpy(),
        atol=2e-3 if dtype == "float16" else 1.6e-2,
    )


@requires_cuda
def test_cuda_on_a_side_stream_and_plan_reuse():
    rng = seeded_rng(52)
    qn, kn, vn = make_qkv(rng, 1, 512, 512, 2, 2, 64)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.float16) for x in (qn, kn, vn))
    lay = Layout.causal(512, block=128)
    ref = sparsek.attention(q, k, v, lay, causal=True)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        plan = sparsek.plan_attention(q, k, v, lay, causal=True)
        outs = [plan.run(q, k, v) for _ in range(3)]
    torch.cuda.synchronize()
    for o in outs:
        assert torch.equal(o, ref)
    # The layout is uploaded once per device.
    assert lay.device_view("cuda") is lay.device_view(q.device)


@requires_cuda
def test_cuda_binding_checks():
    q = torch.zeros(1, 128, 2, 64, device="cuda", dtype=torch.float16)
    lay = Layout.dense(128, block=64)
    with pytest.raises(ValueError, match="different devices"):
        sparsek.attention(q, q.cpu(), q.cpu(), lay)
    with pytest.raises(TypeError, match="CPU backend only"):
        sparsek.attention(q.float(), q.float(), q.float(), lay)
    with pytest.raises(ValueError, match="out is on"):
        sparsek.attention(q, q, q, lay, out=torch.zeros(1, 128, 2, 64, dtype=torch.float16))
    with pytest.raises(SparseKError) as e:
        sparsek.attention(q, q, q, Layout.dense(256, block=64))
    assert e.value.status_name == "SK_STATUS_BAD_LAYOUT_MISMATCH"


@requires_cuda
@pytest.mark.parametrize("n", [64, 60])
def test_cuda_bsr_gemm_matches_dense(n):
    # n = 60: B and C are column slices of 64-wide tensors (16-byte rows for
    # CUDA), and C's rows do not end on 16 bytes: the portable kernel on Hopper.
    lay = Layout.random(256, 256, k=1, seed=1, block=128)
    vals = torch.randn(lay.nnz, 128, 128, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 64, device="cuda", dtype=torch.float16)[:, :n]
    c_full = torch.full((256, 64), float("nan"), device="cuda", dtype=torch.float16)
    c = sparsek.bsr_gemm(vals, b, lay, c=c_full[:, :n])
    assert torch.isnan(c_full[:, n:]).all()  # C's padding untouched
    torch.cuda.synchronize()
    ro, ci = lay.row_offsets, lay.col_indices
    a = torch.zeros(256, 256, dtype=torch.float64)
    for r in range(2):
        for idx in range(ro[r], ro[r + 1]):
            a[r * 128 : (r + 1) * 128, ci[idx] * 128 : (ci[idx] + 1) * 128] = vals[idx].double().cpu()
    torch.testing.assert_close(c.double().cpu(), a @ b.double().cpu(), rtol=1e-2, atol=1e-1)
