/*
 * topk_varlen_case.c - the seeded cases of topk_varlen_case.h and their
 * reference (the fixed CPU selection on each sequence alone).
 */
#include "common/topk_varlen_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tvc_init(tvc_case *c) {
    memset(c, 0, sizeof *c);
    c->dtype = SK_DTYPE_F32;
    c->batch = 1;
    c->len_q[0] = c->len_k[0] = 64;
    c->heads_q = c->heads_kv = 1;
    c->head_dim = 16;
    c->bq = c->bk = 64;
    c->topk = 2;
    c->page_size = 16;
    c->nan_seq = -1;
}

/* Lengths of sequences 0 .. n-1. */
static void set_lengths(tvc_case *c, int32_t n, const int32_t *lq, const int32_t *lk) {
    c->batch = n;
    memcpy(c->len_q, lq, (size_t)n * sizeof *lq);
    memcpy(c->len_k, lk, (size_t)n * sizeof *lk);
}

void tvc_preset(tvc_case *c, int which) {
    static const int32_t lq0[5] = {130, 0, 64, 1, 200}, lk0[5] = {300, 50, 64, 0, 200};
    static const int32_t lq1[4] = {300, 129, 17, 0}, lk1[4] = {300, 500, 90, 33};
    static const int32_t lq2[4] = {65, 200, 64, 0}, lk2[4] = {400, 700, 64, 10};
    tvc_init(c);
    if (which == 0) {
        set_lengths(c, 5, lq0, lk0);
        c->heads_q = 4;
        c->heads_kv = 2;
        c->causal = 1;
        c->sink_blocks = 1;
        c->local_blocks = 1;
    } else if (which == 1) {
        set_lengths(c, 4, lq1, lk1);
        c->dtype = SK_DTYPE_F16;
        c->heads_q = 8;
        c->heads_kv = 2;
        c->per_kv_head = 1;
        c->padded = 1;
        c->bq = 128;
        c->topk = 3;
        c->local_blocks = 2;
    } else {
        set_lengths(c, 4, lq2, lk2);
        c->dtype = SK_DTYPE_BF16;
        c->heads_q = 2;
        c->bk = 128;
        c->causal = 1;
        c->topk = 4;
        c->nan_seq = 1;
        c->extra_q = 300;
    }
}

void tvc_random(tvc_case *c, tu_rng *rng, int32_t max_len, int it, int gpu) {
    tvc_init(c);
    c->batch = (int32_t)tu_rng_range(rng, 1, gpu ? TVC_MAXB : 6);
    for (int32_t b = 0; b < c->batch; ++b) {
        c->len_k[b] = (int32_t)tu_rng_range(rng, 0, max_len);
        c->len_q[b] = (int32_t)tu_rng_range(rng, 0, c->len_k[b] + 40);
    }
    c->heads_kv = tu_rng_range(rng, 1, 2);
    c->heads_q = c->heads_kv * tu_rng_range(rng, 1, gpu ? 4 : 3);
    if (gpu) c->head_dim = 8 * tu_rng_range(rng, 1, 16);
    c->per_kv_head = (int)tu_rng_range(rng, 0, 1);
    c->causal = (int)tu_rng_range(rng, 0, 1);
    c->bq = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c->bk = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c->topk = (int32_t)tu_rng_range(rng, 0, gpu ? 6 : 5);
    c->sink_blocks = (int32_t)tu_rng_range(rng, 0, 2);
    c->local_blocks = (int32_t)tu_rng_range(rng, 0, 2);
    if (gpu)
        c->dtype = it % 2 ? SK_DTYPE_BF16 : SK_DTYPE_F16;
    else
        c->dtype = it % 3 == 0 ? SK_DTYPE_F16 : SK_DTYPE_F32;
    c->padded = it % 3 == 1;
    c->nan_seq = it % 5 == 2 ? 0 : -1;
}

static void *alloc16(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 16, bytes > 0 ? bytes : 16) != 0) return NULL;
    return p;
}

int tvc_make(tvc_case *c, uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    const size_t es = c->dtype == SK_DTYPE_F32 ? 4 : 2;
    c->cu_q[0] = c->cu_k[0] = 0;
    c->max_q = c->max_k = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        c->cu_q[b + 1] = c->cu_q[b] + c->len_q[b];
        c->cu_k[b + 1] = c->cu_k[b] + c->len_k[b];
        if (c->len_q[b] > c->max_q) c->max_q = c->len_q[b];
        if (c->len_k[b] > c->max_k) c->max_k = c->len_k[b];
    }
    c->max_q += c->extra_q;
    c->total_q = c->cu_q[c->batch] > 0 ? c->cu_q[c->batch] : 1;
    c->total_k = c->cu_k[c->batch] > 0 ? c->cu_k[c->batch] : 1;
    /* Gaps of 16 bytes after each head and each token when padded. */
    const int64_t gap = c->padded ? (int64_t)(16 / es) : 0;
    c->q_strides[1] = c->head_dim + gap;
    c->q_strides[0] = c->heads_q * c->q_strides[1] + gap;
    c->k_strides[1] = c->head_dim + gap;
    c->k_strides[0] = c->heads_kv * c->k_strides[1] + gap;
    c->q_elems = c->total_q * c->q_strides[0];
    c->k_elems = c->total_k * c->k_strides[0];
    c->q = alloc16((size_t)c->q_elems * es);
    c->k = alloc16((size_t)c->k_elems * es);
    /* Pages: each sequence's ceil(len_k / page_size), shuffled over the
     * cache, plus two pages no sequence uses. */
    int64_t used = 0;
    c->max_pages = 1;
    for (int32_t b = 0; b < c->batch; ++b) {
        const int32_t np = (c->len_k[b] + c->page_size - 1) / c->page_size;
        used += np;
        if (np > c->max_pages) c->max_pages = np;
    }
    if ((int64_t)c->max_pages * c->page_size < c->max_k)
        c->max_pages = (int32_t)((c->max_k + c->page_size - 1) / c->page_size);
    c->num_pages = used + 2;
    c->cache_elems = c->num_pages * c->page_size * c->heads_kv * c->head_dim;
    c->k_cache = alloc16((size_t)c->cache_elems * es);
    c->page_table = (int32_t *)malloc((size_t)c->batch * c->max_pages * sizeof(int32_t));
    int64_t *perm = (int64_t *)malloc((size_t)c->num_pages * sizeof(int64_t));
    if (c->q == NULL || c->k == NULL || c->k_cache == NULL || c->page_table == NULL ||
        perm == NULL) {
        free(perm);
        return 0;
    }
    tu_fill_nan(c->q, c->dtype, c->q_elems);
    tu_fill_nan(c->k, c->dtype, c->k_elems);
    tu_fill_nan(c->k_cache, c->dtype, c->cache_elems);
    for (int64_t t = 0; t < c->cu_q[c->batch]; ++t)
        for (int64_t h = 0; h < c->heads_q; ++h)
            tu_fill_normal(&rng, (char *)c->q + (size_t)(t * c->q_strides[0] +
                                                         h * c->q_strides[1]) * es,
                           c->dtype, c->head_dim, 1.0f);
    for (int64_t t = 0; t < c->cu_k[c->batch]; ++t)
        for (int64_t h = 0; h < c->heads_kv; ++h)
            tu_fill_normal(&rng, (char *)c->k + (size_t)(t * c->k_strides[0] +
                                                         h * c->k_strides[1]) * es,
                           c->dtype, c->head_dim, 1.0f);
    if (c->nan_seq >= 0 && c->len_q[c->nan_seq] > 0)
        tu_store(c->q, c->dtype, (int64_t)c->cu_q[c->nan_seq] * c->q_strides[0], NAN);
    for (int64_t i = 0; i < c->num_pages; ++i) perm[i] = i;
    for (int64_t i = c->num_pages - 1; i > 0; --i) {
        const int64_t j = tu_rng_range(&rng, 0, i), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    /* Table entries past a sequence's pages hold out-of-range garbage. */
    for (int64_t i = 0; i < (int64_t)c->batch * c->max_pages; ++i) c->page_table[i] = -12345;
    int64_t next = 0;
    const int64_t row_elems = c->heads_kv * c->head_dim;
    for (int32_t b = 0; b < c->batch; ++b)
        for (int32_t t = 0; t < c->len_k[b]; ++t) {
            const int32_t pi = t / c->page_size, slot = t % c->page_size;
            if (slot == 0) c->page_table[b * c->max_pages + pi] = (int32_t)perm[next++];
            const int64_t page = c->page_table[b * c->max_pages + pi];
            for (int64_t h = 0; h < c->heads_kv; ++h)
                memcpy((char *)c->k_cache +
                           (size_t)((page * c->page_size + slot) * row_elems + h * c->head_dim) *
                               es,
                       (const char *)c->k +
                           (size_t)((c->cu_k[b] + t) * c->k_strides[0] + h * c->k_strides[1]) *
                               es,
                       (size_t)c->head_dim * es);
        }
    free(perm);
    return 1;
}

void tvc_free(tvc_case *c) {
    free(c->q);
    free(c->k);
    free(c->k_cache);
    free(c->page_table);
    c->q = c->k = c->k_cache = NULL;
    c->page_table = NULL;
}

void tvc_desc(const tvc_case *c, sk_backend backend, sk_topk_varlen_desc *d) {
    sk_topk_varlen_desc_init(d, sizeof *d);
    d->backend = backend;
    d->dtype = c->dtype;
    d->batch = c->batch;
    d->total_q = c->total_q;
    d->total_k = c->total_k;
    d->max_seqlen_q = c->max_q;
    d->max_seqlen_k = c->max_k;
    d->heads_q = c->heads_q;
    d->heads_kv = c->heads_kv;
    d->head_dim = c->head_dim;
    memcpy(d->q_strides, c->q_strides, sizeof d->q_strides);
    memcpy(d->k_strides, c->k_strides, sizeof d->k_strides);
    d->block_q = c->bq;
    d->block_k = c->bk;
    d->k = c->topk;
    d->sink_blocks = c->sink_blocks;
    d->local_blocks = c->local_blocks;
    d->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    d->per_kv_head = c->per_kv_head;
    d->num_pages = c->num_pages;
    d->page_size = c->page_size;
    d->max_pages = c->max_pages;
}

int32_t tvc_rows(const tvc_case *c) {
    sk_topk_varlen_desc d;
    tvc_desc(c, SK_BACKEND_CPU, &d);
    sk_grid g;
    if (sk_topk_varlen_layout_capacity(&d, &g, NULL) != SK_STATUS_SUCCESS) return -1;
    return (int32_t)(g.rows / c->bq);
}

int32_t tvc_capacity(const tvc_case *c) {
    sk_topk_varlen_desc d;
    tvc_desc(c, SK_BACKEND_CPU, &d);
    int32_t cap = -1;
    if (sk_topk_varlen_layout_capacity(&d, NULL, &cap) != SK_STATUS_SUCCESS) return -1;
    return cap;
}

/* The fixed CPU selection of sequence b into *off / *idx (malloc'd). */
static int fixed_rows(const tvc_case *c, int32_t b, int32_t **off, int32_t **idx, int32_t *rb,
                      char *why) {
    const size_t es = c->dtype == SK_DTYPE_F32 ? 4 : 2;
    sk_topk_desc d;
    sk_topk_desc_init(&d, sizeof d);
    d.backend = SK_BACKEND_CPU;
    d.dtype = c->dtype;
    d.batch = 1;
    d.seq_q = c->len_q[b];
    d.seq_k = c->len_k[b];
    d.heads_q = c->heads_q;
    d.heads_kv = c->heads_kv;
    d.head_dim = c->head_dim;
    d.q_strides[0] = c->len_q[b] * c->q_strides[0];
    d.q_strides[1] = c->q_strides[0];
    d.q_strides[2] = c->q_strides[1];
    d.k_strides[0] = c->len_k[b] * c->k_strides[0];
    d.k_strides[1] = c->k_strides[0];
    d.k_strides[2] = c->k_strides[1];
    d.block_q = c->bq;
    d.block_k = c->bk;
    d.k = c->topk;
    d.sink_blocks = c->sink_blocks;
    d.local_blocks = c->local_blocks;
    d.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    d.per_kv_head = c->per_kv_head;
    sk_grid g;
    int32_t cap;
    if (sk_topk_layout_capacity(&d, &g, &cap) != SK_STATUS_SUCCESS) {
        snprintf(why, 200, "fixed capacity of sequence %d: %s", (int)b, sk_last_error());
        return 0;
    }
    *rb = (int32_t)((g.rows + c->bq - 1) / c->bq);
    *off = (int32_t *)malloc((size_t)(g.heads * *rb + 1) * sizeof(int32_t));
    *idx = (int32_t *)malloc((size_t)(cap + 1) * sizeof(int32_t));
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = *off;
    l.col_indices = *idx;
    const char *q = (const char *)c->q + (size_t)(c->cu_q[b] * c->q_strides[0]) * es;
    const char *k = (const char *)c->k + (size_t)(c->cu_k[b] * c->k_strides[0]) * es;
    if (*off == NULL || *idx == NULL ||
        sk_pool_select_topk(&d, q, k, &l, NULL, 0, NULL) != SK_STATUS_SUCCESS) {
        snprintf(why, 200, "fixed selection of sequence %d: %s", (int)b, sk_last_error());
        free(*off);
        free(*idx);
        return 0;
    }
    return 1;
}

int tvc_expected(const tvc_case *c, int32_t **row_offsets, int32_t **col_indices, char *why) {
    const int32_t rows = tvc_rows(c), cap = tvc_capacity(c);
    const int32_t slices = (int32_t)(c->per_kv_head ? c->heads_kv : c->heads_q);
    if (rows < 1 || cap < 0) {
        snprintf(why, 200, "capacity: %s", sk_last_error());
        return 0;
    }
    int32_t *counts = (int32_t *)calloc((size_t)slices * rows, sizeof(int32_t));
    int32_t **ent = (int32_t **)calloc((size_t)slices * rows, sizeof(int32_t *));
    *row_offsets = (int32_t *)malloc(((size_t)slices * rows + 1) * sizeof(int32_t));
    *col_indices = (int32_t *)malloc(((size_t)cap + 1) * sizeof(int32_t));
    int ok = counts != NULL && ent != NULL && *row_offsets != NULL && *col_indices != NULL;
    int32_t *offs[TVC_MAXB] = {0}, *idxs[TVC_MAXB] = {0};
    int32_t row_start = 0;
    for (int32_t b = 0; ok && b < c->batch; ++b) {
        const int32_t rb = (c->len_q[b] + c->bq - 1) / c->bq;
        if (c->len_q[b] > 0 && c->len_k[b] > 0) {
            int32_t frb;
            ok = fixed_rows(c, b, &offs[b], &idxs[b], &frb, why);
            for (int32_t s = 0; ok && s < slices; ++s)
                for (int32_t i = 0; i < rb; ++i) {
                    const int32_t g = s * frb + i, r = s * rows + row_start + i;
                    counts[r] = offs[b][g + 1] - offs[b][g];
                    ent[r] = idxs[b] + offs[b][g];
                }
        }
        row_start += rb;
    }
    if (ok) {
        int32_t off = 0;
        for (int64_t r = 0; r < (int64_t)slices * rows; ++r) {
            (*row_offsets)[r] = off;
            if (off + counts[r] > cap) {
                snprintf(why, 200, "the fixed rows exceed the capacity %d", (int)cap);
                ok = 0;
                break;
            }
            for (int32_t e = 0; e < counts[r]; ++e) (*col_indices)[off + e] = ent[r][e];
            off += counts[r];
        }
        (*row_offsets)[(int64_t)slices * rows] = off;
    } else if (counts == NULL || ent == NULL) {
        snprintf(why, 200, "out of host memory");
    }
    for (int32_t b = 0; b < c->batch; ++b) {
        free(offs[b]);
        free(idxs[b]);
    }
    free(counts);
    free(ent);
    if (!ok) {
        free(*row_offsets);
        free(*col_indices);
        *row_offsets = *col_indices = NULL;
    }
    return ok;
}

int tvc_compare(const tvc_case *c, const int32_t *exp_off, const int32_t *exp_idx,
                const int32_t *got_off, const int32_t *got_idx, char *why) {
    const int32_t rows = tvc_rows(c);
    const int64_t n = (int64_t)(c->per_kv_head ? c->heads_kv : c->heads_q) * rows;
    for (int64_t r = 0; r <= n; ++r)
        if (exp_off[r] != got_off[r]) {
            snprintf(why, 200, "row_offsets[%lld] = %d, expected %d", (long long)r,
                     (int)got_off[r], (int)exp_off[r]);
            return 0;
        }
    for (int32_t e = 0; e < exp_off[n]; ++e)
        if (exp_idx[e] != got_idx[e]) {
            snprintf(why, 200, "col_indices[%d] = %d, expected %d", (int)e, (int)got_idx[e],
                     (int)exp_idx[e]);
            return 0;
        }
    return 1;
}
