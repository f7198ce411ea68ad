/*
 * test_attention_varlen_backward.c - the varlen attention backward (CPU
 * backend) against the naive fp64 chain-rule backward (tests/common/
 * naive_bwd.c) on each sequence's unpacked copy, against central finite
 * differences of the varlen forward on a tiny case, bitwise repeatability
 * over thread counts, and every bad argument (a status, a message naming
 * the argument, nothing written; the CUDA backends: the same statuses,
 * NOT_SUPPORTED naming head_dim for a valid call the kernels do not take,
 * and the workspace's size and placement checked before any device).
 *
 * The cases are tests/common/varlen_case.h's (lengths with empty sequences,
 * per-sequence random block masks, bottom-right causal per sequence, GQA,
 * layout slices, padded strides). The forward runs first (its O and LSE
 * feed the backward). Before the backward: dQ, dK, dV are NaN everywhere
 * (padding included: it must stay NaN), dO is NaN in the padding and on
 * every row with no admissible key (it must not leak), and K/V are NaN on
 * every key no query of the KV head attends (varlen_case.c).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_bwd.h"
#include "common/test_util.h"
#include "common/varlen_bwd_case.h"
#include "common/varlen_case.h"
#include "sparsek.h"

static sk_status call_backward(const vc_case *c, vc_data *x, vbc_bufs *t) {
    sk_attention_varlen_desc desc;
    sk_attention_varlen_backward_desc bwd;
    vbc_descs(c, x, &desc, &bwd);
    if (c->call == VC_FORWARD)
        return sk_attention_varlen_backward(&desc, &bwd, &x->layout, x->cu_q, x->cu_k, x->q, x->k,
                                            x->v, x->o, t->dout, x->lse, t->dq, t->dk, t->dv,
                                            NULL, 0, NULL);
    if (c->call == VC_PLAN_RUN) {
        const sk_status st = sk_attention_varlen_backward_plan(&desc, &bwd, &x->layout, x->cu_q,
                                                               x->cu_k, NULL, 0, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
    }
    return sk_attention_varlen_backward_run(&desc, &bwd, &x->layout, x->cu_q, x->cu_k, x->q, x->k,
                                            x->v, x->o, t->dout, x->lse, t->dq, t->dk, t->dv, NULL,
                                            0, NULL);
}

/* Run one case: forward, backward, compare every sequence; copies of the
 * gradients into keep[3] when not NULL (the repeat test). 0 when all
 * matched. */
static int run_case(vc_case c, uint64_t seed, void **keep) {
    c.with_lse = 1; /* the backward needs it */
    char label[400];
    vc_label(&c, seed, label, sizeof label);
    const int before = sk_test_failures();
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    vbc_bufs t;
    memset(&t, 0, sizeof t);
    if (!vc_make(&c, &rng, &x) || !vbc_bufs_make(&c, &x, &rng, &t)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    sk_status st = vc_call_varlen(&c, &x);
    CHECK(st == SK_STATUS_SUCCESS, "%s forward %s: %s", label, sk_status_name(st), sk_last_error());
    if (st != SK_STATUS_SUCCESS) goto done;
    st = call_backward(&c, &x, &t);
    CHECK(st == SK_STATUS_SUCCESS, "%s backward %s: %s", label, sk_status_name(st),
          sk_last_error());
    if (st != SK_STATUS_SUCCESS) goto done;
    vbc_check(&c, &x, &t, 0, label);
    if (keep != NULL) {
        const size_t es = vc_elem_size(c.dtype);
        void *src[3] = {t.dq, t.dk, t.dv};
        const size_t bytes[3] = {(size_t)x.q_span * es, (size_t)x.k_span * es,
                                 (size_t)x.k_span * es};
        for (int i = 0; i < 3; ++i) {
            keep[i] = malloc(bytes[i]);
            if (keep[i] != NULL) memcpy(keep[i], src[i], bytes[i]);
        }
    }
done:
    vbc_bufs_free(&t);
    vc_data_free(&x);
    return sk_test_failures() != before;
}

static uint64_t case_seed(uint64_t test_id, uint64_t case_id) {
    tu_rng r;
    tu_rng_seed(&r, tu_base_seed() ^ (test_id * 0x100000001B3ull) ^ (case_id << 24) ^ 0xba3c);
    return tu_rng_next(&r);
}

/* Lengths around the block edges, empty sequences of every kind, q_len <
 * k_len and the reverse, causal and not, GQA 1 and 4, every dtype. */
SK_TEST(varlen_bwd_cpu_against_naive) {
    static const sk_dtype dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};
    static const int32_t lq[6] = {65, 0, 3, 128, 40, 1};
    static const int32_t lk[6] = {64, 7, 0, 200, 130, 1};
    int id = 0;
    for (int di = 0; di < 3; ++di)
        for (int causal = 0; causal < 2; ++causal)
            for (int gqa = 0; gqa < 2; ++gqa) {
                vc_case c = vc_base_case(dtypes[di], 6, lq, lk);
                c.causal = causal;
                c.heads_kv = 2;
                c.heads_q = gqa ? 8 : 2;
                c.head_dim = gqa ? 64 : 24;
                c.layout_heads = gqa ? 2 : 1;
                c.density = 0.7;
                c.padded = (di + causal) % 2;
                c.call = (vc_call)(id % 3);
                run_case(c, case_seed(1, (uint64_t)id++), NULL);
            }
}

/* Random cases: every option of vc_random_case. */
SK_TEST(varlen_bwd_cpu_random_cases) {
    for (uint64_t id = 0; id < 16; ++id) {
        const uint64_t seed = case_seed(2, id);
        tu_rng rng;
        tu_rng_seed(&rng, seed ^ 0x5eed);
        const vc_case c = vc_random_case(&rng, 5, 150, 200);
        run_case(c, seed, NULL);
    }
}

/* Bitwise the same gradients with 1 and 2 threads. */
SK_TEST(varlen_bwd_cpu_repeatable_across_thread_counts) {
    static const int32_t lq[4] = {70, 0, 129, 5};
    static const int32_t lk[4] = {140, 9, 129, 0};
    vc_case c = vc_base_case(SK_DTYPE_BF16, 4, lq, lk);
    c.heads_kv = 1;
    c.heads_q = 4;
    c.head_dim = 64;
    c.causal = 1;
    c.density = 0.8;
    const uint64_t seed = case_seed(3, 0);
    void *a[3] = {NULL, NULL, NULL}, *b[3] = {NULL, NULL, NULL};
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    run_case(c, seed, a);
    omp_set_num_threads(threads > 1 ? threads : 2);
    run_case(c, seed, b);
    omp_set_num_threads(threads);
    const int64_t total_q = 70 + 129 + 5, total_k = 140 + 9 + 129;
    const size_t bytes[3] = {(size_t)(total_q * 4 * 64 * 2), (size_t)(total_k * 64 * 2),
                             (size_t)(total_k * 64 * 2)};
    for (int i = 0; i < 3; ++i) {
        CHECK(a[i] != NULL && b[i] != NULL && memcmp(a[i], b[i], bytes[i]) == 0,
              "[seed %llu] gradient %d differs between 1 and %d threads", (unsigned long long)seed,
              i, threads > 1 ? threads : 2);
        free(a[i]);
        free(b[i]);
    }
}

/* A small F32 case, forward run, backward buffers ready: the fixture of
 * the finite-difference and bad-input tests. Lengths: q shorter than k,
 * an empty sequence, q longer than k (causal: its first rows empty). */
typedef struct vb_fix {
    vc_case c;
    vc_data x;
    vbc_bufs t;
    sk_attention_varlen_desc desc;
    sk_attention_varlen_backward_desc bwd;
} vb_fix;

static int fix_make_d(vb_fix *f, sk_dtype dtype, uint64_t seed, int64_t head_dim) {
    static const int32_t lq[3] = {5, 0, 7};
    static const int32_t lk[3] = {9, 3, 4};
    memset(f, 0, sizeof *f);
    f->c = vc_base_case(dtype, 3, lq, lk);
    f->c.heads_q = 2;
    f->c.heads_kv = 1;
    f->c.head_dim = head_dim;
    f->c.causal = 1;
    f->c.with_lse = 1;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    if (!vc_make(&f->c, &rng, &f->x) || !vbc_bufs_make(&f->c, &f->x, &rng, &f->t)) return 0;
    vbc_descs(&f->c, &f->x, &f->desc, &f->bwd);
    return vc_call_varlen(&f->c, &f->x) == SK_STATUS_SUCCESS;
}

static int fix_make(vb_fix *f, sk_dtype dtype, uint64_t seed) {
    return fix_make_d(f, dtype, seed, 8);
}

static void fix_free(vb_fix *f) {
    vbc_bufs_free(&f->t);
    vc_data_free(&f->x);
}

/* L = sum dO * O over the valid elements, the forward run anew. */
static double loss(vb_fix *f) {
    if (vc_call_varlen(&f->c, &f->x) != SK_STATUS_SUCCESS) return NAN;
    const int64_t Hq = f->c.heads_q, D = f->c.head_dim;
    double l = 0.0;
    for (int64_t tok = 0; tok < f->x.total_q; ++tok)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const double w = f->t.doutd[(tok * Hq + h) * D + d];
                if (w != 0.0) l += w * tu_load(f->x.o, f->c.dtype, tok * f->x.ts_q + h * f->x.hs + d);
            }
    return l;
}

/* Central differences of L (eps 1e-2, fp32 forward) against the gradients
 * for every element of Q, K and V that some query reads. */
SK_TEST(varlen_bwd_cpu_finite_differences) {
    const uint64_t seed = case_seed(4, 0);
    vb_fix f;
    if (!fix_make(&f, SK_DTYPE_F32, seed)) {
        CHECK(0, "[seed %llu] fixture failed: %s", (unsigned long long)seed, sk_last_error());
        fix_free(&f);
        return;
    }
    const sk_status st = call_backward(&f.c, &f.x, &f.t);
    CHECK(st == SK_STATUS_SUCCESS, "[seed %llu] %s: %s", (unsigned long long)seed,
          sk_status_name(st), sk_last_error());
    void *in[3] = {f.x.q, f.x.k, f.x.v};
    const void *grad[3] = {f.t.dq, f.t.dk, f.t.dv};
    const int64_t span[3] = {f.x.q_span, f.x.k_span, f.x.k_span};
    const char *names[3] = {"dQ", "dK", "dV"};
    const float eps = 1e-2f;
    int64_t checked = 0;
    for (int i = 0; i < 3 && st == SK_STATUS_SUCCESS; ++i)
        for (int64_t e = 0; e < span[i]; ++e) {
            float *p = (float *)in[i] + e;
            if (isnan(*p)) continue; /* read by no query */
            const float keep = *p;
            *p = keep + eps;
            const double lp = loss(&f);
            *p = keep - eps;
            const double lm = loss(&f);
            *p = keep;
            const double fd = (lp - lm) / (2.0 * (double)eps);
            const double g = tu_load(grad[i], SK_DTYPE_F32, e);
            ++checked;
            CHECK(fabs(fd - g) <= 2e-3 * (1.0 + fabs(g)),
                  "[seed %llu] %s element %lld = %.7g, central difference %.7g",
                  (unsigned long long)seed, names[i], (long long)e, g, fd);
        }
    CHECK(checked > 100, "[seed %llu] only %lld elements checked", (unsigned long long)seed,
          (long long)checked);
    fix_free(&f);
}

/* The three gradients' bytes, to see that a failed call wrote nothing. */
typedef struct vb_snap {
    void *g[3];
    size_t bytes[3];
} vb_snap;

static int snap_take(const vb_fix *f, vb_snap *s) {
    const void *src[3] = {f->t.dq, f->t.dk, f->t.dv};
    const size_t es = vc_elem_size(f->c.dtype);
    s->bytes[0] = (size_t)f->x.q_span * es;
    s->bytes[1] = s->bytes[2] = (size_t)f->x.k_span * es;
    int ok = 1;
    for (int i = 0; i < 3; ++i) {
        s->g[i] = malloc(s->bytes[i]);
        if (s->g[i] == NULL) ok = 0;
        else memcpy(s->g[i], src[i], s->bytes[i]);
    }
    return ok;
}

static int snap_same(const vb_fix *f, const vb_snap *s) {
    const void *now[3] = {f->t.dq, f->t.dk, f->t.dv};
    for (int i = 0; i < 3; ++i)
        if (memcmp(now[i], s->g[i], s->bytes[i]) != 0) return 0;
    return 1;
}

/* What a bad-input case changes; the rest is the fixture's valid call. */
typedef struct vb_args {
    const sk_attention_varlen_desc *desc;
    const sk_attention_varlen_backward_desc *bwd;
    const int32_t *cu_q, *cu_k;
    const void *q, *dout;
    const float *lse;
    void *dq, *dk, *dv;
} vb_args;

static vb_args args_of(vb_fix *f) {
    const vb_args a = {&f->desc, &f->bwd, f->x.cu_q, f->x.cu_k, f->x.q, f->t.dout,
                       f->x.lse, f->t.dq, f->t.dk, f->t.dv};
    return a;
}

/* The run and the one-shot call with `a`: `want` and, for a failure, a
 * message naming `name` and nothing written. */
static void expect(vb_fix *f, const vb_snap *s, const vb_args *a, sk_status want,
                   const char *name, const char *what) {
    for (int call = 0; call < 2; ++call) {
        const sk_status st =
            call == 0 ? sk_attention_varlen_backward_run(a->desc, a->bwd, &f->x.layout, a->cu_q,
                                                         a->cu_k, a->q, f->x.k, f->x.v, f->x.o,
                                                         a->dout, a->lse, a->dq, a->dk, a->dv,
                                                         NULL, 0, NULL)
                      : sk_attention_varlen_backward(a->desc, a->bwd, &f->x.layout, a->cu_q,
                                                     a->cu_k, a->q, f->x.k, f->x.v, f->x.o,
                                                     a->dout, a->lse, a->dq, a->dk, a->dv, NULL, 0,
                                                     NULL);
        CHECK(st == want, "%s (%s): %s, want %s (%s)", what, call ? "one-shot" : "run",
              sk_status_name(st), sk_status_name(want), sk_last_error());
        if (want == SK_STATUS_SUCCESS) continue;
        CHECK(strstr(sk_last_error(), name) != NULL, "%s: message '%s' does not name %s", what,
              sk_last_error(), name);
        CHECK(snap_same(f, s), "%s (%s): an output was written", what, call ? "one-shot" : "run");
    }
}

/* Each bad argument alone, on the CPU and on every CUDA backend (the
 * core's checks come first); the valid call on CUDA, head_dim 8, which the
 * CUDA kernels do not take: NOT_SUPPORTED naming head_dim (in a build
 * without CUDA, NOT_SUPPORTED_BACKEND), nothing written; on the CPU it
 * succeeds. */
SK_TEST(varlen_bwd_bad_inputs_name_the_argument) {
    static const sk_backend backends[4] = {SK_BACKEND_CPU, SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    static const char *const backend_names[4] = {"", "SK_BACKEND_CUDA", "SK_BACKEND_CUDA_SM80",
                                                 "SK_BACKEND_CUDA_SM90"};
    for (int bi = 0; bi < 4; ++bi) {
        vb_fix f;
        vb_snap s;
        memset(&s, 0, sizeof s);
        if (!fix_make(&f, SK_DTYPE_F16, case_seed(5, (uint64_t)bi)) || !snap_take(&f, &s)) {
            CHECK(0, "fixture failed: %s", sk_last_error());
            goto next;
        }
        f.desc.backend = backends[bi];
        sk_attention_varlen_desc d = f.desc;
        sk_attention_varlen_backward_desc b = f.bwd;
        vb_args a = args_of(&f);
        a.bwd = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd", "bwd NULL");
        a = args_of(&f);
        b.struct_size = 0;
        a.bwd = &b;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "bwd", "bwd struct_size 0");
        b = f.bwd;
        b.deterministic = 2;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_VALUE, "deterministic", "deterministic 2");
        b = f.bwd;
        b.dq_strides[0] = -(int64_t)f.c.heads_q * f.c.head_dim;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dq", "dq token stride negative");
        b = f.bwd;
        b.dk_strides[0] = 0; /* every token on the same row */
        b.dk_strides[1] = f.c.head_dim;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dk", "dk rows overlapping");
        a = args_of(&f);
        d.head_dim = 0;
        a.desc = &d;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_SHAPE, "head_dim", "head_dim 0");
        d = f.desc;
        d.dtype = SK_DTYPE_E4M3;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_DTYPE, "dtype", "dtype E4M3");
        a = args_of(&f);
        a.dout = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "dout", "dout NULL");
        a = args_of(&f);
        a.lse = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "lse", "lse NULL");
        a = args_of(&f);
        a.dv = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "dv", "dv NULL");
        a = args_of(&f);
        a.cu_k = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "cu_seqlens_k", "cu_seqlens_k NULL");
        /* Aliasing: an output over an input, and two outputs. */
        a = args_of(&f);
        a.q = f.t.dq;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dq", "dq over q");
        a = args_of(&f);
        a.dv = f.t.dk;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dk", "dv over dk");
        a = args_of(&f);
        a.lse = (const float *)f.t.dq;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dq", "lse over dq");
        if (bi == 0) {
            /* Host length arrays are read on the CPU only. */
            int32_t cu[4];
            memcpy(cu, f.x.cu_q, sizeof cu);
            cu[2] = cu[3] + 1; /* decreasing */
            a = args_of(&f);
            a.cu_q = cu;
            expect(&f, &s, &a, SK_STATUS_BAD_PARAM_SHAPE, "cu_seqlens_q", "cu_seqlens_q decreasing");
            a = args_of(&f);
            expect(&f, &s, &a, SK_STATUS_SUCCESS, "", "valid call");
            size_t bytes = 1;
            const sk_status st =
                sk_attention_varlen_backward_workspace_size(&f.desc, &f.bwd, &f.x.layout, &bytes);
            CHECK(st == SK_STATUS_SUCCESS && bytes == 0, "CPU workspace: %s, %zu bytes",
                  sk_status_name(st), bytes);
        } else {
            /* sk_build_info() ends "no CUDA" in a build without CUDA. */
            const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
            const sk_status want = has_cuda ? SK_STATUS_NOT_SUPPORTED : SK_STATUS_NOT_SUPPORTED_BACKEND;
            const char *why = has_cuda ? "head_dim = 8" : "without CUDA";
            a = args_of(&f);
            expect(&f, &s, &a, want, why, "valid call on CUDA, head_dim 8");
            size_t bytes = 7;
            sk_status st =
                sk_attention_varlen_backward_workspace_size(&f.desc, &f.bwd, &f.x.layout, &bytes);
            CHECK(st == want && bytes == 7 && strstr(sk_last_error(), why) != NULL,
                  "%s workspace: %s, %zu bytes: %s", backend_names[bi], sk_status_name(st), bytes,
                  sk_last_error());
            st = sk_attention_varlen_backward_plan(&f.desc, &f.bwd, &f.x.layout, f.x.cu_q,
                                                   f.x.cu_k, NULL, 0, NULL);
            CHECK(st == want, "%s plan: %s", backend_names[bi], sk_status_name(st));
        }
    next:
        for (int i = 0; i < 3; ++i) free(s.g[i]);
        fix_free(&f);
    }
}

/* The CUDA backends with a call the kernels take (head_dim 64), no device
 * needed: the workspace size (> 0; in a build without CUDA,
 * NOT_SUPPORTED_BACKEND), then run, one-shot and plan with a workspace one
 * byte short (BAD_PARAM_WORKSPACE naming the size call: checked before the
 * device) and with a workspace over dq (named), and F32 (BAD_PARAM_DTYPE
 * naming dtype); nothing written. */
SK_TEST(varlen_bwd_cuda_workspace_checked_before_the_device) {
    static const sk_backend backends[3] = {SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
    for (int bi = 0; bi < 3; ++bi) {
        vb_fix f;
        vb_snap s;
        memset(&s, 0, sizeof s);
        if (!fix_make_d(&f, SK_DTYPE_BF16, case_seed(6, (uint64_t)bi), 64) || !snap_take(&f, &s)) {
            CHECK(0, "fixture failed: %s", sk_last_error());
            goto next;
        }
        f.desc.backend = backends[bi];
        size_t bytes = 0;
        sk_status st =
            sk_attention_varlen_backward_workspace_size(&f.desc, &f.bwd, &f.x.layout, &bytes);
        if (!has_cuda) {
            CHECK(st == SK_STATUS_NOT_SUPPORTED_BACKEND, "without CUDA: %s",
                  sk_status_name(st));
            goto next;
        }
        CHECK(st == SK_STATUS_SUCCESS && bytes > 0, "head_dim 64: %s, %zu bytes (%s)",
              sk_status_name(st), bytes, sk_last_error());
        if (st != SK_STATUS_SUCCESS) goto next;
        {
            unsigned char *ws = malloc(bytes);
            if (ws == NULL) {
                CHECK(0, "out of memory");
                goto next;
            }
            for (int call = 0; call < 3; ++call) {
                st = call == 0 ? sk_attention_varlen_backward_run(
                                     &f.desc, &f.bwd, &f.x.layout, f.x.cu_q, f.x.cu_k, f.x.q,
                                     f.x.k, f.x.v, f.x.o, f.t.dout, f.x.lse, f.t.dq, f.t.dk,
                                     f.t.dv, ws, bytes - 1, NULL)
                     : call == 1 ? sk_attention_varlen_backward(
                                       &f.desc, &f.bwd, &f.x.layout, f.x.cu_q, f.x.cu_k, f.x.q,
                                       f.x.k, f.x.v, f.x.o, f.t.dout, f.x.lse, f.t.dq, f.t.dk,
                                       f.t.dv, ws, bytes - 1, NULL)
                                 : sk_attention_varlen_backward_plan(&f.desc, &f.bwd,
                                                                     &f.x.layout, f.x.cu_q,
                                                                     f.x.cu_k, ws, bytes - 1,
                                                                     NULL);
                CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE &&
                          strstr(sk_last_error(), "sk_attention_varlen_backward_workspace_size") !=
                              NULL,
                      "call %d, workspace one byte short: %s (%s)", call, sk_status_name(st),
                      sk_last_error());
            }
            free(ws);
        }
        st = sk_attention_varlen_backward_run(&f.desc, &f.bwd, &f.x.layout, f.x.cu_q, f.x.cu_k,
                                              f.x.q, f.x.k, f.x.v, f.x.o, f.t.dout, f.x.lse,
                                              f.t.dq, f.t.dk, f.t.dv, f.t.dq, bytes, NULL);
        CHECK(st == SK_STATUS_BAD_PARAM_STRIDE && strstr(sk_last_error(), "workspace") != NULL &&
                  strstr(sk_last_error(), "dq") != NULL,
              "workspace over dq: %s (%s)", sk_status_name(st), sk_last_error());
        CHECK(snap_same(&f, &s), "%s: an output was written", "CUDA workspace checks");
        {
            /* F32: the core refuses it for CUDA, from every call. */
            vb_fix g;
            vb_snap gs;
            memset(&gs, 0, sizeof gs);
            if (fix_make_d(&g, SK_DTYPE_F32, case_seed(7, (uint64_t)bi), 64) &&
                snap_take(&g, &gs)) {
                g.desc.backend = backends[bi];
                vb_args a = args_of(&g);
                expect(&g, &gs, &a, SK_STATUS_BAD_PARAM_DTYPE, "dtype", "F32 on CUDA");
                bytes = 7;
                st = sk_attention_varlen_backward_workspace_size(&g.desc, &g.bwd, &g.x.layout,
                                                                 &bytes);
                CHECK(st == SK_STATUS_BAD_PARAM_DTYPE && bytes == 7 &&
                          strstr(sk_last_error(), "dtype") != NULL,
                      "F32 workspace on CUDA: %s (%s)", sk_status_name(st), sk_last_error());
            } else {
                CHECK(0, "F32 fixture failed: %s", sk_last_error());
            }
            for (int i = 0; i < 3; ++i) free(gs.g[i]);
            fix_free(&g);
        }
    next:
        for (int i = 0; i < 3; ++i) free(s.g[i]);
        fix_free(&f);
    }
}
