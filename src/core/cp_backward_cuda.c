/*
 * cp_backward_cuda.c - the CUDA run of a context-parallel rank's backward
 * (sk_cp_backward_prepare and sk_cp_backward with a CUDA backend); the
 * call's checks are cp_backward.c's, the exchange cp_run_cuda.c's.
 *
 * The run of rank r, on `stream` and the communicator's side stream:
 *
 *   side:    the forward's K/V exchange (sk_cp_cuda_exchange: the same
 *            units and bytes);
 *   stream:  the partial-gradient buffers zeroed; each chunk's LSE rows
 *            packed [B, Hq, S_c] (the attention backward takes a
 *            contiguous LSE); the local pass of each chunk
 *            (sk_attention_backward_run: queries, O, dO the chunk's rows of
 *            the shard, keys a prefix of the own shard, desc's mask), each
 *            writing dtype dQ / dK / dV partials into its own workspace
 *            buffers; these overlap the exchange;
 *   stream:  wait for the side stream; unpack the received units; the
 *            remote pass of each chunk with remote blocks (mask NONE);
 *            pack, per peer in increasing rank, the fp32 dK / dV of the
 *            units received from it (chunk 0's remote partial + chunk
 *            1's, in the peer's unit order);
 *   side:    one group: the packed gradients back along the reverse pairs,
 *            the own units' gradients in from every peer r sent K/V to;
 *   stream:  meanwhile dQ = local + remote (rounded into dq) and
 *            acc = chunk 0's local dK / dV + chunk 1's (fp32); then, after
 *            the side stream, acc += each peer's returned partial in
 *            increasing peer rank; dK, dV = acc rounded into dk, dv.
 *
 * Determinism: every sum has a fixed order (launch order, one thread per
 * element), so the run is bitwise repeatable.
 *
 * Rounding rule ("one rounding per partial"): the attention backward
 * writes each pass's partial gradient in the dtype, so every partial is
 * rounded once to the dtype, then the partials are added in fp32 and the
 * sum is rounded once more. With n partials p_i of an element g (dQ: 2;
 * dK, dV: up to 2 per rank that reads the key), |got - exact| <= u (|g| +
 * sum |p_i|) plus the passes' own fp32 / MMA error, u the dtype's unit
 * roundoff. The CPU run keeps its partials in fp32 (one rounding in all);
 * the CUDA one cannot without an fp32-output mode of the backward kernels.
 *
 * Graph safe: no allocation, no host synchronisation; every check (the
 * call's, the passes' geometry in the workspace sizes) runs before the
 * first enqueue, so ranks refuse together.
 *
 * Workspace sections (256-byte aligned) after the exchange's
 * (cp_internal.h, SK_CP_CW_*): the packed LSE [B, Hq, S_r] fp32 (chunk c
 * from B x Hq x q_start); dQ local, dQ remote [B, S_r, Hq, D] (dtype);
 * chunk c's local dK, dV [B, S_r, Hkv, D] (dtype, 2c and 2c + 1); chunk c's
 * remote dK, dV [B, remote_keys, Hkv, D] (dtype); acc dK, dV [B, S_r, Hkv,
 * D] fp32; the gradient send and receive buffers (fp32: the K/V receive
 * and send bytes x 4 / element size); the 4 passes' backward workspaces.
 */
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/cp_internal.h"
#include "core/internal.h"
#include "cuda/backend.h"

enum {
    BC_LSE = SK_CP_CW_EXCHANGE,
    BC_DQ,
    BC_DKL,
    BC_DKR,
    BC_ACC,
    BC_GSEND,
    BC_GRECV,
    BC_ATT,
    BC_PARTS = BC_ATT + 4
};

/* Whether pass i (chunk i / 2; remote when odd) runs. */
static int bwd_has_pass(const sk_cp_ctx *c, int i) {
    const int chunk = i / 2;
    return chunk < c->rp->chunks && (i % 2 == 0 || c->rp->chunk[chunk].remote_nnz > 0);
}

/* The forward and backward descriptors of pass i (O: the shard's rows). */
static sk_status bwd_descs(const sk_cp_ctx *c, int i, sk_attention_desc *a,
                           sk_attention_backward_desc *g) {
    SK_TRY(sk_cp_cuda_pass_desc(c, &c->rp->chunk[i / 2], i % 2, a));
    memcpy(a->o_strides, a->q_strides, sizeof a->q_strides);
    SK_TRY(sk_attention_backward_desc_init(g, sizeof *g));
    memcpy(g->dout_strides, a->q_strides, sizeof a->q_strides);
    memcpy(g->dq_strides, a->q_strides, sizeof a->q_strides);
    memcpy(g->dk_strides, a->k_strides, sizeof a->k_strides);
    memcpy(g->dv_strides, a->k_strides, sizeof a->k_strides);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_cuda_bwd_workspace(sk_cp_ctx *c) {
    const sk_cp_desc *d = c->d;
    const int64_t S = c->rp->tokens, RK = c->rp->remote_keys, es = c->esize;
    const int64_t B = d->batch, Hq = d->heads_q, Hkv = d->heads_kv, D = d->head_dim;
    SK_TRY(sk_cp_cuda_exchange_ws(c));
    const int64_t f[BC_ATT - BC_LSE][5] = {{B, Hq, S, 1, 4},
                                           {2 * B, S, Hq, D, es},
                                           {4 * B, S, Hkv, D, es},
                                           {4 * B, RK, Hkv, D, es},
                                           {2 * B, S, Hkv, D, 4},
                                           {c->rp->recv_bytes / es, 4, 1, 1, 1},
                                           {c->rp->send_bytes / es, 4, 1, 1, 1}};
    SK_TRY(sk_cp_cuda_ws_add_all(c, f, BC_ATT - BC_LSE));
    /* The passes' geometry is checked here (head_dim, dtype, backend), so
     * an unsupported problem is refused before any exchange. */
    for (int i = 0; i < 4; ++i) {
        c->att_bytes[i] = 0;
        if (bwd_has_pass(c, i)) {
            sk_attention_desc a;
            sk_attention_backward_desc g;
            sk_bsr L;
            SK_TRY(bwd_descs(c, i, &a, &g));
            sk_cp_cuda_pass_layout(c, &c->rp->chunk[i / 2], i % 2, NULL, &L);
            SK_TRY(sk_attention_backward_workspace_size(&a, &g, &L, &c->att_bytes[i]));
        }
        SK_TRY(sk_cp_ws_add(c, (int64_t)c->att_bytes[i], 256));
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_cuda_bwd_prepare(const sk_cp_ctx *c, const void *plan, char *ws,
                                 struct CUstream_st *stream) {
    char *dev = ws + c->offsets[SK_CP_CW_PLAN];
    SK_TRY(sk_cuda_copy_async(dev, plan, (size_t)c->h->total_bytes, stream));
    for (int i = 0; i < 4; ++i) {
        if (!bwd_has_pass(c, i)) continue;
        sk_attention_desc a;
        sk_attention_backward_desc g;
        sk_bsr L;
        SK_TRY(bwd_descs(c, i, &a, &g));
        sk_cp_cuda_pass_layout(c, &c->rp->chunk[i / 2], i % 2, dev, &L);
        SK_TRY(sk_attention_backward_plan(&a, &g, &L, ws + c->offsets[BC_ATT + i], c->att_bytes[i],
                                          stream));
    }
    return SK_STATUS_SUCCESS;
}

/* The caller's tensors. */
typedef struct bwd_io {
    const void *q, *k, *v, *o, *dout;
} bwd_io;

/* The backward of pass i into its partial-gradient buffers. */
static sk_status bwd_pass(const sk_cp_ctx *c, int i, const bwd_io *io, char *ws,
                          struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_chunk_plan *cp = &c->rp->chunk[i / 2];
    const int remote = i % 2, chunk = i / 2;
    sk_attention_desc a;
    sk_attention_backward_desc g;
    sk_bsr L;
    SK_TRY(bwd_descs(c, i, &a, &g));
    sk_cp_cuda_pass_layout(c, cp, remote, ws + c->offsets[SK_CP_CW_PLAN], &L);
    const int64_t B = d->batch, S = c->rp->tokens, es = c->esize;
    const int64_t row = d->heads_q * d->head_dim * es; /* bytes of one token of Q / O / dO */
    const int64_t at = cp->q_start * row;
    const int64_t key_seq = remote ? c->rp->remote_keys : S;
    const int64_t kvb = B * key_seq * d->heads_kv * d->head_dim * es; /* one dK or dV buffer */
    char *dk = ws + c->offsets[remote ? BC_DKR : BC_DKL] + 2 * chunk * kvb;
    char *dq = ws + c->offsets[BC_DQ] + remote * B * S * row + at;
    const float *lse =
        (const float *)(const void *)(ws + c->offsets[BC_LSE]) + B * d->heads_q * cp->q_start;
    const void *k = remote ? ws + c->offsets[SK_CP_CW_KR] : io->k;
    const void *v = remote ? ws + c->offsets[SK_CP_CW_VR] : io->v;
    return sk_attention_backward_run(&a, &g, &L, (const char *)io->q + at, k, v,
                                     (const char *)io->o + at, (const char *)io->dout + at, lse, dq,
                                     dk, dk + kvb, ws + c->offsets[BC_ATT + i], c->att_bytes[i],
                                     stream);
}

/* The gradient units of one pair: packed from the remote partials (add =
 * 0) or added into acc (add = 1); `packed` their fp32 rows. */
static sk_status grad_units(const sk_cp_ctx *c, const sk_cp_pair *pair, int add, float *packed,
                            char *ws, struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_plan_header *h = c->h;
    const sk_cp_rank_plan *rp = c->rp;
    const int64_t B = d->batch, Hkv = d->heads_kv, D = d->head_dim;
    sk_cp_grad_problem p;
    memset(&p, 0, sizeof p);
    p.units =
        ws + c->offsets[SK_CP_CW_PLAN] + h->units + pair->unit_start * (int64_t)sizeof(sk_cp_unit);
    p.count = pair->units;
    p.full = sk_cp_cuda_whole_units(h, pair);
    p.block = h->block;
    p.tail = (int32_t)(h->seq - (h->seq - 1) / h->block * h->block);
    p.dim = (int32_t)D;
    p.add = add;
    p.dtype = d->dtype;
    p.packed = packed;
    p.heads_kv = Hkv;
    if (add) {
        const int64_t nk = B * rp->tokens * Hkv * D;
        p.acc_k = (float *)(void *)(ws + c->offsets[BC_ACC]);
        p.acc_v = p.acc_k + nk;
        p.seq = rp->tokens;
        p.chunks = rp->chunks;
        for (int32_t i = 0; i < rp->chunks; ++i) {
            p.chunk_block[i] = rp->chunk[i].global_block;
            p.chunk_token[i] = rp->chunk[i].q_start;
        }
    } else {
        const int64_t kvb = B * rp->remote_keys * Hkv * D * c->esize;
        const char *r0 = ws + c->offsets[BC_DKR];
        p.dk[0] = r0;
        p.dv[0] = r0 + kvb;
        if (rp->chunks == 2 && rp->chunk[1].remote_nnz > 0) {
            p.dk[1] = r0 + 2 * kvb;
            p.dv[1] = r0 + 3 * kvb;
        }
        p.seq = rp->remote_keys;
    }
    return sk_cuda_cp_grad_units(&p, stream);
}

/* Pack the received units' gradients (stream), then one group on the side
 * stream: back to their owners, the own units' in. */
static sk_status return_grads(const sk_cp_ctx *c, sk_comm_t comm, char *ws,
                              struct CUstream_st *stream) {
    const int32_t R = c->d->ranks, r = c->d->rank;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
    float *send = (float *)(void *)(ws + c->offsets[BC_GSEND]);
    float *recv = (float *)(void *)(ws + c->offsets[BC_GRECV]);
    int64_t so = 0;
    for (int32_t p = 0; p < R; ++p) {
        const sk_cp_pair *back = &pairs[(int64_t)p * R + r];
        if (p == r || back->bytes == 0) continue;
        SK_TRY(grad_units(c, back, 0, send + so, ws, stream));
        so += back->bytes / c->esize;
    }
    struct CUstream_st *side = NULL;
    SK_TRY(sk_cuda_cp_fork(comm->streams, stream, &side));
    SK_TRY(comm->ops->group_start(comm));
    int64_t ro = 0;
    so = 0;
    for (int32_t p = 0; p < R; ++p) {
        if (p == r) continue;
        /* What r received from p goes back to p; what r sent p comes back. */
        const sk_cp_pair *back = &pairs[(int64_t)p * R + r], *home = &pairs[(int64_t)r * R + p];
        if (back->bytes > 0) {
            const int64_t n = back->bytes / c->esize;
            SK_TRY(comm->ops->send(comm, send + so, (size_t)n * 4, p, side));
            so += n;
        }
        if (home->bytes > 0) {
            const int64_t n = home->bytes / c->esize;
            SK_TRY(comm->ops->recv(comm, recv + ro, (size_t)n * 4, p, side));
            ro += n;
        }
    }
    return comm->ops->group_end(comm, side);
}

sk_status sk_cp_cuda_backward(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                              const void *v, const void *o, const float *lse, const void *dout,
                              void *dq, void *dk, void *dv, char *ws, struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_rank_plan *rp = c->rp;
    const int32_t R = d->ranks, r = d->rank;
    const int64_t B = d->batch, S = rp->tokens, Hq = d->heads_q, D = d->head_dim;
    const int64_t nq = B * S * Hq * D, nk = B * S * d->heads_kv * D;
    const int exch = rp->send_bytes > 0 || rp->recv_bytes > 0;
    const bwd_io io = {q, k, v, o, dout};
    if (exch) {
        struct CUstream_st *side = NULL;
        SK_TRY(sk_cuda_cp_fork(comm->streams, stream, &side));
        SK_TRY(sk_cp_cuda_exchange(c, comm, k, v, ws, side, stream));
    }
    /* Rows and keys a pass does not write (rows past a local prefix, the
     * remote dQ of a chunk with no remote pass, a chunk's unused remote
     * buffers) must add nothing. */
    SK_TRY(sk_cuda_cp_zero(ws + c->offsets[BC_DQ], (size_t)(c->offsets[BC_ACC] - c->offsets[BC_DQ]),
                           stream));
    for (int32_t i = 0; i < rp->chunks; ++i) {
        const sk_cp_chunk_plan *cp = &rp->chunk[i];
        const sk_cp_rows_problem rows = {
            B * Hq,     cp->tokens,
            S,          cp->q_start,
            cp->tokens, 0,
            lse,        (float *)(void *)(ws + c->offsets[BC_LSE]) + B * Hq * cp->q_start};
        SK_TRY(sk_cuda_cp_rows(&rows, stream));
    }
    for (int32_t i = 0; i < rp->chunks; ++i) SK_TRY(bwd_pass(c, 2 * i, &io, ws, stream));
    if (exch) SK_TRY(sk_cuda_cp_join(comm->streams, stream));
    SK_TRY(sk_cp_cuda_unpack(c, ws, stream));
    int any_remote = 0;
    for (int32_t i = 0; i < rp->chunks; ++i)
        if (bwd_has_pass(c, 2 * i + 1)) {
            SK_TRY(bwd_pass(c, 2 * i + 1, &io, ws, stream));
            any_remote = 1;
        }
    if (exch) SK_TRY(return_grads(c, comm, ws, stream));
    /* While the gradients travel: dQ, and the local dK / dV sum. */
    const int64_t es = c->esize;
    const char *dql = ws + c->offsets[BC_DQ], *dkl = ws + c->offsets[BC_DKL];
    float *acc = (float *)(void *)(ws + c->offsets[BC_ACC]);
    const sk_cp_sum_problem sq = {d->dtype, nq,  NULL, dql, any_remote ? dql + nq * es : NULL,
                                  dq,       NULL};
    SK_TRY(sk_cuda_cp_sum(&sq, stream));
    const sk_cp_sum_problem sl = {
        d->dtype, 2 * nk, NULL, dkl, rp->chunks == 2 ? dkl + 2 * nk * es : NULL, NULL, acc};
    SK_TRY(sk_cuda_cp_sum(&sl, stream));
    if (exch) {
        SK_TRY(sk_cuda_cp_join(comm->streams, stream));
        const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
        float *in = (float *)(void *)(ws + c->offsets[BC_GRECV]);
        for (int32_t p = 0; p < R; ++p) {
            const sk_cp_pair *home = &pairs[(int64_t)r * R + p];
            if (p == r || home->bytes == 0) continue;
            SK_TRY(grad_units(c, home, 1, in, ws, stream));
            in += home->bytes / es;
        }
    }
    const sk_cp_sum_problem rk = {d->dtype, nk, acc, NULL, NULL, dk, NULL};
    const sk_cp_sum_problem rv = {d->dtype, nk, acc + nk, NULL, NULL, dv, NULL};
    SK_TRY(sk_cuda_cp_sum(&rk, stream));
    return sk_cuda_cp_sum(&rv, stream);
}
