/*
 * dsel_case.c - the decode selection test case and its naive references
 * (see dsel_case.h). Written from the contract in sparsek.h, not from the
 * library's code: scores in fp64 head by head, a full sort.
 */
#include "common/dsel_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int32_t dc_max_blocks(const dc_case *c) {
    return (int32_t)((c->desc.max_seqlen_k + c->desc.block_k - 1) / c->desc.block_k);
}
int32_t dc_rows(const dc_case *c) { return (int32_t)(c->desc.batch * c->desc.heads_kv); }
int32_t dc_max_groups(const dc_case *c) {
    const int32_t g = c->desc.group_blocks;
    return g > 0 ? (dc_max_blocks(c) + g - 1) / g : 0;
}
int64_t dc_summary_elems(const dc_case *c) {
    return (int64_t)dc_rows(c) * (dc_max_blocks(c) + dc_max_groups(c)) * 2 * c->desc.head_dim;
}

static int64_t table_stride(const dc_case *c) {
    return c->desc.page_table_stride != 0 ? c->desc.page_table_stride : c->desc.max_pages;
}

static int64_t key_index(const dc_case *c, int32_t b, int32_t pos, int32_t h) {
    const sk_decode_select_desc *d = &c->desc;
    const int64_t page = c->table[b * table_stride(c) + pos / d->page_size];
    const int64_t s0 = d->k_strides[0] ? d->k_strides[0] : (int64_t)d->page_size * d->heads_kv * d->head_dim;
    const int64_t s1 = d->k_strides[1] ? d->k_strides[1] : d->heads_kv * d->head_dim;
    const int64_t s2 = d->k_strides[2] ? d->k_strides[2] : d->head_dim;
    return page * s0 + (pos % d->page_size) * s1 + h * s2;
}

static int64_t q_index(const dc_case *c, int32_t b, int32_t t, int32_t hq) {
    const sk_decode_select_desc *d = &c->desc;
    const int64_t s2 = d->q_strides[2] ? d->q_strides[2] : d->head_dim;
    const int64_t s1 = d->q_strides[1] ? d->q_strides[1] : d->heads_q * d->head_dim;
    const int64_t s0 = d->q_strides[0] ? d->q_strides[0] : d->q_len * d->heads_q * d->head_dim;
    return b * s0 + t * s1 + hq * s2;
}

static float draw(dc_case *c, tu_rng *rng, int is_q) {
    if (c->quant) return (float)tu_rng_range(rng, -8, 8) / (is_q ? 4.0f : 8.0f);
    return (float)tu_rng_normal(rng);
}

void dc_set_key(dc_case *c, int32_t b, int32_t pos, int32_t h, int32_t d, float value) {
    tu_store(c->cache, c->desc.dtype, key_index(c, b, pos, h) + d, value);
}

void dc_write_keys(dc_case *c, tu_rng *rng, const int32_t *from, const int32_t *to) {
    for (int32_t b = 0; b < c->desc.batch; ++b)
        for (int32_t pos = from != NULL ? from[b] : 0; pos < to[b]; ++pos)
            for (int32_t h = 0; h < c->desc.heads_kv; ++h)
                for (int32_t d = 0; d < c->desc.head_dim; ++d)
                    dc_set_key(c, b, pos, h, d, draw(c, rng, 0));
}

int dc_alloc(dc_case *c, tu_rng *rng, sk_backend backend, sk_dtype dtype, int32_t batch,
             int32_t q_len, int32_t hq, int32_t hkv, int32_t head_dim, int32_t block_k,
             int32_t page_size, int32_t max_seqlen_k, int padded, int quant, int with_empty) {
    memset(c, 0, sizeof *c);
    sk_decode_select_desc *d = &c->desc;
    sk_decode_select_desc_init(d, sizeof *d);
    d->backend = backend;
    d->dtype = dtype;
    d->batch = batch;
    d->q_len = q_len;
    d->heads_q = hq;
    d->heads_kv = hkv;
    d->head_dim = head_dim;
    d->max_seqlen_k = max_seqlen_k;
    d->block_k = block_k;
    d->page_size = page_size;
    d->max_pages = (max_seqlen_k + page_size - 1) / page_size + (padded ? 1 : 0);
    c->quant = quant;
    if (quant) d->scale = 0.5f; /* a power of two: the scores stay exact */
    const int64_t pad = padded ? 8 : 0; /* 16 bytes of fp16 */
    if (padded) {
        d->page_table_stride = d->max_pages + 3;
        d->k_strides[2] = head_dim + pad;
        d->k_strides[1] = hkv * d->k_strides[2] + pad;
        d->k_strides[0] = page_size * d->k_strides[1] + pad;
        d->q_strides[2] = head_dim + pad;
        d->q_strides[1] = hq * d->q_strides[2];
        d->q_strides[0] = q_len * d->q_strides[1] + pad;
    }
    c->lens = (int32_t *)malloc((size_t)batch * 4);
    if (c->lens == NULL) return 0;
    int64_t pages = 0;
    for (int32_t b = 0; b < batch; ++b) {
        c->lens[b] = b == 0 ? max_seqlen_k
                            : (with_empty && b == 1 ? 0 : (int32_t)tu_rng_range(rng, 0, max_seqlen_k));
        pages += (c->lens[b] + page_size - 1) / page_size;
    }
    /* Pages no sequence uses: NaN, somewhere among the used ones. */
    d->num_pages = pages + 3;
    const int64_t stride = table_stride(c);
    c->table = (int32_t *)malloc((size_t)(batch * stride) * 4);
    int32_t *perm = (int32_t *)malloc((size_t)d->num_pages * 4);
    if (c->table == NULL || perm == NULL) {
        free(perm);
        return 0;
    }
    for (int64_t i = 0; i < d->num_pages; ++i) perm[i] = (int32_t)i;
    for (int64_t i = d->num_pages - 1; i > 0; --i) {
        const int64_t j = tu_rng_range(rng, 0, i);
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t next = 0;
    for (int32_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < stride; ++i)
            c->table[b * stride + i] =
                i < (c->lens[b] + page_size - 1) / page_size ? perm[next++] : INT32_MAX;
    free(perm);
    const int64_t s0 = d->k_strides[0] ? d->k_strides[0] : (int64_t)page_size * hkv * head_dim;
    c->cache_elems = d->num_pages * s0;
    const int64_t qs0 = d->q_strides[0] ? d->q_strides[0] : (int64_t)q_len * hq * head_dim;
    c->q_elems = batch * qs0;
    const size_t es = dtype == SK_DTYPE_F32 ? 4 : 2;
    c->cache = malloc((size_t)c->cache_elems * es);
    c->q = malloc((size_t)c->q_elems * es);
    if (c->cache == NULL || c->q == NULL) return 0;
    tu_fill_nan(c->cache, dtype, c->cache_elems);
    tu_fill_nan(c->q, dtype, c->q_elems);
    dc_write_keys(c, rng, NULL, c->lens);
    for (int32_t b = 0; b < batch; ++b)
        for (int32_t t = 0; t < q_len; ++t)
            for (int32_t h = 0; h < hq; ++h)
                for (int32_t e = 0; e < head_dim; ++e)
                    tu_store(c->q, dtype, q_index(c, b, t, h) + e, draw(c, rng, 1));
    return 1;
}

void dc_free(dc_case *c) {
    free(c->lens);
    free(c->table);
    free(c->cache);
    free(c->q);
    memset(c, 0, sizeof *c);
}

void dc_naive_summary(const dc_case *c, const int32_t *lens, float *out) {
    const sk_decode_select_desc *d = &c->desc;
    const int32_t mb = dc_max_blocks(c), D = (int32_t)d->head_dim;
    for (int32_t b = 0; b < d->batch; ++b)
        for (int32_t h = 0; h < d->heads_kv; ++h)
            for (int32_t j = 0; j < mb; ++j) {
                float *mn = out + (((int64_t)b * d->heads_kv + h) * mb + j) * 2 * D, *mx = mn + D;
                for (int32_t e = 0; e < D; ++e) {
                    mn[e] = INFINITY;
                    mx[e] = -INFINITY;
                }
                for (int32_t pos = j * d->block_k; pos < (j + 1) * d->block_k && pos < lens[b]; ++pos)
                    for (int32_t e = 0; e < D; ++e) {
                        const float x = tu_load(c->cache, d->dtype, key_index(c, b, pos, h) + e);
                        if (isnan(x)) continue;
                        mn[e] = x < mn[e] ? x : mn[e];
                        mx[e] = x > mx[e] ? x : mx[e];
                    }
            }
    /* Groups: the min / max of their blocks' summaries. */
    const int32_t mg = dc_max_groups(c), rows = dc_rows(c);
    for (int32_t r = 0; r < rows; ++r)
        for (int32_t g = 0; g < mg; ++g) {
            float *gmn = out + ((int64_t)rows * mb + (int64_t)r * mg + g) * 2 * D, *gmx = gmn + D;
            for (int32_t e = 0; e < D; ++e) {
                gmn[e] = INFINITY;
                gmx[e] = -INFINITY;
            }
            for (int32_t j = g * d->group_blocks; j < (g + 1) * d->group_blocks && j < mb; ++j) {
                const float *bmn = out + ((int64_t)r * mb + j) * 2 * D, *bmx = bmn + D;
                for (int32_t e = 0; e < D; ++e) {
                    gmn[e] = bmn[e] < gmn[e] ? bmn[e] : gmn[e];
                    gmx[e] = bmx[e] > gmx[e] ? bmx[e] : gmx[e];
                }
            }
        }
}

void dc_summary_to_f32(const dc_case *c, const void *summary, float *out) {
    const int64_t n = dc_summary_elems(c);
    for (int64_t i = 0; i < n; ++i) out[i] = tu_load(summary, c->desc.dtype, i);
}

typedef struct dc_pair {
    double score;
    int32_t index;
} dc_pair;

static int by_score(const void *a, const void *b) {
    const dc_pair *x = (const dc_pair *)a, *y = (const dc_pair *)b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}
static int by_int(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* fp64 score of a summary (mn, mx) for row (b, h): Quest's bound head by
 * head and token by token where the summary is finite, the documented
 * form (whose 0 x inf is NaN) where it is not. */
static double naive_bound(const dc_case *c, int32_t b, int32_t h, const float *mn, const float *mx) {
    const sk_decode_select_desc *d = &c->desc;
    const int32_t D = (int32_t)d->head_dim, G = (int32_t)(d->heads_q / d->heads_kv);
    double s = 0.0;
    for (int32_t e = 0; e < D; ++e) {
        double quest = 0.0, qp = 0.0, qn = 0.0;
        for (int32_t t = 0; t < d->q_len; ++t)
            for (int32_t g = 0; g < G; ++g) {
                const double qv = tu_load(c->q, d->dtype, q_index(c, b, t, h * G + g) + e);
                const double a = qv * mn[e], z = qv * mx[e];
                quest += a > z ? a : z;
                qp += qv > 0.0 ? qv : 0.0;
                qn += qv < 0.0 ? qv : 0.0;
            }
        s += isfinite(mn[e]) && isfinite(mx[e]) ? quest : qp * mx[e] + qn * mn[e];
    }
    return s * (d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)D));
}

/* The k best of m pairs (sorted in place), ties to the lower index. */
static int32_t best(dc_pair *pairs, int32_t m, int32_t k, int32_t *out) {
    qsort(pairs, (size_t)m, sizeof *pairs, by_score);
    int32_t n = 0;
    for (int32_t e = 0; e < m && e < k; ++e) out[n++] = pairs[e].index;
    return n;
}

void dc_naive_select(const dc_case *c, const float *summary, int32_t *offsets, int32_t *indices,
                     double *scores) {
    const sk_decode_select_desc *d = &c->desc;
    const int32_t mb = dc_max_blocks(c), mg = dc_max_groups(c), D = (int32_t)d->head_dim;
    const int32_t rows = dc_rows(c);
    dc_pair *pairs = (dc_pair *)malloc((size_t)mb * sizeof *pairs);
    int32_t *row = (int32_t *)malloc((size_t)mb * 4), *kept = (int32_t *)malloc((size_t)mb * 4);
    char *keep = (char *)malloc((size_t)mb);
    int32_t off = 0;
    for (int32_t r = 0; r < rows; ++r) {
        const int32_t b = r / (int32_t)d->heads_kv, h = r % (int32_t)d->heads_kv;
        const int32_t n = (c->lens[b] + d->block_k - 1) / d->block_k;
        memset(keep, 1, (size_t)mb);
        if (mg > 0) { /* the first level: the top_groups best groups */
            const int32_t n2 = (n + d->group_blocks - 1) / d->group_blocks;
            int32_t m = 0;
            for (int32_t g = 0; g < n2; ++g) {
                const float *mn = summary + ((int64_t)rows * mb + (int64_t)r * mg + g) * 2 * D;
                const double s = naive_bound(c, b, h, mn, mn + D);
                if (!isnan(s) && s != -INFINITY) pairs[m].score = s, pairs[m].index = g, ++m;
            }
            const int32_t nk = best(pairs, m, d->top_groups, kept);
            memset(keep, 0, (size_t)mb);
            for (int32_t e = 0; e < nk; ++e) keep[kept[e]] = 1;
        }
        int32_t cnt = 0, m = 0;
        for (int32_t j = 0; j < mb; ++j) {
            const float *mn = summary + ((int64_t)r * mb + j) * 2 * D;
            const int in_kept = keep[mg > 0 ? j / d->group_blocks : j];
            const double s = in_kept ? naive_bound(c, b, h, mn, mn + D) : -INFINITY;
            if (scores != NULL) scores[(int64_t)r * mb + j] = j < n ? s : NAN;
            if (j >= n) continue;
            const int forced = j < d->sink_blocks || j >= n - d->recent_blocks;
            if (forced)
                row[cnt++] = j;
            else if (!isnan(s) && s != -INFINITY)
                pairs[m].score = s, pairs[m].index = j, ++m;
        }
        cnt += best(pairs, m, d->k, row + cnt);
        qsort(row, (size_t)cnt, 4, by_int);
        offsets[r] = off;
        memcpy(indices + off, row, (size_t)cnt * 4);
        off += cnt;
    }
    offsets[rows] = off;
    free(pairs), free(row), free(kept), free(keep);
}
