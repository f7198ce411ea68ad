/*
 * test_topk_gpu.c - the CUDA top-k selection against the CPU backend.
 *
 *   pooling   GPU block means vs the naive fp64 loop and the CPU backend,
 *             under the tolerance rule (2 x a naive fp32 sum + atol);
 *   scores    the GPU scores (left at the start of the workspace by
 *             sk_select_topk, see src/cuda/topk/chain.cu) vs the naive fp64
 *             scores, under the tolerance rule;
 *   layouts   EXACT: the CPU selection run on the very scores the GPU
 *             computed must give the same row_offsets and col_indices, so
 *             rounding differences in the scores cannot matter; random
 *             inputs, quantised so that many scores tie, both block sizes,
 *             causal, tails, GQA per KV head, NaN / inf / signed zeros
 *             (sk_layout_from_scores), rows wider than the key cache;
 *   graphs    pool + select captured in a CUDA graph and replayed on new
 *             inputs equals the eager calls;
 *   end to end  sk_attention_topk on the GPU vs its own steps (bitwise) and
 *             vs the CPU backend.
 * Every output (pooled buffers, layout arrays, workspace, O, LSE) is
 * poisoned before each run; each GPU result is computed twice and must be
 * bitwise identical.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/topk_check.h"
#include "common/topk_naive.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"
#include "sparsek.h"

/* A device copy of n bytes of host memory (NULL on failure). */
static void *to_device(const void *host, size_t n) {
    void *d = gt_device_alloc(n);
    if (d != NULL && gt_upload(d, host, n) != 0) {
        gt_device_free(d);
        return NULL;
    }
    return d;
}

/* Synchronous: cudaMemset runs on the legacy stream, which does not order
 * itself with the non-blocking stream of the graph test (there, an
 * unfinished poisoning could overwrite what the replay wrote). */
static void poison(void *dev, size_t n) {
    cudaMemset(dev, 0xff, n < 16 ? 16 : n);
    cudaDeviceSynchronize();
}

/* ---------------------------------------------------------------------------
 * Pooling
 * ------------------------------------------------------------------------- */

static int gpu_pool_case(sk_dtype dtype, int padded, int64_t b, int64_t sq, int64_t sk,
                         int64_t hq, int64_t hkv, int64_t d, int32_t bq, int32_t bk, uint64_t seed) {
    tk_problem t;
    tk_problem_init(&t, gt_opt.backend, dtype, b, sq, sk, hq, hkv, d, bq, bk);
    if (padded) tk_problem_pad_strides(&t);
    char name[160];
    tk_describe(&t, name, sizeof name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    if (!tk_problem_alloc_host(&t, &rng, 0)) return 0;
    const int64_t nq = tk_pooled_q_len(&t), nk = tk_pooled_k_len(&t);
    float *pq = (float *)malloc((size_t)nq * 4), *pk = (float *)malloc((size_t)nk * 4);
    float *cq = (float *)malloc((size_t)nq * 4), *ck = (float *)malloc((size_t)nk * 4);
    void *dq = to_device(t.q, (size_t)t.q_span * 2), *dk = to_device(t.k, (size_t)t.k_span * 2);
    float *dpq = (float *)gt_device_alloc((size_t)nq * 4);
    float *dpk = (float *)gt_device_alloc((size_t)nk * 4);
    int ok = pq != NULL && pk != NULL && cq != NULL && ck != NULL && dq != NULL && dk != NULL &&
             dpq != NULL && dpk != NULL;
    for (int rep = 0; ok && rep < 2; ++rep) {
        poison(dpq, (size_t)nq * 4);
        poison(dpk, (size_t)nk * 4);
        sk_status st = sk_block_pool(&t.desc, dq, dk, dpq, dpk, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s", name, sk_last_error());
        ok = st == SK_STATUS_SUCCESS && gt_sync() == 0;
        float *hq_ = rep == 0 ? pq : cq, *hk_ = rep == 0 ? pk : ck;
        ok = ok && gt_download(hq_, dpq, (size_t)nq * 4) == 0 &&
             gt_download(hk_, dpk, (size_t)nk * 4) == 0;
    }
    if (ok) {
        CHECK(memcmp(pq, cq, (size_t)nq * 4) == 0 && memcmp(pk, ck, (size_t)nk * 4) == 0,
              "%s: two runs differ", name);
        int bad = tk_check_pooled(&t, 1, pq, "pooled_q") + tk_check_pooled(&t, 0, pk, "pooled_k");
        CHECK(bad == 0, "%s: %d pooled values off the naive mean", name, bad);
        /* The CPU backend on the same host tensors. */
        sk_topk_desc cpu = t.desc;
        cpu.backend = SK_BACKEND_CPU;
        sk_status st = sk_block_pool(&cpu, t.q, t.k, cq, ck, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "%s: CPU: %s", name, sk_last_error());
        int far = 0;
        for (int64_t i = 0; i < nq; ++i)
            far += !(fabsf(pq[i] - cq[i]) <= 2.0f * (float)bq * 0x1.0p-24f * 4.0f + 1e-7f);
        for (int64_t i = 0; i < nk; ++i)
            far += !(fabsf(pk[i] - ck[i]) <= 2.0f * (float)bk * 0x1.0p-24f * 4.0f + 1e-7f);
        CHECK(far == 0, "%s: %d pooled values off the CPU backend", name, far);
    }
    free(pq), free(pk), free(cq), free(ck);
    gt_device_free(dq), gt_device_free(dk), gt_device_free(dpq), gt_device_free(dpk);
    tk_problem_free(&t);
    return ok;
}

SK_TEST(topk_gpu_pool_matches_cpu) {
    const uint64_t s = tu_base_seed() ^ 0x1000;
    int ran = 0;
    ran += gpu_pool_case(SK_DTYPE_F16, 0, 1, 300, 200, 4, 2, 64, 128, 64, s + 1);
    ran += gpu_pool_case(SK_DTYPE_BF16, 1, 2, 129, 65, 4, 1, 128, 64, 128, s + 2);
    ran += gpu_pool_case(SK_DTYPE_BF16, 1, 1, 1, 1, 2, 2, 8, 64, 64, s + 3);
    if (!gt_opt.quick) {
        ran += gpu_pool_case(SK_DTYPE_F16, 1, 2, 1000, 777, 8, 2, 128, 128, 128, s + 4);
        ran += gpu_pool_case(SK_DTYPE_BF16, 0, 1, 4096, 4096, 32, 8, 64, 64, 64, s + 5);
    }
    CHECK(ran == (gt_opt.quick ? 3 : 5), "%d cases ran", ran);
}

/* ---------------------------------------------------------------------------
 * Scores and exact layouts (sk_select_topk)
 * ------------------------------------------------------------------------- */

typedef struct sel_cfg {
    int64_t b, sq, sk, hq, hkv, d;
    int32_t bq, bk, k, sinks, local;
    int causal, per_kv, quant;
} sel_cfg;

/* A bf16 problem of c's shape and selection options (the data is the
 * caller's). */
static void sel_problem_init(tk_problem *t, const sel_cfg *c) {
    tk_problem_init(t, gt_opt.backend, SK_DTYPE_BF16, c->b, c->sq, c->sk, c->hq, c->hkv, c->d,
                    c->bq, c->bk);
    t->desc.k = c->k;
    t->desc.sink_blocks = c->sinks;
    t->desc.local_blocks = c->local;
    t->desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    t->desc.per_kv_head = c->per_kv;
}

/* GPU selection output, downloaded. */
typedef struct gpu_layout {
    int32_t rows, cap, nnz;
    int32_t *off, *idx;
} gpu_layout;

static void gpu_layout_free(gpu_layout *g) {
    free(g->off);
    free(g->idx);
    g->off = g->idx = NULL;
}

/* Device layout buffers (poisoned) -> call -> host copy. Exactly one of
 * (pq, pk) and scores is used. scores_out (host, may be NULL) receives the
 * GPU's scores from the workspace. */
static int run_gpu_select(const tk_problem *t, const float *dpq, const float *dpk,
                          const float *dscores, gpu_layout *out, float *scores_out,
                          const char *name) {
    memset(out, 0, sizeof *out);
    int32_t cap = 0;
    size_t ws_bytes = 0;
    if (sk_topk_layout_capacity(&t->desc, NULL, &cap) != SK_STATUS_SUCCESS ||
        sk_topk_workspace_size(&t->desc, &ws_bytes) != SK_STATUS_SUCCESS) {
        printf("    %s: %s\n", name, sk_last_error());
        return 0;
    }
    out->rows = tk_total_rows(t);
    out->cap = cap;
    const size_t off_bytes = ((size_t)out->rows + 1) * 4, idx_bytes = (size_t)cap * 4 + 64;
    int32_t *doff = (int32_t *)gt_device_alloc(off_bytes);
    int32_t *didx = (int32_t *)gt_device_alloc(idx_bytes);
    void *ws = gt_device_alloc(ws_bytes);
    out->off = (int32_t *)malloc(off_bytes);
    out->idx = (int32_t *)malloc(idx_bytes);
    int ok = doff != NULL && didx != NULL && ws != NULL && out->off != NULL && out->idx != NULL;
    int32_t *first_off = (int32_t *)malloc(off_bytes), *first_idx = (int32_t *)malloc(idx_bytes);
    ok = ok && first_off != NULL && first_idx != NULL;
    for (int rep = 0; ok && rep < 2; ++rep) {
        poison(doff, off_bytes);
        poison(didx, idx_bytes);
        poison(ws, ws_bytes);
        sk_bsr l;
        memset(&l, 0x5c, sizeof l);
        l.row_offsets = doff;
        l.col_indices = didx;
        const sk_status st = dscores != NULL
                                 ? sk_layout_from_scores(&t->desc, dscores, &l, ws, ws_bytes, NULL)
                                 : sk_select_topk(&t->desc, dpq, dpk, &l, ws, ws_bytes, NULL);
        if (st != SK_STATUS_SUCCESS) {
            printf("    %s: %s\n", name, sk_last_error());
            ok = 0;
            break;
        }
        out->nnz = l.nnz;
        sk_grid g;
        tk_grid(t, &g);
        if (memcmp(&g, &l.grid, sizeof g) != 0 || l.nnz != cap) {
            printf("    %s: layout grid or nnz (%d, capacity %d) wrong\n", name, (int)l.nnz,
                   (int)cap);
            ok = 0;
        }
        ok = ok && gt_sync() == 0 && gt_download(out->off, doff, off_bytes) == 0 &&
             gt_download(out->idx, didx, idx_bytes) == 0;
        if (ok && rep == 0) {
            memcpy(first_off, out->off, off_bytes);
            memcpy(first_idx, out->idx, idx_bytes);
        }
        if (ok && rep == 1 && (memcmp(first_off, out->off, off_bytes) != 0 ||
                               memcmp(first_idx, out->idx, idx_bytes) != 0)) {
            printf("    %s: two runs differ\n", name);
            ok = 0;
        }
    }
    if (ok && scores_out != NULL)
        ok = gt_download(scores_out, ws, (size_t)out->rows * tk_col_blocks(t) * 4) == 0;
    if (ok) {
        /* Past the capacity: untouched (all bytes 0xff). Between the real
         * count and the capacity the entries are unspecified (rows that came
         * out short were first written at their full-row places). */
        const int32_t n = out->off[out->rows];
        if (n < 0 || n > cap) {
            printf("    %s: last offset %d outside [0, %d]\n", name, (int)n, (int)cap);
            ok = 0;
        }
        for (int32_t e = cap; ok && e < cap + 16; ++e)
            if (out->idx[e] != -1) {
                printf("    %s: col_indices[%d] = %d written past the capacity (count %d)\n", name, (int)e,
                       (int)out->idx[e], (int)n);
                ok = 0;
            }
    }
    free(first_off);
    free(first_idx);
    gt_device_free(doff), gt_device_free(didx), gt_device_free(ws);
    return ok;
}

/* The CPU selection from `scores` (host) equals the GPU layout. */
static int same_as_cpu_selection(const tk_problem *t, const float *scores, const gpu_layout *g,
                                 const char *name) {
    tk_problem c = *t;
    c.desc.backend = SK_BACKEND_CPU;
    tk_layout_buf l;
    if (!tk_layout_buf_alloc(&c, &l)) return 0;
    int ok = sk_layout_from_scores(&c.desc, scores, &l.bsr, NULL, 0, NULL) == SK_STATUS_SUCCESS;
    if (!ok) printf("    %s: CPU: %s\n", name, sk_last_error());
    for (int32_t r = 0; ok && r <= g->rows; ++r)
        if (l.off[r] != g->off[r]) {
            printf("    %s: row_offsets[%d]: GPU %d, CPU %d\n", name, (int)r, (int)g->off[r],
                   (int)l.off[r]);
            ok = 0;
        }
    for (int32_t e = 0; ok && e < l.off[l.rows]; ++e)
        if (l.idx[e] != g->idx[e]) {
            printf("    %s: col_indices[%d]: GPU %d, CPU %d\n", name, (int)e, (int)g->idx[e],
                   (int)l.idx[e]);
            ok = 0;
        }
    tk_layout_buf_free(&l);
    return ok;
}

/* sk_select_topk on the CPU backend from the same pooled blocks (host)
 * gives the GPU layout: for inputs whose scores are exact in fp32. */
static int same_as_cpu_backend(tk_problem t, const float *pq, const float *pk,
                               const gpu_layout *g) {
    t.desc.backend = SK_BACKEND_CPU;
    tk_layout_buf l;
    int ok = tk_layout_buf_alloc(&t, &l);
    if (ok && sk_select_topk(&t.desc, pq, pk, &l.bsr, NULL, 0, NULL) != SK_STATUS_SUCCESS) {
        printf("    CPU backend: %s\n", sk_last_error());
        ok = 0;
    }
    ok = ok && memcmp(l.off, g->off, ((size_t)g->rows + 1) * 4) == 0 &&
         memcmp(l.idx, g->idx, (size_t)l.off[l.rows] * 4) == 0;
    tk_layout_buf_free(&l);
    return ok;
}

/* Pooled blocks of a wide dynamic range (the Hopper scoring scales each row
 * by a power of two before its fp16 split, src/cuda/topk/score_rows_sm90.cu):
 *   1  Q rows x 2^100, K rows x 2^-100 (exponents past the fast epilogue);
 *   2  Q rows x 2^-110, K rows x 2^110 (scale x 2^-e not normal: the slow
 *      epilogue);
 *   3  each row x 2^-30, 1 or 2^30 by row, and within a row the entries
 *      x 2^(-10 (d % 4)) (entries far below the row's largest);
 *   4  entries that are not finite: dim 5 of Q rows 3 mod 7 is +inf, dim 9
 *      of Q rows 4 mod 11 is -inf, dim 2 of Q rows 6 mod 13 is NaN; dim 5 of
 *      K rows 2 mod 5 is 0 (inf x 0), dim 9 of K rows 8 mod 17 is +inf. The
 *      scores are then +-inf or NaN as the fp32 dot product gives them
 *      (the fp64 check wants the same), not the NaN of a split's inf x 0.
 * In patterns 1-3 the scores stay finite. */
static void spread_range(float *x, int64_t rows, int64_t dim, int range, int is_q) {
    if (range == 4) {
        for (int64_t r = 0; r < rows; ++r) {
            float *row = x + r * dim;
            if (is_q && r % 7 == 3) row[5] = INFINITY;
            if (is_q && r % 11 == 4) row[9] = -INFINITY;
            if (is_q && r % 13 == 6) row[2] = NAN;
            if (!is_q && r % 5 == 2) row[5] = 0.f;
            if (!is_q && r % 17 == 8) row[9] = INFINITY;
        }
        return;
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < dim; ++e) {
            int ex = 0;
            if (range == 1) ex = is_q ? 100 : -100;
            if (range == 2) ex = is_q ? -110 : 110;
            if (range == 3) ex = 30 * (int)(r % 3 - 1) - 10 * (int)(e % 4);
            x[r * dim + e] = ldexpf(x[r * dim + e], ex);
        }
}

static int gpu_select_case_range(const sel_cfg *c, uint64_t seed, int range);

static int gpu_select_case(const sel_cfg *c, uint64_t seed) {
    return gpu_select_case_range(c, seed, 0);
}

static int gpu_select_case_range(const sel_cfg *c, uint64_t seed, int range) {
    tk_problem t;
    sel_problem_init(&t, c);
    if (c->quant) t.desc.scale = 0.5f;
    char name[200];
    tk_describe(&t, name, sizeof name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    float *pq = NULL, *pk = NULL;
    if (!tk_random_pooled(&t, &rng, c->quant, &pq, &pk)) return 0;
    if (range != 0) {
        printf("    range pattern %d\n", range);
        spread_range(pq, tk_pooled_q_len(&t) / c->d, c->d, range, 1);
        spread_range(pk, tk_pooled_k_len(&t) / c->d, c->d, range, 0);
    }
    const size_t nq = (size_t)tk_pooled_q_len(&t) * 4, nk = (size_t)tk_pooled_k_len(&t) * 4;
    float *dpq = (float *)to_device(pq, nq), *dpk = (float *)to_device(pk, nk);
    const size_t ns = (size_t)tk_total_rows(&t) * tk_col_blocks(&t);
    float *scores = (float *)malloc(ns * 4);
    gpu_layout g;
    memset(&g, 0, sizeof g);
    int ok = dpq != NULL && dpk != NULL && scores != NULL &&
             run_gpu_select(&t, dpq, dpk, NULL, &g, scores, name);
    if (ok) {
        const int bad = tk_check_scores_ex(&t, pq, pk, scores, 1.0,
                                           c->causal ? TK_SCORES_CANDIDATES : TK_SCORES_ALL);
        CHECK(bad == 0, "%s: %d GPU scores off the naive ones", name, bad);
        CHECK(same_as_cpu_selection(&t, scores, &g, name), "%s: GPU layout != CPU selection on "
              "the GPU's scores", name);
        tk_problem cpu = t;
        cpu.desc.backend = SK_BACKEND_CPU;
        CHECK(tk_layout_equals_naive(&cpu, scores, g.off, g.idx, name), "%s: != naive", name);
        if (c->quant) /* exact scores: the CPU backend end to end gives the same layout */
            CHECK(same_as_cpu_backend(t, pq, pk, &g),
                  "%s: GPU and CPU sk_select_topk differ on exact scores", name);
    }
    gpu_layout_free(&g);
    free(scores), free(pq), free(pk);
    gt_device_free(dpq), gt_device_free(dpk);
    tk_problem_free(&t);
    return ok;
}

SK_TEST(topk_gpu_select_layouts_exact) {
    /* b sq sk hq hkv d | bq bk k sinks local | causal per_kv quant */
    static const sel_cfg cfgs[] = {
        {1, 1024, 1024, 4, 4, 64, 128, 128, 4, 1, 2, 1, 0, 1},
        {2, 1000, 1300, 4, 2, 64, 64, 64, 5, 2, 3, 1, 0, 1},
        {1, 700, 900, 6, 2, 128, 128, 64, 3, 0, 0, 0, 1, 0},
        {2, 4096, 4096, 8, 2, 128, 64, 64, 16, 2, 8, 1, 1, 1},
        {1, 300, 5000, 2, 1, 64, 64, 128, 7, 1, 1, 1, 0, 0},
        {1, 5000, 300, 2, 2, 8, 128, 64, 2, 1, 1, 1, 0, 1},   /* Sq > Sk: empty rows */
        {1, 2048, 2048, 2, 2, 64, 128, 128, 100, 0, 0, 0, 0, 1}, /* k > candidates */
        {1, 2048, 2048, 2, 2, 64, 64, 64, 0, 3, 2, 1, 0, 0},     /* forced only */
        {1, 64, 2100 * 64, 1, 1, 16, 64, 64, 9, 1, 2, 0, 0, 1},  /* 2100 keys: no key cache */
        {1, 200, 2100 * 64, 2, 1, 16, 64, 64, 30, 0, 0, 1, 1, 0},
        {1, 8192, 8192, 2, 2, 64, 64, 64, 16, 2, 8, 1, 0, 0},    /* filter path, cached keys */
        {1, 256, 1500 * 64, 1, 1, 16, 64, 64, 16, 1, 2, 1, 0, 0}, /* 1500 keys: 64 per lane */
        {1, 300, 1301 * 64 - 10, 2, 1, 16, 64, 64, 16, 1, 2, 0, 0, 1}, /* the same, ties, a tail */
        {1, 128000, 128000, 1, 1, 16, 64, 64, 16, 2, 8, 1, 0, 0}, /* 2000 keys, rows of 32 and 64 */
        {1, 2048, 2048, 4, 4, 64, 64, 64, 40, 1, 1, 0, 0, 0},     /* k > 32: radix path */
        {1, 1024, 1100, 2, 1, 256, 64, 64, 6, 1, 2, 1, 0, 0},     /* D > 128: the Hopper tf32 scoring */
        {1, 900, 900, 2, 2, 136, 64, 64, 5, 0, 1, 0, 1, 1},       /* D > 128, a short last chunk */
    };
    const int n = gt_opt.quick ? 3 : (int)(sizeof cfgs / sizeof cfgs[0]);
    int ran = 0;
    for (int i = 0; i < n; ++i) ran += gpu_select_case(&cfgs[i], tu_base_seed() ^ (0x2000u + (unsigned)i));
    CHECK(ran == n, "%d of %d cases ran", ran, n);
}

SK_TEST(topk_gpu_scores_wide_range) {
    /* b sq sk hq hkv d | bq bk k sinks local | causal per_kv quant */
    static const sel_cfg cfgs[] = {
        {1, 1024, 1024, 4, 2, 128, 64, 64, 4, 1, 2, 1, 0, 0},
        {2, 700, 900, 2, 2, 72, 64, 64, 3, 0, 1, 0, 0, 0},
        {1, 600, 600, 4, 2, 64, 64, 64, 5, 1, 1, 1, 1, 0},
    };
    int ran = 0, want = 0;
    for (int range = 1; range <= 3; ++range)
        for (int i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); ++i, ++want)
            ran += gpu_select_case_range(&cfgs[i], tu_base_seed() ^ (0x2400u + (unsigned)(4 * i + range)),
                                         range);
    CHECK(ran == want, "%d of %d cases ran", ran, want);
}

/* Pooled blocks with +-inf and NaN entries (spread_range pattern 4): the
 * scores must be the fp32 dot product's inf or NaN, on the Hopper split
 * (D <= 128), the 3xTF32 (D > 128) and the portable scoring; with exact
 * (quantised) inputs the CPU backend must agree end to end. */
SK_TEST(topk_gpu_scores_not_finite) {
    /* b sq sk hq hkv d | bq bk k sinks local | causal per_kv quant */
    static const sel_cfg cfgs[] = {
        {1, 1024, 1024, 4, 4, 64, 128, 128, 4, 1, 2, 1, 0, 1},
        {2, 700, 900, 2, 2, 72, 64, 64, 3, 0, 1, 0, 0, 0},
        {1, 2048, 2048, 4, 2, 128, 64, 64, 16, 2, 8, 1, 1, 1},
        {1, 1024, 1100, 2, 1, 256, 64, 64, 6, 1, 2, 1, 0, 1}, /* D > 128: the tf32 scoring */
    };
    int ran = 0, want = 0;
    for (int i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); ++i, ++want)
        ran += gpu_select_case_range(&cfgs[i], tu_base_seed() ^ (0x2480u + (unsigned)i), 4);
    CHECK(ran == want, "%d of %d cases ran", ran, want);
}

/* Score orders built to defeat the selection's thresholds, exact in fp32
 * (pooled Q = e0, pooled K row j = f(j) e0, scale 1), so that the CPU
 * backend must agree end to end:
 *   0  every score equal (all ties: the lowest blocks win);
 *   1  increasing with the block, 2  decreasing;
 *   3  lane-grouped, f(j) = j - 1000 (j % 32): every warp lane's largest
 *      score is high and most scores pass the lane-maximum threshold (the
 *      filter path's radix fallback, with k = 32).
 * 1000 key blocks go to the register selection with 32 scores per lane,
 * 1100 with 64, 2100 to the general one. */
static int gpu_order_case(int pattern, int32_t k, int causal, int64_t key_blocks) {
    tk_problem t;
    tk_problem_init(&t, gt_opt.backend, SK_DTYPE_BF16, 1, 64 * 300, 64 * key_blocks, 2, 2, 16, 64,
                    64);
    t.desc.k = k;
    t.desc.sink_blocks = 1;
    t.desc.local_blocks = 2;
    t.desc.mask = causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    t.desc.scale = 1.0f;
    char name[200];
    tk_describe(&t, name, sizeof name);
    const int64_t nq = tk_pooled_q_len(&t), nk = tk_pooled_k_len(&t), d = t.desc.head_dim;
    float *pq = (float *)calloc((size_t)nq, 4), *pk = (float *)calloc((size_t)nk, 4);
    const size_t ns = (size_t)tk_total_rows(&t) * tk_col_blocks(&t);
    float *scores = (float *)malloc(ns * 4);
    int ok = pq != NULL && pk != NULL && scores != NULL;
    for (int64_t r = 0; ok && r < nq / d; ++r) pq[r * d] = 1.0f;
    const int32_t cb = tk_col_blocks(&t);
    for (int64_t r = 0; ok && r < nk / d; ++r) {
        const int32_t j = (int32_t)(r % cb);
        pk[r * d] = pattern == 0 ? 1.0f
                    : pattern == 1 ? (float)j
                    : pattern == 2 ? (float)-j
                                   : (float)(j - 1000 * (j % 32));
    }
    float *dpq = ok ? (float *)to_device(pq, (size_t)nq * 4) : NULL;
    float *dpk = ok ? (float *)to_device(pk, (size_t)nk * 4) : NULL;
    gpu_layout g;
    memset(&g, 0, sizeof g);
    ok = ok && dpq != NULL && dpk != NULL && run_gpu_select(&t, dpq, dpk, NULL, &g, scores, name);
    if (ok) {
        CHECK(same_as_cpu_selection(&t, scores, &g, name),
              "%s pattern %d: GPU layout != CPU selection on the GPU's scores", name, pattern);
        CHECK(same_as_cpu_backend(t, pq, pk, &g),
              "%s pattern %d: GPU and CPU sk_select_topk differ on exact scores", name, pattern);
    }
    gpu_layout_free(&g);
    free(scores), free(pq), free(pk);
    gt_device_free(dpq), gt_device_free(dpk);
    tk_problem_free(&t);
    return ok;
}

SK_TEST(topk_gpu_select_adversarial_orders) {
    static const int32_t ks[] = {5, 16, 32};
    static const int64_t key_blocks[] = {1000, 1100, 2100};
    int ran = 0, n = 0;
    for (int pattern = 0; pattern < 4; ++pattern)
        for (int e = 0; e < 3; ++e, ++n)
            ran += gpu_order_case(pattern, ks[e], (pattern + e) % 2, key_blocks[(pattern + e) % 3]);
    CHECK(ran == n, "%d of %d cases ran", ran, n);
}

/* sk_layout_from_scores with NaN, +-inf, +-0 and ties, GPU vs CPU. */
SK_TEST(topk_gpu_from_scores_exact_with_specials) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x3000);
    const int n = gt_opt.quick ? 4 : 24;
    int ran = 0;
    for (int c = 0; c < n; ++c) {
        tk_problem t;
        const int wide = c % 6 == 5;
        tk_problem_init(&t, gt_opt.backend, SK_DTYPE_F16, tu_rng_range(&rng, 1, 2),
                        tu_rng_range(&rng, 1, wide ? 300 : 3000),
                        wide ? tu_rng_range(&rng, 2049 * 64, 2600 * 64) : tu_rng_range(&rng, 1, 3000),
                        2, 1, 8, (c & 1) ? 64 : 128, (c & 2) ? 64 : 128);
        t.desc.k = (int32_t)tu_rng_range(&rng, 0, c % 4 == 0 ? 200 : 20);
        t.desc.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 3);
        t.desc.local_blocks = (int32_t)tu_rng_range(&rng, 0, 4);
        t.desc.mask = (c & 4) ? SK_MASK_CAUSAL : SK_MASK_NONE;
        t.desc.per_kv_head = (c & 8) != 0;
        char name[200];
        tk_describe(&t, name, sizeof name);
        const double special = (c % 3 == 0) ? 0.9 : 0.1; /* some rows nearly all NaN / inf */
        float *scores = tk_random_scores(&t, &rng, special);
        const size_t ns = (size_t)tk_total_rows(&t) * tk_col_blocks(&t) * 4;
        /* Every third case's scores start 4 bytes past a 16-byte boundary:
         * the register selection then loads them one float at a time. */
        const size_t skew = c % 3 == 1 ? 4 : 0;
        char *ds = scores != NULL ? (char *)gt_device_alloc(ns + skew) : NULL;
        if (ds != NULL && gt_upload(ds + skew, scores, ns) != 0) {
            gt_device_free(ds);
            ds = NULL;
        }
        gpu_layout g;
        memset(&g, 0, sizeof g);
        if (ds != NULL && run_gpu_select(&t, NULL, NULL, (float *)(void *)(ds + skew), &g, NULL,
                                         name)) {
            CHECK(same_as_cpu_selection(&t, scores, &g, name), "%s (scores skewed by %zu bytes): GPU != CPU",
                  name, skew);
            ++ran;
        }
        gpu_layout_free(&g);
        gt_device_free(ds);
        free(scores);
    }
    CHECK(ran == n, "%d of %d cases ran", ran, n);
}

/* ---------------------------------------------------------------------------
 * CUDA graph capture
 * ------------------------------------------------------------------------- */

SK_TEST(topk_gpu_graph_capture_replays_on_new_inputs) {
    tk_problem t;
    tk_problem_init(&t, gt_opt.backend, SK_DTYPE_BF16, 1, 2000, 2000, 4, 2, 64, 128, 64);
    t.desc.k = 4;
    t.desc.sink_blocks = 1;
    t.desc.local_blocks = 2;
    t.desc.mask = SK_MASK_CAUSAL;
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x4000);
    REQUIRE(tk_problem_alloc_host(&t, &rng, 0), "no memory");
    int32_t cap = 0;
    size_t ws_bytes = 0;
    REQUIRE(sk_topk_layout_capacity(&t.desc, NULL, &cap) == SK_STATUS_SUCCESS &&
                sk_topk_workspace_size(&t.desc, &ws_bytes) == SK_STATUS_SUCCESS,
            "%s", sk_last_error());
    const int32_t rows = tk_total_rows(&t);
    const size_t nq = (size_t)tk_pooled_q_len(&t) * 4, nk = (size_t)tk_pooled_k_len(&t) * 4;
    const size_t off_bytes = ((size_t)rows + 1) * 4, idx_bytes = (size_t)cap * 4;
    void *dq = to_device(t.q, (size_t)t.q_span * 2), *dk = to_device(t.k, (size_t)t.k_span * 2);
    float *dpq = (float *)gt_device_alloc(nq), *dpk = (float *)gt_device_alloc(nk);
    int32_t *doff = (int32_t *)gt_device_alloc(off_bytes), *didx = (int32_t *)gt_device_alloc(idx_bytes);
    void *ws = gt_device_alloc(ws_bytes);
    int32_t *eager_off = (int32_t *)malloc(off_bytes), *eager_idx = (int32_t *)malloc(idx_bytes);
    int32_t *graph_off = (int32_t *)malloc(off_bytes), *graph_idx = (int32_t *)malloc(idx_bytes);
    REQUIRE(dq && dk && dpq && dpk && doff && didx && ws && eager_off && eager_idx && graph_off &&
                graph_idx,
            "no memory");
    cudaStream_t stream;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = doff;
    l.col_indices = didx;

    /* Capture with the first inputs. */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess,
            "begin capture");
    sk_status s1 = sk_block_pool(&t.desc, dq, dk, dpq, dpk, stream);
    sk_status s2 = sk_select_topk(&t.desc, dpq, dpk, &l, ws, ws_bytes, stream);
    cudaError_t e = cudaStreamEndCapture(stream, &graph);
    REQUIRE(s1 == SK_STATUS_SUCCESS && s2 == SK_STATUS_SUCCESS, "captured calls: %s",
            sk_last_error());
    REQUIRE(e == cudaSuccess, "end capture: %s", cudaGetErrorName(e));
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");

    for (int round = 0; round < 2; ++round) {
        /* New Q and K each round: the replay must read them. */
        if (round == 1) {
            tk_problem_free(&t);
            REQUIRE(tk_problem_alloc_host(&t, &rng, TK_QUANT), "no memory");
            REQUIRE(gt_upload(dq, t.q, (size_t)t.q_span * 2) == 0 &&
                        gt_upload(dk, t.k, (size_t)t.k_span * 2) == 0,
                    "upload");
        }
        poison(doff, off_bytes);
        poison(didx, idx_bytes);
        poison(ws, ws_bytes);
        REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess, "graph launch");
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
        REQUIRE(gt_download(graph_off, doff, off_bytes) == 0 &&
                    gt_download(graph_idx, didx, idx_bytes) == 0,
                "download");
        poison(doff, off_bytes);
        poison(didx, idx_bytes);
        REQUIRE(sk_block_pool(&t.desc, dq, dk, dpq, dpk, stream) == SK_STATUS_SUCCESS &&
                    sk_select_topk(&t.desc, dpq, dpk, &l, ws, ws_bytes, stream) ==
                        SK_STATUS_SUCCESS,
                "eager: %s", sk_last_error());
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
        REQUIRE(gt_download(eager_off, doff, off_bytes) == 0 &&
                    gt_download(eager_idx, didx, idx_bytes) == 0,
                "download");
        CHECK(memcmp(graph_off, eager_off, off_bytes) == 0 &&
                  memcmp(graph_idx, eager_idx, (size_t)eager_off[rows] * 4) == 0,
              "round %d: graph replay differs from the eager calls", round);
        CHECK(eager_off[rows] == cap, "round %d: count %d, capacity %d (finite scores)", round,
              (int)eager_off[rows], (int)cap);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    free(eager_off), free(eager_idx), free(graph_off), free(graph_idx);
    gt_device_free(dq), gt_device_free(dk), gt_device_free(dpq), gt_device_free(dpk);
    gt_device_free(doff), gt_device_free(didx), gt_device_free(ws);
    tk_problem_free(&t);
}

/* ---------------------------------------------------------------------------
 * sk_attention_topk end to end
 * ------------------------------------------------------------------------- */

static int gpu_attention_case(int64_t b, int64_t s_q, int64_t s_k, int64_t hq, int64_t hkv,
                              int64_t d, int32_t bs, int per_kv, int quant, uint64_t seed) {
    tk_problem t;
    /* A forced Hopper backend covers 128 x 128 blocks only: let the library
     * choose for the other block sizes (declines are tested elsewhere). */
    const gt_case cover = {.block_q = bs, .block_k = bs};
    const sk_backend backend = gt_backend_covers(&cover) ? gt_opt.backend : SK_BACKEND_CUDA;
    tk_problem_init(&t, backend, SK_DTYPE_BF16, b, s_q, s_k, hq, hkv, d, bs, bs);
    t.desc.k = 3;
    t.desc.sink_blocks = 1;
    t.desc.local_blocks = 2;
    t.desc.mask = SK_MASK_CAUSAL;
    t.desc.per_kv_head = per_kv;
    t.desc.scale = 0.125f; /* exact: with quantised inputs, exact scores */
    char name[200];
    tk_describe(&t, name, sizeof name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    if (!tk_problem_alloc_host(&t, &rng, TK_WITH_V | (quant ? TK_QUANT : 0))) return 0;
    sk_attention_desc a;
    tk_attention_desc(&t, &a);
    size_t ws_bytes = 0;
    int32_t cap = 0;
    sk_status st = sk_attention_topk_workspace_size(&a, &t.desc, &ws_bytes);
    if (st != SK_STATUS_SUCCESS || sk_topk_layout_capacity(&t.desc, NULL, &cap) != SK_STATUS_SUCCESS) {
        printf("    %s: %s\n", name, sk_last_error());
        tk_problem_free(&t);
        return 0;
    }
    const int32_t rows = tk_total_rows(&t);
    const int64_t no = b * s_q * hq * d, nl = b * hq * s_q;
    const size_t off_bytes = ((size_t)rows + 1) * 4, idx_bytes = (size_t)cap * 4;
    const size_t ns = (size_t)rows * tk_col_blocks(&t);
    void *dq = to_device(t.q, (size_t)t.q_span * 2), *dk = to_device(t.k, (size_t)t.k_span * 2);
    void *dv = to_device(t.v, (size_t)t.k_span * 2);
    void *d_o = gt_device_alloc((size_t)no * 2), *d_o2 = gt_device_alloc((size_t)no * 2);
    float *dl = (float *)gt_device_alloc((size_t)nl * 4), *dl2 = (float *)gt_device_alloc((size_t)nl * 4);
    int32_t *doff = (int32_t *)gt_device_alloc(off_bytes), *didx = (int32_t *)gt_device_alloc(idx_bytes);
    void *ws = gt_device_alloc(ws_bytes);
    uint16_t *o = (uint16_t *)malloc((size_t)no * 2), *o2 = (uint16_t *)malloc((size_t)no * 2);
    uint16_t *oc = (uint16_t *)malloc((size_t)no * 2);
    float *lse = (float *)malloc((size_t)nl * 4), *lse2 = (float *)malloc((size_t)nl * 4);
    float *lsec = (float *)malloc((size_t)nl * 4), *scores = (float *)malloc(ns * 4);
    gpu_layout g;
    memset(&g, 0, sizeof g);
    g.rows = rows;
    g.off = (int32_t *)malloc(off_bytes);
    g.idx = (int32_t *)malloc(idx_bytes + 4);
    int ok = dq && dk && dv && d_o && d_o2 && dl && dl2 && doff && didx && ws && o && o2 && oc &&
             lse && lse2 && lsec && scores && g.off && g.idx;
    if (ok) {
        poison(d_o, (size_t)no * 2);
        poison(dl, (size_t)nl * 4);
        poison(doff, off_bytes);
        poison(didx, idx_bytes);
        poison(ws, ws_bytes);
        sk_bsr l;
        memset(&l, 0, sizeof l);
        l.row_offsets = doff;
        l.col_indices = didx;
        st = sk_attention_topk(&a, &t.desc, dq, dk, dv, d_o, dl, &l, ws, ws_bytes, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s", name, sk_last_error());
        ok = st == SK_STATUS_SUCCESS && gt_sync() == 0 && l.nnz == cap &&
             gt_download(o, d_o, (size_t)no * 2) == 0 && gt_download(lse, dl, (size_t)nl * 4) == 0 &&
             gt_download(g.off, doff, off_bytes) == 0 && gt_download(g.idx, didx, idx_bytes) == 0 &&
             gt_download(scores, ws, ns * 4) == 0; /* the selection's scores lead the workspace */
        /* The layout is the CPU selection on the GPU's scores. */
        CHECK(ok && same_as_cpu_selection(&t, scores, &g, name), "%s: layout", name);
        /* The attention step alone on that layout: bitwise the same. */
        if (ok) {
            poison(d_o2, (size_t)no * 2);
            poison(dl2, (size_t)nl * 4);
            size_t aws = 0;
            st = sk_attention_workspace_size(&a, &l, &aws);
            void *ws2 = st == SK_STATUS_SUCCESS ? gt_device_alloc(aws) : NULL;
            st = st == SK_STATUS_SUCCESS
                     ? sk_attention_forward(&a, &l, dq, dk, dv, d_o2, dl2, ws2, aws, NULL)
                     : st;
            CHECK(st == SK_STATUS_SUCCESS, "%s: attention alone: %s", name, sk_last_error());
            ok = st == SK_STATUS_SUCCESS && gt_sync() == 0 &&
                 gt_download(o2, d_o2, (size_t)no * 2) == 0 &&
                 gt_download(lse2, dl2, (size_t)nl * 4) == 0;
            gt_device_free(ws2);
            CHECK(ok && memcmp(o, o2, (size_t)no * 2) == 0 && memcmp(lse, lse2, (size_t)nl * 4) == 0,
                  "%s: sk_attention_topk differs from sk_attention_forward on its layout", name);
        }
        /* The CPU backend end to end (same layout when the scores are exact). */
        if (ok) {
            tk_problem c = t;
            c.desc.backend = SK_BACKEND_CPU;
            sk_attention_desc ac = a;
            ac.backend = SK_BACKEND_CPU;
            tk_layout_buf lc;
            ok = tk_layout_buf_alloc(&c, &lc);
            st = ok ? sk_attention_topk(&ac, &c.desc, t.q, t.k, t.v, oc, lsec, &lc.bsr, NULL, 0, NULL)
                    : SK_STATUS_ALLOC_FAILED;
            CHECK(st == SK_STATUS_SUCCESS, "%s: CPU: %s", name, sk_last_error());
            if (st == SK_STATUS_SUCCESS && quant)
                CHECK(memcmp(lc.off, g.off, off_bytes) == 0 &&
                          memcmp(lc.idx, g.idx, (size_t)lc.off[rows] * 4) == 0,
                      "%s: GPU and CPU layouts differ on exact scores", name);
            if (st == SK_STATUS_SUCCESS && quant) {
                /* Loose sanity bound (the attention suite checks the kernel under the
                 * tolerance rule): a few bf16 ulps of the largest |V|. */
                double vmax = 0;
                for (int64_t e = 0; e < t.k_span; ++e) {
                    const double x = fabs((double)tu_load(t.v, SK_DTYPE_BF16, e));
                    if (x == x && x > vmax) vmax = x;
                }
                int64_t bad = 0;
                for (int64_t e = 0; e < no; ++e) {
                    const double x = tu_load(o, SK_DTYPE_BF16, e), y = tu_load(oc, SK_DTYPE_BF16, e);
                    bad += !(fabs(x - y) <= 8.0 * 0x1.0p-8 * vmax + 1e-3);
                }
                for (int64_t e = 0; e < nl; ++e)
                    bad += !(fabs((double)lse[e] - (double)lsec[e]) <= 1e-3 * (1.0 + fabs((double)lsec[e])) ||
                             (isinf(lse[e]) && isinf(lsec[e])));
                CHECK(bad == 0, "%s: %lld O/LSE values far from the CPU backend", name,
                      (long long)bad);
            }
            tk_layout_buf_free(&lc);
        }
    }
    gpu_layout_free(&g);
    free(o), free(o2), free(oc), free(lse), free(lse2), free(lsec), free(scores);
    gt_device_free(dq), gt_device_free(dk), gt_device_free(dv), gt_device_free(d_o);
    gt_device_free(d_o2), gt_device_free(dl), gt_device_free(dl2), gt_device_free(doff);
    gt_device_free(didx), gt_device_free(ws);
    tk_problem_free(&t);
    return ok;
}

SK_TEST(topk_gpu_attention_topk_end_to_end) {
    const uint64_t s = tu_base_seed() ^ 0x5000;
    int ran = 0, n = 0;
    ran += gpu_attention_case(1, 1024, 1024, 4, 2, 64, 64, 0, 1, s + 1), ++n;
    ran += gpu_attention_case(2, 768, 1024, 4, 2, 128, 128, 1, 1, s + 2), ++n;
    if (!gt_opt.quick) {
        ran += gpu_attention_case(1, 1000, 1333, 4, 4, 128, 128, 0, 0, s + 3), ++n;
        ran += gpu_attention_case(1, 2048, 2048, 8, 2, 128, 64, 1, 1, s + 4), ++n;
    }
    CHECK(ran == n, "%d of %d cases ran", ran, n);
}

/* ---------------------------------------------------------------------------
 * sk_pool_select_topk = sk_block_pool + sk_select_topk, bitwise
 * ------------------------------------------------------------------------- */

/* Downloads of one run: layout arrays and the scores at the workspace's
 * start (both calls keep them there). */
typedef struct ps_run {
    int32_t *off, *idx;
    float *scores;
} ps_run;

/* Scores of sk_pool_select_topk (`got`) against the two-call chain's
 * (`ref`): bit for bit on the blocks a row may pick by score. Where the
 * query row block lies outside the score span (sk_topk_score_span, by brute
 * force here), every candidate's score must be exactly 0: the pooling did not
 * read those Q blocks (with `unread_nan` they hold NaN, which a read would
 * carry into the scores). Returns the mismatches. */
static int pool_select_scores_differ(const tk_problem *t, const float *got, const float *ref) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    const int64_t slices = tk_total_rows(t) / rb;
    int32_t span_r[2], span_c[2];
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL || !tk_score_span_naive(t, span_r, span_c)) {
        free(cand), free(forced);
        return 1;
    }
    int bad = 0;
    for (int32_t i = 0; i < rb; ++i) {
        tk_row_sets(t, i, cand, forced);
        const int row_read = i >= span_r[0] && i < span_r[1];
        for (int64_t s = 0; s < slices; ++s)
            for (int32_t j = 0; j < cb; ++j) {
                const int64_t e = (s * rb + i) * cb + j;
                const int pickable = tk_pickable(t, cand, forced, j);
                int ok = 1;
                if (pickable)
                    ok = memcmp(&got[e], &ref[e], 4) == 0;
                else if (!row_read && cand[j])
                    ok = got[e] == 0.f;
                if (!ok && bad++ < 3)
                    printf("    score[slice %lld, %d, %d] = %.9g, two calls %.9g (%s)\n",
                           (long long)s, (int)i, (int)j, (double)got[e], (double)ref[e],
                           pickable ? "pickable" : "row not pooled: 0");
            }
    }
    free(cand), free(forced);
    return bad;
}

/* Every token of block blk of Q (is_k 0) or K, in every batch and head,
 * set to NaN. */
static void set_block_nan(tk_problem *t, const sel_cfg *c, int is_k, int32_t blk) {
    const int64_t bs = is_k ? c->bk : c->bq, seq = is_k ? c->sk : c->sq;
    const int64_t heads = is_k ? c->hkv : c->hq, *st = is_k ? t->ks : t->qs;
    const int64_t end = (blk + 1) * bs < seq ? (blk + 1) * bs : seq;
    void *x = is_k ? t->k : t->q;
    for (int64_t b = 0; b < c->b; ++b)
        for (int64_t tok = blk * bs; tok < end; ++tok)
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t e = 0; e < c->d; ++e)
                    tu_store(x, SK_DTYPE_BF16, b * st[0] + tok * st[1] + h * st[2] + e, NAN);
}

/* bad_row >= 0: one token of head 0 in query row block bad_row is `bad`.
 * NaN: that row's scores are NaN and it comes out short (the compaction
 * path). +inf: that row's scores are +-inf or NaN as the fp32 dot product
 * gives them, both where the pooling splits the operands and in the
 * two-call chain. unread_nan: every token of the Q and K blocks outside the
 * score span is NaN; the layout must not change, and sk_pool_select_topk
 * must not read them (pool_select_scores_differ). Every case checks the
 * pickable scores against the naive ones from the pooled blocks of
 * sk_block_pool (tk_check_scores_ex: within the tolerance, or the same inf /
 * NaN). */
static int gpu_pool_select_case(const sel_cfg *c, int32_t bad_row, float bad, int unread_nan,
                                uint64_t seed) {
    tk_problem t;
    sel_problem_init(&t, c);
    char name[200];
    tk_describe(&t, name, sizeof name);
    printf("    %s, row %d token %g, seed %llu\n", name, (int)bad_row, (double)bad,
           (unsigned long long)seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    if (!tk_problem_alloc_host(&t, &rng, c->quant ? TK_QUANT : 0)) return 0;
    if (bad_row >= 0) /* head 0, the row block's first token, dim 0 */
        tu_store(t.q, SK_DTYPE_BF16, (int64_t)bad_row * c->bq * t.qs[1], bad);
    int unread = 0; /* Q and K blocks outside the span */
    if (unread_nan) {
        int32_t sr[2], sc[2];
        if (!tk_score_span_naive(&t, sr, sc)) {
            tk_problem_free(&t);
            return 0;
        }
        for (int is_k = 0; is_k < 2; ++is_k) {
            const int32_t blocks = is_k ? tk_col_blocks(&t) : tk_row_blocks(&t);
            const int32_t *span = is_k ? sc : sr;
            for (int32_t blk = 0; blk < blocks; ++blk)
                if (blk < span[0] || blk >= span[1]) {
                    set_block_nan(&t, c, is_k, blk);
                    ++unread;
                }
        }
        printf("    %d blocks outside the score span set to NaN\n", unread);
        CHECK(unread > 0, "no block outside the span: the case tests nothing");
    }
    int32_t cap = 0;
    size_t ws_sel = 0, ws_ps = 0;
    if (sk_topk_layout_capacity(&t.desc, NULL, &cap) != SK_STATUS_SUCCESS ||
        sk_topk_workspace_size(&t.desc, &ws_sel) != SK_STATUS_SUCCESS ||
        sk_pool_select_topk_workspace_size(&t.desc, &ws_ps) != SK_STATUS_SUCCESS) {
        printf("    %s: %s\n", name, sk_last_error());
        tk_problem_free(&t);
        return 0;
    }
    const int32_t rows = tk_total_rows(&t);
    const size_t off_bytes = ((size_t)rows + 1) * 4, idx_bytes = (size_t)cap * 4 + 64;
    const size_t score_bytes = (size_t)rows * tk_col_blocks(&t) * 4;
    void *dq = to_device(t.q, (size_t)t.q_span * 2), *dk = to_device(t.k, (size_t)t.k_span * 2);
    float *dpq = (float *)gt_device_alloc((size_t)tk_pooled_q_len(&t) * 4);
    float *dpk = (float *)gt_device_alloc((size_t)tk_pooled_k_len(&t) * 4);
    int32_t *doff = (int32_t *)gt_device_alloc(off_bytes), *didx = (int32_t *)gt_device_alloc(idx_bytes);
    void *ws1 = gt_device_alloc(ws_sel), *ws2 = gt_device_alloc(ws_ps);
    ps_run r[3]; /* two calls, then sk_pool_select_topk twice */
    int ok = dq && dk && dpq && dpk && doff && didx && ws1 && ws2;
    for (int i = 0; i < 3; ++i) {
        r[i].off = (int32_t *)malloc(off_bytes);
        r[i].idx = (int32_t *)malloc(idx_bytes);
        r[i].scores = (float *)malloc(score_bytes);
        ok = ok && r[i].off && r[i].idx && r[i].scores;
    }
    for (int i = 0; ok && i < 3; ++i) {
        void *ws = i == 0 ? ws1 : ws2;
        poison(doff, off_bytes);
        poison(didx, idx_bytes);
        poison(ws, i == 0 ? ws_sel : ws_ps);
        sk_bsr l;
        memset(&l, 0x5c, sizeof l);
        l.row_offsets = doff;
        l.col_indices = didx;
        sk_status st;
        if (i == 0) {
            st = sk_block_pool(&t.desc, dq, dk, dpq, dpk, NULL);
            if (st == SK_STATUS_SUCCESS)
                st = sk_select_topk(&t.desc, dpq, dpk, &l, ws1, ws_sel, NULL);
        } else {
            st = sk_pool_select_topk(&t.desc, dq, dk, &l, ws2, ws_ps, NULL);
        }
        CHECK(st == SK_STATUS_SUCCESS, "%s: run %d: %s", name, i, sk_last_error());
        ok = st == SK_STATUS_SUCCESS && l.nnz == cap && gt_sync() == 0 &&
             gt_download(r[i].off, doff, off_bytes) == 0 &&
             gt_download(r[i].idx, didx, idx_bytes) == 0 &&
             gt_download(r[i].scores, ws, score_bytes) == 0;
    }
    if (ok) {
        const int32_t n = r[0].off[rows];
        CHECK(n >= 0 && n <= cap, "%s: count %d outside [0, %d]", name, (int)n, (int)cap);
        ok = n >= 0 && n <= cap;
        if (bad_row >= 0 && isnan(bad))
            CHECK(n < cap, "%s: the NaN row did not come out short", name);
        for (int i = 1; ok && i < 3; ++i) {
            const int same =
                memcmp(r[i].off, r[0].off, off_bytes) == 0 &&
                memcmp(r[i].idx, r[0].idx, (size_t)n * 4) == 0 &&
                (i == 2 ? memcmp(r[2].scores, r[1].scores, score_bytes) == 0
                        : pool_select_scores_differ(&t, r[1].scores, r[0].scores) == 0);
            CHECK(same, "%s: sk_pool_select_topk (run %d) differs from %s", name, i,
                  i == 2 ? "its first run" : "pool + select");
            ok = same;
            for (int32_t e = cap; ok && e < cap + 16; ++e)
                if (r[i].idx[e] != -1) {
                    CHECK(0, "%s: col_indices[%d] written past the capacity", name, (int)e);
                    ok = 0;
                }
        }
        if (ok) {
            gpu_layout g = {rows, cap, cap, r[1].off, r[1].idx};
            ok = same_as_cpu_selection(&t, r[1].scores, &g, name);
            CHECK(ok, "%s: layout is not the CPU selection on the GPU scores", name);
        }
        if (ok) {
            const size_t pq_bytes = (size_t)tk_pooled_q_len(&t) * 4;
            const size_t pk_bytes = (size_t)tk_pooled_k_len(&t) * 4;
            float *pq = (float *)malloc(pq_bytes), *pk = (float *)malloc(pk_bytes);
            ok = pq != NULL && pk != NULL && gt_download(pq, dpq, pq_bytes) == 0 &&
                 gt_download(pk, dpk, pk_bytes) == 0;
            const int wrong =
                ok ? tk_check_scores_ex(&t, pq, pk, r[1].scores, 1.0, TK_SCORES_PICKABLE) : 1;
            CHECK(wrong == 0, "%s: %d GPU scores off the naive ones", name, wrong);
            ok = ok && wrong == 0;
            free(pq), free(pk);
        }
    }
    for (int i = 0; i < 3; ++i) free(r[i].off), free(r[i].idx), free(r[i].scores);
    gt_device_free(dq), gt_device_free(dk), gt_device_free(dpq), gt_device_free(dpk);
    gt_device_free(doff), gt_device_free(didx), gt_device_free(ws1), gt_device_free(ws2);
    tk_problem_free(&t);
    return ok;
}

/* On a 9.0 device with D = 64 or 128 and no group sums the pooling writes
 * the split operands itself: the layout and the pickable scores must equal
 * the two-call chain's bit for bit. The other cases (D = 96, group sums, the
 * portable backend) take the two-call chain inside and are checked the same
 * way. Either way the blocks outside the score span are not read. */
SK_TEST(topk_gpu_pool_select_matches_two_calls) {
    /* b sq sk hq hkv d | bq bk k sinks local | causal per_kv quant */
    static const sel_cfg cfgs[] = {
        {2, 1000, 1333, 4, 2, 128, 128, 128, 3, 1, 2, 1, 0, 0},  /* tails, GQA per query head */
        {1, 2048, 2048, 2, 2, 64, 64, 64, 5, 0, 0, 0, 0, 1},     /* D 64, blocks 64, ties */
        {1, 4096, 4096, 4, 4, 128, 128, 128, 16, 2, 8, 1, 1, 0}, /* per KV head, group 1 */
        {1, 700, 900, 2, 2, 96, 128, 128, 4, 1, 1, 1, 0, 0},     /* D 96: two-call chain */
        {1, 2048, 2048, 4, 2, 64, 128, 128, 6, 1, 2, 1, 1, 1},   /* group sums */
        {1, 8192, 8192, 2, 1, 64, 128, 128, 40, 1, 2, 1, 0, 0},  /* k > 32: general kernel */
    };
    const int n = (int)(sizeof cfgs / sizeof cfgs[0]);
    int ran = 0, runs = 0;
    for (int i = 0; i < n; ++i, ++runs)
        ran += gpu_pool_select_case(&cfgs[i], -1, 0.f, 0, tu_base_seed() ^ (0x6000u + (unsigned)i));
    /* A NaN query block: that row comes out short, the placement compacts. */
    ran += gpu_pool_select_case(&cfgs[0], 5, NAN, 0, tu_base_seed() ^ 0x6100u), ++runs;
    ran += gpu_pool_select_case(&cfgs[2], 20, NAN, 0, tu_base_seed() ^ 0x6101u), ++runs;
    /* A +inf query token: its row's scores are +-inf or NaN as in fp32. */
    ran += gpu_pool_select_case(&cfgs[0], 5, INFINITY, 0, tu_base_seed() ^ 0x6102u), ++runs;
    ran += gpu_pool_select_case(&cfgs[1], 20, INFINITY, 0, tu_base_seed() ^ 0x6103u), ++runs;
    /* NaN in every block outside the score span: Q and K split by the
     * pooling (cfgs[2]), fp32 pooled blocks (cfgs[3]), group sums (cfgs[4]). */
    for (int i = 2; i <= 4; ++i, ++runs)
        ran += gpu_pool_select_case(&cfgs[i], -1, 0.f, 1, tu_base_seed() ^ (0x6200u + (unsigned)i));
    CHECK(ran == runs, "%d of %d cases ran", ran, runs);
}
