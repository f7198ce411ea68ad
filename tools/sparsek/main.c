/*
 * main.c - the SparseK command-line tool: command dispatch, `info`, and the
 * sequence of `run` (cli.h lists the files that do each step).
 *
 *   sparsek info [--json]    version, build, and the GPUs found
 *   sparsek run [flags]      build a workload, run it, time it, check it
 *   sparsek --help           usage
 *
 * `run` makes seeded N(0, 1) Q, K and V and a block layout from a named
 * pattern (for `--pattern topk`, sk_attention_topk selects the layout from
 * Q and K itself: topk.c), runs the attention on the chosen backend (the
 * CUDA backend when a GPU is present, else the CPU reference on a smaller
 * default workload), times it, checks sampled rows against a naive fp64
 * attention, and prints time, TFLOPS, density and the error (text, or one
 * JSON object with --json). Exit status: 0 success, 1 a failed call or a
 * failed check, 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int cmd_run(int argc, char **argv) {
    run_opts opts;
    parse_run_opts(argc, argv, &opts);
    progress_start(opts.progress);
    int32_t gpu_count = 0;
    check_sk(sk_device_count(&gpu_count), "sk_device_count");
    workload w;
    resolve_workload(&opts, gpu_count, &w);
    if (w.pattern == PAT_TOPK) return cmd_run_topk(&opts, &w);

    sk_layout_t layout = build_layout(&w);
    sk_bsr host_layout;
    check_sk(sk_layout_view(layout, &host_layout), "sk_layout_view");
    check_sk(sk_layout_validate(&host_layout), "sk_layout_validate");
    progress_expect(expected_seconds(&w, selected_blocks(&host_layout, &w)));

    run_stats s;
    memset(&s, 0, sizeof s);
    tensors t;
    setup_tensors(&w, &host_layout, &t);
    s.time = run_timed(&w, &t, NULL, "sk_attention_run");
    fill_stats(&w, &host_layout, &s);

    check_result c;
    check_heads(&w, &host_layout, &t, &c);
    report_run(&w, &s, &c, opts.json);
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
            print_usage(stdout, 1);
            return 0;
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
        print_usage(stderr, 0);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        print_usage(stdout, 1);
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
}
