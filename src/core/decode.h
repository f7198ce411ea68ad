/*
 * decode.h - the decode call's shared pieces (sparsek.h "Decode"): its
 * limits, the decode layout's checks (layout_decode.c), the descriptor
 * check and the split-count rule (decode.c), which the CUDA backend
 * (src/cuda/decode/) uses to size its workspace and launch, so that host
 * and device agree on one number. No function here calls SK_ENTER.
 */
#ifndef SK_CORE_DECODE_H
#define SK_CORE_DECODE_H

#include <stdint.h>

#include "core/problem.h"
#include "sparsek.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SK_DECODE_MAX_Q_LEN = 16,  /* query tokens per sequence */
    SK_DECODE_MAX_SPLITS = 128, /* split-KV partials per (sequence, KV head) */
    SK_DECODE_DENSE_BLOCK = 64, /* the CPU reference's key blocks for a NULL layout */
    /* The split rule's fallback when the device cannot be asked (132 SMs,
     * two CTAs each: an H100 SXM), the fewest keys worth a split of their
     * own, and (rule 2) the fewest keys a dense row's split must keep for
     * the rule to fill every CTA slot rather than one CTA per SM.
     * docs/perf/decode.md, "The per-call fixed cost". */
    SK_DECODE_TARGET_CTAS = 264,
    SK_DECODE_FALLBACK_SMS = 132,
    SK_DECODE_MIN_SPLIT_KEYS = 256,
    SK_DECODE_FILL_SPLIT_KEYS = 2048
};

/* The descriptor alone ("desc->..." in messages): struct size, backend,
 * dtype, sizes, q_len, pages, scale, mask, num_splits. */
sk_status sk_decode_check_desc(const sk_decode_desc *d);

/* A decode layout's grid against the call (B, Hkv, q_len, max_seqlen_k);
 * *col_blocks = ceil(max_seqlen_k / block_k). Neither nnz nor the arrays
 * are looked at: sk_attention_layout_slices (the entry points) and
 * sk_layout_check_arrays (the validation) check those. */
sk_status sk_decode_layout_geometry(const sk_bsr *layout, int64_t batch, int64_t heads_kv,
                                    int64_t q_len, int64_t max_seqlen_k, int32_t *col_blocks);
/* A host decode layout that passed sk_decode_layout_geometry: offsets,
 * count, sorted unique indices in [0, col_blocks), and, with seq_lens_k
 * (host, checked) not NULL, every index of sequence b below
 * ceil(len_k(b) / block_k). */
sk_status sk_decode_layout_content(const sk_bsr *layout, int32_t col_blocks,
                                   const int32_t *seq_lens_k);

/* The split count of a checked problem: p->num_splits when set, else
 * enough (sequence, KV head, row group) CTAs for target_ctas (the CTAs the
 * device runs at once: sms x CTAs per SM); rule 2 (the default), for a
 * dense row whose splits would then hold fewer than
 * SK_DECODE_FILL_SPLIT_KEYS keys, enough for one CTA per SM instead; then
 * no split shorter than SK_DECODE_MIN_SPLIT_KEYS of the selected keys a
 * row can have (from the layout's geometry: min(nnz / rows, col_blocks)
 * blocks), at most SK_DECODE_MAX_SPLITS. row_groups is the CUDA kernel's
 * CTAs per (sequence, KV head) over the query rows. */
int32_t sk_decode_split_count(const sk_decode_problem *p, int32_t row_groups, int64_t target_ctas,
                              int64_t sms);

/* The benchmark and test switch of the split rule (process-wide; set it
 * between calls, not while another thread plans or runs a decode): 1 or
 * 2, default 2 (see sk_decode_split_count). The rule sets the split count,
 * hence the workspace size: plan again, with a workspace of the new size,
 * after changing it. */
void sk_decode_set_split_rule(int rule);
int sk_decode_get_split_rule(void);

#ifdef __cplusplus
}
#endif

#endif /* SK_CORE_DECODE_H */
