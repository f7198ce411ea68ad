"""The torch ops: sparsek::attention_fwd and sparsek::attention_bwd
(torch.library.custom_op), with fake (meta) implementations and autograd,
so that sparsek.attention on torch tensors is differentiable, traced whole
by torch.compile(fullgraph=True), and captured by CUDA graphs.

Imported on the first torch call (sparsek.attention, attention_topk), never
by `import sparsek`: numpy users do not need torch. Importing it registers
the ops.

    attention_fwd(q, k, v, row_offsets, col_indices, grid, causal, scale,
                  backend) -> (out, lse)
    attention_bwd(dout, q, k, v, out, lse, row_offsets, col_indices, grid,
                  causal, scale, backend, deterministic) -> (dq, dk, dv)

- The layout travels as tensors: row_offsets and col_indices (int32,
  contiguous, on q's device; Layout.torch_arrays / DeviceLayout buffers)
  and grid = [rows, cols, block_rows, block_cols, batch, heads, nnz] (a
  DeviceLayout's nnz is its capacity).
- scale 0.0 means 1/sqrt(D); backend 0 means "from the data", else a
  sparsek.Backend value.
- out is allocated packed [B, Sq, Hq, D] in q's dtype, lse float32
  [B, Hq, Sq]; dq, dk, dv packed in the inputs' shapes.
- The forward saves q, k, v, out, lse and the layout tensors; the backward
  runs sk_attention_backward_* (deterministic). lse is not differentiable
  (the backward's formula takes dL/dlse as 0): a loss that uses lse gets no
  gradient through it, never a wrong one.
- Plans come from the plan cache (plan_cache.py), keyed by the layout
  tensors' identity and version, so a training step neither re-plans nor
  re-uploads an unchanged layout, and a layout written in place is planned
  again. Inside a torch.cuda.graph capture the plan is captured too, so
  replays follow the layout's content. The ops carry the cudagraph_unsafe
  tag (where torch has it): under torch.compile(mode="reduce-overhead")
  inductor runs them between its CUDA graph partitions, as a cached
  workspace cannot live in the pool of its graph trees.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

from ._lib import Backend
from .attention import _BACKEND_NAMES, _check_layout, _check_qkv, _options, cached_attention_plan
from .backward import cached_backward_plan
from .layout import Grid, Layout, live_layout
from .layout_arrays import of_tensors


def _device(t: Tensor) -> str:
    return "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index}"


def _arrays(q, row_offsets, col_indices, grid):
    if len(grid) != 7:
        raise ValueError(f"grid must be [rows, cols, block_rows, block_cols, batch, heads, nnz], got {grid}")
    return of_tensors(row_offsets, col_indices, Grid(*grid[:6]), grid[6], _device(q))


def _plan_options(scale: float, backend: int):
    return (None if scale == 0.0 else scale), (None if backend == 0 else Backend(backend))


# Inductor's CUDA graph trees (mode="reduce-overhead") allocate in a pool of
# their own, in which nothing may stay alive but the graph's outputs; a
# cached plan's workspace would. The tag makes inductor run the ops between
# its captured partitions; torch.cuda.graph captures them (plan included).
_OP_TAGS = {"tags": (torch.Tag.cudagraph_unsafe,)} if hasattr(torch.Tag, "cudagraph_unsafe") else {}


@torch.library.custom_op("sparsek::attention_fwd", mutates_args=(), **_OP_TAGS)
def attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, row_offsets: Tensor, col_indices: Tensor, grid: List[int], causal: bool,
    scale: float, backend: int,
) -> Tuple[Tensor, Tensor]:
    sc, be = _plan_options(scale, backend)
    arrays = _arrays(q, row_offsets, col_indices, grid)
    plan = cached_attention_plan(q, k, v, arrays, causal=causal, scale=sc, backend=be)
    return plan.run(q, k, v, return_lse=True)


@attention_fwd.register_fake
def _(q, k, v, row_offsets, col_indices, grid, causal, scale, backend):
    B, Sq, Hq, D = q.shape
    return q.new_empty((B, Sq, Hq, D)), q.new_empty((B, Hq, Sq), dtype=torch.float32)


@torch.library.custom_op("sparsek::attention_bwd", mutates_args=(), **_OP_TAGS)
def attention_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, row_offsets: Tensor,
    col_indices: Tensor, grid: List[int], causal: bool, scale: float, backend: int, deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    sc, be = _plan_options(scale, backend)
    arrays = _arrays(q, row_offsets, col_indices, grid)
    strides = (tuple(out.stride()), tuple(dout.stride()), None, None, None)
    plan = cached_backward_plan(q, k, v, arrays, causal=causal, scale=sc, backend=be, deterministic=deterministic,
                                strides=strides)
    return plan.run(q, k, v, out, dout, lse)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, row_offsets, col_indices, grid, causal, scale, backend, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _usable_grad(g: Tensor) -> Tensor:
    """dL/dout as the library takes it: last dimension contiguous, no
    negative or broadcast (0) strides, 16-byte aligned on CUDA; else a
    packed copy (autograd hands over whatever the consumers produced, e.g.
    an expanded scalar for out.sum())."""
    ok = g.stride(-1) == 1 or g.shape[-1] == 1
    ok = ok and all(s > 0 for s, n in zip(g.stride(), g.shape) if n > 1)
    if ok and g.device.type == "cuda":
        # No data_ptr(): AOT autograd traces this with fake tensors. torch's
        # storages start aligned; the offset and strides decide the rest.
        size = g.element_size()
        ok = all(s * size % 16 == 0 for s in (g.storage_offset(),) + g.stride()[:3])
    return g if ok else g.contiguous()


def _setup_context(ctx, inputs, output):
    q, k, v, row_offsets, col_indices, grid, causal, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, row_offsets, col_indices)
    ctx.options = (grid, causal, scale, backend)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, row_offsets, col_indices = ctx.saved_tensors
    grid, causal, scale, backend = ctx.options
    dq, dk, dv = torch.ops.sparsek.attention_bwd(
        _usable_grad(dout), q, k, v, out, lse, row_offsets, col_indices, grid, causal, scale, backend, True
    )
    return dq, dk, dv, None, None, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.compiler.assume_constant_result
def _made_while_tracing(layout_id: int, device: str):
    # Constant arguments only (torch 2.11 refuses a Layout here).
    return live_layout(layout_id).torch_arrays_for_trace(device)


def layout_args(layout, device) -> tuple:
    """(row_offsets, col_indices, grid) of a Layout or DeviceLayout for the
    ops, on `device`.

    A Layout's tensors are made (uploaded) on its first use on a device.
    A torch.compile trace that finds them made takes them as graph inputs,
    as a DeviceLayout's: one graph serves every layout of that geometry. A
    trace that finds none makes them outside the graph
    (assume_constant_result) and holds them as constants, so that graph is
    guarded on this Layout object; a later eager use (or
    layout.torch_arrays(device) before compiling) makes the general kind."""
    if isinstance(layout, Layout) and torch.compiler.is_compiling() and not layout.has_torch_arrays(device):
        row_offsets, col_indices = _made_while_tracing(id(layout), str(device))
    else:
        row_offsets, col_indices = layout.torch_arrays(device)
    return row_offsets, col_indices, layout.op_grid()


def attention(q, k, v, layout, *, causal=False, scale=None, backend=None):
    """(out, lse) of sparsek.attention through sparsek::attention_fwd:
    differentiable with respect to q, k and v. The arguments are checked
    first, as sparsek.attention does (skipped while torch.compile traces:
    the op checks them again when it runs)."""
    if torch.compiler.is_compiling():
        sc = 0.0 if scale is None else float(scale)
        be = 0 if backend is None else int(_BACKEND_NAMES[backend.lower()] if isinstance(backend, str) else backend)
    else:
        aq = _check_qkv(q, k, v)[0]
        _check_layout(layout)
        be, sc = _options(aq, scale, backend)
        sc = 0.0 if sc is None else sc
        be = 0 if backend is None else int(be)
    row_offsets, col_indices, grid = layout_args(layout, q.device)
    return torch.ops.sparsek.attention_fwd(q, k, v, row_offsets, col_indices, grid, bool(causal), sc, be)


__all__ = ["attention", "attention_bwd", "attention_fwd", "layout_args"]
