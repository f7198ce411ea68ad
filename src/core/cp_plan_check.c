/*
 * cp_plan_check.c - opening a context-parallel plan blob and checking the
 * part a rank's run reads, so that a corrupt or foreign plan is refused
 * (SK_STATUS_BAD_PARAM_VALUE) before anything is sent or written, instead
 * of being read out of bounds: the sections inside the blob, the rank's
 * shard against its descriptor, its chunks' layouts (validated as
 * sk_layout_validate does) and every unit it sends or receives.
 */
#include "core/check.h"
#include "core/cp_internal.h"
#include "core/internal.h"
#include "core/layout.h"

sk_status sk_cp_plan_open(const void *plan, size_t plan_bytes, const sk_cp_plan_header **out) {
    if (plan == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "plan must not be NULL");
    SK_TRY(sk_check_alignment(plan, NULL, 1, 8, 0, "plan"));
    const sk_cp_plan_header *h = plan;
    if (plan_bytes < sizeof *h || h->magic != SK_CP_PLAN_MAGIC || h->version != SK_CP_PLAN_VERSION)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "plan is not a context-parallel plan of this library (plan_bytes = %zu; "
                        "fill it with sk_cp_plan)",
                        plan_bytes);
    if (h->total_bytes < (int64_t)sizeof *h || (uint64_t)h->total_bytes > plan_bytes)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "plan holds %lld bytes but plan_bytes = %zu (truncated or corrupt)",
                        (long long)h->total_bytes, plan_bytes);
    /* The sections in order, inside the blob: a corrupt plan is refused
     * rather than read out of bounds. */
    const int64_t R = h->ranks;
    const int ok = R >= 1 && R <= SK_CP_MAX_RANKS && h->unit_count >= 0 && h->int_count >= 0 &&
                   h->unit_count <= h->total_bytes && h->int_count <= h->total_bytes &&
                   h->pairs >= (int64_t)sizeof *h &&
                   h->rank_plans >= h->pairs + R * R * (int64_t)sizeof(sk_cp_pair) &&
                   h->units >= h->rank_plans + R * (int64_t)sizeof(sk_cp_rank_plan) &&
                   h->ints >= h->units + h->unit_count * (int64_t)sizeof(sk_cp_unit) &&
                   h->total_bytes >= h->ints + h->int_count * 4 && h->pairs % 8 == 0 &&
                   h->rank_plans % 8 == 0 && h->units % 8 == 0 && h->ints % 8 == 0;
    if (!ok) return sk_error(SK_STATUS_BAD_PARAM_VALUE, "plan is corrupt (its sections)");
    *out = h;
    return SK_STATUS_SUCCESS;
}

/* Units of a pair inside the unit section, each naming a block of src
 * (for the sender's pack), a batch, head and a slot of dst (unpack). */
static int pair_ok(const sk_cp_plan_header *h, int32_t src, int32_t dst) {
    const sk_cp_pair *p = &sk_cp_plan_pairs(h)[(int64_t)src * h->ranks + dst];
    const sk_cp_rank_plan *ranks = sk_cp_plan_ranks(h);
    if (p->units < 0 || p->unit_start < 0 || p->unit_start > h->unit_count - p->units ||
        p->bytes < 0)
        return 0;
    if (src == dst) return p->units == 0;
    const sk_cp_unit *u = sk_cp_plan_units(h) + p->unit_start;
    int64_t bytes = 0;
    for (int64_t i = 0; i < p->units; ++i) {
        if (u[i].batch < 0 || u[i].batch >= h->batch || u[i].head < 0 ||
            u[i].head >= h->heads_kv || u[i].slot < 0 || u[i].slot >= ranks[dst].slots)
            return 0;
        int owned = 0;
        for (int32_t c = 0; c < ranks[src].chunks; ++c) {
            const sk_cp_chunk_plan *cp = &ranks[src].chunk[c];
            owned |= u[i].block >= cp->global_block && u[i].block - cp->global_block < cp->blocks;
        }
        if (!owned) return 0;
        const int64_t t = h->seq - (int64_t)u[i].block * h->block;
        bytes += 2 * (t < h->block ? t : h->block) * h->head_dim * h->elem_bytes;
    }
    return bytes == p->bytes;
}

void sk_cp_chunk_layout(const sk_cp_plan_header *h, const sk_cp_chunk_plan *cp, int64_t keys,
                        int remote, sk_bsr *out) {
    const int32_t *ints = sk_cp_plan_ints(h);
    out->grid.rows = cp->tokens;
    out->grid.cols = keys;
    out->grid.block_rows = out->grid.block_cols = h->block;
    out->grid.batch = h->layout_batch;
    out->grid.heads = h->layout_heads;
    out->nnz = remote ? cp->remote_nnz : cp->local_nnz;
    /* Read only: sk_bsr's arrays are not const. */
    out->row_offsets = (int32_t *)(intptr_t)(ints + (remote ? cp->remote_offsets : cp->local_offsets));
    out->col_indices = (int32_t *)(intptr_t)(ints + (remote ? cp->remote_indices : cp->local_indices));
}

/* Rank r's record: its shard as the descriptor gives it, its chunks'
 * arrays inside the ints section. */
static int rank_ok(const sk_cp_plan_header *h, const sk_cp_desc *d, int64_t nb, int32_t r) {
    int64_t starts[2], lengths[2];
    int32_t n;
    const int64_t tokens = sk_cp_shard_of(d, h->block, nb, r, &n, starts, lengths);
    const sk_cp_rank_plan *rp = &sk_cp_plan_ranks(h)[r];
    const int64_t slices = (int64_t)h->layout_batch * h->layout_heads;
    int ok = rp->tokens == tokens && rp->chunks == n && rp->slots >= 0 &&
             rp->remote_keys >= 0 && rp->remote_keys <= (int64_t)rp->slots * h->block &&
             rp->send_bytes >= 0 && rp->recv_bytes >= 0;
    for (int32_t c = 0; ok && c < n; ++c) {
        const sk_cp_chunk_plan *cp = &rp->chunk[c];
        int64_t rows = 0;
        ok = cp->blocks >= 0 && sk_mul_i64(slices, cp->blocks, &rows) && rows < INT64_MAX;
        rows += 1;
        ok = ok && cp->tokens == lengths[c] && (int64_t)cp->global_block * h->block == starts[c] &&
             cp->blocks == sk_ceil_div_i64(lengths[c], h->block) && cp->q_start >= 0 &&
             cp->q_start <= tokens - cp->tokens && cp->local_keys >= 1 &&
             cp->local_keys <= tokens && cp->local_nnz >= 0 && cp->remote_nnz >= 0 &&
             (rp->remote_keys > 0 || cp->remote_nnz == 0) && cp->local_offsets >= 0 &&
             cp->local_offsets <= h->int_count - rows && cp->remote_offsets >= 0 &&
             cp->remote_offsets <= h->int_count - rows && cp->local_indices >= 0 &&
             cp->local_indices <= h->int_count - cp->local_nnz && cp->remote_indices >= 0 &&
             cp->remote_indices <= h->int_count - cp->remote_nnz;
    }
    return ok;
}

/* Rank r's chunk layouts, validated as the passes will read them. */
static int layouts_ok(const sk_cp_plan_header *h, int32_t r) {
    const sk_cp_rank_plan *rp = &sk_cp_plan_ranks(h)[r];
    for (int32_t c = 0; c < rp->chunks; ++c)
        for (int remote = 0; remote < 2; ++remote) {
            const sk_cp_chunk_plan *cp = &rp->chunk[c];
            const int64_t keys = remote ? rp->remote_keys : cp->local_keys;
            if (keys == 0) continue; /* no remote block: that pass never runs */
            sk_bsr L;
            sk_cp_chunk_layout(h, cp, keys, remote, &L);
            if (sk_layout_check(&L) != SK_STATUS_SUCCESS) return 0;
        }
    return 1;
}

sk_status sk_cp_plan_check(const sk_cp_plan_header *h, const sk_cp_desc *d, int with_layouts) {
    int64_t nb;
    if (h->block != 64 && h->block != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "plan is corrupt (block = %d)", (int)h->block);
    SK_TRY(sk_cp_check_block(d, h->block, &nb)); /* the plan's geometry is d's: cannot fail */
    const int32_t R = h->ranks;
    const sk_cp_pair *pairs = sk_cp_plan_pairs(h);
    const sk_cp_rank_plan *ranks = sk_cp_plan_ranks(h);
    int ok = (h->layout_batch == 1 || h->layout_batch == h->batch) &&
             (h->layout_heads == 1 || h->layout_heads == h->heads_kv ||
              h->layout_heads == h->heads_q),
        bad = -1;
    for (int32_t r = 0; ok && r < R; ++r)
        if (!(ok = rank_ok(h, d, nb, r))) bad = r;
    for (int32_t r = 0; ok && r < R; ++r) {
        int64_t send = 0, recv = 0;
        for (int32_t p = 0; ok && p < R; ++p) {
            ok = pair_ok(h, r, p);
            send += pairs[(int64_t)r * R + p].bytes;
            recv += pairs[(int64_t)p * R + r].bytes;
        }
        ok = ok && send == ranks[r].send_bytes && recv == ranks[r].recv_bytes &&
             (!with_layouts || layouts_ok(h, r));
        if (!ok) bad = r;
    }
    if (!ok)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "plan is corrupt (rank %d's shard, units or layouts)", (int)bad);
    return SK_STATUS_SUCCESS;
}
