"""Context parallelism from Python (CPU): shards, the plan's bytes, and the
simulated R-rank run against sparsek.attention on the global arrays (the
tolerance of tests/cpu/test_cp.c: one rounding of the dtype plus fp32
noise of the merge)."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek


def _qkv(seed, B, S, Hq, Hkv, D, dtype):
    """Seeded normal q [B, S, Hq, D], k and v [B, S, Hkv, D]."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, S, h, D)).astype(dtype) for h in (Hq, Hkv, Hkv))


def test_shards_cover_the_sequence_in_chunks_of_blocks():
    seq, block = 64 * 13 + 5, 64
    for ranks in (1, 2, 3, 4):
        for sharding in ("contiguous", "zigzag"):
            seen = np.zeros(seq, dtype=int)
            for r in range(ranks):
                chunks = sparsek.cp_shard(seq, ranks, r, block, sharding)
                assert len(chunks) == (2 if sharding == "zigzag" else 1)
                for start, length in chunks:
                    assert start % block == 0
                    seen[start:start + length] += 1
            assert (seen == 1).all()


def test_bad_sharding_and_too_short_sequences_are_refused():
    with pytest.raises(ValueError, match="sharding"):
        sparsek.cp_shard(1024, 2, 0, 64, "ring")
    with pytest.raises(sparsek.SparseKError, match="chunks"):
        sparsek.cp_shard(3 * 64, 2, 0, 64, "zigzag")


@pytest.mark.parametrize("ranks,sharding,causal", [(2, "zigzag", True), (3, "contiguous", False),
                                                   (4, "zigzag", False)])
def test_simulated_run_matches_the_single_process_forward(ranks, sharding, causal):
    B, S, Hq, Hkv, D = 2, 64 * 11 + 17, 4, 2, 16
    q, k, v = _qkv(1234 + ranks, B, S, Hq, Hkv, D, np.float16)
    layout = sparsek.Layout.random(S, k=3, seed=7, causal=False, block=64, batch=1, heads=Hkv)
    ref, ref_lse = sparsek.attention(q, k, v, layout, causal=causal, return_lse=True)
    o, lse, plan = sparsek.cp_attention_simulated(q, k, v, layout, ranks, causal=causal,
                                                  sharding=sharding)
    ref32, o32 = ref.astype(np.float64), o.astype(np.float64)
    finite = np.isfinite(ref_lse)
    lmag = np.where(finite, np.abs(ref_lse), 0.0).transpose(0, 2, 1)[..., None]  # [B, S, Hq, 1]
    vmax = float(np.abs(v.astype(np.float64)).max())
    tol = 2 * 2.0**-11 * np.abs(ref32) + 2.0**-24 * (4 * np.abs(ref32) + 8 * vmax * (2 + lmag)) + 2.0**-24
    assert (np.abs(o32 - ref32) <= tol).all()
    assert (np.isneginf(lse) == np.isneginf(ref_lse)).all()
    assert np.allclose(lse[finite], ref_lse[finite], rtol=2.0**-20, atol=2.0**-20)
    # Bytes: every remote block a rank's rows select is received once.
    assert sum(plan.recv_bytes(r) for r in range(ranks)) == sum(
        plan.send_bytes(r) for r in range(ranks))
    assert all(plan.pair(r, r) == (0, 0) for r in range(ranks))
    assert sum(plan.recv_bytes(r) for r in range(ranks)) > 0


@pytest.mark.parametrize("ranks,sharding,causal", [(3, "zigzag", True), (4, "contiguous", False)])
def test_plan_blob_reader_agrees_with_the_library(ranks, sharding, causal):
    # The Python mirror of src/core/cp_plan.h (cp_blob.py, read by
    # cp_attention) against sk_cp_plan_bytes and the shards: every pair's
    # units add up to the library's bytes and count, units lie in the
    # sender's shard, slots in the receiver's buffer; the chunks' layouts
    # are valid Layouts over the chunk's rows.
    B, S, Hq, Hkv, D, block = 2, 64 * 11 + 17, 4, 2, 16, 64
    layout = sparsek.Layout.random(S, k=3, seed=5, causal=False, block=block, batch=B, heads=Hkv)
    plan = sparsek.CpPlan(layout, ranks, batch=B, heads_q=Hq, heads_kv=Hkv, head_dim=D,
                          causal=causal, sharding=sharding)
    blob = plan.blob()
    total_units = 0
    for src in range(ranks):
        own = np.zeros(-(-S // block), dtype=bool)
        for s, n in plan.shard(src):
            own[s // block:-(-(s + n) // block)] = True
        for dst in range(ranks):
            u = blob.pair_units(src, dst)
            nbytes, nunits = plan.pair(src, dst)
            assert len(u) == nunits and blob.pair_bytes(src, dst) == nbytes
            assert int(2 * blob.unit_tokens(u[:, 0]).sum() * D * 2) == nbytes
            assert own[u[:, 0]].all() and (u[:, 1] < B).all() and (u[:, 2] < Hkv).all()
            assert (u[:, 3] < int(blob.rank(dst)["slots"])).all()
            keys = [tuple(x) for x in u[:, :3]]
            assert keys == sorted(keys) and len(set(keys)) == len(keys)
            total_units += nunits
        rp = blob.rank(src)
        assert int(rp["tokens"]) == sum(n for _, n in plan.shard(src))
        for c in range(int(rp["chunks"])):
            ch = rp["chunk"][c]
            for remote, keys in ((False, int(ch["local_keys"])), (True, int(rp["remote_keys"]))):
                offsets, indices = blob.chunk_arrays(src, c, remote)
                if len(indices):
                    sparsek.Layout.from_bsr(offsets, indices, int(ch["tokens"]), keys, block=block,
                                            batch=B, heads=Hkv).validate()
    assert total_units == int(blob.header["unit_count"]) > 0
    plan.check(0)
    # A blob whose sections do not sit where the mirror puts them is refused.
    bad = plan._buf.copy()
    bad.view(np.int64)[blob.header.dtype.fields["units"][1] // 8] += 8
    with pytest.raises(ValueError, match="section units"):
        sparsek.cp_blob.PlanBlob(bad, plan.nbytes)


def _causal_dense(S, block=64, heads=1):
    return sparsek.Layout.causal(S, block=block, heads=heads)


@pytest.mark.parametrize("sharding", ["contiguous", "zigzag"])
def test_balance_gives_later_chunks_fewer_blocks_and_plans_follow_it(sharding):
    # Causal dense: later rows hold more blocks, so balanced chunks shrink;
    # the plan, its shards and its descriptors follow the given starts.
    S, block, ranks = 64 * 64, 64, 3
    layout = _causal_dense(S, block)
    starts = sparsek.cp_balance(layout, ranks, batch=1, heads_q=2, heads_kv=1, head_dim=16,
                                causal=True, sharding=sharding)
    C = ranks * (2 if sharding == "zigzag" else 1)
    assert len(starts) == C + 1 and starts[0] == 0 and starts[-1] == 64
    sizes = np.diff(starts)
    assert (sizes[1:] <= sizes[:-1]).all() and sizes[-1] < sizes[0], starts
    plan = sparsek.CpPlan(layout, ranks, batch=1, heads_q=2, heads_kv=1, head_dim=16,
                          causal=True, sharding=sharding, chunk_starts=starts)
    assert plan.chunk_starts == starts
    for r in range(ranks):
        chunks = [r] if sharding == "contiguous" else [r, 2 * ranks - 1 - r]
        assert plan.shard(r) == [(starts[c] * block, (starts[c + 1] - starts[c]) * block)
                                 for c in chunks]
        plan.check(r)
    same = sparsek.CpPlan(layout, ranks, batch=1, heads_q=2, heads_kv=1, head_dim=16,
                          causal=True, sharding=sharding, chunk_starts="balanced")
    assert same.chunk_starts == starts
    # The prediction: balanced no slower than equal, the ranks close.
    equal = sparsek.CpPlan(layout, ranks, batch=1, heads_q=2, heads_kv=1, head_dim=16,
                           causal=True, sharding=sharding)
    pb, pe = [p["ns"] for p in plan.predict()], [p["ns"] for p in equal.predict()]
    assert max(pb) < max(pe)
    total = sum(p["local_blocks"] + p["remote_blocks"] for p in plan.predict())
    assert total == 64 * 65 // 2 * 2  # causal blocks x query heads


@pytest.mark.parametrize("ranks,sharding,causal", [(2, "zigzag", True), (3, "contiguous", True),
                                                   (4, "zigzag", False)])
def test_simulated_run_with_balanced_chunks_matches_the_single_process(ranks, sharding, causal):
    B, S, Hq, Hkv, D = 1, 64 * 23 + 9, 4, 2, 16
    q, k, v = _qkv(99 + ranks, B, S, Hq, Hkv, D, np.float32)
    layout = sparsek.Layout.sinks_window(S, sink_tokens=64, window_tokens=300, block=64)
    starts = sparsek.cp_balance(layout, ranks, batch=B, heads_q=Hq, heads_kv=Hkv, head_dim=D,
                                dtype=np.float32, causal=causal, sharding=sharding,
                                cost=(1.0, 4.0, 0.0))
    ref, ref_lse = sparsek.attention(q, k, v, layout, causal=causal, return_lse=True)
    o, lse, plan = sparsek.cp_attention_simulated(q, k, v, layout, ranks, causal=causal,
                                                  sharding=sharding, chunk_starts=starts)
    assert plan.chunk_starts == starts
    vmax = float(np.abs(v).max())
    finite = np.isfinite(ref_lse)
    lmag = np.where(finite, np.abs(ref_lse), 0.0).transpose(0, 2, 1)[..., None]
    tol = 2 * 2.0**-24 * np.abs(ref) + 2.0**-24 * (4 * np.abs(ref) + 8 * vmax * (2 + lmag)) + 2.0**-24
    assert (np.abs(o.astype(np.float64) - ref) <= tol).all()
    assert np.allclose(lse[finite], ref_lse[finite], rtol=2.0**-20, atol=2.0**-20)


def test_bad_chunk_starts_and_balance_arguments_are_refused():
    S, block = 64 * 20, 64
    layout = _causal_dense(S, block)
    kw = dict(batch=1, heads_q=1, heads_kv=1, head_dim=16, causal=True)
    with pytest.raises(ValueError, match="C \\+ 1 = 5"):
        sparsek.cp_shard(S, 2, 0, block, "zigzag", chunk_starts=[0, 5, 10, 20])
    with pytest.raises(TypeError, match="chunk_starts"):
        sparsek.cp_shard(S, 2, 0, block, "zigzag", chunk_starts=3)
    with pytest.raises(sparsek.SparseKError, match=r"desc->chunk_starts\[2\] = 5"):
        sparsek.cp_shard(S, 2, 0, block, "zigzag", chunk_starts=[0, 5, 5, 12, 20])
    with pytest.raises(sparsek.SparseKError, match="must be nb = 20"):
        sparsek.CpPlan(layout, 2, sharding="zigzag", chunk_starts=[0, 5, 8, 12, 19], **kw)
    with pytest.raises(ValueError, match="'balanced'"):
        sparsek.CpPlan(layout, 2, chunk_starts="even", **kw)
    with pytest.raises(sparsek.SparseKError, match="cost->tile"):
        sparsek.cp_balance(layout, 2, cost=(1, 1, -1), **kw)
    with pytest.raises(TypeError, match="cost"):
        sparsek.cp_balance(layout, 2, cost=(1, 1), **kw)
