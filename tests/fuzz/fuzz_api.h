/*
 * fuzz_api.h - what the parts of the fuzz_api harness share: the entry
 * point and the helpers (fuzz_api.c), and one file per family of entry
 * points (fuzz_api_attention.c, fuzz_api_backward.c, fuzz_api_gemm.c,
 * fuzz_api_topk.c).
 */
#ifndef SK_FUZZ_API_H
#define SK_FUZZ_API_H

#include "api_case.h"
#include "common/topk_naive.h"
#include "fz_arena.h"
#include "fz_finding.h"
#include "fz_layout_ref.h"
#include "fz_tensor.h"
#include "sparsek.h"

/* Bytes of all a call's buffers together, and the reference work
 * (multiply-adds) of a call that is run to completion. */
enum { API_BYTES_CAP = 4 << 20 };
#define API_WORK_CAP 3.0e5

/* A layout of an attention or GEMM case: arrays at exactly their
 * documented lengths, filled from the case (mask from the seed, count
 * offset, edits) once they are placed. */
typedef struct api_layout {
    fz_grid_ref g;
    sk_bsr bsr;           /* grid and nnz from the case; arrays once placed */
    int64_t n_off, n_idx; /* entries */
    int32_t *off, *idx;   /* the contents to copy in */
    int i_off, i_idx;     /* their arena buffers */
} api_layout;

/* The arrays of the case's layout; 0 when its grid is valid but too large
 * for a call that reads them (reads = 0: a stand-in of one entry each,
 * as calls that only look at the geometry never read the arrays). */
int api_layout_build(const api_case *c, int reads, api_layout *l);
/* Add its arrays to the arena as inputs. */
void api_layout_add(api_layout *l, fz_arena *a);
/* After placement: copy the contents in and point bsr at them. */
void api_layout_fill(api_layout *l, fz_arena *a);
void api_layout_free(api_layout *l);
/* The independent verdict on the placed arrays (read through aligned
 * copies: the arrays may sit one byte off). */
void api_layout_eval(const api_layout *l, fz_layout_ref *r);

/* The workspace as an unused buffer of the case's size (below 257 bytes). */
int api_workspace_add(const api_case *c, fz_arena *a);

/* Backend and dtype rules shared by every descriptor: an sk_backend; F32
 * data on the CPU only; and the CPU only for a call that runs something
 * (`runs`: this build has no CUDA; a size or capacity query may answer for
 * a CUDA backend or refuse it). Then a dtype of sparsek.h. */
void api_expect_backend(fz_expect *e, int32_t backend, int32_t dtype, int runs);
void api_expect_dtype(fz_expect *e, int32_t dtype, const char *what);

/* After placement, before filling: a written buffer overlapping another. */
void api_expect_apart(fz_expect *e, const fz_arena *a);
/* Inputs that overlap each other (allowed, but the data is then mixed: the
 * reference comparison is skipped). */
int api_inputs_overlap(const fz_arena *a);

/* Place the buffers (fz_arena_place) unless `skip` (a call too costly to
 * make) or they exceed API_BYTES_CAP: then free the arena and the layout
 * (NULL: none) and return 0. */
int api_place(fz_arena *a, const api_case *c, int skip, api_layout *l);

/* The scale of the inputs' values: 2^(magnitude % 9 - 4). */
double api_magnitude(const api_case *c);

/* The common outcome of a call: its status (fz_check_status with e), then
 * on failure every buffer untouched, on success writes only where masked.
 * Returns 1 on success. */
int api_outcome(const fz_arena *a, sk_status st, const char *api, const fz_expect *e);

/* A value written only on success (workspace sizes): untouched on failure. */
#define API_UNTOUCHED_SIZE ((size_t)0x5A5A5A5A)

/* The fields an attention and a top-k descriptor share, from the case. */
#define API_DESC_COMMON(d, c)                                                                      \
    do {                                                                                           \
        (d)->backend = (sk_backend)(c)->backend;                                                   \
        (d)->dtype = (sk_dtype)(c)->dtype;                                                         \
        (d)->batch = (c)->size[0];                                                                 \
        (d)->seq_q = (c)->size[1];                                                                 \
        (d)->seq_k = (c)->size[2];                                                                 \
        (d)->heads_q = (c)->size[3];                                                               \
        (d)->heads_kv = (c)->size[4];                                                              \
        (d)->head_dim = (c)->size[5];                                                              \
        (d)->scale = (c)->scale;                                                                   \
        memcpy((d)->q_strides, (c)->strides[0], sizeof(d)->q_strides);                             \
        memcpy((d)->k_strides, (c)->strides[1], sizeof(d)->k_strides);                             \
    } while (0)

/* A top-k descriptor from the case, with what the checks need. */
typedef struct api_topk {
    sk_topk_desc d;
    tk_problem t;               /* the naive selection's problem (q, k set once placed) */
    fz_tensor q, k;             /* Q and K as documented (when the sizes are usable) */
    int sizes_ok;               /* sizes >= 1 and a known dtype */
    sk_grid grid;               /* the output layout's grid */
    fz_grid_ref g;              /* its verdict */
    int small;                  /* the naive checks are affordable */
    int huge;                   /* so many row blocks that the library's per-row host work
                                   (O(row blocks) per call) would slow the fuzzer: skipped */
    int64_t capacity;           /* the naive capacity (small only) */
    int64_t pq_bytes, pk_bytes; /* pooled Q, K (0 when unusable) */
} api_topk;

/* The descriptor of the case and the rules it breaks. */
void api_topk_init(const api_case *c, api_topk *p, fz_expect *e);
/* Q, K (read) into the arena: exact spans, stand-ins when refused. */
void api_topk_add_qk(const api_topk *p, fz_arena *a, fz_expect *e);
/* The output layout's arrays (written): row_offsets, then col_indices. */
void api_topk_add_layout(const api_topk *p, fz_arena *a);
/* After placement: Q and K values, the naive problem's pointers. */
void api_topk_fill_qk(api_topk *p, fz_arena *a, int iq, tu_rng *rng, double mag);
/* The layout struct of a selection, poisoned, over the output arrays at
 * i_off; the rules on it (a NULL layout with the case's fault, NULL
 * arrays) into e. */
void api_topk_layout_struct(const api_case *c, const api_topk *p, const fz_arena *a, int i_off,
                            sk_bsr *lay, fz_expect *e);
/* Layout arrays of the problem's size, private to the harness (a second
 * selection to compare with). */
typedef struct api_topk_out {
    int32_t *off, *idx;
    sk_bsr bsr;
} api_topk_out;
void api_topk_out_init(const api_topk *p, api_topk_out *o);
/* got equals o entry for entry (each with its real count as nnz); frees o. */
void api_topk_out_require(const api_topk *p, api_topk_out *o, const sk_bsr *got, const char *what);
/* A successful selection's layout: the struct's grid and nnz, the count,
 * validity (independent check). */
void api_topk_check_layout(const api_topk *p, const sk_bsr *lay, const char *api);

/* The attention descriptor of a case (fuzz_api_attention.c), the rules it
 * breaks (runs: the call computes, so a CUDA backend is refused; returns 1
 * when its sizes are all usable), and the layout geometry against it. */
void api_attn_desc(const api_case *c, sk_attention_desc *d);
int api_attn_expect_desc(const api_case *c, const sk_attention_desc *d, int runs, fz_expect *e);
void api_attn_expect_geometry(const api_case *c, const sk_attention_desc *d, const api_layout *l,
                              fz_expect *e);
/* A [B, S, H, D] tensor into the arena at its span (a stand-in when its
 * span is refused, which is then expected to fail the call). */
void api_tensor_add(fz_arena *a, fz_expect *e, const fz_tensor *t, const char *name, int role,
                    int sizes_ok);
/* Entries of an LSE [B, Hq, Sq] (1 when the sizes are unusable, capped). */
int64_t api_lse_count(const sk_attention_desc *d, int sizes_ok);

void fuzz_api_attention(const api_case *c);
void fuzz_api_backward(const api_case *c);
void fuzz_api_gemm(const api_case *c);
void fuzz_api_topk(const api_case *c);
void fuzz_api_attention_topk(const api_case *c);

#endif /* SK_FUZZ_API_H */
