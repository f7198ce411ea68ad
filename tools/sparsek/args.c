/*
 * args.c - the flags of `sparsek run`: their table, their parsing into
 * run_opts (with ranges checked; a bad flag is a usage error, exit 2), and
 * the usage text that documents them.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *const pattern_names[PAT_COUNT] = {"dense",   "causal", "window", "sinks",
                                              "strided", "random", "topk"};

const char *const backend_choice_names[BK_COUNT] = {"auto", "cpu", "cuda", "sm80", "sm90"};

const int_flag int_flags[OPT_INT_COUNT] = {
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
    "       block-sparse attention forward, time it, check sampled rows against\n"
    "       a naive fp64 attention, and print the result.\n"
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
    "  --dtype T        f16 | bf16 | f32 | e4m3 (default f16; f32 on the CPU backend\n"
    "                   only; e4m3: see FP8 below)\n"
    "  --block N        bq = bk, 64 or 128 (default 128);  --block-q N, --block-k N\n"
    "  --pattern P      dense | causal | window | sinks | strided | random | topk\n"
    "                   (default random). topk selects the blocks from the workload's\n"
    "                   own Q and K (block means, scores pooled Q . pooled K, top k\n"
    "                   per row) with sk_attention_topk on the chosen backend, and\n"
    "                   times selection + attention as one call\n"
    "  --density X      target fraction in (0, 1] (default 0.25): random and topk\n"
    "                   pick k = round(X * key blocks) blocks per row (at least 1);\n"
    "                   it also sets the default --window (round(X * Sk) tokens) of\n"
    "                   window and sinks, and the default --stride (round(1/X), at\n"
    "                   most --stride's maximum) of strided\n"
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
    "  --check-rows N   number of (batch, head) pairs checked: (0, 0) and N-1 drawn\n"
    "                   at random (default 2; 0 skips the check). Each covers the\n"
    "                   last min(Sq, 4096) query rows of the head (whole blocks).\n"
    "  --json           print one JSON object instead of text (progress lines stay\n"
    "                   on stderr)\n"
    "  --quiet          no progress lines;  --progress   progress lines from the\n"
    "                   start, however short the run\n";

/* The rest of the help (one string would pass C99's 4095-character limit). */
static const char usage_more[] =
    "\n"
    "The check recomputes each checked row in fp64 from the inputs (regenerated\n"
    "from the seed, rounded to the dtype) and the layout: a dense softmax over the\n"
    "keys of the row's selected blocks, tails and the causal mask applied; an empty\n"
    "row gives O = 0, LSE = -inf. This code is the CLI's own, not the CPU backend's.\n"
    "It passes when every element of O and LSE satisfies |o - ref| <= tol * (1 +\n"
    "|ref|), with tol = 2e-2 for f16, 5e-2 for bf16 and 1e-4 for f32, and NaN / inf\n"
    "positions match. Outputs are filled with NaN before the run, so an unwritten\n"
    "element fails. Exit status: 0 pass, 1 a failed call or check, 2 bad usage.\n"
    "\n"
    "Progress: a run expected to take more than 2 s, or still going after 2 s,\n"
    "prints progress lines on stderr (workload built, calls done, check), at most\n"
    "4 a second. Expected: 4 * D * bq * bk flops per selected block and call, at\n"
    "4 GFLOP/s per CPU thread (CPU backend) or 100 TFLOP/s (GPU), plus the inputs\n"
    "(30 ns per element per thread) and the check (1 GFLOP/s per thread).\n"
    "\n"
    "Timing: median and minimum of --iters calls after --warmup, with CUDA events\n"
    "between calls queued back to back on one stream (host clock on the CPU);\n"
    "sk_attention_plan runs once before and is timed the same way on its own\n"
    "(plan_ms). TFLOPS: actual = 4 * D * (selected blocks over all (b, h)) * bq *\n"
    "bk / time; dense-equivalent = 4 * B * Hq * Sq * Sk * D / time. On a GPU with\n"
    "NVML (libnvidia-ml.so.1) the JSON has the energy per call (energy_j_per_call)\n"
    "and the mean power (power_w) over >= 2 s of extra calls after the timed ones,\n"
    "null where unknown.\n"
    "\n"
    "topk: `time` is the whole sk_attention_topk (pooling, scoring, selection,\n"
    "planning, attention), and the TFLOPS use it; `attention` is sk_attention_run\n"
    "alone on the layout the selection produced, `selection` the difference. The\n"
    "density is the layout's real count (its last row offset, copied back after\n"
    "the timing). The check runs on the output of one more sk_attention_topk call,\n"
    "against the layout that call selected (copied back).\n";

/* FP8 (--dtype e4m3): its own part of the help. */
static const char usage_fp8[] =
    "\n"
    "FP8 (--dtype e4m3): Q, K and V are generated in bf16 as for --dtype bf16, then\n"
    "quantized once by sk_quantize_e4m3 on the backend (per (b, h) amax descales;\n"
    "not timed); the attention runs on the e4m3 codes with the descales, O in bf16.\n"
    "  --v-layout L     rows | vt (default rows): V as rows [B, Sk, Hkv, D], or V^T\n"
    "                   as the quantizer writes it for the FP8 kernel\n"
    "                   (SK_QUANT_LAYOUT_VT_FP8)\n"
    "CUDA: the Hopper FP8 kernel (compute capability 9.0, D 64 or 128, blocks of\n"
    "64 or 128); other cases, and --backend sm80, fail with the library's message.\n"
    "The check dequantizes the codes (requantized on the host by the CPU\n"
    "quantizer) and runs the fp64 reference on them; its tolerance is the GPU\n"
    "tests' rule: per row 2 x (yardstick + 2^-8 |ref| + 2^-13 (smag vmax + vmax))\n"
    "+ 1e-5 for O, where the yardstick is a naive FP8 attention's deviation (P\n"
    "rounded to e4m3; scores summed as the FP8 tensor cores sum them), smag the\n"
    "row's largest scaled sum |q k| and vmax its largest |v|; LSE 2 x (LSE\n"
    "yardstick + 2^-13 smag + 2^-23 (|ref| + 1)) + 1e-5.\n";

void print_usage(FILE *f, int full) {
    if (!full) {
        fputs(usage_short, f);
        fputs("(sparsek --help lists the flags)\n", f);
        return;
    }
    fputs(usage_text, f);
    fputs(usage_more, f);
    fputs(usage_fp8, f);
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

void parse_run_opts(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->density = 0.25;
    o->seed = 1;
    o->dtype = SK_DTYPE_F16;
    o->pattern = PAT_RANDOM;
    o->backend = BK_AUTO;
    o->progress = PROGRESS_AUTO;
    for (int i = 0; i < argc; ++i) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_usage(stdout, 1);
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
        static const char *const switches[] = {"--json", "--no-causal", "--per-kv-head", "--quiet",
                                               "--progress"};
        const int switch_id = lookup(name, switches, 5);
        if (switch_id >= 0) {
            if (value != NULL) usage_error("%s takes no value", name);
            switch (switch_id) {
            case 0:
                o->json = 1;
                break;
            case 1:
                o->causal = 0;
                o->causal_set = 1;
                break;
            case 2:
                o->per_kv_head = 1;
                break;
            default: {
                const progress_mode mode = switch_id == 3 ? PROGRESS_OFF : PROGRESS_ON;
                if (o->progress != PROGRESS_AUTO && o->progress != mode)
                    usage_error("--quiet and --progress contradict each other: give one");
                o->progress = mode;
                break;
            }
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
        static const char *const other_flags[] = {"--density", "--seed",    "--dtype",
                                                  "--pattern", "--backend", "--v-layout"};
        const int other_id = lookup(name, other_flags, 6);
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
            static const char *const dtypes[] = {"f16", "bf16", "f32", "e4m3"};
            static const sk_dtype ids[] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32,
                                           SK_DTYPE_E4M3};
            const int d = lookup(value, dtypes, 4);
            if (d < 0) usage_error("--dtype: '%s' is not f16, bf16, f32 or e4m3", value);
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
        case 4: {
            const int b = lookup(value, backend_choice_names, BK_COUNT);
            if (b < 0) usage_error("--backend: '%s' is not auto, cpu, cuda, sm80 or sm90", value);
            o->backend = (backend_choice)b;
            break;
        }
        default: {
            static const char *const layouts[] = {"rows", "vt"};
            const int l = lookup(value, layouts, 2);
            if (l < 0) usage_error("--v-layout: '%s' is not rows or vt", value);
            o->v_vt = l;
            o->v_layout_set = 1;
            break;
        }
        }
    }
}
