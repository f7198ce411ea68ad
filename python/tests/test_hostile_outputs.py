"""Outputs the library must not write (issue 27, defect 4) and outputs that
alias inputs: every function that writes into a caller's array refuses a
read-only one before any C call (ValueError naming it, nothing written),
and aliasing found by the library surfaces as a clean SparseKError with
nothing written. Crashing cases run in a subprocess, so that a regression
fails the test instead of killing pytest."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import Layout, SparseKError

from conftest import assert_refused, make_qkv, requires_torch, run_python, seeded_rng


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# ---------------------------------------------------------------------------
# numpy: writeable=False and read-only memmaps
# ---------------------------------------------------------------------------


def test_bsr_gemm_refuses_a_read_only_c_and_leaves_it():
    lay = Layout.dense(64, 64, block=64)
    c = read_only(np.full((64, 32), 7.0, np.float32))
    with pytest.raises(ValueError, match="c is read-only"):
        sparsek.bsr_gemm(np.ones((1, 64, 64), np.float32), np.ones((64, 32), np.float32), lay, c=c)
    assert (c == 7.0).all()


def test_bsr_gemm_refuses_a_read_only_memmap_c(tmp_path):
    # Before the fix: SIGSEGV writing into the PROT_READ mapping.
    r = run_python(
        """
        import numpy as np, sparsek
        np.zeros((64, 32), np.float32).tofile("c.bin")
        c = np.memmap("c.bin", dtype=np.float32, mode="r", shape=(64, 32))
        lay = sparsek.Layout.dense(64, 64, block=64)
        attempt(lambda: sparsek.bsr_gemm(np.ones((1, 64, 64), np.float32), np.ones((64, 32), np.float32), lay, c=c))
        """,
        tmp_path,
    )
    assert_refused(r, "ValueError: c is read-only")


@pytest.mark.parametrize("entry", ["attention", "plan_run", "attention_topk"])
def test_attention_outputs_refuse_read_only(entry):
    rng = seeded_rng(271)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.dense(128, block=64)
    out = read_only(np.full(q.shape, 3.0, np.float32))
    with pytest.raises(ValueError, match="out is read-only"):
        if entry == "attention":
            sparsek.attention(q, k, v, lay, out=out)
        elif entry == "plan_run":
            sparsek.plan_attention(q, k, v, lay).run(q, k, v, out=out)
        else:
            sparsek.attention_topk(q, k, v, 1, block_q=64, block_k=64, out=out)
    assert (out == 3.0).all()


def test_attention_refuses_a_read_only_memmap_out(tmp_path):
    r = run_python(
        """
        import numpy as np, sparsek
        q = np.ones((1, 128, 2, 16), np.float32)
        q.tofile("o.bin")
        out = np.memmap("o.bin", dtype=np.float32, mode="r", shape=q.shape)
        attempt(lambda: sparsek.attention(q, q, q, sparsek.Layout.dense(128, block=64), out=out))
        """,
        tmp_path,
    )
    assert_refused(r, "ValueError: out is read-only")


# ---------------------------------------------------------------------------
# Aliasing: the library's checks, surfacing as SparseKError, nothing written
# ---------------------------------------------------------------------------


def test_attention_out_aliasing_an_input_is_a_clean_error():
    rng = seeded_rng(272)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.dense(128, block=64)
    for name in ("q", "k", "v"):
        arrays = {"q": q.copy(), "k": k.copy(), "v": v.copy()}
        before = arrays[name].copy()
        with pytest.raises(SparseKError) as e:
            sparsek.attention(arrays["q"], arrays["k"], arrays["v"], lay, out=arrays[name])
        assert e.value.category == 1 and "o" in e.value.message
        assert np.array_equal(arrays[name], before), f"out = {name}: written on failure"


def test_attention_topk_out_aliasing_k_is_a_clean_error():
    rng = seeded_rng(273)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    before = k.copy()
    with pytest.raises(SparseKError) as e:
        sparsek.attention_topk(q, k, v, 1, block_q=64, block_k=64, out=k)
    assert e.value.category == 1
    assert np.array_equal(k, before)


def test_bsr_gemm_c_aliasing_a_values_is_a_clean_error():
    lay = Layout.dense(64, 64, block=64)
    a = np.ones((1, 64, 64), np.float32)
    before = a.copy()
    with pytest.raises(SparseKError) as e:
        sparsek.bsr_gemm(a, np.ones((64, 64), np.float32), lay, c=a[0])
    assert e.value.category == 1
    assert np.array_equal(a, before)


# ---------------------------------------------------------------------------
# torch CPU tensors
# ---------------------------------------------------------------------------


@requires_torch
def test_torch_tensor_over_a_read_only_memmap_is_refused(tmp_path):
    # torch has no read-only flag: from_numpy of a PROT_READ mapping gives a
    # "writable" tensor whose memory faults when written (before: SIGSEGV).
    r = run_python(
        """
        import warnings
        import numpy as np, torch, sparsek
        warnings.simplefilter("ignore")
        np.zeros((64, 32), np.float32).tofile("c.bin")
        c = torch.from_numpy(np.memmap("c.bin", dtype=np.float32, mode="r", shape=(64, 32)))
        lay = sparsek.Layout.dense(64, 64, block=64)
        a, b = torch.ones(1, 64, 64), torch.ones(64, 32)
        attempt(lambda: sparsek.bsr_gemm(a, b, lay, c=c))
        q = torch.ones(1, 128, 2, 16)
        q.numpy().tofile("o.bin")
        out = torch.from_numpy(np.memmap("o.bin", dtype=np.float32, mode="r", shape=(1, 128, 2, 16)))
        attempt(lambda: sparsek.attention(q, q, q, sparsek.Layout.dense(128, block=64), out=out))
        """,
        tmp_path,
    )
    assert_refused(r, "ValueError: c's memory is not writable")
    assert "ValueError: out's memory is not writable" in r.stdout


@requires_torch
def test_torch_inference_tensor_out_is_accepted():
    import torch

    rng = seeded_rng(274)
    qn, kn, vn = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.dense(128, block=64)
    want = sparsek.attention(qn, kn, vn, lay)
    with torch.inference_mode():
        q, k, v = (torch.from_numpy(x).clone() for x in (qn, kn, vn))
        out = torch.full(q.shape, float("nan"))
        assert out.is_inference()
        res = sparsek.attention(q, k, v, lay, out=out)
    assert res is out
    np.testing.assert_array_equal(out.numpy(), want)


@requires_torch
def test_torch_expanded_out_is_refused_and_untouched():
    import torch

    q = torch.ones(1, 128, 2, 16)
    base = torch.full((1, 1, 2, 16), 5.0)
    with pytest.raises((ValueError, SparseKError)):
        sparsek.attention(q, q, q, Layout.dense(128, block=64), out=base.expand(1, 128, 2, 16))
    assert (base == 5.0).all()
