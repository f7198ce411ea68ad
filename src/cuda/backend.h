/*
 * backend.h - the C interface between the core and the CUDA backend.
 *
 * Implemented by the .cu files of src/cuda/ (common/device_info.cu,
 * attention/fwd.cu, attention/bwd.cu, attention/varlen.cu, gemm/gemm.cu,
 * topk/chain.cu, cp/cp.cu) when the library is built with nvcc, and by
 * src/core/no_cuda.c (every call: SK_STATUS_NOT_SUPPORTED_BACKEND) when it
 * is not. Problems arrive validated
 * (src/core/problem.h); these functions check only what needs the device:
 * that one is present, its compute capability, the kernel's supported
 * combinations, the workspace size. Errors are recorded with sk_error (the
 * entry point's name is already set). Nothing here allocates or
 * synchronises except the sk_cuda_device_* calls.
 */
#ifndef SK_CUDA_BACKEND_H
#define SK_CUDA_BACKEND_H

#include <stddef.h>

#include "core/decode_select.h"
#include "core/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

sk_status sk_cuda_device_count(int32_t *count);
sk_status sk_cuda_device_get_info(int32_t device, sk_device_info *info);
/* "CUDA 13.0, sm_80 sm_90a" or similar; static text. */
const char *sk_cuda_build_info(void);

sk_status sk_cuda_attention_workspace_size(const sk_attention_problem *p, size_t *bytes);
sk_status sk_cuda_attention_plan(const sk_attention_problem *p, void *workspace,
                                 size_t workspace_size, struct CUstream_st *stream);
sk_status sk_cuda_attention_run(const sk_attention_problem *p, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream);
/* Whether the kernel the run would choose takes a carried-in partial
 * result (p->lse_carry: the Hopper fixed kernel); needs the device. */
sk_status sk_cuda_attention_carry_supported(const sk_attention_problem *p, int *supported);

/* The attention backward (attention/bwd.cu). The problem arrives with
 * every argument checked, aliasing and workspace placement included; the
 * plan builds on the GPU what the kernels need (the transposed layout, the
 * tile orders: docs/perf/backward_sm80.md), the run launches them. A
 * problem the kernels do not cover is SK_STATUS_NOT_SUPPORTED from all
 * three, touching nothing. */
sk_status sk_cuda_attention_backward_workspace_size(const sk_attention_backward_problem *p,
                                                    size_t *bytes);
sk_status sk_cuda_attention_backward_plan(const sk_attention_backward_problem *p, void *workspace,
                                          size_t workspace_size, struct CUstream_st *stream);
sk_status sk_cuda_attention_backward_run(const sk_attention_backward_problem *p, void *workspace,
                                         size_t workspace_size, struct CUstream_st *stream);

/* The varlen attention forward (attention/varlen.cu). The problem arrives
 * with every argument checked (aliasing and workspace placement included);
 * the length arrays and the layout are device memory, unread on the host.
 * The plan (attention/varlen_plan.h) and the portable kernel; on
 * SK_BACKEND_CUDA_SM90 all three return SK_STATUS_NOT_SUPPORTED, touching
 * nothing, until the Hopper varlen kernel exists. */
sk_status sk_cuda_attention_varlen_workspace_size(const sk_attention_varlen_problem *p,
                                                  size_t *bytes);
sk_status sk_cuda_attention_varlen_plan(const sk_attention_varlen_problem *p, void *workspace,
                                        size_t workspace_size, struct CUstream_st *stream);
sk_status sk_cuda_attention_varlen_run(const sk_attention_varlen_problem *p, void *workspace,
                                       size_t workspace_size, struct CUstream_st *stream);
/* The paged forward (attention/varlen.cu), the same way: the lengths, the
 * page table and the layout are device memory. */
sk_status sk_cuda_attention_paged_workspace_size(const sk_attention_paged_problem *p,
                                                 size_t *bytes);
sk_status sk_cuda_attention_paged_plan(const sk_attention_paged_problem *p, void *workspace,
                                       size_t workspace_size, struct CUstream_st *stream);
sk_status sk_cuda_attention_paged_run(const sk_attention_paged_problem *p, void *workspace,
                                      size_t workspace_size, struct CUstream_st *stream);

sk_status sk_cuda_bsr_gemm_workspace_size(const sk_bsr_gemm_problem *p, size_t *bytes);
sk_status sk_cuda_bsr_gemm_plan(const sk_bsr_gemm_problem *p, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream);
sk_status sk_cuda_bsr_gemm_run(const sk_bsr_gemm_problem *p, void *workspace,
                               size_t workspace_size, struct CUstream_st *stream);

/* Top-k selection (topk/chain.cu, which also lays out the workspace).
 * with_scores != 0: the size for sk_select_topk (scores + selection);
 * 0: for sk_layout_from_scores (selection only). */
sk_status sk_cuda_topk_workspace_size(const sk_topk_problem *p, int with_scores, size_t *bytes);
/* p->q, p->k_in -> p->pooled_q_out, p->pooled_k_out. */
sk_status sk_cuda_topk_pool(const sk_topk_problem *p, struct CUstream_st *stream);
/* From p->pooled_q / p->pooled_k (scored into the workspace) or, when those
 * are NULL, from p->scores: writes p->row_offsets and p->col_indices. */
sk_status sk_cuda_topk_select(const sk_topk_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream);
/* sk_pool_select_topk: p->q, p->k_in -> p->row_offsets, p->col_indices,
 * everything in between (pooled Q and K, or their split operands) in the
 * workspace, whose size sk_cuda_topk_pool_select_workspace_size gives. */
sk_status sk_cuda_topk_pool_select_workspace_size(const sk_topk_problem *p, size_t *bytes);
sk_status sk_cuda_topk_pool_select(const sk_topk_problem *p, void *workspace,
                                   size_t workspace_size, struct CUstream_st *stream);
/* The top-k selection on varlen / paged inputs (topk/select_varlen.cu): the
 * problem arrives checked; the length arrays and the page table are device
 * memory, never read on the host. Workspace from capacities only. */
sk_status sk_cuda_topk_varlen_workspace_size(const sk_topk_varlen_problem *p, size_t *bytes);
sk_status sk_cuda_topk_varlen_select(const sk_topk_varlen_problem *p, void *workspace,
                                     size_t workspace_size, struct CUstream_st *stream);

/* The decode attention (decode/decode.cu): the split-KV kernel and its
 * merge. The problem arrives with every argument checked (aliasing and
 * workspace placement included); the lengths, page table and layout are
 * device memory, unread on the host. The split count is
 * sk_decode_split_count's (src/core/decode.h); a problem the kernels do not
 * cover is SK_STATUS_NOT_SUPPORTED from every call, touching nothing. */
sk_status sk_cuda_decode_splits(const sk_decode_problem *p, int32_t *num_splits);
sk_status sk_cuda_decode_workspace_size(const sk_decode_problem *p, size_t *bytes);
sk_status sk_cuda_decode_plan(const sk_decode_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream);
sk_status sk_cuda_decode_run(const sk_decode_problem *p, void *workspace, size_t workspace_size,
                             struct CUstream_st *stream);

/* Decode page selection (decode_select/). The problem arrives checked
 * (src/core/decode_select.c); lengths and page tables are device memory,
 * clamped and skipped by the kernels. append != 0: sk_kv_summary_append. */
sk_status sk_cuda_dsel_summary(const sk_dsel_problem *p, int append, struct CUstream_st *stream);
sk_status sk_cuda_dsel_workspace_size(const sk_dsel_problem *p, size_t *bytes);
sk_status sk_cuda_dsel_select(const sk_dsel_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream);

/* FP8 quantization (quantize/quantize.cu): the problem arrives checked
 * (aliasing included; the workspace against the other buffers when not
 * NULL); these check the device and the workspace size, then enqueue the
 * two kernels. */
sk_status sk_cuda_quantize_e4m3_workspace_size(const sk_quantize_problem *p, size_t *bytes);
sk_status sk_cuda_quantize_e4m3(const sk_quantize_problem *p, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream);

/* Context parallel (cp/cp.cu): what a rank's CUDA run (src/core/
 * cp_run_cuda.c) enqueues besides the attention passes, and the side
 * stream a device communicator owns. Problems arrive checked. */
/* A non-blocking side stream and two events (fork, join) on the current
 * device, for the overlap of the exchange with the local passes. */
sk_status sk_cuda_cp_streams_create(void **out);
void sk_cuda_cp_streams_destroy(void *streams);
/* Fork: *side waits for what `stream` has enqueued so far. Join: `stream`
 * waits for what the side stream has enqueued so far. Graph safe. */
sk_status sk_cuda_cp_fork(void *streams, struct CUstream_st *stream, struct CUstream_st **side);
sk_status sk_cuda_cp_join(void *streams, struct CUstream_st *stream);
/* cudaMemcpyAsync of any direction (cudaMemcpyDefault) on the stream. */
sk_status sk_cuda_copy_async(void *dst, const void *src, size_t bytes, struct CUstream_st *stream);
/* cudaStreamSynchronize (the simulated device transport only). */
sk_status sk_cuda_stream_sync(struct CUstream_st *stream);

/* Gather (pack) or scatter (unpack) of exchange units (core/cp_plan.h):
 * unit i is K rows then V rows of one (block, batch, head), `block`
 * tokens each (the last units, from `full` on, are of the tail block:
 * `tail` tokens), packed back to back in `packed`. The strided side is
 * k, v [B, seq, Hkv, D]: a unit's first token there is, packing, its
 * block's place in the rank's shard (chunks below), unpacking, slot x
 * block of the remote buffer. */
typedef struct sk_cp_copy_problem {
    const void *units; /* device sk_cp_unit[count] */
    int64_t count, full;
    int32_t block, tail, row_bytes, unpack;
    void *packed;
    void *k, *v;
    int64_t seq, heads_kv;
    int32_t chunks;
    int32_t chunk_block[2], chunk_blocks[2]; /* the shard's chunks: first global block, blocks */
    int64_t chunk_token[2];                  /* and first shard token */
} sk_cp_copy_problem;
sk_status sk_cuda_cp_copy_units(const sk_cp_copy_problem *p, struct CUstream_st *stream);

/* The LSE merge of two partial attentions into o (F16 or BF16), in place:
 * o's rows o_start .. o_start + tokens - 1 of [B, o_seq, H, D] hold part a
 * on entry (lse_a [B, H, tokens]); part b is o_b [B, tokens, H, D] and
 * lse_b (NULL: part a alone, o unchanged). lse [B, H, o_seq] at the same
 * rows, may be NULL. fp32 math: m = max, w = exp(lse - m); both -inf
 * gives O = 0, LSE = -inf. */
typedef struct sk_cp_merge_problem {
    sk_dtype dtype;
    int64_t batch, tokens, heads, dim, o_seq, o_start;
    void *o;
    const float *lse_a;
    const void *o_b;
    const float *lse_b;
    float *lse;
} sk_cp_merge_problem;
sk_status sk_cuda_cp_merge(const sk_cp_merge_problem *p, struct CUstream_st *stream);

/* Context-parallel backward (cp/cp_bwd.cu), for src/core/cp_backward_cuda.c.
 * Problems arrive checked; every element count is a multiple of 8 (D is). */
/* Copy `rows` runs of `tokens` fp32 values: src's run i starts at
 * i x src_seq + src_start, dst's at i x dst_seq + dst_start (a chunk's
 * LSE rows packed [B, Hq, S_c] for the attention backward). */
typedef struct sk_cp_rows_problem {
    int64_t rows, tokens, src_seq, src_start, dst_seq, dst_start;
    const float *src;
    float *dst;
} sk_cp_rows_problem;
sk_status sk_cuda_cp_rows(const sk_cp_rows_problem *p, struct CUstream_st *stream);
/* Element-wise over n elements, in this order: x = src32[i] when src32 is
 * not NULL, else x = a[i] widened (dtype); then x += b[i] widened when b
 * is not NULL; then out[i] = x rounded to the dtype when out is not NULL,
 * else dst32[i] = x. */
typedef struct sk_cp_sum_problem {
    sk_dtype dtype;
    int64_t n;
    const float *src32;
    const void *a, *b;
    void *out;
    float *dst32;
} sk_cp_sum_problem;
sk_status sk_cuda_cp_sum(const sk_cp_sum_problem *p, struct CUstream_st *stream);
/* The backward's gradient units (laid out as sk_cp_copy_problem's, fp32:
 * dK rows then dV rows of each unit, `dim` floats a row). Pack (add = 0):
 * from the receiver's remote-pass partials dk[c], dv[c] [B, seq, Hkv, D]
 * in the dtype at the unit's slot, x = dk[0] + dk[1] in fp32 (dk[1] NULL:
 * one chunk's). Add (add = 1): each packed row added to acc_k, acc_v [B,
 * seq, Hkv, D] fp32 at the unit's block's rows of the owner's shard
 * (chunks as sk_cp_copy_problem). The units of one call are distinct. */
typedef struct sk_cp_grad_problem {
    const void *units; /* device sk_cp_unit[count] */
    int64_t count, full;
    int32_t block, tail, dim, add;
    sk_dtype dtype;
    float *packed;
    const void *dk[2], *dv[2];
    float *acc_k, *acc_v;
    int64_t seq, heads_kv;
    int32_t chunks;
    int32_t chunk_block[2];
    int64_t chunk_token[2];
} sk_cp_grad_problem;
sk_status sk_cuda_cp_grad_units(const sk_cp_grad_problem *p, struct CUstream_st *stream);
/* cudaMemsetAsync(ptr, 0, bytes) on the stream. */
sk_status sk_cuda_cp_zero(void *ptr, size_t bytes, struct CUstream_st *stream);

/* The varlen attention backward (attention/bwd_varlen.cu; issue 30). The
 * problem arrives with every argument checked (aliasing and workspace
 * placement included); the length arrays and the layout are device memory,
 * unread on the host. The plan is the varlen forward's (with the key
 * column table) plus the transposed layout and the dK/dV order, on the
 * GPU; the run is the portable backward in varlen mode on every CUDA
 * backend (SK_BACKEND_CUDA_SM90: on compute capability 9.0). A problem the
 * kernels do not cover is SK_STATUS_NOT_SUPPORTED from all three. */
sk_status sk_cuda_attention_varlen_backward_workspace_size(
    const sk_attention_varlen_backward_problem *p, size_t *bytes);
sk_status sk_cuda_attention_varlen_backward_plan(const sk_attention_varlen_backward_problem *p,
                                                 void *workspace, size_t workspace_size,
                                                 struct CUstream_st *stream);
sk_status sk_cuda_attention_varlen_backward_run(const sk_attention_varlen_backward_problem *p,
                                                void *workspace, size_t workspace_size,
                                                struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif /* SK_CUDA_BACKEND_H */
