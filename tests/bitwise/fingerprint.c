/*
 * fingerprint.c - a hash of every GPU output of the public API on a fixed
 * set of cases, for changes that must not change results (moves, renames,
 * splits of kernel files: issue 26's "bitwise the same").
 *
 * It uses only include/sparsek.h and the CUDA runtime, so the same source
 * links against the library before and after a change; the two outputs
 * must then be identical line for line:
 *   build/sk_fingerprint > after.txt; <old build>/sk_fingerprint > before.txt
 *   diff before.txt after.txt
 * Each line: backend, case, output, status name, FNV-1a 64 of the bytes.
 * Inputs come from a fixed splitmix64 stream (no seed to choose: the point
 * is the same inputs on both sides). Every output buffer is filled with
 * 0xFF bytes (NaN) before its call, so an element left unwritten hashes the
 * same only if it is left unwritten on both sides. A layout written by the
 * top-k selection is hashed up to its real count (row_offsets[last]): the
 * entries past it are unspecified.
 * Cases cover: attention on every layout builder, masks, tails, GQA,
 * per-head and per-KV-head layouts, padded strides, empty rows, blocks 64
 * and 128, D 64 and 128, fp16 and bf16; the BSR GEMM in both B orders and
 * three C types; the top-k pooling, selection (also over 1024 and 2048 key
 * blocks, with NaN / -inf scores, with group sums, D = 256), the fused pool
 * + select and sk_attention_topk. Each runs on SK_BACKEND_CUDA,
 * SK_BACKEND_CUDA_SM80 and SK_BACKEND_CUDA_SM90 (a status other than
 * SUCCESS is printed as such: it must match too).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cuda_runtime_api.h>
#pragma GCC diagnostic pop

#include "host_data.h"
#include "sparsek.h"

/* ------------------------------------------------------------------------
 * Small utilities
 * ---------------------------------------------------------------------- */

static void die(const char *what, const char *why) {
    fprintf(stderr, "sk_fingerprint: %s: %s\n", what, why);
    exit(2);
}

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) die(what, cudaGetErrorName(e));
}

static uint64_t rng_state = 0x5eed5eed12345678ull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-2, 2): 24 random bits. */
static float rng_value(void) {
    return (float)((double)(rng_next() >> 40) / (double)(1 << 24) * 4.0 - 2.0);
}

/* n random elements of dtype t on the device. */
static void *dev_random(sk_dtype t, size_t n) {
    const size_t es = host_dtype_size(t);
    unsigned char *h = malloc(n * es + 1);
    if (!h) die("malloc", "out of memory");
    for (size_t i = 0; i < n; ++i) host_store(h, t, (int64_t)i, rng_value());
    void *d = NULL;
    cuda_ok(cudaMalloc(&d, n * es + 1), "cudaMalloc");
    cuda_ok(cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(h);
    return d;
}

static void *dev_poisoned(size_t bytes) {
    void *d = NULL;
    cuda_ok(cudaMalloc(&d, bytes + 1), "cudaMalloc");
    cuda_ok(cudaMemset(d, 0xff, bytes + 1), "cudaMemset");
    return d;
}

static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    cuda_ok(cudaMalloc(&d, bytes + 1), "cudaMalloc");
    cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static const char *backend_label(sk_backend b) {
    return b == SK_BACKEND_CUDA ? "cuda" : b == SK_BACKEND_CUDA_SM80 ? "sm80" : "sm90";
}

/* One line: the status, and the hash of `bytes` device bytes when it is
 * SUCCESS (the buffer is read after the device has finished). */
static void emit(sk_backend b, const char *name, const char *what, sk_status s, const void *dev,
                 size_t bytes) {
    if (s != SK_STATUS_SUCCESS) {
        printf("%s %s %s %s\n", backend_label(b), name, what, sk_status_name(s));
        return;
    }
    cuda_ok(cudaDeviceSynchronize(), name);
    unsigned char *h = malloc(bytes + 1);
    if (!h) die("malloc", "out of memory");
    cuda_ok(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    printf("%s %s %s SUCCESS %016llx\n", backend_label(b), name, what,
           (unsigned long long)fnv1a(h, bytes));
    free(h);
}

/* A device layout's arrays up to the real count, as one hash line each. */
static void emit_layout(sk_backend b, const char *name, sk_status s, const sk_bsr *l) {
    if (s != SK_STATUS_SUCCESS) {
        emit(b, name, "layout", s, NULL, 0);
        return;
    }
    int32_t slices = 0, rows = 0;
    if (sk_grid_blocks(&l->grid, &rows, NULL, &slices) != SK_STATUS_SUCCESS) die(name, "grid");
    const size_t n_off = (size_t)slices * (size_t)rows + 1;
    int32_t last = 0;
    cuda_ok(cudaDeviceSynchronize(), name);
    cuda_ok(cudaMemcpy(&last, l->row_offsets + n_off - 1, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (last < 0 || last > l->nnz) last = l->nnz;
    emit(b, name, "row_offsets", s, l->row_offsets, n_off * 4);
    emit(b, name, "col_indices", s, l->col_indices, (size_t)last * 4);
}

/* ------------------------------------------------------------------------
 * Attention
 * ---------------------------------------------------------------------- */

typedef enum {
    L_DENSE,
    L_CAUSAL,
    L_WINDOW,
    L_SINKS,
    L_STRIDED,
    L_RANDOM,
    L_EMPTY_ROWS
} layout_kind;

typedef struct attn_case {
    const char *name;
    sk_dtype dtype;
    int64_t b, sq, sk, hq, hkv, d;
    int32_t bq, bk;
    int causal;
    layout_kind kind;
    int32_t lbatch, lheads; /* layout slices */
    int pad;                /* head stride D + 8 and a padded sequence stride */
} attn_case;

static const attn_case attn_cases[] = {
    {"attn_f16_causal_d128_b128", SK_DTYPE_F16, 2, 1000, 1000, 4, 2, 128, 128, 128, 1, L_CAUSAL, 1,
     1, 0},
    {"attn_bf16_random_d64_b64_perhead", SK_DTYPE_BF16, 1, 777, 1500, 6, 2, 64, 64, 64, 1, L_RANDOM,
     1, 6, 0},
    {"attn_f16_window_d128_b64x128", SK_DTYPE_F16, 2, 513, 2049, 2, 1, 128, 64, 128, 0, L_WINDOW, 1,
     1, 0},
    {"attn_bf16_sinks_d128_b128x64_perkv", SK_DTYPE_BF16, 2, 1024, 1024, 8, 2, 128, 128, 64, 1,
     L_SINKS, 2, 2, 0},
    {"attn_f16_strided_d64_b128", SK_DTYPE_F16, 1, 1920, 1920, 4, 4, 64, 128, 128, 1, L_STRIDED, 1,
     4, 0},
    {"attn_f16_empty_rows_d64_b128", SK_DTYPE_F16, 1, 640, 700, 2, 2, 64, 128, 128, 0, L_EMPTY_ROWS,
     1, 2, 0},
    {"attn_bf16_padded_d128_b128", SK_DTYPE_BF16, 2, 900, 1100, 4, 4, 128, 128, 128, 0, L_RANDOM, 2,
     4, 1},
    {"attn_f16_dense_d64_b128_long", SK_DTYPE_F16, 1, 4096, 4096, 4, 1, 64, 128, 128, 0, L_DENSE, 1,
     1, 0},
    {"attn_bf16_causal_d128_b128_long", SK_DTYPE_BF16, 1, 8192, 8192, 2, 2, 128, 128, 128, 1,
     L_CAUSAL, 1, 1, 0},
    {"attn_bf16_random_d128_b64", SK_DTYPE_BF16, 2, 1000, 1000, 4, 2, 128, 64, 64, 0, L_RANDOM, 1,
     2, 0},
};

static sk_layout_t build_attn_layout(const attn_case *c) {
    sk_grid g = {c->sq, c->sk, c->bq, c->bk, c->lbatch, c->lheads};
    sk_layout_t l = NULL;
    sk_status s = SK_STATUS_SUCCESS;
    switch (c->kind) {
    case L_DENSE:
        s = sk_layout_create_dense(&l, &g);
        break;
    case L_CAUSAL:
        s = sk_layout_create_causal(&l, &g);
        break;
    case L_WINDOW:
        s = sk_layout_create_window(&l, &g, 300, 200);
        break;
    case L_SINKS:
        s = sk_layout_create_sinks_window(&l, &g, 64, 384);
        break;
    case L_STRIDED:
        s = sk_layout_create_strided(&l, &g, 3, 2, c->causal);
        break;
    case L_RANDOM:
        s = sk_layout_create_random(&l, &g, 3, 99, c->causal);
        break;
    case L_EMPTY_ROWS: {
        int32_t rows = 0, cols = 0, slices = 0;
        if (sk_grid_blocks(&g, &rows, &cols, &slices) != SK_STATUS_SUCCESS) die(c->name, "grid");
        const size_t n = (size_t)slices * (size_t)rows * (size_t)cols;
        uint8_t *m = malloc(n);
        if (!m) die("malloc", "out of memory");
        for (size_t i = 0; i < n; ++i) {
            const size_t row = i / (size_t)cols;
            m[i] = (uint8_t)(row % 3 == 1 ? 0 : (rng_next() & 1)); /* every third row empty */
        }
        s = sk_layout_create_from_mask(&l, &g, m);
        free(m);
        break;
    }
    }
    if (s != SK_STATUS_SUCCESS) die(c->name, sk_last_error());
    return l;
}

/* Copies a host layout's arrays to the device; the view keeps the grid. */
static sk_bsr upload_layout(sk_layout_t l) {
    sk_bsr h, d;
    if (sk_layout_view(l, &h) != SK_STATUS_SUCCESS) die("layout", sk_last_error());
    int32_t rows = 0, slices = 0;
    if (sk_grid_blocks(&h.grid, &rows, NULL, &slices) != SK_STATUS_SUCCESS) die("layout", "grid");
    d = h;
    d.row_offsets = dev_copy(h.row_offsets, ((size_t)slices * (size_t)rows + 1) * 4);
    d.col_indices = dev_copy(h.col_indices, (size_t)(h.nnz > 0 ? h.nnz : 1) * 4);
    return d;
}

static void run_attn_case(const attn_case *c, sk_backend backend) {
    sk_layout_t hl = build_attn_layout(c);
    sk_bsr l = upload_layout(hl);
    sk_attention_desc desc;
    sk_attention_desc_init(&desc, sizeof desc);
    desc.backend = backend;
    desc.dtype = c->dtype;
    desc.batch = c->b;
    desc.seq_q = c->sq;
    desc.seq_k = c->sk;
    desc.heads_q = c->hq;
    desc.heads_kv = c->hkv;
    desc.head_dim = c->d;
    desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    const int64_t hs = c->pad ? c->d + 8 : c->d; /* head stride */
    const int64_t qs = c->hq * hs + (c->pad ? 16 : 0), ks = c->hkv * hs + (c->pad ? 24 : 0);
    if (c->pad) {
        const int64_t q3[3] = {c->sq * qs, qs, hs}, k3[3] = {c->sk * ks, ks, hs};
        memcpy(desc.q_strides, q3, sizeof q3);
        memcpy(desc.o_strides, q3, sizeof q3);
        memcpy(desc.k_strides, k3, sizeof k3);
        memcpy(desc.v_strides, k3, sizeof k3);
    }
    const size_t nq = (size_t)(c->b * c->sq * qs), nk = (size_t)(c->b * c->sk * ks);
    void *q = dev_random(c->dtype, nq), *k = dev_random(c->dtype, nk),
         *v = dev_random(c->dtype, nk);
    const size_t o_bytes = nq * host_dtype_size(c->dtype),
                 lse_bytes = (size_t)(c->b * c->hq * c->sq) * 4;
    void *o = dev_poisoned(o_bytes);
    float *lse = dev_poisoned(lse_bytes);
    size_t ws_bytes = 0;
    void *ws = NULL;
    sk_status s = sk_attention_workspace_size(&desc, &l, &ws_bytes);
    if (s == SK_STATUS_SUCCESS && ws_bytes) ws = dev_poisoned(ws_bytes);
    if (s == SK_STATUS_SUCCESS)
        s = sk_attention_forward(&desc, &l, q, k, v, o, lse, ws, ws_bytes, NULL);
    emit(backend, c->name, "o", s, o, o_bytes);
    emit(backend, c->name, "lse", s, lse, lse_bytes);
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(ws);
    cudaFree(l.row_offsets);
    cudaFree(l.col_indices);
    sk_layout_destroy(hl);
}

/* ------------------------------------------------------------------------
 * BSR GEMM
 * ---------------------------------------------------------------------- */

typedef struct gemm_case {
    const char *name;
    sk_dtype ab, c;
    int64_t m, n, k;
    int32_t bm, bk;
    sk_order order;
    float alpha, beta;
} gemm_case;

static const gemm_case gemm_cases[] = {
    {"gemm_f16_f32c_rowB_b128x64", SK_DTYPE_F16, SK_DTYPE_F32, 1000, 384, 700, 128, 64,
     SK_ORDER_ROW_MAJOR, 1.5f, 0.0f},
    {"gemm_bf16_bf16c_colB_b64x128", SK_DTYPE_BF16, SK_DTYPE_BF16, 513, 256, 1024, 64, 128,
     SK_ORDER_COL_MAJOR, 1.0f, 0.5f},
    {"gemm_f16_f16c_rowB_b64", SK_DTYPE_F16, SK_DTYPE_F16, 256, 192, 256, 64, 64,
     SK_ORDER_ROW_MAJOR, -0.75f, 0.25f},
    {"gemm_bf16_f32c_rowB_b128_big", SK_DTYPE_BF16, SK_DTYPE_F32, 2048, 1024, 2048, 128, 128,
     SK_ORDER_ROW_MAJOR, 1.0f, 1.0f},
};

static void run_gemm_case(const gemm_case *c, sk_backend backend) {
    sk_grid g = {c->m, c->k, c->bm, c->bk, 1, 1};
    sk_layout_t hl = NULL;
    if (sk_layout_create_random(&hl, &g, 4, 7, 0) != SK_STATUS_SUCCESS)
        die(c->name, sk_last_error());
    sk_bsr l = upload_layout(hl);
    sk_bsr_gemm_desc desc;
    sk_bsr_gemm_desc_init(&desc, sizeof desc);
    desc.backend = backend;
    desc.ab_dtype = c->ab;
    desc.c_dtype = c->c;
    desc.m = c->m;
    desc.n = c->n;
    desc.k = c->k;
    desc.b_order = c->order;
    desc.alpha = c->alpha;
    desc.beta = c->beta;
    void *a = dev_random(c->ab, (size_t)l.nnz * (size_t)c->bm * (size_t)c->bk);
    void *b = dev_random(c->ab, (size_t)(c->k * c->n));
    const size_t c_bytes = (size_t)(c->m * c->n) * host_dtype_size(c->c);
    void *cm = dev_random(c->c, (size_t)(c->m * c->n)); /* read when beta != 0 */
    size_t ws_bytes = 0;
    void *ws = NULL;
    sk_status s = sk_bsr_gemm_workspace_size(&desc, &l, &ws_bytes);
    if (s == SK_STATUS_SUCCESS && ws_bytes) ws = dev_poisoned(ws_bytes);
    if (s == SK_STATUS_SUCCESS) s = sk_bsr_gemm(&desc, &l, a, b, cm, ws, ws_bytes, NULL);
    emit(backend, c->name, "c", s, cm, c_bytes);
    cudaFree(a);
    cudaFree(b);
    cudaFree(cm);
    cudaFree(ws);
    cudaFree(l.row_offsets);
    cudaFree(l.col_indices);
    sk_layout_destroy(hl);
}

/* ------------------------------------------------------------------------
 * Top-k selection
 * ---------------------------------------------------------------------- */

typedef enum { T_POOL_SELECT, T_FUSED, T_FROM_SCORES, T_ATTENTION } topk_path;

typedef struct topk_case {
    const char *name;
    topk_path path;
    sk_dtype dtype;
    int64_t b, sq, sk, hq, hkv, d;
    int32_t bq, bk, k, sinks, local;
    int causal, per_kv_head;
} topk_case;

static const topk_case topk_cases[] = {
    {"topk_pool_select_f16_d128_b128", T_POOL_SELECT, SK_DTYPE_F16, 2, 1000, 1300, 4, 2, 128, 128,
     128, 4, 1, 2, 1, 0},
    {"topk_pool_select_groupsum_bf16_d128", T_POOL_SELECT, SK_DTYPE_BF16, 1, 2048, 2048, 8, 2, 128,
     128, 128, 3, 0, 1, 1, 1},
    {"topk_pool_select_f16_d256_b64", T_POOL_SELECT, SK_DTYPE_F16, 1, 1024, 1500, 2, 2, 256, 64, 64,
     5, 2, 2, 0, 0},
    {"topk_pool_select_bf16_d64_b64", T_POOL_SELECT, SK_DTYPE_BF16, 1, 4096, 4096, 4, 4, 64, 64, 64,
     8, 2, 4, 1, 0},
    {"topk_fused_bf16_d64_b64", T_FUSED, SK_DTYPE_BF16, 1, 4096, 4096, 4, 4, 64, 64, 64, 8, 2, 4, 1,
     0},
    {"topk_fused_f16_d128_b128_perkv1", T_FUSED, SK_DTYPE_F16, 2, 3000, 3000, 4, 4, 128, 128, 128,
     6, 1, 2, 1, 1},
    {"topk_fused_f16_d128_groupsum", T_FUSED, SK_DTYPE_F16, 1, 2048, 2560, 8, 2, 128, 128, 64, 4, 1,
     1, 1, 1},
    {"topk_scores_k3_1500cols", T_FROM_SCORES, SK_DTYPE_F16, 1, 512, 96000, 2, 2, 64, 128, 64, 3, 1,
     2, 0, 0},
    {"topk_scores_k16_2000cols_causal", T_FROM_SCORES, SK_DTYPE_F16, 1, 128000, 128000, 1, 1, 64,
     64, 64, 16, 2, 8, 1, 0},
    {"topk_scores_k40_2100cols", T_FROM_SCORES, SK_DTYPE_F16, 1, 256, 134400, 2, 2, 64, 128, 64, 40,
     0, 0, 0, 0},
    {"topk_attention_f16_d128_b128", T_ATTENTION, SK_DTYPE_F16, 1, 2048, 2048, 4, 2, 128, 128, 128,
     4, 1, 2, 1, 0},
    {"topk_attention_bf16_d64_b64_perkv", T_ATTENTION, SK_DTYPE_BF16, 2, 1500, 1500, 4, 2, 64, 64,
     64, 3, 1, 1, 1, 1},
};

static void topk_desc_of(const topk_case *c, sk_backend backend, sk_topk_desc *t) {
    sk_topk_desc_init(t, sizeof *t);
    t->backend = backend;
    t->dtype = c->dtype;
    t->batch = c->b;
    t->seq_q = c->sq;
    t->seq_k = c->sk;
    t->heads_q = c->hq;
    t->heads_kv = c->hkv;
    t->head_dim = c->d;
    t->block_q = c->bq;
    t->block_k = c->bk;
    t->k = c->k;
    t->sink_blocks = c->sinks;
    t->local_blocks = c->local;
    t->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    t->per_kv_head = c->per_kv_head;
}

/* Device layout buffers of the selection's capacity, poisoned. */
static sk_bsr alloc_topk_layout(const sk_topk_desc *t, const char *name) {
    sk_bsr l;
    memset(&l, 0, sizeof l);
    int32_t cap = 0, rows = 0, slices = 0;
    if (sk_topk_layout_capacity(t, &l.grid, &cap) != SK_STATUS_SUCCESS) die(name, sk_last_error());
    if (sk_grid_blocks(&l.grid, &rows, NULL, &slices) != SK_STATUS_SUCCESS) die(name, "grid");
    l.row_offsets = dev_poisoned(((size_t)slices * (size_t)rows + 1) * 4);
    l.col_indices = dev_poisoned((size_t)(cap > 0 ? cap : 1) * 4);
    return l;
}

/* Scores [slices, rows, cols] with a sprinkling of NaN and -inf. */
static float *dev_scores(const sk_grid *g, size_t *n_out) {
    int32_t rows = 0, cols = 0, slices = 0;
    if (sk_grid_blocks(g, &rows, &cols, &slices) != SK_STATUS_SUCCESS) die("scores", "grid");
    const size_t n = (size_t)slices * (size_t)rows * (size_t)cols;
    float *h = malloc(n * 4 + 4);
    if (!h) die("malloc", "out of memory");
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng_next();
        h[i] = (r & 63) == 0 ? -1.0f / 0.0f : (r & 63) == 1 ? 0.0f / 0.0f : rng_value();
        if ((r & 63) == 2 && i > 0) h[i] = h[i - 1]; /* ties */
    }
    float *d = dev_copy(h, n * 4);
    free(h);
    *n_out = n;
    return d;
}

static void run_topk_case(const topk_case *c, sk_backend backend) {
    sk_topk_desc t;
    topk_desc_of(c, backend, &t);
    sk_bsr l = alloc_topk_layout(&t, c->name);
    void *q = NULL, *k = NULL, *ws = NULL;
    size_t ws_bytes = 0;
    sk_status s = SK_STATUS_SUCCESS;
    if (c->path != T_FROM_SCORES) {
        q = dev_random(c->dtype, (size_t)(c->b * c->sq * c->hq * c->d));
        k = dev_random(c->dtype, (size_t)(c->b * c->sk * c->hkv * c->d));
    }
    if (c->path == T_POOL_SELECT) {
        const int64_t rb = (c->sq + c->bq - 1) / c->bq, cb = (c->sk + c->bk - 1) / c->bk;
        const size_t pq_bytes = (size_t)(c->b * c->hq * rb * c->d) * 4;
        const size_t pk_bytes = (size_t)(c->b * c->hkv * cb * c->d) * 4;
        float *pq = dev_poisoned(pq_bytes), *pk = dev_poisoned(pk_bytes);
        s = sk_block_pool(&t, q, k, pq, pk, NULL);
        emit(backend, c->name, "pooled_q", s, pq, pq_bytes);
        emit(backend, c->name, "pooled_k", s, pk, pk_bytes);
        if (s == SK_STATUS_SUCCESS) s = sk_topk_workspace_size(&t, &ws_bytes);
        if (s == SK_STATUS_SUCCESS && ws_bytes) ws = dev_poisoned(ws_bytes);
        if (s == SK_STATUS_SUCCESS) s = sk_select_topk(&t, pq, pk, &l, ws, ws_bytes, NULL);
        emit_layout(backend, c->name, s, &l);
        cudaFree(pq);
        cudaFree(pk);
    } else if (c->path == T_FUSED) {
        s = sk_pool_select_topk_workspace_size(&t, &ws_bytes);
        if (s == SK_STATUS_SUCCESS && ws_bytes) ws = dev_poisoned(ws_bytes);
        if (s == SK_STATUS_SUCCESS) s = sk_pool_select_topk(&t, q, k, &l, ws, ws_bytes, NULL);
        emit_layout(backend, c->name, s, &l);
    } else if (c->path == T_FROM_SCORES) {
        size_t n = 0;
        float *scores = dev_scores(&l.grid, &n);
        s = sk_topk_workspace_size(&t, &ws_bytes);
        if (s == SK_STATUS_SUCCESS && ws_bytes) ws = dev_poisoned(ws_bytes);
        if (s == SK_STATUS_SUCCESS) s = sk_layout_from_scores(&t, scores, &l, ws, ws_bytes, NULL);
        emit_layout(backend, c->name, s, &l);
        cudaFree(scores);
    } else {
        sk_attention_desc a;
        sk_attention_desc_init(&a, sizeof a);
        a.backend = backend;
        a.dtype = c->dtype;
        a.batch = c->b;
        a.seq_q = c->sq;
        a.seq_k = c->sk;
        a.heads_q = c->hq;
        a.heads_kv = c->hkv;
        a.head_dim = c->d;
        a.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
        void *v = dev_random(c->dtype, (size_t)(c->b * c->sk * c->hkv * c->d));
        const size_t o_bytes = (size_t)(c->b * c->sq * c->hq * c->d) * 2;
        const size_t lse_bytes = (size_t)(c->b * c->hq * c->sq) * 4;
        void *o = dev_poisoned(o_bytes);
        float *lse = dev_poisoned(lse_bytes);
        s = sk_attention_topk_workspace_size(&a, &t, &ws_bytes);
        if (s == SK_STATUS_SUCCESS && ws_bytes) ws = dev_poisoned(ws_bytes);
        if (s == SK_STATUS_SUCCESS)
            s = sk_attention_topk(&a, &t, q, k, v, o, lse, &l, ws, ws_bytes, NULL);
        emit(backend, c->name, "o", s, o, o_bytes);
        emit(backend, c->name, "lse", s, lse, lse_bytes);
        emit_layout(backend, c->name, s, &l);
        cudaFree(v);
        cudaFree(o);
        cudaFree(lse);
    }
    cudaFree(q);
    cudaFree(k);
    cudaFree(ws);
    cudaFree(l.row_offsets);
    cudaFree(l.col_indices);
}

int main(void) {
    int32_t count = 0;
    if (sk_device_count(&count) != SK_STATUS_SUCCESS || count < 1) die("sk_device_count", "no GPU");
    const sk_backend backends[] = {SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80, SK_BACKEND_CUDA_SM90};
    for (size_t bi = 0; bi < sizeof backends / sizeof backends[0]; ++bi) {
        rng_state = 0x5eed5eed12345678ull; /* the same inputs for every backend */
        for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; ++i)
            run_attn_case(&attn_cases[i], backends[bi]);
        for (size_t i = 0; i < sizeof gemm_cases / sizeof gemm_cases[0]; ++i)
            run_gemm_case(&gemm_cases[i], backends[bi]);
        for (size_t i = 0; i < sizeof topk_cases / sizeof topk_cases[0]; ++i)
            run_topk_case(&topk_cases[i], backends[bi]);
    }
    cuda_ok(cudaDeviceSynchronize(), "final synchronize");
    return 0;
}
