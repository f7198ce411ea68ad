/*
 * test_decode_select_gpu.c - the CUDA decode page selection against the
 * CPU backend, bit for bit (the arithmetic order is part of the contract,
 * sparsek.h "Decode page selection"):
 *   cases     seeded random problems (fp16 / bf16, GQA groups 1..16, q_len
 *             1..16, head_dim 32..256, block_k and page_size 16..128 in
 *             every pairing, shuffled pages, NaN in every unused page and
 *             slot, strides padded or packed, quantised inputs with many
 *             tied scores or real ones, empty sequences; one case in
 *             four with two levels: group summaries, kept groups): the
 *             summary built, the layout (twice: bitwise repeat), then an append
 *             from random old lengths, against the CPU's;
 *   long rows more key blocks than the select kernel keeps in shared
 *             memory;
 *   clamping  device lengths outside [0, max_seqlen_k] and old > new are
 *             clamped as documented (equal to the CPU on clamped lengths);
 *             page indices outside [0, num_pages) are skipped (no fault,
 *             a valid layout);
 *   graphs    append + select captured once, replayed on new queries and
 *             lengths, equal to the eager calls.
 * Every output (summary, layout arrays, workspace) is poisoned first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dsel_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"
#include "sparsek.h"

/* Device copies of a case and its outputs. */
typedef struct dev_case {
    void *cache, *q, *sum, *ws;
    int32_t *table, *lens, *old, *off, *idx;
    size_t sum_bytes, ws_bytes;
    int32_t cap, rows;
} dev_case;

static void dev_free(dev_case *d) {
    gt_device_free(d->cache), gt_device_free(d->q), gt_device_free(d->sum);
    gt_device_free(d->ws), gt_device_free(d->table), gt_device_free(d->lens);
    gt_device_free(d->old), gt_device_free(d->off), gt_device_free(d->idx);
    memset(d, 0, sizeof *d);
}

static void *upload(const void *host, size_t n) {
    void *p = gt_device_alloc(n < 16 ? 16 : n);
    if (p != NULL && gt_upload(p, host, n) != 0) {
        gt_device_free(p);
        return NULL;
    }
    return p;
}

static void poison(void *dev, size_t n) {
    cudaMemset(dev, 0xff, n < 16 ? 16 : n);
    cudaDeviceSynchronize();
}

static int table_entries(const dc_case *c) {
    const int64_t s = c->desc.page_table_stride ? c->desc.page_table_stride : c->desc.max_pages;
    return (int)(c->desc.batch * s);
}

static int dev_alloc(dev_case *d, const dc_case *c, const sk_decode_select_desc *gd) {
    memset(d, 0, sizeof *d);
    const size_t es = 2;
    d->rows = dc_rows(c);
    if (sk_kv_summary_bytes(gd, &d->sum_bytes) != SK_STATUS_SUCCESS ||
        sk_decode_select_capacity(gd, NULL, &d->cap) != SK_STATUS_SUCCESS ||
        sk_decode_select_workspace_size(gd, &d->ws_bytes) != SK_STATUS_SUCCESS)
        return 0;
    d->cache = upload(c->cache, (size_t)c->cache_elems * es);
    d->q = upload(c->q, (size_t)c->q_elems * es);
    d->table = (int32_t *)upload(c->table, (size_t)table_entries(c) * 4);
    d->lens = (int32_t *)upload(c->lens, (size_t)c->desc.batch * 4);
    d->old = (int32_t *)gt_device_alloc((size_t)c->desc.batch * 4 + 16);
    d->sum = gt_device_alloc(d->sum_bytes);
    d->ws = gt_device_alloc(d->ws_bytes);
    d->off = (int32_t *)gt_device_alloc((size_t)(d->rows + 1) * 4);
    d->idx = (int32_t *)gt_device_alloc((size_t)d->cap * 4 + 16);
    return d->cache && d->q && d->table && d->lens && d->old && d->sum && d->ws && d->off && d->idx;
}

/* Host outputs of one backend. */
typedef struct host_out {
    unsigned char *sum;
    int32_t *off, *idx;
} host_out;

static int host_alloc(host_out *h, size_t sum_bytes, int32_t rows, int32_t cap) {
    h->sum = (unsigned char *)malloc(sum_bytes);
    h->off = (int32_t *)malloc((size_t)(rows + 1) * 4);
    h->idx = (int32_t *)malloc((size_t)cap * 4 + 4);
    return h->sum && h->off && h->idx;
}
static void host_free(host_out *h) { free(h->sum), free(h->off), free(h->idx); }

/* CPU: build (old NULL) or append, then select, on host copies. */
static sk_status cpu_run(const dc_case *c, const int32_t *old, const int32_t *lens, host_out *h,
                         int build_first) {
    sk_decode_select_desc d = c->desc;
    d.backend = SK_BACKEND_CPU;
    sk_status st = SK_STATUS_SUCCESS;
    if (build_first) st = sk_kv_summary_build(&d, c->cache, c->table, old != NULL ? old : lens, h->sum, NULL);
    if (st == SK_STATUS_SUCCESS && old != NULL)
        st = sk_kv_summary_append(&d, c->cache, c->table, old, lens, h->sum, NULL);
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = h->off;
    l.col_indices = h->idx;
    if (st == SK_STATUS_SUCCESS) st = sk_decode_select(&d, c->q, h->sum, lens, &l, NULL, 0, NULL);
    return st;
}

/* GPU select into d->off / d->idx, downloaded into h. */
static int gpu_select(const dc_case *c, const sk_decode_select_desc *gd, dev_case *d, host_out *h) {
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = d->off;
    l.col_indices = d->idx;
    poison(d->off, (size_t)(d->rows + 1) * 4);
    poison(d->idx, (size_t)d->cap * 4);
    poison(d->ws, d->ws_bytes);
    sk_status st = sk_decode_select(gd, d->q, d->sum, d->lens, &l, d->ws, d->ws_bytes, NULL);
    if (st != SK_STATUS_SUCCESS || gt_sync() != 0) {
        fprintf(stderr, "  gpu select: %s\n", sk_last_error());
        return 0;
    }
    (void)c;
    return gt_download(h->off, d->off, (size_t)(d->rows + 1) * 4) == 0 &&
           gt_download(h->idx, d->idx, (size_t)d->cap * 4) == 0 && l.nnz == d->cap;
}

static int same_layout(const host_out *a, const host_out *b, int32_t rows, int32_t cap,
                       const char *what) {
    if (memcmp(a->off, b->off, (size_t)(rows + 1) * 4) != 0 || a->off[rows] > cap ||
        memcmp(a->idx, b->idx, (size_t)a->off[rows] * 4) != 0) {
        fprintf(stderr, "  %s: layouts differ (counts %d and %d, capacity %d)\n", what,
                (int)a->off[rows], (int)b->off[rows], (int)cap);
        return 0;
    }
    return 1;
}

typedef struct case_cfg {
    sk_dtype dtype;
    int32_t batch, q_len, hq, hkv, head_dim, block_k, page_size, max_len, k, sinks, recent;
    int padded, quant;
    int32_t group_blocks, top_groups; /* two levels when group_blocks > 0 */
} case_cfg;

/* One case: build, select (twice), append; each against the CPU. Returns
 * 0 on success. */
static int run_case(const case_cfg *g, uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    dc_case c;
    if (!dc_alloc(&c, &rng, SK_BACKEND_CPU, g->dtype, g->batch, g->q_len, g->hq, g->hkv, g->head_dim,
                  g->block_k, g->page_size, g->max_len, g->padded, g->quant, g->batch > 2))
        return 1;
    c.desc.k = g->k;
    c.desc.sink_blocks = g->sinks;
    c.desc.recent_blocks = g->recent;
    c.desc.group_blocks = g->group_blocks;
    c.desc.top_groups = g->top_groups;
    sk_decode_select_desc gd = c.desc;
    gd.backend = gt_opt.backend;
    dev_case d;
    host_out cpu, gpu, again;
    int fails = 0;
    const int ok = dev_alloc(&d, &c, &gd) && host_alloc(&cpu, d.sum_bytes, d.rows, d.cap) &&
                   host_alloc(&gpu, d.sum_bytes, d.rows, d.cap) &&
                   host_alloc(&again, d.sum_bytes, d.rows, d.cap);
    if (!ok) {
        fprintf(stderr, "  setup failed: %s\n", sk_last_error());
        fails = 1;
        goto done;
    }
    /* Build + select. */
    if (cpu_run(&c, NULL, c.lens, &cpu, 1) != SK_STATUS_SUCCESS) {
        fprintf(stderr, "  cpu: %s\n", sk_last_error());
        fails = 1;
        goto done;
    }
    poison(d.sum, d.sum_bytes);
    if (sk_kv_summary_build(&gd, d.cache, d.table, d.lens, d.sum, NULL) != SK_STATUS_SUCCESS ||
        gt_sync() != 0 || gt_download(gpu.sum, d.sum, d.sum_bytes) != 0) {
        fprintf(stderr, "  gpu build: %s\n", sk_last_error());
        fails = 1;
        goto done;
    }
    if (memcmp(cpu.sum, gpu.sum, d.sum_bytes) != 0) {
        fprintf(stderr, "  built summaries differ\n");
        fails = 1;
    }
    if (!gpu_select(&c, &gd, &d, &gpu) || !gpu_select(&c, &gd, &d, &again)) {
        fails = 1;
        goto done;
    }
    fails += !same_layout(&cpu, &gpu, d.rows, d.cap, "build + select");
    fails += !same_layout(&gpu, &again, d.rows, d.cap, "repeat");
    /* Append from random old lengths: build at old, append to lens. */
    {
        int32_t *old = (int32_t *)malloc((size_t)g->batch * 4);
        for (int32_t b = 0; b < g->batch; ++b)
            old[b] = tu_rng_uniform(&rng) < 0.5 ? c.lens[b] - (int32_t)tu_rng_range(&rng, 0, c.lens[b] < 3 ? c.lens[b] : 3)
                                                 : (int32_t)tu_rng_range(&rng, 0, c.lens[b]);
        if (cpu_run(&c, old, c.lens, &cpu, 1) != SK_STATUS_SUCCESS) {
            fprintf(stderr, "  cpu append: %s\n", sk_last_error());
            fails = 1;
        } else {
            poison(d.sum, d.sum_bytes);
            const int up = gt_upload(d.old, old, (size_t)g->batch * 4) == 0;
            sk_status s1 = sk_kv_summary_build(&gd, d.cache, d.table, d.old, d.sum, NULL);
            sk_status s2 = sk_kv_summary_append(&gd, d.cache, d.table, d.old, d.lens, d.sum, NULL);
            if (!up || s1 != SK_STATUS_SUCCESS || s2 != SK_STATUS_SUCCESS || gt_sync() != 0 ||
                gt_download(gpu.sum, d.sum, d.sum_bytes) != 0) {
                fprintf(stderr, "  gpu append: %s\n", sk_last_error());
                fails = 1;
            } else {
                if (memcmp(cpu.sum, gpu.sum, d.sum_bytes) != 0) {
                    fprintf(stderr, "  appended summaries differ\n");
                    fails = 1;
                }
                if (gpu_select(&c, &gd, &d, &gpu))
                    fails += !same_layout(&cpu, &gpu, d.rows, d.cap, "append + select");
                else
                    fails = 1;
            }
        }
        free(old);
    }
done:
    if (fails)
        fprintf(stderr,
                "  case: dtype %d B %d q_len %d hq %d hkv %d D %d bk %d page %d len %d k %d sinks "
                "%d recent %d padded %d quant %d groups %d top %d seed %llu\n",
                (int)g->dtype, (int)g->batch, (int)g->q_len, (int)g->hq, (int)g->hkv,
                (int)g->head_dim, (int)g->block_k, (int)g->page_size, (int)g->max_len, (int)g->k,
                (int)g->sinks, (int)g->recent, g->padded, g->quant, (int)g->group_blocks,
                (int)g->top_groups, (unsigned long long)seed);
    if (ok) host_free(&cpu), host_free(&gpu), host_free(&again);
    dev_free(&d);
    dc_free(&c);
    return fails != 0;
}

SK_TEST(dsel_gpu_random_cases_match_cpu) {
    const uint64_t seed = tu_base_seed() ^ 0xd5e1a;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    static const int32_t sizes[4] = {16, 32, 64, 128};
    static const int32_t groups[5] = {1, 2, 4, 8, 16};
    const int n = gt_opt.quick ? 8 : 72;
    int fails = 0;
    for (int i = 0; i < n; ++i) {
        case_cfg g;
        g.dtype = i % 2 ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        g.hkv = (int32_t)tu_rng_range(&rng, 1, 4);
        g.hq = g.hkv * groups[tu_rng_range(&rng, 0, 4)];
        g.batch = (int32_t)tu_rng_range(&rng, 1, 5);
        g.q_len = tu_rng_uniform(&rng) < 0.5 ? 1 : (int32_t)tu_rng_range(&rng, 2, 16);
        g.head_dim = i % 5 == 0 ? 32 * (int32_t)tu_rng_range(&rng, 1, 8) : (i % 2 ? 128 : 64);
        g.block_k = sizes[i % 4];           /* every pairing of block_k */
        g.page_size = sizes[(i / 4) % 4];   /* and page_size */
        g.max_len = (int32_t)tu_rng_range(&rng, 1, gt_opt.quick ? 600 : 6000);
        g.k = (int32_t)tu_rng_range(&rng, 0, 70);
        g.sinks = (int32_t)tu_rng_range(&rng, 0, 2);
        g.recent = (int32_t)tu_rng_range(&rng, 0, 3);
        g.padded = (int)tu_rng_range(&rng, 0, 1);
        g.quant = i % 3 == 0;
        /* Every fourth case: two levels. */
        g.group_blocks = i % 4 == 2 ? (int32_t)tu_rng_range(&rng, 2, 16) : 0;
        g.top_groups = g.group_blocks > 0 ? (int32_t)tu_rng_range(&rng, 1, 6) : 0;
        const int f = run_case(&g, seed + 1000 * (uint64_t)i);
        if (gt_opt.verbose || f) fprintf(stderr, "  case %d: %s\n", i, f ? "FAIL" : "ok");
        fails += f;
    }
    CHECK(fails == 0, "%d of %d cases differ from the CPU (seed %llu)", fails, n,
          (unsigned long long)seed);
}

SK_TEST(dsel_gpu_long_rows_past_shared_keys) {
    /* 140000 keys in blocks of 16: 8750 candidates, over the 8192 the
     * select kernel keeps in shared memory. */
    const case_cfg a = {SK_DTYPE_F16, 1, 1, 4, 1, 32, 16, 64, 140000, 300, 1, 2, 0, 0, 0, 0};
    const case_cfg b = {SK_DTYPE_BF16, 2, 2, 2, 1, 32, 16, 128, 140000, 40, 0, 1, 1, 1, 0, 0};
    /* Two levels: 547 groups of 16 blocks, 40 kept (640 blocks scored). */
    const case_cfg c = {SK_DTYPE_BF16, 1, 1, 8, 2, 64, 16, 64, 140000, 200, 1, 2, 0, 0, 16, 40};
    CHECK(run_case(&a, tu_base_seed() ^ 0x10a9) == 0, "long row, real scores");
    CHECK(run_case(&b, tu_base_seed() ^ 0x10aa) == 0, "long rows, tied scores");
    CHECK(run_case(&c, tu_base_seed() ^ 0x10ab) == 0, "long rows, two levels");
}

/* Device lengths past max_seqlen_k or negative, and old > new: clamped as
 * documented; bad page indices: skipped. */
SK_TEST(dsel_gpu_clamps_device_arrays) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xc1a);
    dc_case c;
    REQUIRE(dc_alloc(&c, &rng, SK_BACKEND_CPU, SK_DTYPE_F16, 3, 1, 8, 2, 128, 64, 64, 900, 0, 0, 0),
            "no memory");
    c.lens[1] = 0; /* shorter than drawn: its pages stay valid */
    sk_decode_select_desc gd = c.desc;
    gd.backend = gt_opt.backend;
    dev_case d;
    host_out cpu, gpu;
    REQUIRE(dev_alloc(&d, &c, &gd) && host_alloc(&cpu, d.sum_bytes, d.rows, d.cap) &&
                host_alloc(&gpu, d.sum_bytes, d.rows, d.cap),
            "setup: %s", sk_last_error());
    REQUIRE(cpu_run(&c, NULL, c.lens, &cpu, 1) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    const int32_t wild[3] = {c.lens[0] + 5000, -7, c.lens[2]};
    const int32_t old[3] = {c.lens[0] + 9999, 5, c.lens[2] + 1}; /* each clamps to new */
    REQUIRE(gt_upload(d.lens, wild, sizeof wild) == 0 && gt_upload(d.old, old, sizeof old) == 0,
            "upload");
    poison(d.sum, d.sum_bytes);
    REQUIRE(sk_kv_summary_build(&gd, d.cache, d.table, d.lens, d.sum, NULL) == SK_STATUS_SUCCESS &&
                sk_kv_summary_append(&gd, d.cache, d.table, d.old, d.lens, d.sum, NULL) ==
                    SK_STATUS_SUCCESS &&
                gt_sync() == 0 && gt_download(gpu.sum, d.sum, d.sum_bytes) == 0,
            "%s", sk_last_error());
    CHECK(memcmp(cpu.sum, gpu.sum, d.sum_bytes) == 0, "clamped summaries differ from the CPU's");
    REQUIRE(gpu_select(&c, &gd, &d, &gpu), "select");
    CHECK(same_layout(&cpu, &gpu, d.rows, d.cap, "clamped lengths"), "clamped layout");

    /* Page indices outside [0, num_pages) in used entries: no fault, and a
     * valid layout (sorted, in range, within capacity). */
    int32_t *bad = (int32_t *)malloc((size_t)table_entries(&c) * 4);
    REQUIRE(bad != NULL, "no memory");
    memcpy(bad, c.table, (size_t)table_entries(&c) * 4);
    bad[0] = -1;
    bad[3] = (int32_t)c.desc.num_pages;
    bad[5] = INT32_MIN;
    REQUIRE(gt_upload(d.table, bad, (size_t)table_entries(&c) * 4) == 0 &&
                gt_upload(d.lens, c.lens, (size_t)c.desc.batch * 4) == 0,
            "upload");
    REQUIRE(sk_kv_summary_build(&gd, d.cache, d.table, d.lens, d.sum, NULL) == SK_STATUS_SUCCESS &&
                gt_sync() == 0,
            "build over bad pages: %s", sk_last_error());
    REQUIRE(gpu_select(&c, &gd, &d, &gpu), "select over bad pages");
    int bad_rows = gpu.off[0] != 0 || gpu.off[d.rows] > d.cap;
    for (int32_t r = 0; r < d.rows && !bad_rows; ++r) {
        const int32_t n = (c.lens[r / 2] + 63) / 64;
        for (int32_t e = gpu.off[r]; e < gpu.off[r + 1]; ++e)
            bad_rows += gpu.idx[e] < 0 || gpu.idx[e] >= n || (e > gpu.off[r] && gpu.idx[e] <= gpu.idx[e - 1]);
    }
    CHECK(bad_rows == 0, "invalid layout over bad page indices");
    free(bad);
    host_free(&cpu), host_free(&gpu);
    dev_free(&d);
    dc_free(&c);
}

/* A decode step (append one token, select) captured once and replayed on
 * new queries and lengths equals the eager calls. */
SK_TEST(dsel_gpu_graph_capture_replays_on_new_inputs) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x6a9);
    dc_case c;
    REQUIRE(dc_alloc(&c, &rng, SK_BACKEND_CPU, SK_DTYPE_BF16, 4, 2, 16, 4, 128, 64, 64, 3000, 0, 0, 0),
            "no memory");
    sk_decode_select_desc gd = c.desc;
    gd.backend = gt_opt.backend;
    gd.k = 8;
    dev_case d;
    host_out eager, graph;
    REQUIRE(dev_alloc(&d, &c, &gd) && host_alloc(&eager, d.sum_bytes, d.rows, d.cap) &&
                host_alloc(&graph, d.sum_bytes, d.rows, d.cap),
            "setup: %s", sk_last_error());
    int32_t old[4], cur[4];
    for (int b = 0; b < 4; ++b) old[b] = c.lens[b] > 0 ? c.lens[b] - 1 : 0;
    REQUIRE(gt_upload(d.old, old, sizeof old) == 0, "upload");
    REQUIRE(sk_kv_summary_build(&gd, d.cache, d.table, d.old, d.sum, NULL) == SK_STATUS_SUCCESS &&
                gt_sync() == 0,
            "%s", sk_last_error());
    cudaStream_t stream;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = d.off;
    l.col_indices = d.idx;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
    sk_status s1 = sk_kv_summary_append(&gd, d.cache, d.table, d.old, d.lens, d.sum, stream);
    sk_status s2 = sk_decode_select(&gd, d.q, d.sum, d.lens, &l, d.ws, d.ws_bytes, stream);
    cudaError_t e = cudaStreamEndCapture(stream, &g);
    REQUIRE(s1 == SK_STATUS_SUCCESS && s2 == SK_STATUS_SUCCESS, "captured: %s", sk_last_error());
    REQUIRE(e == cudaSuccess && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess, "instantiate");
    for (int round = 0; round < 3; ++round) {
        /* New queries and one more token per sequence each round. */
        for (int b = 0; b < 4; ++b) cur[b] = old[b] + (round > 0 && old[b] < c.lens[b] ? 1 : 0);
        tu_fill_normal(&rng, c.q, c.desc.dtype, c.q_elems, 1.0f);
        REQUIRE(gt_upload(d.q, c.q, (size_t)c.q_elems * 2) == 0 &&
                    gt_upload(d.lens, cur, sizeof cur) == 0,
                "upload");
        /* Replay from a copy of the summary; eager from the same copy. */
        unsigned char *saved = (unsigned char *)malloc(d.sum_bytes);
        REQUIRE(saved != NULL && gt_download(saved, d.sum, d.sum_bytes) == 0, "save");
        poison(d.off, (size_t)(d.rows + 1) * 4);
        poison(d.idx, (size_t)d.cap * 4);
        REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess &&
                    cudaStreamSynchronize(stream) == cudaSuccess,
                "replay");
        REQUIRE(gt_download(graph.off, d.off, (size_t)(d.rows + 1) * 4) == 0 &&
                    gt_download(graph.idx, d.idx, (size_t)d.cap * 4) == 0 &&
                    gt_download(graph.sum, d.sum, d.sum_bytes) == 0,
                "download");
        REQUIRE(gt_upload(d.sum, saved, d.sum_bytes) == 0, "restore");
        poison(d.off, (size_t)(d.rows + 1) * 4);
        REQUIRE(sk_kv_summary_append(&gd, d.cache, d.table, d.old, d.lens, d.sum, stream) ==
                        SK_STATUS_SUCCESS &&
                    sk_decode_select(&gd, d.q, d.sum, d.lens, &l, d.ws, d.ws_bytes, stream) ==
                        SK_STATUS_SUCCESS &&
                    cudaStreamSynchronize(stream) == cudaSuccess,
                "eager: %s", sk_last_error());
        REQUIRE(gt_download(eager.off, d.off, (size_t)(d.rows + 1) * 4) == 0 &&
                    gt_download(eager.idx, d.idx, (size_t)d.cap * 4) == 0 &&
                    gt_download(eager.sum, d.sum, d.sum_bytes) == 0,
                "download");
        CHECK(same_layout(&graph, &eager, d.rows, d.cap, "graph vs eager"), "round %d", round);
        CHECK(memcmp(graph.sum, eager.sum, d.sum_bytes) == 0, "round %d: summaries differ", round);
        free(saved);
        memcpy(old, cur, sizeof old);
        REQUIRE(gt_upload(d.old, old, sizeof old) == 0, "upload");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cudaStreamDestroy(stream);
    host_free(&eager), host_free(&graph);
    dev_free(&d);
    dc_free(&c);
}
