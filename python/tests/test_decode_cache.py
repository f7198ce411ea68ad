"""The decode's and the decode selection's cached plans (plan_cache.
cached_unowned): a repeated call with the same problem asks the library
for the workspace size once (counted by wrapping the C function), a change
of any key field plans again, the results with a cold cache and a warm one
are bitwise equal (CPU backend), and a layout whose content changed under
the same geometry still gives the right answer. CUDA: one workspace per
stream, bitwise equal to a cold call."""

from __future__ import annotations

import numpy as np
import pytest

import sparsek
from sparsek import _lib

from conftest import requires_cuda, requires_torch, seeded_rng
from test_decode import HKV, LENS, assert_close, case, random_layout, reference


class Counted:
    """A wrapper of a library function that counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@pytest.fixture
def counted(monkeypatch):
    """The workspace-size and capacity functions, counted; a cold cache."""
    names = ("sk_decode_workspace_size", "sk_decode_select_workspace_size", "sk_decode_select_capacity")
    out = {}
    for name in names:
        out[name] = Counted(getattr(_lib.F, name))
        monkeypatch.setattr(_lib.F, name, out[name])
    sparsek.clear_plan_cache()
    yield out
    sparsek.clear_plan_cache()


def inputs(seed=3150):
    rng = seeded_rng(seed)
    q, k, v, kc, vc, table, lens = case(rng, np.float32)
    off, idx, selected = random_layout(rng, LENS, 16, HKV)
    return rng, q, k, v, kc, vc, table, lens, (off, idx), selected


def test_repeated_calls_plan_once_and_equal_cold(counted):
    _, q, k, v, kc, vc, table, lens, layout, _ = inputs()
    ws = counted["sk_decode_workspace_size"]
    cold = []
    for _ in range(2):  # every call cold: the plan made each time
        sparsek.clear_plan_cache()
        cold.append(sparsek.decode(q, kc, vc, table, lens, layout, block_k=16, return_lse=True))
    assert ws.calls == 2
    before = sparsek.plan_cache_info()
    warm = [sparsek.decode(q, kc, vc, table, lens, layout, block_k=16, return_lse=True) for _ in range(4)]
    after = sparsek.plan_cache_info()
    assert ws.calls == 2, "the workspace size was asked again on a hit"
    assert after["hits"] - before["hits"] == 4 and after["misses"] == before["misses"]
    for out, lse in warm + cold[1:]:
        assert np.array_equal(out, cold[0][0]) and np.array_equal(lse, cold[0][1])


def variants(rng, q, kc, vc, table, lens, layout):
    """(name, args, kwargs) of calls that differ from the base call in one
    key field each; every one must plan again."""
    off, idx = layout
    shared_off = np.array([0, 2, 3, 5], np.int32)  # one row per sequence
    shared_idx = np.array([0, 4, 0, 1, 12], np.int32)
    wide_table = np.concatenate([table, np.zeros_like(table[:, :1])], axis=1)
    q_strided = np.empty((3, 3, 8, 64), np.float32)[..., :32]
    q_strided[...] = q
    more_pages = np.concatenate([kc, np.zeros_like(kc[:1])]), np.concatenate([vc, np.zeros_like(vc[:1])])
    base = (q, kc, vc, table, lens)
    return [
        ("dense", base, {}),
        ("causal", base + (layout,), {"block_k": 16, "causal": False}),
        ("scale", base + (layout,), {"block_k": 16, "scale": 0.3}),
        ("max_seqlen_k", base + (layout,), {"block_k": 16, "max_seqlen_k": 205}),
        ("num_splits", base + (layout,), {"block_k": 16, "num_splits": 3}),
        ("block_k", base + (random_layout(rng, LENS, 32, HKV)[:2],), {"block_k": 32}),
        ("nnz", base + ((np.concatenate([off[:-1], [off[-1] - 1]]).astype(np.int32), idx[:-1]),), {"block_k": 16}),
        ("shared rows", base + ((shared_off, shared_idx),), {"block_k": 16}),
        ("max_pages", (q, kc, vc, wide_table, lens, layout), {"block_k": 16}),
        ("num_pages", (q,) + more_pages + (table, lens, layout), {"block_k": 16}),
        ("q strides", (q_strided, kc, vc, table, lens, layout), {"block_k": 16}),
        ("out strides", base + (layout,), {"block_k": 16, "out": np.empty((3, 3, 8, 64), np.float32)[..., :32]}),
        ("q_len", (np.ascontiguousarray(q[:, 1:]), kc, vc, table, lens, layout), {"block_k": 16}),
        ("dtype", tuple(x.astype(np.float16) for x in (q, kc, vc)) + (table, lens, layout), {"block_k": 16}),
    ]


def test_every_key_field_plans_again(counted):
    rng, q, k, v, kc, vc, table, lens, layout, _ = inputs()
    ws = counted["sk_decode_workspace_size"]
    base = sparsek.decode(q, kc, vc, table, lens, layout, block_k=16)
    assert ws.calls == 1
    for name, args, kwargs in variants(rng, q, kc, vc, table, lens, layout):
        sparsek.clear_plan_cache()
        want = sparsek.decode(*args, **kwargs)  # cold
        sparsek.clear_plan_cache()
        sparsek.decode(q, kc, vc, table, lens, layout, block_k=16)  # the base problem cached
        calls = ws.calls
        got = sparsek.decode(*args, **kwargs)
        assert ws.calls == calls + 1, f"{name}: a changed key field hit the base problem's plan"
        assert np.array_equal(got, want), name
        again = sparsek.decode(*args, **kwargs)
        assert ws.calls == calls + 1 and np.array_equal(again, want), f"{name}: no hit on a repeat"
    assert not np.array_equal(base, sparsek.decode(q, kc, vc, table, lens))  # the cases do differ


def test_layout_content_changes_under_one_plan(counted):
    rng, q, k, v, kc, vc, table, lens, (off, idx), selected = inputs(3151)
    first = sparsek.decode(q, kc, vc, table, lens, (off, idx), block_k=16)
    # The same geometry (offsets, nnz) with other blocks: each row's count kept.
    idx2 = idx.copy()
    for r in range(len(off) - 1):
        n, b = off[r + 1] - off[r], r // HKV
        blocks = -(-LENS[b] // 16)
        idx2[off[r]:off[r + 1]] = np.sort(rng.choice(blocks, size=n, replace=False))
    rows = [set(idx2[off[r]:off[r + 1]]) for r in range(len(off) - 1)]
    assert any(set(idx[off[r]:off[r + 1]]) != rows[r] for r in range(len(rows)))
    ws = counted["sk_decode_workspace_size"].calls
    got = sparsek.decode(q, kc, vc, table, lens, (off, idx2), block_k=16)
    assert counted["sk_decode_workspace_size"].calls == ws, "a content change planned again"
    want, _ = reference(q, k, v, LENS, True, lambda b, h, j: j in rows[b * HKV + h], 16)
    assert_close(got, want, np.float32)
    assert not np.array_equal(got, first)
    # Written in place, the same arrays.
    idx[:] = idx2
    assert np.array_equal(sparsek.decode(q, kc, vc, table, lens, (off, idx), block_k=16), got)


@requires_torch
def test_torch_cpu_is_its_own_key(counted):
    import torch

    _, q, k, v, kc, vc, table, lens, layout, _ = inputs(3152)
    want = sparsek.decode(q, kc, vc, table, lens, layout, block_k=16)
    t = torch.from_numpy
    args = (t(q), t(kc), t(vc), t(table), t(lens), (t(layout[0]), t(layout[1])))
    got = [sparsek.decode(*args, block_k=16) for _ in range(3)]
    assert counted["sk_decode_workspace_size"].calls == 2
    assert all(np.array_equal(g.numpy(), want) for g in got)


def select_case(seed=3153):
    rng = seeded_rng(seed)
    lens = np.array([200, 37], np.int32)
    kc = rng.standard_normal((40, 16, 2, 32)).astype(np.float32)
    table = rng.permutation(40).astype(np.int32)[:32].reshape(2, 16)
    summary = sparsek.kv_summary_build(kc, table, lens, block_k=16)
    q = rng.standard_normal((2, 1, 4, 32)).astype(np.float32)
    return rng, q, summary, lens


def test_decode_select_plans_once(counted):
    rng, q, summary, lens = select_case()
    cap, ws = counted["sk_decode_select_capacity"], counted["sk_decode_select_workspace_size"]
    cold = sparsek.decode_select(q, summary, lens, k=3, block_k=16)
    assert (cap.calls, ws.calls) == (1, 1)
    warm = [sparsek.decode_select(q, summary, lens, k=3, block_k=16) for _ in range(3)]
    assert (cap.calls, ws.calls) == (1, 1)
    for sel in warm:
        assert sel.row_offsets is not cold.row_offsets  # every selection its own arrays
        assert all(np.array_equal(a, b) for a, b in zip(sel.rows(), cold.rows()))
    # A new query under the same plan selects for that query (not a stale copy).
    q2 = rng.standard_normal(q.shape).astype(np.float32)
    sparsek.clear_plan_cache()
    want = sparsek.decode_select(q2, summary, lens, k=3, block_k=16).rows()
    sparsek.decode_select(q, summary, lens, k=3, block_k=16)
    calls = ws.calls
    assert all(np.array_equal(a, b) for a, b in zip(sparsek.decode_select(q2, summary, lens, k=3, block_k=16).rows(),
                                                     want))
    assert ws.calls == calls
    for kwargs in ({"k": 4}, {"sink_blocks": 0}, {"recent_blocks": 3}, {"scale": 0.5}, {"max_seqlen_k": 240}):
        calls = ws.calls
        sparsek.decode_select(q, summary, lens, **{"k": 3, "block_k": 16, **kwargs})
        assert ws.calls == calls + 1, kwargs


@requires_cuda
def test_cuda_one_workspace_per_stream(counted):
    import torch

    _, q, k, v, kc, vc, table, lens, (off, idx), _ = inputs(3154)
    d = lambda x, dt=torch.float16: torch.from_numpy(np.ascontiguousarray(x)).to("cuda", dt)  # noqa: E731
    q64 = np.repeat(q, 2, axis=-1)  # D 64 (the CUDA kernels' smallest)
    kc64, vc64 = np.repeat(kc, 2, axis=-1), np.repeat(vc, 2, axis=-1)
    args = (d(q64), d(kc64), d(vc64), d(table, torch.int32), d(lens, torch.int32),
            (d(off, torch.int32), d(idx, torch.int32)))
    # max_seqlen_k within the table's max_pages x page_size (208 keys)
    kw = {"block_k": 16, "max_seqlen_k": 208, "num_splits": 4}
    ws = counted["sk_decode_workspace_size"]
    cold = sparsek.decode(*args, **kw)
    warm = [sparsek.decode(*args, **kw) for _ in range(3)]
    torch.cuda.synchronize()
    assert ws.calls == 1 and all(torch.equal(w, cold) for w in warm)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        other = sparsek.decode(*args, **kw)
    side.synchronize()
    assert ws.calls == 2, "two streams shared one workspace"
    assert torch.equal(other, cold)


@requires_cuda
def test_cuda_graph_replays_follow_lengths_and_layout(counted):
    """A captured decode (its cached plan pinned) replays over lengths and
    layout indices written in place, as an eager call on them computes."""
    import torch

    _, q, k, v, kc, vc, table, lens, (off, idx), _ = inputs(3155)
    d = lambda x, dt=torch.float16: torch.from_numpy(np.ascontiguousarray(x)).to("cuda", dt)  # noqa: E731
    qd, kd, vd = d(np.repeat(q, 2, axis=-1)), d(np.repeat(kc, 2, axis=-1)), d(np.repeat(vc, 2, axis=-1))
    td, ld, od, idd = d(table, torch.int32), d(lens, torch.int32), d(off, torch.int32), d(idx, torch.int32)
    kw = {"block_k": 16, "max_seqlen_k": 205, "num_splits": 4}
    out = torch.empty_like(qd)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph wants
        sparsek.decode(qd, kd, vd, td, ld, (od, idd), out=out, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparsek.decode(qd, kd, vd, td, ld, (od, idd), out=out, **kw)
    # Each row's blocks mirrored inside its sequence (j -> nb(b) - 1 - j):
    # other blocks, still sorted and unique, the same offsets.
    mirrored = idx.copy()
    for r in range(len(off) - 1):
        nb = -(-LENS[r // HKV] // 16)
        mirrored[off[r]:off[r + 1]] = np.sort(nb - 1 - idx[off[r]:off[r + 1]])
    assert not np.array_equal(mirrored, idx)
    # Then shorter sequences: blocks past a sequence's end are skipped.
    for new_lens, new_idx in ((lens, mirrored), (np.maximum(lens - 40, 1), idx)):
        ld.copy_(d(new_lens, torch.int32))
        idd.copy_(d(new_idx, torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = sparsek.decode(qd, kd, vd, td, ld, (od, idd), **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay with lengths {new_lens.tolist()}"
    assert any(e.pinned for b in sparsek.plan_cache.CACHE._buckets.values() for e in b.plans.values())
