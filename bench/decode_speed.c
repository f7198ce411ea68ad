/*
 * decode_speed.c - timing of the decode attention (sparsek.h "Decode") on
 * the dense rows of issue 31's speed table: every page selected (layout
 * NULL), B x context in {(1, 128K), (8, 128K), (32, 32K), (128, 4K)},
 * GQA 32/8 and 32/4, pages of 64 tokens, D 128, bf16, q_len 1 and 4.
 *
 * Build: make build/decode_speed
 * Run:   build/decode_speed [--reps N] [--commit HASH] [--backend cuda|sm80|sm90]
 *                           [--splits N[,N...]] [--quick] [--case B,CONTEXT,HKV,QLEN]
 *                           [--topk K] [--rule 1|2|both]
 *
 * Per case: the caches are [num_pages, 64, Hkv, 128] bf16 with num_pages =
 * B x context / 64, every sequence's pages a random permutation of its own
 * (no sharing), all filled with one finite value (0x3c3c, about 0.0115) so
 * that the result is known: O = that value everywhere, a check of every
 * output element before timing (any unread or misread page shows). Every
 * case's KV (>= 268 MB) is far beyond L2. Timed with CUDA events: 3
 * warm-up runs, then the median and minimum of N (default 20) runs of
 * sk_decode_run, each from an idle stream (so the host's enqueue time up
 * to the first kernel is included, as for the peers' Python calls).
 * KV bytes read = B x context x Hkv x D x 2 bytes x 2 (K and V); TB/s =
 * bytes / median time. One JSON object per case on stdout.
 *
 * --topk K (issue 31's sparse row): instead of every page, a decode layout
 * with blocks of 64 keys (one page each), per (sequence, KV head) the sink
 * block 0, K distinct random blocks and the 2 most recent blocks (a
 * Quest-style selection's shape; which blocks does not change the bytes).
 * KV bytes read = the selected blocks' keys and values; the check holds as
 * for the dense layout (equal keys and values wherever read).
 *
 * The A/B switches, measured in one process on the same buffers (one JSON
 * line per variant, each checked before it is timed): --rule (the split
 * rule, core/decode.h; default both),
 * --splits (a list of forced counts instead of the rule: the sweep). Each
 * line also holds loop_us (20 runs enqueued back to back, per run: the
 * host's enqueue hidden behind the GPU, as in a loop or a CUDA graph) and
 * host_us (the median CPU time of one sk_decode_run call).
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/decode.h"
#include "sparsek.h"

#include "bench_check.h"

enum { MAX_REPS = 1000, PAGE = 64, DIM = 128, HQ = 32, MAX_SWEEP = 16, LOOP = 20 };

typedef struct bench_opts {
    int reps, quick, topk;
    int splits[MAX_SWEEP], n_splits; /* --splits: forced counts (0: the rule) */
    int rules[2], n_rules;           /* --rule */
    sk_backend backend;
    const char *commit;
    int64_t only[4]; /* --case B,CONTEXT,HKV,QLEN; only[0] = 0: every case */
} bench_opts;

static int parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->reps = 20;
    o->backend = SK_BACKEND_CUDA;
    o->commit = "unknown";
    o->n_splits = 1;
    o->rules[0] = 2, o->rules[1] = 1, o->n_rules = 2;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            o->quick = 1;
            continue;
        }
        if (v == NULL) return -1;
        ++i;
        if (strcmp(a, "--reps") == 0)
            o->reps = atoi(v);
        else if (strcmp(a, "--commit") == 0)
            o->commit = v;
        else if (strcmp(a, "--splits") == 0) {
            o->n_splits = 0;
            for (const char *c = v; c != NULL && *c != 0 && o->n_splits < MAX_SWEEP;) {
                o->splits[o->n_splits++] = atoi(c);
                c = strchr(c, ',');
                if (c != NULL) ++c;
            }
            if (o->n_splits == 0) return -1;
        } else if (strcmp(a, "--rule") == 0) {
            o->n_rules = strcmp(v, "both") == 0 ? 2 : 1;
            o->rules[0] = strcmp(v, "1") == 0 ? 1 : 2;
        }
        else if (strcmp(a, "--topk") == 0)
            o->topk = atoi(v);
        else if (strcmp(a, "--backend") == 0)
            o->backend = strcmp(v, "sm80") == 0   ? SK_BACKEND_CUDA_SM80
                         : strcmp(v, "sm90") == 0 ? SK_BACKEND_CUDA_SM90
                                                  : SK_BACKEND_CUDA;
        else if (strcmp(a, "--case") == 0) {
            long long b, c, h, q;
            if (sscanf(v, "%lld,%lld,%lld,%lld", &b, &c, &h, &q) != 4) return -1;
            o->only[0] = b, o->only[1] = c, o->only[2] = h, o->only[3] = q;
        } else
            return -1;
    }
    if (o->reps < 1 || o->reps > MAX_REPS) o->reps = 20;
    return 0;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* A per-sequence random permutation of its own pages (seeded LCG). */
static int32_t *make_table(int64_t batch, int64_t pages_per_seq) {
    int32_t *t = (int32_t *)malloc((size_t)(batch * pages_per_seq) * sizeof(int32_t));
    if (t == NULL) return NULL;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t b = 0; b < batch; ++b) {
        int32_t *row = t + b * pages_per_seq;
        for (int64_t i = 0; i < pages_per_seq; ++i) row[i] = (int32_t)(b * pages_per_seq + i);
        for (int64_t i = pages_per_seq - 1; i > 0; --i) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const int64_t j = (int64_t)((s >> 33) % (uint64_t)(i + 1));
            const int32_t x = row[i];
            row[i] = row[j];
            row[j] = x;
        }
    }
    return t;
}

/* The --topk layout on the device: per (sequence, KV head) row, block 0,
 * topk distinct random blocks of 1 .. nb - 3 and blocks nb - 2, nb - 1,
 * sorted; *selected = nnz. NULL when topk is 0. */
static sk_bsr *make_topk_layout(int topk, int64_t batch, int64_t hkv, int64_t q_len,
                                int64_t context, int64_t *selected) {
    static sk_bsr lay;
    const int64_t nb = context / PAGE, rows = batch * hkv;
    const int64_t per_row = topk + 3 < nb ? topk + 3 : nb;
    int32_t *off = (int32_t *)malloc((size_t)(rows + 1) * 4);
    int32_t *idx = (int32_t *)malloc((size_t)(rows * per_row) * 4);
    unsigned char *mark = (unsigned char *)malloc((size_t)nb);
    if (!off || !idx || !mark) {
        fprintf(stderr, "no host memory\n");
        exit(1);
    }
    uint64_t st = 0x2545F4914F6CDD1Dull;
    off[0] = 0;
    for (int64_t r = 0; r < rows; ++r) {
        memset(mark, 0, (size_t)nb);
        mark[0] = 1;
        if (nb > 1) mark[nb - 1] = 1;
        if (nb > 2) mark[nb - 2] = 1;
        for (int64_t have = nb < 3 ? nb : 3; have < per_row;) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            const int64_t c = 1 + (int64_t)((st >> 33) % (uint64_t)(nb - 3));
            if (!mark[c]) mark[c] = 1, ++have;
        }
        int32_t n = off[r];
        for (int64_t c = 0; c < nb; ++c)
            if (mark[c]) idx[n++] = (int32_t)c;
        off[r + 1] = n;
    }
    memset(&lay, 0, sizeof lay);
    lay.grid.rows = q_len;
    lay.grid.cols = context;
    lay.grid.block_rows = 64;
    lay.grid.block_cols = PAGE;
    lay.grid.batch = (int32_t)batch;
    lay.grid.heads = (int32_t)hkv;
    lay.nnz = off[rows];
    CUDA_OK(cudaMalloc((void **)&lay.row_offsets, (size_t)(rows + 1) * 4));
    CUDA_OK(cudaMalloc((void **)&lay.col_indices, (size_t)lay.nnz * 4));
    CUDA_OK(cudaMemcpy(lay.row_offsets, off, (size_t)(rows + 1) * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(lay.col_indices, idx, (size_t)lay.nnz * 4, cudaMemcpyHostToDevice));
    *selected = lay.nnz;
    free(off), free(idx), free(mark);
    return &lay;
}

/* One case's device buffers, shared by its variants. */
typedef struct bench_bufs {
    void *k, *v, *q, *out, *ws;
    float *lse;
    int32_t *lens, *table;
    size_t q_bytes, ws_cap;
    uint16_t *host_o;
} bench_bufs;

/* One variant (rule, forced splits) of a case: checked, timed, one JSON
 * line. */
static void run_variant(const bench_opts *o, sk_decode_desc d, const sk_bsr *lay,
                        bench_bufs *m, int64_t selected, int rule, int forced) {
    sk_decode_set_split_rule(rule);
    d.num_splits = forced;
    int32_t splits = 0;
    size_t ws_bytes = 0;
    SK_OK(sk_decode_splits(&d, lay, &splits));
    SK_OK(sk_decode_workspace_size(&d, lay, &ws_bytes));
    if (ws_bytes > m->ws_cap) {
        cudaFree(m->ws);
        CUDA_OK(cudaMalloc(&m->ws, ws_bytes));
        m->ws_cap = ws_bytes;
    }
    /* Check: every O element is the cached value (a softmax of equal
     * scores over equal values); the workspace poisoned first (the run
     * must write every partial it merges). */
    if (m->ws_cap > 0) CUDA_OK(cudaMemset(m->ws, 0xff, m->ws_cap));
    CUDA_OK(cudaMemset(m->out, 0xff, m->q_bytes)); /* NaN */
    SK_OK(sk_decode(&d, lay, m->lens, m->table, m->q, m->k, m->v, m->out, m->lse, m->ws, ws_bytes,
                    NULL));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(m->host_o, m->out, m->q_bytes, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (size_t i = 0; i < m->q_bytes / 2; ++i) bad += m->host_o[i] != 0x3c3c;

    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    float ms[MAX_REPS];
    double host[MAX_REPS];
    for (int i = 0; i < 3; ++i)
        SK_OK(sk_decode_run(&d, lay, m->lens, m->table, m->q, m->k, m->v, m->out, m->lse, m->ws,
                            ws_bytes, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < o->reps; ++i) {
        CUDA_OK(cudaEventRecord(e0, NULL));
        const double t0 = now_us();
        SK_OK(sk_decode_run(&d, lay, m->lens, m->table, m->q, m->k, m->v, m->out, m->lse, m->ws,
                            ws_bytes, NULL));
        host[i] = now_us() - t0;
        CUDA_OK(cudaEventRecord(e1, NULL));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, (size_t)o->reps, sizeof(float), cmp_float);
    const double median_us = 1e3 * (o->reps % 2 ? ms[o->reps / 2]
                                                : 0.5 * (ms[o->reps / 2 - 1] + ms[o->reps / 2]));
    const double min_us = 1e3 * ms[0];
    float host_f[MAX_REPS];
    for (int i = 0; i < o->reps; ++i) host_f[i] = (float)host[i];
    qsort(host_f, (size_t)o->reps, sizeof(float), cmp_float);
    const double host_us = host_f[o->reps / 2];
    /* Back to back: the GPU's time per run once the host runs ahead. */
    float loop_ms = 0.f;
    CUDA_OK(cudaMemset(m->out, 0xff, m->q_bytes));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaEventRecord(e0, NULL));
    for (int i = 0; i < LOOP; ++i)
        SK_OK(sk_decode_run(&d, lay, m->lens, m->table, m->q, m->k, m->v, m->out, m->lse, m->ws,
                            ws_bytes, NULL));
    CUDA_OK(cudaEventRecord(e1, NULL));
    CUDA_OK(cudaEventSynchronize(e1));
    CUDA_OK(cudaEventElapsedTime(&loop_ms, e0, e1));
    const double loop_us = 1e3 * loop_ms / LOOP;
    /* The runs after the one plan: one more check. */
    CUDA_OK(cudaMemcpy(m->host_o, m->out, m->q_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < m->q_bytes / 2; ++i) bad += m->host_o[i] != 0x3c3c;
    const char *check = bad == 0 ? "ok" : "FAILED";
    if (bad != 0) fprintf(stderr, "check: %lld O elements differ\n", (long long)bad);

    const int64_t batch = d.batch, context = d.max_seqlen_k, hkv = d.heads_kv, q_len = d.q_len;
    const double keys = lay != NULL ? (double)selected * PAGE : (double)batch * context * hkv;
    const double kv_bytes = keys * DIM * 2.0 * 2.0;
    sk_device_info info;
    memset(&info, 0, sizeof info);
    sk_device_get_info(0, &info);
    printf("{\"name\": \"decode_b%lld_ctx%lld_gqa%d_%lld_q%lld\", \"commit\": \"%s\", \"gpu\": "
           "\"%s\", \"cc\": \"%d.%d\", \"backend\": \"%s\", \"batch\": %lld, \"context\": %lld, "
           "\"heads_q\": %d, \"heads_kv\": %lld, \"q_len\": %lld, \"page_size\": %d, "
           "\"head_dim\": %d, \"dtype\": \"bf16\", \"layout\": \"%s\", \"topk\": %d, "
           "\"selected_blocks\": %lld, \"rule\": %d, \"forced_splits\": %d, "
           "\"splits\": %d, \"workspace_bytes\": %zu, \"median_us\": %.2f, \"min_us\": %.2f, "
           "\"loop_us\": %.2f, \"host_us\": %.2f, \"kv_bytes\": %.0f, \"tb_per_s\": %.3f, "
           "\"loop_tb_per_s\": %.3f, \"check\": \"%s\"}\n",
           (long long)batch, (long long)context, HQ, (long long)hkv, (long long)q_len, o->commit,
           info.name, (int)info.cc_major, (int)info.cc_minor,
           o->backend == SK_BACKEND_CUDA_SM80   ? "sm80"
           : o->backend == SK_BACKEND_CUDA_SM90 ? "sm90"
                                                : "cuda",
           (long long)batch, (long long)context, HQ, (long long)hkv, (long long)q_len, PAGE, DIM,
           lay != NULL ? "topk" : "dense", o->topk, (long long)selected, rule, forced, (int)splits, ws_bytes, median_us, min_us, loop_us, host_us, kv_bytes,
           kv_bytes / (median_us * 1e-6) / 1e12, kv_bytes / (loop_us * 1e-6) / 1e12, check);
    fflush(stdout);
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
}

static void run_case(const bench_opts *o, int64_t batch, int64_t context, int64_t hkv,
                     int64_t q_len) {
    sk_decode_desc d;
    SK_OK(sk_decode_desc_init(&d, sizeof d));
    d.backend = o->backend;
    d.dtype = SK_DTYPE_BF16;
    d.batch = batch;
    d.q_len = q_len;
    d.heads_q = HQ;
    d.heads_kv = hkv;
    d.head_dim = DIM;
    d.max_seqlen_k = context;
    d.page_size = PAGE;
    d.max_pages = (int32_t)(context / PAGE);
    d.num_pages = batch * d.max_pages;
    int64_t selected = 0;
    const sk_bsr *lay =
        o->topk > 0 ? make_topk_layout(o->topk, batch, hkv, q_len, context, &selected) : NULL;

    bench_bufs m;
    memset(&m, 0, sizeof m);
    const size_t cache_bytes = (size_t)d.num_pages * PAGE * (size_t)hkv * DIM * 2;
    m.q_bytes = (size_t)(batch * q_len * HQ * DIM) * 2;
    CUDA_OK(cudaMalloc(&m.k, cache_bytes));
    CUDA_OK(cudaMalloc(&m.v, cache_bytes));
    CUDA_OK(cudaMalloc(&m.q, m.q_bytes));
    CUDA_OK(cudaMalloc(&m.out, m.q_bytes));
    CUDA_OK(cudaMalloc((void **)&m.lse, (size_t)(batch * HQ * q_len) * 4));
    CUDA_OK(cudaMalloc((void **)&m.lens, (size_t)batch * 4));
    CUDA_OK(cudaMalloc((void **)&m.table, (size_t)(batch * d.max_pages) * 4));
    CUDA_OK(cudaMemset(m.k, 0x3c, cache_bytes));
    CUDA_OK(cudaMemset(m.v, 0x3c, cache_bytes));
    CUDA_OK(cudaMemset(m.q, 0x3c, m.q_bytes));
    int32_t *host_table = make_table(batch, d.max_pages);
    int32_t *host_lens = (int32_t *)malloc((size_t)batch * 4);
    m.host_o = (uint16_t *)malloc(m.q_bytes);
    if (!host_table || !host_lens || !m.host_o) {
        fprintf(stderr, "no host memory\n");
        exit(1);
    }
    for (int64_t b = 0; b < batch; ++b) host_lens[b] = (int32_t)context;
    CUDA_OK(cudaMemcpy(m.lens, host_lens, (size_t)batch * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(m.table, host_table, (size_t)(batch * d.max_pages) * 4,
                       cudaMemcpyHostToDevice));

    for (int si = 0; si < o->n_splits; ++si)
        for (int ri = 0; ri < (o->splits[si] == 0 ? o->n_rules : 1); ++ri)
            run_variant(o, d, lay, &m, selected, o->splits[si] == 0 ? o->rules[ri] : 2,
                        o->splits[si]);

    cudaFree(m.k), cudaFree(m.v), cudaFree(m.q), cudaFree(m.out), cudaFree(m.lse);
    cudaFree(m.lens), cudaFree(m.table), cudaFree(m.ws);
    if (lay != NULL) cudaFree(lay->row_offsets), cudaFree(lay->col_indices);
    free(host_table), free(host_lens), free(m.host_o);
}

int main(int argc, char **argv) {
    bench_opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: decode_speed [--reps N] [--commit HASH] [--backend cuda|sm80|sm90] "
                        "[--splits N[,N...]] [--quick] [--case B,CONTEXT,HKV,QLEN] [--topk K] "
                        "[--rule 1|2|both]\n");
        return 2;
    }
    if (o.only[0] != 0) {
        run_case(&o, o.only[0], o.only[1], o.only[2], o.only[3]);
        return 0;
    }
    static const int64_t shapes[4][2] = {{1, 131072}, {8, 131072}, {32, 32768}, {128, 4096}};
    static const int64_t hkvs[2] = {8, 4}, qlens[2] = {1, 4};
    for (int s = 0; s < 4; ++s)
        for (int h = 0; h < 2; ++h)
            for (int q = 0; q < 2; ++q)
                run_case(&o, shapes[s][0], o.quick ? shapes[s][1] / 16 : shapes[s][1], hkvs[h],
                         qlens[q]);
    return 0;
}
