/*
 * test_attention_varlen_backward_gpu.c - the CUDA varlen attention backward
 * (src/cuda/attention/bwd_varlen.cu) on seeded cases of
 * tests/common/varlen_case.h: dQ, dK, dV against the naive fp64 chain-rule
 * backward on each sequence's unpacked copy under the fixed backward GPU
 * suite's rule (varlen_bwd_case.h, vbc_check with the bound of an
 * implementation that rounds P and dS to the dtype as MMA operands, as
 * gpu_bwd.c uses), the outputs' padding untouched.
 *
 * The forward's O and LSE come from the CPU backend. Every run starts from
 * NaN-poisoned dQ, dK, dV and a garbage workspace; K and V are NaN on every
 * key that no query of its KV head reaches and dO on every row with no
 * admissible key (neither may leak), stride padding is NaN everywhere.
 * Each case runs twice (a plan reused by a second run for VC_RUN cases),
 * and the two results must be equal bit for bit.
 *
 * Tests (filter `gpu_varlen_bwd`): _random (48 cases: 1-8 sequences,
 * lengths 0 .. 400 / 600, GQA 1-8, blocks 64 / 128, D 64 / 128, F16 /
 * BF16, causal or not, every layout head mapping, padded strides, spare
 * layout rows, the three call forms), _edges (hand-picked lengths: empty
 * sequences of both kinds, one token, block edges, len_q > len_k under
 * causal), _long (sequences of 4K-8K tokens), _graph (plan + run captured
 * in a CUDA graph, replayed: bitwise equal to the direct run) and
 * _garbage_arrays (length arrays that break the contract: the calls
 * succeed, nothing outside the tensors is touched: run it under
 * compute-sanitizer memcheck with --quick).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/varlen_bwd_case.h"
#include "common/varlen_case.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"

/* The device side of one case. */
typedef struct vbg_dev {
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *ws;
    float *lse;
    int32_t *cu_q, *cu_k;
    sk_bsr layout;       /* device arrays */
    void *nan_q, *nan_k; /* host NaN images of dQ and dK / dV */
    size_t q_bytes, k_bytes, ws_bytes;
} vbg_dev;

static int vbg_cases, vbg_failed;

static void vbg_free(vbg_dev *g) {
    void *d[11] = {g->q, g->k, g->v, g->o, g->dout, g->dq, g->dk, g->dv, g->ws, g->lse, g->cu_q};
    for (int i = 0; i < 11; ++i) gt_device_free(d[i]);
    gt_device_free(g->cu_k);
    gt_bsr_free_device(&g->layout);
    free(g->nan_q);
    free(g->nan_k);
    memset(g, 0, sizeof *g);
}

/* The case's descriptors on the backend under test. */
static void vbg_descs(const vc_case *c, const vc_data *x, sk_attention_varlen_desc *d,
                      sk_attention_varlen_backward_desc *bd) {
    vbc_descs(c, x, d, bd);
    d->backend = gt_opt.backend;
}

/* Upload a case and allocate its gradients and workspace. 0 on success. */
static int vbg_make(const vc_case *c, const vc_data *x, const vbc_bufs *t, vbg_dev *g) {
    memset(g, 0, sizeof *g);
    const size_t es = vc_elem_size(c->dtype), cu = (size_t)(c->batch + 1) * sizeof(int32_t);
    const size_t lse = (size_t)(c->heads_q * x->total_q) * sizeof(float);
    g->q_bytes = (size_t)x->q_span * es;
    g->k_bytes = (size_t)x->k_span * es;
    g->q = gt_device_alloc(g->q_bytes);
    g->o = gt_device_alloc(g->q_bytes);
    g->dout = gt_device_alloc(g->q_bytes);
    g->dq = gt_device_alloc(g->q_bytes);
    g->k = gt_device_alloc(g->k_bytes);
    g->v = gt_device_alloc(g->k_bytes);
    g->dk = gt_device_alloc(g->k_bytes);
    g->dv = gt_device_alloc(g->k_bytes);
    g->lse = (float *)gt_device_alloc(lse);
    g->cu_q = (int32_t *)gt_device_alloc(cu);
    g->cu_k = (int32_t *)gt_device_alloc(cu);
    g->nan_q = malloc(g->q_bytes);
    g->nan_k = malloc(g->k_bytes);
    if (!g->q || !g->o || !g->dout || !g->dq || !g->k || !g->v || !g->dk || !g->dv || !g->lse ||
        !g->cu_q || !g->cu_k || !g->nan_q || !g->nan_k)
        return -1;
    tu_fill_nan(g->nan_q, c->dtype, x->q_span);
    tu_fill_nan(g->nan_k, c->dtype, x->k_span);
    if (gt_upload(g->q, x->q, g->q_bytes) || gt_upload(g->o, x->o, g->q_bytes) ||
        gt_upload(g->dout, t->dout, g->q_bytes) || gt_upload(g->k, x->k, g->k_bytes) ||
        gt_upload(g->v, x->v, g->k_bytes) || gt_upload(g->lse, x->lse, lse) ||
        gt_upload(g->cu_q, x->cu_q, cu) || gt_upload(g->cu_k, x->cu_k, cu) ||
        gt_bsr_to_device(&x->layout, &g->layout))
        return -1;
    sk_attention_varlen_desc d;
    sk_attention_varlen_backward_desc bd;
    vbg_descs(c, x, &d, &bd);
    const sk_status st =
        sk_attention_varlen_backward_workspace_size(&d, &bd, &g->layout, &g->ws_bytes);
    if (st != SK_STATUS_SUCCESS) {
        printf("    workspace size: %s (%s)\n", sk_status_name(st), sk_last_error());
        return -1;
    }
    g->ws = gt_device_alloc(g->ws_bytes);
    return g->ws != NULL ? 0 : -1;
}

/* dQ, dK, dV back to NaN; the workspace to byte `fill` unless fill < 0. */
static int vbg_poison(vbg_dev *g, int fill) {
    if (gt_upload(g->dq, g->nan_q, g->q_bytes) || gt_upload(g->dk, g->nan_k, g->k_bytes) ||
        gt_upload(g->dv, g->nan_k, g->k_bytes))
        return -1;
    if (fill >= 0 && cudaMemset(g->ws, fill, g->ws_bytes) != cudaSuccess) return -1;
    return gt_sync();
}

/* The plan (plan = 1) and / or the run (run = 1), or the one-shot call
 * (both 2), on stream s. */
static sk_status vbg_call(const vc_case *c, const vc_data *x, vbg_dev *g, int plan, int run,
                          cudaStream_t s) {
    sk_attention_varlen_desc d;
    sk_attention_varlen_backward_desc bd;
    vbg_descs(c, x, &d, &bd);
    if (plan == 2)
        return sk_attention_varlen_backward(&d, &bd, &g->layout, g->cu_q, g->cu_k, g->q, g->k, g->v,
                                            g->o, g->dout, g->lse, g->dq, g->dk, g->dv, g->ws,
                                            g->ws_bytes, s);
    if (plan) {
        const sk_status st = sk_attention_varlen_backward_plan(&d, &bd, &g->layout, g->cu_q,
                                                               g->cu_k, g->ws, g->ws_bytes, s);
        if (st != SK_STATUS_SUCCESS || !run) return st;
    }
    return sk_attention_varlen_backward_run(&d, &bd, &g->layout, g->cu_q, g->cu_k, g->q, g->k, g->v,
                                            g->o, g->dout, g->lse, g->dq, g->dk, g->dv, g->ws,
                                            g->ws_bytes, s);
}

/* Device gradients into t. 0 on success. */
static int vbg_fetch(const vbg_dev *g, vbc_bufs *t) {
    return gt_download(t->dq, g->dq, g->q_bytes) || gt_download(t->dk, g->dk, g->k_bytes) ||
           gt_download(t->dv, g->dv, g->k_bytes);
}

/* Everything a case holds (keep: three host copies, or NULL). */
static void vbg_case_free(vc_data *x, vbc_bufs *t, vbg_dev *g, void **keep) {
    for (int i = 0; keep != NULL && i < 3; ++i) free(keep[i]);
    vbg_free(g);
    vbc_bufs_free(t);
    vc_data_free(x);
}

/* A case's host side: lengths, layout, tensors, dO, the CPU forward's O
 * and LSE. 0 on success. */
static int vbg_host(vc_case *c, uint64_t seed, vc_data *x, vbc_bufs *t, char *label,
                    size_t label_size) {
    c->with_lse = 1;     /* the backward needs it */
    c->kernel_rules = 0; /* K / V NaN per key: the backward loads no key without a pair */
    vc_label(c, seed, label, label_size);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    memset(t, 0, sizeof *t);
    if (!vc_make(c, &rng, x) || !vbc_bufs_make(c, x, &rng, t)) {
        CHECK(0, "%s out of memory", label);
        return -1;
    }
    const sk_status st = vc_call_varlen(c, x);
    CHECK(st == SK_STATUS_SUCCESS, "%s CPU forward: %s (%s)", label, sk_status_name(st),
          sk_last_error());
    return st == SK_STATUS_SUCCESS ? 0 : -1;
}

/* One case, the whole protocol. 0 when it passed. */
static int vbg_run_case(vc_case c, uint64_t seed) {
    char label[600];
    const int before = sk_test_failures();
    vc_data x;
    vbc_bufs t;
    vbg_dev g;
    memset(&x, 0, sizeof x);
    memset(&g, 0, sizeof g);
    void *first[3] = {NULL, NULL, NULL};
    if (vbg_host(&c, seed, &x, &t, label, sizeof label)) goto done;
    if (gt_opt.verbose) printf("    %s\n", label);
    if (vbg_make(&c, &x, &t, &g)) {
        CHECK(0, "%s device setup failed", label);
        goto done;
    }
    for (int pass = 0; pass < 2; ++pass) {
        const int reuse = pass == 1 && c.call == VC_RUN; /* the plan of pass 0 */
        if (vbg_poison(&g, reuse ? -1 : 0x5a + 0x33 * pass)) {
            CHECK(0, "%s poison failed", label);
            goto done;
        }
        const sk_status st = c.call == VC_FORWARD ? vbg_call(&c, &x, &g, 2, 2, NULL)
                                                  : vbg_call(&c, &x, &g, !reuse, 1, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "%s pass %d: %s (%s)", label, pass, sk_status_name(st),
              sk_last_error());
        if (st != SK_STATUS_SUCCESS || gt_sync() || vbg_fetch(&g, &t)) {
            CHECK(st != SK_STATUS_SUCCESS, "%s pass %d: device error", label, pass);
            goto done;
        }
        void *now[3] = {t.dq, t.dk, t.dv};
        const size_t bytes[3] = {g.q_bytes, g.k_bytes, g.k_bytes};
        for (int i = 0; i < 3; ++i) {
            if (pass == 0) {
                first[i] = malloc(bytes[i]);
                if (first[i] != NULL) memcpy(first[i], now[i], bytes[i]);
            } else {
                CHECK(first[i] != NULL && memcmp(first[i], now[i], bytes[i]) == 0,
                      "%s %s differs between two runs", label,
                      i == 0   ? "dQ"
                      : i == 1 ? "dK"
                               : "dV");
            }
        }
        if (pass == 0) vbc_check(&c, &x, &t, 1, label); /* P, dS rounded as MMA operands */
    }
done:
    vbg_case_free(&x, &t, &g, first);
    ++vbg_cases;
    const int failed = sk_test_failures() != before;
    vbg_failed += failed;
    return failed;
}

static void vbg_report(const char *what, int before) {
    printf("  %s: %d cases (%d failed so far), backend %d\n", what, vbg_cases - before, vbg_failed,
           (int)gt_opt.backend);
}

/* A random case the CUDA kernels take: F16 / BF16, D 64 / 128, 16-byte
 * aligned padding. */
static vc_case vbg_random_case(tu_rng *rng, int32_t max_batch, int32_t max_q, int32_t max_k) {
    vc_case c = vc_random_case(rng, max_batch, max_q, max_k);
    c.dtype = tu_rng_range(rng, 0, 1) ? SK_DTYPE_BF16 : SK_DTYPE_F16;
    c.head_dim = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c.padded = c.padded ? 2 : 0;
    return c;
}

static uint64_t vbg_seed(uint64_t salt, int i) {
    return tu_base_seed() ^ (salt + (uint64_t)i * 0x9e3779b97f4a7c15ull);
}

SK_TEST(gpu_varlen_bwd_random) {
    const int before = vbg_cases;
    const int count = gt_opt.quick ? 4 : 48;
    for (int i = 0; i < count; ++i) {
        const uint64_t seed = vbg_seed(0x76626b7764720001ull, i);
        tu_rng rng;
        tu_rng_seed(&rng, seed ^ 0x5eed);
        const int32_t max_b = gt_opt.quick ? 3 : 8;
        vbg_run_case(
            vbg_random_case(&rng, max_b, gt_opt.quick ? 150 : 400, gt_opt.quick ? 200 : 600), seed);
    }
    vbg_report("gpu_varlen_bwd_random", before);
}

/* Hand-picked lengths: empty sequences (no query, no key), one token, exact
 * blocks and one past, len_q > len_k (causal: the first rows empty), over
 * GQA 1 / 2 / 4 / 8, blocks 64 / 128, D 64 / 128, both dtypes. */
SK_TEST(gpu_varlen_bwd_edges) {
    static const int32_t lq[4][6] = {{1, 0, 0, 1, 0, 1},
                                     {0, 64, 0, 128, 1, 65},
                                     {129, 3, 200, 0, 64, 2},
                                     {300, 1, 127, 5, 0, 70}};
    static const int32_t lk[4][6] = {{1, 5, 0, 0, 3, 130},
                                     {7, 64, 0, 128, 1, 200},
                                     {64, 1, 256, 9, 0, 2},
                                     {100, 1, 128, 500, 3, 33}};
    const int before = vbg_cases;
    const int count = gt_opt.quick ? 2 : 16;
    for (int i = 0; i < count; ++i) {
        const int li = i % 4;
        vc_case c = vc_base_case(i % 2 ? SK_DTYPE_BF16 : SK_DTYPE_F16, 6, lq[li], lk[li]);
        c.heads_kv = 1 + (i / 8);
        c.heads_q = c.heads_kv * (int64_t)(1 << (i % 4));
        c.head_dim = (i / 2) % 2 ? 128 : 64;
        c.bq = (i / 4) % 2 ? 128 : 64;
        c.bk = (i / 2) % 2 ? 64 : 128;
        c.causal = (i % 3) != 0;
        c.density = i % 5 == 0 ? 1.0 : 0.6;
        c.layout_heads = (int32_t)(i % 3 == 0 ? 1 : i % 3 == 1 ? c.heads_kv : c.heads_q);
        c.padded = (i / 3) % 2 ? 2 : 0;
        c.call = (vc_call)(i % 3);
        c.extra_rows = i % 4 == 3 ? 2 : 0;
        vbg_run_case(c, vbg_seed(0x76626b7764720002ull, i));
    }
    vbg_report("gpu_varlen_bwd_edges", before);
}

/* Long sequences (the naive fp64 reference bounds their number): 4K-8K
 * tokens, mixed with short ones, causal and not. */
SK_TEST(gpu_varlen_bwd_long) {
    static const int32_t lq[3][3] = {{4096, 17, 1000}, {8000, 0, 0}, {3000, 5000, 1}};
    static const int32_t lk[3][3] = {{4096, 300, 2500}, {8192, 1, 0}, {6000, 5000, 64}};
    const int before = vbg_cases;
    const int count = gt_opt.quick ? 0 : 3;
    for (int i = 0; i < count; ++i) {
        vc_case c = vc_base_case(i == 1 ? SK_DTYPE_F16 : SK_DTYPE_BF16, 3, lq[i], lk[i]);
        c.heads_kv = 1;
        c.heads_q = i == 2 ? 2 : 1;
        c.head_dim = i == 0 ? 128 : 64;
        c.bq = i == 1 ? 64 : 128;
        c.bk = i == 2 ? 64 : 128;
        c.causal = i != 2;
        c.density = 0.3;
        c.layout_heads = 1;
        c.padded = i == 1 ? 2 : 0;
        c.call = VC_PLAN_RUN;
        vbg_run_case(c, vbg_seed(0x76626b7764720003ull, i));
    }
    vbg_report("gpu_varlen_bwd_long", before);
}

/* Plan + run captured in a CUDA graph on a stream, replayed twice from NaN
 * gradients: bitwise equal to the direct call, which passed the reference. */
SK_TEST(gpu_varlen_bwd_graph) {
    static const int32_t lq[4] = {70, 0, 200, 1};
    static const int32_t lk[4] = {130, 5, 64, 300};
    vc_case c = vc_base_case(SK_DTYPE_BF16, 4, lq, lk);
    c.heads_kv = 2;
    c.heads_q = 8;
    c.head_dim = 64;
    c.causal = 1;
    c.density = 0.7;
    c.layout_heads = 8;
    c.call = VC_PLAN_RUN;
    const uint64_t seed = vbg_seed(0x76626b7764720004ull, 0);
    if (vbg_run_case(c, seed)) return;
    char label[600];
    vc_data x;
    vbc_bufs t;
    vbg_dev g;
    memset(&x, 0, sizeof x);
    memset(&g, 0, sizeof g);
    void *direct[3] = {NULL, NULL, NULL};
    cudaStream_t s = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (vbg_host(&c, seed, &x, &t, label, sizeof label) || vbg_make(&c, &x, &t, &g) ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        CHECK(0, "%s setup failed", label);
        goto done;
    }
    /* The direct call. */
    if (vbg_poison(&g, 0x11) || vbg_call(&c, &x, &g, 1, 1, NULL) != SK_STATUS_SUCCESS ||
        gt_sync() || vbg_fetch(&g, &t)) {
        CHECK(0, "%s direct call failed: %s", label, sk_last_error());
        goto done;
    }
    const size_t bytes[3] = {g.q_bytes, g.k_bytes, g.k_bytes};
    void *got[3] = {t.dq, t.dk, t.dv};
    for (int i = 0; i < 3; ++i) {
        direct[i] = malloc(bytes[i]);
        if (direct[i] == NULL) goto done;
        memcpy(direct[i], got[i], bytes[i]);
    }
    if (vbg_poison(&g, 0x77)) goto done;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "%s capture",
          label);
    const sk_status st = vbg_call(&c, &x, &g, 1, 1, s);
    const cudaError_t ce = cudaStreamEndCapture(s, &graph);
    CHECK(st == SK_STATUS_SUCCESS && ce == cudaSuccess, "%s captured plan + run: %s (%s), %s",
          label, sk_status_name(st), sk_last_error(), cudaGetErrorName(ce));
    if (st != SK_STATUS_SUCCESS || ce != cudaSuccess) goto done;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        CHECK(0, "%s graph instantiate failed", label);
        goto done;
    }
    for (int rep = 0; rep < 2; ++rep) {
        if (vbg_poison(&g, 0x3c + rep) || cudaGraphLaunch(exec, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess || vbg_fetch(&g, &t)) {
            CHECK(0, "%s graph replay %d failed", label, rep);
            goto done;
        }
        for (int i = 0; i < 3; ++i)
            CHECK(memcmp(direct[i], got[i], bytes[i]) == 0,
                  "%s graph replay %d: %s differs from the direct call", label, rep,
                  i == 0   ? "dQ"
                  : i == 1 ? "dK"
                           : "dV");
    }
done:
    if (exec != NULL) cudaGraphExecDestroy(exec);
    if (graph != NULL) cudaGraphDestroy(graph);
    if (s != NULL) cudaStreamDestroy(s);
    vbg_case_free(&x, &t, &g, direct);
}

/* Length arrays that break the contract (the host cannot check device
 * arrays): decreasing, negative, past the totals, INT32 extremes. Each call
 * must succeed and leave the device sane (no fault: compute-sanitizer
 * memcheck proves no stray access), the stride padding of dQ, dK, dV NaN. */
SK_TEST(gpu_varlen_bwd_garbage_arrays) {
    static const int32_t lq[4] = {70, 0, 200, 1};
    static const int32_t lk[4] = {130, 5, 64, 300};
    static const int32_t bad[6][5] = {{0, 300, 100, 50, 271},
                                      {-5, -1, 1000000, 3, 271},
                                      {0, 0x7fffffff, 0x7fffffff, 0x7fffffff, 271},
                                      {0, (int32_t)0x80000000, 70, 70, 271},
                                      {200, 100, 0, 271, 0},
                                      {0, 271, 271, 271, 271}};
    vc_case c = vc_base_case(SK_DTYPE_F16, 4, lq, lk);
    c.heads_kv = 1;
    c.heads_q = 2;
    c.head_dim = 64;
    c.causal = 1;
    c.density = 1.0;
    c.padded = 2;
    const uint64_t seed = vbg_seed(0x76626b7764720005ull, 0);
    char label[600];
    vc_data x;
    vbc_bufs t;
    vbg_dev g;
    memset(&x, 0, sizeof x);
    memset(&g, 0, sizeof g);
    if (vbg_host(&c, seed, &x, &t, label, sizeof label) || vbg_make(&c, &x, &t, &g)) {
        CHECK(0, "%s setup failed", label);
        goto done;
    }
    for (int a = 0; a < 6; ++a)
        for (int which = 0; which < 2; ++which) {
            const size_t cu = 5 * sizeof(int32_t);
            if (vbg_poison(&g, 0x99) || gt_upload(which ? g.cu_k : g.cu_q, bad[a], cu) ||
                gt_upload(which ? g.cu_q : g.cu_k, which ? x.cu_q : x.cu_k, cu)) {
                CHECK(0, "%s upload failed", label);
                goto done;
            }
            const sk_status st = vbg_call(&c, &x, &g, 1, 1, NULL);
            const int sync = gt_sync();
            CHECK(st == SK_STATUS_SUCCESS && sync == 0, "%s garbage %s #%d: %s (%s), sync %d",
                  label, which ? "cu_seqlens_k" : "cu_seqlens_q", a, sk_status_name(st),
                  sk_last_error(), sync);
            if (sync || vbg_fetch(&g, &t)) goto done;
            const int64_t Hq = c.heads_q, D = c.head_dim;
            const int64_t pq =
                vbc_padding_written(t.dq, c.dtype, x.q_span, x.total_q, Hq, D, x.ts_q, x.hs);
            const int64_t pk = vbc_padding_written(t.dk, c.dtype, x.k_span, x.total_k, c.heads_kv,
                                                   D, x.ts_k, x.hs);
            CHECK(pq + pk == 0, "%s garbage #%d: padding written (dq %lld, dk %lld)", label, a,
                  (long long)pq, (long long)pk);
        }
done:
    vbg_case_free(&x, &t, &g, NULL);
}
