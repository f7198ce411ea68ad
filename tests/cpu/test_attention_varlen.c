/*
 * test_attention_varlen.c - the varlen attention forward (CPU backend)
 * against the naive dense fp64 reference on each sequence's unpacked copy
 * (tests/common/naive_ref.c), and bitwise against the fixed-batch forward
 * run on each sequence alone.
 *
 * The cases are tests/common/varlen_case.h's: seeded lengths (0
 * included), per-sequence random block masks per layout head slice, a
 * varlen BSR made by the test from them (never the layout builders:
 * test_layout_varlen.c tests those), the test's own token mask per
 * (sequence, query head) from those masks, its slice mapping and the
 * bottom-right causal rule of each sequence. Q/K/V are rounded to the
 * dtype; the reference reads the same values in fp64. Before each run O and
 * LSE are NaN, and so is every element of Q/K/V that no query may read
 * (stride padding, keys no query of the sequence's KV head attends), so an
 * unwritten output or a stray read shows up.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "common/varlen_case.h"
#include "sparsek.h"

static const sk_dtype all_dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};

/* Each sequence alone through sk_attention_forward (B = 1, its own block
 * mask as a fixed layout, the same memory): its O rows and LSE columns must
 * equal the varlen call's bit for bit. Returns the sequences compared. */
static int compare_fixed_batch(const vc_case *c, vc_data *x, const char *label) {
    const int64_t Hq = c->heads_q, D = c->head_dim;
    const size_t es = vc_elem_size(c->dtype);
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

/* Run one case; returns 0 when everything matched. */
static int run_case(const vc_case *c, uint64_t seed, vc_outcome *out_arg) {
    char label[400];
    vc_label(c, seed, label, sizeof label);
    const int failures_before = sk_test_failures();
    vc_outcome local;
    vc_outcome *out = out_arg != NULL ? out_arg : &local;
    memset(out, 0, sizeof *out);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    if (!vc_make(c, &rng, &x)) {
        CHECK(0, "%s out of memory", label);
        vc_data_free(&x);
        return 1;
    }
    const sk_status st = vc_call_varlen(c, &x);
    CHECK(st == SK_STATUS_SUCCESS, "%s %s: %s", label, sk_status_name(st), sk_last_error());
    if (st == SK_STATUS_SUCCESS) {
        const int64_t bad = vc_compare_reference(c, &x, label, out);
        CHECK(bad == 0, "%s %lld mismatches", label, (long long)bad);
        out->bitwise_sequences = compare_fixed_batch(c, &x, label);
        if (out_arg != NULL) {
            out->o_bytes = (size_t)x.q_span * vc_elem_size(c->dtype);
            out->o = malloc(out->o_bytes);
            out->lse = (float *)malloc((size_t)(c->heads_q * x.total_q) * sizeof(float));
            if (out->o) memcpy(out->o, x.o, out->o_bytes);
            if (out->lse) memcpy(out->lse, x.lse, (size_t)(c->heads_q * x.total_q) * sizeof(float));
        }
    }
    vc_data_free(&x);
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
            vc_case c = vc_base_case(all_dtypes[t], 8, lq, lk);
            c.causal = causal;
            c.heads_q = 2;
            c.heads_kv = 1;
            c.density = 0.8;
            vc_outcome out;
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
        vc_case c = vc_base_case(all_dtypes[t], 5, lq, lk);
        c.causal = 1;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.bk = 128;
        vc_outcome out;
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
            vc_case c = vc_base_case(all_dtypes[id % 3], 3, lq, lk);
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
            vc_case c = vc_base_case(all_dtypes[id % 3], 4, lq, lk);
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
        const vc_case c = vc_random_case(&rng, 8, 330, 330);
        vc_outcome out;
        run_case(&c, case_seed(5, (uint64_t)id), &out);
        compared += out.bitwise_sequences;
        free(out.o), free(out.lse);
    }
    CHECK(compared > 40, "only %d sequences compared with the fixed batch", compared);
}

/* The result does not depend on the thread count: bitwise equal. */
SK_TEST(varlen_cpu_repeatable_across_thread_counts) {
    static const int32_t lq[4] = {300, 1, 0, 190}, lk[4] = {280, 77, 5, 400};
    vc_case c = vc_base_case(SK_DTYPE_F32, 4, lq, lk);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.layout_heads = 2;
    c.density = 0.5;
    c.causal = 1;
    const uint64_t seed = case_seed(6, 0);
    vc_outcome a, b;
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
