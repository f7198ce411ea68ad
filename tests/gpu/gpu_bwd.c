/*
 * gpu_bwd.c - see gpu_bwd.h.
 */
#include "gpu/gpu_bwd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_bwd.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "gpu/cuda_api.h"
#include "cuda/attention/bwd_sm90_dkv.h" /* sk_bwd90_dkv_launches: which dK/dV kernel ran */
#include "cuda/attention/bwd_sm80_fused.h" /* sk_bwd80_fused_launches: the portable fused pass */

int gb_cases_run, gb_cases_failed, gb_cases_declined;
int64_t gb_hopper_dkv_runs, gb_hopper_fused_runs;
int64_t gb_portable_fused_runs;

/* Whether the Hopper dK/dV kernel (bwd_sm90_dkv.cu) must run a case's dK/dV
 * pass: a compute capability 9.0 device and a backend other than
 * SK_BACKEND_CUDA_SM80. It covers every case this suite draws (F16 / BF16,
 * D 64 / 128, blocks 64 / 128, strides positive multiples of 16 bytes), so
 * a silent fall-back to the portable kernel fails the case. */
static int gb_expect_hopper_dkv(void) {
    int dev = 0, major = 0, minor = 0;
    if (gt_opt.backend == SK_BACKEND_CUDA_SM80) return 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
           major == 9 && minor == 0;
}

/* Whether the portable fused pass (bwd_sm80.cu) must run a deterministic
 * = 0 case off the Hopper kernels: a block must get its shared memory, the
 * dK/dV kernel's and two 8 KB dS^T buffers (115,712 bytes at D = 128,
 * 66,560 at D = 64; compute capability 8.6 / 8.9 give 101,376). */
static int gb_expect_portable_fused(int64_t d) {
    int dev = 0, optin = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ==
               cudaSuccess &&
           optin >= (d == 128 ? 115712 : 66560);
}

enum { GB_MAX_REPORTS = 6 };

void gb_case_describe(const gb_case *c, char *buf, size_t len) {
    char f[512];
    gt_case_describe(&c->f, f, sizeof f);
    snprintf(buf, len, "%s; grad strides do%d dq%d dk%d dv%d, %s", f, c->grad_stride[0],
             c->grad_stride[1], c->grad_stride[2], c->grad_stride[3],
             c->plan_run ? (c->nondet ? "plan + run, deterministic 0" : "plan + run")
                         : (c->nondet ? "one-shot, deterministic 0" : "one-shot"));
}

static int64_t slice_of(const gt_inst *x, int64_t b, int64_t h) {
    return (x->c.layout_batch == 1 ? 0 : b) * x->c.layout_heads + h / x->head_div;
}

/* NaN over the D elements of row (b, s, h) of a tensor's host buffer. */
static void nan_row(const gt_tensor *t, void *host, int64_t b, int64_t s, int64_t h) {
    tu_fill_nan((char *)host + gt_tensor_index(t, b, s, h, 0) * 2, t->dtype, t->d);
}

void gb_inst_desc(const gb_inst *b, sk_backend backend, sk_attention_desc *d,
                  sk_attention_backward_desc *bd) {
    gt_inst_desc(&b->x, backend, d);
    sk_attention_backward_desc_init(bd, sizeof *bd);
    memcpy(bd->dout_strides, b->dout.desc_stride, sizeof bd->dout_strides);
    memcpy(bd->dq_strides, b->dq.desc_stride, sizeof bd->dq_strides);
    memcpy(bd->dk_strides, b->dk.desc_stride, sizeof bd->dk_strides);
    memcpy(bd->dv_strides, b->dv.desc_stride, sizeof bd->dv_strides);
    bd->deterministic = b->c.nondet ? 0 : 1;
}

void gb_inst_destroy(gb_inst *b) {
    free(b->dout.host);
    free(b->dq.host);
    free(b->dk.host);
    free(b->dv.host);
    free(b->dq_ref);
    free(b->dk_ref);
    free(b->dv_ref);
    for (int i = 0; i < 3; ++i) free(b->ref[i]), free(b->bound[i]);
    gt_device_free(b->d_dout);
    gt_device_free(b->d_dq);
    gt_device_free(b->d_dk);
    gt_device_free(b->d_dv);
    gt_device_free(b->d_ws);
    gt_inst_destroy(&b->x);
    memset(b, 0, sizeof *b);
}

/* Steps 3 and 4 of gpu_bwd.h: the admissible pairs, the NaN in every input
 * no gradient may read, the naive fp64 gradients and bounds. dod: dO as a
 * packed fp64 array. */
static int poison_and_naive(gb_inst *b, const double *dod) {
    gt_inst *x = &b->x;
    const gt_case *f = &x->c;
    const int64_t B = f->batch, Sq = f->seq_q, Sk = f->seq_k, Hq = f->heads_q, Hk = f->heads_kv;
    const int64_t D = f->head_dim, G = x->group, rb = x->rb, cb = x->cb;
    uint8_t *bmask = malloc((size_t)(B * Hq * rb * cb));
    uint8_t *allow = malloc((size_t)(B * Hq * Sq * Sk));
    uint8_t *row_used = calloc((size_t)(B * Hq * Sq), 1), *key_used = calloc((size_t)(B * Hk * Sk), 1);
    double *kdr = malloc((size_t)(B * Sk * Hq * D) * sizeof(double));
    double *vdr = malloc((size_t)(B * Sk * Hq * D) * sizeof(double));
    const int64_t n[3] = {B * Sq * Hq * D, B * Sk * Hq * D, B * Sk * Hq * D};
    int ok = bmask && allow && row_used && key_used && kdr && vdr;
    for (int i = 0; i < 3 && ok; ++i) {
        b->ref[i] = malloc((size_t)n[i] * sizeof(double));
        b->bound[i] = malloc((size_t)n[i] * sizeof(double));
        ok = b->ref[i] && b->bound[i];
    }
    if (ok) {
        for (int64_t bb = 0; bb < B; ++bb)
            for (int64_t h = 0; h < Hq; ++h)
                memcpy(bmask + (bb * Hq + h) * rb * cb, x->mask + slice_of(x, bb, h) * rb * cb,
                       (size_t)(rb * cb));
        nr_allow_from_blocks(allow, bmask, B, Hq, Sq, Sk, f->block_q, f->block_k, f->causal);
        for (int64_t bb = 0; bb < B; ++bb)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t q = 0; q < Sq; ++q)
                    for (int64_t k = 0; k < Sk; ++k)
                        if (allow[((bb * Hq + h) * Sq + q) * Sk + k]) {
                            row_used[(bb * Hq + h) * Sq + q] = 1;
                            key_used[(bb * Hk + h / G) * Sk + k] = 1;
                        }
        const int poison = !b->c.keep_unread;
        for (int64_t bb = 0; bb < B; ++bb) {
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t q = 0; q < Sq; ++q) {
                    if (row_used[(bb * Hq + h) * Sq + q]) continue;
                    ++b->empty_rows;
                    if (!poison) continue;
                    nan_row(&x->q, x->q.host, bb, q, h);
                    nan_row(&x->o, x->o_ref, bb, q, h);
                    nan_row(&b->dout, b->dout.host, bb, q, h);
                    x->lse_ref[(bb * Hq + h) * Sq + q] = NAN;
                }
            for (int64_t hk = 0; hk < Hk; ++hk)
                for (int64_t k = 0; k < Sk; ++k) {
                    if (key_used[(bb * Hk + hk) * Sk + k]) continue;
                    ++b->idle_keys;
                    if (!poison) continue;
                    nan_row(&x->k, x->k.host, bb, k, hk);
                    nan_row(&x->v, x->v.host, bb, k, hk);
                }
        }
        /* K and V repeated per query head for the naive backward. */
        for (int64_t bb = 0; bb < B; ++bb)
            for (int64_t k = 0; k < Sk; ++k)
                for (int64_t h = 0; h < Hq; ++h) {
                    const int64_t from = ((bb * Sk + k) * Hk + h / G) * D;
                    const int64_t to = ((bb * Sk + k) * Hq + h) * D;
                    memcpy(kdr + to, x->kd + from, (size_t)D * sizeof(double));
                    memcpy(vdr + to, x->vd + from, (size_t)D * sizeof(double));
                }
        nr_attention_backward_mma(B, Sq, Sk, Hq, D, gt_case_scale(f), f->dtype, x->qd, kdr, vdr,
                                  dod, allow, b->ref[0], b->ref[1], b->ref[2], b->bound[0],
                                  b->bound[1], b->bound[2]);
    }
    free(bmask);
    free(allow);
    free(row_used);
    free(key_used);
    free(kdr);
    free(vdr);
    return ok ? 0 : -1;
}

/* Host tensors of dO, dQ, dK, dV and the CPU references (steps 1 and 2). */
static int make_grads(gb_inst *b, double **dod) {
    gt_inst *x = &b->x;
    const gt_case *f = &x->c;
    const int64_t B = f->batch, Sq = f->seq_q, Sk = f->seq_k, Hq = f->heads_q, Hk = f->heads_kv;
    const int64_t D = f->head_dim;
    tu_rng rng;
    tu_rng_seed(&rng, f->seed ^ 0x6277642131ull);
    gt_tensor_make(&b->dout, B, Sq, Hq, D, b->c.grad_stride[0], &rng, f->dtype);
    gt_tensor_make(&b->dq, B, Sq, Hq, D, b->c.grad_stride[1], &rng, f->dtype);
    gt_tensor_make(&b->dk, B, Sk, Hk, D, b->c.grad_stride[2], &rng, f->dtype);
    gt_tensor_make(&b->dv, B, Sk, Hk, D, b->c.grad_stride[3], &rng, f->dtype);
    gt_tensor *t[4] = {&b->dout, &b->dq, &b->dk, &b->dv};
    for (int i = 0; i < 4; ++i) {
        t[i]->host = malloc(t[i]->bytes);
        if (t[i]->host == NULL) return -1;
        tu_fill_nan(t[i]->host, f->dtype, t[i]->alloc);
    }
    b->dq_ref = malloc(b->dq.bytes);
    b->dk_ref = malloc(b->dk.bytes);
    b->dv_ref = malloc(b->dv.bytes);
    *dod = malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
    if (!b->dq_ref || !b->dk_ref || !b->dv_ref || !*dod) return -1;
    memcpy(b->dq_ref, b->dq.host, b->dq.bytes);
    memcpy(b->dk_ref, b->dk.host, b->dk.bytes);
    memcpy(b->dv_ref, b->dv.host, b->dv.bytes);
    gt_tensor_fill(&rng, &b->dout, *dod, 1.0f);
    sk_attention_desc d;
    gt_inst_desc(x, SK_BACKEND_CPU, &d);
    const sk_status st = sk_attention_run(&d, &x->layout, x->q.host, x->k.host, x->v.host,
                                          x->o_ref, x->lse_ref, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    CPU forward: %s: %s\n", sk_status_name(st), sk_last_error());
        return -1;
    }
    return 0;
}

/* The device buffers (step 5's inputs) and the workspace. */
static int upload(gb_inst *b) {
    gt_inst *x = &b->x;
    if (gt_upload(x->dq, x->q.host, x->q.bytes) || gt_upload(x->dk, x->k.host, x->k.bytes) ||
        gt_upload(x->dv, x->v.host, x->v.bytes) || gt_upload(x->dout, x->o_ref, x->o.bytes) ||
        gt_upload(x->dlse, x->lse_ref, (size_t)x->lse_elems * sizeof(float)))
        return -1;
    b->d_dout = gt_device_alloc(b->dout.bytes);
    b->d_dq = gt_device_alloc(b->dq.bytes);
    b->d_dk = gt_device_alloc(b->dk.bytes);
    b->d_dv = gt_device_alloc(b->dv.bytes);
    if (!b->d_dout || !b->d_dq || !b->d_dk || !b->d_dv) return -1;
    if (gt_upload(b->d_dout, b->dout.host, b->dout.bytes)) return -1;
    sk_attention_desc d;
    sk_attention_backward_desc bd;
    gb_inst_desc(b, gt_opt.backend, &d, &bd);
    const sk_status st = sk_attention_backward_workspace_size(&d, &bd, &x->dlayout, &b->ws_bytes);
    if (st != SK_STATUS_SUCCESS) {
        printf("    sk_attention_backward_workspace_size: %s: %s\n", sk_status_name(st),
               sk_last_error());
        return -1;
    }
    b->d_ws = gt_device_alloc(b->ws_bytes);
    return b->d_ws != NULL ? 0 : -1;
}

int gb_inst_create(gb_inst *b, const gb_case *c) {
    memset(b, 0, sizeof *b);
    b->c = *c;
    b->c.f.with_lse = 1;
    if (gt_inst_create(&b->x, &b->c.f, 0) != 0) {
        printf("    setup failed (memory)\n");
        return -1;
    }
    double *dod = NULL;
    int rc = make_grads(b, &dod);
    if (rc == 0) rc = poison_and_naive(b, dod);
    free(dod);
    if (rc != 0) return -1;
    /* The CPU backend's backward on the poisoned host buffers. */
    sk_attention_desc d;
    sk_attention_backward_desc bd;
    gb_inst_desc(b, SK_BACKEND_CPU, &d, &bd);
    gt_inst *x = &b->x;
    const sk_status st =
        sk_attention_backward(&d, &bd, &x->layout, x->q.host, x->k.host, x->v.host, x->o_ref,
                              b->dout.host, x->lse_ref, b->dq_ref, b->dk_ref, b->dv_ref, NULL, 0,
                              NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    CPU backward: %s: %s\n", sk_status_name(st), sk_last_error());
        return -1;
    }
    return upload(b);
}

int gb_inst_poison(gb_inst *b, int fill) {
    if (gt_upload(b->d_dq, b->dq.host, b->dq.bytes) || gt_upload(b->d_dk, b->dk.host, b->dk.bytes) ||
        gt_upload(b->d_dv, b->dv.host, b->dv.bytes))
        return -1;
    return cudaMemset(b->d_ws, fill, b->ws_bytes) == cudaSuccess ? 0 : -1;
}

sk_status gb_inst_backward(gb_inst *b, sk_backend backend, struct CUstream_st *stream) {
    sk_attention_desc d;
    sk_attention_backward_desc bd;
    gb_inst_desc(b, backend, &d, &bd);
    gt_inst *x = &b->x;
    if (b->c.plan_run) {
        const sk_status st =
            sk_attention_backward_plan(&d, &bd, &x->dlayout, b->d_ws, b->ws_bytes, stream);
        if (st != SK_STATUS_SUCCESS) return st;
        return sk_attention_backward_run(&d, &bd, &x->dlayout, x->dq, x->dk, x->dv, x->dout,
                                         b->d_dout, x->dlse, b->d_dq, b->d_dk, b->d_dv, b->d_ws,
                                         b->ws_bytes, stream);
    }
    return sk_attention_backward(&d, &bd, &x->dlayout, x->dq, x->dk, x->dv, x->dout, b->d_dout,
                                 x->dlse, b->d_dq, b->d_dk, b->d_dv, b->d_ws, b->ws_bytes, stream);
}

int gb_inst_fetch(const gb_inst *b, void *dq, void *dk, void *dv) {
    if (gt_download(dq, b->d_dq, b->dq.bytes) || gt_download(dk, b->d_dk, b->dk.bytes))
        return -1;
    return gt_download(dv, b->d_dv, b->dv.bytes);
}

int gb_inst_untouched(const gb_inst *b) {
    void *g[3] = {malloc(b->dq.bytes), malloc(b->dk.bytes), malloc(b->dv.bytes)};
    int same = g[0] && g[1] && g[2] && gb_inst_fetch(b, g[0], g[1], g[2]) == 0 &&
               memcmp(g[0], b->dq.host, b->dq.bytes) == 0 &&
               memcmp(g[1], b->dk.host, b->dk.bytes) == 0 &&
               memcmp(g[2], b->dv.host, b->dv.bytes) == 0;
    for (int i = 0; i < 3; ++i) free(g[i]);
    return same;
}

/* One gradient tensor t (got: the GPU's, cpu: the CPU backend's, ref and
 * bound: the naive per query head) under the rule of gpu_bwd.h; its
 * padding must still be the NaN fill (t->host). Returns the errors. */
static int64_t compare_grad(const gb_inst *b, const gt_tensor *t, const void *got, const void *cpu,
                            const double *ref, const double *bound, const char *name,
                            const char *what, double *worst) {
    const gt_case *f = &b->x.c;
    const int64_t S = t->extent[1], H = t->extent[2], D = t->d, Hq = f->heads_q, reps = Hq / H;
    const double ud = tu_unit_roundoff(f->dtype);
    int64_t errors = 0;
    uint16_t *copy = malloc(t->bytes);
    if (copy == NULL) return 1;
    memcpy(copy, got, t->bytes);
    for (int64_t bb = 0; bb < t->extent[0]; ++bb)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t x = 0; x < D; ++x) {
                    double rn = 0.0, e = 0.0;
                    for (int64_t r = 0; r < reps; ++r) {
                        const int64_t at = ((bb * S + s) * Hq + h * reps + r) * D + x;
                        rn += ref[at];
                        e += bound[at];
                    }
                    const int64_t i = gt_tensor_index(t, bb, s, h, x);
                    const double g = tu_load(got, f->dtype, i);
                    const double rv = gt_opt.use_naive_ref ? rn : tu_load(cpu, f->dtype, i);
                    const double tol = 2.0 * (ud * fabs(rn) + e) + 0x1.0p-24;
                    const double err = fabs(g - rv);
                    if (isfinite(err) && err / tol > *worst) *worst = err / tol;
                    if ((!isfinite(g) || !isfinite(rv) || !(err <= tol)) &&
                        ++errors <= GB_MAX_REPORTS)
                        printf("    %s: %s[b=%lld s=%lld h=%lld x=%lld] = %.6g, reference %.6g, "
                               "tolerance %.3g\n",
                               what, name, (long long)bb, (long long)s, (long long)h,
                               (long long)x, g, rv, tol);
                    copy[i] = ((const uint16_t *)t->host)[i];
                }
    if (memcmp(copy, t->host, t->bytes) != 0 && ++errors <= GB_MAX_REPORTS)
        printf("    %s: %s's stride padding or slack was written\n", what, name);
    free(copy);
    return errors;
}

int gb_inst_compare(const gb_inst *b, const void *dq, const void *dk, const void *dv,
                    const char *what) {
    double worst = 0.0;
    int64_t errors = compare_grad(b, &b->dq, dq, b->dq_ref, b->ref[0], b->bound[0], "dQ", what,
                                  &worst);
    errors += compare_grad(b, &b->dk, dk, b->dk_ref, b->ref[1], b->bound[1], "dK", what, &worst);
    errors += compare_grad(b, &b->dv, dv, b->dv_ref, b->ref[2], b->bound[2], "dV", what, &worst);
    if (gt_opt.verbose || errors > 0)
        printf("    %s: %lld errors, worst error/tolerance %.3f (%lld empty rows, %lld idle "
               "keys)\n",
               what, (long long)errors, worst, (long long)b->empty_rows, (long long)b->idle_keys);
    return (int)(errors > 1000000 ? 1000000 : errors);
}

int gb_run_case(const gb_case *c, int64_t counts[2]) {
    char desc[640];
    gb_case_describe(c, desc, sizeof desc);
    if (gt_opt.verbose) printf("  backward case: %s\n", desc);
    gb_inst b;
    int failed = 1;
    void *g1[3] = {NULL, NULL, NULL}, *g2[3] = {NULL, NULL, NULL};
    if (gb_inst_create(&b, c) != 0) {
        CHECK(0, "could not set up the case: %s", desc);
        goto done;
    }
    if (counts != NULL) {
        counts[0] = b.empty_rows;
        counts[1] = b.idle_keys;
    }
    const size_t bytes[3] = {b.dq.bytes, b.dk.bytes, b.dv.bytes};
    for (int i = 0; i < 3; ++i) {
        g1[i] = malloc(bytes[i]);
        g2[i] = malloc(bytes[i]);
        if (g1[i] == NULL || g2[i] == NULL) {
            CHECK(0, "out of host memory [%s]", desc);
            goto done;
        }
    }
    const int64_t hopper_dkv0 = sk_bwd90_dkv_launches(), fused0 = sk_bwd90_fused_launches();
    const int64_t pfused0 = sk_bwd80_fused_launches();
    for (int run = 0; run < 2; ++run) {
        if (gb_inst_poison(&b, run ? 0x5a : 0xa5) != 0) {
            CHECK(0, "upload failed [%s]", desc);
            goto done;
        }
        const sk_status st = gb_inst_backward(&b, gt_opt.backend, NULL);
        if (run == 0 && st == SK_STATUS_NOT_SUPPORTED && gt_opt.backend == SK_BACKEND_CUDA_SM90) {
            /* The forced Hopper backend on another device: declined, said
             * why, wrote nothing. */
            CHECK(strstr(sk_last_error(), "SM90") != NULL, "decline message: %s [%s]",
                  sk_last_error(), desc);
            CHECK(gt_sync() == 0 && gb_inst_untouched(&b), "outputs written on decline [%s]",
                  desc);
            failed = strstr(sk_last_error(), "SM90") == NULL;
            ++gb_cases_declined;
            goto done;
        }
        if (st != SK_STATUS_SUCCESS) {
            CHECK(0, "backward: %s: %s [%s]", sk_status_name(st), sk_last_error(), desc);
            goto done;
        }
        void **g = run == 0 ? g1 : g2;
        if (gt_sync() != 0 || gb_inst_fetch(&b, g[0], g[1], g[2]) != 0) {
            CHECK(0, "GPU run %d failed [%s]", run, desc);
            goto done;
        }
    }
    {
        static const char *const names[3] = {"dQ", "dK", "dV"};
        int same = 1;
        /* deterministic = 0: dQ comes from fp32 atomics (any order); both
         * runs are checked against the reference instead. */
        for (int i = c->nondet ? 1 : 0; i < 3; ++i)
            if (memcmp(g1[i], g2[i], bytes[i]) != 0) {
                CHECK(0, "two runs differ in %s (not bitwise reproducible) [%s]", names[i], desc);
                same = 0;
            }
        int errors = gb_inst_compare(&b, g1[0], g1[1], g1[2], "gpu vs reference");
        if (c->nondet) errors += gb_inst_compare(&b, g2[0], g2[1], g2[2], "second run");
        CHECK(errors == 0, "%d gradient elements outside the tolerance [%s]", errors, desc);
        failed = errors != 0 || !same;
        /* Which dK/dV kernel ran: both runs on the Hopper one, or neither. */
        const int64_t ran = sk_bwd90_dkv_launches() - hopper_dkv0;
        const int64_t want = gb_expect_hopper_dkv() ? 2 : 0;
        CHECK(ran == want, "the Hopper dK/dV kernel ran %lld times in 2 runs, want %lld [%s]",
              (long long)ran, (long long)want, desc);
        failed |= ran != want;
        gb_hopper_dkv_runs += ran;
        const int64_t fused = sk_bwd90_fused_launches() - fused0;
        const int64_t want_fused = c->nondet ? want : 0;
        CHECK(fused == want_fused, "the fused Hopper pass ran %lld times in 2 runs, want %lld [%s]",
              (long long)fused, (long long)want_fused, desc);
        failed |= fused != want_fused;
        gb_hopper_fused_runs += fused;
        /* Off the Hopper kernels (SK_BACKEND_CUDA_SM80, or not a Hopper
         * device), deterministic = 0 is the portable fused pass, both runs. */
        const int64_t pfused = sk_bwd80_fused_launches() - pfused0;
        const int64_t want_pfused =
            c->nondet && want == 0 && gb_expect_portable_fused(c->f.head_dim) ? 2 : 0;
        CHECK(pfused == want_pfused,
              "the portable fused pass ran %lld times in 2 runs, want %lld [%s]",
              (long long)pfused, (long long)want_pfused, desc);
        failed |= pfused != want_pfused;
        gb_portable_fused_runs += pfused;
    }
    if (c->nondet && !failed) {
        /* dK and dV have one owner in either mode and the same arithmetic:
         * deterministic = 1 must give the same bits. */
        b.c.nondet = 0;
        void *g3[3] = {malloc(bytes[0]), malloc(bytes[1]), malloc(bytes[2])};
        const int ok = g3[0] && g3[1] && g3[2] && gb_inst_poison(&b, 0x3c) == 0 &&
                       gb_inst_backward(&b, gt_opt.backend, NULL) == SK_STATUS_SUCCESS &&
                       gt_sync() == 0 && gb_inst_fetch(&b, g3[0], g3[1], g3[2]) == 0;
        CHECK(ok, "deterministic = 1 run failed: %s [%s]", sk_last_error(), desc);
        const int dk_same = ok && memcmp(g1[1], g3[1], bytes[1]) == 0;
        const int dv_same = ok && memcmp(g1[2], g3[2], bytes[2]) == 0;
        CHECK(dk_same && dv_same,
              "deterministic 0 and 1 differ in dK (%s) or dV (%s): one owner, same sums [%s]",
              dk_same ? "same" : "differs", dv_same ? "same" : "differs", desc);
        failed = !(ok && dk_same && dv_same);
        for (int i = 0; i < 3; ++i) free(g3[i]);
    }
done:
    for (int i = 0; i < 3; ++i) free(g1[i]), free(g2[i]);
    gb_inst_destroy(&b);
    ++gb_cases_run;
    gb_cases_failed += failed;
    return failed;
}

gb_case gb_case_base(sk_dtype dtype, int64_t d, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                     int causal) {
    gb_case c;
    memset(&c, 0, sizeof c);
    c.f.dtype = dtype;
    c.f.batch = 1;
    c.f.seq_q = sq;
    c.f.seq_k = sk;
    c.f.heads_q = 2;
    c.f.heads_kv = 1;
    c.f.head_dim = d;
    c.f.block_q = bq;
    c.f.block_k = bk;
    c.f.causal = causal;
    c.f.layout_batch = 1;
    c.f.layout_heads = 2;
    c.f.density = 1.0;
    c.f.seed = tu_base_seed() ^ (uint64_t)(sq * 1000003 + sk * 101 + bq + bk + causal + 29);
    return c;
}
