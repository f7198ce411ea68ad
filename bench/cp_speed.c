/*
 * cp_speed.c - the context-parallel forward over NCCL on the GPUs of one
 * host against the single-GPU forward: the speed rows of issue 33
 * (docs/perf/context_parallel.md).
 *
 * Build (after `make -j2 all`):  make build/cp_speed
 * Run (libnccl.so.2 on the loader path, e.g. the nvidia-nccl wheel's lib):
 *   build/cp_speed [--seq 1048576] [--ranks 2] [--sharding contiguous|zigzag]
 *                  [--single] [--check] [--graph] [--reps 10] [--seed 33]
 *                  [--balance off|on|both] [--reserve 16[,0...]] [--cost L,R,T]
 * The problem: B = 1, H 32/8, D 128, bf16, blocks of 128, causal; a layout
 * per KV head: the sink block, the causal window of 4096 tokens (32
 * blocks), and 16 more blocks per row drawn at random (seeded) from the
 * rest of the causal prefix, a stand-in for top-k (the same count, the
 * same spread over the past). Inputs repeat a random pattern.
 *
 * One thread per rank (GPU r), an NCCL communicator per rank made with
 * ncclCommInitRank (libnccl.so.2 opened at run time, as the library does:
 * the comm handed to sk_comm_create_nccl must come from the same NCCL).
 * Each rank: sk_cp_prepare once, 2 warm-up runs, then `reps` runs each
 * between CUDA events on its stream after a host barrier; a run's time is
 * the slowest rank's. --graph captures each rank's sk_cp_forward (NCCL
 * inside) in a CUDA graph once, after one eager run, and times the
 * graph's launches instead.
 * --single also times sk_attention_forward of the
 * whole problem on GPU 0 (when it fits). --check compares the sharded O
 * and LSE with the single-GPU ones (the test's tolerance,
 * tests/gpu/test_cp_gpu.c, with vmax the largest |V|): small --seq only.
 * TFLOPS count 4 D 128 x 128 per selected block and query head (the
 * layout's entries: partial diagonal blocks counted whole, as every
 * SparseK bench counts).
 *
 * Variants, timed one after the other in one process (the single-GPU run
 * once): --balance on uses sk_cp_balance's chunk starts (desc->chunk_starts)
 * with the costs of --cost (ns per local block, remote block, tile;
 * default sk_cp_cost_default), off the equal chunks, both each in turn;
 * --reserve takes a list of desc->reserve_sms values (SMs the first local
 * pass leaves to NCCL; default 16), each timed with each chunk choice.
 * One JSON object per variant, one per line, with the chunk starts and, per
 * rank, its local / remote blocks, tiles and predicted ms (sk_cp_predict)
 * beside the measured ms.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsek.h"

#define BENCH_ERROR_EXIT 2 /* 1 is a failed check */
#include "bench_check.h"
#include "bench_timing.h"

enum { BLOCK = 128, HQ = 32, HKV = 8, DIM = 128, WINDOW_BLOCKS = 32, TOPK = 16, PATTERN = 1 << 22 };
enum { MAX_RANKS = 8, WARMUP = 2 };

/* The NCCL entry points the bench needs (a mirror of nccl.h's types: the
 * unique id is 128 opaque bytes passed by value). */
typedef struct nccl_id {
    char internal[128];
} nccl_id;
static int (*nccl_get_unique_id)(nccl_id *);
static int (*nccl_comm_init_rank)(void **, int, nccl_id, int);
static int (*nccl_comm_destroy)(void *);

static void nccl_open(void) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        fprintf(stderr, "cp_speed: libnccl.so.2: %s\n", dlerror());
        exit(BENCH_ERROR_EXIT);
    }
    void *a = dlsym(lib, "ncclGetUniqueId"), *b = dlsym(lib, "ncclCommInitRank");
    void *c = dlsym(lib, "ncclCommDestroy");
    if (!a || !b || !c) {
        fprintf(stderr, "cp_speed: libnccl.so.2 lacks an entry point\n");
        exit(BENCH_ERROR_EXIT);
    }
    memcpy(&nccl_get_unique_id, &a, sizeof a);
    memcpy(&nccl_comm_init_rank, &b, sizeof b);
    memcpy(&nccl_comm_destroy, &c, sizeof c);
}

enum { MAX_RESERVES = 8 };

typedef struct opts {
    int64_t seq;
    int ranks, reps, single, check, graph;
    sk_cp_sharding sharding;
    uint64_t seed;
    int balance_from, balance_to; /* 0 = equal chunks, 1 = balanced */
    int reserves, reserve[MAX_RESERVES];
    sk_cp_cost cost;
} opts;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The layout (host, per KV head): sink, window, 16 random past blocks. */
static sk_layout_t make_layout(const opts *o) {
    const int64_t nb = (o->seq + BLOCK - 1) / BLOCK;
    int32_t *offsets = malloc((size_t)(HKV * nb + 1) * sizeof(int32_t));
    int32_t *cols = malloc((size_t)(HKV * nb * (1 + WINDOW_BLOCKS + TOPK)) * sizeof(int32_t));
    int64_t n = 0;
    offsets[0] = 0;
    for (int64_t h = 0; h < HKV; ++h)
        for (int64_t i = 0; i < nb; ++i) {
            int32_t *row = cols + n;
            int64_t k = 0;
            const int64_t w0 = i - WINDOW_BLOCKS + 1 > 1 ? i - WINDOW_BLOCKS + 1 : 1;
            row[k++] = 0; /* the sink */
            for (int64_t j = w0; j <= i; ++j) row[k++] = (int32_t)j;
            const int64_t past = w0 - 1; /* blocks 1 .. w0 - 1 not yet taken */
            const int64_t want = past < TOPK ? past : TOPK;
            uint64_t s = mix(o->seed ^ (uint64_t)(h * nb + i) * 0x9e3779b97f4a7c15ull);
            for (int64_t t = 0; t < want;) {
                s = mix(s + 1);
                const int32_t j = (int32_t)(1 + s % (uint64_t)past);
                int dup = 0;
                for (int64_t e = 1 + (i - w0 + 1); e < k && !dup; ++e) dup = row[e] == j;
                if (!dup) row[k++] = j, ++t;
            }
            qsort(row, (size_t)k, sizeof(int32_t), cmp_i32);
            n += k;
            offsets[h * nb + i + 1] = (int32_t)n;
        }
    sk_bsr L;
    memset(&L, 0, sizeof L);
    L.grid.rows = L.grid.cols = o->seq;
    L.grid.block_rows = L.grid.block_cols = BLOCK;
    L.grid.batch = 1;
    L.grid.heads = HKV;
    L.nnz = (int32_t)n;
    L.row_offsets = offsets;
    L.col_indices = cols;
    sk_layout_t out = NULL;
    SK_OK(sk_layout_create_from_bsr(&out, &L));
    free(offsets);
    free(cols);
    return out;
}

typedef struct rank_ctx {
    const opts *o;
    const sk_cp_desc *base;
    const void *plan;
    size_t plan_bytes;
    const nccl_id *id;
    pthread_barrier_t *barrier;
    const void *pattern_host; /* PATTERN bf16 values */
    int rank;
    float ms[BENCH_MAX_REPS];
    int64_t tokens, bytes_sent;
    void *o_host; /* --check: O and LSE of the shard */
    float *lse_host;
    const void *qkv_host[3]; /* --check: the global inputs */
} rank_ctx;

static void fill(void *dst, const void *pattern_dev, int64_t n, int64_t shift) {
    bench_fill_pattern(dst, pattern_dev, PATTERN, n, shift);
}

/* Rows of global [1, S, H, D] into the shard's rows (host). */
static void gather_rows(void *dst, const void *src, int64_t hd, const int64_t *starts,
                        const int64_t *lengths, int chunks) {
    int64_t at = 0;
    for (int c = 0; c < chunks; at += lengths[c], ++c)
        memcpy((char *)dst + at * hd * 2, (const char *)src + starts[c] * hd * 2,
               (size_t)(lengths[c] * hd * 2));
}

static void *rank_main(void *arg) {
    rank_ctx *x = arg;
    const opts *o = x->o;
    CUDA_OK(cudaSetDevice(x->rank));
    void *nc = NULL;
    if (nccl_comm_init_rank(&nc, o->ranks, *x->id, x->rank) != 0) {
        fprintf(stderr, "cp_speed: ncclCommInitRank failed on rank %d\n", x->rank);
        exit(BENCH_ERROR_EXIT);
    }
    sk_comm_t comm = NULL;
    SK_OK(sk_comm_create_nccl(nc, &comm));
    sk_cp_desc d = *x->base;
    d.rank = x->rank;
    int32_t chunks = 0;
    int64_t starts[2], lengths[2];
    SK_OK(sk_cp_shard(&d, x->rank, BLOCK, &x->tokens, &chunks, starts, lengths));
    const int64_t nq = x->tokens * HQ * DIM, nk = x->tokens * HKV * DIM;
    void *q, *k, *v, *out, *ws, *pat;
    float *lse;
    size_t wsb = 0;
    SK_OK(sk_cp_workspace_size(&d, x->plan, x->plan_bytes, &wsb));
    CUDA_OK(cudaMalloc(&q, (size_t)nq * 2));
    CUDA_OK(cudaMalloc(&k, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&v, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&out, (size_t)nq * 2));
    CUDA_OK(cudaMalloc((void **)&lse, (size_t)(HQ * x->tokens) * 4));
    CUDA_OK(cudaMalloc(&ws, wsb));
    CUDA_OK(cudaMalloc(&pat, (size_t)PATTERN * 2));
    if (o->check) {
        void *h = malloc((size_t)nq * 2);
        const int64_t hd[3] = {HQ * DIM, HKV * DIM, HKV * DIM};
        void *dst[3] = {q, k, v};
        for (int t = 0; t < 3; ++t) {
            gather_rows(h, x->qkv_host[t], hd[t], starts, lengths, chunks);
            CUDA_OK(cudaMemcpy(dst[t], h, (size_t)(x->tokens * hd[t] * 2), cudaMemcpyHostToDevice));
        }
        free(h);
    } else {
        CUDA_OK(cudaMemcpy(pat, x->pattern_host, (size_t)PATTERN * 2, cudaMemcpyHostToDevice));
        fill(q, pat, nq, 0);
        fill(k, pat, nk, 977);
        fill(v, pat, nk, 1931);
    }
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    SK_OK(sk_cp_prepare(&d, x->plan, x->plan_bytes, ws, wsb, (struct CUstream_st *)st));
    cudaGraphExec_t exec = NULL;
    if (o->graph) {
        /* Every rank captures its run once, after one eager run: NCCL
         * connects a pair of peers on their first exchange, which cannot
         * happen inside a capture (ncclGroupEnd fails with an internal
         * error when the first exchange is captured). */
        cudaGraph_t g;
        pthread_barrier_wait(x->barrier);
        SK_OK(sk_cp_forward(&d, x->plan, x->plan_bytes, comm, q, k, v, out, lse, ws, wsb,
                            (struct CUstream_st *)st));
        CUDA_OK(cudaStreamSynchronize(st));
        pthread_barrier_wait(x->barrier);
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        SK_OK(sk_cp_forward(&d, x->plan, x->plan_bytes, comm, q, k, v, out, lse, ws, wsb,
                            (struct CUstream_st *)st));
        CUDA_OK(cudaStreamEndCapture(st, &g));
        CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
        CUDA_OK(cudaGraphDestroy(g));
    }
    for (int r = 0; r < WARMUP + o->reps; ++r) {
        CUDA_OK(cudaStreamSynchronize(st));
        pthread_barrier_wait(x->barrier);
        CUDA_OK(cudaEventRecord(e0, st));
        if (exec != NULL)
            CUDA_OK(cudaGraphLaunch(exec, st));
        else
            SK_OK(sk_cp_forward(&d, x->plan, x->plan_bytes, comm, q, k, v, out, lse, ws, wsb,
                                (struct CUstream_st *)st));
        CUDA_OK(cudaEventRecord(e1, st));
        CUDA_OK(cudaEventSynchronize(e1));
        if (r >= WARMUP) CUDA_OK(cudaEventElapsedTime(&x->ms[r - WARMUP], e0, e1));
    }
    SK_OK(sk_comm_info(comm, NULL, NULL, &x->bytes_sent));
    if (exec != NULL) CUDA_OK(cudaGraphExecDestroy(exec));
    if (o->check) {
        x->o_host = malloc((size_t)nq * 2);
        x->lse_host = malloc((size_t)(HQ * x->tokens) * 4);
        CUDA_OK(cudaMemcpy(x->o_host, out, (size_t)nq * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(x->lse_host, lse, (size_t)(HQ * x->tokens) * 4, cudaMemcpyDeviceToHost));
    }
    sk_comm_destroy(comm);
    nccl_comm_destroy(nc);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(ws),
        cudaFree(pat);
    cudaStreamDestroy(st);
    return NULL;
}

/* The whole problem on GPU 0: median ms; O and LSE to the host if asked. */
static float single_gpu(const opts *o, const sk_bsr *host_layout, const void *pattern_host,
                        const void *const qkv[3], void *o_host, float *lse_host) {
    CUDA_OK(cudaSetDevice(0));
    const int64_t nq = o->seq * HQ * DIM, nk = o->seq * HKV * DIM;
    sk_attention_desc a;
    sk_attention_desc_init(&a, sizeof a);
    a.dtype = SK_DTYPE_BF16;
    a.batch = 1;
    a.seq_q = a.seq_k = o->seq;
    a.heads_q = HQ;
    a.heads_kv = HKV;
    a.head_dim = DIM;
    a.mask = SK_MASK_CAUSAL;
    sk_bsr L = *host_layout;
    const int64_t rows = (int64_t)HKV * ((o->seq + BLOCK - 1) / BLOCK) + 1;
    CUDA_OK(cudaMalloc((void **)&L.row_offsets, (size_t)rows * 4));
    CUDA_OK(cudaMalloc((void **)&L.col_indices, (size_t)host_layout->nnz * 4));
    CUDA_OK(cudaMemcpy(L.row_offsets, host_layout->row_offsets, (size_t)rows * 4,
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(L.col_indices, host_layout->col_indices, (size_t)host_layout->nnz * 4,
                       cudaMemcpyHostToDevice));
    void *q, *k, *v, *out, *ws, *pat;
    float *lse;
    size_t wsb = 0;
    SK_OK(sk_attention_workspace_size(&a, &L, &wsb));
    CUDA_OK(cudaMalloc(&q, (size_t)nq * 2));
    CUDA_OK(cudaMalloc(&k, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&v, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&out, (size_t)nq * 2));
    CUDA_OK(cudaMalloc((void **)&lse, (size_t)(HQ * o->seq) * 4));
    CUDA_OK(cudaMalloc(&ws, wsb > 0 ? wsb : 256));
    CUDA_OK(cudaMalloc(&pat, (size_t)PATTERN * 2));
    if (qkv != NULL) {
        CUDA_OK(cudaMemcpy(q, qkv[0], (size_t)nq * 2, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(k, qkv[1], (size_t)nk * 2, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(v, qkv[2], (size_t)nk * 2, cudaMemcpyHostToDevice));
    } else {
        CUDA_OK(cudaMemcpy(pat, pattern_host, (size_t)PATTERN * 2, cudaMemcpyHostToDevice));
        fill(q, pat, nq, 0);
        fill(k, pat, nk, 977);
        fill(v, pat, nk, 1931);
    }
    SK_OK(sk_attention_plan(&a, &L, ws, wsb, NULL));
    float ms[BENCH_MAX_REPS];
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int r = 0; r < WARMUP + o->reps; ++r) {
        CUDA_OK(cudaEventRecord(e0, NULL));
        SK_OK(sk_attention_run(&a, &L, q, k, v, out, lse, ws, wsb, NULL));
        CUDA_OK(cudaEventRecord(e1, NULL));
        CUDA_OK(cudaEventSynchronize(e1));
        if (r >= WARMUP) CUDA_OK(cudaEventElapsedTime(&ms[r - WARMUP], e0, e1));
    }
    if (o_host != NULL) {
        CUDA_OK(cudaMemcpy(o_host, out, (size_t)nq * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lse_host, lse, (size_t)(HQ * o->seq) * 4, cudaMemcpyDeviceToHost));
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(ws),
        cudaFree(pat);
    cudaFree(L.row_offsets), cudaFree(L.col_indices);
    qsort(ms, (size_t)o->reps, sizeof ms[0], bench_cmp_float);
    return ms[o->reps / 2];
}

static float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* --check: the shards' O / LSE against the single-GPU ones. */
static int check_shards(const opts *o, const sk_cp_desc *d, rank_ctx *ctx, const uint16_t *o_ref,
                        const float *lse_ref, double vmax, double *worst) {
    int bad = 0;
    *worst = 0;
    for (int r = 0; r < o->ranks; ++r) {
        int64_t tok, starts[2], lengths[2], at = 0;
        int32_t chunks;
        sk_cp_shard(d, r, BLOCK, &tok, &chunks, starts, lengths);
        const uint16_t *og = ctx[r].o_host;
        for (int c = 0; c < chunks; at += lengths[c], ++c)
            for (int64_t t = 0; t < lengths[c]; ++t)
                for (int64_t h = 0; h < HQ; ++h) {
                    const double lr = lse_ref[h * o->seq + starts[c] + t];
                    const double lg = ctx[r].lse_host[h * tok + at + t];
                    if (!(fabs(lg - lr) <= 1e-4 * (1 + fabs(lr)))) ++bad;
                    for (int64_t e = 0; e < DIM; ++e) {
                        const double rv = bf16_to_f32(o_ref[((starts[c] + t) * HQ + h) * DIM + e]);
                        const double gv = bf16_to_f32(og[((at + t) * HQ + h) * DIM + e]);
                        const double tol = 0x1p-8 * (2 * fabs(rv) + 4 * vmax) + 1e-5;
                        const double ratio = fabs(gv - rv) / tol;
                        if (!(ratio <= 1)) ++bad;
                        if (ratio > *worst) *worst = ratio;
                    }
                }
    }
    return bad;
}

static void usage(void) {
    fprintf(stderr, "usage: cp_speed [--seq N] [--ranks R] [--sharding contiguous|zigzag] "
                    "[--single] [--check] [--graph] [--reps N] [--seed N] "
                    "[--balance off|on|both] [--reserve N[,N...]] [--cost L,R,T]\n");
    exit(BENCH_ERROR_EXIT);
}

static void parse_reserves(opts *o, const char *list) {
    o->reserves = 0;
    for (const char *p = list; *p != '\0';) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p || o->reserves == MAX_RESERVES || v < 0 || v > 1024) usage();
        o->reserve[o->reserves++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') usage();
    }
    if (o->reserves == 0) usage();
}

static void parse_cost(opts *o, const char *text) {
    if (sscanf(text, "%lf,%lf,%lf", &o->cost.local_block, &o->cost.remote_block, &o->cost.tile) !=
        3)
        usage();
}

/* One variant (chunk starts or NULL, the reserve): its plan, every rank's
 * run, one JSON line. Returns the --check verdict (0 good). */
static int run_variant(const opts *o, const sk_bsr *L, sk_cp_desc d, const int32_t *starts,
                       int reserve, const void *pattern, const void *const qkv[3],
                       const uint16_t *o_ref, const float *lse_ref, float single_ms) {
    d.chunk_starts = starts;
    d.reserve_sms = reserve;
    size_t plan_bytes = 0;
    SK_OK(sk_cp_plan_size(&d, L, &plan_bytes));
    void *plan = malloc(plan_bytes);
    SK_OK(sk_cp_plan(&d, L, plan, plan_bytes));
    double pred[MAX_RANKS];
    int64_t local[MAX_RANKS], remote[MAX_RANKS], tiles[MAX_RANKS];
    SK_OK(sk_cp_predict(&d, L, &o->cost, pred, local, remote, tiles));

    nccl_id id;
    if (nccl_get_unique_id(&id) != 0) {
        fprintf(stderr, "cp_speed: ncclGetUniqueId failed\n");
        exit(BENCH_ERROR_EXIT);
    }
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)o->ranks);
    rank_ctx ctx[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    memset(ctx, 0, sizeof ctx);
    for (int r = 0; r < o->ranks; ++r) {
        ctx[r] = (rank_ctx){.o = o,
                            .base = &d,
                            .plan = plan,
                            .plan_bytes = plan_bytes,
                            .id = &id,
                            .barrier = &barrier,
                            .pattern_host = pattern,
                            .rank = r};
        for (int t = 0; t < 3; ++t) ctx[r].qkv_host[t] = qkv[t];
        pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    }
    for (int r = 0; r < o->ranks; ++r) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&barrier);

    /* A run's time is its slowest rank's. */
    float run_ms[BENCH_MAX_REPS];
    for (int i = 0; i < o->reps; ++i) {
        run_ms[i] = 0;
        for (int r = 0; r < o->ranks; ++r) run_ms[i] = fmaxf(run_ms[i], ctx[r].ms[i]);
    }
    qsort(run_ms, (size_t)o->reps, sizeof run_ms[0], bench_cmp_float);
    const double flops = 4.0 * DIM * BLOCK * BLOCK * (double)L->nnz * (HQ / HKV);
    const int32_t C = o->sharding == SK_CP_SHARDING_ZIGZAG ? 2 * o->ranks : o->ranks;
    const int64_t nb = (o->seq + BLOCK - 1) / BLOCK;
    printf("{\"seq\": %lld, \"ranks\": %d, \"graph\": %d, \"sharding\": \"%s\", \"layout\": "
           "\"causal sink + window 4096 + 16 random past blocks per row, per KV head\", "
           "\"heads\": \"%d/%d\", \"dim\": %d, \"nnz\": %d, \"tflop\": %.3f, "
           "\"balance\": %d, \"reserve_sms\": %d, \"cost_ns\": [%g, %g, %g], "
           "\"chunk_starts\": [",
           (long long)o->seq, o->ranks, o->graph,
           o->sharding == SK_CP_SHARDING_ZIGZAG ? "zigzag" : "contiguous", HQ, HKV, DIM,
           (int)L->nnz, flops * 1e-12, starts != NULL, reserve, o->cost.local_block,
           o->cost.remote_block, o->cost.tile);
    for (int32_t c = 0; c <= C; ++c)
        printf("%s%lld", c ? ", " : "", (long long)(starts ? starts[c] : (int64_t)c * nb / C));
    printf("], \"sharded_ms\": %.3f, \"sharded_ms_min\": %.3f, \"sharded_tflops\": %.1f",
           run_ms[o->reps / 2], run_ms[0], flops / (run_ms[o->reps / 2] * 1e-3) * 1e-12);
    if (single_ms > 0)
        printf(", \"single_ms\": %.3f, \"single_tflops\": %.1f, \"speedup\": %.3f", single_ms,
               flops / (single_ms * 1e-3) * 1e-12, single_ms / run_ms[o->reps / 2]);
    printf(", \"ranks_detail\": [");
    for (int r = 0; r < o->ranks; ++r) {
        int64_t sent = 0, recv = 0, units = 0, b = 0, u = 0;
        for (int p = 0; p < o->ranks; ++p) {
            SK_OK(sk_cp_plan_bytes(plan, plan_bytes, r, p, &b, &u));
            sent += b;
            units += u;
            SK_OK(sk_cp_plan_bytes(plan, plan_bytes, p, r, &b, NULL));
            recv += b;
        }
        float m[BENCH_MAX_REPS];
        memcpy(m, ctx[r].ms, sizeof(float) * (size_t)o->reps);
        qsort(m, (size_t)o->reps, sizeof m[0], bench_cmp_float);
        printf("%s{\"rank\": %d, \"tokens\": %lld, \"ms\": %.3f, \"predicted_ms\": %.3f, "
               "\"local_blocks\": %lld, \"remote_blocks\": %lld, \"tiles\": %lld, "
               "\"plan_send_bytes\": %lld, \"plan_recv_bytes\": %lld, \"units_sent\": %lld, "
               "\"comm_bytes_sent\": %lld}",
               r ? ", " : "", r, (long long)ctx[r].tokens, m[o->reps / 2], pred[r] * 1e-6,
               (long long)local[r], (long long)remote[r], (long long)tiles[r], (long long)sent,
               (long long)recv, (long long)units,
               (long long)(ctx[r].bytes_sent / (WARMUP + o->reps)));
    }
    printf("]");
    int rc = 0;
    if (o->check) {
        double worst = 0;
        const int bad = check_shards(o, &d, ctx, o_ref, lse_ref, 2.0, &worst);
        printf(", \"check\": {\"bad\": %d, \"worst_of_tolerance\": %.4f}", bad, worst);
        rc = bad != 0;
    }
    printf("}\n");
    fflush(stdout);
    for (int r = 0; r < o->ranks; ++r) free(ctx[r].o_host), free(ctx[r].lse_host);
    free(plan);
    return rc;
}

int main(int argc, char **argv) {
    opts o = {1 << 20, 2, 10, 0, 0, 0, SK_CP_SHARDING_CONTIGUOUS, 33, 0, 0, 1, {16}, {0, 0, 0}};
    SK_OK(sk_cp_cost_default(&o.cost));
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--seq") && i + 1 < argc)
            o.seq = atoll(argv[++i]);
        else if (!strcmp(a, "--ranks") && i + 1 < argc)
            o.ranks = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && i + 1 < argc)
            o.seed = (uint64_t)atoll(argv[++i]);
        else if (!strcmp(a, "--sharding") && i + 1 < argc)
            o.sharding =
                !strcmp(argv[++i], "zigzag") ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS;
        else if (!strcmp(a, "--balance") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "off"))
                o.balance_from = o.balance_to = 0;
            else if (!strcmp(m, "on"))
                o.balance_from = o.balance_to = 1;
            else if (!strcmp(m, "both"))
                o.balance_from = 0, o.balance_to = 1;
            else
                usage();
        } else if (!strcmp(a, "--reserve") && i + 1 < argc)
            parse_reserves(&o, argv[++i]);
        else if (!strcmp(a, "--cost") && i + 1 < argc)
            parse_cost(&o, argv[++i]);
        else if (!strcmp(a, "--single"))
            o.single = 1;
        else if (!strcmp(a, "--graph"))
            o.graph = 1;
        else if (!strcmp(a, "--check"))
            o.check = o.single = 1;
        else
            usage();
    }
    if (o.ranks < 1 || o.ranks > MAX_RANKS || o.reps < 1 || o.reps > BENCH_MAX_REPS ||
        o.seq < BLOCK * 2 * o.ranks)
        usage();
    nccl_open();
    sk_layout_t owned = make_layout(&o);
    sk_bsr L;
    sk_layout_view(owned, &L);
    sk_cp_desc d;
    SK_OK(sk_cp_desc_init(&d, sizeof d));
    d.ranks = o.ranks;
    d.sharding = o.sharding;
    d.dtype = SK_DTYPE_BF16;
    d.batch = 1;
    d.seq = o.seq;
    d.heads_q = HQ;
    d.heads_kv = HKV;
    d.head_dim = DIM;
    d.mask = SK_MASK_CAUSAL;
    int32_t starts[2 * MAX_RANKS + 1];
    if (o.balance_to) SK_OK(sk_cp_balance(&d, &L, &o.cost, starts, 2 * MAX_RANKS + 1));

    uint16_t *pattern = malloc((size_t)PATTERN * 2);
    uint64_t s = o.seed;
    for (int64_t i = 0; i < PATTERN; ++i) { /* bf16 of a uniform in [-2, 2) */
        s = mix(s + 1);
        const float f = (float)((double)(s >> 11) * 0x1p-53 * 4.0 - 2.0);
        uint32_t u;
        memcpy(&u, &f, 4);
        pattern[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    /* --check: the global inputs, whole, from the pattern's generator. */
    void *qkv[3] = {NULL, NULL, NULL};
    uint16_t *o_ref = NULL;
    float *lse_ref = NULL;
    if (o.check) {
        const int64_t n[3] = {o.seq * HQ * DIM, o.seq * HKV * DIM, o.seq * HKV * DIM};
        for (int t = 0; t < 3; ++t) {
            qkv[t] = malloc((size_t)n[t] * 2);
            for (int64_t i = 0; i < n[t]; ++i)
                ((uint16_t *)qkv[t])[i] = pattern[(i * 7 + t) % PATTERN];
        }
        o_ref = malloc((size_t)n[0] * 2);
        lse_ref = malloc((size_t)(HQ * o.seq) * 4);
    }
    float single_ms = -1;
    if (o.single)
        single_ms =
            single_gpu(&o, &L, pattern, o.check ? (const void *const *)qkv : NULL, o_ref, lse_ref);

    int rc = 0;
    for (int b = o.balance_from; b <= o.balance_to; ++b)
        for (int v = 0; v < o.reserves; ++v)
            rc |= run_variant(&o, &L, d, b ? starts : NULL, o.reserve[v], pattern,
                              (const void *const *)qkv, o_ref, lse_ref, single_ms);
    for (int t = 0; t < 3; ++t) free(qkv[t]);
    free(o_ref), free(lse_ref), free(pattern);
    sk_layout_destroy(owned);
    return rc;
}
