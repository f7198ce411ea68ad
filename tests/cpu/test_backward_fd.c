/*
 * test_backward_fd.c - the CPU attention backward is the derivative of the
 * library's own CPU forward: central finite differences on tiny F32 cases.
 *
 * With L(Q, K, V) = sum over every element of O * dO (O from
 * sk_attention_forward, summed in fp64), dL/dx is what the backward gives
 * for that dO, for x any element of Q, K or V. Each element is moved by
 * +-h and (L(x + h) - L(x - h)) / 2h compared with the backward's value.
 * Inputs are multiples of 2^-10 in [-4, 4] and h = 2^-8, so x +- h is
 * exact in fp32 and the difference quotient sees only the forward's own
 * rounding (O in fp32: about 2^-24 |L| / h) and the truncation error
 * (h^2 / 6 times a third derivative): tolerance 1e-3 + 1e-2 |g|. The cases
 * have sparse layouts, causal masking with Sq != Sk, GQA and a scale that
 * is not the default, so that a backward that drops the scale, the mask or
 * a query head of a group fails here independently of the naive reference.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

typedef struct fd_case {
    int64_t sq, sk, hq, hkv, d;
    int causal;
    float scale;
    int32_t layout_heads;
    uint8_t mask[2 * 4]; /* [layout_heads, 2, 2] block mask, blocks of 64 */
} fd_case;

typedef struct fd_problem {
    sk_attention_desc desc;
    sk_bsr layout;
    float *q, *k, *v, *o, *dout, *lse;
    int64_t nq, nk; /* elements of Q (and O, dO) and of K (and V) */
} fd_problem;

/* L = sum O * dO through the library's forward; NaN on failure. */
static double loss(fd_problem *p) {
    if (sk_attention_forward(&p->desc, &p->layout, p->q, p->k, p->v, p->o, p->lse, NULL, 0,
                             NULL) != SK_STATUS_SUCCESS)
        return NAN;
    double l = 0.0;
    for (int64_t i = 0; i < p->nq; ++i) l += (double)p->o[i] * (double)p->dout[i];
    return l;
}

static float grid_value(tu_rng *rng) {
    return (float)tu_rng_range(rng, -4096, 4096) / 1024.0f;
}

/* Every element of one input against its finite difference; returns the
 * number of mismatches. */
static int check_input(fd_problem *p, float *x, const float *g, int64_t n, const char *name,
                       uint64_t seed, double *worst) {
    const float h = 0x1.0p-8f;
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float keep = x[i];
        x[i] = keep + h;
        const double up = loss(p);
        x[i] = keep - h;
        const double down = loss(p);
        x[i] = keep;
        const double fd = (up - down) / (2.0 * (double)h);
        const double tol = 1e-3 + 1e-2 * fabs(fd);
        const double err = fabs((double)g[i] - fd);
        if (!(err <= tol) && bad++ < 3)
            CHECK(0, "seed %llu: d%s[%lld] = %.7g, finite difference %.7g", (unsigned long long)seed,
                  name, (long long)i, (double)g[i], fd);
        if (err / tol > *worst) *worst = err / tol;
    }
    return bad;
}

static void run_fd_case(const fd_case *c, uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    fd_problem p;
    memset(&p, 0, sizeof p);
    sk_attention_desc_init(&p.desc, sizeof p.desc);
    p.desc.backend = SK_BACKEND_CPU;
    p.desc.dtype = SK_DTYPE_F32;
    p.desc.batch = 1;
    p.desc.seq_q = c->sq;
    p.desc.seq_k = c->sk;
    p.desc.heads_q = c->hq;
    p.desc.heads_kv = c->hkv;
    p.desc.head_dim = c->d;
    p.desc.scale = c->scale;
    p.desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    const sk_grid grid = tu_grid(c->sq, c->sk, 64, 64, 1, c->layout_heads);
    p.nq = c->sq * c->hq * c->d;
    p.nk = c->sk * c->hkv * c->d;
    p.q = (float *)malloc((size_t)p.nq * 4), p.o = (float *)malloc((size_t)p.nq * 4);
    p.dout = (float *)malloc((size_t)p.nq * 4);
    p.k = (float *)malloc((size_t)p.nk * 4), p.v = (float *)malloc((size_t)p.nk * 4);
    p.lse = (float *)malloc((size_t)(c->hq * c->sq) * 4);
    float *dq = (float *)malloc((size_t)p.nq * 4), *dk = (float *)malloc((size_t)p.nk * 4),
          *dv = (float *)malloc((size_t)p.nk * 4);
    if (nr_bsr_from_mask(&p.layout, &grid, c->mask) != 0 || !p.q || !p.o || !p.dout || !p.k ||
        !p.v || !p.lse || !dq || !dk || !dv) {
        CHECK(0, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < p.nq; ++i) p.q[i] = grid_value(&rng), p.dout[i] = grid_value(&rng);
    for (int64_t i = 0; i < p.nk; ++i) p.k[i] = grid_value(&rng), p.v[i] = grid_value(&rng);

    /* The backward at the unperturbed point, with its forward's O and LSE. */
    const double l0 = loss(&p);
    sk_attention_backward_desc bwd;
    sk_attention_backward_desc_init(&bwd, sizeof bwd);
    const sk_status st = sk_attention_backward(&p.desc, &bwd, &p.layout, p.q, p.k, p.v, p.o,
                                               p.dout, p.lse, dq, dk, dv, NULL, 0, NULL);
    if (!isfinite(l0) || st != SK_STATUS_SUCCESS) {
        CHECK(0, "seed %llu: %s: %s", (unsigned long long)seed, sk_status_name(st),
              sk_last_error());
        goto done;
    }
    double worst = 0.0;
    int bad = check_input(&p, p.q, dq, p.nq, "Q", seed, &worst);
    bad += check_input(&p, p.k, dk, p.nk, "K", seed, &worst);
    bad += check_input(&p, p.v, dv, p.nk, "V", seed, &worst);
    CHECK(bad == 0, "seed %llu: %d gradient elements off their finite differences",
          (unsigned long long)seed, bad);
    if (getenv("SK_BWD_VERBOSE") != NULL) printf("    fd seed %llu: worst err/tol %.3g\n",
                                                 (unsigned long long)seed, worst);
done:
    free(p.q), free(p.o), free(p.dout), free(p.k), free(p.v), free(p.lse);
    free(dq), free(dk), free(dv);
    nr_bsr_free(&p.layout);
}

SK_TEST(backward_cpu_finite_differences) {
    /* 2 x 2 blocks of 64 per slice. Causal with Sk - Sq = 20: the first
     * query block sees key block 1 from query 44 on only. */
    const fd_case cases[3] = {
        {70, 90, 2, 1, 3, 1, 0.8f, 2, {1, 1, 1, 1, 0, 1, 1, 0}},
        {90, 70, 4, 2, 2, 1, 0.0f, 2, {1, 0, 1, 1, 1, 1, 0, 1}},
        {66, 100, 2, 2, 4, 0, -0.6f, 1, {0, 1, 1, 1}},
    };
    /* Thousands of tiny forwards: one thread each, as waking a team costs
     * more than the work. */
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int i = 0; i < 3; ++i) run_fd_case(&cases[i], tu_base_seed() * 31u + (uint64_t)i);
    omp_set_num_threads(saved);
}
