"""bench/topk_recall.py: the recall and oracle definitions on hand-made
cases, the tokenizers on tiny vocabularies, and a smoke run of the synthetic
part (written to a temporary file, never to bench/results)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import import_bench, seeded_rng


@pytest.fixture(scope="module")
def rb():
    return import_bench("topk_recall")


def test_softmax_and_block_mass(rb):
    rng = seeded_rng(201)
    q, k = rng.standard_normal((130, 8)), rng.standard_normal((200, 8))
    p = rb.softmax_probs(q, k, 0.5, causal=True)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # Bottom-right causal: query i sees keys 0 .. i + 70.
    assert (p[0, 71:] == 0).all() and p[0, 70] > 0
    m = rb.block_mass(p, 64)  # 200 keys: a tail block of 8
    assert m.shape == (130, 4)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(m[:, 3], p[:, 192:].sum(axis=1), atol=1e-15)


def test_recall_and_oracle_by_hand(rb):
    # Two query blocks of 2 rows, 3 key blocks; masses chosen by hand.
    mass = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.6, 0.4, 0.0], [0.2, 0.7, 0.1]])
    mask = np.array([[1, 0, 0], [0, 1, 1]], bool)
    np.testing.assert_allclose(rb.row_recall(mass, mask, 2), [0.5, 0.1, 0.4, 0.8])
    # One block per query block: block 0 -> column sums (0.6, 0.4, 1.0) -> 2;
    # block 1 -> (0.8, 1.1, 0.1) -> 1.
    np.testing.assert_allclose(rb.oracle_recall(mass, [1, 1], 2), [0.2, 0.8, 0.4, 0.7])
    np.testing.assert_allclose(rb.oracle_recall(mass, [3, 0], 2), [1.0, 1.0, 0.0, 0.0])
    # Each row on its own: the best single block of every row.
    np.testing.assert_allclose(rb.token_oracle_recall(mass, [1, 1], 2), [0.5, 0.8, 0.6, 0.7])
    np.testing.assert_allclose(rb.token_oracle_recall(mass, [2, 0], 2), [0.8, 0.9, 0.0, 0.0])


def test_evaluate_oracle_bounds_the_selection(rb):
    rng = seeded_rng(202)
    q, k = rb.synthetic_qk("clustered_segments", 512, 2, 32, rng)
    configs = rb.make_configs([64], [2, 4], 512)
    for causal in (False, True):
        accs = rb.evaluate(q, k, configs, causal=causal, scale=1 / np.sqrt(32))
        for r in rb.summarise(accs, configs):
            assert 0 < r["recall"] <= r["oracle"] + 1e-12 <= r["token_oracle"] + 2e-12 <= 1 + 1e-9
            assert r["rows"] == 2 * 512
    # Every block selected: recall 1.
    full = [dict(block=64, k=8, sinks=0, local=0, per_kv_head=False)]
    accs = rb.evaluate(q, k, full, causal=False, scale=0.2)
    assert abs(rb.summarise(accs, full)[0]["recall"] - 1) < 1e-12


def test_byte_bpe_and_wordpiece(rb, tmp_path):
    table = rb._bytes_to_unicode()
    assert len(set(table.values())) == 256 and table[ord("a")] == "a" and table[ord(" ")] == "\u0120"
    tokens = ["h", "e", "l", "o", "\u0120", "he", "ll", "hell", "hello", "\u0120hello", "1", "2"]
    merges = ["h e", "l l", "he ll", "hell o", "\u0120 hello"]
    bpe = rb.ByteBPE(tokens, merges)
    assert bpe.encode("hello hello 12") == [8, 9, 4, 10, 11]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "##s", ",", "sat"]) + "\n")
    wp = rb.WordPiece(str(vocab))
    assert wp.encode("The cats, sat dog") == [4, 5, 6, 7, 8, 1]


def test_synthetic_smoke_run(rb, tmp_path):
    out = tmp_path / "recall.json"
    rb.main(["--quick", "--parts", "synthetic", "--out", str(out)])
    d = json.loads(out.read_text())
    res = d["synthetic"]["results"]
    assert {r["input"] for r in res} == {"iid_normal", "clustered_tokens", "clustered_segments"}
    assert all(r["recall"] <= r["oracle"] + 1e-9 for r in res)
