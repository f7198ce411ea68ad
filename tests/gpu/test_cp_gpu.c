/*
 * test_cp_gpu.c - the CUDA context-parallel run on one GPU: R ranks (R = 1
 * .. 4, one thread and one stream each, the simulated device communicator)
 * against the single-GPU sk_attention_forward over the global tensors with
 * the global layout. Contiguous and zigzag sharding, causal and not,
 * window, sinks + window and random layouts, broadcast / per-KV-head /
 * per-query-head layouts, tails, F16 and BF16, D 64 and 128.
 *
 * Inputs: K and V units (batch, KV head, key block) that no row of any
 * layout slice selects are NaN, so reading one poisons the output; every
 * workspace starts as NaN bytes (an unreceived remote slot read is NaN);
 * O and LSE start NaN. Each case runs twice: the second run must equal the
 * first bit for bit.
 *
 * Tolerance against the single-GPU forward (docs/perf/context_parallel.md
 * section 5): a row with remote blocks is two partial attentions, each
 * rounded to the dtype, merged in fp32 and rounded again, and the P
 * rounding of each partial happens against its own row maximum, so
 * |got - ref| <= u (2 |ref| + 4 vmax_row) + 1e-5, with vmax_row the
 * largest |V| over the key blocks the row's slice selects. LSE has no
 * dtype rounding (fp32 row sums of unrounded P): |got - ref| <= 1e-4 (1 +
 * |ref|), which a missing or extra block (a weight of at least ~1e-4 of
 * the row) breaks. With R = 1 the run is the single-GPU forward over the
 * same layout: bitwise equal. gpu_cp_given_chunk_starts_match_single_gpu
 * runs the same checks with the caller's chunk boundaries and with
 * reserve_sms = 0.
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

/* One rank: the common part, its device shard and outputs. */
typedef struct cg_rank {
    cpg_rank f;
    void *q, *k, *v, *o;
    float *lse;
} cg_rank;

static void *cg_run_rank(void *arg) {
    cg_rank *r = arg;
    cpg_rank_done(&r->f, sk_cp_forward(&r->f.desc, r->f.plan, r->f.plan_bytes, r->f.comm, r->q,
                                       r->k, r->v, r->o, r->lse, r->f.ws, r->f.ws_bytes,
                                       (struct CUstream_st *)r->f.stream));
    return NULL;
}

/* used: cpg_used_units. vmax[(b * Hkv + h) * nb + j]: max |V| over the
 * block. */
static void cg_usage(const cp_case *c, const sk_bsr *L, const void *v, int64_t nb, uint8_t *used,
                     double *vmax) {
    cpg_used_units(c, L, used);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < c->heads_kv; ++h)
            for (int64_t j = 0; j < nb; ++j) {
                double m = 0;
                for (int64_t t = j * c->block; t < c->seq && t < (j + 1) * c->block; ++t)
                    for (int64_t d = 0; d < c->head_dim; ++d)
                        m = fmax(m, fabs(tu_load(
                                        v, c->dtype,
                                        ((b * c->seq + t) * c->heads_kv + h) * c->head_dim + d)));
                vmax[(b * c->heads_kv + h) * nb + j] = m;
            }
}

/* The single-GPU forward over the global tensors (host in, host out). */
static int cg_reference(const cp_case *c, const sk_bsr *L, const void *q, const void *k,
                        const void *v, void *o, float *lse) {
    const int64_t es = 2, nq = c->batch * c->seq * c->heads_q * c->head_dim;
    const int64_t nk = c->batch * c->seq * c->heads_kv * c->head_dim;
    sk_attention_desc a;
    cpg_attention_desc(c, &a);
    sk_bsr dl;
    size_t wsb = 0;
    if (gt_bsr_to_device(L, &dl) != 0) return 1;
    void *dq = gt_device_alloc((size_t)(nq * es)), *dk = gt_device_alloc((size_t)(nk * es));
    void *dv = gt_device_alloc((size_t)(nk * es)), *dout = gt_device_alloc((size_t)(nq * es));
    float *dlse = gt_device_alloc((size_t)(c->batch * c->heads_q * c->seq) * sizeof(float));
    sk_status st = sk_attention_workspace_size(&a, &dl, &wsb);
    void *ws = gt_device_alloc(wsb > 0 ? wsb : 256);
    int bad = st != SK_STATUS_SUCCESS || gt_upload(dq, q, (size_t)(nq * es)) ||
              gt_upload(dk, k, (size_t)(nk * es)) || gt_upload(dv, v, (size_t)(nk * es));
    if (!bad) st = sk_attention_forward(&a, &dl, dq, dk, dv, dout, dlse, ws, wsb, NULL);
    bad = bad || st != SK_STATUS_SUCCESS || gt_sync() || gt_download(o, dout, (size_t)(nq * es)) ||
          gt_download(lse, dlse, (size_t)(c->batch * c->heads_q * c->seq) * sizeof(float));
    CHECK(!bad, "single-GPU reference: %s", sk_last_error());
    gt_device_free(dq), gt_device_free(dk), gt_device_free(dv), gt_device_free(dout);
    gt_device_free(dlse), gt_device_free(ws);
    gt_bsr_free_device(&dl);
    return bad;
}

/* Set up every rank (shards on the device, NaN outputs and workspace,
 * sk_cp_prepare), run them on threads, fetch O and LSE into the global
 * arrays. Returns 0 when every rank succeeded. */
static int cg_run_ranks(const cp_case *c, cg_rank *rk, const void *q, const void *k, const void *v,
                        void *o, float *lse, const char *name) {
    const int64_t B = c->batch, S = c->seq, HQ = c->heads_q * c->head_dim;
    const int64_t HK = c->heads_kv * c->head_dim;
    for (int32_t r = 0; r < c->ranks; ++r) {
        cg_rank *x = &rk[r];
        const int64_t nq = B * x->f.tokens * HQ, nk = B * x->f.tokens * HK;
        void *hq = malloc((size_t)nq * 2), *hk = malloc((size_t)nk * 2),
             *hv = malloc((size_t)nk * 2);
        int64_t at = 0;
        for (int32_t ch = 0; ch < x->f.chunks; at += x->f.lengths[ch], ++ch) {
            cpc_rows(hq, q, 2, B, S, x->f.tokens, HQ, x->f.starts[ch], at, x->f.lengths[ch], 0);
            cpc_rows(hk, k, 2, B, S, x->f.tokens, HK, x->f.starts[ch], at, x->f.lengths[ch], 0);
            cpc_rows(hv, v, 2, B, S, x->f.tokens, HK, x->f.starts[ch], at, x->f.lengths[ch], 0);
        }
        /* The NaN fills on the rank's own stream: a non-blocking stream
         * does not wait for the legacy default stream. */
        const int bad = gt_upload(x->q, hq, (size_t)nq * 2) ||
                        gt_upload(x->k, hk, (size_t)nk * 2) ||
                        gt_upload(x->v, hv, (size_t)nk * 2) ||
                        cudaMemsetAsync(x->o, 0xff, (size_t)nq * 2, x->f.stream) != cudaSuccess ||
                        cudaMemsetAsync(x->lse, 0xff, (size_t)(B * c->heads_q * x->f.tokens) * 4,
                                        x->f.stream) != cudaSuccess;
        free(hq), free(hk), free(hv);
        if (cpg_rank_prepare(&x->f, bad, 0, r, name)) return 1;
    }
    int failed = cpg_run_threads(c->ranks, cg_run_rank, rk, sizeof *rk, name);
    for (int32_t r = 0; r < c->ranks; ++r) {
        cg_rank *x = &rk[r];
        if (x->f.status != SK_STATUS_SUCCESS) continue;
        const int64_t nq = B * x->f.tokens * HQ, nl = B * c->heads_q * x->f.tokens;
        void *ho = malloc((size_t)nq * 2);
        float *hl = malloc((size_t)nl * 4);
        const int bad =
            gt_download(ho, x->o, (size_t)nq * 2) || gt_download(hl, x->lse, (size_t)nl * 4);
        int64_t at = 0;
        for (int32_t ch = 0; !bad && ch < x->f.chunks; at += x->f.lengths[ch], ++ch) {
            cpc_rows(o, ho, 2, B, S, x->f.tokens, HQ, x->f.starts[ch], at, x->f.lengths[ch], 1);
            for (int64_t bh = 0; bh < B * c->heads_q; ++bh)
                memcpy(lse + bh * S + x->f.starts[ch], hl + bh * x->f.tokens + at,
                       (size_t)x->f.lengths[ch] * 4);
        }
        free(ho), free(hl);
        failed |= bad;
    }
    return failed;
}

/* reserve: desc->reserve_sms (-1: the default). */
static void cg_case_run(const cp_case *c, int reserve) {
    char name[256];
    cpg_name(name, sizeof name, c, "");
    /* sm90 takes blocks of 64 too (issue 28): its passes then run without
     * carry-in or parts (pairs of query blocks), merged outside the kernel. */
    const int64_t B = c->batch, S = c->seq, D = c->head_dim, nb = (S + c->block - 1) / c->block;
    const int64_t nq = B * S * c->heads_q * D, nk = B * S * c->heads_kv * D;
    sk_bsr L;
    sk_layout_t owned = cpg_layout(c, &L);
    REQUIRE(owned != NULL, "%s: layout: %s", name, sk_last_error());

    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    void *q = malloc((size_t)nq * 2), *k = malloc((size_t)nk * 2), *v = malloc((size_t)nk * 2);
    void *o_ref = malloc((size_t)nq * 2), *o = malloc((size_t)nq * 2), *o2 = malloc((size_t)nq * 2);
    const int64_t nl = B * c->heads_q * S;
    float *lse_ref = malloc((size_t)nl * 4), *lse = malloc((size_t)nl * 4),
          *lse2 = malloc((size_t)nl * 4);
    tu_fill_normal(&rng, q, c->dtype, nq, 1.0f);
    tu_fill_normal(&rng, k, c->dtype, nk, 1.0f);
    tu_fill_normal(&rng, v, c->dtype, nk, 1.0f);
    uint8_t *used = calloc((size_t)(B * c->heads_kv * nb), 1);
    double *vmax = calloc((size_t)(B * c->heads_kv * nb), sizeof(double));
    cg_usage(c, &L, v, nb, used, vmax);
    cpg_poison_unused(c, used, k, v); /* units nobody selects */

    cg_rank rk[8];
    memset(rk, 0, sizeof rk);
    sk_comm_t comms[8] = {0};
    void *plan = NULL;
    size_t plan_bytes = 0;
    sk_cp_desc d;
    cpg_desc(c, &d);
    int32_t starts[2 * 8 + 1];
    int ok = 1;
    d.chunk_starts = cpc_chunk_starts(c, &d, &L, starts, &ok);
    if (reserve >= 0) d.reserve_sms = reserve;
    ok = ok && cg_reference(c, &L, q, k, v, o_ref, lse_ref) == 0;
    ok = ok && cpg_plan(&d, &L, &plan, &plan_bytes, comms) == 0;
    CHECK(ok, "%s: setup: %s", name, sk_last_error());
    for (int32_t r = 0; ok && r < c->ranks; ++r) {
        cg_rank *x = &rk[r];
        ok = cpg_rank_init(&x->f, c, &d, r, plan, plan_bytes, comms[r], 0, name) == 0;
        for (int32_t ch = 0; ok && d.chunk_starts != NULL && ch < x->f.chunks; ++ch) {
            const int32_t id = ch == 0 ? r : 2 * c->ranks - 1 - r;
            CHECK(x->f.starts[ch] == (int64_t)starts[id] * c->block,
                  "%s: rank %d chunk %d starts at token %lld, chunk_starts[%d] = %d blocks", name,
                  (int)r, (int)ch, (long long)x->f.starts[ch], (int)id, (int)starts[id]);
        }
        const int64_t sq = B * x->f.tokens * c->heads_q * D * 2,
                      sk = B * x->f.tokens * c->heads_kv * D * 2;
        x->q = gt_device_alloc((size_t)sq);
        x->o = gt_device_alloc((size_t)sq);
        x->k = gt_device_alloc((size_t)sk);
        x->v = gt_device_alloc((size_t)sk);
        x->lse = gt_device_alloc((size_t)(B * c->heads_q * x->f.tokens) * 4);
    }
    ok = ok && cg_run_ranks(c, rk, q, k, v, o, lse, name) == 0 &&
         cg_run_ranks(c, rk, q, k, v, o2, lse2, name) == 0;
    if (ok) {
        CHECK(memcmp(o, o2, (size_t)nq * 2) == 0 && memcmp(lse, lse2, (size_t)nl * 4) == 0,
              "%s: two runs differ", name);
        const double u = tu_unit_roundoff(c->dtype);
        int64_t bad_o = 0, bad_l = 0, bitwise = 0;
        double worst = 0;
        const int64_t slices = (int64_t)L.grid.batch * L.grid.heads;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < c->heads_q; ++h) {
                int64_t s = 0;
                while (s < slices && !cpg_slice_covers(c, &L, s, b, h)) ++s;
                const int64_t hk = h / (c->heads_q / c->heads_kv);
                for (int64_t t = 0; t < S; ++t) {
                    const int64_t row = s * nb + t / c->block;
                    double vm = 0;
                    for (int32_t e = L.row_offsets[row]; e < L.row_offsets[row + 1]; ++e)
                        vm = fmax(vm, vmax[(b * c->heads_kv + hk) * nb + L.col_indices[e]]);
                    const int64_t li = (b * c->heads_q + h) * S + t;
                    const double lr = lse_ref[li], lg = lse[li];
                    if (!(lr == lg || fabs(lg - lr) <= 1e-4 * (1 + fabs(lr)))) {
                        if (bad_l++ < 3)
                            CHECK(0, "%s: lse[b%lld h%lld t%lld] = %.7g, single GPU %.7g", name,
                                  (long long)b, (long long)h, (long long)t, lg, lr);
                    }
                    int same = lr == lg || (isnan(lr) && isnan(lg));
                    for (int64_t x = 0; x < D; ++x) {
                        const int64_t oi = ((b * S + t) * c->heads_q + h) * D + x;
                        const double rv = tu_load(o_ref, c->dtype, oi),
                                     gv = tu_load(o, c->dtype, oi);
                        const double err = fabs(gv - rv);
                        same = same && rv == gv;
                        worst = fmax(worst, err / (u * (2 * fabs(rv) + 4 * vm) + 1e-5));
                        if (!(err <= u * (2 * fabs(rv) + 4 * vm) + 1e-5) && bad_o++ < 3)
                            CHECK(0, "%s: o[b%lld t%lld h%lld d%lld] = %.6g, single GPU %.6g", name,
                                  (long long)b, (long long)t, (long long)h, (long long)x, gv, rv);
                    }
                    bitwise += same;
                }
            }
        CHECK(bad_o == 0 && bad_l == 0, "%s: %lld O and %lld LSE elements out of tolerance", name,
              (long long)bad_o, (long long)bad_l);
        if (c->ranks == 1)
            CHECK(bitwise == B * c->heads_q * S, "%s: R = 1 differs from the single-GPU forward",
                  name);
        if (gt_opt.verbose)
            printf("    %s: worst error %.3f of tolerance, %lld of %lld rows bitwise\n", name,
                   worst, (long long)bitwise, (long long)(B * c->heads_q * S));
    }
    for (int32_t r = 0; r < c->ranks; ++r) {
        cg_rank *x = &rk[r];
        gt_device_free(x->q), gt_device_free(x->k), gt_device_free(x->v), gt_device_free(x->o);
        gt_device_free(x->lse);
        cpg_rank_free(&x->f);
        sk_comm_destroy(comms[r]);
    }
    free(plan), free(q), free(k), free(v), free(o_ref), free(o), free(o2);
    free(lse_ref), free(lse), free(lse2), free(used), free(vmax);
    sk_layout_destroy(owned);
}

SK_TEST(gpu_cp_matches_single_gpu) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xc9c9);
    static const int32_t rank_list[] = {1, 2, 3, 4};
    int cases = 0;
    for (int ri = 0; ri < 4; ++ri)
        for (int zig = 0; zig < 2; ++zig)
            for (int causal = 0; causal < 2; ++causal)
                for (int kind = 0; kind < CPC_KINDS; ++kind) {
                    if (gt_opt.quick && (kind != CPC_RANDOM || ri != 1)) continue;
                    cp_case c;
                    memset(&c, 0, sizeof c);
                    cpg_sweep_case(cases, rank_list[ri], zig, causal, kind, tu_rng_next(&rng), &c);
                    cg_case_run(&c, -1);
                    ++cases;
                }
}

/* The caller's chunk boundaries (desc->chunk_starts: sk_cp_balance's or
 * skewed ones, common/cp_case.c) at R = 2 .. 4, and the first local pass
 * with no SM reserve (desc->reserve_sms = 0) every other case, against the
 * single-GPU forward as above. */
SK_TEST(gpu_cp_given_chunk_starts_match_single_gpu) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xba1c);
    int cases = 0;
    for (int32_t R = 2; R <= 4; ++R)
        for (int zig = 0; zig < 2; ++zig)
            for (int causal = 0; causal < 2; ++causal)
                for (int kind = 0; kind < CPC_KINDS; ++kind) {
                    if (gt_opt.quick && (kind != CPC_SINKS_WINDOW || R != 2)) continue;
                    cp_case c;
                    memset(&c, 0, sizeof c);
                    cpg_sweep_case(cases, R, zig, causal, kind, tu_rng_next(&rng), &c);
                    c.starts = cases % 2 ? CPC_STARTS_SKEWED : CPC_STARTS_BALANCED;
                    cg_case_run(&c, cases % 4 < 2 ? 0 : -1);
                    ++cases;
                }
}
