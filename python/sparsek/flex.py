"""FlexAttention interop: Layout <-> torch.nn.attention.flex_attention.BlockMask.

torch is imported only when these functions run.

A BlockMask keeps, per (batch, head, query block), two padded lists of key
blocks: kv_* (partial blocks, where FlexAttention evaluates mask_mod per
token) and full_kv_* (full blocks, where it skips mask_mod). A SparseK layout
is one list; its token-level mask is the attention's `causal` flag. So:

- to a BlockMask, a selected block is "full" when no token inside it needs a
  mask: every (query, key) pair is causal (when causal) and the block is not
  a tail block (its rows or columns do not run past the sequence ends);
- from a BlockMask, both lists are merged (sk_layout_create_from_flex).
"""

from __future__ import annotations

import numpy as np


def full_blocks(grid, causal: bool) -> np.ndarray:
    """bool [row_blocks, col_blocks]: True where a selected block needs no
    token-level mask (see the module text)."""
    rb, cb = grid.row_blocks, grid.col_blocks
    bq, bk = grid.block_rows, grid.block_cols
    i = np.arange(rb, dtype=np.int64)[:, None]
    j = np.arange(cb, dtype=np.int64)[None, :]
    full = ((i + 1) * bq <= grid.rows) & ((j + 1) * bk <= grid.cols)
    if causal:
        # Every pair visible: the block's last key <= its first query's
        # position (bottom-right alignment: q sits at q + cols - rows).
        full = full & ((j + 1) * bk - 1 <= i * bq + (grid.cols - grid.rows))
    return full


def _ordered(mask: np.ndarray):
    """Dense bool [..., cb] -> (counts int32 [...], indices int32 [..., cb]):
    selected blocks first in increasing order, then the others."""
    counts = mask.sum(axis=-1, dtype=np.int64).astype(np.int32)
    indices = np.argsort(~mask, axis=-1, kind="stable").astype(np.int32)
    return counts, indices


def causal_mask_mod(rows: int, cols: int):
    """mask_mod for SparseK's causal rule: key k visible to query q iff
    k <= q + (cols - rows) (bottom-right aligned)."""
    offset = cols - rows

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return mask_mod


def layout_mask_mod(mask: np.ndarray, grid, causal: bool, device):
    """A mask_mod that looks the block up in the layout (and applies the
    causal rule): exact token-level semantics on any FlexAttention path,
    including the eager one, which evaluates mask_mod densely and ignores the
    block lists. mask: bool [batch, heads, row_blocks, col_blocks]."""
    import torch

    table = torch.from_numpy(np.ascontiguousarray(mask)).to(device)
    nb, nh = table.shape[0], table.shape[1]
    bq, bk = grid.block_rows, grid.block_cols
    offset = grid.cols - grid.rows

    def mask_mod(b, h, q_idx, kv_idx):
        bi = b if nb > 1 else b * 0
        hi = h if nh > 1 else h * 0
        keep = table[bi, hi, q_idx // bq, kv_idx // bk]
        if causal:
            keep = keep & (kv_idx <= q_idx + offset)
        return keep

    return mask_mod


def layout_to_block_mask(layout, *, causal=False, split_full=True, device=None, num_heads=None, mask_mod=None):
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    grid = layout.grid
    mask = layout.to_mask().astype(bool).reshape(grid.batch, grid.heads, grid.row_blocks, grid.col_blocks)
    if num_heads is not None and num_heads != grid.heads and grid.heads != 1:
        if num_heads % grid.heads:
            raise ValueError(f"num_heads = {num_heads} is not a multiple of the layout's heads = {grid.heads}")
        mask = np.repeat(mask, num_heads // grid.heads, axis=1)
    device = torch.device("cpu") if device is None else torch.device(device)
    if isinstance(mask_mod, str):
        if mask_mod != "layout":
            raise ValueError(f"mask_mod = {mask_mod!r}: use None, 'layout' or a callable")
        mask_mod = layout_mask_mod(mask, grid, causal, device)
    elif mask_mod is None and causal:
        mask_mod = causal_mask_mod(grid.rows, grid.cols)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    if split_full:
        full = full_blocks(grid, causal)
        kv_n, kv_i = _ordered(mask & ~full)
        full_n, full_i = _ordered(mask & full)
        return BlockMask.from_kv_blocks(
            t(kv_n),
            t(kv_i),
            t(full_n),
            t(full_i),
            BLOCK_SIZE=(grid.block_rows, grid.block_cols),
            mask_mod=mask_mod,
            seq_lengths=(grid.rows, grid.cols),
        )
    kv_n, kv_i = _ordered(mask)
    return BlockMask.from_kv_blocks(
        t(kv_n),
        t(kv_i),
        BLOCK_SIZE=(grid.block_rows, grid.block_cols),
        mask_mod=mask_mod,
        seq_lengths=(grid.rows, grid.cols),
    )


def layout_from_block_mask(cls, bm):
    kv_n = bm.kv_num_blocks.detach().to("cpu").numpy().astype(np.int32)
    kv_i = bm.kv_indices.detach().to("cpu").numpy().astype(np.int32)
    if kv_n.ndim != 3 or kv_i.ndim != 4:
        raise ValueError(
            f"BlockMask kv_num_blocks {tuple(kv_n.shape)} / kv_indices {tuple(kv_i.shape)}: "
            "expected [B, H, row_blocks] and [B, H, row_blocks, width]"
        )
    batch, heads, rb = kv_n.shape
    block = tuple(int(x) for x in bm.BLOCK_SIZE)
    rows, cols = (int(x) for x in bm.seq_lengths)
    if bm.full_kv_num_blocks is not None:
        f_n = bm.full_kv_num_blocks.detach().to("cpu").numpy().astype(np.int32)
        f_i = bm.full_kv_indices.detach().to("cpu").numpy().astype(np.int32)
        w1, w2 = kv_i.shape[-1], f_i.shape[-1]
        merged = np.zeros(kv_i.shape[:-1] + (w1 + w2,), np.int32)
        merged[..., :w1] = kv_i
        # Row g's full blocks go right after its kv_n[g] partial ones; what
        # lies past kv_n + f_n is padding and is not read.
        pos = np.arange(w2, dtype=np.int64) + kv_n[..., None].astype(np.int64)
        np.put_along_axis(merged, pos, f_i, axis=-1)
        counts, indices = kv_n + f_n, merged
    else:
        counts, indices = kv_n, kv_i
    expected_rb = -(-rows // block[0])
    if rb != expected_rb:
        raise ValueError(
            f"BlockMask has {rb} query-block rows, but seq_lengths[0] = {rows} with block "
            f"{block[0]} needs {expected_rb}"
        )
    return cls.from_flex(counts, indices, rows, cols, block=block, batch=batch, heads=heads)
