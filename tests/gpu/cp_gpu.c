/*
 * cp_gpu.c - the GPU context-parallel tests' shared case pieces
 * (cp_gpu.h).
 */
#include "gpu/cp_gpu.h"

#include <stdio.h>

#include "common/test_util.h"
#include "gpu_util.h"

void cpg_name(char *name, size_t n, const cp_case *c, const char *prefix) {
    snprintf(name, n, "%sR%d %s %s%s %s B%lld S%lld H%lld/%lld D%lld blk%d slices %dx%d seed %llu",
             prefix, (int)c->ranks,
             c->sharding == SK_CP_SHARDING_ZIGZAG ? "zigzag" : "contiguous",
             cpc_kind_names[c->kind], c->causal ? " causal" : "",
             c->dtype == SK_DTYPE_BF16 ? "bf16" : "f16", (long long)c->batch, (long long)c->seq,
             (long long)c->heads_q, (long long)c->heads_kv, (long long)c->head_dim, (int)c->block,
             (int)c->layout_batch, (int)c->layout_heads, (unsigned long long)c->seed);
}

void cpg_sweep_case(int idx, int32_t ranks, int zigzag, int causal, int kind, uint64_t seed,
                    cp_case *c) {
    c->ranks = ranks;
    c->sharding = zigzag ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS;
    c->causal = causal;
    c->kind = kind;
    c->dtype = (idx % 2) ? SK_DTYPE_F16 : SK_DTYPE_BF16;
    c->batch = 1 + idx % 2;
    c->heads_kv = 2;
    c->heads_q = (idx % 3) ? 4 : 2;
    c->head_dim = (idx % 5 == 3) ? 64 : 128;
    c->block = (idx % 7 == 5) ? 64 : 128;
    c->seq = (int64_t)c->block * (2 * c->ranks + 3) + (idx % 2 ? 37 : 0);
    c->layout_batch = (idx % 4 == 1) ? (int32_t)c->batch : 1;
    const int64_t heads[3] = {1, c->heads_kv, c->heads_q};
    c->layout_heads = (int32_t)heads[idx % 3];
    c->seed = seed;
}

void cpg_desc(const cp_case *c, sk_cp_desc *d) {
    sk_cp_desc_init(d, sizeof *d);
    d->ranks = c->ranks;
    d->sharding = c->sharding;
    d->backend = gt_opt.backend;
    d->dtype = c->dtype;
    d->batch = c->batch;
    d->seq = c->seq;
    d->heads_q = c->heads_q;
    d->heads_kv = c->heads_kv;
    d->head_dim = c->head_dim;
    d->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
}

int cpg_slice_covers(const cp_case *c, const sk_bsr *L, int64_t s, int64_t b, int64_t hq) {
    if (L->grid.batch != 1 && b != s / L->grid.heads) return 0;
    return cpc_slice_head(L, c->heads_q, c->heads_kv, hq) == s % L->grid.heads;
}

void cpg_used_units(const cp_case *c, const sk_bsr *L, uint8_t *used) {
    const int64_t nb = (c->seq + c->block - 1) / c->block;
    const int64_t slices = (int64_t)L->grid.batch * L->grid.heads, group = c->heads_q / c->heads_kv;
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t b = 0; b < c->batch; ++b)
            for (int64_t hq = 0; hq < c->heads_q; ++hq) {
                if (!cpg_slice_covers(c, L, s, b, hq)) continue;
                for (int64_t e = L->row_offsets[s * nb]; e < L->row_offsets[(s + 1) * nb]; ++e)
                    used[(b * c->heads_kv + hq / group) * nb + L->col_indices[e]] = 1;
            }
}

void cpg_poison_unused(const cp_case *c, const uint8_t *used, void *k, void *v) {
    const int64_t S = c->seq, D = c->head_dim, Hkv = c->heads_kv;
    const int64_t nb = (S + c->block - 1) / c->block;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < nb; ++j) {
                if (used[(b * Hkv + h) * nb + j]) continue;
                for (int64_t t = j * c->block; t < S && t < (j + 1) * c->block; ++t) {
                    tu_fill_nan((uint16_t *)k + ((b * S + t) * Hkv + h) * D, c->dtype, D);
                    tu_fill_nan((uint16_t *)v + ((b * S + t) * Hkv + h) * D, c->dtype, D);
                }
            }
}
