"""Reading a context-parallel plan blob (sk_cp_plan) from Python.

The blob's layout is src/core/cp_plan.h (version 1): a header, R x R pair
records (what rank src sends rank dst: a run of units), R rank records
(shard tokens, chunks, remote buffer, the two layouts of each chunk), the
units (block, batch, KV head, slot: int32 each, sorted by block, batch,
head within a pair) and the int32 layout arrays. Offsets are bytes from the
blob's start. cp_attention (cp_torch.py) reads the units to pack and
unpack K/V with torch and the chunks' layouts to run the two passes.

The numpy dtypes below mirror the C structs field for field. `PlanBlob`
checks what the mirror depends on (magic, version, and every section offset
recomputed from the mirrored sizes, so a change of a C struct's size is
caught here); the contents themselves are checked by the library
(sk_cp_plan_check, through CpPlan.check).
"""

from __future__ import annotations

import numpy as np

PLAN_MAGIC = 0x504B4353  # "SCKP" little endian (SK_CP_PLAN_MAGIC)
PLAN_VERSION = 1  # SK_CP_PLAN_VERSION

_I32, _I64, _U32 = "<i4", "<i8", "<u4"

HEADER = np.dtype([
    ("magic", _U32), ("version", _U32), ("total_bytes", _I64),
    ("ranks", _I32), ("sharding", _I32), ("block", _I32), ("causal", _I32),
    ("layout_batch", _I32), ("layout_heads", _I32), ("elem_bytes", _I32), ("pad_", _I32),
    ("batch", _I64), ("seq", _I64), ("heads_q", _I64), ("heads_kv", _I64), ("head_dim", _I64),
    ("pairs", _I64), ("rank_plans", _I64), ("units", _I64), ("ints", _I64),
    ("unit_count", _I64), ("int_count", _I64),
])
PAIR = np.dtype([("unit_start", _I64), ("units", _I64), ("bytes", _I64)])
CHUNK = np.dtype([
    ("q_start", _I64), ("tokens", _I64), ("local_keys", _I64),
    ("global_block", _I32), ("blocks", _I32), ("local_nnz", _I32), ("remote_nnz", _I32),
    ("local_offsets", _I64), ("local_indices", _I64), ("remote_offsets", _I64),
    ("remote_indices", _I64),
])
RANK = np.dtype([
    ("tokens", _I64), ("chunks", _I32), ("slots", _I32), ("remote_keys", _I64),
    ("send_bytes", _I64), ("recv_bytes", _I64), ("chunk", CHUNK, (2,)),
])
UNIT_FIELDS = ("block", "batch", "head", "slot")  # columns of PlanBlob.units


def _align8(x: int) -> int:
    return (x + 7) // 8 * 8


class PlanBlob:
    """Read-only views into a plan blob (a numpy buffer that outlives this
    object: CpPlan's)."""

    def __init__(self, buf: np.ndarray, nbytes: int):
        raw = buf.view(np.uint8)[:nbytes]
        if nbytes < HEADER.itemsize:
            raise ValueError(f"plan: {nbytes} bytes is shorter than a plan header")
        h = raw[:HEADER.itemsize].view(HEADER)[0]
        if int(h["magic"]) != PLAN_MAGIC or int(h["version"]) != PLAN_VERSION:
            raise ValueError(
                f"plan: magic 0x{int(h['magic']):08x} version {int(h['version'])}; this reader "
                f"knows 0x{PLAN_MAGIC:08x} version {PLAN_VERSION} (src/core/cp_plan.h)")
        R = int(h["ranks"])
        want = {"pairs": _align8(HEADER.itemsize)}
        want["rank_plans"] = _align8(want["pairs"] + R * R * PAIR.itemsize)
        want["units"] = _align8(want["rank_plans"] + R * RANK.itemsize)
        want["ints"] = _align8(want["units"] + int(h["unit_count"]) * 16)
        want["total_bytes"] = _align8(want["ints"] + int(h["int_count"]) * 4)
        for name, at in want.items():
            if int(h[name]) != at:
                raise ValueError(
                    f"plan: section {name} at byte {int(h[name])}, the mirror of "
                    f"src/core/cp_plan.h expects {at}: the C structs changed, update cp_blob.py")
        if want["total_bytes"] > nbytes:
            raise ValueError(f"plan: {want['total_bytes']} bytes needed, {nbytes} given")
        self.header = h
        self.ranks = R
        self.block = int(h["block"])
        self.seq = int(h["seq"])
        self.pairs = raw[want["pairs"]:want["pairs"] + R * R * PAIR.itemsize].view(PAIR)
        self.rank_plans = raw[want["rank_plans"]:want["rank_plans"] + R * RANK.itemsize].view(RANK)
        n = int(h["unit_count"])
        self.units = raw[want["units"]:want["units"] + n * 16].view(np.int32).reshape(n, 4)
        self.ints = raw[want["ints"]:want["ints"] + int(h["int_count"]) * 4].view(np.int32)

    def pair_units(self, src: int, dst: int) -> np.ndarray:
        """[n, 4] int32 (block, batch, head, slot) that src sends dst, in
        packing order."""
        p = self.pairs[src * self.ranks + dst]
        start = int(p["unit_start"])
        return self.units[start:start + int(p["units"])]

    def pair_bytes(self, src: int, dst: int) -> int:
        return int(self.pairs[src * self.ranks + dst]["bytes"])

    def unit_tokens(self, blocks: np.ndarray) -> np.ndarray:
        """Tokens of global key blocks (the last block may be a tail)."""
        return np.minimum(self.block, self.seq - blocks.astype(np.int64) * self.block)

    def rank(self, r: int):
        """Rank r's record (numpy structured scalar, fields of RANK)."""
        return self.rank_plans[r]

    def chunk_arrays(self, r: int, c: int, remote: bool) -> tuple:
        """(row_offsets, col_indices) int32 of rank r's chunk c: the local
        layout (own key blocks, shard block indices) or the remote one
        (received blocks, slot indices); rows are [slices, chunk blocks]."""
        ch = self.rank_plans[r]["chunk"][c]
        slices = int(self.header["layout_batch"]) * int(self.header["layout_heads"])
        rows = slices * int(ch["blocks"]) + 1
        key = "remote" if remote else "local"
        o = int(ch[f"{key}_offsets"])
        i = int(ch[f"{key}_indices"])
        return self.ints[o:o + rows], self.ints[i:i + int(ch[f"{key}_nnz"])]
