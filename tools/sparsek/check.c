/*
 * check.c - the correctness check of `sparsek run`: sampled rows of the
 * output against a naive fp64 attention written here, so that no backend is
 * checked against itself (the CPU backend included).
 *
 * Rows: w->check_heads (b, h) pairs, (0, 0) first, then distinct random
 * pairs (all of them when the count covers every pair); of each, the last
 * min(Sq, CHECK_MAX_ROWS) query rows, rounded up to whole query blocks.
 *
 * Reference, per row q of head (b, h), from the header's definition: the
 * keys k of the key blocks that q's block selects in the layout slice
 * (b, h) reads, with k < Sk and, with the causal mask, k <= q + Sk - Sq;
 * s_k = dot(Q[q], K[k]) / sqrt(D) in fp64 on the inputs as the tensors hold
 * them (regenerated from the seed, rounded to the dtype); O = sum_k
 * softmax(s)_k V[k], LSE = log sum_k exp(s_k); no key: O = 0, LSE = -inf.
 *
 * Rule: every element of O and LSE satisfies |got - ref| <= tol (1 + |ref|)
 * (tol per dtype, check_tolerance), and NaN / inf positions match. The
 * outputs were NaN before the run, so an element it did not write fails.
 * --dtype e4m3: the reference runs on the dequantized codes, and each row
 * has its own tolerance (check_fp8.c says why).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "host_data.h"

static double check_tolerance(sk_dtype dtype) {
    return dtype == SK_DTYPE_F16 ? 2e-2 : dtype == SK_DTYPE_BF16 ? 5e-2 : 1e-4;
}

/* Compares one value against |got - want| <= tol_abs + tol_rel |want|;
 * raises *max_err, returns 0 when it fails. */
static int compare_value(double got, double want, double tol_abs, double tol_rel, double *max_err) {
    if (isnan(got) || isnan(want) || isinf(got) || isinf(want)) {
        if ((isnan(got) && isnan(want)) || got == want) return 1;
        *max_err = INFINITY;
        return 0;
    }
    const double err = fabs(got - want);
    if (err > *max_err) *max_err = err;
    return err <= tol_abs + tol_rel * fabs(want);
}

/* A head's inputs as its tensors hold them (fp32 holds every f16 / bf16
 * value exactly): the checked query rows, and all of its KV head's keys;
 * FP8: the whole query head (its amax sets the descale), all quantized. */
static void regenerate_inputs(const workload *w, int64_t b, int64_t h, int64_t q0, int64_t rows,
                              head_inputs *in) {
    const int64_t dim = w->dim, hkv = h / (w->heads_q / w->heads_kv);
    const int64_t qf = w->fp8 ? 0 : q0, qn = w->fp8 ? w->seq_q : rows;
    memset(in, 0, sizeof *in);
    in->q_all = xmalloc((size_t)(qn * dim) * sizeof(float), "the check's Q");
    in->k = xmalloc((size_t)(w->seq_k * dim) * sizeof(float), "the check's K");
    in->v = xmalloc((size_t)(w->seq_k * dim) * sizeof(float), "the check's V");
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < qn; ++s)
        for (int64_t d = 0; d < dim; ++d) {
            const uint64_t src = (uint64_t)(((b * w->seq_q + qf + s) * w->heads_q + h) * dim + d);
            in->q_all[s * dim + d] = host_round(w->dtype, host_rng_normal(w->seed, GEN_Q, src));
        }
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < w->seq_k; ++s)
        for (int64_t d = 0; d < dim; ++d) {
            const uint64_t src = (uint64_t)(((b * w->seq_k + s) * w->heads_kv + hkv) * dim + d);
            in->k[s * dim + d] = host_round(w->dtype, host_rng_normal(w->seed, GEN_K, src));
            in->v[s * dim + d] = host_round(w->dtype, host_rng_normal(w->seed, GEN_V, src));
        }
    in->q = in->q_all + (q0 - qf) * dim;
    if (!w->fp8) return;
    in->q8_all = xmalloc((size_t)(qn * dim), "the check's Q codes");
    in->k8 = xmalloc((size_t)(w->seq_k * dim), "the check's K codes");
    in->v8 = xmalloc((size_t)(w->seq_k * dim), "the check's V codes");
    fp8_quantize_head(w, in->q_all, qn, in->q8_all, &in->qd);
    fp8_quantize_head(w, in->k, w->seq_k, in->k8, &in->kd);
    fp8_quantize_head(w, in->v, w->seq_k, in->v8, &in->vd);
    in->q8 = in->q8_all + q0 * dim;
}

static void free_inputs(head_inputs *in) {
    void *bufs[] = {in->q_all, in->k, in->v, in->q8_all, in->k8, in->v8};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) free(bufs[i]);
}

/* The fp64 attention of query row qi (q: its D values) over the keys of the
 * selected key blocks cols[0 .. ncols): o[D] and the returned LSE. keys and
 * scores: every key of the row and its scaled score, *nkeys of them. */
static double reference_row(const workload *w, const int32_t *cols, int32_t ncols, const float *q,
                            const head_inputs *in, int64_t qi, int64_t *keys, double *scores,
                            double *o, int64_t *nkeys) {
    const int64_t dim = w->dim;
    /* Bottom-right causal alignment: key k is visible to query qi iff k <= qi + Sk - Sq. */
    const int64_t last_key = w->causal ? qi + w->seq_k - w->seq_q : w->seq_k - 1;
    const double scale = 1.0 / sqrt((double)dim);
    int64_t n = 0;
    double m = -INFINITY;
    for (int32_t c = 0; c < ncols; ++c) {
        const int64_t k0 = (int64_t)cols[c] * w->block_k;
        for (int64_t k = k0; k < k0 + w->block_k && k < w->seq_k && k <= last_key; ++k) {
            double dot = 0.0;
            for (int64_t d = 0; d < dim; ++d) dot += (double)q[d] * (double)in->k[k * dim + d];
            keys[n] = k;
            scores[n] = scale * dot;
            if (scores[n] > m) m = scores[n];
            ++n;
        }
    }
    for (int64_t d = 0; d < dim; ++d) o[d] = 0.0;
    *nkeys = n;
    if (n == 0) return -INFINITY;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double p = exp(scores[i] - m);
        sum += p;
        for (int64_t d = 0; d < dim; ++d) o[d] += p * (double)in->v[keys[i] * dim + d];
    }
    for (int64_t d = 0; d < dim; ++d) o[d] /= sum;
    return m + log(sum);
}

static void check_one_head(const workload *w, const sk_bsr *layout, const tensors *t, int64_t b,
                           int64_t h, check_result *c) {
    const int64_t r0_max = w->row_blocks - ceil_div(CHECK_MAX_ROWS, w->block_q);
    const int64_t q0 = (r0_max > 0 ? r0_max : 0) * w->block_q; /* first row checked */
    const int64_t rows = w->seq_q - q0, dim = w->dim;
    c->rows = rows;

    head_inputs in;
    regenerate_inputs(w, b, h, q0, rows, &in);
    void *o_got = xmalloc((size_t)(rows * dim) * host_dtype_size(w->dtype), "the check's O");
    float *lse_got = xmalloc((size_t)rows * sizeof(float), "the check's LSE");
    fetch_head(w, t, b, h, q0, rows, o_got, lse_got);

    const int32_t *offsets = layout->row_offsets + layout_slice(layout, w, b, h) * w->row_blocks;
    const int64_t max_keys = (int64_t)w->col_blocks * w->block_k;
    double *err_o = xmalloc((size_t)rows * sizeof(double), "the check's errors");
    double *err_lse = xmalloc((size_t)rows * sizeof(double), "the check's errors");
    int *row_ok = xmalloc((size_t)rows * sizeof(int), "the check's results");
#pragma omp parallel
    {
        int64_t *keys = xmalloc((size_t)max_keys * sizeof(int64_t), "the check's keys");
        double *scores = xmalloc((size_t)max_keys * sizeof(double), "the check's scores");
        double *o = xmalloc((size_t)dim * sizeof(double), "the check's row");
        double *work = w->fp8 ? xmalloc((size_t)(max_keys + 3 * dim) * sizeof(double), "the check's FP8 row")
                              : NULL;
#pragma omp for schedule(dynamic, 16)
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t qi = q0 + i, r = qi / w->block_q;
            int64_t n = 0;
            const double lse =
                reference_row(w, layout->col_indices + offsets[r], offsets[r + 1] - offsets[r],
                              in.q + i * dim, &in, qi, keys, scores, o, &n);
            double o_abs = c->tol, o_rel = c->tol, lse_abs = c->tol, lse_rel = c->tol;
            if (w->fp8) {
                fp8_row_tolerance(w, &in, i, keys, scores, n, o, lse, work, &o_abs, &o_rel,
                                  &lse_abs);
                lse_rel = 0.0;
            }
            double e = 0.0, e_lse = 0.0;
            int ok = 1;
            for (int64_t d = 0; d < dim; ++d)
                ok &= compare_value(host_load(o_got, w->dtype, i * dim + d), o[d], o_abs, o_rel, &e);
            ok &= compare_value(lse_got[i], lse, lse_abs, lse_rel, &e_lse);
            err_o[i] = e;
            err_lse[i] = e_lse;
            row_ok[i] = ok;
        }
        free(keys);
        free(scores);
        free(o);
        free(work);
    }
    for (int64_t i = 0; i < rows; ++i) {
        if (err_o[i] > c->max_err) c->max_err = err_o[i];
        if (err_lse[i] > c->max_err_lse) c->max_err_lse = err_lse[i];
        if (!row_ok[i]) c->passed = 0;
    }
    free_inputs(&in);
    free(o_got);
    free(lse_got);
    free(err_o);
    free(err_lse);
    free(row_ok);
}

/* pick[0 .. n): (0, 0) first, then distinct random (b, h) pairs, as b * Hq + h. */
static void pick_heads(const workload *w, int64_t n, int64_t *pick) {
    const int64_t pairs = w->batch * w->heads_q;
    uint64_t counter = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (n == pairs || i == 0) {
            pick[i] = i;
            continue;
        }
        for (;;) {
            const int64_t cand =
                (int64_t)(host_rng_word(w->seed, GEN_PICK, counter++) % (uint64_t)pairs);
            int dup = 0;
            for (int64_t j = 0; j < i; ++j) dup |= pick[j] == cand;
            if (!dup) {
                pick[i] = cand;
                break;
            }
        }
    }
}

void check_heads(const workload *w, const sk_bsr *host_layout, const tensors *t, check_result *c) {
    memset(c, 0, sizeof *c);
    c->tol = check_tolerance(w->dtype);
    c->fp8_rule = w->fp8;
    c->passed = 1;
    const int64_t pairs = w->batch * w->heads_q;
    const int64_t n = w->check_heads < pairs ? w->check_heads : pairs;
    if (n == 0) return;
    int64_t *pick = xmalloc((size_t)n * sizeof(int64_t), "the check's head list");
    pick_heads(w, n, pick);
    const double t0 = progress_elapsed();
    progress_line(1, "checking %lld head%s against the fp64 reference", (long long)n,
                  n == 1 ? "" : "s");
    for (int64_t i = 0; i < n; ++i) {
        const int64_t b = pick[i] / w->heads_q, h = pick[i] % w->heads_q;
        if (i < 3) {
            c->head_b[i] = b;
            c->head_h[i] = h;
        }
        check_one_head(w, host_layout, t, b, h, c);
        c->heads++;
        progress_line(i + 1 == n, "checked %lld of %lld heads (%lld rows each)", (long long)(i + 1),
                      (long long)n, (long long)c->rows);
    }
    progress_line(1, "check done in %.1f s: %s", progress_elapsed() - t0,
                  c->passed ? "pass" : "FAIL");
    free(pick);
}
