"""Shared helpers for the sparsek tests: an independent numpy fp64 reference,
token-level pattern masks written from the header's definitions, and the
tolerance rule (error <= 2 x the error of a naive same-precision
implementation + a small atol)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def _have_cuda() -> bool:
    """torch sees a GPU and the library was built with CUDA."""
    if not HAVE_TORCH:
        return False
    import torch

    import sparsek

    return torch.cuda.is_available() and len(sparsek.devices()) > 0


HAVE_CUDA = _have_cuda()
requires_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="no torch CUDA device (or library built without CUDA)")


def seeded_rng(seed: int) -> np.random.Generator:
    # The seed is printed so a failure can be replayed (pytest shows stdout
    # of failing tests).
    print(f"seed = {seed}")
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------
# Reference attention
# ---------------------------------------------------------------------------


def head_slice(h: int, heads_q: int, heads_kv: int, layout_heads: int) -> int:
    """Which head slice query head h reads (sparsek.h, sk_bsr)."""
    if layout_heads == 1:
        return 0
    if layout_heads == heads_q:
        return h
    return h // (heads_q // heads_kv)


def token_allow(block_mask_2d, sq, sk, bq, bk, causal):
    """bool [Sq, Sk] from one slice's block mask [rb, cb]."""
    allow = np.repeat(np.repeat(np.asarray(block_mask_2d, bool), bq, 0), bk, 1)[:sq, :sk]
    if causal:
        qi = np.arange(sq)[:, None]
        ki = np.arange(sk)[None, :]
        allow = allow & (ki <= qi + (sk - sq))
    return allow


def ref_attention(q, k, v, mask, grid, causal=False, scale=None, compute=np.float64):
    """Dense masked attention in `compute` precision (fp64 for the reference,
    fp32 for the "naive same-precision" run). mask: block mask [slices, rb, cb].
    Returns (o [B, Sq, Hq, D] in compute precision, lse [B, Hq, Sq])."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    q_ = np.asarray(q).astype(compute)
    k_ = np.asarray(k).astype(compute)
    v_ = np.asarray(v).astype(compute)
    o = np.zeros((B, Sq, Hq, D), compute)
    lse = np.full((B, Hq, Sq), -np.inf, compute)
    for b in range(B):
        sb = b if grid.batch > 1 else 0
        for h in range(Hq):
            hk = h // group
            s_idx = sb * grid.heads + head_slice(h, Hq, Hkv, grid.heads)
            allow = token_allow(mask[s_idx], Sq, Sk, grid.block_rows, grid.block_cols, causal)
            s = (q_[b, :, h, :] @ k_[b, :, hk, :].T) * compute(scale)
            s = np.where(allow, s, -np.inf)
            m = s.max(axis=1)
            rows = np.isfinite(m)
            p = np.exp(s[rows] - m[rows, None])
            den = p.sum(axis=1)
            o[b, rows, h, :] = (p @ v_[b, :, hk, :]) / den[:, None]
            lse[b, h, rows] = m[rows] + np.log(den)
    return o, lse


def assert_close_rule(out, q, k, v, mask, grid, causal=False, scale=None, lse=None, atol=None):
    """Check out (and lse) against the fp64 reference with the tolerance
    rule; NaN/inf positions must match (there are none in o)."""
    ref_o, ref_lse = ref_attention(q, k, v, mask, grid, causal, scale, np.float64)
    naive_o, _ = ref_attention(q, k, v, mask, grid, causal, scale, np.float32)
    out_dtype = np.asarray(out).dtype
    naive_o = naive_o.astype(out_dtype).astype(np.float64)
    got = np.asarray(out).astype(np.float64)
    assert not np.isnan(got).any(), "output has NaN"
    if atol is None:
        atol = 1e-5 if out_dtype == np.float32 else 1e-3
    naive_err = np.abs(naive_o - ref_o).max(initial=0.0)
    err = np.abs(got - ref_o).max(initial=0.0)
    assert err <= 2 * naive_err + atol, f"max error {err:.3g} > 2 x naive {naive_err:.3g} + {atol}"
    if lse is not None:
        lse = np.asarray(lse, np.float64)
        assert lse.shape == ref_lse.shape
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "-inf positions differ"
        fin = np.isfinite(ref_lse)
        if fin.any():
            assert np.abs(lse[fin] - ref_lse[fin]).max() <= 1e-4 + 1e-5 * np.abs(ref_lse[fin]).max()
    return err


def block_any(allow, bq, bk):
    """Token mask [Sq, Sk] -> block mask [rb, cb]: any allowed pair."""
    sq, sk = allow.shape
    rb, cb = -(-sq // bq), -(-sk // bk)
    pad = np.zeros((rb * bq, cb * bk), bool)
    pad[:sq, :sk] = allow
    return pad.reshape(rb, bq, cb, bk).any(axis=(1, 3))


def positions(sq, sk):
    """(query position p = q + Sk - Sq as a column, key index k as a row)."""
    return np.arange(sq)[:, None] + (sk - sq), np.arange(sk)[None, :]


def cu_of(lens):
    """Cumulative lengths [0, l0, l0 + l1, ...] as int32 (cu_seqlens)."""
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def float_dtypes():
    """float32, float16 and, where ml_dtypes is installed, bfloat16."""
    try:
        import ml_dtypes
    except ImportError:  # optional
        return [np.float32, np.float16]
    return [np.float32, np.float16, ml_dtypes.bfloat16]


def make_qkv(rng, B, Sq, Sk, Hq, Hkv, D, dtype=np.float32):
    q = rng.standard_normal((B, Sq, Hq, D)).astype(dtype)
    k = rng.standard_normal((B, Sk, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, Sk, Hkv, D)).astype(dtype)
    return q, k, v


# Defined in every run_python script: attempt(call) prints "accepted" or the
# ValueError / TypeError that call() raised ("ValueError: <text>").
_ATTEMPT = """
def attempt(call):
    try:
        call()
        print("accepted")
    except (TypeError, ValueError) as e:
        print(f"{type(e).__name__}: {e}")
"""


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    """code (dedented) in a fresh interpreter with the sparsek package and
    library this one imported, in cwd: a test of something that used to
    crash fails instead of killing pytest (a crash shows as a negative
    return code)."""
    import sparsek

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(sparsek.__file__)))
    env = dict(os.environ, PYTHONPATH=package_dir, SPARSEK_LIBRARY=str(sparsek.LIBRARY_PATH))
    return subprocess.run(
        [sys.executable, "-c", _ATTEMPT + textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )


def assert_refused(result: subprocess.CompletedProcess, text: str) -> None:
    """The subprocess ended normally and printed text."""
    assert result.returncode == 0, f"crashed or failed (status {result.returncode}): {result.stderr[-2000:]}"
    assert text in result.stdout, result.stdout + result.stderr


def bench_dir():
    return os.path.join(REPO, "bench")


def import_bench(name):
    """Import bench/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(f"sk_bench_{name}", os.path.join(bench_dir(), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
