"""sparsek without torch: `import sparsek` never imports torch, and the
numpy entry points (attention, its backward, bsr_gemm, top-k, the plan
cache) work in an interpreter where torch cannot be imported at all. Runs
with or without torch installed (a fresh interpreter each)."""

from __future__ import annotations

from conftest import assert_refused, run_python


def test_import_does_not_load_torch(tmp_path):
    r = run_python(
        """
        import sys
        import sparsek
        print("torch loaded" if "torch" in sys.modules else "torch not loaded")
        """,
        tmp_path,
    )
    assert_refused(r, "torch not loaded")


def test_numpy_path_with_torch_unimportable(tmp_path):
    r = run_python(
        """
        import sys
        sys.modules["torch"] = None  # `import torch` now raises ImportError
        import numpy as np
        import sparsek
        from sparsek import Layout

        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, 128, 2, 16)).astype(np.float32) for _ in range(3))
        lay = Layout.causal(128, block=64)
        o, lse = sparsek.attention(q, k, v, lay, causal=True, return_lse=True)
        sparsek.attention(q, k, v, lay, causal=True)
        dq, dk, dv = sparsek.attention_backward(q, k, v, o, q, lse, lay, causal=True)
        c = sparsek.bsr_gemm(np.ones((lay.nnz, 64, 64), np.float32), np.ones((128, 4), np.float32), lay)
        out, sel = sparsek.attention_topk(q, k, v, 1, block_q=64, block_k=64)
        info = sparsek.plan_cache_info()
        assert info["hits"] >= 1 and info["misses"] >= 3, info
        assert np.isfinite(dq).all() and c.shape == (128, 4) and out.shape == q.shape
        print("numpy path ok")
        """,
        tmp_path,
    )
    assert_refused(r, "numpy path ok")
