/*
 * test_topk_varlen_gpu.c - the CUDA top-k selection on varlen and paged
 * inputs against the CPU reference, bit for bit (the kernels redo its fp64
 * arithmetic in its order): seeded cases (seed printed) with empty
 * sequences, tails, q_len < k_len, GQA, per_kv_head, NaN scores, strided
 * inputs, every page size with shuffled pages and NaN in every unused slot
 * and page; layouts poisoned before each call; a CUDA graph of the paged
 * selection replayed twice (a bitwise repeat); device arrays that break
 * the contract (no fault, a well-formed layout). Cases:
 * tests/common/topk_varlen_case.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/topk_varlen_case.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"

/* A case's inputs on the device, its layout buffers and workspace. */
typedef struct tvg_dev {
    void *q, *k, *k_cache, *ws;
    int32_t *cu_q, *cu_k, *lens_k, *table, *off, *idx;
    size_t ws_bytes;
    int64_t n_off;
    int32_t cap;
} tvg_dev;

static void tvg_free(tvg_dev *g) {
    gt_device_free(g->q);
    gt_device_free(g->k);
    gt_device_free(g->k_cache);
    gt_device_free(g->ws);
    gt_device_free(g->cu_q);
    gt_device_free(g->cu_k);
    gt_device_free(g->lens_k);
    gt_device_free(g->table);
    gt_device_free(g->off);
    gt_device_free(g->idx);
    memset(g, 0, sizeof *g);
}

static int tvg_make(const tvc_case *c, tvg_dev *g) {
    memset(g, 0, sizeof *g);
    const size_t es = c->dtype == SK_DTYPE_BF16 || c->dtype == SK_DTYPE_F16 ? 2 : 4;
    sk_topk_varlen_desc d;
    tvc_desc(c, gt_opt.backend, &d);
    size_t wv = 0, wp = 0;
    if (sk_topk_varlen_workspace_size(&d, &wv) != SK_STATUS_SUCCESS ||
        sk_topk_paged_workspace_size(&d, &wp) != SK_STATUS_SUCCESS)
        return -1;
    g->ws_bytes = wv > wp ? wv : wp;
    g->cap = tvc_capacity(c);
    g->n_off = (int64_t)(c->per_kv_head ? c->heads_kv : c->heads_q) * tvc_rows(c) + 1;
    const size_t b1 = ((size_t)c->batch + 1) * 4;
    g->q = gt_device_alloc((size_t)c->q_elems * es);
    g->k = gt_device_alloc((size_t)c->k_elems * es);
    g->k_cache = gt_device_alloc((size_t)c->cache_elems * es);
    g->ws = gt_device_alloc(g->ws_bytes);
    g->cu_q = (int32_t *)gt_device_alloc(b1);
    g->cu_k = (int32_t *)gt_device_alloc(b1);
    g->lens_k = (int32_t *)gt_device_alloc(b1);
    g->table = (int32_t *)gt_device_alloc((size_t)c->batch * c->max_pages * 4);
    g->off = (int32_t *)gt_device_alloc((size_t)g->n_off * 4);
    g->idx = (int32_t *)gt_device_alloc((size_t)g->cap * 4 + 4);
    if (!g->q || !g->k || !g->k_cache || !g->ws || !g->cu_q || !g->cu_k || !g->lens_k ||
        !g->table || !g->off || !g->idx)
        return -1;
    return gt_upload(g->q, c->q, (size_t)c->q_elems * es) ||
           gt_upload(g->k, c->k, (size_t)c->k_elems * es) ||
           gt_upload(g->k_cache, c->k_cache, (size_t)c->cache_elems * es) ||
           gt_upload(g->cu_q, c->cu_q, b1) || gt_upload(g->cu_k, c->cu_k, b1) ||
           gt_upload(g->lens_k, c->len_k, (size_t)c->batch * 4) ||
           gt_upload(g->table, c->page_table, (size_t)c->batch * c->max_pages * 4);
}

/* Poison the layout buffers (0x7f7f7f7f) and the workspace (NaN bytes). */
static int tvg_poison(const tvg_dev *g) {
    return cudaMemset(g->off, 0x7f, (size_t)g->n_off * 4) != cudaSuccess ||
           cudaMemset(g->idx, 0x7f, (size_t)g->cap * 4 + 4) != cudaSuccess ||
           cudaMemset(g->ws, 0xff, g->ws_bytes) != cudaSuccess;
}

static sk_status tvg_call(const tvc_case *c, const tvg_dev *g, int paged, sk_bsr *l,
                          cudaStream_t s) {
    sk_topk_varlen_desc d;
    tvc_desc(c, gt_opt.backend, &d);
    memset(l, 0, sizeof *l);
    l->row_offsets = g->off;
    l->col_indices = g->idx;
    if (paged)
        return sk_topk_paged_select(&d, g->cu_q, g->lens_k, g->table, g->q, g->k_cache, l, g->ws,
                                    g->ws_bytes, s);
    return sk_topk_varlen_select(&d, g->cu_q, g->cu_k, g->q, g->k, l, g->ws, g->ws_bytes, s);
}

/* Download the layout; compare with the expected rows. Returns 0 when equal. */
static int tvg_check(const tvc_case *c, const tvg_dev *g, const int32_t *exp_off,
                     const int32_t *exp_idx, const char *label) {
    int32_t *off = (int32_t *)malloc((size_t)g->n_off * 4);
    int32_t *idx = (int32_t *)malloc((size_t)g->cap * 4 + 4);
    char why[256];
    int bad = off == NULL || idx == NULL || gt_download(off, g->off, (size_t)g->n_off * 4) ||
              gt_download(idx, g->idx, (size_t)g->cap * 4 + 4);
    if (bad) {
        CHECK(0, "%s: download", label);
    } else if (!tvc_compare(c, exp_off, exp_idx, off, idx, why)) {
        CHECK(0, "%s: %s", label, why);
        bad = 1;
    } else if (idx[g->cap] != 0x7f7f7f7f) {
        CHECK(0, "%s: written past the capacity", label);
        bad = 1;
    }
    free(off);
    free(idx);
    return bad;
}

/* One case: the packed form, then each page size, against the CPU. */
static int tvg_case(tvc_case *c, uint64_t seed, const char *name) {
    char label[160];
    int fails = 0;
    static const int32_t pages[5] = {0, 16, 32, 64, 128};
    int32_t *exp_off = NULL, *exp_idx = NULL;
    char why[256];
    if (!tvc_make(c, seed) || !tvc_expected(c, &exp_off, &exp_idx, why)) {
        CHECK(0, "%s (seed %llu): reference: %s", name, (unsigned long long)seed, why);
        tvc_free(c);
        return 1;
    }
    for (int v = 0; v < 5; ++v) {
        snprintf(label, sizeof label, "%s page_size %d (seed %llu)", name, (int)pages[v],
                 (unsigned long long)seed);
        if (v > 0) {
            tvc_free(c);
            c->page_size = pages[v];
            if (!tvc_make(c, seed)) {
                CHECK(0, "%s: host memory", label);
                ++fails;
                break;
            }
        }
        tvg_dev g;
        sk_bsr l;
        if (tvg_make(c, &g) != 0 || tvg_poison(&g) != 0) {
            CHECK(0, "%s: device setup: %s", label, sk_last_error());
            tvg_free(&g);
            ++fails;
            break;
        }
        const sk_status st = tvg_call(c, &g, v > 0, &l, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s", label, sk_last_error());
        if (st != SK_STATUS_SUCCESS || cudaDeviceSynchronize() != cudaSuccess)
            ++fails;
        else
            fails += tvg_check(c, &g, exp_off, exp_idx, label);
        tvg_free(&g);
    }
    free(exp_off);
    free(exp_idx);
    tvc_free(c);
    return fails;
}

SK_TEST(gpu_topk_varlen_matches_cpu) {
    const uint64_t seed = tu_base_seed() ^ 0x7a21;
    printf("  gpu_topk_varlen seed %llu\n", (unsigned long long)seed);
    static const char *const names[TVC_PRESETS] = {"gqa causal", "per_kv_head strided",
                                                   "bf16 nan"};
    tvc_case c;
    int cases = 0, fails = 0;
    for (int i = 0; i < TVC_PRESETS; ++i) {
        tvc_preset(&c, i);
        if (c.dtype == SK_DTYPE_F32) c.dtype = SK_DTYPE_F16; /* the CUDA backend's dtypes */
        c.head_dim = i == 0 ? 64 : 128;
        fails += tvg_case(&c, seed + (uint64_t)i, names[i]) != 0;
        ++cases;
    }
    tu_rng rng;
    tu_rng_seed(&rng, seed + 3);
    const int n = gt_opt.quick ? 3 : 30;
    for (int it = 0; it < n; ++it) {
        tvc_random(&c, &rng, 1200, it, 1);
        char name[48];
        snprintf(name, sizeof name, "random %d", it);
        fails += tvg_case(&c, seed + 10 + (uint64_t)it, name) != 0;
        ++cases;
    }
    printf("  gpu_topk_varlen: %d cases x 5 forms, %d failed\n", cases, fails);
}

/* The paged selection captured in a graph, replayed twice from poisoned
 * buffers: both replays equal the CPU (and so each other, bit for bit). */
SK_TEST(gpu_topk_varlen_graph_repeat) {
    const uint64_t seed = tu_base_seed() ^ 0x7a22;
    printf("  gpu_topk_varlen_graph seed %llu\n", (unsigned long long)seed);
    tvc_case c;
    tvc_init(&c);
    c.dtype = SK_DTYPE_BF16;
    c.batch = 3;
    const int32_t lq[3] = {200, 70, 0}, lk[3] = {700, 70, 40};
    memcpy(c.len_q, lq, sizeof lq);
    memcpy(c.len_k, lk, sizeof lk);
    c.heads_q = 4;
    c.heads_kv = 1;
    c.head_dim = 64;
    c.causal = 1;
    c.topk = 2;
    c.sink_blocks = 1;
    c.page_size = 32;
    int32_t *exp_off = NULL, *exp_idx = NULL;
    char why[256];
    REQUIRE(tvc_make(&c, seed), "host memory");
    REQUIRE(tvc_expected(&c, &exp_off, &exp_idx, why), "reference: %s", why);
    tvg_dev g;
    cudaStream_t s = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    sk_bsr l;
    if (tvg_make(&c, &g) != 0 || cudaStreamCreate(&s) != cudaSuccess) {
        CHECK(0, "device setup: %s", sk_last_error());
        goto done;
    }
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    const sk_status st = tvg_call(&c, &g, 1, &l, s);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
    CHECK(st == SK_STATUS_SUCCESS, "captured call: %s", sk_last_error());
    if (st != SK_STATUS_SUCCESS || graph == NULL ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        CHECK(0, "instantiate");
        goto done;
    }
    for (int rep = 0; rep < 2; ++rep) {
        char label[64];
        snprintf(label, sizeof label, "graph replay %d (seed %llu)", rep,
                 (unsigned long long)seed);
        if (tvg_poison(&g) != 0 || cudaGraphLaunch(exec, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess) {
            CHECK(0, "%s: launch", label);
            break;
        }
        tvg_check(&c, &g, exp_off, exp_idx, label);
    }
done:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (s) cudaStreamDestroy(s);
    tvg_free(&g);
    free(exp_off);
    free(exp_idx);
    tvc_free(&c);
}

/* Device arrays that break the contract: cu_seqlens_q not monotone, a
 * length past the maximum, page indices outside the cache. The kernels
 * must not fault, and the layout must be well formed (offsets
 * non-decreasing up to at most the capacity, indices below max_kb). */
SK_TEST(gpu_topk_varlen_garbage_arrays) {
    const uint64_t seed = tu_base_seed() ^ 0x7a23;
    tvc_case c;
    tvc_init(&c);
    c.dtype = SK_DTYPE_F16;
    c.batch = 3;
    const int32_t lq[3] = {100, 64, 130}, lk[3] = {300, 64, 200};
    memcpy(c.len_q, lq, sizeof lq);
    memcpy(c.len_k, lk, sizeof lk);
    c.head_dim = 32;
    c.topk = 3;
    REQUIRE(tvc_make(&c, seed), "host memory");
    tvg_dev g;
    sk_bsr l;
    if (tvg_make(&c, &g) != 0) {
        CHECK(0, "device setup");
        tvg_free(&g);
        tvc_free(&c);
        return;
    }
    const int32_t cu_bad[4] = {0, 250, 40, 100000};
    const int32_t lens_bad[3] = {-5, 100000, 200};
    int32_t *table = (int32_t *)malloc((size_t)c.batch * c.max_pages * 4);
    int32_t *off = (int32_t *)malloc((size_t)g.n_off * 4);
    int32_t *idx = (int32_t *)malloc((size_t)g.cap * 4 + 4);
    REQUIRE(table && off && idx, "host memory");
    for (int32_t i = 0; i < c.batch * c.max_pages; ++i)
        table[i] = i % 2 ? -7 : (int32_t)c.num_pages + i;
    const int up = gt_upload(g.cu_q, cu_bad, sizeof cu_bad) ||
                   gt_upload(g.lens_k, lens_bad, sizeof lens_bad) ||
                   gt_upload(g.table, table, (size_t)c.batch * c.max_pages * 4);
    CHECK(!up, "upload");
    for (int paged = 0; paged < 2 && !up; ++paged) {
        CHECK(tvg_poison(&g) == 0, "poison");
        CHECK(tvg_call(&c, &g, paged, &l, NULL) == SK_STATUS_SUCCESS, "call: %s",
              sk_last_error());
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "paged %d: the kernels faulted", paged);
        if (gt_download(off, g.off, (size_t)g.n_off * 4) ||
            gt_download(idx, g.idx, (size_t)g.cap * 4 + 4)) {
            CHECK(0, "download");
            break;
        }
        int ok = off[0] == 0 && off[g.n_off - 1] <= g.cap;
        for (int64_t r = 0; ok && r + 1 < g.n_off; ++r) ok = off[r] <= off[r + 1];
        for (int32_t e = 0; ok && e < off[g.n_off - 1]; ++e)
            ok = idx[e] >= 0 && idx[e] < (int32_t)((c.max_k + c.bk - 1) / c.bk);
        CHECK(ok, "paged %d: the layout is not well formed", paged);
    }
    free(table);
    free(off);
    free(idx);
    tvg_free(&g);
    tvc_free(&c);
}
