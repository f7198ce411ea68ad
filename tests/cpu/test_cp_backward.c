/*
 * test_cp_backward.c - the context-parallel backward on the CPU: the
 * simulated R-rank sk_cp_backward (R = 1, 2, 3, 4, 8; contiguous and
 * zigzag; causal and not; window, sinks + window, random and top-k
 * layouts; GQA and MQA; layouts broadcast, per KV head and per query head)
 * against the single-process sk_attention_backward on the global tensors,
 * fed the single-process forward's O and LSE (sharded). Also: the bytes
 * each rank sends (the forward's K/V plus fp32 dK / dV back), a bitwise
 * repeat, and a case whose key gradients come only from other ranks (so
 * the test fails if the returned dK / dV were not reduced).
 *
 * Tolerance (why not bitwise): a rank's gradient element is the sum of at
 * most R + 2 fp32 shares (local passes, remote passes, the peers' returned
 * shares) of the terms the single-process backward sums in fp64, then ONE
 * rounding to the dtype, as the reference's. So |got - ref| <= 2 u |ref|
 * (one ulp of the dtype) + noise, noise = 2^-24 x 4 (R + 2) x amax with
 * amax the largest |ref| of that tensor (each share and each fp32 add
 * within 2^-24 of a value assumed below 4 amax), plus 2^-24 for fp16
 * subnormals. Outputs are NaN-poisoned first, so an element not written
 * fails.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/cp_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { L_TOPK = CPC_KINDS, L_KINDS };
enum { T_Q, T_K, T_V, T_O, T_DO, T_DQ, T_DK, T_DV, T_N }; /* a rank's tensors */

typedef struct bwd_job {
    const sk_cp_desc *desc;
    const void *plan;
    size_t plan_bytes;
    sk_comm_t comm;
    void *t[T_N];
    float *lse;
    void *ws;
    size_t ws_bytes;
    sk_status status;
    char error[512];
} bwd_job;

static void *run_rank(void *arg) {
    bwd_job *j = arg;
    j->status = sk_cp_backward_prepare(j->desc, j->plan, j->plan_bytes, j->ws, j->ws_bytes, NULL);
    if (j->status == SK_STATUS_SUCCESS)
        j->status = sk_cp_backward(j->desc, j->plan, j->plan_bytes, j->comm, j->t[T_Q], j->t[T_K],
                                   j->t[T_V], j->t[T_O], j->lse, j->t[T_DO], j->t[T_DQ], j->t[T_DK],
                                   j->t[T_DV], j->ws, j->ws_bytes, NULL);
    strncpy(j->error, sk_last_error(), sizeof j->error - 1);
    return NULL;
}

/* All ranks on threads; outputs NaN-poisoned first. */
static void run_ranks(bwd_job *jobs, int32_t R, sk_dtype dt, const int64_t *qn, const int64_t *kn) {
    pthread_t *th = calloc((size_t)R, sizeof *th);
    for (int32_t r = 0; r < R; ++r) {
        tu_fill_nan(jobs[r].t[T_DQ], dt, qn[r]);
        tu_fill_nan(jobs[r].t[T_DK], dt, kn[r]);
        tu_fill_nan(jobs[r].t[T_DV], dt, kn[r]);
        memset(jobs[r].error, 0, sizeof jobs[r].error);
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    for (int32_t r = 0; r < R; ++r) pthread_join(th[r], NULL);
    free(th);
}

static double amax_of(const void *x, sk_dtype dt, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; ++i) m = fmax(m, fabs(tu_load(x, dt, i)));
    return m;
}

/* remote_only: dO is zero on rank 0's rows, so rank 0's dK / dV are only
 * what the other ranks' rows return; the case then requires some of them
 * to be far above the tolerance. Returns the mismatches. */
static int64_t run_case(const cp_case *c, const char *name, int remote_only, int repeat) {
    const int64_t B = c->batch, S = c->seq, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const sk_dtype dt = c->dtype;
    const int64_t es = dt == SK_DTYPE_F32 ? 4 : 2;
    const sk_grid g = tu_grid(S, S, c->block, c->block, c->layout_batch, c->layout_heads);
    sk_layout_t owned = c->kind == L_TOPK ? cpc_layout_topk(c->causal, &g, c->seed)
                                          : cpc_layout(c->kind, c->causal, &g, c->seed);
    if (owned == NULL) {
        CHECK(0, "%s: layout: %s", name, sk_last_error());
        return 1;
    }
    sk_bsr L;
    sk_layout_view(owned, &L);

    /* Global tensors, the single-process forward and backward. */
    const int64_t nq = B * S * Hq * D, nk = B * S * Hkv * D;
    const int64_t gn[T_N] = {nq, nk, nk, nq, nq, nq, nk, nk};
    void *G[T_N];
    for (int i = 0; i < T_N; ++i) G[i] = malloc((size_t)(gn[i] * es));
    float *lse = malloc((size_t)(B * Hq * S) * sizeof(float));
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    tu_fill_normal(&rng, G[T_Q], dt, nq, 1.0f);
    tu_fill_normal(&rng, G[T_K], dt, nk, 1.0f);
    tu_fill_normal(&rng, G[T_V], dt, nk, 1.0f);
    tu_fill_normal(&rng, G[T_DO], dt, nq, 1.0f);
    sk_cp_desc d;
    sk_cp_desc_init(&d, sizeof d);
    d.ranks = c->ranks;
    d.sharding = c->sharding;
    d.backend = SK_BACKEND_CPU;
    d.dtype = dt;
    d.batch = B;
    d.seq = S;
    d.heads_q = Hq;
    d.heads_kv = Hkv;
    d.head_dim = D;
    d.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    int32_t starts[2 * 8 + 1];
    int starts_ok = 1;
    d.chunk_starts = cpc_chunk_starts(c, &d, &L, starts, &starts_ok);
    CHECK(starts_ok, "%s: chunk starts: %s", name, sk_last_error());
    int64_t s0[2], len[2];
    int32_t nch;
    if (remote_only) {
        int64_t S0;
        sk_cp_shard(&d, 0, c->block, &S0, &nch, s0, len);
        for (int32_t ch = 0; ch < nch; ++ch)
            for (int64_t b = 0; b < B; ++b)
                memset((char *)G[T_DO] + (b * S + s0[ch]) * Hq * D * es, 0,
                       (size_t)(len[ch] * Hq * D * es));
    }
    sk_attention_desc a;
    sk_attention_desc_init(&a, sizeof a);
    a.backend = SK_BACKEND_CPU;
    a.dtype = dt;
    a.batch = B;
    a.seq_q = a.seq_k = S;
    a.heads_q = Hq;
    a.heads_kv = Hkv;
    a.head_dim = D;
    a.mask = d.mask;
    sk_attention_backward_desc bw;
    sk_attention_backward_desc_init(&bw, sizeof bw);
    sk_status st = sk_attention_forward(&a, &L, G[T_Q], G[T_K], G[T_V], G[T_O], lse, NULL, 0, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s: reference forward: %s", name, sk_last_error());
    st = sk_attention_backward(&a, &bw, &L, G[T_Q], G[T_K], G[T_V], G[T_O], G[T_DO], lse, G[T_DQ],
                               G[T_DK], G[T_DV], NULL, 0, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s: reference backward: %s", name, sk_last_error());

    /* The plan and the shards. */
    size_t plan_bytes = 0;
    sk_cp_plan_size(&d, &L, &plan_bytes);
    void *plan = malloc(plan_bytes);
    st = sk_cp_plan(&d, &L, plan, plan_bytes);
    CHECK(st == SK_STATUS_SUCCESS, "%s: plan: %s", name, sk_last_error());
    const int32_t R = c->ranks;
    sk_comm_t *comms = calloc((size_t)R, sizeof *comms);
    sk_cp_desc *descs = calloc((size_t)R, sizeof *descs);
    bwd_job *jobs = calloc((size_t)R, sizeof *jobs);
    int64_t *qn = calloc((size_t)R, sizeof *qn), *kn = calloc((size_t)R, sizeof *kn);
    st = sk_comm_create_simulated(R, comms);
    for (int32_t r = 0; r < R; ++r) {
        descs[r] = d;
        descs[r].rank = r;
        int64_t Sr, l0 = 0;
        sk_cp_shard(&d, r, c->block, &Sr, &nch, s0, len);
        for (int32_t ch = 0; ch < nch && d.chunk_starts != NULL; ++ch) {
            const int32_t id = ch == 0 ? r : 2 * R - 1 - r;
            CHECK(s0[ch] == (int64_t)starts[id] * c->block,
                  "%s: rank %d chunk %d starts at token %lld, chunk_starts[%d] = %d blocks", name,
                  (int)r, (int)ch, (long long)s0[ch], (int)id, (int)starts[id]);
        }
        bwd_job *j = &jobs[r];
        j->desc = &descs[r];
        j->plan = plan;
        j->plan_bytes = plan_bytes;
        j->comm = comms[r];
        qn[r] = B * Sr * Hq * D;
        kn[r] = B * Sr * Hkv * D;
        for (int i = 0; i < T_N; ++i) {
            const int kv = i == T_K || i == T_V || i == T_DK || i == T_DV;
            j->t[i] = malloc((size_t)((kv ? kn[r] : qn[r]) * es));
        }
        j->lse = malloc((size_t)(B * Hq * Sr) * sizeof(float));
        for (int32_t ch = 0; ch < nch; ++ch) {
            for (int i = T_Q; i <= T_DO; ++i) {
                const int64_t row = (i == T_K || i == T_V ? Hkv : Hq) * D;
                cpc_rows(j->t[i], G[i], es, B, S, Sr, row, s0[ch], l0, len[ch], 0);
            }
            for (int64_t bh = 0; bh < B * Hq; ++bh) /* the GLOBAL LSE's rows */
                memcpy(j->lse + bh * Sr + l0, lse + bh * S + s0[ch],
                       (size_t)len[ch] * sizeof(float));
            l0 += len[ch];
        }
        CHECK(sk_cp_backward_workspace_size(&descs[r], plan, plan_bytes, &j->ws_bytes) ==
                  SK_STATUS_SUCCESS,
              "%s: workspace size: %s", name, sk_last_error());
        if (posix_memalign(&j->ws, 64, j->ws_bytes > 0 ? j->ws_bytes : 64) != 0) j->ws = NULL;
    }
    if (st == SK_STATUS_SUCCESS && sk_test_failures() == 0) run_ranks(jobs, R, dt, qn, kn);

    /* Every rank's rows against the reference; the bytes sent. */
    const double u = tu_unit_roundoff(dt), e32 = 0x1p-24, sub = dt == SK_DTYPE_F16 ? e32 : 0;
    double amax[T_N] = {0};
    for (int i = T_DQ; i <= T_DV; ++i) amax[i] = amax_of(G[i], dt, gn[i]);
    int64_t bad = 0;
    double far = 0; /* remote_only: rank 0's largest |dK|, |dV| over its tolerance */
    for (int32_t r = 0; r < R && st == SK_STATUS_SUCCESS; ++r) {
        bwd_job *j = &jobs[r];
        CHECK(j->status == SK_STATUS_SUCCESS, "%s: rank %d: %s", name, (int)r, j->error);
        if (j->status != SK_STATUS_SUCCESS) {
            ++bad;
            continue;
        }
        int64_t Sr, l0 = 0;
        sk_cp_shard(&d, r, c->block, &Sr, &nch, s0, len);
        for (int32_t ch = 0; ch < nch; ++ch) {
            for (int i = T_DQ; i <= T_DV; ++i) {
                const int64_t H = i == T_DQ ? Hq : Hkv;
                const double noise = e32 * 4 * (R + 2) * amax[i] + sub;
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t t = 0; t < len[ch] * H * D; ++t) {
                        const int64_t gi = (b * S + s0[ch]) * H * D + t;
                        const int64_t li = (b * Sr + l0) * H * D + t;
                        const double ref = tu_load(G[i], dt, gi), got = tu_load(j->t[i], dt, li);
                        const double tol = 2 * u * fabs(ref) + noise;
                        if (remote_only && r == 0 && i != T_DQ) far = fmax(far, fabs(ref) / tol);
                        if (!(fabs(got - ref) <= tol) && bad++ < 3)
                            CHECK(0,
                                  "%s: rank %d %s b %lld token %lld elem %lld: %.9g, ref %.9g "
                                  "(tol %.3g)",
                                  name, (int)r,
                                  i == T_DQ   ? "dQ"
                                  : i == T_DK ? "dK"
                                              : "dV",
                                  (long long)b, (long long)(s0[ch] + t / (H * D)),
                                  (long long)(t % (H * D)), got, ref, tol);
                    }
            }
            l0 += len[ch];
        }
        /* Sent: the forward's K/V to every peer, and back to each peer the
         * fp32 dK / dV of the units received from it. */
        int64_t planned = 0, sent = -1;
        for (int32_t p = 0; p < R; ++p) {
            int64_t in = 0, out = 0;
            sk_cp_plan_bytes(plan, plan_bytes, p, r, &in, NULL);
            sk_cp_plan_bytes(plan, plan_bytes, r, p, &out, NULL);
            planned += out + in / es * 4;
        }
        sk_comm_info(comms[r], NULL, NULL, &sent);
        CHECK(sent == planned, "%s: rank %d sent %lld bytes, want %lld", name, (int)r,
              (long long)sent, (long long)planned);
    }
    if (remote_only)
        CHECK(far > 100, "%s: rank 0's returned gradients are too small to test (%.3g x tol)", name,
              far);

    /* A second run: bitwise the same. */
    if (repeat && bad == 0 && sk_test_failures() == 0) {
        void **first = calloc((size_t)R * 3, sizeof *first);
        for (int32_t r = 0; r < R; ++r)
            for (int i = 0; i < 3; ++i) {
                const int64_t n = (i == 0 ? qn[r] : kn[r]) * es;
                first[r * 3 + i] = malloc((size_t)n);
                memcpy(first[r * 3 + i], jobs[r].t[T_DQ + i], (size_t)n);
            }
        run_ranks(jobs, R, dt, qn, kn);
        for (int32_t r = 0; r < R; ++r)
            for (int i = 0; i < 3; ++i) {
                const int64_t n = (i == 0 ? qn[r] : kn[r]) * es;
                CHECK(jobs[r].status == SK_STATUS_SUCCESS &&
                          memcmp(first[r * 3 + i], jobs[r].t[T_DQ + i], (size_t)n) == 0,
                      "%s: rank %d: the repeat differs in %s (%s)", name, (int)r,
                      i == 0   ? "dQ"
                      : i == 1 ? "dK"
                               : "dV",
                      jobs[r].error);
                free(first[r * 3 + i]);
            }
        free(first);
    }

    for (int32_t r = 0; r < R; ++r) {
        for (int i = 0; i < T_N; ++i) free(jobs[r].t[i]);
        free(jobs[r].lse);
        free(jobs[r].ws);
        sk_comm_destroy(comms[r]);
    }
    for (int i = 0; i < T_N; ++i) free(G[i]);
    free(comms);
    free(descs);
    free(jobs);
    free(qn);
    free(kn);
    free(plan);
    free(lse);
    sk_layout_destroy(owned);
    return bad;
}

static const char *kind_name(int kind) {
    return kind == L_TOPK ? "topk" : cpc_kind_names[kind];
}

/* The forward's sweep (cp_case.c), varied where the backward differs:
 * batch 1 or 2, MQA or GQA, D 8 or 16, slices per KV head. */
static void sweep_case(int idx, cp_case *c) {
    c->batch = idx % 5 == 2 ? 1 : 2;
    c->heads_kv = idx % 4 == 1 ? 1 : 2; /* MQA sometimes, else GQA */
    c->head_dim = idx % 2 ? 16 : 8;
    c->layout_batch = idx % 2 ? (int32_t)c->batch : 1;
    if (c->layout_heads == 2) c->layout_heads = (int32_t)c->heads_kv;
    char name[200];
    cpc_case_name(name, sizeof name, c, kind_name(c->kind), "");
    run_case(c, name, 0, idx % 4 == 0);
}

SK_TEST(cp_backward_matches_single_process) {
    cpc_sweep(tu_base_seed(), L_KINDS, sweep_case);
}

/* With the caller's chunk boundaries (sk_cp_balance's or skewed ones). */
SK_TEST(cp_backward_given_chunk_starts_match_single_process) {
    cpc_sweep_starts(tu_base_seed() ^ 0xba1, L_KINDS, sweep_case);
}

/* dO zero on rank 0's rows: its dK / dV come only from the other ranks'
 * rows through the reduction; without it they would be 0 where the
 * reference is far from 0 (the case checks that it is). */
SK_TEST(cp_backward_reduces_remote_key_gradients) {
    const uint64_t base = tu_base_seed() ^ 0xb4c;
    for (int i = 0; i < 4; ++i) {
        cp_case c;
        memset(&c, 0, sizeof c);
        c.ranks = i < 2 ? 2 : 4;
        c.sharding = i % 2 ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS;
        c.causal = i % 2;
        c.kind = i < 2 ? CPC_SINKS_WINDOW : L_TOPK;
        c.dtype = i == 3 ? SK_DTYPE_F16 : SK_DTYPE_BF16;
        c.batch = 2;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.head_dim = 16;
        c.block = 64;
        c.seq = (2 * c.ranks + 2) * 64 - 7;
        c.layout_batch = 1;
        c.layout_heads = 2;
        c.seed = base + (uint64_t)i;
        char name[200];
        cpc_case_name(name, sizeof name, &c, kind_name(c.kind), " (dO zero on rank 0)");
        CHECK(run_case(&c, name, 1, 0) == 0, "%s", name);
        if (sk_test_failures() > 0) return;
    }
}
