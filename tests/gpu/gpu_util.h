/*
 * gpu_util.h - the GPU test suite's shared machinery: runner options, one
 * attention case (inputs, layout, reference, GPU runs, comparison), the
 * tolerance rule, and small CUDA helpers.
 *
 * A case is run as follows:
 *   1. A block mask per layout slice (density, k per row, empty rows) is
 *      turned into a BSR layout (gt_bsr_from_mask, the suite's own helper).
 *   2. Q, K, V get random values inside their logical extent; everything
 *      else in their allocations (stride padding, slack after the end) and
 *      every K/V key block that no row of the slices reading it selects is
 *      NaN, so a stray read poisons the output.
 *   3. The CPU backend (SK_BACKEND_CPU) computes the reference from the same
 *      host buffers.
 *   4. On the GPU: O and LSE are filled with NaN before every run; plan,
 *      run; again; the two runs must agree bitwise; O's stride padding must
 *      be untouched.
 *   5. Every O and LSE element is compared with the reference under the
 *      tolerance rule (gt_tolerance_*), computed per element from an fp64
 *      pass over the row.
 */
#ifndef SK_TESTS_GPU_UTIL_H
#define SK_TESTS_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

/* Runner options (main.c). */
typedef struct gt_options {
    sk_backend backend; /* SK_BACKEND_CUDA (default), _SM80 or _SM90 */
    int quick;          /* a few small cases only (compute-sanitizer) */
    int use_naive_ref;  /* compare with the suite's own fp64 values instead of the CPU backend */
    int verbose;        /* print every case */
} gt_options;
extern gt_options gt_opt;

/* One attention case. Zero-initialise, then set. */
typedef struct gt_case {
    sk_dtype dtype;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    int32_t block_q, block_k;
    int causal;
    float scale;                  /* 0: default */
    int32_t layout_batch;         /* 1 or batch */
    int32_t layout_heads;         /* 1, heads_kv or heads_q */
    double density;               /* P(block selected) when k_per_row == 0 */
    int32_t k_per_row;            /* > 0: exactly min(k, col_blocks) random blocks per row */
    double empty_rows;            /* fraction of layout rows left empty */
    int stride_mode[4];           /* q, k, v, o: 0 packed, 1 padded [B,S,H,D], 2 padded [B,H,S,D] */
    int with_lse;
    float q_amp;                  /* Q values N(0,1) * q_amp (1 if 0): sharper softmax */
    uint64_t seed;
} gt_case;

/* Describe a case on one line (for messages). */
void gt_case_describe(const gt_case *c, char *buf, size_t len);

/* A random case (test_attention_random.c's draw): GQA ratio 1, 4 or 8;
 * batch 1-3; Sq and Sk aligned, with tails, tiny, equal or not; layout
 * broadcast over batch and heads (1 / Hkv / Hq); one block per row, a few,
 * random density or dense; empty rows; packed or padded strides per
 * tensor; with or without LSE; default, positive or negative scales;
 * sharper softmax. quick: one KV head, one batch, lengths up to 200.
 * Sequences are halved until B * Hq * Sq * Sk * D <= budget. */
struct tu_rng;
void gt_case_random(gt_case *c, struct tu_rng *rng, sk_dtype dtype, int64_t d, int32_t bq,
                    int32_t bk, int causal, int quick, double budget);

/* Run a case against the reference; records failures with CHECK and
 * returns 0 when it passed. */
int gt_run_case(const gt_case *c);
/* Cases run and failed by gt_run_case so far; cases the forced backend
 * declined (SK_STATUS_NOT_SUPPORTED checked, nothing written). */
extern int gt_cases_run, gt_cases_failed, gt_cases_declined;
/* Of those, the BSR GEMM cases (test_gemm_gpu.c). */
extern int gt_gemm_cases_run, gt_gemm_cases_failed, gt_gemm_cases_declined;

/* Whether the backend under test covers the case: every CUDA backend does
 * (SK_BACKEND_CUDA_SM90, the Hopper kernel: blocks of 64 or 128 each way,
 * issue 28; what it declines, head_dim 96 for one, has its own tests). */
int gt_backend_covers(const gt_case *c);

/* The softmax scale a case resolves to (as the library does). */
double gt_case_scale(const gt_case *c);

/* One strided tensor [B, S, H, D] of a case, host side. */
typedef struct gt_tensor {
    int64_t extent[3];      /* B, S, H */
    int64_t d;
    int64_t stride[3];      /* element strides, resolved */
    int64_t desc_stride[3]; /* as given to the descriptor: zeros when packed */
    int64_t alloc;          /* elements allocated: span, sequence padding and slack */
    size_t bytes;
    sk_dtype dtype;
    void *host;
} gt_tensor;
int64_t gt_tensor_index(const gt_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d);
/* The strides and allocation size of a [b, s, h, d] tensor in stride mode
 * `mode` (0 packed, 1 padded [B,S,H,D], 2 padded [B,H,S,D]; padding drawn
 * from rng), with padding rows after each sequence so that reads past its
 * end find NaN. host is left NULL. */
void gt_tensor_make(gt_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, int mode,
                    struct tu_rng *rng, sk_dtype dtype);
/* N(0, 1) * amp values, rounded to the dtype, into t->host inside the
 * logical tensor (the rest untouched); packed (may be NULL) receives them
 * as a packed [B, S, H, D] fp64 array. */
void gt_tensor_fill(struct tu_rng *rng, gt_tensor *t, double *packed, float amp);

/* A materialised case: host inputs and reference, device buffers. */
typedef struct gt_inst {
    gt_case c;
    int64_t group, rb, cb, slices;
    int32_t head_div;
    gt_tensor q, k, v, o; /* o.host: the NaN fill every run starts from */
    void *o_ref;          /* CPU reference O (same strides as o) */
    int64_t lse_elems;
    float *lse_nan, *lse_ref;
    uint8_t *mask; /* [slices, rb, cb] */
    sk_bsr layout; /* host */
    double *qd, *kd, *vd;          /* packed fp64 copies of Q, K, V */
    double *o_naive, *o_tol;       /* [B, Sq, Hq, D] fp64 pass */
    double *lse_naive, *lse_tol;   /* [B, Hq, Sq] */
    void *dq, *dk, *dv, *dout, *dws;
    float *dlse;
    size_t ws_bytes;
    sk_bsr dlayout; /* device arrays */
} gt_inst;

/* Build a case (with_fp64: also the fp64 pass); 0 on success. */
int gt_inst_create(gt_inst *x, const gt_case *c, int with_fp64);
void gt_inst_destroy(gt_inst *x);
void gt_inst_desc(const gt_inst *x, sk_backend backend, sk_attention_desc *d);
/* Device O and LSE back to the NaN fill. */
int gt_inst_poison_outputs(gt_inst *x);
int gt_inst_fetch_outputs(const gt_inst *x, void *o, float *lse);
/* The CPU backend's forward on the host inputs, into o_ref / lse_ref (the
 * reference gt_inst_compare uses unless --naive). */
sk_status gt_inst_cpu_reference(gt_inst *x);
/* sk_attention_forward on the device buffers. */
sk_status gt_inst_forward(gt_inst *x, sk_backend backend, struct CUstream_st *stream);
/* Whether device O and LSE still hold the NaN fill, bit for bit. */
int gt_inst_outputs_untouched(const gt_inst *x);
/* Errors of GPU outputs against the reference (printed, at most a few). */
int gt_inst_compare(const gt_inst *x, const void *o, const float *lse, const char *what);

/* BSR (host arrays, malloc'd) from a dense block mask [slices, rb, cb]. */
int gt_bsr_from_mask(sk_bsr *out, const sk_grid *grid, const uint8_t *mask);
void gt_bsr_free(sk_bsr *bsr);
/* Copy a host layout's arrays to the device (cudaMalloc'd); free with gt_bsr_free_device. */
int gt_bsr_to_device(const sk_bsr *host, sk_bsr *dev);
void gt_bsr_free_device(sk_bsr *dev);

/* Tolerance rule (docs/DEVELOPING.md): error <= 2 x (error of a naive
 * same-precision implementation) + atol. The naive implementation's error
 * for output element O[q, d], with u the dtype's unit roundoff, p_k the
 * softmax weights and s_k the scaled scores of q's admitted keys:
 *   u * (|o_d|                       rounding O to the dtype
 *        + sum_k p_k |v_kd|          rounding P to the dtype before P V
 *        + sum_k p_k |s_k| |v_kd - o_d|)   rounding S to the dtype
 * and for LSE:  u * (|lse| + sum_k p_k |s_k|). */
double gt_tolerance_o(double u, double abs_o, double sum_p_abs_v, double sum_p_abs_s_dv);
double gt_tolerance_lse(double u, double abs_lse, double sum_p_abs_s);
enum { GT_TOL_FACTOR = 2 };
#define GT_TOL_ATOL 1e-5

/* Elements of a strided [n0, n1, n2, d] tensor: the span in elements. */
int64_t gt_span(const int64_t extent[3], const int64_t stride[3], int64_t d);

/* Device helpers: abort the test (REQUIRE-style) through the return value. */
void *gt_device_alloc(size_t bytes);
void gt_device_free(void *p);
int gt_upload(void *dst, const void *src, size_t bytes);
int gt_download(void *dst, const void *src, size_t bytes);
/* n device elements of 2 bytes: the first pattern_elems elements of
 * pattern_dev (device) repeated. 0 on success. */
int gt_fill_repeated(void *dst, const void *pattern_dev, int64_t pattern_elems, int64_t n);
/* qsort comparison of floats, ascending. */
int gt_cmp_float(const void *a, const void *b);
int gt_sync(void);

/* sk_attention_desc for a case (strides resolved by gt_case_strides). */
void gt_case_desc(const gt_case *c, sk_backend backend, sk_attention_desc *d);

#endif /* SK_TESTS_GPU_UTIL_H */
