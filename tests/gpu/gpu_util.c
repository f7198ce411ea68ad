/*
 * gpu_util.c - see gpu_util.h.
 */
#include "gpu/gpu_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/cuda_api.h"

gt_options gt_opt = {SK_BACKEND_CUDA, 0, 0, 0};
int gt_cases_run, gt_cases_failed, gt_cases_declined;

int gt_backend_covers(const gt_case *c) {
    /* The Hopper kernel: query and key blocks of 128 or 64 (issue 28). */
    return gt_opt.backend != SK_BACKEND_CUDA_SM90 ||
           ((c->block_q == 128 || c->block_q == 64) && (c->block_k == 128 || c->block_k == 64));
}

/* Rows of stride padding past each sequence end: more than any block, so a
 * read past Sq or Sk lands on NaN. */
enum { GT_SEQ_PAD_ROWS = 128, GT_SLACK_ELEMS = 64, GT_MAX_REPORTS = 8 };

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

int64_t gt_span(const int64_t extent[3], const int64_t stride[3], int64_t d) {
    int64_t last = 0;
    for (int i = 0; i < 3; ++i) last += (extent[i] - 1) * stride[i];
    return last + d;
}

void *gt_device_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes < 16 ? 16 : bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void gt_device_free(void *p) {
    if (p != NULL) cudaFree(p);
}

int gt_upload(void *dst, const void *src, size_t bytes) {
    return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

int gt_download(void *dst, const void *src, size_t bytes) {
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

int gt_fill_repeated(void *dst, const void *pattern_dev, int64_t pattern_elems, int64_t n) {
    for (int64_t off = 0; off < n; off += pattern_elems) {
        const int64_t len = n - off < pattern_elems ? n - off : pattern_elems;
        if (cudaMemcpy((char *)dst + off * 2, pattern_dev, (size_t)len * 2,
                       cudaMemcpyDeviceToDevice) != cudaSuccess)
            return -1;
    }
    return 0;
}

int gt_cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int gt_sync(void) {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("    cudaDeviceSynchronize: %s\n", cudaGetErrorName(e));
        return -1;
    }
    return 0;
}

double gt_tolerance_o(double u, double abs_o, double sum_p_abs_v, double sum_p_abs_s_dv) {
    return GT_TOL_FACTOR * u * (abs_o + sum_p_abs_v + sum_p_abs_s_dv) + GT_TOL_ATOL;
}

double gt_tolerance_lse(double u, double abs_lse, double sum_p_abs_s) {
    return GT_TOL_FACTOR * u * (abs_lse + sum_p_abs_s) + GT_TOL_ATOL;
}

void gt_case_describe(const gt_case *c, char *buf, size_t len) {
    snprintf(buf, len,
             "%s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld blocks %dx%d %s scale=%g "
             "layout %dx%d density=%.2f k=%d empty=%.2f strides q%d k%d v%d o%d lse=%d "
             "amp=%.1f seed=%llu",
             c->dtype == SK_DTYPE_F16 ? "f16" : "bf16", (long long)c->batch,
             (long long)c->seq_q, (long long)c->seq_k, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim, (int)c->block_q, (int)c->block_k,
             c->causal ? "causal" : "full", (double)c->scale, (int)c->layout_batch,
             (int)c->layout_heads, c->density, (int)c->k_per_row, c->empty_rows,
             c->stride_mode[0], c->stride_mode[1], c->stride_mode[2], c->stride_mode[3],
             c->with_lse, (double)c->q_amp, (unsigned long long)c->seed);
}

/* ---------------------------------------------------------------------------
 * Random cases
 * ------------------------------------------------------------------------- */

/* A sequence length: whole blocks, tiny, or with a tail. */
static int64_t pick_len(tu_rng *rng, int32_t block, int quick) {
    const double r = tu_rng_uniform(rng);
    const int64_t max_len = quick ? 200 : 640;
    if (r < 0.3) { /* whole blocks */
        const int64_t n = tu_rng_range(rng, 1, max_len / block > 1 ? max_len / block : 1);
        return n * block;
    }
    if (r < 0.4) return tu_rng_range(rng, 1, 24); /* tiny */
    return tu_rng_range(rng, 1, max_len);        /* tails */
}

void gt_case_random(gt_case *c, tu_rng *rng, sk_dtype dtype, int64_t d, int32_t bq, int32_t bk,
                    int causal, int quick, double budget) {
    static const int groups[3] = {1, 4, 8};
    memset(c, 0, sizeof *c);
    c->dtype = dtype;
    c->head_dim = d;
    c->block_q = bq;
    c->block_k = bk;
    c->causal = causal;
    c->heads_kv = quick ? 1 : tu_rng_range(rng, 1, 2);
    c->heads_q = c->heads_kv * groups[tu_rng_range(rng, 0, 2)];
    c->batch = quick ? 1 : (tu_rng_uniform(rng) < 0.15 ? 3 : tu_rng_range(rng, 1, 2));
    c->seq_k = pick_len(rng, bk, quick);
    c->seq_q = tu_rng_uniform(rng) < 0.35 ? c->seq_k : pick_len(rng, bq, quick);
    while ((double)c->batch * c->heads_q * c->seq_q * c->seq_k * d > budget) {
        if (c->seq_q >= c->seq_k)
            c->seq_q = (c->seq_q + 1) / 2;
        else
            c->seq_k = (c->seq_k + 1) / 2;
    }
    c->layout_batch = (c->batch > 1 && tu_rng_uniform(rng) < 0.5) ? (int32_t)c->batch : 1;
    {
        const double r = tu_rng_uniform(rng);
        c->layout_heads = r < 0.3 ? 1 : r < 0.6 ? (int32_t)c->heads_kv : (int32_t)c->heads_q;
    }
    {
        const double r = tu_rng_uniform(rng);
        if (r < 0.2)
            c->k_per_row = 1;
        else if (r < 0.4)
            c->k_per_row = (int32_t)tu_rng_range(rng, 2, 4);
        else if (r < 0.6)
            c->density = 1.0;
        else
            c->density = 0.1 + 0.6 * tu_rng_uniform(rng);
    }
    c->empty_rows = tu_rng_uniform(rng) < 0.3 ? 0.2 : 0.0;
    for (int t = 0; t < 4; ++t) {
        const double r = tu_rng_uniform(rng);
        c->stride_mode[t] = r < 0.5 ? 0 : r < 0.75 ? 1 : 2;
    }
    c->with_lse = tu_rng_uniform(rng) < 0.85;
    {
        const double r = tu_rng_uniform(rng);
        c->scale = r < 0.8   ? 0.0f
                   : r < 0.9 ? (float)(0.02 + 0.28 * tu_rng_uniform(rng))
                             : (float)-(0.02 + 0.18 * tu_rng_uniform(rng));
    }
    c->q_amp = tu_rng_uniform(rng) < 0.3 ? 3.0f : 1.0f;
    c->seed = tu_rng_next(rng);
}

/* ---------------------------------------------------------------------------
 * Layouts
 * ------------------------------------------------------------------------- */

int gt_bsr_from_mask(sk_bsr *out, const sk_grid *grid, const uint8_t *mask) {
    const int64_t rb = (grid->rows + grid->block_rows - 1) / grid->block_rows;
    const int64_t cb = (grid->cols + grid->block_cols - 1) / grid->block_cols;
    const int64_t rows = (int64_t)grid->batch * grid->heads * rb;
    int64_t nnz = 0;
    for (int64_t i = 0; i < rows * cb; ++i) nnz += mask[i] != 0;
    memset(out, 0, sizeof *out);
    out->grid = *grid;
    out->nnz = (int32_t)nnz;
    out->row_offsets = malloc((size_t)(rows + 1) * sizeof(int32_t));
    out->col_indices = malloc((size_t)(nnz > 0 ? nnz : 1) * sizeof(int32_t));
    if (out->row_offsets == NULL || out->col_indices == NULL) {
        gt_bsr_free(out);
        return -1;
    }
    int32_t e = 0;
    for (int64_t r = 0; r < rows; ++r) {
        out->row_offsets[r] = e;
        for (int64_t j = 0; j < cb; ++j)
            if (mask[r * cb + j]) out->col_indices[e++] = (int32_t)j;
    }
    out->row_offsets[rows] = e;
    return 0;
}

void gt_bsr_free(sk_bsr *bsr) {
    free(bsr->row_offsets);
    free(bsr->col_indices);
    bsr->row_offsets = NULL;
    bsr->col_indices = NULL;
}

static int64_t bsr_rows(const sk_bsr *b) {
    const int64_t rb = (b->grid.rows + b->grid.block_rows - 1) / b->grid.block_rows;
    return (int64_t)b->grid.batch * b->grid.heads * rb;
}

int gt_bsr_to_device(const sk_bsr *host, sk_bsr *dev) {
    *dev = *host;
    const size_t ro = (size_t)(bsr_rows(host) + 1) * sizeof(int32_t);
    const size_t ci = (size_t)(host->nnz > 0 ? host->nnz : 1) * sizeof(int32_t);
    dev->row_offsets = gt_device_alloc(ro);
    dev->col_indices = gt_device_alloc(ci);
    if (dev->row_offsets == NULL || dev->col_indices == NULL) return -1;
    if (gt_upload(dev->row_offsets, host->row_offsets, ro) != 0) return -1;
    if (host->nnz > 0 && gt_upload(dev->col_indices, host->col_indices, ci) != 0) return -1;
    return 0;
}

void gt_bsr_free_device(sk_bsr *dev) {
    gt_device_free(dev->row_offsets);
    gt_device_free(dev->col_indices);
    dev->row_offsets = NULL;
    dev->col_indices = NULL;
}

/* ---------------------------------------------------------------------------
 * Materialised cases
 * ------------------------------------------------------------------------- */

void gt_tensor_make(gt_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, int mode,
                    tu_rng *rng, sk_dtype dtype) {
    memset(t, 0, sizeof *t);
    t->extent[0] = b;
    t->extent[1] = s;
    t->extent[2] = h;
    t->d = d;
    t->dtype = dtype;
    if (mode == 1) { /* [B, S, H, D] with padding */
        t->stride[2] = d + 8 * tu_rng_range(rng, 0, 2);
        t->stride[1] = h * t->stride[2] + 8 * tu_rng_range(rng, 0, 2);
        t->stride[0] = (s + GT_SEQ_PAD_ROWS) * t->stride[1] + 8 * tu_rng_range(rng, 0, 3);
    } else if (mode == 2) { /* [B, H, S, D] with padding */
        t->stride[1] = d + 8 * tu_rng_range(rng, 0, 2);
        t->stride[2] = (s + GT_SEQ_PAD_ROWS) * t->stride[1] + 8 * tu_rng_range(rng, 0, 2);
        t->stride[0] = h * t->stride[2] + 8 * tu_rng_range(rng, 0, 3);
    } else { /* packed */
        t->stride[2] = d;
        t->stride[1] = h * d;
        t->stride[0] = s * h * d;
    }
    if (mode == 1 || mode == 2) memcpy(t->desc_stride, t->stride, sizeof t->stride);
    t->alloc = gt_span(t->extent, t->stride, d) + GT_SEQ_PAD_ROWS * t->stride[1] + GT_SLACK_ELEMS;
    t->bytes = (size_t)t->alloc * 2;
}

int64_t gt_tensor_index(const gt_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
    return b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d;
}

static int32_t slice_of(const gt_inst *x, int64_t b, int64_t h) {
    return (int32_t)((x->c.layout_batch == 1 ? 0 : b) * x->c.layout_heads + h / x->head_div);
}

void gt_case_desc(const gt_case *c, sk_backend backend, sk_attention_desc *d) {
    sk_attention_desc_init(d, sizeof *d);
    d->backend = backend;
    d->dtype = c->dtype;
    d->batch = c->batch;
    d->seq_q = c->seq_q;
    d->seq_k = c->seq_k;
    d->heads_q = c->heads_q;
    d->heads_kv = c->heads_kv;
    d->head_dim = c->head_dim;
    d->scale = c->scale;
    d->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
}

void gt_inst_desc(const gt_inst *x, sk_backend backend, sk_attention_desc *d) {
    gt_case_desc(&x->c, backend, d);
    memcpy(d->q_strides, x->q.desc_stride, sizeof d->q_strides);
    memcpy(d->k_strides, x->k.desc_stride, sizeof d->k_strides);
    memcpy(d->v_strides, x->v.desc_stride, sizeof d->v_strides);
    memcpy(d->o_strides, x->o.desc_stride, sizeof d->o_strides);
}

void gt_tensor_fill(tu_rng *rng, gt_tensor *t, double *packed, float amp) {
    uint16_t *h = t->host;
    int64_t pi = 0;
    for (int64_t b = 0; b < t->extent[0]; ++b)
        for (int64_t s = 0; s < t->extent[1]; ++s)
            for (int64_t hh = 0; hh < t->extent[2]; ++hh)
                for (int64_t d = 0; d < t->d; ++d, ++pi) {
                    const int64_t i = gt_tensor_index(t, b, s, hh, d);
                    tu_store(h, t->dtype, i, (float)tu_rng_normal(rng) * amp);
                    if (packed != NULL) packed[pi] = tu_load(h, t->dtype, i);
                }
}

static void build_mask(gt_inst *x, tu_rng *rng) {
    const gt_case *c = &x->c;
    const int64_t per_slice = x->rb * x->cb;
    int32_t *perm = malloc((size_t)x->cb * sizeof(int32_t));
    for (int64_t sl = 0; sl < x->slices; ++sl)
        for (int64_t i = 0; i < x->rb; ++i) {
            uint8_t *row = x->mask + sl * per_slice + i * x->cb;
            memset(row, 0, (size_t)x->cb);
            if (c->empty_rows > 0 && tu_rng_uniform(rng) < c->empty_rows) continue;
            if (c->k_per_row > 0) {
                const int64_t k = c->k_per_row < x->cb ? c->k_per_row : x->cb;
                for (int64_t j = 0; j < x->cb; ++j) perm[j] = (int32_t)j;
                for (int64_t j = 0; j < k; ++j) { /* partial Fisher-Yates */
                    const int64_t r = tu_rng_range(rng, j, x->cb - 1);
                    const int32_t tmp = perm[j];
                    perm[j] = perm[r];
                    perm[r] = tmp;
                    row[perm[j]] = 1;
                }
            } else {
                for (int64_t j = 0; j < x->cb; ++j) row[j] = tu_rng_uniform(rng) < c->density;
            }
        }
    free(perm);
}

/* K/V key blocks that no row of the slices reading them selects become NaN. */
static void poison_unused_kv(gt_inst *x) {
    const gt_case *c = &x->c;
    uint8_t *used = calloc((size_t)(c->batch * c->heads_kv * x->cb), 1);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < c->heads_q; ++h) {
            const int64_t hk = h / x->group, sl = slice_of(x, b, h);
            for (int64_t i = 0; i < x->rb; ++i)
                for (int64_t j = 0; j < x->cb; ++j)
                    if (x->mask[(sl * x->rb + i) * x->cb + j])
                        used[(b * c->heads_kv + hk) * x->cb + j] = 1;
        }
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t hk = 0; hk < c->heads_kv; ++hk)
            for (int64_t j = 0; j < x->cb; ++j) {
                if (used[(b * c->heads_kv + hk) * x->cb + j]) continue;
                const int64_t k1 = (j + 1) * c->block_k < c->seq_k ? (j + 1) * c->block_k : c->seq_k;
                for (int64_t k = j * c->block_k; k < k1; ++k)
                    for (int64_t d = 0; d < c->head_dim; ++d) {
                        tu_store(x->k.host, c->dtype, gt_tensor_index(&x->k, b, k, hk, d), NAN);
                        tu_store(x->v.host, c->dtype, gt_tensor_index(&x->v, b, k, hk, d), NAN);
                    }
            }
    free(used);
}

double gt_case_scale(const gt_case *c) {
    return c->scale != 0.0f ? (double)c->scale : (double)(float)(1.0 / sqrt((double)c->head_dim));
}

/* The fp64 pass: naive O and LSE and the per-element tolerances. */
static void fp64_pass(gt_inst *x) {
    const gt_case *c = &x->c;
    const int64_t B = c->batch, Sq = c->seq_q, Sk = c->seq_k, Hq = c->heads_q, Hk = c->heads_kv;
    const int64_t D = c->head_dim, rows = B * Hq * Sq;
    const double scale = gt_case_scale(c), u = tu_unit_roundoff(c->dtype);
#pragma omp parallel
    {
        double *s = malloc((size_t)Sk * sizeof(double));
        int64_t *keys = malloc((size_t)Sk * sizeof(int64_t));
        double *spsdv = malloc((size_t)D * sizeof(double));
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t q = r % Sq, h = (r / Sq) % Hq, b = r / (Sq * Hq), hk = h / x->group;
            const int64_t g = (int64_t)slice_of(x, b, h) * x->rb + q / c->block_q;
            const double *qv = x->qd + ((b * Sq + q) * Hq + h) * D;
            int64_t n = 0;
            for (int32_t e = x->layout.row_offsets[g]; e < x->layout.row_offsets[g + 1]; ++e) {
                const int64_t j = x->layout.col_indices[e];
                for (int64_t k = j * c->block_k; k < (j + 1) * c->block_k && k < Sk; ++k) {
                    if (c->causal && k > q + Sk - Sq) continue;
                    const double *kv = x->kd + ((b * Sk + k) * Hk + hk) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += qv[d] * kv[d];
                    s[n] = scale * dot;
                    keys[n++] = k;
                }
            }
            double *on = x->o_naive + ((b * Sq + q) * Hq + h) * D;
            double *ot = x->o_tol + ((b * Sq + q) * Hq + h) * D;
            const int64_t li = (b * Hq + h) * Sq + q;
            if (n == 0) {
                for (int64_t d = 0; d < D; ++d) {
                    on[d] = 0;
                    ot[d] = GT_TOL_ATOL;
                }
                x->lse_naive[li] = -INFINITY;
                x->lse_tol[li] = 0;
                continue;
            }
            double m = -INFINITY, sum = 0, sum_ps = 0;
            for (int64_t i = 0; i < n; ++i) m = s[i] > m ? s[i] : m;
            for (int64_t i = 0; i < n; ++i) sum += exp(s[i] - m);
            for (int64_t d = 0; d < D; ++d) on[d] = 0;
            for (int64_t i = 0; i < n; ++i) {
                const double p = exp(s[i] - m) / sum;
                const double *vv = x->vd + ((b * Sk + keys[i]) * Hk + hk) * D;
                for (int64_t d = 0; d < D; ++d) on[d] += p * vv[d];
                sum_ps += p * fabs(s[i]);
            }
            for (int64_t d = 0; d < D; ++d) ot[d] = 0;
            double *spv = ot; /* reuse: first sum_p|v|, then the tolerance */
            for (int64_t d = 0; d < D; ++d) spsdv[d] = 0;
            for (int64_t i = 0; i < n; ++i) {
                const double p = exp(s[i] - m) / sum;
                const double *vv = x->vd + ((b * Sk + keys[i]) * Hk + hk) * D;
                for (int64_t d = 0; d < D; ++d) {
                    spv[d] += p * fabs(vv[d]);
                    spsdv[d] += p * fabs(s[i]) * fabs(vv[d] - on[d]);
                }
            }
            for (int64_t d = 0; d < D; ++d) ot[d] = gt_tolerance_o(u, fabs(on[d]), spv[d], spsdv[d]);
            x->lse_naive[li] = m + log(sum);
            x->lse_tol[li] = gt_tolerance_lse(u, fabs(x->lse_naive[li]), sum_ps);
        }
        free(s);
        free(keys);
        free(spsdv);
    }
}

void gt_inst_destroy(gt_inst *x) {
    free(x->q.host);
    free(x->k.host);
    free(x->v.host);
    free(x->o.host);
    free(x->o_ref);
    free(x->lse_nan);
    free(x->lse_ref);
    free(x->mask);
    free(x->qd);
    free(x->kd);
    free(x->vd);
    free(x->o_naive);
    free(x->o_tol);
    free(x->lse_naive);
    free(x->lse_tol);
    gt_bsr_free(&x->layout);
    gt_device_free(x->dq);
    gt_device_free(x->dk);
    gt_device_free(x->dv);
    gt_device_free(x->dout);
    gt_device_free(x->dlse);
    gt_device_free(x->dws);
    gt_bsr_free_device(&x->dlayout);
    memset(x, 0, sizeof *x);
}

int gt_inst_create(gt_inst *x, const gt_case *c, int with_fp64) {
    memset(x, 0, sizeof *x);
    x->c = *c;
    if (x->c.q_amp == 0.0f) x->c.q_amp = 1.0f;
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    x->group = c->heads_q / c->heads_kv;
    x->head_div = c->layout_heads == 1 ? (int32_t)c->heads_q
                  : c->layout_heads == c->heads_q ? 1
                                                  : (int32_t)x->group;
    x->rb = (c->seq_q + c->block_q - 1) / c->block_q;
    x->cb = (c->seq_k + c->block_k - 1) / c->block_k;
    x->slices = (int64_t)c->layout_batch * c->layout_heads;
    const int64_t B = c->batch, Sq = c->seq_q, Sk = c->seq_k, Hq = c->heads_q, Hk = c->heads_kv;
    const int64_t D = c->head_dim;

    gt_tensor_make(&x->q, B, Sq, Hq, D, c->stride_mode[0], &rng, c->dtype);
    gt_tensor_make(&x->k, B, Sk, Hk, D, c->stride_mode[1], &rng, c->dtype);
    gt_tensor_make(&x->v, B, Sk, Hk, D, c->stride_mode[2], &rng, c->dtype);
    gt_tensor_make(&x->o, B, Sq, Hq, D, c->stride_mode[3], &rng, c->dtype);
    x->q.host = malloc(x->q.bytes);
    x->k.host = malloc(x->k.bytes);
    x->v.host = malloc(x->v.bytes);
    x->o.host = malloc(x->o.bytes);
    x->o_ref = malloc(x->o.bytes);
    x->lse_elems = B * Hq * Sq;
    x->lse_nan = malloc((size_t)x->lse_elems * sizeof(float));
    x->lse_ref = malloc((size_t)x->lse_elems * sizeof(float));
    x->mask = malloc((size_t)(x->slices * x->rb * x->cb));
    x->qd = malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
    x->kd = malloc((size_t)(B * Sk * Hk * D) * sizeof(double));
    x->vd = malloc((size_t)(B * Sk * Hk * D) * sizeof(double));
    if (!x->q.host || !x->k.host || !x->v.host || !x->o.host || !x->o_ref || !x->lse_nan ||
        !x->lse_ref || !x->mask || !x->qd || !x->kd || !x->vd)
        return -1;
    if (with_fp64) {
        x->o_naive = malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
        x->o_tol = malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
        x->lse_naive = malloc((size_t)x->lse_elems * sizeof(double));
        x->lse_tol = malloc((size_t)x->lse_elems * sizeof(double));
        if (!x->o_naive || !x->o_tol || !x->lse_naive || !x->lse_tol) return -1;
    }
    tu_fill_nan(x->q.host, c->dtype, x->q.alloc);
    tu_fill_nan(x->k.host, c->dtype, x->k.alloc);
    tu_fill_nan(x->v.host, c->dtype, x->v.alloc);
    tu_fill_nan(x->o.host, c->dtype, x->o.alloc);
    memcpy(x->o_ref, x->o.host, x->o.bytes);
    for (int64_t i = 0; i < x->lse_elems; ++i) x->lse_nan[i] = NAN;
    memcpy(x->lse_ref, x->lse_nan, (size_t)x->lse_elems * sizeof(float));
    gt_tensor_fill(&rng, &x->q, x->qd, x->c.q_amp);
    gt_tensor_fill(&rng, &x->k, x->kd, 1.0f);
    gt_tensor_fill(&rng, &x->v, x->vd, 1.0f);

    sk_grid grid = {Sq, Sk, c->block_q, c->block_k, c->layout_batch, c->layout_heads};
    build_mask(x, &rng);
    if (gt_bsr_from_mask(&x->layout, &grid, x->mask) != 0) return -1;
    poison_unused_kv(x);
    if (with_fp64) fp64_pass(x);

    /* Device copies: the whole allocations, NaN padding included. */
    x->dq = gt_device_alloc(x->q.bytes);
    x->dk = gt_device_alloc(x->k.bytes);
    x->dv = gt_device_alloc(x->v.bytes);
    x->dout = gt_device_alloc(x->o.bytes);
    x->dlse = gt_device_alloc((size_t)x->lse_elems * sizeof(float));
    if (!x->dq || !x->dk || !x->dv || !x->dout || !x->dlse) return -1;
    if (gt_upload(x->dq, x->q.host, x->q.bytes) || gt_upload(x->dk, x->k.host, x->k.bytes) ||
        gt_upload(x->dv, x->v.host, x->v.bytes))
        return -1;
    if (gt_bsr_to_device(&x->layout, &x->dlayout) != 0) return -1;
    sk_attention_desc d;
    gt_inst_desc(x, gt_opt.backend, &d);
    if (sk_attention_workspace_size(&d, &x->dlayout, &x->ws_bytes) != SK_STATUS_SUCCESS) {
        printf("    sk_attention_workspace_size: %s\n", sk_last_error());
        return -1;
    }
    x->dws = gt_device_alloc(x->ws_bytes);
    return x->dws != NULL ? 0 : -1;
}

int gt_inst_poison_outputs(gt_inst *x) {
    if (gt_upload(x->dout, x->o.host, x->o.bytes) != 0) return -1;
    return gt_upload(x->dlse, x->lse_nan, (size_t)x->lse_elems * sizeof(float));
}

int gt_inst_fetch_outputs(const gt_inst *x, void *o, float *lse) {
    if (gt_download(o, x->dout, x->o.bytes) != 0) return -1;
    return gt_download(lse, x->dlse, (size_t)x->lse_elems * sizeof(float));
}

sk_status gt_inst_cpu_reference(gt_inst *x) {
    sk_attention_desc d;
    gt_inst_desc(x, SK_BACKEND_CPU, &d);
    return sk_attention_run(&d, &x->layout, x->q.host, x->k.host, x->v.host, x->o_ref,
                            x->c.with_lse ? x->lse_ref : NULL, NULL, 0, NULL);
}

sk_status gt_inst_forward(gt_inst *x, sk_backend backend, struct CUstream_st *stream) {
    sk_attention_desc d;
    gt_inst_desc(x, backend, &d);
    return sk_attention_forward(&d, &x->dlayout, x->dq, x->dk, x->dv, x->dout,
                                x->c.with_lse ? x->dlse : NULL, x->dws, x->ws_bytes, stream);
}

int gt_inst_outputs_untouched(const gt_inst *x) {
    uint8_t *o = malloc(x->o.bytes);
    float *lse = malloc((size_t)x->lse_elems * sizeof(float));
    int same = 0;
    if (o != NULL && lse != NULL && gt_inst_fetch_outputs(x, o, lse) == 0)
        same = memcmp(o, x->o.host, x->o.bytes) == 0 &&
               memcmp(lse, x->lse_nan, (size_t)x->lse_elems * sizeof(float)) == 0;
    free(o);
    free(lse);
    return same;
}

/* Compare GPU outputs with the reference; returns the number of errors. */
int gt_inst_compare(const gt_inst *x, const void *o, const float *lse, const char *what) {
    const gt_case *c = &x->c;
    const int64_t B = c->batch, Sq = c->seq_q, Hq = c->heads_q, D = c->head_dim;
    const int use_naive = gt_opt.use_naive_ref;
    int64_t errors = 0;
    double worst = 0; /* largest error / tolerance */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t q = 0; q < Sq; ++q)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t i = gt_tensor_index(&x->o, b, q, h, d);
                    const int64_t pi = ((b * Sq + q) * Hq + h) * D + d;
                    const double g = tu_load(o, c->dtype, i);
                    const double r = use_naive ? x->o_naive[pi] : tu_load(x->o_ref, c->dtype, i);
                    const double tol = x->o_tol[pi];
                    int bad;
                    if (isnan(r) || isinf(r))
                        bad = !(isnan(r) ? isnan(g) : g == r);
                    else
                        bad = !isfinite(g) || fabs(g - r) > tol;
                    if (isfinite(g) && isfinite(r) && fabs(g - r) / tol > worst)
                        worst = fabs(g - r) / tol;
                    if (bad && ++errors <= GT_MAX_REPORTS)
                        printf("    %s: O[b=%lld q=%lld h=%lld d=%lld] = %.6g, reference %.6g, "
                               "tolerance %.3g\n",
                               what, (long long)b, (long long)q, (long long)h, (long long)d, g, r,
                               tol);
                }
    if (c->with_lse)
        for (int64_t i = 0; i < x->lse_elems; ++i) {
            const double g = lse[i];
            const double r = use_naive ? x->lse_naive[i] : x->lse_ref[i];
            const double tol = x->lse_tol[i];
            int bad;
            if (isnan(r) || isinf(r))
                bad = !(isnan(r) ? isnan(g) : g == r);
            else
                bad = !isfinite(g) || fabs(g - r) > tol;
            if (isfinite(g) && isfinite(r) && fabs(g - r) / tol > worst) worst = fabs(g - r) / tol;
            if (bad && ++errors <= GT_MAX_REPORTS)
                printf("    %s: LSE[%lld] (b=%lld h=%lld q=%lld) = %.8g, reference %.8g, "
                       "tolerance %.3g\n",
                       what, (long long)i, (long long)(i / (Sq * Hq)), (long long)((i / Sq) % Hq),
                       (long long)(i % Sq), g, r, tol);
        }
    else
        for (int64_t i = 0; i < x->lse_elems; ++i)
            if (memcmp(&lse[i], &x->lse_nan[i], sizeof(float)) != 0 && ++errors <= GT_MAX_REPORTS)
                printf("    %s: LSE[%lld] written although lse = NULL\n", what, (long long)i);
    /* O's padding (everything outside the logical tensor) is untouched. */
    {
        uint8_t *copy = malloc(x->o.bytes);
        memcpy(copy, o, x->o.bytes);
        const uint16_t *nan_bits = x->o.host; /* still the NaN fill */
        uint16_t *cp16 = (uint16_t *)copy;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t q = 0; q < Sq; ++q)
                for (int64_t h = 0; h < Hq; ++h) {
                    const int64_t i = gt_tensor_index(&x->o, b, q, h, 0);
                    memcpy(cp16 + i, nan_bits + i, (size_t)D * 2);
                }
        if (memcmp(copy, x->o.host, x->o.bytes) != 0 && ++errors <= GT_MAX_REPORTS)
            printf("    %s: O's stride padding or slack was written\n", what);
        free(copy);
    }
    if (gt_opt.verbose || errors > 0)
        printf("    %s: %lld errors, worst error/tolerance %.3f\n", what, (long long)errors, worst);
    return (int)(errors > 1000000 ? 1000000 : errors);
}

int gt_run_case(const gt_case *c) {
    char desc[512];
    gt_case_describe(c, desc, sizeof desc);
    if (gt_opt.verbose) printf("  case: %s\n", desc);
    gt_inst x;
    int failed = 1;
    void *o1 = NULL, *o2 = NULL;
    float *l1 = NULL, *l2 = NULL;
    if (gt_inst_create(&x, c, 1) != 0) {
        CHECK(0, "could not set up the case (memory): %s", desc);
        goto done;
    }
    /* Reference: the CPU backend on the same host buffers. */
    {
        const sk_status st = gt_inst_cpu_reference(&x);
        if (st != SK_STATUS_SUCCESS && !gt_opt.use_naive_ref) {
            CHECK(0, "CPU reference failed: %s: %s [%s]", sk_status_name(st), sk_last_error(),
                  desc);
            goto done;
        }
    }
    o1 = malloc(x.o.bytes);
    o2 = malloc(x.o.bytes);
    l1 = malloc((size_t)x.lse_elems * sizeof(float));
    l2 = malloc((size_t)x.lse_elems * sizeof(float));
    if (!o1 || !o2 || !l1 || !l2) {
        CHECK(0, "out of host memory [%s]", desc);
        goto done;
    }
    if (!gt_backend_covers(c)) {
        /* The forced kernel must decline, say why, and write nothing. */
        if (gt_inst_poison_outputs(&x) != 0) {
            CHECK(0, "upload failed [%s]", desc);
            goto done;
        }
        const sk_status st = gt_inst_forward(&x, gt_opt.backend, NULL);
        CHECK(st == SK_STATUS_NOT_SUPPORTED, "expected NOT_SUPPORTED, got %s: %s [%s]",
              sk_status_name(st), sk_last_error(), desc);
        CHECK(gt_sync() == 0 && gt_inst_outputs_untouched(&x), "outputs written on decline [%s]",
              desc);
        failed = st != SK_STATUS_NOT_SUPPORTED;
        ++gt_cases_declined;
        goto done;
    }
    for (int run = 0; run < 2; ++run) {
        if (gt_inst_poison_outputs(&x) != 0) {
            CHECK(0, "upload failed [%s]", desc);
            goto done;
        }
        const sk_status st = gt_inst_forward(&x, gt_opt.backend, NULL);
        if (st != SK_STATUS_SUCCESS) {
            CHECK(0, "sk_attention_forward: %s: %s [%s]", sk_status_name(st), sk_last_error(),
                  desc);
            goto done;
        }
        if (gt_sync() != 0 || gt_inst_fetch_outputs(&x, run == 0 ? o1 : o2, run == 0 ? l1 : l2)) {
            CHECK(0, "GPU run %d failed [%s]", run, desc);
            goto done;
        }
    }
    CHECK(memcmp(o1, o2, x.o.bytes) == 0, "two runs differ in O (not bitwise reproducible) [%s]",
          desc);
    CHECK(memcmp(l1, l2, (size_t)x.lse_elems * sizeof(float)) == 0,
          "two runs differ in LSE [%s]", desc);
    {
        const int errors = gt_inst_compare(&x, o1, l1, "gpu vs reference");
        CHECK(errors == 0, "%d elements outside the tolerance [%s]", errors, desc);
        failed = errors != 0;
    }
done:
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    gt_inst_destroy(&x);
    ++gt_cases_run;
    gt_cases_failed += failed;
    return failed;
}
