/*
 * progress.c - progress lines on stderr, so that a long run does not sit
 * silent until its report: "sparsek [  12.3 s] <what happened>".
 *
 * Lines are on with --progress, off with --quiet, and otherwise start once
 * the run is expected to take PROGRESS_AFTER_S or more (progress_expect,
 * from run.c's estimate) or has already taken that long: a quick run prints
 * nothing. Frequent lines (one per call) come at most 4 a second; stdout
 * never sees a progress line, so --json output stays one JSON object.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "cli.h"

#define PROGRESS_MIN_GAP_S 0.25 /* between two frequent lines */

static struct {
    progress_mode mode;
    int expected_long; /* progress_expect saw PROGRESS_AFTER_S or more */
    double start, last_line;
} progress = {PROGRESS_AUTO, 0, 0.0, -1e30};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void progress_start(progress_mode mode) {
    progress.mode = mode;
    progress.expected_long = 0;
    progress.start = now_s();
    progress.last_line = -1e30;
}

double progress_elapsed(void) {
    return now_s() - progress.start;
}

void progress_expect(double seconds) {
    if (seconds >= PROGRESS_AFTER_S) progress.expected_long = 1;
    progress_line(1, "expected to take about %.1f s (a rough estimate)", seconds);
}

void progress_line(int every, const char *fmt, ...) {
    if (progress.mode == PROGRESS_OFF) return;
    const double now = now_s();
    const double elapsed = now - progress.start;
    if (progress.mode == PROGRESS_AUTO && !progress.expected_long && elapsed < PROGRESS_AFTER_S)
        return;
    if (!every && now - progress.last_line < PROGRESS_MIN_GAP_S) return;
    progress.last_line = now;
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "sparsek [%6.1f s] ", elapsed);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    fflush(stderr);
}
