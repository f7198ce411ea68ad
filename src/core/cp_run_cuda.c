/*
 * cp_run_cuda.c - the CUDA run of a context-parallel rank (sk_cp_prepare,
 * sk_cp_forward with a CUDA backend); the checks it shares with the CPU
 * run are in cp_run.c.
 *
 * sk_cp_prepare uploads the plan blob as it is (it is position
 * independent) into the workspace and plans the rank's attention passes
 * over the layouts inside that copy. The run of rank r, on `stream` and
 * the communicator's side stream:
 *
 *   side:    pack every peer's units (cp/cp.cu), one group of sends and
 *            receives;
 *   stream:  the local pass of each chunk (sk_attention_run: queries of
 *            the chunk, keys a prefix of the own shard, the caller's mask),
 *            writing O straight into o and LSE into the workspace;
 *   stream:  wait for the side stream; unpack the received units into the
 *            remote K/V buffers; the remote pass of each chunk that has
 *            remote blocks (mask NONE: with causal every planned remote
 *            block lies below the diagonal), merged with the local result
 *            by LSE: on the Hopper kernel inside the pass (it starts each
 *            tile from the local O and LSE, "carry-in", and writes the
 *            merged O in place), elsewhere by the merge kernel over O_b.
 *
 * The local passes overlap the exchange. Everything that can fail on the
 * host (the checks, the passes' geometry, the plan's unit order) is
 * checked before the first enqueue, so ranks refuse together.
 *
 * Workspace sections (256-byte aligned): the plan copy, send bytes,
 * receive bytes, K and V remote [B, remote_keys, Hkv, D] in the dtype, O_b
 * [B, S_r, Hq, D] in the dtype (chunk c packed [B, S_c, ...] from element
 * B x q_start x Hq x D; empty when every remote pass merges in the kernel), LSE_a and LSE_b [B, Hq,
 * S_r] fp32 (chunk c's [B, Hq, S_c] from B x q_start x Hq), then the attention workspaces of the
 * passes (chunk 0 local, chunk 0 remote, chunk 1 local, chunk 1 remote).
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/cp_internal.h"
#include "core/internal.h"
#include "cuda/backend.h"

/* The first five are the exchange's, shared with the backward
 * (cp_internal.h, SK_CP_CW_*). */
enum {
    CW_PLAN = SK_CP_CW_PLAN,
    CW_SEND = SK_CP_CW_SEND,
    CW_RECV = SK_CP_CW_RECV,
    CW_KR = SK_CP_CW_KR,
    CW_VR = SK_CP_CW_VR,
    CW_OB = SK_CP_CW_EXCHANGE,
    CW_LA,
    CW_LB,
    CW_ATT,
    CW_PARTS = CW_ATT + 4
};

sk_status sk_cp_cuda_pass_desc(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int remote,
                               sk_attention_desc *a) {
    const sk_cp_desc *d = c->d;
    SK_TRY(sk_attention_desc_init(a, sizeof *a));
    const int64_t S = c->rp->tokens, keys = remote ? c->rp->remote_keys : cp->local_keys;
    const int64_t key_seq = remote ? c->rp->remote_keys : S;
    a->backend = d->backend;
    a->dtype = d->dtype;
    a->batch = d->batch;
    a->seq_q = cp->tokens;
    a->seq_k = keys;
    a->heads_q = d->heads_q;
    a->heads_kv = d->heads_kv;
    a->head_dim = d->head_dim;
    a->scale = d->scale;
    a->mask = remote ? SK_MASK_NONE : d->mask;
    const int64_t qs[3] = {S * d->heads_q * d->head_dim, d->heads_q * d->head_dim, d->head_dim};
    const int64_t ks[3] = {key_seq * d->heads_kv * d->head_dim, d->heads_kv * d->head_dim,
                           d->head_dim};
    /* Remote O goes to O_b's chunk part, packed; local O into o. */
    const int64_t ob[3] = {cp->tokens * d->heads_q * d->head_dim, d->heads_q * d->head_dim,
                           d->head_dim};
    memcpy(a->q_strides, qs, sizeof qs);
    memcpy(a->k_strides, ks, sizeof ks);
    memcpy(a->v_strides, ks, sizeof ks);
    memcpy(a->o_strides, remote ? ob : qs, sizeof qs);
    return SK_STATUS_SUCCESS;
}

void sk_cp_cuda_pass_layout(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int remote,
                            const char *dev, sk_bsr *L) {
    sk_cp_chunk_layout(c->h, cp, remote ? c->rp->remote_keys : cp->local_keys, remote, L);
    if (dev == NULL) return;
    const char *host = (const char *)c->h;
    L->row_offsets = (int32_t *)(intptr_t)(dev + ((const char *)L->row_offsets - host));
    L->col_indices = (int32_t *)(intptr_t)(dev + ((const char *)L->col_indices - host));
}

/* Whether pass i (chunk i / 2; remote when odd) runs. */
static int has_pass(const sk_cp_ctx *c, int i) {
    const int chunk = i / 2;
    return chunk < c->rp->chunks && (i % 2 == 0 || c->rp->chunk[chunk].remote_nnz > 0);
}

/* Whether chunk i's local or remote pass runs on the Hopper fixed kernel,
 * the one that merges by carry-in and runs a part of its tiles. Asks the
 * device; without one (or for a problem the passes refuse, which the
 * workspace sizes below report) the answer is no. */
static int pass_on_hopper(const sk_cp_ctx *c, int32_t i, int remote) {
    sk_attention_desc a;
    sk_bsr L;
    int yes = 0;
    sk_cp_cuda_pass_layout(c, &c->rp->chunk[i], remote, NULL, &L);
    return sk_cp_cuda_pass_desc(c, &c->rp->chunk[i], remote, &a) == SK_STATUS_SUCCESS &&
           sk_attention_carry_supported(&a, &L, &yes) == SK_STATUS_SUCCESS && yes;
}

/* Whether every remote pass merges in the kernel (carry-in): then O_b is
 * not needed. */
static int carry_everywhere(const sk_cp_ctx *c) {
    for (int32_t i = 0; i < c->rp->chunks; ++i)
        if (c->rp->chunk[i].remote_nnz > 0 && !pass_on_hopper(c, i, 1)) return 0;
    return 1;
}

sk_status sk_cp_cuda_ws_add_all(sk_cp_ctx *c, const int64_t (*f)[5], int n) {
    for (int p = 0; p < n; ++p) {
        int64_t bytes;
        if (!sk_product_i64(f[p], 5, &bytes))
            return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                            "the workspace of rank %d does not fit int64", (int)c->d->rank);
        SK_TRY(sk_cp_ws_add(c, bytes, 256));
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_cuda_exchange_ws(sk_cp_ctx *c) {
    const sk_cp_rank_plan *rp = c->rp;
    const int64_t B = c->d->batch, Hkv = c->d->heads_kv, D = c->d->head_dim;
    const int64_t f[SK_CP_CW_EXCHANGE][5] = {{c->h->total_bytes, 1, 1, 1, 1},
                                             {rp->send_bytes, 1, 1, 1, 1},
                                             {rp->recv_bytes, 1, 1, 1, 1},
                                             {B, rp->remote_keys, Hkv, D, c->esize},
                                             {B, rp->remote_keys, Hkv, D, c->esize}};
    return sk_cp_cuda_ws_add_all(c, f, SK_CP_CW_EXCHANGE);
}

sk_status sk_cp_cuda_workspace(sk_cp_ctx *c) {
    const sk_cp_desc *d = c->d;
    const sk_cp_rank_plan *rp = c->rp;
    const int64_t B = d->batch, Hq = d->heads_q, D = d->head_dim;
    c->carry = carry_everywhere(c);
    c->split = pass_on_hopper(c, 0, 0); /* first_local_pass's parts */
    SK_TRY(sk_cp_cuda_exchange_ws(c));
    const int64_t f[CW_ATT - CW_OB][5] = {{B, rp->tokens, Hq, D, c->carry ? 0 : c->esize},
                                          {B, Hq, rp->tokens, 1, 4},
                                          {B, Hq, rp->tokens, 1, 4}};
    SK_TRY(sk_cp_cuda_ws_add_all(c, f, CW_ATT - CW_OB));
    /* The passes: their geometry is checked here (head_dim, dtype,
     * backend), so an unsupported problem is refused before any exchange. */
    for (int i = 0; i < 4; ++i) {
        const int chunk = i / 2, remote = i % 2;
        c->att_bytes[i] = 0;
        if (has_pass(c, i)) {
            sk_attention_desc a;
            sk_bsr L;
            SK_TRY(sk_cp_cuda_pass_desc(c, &rp->chunk[chunk], remote, &a));
            sk_cp_cuda_pass_layout(c, &rp->chunk[chunk], remote, NULL, &L);
            SK_TRY(sk_attention_workspace_size(&a, &L, &c->att_bytes[i]));
        }
        SK_TRY(sk_cp_ws_add(c, (int64_t)c->att_bytes[i], 256));
    }
    return SK_STATUS_SUCCESS;
}

/* Units of one pair with a whole block (the rest, of the tail block, come
 * last in the plan's order, which the packed offsets rely on): -1 when a
 * tail unit precedes a whole one (a corrupt plan). */
int64_t sk_cp_cuda_whole_units(const sk_cp_plan_header *h, const sk_cp_pair *pair) {
    const sk_cp_unit *u = sk_cp_plan_units(h) + pair->unit_start;
    const int64_t nb = (h->seq + h->block - 1) / h->block;
    const int tail = h->seq % h->block != 0;
    int64_t whole = pair->units;
    for (int64_t i = 0; i < pair->units; ++i) {
        const int is_tail = tail && u[i].block == nb - 1;
        if (is_tail && whole == pair->units) whole = i;
        if (!is_tail && whole < pair->units) return -1;
    }
    return whole;
}

sk_status sk_cp_cuda_check(const sk_cp_ctx *c, sk_comm_t comm) {
    if (!comm->ops->device_memory || comm->streams == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "comm is a %s communicator (host memory); the CUDA backend needs "
                        "sk_comm_create_nccl or sk_comm_create_simulated_cuda",
                        comm->ops->name);
    const int32_t R = c->d->ranks, r = c->d->rank;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
    for (int32_t p = 0; p < R; ++p) {
        if (p == r) continue;
        if (sk_cp_cuda_whole_units(c->h, &pairs[(int64_t)r * R + p]) < 0 ||
            sk_cp_cuda_whole_units(c->h, &pairs[(int64_t)p * R + r]) < 0)
            return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                            "plan is corrupt: the units rank %d exchanges with rank %d are not "
                            "in the plan's order (re-make it with sk_cp_plan)",
                            (int)r, (int)p);
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_cuda_prepare(const sk_cp_ctx *c, const void *plan, char *ws,
                             struct CUstream_st *stream) {
    char *dev = ws + c->offsets[CW_PLAN];
    SK_TRY(sk_cuda_copy_async(dev, plan, (size_t)c->h->total_bytes, stream));
    for (int i = 0; i < 4; ++i) {
        const int chunk = i / 2, remote = i % 2;
        if (!has_pass(c, i)) continue;
        sk_attention_desc a;
        sk_bsr L;
        SK_TRY(sk_cp_cuda_pass_desc(c, &c->rp->chunk[chunk], remote, &a));
        sk_cp_cuda_pass_layout(c, &c->rp->chunk[chunk], remote, dev, &L);
        SK_TRY(sk_attention_plan(&a, &L, ws + c->offsets[CW_ATT + i], c->att_bytes[i], stream));
    }
    return SK_STATUS_SUCCESS;
}

/* Pack (to the send buffer) or unpack (from the receive buffer) the units
 * of one pair. */
static sk_status copy_pair(const sk_cp_ctx *c, const sk_cp_pair *pair, int unpack, char *packed,
                           const void *k, const void *v, char *ws, struct CUstream_st *stream) {
    const sk_cp_plan_header *h = c->h;
    const sk_cp_rank_plan *rp = c->rp;
    sk_cp_copy_problem p;
    memset(&p, 0, sizeof p);
    p.units = ws + c->offsets[CW_PLAN] + h->units + pair->unit_start * (int64_t)sizeof(sk_cp_unit);
    p.count = pair->units;
    p.full = sk_cp_cuda_whole_units(h, pair);
    p.block = h->block;
    p.tail = (int32_t)(h->seq - (h->seq - 1) / h->block * h->block);
    p.row_bytes = (int32_t)(h->head_dim * c->esize);
    p.unpack = unpack;
    p.packed = packed;
    p.k = (void *)(intptr_t)k;
    p.v = (void *)(intptr_t)v;
    p.seq = unpack ? rp->remote_keys : rp->tokens;
    p.heads_kv = h->heads_kv;
    p.chunks = rp->chunks;
    for (int32_t i = 0; i < rp->chunks; ++i) {
        p.chunk_block[i] = rp->chunk[i].global_block;
        p.chunk_blocks[i] = rp->chunk[i].blocks;
        p.chunk_token[i] = rp->chunk[i].q_start;
    }
    return sk_cuda_cp_copy_units(&p, stream);
}

/* Pack on the side stream, then one group of sends and receives there.
 * `stream` waits for the packing before its passes: otherwise the
 * attention's persistent CTAs, ready while the packing runs, take every SM
 * and NCCL's kernel (behind the packing) gets none until the pass ends,
 * which serialises the exchange behind the local passes (measured,
 * docs/perf/context_parallel.md). The side stream has the highest
 * priority, so NCCL's CTAs are dispatched first. */
sk_status sk_cp_cuda_exchange(const sk_cp_ctx *c, sk_comm_t comm, const void *k, const void *v,
                              char *ws, struct CUstream_st *side, struct CUstream_st *stream) {
    const int32_t R = c->d->ranks, r = c->d->rank;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
    char *send = ws + c->offsets[CW_SEND], *recv = ws + c->offsets[CW_RECV];
    int64_t at = 0;
    for (int32_t p = 0; p < R; ++p) {
        const sk_cp_pair *out = &pairs[(int64_t)r * R + p];
        if (p == r || out->bytes == 0) continue;
        SK_TRY(copy_pair(c, out, 0, send + at, k, v, ws, side));
        at += out->bytes;
    }
    if (at > 0) SK_TRY(sk_cuda_cp_join(comm->streams, stream));
    SK_TRY(comm->ops->group_start(comm));
    int64_t so = 0, ro = 0;
    for (int32_t p = 0; p < R; ++p) {
        if (p == r) continue;
        const sk_cp_pair *out = &pairs[(int64_t)r * R + p], *in = &pairs[(int64_t)p * R + r];
        if (out->bytes > 0) {
            SK_TRY(comm->ops->send(comm, send + so, (size_t)out->bytes, p, side));
            so += out->bytes;
        }
        if (in->bytes > 0) {
            SK_TRY(comm->ops->recv(comm, recv + ro, (size_t)in->bytes, p, side));
            ro += in->bytes;
        }
    }
    return comm->ops->group_end(comm, side);
}

sk_status sk_cp_cuda_unpack(const sk_cp_ctx *c, char *ws, struct CUstream_st *stream) {
    const int32_t R = c->d->ranks, r = c->d->rank;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
    int64_t ro = 0;
    for (int32_t p = 0; p < R; ++p) {
        const sk_cp_pair *in = &pairs[(int64_t)p * R + r];
        if (p == r || in->bytes == 0) continue;
        SK_TRY(copy_pair(c, in, 1, ws + c->offsets[CW_RECV] + ro, ws + c->offsets[CW_KR],
                         ws + c->offsets[CW_VR], ws, stream));
        ro += in->bytes;
    }
    return SK_STATUS_SUCCESS;
}

/* One pass of chunk i (remote: over the received blocks, into O_b, or with
 * carry into o in place, its LSE into lse_out; a local one may be a part
 * of its tiles). */
static sk_status pass(const sk_cp_ctx *c, int32_t i, int remote, int carry, const void *q,
                      const void *k, const void *v, void *o, float *lse_out,
                      const sk_attention_part *part, char *ws, struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_chunk_plan *cp = &c->rp->chunk[i];
    sk_attention_desc a;
    sk_bsr L;
    SK_TRY(sk_cp_cuda_pass_desc(c, cp, remote, &a));
    sk_cp_cuda_pass_layout(c, cp, remote, ws + c->offsets[CW_PLAN], &L);
    const int64_t row = d->heads_q * d->head_dim * c->esize; /* bytes of one token of Q / O */
    const char *qc = (const char *)q + cp->q_start * row;
    const int64_t lo = d->batch * cp->q_start * d->heads_q; /* the chunk's LSE part */
    float *la = (float *)(void *)(ws + c->offsets[CW_LA]) + lo;
    const void *kc = remote ? ws + c->offsets[CW_KR] : k;
    const void *vc = remote ? ws + c->offsets[CW_VR] : v;
    const int slot = CW_ATT + 2 * i + remote;
    if (remote && carry) {
        a.o_strides[0] = d->heads_q * d->head_dim * c->rp->tokens; /* o's, as the local pass */
        a.o_strides[1] = d->heads_q * d->head_dim;
        return sk_attention_run_carry(&a, &L, qc, kc, vc, (char *)o + cp->q_start * row, lse_out,
                                      la, ws + c->offsets[slot], c->att_bytes[2 * i + remote],
                                      stream);
    }
    char *oc = remote ? ws + c->offsets[CW_OB] + d->batch * cp->q_start * row
                      : (char *)o + cp->q_start * row;
    float *lc = remote ? (float *)(void *)(ws + c->offsets[CW_LB]) + lo : la;
    if (part != NULL)
        return sk_attention_run_part(&a, &L, qc, kc, vc, oc, lc, part, ws + c->offsets[slot],
                                     c->att_bytes[2 * i + remote], stream);
    return sk_attention_run(&a, &L, qc, kc, vc, oc, lc, ws + c->offsets[slot],
                            c->att_bytes[2 * i + remote], stream);
}

/* The share of its tiles the first local pass runs in its first part,
 * on a grid leaving desc->reserve_sms SMs to NCCL (default 16; measured:
 * whichever of NCCL's kernel and the persistent attention kernel is
 * dispatched first takes the SMs; when the attention wins, the exchange
 * waits for the whole pass). The traces show NCCL's kernel starting at the
 * boundary between the two parts, not on the free SMs: the boundary is
 * what works; reserve_sms = 0 keeps the boundary without the reserve, to
 * measure what the reserve costs (docs/perf/context_parallel.md section
 * 10). */
enum { kFirstPartShare = 8 };

/* The local pass of chunk 0 while the exchange is in flight, on the
 * Hopper kernel: its first tiles on a grid that leaves NCCL reserve_sms
 * SMs, then the rest on the whole GPU. */
static sk_status first_local_pass(const sk_cp_ctx *c, const void *q, const void *k, const void *v,
                                  void *o, char *ws, struct CUstream_st *stream) {
    const int64_t tiles = c->d->batch * c->d->heads_q * c->rp->chunk[0].blocks;
    const int64_t first = tiles / kFirstPartShare;
    if (first < 1) return pass(c, 0, 0, 0, q, k, v, o, NULL, NULL, ws, stream);
    const sk_attention_part a = {0, first, sk_cp_desc_reserve(c->d)}, b = {first, tiles - first, 0};
    SK_TRY(pass(c, 0, 0, 0, q, k, v, o, NULL, &a, ws, stream));
    return pass(c, 0, 0, 0, q, k, v, o, NULL, &b, ws, stream);
}

sk_status sk_cp_cuda_forward(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                             const void *v, void *o, float *lse, char *ws,
                             struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_rank_plan *rp = c->rp;
    const int carry = c->carry; /* the remote passes merge in the kernel */
    struct CUstream_st *side = stream;
    if (rp->send_bytes > 0 || rp->recv_bytes > 0) {
        SK_TRY(sk_cuda_cp_fork(comm->streams, stream, &side));
        SK_TRY(sk_cp_cuda_exchange(c, comm, k, v, ws, side, stream));
    }
    /* Parts only while an exchange is in flight, on the Hopper kernel. */
    const int split = c->split && (rp->send_bytes > 0 || rp->recv_bytes > 0);
    for (int32_t i = 0; i < rp->chunks; ++i)
        SK_TRY(i == 0 && split ? first_local_pass(c, q, k, v, o, ws, stream)
                               : pass(c, i, 0, 0, q, k, v, o, NULL, NULL, ws, stream));
    if (rp->recv_bytes > 0 || rp->send_bytes > 0) SK_TRY(sk_cuda_cp_join(comm->streams, stream));
    SK_TRY(sk_cp_cuda_unpack(c, ws, stream));
    const int64_t row = d->heads_q * d->head_dim * c->esize;
    for (int32_t i = 0; i < rp->chunks; ++i) {
        const sk_cp_chunk_plan *cp = &rp->chunk[i];
        const int remote = cp->remote_nnz > 0;
        const int64_t lo = d->batch * cp->q_start * d->heads_q;
        if (remote && carry) {
            /* Merged in the pass: its LSE straight into lse when the chunk
             * is the whole shard, else into LSE_b and copied to its rows. */
            float *lb = (float *)(void *)(ws + c->offsets[CW_LB]) + lo;
            const int direct = rp->chunks == 1;
            SK_TRY(pass(c, i, 1, 1, q, k, v, o, direct ? lse : (lse != NULL ? lb : NULL), NULL, ws,
                        stream));
            if (direct || lse == NULL) continue;
            const sk_cp_merge_problem copy = {d->dtype,    d->batch,   cp->tokens,  d->heads_q,
                                              d->head_dim, rp->tokens, cp->q_start, o,
                                              lb,          NULL,       NULL,        lse};
            SK_TRY(sk_cuda_cp_merge(&copy, stream));
            continue;
        }
        if (remote) SK_TRY(pass(c, i, 1, 0, q, k, v, o, NULL, NULL, ws, stream));
        const sk_cp_merge_problem m = {
            d->dtype,
            d->batch,
            cp->tokens,
            d->heads_q,
            d->head_dim,
            rp->tokens,
            cp->q_start,
            o,
            (const float *)(const void *)(ws + c->offsets[CW_LA]) + lo,
            remote ? ws + c->offsets[CW_OB] + d->batch * cp->q_start * row : NULL,
            remote ? (const float *)(const void *)(ws + c->offsets[CW_LB]) + lo : NULL,
            lse};
        SK_TRY(sk_cuda_cp_merge(&m, stream));
    }
    return SK_STATUS_SUCCESS;
}
