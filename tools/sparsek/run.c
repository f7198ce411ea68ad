/*
 * run.c - the attention calls of `sparsek run` and their timer, and how
 * long a run is expected to take (for the progress lines).
 *
 * The timer: w->warmup untimed calls, then w->iters timed ones, median and
 * minimum. On a GPU the calls are queued back to back on one non-blocking
 * stream with a CUDA event between consecutive calls (iters + 1 events, no
 * host synchronisation between calls), so the host's launch time hides
 * behind the previous call; on the CPU each call is timed with the
 * monotonic host clock. sk_attention_run is timed on a planned workspace;
 * sk_attention_plan is timed the same way on its own, before it. On a GPU
 * the timed calls' energy comes from NVML (energy.c) when it is there.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* Rough rates for expected_seconds (the usage text states them). */
#define RATE_CPU_FLOPS_PER_THREAD   4e9    /* the CPU backend's attention */
#define RATE_GPU_FLOPS              100e12 /* any CUDA kernel of the library */
#define RATE_CHECK_FLOPS_PER_THREAD 1e9    /* check.c's fp64 attention */
#define INPUT_SECONDS_PER_ELEMENT   30e-9  /* host_fill_normal, per thread */

typedef enum call_kind { CALL_PLAN, CALL_RUN, CALL_TOPK } call_kind;

/* One call's arguments: the descriptor, tensors, workspace and stream. */
typedef struct call_args {
    sk_attention_desc desc;
    tensors *t;
    topk_state *tk;
    void *ws;
    size_t ws_bytes;
    struct CUstream_st *stream;
} call_args;

static void make_desc(const workload *w, sk_attention_desc *d) {
    check_sk(sk_attention_desc_init(d, sizeof *d), "sk_attention_desc_init");
    d->backend = w->backend;
    d->dtype = w->dtype;
    d->batch = w->batch;
    d->seq_q = w->seq_q;
    d->seq_k = w->seq_k;
    d->heads_q = w->heads_q;
    d->heads_kv = w->heads_kv;
    d->head_dim = w->dim;
    d->mask = w->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    if (w->fp8) { /* the e4m3 codes of the bf16 values; O bf16 */
        d->dtype = SK_DTYPE_E4M3;
        d->out_dtype = SK_DTYPE_BF16;
        d->v_layout = w->v_vt ? SK_V_LAYOUT_VT_FP8 : SK_V_LAYOUT_ROWS;
    }
}

static void call_once(call_kind kind, const call_args *a) {
    tensors *t = a->t;
    switch (kind) {
    case CALL_PLAN:
        check_sk(sk_attention_plan(&a->desc, &t->layout, a->ws, a->ws_bytes, a->stream),
                 "sk_attention_plan");
        break;
    case CALL_RUN: {
        const int fp8 = a->desc.dtype == SK_DTYPE_E4M3; /* --dtype e4m3: the codes */
        check_sk(sk_attention_run(&a->desc, &t->layout, fp8 ? (void *)t->q8 : t->q,
                                  fp8 ? (void *)t->k8 : t->k, fp8 ? (void *)t->v8 : t->v, t->o,
                                  t->lse, a->ws, a->ws_bytes, a->stream),
                 "sk_attention_run");
        break;
    }
    case CALL_TOPK:
        check_sk(sk_attention_topk(&a->desc, &a->tk->desc, t->q, t->k, t->v, t->o, t->lse,
                                   &a->tk->out, a->ws, a->ws_bytes, a->stream),
                 "sk_attention_topk");
        break;
    }
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#ifndef SK_NO_CUDA
/* NVML's energy counter advances in steps of 10-100 ms, so a window of a
 * few timed calls (20 x 5 ms) can read the power off by half or more (an
 * H200 once read 916 W under a 700 W limit). The energy is therefore
 * metered over its own back-to-back calls lasting at least this long,
 * after the timed ones, which keeps the timings themselves unchanged. */
#define ENERGY_WINDOW_MS 2000.0
#define ENERGY_MAX_CALLS 100000

/* Joules per call and mean watts over calls lasting >= ENERGY_WINDOW_MS
 * (call_ms: the measured median), or both left -1 when NVML is absent or
 * the counter did not move. */
static void meter_energy(call_kind kind, const call_args *a, double call_ms, double *energy_j,
                         double *power_w) {
    gpu_energy e;
    int dev = 0;
    unsigned long long mj0 = 0, mj1 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || energy_open(&e, dev) != 0) return;
    double want = call_ms > 0.0 ? ENERGY_WINDOW_MS / call_ms : (double)ENERGY_MAX_CALLS;
    const int calls = want >= ENERGY_MAX_CALLS ? ENERGY_MAX_CALLS : (int)want + 1;
    if (energy_read_mj(&e, &mj0) == 0) {
        const double t0 = now_ms();
        for (int i = 0; i < calls; ++i) call_once(kind, a);
        check_cuda(cudaStreamSynchronize(a->stream), "cudaStreamSynchronize (energy calls)");
        const double window_ms = now_ms() - t0;
        if (energy_read_mj(&e, &mj1) == 0 && mj1 > mj0) {
            *energy_j = (double)(mj1 - mj0) * 1e-3 / calls;
            *power_w = (double)(mj1 - mj0) / window_ms;
        }
    }
    energy_close(&e);
}
#endif

/* Median and minimum milliseconds of w->iters calls after w->warmup untimed
 * ones. label NULL: no progress lines (the plan, which is quick). With
 * energy (a GPU run), also joules per call and mean power (meter_energy),
 * or -1 when unknown. */
static void time_calls(const workload *w, call_kind kind, const call_args *a, const char *label,
                       double *median_ms, double *min_ms, double *energy_j, double *power_w) {
    if (energy_j != NULL) *energy_j = *power_w = -1.0;
    const int total = w->warmup + w->iters;
    double *times = xmalloc((size_t)w->iters * sizeof(double), "the timings");
    if (label != NULL)
        progress_line(1, "timing %s: %d warm-up and %d timed call%s", label, w->warmup, w->iters,
                      w->iters == 1 ? "" : "s");
    if (!w->on_gpu) {
        for (int i = 0; i < total; ++i) {
            const double t0 = now_ms();
            call_once(kind, a);
            if (i >= w->warmup) times[i - w->warmup] = now_ms() - t0;
            if (label != NULL)
                progress_line(i + 1 == total, "%s: call %d of %d done", label, i + 1, total);
        }
    } else {
#ifndef SK_NO_CUDA
        for (int i = 0; i < w->warmup; ++i) call_once(kind, a);
        check_cuda(cudaStreamSynchronize(a->stream), "cudaStreamSynchronize (warm-up)");
        /* Call i lies between events i and i + 1. */
        cudaEvent_t *ev = xmalloc(((size_t)w->iters + 1) * sizeof(cudaEvent_t), "the events");
        for (int i = 0; i <= w->iters; ++i) check_cuda(cudaEventCreate(&ev[i]), "cudaEventCreate");
        check_cuda(cudaEventRecord(ev[0], a->stream), "cudaEventRecord");
        for (int i = 0; i < w->iters; ++i) {
            call_once(kind, a);
            check_cuda(cudaEventRecord(ev[i + 1], a->stream), "cudaEventRecord");
        }
        check_cuda(cudaEventSynchronize(ev[w->iters]), "cudaEventSynchronize (timed calls)");
        check_cuda(cudaGetLastError(), "cudaGetLastError");
        for (int i = 0; i < w->iters; ++i) {
            float ms = 0.0f;
            check_cuda(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "cudaEventElapsedTime");
            times[i] = ms;
        }
        for (int i = 0; i <= w->iters; ++i) cudaEventDestroy(ev[i]);
        free(ev);
        if (label != NULL) progress_line(1, "%s: %d calls done", label, total);
#endif
    }
    qsort(times, (size_t)w->iters, sizeof *times, cmp_double);
    const int n = w->iters;
    *median_ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *min_ms = times[0];
    free(times);
#ifndef SK_NO_CUDA
    if (w->on_gpu && energy_j != NULL) meter_energy(kind, a, *median_ms, energy_j, power_w);
#endif
}

timing run_timed(const workload *w, tensors *t, topk_state *tk, const char *label) {
    timing result;
    memset(&result, 0, sizeof result);
    call_args a;
    memset(&a, 0, sizeof a);
    make_desc(w, &a.desc);
    if (w->fp8) { /* --dtype e4m3: the quantizer's descales */
        a.desc.q_descale = t->q_descale;
        a.desc.k_descale = t->k_descale;
        a.desc.v_descale = t->v_descale;
    }
    a.t = t;
    a.tk = tk;
    if (tk != NULL)
        check_sk(sk_attention_topk_workspace_size(&a.desc, &tk->desc, &a.ws_bytes),
                 "sk_attention_topk_workspace_size");
    else
        check_sk(sk_attention_workspace_size(&a.desc, &t->layout, &a.ws_bytes),
                 "sk_attention_workspace_size");
#ifndef SK_NO_CUDA
    cudaStream_t stream = NULL;
    if (w->on_gpu) {
        check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        a.stream = stream;
        if (a.ws_bytes > 0) check_cuda(cudaMalloc(&a.ws, a.ws_bytes), "cudaMalloc");
    }
#endif
    double unused_min;
    if (tk == NULL) {
        call_once(CALL_PLAN, &a);
        time_calls(w, CALL_PLAN, &a, NULL, &result.plan_ms, &unused_min, NULL, NULL);
    }
    time_calls(w, tk != NULL ? CALL_TOPK : CALL_RUN, &a, label, &result.median_ms, &result.min_ms,
               &result.energy_j_per_call, &result.power_w);
#ifndef SK_NO_CUDA
    if (w->on_gpu) {
        if (a.ws != NULL) cudaFree(a.ws);
        cudaStreamDestroy(stream);
    }
#endif
    return result;
}

double expected_seconds(const workload *w, int64_t blocks_selected) {
    const double threads = (double)omp_get_max_threads();
    const int topk = w->pattern == PAT_TOPK;
    /* topk: the whole call and the attention alone are timed, then one more call is checked. */
    const double calls = (double)(w->warmup + w->iters) * (topk ? 2 : 1) + (topk ? 1 : 0);
    const double flops_per_call =
        4.0 * (double)w->dim * (double)w->block_q * (double)w->block_k * (double)blocks_selected;
    const double run_s =
        calls * flops_per_call / (w->on_gpu ? RATE_GPU_FLOPS : RATE_CPU_FLOPS_PER_THREAD * threads);

    const double q_elems = (double)(w->batch * w->seq_q * w->heads_q * w->dim);
    const double kv_elems = (double)(w->batch * w->seq_k * w->heads_kv * w->dim);
    const double inputs_s = (q_elems + 2.0 * kv_elems) * INPUT_SECONDS_PER_ELEMENT / threads;

    /* The check: per head its rows' selected keys (the mean over the
     * layout) and the regeneration of the head's K and V. */
    const int64_t pairs = w->batch * w->heads_q;
    const double heads = (double)(w->check_heads < pairs ? w->check_heads : pairs);
    const double rows = (double)(w->seq_q < CHECK_MAX_ROWS ? w->seq_q : CHECK_MAX_ROWS);
    const double keys_per_row =
        (double)blocks_selected * w->block_k / ((double)pairs * (double)w->row_blocks);
    const double check_s =
        heads *
        (4.0 * rows * keys_per_row * (double)w->dim / (RATE_CHECK_FLOPS_PER_THREAD * threads) +
         2.0 * (double)(w->seq_k * w->dim) * INPUT_SECONDS_PER_ELEMENT / threads);
    return run_s + inputs_s + check_s;
}
