/*
 * fwd_sm90_fp8_transposer.cuh - the FP8 Hopper kernel's V transposer,
 * warps 2 and 3 of the producer warpgroup (part of fwd_sm90_fp8.cu,
 * included there only; warps 0 and 1 run the fp16/bf16 kernel's TMA and
 * scheduler warps, fwd_sm90_producer.cuh, on the FP8 layout).
 *
 * Transposer: FP8 wgmma reads B K-major only, so P V needs V^T (rows d,
 * 128 keys each) where TMA brings V (rows of keys). Per V stage, the 64
 * threads rebuild it into a Vt stage: each thread moves 4 x 4-byte blocks
 * (4 keys x 4 dims) with 4 shared loads, 8 byte permutes and 4 shared
 * stores, 16 blocks per stage (8 with blocks of 64 keys: Vt rows of 64
 * bytes, 64B swizzle). The keys are written in the order the
 * consumers' P registers hold them (sk98_key_of_pos, the permutation
 * documented in fwd_sm90_fp8.cu), so P needs no shuffles. Then a
 * proxy fence (generic writes, async-proxy wgmma reads), the Vt stage's
 * full barrier and the V stage's empty barrier, one arrival per warp.
 * Lanes are laid out so that the loads and the stores are two-way bank
 * conflicts at most: lane = t + 4 h + 8 bl (see sk98_transpose); with
 * blocks of 64 keys the stores are conflict-free (a per-lane dim order).
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_FP8_TRANSPOSER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_FP8_TRANSPOSER_CUH

/* Position `pos` (0..127) of a Vt row holds key sk98_key_of_pos(pos) of the
 * block: inside each 32-key chunk, positions 16 h + 4 t + i hold key
 * 16 h + 2 t + i (i < 2) or 16 h + 8 + 2 t + i - 2 (i >= 2). */
__device__ __forceinline__ int sk98_key_of_pos(int pos) {
    const int chunk = pos & ~31, h = (pos >> 4) & 1, t = (pos >> 2) & 3, i = pos & 3;
    return chunk + 16 * h + (i < 2 ? 2 * t + i : 8 + 2 * t + i - 2);
}

/* Byte offset of (row, byte col) in a tile of 128-byte rows, 128B-swizzled. */
__device__ __forceinline__ uint32_t sk98_sw_byte(int row, int col) {
    return sk_sw128_offset(row, col >> 4) + (col & 15);
}

/* Byte offset of (row, byte col) in a tile of ROW-byte rows as TMA writes
 * it: 128B swizzle for 128-byte rows; 64B swizzle for 64-byte rows (the
 * 16-byte chunk index XORed with address bits 7-8, (row / 2) % 4). */
template <int ROW>
__device__ __forceinline__ uint32_t sk98_row_byte(int row, int col) {
    if constexpr (ROW == 128)
        return sk98_sw_byte(row, col);
    else
        return (uint32_t)(row * 64 + ((((col >> 4) ^ ((row >> 1) & 3))) << 4) + (col & 15));
}

/* V (BN keys x HD dims) at v into Vt (HD dims x BN permuted keys) at vt,
 * by the 64 threads of warps 2-3 (w = 0, 1). With J = HD / 32, thread
 * (w, lane): t = lane & 3, h = (lane >> 2) & 1, bl = lane >> 3; blocks
 * (kk, bh) for kk < BN / 32, bh in J w .. J w + J - 1: keys 32 kk + 16 h + {2t,
 * 2t + 1, 8 + 2t, 9 + 2t} (in sk98_key_of_pos order: Vt positions 32 kk +
 * 16 h + 4t .. + 3) x dims 4 (4 bh + bl) .. + 3.
 *
 * Addresses (docs/perf/fp8.md, "Speed, round 2"): the swizzle terms do not
 * depend on kk (a V row's phase is key & 7 = 2t + (key & 1) at 128 B rows,
 * (key >> 1) & 3 = t at 64 B; a Vt row's chunk is (2 kk) ^ (h ^ ((d + e) &
 * 7))), so per j two load bases and per e one XOR term serve all four kk,
 * which are unrolled: 16 loads in flight instead of a dependent chain of 4,
 * and about 22 instructions per block instead of 55. j stays rolled (the
 * producer warpgroup runs on kF8ProducerRegs registers); with BN = 64
 * (two kk) it is unrolled by two, so 16 loads are in flight again.
 *
 * BN = 64: Vt rows of 64 bytes, 64B swizzle: row r's chunk is XORed with
 * (r >> 1) & 3. With the 128-key order (store e to row d + e) every
 * store's 32 lanes would sit in one 64-byte half of the banks (rows d + e
 * of all lanes have the parity of e: 2-way conflicts). So lanes with
 * bl >= 2 store row d + (e ^ 1) at step e (the other half), and the two
 * permutes of a pair swap selectors: conflict-free (bl & 1 flips the
 * chunk's bit 1 through the swizzle, h its bit 0, t the word). */
template <int HD, int BN = kF8Keys>
__device__ __forceinline__ void sk98_transpose(uint32_t v, uint32_t vt, int w, int lane) {
    constexpr int J = HD / 32, KK = BN / 32;
    /* V row bytes between kk steps and between keys k and k + 8. */
    constexpr uint32_t kStepKk = 32 * HD, kStep8 = 8 * HD;
    const int t = lane & 3, h = (lane >> 2) & 1, bl = lane >> 3;
    /* BN = 128, Vt: row d + e of the block (d & 7 = 4 (bl & 1)) holds chunk
     * (2 kk + h) ^ (4 (bl & 1) + e) = (2 kk) ^ xr[e] at byte 4t. BN = 64:
     * step e writes row d + (e ^ sw) (sw = bl >> 1), whose chunk is
     * (2 kk + h) ^ (2 (bl & 1) + (e >> 1)); xs[e] also holds the row's
     * offset (e ^ sw) 64, above the chunk bits that kx flips. */
    const int sw = bl >> 1;
    uint32_t xs[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
        xs[e] = BN == 64 ? (uint32_t)((e ^ sw) * 64 + ((h ^ (2 * (bl & 1) + (e >> 1))) << 4))
                         : (uint32_t)((h ^ (4 * (bl & 1) + e)) << 4);
    /* The selectors of a pair's two permutes (swapped for sw = 1 at BN = 64). */
    const uint32_t sel_a = BN == 64 && sw ? 0x7632u : 0x5410u;
    const uint32_t sel_b = BN == 64 && sw ? 0x5410u : 0x7632u;
#pragma unroll(BN == 64 ? 2 : 1)
    for (int j = 0; j < J; ++j) {
        const int c16 = J * w + j, d = 16 * c16 + 4 * bl; /* V byte column d: chunk c16 */
        const int key0 = 16 * h + 2 * t;                  /* at kk = 0 */
        uint32_t a0, a1;                                  /* keys key0, key0 + 1 */
        if constexpr (HD == 128) {
            a0 = v + key0 * 128 + ((c16 ^ (2 * t)) << 4) + 4 * bl;
            a1 = v + (key0 + 1) * 128 + ((c16 ^ (2 * t + 1)) << 4) + 4 * bl;
        } else {
            a0 = v + key0 * 64 + ((c16 ^ t) << 4) + 4 * bl;
            a1 = a0 + 64;
        }
        uint32_t x[KK][4];
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
            x[kk][0] = sk_ld_shared_u32(a0 + kk * kStepKk);
            x[kk][1] = sk_ld_shared_u32(a1 + kk * kStepKk);
            x[kk][2] = sk_ld_shared_u32(a0 + kk * kStepKk + kStep8);
            x[kk][3] = sk_ld_shared_u32(a1 + kk * kStepKk + kStep8);
        }
        const uint32_t row = vt + (uint32_t)d * BN + 4 * t; /* Vt row d, byte 4t */
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
            /* 4 x 4 byte transpose: out_e holds byte e of x0, x1, x2, x3. */
            const uint32_t lo01 = __byte_perm(x[kk][0], x[kk][1], 0x5140);
            const uint32_t hi01 = __byte_perm(x[kk][0], x[kk][1], 0x7362);
            const uint32_t lo23 = __byte_perm(x[kk][2], x[kk][3], 0x5140);
            const uint32_t hi23 = __byte_perm(x[kk][2], x[kk][3], 0x7362);
            const uint32_t kx = (uint32_t)(32 * kk);
            if constexpr (BN == 64) {
                /* Rows d + (e ^ sw): out_(e ^ sw), the pair's selectors swapped. */
                sk_st_shared_u32(row + (xs[0] ^ kx), __byte_perm(lo01, lo23, sel_a));
                sk_st_shared_u32(row + (xs[1] ^ kx), __byte_perm(lo01, lo23, sel_b));
                sk_st_shared_u32(row + (xs[2] ^ kx), __byte_perm(hi01, hi23, sel_a));
                sk_st_shared_u32(row + (xs[3] ^ kx), __byte_perm(hi01, hi23, sel_b));
            } else {
                sk_st_shared_u32(row + 0 * kF8Keys + (xs[0] ^ kx), __byte_perm(lo01, lo23, 0x5410));
                sk_st_shared_u32(row + 1 * kF8Keys + (xs[1] ^ kx), __byte_perm(lo01, lo23, 0x7632));
                sk_st_shared_u32(row + 2 * kF8Keys + (xs[2] ^ kx), __byte_perm(hi01, hi23, 0x5410));
                sk_st_shared_u32(row + 3 * kF8Keys + (xs[3] ^ kx), __byte_perm(hi01, hi23, 0x7632));
            }
        }
    }
}

/* Warps 2 and 3: every V stage into a Vt stage, until the end mark. */
template <int HD, int BN = kF8Keys>
__device__ void sk98_transposer(uint32_t base, const volatile int32_t *v_info, int w) {
    using L = sk98_smem<HD, false, BN>; /* rows V only */
    const int lane = threadIdx.x % 32;
    sk90_pipe<L::kVStages> vp = {0, 0};
    sk90_pipe<L::kVtStages> tp = {0, 0};
    for (;;) {
        sk_mbar_wait(base + L::kBarVFull + 8 * vp.stage, vp.phase, "V full (transposer)");
        /* Lane 0 reads the mark and is the lane that releases the stage. */
        int info = 0;
        if (lane == 0) info = v_info[vp.stage];
        info = __shfl_sync(0xffffffffu, info, 0);
        if (info == kVInfoEnd) break;
        sk_mbar_wait(base + L::kBarVtEmpty + 8 * tp.stage, tp.phase ^ 1, "Vt empty");
        sk98_transpose<HD, BN>(base + L::kV + vp.stage * L::kKVBytes,
                           base + L::kVt + tp.stage * L::kVtBytes, w, lane);
        sk_fence_proxy_async_smem(); /* Vt: generic writes, then wgmma reads */
        __syncwarp();
        if (lane == 0) {
            sk_mbar_arrive(base + L::kBarVtFull + 8 * tp.stage);
            sk_mbar_arrive(base + L::kBarVEmpty + 8 * vp.stage);
        }
        vp.advance();
        tp.advance();
    }
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_FP8_TRANSPOSER_CUH */
