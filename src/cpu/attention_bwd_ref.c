/*
 * attention_bwd_ref.c - the CPU reference attention backward (the
 * formulas are in sparsek.h, "Attention backward").
 *
 * Two passes, each output element owned by exactly one work unit that
 * sums in a fixed order, so the result does not depend on the number of
 * threads (bitwise repeatable):
 *   dQ pass:    one unit per (b, query head h, query block i), a layout
 *               row: its selected key blocks in order, as the forward.
 *   dK/dV pass: one unit per (b, KV head hk, key block j): for each query
 *               head h of hk's group in order, the query blocks i that
 *               select j in slice(b, h), in increasing order. Those are
 *               column j of the layout's transpose, a CSC built here once
 *               per call (col_offsets / row_indices, host scratch).
 * Both passes treat a (query row, key block) pair alike (row_grads):
 *   s  = scale * dot(Q_q, K_k)   fp32 dot, as the forward's scores
 *   p  = expf(s - LSE_q)         fp32, with the forward's LSE
 *   dp = dot(dO_q, V_k)          fp32
 *   ds = p * (dp - Dl_q)         fp32; Dl_q = (float)(fp64 sum dO_q * O_q)
 * over the admissible prefix of the block (k < Sk and, when causal,
 * k <= q + Sk - Sq: the forward's rule), and accumulate in fp64:
 *   dQ pass:    dQ_q += ds_k K_k
 *   dK/dV pass: dK_k += ds_k Q_q,  dV_k += p_k dO_q
 * then dQ and dK are multiplied by scale and every element is rounded once
 * to the dtype. A query row with no admissible key never gets a row_grads
 * call: its dQ is 0, and its Q, O, dO and LSE values reach no output.
 *
 * Layout rows and LSE are addressed through the problem's slice_rows and
 * lse_head_stride (problem.h), so a varlen sequence's problem
 * (attention_varlen_bwd_ref.c: the layout's R rows per slice, LSE [Hq,
 * total_q]) runs here unchanged; sk_cpu_attention_backward_run_problems
 * runs several problems with one scratch allocation.
 *
 * Invariants: nothing outside [0, Sq) x [0, Sk) is read; every element of
 * dQ, dK and dV is written once, by the unit that owns it (0 where nothing
 * adds up); all scratch is allocated before anything is written, so an
 * allocation failure leaves the outputs untouched.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/dots.h"
#include "cpu/half.h"

/* Per-thread scratch, for either pass. T = max(block_q, block_k). */
typedef struct bwd_scratch {
    float *q;     /* [bq, D] the query rows of a block */
    float *dout;  /* [bq, D] their dO rows */
    float *dl;    /* [bq]    their Dl = rowsum(dO * O) */
    float *lse;   /* [bq]    their LSE */
    float *orow;  /* [D]     one O row */
    float *kt;    /* [D, bk] a key block, transposed */
    float *vt;    /* [D, bk] its value block, transposed */
    double *kd;   /* [bk, D] the key block in fp64 rows (dQ pass) */
    double *acc;  /* [T, D]  dQ (dQ pass) or dK (dK/dV pass) */
    double *acc2; /* [bk, D] dV (dK/dV pass) */
    float *p;     /* [bk]    one row's probabilities */
    float *ds;    /* [bk]    one row's dS */
} bwd_scratch;

enum { SK_CPU_ALIGN = 64 }; /* slabs and arrays start on their own cache lines */

static size_t round_up(size_t x) {
    return (x + SK_CPU_ALIGN - 1) / SK_CPU_ALIGN * SK_CPU_ALIGN;
}

/* Bytes of one thread's slab, and the arrays carved from `base` when it
 * is not NULL, in the order of bwd_scratch. */
static size_t scratch_layout(bwd_scratch *w, char *base, size_t d, size_t bq, size_t bk) {
    const size_t t = bq > bk ? bq : bk;
    const size_t sizes[12] = {bq * d * 4, bq * d * 4, bq * 4,    bq * 4,     d * 4,  d * bk * 4,
                              d * bk * 4, bk * d * 8, t * d * 8, bk * d * 8, bk * 4, bk * 4};
    size_t at[12], total = 0;
    for (int i = 0; i < 12; ++i) {
        at[i] = total;
        total += round_up(sizes[i]);
    }
    if (base != NULL) {
        w->q = (float *)(base + at[0]);
        w->dout = (float *)(base + at[1]);
        w->dl = (float *)(base + at[2]);
        w->lse = (float *)(base + at[3]);
        w->orow = (float *)(base + at[4]);
        w->kt = (float *)(base + at[5]);
        w->vt = (float *)(base + at[6]);
        w->kd = (double *)(base + at[7]);
        w->acc = (double *)(base + at[8]);
        w->acc2 = (double *)(base + at[9]);
        w->p = (float *)(base + at[10]);
        w->ds = (float *)(base + at[11]);
    }
    return total;
}

static int64_t min_i64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* Element offset of [b, s, h, 0] for a resolved stride triple. */
static int64_t offset_of(const int64_t stride[3], int64_t b, int64_t s, int64_t h) {
    return b * stride[0] + s * stride[1] + h * stride[2];
}

/* The layout slice query head h of batch b reads (problem.h). */
static int64_t slice_of(const sk_attention_problem *f, int64_t b, int64_t h) {
    return (f->layout_batch == 1 ? 0 : b) * f->layout_heads + h / f->head_div;
}

/* Admissible keys of query token q in the block starting at k0 with nk
 * valid keys: a prefix of the block (<= 0: none). */
static int64_t admissible(const sk_attention_problem *f, int64_t q, int64_t k0, int64_t nk) {
    if (!f->causal) return nk;
    return min_i64(nk, q + (f->seq_k - f->seq_q) - k0 + 1);
}

/* Query rows q0 .. q0+nq-1 of (b, h): Q and dO to fp32, Dl and LSE. */
static void load_rows(const sk_attention_backward_problem *p, int64_t b, int64_t h, int64_t q0,
                      int64_t nq, bwd_scratch *w) {
    const sk_attention_problem *f = &p->fwd;
    const int64_t D = f->head_dim;
    for (int64_t r = 0; r < nq; ++r) {
        const int64_t s = q0 + r;
        sk_cpu_load_f32(w->q + r * D, sk_cpu_elem(f->q, f->dtype, offset_of(f->q_stride, b, s, h)),
                        f->dtype, D);
        float *dout = w->dout + r * D;
        sk_cpu_load_f32(dout, sk_cpu_elem(p->dout, f->dtype, offset_of(p->dout_stride, b, s, h)),
                        f->dtype, D);
        sk_cpu_load_f32(w->orow, sk_cpu_elem(f->o, f->dtype, offset_of(f->o_stride, b, s, h)),
                        f->dtype, D);
        double dl = 0.0;
        for (int64_t x = 0; x < D; ++x) dl += (double)dout[x] * (double)w->orow[x];
        w->dl[r] = (float)dl;
        w->lse[r] = f->lse[(b * f->heads_q + h) * f->lse_head_stride + s];
    }
}

/* Key block starting at token k0 (nk valid keys) of (b, KV head hk): K and
 * V transposed in fp32, and K in fp64 rows when kd is wanted. */
static void load_kv_block(const sk_attention_problem *f, int64_t b, int64_t hk, int64_t k0,
                          int64_t nk, int want_kd, bwd_scratch *w) {
    const int64_t D = f->head_dim, bk = f->block_k;
    for (int64_t kk = 0; kk < nk; ++kk) {
        const void *krow = sk_cpu_elem(f->k, f->dtype, offset_of(f->k_stride, b, k0 + kk, hk));
        const void *vrow = sk_cpu_elem(f->v, f->dtype, offset_of(f->v_stride, b, k0 + kk, hk));
        for (int64_t x = 0; x < D; ++x) {
            w->kt[x * bk + kk] = sk_cpu_load1_f32(krow, f->dtype, x);
            w->vt[x * bk + kk] = sk_cpu_load1_f32(vrow, f->dtype, x);
        }
        if (want_kd) sk_cpu_load_f64(w->kd + kk * D, krow, f->dtype, D);
    }
}

/* Row r of the loaded query rows against the first n keys of the loaded
 * block: w->p = P and w->ds = dS (without the scale of dQ and dK). */
static void row_grads(const sk_attention_problem *f, int64_t r, int64_t n, bwd_scratch *w) {
    const int64_t D = f->head_dim, bk = f->block_k;
    sk_cpu_dots_f32(w->p, w->q + r * D, w->kt, bk, D, n);
    sk_cpu_dots_f32(w->ds, w->dout + r * D, w->vt, bk, D, n);
    const float lse = w->lse[r], dl = w->dl[r];
    for (int64_t kk = 0; kk < n; ++kk) {
        w->p[kk] = expf(w->p[kk] * f->scale - lse);
        w->ds[kk] = w->p[kk] * (w->ds[kk] - dl);
    }
}

/* acc[x] += sum_kk c[kk] * rows[kk * dim + x] for kk < n, in fp64, each sum
 * in order of kk. */
static void accumulate_rows(double *acc, const float *c, const double *rows, int64_t dim,
                            int64_t n) {
    for (int64_t kk = 0; kk < n; ++kk) {
        const double ck = (double)c[kk];
        const double *row = rows + kk * dim;
#pragma omp simd
        for (int64_t x = 0; x < dim; ++x) acc[x] += ck * row[x];
    }
}

/* acc[kk * dim + x] += c[kk] * row[x] for kk < n, in fp64. */
static void accumulate_outer(double *acc, const float *c, const float *row, int64_t dim,
                             int64_t n) {
    for (int64_t kk = 0; kk < n; ++kk) {
        const double ck = (double)c[kk];
        double *a = acc + kk * dim;
#pragma omp simd
        for (int64_t x = 0; x < dim; ++x) a[x] += ck * (double)row[x];
    }
}

/* Rows of acc (n x D, fp64) times `scale` into a [B, S, H, D] tensor at
 * tokens s0 .. s0+n-1 of (b, head), each element rounded once. */
static void store_rows(const sk_attention_problem *f, void *out, const int64_t stride[3],
                       int64_t b, int64_t s0, int64_t head, double *acc, int64_t n,
                       double scale) {
    const int64_t D = f->head_dim;
    for (int64_t r = 0; r < n; ++r) {
        double *row = acc + r * D;
        if (scale != 1.0)
            for (int64_t x = 0; x < D; ++x) row[x] *= scale;
        sk_cpu_store_f64(sk_cpu_elem_mut(out, f->dtype, offset_of(stride, b, s0 + r, head)),
                         f->dtype, row, D);
    }
}

/* dQ of query block i of (b, h). */
static void dq_unit(const sk_attention_backward_problem *p, int64_t b, int64_t h, int64_t i,
                    bwd_scratch *w) {
    const sk_attention_problem *f = &p->fwd;
    const int64_t D = f->head_dim, Sq = f->seq_q, Sk = f->seq_k;
    const int64_t q0 = i * f->block_q, nq = min_i64(f->block_q, Sq - q0);
    const int64_t hk = h / f->group;
    const int64_t g = slice_of(f, b, h) * f->slice_rows + i;

    load_rows(p, b, h, q0, nq, w);
    for (int64_t x = 0; x < nq * D; ++x) w->acc[x] = 0.0;
    for (int32_t e = f->row_offsets[g]; e < f->row_offsets[g + 1]; ++e) {
        const int64_t k0 = (int64_t)f->col_indices[e] * f->block_k;
        const int64_t nk = min_i64(f->block_k, Sk - k0);
        if (admissible(f, q0 + nq - 1, k0, nk) <= 0) continue; /* the last row sees the most */
        load_kv_block(f, b, hk, k0, nk, 1, w);
        for (int64_t r = 0; r < nq; ++r) {
            const int64_t n = admissible(f, q0 + r, k0, nk);
            if (n <= 0) continue;
            row_grads(f, r, n, w);
            accumulate_rows(w->acc + r * D, w->ds, w->kd, D, n);
        }
    }
    store_rows(f, p->dq, p->dq_stride, b, q0, h, w->acc, nq, (double)f->scale);
}

/* The layout's transpose: for slice s and key block j, the query blocks
 * that select j, increasing, at row_indices[col_offsets[c] ..
 * col_offsets[c + 1]) with c = s * col_blocks + j. */
typedef struct bwd_csc {
    int32_t *col_offsets; /* [slices * col_blocks + 1] */
    int32_t *row_indices; /* [nnz] */
} bwd_csc;

static void csc_build(const sk_attention_problem *f, bwd_csc *t) {
    const int64_t slices = (int64_t)f->layout_batch * f->layout_heads;
    const int64_t cols = slices * f->col_blocks;
    for (int64_t c = 0; c <= cols; ++c) t->col_offsets[c] = 0;
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < f->row_blocks; ++i) {
            const int64_t g = s * f->slice_rows + i;
            for (int32_t e = f->row_offsets[g]; e < f->row_offsets[g + 1]; ++e)
                ++t->col_offsets[s * f->col_blocks + f->col_indices[e] + 1];
        }
    for (int64_t c = 0; c < cols; ++c) t->col_offsets[c + 1] += t->col_offsets[c];
    /* Fill in row order, advancing a cursor per column (col_offsets[c]
     * itself, shifted back afterwards). */
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < f->row_blocks; ++i) {
            const int64_t g = s * f->slice_rows + i;
            for (int32_t e = f->row_offsets[g]; e < f->row_offsets[g + 1]; ++e)
                t->row_indices[t->col_offsets[s * f->col_blocks + f->col_indices[e]]++] =
                    (int32_t)i;
        }
    for (int64_t c = cols; c > 0; --c) t->col_offsets[c] = t->col_offsets[c - 1];
    t->col_offsets[0] = 0;
}

/* dK and dV of key block j of (b, KV head hk). */
static void dkv_unit(const sk_attention_backward_problem *p, const bwd_csc *t, int64_t b,
                     int64_t hk, int64_t j, bwd_scratch *w) {
    const sk_attention_problem *f = &p->fwd;
    const int64_t D = f->head_dim, Sq = f->seq_q, Sk = f->seq_k;
    const int64_t k0 = j * f->block_k, nk = min_i64(f->block_k, Sk - k0);

    load_kv_block(f, b, hk, k0, nk, 0, w);
    for (int64_t x = 0; x < nk * D; ++x) w->acc[x] = w->acc2[x] = 0.0;
    for (int64_t h = hk * f->group; h < (hk + 1) * f->group; ++h) {
        const int64_t c = slice_of(f, b, h) * f->col_blocks + j;
        for (int32_t e = t->col_offsets[c]; e < t->col_offsets[c + 1]; ++e) {
            const int64_t q0 = (int64_t)t->row_indices[e] * f->block_q;
            const int64_t nq = min_i64(f->block_q, Sq - q0);
            if (admissible(f, q0 + nq - 1, k0, nk) <= 0) continue;
            load_rows(p, b, h, q0, nq, w);
            for (int64_t r = 0; r < nq; ++r) {
                const int64_t n = admissible(f, q0 + r, k0, nk);
                if (n <= 0) continue;
                row_grads(f, r, n, w);
                accumulate_outer(w->acc, w->ds, w->q + r * D, D, n);
                accumulate_outer(w->acc2, w->p, w->dout + r * D, D, n);
            }
        }
    }
    store_rows(f, p->dk, p->dk_stride, b, k0, hk, w->acc, nk, (double)f->scale);
    store_rows(f, p->dv, p->dv_stride, b, k0, hk, w->acc2, nk, 1.0);
}

/* Bytes of the layout transpose's offsets for problem f. slices *
 * col_blocks is not bounded by int32 (sk_grid_check bounds slices *
 * row_blocks and col_blocks, not the dense count): the CSC is indexed in
 * int64 (csc_build, dkv_unit) and its values are entry counts <= nnz <=
 * INT32_MAX. The attention's own sizes keep it small: col_blocks <= seq_k
 * / 64, slices <= batch x heads_q. */
static size_t csc_cols(const sk_attention_problem *f) {
    return (size_t)f->layout_batch * (size_t)f->layout_heads * (size_t)f->col_blocks;
}

/* One problem's two passes with the scratch allocated by the caller. */
static void run_problem(const sk_attention_backward_problem *p, bwd_csc *t, char *mem,
                        size_t slab, int threads) {
    const sk_attention_problem *f = &p->fwd;
    csc_build(f, t);
    const int64_t dq_units = f->batch * f->heads_q * f->row_blocks;   /* < B*Sq*Hq: fits */
    const int64_t dkv_units = f->batch * f->heads_kv * f->col_blocks; /* < B*Sk*Hkv */
#pragma omp parallel num_threads(threads)
    {
        bwd_scratch w;
        scratch_layout(&w, mem + slab * (size_t)omp_get_thread_num(), (size_t)f->head_dim,
                       (size_t)f->block_q, (size_t)f->block_k);
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t u = 0; u < dq_units; ++u) {
            const int64_t i = u % f->row_blocks, bh = u / f->row_blocks;
            dq_unit(p, bh / f->heads_q, bh % f->heads_q, i, &w);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < dkv_units; ++u) {
            const int64_t j = u % f->col_blocks, bh = u / f->col_blocks;
            dkv_unit(p, t, bh / f->heads_kv, bh % f->heads_kv, j, &w);
        }
    }
}

sk_status sk_cpu_attention_backward_run_problems(const sk_attention_backward_problem *probs,
                                                 int32_t count) {
    if (count < 1) return SK_STATUS_SUCCESS;
    /* Every problem shares the head_dim, the block sizes and the layout
     * arrays (nnz is the whole layout's): one scratch for all, sized for
     * the largest transpose. */
    const sk_attention_problem *f = &probs[0].fwd;
    /* The largest array is [128, D] doubles: D must leave room for that. */
    if (f->head_dim > (int64_t)(SIZE_MAX / 8 / 1024))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "head_dim = %lld is too large for the CPU backend's scratch buffers",
                        (long long)f->head_dim);
    const size_t slab = scratch_layout(NULL, NULL, (size_t)f->head_dim, (size_t)f->block_q,
                                       (size_t)f->block_k);
    size_t cols = 0;
    int32_t nnz = 0;
    for (int32_t c = 0; c < count; ++c) {
        if (csc_cols(&probs[c].fwd) > cols) cols = csc_cols(&probs[c].fwd);
        if (probs[c].fwd.nnz > nnz) nnz = probs[c].fwd.nnz;
    }
    bwd_csc t;
    t.col_offsets = (int32_t *)malloc((cols + 1) * sizeof(int32_t));
    t.row_indices = (int32_t *)malloc((nnz > 0 ? (size_t)nnz : 1) * sizeof(int32_t));
    /* One slab per thread; one thread if that much is not there. */
    int threads = omp_get_max_threads();
    if (threads < 1) threads = 1;
    char *mem = NULL;
    if ((size_t)threads <= SIZE_MAX / slab) mem = (char *)malloc(slab * (size_t)threads);
    if (mem == NULL) {
        threads = 1;
        mem = (char *)malloc(slab);
    }
    if (mem == NULL || t.col_offsets == NULL || t.row_indices == NULL) {
        free(mem);
        free(t.col_offsets);
        free(t.row_indices);
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate its backward scratch (%zu bytes a "
                        "thread, and the layout's transpose: %zu offsets, %d indices)",
                        slab, cols + 1, (int)nnz);
    }
    for (int32_t c = 0; c < count; ++c) run_problem(&probs[c], &t, mem, slab, threads);
    free(mem);
    free(t.col_offsets);
    free(t.row_indices);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cpu_attention_backward_run(const sk_attention_backward_problem *p) {
    return sk_cpu_attention_backward_run_problems(p, 1);
}
