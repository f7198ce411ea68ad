/*
 * test_attention_paged.c - the paged-KV forward (CPU backend).
 *
 * Each case is a varlen case of tests/common/varlen_case.h, run first
 * through the varlen forward and checked against the naive fp64 reference;
 * then its keys and values are moved into caches of pages: every page and
 * slot no sequence uses is NaN (so is every key no query reads, as in the
 * packed tensors), the pages are shuffled, sequences share the pages of
 * a common prefix (their keys made equal first), the page table's rows are
 * padded and hold garbage past the pages a sequence uses. The paged
 * forward must then give the varlen result bit for bit, and pass the
 * reference itself (O padding untouched, LSE as asked).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/varlen_case.h"
#include "sparsek.h"

typedef struct paged_opts {
    int32_t page_size;
    int32_t extra_pages; /* pages no sequence uses (NaN) */
    int32_t table_pad;   /* page_table_stride - max_pages */
    int shuffle;         /* pages in a random order */
    int share_prefix;    /* sequence b shares its first full pages with b - 1 */
    int padded_cache;    /* cache strides with gaps */
    int use_run;         /* plan, then run, instead of the one-shot call */
} paged_opts;

/* The caches, page table and lengths of a case. */
typedef struct paged_data {
    int32_t pages[VC_MAXB]; /* pages sequence b uses */
    int32_t shared[VC_MAXB];
    int32_t seq_lens_k[VC_MAXB];
    int32_t *table;
    int64_t num_pages, max_pages, stride;
    int64_t cs[3]; /* cache strides over [page, slot, head] */
    int64_t cache_span;
    void *k_cache, *v_cache;
} paged_data;

static void paged_free(paged_data *pd) {
    free(pd->table);
    free(pd->k_cache);
    free(pd->v_cache);
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* Sequence b's first shared[b] full pages are sequence b - 1's: copy
 * those keys and values (fp64 copies, and the packed tensors where the
 * sequence reads them) from b - 1, before any run. */
static void share_prefixes(const vc_case *c, vc_data *x, paged_data *pd, const paged_opts *po) {
    const int64_t Hkv = c->heads_kv, D = c->head_dim, ps = po->page_size;
    for (int32_t b = 0; b < c->batch; ++b) {
        pd->shared[b] = 0;
        if (!po->share_prefix || b == 0) continue;
        const int64_t full = (c->len_k[b - 1] < c->len_k[b] ? c->len_k[b - 1] : c->len_k[b]) / ps;
        pd->shared[b] = (int32_t)full;
        for (int64_t kk = 0; kk < full * ps; ++kk)
            for (int64_t e = 0; e < Hkv * D; ++e) {
                const int64_t from = (x->cu_k[b - 1] + kk) * Hkv * D + e;
                const int64_t to = (x->cu_k[b] + kk) * Hkv * D + e;
                x->kd[to] = x->kd[from];
                x->vd[to] = x->vd[from];
                const int64_t at = (x->cu_k[b] + kk) * x->ts_k + (e / D) * x->hs + e % D;
                if (!isnan(tu_load(x->k, c->dtype, at))) {
                    tu_store(x->k, c->dtype, at, (float)x->kd[to]);
                    tu_store(x->v, c->dtype, at, (float)x->vd[to]);
                }
            }
    }
}

/* Page assignment, the table, and the caches filled from the packed keys
 * (NaN everywhere no sequence reads). */
static int make_pages(const vc_case *c, const vc_data *x, paged_data *pd, const paged_opts *po,
                      tu_rng *rng) {
    const int64_t Hkv = c->heads_kv, D = c->head_dim, ps = po->page_size;
    int64_t unique = 0;
    pd->max_pages = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        pd->seq_lens_k[b] = c->len_k[b];
        pd->pages[b] = (int32_t)ceil_div(c->len_k[b], ps);
        unique += pd->pages[b] - pd->shared[b];
        if (pd->pages[b] > pd->max_pages) pd->max_pages = pd->pages[b];
    }
    pd->num_pages = unique + po->extra_pages > 0 ? unique + po->extra_pages : 1;
    pd->stride = pd->max_pages + po->table_pad;
    int64_t *perm = (int64_t *)malloc((size_t)pd->num_pages * sizeof(int64_t));
    pd->table = (int32_t *)malloc((size_t)(c->batch * pd->stride) * sizeof(int32_t));
    if (perm == NULL || pd->table == NULL) {
        free(perm);
        return 0;
    }
    for (int64_t i = 0; i < pd->num_pages; ++i) perm[i] = i;
    if (po->shuffle)
        for (int64_t i = pd->num_pages - 1; i > 0; --i) {
            const int64_t j = tu_rng_range(rng, 0, i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    /* Garbage past the pages a sequence uses: never read. */
    static const int32_t garbage[4] = {-7, INT32_MAX, -1, 1 << 30};
    for (int64_t e = 0; e < c->batch * pd->stride; ++e) pd->table[e] = garbage[e % 4];
    int64_t next = 0;
    for (int32_t b = 0; b < c->batch; ++b)
        for (int32_t i = 0; i < pd->pages[b]; ++i)
            pd->table[b * pd->stride + i] =
                i < pd->shared[b] ? pd->table[(b - 1) * pd->stride + i] : (int32_t)perm[next++];
    free(perm);

    pd->cs[2] = po->padded_cache ? D + 5 : D;
    pd->cs[1] = po->padded_cache ? Hkv * pd->cs[2] + 3 : Hkv * D;
    pd->cs[0] = po->padded_cache ? ps * pd->cs[1] + 11 : ps * Hkv * D;
    pd->cache_span =
        (pd->num_pages - 1) * pd->cs[0] + (ps - 1) * pd->cs[1] + (Hkv - 1) * pd->cs[2] + D;
    const size_t es = vc_elem_size(c->dtype);
    pd->k_cache = malloc((size_t)pd->cache_span * es);
    pd->v_cache = malloc((size_t)pd->cache_span * es);
    if (pd->k_cache == NULL || pd->v_cache == NULL) return 0;
    tu_fill_nan(pd->k_cache, c->dtype, pd->cache_span);
    tu_fill_nan(pd->v_cache, c->dtype, pd->cache_span);
    for (int32_t b = 0; b < c->batch; ++b)
        for (int64_t kk = 0; kk < c->len_k[b]; ++kk)
            for (int64_t h = 0; h < Hkv; ++h)
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t from = (x->cu_k[b] + kk) * x->ts_k + h * x->hs + d;
                    const int64_t to = pd->table[b * pd->stride + kk / ps] * pd->cs[0] +
                                       (kk % ps) * pd->cs[1] + h * pd->cs[2] + d;
                    const float kv = tu_load(x->k, c->dtype, from);
                    if (isnan(kv)) continue; /* unread here; a sharer may read it */
                    tu_store(pd->k_cache, c->dtype, to, kv);
                    tu_store(pd->v_cache, c->dtype, to, tu_load(x->v, c->dtype, from));
                }
    return 1;
}

static sk_status call_paged(const vc_case *c, vc_data *x, const paged_data *pd,
                            const paged_opts *po) {
    sk_attention_paged_desc desc;
    sk_status st = sk_attention_paged_desc_init(&desc, sizeof desc);
    if (st != SK_STATUS_SUCCESS) return st;
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = c->dtype;
    desc.batch = c->batch;
    desc.total_q = x->total_q;
    vc_max_lengths(c, &desc.max_seqlen_q, &desc.max_seqlen_k);
    desc.heads_q = c->heads_q;
    desc.heads_kv = c->heads_kv;
    desc.head_dim = c->head_dim;
    desc.scale = c->scale;
    desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    desc.num_pages = pd->num_pages;
    desc.page_size = po->page_size;
    desc.max_pages = (int32_t)pd->max_pages;
    desc.page_table_stride = po->table_pad != 0 ? pd->stride : 0;
    if (c->padded) {
        desc.q_strides[0] = desc.o_strides[0] = x->ts_q;
        desc.q_strides[1] = desc.o_strides[1] = x->hs;
    }
    if (po->padded_cache) {
        memcpy(desc.k_strides, pd->cs, sizeof pd->cs);
        memcpy(desc.v_strides, pd->cs, sizeof pd->cs);
    }
    float *lse = c->with_lse ? x->lse : NULL;
    if (po->use_run) {
        st = sk_attention_paged_plan(&desc, &x->layout, x->cu_q, pd->seq_lens_k, pd->table, NULL, 0,
                                     NULL);
        if (st != SK_STATUS_SUCCESS) return st;
        return sk_attention_paged_run(&desc, &x->layout, x->cu_q, pd->seq_lens_k, pd->table, x->q,
                                      pd->k_cache, pd->v_cache, x->o, lse, NULL, 0, NULL);
    }
    return sk_attention_paged_forward(&desc, &x->layout, x->cu_q, pd->seq_lens_k, pd->table, x->q,
                                      pd->k_cache, pd->v_cache, x->o, lse, NULL, 0, NULL);
}

/* Run one case both ways; returns 0 when everything matched. */
static int run_case(const vc_case *c, const paged_opts *po, uint64_t seed) {
    char label[480], vl[400];
    vc_label(c, seed, vl, sizeof vl);
    snprintf(label, sizeof label,
             "%s [page %d extra %d pad %d shuffle %d share %d padded %d run %d]", vl,
             (int)po->page_size, (int)po->extra_pages, (int)po->table_pad, po->shuffle,
             po->share_prefix, po->padded_cache, po->use_run);
    const int failures_before = sk_test_failures();
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    paged_data pd;
    memset(&pd, 0, sizeof pd);
    void *o_varlen = NULL;
    float *lse_varlen = NULL;
    if (!vc_make(c, &rng, &x)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    share_prefixes(c, &x, &pd, po);
    sk_status st = vc_call_varlen(c, &x);
    CHECK(st == SK_STATUS_SUCCESS, "%s varlen: %s %s", label, sk_status_name(st), sk_last_error());
    if (st != SK_STATUS_SUCCESS) goto done;
    vc_outcome out;
    memset(&out, 0, sizeof out);
    CHECK(vc_compare_reference(c, &x, label, &out) == 0, "%s varlen against the reference", label);

    const size_t es = vc_elem_size(c->dtype), qb = (size_t)x.q_span * es;
    const size_t lb = (size_t)(c->heads_q * x.total_q) * sizeof(float);
    o_varlen = malloc(qb);
    lse_varlen = (float *)malloc(lb);
    if (o_varlen == NULL || lse_varlen == NULL || !make_pages(c, &x, &pd, po, &rng)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    memcpy(o_varlen, x.o, qb);
    memcpy(lse_varlen, x.lse, lb);
    tu_fill_nan(x.o, c->dtype, x.q_span);
    tu_fill_nan(x.lse, SK_DTYPE_F32, c->heads_q * x.total_q);
    st = call_paged(c, &x, &pd, po);
    CHECK(st == SK_STATUS_SUCCESS, "%s paged: %s %s", label, sk_status_name(st), sk_last_error());
    if (st != SK_STATUS_SUCCESS) goto done;
    CHECK(memcmp(o_varlen, x.o, qb) == 0, "%s paged O differs from varlen", label);
    CHECK(memcmp(lse_varlen, x.lse, lb) == 0, "%s paged LSE differs from varlen", label);
    memset(&out, 0, sizeof out);
    CHECK(vc_compare_reference(c, &x, label, &out) == 0, "%s paged against the reference", label);
done:
    free(o_varlen);
    free(lse_varlen);
    paged_free(&pd);
    vc_data_free(&x);
    return sk_test_failures() != failures_before;
}

static uint64_t case_seed(uint64_t test_id, uint64_t case_id) {
    tu_rng r;
    tu_rng_seed(&r, tu_base_seed() ^ (test_id * 0x100000001B3ull) ^ (case_id << 24) ^ 0x9a6ed);
    return tu_rng_next(&r);
}

static paged_opts base_opts(int32_t page_size) {
    paged_opts po;
    memset(&po, 0, sizeof po);
    po.page_size = page_size;
    po.extra_pages = 3;
    po.table_pad = 2;
    po.shuffle = 1;
    return po;
}

static const sk_dtype all_dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};

/* Every page size, each dtype: lengths around page and block edges. */
SK_TEST(paged_cpu_every_page_size) {
    static const int32_t lq[6] = {1, 63, 0, 130, 64, 17};
    static const int32_t lk[6] = {16, 65, 40, 300, 0, 129};
    static const int32_t sizes[4] = {16, 32, 64, 128};
    int id = 0;
    for (int si = 0; si < 4; ++si)
        for (int t = 0; t < 3; ++t) {
            vc_case c = vc_base_case(all_dtypes[t], 6, lq, lk);
            c.heads_q = 2;
            c.density = 0.7;
            c.causal = (si + t) % 2;
            const paged_opts po = base_opts(sizes[si]);
            run_case(&c, &po, case_seed(1, (uint64_t)id++));
        }
}

/* Chunked prefill: a few new queries over a long cached context, causal
 * (bottom-right: each new token sees the context and the new tokens up to
 * itself), GQA 1, 4 and 8, both head dims. */
SK_TEST(paged_cpu_chunked_prefill) {
    static const int32_t lq[4] = {64, 1, 100, 37}, lk[4] = {700, 513, 356, 37};
    static const int64_t groups[3] = {1, 4, 8};
    int id = 0;
    for (int gi = 0; gi < 3; ++gi)
        for (int di = 0; di < 2; ++di) {
            vc_case c = vc_base_case(all_dtypes[id % 3], 4, lq, lk);
            c.causal = 1;
            c.heads_kv = 1;
            c.heads_q = groups[gi];
            c.head_dim = di ? 128 : 64;
            c.bk = di ? 128 : 64;
            c.density = 0.5;
            c.layout_heads = (int32_t)(gi == 1 ? c.heads_q : 1);
            paged_opts po = base_opts(di ? 16 : 64);
            po.use_run = gi == 2;
            run_case(&c, &po, case_seed(2, (uint64_t)id++));
        }
}

/* Pages shared by consecutive sequences (prefix caching), in any order. */
SK_TEST(paged_cpu_prefix_sharing) {
    static const int32_t lq[5] = {30, 40, 1, 64, 20}, lk[5] = {300, 260, 270, 64, 200};
    static const int32_t sizes[3] = {16, 32, 128};
    for (int si = 0; si < 3; ++si) {
        vc_case c = vc_base_case(all_dtypes[si], 5, lq, lk);
        c.causal = 1;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.layout_heads = 2;
        paged_opts po = base_opts(sizes[si]);
        po.share_prefix = 1;
        po.padded_cache = si == 1;
        run_case(&c, &po, case_seed(3, (uint64_t)si));
    }
}

/* Seeded random cases: every option at random. */
SK_TEST(paged_cpu_random_cases) {
    static const int32_t sizes[4] = {16, 32, 64, 128};
    tu_rng rng;
    tu_rng_seed(&rng, case_seed(4, 999));
    for (int id = 0; id < 24; ++id) {
        const vc_case c = vc_random_case(&rng, 7, 200, 400);
        paged_opts po = base_opts(sizes[tu_rng_range(&rng, 0, 3)]);
        po.extra_pages = (int32_t)tu_rng_range(&rng, 0, 4);
        po.table_pad = (int32_t)tu_rng_range(&rng, 0, 3);
        po.shuffle = (int)tu_rng_range(&rng, 0, 1);
        po.share_prefix = (int)tu_rng_range(&rng, 0, 1);
        po.padded_cache = (int)tu_rng_range(&rng, 0, 1);
        po.use_run = (int)tu_rng_range(&rng, 0, 1);
        run_case(&c, &po, case_seed(4, (uint64_t)id));
    }
}
