/*
 * fz_finding.c - see fz_finding.h.
 */
#include "fz_finding.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char case_text[512];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("OMP_NUM_THREADS", "1", 1);
    return 0;
}

void fz_set_case(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(case_text, sizeof case_text, fmt, ap);
    va_end(ap);
}

void fz_fail(const char *fmt, ...) {
    va_list ap;
    fflush(stdout); /* the naive checks of tests/common print their differences there */
    va_start(ap, fmt);
    fprintf(stderr, "\nFINDING: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  case: %s\n  sk_last_error: \"%s\"\n", case_text, sk_last_error());
    fflush(stderr);
    abort();
}

void fz_statuses_add(fz_statuses *set, sk_status s) {
    if (fz_statuses_has(set, s)) return;
    if (set->n < (int)(sizeof set->s / sizeof set->s[0])) set->s[set->n++] = s;
}

int fz_statuses_has(const fz_statuses *set, sk_status s) {
    for (int i = 0; i < set->n; ++i)
        if (set->s[i] == s) return 1;
    return 0;
}

void fz_expect_clear(fz_expect *e) {
    e->must_fail = 0;
    e->why[0] = '\0';
}

void fz_expect_fail(fz_expect *e, const char *fmt, ...) {
    if (e->must_fail) return;
    e->must_fail = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, sizeof e->why, fmt, ap);
    va_end(ap);
}

/* FZ_TRACE=1 in the environment prints every checked call (to follow a
 * reproducer by hand). */
static int tracing(void) {
    static int on = -1;
    if (on < 0) on = getenv("FZ_TRACE") != NULL;
    return on;
}

void fz_check_status(sk_status st, const char *api, const fz_expect *e) {
    const char *text = sk_last_error();
    if (tracing())
        fprintf(stderr, "fz: %s -> %s%s%s [%s]\n", api, sk_status_name(st),
                e != NULL && e->must_fail ? ", must fail: " : "", e != NULL ? e->why : "", text);
    if (st == SK_STATUS_SUCCESS) {
        if (e != NULL && e->must_fail) fz_fail("%s succeeded although %s", api, e->why);
        FZ_REQUIRE(text[0] == '\0', "%s succeeded but sk_last_error() is \"%s\"", api, text);
        return;
    }
    const sk_status_category cat = sk_status_get_category(st);
    FZ_REQUIRE(cat == SK_STATUS_CATEGORY_BAD_PARAM || cat == SK_STATUS_CATEGORY_NOT_SUPPORTED ||
                   st == SK_STATUS_ALLOC_FAILED,
               "%s returned %s (%d): a bug or an execution failure on the CPU backend", api,
               sk_status_name(st), (int)st);
    const size_t n = strlen(api);
    FZ_REQUIRE(strncmp(text, api, n) == 0 && text[n] == ':' && text[n + 1] == ' ' &&
                   text[n + 2] != '\0',
               "%s failed with %s, but sk_last_error() is \"%s\" (want \"%s: <why>\")", api,
               sk_status_name(st), text, api);
}

void fz_check_refused(sk_status st, const char *api, const fz_statuses *allowed) {
    FZ_REQUIRE(st != SK_STATUS_SUCCESS, "%s succeeded on arguments it must refuse", api);
    fz_check_status(st, api, NULL);
    if (st == SK_STATUS_ALLOC_FAILED || fz_statuses_has(allowed, st)) return;
    char names[512] = "";
    for (int i = 0; i < allowed->n; ++i) {
        strncat(names, sk_status_name(allowed->s[i]), sizeof names - strlen(names) - 1);
        strncat(names, " ", sizeof names - strlen(names) - 1);
    }
    fz_fail("%s returned %s; the documented rules it breaks give %s", api, sk_status_name(st),
            names);
}
