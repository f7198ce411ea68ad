/* A C user's first program against an installed SparseK: test_install.sh
 * builds it with nothing but what the install prefix provides (pkg-config,
 * or CMake's find_package). It runs causal attention on the CPU backend over
 * a causal layout, with a tail block (100 = 64 + 36 tokens) and the default
 * scale, and compares O and LSE with the naive softmax(Q K^T / sqrt(D)) V
 * written out below in double precision, so a wrong library, a wrong
 * header or a broken link fails it.
 *
 * Prints the library's version ("sparsek 0.1.0") and the difference; exit
 * status 0 only when every output matches and every call succeeded. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <sparsek.h>

enum { SEQ = 100, HEADS = 2, DIM = 16, BLOCK = 64 };

/* fp32 math with fp64 sums (the CPU backend) against fp64: ~1e-6. */
#define TOLERANCE 1e-4

/* Packed [1, SEQ, HEADS, DIM]. */
static size_t at(int token, int head, int d) {
    return ((size_t)token * HEADS + (size_t)head) * DIM + (size_t)d;
}

/* Deterministic values in [-1, 1) (a 32-bit LCG): no libc rand state. */
static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
    }
}

/* The naive causal attention of one query row; returns the largest
 * difference of the library's O and LSE from it. */
static double row_difference(const float *q, const float *k, const float *v, const float *o,
                             const float *lse, int token, int head) {
    double scores[SEQ], max = -INFINITY, sum = 0.0, diff;
    for (int j = 0; j <= token; j++) {
        double dot = 0.0;
        for (int d = 0; d < DIM; d++) dot += (double)q[at(token, head, d)] * k[at(j, head, d)];
        scores[j] = dot / sqrt((double)DIM);
        max = scores[j] > max ? scores[j] : max;
    }
    for (int j = 0; j <= token; j++) sum += exp(scores[j] - max);
    diff = fabs((max + log(sum)) - lse[(size_t)head * SEQ + (size_t)token]);
    for (int d = 0; d < DIM; d++) {
        double out = 0.0;
        for (int j = 0; j <= token; j++) out += exp(scores[j] - max) / sum * v[at(j, head, d)];
        double e = fabs(out - o[at(token, head, d)]);
        diff = e > diff ? e : diff;
    }
    return diff;
}

static int failed(const char *call, sk_status status) {
    fprintf(stderr, "%s: %s: %s\n", call, sk_status_name(status), sk_last_error());
    return 1;
}

int main(void) {
    static float q[SEQ * HEADS * DIM], k[SEQ * HEADS * DIM], v[SEQ * HEADS * DIM];
    static float o[SEQ * HEADS * DIM], lse[HEADS * SEQ];
    sk_grid grid = {SEQ, SEQ, BLOCK, BLOCK, 1, 1};
    sk_layout_t layout;
    sk_bsr view;
    sk_attention_desc desc;
    sk_status status;
    double max_diff = 0.0;
    int version = sk_version();

    printf("sparsek %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
    if (version != SK_VERSION) {
        fprintf(stderr, "the library is version %d, its header %d\n", version, SK_VERSION);
        return 1;
    }
    fill(q, sizeof q / sizeof q[0], 1);
    fill(k, sizeof k / sizeof k[0], 2);
    fill(v, sizeof v / sizeof v[0], 3);

    status = sk_layout_create_causal(&layout, &grid);
    if (status != SK_STATUS_SUCCESS) return failed("sk_layout_create_causal", status);
    status = sk_layout_view(layout, &view);
    if (status != SK_STATUS_SUCCESS) return failed("sk_layout_view", status);
    status = sk_attention_desc_init(&desc, sizeof desc);
    if (status != SK_STATUS_SUCCESS) return failed("sk_attention_desc_init", status);
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = SK_DTYPE_F32;
    desc.mask = SK_MASK_CAUSAL;
    desc.batch = 1;
    desc.seq_q = desc.seq_k = SEQ;
    desc.heads_q = desc.heads_kv = HEADS;
    desc.head_dim = DIM;
    status = sk_attention_forward(&desc, &view, q, k, v, o, lse, NULL, 0, NULL);
    sk_layout_destroy(layout);
    if (status != SK_STATUS_SUCCESS) return failed("sk_attention_forward", status);

    for (int head = 0; head < HEADS; head++)
        for (int token = 0; token < SEQ; token++) {
            double e = row_difference(q, k, v, o, lse, token, head);
            /* written so that a NaN difference becomes the maximum */
            max_diff = !(e <= max_diff) ? e : max_diff;
        }
    printf("sk_attention_forward (CPU) within %.3g of the naive attention\n", max_diff);
    if (!(max_diff <= TOLERANCE)) {
        fprintf(stderr, "off by %.3g: more than %.0e\n", max_diff, TOLERANCE);
        return 1;
    }
    return 0;
}
