/*
 * cli.h - what the files of the sparsek CLI share: the options, the resolved
 * workload, the tensors, the results, and each file's entry points.
 *
 *   main.c      main, command dispatch, `info`, the `run` sequence
 *   args.c      the flags, their parsing, the usage text
 *   fail.c      how the CLI stops: failed calls (exit 1), bad usage (exit 2)
 *   workload.c  options -> workload, the layout, the tensors (host or GPU)
 *   run.c       one call, the timer, the expected duration
 *   progress.c  progress lines on stderr
 *   check.c     sampled rows against a naive fp64 attention
 *   check_fp8.c --dtype e4m3: the host quantization and per-row FP8 tolerance of the check
 *   report.c    figures, text and JSON reports
 *   topk.c      `run --pattern topk`: selection and attention in one call
 *
 * Built with and without CUDA: the GPU paths are compiled only when
 * SK_NO_CUDA is not defined (the Makefile defines it when nvcc is absent).
 */
#ifndef SK_TOOLS_CLI_H
#define SK_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sparsek.h"

#ifndef SK_NO_CUDA
/* C-compatible; found through -isystem, so its C11 constructs do not trip
 * -Wpedantic. */
#include <cuda_runtime_api.h>
#endif

/* The check covers at most this many query rows per head (a suffix). */
enum { CHECK_MAX_ROWS = 4096 };

/* Streams of the counter-based generator (host_data.h): the inputs are
 * element i of streams GEN_Q, GEN_K, GEN_V; GEN_PICK draws the checked heads. */
enum { GEN_Q = 1, GEN_K = 2, GEN_V = 3, GEN_PICK = 5 };

/* Progress lines start once the run has taken, or is expected to take, this long. */
#define PROGRESS_AFTER_S 2.0

/* ---- options (args.c) ---------------------------------------------------- */

typedef enum pattern_id {
    PAT_DENSE,
    PAT_CAUSAL,
    PAT_WINDOW,
    PAT_SINKS,
    PAT_STRIDED,
    PAT_RANDOM,
    PAT_TOPK,
    PAT_COUNT
} pattern_id;

extern const char *const pattern_names[PAT_COUNT];

typedef enum backend_choice { BK_AUTO, BK_CPU, BK_CUDA, BK_SM80, BK_SM90, BK_COUNT } backend_choice;

extern const char *const backend_choice_names[BK_COUNT];

/* Integer flags, table driven (args.c): name, range. */
typedef enum int_flag_id {
    OPT_BATCH,
    OPT_HEADS,
    OPT_HEADS_KV,
    OPT_SEQ,
    OPT_SEQ_Q,
    OPT_SEQ_K,
    OPT_DIM,
    OPT_BLOCK,
    OPT_BLOCK_Q,
    OPT_BLOCK_K,
    OPT_WINDOW,
    OPT_SINKS,
    OPT_STRIDE,
    OPT_ITERS,
    OPT_WARMUP,
    OPT_CHECK_ROWS,
    OPT_TOPK_K,
    OPT_SINK_BLOCKS,
    OPT_LOCAL_BLOCKS,
    OPT_INT_COUNT
} int_flag_id;

typedef struct int_flag {
    const char *name;
    int64_t lo, hi;
} int_flag;

extern const int_flag int_flags[OPT_INT_COUNT];

/* How progress lines are chosen: --quiet, the default, --progress. */
typedef enum progress_mode { PROGRESS_OFF = -1, PROGRESS_AUTO = 0, PROGRESS_ON = 1 } progress_mode;

typedef struct run_opts {
    int64_t ival[OPT_INT_COUNT];
    int iset[OPT_INT_COUNT];
    double density;
    int density_set;
    uint64_t seed;
    sk_dtype dtype;
    pattern_id pattern;
    backend_choice backend;
    int causal, causal_set;
    int per_kv_head;
    int json;
    progress_mode progress;
    int v_vt, v_layout_set; /* --v-layout vt (--dtype e4m3) */
} run_opts;

/* Parses `run`'s flags (argv after "run"); exits 2 on bad usage, 0 after --help. */
void parse_run_opts(int argc, char **argv, run_opts *o);
void print_usage(FILE *f, int full);

/* ---- failure (fail.c) ------------------------------------------------------ */

/* Lets the compiler check the format strings and see the calls that exit. */
#ifdef __GNUC__
#define CLI_PRINTF(fmt, first) __attribute__((format(printf, fmt, first)))
#define CLI_NORETURN __attribute__((noreturn))
#else
#define CLI_PRINTF(fmt, first)
#define CLI_NORETURN
#endif

/* "sparsek: <call>: <status name>: <last error>", exit 1, unless status is success. */
void check_sk(sk_status status, const char *call);
/* "sparsek: <message>", exit 1. */
void fail(const char *fmt, ...) CLI_NORETURN CLI_PRINTF(1, 2);
/* "sparsek: <message>" and the short usage, exit 2. */
void usage_error(const char *fmt, ...) CLI_NORETURN CLI_PRINTF(1, 2);
void *xmalloc(size_t bytes, const char *what);
#ifndef SK_NO_CUDA
void check_cuda(cudaError_t err, const char *call);
#endif

/* ---- the workload (workload.c) --------------------------------------------- */

typedef struct workload {
    sk_backend backend;
    int on_gpu;
    const char *backend_name; /* "cpu", "cuda", "cuda-sm80", "cuda-sm90" */
    char device[256];         /* GPU name or "cpu" */
    char kernel[160];         /* what we know of the kernel used */
    int64_t batch, heads_q, heads_kv, seq_q, seq_k, dim;
    int32_t block_q, block_k, row_blocks, col_blocks;
    sk_dtype dtype;
    pattern_id pattern;
    int causal;
    double density_target;
    uint64_t seed;
    int64_t window, sinks, stride;     /* pattern parameters as used */
    int32_t k_per_row;                 /* random, topk (blocks picked by score) */
    int32_t sink_blocks, local_blocks; /* topk: forced blocks */
    int per_kv_head;                   /* topk: one selection per KV head */
    int iters, warmup, check_heads;
    /* --dtype e4m3: dtype is then BF16 (the generated values and O), and the
     * attention reads their e4m3 codes (tensors' q8, k8, v8); v_vt: V^T. */
    int fp8, v_vt;
} workload;

/* The tensors, on the host (CPU backend) or the device. */
typedef struct tensors {
    int on_gpu;
    void *q, *k, *v, *o; /* packed [B, S, H, D] */
    float *lse;          /* [B, Hq, Sq] */
    int64_t q_elems, kv_elems, lse_elems;
    sk_bsr layout; /* the layout as the backend reads it (host or device arrays) */
    /* --dtype e4m3: the codes sk_quantize_e4m3 made of q, k, v (v8: V^T with
     * --v-layout vt) and their descales [B, Hq], [B, Hkv], [B, Hkv]. */
    uint8_t *q8, *k8, *v8;
    float *q_descale, *k_descale, *v_descale;
} tensors;

int64_t ceil_div(int64_t a, int64_t b);
void resolve_workload(const run_opts *o, int32_t gpu_count, workload *w);
sk_layout_t build_layout(const workload *w);
/* The layout slice that (b, hq) reads, as the header defines it. */
int64_t layout_slice(const sk_bsr *l, const workload *w, int64_t b, int64_t h);
/* Selected blocks summed over every (b, hq) the attention computes. */
int64_t selected_blocks(const sk_bsr *l, const workload *w);
/* Q, K, V generated, O and LSE NaN; host_layout NULL (topk): no layout uploaded. */
void setup_tensors(const workload *w, const sk_bsr *host_layout, tensors *t);
void free_tensors(tensors *t);
/* NaN into O and LSE again, so that an element the next call misses fails the check. */
void poison_outputs(const workload *w, tensors *t);
/* Rows q0 .. q0+rows-1 of head (b, h) of O into dst [rows, D] (dtype), their LSE into lse_dst. */
void fetch_head(const workload *w, const tensors *t, int64_t b, int64_t h, int64_t q0, int64_t rows,
                void *dst, float *lse_dst);

/* ---- running and timing (run.c, topk.c) ------------------------------------ */

/* The top-k selection of a `--pattern topk` run: its descriptor and the
 * output layout, whose arrays (host or device memory, as the backend's)
 * are allocated at the capacity that sk_topk_layout_capacity gives. */
typedef struct topk_state {
    sk_topk_desc desc;
    sk_bsr out; /* grid, nnz = capacity, the capacity-sized arrays */
    int32_t capacity;
    int64_t offsets_len; /* slices * row_blocks + 1 */
} topk_state;

/* Medians and minimum of the timed calls, in milliseconds; the GPU's
 * energy per call over a separate window of >= 2 s of the same calls
 * (run.c meter_energy, energy.c). */
typedef struct timing {
    double median_ms, min_ms;
    double plan_ms;           /* sk_attention_plan's median (sk_attention_run only) */
    double energy_j_per_call; /* < 0: unknown (CPU backend, no NVML, or the counter did not move) */
    double power_w;           /* mean power over the energy window; < 0 with the energy */
} timing;

/* ---- GPU energy (energy.c; not in SK_NO_CUDA builds) ------------------------ */

typedef struct gpu_energy {
    void *lib;    /* dlopen handle of libnvidia-ml.so.1; NULL when unavailable */
    void *device; /* nvmlDevice_t */
    /* nvmlDeviceGetTotalEnergyConsumption */
    int (*read)(void *device, unsigned long long *millijoules);
} gpu_energy;

#ifndef SK_NO_CUDA
/* 0 when NVML serves the CUDA device's energy counter; -1 otherwise (*e zeroed). */
int energy_open(gpu_energy *e, int cuda_device);
/* The counter in millijoules; -1 when unavailable. */
int energy_read_mj(const gpu_energy *e, unsigned long long *millijoules);
void energy_close(gpu_energy *e);
#endif

/* w->warmup untimed calls, then w->iters timed ones (CUDA events on a GPU):
 * of sk_attention_run on t->layout (planned outside the timing; the plan is
 * timed on its own), or with tk of the whole sk_attention_topk. */
timing run_timed(const workload *w, tensors *t, topk_state *tk, const char *label);
/* Seconds the run, its inputs and its check are expected to take: a rough
 * rate per backend (usage text), for the progress lines. */
double expected_seconds(const workload *w, int64_t blocks_selected);

int cmd_run_topk(const run_opts *opts, workload *w);

/* ---- progress (progress.c) ------------------------------------------------- */

void progress_start(progress_mode mode);
/* Lines start now when the run is expected to take PROGRESS_AFTER_S or
 * more; the estimate is their first line. */
void progress_expect(double seconds);
/* A line "sparsek [  12.3 s] ..." on stderr when progress is on; a frequent
 * line (every = 0) at most 4 per second, a phase line (every = 1) always. */
void progress_line(int every, const char *fmt, ...) CLI_PRINTF(2, 3);
double progress_elapsed(void);

/* ---- the check (check.c) --------------------------------------------------- */

typedef struct check_result {
    int heads;         /* heads checked; 0: skipped */
    int64_t rows;      /* query rows checked per head */
    int64_t head_b[3]; /* the first few heads checked, for the text report */
    int64_t head_h[3];
    double max_err;     /* max |o - ref| over O (inf when a NaN or inf differs) */
    double max_err_lse; /* the same over LSE */
    double tol;
    int passed;
    int fp8_rule; /* the tolerance of check_fp8.c (tol unused) */
} check_result;

/* One checked head's inputs as the attention read them, in fp32: its
 * checked query rows (q: rows x D) and all keys of its KV head (k, v: Sk x
 * D); with --dtype e4m3 the dequantized codes, and the codes themselves
 * (q8 the checked rows, k8 every key) with their descales. */
typedef struct head_inputs {
    float *q, *k, *v;
    float *q_all; /* what q points into (FP8: the whole head, for its amax) */
    uint8_t *q8_all, *q8, *k8, *v8;
    float qd, kd, vd;
} head_inputs;

/* FP8 (check_fp8.c): vals [rows, D] of one head (bf16 values) quantized as
 * sk_quantize_e4m3 does it (the CPU backend's quantizer, which gives the
 * CUDA one's bytes): the codes into codes, their descale into *descale, and
 * vals replaced by descale x value(code). */
void fp8_quantize_head(const workload *w, float *vals, int64_t rows, uint8_t *codes, float *descale);
/* The FP8 tolerance of query row i of in (its reference o_ref, lse_ref over
 * the keys keys[0 .. n) with exact scaled scores): *o_abs and the
 * per-|ref| *o_rel of O's elements, *lse_tol of the LSE. work: n + 3 D
 * doubles. */
void fp8_row_tolerance(const workload *w, const head_inputs *in, int64_t i, const int64_t *keys,
                       const double *scores, int64_t n, const double *o_ref, double lse_ref,
                       double *work, double *o_abs, double *o_rel, double *lse_tol);

/* The output in t against a naive fp64 attention on the layout host_layout
 * (host arrays), for w->check_heads (b, h) pairs: their last
 * min(Sq, CHECK_MAX_ROWS) query rows (whole blocks). */
void check_heads(const workload *w, const sk_bsr *host_layout, const tensors *t, check_result *c);

/* ---- reports (report.c) ---------------------------------------------------- */

typedef struct run_stats {
    int64_t blocks_selected, blocks_total;
    double density, tflops_actual, tflops_dense, us_per_head;
    timing time; /* of the call reported; topk: the whole sk_attention_topk */
    /* topk only */
    int topk;
    int32_t layout_nnz, layout_capacity; /* the selected layout's real count, its capacity */
    double attention_ms, selection_ms;   /* sk_attention_run alone on that layout; the rest */
} run_stats;

/* Density and TFLOPS from the layout the attention read and s->time. */
void fill_stats(const workload *w, const sk_bsr *layout, run_stats *s);
void report_run(const workload *w, const run_stats *s, const check_result *c, int json);
void version_text(char *buf, size_t size, int v);
void json_string(FILE *f, const char *s);

#endif /* SK_TOOLS_CLI_H */
