"""The plan cache (sparsek/plan_cache.py): hits, misses, invalidation when
layout tensors are written in place, owners collected with their plans,
never a plan of another layout (a new object at a recycled address), LRU
with pinned entries; through sparsek.attention, attention_backward,
bsr_gemm and the torch op. The torch and CUDA tests skip without them."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import sparsek
from sparsek import Layout
from sparsek.plan_cache import PlanCache

from conftest import HAVE_TORCH, make_qkv, requires_cuda, requires_torch, seeded_rng

if HAVE_TORCH:
    import torch


class Owner:
    """Something a bucket can hold weakly."""


class Counter:
    """make() for the cache: a new plan each call, counted."""

    def __init__(self):
        self.made = 0

    def __call__(self):
        self.made += 1
        return Owner()


def delta(before):
    now = sparsek.plan_cache_info()
    return {k: now[k] - before[k] for k in ("hits", "misses", "invalidations")}


# ---------------------------------------------------------------------------
# PlanCache itself
# ---------------------------------------------------------------------------


def test_hits_versions_and_owner_death():
    cache, make = PlanCache(), Counter()
    a = Owner()
    p = cache.get((a,), (0,), "k", make)
    assert cache.get((a,), (0,), "k", make) is p and make.made == 1
    assert cache.get((a,), (0,), "other", make) is not p and make.made == 2
    # Content written in place: every plan of the old content goes.
    p2 = cache.get((a,), (1,), "k", make)
    assert p2 is not p and make.made == 3 and cache.invalidations == 1
    assert cache.info()["plans"] == 1
    ref = weakref.ref(p2)
    del a, p, p2
    gc.collect()
    assert cache.info()["layouts"] == 0 and ref() is None


def test_a_new_owner_at_a_recycled_address_misses():
    cache, make = PlanCache(), Counter()
    b = None
    for _ in range(200):
        a = Owner()
        old = id(a)
        cache.get((a,), (), "k", make)
        del a
        b = Owner()
        if id(b) == old:
            break
        b = None
    if b is None:
        pytest.skip("no address was recycled in 200 tries")
    made = make.made
    cache.get((b,), (), "k", make)
    assert make.made == made + 1


def test_two_owners_are_both_checked():
    cache, make = PlanCache(), Counter()
    a, b, c = Owner(), Owner(), Owner()
    cache.get((a, b), (0, 0), "k", make)
    cache.get((a, c), (0, 0), "k", make)
    assert make.made == 2
    del b
    gc.collect()
    assert cache.info()["layouts"] == 1


def test_lru_keeps_pinned_plans():
    cache, make = PlanCache(per_layout=2), Counter()
    a = Owner()
    pinned = cache.get((a,), (), 0, make, pin=True)
    for key in range(1, 5):
        cache.get((a,), (), key, make)
    assert cache.info()["plans"] == 3  # the pinned one and the last two
    assert cache.get((a,), (), 0, make) is pinned
    made = make.made
    cache.get((a,), (), 1, make)
    assert make.made == made + 1  # evicted
    cache.clear()
    assert cache.info()["layouts"] == 0


# ---------------------------------------------------------------------------
# Through the numpy entry points
# ---------------------------------------------------------------------------


def test_attention_plans_once_per_problem():
    rng = seeded_rng(501)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.causal(128, block=64)
    before = sparsek.plan_cache_info()
    out = sparsek.attention(q, k, v, lay, causal=True)
    sparsek.attention(q, k, v, lay, causal=True)
    assert delta(before) == {"hits": 1, "misses": 1, "invalidations": 0}
    before = sparsek.plan_cache_info()
    sparsek.attention(q, k, v, lay, causal=False)
    sparsek.attention(q, k, v, lay, causal=True, scale=0.5)
    sparsek.attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), lay, causal=True)
    sparsek.attention(np.concatenate([q, q]), np.concatenate([k, k]), np.concatenate([v, v]), lay, causal=True)
    sparsek.attention(q, k, v, Layout.causal(128, block=64), causal=True)  # another layout
    assert delta(before) == {"hits": 0, "misses": 5, "invalidations": 0}
    assert sparsek.plan_attention(q, k, v, lay, causal=True).run(q, k, v).tobytes() == out.tobytes()


def test_backward_and_bsr_gemm_plan_once():
    rng = seeded_rng(502)
    q, k, v = make_qkv(rng, 1, 128, 128, 2, 2, 16)
    lay = Layout.random(128, k=1, seed=2, block=64)
    o, lse = sparsek.attention(q, k, v, lay, return_lse=True)
    do = rng.standard_normal(q.shape).astype(np.float32)
    before = sparsek.plan_cache_info()
    g1 = sparsek.attention_backward(q, k, v, o, do, lse, lay)
    g2 = sparsek.attention_backward(q, k, v, o, do, lse, lay)
    assert delta(before) == {"hits": 1, "misses": 1, "invalidations": 0}
    for a, b in zip(g1, g2):
        assert a.tobytes() == b.tobytes()
    a = rng.standard_normal((lay.nnz, 64, 64)).astype(np.float32)
    b = rng.standard_normal((128, 8)).astype(np.float32)
    before = sparsek.plan_cache_info()
    c1 = sparsek.bsr_gemm(a, b, lay)
    c2 = sparsek.bsr_gemm(a, b, lay)
    sparsek.bsr_gemm(a, b, lay, alpha=2.0)
    assert delta(before) == {"hits": 1, "misses": 2, "invalidations": 0}
    assert c1.tobytes() == c2.tobytes()


def test_layouts_in_turn_never_share_a_plan():
    # New layouts of one geometry, each dropped after use (their addresses
    # get recycled): every result is its own layout's.
    rng = seeded_rng(503)
    q, k, v = make_qkv(rng, 1, 256, 256, 2, 2, 16)
    for seed in range(12):
        lay = Layout.random(256, k=2, seed=seed, block=64, heads=2)
        got = sparsek.attention(q, k, v, lay)
        ref = sparsek.plan_attention(q, k, v, lay).run(q, k, v)
        assert got.tobytes() == ref.tobytes(), seed
        del lay


def test_the_cache_keeps_no_layout_alive():
    rng = seeded_rng(504)
    q, k, v = make_qkv(rng, 1, 128, 128, 1, 1, 16)
    lay = Layout.dense(128, block=64)
    sparsek.attention(q, k, v, lay)
    layouts = sparsek.plan_cache_info()["layouts"]
    ref = weakref.ref(lay)
    del lay
    gc.collect()
    assert ref() is None
    assert sparsek.plan_cache_info()["layouts"] == layouts - 1


def test_clear_plan_cache():
    rng = seeded_rng(505)
    q, k, v = make_qkv(rng, 1, 128, 128, 1, 1, 16)
    lay = Layout.dense(128, block=64)
    sparsek.attention(q, k, v, lay)
    sparsek.clear_plan_cache()
    assert sparsek.plan_cache_info()["plans"] == 0
    before = sparsek.plan_cache_info()
    sparsek.attention(q, k, v, lay)
    assert delta(before)["misses"] == 1


# ---------------------------------------------------------------------------
# Through the torch op
# ---------------------------------------------------------------------------


def _op(q, k, v, ro, ci, lay):
    import sparsek.torch_ops  # noqa: F401  (registers the op)

    grid = list(lay.grid) + [lay.nnz]
    return torch.ops.sparsek.attention_fwd(q, k, v, ro, ci, grid, False, 0.0, 0)[0]


@requires_torch
def test_layout_tensors_written_in_place_are_planned_again():
    q, k, v = (torch.from_numpy(x) for x in make_qkv(seeded_rng(506), 1, 256, 256, 2, 2, 16))
    a = Layout.random(256, k=2, seed=1, block=64, heads=2)
    b = Layout.random(256, k=2, seed=2, block=64, heads=2)
    ro, ci = (x.clone() for x in a.torch_arrays("cpu"))
    assert torch.equal(_op(q, k, v, ro, ci, a), sparsek.attention(q, k, v, a))
    before = sparsek.plan_cache_info()
    ro.copy_(b.torch_arrays("cpu")[0])
    ci.copy_(b.torch_arrays("cpu")[1])
    assert torch.equal(_op(q, k, v, ro, ci, b), sparsek.attention(q, k, v, b))
    d = delta(before)
    assert d["invalidations"] == 1 and d["misses"] >= 1


@requires_torch
def test_new_tensors_at_a_recycled_address_miss():
    q, k, v = (torch.from_numpy(x) for x in make_qkv(seeded_rng(507), 1, 256, 256, 2, 2, 16))
    layouts = [Layout.random(256, k=2, seed=s, block=64, heads=2) for s in range(8)]
    seen = set()
    recycled = 0
    for lay in layouts:
        ro, ci = (x.clone() for x in lay.torch_arrays("cpu"))
        recycled += (ro.data_ptr(), ci.data_ptr()) in seen
        seen.add((ro.data_ptr(), ci.data_ptr()))
        before = sparsek.plan_cache_info()
        assert torch.equal(_op(q, k, v, ro, ci, lay), sparsek.attention(q, k, v, lay))
        assert delta(before)["misses"] >= 1
        del ro, ci
    print(f"{recycled} of {len(layouts)} tensor pairs reused an address")


@requires_torch
def test_training_steps_plan_once():
    lay = Layout.random(256, k=2, seed=3, block=64, heads=2)
    q, k, v = (torch.from_numpy(x).requires_grad_(True) for x in make_qkv(seeded_rng(508), 2, 256, 256, 2, 2, 16))
    arrays = lay.torch_arrays("cpu")
    sparsek.attention(q, k, v, lay).sum().backward()
    before = sparsek.plan_cache_info()
    for _ in range(3):
        sparsek.attention(q, k, v, lay).sum().backward()
    assert delta(before) == {"hits": 6, "misses": 0, "invalidations": 0}
    assert all(a is b for a, b in zip(arrays, lay.torch_arrays("cpu")))  # never made again


@requires_cuda
def test_cuda_device_layout_written_in_place():
    # A stale CUDA plan (tile order of the old row lengths) would give wrong
    # rows: the layout's buffers get another selection's content in place.
    g = torch.Generator().manual_seed(509)
    q, k, v = (torch.randn(1, 1024, 2, 64, generator=g).to("cuda", torch.float16) for _ in range(3))
    first = sparsek.pool_select_topk(q, k, 1, causal=True)
    second = sparsek.pool_select_topk(q, k, 6, sink_blocks=1, causal=True)
    assert first.capacity <= second.capacity
    ro = second.row_offsets.clone()
    ci = second.col_indices_buffer.clone()
    ro.copy_(first.row_offsets)
    ci[: first.capacity].copy_(first.col_indices_buffer[: first.capacity])
    lay = sparsek.DeviceLayout(first.grid, second.capacity, ro, ci)
    assert torch.equal(sparsek.attention(q, k, v, lay, causal=True), sparsek.attention(q, k, v, first, causal=True))
    ro.copy_(second.row_offsets)
    ci.copy_(second.col_indices_buffer)
    assert torch.equal(sparsek.attention(q, k, v, lay, causal=True), sparsek.attention(q, k, v, second, causal=True))


@requires_cuda
def test_cuda_bsr_gemm_plans_once():
    lay = Layout.random(512, 512, k=2, seed=1, block=128)
    vals = torch.randn(lay.nnz, 128, 128, device="cuda", dtype=torch.float16)
    b = torch.randn(512, 64, device="cuda", dtype=torch.float16)
    ref = sparsek.bsr_gemm(vals, b, lay)
    before = sparsek.plan_cache_info()
    for _ in range(3):
        assert torch.equal(sparsek.bsr_gemm(vals, b, lay), ref)
    assert delta(before) == {"hits": 3, "misses": 0, "invalidations": 0}
