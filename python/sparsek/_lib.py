"""Loading libsparsek.so and declaring its C API for ctypes.

Everything here mirrors include/sparsek.h exactly: the enums, the structs
(field for field, in order, with the same C types) and the signature of every
exported function (argtypes and restype are set for all of them). Nothing
else in the package calls the library except through ``F`` and ``check``.
The structs range-check their numeric fields and ``F``'s functions their
numeric arguments against the C types (_cvalues), as ctypes would truncate.

The library is found, in order:
  1. the path in the environment variable SPARSEK_LIBRARY;
  2. libsparsek.so next to this file (the copy an installed package carries);
  3. the repository's build/libsparsek.so (a source checkout after `make lib`).
"""

from __future__ import annotations

import ctypes
import enum
import os
from ctypes import (
    POINTER,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint64,
    c_void_p,
)
from pathlib import Path

from ._cvalues import CheckedStructure, checked_function, int32

# ---------------------------------------------------------------------------
# Enums (values as in sparsek.h)
# ---------------------------------------------------------------------------


class Status(enum.IntEnum):
    SUCCESS = 0
    BAD_PARAM = 1000
    BAD_PARAM_NULL_POINTER = 1001
    BAD_PARAM_STRUCT_SIZE = 1002
    BAD_PARAM_SHAPE = 1003
    BAD_PARAM_STRIDE = 1004
    BAD_PARAM_DTYPE = 1005
    BAD_PARAM_ALIGNMENT = 1006
    BAD_PARAM_OVERFLOW = 1007
    BAD_PARAM_VALUE = 1008
    BAD_PARAM_WORKSPACE = 1009
    BAD_LAYOUT_UNSORTED = 1101
    BAD_LAYOUT_DUPLICATE = 1102
    BAD_LAYOUT_INDEX_RANGE = 1103
    BAD_LAYOUT_OFFSETS = 1104
    BAD_LAYOUT_COUNT = 1105
    BAD_LAYOUT_OVERFLOW = 1106
    BAD_LAYOUT_MISMATCH = 1107
    NOT_SUPPORTED = 2000
    NOT_SUPPORTED_BACKEND = 2001
    INTERNAL_ERROR = 3000
    ALLOC_FAILED = 3001
    EXECUTION_FAILED = 4000


class DType(enum.IntEnum):
    F16 = 1
    BF16 = 2
    F32 = 3
    E4M3 = 4  # FP8 e4m3fn: attention forward inputs only


class Backend(enum.IntEnum):
    CPU = 1
    CUDA = 2
    CUDA_SM80 = 3
    CUDA_SM90 = 4


class Mask(enum.IntEnum):
    NONE = 0
    CAUSAL = 1


class Order(enum.IntEnum):
    ROW_MAJOR = 1
    COL_MAJOR = 2


class CpSharding(enum.IntEnum):
    CONTIGUOUS = 1
    ZIGZAG = 2


# ---------------------------------------------------------------------------
# Structs (field order and C types exactly as in sparsek.h); their numeric
# fields are range-checked when set (_cvalues.CheckedStructure)
# ---------------------------------------------------------------------------


class SkGrid(CheckedStructure):
    _c_name_ = "sk_grid"
    _fields_ = [
        ("rows", c_int64),
        ("cols", c_int64),
        ("block_rows", c_int32),
        ("block_cols", c_int32),
        ("batch", c_int32),
        ("heads", c_int32),
    ]


class SkBsr(CheckedStructure):
    _c_name_ = "sk_bsr"
    _fields_ = [
        ("grid", SkGrid),
        ("nnz", c_int32),
        ("row_offsets", POINTER(c_int32)),
        ("col_indices", POINTER(c_int32)),
    ]


class SkTopkOptions(CheckedStructure):
    _c_name_ = "sk_topk_options"
    _fields_ = [
        ("k", c_int32),
        ("sink_blocks", c_int32),
        ("local_blocks", c_int32),
        ("causal", c_int32),
    ]


class SkAttentionDesc(CheckedStructure):
    _c_name_ = "sk_attention_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("seq_q", c_int64),
        ("seq_k", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("scale", c_float),
        ("mask", c_int),  # sk_mask
        ("q_strides", c_int64 * 3),
        ("k_strides", c_int64 * 3),
        ("v_strides", c_int64 * 3),
        ("o_strides", c_int64 * 3),
        # FP8 inputs (dtype E4M3): O's dtype and the fp32 descales, NULL = 1
        ("out_dtype", c_int),  # sk_dtype
        ("q_descale", c_void_p),  # const float * [B, Hq]
        ("k_descale", c_void_p),  # const float * [B, Hkv]
        ("v_descale", c_void_p),  # const float * [B, Hkv]
        ("v_layout", c_int32),  # sk_v_layout: 0 rows, 1 V^T for the FP8 kernel
    ]


class SkAttentionBackwardDesc(CheckedStructure):
    _c_name_ = "sk_attention_backward_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("deterministic", c_int32),
        ("dout_strides", c_int64 * 3),
        ("dq_strides", c_int64 * 3),
        ("dk_strides", c_int64 * 3),
        ("dv_strides", c_int64 * 3),
    ]


class SkVarlenGrid(CheckedStructure):
    _c_name_ = "sk_varlen_grid"
    _fields_ = [
        ("batch", c_int32),
        ("block_rows", c_int32),
        ("block_cols", c_int32),
        ("heads", c_int32),
        ("cu_seqlens_q", POINTER(c_int32)),
        ("cu_seqlens_k", POINTER(c_int32)),
    ]


class SkAttentionVarlenDesc(CheckedStructure):
    _c_name_ = "sk_attention_varlen_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("total_q", c_int64),
        ("total_k", c_int64),
        ("max_seqlen_q", c_int64),
        ("max_seqlen_k", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("scale", c_float),
        ("mask", c_int),  # sk_mask
        ("q_strides", c_int64 * 2),
        ("k_strides", c_int64 * 2),
        ("v_strides", c_int64 * 2),
        ("o_strides", c_int64 * 2),
    ]


class SkAttentionPagedDesc(CheckedStructure):
    _c_name_ = "sk_attention_paged_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("total_q", c_int64),
        ("max_seqlen_q", c_int64),
        ("max_seqlen_k", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("scale", c_float),
        ("mask", c_int),  # sk_mask
        ("num_pages", c_int64),
        ("page_size", c_int32),
        ("max_pages", c_int32),
        ("page_table_stride", c_int64),
        ("q_strides", c_int64 * 2),
        ("o_strides", c_int64 * 2),
        ("k_strides", c_int64 * 3),
        ("v_strides", c_int64 * 3),
    ]


class SkTopkDesc(CheckedStructure):
    _c_name_ = "sk_topk_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("seq_q", c_int64),
        ("seq_k", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("q_strides", c_int64 * 3),
        ("k_strides", c_int64 * 3),
        ("block_q", c_int32),
        ("block_k", c_int32),
        ("scale", c_float),
        ("k", c_int32),
        ("sink_blocks", c_int32),
        ("local_blocks", c_int32),
        ("mask", c_int),  # sk_mask
        ("per_kv_head", c_int32),
    ]


class SkTopkVarlenDesc(CheckedStructure):
    _c_name_ = "sk_topk_varlen_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("total_q", c_int64),
        ("total_k", c_int64),
        ("max_seqlen_q", c_int64),
        ("max_seqlen_k", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("q_strides", c_int64 * 2),
        ("k_strides", c_int64 * 2),
        ("block_q", c_int32),
        ("block_k", c_int32),
        ("scale", c_float),
        ("k", c_int32),
        ("sink_blocks", c_int32),
        ("local_blocks", c_int32),
        ("mask", c_int),  # sk_mask
        ("per_kv_head", c_int32),
        ("num_pages", c_int64),
        ("page_size", c_int32),
        ("max_pages", c_int32),
        ("page_table_stride", c_int64),
        ("k_cache_strides", c_int64 * 3),
    ]


class SkBsrGemmDesc(CheckedStructure):
    _c_name_ = "sk_bsr_gemm_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("ab_dtype", c_int),  # sk_dtype
        ("c_dtype", c_int),  # sk_dtype
        ("m", c_int64),
        ("n", c_int64),
        ("k", c_int64),
        ("b_order", c_int),  # sk_order
        ("ldb", c_int64),
        ("ldc", c_int64),
        ("alpha", c_float),
        ("beta", c_float),
    ]


class SkDecodeDesc(CheckedStructure):
    _c_name_ = "sk_decode_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("q_len", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("scale", c_float),
        ("mask", c_int),  # sk_mask
        ("max_seqlen_k", c_int64),
        ("num_pages", c_int64),
        ("page_size", c_int32),
        ("max_pages", c_int32),
        ("page_table_stride", c_int64),
        ("q_strides", c_int64 * 3),
        ("o_strides", c_int64 * 3),
        ("k_strides", c_int64 * 3),
        ("v_strides", c_int64 * 3),
        ("num_splits", c_int32),
    ]


class SkDeviceInfo(CheckedStructure):
    _c_name_ = "sk_device_info"
    _fields_ = [
        ("name", c_char * 256),
        ("cc_major", c_int32),
        ("cc_minor", c_int32),
        ("sm_count", c_int32),
        ("memory_bytes", c_int64),
        ("l2_bytes", c_int64),
    ]


class SkCpDesc(CheckedStructure):
    _c_name_ = "sk_cp_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("ranks", c_int32),
        ("rank", c_int32),
        ("sharding", c_int),  # sk_cp_sharding
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("seq", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("scale", c_float),
        ("mask", c_int),  # sk_mask
        ("chunk_starts", c_void_p),  # const int32_t * [C + 1], host; NULL: equal chunks
        ("reserve_sms", c_int32),
    ]


class SkDecodeSelectDesc(CheckedStructure):
    _c_name_ = "sk_decode_select_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("q_len", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("head_dim", c_int64),
        ("max_seqlen_k", c_int64),
        ("block_k", c_int32),
        ("scale", c_float),
        ("k", c_int32),
        ("sink_blocks", c_int32),
        ("recent_blocks", c_int32),
        ("q_strides", c_int64 * 3),
        ("num_pages", c_int64),
        ("page_size", c_int32),
        ("max_pages", c_int32),
        ("page_table_stride", c_int64),
        ("k_strides", c_int64 * 3),
        ("group_blocks", c_int32),
        ("top_groups", c_int32),
    ]


class SkQuantizeDesc(CheckedStructure):
    _c_name_ = "sk_quantize_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),  # sk_backend
        ("dtype", c_int),  # sk_dtype
        ("batch", c_int64),
        ("seq", c_int64),
        ("heads", c_int64),
        ("head_dim", c_int64),
        ("x_strides", c_int64 * 3),
        ("layout", c_int32),  # sk_quant_layout: 0 rows, 1 VT_FP8
    ]



class SkAttentionVarlenBackwardDesc(CheckedStructure):
    _c_name_ = "sk_attention_varlen_backward_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("deterministic", c_int32),
        ("dout_strides", c_int64 * 2),
        ("dq_strides", c_int64 * 2),
        ("dk_strides", c_int64 * 2),
        ("dv_strides", c_int64 * 2),
    ]

class SkCpCost(CheckedStructure):
    _c_name_ = "sk_cp_cost"
    _fields_ = [
        ("local_block", c_double),
        ("remote_block", c_double),
        ("tile", c_double),
    ]


# The fields of each struct, for the ABI test that compares offsets with a C
# compiler's view of sparsek.h.
STRUCTS = {
    "sk_grid": SkGrid,
    "sk_bsr": SkBsr,
    "sk_topk_options": SkTopkOptions,
    "sk_attention_desc": SkAttentionDesc,
    "sk_attention_backward_desc": SkAttentionBackwardDesc,
    "sk_varlen_grid": SkVarlenGrid,
    "sk_attention_varlen_desc": SkAttentionVarlenDesc,
    "sk_attention_paged_desc": SkAttentionPagedDesc,
    "sk_topk_desc": SkTopkDesc,
    "sk_bsr_gemm_desc": SkBsrGemmDesc,
    "sk_device_info": SkDeviceInfo,
    "sk_decode_desc": SkDecodeDesc,
    "sk_decode_select_desc": SkDecodeSelectDesc,
    "sk_quantize_desc": SkQuantizeDesc,
    "sk_cp_desc": SkCpDesc,
    "sk_topk_varlen_desc": SkTopkVarlenDesc,
    "sk_attention_varlen_backward_desc": SkAttentionVarlenBackwardDesc,
    "sk_cp_cost": SkCpCost,
}

# ---------------------------------------------------------------------------
# Function signatures: name -> (restype, argtypes), every SK_API function
# ---------------------------------------------------------------------------

_st = c_int  # sk_status
_layout_out = POINTER(c_void_p)  # sk_layout_t *
_grid_p = POINTER(SkGrid)
_bsr_p = POINTER(SkBsr)
_i32_p = POINTER(c_int32)
_stream = c_void_p  # struct CUstream_st *
_vgrid_p = POINTER(SkVarlenGrid)
_varlen_p = POINTER(SkAttentionVarlenDesc)
_paged_p = POINTER(SkAttentionPagedDesc)

SIGNATURES = {
    "sk_version": (c_int, []),
    "sk_build_info": (c_char_p, []),
    "sk_status_name": (c_char_p, [c_int]),
    "sk_status_get_category": (c_int, [c_int]),
    "sk_last_error": (c_char_p, []),
    "sk_grid_blocks": (_st, [_grid_p, _i32_p, _i32_p, _i32_p]),
    "sk_layout_validate": (_st, [_bsr_p]),
    "sk_layout_destroy": (None, [c_void_p]),
    "sk_layout_view": (_st, [c_void_p, _bsr_p]),
    "sk_layout_create_dense": (_st, [_layout_out, _grid_p]),
    "sk_layout_create_causal": (_st, [_layout_out, _grid_p]),
    "sk_layout_create_window": (_st, [_layout_out, _grid_p, c_int64, c_int64]),
    "sk_layout_create_sinks_window": (_st, [_layout_out, _grid_p, c_int64, c_int64]),
    "sk_layout_create_strided": (_st, [_layout_out, _grid_p, c_int32, c_int32, c_int]),
    "sk_layout_create_random": (_st, [_layout_out, _grid_p, c_int32, c_uint64, c_int]),
    "sk_layout_create_topk": (
        _st,
        [_layout_out, _grid_p, POINTER(c_float), POINTER(SkTopkOptions)],
    ),
    "sk_layout_create_from_mask": (_st, [_layout_out, _grid_p, POINTER(c_uint8)]),
    "sk_layout_to_mask": (_st, [_bsr_p, POINTER(c_uint8), c_size_t]),
    "sk_layout_create_from_flex": (_st, [_layout_out, _grid_p, _i32_p, _i32_p, c_int32]),
    "sk_layout_to_flex": (_st, [_bsr_p, _i32_p, c_size_t, _i32_p, c_size_t]),
    "sk_layout_create_from_bsr": (_st, [_layout_out, _bsr_p]),
    "sk_attention_desc_init": (_st, [POINTER(SkAttentionDesc), c_size_t]),
    "sk_attention_workspace_size": (
        _st,
        [POINTER(SkAttentionDesc), _bsr_p, POINTER(c_size_t)],
    ),
    "sk_attention_plan": (
        _st,
        [POINTER(SkAttentionDesc), _bsr_p, c_void_p, c_size_t, _stream],
    ),
    # q, k, v, o are const void * / void *; lse is float * (c_void_p is the
    # same machine type and takes raw addresses from numpy and torch).
    "sk_attention_run": (
        _st,
        [
            POINTER(SkAttentionDesc),
            _bsr_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_size_t,
            _stream,
        ],
    ),
    "sk_attention_forward": (
        _st,
        [
            POINTER(SkAttentionDesc),
            _bsr_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_size_t,
            _stream,
        ],
    ),
    # The backward: q, k, v, o, dout, lse, dq, dk, dv are data pointers
    # (c_void_p, as above).
    "sk_attention_backward_desc_init": (_st, [POINTER(SkAttentionBackwardDesc), c_size_t]),
    "sk_attention_backward_workspace_size": (
        _st,
        [POINTER(SkAttentionDesc), POINTER(SkAttentionBackwardDesc), _bsr_p, POINTER(c_size_t)],
    ),
    "sk_attention_backward_plan": (
        _st,
        [POINTER(SkAttentionDesc), POINTER(SkAttentionBackwardDesc), _bsr_p, c_void_p, c_size_t, _stream],
    ),
    "sk_attention_backward_run": (
        _st,
        [POINTER(SkAttentionDesc), POINTER(SkAttentionBackwardDesc), _bsr_p]
        + [c_void_p] * 10
        + [c_size_t, _stream],
    ),
    "sk_attention_backward": (
        _st,
        [POINTER(SkAttentionDesc), POINTER(SkAttentionBackwardDesc), _bsr_p]
        + [c_void_p] * 10
        + [c_size_t, _stream],
    ),
    # Varlen batches: the length arrays, like the tensors, are raw addresses
    # (c_void_p) from numpy or torch.
    "sk_varlen_layout_grid": (_st, [_vgrid_p, _grid_p]),
    "sk_varlen_max_row_blocks": (_st, [c_int64, c_int64, c_int64, c_int32, _i32_p]),
    "sk_layout_validate_varlen": (_st, [_bsr_p, _vgrid_p]),
    "sk_layout_create_varlen_dense": (_st, [_layout_out, _vgrid_p]),
    "sk_layout_create_varlen_causal": (_st, [_layout_out, _vgrid_p]),
    "sk_layout_create_varlen_window": (_st, [_layout_out, _vgrid_p, c_int64, c_int64]),
    "sk_layout_create_varlen_sinks_window": (_st, [_layout_out, _vgrid_p, c_int64, c_int64]),
    "sk_layout_create_varlen_random": (_st, [_layout_out, _vgrid_p, c_int32, c_uint64, c_int]),
    "sk_layout_create_varlen_from_masks": (_st, [_layout_out, _vgrid_p, POINTER(c_uint8), c_size_t]),
    "sk_layout_create_varlen_from_layouts": (_st, [_layout_out, _vgrid_p, POINTER(_bsr_p)]),
    "sk_attention_varlen_desc_init": (_st, [_varlen_p, c_size_t]),
    "sk_attention_varlen_workspace_size": (_st, [_varlen_p, _bsr_p, POINTER(c_size_t)]),
    "sk_attention_varlen_plan": (_st, [_varlen_p, _bsr_p, c_void_p, c_void_p, c_void_p, c_size_t, _stream]),
    "sk_attention_varlen_run": (_st, [_varlen_p, _bsr_p] + [c_void_p] * 8 + [c_size_t, _stream]),
    "sk_attention_varlen_forward": (_st, [_varlen_p, _bsr_p] + [c_void_p] * 8 + [c_size_t, _stream]),
    # The paged KV cache: cu_seqlens_q, seq_lens_k, page_table and the
    # tensors are raw addresses (c_void_p).
    "sk_attention_paged_desc_init": (_st, [_paged_p, c_size_t]),
    "sk_attention_paged_workspace_size": (_st, [_paged_p, _bsr_p, POINTER(c_size_t)]),
    "sk_attention_paged_plan": (_st, [_paged_p, _bsr_p] + [c_void_p] * 4 + [c_size_t, _stream]),
    "sk_attention_paged_run": (_st, [_paged_p, _bsr_p] + [c_void_p] * 9 + [c_size_t, _stream]),
    "sk_attention_paged_forward": (_st, [_paged_p, _bsr_p] + [c_void_p] * 9 + [c_size_t, _stream]),
    # Decode (q_len new tokens over the paged cache): arrays and tensors are
    # raw addresses (c_void_p).
    "sk_decode_desc_init": (_st, [POINTER(SkDecodeDesc), c_size_t]),
    "sk_layout_validate_decode": (_st, [_bsr_p, POINTER(SkDecodeDesc), c_void_p]),
    "sk_decode_splits": (_st, [POINTER(SkDecodeDesc), _bsr_p, _i32_p]),
    "sk_decode_workspace_size": (_st, [POINTER(SkDecodeDesc), _bsr_p, POINTER(c_size_t)]),
    "sk_decode_plan": (_st, [POINTER(SkDecodeDesc), _bsr_p] + [c_void_p] * 3 + [c_size_t, _stream]),
    "sk_decode_run": (_st, [POINTER(SkDecodeDesc), _bsr_p] + [c_void_p] * 8 + [c_size_t, _stream]),
    "sk_decode": (_st, [POINTER(SkDecodeDesc), _bsr_p] + [c_void_p] * 8 + [c_size_t, _stream]),
    # Dynamic top-k selection. Data pointers (q, k, pooled arrays, scores,
    # o, lse) are c_void_p: the same machine type as the header's typed
    # pointers, taking raw addresses from numpy and torch.
    "sk_topk_desc_init": (_st, [POINTER(SkTopkDesc), c_size_t]),
    "sk_topk_layout_capacity": (_st, [POINTER(SkTopkDesc), _grid_p, _i32_p]),
    "sk_topk_workspace_size": (_st, [POINTER(SkTopkDesc), POINTER(c_size_t)]),
    "sk_block_pool": (
        _st,
        [POINTER(SkTopkDesc), c_void_p, c_void_p, c_void_p, c_void_p, _stream],
    ),
    "sk_select_topk": (
        _st,
        [POINTER(SkTopkDesc), c_void_p, c_void_p, _bsr_p, c_void_p, c_size_t, _stream],
    ),
    "sk_layout_from_scores": (
        _st,
        [POINTER(SkTopkDesc), c_void_p, _bsr_p, c_void_p, c_size_t, _stream],
    ),
    "sk_pool_select_topk_workspace_size": (_st, [POINTER(SkTopkDesc), POINTER(c_size_t)]),
    "sk_pool_select_topk": (
        _st,
        [POINTER(SkTopkDesc), c_void_p, c_void_p, _bsr_p, c_void_p, c_size_t, _stream],
    ),
    "sk_attention_topk_workspace_size": (
        _st,
        [POINTER(SkAttentionDesc), POINTER(SkTopkDesc), POINTER(c_size_t)],
    ),
    "sk_attention_topk": (
        _st,
        [
            POINTER(SkAttentionDesc),
            POINTER(SkTopkDesc),
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            _bsr_p,
            c_void_p,
            c_size_t,
            _stream,
        ],
    ),
    "sk_bsr_gemm_desc_init": (_st, [POINTER(SkBsrGemmDesc), c_size_t]),
    "sk_bsr_gemm_workspace_size": (_st, [POINTER(SkBsrGemmDesc), _bsr_p, POINTER(c_size_t)]),
    "sk_bsr_gemm_plan": (_st, [POINTER(SkBsrGemmDesc), _bsr_p, c_void_p, c_size_t, _stream]),
    "sk_bsr_gemm_run": (
        _st,
        [
            POINTER(SkBsrGemmDesc),
            _bsr_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_size_t,
            _stream,
        ],
    ),
    "sk_bsr_gemm": (
        _st,
        [
            POINTER(SkBsrGemmDesc),
            _bsr_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_size_t,
            _stream,
        ],
    ),
    "sk_device_count": (_st, [_i32_p]),
    "sk_device_get_info": (_st, [c_int32, POINTER(SkDeviceInfo)]),
    "sk_decode_select_desc_init": (_st, [POINTER(SkDecodeSelectDesc), c_size_t]),
    "sk_kv_summary_bytes": (_st, [POINTER(SkDecodeSelectDesc), POINTER(c_size_t)]),
    "sk_kv_summary_build": (
        _st,
        [POINTER(SkDecodeSelectDesc), c_void_p, _i32_p, _i32_p, c_void_p, _stream],
    ),
    "sk_kv_summary_append": (
        _st,
        [POINTER(SkDecodeSelectDesc), c_void_p, _i32_p, _i32_p, _i32_p, c_void_p, _stream],
    ),
    "sk_decode_select_capacity": (_st, [POINTER(SkDecodeSelectDesc), _grid_p, _i32_p]),
    "sk_decode_select_workspace_size": (_st, [POINTER(SkDecodeSelectDesc), POINTER(c_size_t)]),
    "sk_decode_select": (
        _st,
        [POINTER(SkDecodeSelectDesc), c_void_p, c_void_p, _i32_p, _bsr_p, c_void_p, c_size_t, _stream],
    ),
    "sk_quantize_desc_init": (_st, [POINTER(SkQuantizeDesc), c_size_t]),
    "sk_quantize_e4m3_workspace_size": (_st, [POINTER(SkQuantizeDesc), POINTER(c_size_t)]),
    "sk_quantize_e4m3": (
        _st,
        [POINTER(SkQuantizeDesc), c_void_p, c_void_p, c_void_p, c_void_p, c_size_t, _stream],
    ),
    "sk_quantize_vt_elems": (_st, [c_int64, c_int64, c_int64, c_int64, POINTER(c_int64)]),
    # Context parallel: plans, workspaces and tensors are raw addresses
    # (c_void_p); sk_comm_t is an opaque pointer.
    "sk_cp_desc_init": (_st, [POINTER(SkCpDesc), c_size_t]),
    "sk_cp_shard": (
        _st,
        [POINTER(SkCpDesc), c_int32, c_int32, POINTER(c_int64), _i32_p, POINTER(c_int64), POINTER(c_int64)],
    ),
    "sk_cp_plan_size": (_st, [POINTER(SkCpDesc), _bsr_p, POINTER(c_size_t)]),
    "sk_cp_plan": (_st, [POINTER(SkCpDesc), _bsr_p, c_void_p, c_size_t]),
    "sk_cp_plan_bytes": (_st, [c_void_p, c_size_t, c_int32, c_int32, POINTER(c_int64), POINTER(c_int64)]),
    "sk_cp_workspace_size": (_st, [POINTER(SkCpDesc), c_void_p, c_size_t, POINTER(c_size_t)]),
    "sk_cp_prepare": (_st, [POINTER(SkCpDesc), c_void_p, c_size_t, c_void_p, c_size_t, _stream]),
    "sk_comm_create_simulated": (_st, [c_int32, POINTER(c_void_p)]),
    "sk_comm_create_simulated_cuda": (_st, [c_int32, POINTER(c_void_p)]),
    "sk_comm_create_nccl": (_st, [c_void_p, POINTER(c_void_p)]),
    "sk_comm_destroy": (None, [c_void_p]),
    "sk_comm_info": (_st, [c_void_p, _i32_p, _i32_p, POINTER(c_int64)]),
    "sk_cp_forward": (
        _st,
        [POINTER(SkCpDesc), c_void_p, c_size_t, c_void_p] + [c_void_p] * 6 + [c_size_t, _stream],
    ),
    # The context-parallel backward (tensors and the workspace as addresses).
    "sk_cp_backward_workspace_size": (_st, [POINTER(SkCpDesc), c_void_p, c_size_t, POINTER(c_size_t)]),
    "sk_cp_backward_prepare": (_st, [POINTER(SkCpDesc), c_void_p, c_size_t, c_void_p, c_size_t, _stream]),
    "sk_cp_backward": (
        _st,
        [POINTER(SkCpDesc), c_void_p, c_size_t, c_void_p] + [c_void_p] * 10 + [c_size_t, _stream],
    ),
    # Balanced context-parallel chunks (chunk starts as an int32 array)
    "sk_cp_cost_default": (_st, [POINTER(SkCpCost)]),
    "sk_cp_predict": (
        _st,
        [POINTER(SkCpDesc), _bsr_p, POINTER(SkCpCost), c_void_p, c_void_p, c_void_p, c_void_p],
    ),
    "sk_cp_balance": (_st, [POINTER(SkCpDesc), _bsr_p, POINTER(SkCpCost), _i32_p, c_int32]),
    # Top-k on varlen / paged inputs
    "sk_topk_varlen_desc_init": (_st, [POINTER(SkTopkVarlenDesc), c_size_t]),
    "sk_topk_varlen_layout_capacity": (_st, [POINTER(SkTopkVarlenDesc), _grid_p, _i32_p]),
    "sk_topk_varlen_workspace_size": (_st, [POINTER(SkTopkVarlenDesc), POINTER(c_size_t)]),
    "sk_topk_paged_workspace_size": (_st, [POINTER(SkTopkVarlenDesc), POINTER(c_size_t)]),
    "sk_topk_varlen_select": (
        _st,
        [POINTER(SkTopkVarlenDesc)] + [c_void_p] * 4 + [_bsr_p, c_void_p, c_size_t, _stream],
    ),
    "sk_topk_paged_select": (
        _st,
        [POINTER(SkTopkVarlenDesc)] + [c_void_p] * 5 + [_bsr_p, c_void_p, c_size_t, _stream],
    ),
    # The varlen backward: length arrays and tensors as addresses.
    "sk_attention_varlen_backward_desc_init": (_st, [POINTER(SkAttentionVarlenBackwardDesc), c_size_t]),
    "sk_attention_varlen_backward_workspace_size": (
        _st,
        [_varlen_p, POINTER(SkAttentionVarlenBackwardDesc), _bsr_p, POINTER(c_size_t)],
    ),
    "sk_attention_varlen_backward_plan": (
        _st,
        [_varlen_p, POINTER(SkAttentionVarlenBackwardDesc), _bsr_p] + [c_void_p] * 3 + [c_size_t, _stream],
    ),
    "sk_attention_varlen_backward_run": (
        _st,
        [_varlen_p, POINTER(SkAttentionVarlenBackwardDesc), _bsr_p] + [c_void_p] * 12 + [c_size_t, _stream],
    ),
    "sk_attention_varlen_backward": (
        _st,
        [_varlen_p, POINTER(SkAttentionVarlenBackwardDesc), _bsr_p] + [c_void_p] * 12 + [c_size_t, _stream],
    ),
}

# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

LIBRARY_NAME = "libsparsek.so"
_HERE = Path(__file__).resolve().parent


def candidate_paths() -> list:
    """Where the library is looked for, in order (see the module text)."""
    paths = []
    env = os.environ.get("SPARSEK_LIBRARY")
    if env:
        paths.append(Path(env))
    paths.append(_HERE / LIBRARY_NAME)
    paths.append(_HERE.parent.parent / "build" / LIBRARY_NAME)
    return paths


def _load():
    tried = []
    env = os.environ.get("SPARSEK_LIBRARY")
    for path in candidate_paths():
        if not path.is_file():
            tried.append(f"{path} (absent)")
            if env and path == Path(env):
                # An explicit choice that does not exist is an error, not a
                # reason to pick some other copy silently.
                break
            continue
        try:
            # The absolute path: LIBRARY_PATH is what subprocesses and error
            # texts name, and a relative SPARSEK_LIBRARY means nothing from
            # another working directory.
            return ctypes.CDLL(str(path)), path.resolve()
        except OSError as e:
            tried.append(f"{path} ({e})")
            if env and path == Path(env):
                break
    raise ImportError(
        "sparsek: cannot load libsparsek.so; tried: "
        + "; ".join(tried)
        + ". Build it with `make lib` in the repository, or set SPARSEK_LIBRARY "
        "to its path."
    )


LIB, LIBRARY_PATH = _load()

# Functions this library copy does not export (an old or partial build):
# calling one raises a clear error instead of failing at import.
MISSING = []


def _missing(name):
    def call(*args, **kwargs):
        raise RuntimeError(
            f"sparsek: {LIBRARY_PATH} does not export {name}; rebuild the library "
            "(`make lib`) from the same source as this package"
        )

    call.__name__ = name
    return call


class _Functions:
    """Attribute access to the declared functions."""


F = _Functions()
for _name, (_res, _args) in SIGNATURES.items():
    try:
        _fn = getattr(LIB, _name)
    except AttributeError:
        MISSING.append(_name)
        setattr(F, _name, _missing(_name))
        continue
    _fn.restype = _res
    _fn.argtypes = _args
    # Integer arguments are range-checked first: ctypes would truncate them.
    setattr(F, _name, checked_function(_name, _fn, _args))

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class SparseKError(RuntimeError):
    """A SparseK call returned a status other than SK_STATUS_SUCCESS.

    Attributes:
        status: the sk_status value (int).
        status_name: its name, e.g. "SK_STATUS_BAD_PARAM_SHAPE".
        message: the library's sk_last_error() text for the failed call.
        category: status // 1000 (1 bad parameter, 2 not supported,
            3 internal, 4 execution failed).
    """

    def __init__(self, status: int, status_name: str, message: str):
        self.status = int(status)
        self.status_name = status_name
        self.message = message
        self.category = self.status // 1000
        super().__init__(f"{status_name} ({self.status}): {message}")


def status_name(status: int) -> str:
    return F.sk_status_name(int32(status, "status")).decode("utf-8", "replace")


def check(status: int) -> None:
    """Raise SparseKError for a non-zero status. Must be called right after
    the failing call, on the same thread (the message is thread-local)."""
    if status != 0:
        message = F.sk_last_error()
        text = message.decode("utf-8", "replace") if message else ""
        raise SparseKError(status, status_name(status), text)
