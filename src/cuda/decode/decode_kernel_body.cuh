/*
 * decode_kernel_body.cuh - the split-KV decode kernel itself (part of
 * decode_kernel.cuh; see its header for the design): the per-warp
 * pipeline and MMA steps, then the CTA's combine and stores, and the
 * merge kernel.
 */
#ifndef SK_CUDA_DECODE_KERNEL_BODY_CUH
#define SK_CUDA_DECODE_KERNEL_BODY_CUH

/* Issue chunk c's K and V into a warp stage (zero rows past its keys) and
 * record its first key (-1: absent) and key count in meta (lane 0). */
template <int kD>
__device__ __forceinline__ void sk_decode_issue(const sk_decode_params &p, const sk_decode_row &r,
                                                int b, int hkv, int c, uint32_t stage,
                                                int2 *meta) {
    int rows = 0;
    const char *sk = nullptr, *sv = nullptr;
    const int key0 = sk_decode_chunk(p, r, b, hkv, c, &rows, &sk, &sv);
    if (key0 >= 0) {
        sk_sm80_load_rows_warp<kD, SK_DECODE_CHUNK>(stage, sk, (int32_t)p.k_stride[1], rows, p.k);
        sk_sm80_load_rows_warp<kD, SK_DECODE_CHUNK>(stage + SK_DECODE_CHUNK * kD * 2, sv,
                                                    (int32_t)p.v_stride[1], rows, p.v);
    }
    if ((threadIdx.x & 31) == 0) *meta = make_int2(key0, rows);
}

/* The merge of one (b, h, t) row r's splits by one warp, lane l owning
 * columns l x kD / 32 ..: the splits' LSEs are loaded across the lanes
 * (all of them in one round trip; their maximum by a butterfly, exact in
 * any order), lane s % 32 computes split s's weight exp(lse_s - max), and
 * the weighted sum runs in split order 0, 1, ... (the partial O of 8
 * splits loaded before they are added, so 8 loads are in flight): the
 * same bits on every run. A row whose splits are all empty gets O = 0,
 * LSE = -inf. Loads go through L2 (__ldcg): each partial is read once. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_decode_merge_row(const sk_decode_params &p, int64_t r, int b,
                                                    int h, int t, int lane) {
    constexpr int kCols = kD / 32, kGroups = SK_DECODE_MERGE_MAX_SPLITS / 32, kBatch = 8;
    const float *plse = p.part_lse + r * p.splits;
    float lse[kGroups], mall = -INFINITY;
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
        const int s = 32 * k + lane;
        lse[k] = s < p.splits ? __ldcg(plse + s) : -INFINITY;
        mall = fmaxf(mall, lse[k]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        mall = fmaxf(mall, __shfl_xor_sync(0xffffffffu, mall, off));
    float acc[kCols], wsum = 0.f;
#pragma unroll
    for (int j = 0; j < kCols; ++j) acc[j] = 0.f;
    if (mall != -INFINITY) {
#pragma unroll
        for (int k = 0; k < kGroups; ++k) {
            const int n = min(32, p.splits - 32 * k); /* warp-uniform */
            if (n <= 0) break;
            const float w_lane = expf(lse[k] - mall); /* an empty split: exp(-inf) = 0 */
            for (int j0 = 0; j0 < n; j0 += kBatch) {
                float v[kBatch][kCols];
#pragma unroll
                for (int u = 0; u < kBatch; ++u) {
                    const float *src =
                        p.part_o + (r * p.splits + 32 * k + j0 + u) * kD + lane * kCols;
                    if (j0 + u >= n) {
#pragma unroll
                        for (int j = 0; j < kCols; ++j) v[u][j] = 0.f;
                    } else if constexpr (kCols == 4) {
                        const float4 x = __ldcg((const float4 *)src);
                        v[u][0] = x.x, v[u][1] = x.y, v[u][2] = x.z, v[u][3] = x.w;
                    } else {
                        const float2 x = __ldcg((const float2 *)src);
                        v[u][0] = x.x, v[u][1] = x.y;
                    }
                }
#pragma unroll
                for (int u = 0; u < kBatch; ++u) {
                    const float w = __shfl_sync(0xffffffffu, w_lane, j0 + u);
                    if (j0 + u < n) {
                        wsum += w;
#pragma unroll
                        for (int j = 0; j < kCols; ++j) acc[j] += w * v[u][j];
                    }
                }
            }
        }
        const float inv = 1.f / wsum;
#pragma unroll
        for (int j = 0; j < kCols; ++j) acc[j] *= inv;
    }
    char *dst = p.o + b * p.o_stride[0] + t * p.o_stride[1] + h * p.o_stride[2] + lane * kCols * 2;
    uint32_t packed[kCols / 2];
#pragma unroll
    for (int j = 0; j < kCols / 2; ++j) packed[j] = sk_sm80_pack<kDtype>(acc[2 * j], acc[2 * j + 1]);
    if constexpr (kCols == 4)
        *(uint2 *)dst = make_uint2(packed[0], packed[1]);
    else
        *(uint32_t *)dst = packed[0];
    if (lane == 0 && p.lse != nullptr) p.lse[r] = mall == -INFINITY ? -INFINITY : mall + logf(wsum);
}

template <int kDtype, int kD, int kMT>
__global__ void __launch_bounds__(SK_DECODE_THREADS)
    sk_decode_kernel(const __grid_constant__ sk_decode_params p) {
    using S = sk_decode_smem<kD, kMT>;
    constexpr int kRowBytes = kD * 2, kKSteps = kD / 16, kDTiles = kD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;

    int64_t cta = blockIdx.x;
    const int rg = (int)(cta % p.row_groups);
    cta /= p.row_groups;
    const int split = (int)(cta % p.splits);
    cta /= p.splits;
    const int hkv = (int)(cta % p.heads_kv);
    const int b = (int)(cta / p.heads_kv);
    const int m0 = rg * S::kRows; /* first query row of this CTA */

    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t q_smem = smem0 + S::kStages;
    float *stats = (float *)(smem + S::kStages + S::kQ); /* [warp][row][max, sum] */
    int2 *meta = (int2 *)(smem + S::kStages + S::kQ + S::kStats);

    /* Q: row m = t x group + hh of this row group; rows past the query
     * rows are zero (warp w loads rows 8w .. 8w + 7 of each 32). */
    for (int r0 = 8 * warp; r0 < S::kRows; r0 += 8 * SK_DECODE_WARPS) {
        constexpr int kChunks = kD / 8;
        for (int i = lane; i < 8 * kChunks; i += 32) {
            const int rr = r0 + i / kChunks, c = i % kChunks, m = m0 + rr;
            const bool ok = m < p.rows;
            const int t = ok ? m / p.group : 0, h = hkv * p.group + (ok ? m % p.group : 0);
            const char *src = p.q + b * p.q_stride[0] + t * p.q_stride[1] + h * p.q_stride[2] + c * 16;
            sk_cp_async_16(q_smem + (uint32_t)(rr * kRowBytes) + (uint32_t)((c ^ (rr & 7)) << 4),
                           ok ? src : p.q, ok ? 16u : 0u);
        }
    }
    sk_cp_async_commit();

    /* This split's chunks, and this warp's: c_begin + warp, + 4, ... */
    const sk_decode_row row = sk_decode_row_of(p, b, hkv);
    const int chunks = row.entries * row.cpb;
    const int per = (chunks + p.splits - 1) / p.splits;
    const int c_begin = min(split * per, chunks), c_end = min(c_begin + per, chunks);
    const int mine = c_begin + warp < c_end ? (c_end - c_begin - warp + SK_DECODE_WARPS - 1) /
                                                  SK_DECODE_WARPS
                                            : 0;
    const uint32_t wstage0 = smem0 + (uint32_t)(warp * SK_DECODE_STAGES) * S::kStageBytes;
    int2 *wmeta = meta + warp * SK_DECODE_STAGES;
#pragma unroll
    for (int s = 0; s < SK_DECODE_STAGES - 1; ++s) {
        if (s < mine)
            sk_decode_issue<kD>(p, row, b, hkv, c_begin + warp + s * SK_DECODE_WARPS,
                                wstage0 + (uint32_t)s * S::kStageBytes, wmeta + s);
        sk_cp_async_commit();
    }
    sk_cp_async_wait<SK_DECODE_STAGES - 1>(); /* Q (the oldest group) has landed */
    __syncthreads();

    /* Per-lane ldmatrix rows and swizzle terms (as fwd_sm80). */
    const int lrow = lane & 7, lsel8 = (lane >> 3) & 1, lsel16 = lane >> 4;
    const uint32_t q_lane = q_smem + (uint32_t)((lrow + 8 * lsel8) * kRowBytes);
    const uint32_t q_y = (uint32_t)(lsel16 ^ lrow);
    const uint32_t k_row = (uint32_t)((lrow + 8 * lsel16) * kRowBytes), k_y = (uint32_t)(lsel8 ^ lrow);
    const uint32_t v_row = (uint32_t)((lrow + 8 * lsel8) * kRowBytes), v_y = (uint32_t)(lsel16 ^ lrow);

    /* The last key each of this thread's rows may see (causal: len_k -
     * q_len + t; else len_k - 1). */
    int lim[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int m = m0 + 16 * mt + g + 8 * i;
            const int t = min(m / p.group, p.q_len - 1);
            lim[mt][i] = p.causal ? row.len_k - p.q_len + t : row.len_k - 1;
        }

    float o[kMT][kDTiles][4], mx[kMT][2], l[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
            for (int r = 0; r < 4; ++r) o[mt][dt][r] = 0.f;
        mx[mt][0] = mx[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }

    for (int i = 0; i < mine; ++i) {
        const int s = i % SK_DECODE_STAGES;
        sk_cp_async_wait<SK_DECODE_STAGES - 2>();
        __syncwarp();
        const int2 info = wmeta[s];
        const uint32_t ks = wstage0 + (uint32_t)s * S::kStageBytes;
        if (info.x >= 0) { /* warp-uniform */
            const int key0 = info.x;
            float sc[kMT][2][4];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) sc[mt][nt][r] = 0.f;
#pragma unroll
            for (int kk = 0; kk < kKSteps; ++kk) {
                uint32_t kb[4];
                sk_ldmatrix_x4(kb, ks + k_row + (((uint32_t)(2 * kk) ^ k_y) << 4));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    uint32_t qa[4];
                    sk_ldmatrix_x4(qa, q_lane + (uint32_t)(16 * mt * kRowBytes) +
                                           (((uint32_t)(2 * kk) ^ q_y) << 4));
                    sk_sm80_mma<kDtype>(sc[mt][0], qa, kb[0], kb[1]);
                    sk_sm80_mma<kDtype>(sc[mt][1], qa, kb[2], kb[3]);
                }
            }
            uint32_t pa[kMT][4];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int ri = 0; ri < 2; ++ri) {
                    float x = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = key0 + nt * 8 + 2 * t4 + e;
                            float &v = sc[mt][nt][2 * ri + e];
                            v = key > lim[mt][ri] ? -INFINITY : v * p.scale_log2;
                            x = fmaxf(x, v);
                        }
                    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                    const float mnew = fmaxf(mx[mt][ri], x);
                    /* No visible key yet: keep alpha 1 and p = 2^(-inf) = 0. */
                    const float alpha = mnew == -INFINITY ? 1.f : sk_ex2(mx[mt][ri] - mnew);
                    const float off = mnew == -INFINITY ? 0.f : mnew;
                    mx[mt][ri] = mnew;
                    float sum = 0.f;
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float &v = sc[mt][nt][2 * ri + e];
                            v = sk_ex2(v - off);
                            sum += v;
                        }
                    l[mt][ri] = l[mt][ri] * alpha + sum;
#pragma unroll
                    for (int dt = 0; dt < kDTiles; ++dt) {
                        o[mt][dt][2 * ri] *= alpha;
                        o[mt][dt][2 * ri + 1] *= alpha;
                    }
                }
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                pa[mt][0] = sk_sm80_pack<kDtype>(sc[mt][0][0], sc[mt][0][1]);
                pa[mt][1] = sk_sm80_pack<kDtype>(sc[mt][0][2], sc[mt][0][3]);
                pa[mt][2] = sk_sm80_pack<kDtype>(sc[mt][1][0], sc[mt][1][1]);
                pa[mt][3] = sk_sm80_pack<kDtype>(sc[mt][1][2], sc[mt][1][3]);
            }
            const uint32_t vs = ks + SK_DECODE_CHUNK * kRowBytes + v_row;
#pragma unroll
            for (int dp = 0; dp < kDTiles / 2; ++dp) {
                uint32_t vb[4];
                sk_ldmatrix_x4_trans(vb, vs + (((uint32_t)(2 * dp) ^ v_y) << 4));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    sk_sm80_mma<kDtype>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
                    sk_sm80_mma<kDtype>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
        __syncwarp(); /* every lane is done with stage s before it is refilled */
        const int next = i + SK_DECODE_STAGES - 1;
        if (next < mine)
            sk_decode_issue<kD>(p, row, b, hkv, c_begin + warp + next * SK_DECODE_WARPS,
                                wstage0 + (uint32_t)(next % SK_DECODE_STAGES) * S::kStageBytes,
                                wmeta + next % SK_DECODE_STAGES);
        sk_cp_async_commit();
    }
    sk_cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the stages: they hold the combine now */

    /* Each warp's unnormalised O (relative to its row maxima), its row
     * maxima and sums. */
    float *cmb = (float *)smem; /* [warp][row][kD] */
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            float sum = l[mt][ri];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int rr = 16 * mt + g + 8 * ri;
            float *dst = cmb + (warp * S::kRows + rr) * kD;
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt)
                *(float2 *)(dst + dt * 8 + 2 * t4) = make_float2(o[mt][dt][2 * ri], o[mt][dt][2 * ri + 1]);
            if (t4 == 0) {
                stats[(warp * S::kRows + rr) * 2] = mx[mt][ri];
                stats[(warp * S::kRows + rr) * 2 + 1] = sum;
            }
        }
    __syncthreads();

    /* Combine in warp order; each item is 8 columns of one row. */
    constexpr int kGroups = kD / 8;
    constexpr float kLn2 = 0.69314718055994530942f;
    for (int it = tid; it < S::kRows * kGroups; it += SK_DECODE_THREADS) {
        const int rr = it / kGroups, cg = it % kGroups, m = m0 + rr;
        if (m >= p.rows) continue;
        float mall = -INFINITY;
#pragma unroll
        for (int w = 0; w < SK_DECODE_WARPS; ++w) mall = fmaxf(mall, stats[(w * S::kRows + rr) * 2]);
        float acc[8], lsum = 0.f, lse_nat = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = 0.f;
        if (mall != -INFINITY) {
#pragma unroll
            for (int w = 0; w < SK_DECODE_WARPS; ++w) {
                const float f = sk_ex2(stats[(w * S::kRows + rr) * 2] - mall); /* -inf: 0 */
                lsum += f * stats[(w * S::kRows + rr) * 2 + 1];
                const float *src = cmb + (w * S::kRows + rr) * kD + cg * 8;
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[j] += f * src[j];
            }
            const float inv = 1.f / lsum;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] *= inv;
            lse_nat = (mall + log2f(lsum)) * kLn2;
        }
        const int t = m / p.group, h = hkv * p.group + m % p.group;
        if (p.splits == 1) {
            uint4 pk;
            pk.x = sk_sm80_pack<kDtype>(acc[0], acc[1]);
            pk.y = sk_sm80_pack<kDtype>(acc[2], acc[3]);
            pk.z = sk_sm80_pack<kDtype>(acc[4], acc[5]);
            pk.w = sk_sm80_pack<kDtype>(acc[6], acc[7]);
            *(uint4 *)(p.o + b * p.o_stride[0] + t * p.o_stride[1] + h * p.o_stride[2] + cg * 16) = pk;
            if (cg == 0 && p.lse != nullptr)
                p.lse[((int64_t)b * p.heads_q + h) * p.q_len + t] = lse_nat;
        } else {
            const int64_t prow = (((int64_t)b * p.heads_q + h) * p.q_len + t) * p.splits + split;
            float4 *dst = (float4 *)(p.part_o + prow * kD + cg * 8);
            dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            if (cg == 0) p.part_lse[prow] = lse_nat;
        }
    }
}

/* The merge of the splits: one warp per (b, h, t) row. */
template <int kDtype, int kD>
__global__ void __launch_bounds__(SK_DECODE_THREADS)
    sk_decode_merge_kernel(const __grid_constant__ sk_decode_params p) {
    const int64_t r = (int64_t)blockIdx.x * SK_DECODE_WARPS + (threadIdx.x >> 5);
    const int64_t total = (int64_t)p.batch * p.heads_q * p.q_len;
    if (r >= total) return; /* warp-uniform */
    const int t = (int)(r % p.q_len);
    const int h = (int)((r / p.q_len) % p.heads_q);
    const int b = (int)(r / ((int64_t)p.q_len * p.heads_q));
    sk_decode_merge_row<kDtype, kD>(p, r, b, h, t, threadIdx.x & 31);
}

#endif /* SK_CUDA_DECODE_KERNEL_BODY_CUH */
