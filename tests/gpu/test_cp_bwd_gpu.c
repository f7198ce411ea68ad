/*
 * test_cp_bwd_gpu.c - the CUDA context-parallel backward on one GPU: R
 * ranks (R = 1, 2, 3; one thread and one stream each, the simulated device
 * communicator) against the single-GPU sk_attention_backward over the
 * global tensors with the global layout, fed the single-GPU forward's O and
 * LSE (each rank gets its shard of them). Contiguous and zigzag, causal
 * and not, window, sinks + window and random layouts, broadcast / per-KV-
 * head / per-query-head slices, tails, F16 and BF16, D 64 and 128.
 *
 * Poison: K and V units (batch, KV head, key block) that no row of any
 * layout slice selects are NaN (reading one poisons a gradient); dQ, dK,
 * dV and every rank's workspace start as NaN bytes before
 * sk_cp_backward_prepare. Each case runs twice: the second run must equal
 * the first bit for bit.
 *
 * Tolerance, "one rounding per partial" (src/core/cp_backward_cuda.c):
 * each pass's partial gradient is rounded to the dtype, the partials added
 * in fp32, the sum rounded again; the single-GPU reference rounds once.
 * The per-pair terms (P, dS, from the same global LSE and O) are the same
 * in both, so they differ by the partials' roundings, the final one and
 * fp32 order: |got - ref| <= u (2 |ref| + 2 n g) + 1e-5, with n the
 * partials an element can have (dQ: 2; dK, dV: 2 R) and g the largest
 * |ref| of that gradient over the element's (batch, head): a partial sums
 * a subset of the same terms, so for these random inputs it stays within
 * g. A missing or doubled pass, unit or returned partial moves elements
 * by O(g) and breaks it. R = 1 contiguous is the single-GPU backward over
 * the same layout: bitwise equal.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cp_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "cuda_api.h"
#include "gpu/cp_gpu.h"
#include "gpu_util.h"
#include "sparsek.h"

/* One rank: the common part, its device shards and gradients. */
typedef struct cb_rank {
    cpg_rank f;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
} cb_rank;

/* The global host tensors of a case. */
typedef struct cb_host {
    void *q, *k, *v, *o, *dout;
    float *lse;
} cb_host;

static void *cb_run_rank(void *arg) {
    cb_rank *r = arg;
    cpg_rank_done(&r->f, sk_cp_backward(&r->f.desc, r->f.plan, r->f.plan_bytes, r->f.comm, r->q,
                                        r->k, r->v, r->o, r->lse, r->dout, r->dq, r->dk, r->dv,
                                        r->f.ws, r->f.ws_bytes, (struct CUstream_st *)r->f.stream));
    return NULL;
}

/* The single-GPU forward (O, LSE into h) and backward (dq, dk, dv) over
 * the global tensors, host in, host out. */
static int cb_reference(const cp_case *c, const sk_bsr *L, cb_host *h, void *dq, void *dk,
                        void *dv) {
    const int64_t nq = c->batch * c->seq * c->heads_q * c->head_dim * 2;
    const int64_t nk = c->batch * c->seq * c->heads_kv * c->head_dim * 2;
    const int64_t nl = c->batch * c->heads_q * c->seq * 4;
    sk_attention_desc a;
    cpg_attention_desc(c, &a);
    sk_attention_backward_desc g;
    sk_attention_backward_desc_init(&g, sizeof g);
    sk_bsr dl;
    size_t fw = 0, bw = 0;
    if (gt_bsr_to_device(L, &dl) != 0) return 1;
    void *d[8];
    const int64_t bytes[8] = {nq, nk, nk, nq, nq, nq, nk, nk}; /* q k v o dout dq dk dv */
    for (int i = 0; i < 8; ++i) d[i] = gt_device_alloc((size_t)bytes[i]);
    float *dlse = gt_device_alloc((size_t)nl);
    sk_status st = sk_attention_workspace_size(&a, &dl, &fw);
    if (st == SK_STATUS_SUCCESS) st = sk_attention_backward_workspace_size(&a, &g, &dl, &bw);
    void *ws = gt_device_alloc((fw > bw ? fw : bw) + 256);
    int bad = st != SK_STATUS_SUCCESS || gt_upload(d[0], h->q, (size_t)nq) ||
              gt_upload(d[1], h->k, (size_t)nk) || gt_upload(d[2], h->v, (size_t)nk) ||
              gt_upload(d[4], h->dout, (size_t)nq);
    if (!bad) st = sk_attention_forward(&a, &dl, d[0], d[1], d[2], d[3], dlse, ws, fw, NULL);
    bad = bad || st != SK_STATUS_SUCCESS;
    if (!bad)
        st = sk_attention_backward(&a, &g, &dl, d[0], d[1], d[2], d[3], d[4], dlse, d[5], d[6],
                                   d[7], ws, bw, NULL);
    bad = bad || st != SK_STATUS_SUCCESS || gt_sync() || gt_download(h->o, d[3], (size_t)nq) ||
          gt_download(h->lse, dlse, (size_t)nl) || gt_download(dq, d[5], (size_t)nq) ||
          gt_download(dk, d[6], (size_t)nk) || gt_download(dv, d[7], (size_t)nk);
    CHECK(!bad, "single-GPU reference: %s", sk_last_error());
    for (int i = 0; i < 8; ++i) gt_device_free(d[i]);
    gt_device_free(dlse), gt_device_free(ws);
    gt_bsr_free_device(&dl);
    return bad;
}

/* Every rank: shards up, NaN gradients and workspace, prepare; run them on
 * threads; the gradients gathered into the global dq, dk, dv. 0 when
 * every rank succeeded. */
static int cb_run_ranks(const cp_case *c, cb_rank *rk, const cb_host *h, void *dq, void *dk,
                        void *dv, const char *name) {
    const int64_t B = c->batch, S = c->seq, HQ = c->heads_q * c->head_dim;
    const int64_t HK = c->heads_kv * c->head_dim, BH = B * c->heads_q;
    for (int32_t r = 0; r < c->ranks; ++r) {
        cb_rank *x = &rk[r];
        const int64_t nq = B * x->f.tokens * HQ, nk = B * x->f.tokens * HK;
        void *s[5];
        const void *g[5] = {h->q, h->k, h->v, h->o, h->dout};
        const int64_t row[5] = {HQ, HK, HK, HQ, HQ}, n[5] = {nq, nk, nk, nq, nq};
        void *dev[5] = {x->q, x->k, x->v, x->o, x->dout};
        float *hl = malloc((size_t)(BH * x->f.tokens) * 4);
        int bad = hl == NULL;
        for (int i = 0; i < 5; ++i) {
            s[i] = malloc((size_t)n[i] * 2);
            bad = bad || s[i] == NULL;
            int64_t at = 0;
            for (int32_t ch = 0; !bad && ch < x->f.chunks; at += x->f.lengths[ch], ++ch)
                cpc_rows(s[i], g[i], 2, B, S, x->f.tokens, row[i], x->f.starts[ch], at,
                         x->f.lengths[ch], 0);
            bad = bad || gt_upload(dev[i], s[i], (size_t)n[i] * 2);
            free(s[i]);
        }
        int64_t at = 0;
        for (int32_t ch = 0; !bad && ch < x->f.chunks; at += x->f.lengths[ch], ++ch)
            for (int64_t bh = 0; bh < BH; ++bh)
                memcpy(hl + bh * x->f.tokens + at, h->lse + bh * S + x->f.starts[ch],
                       (size_t)x->f.lengths[ch] * 4);
        bad = bad || gt_upload(x->lse, hl, (size_t)(BH * x->f.tokens) * 4);
        free(hl);
        /* The NaN fills on the rank's own stream: a non-blocking stream
         * does not wait for the legacy default stream. */
        bad = bad || cudaMemsetAsync(x->dq, 0xff, (size_t)nq * 2, x->f.stream) != cudaSuccess ||
              cudaMemsetAsync(x->dk, 0xff, (size_t)nk * 2, x->f.stream) != cudaSuccess ||
              cudaMemsetAsync(x->dv, 0xff, (size_t)nk * 2, x->f.stream) != cudaSuccess;
        if (cpg_rank_prepare(&x->f, bad, 1, r, name)) return 1;
    }
    int failed = cpg_run_threads(c->ranks, cb_run_rank, rk, sizeof *rk, name);
    for (int32_t r = 0; r < c->ranks; ++r) {
        cb_rank *x = &rk[r];
        if (x->f.status != SK_STATUS_SUCCESS) continue;
        void *out[3] = {dq, dk, dv};
        const void *dev[3] = {x->dq, x->dk, x->dv};
        const int64_t row[3] = {HQ, HK, HK};
        for (int i = 0; i < 3; ++i) {
            const int64_t n = B * x->f.tokens * row[i];
            void *hs = malloc((size_t)n * 2);
            const int bad = hs == NULL || gt_download(hs, dev[i], (size_t)n * 2);
            int64_t at = 0;
            for (int32_t ch = 0; !bad && ch < x->f.chunks; at += x->f.lengths[ch], ++ch)
                cpc_rows(out[i], hs, 2, B, S, x->f.tokens, row[i], x->f.starts[ch], at,
                         x->f.lengths[ch], 1);
            free(hs);
            failed |= bad;
        }
    }
    return failed;
}

/* One gradient [B, S, H, D] against its reference under the tolerance
 * above (n partials); the count of elements out of it. */
static int64_t cb_compare(const cp_case *c, const char *name, const char *what, const void *got,
                          const void *ref, int64_t H, int64_t n, int64_t *bitwise, double *worst) {
    const int64_t B = c->batch, S = c->seq, D = c->head_dim;
    const double u = tu_unit_roundoff(c->dtype);
    int64_t bad = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            double g = 0;
            for (int64_t t = 0; t < S; ++t)
                for (int64_t x = 0; x < D; ++x)
                    g = fmax(g, fabs(tu_load(ref, c->dtype, ((b * S + t) * H + h) * D + x)));
            for (int64_t t = 0; t < S; ++t)
                for (int64_t x = 0; x < D; ++x) {
                    const int64_t i = ((b * S + t) * H + h) * D + x;
                    const double rv = tu_load(ref, c->dtype, i), gv = tu_load(got, c->dtype, i);
                    const double tol = u * (2 * fabs(rv) + 2 * (double)n * g) + 1e-5;
                    const double err = fabs(gv - rv);
                    *bitwise += rv == gv;
                    *worst = fmax(*worst, err / tol);
                    if (!(err <= tol) && bad++ < 3)
                        CHECK(0, "%s: %s[b%lld t%lld h%lld d%lld] = %.6g, single GPU %.6g", name,
                              what, (long long)b, (long long)t, (long long)h, (long long)x, gv, rv);
                }
        }
    return bad;
}

static void cb_case_run(const cp_case *c) {
    char name[256];
    cpg_name(name, sizeof name, c, "bwd ");
    if (gt_opt.backend == SK_BACKEND_CUDA_SM90 && c->block != 128) return; /* sm90: 128 only */
    const int64_t B = c->batch, S = c->seq, D = c->head_dim;
    const int64_t nq = B * S * c->heads_q * D, nk = B * S * c->heads_kv * D;
    sk_bsr L;
    sk_layout_t owned = cpg_layout(c, &L);
    REQUIRE(owned != NULL, "%s: layout: %s", name, sk_last_error());

    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    cb_host h;
    h.q = malloc((size_t)nq * 2), h.k = malloc((size_t)nk * 2), h.v = malloc((size_t)nk * 2);
    h.o = malloc((size_t)nq * 2), h.dout = malloc((size_t)nq * 2);
    h.lse = malloc((size_t)(B * c->heads_q * S) * 4);
    /* Gradients: reference, first run, second run. */
    void *g[3][3];
    const int64_t gn[3] = {nq, nk, nk};
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) g[i][j] = malloc((size_t)gn[j] * 2);
    tu_fill_normal(&rng, h.q, c->dtype, nq, 1.0f);
    tu_fill_normal(&rng, h.k, c->dtype, nk, 1.0f);
    tu_fill_normal(&rng, h.v, c->dtype, nk, 1.0f);
    tu_fill_normal(&rng, h.dout, c->dtype, nq, 1.0f);
    const int64_t nb = (S + c->block - 1) / c->block;
    uint8_t *used = calloc((size_t)(B * c->heads_kv * nb), 1);
    REQUIRE(used != NULL, "out of memory");
    cpg_used_units(c, &L, used);
    cpg_poison_unused(c, used, h.k, h.v); /* units nobody selects */
    free(used);

    cb_rank rk[8];
    memset(rk, 0, sizeof rk);
    sk_comm_t comms[8] = {0};
    void *plan = NULL;
    size_t plan_bytes = 0;
    sk_cp_desc d;
    cpg_desc(c, &d);
    int32_t starts[2 * 8 + 1];
    int ok = 1;
    d.chunk_starts = cpc_chunk_starts(c, &d, &L, starts, &ok); /* NULL unless c->starts */
    ok = ok && cb_reference(c, &L, &h, g[0][0], g[0][1], g[0][2]) == 0;
    ok = ok && cpg_plan(&d, &L, &plan, &plan_bytes, comms) == 0;
    CHECK(ok, "%s: setup: %s", name, sk_last_error());
    for (int32_t r = 0; ok && r < c->ranks; ++r) {
        cb_rank *x = &rk[r];
        ok = cpg_rank_init(&x->f, c, &d, r, plan, plan_bytes, comms[r], 1, name) == 0;
        const size_t sq = (size_t)(B * x->f.tokens * c->heads_q * D * 2),
                     sk = (size_t)(B * x->f.tokens * c->heads_kv * D * 2);
        x->q = gt_device_alloc(sq), x->o = gt_device_alloc(sq), x->dout = gt_device_alloc(sq);
        x->dq = gt_device_alloc(sq);
        x->k = gt_device_alloc(sk), x->v = gt_device_alloc(sk);
        x->dk = gt_device_alloc(sk), x->dv = gt_device_alloc(sk);
        x->lse = gt_device_alloc((size_t)(B * c->heads_q * x->f.tokens) * 4);
    }
    ok = ok && cb_run_ranks(c, rk, &h, g[1][0], g[1][1], g[1][2], name) == 0 &&
         cb_run_ranks(c, rk, &h, g[2][0], g[2][1], g[2][2], name) == 0;
    if (ok) {
        for (int j = 0; j < 3; ++j)
            CHECK(memcmp(g[1][j], g[2][j], (size_t)gn[j] * 2) == 0, "%s: two runs differ (%s)",
                  name,
                  j == 0   ? "dq"
                  : j == 1 ? "dk"
                           : "dv");
        static const char *const what[3] = {"dq", "dk", "dv"};
        const int64_t heads[3] = {c->heads_q, c->heads_kv, c->heads_kv};
        const int64_t parts[3] = {2, 2 * c->ranks, 2 * c->ranks};
        int64_t bad = 0, bitwise = 0;
        double worst = 0;
        for (int j = 0; j < 3; ++j)
            bad += cb_compare(c, name, what[j], g[1][j], g[0][j], heads[j], parts[j], &bitwise,
                              &worst);
        CHECK(bad == 0, "%s: %lld gradient elements out of tolerance", name, (long long)bad);
        if (c->ranks == 1 && c->sharding == SK_CP_SHARDING_CONTIGUOUS)
            CHECK(bitwise == nq + 2 * nk, "%s: R = 1 differs from the single-GPU backward", name);
        if (gt_opt.verbose)
            printf("    %s: worst error %.3f of tolerance, %lld of %lld elements bitwise\n", name,
                   worst, (long long)bitwise, (long long)(nq + 2 * nk));
    }
    for (int32_t r = 0; r < c->ranks; ++r) {
        cb_rank *x = &rk[r];
        void *dev[9] = {x->q, x->k, x->v, x->o, x->dout, x->dq, x->dk, x->dv, x->lse};
        for (int i = 0; i < 9; ++i) gt_device_free(dev[i]);
        cpg_rank_free(&x->f);
        sk_comm_destroy(comms[r]);
    }
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) free(g[i][j]);
    free(plan), free(h.q), free(h.k), free(h.v), free(h.o), free(h.dout), free(h.lse);
    sk_layout_destroy(owned);
}

SK_TEST(gpu_cp_backward_matches_single_gpu) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xb9b9);
    int cases = 0;
    for (int32_t ranks = 1; ranks <= 3; ++ranks)
        for (int zig = 0; zig < 2; ++zig)
            for (int causal = 0; causal < 2; ++causal)
                for (int kind = 0; kind < CPC_KINDS; ++kind) {
                    if (gt_opt.quick && (kind != CPC_RANDOM || ranks != 2)) continue;
                    cp_case c;
                    memset(&c, 0, sizeof c);
                    cpg_sweep_case(cases, ranks, zig, causal, kind, tu_rng_next(&rng), &c);
                    /* Both dtypes with and without a tail (the sweep ties
                     * the dtype to the tail). */
                    c.dtype = (cases / 2 % 2) ? SK_DTYPE_F16 : SK_DTYPE_BF16;
                    cb_case_run(&c);
                    ++cases;
                }
}

/* The caller's chunk boundaries (sk_cp_balance's or skewed ones,
 * common/cp_case.c) at R = 2 and 3: the checks above. */
SK_TEST(gpu_cp_backward_given_chunk_starts_match_single_gpu) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xb9ba);
    int cases = 0;
    for (int32_t ranks = 2; ranks <= 3; ++ranks)
        for (int zig = 0; zig < 2; ++zig)
            for (int kind = 0; kind < CPC_KINDS; ++kind) {
                if (gt_opt.quick && (kind != CPC_SINKS_WINDOW || ranks != 2)) continue;
                cp_case c;
                memset(&c, 0, sizeof c);
                cpg_sweep_case(cases, ranks, zig, 1, kind, tu_rng_next(&rng), &c);
                c.starts = cases % 2 ? CPC_STARTS_SKEWED : CPC_STARTS_BALANCED;
                cb_case_run(&c);
                ++cases;
            }
}
