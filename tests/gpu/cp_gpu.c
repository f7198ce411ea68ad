/*
 * cp_gpu.c - the GPU context-parallel tests' shared case pieces
 * (cp_gpu.h).
 */
#include "gpu/cp_gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu_util.h"

void cpg_name(char *name, size_t n, const cp_case *c, const char *prefix) {
    static const char *const starts[3] = {"", " balanced", " skewed"};
    snprintf(
        name, n, "%sR%d %s%s %s%s %s B%lld S%lld H%lld/%lld D%lld blk%d slices %dx%d seed %llu",
        prefix, (int)c->ranks, c->sharding == SK_CP_SHARDING_ZIGZAG ? "zigzag" : "contiguous",
        starts[c->starts >= 0 && c->starts < 3 ? c->starts : 0], cpc_kind_names[c->kind],
        c->causal ? " causal" : "", c->dtype == SK_DTYPE_BF16 ? "bf16" : "f16", (long long)c->batch,
        (long long)c->seq, (long long)c->heads_q, (long long)c->heads_kv, (long long)c->head_dim,
        (int)c->block, (int)c->layout_batch, (int)c->layout_heads, (unsigned long long)c->seed);
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

void cpg_attention_desc(const cp_case *c, sk_attention_desc *a) {
    sk_attention_desc_init(a, sizeof *a);
    a->backend = gt_opt.backend;
    a->dtype = c->dtype;
    a->batch = c->batch;
    a->seq_q = a->seq_k = c->seq;
    a->heads_q = c->heads_q;
    a->heads_kv = c->heads_kv;
    a->head_dim = c->head_dim;
    a->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
}

int cpg_plan(const sk_cp_desc *d, const sk_bsr *L, void **plan, size_t *plan_bytes,
             sk_comm_t *comms) {
    return !(sk_cp_plan_size(d, L, plan_bytes) == SK_STATUS_SUCCESS &&
             (*plan = malloc(*plan_bytes)) != NULL &&
             sk_cp_plan(d, L, *plan, *plan_bytes) == SK_STATUS_SUCCESS &&
             sk_comm_create_simulated_cuda(d->ranks, comms) == SK_STATUS_SUCCESS);
}

sk_layout_t cpg_layout(const cp_case *c, sk_bsr *L) {
    const sk_grid g = tu_grid(c->seq, c->seq, c->block, c->block, c->layout_batch, c->layout_heads);
    sk_layout_t owned = cpc_layout(c->kind, c->causal, &g, c->seed);
    if (owned != NULL) sk_layout_view(owned, L);
    return owned;
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

int cpg_rank_init(cpg_rank *x, const cp_case *c, const sk_cp_desc *d, int32_t r, const void *plan,
                  size_t plan_bytes, sk_comm_t comm, int backward, const char *name) {
    x->desc = *d;
    x->desc.rank = r;
    x->plan = plan;
    x->plan_bytes = plan_bytes;
    x->comm = comm;
    sk_cp_shard(&x->desc, r, c->block, &x->tokens, &x->chunks, x->starts, x->lengths);
    const sk_status st =
        backward ? sk_cp_backward_workspace_size(&x->desc, plan, plan_bytes, &x->ws_bytes)
                 : sk_cp_workspace_size(&x->desc, plan, plan_bytes, &x->ws_bytes);
    CHECK(st == SK_STATUS_SUCCESS, "%s: rank %d workspace size: %s", name, (int)r, sk_last_error());
    if (st != SK_STATUS_SUCCESS) return 1;
    x->ws = gt_device_alloc(x->ws_bytes);
    return cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking) != cudaSuccess;
}

void cpg_rank_free(cpg_rank *x) {
    gt_device_free(x->ws);
    if (x->stream) cudaStreamDestroy(x->stream);
}

int cpg_rank_prepare(cpg_rank *x, int bad, int backward, int32_t r, const char *name) {
    /* The uploads (cudaMemcpy from pageable memory may return before its
     * DMA lands) done before the rank's stream reads them. */
    bad = bad || cudaDeviceSynchronize() != cudaSuccess ||
          cudaMemsetAsync(x->ws, 0xff, x->ws_bytes, x->stream) != cudaSuccess;
    struct CUstream_st *s = (struct CUstream_st *)x->stream;
    const sk_status st =
        bad        ? SK_STATUS_EXECUTION_FAILED
        : backward ? sk_cp_backward_prepare(&x->desc, x->plan, x->plan_bytes, x->ws, x->ws_bytes, s)
                   : sk_cp_prepare(&x->desc, x->plan, x->plan_bytes, x->ws, x->ws_bytes, s);
    CHECK(st == SK_STATUS_SUCCESS, "%s: rank %d upload / prepare: %s", name, (int)r,
          sk_last_error());
    return st != SK_STATUS_SUCCESS;
}

void cpg_rank_done(cpg_rank *x, sk_status st) {
    if (st == SK_STATUS_SUCCESS && cudaStreamSynchronize(x->stream) != cudaSuccess)
        st = SK_STATUS_EXECUTION_FAILED;
    x->status = st;
    strncpy(x->error, sk_last_error(), sizeof x->error - 1);
}

int cpg_run_threads(int32_t ranks, void *(*fn)(void *), void *items, size_t stride,
                    const char *name) {
    pthread_t th[8];
    for (int32_t r = 0; r < ranks; ++r)
        pthread_create(&th[r], NULL, fn, (char *)items + r * stride);
    for (int32_t r = 0; r < ranks; ++r) pthread_join(th[r], NULL);
    int failed = 0;
    for (int32_t r = 0; r < ranks; ++r) {
        const cpg_rank *x = (const cpg_rank *)(const void *)((char *)items + r * stride);
        CHECK(x->status == SK_STATUS_SUCCESS, "%s: rank %d: %s", name, (int)r, x->error);
        failed |= x->status != SK_STATUS_SUCCESS;
    }
    return failed;
}
