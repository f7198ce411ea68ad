/*
 * test_check.c - proves that `sparsek run`'s check (tools/sparsek/check.c)
 * can fail. A CPU run of the CLI's own workload passes it; the same output
 * with one element of O changed, a NaN in O, a wrong or NaN LSE, or nothing
 * written fails it, and passes again once restored; so does the output of a
 * run that ignores the causal mask. The reference is independent of the CPU
 * backend: on f16 its error is not zero. Also checks the estimate that turns
 * progress lines on (run.c).
 *
 * Built from the files of tools/sparsek/ but main.c (`make build/test_cli_check`);
 * tests/cli/test_cli.sh runs it and counts its lines. Prints one PASS / FAIL
 * line per assertion and "N passed, M failed".
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "host_data.h"

static int passed, failed;

static void expect(int cond, const char *dtype, const char *what) {
    printf("%s check, %s: %s\n", cond ? "PASS" : "FAIL", dtype, what);
    if (cond)
        ++passed;
    else
        ++failed;
}

/* One CPU run of the CLI's workload, as `sparsek run` makes it. */
typedef struct fixture {
    workload w;
    sk_layout_t layout;
    sk_bsr host_layout;
    tensors t;
} fixture;

static void fixture_run(fixture *f, char **args, int n) {
    run_opts opts;
    parse_run_opts(n, args, &opts);
    resolve_workload(&opts, 0, &f->w);
    f->layout = build_layout(&f->w);
    check_sk(sk_layout_view(f->layout, &f->host_layout), "sk_layout_view");
    setup_tensors(&f->w, &f->host_layout, &f->t);
    (void)run_timed(&f->w, &f->t, NULL, NULL);
}

static void fixture_free(fixture *f) {
    free_tensors(&f->t);
    sk_layout_destroy(f->layout);
}

static check_result check(const fixture *f) {
    check_result c;
    check_heads(&f->w, &f->host_layout, &f->t, &c);
    return c;
}

/* Element (b, q, h, d) of the packed O [B, Sq, Hq, D]. */
static int64_t o_index(const workload *w, int64_t b, int64_t q, int64_t h, int64_t d) {
    return ((b * w->seq_q + q) * w->heads_q + h) * w->dim + d;
}

/* Stores value into O's element i, checks, restores it, checks again. */
static void corrupt_o(fixture *f, int64_t i, float value, const char *dtype, const char *what) {
    const size_t es = host_dtype_size(f->w.dtype);
    unsigned char saved[4];
    memcpy(saved, (char *)f->t.o + (size_t)i * es, es);
    host_store(f->t.o, f->w.dtype, i, value);
    expect(!check(f).passed, dtype, what);
    memcpy((char *)f->t.o + (size_t)i * es, saved, es);
    expect(check(f).passed, dtype, "passes again once O is restored");
}

static void corrupt_lse(fixture *f, int64_t i, float value, const char *dtype, const char *what) {
    const float saved = f->t.lse[i];
    f->t.lse[i] = value;
    expect(!check(f).passed, dtype, what);
    f->t.lse[i] = saved;
    expect(check(f).passed, dtype, "passes again once LSE is restored");
}

/* GQA, batch 2, tails, Sq != Sk, 64 x 128 blocks, causal: every (b, h) checked. */
static void test_dtype(const char *dtype) {
    char *args[] = {"--backend", "cpu",        "--batch",    "2",        "--heads",
                    "4",         "--heads-kv", "2",          "--seq-q",  "200",
                    "--seq-k",   "333",        "--dim",      "40",       "--block-q",
                    "64",        "--block-k",  "128",        "--causal", "--check-rows",
                    "8",         "--dtype",    (char *)dtype};
    fixture f;
    fixture_run(&f, args, (int)(sizeof args / sizeof args[0]));
    const workload *w = &f.w;
    const check_result c = check(&f);
    expect(c.passed && c.heads == 8 && c.rows == 200, dtype, "the run's output passes, all rows");
    if (w->dtype == SK_DTYPE_F16)
        expect(c.max_err > 0, dtype, "the fp64 reference is not the CPU backend (error > 0)");

    const int64_t i = o_index(w, 1, 150, 3, 7);
    corrupt_o(&f, i, host_load(f.t.o, w->dtype, i) + 1.0f, dtype,
              "one element of O off by 1 fails");
    corrupt_o(&f, o_index(w, 0, 199, 0, 39), NAN, dtype,
              "a NaN in the last element of a head fails");
    corrupt_o(&f, o_index(w, 0, 0, 1, 0), INFINITY, dtype, "an inf in O fails");
    const int64_t l = (1 * w->heads_q + 2) * w->seq_q + 77; /* LSE [B, Hq, Sq] */
    corrupt_lse(&f, l, f.t.lse[l] + 1.0f, dtype, "one LSE off by 1 fails");
    corrupt_lse(&f, l, NAN, dtype, "a NaN LSE fails");
    corrupt_lse(&f, l, -INFINITY, dtype, "an LSE of -inf (an empty row) fails");

    poison_outputs(w, &f.t);
    expect(!check(&f).passed, dtype, "an output never written (all NaN) fails");

    workload no_mask = *w; /* a backend that ignores the causal mask */
    no_mask.causal = 0;
    (void)run_timed(&no_mask, &f.t, NULL, NULL);
    expect(!check(&f).passed, dtype, "the output of a run without the causal mask fails");
    (void)run_timed(w, &f.t, NULL, NULL);
    expect(check(&f).passed, dtype, "the right run passes again");
    fixture_free(&f);
}

/* --dtype e4m3 (rows V and V^T): the FP8 rule of check_fp8.c passes the
 * run (after test_dtype's corruptions) and fails runs that are wrong in
 * FP8's own ways: a dropped descale, and the bf16 values instead of their
 * e4m3 codes (the quantization the run skipped is far outside what P's
 * rounding costs). */
static void test_fp8(const char *v_layout) {
    char *args[] = {"--backend", "cpu",       "--batch",  "1",     "--heads",      "4",
                    "--heads-kv", "2",        "--seq-q",  "300",   "--seq-k",      "333",
                    "--dim",     "64",        "--causal", "--check-rows", "4", "--dtype",
                    "e4m3",      "--v-layout", (char *)v_layout};
    const char *name = v_layout[0] == 'v' ? "e4m3 V^T" : "e4m3 rows";
    fixture f;
    fixture_run(&f, args, (int)(sizeof args / sizeof args[0]));
    workload *w = &f.w;
    const check_result c = check(&f);
    expect(c.passed && c.fp8_rule && c.heads == 4 && c.max_err > 0, name,
           "the run's output passes the FP8 rule (bf16 O: error > 0)");
    float *saved = f.t.v_descale;
    f.t.v_descale = NULL; /* V's descale dropped: O off by its scale */
    (void)run_timed(w, &f.t, NULL, NULL);
    expect(!check(&f).passed, name, "a run without V's descale fails");
    f.t.v_descale = saved;
    w->fp8 = 0; /* the run reads the bf16 values: no quantization error */
    (void)run_timed(w, &f.t, NULL, NULL);
    w->fp8 = 1;
    expect(!check(&f).passed, name, "a run on the bf16 values, not the e4m3 codes, fails");
    (void)run_timed(w, &f.t, NULL, NULL);
    expect(check(&f).passed, name, "the right run passes again");
    fixture_free(&f);
}

/* The estimate behind the progress lines, on two threads: the README's 64K
 * CPU example (about 80 s on two cores) is long, the default CPU run short. */
static void test_expected_seconds(void) {
    omp_set_num_threads(2);
    char *long_args[] = {"--backend", "cpu",   "--pattern", "window",  "--window",
                         "2048",      "--seq", "65536",     "--batch", "1",
                         "--heads",   "32",    "--dtype",   "bf16"};
    char *short_args[] = {"--backend", "cpu"};
    run_opts opts;
    workload w;
    parse_run_opts((int)(sizeof long_args / sizeof long_args[0]), long_args, &opts);
    resolve_workload(&opts, 0, &w);
    /* The window's blocks: about 17 per row of 512. */
    const double long_s = expected_seconds(&w, w.batch * w.heads_q * w.row_blocks * 17);
    parse_run_opts((int)(sizeof short_args / sizeof short_args[0]), short_args, &opts);
    resolve_workload(&opts, 0, &w);
    const double short_s = expected_seconds(&w, w.batch * w.heads_q * w.row_blocks * 2);
    expect(long_s > 10 * PROGRESS_AFTER_S && long_s < 1000, "bf16",
           "the 64K window example is expected to take long (progress from the start)");
    expect(short_s < PROGRESS_AFTER_S / 4, "f16", "the default CPU run is expected to be quick");
}

int main(void) {
    progress_start(PROGRESS_OFF);
    printf("seed 1 (the CLI's default); tools/sparsek/check.c against corrupted outputs\n");
    test_dtype("f16");
    test_dtype("bf16");
    test_dtype("f32");
    test_dtype("e4m3");
    test_fp8("rows");
    test_fp8("vt");
    test_expected_seconds();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
