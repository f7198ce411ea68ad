/*
 * test_attention_varlen.c - the varlen attention forward (CPU backend)
 * against the naive dense fp64 reference on each sequence's unpacked copy
 * (tests/common/naive_ref.c), and bitwise against the fixed-batch forward
 * run on each sequence alone.
 *
 * Every case: seeded lengths (0 included), per-sequence random block masks
 * per layout head slice, and a varlen BSR made here from them (never the
 * layout builders: test_layout_varlen.c tests those); the test's own token
 * mask per (sequence, query head) from those masks, its slice mapping and
 * the bottom-right causal rule of each sequence. Q/K/V are rounded to the
 * dtype; the reference reads the same values in fp64. Before each run O and
 * LSE are NaN, and so is every element of Q/K/V that no query may read
 * (stride padding, keys no query of the sequence's KV head attends), so an
 * unwritten output or a stray read shows up. The tolerance rule is
 * tests/common/test_util.h's.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { MAXB = 12 };

typedef enum call_kind { CALL_FORWARD, CALL_PLAN_RUN, CALL_RUN } call_kind;

typedef struct varlen_case {
    sk_dtype dtype;
    int32_t batch;
    int32_t len_q[MAXB], len_k[MAXB];
    int64_t heads_q, heads_kv, head_dim;
    int32_t bq, bk;
    int causal;
    float scale;          /* 0: 1/sqrt(D) */
    int32_t layout_heads; /* 1, heads_kv or heads_q */
    double density;       /* probability that a block is selected */
    int padded;           /* token and head strides with gaps */
    int with_lse;
    call_kind call;
    int32_t extra_rows; /* layout rows past the sequences' (a capacity) */
} varlen_case;

/* What a run leaves for the tests that look further. */
typedef struct varlen_outcome {
    int64_t empty_rows; /* (query, head) rows with no admissible key */
    int64_t checked;
    int bitwise_sequences; /* sequences compared bit for bit with the fixed batch */
    void *o;               /* copies of the outputs when asked for */
    float *lse;
    size_t o_bytes;
} varlen_outcome;

static const sk_dtype all_dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};

static size_t elem_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

static varlen_case base_case(sk_dtype dtype, int32_t batch, const int32_t *lq, const int32_t *lk) {
    varlen_case c;
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
static int64_t slice_of(const varlen_case *c, int64_t h) {
    if (c->layout_heads == c->heads_q) return h;
    if (c->layout_heads == 1) return 0;
    return h / (c->heads_q / c->heads_kv);
}

/* The case's arrays: lengths, masks, the varlen BSR, the tensors. */
typedef struct varlen_data {
    int32_t cu_q[MAXB + 1], cu_k[MAXB + 1];
    int64_t nbq[MAXB], nbk[MAXB], row_start[MAXB], mask_at[MAXB];
    int64_t R, total_q, total_k;
    uint8_t *masks; /* sequence b: [layout_heads, nbq, nbk] at mask_at[b] */
    sk_bsr layout;
    int64_t ts_q, ts_k, hs; /* token strides (Q/O and K/V), head stride */
    void *q, *k, *v, *o;
    float *lse;
    int64_t q_span, k_span;
    double *qd, *kd, *vd; /* packed [total, H, D] copies in fp64 */
} varlen_data;

static void data_free(varlen_data *x) {
    free(x->masks);
    free(x->layout.row_offsets);
    free(x->layout.col_indices);
    free(x->q), free(x->k), free(x->v), free(x->o), free(x->lse);
    free(x->qd), free(x->kd), free(x->vd);
}

/* Block (i, j) of sequence b for query head h. */
static int block_on(const varlen_case *c, const varlen_data *x, int32_t b, int64_t h, int64_t i,
                    int64_t j) {
    return x->masks[x->mask_at[b] + (slice_of(c, h) * x->nbq[b] + i) * x->nbk[b] + j] != 0;
}

/* Query q of sequence b, head h, may see key k of the sequence. */
static int allowed(const varlen_case *c, const varlen_data *x, int32_t b, int64_t h, int64_t q,
                   int64_t k) {
    if (c->causal && k > q + c->len_k[b] - c->len_q[b]) return 0;
    return block_on(c, x, b, h, q / c->bq, k / c->bk);
}

/* Lengths, masks and the BSR (rows s * R + row_start[b] + i). */
static int make_layout(const varlen_case *c, tu_rng *rng, varlen_data *x) {
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
static int make_tensors(const varlen_case *c, tu_rng *rng, varlen_data *x) {
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim, group = Hq / Hkv;
    const size_t es = elem_size(c->dtype);
    x->hs = c->padded ? D + 3 : D;
    x->ts_q = c->padded ? Hq * x->hs + 5 : Hq * D;
    x->ts_k = c->padded ? Hkv * x->hs + 7 : Hkv * D;
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
                int used = 0;
                for (int64_t h = hk * group; h < (hk + 1) * group && !used; ++h)
                    for (int64_t qq = 0; qq < c->len_q[b] && !used; ++qq)
                        used = allowed(c, x, b, h, qq, kk);
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

static sk_status call_library(const varlen_case *c, varlen_data *x) {
    sk_attention_varlen_desc desc;
    sk_status st = sk_attention_varlen_desc_init(&desc, sizeof desc);
    if (st != SK_STATUS_SUCCESS) return st;
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = c->dtype;
    desc.batch = c->batch;
    desc.total_q = x->total_q;
    desc.total_k = x->total_k;
    desc.max_seqlen_q = desc.max_seqlen_k = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        if (c->len_q[b] > desc.max_seqlen_q) desc.max_seqlen_q = c->len_q[b];
        if (c->len_k[b] > desc.max_seqlen_k) desc.max_seqlen_k = c->len_k[b];
    }
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
    case CALL_FORWARD:
        return sk_attention_varlen_forward(&desc, &x->layout, x->cu_q, x->cu_k, x->q, x->k, x->v,
                                           x->o, lse, NULL, 0, NULL);
    case CALL_PLAN_RUN:
        st = sk_attention_varlen_plan(&desc, &x->layout, x->cu_q, x->cu_k, NULL, 0, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
        /* fall through */
    case CALL_RUN:
        break;
    }
    return sk_attention_varlen_run(&desc, &x->layout, x->cu_q, x->cu_k, x->q, x->k, x->v, x->o, lse,
                                   NULL, 0, NULL);
}

/* Each sequence alone through sk_attention_forward (B = 1, its own block
 * mask as a fixed layout, the same memory): its O rows and LSE columns must
 * equal the varlen call's bit for bit. Returns the sequences compared. */
static int compare_fixed_batch(const varlen_case *c, varlen_data *x, const char *label) {
    const int64_t Hq = c->heads_q, D = c->head_dim;
    const size_t es = elem_size(c->dtype);
    int compared = 0;
    for (int32_t b = 0; b < c->batch; ++b) {
        const int64_t lq = c->len_q[b], lk = c->len_k[b];
        if (lq == 0 || lk == 0) continue; /* no fixed-batch problem: the reference covers it */
        const sk_grid grid = {lq, lk, c->bq, c->bk, 1, c->layout_heads};
        sk_bsr seq;
        if (nr_bsr_from_mask(&seq, &grid, x->masks + x->mask_at[b]) != 0) {
            CHECK(0, "%s out of memory", label);
            return compared;
        }
        const int64_t span = (lq - 1) * x->ts_q + (Hq - 1) * x->hs + D;
        void *o = malloc((size_t)span * es);
        float *lse = (float *)malloc((size_t)(Hq * lq) * sizeof(float));
        sk_attention_desc d;
        sk_attention_desc_init(&d, sizeof d);
        d.backend = SK_BACKEND_CPU;
        d.dtype = c->dtype;
        d.batch = 1;
        d.seq_q = lq;
        d.seq_k = lk;
        d.heads_q = Hq;
        d.heads_kv = c->heads_kv;
        d.head_dim = D;
        d.scale = c->scale;
        d.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
        const int64_t sq[3] = {lq * x->ts_q, x->ts_q, x->hs},
                      sk[3] = {lk * x->ts_k, x->ts_k, x->hs};
        memcpy(d.q_strides, sq, sizeof sq);
        memcpy(d.o_strides, sq, sizeof sq);
        memcpy(d.k_strides, sk, sizeof sk);
        memcpy(d.v_strides, sk, sizeof sk);
        const char *qb = (const char *)x->q + (size_t)(x->cu_q[b] * x->ts_q) * es;
        const char *kb = (const char *)x->k + (size_t)(x->cu_k[b] * x->ts_k) * es;
        const char *vb = (const char *)x->v + (size_t)(x->cu_k[b] * x->ts_k) * es;
        sk_status st = o && lse ? sk_attention_forward(&d, &seq, qb, kb, vb, o, lse, NULL, 0, NULL)
                                : SK_STATUS_ALLOC_FAILED;
        CHECK(st == SK_STATUS_SUCCESS, "%s fixed batch, sequence %d: %s %s", label, (int)b,
              sk_status_name(st), sk_last_error());
        if (st == SK_STATUS_SUCCESS) {
            int same = 1;
            for (int64_t t = 0; t < lq && same; ++t)
                for (int64_t h = 0; h < Hq && same; ++h) {
                    const size_t at = (size_t)(t * x->ts_q + h * x->hs);
                    same = memcmp((char *)o + at * es,
                                  (char *)x->o + (at + (size_t)(x->cu_q[b] * x->ts_q)) * es,
                                  (size_t)D * es) == 0;
                    if (same && c->with_lse)
                        same = memcmp(&lse[h * lq + t], &x->lse[h * x->total_q + x->cu_q[b] + t],
                                      4) == 0;
                }
            CHECK(same, "%s sequence %d differs from the fixed-batch forward", label, (int)b);
            ++compared;
        }
        free(o);
        free(lse);
        nr_bsr_free(&seq);
    }
    return compared;
}

/* Every query row of every sequence against the naive reference; the
 * padding of O untouched; LSE untouched when NULL. Returns mismatches. */
static int64_t compare_reference(const varlen_case *c, varlen_data *x, const char *label,
                                 varlen_outcome *out) {
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim, group = Hq / Hkv;
    const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
    int64_t longest_k = 1;
    for (int32_t b = 0; b < c->batch; ++b)
        if (c->len_k[b] > longest_k) longest_k = c->len_k[b];
    uint8_t *allow = (uint8_t *)malloc((size_t)longest_k);
    uint8_t *o_used = (uint8_t *)calloc((size_t)x->q_span, 1);
    double *od = (double *)malloc((size_t)D * sizeof(double));
    int64_t bad = 0;
    if (!allow || !o_used || !od) {
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
                        const double tol = tu_attn_tol_o(c->dtype, od[d], (double)D, smag, vmax, n);
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
    return bad;
}

/* Run one case; returns 0 when everything matched. */
static int run_case(const varlen_case *c, uint64_t seed, varlen_outcome *out_arg) {
    char label[400];
    int w = snprintf(label, sizeof label,
                     "[seed %llu: %s B=%d Hq=%lld Hkv=%lld D=%lld bq=%d bk=%d causal=%d "
                     "scale=%g lheads=%d density=%.2f padded=%d lse=%d call=%d extra=%d lens",
                     (unsigned long long)seed,
                     c->dtype == SK_DTYPE_F16    ? "F16"
                     : c->dtype == SK_DTYPE_BF16 ? "BF16"
                                                 : "F32",
                     (int)c->batch, (long long)c->heads_q, (long long)c->heads_kv,
                     (long long)c->head_dim, (int)c->bq, (int)c->bk, c->causal, (double)c->scale,
                     (int)c->layout_heads, c->density, c->padded, c->with_lse, (int)c->call,
                     (int)c->extra_rows);
    for (int32_t b = 0; b < c->batch && w > 0 && w < (int)sizeof label - 24; ++b)
        w += snprintf(label + w, sizeof label - (size_t)w, " %dx%d", (int)c->len_q[b],
                      (int)c->len_k[b]);
    if (w > 0 && w < (int)sizeof label - 2) snprintf(label + w, sizeof label - (size_t)w, "]");
    const int failures_before = sk_test_failures();
    varlen_outcome local;
    varlen_outcome *out = out_arg != NULL ? out_arg : &local;
    memset(out, 0, sizeof *out);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    varlen_data x;
    memset(&x, 0, sizeof x);
    if (!make_layout(c, &rng, &x) || !make_tensors(c, &rng, &x)) {
        CHECK(0, "%s out of memory", label);
        data_free(&x);
        return 1;
    }
    const sk_status st = call_library(c, &x);
    CHECK(st == SK_STATUS_SUCCESS, "%s %s: %s", label, sk_status_name(st), sk_last_error());
    if (st == SK_STATUS_SUCCESS) {
        const int64_t bad = compare_reference(c, &x, label, out);
        CHECK(bad == 0, "%s %lld mismatches", label, (long long)bad);
        out->bitwise_sequences = compare_fixed_batch(c, &x, label);
        if (out_arg != NULL) {
            out->o_bytes = (size_t)x.q_span * elem_size(c->dtype);
            out->o = malloc(out->o_bytes);
            out->lse = (float *)malloc((size_t)(c->heads_q * x.total_q) * sizeof(float));
            if (out->o) memcpy(out->o, x.o, out->o_bytes);
            if (out->lse) memcpy(out->lse, x.lse, (size_t)(c->heads_q * x.total_q) * sizeof(float));
        }
    }
    data_free(&x);
    return sk_test_failures() != failures_before;
}

static uint64_t case_seed(uint64_t test_id, uint64_t case_id) {
    tu_rng r;
    tu_rng_seed(&r, tu_base_seed() ^ (test_id * 0x100000001B3ull) ^ (case_id << 24) ^ 0x7a11e4);
    return tu_rng_next(&r);
}

/* Lengths around the block edges, q shorter and longer than k, empty
 * sequences of every kind, in every dtype. */
SK_TEST(varlen_cpu_lengths_at_block_edges) {
    static const int32_t lq[8] = {1, 63, 64, 65, 0, 130, 200, 5};
    static const int32_t lk[8] = {1, 64, 200, 0, 7, 129, 60, 300};
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int causal = 0; causal < 2; ++causal) {
            varlen_case c = base_case(all_dtypes[t], 8, lq, lk);
            c.causal = causal;
            c.heads_q = 2;
            c.heads_kv = 1;
            c.density = 0.8;
            varlen_outcome out;
            if (!run_case(&c, case_seed(1, (uint64_t)id++), &out))
                CHECK(out.bitwise_sequences == 6, "%d sequences compared bitwise",
                      out.bitwise_sequences);
            free(out.o), free(out.lse);
        }
}

/* Causal is bottom-right per sequence: with a full layout, exactly the
 * first len_q - len_k queries of each sequence (times Hq) see no key, and
 * every query of a sequence with no key. */
SK_TEST(varlen_cpu_causal_is_bottom_right_per_sequence) {
    static const int32_t lq[5] = {300, 70, 128, 1, 40};
    static const int32_t lk[5] = {130, 250, 128, 90, 0};
    for (int t = 0; t < 3; ++t) {
        varlen_case c = base_case(all_dtypes[t], 5, lq, lk);
        c.causal = 1;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.bk = 128;
        varlen_outcome out;
        if (!run_case(&c, case_seed(2, (uint64_t)t), &out)) {
            int64_t want = 0;
            for (int b = 0; b < 5; ++b) want += (lq[b] > lk[b] ? lq[b] - lk[b] : 0) * c.heads_q;
            CHECK(out.empty_rows == want, "%lld empty rows, want %lld", (long long)out.empty_rows,
                  (long long)want);
        }
        free(out.o), free(out.lse);
    }
}

/* GQA 1, 4 and 8 with layouts per KV head, per query head and broadcast. */
SK_TEST(varlen_cpu_gqa_and_layout_slices) {
    static const int32_t lq[3] = {90, 200, 17}, lk[3] = {150, 64, 300};
    static const int64_t groups[3] = {1, 4, 8};
    int id = 0;
    for (int gi = 0; gi < 3; ++gi)
        for (int lh = 0; lh < 3; ++lh) {
            varlen_case c = base_case(all_dtypes[id % 3], 3, lq, lk);
            c.heads_kv = 2;
            c.heads_q = 2 * groups[gi];
            c.head_dim = 16;
            c.density = 0.6;
            c.causal = lh == 2;
            c.layout_heads = (int32_t)(lh == 0 ? c.heads_kv : lh == 1 ? c.heads_q : 1);
            run_case(&c, case_seed(3, (uint64_t)id++), NULL);
        }
}

/* The shapes of the issue: D 64 and 128, blocks 64 and 128, each dtype. */
SK_TEST(varlen_cpu_head_dims_and_blocks) {
    static const int32_t lq[4] = {129, 0, 64, 250}, lk[4] = {257, 33, 64, 128};
    static const int32_t blocks[4][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}};
    int id = 0;
    for (int bi = 0; bi < 4; ++bi)
        for (int di = 0; di < 2; ++di) {
            varlen_case c = base_case(all_dtypes[id % 3], 4, lq, lk);
            c.bq = blocks[bi][0];
            c.bk = blocks[bi][1];
            c.head_dim = di ? 128 : 64;
            c.heads_q = 2;
            c.heads_kv = 1;
            c.density = 0.7;
            c.causal = (bi + di) % 2;
            run_case(&c, case_seed(4, (uint64_t)id++), NULL);
        }
}

/* Seeded random cases: every option at random. */
SK_TEST(varlen_cpu_random_cases) {
    tu_rng rng;
    tu_rng_seed(&rng, case_seed(5, 999));
    int compared = 0;
    for (int id = 0; id < 40; ++id) {
        int32_t lq[MAXB], lk[MAXB];
        const int32_t batch = (int32_t)tu_rng_range(&rng, 1, 8);
        int64_t total_q = 0, total_k = 0;
        for (int32_t b = 0; b < batch; ++b) {
            /* Mostly short; now and then empty, or several blocks. */
            const int64_t kind = tu_rng_range(&rng, 0, 9);
            lq[b] = (int32_t)(kind == 0  ? 0
                              : kind < 7 ? tu_rng_range(&rng, 1, 140)
                                         : tu_rng_range(&rng, 140, 330));
            lk[b] = (int32_t)(kind == 1 ? 0 : tu_rng_range(&rng, 1, 330));
            total_q += lq[b];
            total_k += lk[b];
        }
        if (total_q == 0) lq[0] = 1;
        if (total_k == 0) lk[0] = 1;
        varlen_case c = base_case(all_dtypes[tu_rng_range(&rng, 0, 2)], batch, lq, lk);
        c.heads_kv = tu_rng_range(&rng, 1, 2);
        c.heads_q = c.heads_kv * (int64_t)(1 << tu_rng_range(&rng, 0, 3));
        c.head_dim = tu_rng_range(&rng, 0, 3) == 0 ? tu_rng_range(&rng, 1, 40)
                                                   : 64 * tu_rng_range(&rng, 1, 2);
        c.bq = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        c.bk = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        c.causal = (int)tu_rng_range(&rng, 0, 1);
        c.density = tu_rng_uniform(&rng);
        const int64_t lh = tu_rng_range(&rng, 0, 2);
        c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? c.heads_kv : c.heads_q);
        c.padded = (int)tu_rng_range(&rng, 0, 1);
        c.with_lse = tu_rng_range(&rng, 0, 3) != 0;
        c.call = (call_kind)tu_rng_range(&rng, 0, 2);
        c.extra_rows = (int32_t)(tu_rng_range(&rng, 0, 2) == 0 ? tu_rng_range(&rng, 1, 3) : 0);
        c.scale = tu_rng_range(&rng, 0, 1) ? 0.0f : (float)(0.05 + tu_rng_uniform(&rng));
        varlen_outcome out;
        run_case(&c, case_seed(5, (uint64_t)id), &out);
        compared += out.bitwise_sequences;
        free(out.o), free(out.lse);
    }
    CHECK(compared > 40, "only %d sequences compared with the fixed batch", compared);
}

/* The result does not depend on the thread count: bitwise equal. */
SK_TEST(varlen_cpu_repeatable_across_thread_counts) {
    static const int32_t lq[4] = {300, 1, 0, 190}, lk[4] = {280, 77, 5, 400};
    varlen_case c = base_case(SK_DTYPE_F32, 4, lq, lk);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.layout_heads = 2;
    c.density = 0.5;
    c.causal = 1;
    const uint64_t seed = case_seed(6, 0);
    varlen_outcome a, b;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const int fa = run_case(&c, seed, &a);
    omp_set_num_threads(saved > 1 ? saved : 3);
    const int fb = run_case(&c, seed, &b);
    omp_set_num_threads(saved);
    if (!fa && !fb && a.o && b.o && a.lse && b.lse) {
        CHECK(memcmp(a.o, b.o, a.o_bytes) == 0, "O differs between 1 and %d threads (seed %llu)",
              saved, (unsigned long long)seed);
        CHECK(memcmp(a.lse, b.lse, (size_t)(4 * 491) * sizeof(float)) == 0, "LSE differs");
    }
    free(a.o), free(a.lse), free(b.o), free(b.lse);
}
