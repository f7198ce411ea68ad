/*
 * sparsek.h - SparseK: block-sparse attention and BSR GEMM for NVIDIA GPUs,
 * with a CPU reference backend.
 *
 * This is the one installed header. It is C99, includes no CUDA header and
 * can be used from C, C++ and ctypes.
 *
 * ---------------------------------------------------------------------------
 * Conventions
 * ---------------------------------------------------------------------------
 * - Every call that can fail returns sk_status. On failure the call has
 *   written nothing to its outputs, and sk_last_error() returns a text that
 *   names the bad argument and says why. Every sk_status-returning call
 *   clears that text on entry. The library never exits, aborts or prints.
 * - Descriptors (sk_attention_desc, sk_bsr_gemm_desc) are plain structs that
 *   must be filled by their *_init function, which takes sizeof the struct:
 *   fields added in later versions go at the end, and an older caller's
 *   smaller struct keeps working with the defaults for the new fields.
 * - Streams are `struct CUstream_st *`, the same type as cudaStream_t; NULL
 *   is the legacy default stream. The CPU backend ignores the stream.
 * - Workspace, its size and the stream come last (the cuBLASLt order).
 * - Sizes and strides are int64_t; block indices are int32_t.
 * - "Ownership": unless a function says otherwise, every pointer argument is
 *   borrowed for the duration of the call only. For the CUDA backend the
 *   tensors, the layout arrays and the workspace are device memory that must
 *   stay valid until the stream work that uses them has finished.
 * - Workspace and streams: a CUDA workspace holds one plan and the run's
 *   tile counter, which every run resets and the kernel advances. Work that
 *   uses one workspace (plans and runs) must be ordered: on one stream, or
 *   across streams through events. Two runs in flight at once on different
 *   streams need one workspace each (they may share the layout and the
 *   read-only tensors); sharing one races on the counter and gives wrong or
 *   missing outputs. The library cannot detect it (it never synchronises).
 * - Aliasing: no buffer a call writes (outputs, output layout arrays, the
 *   CUDA workspace) may share a byte with any other buffer argument of the
 *   call, read or written, layout arrays included; buffers that are exactly
 *   adjacent (one ends where the other starts) are fine. Each buffer counts
 *   as the bytes the call may touch: a strided tensor from its pointer to
 *   its last element, a layout's row_offsets as slices * row_blocks + 1
 *   entries and col_indices as nnz (an output layout: its capacity), the
 *   workspace as workspace_size bytes, at most what the entry point's
 *   *_workspace_size call gives (0 on the CPU: unused). The test is on
 *   addresses, so it holds for device pointers too, and runs before
 *   anything is read or written: a violation is SK_STATUS_BAD_PARAM_STRIDE
 *   with a message naming both arguments ("o overlaps layout->col_indices
 *   in memory ...").
 * - Sizes: every size derived from the arguments (block counts, element and
 *   byte spans of strided tensors, products such as B x S x H x D x
 *   element bytes) is computed exactly; one that does not fit int64 is
 *   SK_STATUS_BAD_PARAM_OVERFLOW naming the tensor, and a grid whose counts
 *   do not fit int32 is SK_STATUS_BAD_LAYOUT_OVERFLOW.
 * - Alignment: every array is aligned to its element type (int32 layout
 *   arrays, counts and indices, fp32 scores and LSE: 4 bytes; fp16/bf16
 *   tensors: 2), on every backend; CUDA tensors, pooled buffers and
 *   workspaces need 16 bytes where their entries say so. A misaligned
 *   pointer is SK_STATUS_BAD_PARAM_ALIGNMENT naming the argument.
 *
 * ---------------------------------------------------------------------------
 * Attention semantics
 * ---------------------------------------------------------------------------
 * Shapes (element strides for the three outer dimensions; D is contiguous):
 *   Q   [B, Sq, Hq,  D]
 *   K   [B, Sk, Hkv, D]      Hq is a multiple of Hkv (GQA / MQA);
 *   V   [B, Sk, Hkv, D]      query head h reads KV head h / (Hq / Hkv)
 *   O   [B, Sq, Hq,  D]
 *   LSE [B, Hq, Sq]  fp32, contiguous, natural log; may be NULL
 *
 * For each (b, h) the layout slice (see sk_bsr) selects, for query block i
 * (tokens i*bq .. i*bq+bq-1), the key blocks j (tokens j*bk .. j*bk+bk-1) it
 * attends to. With s = scale (default 1/sqrt(D)), for query token q:
 *
 *   S[q, k] = s * dot(Q[b, q, h, :], K[b, k, h_kv, :])   for k in the
 *             selected blocks of q's block, k < Sk, and, when causal,
 *             k <= q + (Sk - Sq)  (bottom-right alignment, as FlashAttention)
 *   O[b, q, h, :] = sum_k softmax_k(S[q, :]) * V[b, k, h_kv, :]
 *   LSE[b, h, q]  = log(sum_k exp(S[q, k]))
 *
 * - Tails: Sq and Sk need not be multiples of the block sizes; tokens past
 *   the end of the last block are masked, never read.
 * - A query row with no admissible key (an empty layout row, or every key
 *   masked by causality) gets O = 0 and LSE = -inf.
 * - The computation is in fp32 with fp16/bf16 inputs; O is rounded to the
 *   input dtype.
 * - Scale: any finite s with |s| * log2(e) below FLT_MAX in fp32 (|s| below
 *   about 2.358e38); larger ones are SK_STATUS_BAD_PARAM_VALUE on every
 *   backend, because the CUDA kernels' softmax is in base 2 with
 *   s * log2(e) folded into one fp32 factor, which would be inf.
 * - Logits that overflow: the library does not inspect the data. When
 *   finite inputs and an accepted scale give a logit S[q, k] (or its base-2
 *   form on CUDA) beyond the fp32 range, that row's O and LSE are not
 *   specified. On the CPU backend a logit of +inf makes the row's O and LSE
 *   NaN, and a logit of -inf gets weight 0 while the row has a finite one
 *   (tested in tests/cpu/test_scale_limits.c).
 *
 * ---------------------------------------------------------------------------
 * Robustness of the GPU kernels
 * ---------------------------------------------------------------------------
 * The CUDA backend reads the layout from device memory and does not validate
 * it (that would need a copy to the host). The kernels never read or write
 * out of bounds for ANY layout content: each row's start and end offsets
 * are clamped to [0, nnz] and its end raised to its start (so the rows of
 * a corrupt layout may overlap, but each stays inside col_indices), and
 * column indices outside [0, col_blocks) are skipped as if absent. Results
 * for a layout that fails sk_layout_validate are otherwise unspecified (a
 * duplicated index counts that block twice). Validate host layouts with
 * sk_layout_validate before uploading them.
 *
 * Limits of the CUDA backend (SK_STATUS_NOT_SUPPORTED beyond them, before
 * anything is enqueued): head_dim 64 or 128; a sequence stride below
 * 2^24 bytes; Sq and Sk below 2^31 - 256; at most 2^31 - 1 tiles
 * (B * Hq * ceil(Sq / block_q)). E4M3 inputs run on the Hopper FP8 kernel
 * alone: compute capability 9.0, block_q and block_k 64 or 128 (not
 * SK_BACKEND_CUDA_SM80).
 */
#ifndef SPARSEK_H
#define SPARSEK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SK_API __attribute__((visibility("default")))
#else
#define SK_API
#endif

/* The CUDA stream type (cudaStream_t is `struct CUstream_st *`), declared
 * here so that no CUDA header is needed. */
struct CUstream_st;

/* ---------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------- */

#define SK_VERSION_MAJOR 0
#define SK_VERSION_MINOR 1
#define SK_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, as cudnn_version.h. */
#define SK_VERSION (SK_VERSION_MAJOR * 10000 + SK_VERSION_MINOR * 100 + SK_VERSION_PATCH)

/* The version of the library that is loaded (may differ from SK_VERSION of
 * the header the caller was compiled with). */
SK_API int sk_version(void);

/* A static text describing the build: compiler, CUDA version and the GPU
 * architectures compiled in (or "no CUDA"). Never NULL. */
SK_API const char *sk_build_info(void);

/* ---------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------- */

/* Codes are grouped by category, as cuDNN does: code / 1000 is the
 * category (sk_status_category). */
typedef enum sk_status {
    SK_STATUS_SUCCESS = 0,

    /* 1xxx: a bad argument. Nothing was written. */
    SK_STATUS_BAD_PARAM = 1000,              /* an argument is invalid (generic) */
    SK_STATUS_BAD_PARAM_NULL_POINTER = 1001, /* a required pointer is NULL */
    SK_STATUS_BAD_PARAM_STRUCT_SIZE = 1002,  /* struct_size too small, or desc not initialised */
    SK_STATUS_BAD_PARAM_SHAPE = 1003,        /* a size is zero/negative or sizes disagree */
    SK_STATUS_BAD_PARAM_STRIDE = 1004,       /* a stride is negative, or buffers overlap
                                                (see "Aliasing" above) */
    SK_STATUS_BAD_PARAM_DTYPE = 1005,        /* a dtype is unknown or not allowed there */
    SK_STATUS_BAD_PARAM_ALIGNMENT = 1006,    /* a pointer or stride is misaligned */
    SK_STATUS_BAD_PARAM_OVERFLOW = 1007,     /* a size product overflows int64 */
    SK_STATUS_BAD_PARAM_VALUE = 1008,        /* a scalar is out of range (scale, k, enum) */
    SK_STATUS_BAD_PARAM_WORKSPACE = 1009,    /* the workspace is NULL or too small */

    /* 11xx: a bad layout (also bad arguments). Nothing was written. */
    SK_STATUS_BAD_LAYOUT_UNSORTED = 1101,    /* column indices of a row not increasing */
    SK_STATUS_BAD_LAYOUT_DUPLICATE = 1102,   /* a column index repeated within a row */
    SK_STATUS_BAD_LAYOUT_INDEX_RANGE = 1103, /* a column index outside [0, col_blocks) */
    SK_STATUS_BAD_LAYOUT_OFFSETS = 1104,     /* row offsets not starting at 0 or decreasing */
    SK_STATUS_BAD_LAYOUT_COUNT = 1105,       /* the last row offset differs from nnz */
    SK_STATUS_BAD_LAYOUT_OVERFLOW = 1106,    /* grid or block counts do not fit int32 */
    SK_STATUS_BAD_LAYOUT_MISMATCH = 1107,    /* layout geometry disagrees with the tensors */

    /* 2xxx: valid, but not supported by this build, device or backend. */
    SK_STATUS_NOT_SUPPORTED = 2000,         /* a combination this backend lacks (e.g. D = 96) */
    SK_STATUS_NOT_SUPPORTED_BACKEND = 2001, /* backend not built in, or no usable GPU */

    /* 3xxx: a bug in SparseK. Please report it. */
    SK_STATUS_INTERNAL_ERROR = 3000,
    SK_STATUS_ALLOC_FAILED = 3001, /* a host allocation (layout builders, CPU scratch) failed */

    /* 4xxx: the work was handed to the GPU and failed. */
    SK_STATUS_EXECUTION_FAILED = 4000 /* a CUDA call failed; the text has cudaGetErrorName */
} sk_status;

typedef enum sk_status_category {
    SK_STATUS_CATEGORY_SUCCESS = 0,
    SK_STATUS_CATEGORY_BAD_PARAM = 1,
    SK_STATUS_CATEGORY_NOT_SUPPORTED = 2,
    SK_STATUS_CATEGORY_INTERNAL = 3,
    SK_STATUS_CATEGORY_EXECUTION_FAILED = 4
} sk_status_category;

/* The enum name as text, e.g. "SK_STATUS_BAD_PARAM_SHAPE"; "SK_STATUS_UNKNOWN"
 * for a value that is not a status. Never NULL; static storage. */
SK_API const char *sk_status_name(sk_status status);

/* The category of a status (code / 1000). */
SK_API sk_status_category sk_status_get_category(sk_status status);

/* The text of the last failure of an sk_status-returning call made by this
 * thread, e.g. "sk_attention_run: q_strides[1] = 3 is not a multiple of 8
 * (16-byte rows needed by the CUDA backend)". "" when the last call
 * succeeded. Thread-local storage owned by the library, valid until this
 * thread's next call into the library. */
SK_API const char *sk_last_error(void);

/* ---------------------------------------------------------------------------
 * Common enums
 * ------------------------------------------------------------------------- */

/* Element types. 0 is left invalid so a zeroed field is caught. */
typedef enum sk_dtype {
    SK_DTYPE_F16 = 1,  /* IEEE half */
    SK_DTYPE_BF16 = 2, /* bfloat16 */
    SK_DTYPE_F32 = 3,  /* float; attention inputs in F32 are for the CPU backend only */
    SK_DTYPE_E4M3 = 4  /* FP8 e4m3fn (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
                          inf, NaN = 0x7F / 0xFF, max 448. Attention forward inputs Q, K, V
                          only (sk_attention_*, with desc->out_dtype and the descales) */
} sk_dtype;

/* Where the data lives and which code runs. */
typedef enum sk_backend {
    SK_BACKEND_CPU = 1,        /* host memory; reference code, OpenMP threads */
    SK_BACKEND_CUDA = 2,       /* device memory; the best kernel for the current device */
    SK_BACKEND_CUDA_SM80 = 3,  /* device memory; force the portable sm_80+ kernel */
    SK_BACKEND_CUDA_SM90 = 4   /* device memory; force the Hopper kernel (NOT_SUPPORTED elsewhere) */
} sk_backend;

/* Token-level masking applied inside the selected blocks. */
typedef enum sk_mask {
    SK_MASK_NONE = 0,
    SK_MASK_CAUSAL = 1 /* key k visible to query q iff k <= q + (Sk - Sq) */
} sk_mask;

/* Storage order of a dense matrix. */
typedef enum sk_order {
    SK_ORDER_ROW_MAJOR = 1, /* element (r, c) at r * ld + c */
    SK_ORDER_COL_MAJOR = 2  /* element (r, c) at c * ld + r */
} sk_order;

/* ---------------------------------------------------------------------------
 * Block-sparse layouts (BSR)
 * ------------------------------------------------------------------------- */

/* The block grid a layout covers. A plain value type.
 * For attention, rows are query tokens (Sq) and columns key tokens (Sk);
 * for the BSR GEMM, rows are M and columns K of the sparse A.
 * row_blocks = ceil(rows / block_rows), col_blocks = ceil(cols / block_cols). */
typedef struct sk_grid {
    int64_t rows;       /* tokens (or matrix rows), >= 1 */
    int64_t cols;       /* tokens (or matrix columns), >= 1 */
    int32_t block_rows; /* 64 or 128 */
    int32_t block_cols; /* 64 or 128 */
    int32_t batch;      /* slices over the batch: 1 broadcasts, or B */
    int32_t heads;      /* slices over heads: 1 broadcasts, Hkv (per KV head) or Hq */
} sk_grid;

/* A view of a BSR layout: borrowed arrays, host or device memory.
 * There are batch * heads slices; slice s = b * heads + h. Row r of slice s
 * is global row g = s * row_blocks + r; its selected column blocks are
 * col_indices[row_offsets[g] .. row_offsets[g + 1]), strictly increasing.
 * For attention, batch index b uses slice batch b (or 0 when batch == 1) and
 * query head h uses head slice h (heads == Hq), h / (Hq / Hkv) (heads == Hkv)
 * or 0 (heads == 1). When Hq == Hkv the two readings agree. */
typedef struct sk_bsr {
    sk_grid grid;
    int32_t nnz;          /* length of col_indices; a valid layout has row_offsets[last] == nnz */
    int32_t *row_offsets; /* [batch * heads * row_blocks + 1], non-decreasing, first 0 */
    int32_t *col_indices; /* [nnz], each row sorted and unique, in [0, col_blocks) */
} sk_bsr;

/* Derived sizes of a grid, with checks: 64 or 128 blocks, positive sizes,
 * and the counts of the int32 arrays fitting int32 (slices * row_blocks +
 * 1 and col_blocks). The dense block count slices * row_blocks *
 * col_blocks may exceed int32 (a 16M-token grid at blocks of 128 has 2^34):
 * what must fit int32 is checked where it is made (a layout's nnz by every
 * builder and conversion; the top-k score matrix). Any output pointer may
 * be NULL. */
SK_API sk_status sk_grid_blocks(const sk_grid *grid, int32_t *row_blocks, int32_t *col_blocks,
                                int32_t *slices);

/* Check a host layout completely: the grid (as sk_grid_blocks), then offsets
 * (first 0, non-decreasing), total count (last == nnz), and every row's
 * indices (in range, strictly increasing). Each failure has its own status
 * (SK_STATUS_BAD_LAYOUT_*) and a message naming the slice, row and entry. */
SK_API sk_status sk_layout_validate(const sk_bsr *layout);

/* An owned host layout made by the builders below. Opaque; free with
 * sk_layout_destroy. */
typedef struct sk_layout_s *sk_layout_t;

/* Free a layout; NULL is a no-op. Views obtained from it become invalid. */
SK_API void sk_layout_destroy(sk_layout_t layout);

/* A view of an owned layout's host arrays (valid until it is destroyed).
 * The view's arrays must not be written through. */
SK_API sk_status sk_layout_view(sk_layout_t layout, sk_bsr *view);

/* Builders. Each makes a validated host layout over `grid` and stores a new
 * handle in *out (which is left untouched on failure). Positions use the
 * bottom-right alignment of the semantics above: query token q sits at key
 * position q + (Sk - Sq). A block is kept when at least one (query, key)
 * token pair inside it, within the sequence ends, satisfies the pattern; the
 * token-level mask inside selected blocks is the attention's `mask` alone.
 * Every slice gets the same pattern, except for the random and score-based
 * builders, which draw per slice. */

/* Every block. */
SK_API sk_status sk_layout_create_dense(sk_layout_t *out, const sk_grid *grid);

/* Blocks holding at least one causal pair (k <= q + Sk - Sq). */
SK_API sk_status sk_layout_create_causal(sk_layout_t *out, const sk_grid *grid);

/* Sliding window: key k visible to q iff
 * p - left <= k <= p + right, with p = q + Sk - Sq. left, right >= 0 tokens. */
SK_API sk_status sk_layout_create_window(sk_layout_t *out, const sk_grid *grid, int64_t left,
                                         int64_t right);

/* StreamingLLM: causal, with the first `sink_tokens` keys plus the
 * `window_tokens` most recent positions (p - window_tokens < k <= p).
 * sink_tokens >= 0, window_tokens >= 1. */
SK_API sk_status sk_layout_create_sinks_window(sk_layout_t *out, const sk_grid *grid,
                                               int64_t sink_tokens, int64_t window_tokens);

/* Strided / dilated, block-level (Sparse Transformer): for query block i
 * with diagonal key block d (the block holding position p of i's last valid
 * query), keep key blocks j with d - local_blocks < j <= d, and every j with
 * (d - j) % stride == 0. causal != 0 drops every j > d and anything with no
 * causal pair; causal == 0 also mirrors the pattern to j > d.
 * stride >= 1, local_blocks >= 0. */
SK_API sk_status sk_layout_create_strided(sk_layout_t *out, const sk_grid *grid, int32_t stride,
                                          int32_t local_blocks, int causal);

/* k distinct key blocks per row drawn uniformly at random (k clipped to the
 * number of candidates), reproducible from `seed` on every platform.
 * causal != 0 draws only among blocks holding a causal pair. k >= 0. */
SK_API sk_status sk_layout_create_random(sk_layout_t *out, const sk_grid *grid, int32_t k,
                                         uint64_t seed, int causal);

/* Options of sk_layout_create_topk. Zero-initialise, then set. */
typedef struct sk_topk_options {
    int32_t k;              /* blocks picked by score per row, >= 0, beyond the forced ones */
    int32_t sink_blocks;    /* always keep key blocks 0 .. sink_blocks-1, >= 0 */
    int32_t local_blocks;   /* always keep the local_blocks blocks ending at the diagonal, >= 0 */
    int32_t causal;         /* != 0: never select a block with no causal pair */
} sk_topk_options;

/* Top-k from a host block-score matrix `scores`, fp32,
 * [batch * heads, row_blocks, col_blocks] contiguous. Forced blocks (sinks,
 * local) are kept first; then the k highest-scoring of the remaining
 * candidates. Ties go to the lower block index. NaN and -inf scores are
 * never picked by score. */
SK_API sk_status sk_layout_create_topk(sk_layout_t *out, const sk_grid *grid, const float *scores,
                                       const sk_topk_options *options);

/* From a dense 0/1 block mask, uint8 [batch * heads, row_blocks, col_blocks]
 * contiguous; any non-zero byte selects the block. More than INT32_MAX
 * selected blocks: SK_STATUS_BAD_LAYOUT_OVERFLOW (as for every builder whose
 * layout would have nnz > INT32_MAX). */
SK_API sk_status sk_layout_create_from_mask(sk_layout_t *out, const sk_grid *grid,
                                            const uint8_t *mask);

/* To a dense 0/1 block mask (same shape as above). mask_bytes must be at
 * least slices * row_blocks * col_blocks. */
SK_API sk_status sk_layout_to_mask(const sk_bsr *layout, uint8_t *mask, size_t mask_bytes);

/* From FlexAttention's padded form: counts int32 [batch * heads, row_blocks]
 * and indices int32 [batch * heads, row_blocks, row_width], where row g
 * selects indices[g * row_width .. + counts[g]) in any order (they are
 * sorted here; a repeated index is SK_STATUS_BAD_LAYOUT_DUPLICATE). This is
 * BlockMask's kv_num_blocks / kv_indices; merge full_kv_* beforehand. */
SK_API sk_status sk_layout_create_from_flex(sk_layout_t *out, const sk_grid *grid,
                                            const int32_t *counts, const int32_t *indices,
                                            int32_t row_width);

/* To FlexAttention's padded form with row_width = col_blocks: each row lists
 * its selected blocks in increasing order, then the unselected ones (a
 * permutation of the row, as BlockMask builds it). counts has slices *
 * row_blocks entries, indices slices * row_blocks * col_blocks. */
SK_API sk_status sk_layout_to_flex(const sk_bsr *layout, int32_t *counts, size_t counts_len,
                                   int32_t *indices, size_t indices_len);

/* A copy of a host layout view, validated. */
SK_API sk_status sk_layout_create_from_bsr(sk_layout_t *out, const sk_bsr *layout);

/* ---------------------------------------------------------------------------
 * Attention forward
 * ------------------------------------------------------------------------- */

typedef struct sk_attention_desc {
    size_t struct_size;   /* sizeof(sk_attention_desc); set by sk_attention_desc_init */
    sk_backend backend;   /* default SK_BACKEND_CUDA */
    sk_dtype dtype;       /* Q, K, V and O: F16 or BF16; F32 on the CPU only. Default F16 */
    int64_t batch;        /* B >= 1 */
    int64_t seq_q;        /* Sq >= 1 */
    int64_t seq_k;        /* Sk >= 1 */
    int64_t heads_q;      /* Hq >= 1, a multiple of heads_kv */
    int64_t heads_kv;     /* Hkv >= 1 */
    int64_t head_dim;     /* D; the CUDA backend supports 64 and 128 */
    float scale;          /* softmax scale; 0 (default) means 1/sqrt(D); finite, and
                             |scale| * log2(e) must fit fp32 (see "Scale" above) */
    sk_mask mask;         /* default SK_MASK_NONE */
    /* Element strides over [batch, seq, head]; the head_dim axis is
     * contiguous. All three zero (the default) means packed [B, S, H, D].
     * Inputs: strides >= 0. O: strides that make no two elements share
     * memory. CUDA: pointers 16-byte aligned, strides multiples of 16 bytes. */
    int64_t q_strides[3]; /* Q [B, Sq, Hq, D] */
    int64_t k_strides[3]; /* K [B, Sk, Hkv, D] */
    int64_t v_strides[3]; /* V [B, Sk, Hkv, D] */
    int64_t o_strides[3]; /* O [B, Sq, Hq, D] */
    /* FP8 inputs (dtype = SK_DTYPE_E4M3; appended after every field
     * above: a descriptor initialised with the older size, up to o_strides,
     * keeps working, as if these were 0 / NULL). Q, K and V hold e4m3 codes x; the attention runs on the real
     * values descale * x (FlashAttention-3's q/k/v_descale convention):
     *   Q[b, s, h, :]  = q_descale[b * Hq + h]  * q8[b, s, h, :]
     *   K[b, s, hk, :] = k_descale[b * Hkv + hk] * k8[b, s, hk, :]  (V alike)
     * The kernels fold the factors into the fp32 softmax scale and O, which
     * is exact up to fp32 rounding. Each array is fp32, contiguous, 4-byte
     * aligned, in the backend's memory (device for CUDA, host for CPU), read
     * by run / forward only; NULL means every factor is 1. All three must be
     * NULL unless dtype is E4M3. Values are not inspected (a NaN or inf
     * factor gives NaN / inf outputs). */
    sk_dtype out_dtype;      /* O's dtype: 0 (default) means dtype, or BF16 when dtype is
                                E4M3; F16 or BF16 with E4M3 inputs, else equal to dtype */
    const float *q_descale;  /* [B, Hq] fp32, or NULL (1.0) */
    const float *k_descale;  /* [B, Hkv] fp32, or NULL (1.0) */
    const float *v_descale;  /* [B, Hkv] fp32, or NULL (1.0) */
    /* V's layout (appended after the FP8 fields: a descriptor initialised
     * with the size up to v_descale keeps working as SK_V_LAYOUT_ROWS).
     * SK_V_LAYOUT_VT_FP8 takes V as sk_quantize_e4m3 writes it with
     * SK_QUANT_LAYOUT_VT_FP8 (see there: [B, Hkv, D, Sk_pad] e4m3 codes,
     * keys permuted inside each 32, zero past Sk), so the Hopper FP8 kernel
     * loads it as its P V operand with no transpose. Only with dtype E4M3;
     * v_strides must then be all zero (the layout is packed); CUDA: v
     * 16-byte aligned. The codes past Sk must be finite (the quantizer
     * writes 0): the FP8 kernel reads keys up to the next multiple of 32,
     * where P is 0 but a NaN code would still poison the sum; beyond that
     * nothing past Sk is read. */
    int32_t v_layout;        /* sk_v_layout; 0 (default) = SK_V_LAYOUT_ROWS */
} sk_attention_desc;

/* desc->v_layout values. */
typedef enum sk_v_layout {
    SK_V_LAYOUT_ROWS = 0,  /* V [B, Sk, Hkv, D], desc->v_strides (the default) */
    SK_V_LAYOUT_VT_FP8 = 1 /* V^T for the FP8 kernel (SK_QUANT_LAYOUT_VT_FP8), packed */
} sk_v_layout;

/* Fill *desc with the defaults above (all sizes 0, to be set). struct_size is
 * sizeof(*desc) as the caller knows it. */
SK_API sk_status sk_attention_desc_init(sk_attention_desc *desc, size_t struct_size);

/* Bytes of device workspace the plan and run need for this descriptor and
 * layout geometry (the layout arrays are not read). 0 for the CPU backend.
 * Depends only on the shapes, so one workspace serves every layout of the
 * same geometry. */
SK_API sk_status sk_attention_workspace_size(const sk_attention_desc *desc, const sk_bsr *layout,
                                             size_t *workspace_bytes);

/* Enqueue the planning of a run on `stream`: the tile order (longest rows
 * first within groups of KV heads that share the L2) computed from the
 * layout's row offsets, written into `workspace`.
 * Allocates nothing and never synchronises with the host, so it can be
 * captured in a CUDA graph; re-run it whenever the layout content changes.
 * A no-op for the CPU backend (after the argument checks). */
SK_API sk_status sk_attention_plan(const sk_attention_desc *desc, const sk_bsr *layout,
                                   void *workspace, size_t workspace_size,
                                   struct CUstream_st *stream);

/* Enqueue the attention forward on `stream`, using the plan in `workspace`.
 *   q   [B, Sq, Hq, D]   dtype, strides desc->q_strides
 *   k   [B, Sk, Hkv, D]  dtype, strides desc->k_strides
 *   v   [B, Sk, Hkv, D]  dtype, strides desc->v_strides
 *   o   [B, Sq, Hq, D]   dtype, strides desc->o_strides; written
 *   lse [B, Hq, Sq]      fp32 contiguous; written; may be NULL
 * Allocates nothing and never synchronises (CUDA-graph safe). For the CPU
 * backend the call is synchronous and the workspace is unused. */
SK_API sk_status sk_attention_run(const sk_attention_desc *desc, const sk_bsr *layout,
                                  const void *q, const void *k, const void *v, void *o, float *lse,
                                  void *workspace, size_t workspace_size,
                                  struct CUstream_st *stream);

/* sk_attention_plan followed by sk_attention_run, same arguments. */
SK_API sk_status sk_attention_forward(const sk_attention_desc *desc, const sk_bsr *layout,
                                      const void *q, const void *k, const void *v, void *o,
                                      float *lse, void *workspace, size_t workspace_size,
                                      struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Varlen batches: sequences of different lengths, packed
 * ---------------------------------------------------------------------------
 * B sequences packed along the token axis, as FlashAttention's and
 * flashinfer's varlen calls take them (element strides over [token, head];
 * D is contiguous):
 *   Q   [total_q, Hq,  D]   sequence b's queries: rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
 *   K   [total_k, Hkv, D]   its keys: rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1
 *   V   [total_k, Hkv, D]
 *   O   [total_q, Hq,  D]
 *   LSE [Hq, total_q]  fp32 contiguous, natural log; may be NULL. This is
 *                      FlashAttention's varlen order: each head's entries
 *                      are one run of total_q floats, as the fixed batch's
 *                      [B, Hq, Sq] with B = 1 and Sq = total_q.
 *   cu_seqlens_q, cu_seqlens_k  int32 [B + 1]: 0 first, non-decreasing,
 *                      total_q (total_k) last; where the tensors are
 *                      (host memory on the CPU backend, device memory on CUDA).
 * len_q(b) = cu_seqlens_q[b+1] - cu_seqlens_q[b] <= max_seqlen_q and
 * len_k(b) likewise (<= max_seqlen_k); either may be 0. Each sequence is
 * the fixed-batch attention above with B = 1, Sq = len_q(b), Sk = len_k(b),
 * on its own tokens: causal is bottom-right per sequence (key k visible to
 * query q iff k <= q + len_k(b) - len_q(b)), tails are per sequence, and a
 * query with no admissible key (an empty layout row, a sequence with no
 * key, causal rows before len_q(b) - len_k(b)) gets O = 0, LSE = -inf.
 *
 * The layout: ONE sk_bsr over the query blocks of all sequences, in order.
 * Sequence b owns nb_q(b) = ceil(len_q(b) / block_rows) consecutive block
 * rows, from row_start(b) = nb_q(0) + ... + nb_q(b-1) on; its query block i
 * (its tokens i*block_rows ..) is layout row row_start(b) + i, whose
 * col_indices are the sequence's own key blocks, 0-based, each below
 * nb_k(b) = ceil(len_k(b) / block_cols). Its grid:
 *   rows   R * block_rows, with R >= row_start(B) block rows (the rows past
 *          row_start(B) are never read: a caller may size R for the most
 *          rows any lengths can need, sk_varlen_max_row_blocks);
 *   cols   >= 1, bounding the indices (the builders: the longest len_k);
 *   batch  1 (the sequences are rows);
 *   heads  1, Hkv or Hq as for the fixed batch: head slice s holds rows
 *          s * R .. s * R + R - 1.
 * One BSR keeps every layout tool (validation, views, masks, uploads,
 * device layouts) and lets the GPU find a sequence's rows from a prefix sum
 * of nb_q (docs/perf/varlen_paged.md).
 *
 * Checks. The host knows capacities only (B, total_q, total_k, max_seqlen_q,
 * max_seqlen_k, the layout's grid): workspace sizes and plans never read
 * the length arrays on the host. On the CPU backend the plan and the run
 * check the lengths (the rules above: SK_STATUS_BAD_PARAM_SHAPE naming the
 * entry) and the layout against them (R too small: BAD_LAYOUT_MISMATCH; an
 * index at or past nb_k(b): BAD_LAYOUT_INDEX_RANGE), with everything else,
 * before anything is written. On CUDA the kernels cannot check device
 * arrays; they will never read or write outside the tensors and the layout
 * for ANY content: each sequence's start is clamped to [0, total] and its
 * end to [start, total], its length to max_seqlen; rows past R are skipped
 * (their queries' O and LSE are then unspecified, possibly unwritten);
 * column indices at or past the sequence's nb_k(b) are skipped as absent
 * (as "Robustness" above says for every layout).
 *
 * Backends: the CPU reference; SK_BACKEND_CUDA and SK_BACKEND_CUDA_SM80
 * run the portable kernel (F16 / BF16, D 64 or 128, blocks 64 or 128).
 * SK_BACKEND_CUDA_SM90 makes every argument check above, then answers
 * SK_STATUS_NOT_SUPPORTED until the Hopper varlen kernel exists, so a bad
 * argument gets the same status on every backend.
 */

/* A varlen problem's sequences, as the layout builders need them: host
 * arrays, blocks and head slices. A plain value type (the arrays are
 * borrowed for the call). */
typedef struct sk_varlen_grid {
    int32_t batch;               /* B >= 1 sequences */
    int32_t block_rows;          /* 64 or 128 */
    int32_t block_cols;          /* 64 or 128 */
    int32_t heads;               /* layout slices over heads: 1, Hkv or Hq */
    const int32_t *cu_seqlens_q; /* [B + 1] host: 0, non-decreasing */
    const int32_t *cu_seqlens_k; /* [B + 1] host: 0, non-decreasing */
} sk_varlen_grid;

/* The sk_grid of the varlen layout the builders make for `grid`: rows =
 * max(row_start(B), 1) * block_rows, cols = max(longest len_k, 1), batch
 * 1, heads; checked as sk_grid_blocks checks (counts fit int32), with the
 * length arrays (SK_STATUS_BAD_PARAM_SHAPE naming the entry). */
SK_API sk_status sk_varlen_layout_grid(const sk_varlen_grid *grid, sk_grid *layout_grid);

/* The most block rows B sequences of total_q tokens, none longer than
 * max_seqlen_q, can need: an R that fits every such length array, for
 * layout buffers made before the lengths are known (a CUDA graph). It is
 * min(B * ceil(max_seqlen_q / block_rows), floor((total_q + B * (block_rows
 * - 1)) / block_rows), total_q), at least 1. */
SK_API sk_status sk_varlen_max_row_blocks(int64_t batch, int64_t total_q, int64_t max_seqlen_q,
                                          int32_t block_rows, int32_t *row_blocks);

/* Check a host varlen layout completely: sk_layout_validate's checks, its
 * grid against `grid` (block sizes, heads, batch 1: BAD_LAYOUT_MISMATCH),
 * the lengths, R >= row_start(B), and every index of sequence b's rows
 * below nb_k(b) (BAD_LAYOUT_INDEX_RANGE naming the sequence and row). */
SK_API sk_status sk_layout_validate_varlen(const sk_bsr *layout, const sk_varlen_grid *grid);

/* Varlen builders: each sequence gets the pattern of the fixed-batch
 * builder of the same name over its own grid (len_q(b) x len_k(b) tokens,
 * bottom-right alignment within the sequence; a sequence with no query has
 * no row, one with no key has empty rows), every head slice the same
 * pattern except random, which draws per slice and row (reproducible from
 * seed). The layout's grid is sk_varlen_layout_grid's. *out as the fixed
 * builders (untouched on failure). */
SK_API sk_status sk_layout_create_varlen_dense(sk_layout_t *out, const sk_varlen_grid *grid);
SK_API sk_status sk_layout_create_varlen_causal(sk_layout_t *out, const sk_varlen_grid *grid);
SK_API sk_status sk_layout_create_varlen_window(sk_layout_t *out, const sk_varlen_grid *grid,
                                                int64_t left, int64_t right);
SK_API sk_status sk_layout_create_varlen_sinks_window(sk_layout_t *out,
                                                      const sk_varlen_grid *grid,
                                                      int64_t sink_tokens, int64_t window_tokens);
SK_API sk_status sk_layout_create_varlen_random(sk_layout_t *out, const sk_varlen_grid *grid,
                                                int32_t k, uint64_t seed, int causal);

/* From per-sequence 0/1 block masks, uint8, one after another: sequence
 * b's mask is [heads, nb_q(b), nb_k(b)] contiguous (no bytes for a
 * sequence with no query or no key); any non-zero byte selects the block.
 * mask_bytes: at least heads x the sum of nb_q(b) x nb_k(b). */
SK_API sk_status sk_layout_create_varlen_from_masks(sk_layout_t *out, const sk_varlen_grid *grid,
                                                    const uint8_t *masks, size_t mask_bytes);

/* From per-sequence host layouts: layouts[b] (b < B) is NULL (no block for
 * that sequence) or a valid layout whose grid is exactly len_q(b) x
 * len_k(b) tokens, grid's block sizes, batch 1 and grid's heads (a
 * sequence with no query or no key can only be NULL). */
SK_API sk_status sk_layout_create_varlen_from_layouts(sk_layout_t *out, const sk_varlen_grid *grid,
                                                      const sk_bsr *const *layouts);

typedef struct sk_attention_varlen_desc {
    size_t struct_size;   /* sizeof(sk_attention_varlen_desc); set by its init */
    sk_backend backend;   /* default SK_BACKEND_CUDA */
    sk_dtype dtype;       /* Q, K, V and O: F16 or BF16; F32 on the CPU only. Default F16 */
    int64_t batch;        /* B >= 1 sequences (fits int32) */
    int64_t total_q;      /* rows of Q and O, 1 .. INT32_MAX (= cu_seqlens_q[B]) */
    int64_t total_k;      /* rows of K and V, 1 .. INT32_MAX (= cu_seqlens_k[B]) */
    int64_t max_seqlen_q; /* >= every len_q(b); 1 .. INT32_MAX */
    int64_t max_seqlen_k; /* >= every len_k(b); 1 .. INT32_MAX */
    int64_t heads_q;      /* Hq >= 1, a multiple of heads_kv */
    int64_t heads_kv;     /* Hkv >= 1 */
    int64_t head_dim;     /* D */
    float scale;          /* as sk_attention_desc: 0 (default) means 1/sqrt(D) */
    sk_mask mask;         /* default SK_MASK_NONE; causal is per sequence */
    /* Element strides over [token, head]; both zero (the default) means
     * packed [total, H, D]. As sk_attention_desc: inputs >= 0, O's make no
     * two elements share memory; CUDA: 16-byte multiples. */
    int64_t q_strides[2]; /* Q [total_q, Hq, D] */
    int64_t k_strides[2]; /* K [total_k, Hkv, D] */
    int64_t v_strides[2]; /* V [total_k, Hkv, D] */
    int64_t o_strides[2]; /* O [total_q, Hq, D] */
} sk_attention_varlen_desc;

/* Fill *desc with the defaults above (all sizes 0, to be set). */
SK_API sk_status sk_attention_varlen_desc_init(sk_attention_varlen_desc *desc,
                                               size_t struct_size);

/* Bytes of device workspace for this descriptor and layout geometry (no
 * array is read). 0 for the CPU backend. */
SK_API sk_status sk_attention_varlen_workspace_size(const sk_attention_varlen_desc *desc,
                                                    const sk_bsr *layout,
                                                    size_t *workspace_bytes);

/* Enqueue the planning of a run (on the GPU it will read the lengths and the
 * layout's row offsets there: graph safe; re-plan when either changes). On
 * the CPU: the checks (lengths and layout included), nothing else. */
SK_API sk_status sk_attention_varlen_plan(const sk_attention_varlen_desc *desc,
                                          const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                          const int32_t *cu_seqlens_k, void *workspace,
                                          size_t workspace_size, struct CUstream_st *stream);

/* Enqueue the varlen forward, using the plan in `workspace`.
 *   q   [total_q, Hq, D]   dtype, desc->q_strides
 *   k   [total_k, Hkv, D]  dtype, desc->k_strides
 *   v   [total_k, Hkv, D]  dtype, desc->v_strides
 *   o   [total_q, Hq, D]   dtype, desc->o_strides; written (every row)
 *   lse [Hq, total_q]      fp32 contiguous; written; may be NULL
 * Aliasing: o and lse against every other buffer, the layout arrays and
 * cu_seqlens_q / cu_seqlens_k ([B + 1] int32 each) included. Allocates
 * nothing on the device and never synchronises (CUDA-graph safe); the CPU
 * backend is synchronous and may allocate host scratch
 * (SK_STATUS_ALLOC_FAILED, nothing written, when that fails). */
SK_API sk_status sk_attention_varlen_run(const sk_attention_varlen_desc *desc,
                                         const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                         const int32_t *cu_seqlens_k, const void *q,
                                         const void *k, const void *v, void *o, float *lse,
                                         void *workspace, size_t workspace_size,
                                         struct CUstream_st *stream);

/* sk_attention_varlen_plan followed by sk_attention_varlen_run. */
SK_API sk_status sk_attention_varlen_forward(const sk_attention_varlen_desc *desc,
                                             const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                             const int32_t *cu_seqlens_k, const void *q,
                                             const void *k, const void *v, void *o, float *lse,
                                             void *workspace, size_t workspace_size,
                                             struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Paged KV cache (chunked prefill)
 * ---------------------------------------------------------------------------
 * The varlen forward with the keys and values in caches of pages, as vLLM
 * and flashinfer keep them (the NHD order):
 *   Q, O, LSE, cu_seqlens_q   as varlen: total_q packed query rows
 *   K cache [num_pages, page_size, Hkv, D]  element strides over [page,
 *   V cache [num_pages, page_size, Hkv, D]  slot, head]; D contiguous
 *   seq_lens_k  int32 [B]: len_k(b), sequence b's keys (its cached context
 *               plus, where they were appended, its new tokens:
 *               FlashAttention's seqused_k)
 *   page_table  int32 [B, max_pages], row stride page_table_stride:
 *               sequence b's key k is in page page_table[b][k / page_size],
 *               slot k % page_size (vLLM's block_table)
 * Each sequence is the varlen sequence with len_q(b) queries and len_k(b)
 * keys, read through its page table row; causal is bottom-right, so with
 * chunked prefill (len_q new tokens, the last len_q of the len_k keys) a
 * new token sees the whole cached context and the new tokens up to itself.
 * The layout is the varlen layout over len_q(b) x len_k(b) per sequence:
 * its key blocks are logical positions (a block may span several pages, a
 * page several blocks). page_size is 16, 32, 64 or 128 on every backend.
 * A sequence reads pages page_table[b][0 .. ceil(len_k(b) / page_size) -
 * 1], each in [0, num_pages); the rest of its row is never read. Pages may
 * appear in any order and be shared by sequences (prefix sharing); the
 * caches are read only. Slots of a page past a sequence's len_k are never
 * used (they may hold anything, NaN included).
 *
 * Checks: as varlen, with max_seqlen_k <= max_pages x page_size. On the CPU
 * backend the run and plan also check each len_k(b) in [0, max_seqlen_k]
 * (SK_STATUS_BAD_PARAM_SHAPE), every page index a sequence uses
 * (SK_STATUS_BAD_PARAM_VALUE naming the entry) and the layout against the
 * lengths, before anything is written. The CUDA kernels cannot check
 * device arrays: they clamp len_k(b) to [0, max_seqlen_k], and treat a page
 * index outside [0, num_pages) as absent (its keys masked, never read), so
 * no read leaves the caches. Backends as varlen (SK_BACKEND_CUDA_SM90
 * answers SK_STATUS_NOT_SUPPORTED for now).
 */

typedef struct sk_attention_paged_desc {
    size_t struct_size;        /* sizeof(sk_attention_paged_desc); set by its init */
    sk_backend backend;        /* default SK_BACKEND_CUDA */
    sk_dtype dtype;            /* Q, caches, O: F16 or BF16; F32 on the CPU only. Default F16 */
    int64_t batch;             /* B >= 1 sequences (fits int32) */
    int64_t total_q;           /* rows of Q and O, 1 .. INT32_MAX (= cu_seqlens_q[B]) */
    int64_t max_seqlen_q;      /* >= every len_q(b); 1 .. INT32_MAX */
    int64_t max_seqlen_k;      /* >= every len_k(b); 1 .. max_pages x page_size */
    int64_t heads_q;           /* Hq >= 1, a multiple of heads_kv */
    int64_t heads_kv;          /* Hkv >= 1 */
    int64_t head_dim;          /* D */
    float scale;               /* as sk_attention_desc: 0 (default) means 1/sqrt(D) */
    sk_mask mask;              /* default SK_MASK_NONE; causal is per sequence */
    int64_t num_pages;         /* pages in each cache, 1 .. INT32_MAX */
    int32_t page_size;         /* tokens per page: 16, 32, 64 or 128; default 16 */
    int32_t max_pages;         /* columns of page_table, >= 1 */
    int64_t page_table_stride; /* elements between rows of page_table; 0 (default) = max_pages */
    int64_t q_strides[2];      /* Q [total_q, Hq, D] over [token, head]; 0 0 = packed */
    int64_t o_strides[2];      /* O [total_q, Hq, D]; 0 0 = packed */
    int64_t k_strides[3];      /* K cache over [page, slot, head]; all 0 = packed */
    int64_t v_strides[3];      /* V cache over [page, slot, head]; all 0 = packed */
} sk_attention_paged_desc;

/* Fill *desc with the defaults above (sizes 0, to be set). */
SK_API sk_status sk_attention_paged_desc_init(sk_attention_paged_desc *desc, size_t struct_size);

/* Bytes of device workspace for this descriptor and layout geometry (no
 * array is read). 0 for the CPU backend. */
SK_API sk_status sk_attention_paged_workspace_size(const sk_attention_paged_desc *desc,
                                                   const sk_bsr *layout, size_t *workspace_bytes);

/* Enqueue the planning of a run (graph safe; re-plan when the lengths, the
 * page table or the layout change). On the CPU: the checks, nothing else. */
SK_API sk_status sk_attention_paged_plan(const sk_attention_paged_desc *desc, const sk_bsr *layout,
                                         const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                                         const int32_t *page_table, void *workspace,
                                         size_t workspace_size, struct CUstream_st *stream);

/* Enqueue the paged forward, using the plan in `workspace`.
 *   q        [total_q, Hq, D]                   dtype, desc->q_strides
 *   k_cache  [num_pages, page_size, Hkv, D]     dtype, desc->k_strides
 *   v_cache  [num_pages, page_size, Hkv, D]     dtype, desc->v_strides
 *   o        [total_q, Hq, D]                   dtype, desc->o_strides; written
 *   lse      [Hq, total_q]                      fp32 contiguous; written; may be NULL
 * Aliasing: o and lse against every other buffer (the caches as their
 * whole strided span, the layout arrays, cu_seqlens_q [B + 1], seq_lens_k
 * [B] and page_table [(B - 1) x page_table_stride + max_pages] included).
 * Graph safe on CUDA; synchronous on the CPU, which may allocate host
 * scratch (SK_STATUS_ALLOC_FAILED, nothing written, when that fails). */
SK_API sk_status sk_attention_paged_run(const sk_attention_paged_desc *desc, const sk_bsr *layout,
                                        const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                                        const int32_t *page_table, const void *q,
                                        const void *k_cache, const void *v_cache, void *o,
                                        float *lse, void *workspace, size_t workspace_size,
                                        struct CUstream_st *stream);

/* sk_attention_paged_plan followed by sk_attention_paged_run. */
SK_API sk_status sk_attention_paged_forward(const sk_attention_paged_desc *desc,
                                            const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                            const int32_t *seq_lens_k, const int32_t *page_table,
                                            const void *q, const void *k_cache,
                                            const void *v_cache, void *o, float *lse,
                                            void *workspace, size_t workspace_size,
                                            struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Top-k selection on varlen and paged inputs
 * ---------------------------------------------------------------------------
 * The top-k block selection ("Dynamic top-k block selection" below) per
 * sequence of a varlen batch, writing the varlen layout that
 * sk_attention_varlen_* and sk_attention_paged_* take. Q is packed as in
 * "Varlen batches" ([total_q, Hq, D], cu_seqlens_q); K is either packed
 * (sk_topk_varlen_select: [total_k, Hkv, D], cu_seqlens_k) or a paged cache
 * (sk_topk_paged_select: [num_pages, page_size, Hkv, D], seq_lens_k and the
 * page table, exactly as "Paged KV cache" reads them). Sequence b is the
 * fixed selection with B = 1, Sq = len_q(b), Sk = len_k(b) on its own
 * tokens: block means of its valid tokens (tails per sequence; paged K read
 * through its page table row, the same means bit for bit as the packed
 * keys), scores against its own key blocks, and the fixed rules (sinks,
 * local blocks ending at the row's diagonal, causal bottom-right per
 * sequence, k by score, ties to the lower index, NaN / -inf never picked
 * by score). So its rows are those of sk_pool_select_topk run on the
 * sequence alone on the CPU backend; the CUDA kernels do the CPU's fp64
 * sums in the CPU's order, so they give the same rows bit for bit (unlike
 * the fixed CUDA selection, whose fp32 / tensor-core scores may break near
 * ties differently). A sequence with no key has empty rows; one with no
 * query has no row.
 *
 * The layout: R = sk_varlen_max_row_blocks(B, total_q, max_seqlen_q,
 * block_q) rows per slice (the most any lengths within the capacities
 * need), sequence b's rows from row_start(b) on as in "Varlen batches",
 * rows past row_start(B) empty; grid rows = R x block_q, cols =
 * max_seqlen_k, batch 1, heads = per_kv_head ? Hkv : Hq. Buffers from
 * sk_topk_varlen_layout_capacity: row_offsets heads x R + 1 entries,
 * col_indices max_nnz = heads x R x min(k + sink_blocks + local_blocks,
 * ceil(max_seqlen_k / block_k)) (at most INT32_MAX). As for the fixed
 * selection, layout->nnz is set to the capacity and row_offsets[last] is
 * the real count: set nnz = row_offsets[last] on a host copy before
 * validating it (the CPU varlen forward checks its layout in full).
 *
 * Checks as in "Varlen batches" / "Paged KV cache": the host knows
 * capacities only; the CPU backend also checks the length arrays and the
 * page indices each sequence uses (nothing written on failure). The CUDA
 * kernels clamp the lengths as the varlen plan does (start to [0, total],
 * end to [start, total], length to max_seqlen; paged: len_k to [0,
 * max_seqlen_k]), skip sequences past the R rows, and pool a page index
 * outside [0, num_pages) as zeros, so no read leaves the tensors.
 * Size limit: scores [heads, R, ceil(max_seqlen_k / block_k)] fp32 at most
 * INT32_MAX entries (SK_STATUS_BAD_LAYOUT_OVERFLOW). Backends: the CPU
 * reference, and portable CUDA kernels (sm_80 and later; every CUDA
 * backend value runs them, SK_BACKEND_CUDA_SM90 on a 9.0 device only) with
 * head_dim a multiple of 8.
 */

typedef struct sk_topk_varlen_desc {
    size_t struct_size;     /* sizeof(sk_topk_varlen_desc); set by its init */
    sk_backend backend;     /* default SK_BACKEND_CUDA */
    sk_dtype dtype;         /* Q and K: F16 or BF16 (F32 on the CPU only). Default F16 */
    int64_t batch;          /* B >= 1 sequences (fits int32) */
    int64_t total_q;        /* rows of Q, 1 .. INT32_MAX (= cu_seqlens_q[B]) */
    int64_t total_k;        /* varlen: rows of K, 1 .. INT32_MAX; paged: not read */
    int64_t max_seqlen_q;   /* >= every len_q(b); 1 .. INT32_MAX */
    int64_t max_seqlen_k;   /* >= every len_k(b); 1 .. INT32_MAX (paged: <= max_pages x
                               page_size) */
    int64_t heads_q;        /* Hq, a multiple of heads_kv */
    int64_t heads_kv;       /* Hkv */
    int64_t head_dim;       /* D */
    int64_t q_strides[2];   /* Q [total_q, Hq, D] over [token, head]; 0 0 = packed */
    int64_t k_strides[2];   /* varlen K [total_k, Hkv, D]; 0 0 = packed (paged: not read) */
    int32_t block_q;        /* 64 or 128; default 128 */
    int32_t block_k;        /* 64 or 128; default 128 */
    float scale;            /* as sk_topk_desc: 0 (default) means 1/sqrt(D) */
    int32_t k;              /* blocks picked by score per row, >= 0; default 16 */
    int32_t sink_blocks;    /* forced leading blocks, >= 0 */
    int32_t local_blocks;   /* forced blocks ending at the diagonal, >= 0 */
    sk_mask mask;           /* SK_MASK_CAUSAL: bottom-right per sequence */
    int32_t per_kv_head;    /* as sk_topk_desc */
    /* Paged calls only (sk_topk_paged_*), as sk_attention_paged_desc: */
    int64_t num_pages;         /* pages in the cache, 1 .. INT32_MAX */
    int32_t page_size;         /* 16, 32, 64 or 128; default 16 */
    int32_t max_pages;         /* columns of page_table, >= 1 */
    int64_t page_table_stride; /* 0 (default) = max_pages */
    int64_t k_cache_strides[3]; /* K cache over [page, slot, head]; all 0 = packed */
} sk_topk_varlen_desc;

/* Fill *desc with the defaults above (sizes 0, to be set). */
SK_API sk_status sk_topk_varlen_desc_init(sk_topk_varlen_desc *desc, size_t struct_size);

/* The output layout's grid and its col_indices capacity (see above);
 * row_offsets needs grid->heads x grid->rows / block_q + 1 entries. Either
 * output may be NULL. The same for the varlen and the paged call. */
SK_API sk_status sk_topk_varlen_layout_capacity(const sk_topk_varlen_desc *desc, sk_grid *grid,
                                                int32_t *max_nnz);

/* Workspace bytes of sk_topk_varlen_select / sk_topk_paged_select (0 on
 * the CPU; from capacities only). */
SK_API sk_status sk_topk_varlen_workspace_size(const sk_topk_varlen_desc *desc,
                                               size_t *workspace_bytes);
SK_API sk_status sk_topk_paged_workspace_size(const sk_topk_varlen_desc *desc,
                                              size_t *workspace_bytes);

/* Pool, score and select per sequence into *layout (caller buffers of the
 * capacity above; sets layout->grid and layout->nnz = capacity). Graph
 * safe on CUDA (no allocation, no host copy, no synchronisation); the CPU
 * backend is synchronous and may allocate host scratch
 * (SK_STATUS_ALLOC_FAILED, nothing written).
 *   q             [total_q, Hq, D]  desc->q_strides
 *   k             [total_k, Hkv, D] desc->k_strides (varlen)
 *   k_cache       [num_pages, page_size, Hkv, D] desc->k_cache_strides (paged)
 *   cu_seqlens_q, cu_seqlens_k [B + 1], seq_lens_k [B], page_table as the
 *   varlen / paged forwards take them.
 * Aliasing: the layout arrays and the workspace against every other buffer. */
SK_API sk_status sk_topk_varlen_select(const sk_topk_varlen_desc *desc,
                                       const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                       const void *q, const void *k, sk_bsr *layout,
                                       void *workspace, size_t workspace_size,
                                       struct CUstream_st *stream);
SK_API sk_status sk_topk_paged_select(const sk_topk_varlen_desc *desc,
                                      const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                                      const int32_t *page_table, const void *q,
                                      const void *k_cache, sk_bsr *layout, void *workspace,
                                      size_t workspace_size, struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Decode: q_len new tokens per sequence over the paged KV cache
 * ---------------------------------------------------------------------------
 * Generation's attention step: each of B sequences has q_len (1 .. 16, the
 * same for all: 1 for plain decode, more for speculative or multi-token
 * prediction) new query tokens, and reads its cached keys through the paged
 * cache of the section above, optionally only the key blocks a selection
 * (Quest-style top-k pages, sinks, recent pages) picked per (sequence, KV
 * head). Shapes (element strides over the three outer axes; D contiguous):
 *   Q    [B, q_len, Hq, D]                   desc->q_strides
 *   K, V caches [num_pages, page_size, Hkv, D] desc->k_strides, v_strides
 *   O    [B, q_len, Hq, D]                   desc->o_strides; written
 *   LSE  [B, Hq, q_len]  fp32 contiguous, natural log; may be NULL
 *   seq_lens_k  int32 [B]: len_k(b), keys of sequence b (its new tokens
 *               included: they are the last q_len of them)
 *   page_table  int32 [B, max_pages], row stride page_table_stride: key k of
 *               sequence b is slot k % page_size of page
 *               page_table[b][k / page_size] (as the paged forward)
 * Query token t (0 .. q_len - 1) of sequence b, query head h, KV head
 * h_kv = h / (Hq / Hkv), attends to the keys k < len_k(b) of the selected
 * blocks of its (b, h_kv) row, and with SK_MASK_CAUSAL only to k <= len_k(b)
 * - q_len + t (bottom-right: the new tokens are the last q_len keys). The
 * softmax, scale, rounding and the empty-row rule (O = 0, LSE = -inf) are
 * the forward's ("Attention semantics").
 *
 * THE DECODE LAYOUT (the contract between a selection and this call). The
 * layout argument is NULL (every key block: the dense case) or an sk_bsr
 * with
 *   grid.batch      = B            one slice per sequence ...
 *   grid.heads      = Hkv or 1     ... and KV head (1: one row per sequence,
 *                                  shared by all its KV heads)
 *   grid.rows       = q_len        one row block: every query token of the
 *   grid.block_rows = 64           slice shares the row (64 nominal)
 *   grid.cols       = max_seqlen_k
 *   grid.block_cols = block_k: 16, 32, 64 or 128, the selection granularity
 *                     in logical key positions (16 and 32 are allowed in
 *                     decode layouts only; block_k need not equal page_size)
 * row_offsets has B x heads + 1 entries (row s = b x heads + h_kv, or b
 * when heads = 1); each row's col_indices are sorted, unique key blocks j
 * (keys j x block_k .. j x block_k + block_k - 1). Indices at or past
 * nb(b) = ceil(len_k(b) / block_k) select nothing: the CUDA kernels skip
 * them (a selection may be built for max_seqlen_k), the CPU backend and
 * sk_layout_validate_decode refuse them when they are given the lengths
 * (SK_STATUS_BAD_LAYOUT_INDEX_RANGE naming the entry). An empty row gives
 * that (sequence, KV head) O = 0 and LSE = -inf.
 *
 * Checks: as the paged forward (page geometry, strides, alignment: CUDA
 * 16-byte pointers and strides; aliasing: o and lse against every other
 * buffer, the caches as their whole strided span, seq_lens_k [B], the page
 * table and the layout arrays included); on the CPU backend the plan and
 * run also check each len_k(b) in [0, max_seqlen_k], every page index a
 * sequence uses and the layout against the lengths, before anything is
 * written. The CUDA kernels cannot check device arrays; they clamp len_k(b)
 * to [0, max_seqlen_k], treat a page index outside [0, num_pages) as absent
 * (its keys masked, never read), skip column indices outside [0, nb(b)),
 * clamp row offsets as "Robustness" says, and never read a key slot past
 * len_k(b) (NaN in unselected pages or past the end is never read).
 *
 * CUDA kernels (src/cuda/decode/, sm_80 and later; SK_BACKEND_CUDA,
 * _SM80 and _SM90 all run the same portable split-KV kernel today, a
 * Hopper-specific one is a later step): F16 or BF16, head_dim 64 or 128,
 * max_seqlen_k below 2^31 - 256, cache slot strides (k_strides[1],
 * v_strides[1]) below 2^26 elements, grids below 2^31 CTAs; anything else
 * is SK_STATUS_NOT_SUPPORTED after the argument checks. Each CTA takes one (sequence, KV head, split) and
 * its group's Hq / Hkv heads x q_len queries together; with more than one
 * split a second kernel merges the splits by LSE in a fixed order, so
 * results are bitwise repeatable. The split count is a function of the
 * descriptor, the layout's geometry and the current device (its SMs and
 * the kernel's resident CTAs per SM; desc->num_splits forces one), so the
 * workspace size is fixed for a device and the run is graph safe. The plan
 * reads nothing on the GPU and enqueues nothing (it makes the checks); one
 * plan serves any number of runs of the same problem on its workspace, the
 * layout's content and the lengths may change between them.
 */

typedef struct sk_decode_desc {
    size_t struct_size;        /* sizeof(sk_decode_desc); set by sk_decode_desc_init */
    sk_backend backend;        /* default SK_BACKEND_CUDA */
    sk_dtype dtype;            /* Q, caches, O: F16 or BF16; F32 on the CPU only. Default F16 */
    int64_t batch;             /* B >= 1 sequences (fits int32) */
    int64_t q_len;             /* new tokens per sequence, 1 .. 16; default 1 */
    int64_t heads_q;           /* Hq >= 1, a multiple of heads_kv */
    int64_t heads_kv;          /* Hkv >= 1 */
    int64_t head_dim;          /* D */
    float scale;               /* 0 (default) means 1/sqrt(D); as sk_attention_desc */
    sk_mask mask;              /* default SK_MASK_CAUSAL (bottom-right, per sequence) */
    int64_t max_seqlen_k;      /* >= every len_k(b); 1 .. max_pages x page_size */
    int64_t num_pages;         /* pages in each cache, 1 .. INT32_MAX */
    int32_t page_size;         /* tokens per page: 16, 32, 64 or 128; default 16 */
    int32_t max_pages;         /* columns of page_table, >= 1 */
    int64_t page_table_stride; /* elements between rows of page_table; 0 (default) = max_pages */
    int64_t q_strides[3];      /* Q [B, q_len, Hq, D]; all 0 = packed */
    int64_t o_strides[3];      /* O [B, q_len, Hq, D]; all 0 = packed */
    int64_t k_strides[3];      /* K cache over [page, slot, head]; all 0 = packed */
    int64_t v_strides[3];      /* V cache over [page, slot, head]; all 0 = packed */
    int32_t num_splits;        /* CUDA split-KV count: 0 (default) = chosen by the library,
                                  1 .. 128 forces it (tests, tuning); ignored on the CPU */
} sk_decode_desc;

/* Fill *desc with the defaults above (sizes 0, to be set). */
SK_API sk_status sk_decode_desc_init(sk_decode_desc *desc, size_t struct_size);

/* Check a host decode layout completely (the contract above): its grid
 * against desc (B, Hkv or 1, q_len, block_rows 64, max_seqlen_k, block_k
 * 16/32/64/128; SK_STATUS_BAD_LAYOUT_MISMATCH or BAD_PARAM_VALUE naming the
 * field), then offsets, count and each row's indices as
 * sk_layout_validate, and, when seq_lens_k (host, [B]) is not NULL, the
 * lengths (each in [0, max_seqlen_k]) and every index below nb(b). */
SK_API sk_status sk_layout_validate_decode(const sk_bsr *layout, const sk_decode_desc *desc,
                                           const int32_t *seq_lens_k);

/* The split-KV count the CUDA run will use for this descriptor and layout
 * geometry on the current device (1 on the CPU backend); for tests and
 * benchmarks. */
SK_API sk_status sk_decode_splits(const sk_decode_desc *desc, const sk_bsr *layout,
                                  int32_t *num_splits);

/* Bytes of device workspace (the splits' partial O and LSE, fp32) for this
 * descriptor and layout geometry; no array is read. 0 on the CPU backend
 * and when the run uses one split. */
SK_API sk_status sk_decode_workspace_size(const sk_decode_desc *desc, const sk_bsr *layout,
                                          size_t *workspace_bytes);

/* Enqueue the planning of runs (graph safe): today the checks only (on the
 * CPU, of the lengths, pages and layout too). Call it once per workspace
 * and problem before the first sk_decode_run; the layout's content and
 * the lengths may change between runs (each run reads them). */
SK_API sk_status sk_decode_plan(const sk_decode_desc *desc, const sk_bsr *layout,
                                const int32_t *seq_lens_k, const int32_t *page_table,
                                void *workspace, size_t workspace_size,
                                struct CUstream_st *stream);

/* Enqueue the decode attention.
 *   q        [B, q_len, Hq, D]               dtype, desc->q_strides
 *   k_cache  [num_pages, page_size, Hkv, D]  dtype, desc->k_strides
 *   v_cache  [num_pages, page_size, Hkv, D]  dtype, desc->v_strides
 *   o        [B, q_len, Hq, D]               dtype, desc->o_strides; written
 *   lse      [B, Hq, q_len]                  fp32 contiguous; written; may be NULL
 * layout: NULL (all blocks) or the decode layout above. The workspace
 * (CUDA, 16-byte aligned) may be NULL when its size is 0. Allocates nothing
 * on the device and never synchronises (CUDA-graph safe); the CPU backend
 * is synchronous and may allocate host scratch (SK_STATUS_ALLOC_FAILED,
 * nothing written, when that fails). */
SK_API sk_status sk_decode_run(const sk_decode_desc *desc, const sk_bsr *layout,
                               const int32_t *seq_lens_k, const int32_t *page_table,
                               const void *q, const void *k_cache, const void *v_cache, void *o,
                               float *lse, void *workspace, size_t workspace_size,
                               struct CUstream_st *stream);

/* sk_decode_plan followed by sk_decode_run. */
SK_API sk_status sk_decode(const sk_decode_desc *desc, const sk_bsr *layout,
                           const int32_t *seq_lens_k, const int32_t *page_table, const void *q,
                           const void *k_cache, const void *v_cache, void *o, float *lse,
                           void *workspace, size_t workspace_size, struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Attention backward
 * ---------------------------------------------------------------------------
 * The gradients of the forward above with respect to Q, K and V, given
 * dO = dL/dO for some loss L. The calls take the forward's descriptor and
 * layout unchanged (backend, dtype, sizes, scale s, mask, Q/K/V/O strides),
 * the forward's O and LSE, and a backward descriptor for what only the
 * backward has: the strides of dO, dQ, dK, dV and the determinism mode.
 *   dO  [B, Sq, Hq,  D]   dtype, strides bwd->dout_strides
 *   dQ  [B, Sq, Hq,  D]   dtype, strides bwd->dq_strides; written
 *   dK  [B, Sk, Hkv, D]   dtype, strides bwd->dk_strides; written
 *   dV  [B, Sk, Hkv, D]   dtype, strides bwd->dv_strides; written
 *
 * Over the admissible pairs (q, k) of the forward (k in a selected block of
 * q's block for slice(b, h), k < Sk, and when causal k <= q + (Sk - Sq):
 * bottom-right, as the forward), for each batch b and query head h with
 * KV head h_kv = h / (Hq / Hkv):
 *   P[q, k]  = exp(S[q, k] - LSE[b, h, q])        the forward's softmax
 *   dP[q, k] = dot(dO[b, q, h, :], V[b, k, h_kv, :])
 *   Dl[q]    = dot(dO[b, q, h, :], O[b, q, h, :])  (equals sum_k P dP)
 *   dS[q, k] = P[q, k] * (dP[q, k] - Dl[q])
 *   dQ[b, q, h, :]    = s * sum_k dS[q, k] * K[b, k, h_kv, :]
 *   dK[b, k, h_kv, :] = s * sum_h sum_q dS[q, k] * Q[b, q, h, :]
 *   dV[b, k, h_kv, :] =     sum_h sum_q P[q, k]  * dO[b, q, h, :]
 * where the sums over h run over the Hq / Hkv query heads of KV head h_kv
 * (GQA / MQA: their gradients add up, whatever layout slice each reads).
 * - O and LSE must be what the forward wrote for the same descriptor,
 *   layout, Q, K and V: P is taken from LSE and Dl from O, not recomputed
 *   from scratch. LSE is required here ([B, Hq, Sq] fp32 contiguous).
 * - Empty rows (no admissible key: an empty layout row, or every key
 *   masked by causality, e.g. the first Sq - Sk queries when Sq > Sk) get
 *   dQ = 0 and add nothing to dK and dV; their Q, O, dO and LSE entries
 *   affect no output (NaN there stays there). Keys with no admissible pair
 *   get dK = dV = 0, and their K and V entries affect no output.
 * - Tails: as the forward, tokens past Sq or Sk are never read or written.
 * - Every element of dQ, dK and dV is written (0 where nothing adds up);
 *   the gaps between rows of strided outputs are not touched.
 * - Layout slices as the forward: broadcast over batch and heads, per KV
 *   head, or per query head.
 * - Precision: fp16/bf16 inputs on every backend, F32 on the CPU only; the
 *   math is fp32 with fp32 (CUDA) or fp64 (CPU) accumulation, and each
 *   output element is rounded once to the dtype.
 * - Determinism: with bwd->deterministic = 1 (the default) every backend
 *   gives bitwise the same dQ, dK and dV for the same arguments and inputs
 *   on every run, whatever the thread count (CPU) or the order in which
 *   the GPU schedules work. Backends may differ from each other in the last
 *   bits. deterministic = 0 allows a faster mode with fp32 atomics: on a
 *   Hopper GPU (backends CUDA and CUDA_SM90, fixed-batch calls) one fused
 *   pass computes dK, dV and each tile's dQ, adding dQ into an fp32
 *   accumulator in the workspace with atomic adds, then scales and rounds
 *   it: dQ may differ in the last bits from run to run (within the same
 *   tolerance), dK and dV stay bitwise repeatable. It is faster than the
 *   deterministic passes on most shapes but not all (on an H100 slower at
 *   64K tokens with 16 random blocks a row, where its fp32 accumulator
 *   and Q / dO outgrow L2: docs/perf/backward.md). On other GPUs and with
 *   SK_BACKEND_CUDA_SM80 (fixed-batch calls) the portable kernel has the
 *   same fused mode, with the same guarantees (docs/perf/backward_sm80.md).
 *   Where no fused pass applies (the CPU, the varlen backward, on Hopper
 *   strides TMA cannot take) the call gives the deterministic results. The
 *   CUDA workspace is then larger by B * Hq * ceil(Sq / 64) * 64 * D * 4
 *   bytes (rounded up to 256), whatever the device.
 * - Workspace and plan: nothing on the CPU (workspace size 0, the plan a
 *   no-op after the checks). On CUDA the plan builds on the GPU, with no
 *   host synchronisation, what the run needs: the transposed layout (for
 *   each key block, the query blocks that select it) and the tile orders;
 *   the workspace also holds the run's per-row Dl and LSE terms, so its
 *   size grows with B * Hq * Sq as well as with the layout's sizes. Re-plan
 *   whenever the layout content changes.
 * - CUDA kernels: the portable sm_80+ backward (mma.sync, cp.async) runs on
 *   every CUDA backend (SK_BACKEND_CUDA_SM90 still needs compute
 *   capability 9.0, so one descriptor serves a Hopper forward and its
 *   backward). It takes what the forward's kernels take (F16 or BF16,
 *   head_dim 64 or 128, blocks 64 or 128, the same sequence and stride
 *   limits, dO and the gradients included) and grids below 2^31 CTAs
 *   (B * Hq * ceil(Sq / 64), B * Hkv * ceil(Sk / block_k) * block_k / 64);
 *   anything else is SK_STATUS_NOT_SUPPORTED naming the argument,
 *   after all the argument checks, so a bad argument gets the same status
 *   on every backend. One CTA owns each dK/dV key tile and each dQ query
 *   tile and sums in a fixed order: deterministic with no atomics.
 * - Aliasing: dQ, dK, dV (and the CUDA workspace) are written: none may
 *   share a byte with any other buffer of the call (q, k, v, o, dout, lse,
 *   the layout arrays, each other). Inputs may overlap each other.
 * - Strides: all three zero means packed; dQ, dK, dV strides must not make
 *   two elements share memory; O's neither (it is the forward's output).
 *   Alignment as the forward (CUDA: 16-byte pointers and strides).
 */

typedef struct sk_attention_backward_desc {
    size_t struct_size;      /* sizeof(sk_attention_backward_desc); set by its init */
    int32_t deterministic;   /* 1 (default): bitwise repeatable; 0: the faster mode
                                with fp32 atomics where there is one (see above) */
    int64_t dout_strides[3]; /* dO [B, Sq, Hq, D]; all 0 (default) = packed */
    int64_t dq_strides[3];   /* dQ [B, Sq, Hq, D]; all 0 (default) = packed */
    int64_t dk_strides[3];   /* dK [B, Sk, Hkv, D]; all 0 (default) = packed */
    int64_t dv_strides[3];   /* dV [B, Sk, Hkv, D]; all 0 (default) = packed */
} sk_attention_backward_desc;

/* Fill *bwd with the defaults above. struct_size is sizeof(*bwd) as the
 * caller knows it. */
SK_API sk_status sk_attention_backward_desc_init(sk_attention_backward_desc *bwd,
                                                 size_t struct_size);

/* Bytes of device workspace the backward plan and run need (the layout
 * arrays are not read). 0 for the CPU backend. */
SK_API sk_status sk_attention_backward_workspace_size(const sk_attention_desc *desc,
                                                      const sk_attention_backward_desc *bwd,
                                                      const sk_bsr *layout,
                                                      size_t *workspace_bytes);

/* Enqueue the planning of a backward run into `workspace` (graph safe;
 * re-run it whenever the layout content changes). A no-op for the CPU
 * backend after the argument checks. */
SK_API sk_status sk_attention_backward_plan(const sk_attention_desc *desc,
                                            const sk_attention_backward_desc *bwd,
                                            const sk_bsr *layout, void *workspace,
                                            size_t workspace_size, struct CUstream_st *stream);

/* Enqueue the backward on `stream`, using the plan in `workspace`.
 *   q, k, v, o  as the forward (desc's dtype and strides); read
 *   dout        [B, Sq, Hq, D]  dO, bwd->dout_strides; read
 *   lse         [B, Hq, Sq]     fp32 contiguous, as the forward wrote it; read
 *   dq          [B, Sq, Hq, D]  bwd->dq_strides; written
 *   dk, dv      [B, Sk, Hkv, D] bwd->dk_strides, bwd->dv_strides; written
 * Allocates nothing on the device and never synchronises (CUDA-graph
 * safe). For the CPU backend the call is synchronous, the workspace is
 * unused, and host scratch may be allocated (SK_STATUS_ALLOC_FAILED, with
 * nothing written, when that fails). */
SK_API sk_status sk_attention_backward_run(const sk_attention_desc *desc,
                                           const sk_attention_backward_desc *bwd,
                                           const sk_bsr *layout, const void *q, const void *k,
                                           const void *v, const void *o, const void *dout,
                                           const float *lse, void *dq, void *dk, void *dv,
                                           void *workspace, size_t workspace_size,
                                           struct CUstream_st *stream);

/* sk_attention_backward_plan followed by sk_attention_backward_run, same
 * arguments. */
SK_API sk_status sk_attention_backward(const sk_attention_desc *desc,
                                       const sk_attention_backward_desc *bwd,
                                       const sk_bsr *layout, const void *q, const void *k,
                                       const void *v, const void *o, const void *dout,
                                       const float *lse, void *dq, void *dk, void *dv,
                                       void *workspace, size_t workspace_size,
                                       struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Dynamic top-k block selection (SparseK / NSA / MoBA style)
 * ---------------------------------------------------------------------------
 * Block summaries: pooled Q [B, Hq, row_blocks, D] and pooled K
 * [B, Hkv, col_blocks, D], fp32 contiguous, each the mean of the block's
 * valid tokens (a tail block averages fewer tokens).
 * Block scores: score(b, h, i, j) = scale * dot(pooled_q[b, h, i], pooled_k[b, h / group, j]);
 * with per_kv_head, one score per KV head: the sum over its query heads.
 * Score accuracy: fp32, within 2 (n + 2) 2^-24 sum|terms| of the exact dot
 * product (n terms). The CPU backend and the portable CUDA kernel sum one
 * fp32 FMA chain; on compute capability 9.0 (backend CUDA or CUDA_SM90) the
 * scores come from the tensor cores, so the last bits, and with them the
 * choice between near-tied blocks, can differ from the other backends:
 * with head_dim <= 128 each pooled row is scaled by a power of two and
 * split into two fp16 parts, which adds up to n 2^-38 max|a| max|k| to the
 * bound above (a and k the two pooled rows: entries below about 2^-24 of
 * their row's largest keep that absolute accuracy, not their own 22 bits;
 * rows whose largest |x| is below 2^-112 lose more); with a larger
 * head_dim a 3xTF32 split, within the bound above. Pooled entries that
 * are not finite give every backend's scores the value of the sum over
 * heads of fp32 dot products (+-inf or NaN as IEEE arithmetic has it, e.g.
 * inf * 0 = NaN, inf - inf = NaN), not an artefact of a split or of the
 * per_kv_head group's summed query rows. Every backend is
 * deterministic; SK_BACKEND_CUDA_SM80 forces the portable kernels,
 * SK_BACKEND_CUDA_SM90 needs a 9.0 device.
 * Selection per layout row, over candidate blocks (all blocks; with causal,
 * only blocks holding a causal pair): the forced blocks first (sinks
 * 0 .. sink_blocks-1, and the local_blocks blocks ending at the row's
 * diagonal block d = the key block holding position p of the row's last
 * valid query, p = q + Sk - Sq), then the k highest-scoring remaining
 * candidates, ties to the lower block index; NaN and -inf scores are never
 * picked by score. These are exactly the rules of sk_layout_create_topk, so
 * the host builder is the reference of the device selection.
 * Output: a BSR layout written on the device into caller buffers whose
 * sizes come from sk_topk_layout_capacity, so nothing waits on the host
 * and a CUDA graph can capture it. Its nnz field is set to the capacity;
 * row_offsets[last] <= capacity is the real count (see "Robustness"): rows
 * can come out shorter than k when scores are NaN or -inf, so before
 * sk_layout_validate on a host copy, set nnz = row_offsets[last]. The
 * col_indices entries from row_offsets[last] to the capacity are then
 * unspecified (nothing past the capacity is written).
 * The CUDA path needs head_dim a multiple of 8 and 16-byte aligned pooled
 * buffers and workspace; the CPU path may return SK_STATUS_ALLOC_FAILED for
 * its scratch. In sk_attention_topk, topk->mask decides which blocks may be
 * selected and attn->mask the token-level mask inside them: they are
 * independent (set both for causal attention).
 * Size limit: every selection scores the whole grid into a dense fp32
 * matrix [slices, row_blocks, col_blocks] (the CUDA workspace, the CPU
 * scratch, sk_layout_from_scores' input), so its entry count must not
 * exceed INT32_MAX (8 GiB): past that every sk_topk_* call on the
 * descriptor returns SK_STATUS_BAD_LAYOUT_OVERFLOW naming the matrix. */

typedef struct sk_topk_desc {
    size_t struct_size;   /* sizeof(sk_topk_desc); set by sk_topk_desc_init */
    sk_backend backend;   /* default SK_BACKEND_CUDA */
    sk_dtype dtype;       /* Q and K: F16 or BF16 (F32 on the CPU only). Default F16 */
    int64_t batch;        /* B */
    int64_t seq_q;        /* Sq */
    int64_t seq_k;        /* Sk */
    int64_t heads_q;      /* Hq, a multiple of heads_kv */
    int64_t heads_kv;     /* Hkv */
    int64_t head_dim;     /* D */
    int64_t q_strides[3]; /* Q [B, Sq, Hq, D] element strides, all 0 = packed */
    int64_t k_strides[3]; /* K [B, Sk, Hkv, D] element strides, all 0 = packed */
    int32_t block_q;      /* 64 or 128; default 128 */
    int32_t block_k;      /* 64 or 128; default 128 */
    float scale;          /* score scale; 0 (default) means 1/sqrt(D). Any finite
                             value: a score beyond the fp32 range is +-inf (picked
                             first, or never, by the selection rules below) */
    int32_t k;            /* blocks picked by score per row, >= 0; default 16 */
    int32_t sink_blocks;  /* forced leading blocks, >= 0; default 0 */
    int32_t local_blocks; /* forced blocks ending at the diagonal, >= 0; default 0 */
    sk_mask mask;         /* SK_MASK_CAUSAL: never select a block with no causal pair */
    int32_t per_kv_head;  /* != 0: one layout per KV head (heads = Hkv), scores summed
                             over its query heads; 0 (default): per query head (heads = Hq) */
} sk_topk_desc;

SK_API sk_status sk_topk_desc_init(sk_topk_desc *desc, size_t struct_size);

/* The output layout's grid and the capacity its buffers need:
 * row_offsets: slices * row_blocks + 1 entries; col_indices: *max_nnz.
 * Either output may be NULL. */
SK_API sk_status sk_topk_layout_capacity(const sk_topk_desc *desc, sk_grid *grid,
                                         int32_t *max_nnz);

/* Workspace bytes of sk_select_topk / sk_layout_from_scores (0 on the CPU). */
SK_API sk_status sk_topk_workspace_size(const sk_topk_desc *desc, size_t *workspace_bytes);

/* Block means of Q and K.
 *   q         [B, Sq, Hq, D]   desc->dtype, desc->q_strides
 *   k         [B, Sk, Hkv, D]  desc->dtype, desc->k_strides
 *   pooled_q  [B, Hq, row_blocks, D]  fp32 contiguous; written
 *   pooled_k  [B, Hkv, col_blocks, D] fp32 contiguous; written */
SK_API sk_status sk_block_pool(const sk_topk_desc *desc, const void *q, const void *k,
                               float *pooled_q, float *pooled_k, struct CUstream_st *stream);

/* Score the pooled blocks and select; writes layout->row_offsets and
 * layout->col_indices (capacity from sk_topk_layout_capacity) and sets
 * layout->grid and layout->nnz (= capacity). */
SK_API sk_status sk_select_topk(const sk_topk_desc *desc, const float *pooled_q,
                                const float *pooled_k, sk_bsr *layout, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream);

/* Pool and select in one call: the layout from Q and K (as sk_block_pool
 * then sk_select_topk, with the same layout bit for bit), the pooled blocks
 * kept in the workspace. It reads only the Q and K blocks that a score it
 * uses depends on: query row blocks with a candidate to pick by score, and
 * key blocks that some row may pick by score (so never the sinks, nor, with
 * causal, the key blocks that are local to every row that reaches them).
 * This is the selection that sk_attention_topk runs
 * before its attention; use it to select once and run sk_attention_forward
 * (or several) on the layout. On a 9.0 device with head_dim 64 or 128 (and
 * no group sums: per_kv_head with a group of one head, or per query head)
 * the pooling writes the scoring's split operands directly, which saves a
 * pass over pooled K. Workspace from sk_pool_select_topk_workspace_size (0
 * bytes on the CPU, where workspace may be NULL). */
SK_API sk_status sk_pool_select_topk_workspace_size(const sk_topk_desc *desc,
                                                    size_t *workspace_bytes);
SK_API sk_status sk_pool_select_topk(const sk_topk_desc *desc, const void *q, const void *k,
                                     sk_bsr *layout, void *workspace, size_t workspace_size,
                                     struct CUstream_st *stream);

/* The same selection from caller scores: fp32 [slices, row_blocks,
 * col_blocks] contiguous (slices = B * (per_kv_head ? Hkv : Hq)), for
 * example from a learned scorer. */
SK_API sk_status sk_layout_from_scores(const sk_topk_desc *desc, const float *scores,
                                       sk_bsr *layout, void *workspace, size_t workspace_size,
                                       struct CUstream_st *stream);

/* Selection followed by the attention forward, on one stream:
 * pool, score, select into *layout (caller buffers as above, readable
 * afterwards), plan, run. attn and topk must describe the same problem
 * (sizes, dtype, Q/K strides, backend, block sizes). Workspace from
 * sk_attention_topk_workspace_size. */
SK_API sk_status sk_attention_topk_workspace_size(const sk_attention_desc *attn,
                                                  const sk_topk_desc *topk,
                                                  size_t *workspace_bytes);
SK_API sk_status sk_attention_topk(const sk_attention_desc *attn, const sk_topk_desc *topk,
                                   const void *q, const void *k, const void *v, void *o,
                                   float *lse, sk_bsr *layout, void *workspace,
                                   size_t workspace_size, struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Decode page selection (Quest-style)
 * ---------------------------------------------------------------------------
 * For decode over the paged KV cache (see "Paged KV cache"): per
 * (sequence, KV head) a summary of each key block, kept next to the cache
 * and updated as tokens are appended, and a selection of key blocks from the
 * current queries' upper bounds on those blocks' logits. All on the device
 * and graph safe; the CPU backend is the reference, bit for bit.
 *
 * Key blocks are block_k (16, 32, 64 or 128) logical positions: block j of
 * sequence b holds keys j*block_k .. min((j+1)*block_k, len_k(b)) - 1. It
 * may span pages or share one with other blocks (block_k need not equal
 * page_size). max_blocks = ceil(max_seqlen_k / block_k).
 *
 * Summaries: `summary`, desc->dtype (the cache's; F32 on the CPU only),
 * [B, Hkv, max_blocks, 2, D] contiguous: entry [b, h, j, 0, :] is the
 * per-channel minimum of block j's keys of KV head h, [b, h, j, 1, :] the
 * maximum. The minimum and maximum of values of a dtype are values of that
 * dtype, so storing them in it is exact and halves the bytes the scoring
 * reads (fp32 would add nothing). Keys are taken in position order, a NaN
 * key channel never replaces a value (x < min and x > max are false), and
 * a block with no key (past len_k(b), or every channel NaN) holds min =
 * +inf, max = -inf: its score is then -inf or NaN, never picked by score.
 * A partly filled last block covers only its valid keys.
 *
 * Scores: with G = Hq / Hkv, for KV head h the query heads h*G .. h*G+G-1,
 *   Qp[d] = sum_{t < q_len} sum_{g < G} max(q[b, t, h*G+g, d], 0)
 *   Qn[d] = sum_{t < q_len} sum_{g < G} min(q[b, t, h*G+g, d], 0)
 *   score(b, h, j) = scale * sum_d (Qp[d] * max_j[d] + Qn[d] * min_j[d])
 * which equals the sum over the group's heads and the q_len tokens of
 * Quest's bound sum_d max(q_d min_d, q_d max_d) >= q . k for every key k of
 * the block (the sum, not the max, over heads and tokens: one selection per
 * KV head, as sk_topk_desc's per_kv_head; scale > 0 keeps the order).
 * Arithmetic, identical on every backend: Qp and Qn are fp32 sums in the
 * order t, then g; the dot product is split over 32 lanes, lane l taking
 * channels l*D/32 .. (l+1)*D/32 - 1 in order as one fp32 FMA chain
 * (fmaf(Qp, max, acc) then fmaf(Qn, min, acc) per channel, acc from +0),
 * the 32 partial sums then added pairwise (lanes l and l + 16, then + 8,
 * + 4, + 2, + 1), the result multiplied by scale.
 *
 * Selection per (b, h), with n = ceil(len_k(b) / block_k) candidate blocks:
 * forced sinks 0 .. min(sink_blocks, n) - 1 and the recent_blocks blocks
 * max(0, n - recent_blocks) .. n - 1 (ending at the block of the last key),
 * then the k highest-scoring remaining candidates, ties to the lower index;
 * NaN and -inf never picked by score (the rules of sk_layout_create_topk
 * with causal, for the one query row at position len_k(b) - 1). A sequence
 * with len_k(b) = 0 gets an empty row.
 *
 * Two levels (group_blocks > 0; off by default): the summary buffer also
 * holds, after the block summaries, group summaries [B, Hkv, max_groups,
 * 2, D] (max_groups = ceil(max_blocks / group_blocks)): group g is the
 * per-channel min / max over the stored summaries of blocks g *
 * group_blocks .. (g + 1) * group_blocks - 1 below ceil(len_k(b) /
 * block_k), in block order, kept by the build and the append (which
 * recomputes the groups holding the blocks it updated). The selection
 * first scores the row's ceil(n / group_blocks) groups (the same formula
 * and arithmetic on the group summaries) and keeps the top_groups best
 * (ties to the lower index, NaN / -inf never; with finite keys and
 * top_groups >= that count this is the one-level selection); then the
 * blocks outside the kept groups count as scored -inf (never picked by
 * score; forced blocks still are) and only the kept groups' block
 * summaries are read. The selection then reads
 * about (max_groups + top_groups x group_blocks) summaries per row instead
 * of max_blocks.
 *
 * Output, the decode layout: an sk_bsr with grid {rows = q_len, cols =
 * max_seqlen_k, block_rows = 64, block_cols = block_k, batch = B, heads =
 * Hkv}: one row per (sequence, KV head), row r = b * Hkv + h, row_offsets
 * [B * Hkv + 1], each row's col_indices increasing, below n. Note
 * block_cols may be 16 or 32 here, which sk_layout_validate (64 or 128)
 * does not accept: check a host copy with your own rule. As
 * sk_select_topk: nnz is set to the capacity (sk_decode_select_capacity,
 * at most B * Hkv * (k + sink_blocks + recent_blocks)), row_offsets[B *
 * Hkv] is the real count, entries past it are unspecified.
 *
 * Checks: every size and pointer as the paged forward's (sizes, strides,
 * alignment, aliasing). One descriptor serves the three calls: its page
 * fields are checked by each, read by the build and the append only. On the CPU the length arrays and the page indices a
 * call reads are checked too (SK_STATUS_BAD_PARAM_SHAPE / _VALUE naming the
 * entry, nothing written). The CUDA kernels cannot check device arrays: a
 * length is clamped to [0, max_seqlen_k] (an append's old length to [0,
 * new length]) and a page index outside [0, num_pages) is absent (its keys
 * skipped, never read). head_dim: a multiple of 32, at most 256, on every
 * backend; q_len 1 .. 64. CUDA needs 16-byte aligned q, k_cache, summary and
 * workspace, and 16-byte multiples for the strides in bytes.
 */

typedef struct sk_decode_select_desc {
    size_t struct_size;        /* sizeof(sk_decode_select_desc); set by its init */
    sk_backend backend;        /* default SK_BACKEND_CUDA */
    sk_dtype dtype;            /* q, k_cache and summary: F16 or BF16; F32 on the CPU only.
                                  Default F16 */
    int64_t batch;             /* B >= 1 sequences (fits int32) */
    int64_t q_len;             /* query tokens per sequence, 1 .. 64 */
    int64_t heads_q;           /* Hq, a multiple of heads_kv */
    int64_t heads_kv;          /* Hkv */
    int64_t head_dim;          /* D: 32, 64, ... 256 */
    int64_t max_seqlen_k;      /* >= every len_k(b); 1 .. max_pages x page_size */
    int32_t block_k;           /* key block of the summaries and the layout: 16, 32, 64 or
                                  128; default 64 */
    float scale;               /* score scale; 0 (default) means 1/sqrt(D); finite */
    int32_t k;                 /* blocks picked by score per row, >= 0; default 64 */
    int32_t sink_blocks;       /* forced leading blocks, >= 0; default 1 */
    int32_t recent_blocks;     /* forced blocks ending at the last key's, >= 0; default 2 */
    int64_t q_strides[3];      /* q [B, q_len, Hq, D] over [batch, token, head]; 0 0 0 = packed */
    int64_t num_pages;         /* pages in the cache, 1 .. INT32_MAX */
    int32_t page_size;         /* 16, 32, 64 or 128; default 64 */
    int32_t max_pages;         /* columns of page_table, >= 1 */
    int64_t page_table_stride; /* elements between rows of page_table; 0 (default) = max_pages */
    int64_t k_strides[3];      /* k_cache [num_pages, page_size, Hkv, D] over [page, slot,
                                  head]; all 0 = packed */
    int32_t group_blocks;      /* two levels: key blocks per group, 2 .. 4096; 0 (default): one
                                  level */
    int32_t top_groups;        /* groups kept by the first level, >= 1 (with group_blocks) */
} sk_decode_select_desc;

/* Fill *desc with the defaults above (sizes 0, to be set). */
SK_API sk_status sk_decode_select_desc_init(sk_decode_select_desc *desc, size_t struct_size);

/* Bytes of the summary buffer: B x Hkv x max_blocks x 2 x D x dtype size,
 * plus B x Hkv x max_groups x 2 x D x dtype size with group_blocks. */
SK_API sk_status sk_kv_summary_bytes(const sk_decode_select_desc *desc, size_t *bytes);

/* Build every block's summary (all max_blocks of each row; the blocks past
 * len_k(b) get the empty summary) from the cache.
 *   k_cache     [num_pages, page_size, Hkv, D]  dtype, desc->k_strides
 *   page_table  int32 [B, max_pages], row stride page_table_stride
 *   seq_lens_k  int32 [B]
 *   summary     written (sk_kv_summary_bytes) */
SK_API sk_status sk_kv_summary_build(const sk_decode_select_desc *desc, const void *k_cache,
                                     const int32_t *page_table, const int32_t *seq_lens_k,
                                     void *summary, struct CUstream_st *stream);

/* After keys old_lens[b] .. new_lens[b] - 1 of each sequence were written to
 * the cache: update the blocks holding them, and only those (blocks
 * old_lens[b] / block_k .. ceil(new_lens[b] / block_k) - 1; the first is
 * merged with its stored summary when it held keys before). The result
 * equals sk_kv_summary_build at new_lens. old_lens[b] <= new_lens[b] <=
 * max_seqlen_k (checked on the CPU). */
SK_API sk_status sk_kv_summary_append(const sk_decode_select_desc *desc, const void *k_cache,
                                      const int32_t *page_table, const int32_t *old_lens,
                                      const int32_t *new_lens, void *summary,
                                      struct CUstream_st *stream);

/* The decode layout's grid and the capacity of its col_indices. Either
 * output may be NULL. */
SK_API sk_status sk_decode_select_capacity(const sk_decode_select_desc *desc, sk_grid *grid,
                                           int32_t *max_nnz);

/* Workspace bytes of sk_decode_select (0 on the CPU). */
SK_API sk_status sk_decode_select_workspace_size(const sk_decode_select_desc *desc,
                                                 size_t *workspace_bytes);

/* Score every candidate block and select into the caller's layout buffers
 * (row_offsets [B * Hkv + 1], col_indices [capacity]); sets layout->grid and
 * layout->nnz (= capacity).
 *   q           [B, q_len, Hq, D]  dtype, desc->q_strides
 *   summary     as sk_kv_summary_build wrote it
 *   seq_lens_k  int32 [B] */
SK_API sk_status sk_decode_select(const sk_decode_select_desc *desc, const void *q,
                                  const void *summary, const int32_t *seq_lens_k, sk_bsr *layout,
                                  void *workspace, size_t workspace_size,
                                  struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * BSR sparse x dense GEMM:  C = alpha * A * B + beta * C
 * ------------------------------------------------------------------------- */

typedef struct sk_bsr_gemm_desc {
    size_t struct_size; /* sizeof(sk_bsr_gemm_desc); set by sk_bsr_gemm_desc_init */
    sk_backend backend; /* default SK_BACKEND_CUDA */
    sk_dtype ab_dtype;  /* A values and B: F16 or BF16 (F32 on the CPU only). Default F16 */
    sk_dtype c_dtype;   /* C: F16, BF16 or F32. Default F32 */
    int64_t m;          /* rows of A and C, >= 1 */
    int64_t n;          /* columns of B and C, >= 1 */
    int64_t k;          /* columns of A, rows of B, >= 1 */
    sk_order b_order;   /* default SK_ORDER_ROW_MAJOR */
    int64_t ldb;        /* leading dimension of B in elements; 0 = packed (n, or k if col-major) */
    int64_t ldc;        /* C is row-major [m, n]; leading dimension, 0 = packed (n) */
    float alpha;        /* default 1 */
    float beta;         /* default 0; when 0, C is not read (NaN in C does not propagate) */
} sk_bsr_gemm_desc;

SK_API sk_status sk_bsr_gemm_desc_init(sk_bsr_gemm_desc *desc, size_t struct_size);

/* Workspace bytes for this descriptor and A's geometry (arrays not read). */
SK_API sk_status sk_bsr_gemm_workspace_size(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                                            size_t *workspace_bytes);

/* Enqueue planning (row order by block count) into the workspace; graph safe. */
SK_API sk_status sk_bsr_gemm_plan(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                                  void *workspace, size_t workspace_size,
                                  struct CUstream_st *stream);

/* Enqueue C = alpha * A * B + beta * C.
 *   a_layout  grid rows = m, cols = k, batch = heads = 1
 *   a_values  [nnz, block_rows, block_cols] row-major blocks, in col_indices order
 *   b         [k, n] in desc->b_order with desc->ldb
 *   c         [m, n] row-major with desc->ldc; read when beta != 0, written
 * Rows of A with no block get C = beta * C. Tails (m, k not multiples of the
 * blocks) are masked: block elements past m or k are never read. */
SK_API sk_status sk_bsr_gemm_run(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                                 const void *a_values, const void *b, void *c, void *workspace,
                                 size_t workspace_size, struct CUstream_st *stream);

/* sk_bsr_gemm_plan followed by sk_bsr_gemm_run. */
SK_API sk_status sk_bsr_gemm(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                             const void *a_values, const void *b, void *c, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------- */

typedef struct sk_device_info {
    char name[256];       /* as cudaDeviceProp::name */
    int32_t cc_major;     /* compute capability */
    int32_t cc_minor;
    int32_t sm_count;     /* multiprocessors */
    int64_t memory_bytes; /* global memory */
    int64_t l2_bytes;     /* L2 cache */
} sk_device_info;

/* Number of CUDA devices usable by this build: 0 (and SUCCESS) when the
 * library was built without CUDA or no driver/GPU is present. */
SK_API sk_status sk_device_count(int32_t *count);

/* Properties of device `device` (0 .. count-1). */
SK_API sk_status sk_device_get_info(int32_t device, sk_device_info *info);

/* ---------------------------------------------------------------------------
 * Context parallel: one attention over a sequence sharded across R ranks
 * ---------------------------------------------------------------------------
 * The self-attention above (Sq = Sk = S, batch B) with the token axis split
 * across R ranks (docs/perf/context_parallel.md). The global block grid
 * (blocks of `block` tokens, nb = ceil(S / block)) is cut into chunks of
 * whole blocks: chunk c holds blocks floor(c nb / C) .. floor((c + 1) nb /
 * C) - 1, with C = R (SK_CP_SHARDING_CONTIGUOUS: rank r holds chunk r) or
 * C = 2R (SK_CP_SHARDING_ZIGZAG: rank r holds chunks r and 2R - 1 - r, which
 * balances causal work), or at the caller's boundaries (desc->chunk_starts,
 * e.g. from sk_cp_balance, below). nb >= C is required. A rank's shard is its chunks'
 * tokens, in increasing order, packed:
 *   q  [B, S_r, Hq,  D]   the rank's queries; read
 *   k  [B, S_r, Hkv, D]   its keys; read (and sent to the ranks that need them)
 *   v  [B, S_r, Hkv, D]   its values; likewise
 *   o  [B, S_r, Hq,  D]   written
 *   lse [B, Hq, S_r]      fp32; written; may be NULL
 * (S_r and the chunk offsets from sk_cp_shard). Each rank gets exactly the
 * rows of the single-process sk_attention_forward over the global tensors
 * with the global layout (semantics, empty rows, tails and causal as
 * there), up to rounding: see "Accuracy" below.
 *
 * The layout is the GLOBAL one (grid S x S, block_rows = block_cols, any
 * batch / heads slicing), on the host, the same on every rank. The plan
 * (sk_cp_plan, host, deterministic) lists for every ordered pair of ranks
 * the key blocks one sends the other: a unit is the K and V rows of one
 * (batch b, KV head, key block j) that some row of the receiver selects
 * and the sender owns, each unit once (deduplicated over rows, query heads
 * and slices); with causal, blocks wholly above a row's diagonal are
 * dropped (they contribute nothing). The exchanged bytes are exactly the
 * bytes of those units (2 x tokens x D x element size each), reported by
 * sk_cp_plan_bytes.
 *
 * The run on rank r: pack its outgoing units, exchange them (one group of
 * sends and receives through the communicator), attend each of its chunks
 * to its own keys (no communication needed) and to the received blocks,
 * and merge the two partial results by their LSE.
 *
 * Accuracy: the merge changes only the fp32 / fp64 rounding before O's
 * single rounding to the dtype (the CPU backend computes the partial
 * results in fp32), so O differs from the single-process CPU forward by at
 * most about one rounding of the dtype (tests/cpu/test_cp.c) and LSE by
 * fp32 rounding.
 *
 * Communicators (sk_comm_t): a simulated in-process one (R handles sharing
 * memory; call each rank's sk_cp_forward from its own thread, since a run
 * waits for its peers), for the CPU backend and the tests; its device twin
 * (sk_comm_create_simulated_cuda: the CUDA run on one process's GPUs, for
 * tests: it synchronises); and NCCL (sk_comm_create_nccl, taking the
 * caller's ncclComm_t), only in builds that found nccl.h, device memory
 * only: SK_STATUS_NOT_SUPPORTED elsewhere.
 *
 * The CUDA run (backends CUDA, CUDA_SM80, CUDA_SM90; F16 or BF16; D as the
 * forward supports): sk_cp_prepare uploads the plan into the workspace and
 * plans the attention passes, once per plan; sk_cp_forward then enqueues,
 * on the communicator's side stream (forked from `stream`), the packing
 * and the exchange, and on `stream` the local passes (overlapping them),
 * then the unpacking, the remote passes and the merge. The partial
 * results are rounded to the dtype before the merge (fp32 math), so O
 * differs from the single-GPU forward by about two roundings where a row
 * has remote blocks, and is bitwise equal where it has none (the same
 * kernel over the same keys).
 */

typedef enum sk_cp_sharding {
    SK_CP_SHARDING_CONTIGUOUS = 1, /* rank r holds chunk r of R */
    SK_CP_SHARDING_ZIGZAG = 2      /* rank r holds chunks r and 2R - 1 - r of 2R */
} sk_cp_sharding;

typedef struct sk_cp_desc {
    size_t struct_size;      /* sizeof(sk_cp_desc); set by sk_cp_desc_init */
    int32_t ranks;           /* R >= 1 */
    int32_t rank;            /* this rank, 0 .. R - 1 */
    sk_cp_sharding sharding; /* default SK_CP_SHARDING_CONTIGUOUS */
    sk_backend backend;      /* default SK_BACKEND_CUDA */
    sk_dtype dtype;          /* Q, K, V, O: F16 or BF16 (F32 on the CPU only). Default F16 */
    int64_t batch;           /* B >= 1 */
    int64_t seq;             /* S, the global sequence (Sq = Sk) */
    int64_t heads_q;         /* Hq, a multiple of heads_kv */
    int64_t heads_kv;        /* Hkv */
    int64_t head_dim;        /* D */
    float scale;             /* as sk_attention_desc: 0 (default) means 1/sqrt(D) */
    sk_mask mask;            /* default SK_MASK_NONE */
    /* Added later; a caller passing the earlier struct_size (offsetof
     * chunk_starts) gets the defaults. */
    const int32_t *chunk_starts; /* [C + 1] host: chunk c is global blocks chunk_starts[c] ..
                                    chunk_starts[c + 1] - 1 (blocks of the layout's size): 0 =
                                    [0] < [1] < ... < [C] = nb. NULL (default): equal chunks,
                                    floor(c nb / C). sk_cp_balance fills one; every sk_cp_* call
                                    reads it, so plan and run with the same array */
    int32_t reserve_sms;         /* CUDA, Hopper kernel: SMs the first local pass leaves to the
                                    exchange during its first part (an eighth of its tiles),
                                    0 .. 1024; 0 keeps the two parts on every SM. Default 16 */
} sk_cp_desc;

SK_API sk_status sk_cp_desc_init(sk_cp_desc *desc, size_t struct_size);

/* The shard of `rank` for desc's ranks, sharding and S, with blocks of
 * `block` tokens (64 or 128): *tokens = S_r, and its chunks (1 or 2, in
 * local order) as global token ranges starts[c] .. starts[c] + lengths[c]
 * - 1 (unused entries 0). Any output but tokens may be NULL. */
SK_API sk_status sk_cp_shard(const sk_cp_desc *desc, int32_t rank, int32_t block,
                             int64_t *tokens, int32_t *chunks, int64_t starts[2],
                             int64_t lengths[2]);

/* Bytes of the plan of desc over the global host layout (which this call
 * reads: the plan's size depends on its content). */
SK_API sk_status sk_cp_plan_size(const sk_cp_desc *desc, const sk_bsr *layout,
                                 size_t *plan_bytes);

/* Fill the host plan (plan_bytes >= sk_cp_plan_size, 8-byte aligned):
 * validates the layout (sk_layout_validate) and its geometry against desc,
 * then lists every rank's units and local layouts. The same for every
 * rank (desc->rank is checked, not used). Allocates host scratch
 * (SK_STATUS_ALLOC_FAILED, nothing written, when that fails). */
SK_API sk_status sk_cp_plan(const sk_cp_desc *desc, const sk_bsr *layout, void *plan,
                            size_t plan_bytes);

/* From a plan: the bytes and units (K and V of one block of one batch and
 * KV head) that rank src sends rank dst (0 when src == dst). Either output
 * may be NULL. */
SK_API sk_status sk_cp_plan_bytes(const void *plan, size_t plan_bytes, int32_t src, int32_t dst,
                                  int64_t *bytes, int64_t *units);

/* Workspace bytes of desc->rank's run with this plan (host memory on the
 * CPU backend, device memory on CUDA: send and receive buffers, the
 * received blocks, partial results; on CUDA also the plan's device copy
 * and the attention passes' plans). */
SK_API sk_status sk_cp_workspace_size(const sk_cp_desc *desc, const void *plan,
                                      size_t plan_bytes, size_t *workspace_bytes);

/* CUDA: enqueue on `stream` the upload of the plan (host) into the
 * workspace and the planning of desc->rank's attention passes; every
 * sk_cp_forward with this plan and workspace comes after it (re-run it
 * when the plan or the workspace changes). The plan's host bytes may be
 * freed on return. A no-op after the checks on the CPU backend. Not
 * graph safe (a copy from pageable host memory); sk_cp_forward is. */
SK_API sk_status sk_cp_prepare(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                               void *workspace, size_t workspace_size,
                               struct CUstream_st *stream);

/* A communicator: the transport of a run. Opaque. */
typedef struct sk_comm_s *sk_comm_t;

/* `ranks` handles of one simulated in-process communicator, comms[r] for
 * rank r (host memory; the CPU backend). A run's exchange waits for the
 * peers' runs (up to 60 s, then SK_STATUS_EXECUTION_FAILED): run the ranks
 * on separate threads. Destroy every handle. */
SK_API sk_status sk_comm_create_simulated(int32_t ranks, sk_comm_t *comms);

/* `ranks` handles of one simulated communicator over device memory, for
 * the CUDA run in one process (ranks on one GPU or several, each rank's
 * run on its own thread, its current device the one the handle was made
 * on). A group's end synchronises the rank's stream: for tests, not for
 * graphs or speed. Each handle owns a side stream made on the current
 * device (SK_STATUS_NOT_SUPPORTED_BACKEND without one). */
SK_API sk_status sk_comm_create_simulated_cuda(int32_t ranks, sk_comm_t *comms);

/* Wrap the caller's ncclComm_t (passed as void *; it stays the caller's),
 * with the current device the comm's: the handle owns a side stream made
 * there. SK_STATUS_NOT_SUPPORTED when the library was built without NCCL. */
SK_API sk_status sk_comm_create_nccl(void *nccl_comm, sk_comm_t *out);

/* Free a handle (NULL: no-op); the simulated state goes with the last one. */
SK_API void sk_comm_destroy(sk_comm_t comm);

/* This handle's rank and size, and the bytes it has sent so far (every
 * run through it added up). Any output may be NULL. */
SK_API sk_status sk_comm_info(sk_comm_t comm, int32_t *rank, int32_t *ranks,
                              int64_t *bytes_sent);

/* desc->rank's forward: exchange the planned blocks through `comm`
 * (whose rank and size must be desc's), then the attention of its shard
 * (tensors above, packed). The CPU backend is synchronous; the CUDA run
 * is enqueued on `stream` after sk_cp_prepare (above) and is graph safe
 * with an NCCL communicator as far as NCCL allows. Aliasing: o and lse
 * against each other, the inputs and the workspace. Every check, the
 * whole plan's included (a corrupt one is SK_STATUS_BAD_PARAM_VALUE on
 * every rank; the CUDA run checks the plan's records and units, and reads
 * the layouts from the copy sk_cp_prepare checked), runs before the
 * exchange; a rank whose call fails sends nothing, so its
 * peers wait for it (simulated: SK_STATUS_EXECUTION_FAILED after 60 s;
 * NCCL: as NCCL does): make the same call on every rank. */
SK_API sk_status sk_cp_forward(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                               sk_comm_t comm, const void *q, const void *k, const void *v,
                               void *o, float *lse, void *workspace, size_t workspace_size,
                               struct CUstream_st *stream);

/* Chunk boundaries balanced by a cost model (desc->chunk_starts).
 *
 * Equal chunks give every rank the same blocks, not the same time: a
 * remote pass runs its few blocks per row at a lower rate than a local
 * pass (each (query block, head) tile pays a fixed cost), and with causal
 * the ranks holding later rows read more remote blocks. The model: rank
 * r's predicted time is
 *   local x local_block + remote x remote_block + tiles x tile
 * with local / remote its rows' selected blocks (one query block against
 * one key block for one batch and query head; causal: blocks above the
 * diagonal dropped) whose key block it owns / receives, and tiles its
 * passes' (query block, batch, query head) rows holding at least one block
 * (a row with local and remote blocks counts twice). sk_cp_balance chooses
 * the C + 1 chunk starts that give every CHUNK the same predicted cost
 * (so every rank, contiguous or zigzag, the same time), iterating because
 * the cost of a row depends on who owns its key blocks (with remote_block
 * > local_block, moving one boundary changes the other chunks' costs: the
 * boundaries are walked block by block on the exact coupled costs); it
 * keeps the best candidate by the slowest rank's prediction (then the
 * spread), the equal chunks included, so it never predicts worse than
 * them. Host only; the layout is the global one sk_cp_plan takes
 * (validated here too). */
typedef struct sk_cp_cost {
    double local_block;  /* ns per block of a local pass; default 13.25 */
    double remote_block; /* ns per block of a remote pass; default 20.1 */
    double tile;         /* ns per tile of either pass; default 61.4 */
} sk_cp_cost;

/* The default costs, B1 H32/8 D128 bf16, blocks of 128, causal
 * (docs/perf/context_parallel.md section 10): local block and tile fitted
 * on 2 x H200, the remote block from 2 x H100 (where it predicted both
 * ranks within 1.3 % and gave the fastest run). Only their ratios matter
 * to the balance. */
SK_API sk_status sk_cp_cost_default(sk_cp_cost *cost);

/* Every rank's prediction for desc's chunks (desc->chunk_starts or the
 * equal ones) over the global host layout: rank_ns[r], local_blocks[r],
 * remote_blocks[r], tiles[r] (arrays of desc->ranks; any may be NULL).
 * cost NULL: the defaults. */
SK_API sk_status sk_cp_predict(const sk_cp_desc *desc, const sk_bsr *layout,
                               const sk_cp_cost *cost, double *rank_ns, int64_t *local_blocks,
                               int64_t *remote_blocks, int64_t *tiles);

/* Balanced chunk starts for desc's ranks, sharding, mask and sizes over
 * the global host layout (its blocks): chunk_starts[0 .. C] (count >= C +
 * 1 entries; C = R contiguous, 2R zigzag), ready for desc->chunk_starts
 * (which this call ignores). cost NULL: the defaults; every cost >= 0 and
 * finite, not all 0. Deterministic. Allocates host scratch (about 4 bytes
 * per layout entry and 8 per layout row). */
SK_API sk_status sk_cp_balance(const sk_cp_desc *desc, const sk_bsr *layout,
                               const sk_cp_cost *cost, int32_t *chunk_starts, int32_t count);

/* ---------------------------------------------------------------------------
 * Context parallel backward
 * ---------------------------------------------------------------------------
 * The gradients of sk_cp_forward, per rank: with the forward's descriptor
 * and plan, desc->rank's shards of Q, K, V, O and of the GLOBAL LSE that
 * sk_cp_forward wrote (required here), and dO, write its shards of dQ, dK
 * and dV: the rows of the single-process sk_attention_backward over the
 * global tensors with the global layout (its semantics: empty rows, keys
 * no row reads, tails, causal), up to rounding (below).
 *   q, k, v, o, lse   as sk_cp_forward (o and lse: what it wrote); read
 *   dout [B, S_r, Hq,  D]   dO; read
 *   dq   [B, S_r, Hq,  D]   written
 *   dk   [B, S_r, Hkv, D]   written (every key row: 0 where nothing adds)
 *   dv   [B, S_r, Hkv, D]   written
 * all packed, desc's dtype; lse fp32 [B, Hq, S_r].
 *
 * The run: the forward's K/V exchange (the same plan, units and bytes);
 * per chunk, sk_attention_backward of its local pass and of its remote pass
 * on the forward's sub-layouts. P = exp(S - LSE) from the global LSE and
 * Dl = rowsum(dO * O) from the global O make each pass's gradients the
 * exact share of its (query, key) pairs. dQ = local + remote share; the
 * remote passes' dK / dV of each received unit go back to the unit's owner
 * (fp32: the owner adds them to its own shares, and rounding them to the
 * dtype on the way would add one rounding per contributing rank), along
 * the reverse of the forward's pairs in one more group; the owner adds
 * them at the unit's key rows. Bytes per rank pair: the forward's K/V
 * bytes there and back again as fp32 dK / dV, 2 x 4 / (element size) times
 * them: for F16 / BF16, 3x the forward's exchange in all.
 *
 * Determinism: a fixed order of sums, so the same inputs give bitwise the
 * same outputs: dQ = local + remote; dK, dV = chunk 0's local pass, then
 * chunk 1's (zigzag), then each peer's returned share in increasing peer
 * rank; a received unit's share = chunk 0's remote pass + chunk 1's.
 *
 * Accuracy: CPU: the shares are fp32 (fp64 accumulation inside a pass),
 * each output rounded once to the dtype: within about one rounding of the
 * dtype of the single-process CPU backward plus fp32 noise
 * (tests/cpu/test_cp_backward.c states the rule). CUDA: each pass's share
 * comes out of the CUDA attention backward in the dtype (rounded once),
 * the shares are added in fp32 in the order above and the sum rounded
 * once: |got - exact| <= u (|g| + sum of |share|) plus the kernels' own
 * error, u the dtype's unit roundoff (tests/gpu/test_cp_bwd_gpu.c).
 *
 * Backends: CPU with the simulated communicator; CUDA (any CUDA backend,
 * as sk_attention_backward: F16 / BF16, head_dim 64 or 128, blocks 64 or
 * 128) with sk_comm_create_nccl or sk_comm_create_simulated_cuda, pointers
 * 16-byte aligned, the workspace 256-byte aligned; run
 * sk_cp_backward_prepare once per plan and workspace. An unsupported
 * problem is SK_STATUS_NOT_SUPPORTED already in the workspace size. The
 * CUDA run enqueues on `stream` and the communicator's side stream, never
 * allocates or synchronises the host (graph safe with NCCL).
 *
 * Failures: every check runs before the exchange, and nothing is written
 * on failure; a rank that fails later (a pass's host allocation on the
 * CPU, a launch error on CUDA) stops sending, so its peers wait for it as
 * in sk_cp_forward. Make the same call on every rank.
 */

/* Workspace bytes of desc->rank's backward with the forward's plan. */
SK_API sk_status sk_cp_backward_workspace_size(const sk_cp_desc *desc, const void *plan,
                                               size_t plan_bytes, size_t *workspace_bytes);

/* Prepare a workspace for sk_cp_backward with this plan (as sk_cp_prepare
 * for the forward: CUDA uploads the plan into the workspace and plans the
 * passes' backward there, enqueued on `stream`). A no-op after the checks
 * on the CPU backend. */
SK_API sk_status sk_cp_backward_prepare(const sk_cp_desc *desc, const void *plan,
                                        size_t plan_bytes, void *workspace,
                                        size_t workspace_size, struct CUstream_st *stream);

/* desc->rank's backward (above) through `comm` (desc's rank and size).
 * Aliasing: dq, dk, dv and the workspace share no byte with each other or
 * with any input; inputs may overlap. */
SK_API sk_status sk_cp_backward(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                                sk_comm_t comm, const void *q, const void *k, const void *v,
                                const void *o, const float *lse, const void *dout, void *dq,
                                void *dk, void *dv, void *workspace, size_t workspace_size,
                                struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * FP8 quantization (the E4M3 attention's inputs)
 * ---------------------------------------------------------------------------
 * x [B, S, H, D] in F16 or BF16 (element strides over [B, S, H], D
 * contiguous; all zero = packed) becomes y [B, S, H, D] e4m3 codes, packed,
 * and descale [B, H] fp32 contiguous, one factor per (batch, head), ready
 * for sk_attention_desc's q/k/v_descale:
 *   amax[b, h]    = max |x[b, :, h, :]| over the non-NaN elements (fp32)
 *   descale[b, h] = amax / 448 when 0 < amax < inf, else 1   (fp32 division)
 *   y[b, s, h, d] = e4m3(x[b, s, h, d] * (448 / amax))         (or x * 1)
 * where 448 / amax is one fp32 division and e4m3() rounds to nearest even
 * and saturates to +-448 (NaN stays NaN: 0x7F, sign kept). The CPU and CUDA
 * backends give the same bytes. CUDA: two kernels (the amax reduction into
 * the workspace, then scale and convert), no atomics on floats: the result
 * does not depend on the schedule. */
typedef struct sk_quantize_desc {
    size_t struct_size;  /* sizeof(sk_quantize_desc); set by sk_quantize_desc_init */
    sk_backend backend;  /* default SK_BACKEND_CUDA (any CUDA backend runs the same kernels) */
    sk_dtype dtype;      /* x: F16 or BF16. Default BF16 */
    int64_t batch;       /* B >= 1 */
    int64_t seq;         /* S >= 1 */
    int64_t heads;       /* H >= 1, B x H < 2^31 */
    int64_t head_dim;    /* D >= 1; CUDA: a multiple of 8 */
    int64_t x_strides[3]; /* element strides of x over [B, S, H]; >= 0; zeros: packed.
                             CUDA: x 16-byte aligned, strides multiples of 8 elements */
    /* y's layout (appended: a descriptor initialised with the size up to
     * x_strides keeps working as SK_QUANT_LAYOUT_ROWS). */
    int32_t layout;       /* sk_quant_layout; 0 (default) = SK_QUANT_LAYOUT_ROWS */
} sk_quantize_desc;

/* sk_quantize_desc's layout: where code y(b, s, h, d) (the value above)
 * is stored.
 *   SK_QUANT_LAYOUT_ROWS:   y[((b * S + s) * H + h) * D + d]   ([B, S, H, D])
 *   SK_QUANT_LAYOUT_VT_FP8: y[((b * H + h) * D + d) * S_pad + col(s)]
 *     ([B, H, D, S_pad], V^T for the Hopper FP8 attention kernel, which
 *     takes it with sk_attention_desc's v_layout = SK_V_LAYOUT_VT_FP8),
 *     S_pad = S rounded up to a multiple of 128, and inside each 32-key
 *     chunk the keys permuted into the order the kernel's P registers
 *     hold them: with k = s % 32 = 16 k4 + 8 k3 + 2 k12 + k0 (k4, k3, k0
 *     bits, k12 in 0..3),
 *       col(s) = (s - k) + 16 k4 + 4 k12 + 2 k3 + k0
 *     (equivalently, column 32 c + 16 h + 4 t + i holds key 32 c + 16 h +
 *     2 t + i for i < 2, 32 c + 16 h + 8 + 2 t + i - 2 for i >= 2). Columns
 *     of keys s >= S hold 0. */
typedef enum sk_quant_layout {
    SK_QUANT_LAYOUT_ROWS = 0,
    SK_QUANT_LAYOUT_VT_FP8 = 1
} sk_quant_layout;

/* Elements (bytes) of y in SK_QUANT_LAYOUT_VT_FP8: batch x heads x head_dim
 * x (seq rounded up to 128), into *elems; BAD_PARAM_SHAPE for a size < 1,
 * BAD_PARAM_OVERFLOW past int64. */
SK_API sk_status sk_quantize_vt_elems(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                      int64_t *elems);

SK_API sk_status sk_quantize_desc_init(sk_quantize_desc *desc, size_t struct_size);

/* Device workspace bytes of sk_quantize_e4m3 (0 on the CPU). */
SK_API sk_status sk_quantize_e4m3_workspace_size(const sk_quantize_desc *desc,
                                                 size_t *workspace_bytes);

/* Enqueue the quantization (CUDA: graph safe, nothing allocated, no
 * synchronisation; CPU: synchronous).
 *   x        [B, S, H, D]  desc->dtype, desc->x_strides; read
 *   y        [B, S, H, D]  e4m3 codes (uint8), packed; written
 *            (SK_QUANT_LAYOUT_VT_FP8: [B, H, D, S_pad], sk_quantize_vt_elems
 *            bytes, every one written; CUDA: y 16-byte aligned)
 *   descale  [B, H]        fp32 contiguous; written
 * The workspace (CUDA: 16-byte aligned, at least the size above) must not
 * overlap any argument; y and descale must not overlap x or each other. */
SK_API sk_status sk_quantize_e4m3(const sk_quantize_desc *desc, const void *x, uint8_t *y,
                                  float *descale, void *workspace, size_t workspace_size,
                                  struct CUstream_st *stream);

/* ---------------------------------------------------------------------------
 * Varlen attention backward
 * ---------------------------------------------------------------------------
 * The gradients of the varlen forward ("Varlen batches") for packed
 * batches: each sequence b is the fixed-batch backward ("Attention
 * backward") with B = 1, Sq = len_q(b), Sk = len_k(b) on its own tokens,
 * with the same formulas, rules and precision: causal bottom-right per
 * sequence, GQA / MQA gradients summed over each KV head's query heads,
 * empty rows (an empty layout row, a sequence with no key, causal rows
 * before len_q(b) - len_k(b)) get dQ = 0 and add nothing, keys no
 * admissible pair reaches (a sequence with no query included) get dK = dV
 * = 0, and deterministic results (bitwise the same on every run, whatever
 * the thread count).
 * The calls take the varlen forward's descriptor and layout unchanged (the
 * one BSR over all sequences' query blocks, sequence b's rows from
 * row_start(b) on) and the same length arrays, plus a descriptor for what
 * only the backward has:
 *   q, k, v, o  as the varlen forward (desc's dtype and strides); read
 *   lse         [Hq, total_q]   fp32 contiguous, as the varlen forward
 *                               wrote it; read; required
 *   dout        [total_q, Hq, D]   dO, bwd->dout_strides; read
 *   dq          [total_q, Hq, D]   bwd->dq_strides; written (every row)
 *   dk, dv      [total_k, Hkv, D]  bwd->dk_strides, bwd->dv_strides;
 *                                  written (every row)
 * Checks: the varlen forward's (descriptor, shapes, layout geometry, the
 * length arrays, tensors, strides, alignment; on the CPU backend the
 * lengths and the layout against them), the backward descriptor's (as the
 * fixed backward's), then aliasing: dq, dk and dv may share no byte with
 * any other buffer of the call (q, k, v, o, lse, dout, the layout arrays,
 * cu_seqlens_q, cu_seqlens_k, each other); inputs may overlap each other.
 * A failed call writes nothing.
 * Backends: the CPU reference (workspace 0; the plan is the checks). The
 * CUDA backends make every check above (so a bad argument gets the same
 * status on every backend; the length arrays and the layout are device
 * memory, never read on the host), then run the portable backward in a
 * varlen mode (compute capability 8.0 or later; SK_BACKEND_CUDA_SM90, as
 * for the fixed backward, asks for 9.0): fp16 / bf16, head_dim 64 or 128,
 * blocks 64 or 128 (else SK_STATUS_NOT_SUPPORTED naming the argument,
 * from all three calls, touching nothing). The plan builds on the device
 * (no host sync: graph safe) what the run reads, from capacities only;
 * re-plan when the lengths or the layout change. Deterministic as the
 * fixed backward. Length arrays that break the contract give wrong
 * gradients, never an access outside the tensors (lengths clamped to the
 * totals and max_seqlen_*, rows past the layout's skipped). Design:
 * docs/perf/varlen_paged.md, "Varlen backward".
 */

typedef struct sk_attention_varlen_backward_desc {
    size_t struct_size;      /* sizeof(sk_attention_varlen_backward_desc); set by its init */
    int32_t deterministic;   /* 1 (default) or 0, as sk_attention_backward_desc (0 runs the
                                deterministic path here too: no fused varlen pass) */
    int64_t dout_strides[2]; /* dO [total_q, Hq, D] over [token, head]; 0 0 (default) = packed */
    int64_t dq_strides[2];   /* dQ [total_q, Hq, D]; 0 0 = packed */
    int64_t dk_strides[2];   /* dK [total_k, Hkv, D]; 0 0 = packed */
    int64_t dv_strides[2];   /* dV [total_k, Hkv, D]; 0 0 = packed */
} sk_attention_varlen_backward_desc;

/* Fill *bwd with the defaults above. */
SK_API sk_status sk_attention_varlen_backward_desc_init(sk_attention_varlen_backward_desc *bwd,
                                                        size_t struct_size);

/* Bytes of device workspace (no array is read): 0 for the CPU backend. */
SK_API sk_status sk_attention_varlen_backward_workspace_size(
    const sk_attention_varlen_desc *desc, const sk_attention_varlen_backward_desc *bwd,
    const sk_bsr *layout, size_t *workspace_bytes);

/* The planning of a run (graph safe; re-plan when the lengths or the
 * layout change). On the CPU: the checks, nothing else. */
SK_API sk_status sk_attention_varlen_backward_plan(const sk_attention_varlen_desc *desc,
                                                   const sk_attention_varlen_backward_desc *bwd,
                                                   const sk_bsr *layout,
                                                   const int32_t *cu_seqlens_q,
                                                   const int32_t *cu_seqlens_k, void *workspace,
                                                   size_t workspace_size,
                                                   struct CUstream_st *stream);

/* Enqueue the varlen backward, using the plan in `workspace` (tensors as
 * listed above). CPU: synchronous; host scratch may be allocated
 * (SK_STATUS_ALLOC_FAILED, nothing written, when that fails). */
SK_API sk_status sk_attention_varlen_backward_run(
    const sk_attention_varlen_desc *desc, const sk_attention_varlen_backward_desc *bwd,
    const sk_bsr *layout, const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
    const void *q, const void *k, const void *v, const void *o, const void *dout,
    const float *lse, void *dq, void *dk, void *dv, void *workspace, size_t workspace_size,
    struct CUstream_st *stream);

/* sk_attention_varlen_backward_plan followed by _run, same arguments. */
SK_API sk_status sk_attention_varlen_backward(
    const sk_attention_varlen_desc *desc, const sk_attention_varlen_backward_desc *bwd,
    const sk_bsr *layout, const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
    const void *q, const void *k, const void *v, const void *o, const void *dout,
    const float *lse, void *dq, void *dk, void *dv, void *workspace, size_t workspace_size,
    struct CUstream_st *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPARSEK_H */
