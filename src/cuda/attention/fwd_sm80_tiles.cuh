/*
 * fwd_sm80_tiles.cuh - the portable attention kernel's work intake (part of
 * fwd_sm80.cu, included there only, after its parameter and state types):
 * decoding a plan slot into a cursor, writing the outputs of empty tiles,
 * the look-ahead acquisition of the next tile (thread 0 two steps ahead,
 * cp.async of its tile_info), and the cp.async loads of a tile's Q and of
 * its K/V chunks, with the L2 prefetch of the next Q.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM80_TILES_CUH
#define SK_CUDA_ATTENTION_FWD_SM80_TILES_CUH

/* Decode and sanitise one tile_info entry into a cursor at the tile's first
 * visited entry; false when it names no tile. A tile with nothing to visit
 * gets pos = end. */
__device__ __forceinline__ bool sk_sm80_cursor_of(const sk_sm80_params &p, int4 info,
                                                  sk_sm80_cursor *c) {
    if (info.x < 0 || info.x >= p.num_tiles) return false;
    const int32_t bh = sk_sm80_div(info.x, p.rb_mul, p.rb_shift);
    c->i = info.x - bh * p.row_blocks;
    c->b = sk_sm80_div(bh, p.hq_mul, p.hq_shift);
    c->h = bh - c->b * p.heads_q;
    /* A stale plan must still stay in bounds: clamp to this layout. */
    c->end = min(max(info.z, 0), p.nnz);
    c->pos = info.y;
    c->col = info.w;
    c->sub = 0;
    c->tile = info.x;
    const int32_t hk = sk_sm80_div(c->h, p.gq_mul, p.gq_shift);
    c->koff = c->b * p.k_sb + hk * p.k_sh;
    c->voff = c->b * p.v_sb + hk * p.v_sh;
    if (c->pos < 0 || c->pos >= c->end || (uint32_t)c->col >= (uint32_t)p.col_blocks)
        c->pos = c->end; /* nothing to visit */
    return true;
}

/* sk_sm80_cursor_of for a kernel of mode kMode, with the tile's sequence
 * in *sq = {len_q, len_k, sequence, 0} ({Sq, Sk, 0, 0} for the fixed
 * batch). Varlen / paged (varlen_plan.h): the row table gives the
 * sequence b and its block i, the plan's clamped seqs its lengths; the
 * cursor's b becomes the sequence's first query token (the kernel's q_sb
 * and o_sb are then the token strides), K/V offsets start at its first key
 * (varlen; paged keys go through the page table), and the first column
 * must lie below nb_k(b). A row the plan did not map (a stale plan) gets no
 * query row, so nothing is written for it. */
template <int kMode>
__device__ __forceinline__ bool sk_sm80_tile_of(const sk_sm80_params &p, int4 info,
                                                sk_sm80_cursor *c, int4 *sq) {
    if (!sk_sm80_cursor_of(p, info, c)) return false;
    if constexpr (kMode == SK_SM80_FIXED) {
        *sq = make_int4(p.seq_q, p.seq_k, 0, 0);
    } else {
        const int2 row = __ldg(p.rows + c->i); /* c->i < row_blocks: t < num_tiles */
        int4 s = make_int4(0, 0, 0, 0);        /* {q0, len_q, k0, len_k} */
        if ((uint32_t)row.x < (uint32_t)p.vbatch) s = __ldg(p.seqs + row.x);
        const bool ok = row.y >= 0 && (int64_t)row.y * p.block_q < s.y;
        c->i = ok ? row.y : 0;
        c->b = s.x;
        if constexpr (kMode == SK_SM80_VARLEN) {
            c->koff += (int64_t)s.z * p.k_ss;
            c->voff += (int64_t)s.z * p.v_ss;
        }
        const int32_t nbk = (int32_t)(((int64_t)s.w + p.block_k - 1) / p.block_k);
        if ((uint32_t)c->col >= (uint32_t)min(nbk, p.col_blocks)) c->pos = c->end;
        *sq = make_int4(ok ? s.y : 0, s.w, row.x, 0);
    }
    return true;
}

/* O = 0 and LSE = -inf for the rows of an empty tile (all threads); sq as
 * sk_sm80_tile_of gives it. */
template <int kD, int kMode>
__device__ void sk_sm80_write_empty(const sk_sm80_params &p, const sk_sm80_cursor &t, int4 sq) {
    constexpr int kChunks = kD / 8;
    const int q0 = t.i * p.block_q;
    const int rows = min(p.block_q, (kMode == SK_SM80_FIXED ? p.seq_q : sq.x) - q0);
    char *o = p.o + t.b * p.o_sb + t.h * p.o_sh + (int64_t)q0 * p.o_ss;
    for (int idx = threadIdx.x; idx < rows * kChunks; idx += blockDim.x) {
        const int r = idx / kChunks, c = idx % kChunks;
        *(uint4 *)(o + (uint32_t)r * (uint32_t)p.o_ss + c * 16) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != NULL) {
        float *lse = kMode == SK_SM80_FIXED
                         ? p.lse + ((int64_t)t.b * p.heads_q + t.h) * p.seq_q + q0
                         : p.lse + (int64_t)t.h * p.lse_hs + t.b + q0;
        for (int r = threadIdx.x; r < rows; r += blockDim.x) lse[r] = -INFINITY;
    }
}

/* Thread 0: start copying the tile_info entry of the slot grabbed last
 * time (slot_reg) into pending[next] and grab a new slot; past the last
 * tile, write the end marker there instead. */
static __device__ __forceinline__ void
sk_sm80_prefetch_info(const sk_sm80_params &p, sk_sm80_shared *sh, int next, int &slot_reg) {
    if (slot_reg < p.num_tiles) {
        sk_cp_async_16((uint32_t)__cvta_generic_to_shared(&sh->pending[next]),
                       p.tile_info + slot_reg, 16u);
        slot_reg = atomicAdd(p.tile_counter, 1);
    } else {
        sh->pending[next] = make_int4(-1, 0, 0, -1);
    }
}

/* The CTA's next non-empty tile: true with its tile_info entry in *info
 * (decode it with sk_sm80_cursor_of), false when no tile is left. Writes
 * the outputs of the empty tiles it passes. Called by all threads alike.
 *
 * Thread 0 runs two steps ahead, so that nothing here waits on memory: the
 * tile_info that it copied into pending[parity] on the previous call
 * (cp.async) is complete and visible to every thread since the current tile
 * started (wait_group 0, then a barrier); it starts the copy for the slot
 * it grabbed on the previous call into pending[parity ^ 1] (read by the
 * others on the previous call, before that barrier) and grabs a new slot.
 * `fast`: pending[parity] is known to be visible. Then a non-empty tile or
 * the end costs no barrier. Otherwise (the first call, empty tiles, entries
 * that name no tile) thread 0 publishes the entry in info[parity] for a
 * barrier each; only when it skips empty tiles within one call does it wait
 * for its copy (an extra group of thread 0 alone only makes its later waits
 * stricter). */
template <int kD, int kMode>
__device__ bool sk_sm80_acquire(const sk_sm80_params &p, sk_sm80_shared *sh, int &parity,
                                int &slot_reg, bool fast, int4 *info_out) {
    if (fast) {
        const int4 info = sh->pending[parity];
        if (info.x == -1) return false; /* the counter ran past the last tile */
        const int32_t end = min(max(info.z, 0), p.nnz);
        if (info.x >= 0 && info.x < p.num_tiles && info.y >= 0 && info.y < end &&
            (uint32_t)info.w < (uint32_t)p.col_blocks) {
            if (threadIdx.x == 0) sk_sm80_prefetch_info(p, sh, parity ^ 1, slot_reg);
            parity ^= 1;
            *info_out = info;
            return true;
        }
    }
    for (int pass = 0;; ++pass) {
        if (threadIdx.x == 0) {
            if (pass > 0) {
                sk_cp_async_commit();
                sk_cp_async_wait<0>();
            }
            sh->info[parity] = sh->pending[parity];
            sk_sm80_prefetch_info(p, sh, parity ^ 1, slot_reg);
        }
        __syncthreads();
        const int at = parity;
        parity ^= 1;
        const int4 info = sh->info[at];
        if (info.x == -1) return false;                    /* the counter ran past the last tile */
        if (info.x < 0 || info.x >= p.num_tiles) continue; /* not a tile */
        /* Non-empty exactly when sk_sm80_cursor_of finds an entry to visit. */
        const int32_t end = min(max(info.z, 0), p.nnz);
        if (info.y >= 0 && info.y < end && (uint32_t)info.w < (uint32_t)p.col_blocks) {
            *info_out = info;
            return true;
        }
        sk_sm80_cursor t;
        int4 sq;
        sk_sm80_tile_of<kMode>(p, info, &t, &sq);
        sk_sm80_write_empty<kD, kMode>(p, t, sq);
    }
}

/* cp.async this warp's rows of the Q tile of tile (b, h, row block i)
 * (rows past seq_q zero-filled: past a varlen sequence they are the next
 * sequence's tokens, read from nowhere; the zero source is the tensor's
 * base, in bounds whatever the plan holds). */
template <int kD, int kBq, int kMode>
__device__ __forceinline__ void sk_sm80_load_q_warp(const sk_sm80_params &p, int b, int h, int i,
                                                    uint32_t q_smem, int seq_q) {
    constexpr int kWarpRows = kBq / SK_SM80_WARPS;
    const int warp = threadIdx.x >> 5;
    const int q0 = i * kBq, r0 = kWarpRows * warp;
    const char *tile = p.q + b * p.q_sb + h * p.q_sh + (int64_t)q0 * p.q_ss;
    sk_sm80_load_rows_warp<kD, kWarpRows>(
        q_smem + (uint32_t)(r0 * kD * 2), tile + (uint32_t)r0 * (uint32_t)p.q_ss, p.q_ss,
        (kMode == SK_SM80_FIXED ? p.seq_q : seq_q) - q0 - r0, kMode == SK_SM80_FIXED ? tile : p.q);
}

/* cp.async this warp's 16 rows of the cursor's 64-key chunk of K and V
 * (first key key0) into one stage (keys past the tile's len_k = sq.y
 * zero-filled). Paged: the warp's 16 keys lie in one page (page_size >= 16
 * and the rows start at a multiple of 16), looked up in the sequence's
 * table row (sq.z) only when a key of them exists; a page index outside
 * [0, num_pages) is read from nowhere (zero-filled) and marked in
 * absent[warp] for the mask, so a garbage table never leaves the cache. */
template <int kD, int kMode>
__device__ __forceinline__ void
sk_sm80_load_chunk_warp(const sk_sm80_params &p, const sk_sm80_cursor &c, int key0, uint32_t dst,
                        int4 sq, unsigned char *absent) {
    constexpr int kRows = SK_SM80_CHUNK_KEYS / SK_SM80_WARPS;
    const int warp = threadIdx.x >> 5;
    const int r0 = kRows * warp;
    dst += (uint32_t)(r0 * kD * 2);
    if constexpr (kMode == SK_SM80_PAGED) {
        const int kr = key0 + r0; /* the warp's first key */
        int valid = min(kRows, sq.y - kr);
        const char *k = p.k, *v = p.v;
        bool gone = false;
        if (valid > 0) {
            const int32_t page = __ldg(p.page_table + sq.z * p.pt_stride + (kr >> p.page_shift));
            if ((uint32_t)page < (uint32_t)p.num_pages) {
                const uint32_t slot = (uint32_t)kr & ((1u << p.page_shift) - 1u);
                k = p.k + page * p.k_pg + c.koff + slot * (uint32_t)p.k_ss;
                v = p.v + page * p.v_pg + c.voff + slot * (uint32_t)p.v_ss;
            } else {
                valid = 0;
                gone = true;
            }
        }
        if ((threadIdx.x & 31) == 0) absent[warp] = gone;
        sk_sm80_load_rows_warp<kD, kRows>(dst, k, p.k_ss, valid, p.k);
        sk_sm80_load_rows_warp<kD, kRows>(dst + SK_SM80_CHUNK_KEYS * kD * 2, v, p.v_ss, valid, p.v);
    } else {
        const int len_k = kMode == SK_SM80_FIXED ? p.seq_k : sq.y;
        const int valid = min(SK_SM80_CHUNK_KEYS, len_k - key0) - r0;
        const char *k = p.k + c.koff + (int64_t)key0 * p.k_ss;
        const char *v = p.v + c.voff + (int64_t)key0 * p.v_ss;
        const char *ks = kMode == SK_SM80_FIXED ? k : p.k, *vs = kMode == SK_SM80_FIXED ? v : p.v;
        sk_sm80_load_rows_warp<kD, kRows>(dst, k + (uint32_t)r0 * (uint32_t)p.k_ss, p.k_ss, valid,
                                          ks);
        sk_sm80_load_rows_warp<kD, kRows>(dst + SK_SM80_CHUNK_KEYS * kD * 2,
                                          v + (uint32_t)r0 * (uint32_t)p.v_ss, p.v_ss, valid, vs);
    }
}

/* The first key of the cursor's chunk. */
__device__ __forceinline__ int sk_sm80_key0(const sk_sm80_params &p, const sk_sm80_cursor &c) {
    return c.col * p.block_k + c.sub * SK_SM80_CHUNK_KEYS;
}

/* Warm L2 with the Q tile of the tile this CTA most likely takes next:
 * thread 0's look-ahead copy of its tile_info, complete and visible since
 * the current tile started. A hint only: any tile is a valid address. */
template <int kD, int kBq, int kMode>
__device__ __forceinline__ void sk_sm80_prefetch_q(const sk_sm80_params &p, int4 info) {
    sk_sm80_cursor c;
    int4 sq;
    if (!sk_sm80_tile_of<kMode>(p, info, &c, &sq)) return;
    constexpr int kLines = kD * 2 / 128; /* 128-byte lines per row */
    const int q0 = c.i * kBq, rows = min(kBq, (kMode == SK_SM80_FIXED ? p.seq_q : sq.x) - q0);
    const char *q = p.q + c.b * p.q_sb + c.h * p.q_sh + (int64_t)q0 * p.q_ss;
#pragma unroll
    for (int k = 0; k < (kBq * kLines + SK_SM80_THREADS - 1) / SK_SM80_THREADS; ++k) {
        const int idx = threadIdx.x + k * SK_SM80_THREADS, row = idx / kLines;
        if (row < rows) sk_prefetch_l2(q + (uint32_t)row * (uint32_t)p.q_ss + (idx % kLines) * 128);
    }
}

/* Whether 64-key chunk `sub` of selected block `col` holds a key that the
 * tile may see (the block's first chunk always does: the visiting rule). */
__device__ __forceinline__ bool sk_sm80_chunk_ok(const sk_sm80_params &p, int col, int sub,
                                                 int kmax, int seq_k) {
    const int kb = col * p.block_k + sub * SK_SM80_CHUNK_KEYS;
    return kb < seq_k && (!p.causal || kb <= kmax);
}

#endif /* SK_CUDA_ATTENTION_FWD_SM80_TILES_CUH */
