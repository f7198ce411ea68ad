/*
 * test_size_limits_16m.c - layouts past the old int32 dense-grid cap
 * (issue 33, docs/perf/context_parallel.md section 7): a 16M-token
 * problem (S = 2^24, blocks of 128: 131072 x 131072 = 2^34 dense blocks)
 * is described, validated and planned for context parallelism; what must
 * still fit int32 (nnz, the top-k score matrix) is refused with its own
 * message, before anything is allocated or written.
 *
 * Small on purpose (CI: 2 cores, also under ASan): no dense [131072 x
 * 131072] array anywhere; the sinks + window layout has ~4.5M entries,
 * the refusals are decided by counting passes over rows or counts.
 * Expected values come from the pattern's and the sharding's definitions
 * (sparsek.h), never from the layout or the plan under test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

enum { BLK = 128 };
#define S16M          ((int64_t)1 << 24)
#define NB16M         (S16M / BLK) /* 131072 blocks */
#define SINK_TOKENS   256          /* 2 blocks */
#define WINDOW_TOKENS 4096         /* reaches 32 blocks back: 33 a row */

/* `call` fails with `want`, its message holds `needle`. */
#define EXPECT_REFUSED(call, want, needle)                                                         \
    do {                                                                                           \
        const sk_status st_ = (call);                                                              \
        CHECK(st_ == (want), "%s: got %s (%s), expected %s", #call, sk_status_name(st_),           \
              sk_last_error(), sk_status_name(want));                                              \
        CHECK(strstr(sk_last_error(), (needle)) != NULL, "%s: message \"%s\" lacks \"%s\"", #call, \
              sk_last_error(), (needle));                                                          \
    } while (0)

/* Row i's blocks of sinks + window over S x S (square, so p = q), from
 * the definition in sparsek.h: the sinks are keys 0 .. SINK-1 that some
 * query of the row may see (k <= q), the window the keys q - W < k <= q
 * over the row's queries. Both ranges as blocks, merged into out[]
 * (increasing, each once); returns the count (at most 2 + 34). */
static int32_t sinks_window_row(int64_t i, int64_t out[40]) {
    const int64_t q0 = i * BLK, q1 = q0 + BLK - 1;
    const int64_t sink_hi = SINK_TOKENS - 1 < q1 ? SINK_TOKENS - 1 : q1;
    const int64_t win_lo = q0 - WINDOW_TOKENS + 1 > 0 ? q0 - WINDOW_TOKENS + 1 : 0;
    int32_t n = 0;
    for (int64_t j = 0; j * BLK <= sink_hi; ++j) out[n++] = j;
    for (int64_t j = win_lo / BLK; j <= q1 / BLK; ++j) {
        int seen = 0;
        for (int32_t e = 0; e < n; ++e) seen |= out[e] == j;
        if (!seen) out[n++] = j;
    }
    return n;
}

/* The rank owning block j: chunks of nb / C blocks (nb = 2^17 is a
 * multiple of C), chunk c on rank c (contiguous) or, zigzag, rank c for
 * c < R and 2R - 1 - c above. */
static int32_t owner_of(int64_t j, int32_t ranks, int zigzag) {
    const int32_t chunks = zigzag ? 2 * ranks : ranks;
    const int32_t c = (int32_t)(j / (NB16M / chunks));
    return zigzag && c >= ranks ? 2 * ranks - 1 - c : c;
}

static void cp_desc_16m(sk_cp_desc *d, int32_t ranks, sk_cp_sharding sharding) {
    sk_cp_desc_init(d, sizeof *d);
    d->ranks = ranks;
    d->rank = 0;
    d->sharding = sharding;
    d->backend = SK_BACKEND_CPU;
    d->dtype = SK_DTYPE_BF16;
    d->batch = 1;
    d->seq = S16M;
    d->heads_q = 8;
    d->heads_kv = 2;
    d->head_dim = 128;
    d->mask = SK_MASK_CAUSAL;
}

/* The plan's bytes and units of every ordered pair against the count from
 * the definitions: dst needs block j of src when a row i of dst selects j
 * (j <= i always holds for sinks + window), once per (batch, KV head) as
 * the layout is broadcast: 2 x 128 tokens x D x 2 bytes each. */
static void check_plan_counts(const sk_bsr *layout, int32_t ranks, sk_cp_sharding sharding) {
    const int zigzag = sharding == SK_CP_SHARDING_ZIGZAG;
    sk_cp_desc d;
    cp_desc_16m(&d, ranks, sharding);
    /* The shards as the definition has them. */
    for (int32_t r = 0; r < ranks; ++r) {
        int64_t tokens = -1, starts[2], lengths[2];
        int32_t chunks = -1;
        const sk_status st = sk_cp_shard(&d, r, BLK, &tokens, &chunks, starts, lengths);
        CHECK(st == SK_STATUS_SUCCESS, "sk_cp_shard rank %d: %s", (int)r, sk_last_error());
        CHECK(tokens == S16M / ranks && chunks == (zigzag ? 2 : 1),
              "rank %d: %lld tokens in %d chunks", (int)r, (long long)tokens, (int)chunks);
        CHECK(owner_of(starts[0] / BLK, ranks, zigzag) == r &&
                  owner_of((starts[chunks - 1] + lengths[chunks - 1]) / BLK - 1, ranks, zigzag) ==
                      r,
              "rank %d: chunks do not match the definition", (int)r);
    }
    size_t bytes = 0;
    sk_status st = sk_cp_plan_size(&d, layout, &bytes);
    REQUIRE(st == SK_STATUS_SUCCESS, "sk_cp_plan_size R=%d %s: %s", (int)ranks,
            zigzag ? "zigzag" : "contiguous", sk_last_error());
    /* Per-chunk local layouts hold every row's entries once: the plan is
     * at least the layout's indices and about as large. */
    CHECK(bytes >= (size_t)layout->nnz * 4 && bytes < (size_t)layout->nnz * 4 + ((size_t)64 << 20),
          "plan of %zu bytes for nnz = %d", bytes, (int)layout->nnz);
    void *plan = malloc(bytes);
    uint8_t *need = (uint8_t *)calloc((size_t)NB16M, 1);
    REQUIRE(plan != NULL && need != NULL, "no memory");
    st = sk_cp_plan(&d, layout, plan, bytes);
    CHECK(st == SK_STATUS_SUCCESS, "sk_cp_plan: %s", sk_last_error());
    const int64_t unit_bytes = 2 * BLK * d.head_dim * 2, bh = d.batch * d.heads_kv;
    int64_t all_units = 0;
    for (int32_t dst = 0; dst < ranks && st == SK_STATUS_SUCCESS; ++dst) {
        memset(need, 0, (size_t)NB16M);
        for (int64_t i = 0; i < NB16M; ++i) {
            if (owner_of(i, ranks, zigzag) != dst) continue;
            int64_t row[40];
            const int32_t n = sinks_window_row(i, row);
            for (int32_t e = 0; e < n; ++e)
                if (owner_of(row[e], ranks, zigzag) != dst) need[row[e]] = 1;
        }
        for (int32_t src = 0; src < ranks; ++src) {
            int64_t want_units = 0;
            for (int64_t j = 0; j < NB16M; ++j)
                want_units += need[j] && owner_of(j, ranks, zigzag) == src ? bh : 0;
            int64_t got_bytes = -1, got_units = -1;
            const sk_status sb = sk_cp_plan_bytes(plan, bytes, src, dst, &got_bytes, &got_units);
            CHECK(sb == SK_STATUS_SUCCESS && got_units == want_units &&
                      got_bytes == want_units * unit_bytes,
                  "R=%d %s, %d -> %d: plan %lld units / %lld bytes, the definition %lld / %lld "
                  "(%s)",
                  (int)ranks, zigzag ? "zigzag" : "contiguous", (int)src, (int)dst,
                  (long long)got_units, (long long)got_bytes, (long long)want_units,
                  (long long)(want_units * unit_bytes), sk_last_error());
            all_units += want_units;
        }
    }
    /* Each rank's run can be sized from the plan (its own checks of the
     * plan pass at 16M); the run itself is not made here. */
    for (int32_t r = 0; r < ranks && st == SK_STATUS_SUCCESS; ++r) {
        size_t ws = 0;
        d.rank = r;
        const sk_status sw = sk_cp_workspace_size(&d, plan, bytes, &ws);
        CHECK(sw == SK_STATUS_SUCCESS && ws > 0, "sk_cp_workspace_size rank %d: %s", (int)r,
              sk_last_error());
    }
    /* Not a vacuous comparison: every rank but the first needs the sinks. */
    CHECK(all_units >= (int64_t)(ranks - 1) * 2 * bh, "only %lld units exchanged",
          (long long)all_units);
    printf("    16M tokens, R=%d %s: plan %zu bytes, %lld units (%lld MiB) exchanged\n", (int)ranks,
           zigzag ? "zigzag" : "contiguous", bytes, (long long)all_units,
           (long long)(all_units * unit_bytes >> 20));
    free(need);
    free(plan);
}

SK_TEST(size_limits_16m_sinks_window_layout_and_cp_plan) {
    const sk_grid grid = tu_grid(S16M, S16M, BLK, BLK, 1, 1);
    int32_t rb = 0, cb = 0, ns = 0;
    CHECK(sk_grid_blocks(&grid, &rb, &cb, &ns) == SK_STATUS_SUCCESS && rb == NB16M && cb == NB16M &&
              ns == 1,
          "sk_grid_blocks: %s, %d x %d x %d", sk_last_error(), (int)ns, (int)rb, (int)cb);
    sk_layout_t layout = NULL;
    const sk_status st = sk_layout_create_sinks_window(&layout, &grid, SINK_TOKENS, WINDOW_TOKENS);
    REQUIRE(st == SK_STATUS_SUCCESS, "sk_layout_create_sinks_window over 16M tokens: %s",
            sk_last_error());
    sk_bsr v;
    sk_layout_view(layout, &v);
    CHECK(sk_layout_validate(&v) == SK_STATUS_SUCCESS, "sk_layout_validate: %s", sk_last_error());
    /* Every row against the definition (nnz, then the row itself). */
    int64_t nnz = 0;
    int64_t bad_row = -1;
    for (int64_t i = 0; i < NB16M; ++i) {
        int64_t want[40];
        const int32_t n = sinks_window_row(i, want);
        nnz += n;
        const int32_t *row = v.col_indices + v.row_offsets[i];
        int ok = v.row_offsets[i + 1] - v.row_offsets[i] == n;
        for (int32_t e = 0; ok && e < n; ++e) ok = row[e] == want[e];
        if (!ok && bad_row < 0) bad_row = i;
    }
    CHECK(bad_row < 0, "row block %lld differs from the sinks + window definition",
          (long long)bad_row);
    CHECK(v.nnz == nnz, "nnz = %d, the definition gives %lld", (int)v.nnz, (long long)nnz);
    /* The dense count appears as itself (2^34), not wrapped, where a
     * conversion needs it: a short buffer is refused, nothing written. */
    uint8_t mask[16];
    memset(mask, 0xA5, sizeof mask);
    EXPECT_REFUSED(sk_layout_to_mask(&v, mask, sizeof mask), SK_STATUS_BAD_PARAM_SHAPE,
                   "17179869184");
    CHECK(mask[0] == 0xA5 && mask[15] == 0xA5, "sk_layout_to_mask wrote on failure");
    int32_t counts[4] = {-9, -9, -9, -9}, indices[4] = {-9, -9, -9, -9};
    EXPECT_REFUSED(sk_layout_to_flex(&v, counts, (size_t)NB16M, indices, 4),
                   SK_STATUS_BAD_PARAM_SHAPE, "17179869184");
    CHECK(counts[0] == -9 && indices[0] == -9, "sk_layout_to_flex wrote on failure");

    check_plan_counts(&v, 8, SK_CP_SHARDING_CONTIGUOUS);
    check_plan_counts(&v, 8, SK_CP_SHARDING_ZIGZAG);
    sk_layout_destroy(layout);
}

/* Builders whose pattern selects more than INT32_MAX blocks over a grid
 * that is itself valid: refused by the counting pass, *out untouched. */
SK_TEST(size_limits_16m_builders_refuse_nnz_over_int32) {
    const sk_grid grid = tu_grid(S16M, S16M, BLK, BLK, 1, 1);
    static char sentinel_object;
    sk_layout_t const sentinel = (sk_layout_t)(void *)&sentinel_object;
    sk_layout_t out = sentinel;
    /* 2^34, 2^17 (2^17 + 1) / 2 and 2^17 x 2^15 = 2^32 blocks. */
    EXPECT_REFUSED(sk_layout_create_dense(&out, &grid), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "17179869184 blocks per slice");
    EXPECT_REFUSED(sk_layout_create_causal(&out, &grid), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "8590000128 blocks per slice");
    EXPECT_REFUSED(sk_layout_create_random(&out, &grid, 1 << 15, 7, 0),
                   SK_STATUS_BAD_LAYOUT_OVERFLOW, "4294967296 blocks per slice");
    /* Over slices: 2^14 blocks a slice (rows of 2^14 keys) x 2^17 slices
     * = 2^31, one past INT32_MAX; 2^17 - 1 slices fit (not built: 8 GiB). */
    const sk_grid sliced = tu_grid(BLK, (int64_t)BLK << 14, BLK, BLK, 1 << 7, 1 << 10);
    EXPECT_REFUSED(sk_layout_create_dense(&out, &sliced), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "16384 blocks per slice x 131072 slices");
    EXPECT_REFUSED(sk_layout_create_window(&out, &sliced, (int64_t)BLK << 14, 0),
                   SK_STATUS_BAD_LAYOUT_OVERFLOW, "INT32_MAX");
    CHECK(out == sentinel, "a refused builder wrote *out");
}

/* From FlexAttention's form: counts summing past INT32_MAX are refused
 * before any index is read (indices is a 4-entry array here). */
SK_TEST(size_limits_flex_counts_over_int32) {
    const int64_t rows = 1 << 16, cols = 1 << 16;
    const sk_grid grid = tu_grid(rows * BLK, cols * BLK, BLK, BLK, 1, 1);
    int32_t *counts = (int32_t *)malloc((size_t)rows * sizeof(int32_t));
    REQUIRE(counts != NULL, "no memory");
    /* 32768 full rows = 2^31 entries: one past INT32_MAX. */
    for (int64_t g = 0; g < rows; ++g) counts[g] = g < rows / 2 ? (int32_t)cols : 0;
    const int32_t indices[4] = {0, 1, 2, 3};
    static char sentinel_object;
    sk_layout_t const sentinel = (sk_layout_t)(void *)&sentinel_object;
    sk_layout_t out = sentinel;
    EXPECT_REFUSED(sk_layout_create_from_flex(&out, &grid, counts, indices, (int32_t)cols),
                   SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "counts sum to too many blocks: nnz = 2147483648");
    CHECK(out == sentinel, "sk_layout_create_from_flex wrote *out");
    free(counts);
}

/* The top-k selection keeps a dense fp32 score matrix: its own limit of
 * INT32_MAX entries, at the shape (no data), on both sides of the edge. */
SK_TEST(size_limits_topk_score_matrix_limit) {
    sk_topk_desc d;
    sk_topk_desc_init(&d, sizeof d);
    d.backend = SK_BACKEND_CPU;
    d.batch = 1;
    d.heads_q = 1;
    d.heads_kv = 1;
    d.head_dim = 64;
    d.k = 16;
    /* 46340^2 = 2147395600 <= INT32_MAX < 46341^2. */
    d.seq_q = d.seq_k = 46340 * 64;
    d.block_q = d.block_k = 64;
    sk_grid g;
    int32_t cap = -1;
    sk_status st = sk_topk_layout_capacity(&d, &g, &cap);
    CHECK(st == SK_STATUS_SUCCESS && cap == 46340 * 16, "46340^2 scores: %s, capacity %d",
          sk_last_error(), (int)cap);
    d.seq_q = d.seq_k = 46341 * 64;
    cap = -1;
    EXPECT_REFUSED(sk_topk_layout_capacity(&d, &g, &cap), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "top-k score matrix [batch x heads_q = 1 slices, 46341 row blocks, 46341 col "
                   "blocks] has 2147488281 entries");
    CHECK(cap == -1, "capacity written on failure");
    /* The 16M problem, per KV head: the layout grid is fine, the scores are not. */
    d.seq_q = d.seq_k = S16M;
    d.block_q = d.block_k = BLK;
    d.heads_q = 8;
    d.heads_kv = 2;
    d.per_kv_head = 1;
    size_t ws = 12345;
    EXPECT_REFUSED(sk_topk_workspace_size(&d, &ws), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "batch x heads_kv = 2 slices");
    CHECK(ws == 12345, "workspace size written on failure");
    /* The CUDA backends, which hold the matrix in their workspace, refuse
     * it the same way, before any device query (also in CPU-only builds). */
    d.backend = SK_BACKEND_CUDA;
    d.head_dim = 128;
    EXPECT_REFUSED(sk_topk_workspace_size(&d, &ws), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "has 34359738368 entries");
    EXPECT_REFUSED(sk_pool_select_topk_workspace_size(&d, &ws), SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "has 34359738368 entries");
    CHECK(ws == 12345, "workspace size written on failure");
}

#if defined(__linux__)
/* `bytes` (rounded up to 2 MiB) of read-only ones at one address, made of
 * one 2 MiB file mapped again and again: 2 MiB of memory. */
typedef struct ones_map {
    FILE *file;
    char *base;
    size_t bytes;
} ones_map;

static void ones_unmap(ones_map *m) {
    if (m->base != NULL) munmap(m->base, m->bytes);
    if (m->file != NULL) fclose(m->file);
    memset(m, 0, sizeof *m);
}

static int ones_map_make(size_t want, ones_map *m) {
    const size_t piece = (size_t)2 << 20, pieces = (want + piece - 1) / piece;
    memset(m, 0, sizeof *m);
    m->file = tmpfile();
    char *ones = (char *)malloc(piece);
    int ok = m->file != NULL && ones != NULL;
    if (ok) {
        memset(ones, 1, piece);
        ok = write(fileno(m->file), ones, piece) == (ssize_t)piece;
    }
    free(ones);
    /* The address range first (the file past its end, never touched),
     * then the pieces over it. */
    if (ok) {
        char *base = (char *)mmap(NULL, piece * pieces, PROT_NONE, MAP_PRIVATE, fileno(m->file), 0);
        ok = base != (char *)MAP_FAILED;
        if (ok) {
            m->base = base;
            m->bytes = piece * pieces;
        }
    }
    for (size_t p = 0; p < pieces && ok; ++p)
        ok = mmap(m->base + p * piece, piece, PROT_READ, MAP_SHARED | MAP_FIXED, fileno(m->file),
                  0) != MAP_FAILED;
    if (!ok) ones_unmap(m);
    return ok;
}

/* Dense masks with more than INT32_MAX selected blocks: refused after the
 * count, before any allocation, *out untouched. */
SK_TEST(size_limits_mask_nnz_over_int32) {
    static char sentinel_object;
    sk_layout_t const sentinel = (sk_layout_t)(void *)&sentinel_object;
    /* 2 row blocks x 2^30 + 2^20 col blocks of 64: every byte selects. */
    const int64_t cols = ((int64_t)1 << 30) + ((int64_t)1 << 20);
    ones_map m;
    REQUIRE(ones_map_make((size_t)(2 * cols), &m), "could not map %lld bytes of ones",
            (long long)(2 * cols));
    const sk_grid grid = tu_grid(2 * 64, cols * 64, 64, 64, 1, 1);
    sk_layout_t out = sentinel;
    char want[80];
    snprintf(want, sizeof want, "mask selects too many blocks: nnz = %lld", (long long)(2 * cols));
    EXPECT_REFUSED(sk_layout_create_from_mask(&out, &grid, (const uint8_t *)m.base),
                   SK_STATUS_BAD_LAYOUT_OVERFLOW, want);
    CHECK(out == sentinel, "sk_layout_create_from_mask wrote *out");
    ones_unmap(&m);

    /* Varlen: one sequence of 64 queries and 2^25 - 1 key blocks, 65 heads:
     * 65 x (2^25 - 1) = 2181038015 mask bytes, all selecting. */
    const int64_t nbk = ((int64_t)1 << 25) - 1, need = 65 * nbk;
    REQUIRE(ones_map_make((size_t)need, &m), "could not map %lld bytes of ones", (long long)need);
    const int32_t cu_q[2] = {0, 64}, cu_k[2] = {0, (int32_t)(nbk * 64)};
    const sk_varlen_grid vg = {1, 64, 64, 65, cu_q, cu_k};
    out = sentinel;
    snprintf(want, sizeof want, "masks select too many blocks: nnz = %lld", (long long)need);
    EXPECT_REFUSED(
        sk_layout_create_varlen_from_masks(&out, &vg, (const uint8_t *)m.base, (size_t)need),
        SK_STATUS_BAD_LAYOUT_OVERFLOW, want);
    CHECK(out == sentinel, "sk_layout_create_varlen_from_masks wrote *out");
    ones_unmap(&m);
}

/* The top-k builder keeping more than INT32_MAX blocks: every candidate
 * forced (sink_blocks covers the row), so its count needs no score; the
 * [1, 2, 2^30 + 1] scores are /dev/zero, mapped and never touched. */
SK_TEST(size_limits_topk_builder_nnz_over_int32) {
    const int64_t cb = ((int64_t)1 << 30) + 1;
    const size_t bytes = (size_t)(2 * cb) * sizeof(float);
    FILE *zero = fopen("/dev/zero", "rb");
    REQUIRE(zero != NULL, "cannot open /dev/zero");
    void *scores = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fileno(zero), 0);
    if (scores == MAP_FAILED) {
        fclose(zero);
        REQUIRE(0, "could not map %zu bytes of /dev/zero", bytes);
    }
    const sk_grid grid = tu_grid(2 * 64, cb * 64, 64, 64, 1, 1);
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    opt.k = 1;
    opt.sink_blocks = INT32_MAX;
    static char sentinel_object;
    sk_layout_t const sentinel = (sk_layout_t)(void *)&sentinel_object;
    sk_layout_t out = sentinel;
    EXPECT_REFUSED(sk_layout_create_topk(&out, &grid, (const float *)scores, &opt),
                   SK_STATUS_BAD_LAYOUT_OVERFLOW,
                   "scores: the selection keeps too many blocks: nnz = 2147483650");
    CHECK(out == sentinel, "sk_layout_create_topk wrote *out");
    munmap(scores, bytes);
    fclose(zero);
}
#endif
