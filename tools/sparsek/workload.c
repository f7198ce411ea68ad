/*
 * workload.c - `run`'s options resolved against the backend into a
 * workload (defaults: the seed shape on a GPU, a small one on the CPU), its
 * block layout, and its tensors on the host (CPU backend) or the device.
 *
 * Every input element is a pure function of (seed, tensor, packed index)
 * (host_data.h's counter-based generator), so the check regenerates the
 * rows it needs instead of keeping host copies of GPU tensors, and the
 * values do not depend on the number of threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "host_data.h"

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static int64_t opt_or(const run_opts *o, int_flag_id id, int64_t fallback) {
    return o->iset[id] ? o->ival[id] : fallback;
}

/* strided's default stride, round(1 / density), within --stride's range: a
 * density below 1 / (its maximum) is a usage error, as llround of a larger
 * value would overflow (1e-30) or land outside int32 (2.5e-10). */
static int64_t density_stride(double density) {
    const double inverse = 1.0 / density; /* density is in (0, 1]: inverse >= 1 */
    const int_flag *f = &int_flags[OPT_STRIDE];
    if (!(inverse < (double)f->hi + 0.5))
        usage_error("--density %g gives the strided pattern a stride round(1 / density) = %.3g, "
                    "above %s's maximum %lld: give a larger density, or %s",
                    density, inverse, f->name, (long long)f->hi, f->name);
    return llround(inverse);
}

/* The factors of every later int64 product (elements of Q, K, V, O; blocks
 * over all (b, h)) checked in double first: a workload past ~2^63 bytes or
 * blocks stops here, before an estimate or a count could overflow. */
static void check_workload_size(const workload *w) {
    const double es = (double)host_dtype_size(w->dtype);
    const double q = (double)w->batch * (double)w->seq_q * (double)w->heads_q * (double)w->dim * es;
    const double kv =
        (double)w->batch * (double)w->seq_k * (double)w->heads_kv * (double)w->dim * es;
    const double blocks =
        (double)w->batch * (double)w->heads_q * (double)w->row_blocks * (double)w->col_blocks;
    if (q > 9.0e18 || kv > 9.0e18) fail("the tensors are too large (%.3g bytes)", q > kv ? q : kv);
    if (blocks > 9.0e18) fail("the workload has too many blocks (%.3g)", blocks);
}

void resolve_workload(const run_opts *o, int32_t gpu_count, workload *w) {
    memset(w, 0, sizeof *w);
    backend_choice bc = o->backend;
    if (bc == BK_AUTO) {
        bc = gpu_count > 0 ? BK_CUDA : BK_CPU;
        if (bc == BK_CPU)
            fprintf(o->json ? stderr : stdout,
                    "note: no GPU found: running the CPU reference backend, on a smaller default "
                    "workload (B=1, H=4, S=1024, D=64) for the flags not given\n");
    }
    if (bc != BK_CPU && gpu_count == 0) {
#ifdef SK_NO_CUDA
        fail("--backend %s: this sparsek was built without CUDA", backend_choice_names[bc]);
#else
        fail("--backend %s: no GPU found", backend_choice_names[bc]);
#endif
    }
    static const sk_backend ids[BK_COUNT] = {SK_BACKEND_CUDA, SK_BACKEND_CPU, SK_BACKEND_CUDA,
                                             SK_BACKEND_CUDA_SM80, SK_BACKEND_CUDA_SM90};
    static const char *const names[BK_COUNT] = {"cuda", "cpu", "cuda", "cuda-sm80", "cuda-sm90"};
    w->backend = ids[bc];
    w->backend_name = names[bc];
    w->on_gpu = bc != BK_CPU;

    /* Defaults: the seed shape on a GPU, a small one on the CPU. */
    const int gpu = w->on_gpu;
    w->batch = opt_or(o, OPT_BATCH, gpu ? 16 : 1);
    w->heads_q = opt_or(o, OPT_HEADS, gpu ? 96 : 4);
    w->heads_kv = opt_or(o, OPT_HEADS_KV, w->heads_q);
    const int64_t seq = opt_or(o, OPT_SEQ, gpu ? 4096 : 1024);
    w->seq_q = opt_or(o, OPT_SEQ_Q, seq);
    w->seq_k = opt_or(o, OPT_SEQ_K, seq);
    w->dim = opt_or(o, OPT_DIM, gpu ? 128 : 64);
    const int64_t block = opt_or(o, OPT_BLOCK, 128);
    w->block_q = (int32_t)opt_or(o, OPT_BLOCK_Q, block);
    w->block_k = (int32_t)opt_or(o, OPT_BLOCK_K, block);
    w->row_blocks = (int32_t)ceil_div(w->seq_q, w->block_q);
    w->col_blocks = (int32_t)ceil_div(w->seq_k, w->block_k);
    /* e4m3: bf16 values quantized once by sk_quantize_e4m3 (setup_tensors); O bf16. */
    w->fp8 = o->dtype == SK_DTYPE_E4M3;
    w->dtype = w->fp8 ? SK_DTYPE_BF16 : o->dtype;
    w->v_vt = o->v_vt;
    w->pattern = o->pattern;
    w->seed = o->seed;
    w->density_target = o->density;
    w->iters = (int)opt_or(o, OPT_ITERS, gpu ? 20 : 1);
    w->warmup = (int)opt_or(o, OPT_WARMUP, gpu ? 3 : 0);
    w->check_heads = (int)opt_or(o, OPT_CHECK_ROWS, 2);

    if (w->heads_q % w->heads_kv != 0)
        usage_error("--heads-kv %lld must divide --heads %lld", (long long)w->heads_kv,
                    (long long)w->heads_q);
    if (w->dtype == SK_DTYPE_F32 && w->on_gpu)
        usage_error("--dtype f32 is for the CPU backend only (add --backend cpu)");
    if (o->v_layout_set && !w->fp8) usage_error("--v-layout is for --dtype e4m3");
    if (w->fp8 && w->pattern == PAT_TOPK)
        usage_error("--dtype e4m3 runs sk_attention_run on a fixed layout; --pattern topk "
                    "(sk_attention_topk) takes no e4m3 inputs");
    check_workload_size(w);

    const int pattern_causal =
        w->pattern == PAT_CAUSAL || w->pattern == PAT_WINDOW || w->pattern == PAT_SINKS;
    w->causal = o->causal_set ? o->causal : pattern_causal;

    /* Pattern parameters (only the ones the pattern uses are reported). */
    const int64_t density_window = llround(o->density * (double)w->seq_k);
    switch (w->pattern) {
    case PAT_WINDOW:
        w->window = opt_or(o, OPT_WINDOW, density_window);
        break;
    case PAT_SINKS:
        w->window = opt_or(o, OPT_WINDOW, density_window > 1 ? density_window : 1);
        w->sinks = opt_or(o, OPT_SINKS, w->block_k);
        if (w->window < 1) usage_error("--window must be >= 1 for the sinks pattern");
        break;
    case PAT_STRIDED:
        w->stride = o->iset[OPT_STRIDE] ? o->ival[OPT_STRIDE] : density_stride(o->density);
        w->window = opt_or(o, OPT_WINDOW, w->block_k);
        break;
    case PAT_RANDOM:
    case PAT_TOPK: {
        int64_t k = llround(o->density * (double)w->col_blocks);
        if (k < 1) k = 1;
        if (k > w->col_blocks) k = w->col_blocks;
        w->k_per_row = (int32_t)k;
        if (w->pattern == PAT_TOPK) {
            /* --sinks / --window (tokens) are the older spellings of the
             * forced blocks; one of each pair. */
            if (o->iset[OPT_SINK_BLOCKS] && o->iset[OPT_SINKS])
                usage_error("--sinks-blocks and --sinks both set topk's sink blocks: give one");
            if (o->iset[OPT_LOCAL_BLOCKS] && o->iset[OPT_WINDOW])
                usage_error("--local-blocks and --window both set topk's local blocks: give one");
            w->k_per_row = (int32_t)opt_or(o, OPT_TOPK_K, k);
            w->sink_blocks =
                (int32_t)(o->iset[OPT_SINK_BLOCKS] ? o->ival[OPT_SINK_BLOCKS]
                                                   : ceil_div(opt_or(o, OPT_SINKS, 0), w->block_k));
            w->local_blocks = (int32_t)(o->iset[OPT_LOCAL_BLOCKS]
                                            ? o->ival[OPT_LOCAL_BLOCKS]
                                            : ceil_div(opt_or(o, OPT_WINDOW, 0), w->block_k));
            w->per_kv_head = o->per_kv_head;
            if (w->k_per_row == 0 && w->sink_blocks == 0 && w->local_blocks == 0)
                usage_error("--pattern topk with --topk-k 0 and no sink or local blocks selects "
                            "nothing");
        }
        break;
    }
    default:
        break;
    }
    if (w->pattern != PAT_TOPK) {
        static const int_flag_id topk_only[] = {OPT_TOPK_K, OPT_SINK_BLOCKS, OPT_LOCAL_BLOCKS};
        for (int i = 0; i < 3; ++i)
            if (o->iset[topk_only[i]])
                usage_error("%s is for --pattern topk", int_flags[topk_only[i]].name);
        if (o->per_kv_head) usage_error("--per-kv-head is for --pattern topk");
    }

    snprintf(w->device, sizeof w->device, "cpu");
    snprintf(w->kernel, sizeof w->kernel, "CPU reference (fp32 math, fp64 sums, OpenMP)");
    if (w->on_gpu) {
        sk_device_info info;
        check_sk(sk_device_get_info(0, &info), "sk_device_get_info");
        snprintf(w->device, sizeof w->device, "%s", info.name);
        if (w->backend == SK_BACKEND_CUDA)
            snprintf(w->kernel, sizeof w->kernel, "the library's choice for sm_%d%d",
                     (int)info.cc_major, (int)info.cc_minor);
        else
            snprintf(w->kernel, sizeof w->kernel, "%s (forced)",
                     w->backend == SK_BACKEND_CUDA_SM80 ? "sm80 (portable)" : "sm90 (Hopper)");
    }
}

sk_layout_t build_layout(const workload *w) {
    sk_grid grid;
    memset(&grid, 0, sizeof grid);
    grid.rows = w->seq_q;
    grid.cols = w->seq_k;
    grid.block_rows = w->block_q;
    grid.block_cols = w->block_k;
    /* Fixed patterns broadcast one slice; random draws per (b, hq). The topk
     * layout is selected on the backend (run_topk). */
    const int per_head = w->pattern == PAT_RANDOM;
    grid.batch = per_head ? (int32_t)w->batch : 1;
    grid.heads = per_head ? (int32_t)w->heads_q : 1;

    sk_layout_t layout = NULL;
    switch (w->pattern) {
    case PAT_DENSE:
        check_sk(sk_layout_create_dense(&layout, &grid), "sk_layout_create_dense");
        break;
    case PAT_CAUSAL:
        check_sk(sk_layout_create_causal(&layout, &grid), "sk_layout_create_causal");
        break;
    case PAT_WINDOW:
        check_sk(sk_layout_create_window(&layout, &grid, w->window, 0), "sk_layout_create_window");
        break;
    case PAT_SINKS:
        check_sk(sk_layout_create_sinks_window(&layout, &grid, w->sinks, w->window),
                 "sk_layout_create_sinks_window");
        break;
    case PAT_STRIDED:
        check_sk(sk_layout_create_strided(&layout, &grid, (int32_t)w->stride,
                                          (int32_t)ceil_div(w->window, w->block_k), w->causal),
                 "sk_layout_create_strided");
        break;
    case PAT_RANDOM:
        check_sk(sk_layout_create_random(&layout, &grid, w->k_per_row, w->seed, w->causal),
                 "sk_layout_create_random");
        break;
    default:
        fail("internal error: pattern %d", (int)w->pattern);
    }
    return layout;
}

int64_t layout_slice(const sk_bsr *l, const workload *w, int64_t b, int64_t h) {
    const int64_t sb = l->grid.batch == 1 ? 0 : b;
    int64_t sh;
    if (l->grid.heads == 1)
        sh = 0;
    else if (l->grid.heads == w->heads_q)
        sh = h;
    else
        sh = h / (w->heads_q / w->heads_kv);
    return sb * l->grid.heads + sh;
}

int64_t selected_blocks(const sk_bsr *l, const workload *w) {
    const int64_t slices = (int64_t)l->grid.batch * l->grid.heads;
    int64_t mult = l->grid.batch == 1 ? w->batch : 1;
    if (l->grid.heads == 1)
        mult *= w->heads_q;
    else if (l->grid.heads != w->heads_q)
        mult *= w->heads_q / w->heads_kv;
    int64_t total = 0;
    for (int64_t s = 0; s < slices; ++s)
        total +=
            (int64_t)l->row_offsets[(s + 1) * w->row_blocks] - l->row_offsets[s * w->row_blocks];
    return total * mult;
}

static size_t checked_bytes(int64_t a, int64_t b, int64_t c, int64_t d, size_t es, int64_t *elems) {
    double approx = (double)a * (double)b * (double)c * (double)d * (double)es;
    if (approx > 9.0e18 || approx > (double)SIZE_MAX)
        fail("the tensors are too large (%.3g bytes)", approx);
    *elems = a * b * c * d;
    return (size_t)(*elems) * es;
}

/* Host or device memory of the tensors' kind. */
static void *tensor_alloc(const tensors *t, size_t bytes, const char *what) {
    if (!t->on_gpu) return xmalloc(bytes, what);
#ifndef SK_NO_CUDA
    void *p = NULL;
    check_cuda(cudaMalloc(&p, bytes > 0 ? bytes : 16), "cudaMalloc");
    return p;
#else
    fail("internal error: a GPU allocation in a build without CUDA");
#endif
}

static void tensor_free(const tensors *t, void *p) {
    if (!t->on_gpu) {
        free(p);
        return;
    }
#ifndef SK_NO_CUDA
    cudaFree(p);
#endif
}

/* --dtype e4m3: Q, K and V quantized by sk_quantize_e4m3 on the run's
 * backend (per (b, h) descales; V as rows or V^T), on the legacy stream
 * (setup_tensors synchronises after). */
static void quantize_inputs(const workload *w, tensors *t) {
    sk_quantize_desc d;
    check_sk(sk_quantize_desc_init(&d, sizeof d), "sk_quantize_desc_init");
    d.backend = w->backend;
    d.dtype = w->dtype;
    d.batch = w->batch;
    d.head_dim = w->dim;
    int64_t vt_elems = t->kv_elems;
    if (w->v_vt)
        check_sk(sk_quantize_vt_elems(w->batch, w->seq_k, w->heads_kv, w->dim, &vt_elems),
                 "sk_quantize_vt_elems");
    t->q8 = tensor_alloc(t, (size_t)t->q_elems, "Q codes");
    t->k8 = tensor_alloc(t, (size_t)t->kv_elems, "K codes");
    t->v8 = tensor_alloc(t, (size_t)vt_elems, "V codes");
    t->q_descale = tensor_alloc(t, (size_t)(w->batch * w->heads_q) * sizeof(float), "descales");
    t->k_descale = tensor_alloc(t, (size_t)(w->batch * w->heads_kv) * sizeof(float), "descales");
    t->v_descale = tensor_alloc(t, (size_t)(w->batch * w->heads_kv) * sizeof(float), "descales");
    const struct {
        const void *x;
        uint8_t *y;
        float *descale;
        int64_t seq, heads;
        int32_t layout;
    } jobs[3] = {{t->q, t->q8, t->q_descale, w->seq_q, w->heads_q, SK_QUANT_LAYOUT_ROWS},
                 {t->k, t->k8, t->k_descale, w->seq_k, w->heads_kv, SK_QUANT_LAYOUT_ROWS},
                 {t->v, t->v8, t->v_descale, w->seq_k, w->heads_kv,
                  w->v_vt ? SK_QUANT_LAYOUT_VT_FP8 : SK_QUANT_LAYOUT_ROWS}};
    for (int j = 0; j < 3; ++j) {
        d.seq = jobs[j].seq;
        d.heads = jobs[j].heads;
        d.layout = jobs[j].layout;
        size_t ws_bytes = 0;
        check_sk(sk_quantize_e4m3_workspace_size(&d, &ws_bytes), "sk_quantize_e4m3_workspace_size");
        void *ws = ws_bytes > 0 ? tensor_alloc(t, ws_bytes, "the quantizer's workspace") : NULL;
        check_sk(sk_quantize_e4m3(&d, jobs[j].x, jobs[j].y, jobs[j].descale, ws, ws_bytes, NULL),
                 "sk_quantize_e4m3");
#ifndef SK_NO_CUDA
        if (t->on_gpu) check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (quantizer)");
#endif
        if (ws != NULL) tensor_free(t, ws);
    }
}

#ifndef SK_NO_CUDA
/* The layout arrays of host into device memory: dev keeps host's grid and nnz. */
static void upload_layout(const sk_bsr *host, sk_bsr *dev) {
    int32_t rb, cb, slices;
    check_sk(sk_grid_blocks(&host->grid, &rb, &cb, &slices), "sk_grid_blocks");
    const size_t off_bytes = ((size_t)slices * (size_t)rb + 1) * sizeof(int32_t);
    const size_t idx_bytes = (size_t)host->nnz * sizeof(int32_t);
    check_cuda(cudaMalloc((void **)&dev->row_offsets, off_bytes), "cudaMalloc");
    check_cuda(cudaMalloc((void **)&dev->col_indices, idx_bytes > 0 ? idx_bytes : 4), "cudaMalloc");
    check_cuda(cudaMemcpy(dev->row_offsets, host->row_offsets, off_bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy");
    if (idx_bytes > 0)
        check_cuda(
            cudaMemcpy(dev->col_indices, host->col_indices, idx_bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy");
}
#endif

/* host_layout NULL (topk): no layout is uploaded; t->layout is set later. */
void setup_tensors(const workload *w, const sk_bsr *host_layout, tensors *t) {
    memset(t, 0, sizeof *t);
    t->on_gpu = w->on_gpu;
    const size_t es = host_dtype_size(w->dtype);
    const size_t q_bytes = checked_bytes(w->batch, w->seq_q, w->heads_q, w->dim, es, &t->q_elems);
    const size_t kv_bytes =
        checked_bytes(w->batch, w->seq_k, w->heads_kv, w->dim, es, &t->kv_elems);
    const size_t lse_bytes = checked_bytes(w->batch, w->heads_q, w->seq_q, 1, 4, &t->lse_elems);
    if (host_layout != NULL) t->layout = *host_layout;
    const double t0 = progress_elapsed();
    progress_line(1, "generating Q, K and V (%.2f GiB)%s",
                  (double)(q_bytes + 2 * kv_bytes) / (1 << 30),
                  w->on_gpu ? " and uploading them" : "");

    if (!w->on_gpu) {
        t->q = xmalloc(q_bytes, "Q");
        t->k = xmalloc(kv_bytes, "K");
        t->v = xmalloc(kv_bytes, "V");
        t->o = xmalloc(q_bytes, "O");
        t->lse = xmalloc(lse_bytes, "LSE");
        host_fill_normal(t->q, w->dtype, t->q_elems, w->seed, GEN_Q);
        host_fill_normal(t->k, w->dtype, t->kv_elems, w->seed, GEN_K);
        host_fill_normal(t->v, w->dtype, t->kv_elems, w->seed, GEN_V);
        if (w->fp8) quantize_inputs(w, t);
        poison_outputs(w, t); /* NaN: an unwritten element fails the check */
    } else {
#ifndef SK_NO_CUDA
        check_cuda(cudaMalloc(&t->q, q_bytes), "cudaMalloc");
        check_cuda(cudaMalloc(&t->k, kv_bytes), "cudaMalloc");
        check_cuda(cudaMalloc(&t->v, kv_bytes), "cudaMalloc");
        check_cuda(cudaMalloc(&t->o, q_bytes), "cudaMalloc");
        check_cuda(cudaMalloc((void **)&t->lse, lse_bytes), "cudaMalloc");
        /* One host staging buffer, filled and uploaded per tensor. */
        void *stage = xmalloc(q_bytes > kv_bytes ? q_bytes : kv_bytes, "the upload buffer");
        host_fill_normal(stage, w->dtype, t->q_elems, w->seed, GEN_Q);
        check_cuda(cudaMemcpy(t->q, stage, q_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        host_fill_normal(stage, w->dtype, t->kv_elems, w->seed, GEN_K);
        check_cuda(cudaMemcpy(t->k, stage, kv_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        host_fill_normal(stage, w->dtype, t->kv_elems, w->seed, GEN_V);
        check_cuda(cudaMemcpy(t->v, stage, kv_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        free(stage);
        if (host_layout != NULL) upload_layout(host_layout, &t->layout);
        if (w->fp8) quantize_inputs(w, t);
        /* NaN, then a synchronisation: the memsets and copies ran on the legacy
         * stream, which the timing stream (non-blocking) does not wait for. */
        poison_outputs(w, t);
#else
        fail("internal error: a GPU run in a build without CUDA");
#endif
    }
    progress_line(1, "workload built in %.1f s", progress_elapsed() - t0);
}

void free_tensors(tensors *t) {
    void *fp8[] = {t->q8, t->k8, t->v8, t->q_descale, t->k_descale, t->v_descale};
    for (int i = 0; i < 6; ++i)
        if (fp8[i] != NULL) tensor_free(t, fp8[i]);
    if (!t->on_gpu) {
        free(t->q);
        free(t->k);
        free(t->v);
        free(t->o);
        free(t->lse);
        return;
    }
#ifndef SK_NO_CUDA
    cudaFree(t->q);
    cudaFree(t->k);
    cudaFree(t->v);
    cudaFree(t->o);
    cudaFree(t->lse);
    cudaFree(t->layout.row_offsets);
    cudaFree(t->layout.col_indices);
#endif
}

/* Rows q0 .. q0+rows-1 of head (b, h) of O into dst [rows, D] (dtype), and
 * the matching LSE entries into lse_dst [rows]. */
void fetch_head(const workload *w, const tensors *t, int64_t b, int64_t h, int64_t q0, int64_t rows,
                void *dst, float *lse_dst) {
    const size_t es = host_dtype_size(w->dtype);
    const size_t row_bytes = (size_t)w->dim * es;
    const size_t pitch = (size_t)(w->heads_q * w->dim) * es;
    const size_t first = (size_t)(((b * w->seq_q + q0) * w->heads_q + h) * w->dim) * es;
    const size_t lse_first = (size_t)((b * w->heads_q + h) * w->seq_q + q0);
    if (!t->on_gpu) {
        for (int64_t r = 0; r < rows; ++r)
            memcpy((char *)dst + (size_t)r * row_bytes,
                   (const char *)t->o + first + (size_t)r * pitch, row_bytes);
        memcpy(lse_dst, t->lse + lse_first, (size_t)rows * sizeof(float));
        return;
    }
#ifndef SK_NO_CUDA
    check_cuda(cudaMemcpy2D(dst, row_bytes, (const char *)t->o + first, pitch, row_bytes,
                            (size_t)rows, cudaMemcpyDeviceToHost),
               "cudaMemcpy2D");
    check_cuda(cudaMemcpy(lse_dst, t->lse + lse_first, (size_t)rows * sizeof(float),
                          cudaMemcpyDeviceToHost),
               "cudaMemcpy");
#endif
}

/* NaN into O and LSE again, so that an element the next call does not
 * write fails the check. */
void poison_outputs(const workload *w, tensors *t) {
    const size_t q_bytes = (size_t)t->q_elems * host_dtype_size(w->dtype);
    const size_t lse_bytes = (size_t)t->lse_elems * sizeof(float);
    if (!t->on_gpu) {
        memset(t->o, 0xff, q_bytes);
        memset(t->lse, 0xff, lse_bytes);
        return;
    }
#ifndef SK_NO_CUDA
    check_cuda(cudaMemset(t->o, 0xff, q_bytes), "cudaMemset");
    check_cuda(cudaMemset(t->lse, 0xff, lse_bytes), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}
