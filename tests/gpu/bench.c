/*
 * bench.c - timing of the attention forward (`sk_gpu_tests --bench [filter]`).
 *
 * For each configuration: inputs filled on the device from a 32 MB random
 * host pattern (never zeros), the layout built on the host, one forward
 * whose sampled rows are checked against an fp64 computation under the
 * suite's tolerance rule, then the plan and the run timed separately with
 * CUDA events: GT_BENCH_WARMUP untimed runs, then the median (and minimum)
 * of GT_BENCH_REPS. Each run reads several GB, far more than L2, so one set
 * of inputs suffices. One JSON object per configuration on stdout.
 * "actual" TFLOPS count only the selected blocks: 4 * D * bq * bk * (blocks
 * summed over all (batch, head) rows) / time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"

enum { GT_BENCH_WARMUP = 3, GT_BENCH_REPS = 20, GT_BENCH_CHECK_ROWS = 24 };
enum { GT_PATTERN_ELEMS = 16 << 20 }; /* random values repeated through each tensor */

typedef enum { LAYOUT_RANDOM_K, LAYOUT_DENSE, LAYOUT_CAUSAL } bench_layout;

typedef struct bench_cfg {
    const char *name;
    sk_dtype dtype;
    int64_t b, h, s, d;
    int32_t bq, bk;
    int causal;
    bench_layout layout;
    int32_t k; /* blocks per row for LAYOUT_RANDOM_K */
} bench_cfg;

static const bench_cfg configs[] = {
    {"seed_f16_d128_b128_rand25", SK_DTYPE_F16, 16, 96, 4096, 128, 128, 128, 0, LAYOUT_RANDOM_K, 8},
    {"seed_bf16_d128_b128_rand25", SK_DTYPE_BF16, 16, 96, 4096, 128, 128, 128, 0, LAYOUT_RANDOM_K,
     8},
    {"f16_d128_b128_rand12", SK_DTYPE_F16, 16, 96, 4096, 128, 128, 128, 0, LAYOUT_RANDOM_K, 4},
    {"f16_d128_b128_rand50", SK_DTYPE_F16, 16, 96, 4096, 128, 128, 128, 0, LAYOUT_RANDOM_K, 16},
    {"f16_d128_b128_dense", SK_DTYPE_F16, 16, 96, 4096, 128, 128, 128, 0, LAYOUT_DENSE, 0},
    {"f16_d128_b128_causal", SK_DTYPE_F16, 16, 96, 4096, 128, 128, 128, 1, LAYOUT_CAUSAL, 0},
    {"f16_d64_b128_rand25", SK_DTYPE_F16, 16, 96, 4096, 64, 128, 128, 0, LAYOUT_RANDOM_K, 8},
    {"f16_d128_b64_rand25", SK_DTYPE_F16, 16, 96, 4096, 128, 64, 64, 0, LAYOUT_RANDOM_K, 16},
};

static double pattern_value(const uint16_t *pat, sk_dtype dtype, int64_t i) {
    return tu_load(pat, dtype, i % GT_PATTERN_ELEMS);
}

/* Sampled rows against fp64; returns the worst error / tolerance (> 1 fails). */
static double check_rows(const bench_cfg *c, const sk_bsr *layout, const uint16_t *pat,
                         const void *dout, const float *dlse, tu_rng *rng) {
    const int64_t B = c->b, H = c->h, S = c->s, D = c->d;
    const int64_t rb = (S + c->bq - 1) / c->bq;
    const double scale = 1.0 / sqrt((double)D), u = tu_unit_roundoff(c->dtype);
    double *s = malloc((size_t)S * sizeof(double));
    int64_t *keys = malloc((size_t)S * sizeof(int64_t));
    double *o = malloc((size_t)D * sizeof(double));
    uint16_t *og = malloc((size_t)D * 2);
    double worst = 0;
    for (int r = 0; r < GT_BENCH_CHECK_ROWS; ++r) {
        const int64_t b = tu_rng_range(rng, 0, B - 1), h = tu_rng_range(rng, 0, H - 1);
        const int64_t q = tu_rng_range(rng, 0, S - 1);
        const int64_t g = (b * H + h) * rb + q / c->bq;
        int64_t n = 0;
        for (int32_t e = layout->row_offsets[g]; e < layout->row_offsets[g + 1]; ++e)
            for (int64_t k = (int64_t)layout->col_indices[e] * c->bk;
                 k < ((int64_t)layout->col_indices[e] + 1) * c->bk && k < S; ++k) {
                if (c->causal && k > q) continue;
                double dot = 0;
                for (int64_t d = 0; d < D; ++d)
                    dot += pattern_value(pat, c->dtype, ((b * S + q) * H + h) * D + d) *
                           pattern_value(pat, c->dtype, ((b * S + k) * H + h) * D + d);
                s[n] = scale * dot;
                keys[n++] = k;
            }
        float lse_g;
        cudaMemcpy(og, (const char *)dout + (((b * S + q) * H + h) * D) * 2, (size_t)D * 2,
                   cudaMemcpyDeviceToHost);
        cudaMemcpy(&lse_g, dlse + (b * H + h) * S + q, sizeof(float), cudaMemcpyDeviceToHost);
        if (n == 0) {
            for (int64_t d = 0; d < D; ++d)
                if (tu_load(og, c->dtype, d) != 0) worst = INFINITY;
            if (lse_g != -INFINITY) worst = INFINITY;
            continue;
        }
        double m = -INFINITY, sum = 0, sum_ps = 0;
        for (int64_t i = 0; i < n; ++i) m = s[i] > m ? s[i] : m;
        for (int64_t i = 0; i < n; ++i) sum += exp(s[i] - m);
        for (int64_t d = 0; d < D; ++d) o[d] = 0;
        for (int64_t i = 0; i < n; ++i) {
            const double p = exp(s[i] - m) / sum;
            sum_ps += p * fabs(s[i]);
            for (int64_t d = 0; d < D; ++d)
                o[d] += p * pattern_value(pat, c->dtype, ((b * S + keys[i]) * H + h) * D + d);
        }
        for (int64_t d = 0; d < D; ++d) {
            double spv = 0, spsdv = 0;
            for (int64_t i = 0; i < n; ++i) {
                const double p = exp(s[i] - m) / sum;
                const double v = pattern_value(pat, c->dtype, ((b * S + keys[i]) * H + h) * D + d);
                spv += p * fabs(v);
                spsdv += p * fabs(s[i]) * fabs(v - o[d]);
            }
            const double tol = gt_tolerance_o(u, fabs(o[d]), spv, spsdv);
            const double err = fabs(tu_load(og, c->dtype, d) - o[d]) / tol;
            worst = err > worst || isnan(err) ? (isnan(err) ? INFINITY : err) : worst;
        }
        const double lse = m + log(sum);
        const double err = fabs(lse_g - lse) / gt_tolerance_lse(u, fabs(lse), sum_ps);
        worst = err > worst || isnan(err) ? (isnan(err) ? INFINITY : err) : worst;
    }
    free(s);
    free(keys);
    free(o);
    free(og);
    return worst;
}

static int build_layout(const bench_cfg *c, sk_bsr *host, tu_rng *rng) {
    const int64_t rb = (c->s + c->bq - 1) / c->bq, cb = (c->s + c->bk - 1) / c->bk;
    const int64_t slices = c->b * c->h;
    uint8_t *mask = calloc((size_t)(slices * rb * cb), 1);
    int32_t *perm = malloc((size_t)cb * sizeof(int32_t));
    if (mask == NULL || perm == NULL) return -1;
    for (int64_t sl = 0; sl < slices; ++sl)
        for (int64_t i = 0; i < rb; ++i) {
            uint8_t *row = mask + (sl * rb + i) * cb;
            if (c->layout == LAYOUT_DENSE) {
                memset(row, 1, (size_t)cb);
            } else if (c->layout == LAYOUT_CAUSAL) {
                const int64_t qlast = ((i + 1) * c->bq < c->s ? (i + 1) * c->bq : c->s) - 1;
                for (int64_t j = 0; j < cb; ++j) row[j] = j * c->bk <= qlast;
            } else {
                const int64_t k = c->k < cb ? c->k : cb;
                for (int64_t j = 0; j < cb; ++j) perm[j] = (int32_t)j;
                for (int64_t j = 0; j < k; ++j) {
                    const int64_t r = tu_rng_range(rng, j, cb - 1);
                    const int32_t t = perm[j];
                    perm[j] = perm[r];
                    perm[r] = t;
                    row[perm[j]] = 1;
                }
            }
        }
    sk_grid grid = {c->s, c->s, c->bq, c->bk, (int32_t)c->b, (int32_t)c->h};
    const int rc = gt_bsr_from_mask(host, &grid, mask);
    free(mask);
    free(perm);
    return rc;
}

int gt_bench_main(const char *filter) {
    sk_device_info info;
    sk_device_get_info(0, &info);
    int64_t max_elems = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; ++i) {
        const int64_t n = configs[i].b * configs[i].s * configs[i].h * configs[i].d;
        max_elems = n > max_elems ? n : max_elems;
    }
    void *dq = gt_device_alloc((size_t)max_elems * 2), *dk = gt_device_alloc((size_t)max_elems * 2);
    void *dv = gt_device_alloc((size_t)max_elems * 2), *dout = gt_device_alloc((size_t)max_elems * 2);
    float *dlse = gt_device_alloc((size_t)(max_elems / 64) * sizeof(float));
    void *dpat = gt_device_alloc((size_t)GT_PATTERN_ELEMS * 2);
    uint16_t *pat16 = malloc((size_t)GT_PATTERN_ELEMS * 2), *patbf = malloc((size_t)GT_PATTERN_ELEMS * 2);
    if (!dq || !dk || !dv || !dout || !dlse || !dpat || !pat16 || !patbf) {
        printf("bench: out of memory\n");
        return 1;
    }
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed());
    for (int64_t i = 0; i < GT_PATTERN_ELEMS; ++i) {
        const float x = (float)(tu_rng_uniform(&rng) * 4.0 - 2.0);
        pat16[i] = tu_f32_to_f16(x);
        patbf[i] = tu_f32_to_bf16(x);
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int failures = 0;
    sk_dtype filled = (sk_dtype)0;
    for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ++ci) {
        const bench_cfg *c = &configs[ci];
        if (filter != NULL && strstr(c->name, filter) == NULL) continue;
        const uint16_t *pat = c->dtype == SK_DTYPE_F16 ? pat16 : patbf;
        const int64_t elems = c->b * c->s * c->h * c->d;
        if (filled != c->dtype) {
            if (gt_upload(dpat, pat, (size_t)GT_PATTERN_ELEMS * 2) != 0 ||
                gt_fill_repeated(dq, dpat, GT_PATTERN_ELEMS, max_elems) ||
                gt_fill_repeated(dk, dpat, GT_PATTERN_ELEMS, max_elems) ||
                gt_fill_repeated(dv, dpat, GT_PATTERN_ELEMS, max_elems)) {
                printf("bench: fill failed\n");
                return 1;
            }
            filled = c->dtype;
        }
        sk_bsr host, dev;
        if (build_layout(c, &host, &rng) != 0 || gt_bsr_to_device(&host, &dev) != 0) {
            printf("bench: layout setup failed\n");
            return 1;
        }
        sk_attention_desc d;
        sk_attention_desc_init(&d, sizeof d);
        d.backend = gt_opt.backend;
        d.dtype = c->dtype;
        d.batch = c->b;
        d.seq_q = d.seq_k = c->s;
        d.heads_q = d.heads_kv = c->h;
        d.head_dim = c->d;
        d.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
        size_t ws_bytes = 0;
        sk_status st = sk_attention_workspace_size(&d, &dev, &ws_bytes);
        void *ws = st == SK_STATUS_SUCCESS ? gt_device_alloc(ws_bytes) : NULL;
        cudaMemset(dout, 0xff, (size_t)elems * 2); /* NaN: every element must be written */
        if (ws != NULL) st = sk_attention_forward(&d, &dev, dq, dk, dv, dout, dlse, ws, ws_bytes, NULL);
        if (st != SK_STATUS_SUCCESS || gt_sync() != 0) {
            printf("bench %s: %s %s\n", c->name, sk_status_name(st), sk_last_error());
            ++failures;
            gt_device_free(ws);
            gt_bsr_free_device(&dev);
            gt_bsr_free(&host);
            continue;
        }
        const double worst = check_rows(c, &host, pat, dout, dlse, &rng);
        float plan_ms[GT_BENCH_REPS], run_ms[GT_BENCH_REPS];
        for (int rep = 0; rep < GT_BENCH_WARMUP + GT_BENCH_REPS; ++rep) {
            cudaEventRecord(e0, NULL);
            sk_attention_plan(&d, &dev, ws, ws_bytes, NULL);
            cudaEventRecord(e1, NULL);
            cudaEventSynchronize(e1);
            if (rep >= GT_BENCH_WARMUP) cudaEventElapsedTime(&plan_ms[rep - GT_BENCH_WARMUP], e0, e1);
        }
        for (int rep = 0; rep < GT_BENCH_WARMUP + GT_BENCH_REPS; ++rep) {
            cudaEventRecord(e0, NULL);
            st = sk_attention_run(&d, &dev, dq, dk, dv, dout, dlse, ws, ws_bytes, NULL);
            cudaEventRecord(e1, NULL);
            cudaEventSynchronize(e1);
            if (rep >= GT_BENCH_WARMUP) cudaEventElapsedTime(&run_ms[rep - GT_BENCH_WARMUP], e0, e1);
        }
        const int ok = st == SK_STATUS_SUCCESS && gt_sync() == 0 && worst <= 1.0;
        failures += !ok;
        qsort(plan_ms, GT_BENCH_REPS, sizeof(float), gt_cmp_float);
        qsort(run_ms, GT_BENCH_REPS, sizeof(float), gt_cmp_float);
        const double med = run_ms[GT_BENCH_REPS / 2] * 1e-3, best = run_ms[0] * 1e-3;
        const double blocks = (double)host.nnz; /* layout slices = B * H */
        const double flops = 4.0 * (double)c->d * c->bq * c->bk * blocks;
        const double dense = 4.0 * (double)c->b * c->h * c->s * c->s * c->d;
        printf("{\"name\": \"%s\", \"gpu\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", "
               "\"batch\": %lld, \"heads\": %lld, \"seq\": %lld, \"head_dim\": %lld, "
               "\"block_q\": %d, \"block_k\": %d, \"causal\": %d, \"density\": %.4f, "
               "\"selected_blocks\": %.0f, \"median_us\": %.1f, \"min_us\": %.1f, "
               "\"actual_tflops\": %.1f, \"dense_equivalent_tflops\": %.1f, "
               "\"plan_median_us\": %.1f, \"check_rows\": %d, \"check_worst_err_over_tol\": "
               "%.3f, \"ok\": %s}\n",
               c->name, info.name,
               gt_opt.backend == SK_BACKEND_CUDA_SM80   ? "sm80"
               : gt_opt.backend == SK_BACKEND_CUDA_SM90 ? "sm90"
                                                        : "cuda",
               c->dtype == SK_DTYPE_F16 ? "f16" : "bf16", (long long)c->b, (long long)c->h,
               (long long)c->s, (long long)c->d, (int)c->bq, (int)c->bk, c->causal,
               blocks / ((double)c->b * c->h * ((c->s + c->bq - 1) / c->bq) *
                         ((c->s + c->bk - 1) / c->bk)),
               blocks, med * 1e6, best * 1e6, flops / med * 1e-12, dense / med * 1e-12,
               plan_ms[GT_BENCH_REPS / 2] * 1e3, GT_BENCH_CHECK_ROWS, worst, ok ? "true" : "false");
        fflush(stdout);
        gt_device_free(ws);
        gt_bsr_free_device(&dev);
        gt_bsr_free(&host);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    gt_device_free(dq);
    gt_device_free(dk);
    gt_device_free(dv);
    gt_device_free(dout);
    gt_device_free(dlse);
    gt_device_free(dpat);
    free(pat16);
    free(patbf);
    printf("bench: %d failed\n", failures);
    return failures;
}
