/*
 * naive_bwd.h - an independent, deliberately naive fp64 attention backward
 * for the tests, and the error bound of a same-precision implementation
 * (the tolerance rule of docs/DEVELOPING.md). Written only for tests; it
 * includes nothing from src/: the gradients come from the forward's
 * definition (naive_ref.h: dense softmax over the allowed keys) by the
 * chain rule, with P recomputed from Q and K, never from an LSE or O.
 */
#ifndef SK_TESTS_NAIVE_BWD_H
#define SK_TESTS_NAIVE_BWD_H

#include <stdint.h>

#include "sparsek.h"

/*
 * Dense attention backward in fp64 over B batches and H heads, the same H
 * for Q, K and V (a GQA test repeats each KV head, then sums the repeated
 * heads' dK and dV itself). For each (b, h) and query row q with allowed
 * keys A(q) (allow[b, h, q, k] != 0; allow NULL: every key):
 *   s_k = scale dot(q, k_k), P = softmax_k over A(q) of s
 *   dP_k = dot(dO_q, v_k),  dS_k = P_k (dP_k - sum_j P_j dP_j)
 *   dQ_q = scale sum_k dS_k k_k,  dK_k += scale dS_k q,  dV_k += P_k dO_q
 * A row with no allowed key adds nothing (its dQ is 0).
 * Packed row-major arrays: q, dout, dq [B, Sq, H, D]; k, v, dk, dv
 * [B, Sk, H, D]. dq, dk and dv are written in full.
 *
 * eq, ek, ev (same shapes; may all be NULL): per element, the error bound
 * E of a naive implementation in the precision of `dtype` inputs that
 * works as the library does (fp32 dot products and sums, P = exp(s - LSE)
 * with the forward's fp32 LSE, Dl = rowsum(dO * O) with the forward's O
 * rounded to dtype), before the final rounding of the output (the caller
 * adds u_dtype |ref| after summing GQA heads). With u = 2^-24 and, per
 * row, n = |A(q)|, smag = |scale| |q|_2 max_k |k_k|_2, vmax = max |v|:
 *   e_lse   = u (|lse| + sqrt(D) smag + sqrt(n))          forward's LSE
 *   e_o[x]  = u_dtype |o_x| + u (sqrt(D) smag + sqrt(n)) vmax   forward's O
 *   d_k     = e_lse + u (sqrt(D) smag + |s_k| + |s_k - lse| + 1)   rel. error of P_k
 *   e_dl    = sum_x |dO_x| e_o[x] + u (sqrt(D) + 1) sum_x |dO_x o_x|
 *   e_ds_k  = P_k (u sqrt(D) |dO|_2 |v_k|_2 + e_dl) + (d_k + u) P_k |dP_k - Dl|
 *   E(dQ_x) = |scale| sum_k (e_ds_k + u sqrt(n) |dS_k|) |k_kx|
 *   E(dK_kx) += |scale| (e_ds_k + u sqrt(m_k) |dS_k|) |q_x|   over the rows
 *   E(dV_kx) += (d_k + u sqrt(m_k)) P_k |dO_x|                 that allow k
 * where m_k is the number of rows of (b, h) that allow key k; sqrt()
 * because rounding errors add up like a random walk.
 */
void nr_attention_backward(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d,
                           double scale, sk_dtype dtype, const double *q, const double *k,
                           const double *v, const double *dout, const uint8_t *allow, double *dq,
                           double *dk, double *dv, double *eq, double *ek, double *ev);

/* The same, for an implementation that also rounds P and dS to `dtype`
 * before they multiply dO, K and Q (tensor-core MMA operands, as the CUDA
 * kernels do); the bounds gain, with ud the dtype's unit roundoff and eta
 * half its smallest subnormal (2^-25 for F16: small P and dS underflow):
 *   E(dQ_x) += |scale| sum_k (ud |dS_k| + eta) |k_kx|
 *   E(dK_kx) += |scale| (ud |dS_k| + eta) |q_x|,  E(dV_kx) += (ud P_k + eta) |dO_x|
 * the last two over the rows that allow key k. */
void nr_attention_backward_mma(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d,
                               double scale, sk_dtype dtype, const double *q, const double *k,
                               const double *v, const double *dout, const uint8_t *allow,
                               double *dq, double *dk, double *dv, double *eq, double *ek,
                               double *ev);

#endif /* SK_TESTS_NAIVE_BWD_H */
