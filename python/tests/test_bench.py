"""bench/: the case list of run.py, and plot.py on a SYNTHETIC results file
made here (never a measurement; nothing here is written to bench/results)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from conftest import import_bench

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def test_cases_follow_the_brief():
    run = import_bench("run")
    cases = run.make_cases(run.GROUPS, quick=False, max_dense_seq=262144)
    by = {c.name: c for c in cases}
    seed = [c for c in cases if c.group == "seed"]
    assert sorted(c.k for c in seed if c.pattern == "random") == [2, 4, 8, 16, 32]
    assert all((c.B, c.H, c.S, c.D, c.dtype) == (16, 96, 4096, 128, "float16") for c in seed)
    assert by["seed_window1024"].causal and by["seed_window1024"].window == 1024
    for g, d in (("long", 128), ("long64", 64)):
        long = [c for c in cases if c.group == g]
        assert [c.S for c in long] == [16384, 32768, 65536, 131072, 262144]
        assert all((c.B, c.H, c.D, c.dtype, c.window, c.causal) == (1, 32, d, "bfloat16", 2048, True) for c in long)
    causal = [c for c in cases if c.group == "causal"]
    assert [(c.B, c.H, c.S) for c in causal] == [(16, 32, 2048), (2, 32, 8192), (1, 16, 32768)]
    for c in causal:  # the causal dense layout: every block on or below the diagonal
        assert (c.D, c.dtype, c.causal, c.window, c.dense_peers) == (128, "bfloat16", True, c.S, True)
    mixed = by["mixed_s128k"]
    assert (mixed.S, mixed.window, mixed.k) == (131072, 4096, 8)


def test_gemm_case_has_800_of_4000_blocks():
    run = import_bench("run")
    case = [c for c in run.make_cases(["gemm"], quick=False, max_dense_seq=0) if c.group == "gemm"][0]
    lay = run.build_layout(case)
    assert lay.selected_blocks(case.B, case.H) == 800
    assert case.B * case.H * lay.row_blocks * lay.col_blocks == 4000
    assert case.D == 64


def test_mixed_layout_is_window_plus_random():
    run = import_bench("run")
    case = [c for c in run.make_cases(["mixed"], quick=True, max_dense_seq=0)][0]
    lay = run.build_layout(case)
    m = lay.to_mask()
    win = run.build_layout(run.Case("w", "x", 1, 1, 1, case.S, 128, "bfloat16", "window", True, window=case.window)).to_mask()[0]
    assert (m >= win[None]).all()  # the window is always there
    extra = (m & ~win[None].astype(bool)).sum(-1)
    assert extra.max() <= case.k and extra.sum() > 0


def synthetic_results():
    """A results file shaped like run.py's, with made-up numbers."""
    env = {"gpu": "SYNTHETIC GPU", "driver": "0", "torch": "0", "torch_cuda": "0", "triton": "0",
           "sparsek_version": "0.1.0", "sparsek_build": "synthetic", "date": "1970-01-01",
           "flashinfer": "not importable", "flash_attn_cute": "not importable"}
    cases = []

    def ok(ms, tf):
        return {"status": "ok", "time_ms": ms, "tflops_actual": tf, "tflops_dense_equiv": tf * 2,
                "us_per_head": ms, "max_abs_diff_vs_sparsek": 0.001, "comparable": True}

    for dens, k in ((1.0, 32), (0.5, 16), (0.25, 8), (0.125, 4), (0.0625, 2)):
        systems = {"sparsek": ok(20 * dens, 500), "flex": ok(30 * dens, 380),
                   "flashinfer": {"status": "skipped", "reason": "flashinfer not importable"}}
        if dens == 1.0:
            systems["sdpa_cudnn"] = ok(23, 574)
        systems["sparsek"]["reference_check"] = {"max_abs_diff": 0.001, "pass": True}
        cases.append({"name": f"seed_topk{100 * dens:g}", "group": "seed", "density": dens,
                      "case": {"pattern": "random"}, "shape": {"B": 16, "H": 96, "S": 4096, "D": 128}, "systems": systems})
    for g in ("long", "long64"):
        for s in (16384, 32768, 65536):
            cases.append({"name": f"{g}_s{s // 1024}k", "group": g, "density": 2048 / s,
                          "case": {"pattern": "window"}, "shape": {"B": 1, "H": 32, "S": s, "D": 128 if g == "long" else 64},
                          "systems": {"sparsek": ok(s / 1e4, 400), "flex": ok(s / 8e3, 330),
                                      "fa4": {"status": "error", "error": "RuntimeError: synthetic"}}})
    return {"schema": "sparsek-bench/1", "synthetic": True, "commit": "synthetic", "env": env, "cases": cases}


def test_plot_writes_markdown_and_charts(tmp_path):
    plot = import_bench("plot")
    res = tmp_path / "synthetic_results.json"
    res.write_text(json.dumps(synthetic_results()))
    md = tmp_path / "latest.md"
    assert plot.main([str(res), "--outdir", str(tmp_path), "--md", str(md)]) == 0
    text = md.read_text()
    assert "SYNTHETIC" in text
    assert "| seed_topk25 | 25.00% |" in text
    assert "5 ms, 500 TF" in text  # SparseK at 25%: 20 * 0.25 ms
    assert "flashinfer skipped" in text and "FA4 block-sparse error" in text
    if HAVE_MPL:
        assert (tmp_path / "seed_tflops.png").stat().st_size > 1000
        assert (tmp_path / "long_time.png").stat().st_size > 1000


def test_plot_merges_files(tmp_path):
    plot = import_bench("plot")
    a = synthetic_results()
    b = synthetic_results()
    b["cases"] = [dict(a["cases"][0], systems={"sparsek": dict(a["cases"][0]["systems"]["sparsek"], time_ms=1.0)})]
    b["cases"].append(dict(a["cases"][0], name="gemm_seed800", group="gemm"))
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    data = plot.load([pa, pb])
    names = [c["name"] for c in data["cases"]]
    assert names.count("seed_topk100") == 1 and "gemm_seed800" in names
    assert data["cases"][0]["systems"]["sparsek"]["time_ms"] == 1.0


@pytest.mark.parametrize("argv", [["--out", "x.json", "--iters", "5"], ["--out", "x.json", "--peers", "nope"]])
def test_run_rejects_bad_arguments(argv):
    run = import_bench("run")
    with pytest.raises(SystemExit):
        run.parse_args(argv)


def test_backward_cases_follow_issue_29():
    """run.py --backward: the issue's five speed rows, with its shapes."""
    run = import_bench("run")
    bwd = import_bench("backward")
    cases = {c.name: c for c in bwd.backward_cases(run.Case, quick=False, tiny=False)}
    assert sorted(cases) == sorted(["bwd_seed_topk25", "bwd_seed_dense", "bwd_causal_s8k", "bwd_long_s64k",
                                    "bwd_long64_s32k"])
    seed = cases["bwd_seed_topk25"]
    assert (seed.B, seed.H, seed.S, seed.D, seed.dtype, seed.k, seed.causal) == (16, 96, 4096, 128, "float16", 8, False)
    dense = run.build_layout(cases["bwd_seed_dense"])
    assert dense.density == 1.0 and cases["bwd_seed_dense"].dense_peers
    causal = cases["bwd_causal_s8k"]
    assert (causal.B, causal.H, causal.S, causal.dtype, causal.causal) == (2, 32, 8192, "bfloat16", True)
    lay = run.build_layout(causal)  # the causal dense layout: every block on or below the diagonal
    assert lay.selected_blocks(1, 1) == lay.row_blocks * (lay.row_blocks + 1) // 2
    for name, s, d in (("bwd_long_s64k", 65536, 128), ("bwd_long64_s32k", 32768, 64)):
        c = cases[name]
        assert (c.B, c.H, c.S, c.D, c.window, c.causal, c.dtype) == (1, 32, s, d, 2048, True, "bfloat16")


def test_backward_mode_selects_its_cases():
    run = import_bench("run")
    args = run.parse_args(["--out", "x.json", "--backward", "--cases", "bwd_seed_dense"])
    assert [c.name for c in run.select_cases(args)] == ["bwd_seed_dense"]
    args = run.parse_args(["--out", "x.json", "--backward"])
    assert len(run.select_cases(args)) == 5
    with pytest.raises(SystemExit):
        run.select_cases(run.parse_args(["--out", "x.json", "--backward", "--cases", "nope"]))


def test_fp8_cases_follow_issue_32():
    """run.py --fp8: the issue's speed rows (bf16 inputs, D 128)."""
    run = import_bench("run")
    fp8 = import_bench("fp8")
    cases = {c.name: c for c in fp8.fp8_cases(run.Case, quick=False, tiny=False)}
    assert sorted(cases) == sorted(["fp8_seed_topk25", "fp8_long_s16k", "fp8_long_s64k", "fp8_long_s128k"])
    seed = cases["fp8_seed_topk25"]
    assert (seed.B, seed.H, seed.S, seed.D, seed.k, seed.causal, seed.pattern) == (16, 96, 4096, 128, 8, False, "random")
    assert run.build_layout(seed).density == 0.25  # 8 of 32 key blocks per row
    for s in (16384, 65536, 131072):
        c = cases[f"fp8_long_s{s // 1024}k"]
        assert (c.B, c.H, c.S, c.D, c.window, c.causal, c.pattern) == (1, 32, s, 128, 2048, True, "window")
    assert all(c.dtype == "bfloat16" for c in cases.values())
    args = run.parse_args(["--out", "x.json", "--fp8", "--cases", "fp8_long_s64k"])
    assert [c.name for c in run.select_cases(args)] == ["fp8_long_s64k"]
    assert len(run.select_cases(run.parse_args(["--out", "x.json", "--fp8"]))) == 4
    with pytest.raises(SystemExit):
        run.parse_args(["--out", "x.json", "--fp8", "--backward"])


def test_fp8_fold_is_block_diagonal():
    """flashinfer_fp8's fold of a per-(b, h) layout: sequence b * H + h
    holds exactly (b, h)'s blocks, key blocks offset by its slice."""
    import sparsek

    run = import_bench("run")
    fp8 = import_bench("fp8")
    B, H, S = 2, 3, 640
    lay = run.build_layout(run.Case("r", "x", B, H, H, S, 64, "bfloat16", "random", False, k=2, seed=5))
    ro, ci = fp8.fold_bsr(lay, B, H)
    rb, cb = lay.row_blocks, lay.col_blocks
    folded = sparsek.Layout.from_bsr(ro, ci, B * H * S, block=128).to_mask()[0]
    want = np.zeros((B * H * rb, B * H * cb), dtype=bool)
    m = lay.to_mask().astype(bool).reshape(B * H, rb, cb)
    for f in range(B * H):
        want[f * rb:(f + 1) * rb, f * cb:(f + 1) * cb] = m[f]
    assert (folded.astype(bool) == want).all() and want.sum() == B * H * rb * 2


def test_fp8_mode_smoke_on_cpu(tmp_path):
    """run.py --fp8 --quick --device cpu: SparseK bf16, the quantizer and
    both FP8 variants run and agree with bf16 to FP8's accuracy; the CUDA
    peers are recorded as skipped with a reason."""
    pytest.importorskip("torch")
    run = import_bench("run")
    out = tmp_path / "fp8.json"
    assert run.main(["--fp8", "--quick", "--device", "cpu", "--cases", "fp8_seed_topk25", "--iters", "20",
                     "--warmup", "1", "--out", str(out)]) == 0
    case = json.loads(out.read_text())["cases"][0]
    sy = case["systems"]
    assert sy["sparsek_bf16"]["status"] == "ok" and sy["sparsek_bf16"]["reference_check"]["pass"]
    for name in ("sparsek_fp8", "sparsek_fp8_rows"):
        s = sy[name]
        assert s["status"] == "ok" and not s["nan_in_output"], s
        # e4m3 keeps 3 mantissa bits: N(0, 1) inputs give an O error of a few
        # per cent of |O| (~0.1 here), never 0 (that would mean bf16 ran).
        assert 0 < s["rmse_vs_sparsek"] < 0.03 and s["max_abs_diff_vs_sparsek"] < 0.5, s
    assert sy["sparsek_fp8"]["max_abs_diff_vs_sparsek"] == sy["sparsek_fp8_rows"]["max_abs_diff_vs_sparsek"]
    assert set(case["quantize"]) == {"q_ms", "v_rows_ms", "v_vt_ms"}
    for name in ("flashinfer_fp8", "flashinfer_fp8_dense", "sdpa_cudnn_fp8", "sdpa_cudnn"):
        assert sy[name] == {"status": "skipped", "reason": "needs CUDA"}
    # --resume keeps the case (its reference system, sparsek_bf16, ran) and runs nothing again.
    again = tmp_path / "fp8_again.json"
    assert run.main(["--fp8", "--quick", "--device", "cpu", "--cases", "fp8_seed_topk25", "--out", str(again),
                     "--resume", str(out)]) == 0
    assert json.loads(again.read_text())["cases"] == [case]
