/*
 * main.c - the GPU test runner:
 *   sk_gpu_tests [--backend cuda|sm80|sm90] [--quick] [--ref cpu|fp64]
 *                [--verbose] [name-filter]
 * --backend   the descriptor backend of every GPU call (default cuda: the
 *             library's choice), so one suite serves every CUDA kernel;
 * --quick     a few small cases only (for compute-sanitizer);
 * --ref fp64  compare with the suite's own fp64 values instead of the CPU
 *             backend (for when the CPU reference itself is in doubt).
 * Timing lives in `sparsek run --json` (bench/README.md).
 * Prints "N passed, M failed" last (tests); each test that runs attention
 * cases prints how many it ran.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/gpu_bwd.h"
#include "gpu/gpu_util.h"

static void usage(void) {
    printf("usage: sk_gpu_tests [--backend cuda|sm80|sm90] [--quick] [--ref cpu|fp64] "
           "[--verbose] [name-filter]\n");
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            const char *b = argv[++i];
            if (strcmp(b, "cuda") == 0)
                gt_opt.backend = SK_BACKEND_CUDA;
            else if (strcmp(b, "sm80") == 0)
                gt_opt.backend = SK_BACKEND_CUDA_SM80;
            else if (strcmp(b, "sm90") == 0)
                gt_opt.backend = SK_BACKEND_CUDA_SM90;
            else {
                usage();
                return EXIT_FAILURE;
            }
        } else if (strcmp(argv[i], "--quick") == 0) {
            gt_opt.quick = 1;
        } else if (strcmp(argv[i], "--ref") == 0 && i + 1 < argc) {
            gt_opt.use_naive_ref = strcmp(argv[++i], "fp64") == 0;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            gt_opt.verbose = 1;
        } else if (argv[i][0] == '-') {
            usage();
            return EXIT_FAILURE;
        } else {
            filter = argv[i];
        }
    }
    int32_t count = 0;
    sk_device_count(&count);
    if (count < 1) {
        printf("no CUDA device: %s\n", sk_build_info());
        printf("0 passed, 1 failed\n");
        return EXIT_FAILURE;
    }
    sk_device_info info;
    if (sk_device_get_info(0, &info) == SK_STATUS_SUCCESS)
        printf("device 0: %s, compute capability %d.%d, %d SMs; %s\n", info.name,
               (int)info.cc_major, (int)info.cc_minor, (int)info.sm_count, sk_build_info());
    printf("backend %s%s, reference %s\n",
           gt_opt.backend == SK_BACKEND_CUDA_SM80   ? "sm80"
           : gt_opt.backend == SK_BACKEND_CUDA_SM90 ? "sm90"
                                                    : "cuda",
           gt_opt.quick ? " (quick)" : "", gt_opt.use_naive_ref ? "fp64 (suite)" : "CPU backend");
    (void)tu_base_seed(); /* prints the seed */
    const int failed = sk_test_run_all(filter);
    printf("cases: %d run, %d failed, %d declined as documented by the forced backend\n",
           gt_cases_run, gt_cases_failed, gt_cases_declined);
    printf("gemm cases: %d run, %d failed, %d declined\n", gt_gemm_cases_run,
           gt_gemm_cases_failed, gt_gemm_cases_declined);
    printf("backward cases: %d run, %d failed, %d declined\n", gb_cases_run, gb_cases_failed,
           gb_cases_declined);
    printf("backward runs on the Hopper dK/dV kernel: %lld\n", (long long)gb_hopper_dkv_runs);
    printf("of those, fused (deterministic = 0): %lld\n", (long long)gb_hopper_fused_runs);
    printf("backward runs on the portable fused pass (deterministic = 0): %lld\n",
           (long long)gb_portable_fused_runs);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
