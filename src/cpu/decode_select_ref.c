/*
 * decode_select_ref.c - the CPU reference of the decode page selection
 * (sparsek.h "Decode page selection"): key block summaries (build and
 * append), the Quest scores in the documented fp32 order, and the per-row
 * selection through the top-k reference's row selector. Problems arrive
 * checked (src/core/decode_select.c), lengths and page indices included.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/decode_select.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

/* Store fp32 `x` (a value of p->dtype: exact) as element i of a dtype array. */
static void store_exact(void *dst, sk_dtype dtype, int64_t i, float x) {
    if (dtype == SK_DTYPE_F32)
        ((float *)dst)[i] = x;
    else if (dtype == SK_DTYPE_F16)
        ((uint16_t *)dst)[i] = sk_f32_to_f16(x);
    else
        ((uint16_t *)dst)[i] = sk_f32_to_bf16(x);
}

/* Element offset of key `pos` of sequence b, KV head h, channel 0. */
static int64_t key_offset(const sk_dsel_problem *p, int32_t b, int32_t h, int64_t pos) {
    const int32_t page = p->page_table[(int64_t)b * p->page_table_stride + pos / p->page_size];
    return page * p->k_stride[0] + (pos % p->page_size) * p->k_stride[1] + h * p->k_stride[2];
}

/* Element offset of summary block j of row (b, h): its min, then its max. */
static int64_t summary_offset(const sk_dsel_problem *p, int32_t b, int32_t h, int32_t j) {
    return (((int64_t)b * p->heads_kv + h) * p->max_blocks + j) * 2 * p->head_dim;
}

/* Element offset of group g of row r (after every block summary). */
static int64_t group_offset(const sk_dsel_problem *p, int32_t r, int32_t g) {
    return ((int64_t)p->rows * p->max_blocks + (int64_t)r * p->max_groups + g) * 2 * p->head_dim;
}

/* Groups g0 .. g1 - 1 of row r from the summaries of their blocks below
 * n (the row's blocks with keys; the others are empty), in block order. */
static void update_groups(const sk_dsel_problem *p, int32_t r, int32_t g0, int32_t g1, int32_t n,
                          float *mn, float *mx) {
    const int32_t D = p->head_dim;
    for (int32_t g = g0; g < g1; ++g) {
        for (int32_t d = 0; d < D; ++d) {
            mn[d] = INFINITY;
            mx[d] = -INFINITY;
        }
        const int32_t j1 = (g + 1) * p->group_blocks < n ? (g + 1) * p->group_blocks : n;
        for (int32_t j = g * p->group_blocks; j < j1; ++j) {
            const int64_t off = summary_offset(p, r / p->heads_kv, r % p->heads_kv, j);
            for (int32_t d = 0; d < D; ++d) {
                const float lo = sk_cpu_load1_f32(p->summary_out, p->dtype, off + d);
                const float hi = sk_cpu_load1_f32(p->summary_out, p->dtype, off + D + d);
                if (lo < mn[d]) mn[d] = lo;
                if (hi > mx[d]) mx[d] = hi;
            }
        }
        const int64_t out = group_offset(p, r, g);
        for (int32_t d = 0; d < D; ++d) {
            store_exact(p->summary_out, p->dtype, out + d, mn[d]);
            store_exact(p->summary_out, p->dtype, out + D + d, mx[d]);
        }
    }
}

/* Block j of (b, h) over keys [from, to) merged into mn/mx, in position
 * order; a NaN channel never replaces a value. */
static void merge_keys(const sk_dsel_problem *p, int32_t b, int32_t h, int64_t from, int64_t to,
                       float *mn, float *mx) {
    for (int64_t pos = from; pos < to; ++pos) {
        const int64_t base = key_offset(p, b, h, pos);
        for (int32_t d = 0; d < p->head_dim; ++d) {
            const float x = sk_cpu_load1_f32(p->k_cache, p->dtype, base + d);
            if (x < mn[d]) mn[d] = x;
            if (x > mx[d]) mx[d] = x;
        }
    }
}

static void write_block(const sk_dsel_problem *p, int32_t b, int32_t h, int32_t j, const float *mn,
                        const float *mx) {
    const int64_t off = summary_offset(p, b, h, j);
    for (int32_t d = 0; d < p->head_dim; ++d) {
        store_exact(p->summary_out, p->dtype, off + d, mn[d]);
        store_exact(p->summary_out, p->dtype, off + p->head_dim + d, mx[d]);
    }
}

sk_status sk_cpu_dsel_summary(const sk_dsel_problem *p, int append) {
    float *buf = (float *)malloc((size_t)p->head_dim * 2 * sizeof(float));
    if (buf == NULL) return sk_error(SK_STATUS_ALLOC_FAILED, "no host memory for one summary");
    float *mn = buf, *mx = buf + p->head_dim;
    const int64_t bk = p->block_k;
    for (int32_t b = 0; b < p->batch; ++b) {
        const int64_t len = p->seq_lens[b];
        const int64_t old = append ? p->old_lens[b] : 0;
        if (append && old == len) continue; /* nothing appended */
        /* Build: every block; append: those holding keys old .. len - 1. */
        const int32_t j0 = append ? (int32_t)(old / bk) : 0;
        const int32_t j1 = append ? sk_dsel_blocks((int32_t)len, p->block_k) : p->max_blocks;
        for (int32_t h = 0; h < p->heads_kv; ++h)
            for (int32_t j = j0; j < j1; ++j) {
                const int64_t lo = j * bk, hi = lo + bk < len ? lo + bk : len;
                if (append && lo < old) { /* the old keys' summary, as stored */
                    const int64_t off = summary_offset(p, b, h, j);
                    for (int32_t d = 0; d < p->head_dim; ++d) {
                        mn[d] = sk_cpu_load1_f32(p->summary_out, p->dtype, off + d);
                        mx[d] = sk_cpu_load1_f32(p->summary_out, p->dtype, off + p->head_dim + d);
                    }
                } else {
                    for (int32_t d = 0; d < p->head_dim; ++d) {
                        mn[d] = INFINITY;
                        mx[d] = -INFINITY;
                    }
                }
                merge_keys(p, b, h, lo > old ? lo : old, hi, mn, mx);
                write_block(p, b, h, j, mn, mx);
            }
        /* Build: every group; append: those holding the updated blocks. */
        if (p->group_blocks > 0 && j1 > j0) {
            const int32_t nb = sk_dsel_blocks((int32_t)len, p->block_k);
            const int32_t g0 = append ? j0 / p->group_blocks : 0;
            const int32_t g1 = append ? (j1 - 1) / p->group_blocks + 1 : p->max_groups;
            for (int32_t h = 0; h < p->heads_kv; ++h)
                update_groups(p, b * p->heads_kv + h, g0, g1, nb, mn, mx);
        }
    }
    free(buf);
    return SK_STATUS_SUCCESS;
}

/* Qp, Qn of row (b, h) (sparsek.h: sums in the order t, then g). */
static void query_sums(const sk_dsel_problem *p, int32_t b, int32_t h, float *qp, float *qn) {
    for (int32_t d = 0; d < p->head_dim; ++d) qp[d] = qn[d] = 0.0f;
    for (int32_t t = 0; t < p->q_len; ++t)
        for (int32_t g = 0; g < p->group; ++g) {
            const int64_t base = b * p->q_stride[0] + t * p->q_stride[1] +
                                 ((int64_t)h * p->group + g) * p->q_stride[2];
            for (int32_t d = 0; d < p->head_dim; ++d) {
                const float x = sk_cpu_load1_f32(p->q, p->dtype, base + d);
                qp[d] += x > 0.0f ? x : 0.0f;
                qn[d] += x < 0.0f ? x : 0.0f;
            }
        }
}

/* The score of one block (sparsek.h: 32 lane chains, then pairwise). */
static float block_score(const sk_dsel_problem *p, const float *qp, const float *qn,
                         const void *sum, int64_t off) {
    float lane[SK_DSEL_LANES];
    const int32_t per = p->head_dim / SK_DSEL_LANES;
    for (int32_t l = 0; l < SK_DSEL_LANES; ++l) {
        float acc = 0.0f;
        for (int32_t c = 0; c < per; ++c) {
            const int32_t d = l * per + c;
            const float mx = sk_cpu_load1_f32(sum, p->dtype, off + p->head_dim + d);
            const float mn = sk_cpu_load1_f32(sum, p->dtype, off + d);
            acc = fmaf(qp[d], mx, acc);
            acc = fmaf(qn[d], mn, acc);
        }
        lane[l] = acc;
    }
    for (int32_t w = SK_DSEL_LANES / 2; w >= 1; w /= 2)
        for (int32_t l = 0; l < w; ++l) lane[l] = lane[l] + lane[l + w];
    return lane[0] * p->scale;
}

/* Row (b, h): its query sums and the scores of its candidate blocks; with
 * two levels, the groups first (kept ones flagged in `kept`, scratch for
 * max_groups entries, with `pairs` and `out`), and -inf for the blocks of
 * the other groups. */
static void row_scores(const sk_dsel_problem *p, int32_t b, int32_t h, float *qp, float *qn,
                       float *scores, char *kept, sk_topk_pair *pairs, int32_t *out) {
    const int32_t n = sk_dsel_blocks(p->seq_lens[b], p->block_k);
    query_sums(p, b, h, qp, qn);
    if (p->group_blocks > 0) {
        const int32_t r = b * p->heads_kv + h;
        const int32_t n2 = (n + p->group_blocks - 1) / p->group_blocks;
        for (int32_t g = 0; g < n2; ++g) {
            scores[g] = block_score(p, qp, qn, p->summary, group_offset(p, r, g));
            kept[g] = 0;
        }
        sk_topk_problem tp;
        memset(&tp, 0, sizeof tp);
        tp.k = p->top_groups;
        const sk_topk_row rule = sk_dsel_row_rules(n2, 0, 0, p->top_groups);
        const int32_t c = sk_cpu_topk_select_row(&tp, &rule, scores, pairs, out);
        for (int32_t e = 0; e < c; ++e) kept[out[e]] = 1;
    }
    for (int32_t j = 0; j < n; ++j)
        scores[j] = p->group_blocks > 0 && !kept[j / p->group_blocks]
                        ? -INFINITY
                        : block_score(p, qp, qn, p->summary, summary_offset(p, b, h, j));
}

sk_status sk_cpu_dsel_select(const sk_dsel_problem *p) {
    const size_t mb = (size_t)p->max_blocks;
    float *scores = (float *)malloc(mb * sizeof(float) + 2 * (size_t)p->head_dim * sizeof(float));
    sk_topk_pair *pairs = (sk_topk_pair *)malloc(mb * sizeof *pairs);
    int32_t *out = (int32_t *)malloc(mb * sizeof(int32_t));
    char *kept = (char *)malloc(mb); /* max_groups <= max_blocks */
    if (scores == NULL || pairs == NULL || out == NULL || kept == NULL) {
        free(scores), free(pairs), free(out), free(kept);
        return sk_error(SK_STATUS_ALLOC_FAILED, "no host memory for %d block scores",
                        (int)p->max_blocks);
    }
    float *qp = scores + mb, *qn = qp + p->head_dim;
    /* The top-k row selector reads only the problem's k. */
    sk_topk_problem tp;
    memset(&tp, 0, sizeof tp);
    tp.k = p->k;
    int32_t off = 0;
    for (int32_t r = 0; r < p->rows; ++r) {
        const int32_t b = r / p->heads_kv, h = r % p->heads_kv;
        const int32_t n = sk_dsel_blocks(p->seq_lens[b], p->block_k);
        const sk_topk_row rule = sk_dsel_row_rules(n, p->sink_blocks, p->recent_blocks, p->k);
        row_scores(p, b, h, qp, qn, scores, kept, pairs, out);
        const int32_t count = sk_cpu_topk_select_row(&tp, &rule, scores, pairs, out);
        p->row_offsets[r] = off;
        if (count > 0) memcpy(p->col_indices + off, out, (size_t)count * sizeof(int32_t));
        off += count;
    }
    p->row_offsets[p->rows] = off;
    free(scores), free(pairs), free(out), free(kept);
    return SK_STATUS_SUCCESS;
}
