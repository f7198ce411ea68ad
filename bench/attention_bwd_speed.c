/*
 * attention_bwd_speed.c - timing of the CUDA attention backward (issue 29),
 * with the forward of the same problem for scale.
 *
 * Build (after `make -j2 all`):  make build/attention_bwd_speed
 * Run:
 *   build/attention_bwd_speed [--batch 16] [--heads 96] [--heads-kv 96] [--seq 4096]
 *                             [--dim 128] [--block 128] [--per-row K] [--causal]
 *                             [--dtype f16|bf16] [--backend cuda|sm80|sm90] [--reps 10]
 *                             [--deterministic 1|0|0,1]
 * Defaults: issue 29's seed row, B16 H96 S4096 D128 fp16, 128 x 128 blocks,
 * random 25 % (per_row = key blocks / 4, per (batch, head), seeded).
 *
 * Inputs: a 16 M-element random pattern repeated over Q, K, V and dO on
 * the device; O and LSE from the library's forward. Timing: CUDA events
 * around each of `reps` backward runs (plan once, 2 warm-up runs; the plan
 * is timed on its own), median and minimum; the forward likewise. A sample
 * of dQ, dK and dV must be finite (exit 1 otherwise). One JSON object on
 * stdout; TFLOPS count 2.5 x the forward's 4 D bq bk per selected block
 * over all (batch, head) (the rule), i.e. the selected blocks only.
 * --deterministic lists bwd->deterministic modes (default 1): with more
 * than one, the same inputs, workspace (the largest) and plan serve every
 * mode, the backward runs are interleaved (round r times mode 0, then mode
 * 1, ...: drifts of clock and temperature hit both), and one JSON object
 * per mode is printed, each with its "deterministic" field and its own
 * finiteness check.
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
#include "bench_timing.h"
#include "host_data.h"
#include "bench_device.h"

enum { WARMUP = 2, PATTERN = 1 << 24, SAMPLE = 1 << 20 };

typedef struct opts {
    int64_t batch, heads, heads_kv, seq, dim;
    int32_t block, per_row;
    int causal, reps;
    sk_dtype dtype;
    sk_backend backend;
    int modes[2], n_modes; /* bwd->deterministic values, in order */
} opts;

static int parse(int argc, char **argv, opts *o) {
    o->batch = 16, o->heads = 96, o->heads_kv = 0, o->seq = 4096, o->dim = 128;
    o->block = 128, o->per_row = 0, o->causal = 0, o->reps = 10;
    o->dtype = SK_DTYPE_F16, o->backend = SK_BACKEND_CUDA;
    o->modes[0] = 1, o->n_modes = 1;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--causal") == 0) {
            o->causal = 1;
            continue;
        }
        if (v == NULL) return -1;
        ++i;
        if (strcmp(a, "--batch") == 0) o->batch = atoll(v);
        else if (strcmp(a, "--heads") == 0) o->heads = atoll(v);
        else if (strcmp(a, "--heads-kv") == 0) o->heads_kv = atoll(v);
        else if (strcmp(a, "--seq") == 0) o->seq = atoll(v);
        else if (strcmp(a, "--dim") == 0) o->dim = atoll(v);
        else if (strcmp(a, "--block") == 0) o->block = atoi(v);
        else if (strcmp(a, "--per-row") == 0) o->per_row = atoi(v);
        else if (strcmp(a, "--reps") == 0) o->reps = atoi(v);
        else if (strcmp(a, "--deterministic") == 0) {
            o->n_modes = 0;
            for (const char *t = v; *t != '\0' && o->n_modes < 2; ++t)
                if (*t == '0' || *t == '1') o->modes[o->n_modes++] = *t - '0';
            if (o->n_modes == 0) return -1;
        }
        else if (strcmp(a, "--dtype") == 0) o->dtype = strcmp(v, "bf16") == 0 ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        else if (strcmp(a, "--backend") == 0)
            o->backend = strcmp(v, "sm80") == 0   ? SK_BACKEND_CUDA_SM80
                         : strcmp(v, "sm90") == 0 ? SK_BACKEND_CUDA_SM90
                                                  : SK_BACKEND_CUDA;
        else return -1;
    }
    if (o->heads_kv == 0) o->heads_kv = o->heads;
    const int64_t cb = (o->seq + o->block - 1) / o->block;
    if (o->per_row == 0) o->per_row = (int32_t)(cb / 4 > 0 ? cb / 4 : 1);
    if (o->reps < 1 || o->reps > BENCH_MAX_REPS) o->reps = 10;
    return 0;
}

/* Median and minimum milliseconds of `reps` timed calls of what (0: the
 * forward, 1: the backward run, 2: the backward plan). */
typedef struct bench_call {
    const sk_attention_desc *d;
    const sk_attention_backward_desc *bd;
    const sk_bsr *layout;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *fws, *bws;
    float *lse;
    size_t fws_bytes, bws_bytes;
} bench_call;

static void call(const bench_call *c, int what) {
    if (what == 0)
        SK_OK(sk_attention_run(c->d, c->layout, c->q, c->k, c->v, c->o, c->lse, c->fws,
                               c->fws_bytes, NULL));
    else if (what == 1)
        SK_OK(sk_attention_backward_run(c->d, c->bd, c->layout, c->q, c->k, c->v, c->o, c->dout,
                                        c->lse, c->dq, c->dk, c->dv, c->bws, c->bws_bytes, NULL));
    else
        SK_OK(sk_attention_backward_plan(c->d, c->bd, c->layout, c->bws, c->bws_bytes, NULL));
}

/* One timed call: what (0, 1, 2 as call()) of c. */
typedef struct timed_call {
    const bench_call *c;
    int what;
} timed_call;

static void call_timed(const void *ctx) {
    const timed_call *t = (const timed_call *)ctx;
    call(t->c, t->what);
}

static void time_calls(const bench_call *c, int what, int reps, float *median, float *best) {
    const timed_call t = {c, what};
    bench_time(call_timed, &t, WARMUP, reps, median, best);
}

/* The backward of each of n calls (their modes), interleaved: `reps`
 * rounds of one timed run each after WARMUP runs each; median and minimum
 * per call. */
static void time_interleaved(const bench_call *c, int n, int reps, float *median, float *best) {
    float ms[2][BENCH_MAX_REPS];
    for (int i = 0; i < n; ++i)
        for (int w = 0; w < WARMUP; ++w) call(&c[i], 1);
    for (int r = 0; r < reps; ++r)
        for (int i = 0; i < n; ++i) {
            const timed_call t = {&c[i], 1};
            float unused;
            bench_time(call_timed, &t, 0, 1, &ms[i][r], &unused);
        }
    for (int i = 0; i < n; ++i) {
        qsort(ms[i], (size_t)reps, sizeof(float), bench_cmp_float);
        median[i] = ms[i][reps / 2];
        best[i] = ms[i][0];
    }
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: see the header of bench/attention_bwd_speed.c\n");
        return BENCH_ERROR_EXIT;
    }
    const int64_t nq = o.batch * o.seq * o.heads * o.dim, nk = o.batch * o.seq * o.heads_kv * o.dim;
    sk_grid grid = {o.seq, o.seq, o.block, o.block, (int32_t)o.batch, (int32_t)o.heads};
    sk_layout_t host_layout;
    SK_OK(sk_layout_create_random(&host_layout, &grid, o.per_row, 29, o.causal));
    sk_bsr hl;
    SK_OK(sk_layout_view(host_layout, &hl));
    const sk_bsr layout = bench_bsr_to_device(&hl);

    bench_call c;
    memset(&c, 0, sizeof c);
    void *pattern = bench_device_pattern(o.dtype, PATTERN, 29);
    if (pattern == NULL) return BENCH_ERROR_EXIT;
    void **bufs[8] = {&c.q, &c.o, &c.dout, &c.dq, &c.k, &c.v, &c.dk, &c.dv};
    for (int i = 0; i < 8; ++i) CUDA_OK(cudaMalloc(bufs[i], (size_t)(i < 4 ? nq : nk) * 2));
    CUDA_OK(cudaMalloc((void **)&c.lse, (size_t)(o.batch * o.heads * o.seq) * 4));
    bench_fill_pattern(c.q, pattern, PATTERN, nq, 0);
    bench_fill_pattern(c.dout, pattern, PATTERN, nq, 12345);
    bench_fill_pattern(c.k, pattern, PATTERN, nk, 777);
    bench_fill_pattern(c.v, pattern, PATTERN, nk, 4242);

    sk_attention_desc d;
    sk_attention_backward_desc bd, bdm[2];
    SK_OK(sk_attention_desc_init(&d, sizeof d));
    SK_OK(sk_attention_backward_desc_init(&bd, sizeof bd));
    d.backend = o.backend;
    d.dtype = o.dtype;
    d.batch = o.batch;
    d.seq_q = d.seq_k = o.seq;
    d.heads_q = o.heads;
    d.heads_kv = o.heads_kv;
    d.head_dim = o.dim;
    d.mask = o.causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    c.d = &d;
    c.bd = &bd;
    c.layout = &layout;
    SK_OK(sk_attention_workspace_size(&d, &layout, &c.fws_bytes));
    /* The largest workspace of the modes (deterministic = 0 adds dQaccum). */
    c.bws_bytes = 0;
    for (int m = 0; m < o.n_modes; ++m) {
        size_t bytes;
        bdm[m] = bd;
        bdm[m].deterministic = o.modes[m];
        SK_OK(sk_attention_backward_workspace_size(&d, &bdm[m], &layout, &bytes));
        if (bytes > c.bws_bytes) c.bws_bytes = bytes;
    }
    CUDA_OK(cudaMalloc(&c.fws, c.fws_bytes));
    CUDA_OK(cudaMalloc(&c.bws, c.bws_bytes));
    SK_OK(sk_attention_plan(&d, &layout, c.fws, c.fws_bytes, NULL));
    float fwd_med, fwd_min, bwd_med[2], bwd_min[2], plan_med, plan_min;
    time_calls(&c, 0, o.reps, &fwd_med, &fwd_min); /* leaves O and LSE */
    c.bd = &bdm[0];
    time_calls(&c, 2, o.reps, &plan_med, &plan_min); /* the plan serves every mode */
    bench_call cm[2];
    for (int m = 0; m < o.n_modes; ++m) {
        cm[m] = c;
        cm[m].bd = &bdm[m];
    }
    if (o.n_modes == 1)
        time_calls(&cm[0], 1, o.reps, &bwd_med[0], &bwd_min[0]);
    else
        time_interleaved(cm, o.n_modes, o.reps, bwd_med, bwd_min);
    int64_t bad_any = 0;

    const double fwd_flops = 4.0 * (double)o.dim * o.block * o.block * (double)hl.nnz;
    sk_device_info info;
    SK_OK(sk_device_get_info(0, &info));
    for (int m = 0; m < o.n_modes; ++m) {
        /* Each mode's own outputs: run it once more, then check a sample. */
        call(&cm[m], 1);
        CUDA_OK(cudaDeviceSynchronize());
        const int64_t bad = bench_non_finite(c.dq, nq, SAMPLE, o.dtype) +
                            bench_non_finite(c.dk, nk, SAMPLE, o.dtype) +
                            bench_non_finite(c.dv, nk, SAMPLE, o.dtype);
        bad_any += bad;
        printf("{\"gpu\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"heads_kv\": %lld, "
               "\"seq\": %lld, \"dim\": %lld, \"block\": %d, \"per_row\": %d, \"causal\": %d, "
               "\"dtype\": \"%s\", \"deterministic\": %d, \"selected_blocks\": %d, "
               "\"fwd_ms\": %.4f, \"fwd_min_ms\": %.4f, \"fwd_tflops\": %.1f, "
               "\"bwd_plan_ms\": %.4f, \"bwd_ms\": %.4f, \"bwd_min_ms\": %.4f, "
               "\"bwd_tflops\": %.1f, \"non_finite_in_sample\": %lld}\n",
               info.name, (long long)o.batch, (long long)o.heads, (long long)o.heads_kv,
               (long long)o.seq, (long long)o.dim, (int)o.block, (int)o.per_row, o.causal,
               host_dtype_name(o.dtype), o.modes[m], (int)hl.nnz, fwd_med, fwd_min,
               fwd_flops / fwd_med * 1e-9, plan_med, bwd_med[m], bwd_min[m],
               2.5 * fwd_flops / bwd_med[m] * 1e-9, (long long)bad);
    }
    sk_layout_destroy(host_layout);
    return bad_any == 0 ? 0 : 1;
}
