/*
 * varlen_gpu.h - the GPU suite's machinery for the varlen and paged-KV
 * forwards (varlen_gpu.c), shared by test_attention_varlen_gpu.c (seeded
 * cases) and test_attention_varlen_graph_gpu.c (graphs, re-plans, device
 * arrays that break the contract).
 */
#ifndef SK_TESTS_GPU_VARLEN_GPU_H
#define SK_TESTS_GPU_VARLEN_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/varlen_case.h"
#include "sparsek.h"

/* A paged form of a case's keys: caches, table, lengths (host). */
typedef struct vg_paged {
    int32_t page_size, max_pages, num_pages;
    int64_t table_stride;
    int64_t ps, ss, hs; /* element strides over [page, slot, head] */
    int64_t cache_elems;
    int32_t lens_k[VC_MAXB];
    int32_t *table; /* [B, table_stride] */
    void *kc, *vc;
} vg_paged;

/* The device side of one case. */
typedef struct vg_dev {
    void *q, *k, *v, *o, *ws;
    float *lse;
    int32_t *cu_q, *cu_k, *lens_k, *table;
    sk_bsr layout; /* device arrays */
    size_t ws_bytes, o_bytes, k_bytes;
} vg_dev;

/* Cases checked by vg_check, of which failed / declined (--backend sm90). */
extern int vg_cases, vg_failed, vg_declined;

/* Print the cases checked since `before` (vg_cases then) and the running
 * failed / declined counts, under `what`. */
void vg_report(const char *what, int before);

/* Whether the Hopper kernel covers case c (fp16 / bf16, D 64 / 128,
 * blocks 128 x 128, strides of 16-byte multiples: varlen_sm90.h). */
int vg_sm90_covers(const vc_case *c);

/* Whether the backend under test must decline c: --backend sm90 and a case
 * the Hopper kernel does not cover. */
int vg_declines(const vc_case *c);

/* Whether device 0 is a Hopper (compute capability 9.0); else prints that
 * the caller skips. */
int vg_is_hopper(void);

/* The fixed-shape tests' blocks: 128 x 128 under --backend sm90 (the
 * Hopper kernel's), else as the case has them (64). */
void vg_blocks_for_backend(vc_case *c);

/* The descriptors of a case, on the backend under test. */
void vg_varlen_desc(const vc_case *c, const vc_data *x, sk_attention_varlen_desc *d);
void vg_paged_desc(const vc_case *c, const vc_data *x, const vg_paged *pg,
                   sk_attention_paged_desc *d);

/* Pages for x's keys in `page_size` pages: shuffled; a spare page and the
 * slots past each length NaN; garbage past each table row's used entries;
 * share: sequences 0 and 1 share up to two full first pages (x's keys of
 * sequence 1 take sequence 0's values first); padded: gaps in the cache
 * strides. 0 when out of memory (free with vg_paged_free either way). */
int vg_paged_make(const vc_case *c, vc_data *x, int32_t page_size, int share, int padded,
                  struct tu_rng *rng, vg_paged *pg);
void vg_paged_free(vg_paged *pg);

/* Upload a case (pg NULL: varlen) and allocate its workspace: 0, 1 when
 * the backend under test declines as expected, -1 on failure. */
int vg_dev_make(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g);
void vg_dev_free(vg_dev *g);

/* Plan; run (one_shot: the forward call) on stream s. */
sk_status vg_plan(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g,
                  struct CUstream_st *s);
sk_status vg_run(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g,
                 struct CUstream_st *s, int one_shot);
/* Device O and LSE to the host images o_nan / lse_nan; ws: the workspace
 * to garbage bytes too. 0 on success. */
int vg_poison(const vc_case *c, const vc_data *x, vg_dev *g, const void *o_nan,
              const float *lse_nan, int ws);
/* One pass of c->call's form (pass 0 plans for VC_RUN, pass 1 reuses it). */
sk_status vg_pass(const vc_case *c, const vc_data *x, const vg_paged *pg, vg_dev *g, int pass);

/* Run c twice from poisoned outputs, the passes bitwise equal, the first
 * against the fp64 reference (into x->o / x->lse). 0 when it passed. */
int vg_check(const vc_case *c, vc_data *x, const vg_paged *pg, const char *label);

#endif /* SK_TESTS_GPU_VARLEN_GPU_H */
