/*
 * sparsek.c - the SparseK command-line tool.
 *
 *   sparsek info [--json]    version, build, and the GPUs found
 *   sparsek run [flags]      build a workload, run it, time it, check it
 *   sparsek --help           usage
 *
 * `run` makes seeded N(0, 1) Q, K and V and a block layout from a named
 * pattern (for `--pattern topk`, sk_attention_topk selects the layout from
 * Q and K itself, timed as one call with the attention; see cmd_run_topk),
 * runs sk_attention_run on the chosen backend (the CUDA backend when
 * a GPU is present, else the CPU reference on a smaller default workload),
 * takes the median time of the timed iterations, then checks a sample of
 * (batch, head) pairs against the CPU reference run on a one-head
 * sub-problem cut out of the big one, and prints time, TFLOPS, density and
 * the error (text, or one JSON object with --json).
 *
 * Invariants of the design:
 * - Every input element is a pure function of (seed, tensor, packed index)
 *   (a counter-based generator), so the check regenerates the Q, K and V
 *   rows of a head instead of keeping host copies of GPU tensors, and the
 *   values do not depend on the number of threads.
 * - The check's sub-problem keeps a suffix of the head's query blocks: with
 *   the bottom-right causal alignment (key k visible to query q iff
 *   k <= q + Sk - Sq), dropping leading query rows leaves every remaining
 *   row's visible keys unchanged.
 * - Exit status: 0 success, 1 a failed call or a failed check, 2 bad usage.
 *
 * Built with and without CUDA: the GPU path is compiled only when SK_NO_CUDA
 * is not defined (the Makefile defines it when nvcc is absent).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sparsek.h"

#ifndef SK_NO_CUDA
/* C-compatible; found through -isystem, so its C11 constructs do not trip
 * -Wpedantic. */
#include <cuda_runtime_api.h>
#endif

/* ---------------------------------------------------------------------------
 * Constants
 * ------------------------------------------------------------------------- */

#define SK_CLI_PI 3.14159265358979323846

/* The check covers at most this many query rows per head (a suffix). */
enum { CHECK_MAX_ROWS = 4096 };

/* Tensor identifiers of the counter-based generator. */
enum { GEN_Q = 1, GEN_K = 2, GEN_V = 3, GEN_SCORES = 4, GEN_PICK = 5 };

/* ---------------------------------------------------------------------------
 * Failure reporting
 * ------------------------------------------------------------------------- */

/* A failed library call: "sparsek: <call>: <status name>: <last error>". The
 * library prefixes its text with the entry point's name; it is not repeated. */
static void check_sk(sk_status status, const char *call) {
    if (status == SK_STATUS_SUCCESS) return;
    const char *text = sk_last_error();
    const size_t n = strlen(call);
    if (strncmp(text, call, n) == 0 && text[n] == ':' && text[n + 1] == ' ') text += n + 2;
    fprintf(stderr, "sparsek: %s: %s: %s\n", call, sk_status_name(status), text);
    exit(1);
}

static void fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("sparsek: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

static void *xmalloc(size_t bytes, const char *what) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL)
        fail("out of host memory: %s needs %.3g GiB", what, (double)bytes / (1024.0 * 1024 * 1024));
    return p;
}

#ifndef SK_NO_CUDA
static void check_cuda(cudaError_t err, const char *call) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "sparsek: %s: %s: %s\n", call, cudaGetErrorName(err), cudaGetErrorString(err));
    exit(1);
}
#endif

/* ---------------------------------------------------------------------------
 * Element types (host conversions, round to nearest even)
 * ------------------------------------------------------------------------- */

static size_t dtype_size(sk_dtype dtype) {
    return dtype == SK_DTYPE_F32 ? 4 : 2;
}

static const char *dtype_name(sk_dtype dtype) {
    return dtype == SK_DTYPE_F16 ? "f16" : dtype == SK_DTYPE_BF16 ? "bf16" : "f32";
}

static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf */
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        float af;
        memcpy(&af, &ax, 4);
        return (uint16_t)(sign | (uint16_t)lrintf(af * 16777216.0f)); /* units of 2^-24 */
    }
    /* Re-bias the exponent (127 -> 15), round the 13 dropped bits to even. */
    ax += 0xc8000fffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | (ax >> 13));
}

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        const float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void store_elem(void *buf, sk_dtype dtype, int64_t i, float value) {
    if (dtype == SK_DTYPE_F32)
        ((float *)buf)[i] = value;
    else if (dtype == SK_DTYPE_F16)
        ((uint16_t *)buf)[i] = f32_to_f16(value);
    else
        ((uint16_t *)buf)[i] = f32_to_bf16(value);
}

static float load_elem(const void *buf, sk_dtype dtype, int64_t i) {
    if (dtype == SK_DTYPE_F32) return ((const float *)buf)[i];
    if (dtype == SK_DTYPE_F16) return f16_to_f32(((const uint16_t *)buf)[i]);
    return bf16_to_f32(((const uint16_t *)buf)[i]);
}

/* ---------------------------------------------------------------------------
 * Counter-based random numbers: value = f(seed, tensor, index)
 * ------------------------------------------------------------------------- */

/* The splitmix64 output function: a bijection of 64-bit words. */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Distinct (tensor, counter < 2^60) pairs give distinct words for a seed. */
static uint64_t gen_word(uint64_t seed, unsigned tensor, uint64_t counter) {
    return mix64(mix64(seed) ^ ((uint64_t)tensor << 60) ^ counter);
}

/* Box-Muller on the two 32-bit halves of one word: two N(0, 1) samples. */
static void gen_normal_pair(uint64_t seed, unsigned tensor, uint64_t pair, double *z0, double *z1) {
    const uint64_t x = gen_word(seed, tensor, pair);
    const double u1 = ((double)(x >> 32) + 0.5) * (1.0 / 4294967296.0);
    const double u2 = ((double)(x & 0xffffffffu) + 0.5) * (1.0 / 4294967296.0);
    const double r = sqrt(-2.0 * log(u1)), t = 2.0 * SK_CLI_PI * u2;
    *z0 = r * cos(t);
    *z1 = r * sin(t);
}

/* Element `idx` of tensor `tensor`: elements 2p and 2p+1 share pair p. */
static float gen_normal(uint64_t seed, unsigned tensor, uint64_t idx) {
    double z0, z1;
    gen_normal_pair(seed, tensor, idx >> 1, &z0, &z1);
    return (float)((idx & 1) ? z1 : z0);
}

/* Fill n elements of a packed tensor, in parallel. */
static void gen_fill(void *buf, sk_dtype dtype, int64_t n, uint64_t seed, unsigned tensor) {
    const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
        double z0, z1;
        gen_normal_pair(seed, tensor, (uint64_t)p, &z0, &z1);
        store_elem(buf, dtype, 2 * p, (float)z0);
        if (2 * p + 1 < n) store_elem(buf, dtype, 2 * p + 1, (float)z1);
    }
}

/* ---------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------- */

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

static const char *const pattern_names[PAT_COUNT] = {"dense",   "causal", "window", "sinks",
                                                     "strided", "random", "topk"};

typedef enum backend_choice { BK_AUTO, BK_CPU, BK_CUDA, BK_SM80, BK_SM90, BK_COUNT } backend_choice;

static const char *const backend_choice_names[BK_COUNT] = {"auto", "cpu", "cuda", "sm80", "sm90"};

/* Integer flags, table driven: name, range. */
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

static const int_flag int_flags[OPT_INT_COUNT] = {
    [OPT_BATCH] = {"--batch", 1, 1 << 20},
    [OPT_HEADS] = {"--heads", 1, 1 << 16},
    [OPT_HEADS_KV] = {"--heads-kv", 1, 1 << 16},
    [OPT_SEQ] = {"--seq", 1, 1 << 24},
    [OPT_SEQ_Q] = {"--seq-q", 1, 1 << 24},
    [OPT_SEQ_K] = {"--seq-k", 1, 1 << 24},
    [OPT_DIM] = {"--dim", 1, 1024},
    [OPT_BLOCK] = {"--block", 64, 128},
    [OPT_BLOCK_Q] = {"--block-q", 64, 128},
    [OPT_BLOCK_K] = {"--block-k", 64, 128},
    [OPT_WINDOW] = {"--window", 0, 1 << 24},
    [OPT_SINKS] = {"--sinks", 0, 1 << 24},
    [OPT_STRIDE] = {"--stride", 1, 1 << 24},
    [OPT_ITERS] = {"--iters", 1, 1000000},
    [OPT_WARMUP] = {"--warmup", 0, 1000000},
    [OPT_CHECK_ROWS] = {"--check-rows", 0, 4096},
    [OPT_TOPK_K] = {"--topk-k", 0, 1 << 24},
    [OPT_SINK_BLOCKS] = {"--sinks-blocks", 0, 1 << 24},
    [OPT_LOCAL_BLOCKS] = {"--local-blocks", 0, 1 << 24},
};

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
} run_opts;

static const char usage_short[] = "usage: sparsek info [--json]\n"
                                  "       sparsek run [flags]\n"
                                  "       sparsek --help | --version\n";

static const char usage_text[] =
    "usage: sparsek info [--json]\n"
    "       sparsek run [flags]\n"
    "       sparsek --help | --version\n"
    "\n"
    "info   the library version, the build, and the GPUs found.\n"
    "run    build a workload (seeded N(0,1) Q, K, V and a block layout), run the\n"
    "       block-sparse attention forward, time it, check a sample of heads\n"
    "       against the CPU reference, and print the result.\n"
    "\n"
    "run flags (--flag VALUE or --flag=VALUE):\n"
    "  --backend B      auto | cpu | cuda | sm80 | sm90 (default auto: cuda when a\n"
    "                   GPU is found, else cpu). cuda lets the library pick the\n"
    "                   kernel; sm80 / sm90 force one.\n"
    "  --batch N        B (GPU default 16, CPU default 1)\n"
    "  --heads N        query heads Hq (GPU 96, CPU 4)\n"
    "  --heads-kv N     key/value heads Hkv, divides Hq (default Hq)\n"
    "  --seq N          Sq = Sk (GPU 4096, CPU 1024)\n"
    "  --seq-q N        Sq alone;  --seq-k N   Sk alone\n"
    "  --dim N          head dim D (GPU 128, CPU 64; the CUDA backend takes 64, 128)\n"
    "  --dtype T        f16 | bf16 | f32 (default f16; f32 on the CPU backend only)\n"
    "  --block N        bq = bk, 64 or 128 (default 128);  --block-q N, --block-k N\n"
    "  --pattern P      dense | causal | window | sinks | strided | random | topk\n"
    "                   (default random). topk selects the blocks from the workload's\n"
    "                   own Q and K (block means, scores pooled Q . pooled K, top k\n"
    "                   per row) with sk_attention_topk on the chosen backend, and\n"
    "                   times selection + attention as one call\n"
    "  --density X      target fraction in (0, 1] (default 0.25): random and topk\n"
    "                   pick k = round(X * key blocks) blocks per row (at least 1);\n"
    "                   it also sets the default --window (round(X * Sk) tokens) of\n"
    "                   window and sinks, and the default --stride (round(1/X)) of\n"
    "                   strided\n"
    "  --window N       tokens: window's left extent (right 0); sinks' recent window;\n"
    "                   strided's local blocks (ceil(N / bk), default one block);\n"
    "                   topk: the same as --local-blocks ceil(N / bk)\n"
    "  --sinks N        tokens: sinks' sink keys (default bk); topk: the same as\n"
    "                   --sinks-blocks ceil(N / bk)\n"
    "  --topk-k N       topk: blocks picked by score per row, beyond the forced ones\n"
    "                   (default round(density * key blocks), at least 1)\n"
    "  --sinks-blocks N topk: forced leading key blocks 0 .. N-1 (default 0)\n"
    "  --local-blocks N topk: forced blocks ending at the row's diagonal block\n"
    "                   (default 0)\n"
    "  --per-kv-head    topk: one selection per KV head (scores summed over its\n"
    "                   query heads), shared by the group\n"
    "  --stride N       strided: keep every N-th key block back from the diagonal\n"
    "  --causal [on|off]  token-level causal mask (bottom-right aligned); default on\n"
    "                   for causal, window and sinks, off otherwise. --no-causal = off.\n"
    "                   With random, strided and topk it also limits the selection to\n"
    "                   blocks holding a causal pair.\n"
    "  --seed N         seed of Q, K, V and the random layout (default 1)\n"
    "  --iters N        timed iterations, median reported (GPU default 20, CPU 1)\n"
    "  --warmup N       untimed iterations first (GPU default 3, CPU 0)\n"
    "  --check-rows N   number of (batch, head) pairs checked against the CPU\n"
    "                   reference: (0, 0) and N-1 drawn at random (default 2; 0 skips\n"
    "                   the check). Each covers the last min(Sq, 4096) query rows of\n"
    "                   the head (rounded up to whole blocks).\n"
    "  --json           print one JSON object instead of text\n";

/* The rest of the help (one string would pass C99's 4095-character limit). */
static const char usage_more[] =
    "\n"
    "The check runs the CPU reference (fp32 math, fp64 sums) on a one-head\n"
    "sub-problem cut from the same inputs and layout, and passes when every output\n"
    "element satisfies |o - ref| <= tol * (1 + |ref|), with tol = 2e-2 for f16,\n"
    "5e-2 for bf16 and 1e-4 for f32 (the same rule for the LSE), and NaN / inf\n"
    "positions match. Outputs are filled with NaN before the run, so an unwritten\n"
    "element fails. Exit status: 0 pass, 1 a failed call or check, 2 bad usage.\n"
    "\n"
    "TFLOPS: actual = 4 * D * (selected blocks over all (b, h)) * bq * bk / time;\n"
    "dense-equivalent = 4 * B * Hq * Sq * Sk * D / time.\n"
    "\n"
    "topk: `time` is the whole sk_attention_topk (pooling, scoring, selection,\n"
    "planning, attention), and the TFLOPS use it; `attention` is sk_attention_run\n"
    "alone on the layout the selection produced, `selection` the difference. The\n"
    "density is the layout's real count (its last row offset, copied back after\n"
    "the timing). The check runs on the output of one more sk_attention_topk call,\n"
    "against the CPU reference on the layout that call selected (copied back).\n";

static void usage_error(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("sparsek: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    fputs(usage_short, stderr);
    fputs("(sparsek --help lists the flags)\n", stderr);
    exit(2);
}

static int parse_i64(const char *s, int64_t *out) {
    if (!(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1])))) return 0;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0') return 0;
    *out = (int64_t)v;
    return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!isdigit((unsigned char)s[0])) return 0;
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') return 0;
    *out = (uint64_t)v;
    return 1;
}

static int parse_double(const char *s, double *out) {
    if (!(isdigit((unsigned char)s[0]) || s[0] == '.' || s[0] == '-' || s[0] == '+')) return 0;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* Index of `s` in names[0..n), or -1. */
static int lookup(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; ++i)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

/* 1 / 0 for a boolean word, -1 otherwise. */
static int parse_bool_word(const char *s) {
    static const char *const on[] = {"on", "1", "yes", "true"};
    static const char *const off[] = {"off", "0", "no", "false"};
    if (lookup(s, on, 4) >= 0) return 1;
    if (lookup(s, off, 4) >= 0) return 0;
    return -1;
}

static void parse_run_opts(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->density = 0.25;
    o->seed = 1;
    o->dtype = SK_DTYPE_F16;
    o->pattern = PAT_RANDOM;
    o->backend = BK_AUTO;
    for (int i = 0; i < argc; ++i) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_text, stdout);
            fputs(usage_more, stdout);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) usage_error("run: unexpected argument '%s'", arg);
        /* --flag=value or --flag value */
        char name[64];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        const size_t name_len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        if (name_len >= sizeof name) usage_error("run: unknown flag '%s'", arg);
        memcpy(name, arg, name_len);
        name[name_len] = '\0';
        if (eq != NULL) value = eq + 1;

        /* Switches. */
        if (strcmp(name, "--json") == 0 || strcmp(name, "--no-causal") == 0 ||
            strcmp(name, "--per-kv-head") == 0) {
            if (value != NULL) usage_error("%s takes no value", name);
            if (name[2] == 'j') {
                o->json = 1;
            } else if (name[2] == 'p') {
                o->per_kv_head = 1;
            } else {
                o->causal = 0;
                o->causal_set = 1;
            }
            continue;
        }
        if (strcmp(name, "--causal") == 0) {
            /* An optional value: --causal, --causal=off, --causal off. */
            int b = 1;
            if (value != NULL) {
                b = parse_bool_word(value);
                if (b < 0) usage_error("--causal: '%s' is not on or off", value);
            } else if (i + 1 < argc && parse_bool_word(argv[i + 1]) >= 0) {
                b = parse_bool_word(argv[++i]);
            }
            o->causal = b;
            o->causal_set = 1;
            continue;
        }

        /* Everything else takes a value. */
        int int_id = -1;
        for (int f = 0; f < OPT_INT_COUNT; ++f)
            if (strcmp(name, int_flags[f].name) == 0) int_id = f;
        static const char *const other_flags[] = {"--density", "--seed", "--dtype", "--pattern",
                                                  "--backend"};
        const int other_id = lookup(name, other_flags, 5);
        if (int_id < 0 && other_id < 0) usage_error("run: unknown flag '%s'", name);
        if (value == NULL) {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
                usage_error("%s needs a value", name);
            value = argv[++i];
        }
        if (value[0] == '\0') usage_error("%s needs a value", name);

        if (int_id >= 0) {
            const int_flag *f = &int_flags[int_id];
            int64_t v;
            if (!parse_i64(value, &v)) usage_error("%s: '%s' is not an integer", name, value);
            if (v < f->lo || v > f->hi)
                usage_error("%s %s is out of range [%lld, %lld]", name, value, (long long)f->lo,
                            (long long)f->hi);
            if ((int_id == OPT_BLOCK || int_id == OPT_BLOCK_Q || int_id == OPT_BLOCK_K) &&
                v != 64 && v != 128)
                usage_error("%s %s: block sizes are 64 or 128", name, value);
            o->ival[int_id] = v;
            o->iset[int_id] = 1;
            continue;
        }
        switch (other_id) {
        case 0: {
            double d;
            if (!parse_double(value, &d)) usage_error("--density: '%s' is not a number", value);
            if (!(d > 0.0 && d <= 1.0)) usage_error("--density %s is out of range (0, 1]", value);
            o->density = d;
            o->density_set = 1;
            break;
        }
        case 1:
            if (!parse_u64(value, &o->seed))
                usage_error("--seed: '%s' is not an unsigned 64-bit integer", value);
            break;
        case 2: {
            static const char *const dtypes[] = {"f16", "bf16", "f32"};
            static const sk_dtype ids[] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};
            const int d = lookup(value, dtypes, 3);
            if (d < 0) usage_error("--dtype: '%s' is not f16, bf16 or f32", value);
            o->dtype = ids[d];
            break;
        }
        case 3: {
            const int p = lookup(value, pattern_names, PAT_COUNT);
            if (p < 0)
                usage_error("--pattern: '%s' is not dense, causal, window, sinks, strided, "
                            "random or topk",
                            value);
            o->pattern = (pattern_id)p;
            break;
        }
        default: {
            const int b = lookup(value, backend_choice_names, BK_COUNT);
            if (b < 0) usage_error("--backend: '%s' is not auto, cpu, cuda, sm80 or sm90", value);
            o->backend = (backend_choice)b;
            break;
        }
        }
    }
}

/* ---------------------------------------------------------------------------
 * The workload: options resolved against the backend
 * ------------------------------------------------------------------------- */

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
} workload;

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static int64_t opt_or(const run_opts *o, int_flag_id id, int64_t fallback) {
    return o->iset[id] ? o->ival[id] : fallback;
}

static void resolve_workload(const run_opts *o, int32_t gpu_count, workload *w) {
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
    w->dtype = o->dtype;
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
    case PAT_STRIDED: {
        const int64_t s = llround(1.0 / o->density);
        w->stride = opt_or(o, OPT_STRIDE, s > 1 ? s : 1);
        w->window = opt_or(o, OPT_WINDOW, w->block_k);
        break;
    }
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

/* ---------------------------------------------------------------------------
 * Layout
 * ------------------------------------------------------------------------- */

static sk_layout_t build_layout(const workload *w) {
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

/* The layout slice that (b, hq) reads, as the header defines it. */
static int64_t layout_slice(const sk_bsr *l, const workload *w, int64_t b, int64_t h) {
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

/* Selected blocks summed over every (b, hq) the attention computes. */
static int64_t selected_blocks(const sk_bsr *l, const workload *w) {
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

/* ---------------------------------------------------------------------------
 * Tensors, on the host (CPU backend) or the device
 * ------------------------------------------------------------------------- */

typedef struct tensors {
    int on_gpu;
    void *q, *k, *v, *o; /* packed [B, S, H, D] */
    float *lse;          /* [B, Hq, Sq] */
    int64_t q_elems, kv_elems, lse_elems;
    sk_bsr layout; /* the layout as the backend reads it (host or device arrays) */
} tensors;

static size_t checked_bytes(int64_t a, int64_t b, int64_t c, int64_t d, size_t es, int64_t *elems) {
    double approx = (double)a * (double)b * (double)c * (double)d * (double)es;
    if (approx > 9.0e18 || approx > (double)SIZE_MAX)
        fail("the tensors are too large (%.3g bytes)", approx);
    *elems = a * b * c * d;
    return (size_t)(*elems) * es;
}

/* host_layout NULL (topk): no layout is uploaded; t->layout is set later. */
static void setup_tensors(const workload *w, const sk_bsr *host_layout, tensors *t) {
    memset(t, 0, sizeof *t);
    t->on_gpu = w->on_gpu;
    const size_t es = dtype_size(w->dtype);
    const size_t q_bytes = checked_bytes(w->batch, w->seq_q, w->heads_q, w->dim, es, &t->q_elems);
    const size_t kv_bytes =
        checked_bytes(w->batch, w->seq_k, w->heads_kv, w->dim, es, &t->kv_elems);
    const size_t lse_bytes = checked_bytes(w->batch, w->heads_q, w->seq_q, 1, 4, &t->lse_elems);
    if (host_layout != NULL) t->layout = *host_layout;

    if (!w->on_gpu) {
        t->q = xmalloc(q_bytes, "Q");
        t->k = xmalloc(kv_bytes, "K");
        t->v = xmalloc(kv_bytes, "V");
        t->o = xmalloc(q_bytes, "O");
        t->lse = xmalloc(lse_bytes, "LSE");
        gen_fill(t->q, w->dtype, t->q_elems, w->seed, GEN_Q);
        gen_fill(t->k, w->dtype, t->kv_elems, w->seed, GEN_K);
        gen_fill(t->v, w->dtype, t->kv_elems, w->seed, GEN_V);
        memset(t->o, 0xff, q_bytes); /* NaN: an unwritten element fails the check */
        memset(t->lse, 0xff, lse_bytes);
        return;
    }
#ifndef SK_NO_CUDA
    check_cuda(cudaMalloc(&t->q, q_bytes), "cudaMalloc");
    check_cuda(cudaMalloc(&t->k, kv_bytes), "cudaMalloc");
    check_cuda(cudaMalloc(&t->v, kv_bytes), "cudaMalloc");
    check_cuda(cudaMalloc(&t->o, q_bytes), "cudaMalloc");
    check_cuda(cudaMalloc((void **)&t->lse, lse_bytes), "cudaMalloc");
    /* One host staging buffer, filled and uploaded per tensor. */
    void *stage = xmalloc(q_bytes > kv_bytes ? q_bytes : kv_bytes, "the upload buffer");
    gen_fill(stage, w->dtype, t->q_elems, w->seed, GEN_Q);
    check_cuda(cudaMemcpy(t->q, stage, q_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    gen_fill(stage, w->dtype, t->kv_elems, w->seed, GEN_K);
    check_cuda(cudaMemcpy(t->k, stage, kv_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    gen_fill(stage, w->dtype, t->kv_elems, w->seed, GEN_V);
    check_cuda(cudaMemcpy(t->v, stage, kv_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(stage);
    check_cuda(cudaMemset(t->o, 0xff, q_bytes), "cudaMemset");
    check_cuda(cudaMemset(t->lse, 0xff, lse_bytes), "cudaMemset");
    if (host_layout == NULL) {
        check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        return;
    }

    /* The layout arrays on the device. */
    int32_t rb, cb, slices;
    check_sk(sk_grid_blocks(&host_layout->grid, &rb, &cb, &slices), "sk_grid_blocks");
    const size_t off_bytes = ((size_t)slices * (size_t)rb + 1) * sizeof(int32_t);
    const size_t idx_bytes = (size_t)host_layout->nnz * sizeof(int32_t);
    check_cuda(cudaMalloc((void **)&t->layout.row_offsets, off_bytes), "cudaMalloc");
    check_cuda(cudaMalloc((void **)&t->layout.col_indices, idx_bytes > 0 ? idx_bytes : 4),
               "cudaMalloc");
    check_cuda(cudaMemcpy(t->layout.row_offsets, host_layout->row_offsets, off_bytes,
                          cudaMemcpyHostToDevice),
               "cudaMemcpy");
    if (idx_bytes > 0)
        check_cuda(cudaMemcpy(t->layout.col_indices, host_layout->col_indices, idx_bytes,
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy");
    /* The memsets ran on the legacy stream, which the timing stream (non-
     * blocking) does not wait for. */
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
    fail("internal error: a GPU run in a build without CUDA");
#endif
}

static void free_tensors(tensors *t) {
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
static void fetch_head(const workload *w, const tensors *t, int64_t b, int64_t h, int64_t q0,
                       int64_t rows, void *dst, float *lse_dst) {
    const size_t es = dtype_size(w->dtype);
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

/* ---------------------------------------------------------------------------
 * Running and timing
 * ------------------------------------------------------------------------- */

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
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The top-k selection of a `--pattern topk` run: its descriptor and the
 * output layout, whose arrays (host or device memory, as the backend's)
 * are allocated at the capacity that sk_topk_layout_capacity gives. */
typedef struct topk_state {
    sk_topk_desc desc;
    sk_bsr out; /* grid, nnz = capacity, the capacity-sized arrays */
    int32_t capacity;
    int64_t offsets_len; /* slices * row_blocks + 1 */
} topk_state;

/* One call on `stream`: sk_attention_topk when tk != NULL (selection and
 * attention), else sk_attention_run on t->layout. */
static void run_once(const sk_attention_desc *desc, tensors *t, topk_state *tk, void *ws,
                     size_t ws_bytes, struct CUstream_st *stream) {
    if (tk != NULL)
        check_sk(sk_attention_topk(desc, &tk->desc, t->q, t->k, t->v, t->o, t->lse, &tk->out, ws,
                                   ws_bytes, stream),
                 "sk_attention_topk");
    else
        check_sk(sk_attention_run(desc, &t->layout, t->q, t->k, t->v, t->o, t->lse, ws, ws_bytes,
                                  stream),
                 "sk_attention_run");
}

/* Median milliseconds of w->iters runs after w->warmup untimed ones: of
 * sk_attention_run on t->layout (planned once, outside the timing), or with
 * tk of the whole sk_attention_topk (which plans inside). */
static double run_timed(const workload *w, tensors *t, topk_state *tk) {
    sk_attention_desc desc;
    make_desc(w, &desc);
    size_t ws_bytes = 0;
    if (tk != NULL)
        check_sk(sk_attention_topk_workspace_size(&desc, &tk->desc, &ws_bytes),
                 "sk_attention_topk_workspace_size");
    else
        check_sk(sk_attention_workspace_size(&desc, &t->layout, &ws_bytes),
                 "sk_attention_workspace_size");
    double *times = xmalloc((size_t)w->iters * sizeof(double), "the timings");
    double result = 0.0;

    if (!t->on_gpu) {
        if (tk == NULL)
            check_sk(sk_attention_plan(&desc, &t->layout, NULL, 0, NULL), "sk_attention_plan");
        for (int i = 0; i < w->warmup; ++i) run_once(&desc, t, tk, NULL, 0, NULL);
        for (int i = 0; i < w->iters; ++i) {
            const double t0 = now_ms();
            run_once(&desc, t, tk, NULL, 0, NULL);
            times[i] = now_ms() - t0;
        }
        result = median(times, w->iters);
        free(times);
        return result;
    }
#ifndef SK_NO_CUDA
    cudaStream_t stream;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    void *ws = NULL;
    if (ws_bytes > 0) check_cuda(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
    if (tk == NULL)
        check_sk(sk_attention_plan(&desc, &t->layout, ws, ws_bytes, stream), "sk_attention_plan");
    for (int i = 0; i < w->warmup; ++i) run_once(&desc, t, tk, ws, ws_bytes, stream);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (warm-up)");

    /* iters + 1 events: run i lies between events i and i + 1; no host
     * synchronisation between runs. */
    cudaEvent_t *ev = xmalloc(((size_t)w->iters + 1) * sizeof(cudaEvent_t), "the events");
    for (int i = 0; i <= w->iters; ++i) check_cuda(cudaEventCreate(&ev[i]), "cudaEventCreate");
    check_cuda(cudaEventRecord(ev[0], stream), "cudaEventRecord");
    for (int i = 0; i < w->iters; ++i) {
        run_once(&desc, t, tk, ws, ws_bytes, stream);
        check_cuda(cudaEventRecord(ev[i + 1], stream), "cudaEventRecord");
    }
    check_cuda(cudaEventSynchronize(ev[w->iters]), "cudaEventSynchronize (timed runs)");
    check_cuda(cudaGetLastError(), "cudaGetLastError");
    for (int i = 0; i < w->iters; ++i) {
        float ms = 0.0f;
        check_cuda(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "cudaEventElapsedTime");
        times[i] = ms;
    }
    for (int i = 0; i <= w->iters; ++i) cudaEventDestroy(ev[i]);
    free(ev);
    if (ws != NULL) cudaFree(ws);
    cudaStreamDestroy(stream);
    result = median(times, w->iters);
#endif
    free(times);
    return result;
}

/* ---------------------------------------------------------------------------
 * Top-k selection (--pattern topk)
 * ------------------------------------------------------------------------- */

static void setup_topk(const workload *w, topk_state *tk) {
    memset(tk, 0, sizeof *tk);
    sk_topk_desc *d = &tk->desc;
    check_sk(sk_topk_desc_init(d, sizeof *d), "sk_topk_desc_init");
    d->backend = w->backend;
    d->dtype = w->dtype;
    d->batch = w->batch;
    d->seq_q = w->seq_q;
    d->seq_k = w->seq_k;
    d->heads_q = w->heads_q;
    d->heads_kv = w->heads_kv;
    d->head_dim = w->dim;
    d->block_q = w->block_q;
    d->block_k = w->block_k;
    d->k = w->k_per_row;
    d->sink_blocks = w->sink_blocks;
    d->local_blocks = w->local_blocks;
    d->mask = w->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    d->per_kv_head = w->per_kv_head;
    sk_grid grid;
    check_sk(sk_topk_layout_capacity(d, &grid, &tk->capacity), "sk_topk_layout_capacity");
    int32_t rb, cb, slices;
    check_sk(sk_grid_blocks(&grid, &rb, &cb, &slices), "sk_grid_blocks");
    tk->offsets_len = (int64_t)slices * rb + 1;
    tk->out.grid = grid;
    tk->out.nnz = tk->capacity;
    const size_t off_bytes = (size_t)tk->offsets_len * sizeof(int32_t);
    const size_t idx_bytes = (size_t)(tk->capacity > 0 ? tk->capacity : 1) * sizeof(int32_t);
    if (!w->on_gpu) {
        tk->out.row_offsets = xmalloc(off_bytes, "the topk layout");
        tk->out.col_indices = xmalloc(idx_bytes, "the topk layout");
        return;
    }
#ifndef SK_NO_CUDA
    check_cuda(cudaMalloc((void **)&tk->out.row_offsets, off_bytes), "cudaMalloc");
    check_cuda(cudaMalloc((void **)&tk->out.col_indices, idx_bytes), "cudaMalloc");
#endif
}

static void free_topk(const workload *w, topk_state *tk) {
    if (!w->on_gpu) {
        free(tk->out.row_offsets);
        free(tk->out.col_indices);
        return;
    }
#ifndef SK_NO_CUDA
    cudaFree(tk->out.row_offsets);
    cudaFree(tk->out.col_indices);
#endif
}

/* The selected layout copied into new host arrays (the caller frees them),
 * nnz = its real count row_offsets[last], validated. The selection's
 * stream work has finished (run_timed waits for its last event). */
static void fetch_topk_layout(const workload *w, const topk_state *tk, sk_bsr *host) {
    *host = tk->out;
    const size_t off_bytes = (size_t)tk->offsets_len * sizeof(int32_t);
    host->row_offsets = xmalloc(off_bytes, "the selected layout");
    if (!w->on_gpu) {
        memcpy(host->row_offsets, tk->out.row_offsets, off_bytes);
    } else {
#ifndef SK_NO_CUDA
        check_cuda(
            cudaMemcpy(host->row_offsets, tk->out.row_offsets, off_bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy (the selected layout)");
#endif
    }
    const int32_t nnz = host->row_offsets[tk->offsets_len - 1];
    if (nnz < 0 || nnz > tk->capacity)
        fail("the selected layout's count %d is outside [0, %d]", (int)nnz, (int)tk->capacity);
    host->nnz = nnz;
    host->col_indices =
        xmalloc((size_t)(nnz > 0 ? nnz : 1) * sizeof(int32_t), "the selected layout");
    if (nnz > 0) {
        if (!w->on_gpu) {
            memcpy(host->col_indices, tk->out.col_indices, (size_t)nnz * sizeof(int32_t));
        } else {
#ifndef SK_NO_CUDA
            check_cuda(cudaMemcpy(host->col_indices, tk->out.col_indices,
                                  (size_t)nnz * sizeof(int32_t), cudaMemcpyDeviceToHost),
                       "cudaMemcpy (the selected layout)");
#endif
        }
    }
    check_sk(sk_layout_validate(host), "sk_layout_validate (the selected layout)");
}

static int same_layout(const sk_bsr *a, const sk_bsr *b, int64_t offsets_len) {
    return a->nnz == b->nnz &&
           memcmp(a->row_offsets, b->row_offsets, (size_t)offsets_len * sizeof(int32_t)) == 0 &&
           memcmp(a->col_indices, b->col_indices, (size_t)a->nnz * sizeof(int32_t)) == 0;
}

/* NaN into O and LSE again, so that an element the next call does not
 * write fails the check. */
static void poison_outputs(const workload *w, tensors *t) {
    const size_t q_bytes = (size_t)t->q_elems * dtype_size(w->dtype);
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

/* ---------------------------------------------------------------------------
 * Check against the CPU reference, one head at a time
 * ------------------------------------------------------------------------- */

typedef struct check_result {
    int heads;         /* heads checked; 0: skipped */
    int64_t rows;      /* query rows checked per head */
    int64_t head_b[3]; /* the first few heads checked, for the text report */
    int64_t head_h[3];
    double max_err;     /* max |o - ref| over O (inf when a NaN differs) */
    double max_err_lse; /* the same over LSE */
    double tol;
    int passed;
} check_result;

static double tolerance(sk_dtype dtype) {
    return dtype == SK_DTYPE_F16 ? 2e-2 : dtype == SK_DTYPE_BF16 ? 5e-2 : 1e-4;
}

/* Compares one value; updates *max_err, returns 0 when it fails the rule. */
static int compare_value(double got, double want, double tol, double *max_err) {
    if (isnan(got) || isnan(want) || isinf(got) || isinf(want)) {
        if ((isnan(got) && isnan(want)) || got == want) return 1;
        *max_err = INFINITY;
        return 0;
    }
    const double err = fabs(got - want);
    if (err > *max_err) *max_err = err;
    return err <= tol * (1.0 + fabs(want));
}

static void check_one_head(const workload *w, const sk_bsr *host_layout, const tensors *t,
                           int64_t b, int64_t h, check_result *c) {
    const int64_t r0_max = w->row_blocks - ceil_div(CHECK_MAX_ROWS, w->block_q);
    const int64_t r0 = r0_max > 0 ? r0_max : 0; /* first query block checked */
    const int64_t q0 = r0 * w->block_q, sq = w->seq_q - q0, sk = w->seq_k, dim = w->dim;
    const int64_t rows_b = w->row_blocks - r0;
    const int64_t hkv = h / (w->heads_q / w->heads_kv);
    const size_t es = dtype_size(w->dtype);
    c->rows = sq;

    /* The layout slice, rows r0 .. row_blocks-1, offsets re-based to 0. */
    const int64_t g0 = layout_slice(host_layout, w, b, h) * w->row_blocks + r0;
    const int32_t base = host_layout->row_offsets[g0];
    const int32_t nnz = host_layout->row_offsets[g0 + rows_b] - base;
    int32_t *offsets = xmalloc((size_t)(rows_b + 1) * sizeof(int32_t), "the check layout");
    int32_t *indices = xmalloc((size_t)nnz * sizeof(int32_t), "the check layout");
    for (int64_t r = 0; r <= rows_b; ++r) offsets[r] = host_layout->row_offsets[g0 + r] - base;
    if (nnz > 0) memcpy(indices, host_layout->col_indices + base, (size_t)nnz * sizeof(int32_t));
    sk_bsr sub;
    memset(&sub, 0, sizeof sub);
    sub.grid.rows = sq;
    sub.grid.cols = sk;
    sub.grid.block_rows = w->block_q;
    sub.grid.block_cols = w->block_k;
    sub.grid.batch = 1;
    sub.grid.heads = 1;
    sub.nnz = nnz;
    sub.row_offsets = offsets;
    sub.col_indices = indices;
    check_sk(sk_layout_validate(&sub), "sk_layout_validate");

    /* The head's inputs, regenerated from their packed indices. */
    void *q = xmalloc((size_t)(sq * dim) * es, "the check's Q");
    void *k = xmalloc((size_t)(sk * dim) * es, "the check's K");
    void *v = xmalloc((size_t)(sk * dim) * es, "the check's V");
    void *o_ref = xmalloc((size_t)(sq * dim) * es, "the check's O");
    void *o_got = xmalloc((size_t)(sq * dim) * es, "the check's O");
    float *lse_ref = xmalloc((size_t)sq * sizeof(float), "the check's LSE");
    float *lse_got = xmalloc((size_t)sq * sizeof(float), "the check's LSE");
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < sq; ++s)
        for (int64_t d = 0; d < dim; ++d) {
            const int64_t src = ((b * w->seq_q + q0 + s) * w->heads_q + h) * dim + d;
            store_elem(q, w->dtype, s * dim + d, gen_normal(w->seed, GEN_Q, (uint64_t)src));
        }
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < sk; ++s)
        for (int64_t d = 0; d < dim; ++d) {
            const int64_t src = ((b * sk + s) * w->heads_kv + hkv) * dim + d;
            store_elem(k, w->dtype, s * dim + d, gen_normal(w->seed, GEN_K, (uint64_t)src));
            store_elem(v, w->dtype, s * dim + d, gen_normal(w->seed, GEN_V, (uint64_t)src));
        }
    memset(o_ref, 0xff, (size_t)(sq * dim) * es);

    sk_attention_desc desc;
    check_sk(sk_attention_desc_init(&desc, sizeof desc), "sk_attention_desc_init");
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = w->dtype;
    desc.batch = 1;
    desc.seq_q = sq;
    desc.seq_k = sk;
    desc.heads_q = 1;
    desc.heads_kv = 1;
    desc.head_dim = dim;
    desc.mask = w->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    check_sk(sk_attention_run(&desc, &sub, q, k, v, o_ref, lse_ref, NULL, 0, NULL),
             "sk_attention_run (CPU reference)");

    fetch_head(w, t, b, h, q0, sq, o_got, lse_got);
    for (int64_t i = 0; i < sq * dim; ++i)
        if (!compare_value(load_elem(o_got, w->dtype, i), load_elem(o_ref, w->dtype, i), c->tol,
                           &c->max_err))
            c->passed = 0;
    for (int64_t i = 0; i < sq; ++i)
        if (!compare_value(lse_got[i], lse_ref[i], c->tol, &c->max_err_lse)) c->passed = 0;

    free(offsets);
    free(indices);
    free(q);
    free(k);
    free(v);
    free(o_ref);
    free(o_got);
    free(lse_ref);
    free(lse_got);
}

static void check_heads(const workload *w, const sk_bsr *host_layout, const tensors *t,
                        check_result *c) {
    memset(c, 0, sizeof *c);
    c->tol = tolerance(w->dtype);
    c->passed = 1;
    const int64_t pairs = w->batch * w->heads_q;
    const int64_t n = w->check_heads < pairs ? w->check_heads : pairs;
    if (n == 0) return;
    /* (0, 0) first, then distinct random pairs (all of them when n covers
     * every pair). */
    int64_t *pick = xmalloc((size_t)n * sizeof(int64_t), "the check's head list");
    uint64_t counter = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (n == pairs) {
            pick[i] = i;
            continue;
        }
        if (i == 0) {
            pick[i] = 0;
            continue;
        }
        for (;;) {
            const int64_t cand =
                (int64_t)(gen_word(w->seed, GEN_PICK, counter++) % (uint64_t)pairs);
            int dup = 0;
            for (int64_t j = 0; j < i; ++j) dup |= pick[j] == cand;
            if (!dup) {
                pick[i] = cand;
                break;
            }
        }
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t b = pick[i] / w->heads_q, h = pick[i] % w->heads_q;
        if (i < 3) {
            c->head_b[i] = b;
            c->head_h[i] = h;
        }
        check_one_head(w, host_layout, t, b, h, c);
        c->heads++;
    }
    free(pick);
}

/* ---------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------- */

static void version_text(char *buf, size_t size, int v) {
    snprintf(buf, size, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; ++s) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* A JSON number, or null for NaN / inf (JSON has neither). */
static void json_number(FILE *f, double x) {
    if (isfinite(x))
        fprintf(f, "%.6g", x);
    else
        fputs("null", f);
}

static void pattern_detail(const workload *w, char *buf, size_t size) {
    switch (w->pattern) {
    case PAT_WINDOW:
        snprintf(buf, size, "window, left %lld tokens, right 0", (long long)w->window);
        break;
    case PAT_SINKS:
        snprintf(buf, size, "sinks, %lld sink tokens + %lld recent tokens", (long long)w->sinks,
                 (long long)w->window);
        break;
    case PAT_STRIDED:
        snprintf(buf, size, "strided, stride %lld blocks, local %lld blocks", (long long)w->stride,
                 (long long)ceil_div(w->window, w->block_k));
        break;
    case PAT_RANDOM:
        snprintf(buf, size, "random, k = %d of %d key blocks per row, per (b, h)",
                 (int)w->k_per_row, (int)w->col_blocks);
        break;
    case PAT_TOPK:
        snprintf(buf, size,
                 "topk selected from Q and K (block means, sk_attention_topk), k = %d of %d per "
                 "row, + %d sink and %d local blocks, per %s",
                 (int)w->k_per_row, (int)w->col_blocks, (int)w->sink_blocks, (int)w->local_blocks,
                 w->per_kv_head ? "(b, KV head)" : "(b, h)");
        break;
    default:
        snprintf(buf, size, "%s", pattern_names[w->pattern]);
        break;
    }
}

typedef struct run_stats {
    int64_t blocks_selected, blocks_total;
    double density, time_ms, tflops_actual, tflops_dense, us_per_head;
    /* topk only: time_ms is the whole sk_attention_topk */
    int topk;
    int32_t layout_nnz, layout_capacity; /* the selected layout's real count, its capacity */
    double attention_ms, selection_ms;   /* sk_attention_run alone on that layout; the rest */
} run_stats;

static void report_text(const workload *w, const run_stats *s, const check_result *c) {
    char ver[32], pat[256];
    version_text(ver, sizeof ver, sk_version());
    pattern_detail(w, pat, sizeof pat);
    printf("sparsek %s run\n", ver);
    printf("backend    %s: %s\n", w->backend_name, w->kernel);
    printf("device     %s\n", w->device);
    printf("shape      B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld\n", (long long)w->batch,
           (long long)w->heads_q, (long long)w->heads_kv, (long long)w->seq_q, (long long)w->seq_k,
           (long long)w->dim);
    printf("dtype      %s\n", dtype_name(w->dtype));
    printf("blocks     %d x %d tokens, %d x %d blocks per head\n", (int)w->block_q, (int)w->block_k,
           (int)w->row_blocks, (int)w->col_blocks);
    printf("pattern    %s; causal mask %s; seed %llu\n", pat, w->causal ? "on" : "off",
           (unsigned long long)w->seed);
    printf("density    %.2f%% (%lld of %lld blocks)\n", 100.0 * s->density,
           (long long)s->blocks_selected, (long long)s->blocks_total);
    printf("time       %.3f ms (median of %d, after %d warm-up)%s\n", s->time_ms, w->iters,
           w->warmup, s->topk ? ": sk_attention_topk, selection + attention" : "");
    if (s->topk) {
        printf("attention  %.3f ms alone on the selected layout (sk_attention_run, median)\n",
               s->attention_ms);
        printf("selection  %.3f ms (the difference: pooling, scoring, selection, planning), "
               "%.1f%% of the attention\n",
               s->selection_ms,
               s->attention_ms > 0 ? 100.0 * s->selection_ms / s->attention_ms : 0.0);
        printf("layout     %d blocks selected of a capacity of %d (its last row offset)\n",
               (int)s->layout_nnz, (int)s->layout_capacity);
    }
    printf("TFLOPS     %.4g actual, %.4g dense-equivalent\n", s->tflops_actual, s->tflops_dense);
    printf("per head   %.1f us\n", s->us_per_head);
    if (c->heads == 0) {
        printf("check      skipped (--check-rows 0)\n");
        printf("result     PASS (unchecked)\n");
        return;
    }
    printf("check      %d head%s vs the CPU reference, last %lld rows each:", c->heads,
           c->heads == 1 ? "" : "s", (long long)c->rows);
    for (int i = 0; i < c->heads && i < 3; ++i)
        printf(" (b=%lld, h=%lld)", (long long)c->head_b[i], (long long)c->head_h[i]);
    printf("%s\n", c->heads > 3 ? " ..." : "");
    printf("max error  %.3g (O), %.3g (LSE); rule |o - ref| <= %.0e * (1 + |ref|)\n", c->max_err,
           c->max_err_lse, c->tol);
    printf("result     %s\n", c->passed ? "PASS" : "FAIL");
}

static void report_json(const workload *w, const run_stats *s, const check_result *c) {
    char ver[32], pat[256];
    version_text(ver, sizeof ver, sk_version());
    pattern_detail(w, pat, sizeof pat);
    FILE *f = stdout;
    fputs("{\"version\": ", f);
    json_string(f, ver);
    fputs(", \"backend\": ", f);
    json_string(f, w->backend_name);
    fputs(", \"kernel\": ", f);
    json_string(f, w->kernel);
    fputs(", \"device\": ", f);
    json_string(f, w->device);
    fprintf(f,
            ", \"batch\": %lld, \"heads_q\": %lld, \"heads_kv\": %lld, \"seq_q\": %lld, "
            "\"seq_k\": %lld, \"head_dim\": %lld",
            (long long)w->batch, (long long)w->heads_q, (long long)w->heads_kv, (long long)w->seq_q,
            (long long)w->seq_k, (long long)w->dim);
    fprintf(f, ", \"dtype\": \"%s\", \"block_q\": %d, \"block_k\": %d, \"pattern\": ",
            dtype_name(w->dtype), (int)w->block_q, (int)w->block_k);
    json_string(f, pattern_names[w->pattern]);
    fputs(", \"pattern_detail\": ", f);
    json_string(f, pat);
    fputs(", \"density\": ", f);
    json_number(f, s->density);
    fprintf(f, ", \"blocks_selected\": %lld, \"blocks_total\": %lld", (long long)s->blocks_selected,
            (long long)s->blocks_total);
    fprintf(f, ", \"causal\": %s, \"seed\": %llu, \"iters\": %d, \"warmup\": %d",
            w->causal ? "true" : "false", (unsigned long long)w->seed, w->iters, w->warmup);
    fputs(", \"time_ms\": ", f);
    json_number(f, s->time_ms);
    fputs(", \"tflops_actual\": ", f);
    json_number(f, s->tflops_actual);
    fputs(", \"tflops_dense_equiv\": ", f);
    json_number(f, s->tflops_dense);
    fputs(", \"us_per_head\": ", f);
    json_number(f, s->us_per_head);
    if (s->topk) {
        fprintf(f,
                ", \"topk_k\": %d, \"sink_blocks\": %d, \"local_blocks\": %d, \"per_kv_head\": %s, "
                "\"layout_nnz\": %d, \"layout_capacity\": %d",
                (int)w->k_per_row, (int)w->sink_blocks, (int)w->local_blocks,
                w->per_kv_head ? "true" : "false", (int)s->layout_nnz, (int)s->layout_capacity);
        fputs(", \"attention_only_ms\": ", f);
        json_number(f, s->attention_ms);
        fputs(", \"selection_ms\": ", f);
        json_number(f, s->selection_ms);
    }
    fprintf(f, ", \"checked_heads\": %d, \"checked_rows_per_head\": %lld", c->heads,
            (long long)c->rows);
    fputs(", \"max_abs_err\": ", f);
    if (c->heads > 0)
        json_number(f, c->max_err);
    else
        fputs("null", f);
    fputs(", \"max_abs_err_lse\": ", f);
    if (c->heads > 0)
        json_number(f, c->max_err_lse);
    else
        fputs("null", f);
    fputs(", \"tolerance\": ", f);
    json_number(f, c->tol);
    fprintf(f, ", \"check_passed\": %s}\n", c->heads == 0 ? "null" : c->passed ? "true" : "false");
}

/* ---------------------------------------------------------------------------
 * Commands
 * ------------------------------------------------------------------------- */

/* Density and TFLOPS from the layout the attention read and s->time_ms. */
static void fill_stats(const workload *w, const sk_bsr *layout, run_stats *s) {
    s->blocks_selected = selected_blocks(layout, w);
    s->blocks_total = w->batch * w->heads_q * (int64_t)w->row_blocks * w->col_blocks;
    s->density = (double)s->blocks_selected / (double)s->blocks_total;
    const double secs = s->time_ms * 1e-3;
    const double flop_actual =
        4.0 * (double)w->dim * (double)s->blocks_selected * w->block_q * (double)w->block_k;
    const double flop_dense = 4.0 * (double)w->batch * (double)w->heads_q * (double)w->seq_q *
                              (double)w->seq_k * (double)w->dim;
    s->tflops_actual = secs > 0 ? flop_actual / secs * 1e-12 : INFINITY;
    s->tflops_dense = secs > 0 ? flop_dense / secs * 1e-12 : INFINITY;
    s->us_per_head = s->time_ms * 1e3 / ((double)w->batch * (double)w->heads_q);
}

/* --pattern topk: time sk_attention_topk (the selection from the workload's
 * own Q and K, then the attention), copy the selected layout back, time the
 * attention alone on it, then check one more sk_attention_topk call against
 * the CPU reference on the layout that call selected. */
static int cmd_run_topk(const run_opts *opts, workload *w) {
    tensors t;
    setup_tensors(w, NULL, &t);
    topk_state tk;
    setup_topk(w, &tk);
    run_stats s;
    memset(&s, 0, sizeof s);
    s.topk = 1;
    s.layout_capacity = tk.capacity;
    s.time_ms = run_timed(w, &t, &tk);

    sk_bsr sel;
    fetch_topk_layout(w, &tk, &sel);
    t.layout = tk.out; /* the backend's arrays, with the real count */
    t.layout.nnz = sel.nnz;
    s.attention_ms = run_timed(w, &t, NULL);
    s.selection_ms = s.time_ms - s.attention_ms;
    s.layout_nnz = sel.nnz;
    fill_stats(w, &sel, &s);

    check_result c;
    if (w->check_heads > 0) {
        poison_outputs(w, &t);
        workload once = *w;
        once.iters = 1;
        once.warmup = 0;
        (void)run_timed(&once, &t, &tk);
        sk_bsr again;
        fetch_topk_layout(w, &tk, &again);
        if (!same_layout(&sel, &again, tk.offsets_len))
            fail("two sk_attention_topk calls on the same Q and K selected different layouts");
        free(again.row_offsets);
        free(again.col_indices);
    }
    check_heads(w, &sel, &t, &c);
    if (opts->json)
        report_json(w, &s, &c);
    else
        report_text(w, &s, &c);
    t.layout.row_offsets = NULL; /* tk's arrays: freed by free_topk */
    t.layout.col_indices = NULL;
    free_tensors(&t);
    free_topk(w, &tk);
    free(sel.row_offsets);
    free(sel.col_indices);
    return c.passed ? 0 : 1;
}

static int cmd_run(int argc, char **argv) {
    run_opts opts;
    parse_run_opts(argc, argv, &opts);
    int32_t gpu_count = 0;
    check_sk(sk_device_count(&gpu_count), "sk_device_count");
    workload w;
    resolve_workload(&opts, gpu_count, &w);
    if (w.pattern == PAT_TOPK) return cmd_run_topk(&opts, &w);

    sk_layout_t layout = build_layout(&w);
    sk_bsr host_layout;
    check_sk(sk_layout_view(layout, &host_layout), "sk_layout_view");
    check_sk(sk_layout_validate(&host_layout), "sk_layout_validate");

    run_stats s;
    memset(&s, 0, sizeof s);
    tensors t;
    setup_tensors(&w, &host_layout, &t);
    s.time_ms = run_timed(&w, &t, NULL);
    fill_stats(&w, &host_layout, &s);

    check_result c;
    check_heads(&w, &host_layout, &t, &c);
    if (opts.json)
        report_json(&w, &s, &c);
    else
        report_text(&w, &s, &c);
    free_tensors(&t);
    sk_layout_destroy(layout);
    return c.passed ? 0 : 1;
}

static int cmd_info(int argc, char **argv) {
    int json = 0;
    for (int i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, stdout);
            fputs(usage_more, stdout);
            exit(0);
        } else
            usage_error("info: unknown argument '%s'", argv[i]);
    }
    char ver[32], header_ver[32];
    version_text(ver, sizeof ver, sk_version());
    version_text(header_ver, sizeof header_ver, SK_VERSION);
    int32_t count = 0;
    check_sk(sk_device_count(&count), "sk_device_count");
    if (json) {
        printf("{\"version\": \"%s\", \"header_version\": \"%s\", \"build\": ", ver, header_ver);
        json_string(stdout, sk_build_info());
        printf(", \"gpus\": [");
    } else {
        printf("sparsek %s (header %s)\n", ver, header_ver);
        printf("build      %s\n", sk_build_info());
        if (count == 0) printf("GPUs       no GPU found\n");
    }
    for (int32_t d = 0; d < count; ++d) {
        sk_device_info info;
        check_sk(sk_device_get_info(d, &info), "sk_device_get_info");
        const double gib = (double)info.memory_bytes / (1024.0 * 1024.0 * 1024.0);
        const double l2_mib = (double)info.l2_bytes / (1024.0 * 1024.0);
        if (json) {
            printf("%s{\"index\": %d, \"name\": ", d ? ", " : "", (int)d);
            json_string(stdout, info.name);
            printf(", \"compute_capability\": \"%d.%d\", \"sms\": %d, \"memory_bytes\": %lld, "
                   "\"l2_bytes\": %lld}",
                   (int)info.cc_major, (int)info.cc_minor, (int)info.sm_count,
                   (long long)info.memory_bytes, (long long)info.l2_bytes);
        } else {
            printf("GPU %d      %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %.1f MiB\n",
                   (int)d, info.name, (int)info.cc_major, (int)info.cc_minor, (int)info.sm_count,
                   gib, l2_mib);
        }
    }
    if (json) printf("]}\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_short, stderr);
        fputs("(sparsek --help lists the flags)\n", stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        fputs(usage_more, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        char ver[32];
        version_text(ver, sizeof ver, sk_version());
        printf("sparsek %s\n", ver);
        return 0;
    }
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
    usage_error("unknown command '%s'", cmd);
    return 2;
}
