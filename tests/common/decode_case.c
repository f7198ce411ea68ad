/*
 * decode_case.c - seeded decode cases and their naive fp64 check (see
 * decode_case.h). Independent of src/: the layout, the pages and the
 * reference's key gathering are written here.
 */
#include "common/decode_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"

size_t dc_elem_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

static int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

dc_case dc_random_case(tu_rng *rng, int32_t max_batch, int32_t max_len_k, int cpu) {
    static const int32_t pages[4] = {16, 32, 64, 128};
    static const int32_t blocks[5] = {0, 16, 32, 64, 128};
    static const int64_t groups[5] = {1, 2, 4, 8, 16};
    dc_case c;
    memset(&c, 0, sizeof c);
    const int d = (int)tu_rng_range(rng, 0, cpu ? 5 : 2);
    c.dtype = d == 0 || d == 3 ? SK_DTYPE_F16 : d == 1 || d == 4 ? SK_DTYPE_BF16
              : cpu            ? SK_DTYPE_F32
                               : SK_DTYPE_BF16;
    c.batch = (int32_t)tu_rng_range(rng, 1, max_batch);
    c.q_len = tu_rng_uniform(rng) < 0.4 ? 1 : (int32_t)tu_rng_range(rng, 1, 16);
    c.heads_kv = tu_rng_range(rng, 1, 3);
    c.heads_q = c.heads_kv * groups[tu_rng_range(rng, 0, 4)];
    c.head_dim = tu_rng_uniform(rng) < 0.5 ? 64 : 128;
    if (cpu && tu_rng_uniform(rng) < 0.2) c.head_dim = tu_rng_uniform(rng) < 0.5 ? 24 : 40;
    c.page_size = pages[tu_rng_range(rng, 0, 3)];
    c.block_k = blocks[tu_rng_range(rng, 0, 4)];
    c.layout_heads = tu_rng_uniform(rng) < 0.3 ? 1 : (int32_t)c.heads_kv;
    c.density = tu_rng_uniform(rng) < 0.15 ? 0.0 : 0.2 + 0.8 * tu_rng_uniform(rng);
    c.causal = tu_rng_uniform(rng) < 0.7;
    c.scale = tu_rng_uniform(rng) < 0.2 ? 0.05f : 0.0f;
    c.padded = tu_rng_uniform(rng) < 0.4;
    c.shuffle = tu_rng_uniform(rng) < 0.7;
    c.share = tu_rng_uniform(rng) < 0.3;
    c.extra_pages = (int32_t)tu_rng_range(rng, 0, 3);
    c.extra_keys = tu_rng_uniform(rng) < 0.3 ? (int32_t)tu_rng_range(rng, 1, 200) : 0;
    c.past_end = !cpu && c.block_k != 0 && tu_rng_uniform(rng) < 0.3;
    c.with_lse = tu_rng_uniform(rng) < 0.8;
    c.num_splits = tu_rng_uniform(rng) < 0.4 ? (int32_t)tu_rng_range(rng, 1, 40) : 0;
    for (int32_t b = 0; b < c.batch; ++b) {
        const double u = tu_rng_uniform(rng);
        c.len_k[b] = u < 0.05 ? 0
                     : u < 0.15 ? (int32_t)tu_rng_range(rng, 1, c.q_len)
                                : (int32_t)tu_rng_range(rng, 1, max_len_k);
    }
    return c;
}

dc_case dc_gqa_case(sk_dtype dtype, int32_t q_len, int64_t heads_q, int64_t heads_kv,
                    int64_t head_dim, int32_t page_size, int32_t block_k, const int32_t lens[3]) {
    dc_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.batch = 3;
    c.q_len = q_len;
    memcpy(c.len_k, lens, 3 * sizeof(int32_t));
    c.heads_q = heads_q;
    c.heads_kv = heads_kv;
    c.head_dim = head_dim;
    c.page_size = page_size;
    c.block_k = block_k;
    c.layout_heads = (int32_t)heads_kv;
    c.density = 1.0;
    c.causal = 1;
    c.shuffle = 1;
    c.with_lse = 1;
    return c;
}

static int selected(const dc_case *c, const dc_data *x, int32_t b, int64_t hk, int64_t k) {
    if (c->block_k == 0) return 1;
    const int64_t slice = (int64_t)b * c->layout_heads + (c->layout_heads == 1 ? 0 : hk);
    return x->sel[slice * x->col_blocks + k / c->block_k] != 0;
}

/* The layout: each slice row's blocks below nb(b) with probability
 * density, and (past_end) a few blocks past nb(b). */
static int make_layout(const dc_case *c, tu_rng *rng, dc_data *x) {
    if (c->block_k == 0) return 1;
    const int64_t slices = (int64_t)c->batch * c->layout_heads;
    x->col_blocks = (int32_t)cdiv(x->max_seqlen_k, c->block_k);
    x->sel = (uint8_t *)calloc((size_t)(slices * x->col_blocks), 1);
    int32_t *off = (int32_t *)malloc((size_t)(slices + 1) * sizeof(int32_t));
    int32_t *idx = (int32_t *)malloc((size_t)(slices * x->col_blocks + 1) * sizeof(int32_t));
    x->layout.row_offsets = off;
    x->layout.col_indices = idx;
    if (!x->sel || !off || !idx) return 0;
    int32_t nnz = 0;
    off[0] = 0;
    for (int64_t s = 0; s < slices; ++s) {
        const int64_t nb = cdiv(c->len_k[s / c->layout_heads], c->block_k);
        for (int64_t j = 0; j < x->col_blocks; ++j) {
            const int on = j < nb ? tu_rng_uniform(rng) < c->density
                                  : c->past_end && tu_rng_uniform(rng) < 0.5;
            /* Blocks past nb select nothing: not in sel, which the
             * reference reads. */
            if (on && j < nb) x->sel[s * x->col_blocks + j] = 1;
            if (on) idx[nnz++] = (int32_t)j;
        }
        off[s + 1] = nnz;
    }
    x->layout.grid = tu_grid(c->q_len, x->max_seqlen_k, 64, c->block_k, c->batch, c->layout_heads);
    x->layout.nnz = nnz;
    return 1;
}

/* Page table: sequence b's pages, shared prefixes, shuffled ids, garbage
 * past the pages used. */
static int make_pages(const dc_case *c, tu_rng *rng, dc_data *x) {
    int32_t used[DC_MAXB], shared[DC_MAXB];
    int64_t fresh = 0;
    x->max_pages = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        used[b] = (int32_t)cdiv(c->len_k[b], c->page_size);
        shared[b] = 0;
        if (c->share && b > 0) {
            const int32_t full = c->len_k[b] / c->page_size, prev = c->len_k[b - 1] / c->page_size;
            shared[b] = (int32_t)tu_rng_range(rng, 0, full < prev ? full : prev);
        }
        fresh += used[b] - shared[b];
        if (used[b] > x->max_pages) x->max_pages = used[b];
    }
    const int64_t need = cdiv(x->max_seqlen_k, c->page_size);
    if (need > x->max_pages) x->max_pages = need;
    x->num_pages = fresh + c->extra_pages;
    if (x->num_pages < 1) x->num_pages = 1;
    x->table_stride = x->max_pages + (c->padded ? 3 : 0);
    int32_t *perm = (int32_t *)malloc((size_t)x->num_pages * sizeof(int32_t));
    x->table = (int32_t *)malloc((size_t)(c->batch * x->table_stride) * sizeof(int32_t));
    if (!perm || !x->table) {
        free(perm);
        return 0;
    }
    for (int64_t i = 0; i < x->num_pages; ++i) perm[i] = (int32_t)i;
    if (c->shuffle)
        for (int64_t i = x->num_pages - 1; i > 0; --i) {
            const int64_t j = tu_rng_range(rng, 0, i);
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    int64_t next = 0;
    for (int32_t b = 0; b < c->batch; ++b) {
        int32_t *row = x->table + b * x->table_stride;
        for (int64_t i = 0; i < x->table_stride; ++i) {
            const int64_t u = tu_rng_range(rng, 0, 3);
            row[i] = u == 0 ? -1 - (int32_t)tu_rng_range(rng, 0, 5)
                     : u == 1 ? (int32_t)(x->num_pages + tu_rng_range(rng, 0, 5))
                              : (int32_t)tu_rng_range(rng, 0, x->num_pages - 1);
        }
        for (int32_t i = 0; i < used[b]; ++i)
            row[i] = i < shared[b] ? x->table[(b - 1) * x->table_stride + i] : perm[next++];
    }
    free(perm);
    return 1;
}

/* Cache element of key k of sequence b, KV head hk, dim d. */
static int64_t cache_at(const dc_case *c, const dc_data *x, int32_t b, int64_t k, int64_t hk,
                        int64_t d) {
    const int64_t page = x->table[b * x->table_stride + k / c->page_size];
    return page * x->cs[0] + (k % c->page_size) * x->cs[1] + hk * x->cs[2] + d;
}

int dc_make(const dc_case *c, tu_rng *rng, dc_data *x) {
    memset(x, 0, sizeof *x);
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim, pad = c->padded ? 8 : 0;
    const size_t es = dc_elem_size(c->dtype);
    int64_t longest = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        x->seq_lens_k[b] = c->len_k[b];
        if (c->len_k[b] > longest) longest = c->len_k[b];
    }
    x->max_seqlen_k = longest + c->extra_keys;
    if (!make_layout(c, rng, x) || !make_pages(c, rng, x)) return 0;
    x->qs[2] = D + pad;
    x->qs[1] = Hq * x->qs[2] + pad;
    x->qs[0] = c->q_len * x->qs[1] + pad;
    x->cs[2] = D + pad;
    x->cs[1] = Hkv * x->cs[2] + pad;
    x->cs[0] = c->page_size * x->cs[1] + pad;
    x->q_elems = c->batch * x->qs[0];
    x->cache_elems = x->num_pages * x->cs[0];
    x->lse_elems = c->batch * Hq * c->q_len;
    x->q = malloc((size_t)x->q_elems * es);
    x->o = malloc((size_t)x->q_elems * es);
    x->k_cache = malloc((size_t)x->cache_elems * es);
    x->v_cache = malloc((size_t)x->cache_elems * es);
    x->lse = (float *)malloc((size_t)x->lse_elems * sizeof(float));
    if (!x->q || !x->o || !x->k_cache || !x->v_cache || !x->lse) return 0;
    tu_fill_nan(x->q, c->dtype, x->q_elems);
    tu_fill_nan(x->o, c->dtype, x->q_elems);
    tu_fill_nan(x->k_cache, c->dtype, x->cache_elems);
    tu_fill_nan(x->v_cache, c->dtype, x->cache_elems);
    for (int64_t i = 0; i < x->lse_elems; ++i) x->lse[i] = NAN;
    for (int32_t b = 0; b < c->batch; ++b)
        for (int64_t t = 0; t < c->q_len; ++t)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t d = 0; d < D; ++d)
                    tu_store(x->q, c->dtype, b * x->qs[0] + t * x->qs[1] + h * x->qs[2] + d,
                             (float)tu_rng_normal(rng));
    /* Each selected cache element's value is a seeded hash of its place,
     * so a shared page gets the same values from every sequence. */
    const uint64_t salt = tu_rng_next(rng);
    for (int32_t b = 0; b < c->batch; ++b)
        for (int64_t k = 0; k < c->len_k[b]; ++k)
            for (int64_t hk = 0; hk < Hkv; ++hk) {
                if (!selected(c, x, b, hk, k)) continue;
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t at = cache_at(c, x, b, k, hk, d);
                    tu_rng h;
                    tu_rng_seed(&h, salt ^ ((uint64_t)at * 0x9E3779B97F4A7C15ull));
                    tu_store(x->k_cache, c->dtype, at, (float)tu_rng_normal(&h));
                    tu_store(x->v_cache, c->dtype, at, (float)tu_rng_normal(&h));
                }
            }
    return 1;
}

void dc_data_free(dc_data *x) {
    free(x->table);
    free(x->sel);
    free(x->layout.row_offsets);
    free(x->layout.col_indices);
    free(x->q);
    free(x->o);
    free(x->k_cache);
    free(x->v_cache);
    free(x->lse);
    memset(x, 0, sizeof *x);
}

sk_decode_desc dc_desc(const dc_case *c, const dc_data *x, sk_backend backend) {
    sk_decode_desc d;
    sk_decode_desc_init(&d, sizeof d);
    d.backend = backend;
    d.dtype = c->dtype;
    d.batch = c->batch;
    d.q_len = c->q_len;
    d.heads_q = c->heads_q;
    d.heads_kv = c->heads_kv;
    d.head_dim = c->head_dim;
    d.scale = c->scale;
    d.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    d.max_seqlen_k = x->max_seqlen_k;
    d.num_pages = x->num_pages;
    d.page_size = c->page_size;
    d.max_pages = (int32_t)x->max_pages;
    d.page_table_stride = x->table_stride;
    for (int i = 0; i < 3; ++i) {
        d.q_strides[i] = d.o_strides[i] = x->qs[i];
        d.k_strides[i] = d.v_strides[i] = x->cs[i];
    }
    d.num_splits = c->num_splits;
    return d;
}

/* One (b, h, t) row against the naive reference; kd, vd hold the
 * sequence's KV head keys [len_k, D] (NaN where not selected). */
static int64_t compare_row(const dc_case *c, const dc_data *x, const void *o, const float *lse,
                           int32_t b, int64_t h, int64_t t, const double *kd, const double *vd,
                           uint8_t *allow, double *od, const char *label, int64_t *bad,
                           int64_t *empty_rows) {
    const int64_t D = c->head_dim, lk = c->len_k[b], hk = h / (c->heads_q / c->heads_kv);
    const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
    double qd[128] = {0}, n = 0.0, qn = 0.0, kmax = 0.0, vmax = 0.0, ref_lse;
    for (int64_t d = 0; d < D; ++d) {
        qd[d] = tu_load(x->q, c->dtype, b * x->qs[0] + t * x->qs[1] + h * x->qs[2] + d);
        qn += qd[d] * qd[d];
    }
    for (int64_t k = 0; k < lk; ++k) {
        allow[k] = (uint8_t)(selected(c, x, b, hk, k) &&
                             (!c->causal || k <= lk - c->q_len + t));
        if (!allow[k]) continue;
        n += 1.0;
        double kn = 0.0;
        for (int64_t d = 0; d < D; ++d) {
            kn += kd[k * D + d] * kd[k * D + d];
            if (fabs(vd[k * D + d]) > vmax) vmax = fabs(vd[k * D + d]);
        }
        if (sqrt(kn) > kmax) kmax = sqrt(kn);
    }
    nr_attention_row(lk, D, scale, qd, kd, D, vd, D, allow, od, &ref_lse);
    const double smag = fabs(scale) * sqrt(qn) * kmax;
    /* A same-precision implementation (the GPU's) rounds P to the dtype
     * before P V: u x sum_k p_k |v_kd| more per element (gpu_util.h's
     * rule has the same term). */
    double pv[128] = {0};
    for (int64_t k = 0; k < lk && !(n == 0.0); ++k) {
        if (!allow[k]) continue;
        double sk = 0.0;
        for (int64_t d = 0; d < D; ++d) sk += qd[d] * kd[k * D + d];
        const double pk = exp(scale * sk - ref_lse);
        for (int64_t d = 0; d < D; ++d) pv[d] += pk * fabs(vd[k * D + d]);
    }
    const int empty = n == 0.0;
    if (empty_rows != NULL) *empty_rows += empty;
    int64_t mism = 0;
    if (lse != NULL) {
        const double got = lse[(b * c->heads_q + h) * c->q_len + t];
        const int ok = empty ? isinf(got) && got < 0
                             : isfinite(got) && fabs(got - ref_lse) <=
                                                    tu_attn_tol_lse(ref_lse, (double)D, smag, n);
        if (!ok) {
            ++mism;
            if ((*bad)++ < 3)
                CHECK(ok, "%s LSE[b=%d, h=%lld, t=%lld] = %.9g, reference %.9g", label, (int)b,
                      (long long)h, (long long)t, got, ref_lse);
        }
    }
    for (int64_t d = 0; d < D; ++d) {
        const double got = tu_load(o, c->dtype, b * x->qs[0] + t * x->qs[1] + h * x->qs[2] + d);
        const double tol = tu_attn_tol_o(c->dtype, od[d], (double)D, smag, vmax, n) +
                           2.0 * tu_unit_roundoff(c->dtype) * pv[d];
        const int ok = empty ? got == 0.0 : isfinite(got) && fabs(got - od[d]) <= tol;
        if (!ok) {
            ++mism;
            if ((*bad)++ < 3)
                CHECK(ok, "%s O[b=%d, t=%lld, h=%lld, d=%lld] = %.9g, reference %.9g, tol %.3g",
                      label, (int)b, (long long)t, (long long)h, (long long)d, got, od[d], tol);
        }
    }
    return mism;
}

int64_t dc_compare(const dc_case *c, const dc_data *x, const void *o, const float *lse,
                   const char *label, int64_t *empty_rows) {
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim, group = Hq / Hkv;
    int64_t longest = 1, bad = 0, mism = 0;
    for (int32_t b = 0; b < c->batch; ++b)
        if (c->len_k[b] > longest) longest = c->len_k[b];
    double *kd = (double *)malloc((size_t)(longest * D) * sizeof(double));
    double *vd = (double *)malloc((size_t)(longest * D) * sizeof(double));
    double *od = (double *)malloc((size_t)D * sizeof(double));
    uint8_t *allow = (uint8_t *)malloc((size_t)longest);
    uint8_t *used = (uint8_t *)calloc((size_t)x->q_elems, 1);
    if (!kd || !vd || !od || !allow || !used) {
        CHECK(0, "%s out of memory", label);
        mism = 1;
        goto done;
    }
    for (int32_t b = 0; b < c->batch; ++b)
        for (int64_t hk = 0; hk < Hkv; ++hk) {
            for (int64_t k = 0; k < c->len_k[b]; ++k)
                for (int64_t d = 0; d < D; ++d) {
                    const int on = selected(c, x, b, hk, k);
                    kd[k * D + d] = on ? tu_load(x->k_cache, c->dtype, cache_at(c, x, b, k, hk, d))
                                       : NAN;
                    vd[k * D + d] = on ? tu_load(x->v_cache, c->dtype, cache_at(c, x, b, k, hk, d))
                                       : NAN;
                }
            for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
                for (int64_t t = 0; t < c->q_len; ++t) {
                    mism += compare_row(c, x, o, lse, b, h, t, kd, vd, allow, od, label, &bad,
                                        empty_rows);
                    for (int64_t d = 0; d < D; ++d)
                        used[b * x->qs[0] + t * x->qs[1] + h * x->qs[2] + d] = 1;
                }
        }
    for (int64_t e = 0; e < x->q_elems; ++e)
        if (!used[e] && !isnan(tu_load(o, c->dtype, e))) {
            ++mism;
            if (bad++ < 3) CHECK(0, "%s O's stride gap element %lld was written", label, (long long)e);
        }
done:
    free(kd);
    free(vd);
    free(od);
    free(allow);
    free(used);
    return mism;
}

void dc_label(const dc_case *c, uint64_t seed, char *label, size_t size) {
    const char *dt = c->dtype == SK_DTYPE_F16 ? "F16" : c->dtype == SK_DTYPE_BF16 ? "BF16" : "F32";
    int n = snprintf(label, size,
                     "[seed %llu: %s B=%d q_len=%d Hq/Hkv=%lld/%lld D=%lld page %d block %d lheads %d "
                     "dens %.2f%s%s%s%s%s%s splits %d lens",
                     (unsigned long long)seed, dt, (int)c->batch, (int)c->q_len,
                     (long long)c->heads_q, (long long)c->heads_kv, (long long)c->head_dim,
                     (int)c->page_size, (int)c->block_k, (int)c->layout_heads, c->density,
                     c->causal ? " causal" : "", c->padded ? " padded" : "",
                     c->shuffle ? " shuffled" : "", c->share ? " shared" : "",
                     c->past_end ? " past-end" : "", c->with_lse ? " lse" : "",
                     (int)c->num_splits);
    for (int32_t b = 0; b < c->batch && n > 0 && (size_t)n < size; ++b)
        n += snprintf(label + n, size - (size_t)n, " %d", (int)c->len_k[b]);
    if (n > 0 && (size_t)n < size) snprintf(label + n, size - (size_t)n, "]");
}
