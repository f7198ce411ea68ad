/*
 * fwd_sm80.cu - the portable block-sparse attention forward (sm_80+):
 * FlashAttention-2 style, mma.sync tensor cores, cp.async double buffering,
 * visiting only the selected key blocks of each layout row.
 *
 * Work. A tile is one layout row of one (batch, query head): block_q query
 * rows against the row's selected key blocks (kernels.h). The grid
 * is persistent, two CTAs of 4 warps per SM; each CTA takes tiles in the
 * plan's order (longest first) through an atomic counter. The plan stores
 * per slot the tile's first visited entry (common/plan_contract.cuh), and
 * thread 0 keeps one grabbed slot and one tile_info copy (cp.async) ahead,
 * so a tile switch waits on no global load; the look-ahead entry is visible
 * to all threads since the tile start, so a non-empty next tile is taken
 * without a barrier. The next tile's first K/V chunk loads during the
 * current tile's last chunk, its Q right after the last chunk's softmax
 * (warmed in L2 when the tile enters its last block).
 *
 * CTA: 4 warps; warp w owns block_q / 4 query rows (kMT = block_q / 64 m16
 * tiles) and their O accumulators (fp32, registers). The Q tile stays
 * resident in shared memory for the whole tile (ldmatrix per use: with 32
 * rows per warp the registers hold O and S, not Q as well). The uniform
 * scheduling state (cursor: tile, row entry, column, chunk) lives in shared
 * memory, written by thread 0 and read after the next barrier, to leave the
 * registers to the accumulators (255 at D = 128, no spills).
 *
 * Per 64-key chunk of a selected block:
 *   S = Q K^T            mma.sync m16n8k16, K fragments by ldmatrix, each
 *                        used by all kMT m-tiles of the warp
 *   online softmax       base 2: p = 2^(s c - ms), c = |scale| log2(e). The
 *                        reference max ms of a row moves (rescaling O and l)
 *                        only when a score exceeds it by more than 8, decided
 *                        per warp by a vote on per-thread maxima; otherwise
 *                        p <= 2^8, no shuffles and no rescale (and none in
 *                        a tile's first chunk, where O and l are 0)
 *   O += P V             P repacked from the S accumulators as the A operand
 *                        (no shared memory), V fragments by ldmatrix.trans
 * The mask (tails k >= Sk; causal k > q + Sk - Sq) is applied only in the
 * chunks that need it; a chunk with no visible key for a warp's rows is
 * skipped by that warp, and chunks and blocks invisible to the whole tile
 * are never loaded.
 *
 * Pipeline. Shared memory: two stages of one chunk of K and V, and the Q
 * tile (96 KB at D = 128, block_q = 128: two CTAs per SM). Each warp loads
 * its own rows: 16 rows of K and of V per chunk, and its own Q rows, which
 * only it reads. One barrier per chunk: at its top, chunk c's K and V have
 * landed (wait_group 1) and every warp is done with the other stage, into
 * which chunk c+1 is then issued (one cp.async group); a second group [Q of
 * the next tile, usually empty] follows after the softmax: a warp reloads
 * its Q rows after its own softmax and a __syncwarp, no CTA barrier. A
 * tile's epilogue computes O / l (and LSE) in registers, then, after one
 * barrier, stages O through the last chunk's stage and writes it as 16-byte
 * row chunks; a tile switch costs that barrier and the tile start's. Rows
 * past Sk (or Sq) are zero-filled by cp.async with src-size 0: never read,
 * and 0 * V never makes NaN. Shared rows are 16-byte chunks XOR-swizzled by
 * row % 8: ldmatrix, cp.async and the O staging are free of bank conflicts.
 *
 * Invariants: nothing outside [0, Sq) x [0, Sk) of Q/K/V is read and
 * nothing outside the tile's O rows < Sq and LSE entries is written; layout
 * content is clamped (common/plan_contract.cuh) so any content stays in
 * bounds; a tile's result depends only on its inputs and the order of its
 * row's indices, so outputs are bitwise reproducible whatever CTA runs it.
 * Negative scales are handled exactly: Q's sign bits are flipped once per
 * tile in shared memory and the scale made positive. Index math inside the
 * loops is 32-bit (seq strides are checked below 2^24 bytes); base pointers
 * are 64-bit.
 *
 * Varlen and paged (issue 30): the same body in another mode (kMode, a
 * compile-time flag; the fixed-batch kernels keep their own instances).
 * Tiles come from the varlen plan (varlen_plan.h); each carries its
 * sequence's clamped lengths and token bases (sk_sm80_tile_of), kept by
 * stage in sk_sm80_vshared beside the cursors. Every "Sq" / "Sk" above is
 * then the tile's len_q / len_k: rows past them are zero-filled (there they
 * are the next sequence's real tokens, not padding), causal is bottom-right
 * per sequence, LSE goes to h * total_q + token. Paged: a warp's 16 keys of
 * a chunk lie in one page (page_size >= 16, rows at multiples of 16): one
 * table lookup per warp and chunk, and a page outside the cache is never
 * read, its keys masked (sk_sm80_vshared.absent).
 *
 * Files: this one holds the parameters, the small helpers, the kernel and
 * the host side; its parts by role are fwd_sm80_tiles.cuh (work intake and
 * loads), fwd_sm80_epilogue.cuh and fwd_sm80_mainloop.cuh (the body).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/attention/kernels.h"
#include "cuda/attention/sm80_common.cuh"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"
#include "cuda/common/ptx.cuh"

enum {
    SK_SM80_WARPS = 4, /* per CTA */
    SK_SM80_THREADS = 32 * SK_SM80_WARPS,
    SK_SM80_CTAS_PER_SM = 2, /* two CTAs per SM de-phase each other's barriers */
    SK_SM80_MTILE = 16,      /* rows of one m16 MMA tile; a warp owns block_q / 64 of them */
    SK_SM80_CHUNK_KEYS = 64, /* keys per pipeline stage and softmax step */
    SK_SM80_MAX_BLOCK = 128, /* largest block_q / block_k */
    SK_SM80_SMEM_LIMIT = 227 * 1024,
    /* Seq strides are used as 32-bit byte offsets of up to 128 rows. */
    SK_SM80_MAX_SEQ_STRIDE_BYTES = 1 << 24,
    SK_SM80_MAX_SEQ = 0x7fffffff - 2 * SK_SM80_MAX_BLOCK
};

static const float SK_LOG2E = 1.4426950408889634f;
#define SK_LN2 0.6931471805599453f
/* The reference max of a row moves only when exceeded by more than this
 * (log2 units): P stays <= 2^8, and O is rarely rescaled. */
#define SK_SM80_RESCALE_LOG2 8.0f

/* Kernel parameters: byte strides; seq strides fit 32 bits (checked). */
typedef struct sk_sm80_params {
    const char *q, *k, *v;
    char *o;
    float *lse;                                             /* [B, Hq, Sq] or NULL */
    int64_t q_sb, q_sh, k_sb, k_sh, v_sb, v_sh, o_sb, o_sh; /* batch / head strides, bytes */
    int32_t q_ss, k_ss, v_ss, o_ss;                         /* seq strides, bytes */
    int32_t seq_q, seq_k, diag;                             /* diag = Sk - Sq */
    int32_t heads_q, group;
    uint32_t rb_mul, rb_shift, hq_mul, hq_shift; /* n / row_blocks, n / heads_q by multiply */
    uint32_t gq_mul, gq_shift;                   /* n / group (query head -> K/V head) */
    int32_t block_q, block_k, row_blocks, col_blocks;
    int32_t layout_batch, layout_heads, head_div, nnz;
    int32_t num_tiles;
    int32_t causal;
    const int32_t *row_offsets, *col_indices;
    const int4 *tile_info; /* [num_tiles] {tile, first pos, end, first col} */
    int32_t *tile_counter;
    float scale_abs, scale_log2; /* |scale|, |scale| * log2(e) */
    uint32_t q_sign;             /* 0x80008000 when scale < 0: Q negated exactly */
    /* Varlen and paged kernels only (fwd_sm80_varlen.cuh), last so that the
     * fixed-batch kernels' parameter offsets stay as they were. */
    const int4 *seqs;              /* plan: [vbatch] {q0, len_q, k0, len_k} (varlen_plan.h) */
    const int2 *rows;              /* plan: [row_blocks] {b, i} or {-1, -1} */
    int64_t lse_hs;                /* LSE head stride: total_q */
    const int32_t *page_table;     /* paged: [vbatch, pt_stride] */
    int64_t pt_stride, k_pg, v_pg; /* table row stride (entries); page strides (bytes) */
    int32_t vbatch, page_shift, num_pages; /* B; log2(page_size); pages per cache */
} sk_sm80_params;

/* Which kernel a body is: the fixed batch, or a varlen / paged one whose
 * tiles carry per-sequence lengths and token bases. */
enum { SK_SM80_FIXED = 0, SK_SM80_VARLEN = 1, SK_SM80_PAGED = 2 };

/* Where the pipeline is: a tile (batch, query head, row block), the current
 * entry of its layout row, that entry's column, and the 64-key chunk of
 * that block. b = -1: nothing. */
typedef struct sk_sm80_cursor {
    int32_t b, h, i;
    int32_t pos, end, col; /* current entry, end of the row, its column */
    int32_t sub, tile;     /* 64-key chunk of the block; tile id */
    int64_t koff, voff;    /* byte offsets of the (b, h / group) slices of K and V */
} sk_sm80_cursor;

/* Varlen / paged: the sequence of a tile, by pipeline stage and per warp,
 * beside sk_sm80_shared (written by thread 0 / each warp's lane 0 with the
 * cursor; the fixed kernels have none). seq[s] = {len_q, len_k, sequence,
 * 0} of the chunk in stage s; absent[s] byte w: warp w's 16 keys of that
 * chunk are in a page outside the cache (paged; masked, never read). */
typedef struct sk_sm80_vshared {
    int4 seq[2];
    unsigned char absent[2][SK_SM80_WARPS];
} sk_sm80_vshared;

/* The CTA's scheduling state in shared memory. Uniform values live here
 * rather than in registers, which the accumulators need: thread 0 writes,
 * every thread reads after the next barrier. */
typedef struct sk_sm80_shared {
    int4 info[2];          /* published tile_info entries, by parity */
    int4 pending[2];       /* thread 0's look-ahead copies, by parity */
    sk_sm80_cursor cur[2]; /* the chunk in each stage */
    /* Per warp, written by its lane 0 at a tile's last chunk and read by its
     * lanes after a __syncwarp: {b, h, i, first key} of the next tile's
     * first chunk (b = -1: none), for the warp's own load of that tile's Q. */
    int4 wnext[SK_SM80_WARPS];
} sk_sm80_shared;

/* Flip the sign bits of the Q chunks this thread loaded (same mapping as
 * sk_sm80_load_rows_warp from `tile`), once its copies have completed. */
template <int kD, int kRows>
__device__ __forceinline__ void sk_sm80_negate_rows_warp(unsigned char *tile) {
    constexpr int kChunks = kD / 8, kStep = 32 / kChunks;
    const int lane = threadIdx.x & 31;
    const int c = lane % kChunks, r0 = lane / kChunks;
    unsigned char *q0 = tile + r0 * kD * 2;
    const uint32_t cx = (uint32_t)(c ^ r0);
#pragma unroll
    for (int k = 0; k < kRows / kStep; ++k) {
        uint4 *q = (uint4 *)(q0 + k * kStep * kD * 2 + ((cx ^ (uint32_t)((k * kStep) & 7)) << 4));
        uint4 v = *q;
        v.x ^= 0x80008000u;
        v.y ^= 0x80008000u;
        v.z ^= 0x80008000u;
        v.w ^= 0x80008000u;
        *q = v;
    }
}

/* n / d for 0 <= n < 2^31 with precomputed (mul, shift) (sk_sm80_magic). */
__device__ __forceinline__ int32_t sk_sm80_div(int32_t n, uint32_t mul, uint32_t shift) {
    return (int32_t)((__umulhi((uint32_t)n, mul) + (uint32_t)n) >> shift);
}

/* The kernel's parts, in this order: work intake (tiles and loads), the
 * epilogue, the body that runs them. */
#include "cuda/attention/fwd_sm80_tiles.cuh"
#include "cuda/attention/fwd_sm80_epilogue.cuh"
#include "cuda/attention/fwd_sm80_mainloop.cuh"

template <int kDtype, int kD>
__global__ void __launch_bounds__(SK_SM80_THREADS, SK_SM80_CTAS_PER_SM)
    sk_attention_sm80_kernel(const __grid_constant__ sk_sm80_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ sk_sm80_shared sh;
    if (p.block_q == 2 * SK_SM80_MTILE * SK_SM80_WARPS)
        sk_sm80_body<kDtype, kD, 2, SK_SM80_FIXED>(p, smem, &sh, NULL);
    else
        sk_sm80_body<kDtype, kD, 1, SK_SM80_FIXED>(p, smem, &sh, NULL);
}

/* The varlen (kMode = SK_SM80_VARLEN) and paged (SK_SM80_PAGED) forwards:
 * the same body, tiles from the varlen plan (varlen_plan.h). */
template <int kDtype, int kD, int kMode>
__global__ void __launch_bounds__(SK_SM80_THREADS, SK_SM80_CTAS_PER_SM)
    sk_attention_sm80_varlen_kernel(const __grid_constant__ sk_sm80_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ sk_sm80_shared sh;
    __shared__ sk_sm80_vshared vsh;
    if (p.block_q == 2 * SK_SM80_MTILE * SK_SM80_WARPS)
        sk_sm80_body<kDtype, kD, 2, kMode>(p, smem, &sh, &vsh);
    else
        sk_sm80_body<kDtype, kD, 1, kMode>(p, smem, &sh, &vsh);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

/* Two stages of one 64-key chunk of K and V, then the Q tile. */
static size_t sk_sm80_smem_bytes(int64_t d, int32_t bq) {
    return (size_t)(2 * 2 * SK_SM80_CHUNK_KEYS + bq) * (size_t)d * 2u;
}

static_assert((2 * 2 * SK_SM80_CHUNK_KEYS + SK_SM80_MAX_BLOCK) * 128 * 2 + 2 * 16 <=
                  SK_SM80_SMEM_LIMIT / SK_SM80_CTAS_PER_SM,
              "two CTAs of the largest shape (two K/V chunk stages and the Q tile) must fit "
              "one SM's shared memory");

sk_status sk_attention_sm80_check(const sk_attention_problem *p) {
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "dtype = %d: the CUDA kernels take F16 or BF16 only", (int)p->dtype);
    if (p->head_dim != 64 && p->head_dim != 128)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "head_dim = %lld is not supported by the CUDA backend (64 or 128)",
                        (long long)p->head_dim);
    if ((p->block_q != 64 && p->block_q != 128) || (p->block_k != 64 && p->block_k != 128))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "layout blocks %d x %d: the CUDA kernels take 64 or 128", (int)p->block_q,
                        (int)p->block_k);
    if (p->seq_q > SK_SM80_MAX_SEQ || p->seq_k > SK_SM80_MAX_SEQ)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "seq_q = %lld, seq_k = %lld: the CUDA kernels take at most %d tokens",
                        (long long)p->seq_q, (long long)p->seq_k, (int)SK_SM80_MAX_SEQ);
    /* A sequence of one token never steps its stride (the core does not
     * check it then either). */
    const int64_t ss[4] = {p->seq_q > 1 ? p->q_stride[1] : 0, p->seq_k > 1 ? p->k_stride[1] : 0,
                           p->seq_k > 1 ? p->v_stride[1] : 0, p->seq_q > 1 ? p->o_stride[1] : 0};
    static const char *const names[4] = {"q_strides[1]", "k_strides[1]", "v_strides[1]",
                                         "o_strides[1]"};
    for (int i = 0; i < 4; ++i)
        if (ss[i] * 2 >= SK_SM80_MAX_SEQ_STRIDE_BYTES)
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "%s = %lld elements: the CUDA kernels need sequence strides below "
                            "%d bytes",
                            names[i], (long long)ss[i], (int)SK_SM80_MAX_SEQ_STRIDE_BYTES);
    if (p->batch * p->heads_q * (int64_t)p->row_blocks > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "batch * heads_q * row_blocks = %lld tiles: the CUDA kernels take at most "
                        "2^31 - 1",
                        (long long)(p->batch * p->heads_q * (int64_t)p->row_blocks));
    return SK_STATUS_SUCCESS;
}

/* (mul, shift) such that n / d = (umulhi(n, mul) + n) >> shift for every
 * 0 <= n < 2^31 (round-up multiplier, as in Granlund and Montgomery). */
static void sk_sm80_magic(uint32_t d, uint32_t *mul, uint32_t *shift) {
    uint32_t l = 0;
    while (((uint64_t)1 << l) < d) ++l;
    *mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - d) / d + 1);
    *shift = l;
}

template <int kDtype, int kD, int kMode>
static sk_status sk_sm80_launch_typed(const sk_sm80_params &params, int threads, size_t smem,
                                      int num_tiles, cudaStream_t stream) {
    void (*kernel)(sk_sm80_params) = sk_attention_sm80_kernel<kDtype, kD>;
    if constexpr (kMode != SK_SM80_FIXED)
        kernel = sk_attention_sm80_varlen_kernel<kDtype, kD, kMode>;
    SK_CUDA_TRY(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
        "cudaFuncSetAttribute");
    int device = 0, sms = 0, per_sm = 0;
    SK_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                "cudaDeviceGetAttribute");
    SK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
                "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (per_sm < 1) per_sm = 1;
    const int64_t resident = (int64_t)sms * per_sm;
    const int grid = (int)(resident < num_tiles ? resident : num_tiles);
    kernel<<<grid, threads, smem, stream>>>(params);
    SK_CUDA_TRY(cudaGetLastError(), "sm80 attention kernel launch");
    return SK_STATUS_SUCCESS;
}

/* The parameters of problem p (checked) and its plan's tiles. */
static void sk_sm80_fill_params(const sk_attention_problem *p, const sk_attention_schedule *s,
                                sk_sm80_params &k) {
    const int64_t es = 2; /* F16 and BF16 */
    memset(&k, 0, sizeof k);
    k.q = (const char *)p->q;
    k.k = (const char *)p->k;
    k.v = (const char *)p->v;
    k.o = (char *)p->o;
    k.lse = p->lse;
    /* Axes of one element are never stepped; their strides may be anything. */
    const int nb = p->batch > 1, nhq = p->heads_q > 1, nhk = p->heads_kv > 1;
    k.q_sb = nb ? p->q_stride[0] * es : 0;
    k.q_sh = nhq ? p->q_stride[2] * es : 0;
    k.k_sb = nb ? p->k_stride[0] * es : 0;
    k.k_sh = nhk ? p->k_stride[2] * es : 0;
    k.v_sb = nb ? p->v_stride[0] * es : 0;
    k.v_sh = nhk ? p->v_stride[2] * es : 0;
    k.o_sb = nb ? p->o_stride[0] * es : 0;
    k.o_sh = nhq ? p->o_stride[2] * es : 0;
    k.q_ss = p->seq_q > 1 ? (int32_t)(p->q_stride[1] * es) : 0;
    k.k_ss = p->seq_k > 1 ? (int32_t)(p->k_stride[1] * es) : 0;
    k.v_ss = p->seq_k > 1 ? (int32_t)(p->v_stride[1] * es) : 0;
    k.o_ss = p->seq_q > 1 ? (int32_t)(p->o_stride[1] * es) : 0;
    k.seq_q = (int32_t)p->seq_q;
    k.seq_k = (int32_t)p->seq_k;
    k.diag = (int32_t)(p->seq_k - p->seq_q);
    k.heads_q = (int32_t)p->heads_q;
    k.group = p->group;
    sk_sm80_magic((uint32_t)p->row_blocks, &k.rb_mul, &k.rb_shift);
    sk_sm80_magic((uint32_t)p->heads_q, &k.hq_mul, &k.hq_shift);
    sk_sm80_magic((uint32_t)p->group, &k.gq_mul, &k.gq_shift);
    k.block_q = p->block_q;
    k.block_k = p->block_k;
    k.row_blocks = p->row_blocks;
    k.col_blocks = p->col_blocks;
    k.layout_batch = p->layout_batch;
    k.layout_heads = p->layout_heads;
    k.head_div = p->head_div;
    k.nnz = p->nnz;
    k.num_tiles = s->num_tiles;
    k.causal = p->causal;
    k.row_offsets = p->row_offsets;
    k.col_indices = p->col_indices;
    k.tile_info = s->tile_info;
    k.tile_counter = s->tile_counter;
    k.scale_abs = fabsf(p->scale);
    k.scale_log2 = fabsf(p->scale) * SK_LOG2E;
    k.q_sign = p->scale < 0.f ? 0x80008000u : 0u;
}

/* Launch the kernel of mode kMode for p's dtype and head_dim. */
template <int kMode>
static sk_status sk_sm80_launch_mode(const sk_attention_problem *p, const sk_sm80_params &k,
                                     cudaStream_t stream) {
    const int threads = SK_SM80_THREADS;
    const size_t smem = sk_sm80_smem_bytes(p->head_dim, p->block_q);
    const int tiles = k.num_tiles;
    if (p->dtype == SK_DTYPE_F16)
        return p->head_dim == 64
                   ? sk_sm80_launch_typed<SK_DTYPE_F16, 64, kMode>(k, threads, smem, tiles, stream)
                   : sk_sm80_launch_typed<SK_DTYPE_F16, 128, kMode>(k, threads, smem, tiles,
                                                                    stream);
    return p->head_dim == 64
               ? sk_sm80_launch_typed<SK_DTYPE_BF16, 64, kMode>(k, threads, smem, tiles, stream)
               : sk_sm80_launch_typed<SK_DTYPE_BF16, 128, kMode>(k, threads, smem, tiles, stream);
}

sk_status sk_attention_sm80_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream) {
    SK_TRY(sk_attention_sm80_check(p));
    sk_sm80_params k;
    sk_sm80_fill_params(p, s, k);
    return sk_sm80_launch_mode<SK_SM80_FIXED>(p, k, stream);
}

sk_status sk_attention_sm80_varlen_launch(const sk_attention_varlen_problem *vp,
                                          const sk_attention_paged_problem *paged,
                                          const sk_varlen_plan_view *plan, cudaStream_t stream) {
    const sk_attention_problem *p = &vp->flat;
    SK_TRY(sk_attention_sm80_check(p));
    sk_attention_schedule s;
    s.tile_order = plan->tile_order;
    s.tile_counter = plan->tile_counter;
    s.num_tiles = plan->num_tiles;
    s.tile_info = plan->tile_info;
    s.part_count = 0;
    sk_sm80_params k;
    sk_sm80_fill_params(p, &s, k);
    /* A tile's cursor b is its sequence's first token (sk_sm80_tile_of):
     * Q and O step by the token stride there. */
    k.q_sb = k.q_ss;
    k.o_sb = k.o_ss;
    k.seqs = plan->seqs;
    k.rows = plan->rows;
    k.lse_hs = p->seq_q; /* LSE [Hq, total_q] */
    k.vbatch = vp->batch;
    if (paged == NULL) return sk_sm80_launch_mode<SK_SM80_VARLEN>(p, k, stream);
    k.page_table = paged->page_table;
    k.pt_stride = paged->page_table_stride;
    /* Page strides: a cache of one page never steps them. */
    k.k_pg = paged->num_pages > 1 ? p->k_stride[0] * 2 : 0;
    k.v_pg = paged->num_pages > 1 ? p->v_stride[0] * 2 : 0;
    int32_t shift = 0;
    while ((1 << shift) < paged->page_size) ++shift;
    k.page_shift = shift;
    k.num_pages = (int32_t)paged->num_pages;
    return sk_sm80_launch_mode<SK_SM80_PAGED>(p, k, stream);
}
