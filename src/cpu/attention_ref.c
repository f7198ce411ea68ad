/*
 * attention_ref.c - the CPU reference block-sparse attention forward.
 *
 * Work unit ("tile"): one (batch b, query head h, query block i), i.e. up to
 * block_q query rows that share one layout row. Tiles are independent and
 * are spread over OpenMP threads (dynamic schedule: rows differ in length).
 * One run may hold several problems (a varlen call: one per sequence,
 * attention_varlen_ref.c), numbered one after another into one tile range.
 *
 * Per tile, an online softmax over the selected key blocks, in order:
 *   1. Q rows of the tile -> fp32 (once per tile).
 *   2. For each selected key block j: K -> fp32, transposed [D, bk], and
 *      V -> fp64 [bk, D] (once per tile and block).
 *   3. For each query row q, the admissible keys of the block are a prefix
 *      of it: k < Sk (tails) and, when causal, k <= q + (Sk - Sq). Scores
 *      s = scale * dot(q, k) in fp32; the running max m is raised if needed
 *      (rescaling l and acc by exp(m_old - m_new) in fp64); then
 *      p = expf(s - m) in fp32, and l += p, acc += p * v in fp64.
 *   4. O = acc / l rounded once to O's dtype (RNE), LSE = m + log(l).
 *      A row that never had an admissible key gets O = 0, LSE = -inf.
 *
 * Invariants: nothing outside [0, Sq) x [0, Sk) is read; only the tile's O
 * rows and LSE entries are written, by the one thread that owns the tile;
 * a tile's result does not depend on the thread count (bitwise repeatable).
 * Scratch (one slab per thread) is allocated before anything is written, so
 * an allocation failure leaves the outputs untouched.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/fp8.h"
#include "cpu/dots.h"
#include "cpu/half.h"

/* Per-thread scratch of one tile. */
typedef struct attn_scratch {
    float *q;     /* [bq, D] the tile's queries */
    float *krow;  /* [D]     one key row, before transposing */
    float *kt;    /* [D, bk] one key block, transposed */
    double *v;    /* [bk, D] one value block */
    float *s;     /* [bk]    one row's scores, then probabilities */
    double *acc;  /* [bq, D] unnormalised O */
    double *l;    /* [bq]    sum of p */
    float *m;     /* [bq]    running max score */
    int32_t *hit; /* [bq]    1 once the row had an admissible key */
} attn_scratch;

enum { SK_CPU_ALIGN = 64 }; /* slabs start on their own cache lines */

static size_t round_up(size_t x) {
    return (x + SK_CPU_ALIGN - 1) / SK_CPU_ALIGN * SK_CPU_ALIGN;
}

/* Bytes of one thread's slab; false if that does not fit size_t. */
static int scratch_bytes(int64_t d, int64_t bq, int64_t bk, size_t *bytes) {
    /* The largest array is [128, D] doubles: D must leave room for that. */
    if (d > (int64_t)(SIZE_MAX / 8 / 1024)) return 0;
    const size_t D = (size_t)d, Q = (size_t)bq, K = (size_t)bk;
    *bytes = round_up(Q * D * sizeof(float)) + round_up(D * sizeof(float)) +
             round_up(D * K * sizeof(float)) + round_up(K * D * sizeof(double)) +
             round_up(K * sizeof(float)) + round_up(Q * D * sizeof(double)) +
             round_up(Q * sizeof(double)) + round_up(Q * sizeof(float)) +
             round_up(Q * sizeof(int32_t));
    return 1;
}

static void scratch_carve(attn_scratch *w, char *base, int64_t d, int64_t bq, int64_t bk) {
    const size_t D = (size_t)d, Q = (size_t)bq, K = (size_t)bk;
    w->q = (float *)base;
    base += round_up(Q * D * sizeof(float));
    w->krow = (float *)base;
    base += round_up(D * sizeof(float));
    w->kt = (float *)base;
    base += round_up(D * K * sizeof(float));
    w->v = (double *)base;
    base += round_up(K * D * sizeof(double));
    w->s = (float *)base;
    base += round_up(K * sizeof(float));
    w->acc = (double *)base;
    base += round_up(Q * D * sizeof(double));
    w->l = (double *)base;
    base += round_up(Q * sizeof(double));
    w->m = (float *)base;
    base += round_up(Q * sizeof(float));
    w->hit = (int32_t *)base;
}

static int64_t min_i64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* Element offset of [b, s, h, 0] for a resolved stride triple. */
static int64_t offset_of(const int64_t stride[3], int64_t b, int64_t s, int64_t h) {
    return b * stride[0] + s * stride[1] + h * stride[2];
}

/* Element offset of key (or value) s of batch b, KV head h: through the
 * page table in a paged problem (batch 0 only, problem.h). */
static int64_t kv_offset_of(const sk_attention_problem *p, const int64_t stride[3], int64_t b,
                            int64_t s, int64_t h) {
    if (p->page_table == NULL) return offset_of(stride, b, s, h);
    return offset_of(stride, p->page_table[s / p->page_size], s % p->page_size, h);
}

/* Key block starting at token k0, nk valid keys, for (b, KV head hk). */
static void load_kv_block(const sk_attention_problem *p, int64_t b, int64_t hk, int64_t k0,
                          int64_t nk, attn_scratch *w) {
    const int64_t D = p->head_dim, bk = p->block_k;
    for (int64_t kk = 0; kk < nk; ++kk) {
        const void *krow =
            sk_cpu_elem(p->k, p->dtype, kv_offset_of(p, p->k_stride, b, k0 + kk, hk));
        sk_cpu_load_f32(w->krow, krow, p->dtype, D);
        for (int64_t d = 0; d < D; ++d) w->kt[d * bk + kk] = w->krow[d];
        const void *vrow =
            sk_cpu_elem(p->v, p->dtype, kv_offset_of(p, p->v_stride, b, k0 + kk, hk));
        sk_cpu_load_f64(w->v + kk * D, vrow, p->dtype, D);
    }
}

/* acc[d] += sum_kk p[kk] * v[kk * dim + d] for kk < n, in fp64, each sum in
 * order of kk; the inner loop runs over contiguous columns. */
static void accumulate_pv(double *acc, const float *p, const double *v, int64_t dim, int64_t n) {
    for (int64_t kk = 0; kk < n; ++kk) {
        const double pk = (double)p[kk];
        const double *vr = v + kk * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) acc[d] += pk * vr[d];
    }
}

/* One query row against the first nvalid keys of the loaded block. */
static void attend_row(const sk_attention_problem *p, int64_t r, int64_t nvalid, attn_scratch *w) {
    const int64_t D = p->head_dim;
    float *s = w->s;
    double *acc = w->acc + r * D;

    sk_cpu_dots_f32(s, w->q + r * D, w->kt, p->block_k, D, nvalid);
    float block_max = -INFINITY;
    for (int64_t kk = 0; kk < nvalid; ++kk) {
        s[kk] *= p->scale;
        if (s[kk] > block_max) block_max = s[kk]; /* NaN scores never win; they reach O via p */
    }

    /* Raise the running max; rescale what was accumulated against the old one. */
    if (block_max > w->m[r]) {
        if (w->hit[r]) {
            const double alpha = exp((double)w->m[r] - (double)block_max);
            w->l[r] *= alpha;
            for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
        }
        w->m[r] = block_max;
    }
    w->hit[r] = 1;

    const float m = w->m[r];
    double lsum = 0.0;
    for (int64_t kk = 0; kk < nvalid; ++kk) {
        s[kk] = expf(s[kk] - m);
        lsum += (double)s[kk];
    }
    w->l[r] += lsum;
    accumulate_pv(acc, s, w->v, D, nvalid);
}

static void attention_tile(const sk_attention_problem *p, int64_t b, int64_t h, int64_t i,
                           attn_scratch *w) {
    const int64_t D = p->head_dim, Sq = p->seq_q, Sk = p->seq_k;
    const int64_t q0 = i * p->block_q, nq = min_i64(p->block_q, Sq - q0);
    const int64_t hk = h / p->group;
    const int64_t slice = (p->layout_batch == 1 ? 0 : b) * p->layout_heads + h / p->head_div;
    const int64_t g = slice * p->slice_rows + i;
    const int64_t shift = Sk - Sq; /* causal: k <= q + shift */

    for (int64_t r = 0; r < nq; ++r) {
        const void *qrow = sk_cpu_elem(p->q, p->dtype, offset_of(p->q_stride, b, q0 + r, h));
        sk_cpu_load_f32(w->q + r * D, qrow, p->dtype, D);
        for (int64_t d = 0; d < D; ++d) w->acc[r * D + d] = 0.0;
        w->l[r] = 0.0;
        w->m[r] = -INFINITY;
        w->hit[r] = 0;
    }

    for (int32_t e = p->row_offsets[g]; e < p->row_offsets[g + 1]; ++e) {
        const int64_t k0 = (int64_t)p->col_indices[e] * p->block_k;
        const int64_t nk = min_i64(p->block_k, Sk - k0);
        /* Causal: the last row sees the most; skip the block if it sees none. */
        if (p->causal && q0 + nq - 1 + shift < k0) continue;
        load_kv_block(p, b, hk, k0, nk, w);
        for (int64_t r = 0; r < nq; ++r) {
            int64_t nvalid = nk;
            if (p->causal) nvalid = min_i64(nk, q0 + r + shift - k0 + 1);
            if (nvalid > 0) attend_row(p, r, nvalid, w);
        }
    }

    for (int64_t r = 0; r < nq; ++r) {
        double *acc = w->acc + r * D;
        double lse;
        if (w->hit[r]) {
            const double l = w->l[r];
            for (int64_t d = 0; d < D; ++d) acc[d] /= l;
            lse = (double)w->m[r] + log(l);
        } else {
            /* acc is still all zeros: O = 0. */
            lse = -INFINITY;
        }
        void *orow = sk_cpu_elem_mut(p->o, p->out_dtype, offset_of(p->o_stride, b, q0 + r, h));
        sk_cpu_store_f64(orow, p->out_dtype, acc, D);
        if (p->lse != NULL) p->lse[(b * p->heads_q + h) * p->lse_head_stride + q0 + r] = (float)lse;
    }
}

/* The problem holding tile t: the last c with tile_start[c] <= t. */
static int32_t problem_of_tile(const int64_t *tile_start, int32_t count, int64_t t) {
    int32_t lo = 0, hi = count - 1;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (tile_start[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

sk_status sk_cpu_attention_run_problems(const sk_attention_problem *probs,
                                        const int64_t *tile_start, int32_t count) {
    const sk_attention_problem *p = &probs[0]; /* head_dim and blocks: the same in all */
    size_t slab;
    if (!scratch_bytes(p->head_dim, p->block_q, p->block_k, &slab))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "head_dim = %lld is too large for the CPU backend's scratch buffers",
                        (long long)p->head_dim);
    /* One slab per thread; fall back to one thread if that much is not there. */
    int threads = omp_get_max_threads();
    if (threads < 1) threads = 1;
    char *mem = NULL;
    if ((size_t)threads <= SIZE_MAX / slab) mem = (char *)malloc(slab * (size_t)threads);
    if (mem == NULL) {
        threads = 1;
        mem = (char *)malloc(slab);
    }
    if (mem == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate %zu bytes of scratch (head_dim = %lld)",
                        slab, (long long)p->head_dim);

    const int64_t tiles = tile_start[count];
#pragma omp parallel num_threads(threads)
    {
        attn_scratch w;
        scratch_carve(&w, mem + slab * (size_t)omp_get_thread_num(), p->head_dim, p->block_q,
                      p->block_k);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; ++t) {
            const sk_attention_problem *pc = &probs[problem_of_tile(tile_start, count, t)];
            const int64_t local = t - tile_start[pc - probs];
            const int64_t i = local % pc->row_blocks, bh = local / pc->row_blocks;
            attention_tile(pc, bh / pc->heads_q, bh % pc->heads_q, i, &w);
        }
    }
    free(mem);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cpu_attention_run(const sk_attention_problem *p) {
    if (p->dtype == SK_DTYPE_E4M3) return sk_cpu_attention_fp8_run(p); /* dequantizes, then here */
    /* B x Hq x row_blocks tiles: fewer than B x Sq x Hq, so it fits. */
    const int64_t tile_start[2] = {0, p->batch * p->heads_q * p->row_blocks};
    return sk_cpu_attention_run_problems(p, tile_start, 1);
}
