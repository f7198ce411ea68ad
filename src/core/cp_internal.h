/*
 * cp_internal.h - what the context-parallel files share: descriptor and
 * block checks (cp_plan.c) for the run (cp_run.c), and the plan blob
 * (cp_plan.h).
 */
#ifndef SK_CORE_CP_INTERNAL_H
#define SK_CORE_CP_INTERNAL_H

#include "core/cp_plan.h"

/* The most ranks a descriptor may name (C = 2R chunks and R x R pair
 * records stay small). */
#define SK_CP_MAX_RANKS 65536

/* Every field of a context-parallel descriptor (messages "desc->..."). */
sk_status sk_cp_check_desc(const sk_cp_desc *d);
/* block 64 or 128, and S's blocks nb (into *blocks): at least one per
 * chunk, and fitting int32. */
sk_status sk_cp_check_block(const sk_cp_desc *d, int32_t block, int64_t *blocks);

/* Rank r's chunks (count, global token starts and lengths) for d's
 * ranks, sharding and S in blocks of `block` (nb of them); returns S_r. */
int64_t sk_cp_shard_of(const sk_cp_desc *d, int32_t block, int64_t nb, int32_t r, int32_t *count,
                       int64_t starts[2], int64_t lengths[2]);

/* An opened plan made for d's geometry, whole: every rank's shard against
 * the descriptor's sharding, its chunks' layout arrays inside the blob and
 * (with_layouts) valid, every pair's units (a block of the sender; batch,
 * head, slot in range; bytes adding up). Every rank checks all of it, so
 * ranks sharing a plan agree on refusing it (none enters the exchange) or
 * on using it. BAD_PARAM_VALUE "plan is corrupt" otherwise. The CUDA run
 * skips the layouts' content (with_layouts = 0): its passes read the
 * device copy that sk_cp_prepare made after checking them, and checking
 * millions of entries on the host in every run would idle the GPU. */
sk_status sk_cp_plan_check(const sk_cp_plan_header *h, const sk_cp_desc *d, int with_layouts);

/* The local (remote == 0) or remote layout of chunk cp as a view into the
 * plan: rows = its tokens, cols = keys (local_keys or remote_keys). */
void sk_cp_chunk_layout(const sk_cp_plan_header *h, const sk_cp_chunk_plan *cp, int64_t keys,
                        int remote, sk_bsr *out);

/* A rank's run: its descriptor, the opened plan, its rank record, and its
 * workspace sections (byte offsets, 64-byte aligned on the CPU, 256 on
 * CUDA; offsets[parts] is the total). The sections are the backend's:
 * cp_run.c's for the CPU, cp_run_cuda.c's for CUDA. */
#define SK_CP_WS_MAX 16
typedef struct sk_cp_ctx {
    const sk_cp_desc *d;
    const sk_cp_plan_header *h;
    const sk_cp_rank_plan *rp;
    int64_t esize;
    int parts;
    int64_t offsets[SK_CP_WS_MAX + 1];
    size_t att_bytes[4]; /* CUDA: the passes' attention workspaces (chunk x local/remote) */
    int carry;           /* CUDA: every remote pass merges in the kernel (no O_b) */
    int split;           /* CUDA: the first local pass runs on the Hopper kernel, in parts */
} sk_cp_ctx;

/* Append a section of `bytes` (aligned to `align`) to c's workspace;
 * BAD_PARAM_OVERFLOW naming the rank when the total passes int64. */
sk_status sk_cp_ws_add(sk_cp_ctx *c, int64_t bytes, int64_t align);

/* The CUDA run (cp_run_cuda.c): its workspace sections (after the plan is
 * opened and checked), the checks only it needs (before any exchange),
 * the prepare step and the run. */
sk_status sk_cp_cuda_workspace(sk_cp_ctx *c);
sk_status sk_cp_cuda_check(const sk_cp_ctx *c, sk_comm_t comm);
sk_status sk_cp_cuda_prepare(const sk_cp_ctx *c, const void *plan, char *ws,
                             struct CUstream_st *stream);
sk_status sk_cp_cuda_forward(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                             const void *v, void *o, float *lse, char *ws,
                             struct CUstream_st *stream);

/* Shared by the forward run (cp_run.c) and the backward (cp_backward.c). */

/* The checks and the ctx fields of a run (desc, plan against desc, the
 * whole plan; layouts' content when check_layouts), no workspace yet. */
sk_status sk_cp_open(const sk_cp_desc *d, const void *plan, size_t plan_bytes, sk_cp_ctx *c,
                     int check_layouts);
/* The communicator: not NULL, desc's rank and size; with kind, also the
 * kind the backend needs (host memory on the CPU; sk_cp_cuda_check). */
sk_status sk_cp_check_comm(const sk_cp_ctx *c, sk_comm_t comm, int kind);
/* The bytes of a rank's shard of Q (and O, dO), K (V) and LSE;
 * BAD_PARAM_OVERFLOW naming the rank beyond int64. */
sk_status sk_cp_shard_bytes(const sk_cp_ctx *c, int64_t *qb, int64_t *kb, int64_t *lb);
/* Append n sections of f[i][0] x .. x f[i][4] bytes, 64-byte aligned. */
sk_status sk_cp_ws_add_all(sk_cp_ctx *c, const int64_t (*f)[5], int n);

/* The CPU run's first workspace sections, the same in the forward and the
 * backward: send and receive bytes, the shard's Q, K, V widened to fp32,
 * the received K and V (fp32, [B, remote_keys, Hkv, D]). */
enum {
    SK_CP_WS_SEND,
    SK_CP_WS_RECV,
    SK_CP_WS_Q,
    SK_CP_WS_K,
    SK_CP_WS_V,
    SK_CP_WS_KR,
    SK_CP_WS_VR,
    SK_CP_WS_EXCHANGE /* the first section after them */
};
/* Append those sections to c (which has none yet). */
sk_status sk_cp_cpu_exchange_ws(sk_cp_ctx *c);

/* A prepare call's workspace (forward and backward alike): at least the
 * `need` bytes `size_fn` gives; on a CUDA backend also 256-byte aligned and
 * apart from the plan. *cuda = whether there is a device plan to make. */
sk_status sk_cp_check_prepare_workspace(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                                        void *workspace, size_t workspace_size, size_t need,
                                        const char *size_fn, int *cuda);
/* Pack, exchange (one group), widen Q, K, V and unpack the received units
 * into those sections of ws. */
sk_status sk_cp_cpu_exchange(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                             const void *v, char *ws, struct CUstream_st *stream);
/* The fp32 CPU attention of one partial pass of chunk cp: the descriptor
 * (queries, O: the shard's [B, S_r, Hq, D] rows from cp->q_start, strides
 * of the whole shard; keys: `keys` tokens at seq stride key_seq; mask:
 * desc's for the local pass, NONE for the remote one) and its layout. */
sk_status sk_cp_cpu_pass_desc(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int64_t keys,
                              int64_t key_seq, int remote, sk_attention_desc *out, sk_bsr *L);

/* What the CUDA backward (cp_backward_cuda.c) shares with the CUDA forward
 * (cp_run_cuda.c): the exchange's workspace sections, first in both
 * (256-byte aligned): the plan copy, send bytes, receive bytes, K and V
 * remote [B, remote_keys, Hkv, D] in the dtype. */
enum {
    SK_CP_CW_PLAN,
    SK_CP_CW_SEND,
    SK_CP_CW_RECV,
    SK_CP_CW_KR,
    SK_CP_CW_VR,
    SK_CP_CW_EXCHANGE /* the first section after them */
};
/* Append n sections of f[i][0] x .. x f[i][4] bytes, 256-byte aligned. */
sk_status sk_cp_cuda_ws_add_all(sk_cp_ctx *c, const int64_t (*f)[5], int n);
/* Append the exchange's sections to c (which has none yet). */
sk_status sk_cp_cuda_exchange_ws(sk_cp_ctx *c);
/* The forward's attention descriptor of chunk cp's local or remote pass
 * (Q, K, V strides of the shard / remote buffers; O: the shard's for the
 * local pass, the packed chunk part for the remote one). */
sk_status sk_cp_cuda_pass_desc(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int remote,
                               sk_attention_desc *a);
/* The pass's layout: a view into the plan's device copy at dev (the host
 * plan when dev is NULL: geometry only). */
void sk_cp_cuda_pass_layout(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int remote,
                            const char *dev, sk_bsr *L);
/* Units of a pair with a whole block (the tail block's come last); -1 for
 * a corrupt order. */
int64_t sk_cp_cuda_whole_units(const sk_cp_plan_header *h, const sk_cp_pair *pair);
/* Pack on `side`, one group of sends and receives there; `stream` waits
 * for the packing. */
sk_status sk_cp_cuda_exchange(const sk_cp_ctx *c, sk_comm_t comm, const void *k, const void *v,
                              char *ws, struct CUstream_st *side, struct CUstream_st *stream);
/* The received units from the receive buffer into the remote K, V. */
sk_status sk_cp_cuda_unpack(const sk_cp_ctx *c, char *ws, struct CUstream_st *stream);
/* The CUDA backward (cp_backward_cuda.c): its workspace sections after
 * sk_cp_open, the prepare step (plan upload, the passes' backward plans)
 * and the run; the call's checks are cp_backward.c's. */
sk_status sk_cp_cuda_bwd_workspace(sk_cp_ctx *c);
sk_status sk_cp_cuda_bwd_prepare(const sk_cp_ctx *c, const void *plan, char *ws,
                                 struct CUstream_st *stream);
sk_status sk_cp_cuda_backward(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                              const void *v, const void *o, const float *lse, const void *dout,
                              void *dq, void *dk, void *dv, char *ws, struct CUstream_st *stream);

/* Balanced chunks and the first pass's SM reserve (issue 33, cp_plan.c):
 * the fields added to sk_cp_desc after the first version, whose size
 * (SK_CP_DESC_V1_SIZE) older callers pass and get the defaults for. */
#define SK_CP_DESC_V1_SIZE        offsetof(sk_cp_desc, chunk_starts)
#define SK_CP_RESERVE_SMS_DEFAULT 16
#define SK_CP_RESERVE_SMS_MAX     1024
/* desc->chunk_starts (NULL for a V1 descriptor) and desc->reserve_sms (the
 * default for V1). */
const int32_t *sk_cp_desc_starts(const sk_cp_desc *d);
int32_t sk_cp_desc_reserve(const sk_cp_desc *d);
/* Chunk starts (NULL: the equal ones, fine) for `chunks` chunks of nb
 * blocks: [0] = 0, strictly increasing, [chunks] = nb; messages name
 * `name`. */
sk_status sk_cp_check_starts(const int32_t *starts, int32_t chunks, int64_t nb, const char *name);
/* The first global block of chunk c (c = C gives nb) under d's
 * boundaries (checked). */
int64_t sk_cp_first_block(const sk_cp_desc *d, int64_t nb, int32_t c);
/* sk_cp_plan's input checks (desc, the layout validated, its geometry
 * against desc): the layout's block and its blocks nb. */
sk_status sk_cp_check_layout(const sk_cp_desc *d, const sk_bsr *layout, int32_t *block,
                             int64_t *nb);

#endif /* SK_CORE_CP_INTERNAL_H */
