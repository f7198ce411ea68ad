/*
 * cp_backward.c - context parallel: a rank's backward (sk_cp_backward,
 * sk_cp_backward_workspace_size, sk_cp_backward_prepare).
 *
 * Why the partial passes give exact gradients: the single-process backward
 * of a row q reads P[q, k] = exp(S[q, k] - LSE[q]) and Dl[q] = dO[q] . O[q]
 * with the GLOBAL LSE and O. Given those two, every term of dQ[q], dK[k]
 * and dV[k] belongs to one admissible pair (q, k), and the forward's passes
 * (own keys; received blocks) split the pairs of each row without overlap.
 * So the backward of each pass, fed the global O and LSE rows, yields the
 * exact share of that pass's pairs, and the shares add up.
 *
 * The run of rank r (CPU backend):
 *   1. the forward's exchange (sk_cp_cpu_exchange: the same units, the
 *      same bytes; Q, K, V widened to fp32) and O, dO widened to fp32;
 *   2. per chunk: sk_attention_backward of the local pass (own keys, a
 *      prefix of the shard, desc's mask) and of the remote pass (received
 *      slots, mask NONE) on the forward's sub-layouts, all in fp32 into
 *      the workspace, each output its own buffer (the calls overwrite);
 *   3. the received slots' dK / dV (chunk 0's remote pass + chunk 1's)
 *      packed per unit, in the pair's unit order, and sent back to their
 *      owner along the reverse of the forward's pairs (one group); fp32,
 *      because the owner adds them to its own partials: rounding each to
 *      the dtype first would add one rounding per contributing rank;
 *   4. only then, with nothing left to fail, the outputs: dQ = local +
 *      remote; dK, dV = chunk 0's local pass + chunk 1's (zigzag: chunk 1's
 *      local keys are the whole shard, chunk 0's included) + each peer's
 *      returned partial in increasing peer rank. This order is fixed, so
 *      the run is bitwise repeatable. Each output element is rounded once.
 *
 * The CUDA run is cp_backward_cuda.c's (dtype shares out of the CUDA
 * attention backward, fp32 sums in the same order); the checks and the
 * entry points here serve both.
 *
 * CPU workspace sections after the exchange's (cp_internal.h), 64-byte aligned:
 * O32, dO32 [B, S_r, Hq, D]; LSE of each chunk packed [B, Hq, S_c] (chunk c
 * from B x Hq x q_start on: the attention backward takes a contiguous LSE);
 * dQ local, dQ remote [B, S_r, Hq, D]; dK, dV of each chunk's local pass
 * [B, S_r, Hkv, D] (4 of them); dK, dV of each chunk's remote pass [B,
 * remote_keys, Hkv, D] (4); the gradient send and receive buffers (fp32:
 * the K/V receive and send bytes x 4 / element size).
 */
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/cp_internal.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

enum { BW_O = SK_CP_WS_EXCHANGE, BW_DO, BW_LSE, BW_DQ, BW_DKL, BW_DKR, BW_GSEND, BW_GRECV, BW_END };

/* Checks and the workspace sections of desc->rank's backward (api: the
 * caller's name, restored after the CUDA passes' sizes named theirs). */
static sk_status open_bwd(const sk_cp_desc *d, const void *plan, size_t plan_bytes, sk_cp_ctx *c,
                          const char *api, int check_layouts) {
    SK_TRY(sk_cp_open(d, plan, plan_bytes, c, check_layouts));
    if (sk_backend_is_cuda(d->backend)) {
        SK_TRY(sk_cp_cuda_bwd_workspace(c));
        sk_enter(api);
        return SK_STATUS_SUCCESS;
    }
    SK_TRY(sk_cp_cpu_exchange_ws(c));
    const int64_t S = c->rp->tokens, RK = c->rp->remote_keys, es = c->esize;
    const int64_t B = d->batch, Hq = d->heads_q, Hkv = d->heads_kv, D = d->head_dim;
    const int64_t f[BW_END - BW_O][5] = {{B, S, Hq, D, 4},
                                         {B, S, Hq, D, 4},
                                         {B, Hq, S, 1, 4},
                                         {2 * B, S, Hq, D, 4},
                                         {4 * B, S, Hkv, D, 4},
                                         {4 * B, RK, Hkv, D, 4},
                                         {c->rp->recv_bytes / es, 4, 1, 1, 1},
                                         {c->rp->send_bytes / es, 4, 1, 1, 1}};
    return sk_cp_ws_add_all(c, f, BW_END - BW_O);
}

sk_status sk_cp_backward_workspace_size(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                                        size_t *workspace_bytes) {
    SK_ENTER("sk_cp_backward_workspace_size");
    sk_cp_ctx c;
    SK_TRY(open_bwd(desc, plan, plan_bytes, &c, "sk_cp_backward_workspace_size", 1));
    SK_CHECK_NOT_NULL(workspace_bytes);
    *workspace_bytes = (size_t)c.offsets[c.parts];
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_backward_prepare(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                                 void *workspace, size_t workspace_size,
                                 struct CUstream_st *stream) {
    SK_ENTER("sk_cp_backward_prepare");
    sk_cp_ctx c;
    SK_TRY(open_bwd(desc, plan, plan_bytes, &c, "sk_cp_backward_prepare", 1));
    int cuda = 0;
    SK_TRY(sk_cp_check_prepare_workspace(desc, plan, plan_bytes, workspace, workspace_size,
                                         (size_t)c.offsets[c.parts],
                                         "sk_cp_backward_workspace_size", &cuda));
    return cuda ? sk_cp_cuda_bwd_prepare(&c, plan, workspace, stream) : SK_STATUS_SUCCESS;
}

/* Pointers, alignment, the workspace, aliasing, the communicator. */
static sk_status check_bwd_call(const sk_cp_ctx *c, sk_comm_t comm, const void *const in[6],
                                void *const out[3], const void *plan, size_t plan_bytes,
                                void *workspace, size_t workspace_size) {
    static const char *const in_names[6] = {"q", "k", "v", "o", "lse", "dout"};
    static const char *const out_names[3] = {"dq", "dk", "dv"};
    SK_TRY(sk_cp_check_comm(c, comm, 0));
    int64_t qb, kb, lb;
    SK_TRY(sk_cp_shard_bytes(c, &qb, &kb, &lb));
    const int64_t in_bytes[6] = {qb, kb, kb, qb, lb, qb}, out_bytes[3] = {qb, kb, kb};
    const int cuda = sk_backend_is_cuda(c->d->backend);
    const size_t ta = cuda ? 16 : (size_t)c->esize; /* CUDA: 16-byte vectors */
    sk_buffer bufs[11];
    for (int i = 0; i < 6; ++i) {
        if (in[i] == NULL)
            return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL%s", in_names[i],
                            i == 4 ? " (the backward needs the forward's LSE)" : "");
        SK_TRY(sk_check_alignment(in[i], NULL, 1, i == 4 ? 4 : ta, 0, in_names[i]));
        bufs[i] = (sk_buffer){in_names[i], in[i], in_bytes[i], 0};
    }
    for (int i = 0; i < 3; ++i) {
        if (out[i] == NULL)
            return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL", out_names[i]);
        SK_TRY(sk_check_alignment(out[i], NULL, 1, ta, 0, out_names[i]));
        bufs[6 + i] = (sk_buffer){out_names[i], out[i], out_bytes[i], 1};
    }
    const size_t need = (size_t)c->offsets[c->parts];
    if (workspace == NULL || workspace_size < need)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace (%p, %zu bytes) must hold the %zu bytes "
                        "sk_cp_backward_workspace_size gives",
                        workspace, workspace_size, need);
    SK_TRY(sk_check_alignment(workspace, NULL, 1, cuda ? 256 : 64, 0, "workspace"));
    bufs[9] = (sk_buffer){"workspace", workspace, (int64_t)need, 1};
    bufs[10] = (sk_buffer){"plan", plan, (int64_t)plan_bytes, 0};
    SK_TRY(sk_check_no_alias(bufs, 11));
    return sk_cp_check_comm(c, comm, 1);
}

/* Step 2 for chunk cp: its local (remote = 0) or remote pass's backward. */
static sk_status pass_bwd(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int remote, char *ws) {
    const sk_cp_desc *d = c->d;
    const int64_t S = c->rp->tokens, RK = c->rp->remote_keys, B = d->batch;
    const int64_t keys = remote ? RK : cp->local_keys, key_seq = remote ? RK : S;
    sk_attention_desc a;
    sk_bsr L;
    SK_TRY(sk_cp_cpu_pass_desc(c, cp, keys, key_seq, remote, &a, &L));
    sk_attention_backward_desc g;
    SK_TRY(sk_attention_backward_desc_init(&g, sizeof g));
    memcpy(g.dout_strides, a.q_strides, sizeof a.q_strides);
    memcpy(g.dq_strides, a.q_strides, sizeof a.q_strides);
    memcpy(g.dk_strides, a.k_strides, sizeof a.k_strides);
    memcpy(g.dv_strides, a.k_strides, sizeof a.k_strides);
    const int64_t qo = cp->q_start * a.q_strides[1]; /* the chunk's first row */
    const int64_t chunk = cp == &c->rp->chunk[0] ? 0 : 1;
    const int64_t kv = B * key_seq * d->heads_kv * d->head_dim; /* one dK or dV buffer */
    const float *k =
        (const float *)(const void *)(ws + c->offsets[remote ? SK_CP_WS_KR : SK_CP_WS_K]);
    const float *v =
        (const float *)(const void *)(ws + c->offsets[remote ? SK_CP_WS_VR : SK_CP_WS_V]);
    float *dk = (float *)(void *)(ws + c->offsets[remote ? BW_DKR : BW_DKL]) + 2 * chunk * kv;
    float *dq =
        (float *)(void *)(ws + c->offsets[BW_DQ]) + remote * B * S * d->heads_q * d->head_dim;
    return sk_attention_backward(
        &a, &g, &L, (const float *)(const void *)(ws + c->offsets[SK_CP_WS_Q]) + qo, k, v,
        (const float *)(const void *)(ws + c->offsets[BW_O]) + qo,
        (const float *)(const void *)(ws + c->offsets[BW_DO]) + qo,
        (const float *)(const void *)(ws + c->offsets[BW_LSE]) + B * d->heads_q * cp->q_start,
        dq + qo, dk, dk + kv, NULL, 0, NULL);
}

/* Step 3: the received slots' gradients back to their owners, the owned
 * keys' gradients from the peers into grecv. */
static sk_status return_grads(const sk_cp_ctx *c, sk_comm_t comm, char *ws,
                              struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
    const sk_cp_unit *units = sk_cp_plan_units(c->h);
    const int32_t R = d->ranks, r = d->rank;
    const int64_t kv = d->batch * c->rp->remote_keys * d->heads_kv * d->head_dim;
    float *dk = (float *)(void *)(ws + c->offsets[BW_DKR]);
    if (c->rp->chunks == 2) /* a slot's partial: chunk 0's remote pass + chunk 1's */
        for (int64_t i = 0; i < 2 * kv; ++i) dk[i] += dk[2 * kv + i];
    float *send = (float *)(void *)(ws + c->offsets[BW_GSEND]);
    float *recv = (float *)(void *)(ws + c->offsets[BW_GRECV]);
    SK_TRY(comm->ops->group_start(comm));
    for (int32_t p = 0; p < R; ++p) {
        if (p == r) continue;
        /* What r received from p goes back to p; what r sent p comes back. */
        const sk_cp_pair *back = &pairs[(int64_t)p * R + r], *home = &pairs[(int64_t)r * R + p];
        if (back->bytes > 0) {
            sk_cpu_cp_grad_pack(c->h, c->rp, units + back->unit_start, back->units, dk, dk + kv,
                                send);
            const int64_t n = back->bytes / c->esize;
            SK_TRY(comm->ops->send(comm, send, (size_t)n * 4, p, stream));
            send += n;
        }
        if (home->bytes > 0) {
            const int64_t n = home->bytes / c->esize;
            SK_TRY(comm->ops->recv(comm, recv, (size_t)n * 4, p, stream));
            recv += n;
        }
    }
    return comm->ops->group_end(comm, stream);
}

/* Step 4: the sums in their fixed order, each output rounded once. */
static void write_grads(const sk_cp_ctx *c, char *ws, void *dq, void *dk, void *dv) {
    const sk_cp_desc *d = c->d;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(c->h);
    const sk_cp_unit *units = sk_cp_plan_units(c->h);
    const int32_t R = d->ranks, r = d->rank;
    const int64_t S = c->rp->tokens;
    const int64_t nq = d->batch * S * d->heads_q * d->head_dim;
    const int64_t nk = d->batch * S * d->heads_kv * d->head_dim;
    const float *q2 = (const float *)(const void *)(ws + c->offsets[BW_DQ]);
    for (int64_t i = 0; i < nq; ++i)
        sk_cpu_store1_f64(dq, d->dtype, i, (double)q2[i] + (double)q2[nq + i]);
    float *acc = (float *)(void *)(ws + c->offsets[BW_DKL]); /* chunk 0's dK, dV */
    if (c->rp->chunks == 2)
        for (int64_t i = 0; i < 2 * nk; ++i) acc[i] += acc[2 * nk + i];
    const float *in = (const float *)(const void *)(ws + c->offsets[BW_GRECV]);
    for (int32_t p = 0; p < R; ++p) {
        const sk_cp_pair *home = &pairs[(int64_t)r * R + p];
        if (p == r || home->bytes == 0) continue;
        sk_cpu_cp_grad_add(c->h, c->rp, units + home->unit_start, home->units, in, acc, acc + nk);
        in += home->bytes / c->esize;
    }
    for (int64_t i = 0; i < nk; ++i) {
        sk_cpu_store1_f64(dk, d->dtype, i, acc[i]);
        sk_cpu_store1_f64(dv, d->dtype, i, acc[nk + i]);
    }
}

sk_status sk_cp_backward(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                         sk_comm_t comm, const void *q, const void *k, const void *v, const void *o,
                         const float *lse, const void *dout, void *dq, void *dk, void *dv,
                         void *workspace, size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_cp_backward");
    sk_cp_ctx c;
    const int cuda = sk_backend_is_cuda(desc->backend);
    /* CUDA: the passes read the layouts of sk_cp_backward_prepare's
     * checked device copy (as sk_cp_forward). */
    SK_TRY(open_bwd(desc, plan, plan_bytes, &c, "sk_cp_backward", !cuda));
    const void *const in[6] = {q, k, v, o, lse, dout};
    void *const out[3] = {dq, dk, dv};
    SK_TRY(check_bwd_call(&c, comm, in, out, plan, plan_bytes, workspace, workspace_size));
    char *ws = workspace;
    if (cuda) return sk_cp_cuda_backward(&c, comm, q, k, v, o, lse, dout, dq, dk, dv, ws, stream);
    SK_TRY(sk_cp_cpu_exchange(&c, comm, q, k, v, ws, stream));
    const int64_t S = c.rp->tokens, B = desc->batch, Hq = desc->heads_q;
    const int64_t nq = B * S * Hq * desc->head_dim;
    sk_cpu_load_f32((float *)(void *)(ws + c.offsets[BW_O]), o, desc->dtype, nq);
    sk_cpu_load_f32((float *)(void *)(ws + c.offsets[BW_DO]), dout, desc->dtype, nq);
    /* Each chunk's LSE rows packed (cp_ref.c's merge lays the forward's
     * partial LSEs out the same way). */
    float *lp = (float *)(void *)(ws + c.offsets[BW_LSE]);
    for (int32_t i = 0; i < c.rp->chunks; ++i) {
        const sk_cp_chunk_plan *cp = &c.rp->chunk[i];
        for (int64_t bh = 0; bh < B * Hq; ++bh)
            memcpy(lp + B * Hq * cp->q_start + bh * cp->tokens, lse + bh * S + cp->q_start,
                   (size_t)cp->tokens * sizeof(float));
    }
    /* Outputs a pass does not write (rows past a local prefix, the remote
     * dQ of a chunk with no remote pass, slots a chunk does not read) must
     * add nothing. */
    memset(ws + c.offsets[BW_DQ], 0, (size_t)(c.offsets[BW_GSEND] - c.offsets[BW_DQ]));
    for (int32_t i = 0; i < c.rp->chunks; ++i) {
        SK_TRY(pass_bwd(&c, &c.rp->chunk[i], 0, ws));
        if (c.rp->chunk[i].remote_nnz > 0) SK_TRY(pass_bwd(&c, &c.rp->chunk[i], 1, ws));
    }
    SK_TRY(return_grads(&c, comm, ws, stream));
    write_grads(&c, ws, dq, dk, dv);
    SK_ENTER("sk_cp_backward"); /* the passes named their own calls */
    return SK_STATUS_SUCCESS;
}
