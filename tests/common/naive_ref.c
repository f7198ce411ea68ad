/*
 * naive_ref.c - see naive_ref.h.
 */
#include "common/naive_ref.h"

#include <math.h>
#include <stdlib.h>

void nr_attention_row(int64_t sk, int64_t d, double scale, const double *q, const double *k,
                      int64_t k_stride, const double *v, int64_t v_stride, const uint8_t *allow,
                      double *o, double *lse) {
    double *s = (double *)malloc((size_t)(sk > 0 ? sk : 1) * sizeof(double));
    double max = -INFINITY;
    int any = 0;
    for (int64_t j = 0; j < sk; ++j) {
        if (allow != NULL && !allow[j]) continue;
        double dot = 0.0;
        for (int64_t x = 0; x < d; ++x) dot += q[x] * k[j * k_stride + x];
        s[j] = scale * dot;
        if (!any || s[j] > max) max = s[j];
        any = 1;
    }
    for (int64_t x = 0; x < d; ++x) o[x] = 0.0;
    if (!any) {
        *lse = -INFINITY;
        free(s);
        return;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < sk; ++j) {
        if (allow != NULL && !allow[j]) continue;
        const double p = exp(s[j] - max);
        sum += p;
        for (int64_t x = 0; x < d; ++x) o[x] += p * v[j * v_stride + x];
    }
    for (int64_t x = 0; x < d; ++x) o[x] /= sum;
    *lse = max + log(sum);
    free(s);
}

void nr_attention(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d, double scale,
                  const double *q, const double *k, const double *v, const uint8_t *allow,
                  double *o, double *lse) {
    const int64_t row = heads * d; /* elements per token */
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < sq; ++i) {
                const int64_t qo = (b * sq + i) * row + h * d;
                const int64_t ko = b * sk * row + h * d;
                const uint8_t *al = allow != NULL ? allow + ((b * heads + h) * sq + i) * sk : NULL;
                nr_attention_row(sk, d, scale, q + qo, k + ko, row, v + ko, row, al, o + qo,
                                 lse + (b * heads + h) * sq + i);
            }
}

void nr_allow_from_blocks(uint8_t *allow, const uint8_t *block_mask, int64_t batch, int64_t heads,
                          int64_t sq, int64_t sk, int64_t bq, int64_t bk, int causal) {
    const int64_t rb = (sq + bq - 1) / bq, cb = (sk + bk - 1) / bk;
    for (int64_t s = 0; s < batch * heads; ++s)
        for (int64_t i = 0; i < sq; ++i)
            for (int64_t j = 0; j < sk; ++j) {
                int ok = block_mask[(s * rb + i / bq) * cb + j / bk] != 0;
                if (causal && j > i + (sk - sq)) ok = 0;
                allow[(s * sq + i) * sk + j] = (uint8_t)ok;
            }
}

void nr_gemm(int64_t m, int64_t n, int64_t k, double alpha, const double *a, const double *b,
             double beta, const double *c_in, double *c_out) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double sum = 0.0;
            for (int64_t x = 0; x < k; ++x) sum += a[i * k + x] * b[x * n + j];
            c_out[i * n + j] = alpha * sum + (beta != 0.0 ? beta * c_in[i * n + j] : 0.0);
        }
}

int nr_bsr_from_mask(sk_bsr *out, const sk_grid *grid, const uint8_t *mask) {
    const int64_t rb = (grid->rows + grid->block_rows - 1) / grid->block_rows;
    const int64_t cb = (grid->cols + grid->block_cols - 1) / grid->block_cols;
    const int64_t rows = (int64_t)grid->batch * grid->heads * rb;
    int64_t nnz = 0;
    for (int64_t x = 0; x < rows * cb; ++x) nnz += mask[x] != 0;
    out->grid = *grid;
    out->nnz = (int32_t)nnz;
    out->row_offsets = (int32_t *)malloc((size_t)(rows + 1) * sizeof(int32_t));
    out->col_indices = (int32_t *)malloc((size_t)(nnz > 0 ? nnz : 1) * sizeof(int32_t));
    if (out->row_offsets == NULL || out->col_indices == NULL) {
        nr_bsr_free(out);
        return -1;
    }
    int32_t e = 0;
    out->row_offsets[0] = 0;
    for (int64_t g = 0; g < rows; ++g) {
        for (int64_t j = 0; j < cb; ++j)
            if (mask[g * cb + j]) out->col_indices[e++] = (int32_t)j;
        out->row_offsets[g + 1] = e;
    }
    return 0;
}

void nr_bsr_free(sk_bsr *bsr) {
    free(bsr->row_offsets);
    free(bsr->col_indices);
    bsr->row_offsets = NULL;
    bsr->col_indices = NULL;
}
