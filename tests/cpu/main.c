/*
 * main.c - the CPU test runner: `sk_tests [name-filter]`.
 */
#include <stdlib.h>

#include "common/harness.h"

int main(int argc, char **argv) {
    return sk_test_run_all(argc > 1 ? argv[1] : NULL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
