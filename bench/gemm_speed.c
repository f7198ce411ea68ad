/*
 * gemm_speed.c - timing and spot check of the CUDA BSR GEMM (issue 6's
 * target shape and density sweep).
 *
 * Build (after `make -j2 all`):  make build/gemm_speed
 * Run:
 *   build/gemm_speed [--m M] [--n N] [--k K] [--block-m 128] [--block-k 128]
 *                    [--per-row 16,...] [--dtype f16|bf16] [--c-dtype f16|bf16|f32]
 *                    [--b-order row|col] [--backend cuda|sm80|sm90] [--reps 20]
 *                    [--beta 0] [--commit HASH]
 * Defaults: the shape, M = N = K = 8192, fp16, 128 x 128 blocks,
 * row-major B, fp16 C, and the sweep 4, 8, 16, 32, 64 of 64 blocks per
 * block row (6.25 % .. 100 %).
 *
 * Per density: a layout with exactly `per_row` distinct random column
 * blocks in every block row (seeded), random A values and B in [-1, 1),
 * C NaN-filled (beta = 0: never read). One plan, then 3 warm-up runs and
 * `reps` runs each timed alone with CUDA events: median and minimum.
 * Spot check: 512 random elements of C against an fp64 sum on the host,
 * each within 2 u_c |ref| + 2^-20 sum |a b| (a failure exits with 1).
 * One JSON object per line on stdout; TFLOPS count the selected blocks
 * only: 2 * per_row * row_blocks * block_m * block_k * N.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sparsek.h"

#define BENCH_ERROR_EXIT 2 /* 1 is a failed result check */
#include "bench_check.h"
#include "host_data.h"

enum { WARMUP = 3, CHECKS = 512, MAX_SWEEP = 16 };

typedef struct opts {
    int64_t m, n, k;
    int32_t block_m, block_k;
    int32_t per_row[MAX_SWEEP];
    int n_sweep;
    sk_dtype dtype, c_dtype;
    sk_order b_order;
    sk_backend backend;
    int reps;
    float beta;
    const char *commit;
} opts;

/* Streams of host_data.h's generator; every run of a density draws the same values. */
enum { SEED = 1, STREAM_LAYOUT = 1, STREAM_A = 2, STREAM_B = 3, STREAM_CHECK = 4 };

static int parse_list(const char *s, int32_t *out) {
    int n = 0;
    while (*s && n < MAX_SWEEP) {
        out[n++] = (int32_t)strtol(s, (char **)&s, 10);
        if (*s == ',') ++s;
    }
    return n;
}

static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->m = o->n = o->k = 8192;
    o->block_m = o->block_k = 128;
    o->dtype = SK_DTYPE_F16;
    o->c_dtype = SK_DTYPE_F16;
    o->b_order = SK_ORDER_ROW_MAJOR;
    o->backend = SK_BACKEND_CUDA;
    o->reps = 20;
    o->commit = "unknown";
    int custom_sweep = 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) return 0;
        ++i;
        if (!strcmp(a, "--m")) o->m = atoll(v);
        else if (!strcmp(a, "--n")) o->n = atoll(v);
        else if (!strcmp(a, "--k")) o->k = atoll(v);
        else if (!strcmp(a, "--block-m")) o->block_m = atoi(v);
        else if (!strcmp(a, "--block-k")) o->block_k = atoi(v);
        else if (!strcmp(a, "--per-row")) o->n_sweep = parse_list(v, o->per_row), custom_sweep = 1;
        else if (!strcmp(a, "--dtype")) o->dtype = !strcmp(v, "bf16") ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        else if (!strcmp(a, "--c-dtype"))
            o->c_dtype = !strcmp(v, "f32") ? SK_DTYPE_F32 : !strcmp(v, "bf16") ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        else if (!strcmp(a, "--b-order")) o->b_order = !strcmp(v, "col") ? SK_ORDER_COL_MAJOR : SK_ORDER_ROW_MAJOR;
        else if (!strcmp(a, "--backend"))
            o->backend = !strcmp(v, "sm80") ? SK_BACKEND_CUDA_SM80 : !strcmp(v, "sm90") ? SK_BACKEND_CUDA_SM90 : SK_BACKEND_CUDA;
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--beta")) o->beta = (float)atof(v);
        else if (!strcmp(a, "--commit")) o->commit = v;
        else return 0;
    }
    if (!custom_sweep) {
        const int32_t cb = (int32_t)((o->k + o->block_k - 1) / o->block_k);
        const int32_t def[5] = {cb / 16, cb / 8, cb / 4, cb / 2, cb};
        for (int i = 0; i < 5; ++i) o->per_row[i] = def[i] > 0 ? def[i] : 1;
        o->n_sweep = 5;
    }
    return o->reps > 0;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int run_one(const opts *o, int32_t per_row, const char *gpu) {
    const int32_t rb = (int32_t)((o->m + o->block_m - 1) / o->block_m);
    const int32_t cb = (int32_t)((o->k + o->block_k - 1) / o->block_k);
    if (per_row > cb) per_row = cb;
    if (rb < 1 || cb < 1 || per_row < 0) return 0;
    const int32_t nnz = per_row * rb;
    const size_t blk = (size_t)o->block_m * o->block_k;

    /* Layout: per_row distinct random columns per row, sorted. */
    int32_t *offs = malloc(sizeof(int32_t) * (size_t)(rb + 1));
    int32_t *cols = malloc(sizeof(int32_t) * (size_t)(nnz > 0 ? nnz : 1));
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)cb);
    uint8_t *pick = malloc((size_t)cb);
    for (int32_t r = 0; r < rb; ++r) {
        offs[r] = r * per_row;
        for (int32_t c = 0; c < cb; ++c) perm[c] = c;
        for (int32_t c = 0; c < cb; ++c) pick[c] = 0;
        for (int32_t i = 0; i < per_row; ++i) {
            const uint64_t word = host_rng_word(SEED, STREAM_LAYOUT, (uint64_t)r * cb + i);
            const int32_t j = i + (int32_t)(word % (uint64_t)(cb - i));
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
            pick[perm[i]] = 1;
        }
        int32_t w = r * per_row;
        for (int32_t c = 0; c < cb; ++c)
            if (pick[c]) cols[w++] = c;
    }
    offs[rb] = nnz;

    /* A values and B, 16-bit. */
    const int64_t ldb = o->b_order == SK_ORDER_ROW_MAJOR ? o->n : o->k;
    const size_t a_elems = (size_t)nnz * blk, b_elems = (size_t)o->k * (size_t)o->n;
    uint16_t *ha = malloc(2 * (a_elems > 0 ? a_elems : 1)), *hb = malloc(2 * b_elems);
    for (size_t i = 0; i < a_elems; ++i)
        host_store(ha, o->dtype, (int64_t)i, host_rng_uniform(SEED, STREAM_A, i));
    for (size_t i = 0; i < b_elems; ++i)
        host_store(hb, o->dtype, (int64_t)i, host_rng_uniform(SEED, STREAM_B, i));

    const size_t cs = o->c_dtype == SK_DTYPE_F32 ? 4 : 2;
    const size_t c_bytes = (size_t)o->m * (size_t)o->n * cs;
    void *da, *db, *dc, *dws;
    int32_t *doffs, *dcols;
    CUDA_OK(cudaMalloc(&da, 2 * (a_elems > 0 ? a_elems : 1)));
    CUDA_OK(cudaMalloc(&db, 2 * b_elems));
    CUDA_OK(cudaMalloc(&dc, c_bytes));
    CUDA_OK(cudaMalloc((void **)&doffs, sizeof(int32_t) * (size_t)(rb + 1)));
    CUDA_OK(cudaMalloc((void **)&dcols, sizeof(int32_t) * (size_t)(nnz > 0 ? nnz : 1)));
    CUDA_OK(cudaMemcpy(da, ha, 2 * a_elems, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb, 2 * b_elems, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dc, 0xFF, c_bytes)); /* NaN */
    CUDA_OK(cudaMemcpy(doffs, offs, sizeof(int32_t) * (size_t)(rb + 1), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dcols, cols, sizeof(int32_t) * (size_t)nnz, cudaMemcpyHostToDevice));

    sk_bsr lay;
    memset(&lay, 0, sizeof lay);
    lay.grid.rows = o->m;
    lay.grid.cols = o->k;
    lay.grid.block_rows = o->block_m;
    lay.grid.block_cols = o->block_k;
    lay.grid.batch = lay.grid.heads = 1;
    lay.nnz = nnz;
    lay.row_offsets = doffs;
    lay.col_indices = dcols;
    sk_bsr_gemm_desc d;
    SK_OK(sk_bsr_gemm_desc_init(&d, sizeof d));
    d.backend = o->backend;
    d.ab_dtype = o->dtype;
    d.c_dtype = o->c_dtype;
    d.m = o->m;
    d.n = o->n;
    d.k = o->k;
    d.b_order = o->b_order;
    d.ldb = ldb;
    d.beta = o->beta;
    if (o->beta != 0.0f) CUDA_OK(cudaMemset(dc, 0, c_bytes));
    size_t ws = 0;
    SK_OK(sk_bsr_gemm_workspace_size(&d, &lay, &ws));
    CUDA_OK(cudaMalloc(&dws, ws));
    SK_OK(sk_bsr_gemm_plan(&d, &lay, dws, ws, NULL));
    SK_OK(sk_bsr_gemm_run(&d, &lay, da, db, dc, dws, ws, NULL));
    CUDA_OK(cudaDeviceSynchronize());

    /* Spot check (beta = 0 only: C was NaN before the run). */
    int bad = 0;
    double max_err = 0.0;
    if (o->beta == 0.0f) {
        uint8_t *hc = malloc(cs);
        for (int t = 0; t < CHECKS; ++t) {
            const int64_t r =
                (int64_t)(host_rng_word(SEED, STREAM_CHECK, 2 * (uint64_t)t) % (uint64_t)o->m);
            const int64_t c =
                (int64_t)(host_rng_word(SEED, STREAM_CHECK, 2 * (uint64_t)t + 1) % (uint64_t)o->n);
            CUDA_OK(cudaMemcpy(hc, (char *)dc + ((size_t)r * (size_t)o->n + (size_t)c) * cs, cs,
                               cudaMemcpyDeviceToHost));
            const double got = host_load(hc, o->c_dtype, 0);
            const int32_t row = (int32_t)(r / o->block_m), rr = (int32_t)(r % o->block_m);
            double ref = 0.0, mag = 0.0;
            for (int32_t e = offs[row]; e < offs[row + 1]; ++e)
                for (int32_t j = 0; j < o->block_k; ++j) {
                    const int64_t kk = (int64_t)cols[e] * o->block_k + j;
                    if (kk >= o->k) break;
                    const int64_t ai = (int64_t)e * (int64_t)blk + (int64_t)rr * o->block_k + j;
                    const double a = host_load(ha, o->dtype, ai);
                    const size_t bi = o->b_order == SK_ORDER_ROW_MAJOR ? (size_t)kk * o->n + c
                                                                       : (size_t)c * o->k + kk;
                    const double b = host_load(hb, o->dtype, (int64_t)bi);
                    ref += a * b;
                    mag += fabs(a * b);
                }
            const double u = o->c_dtype == SK_DTYPE_F32 ? ldexp(1.0, -24)
                             : o->c_dtype == SK_DTYPE_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
            const double err = fabs(got - ref), tol = 2.0 * u * fabs(ref) + ldexp(mag, -20) + 1e-6;
            if (err > max_err) max_err = err;
            if (!(err <= tol)) {
                if (bad < 5)
                    fprintf(stderr, "C[%lld, %lld] = %g, expected %g (tol %g)\n", (long long)r,
                            (long long)c, got, ref, tol);
                ++bad;
            }
        }
        free(hc);
    }

    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int i = 0; i < WARMUP; ++i) SK_OK(sk_bsr_gemm_run(&d, &lay, da, db, dc, dws, ws, NULL));
    float *ms = malloc(sizeof(float) * (size_t)o->reps);
    for (int i = 0; i < o->reps; ++i) {
        CUDA_OK(cudaEventRecord(e0, NULL));
        SK_OK(sk_bsr_gemm_run(&d, &lay, da, db, dc, dws, ws, NULL));
        CUDA_OK(cudaEventRecord(e1, NULL));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, (size_t)o->reps, sizeof(float), cmp_float);
    const double med = ms[o->reps / 2], mn = ms[0];
    const double flop = 2.0 * (double)nnz * o->block_m * o->block_k * (double)o->n;
    printf("{\"op\": \"bsr_gemm\", \"gpu\": \"%s\", \"commit\": \"%s\", \"backend\": \"%s\", "
           "\"m\": %lld, \"n\": %lld, \"k\": %lld, \"block_m\": %d, \"block_k\": %d, "
           "\"per_row\": %d, \"col_blocks\": %d, \"density\": %.4f, \"dtype\": \"%s\", "
           "\"c_dtype\": \"%s\", \"b_order\": \"%s\", \"beta\": %g, \"reps\": %d, "
           "\"median_ms\": %.4f, \"min_ms\": %.4f, \"tflops_median\": %.1f, \"tflops_best\": %.1f, "
           "\"check\": \"%s\", \"checked\": %d, \"max_abs_err\": %.3g}\n",
           gpu, o->commit,
           o->backend == SK_BACKEND_CUDA_SM80 ? "sm80" : o->backend == SK_BACKEND_CUDA_SM90 ? "sm90" : "cuda",
           (long long)o->m, (long long)o->n, (long long)o->k, o->block_m, o->block_k, per_row, cb,
           (double)per_row / cb, o->dtype == SK_DTYPE_BF16 ? "bf16" : "f16",
           o->c_dtype == SK_DTYPE_F32 ? "f32" : o->c_dtype == SK_DTYPE_BF16 ? "bf16" : "f16",
           o->b_order == SK_ORDER_ROW_MAJOR ? "row" : "col", (double)o->beta, o->reps, med, mn,
           flop / (med * 1e9), flop / (mn * 1e9), o->beta != 0.0f ? "skipped (beta != 0)" : bad ? "FAILED" : "passed",
           o->beta == 0.0f ? CHECKS : 0, max_err);
    fflush(stdout);
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dws);
    cudaFree(doffs);
    cudaFree(dcols);
    free(ha);
    free(hb);
    free(offs);
    free(cols);
    free(perm);
    free(pick);
    return bad == 0;
}

int main(int argc, char **argv) {
    opts o;
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: see the comment at the top of bench/gemm_speed.c\n");
        return 2;
    }
    sk_device_info info;
    SK_OK(sk_device_get_info(0, &info));
    int ok = 1;
    for (int i = 0; i < o.n_sweep; ++i) ok &= run_one(&o, o.per_row[i], info.name);
    return ok ? 0 : 1;
}
