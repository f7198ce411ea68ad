"""The top-k selection binding: block_pool, select_topk, pool_select_topk,
layout_from_scores, attention_topk, DeviceLayout.

numpy (CPU backend) tests run everywhere: the selection against the host
builder Layout.topk on the same scores, the pooling against numpy means
(with tails, GQA and strided inputs), attention_topk against attention() on
the layout select_topk makes, and bad inputs. The torch CUDA tests skip
without torch, a GPU or a CUDA build (run them on the GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import DeviceLayout, Layout, SparseKError

from conftest import HAVE_TORCH, assert_close_rule, make_qkv, requires_cuda, requires_torch, seeded_rng

try:
    import ml_dtypes
except ImportError:  # optional
    ml_dtypes = None


def numpy_pool(x, block):
    """[B, S, H, D] -> fp64 block means [B, H, ceil(S / block), D]."""
    x = np.asarray(x).astype(np.float64)
    B, S, H, D = x.shape
    nb = -(-S // block)
    out = np.zeros((B, H, nb, D))
    for i in range(nb):
        out[:, :, i] = x[:, i * block : min(S, (i + 1) * block)].mean(axis=1)
    return out


def numpy_scores(pq, pk, scale=None, per_kv_head=False):
    """fp64 block scores rounded once to fp32: [B * heads, rb, cb]."""
    pq = np.asarray(pq, np.float64)
    pk = np.asarray(pk, np.float64)
    B, Hq, rb, D = pq.shape
    Hkv = pk.shape[1]
    g = Hq // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    kk = np.repeat(pk, g, axis=1)  # [B, Hq, cb, D]
    s = np.einsum("bhid,bhjd->bhij", pq, kk)
    if per_kv_head:
        s = s.reshape(B, Hkv, g, rb, -1).sum(axis=2)
    return (s * scale).astype(np.float32).reshape(-1, rb, s.shape[-1])


def assert_same_layout(a, b):
    assert a.grid == b.grid
    np.testing.assert_array_equal(a.row_offsets, b.row_offsets)
    np.testing.assert_array_equal(a.col_indices, b.col_indices)
    assert a.nnz == b.nnz


OPTION_SETS = [
    dict(k=2),
    dict(k=3, causal=True),
    dict(k=1, sink_blocks=1, local_blocks=2, causal=True),
    dict(k=0, sink_blocks=2, local_blocks=1),
    dict(k=50, causal=True),  # k above the candidates: every candidate
]

# ---------------------------------------------------------------------------
# Selection against the host builder
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("sq,sk,bq,bk", [(512, 512, 64, 64), (300, 700, 64, 128), (700, 300, 128, 64)])
def test_layout_from_scores_equals_layout_topk(opts, sq, sk, bq, bk):
    rng = seeded_rng(101)
    rb, cb = -(-sq // bq), -(-sk // bk)
    # Few distinct values: many ties, which go to the lower block index.
    scores = rng.integers(-3, 4, size=(2, 3, rb, cb)).astype(np.float32)
    scores[0, 0, 0, :2] = np.nan
    scores[1, 2, -1, 1] = -np.inf
    scores[1, 1, 1, :] = np.nan  # a row with nothing pickable by score
    ours = sparsek.layout_from_scores(scores, seq_q=sq, seq_k=sk, block_q=bq, block_k=bk, **opts)
    ref = Layout.topk(scores, sq, sk, block=(bq, bk), **opts)
    assert isinstance(ours, Layout)
    assert_same_layout(ours, ref)
    ours.validate()


def test_layout_from_scores_shapes_and_the_real_count():
    rng = seeded_rng(102)
    scores = rng.standard_normal((6, 4, 4)).astype(np.float32)
    scores[:, :, 1:] = np.nan  # only block 0 is pickable: rows are short
    lay3 = sparsek.layout_from_scores(scores, 2, batch=2)
    assert (lay3.batch, lay3.heads) == (2, 3)
    grid, cap = sparsek.topk_capacity(2, 512, 512, 3, 3, 2)
    assert cap == 6 * 4 * 2 and grid == lay3.grid
    assert lay3.nnz == 6 * 4 < cap  # the real count, not the capacity
    np.testing.assert_array_equal(lay3.to_mask()[:, :, 0], 1)
    lay4 = sparsek.layout_from_scores(scores.reshape(2, 3, 4, 4), 2)
    assert_same_layout(lay3, lay4)
    one = sparsek.layout_from_scores(scores[0].astype(np.float64), 1)
    assert (one.batch, one.heads, one.nnz) == (1, 1, 4)


@pytest.mark.parametrize("per_kv_head", [False, True])
@pytest.mark.parametrize("opts", OPTION_SETS[:3])
def test_select_topk_equals_layout_topk_on_the_same_scores(per_kv_head, opts):
    rng = seeded_rng(103)
    B, Hq, Hkv, D, sq, sk, bq, bk = 2, 4, 2, 32, 450, 610, 64, 128
    rb, cb = -(-sq // bq), -(-sk // bk)
    pq = rng.standard_normal((B, Hq, rb, D)).astype(np.float32)
    pk = rng.standard_normal((B, Hkv, cb, D)).astype(np.float32)
    ours = sparsek.select_topk(pq, pk, seq_q=sq, seq_k=sk, block_q=bq, block_k=bk, per_kv_head=per_kv_head, **opts)
    heads = Hkv if per_kv_head else Hq
    ref = Layout.topk(numpy_scores(pq, pk, per_kv_head=per_kv_head), sq, sk, block=(bq, bk), batch=B, heads=heads, **opts)
    assert_same_layout(ours, ref)


@pytest.mark.parametrize("per_kv_head", [False, True])
def test_pool_select_topk_equals_block_pool_then_select_topk(per_kv_head):
    rng = seeded_rng(104)
    q, k, _ = make_qkv(rng, 2, 450, 610, 4, 2, 32)
    opts = dict(sink_blocks=1, local_blocks=2, causal=True, per_kv_head=per_kv_head, block_q=64, block_k=128)
    ours = sparsek.pool_select_topk(q, k, 3, **opts)
    pq, pk = sparsek.block_pool(q, k, 64, 128)
    ref = sparsek.select_topk(pq, pk, 3, seq_q=450, seq_k=610, **opts)
    assert_same_layout(ours, ref)
    with pytest.raises(SparseKError) as e:
        sparsek.pool_select_topk(q, k, -1)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_VALUE" and "desc->k = -1" in e.value.message
    with pytest.raises(ValueError, match="head_dim differs"):
        sparsek.pool_select_topk(q, k[..., :16], 2)


def test_select_topk_ties_on_exact_integer_scores():
    # Integer pooled values and scale 1: every score is exact in fp32 and
    # fp64, so ties are real ties, broken towards the lower index.
    rng = seeded_rng(104)
    pq = rng.integers(-1, 2, size=(1, 2, 8, 8)).astype(np.float32)
    pk = rng.integers(-1, 2, size=(1, 2, 8, 8)).astype(np.float32)
    ours = sparsek.select_topk(pq, pk, 3, scale=1.0, block_q=64, block_k=64)
    s = np.einsum("bhid,bhjd->bhij", pq, pk).reshape(2, 8, 8)
    ref = Layout.topk(s, block=64, heads=2, k=3)
    assert_same_layout(ours, ref)
    # A negative scale reverses the order.
    rev = sparsek.select_topk(pq, pk, 3, scale=-1.0, block_q=64, block_k=64)
    assert_same_layout(rev, Layout.topk(-s, block=64, heads=2, k=3))


# ---------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------

POOL_DTYPES = [np.float32, np.float16] + ([ml_dtypes.bfloat16] if ml_dtypes is not None else [])


@pytest.mark.parametrize("dtype", POOL_DTYPES)
@pytest.mark.parametrize("sq,sk,bq,bk", [(256, 256, 64, 64), (300, 433, 128, 64), (65, 1, 64, 128)])
def test_block_pool_equals_numpy_means(dtype, sq, sk, bq, bk):
    rng = seeded_rng(105)
    q, k, _ = make_qkv(rng, 2, sq, sk, 6, 2, 24, dtype)
    pq, pk = sparsek.block_pool(q, k, bq, bk)
    assert pq.dtype == np.float32 and pk.dtype == np.float32
    assert pq.shape == (2, 6, -(-sq // bq), 24) and pk.shape == (2, 2, -(-sk // bk), 24)
    # fp32 sums of <= 128 values: well inside 1e-5 of the fp64 means.
    np.testing.assert_allclose(pq, numpy_pool(q, bq), rtol=0, atol=1e-5)
    np.testing.assert_allclose(pk, numpy_pool(k, bk), rtol=0, atol=1e-5)


def test_block_pool_strided_inputs():
    rng = seeded_rng(106)
    # [B, H, S, D] storage seen as [B, S, H, D], and every other head.
    qs = rng.standard_normal((2, 4, 200, 16)).astype(np.float32).transpose(0, 2, 1, 3)
    ks = rng.standard_normal((2, 200, 4, 16)).astype(np.float32)[:, :, ::2]
    pq, pk = sparsek.block_pool(qs, ks, 64, 64)
    np.testing.assert_allclose(pq, numpy_pool(qs, 64), rtol=0, atol=1e-5)
    np.testing.assert_allclose(pk, numpy_pool(ks, 64), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------
# attention_topk
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        dict(B=1, sq=512, sk=512, Hq=2, Hkv=2, D=32, bq=64, bk=64, k=2, sinks=0, local=0, causal=False, pkv=False),
        dict(B=2, sq=300, sk=430, Hq=4, Hkv=2, D=32, bq=64, bk=128, k=1, sinks=1, local=1, causal=True, pkv=False),
        dict(B=1, sq=384, sk=384, Hq=6, Hkv=2, D=16, bq=128, bk=64, k=2, sinks=1, local=2, causal=True, pkv=True),
        dict(B=1, sq=200, sk=100, Hq=2, Hkv=1, D=16, bq=64, bk=64, k=1, sinks=0, local=1, causal=True, pkv=True),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_attention_topk_equals_attention_on_the_selected_layout(cfg, dtype):
    rng = seeded_rng(107)
    c = cfg
    q, k, v = make_qkv(rng, c["B"], c["sq"], c["sk"], c["Hq"], c["Hkv"], c["D"], dtype)
    opts = dict(sink_blocks=c["sinks"], local_blocks=c["local"], causal=c["causal"], per_kv_head=c["pkv"])
    out, lay, lse = sparsek.attention_topk(q, k, v, c["k"], block_q=c["bq"], block_k=c["bk"], return_lse=True, **opts)
    pq, pk = sparsek.block_pool(q, k, c["bq"], c["bk"])
    sel = sparsek.select_topk(pq, pk, c["k"], seq_q=c["sq"], seq_k=c["sk"], block_q=c["bq"], block_k=c["bk"], **opts)
    assert_same_layout(lay, sel)
    assert lay.heads == (c["Hkv"] if c["pkv"] else c["Hq"]) and lay.batch == c["B"]
    ref_out, ref_lse = sparsek.attention(q, k, v, sel, causal=c["causal"], return_lse=True)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    assert_close_rule(out, q, k, v, lay.to_mask(), lay.grid, causal=c["causal"], lse=lse)


def test_attention_topk_return_forms_and_out():
    rng = seeded_rng(108)
    q, k, v = make_qkv(rng, 1, 256, 256, 2, 2, 16)
    o1 = sparsek.attention_topk(q, k, v, 2, block_q=64, block_k=64, return_layout=False)
    assert isinstance(o1, np.ndarray) and o1.shape == q.shape
    o2, lse = sparsek.attention_topk(q, k, v, 2, block_q=64, block_k=64, return_layout=False, return_lse=True)
    assert lse.shape == (1, 2, 256) and lse.dtype == np.float32
    out = np.full_like(q, np.nan)
    res, lay = sparsek.attention_topk(q, k, v, 2, block_q=64, block_k=64, out=out)
    assert res is out and not np.isnan(out).any()
    np.testing.assert_array_equal(o1, out)
    np.testing.assert_array_equal(o2, out)
    assert lay.nnz == 4 * 2 * 2  # 4 rows x k = 2, per query head
    # A scale changes both the scores and the softmax.
    o3 = sparsek.attention_topk(q, k, v, 2, block_q=64, block_k=64, scale=0.5, return_layout=False)
    assert not np.array_equal(o3, out)


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


def test_bad_inputs_block_pool():
    q = np.zeros((1, 128, 2, 16), np.float32)
    with pytest.raises(ValueError, match="4 dimensions"):
        sparsek.block_pool(q[0], q)
    with pytest.raises(TypeError, match="dtypes differ"):
        sparsek.block_pool(q, q.astype(np.float16))
    with pytest.raises(TypeError, match="not supported"):
        sparsek.block_pool(q.astype(np.float64), q.astype(np.float64))
    with pytest.raises(ValueError, match="head_dim differs"):
        sparsek.block_pool(q, np.zeros((1, 128, 2, 8), np.float32))
    with pytest.raises(ValueError, match="batch differs"):
        sparsek.block_pool(q, np.zeros((2, 128, 2, 16), np.float32))
    with pytest.raises(ValueError, match="multiple of k heads"):
        sparsek.block_pool(np.zeros((1, 128, 3, 16), np.float32), q)
    with pytest.raises(ValueError, match="block_q = 96 must be 64 or 128"):
        sparsek.block_pool(q, q, 96)
    with pytest.raises(TypeError, match="block_k must be an int"):
        sparsek.block_pool(q, q, 64, 64.0)
    with pytest.raises(ValueError, match="CPU backend only|cannot run on data on cpu"):
        sparsek.block_pool(q, q, backend="cuda")
    with pytest.raises(ValueError, match="last dimension"):
        sparsek.block_pool(np.zeros((1, 128, 16, 2), np.float32).transpose(0, 1, 3, 2), q)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        sparsek.block_pool([[1.0]], q)


def test_bad_inputs_select_topk():
    pq = np.zeros((1, 2, 4, 16), np.float32)
    pk = np.zeros((1, 2, 4, 16), np.float32)
    with pytest.raises(TypeError, match="float32"):
        sparsek.select_topk(pq.astype(np.float16), pk, 2)
    with pytest.raises(ValueError, match="contiguous"):
        sparsek.select_topk(np.zeros((1, 4, 2, 16), np.float32).transpose(0, 2, 1, 3), pk, 2)
    with pytest.raises(ValueError, match="4 dimensions"):
        sparsek.select_topk(pq[0], pk, 2)
    with pytest.raises(ValueError, match="head_dim differs"):
        sparsek.select_topk(pq, np.zeros((1, 2, 4, 8), np.float32), 2)
    with pytest.raises(ValueError, match="multiple of pooled_k heads"):
        sparsek.select_topk(np.zeros((1, 3, 4, 16), np.float32), pk, 2)
    with pytest.raises(ValueError, match=r"seq_q = 600 does not fit pooled_q's 4 blocks"):
        sparsek.select_topk(pq, pk, 2, seq_q=600)
    with pytest.raises(ValueError, match=r"seq_k = 384 does not fit"):
        sparsek.select_topk(pq, pk, 2, seq_k=384)
    with pytest.raises(TypeError, match="k must be an int"):
        sparsek.select_topk(pq, pk, 2.5)
    with pytest.raises(ValueError, match="scale"):
        sparsek.select_topk(pq, pk, 2, scale=float("inf"))
    with pytest.raises(SparseKError) as e:  # range checks are the library's
        sparsek.select_topk(pq, pk, -1)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_VALUE" and "desc->k = -1" in e.value.message
    with pytest.raises(SparseKError) as e:
        sparsek.select_topk(pq, pk, 1, sink_blocks=-2)
    assert "desc->sink_blocks = -2" in e.value.message
    with pytest.raises(SparseKError) as e:
        sparsek.select_topk(pq, pk, 1, local_blocks=-1)
    assert "desc->local_blocks = -1" in e.value.message


def test_bad_inputs_layout_from_scores():
    s = np.zeros((2, 3, 4, 4), np.float32)
    with pytest.raises(TypeError, match="floating"):
        sparsek.layout_from_scores(s.astype(np.int32), 1)
    with pytest.raises(ValueError, match="2 to 4 dimensions"):
        sparsek.layout_from_scores(np.zeros(4, np.float32), 1)
    with pytest.raises(ValueError, match="6 slices"):
        sparsek.layout_from_scores(s.reshape(6, 4, 4), 1, batch=4)
    with pytest.raises(ValueError, match="disagree"):
        sparsek.layout_from_scores(s, 1, heads=2)
    with pytest.raises(ValueError, match="one slice"):
        sparsek.layout_from_scores(s[0, 0], 1, heads=2)
    with pytest.raises(ValueError, match="seq_q = 100 does not fit"):
        sparsek.layout_from_scores(s, 1, seq_q=100)
    with pytest.raises(SparseKError) as e:
        sparsek.layout_from_scores(s, -3)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_VALUE"


def test_bad_inputs_attention_topk_write_nothing():
    rng = seeded_rng(109)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    out = np.full_like(q, np.nan)
    with pytest.raises(SparseKError) as e:
        sparsek.attention_topk(q, k, v, -1, block_q=64, block_k=64, out=out)
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_VALUE"
    assert np.isnan(out).all()  # nothing written
    with pytest.raises(ValueError, match="out has shape"):
        sparsek.attention_topk(q, k, v, 1, out=np.zeros((1, 128, 2, 8), np.float32))
    with pytest.raises(TypeError, match="out.dtype"):
        sparsek.attention_topk(q, k, v, 1, out=np.zeros_like(q, np.float16))
    ro = np.zeros_like(q)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        sparsek.attention_topk(q, k, v, 1, out=ro)
    with pytest.raises(ValueError, match="k .* and v .* must have the same shape"):
        sparsek.attention_topk(q, k, v[:, :64], 1)
    with pytest.raises(TypeError, match="dtypes differ"):
        sparsek.attention_topk(q, k, v.astype(np.float16), 1)
    with pytest.raises(ValueError, match="block_k = 32"):
        sparsek.attention_topk(q, k, v, 1, block_k=32)
    with pytest.raises(ValueError, match="scale"):
        sparsek.attention_topk(q, k, v, 1, scale=0.0)


def test_attention_still_refuses_a_non_layout():
    q = np.zeros((1, 64, 1, 16), np.float32)
    with pytest.raises(TypeError, match="sparsek.Layout"):
        sparsek.attention(q, q, q, "not a layout")


def test_exports():
    for name in ("block_pool", "select_topk", "layout_from_scores", "attention_topk", "topk_capacity", "DeviceLayout"):
        assert name in sparsek.__all__ and hasattr(sparsek, name)


# ---------------------------------------------------------------------------
# torch: CPU tensors (CPU backend) and CUDA tensors (CUDA backend)
# ---------------------------------------------------------------------------

if HAVE_TORCH:
    import torch


@requires_torch
def test_torch_cpu_tensors_use_the_cpu_backend():
    rng = seeded_rng(110)
    qn, kn, vn = make_qkv(rng, 1, 300, 300, 4, 2, 16)
    q, k, v = (torch.from_numpy(x) for x in (qn, kn, vn))
    pq, pk = sparsek.block_pool(q, k, 64, 64)
    assert isinstance(pq, torch.Tensor) and pq.device.type == "cpu"
    pqn, pkn = sparsek.block_pool(qn, kn, 64, 64)
    np.testing.assert_array_equal(pq.numpy(), pqn)
    lay = sparsek.select_topk(pq, pk, 2, causal=True, seq_q=300, seq_k=300, block_q=64, block_k=64)
    assert isinstance(lay, Layout)
    out, lay2 = sparsek.attention_topk(q, k, v, 2, causal=True, block_q=64, block_k=64)
    assert isinstance(out, torch.Tensor)
    assert_same_layout(lay, lay2)


@requires_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_block_pool_matches_numpy(dtype):
    rng = seeded_rng(111)
    qn, kn, _ = make_qkv(rng, 2, 300, 433, 4, 2, 64)
    dt = getattr(torch, dtype)
    q, k = torch.from_numpy(qn).to("cuda", dt), torch.from_numpy(kn).to("cuda", dt)
    pq, pk = sparsek.block_pool(q, k, 128, 64)
    assert pq.device == q.device and pq.dtype == torch.float32
    torch.cuda.synchronize()
    np.testing.assert_allclose(pq.cpu().numpy(), numpy_pool(q.float().cpu().numpy(), 128), atol=2e-5, rtol=0)
    np.testing.assert_allclose(pk.cpu().numpy(), numpy_pool(k.float().cpu().numpy(), 64), atol=2e-5, rtol=0)


@requires_cuda
@pytest.mark.parametrize("opts", OPTION_SETS)
def test_cuda_layout_from_scores_equals_layout_topk(opts):
    rng = seeded_rng(112)
    sq, sk, bq, bk = 700, 900, 64, 128
    rb, cb = -(-sq // bq), -(-sk // bk)
    scores = rng.integers(-3, 4, size=(2, 3, rb, cb)).astype(np.float32)
    scores[1, 1, 1, :] = np.nan
    s_dev = torch.from_numpy(scores).cuda()
    lay = sparsek.layout_from_scores(s_dev, seq_q=sq, seq_k=sk, block_q=bq, block_k=bk, **opts)
    assert isinstance(lay, DeviceLayout) and lay.row_offsets.is_cuda
    assert "not read" in repr(lay)  # nothing copied back yet
    ref = Layout.topk(scores, sq, sk, block=(bq, bk), **opts)
    assert lay.nnz == ref.nnz == int(lay.row_offsets[-1].item()) <= lay.capacity
    assert_same_layout(lay.to_host(), ref)
    np.testing.assert_array_equal(lay.col_indices.cpu().numpy(), ref.col_indices)


@requires_cuda
@pytest.mark.parametrize("per_kv_head", [False, True])
def test_cuda_select_topk_equals_cpu_on_exact_scores(per_kv_head):
    # Integer pooled values, scale 1: GPU and CPU scores are exact, so the
    # layouts must agree bit for bit, ties included.
    rng = seeded_rng(113)
    pq = rng.integers(-2, 3, size=(2, 6, 12, 64)).astype(np.float32)
    pk = rng.integers(-2, 3, size=(2, 2, 14, 64)).astype(np.float32)
    opts = dict(sink_blocks=1, local_blocks=2, causal=True, per_kv_head=per_kv_head, scale=1.0,
                seq_q=1500, seq_k=1700, block_q=128, block_k=128)
    ref = sparsek.select_topk(pq, pk, 3, **opts)
    lay = sparsek.select_topk(torch.from_numpy(pq).cuda(), torch.from_numpy(pk).cuda(), 3, **opts)
    assert isinstance(lay, DeviceLayout)
    assert_same_layout(lay.to_host(), ref)


@requires_cuda
@pytest.mark.parametrize("D", [64, 96, 128])
def test_cuda_pool_select_topk_equals_the_two_calls(D):
    # D 64 / 128 on Hopper: the pooling writes the scoring's split operands;
    # D 96: the two-call chain inside. Same layout either way.
    rng = seeded_rng(115)
    qn, kn, _ = make_qkv(rng, 2, 1000, 1300, 4, 2, D)
    q, k = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (qn, kn))
    opts = dict(sink_blocks=2, local_blocks=2, causal=True)
    lay = sparsek.pool_select_topk(q, k, 4, **opts)
    assert isinstance(lay, DeviceLayout)
    pq, pk = sparsek.block_pool(q, k)
    sel = sparsek.select_topk(pq, pk, 4, seq_q=1000, seq_k=1300, **opts)
    assert_same_layout(lay.to_host(), sel.to_host())


@requires_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_attention_topk(dtype, causal):
    rng = seeded_rng(114)
    dt = getattr(torch, dtype)
    qn, kn, vn = make_qkv(rng, 2, 700, 900, 4, 2, 64)
    q, k, v = (torch.from_numpy(x).to("cuda", dt) for x in (qn, kn, vn))
    opts = dict(sink_blocks=1, local_blocks=1, causal=causal)
    out = torch.full_like(q, float("nan"))
    res, lay, lse = sparsek.attention_topk(q, k, v, 2, out=out, return_lse=True, **opts)
    assert res is out and isinstance(lay, DeviceLayout)
    # The same selection done in steps on the device gives the same layout.
    pq, pk = sparsek.block_pool(q, k)
    sel = sparsek.select_topk(pq, pk, 2, seq_q=700, seq_k=900, **opts)
    assert_same_layout(lay.to_host(), sel.to_host())
    # attention() takes the DeviceLayout as it is, and agrees exactly.
    again = sparsek.attention(q, k, v, lay, causal=causal)
    torch.cuda.synchronize()
    assert torch.equal(again, out)
    host = lay.to_host()
    assert_close_rule(
        out.double().cpu().numpy().astype(np.float32), q.double().cpu().numpy(), k.double().cpu().numpy(),
        v.double().cpu().numpy(), host.to_mask(), host.grid, causal=causal, lse=lse.cpu().numpy(),
        atol=2e-3 if dtype == "float16" else 1.6e-2,
    )


@requires_cuda
def test_cuda_side_stream_and_device_layout_rules():
    rng = seeded_rng(115)
    qn, kn, vn = make_qkv(rng, 1, 512, 512, 2, 2, 64)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.float16) for x in (qn, kn, vn))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out, lay = sparsek.attention_topk(q, k, v, 2)
    # nnz is read on the selection's stream, whatever the current one is.
    assert lay.nnz == 2 * 4 * 2
    with pytest.raises(TypeError, match="to_host"):
        lay.view()
    with pytest.raises(TypeError, match="to_host"):
        sparsek.attention(qn, kn, vn, lay)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="lives on"):
            lay.device_view("cuda:1")
    with pytest.raises(ValueError, match="numpy arrays run on the CPU backend only|cannot run"):
        sparsek.select_topk(np.zeros((1, 1, 4, 8), np.float32), np.zeros((1, 1, 4, 8), np.float32), 1, backend="cuda")
