#!/usr/bin/env python3
"""Train a tiny byte-level LM with SparseK attention and with FlexAttention
on the same BlockMask, and check that the loss curves agree.

    PYTHONPATH=python SPARSEK_LIBRARY=build/libsparsek.so \\
        python3 examples/train_tiny_lm.py --device cuda --out $OUT/train
    python3 examples/train_tiny_lm.py --device cpu --quick --out /tmp/train
    python3 examples/train_tiny_lm.py --plot-only /tmp/train/train_tiny_lm.json

What it does. A decoder-only LM (byte tokens, learned positions, pre-LN
blocks; tiny_lm.TinyLM) is trained from scratch on CPython's own
pydoc_data.topics text (the reference topics `help()` prints: it ships
with every CPython, so the offline GPU machine needs no wheel). For each
layout it trains three runs, all on the same batches in the same order:
  1. SparseK: sparsek.attention / sparsek.attention_topk on torch tensors,
     differentiable through the sparsek::attention_fwd / _bwd ops;
  2. the peer, same init seed: FlexAttention (torch.compile'd) on the same
     layout as a BlockMask (CUDA); on the CPU, where FlexAttention has no
     backward, SDPA with that BlockMask expanded to a dense token mask;
  3. the peer again with another init seed: the run-to-run noise band.
Layouts (the causal token mask inside the selected blocks, block 128 on
CUDA as FlexAttention's compiled kernels are known to take it):
  - causal: every block on or below the diagonal (dense causal);
  - topk: per query block, 1 sink block + the 3 blocks ending at the
    diagonal (a causal window) + the 2 best other causal blocks.

The top-k choice: every layer selects its own blocks, at every step, from
its own pooled Q and K (block means, scores pooled_q . pooled_k, then the
top k: sparsek.pool_select_topk). This is how a learned sparse attention
uses it: the layout follows what each layer attends to, and it drives the
differentiable sparsek.attention_topk path (the selection itself has no
gradient; q, k, v get the attention's gradient on the selected layout). The
peer runs the very same selection function on its own Q and K
(attention_topk runs pool_select_topk, bit for bit) and hands the layout to
FlexAttention as a BlockMask built on the GPU (tiny_lm.block_mask_from_bsr:
no host sync). At step 0 both runs select from identical Q and K; later
their weights differ by rounding, and a near-tie block may be chosen
differently: that is part of what the noise run (which selects its own
blocks) measures. A fixed layout taken from the first layer would test the
top-k path less (one selection shared by every layer).

The criterion (tiny_lm.agreement): over the last quarter of the steps,
the mean |loss_sparsek - loss_peer| must be <= 0.25 x the mean |loss_noise
- loss_peer| + 0.001 (the same-init pair must sit well inside the band of
two inits, as it differs only by rounding; tiny_lm.agreement says why not
1 x); the first step (same weights, forwards only) must differ by <= 5e-3
(bf16 on CUDA; 1e-4 in fp32 on the CPU); every loss is finite and both
curves go down. The last line printed is PASS or FAIL (exit status 0 or 1).

Output in --out: train_tiny_lm.json (config, corpus, per-step losses, step
times, validation loss, layout density and peak memory of every run, the
checks) rewritten after every run, and train_tiny_lm.png (matplotlib if
importable; else skipped, and the JSON says so). Step time: CUDA events
around forward + backward + optimizer step, median and mean over the steps
after the first ones (compilation, planning); wall clock on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

# torch and libsparsek each bring an OpenMP runtime; with both spinning
# between parallel regions (the default policy) the CPU backend ran 6x
# slower on a busy 2-core machine. Set before torch loads; results do not
# change.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sparsek  # noqa: E402
import tiny_lm  # noqa: E402

SCHEMA = "sparsek-train-tiny-lm/1"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="a smoke test: a few steps at a tiny size")
    p.add_argument("--steps", type=int, help="training steps (default 300; --quick 8)")
    p.add_argument("--seq", type=int, help="sequence length, a multiple of --block (default 32 blocks; --quick 8)")
    p.add_argument("--layers", type=int, help="decoder blocks (default 4; --quick 2)")
    p.add_argument("--batch", type=int, help="sequences per step (default 4; --quick 2)")
    p.add_argument("--d-model", type=int, help="model width (default 512; --quick 128); head_dim is 64")
    p.add_argument("--block", type=int, choices=(64, 128), help="layout block (default 128; --quick on cpu 64)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="init seed of runs 1 and 2, data order; run 3 uses seed + 1")
    p.add_argument("--layouts", default="causal,topk", help="comma list of causal, topk")
    p.add_argument("--out", default="train_out", help="output folder")
    p.add_argument("--commit", help="the commit to record (default: git rev-parse HEAD, if there is a .git)")
    p.add_argument("--plot-only", metavar="JSON", help="only draw the PNG of an earlier run's JSON")
    return p.parse_args(argv)


def config(args) -> dict:
    """The run's settings: --quick defaults, then explicit options."""
    quick = args.quick
    block = args.block or (64 if quick and args.device == "cpu" else 128)
    cfg = {
        "device": args.device,
        "quick": quick,
        "steps": args.steps or (8 if quick else 300),
        "block": block,
        "seq": args.seq or (8 if quick else 32) * block,
        "layers": args.layers or (2 if quick else 4),
        "batch": args.batch or (2 if quick else 4),
        "d_model": args.d_model or (128 if quick else 512),
        "head_dim": 64,
        "lr": args.lr,
        "seed": args.seed,
        "layouts": [x for x in args.layouts.split(",") if x],
        "topk": {"sink_blocks": 1, "local_blocks": 2 if quick else 3, "k_blocks": 1 if quick else 2},
        "dtype": "bfloat16 (autocast)" if args.device == "cuda" else "float32",
        "val_batches": 1 if quick else 8,
    }
    if cfg["seq"] % block or cfg["d_model"] % 64:
        raise SystemExit(f"--seq ({cfg['seq']}) must be a multiple of --block ({block}), --d-model of 64")
    if cfg["steps"] < 2:
        raise SystemExit("--steps must be >= 2 (the first step is never timed)")
    if any(x not in ("causal", "topk") for x in cfg["layouts"]):
        raise SystemExit(f"--layouts {args.layouts}: use causal and/or topk")
    cfg["heads"] = cfg["d_model"] // 64
    cfg["timing_skip"] = min(10, max(1, cfg["steps"] // 4))  # compilation, planning, first allocations
    return cfg


class StepTimer:
    """CUDA events around each step (read once, at the end: no sync per
    step), or the wall clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append([ev, None])
        else:
            self.marks.append([time.perf_counter(), None])

    def stop(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][1] = ev
        else:
            self.marks[-1][1] = time.perf_counter()

    def millis(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return [(b - a) * 1e3 for a, b in self.marks]


def train_run(cfg, attend, data, val_data, offsets, val_offsets, init_seed, device) -> dict:
    """One training run; returns its record (losses, times, ...)."""
    torch.manual_seed(init_seed)
    model = tiny_lm.TinyLM(cfg["seq"], cfg["d_model"], cfg["heads"], cfg["layers"], attend).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    cuda = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    timer, losses = StepTimer(device), []
    t0 = time.perf_counter()
    for step in range(cfg["steps"]):
        x, y = tiny_lm.make_batch(data, offsets[step], cfg["seq"])
        for group in opt.param_groups:
            group["lr"] = tiny_lm.lr_at(step, cfg["steps"], cfg["lr"])
        timer.start()
        with autocast:
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        timer.stop()
        losses.append(loss.detach())
    losses = torch.stack(losses).float().cpu().tolist()
    ms = timer.millis()[cfg["timing_skip"]:]
    wall = time.perf_counter() - t0
    model.eval()
    with torch.no_grad(), autocast:
        val = [model(*tiny_lm.make_batch(val_data, o, cfg["seq"])).float().item() for o in val_offsets]
    return {
        "attention": attend.name,
        "init_seed": init_seed,
        "losses": losses,
        "val_loss": float(np.mean(val)),
        "step_ms": {"median": statistics.median(ms), "mean": statistics.fmean(ms), "min": min(ms),
                    "timed_steps": len(ms), "skipped_steps": cfg["timing_skip"],
                    "clock": "cuda events" if cuda else "wall clock"},
        "wall_s": wall,
        "density": attend.density,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
    }


def environment(device, commit) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "sparsek": sparsek.version(),
           "sparsek_build": sparsek.build_info(), "library": str(sparsek.LIBRARY_PATH), "commit": commit}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    if commit is None:
        try:
            env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                           text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return env


def write(result, out_dir):
    path = os.path.join(out_dir, "train_tiny_lm.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def _describe(check) -> str:
    if "error" in check:
        return f"FAILED, a run raised ({check['error']})"
    return (f"d_sparsek {check['d_sparsek']:.3g} vs threshold {check['threshold']:.3g} (noise {check['d_noise']:.3g}); "
            f"step 0 diff {check['init_diff']:.3g} (tol {check['init_tol']:g}); learned {check['learned']}; "
            f"{'ok' if check['pass'] else 'FAILED'}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        with open(args.plot_only) as f:
            result = json.load(f)
        png = os.path.splitext(args.plot_only)[0] + ".png"
        why = tiny_lm.plot(result, png)
        print(why or f"wrote {png}")
        return 0 if why is None else 1
    cfg = config(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU (use --device cpu)")
    device = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)

    text, corpus = tiny_lm.load_corpus()
    split = int(len(text) * 0.95)
    data = torch.from_numpy(text[:split].copy()).to(device)
    val_data = torch.from_numpy(text[split:].copy()).to(device)
    corpus.update(train_bytes=split, val_bytes=len(text) - split)
    offsets = tiny_lm.batch_offsets(split, cfg["steps"], cfg["batch"], cfg["seq"], cfg["seed"], device)
    val_offsets = tiny_lm.batch_offsets(len(text) - split, cfg["val_batches"], cfg["batch"], cfg["seq"],
                                        cfg["seed"] + 7, device)
    result = {"schema": SCHEMA, "config": cfg, "corpus": corpus, "env": environment(device, args.commit), "runs": [],
              "checks": [], "png": None, "png_skipped": None, "verdict": None}
    print(f"corpus: {corpus['source']}, {corpus['bytes']} bytes; device {device}"
          f"{' (' + result['env']['gpu'] + ')' if 'gpu' in result['env'] else ''}", flush=True)

    init_tol = 5e-3 if device.type == "cuda" else 1e-4
    for kind in cfg["layouts"]:
        spec = tiny_lm.LayoutSpec(kind, cfg["seq"], cfg["block"], **(cfg["topk"] if kind == "topk" else {}))
        runs = {}
        for role, make, seed in (("sparsek", lambda: tiny_lm.SparseKAttention(spec), cfg["seed"]),
                                 ("peer", lambda: tiny_lm.PeerAttention(spec, device), cfg["seed"]),
                                 ("noise", lambda: tiny_lm.PeerAttention(spec, device), cfg["seed"] + 1)):
            try:
                rec = train_run(cfg, make(), data, val_data, offsets, val_offsets, seed, device)
                line = (f"loss {rec['losses'][0]:.4f} -> {rec['losses'][-1]:.4f} (val {rec['val_loss']:.4f}), "
                        f"{rec['step_ms']['median']:.2f} ms/step, density {rec['density']:.3f}")
            except Exception as e:  # recorded: one failing run (one GPU call) does not lose the others
                rec = {"attention": make().name, "init_seed": seed, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)[-4000:]}
                line = f"ERROR {rec['error'][:300]}"
            rec.update(layout=kind, role=role, layout_spec=spec.describe())
            runs[role] = rec
            result["runs"].append(rec)
            write(result, args.out)
            print(f"{kind:>6} {role:<7} {rec['attention']:<14} seed {seed}: {line}", flush=True)
        failed = [r for r in runs.values() if "error" in r]
        if failed:
            check = {"pass": False, "error": "; ".join(f"{r['role']}: {r['error'][:200]}" for r in failed)}
        else:
            check = tiny_lm.agreement(runs["sparsek"]["losses"], runs["peer"]["losses"], runs["noise"]["losses"],
                                      init_tol=init_tol)
            check["step_ms"] = {r: runs[r]["step_ms"]["median"] for r in ("sparsek", "peer")}
        check.update(layout=kind, peer=runs["peer"]["attention"])
        result["checks"].append(check)
        print(f"{kind:>6} check: {_describe(check)}", flush=True)

    ok = all(c["pass"] for c in result["checks"])
    result["verdict"] = "PASS" if ok else "FAIL"
    png = os.path.join(args.out, "train_tiny_lm.png")
    result["png_skipped"] = tiny_lm.plot(result, png)
    result["png"] = None if result["png_skipped"] else png
    path = write(result, args.out)
    print(result["png_skipped"] or f"wrote {png}")
    print(f"wrote {path}")
    print(f"{result['verdict']}: SparseK vs {result['checks'][0]['peer'] if result['checks'] else '-'}, loss curves "
          f"within run-to-run noise: " + "; ".join(f"{c['layout']} {_describe(c)}" for c in result["checks"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
