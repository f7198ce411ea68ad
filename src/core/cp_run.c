/*
 * cp_run.c - context parallel: a rank's workspace and run
 * (sk_cp_workspace_size, sk_cp_forward).
 *
 * The run of rank r (CPU backend):
 *   1. pack the units each peer needs from r (plan order) into the send
 *      buffer, one contiguous run per peer;
 *   2. one communicator group: a send to and a receive from every peer
 *      with a non-empty pair (both sides read the same plan, so they agree
 *      on which messages exist and on their sizes);
 *   3. widen the shard's Q, K, V to fp32 and unpack the received units into
 *      the remote key buffers [B, remote_keys, Hkv, D] at their slots;
 *   4. per chunk: the local pass (sk_attention_forward over the shard's own
 *      keys: a prefix of the shard, with the caller's mask: shard order is
 *      global order, so causal positions hold), the remote pass (over the
 *      received blocks, mask NONE: with causal every planned remote block
 *      lies wholly below the row's diagonal), and their LSE merge into o
 *      and lse.
 * The partial passes run in fp32 (the CPU backend takes F32), so the merge
 * adds only fp32 / fp64 rounding before O's single rounding to the dtype.
 * The CUDA run (cp_run_cuda.c) shares the checks here and overlaps steps
 * 1-2 with the local passes (docs/perf/context_parallel.md).
 *
 * CPU workspace sections (each 64-byte aligned): send bytes, receive bytes,
 * Q32, K32, V32 (the shard), K and V remote (fp32), O_a, O_b (fp32, chunk c
 * packed [B, S_c, Hq, D] from element B x q_start x Hq x D on), LSE_a, LSE_b
 * (fp32, chunk c's [B, Hq, S_c] from B x q_start x Hq on).
 */
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/cp_internal.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

/* After the exchange's sections (cp_internal.h). */
enum { WS_OA = SK_CP_WS_EXCHANGE, WS_OB, WS_LA, WS_LB, WS_PARTS };

/* The plan against the descriptor: one made for another problem would
 * exchange and index wrongly. */
static sk_status check_plan(const sk_cp_desc *d, const sk_cp_plan_header *h) {
    const struct {
        int64_t plan, desc;
        const char *name;
    } f[] = {{h->ranks, d->ranks, "ranks"},
             {h->sharding, d->sharding, "sharding"},
             {h->batch, d->batch, "batch"},
             {h->seq, d->seq, "seq"},
             {h->heads_q, d->heads_q, "heads_q"},
             {h->heads_kv, d->heads_kv, "heads_kv"},
             {h->head_dim, d->head_dim, "head_dim"},
             {h->causal, d->mask == SK_MASK_CAUSAL, "mask == CAUSAL"},
             {h->elem_bytes, (int64_t)sk_dtype_size(d->dtype), "dtype bytes"}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; ++i)
        if (f[i].plan != f[i].desc)
            return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                            "plan was made for %s = %lld, desc has %lld: re-plan with this desc",
                            f[i].name, (long long)f[i].plan, (long long)f[i].desc);
    return SK_STATUS_SUCCESS;
}

/* The plan's chunks against desc's boundaries (desc->chunk_starts or the
 * equal ones): a plan made with other boundaries shards other rows. The
 * sections are inside the blob (sk_cp_plan_open); a record that is not a
 * chunk is left to sk_cp_plan_check. */
static sk_status check_plan_chunks(const sk_cp_desc *d, const sk_cp_plan_header *h) {
    int64_t nb;
    if (h->block != 64 && h->block != 128) return SK_STATUS_SUCCESS;
    SK_TRY(sk_cp_check_block(d, h->block, &nb));
    const sk_cp_rank_plan *ranks = sk_cp_plan_ranks(h);
    for (int32_t r = 0; r < h->ranks; ++r) {
        int32_t ch[2];
        const int32_t n = sk_cp_rank_chunks(d->ranks, d->sharding, r, ch);
        for (int32_t i = 0; i < n && i < ranks[r].chunks; ++i) {
            const int64_t first = sk_cp_first_block(d, nb, ch[i]);
            if (ranks[r].chunk[i].global_block != first)
                return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                                "plan was made with other chunk boundaries: chunk %d starts at "
                                "block %d there, at %lld by desc->chunk_starts%s: re-plan with "
                                "this desc",
                                (int)ch[i], (int)ranks[r].chunk[i].global_block, (long long)first,
                                sk_cp_desc_starts(d) == NULL ? " (NULL: equal chunks)" : "");
        }
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_ws_add(sk_cp_ctx *c, int64_t bytes, int64_t align) {
    int64_t at = c->offsets[c->parts];
    if (c->parts >= SK_CP_WS_MAX || bytes < 0 || !sk_add_i64(at, bytes, &at) ||
        !sk_add_i64(at, align - 1, &at))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW, "the workspace of rank %d does not fit int64",
                        (int)c->d->rank);
    c->offsets[++c->parts] = at / align * align;
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_open(const sk_cp_desc *d, const void *plan, size_t plan_bytes, sk_cp_ctx *c,
                     int check_layouts) {
    SK_TRY(sk_cp_check_desc(d));
    SK_TRY(sk_cp_plan_open(plan, plan_bytes, &c->h));
    SK_TRY(check_plan(d, c->h));
    SK_TRY(check_plan_chunks(d, c->h));
    SK_TRY(sk_cp_plan_check(c->h, d, check_layouts));
    c->d = d;
    c->rp = &sk_cp_plan_ranks(c->h)[d->rank];
    c->esize = (int64_t)sk_dtype_size(d->dtype);
    c->parts = 0;
    c->offsets[0] = 0;
    return SK_STATUS_SUCCESS;
}

/* Descriptor, plan, and the workspace sections of desc->rank. */
/* check_layouts: whether to check the layouts' content (sk_cp_plan_check:
 * the CUDA run reads them from sk_cp_prepare's checked device copy). */
static sk_status open_ctx(const sk_cp_desc *d, const void *plan, size_t plan_bytes, sk_cp_ctx *c,
                          const char *api, int check_layouts) {
    SK_TRY(sk_cp_open(d, plan, plan_bytes, c, check_layouts));
    if (sk_backend_is_cuda(d->backend)) {
        /* The passes' sizes come from sk_attention_workspace_size, which
         * names itself in the error state: name the caller again. */
        SK_TRY(sk_cp_cuda_workspace(c));
        sk_enter(api);
        return SK_STATUS_SUCCESS;
    }
    const int64_t S = c->rp->tokens;
    const int64_t B = d->batch, Hq = d->heads_q;
    SK_TRY(sk_cp_cpu_exchange_ws(c));
    const int64_t f[WS_PARTS - WS_OA][5] = {
        {B, S, Hq, d->head_dim, 4}, {B, S, Hq, d->head_dim, 4}, {B, Hq, S, 1, 4}, {B, Hq, S, 1, 4}};
    return sk_cp_ws_add_all(c, f, WS_PARTS - WS_OA);
}

sk_status sk_cp_ws_add_all(sk_cp_ctx *c, const int64_t (*f)[5], int n) {
    for (int p = 0; p < n; ++p) {
        int64_t bytes;
        if (!sk_product_i64(f[p], 5, &bytes))
            return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                            "the workspace of rank %d does not fit int64", (int)c->d->rank);
        SK_TRY(sk_cp_ws_add(c, bytes, 64));
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_cpu_exchange_ws(sk_cp_ctx *c) {
    const sk_cp_desc *d = c->d;
    const int64_t S = c->rp->tokens, RK = c->rp->remote_keys;
    const int64_t B = d->batch, Hq = d->heads_q, Hkv = d->heads_kv, D = d->head_dim;
    const int64_t f[SK_CP_WS_EXCHANGE][5] = {{c->rp->send_bytes, 1, 1, 1, 1},
                                             {c->rp->recv_bytes, 1, 1, 1, 1},
                                             {B, S, Hq, D, 4},
                                             {B, S, Hkv, D, 4},
                                             {B, S, Hkv, D, 4},
                                             {B, RK, Hkv, D, 4},
                                             {B, RK, Hkv, D, 4}};
    return sk_cp_ws_add_all(c, f, SK_CP_WS_EXCHANGE);
}

sk_status sk_cp_workspace_size(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                               size_t *workspace_bytes) {
    SK_ENTER("sk_cp_workspace_size");
    sk_cp_ctx c;
    SK_TRY(open_ctx(desc, plan, plan_bytes, &c, "sk_cp_workspace_size", 1));
    SK_CHECK_NOT_NULL(workspace_bytes);
    *workspace_bytes = (size_t)c.offsets[c.parts];
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_prepare(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                        void *workspace, size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_cp_prepare");
    sk_cp_ctx c;
    SK_TRY(open_ctx(desc, plan, plan_bytes, &c, "sk_cp_prepare", 1));
    int cuda = 0;
    SK_TRY(sk_cp_check_prepare_workspace(desc, plan, plan_bytes, workspace, workspace_size,
                                         (size_t)c.offsets[c.parts], "sk_cp_workspace_size",
                                         &cuda));
    return cuda ? sk_cp_cuda_prepare(&c, plan, workspace, stream) : SK_STATUS_SUCCESS;
}

sk_status sk_cp_check_prepare_workspace(const sk_cp_desc *desc, const void *plan, size_t plan_bytes,
                                        void *workspace, size_t workspace_size, size_t need,
                                        const char *size_fn, int *cuda) {
    *cuda = 0;
    if (workspace == NULL || workspace_size < need)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace (%p, %zu bytes) must hold the %zu bytes %s gives", workspace,
                        workspace_size, need, size_fn);
    if (!sk_backend_is_cuda(desc->backend)) return SK_STATUS_SUCCESS; /* nothing to plan */
    SK_TRY(sk_check_alignment(workspace, NULL, 1, 256, 0, "workspace"));
    const sk_buffer bufs[] = {{"workspace", workspace, (int64_t)need, 1},
                              {"plan", plan, (int64_t)plan_bytes, 0}};
    SK_TRY(sk_check_no_alias(bufs, 2));
    *cuda = 1;
    return SK_STATUS_SUCCESS;
}

/* Pointers, sizes, alignment, the workspace, aliasing, the communicator. */
static sk_status check_call(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                            const void *v, void *o, float *lse, const void *plan, size_t plan_bytes,
                            void *workspace, size_t workspace_size) {
    const sk_cp_desc *d = c->d;
    SK_TRY(sk_cp_check_comm(c, comm, 0));
    SK_CHECK_NOT_NULL(q);
    SK_CHECK_NOT_NULL(k);
    SK_CHECK_NOT_NULL(v);
    SK_CHECK_NOT_NULL(o);
    int64_t qb, kb, lb;
    SK_TRY(sk_cp_shard_bytes(c, &qb, &kb, &lb));
    const int cuda = sk_backend_is_cuda(d->backend);
    const size_t ta = cuda ? 16 : (size_t)c->esize; /* CUDA: 16-byte vectors */
    const struct {
        const void *p;
        const char *name;
        size_t align;
    } al[] = {{q, "q", ta}, {k, "k", ta}, {v, "v", ta}, {o, "o", ta}, {lse, "lse", 4}};
    for (size_t i = 0; i < sizeof al / sizeof al[0]; ++i)
        SK_TRY(sk_check_alignment(al[i].p, NULL, 1, al[i].align, 0, al[i].name));
    const size_t need = (size_t)c->offsets[c->parts];
    if (workspace == NULL || workspace_size < need)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace (%p, %zu bytes) must hold the %zu bytes sk_cp_workspace_size "
                        "gives",
                        workspace, workspace_size, need);
    SK_TRY(sk_check_alignment(workspace, NULL, 1, cuda ? 256 : 64, 0, "workspace"));
    const sk_buffer bufs[] = {{"o", o, qb, 1},
                              {"lse", lse, lse ? lb : 0, 1},
                              {"workspace", workspace, (int64_t)need, 1},
                              {"q", q, qb, 0},
                              {"k", k, kb, 0},
                              {"v", v, kb, 0},
                              {"plan", plan, (int64_t)plan_bytes, 0}};
    SK_TRY(sk_check_no_alias(bufs, (int)(sizeof bufs / sizeof bufs[0])));
    return sk_cp_check_comm(c, comm, 1);
}

sk_status sk_cp_shard_bytes(const sk_cp_ctx *c, int64_t *qb, int64_t *kb, int64_t *lb) {
    const sk_cp_desc *d = c->d;
    const int64_t S = c->rp->tokens;
    const int64_t qf[5] = {d->batch, S, d->heads_q, d->head_dim, c->esize};
    const int64_t kf[5] = {d->batch, S, d->heads_kv, d->head_dim, c->esize};
    const int64_t lf[4] = {d->batch, d->heads_q, S, 4};
    if (!sk_product_i64(qf, 5, qb) || !sk_product_i64(kf, 5, kb) || !sk_product_i64(lf, 4, lb))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "the shard of rank %d (%lld tokens) has a byte size beyond int64",
                        (int)d->rank, (long long)S);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_check_comm(const sk_cp_ctx *c, sk_comm_t comm, int kind) {
    const sk_cp_desc *d = c->d;
    SK_CHECK_NOT_NULL(comm);
    if (comm->ranks != d->ranks || comm->rank != d->rank)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "comm is rank %d of %d, desc says rank %d of %d",
                        (int)comm->rank, (int)comm->ranks, (int)d->rank, (int)d->ranks);
    if (!kind) return SK_STATUS_SUCCESS;
    if (sk_backend_is_cuda(d->backend)) return sk_cp_cuda_check(c, comm);
    if (comm->ops->device_memory)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "comm is a %s communicator (device memory); the CPU backend needs the "
                        "simulated one",
                        comm->ops->name);
    return SK_STATUS_SUCCESS;
}

/* Steps 1-3: pack, exchange, widen, unpack. */
sk_status sk_cp_cpu_exchange(const sk_cp_ctx *c, sk_comm_t comm, const void *q, const void *k,
                             const void *v, char *ws, struct CUstream_st *stream) {
    const sk_cp_desc *d = c->d;
    const sk_cp_plan_header *h = c->h;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(h);
    const sk_cp_unit *units = sk_cp_plan_units(h);
    const int32_t R = d->ranks, r = d->rank;
    char *send = ws + c->offsets[SK_CP_WS_SEND], *recv = ws + c->offsets[SK_CP_WS_RECV];
    int64_t so = 0, ro = 0;
    SK_TRY(comm->ops->group_start(comm));
    for (int32_t p = 0; p < R; ++p) {
        if (p == r) continue;
        const sk_cp_pair *out = &pairs[(int64_t)r * R + p], *in = &pairs[(int64_t)p * R + r];
        if (out->bytes > 0) {
            sk_cpu_cp_pack(h, c->rp, d->dtype, units + out->unit_start, out->units, k, v,
                           send + so);
            SK_TRY(comm->ops->send(comm, send + so, (size_t)out->bytes, p, stream));
            so += out->bytes;
        }
        if (in->bytes > 0) {
            SK_TRY(comm->ops->recv(comm, recv + ro, (size_t)in->bytes, p, stream));
            ro += in->bytes;
        }
    }
    SK_TRY(comm->ops->group_end(comm, stream));

    const int64_t S = c->rp->tokens, B = d->batch, D = d->head_dim;
    sk_cpu_load_f32((float *)(void *)(ws + c->offsets[SK_CP_WS_Q]), q, d->dtype,
                    B * S * d->heads_q * D);
    sk_cpu_load_f32((float *)(void *)(ws + c->offsets[SK_CP_WS_K]), k, d->dtype,
                    B * S * d->heads_kv * D);
    sk_cpu_load_f32((float *)(void *)(ws + c->offsets[SK_CP_WS_V]), v, d->dtype,
                    B * S * d->heads_kv * D);
    float *kr = (float *)(void *)(ws + c->offsets[SK_CP_WS_KR]);
    float *vr = (float *)(void *)(ws + c->offsets[SK_CP_WS_VR]);
    /* Slots a (batch, head) did not receive are never read; zero keeps
     * the buffers defined. */
    memset(kr, 0, (size_t)(c->offsets[SK_CP_WS_VR] - c->offsets[SK_CP_WS_KR]));
    memset(vr, 0, (size_t)(c->offsets[SK_CP_WS_VR + 1] - c->offsets[SK_CP_WS_VR]));
    ro = 0;
    for (int32_t p = 0; p < R; ++p) {
        const sk_cp_pair *in = &pairs[(int64_t)p * R + r];
        if (p == r || in->bytes == 0) continue;
        sk_cpu_cp_unpack(h, c->rp, d->dtype, units + in->unit_start, in->units, recv + ro, kr, vr);
        ro += in->bytes;
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_cpu_pass_desc(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, int64_t keys,
                              int64_t key_seq, int remote, sk_attention_desc *out, sk_bsr *L) {
    const sk_cp_desc *d = c->d;
    sk_attention_desc a;
    SK_TRY(sk_attention_desc_init(&a, sizeof a));
    a.backend = SK_BACKEND_CPU;
    a.dtype = SK_DTYPE_F32;
    a.batch = d->batch;
    a.seq_q = cp->tokens;
    a.seq_k = keys;
    a.heads_q = d->heads_q;
    a.heads_kv = d->heads_kv;
    a.head_dim = d->head_dim;
    a.scale = d->scale;
    a.mask = remote ? SK_MASK_NONE : d->mask;
    const int64_t S = c->rp->tokens;
    const int64_t qs[3] = {S * d->heads_q * d->head_dim, d->heads_q * d->head_dim, d->head_dim};
    const int64_t ks[3] = {key_seq * d->heads_kv * d->head_dim, d->heads_kv * d->head_dim,
                           d->head_dim};
    memcpy(a.q_strides, qs, sizeof qs);
    memcpy(a.k_strides, ks, sizeof ks);
    memcpy(a.v_strides, ks, sizeof ks);
    memcpy(a.o_strides, qs, sizeof qs);
    sk_cp_chunk_layout(c->h, cp, keys, remote, L);
    *out = a;
    return SK_STATUS_SUCCESS;
}

/* One partial pass of chunk cp: queries from the shard's fp32 Q, keys k/v
 * (keys tokens, seq stride key_seq), the chunk's local or remote layout
 * (remote: no mask, see the header comment); o, lse the chunk's packed
 * parts. */
static sk_status pass(const sk_cp_ctx *c, const sk_cp_chunk_plan *cp, const float *q32,
                      const float *k, const float *v, int64_t keys, int64_t key_seq, int remote,
                      float *o, float *lse) {
    sk_attention_desc a;
    sk_bsr L;
    SK_TRY(sk_cp_cpu_pass_desc(c, cp, keys, key_seq, remote, &a, &L));
    memset(a.o_strides, 0, sizeof a.o_strides); /* the chunk's packed part */
    return sk_attention_forward(&a, &L, q32 + cp->q_start * a.q_strides[1], k, v, o, lse, NULL, 0,
                                NULL);
}

sk_status sk_cp_forward(const sk_cp_desc *desc, const void *plan, size_t plan_bytes, sk_comm_t comm,
                        const void *q, const void *k, const void *v, void *o, float *lse,
                        void *workspace, size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_cp_forward");
    sk_cp_ctx c;
    SK_TRY(
        open_ctx(desc, plan, plan_bytes, &c, "sk_cp_forward", !sk_backend_is_cuda(desc->backend)));
    SK_TRY(check_call(&c, comm, q, k, v, o, lse, plan, plan_bytes, workspace, workspace_size));
    char *ws = workspace;
    if (sk_backend_is_cuda(desc->backend))
        return sk_cp_cuda_forward(&c, comm, q, k, v, o, lse, ws, stream);
    SK_TRY(sk_cp_cpu_exchange(&c, comm, q, k, v, ws, stream));
    const float *q32 = (const float *)(void *)(ws + c.offsets[SK_CP_WS_Q]);
    const float *k32 = (const float *)(void *)(ws + c.offsets[SK_CP_WS_K]);
    const float *v32 = (const float *)(void *)(ws + c.offsets[SK_CP_WS_V]);
    const float *kr = (const float *)(void *)(ws + c.offsets[SK_CP_WS_KR]);
    const float *vr = (const float *)(void *)(ws + c.offsets[SK_CP_WS_VR]);
    float *oa = (float *)(void *)(ws + c.offsets[WS_OA]);
    float *ob = (float *)(void *)(ws + c.offsets[WS_OB]);
    float *la = (float *)(void *)(ws + c.offsets[WS_LA]);
    float *lb = (float *)(void *)(ws + c.offsets[WS_LB]);
    /* Every pass first, into chunk-sized parts of the partial buffers (a
     * chunk's packed [B, S_c, ...] at its first token's offset), then the
     * merges: o and lse are written only once nothing can fail. */
    const int64_t HD = desc->heads_q * desc->head_dim;
    for (int32_t i = 0; i < c.rp->chunks; ++i) {
        const sk_cp_chunk_plan *cp = &c.rp->chunk[i];
        const int64_t po = desc->batch * cp->q_start;
        SK_TRY(pass(&c, cp, q32, k32, v32, cp->local_keys, c.rp->tokens, 0, oa + po * HD,
                    la + po * desc->heads_q));
        if (cp->remote_nnz > 0)
            SK_TRY(pass(&c, cp, q32, kr, vr, c.rp->remote_keys, c.rp->remote_keys, 1, ob + po * HD,
                        lb + po * desc->heads_q));
    }
    for (int32_t i = 0; i < c.rp->chunks; ++i) {
        const sk_cp_chunk_plan *cp = &c.rp->chunk[i];
        const int64_t po = desc->batch * cp->q_start;
        const int remote = cp->remote_nnz > 0;
        const sk_lse_merge m = {desc->dtype,
                                desc->batch,
                                cp->tokens,
                                desc->heads_q,
                                desc->head_dim,
                                oa + po * HD,
                                la + po * desc->heads_q,
                                remote ? ob + po * HD : NULL,
                                remote ? lb + po * desc->heads_q : NULL,
                                o,
                                lse,
                                c.rp->tokens,
                                cp->q_start};
        sk_cpu_lse_merge(&m);
    }
    SK_ENTER("sk_cp_forward"); /* the passes named their own calls */
    return SK_STATUS_SUCCESS;
}
