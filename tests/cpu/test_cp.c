/*
 * test_cp.c - context parallel on the CPU: the simulated R-rank run
 * (R = 1, 2, 3, 4, 8; contiguous and zigzag; causal and not; window, sinks
 * + window, random and top-k layouts; layouts broadcast, per KV head and
 * per query head) against the single-process sk_attention_forward on the
 * global tensors, the bytes exchanged against the bytes of the remote
 * blocks the layout needs (counted here from the layout), and the
 * sharding against its formula.
 *
 * Tolerance (why not bitwise): a rank computes its rows as two partial
 * attentions (own keys, received keys) in fp32 and merges them by LSE, so
 * its O is ONE rounding to the dtype of a value within fp32 noise of what
 * the single-process forward rounds once: |got - ref| <= 2 u |ref| (one
 * ulp of the dtype) + noise, noise = 2^-24 (4 |ref| + 8 vmax (2 + |LSE|))
 * for the fp32 partial outputs (each within 2^-24 vmax) and the fp32
 * partial LSEs (an error e in an LSE scales its weight by exp(e)), plus
 * 2^-24 for fp16 subnormals. LSE within 2^-24 (4 |LSE| + 4). -inf LSE and
 * O = 0 of empty rows must match exactly. Outputs are NaN-poisoned first.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/cp_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

/* The shared kinds (common/cp_case.h), then top-k. */
enum { L_TOPK = CPC_KINDS, L_KINDS };

typedef struct rank_job {
    const sk_cp_desc *desc;
    const void *plan;
    size_t plan_bytes;
    sk_comm_t comm;
    const void *q, *k, *v;
    void *o;
    float *lse;
    void *ws;
    size_t ws_bytes;
    sk_status status;
    char error[512];
} rank_job;

static void *run_rank(void *arg) {
    rank_job *j = arg;
    j->status = sk_cp_forward(j->desc, j->plan, j->plan_bytes, j->comm, j->q, j->k, j->v, j->o,
                              j->lse, j->ws, j->ws_bytes, NULL);
    strncpy(j->error, sk_last_error(), sizeof j->error - 1);
    return NULL;
}

static sk_layout_t make_layout(const cp_case *c, const sk_grid *g) {
    return c->kind == L_TOPK ? cpc_layout_topk(c->causal, g, c->seed)
                             : cpc_layout(c->kind, c->causal, g, c->seed);
}

/* The owner rank of every global block, from the shards the API reports. */
static void block_owners(const sk_cp_desc *d, int32_t block, int64_t nb, int32_t *owner) {
    for (int64_t j = 0; j < nb; ++j) owner[j] = -1;
    for (int32_t r = 0; r < d->ranks; ++r) {
        int64_t tok, s[2], l[2];
        int32_t n;
        sk_cp_shard(d, r, block, &tok, &n, s, l);
        for (int32_t c = 0; c < n; ++c)
            for (int64_t t = s[c]; t < s[c] + l[c]; t += block) owner[t / block] = r;
    }
}

/* Bytes of the remote (b, KV head, block) units rank r's rows need, counted
 * from the layout here (every batch / KV head a slice covers). */
static int64_t needed_bytes(const cp_case *c, const sk_bsr *L, const int32_t *owner, int64_t nb,
                            int32_t r) {
    const int64_t bh = c->batch * c->heads_kv;
    uint8_t *need = calloc((size_t)(nb * bh), 1);
    const int64_t slices = (int64_t)L->grid.batch * L->grid.heads;
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < nb; ++i) {
            if (owner[i] != r) continue;
            const int64_t row = s * nb + i;
            for (int32_t e = L->row_offsets[row]; e < L->row_offsets[row + 1]; ++e) {
                const int64_t j = L->col_indices[e];
                if (owner[j] == r || (c->causal && j > i)) continue;
                for (int64_t b = 0; b < c->batch; ++b) {
                    if (L->grid.batch != 1 && b != s / L->grid.heads) continue;
                    for (int64_t h = 0; h < c->heads_q; ++h) { /* query heads of the slice */
                        if (cpc_slice_head(L, c->heads_q, c->heads_kv, h) != s % L->grid.heads)
                            continue;
                        need[j * bh + b * c->heads_kv + h / (c->heads_q / c->heads_kv)] = 1;
                    }
                }
            }
        }
    int64_t bytes = 0;
    const int64_t esize = c->dtype == SK_DTYPE_F32 ? 4 : 2;
    for (int64_t j = 0; j < nb; ++j) {
        const int64_t tok = c->seq - j * c->block < c->block ? c->seq - j * c->block : c->block;
        for (int64_t u = 0; u < bh; ++u)
            if (need[j * bh + u]) bytes += 2 * tok * c->head_dim * esize;
    }
    free(need);
    return bytes;
}

static void run_case(const cp_case *c, const char *name) {
    const int64_t B = c->batch, S = c->seq, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const int64_t esize = c->dtype == SK_DTYPE_F32 ? 4 : 2;
    const sk_grid g = tu_grid(S, S, c->block, c->block, c->layout_batch, c->layout_heads);
    sk_layout_t owned = make_layout(c, &g);
    REQUIRE(owned != NULL, "%s: layout: %s", name, sk_last_error());
    sk_bsr L;
    sk_layout_view(owned, &L);

    /* Global tensors and the single-process reference. */
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    const int64_t nq = B * S * Hq * D, nk = B * S * Hkv * D;
    void *q = malloc((size_t)(nq * esize)), *k = malloc((size_t)(nk * esize));
    void *v = malloc((size_t)(nk * esize)), *o_ref = malloc((size_t)(nq * esize));
    float *lse_ref = malloc((size_t)(B * Hq * S) * sizeof(float));
    tu_fill_normal(&rng, q, c->dtype, nq, 1.0f);
    tu_fill_normal(&rng, k, c->dtype, nk, 1.0f);
    tu_fill_normal(&rng, v, c->dtype, nk, 1.0f);
    double vmax = 0;
    for (int64_t i = 0; i < nk; ++i) vmax = fmax(vmax, fabs(tu_load(v, c->dtype, i)));
    sk_attention_desc a;
    sk_attention_desc_init(&a, sizeof a);
    a.backend = SK_BACKEND_CPU;
    a.dtype = c->dtype;
    a.batch = B;
    a.seq_q = a.seq_k = S;
    a.heads_q = Hq;
    a.heads_kv = Hkv;
    a.head_dim = D;
    a.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    sk_status st = sk_attention_forward(&a, &L, q, k, v, o_ref, lse_ref, NULL, 0, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s: reference: %s", name, sk_last_error());

    /* The plan. */
    sk_cp_desc d;
    sk_cp_desc_init(&d, sizeof d);
    d.ranks = c->ranks;
    d.sharding = c->sharding;
    d.backend = SK_BACKEND_CPU;
    d.dtype = c->dtype;
    d.batch = B;
    d.seq = S;
    d.heads_q = Hq;
    d.heads_kv = Hkv;
    d.head_dim = D;
    d.mask = a.mask;
    int32_t starts[2 * 8 + 1];
    int starts_ok = 1;
    d.chunk_starts = cpc_chunk_starts(c, &d, &L, starts, &starts_ok);
    CHECK(starts_ok, "%s: chunk starts: %s", name, sk_last_error());
    size_t plan_bytes = 0;
    st = sk_cp_plan_size(&d, &L, &plan_bytes);
    CHECK(st == SK_STATUS_SUCCESS, "%s: plan size: %s", name, sk_last_error());
    void *plan = malloc(plan_bytes);
    st = sk_cp_plan(&d, &L, plan, plan_bytes);
    CHECK(st == SK_STATUS_SUCCESS, "%s: plan: %s", name, sk_last_error());

    /* Shards, one thread per rank. */
    const int32_t R = c->ranks;
    sk_comm_t *comms = calloc((size_t)R, sizeof *comms);
    sk_cp_desc *descs = calloc((size_t)R, sizeof *descs);
    rank_job *jobs = calloc((size_t)R, sizeof *jobs);
    pthread_t *threads = calloc((size_t)R, sizeof *threads);
    int64_t *tokens = calloc((size_t)R, sizeof *tokens);
    st = sk_comm_create_simulated(R, comms);
    CHECK(st == SK_STATUS_SUCCESS, "%s: comm: %s", name, sk_last_error());
    for (int32_t r = 0; r < R && st == SK_STATUS_SUCCESS; ++r) {
        descs[r] = d;
        descs[r].rank = r;
        int64_t s0[2], len[2], l0 = 0;
        int32_t nch;
        sk_cp_shard(&descs[r], r, c->block, &tokens[r], &nch, s0, len);
        for (int32_t ch = 0; ch < nch && d.chunk_starts != NULL; ++ch) {
            const int32_t id = ch == 0 ? r : 2 * R - 1 - r;
            CHECK(s0[ch] == (int64_t)starts[id] * c->block,
                  "%s: rank %d chunk %d starts at token %lld, chunk_starts[%d] = %d blocks", name,
                  (int)r, (int)ch, (long long)s0[ch], (int)id, (int)starts[id]);
        }
        const int64_t Sr = tokens[r];
        rank_job *j = &jobs[r];
        j->desc = &descs[r];
        j->plan = plan;
        j->plan_bytes = plan_bytes;
        j->comm = comms[r];
        j->q = malloc((size_t)(B * Sr * Hq * D * esize));
        j->k = malloc((size_t)(B * Sr * Hkv * D * esize));
        j->v = malloc((size_t)(B * Sr * Hkv * D * esize));
        j->o = malloc((size_t)(B * Sr * Hq * D * esize));
        j->lse = malloc((size_t)(B * Hq * Sr) * sizeof(float));
        tu_fill_nan(j->o, c->dtype, B * Sr * Hq * D);
        tu_fill_nan(j->lse, SK_DTYPE_F32, B * Hq * Sr);
        for (int32_t ch = 0; ch < nch; ++ch) {
            cpc_rows((void *)(intptr_t)j->q, q, esize, B, S, Sr, Hq * D, s0[ch], l0, len[ch], 0);
            cpc_rows((void *)(intptr_t)j->k, k, esize, B, S, Sr, Hkv * D, s0[ch], l0, len[ch], 0);
            cpc_rows((void *)(intptr_t)j->v, v, esize, B, S, Sr, Hkv * D, s0[ch], l0, len[ch], 0);
            l0 += len[ch];
        }
        CHECK(sk_cp_workspace_size(&descs[r], plan, plan_bytes, &j->ws_bytes) == SK_STATUS_SUCCESS,
              "%s: workspace size: %s", name, sk_last_error());
        if (posix_memalign(&j->ws, 64, j->ws_bytes > 0 ? j->ws_bytes : 64) != 0) j->ws = NULL;
    }
    if (st == SK_STATUS_SUCCESS) {
        for (int32_t r = 0; r < R; ++r) pthread_create(&threads[r], NULL, run_rank, &jobs[r]);
        for (int32_t r = 0; r < R; ++r) pthread_join(threads[r], NULL);
    }

    /* Every rank's rows against the reference; the bytes. */
    const double u = tu_unit_roundoff(c->dtype), e32 = 0x1p-24;
    int64_t nb = (S + c->block - 1) / c->block, bad = 0;
    int32_t *owner = malloc((size_t)nb * sizeof(int32_t));
    block_owners(&d, c->block, nb, owner);
    for (int32_t r = 0; r < R && st == SK_STATUS_SUCCESS; ++r) {
        rank_job *j = &jobs[r];
        CHECK(j->status == SK_STATUS_SUCCESS, "%s: rank %d: %s", name, (int)r, j->error);
        int64_t s0[2], len[2], l0 = 0, Sr = tokens[r];
        int32_t nch;
        sk_cp_shard(&d, r, c->block, &Sr, &nch, s0, len);
        for (int32_t ch = 0; ch < nch; ++ch) {
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < len[ch]; ++t)
                    for (int64_t h = 0; h < Hq; ++h) {
                        const int64_t gt = s0[ch] + t, lt = l0 + t;
                        const double lr = lse_ref[(b * Hq + h) * S + gt];
                        const double lg = j->lse[(b * Hq + h) * Sr + lt];
                        const int lse_ok =
                            isinf(lr) ? lg == lr : fabs(lg - lr) <= e32 * (4 * fabs(lr) + 4);
                        if (!lse_ok && bad++ < 3)
                            CHECK(0, "%s: rank %d b %lld token %lld head %lld: LSE %.9g, ref %.9g",
                                  name, (int)r, (long long)b, (long long)gt, (long long)h, lg, lr);
                        const double lmag = isinf(lr) ? 0 : fabs(lr);
                        for (int64_t e = 0; e < D; ++e) {
                            const double ref =
                                tu_load(o_ref, c->dtype, ((b * S + gt) * Hq + h) * D + e);
                            const double got =
                                tu_load(j->o, c->dtype, ((b * Sr + lt) * Hq + h) * D + e);
                            const double tol = 2 * u * fabs(ref) +
                                               e32 * (4 * fabs(ref) + 8 * vmax * (2 + lmag)) + e32;
                            if (!(fabs(got - ref) <= tol) && bad++ < 3)
                                CHECK(0,
                                      "%s: rank %d b %lld token %lld head %lld d %lld: O %.9g, ref "
                                      "%.9g (tol %.3g)",
                                      name, (int)r, (long long)b, (long long)gt, (long long)h,
                                      (long long)e, got, ref, tol);
                        }
                    }
            l0 += len[ch];
        }
        /* Bytes: received = needed (counted from the layout), sent = planned. */
        int64_t recv = 0, planned_send = 0, sent = -1;
        for (int32_t p = 0; p < R; ++p) {
            int64_t in = -1, out = -1;
            sk_cp_plan_bytes(plan, plan_bytes, p, r, &in, NULL);
            sk_cp_plan_bytes(plan, plan_bytes, r, p, &out, NULL);
            recv += in;
            planned_send += out;
        }
        const int64_t need = needed_bytes(c, &L, owner, nb, r);
        CHECK(recv == need, "%s: rank %d receives %lld bytes, its rows need %lld", name, (int)r,
              (long long)recv, (long long)need);
        sk_comm_info(comms[r], NULL, NULL, &sent);
        CHECK(sent == planned_send, "%s: rank %d sent %lld bytes, the plan says %lld", name, (int)r,
              (long long)sent, (long long)planned_send);
    }
    CHECK(bad == 0, "%s: %lld mismatches", name, (long long)bad);

    for (int32_t r = 0; r < R; ++r) {
        free((void *)(intptr_t)jobs[r].q);
        free((void *)(intptr_t)jobs[r].k);
        free((void *)(intptr_t)jobs[r].v);
        free(jobs[r].o);
        free(jobs[r].lse);
        free(jobs[r].ws);
        sk_comm_destroy(comms[r]);
    }
    free(owner);
    free(comms);
    free(descs);
    free(jobs);
    free(threads);
    free(tokens);
    free(plan);
    free(q);
    free(k);
    free(v);
    free(o_ref);
    free(lse_ref);
    sk_layout_destroy(owned);
}

static void sweep_case(int idx, cp_case *c) {
    char name[200];
    (void)idx;
    cpc_case_name(name, sizeof name, c, c->kind == L_TOPK ? "topk" : cpc_kind_names[c->kind], "");
    run_case(c, name);
}

SK_TEST(cp_forward_matches_single_process) {
    cpc_sweep(tu_base_seed(), L_KINDS, sweep_case);
}

/* The same run with the caller's chunk boundaries (desc->chunk_starts):
 * sk_cp_balance's or skewed ones, R = 2, 3, 4, both shardings; the shards
 * must start where the boundaries say. */
SK_TEST(cp_forward_given_chunk_starts_match_single_process) {
    cpc_sweep_starts(tu_base_seed() ^ 0xba1, L_KINDS, sweep_case);
}

/* The shards against the formula: chunk c is blocks floor(c nb / C) ..
 * floor((c + 1) nb / C) - 1; contiguous: rank r holds chunk r; zigzag:
 * chunks r and 2R - 1 - r; together they cover [0, S) once. */
SK_TEST(cp_shard_formula) {
    static const int64_t seqs[] = {64 * 16, 64 * 16 + 5, 64 * 37 + 63, 128 * 9 + 1};
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; ++si)
        for (int32_t R = 1; R <= 8; ++R)
            for (int sh = 0; sh < 2; ++sh) {
                const int32_t block = si == 3 ? 128 : 64;
                sk_cp_desc d;
                sk_cp_desc_init(&d, sizeof d);
                d.ranks = R;
                d.sharding = sh ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS;
                d.backend = SK_BACKEND_CPU;
                d.batch = d.heads_q = d.heads_kv = 1;
                d.head_dim = 16;
                d.seq = seqs[si];
                const int64_t nb = (d.seq + block - 1) / block, C = sh ? 2 * R : R;
                if (nb < C) continue;
                int64_t covered = 0;
                for (int32_t r = 0; r < R; ++r) {
                    int64_t tok = -1, s[2], l[2];
                    int32_t n = -1;
                    sk_status st = sk_cp_shard(&d, r, block, &tok, &n, s, l);
                    REQUIRE(st == SK_STATUS_SUCCESS, "shard: %s", sk_last_error());
                    CHECK(n == (sh ? 2 : 1), "R %d rank %d: %d chunks", (int)R, (int)r, (int)n);
                    const int64_t chunk[2] = {r, 2 * R - 1 - r};
                    int64_t sum = 0;
                    for (int32_t c = 0; c < n; ++c) {
                        const int64_t b0 = chunk[c] * nb / C, b1 = (chunk[c] + 1) * nb / C;
                        const int64_t t1 = b1 * block < d.seq ? b1 * block : d.seq;
                        CHECK(s[c] == b0 * block && l[c] == t1 - b0 * block,
                              "S %lld R %d rank %d chunk %d: [%lld, +%lld), want [%lld, +%lld)",
                              (long long)d.seq, (int)R, (int)r, (int)c, (long long)s[c],
                              (long long)l[c], (long long)(b0 * block),
                              (long long)(t1 - b0 * block));
                        sum += l[c];
                    }
                    CHECK(tok == sum, "tokens %lld, chunks sum to %lld", (long long)tok,
                          (long long)sum);
                    covered += tok;
                }
                CHECK(covered == d.seq, "S %lld R %d: shards cover %lld tokens", (long long)d.seq,
                      (int)R, (long long)covered);
            }
}
