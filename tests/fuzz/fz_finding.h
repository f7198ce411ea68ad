/*
 * fz_finding.h - how a harness reports a finding, and the checks that every
 * call's status gets.
 *
 * A finding prints what broke (and the case, when the harness gave one) and
 * aborts, so libFuzzer keeps the input as crash-<sha1>: the reproducer.
 * Besides the status rules of sparsek.h ("On failure the call has written
 * nothing", the last-error text), a harness states, before each call, the
 * documented reasons it must fail (fz_expect_fail); a call that succeeds
 * anyway is a finding. The library may refuse more than the harness knows
 * (a stricter check is no finding); it must never accept less.
 */
#ifndef SK_FUZZ_FINDING_H
#define SK_FUZZ_FINDING_H

#include "sparsek.h"

/* libFuzzer's start-up hook, shared by the harnesses: one OpenMP thread
 * (fast, and the same work order in every run). */
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Print "FINDING: ...", the case description, and abort. */
void fz_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* A one-line description of the current case, printed with a finding. */
void fz_set_case(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define FZ_REQUIRE(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) fz_fail(__VA_ARGS__);                                                         \
    } while (0)

/* A set of statuses a call may return. */
typedef struct fz_statuses {
    int n;
    sk_status s[16];
} fz_statuses;

void fz_statuses_add(fz_statuses *set, sk_status s);
int fz_statuses_has(const fz_statuses *set, sk_status s);

/* The documented reasons a call must fail; the first one is kept as text. */
typedef struct fz_expect {
    int must_fail;
    char why[160];
} fz_expect;

void fz_expect_clear(fz_expect *e);
void fz_expect_fail(fz_expect *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The status of a call of `api` (e.g. "sk_attention_run") on the CPU
 * backend: on success sk_last_error() is "" and `e` allowed a success; on
 * failure the status is a bad argument (1xxx), not supported (2xxx) or
 * ALLOC_FAILED, never INTERNAL_ERROR or EXECUTION_FAILED, and the last-error
 * text starts with "api: ". */
void fz_check_status(sk_status st, const char *api, const fz_expect *e);

/* A call that must fail: any status but SUCCESS, one of `allowed` (or
 * ALLOC_FAILED), with the text fz_check_status wants. */
void fz_check_refused(sk_status st, const char *api, const fz_statuses *allowed);

#endif /* SK_FUZZ_FINDING_H */
