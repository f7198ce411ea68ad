/*
 * attention_fp8_speed.c - timing of the FP8 (e4m3) attention forward next to
 * the bf16 one on the same layout and inputs (issue 32), with the e4m3
 * quantizer and the FP8 output's error against the bf16 output.
 *
 * Build (after `make -j2 all`):  make build/attention_fp8_speed
 * Run:
 *   build/attention_fp8_speed [--batch 16] [--heads 96] [--heads-kv H] [--seq 4096]
 *                             [--pattern random|window] [--per-row K] [--window W]
 *                             [--causal] [--out bf16|f16] [--backend cuda|sm90] [--reps 10]
 *                             [--v-layout rows|vt|rows,vt] [--rounds 3]
 *                             [--block-q 128|64] [--block-k 128|64]
 * The rows:
 *   --batch 1 --heads 32 --seq 16384 (.. 131072) --pattern window --window 2048 --causal
 *   --batch 16 --heads 96 --seq 4096 --pattern random          (random 25 %, the default)
 * random: per_row = key blocks / 4 (default) per (batch, head), seeded;
 * window: sk_layout_create_window(left = W, right = 0), one slice broadcast.
 * D = 128, blocks 128 x 128 by default; --block-q / --block-k 64 build the
 * same pattern at other blocks (random: a quarter of the key blocks of
 * each row, so the same density; window: the same tokens), bf16 and FP8
 * alike (docs/perf/fp8.md, "Blocks of 64").
 * --v-layout: the FP8 variants timed, V as rows (the in-kernel transposer,
 * the default) and / or V^T from sk_quantize_e4m3's SK_QUANT_LAYOUT_VT_FP8
 * (sk_attention_desc v_layout; docs/perf/fp8.md "Round 4"). The variants
 * and bf16 are timed in `rounds` interleaved rounds of `reps` runs each
 * (bf16, rows, vt, bf16, rows, vt, ...: drift within a process hits all
 * alike); per variant the JSON gives the minimum over every run (*_min_ms,
 * the number to compare) and the median of the round medians (*_ms).
 * TFLOPS are from the minimum. The V quantizer is timed in both layouts.
 *
 * Inputs: a 16 M-element bf16 N(0, 1) pattern repeated over Q, K, V on the
 * device; sk_quantize_e4m3 makes the e4m3 copies and their per-head
 * descales (timed on its own). Timing: CUDA events around each of `reps`
 * runs after 2 warm-ups (plan once), median and minimum. TFLOPS count
 * 4 D bq bk per selected block over all (batch, head): the selected blocks
 * only (causal diagonal blocks in full). Accuracy: over the first
 * SAMPLE elements of O, the RMSE and the largest error of the FP8 output
 * against the bf16 one, and the RMS of the bf16 output for scale. One JSON
 * object on stdout; exit 1 when an output sample holds a non-finite value.
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

enum { WARMUP = 2, PATTERN = 1 << 24, SAMPLE = 1 << 20, DIM = 128 };

typedef struct opts {
    int64_t batch, heads, heads_kv, seq, window;
    int32_t per_row, block_q, block_k;
    int causal, reps, window_pattern, layouts, rounds; /* layouts: 1 rows, 2 vt */
    sk_dtype out;
    sk_backend backend;
} opts;

static int parse(int argc, char **argv, opts *o) {
    o->batch = 16, o->heads = 96, o->heads_kv = 0, o->seq = 4096, o->window = 2048;
    o->per_row = 0, o->causal = 0, o->reps = 10, o->window_pattern = 0, o->layouts = 1;
    o->rounds = 3;
    o->block_q = o->block_k = 128;
    o->out = SK_DTYPE_BF16, o->backend = SK_BACKEND_CUDA;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--causal") == 0) {
            o->causal = 1;
            continue;
        }
        if (v == NULL) return -1;
        ++i;
        if (strcmp(a, "--batch") == 0) o->batch = atoll(v);
        else if (strcmp(a, "--heads") == 0) o->heads = atoll(v);
        else if (strcmp(a, "--heads-kv") == 0) o->heads_kv = atoll(v);
        else if (strcmp(a, "--seq") == 0) o->seq = atoll(v);
        else if (strcmp(a, "--window") == 0) o->window = atoll(v);
        else if (strcmp(a, "--per-row") == 0) o->per_row = atoi(v);
        else if (strcmp(a, "--reps") == 0) o->reps = atoi(v);
        else if (strcmp(a, "--rounds") == 0) o->rounds = atoi(v);
        else if (strcmp(a, "--block-q") == 0) o->block_q = atoi(v);
        else if (strcmp(a, "--block-k") == 0) o->block_k = atoi(v);
        else if (strcmp(a, "--v-layout") == 0)
            o->layouts = (strstr(v, "rows") != NULL ? 1 : 0) | (strstr(v, "vt") != NULL ? 2 : 0);
        else if (strcmp(a, "--pattern") == 0) o->window_pattern = strcmp(v, "window") == 0;
        else if (strcmp(a, "--out") == 0) o->out = strcmp(v, "f16") == 0 ? SK_DTYPE_F16 : SK_DTYPE_BF16;
        else if (strcmp(a, "--backend") == 0)
            o->backend = strcmp(v, "sm90") == 0 ? SK_BACKEND_CUDA_SM90 : SK_BACKEND_CUDA;
        else return -1;
    }
    if (o->heads_kv == 0) o->heads_kv = o->heads;
    if ((o->block_q != 64 && o->block_q != 128) || (o->block_k != 64 && o->block_k != 128))
        return -1;
    const int64_t cb = (o->seq + o->block_k - 1) / o->block_k;
    if (o->per_row == 0) o->per_row = (int32_t)(cb / 4 > 0 ? cb / 4 : 1);
    if (o->reps < 1 || o->reps > BENCH_MAX_REPS) o->reps = 10;
    if (o->rounds < 1 || o->rounds > 64) o->rounds = 3;
    return o->layouts != 0 ? 0 : -1;
}

typedef struct bench_call {
    const sk_attention_desc *d;
    const sk_quantize_desc *qd;
    const sk_bsr *layout;
    const void *q, *k, *v, *x;
    void *o, *ws;
    uint8_t *y;
    float *descale;
    size_t ws_bytes;
    int quantize;
} bench_call;

static void call(const void *ctx) {
    const bench_call *c = (const bench_call *)ctx;
    if (c->quantize)
        SK_OK(sk_quantize_e4m3(c->qd, c->x, c->y, c->descale, c->ws, c->ws_bytes, NULL));
    else
        SK_OK(sk_attention_run(c->d, c->layout, c->q, c->k, c->v, c->o, NULL, c->ws, c->ws_bytes,
                               NULL));
}

static void desc_for(sk_attention_desc *d, const opts *o, sk_dtype dtype) {
    SK_OK(sk_attention_desc_init(d, sizeof *d));
    d->backend = o->backend;
    d->dtype = dtype;
    d->batch = o->batch;
    d->seq_q = d->seq_k = o->seq;
    d->heads_q = o->heads;
    d->heads_kv = o->heads_kv;
    d->head_dim = DIM;
    d->mask = o->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
}

/* Quantize one bf16 [B, S, H, D] device tensor into `layout` (timed when
 * ms != NULL). */
static void quantize(const opts *o, int64_t heads, const void *x, uint8_t *y, float *descale,
                     int reps, float *ms, int32_t layout) {
    sk_quantize_desc qd;
    SK_OK(sk_quantize_desc_init(&qd, sizeof qd));
    qd.layout = layout;
    qd.backend = SK_BACKEND_CUDA;
    qd.dtype = SK_DTYPE_BF16;
    qd.batch = o->batch;
    qd.seq = o->seq;
    qd.heads = heads;
    qd.head_dim = DIM;
    bench_call c;
    memset(&c, 0, sizeof c);
    c.qd = &qd;
    c.x = x;
    c.y = y;
    c.descale = descale;
    c.quantize = 1;
    SK_OK(sk_quantize_e4m3_workspace_size(&qd, &c.ws_bytes));
    CUDA_OK(cudaMalloc(&c.ws, c.ws_bytes));
    if (ms != NULL) {
        float best;
        bench_time(call, &c, WARMUP, reps, ms, &best);
    } else {
        call(&c);
    }
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(c.ws));
}

static float median_of(float *x, int n) {
    qsort(x, (size_t)n, sizeof *x, bench_cmp_float);
    return x[n / 2];
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: see the header of bench/attention_fp8_speed.c\n");
        return BENCH_ERROR_EXIT;
    }
    const int64_t nq = o.batch * o.seq * o.heads * DIM, nk = o.batch * o.seq * o.heads_kv * DIM;
    sk_grid grid = {o.seq, o.seq, o.block_q, o.block_k, o.window_pattern ? 1 : (int32_t)o.batch,
                    o.window_pattern ? 1 : (int32_t)o.heads};
    sk_layout_t host_layout;
    if (o.window_pattern)
        SK_OK(sk_layout_create_window(&host_layout, &grid, o.window, 0));
    else
        SK_OK(sk_layout_create_random(&host_layout, &grid, o.per_row, 32, o.causal));
    sk_bsr hl, layout;
    SK_OK(sk_layout_view(host_layout, &hl));
    layout = hl;
    const int64_t rows = (int64_t)grid.batch * grid.heads * ((o.seq + o.block_q - 1) / o.block_q);
    CUDA_OK(cudaMalloc((void **)&layout.row_offsets, (size_t)(rows + 1) * 4));
    CUDA_OK(cudaMalloc((void **)&layout.col_indices, (size_t)(hl.nnz > 0 ? hl.nnz : 1) * 4));
    CUDA_OK(cudaMemcpy(layout.row_offsets, hl.row_offsets, (size_t)(rows + 1) * 4,
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(layout.col_indices, hl.col_indices, (size_t)hl.nnz * 4,
                       cudaMemcpyHostToDevice));

    void *pattern, *q, *k, *v, *o16, *o8;
    uint8_t *q8, *k8, *v8;
    float *qds, *kds, *vds;
    CUDA_OK(cudaMalloc(&pattern, (size_t)PATTERN * 2));
    {
        void *h = malloc((size_t)PATTERN * 2);
        if (h == NULL) return BENCH_ERROR_EXIT;
        host_fill_normal(h, SK_DTYPE_BF16, PATTERN, 32, 1);
        CUDA_OK(cudaMemcpy(pattern, h, (size_t)PATTERN * 2, cudaMemcpyHostToDevice));
        free(h);
    }
    CUDA_OK(cudaMalloc(&q, (size_t)nq * 2));
    CUDA_OK(cudaMalloc(&k, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&v, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&o16, (size_t)nq * 2));
    CUDA_OK(cudaMalloc(&o8, (size_t)nq * 2));
    CUDA_OK(cudaMalloc((void **)&q8, (size_t)nq));
    CUDA_OK(cudaMalloc((void **)&k8, (size_t)nk));
    CUDA_OK(cudaMalloc((void **)&v8, (size_t)nk));
    CUDA_OK(cudaMalloc((void **)&qds, (size_t)(o.batch * o.heads) * 4));
    CUDA_OK(cudaMalloc((void **)&kds, (size_t)(o.batch * o.heads_kv) * 4));
    CUDA_OK(cudaMalloc((void **)&vds, (size_t)(o.batch * o.heads_kv) * 4));
    bench_fill_pattern(q, pattern, PATTERN, nq, 0);
    bench_fill_pattern(k, pattern, PATTERN, nk, 777);
    bench_fill_pattern(v, pattern, PATTERN, nk, 4242);
    int64_t nvt = 0;
    SK_OK(sk_quantize_vt_elems(o.batch, o.seq, o.heads_kv, DIM, &nvt));
    uint8_t *v8t = NULL;
    void *o8t = NULL;
    float *vtds = NULL;
    if (o.layouts & 2) {
        CUDA_OK(cudaMalloc((void **)&v8t, (size_t)nvt));
        CUDA_OK(cudaMalloc(&o8t, (size_t)nq * 2));
        CUDA_OK(cudaMalloc((void **)&vtds, (size_t)(o.batch * o.heads_kv) * 4));
    }
    float quant_ms = 0.0f, quant_v_ms = 0.0f, quant_vt_ms = 0.0f;
    quantize(&o, o.heads, q, q8, qds, o.reps, &quant_ms, SK_QUANT_LAYOUT_ROWS);
    quantize(&o, o.heads_kv, k, k8, kds, 0, NULL, SK_QUANT_LAYOUT_ROWS);
    quantize(&o, o.heads_kv, v, v8, vds, o.reps, &quant_v_ms, SK_QUANT_LAYOUT_ROWS);
    if (o.layouts & 2)
        quantize(&o, o.heads_kv, v, v8t, vtds, o.reps, &quant_vt_ms, SK_QUANT_LAYOUT_VT_FP8);

    /* Variants: 0 bf16, 1 FP8 rows V, 2 FP8 V^T. */
    sk_attention_desc dv[3];
    desc_for(&dv[0], &o, SK_DTYPE_BF16);
    for (int k2 = 1; k2 < 3; ++k2) {
        desc_for(&dv[k2], &o, SK_DTYPE_E4M3);
        dv[k2].out_dtype = o.out;
        dv[k2].q_descale = qds;
        dv[k2].k_descale = kds;
        dv[k2].v_descale = k2 == 2 ? vtds : vds;
    }
    dv[2].v_layout = SK_V_LAYOUT_VT_FP8;
    bench_call cv[3];
    memset(cv, 0, sizeof cv);
    cv[0].q = q, cv[0].k = k, cv[0].v = v, cv[0].o = o16;
    cv[1].q = q8, cv[1].k = k8, cv[1].v = v8, cv[1].o = o8;
    cv[2].q = q8, cv[2].k = k8, cv[2].v = v8t, cv[2].o = o8t;
    const int on[3] = {1, o.layouts & 1, (o.layouts & 2) != 0};
    for (int k2 = 0; k2 < 3; ++k2) {
        if (!on[k2]) continue;
        cv[k2].d = &dv[k2];
        cv[k2].layout = &layout;
        SK_OK(sk_attention_workspace_size(&dv[k2], &layout, &cv[k2].ws_bytes));
        CUDA_OK(cudaMalloc(&cv[k2].ws, cv[k2].ws_bytes));
        SK_OK(sk_attention_plan(&dv[k2], &layout, cv[k2].ws, cv[k2].ws_bytes, NULL));
    }
    float med[3][64], best[3] = {INFINITY, INFINITY, INFINITY};
    for (int r = 0; r < o.rounds; ++r)
        for (int k2 = 0; k2 < 3; ++k2) {
            if (!on[k2]) continue;
            float mn;
            bench_time(call, &cv[k2], WARMUP, o.reps, &med[k2][r], &mn);
            best[k2] = mn < best[k2] ? mn : best[k2];
        }
    CUDA_OK(cudaDeviceSynchronize());
    float ms[3] = {0.0f, 0.0f, 0.0f};
    for (int k2 = 0; k2 < 3; ++k2) /* the median of the round medians */
        if (on[k2]) ms[k2] = median_of(med[k2], o.rounds);

    /* The FP8 outputs against the bf16 one, on a sample; V^T against rows V
     * bit for bit on it. */
    const int64_t m = nq < SAMPLE ? nq : SAMPLE;
    uint16_t *h16 = malloc((size_t)m * 2), *h8 = malloc((size_t)m * 2);
    if (h16 == NULL || h8 == NULL) return BENCH_ERROR_EXIT;
    CUDA_OK(cudaMemcpy(h16, o16, (size_t)m * 2, cudaMemcpyDeviceToHost));
    double rmse[3] = {0, 0, 0}, max_err[3] = {0, 0, 0}, ref2 = 0.0;
    int64_t bad = 0, vt_diff = -1;
    uint16_t *h_rows = NULL;
    for (int k2 = 1; k2 < 3; ++k2) {
        if (!on[k2]) continue;
        CUDA_OK(cudaMemcpy(h8, cv[k2].o, (size_t)m * 2, cudaMemcpyDeviceToHost));
        double se = 0.0;
        ref2 = 0.0;
        for (int64_t i = 0; i < m; ++i) {
            const double a = host_load(h16, SK_DTYPE_BF16, i), b = host_load(h8, o.out, i);
            if (!isfinite(a) || !isfinite(b)) {
                ++bad;
                continue;
            }
            se += (a - b) * (a - b);
            ref2 += a * a;
            max_err[k2] = fabs(a - b) > max_err[k2] ? fabs(a - b) : max_err[k2];
        }
        rmse[k2] = sqrt(se / (double)m);
        if (k2 == 1) {
            h_rows = h8;
            h8 = malloc((size_t)m * 2);
            if (h8 == NULL) return BENCH_ERROR_EXIT;
        } else if (h_rows != NULL) {
            vt_diff = 0;
            for (int64_t i = 0; i < m; ++i) vt_diff += h8[i] != h_rows[i];
        }
    }
    const double slices = (double)(o.batch * o.heads) / ((double)grid.batch * grid.heads);
    const double flops = 4.0 * DIM * o.block_q * o.block_k * (double)hl.nnz * slices;
    const int f8 = on[1] ? 1 : 2; /* the fp8_* keys: rows V when timed */
    sk_device_info info;
    SK_OK(sk_device_get_info(0, &info));
    printf("{\"gpu\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"heads_kv\": %lld, \"seq\": %lld, "
           "\"dim\": %d, \"block_q\": %d, \"block_k\": %d, \"pattern\": \"%s\", \"per_row\": %d, \"window\": %lld, "
           "\"causal\": %d, \"out_dtype\": \"%s\", \"selected_blocks\": %.0f, \"reps\": %d, "
           "\"rounds\": %d, \"v_layouts\": \"%s\", "
           "\"bf16_ms\": %.4f, \"bf16_min_ms\": %.4f, \"bf16_tflops\": %.1f, "
           "\"fp8_ms\": %.4f, \"fp8_min_ms\": %.4f, \"fp8_tflops\": %.1f, \"fp8_speedup\": %.3f, ",
           info.name, (long long)o.batch, (long long)o.heads, (long long)o.heads_kv,
           (long long)o.seq, DIM, (int)o.block_q, (int)o.block_k, o.window_pattern ? "window" : "random", (int)o.per_row,
           (long long)o.window, o.causal, o.out == SK_DTYPE_F16 ? "f16" : "bf16",
           (double)hl.nnz * slices, o.reps, o.rounds,
           o.layouts == 3 ? "rows,vt" : o.layouts == 2 ? "vt" : "rows", ms[0], best[0],
           flops / best[0] * 1e-9, ms[f8], best[f8], flops / best[f8] * 1e-9, best[0] / best[f8]);
    if (on[2])
        printf("\"fp8_vt_ms\": %.4f, \"fp8_vt_min_ms\": %.4f, \"fp8_vt_tflops\": %.1f, "
               "\"fp8_vt_speedup\": %.3f, \"fp8_vt_over_rows\": %.3f, "
               "\"o_rmse_fp8_vt_vs_bf16\": %.5g, \"vt_differs_from_rows_in_sample\": %lld, "
               "\"quantize_v_vt_ms\": %.4f, ",
               ms[2], best[2], flops / best[2] * 1e-9, best[0] / best[2],
               on[1] ? best[1] / best[2] : 0.0, rmse[2], (long long)vt_diff, quant_vt_ms);
    printf("\"quantize_q_ms\": %.4f, \"quantize_v_ms\": %.4f, \"o_rms_bf16\": %.5g, "
           "\"o_rmse_fp8_vs_bf16\": %.5g, \"o_max_err_fp8_vs_bf16\": %.5g, "
           "\"non_finite_in_sample\": %lld}\n",
           quant_ms, quant_v_ms, sqrt(ref2 / (double)m), rmse[f8], max_err[f8], (long long)bad);
    free(h16);
    free(h8);
    free(h_rows);
    sk_layout_destroy(host_layout);
    return bad == 0 && vt_diff <= 0 ? 0 : 1;
}
