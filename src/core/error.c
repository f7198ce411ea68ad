/*
 * error.c - status names, categories, version, and the per-thread last-error
 * text. The text lives in a fixed thread-local buffer: recording an error
 * never allocates and never fails (long messages are truncated).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

enum { SK_ERROR_TEXT_BYTES = 512 };

/* __thread rather than C11 _Thread_local: the library is C99 (GCC and Clang
 * accept __thread in C99 mode). */
static __thread char tls_error_text[SK_ERROR_TEXT_BYTES];
static __thread const char *tls_api_name;

void sk_enter(const char *api_name) {
    tls_api_name = api_name;
    tls_error_text[0] = '\0';
}

sk_status sk_error(sk_status status, const char *fmt, ...) {
    int used = snprintf(tls_error_text, sizeof tls_error_text, "%s: ",
                        tls_api_name != NULL ? tls_api_name : "sparsek");
    if (used < 0 || (size_t)used >= sizeof tls_error_text) return status;
    va_list args;
    va_start(args, fmt);
    vsnprintf(tls_error_text + used, sizeof tls_error_text - (size_t)used, fmt, args);
    va_end(args);
    return status;
}

const char *sk_last_error(void) { return tls_error_text; }

int sk_version(void) { return SK_VERSION; }

const char *sk_status_name(sk_status status) {
    switch (status) {
#define SK_NAME_CASE(s)                                                                            \
    case s:                                                                                        \
        return #s
        SK_NAME_CASE(SK_STATUS_SUCCESS);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_NULL_POINTER);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_STRUCT_SIZE);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_SHAPE);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_STRIDE);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_DTYPE);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_ALIGNMENT);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_OVERFLOW);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_VALUE);
        SK_NAME_CASE(SK_STATUS_BAD_PARAM_WORKSPACE);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_UNSORTED);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_DUPLICATE);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_INDEX_RANGE);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_OFFSETS);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_COUNT);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_OVERFLOW);
        SK_NAME_CASE(SK_STATUS_BAD_LAYOUT_MISMATCH);
        SK_NAME_CASE(SK_STATUS_NOT_SUPPORTED);
        SK_NAME_CASE(SK_STATUS_NOT_SUPPORTED_BACKEND);
        SK_NAME_CASE(SK_STATUS_INTERNAL_ERROR);
        SK_NAME_CASE(SK_STATUS_ALLOC_FAILED);
        SK_NAME_CASE(SK_STATUS_EXECUTION_FAILED);
#undef SK_NAME_CASE
    }
    return "SK_STATUS_UNKNOWN";
}

sk_status_category sk_status_get_category(sk_status status) {
    return (sk_status_category)((int)status / 1000);
}
