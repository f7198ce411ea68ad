/*
 * test_attention_varlen_sm90_gpu.c - the Hopper varlen and paged attention
 * kernel (src/cuda/attention/fwd_sm90_varlen.cu) against the naive fp64
 * reference, through its test entry (varlen_sm90.h: the GPU plan, the
 * counter reset and the launch), the kernel alone; the public calls
 * (varlen.cu's dispatch, which chooses it under --backend sm90 and cuda on
 * compute capability 9.0) are tested by test_attention_varlen_gpu.c.
 *
 * Cases come from tests/common/varlen_case.h: seeded lengths (empty
 * sequences, a single token, tails, several blocks), per-sequence block
 * masks, NaN in every key no query may read (in the packed K/V, so the
 * tokens right after a sequence's tail are often NaN) and in O and LSE
 * before each run. Paged cases place the same keys in a cache of shuffled
 * pages (every page size, padded strides, pages shared by two sequences,
 * NaN in unused slots and pages, garbage in the table past each row's
 * pages), so both forms compare with the same reference. Every case runs
 * twice; the two results must agree bit for bit. Failures name the seed,
 * the case and the first mismatches with their indices.
 *
 *   build/sk_gpu_tests varlen_sm90          (all of them)
 *   SPARSEK_TEST_SEED=N build/sk_gpu_tests varlen_sm90_paged
 *
 * Skipped (with a line saying so) on a device other than compute
 * capability 9.0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/varlen_case.h"
#include "core/problem.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"
#include "gpu/varlen_gpu.h"
#include "sparsek.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include "cuda/attention/varlen_sm90.h"
#pragma GCC diagnostic pop

/* The paged form of a case: page size, cache strides, and how the table is
 * dressed. */
typedef struct vs_paged {
    int32_t page_size;
    int padded;      /* slot and page strides with gaps */
    int shared;      /* sequence 1 shares sequence 0's first page */
    int spare_pages; /* unused pages (NaN) */
    int holes;       /* pages whose keys no query reads get an index out of range */
} vs_paged;

/* Device copies of a case. */
typedef struct vs_dev {
    void *q, *k, *v, *o, *ws;
    float *lse;
    int32_t *off, *idx, *cu_q, *cu_k, *lens_k, *table;
    size_t ws_bytes;
} vs_dev;

static void vs_dev_free(vs_dev *d) {
    gt_device_free(d->q), gt_device_free(d->k), gt_device_free(d->v), gt_device_free(d->o);
    gt_device_free(d->ws), gt_device_free(d->lse), gt_device_free(d->off);
    gt_device_free(d->idx), gt_device_free(d->cu_q), gt_device_free(d->cu_k);
    gt_device_free(d->lens_k), gt_device_free(d->table);
    memset(d, 0, sizeof *d);
}

static void *vs_upload(const void *src, size_t bytes) {
    void *d = gt_device_alloc(bytes);
    if (d != NULL && gt_upload(d, src, bytes) != 0) {
        gt_device_free(d);
        return NULL;
    }
    return d;
}

/* The checked problem the core would hand the backend (src/core/
 * attention_varlen.c), written out for packed Q/O and K/V. */
static void vs_problem(const vc_case *c, const vc_data *x, const vs_dev *d,
                       sk_attention_varlen_problem *vp) {
    memset(vp, 0, sizeof *vp);
    sk_attention_problem *f = &vp->flat;
    int64_t max_q, max_k;
    vc_max_lengths(c, &max_q, &max_k);
    f->backend = SK_BACKEND_CUDA_SM90;
    f->dtype = c->dtype;
    f->batch = 1;
    f->seq_q = x->total_q;
    f->seq_k = x->total_k;
    f->heads_q = c->heads_q;
    f->heads_kv = c->heads_kv;
    f->head_dim = c->head_dim;
    f->scale = c->scale != 0.0f ? c->scale : (float)(1.0 / sqrt((double)c->head_dim));
    f->causal = c->causal;
    f->q_stride[1] = f->o_stride[1] = x->ts_q;
    f->k_stride[1] = f->v_stride[1] = x->ts_k;
    f->q_stride[2] = f->o_stride[2] = f->k_stride[2] = f->v_stride[2] = x->hs;
    f->group = (int32_t)(c->heads_q / c->heads_kv);
    f->block_q = c->bq;
    f->block_k = c->bk;
    f->row_blocks = f->slice_rows = (int32_t)x->R;
    f->col_blocks = (int32_t)((x->layout.grid.cols + c->bk - 1) / c->bk);
    f->layout_batch = 1;
    f->layout_heads = c->layout_heads;
    f->head_div = c->layout_heads == 1 ? (int32_t)c->heads_q
                  : c->layout_heads == c->heads_q ? 1
                                                  : f->group;
    f->nnz = x->layout.nnz;
    f->row_offsets = d->off;
    f->col_indices = d->idx;
    f->lse_head_stride = x->total_q;
    f->q = d->q, f->k = d->k, f->v = d->v, f->o = d->o;
    f->lse = c->with_lse ? d->lse : NULL;
    vp->batch = c->batch;
    vp->max_seqlen_q = max_q;
    vp->max_seqlen_k = max_k;
    vp->cu_seqlens_q = d->cu_q;
    vp->cu_seqlens_k = d->cu_k;
}

/* Sequence 1 takes sequence 0's first page_size keys (values drawn here,
 * finite, in both), so that the paged form may share that page. */
static int vs_share_prefix(const vc_case *c, vc_data *x, tu_rng *rng, int32_t ps) {
    if (c->batch < 2 || c->len_k[0] < ps || c->len_k[1] < ps) return 0;
    const int64_t Hkv = c->heads_kv, D = c->head_dim;
    for (int64_t s = 0; s < ps; ++s)
        for (int64_t hk = 0; hk < Hkv; ++hk)
            for (int64_t dd = 0; dd < D; ++dd) {
                const float kv = (float)tu_rng_normal(rng), vv = (float)tu_rng_normal(rng);
                for (int b = 0; b < 2; ++b) {
                    const int64_t t = x->cu_k[b] + s, at = t * x->ts_k + hk * x->hs + dd;
                    tu_store(x->k, c->dtype, at, kv);
                    tu_store(x->v, c->dtype, at, vv);
                    x->kd[(t * Hkv + hk) * D + dd] = tu_load(x->k, c->dtype, at);
                    x->vd[(t * Hkv + hk) * D + dd] = tu_load(x->v, c->dtype, at);
                }
            }
    return 1;
}

/* Whether every key of page pg of sequence b is NaN in x (no query of any
 * head reads it: varlen_case.h), so that the page may be absent. */
static int vs_page_unread(const vc_case *c, const vc_data *x, int64_t b, int64_t pg, int32_t ps) {
    for (int64_t s = pg * ps; s < (pg + 1) * ps && s < c->len_k[b]; ++s)
        for (int64_t hk = 0; hk < c->heads_kv; ++hk)
            if (!isnan(tu_load(x->k, c->dtype, (x->cu_k[b] + s) * x->ts_k + hk * x->hs))) return 0;
    return 1;
}

/* The paged problem over caches built from x's packed K/V: every
 * sequence's pages drawn from a shuffled pool, NaN in unused slots and
 * pages, garbage in each table row past the pages the sequence needs, and
 * (holes) an out-of-range index for pages no query reads: the kernel must
 * mask those keys and never load them (a visited block then has boxes
 * missing: the expected-bytes and V-zeroing path). */
static int vs_paged_setup(const vc_case *c, vc_data *x, const vs_paged *pc, tu_rng *rng,
                          vs_dev *d, sk_attention_paged_problem *pp, int *holes) {
    const int32_t ps = pc->page_size;
    const int64_t Hkv = c->heads_kv, D = c->head_dim, B = c->batch;
    const size_t es = vc_elem_size(c->dtype);
    const int shared = pc->shared && vs_share_prefix(c, x, rng, ps);
    int64_t max_q, max_k;
    vc_max_lengths(c, &max_q, &max_k);
    const int32_t max_pages = (int32_t)((max_k + ps - 1) / ps) + 1;
    const int64_t tstride = max_pages + 2;
    int64_t need = 0;
    for (int64_t b = 0; b < B; ++b) need += (c->len_k[b] + ps - 1) / ps;
    const int64_t num_pages = need + pc->spare_pages + 1;
    const int64_t hs = pc->padded ? D + 8 : D;
    const int64_t ss = pc->padded ? Hkv * hs + 16 : Hkv * D;
    const int64_t pgs = pc->padded ? ps * ss + 64 : ps * ss;
    const int64_t span = num_pages * pgs;
    void *kc = malloc((size_t)span * es), *vcache = malloc((size_t)span * es);
    int32_t *table = (int32_t *)malloc((size_t)(B * tstride) * sizeof(int32_t));
    int32_t *perm = (int32_t *)malloc((size_t)num_pages * sizeof(int32_t));
    int32_t lens[VC_MAXB];
    int ok = kc && vcache && table && perm;
    if (ok) {
        tu_fill_nan(kc, c->dtype, span);
        tu_fill_nan(vcache, c->dtype, span);
        for (int64_t i = 0; i < num_pages; ++i) perm[i] = (int32_t)i;
        for (int64_t i = num_pages - 1; i > 0; --i) {
            const int64_t j = tu_rng_range(rng, 0, i);
            const int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        int64_t next = 0;
        static const int32_t garbage[4] = {-1, 0x7fffffff, -100000, 0};
        for (int64_t b = 0; b < B; ++b) {
            lens[b] = c->len_k[b];
            const int64_t np = (c->len_k[b] + ps - 1) / ps;
            for (int64_t e = 0; e < tstride; ++e) /* past the row's pages: garbage */
                table[b * tstride + e] = garbage[e % 4] + (garbage[e % 4] == 0 ? (int32_t)num_pages : 0);
            for (int64_t pg = 0; pg < np; ++pg) {
                if (pc->holes && vs_page_unread(c, x, b, pg, ps)) {
                    table[b * tstride + pg] = (pg & 1) ? -7 : (int32_t)num_pages + (int32_t)pg;
                    ++*holes;
                    continue;
                }
                const int32_t page = shared && b == 1 && pg == 0 ? table[0] : perm[next++];
                table[b * tstride + pg] = page;
                for (int64_t s = 0; s < ps && pg * ps + s < c->len_k[b]; ++s)
                    for (int64_t hk = 0; hk < Hkv; ++hk)
                        for (int64_t dd = 0; dd < D; ++dd) {
                            const int64_t from = (x->cu_k[b] + pg * ps + s) * x->ts_k + hk * x->hs + dd;
                            const int64_t to = page * pgs + s * ss + hk * hs + dd;
                            tu_store(kc, c->dtype, to, tu_load(x->k, c->dtype, from));
                            tu_store(vcache, c->dtype, to, tu_load(x->v, c->dtype, from));
                        }
            }
        }
        d->k = vs_upload(kc, (size_t)span * es);
        d->v = vs_upload(vcache, (size_t)span * es);
        d->table = (int32_t *)vs_upload(table, (size_t)(B * tstride) * sizeof(int32_t));
        d->lens_k = (int32_t *)vs_upload(lens, (size_t)B * sizeof(int32_t));
        ok = d->k && d->v && d->table && d->lens_k;
    }
    free(kc), free(vcache), free(table), free(perm);
    if (!ok) return 0;
    sk_attention_problem *f = &pp->v.flat;
    f->seq_k = num_pages * ps;
    f->k_stride[0] = f->v_stride[0] = pgs;
    f->k_stride[1] = f->v_stride[1] = ss;
    f->k_stride[2] = f->v_stride[2] = hs;
    f->k = d->k, f->v = d->v;
    pp->v.cu_seqlens_k = NULL;
    pp->seq_lens_k = d->lens_k;
    pp->page_table = d->table;
    pp->num_pages = num_pages;
    pp->page_table_stride = tstride;
    pp->page_size = ps;
    pp->max_pages = max_pages;
    return 1;
}

/* First differing bytes of two runs, by element. */
static int64_t vs_first_diff(const void *a, const void *b, size_t bytes, size_t es) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < bytes; ++i)
        if (x[i] != y[i]) return (int64_t)(i / es);
    return -1;
}

/* One case: upload, run twice (outputs NaN first), compare. pc NULL:
 * varlen. Returns 0 when it passed. */
static int vs_run_case(const vc_case *c, const vs_paged *pc, uint64_t seed) {
    char label[512];
    vc_label(c, seed, label, sizeof label);
    if (pc != NULL) {
        const size_t n = strlen(label);
        snprintf(label + n, sizeof label - n, " paged ps=%d padded=%d shared=%d spare=%d holes=%d]",
                 (int)pc->page_size, pc->padded, pc->shared, pc->spare_pages, pc->holes);
    }
    /* The guard vg_check has: a case compared without the kernels' rules
     * fails on P rounding alone (the first H200 run of this file). */
    CHECK(c->kernel_rules, "%s: a GPU case needs vc_case.kernel_rules (varlen_case.h)", label);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    vs_dev d;
    memset(&d, 0, sizeof d);
    int bad = 0;
    if (!vc_make(c, &rng, &x)) {
        CHECK(0, "%s out of host memory", label);
        vc_data_free(&x);
        return 1;
    }
    const size_t es = vc_elem_size(c->dtype);
    const size_t o_bytes = (size_t)x.q_span * es, lse_bytes = (size_t)(c->heads_q * x.total_q) * 4;
    const int64_t rows = (int64_t)c->layout_heads * x.R;
    sk_attention_paged_problem pp;
    memset(&pp, 0, sizeof pp);
    d.q = vs_upload(x.q, o_bytes);
    d.o = gt_device_alloc(o_bytes);
    d.lse = (float *)gt_device_alloc(lse_bytes);
    d.off = (int32_t *)vs_upload(x.layout.row_offsets, (size_t)(rows + 1) * 4);
    d.idx = (int32_t *)vs_upload(x.layout.col_indices, (size_t)(x.layout.nnz + 1) * 4);
    d.cu_q = (int32_t *)vs_upload(x.cu_q, (size_t)(c->batch + 1) * 4);
    d.cu_k = (int32_t *)vs_upload(x.cu_k, (size_t)(c->batch + 1) * 4);
    int ok = d.q && d.o && d.lse && d.off && d.idx && d.cu_q && d.cu_k;
    if (ok && pc == NULL) {
        d.k = vs_upload(x.k, (size_t)x.k_span * es);
        d.v = vs_upload(x.v, (size_t)x.k_span * es);
        ok = d.k && d.v;
    }
    vs_problem(c, &x, &d, &pp.v);
    int holes = 0;
    if (ok && pc != NULL) ok = vs_paged_setup(c, &x, pc, &rng, &d, &pp, &holes);
    const sk_attention_paged_problem *pg = pc != NULL ? &pp : NULL;
    if (ok) ok = sk_attention_sm90_varlen_test_workspace(&pp.v, &d.ws_bytes) == SK_STATUS_SUCCESS;
    if (ok) ok = (d.ws = gt_device_alloc(d.ws_bytes + 256)) != NULL;
    void *o_first = malloc(o_bytes);
    float *lse_first = (float *)malloc(lse_bytes);
    void *o_nan = malloc(o_bytes);
    float *lse_nan = (float *)malloc(lse_bytes);
    if (!ok || !o_first || !lse_first || !o_nan || !lse_nan) {
        CHECK(0, "%s setup failed (memory, upload or workspace size)", label);
        bad = 1;
        goto done;
    }
    memcpy(o_nan, x.o, o_bytes); /* vc_make filled O and LSE with NaN */
    memcpy(lse_nan, x.lse, lse_bytes);
    for (int run = 0; run < 2 && !bad; ++run) {
        /* Misaligned workspace on the second run: the plan aligns it. */
        void *ws = (char *)d.ws + (run == 1 ? 8 : 0);
        if (gt_upload(d.o, o_nan, o_bytes) != 0 || gt_upload(d.lse, lse_nan, lse_bytes) != 0) {
            CHECK(0, "%s upload failed", label);
            bad = 1;
            break;
        }
        const sk_status st = sk_attention_sm90_varlen_test_run(&pp.v, pg, ws, d.ws_bytes + 248, NULL);
        const cudaError_t ce = cudaDeviceSynchronize();
        if (st != SK_STATUS_SUCCESS || ce != cudaSuccess) {
            CHECK(0, "%s run %d: status %s (%s), CUDA %s", label, run, sk_status_name(st),
                  sk_last_error(), cudaGetErrorString(ce));
            bad = 1;
            break;
        }
        if (gt_download(x.o, d.o, o_bytes) != 0 || gt_download(x.lse, d.lse, lse_bytes) != 0) {
            CHECK(0, "%s download failed", label);
            bad = 1;
            break;
        }
        if (run == 0) {
            vc_outcome out;
            memset(&out, 0, sizeof out);
            bad = vc_compare_reference(c, &x, label, &out) != 0;
            memcpy(o_first, x.o, o_bytes);
            memcpy(lse_first, x.lse, lse_bytes);
        } else {
            const int64_t eo = vs_first_diff(o_first, x.o, o_bytes, es);
            const int64_t el = vs_first_diff(lse_first, x.lse, lse_bytes, 4);
            CHECK(eo < 0 && el < 0,
                  "%s second run differs: first O element %lld (token %lld), first LSE %lld",
                  label, (long long)eo, (long long)(eo < 0 ? -1 : eo / x.ts_q), (long long)el);
            bad = eo >= 0 || el >= 0;
        }
    }
done:
    if (bad) printf("  failed case: %s (%d pages absent)\n", label, holes);
    free(o_first), free(lse_first), free(o_nan), free(lse_nan);
    vs_dev_free(&d);
    vc_data_free(&x);
    return bad;
}

/* A case the Hopper kernel covers: blocks 128, D 64 / 128, F16 / BF16,
 * packed tensors; lengths from empty to several blocks, GQA 1 / 4 / 8. */
static vc_case vs_random_case(tu_rng *rng, int32_t max_len) {
    int32_t lq[VC_MAXB], lk[VC_MAXB];
    const int32_t batch = (int32_t)tu_rng_range(rng, 1, 7);
    int64_t tq = 0, tk = 0;
    for (int32_t b = 0; b < batch; ++b) {
        const int64_t kind = tu_rng_range(rng, 0, 9);
        lk[b] = (int32_t)(kind == 0 ? 0 : kind == 1 ? 1 : tu_rng_range(rng, 1, max_len));
        /* q_len <= k_len mostly (chunked prefill), now and then longer. */
        lq[b] = (int32_t)(kind == 2   ? 0
                          : kind == 3 ? tu_rng_range(rng, 1, max_len)
                                      : tu_rng_range(rng, lk[b] > 0 ? 1 : 0, lk[b]));
        tq += lq[b], tk += lk[b];
    }
    if (tq == 0) lq[0] = 1;
    if (tk == 0) lk[batch - 1] = 1;
    vc_case c = vc_base_case(tu_rng_range(rng, 0, 1) ? SK_DTYPE_BF16 : SK_DTYPE_F16, batch, lq, lk);
    static const int64_t groups[3] = {1, 4, 8};
    c.heads_kv = tu_rng_range(rng, 1, 2);
    c.heads_q = c.heads_kv * groups[tu_rng_range(rng, 0, 2)];
    c.head_dim = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c.bq = c.bk = 128;
    c.causal = (int)tu_rng_range(rng, 0, 1);
    c.density = tu_rng_range(rng, 0, 3) == 0 ? 1.0 : 0.3 + 0.6 * tu_rng_uniform(rng);
    const int64_t lh = tu_rng_range(rng, 0, 2);
    c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? c.heads_kv : c.heads_q);
    c.with_lse = tu_rng_range(rng, 0, 4) != 0;
    c.extra_rows = (int32_t)(tu_rng_range(rng, 0, 2) == 0 ? tu_rng_range(rng, 1, 3) : 0);
    c.scale = tu_rng_range(rng, 0, 3) == 0 ? -0.07f : 0.0f;
    c.kernel_rules = 1; /* the GPU suite's rules (varlen_case.h) */
    return c;
}

/* A fixed-shape case of variant v: dtype (bit 0) and head dim (bit 1). */
static vc_case vs_fixed_case(int v, int32_t batch, const int32_t *lq, const int32_t *lk, int causal,
                             int64_t heads_kv, int64_t heads_q, int32_t layout_heads,
                             double density) {
    vc_case c = vc_base_case(v & 1 ? SK_DTYPE_BF16 : SK_DTYPE_F16, batch, lq, lk);
    c.head_dim = v & 2 ? 128 : 64;
    c.bq = c.bk = 128;
    c.causal = causal;
    c.heads_kv = heads_kv;
    c.heads_q = heads_q;
    c.layout_heads = layout_heads;
    c.density = density;
    c.kernel_rules = 1; /* the GPU suite's rules (varlen_case.h) */
    return c;
}

/* 80 seeded random cases, varlen or paged (page sizes in turn, padded
 * strides, a shared page, spare pages at random); *run and *failed count
 * them (the loop stops after 3 failures). */
static void vs_random_cases(int paged, uint64_t salt, int *run, int *failed) {
    static const int32_t sizes[4] = {16, 32, 64, 128};
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ salt);
    for (int n = 0; n < 80 && *failed < 3; ++n, ++*run) {
        const uint64_t seed = tu_rng_next(&rng);
        tu_rng draw;
        tu_rng_seed(&draw, seed);
        const vc_case c = vs_random_case(&draw, n < 60 ? 400 : 900);
        vs_paged pc;
        pc.page_size = sizes[n % 4];
        pc.padded = (int)tu_rng_range(&draw, 0, 1);
        pc.shared = (int)tu_rng_range(&draw, 0, 1);
        pc.spare_pages = (int)tu_rng_range(&draw, 0, 4);
        pc.holes = (int)tu_rng_range(&draw, 0, 1);
        *failed += vs_run_case(&c, paged ? &pc : NULL, seed);
    }
}

SK_TEST(varlen_sm90_varlen_cases) {
    if (!vg_is_hopper()) return;
    int failed = 0, run = 0;
    vs_random_cases(0, 0x5390a11eull, &run, &failed);
    /* Fixed shapes: a tail in the middle of the packed tensors followed by
     * a sequence no query reads (NaN keys), each dtype and head dim. */
    static const int32_t lq[4] = {130, 0, 257, 64}, lk[4] = {200, 300, 257, 1000};
    for (int v = 0; v < 8 && failed < 3; ++v, ++run) {
        const vc_case c = vs_fixed_case(v, 4, lq, lk, (v >> 2) & 1, 2, 8, 8, 0.7);
        failed += vs_run_case(&c, NULL, 1000 + (uint64_t)v);
    }
    printf("  %d varlen cases, %d failed\n", run, failed);
}

SK_TEST(varlen_sm90_paged_cases) {
    if (!vg_is_hopper()) return;
    int failed = 0, run = 0;
    vs_random_cases(1, 0x9a9edull, &run, &failed);
    /* Chunked prefill: few new tokens over a long cached context, causal. */
    static const int32_t lq[3] = {100, 1, 300}, lk[3] = {1500, 777, 2100};
    for (int v = 0; v < 8 && failed < 3; ++v, ++run) {
        const vc_case c = vs_fixed_case(v, 3, lq, lk, 1, 1, 4, 1, 0.8);
        const vs_paged pc = {16 << (v % 4), v >= 4, 1, 2, v & 1};
        failed += vs_run_case(&c, &pc, 2000 + (uint64_t)v);
    }
    printf("  %d paged cases, %d failed\n", run, failed);
}

/* Long rows (up to 32 visited blocks per tile, a tail block in each
 * sequence, many tiles per CTA): the TMA warp reads each block's pages one
 * block ahead of its K load and two ahead of its V load, passing them from
 * block to block in registers (fwd_sm90_producer.cuh); a page or absent
 * mask handed to the wrong block reads other keys, or NaN slots, and fails
 * here. Every dtype / head dim with page sizes 16 and 32 (8 and 4 boxes
 * per block), causal and not, padded strides, holes. */
SK_TEST(varlen_sm90_paged_long_rows) {
    if (!vg_is_hopper()) return;
    int failed = 0, run = 0;
    static const int32_t lq[3] = {300, 0, 64}, lk[3] = {4000, 333, 2600};
    for (int v = 0; v < 8 && failed < 3; ++v, ++run) {
        const vc_case c = vs_fixed_case(v, 3, lq, lk, (v >> 2) & 1, 1, 4, 1, 0.9);
        /* Page size by the parity of v: each dtype, head dim and causal
         * choice meets both sizes. */
        const vs_paged pc = {((v ^ v >> 1 ^ v >> 2) & 1) ? 32 : 16, (v >> 1) & 1, 0, 3, 1};
        failed += vs_run_case(&c, &pc, 3000 + (uint64_t)v);
    }
    printf("  %d paged long-row cases, %d failed\n", run, failed);
}

/* Milliseconds per call of fn over `reps` calls (after one warm-up). */
typedef int (*vs_call_fn)(void *ctx);
static double vs_time_ms(vs_call_fn fn, void *ctx, int reps) {
    cudaEvent_t e0, e1;
    float ms = -1.0f;
    if (fn(ctx) != 0 || cudaEventCreate(&e0) != cudaSuccess) return -1.0;
    if (cudaEventCreate(&e1) == cudaSuccess) {
        cudaEventRecord(e0, NULL);
        int ok = 1;
        for (int r = 0; r < reps && ok; ++r) ok = fn(ctx) == 0;
        cudaEventRecord(e1, NULL);
        if (ok && cudaEventSynchronize(e1) == cudaSuccess) cudaEventElapsedTime(&ms, e0, e1);
        cudaEventDestroy(e1);
    }
    cudaEventDestroy(e0);
    return ms < 0.0f ? -1.0 : (double)ms / reps;
}

/* The Hopper varlen (or paged) call of a case: plan + launch. */
typedef struct vs_varlen_call {
    const sk_attention_paged_problem *pp;
    int paged;
    vs_dev *d;
} vs_varlen_call;
static int vs_varlen_once(void *ctx) {
    const vs_varlen_call *v = (const vs_varlen_call *)ctx;
    return sk_attention_sm90_varlen_test_run(&v->pp->v, v->paged ? v->pp : NULL, v->d->ws,
                                             v->d->ws_bytes, NULL) == SK_STATUS_SUCCESS
               ? 0
               : -1;
}

/* The fixed-batch Hopper forward (public API, SK_BACKEND_CUDA_SM90). */
typedef struct vs_fixed_call {
    sk_attention_desc desc;
    sk_bsr layout;
    const void *q, *k, *v;
    void *o, *ws;
    float *lse;
    size_t ws_bytes;
} vs_fixed_call;
static int vs_fixed_once(void *ctx) {
    const vs_fixed_call *f = (const vs_fixed_call *)ctx;
    return sk_attention_forward(&f->desc, &f->layout, f->q, f->k, f->v, f->o, f->lse, f->ws,
                                f->ws_bytes, NULL) == SK_STATUS_SUCCESS
               ? 0
               : -1;
}

/* O and LSE of a run, downloaded. */
static int vs_fetch(const vs_dev *d, void *o, size_t o_bytes, float *lse, size_t lse_bytes) {
    return cudaDeviceSynchronize() == cudaSuccess && gt_download(o, d->o, o_bytes) == 0 &&
           gt_download(lse, d->lse, lse_bytes) == 0;
}

/* B equal sequences of L tokens (a tail of 80): the varlen kernel must
 * equal the fixed-batch Hopper kernel bit for bit (same tiles, blocks,
 * masks; the rows past each sequence are masked and zeroed in both), and
 * the paged kernel (page sizes 16, 32, 64, 128, shuffled pages) the varlen one.
 * Prints the times of the three (plan included): the ratios at a
 * small scale (B 8, L 2000, Hq 16 / Hkv 2, D 128, bf16, causal, half the
 * blocks). */
SK_TEST(varlen_sm90_same_as_fixed_and_paged) {
    if (!vg_is_hopper()) return;
    enum { B = 8, L = 2000 };
    int32_t lens[B];
    for (int b = 0; b < B; ++b) lens[b] = L;
    vc_case c = vs_fixed_case(1 | 2, B, lens, lens, 1, 2, 16, 2, 0.5);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xf1dedull);
    vc_data x;
    vs_dev d;
    memset(&d, 0, sizeof d);
    REQUIRE(vc_make(&c, &rng, &x), "out of host memory");
    const size_t o_bytes = (size_t)x.q_span * 2, lse_bytes = (size_t)(c.heads_q * x.total_q) * 4;
    const int64_t LH = c.layout_heads, RB = (L + 127) / 128, rows = LH * x.R;
    /* The fixed layout: slice b * LH + s, row i = varlen row s * R + b * RB + i. */
    int32_t *foff = (int32_t *)malloc((size_t)(B * LH * RB + 1) * 4);
    int32_t *fidx = (int32_t *)malloc((size_t)(x.layout.nnz + 1) * 4);
    void *o1 = malloc(o_bytes), *o2 = malloc(o_bytes);
    float *l1 = (float *)malloc(lse_bytes), *l2 = (float *)malloc(lse_bytes);
    int32_t *dfoff = NULL, *dfidx = NULL;
    vs_fixed_call fx;
    memset(&fx, 0, sizeof fx);
    sk_attention_paged_problem pp;
    memset(&pp, 0, sizeof pp);
    int ok = foff && fidx && o1 && o2 && l1 && l2;
    if (ok) {
        int32_t n = 0;
        foff[0] = 0;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t sl = 0; sl < LH; ++sl)
                for (int64_t i = 0; i < RB; ++i) {
                    const int64_t g = sl * x.R + b * RB + i;
                    for (int32_t e = x.layout.row_offsets[g]; e < x.layout.row_offsets[g + 1]; ++e)
                        fidx[n++] = x.layout.col_indices[e];
                    foff[(b * LH + sl) * RB + i + 1] = n;
                }
        d.q = vs_upload(x.q, o_bytes);
        d.k = vs_upload(x.k, (size_t)x.k_span * 2);
        d.v = vs_upload(x.v, (size_t)x.k_span * 2);
        d.o = gt_device_alloc(o_bytes);
        d.lse = (float *)gt_device_alloc(lse_bytes);
        d.off = (int32_t *)vs_upload(x.layout.row_offsets, (size_t)(rows + 1) * 4);
        d.idx = (int32_t *)vs_upload(x.layout.col_indices, (size_t)(x.layout.nnz + 1) * 4);
        d.cu_q = (int32_t *)vs_upload(x.cu_q, (size_t)(B + 1) * 4);
        d.cu_k = (int32_t *)vs_upload(x.cu_k, (size_t)(B + 1) * 4);
        dfoff = (int32_t *)vs_upload(foff, (size_t)(B * LH * RB + 1) * 4);
        dfidx = (int32_t *)vs_upload(fidx, (size_t)(x.layout.nnz + 1) * 4);
        ok = d.q && d.k && d.v && d.o && d.lse && d.off && d.idx && d.cu_q && d.cu_k && dfoff &&
             dfidx;
    }
    if (ok) {
        vs_problem(&c, &x, &d, &pp.v);
        ok = sk_attention_sm90_varlen_test_workspace(&pp.v, &d.ws_bytes) == SK_STATUS_SUCCESS &&
             (d.ws = gt_device_alloc(d.ws_bytes)) != NULL;
    }
    REQUIRE(ok, "setup failed (memory, upload or workspace)");
    vs_varlen_call vcall = {&pp, 0, &d};
    const double t_varlen = vs_time_ms(vs_varlen_once, &vcall, 20);
    CHECK(t_varlen > 0.0 && vs_fetch(&d, o1, o_bytes, l1, lse_bytes), "varlen run failed: %s",
          sk_last_error());

    sk_attention_desc_init(&fx.desc, sizeof fx.desc);
    fx.desc.backend = SK_BACKEND_CUDA_SM90;
    fx.desc.dtype = c.dtype;
    fx.desc.batch = B;
    fx.desc.seq_q = fx.desc.seq_k = L;
    fx.desc.heads_q = c.heads_q;
    fx.desc.heads_kv = c.heads_kv;
    fx.desc.head_dim = c.head_dim;
    fx.desc.mask = SK_MASK_CAUSAL;
    const sk_grid fgrid = {L, L, 128, 128, B, (int32_t)LH};
    fx.layout.grid = fgrid;
    fx.layout.nnz = x.layout.nnz;
    fx.layout.row_offsets = dfoff;
    fx.layout.col_indices = dfidx;
    fx.q = d.q, fx.k = d.k, fx.v = d.v, fx.o = d.o, fx.lse = d.lse;
    REQUIRE(sk_attention_workspace_size(&fx.desc, &fx.layout, &fx.ws_bytes) == SK_STATUS_SUCCESS,
            "fixed workspace size: %s", sk_last_error());
    fx.ws = gt_device_alloc(fx.ws_bytes);
    const double t_fixed = fx.ws != NULL ? vs_time_ms(vs_fixed_once, &fx, 20) : -1.0;
    CHECK(t_fixed > 0.0 && vs_fetch(&d, o2, o_bytes, l2, lse_bytes), "fixed run failed: %s",
          sk_last_error());
    const int64_t eo = vs_first_diff(o1, o2, o_bytes, 2);
    CHECK(eo < 0, "varlen O differs from the fixed batch at element %lld (token %lld, head %lld)",
          (long long)eo, (long long)(eo / x.ts_q), (long long)(eo % x.ts_q / x.hs));
    int64_t bad_lse = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < c.heads_q; ++h)
            for (int64_t q = 0; q < L; ++q) {
                const float a = l1[h * x.total_q + b * L + q], f = l2[(b * c.heads_q + h) * L + q];
                if (memcmp(&a, &f, 4) != 0 && bad_lse++ < 3)
                    CHECK(0, "LSE[b %lld, h %lld, q %lld]: varlen %.9g, fixed %.9g", (long long)b,
                          (long long)h, (long long)q, (double)a, (double)f);
            }
    printf("  B %d x L %d, Hq %lld / Hkv %lld, D 128 bf16 causal, %d blocks: fixed %.3f ms, "
           "varlen %.3f ms (%.1f %% of the fixed rate)\n",
           B, L, (long long)c.heads_q, (long long)c.heads_kv, (int)x.layout.nnz, t_fixed, t_varlen,
           100.0 * t_fixed / t_varlen);
    static const int32_t sizes[4] = {16, 32, 64, 128};
    for (int k = 0; k < 4; ++k) {
        vs_paged pc = {sizes[k], 0, 0, 0, 0};
        int holes = 0;
        gt_device_free(d.lens_k), gt_device_free(d.table);
        d.lens_k = d.table = NULL;
        void *vk = d.k, *vv = d.v; /* the packed K/V stay for the fixed / varlen calls */
        sk_attention_paged_problem pk = pp;
        if (!vs_paged_setup(&c, &x, &pc, &rng, &d, &pk, &holes)) {
            CHECK(0, "paged setup failed (page_size %d)", (int)pc.page_size);
            d.k = vk, d.v = vv;
            break;
        }
        void *ck = d.k, *cv = d.v;
        d.k = vk, d.v = vv;
        vs_varlen_call pcall = {&pk, 1, &d};
        const double t_paged = vs_time_ms(vs_varlen_once, &pcall, 20);
        CHECK(t_paged > 0.0 && vs_fetch(&d, o2, o_bytes, l2, lse_bytes), "paged run failed: %s",
              sk_last_error());
        const int64_t ep = vs_first_diff(o1, o2, o_bytes, 2);
        const int64_t el = vs_first_diff(l1, l2, lse_bytes, 4);
        CHECK(ep < 0 && el < 0,
              "page_size %d: paged differs from varlen at O element %lld (token %lld), LSE %lld",
              (int)pc.page_size, (long long)ep, (long long)(ep < 0 ? -1 : ep / x.ts_q),
              (long long)el);
        printf("  paged, page_size %3d: %.3f ms (%.1f %% of the varlen rate)\n", (int)pc.page_size,
               t_paged, 100.0 * t_varlen / t_paged);
        gt_device_free(ck), gt_device_free(cv);
    }
    free(foff), free(fidx), free(o1), free(o2), free(l1), free(l2);
    gt_device_free(dfoff), gt_device_free(dfidx), gt_device_free(fx.ws);
    vs_dev_free(&d);
    vc_data_free(&x);
}

/* What the kernel declines: SK_STATUS_NOT_SUPPORTED, nothing written. */
SK_TEST(varlen_sm90_declines) {
    static const int32_t lq[2] = {70, 130}, lk[2] = {90, 200};
    for (int v = 0; v < 3; ++v) {
        vc_case c = vc_base_case(SK_DTYPE_F16, 2, lq, lk);
        c.head_dim = v == 2 ? 32 : 64;
        c.bq = v == 0 ? 64 : 128;
        c.bk = v == 1 ? 64 : 128;
        tu_rng rng;
        tu_rng_seed(&rng, 77);
        vc_data x;
        REQUIRE(vc_make(&c, &rng, &x), "out of host memory");
        vs_dev d;
        memset(&d, 0, sizeof d);
        sk_attention_varlen_problem vp;
        vs_problem(&c, &x, &d, &vp);
        const sk_status st = sk_attention_sm90_varlen_check(&vp, NULL);
        CHECK(st == SK_STATUS_NOT_SUPPORTED, "variant %d (bq %d bk %d D %lld): status %s", v,
              (int)c.bq, (int)c.bk, (long long)c.head_dim, sk_status_name(st));
        CHECK(strstr(sk_last_error(), "Hopper varlen") != NULL && !sk_attention_sm90_varlen_supports(&vp, NULL),
              "message: %s",
              sk_last_error());
        vc_data_free(&x);
    }
}
