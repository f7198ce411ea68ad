#!/usr/bin/env python3
"""Charts and a markdown table from bench/run.py results.

    python3 bench/plot.py RESULTS.json [MORE.json ...] [--outdir bench/results]
                          [--md bench/results/latest.md] [--prefix NAME]

Several files (a suite run in several calls) are merged: their cases are
concatenated; where two files hold the same case, their systems are merged
(the later file's entry for a system wins). Each cell says which run it
came from when there are several ([1], [2], ...: listed in the header), as
figures from different runs were taken under different clock conditions.
Writes:
  <outdir>/<prefix>seed_tflops.png   actual TFLOPS against density, per system
                                     (seed shape; dense baselines as lines)
  <outdir>/<prefix>long_time.png     time against sequence length, per system
                                     (long context, D = 128 and D = 64)
  --md (default <outdir>/latest.md)  one table per case group, every system's
                                     time and TFLOPS, skips and errors noted
The charts need matplotlib; without it only the markdown is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SYSTEM_LABELS = {
    "sparsek": "SparseK",
    "sparsek_sm80": "SparseK portable (sm80)",
    "sdpa_cudnn": "SDPA cuDNN (dense)",
    "sdpa_flash": "SDPA flash (dense)",
    "flex": "FlexAttention",
    "flex_flash": "Flex FLASH (FA4)",
    "flashinfer": "flashinfer",
    "fa4": "FA4 block-sparse",
}
GROUP_TITLES = {
    "seed": "Seed shape: B=16, H=96, S=4096, D=128, fp16",
    "long": "Long context: B=1, H=32, bf16, D=128, causal window 2048",
    "long64": "Long context: B=1, H=32, bf16, D=64, causal window 2048",
    "mixed": "Window 4096 + 8 random blocks per row, S=128K, B=1, H=32, bf16, D=128",
    "gemm": "Seed grouped-GEMM case as attention: 800 of 4000 128x128 blocks, D=64, fp16",
}


def load(paths):
    merged = None
    for run, p in enumerate(paths, start=1):
        data = json.loads(Path(p).read_text())
        for c in data["cases"]:
            for rec in c.get("systems", {}).values():
                rec["run"] = run
        source = {"path": str(p), "commit": data.get("commit"), "env": data.get("env", {})}
        if merged is None:
            merged = data
            merged["sources"] = [source]
            continue
        merged["sources"].append(source)
        names = {c["name"]: i for i, c in enumerate(merged["cases"])}
        for c in data["cases"]:
            if c["name"] in names:
                merged["cases"][names[c["name"]]].setdefault("systems", {}).update(c.get("systems", {}))
            else:
                merged["cases"].append(c)
    return merged


def systems_in(cases):
    seen = []
    for c in cases:
        for s in c.get("systems", {}):
            if s not in seen:
                seen.append(s)
    order = list(SYSTEM_LABELS)
    return sorted(seen, key=lambda s: order.index(s) if s in order else len(order))


def label(s):
    return SYSTEM_LABELS.get(s, s)


def _fmt_time(ms):
    return f"{ms:.3g}" if ms < 10 else f"{ms:.1f}"


def cell(rec, several_runs=False):
    if rec is None:
        return ""
    text = _cell_text(rec)
    return f"{text} [{rec['run']}]" if several_runs and "run" in rec and text else text


def _cell_text(rec):
    st = rec.get("status")
    if st == "ok":
        tf = rec["tflops_actual"]
        text = f"{_fmt_time(rec['time_ms'])} ms, {tf:.0f} TF" if tf >= 10 else f"{_fmt_time(rec['time_ms'])} ms, {tf:.2g} TF"
        diff = rec.get("max_abs_diff_vs_sparsek")
        if diff is not None and rec.get("comparable") and diff > 0.05:
            text += f" (diff {diff:.2g}!)"
        return text
    if st == "skipped":
        return "skip"
    return "error"


def markdown(data) -> str:
    env = data.get("env", {})
    lines = ["# SparseK benchmark: latest run", ""]
    if data.get("synthetic"):
        lines += ["**SYNTHETIC DATA (test fixture): not a measurement.**", ""]
    lines += [
        f"- GPU: {env.get('gpu')} (driver {env.get('driver')}), CUDA {env.get('torch_cuda')}, torch {env.get('torch')}, "
        f"Triton {env.get('triton')}",
        f"- SparseK {env.get('sparsek_version')} ({env.get('sparsek_build')}), commit `{data.get('commit')}`",
    ]
    sources = data.get("sources", [])
    several_runs = len(sources) > 1
    if not several_runs:
        lines.append(
            f"- date {env.get('date')}; flashinfer: {env.get('flashinfer')}; "
            f"FA4 (flash_attn.cute): {env.get('flash_attn_cute')}"
        )
    else:
        lines.append("- Runs merged here (compare systems within one run; clocks differ between runs):")
        for i, src in enumerate(sources, start=1):
            e = src.get("env", {})
            lines.append(
                f"  [{i}] `{src['path']}`: {e.get('date')}, commit `{src.get('commit')}`, "
                f"flashinfer: {e.get('flashinfer')}, FA4: {e.get('flash_attn_cute')}"
            )
    lines += [
        "- Cells: median time of >= 20 CUDA-event-timed runs (inputs rotated beyond L2), and actual TFLOPS "
        "(selected blocks only for block-sparse systems; a dense peer's own dense/causal work). "
        "Dense SDPA rows compute the full (causal) attention, not the sparse layout.",
        "",
    ]
    notes = {}
    groups = []
    for c in data["cases"]:
        if c["group"] not in groups:
            groups.append(c["group"])
    for g in groups:
        cases = [c for c in data["cases"] if c["group"] == g]
        systems = systems_in(cases)
        sh = cases[0].get("shape")
        if sh and sh.get("S") and g in ("seed", "gemm"):
            title = f"{g}: B={sh['B']}, H={sh['H']}, S={sh['S']}, D={sh['D']}, {cases[0].get('dtype', '')}"
            title += " (" + GROUP_TITLES[g].split(":")[0] + ")" if g in GROUP_TITLES else ""
        elif sh and g in ("long", "long64", "mixed"):
            c0 = cases[0].get("case", {})
            title = f"{g}: B={sh['B']}, H={sh['H']}, D={sh['D']}, {cases[0].get('dtype', '')}, {c0.get('note', '')}"
        else:
            title = GROUP_TITLES.get(g, g)
        lines.append(f"## {title}")
        lines.append("")
        head = ["case", "density", "dense-equiv TF (SparseK)"] + [label(s) for s in systems]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for c in cases:
            sk = c.get("systems", {}).get("sparsek", {})
            de = f"{sk['tflops_dense_equiv']:.0f}" if sk.get("status") == "ok" else ""
            dens = f"{100 * c['density']:.2f}%" if "density" in c else ""
            row = [c["name"], dens, de]
            for s in systems:
                rec = c.get("systems", {}).get(s)
                row.append(cell(rec, several_runs))
                if rec and rec.get("status") in ("skipped", "error"):
                    why = rec.get("reason") or rec.get("error", "")
                    notes.setdefault((label(s), rec["status"], why.splitlines()[0][:200] if why else ""), []).append(c["name"])
            if "error" in c:
                notes.setdefault(("case", "error", c["error"][:200]), []).append(c["name"])
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    checks = []
    for c in data["cases"]:
        rc = c.get("systems", {}).get("sparsek", {}).get("reference_check")
        if rc:
            checks.append(f"{c['name']}: {rc['max_abs_diff']:.2g} ({'pass' if rc['pass'] else 'FAIL'})")
    if checks:
        lines += ["SparseK against a float32 torch reference (slice of queries): " + "; ".join(checks), ""]
    diffs = []
    for c in data["cases"]:
        for s, rec in c.get("systems", {}).items():
            d = rec.get("max_abs_diff_vs_sparsek")
            if d is not None and rec.get("comparable"):
                diffs.append(f"{c['name']}/{label(s)} {d:.2g}")
    if diffs:
        lines += ["Max |difference| of each peer's output from SparseK's (same computation): " + "; ".join(diffs), ""]
    if notes:
        lines += ["Skips and errors:", ""]
        for (who, st, why), names in notes.items():
            lines.append(f"- {who} {st} ({', '.join(names)}): {why}")
        lines.append("")
    return "\n".join(lines)


def charts(data, outdir: Path, prefix: str):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: charts skipped", file=sys.stderr)
        return []
    written = []
    title_suffix = f" ({data['env'].get('gpu')})" if data.get("env", {}).get("gpu") else ""
    if data.get("synthetic"):
        title_suffix += " SYNTHETIC"

    seed = [c for c in data["cases"] if c["group"] == "seed" and c.get("case", {}).get("pattern") == "random"]
    if seed:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in systems_in(seed):
            pts = sorted(
                (100 * c["density"], c["systems"][s]["tflops_actual"])
                for c in seed
                if c["systems"].get(s, {}).get("status") == "ok"
            )
            if not pts:
                continue
            if s.startswith("sdpa"):
                ax.axhline(pts[0][1], linestyle="--", linewidth=1, label=f"{label(s)}: {pts[0][1]:.0f}")
            else:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label(s))
        ax.set_xscale("log", base=2)
        ax.set_xticks([6.25, 12.5, 25, 50, 100])
        ax.set_xticklabels(["6.25", "12.5", "25", "50", "100"])
        ax.set_xlabel("density (% of key blocks selected, random top-k)")
        ax.set_ylabel("actual TFLOPS (selected blocks only)")
        sh = seed[0].get("shape", {})
        ax.set_title(f"B{sh.get('B')} H{sh.get('H')} S{sh.get('S')} D{sh.get('D')} {seed[0].get('dtype', '')}" + title_suffix, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        path = outdir / f"{prefix}seed_tflops.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    groups = [g for g in ("long", "long64") if any(c["group"] == g for c in data["cases"])]
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
        for ax, g in zip(axes[0], groups):
            cases = [c for c in data["cases"] if c["group"] == g]
            for s in systems_in(cases):
                pts = sorted(
                    (c["shape"]["S"], c["systems"][s]["time_ms"])
                    for c in cases
                    if c["systems"].get(s, {}).get("status") == "ok"
                )
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            linestyle="--" if s.startswith("sdpa") else "-", label=label(s))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("time (ms)")
            sh = cases[0].get("shape", {}) if cases else {}
            note = cases[0].get("case", {}).get("note", "") if cases else ""
            ax.set_title(f"B{sh.get('B')} H{sh.get('H')} D{sh.get('D')} {cases[0].get('dtype', '')}, {note}" + title_suffix, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        path = outdir / f"{prefix}long_time.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="results JSON file(s) from bench/run.py")
    ap.add_argument("--outdir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--md", default=None, help="markdown path (default <outdir>/latest.md)")
    ap.add_argument("--prefix", default="", help="prefix of the PNG names")
    args = ap.parse_args(argv)
    data = load(args.results)
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    md = Path(args.md) if args.md else outdir / "latest.md"
    written = charts(data, outdir, args.prefix)
    text = markdown(data)
    if written:
        text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in written) + "\n"
    md.write_text(text)
    for p in written + [md]:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
