/*
 * naive_ref.h - an independent, deliberately naive fp64 reference for the
 * tests: dense attention with a token-level mask, a dense GEMM, and a small
 * BSR-from-block-mask helper. Written only for tests; it shares no code with
 * src/ (plain loops, everything in double, no blocking, no online softmax).
 */
#ifndef SK_TESTS_NAIVE_REF_H
#define SK_TESTS_NAIVE_REF_H

#include <stdint.h>

#include "sparsek.h"

/* One query row of dense attention, all in fp64:
 *   s_k = scale * dot(q, k_k) for every k < sk with allow[k] != 0 (allow NULL: all)
 *   o   = sum_k exp(s_k - max) v_k / sum_k exp(s_k - max),  lse = max + log(sum)
 * A row with no allowed key gets o = 0 and lse = -inf.
 *   q [d]; k, v: key k's row at k + k * k_stride (and v_stride); o [d]. */
void nr_attention_row(int64_t sk, int64_t d, double scale, const double *q, const double *k,
                      int64_t k_stride, const double *v, int64_t v_stride, const uint8_t *allow,
                      double *o, double *lse);

/* Dense attention over B batches and H heads, the same H for Q, K and V (a
 * GQA test repeats each KV head itself). Packed row-major arrays:
 *   q [B, Sq, H, D], k and v [B, Sk, H, D], allow [B, H, Sq, Sk] or NULL,
 *   o [B, Sq, H, D] and lse [B, H, Sq] written. */
void nr_attention(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d, double scale,
                  const double *q, const double *k, const double *v, const uint8_t *allow,
                  double *o, double *lse);

/* The token mask of a block mask: allow[b, h, q, k] = block_mask[b, h, q / bq, k / bk] != 0
 * and, when causal, k <= q + (Sk - Sq). block_mask [B, H, ceil(Sq/bq), ceil(Sk/bk)];
 * allow [B, H, Sq, Sk]. */
void nr_allow_from_blocks(uint8_t *allow, const uint8_t *block_mask, int64_t batch, int64_t heads,
                          int64_t sq, int64_t sk, int64_t bq, int64_t bk, int causal);

/* c_out = alpha * a * b + beta * c_in in fp64; a [m, k], b [k, n], c [m, n]
 * packed row-major; c_in is not read when beta == 0. */
void nr_gemm(int64_t m, int64_t n, int64_t k, double alpha, const double *a, const double *b,
             double beta, const double *c_in, double *c_out);

/* A BSR view over `grid` from a dense 0/1 block mask
 * [batch * heads, row_blocks, col_blocks]; the arrays are malloc'd here and
 * released by nr_bsr_free. Returns 0 on success, -1 if out of memory. */
int nr_bsr_from_mask(sk_bsr *out, const sk_grid *grid, const uint8_t *mask);
void nr_bsr_free(sk_bsr *bsr);

#endif /* SK_TESTS_NAIVE_REF_H */
