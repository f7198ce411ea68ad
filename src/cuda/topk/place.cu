/*
 * place.cu - the last kernel of the top-k selection: the row offsets and
 * the packed column indices of the output layout. Unless the short-row flag
 * is set (or the general selection kernel ran), only the last row offset:
 * the register selection placed the rows. Else the compaction: up to
 * CMP_MAX_CTAS CTAs, each sums the counts of the rows before its range
 * itself, scans its rows (row_offsets) and copies their scratch entries
 * into col_indices.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    CMP_THREADS = 256, /* compaction: one row per thread in the scan, a warp per row in the copy */
    CMP_MAX_CTAS = 128
};

typedef struct place_params {
    const int32_t *counts;  /* [rows] */
    const int32_t *scratch; /* [rows, row_cap] */
    int32_t *row_offsets;   /* [rows + 1] */
    int32_t *col_indices;   /* [capacity] */
    row_table table;        /* read unless `compact` */
    int32_t row_cap, rows;
    int32_t capacity;
    int32_t per_cta;        /* compaction: rows per CTA (a multiple of CMP_THREADS) */
    int32_t compact_ctas;   /* compaction: CTAs with rows */
    int32_t compact;        /* != 0: compact whatever the flag says (no row table) */
} place_params;

/* Row offsets and the packed column indices.
 * Unless `compact` is set or the flag says that some row came out short,
 * every row filled its bound, and the register selection has already
 * written each row's entries and offset at the place the row table gives
 * (slice * per_slice + place.x): only the last offset is left.
 * Else the compaction, one pass: CTA c < compact_ctas owns rows
 * [c * per_cta, min((c + 1) * per_cta, rows)): it sums the counts of every
 * earlier row itself (at most CMP_MAX_CTAS CTAs read the counts, from L2),
 * scans its own rows in chunks of CMP_THREADS, writes their offsets, and
 * copies each row's scratch entries with one warp per row. The last CTA
 * also writes row_offsets[rows]. */
__global__ void __launch_bounds__(CMP_THREADS) sk_topk_place_kernel(const __grid_constant__ place_params pp) {
    pdl_enter();
    const int32_t *counts = pp.counts, *scratch = pp.scratch;
    int32_t *row_offsets = pp.row_offsets, *col_indices = pp.col_indices;
    const int32_t row_cap = pp.row_cap, rows = pp.rows, per_cta = pp.per_cta;
    if (!pp.compact && *pp.table.flag == 0) { /* the same value for the whole grid */
        if (blockIdx.x == 0 && threadIdx.x == 0) row_offsets[rows] = pp.capacity;
        return;
    }
    if ((int32_t)blockIdx.x >= pp.compact_ctas) return;
    __shared__ int32_t warp_part[CMP_THREADS / 32];
    __shared__ int32_t chunk_off[CMP_THREADS];
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int32_t r0 = (int32_t)blockIdx.x * per_cta;
    const int32_t r1 = r0 + per_cta < rows ? r0 + per_cta : rows;

    /* Sum of counts[0 .. r0): r0 is a multiple of 4 and counts is 256-byte
     * aligned, so int4 loads, 8 in flight per thread. */
    int32_t part = 0;
    const int4 *c4 = (const int4 *)counts;
    const int32_t n4 = r0 / 4;
#pragma unroll 8
    for (int32_t e = tid; e < n4; e += CMP_THREADS) {
        const int4 v = __ldg(c4 + e);
        part += v.x + v.y + v.z + v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) warp_part[warp] = part;
    __syncthreads();
    int32_t base = 0;
#pragma unroll
    for (int w = 0; w < CMP_THREADS / 32; ++w) base += warp_part[w];
    __syncthreads(); /* warp_part is reused by the scans */

    for (int32_t c0 = r0; c0 < r1; c0 += CMP_THREADS) {
        const int32_t r = c0 + tid;
        const int32_t v = r < r1 ? counts[r] : 0;
        int32_t total;
        const int32_t off = base + cta_exclusive_sum<CMP_THREADS>(v, warp_part, &total);
        chunk_off[tid] = off;
        if (r < r1) row_offsets[r] = off;
        __syncthreads();
        /* Copy: warp w takes rows c0 + w, c0 + w + 8, ... of the chunk. */
        for (int32_t q = warp; q < CMP_THREADS && c0 + q < r1; q += CMP_THREADS / 32) {
            const int32_t g = c0 + q, nsel = counts[g], dst = chunk_off[q];
            const int32_t *src = scratch + (int64_t)g * row_cap;
            for (int32_t e = lane; e < nsel; e += 32) col_indices[dst + e] = src[e];
        }
        base += total;
        __syncthreads(); /* warp_part and chunk_off are rewritten next */
    }
    if (r1 == rows && tid == 0) row_offsets[rows] = base;
}

sk_status sk_topk_launch_place(const sk_topk_problem *p, const int32_t *counts,
                               const int32_t *scratch, const row_table *table, int compact,
                               int hopper, cudaStream_t stream) {
    /* Compaction: at most CMP_MAX_CTAS CTAs, each a multiple of CMP_THREADS
     * rows (without it, CTA 0 writes the last offset). */
    const int64_t rows = p->total_rows;
    int64_t per_cta = (rows + CMP_MAX_CTAS - 1) / CMP_MAX_CTAS;
    per_cta = (per_cta + CMP_THREADS - 1) / CMP_THREADS * CMP_THREADS;
    place_params pp;
    pp.counts = counts;
    pp.scratch = scratch;
    pp.row_offsets = p->row_offsets;
    pp.col_indices = p->col_indices;
    pp.table = *table;
    pp.row_cap = p->row_cap;
    pp.rows = p->total_rows;
    pp.capacity = p->capacity;
    pp.per_cta = (int32_t)per_cta;
    pp.compact_ctas = (int32_t)((rows + per_cta - 1) / per_cta);
    pp.compact = compact;
    launch_cfg l;
    SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)pp.compact_ctas, CMP_THREADS, 0,
                                                 stream, hopper),
                                   sk_topk_place_kernel, pp),
                "placement kernel launch");
    return SK_STATUS_SUCCESS;
}
