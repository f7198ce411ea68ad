/*
 * varlen_gpu.c - the GPU suite's machinery for the varlen and paged
 * forwards (varlen_gpu.h): a paged form of a varlen_case (shuffled,
 * shared, NaN-padded pages; garbage past each table row), device buffers,
 * plan / run calls, poisoning, and one checked case (two bitwise-equal
 * passes against the fp64 reference of tests/common/varlen_case.h).
 */
#include <limits.h>
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

void vg_report(const char *what, int before) {
    printf("    %s: %d cases (so far %d run, %d failed, %d declined)\n", what, vg_cases - before,
           vg_cases, vg_failed, vg_declined);
}

int vg_sm90_covers(const vc_case *c) {
    return (c->dtype == SK_DTYPE_F16 || c->dtype == SK_DTYPE_BF16) &&
           (c->head_dim == 64 || c->head_dim == 128) && c->bq == 128 && c->bk == 128 &&
           c->padded != 1;
}

int vg_declines(const vc_case *c) {
    return gt_opt.backend == SK_BACKEND_CUDA_SM90 && !vg_sm90_covers(c);
}

int vg_is_hopper(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        major == 9)
        return 1;
    printf("  skipped: the device is not compute capability 9.0\n");
    return 0;
}

void vg_blocks_for_backend(vc_case *c) {
    if (gt_opt.backend == SK_BACKEND_CUDA_SM90) c->bq = c->bk = 128;
}

/* The fields the varlen and paged descriptors share (d a pointer to
 * either; c the case, x its data). */
#define VG_DESC_COMMON(d, c, x)                                                                    \
    do {                                                                                           \
        (d)->backend = gt_opt.backend;                                                             \
        (d)->dtype = (c)->dtype;                                                                   \
        (d)->batch = (c)->batch;                                                                   \
        (d)->total_q = (x)->total_q;                                                               \
        vc_max_lengths((c), &(d)->max_seqlen_q, &(d)->max_seqlen_k);                               \
        (d)->heads_q = (c)->heads_q;                                                               \
        (d)->heads_kv = (c)->heads_kv;                                                             \
        (d)->head_dim = (c)->head_dim;                                                             \
        (d)->scale = (c)->scale;                                                                   \
        (d)->mask = (c)->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;                                   \
        (d)->q_strides[0] = (d)->o_strides[0] = (x)->ts_q;                                         \
        (d)->q_strides[1] = (d)->o_strides[1] = (x)->hs;                                           \
    } while (0)

/* The descriptors of a case (strides as varlen_case.c lays them out). */
void vg_varlen_desc(const vc_case *c, const vc_data *x, sk_attention_varlen_desc *d) {
    sk_attention_varlen_desc_init(d, sizeof *d);
    VG_DESC_COMMON(d, c, x);
    d->total_k = x->total_k;
    d->k_strides[0] = d->v_strides[0] = x->ts_k;
    d->k_strides[1] = d->v_strides[1] = x->hs;
}

void vg_paged_desc(const vc_case *c, const vc_data *x, const vg_paged *pg,
                   sk_attention_paged_desc *d) {
    sk_attention_paged_desc_init(d, sizeof *d);
    VG_DESC_COMMON(d, c, x);
    d->num_pages = pg->num_pages;
    d->page_size = pg->page_size;
    d->max_pages = pg->max_pages;
    d->page_table_stride = pg->table_stride;
    d->k_strides[0] = d->v_strides[0] = pg->ps;
    d->k_strides[1] = d->v_strides[1] = pg->ss;
    d->k_strides[2] = d->v_strides[2] = pg->hs;
}

/* ---------------------------------------------------------------------------
 * The paged form
 * ------------------------------------------------------------------------- */

void vg_paged_free(vg_paged *pg) {
    free(pg->table), free(pg->kc), free(pg->vc);
    memset(pg, 0, sizeof *pg);
}

/* Sequence 1 reads sequence 0's first `pages` pages: its first keys take
 * sequence 0's values (in x, where either reads them), so that one copy
 * serves both. */
static void vg_share_prefix(const vc_case *c, vc_data *x, int64_t keys) {
    const int64_t Hkv = c->heads_kv, D = c->head_dim;
    for (int64_t kk = 0; kk < keys; ++kk)
        for (int64_t hk = 0; hk < Hkv; ++hk)
            for (int64_t d = 0; d < D; ++d) {
                const int64_t b = (x->cu_k[1] + kk) * x->ts_k + hk * x->hs + d;
                const int64_t ad = (x->cu_k[0] + kk) * Hkv * D + hk * D + d;
                const int64_t bd = (x->cu_k[1] + kk) * Hkv * D + hk * D + d;
                x->kd[bd] = x->kd[ad];
                x->vd[bd] = x->vd[ad];
                if (!isnan(tu_load(x->k, c->dtype, b))) { /* sequence 1 reads it */
                    tu_store(x->k, c->dtype, b, (float)x->kd[ad]);
                    tu_store(x->v, c->dtype, b, (float)x->vd[ad]);
                }
            }
}

/* Pages for x's keys: shuffled, spare pages and slots NaN, garbage past
 * each table row's used entries; share: sequences 0 and 1 share their
 * first full pages (x is adjusted first). 0 when out of memory. */
int vg_paged_make(const vc_case *c, vc_data *x, int32_t page_size, int share, int padded,
                  struct tu_rng *rng, vg_paged *pg) {
    memset(pg, 0, sizeof *pg);
    const int64_t Hkv = c->heads_kv, D = c->head_dim;
    const size_t es = vc_elem_size(c->dtype);
    pg->page_size = page_size;
    int32_t np[VC_MAXB], shared = 0, used = 0, longest = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        pg->lens_k[b] = c->len_k[b];
        np[b] = (c->len_k[b] + page_size - 1) / page_size;
        used += np[b];
        if (np[b] > longest) longest = np[b];
    }
    if (share && c->batch >= 2) {
        const int32_t full0 = c->len_k[0] / page_size, full1 = c->len_k[1] / page_size;
        shared = full0 < full1 ? full0 : full1;
        if (shared > 2) shared = 2;
        if (shared > 0) vg_share_prefix(c, x, (int64_t)shared * page_size);
    }
    pg->num_pages = used - shared + (int32_t)tu_rng_range(rng, 1, 3);
    pg->max_pages = longest + (int32_t)tu_rng_range(rng, 0, 2);
    pg->table_stride = pg->max_pages + tu_rng_range(rng, 0, 3);
    pg->hs = padded ? D + 8 : D;
    pg->ss = Hkv * pg->hs + (padded ? 16 : 0);
    pg->ps = page_size * pg->ss + (padded ? 8 : 0);
    pg->cache_elems = pg->num_pages * pg->ps;
    int32_t *perm = (int32_t *)malloc((size_t)pg->num_pages * sizeof(int32_t));
    pg->table = (int32_t *)malloc((size_t)(c->batch * pg->table_stride) * sizeof(int32_t));
    pg->kc = malloc((size_t)pg->cache_elems * es);
    pg->vc = malloc((size_t)pg->cache_elems * es);
    if (!perm || !pg->table || !pg->kc || !pg->vc) {
        free(perm);
        return 0;
    }
    for (int32_t i = 0; i < pg->num_pages; ++i) perm[i] = i;
    for (int32_t i = pg->num_pages - 1; i > 0; --i) { /* Fisher-Yates */
        const int32_t j = (int32_t)tu_rng_range(rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    tu_fill_nan(pg->kc, c->dtype, pg->cache_elems);
    tu_fill_nan(pg->vc, c->dtype, pg->cache_elems);
    /* The last permuted page is always spare (NaN): garbage may name it. */
    const int32_t spare = perm[pg->num_pages - 1];
    int32_t next = 0;
    for (int32_t b = 0; b < c->batch; ++b) {
        int32_t *row = pg->table + b * pg->table_stride;
        for (int32_t j = 0; j < pg->table_stride; ++j) {
            if (j < np[b]) {
                row[j] = b == 1 && j < shared ? pg->table[j] : perm[next++];
                continue;
            }
            static const int32_t junk[4] = {-1, INT32_MIN, INT32_MAX, -7};
            const int64_t kind = tu_rng_range(rng, 0, 5);
            row[j] = kind < 4 ? junk[kind] : kind == 4 ? pg->num_pages + j : spare;
        }
        for (int64_t kk = 0; kk < c->len_k[b]; ++kk)
            for (int64_t hk = 0; hk < Hkv; ++hk)
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t from = (x->cu_k[b] + kk) * x->ts_k + hk * x->hs + d;
                    const int64_t to =
                        row[kk / page_size] * pg->ps + (kk % page_size) * pg->ss + hk * pg->hs + d;
                    /* A shared key: NaN where one sequence does not read it. */
                    const float kv = tu_load(x->k, c->dtype, from);
                    if (!isnan(kv) || isnan(tu_load(pg->kc, c->dtype, to))) {
                        tu_store(pg->kc, c->dtype, to, kv);
                        tu_store(pg->vc, c->dtype, to, tu_load(x->v, c->dtype, from));
                    }
                }
    }
    free(perm);
    return 1;
}

/* ---------------------------------------------------------------------------
 * Device buffers and runs
 * ------------------------------------------------------------------------- */

void vg_dev_free(vg_dev *g) {
    gt_device_free(g->q), gt_device_free(g->k), gt_device_free(g->v), gt_device_free(g->o);
    gt_device_free(g->ws), gt_device_free(g->lse);
    gt_device_free(g->cu_q), gt_device_free(g->cu_k), gt_device_free(g->lens_k);
    gt_device_free(g->table);
    gt_bsr_free_device(&g->layout);
    memset(g, 0, sizeof *g);
}

/* Upload the case (pg NULL: varlen) and size the workspace. 0 on success. */
int vg_dev_make(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g) {
    memset(g, 0, sizeof *g);
    const size_t es = vc_elem_size(c->dtype), cu = (size_t)(c->batch + 1) * sizeof(int32_t);
    g->o_bytes = (size_t)x->q_span * es;
    g->k_bytes = pg != NULL ? (size_t)pg->cache_elems * es : (size_t)x->k_span * es;
    g->q = gt_device_alloc(g->o_bytes);
    g->o = gt_device_alloc(g->o_bytes);
    g->k = gt_device_alloc(g->k_bytes);
    g->v = gt_device_alloc(g->k_bytes);
    g->lse = (float *)gt_device_alloc((size_t)(c->heads_q * x->total_q) * sizeof(float));
    g->cu_q = (int32_t *)gt_device_alloc(cu);
    g->cu_k = (int32_t *)gt_device_alloc(cu);
    if (!g->q || !g->o || !g->k || !g->v || !g->lse || !g->cu_q || !g->cu_k) return -1;
    if (gt_upload(g->q, x->q, g->o_bytes) || gt_upload(g->cu_q, x->cu_q, cu) ||
        gt_upload(g->cu_k, x->cu_k, cu) || gt_bsr_to_device(&x->layout, &g->layout))
        return -1;
    if (pg != NULL) {
        const size_t tb = (size_t)(c->batch * pg->table_stride) * sizeof(int32_t);
        g->lens_k = (int32_t *)gt_device_alloc((size_t)c->batch * sizeof(int32_t));
        g->table = (int32_t *)gt_device_alloc(tb);
        if (!g->lens_k || !g->table || gt_upload(g->k, pg->kc, g->k_bytes) ||
            gt_upload(g->v, pg->vc, g->k_bytes) ||
            gt_upload(g->lens_k, pg->lens_k, (size_t)c->batch * sizeof(int32_t)) ||
            gt_upload(g->table, pg->table, tb))
            return -1;
    } else if (gt_upload(g->k, x->k, g->k_bytes) || gt_upload(g->v, x->v, g->k_bytes)) {
        return -1;
    }
    sk_status st;
    if (pg != NULL) {
        sk_attention_paged_desc d;
        vg_paged_desc(c, x, pg, &d);
        st = sk_attention_paged_workspace_size(&d, &g->layout, &g->ws_bytes);
    } else {
        sk_attention_varlen_desc d;
        vg_varlen_desc(c, x, &d);
        st = sk_attention_varlen_workspace_size(&d, &g->layout, &g->ws_bytes);
    }
    if (vg_declines(c)) {
        /* The forced Hopper backend must decline what it does not cover,
         * already at the workspace size. */
        if (st == SK_STATUS_NOT_SUPPORTED) return 1;
        printf("    expected SK_STATUS_NOT_SUPPORTED from the forced sm90 backend, got %s\n",
               sk_status_name(st));
        return -1;
    }
    if (st != SK_STATUS_SUCCESS) return -1;
    g->ws = gt_device_alloc(g->ws_bytes);
    return g->ws != NULL ? 0 : -1;
}

/* The plan, or the run, of a case on the device buffers. */
sk_status vg_plan(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g,
                  cudaStream_t s) {
    if (pg != NULL) {
        sk_attention_paged_desc d;
        vg_paged_desc(c, x, pg, &d);
        return sk_attention_paged_plan(&d, &g->layout, g->cu_q, g->lens_k, g->table, g->ws,
                                       g->ws_bytes, s);
    }
    sk_attention_varlen_desc d;
    vg_varlen_desc(c, x, &d);
    return sk_attention_varlen_plan(&d, &g->layout, g->cu_q, g->cu_k, g->ws, g->ws_bytes, s);
}

sk_status vg_run(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g, cudaStream_t s,
                 int one_shot) {
    float *lse = c->with_lse ? g->lse : NULL;
    if (pg != NULL) {
        sk_attention_paged_desc d;
        vg_paged_desc(c, x, pg, &d);
        return (one_shot ? sk_attention_paged_forward : sk_attention_paged_run)(
            &d, &g->layout, g->cu_q, g->lens_k, g->table, g->q, g->k, g->v, g->o, lse, g->ws,
            g->ws_bytes, s);
    }
    sk_attention_varlen_desc d;
    vg_varlen_desc(c, x, &d);
    return (one_shot ? sk_attention_varlen_forward : sk_attention_varlen_run)(
        &d, &g->layout, g->cu_q, g->cu_k, g->q, g->k, g->v, g->o, lse, g->ws, g->ws_bytes, s);
}

/* O and LSE back to NaN (o_nan: the host NaN image of O); ws: the
 * workspace to garbage too (not between a plan and the run that uses it). */
int vg_poison(const vc_case *c, const vc_data *x, vg_dev *g, const void *o_nan,
              const float *lse_nan, int ws) {
    return gt_upload(g->o, o_nan, g->o_bytes) ||
           gt_upload(g->lse, lse_nan, (size_t)(c->heads_q * x->total_q) * sizeof(float)) ||
           (ws && cudaMemset(g->ws, 0xa5, g->ws_bytes) != cudaSuccess);
}

/* One GPU pass of c->call's form: one-shot, plan + run, or (VC_RUN) a
 * plan, then a run with the plan of the previous pass reused. */
sk_status vg_pass(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g, int pass) {
    sk_status st = SK_STATUS_SUCCESS;
    if (c->call == VC_FORWARD) return vg_run(c, x, pg, g, NULL, 1);
    if (c->call == VC_PLAN_RUN || pass == 0) st = vg_plan(c, x, pg, g, NULL);
    return st != SK_STATUS_SUCCESS ? st : vg_run(c, x, pg, g, NULL, 0);
}

int vg_cases, vg_failed, vg_declined;

/* Run c (paged when pg != NULL) twice from poisoned outputs, compare the
 * two bitwise and the first with the reference. 0 when it passed. */
int vg_check(const vc_case *c, vc_data *x, const vg_paged *pg, const char *label) {
    const int failures = sk_test_failures();
    vg_dev g;
    const int made = vg_dev_make(c, x, pg, &g);
    const size_t lse_bytes = (size_t)(c->heads_q * x->total_q) * sizeof(float);
    void *o_nan = malloc(g.o_bytes > 0 ? g.o_bytes : 1), *o2 = malloc(g.o_bytes + 1);
    float *lse_nan = (float *)malloc(lse_bytes), *lse2 = (float *)malloc(lse_bytes);
    ++vg_cases;
    CHECK(c->kernel_rules, "%s: a GPU case needs vc_case.kernel_rules (varlen_case.h)", label);
    if (made == 1) { /* the forced Hopper backend declines */
        ++vg_declined;
        goto done;
    }
    if (made != 0 || !o_nan || !o2 || !lse_nan || !lse2) {
        CHECK(0, "%s device setup failed: %s", label, sk_last_error());
        goto done;
    }
    memcpy(o_nan, x->o, g.o_bytes);
    memcpy(lse_nan, x->lse, lse_bytes);
    for (int pass = 0; pass < 2; ++pass) {
        if (vg_poison(c, x, &g, o_nan, lse_nan, c->call != VC_RUN || pass == 0) != 0) {
            CHECK(0, "%s poison upload failed", label);
            goto done;
        }
        const sk_status st = vg_pass(c, x, pg, &g, pass);
        const int synced = gt_sync();
        if (st != SK_STATUS_SUCCESS || synced != 0) {
            CHECK(0, "%s pass %d: %s %s (sync %d)", label, pass, sk_status_name(st),
                  sk_last_error(), synced);
            goto done;
        }
        void *o = pass == 0 ? x->o : o2;
        float *lse = pass == 0 ? x->lse : lse2;
        if (gt_download(o, g.o, g.o_bytes) || gt_download(lse, g.lse, lse_bytes)) {
            CHECK(0, "%s download failed", label);
            goto done;
        }
    }
    CHECK(memcmp(x->o, o2, g.o_bytes) == 0, "%s two runs differ in O (not bitwise)", label);
    CHECK(memcmp(x->lse, lse2, lse_bytes) == 0, "%s two runs differ in LSE (not bitwise)", label);
    {
        vc_outcome out;
        memset(&out, 0, sizeof out);
        vc_compare_reference(c, x, label, &out);
    }
done:
    free(o_nan), free(o2), free(lse_nan), free(lse2);
    vg_dev_free(&g);
    const int bad = sk_test_failures() != failures;
    vg_failed += bad;
    return bad;
}
