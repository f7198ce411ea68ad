"""SparseK: block-sparse attention and BSR GEMM (ctypes binding of libsparsek.so).

    import numpy as np, sparsek
    layout = sparsek.Layout.causal(1024, block=128)
    out = sparsek.attention(q, k, v, layout, causal=True)      # q [B, S, H, D]

    # packed sequences (varlen): q [total_q, H, D], cu_seqlens int32 [B + 1]
    vl = sparsek.VarlenLayout.causal(cu_seqlens, block=64)
    out = sparsek.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, vl, causal=True)
    # the same keys in a paged cache: (k_cache, v_cache, page_table, seq_lens_k)
    kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_seqlens, page_size=16)
    out = sparsek.attention_paged(q, kc, vc, cu_seqlens, lens, table, vl, causal=True)

numpy arrays run on the CPU backend; torch CUDA tensors on the CUDA backend
(torch CPU tensors on the CPU backend). On torch tensors sparsek.attention
is differentiable (the ops of sparsek/torch_ops.py, loaded on the first
torch call: `import sparsek` never imports torch). Plans are cached per
layout (plan_cache_info, clear_plan_cache). Errors from the library raise
SparseKError (.status, .status_name, .message). See python/README.md.
"""

from __future__ import annotations

from ctypes import byref, c_int32
from typing import NamedTuple

from . import _lib
from ._lib import (
    LIBRARY_PATH,
    Backend,
    DType,
    Mask,
    Order,
    SparseKError,
    Status,
    check,
)
from .attention import AttentionPlan, attention, plan_attention
from .gemm import BsrGemmPlan, bsr_gemm
from .backward import AttentionBackwardPlan, attention_backward, plan_attention_backward
from .device_layout import DeviceLayout
from .layout import Grid, Layout, grid_blocks, make_grid
from .paged import attention_paged, paged_kv_from_dense
from .decode import decode
from .plan_cache import clear_plan_cache, plan_cache_info
from .topk import attention_topk, block_pool, layout_from_scores, pool_select_topk, select_topk, topk_capacity
from .varlen import VarlenLayout, attention_varlen, varlen_layout_grid, varlen_max_row_blocks
from .fp8 import attention_fp8, quantize_e4m3
from .decode_select import DecodeSelection, decode_select, kv_summary_append, kv_summary_build


def version() -> str:
    """The loaded library's version, "MAJOR.MINOR.PATCH" (from sk_version)."""
    v = _lib.F.sk_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def version_int() -> int:
    """sk_version(): MAJOR*10000 + MINOR*100 + PATCH."""
    return int(_lib.F.sk_version())


def build_info() -> str:
    """sk_build_info(): compiler, CUDA version and architectures, or "no CUDA"."""
    return _lib.F.sk_build_info().decode("utf-8", "replace")


class DeviceInfo(NamedTuple):
    index: int
    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    memory_bytes: int
    l2_bytes: int


def devices() -> list:
    """The CUDA devices this library can use (empty without CUDA or GPU)."""
    count = c_int32()
    check(_lib.F.sk_device_count(byref(count)))
    out = []
    for i in range(count.value):
        info = _lib.SkDeviceInfo()
        check(_lib.F.sk_device_get_info(i, byref(info)))
        out.append(
            DeviceInfo(
                i,
                info.name.decode("utf-8", "replace"),
                info.cc_major,
                info.cc_minor,
                info.sm_count,
                info.memory_bytes,
                info.l2_bytes,
            )
        )
    return out


def status_name(status: int) -> str:
    """sk_status_name(status)."""
    return _lib.status_name(status)


__version__ = "0.1.0"

__all__ = [
    "AttentionBackwardPlan",
    "AttentionPlan",
    "Backend",
    "BsrGemmPlan",
    "DType",
    "DeviceInfo",
    "DeviceLayout",
    "Grid",
    "LIBRARY_PATH",
    "Layout",
    "Mask",
    "Order",
    "SparseKError",
    "Status",
    "VarlenLayout",
    "attention",
    "attention_backward",
    "attention_paged",
    "attention_topk",
    "attention_varlen",
    "block_pool",
    "bsr_gemm",
    "build_info",
    "decode",
    "clear_plan_cache",
    "devices",
    "grid_blocks",
    "layout_from_scores",
    "make_grid",
    "paged_kv_from_dense",
    "plan_attention",
    "plan_attention_backward",
    "plan_cache_info",
    "select_topk",
    "pool_select_topk",
    "status_name",
    "topk_capacity",
    "varlen_layout_grid",
    "varlen_max_row_blocks",
    "version",
    "version_int",
    "DecodeSelection",
    "decode_select",
    "kv_summary_append",
    "kv_summary_build",
    "attention_fp8",
    "quantize_e4m3",
]

# Context parallelism, the host side (context_parallel.py): sharding, plans,
# the simulated R-rank CPU run. The torch.distributed function comes next.
from .context_parallel import CpPlan, cp_attention_simulated, cp_shard  # noqa: E402

__all__ += ["CpPlan", "cp_attention_simulated", "cp_shard"]

# Context parallelism over torch.distributed (cp_torch.py, torch imported on
# the first call).
from .context_parallel import cp_attention  # noqa: E402

__all__ += ["cp_attention"]

# The context-parallel backward, simulated on the CPU (context_parallel.py).
from .context_parallel import cp_attention_backward_simulated  # noqa: E402

__all__ += ["cp_attention_backward_simulated"]

# The context-parallel backward over torch.distributed (cp_torch_backward.py,
# torch imported on the first call); it also makes cp_attention differentiable.
from .context_parallel import cp_attention_backward  # noqa: E402

__all__ += ["cp_attention_backward"]
# Top-k selection on varlen and paged inputs (topk_varlen.py): VarlenLayouts.
from .topk_varlen import topk_paged, topk_varlen  # noqa: E402

__all__ += ["topk_paged", "topk_varlen"]
# The varlen backward (varlen_backward.py): CPU and CUDA backends.
from .varlen_backward import attention_varlen_backward  # noqa: E402

__all__ += ["attention_varlen_backward"]

# Balanced context-parallel chunks (context_parallel.py: sk_cp_balance);
# CpPlan(chunk_starts=...) takes them.
from .context_parallel import cp_balance  # noqa: E402

__all__ += ["cp_balance"]

# The planned FP8 forward (fp8.py): plan once, run() alone (the bench times it).
from .fp8 import AttentionFp8Plan, plan_attention_fp8  # noqa: E402

__all__ += ["AttentionFp8Plan", "plan_attention_fp8"]
