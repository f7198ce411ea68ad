/*
 * varlen_speed.c - timing of the CUDA varlen and paged-KV forwards against
 * the contiguous and fixed-batch forwards of the same work: the speed rows
 * of issue 30 (docs/perf/varlen_paged.md).
 *
 * Build (after `make -j2 all`):  make build/varlen_speed
 * Run:
 *   build/varlen_speed [--case all|varlen|paged|chunked] [--seq 65536] [--reps 10]
 *                      [--backend cuda|sm80|sm90] [--seed 30] [--shuffle global|local]
 * Cases (H32 D128 bf16, 128 x 128 blocks, one layout slice for all heads):
 *   varlen   64 sequences, lengths uniform in [512, 16384] (seeded), causal
 *            window 2048 (left 2047); against the fixed batch B = 64 of the
 *            mean length, same window, on --backend and on the portable
 *            kernel (fixed_batch_sm80: the portable family's own ratio;
 *            on an H100, --backend cuda / sm90 run the Hopper kernels).
 *   paged    one sequence of --seq tokens, causal window 2048 (the "long
 *            window" case); paged with page_size 128, 64, 32, 16 (shuffled
 *            pages) against the same call with contiguous K/V (varlen) and
 *            the fixed-batch forward.
 *   chunked  8 sequences of 2048 new tokens over 32768 cached (len_k =
 *            34816), causal, sinks 128 + window 4096; paged 16 and 128
 *            against contiguous.
 * --shuffle: the paged forms' page order. global (the default): one random
 *   permutation of the whole cache, so the pages of a 128-key block lie in
 *   different 2 MiB regions (as many GPU-TLB entries as pages); local: pages
 *   permuted only within aligned runs of 2 MiB of cache (a block's pages in
 *   one region, as contiguous K/V), the same box count and table reads: the
 *   two ratios apart are what the TLB reach costs (docs/perf/varlen_paged.md,
 *   "A third V stage for pages").
 * Timing: CUDA events around each of `reps` runs after the plan (2 warm-up
 * runs), median and minimum; the plan is timed on its own. TFLOPS count 4 D
 * bq bk per selected block (the layout's entries times the query heads):
 * the selected blocks only, partial tail blocks counted whole, for every
 * form alike. A sample of O must be finite (exit 1 otherwise). One JSON
 * object on stdout.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsek.h"

#define BENCH_ERROR_EXIT 2 /* 1 is a failed result check */
#include "bench_check.h"
#include "host_data.h"
#include "bench_device.h"

enum { WARMUP = 2, PATTERN = 1 << 24, SAMPLE = 1 << 20, MAX_REPS = 100, BLOCK = 128 };
enum { HEADS = 32, DIM = 128, MAX_B = 64 };

typedef struct opts {
    const char *which;
    int64_t seq;
    int reps;
    uint64_t seed;
    sk_backend backend;
    int local_shuffle; /* --shuffle local */
} opts;

/* One timed form: B sequences (lengths host), a layout pattern, and the K/V
 * form (page_size 0: contiguous varlen; -1: the fixed batch, equal lengths). */
typedef struct spec {
    int32_t batch;
    int32_t lq[MAX_B], lk[MAX_B];
    int64_t left;          /* window: keys p - left .. p */
    int64_t sinks, window; /* sinks > 0: sinks + window instead */
    int32_t page_size;
    int sm80; /* force SK_BACKEND_CUDA_SM80 (the fixed batch's portable kernel) */
} spec;

typedef struct result {
    float ms, min_ms, plan_ms;
    int64_t blocks;
    int64_t non_finite;
} result;

static opts g_opt;
static void *g_pattern;
static int g_failed;

static int parse(int argc, char **argv, opts *o) {
    o->which = "all", o->seq = 65536, o->reps = 10, o->seed = 30;
    o->backend = SK_BACKEND_CUDA;
    o->local_shuffle = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--case") == 0)
            o->which = v;
        else if (strcmp(a, "--seq") == 0)
            o->seq = atoll(v);
        else if (strcmp(a, "--reps") == 0)
            o->reps = atoi(v);
        else if (strcmp(a, "--seed") == 0)
            o->seed = (uint64_t)atoll(v);
        else if (strcmp(a, "--shuffle") == 0 && (strcmp(v, "global") == 0 || strcmp(v, "local") == 0))
            o->local_shuffle = strcmp(v, "local") == 0;
        else if (strcmp(a, "--backend") == 0)
            o->backend = strcmp(v, "sm80") == 0   ? SK_BACKEND_CUDA_SM80
                         : strcmp(v, "sm90") == 0 ? SK_BACKEND_CUDA_SM90
                                                  : SK_BACKEND_CUDA;
        else
            return -1;
    }
    if (argc % 2 == 0) return -1;
    if (o->reps < 1 || o->reps > MAX_REPS) o->reps = 10;
    return o->seq >= BLOCK ? 0 : -1;
}

/* n elements of 2 bytes: the pattern from element `shift` on, repeated. */
static void fill(void *dst, int64_t n, int64_t shift) {
    const int64_t period = PATTERN - shift;
    for (int64_t off = 0; off < n; off += period) {
        const int64_t len = n - off < period ? n - off : period;
        CUDA_OK(cudaMemcpy((char *)dst + off * 2, (const char *)g_pattern + shift * 2,
                           (size_t)len * 2, cudaMemcpyDeviceToDevice));
    }
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* What one timed call needs. */
typedef struct call_args {
    const spec *s;
    const void *desc; /* sk_attention_{varlen,paged,}_desc */
    const sk_bsr *layout;
    const int32_t *cu_q, *cu_k, *lens_k, *table;
    void *q, *k, *v, *o, *ws;
    size_t ws_bytes;
} call_args;

static void call(const call_args *a, int plan) {
    if (a->s->page_size < 0) {
        const sk_attention_desc *d = a->desc;
        if (plan)
            SK_OK(sk_attention_plan(d, a->layout, a->ws, a->ws_bytes, NULL));
        else
            SK_OK(sk_attention_run(d, a->layout, a->q, a->k, a->v, a->o, NULL, a->ws, a->ws_bytes,
                                   NULL));
    } else if (a->s->page_size == 0) {
        const sk_attention_varlen_desc *d = a->desc;
        if (plan)
            SK_OK(
                sk_attention_varlen_plan(d, a->layout, a->cu_q, a->cu_k, a->ws, a->ws_bytes, NULL));
        else
            SK_OK(sk_attention_varlen_run(d, a->layout, a->cu_q, a->cu_k, a->q, a->k, a->v, a->o,
                                          NULL, a->ws, a->ws_bytes, NULL));
    } else {
        const sk_attention_paged_desc *d = a->desc;
        if (plan)
            SK_OK(sk_attention_paged_plan(d, a->layout, a->cu_q, a->lens_k, a->table, a->ws,
                                          a->ws_bytes, NULL));
        else
            SK_OK(sk_attention_paged_run(d, a->layout, a->cu_q, a->lens_k, a->table, a->q, a->k,
                                         a->v, a->o, NULL, a->ws, a->ws_bytes, NULL));
    }
}

static void time_calls(const call_args *a, int plan, float *median, float *best) {
    float ms[MAX_REPS];
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int r = 0; r < WARMUP; ++r) call(a, plan);
    for (int r = 0; r < g_opt.reps; ++r) {
        CUDA_OK(cudaEventRecord(e0, NULL));
        call(a, plan);
        CUDA_OK(cudaEventRecord(e1, NULL));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, (size_t)g_opt.reps, sizeof ms[0], cmp_float);
    *median = ms[g_opt.reps / 2];
    *best = ms[0];
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
}

/* The host layout of s (varlen grid, or the fixed batch's one slice). */
static sk_layout_t make_layout(const spec *s, const int32_t *cu_q, const int32_t *cu_k) {
    sk_layout_t lay;
    if (s->page_size < 0) {
        const sk_grid g = {s->lq[0], s->lk[0], BLOCK, BLOCK, 1, 1};
        if (s->sinks > 0)
            SK_OK(sk_layout_create_sinks_window(&lay, &g, s->sinks, s->window));
        else
            SK_OK(sk_layout_create_window(&lay, &g, s->left, 0));
        return lay;
    }
    const sk_varlen_grid vg = {s->batch, BLOCK, BLOCK, 1, cu_q, cu_k};
    if (s->sinks > 0)
        SK_OK(sk_layout_create_varlen_sinks_window(&lay, &vg, s->sinks, s->window));
    else
        SK_OK(sk_layout_create_varlen_window(&lay, &vg, s->left, 0));
    return lay;
}

/* Time one form of s; its JSON object is printed by the caller. */
static result run(const spec *s) {
    result r;
    memset(&r, 0, sizeof r);
    int32_t cu_q[MAX_B + 1], cu_k[MAX_B + 1], lens_k[MAX_B];
    int32_t max_q = 1, max_k = 1, pages = 0, max_pages = 1;
    const int32_t ps = s->page_size > 0 ? s->page_size : 1;
    cu_q[0] = cu_k[0] = 0;
    for (int32_t b = 0; b < s->batch; ++b) {
        cu_q[b + 1] = cu_q[b] + s->lq[b];
        cu_k[b + 1] = cu_k[b] + s->lk[b];
        lens_k[b] = s->lk[b];
        if (s->lq[b] > max_q) max_q = s->lq[b];
        if (s->lk[b] > max_k) max_k = s->lk[b];
        const int32_t np = (s->lk[b] + ps - 1) / ps;
        pages += np;
        if (np > max_pages) max_pages = np;
    }
    const int fixed = s->page_size < 0;
    const int64_t tq = fixed ? (int64_t)s->batch * s->lq[0] : cu_q[s->batch];
    const int64_t tk = fixed ? (int64_t)s->batch * s->lk[0] : cu_k[s->batch];
    const int64_t nq = tq * HEADS * DIM;
    const int64_t nk = (s->page_size > 0 ? (int64_t)pages * ps : tk) * HEADS * DIM;
    sk_layout_t host = make_layout(s, cu_q, cu_k);
    sk_bsr hl;
    SK_OK(sk_layout_view(host, &hl));
    sk_bsr layout = bench_bsr_to_device(&hl);
    r.blocks = (int64_t)hl.nnz * HEADS * (fixed ? s->batch : 1);

    call_args a;
    memset(&a, 0, sizeof a);
    a.s = s;
    a.layout = &layout;
    CUDA_OK(cudaMalloc(&a.q, (size_t)nq * 2));
    CUDA_OK(cudaMalloc(&a.o, (size_t)nq * 2));
    CUDA_OK(cudaMalloc(&a.k, (size_t)nk * 2));
    CUDA_OK(cudaMalloc(&a.v, (size_t)nk * 2));
    fill(a.q, nq, 0);
    fill(a.k, nk, 777);
    fill(a.v, nk, 4242);
    int32_t *dcu_q = NULL, *dcu_k = NULL, *dlens = NULL, *dtable = NULL;
    if (!fixed) {
        CUDA_OK(cudaMalloc((void **)&dcu_q, sizeof cu_q));
        CUDA_OK(cudaMalloc((void **)&dcu_k, sizeof cu_k));
        CUDA_OK(cudaMalloc((void **)&dlens, sizeof lens_k));
        CUDA_OK(cudaMemcpy(dcu_q, cu_q, sizeof cu_q, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dcu_k, cu_k, sizeof cu_k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dlens, lens_k, sizeof lens_k, cudaMemcpyHostToDevice));
    }
    if (s->page_size > 0) { /* a shuffled page table: the cache in random order */
        int32_t *perm = malloc((size_t)pages * 4);
        int32_t *table = malloc((size_t)s->batch * max_pages * 4);
        if (perm == NULL || table == NULL) exit(BENCH_ERROR_EXIT);
        for (int32_t i = 0; i < pages; ++i) perm[i] = i;
        /* global: Fisher-Yates over the whole cache; local: within runs of
         * `span` pages (2 MiB of cache: cudaMalloc aligns this large a buffer
         * to 2 MiB at least), j drawn from i's own run. */
        const int64_t page_bytes = (int64_t)ps * HEADS * DIM * 2;
        const int32_t span = g_opt.local_shuffle && page_bytes < ((int64_t)2 << 20)
                                ? (int32_t)(((int64_t)2 << 20) / page_bytes)
                                : pages;
        for (int32_t i = pages - 1; i > 0; --i) {
            const int32_t lo = g_opt.local_shuffle ? i / span * span : 0;
            const int32_t j = lo + (int32_t)(host_mix64(g_opt.seed * 1000003u + (uint64_t)i) %
                                             (uint64_t)(i - lo + 1)),
                          t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        int32_t next = 0;
        for (int32_t b = 0; b < s->batch; ++b)
            for (int32_t j = 0; j < max_pages; ++j)
                table[b * max_pages + j] = j < (s->lk[b] + ps - 1) / ps ? perm[next++] : -1;
        CUDA_OK(cudaMalloc((void **)&dtable, (size_t)s->batch * max_pages * 4));
        CUDA_OK(
            cudaMemcpy(dtable, table, (size_t)s->batch * max_pages * 4, cudaMemcpyHostToDevice));
        free(perm);
        free(table);
    }
    a.cu_q = dcu_q, a.cu_k = dcu_k, a.lens_k = dlens, a.table = dtable;

    sk_attention_desc fd;
    sk_attention_varlen_desc vd;
    sk_attention_paged_desc pd;
    if (fixed) {
        SK_OK(sk_attention_desc_init(&fd, sizeof fd));
        fd.backend = s->sm80 ? SK_BACKEND_CUDA_SM80 : g_opt.backend, fd.dtype = SK_DTYPE_BF16,
        fd.batch = s->batch;
        fd.seq_q = s->lq[0], fd.seq_k = s->lk[0], fd.heads_q = fd.heads_kv = HEADS;
        fd.head_dim = DIM, fd.mask = SK_MASK_CAUSAL;
        a.desc = &fd;
        SK_OK(sk_attention_workspace_size(&fd, &layout, &a.ws_bytes));
    } else if (s->page_size == 0) {
        SK_OK(sk_attention_varlen_desc_init(&vd, sizeof vd));
        vd.backend = g_opt.backend, vd.dtype = SK_DTYPE_BF16, vd.batch = s->batch;
        vd.total_q = tq, vd.total_k = tk, vd.max_seqlen_q = max_q, vd.max_seqlen_k = max_k;
        vd.heads_q = vd.heads_kv = HEADS, vd.head_dim = DIM, vd.mask = SK_MASK_CAUSAL;
        a.desc = &vd;
        SK_OK(sk_attention_varlen_workspace_size(&vd, &layout, &a.ws_bytes));
    } else {
        SK_OK(sk_attention_paged_desc_init(&pd, sizeof pd));
        pd.backend = g_opt.backend, pd.dtype = SK_DTYPE_BF16, pd.batch = s->batch;
        pd.total_q = tq, pd.max_seqlen_q = max_q, pd.max_seqlen_k = max_k;
        pd.heads_q = pd.heads_kv = HEADS, pd.head_dim = DIM, pd.mask = SK_MASK_CAUSAL;
        pd.num_pages = pages, pd.page_size = ps, pd.max_pages = max_pages;
        a.desc = &pd;
        SK_OK(sk_attention_paged_workspace_size(&pd, &layout, &a.ws_bytes));
    }
    CUDA_OK(cudaMalloc(&a.ws, a.ws_bytes));
    float plan_min;
    time_calls(&a, 1, &r.plan_ms, &plan_min); /* leaves the plan */
    time_calls(&a, 0, &r.ms, &r.min_ms);
    CUDA_OK(cudaDeviceSynchronize());
    r.non_finite = bench_non_finite(a.o, nq, SAMPLE, SK_DTYPE_BF16);
    g_failed |= r.non_finite != 0;

    void *bufs[9] = {a.q, a.o, a.k, a.v, a.ws, dcu_q, dcu_k, dlens, dtable};
    for (int i = 0; i < 9; ++i)
        if (bufs[i] != NULL) CUDA_OK(cudaFree(bufs[i]));
    bench_bsr_free(&layout);
    sk_layout_destroy(host);
    return r;
}

static double tflops(const result *r) {
    return 4.0 * DIM * BLOCK * BLOCK * (double)r->blocks / r->ms * 1e-9;
}

/* One JSON object of a timed form; `first` controls the comma. */
static void print(const char *form, int32_t page_size, const result *r, const result *base,
                  int first) {
    printf("%s    {\"form\": \"%s\", \"page_size\": %d, \"selected_blocks\": %lld, \"ms\": %.4f, "
           "\"min_ms\": %.4f, \"plan_ms\": %.4f, \"tflops\": %.1f, \"vs_base\": %.3f, "
           "\"non_finite_in_sample\": %lld}",
           first ? "" : ",\n", form, (int)page_size, (long long)r->blocks, r->ms, r->min_ms,
           r->plan_ms, tflops(r), base != NULL ? tflops(r) / tflops(base) : 1.0,
           (long long)r->non_finite);
}

/* Row 1: 64 varlen sequences against the fixed batch of the mean length. */
static void case_varlen(void) {
    spec v;
    memset(&v, 0, sizeof v);
    v.batch = 64;
    v.left = 2047;
    int64_t total = 0;
    for (int32_t b = 0; b < v.batch; ++b) {
        v.lq[b] = v.lk[b] =
            512 + (int32_t)(host_mix64(g_opt.seed * 7919u + (uint64_t)b) % (16384 - 512 + 1));
        total += v.lq[b];
    }
    spec f = v;
    f.page_size = -1;
    const int32_t mean = (int32_t)((total / v.batch + BLOCK / 2) / BLOCK * BLOCK);
    for (int32_t b = 0; b < f.batch; ++b) f.lq[b] = f.lk[b] = mean;
    spec f80 = f;
    f80.sm80 = 1;
    const result rf = run(&f), rf80 = run(&f80), rv = run(&v);
    printf("  \"varlen\": {\"sequences\": 64, \"total_tokens\": %lld, \"fixed_seq\": %d, "
           "\"window\": 2048, \"forms\": [\n",
           (long long)total, (int)mean);
    print("fixed_batch", 0, &rf, NULL, 1);
    print("fixed_batch_sm80", 0, &rf80, NULL, 0);
    print("varlen_vs_fixed", 0, &rv, &rf, 0);
    print("varlen_vs_fixed_sm80", 0, &rv, &rf80, 0);
    printf("\n  ]}");
}

/* Rows 2 and 3: the long-window case, paged against contiguous. */
static void case_paged(void) {
    static const int32_t sizes[4] = {128, 64, 32, 16};
    spec v;
    memset(&v, 0, sizeof v);
    v.batch = 1;
    v.lq[0] = v.lk[0] = (int32_t)g_opt.seq;
    v.left = 2047;
    spec f = v;
    f.page_size = -1;
    spec f80 = f;
    f80.sm80 = 1;
    const result rf = run(&f), rf80 = run(&f80), rv = run(&v);
    printf("  \"paged\": {\"seq\": %lld, \"window\": 2048, \"forms\": [\n", (long long)g_opt.seq);
    print("fixed_batch", 0, &rf, NULL, 1);
    print("fixed_batch_sm80", 0, &rf80, NULL, 0);
    print("varlen_contiguous_vs_fixed_sm80", 0, &rv, &rf80, 0);
    for (int i = 0; i < 4; ++i) {
        spec p = v;
        p.page_size = sizes[i];
        const result rp = run(&p);
        print("paged_vs_contiguous", sizes[i], &rp, &rv, 0);
    }
    printf("\n  ]}");
}

/* Row 4: chunked prefill, 8 x 2K new over 32K cached, sinks + window. */
static void case_chunked(void) {
    static const int32_t sizes[2] = {16, 128};
    spec v;
    memset(&v, 0, sizeof v);
    v.batch = 8;
    v.sinks = 128;
    v.window = 4096;
    for (int32_t b = 0; b < v.batch; ++b) {
        v.lq[b] = 2048;
        v.lk[b] = 32768 + 2048;
    }
    const result rv = run(&v);
    printf("  \"chunked\": {\"sequences\": 8, \"new\": 2048, \"cached\": 32768, \"sinks\": 128, "
           "\"window\": 4096, \"forms\": [\n");
    print("varlen_contiguous", 0, &rv, NULL, 1);
    for (int i = 0; i < 2; ++i) {
        spec p = v;
        p.page_size = sizes[i];
        const result rp = run(&p);
        print("paged_vs_contiguous", sizes[i], &rp, &rv, 0);
    }
    printf("\n  ]}");
}

int main(int argc, char **argv) {
    if (parse(argc, argv, &g_opt) != 0) {
        fprintf(stderr, "usage: see the header of bench/varlen_speed.c\n");
        return BENCH_ERROR_EXIT;
    }
    g_pattern = bench_device_pattern(SK_DTYPE_BF16, PATTERN, 30);
    if (g_pattern == NULL) return BENCH_ERROR_EXIT;
    sk_device_info info;
    SK_OK(sk_device_get_info(0, &info));
    const char *w = g_opt.which;
    const int all = strcmp(w, "all") == 0;
    printf("{\"gpu\": \"%s\", \"heads\": %d, \"dim\": %d, \"block\": %d, \"dtype\": \"bf16\", "
           "\"causal\": 1, \"reps\": %d, \"shuffle\": \"%s\"",
           info.name, HEADS, DIM, BLOCK, g_opt.reps, g_opt.local_shuffle ? "local" : "global");
    if (all || strcmp(w, "varlen") == 0) {
        printf(",\n");
        case_varlen();
    }
    if (all || strcmp(w, "paged") == 0) {
        printf(",\n");
        case_paged();
    }
    if (all || strcmp(w, "chunked") == 0) {
        printf(",\n");
        case_chunked();
    }
    printf("\n}\n");
    return g_failed ? 1 : 0;
}
