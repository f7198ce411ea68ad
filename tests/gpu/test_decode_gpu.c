/*
 * test_decode_gpu.c - the CUDA decode attention (sparsek.h "Decode")
 * against the naive fp64 reference and the CPU backend on seeded cases
 * (tests/common/decode_case.h: shuffled and shared pages, NaN in every
 * cache element no query may read, garbage past each page table row,
 * layouts with indices past a sequence's end):
 *   gpu_decode_random       >= 150 random cases (q_len 1..16, GQA groups
 *                           1..16, D 64/128, pages 16..128, blocks 16..128
 *                           or dense, empty selections, forced splits);
 *                           per case: the workspace poisoned, O and LSE
 *                           NaN-poisoned, plan + run, compared with the
 *                           rule; a second plan + run and a run without a
 *                           plan bitwise equal; the CPU backend's empty
 *                           rows the same
 *   gpu_decode_long         one sequence of 256K keys (split-KV at work)
 *   gpu_decode_splits       one case under splits 1, 2, 7, 33, 128 and the
 *                           rule's, split rules 1 and 2: each within the
 *                           rule
 *   gpu_decode_absent_pages a sequence whose page table row holds only
 *                           pages outside [0, num_pages): O = 0, LSE = -inf
 *   gpu_decode_graph        plan + run captured in a CUDA graph, then the
 *                           run alone (planned once, outside): 4 replays
 *                           each equal the direct run bitwise
 *   gpu_decode_bad_inputs   workspace too small, D = 96: status, nothing
 *                           written
 * The seed is printed by the runner (SPARSEK_TEST_SEED to change it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/decode_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "core/decode.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"
#include "sparsek.h"

/* A case's device buffers. */
typedef struct gd_dev {
    void *q, *k, *v, *o, *ws;
    float *lse;
    int32_t *lens, *table;
    sk_bsr layout; /* device arrays */
    size_t ws_bytes, o_bytes, lse_bytes;
} gd_dev;

static void gd_free(gd_dev *d) {
    gt_device_free(d->q);
    gt_device_free(d->k);
    gt_device_free(d->v);
    gt_device_free(d->o);
    gt_device_free(d->ws);
    gt_device_free(d->lse);
    gt_device_free(d->lens);
    gt_device_free(d->table);
    if (d->layout.row_offsets != NULL) gt_bsr_free_device(&d->layout);
    memset(d, 0, sizeof *d);
}

/* Upload a case; O and LSE get the host's NaN fill. 0 on success. */
static int gd_upload(const dc_case *c, const dc_data *x, gd_dev *d) {
    memset(d, 0, sizeof *d);
    const size_t es = dc_elem_size(c->dtype);
    d->o_bytes = (size_t)x->q_elems * es;
    d->lse_bytes = (size_t)x->lse_elems * 4;
    const size_t cache = (size_t)x->cache_elems * es;
    const size_t table = (size_t)(c->batch * x->table_stride) * 4;
    d->q = gt_device_alloc(d->o_bytes);
    d->o = gt_device_alloc(d->o_bytes);
    d->k = gt_device_alloc(cache);
    d->v = gt_device_alloc(cache);
    d->lse = (float *)gt_device_alloc(d->lse_bytes);
    d->lens = (int32_t *)gt_device_alloc((size_t)c->batch * 4);
    d->table = (int32_t *)gt_device_alloc(table);
    if (!d->q || !d->o || !d->k || !d->v || !d->lse || !d->lens || !d->table) return 1;
    if (gt_upload(d->q, x->q, d->o_bytes) || gt_upload(d->k, x->k_cache, cache) ||
        gt_upload(d->v, x->v_cache, cache) || gt_upload(d->lens, x->seq_lens_k, (size_t)c->batch * 4) ||
        gt_upload(d->table, x->table, table))
        return 1;
    if (c->block_k != 0 && gt_bsr_to_device(&x->layout, &d->layout) != 0) return 1;
    return 0;
}

/* O and LSE back to NaN (host copies o_nan, lse_nan). */
static int gd_poison(gd_dev *d, const void *o_nan, const float *lse_nan) {
    return gt_upload(d->o, o_nan, d->o_bytes) || gt_upload(d->lse, lse_nan, d->lse_bytes);
}

/* How gd_run calls: plan + run, the one-shot call, or the run alone (the
 * workspace planned before, for this problem). */
enum { GD_PLAN_RUN = 0, GD_ONE_SHOT = 1, GD_RUN_ONLY = 2 };

/* Workspace (a new one poisoned with 0xff: the run must write every
 * partial the merge reads), plan, run on `stream`, as `mode` says. */
static sk_status gd_run(const dc_case *c, const dc_data *x, gd_dev *d, cudaStream_t stream,
                        int mode) {
    const sk_decode_desc desc = dc_desc(c, x, gt_opt.backend);
    const sk_bsr *lay = c->block_k != 0 ? &d->layout : NULL;
    float *lse = c->with_lse ? d->lse : NULL;
    if (d->ws == NULL) {
        sk_status st = sk_decode_workspace_size(&desc, lay, &d->ws_bytes);
        if (st != SK_STATUS_SUCCESS) return st;
        if (d->ws_bytes > 0 && (d->ws = gt_device_alloc(d->ws_bytes)) == NULL)
            return SK_STATUS_ALLOC_FAILED;
        /* (synchronised: the legacy stream's memset does not order with
         * a non-blocking stream's plan) */
        if (d->ws != NULL && (cudaMemset(d->ws, 0xff, d->ws_bytes) != cudaSuccess || gt_sync() != 0))
            return SK_STATUS_EXECUTION_FAILED;
    }
    if (mode == GD_RUN_ONLY)
        return sk_decode_run(&desc, lay, d->lens, d->table, d->q, d->k, d->v, d->o, lse, d->ws,
                             d->ws_bytes, stream);
    if (mode == GD_ONE_SHOT)
        return sk_decode(&desc, lay, d->lens, d->table, d->q, d->k, d->v, d->o, lse, d->ws,
                         d->ws_bytes, stream);
    const sk_status st =
        sk_decode_plan(&desc, lay, d->lens, d->table, d->ws, d->ws_bytes, stream);
    if (st != SK_STATUS_SUCCESS) return st;
    return sk_decode_run(&desc, lay, d->lens, d->table, d->q, d->k, d->v, d->o, lse, d->ws,
                         d->ws_bytes, stream);
}

/* The CPU backend on the case (its layout without the indices past a
 * sequence's end, which the CPU refuses and the GPU skips): o_ref, lse_ref. */
static sk_status cpu_reference(const dc_case *c, const dc_data *x, void *o_ref, float *lse_ref) {
    const sk_decode_desc desc = dc_desc(c, x, SK_BACKEND_CPU);
    sk_bsr lay = x->layout;
    int32_t *off = NULL, *idx = NULL;
    if (c->block_k != 0) {
        const int64_t slices = (int64_t)c->batch * c->layout_heads;
        off = (int32_t *)malloc((size_t)(slices + 1) * 4);
        idx = (int32_t *)malloc((size_t)(x->layout.nnz + 1) * 4);
        if (!off || !idx) {
            free(off);
            free(idx);
            return SK_STATUS_ALLOC_FAILED;
        }
        int32_t n = 0;
        off[0] = 0;
        for (int64_t s = 0; s < slices; ++s) {
            const int64_t nb = (c->len_k[s / c->layout_heads] + c->block_k - 1) / c->block_k;
            for (int32_t e = x->layout.row_offsets[s]; e < x->layout.row_offsets[s + 1]; ++e)
                if (x->layout.col_indices[e] < nb) idx[n++] = x->layout.col_indices[e];
            off[s + 1] = n;
        }
        lay.nnz = n;
        lay.row_offsets = off;
        lay.col_indices = idx;
    }
    const sk_status st = sk_decode(&desc, c->block_k != 0 ? &lay : NULL, x->seq_lens_k, x->table,
                                   x->q, x->k_cache, x->v_cache, o_ref, lse_ref, NULL, 0, NULL);
    free(off);
    free(idx);
    return st;
}

static int decode_cases_run, decode_cases_failed;

/* One case end to end; returns the failures recorded. */
static int run_case(const dc_case *c, uint64_t seed, int one_shot) {
    char label[600];
    dc_label(c, seed, label, sizeof label);
    if (gt_opt.verbose) printf("    %s\n", label);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    dc_data x;
    gd_dev d;
    memset(&d, 0, sizeof d);
    const int before = sk_test_failures();
    void *o1 = NULL, *o2 = NULL, *o_ref = NULL;
    float *l1 = NULL, *l2 = NULL, *l_ref = NULL;
    static const char *const what[2] = {"a second plan + run", "a run without a plan"};
    if (!dc_make(c, &rng, &x)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    const size_t ob = (size_t)x.q_elems * dc_elem_size(c->dtype), lb = (size_t)x.lse_elems * 4;
    o1 = malloc(ob), o2 = malloc(ob), o_ref = malloc(ob);
    l1 = (float *)malloc(lb), l2 = (float *)malloc(lb), l_ref = (float *)malloc(lb);
    if (!o1 || !o2 || !o_ref || !l1 || !l2 || !l_ref || gd_upload(c, &x, &d) != 0) {
        CHECK(0, "%s setup failed", label);
        goto done;
    }
    /* The CPU reference, itself held to the rule. */
    memcpy(o_ref, x.o, ob);
    memcpy(l_ref, x.lse, lb);
    sk_status st = cpu_reference(c, &x, o_ref, l_ref);
    CHECK(st == SK_STATUS_SUCCESS, "%s CPU reference: %s %s", label, sk_status_name(st),
          sk_last_error());
    /* Run 0, planned; then 1: again; 2: without a plan. Each bitwise
     * equal to run 0. */
    for (int rep = 0; rep < 3; ++rep) {
        void *o = rep == 0 ? o1 : o2;
        float *l = rep == 0 ? l1 : l2;
        if (gd_poison(&d, x.o, x.lse) != 0) {
            CHECK(0, "%s upload", label);
            goto done;
        }
        st = gd_run(c, &x, &d, NULL, rep == 2 ? GD_RUN_ONLY : one_shot);
        if (st != SK_STATUS_SUCCESS) {
            CHECK(0, "%s run %d: %s %s", label, rep, sk_status_name(st), sk_last_error());
            goto done;
        }
        if (gt_sync() != 0 || gt_download(o, d.o, ob) != 0 || gt_download(l, d.lse, lb) != 0) {
            CHECK(0, "%s run %d: %s", label, rep, cudaGetErrorName(cudaGetLastError()));
            goto done;
        }
        if (rep > 0)
            CHECK(memcmp(o1, o2, ob) == 0 && memcmp(l1, l2, lb) == 0, "%s: %s differs", label,
                  what[rep - 1]);
    }
    int64_t empty_gpu = 0, empty_cpu = 0;
    dc_compare(c, &x, o1, c->with_lse ? l1 : NULL, label, &empty_gpu);
    dc_compare(c, &x, o_ref, c->with_lse ? l_ref : NULL, label, &empty_cpu);
    CHECK(empty_gpu == empty_cpu, "%s empty rows: GPU %lld, CPU %lld", label,
          (long long)empty_gpu, (long long)empty_cpu);
    if (c->with_lse)
        for (int64_t e = 0; e < x.lse_elems; ++e)
            if (isinf(l1[e]) != isinf(l_ref[e])) {
                CHECK(0, "%s LSE[%lld] = %g on the GPU, %g on the CPU", label, (long long)e,
                      l1[e], l_ref[e]);
                break;
            }
    if (!c->with_lse)
        for (int64_t e = 0; e < x.lse_elems; ++e)
            if (!isnan(l1[e])) {
                CHECK(0, "%s LSE written without being asked for", label);
                break;
            }
done:
    free(o1), free(o2), free(o_ref), free(l1), free(l2), free(l_ref);
    gd_free(&d);
    dc_data_free(&x);
    const int failed = sk_test_failures() - before;
    ++decode_cases_run;
    decode_cases_failed += failed != 0;
    return failed;
}

SK_TEST(gpu_decode_random) {
    const uint64_t base = tu_base_seed() + 31000;
    const int n = gt_opt.quick ? 12 : 160;
    decode_cases_run = decode_cases_failed = 0;
    for (int i = 0; i < n; ++i) {
        tu_rng rng;
        tu_rng_seed(&rng, base + (uint64_t)i);
        const int long_case = i % 10 == 9 && !gt_opt.quick;
        dc_case c = dc_random_case(&rng, long_case ? 2 : 4, long_case ? 40000 : 2500, 0);
        if (long_case) { /* long keys, few rows: the fp64 reference stays quick */
            c.q_len = c.q_len < 4 ? c.q_len : 4;
            c.heads_q = (c.heads_q / c.heads_kv < 8 ? c.heads_q / c.heads_kv : 8);
            c.heads_kv = 1;
            c.layout_heads = 1;
        }
        run_case(&c, base + 1000000 + (uint64_t)i, i % 3 == 0);
    }
    printf("    decode cases: %d run, %d failed\n", decode_cases_run, decode_cases_failed);
}

/* Group 8, q_len 4 (32 query rows: kMT = 2), half the 64-key blocks,
 * shared pages, indices past the ends, max_seqlen_k above every length. */
static dc_case fixed_case(void) {
    static const int32_t lens[3] = {5000, 17, 1234};
    dc_case c = dc_gqa_case(SK_DTYPE_BF16, 4, 16, 2, 128, 64, 64, lens);
    c.density = 0.5;
    c.share = 1;
    c.past_end = 1;
    c.extra_keys = 100;
    return c;
}

SK_TEST(gpu_decode_long) {
    dc_case c;
    memset(&c, 0, sizeof c);
    c.dtype = SK_DTYPE_F16;
    c.batch = 1;
    c.q_len = 2;
    c.len_k[0] = gt_opt.quick ? 20000 : 256 * 1024;
    c.heads_q = 8;
    c.heads_kv = 1;
    c.head_dim = 64;
    c.page_size = 128;
    c.block_k = 0;
    c.causal = 1;
    c.shuffle = 1;
    c.with_lse = 1;
    run_case(&c, tu_base_seed() + 32000, 0);
    c.block_k = 128;
    c.layout_heads = 1;
    c.density = 0.05;
    run_case(&c, tu_base_seed() + 32001, 1);
}

SK_TEST(gpu_decode_splits) {
    static const int32_t splits[7] = {1, 2, 7, 33, 128, 0, 0};
    for (int i = 0; i < 7; ++i) {
        dc_case c = fixed_case();
        c.num_splits = splits[i];
        c.q_len = i >= 5 ? 16 : 4; /* 16 x group 8 = 128 rows: four row groups */
        sk_decode_set_split_rule(i == 6 ? 1 : 2);
        run_case(&c, tu_base_seed() + 33000, i % 2);
        sk_decode_set_split_rule(2);
    }
}

/* Pages outside [0, num_pages) are absent: a sequence whose used pages are
 * all out of range has no key (O = 0, LSE = -inf); the others are as with
 * a valid table. */
SK_TEST(gpu_decode_absent_pages) {
    dc_case c = fixed_case();
    c.past_end = 0;
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 34000);
    dc_data x;
    gd_dev d;
    REQUIRE(dc_make(&c, &rng, &x), "out of memory");
    if (gd_upload(&c, &x, &d) != 0) {
        CHECK(0, "setup");
        gd_free(&d);
        dc_data_free(&x);
        return;
    }
    const size_t ob = (size_t)x.q_elems * 2, lb = (size_t)x.lse_elems * 4;
    void *o = malloc(ob), *o_ref = malloc(ob);
    float *l = (float *)malloc(lb), *l_ref = (float *)malloc(lb);
    int32_t *bad = (int32_t *)malloc((size_t)x.table_stride * 4);
    if (o && o_ref && l && l_ref && bad) {
        CHECK(gd_poison(&d, x.o, x.lse) == 0, "upload");
        sk_status st = gd_run(&c, &x, &d, NULL, GD_PLAN_RUN);
        CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        CHECK(gt_sync() == 0 && gt_download(o_ref, d.o, ob) == 0 &&
                  gt_download(l_ref, d.lse, lb) == 0, "download");
        for (int64_t i = 0; i < x.table_stride; ++i)
            bad[i] = i % 2 ? -1 - (int32_t)i : (int32_t)(x.num_pages + i);
        CHECK(gt_upload(d.table, bad, (size_t)x.table_stride * 4) == 0, "upload"); /* sequence 0 */
        CHECK(gd_poison(&d, x.o, x.lse) == 0, "upload");
        st = gd_run(&c, &x, &d, NULL, GD_ONE_SHOT);
        CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        CHECK(gt_sync() == 0 && gt_download(o, d.o, ob) == 0 && gt_download(l, d.lse, lb) == 0,
              "download");
        const size_t seq = (size_t)x.qs[0] * 2, seq_lse = (size_t)(c.heads_q * c.q_len);
        for (int64_t t = 0; t < c.q_len; ++t)
            for (int64_t h = 0; h < c.heads_q; ++h) {
                const uint16_t *row = (const uint16_t *)o + t * x.qs[1] + h * x.qs[2];
                for (int64_t e = 0; e < c.head_dim; ++e)
                    if (row[e] != 0) {
                        CHECK(0, "O[0, %lld, %lld, %lld] = 0x%04x, want 0", (long long)t,
                              (long long)h, (long long)e, (unsigned)row[e]);
                        break;
                    }
            }
        for (size_t e = 0; e < seq_lse; ++e)
            CHECK(isinf(l[e]) && l[e] < 0, "LSE[%zu] = %g, want -inf", e, l[e]);
        CHECK(memcmp((char *)o + seq, (char *)o_ref + seq, ob - seq) == 0,
              "the other sequences changed");
        CHECK(memcmp(l + seq_lse, l_ref + seq_lse, lb - seq_lse * 4) == 0,
              "the other sequences' LSE changed");
    } else {
        CHECK(0, "out of memory");
    }
    free(o), free(o_ref), free(l), free(l_ref), free(bad);
    gd_free(&d);
    dc_data_free(&x);
}

SK_TEST(gpu_decode_graph) {
    dc_case c = fixed_case();
    c.num_splits = 5;
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 35000);
    dc_data x;
    gd_dev d;
    REQUIRE(dc_make(&c, &rng, &x), "out of memory");
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    const size_t ob = (size_t)x.q_elems * 2, lb = (size_t)x.lse_elems * 4;
    void *o1 = malloc(ob), *o2 = malloc(ob);
    float *l1 = (float *)malloc(lb), *l2 = (float *)malloc(lb);
    if (!o1 || !o2 || !l1 || !l2 || gd_upload(&c, &x, &d) != 0 ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        CHECK(0, "setup");
        goto done;
    }
    CHECK(gd_poison(&d, x.o, x.lse) == 0, "upload");
    sk_status st = gd_run(&c, &x, &d, stream, GD_PLAN_RUN);
    CHECK(st == SK_STATUS_SUCCESS, "direct: %s", sk_last_error());
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    CHECK(gt_download(o1, d.o, ob) == 0 && gt_download(l1, d.lse, lb) == 0, "download");
    dc_compare(&c, &x, o1, l1, "[graph: direct]", NULL);
    /* Captured: plan + run, then the run alone (planned once, outside the
     * capture: the contract the Python binding's cached plans use). */
    for (int mode = 0; mode < 2; ++mode) {
        if (mode == 1) {
            const sk_decode_desc desc = dc_desc(&c, &x, gt_opt.backend);
            st = sk_decode_plan(&desc, &d.layout, d.lens, d.table, d.ws, d.ws_bytes, stream);
            CHECK(st == SK_STATUS_SUCCESS, "plan: %s", sk_last_error());
        }
        CHECK(gd_poison(&d, x.o, x.lse) == 0, "upload");
        CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
        if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) {
            CHECK(0, "begin capture");
            goto done;
        }
        st = gd_run(&c, &x, &d, stream, mode == 0 ? GD_PLAN_RUN : GD_RUN_ONLY);
        const cudaError_t end = cudaStreamEndCapture(stream, &graph);
        CHECK(st == SK_STATUS_SUCCESS, "captured (mode %d): %s", mode, sk_last_error());
        if (end != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
            CHECK(0, "capture (mode %d): %s", mode, cudaGetErrorName(end));
            goto done;
        }
        CHECK(gt_download(o2, d.o, ob) == 0, "download");
        CHECK(memcmp(o2, x.o, ob) == 0, "capturing ran the work (mode %d)", mode);
        for (int rep = 0; rep < 4; ++rep) {
            CHECK(gd_poison(&d, x.o, x.lse) == 0, "upload");
            CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess, "launch");
            CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
            CHECK(gt_download(o2, d.o, ob) == 0 && gt_download(l2, d.lse, lb) == 0, "download");
            CHECK(memcmp(o1, o2, ob) == 0 && memcmp(l1, l2, lb) == 0,
                  "mode %d: replay %d differs", mode, rep);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        exec = NULL;
        graph = NULL;
    }
done:
    if (exec != NULL) cudaGraphExecDestroy(exec);
    if (graph != NULL) cudaGraphDestroy(graph);
    if (stream != NULL) cudaStreamDestroy(stream);
    free(o1), free(o2), free(l1), free(l2);
    gd_free(&d);
    dc_data_free(&x);
}

SK_TEST(gpu_decode_bad_inputs) {
    dc_case c = fixed_case();
    c.num_splits = 4;
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 36000);
    dc_data x;
    gd_dev d;
    REQUIRE(dc_make(&c, &rng, &x), "out of memory");
    const size_t ob = (size_t)x.q_elems * 2;
    void *o = malloc(ob);
    if (o == NULL || gd_upload(&c, &x, &d) != 0) {
        CHECK(0, "setup");
    } else {
        sk_decode_desc desc = dc_desc(&c, &x, gt_opt.backend);
        size_t need = 0;
        CHECK(sk_decode_workspace_size(&desc, &d.layout, &need) == SK_STATUS_SUCCESS && need > 0,
              "workspace size %zu: %s", need, sk_last_error());
        d.ws = gt_device_alloc(need);
        CHECK(gd_poison(&d, x.o, x.lse) == 0, "upload");
        sk_status st = sk_decode_run(&desc, &d.layout, d.lens, d.table, d.q, d.k, d.v, d.o, d.lse,
                                     d.ws, need - 1, NULL);
        CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "small workspace: %s", sk_status_name(st));
        CHECK(strstr(sk_last_error(), "sk_decode_run") != NULL, "%s", sk_last_error());
        desc.head_dim = 96; /* valid, but not a CUDA decode size */
        st = sk_decode_workspace_size(&desc, &d.layout, &need);
        CHECK(st == SK_STATUS_NOT_SUPPORTED, "D = 96: %s", sk_status_name(st));
        CHECK(strstr(sk_last_error(), "head_dim = 96") != NULL, "%s", sk_last_error());
        CHECK(gt_sync() == 0 && gt_download(o, d.o, ob) == 0, "download");
        CHECK(memcmp(o, x.o, ob) == 0, "O was written by a refused call");
    }
    free(o);
    gd_free(&d);
    dc_data_free(&x);
}
