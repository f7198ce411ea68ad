/*
 * score.cuh - the decode selection's scoring kernel (a part of select.cu,
 * included there only): per CTA a run of summaries of one row, one warp
 * per summary, the contract's arithmetic (sparsek.h "Decode page
 * selection": the lane FMA chains, the xor butterfly, times scale).
 *
 * Three passes use it (score_args):
 *   blocks   one level: CTA = (row, tile of SC_TILE blocks); 2048 CTAs at
 *            B 8, 128K: enough bytes in flight to stream the summaries;
 *   groups   two levels, first: CTA = (row, tile of SC_RUN groups), so a
 *            warp issues all of its loads at once (one round trip);
 *   kept     two levels, second: CTA = (row, kept slot, run of SC_RUN
 *            blocks of that group): only the kept groups' blocks get a
 *            CTA. The other blocks' -inf scores are written by the group
 *            select (select.cu), so no CTA walks the whole row.
 * Every CTA sums Qp / Qn itself (q_len x group values per channel, loaded
 * eight at a time and added in the contract's (t, g) order) while the
 * row's length loads: the prologue is one round trip, not q_len x group.
 */
#ifndef SK_CUDA_DECODE_SELECT_SCORE_CUH
#define SK_CUDA_DECODE_SELECT_SCORE_CUH

enum {
    SC_THREADS = 256,
    SC_WARPS = SC_THREADS / 32,
    SC_BATCH = 2,                   /* summaries a warp loads before it reduces */
    SC_RUN = SC_WARPS * SC_BATCH,   /* summaries of a groups / kept CTA: one batch */
    SC_TILE = 64,                   /* summaries of a blocks CTA */
    SC_MAX_DIM = 256,               /* the most channels (sparsek.h) */
    SC_Q_BATCH = 8                  /* query values loaded before they are added */
};

/* PER consecutive 16-bit values as fp32: one 4-, 8- or 16-byte load when
 * PER is 2, 4 or 8 (lane * PER * 2 bytes into a row of 2 * D * 2 bytes:
 * aligned), else one load per value. */
template <int PER>
static __device__ __forceinline__ void load_lane(const uint16_t *src, int bf16, float out[PER]) {
    if (PER == 2 || PER == 4 || PER == 8) {
        uint32_t w[4] = {0u, 0u, 0u, 0u};
        if (PER == 2) {
            w[0] = *reinterpret_cast<const uint32_t *>(src);
        } else if (PER == 4) {
            const uint2 v = *reinterpret_cast<const uint2 *>(src);
            w[0] = v.x;
            w[1] = v.y;
        } else {
            const uint4 v = *reinterpret_cast<const uint4 *>(src);
            w[0] = v.x;
            w[1] = v.y;
            w[2] = v.z;
            w[3] = v.w;
        }
#pragma unroll
        for (int c = 0; c < PER; ++c)
            out[c] = dsel_to_f32((w[c / 2] >> (16 * (c % 2))) & 0xffffu, bf16);
    } else {
#pragma unroll
        for (int c = 0; c < PER; ++c) out[c] = dsel_to_f32(src[c], bf16);
    }
}

/* Lane l's PER channels of Qp and Qn (from sum_queries' shared copy). */
template <int PER>
static __device__ __forceinline__ void lane_queries(const float *qs, int32_t lane, float qp[PER],
                                                    float qn[PER]) {
#pragma unroll
    for (int c = 0; c < PER; ++c) {
        qp[c] = qs[lane * PER + c];
        qn[c] = qs[SC_MAX_DIM + lane * PER + c];
    }
}

/* A warp's scores of the summaries j0 + u * SC_WARPS (u < BATCH) of
 * `row` below j_end, in every lane: all their loads first, then per
 * summary lane l's FMA chain over its PER channels (Qp x max, then Qn x
 * min), the xor butterfly over the 32 lanes, times scale. */
template <int PER, int BATCH>
static __device__ __forceinline__ void score_run(const uint16_t *row, int32_t j0, int32_t j_end,
                                                 int32_t head_dim, int bf16, int32_t lane,
                                                 const float qp[PER], const float qn[PER], float scale,
                                                 float out[BATCH]) {
    float mn[BATCH][PER], mx[BATCH][PER];
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
        const int32_t j = j0 + u * SC_WARPS;
        if (j >= j_end) continue; /* the same for the whole warp */
        const uint16_t *sum = row + (int64_t)j * 2 * head_dim + lane * PER;
        load_lane<PER>(sum + head_dim, bf16, mx[u]);
        load_lane<PER>(sum, bf16, mn[u]);
    }
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
        out[u] = 0.0f;
        if (j0 + u * SC_WARPS >= j_end) continue;
        float acc = 0.0f;
#pragma unroll
        for (int c = 0; c < PER; ++c) {
            acc = fmaf(qp[c], mx[u][c], acc);
            acc = fmaf(qn[c], mn[u][c], acc);
        }
#pragma unroll
        for (int o = SK_DSEL_LANES / 2; o >= 1; o >>= 1)
            acc = acc + __shfl_xor_sync(0xffffffffu, acc, o);
        out[u] = acc * scale;
    }
}

/* One scoring pass (see the header). */
typedef struct score_args {
    const uint16_t *summary; /* [rows, count, 2, D] */
    int32_t count;           /* summaries per row: max_blocks or max_groups */
    int32_t divisor;         /* a row scores ceil(n / divisor) of them: 1 or group_blocks */
    int32_t tile;            /* summaries per CTA (kept: per CTA of a group) */
    const int32_t *kept;     /* kept pass: the kept groups [rows, kept_stride], else NULL */
    const int32_t *kept_counts; /* [rows] */
    int32_t kept_stride, group_blocks;
    float *scores;           /* [rows, count] */
} score_args;

/* CTAs of a pass (int64: the caller checks the grid limit). */
static int64_t score_ctas(const sk_dsel_problem *p, const score_args *a) {
    if (a->kept != NULL)
        return (int64_t)p->rows * a->kept_stride * ((a->group_blocks + a->tile - 1) / a->tile);
    return (int64_t)p->rows * ((a->count + a->tile - 1) / a->tile);
}

/* Qp (qs[d]) and Qn (qs[SC_MAX_DIM + d]) of row r, in (t, g) order. */
static __device__ __forceinline__ void sum_queries(const sk_dsel_problem &p, int32_t r, float *qs) {
    const int bf16 = p.dtype == SK_DTYPE_BF16;
    const int32_t b = r / p.heads_kv, h = r % p.heads_kv;
    const int32_t tg = p.q_len * p.group;
    const uint16_t *q = (const uint16_t *)p.q + b * p.q_stride[0] + (int64_t)h * p.group * p.q_stride[2];
    for (int32_t d = (int32_t)threadIdx.x; d < p.head_dim; d += SC_THREADS) {
        float qp = 0.0f, qn = 0.0f;
        for (int32_t i0 = 0; i0 < tg; i0 += SC_Q_BATCH) {
            float x[SC_Q_BATCH];
#pragma unroll
            for (int e = 0; e < SC_Q_BATCH; ++e) {
                const int32_t i = i0 + e, t = i / p.group, g = i % p.group;
                x[e] = i < tg ? dsel_to_f32(q[t * p.q_stride[1] + g * p.q_stride[2] + d], bf16) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < SC_Q_BATCH; ++e)
                if (i0 + e < tg) {
                    qp += x[e] > 0.0f ? x[e] : 0.0f;
                    qn += x[e] < 0.0f ? x[e] : 0.0f;
                }
        }
        qs[d] = qp;
        qs[SC_MAX_DIM + d] = qn;
    }
}

/* The CTA's row and the summaries [j_begin, j_end) it scores (an empty
 * range when it has none). The loads (length, kept count, kept group) are
 * issued before the query sums and used after them: one round trip. */
typedef struct score_range {
    int32_t r, j_begin, j_end;
} score_range;

static __device__ __forceinline__ score_range score_prologue(const sk_dsel_problem &p,
                                                             const score_args &a, float *qs) {
    score_range s;
    int32_t slot = 0, part = 0;
    if (a.kept == NULL) {
        const int32_t tiles = (a.count + a.tile - 1) / a.tile;
        s.r = (int32_t)(blockIdx.x / tiles);
        s.j_begin = (int32_t)(blockIdx.x % tiles) * a.tile;
    } else {
        const int32_t parts = (a.group_blocks + a.tile - 1) / a.tile;
        const int32_t per_row = a.kept_stride * parts;
        s.r = (int32_t)(blockIdx.x / per_row);
        slot = (int32_t)(blockIdx.x % per_row) / parts;
        part = (int32_t)(blockIdx.x % parts);
        s.j_begin = 0;
    }
    const int32_t len = p.seq_lens[s.r / p.heads_kv];
    int32_t kept = 0, g = 0;
    if (a.kept != NULL) {
        /* The slot's entry may be past the row's count (then unused). */
        kept = a.kept_counts[s.r];
        g = a.kept[(int64_t)s.r * a.kept_stride + slot];
    }
    sum_queries(p, s.r, qs);
    const int32_t n = (sk_dsel_blocks(sk_dsel_clamp_len(len, p.max_seqlen_k), p.block_k) +
                       a.divisor - 1) / a.divisor;
    int64_t lo = s.j_begin, hi = (int64_t)s.j_begin + a.tile;
    if (a.kept != NULL) {
        kept = kept < 0 ? 0 : (kept > a.kept_stride ? a.kept_stride : kept); /* in range */
        lo = (int64_t)g * a.group_blocks + (int64_t)part * a.tile;
        const int64_t group_end = ((int64_t)g + 1) * a.group_blocks;
        hi = lo + a.tile < group_end ? lo + a.tile : group_end;
        if (slot >= kept || g < 0) lo = hi = 0; /* no group in this slot */
    }
    s.j_end = (int32_t)(hi < n ? hi : n);
    s.j_begin = (int32_t)(lo < s.j_end ? lo : s.j_end);
    return s;
}

template <int PER>
__global__ void __launch_bounds__(SC_THREADS, 1)
    sk_dsel_score_kernel(const __grid_constant__ sk_dsel_problem p, const __grid_constant__ score_args a) {
    __shared__ float qs[2 * SC_MAX_DIM]; /* Qp, then Qn */
    pdl_enter();
    const score_range s = score_prologue(p, a, qs);
    if (s.j_begin >= s.j_end) return; /* the same for the whole CTA */
    const int32_t r = s.r, j_begin = s.j_begin, j_end = s.j_end;
    __syncthreads();
    const int bf16 = p.dtype == SK_DTYPE_BF16;
    const int32_t warp = (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    float qp[PER], qn[PER];
    lane_queries<PER>(qs, lane, qp, qn);
    const uint16_t *row = a.summary + (int64_t)r * a.count * 2 * p.head_dim;
    float *out = a.scores + (int64_t)r * a.count;
    for (int32_t j0 = j_begin + warp; j0 < j_end; j0 += SC_RUN) {
        float sc[SC_BATCH];
        score_run<PER, SC_BATCH>(row, j0, j_end, p.head_dim, bf16, lane, qp, qn, p.scale, sc);
#pragma unroll
        for (int u = 0; u < SC_BATCH; ++u)
            if (lane == 0 && j0 + u * SC_WARPS < j_end) out[j0 + u * SC_WARPS] = sc[u];
    }
}

static cudaError_t launch_score(const sk_dsel_problem *p, const score_args *a, int pdl, cudaStream_t s) {
    launch_cfg l;
    const cudaLaunchConfig_t *c = launch_config(&l, (unsigned)score_ctas(p, a), SC_THREADS, 0, s, pdl);
    switch (p->head_dim / SK_DSEL_LANES) {
    case 1: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<1>, *p, *a);
    case 2: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<2>, *p, *a);
    case 3: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<3>, *p, *a);
    case 4: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<4>, *p, *a);
    case 5: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<5>, *p, *a);
    case 6: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<6>, *p, *a);
    case 7: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<7>, *p, *a);
    default: return cudaLaunchKernelEx(c, sk_dsel_score_kernel<8>, *p, *a);
    }
}

#endif /* SK_CUDA_DECODE_SELECT_SCORE_CUH */
