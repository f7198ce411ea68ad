"""The plans of sparsek.attention, attention_backward, bsr_gemm and the torch
op, kept per layout, so that a loop that calls them on one layout plans once
and never uploads the layout again; and those of decode and decode_select,
kept per problem (see the end of this text).

What a plan depends on: the layout's arrays (their identity and content),
the problem (shapes, dtype, strides, scale, mask, backend, determinism),
the device, and, for a CUDA plan, the stream: a run writes its workspace
(a tile counter, the backward's scratch), so two streams never share one.

Identity and content. A cached plan belongs to the objects that own the
layout arrays the library reads ("owners"): the host sparsek.Layout for
the CPU backend (its arrays are the library's validated copy, which nothing
can change), and the storages of the row_offsets / col_indices tensors for
a CUDA layout (a Layout's upload, a DeviceLayout's buffers, or the tensors
given to the torch op). Owners are held weakly: when one is collected, its
plans (and their workspaces) go with it, and a new object at the same
address never finds them (the weak reference is compared, not the id).
Tensors may be written in place (a DeviceLayout's buffers, the op's
arguments): their torch version counters are part of the bucket, and a
bucket whose versions moved drops every plan it holds before planning
again. The same storage at another offset is another layout (the data
pointers are in the key).

Lifetime. A bucket keeps at most PER_LAYOUT plans (least recently used out
first), except plans that a CUDA graph capture used: a captured graph
refers to their workspace, so they stay until their layout is collected.
Cached plans never hold their owners (they borrow the layout arrays, see
BorrowedLayout), so caching keeps nothing alive that the caller dropped.

Plans without layout arrays of their own (sparsek.decode's and
decode_select's: a descriptor, a workspace size and a workspace, whose
key holds every field they are made of; cached_unowned) share one bucket
without owners: nothing to invalidate but by key, LRU as above.

This module imports neither torch (only cached_plan does, for a CUDA
device) nor the library.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

PER_LAYOUT = 8


class _Bucket:
    __slots__ = ("refs", "versions", "plans", "__weakref__")

    def __init__(self, refs, versions):
        self.refs = refs
        self.versions = versions
        self.plans = OrderedDict()


class _Entry:
    __slots__ = ("plan", "pinned")

    def __init__(self, plan):
        self.plan = plan
        self.pinned = False


class PlanCache:
    """key -> plan per owner set; see the module text."""

    def __init__(self, per_layout: int = PER_LAYOUT):
        self.per_layout = per_layout
        self._buckets = {}
        # Weak-reference callbacks run wherever the collector runs, possibly
        # inside a locked section of this thread: the lock is reentrant.
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0
        self.invalidations = 0

    def _drop(self, ident, bucket_ref) -> None:
        with self._lock:
            bucket = self._buckets.get(ident)
            if bucket is not None and bucket is bucket_ref():
                del self._buckets[ident]

    def _bucket(self, owners, versions) -> _Bucket:
        ident = tuple(id(o) for o in owners)
        bucket = self._buckets.get(ident)
        if bucket is not None and all(r() is o for r, o in zip(bucket.refs, owners)):
            if bucket.versions != versions:
                # Content written in place: every plan of the old content goes.
                self.invalidations += 1
                bucket.plans.clear()
                bucket.versions = versions
            return bucket
        bucket = _Bucket((), versions)
        bref = weakref.ref(bucket)
        bucket.refs = tuple(weakref.ref(o, lambda _r, i=ident, b=bref: self._drop(i, b)) for o in owners)
        self._buckets[ident] = bucket
        return bucket

    def get(self, owners, versions, key, make, pin=False):
        """The plan for key in owners' bucket, made by make() on a miss.
        pin: a CUDA graph is being captured with it (never evicted)."""
        with self._lock:
            bucket = self._bucket(owners, versions)
            entry = bucket.plans.get(key)
            if entry is not None:
                self.hits += 1
                bucket.plans.move_to_end(key)
                entry.pinned = entry.pinned or pin
                return entry.plan
        plan = make()
        with self._lock:
            self.misses += 1
            bucket = self._bucket(owners, versions)
            entry = _Entry(plan)
            entry.pinned = pin
            bucket.plans[key] = entry
            self._evict(bucket)
        return plan

    def _evict(self, bucket: _Bucket) -> None:
        """The least recently used unpinned plans beyond per_layout."""
        unpinned = [k for k, e in bucket.plans.items() if not e.pinned]
        for k in unpinned[: max(len(unpinned) - self.per_layout, 0)]:
            del bucket.plans[k]

    def clear(self) -> None:
        """Forget every plan (pinned ones too: only after the CUDA graphs
        that used them are gone)."""
        with self._lock:
            self._buckets.clear()

    def info(self) -> dict:
        with self._lock:
            plans = sum(len(b.plans) for b in self._buckets.values())
            return {
                "hits": self.hits,
                "misses": self.misses,
                "invalidations": self.invalidations,
                "layouts": len(self._buckets),
                "plans": plans,
            }


CACHE = PlanCache()


def cached_plan(arrays, key: tuple, device: str, make):
    """The plan for `key` over `arrays` (layout_arrays.LayoutArrays) on
    `device` ("cpu" or "cuda:N"), made by make() on a miss. CUDA plans are
    per stream (the current one, part of the key). While a CUDA graph is
    being captured, the plan is (re-)enqueued on the capturing stream, so
    that the graph's replays plan again and follow the layout's content,
    and the entry is pinned (the graph refers to its workspace)."""
    stream, capturing = None, False
    if device != "cpu":
        import torch

        stream = torch.cuda.current_stream(device).cuda_stream
        capturing = torch.cuda.is_current_stream_capturing()
    made = []

    def _make():
        made.append(True)
        return make()

    plan = CACHE.get(arrays.owners, arrays.versions, key + (stream,) + arrays.key, _make, pin=capturing)
    if capturing and not made:
        plan.replan()
    return plan


def cached_unowned(key: tuple, device: str, make):
    """A plan that reads no layout arrays of its own (the decode's and the
    decode selection's: descriptor, workspace size, workspace), whose key
    holds everything it depends on; made by make() on a miss. Kept in one
    bucket without owners (LRU over PER_LAYOUT plans; pinned while a CUDA
    graph captures with it). CUDA plans are per stream, as in cached_plan:
    their runs write the workspace, so two streams never share one."""
    stream, capturing = None, False
    if device != "cpu":
        import torch

        stream = torch.cuda.current_stream(device).cuda_stream
        capturing = torch.cuda.is_current_stream_capturing()
    return CACHE.get((), (), key + (device, stream), make, pin=capturing)


def plan_cache_info() -> dict:
    """The plan cache's counters: hits, misses, invalidations (buckets
    emptied because their layout tensors were written in place), and the
    layouts and plans it holds now."""
    return CACHE.info()


def clear_plan_cache() -> None:
    """Drop every cached plan and its workspace (the counters stay). Plans
    that a captured CUDA graph uses must outlive it: clear only after such
    graphs are gone."""
    CACHE.clear()


__all__ = ["CACHE", "PlanCache", "cached_plan", "cached_unowned", "clear_plan_cache", "plan_cache_info"]
