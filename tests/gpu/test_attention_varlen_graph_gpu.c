/*
 * test_attention_varlen_graph_gpu.c - the CUDA varlen and paged forwards
 * beyond single calls: a CUDA graph of plan + run replayed, then replayed
 * again after the device lengths, layout and tensors changed within the
 * same capacities (the plan re-derives everything on the GPU); device
 * arrays that break the contract (a page index outside the cache, length
 * arrays that do not add up: no fault, documented results); the forced
 * Hopper backend's choice (blocks of 64 declined, 128 taken). References:
 * tests/common/varlen_case.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/varlen_case.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"
#include "gpu/varlen_gpu.h"

/* Run the captured graph from poisoned outputs and fetch O / LSE into x. */
static int vg_replay(cudaGraphExec_t exec, cudaStream_t s, const vc_case *c, vc_data *x, vg_dev *g,
                     const void *o_nan, const float *lse_nan) {
    const size_t lse_bytes = (size_t)(c->heads_q * x->total_q) * sizeof(float);
    if (vg_poison(c, x, g, o_nan, lse_nan, 1) != 0) return -1;
    if (cudaGraphLaunch(exec, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess)
        return -1;
    return gt_download(x->o, g->o, g->o_bytes) || gt_download(x->lse, g->lse, lse_bytes);
}

/* Two length arrays with the same capacities (totals, longest sequences,
 * layout rows at block 64: 8), dense layouts (B's nnz below A's). */
SK_TEST(gpu_varlen_graph_replan) {
    const int32_t lqa[3] = {100, 300, 50}, lka[3] = {400, 200, 150};
    const int32_t lqb[3] = {300, 50, 100}, lkb[3] = {150, 400, 200};
    vc_case ca = vc_base_case(SK_DTYPE_BF16, 3, lqa, lka);
    ca.kernel_rules = 1;
    ca.heads_q = 8;
    ca.heads_kv = 2;
    ca.head_dim = 128;
    ca.causal = 1;
    ca.layout_heads = 2;
    ca.padded = 2;
    vg_blocks_for_backend(&ca);
    vc_case cb = ca;
    for (int b = 0; b < 3; ++b) {
        cb.len_q[b] = lqb[b];
        cb.len_k[b] = lkb[b];
    }
    const uint64_t seed = tu_base_seed() ^ 0x6772617068ull;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    char la[512], lb[512];
    vc_label(&ca, seed, la, sizeof la);
    vc_label(&cb, seed, lb, sizeof lb);
    vc_data xa, xb;
    vg_dev g;
    cudaStream_t s = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    memset(&g, 0, sizeof g);
    const int ok_a = vc_make(&ca, &rng, &xa), ok_b = vc_make(&cb, &rng, &xb);
    void *o_nan = ok_a ? malloc((size_t)xa.q_span * 2) : NULL;
    float *lse_nan = ok_a ? (float *)malloc((size_t)(ca.heads_q * xa.total_q) * 4) : NULL;
    if (!ok_a || !ok_b || !o_nan || !lse_nan) {
        CHECK(0, "%s out of memory", la);
        goto done;
    }
    CHECK(xa.R == xb.R && xa.q_span == xb.q_span && xa.k_span == xb.k_span &&
              xb.layout.nnz <= xa.layout.nnz,
          "the two cases must share capacities (R %lld / %lld, nnz %d / %d)", (long long)xa.R,
          (long long)xb.R, (int)xa.layout.nnz, (int)xb.layout.nnz);
    memcpy(o_nan, xa.o, (size_t)xa.q_span * 2);
    memcpy(lse_nan, xa.lse, (size_t)(ca.heads_q * xa.total_q) * 4);
    if (vg_dev_make(&ca, &xa, NULL, &g) != 0 || cudaStreamCreate(&s) != cudaSuccess) {
        CHECK(0, "%s device setup: %s", la, sk_last_error());
        goto done;
    }
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    sk_status st = vg_plan(&ca, &xa, NULL, &g, s);
    if (st == SK_STATUS_SUCCESS) st = vg_run(&ca, &xa, NULL, &g, s, 0);
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    CHECK(st == SK_STATUS_SUCCESS, "%s captured plan + run: %s %s", la, sk_status_name(st),
          sk_last_error());
    if (end != cudaSuccess || st != SK_STATUS_SUCCESS ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        CHECK(0, "%s graph: %s", la, cudaGetErrorName(end));
        goto done;
    }
    vc_outcome out;
    for (int rep = 0; rep < 2; ++rep) {
        CHECK(vg_replay(exec, s, &ca, &xa, &g, o_nan, lse_nan) == 0, "%s replay %d", la, rep);
        memset(&out, 0, sizeof out);
        vc_compare_reference(&ca, &xa, la, &out);
    }
    /* New lengths, layout and tensors in the same buffers: the same graph. */
    {
        const size_t cu = 4 * sizeof(int32_t), es = 2;
        const size_t ro = (size_t)(ca.layout_heads * xa.R + 1) * sizeof(int32_t);
        CHECK(gt_upload(g.cu_q, xb.cu_q, cu) == 0 && gt_upload(g.cu_k, xb.cu_k, cu) == 0 &&
                  gt_upload((void *)g.layout.row_offsets, xb.layout.row_offsets, ro) == 0 &&
                  gt_upload((void *)g.layout.col_indices, xb.layout.col_indices,
                            (size_t)xb.layout.nnz * sizeof(int32_t)) == 0 &&
                  gt_upload(g.q, xb.q, (size_t)xb.q_span * es) == 0 &&
                  gt_upload(g.k, xb.k, (size_t)xb.k_span * es) == 0 &&
                  gt_upload(g.v, xb.v, (size_t)xb.k_span * es) == 0,
              "%s upload", lb);
        CHECK(vg_replay(exec, s, &cb, &xb, &g, o_nan, lse_nan) == 0, "%s replay", lb);
        memset(&out, 0, sizeof out);
        vc_compare_reference(&cb, &xb, lb, &out);
    }
done:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (s) cudaStreamDestroy(s);
    vg_dev_free(&g);
    free(o_nan), free(lse_nan);
    vc_data_free(&xa);
    vc_data_free(&xb);
}

/* A page index outside [0, num_pages) in a used table entry: its keys are
 * masked and never read (sparsek.h), so the run succeeds, the other
 * sequences are bitwise the clean run's, and nothing turns NaN. */
SK_TEST(gpu_paged_page_out_of_range) {
    const int32_t lq[3] = {150, 90, 200}, lk[3] = {300, 260, 400};
    vc_case c = vc_base_case(SK_DTYPE_F16, 3, lq, lk);
    c.kernel_rules = 1;
    c.heads_q = 4;
    c.heads_kv = 1;
    c.head_dim = 64;
    c.causal = 1;
    c.call = VC_PLAN_RUN;
    vg_blocks_for_backend(&c);
    const uint64_t seed = tu_base_seed() ^ 0x6f6f72ull;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    char label[600], base[512];
    vc_label(&c, seed, base, sizeof base);
    snprintf(label, sizeof label, "%s paged ps=16, bad pages", base);
    vc_data x;
    vg_paged pg;
    vg_dev g;
    memset(&pg, 0, sizeof pg);
    memset(&g, 0, sizeof g);
    void *o_clean = NULL, *o_nan = NULL;
    float *l_clean = NULL, *l_nan = NULL;
    if (!vc_make(&c, &rng, &x) || !vg_paged_make(&c, &x, 16, 0, 0, &rng, &pg)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    const size_t ob = (size_t)x.q_span * 2, lb = (size_t)(c.heads_q * x.total_q) * 4;
    o_clean = malloc(ob), o_nan = malloc(ob), l_clean = (float *)malloc(lb);
    l_nan = (float *)malloc(lb);
    if (!o_clean || !o_nan || !l_clean || !l_nan) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    memcpy(o_nan, x.o, ob);
    memcpy(l_nan, x.lse, lb);
    if (vg_check(&c, &x, &pg, label) != 0) goto done;
    memcpy(o_clean, x.o, ob);
    memcpy(l_clean, x.lse, lb);
    /* Sequence 1's first page past the cache, sequence 2's second negative. */
    pg.table[1 * pg.table_stride + 0] = pg.num_pages + 100;
    pg.table[2 * pg.table_stride + 1] = -5;
    if (vg_dev_make(&c, &x, &pg, &g) != 0 || vg_poison(&c, &x, &g, o_nan, l_nan, 1) != 0) {
        CHECK(0, "%s device setup: %s", label, sk_last_error());
        goto done;
    }
    const sk_status st = vg_pass(&c, &x, &pg, &g, 0);
    CHECK(st == SK_STATUS_SUCCESS && gt_sync() == 0, "%s: %s %s", label, sk_status_name(st),
          sk_last_error());
    CHECK(gt_download(x.o, g.o, ob) == 0 && gt_download(x.lse, g.lse, lb) == 0, "download");
    for (int64_t t = 0; t < x.total_q; ++t)
        for (int64_t h = 0; h < c.heads_q; ++h) {
            const int seq = t < x.cu_q[1] ? 0 : t < x.cu_q[2] ? 1 : 2;
            const float l = x.lse[h * x.total_q + t];
            if (seq == 0) {
                CHECK(memcmp(&l, &l_clean[h * x.total_q + t], 4) == 0,
                      "%s LSE[%lld, %lld] of sequence 0 changed", label, (long long)h,
                      (long long)t);
            } else {
                CHECK(!isnan(l) && l != INFINITY, "%s LSE[%lld, %lld] = %g", label, (long long)h,
                      (long long)t, (double)l);
            }
            for (int64_t d = 0; d < c.head_dim; ++d) {
                const int64_t at = t * x.ts_q + h * x.hs + d;
                const float o = tu_load(x.o, c.dtype, at);
                if (seq == 0)
                    CHECK(o == tu_load(o_clean, c.dtype, at), "%s O of sequence 0 changed", label);
                else
                    CHECK(isfinite(o), "%s O[%lld, %lld, %lld] = %g", label, (long long)t,
                          (long long)h, (long long)d, (double)o);
                if (!(seq == 0 ? o == tu_load(o_clean, c.dtype, at) : isfinite(o))) goto done;
            }
        }
done:
    vg_dev_free(&g);
    vg_paged_free(&pg);
    vc_data_free(&x);
    free(o_clean), free(o_nan), free(l_clean), free(l_nan);
}

/* Length arrays that break the contract (beyond the totals, decreasing,
 * negative): the kernels clamp them (sparsek.h), so the run completes
 * without a fault and writes nothing outside O's and LSE's rows. */
SK_TEST(gpu_varlen_garbage_lengths) {
    const int32_t lq[4] = {100, 70, 200, 30}, lk[4] = {120, 300, 64, 10};
    vc_case c = vc_base_case(SK_DTYPE_BF16, 4, lq, lk);
    c.kernel_rules = 1;
    c.heads_q = 2;
    c.head_dim = 64;
    c.causal = 1;
    c.padded = 2;
    vg_blocks_for_backend(&c);
    const uint64_t seed = tu_base_seed() ^ 0x6a756e6bull;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    vg_dev g;
    memset(&g, 0, sizeof g);
    void *o_nan = NULL;
    if (!vc_make(&c, &rng, &x) || (o_nan = malloc((size_t)x.q_span * 2)) == NULL ||
        vg_dev_make(&c, &x, NULL, &g) != 0) {
        CHECK(0, "setup: %s", sk_last_error());
        goto done;
    }
    memcpy(o_nan, x.o, (size_t)x.q_span * 2);
    static const int32_t bad[3][5] = {
        {0, 500, 100, 9999, 400}, {0, -50, 2000000000, 3, -1}, {400, 300, 200, 100, 0}};
    for (int i = 0; i < 3; ++i) {
        CHECK(gt_upload(g.cu_q, bad[i], sizeof bad[i]) == 0 &&
                  gt_upload(g.cu_k, bad[2 - i], sizeof bad[i]) == 0 &&
                  vg_poison(&c, &x, &g, o_nan, x.lse, 1) == 0,
              "upload");
        const sk_status st = vg_pass(&c, &x, NULL, &g, 0);
        CHECK(st == SK_STATUS_SUCCESS && gt_sync() == 0, "garbage lengths %d: %s %s", i,
              sk_status_name(st), sk_last_error());
        /* O's stride padding is outside every row: still NaN. */
        void *o = malloc((size_t)x.q_span * 2);
        if (o != NULL && gt_download(o, g.o, (size_t)x.q_span * 2) == 0) {
            int64_t written = 0;
            for (int64_t t = 0; t < x.total_q; ++t)
                for (int64_t e = c.heads_q * x.hs; e < x.ts_q && t * x.ts_q + e < x.q_span; ++e)
                    written += !isnan(tu_load(o, c.dtype, t * x.ts_q + e));
            CHECK(written == 0, "garbage lengths %d: %lld padding elements written", i,
                  (long long)written);
        }
        free(o);
    }
done:
    free(o_nan);
    vg_dev_free(&g);
    vc_data_free(&x);
}

/* SK_BACKEND_CUDA_SM90 (the Hopper kernel, varlen_sm90.h): blocks of 64
 * are declined by every call with the reason, touching nothing; the same
 * sequences at blocks of 128 are taken: a workspace size, then the forward
 * against the reference (vg_check, the Hopper kernel forced). */
SK_TEST(gpu_varlen_sm90_dispatch) {
    const int32_t lq[2] = {100, 20}, lk[2] = {100, 50};
    vc_case c = vc_base_case(SK_DTYPE_F16, 2, lq, lk);
    c.kernel_rules = 1;
    c.head_dim = 64;
    const uint64_t seed = tu_base_seed();
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    vg_dev g;
    memset(&g, 0, sizeof g);
    if (!vc_make(&c, &rng, &x)) {
        CHECK(0, "out of memory");
        vc_data_free(&x);
        return;
    }
    sk_attention_varlen_desc d;
    vg_varlen_desc(&c, &x, &d);
    d.backend = SK_BACKEND_CUDA_SM90;
    size_t bytes = 777;
    sk_status st = sk_attention_varlen_workspace_size(&d, &x.layout, &bytes);
    CHECK(st == SK_STATUS_NOT_SUPPORTED && bytes == 777 &&
              strstr(sk_last_error(), "128 x 128 only") != NULL,
          "blocks 64, workspace size: %s %s", sk_status_name(st), sk_last_error());
    const sk_backend saved = gt_opt.backend;
    gt_opt.backend = SK_BACKEND_CUDA; /* device buffers of the case */
    const int made = vg_dev_make(&c, &x, NULL, &g);
    gt_opt.backend = saved;
    if (made == 0 && gt_upload(g.o, x.o, g.o_bytes) == 0) {
        st = sk_attention_varlen_forward(&d, &g.layout, g.cu_q, g.cu_k, g.q, g.k, g.v, g.o, g.lse,
                                         g.ws, g.ws_bytes, NULL);
        CHECK(st == SK_STATUS_NOT_SUPPORTED && strstr(sk_last_error(), "128 x 128 only") != NULL,
              "blocks 64, forward: %s %s", sk_status_name(st), sk_last_error());
        void *o = malloc(g.o_bytes);
        if (o != NULL && gt_sync() == 0 && gt_download(o, g.o, g.o_bytes) == 0) {
            int64_t written = 0;
            for (int64_t e = 0; e < x.q_span; ++e) written += !isnan(tu_load(o, c.dtype, e));
            CHECK(written == 0, "sm90 decline wrote %lld elements of O", (long long)written);
        }
        free(o);
    } else {
        CHECK(0, "setup: %s", sk_last_error());
    }
    vg_dev_free(&g);
    vc_data_free(&x);

    /* Blocks of 128: covered (run on a Hopper only). */
    if (!vg_is_hopper()) return;
    c.bq = c.bk = 128;
    tu_rng_seed(&rng, seed ^ 0x3930ull);
    if (!vc_make(&c, &rng, &x)) {
        CHECK(0, "out of memory");
        vc_data_free(&x);
        return;
    }
    vg_varlen_desc(&c, &x, &d);
    d.backend = SK_BACKEND_CUDA_SM90;
    bytes = 0;
    st = sk_attention_varlen_workspace_size(&d, &x.layout, &bytes);
    CHECK(st == SK_STATUS_SUCCESS && bytes > 0, "blocks 128, workspace size: %s %s",
          sk_status_name(st), sk_last_error());
    char label[512];
    vc_label(&c, seed ^ 0x3930ull, label, sizeof label);
    gt_opt.backend = SK_BACKEND_CUDA_SM90;
    const int before = vg_declined;
    CHECK(vg_check(&c, &x, NULL, label) == 0 && vg_declined == before,
          "blocks 128 on the forced Hopper backend");
    gt_opt.backend = saved;
    vc_data_free(&x);
}
