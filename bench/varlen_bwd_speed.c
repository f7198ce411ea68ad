/*
 * varlen_bwd_speed.c - timing of the CUDA varlen attention backward (issue
 * 30) against the fixed-batch backward on the same number of tokens
 * (docs/perf/varlen_paged.md, "Varlen backward").
 *
 * Build (after `make -j2 all`):  make build/varlen_bwd_speed
 * Run:
 *   build/varlen_bwd_speed [--backend cuda|sm80|sm90] [--reps 10]
 * Rows (32768 tokens, Hq 32 over Hkv 8, D 128, bf16, 128 x 128 blocks,
 * causal (bottom-right per sequence), one layout slice for all heads):
 *   fixed         B = 8 x 4096, the fixed backward on --backend (on an
 *                 H100, --backend cuda may run the Hopper backward kernels)
 *   fixed_sm80    the same on the portable kernels (the varlen backward's
 *                 own family: its fair baseline)
 *   varlen_equal  8 sequences of 4096: the fixed rows' exact work, in the
 *                 varlen form (what the varlen mode costs)
 *   varlen_mixed  8 sequences of 8000, 6200, 5100, 4133, 3600, 2535, 1700,
 *                 1500 tokens (tails in every sequence, sum 32768)
 * Each row: the forward of its form once (O and LSE), then the backward
 * plan and run each timed with CUDA events over `reps` calls after 2
 * warm-up calls, median and minimum. TFLOPS count 2.5 x 4 D bq bk per
 * selected block and query head (partial tail blocks counted whole). A
 * sample of dQ, dK, dV must be finite (exit 1 otherwise). One JSON object
 * on stdout.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsek.h"

#define BENCH_ERROR_EXIT 2 /* 1 is a failed result check */
#include "bench_check.h"
#include "bench_timing.h"
#include "host_data.h"
#include "bench_device.h"

enum { WARMUP = 2, PATTERN = 1 << 24, SAMPLE = 1 << 20, BLOCK = 128, B = 8 };
enum { HQ = 32, HKV = 8, DIM = 128, TOKENS = 32768 };

static int g_reps = 10;
static sk_backend g_backend = SK_BACKEND_CUDA;
static void *g_pattern;

/* One row: the sequences (fixed: B equal ones as one batch). */
typedef struct row {
    const char *name;
    int fixed, sm80;
    int32_t len[B];
} row;

/* What a timed call needs. */
typedef struct ctx {
    int fixed, plan;
    const sk_attention_desc *d;
    const sk_attention_backward_desc *bd;
    const sk_attention_varlen_desc *vd;
    const sk_attention_varlen_backward_desc *vbd;
    const sk_bsr *layout;
    const int32_t *cu;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *ws;
    float *lse;
    size_t ws_bytes;
} ctx;

static void call(const void *p) {
    const ctx *c = (const ctx *)p;
    if (c->fixed && c->plan)
        SK_OK(sk_attention_backward_plan(c->d, c->bd, c->layout, c->ws, c->ws_bytes, NULL));
    else if (c->fixed)
        SK_OK(sk_attention_backward_run(c->d, c->bd, c->layout, c->q, c->k, c->v, c->o, c->dout,
                                        c->lse, c->dq, c->dk, c->dv, c->ws, c->ws_bytes, NULL));
    else if (c->plan)
        SK_OK(sk_attention_varlen_backward_plan(c->vd, c->vbd, c->layout, c->cu, c->cu, c->ws,
                                                c->ws_bytes, NULL));
    else
        SK_OK(sk_attention_varlen_backward_run(c->vd, c->vbd, c->layout, c->cu, c->cu, c->q, c->k,
                                               c->v, c->o, c->dout, c->lse, c->dq, c->dk, c->dv,
                                               c->ws, c->ws_bytes, NULL));
}

/* Time one row; prints its JSON member (comma first unless first). */
static int run(const row *r, int first) {
    const sk_backend backend = r->sm80 ? SK_BACKEND_CUDA_SM80 : g_backend;
    int32_t cu[B + 1], max_len = 1;
    cu[0] = 0;
    for (int b = 0; b < B; ++b) {
        cu[b + 1] = cu[b] + r->len[b];
        if (r->len[b] > max_len) max_len = r->len[b];
    }
    const int64_t total = cu[B], nq = total * HQ * DIM, nk = total * HKV * DIM;
    sk_layout_t host;
    if (r->fixed) {
        const sk_grid g = {r->len[0], r->len[0], BLOCK, BLOCK, B, 1};
        SK_OK(sk_layout_create_causal(&host, &g));
    } else {
        const sk_varlen_grid vg = {B, BLOCK, BLOCK, 1, cu, cu};
        SK_OK(sk_layout_create_varlen_causal(&host, &vg));
    }
    sk_bsr hl;
    SK_OK(sk_layout_view(host, &hl));
    sk_bsr layout = bench_bsr_to_device(&hl);
    ctx c;
    memset(&c, 0, sizeof c);
    c.fixed = r->fixed;
    c.layout = &layout;
    void **bufs[8] = {&c.q, &c.o, &c.dout, &c.dq, &c.k, &c.v, &c.dk, &c.dv};
    for (int i = 0; i < 8; ++i) CUDA_OK(cudaMalloc(bufs[i], (size_t)(i < 4 ? nq : nk) * 2));
    CUDA_OK(cudaMalloc((void **)&c.lse, (size_t)(HQ * total) * 4));
    int32_t *dcu;
    CUDA_OK(cudaMalloc((void **)&dcu, sizeof cu));
    CUDA_OK(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice));
    c.cu = dcu;
    bench_fill_pattern(c.q, g_pattern, PATTERN, nq, 0);
    bench_fill_pattern(c.dout, g_pattern, PATTERN, nq, 12345);
    bench_fill_pattern(c.k, g_pattern, PATTERN, nk, 777);
    bench_fill_pattern(c.v, g_pattern, PATTERN, nk, 4242);

    sk_attention_desc d;
    sk_attention_backward_desc bd;
    sk_attention_varlen_desc vd;
    sk_attention_varlen_backward_desc vbd;
    void *fws = NULL;
    size_t fws_bytes = 0;
    if (r->fixed) {
        SK_OK(sk_attention_desc_init(&d, sizeof d));
        SK_OK(sk_attention_backward_desc_init(&bd, sizeof bd));
        d.backend = backend;
        d.dtype = SK_DTYPE_BF16;
        d.batch = B;
        d.seq_q = d.seq_k = r->len[0];
        d.heads_q = HQ;
        d.heads_kv = HKV;
        d.head_dim = DIM;
        d.mask = SK_MASK_CAUSAL;
        c.d = &d;
        c.bd = &bd;
        SK_OK(sk_attention_workspace_size(&d, &layout, &fws_bytes));
        CUDA_OK(cudaMalloc(&fws, fws_bytes));
        SK_OK(sk_attention_forward(&d, &layout, c.q, c.k, c.v, c.o, c.lse, fws, fws_bytes, NULL));
        SK_OK(sk_attention_backward_workspace_size(&d, &bd, &layout, &c.ws_bytes));
    } else {
        SK_OK(sk_attention_varlen_desc_init(&vd, sizeof vd));
        SK_OK(sk_attention_varlen_backward_desc_init(&vbd, sizeof vbd));
        vd.backend = backend;
        vd.dtype = SK_DTYPE_BF16;
        vd.batch = B;
        vd.total_q = vd.total_k = total;
        vd.max_seqlen_q = vd.max_seqlen_k = max_len;
        vd.heads_q = HQ;
        vd.heads_kv = HKV;
        vd.head_dim = DIM;
        vd.mask = SK_MASK_CAUSAL;
        c.vd = &vd;
        c.vbd = &vbd;
        SK_OK(sk_attention_varlen_workspace_size(&vd, &layout, &fws_bytes));
        CUDA_OK(cudaMalloc(&fws, fws_bytes));
        SK_OK(sk_attention_varlen_forward(&vd, &layout, dcu, dcu, c.q, c.k, c.v, c.o, c.lse, fws,
                                          fws_bytes, NULL));
        SK_OK(sk_attention_varlen_backward_workspace_size(&vd, &vbd, &layout, &c.ws_bytes));
    }
    CUDA_OK(cudaMalloc(&c.ws, c.ws_bytes));
    float plan_med, plan_min, med, best;
    c.plan = 1;
    bench_time(call, &c, WARMUP, g_reps, &plan_med, &plan_min);
    c.plan = 0;
    bench_time(call, &c, WARMUP, g_reps, &med, &best);
    CUDA_OK(cudaDeviceSynchronize());
    const int64_t bad = bench_non_finite(c.dq, nq, SAMPLE, SK_DTYPE_BF16) +
                        bench_non_finite(c.dk, nk, SAMPLE, SK_DTYPE_BF16) +
                        bench_non_finite(c.dv, nk, SAMPLE, SK_DTYPE_BF16);
    const double flops = 2.5 * 4.0 * DIM * BLOCK * BLOCK * (double)hl.nnz * HQ;
    printf("%s\"%s\": {\"backend\": \"%s\", \"lengths\": [%d, %d, %d, %d, %d, %d, %d, %d], "
           "\"selected_blocks\": %d, \"bwd_plan_ms\": %.4f, \"bwd_ms\": %.4f, "
           "\"bwd_min_ms\": %.4f, \"bwd_tflops\": %.1f, \"non_finite_in_sample\": %lld}",
           first ? "" : ", ", r->name, r->sm80 ? "sm80" : "as --backend", r->len[0], r->len[1],
           r->len[2], r->len[3], r->len[4], r->len[5], r->len[6], r->len[7], (int)hl.nnz, plan_med,
           med, best, flops / med * 1e-9, (long long)bad);
    fflush(stdout);
    for (int i = 0; i < 8; ++i) CUDA_OK(cudaFree(*bufs[i]));
    CUDA_OK(cudaFree(c.lse));
    CUDA_OK(cudaFree(c.ws));
    CUDA_OK(cudaFree(fws));
    CUDA_OK(cudaFree(dcu));
    bench_bsr_free(&layout);
    sk_layout_destroy(host);
    return bad != 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0) {
            g_reps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--backend") == 0) {
            g_backend = strcmp(argv[i + 1], "sm80") == 0   ? SK_BACKEND_CUDA_SM80
                        : strcmp(argv[i + 1], "sm90") == 0 ? SK_BACKEND_CUDA_SM90
                                                           : SK_BACKEND_CUDA;
        } else {
            fprintf(stderr, "usage: see the header of bench/varlen_bwd_speed.c\n");
            return BENCH_ERROR_EXIT;
        }
    }
    if (g_reps < 1 || g_reps > BENCH_MAX_REPS) g_reps = 10;
    g_pattern = bench_device_pattern(SK_DTYPE_BF16, PATTERN, 30);
    if (g_pattern == NULL) return BENCH_ERROR_EXIT;
    static const row rows[4] = {
        {"fixed", 1, 0, {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096}},
        {"fixed_sm80", 1, 1, {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096}},
        {"varlen_equal", 0, 0, {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096}},
        {"varlen_mixed", 0, 0, {8000, 6200, 5100, 4133, 3600, 2535, 1700, 1500}}};
    sk_device_info info;
    SK_OK(sk_device_get_info(0, &info));
    printf("{\"gpu\": \"%s\", \"tokens\": %d, \"heads\": %d, \"heads_kv\": %d, \"dim\": %d, "
           "\"block\": %d, \"causal\": 1, \"dtype\": \"bf16\", \"reps\": %d, \"rows\": {",
           info.name, TOKENS, HQ, HKV, DIM, BLOCK, g_reps);
    int failed = 0;
    for (int i = 0; i < 4; ++i) failed |= run(&rows[i], i == 0);
    printf("}}\n");
    return failed;
}
