/*
 * varlen_case.c - the seeded varlen cases of varlen_case.h.
 */
#include "common/varlen_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"

size_t vc_elem_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

vc_case vc_base_case(sk_dtype dtype, int32_t batch, const int32_t *lq, const int32_t *lk) {
    vc_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.batch = batch;
    for (int32_t b = 0; b < batch; ++b) {
        c.len_q[b] = lq[b];
        c.len_k[b] = lk[b];
    }
    c.heads_q = c.heads_kv = 1;
    c.head_dim = 32;
    c.bq = c.bk = 64;
    c.layout_heads = 1;
    c.density = 1.0;
    c.with_lse = 1;
    return c;
}

/* The layout head slice of query head h (the rule of sparsek.h, written
 * out independently). */
static int64_t slice_of(const vc_case *c, int64_t h) {
    if (c->layout_heads == c->heads_q) return h;
    if (c->layout_heads == 1) return 0;
    return h / (c->heads_q / c->heads_kv);
}

void vc_data_free(vc_data *x) {
    free(x->masks);
    free(x->layout.row_offsets);
    free(x->layout.col_indices);
    free(x->q), free(x->k), free(x->v), free(x->o), free(x->lse);
    free(x->qd), free(x->kd), free(x->vd);
}

/* Block (i, j) of sequence b for query head h. */
static int block_on(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t i,
                    int64_t j) {
    return x->masks[x->mask_at[b] + (slice_of(c, h) * x->nbq[b] + i) * x->nbk[b] + j] != 0;
}

/* Query q of sequence b, head h, may see key k of the sequence. */
static int allowed(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t q, int64_t k) {
    if (c->causal && k > q + c->len_k[b] - c->len_q[b]) return 0;
    return block_on(c, x, b, h, q / c->bq, k / c->bk);
}

/* Row block i of sequence b, head h, visits key block j (kernel_rules):
 * selected and, when causal, holding a key <= the row's last visible one
 * (plan_contract.cuh's rule, bottom-right per sequence). */
static int block_visited(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t i,
                         int64_t j) {
    const int64_t lq = c->len_q[b], lk = c->len_k[b];
    const int64_t last = (i + 1) * c->bq < lq ? (i + 1) * c->bq : lq;
    if (c->causal && j * c->bk > last - 1 + lk - lq) return 0;
    return block_on(c, x, b, h, i, j);
}

/* Whether a kernel (kernel_rules) or the CPU backend may read key kk of
 * sequence b, KV head hk: otherwise its K and V are NaN. */
static int key_read(const vc_case *c, const vc_data *x, int32_t b, int64_t hk, int64_t kk) {
    const int64_t group = c->heads_q / c->heads_kv;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        if (c->kernel_rules) {
            for (int64_t i = 0; i < x->nbq[b]; ++i)
                if (block_visited(c, x, b, h, i, kk / c->bk)) return 1;
        } else {
            for (int64_t qq = 0; qq < c->len_q[b]; ++qq)
                if (allowed(c, x, b, h, qq, kk)) return 1;
        }
    }
    return 0;
}

/* Lengths, masks and the BSR (rows s * R + row_start[b] + i). */
static int make_layout(const vc_case *c, tu_rng *rng, vc_data *x) {
    int64_t rows = 0, mask_bytes = 0, longest_k = 1;
    x->cu_q[0] = x->cu_k[0] = 0;
    for (int32_t b = 0; b < c->batch; ++b) {
        x->cu_q[b + 1] = x->cu_q[b] + c->len_q[b];
        x->cu_k[b + 1] = x->cu_k[b] + c->len_k[b];
        x->nbq[b] = (c->len_q[b] + c->bq - 1) / c->bq;
        x->nbk[b] = (c->len_k[b] + c->bk - 1) / c->bk;
        x->row_start[b] = rows;
        x->mask_at[b] = mask_bytes;
        rows += x->nbq[b];
        mask_bytes += c->layout_heads * x->nbq[b] * x->nbk[b];
        if (c->len_k[b] > longest_k) longest_k = c->len_k[b];
    }
    x->total_q = x->cu_q[c->batch];
    x->total_k = x->cu_k[c->batch];
    x->R = rows + c->extra_rows > 0 ? rows + c->extra_rows : 1;
    x->masks = (uint8_t *)malloc((size_t)mask_bytes + 1);
    const int64_t nrows = c->layout_heads * x->R;
    x->layout.row_offsets = (int32_t *)malloc((size_t)(nrows + 1) * sizeof(int32_t));
    x->layout.col_indices = (int32_t *)malloc((size_t)(mask_bytes + 1) * sizeof(int32_t));
    if (!x->masks || !x->layout.row_offsets || !x->layout.col_indices) return 0;
    for (int64_t e = 0; e < mask_bytes; ++e) x->masks[e] = tu_rng_uniform(rng) < c->density;
    if (c->window_blocks > 0) /* sinks + window: no randomness */
        for (int32_t b = 0; b < c->batch; ++b)
            for (int64_t s = 0; s < c->layout_heads; ++s)
                for (int64_t i = 0; i < x->nbq[b]; ++i) {
                    /* the block of the row's last query's diagonal key */
                    const int64_t last =
                        (i + 1) * c->bq < c->len_q[b] ? (i + 1) * c->bq : c->len_q[b];
                    const int64_t diag = (last - 1 + c->len_k[b] - c->len_q[b]) / c->bk;
                    uint8_t *row = x->masks + x->mask_at[b] + (s * x->nbq[b] + i) * x->nbk[b];
                    for (int64_t j = 0; j < x->nbk[b]; ++j)
                        row[j] = j < c->sink_blocks || (j <= diag && j > diag - c->window_blocks);
                }
    int32_t n = 0;
    x->layout.row_offsets[0] = 0;
    for (int64_t s = 0; s < c->layout_heads; ++s) {
        int64_t g = s * x->R;
        for (int32_t b = 0; b < c->batch; ++b)
            for (int64_t i = 0; i < x->nbq[b]; ++i, ++g) {
                const uint8_t *row = x->masks + x->mask_at[b] + (s * x->nbq[b] + i) * x->nbk[b];
                for (int64_t j = 0; j < x->nbk[b]; ++j)
                    if (row[j]) x->layout.col_indices[n++] = (int32_t)j;
                x->layout.row_offsets[g + 1] = n;
            }
        for (; g < (s + 1) * x->R; ++g) x->layout.row_offsets[g + 1] = n;
    }
    const sk_grid grid = {x->R * c->bq, longest_k, c->bq, c->bk, 1, c->layout_heads};
    x->layout.grid = grid;
    x->layout.nnz = n;
    return 1;
}

/* The tensors, NaN where nothing may be read, and their fp64 copies. */
static int make_tensors(const vc_case *c, tu_rng *rng, vc_data *x) {
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const size_t es = vc_elem_size(c->dtype);
    const int aligned = c->padded == 2; /* gaps of 8 elements: 16-byte rows */
    x->hs = c->padded ? D + (aligned ? 8 : 3) : D;
    x->ts_q = c->padded ? Hq * x->hs + (aligned ? 16 : 5) : Hq * D;
    x->ts_k = c->padded ? Hkv * x->hs + (aligned ? 24 : 7) : Hkv * D;
    x->q_span = (x->total_q - 1) * x->ts_q + (Hq - 1) * x->hs + D;
    x->k_span = (x->total_k - 1) * x->ts_k + (Hkv - 1) * x->hs + D;
    x->q = malloc((size_t)x->q_span * es);
    x->o = malloc((size_t)x->q_span * es);
    x->k = malloc((size_t)x->k_span * es);
    x->v = malloc((size_t)x->k_span * es);
    x->lse = (float *)malloc((size_t)(Hq * x->total_q) * sizeof(float));
    x->qd = (double *)malloc((size_t)(x->total_q * Hq * D) * sizeof(double));
    x->kd = (double *)malloc((size_t)(x->total_k * Hkv * D) * sizeof(double));
    x->vd = (double *)malloc((size_t)(x->total_k * Hkv * D) * sizeof(double));
    if (!x->q || !x->o || !x->k || !x->v || !x->lse || !x->qd || !x->kd || !x->vd) return 0;
    tu_fill_nan(x->q, c->dtype, x->q_span);
    tu_fill_nan(x->o, c->dtype, x->q_span);
    tu_fill_nan(x->k, c->dtype, x->k_span);
    tu_fill_nan(x->v, c->dtype, x->k_span);
    tu_fill_nan(x->lse, SK_DTYPE_F32, Hq * x->total_q);
    for (int64_t t = 0; t < x->total_q; ++t)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const int64_t at = t * x->ts_q + h * x->hs + d;
                tu_store(x->q, c->dtype, at, (float)tu_rng_normal(rng));
                x->qd[(t * Hq + h) * D + d] = tu_load(x->q, c->dtype, at);
            }
    for (int32_t b = 0; b < c->batch; ++b)
        for (int64_t kk = 0; kk < c->len_k[b]; ++kk)
            for (int64_t hk = 0; hk < Hkv; ++hk) {
                const int used = key_read(c, x, b, hk, kk);
                const int64_t t = x->cu_k[b] + kk;
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t at = t * x->ts_k + hk * x->hs + d;
                    tu_store(x->k, c->dtype, at, (float)tu_rng_normal(rng));
                    tu_store(x->v, c->dtype, at, (float)tu_rng_normal(rng));
                    x->kd[(t * Hkv + hk) * D + d] = tu_load(x->k, c->dtype, at);
                    x->vd[(t * Hkv + hk) * D + d] = tu_load(x->v, c->dtype, at);
                    if (!used) {
                        tu_store(x->k, c->dtype, at, NAN);
                        tu_store(x->v, c->dtype, at, NAN);
                    }
                }
            }
    return 1;
}

void vc_max_lengths(const vc_case *c, int64_t *max_q, int64_t *max_k) {
    *max_q = *max_k = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        if (c->len_q[b] > *max_q) *max_q = c->len_q[b];
        if (c->len_k[b] > *max_k) *max_k = c->len_k[b];
    }
}

vc_case vc_random_case(tu_rng *rng, int32_t max_batch, int32_t max_len_q, int32_t max_len_k) {
    static const sk_dtype dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};
    int32_t lq[VC_MAXB], lk[VC_MAXB];
    const int32_t batch = (int32_t)tu_rng_range(rng, 1, max_batch);
    int64_t total_q = 0, total_k = 0;
    for (int32_t b = 0; b < batch; ++b) {
        /* Mostly short; now and then empty, or several blocks. */
        const int64_t kind = tu_rng_range(rng, 0, 9);
        lq[b] = (int32_t)(kind == 0  ? 0
                          : kind < 7 ? tu_rng_range(rng, 1, max_len_q / 2)
                                     : tu_rng_range(rng, max_len_q / 2, max_len_q));
        lk[b] = (int32_t)(kind == 1 ? 0 : tu_rng_range(rng, 1, max_len_k));
        total_q += lq[b];
        total_k += lk[b];
    }
    if (total_q == 0) lq[0] = 1;
    if (total_k == 0) lk[0] = 1;
    vc_case c = vc_base_case(dtypes[tu_rng_range(rng, 0, 2)], batch, lq, lk);
    c.heads_kv = tu_rng_range(rng, 1, 2);
    c.heads_q = c.heads_kv * (int64_t)(1 << tu_rng_range(rng, 0, 3));
    c.head_dim =
        tu_rng_range(rng, 0, 3) == 0 ? tu_rng_range(rng, 1, 40) : 64 * tu_rng_range(rng, 1, 2);
    c.bq = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c.bk = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c.causal = (int)tu_rng_range(rng, 0, 1);
    c.density = tu_rng_uniform(rng);
    const int64_t lh = tu_rng_range(rng, 0, 2);
    c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? c.heads_kv : c.heads_q);
    c.padded = (int)tu_rng_range(rng, 0, 1);
    c.with_lse = tu_rng_range(rng, 0, 3) != 0;
    c.call = (vc_call)tu_rng_range(rng, 0, 2);
    c.extra_rows = (int32_t)(tu_rng_range(rng, 0, 2) == 0 ? tu_rng_range(rng, 1, 3) : 0);
    c.scale = tu_rng_range(rng, 0, 1) ? 0.0f : (float)(0.05 + tu_rng_uniform(rng));
    return c;
}

int vc_make(const vc_case *c, tu_rng *rng, vc_data *x) {
    memset(x, 0, sizeof *x);
    return make_layout(c, rng, x) && make_tensors(c, rng, x);
}

sk_status vc_call_varlen(const vc_case *c, vc_data *x) {
    sk_attention_varlen_desc desc;
    sk_status st = sk_attention_varlen_desc_init(&desc, sizeof desc);
    if (st != SK_STATUS_SUCCESS) return st;
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = c->dtype;
    desc.batch = c->batch;
    desc.total_q = x->total_q;
    desc.total_k = x->total_k;
    vc_max_lengths(c, &desc.max_seqlen_q, &desc.max_seqlen_k);
    desc.heads_q = c->heads_q;
    desc.heads_kv = c->heads_kv;
    desc.head_dim = c->head_dim;
    desc.scale = c->scale;
    desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    if (c->padded) {
        desc.q_strides[0] = desc.o_strides[0] = x->ts_q;
        desc.k_strides[0] = desc.v_strides[0] = x->ts_k;
        desc.q_strides[1] = desc.k_strides[1] = desc.v_strides[1] = desc.o_strides[1] = x->hs;
    }
    float *lse = c->with_lse ? x->lse : NULL;
    switch (c->call) {
    case VC_FORWARD:
        return sk_attention_varlen_forward(&desc, &x->layout, x->cu_q, x->cu_k, x->q, x->k, x->v,
                                           x->o, lse, NULL, 0, NULL);
    case VC_PLAN_RUN:
        st = sk_attention_varlen_plan(&desc, &x->layout, x->cu_q, x->cu_k, NULL, 0, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
        /* fall through */
    case VC_RUN:
        break;
    }
    return sk_attention_varlen_run(&desc, &x->layout, x->cu_q, x->cu_k, x->q, x->k, x->v, x->o, lse,
                                   NULL, 0, NULL);
}

/* Every query row of every sequence against the naive reference; the
 * padding of O untouched; LSE untouched when NULL. Returns mismatches. */
int64_t vc_compare_reference(const vc_case *c, vc_data *x, const char *label, vc_outcome *out) {
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim, group = Hq / Hkv;
    const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
    int64_t longest_k = 1;
    for (int32_t b = 0; b < c->batch; ++b)
        if (c->len_k[b] > longest_k) longest_k = c->len_k[b];
    uint8_t *allow = (uint8_t *)malloc((size_t)longest_k);
    uint8_t *o_used = (uint8_t *)calloc((size_t)x->q_span, 1);
    double *od = (double *)malloc((size_t)D * sizeof(double));
    double *pv = (double *)malloc((size_t)D * sizeof(double)); /* sum_k p_k |v_kd| */
    int64_t bad = 0;
    if (!allow || !o_used || !od || !pv) {
        CHECK(0, "%s out of memory", label);
        bad = 1;
        goto done;
    }
    for (int32_t b = 0; b < c->batch; ++b) {
        const int64_t lq = c->len_q[b], lk = c->len_k[b];
        for (int64_t hk = 0; hk < Hkv; ++hk) {
            /* The sequence's largest |k|_2 and |v| for the tolerance. */
            double kmax = 0.0, vmax = 0.0;
            const double *kb = x->kd + (x->cu_k[b] * Hkv + hk) * D;
            const double *vb = x->vd + (x->cu_k[b] * Hkv + hk) * D;
            for (int64_t kk = 0; kk < lk; ++kk) {
                double kn = 0.0;
                for (int64_t d = 0; d < D; ++d) {
                    kn += kb[kk * Hkv * D + d] * kb[kk * Hkv * D + d];
                    if (fabs(vb[kk * Hkv * D + d]) > vmax) vmax = fabs(vb[kk * Hkv * D + d]);
                }
                if (sqrt(kn) > kmax) kmax = sqrt(kn);
            }
            for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
                for (int64_t qq = 0; qq < lq; ++qq) {
                    const int64_t t = x->cu_q[b] + qq;
                    const double *qrow = x->qd + (t * Hq + h) * D;
                    double n = 0.0, qn = 0.0, ref_lse;
                    for (int64_t kk = 0; kk < lk; ++kk)
                        n += allow[kk] = (uint8_t)allowed(c, x, b, h, qq, kk);
                    for (int64_t d = 0; d < D; ++d) qn += qrow[d] * qrow[d];
                    nr_attention_row(lk, D, scale, qrow, kb, Hkv * D, vb, Hkv * D, allow, od,
                                     &ref_lse);
                    const double smag = fabs(scale) * sqrt(qn) * kmax;
                    const int empty = n == 0.0;
                    /* The kernels round P to the dtype before P V
                     * (kernel_rules in varlen_case.h): 2 u sum_k p_k |v_kd|
                     * more per element, as gpu_util.h's rule. */
                    for (int64_t d = 0; d < D; ++d) pv[d] = 0.0;
                    for (int64_t kk = 0; kk < lk && c->kernel_rules && !empty; ++kk) {
                        if (!allow[kk]) continue;
                        double sk = 0.0;
                        for (int64_t d = 0; d < D; ++d) sk += qrow[d] * kb[kk * Hkv * D + d];
                        const double pk = exp(scale * sk - ref_lse);
                        for (int64_t d = 0; d < D; ++d) pv[d] += pk * fabs(vb[kk * Hkv * D + d]);
                    }
                    out->empty_rows += empty;
                    if (c->with_lse) {
                        const double got = x->lse[h * x->total_q + t];
                        const int ok = empty ? isinf(got) && got < 0
                                             : isfinite(got) &&
                                                   fabs(got - ref_lse) <=
                                                       tu_attn_tol_lse(ref_lse, (double)D, smag, n);
                        if (!ok && bad++ < 3)
                            CHECK(ok,
                                  "%s LSE[h=%lld, t=%lld] (sequence %d, q %lld) = %.9g, reference "
                                  "%.9g",
                                  label, (long long)h, (long long)t, (int)b, (long long)qq, got,
                                  ref_lse);
                    }
                    for (int64_t d = 0; d < D; ++d) {
                        const int64_t at = t * x->ts_q + h * x->hs + d;
                        o_used[at] = 1;
                        const double got = tu_load(x->o, c->dtype, at);
                        const double tol =
                            tu_attn_tol_o(c->dtype, od[d], (double)D, smag, vmax, n) +
                            2.0 * tu_unit_roundoff(c->dtype) * pv[d];
                        const int ok =
                            empty ? got == 0.0 : isfinite(got) && fabs(got - od[d]) <= tol;
                        ++out->checked;
                        if (!ok && bad++ < 3)
                            CHECK(ok,
                                  "%s O[t=%lld, h=%lld, d=%lld] (sequence %d) = %.9g, reference "
                                  "%.9g, tol %.3g",
                                  label, (long long)t, (long long)h, (long long)d, (int)b, got,
                                  od[d], tol);
                    }
                }
        }
    }
    for (int64_t e = 0; e < x->q_span; ++e)
        if (!o_used[e] && !isnan(tu_load(x->o, c->dtype, e)) && bad++ < 3)
            CHECK(0, "%s O padding element %lld was written", label, (long long)e);
    if (!c->with_lse)
        for (int64_t e = 0; e < Hq * x->total_q; ++e)
            if (!isnan(x->lse[e]) && bad++ < 3) CHECK(0, "%s lse was NULL, yet written", label);
done:
    free(allow);
    free(o_used);
    free(od);
    free(pv);
    return bad;
}

void vc_label(const vc_case *c, uint64_t seed, char *label, size_t size) {
    int w =
        snprintf(label, size,
                 "[seed %llu: %s B=%d Hq=%lld Hkv=%lld D=%lld bq=%d bk=%d causal=%d "
                 "scale=%g lheads=%d density=%.2f padded=%d lse=%d call=%d extra=%d win=%d+%d lens",
                 (unsigned long long)seed,
                 c->dtype == SK_DTYPE_F16    ? "F16"
                 : c->dtype == SK_DTYPE_BF16 ? "BF16"
                                             : "F32",
                 (int)c->batch, (long long)c->heads_q, (long long)c->heads_kv,
                 (long long)c->head_dim, (int)c->bq, (int)c->bk, c->causal, (double)c->scale,
                 (int)c->layout_heads, c->density, c->padded, c->with_lse, (int)c->call,
                 (int)c->extra_rows, (int)c->sink_blocks, (int)c->window_blocks);
    for (int32_t b = 0; b < c->batch && w > 0 && w < (int)size - 24; ++b)
        w += snprintf(label + w, size - (size_t)w, " %dx%d", (int)c->len_q[b], (int)c->len_k[b]);
    if (w > 0 && w < (int)size - 2) snprintf(label + w, size - (size_t)w, "]");
}

int vc_allowed(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t q, int64_t k) {
    return allowed(c, x, b, h, q, k);
}
