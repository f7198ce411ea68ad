/*
 * harness.h - a minimal C test harness.
 *
 *   SK_TEST(layout_dense_is_full) {
 *       CHECK(x == 1, "x = %d", x);           // records a failure, continues
 *       REQUIRE(ptr != NULL, "no memory");    // records a failure, leaves the test
 *   }
 *
 * Tests register themselves at load time (a GCC/Clang constructor), so a new
 * test file needs no list to edit. The runner (tests/cpu/main.c, or the GPU
 * suite's main) runs the tests whose names contain its argument and prints
 * one line per test and a closing line "N passed, M failed".
 */
#ifndef SK_TESTS_COMMON_HARNESS_H
#define SK_TESTS_COMMON_HARNESS_H

#include <stdio.h>

typedef void (*sk_test_fn)(void);

void sk_test_register(const char *name, sk_test_fn fn);
/* Record a failure of the running test (message printed under its name). */
void sk_test_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Failures recorded so far in the running test. */
int sk_test_failures(void);
/* Run the registered tests whose name contains `filter` (NULL: all);
 * returns the number of failed tests. Prints "N passed, M failed" last. */
int sk_test_run_all(const char *filter);

#define SK_TEST(name)                                                                              \
    static void name(void);                                                                        \
    __attribute__((constructor)) static void name##_register(void) {                               \
        sk_test_register(#name, name);                                                             \
    }                                                                                              \
    static void name(void)

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) sk_test_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                         \
    } while (0)

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            sk_test_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#endif /* SK_TESTS_COMMON_HARNESS_H */
