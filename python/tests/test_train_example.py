"""examples/train_tiny_lm.py, the training check of issue 29: its --quick
mode end to end in a subprocess (CPU backend; CUDA when there is a GPU),
the JSON it writes, that the check notices a wrong gradient, and its
helpers (the on-device BlockMask converter against Layout.to_block_mask,
the agreement criterion). Skipped without torch."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sparsek
from sparsek import Layout

from conftest import HAVE_TORCH, REPO, requires_cuda

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

EXAMPLES = os.path.join(REPO, "examples")
SCRIPT = os.path.join(EXAMPLES, "train_tiny_lm.py")

if HAVE_TORCH:
    import torch

    sys.path.insert(0, EXAMPLES)
    import tiny_lm


def _env():
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(sparsek.__file__)))
    return dict(os.environ, PYTHONPATH=package_dir, SPARSEK_LIBRARY=str(sparsek.LIBRARY_PATH))


def _run(args, out_dir, prelude=None):
    """The script (or, with prelude, code that patches and then runs its
    main) in a fresh interpreter; returns (completed process, JSON)."""
    argv = list(args) + ["--out", str(out_dir)]
    if prelude is None:
        cmd = [sys.executable, SCRIPT] + argv
    else:
        code = f"import sys; sys.path.insert(0, {EXAMPLES!r})\n" + textwrap.dedent(prelude)
        code += f"import train_tiny_lm\nsys.exit(train_tiny_lm.main({argv!r}))\n"
        cmd = [sys.executable, "-c", code]
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    print(res.stdout[-4000:], res.stderr[-4000:])
    path = os.path.join(str(out_dir), "train_tiny_lm.json")
    data = json.load(open(path)) if os.path.exists(path) else None
    return res, data


def _check_record(data, steps, peer):
    assert data["schema"] == "sparsek-train-tiny-lm/1"
    assert data["corpus"]["bytes"] > 100_000 and len(data["corpus"]["sha256"]) == 64
    assert [(r["layout"], r["role"]) for r in data["runs"]] == [
        (lay, role) for lay in ("causal", "topk") for role in ("sparsek", "peer", "noise")]
    for r in data["runs"]:
        assert len(r["losses"]) == steps and all(math.isfinite(x) for x in r["losses"])
        assert r["losses"][0] == pytest.approx(math.log(256), abs=0.5)  # an untrained byte model
        assert r["attention"] == ("sparsek" if r["role"] == "sparsek" else peer)
        assert r["step_ms"]["median"] > 0 and r["step_ms"]["timed_steps"] == steps - r["step_ms"]["skipped_steps"]
        assert math.isfinite(r["val_loss"]) and 0 < r["density"] <= 1
    dens = {r["layout"]: r["density"] for r in data["runs"]}
    assert dens["topk"] < dens["causal"], dens  # the top-k layout leaves causal blocks out
    assert [c["layout"] for c in data["checks"]] == ["causal", "topk"]
    assert all(c["pass"] for c in data["checks"]) and data["verdict"] == "PASS"
    assert (data["png"] is None) != (data["png_skipped"] is None)


def test_quick_cpu_run(tmp_path):
    res, data = _run(["--device", "cpu", "--quick"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1].startswith("PASS:")
    _check_record(data, 8, "sdpa_blockmask")
    # fp32 on the CPU: SparseK's forward and backward against autograd
    # through masked SDPA, step after step of AdamW, far inside the band.
    for c in data["checks"]:
        assert c["max_abs_diff"] <= 1e-4, c
        assert c["d_noise"] > 100 * c["max_abs_diff"], c


def test_quick_cpu_run_notices_a_wrong_gradient(tmp_path):
    """With dL/dK through SparseK's attention dropped, the curves part
    within a few steps: the fp32 bound above fails (the noise band of a
    short run is too wide to notice; a full run's is not)."""
    prelude = """
        import sparsek, tiny_lm
        real = sparsek.attention
        tiny_lm.sparsek.attention = lambda q, k, v, layout, **kw: real(q, k.detach(), v, layout, **kw)
    """
    res, data = _run(["--device", "cpu", "--quick", "--layouts", "causal", "--steps", "4"], tmp_path, prelude)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    assert data["checks"][0]["max_abs_diff"] > 1e-3, data["checks"][0]


def test_a_run_that_raises_is_recorded_and_fails_the_check(tmp_path):
    prelude = """
        import tiny_lm
        real = tiny_lm.PeerAttention.__call__
        def boom(self, q, k, v):
            if self.spec.kind == "topk":
                raise RuntimeError("injected failure")
            return real(self, q, k, v)
        tiny_lm.PeerAttention.__call__ = boom
    """
    res, data = _run(["--device", "cpu", "--quick", "--steps", "4"], tmp_path, prelude)
    assert res.returncode == 1, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1].startswith("FAIL:")
    assert data["verdict"] == "FAIL" and len(data["runs"]) == 6
    causal, topk = data["checks"]
    assert causal["pass"] and not topk["pass"] and "injected failure" in topk["error"]
    assert [r["role"] for r in data["runs"] if "error" in r] == ["peer", "noise"]


@requires_cuda
def test_quick_cuda_run(tmp_path):
    res, data = _run(["--device", "cuda", "--quick"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_record(data, 8, "flex")
    assert data["env"]["gpu"]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

LAYOUTS = {
    "causal": lambda: Layout.causal(512, block=64),
    "random_heads": lambda: Layout.random(512, k=3, seed=5, causal=True, block=64, batch=2, heads=3),
    "window_tail": lambda: Layout.window(450, left=100, block=64),
    "topk": lambda: Layout.topk(np.random.default_rng(2).standard_normal((2, 8, 8)), k=2, sink_blocks=1,
                                local_blocks=1, causal=True, block=64, heads=2),
}


def _host_block_mask(layout):
    return layout.to_block_mask(causal=True)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_block_mask_from_bsr_matches_the_layout(name):
    lay = LAYOUTS[name]()
    ro, ci = lay.torch_arrays("cpu")
    g = lay.grid
    dense = tiny_lm.dense_blocks(ro, ci, lay.op_grid())
    want = lay.to_mask().astype(bool).reshape(g.batch, g.heads, g.row_blocks, g.col_blocks)
    assert np.array_equal(dense.numpy(), want)
    ours = tiny_lm.block_mask_from_bsr(ro, ci, lay.op_grid(), None)
    ref = _host_block_mask(lay)
    for field in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(ours, field), getattr(ref, field)), field
    assert torch.equal(ours.to_dense(), ref.to_dense())
    # A DeviceLayout's buffer: capacity past the real count, unused entries
    # holding junk (here the last column), must not add blocks.
    cap = lay.nnz + 5
    padded = torch.cat([ci[: lay.nnz], torch.full((5,), g.col_blocks - 1, dtype=torch.int32)])
    grid7 = lay.op_grid()[:6] + [cap]
    assert torch.equal(tiny_lm.dense_blocks(ro, padded, grid7), dense)


def test_token_mask_is_the_block_mask_and_causal():
    lay = LAYOUTS["random_heads"]()
    mask = tiny_lm.token_mask(_host_block_mask(lay), 512)
    blocks = lay.to_mask().astype(bool).reshape(2, 3, 8, 8)
    tok = np.repeat(np.repeat(blocks, 64, -2), 64, -1) & np.tri(512, dtype=bool)
    assert np.array_equal(mask.numpy(), tok)


def test_agreement_criterion():
    steps = np.arange(40)
    peer = 5.5 - 2 * (1 - np.exp(-steps / 10))
    noise = peer + 0.05 * np.cos(steps)
    ok = tiny_lm.agreement(peer + 1e-3, peer, noise, init_tol=0.02)
    assert ok["pass"] and ok["window"] == 10
    off = tiny_lm.agreement(peer + 0.2, peer, noise, init_tol=0.5)  # a curve apart by 0.2 nats
    assert not off["pass"] and off["d_sparsek"] > off["threshold"]
    late = peer.copy()
    late[-10:] += 0.1  # parts late in training
    assert not tiny_lm.agreement(late, peer, noise, init_tol=0.02)["pass"]
    assert not tiny_lm.agreement(peer + 0.02, peer, noise, init_tol=0.5)["pass"]  # inside the band, not well inside
    first = peer.copy()
    first[0] += 0.03  # the forwards differ at step 0
    assert tiny_lm.agreement(first, peer, noise, init_tol=0.05)["pass"]
    assert not tiny_lm.agreement(first, peer, noise, init_tol=0.02)["pass"]
    nan = peer.copy()
    nan[3] = np.nan
    assert not tiny_lm.agreement(nan, peer, noise, init_tol=0.02)["pass"]
    flat = np.full(40, 5.5)
    assert not tiny_lm.agreement(flat, flat, flat + 0.01, init_tol=0.02)["pass"]  # nothing learned
