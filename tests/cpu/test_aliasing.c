/*
 * test_aliasing.c - the aliasing rule (sparsek.h, "Conventions"), pair by
 * pair, for every entry point that writes a caller buffer.
 *
 * Each entry point is a table row: its buffers in argument order, each with
 * the name the library's messages use, its exact byte span, the alignment
 * the call needs, whether the call writes it, and its valid content. For
 * every pair with a written member, the buffers are placed in one arena:
 *   - overlapping by one element, both ways round (the first starting at
 *     the last element of the second, and the other way): the call must
 *     fail with SK_STATUS_BAD_PARAM_STRIDE, a message "<a> overlaps <b>"
 *     naming both and the entry point, and leave the whole arena (and the
 *     layout struct of a top-k output) byte-identical;
 *   - exactly adjacent, both ways round (CPU backend only): the call must
 *     succeed (no false positive) and leave every input byte-identical.
 * The other buffers sit apart, 64 bytes beyond each other. Outputs are
 * poisoned (0xA5) and inputs written last, so an input overlapped by an
 * output still holds valid content and only the aliasing check can refuse.
 *
 * The CUDA rows (F16, 16-byte alignment, plus the workspace) run only the
 * overlapping placements, with host pointers: the core refuses them before
 * it touches the device, so no GPU is needed and none is used. They need
 * the CUDA workspace sizes, which a build without CUDA (the ASan build)
 * cannot give: there the CUDA rows are reported as not run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { MAXBUF = 12, POISON = 0xA5, GAP = 64 };

typedef struct abuf {
    const char *name; /* as the library's messages name it */
    size_t bytes;     /* the span the call touches */
    size_t align;     /* the alignment the call needs */
    int written;
    const void *init; /* valid content of an input (NULL: an output, poisoned) */
} abuf;

typedef sk_status (*run_fn)(unsigned char *const p[], int variant);

typedef struct acall {
    const char *name; /* the entry point */
    run_fn run;
    int variant;
    int n;
    abuf b[MAXBUF];
} acall;

/* ---------------------------------------------------------------------------
 * The problems. CPU: F32, B 1, Sq 64, Sk 128, Hq 2, Hkv 1, D 4, blocks 64
 * (1 x 2 blocks per slice). CUDA: the same in F16 with D 8.
 * ------------------------------------------------------------------------- */

static struct {
    sk_backend backend;
    size_t es, dim;
    sk_attention_desc attn;
    sk_attention_backward_desc bwd;
    sk_attention_varlen_desc varlen;
    sk_attention_paged_desc paged;
    sk_bsr_gemm_desc gemm;
    sk_topk_desc topk;
    sk_bsr layout; /* the output layout of the top-k calls */
    int32_t capacity;
    size_t ws_bytes; /* the workspace size of the entry point being run */
} ctx;

static float data_f32[8192];
static uint16_t data_f16[8192];
/* Dense layout of one slice, 1 x 2 blocks (attention and the GEMM's A). */
static const int32_t dense_offsets[2] = {0, 2}, dense_indices[2] = {0, 1};
/* Two slices of 1 x 2 blocks, 3 entries (the conversions). */
static const int32_t conv_offsets[3] = {0, 2, 3}, conv_indices[3] = {0, 1, 1};
static const float scores[4] = {0.5f, 0.25f, 0.75f, 0.125f};

static sk_bsr bsr_of(const sk_grid *g, unsigned char *off, unsigned char *idx, int32_t nnz) {
    sk_bsr b;
    memset(&b, 0, sizeof b);
    b.grid = *g;
    b.nnz = nnz;
    b.row_offsets = (int32_t *)(void *)off;
    b.col_indices = (int32_t *)(void *)idx;
    return b;
}

static void ctx_init(sk_backend backend) {
    memset(&ctx, 0, sizeof ctx);
    ctx.backend = backend;
    const int cpu = backend == SK_BACKEND_CPU;
    const sk_dtype dtype = cpu ? SK_DTYPE_F32 : SK_DTYPE_F16;
    ctx.es = cpu ? 4 : 2;
    ctx.dim = cpu ? 4 : 8;
    for (int i = 0; i < 8192; ++i) {
        data_f32[i] = 0.125f * (float)(i % 11) - 0.5f;
        data_f16[i] = tu_f32_to_f16(data_f32[i]);
    }
    sk_attention_desc_init(&ctx.attn, sizeof ctx.attn);
    ctx.attn.backend = backend;
    ctx.attn.dtype = dtype;
    ctx.attn.batch = 1;
    ctx.attn.seq_q = 64;
    ctx.attn.seq_k = 128;
    ctx.attn.heads_q = 2;
    ctx.attn.heads_kv = 1;
    ctx.attn.head_dim = (int64_t)ctx.dim;
    sk_attention_backward_desc_init(&ctx.bwd, sizeof ctx.bwd);
    /* The same tokens as two sequences (see run_attention_varlen). */
    sk_attention_varlen_desc_init(&ctx.varlen, sizeof ctx.varlen);
    ctx.varlen.backend = backend;
    ctx.varlen.dtype = dtype;
    ctx.varlen.batch = 2;
    ctx.varlen.total_q = 64;
    ctx.varlen.total_k = 128;
    ctx.varlen.max_seqlen_q = 34;
    ctx.varlen.max_seqlen_k = 100;
    ctx.varlen.heads_q = 2;
    ctx.varlen.heads_kv = 1;
    ctx.varlen.head_dim = (int64_t)ctx.dim;
    /* The same sequences with K and V in 9 pages of 16 tokens. */
    sk_attention_paged_desc_init(&ctx.paged, sizeof ctx.paged);
    ctx.paged.backend = backend;
    ctx.paged.dtype = dtype;
    ctx.paged.batch = 2;
    ctx.paged.total_q = 64;
    ctx.paged.max_seqlen_q = 34;
    ctx.paged.max_seqlen_k = 100;
    ctx.paged.heads_q = 2;
    ctx.paged.heads_kv = 1;
    ctx.paged.head_dim = (int64_t)ctx.dim;
    ctx.paged.num_pages = 9;
    ctx.paged.page_size = 16;
    ctx.paged.max_pages = 7;
    sk_bsr_gemm_desc_init(&ctx.gemm, sizeof ctx.gemm);
    ctx.gemm.backend = backend;
    ctx.gemm.ab_dtype = dtype;
    ctx.gemm.c_dtype = SK_DTYPE_F32;
    ctx.gemm.m = 64;
    ctx.gemm.n = 8;
    ctx.gemm.k = 128;
    sk_topk_desc_init(&ctx.topk, sizeof ctx.topk);
    ctx.topk.backend = backend;
    ctx.topk.dtype = dtype;
    ctx.topk.batch = 1;
    ctx.topk.seq_q = 64;
    ctx.topk.seq_k = 128;
    ctx.topk.heads_q = 2;
    ctx.topk.heads_kv = 1;
    ctx.topk.head_dim = (int64_t)ctx.dim;
    ctx.topk.block_q = ctx.topk.block_k = 64;
    ctx.topk.k = 1;
    ctx.capacity = -1;
    sk_topk_layout_capacity(&ctx.topk, NULL, &ctx.capacity);
}

static const void *tensor_data(void) {
    return ctx.es == 4 ? (const void *)data_f32 : (const void *)data_f16;
}

/* ---------------------------------------------------------------------------
 * One run function per entry point: the buffers in table order.
 * ------------------------------------------------------------------------- */

/* The workspace where the call has one (ctx.ws_bytes > 0). */
static void *workspace_at(unsigned char *const p[], int i) {
    return ctx.ws_bytes > 0 ? p[i] : NULL;
}

/* Attention and GEMM: `variant` picks run, plan + run, or plan alone. */
enum { VARIANT_RUN, VARIANT_FULL, VARIANT_PLAN };

static sk_status run_attention(unsigned char *const p[], int variant) {
    const sk_grid g = tu_grid(64, 128, 64, 64, 1, 1);
    if (variant == VARIANT_PLAN) {
        const sk_bsr layout = bsr_of(&g, p[1], p[2], 2);
        return sk_attention_plan(&ctx.attn, &layout, p[0], ctx.ws_bytes, NULL);
    }
    const sk_bsr layout = bsr_of(&g, p[5], p[6], 2);
    float *lse = (float *)(void *)p[1];
    if (variant == VARIANT_FULL)
        return sk_attention_forward(&ctx.attn, &layout, p[2], p[3], p[4], p[0], lse,
                                    workspace_at(p, 7), ctx.ws_bytes, NULL);
    return sk_attention_run(&ctx.attn, &layout, p[2], p[3], p[4], p[0], lse, workspace_at(p, 7),
                            ctx.ws_bytes, NULL);
}

/* The backward: dq, dk, dv, q, k, v, o, dout, lse, the layout arrays, the
 * workspace; `variant` as above. */
static sk_status run_attention_backward(unsigned char *const p[], int variant) {
    const sk_grid g = tu_grid(64, 128, 64, 64, 1, 1);
    if (variant == VARIANT_PLAN) {
        const sk_bsr layout = bsr_of(&g, p[1], p[2], 2);
        return sk_attention_backward_plan(&ctx.attn, &ctx.bwd, &layout, p[0], ctx.ws_bytes, NULL);
    }
    const sk_bsr layout = bsr_of(&g, p[9], p[10], 2);
    const float *lse = (const float *)(void *)p[8];
    if (variant == VARIANT_FULL)
        return sk_attention_backward(&ctx.attn, &ctx.bwd, &layout, p[3], p[4], p[5], p[6], p[7],
                                     lse, p[0], p[1], p[2], workspace_at(p, 11), ctx.ws_bytes,
                                     NULL);
    return sk_attention_backward_run(&ctx.attn, &ctx.bwd, &layout, p[3], p[4], p[5], p[6], p[7],
                                     lse, p[0], p[1], p[2], workspace_at(p, 11), ctx.ws_bytes,
                                     NULL);
}

/* The varlen forward: sequences of 30 x 100 and 34 x 28 tokens (the
 * totals of the problem above), one row each (R = 2), the first selecting
 * both its key blocks, the second its one. Buffers: o, lse, q, k, v, the
 * layout arrays, cu_seqlens_q, cu_seqlens_k, the workspace (the plan: the
 * workspace, the layout arrays, the length arrays). */
static const int32_t varlen_offsets[3] = {0, 2, 3}, varlen_indices[3] = {0, 1, 0};
static const int32_t varlen_cu_q[3] = {0, 30, 64}, varlen_cu_k[3] = {0, 100, 128};

static sk_status run_attention_varlen(unsigned char *const p[], int variant) {
    const sk_grid g = tu_grid(128, 100, 64, 64, 1, 1);
    if (variant == VARIANT_PLAN) {
        const sk_bsr layout = bsr_of(&g, p[1], p[2], 3);
        return sk_attention_varlen_plan(&ctx.varlen, &layout, (const int32_t *)(void *)p[3],
                                        (const int32_t *)(void *)p[4], p[0], ctx.ws_bytes, NULL);
    }
    const sk_bsr layout = bsr_of(&g, p[5], p[6], 3);
    const int32_t *cu_q = (const int32_t *)(void *)p[7], *cu_k = (const int32_t *)(void *)p[8];
    float *lse = (float *)(void *)p[1];
    if (variant == VARIANT_FULL)
        return sk_attention_varlen_forward(&ctx.varlen, &layout, cu_q, cu_k, p[2], p[3], p[4], p[0],
                                           lse, workspace_at(p, 9), ctx.ws_bytes, NULL);
    return sk_attention_varlen_run(&ctx.varlen, &layout, cu_q, cu_k, p[2], p[3], p[4], p[0], lse,
                                   workspace_at(p, 9), ctx.ws_bytes, NULL);
}

/* The paged forward: the varlen problem above with K and V in caches of 9
 * pages (sequence 0 in pages 0 .. 6, sequence 1 in 7 and 8). Buffers: o,
 * lse, q, k_cache, v_cache, the layout arrays, cu_seqlens_q, seq_lens_k,
 * page_table, the workspace (the plan: the workspace, the layout arrays,
 * the three arrays). */
static const int32_t paged_lens[2] = {100, 28};
static const int32_t paged_table[14] = {0, 1, 2, 3, 4, 5, 6, 7, 8, -1, -1, -1, -1, -1};

static sk_status run_attention_paged(unsigned char *const p[], int variant) {
    const sk_grid g = tu_grid(128, 100, 64, 64, 1, 1);
    if (variant == VARIANT_PLAN) {
        const sk_bsr layout = bsr_of(&g, p[1], p[2], 3);
        return sk_attention_paged_plan(&ctx.paged, &layout, (const int32_t *)(void *)p[3],
                                       (const int32_t *)(void *)p[4], (const int32_t *)(void *)p[5],
                                       p[0], ctx.ws_bytes, NULL);
    }
    const sk_bsr layout = bsr_of(&g, p[5], p[6], 3);
    const int32_t *cu_q = (const int32_t *)(void *)p[7], *lens = (const int32_t *)(void *)p[8];
    const int32_t *table = (const int32_t *)(void *)p[9];
    float *lse = (float *)(void *)p[1];
    if (variant == VARIANT_FULL)
        return sk_attention_paged_forward(&ctx.paged, &layout, cu_q, lens, table, p[2], p[3], p[4],
                                          p[0], lse, workspace_at(p, 10), ctx.ws_bytes, NULL);
    return sk_attention_paged_run(&ctx.paged, &layout, cu_q, lens, table, p[2], p[3], p[4], p[0],
                                  lse, workspace_at(p, 10), ctx.ws_bytes, NULL);
}

/* The top-k calls write ctx.layout: its arrays are p[0] and p[1], set by
 * check_pair (its other fields hold a sentinel until the call succeeds). */
static sk_status run_attention_topk(unsigned char *const p[], int variant) {
    (void)variant;
    return sk_attention_topk(&ctx.attn, &ctx.topk, p[4], p[5], p[6], p[2], (float *)(void *)p[3],
                             &ctx.layout, workspace_at(p, 7), ctx.ws_bytes, NULL);
}

static sk_status run_gemm(unsigned char *const p[], int variant) {
    const sk_grid g = tu_grid(64, 128, 64, 64, 1, 1);
    if (variant == VARIANT_PLAN) {
        const sk_bsr a = bsr_of(&g, p[1], p[2], 2);
        return sk_bsr_gemm_plan(&ctx.gemm, &a, p[0], ctx.ws_bytes, NULL);
    }
    const sk_bsr a = bsr_of(&g, p[3], p[4], 2);
    if (variant == VARIANT_FULL)
        return sk_bsr_gemm(&ctx.gemm, &a, p[1], p[2], p[0], workspace_at(p, 5), ctx.ws_bytes, NULL);
    return sk_bsr_gemm_run(&ctx.gemm, &a, p[1], p[2], p[0], workspace_at(p, 5), ctx.ws_bytes, NULL);
}

static sk_status run_block_pool(unsigned char *const p[], int variant) {
    (void)variant;
    return sk_block_pool(&ctx.topk, p[2], p[3], (float *)(void *)p[0], (float *)(void *)p[1], NULL);
}

static sk_status run_select_topk(unsigned char *const p[], int variant) {
    (void)variant;
    return sk_select_topk(&ctx.topk, (const float *)(void *)p[2], (const float *)(void *)p[3],
                          &ctx.layout, workspace_at(p, 4), ctx.ws_bytes, NULL);
}

static sk_status run_pool_select_topk(unsigned char *const p[], int variant) {
    (void)variant;
    return sk_pool_select_topk(&ctx.topk, p[2], p[3], &ctx.layout, ctx.ws_bytes > 0 ? p[4] : NULL,
                               ctx.ws_bytes, NULL);
}

static sk_status run_layout_from_scores(unsigned char *const p[], int variant) {
    (void)variant;
    return sk_layout_from_scores(&ctx.topk, (const float *)(void *)p[2], &ctx.layout,
                                 workspace_at(p, 3), ctx.ws_bytes, NULL);
}

static sk_status run_layout_to_mask(unsigned char *const p[], int variant) {
    (void)variant;
    const sk_grid g = tu_grid(64, 128, 64, 64, 1, 2);
    const sk_bsr layout = bsr_of(&g, p[1], p[2], 3);
    return sk_layout_to_mask(&layout, p[0], 4);
}

static sk_status run_layout_to_flex(unsigned char *const p[], int variant) {
    (void)variant;
    const sk_grid g = tu_grid(64, 128, 64, 64, 1, 2);
    const sk_bsr layout = bsr_of(&g, p[2], p[3], 3);
    return sk_layout_to_flex(&layout, (int32_t *)(void *)p[0], 2, (int32_t *)(void *)p[1], 4);
}

/* ---------------------------------------------------------------------------
 * The tables
 * ------------------------------------------------------------------------- */

/* The CUDA workspace of each entry point (0 on the CPU); SIZE_MAX when this
 * build cannot size it. */
static size_t workspace_of(run_fn run) {
    size_t bytes = 0;
    sk_status st = SK_STATUS_SUCCESS;
    if (ctx.backend == SK_BACKEND_CPU) return 0;
    const sk_grid g = tu_grid(64, 128, 64, 64, 1, 1);
    const sk_bsr layout = bsr_of(&g, (unsigned char *)(uintptr_t)dense_offsets,
                                 (unsigned char *)(uintptr_t)dense_indices, 2);
    if (run == run_attention)
        st = sk_attention_workspace_size(&ctx.attn, &layout, &bytes);
    else if (run == run_attention_backward)
        st = sk_attention_backward_workspace_size(&ctx.attn, &ctx.bwd, &layout, &bytes);
    else if (run == run_attention_topk)
        st = sk_attention_topk_workspace_size(&ctx.attn, &ctx.topk, &bytes);
    else if (run == run_attention_varlen)
        st = sk_attention_varlen_workspace_size(&ctx.varlen, &layout, &bytes);
    else if (run == run_attention_paged)
        st = sk_attention_paged_workspace_size(&ctx.paged, &layout, &bytes);
    else if (run == run_gemm)
        st = sk_bsr_gemm_workspace_size(&ctx.gemm, &layout, &bytes);
    else if (run == run_select_topk || run == run_layout_from_scores)
        st = sk_topk_workspace_size(&ctx.topk, &bytes);
    else if (run == run_pool_select_topk)
        st = sk_pool_select_topk_workspace_size(&ctx.topk, &bytes);
    return st == SK_STATUS_SUCCESS ? bytes : SIZE_MAX;
}

/* Fills `calls` for the current backend; returns the count, and in
 * *skipped the entry points this build cannot check. */
static int build_table(acall *calls, int *skipped) {
    const size_t es = ctx.es, d = ctx.dim;
    const size_t ta = ctx.backend == SK_BACKEND_CPU ? es : 16; /* tensor alignment */
    const size_t pa = ctx.backend == SK_BACKEND_CPU ? 4 : 16;  /* pooled, workspace */
    const size_t qb = 64 * 2 * d * es, kb = 128 * d * es; /* Q, O [1,64,2,d]; K, V [1,128,1,d] */
    const size_t cap = (size_t)ctx.capacity * 4;
    const void *data = tensor_data();
    const abuf o = {"o", qb, ta, 1, NULL}, lse = {"lse", 2 * 64 * 4, 4, 1, NULL};
    const abuf q = {"q", qb, ta, 0, data}, k = {"k", kb, ta, 0, data}, v = {"v", kb, ta, 0, data};
    /* The backward: O and LSE are read, dQ, dK, dV written. */
    const abuf o_in = {"o", qb, ta, 0, data}, dout = {"dout", qb, ta, 0, data};
    const abuf lse_in = {"lse", 2 * 64 * 4, 4, 0, data_f32};
    const abuf dq = {"dq", qb, ta, 1, NULL}, dk = {"dk", kb, ta, 1, NULL},
               dv = {"dv", kb, ta, 1, NULL};
    const abuf ro = {"layout->row_offsets", 8, 4, 0, dense_offsets};
    const abuf ci = {"layout->col_indices", 8, 4, 0, dense_indices};
    const abuf ws = {"workspace", 0, pa, 1, NULL}; /* bytes set per entry point */
    const abuf out_ro = {"layout->row_offsets", 3 * 4, 4, 1, NULL};
    const abuf out_ci = {"layout->col_indices", cap, 4, 1, NULL};
    const abuf pq_out = {"pooled_q", 2 * d * 4, pa, 1, NULL};
    const abuf pk_out = {"pooled_k", 2 * d * 4, pa, 1, NULL};
    const abuf pq_in = {"pooled_q", 2 * d * 4, pa, 0, data_f32};
    const abuf pk_in = {"pooled_k", 2 * d * 4, pa, 0, data_f32};
    const abuf c = {"c", 64 * 8 * 4, ta, 1, NULL};
    const abuf a_values = {"a_values", 2 * 64 * 64 * es, ta, 0, data};
    const abuf b = {"b", 128 * 8 * es, ta, 0, data};
    const abuf a_ro = {"a_layout->row_offsets", 8, 4, 0, dense_offsets};
    const abuf a_ci = {"a_layout->col_indices", 8, 4, 0, dense_indices};
    const abuf v_ro = {"layout->row_offsets", 12, 4, 0, varlen_offsets};
    const abuf v_ci = {"layout->col_indices", 12, 4, 0, varlen_indices};
    const abuf cu_q = {"cu_seqlens_q", 12, 4, 0, varlen_cu_q};
    const abuf cu_k = {"cu_seqlens_k", 12, 4, 0, varlen_cu_k};
    const size_t cache = 9 * 16 * d * es; /* [9, 16, 1, d] */
    const abuf kc = {"k_cache", cache, ta, 0, data}, vc = {"v_cache", cache, ta, 0, data};
    const abuf lens = {"seq_lens_k", 8, 4, 0, paged_lens};
    const abuf table = {"page_table", 14 * 4, 4, 0, paged_table};
    const acall all[] = {
        {"sk_attention_run", run_attention, VARIANT_RUN, 8, {o, lse, q, k, v, ro, ci, ws}},
        {"sk_attention_forward", run_attention, VARIANT_FULL, 8, {o, lse, q, k, v, ro, ci, ws}},
        {"sk_attention_plan", run_attention, VARIANT_PLAN, 3, {ws, ro, ci}},
        {"sk_attention_backward_run",
         run_attention_backward,
         VARIANT_RUN,
         12,
         {dq, dk, dv, q, k, v, o_in, dout, lse_in, ro, ci, ws}},
        {"sk_attention_backward",
         run_attention_backward,
         VARIANT_FULL,
         12,
         {dq, dk, dv, q, k, v, o_in, dout, lse_in, ro, ci, ws}},
        {"sk_attention_backward_plan", run_attention_backward, VARIANT_PLAN, 3, {ws, ro, ci}},
        {"sk_attention_topk", run_attention_topk, 0, 8, {out_ro, out_ci, o, lse, q, k, v, ws}},
        {"sk_attention_varlen_run",
         run_attention_varlen,
         VARIANT_RUN,
         10,
         {o, lse, q, k, v, v_ro, v_ci, cu_q, cu_k, ws}},
        {"sk_attention_varlen_forward",
         run_attention_varlen,
         VARIANT_FULL,
         10,
         {o, lse, q, k, v, v_ro, v_ci, cu_q, cu_k, ws}},
        {"sk_attention_varlen_plan",
         run_attention_varlen,
         VARIANT_PLAN,
         5,
         {ws, v_ro, v_ci, cu_q, cu_k}},
        {"sk_attention_paged_run",
         run_attention_paged,
         VARIANT_RUN,
         11,
         {o, lse, q, kc, vc, v_ro, v_ci, cu_q, lens, table, ws}},
        {"sk_attention_paged_forward",
         run_attention_paged,
         VARIANT_FULL,
         11,
         {o, lse, q, kc, vc, v_ro, v_ci, cu_q, lens, table, ws}},
        {"sk_attention_paged_plan",
         run_attention_paged,
         VARIANT_PLAN,
         6,
         {ws, v_ro, v_ci, cu_q, lens, table}},
        {"sk_bsr_gemm_run", run_gemm, VARIANT_RUN, 6, {c, a_values, b, a_ro, a_ci, ws}},
        {"sk_bsr_gemm", run_gemm, VARIANT_FULL, 6, {c, a_values, b, a_ro, a_ci, ws}},
        {"sk_bsr_gemm_plan", run_gemm, VARIANT_PLAN, 3, {ws, a_ro, a_ci}},
        {"sk_block_pool", run_block_pool, 0, 4, {pq_out, pk_out, q, k}},
        {"sk_select_topk", run_select_topk, 0, 5, {out_ro, out_ci, pq_in, pk_in, ws}},
        {"sk_pool_select_topk", run_pool_select_topk, 0, 5, {out_ro, out_ci, q, k, ws}},
        {"sk_layout_from_scores",
         run_layout_from_scores,
         0,
         4,
         {out_ro, out_ci, {"scores", sizeof scores, 4, 0, scores}, ws}},
        {"sk_layout_to_mask",
         run_layout_to_mask,
         0,
         3,
         {{"mask", 4, 1, 1, NULL},
          {"layout->row_offsets", 12, 4, 0, conv_offsets},
          {"layout->col_indices", 12, 4, 0, conv_indices}}},
        {"sk_layout_to_flex",
         run_layout_to_flex,
         0,
         4,
         {{"counts", 8, 4, 1, NULL},
          {"indices", 16, 4, 1, NULL},
          {"layout->row_offsets", 12, 4, 0, conv_offsets},
          {"layout->col_indices", 12, 4, 0, conv_indices}}}};
    const int total = (int)(sizeof all / sizeof all[0]);
    int n = 0;
    *skipped = 0;
    for (int i = 0; i < total; ++i) {
        acall call = all[i];
        const int is_conversion = call.run == run_layout_to_mask || call.run == run_layout_to_flex;
        if (ctx.backend != SK_BACKEND_CPU && is_conversion) continue; /* host only */
        const size_t wsb = workspace_of(call.run);
        const int ws_first = strcmp(call.b[0].name, "workspace") == 0;
        const int ws_last = strcmp(call.b[call.n - 1].name, "workspace") == 0;
        /* Without a workspace size (CPU: none is used; a build without
         * CUDA: none can be had) the workspace is left out. The plans then
         * write nothing, and sk_attention_topk cannot size its attention. */
        if ((wsb == 0 || wsb == SIZE_MAX) && (ws_first || call.run == run_attention_topk)) {
            if (wsb == SIZE_MAX) {
                printf("    %s on CUDA: not run (this build cannot size its CUDA workspace)\n",
                       call.name);
                ++*skipped;
            }
            if (!ws_first) --call.n; /* sk_attention_topk on the CPU */
            if (ws_first || wsb == SIZE_MAX) continue;
        } else if (ws_last && (wsb == 0 || wsb == SIZE_MAX)) {
            --call.n;
        } else if (ws_first || ws_last) {
            call.b[ws_first ? 0 : call.n - 1].bytes = wsb;
        }
        calls[n++] = call;
    }
    return n;
}

/* ---------------------------------------------------------------------------
 * Placement and checks
 * ------------------------------------------------------------------------- */

typedef enum placement {
    FIRST_IN_SECOND, /* buffer i starts at the last (aligned) element of buffer j */
    SECOND_IN_FIRST,
    FIRST_AFTER_SECOND, /* exactly adjacent */
    SECOND_AFTER_FIRST
} placement;

static size_t align_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}
static size_t align_down(size_t x, size_t a) {
    return x / a * a;
}

/* Offsets of every buffer of `c` for pair (i, j); 0 when an adjacent
 * placement cannot be exact (an alignment in the way). */
static int place(const acall *c, int i, int j, placement how, size_t off[MAXBUF]) {
    const int first = how == FIRST_IN_SECOND || how == FIRST_AFTER_SECOND ? j : i;
    const int second = first == i ? j : i;
    off[first] = GAP;
    const size_t end = GAP + c->b[first].bytes;
    if (how == FIRST_IN_SECOND || how == SECOND_IN_FIRST)
        off[second] = align_down(end - 1, c->b[second].align);
    else
        off[second] = end;
    if (off[second] % c->b[second].align != 0) return 0;
    size_t cursor = align_up(off[second] + c->b[second].bytes, GAP) + GAP;
    if (cursor < align_up(end, GAP) + GAP) cursor = align_up(end, GAP) + GAP;
    for (int m = 0; m < c->n; ++m) {
        if (m == i || m == j) continue;
        off[m] = cursor;
        cursor = align_up(cursor + c->b[m].bytes, GAP) + GAP;
    }
    return 1;
}

static size_t arena_bytes(const acall *c) {
    size_t total = 2 * GAP;
    for (int m = 0; m < c->n; ++m) total += align_up(c->b[m].bytes, GAP) + 2 * GAP;
    return total;
}

/* Poison, then the inputs' content (last, so that it survives an overlap). */
static void fill(const acall *c, unsigned char *arena, size_t bytes, const size_t off[MAXBUF]) {
    memset(arena, POISON, bytes);
    for (int m = 0; m < c->n; ++m)
        if (c->b[m].init != NULL) memcpy(arena + off[m], c->b[m].init, c->b[m].bytes);
}

static int names_both(const char *msg, const char *a, const char *b) {
    char ab[128], ba[128];
    snprintf(ab, sizeof ab, "%s overlaps %s", a, b);
    snprintf(ba, sizeof ba, "%s overlaps %s", b, a);
    return strstr(msg, ab) != NULL || strstr(msg, ba) != NULL;
}

static const char *placement_name(placement how) {
    static const char *const names[4] = {"first inside second", "second inside first",
                                         "first right after second", "second right after first"};
    return names[how];
}

/* One pair, one placement: returns the number of failed checks. */
static int check_pair(const acall *c, int i, int j, placement how, unsigned char *arena,
                      unsigned char *copy, size_t bytes) {
    size_t off[MAXBUF];
    if (!place(c, i, j, how, off)) {
        CHECK(0, "%s: %s / %s cannot be placed %s exactly", c->name, c->b[i].name, c->b[j].name,
              placement_name(how));
        return 1;
    }
    unsigned char *p[MAXBUF];
    for (int m = 0; m < c->n; ++m) p[m] = arena + off[m];
    fill(c, arena, bytes, off);
    memcpy(copy, arena, bytes);
    memset(&ctx.layout, 0x5c, sizeof ctx.layout);
    ctx.layout.row_offsets = (int32_t *)(void *)p[0];
    ctx.layout.col_indices = (int32_t *)(void *)p[1];
    const sk_bsr layout_before = ctx.layout;
    const int before = sk_test_failures();
    const sk_status st = c->run(p, c->variant);
    const char *msg = sk_last_error();
    if (how == FIRST_IN_SECOND || how == SECOND_IN_FIRST) {
        CHECK(st == SK_STATUS_BAD_PARAM_STRIDE, "%s: %s / %s %s: got %s (%s)", c->name,
              c->b[i].name, c->b[j].name, placement_name(how), sk_status_name(st), msg);
        CHECK(names_both(msg, c->b[i].name, c->b[j].name) && strstr(msg, c->name) != NULL,
              "%s: %s / %s %s: message \"%s\"", c->name, c->b[i].name, c->b[j].name,
              placement_name(how), msg);
        CHECK(memcmp(copy, arena, bytes) == 0, "%s: %s / %s %s: memory written on failure", c->name,
              c->b[i].name, c->b[j].name, placement_name(how));
        if (c->b[0].written && strcmp(c->b[0].name, "layout->row_offsets") == 0)
            CHECK(memcmp(&layout_before.grid, &ctx.layout.grid, sizeof ctx.layout.grid) == 0 &&
                      layout_before.nnz == ctx.layout.nnz,
                  "%s: the layout struct was written on failure", c->name);
    } else {
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s / %s %s (adjacent): got %s (%s)", c->name,
              c->b[i].name, c->b[j].name, placement_name(how), sk_status_name(st), msg);
        for (int m = 0; m < c->n; ++m)
            if (!c->b[m].written)
                CHECK(memcmp(copy + off[m], arena + off[m], c->b[m].bytes) == 0,
                      "%s: input %s changed (%s / %s %s)", c->name, c->b[m].name, c->b[i].name,
                      c->b[j].name, placement_name(how));
    }
    return sk_test_failures() - before;
}

/* Every pair with a written member of every entry point; returns the
 * number of placements checked, and in *skipped the entry points this
 * build cannot check. */
static int check_backend(sk_backend backend, int *skipped) {
    ctx_init(backend);
    *skipped = 0;
    if (ctx.capacity != 2) {
        CHECK(0, "top-k capacity %d: %s", (int)ctx.capacity, sk_last_error());
        return 0;
    }
    acall calls[24];
    const int ncalls = build_table(calls, skipped);
    const int placements = backend == SK_BACKEND_CPU ? 4 : 2;
    int checked = 0;
    for (int e = 0; e < ncalls; ++e) {
        const acall *c = &calls[e];
        const size_t bytes = arena_bytes(c);
        ctx.ws_bytes = 0;
        for (int m = 0; m < c->n; ++m)
            if (strcmp(c->b[m].name, "workspace") == 0) ctx.ws_bytes = c->b[m].bytes;
        void *mem = NULL;
        if (posix_memalign(&mem, 64, bytes) != 0) mem = NULL;
        unsigned char *arena = (unsigned char *)mem, *copy = (unsigned char *)malloc(bytes);
        if (arena == NULL || copy == NULL) {
            CHECK(0, "out of memory");
            free(arena);
            free(copy);
            return checked;
        }
        int failed = 0; /* a few failures per entry point are enough to read */
        for (int i = 0; i < c->n && failed < 8; ++i)
            for (int j = i + 1; j < c->n && failed < 8; ++j) {
                if (!c->b[i].written && !c->b[j].written) continue;
                for (int how = 0; how < placements; ++how, ++checked)
                    failed += check_pair(c, i, j, (placement)how, arena, copy, bytes);
            }
        free(arena);
        free(copy);
    }
    return checked;
}

/* 17 entry points, every pair with a written member, four placements
 * (the two backward calls: 27 pairs each; the two varlen calls: 15; the
 * two paged calls: 17). */
SK_TEST(aliasing_every_pair_cpu) {
    int skipped;
    const int checked = check_backend(SK_BACKEND_CPU, &skipped);
    CHECK(checked == 764 && skipped == 0, "%d placements checked (want 764), %d skipped", checked,
          skipped);
}

/* The CUDA backend with host pointers: every overlap is refused by the core
 * before any device access (workspace pairs included). A build without
 * CUDA checks every pair but the workspace's (96 placements), and not the
 * plans nor sk_attention_topk. The CUDA backward cannot size a workspace
 * for this problem's head_dim 8 (its kernels take 64 or 128): its run and
 * one-shot call are checked without a workspace (108 placements) and its
 * plan not at all; tests/gpu/test_attention_backward_gpu.c checks its
 * workspace against the other buffers. The CUDA varlen and paged forwards
 * size their workspace from capacities alone: their runs and one-shot calls
 * are checked with it (24 and 27 pairs each, 96 and 108 placements), their
 * plans too (8 and 10); without CUDA, without a workspace (60 and 68), and
 * their plans not at all. */
SK_TEST(aliasing_every_pair_cuda_refused_before_the_device) {
    int skipped;
    const int checked = check_backend(SK_BACKEND_CUDA, &skipped);
    CHECK((skipped == 1 && checked == 224 + 108 + (96 + 8) + (108 + 10)) ||
              (skipped == 6 && checked == 96 + 108 + 60 + 68),
          "%d placements checked (want 554, or 332 without CUDA), %d entry points skipped", checked,
          skipped);
}
