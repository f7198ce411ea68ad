/*
 * cp_case.c - the context-parallel tests' shared pieces (cp_case.h).
 */
#include "common/cp_case.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"

const char *const cpc_kind_names[CPC_KINDS] = {"window", "sinks+window", "random"};

sk_layout_t cpc_layout(int kind, int causal, const sk_grid *g, uint64_t seed) {
    sk_layout_t L = NULL;
    sk_status st = SK_STATUS_INTERNAL_ERROR;
    switch (kind) {
    case CPC_WINDOW:
        st = causal ? sk_layout_create_window(&L, g, 150, 0)
                    : sk_layout_create_window(&L, g, 100, 130);
        break;
    case CPC_SINKS_WINDOW:
        st = sk_layout_create_sinks_window(&L, g, 40, 200);
        break;
    case CPC_RANDOM:
        st = sk_layout_create_random(&L, g, 3, seed, 0);
        break;
    default:
        break;
    }
    return st == SK_STATUS_SUCCESS ? L : NULL;
}

sk_layout_t cpc_layout_topk(int causal, const sk_grid *g, uint64_t seed) {
    int32_t rb, cb, sl;
    sk_grid_blocks(g, &rb, &cb, &sl);
    const int64_t n = (int64_t)sl * rb * cb;
    float *scores = malloc((size_t)n * sizeof(float));
    if (scores == NULL) return NULL;
    tu_rng rng;
    tu_rng_seed(&rng, seed ^ 0x5c0e5);
    for (int64_t i = 0; i < n; ++i) scores[i] = (float)tu_rng_normal(&rng);
    sk_topk_options opt = {2, 1, 1, causal};
    sk_layout_t L = NULL;
    const sk_status st = sk_layout_create_topk(&L, g, scores, &opt);
    free(scores);
    return st == SK_STATUS_SUCCESS ? L : NULL;
}

void cpc_sweep_case(int idx, int32_t ranks, int zigzag, int causal, int kind, uint64_t seed,
                    cp_case *c) {
    static const sk_dtype dtypes[] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};
    memset(c, 0, sizeof *c);
    c->ranks = ranks;
    c->sharding = zigzag ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS;
    c->causal = causal;
    c->kind = kind;
    c->dtype = dtypes[idx % 3];
    c->batch = 2;
    c->heads_q = 4;
    c->heads_kv = 2;
    c->head_dim = 16;
    c->block = idx % 7 == 3 ? 128 : 64;
    /* At least one block per chunk, a tail most of the time. */
    const int64_t nb = 2 * ranks + 2 + idx % 3;
    c->seq = (nb - 1) * c->block + 1 + (idx * 37) % c->block;
    c->layout_batch = idx % 2 ? 2 : 1;
    c->layout_heads = (idx / 2) % 3 == 0 ? 1 : (idx / 2) % 3 == 1 ? 2 : 4;
    c->seed = seed;
}

void cpc_sweep(uint64_t base, int kinds, void (*run)(int idx, cp_case *c)) {
    static const int32_t ranks[] = {1, 2, 3, 4, 8};
    int idx = 0;
    for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0]; ++ri)
        for (int sh = 0; sh < 2; ++sh)
            for (int causal = 0; causal < 2; ++causal)
                for (int kind = 0; kind < kinds; ++kind, ++idx) {
                    cp_case c;
                    cpc_sweep_case(idx, ranks[ri], sh, causal, kind, base + (uint64_t)idx, &c);
                    run(idx, &c);
                    if (sk_test_failures() > 0) return;
                }
}

void cpc_case_name(char *name, size_t n, const cp_case *c, const char *kind_name,
                   const char *extra) {
    static const char *const starts[3] = {"", " balanced", " skewed"};
    snprintf(name, n, "R=%d %s%s %s %s %s S=%lld block %d H %lld/%lld slices %dx%d seed %llu%s",
             (int)c->ranks, c->sharding == SK_CP_SHARDING_ZIGZAG ? "zigzag" : "contiguous",
             starts[c->starts >= 0 && c->starts < 3 ? c->starts : 0],
             c->causal ? "causal" : "non-causal", kind_name,
             c->dtype == SK_DTYPE_F16    ? "f16"
             : c->dtype == SK_DTYPE_BF16 ? "bf16"
                                         : "f32",
             (long long)c->seq, (int)c->block, (long long)c->heads_q, (long long)c->heads_kv,
             (int)c->layout_batch, (int)c->layout_heads, (unsigned long long)c->seed, extra);
}

void cpc_rows(void *dst, const void *src, int64_t esize, int64_t B, int64_t S, int64_t Sr,
              int64_t row_elems, int64_t t0, int64_t l0, int64_t n, int to_global) {
    const size_t bytes = (size_t)(n * row_elems * esize);
    for (int64_t b = 0; b < B; ++b) {
        const size_t g = (size_t)((b * S + t0) * row_elems * esize);
        const size_t l = (size_t)((b * Sr + l0) * row_elems * esize);
        if (to_global)
            memcpy((char *)dst + g, (const char *)src + l, bytes);
        else
            memcpy((char *)dst + l, (const char *)src + g, bytes);
    }
}

int64_t cpc_slice_head(const sk_bsr *L, int64_t heads_q, int64_t heads_kv, int64_t hq) {
    if (L->grid.heads == 1) return 0;
    return L->grid.heads == heads_q ? hq : hq / (heads_q / heads_kv);
}

const int32_t *cpc_chunk_starts(const cp_case *c, const sk_cp_desc *d, const sk_bsr *L,
                                int32_t *starts, int *ok) {
    const int32_t C = c->sharding == SK_CP_SHARDING_ZIGZAG ? 2 * c->ranks : c->ranks;
    const int32_t nb = (int32_t)((c->seq + c->block - 1) / c->block);
    *ok = 1;
    if (c->starts == CPC_STARTS_BALANCED) {
        const sk_cp_cost cost = {1.0, 4.0, 0.0};
        sk_cp_desc e = *d;
        e.chunk_starts = NULL;
        if (sk_cp_balance(&e, L, &cost, starts, C + 1) != SK_STATUS_SUCCESS) *ok = 0;
        return *ok ? starts : NULL;
    }
    if (c->starts != CPC_STARTS_SKEWED) return NULL;
    const int long_first = (int)(c->seed % 2);
    for (int32_t i = 0; i <= C; ++i)
        starts[i] = i == 0 ? 0 : i == C ? nb : long_first ? nb - C + i : i;
    return starts;
}

static void (*starts_run)(int idx, cp_case *c);

static void starts_case(int idx, cp_case *c) {
    if (c->ranks < 2 || c->ranks > 4) return;
    c->starts = idx % 2 ? CPC_STARTS_SKEWED : CPC_STARTS_BALANCED;
    starts_run(idx, c);
}

void cpc_sweep_starts(uint64_t base, int kinds, void (*run)(int idx, cp_case *c)) {
    starts_run = run;
    cpc_sweep(base, kinds, starts_case);
}
