/*
 * report.c - the figures of a run (density, TFLOPS) and its report: text
 * on stdout, or one JSON object on stdout with --json.
 */
#include <math.h>
#include <stdio.h>

#include "cli.h"
#include "host_data.h"

void version_text(char *buf, size_t size, int v) {
    snprintf(buf, size, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

void json_string(FILE *f, const char *s) {
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

/* A measured quantity that is negative when unknown: the number, or null. */
static void json_number_or_null(FILE *f, double x) {
    if (x < 0)
        fputs("null", f);
    else
        json_number(f, x);
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
    if (w->fp8)
        printf("dtype      e4m3 (bf16 values quantized by sk_quantize_e4m3, V %s; O bf16)\n",
               w->v_vt ? "as V^T" : "as rows");
    else
        printf("dtype      %s\n", host_dtype_name(w->dtype));
    printf("blocks     %d x %d tokens, %d x %d blocks per head\n", (int)w->block_q, (int)w->block_k,
           (int)w->row_blocks, (int)w->col_blocks);
    printf("pattern    %s; causal mask %s; seed %llu\n", pat, w->causal ? "on" : "off",
           (unsigned long long)w->seed);
    printf("density    %.2f%% (%lld of %lld blocks)\n", 100.0 * s->density,
           (long long)s->blocks_selected, (long long)s->blocks_total);
    char min_text[48] = "";
    if (w->iters > 1) snprintf(min_text, sizeof min_text, "; min %.3f ms", s->time.min_ms);
    printf("time       %.3f ms (median of %d, after %d warm-up%s)%s\n", s->time.median_ms, w->iters,
           w->warmup, min_text, s->topk ? ": sk_attention_topk, selection + attention" : "");
    if (s->time.energy_j_per_call >= 0)
        printf("energy     %.3f J per call, %.0f W mean over the timed calls (NVML)\n",
               s->time.energy_j_per_call, s->time.power_w);
    if (!s->topk && w->on_gpu) /* the CPU backend plans nothing */
        printf("plan       %.3f ms (sk_attention_plan, median)\n", s->time.plan_ms);
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
    printf("check      %d head%s vs a naive fp64 attention, last %lld rows each:", c->heads,
           c->heads == 1 ? "" : "s", (long long)c->rows);
    for (int i = 0; i < c->heads && i < 3; ++i)
        printf(" (b=%lld, h=%lld)", (long long)c->head_b[i], (long long)c->head_h[i]);
    printf("%s\n", c->heads > 3 ? " ..." : "");
    if (c->fp8_rule)
        printf("max error  %.3g (O), %.3g (LSE); rule: FP8, per row from a naive FP8 attention "
               "(sparsek --help)\n",
               c->max_err, c->max_err_lse);
    else
        printf("max error  %.3g (O), %.3g (LSE); rule |o - ref| <= %.0e * (1 + |ref|)\n",
               c->max_err, c->max_err_lse, c->tol);
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
            w->fp8 ? "e4m3" : host_dtype_name(w->dtype), (int)w->block_q, (int)w->block_k);
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
    json_number(f, s->time.median_ms);
    fputs(", \"time_min_ms\": ", f);
    json_number(f, s->time.min_ms);
    if (!s->topk) {
        fputs(", \"plan_ms\": ", f);
        json_number(f, s->time.plan_ms);
    }
    fputs(", \"energy_j_per_call\": ", f);
    json_number_or_null(f, s->time.energy_j_per_call);
    fputs(", \"power_w\": ", f);
    json_number_or_null(f, s->time.power_w);
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
    if (c->fp8_rule) /* per row (check_fp8.c) */
        fputs("\"fp8 yardstick rule\"", f);
    else
        json_number(f, c->tol);
    if (w->fp8) fprintf(f, ", \"v_layout\": \"%s\", \"out_dtype\": \"bf16\"", w->v_vt ? "vt" : "rows");
    fprintf(f, ", \"check_passed\": %s}\n", c->heads == 0 ? "null" : c->passed ? "true" : "false");
}

void fill_stats(const workload *w, const sk_bsr *layout, run_stats *s) {
    s->blocks_selected = selected_blocks(layout, w);
    s->blocks_total = w->batch * w->heads_q * (int64_t)w->row_blocks * w->col_blocks;
    s->density = (double)s->blocks_selected / (double)s->blocks_total;
    const double secs = s->time.median_ms * 1e-3;
    const double flop_actual =
        4.0 * (double)w->dim * (double)s->blocks_selected * w->block_q * (double)w->block_k;
    const double flop_dense = 4.0 * (double)w->batch * (double)w->heads_q * (double)w->seq_q *
                              (double)w->seq_k * (double)w->dim;
    s->tflops_actual = secs > 0 ? flop_actual / secs * 1e-12 : INFINITY;
    s->tflops_dense = secs > 0 ? flop_dense / secs * 1e-12 : INFINITY;
    s->us_per_head = s->time.median_ms * 1e3 / ((double)w->batch * (double)w->heads_q);
}

void report_run(const workload *w, const run_stats *s, const check_result *c, int json) {
    if (json)
        report_json(w, s, c);
    else
        report_text(w, s, c);
}
