/*
 * test_scale_limits.c - the scale rule of the attention (sparsek.h,
 * "Scale") on both sides, what overflowing logits give on the CPU backend
 * ("Logits that overflow"), and the top-k scale, which has no such limit.
 *
 * The rule: |scale| x log2(e), rounded to fp32 as the CUDA kernels fold it,
 * must be finite. The largest accepted scale is found here by stepping
 * through floats, independently of the library's test (an exact double
 * comparison).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

/* B 1, Sq 1, Sk 2, H 1, D 1, F32 on the CPU, one dense block. */
typedef struct tiny {
    sk_attention_desc desc;
    sk_bsr layout;
    int32_t off[2], idx[1];
    float q[1], k[2], v[2], o[1], lse[1];
} tiny;

static void tiny_init(tiny *t, float scale) {
    memset(t, 0, sizeof *t);
    sk_attention_desc_init(&t->desc, sizeof t->desc);
    t->desc.backend = SK_BACKEND_CPU;
    t->desc.dtype = SK_DTYPE_F32;
    t->desc.batch = t->desc.seq_q = t->desc.heads_q = t->desc.heads_kv = t->desc.head_dim = 1;
    t->desc.seq_k = 2;
    t->desc.scale = scale;
    t->off[1] = 1;
    t->layout.grid = tu_grid(1, 2, 64, 64, 1, 1);
    t->layout.nnz = 1;
    t->layout.row_offsets = t->off;
    t->layout.col_indices = t->idx;
    t->v[0] = 3.0f;
    t->v[1] = 5.0f;
    t->o[0] = t->lse[0] = -12345.0f; /* sentinels */
}

static sk_status tiny_run(tiny *t) {
    return sk_attention_forward(&t->desc, &t->layout, t->q, t->k, t->v, t->o, t->lse, NULL, 0,
                                NULL);
}

/* The largest float s with fp32(s x log2(e)) finite. */
static float largest_scale(void) {
    const float log2e = 1.4426950408889634f;
    float s = FLT_MAX / 2;
    for (;;) {
        const float next = nextafterf(s, INFINITY);
        volatile float folded = next * log2e; /* rounded to fp32 */
        if (isinf(folded)) return s;
        s = next;
        /* Jump close first: the answer is near FLT_MAX / log2(e). */
        if (s < 2.3e38f) s = 2.3e38f;
    }
}

SK_TEST(scale_limits_attention_rule_both_sides) {
    const float s_max = largest_scale();
    const float s_over = nextafterf(s_max, INFINITY);
    CHECK(s_max > 2.35e38f && s_max < 2.36e38f, "largest scale %g", (double)s_max);
    const float accepted[2] = {s_max, -s_max};
    for (int i = 0; i < 2; ++i) {
        /* Q = K = 0: every logit is 0 whatever the scale, so O is the mean
         * of V and LSE = log(2). */
        tiny t;
        tiny_init(&t, accepted[i]);
        const sk_status st = tiny_run(&t);
        CHECK(st == SK_STATUS_SUCCESS, "scale %g: %s %s", (double)accepted[i], sk_status_name(st),
              sk_last_error());
        CHECK(t.o[0] == 4.0f && fabsf(t.lse[0] - logf(2.0f)) < 1e-6f, "scale %g: O %g LSE %g",
              (double)accepted[i], (double)t.o[0], (double)t.lse[0]);
    }
    const float refused[4] = {s_over, -s_over, 3e38f, FLT_MAX};
    for (int i = 0; i < 4; ++i) {
        tiny t;
        tiny_init(&t, refused[i]);
        const sk_status st = tiny_run(&t);
        CHECK(st == SK_STATUS_BAD_PARAM_VALUE, "scale %g: %s", (double)refused[i],
              sk_status_name(st));
        CHECK(strstr(sk_last_error(), "desc->scale") != NULL &&
                  strstr(sk_last_error(), "log2(e)") != NULL,
              "scale %g: message \"%s\"", (double)refused[i], sk_last_error());
        CHECK(t.o[0] == -12345.0f && t.lse[0] == -12345.0f, "scale %g: outputs written",
              (double)refused[i]);
    }
    /* sk_attention_topk checks its attention descriptor the same way. */
    sk_attention_desc attn;
    sk_attention_desc_init(&attn, sizeof attn);
    sk_topk_desc topk;
    sk_topk_desc_init(&topk, sizeof topk);
    attn.backend = topk.backend = SK_BACKEND_CPU;
    attn.dtype = topk.dtype = SK_DTYPE_F32;
    attn.batch = attn.seq_q = attn.seq_k = attn.heads_q = attn.heads_kv = attn.head_dim = 1;
    topk.batch = topk.seq_q = topk.seq_k = topk.heads_q = topk.heads_kv = topk.head_dim = 1;
    attn.scale = s_over;
    size_t bytes = 7;
    const sk_status st = sk_attention_topk_workspace_size(&attn, &topk, &bytes);
    CHECK(st == SK_STATUS_BAD_PARAM_VALUE && bytes == 7, "sk_attention_topk_workspace_size: %s",
          sk_status_name(st));
}

/* An accepted scale with finite inputs whose logits overflow fp32: on the
 * CPU a +inf logit makes the row NaN; a -inf logit next to a finite one
 * gets weight 0. */
SK_TEST(scale_limits_attention_logit_overflow_on_cpu) {
    tiny t;
    tiny_init(&t, 1e30f);
    t.q[0] = 1.0f;
    t.k[0] = 1e10f; /* logit 1e40: +inf */
    t.k[1] = 0.0f;  /* logit 0 */
    sk_status st = tiny_run(&t);
    CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
    CHECK(isnan(t.o[0]) && isnan(t.lse[0]), "+inf logit: O %g LSE %g", (double)t.o[0],
          (double)t.lse[0]);

    tiny_init(&t, 1e30f);
    t.q[0] = 1.0f;
    t.k[0] = -1e10f; /* logit -1e40: -inf */
    t.k[1] = 0.0f;
    st = tiny_run(&t);
    CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
    CHECK(t.o[0] == 5.0f && t.lse[0] == 0.0f, "-inf logit: O %g (want V[1] = 5), LSE %g (want 0)",
          (double)t.o[0], (double)t.lse[0]);
}

/* The top-k scale multiplies the scores only: any finite scale is taken,
 * and scores beyond the fp32 range are +-inf under the usual rules (+inf
 * first, -inf never picked). Pooled Q = 1, pooled K = {2, -2, 1, 0} with
 * scale FLT_MAX: scores {+inf, -inf, FLT_MAX, 0}. */
SK_TEST(scale_limits_topk_scale_has_no_fold) {
    sk_topk_desc d;
    sk_topk_desc_init(&d, sizeof d);
    d.backend = SK_BACKEND_CPU;
    d.dtype = SK_DTYPE_F32;
    d.batch = d.heads_q = d.heads_kv = d.head_dim = 1;
    d.seq_q = 64;
    d.seq_k = 256;
    d.block_q = d.block_k = 64;
    d.scale = FLT_MAX;
    const float pooled_q[1] = {1.0f}, pooled_k[4] = {2.0f, -2.0f, 1.0f, 0.0f};
    const int32_t ks[2] = {2, 4};
    const int32_t want_n[2] = {2, 3}, want[2][3] = {{0, 2, -1}, {0, 2, 3}};
    for (int c = 0; c < 2; ++c) {
        d.k = ks[c];
        int32_t off[2] = {-1, -1}, idx[4] = {-1, -1, -1, -1};
        sk_bsr layout;
        memset(&layout, 0, sizeof layout);
        layout.row_offsets = off;
        layout.col_indices = idx;
        const sk_status st = sk_select_topk(&d, pooled_q, pooled_k, &layout, NULL, 0, NULL);
        REQUIRE(st == SK_STATUS_SUCCESS, "k = %d: %s %s", (int)ks[c], sk_status_name(st),
                sk_last_error());
        CHECK(off[0] == 0 && off[1] == want_n[c], "k = %d: %d blocks, want %d", (int)ks[c],
              (int)off[1], (int)want_n[c]);
        for (int e = 0; e < want_n[c] && e < off[1]; ++e)
            CHECK(idx[e] == want[c][e], "k = %d: entry %d = %d, want %d", (int)ks[c], e,
                  (int)idx[e], (int)want[c][e]);
    }
}
