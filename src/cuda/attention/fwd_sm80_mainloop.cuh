/*
 * fwd_sm80_mainloop.cuh - the portable attention kernel's body (part of
 * fwd_sm80.cu, included there only): the tile loop over the plan's tiles,
 * and per 64-key chunk S = Q K^T, the masked online softmax and O += P V,
 * with the two-stage cp.async pipeline (see fwd_sm80.cu's header).
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM80_MAINLOOP_CUH
#define SK_CUDA_ATTENTION_FWD_SM80_MAINLOOP_CUH

/* The kernel body for kMT m-tiles (16 query rows each) per warp:
 * block_q = 64 * kMT. kMode: the fixed batch (vsh NULL), or varlen / paged,
 * whose tiles take their lengths from the plan (sk_sm80_tile_of) and keep
 * them, by stage, in vsh beside the cursors. */
template <int kDtype, int kD, int kMT, int kMode>
__device__ __forceinline__ void sk_sm80_body(const sk_sm80_params &p, unsigned char *smem,
                                             sk_sm80_shared *sh, sk_sm80_vshared *vsh) {
    constexpr int kRowBytes = kD * 2;
    constexpr int kKSteps = kD / 16;             /* k16 steps of Q K^T */
    constexpr int kDTiles = kD / 8;              /* n8 tiles of O */
    constexpr int kNT = SK_SM80_CHUNK_KEYS / 8;  /* n8 tiles of S per chunk */
    constexpr int kPK = SK_SM80_CHUNK_KEYS / 16; /* k16 steps of P V per chunk */
    constexpr int kWarpRows = SK_SM80_MTILE * kMT;
    constexpr int kBq = kWarpRows * SK_SM80_WARPS;                        /* block_q */
    constexpr uint32_t kStageBytes = 2u * SK_SM80_CHUNK_KEYS * kRowBytes; /* K then V */
    const int bk = p.block_k, subs = bk / SK_SM80_CHUNK_KEYS;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t q_smem = smem0 + 2u * kStageBytes;

    /* Per-lane ldmatrix rows and swizzle terms (fragment rows are multiples
     * of 8 plus lane & 7, so the swizzle is chunk ^ (lane & 7)). */
    const int lrow = lane & 7, lsel8 = (lane >> 3) & 1, lsel16 = lane >> 4;
    const uint32_t q_lane = q_smem + (uint32_t)((kWarpRows * warp + lrow + 8 * lsel8) * kRowBytes);
    const uint32_t q_y = (uint32_t)(lsel16 ^ lrow);
    const uint32_t k_row = (uint32_t)((lrow + 8 * lsel16) * kRowBytes),
                   k_y = (uint32_t)(lsel8 ^ lrow);
    const uint32_t v_row = (uint32_t)((lrow + 8 * lsel8) * kRowBytes),
                   v_y = (uint32_t)(lsel16 ^ lrow);

    int parity = 0, slot_reg = 0;
    if (tid == 0) { /* the first slot's tile_info, then one slot ahead */
        slot_reg = atomicAdd(p.tile_counter, 1);
        if (slot_reg < p.num_tiles) {
            sh->pending[0] = p.tile_info[slot_reg];
            slot_reg = atomicAdd(p.tile_counter, 1);
        } else {
            sh->pending[0] = make_int4(-1, 0, 0, -1);
        }
    }
    /* The raw column of the row entry after the block being loaded, read one
     * chunk ahead so that finding the next visited block never waits. */
    int cand;
    {
        int4 info;
        if (!sk_sm80_acquire<kD, kMode>(p, sh, parity, slot_reg, false, &info)) {
            /* no work: drain thread 0's look-ahead copy first */
            sk_cp_async_commit();
            sk_cp_async_wait<0>();
            return;
        }
        sk_sm80_cursor c;
        int4 sq;
        sk_sm80_tile_of<kMode>(p, info, &c, &sq);
        /* Prologue: Q and the first chunk of the first tile (each warp its rows). */
        sk_sm80_load_q_warp<kD, kBq, kMode>(p, c.b, c.h, c.i, q_smem, sq.x);
        sk_cp_async_commit();
        sk_sm80_load_chunk_warp<kD, kMode>(p, c, sk_sm80_key0(p, c), smem0, sq,
                                           kMode == SK_SM80_PAGED ? vsh->absent[0] : NULL);
        sk_cp_async_commit();
        cand = c.pos + 1 < c.end ? __ldg(p.col_indices + c.pos + 1) : -1;
        if (tid == 0) {
            sh->cur[0] = c;
            if constexpr (kMode != SK_SM80_FIXED) vsh->seq[0] = sq;
        }
    }
    uint32_t stage = 0;

    for (;;) { /* tiles */
        /* The tile's Q and first chunk have landed (all groups), and the
         * cursor written by thread 0 is visible. */
        sk_cp_async_wait<0>();
        if (p.q_sign != 0u)
            sk_sm80_negate_rows_warp<kD, kWarpRows>(smem + 2u * kStageBytes +
                                                    kWarpRows * warp * kRowBytes);
        __syncthreads();
        /* A tile of one visited block: warm L2 with the next Q right away
         * (longer rows do it when they enter their last block). */
        if (sh->cur[stage].pos + 1 >= sh->cur[stage].end)
            sk_sm80_prefetch_q<kD, kBq, kMode>(p, sh->pending[parity]);
        /* The tile's lengths: the problem's, or its sequence's (then its
         * columns stop at the sequence's nb_k). */
        int v_seq_q = 0, v_seq_k = 0, v_cols = 0;
        if constexpr (kMode != SK_SM80_FIXED) {
            const int4 sq = vsh->seq[stage];
            v_seq_q = sq.x;
            v_seq_k = sq.y;
            v_cols = min(p.col_blocks, (int)(((int64_t)v_seq_k + bk - 1) / bk));
        }
        /* The fixed kernels read the parameters where they are used. */
#define SK_T_SEQ_Q (kMode == SK_SM80_FIXED ? p.seq_q : v_seq_q)
#define SK_T_SEQ_K (kMode == SK_SM80_FIXED ? p.seq_k : v_seq_k)
#define SK_T_DIAG  (kMode == SK_SM80_FIXED ? p.diag : v_seq_k - v_seq_q)
#define SK_T_COLS  (kMode == SK_SM80_FIXED ? p.col_blocks : v_cols)
        const int ti = sh->cur[stage].i;
        const int q0 = ti * kBq;
        const int kmax = sk_sched_kmax(ti, kBq, SK_T_SEQ_Q, SK_T_SEQ_K);
        const int qw = q0 + kWarpRows * warp;   /* first query row of this warp */
        const bool warp_rows = qw < SK_T_SEQ_Q; /* this warp has a real query row */
        float o[kMT][kDTiles][4];
        float ms[kMT][2], l[kMT][2]; /* reference max (scaled by c), sum of p */
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
                for (int r = 0; r < 4; ++r) o[mt][dt][r] = 0.f;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                ms[mt][i] = -INFINITY;
                l[mt][i] = 0.f;
            }
        }

        for (bool first = true;; first = false) { /* chunks of the tile */
            /* This chunk's K and V have landed, and every warp is done with
             * the other stage (at the tile's first chunk: done above). */
            if (!first) {
                sk_cp_async_wait<1>();
                __syncthreads();
            }
            /* The next chunk: the next one of this block, else the first of
             * the next visited block, else the first of the next tile. */
            int kb; /* first key of this chunk */
            bool same_tile = true;
            {
                const sk_sm80_cursor c = sh->cur[stage];
                kb = sk_sm80_key0(p, c);
                sk_sm80_cursor n = c;
                int4 nsq = make_int4(SK_T_SEQ_Q, SK_T_SEQ_K, 0, 0); /* n's sequence */
                if constexpr (kMode != SK_SM80_FIXED) nsq = vsh->seq[stage];
                if (c.sub + 1 < subs && sk_sm80_chunk_ok(p, c.col, c.sub + 1, kmax, SK_T_SEQ_K)) {
                    n.sub = c.sub + 1;
                } else {
                    int np = c.pos + 1, nc = cand;
                    while (np < c.end && !sk_sched_visit(nc, SK_T_COLS, p.causal, bk, kmax)) {
                        ++np;
                        nc = np < c.end ? __ldg(p.col_indices + np) : -1;
                    }
                    if (np < c.end) {
                        n.pos = np;
                        n.col = nc;
                        n.sub = 0;
                        cand = np + 1 < c.end ? __ldg(p.col_indices + np + 1) : -1;
                        /* The row's last entry: warm L2 with the next Q. */
                        if (np + 1 >= c.end)
                            sk_sm80_prefetch_q<kD, kBq, kMode>(p, sh->pending[parity]);
                    } else {
                        same_tile = false;
                        int4 info;
                        if (sk_sm80_acquire<kD, kMode>(p, sh, parity, slot_reg, true, &info)) {
                            sk_sm80_tile_of<kMode>(p, info, &n, &nsq);
                            cand = n.pos + 1 < n.end ? __ldg(p.col_indices + n.pos + 1) : -1;
                        } else {
                            n.b = -1; /* no chunk left */
                        }
                    }
                }
                const int nkey0 = sk_sm80_key0(p, n);
                if (n.b >= 0)
                    sk_sm80_load_chunk_warp<kD, kMode>(
                        p, n, nkey0, smem0 + (stage ^ 1u) * kStageBytes, nsq,
                        kMode == SK_SM80_PAGED ? vsh->absent[stage ^ 1u] : NULL);
                sk_cp_async_commit(); /* [K, V of the next chunk], possibly empty */
                if (tid == 0) {
                    sh->cur[stage ^ 1u] = n;
                    if constexpr (kMode != SK_SM80_FIXED) vsh->seq[stage ^ 1u] = nsq;
                }
                /* wnext.w: the next tile's len_q (varlen; unused when fixed) */
                if (!same_tile && lane == 0)
                    sh->wnext[warp] =
                        make_int4(n.b, n.h, n.i, kMode == SK_SM80_FIXED ? nkey0 : nsq.x);
            }

            const uint32_t ks = smem0 + stage * kStageBytes,
                           vs = ks + SK_SM80_CHUNK_KEYS * kRowBytes;
            const bool active = warp_rows && !(p.causal && kb > qw + kWarpRows - 1 + SK_T_DIAG);
            uint32_t pa[kMT][kPK][4];
            if (active) {
                /* S = Q K^T */
                float s[kMT][kNT][4];
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int r = 0; r < 4; ++r) s[mt][nt][r] = 0.f;
                const uint32_t k_lane = ks + k_row;
#pragma unroll
                for (int kk = 0; kk < kKSteps; ++kk) {
                    uint32_t qa[kMT][4];
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt)
                        sk_ldmatrix_x4(qa[mt], q_lane + (uint32_t)(SK_SM80_MTILE * mt * kRowBytes) +
                                                   (((uint32_t)(2 * kk) ^ q_y) << 4));
#pragma unroll
                    for (int np2 = 0; np2 < kNT / 2; ++np2) {
                        uint32_t b[4];
                        sk_ldmatrix_x4(b, k_lane + (uint32_t)(np2 * 16 * kRowBytes) +
                                              (((uint32_t)(2 * kk) ^ k_y) << 4));
#pragma unroll
                        for (int mt = 0; mt < kMT; ++mt) {
                            sk_sm80_mma<kDtype>(s[mt][2 * np2], qa[mt], b[0], b[1]);
                            sk_sm80_mma<kDtype>(s[mt][2 * np2 + 1], qa[mt], b[2], b[3]);
                        }
                    }
                }
                /* Tails, the causal diagonal and (paged) keys of absent
                 * pages only: byte w of `gone` covers keys 16 w .. 16 w + 15. */
                uint32_t gone = 0u;
                if constexpr (kMode == SK_SM80_PAGED) gone = *(const uint32_t *)vsh->absent[stage];
                if (kb + SK_SM80_CHUNK_KEYS > SK_T_SEQ_K ||
                    (p.causal && kb + SK_SM80_CHUNK_KEYS - 1 > qw + SK_T_DIAG) || gone != 0u) {
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            /* the last key row qw + 16 mt + g + 8 i may see */
                            const int q = qw + SK_SM80_MTILE * mt + g + 8 * i;
                            const int lim =
                                p.causal ? min(SK_T_SEQ_K - 1, q + SK_T_DIAG) : SK_T_SEQ_K - 1;
#pragma unroll
                            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                                for (int e = 0; e < 2; ++e)
                                    if (kb + nt * 8 + 2 * t4 + e > lim ||
                                        ((gone >> (8 * (nt >> 1))) & 1u) != 0u)
                                        s[mt][nt][2 * i + e] = -INFINITY;
                        }
                }
                /* Online softmax in base 2, two rows per m-tile and thread.
                 * ms is the row's reference maximum, scaled by c: it moves
                 * (and O and l are rescaled) only when a score exceeds it by
                 * more than SK_SM80_RESCALE_LOG2. Otherwise p = 2^(s c - ms)
                 * <= 2^8: fine in fp32, and P rounds to f16/bf16 with the same
                 * relative error. The common case costs one max per thread
                 * and a warp vote; the rare update redoes the row maxima over
                 * the quad, one row at a time (few live registers). In the
                 * tile's first chunk O and l are still zero: no rescale. */
                bool need = false;
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        float x = fmaxf(s[mt][0][2 * i], s[mt][0][2 * i + 1]);
#pragma unroll
                        for (int nt = 1; nt < kNT; ++nt)
                            x = fmaxf(x, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                        need |= x * p.scale_log2 > ms[mt][i] + SK_SM80_RESCALE_LOG2;
                    }
                if (__any_sync(0xffffffffu, need)) {
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            float x = fmaxf(s[mt][0][2 * i], s[mt][0][2 * i + 1]);
#pragma unroll
                            for (int nt = 1; nt < kNT; ++nt)
                                x = fmaxf(x, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                            const float xs = x * p.scale_log2;           /* -inf: nothing visible */
                            if (xs > ms[mt][i] + SK_SM80_RESCALE_LOG2) { /* same in the quad */
                                if (!first) {
                                    const float alpha = sk_ex2(ms[mt][i] - xs); /* 0 if ms = -inf */
                                    l[mt][i] *= alpha;
#pragma unroll
                                    for (int dt = 0; dt < kDTiles; ++dt) {
                                        o[mt][dt][2 * i] *= alpha;
                                        o[mt][dt][2 * i + 1] *= alpha;
                                    }
                                }
                                ms[mt][i] = xs;
                            }
                        }
                }
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        /* A row with no visible key yet keeps ms = -inf: use 0,
                         * so that 2^(-inf - 0) = 0 rather than NaN. */
                        const float off = ms[mt][i] == -INFINITY ? 0.f : ms[mt][i];
                        float sum = 0.f;
#pragma unroll
                        for (int nt = 0; nt < kNT; ++nt) {
                            s[mt][nt][2 * i] = sk_ex2(fmaf(s[mt][nt][2 * i], p.scale_log2, -off));
                            s[mt][nt][2 * i + 1] =
                                sk_ex2(fmaf(s[mt][nt][2 * i + 1], p.scale_log2, -off));
                            sum += s[mt][nt][2 * i] + s[mt][nt][2 * i + 1];
                        }
                        l[mt][i] += sum;
                    }
                    /* P as the A operand of P V: the accumulators of two n8 tiles
                     * are the A fragment of one k16 step. */
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int kk = 0; kk < kPK; ++kk) {
                        pa[mt][kk][0] = sk_sm80_pack<kDtype>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                        pa[mt][kk][1] = sk_sm80_pack<kDtype>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                        pa[mt][kk][2] =
                            sk_sm80_pack<kDtype>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                        pa[mt][kk][3] =
                            sk_sm80_pack<kDtype>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                    }
            }

            /* The tile's last chunk: this warp is done reading its Q rows,
             * which no other warp reads; it loads the next tile's. */
            if (!same_tile) {
                __syncwarp();
                const int4 w = sh->wnext[warp];
                if (w.x >= 0)
                    sk_sm80_load_q_warp<kD, kBq, kMode>(p, w.x, w.y, w.z, q_smem,
                                                        kMode == SK_SM80_FIXED ? p.seq_q : w.w);
            }
            sk_cp_async_commit(); /* [Q of the next tile], usually empty */

            if (active) { /* O += P V */
                const uint32_t v_lane = vs + v_row;
#pragma unroll
                for (int kk = 0; kk < kPK; ++kk)
#pragma unroll
                    for (int dp = 0; dp < kDTiles / 2; ++dp) {
                        uint32_t b[4];
                        sk_ldmatrix_x4_trans(b, v_lane + (uint32_t)(kk * 16 * kRowBytes) +
                                                    (((uint32_t)(2 * dp) ^ v_y) << 4));
#pragma unroll
                        for (int mt = 0; mt < kMT; ++mt) {
                            sk_sm80_mma<kDtype>(o[mt][2 * dp], pa[mt][kk], b[0], b[1]);
                            sk_sm80_mma<kDtype>(o[mt][2 * dp + 1], pa[mt][kk], b[2], b[3]);
                        }
                    }
            }
            if (!same_tile) break;
            stage ^= 1u;
        }

        /* The tile is done: its last chunk used `stage`; whether a next tile
         * follows is in wnext (written at that chunk's top, read after the
         * __syncwarp before the Q load). The epilogue's arithmetic (and
         * LSE) needs no barrier; its stores go through this stage once every
         * warp is done with its V. */
        {
            const int32_t tile = sh->cur[stage].tile;
            const bool more = sh->wnext[warp].x >= 0;
            /* varlen: {first query token, head, block, len_q} of the tile */
            int4 at = make_int4(0, 0, 0, 0);
            if constexpr (kMode != SK_SM80_FIXED)
                at = make_int4(sh->cur[stage].b, sh->cur[stage].h, ti, SK_T_SEQ_Q);
            uint32_t op[kMT][2][kDTiles];
            sk_sm80_epilogue_pack<kDtype, kD, kMT, kMode>(p, tile, at, o, ms, l, op);
            __syncthreads();
            sk_sm80_epilogue_store<kD, kMT, kMode>(p, tile, at, op, smem + stage * kStageBytes);
            if (!more) break;
        }
        stage ^= 1u;
#undef SK_T_SEQ_Q
#undef SK_T_SEQ_K
#undef SK_T_DIAG
#undef SK_T_COLS
    }
    sk_cp_async_wait<0>(); /* nothing is left in flight (only empty groups) */
}

#endif /* SK_CUDA_ATTENTION_FWD_SM80_MAINLOOP_CUH */
