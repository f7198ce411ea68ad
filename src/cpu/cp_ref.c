/*
 * cp_ref.c - the CPU side of a context-parallel rank: packing the units a
 * peer needs, unpacking received ones into the remote key buffers, and the
 * LSE merge of two partial attentions.
 *
 * A unit is one (batch, KV head, key block): its K rows then its V rows,
 * tokens x D elements each, D contiguous; the packed stream is the units
 * in the plan's order (block, batch, head), so sender and receiver agree
 * without any header. Unpacking widens to fp32, the type of the rank's
 * partial passes (cp_run.c). The backward (cp_backward.c) sends fp32
 * dK / dV partials of received units back along the same unit order:
 * packed from the receiver's slots, added at the owner's key rows.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_backend.h"
#include "cpu/half.h"

/* Tokens of global key block j (the last block may be a tail). */
static int64_t unit_tokens(const sk_cp_plan_header *h, int64_t j) {
    const int64_t t = h->seq - j * h->block;
    return t < h->block ? t : h->block;
}

/* First shard-local token of global block j, owned by rank plan rp. */
static int64_t local_token(const sk_cp_plan_header *h, const sk_cp_rank_plan *rp, int64_t j) {
    for (int32_t c = 0; c < rp->chunks; ++c) {
        const sk_cp_chunk_plan *cp = &rp->chunk[c];
        if (j >= cp->global_block && j < (int64_t)cp->global_block + cp->blocks)
            return cp->q_start + (j - cp->global_block) * h->block;
    }
    return -1; /* not owned: the plan never lists such a unit */
}

void sk_cpu_cp_pack(const sk_cp_plan_header *h, const sk_cp_rank_plan *src, sk_dtype dtype,
                    const sk_cp_unit *units, int64_t n, const void *k, const void *v, void *dst) {
    const size_t row = (size_t)h->head_dim * (size_t)h->elem_bytes;
    char *out = dst;
    (void)dtype;
    for (int64_t u = 0; u < n; ++u) {
        const sk_cp_unit *x = &units[u];
        const int64_t tok = unit_tokens(h, x->block), t0 = local_token(h, src, x->block);
        for (int pass = 0; pass < 2; ++pass) {
            const char *base = pass == 0 ? k : v;
            for (int64_t t = 0; t < tok; ++t) {
                const int64_t e = ((x->batch * src->tokens + t0 + t) * h->heads_kv + x->head);
                memcpy(out, base + (size_t)e * row, row);
                out += row;
            }
        }
    }
}

void sk_cpu_cp_unpack(const sk_cp_plan_header *h, const sk_cp_rank_plan *dst, sk_dtype dtype,
                      const sk_cp_unit *units, int64_t n, const void *src, float *k_remote,
                      float *v_remote) {
    const int64_t dim = h->head_dim;
    const char *in = src;
    for (int64_t u = 0; u < n; ++u) {
        const sk_cp_unit *x = &units[u];
        const int64_t tok = unit_tokens(h, x->block), t0 = (int64_t)x->slot * h->block;
        for (int pass = 0; pass < 2; ++pass) {
            float *base = pass == 0 ? k_remote : v_remote;
            for (int64_t t = 0; t < tok; ++t) {
                const int64_t e = (x->batch * dst->remote_keys + t0 + t) * h->heads_kv + x->head;
                sk_cpu_load_f32(base + e * dim, in, dtype, dim);
                in += dim * h->elem_bytes;
            }
        }
    }
}

void sk_cpu_cp_grad_pack(const sk_cp_plan_header *h, const sk_cp_rank_plan *dst,
                         const sk_cp_unit *units, int64_t n, const float *dk_remote,
                         const float *dv_remote, float *out) {
    const int64_t dim = h->head_dim;
    for (int64_t u = 0; u < n; ++u) {
        const sk_cp_unit *x = &units[u];
        const int64_t tok = unit_tokens(h, x->block), t0 = (int64_t)x->slot * h->block;
        for (int pass = 0; pass < 2; ++pass) {
            const float *base = pass == 0 ? dk_remote : dv_remote;
            for (int64_t t = 0; t < tok; ++t) {
                const int64_t e = (x->batch * dst->remote_keys + t0 + t) * h->heads_kv + x->head;
                memcpy(out, base + e * dim, (size_t)dim * sizeof(float));
                out += dim;
            }
        }
    }
}

void sk_cpu_cp_grad_add(const sk_cp_plan_header *h, const sk_cp_rank_plan *src,
                        const sk_cp_unit *units, int64_t n, const float *in, float *dk, float *dv) {
    const int64_t dim = h->head_dim;
    for (int64_t u = 0; u < n; ++u) {
        const sk_cp_unit *x = &units[u];
        const int64_t tok = unit_tokens(h, x->block), t0 = local_token(h, src, x->block);
        for (int pass = 0; pass < 2; ++pass) {
            float *base = pass == 0 ? dk : dv;
            for (int64_t t = 0; t < tok; ++t) {
                float *row =
                    base + ((x->batch * src->tokens + t0 + t) * h->heads_kv + x->head) * dim;
                for (int64_t e = 0; e < dim; ++e) row[e] += in[e];
                in += dim;
            }
        }
    }
}

void sk_cpu_lse_merge(const sk_lse_merge *m) {
    const int64_t H = m->heads, D = m->dim, T = m->tokens;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < m->batch; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
                const int64_t li = (b * H + h) * T + t, oi = ((b * T + t) * H + h) * D;
                const double la = m->lse_a[li];
                const double lb = m->o_b != NULL ? m->lse_b[li] : -INFINITY;
                const double mx = la > lb ? la : lb;
                const int64_t orow = ((b * m->o_seq + m->o_start + t) * H + h) * D;
                double lse;
                if (mx == -INFINITY) { /* no admissible key on either side */
                    for (int64_t d = 0; d < D; ++d)
                        sk_cpu_store1_f64(m->o, m->dtype, orow + d, 0.0);
                    lse = -INFINITY;
                } else {
                    const double wa = exp(la - mx), wb = m->o_b != NULL ? exp(lb - mx) : 0.0;
                    const double sum = wa + wb;
                    for (int64_t d = 0; d < D; ++d) {
                        double acc = wa * (double)m->o_a[oi + d];
                        if (wb != 0.0) acc += wb * (double)m->o_b[oi + d];
                        sk_cpu_store1_f64(m->o, m->dtype, orow + d, acc / sum);
                    }
                    lse = mx + log(sum);
                }
                if (m->lse != NULL) m->lse[(b * H + h) * m->o_seq + m->o_start + t] = (float)lse;
            }
}
