/*
 * decode_select_speed.c - timing of the decode page selection (issue 31's
 * row "selection (summary update + scoring + top-k) at B = 8, 128K <= 10 %
 * of the sparse decode time").
 *
 * Build: make build/decode_select_speed
 * Run:   build/decode_select_speed [--commit HASH] [--reps N] [--context N] [--batch N]
 *                                  [--block-k N] [--group-blocks N [--top-groups N]]
 *
 * Default case: B 8, context 131072 keys, Hkv 8, Hq 32, D 128, bf16, pages
 * of 64, block_k 64, k 64 + 1 sink + 2 recent blocks, q_len 1. The key
 * cache (~2.1 GB, far beyond L2) is filled from a 64 MB random pattern;
 * each sequence's pages are shuffled. The summaries are built once (timed:
 * build_us), then a decode step is timed: append one token per sequence
 * (lengths context - 1 -> context; idempotent, so it can repeat), then
 * select. With CUDA events, 3 warm-up calls, the median of N (default 50):
 *   append_us   sk_kv_summary_append alone
 *   select_us   sk_decode_select alone (score + select + place kernels)
 *   step_us     both, as one decode step issues them
 *   graph_step_us  the step captured in a CUDA graph, N replays back to
 *               back, mean per replay (GPU time, no launch gaps)
 * and one JSON object on stdout with the bytes the selection reads (the
 * summaries of every candidate block) and the bytes the sparse decode
 * reads (K and V of the selected blocks), and the ratio of the step to that
 * decode at 3.0 TB/s (the target rate): the target is <= 0.10.
 * --group-blocks G --top-groups T: the two-level selection (sparsek.h),
 * which reads the group summaries and only the kept groups' blocks.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sparsek.h"
#include "bench_check.h"

enum { WARMUP = 3, PATTERN_BYTES = 64 << 20 };

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* bf16 N(0,1)-ish from a uniform sum (Irwin-Hall, 4 terms). */
static uint16_t rand_bf16(uint64_t *s) {
    double x = 0.0;
    for (int i = 0; i < 4; ++i) x += (double)(rng_next(s) >> 11) * 0x1.0p-53;
    float f = (float)((x - 2.0) * 1.7320508);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct bench {
    sk_decode_select_desc d;
    void *cache, *q, *sum, *ws;
    int32_t *table, *old, *lens, *off, *idx;
    size_t ws_bytes, sum_bytes;
    sk_bsr layout;
} bench;

static void step(bench *b, int what, cudaStream_t s) {
    if (what & 1) SK_OK(sk_kv_summary_append(&b->d, b->cache, b->table, b->old, b->lens, b->sum, s));
    if (what & 2)
        SK_OK(sk_decode_select(&b->d, b->q, b->sum, b->lens, &b->layout, b->ws, b->ws_bytes, s));
}

/* Median of `reps` timed calls of step(what). */
static double time_step(bench *b, int what, int reps) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    float *ms = (float *)malloc((size_t)reps * sizeof(float));
    for (int i = 0; i < WARMUP; ++i) step(b, what, NULL);
    for (int i = 0; i < reps; ++i) {
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaEventRecord(e0, NULL));
        step(b, what, NULL);
        CUDA_OK(cudaEventRecord(e1, NULL));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    const double med = 1000.0 * ms[reps / 2];
    free(ms);
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    return med;
}

/* The step as a captured graph, `reps` replays back to back. */
static double time_graph(bench *b, int reps) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    step(b, 3, s);
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < WARMUP; ++i) CUDA_OK(cudaGraphLaunch(exec, s));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaEventRecord(e1, s));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    return 1000.0 * ms / reps;
}

static void *dev_alloc(size_t n) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n < 16 ? 16 : n));
    return p;
}

int main(int argc, char **argv) {
    const char *commit = "unknown";
    int reps = 50, batch = 8, block_k = 64, group_blocks = 0, top_groups = 16;
    long context = 131072;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--commit") == 0 && i + 1 < argc)
            commit = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc)
            context = atol(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--block-k") == 0 && i + 1 < argc)
            block_k = atoi(argv[++i]);
        else if (strcmp(argv[i], "--group-blocks") == 0 && i + 1 < argc)
            group_blocks = atoi(argv[++i]);
        else if (strcmp(argv[i], "--top-groups") == 0 && i + 1 < argc)
            top_groups = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--commit HASH] [--reps N] [--context N] [--batch N] "
                            "[--block-k N] [--group-blocks N [--top-groups N]]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || batch < 1 || context < 2) return 2;
    bench b;
    memset(&b, 0, sizeof b);
    SK_OK(sk_decode_select_desc_init(&b.d, sizeof b.d));
    b.d.backend = SK_BACKEND_CUDA;
    b.d.dtype = SK_DTYPE_BF16;
    b.d.batch = batch;
    b.d.q_len = 1;
    b.d.heads_q = 32;
    b.d.heads_kv = 8;
    b.d.head_dim = 128;
    b.d.max_seqlen_k = context;
    b.d.block_k = block_k;
    b.d.k = 64;
    b.d.sink_blocks = 1;
    b.d.recent_blocks = 2;
    b.d.page_size = 64;
    b.d.group_blocks = group_blocks;
    b.d.top_groups = top_groups;
    const int32_t pages_per_seq = (int32_t)((context + 63) / 64);
    b.d.max_pages = pages_per_seq;
    b.d.num_pages = (int64_t)batch * pages_per_seq;
    const size_t cache_bytes = (size_t)b.d.num_pages * 64 * 8 * 128 * 2;
    const size_t q_bytes = (size_t)batch * 32 * 128 * 2;

    uint64_t seed = 0x5eed;
    uint16_t *pattern = (uint16_t *)malloc(PATTERN_BYTES);
    int32_t *table = (int32_t *)malloc((size_t)b.d.num_pages * 4);
    if (pattern == NULL || table == NULL) return 1;
    for (size_t i = 0; i < PATTERN_BYTES / 2; ++i) pattern[i] = rand_bf16(&seed);
    b.cache = dev_alloc(cache_bytes);
    for (size_t at = 0; at < cache_bytes; at += PATTERN_BYTES)
        CUDA_OK(cudaMemcpy((char *)b.cache + at, pattern,
                           cache_bytes - at < PATTERN_BYTES ? cache_bytes - at : PATTERN_BYTES,
                           cudaMemcpyHostToDevice));
    b.q = dev_alloc(q_bytes);
    CUDA_OK(cudaMemcpy(b.q, pattern + 12345, q_bytes, cudaMemcpyHostToDevice));
    /* Every page once, shuffled across the batch. */
    for (int64_t i = 0; i < b.d.num_pages; ++i) table[i] = (int32_t)i;
    for (int64_t i = b.d.num_pages - 1; i > 0; --i) {
        const int64_t j = (int64_t)(rng_next(&seed) % (uint64_t)(i + 1));
        const int32_t t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    b.table = (int32_t *)dev_alloc((size_t)b.d.num_pages * 4);
    CUDA_OK(cudaMemcpy(b.table, table, (size_t)b.d.num_pages * 4, cudaMemcpyHostToDevice));
    int32_t *lens = (int32_t *)malloc((size_t)batch * 4), *old = (int32_t *)malloc((size_t)batch * 4);
    for (int i = 0; i < batch; ++i) lens[i] = (int32_t)context, old[i] = (int32_t)context - 1;
    b.lens = (int32_t *)dev_alloc((size_t)batch * 4);
    b.old = (int32_t *)dev_alloc((size_t)batch * 4);
    CUDA_OK(cudaMemcpy(b.lens, lens, (size_t)batch * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(b.old, old, (size_t)batch * 4, cudaMemcpyHostToDevice));

    int32_t cap = 0;
    SK_OK(sk_kv_summary_bytes(&b.d, &b.sum_bytes));
    SK_OK(sk_decode_select_capacity(&b.d, NULL, &cap));
    SK_OK(sk_decode_select_workspace_size(&b.d, &b.ws_bytes));
    b.sum = dev_alloc(b.sum_bytes);
    b.ws = dev_alloc(b.ws_bytes);
    const int32_t rows = batch * 8;
    b.off = (int32_t *)dev_alloc((size_t)(rows + 1) * 4);
    b.idx = (int32_t *)dev_alloc((size_t)cap * 4);
    b.layout.row_offsets = b.off;
    b.layout.col_indices = b.idx;

    /* Build (timed once after a warm-up), then check one step's layout. */
    SK_OK(sk_kv_summary_build(&b.d, b.cache, b.table, b.old, b.sum, NULL));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, NULL));
    SK_OK(sk_kv_summary_build(&b.d, b.cache, b.table, b.old, b.sum, NULL));
    CUDA_OK(cudaEventRecord(e1, NULL));
    CUDA_OK(cudaEventSynchronize(e1));
    float build_ms = 0.f;
    CUDA_OK(cudaEventElapsedTime(&build_ms, e0, e1));
    step(&b, 3, NULL);
    CUDA_OK(cudaDeviceSynchronize());
    int32_t *off = (int32_t *)malloc((size_t)(rows + 1) * 4);
    CUDA_OK(cudaMemcpy(off, b.off, (size_t)(rows + 1) * 4, cudaMemcpyDeviceToHost));
    fprintf(stderr, "capacity %d, selected %d\n", (int)cap, (int)off[rows]);

    const double append_us = time_step(&b, 1, reps);
    const double select_us = time_step(&b, 2, reps);
    const double step_us = time_step(&b, 3, reps);
    const double graph_us = time_graph(&b, reps);

    /* Summaries read: every block's, or with two levels every group's and
     * the kept groups' blocks. */
    const double row_blocks = (double)((context + block_k - 1) / block_k);
    const double read_per_row =
        group_blocks > 0
            ? ceil(row_blocks / group_blocks) + fmin(top_groups * (double)group_blocks, row_blocks)
            : row_blocks;
    const double summary_read = (double)rows * read_per_row * 2 * 128 * 2;
    const double decode_bytes = (double)rows * (64 + 1 + 2) * block_k * 128 * 2 * 2;
    const double decode_us = decode_bytes / 3.0e12 * 1e6;
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("{\"name\": \"decode_select\", \"commit\": \"%s\", \"gpu\": \"%s\", \"batch\": %d, "
           "\"context\": %ld, \"heads_q\": 32, \"heads_kv\": 8, \"head_dim\": 128, "
           "\"dtype\": \"bf16\", \"page_size\": 64, \"block_k\": %d, \"group_blocks\": %d, "
           "\"top_groups\": %d, \"k\": 64, \"sinks\": 1, "
           "\"recent\": 2, \"reps\": %d, \"selected\": %d, \"capacity\": %d, "
           "\"build_us\": %.2f, \"append_us\": %.2f, \"select_us\": %.2f, \"step_us\": %.2f, "
           "\"graph_step_us\": %.2f, \"summary_read_bytes\": %.0f, "
           "\"select_summary_rate_TBps\": %.3f, \"sparse_decode_bytes\": %.0f, "
           "\"sparse_decode_us_at_3TBps\": %.2f, \"step_over_decode\": %.3f, "
           "\"graph_step_over_decode\": %.3f, \"target\": 0.10}\n",
           commit, prop.name, batch, context, block_k, group_blocks, group_blocks ? top_groups : 0, reps, (int)off[rows], (int)cap,
           1000.0 * build_ms, append_us, select_us, step_us, graph_us, summary_read,
           summary_read / (select_us * 1e-6) / 1e12, decode_bytes, decode_us, step_us / decode_us,
           graph_us / decode_us);
    free(pattern), free(table), free(lens), free(old), free(off);
    return 0;
}
