/*
 * cp_plan.c - context parallel: the descriptor, the sharding and the plan
 * (sk_cp_desc_init, sk_cp_shard, sk_cp_plan_size, sk_cp_plan,
 * sk_cp_plan_bytes).
 *
 * The plan is made on the host from the global layout, the same on every
 * rank. For each receiving rank r, one sweep over its rows marks the
 * (key block, batch, KV head) units it needs from other ranks: a selected
 * block j owned elsewhere (with causal, only j <= i: a block above the
 * diagonal is wholly masked, since chunks are whole blocks and block_q ==
 * block_k) is needed for every batch and KV head the row's slice covers.
 * The marks deduplicate over rows, query heads and slices, so each unit is
 * sent once. The received blocks get slots in increasing block order
 * (which keeps every row's remote indices sorted and puts the global tail
 * block, if any, last); the units of a pair are listed by block, then
 * batch, then head, the order the sender packs and the receiver unpacks.
 * A second sweep writes each chunk's two local layouts: its own key blocks
 * in shard-local block indices (the local pass) and its received ones in
 * slots (the remote pass).
 *
 * sk_cp_plan_size and sk_cp_plan share one builder: a counting pass, the
 * section offsets, and (plan only) the writing pass.
 */
#include <stdlib.h>
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/cp_internal.h"
#include "core/internal.h"
#include "core/layout.h"

sk_status sk_cp_desc_init(sk_cp_desc *desc, size_t struct_size) {
    SK_ENTER("sk_cp_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_cp_desc), "sk_cp_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->ranks = 1;
    desc->sharding = SK_CP_SHARDING_CONTIGUOUS;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->mask = SK_MASK_NONE;
    desc->reserve_sms = SK_CP_RESERVE_SMS_DEFAULT;
    return SK_STATUS_SUCCESS;
}

const int32_t *sk_cp_desc_starts(const sk_cp_desc *d) {
    return d->struct_size == sizeof(sk_cp_desc) ? d->chunk_starts : NULL;
}

int32_t sk_cp_desc_reserve(const sk_cp_desc *d) {
    return d->struct_size == sizeof(sk_cp_desc) ? d->reserve_sms : SK_CP_RESERVE_SMS_DEFAULT;
}

sk_status sk_cp_check_desc(const sk_cp_desc *d) {
    static const char *const names[6] = {"batch", "seq", "seq", "heads_q", "heads_kv", "head_dim"};
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    if (d->struct_size != SK_CP_DESC_V1_SIZE)
        SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_cp_desc), "desc",
                                         "sk_cp_desc_init"));
    if (d->ranks < 1 || d->ranks > SK_CP_MAX_RANKS)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->ranks = %d must be in [1, %d]",
                        (int)d->ranks, SK_CP_MAX_RANKS);
    if (d->rank < 0 || d->rank >= d->ranks)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->rank = %d must be in [0, ranks = %d)",
                        (int)d->rank, (int)d->ranks);
    if (d->sharding != SK_CP_SHARDING_CONTIGUOUS && d->sharding != SK_CP_SHARDING_ZIGZAG)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->sharding = %d is not an sk_cp_sharding (CONTIGUOUS=1, ZIGZAG=2)",
                        (int)d->sharding);
    const int32_t reserve = sk_cp_desc_reserve(d);
    if (reserve < 0 || reserve > SK_CP_RESERVE_SMS_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->reserve_sms = %d must be in [0, %d]",
                        (int)reserve, SK_CP_RESERVE_SMS_MAX);
    const int64_t sizes[6] = {d->batch, d->seq, d->seq, d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(sk_check_attention_shape_named(d->backend, d->dtype, sizes, names));
    return sk_attention_check_scale_mask(d->scale, d->mask);
}

sk_status sk_cp_check_block(const sk_cp_desc *d, int32_t block, int64_t *blocks) {
    if (block != 64 && block != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "block = %d must be 64 or 128", (int)block);
    const int64_t nb = sk_ceil_div_i64(d->seq, block);
    const int32_t chunks = sk_cp_chunk_count(d->ranks, d->sharding);
    if (nb < chunks)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "desc->seq = %lld has %lld blocks of %d tokens, fewer than the %d chunks "
                        "of %d ranks (%s sharding): every chunk needs a block",
                        (long long)d->seq, (long long)nb, (int)block, (int)chunks, (int)d->ranks,
                        d->sharding == SK_CP_SHARDING_ZIGZAG ? "zigzag" : "contiguous");
    if (nb > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "desc->seq = %lld has %lld blocks of %d tokens, more than INT32_MAX",
                        (long long)d->seq, (long long)nb, (int)block);
    SK_TRY(sk_cp_check_starts(sk_cp_desc_starts(d), chunks, nb, "desc->chunk_starts"));
    *blocks = nb;
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_check_starts(const int32_t *starts, int32_t chunks, int64_t nb, const char *name) {
    if (starts == NULL) return SK_STATUS_SUCCESS;
    if (starts[0] != 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "%s[0] = %d must be 0 (chunk 0 starts the sequence)", name, (int)starts[0]);
    for (int32_t c = 1; c <= chunks; ++c)
        if (starts[c] <= starts[c - 1] || starts[c] > nb)
            return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                            "%s[%d] = %d must be in (%s[%d] = %d, %lld]: chunks of whole blocks, "
                            "each non-empty, inside the %lld blocks",
                            name, (int)c, (int)starts[c], name, (int)(c - 1), (int)starts[c - 1],
                            (long long)nb, (long long)nb);
    if (starts[chunks] != nb)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "%s[%d] = %d must be nb = %lld, the blocks of desc->seq (the last chunk "
                        "ends the sequence; blocks of the layout's size)",
                        name, (int)chunks, (int)starts[chunks], (long long)nb);
    return SK_STATUS_SUCCESS;
}

int64_t sk_cp_first_block(const sk_cp_desc *d, int64_t nb, int32_t c) {
    const int32_t *starts = sk_cp_desc_starts(d);
    return starts != NULL ? starts[c]
                          : sk_cp_chunk_start(nb, sk_cp_chunk_count(d->ranks, d->sharding), c);
}

int64_t sk_cp_shard_of(const sk_cp_desc *d, int32_t block, int64_t nb, int32_t r, int32_t *count,
                       int64_t starts[2], int64_t lengths[2]) {
    int32_t ch[2];
    const int32_t n = sk_cp_rank_chunks(d->ranks, d->sharding, r, ch);
    int64_t total = 0;
    for (int32_t c = 0; c < 2; ++c) {
        starts[c] = lengths[c] = 0;
        if (c >= n) continue;
        const int64_t t0 = sk_cp_first_block(d, nb, ch[c]) * block;
        int64_t t1 = sk_cp_first_block(d, nb, ch[c] + 1) * block;
        if (t1 > d->seq) t1 = d->seq;
        starts[c] = t0;
        lengths[c] = t1 - t0;
        total += t1 - t0;
    }
    *count = n;
    return total;
}

sk_status sk_cp_shard(const sk_cp_desc *desc, int32_t rank, int32_t block, int64_t *tokens,
                      int32_t *chunks, int64_t starts[2], int64_t lengths[2]) {
    SK_ENTER("sk_cp_shard");
    SK_TRY(sk_cp_check_desc(desc));
    SK_CHECK_NOT_NULL(tokens);
    if (rank < 0 || rank >= desc->ranks)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "rank = %d must be in [0, desc->ranks = %d)",
                        (int)rank, (int)desc->ranks);
    int64_t nb;
    SK_TRY(sk_cp_check_block(desc, block, &nb));
    int32_t n;
    int64_t s[2], l[2];
    *tokens = sk_cp_shard_of(desc, block, nb, rank, &n, s, l);
    if (chunks != NULL) *chunks = n;
    if (starts != NULL) memcpy(starts, s, sizeof s);
    if (lengths != NULL) memcpy(lengths, l, sizeof l);
    return SK_STATUS_SUCCESS;
}

/* ---- the builder ------------------------------------------------------- */

typedef struct cp_geom {
    const sk_cp_desc *d;
    const sk_bsr *layout;
    int32_t ranks, chunks, block, causal, lb, lh, group, esize;
    int64_t nb, slices, bh; /* blocks, layout slices, B x Hkv */
} cp_geom;

typedef struct cp_scratch {
    int32_t *owner;  /* [nb] rank of each block */
    int32_t *lblock; /* [nb] its block index in the owner's shard */
    int32_t *slot;   /* [nb] slot in the current receiver's buffer, or -1 */
    uint8_t *need;   /* [nb * B * Hkv] the current receiver's units */
    sk_cp_pair *pairs;
    sk_cp_rank_plan *ranks;
} cp_scratch;

static int64_t block_tokens(const cp_geom *g, int64_t j) {
    const int64_t t = g->d->seq - j * g->block;
    return t < g->block ? t : g->block;
}

/* Mark the units of slice s's key block j: every batch and KV head the
 * slice covers. */
static void mark(const cp_geom *g, uint8_t *need, int64_t s, int64_t j) {
    const int64_t sb = s / g->lh, sh = s % g->lh, hkv_n = g->d->heads_kv;
    const int64_t b0 = g->lb == 1 ? 0 : sb, b1 = g->lb == 1 ? g->d->batch : sb + 1;
    int64_t h0, h1;
    if (g->lh == 1) {
        h0 = 0;
        h1 = hkv_n;
    } else if (g->lh == g->d->heads_q) {
        h0 = sh / g->group;
        h1 = h0 + 1;
    } else {
        h0 = sh;
        h1 = sh + 1;
    }
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t h = h0; h < h1; ++h) need[j * g->bh + b * hkv_n + h] = 1;
}

/* One sweep over rank r's rows. Counting (ints == NULL): fills rp's chunk
 * counts and marks the needs. Writing: the two local layouts of each chunk
 * into ints (slots already assigned). */
static void sweep_rows(const cp_geom *g, const cp_scratch *w, int32_t r, sk_cp_rank_plan *rp,
                       int32_t *ints) {
    const int32_t *off = g->layout->row_offsets, *col = g->layout->col_indices;
    for (int32_t c = 0; c < rp->chunks; ++c) {
        sk_cp_chunk_plan *cp = &rp->chunk[c];
        int64_t nl = 0, nr = 0;
        int32_t *lo = ints ? ints + cp->local_offsets : NULL;
        int32_t *li = ints ? ints + cp->local_indices : NULL;
        int32_t *ro = ints ? ints + cp->remote_offsets : NULL;
        int32_t *ri = ints ? ints + cp->remote_indices : NULL;
        for (int64_t s = 0; s < g->slices; ++s)
            for (int32_t il = 0; il < cp->blocks; ++il) {
                const int64_t i = (int64_t)cp->global_block + il, row = s * g->nb + i;
                if (ints) {
                    lo[s * cp->blocks + il] = (int32_t)nl;
                    ro[s * cp->blocks + il] = (int32_t)nr;
                }
                for (int32_t e = off[row]; e < off[row + 1]; ++e) {
                    const int32_t j = col[e];
                    if (g->causal && j > i) continue;
                    if (w->owner[j] == r) {
                        if (ints) li[nl] = w->lblock[j];
                        ++nl;
                    } else {
                        if (ints)
                            ri[nr] = w->slot[j];
                        else
                            mark(g, w->need, s, j);
                        ++nr;
                    }
                }
            }
        if (ints) {
            lo[g->slices * cp->blocks] = (int32_t)nl;
            ro[g->slices * cp->blocks] = (int32_t)nr;
        }
        cp->local_nnz = (int32_t)nl;
        cp->remote_nnz = (int32_t)nr;
    }
}

/* Receiver r: needs, slots, pair counts (units == NULL) or the units. */
static void plan_receiver(const cp_geom *g, cp_scratch *w, int32_t r, sk_cp_unit *units,
                          int32_t *ints) {
    sk_cp_rank_plan *rp = &w->ranks[r];
    memset(w->need, 0, (size_t)(g->nb * g->bh));
    sweep_rows(g, w, r, rp, NULL);
    rp->slots = 0;
    rp->remote_keys = 0;
    for (int64_t j = 0; j < g->nb; ++j) {
        w->slot[j] = -1;
        if (w->owner[j] == r) continue;
        for (int64_t u = 0; u < g->bh; ++u)
            if (w->need[j * g->bh + u]) {
                w->slot[j] = rp->slots++;
                rp->remote_keys += block_tokens(g, j);
                break;
            }
    }
    for (int32_t src = 0; src < g->ranks; ++src) {
        if (src == r) continue;
        sk_cp_pair *p = &w->pairs[(int64_t)src * g->ranks + r];
        int64_t n = 0, bytes = 0;
        for (int64_t j = 0; j < g->nb; ++j) {
            if (w->owner[j] != src || w->slot[j] < 0) continue;
            for (int64_t u = 0; u < g->bh; ++u) {
                if (!w->need[j * g->bh + u]) continue;
                if (units) {
                    sk_cp_unit *x = &units[p->unit_start + n];
                    x->block = (int32_t)j;
                    x->batch = (int32_t)(u / g->d->heads_kv);
                    x->head = (int32_t)(u % g->d->heads_kv);
                    x->slot = w->slot[j];
                }
                ++n;
                bytes += 2 * block_tokens(g, j) * g->d->head_dim * g->esize;
            }
        }
        p->units = n;
        p->bytes = bytes;
    }
    if (ints) sweep_rows(g, w, r, rp, ints);
}

static int64_t align8(int64_t x) {
    return (x + 7) / 8 * 8;
}

/* Rank plans' shard fields, then the counting pass and the offsets.
 * Returns the plan's total bytes. */
static int64_t count_pass(const cp_geom *g, cp_scratch *w, sk_cp_plan_header *h) {
    for (int32_t r = 0; r < g->ranks; ++r) {
        sk_cp_rank_plan *rp = &w->ranks[r];
        int32_t ch[2], n;
        int64_t starts[2], lengths[2];
        memset(rp, 0, sizeof *rp);
        rp->tokens = sk_cp_shard_of(g->d, g->block, g->nb, r, &n, starts, lengths);
        rp->chunks = sk_cp_rank_chunks(g->ranks, g->d->sharding, r, ch);
        int64_t q = 0;
        for (int32_t c = 0; c < n; ++c) {
            sk_cp_chunk_plan *cp = &rp->chunk[c];
            cp->q_start = q;
            cp->tokens = lengths[c];
            cp->global_block = (int32_t)(starts[c] / g->block);
            cp->blocks = (int32_t)sk_ceil_div_i64(lengths[c], g->block);
            for (int32_t b = 0; b < cp->blocks; ++b) {
                w->owner[cp->global_block + b] = r;
                w->lblock[cp->global_block + b] = (int32_t)(q / g->block) + b;
            }
            q += lengths[c];
        }
        for (int32_t c = 0; c < n; ++c)
            rp->chunk[c].local_keys =
                g->causal ? rp->chunk[c].q_start + rp->chunk[c].tokens : rp->tokens;
    }
    int64_t units = 0, ints = 0;
    for (int32_t r = 0; r < g->ranks; ++r) {
        plan_receiver(g, w, r, NULL, NULL);
        for (int32_t src = 0; src < g->ranks; ++src) {
            sk_cp_pair *p = &w->pairs[(int64_t)src * g->ranks + r];
            p->unit_start = units;
            units += p->units;
            w->ranks[src].send_bytes += p->bytes;
            w->ranks[r].recv_bytes += p->bytes;
        }
        sk_cp_rank_plan *rp = &w->ranks[r];
        for (int32_t c = 0; c < rp->chunks; ++c) {
            sk_cp_chunk_plan *cp = &rp->chunk[c];
            const int64_t rows = g->slices * cp->blocks + 1;
            cp->local_offsets = ints;
            cp->local_indices = ints + rows;
            cp->remote_offsets = cp->local_indices + cp->local_nnz;
            cp->remote_indices = cp->remote_offsets + rows;
            ints = cp->remote_indices + cp->remote_nnz;
        }
    }
    memset(h, 0, sizeof *h);
    h->magic = SK_CP_PLAN_MAGIC;
    h->version = SK_CP_PLAN_VERSION;
    h->ranks = g->ranks;
    h->sharding = (int32_t)g->d->sharding;
    h->block = g->block;
    h->causal = g->causal;
    h->layout_batch = g->lb;
    h->layout_heads = g->lh;
    h->elem_bytes = g->esize;
    h->batch = g->d->batch;
    h->seq = g->d->seq;
    h->heads_q = g->d->heads_q;
    h->heads_kv = g->d->heads_kv;
    h->head_dim = g->d->head_dim;
    h->pairs = align8((int64_t)sizeof *h);
    h->rank_plans = align8(h->pairs + (int64_t)g->ranks * g->ranks * (int64_t)sizeof(sk_cp_pair));
    h->units = align8(h->rank_plans + g->ranks * (int64_t)sizeof(sk_cp_rank_plan));
    h->ints = align8(h->units + units * (int64_t)sizeof(sk_cp_unit));
    h->unit_count = units;
    h->int_count = ints;
    h->total_bytes = align8(h->ints + ints * 4);
    return h->total_bytes;
}

/* The descriptor, the layout (validated) against it, the geometry. */
static sk_status check_inputs(const sk_cp_desc *d, const sk_bsr *layout, cp_geom *g) {
    SK_TRY(sk_cp_check_desc(d));
    SK_CHECK_NOT_NULL(layout);
    SK_TRY(sk_layout_check(layout));
    const sk_grid *gr = &layout->grid;
    if (gr->rows != d->seq || gr->cols != d->seq)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid is %lld x %lld tokens; the global self-attention needs "
                        "desc->seq x desc->seq = %lld x %lld",
                        (long long)gr->rows, (long long)gr->cols, (long long)d->seq,
                        (long long)d->seq);
    if (gr->block_rows != gr->block_cols)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "layout blocks %d x %d: context parallel shards whole blocks of one "
                        "size (block_rows == block_cols)",
                        (int)gr->block_rows, (int)gr->block_cols);
    if (gr->batch != 1 && gr->batch != d->batch)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid batch = %d must be 1 or desc->batch = %lld", (int)gr->batch,
                        (long long)d->batch);
    if (gr->heads != 1 && gr->heads != d->heads_kv && gr->heads != d->heads_q)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid heads = %d must be 1, heads_kv = %lld or heads_q = %lld",
                        (int)gr->heads, (long long)d->heads_kv, (long long)d->heads_q);
    memset(g, 0, sizeof *g);
    g->d = d;
    g->layout = layout;
    SK_TRY(sk_cp_check_block(d, gr->block_rows, &g->nb));
    g->ranks = d->ranks;
    g->chunks = sk_cp_chunk_count(d->ranks, d->sharding);
    g->block = gr->block_rows;
    g->causal = d->mask == SK_MASK_CAUSAL;
    g->lb = gr->batch;
    g->lh = gr->heads;
    g->group = (int32_t)(d->heads_q / d->heads_kv);
    g->esize = (int32_t)sk_dtype_size(d->dtype);
    g->slices = (int64_t)gr->batch * gr->heads;
    g->bh = d->batch * d->heads_kv;
    int64_t need_bytes;
    if (!sk_mul_i64(g->nb, g->bh, &need_bytes) || need_bytes > (int64_t)(SIZE_MAX / 2))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "blocks x batch x heads_kv = %lld x %lld is too large for the plan's "
                        "host scratch",
                        (long long)g->nb, (long long)g->bh);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_check_layout(const sk_cp_desc *d, const sk_bsr *layout, int32_t *block,
                             int64_t *nb) {
    cp_geom g;
    SK_TRY(check_inputs(d, layout, &g));
    *block = g.block;
    *nb = g.nb;
    return SK_STATUS_SUCCESS;
}

static void scratch_free(cp_scratch *w) {
    free(w->owner);
    free(w->lblock);
    free(w->slot);
    free(w->need);
    free(w->pairs);
    free(w->ranks);
}

static sk_status scratch_alloc(const cp_geom *g, cp_scratch *w) {
    memset(w, 0, sizeof *w);
    w->owner = malloc((size_t)g->nb * sizeof(int32_t));
    w->lblock = malloc((size_t)g->nb * sizeof(int32_t));
    w->slot = malloc((size_t)g->nb * sizeof(int32_t));
    w->need = malloc((size_t)(g->nb * g->bh));
    w->pairs = calloc((size_t)g->ranks * (size_t)g->ranks, sizeof(sk_cp_pair));
    w->ranks = calloc((size_t)g->ranks, sizeof(sk_cp_rank_plan));
    if (!w->owner || !w->lblock || !w->slot || !w->need || !w->pairs || !w->ranks) {
        scratch_free(w);
        return sk_error(SK_STATUS_ALLOC_FAILED, "host scratch of the plan (%lld blocks)",
                        (long long)g->nb);
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_plan_size(const sk_cp_desc *desc, const sk_bsr *layout, size_t *plan_bytes) {
    SK_ENTER("sk_cp_plan_size");
    cp_geom g;
    SK_TRY(check_inputs(desc, layout, &g));
    SK_CHECK_NOT_NULL(plan_bytes);
    cp_scratch w;
    SK_TRY(scratch_alloc(&g, &w));
    sk_cp_plan_header h;
    const int64_t total = count_pass(&g, &w, &h);
    scratch_free(&w);
    *plan_bytes = (size_t)total;
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_plan(const sk_cp_desc *desc, const sk_bsr *layout, void *plan, size_t plan_bytes) {
    SK_ENTER("sk_cp_plan");
    cp_geom g;
    SK_TRY(check_inputs(desc, layout, &g));
    SK_CHECK_NOT_NULL(plan);
    SK_TRY(sk_check_alignment(plan, NULL, 1, 8, 0, "plan"));
    cp_scratch w;
    SK_TRY(scratch_alloc(&g, &w));
    sk_cp_plan_header h;
    const int64_t total = count_pass(&g, &w, &h);
    if (plan_bytes < (size_t)total) {
        scratch_free(&w);
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "plan_bytes = %zu is below the %lld bytes sk_cp_plan_size gives",
                        plan_bytes, (long long)total);
    }
    char *base = plan;
    memset(base, 0, (size_t)total);
    memcpy(base, &h, sizeof h);
    sk_cp_unit *units = (sk_cp_unit *)(void *)(base + h.units);
    int32_t *ints = (int32_t *)(void *)(base + h.ints);
    for (int32_t r = 0; r < g.ranks; ++r) plan_receiver(&g, &w, r, units, ints);
    memcpy(base + h.pairs, w.pairs, (size_t)g.ranks * (size_t)g.ranks * sizeof(sk_cp_pair));
    memcpy(base + h.rank_plans, w.ranks, (size_t)g.ranks * sizeof(sk_cp_rank_plan));
    scratch_free(&w);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_plan_bytes(const void *plan, size_t plan_bytes, int32_t src, int32_t dst,
                           int64_t *bytes, int64_t *units) {
    SK_ENTER("sk_cp_plan_bytes");
    const sk_cp_plan_header *h;
    SK_TRY(sk_cp_plan_open(plan, plan_bytes, &h));
    if (src < 0 || src >= h->ranks)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "src = %d must be in [0, ranks = %d)", (int)src,
                        (int)h->ranks);
    if (dst < 0 || dst >= h->ranks)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "dst = %d must be in [0, ranks = %d)", (int)dst,
                        (int)h->ranks);
    const sk_cp_pair *p = &sk_cp_plan_pairs(h)[(int64_t)src * h->ranks + dst];
    if (bytes != NULL) *bytes = p->bytes;
    if (units != NULL) *units = p->units;
    return SK_STATUS_SUCCESS;
}
