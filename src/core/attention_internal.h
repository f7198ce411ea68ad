/*
 * attention_internal.h - the attention entry points' steps, for other
 * entry points that run an attention inside them (sk_attention_topk). None
 * calls SK_ENTER, so messages keep the caller's name. Order of use:
 * check_geometry, check_tensors, the aliasing check of its buffers (and the
 * workspace), (produce the layout), check_layout_content, enqueue. The
 * backward (attention_backward.c) runs the same checks on its forward part.
 */
#ifndef SK_CORE_ATTENTION_INTERNAL_H
#define SK_CORE_ATTENTION_INTERNAL_H

#include <stddef.h>

#include "core/check.h"
#include "core/problem.h"

/* Context parallel's remote pass (cp_run_cuda.c): whether the run would
 * take a carried-in partial result (the CUDA Hopper fixed kernel; needs
 * the device), and sk_attention_run with one: o holds on entry the
 * partial O over other keys, lse_carry [B, Hq, Sq] its LSE (not o's, not
 * lse's memory); O is updated in place and lse (may be NULL) gets the
 * merged LSE. NOT_SUPPORTED where the portable kernel would run. */
sk_status sk_attention_carry_supported(const sk_attention_desc *desc, const sk_bsr *layout,
                                      int *supported);
sk_status sk_attention_run_carry(const sk_attention_desc *desc, const sk_bsr *layout,
                                 const void *q, const void *k, const void *v, void *o, float *lse,
                                 const float *lse_carry, void *workspace, size_t workspace_size,
                                 struct CUstream_st *stream);

/* A part of a run on the Hopper kernel (context parallel's first local
 * pass): the tiles of the plan's order tile_first .. + tile_count - 1 (the
 * plan's order has batch x heads_q x row_blocks tiles), on a persistent
 * grid leaving reserve_sms SMs free. Its parts together are the run. */
typedef struct sk_attention_part {
    int64_t tile_first, tile_count;
    int32_t reserve_sms;
} sk_attention_part;
sk_status sk_attention_run_part(const sk_attention_desc *desc, const sk_bsr *layout,
                                const void *q, const void *k, const void *v, void *o, float *lse,
                                const sk_attention_part *part, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream);

/* desc->struct_size (desc not NULL): sizeof(sk_attention_desc), or the
 * size before the FP8 fields (out_dtype and on) or before v_layout, which
 * older callers pass;
 * messages name the descriptor `what` ("desc", "attn"). */
sk_status sk_attention_check_struct_size(const sk_attention_desc *desc, const char *what);

/* The two fields both backward descriptors start with (fixed and varlen):
 * bwd->struct_size against `size` (the descriptor `init` fills), and
 * bwd->deterministic 1 or 0. bwd must not be NULL (checked before). */
sk_status sk_backward_check_header(size_t struct_size, int32_t deterministic, size_t size,
                                   const char *init);

/* Descriptor, shapes, strides and layout geometry (not its content). */
sk_status sk_attention_check_geometry(const sk_attention_desc *desc, const sk_bsr *layout,
                                      sk_attention_problem *p);

/* The steps of sk_attention_check_geometry that the varlen call
 * (attention_varlen.c) shares, messages included ("desc->scale ..."). */
sk_status sk_attention_check_scale_mask(float scale, sk_mask mask);
/* memset *p, then the sizes {batch, seq_q, seq_k, heads_q, heads_kv,
 * head_dim} (checked), group, the resolved scale, causal, and LSE's head
 * stride (seq_q). */
void sk_attention_problem_init(sk_attention_problem *p, sk_backend backend, sk_dtype dtype,
                               const int64_t sizes[6], float scale, sk_mask mask);
/* A layout whose grid passed sk_grid_check (row_blocks, col_blocks): its
 * heads against p's, nnz and the arrays (present, 4-byte aligned), then
 * the layout fields of *p (slice mapping, slice_rows = row_blocks). */
sk_status sk_attention_layout_slices(const sk_bsr *layout, int32_t row_blocks, int32_t col_blocks,
                                     sk_attention_problem *p);
/* The byte counts of Q/O, K/V and LSE fit int64; messages name the
 * leading dimensions as given ("batch x seq_q", ...). */
sk_status sk_attention_check_sizes(const sk_attention_problem *p, const char *q_dims,
                                   const char *kv_dims, const char *lse_dims);

/* The buffers of an attention call, in the order of its aliasing check:
 * the outputs, then the inputs, then the layout arrays (inputs here; the
 * caller marks them written where it writes them, as sk_attention_topk). */
enum {
    SK_ATTN_O,
    SK_ATTN_LSE,
    SK_ATTN_Q,
    SK_ATTN_K,
    SK_ATTN_V,
    SK_ATTN_ROW_OFFSETS,
    SK_ATTN_COL_INDICES,
    SK_ATTN_BUFFERS
};

/* Tensor pointers, extents, alignment; stores the pointers in *p and every
 * buffer's byte span in buffers[] (the aliasing check is the caller's). */
sk_status sk_attention_check_tensors(sk_attention_problem *p, const void *q, const void *k,
                                     const void *v, void *o, float *lse,
                                     sk_buffer buffers[SK_ATTN_BUFFERS]);

/* The packed calls (attention_varlen.c, attention_paged.c). */
/* A token count of a descriptor ("desc->name"): in [1, INT32_MAX], as the
 * int32 length arrays need (SHAPE below, OVERFLOW above). */
sk_status sk_varlen_check_count(int64_t value, const char *name);
/* [token, head] strides of a [total, heads, D] tensor (both 0: packed) as
 * a flat problem's three (the batch axis has one element: never stepped). */
void sk_varlen_resolve_strides(const int64_t in[2], int64_t heads, int64_t dim, int64_t out[3]);
/* The packed queries of a varlen or paged call: *p from the flat sizes
 * {1, total_q, keys, heads_q, heads_kv, head_dim} (checked), the layout's
 * geometry (grid batch 1, its slices), the byte sizes (kv_dims names the
 * keys' leading dimensions in messages) and Q's and O's strides; K's and
 * V's strides are the caller's. */
sk_status sk_varlen_check_queries(sk_attention_problem *p, sk_backend backend, sk_dtype dtype,
                                  const int64_t flat[6], float scale, sk_mask mask,
                                  const sk_bsr *layout, const char *kv_dims,
                                  const int64_t q_strides[2], const int64_t o_strides[2]);

/* One [n0, n1, heads, head_dim] tensor of p's dtype with outer element
 * strides `stride` (resolved): extent, no self-overlap when written, and
 * the alignment of the forward's tensors (CUDA: 16-byte pointer and
 * strides; CPU: the element); its byte span into *out for the aliasing
 * check. Messages name it `what`. */
sk_status sk_attention_check_tensor(const sk_attention_problem *p, const void *ptr, int64_t n0,
                                    int64_t n1, int64_t heads, const int64_t stride[3], int written,
                                    const char *what, sk_buffer *out);

/* CUDA: a head_dim row is a multiple of 16 bytes (the kernels move 16-byte
 * vectors of one row); nothing on the CPU. */
sk_status sk_attention_check_row_bytes(const sk_attention_problem *p);

/* The layout arrays of a checked problem as two read buffers (slices x
 * row_blocks + 1 offsets, nnz indices), named "layout->row_offsets" and
 * "layout->col_indices". */
void sk_attention_layout_buffers(const sk_attention_problem *p, sk_buffer out[2]);

/* The CUDA workspace (sk_check_workspace_apart) against buffers[]; nothing
 * on the CPU or for a NULL workspace. */
sk_status sk_attention_check_workspace_apart(const sk_attention_problem *p, const void *workspace,
                                             size_t workspace_size, const sk_buffer *buffers,
                                             int count);

/* The full layout check for the CPU backend; nothing for device layouts. */
sk_status sk_attention_check_layout_content(const sk_attention_problem *p,
                                            const sk_bsr *layout);

/* Workspace bytes of plan + run for a checked problem. */
sk_status sk_attention_problem_workspace_size(const sk_attention_problem *p,
                                              size_t *workspace_bytes);

/* Plan, then run, a fully checked problem. */
sk_status sk_attention_enqueue(const sk_attention_problem *p, void *workspace,
                               size_t workspace_size, struct CUstream_st *stream);

/* The paged call's steps the decode call (decode.c) shares, messages
 * included ("desc->page_size ...", "page_table[2][5] ..."). */
/* The page geometry: num_pages, page_size (16/32/64/128), max_pages, the
 * table's row stride, max_seqlen_k <= max_pages x page_size. */
sk_status sk_paged_check_pages(int64_t num_pages, int32_t page_size, int32_t max_pages,
                               int64_t page_table_stride, int64_t max_seqlen_k);
/* The page table's byte span, (batch - 1) x stride + max_pages int32
 * entries (checked), as a read buffer named "page_table". */
sk_status sk_paged_table_buffer(const int32_t *page_table, int64_t batch, int64_t stride,
                                int32_t max_pages, sk_buffer *out);
/* Host arrays: each len_k(b) in [0, v.max_seqlen_k] and every page index
 * the sequence uses in [0, num_pages) (reads pp->v.batch, v.max_seqlen_k,
 * seq_lens_k, page_table, page_table_stride, page_size, num_pages). */
sk_status sk_paged_check_pages_used(const sk_attention_paged_problem *pp);
/* Pointers, extents and alignment of Q, O [v.flat.batch, v.flat.seq_q, Hq,
 * D] (paged: 1 x total_q; decode: B x q_len), the caches and LSE; stores
 * the pointers in pp->v.flat and the spans in buffers[0 ..
 * SK_ATTN_BUFFERS) (the layout arrays included). */
sk_status sk_paged_check_tensors(sk_attention_paged_problem *pp, const void *q,
                                 const void *k_cache, const void *v_cache, void *o, float *lse,
                                 sk_buffer *buffers);

/* The varlen forward's steps the varlen backward (attention_varlen_
 * backward.c) shares, messages included: the descriptor, shapes and layout
 * geometry (fills *vp but its tensors and length arrays); the length
 * arrays' pointers (stored in *vp, their spans into out[2]); on the CPU
 * backend, the lengths' and the layout's content (nothing on CUDA). */
sk_status sk_varlen_check_geometry(const sk_attention_varlen_desc *desc, const sk_bsr *layout,
                                   sk_attention_varlen_problem *vp);
sk_status sk_varlen_check_seqlens_arrays(sk_attention_varlen_problem *vp,
                                         const int32_t *cu_seqlens_q,
                                         const int32_t *cu_seqlens_k, sk_buffer out[2]);
sk_status sk_varlen_check_content(const sk_attention_varlen_problem *vp, const sk_bsr *layout);

#endif /* SK_CORE_ATTENTION_INTERNAL_H */
