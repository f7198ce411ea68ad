/*
 * harness.c - registry and runner of the test harness (see harness.h).
 */
#include "common/harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { SK_MAX_TESTS = 1024 };

static struct {
    const char *name;
    sk_test_fn fn;
} registry[SK_MAX_TESTS];
static int registered;
static int overflowed;
static int current_failures;
static const char *current_name;

void sk_test_register(const char *name, sk_test_fn fn) {
    if (registered == SK_MAX_TESTS) {
        overflowed = 1;
        return;
    }
    registry[registered].name = name;
    registry[registered].fn = fn;
    ++registered;
}

void sk_test_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    ++current_failures;
    if (current_failures > 20) return; /* one broken loop must not flood the log */
    fprintf(stdout, "    %s:%d: %s: CHECK(%s) failed: ", current_name, line, file, cond);
    va_list args;
    va_start(args, fmt);
    vfprintf(stdout, fmt, args);
    va_end(args);
    fputc('\n', stdout);
    fflush(stdout);
}

int sk_test_failures(void) { return current_failures; }

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int sk_test_run_all(const char *filter) {
    /* Run in name order, independent of link order. */
    qsort(registry, (size_t)registered, sizeof registry[0], by_name);
    int passed = 0, failed = 0;
    if (overflowed) {
        printf("FAIL harness: more than %d tests registered\n", SK_MAX_TESTS);
        ++failed;
    }
    for (int i = 0; i < registered; ++i) {
        if (filter != NULL && strstr(registry[i].name, filter) == NULL) continue;
        current_name = registry[i].name;
        current_failures = 0;
        registry[i].fn();
        if (current_failures == 0) {
            printf("PASS %s\n", registry[i].name);
            ++passed;
        } else {
            printf("FAIL %s (%d failed checks)\n", registry[i].name, current_failures);
            ++failed;
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed;
}
