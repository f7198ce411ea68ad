/*
 * fail.c - how the CLI stops on an error: a failed library or CUDA call or
 * a failed allocation prints "sparsek: ..." on stderr and exits with 1; bad
 * usage prints the message and the short usage and exits with 2.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The library prefixes its text with the entry point's name; it is not repeated. */
void check_sk(sk_status status, const char *call) {
    if (status == SK_STATUS_SUCCESS) return;
    const char *text = sk_last_error();
    const size_t n = strlen(call);
    if (strncmp(text, call, n) == 0 && text[n] == ':' && text[n + 1] == ' ') text += n + 2;
    fprintf(stderr, "sparsek: %s: %s: %s\n", call, sk_status_name(status), text);
    exit(1);
}

static void message(const char *fmt, va_list args) {
    fputs("sparsek: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
}

void fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    message(fmt, args);
    va_end(args);
    exit(1);
}

void usage_error(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    message(fmt, args);
    va_end(args);
    print_usage(stderr, 0);
    exit(2);
}

void *xmalloc(size_t bytes, const char *what) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL)
        fail("out of host memory: %s needs %.3g GiB", what, (double)bytes / (1024.0 * 1024 * 1024));
    return p;
}

#ifndef SK_NO_CUDA
void check_cuda(cudaError_t err, const char *call) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "sparsek: %s: %s: %s\n", call, cudaGetErrorName(err), cudaGetErrorString(err));
    exit(1);
}
#endif
