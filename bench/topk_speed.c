/*
 * topk_speed.c - timing of the dynamic top-k selection against the attention
 * it feeds (issue 7's speed target).
 *
 * Build: make build/topk_speed
 * Run:
 *   build/topk_speed --bench-topk [--commit HASH] [--reps N] [--small] [--config NAME]
 *                    [--overlap-chunks N]
 *
 * Per configuration (default: the B1 H32 S128K D128 bf16, Hkv 32,
 * blocks 128, k 16, 2 sink blocks, local window 8 blocks, causal):
 *   1. Q and K filled with fresh random bf16 values from the host (no
 *      repetition: a periodic fill would make pooled blocks, hence scores,
 *      repeat exactly, an adversarial tie pattern), V from a repeated 64 MB
 *      random pattern; one
 *      sk_attention_topk checked: every row count equals its bound (finite
 *      scores), the layout validates on the host.
 *   2. Timed with CUDA events, 3 warm-up calls then the median (and minimum)
 *      of N calls (default 20), each region alone on the stream:
 *        pool       sk_block_pool
 *        select     sk_select_topk (scores + selection + offsets); also with
 *                   the backend SK_BACKEND_CUDA_SM80 (portable fp32 SIMT
 *                   scoring) as select_portable_us
 *        from_scores  sk_layout_from_scores on select's scores (selection
 *                   alone; select - from_scores is the scoring)
 *        selection  pool + select
 *        pool_select  sk_pool_select_topk: the same layout in one call, the
 *                   selection that sk_attention_topk runs (on Hopper with
 *                   D 64 / 128 the pooling writes the scoring's split
 *                   operands)
 *        attention  sk_attention_forward (plan + run) on the selected layout,
 *                   for SK_BACKEND_CUDA (the library's choice) and, for the
 *                   record, the forced SM80 and SM90 kernels where supported
 *        topk       sk_attention_topk (everything)
 *      Each call above starts from an idle stream, so its time includes the
 *      host's time to its first kernel (~16 us on the lent H200s: the start
 *      event's record, the library's checks, the launch call and the
 *      kernel's start; a CUPTI trace, docs/perf/topk_log.md step 14). Then
 *      selection, pool_select, attention and topk again per call, each
 *      enqueued behind a host function that holds the stream until the call
 *      and its end event are enqueued (held_*_us: the GPU's time only, as
 *      nvbench's blocking kernel does). Then selection, pool_select and
 *      attention again, `reps` calls enqueued back to back (pipelined_*_us:
 *      the mean per call, no host launch gap timed), and each call's host
 *      enqueue time from an idle stream (host_enqueue_*_us), which the
 *      per-call timings above include up to the call's first launch.
 *   3. One JSON object per configuration on stdout, with
 *        selection_over_attention = selection / attention
 *        pool_select_over_attention = pool_select / attention (target <= 0.05:
 *                   the selection that feeds sk_attention_topk's attention)
 *        held_pool_select_over_attention = the same on GPU time (held_*)
 *        held_rate_vs_attention_only = held attention / held topk
 *        rate_vs_attention_only   = attention / topk        (target >= 0.90)
 *      and the attention's TFLOPS over the selected blocks (4 D bq bk per
 *      block, causal masking inside the diagonal block not discounted).
 * Every input is several GB, far beyond L2, so one set of inputs suffices.
 * --overlap-chunks N adds one more JSON object per configuration: the
 * two-stream probe of step 7 in docs/perf/topk_log.md (time_overlap below).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sparsek.h"

#include "bench_check.h"
#include "host_data.h"

enum { WARMUP = 3, PATTERN_ELEMS = 32 << 20 };

static int overlap_chunks; /* --overlap-chunks N: time_overlap after each configuration */

typedef struct cfg {
    const char *name;
    int64_t b, hq, hkv, s, d;
    int32_t block, k, sinks, local, per_kv;
} cfg;

static const cfg configs[] = {
    {"issue7_b1_h32_s128k_d128_bf16_k16", 1, 32, 32, 131072, 128, 128, 16, 2, 8, 0},
    {"b1_h32_s128k_d128_bf16_k16_block64", 1, 32, 32, 131072, 128, 64, 16, 2, 8, 0},
    {"b1_h32_hkv8_s128k_d128_bf16_k16_per_kv_head", 1, 32, 8, 131072, 128, 128, 16, 2, 8, 1},
    {"small_b1_h8_s16k_d128_bf16_k16", 1, 8, 8, 16384, 128, 128, 16, 2, 8, 0},
};

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Sorts the n timings (ms) and returns their median in microseconds. */
static double sorted_median_us(float *ms, int n) {
    qsort(ms, (size_t)n, sizeof(float), cmp_float);
    return 1000.0 * (n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]));
}

typedef enum region {
    R_POOL,
    R_SELECT,
    R_FROM_SCORES,
    R_SELECTION,
    R_ATTENTION,
    R_TOPK,
    R_POOL_SELECT
} region;

typedef struct bench_ctx {
    sk_topk_desc topk;
    sk_attention_desc attn;
    void *q, *k, *v, *o;
    float *lse, *pq, *pk;
    sk_bsr layout;
    void *ws_topk, *ws_attn, *ws_all, *ws_fs;
    size_t ws_topk_bytes, ws_attn_bytes, ws_all_bytes;
} bench_ctx;

static sk_status run_region(bench_ctx *c, region r, const sk_attention_desc *attn) {
    switch (r) {
    case R_POOL:
        return sk_block_pool(&c->topk, c->q, c->k, c->pq, c->pk, NULL);
    case R_SELECT:
        return sk_select_topk(&c->topk, c->pq, c->pk, &c->layout, c->ws_topk, c->ws_topk_bytes,
                              NULL);
    case R_FROM_SCORES:
        return sk_layout_from_scores(&c->topk, (const float *)c->ws_topk, &c->layout, c->ws_fs,
                                     c->ws_topk_bytes, NULL);
    case R_SELECTION: {
        sk_status st = sk_block_pool(&c->topk, c->q, c->k, c->pq, c->pk, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
        return sk_select_topk(&c->topk, c->pq, c->pk, &c->layout, c->ws_topk, c->ws_topk_bytes,
                              NULL);
    }
    case R_ATTENTION:
        return sk_attention_forward(attn, &c->layout, c->q, c->k, c->v, c->o, c->lse, c->ws_attn,
                                    c->ws_attn_bytes, NULL);
    case R_TOPK:
        return sk_attention_topk(attn, &c->topk, c->q, c->k, c->v, c->o, c->lse, &c->layout,
                                 c->ws_all, c->ws_all_bytes, NULL);
    case R_POOL_SELECT: /* the selection of sk_attention_topk: its workspace's first part */
        return sk_pool_select_topk(&c->topk, c->q, c->k, &c->layout, c->ws_all, c->ws_all_bytes,
                                   NULL);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

/* The region as a pipeline sees it: `reps` calls enqueued back to back
 * between two events (the host runs ahead, so no launch gap is timed), the
 * mean per call; and the host time one call takes to enqueue from an idle
 * stream (median of `reps`), which the per-call timing of time_region
 * includes up to its first launch. */
static void time_pipelined(bench_ctx *c, region r, const sk_attention_desc *attn, int reps,
                           double *mean_us, double *enqueue_us) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int i = 0; i < WARMUP; ++i) SK_OK(run_region(c, r, attn));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaEventRecord(e0, NULL));
    for (int i = 0; i < reps; ++i) SK_OK(run_region(c, r, attn));
    CUDA_OK(cudaEventRecord(e1, NULL));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    *mean_us = 1000.0 * ms / reps;
    float *host = (float *)malloc((size_t)reps * sizeof(float));
    for (int i = 0; i < reps; ++i) {
        CUDA_OK(cudaDeviceSynchronize());
        const double t0 = now_us();
        SK_OK(run_region(c, r, attn));
        host[i] = (float)((now_us() - t0) / 1000.0);
    }
    CUDA_OK(cudaDeviceSynchronize());
    *enqueue_us = sorted_median_us(host, reps);
    free(host);
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
}

/* A host function that holds its stream until the host releases it: with it
 * ahead of the timed call, the call is wholly enqueued before its first
 * event runs, so that the timing holds the GPU's time only, not the host's
 * time to its first launch (the "blocking kernel" of nvbench). It makes no
 * CUDA call, as host functions must not. */
static volatile int hold_released;

static void CUDART_CB hold_stream(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&hold_released, __ATOMIC_ACQUIRE)) {
    }
}

/* Median and minimum in microseconds; -1 when the region is not supported.
 * held: each call enqueued behind hold_stream (GPU time only); else from an
 * idle stream, the host's time to the call's first launch included. */
static int time_region_mode(bench_ctx *c, region r, const sk_attention_desc *attn, int reps,
                            int held, double *median_us, double *min_us) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    float *ms = (float *)malloc((size_t)reps * sizeof(float));
    for (int i = 0; i < WARMUP; ++i) {
        sk_status st = run_region(c, r, attn);
        if (st == SK_STATUS_NOT_SUPPORTED || st == SK_STATUS_NOT_SUPPORTED_BACKEND) {
            fprintf(stderr, "  (not supported: %s)\n", sk_last_error());
            free(ms);
            return -1;
        }
        SK_OK(st);
    }
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < reps; ++i) {
        if (held) {
            __atomic_store_n(&hold_released, 0, __ATOMIC_RELEASE);
            CUDA_OK(cudaLaunchHostFunc(NULL, hold_stream, NULL));
        }
        CUDA_OK(cudaEventRecord(e0, NULL));
        SK_OK(run_region(c, r, attn));
        CUDA_OK(cudaEventRecord(e1, NULL));
        if (held) __atomic_store_n(&hold_released, 1, __ATOMIC_RELEASE);
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    *median_us = sorted_median_us(ms, reps);
    *min_us = 1000.0 * ms[0];
    free(ms);
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    return 0;
}

static int time_region(bench_ctx *c, region r, const sk_attention_desc *attn, int reps,
                       double *median_us, double *min_us) {
    return time_region_mode(c, r, attn, reps, 0, median_us, min_us);
}

/* Fill n bf16 elements by repeating a random pattern, starting at `shift`. */
static void fill(void *dst, const uint16_t *pattern_dev, int64_t n, int64_t shift) {
    for (int64_t off = 0; off < n; shift = 0) {
        const int64_t avail = PATTERN_ELEMS - shift;
        const int64_t len = n - off < avail ? n - off : avail;
        CUDA_OK(cudaMemcpy((uint16_t *)dst + off, pattern_dev + shift, (size_t)len * 2,
                           cudaMemcpyDeviceToDevice));
        off += len;
    }
}

/* n random bf16 values in +-[0.5, 1) (random sign and mantissa) to the device. */
static void fill_random(void *dst, int64_t n, uint64_t seed) {
    uint16_t *h = (uint16_t *)malloc((size_t)n * 2 + 8);
    if (h == NULL) {
        fprintf(stderr, "no host memory for %lld values\n", (long long)n);
        exit(1);
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i += 4) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        for (int e = 0; e < 4; ++e) h[i + e] = (uint16_t)(((s >> (16 * e)) & 0x807f) | 0x3f00);
    }
    CUDA_OK(cudaMemcpy(dst, h, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(h);
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes < 256 ? 256 : bytes));
    return p;
}

static void time_overlap(const bench_ctx *c, const cfg *f, int chunks, int reps,
                         const char *commit);

static void bench_config(const cfg *f, const char *commit, int reps, const sk_device_info *info,
                         const uint16_t *pattern) {
    bench_ctx c;
    memset(&c, 0, sizeof c);
    SK_OK(sk_topk_desc_init(&c.topk, sizeof c.topk));
    c.topk.backend = SK_BACKEND_CUDA;
    c.topk.dtype = SK_DTYPE_BF16;
    c.topk.batch = f->b;
    c.topk.seq_q = c.topk.seq_k = f->s;
    c.topk.heads_q = f->hq;
    c.topk.heads_kv = f->hkv;
    c.topk.head_dim = f->d;
    c.topk.block_q = c.topk.block_k = f->block;
    c.topk.k = f->k;
    c.topk.sink_blocks = f->sinks;
    c.topk.local_blocks = f->local;
    c.topk.mask = SK_MASK_CAUSAL;
    c.topk.per_kv_head = f->per_kv;
    SK_OK(sk_attention_desc_init(&c.attn, sizeof c.attn));
    c.attn.backend = SK_BACKEND_CUDA;
    c.attn.dtype = SK_DTYPE_BF16;
    c.attn.batch = f->b;
    c.attn.seq_q = c.attn.seq_k = f->s;
    c.attn.heads_q = f->hq;
    c.attn.heads_kv = f->hkv;
    c.attn.head_dim = f->d;
    c.attn.mask = SK_MASK_CAUSAL;

    const int64_t nq = f->b * f->s * f->hq * f->d, nk = f->b * f->s * f->hkv * f->d;
    c.q = dev_alloc((size_t)nq * 2);
    c.k = dev_alloc((size_t)nk * 2);
    c.v = dev_alloc((size_t)nk * 2);
    c.o = dev_alloc((size_t)nq * 2);
    c.lse = (float *)dev_alloc((size_t)(f->b * f->hq * f->s) * 4);
    fill_random(c.q, nq, 1);
    fill_random(c.k, nk, 2);
    fill(c.v, pattern, nk, 777777);
    sk_grid grid;
    int32_t cap = 0;
    SK_OK(sk_topk_layout_capacity(&c.topk, &grid, &cap));
    int32_t rb, cb, slices;
    SK_OK(sk_grid_blocks(&grid, &rb, &cb, &slices));
    const int32_t rows = slices * rb;
    c.layout.row_offsets = (int32_t *)dev_alloc(((size_t)rows + 1) * 4);
    c.layout.col_indices = (int32_t *)dev_alloc((size_t)cap * 4);
    c.pq = (float *)dev_alloc((size_t)(f->b * f->hq * rb * f->d) * 4);
    c.pk = (float *)dev_alloc((size_t)(f->b * f->hkv * cb * f->d) * 4);
    SK_OK(sk_topk_workspace_size(&c.topk, &c.ws_topk_bytes));
    SK_OK(sk_attention_topk_workspace_size(&c.attn, &c.topk, &c.ws_all_bytes));
    c.ws_topk = dev_alloc(c.ws_topk_bytes);
    c.ws_fs = dev_alloc(c.ws_topk_bytes);
    c.ws_all = dev_alloc(c.ws_all_bytes);

    /* One full call, then the layout's sanity on the host. */
    SK_OK(sk_attention_topk(&c.attn, &c.topk, c.q, c.k, c.v, c.o, c.lse, &c.layout, c.ws_all,
                            c.ws_all_bytes, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    SK_OK(sk_attention_workspace_size(&c.attn, &c.layout, &c.ws_attn_bytes));
    c.ws_attn = dev_alloc(c.ws_attn_bytes);
    int32_t *off = (int32_t *)malloc(((size_t)rows + 1) * 4);
    int32_t *idx = (int32_t *)malloc((size_t)cap * 4);
    CUDA_OK(cudaMemcpy(off, c.layout.row_offsets, ((size_t)rows + 1) * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(idx, c.layout.col_indices, (size_t)cap * 4, cudaMemcpyDeviceToHost));
    sk_bsr host = c.layout;
    host.row_offsets = off;
    host.col_indices = idx;
    host.nnz = off[rows];
    const sk_status valid = sk_layout_validate(&host);
    const int full = off[rows] == cap;
    fprintf(stderr, "%s: capacity %d, selected %d, layout %s\n", f->name, (int)cap, (int)off[rows],
            valid == SK_STATUS_SUCCESS ? "valid" : sk_last_error());
    const int64_t nnz_blocks = off[rows];
    free(off);
    free(idx);

    double med[7], mn[7];
    const region regions[7] = {R_POOL,  R_SELECT,      R_SELECTION,  R_ATTENTION,
                               R_TOPK,  R_FROM_SCORES, R_POOL_SELECT};
    for (int i = 0; i < 7; ++i)
        if (time_region(&c, regions[i], &c.attn, reps, &med[i], &mn[i]) != 0) med[i] = mn[i] = -1;
    /* Per call with the stream held until the call is enqueued (GPU time). */
    double held[4], held_min[4];
    const region held_regions[4] = {R_SELECTION, R_POOL_SELECT, R_ATTENTION, R_TOPK};
    for (int i = 0; i < 4; ++i)
        if (time_region_mode(&c, held_regions[i], &c.attn, reps, 1, &held[i], &held_min[i]) != 0)
            held[i] = held_min[i] = -1;
    /* Back to back, and the host's enqueue time per call. */
    double pipe_sel, pipe_ps, pipe_attn, host_sel, host_ps, host_attn;
    time_pipelined(&c, R_SELECTION, &c.attn, reps, &pipe_sel, &host_sel);
    time_pipelined(&c, R_POOL_SELECT, &c.attn, reps, &pipe_ps, &host_ps);
    time_pipelined(&c, R_ATTENTION, &c.attn, reps, &pipe_attn, &host_attn);

    /* The forced kernels, for the record. */
    double med80 = -1, min80 = -1, med90 = -1, min90 = -1;
    sk_attention_desc a80 = c.attn, a90 = c.attn;
    a80.backend = SK_BACKEND_CUDA_SM80;
    a90.backend = SK_BACKEND_CUDA_SM90;
    size_t need = 0;
    if (sk_attention_workspace_size(&a80, &c.layout, &need) == SK_STATUS_SUCCESS &&
        need <= c.ws_attn_bytes)
        time_region(&c, R_ATTENTION, &a80, reps, &med80, &min80);
    if (sk_attention_workspace_size(&a90, &c.layout, &need) == SK_STATUS_SUCCESS &&
        need <= c.ws_attn_bytes)
        time_region(&c, R_ATTENTION, &a90, reps, &med90, &min90);

    /* The selection with the portable kernels (fp32 SIMT scoring), for the
     * same-run comparison with the library's choice (Hopper scoring on 9.0). */
    double med_sel80 = -1, min_sel80 = -1;
    c.topk.backend = SK_BACKEND_CUDA_SM80;
    time_region(&c, R_SELECT, &c.attn, reps, &med_sel80, &min_sel80);
    c.topk.backend = SK_BACKEND_CUDA;

    /* Selected block pairs over all (batch, query head) rows. */
    const double head_factor = f->per_kv ? (double)(f->hq / f->hkv) : 1.0;
    const double flops = 4.0 * (double)f->d * f->block * f->block * (double)nnz_blocks * head_factor;
    const double dense_causal = 2.0 * (double)f->d * (double)f->s * (double)f->s * f->b * f->hq;
    const time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("{\"name\": \"%s\", \"commit\": \"%s\", \"gpu\": \"%s\", \"cc\": \"%d.%d\", "
           "\"date\": \"%s\", \"build\": \"%s\", "
           "\"batch\": %lld, \"heads_q\": %lld, \"heads_kv\": %lld, \"seq\": %lld, "
           "\"head_dim\": %lld, \"dtype\": \"bf16\", \"block\": %d, \"k\": %d, "
           "\"sink_blocks\": %d, \"local_blocks\": %d, \"causal\": true, \"per_kv_head\": %s, "
           "\"capacity\": %d, \"selected_blocks\": %lld, \"rows_full\": %s, \"layout_valid\": %s, "
           "\"reps\": %d, "
           "\"held_selection_us\": %.1f, \"held_pool_select_us\": %.1f, "
           "\"held_attention_us\": %.1f, \"held_topk_us\": %.1f, "
           "\"held_pool_select_over_attention\": %.4f, \"held_rate_vs_attention_only\": %.4f, "
           "\"pipelined_selection_us\": %.1f, \"pipelined_pool_select_us\": %.1f, "
           "\"pipelined_attention_us\": %.1f, \"pipelined_pool_select_over_attention\": %.4f, "
           "\"host_enqueue_selection_us\": %.1f, \"host_enqueue_pool_select_us\": %.1f, "
           "\"host_enqueue_attention_us\": %.1f, "
           "\"pool_us\": %.1f, \"select_us\": %.1f, \"selection_us\": %.1f, "
           "\"pool_select_us\": %.1f, \"min_pool_select_us\": %.1f, "
           "\"pool_select_over_attention\": %.4f, "
           "\"attention_us\": %.1f, \"attention_topk_us\": %.1f, \"from_scores_us\": %.1f, "
           "\"score_us_derived\": %.1f, "
           "\"min_selection_us\": %.1f, \"min_attention_us\": %.1f, \"min_attention_topk_us\": %.1f, "
           "\"attention_sm80_us\": %.1f, \"attention_sm90_us\": %.1f, \"select_portable_us\": %.1f, "
           "\"selection_over_attention\": %.4f, \"rate_vs_attention_only\": %.4f, "
           "\"attention_tflops_selected\": %.1f, \"attention_tflops_dense_causal_equiv\": %.1f, "
           "\"pool_gbps\": %.0f}\n",
           f->name, commit, info->name, (int)info->cc_major, (int)info->cc_minor, date,
           sk_build_info(), (long long)f->b, (long long)f->hq, (long long)f->hkv, (long long)f->s,
           (long long)f->d, (int)f->block, (int)f->k, (int)f->sinks, (int)f->local,
           f->per_kv ? "true" : "false", (int)cap, (long long)nnz_blocks, full ? "true" : "false",
           valid == SK_STATUS_SUCCESS ? "true" : "false", reps, held[0], held[1], held[2], held[3],
           held[1] / held[2], held[2] / held[3], pipe_sel, pipe_ps, pipe_attn,
           pipe_ps / pipe_attn, host_sel, host_ps, host_attn, med[0], med[1], med[2], med[6],
           mn[6], med[6] / med[3], med[3],
           med[4], med[5], med[1] - med[5], mn[2], mn[3], mn[4], med80, med90, med_sel80, med[2] / med[3], med[3] / med[4],
           flops / (med[3] * 1e6), dense_causal / (med[3] * 1e6),
           (double)(nq + nk) * 2.0 / (med[0] * 1e3));
    fflush(stdout);
    if (overlap_chunks > 0) time_overlap(&c, f, overlap_chunks, reps, commit);
    cudaFree(c.q), cudaFree(c.k), cudaFree(c.v), cudaFree(c.o), cudaFree(c.lse);
    cudaFree(c.layout.row_offsets), cudaFree(c.layout.col_indices), cudaFree(c.pq), cudaFree(c.pk);
    cudaFree(c.ws_topk), cudaFree(c.ws_attn), cudaFree(c.ws_all), cudaFree(c.ws_fs);
}

/* --overlap-chunks N (a measurement of step 7 in docs/perf/topk_log.md, not a
 * library path): the selection (pool + select) with the heads cut into N
 * parts, each a strided view of Q and K (B = 1, heads divisible by N). Two
 * timings, median of reps:
 *   chunked_us     the parts one after the other on one stream;
 *   overlapped_us  pools on a low-priority stream, each part's selection on
 *                  a high-priority stream once its pooling is done, so that
 *                  part c is scored and selected while part c + 1 is pooled.
 * Each part has its own layout arrays; the selections share one workspace
 * (they run in order on their stream). */
static void time_overlap(const bench_ctx *c, const cfg *f, int chunks, int reps,
                         const char *commit) {
    if (chunks < 1 || f->b != 1 || f->hq % chunks != 0 || f->hkv % chunks != 0 || f->per_kv) {
        fprintf(stderr, "%s: --overlap-chunks %d does not apply\n", f->name, chunks);
        return;
    }
    sk_topk_desc d = c->topk;
    d.heads_q = f->hq / chunks;
    d.heads_kv = f->hkv / chunks;
    const int64_t qs[3] = {f->s * f->hq * f->d, f->hq * f->d, 1 * f->d};
    const int64_t ks[3] = {f->s * f->hkv * f->d, f->hkv * f->d, 1 * f->d};
    memcpy(d.q_strides, qs, sizeof qs);
    memcpy(d.k_strides, ks, sizeof ks);
    sk_grid grid;
    int32_t cap = 0, rb, cb, slices;
    SK_OK(sk_topk_layout_capacity(&d, &grid, &cap));
    SK_OK(sk_grid_blocks(&grid, &rb, &cb, &slices));
    size_t ws_bytes = 0;
    SK_OK(sk_topk_workspace_size(&d, &ws_bytes));
    void *ws = dev_alloc(ws_bytes);
    sk_bsr *lay = (sk_bsr *)calloc((size_t)chunks, sizeof(sk_bsr));
    for (int i = 0; i < chunks; ++i) {
        lay[i] = c->layout;
        lay[i].row_offsets = (int32_t *)dev_alloc(((size_t)slices * rb + 1) * 4);
        lay[i].col_indices = (int32_t *)dev_alloc((size_t)cap * 4);
    }
    int least, greatest;
    CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s_pool, s_sel;
    CUDA_OK(cudaStreamCreateWithPriority(&s_pool, cudaStreamNonBlocking, least));
    CUDA_OK(cudaStreamCreateWithPriority(&s_sel, cudaStreamNonBlocking, greatest));
    cudaEvent_t e0, e1, *pooled = (cudaEvent_t *)malloc((size_t)chunks * sizeof(cudaEvent_t));
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int i = 0; i < chunks; ++i) CUDA_OK(cudaEventCreateWithFlags(&pooled[i], cudaEventDisableTiming));
    const int64_t hq = d.heads_q, hk = d.heads_kv;
    double med[2];
    float *ms = (float *)malloc((size_t)reps * sizeof(float));
    for (int mode = 0; mode < 2; ++mode) {
        cudaStream_t sel = mode == 0 ? s_pool : s_sel;
        for (int r = -WARMUP; r < reps; ++r) {
            CUDA_OK(cudaEventRecord(e0, s_pool));
            for (int i = 0; i < chunks; ++i) {
                const char *q = (const char *)c->q + (size_t)(i * hq * f->d) * 2;
                const char *k = (const char *)c->k + (size_t)(i * hk * f->d) * 2;
                float *pq = c->pq + (size_t)(i * hq * rb * f->d), *pk = c->pk + (size_t)(i * hk * cb * f->d);
                SK_OK(sk_block_pool(&d, q, k, pq, pk, s_pool));
                if (sel != s_pool) {
                    CUDA_OK(cudaEventRecord(pooled[i], s_pool));
                    CUDA_OK(cudaStreamWaitEvent(sel, pooled[i], 0));
                }
                SK_OK(sk_select_topk(&d, pq, pk, &lay[i], ws, ws_bytes, sel));
            }
            CUDA_OK(cudaEventRecord(e1, sel));
            CUDA_OK(cudaEventSynchronize(e1));
            if (r >= 0) CUDA_OK(cudaEventElapsedTime(&ms[r], e0, e1));
        }
        med[mode] = sorted_median_us(ms, reps);
    }
    /* The last part's layout, checked on the host. */
    int32_t *off = (int32_t *)malloc(((size_t)slices * rb + 1) * 4);
    int32_t *idx = (int32_t *)malloc((size_t)cap * 4);
    CUDA_OK(cudaMemcpy(off, lay[chunks - 1].row_offsets, ((size_t)slices * rb + 1) * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(idx, lay[chunks - 1].col_indices, (size_t)cap * 4, cudaMemcpyDeviceToHost));
    sk_bsr host = lay[chunks - 1];
    host.row_offsets = off;
    host.col_indices = idx;
    host.nnz = off[slices * rb];
    const int valid = sk_layout_validate(&host) == SK_STATUS_SUCCESS && host.nnz == cap;
    printf("{\"name\": \"%s\", \"commit\": \"%s\", \"overlap_chunks\": %d, \"reps\": %d, "
           "\"chunked_us\": %.1f, \"overlapped_us\": %.1f, \"last_part_layout_full_and_valid\": %s}\n",
           f->name, commit, chunks, reps, med[0], med[1], valid ? "true" : "false");
    fflush(stdout);
    free(off), free(idx), free(ms);
    for (int i = 0; i < chunks; ++i) {
        cudaFree(lay[i].row_offsets), cudaFree(lay[i].col_indices);
        cudaEventDestroy(pooled[i]);
    }
    free(lay), free(pooled);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaStreamDestroy(s_pool), cudaStreamDestroy(s_sel);
    cudaFree(ws);
}

int main(int argc, char **argv) {
    const char *commit = "unknown", *only = NULL;
    int reps = 20, bench = 0, small = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--bench-topk") == 0)
            bench = 1;
        else if (strcmp(argv[i], "--commit") == 0 && i + 1 < argc)
            commit = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--small") == 0)
            small = 1;
        else if (strcmp(argv[i], "--overlap-chunks") == 0 && i + 1 < argc)
            overlap_chunks = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: topk_speed --bench-topk [--commit HASH] [--reps N] "
                            "[--config NAME] [--small] [--overlap-chunks N]\n");
            return 2;
        }
    }
    if (!bench || reps < 1) {
        fprintf(stderr, "usage: topk_speed --bench-topk [--commit HASH] [--reps N] "
                        "[--config NAME] [--small] [--overlap-chunks N]\n");
        return 2;
    }
    int32_t count = 0;
    sk_device_count(&count);
    if (count < 1) {
        fprintf(stderr, "no CUDA device (%s)\n", sk_build_info());
        return 1;
    }
    sk_device_info info;
    SK_OK(sk_device_get_info(0, &info));
    fprintf(stderr, "device: %s (cc %d.%d, %d SMs); %s\n", info.name, (int)info.cc_major,
            (int)info.cc_minor, (int)info.sm_count, sk_build_info());

    /* V's random bf16 pattern, N(0, 1), from a fixed seed (V plays no part
     * in the selection, so its values do not change the layouts timed). */
    uint16_t *host = (uint16_t *)malloc((size_t)PATTERN_ELEMS * 2);
    host_fill_normal(host, SK_DTYPE_BF16, PATTERN_ELEMS, 1, 1);
    uint16_t *pattern = (uint16_t *)dev_alloc((size_t)PATTERN_ELEMS * 2);
    CUDA_OK(cudaMemcpy(pattern, host, (size_t)PATTERN_ELEMS * 2, cudaMemcpyHostToDevice));
    free(host);
    const int n = (int)(sizeof configs / sizeof configs[0]);
    for (int i = 0; i < n; ++i) {
        const int is_small = strncmp(configs[i].name, "small", 5) == 0;
        if (only != NULL ? strcmp(only, configs[i].name) != 0 : (small != is_small)) continue;
        bench_config(&configs[i], commit, reps, &info, pattern);
    }
    cudaFree(pattern);
    return 0;
}
