/*
 * test_attention_cpu.c - the CPU attention backend against the naive dense
 * fp64 reference (tests/common/naive_ref.c).
 *
 * Every case: seeded random Q/K/V rounded to the dtype; the reference gets
 * the SAME rounded values in fp64, K/V repeated per query head (so GQA is
 * checked against "repeat the KV heads"), and a token mask built from the
 * test's own block mask, slice mapping and causal rule. The library gets a
 * BSR made here from that block mask (nr_bsr_from_mask), never the layout
 * builders. Before each run O and LSE are filled with NaN, and so is every
 * element of Q/K/V that no query may read (stride padding, and keys no query
 * of that KV head attends), so an unwritten output or a stray read shows up
 * as NaN. Padding of O must still be NaN afterwards.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

typedef enum stride_mode {
    STRIDES_PACKED = 0, /* desc strides left 0: packed [B, S, H, D] */
    STRIDES_PADDED = 1, /* [B, S, H, D] with gaps after each row, token and batch */
    STRIDES_BHSD = 2    /* the memory order [B, H, S, D], given through strides */
} stride_mode;

typedef struct attn_case {
    sk_dtype dtype;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    int32_t bq, bk;
    int causal;
    float scale;          /* 0: the default 1/sqrt(D) */
    int32_t layout_batch; /* 1 or batch */
    int32_t layout_heads; /* 1, heads_kv or heads_q */
    double density;       /* probability that a block is selected */
    int trim_causal;      /* drop blocks with no causal pair (as a causal layout would) */
    int empty_rows;       /* also empty every third layout row */
    stride_mode strides;
    int with_lse;
    int use_run; /* sk_attention_run instead of sk_attention_forward */
} attn_case;

static attn_case base_case(sk_dtype dtype) {
    attn_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.batch = 1;
    c.seq_q = c.seq_k = 128;
    c.heads_q = c.heads_kv = 1;
    c.head_dim = 64;
    c.bq = c.bk = 64;
    c.layout_batch = c.layout_heads = 1;
    c.density = 1.0;
    c.with_lse = 1;
    return c;
}

static const sk_dtype all_dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};

static const char *dtype_text(sk_dtype t) {
    return t == SK_DTYPE_F16 ? "F16" : t == SK_DTYPE_BF16 ? "BF16" : "F32";
}

static size_t elem_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

/* Element strides of a [B, S, H, D] tensor for a stride mode. */
static void make_strides(stride_mode mode, int64_t s, int64_t h, int64_t d, int64_t st[3]) {
    switch (mode) {
    case STRIDES_PACKED:
        st[2] = d;
        st[1] = h * d;
        st[0] = s * h * d;
        break;
    case STRIDES_PADDED:
        st[2] = d + 3;
        st[1] = h * st[2] + 5;
        st[0] = s * st[1] + 7;
        break;
    case STRIDES_BHSD:
        st[1] = d;
        st[2] = s * d;
        st[0] = h * s * d;
        break;
    }
}

static int64_t span_of(int64_t b, int64_t s, int64_t h, int64_t d, const int64_t st[3]) {
    return (b - 1) * st[0] + (s - 1) * st[1] + (h - 1) * st[2] + d;
}

/* The slice of (b, h) by the rule in sparsek.h, written out independently. */
static int64_t test_slice(const attn_case *c, int64_t b, int64_t h) {
    int64_t hs;
    if (c->layout_heads == c->heads_q)
        hs = h;
    else if (c->layout_heads == 1)
        hs = 0;
    else
        hs = h / (c->heads_q / c->heads_kv); /* per KV head */
    return (c->layout_batch == 1 ? 0 : b) * c->layout_heads + hs;
}

/* Results of one run, for tests that look beyond pass/fail. */
typedef struct attn_outcome {
    int64_t empty_rows;   /* rows of the reference with no admissible key */
    int64_t checked;      /* O elements compared */
    double max_err_ratio; /* max |got - ref| / tol */
} attn_outcome;

/* Run one case and compare; returns 0 when everything matched. If o_copy /
 * lse_copy are given they receive the raw outputs (O buffer span, LSE). */
static int run_attn_case(const attn_case *c, uint64_t seed, attn_outcome *outcome, void **o_copy,
                         float **lse_copy) {
    char label[320];
    snprintf(label, sizeof label,
             "[seed %llu: %s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld bq=%d bk=%d causal=%d "
             "scale=%g layout %dx%d density=%.2f trim=%d empty=%d strides=%d lse=%d run=%d]",
             (unsigned long long)seed, dtype_text(c->dtype), (long long)c->batch,
             (long long)c->seq_q, (long long)c->seq_k, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim, (int)c->bq, (int)c->bk, c->causal,
             (double)c->scale, (int)c->layout_batch, (int)c->layout_heads, c->density,
             c->trim_causal, c->empty_rows, (int)c->strides, c->with_lse, c->use_run);
    const int failures_before = sk_test_failures();
    tu_rng rng;
    tu_rng_seed(&rng, seed);

    const int64_t B = c->batch, Sq = c->seq_q, Sk = c->seq_k, Hq = c->heads_q, Hkv = c->heads_kv,
                  D = c->head_dim, group = Hq / Hkv;
    const int64_t RB = (Sq + c->bq - 1) / c->bq, CB = (Sk + c->bk - 1) / c->bk;
    const int64_t slices = (int64_t)c->layout_batch * c->layout_heads;
    const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
    const size_t es = elem_size(c->dtype);

    /* Block mask, then the layout built from it. */
    uint8_t *mask = (uint8_t *)malloc((size_t)(slices * RB * CB));
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < RB; ++i)
            for (int64_t j = 0; j < CB; ++j) {
                int on = tu_rng_uniform(&rng) < c->density;
                const int64_t q_last = (i + 1) * c->bq < Sq ? (i + 1) * c->bq - 1 : Sq - 1;
                if (c->trim_causal && j * c->bk > q_last + (Sk - Sq)) on = 0;
                if (c->empty_rows && (s * RB + i) % 3 == 0) on = 0;
                mask[(s * RB + i) * CB + j] = (uint8_t)on;
            }
    sk_grid grid = {Sq, Sk, c->bq, c->bk, c->layout_batch, c->layout_heads};
    sk_bsr layout;
    if (mask == NULL || nr_bsr_from_mask(&layout, &grid, mask) != 0) {
        CHECK(0, "%s out of memory", label);
        free(mask);
        return 1;
    }

    /* Token mask per (b, query head), from the test's own slice mapping. */
    uint8_t *bmask_full = (uint8_t *)malloc((size_t)(B * Hq * RB * CB));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            memcpy(bmask_full + (b * Hq + h) * RB * CB, mask + test_slice(c, b, h) * RB * CB,
                   (size_t)(RB * CB));
    uint8_t *allow = (uint8_t *)malloc((size_t)(B * Hq * Sq * Sk));
    nr_allow_from_blocks(allow, bmask_full, B, Hq, Sq, Sk, c->bq, c->bk, c->causal);

    /* Tensors: every element NaN first, then the real ones. */
    int64_t qs[3], ks[3], vs[3], os[3];
    make_strides(c->strides, Sq, Hq, D, qs);
    make_strides(c->strides, Sk, Hkv, D, ks);
    make_strides(c->strides == STRIDES_PADDED ? STRIDES_BHSD : c->strides, Sk, Hkv, D, vs);
    make_strides(c->strides, Sq, Hq, D, os);
    const int64_t q_span = span_of(B, Sq, Hq, D, qs), k_span = span_of(B, Sk, Hkv, D, ks),
                  v_span = span_of(B, Sk, Hkv, D, vs), o_span = span_of(B, Sq, Hq, D, os);
    void *q = malloc((size_t)q_span * es), *k = malloc((size_t)k_span * es),
         *v = malloc((size_t)v_span * es), *o = malloc((size_t)o_span * es);
    float *lse = (float *)malloc((size_t)(B * Hq * Sq) * sizeof(float));
    double *qd = (double *)malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
    double *kd = (double *)malloc((size_t)(B * Sk * Hq * D) * sizeof(double));
    double *vd = (double *)malloc((size_t)(B * Sk * Hq * D) * sizeof(double));
    double *od = (double *)malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
    double *lsed = (double *)malloc((size_t)(B * Hq * Sq) * sizeof(double));
    double *knorm = (double *)malloc((size_t)(B * Hkv) * sizeof(double));
    double *vmax = (double *)malloc((size_t)(B * Hkv) * sizeof(double));
    uint8_t *o_used = (uint8_t *)calloc((size_t)o_span, 1);
    if (!q || !k || !v || !o || !lse || !qd || !kd || !vd || !od || !lsed || !knorm || !vmax ||
        !o_used) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    tu_fill_nan(q, c->dtype, q_span);
    tu_fill_nan(k, c->dtype, k_span);
    tu_fill_nan(v, c->dtype, v_span);
    tu_fill_nan(o, c->dtype, o_span);
    tu_fill_nan(lse, SK_DTYPE_F32, B * Hq * Sq);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < Sq; ++s)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t x = 0; x < D; ++x) {
                    const int64_t at = b * qs[0] + s * qs[1] + h * qs[2] + x;
                    tu_store(q, c->dtype, at, (float)tu_rng_normal(&rng));
                    qd[((b * Sq + s) * Hq + h) * D + x] = tu_load(q, c->dtype, at);
                    o_used[b * os[0] + s * os[1] + h * os[2] + x] = 1;
                }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t hk = 0; hk < Hkv; ++hk) {
            knorm[b * Hkv + hk] = 0.0;
            vmax[b * Hkv + hk] = 0.0;
        }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < Sk; ++s)
            for (int64_t hk = 0; hk < Hkv; ++hk) {
                /* Does any query of this KV head see key s? If not, NaN. */
                int used = 0;
                for (int64_t h = hk * group; h < (hk + 1) * group && !used; ++h)
                    for (int64_t i = 0; i < Sq && !used; ++i)
                        used = allow[((b * Hq + h) * Sq + i) * Sk + s];
                double kn = 0.0;
                for (int64_t x = 0; x < D; ++x) {
                    const int64_t ka = b * ks[0] + s * ks[1] + hk * ks[2] + x;
                    const int64_t va = b * vs[0] + s * vs[1] + hk * vs[2] + x;
                    tu_store(k, c->dtype, ka, (float)tu_rng_normal(&rng));
                    tu_store(v, c->dtype, va, (float)tu_rng_normal(&rng));
                    const double kx = tu_load(k, c->dtype, ka), vx = tu_load(v, c->dtype, va);
                    kn += kx * kx;
                    if (fabs(vx) > vmax[b * Hkv + hk]) vmax[b * Hkv + hk] = fabs(vx);
                    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
                        kd[((b * Sk + s) * Hq + h) * D + x] = kx;
                        vd[((b * Sk + s) * Hq + h) * D + x] = vx;
                    }
                    if (!used) {
                        tu_store(k, c->dtype, ka, NAN);
                        tu_store(v, c->dtype, va, NAN);
                    }
                }
                if (sqrt(kn) > knorm[b * Hkv + hk]) knorm[b * Hkv + hk] = sqrt(kn);
            }

    /* The library. */
    sk_attention_desc desc;
    CHECK(sk_attention_desc_init(&desc, sizeof desc) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = c->dtype;
    desc.batch = B;
    desc.seq_q = Sq;
    desc.seq_k = Sk;
    desc.heads_q = Hq;
    desc.heads_kv = Hkv;
    desc.head_dim = D;
    desc.scale = c->scale;
    desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    if (c->strides != STRIDES_PACKED) {
        memcpy(desc.q_strides, qs, sizeof qs);
        memcpy(desc.k_strides, ks, sizeof ks);
        memcpy(desc.v_strides, vs, sizeof vs);
        memcpy(desc.o_strides, os, sizeof os);
    }
    float *lse_arg = c->with_lse ? lse : NULL;
    const sk_status st =
        c->use_run ? sk_attention_run(&desc, &layout, q, k, v, o, lse_arg, NULL, 0, NULL)
                   : sk_attention_forward(&desc, &layout, q, k, v, o, lse_arg, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        CHECK(st == SK_STATUS_SUCCESS, "%s %s: %s", label, sk_status_name(st), sk_last_error());
        goto done;
    }

    /* The reference, and the comparison. */
    nr_attention(B, Sq, Sk, Hq, D, scale, qd, kd, vd, allow, od, lsed);
    int64_t bad = 0, empty = 0, checked = 0;
    double worst = 0.0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t s = 0; s < Sq; ++s) {
                const int64_t hk = h / group;
                const uint8_t *al = allow + ((b * Hq + h) * Sq + s) * Sk;
                double n = 0.0, qn = 0.0;
                for (int64_t j = 0; j < Sk; ++j) n += al[j];
                for (int64_t x = 0; x < D; ++x) {
                    const double qx = qd[((b * Sq + s) * Hq + h) * D + x];
                    qn += qx * qx;
                }
                const double smag = fabs(scale) * sqrt(qn) * knorm[b * Hkv + hk];
                const double ref_lse = lsed[(b * Hq + h) * Sq + s];
                const int is_empty = n == 0.0;
                empty += is_empty;
                if (c->with_lse) {
                    const float got = lse[(b * Hq + h) * Sq + s];
                    int ok;
                    if (is_empty)
                        ok = isinf(got) && got < 0 && isinf(ref_lse) && ref_lse < 0;
                    else
                        ok = isfinite(got) &&
                             fabs((double)got - ref_lse) <= tu_attn_tol_lse(ref_lse, (double)D, smag, n);
                    if (!ok && bad++ < 3)
                        CHECK(ok, "%s LSE[b=%lld h=%lld q=%lld] = %.9g, reference %.9g", label,
                              (long long)b, (long long)h, (long long)s, (double)got, ref_lse);
                }
                for (int64_t x = 0; x < D; ++x) {
                    const double ref = od[((b * Sq + s) * Hq + h) * D + x];
                    const double got = tu_load(o, c->dtype, b * os[0] + s * os[1] + h * os[2] + x);
                    const double tol = tu_attn_tol_o(c->dtype, ref, (double)D, smag, vmax[b * Hkv + hk], n);
                    /* An empty row must be exactly 0. */
                    const int ok =
                        is_empty ? got == 0.0 : (isfinite(got) && fabs(got - ref) <= tol);
                    if (!is_empty && fabs(got - ref) / tol > worst) worst = fabs(got - ref) / tol;
                    ++checked;
                    if (!ok && bad++ < 3)
                        CHECK(ok,
                              "%s O[b=%lld q=%lld h=%lld d=%lld] = %.9g, reference %.9g, tol %.3g",
                              label, (long long)b, (long long)s, (long long)h, (long long)x, got,
                              ref, tol);
                }
            }
    /* Stride padding of O is never written. */
    for (int64_t x = 0; x < o_span; ++x)
        if (!o_used[x] && !isnan(tu_load(o, c->dtype, x)) && bad++ < 3)
            CHECK(0, "%s O padding element %lld was written", label, (long long)x);
    if (!c->with_lse)
        for (int64_t x = 0; x < B * Hq * Sq; ++x)
            if (!isnan(lse[x]) && bad++ < 3) CHECK(0, "%s lse was NULL, yet written", label);
    CHECK(bad == 0, "%s %lld mismatches (worst error/tol %.3g among the rest)", label,
          (long long)bad, worst);
    if (outcome != NULL) {
        outcome->empty_rows = empty;
        outcome->checked = checked;
        outcome->max_err_ratio = worst;
    }
    if (o_copy != NULL) {
        *o_copy = malloc((size_t)o_span * es);
        if (*o_copy != NULL) memcpy(*o_copy, o, (size_t)o_span * es);
    }
    if (lse_copy != NULL) {
        *lse_copy = (float *)malloc((size_t)(B * Hq * Sq) * sizeof(float));
        if (*lse_copy != NULL) memcpy(*lse_copy, lse, (size_t)(B * Hq * Sq) * sizeof(float));
    }

done:
    free(q), free(k), free(v), free(o), free(lse), free(qd), free(kd), free(vd), free(od);
    free(lsed), free(knorm), free(vmax), free(o_used), free(allow), free(bmask_full), free(mask);
    nr_bsr_free(&layout);
    return sk_test_failures() != failures_before;
}

/* A distinct, reproducible seed per test and case. */
static uint64_t case_seed(uint64_t test_id, uint64_t case_id) {
    tu_rng r;
    tu_rng_seed(&r, tu_base_seed() ^ (test_id * 0x100000001B3ull) ^ (case_id << 20));
    return tu_rng_next(&r);
}

SK_TEST(attention_cpu_full_layout_equals_dense) {
    int id = 0;
    for (int t = 0; t < 3; ++t) {
        attn_case c = base_case(all_dtypes[t]);
        c.batch = 2;
        c.seq_q = c.seq_k = 192;
        c.heads_q = c.heads_kv = 2;
        run_attn_case(&c, case_seed(1, (uint64_t)id++), NULL, NULL, NULL);
        /* Sq != Sk, both not multiples of the blocks, bq != bk. */
        c.seq_q = 200;
        c.seq_k = 300;
        c.bq = 128;
        c.bk = 64;
        c.head_dim = 40;
        run_attn_case(&c, case_seed(1, (uint64_t)id++), NULL, NULL, NULL);
    }
}

SK_TEST(attention_cpu_causal_equals_masked_dense) {
    /* Sq == Sk, Sq < Sk, Sq > Sk (rows before Sq - Sk see no key). */
    static const int64_t shapes[3][2] = {{256, 256}, {130, 300}, {300, 130}};
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int sh = 0; sh < 3; ++sh)
            for (int trim = 0; trim < 2; ++trim) {
                attn_case c = base_case(all_dtypes[t]);
                c.seq_q = shapes[sh][0];
                c.seq_k = shapes[sh][1];
                c.heads_q = 2;
                c.heads_kv = 1;
                c.head_dim = 32;
                c.causal = 1;
                c.trim_causal = trim;
                c.bk = trim ? 128 : 64;
                attn_outcome out;
                if (run_attn_case(&c, case_seed(2, (uint64_t)id++), &out, NULL, NULL)) continue;
                const int64_t want_empty = c.seq_q > c.seq_k ? (c.seq_q - c.seq_k) * c.heads_q : 0;
                CHECK(out.empty_rows == want_empty, "Sq=%lld Sk=%lld: %lld empty rows, want %lld",
                      (long long)c.seq_q, (long long)c.seq_k, (long long)out.empty_rows,
                      (long long)want_empty);
            }
}

SK_TEST(attention_cpu_gqa_equals_repeated_kv) {
    int id = 0;
    for (int t = 0; t < 3; ++t) {
        static const int64_t groups[2] = {4, 8};
        for (int gi = 0; gi < 2; ++gi)
            for (int lh = 0; lh < 3; ++lh) {
                attn_case c = base_case(all_dtypes[t]);
                c.heads_kv = gi == 0 ? 2 : 1;
                c.heads_q = c.heads_kv * groups[gi];
                c.seq_q = 150;
                c.seq_k = 190;
                c.head_dim = 24;
                c.density = 0.6;
                c.causal = lh == 2;
                /* layout per KV head, per query head, or one for all */
                c.layout_heads = (int32_t)(lh == 0 ? c.heads_kv : lh == 1 ? c.heads_q : 1);
                run_attn_case(&c, case_seed(3, (uint64_t)id++), NULL, NULL, NULL);
            }
    }
}

SK_TEST(attention_cpu_tails_and_block_sizes) {
    static const int32_t blocks[4][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}};
    static const int64_t seqs[3][2] = {{193, 193}, {77, 250}, {129, 65}};
    int id = 0;
    for (int bi = 0; bi < 4; ++bi)
        for (int si = 0; si < 3; ++si) {
            attn_case c = base_case(all_dtypes[(bi + si) % 3]);
            c.bq = blocks[bi][0];
            c.bk = blocks[bi][1];
            c.seq_q = seqs[si][0];
            c.seq_k = seqs[si][1];
            c.head_dim = 16 + 8 * bi;
            c.heads_q = 2;
            c.heads_kv = 2;
            c.density = 0.7;
            c.causal = si == 0;
            run_attn_case(&c, case_seed(4, (uint64_t)id++), NULL, NULL, NULL);
        }
}

SK_TEST(attention_cpu_empty_rows_give_zero_and_minus_inf) {
    int id = 0;
    for (int t = 0; t < 3; ++t) {
        attn_case c = base_case(all_dtypes[t]);
        c.seq_q = 300;
        c.seq_k = 200;
        c.heads_q = c.heads_kv = 2;
        c.layout_heads = 2;
        c.empty_rows = 1;
        attn_outcome out;
        if (!run_attn_case(&c, case_seed(5, (uint64_t)id++), &out, NULL, NULL))
            CHECK(out.empty_rows > 0, "no empty row was exercised");
        /* A layout with no block at all. */
        c.density = 0.0;
        if (!run_attn_case(&c, case_seed(5, (uint64_t)id++), &out, NULL, NULL))
            CHECK(out.empty_rows == c.seq_q * c.heads_q, "%lld empty rows",
                  (long long)out.empty_rows);
    }
}

SK_TEST(attention_cpu_broadcast_slices) {
    int id = 0;
    for (int lb = 0; lb < 2; ++lb)
        for (int lh = 0; lh < 3; ++lh) {
            attn_case c = base_case(all_dtypes[id % 3]);
            c.batch = 3;
            c.heads_q = 4;
            c.heads_kv = 2;
            c.seq_q = c.seq_k = 140;
            c.head_dim = 16;
            c.density = 0.5;
            c.empty_rows = lh == 1;
            c.layout_batch = lb ? 3 : 1;
            c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? 2 : 4);
            run_attn_case(&c, case_seed(6, (uint64_t)id++), NULL, NULL, NULL);
        }
}

SK_TEST(attention_cpu_random_layouts_and_shapes) {
    tu_rng rng;
    tu_rng_seed(&rng, case_seed(7, 999));
    for (int id = 0; id < 16; ++id) {
        attn_case c = base_case(all_dtypes[tu_rng_range(&rng, 0, 2)]);
        c.batch = tu_rng_range(&rng, 1, 2);
        c.heads_kv = tu_rng_range(&rng, 1, 2);
        c.heads_q = c.heads_kv * (int64_t)(1 << tu_rng_range(&rng, 0, 2));
        c.seq_q = tu_rng_range(&rng, 1, 260);
        c.seq_k = tu_rng_range(&rng, 1, 260);
        c.head_dim = tu_rng_range(&rng, 1, 80);
        c.bq = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        c.bk = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        c.causal = (int)tu_rng_range(&rng, 0, 1);
        c.trim_causal = c.causal && tu_rng_range(&rng, 0, 1);
        c.density = tu_rng_uniform(&rng);
        c.layout_batch = tu_rng_range(&rng, 0, 1) ? (int32_t)c.batch : 1;
        const int64_t lh = tu_rng_range(&rng, 0, 2);
        c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? c.heads_kv : c.heads_q);
        c.strides = (stride_mode)tu_rng_range(&rng, 0, 2);
        c.with_lse = tu_rng_range(&rng, 0, 3) != 0;
        c.use_run = (int)tu_rng_range(&rng, 0, 1);
        c.scale = tu_rng_range(&rng, 0, 1) ? 0.0f : (float)(0.05 + tu_rng_uniform(&rng));
        run_attn_case(&c, case_seed(7, (uint64_t)id), NULL, NULL, NULL);
    }
}

SK_TEST(attention_cpu_padded_and_permuted_strides) {
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int mode = 1; mode <= 2; ++mode) {
            attn_case c = base_case(all_dtypes[t]);
            c.batch = 2;
            c.heads_q = 4;
            c.heads_kv = 2;
            c.layout_heads = 2;
            c.seq_q = 100;
            c.seq_k = 170;
            c.head_dim = 20;
            c.density = 0.6;
            c.causal = t == 1;
            c.strides = (stride_mode)mode;
            run_attn_case(&c, case_seed(8, (uint64_t)id++), NULL, NULL, NULL);
        }
}

SK_TEST(attention_cpu_custom_scale) {
    static const float scales[3] = {0.37f, -0.5f, 2.0f};
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int si = 0; si < 3; ++si) {
            attn_case c = base_case(all_dtypes[t]);
            c.seq_q = 70;
            c.seq_k = 150;
            c.head_dim = 16;
            c.density = 0.8;
            c.scale = scales[si];
            run_attn_case(&c, case_seed(9, (uint64_t)id++), NULL, NULL, NULL);
        }
}

SK_TEST(attention_cpu_without_lse) {
    attn_case c = base_case(SK_DTYPE_BF16);
    c.with_lse = 0;
    c.seq_q = 90;
    c.causal = 1;
    run_attn_case(&c, case_seed(10, 0), NULL, NULL, NULL);
}

/* The result does not depend on the thread count: bitwise equal. */
SK_TEST(attention_cpu_repeatable_across_thread_counts) {
    attn_case c = base_case(SK_DTYPE_F32);
    c.seq_q = c.seq_k = 300;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.density = 0.5;
    c.causal = 1;
    const uint64_t seed = case_seed(11, 0);
    void *o1 = NULL, *o2 = NULL;
    float *l1 = NULL, *l2 = NULL;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const int f1 = run_attn_case(&c, seed, NULL, &o1, &l1);
    omp_set_num_threads(saved > 1 ? saved : 3);
    const int f2 = run_attn_case(&c, seed, NULL, &o2, &l2);
    omp_set_num_threads(saved);
    if (!f1 && !f2 && o1 && o2 && l1 && l2) {
        const size_t o_bytes = (size_t)(c.seq_q * c.heads_q * c.head_dim) * 4;
        CHECK(memcmp(o1, o2, o_bytes) == 0, "O differs between 1 and %d threads (seed %llu)", saved,
              (unsigned long long)seed);
        CHECK(memcmp(l1, l2, (size_t)(c.seq_q * c.heads_q) * 4) == 0, "LSE differs");
    }
    free(o1), free(o2), free(l1), free(l2);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*
 * Speed: B=1, H=8, S, D=128, 25% random density, F16. The CI runs S = 1024
 * (a few tenths of a second); SPARSEK_TEST_PERF=1 runs the S = 4096 case of
 * the issue. A sample of rows is checked against the naive reference.
 */
SK_TEST(attention_cpu_speed) {
    const char *env = getenv("SPARSEK_TEST_PERF");
    const int full = env != NULL && env[0] == '1';
    const int64_t S = full ? 4096 : 1024, H = 8, D = 128, bs = 64;
    const int64_t nb = S / bs, kblocks = nb / 4; /* 25% of the key blocks per row */
    const uint64_t seed = case_seed(12, (uint64_t)full);
    tu_rng rng;
    tu_rng_seed(&rng, seed);

    uint8_t *mask = (uint8_t *)calloc((size_t)(H * nb * nb), 1);
    for (int64_t r = 0; r < H * nb; ++r)
        for (int64_t placed = 0; placed < kblocks;) {
            const int64_t j = tu_rng_range(&rng, 0, nb - 1);
            if (!mask[r * nb + j]) mask[r * nb + j] = 1, ++placed;
        }
    sk_grid grid = {S, S, (int32_t)bs, (int32_t)bs, 1, (int32_t)H};
    sk_bsr layout;
    REQUIRE(nr_bsr_from_mask(&layout, &grid, mask) == 0, "out of memory");
    const int64_t n = S * H * D;
    uint16_t *q = (uint16_t *)malloc((size_t)n * 2), *k = (uint16_t *)malloc((size_t)n * 2),
             *v = (uint16_t *)malloc((size_t)n * 2), *o = (uint16_t *)malloc((size_t)n * 2);
    float *lse = (float *)malloc((size_t)(H * S) * 4);
    if (!q || !k || !v || !o || !lse) {
        CHECK(0, "out of memory");
        goto done;
    }
    tu_fill_normal(&rng, q, SK_DTYPE_F16, n, 1.0f);
    tu_fill_normal(&rng, k, SK_DTYPE_F16, n, 1.0f);
    tu_fill_normal(&rng, v, SK_DTYPE_F16, n, 1.0f);
    tu_fill_nan(o, SK_DTYPE_F16, n);

    sk_attention_desc desc;
    sk_attention_desc_init(&desc, sizeof desc);
    desc.backend = SK_BACKEND_CPU;
    desc.batch = 1;
    desc.seq_q = desc.seq_k = S;
    desc.heads_q = desc.heads_kv = H;
    desc.head_dim = D;
    const double t0 = now_seconds();
    const sk_status st = sk_attention_run(&desc, &layout, q, k, v, o, lse, NULL, 0, NULL);
    const double t1 = now_seconds();
    if (st != SK_STATUS_SUCCESS) {
        CHECK(0, "%s: %s", sk_status_name(st), sk_last_error());
        goto done;
    }
    const double flops = 4.0 * (double)(H * S) * (double)(kblocks * bs) * (double)D;
    printf("    attention_cpu_speed: B=1 H=%lld S=%lld D=%lld 25%% density F16: %.3f s, %.2f "
           "GFLOP/s, %d threads\n",
           (long long)H, (long long)S, (long long)D, t1 - t0, flops / (t1 - t0) * 1e-9,
           omp_get_max_threads());

    /* Check 24 random rows against the naive reference. */
    double *kd = (double *)malloc((size_t)(S * D) * sizeof(double));
    double *vd = (double *)malloc((size_t)(S * D) * sizeof(double));
    uint8_t *allow = (uint8_t *)malloc((size_t)S);
    if (kd && vd && allow)
        for (int sample = 0; sample < 24; ++sample) {
            const int64_t h = tu_rng_range(&rng, 0, H - 1), i = tu_rng_range(&rng, 0, S - 1);
            double qd[128], od[128], ref_lse, qn = 0.0, kmax = 0.0, vmax = 0.0;
            for (int64_t x = 0; x < D; ++x) {
                qd[x] = tu_load(q, SK_DTYPE_F16, (i * H + h) * D + x);
                qn += qd[x] * qd[x];
            }
            double nkeys = 0.0;
            for (int64_t j = 0; j < S; ++j) {
                allow[j] = mask[(h * nb + i / bs) * nb + j / bs];
                nkeys += allow[j];
                double kn = 0.0;
                for (int64_t x = 0; x < D; ++x) {
                    kd[j * D + x] = tu_load(k, SK_DTYPE_F16, (j * H + h) * D + x);
                    vd[j * D + x] = tu_load(v, SK_DTYPE_F16, (j * H + h) * D + x);
                    kn += kd[j * D + x] * kd[j * D + x];
                    if (fabs(vd[j * D + x]) > vmax) vmax = fabs(vd[j * D + x]);
                }
                if (sqrt(kn) > kmax) kmax = sqrt(kn);
            }
            const double scale = 1.0 / sqrt((double)D), smag = scale * sqrt(qn) * kmax;
            nr_attention_row(S, D, scale, qd, kd, D, vd, D, allow, od, &ref_lse);
            int bad = 0;
            for (int64_t x = 0; x < D; ++x) {
                const double got = tu_load(o, SK_DTYPE_F16, (i * H + h) * D + x);
                if (!(fabs(got - od[x]) <=
                      tu_attn_tol_o(SK_DTYPE_F16, od[x], (double)D, smag, vmax, nkeys)))
                    ++bad;
            }
            const double got_lse = lse[h * S + i];
            CHECK(bad == 0 && fabs(got_lse - ref_lse) <= tu_attn_tol_lse(ref_lse, (double)D, smag, nkeys),
                  "seed %llu row h=%lld q=%lld: %d elements off, LSE %.9g vs %.9g",
                  (unsigned long long)seed, (long long)h, (long long)i, bad, got_lse, ref_lse);
        }
    free(kd), free(vd), free(allow);
done:
    free(q), free(k), free(v), free(o), free(lse), free(mask);
    nr_bsr_free(&layout);
}

/* ---------------------------------------------------------------------------
 * The backend's fp16 / bf16 conversions (src/cpu/half.c), against the
 * independent ones in tests/common (which round through double and rint).
 * ------------------------------------------------------------------------- */

#include "cpu/half.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int same_f16(uint16_t a, uint16_t b) {
    const int nan_a = (a & 0x7c00) == 0x7c00 && (a & 0x3ff),
              nan_b = (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
    return nan_a || nan_b ? nan_a && nan_b : a == b;
}

static int same_bf16(uint16_t a, uint16_t b) {
    const int nan_a = (a & 0x7f80) == 0x7f80 && (a & 0x7f),
              nan_b = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
    return nan_a || nan_b ? nan_a && nan_b : a == b;
}

SK_TEST(cpu_half_widening_is_exact_for_every_value) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float a = sk_f16_to_f32((uint16_t)h), b = tu_f16_to_f32((uint16_t)h);
        const int ok = isnan(b) ? isnan(a) : bits_of(a) == bits_of(b);
        if (!ok && bad++ < 3) CHECK(ok, "f16 0x%04x -> %a, want %a", h, (double)a, (double)b);
        const float c = sk_bf16_to_f32((uint16_t)h), d = tu_bf16_to_f32((uint16_t)h);
        const int ok2 = isnan(d) ? isnan(c) : bits_of(c) == bits_of(d);
        if (!ok2 && bad++ < 3) CHECK(ok2, "bf16 0x%04x -> %a, want %a", h, (double)c, (double)d);
    }
}

SK_TEST(cpu_half_narrowing_rounds_to_nearest_even) {
    int bad = 0;
    /* Every f16 / bf16 value, the midpoints to the next one (ties), and one
     * fp32 ulp either side of each midpoint; then random fp32 bit patterns. */
    for (uint32_t h = 0; h < 65536; ++h) {
        const float v = tu_f16_to_f32((uint16_t)h), w = tu_f16_to_f32((uint16_t)(h + 1));
        const float bv = tu_bf16_to_f32((uint16_t)h), bw = tu_bf16_to_f32((uint16_t)(h + 1));
        float probes[8] = {v, bv, 0, 0, 0, 0, 0, 0};
        int n = 2;
        if (isfinite(v) && isfinite(w) && (h & 0x7fff) != 0x7bff && h != 0x7fff) {
            const float mid = (float)(((double)v + (double)w) / 2);
            probes[n++] = mid;
            probes[n++] = float_of(bits_of(mid) + 1);
            probes[n++] = float_of(bits_of(mid) - 1);
        }
        if (isfinite(bv) && isfinite(bw) && (h & 0x7fff) < 0x7f7f) {
            const float mid = (float)(((double)bv + (double)bw) / 2);
            probes[n++] = mid;
            probes[n++] = float_of(bits_of(mid) + 1);
            probes[n++] = float_of(bits_of(mid) - 1);
        }
        for (int i = 0; i < n; ++i) {
            const float f = probes[i];
            const uint16_t a = sk_f32_to_f16(f), b = tu_f32_to_f16(f);
            if (!same_f16(a, b) && bad++ < 5)
                CHECK(0, "f32 %a (0x%08x) -> f16 0x%04x, want 0x%04x", (double)f, bits_of(f), a, b);
            const uint16_t c = sk_f32_to_bf16(f), d = tu_f32_to_bf16(f);
            if (!same_bf16(c, d) && bad++ < 5)
                CHECK(0, "f32 %a (0x%08x) -> bf16 0x%04x, want 0x%04x", (double)f, bits_of(f), c,
                      d);
        }
    }
    tu_rng rng;
    tu_rng_seed(&rng, case_seed(20, 0));
    for (int i = 0; i < 2000000; ++i) {
        const float f = float_of((uint32_t)tu_rng_next(&rng));
        const uint16_t a = sk_f32_to_f16(f), b = tu_f32_to_f16(f);
        if (!same_f16(a, b) && bad++ < 5)
            CHECK(0, "f32 %a -> f16 0x%04x, want 0x%04x", (double)f, a, b);
        const uint16_t c = sk_f32_to_bf16(f), d = tu_f32_to_bf16(f);
        if (!same_bf16(c, d) && bad++ < 5)
            CHECK(0, "f32 %a -> bf16 0x%04x, want 0x%04x", (double)f, c, d);
    }
    CHECK(bad == 0, "%d mismatches", bad);
}

/* Storing an fp64 O rounds once: just above / below a midpoint of two f16
 * (bf16) values, by far less than an fp32 ulp, must go up / down, which a
 * plain double -> float -> half path gets wrong (the float lands on the tie). */
SK_TEST(cpu_half_store_from_double_rounds_once) {
    int bad = 0;
    for (int t = 0; t < 2; ++t) {
        const sk_dtype dt = t ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        for (uint32_t h = 1; h < 0x7b00; h += 7) {
            const double v = tu_load(&(uint16_t){(uint16_t)h}, dt, 0);
            const double w = tu_load(&(uint16_t){(uint16_t)(h + 1)}, dt, 0);
            const double mid = (v + w) / 2, tiny = mid * 0x1.0p-40;
            uint16_t up, down, tie;
            sk_cpu_store1_f64(&up, dt, 0, mid + tiny);
            sk_cpu_store1_f64(&down, dt, 0, mid - tiny);
            sk_cpu_store1_f64(&tie, dt, 0, mid);
            const int ok = up == h + 1 && down == h && tie == ((h & 1) ? h + 1 : h);
            if (!ok && bad++ < 3)
                CHECK(ok, "%s 0x%04x: above mid -> 0x%04x, below -> 0x%04x, tie -> 0x%04x",
                      t ? "bf16" : "f16", h, up, down, tie);
        }
    }
    /* Special values. */
    uint16_t x;
    sk_cpu_store1_f64(&x, SK_DTYPE_F16, 0, INFINITY);
    CHECK(x == 0x7c00, "inf -> 0x%04x", x);
    sk_cpu_store1_f64(&x, SK_DTYPE_F16, 0, -1e300);
    CHECK(x == 0xfc00, "-1e300 -> 0x%04x", x);
    sk_cpu_store1_f64(&x, SK_DTYPE_F16, 0, NAN);
    CHECK((x & 0x7c00) == 0x7c00 && (x & 0x3ff), "NaN -> 0x%04x", x);
    sk_cpu_store1_f64(&x, SK_DTYPE_F16, 0, 0x1.0p-25 * (1 + 0x1.0p-40));
    CHECK(x == 0x0001, "just above half the smallest subnormal -> 0x%04x", x);
    sk_cpu_store1_f64(&x, SK_DTYPE_BF16, 0, -0.0);
    CHECK(x == 0x8000, "-0 -> 0x%04x", x);
}
