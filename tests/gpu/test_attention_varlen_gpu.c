/*
 * test_attention_varlen_gpu.c - the CUDA varlen and paged-KV forwards
 * (src/cuda/attention/varlen.cu) on seeded cases from
 * tests/common/varlen_case.h, each compared with the fp64 reference on the
 * CPU (vc_compare_reference: every query row of every sequence, the
 * tolerance rule, O's padding untouched, LSE untouched when not asked for)
 * through vg_check (varlen_gpu.h).
 *
 * Every run starts from NaN-poisoned O and LSE and a garbage workspace; K/V
 * hold NaN in every key block no tile visits (varlen_case.h, kernel_rules:
 * a visited block's masked keys are read, with P = 0), which in the
 * packed tensors includes the first keys of the sequence after a tail; the
 * paged caches add NaN in unused pages and in slots past each sequence's
 * length, shuffled page order, pages shared by two sequences (a prefix) and
 * garbage table entries past each row (-1, num_pages + j, INT32_MIN, a NaN
 * page). Each case runs twice and must agree bit for bit. Graphs, re-plans
 * and contract-breaking device arrays: test_attention_varlen_graph_gpu.c.
 *
 * With --backend sm90 the Hopper kernel (varlen_sm90.h) runs the cases it
 * covers (blocks 128 x 128, D 64 / 128, 16-byte strides) and must decline
 * the others (blocks of 64) with SK_STATUS_NOT_SUPPORTED, writing nothing
 * (vg_declines); with --backend cuda on an H100 it runs the covered ones,
 * the portable kernel the rest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/varlen_case.h"
#include "gpu/gpu_util.h"
#include "gpu/varlen_gpu.h"

/* ---------------------------------------------------------------------------
 * Cases
 * ------------------------------------------------------------------------- */

/* A random case the CUDA kernels take: F16 / BF16, D 64 / 128, aligned
 * padding; a sinks + window pattern now and then. */
static vc_case vg_random_case(tu_rng *rng, int32_t max_batch, int32_t max_q, int32_t max_k) {
    vc_case c = vc_random_case(rng, max_batch, max_q, max_k);
    c.dtype = tu_rng_range(rng, 0, 1) ? SK_DTYPE_BF16 : SK_DTYPE_F16;
    c.head_dim = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c.padded = c.padded ? 2 : 0;
    c.kernel_rules = 1;
    if (tu_rng_range(rng, 0, 3) == 0) {
        c.window_blocks = (int32_t)tu_rng_range(rng, 1, 3);
        c.sink_blocks = (int32_t)tu_rng_range(rng, 0, 1);
    }
    return c;
}

/* Random varlen cases of one seed each. */
static void vg_random_varlen(int count, uint64_t salt, int32_t max_batch, int32_t max_q,
                             int32_t max_k) {
    for (int i = 0; i < count; ++i) {
        const uint64_t seed = tu_base_seed() ^ (salt + (uint64_t)i * 0x9e3779b97f4a7c15ull);
        tu_rng rng;
        tu_rng_seed(&rng, seed);
        const vc_case c = vg_random_case(&rng, max_batch, max_q, max_k);
        char label[512];
        vc_label(&c, seed, label, sizeof label);
        vc_data x;
        if (!vc_make(&c, &rng, &x)) {
            CHECK(0, "%s out of memory", label);
        } else {
            vg_check(&c, &x, NULL, label);
        }
        vc_data_free(&x);
    }
}

SK_TEST(gpu_varlen_random) {
    const int before = vg_cases;
    vg_random_varlen(gt_opt.quick ? 6 : 90, 0x7661726c656e01ull, 8, 400, 600);
    vg_report("gpu_varlen_random", before);
}

/* Fewer, longer sequences: several blocks each, the tile order's long rows. */
SK_TEST(gpu_varlen_random_long) {
    const int before = vg_cases;
    vg_random_varlen(gt_opt.quick ? 2 : 20, 0x7661726c656e02ull, 4, 1500, 2500);
    vg_report("gpu_varlen_random_long", before);
}

/* Random paged cases: every page size in turn, shared prefixes, padded
 * caches, chunked prefill (len_q < len_k, causal) now and then. */
SK_TEST(gpu_paged_random) {
    const int before = vg_cases;
    static const int32_t sizes[4] = {16, 32, 64, 128};
    const int count = gt_opt.quick ? 8 : 64;
    for (int i = 0; i < count; ++i) {
        const uint64_t seed = tu_base_seed() ^ (0x70616765640001ull + (uint64_t)i * 0x2545f491ull);
        tu_rng rng;
        tu_rng_seed(&rng, seed);
        vc_case c = vg_random_case(&rng, 6, 300, 700);
        if (tu_rng_range(&rng, 0, 2) == 0) { /* chunked prefill: new tokens over a context */
            c.causal = 1;
            for (int32_t b = 0; b < c.batch; ++b)
                if (c.len_q[b] > c.len_k[b]) c.len_q[b] = c.len_k[b];
            if (c.len_q[0] == 0 && c.len_k[0] > 0) c.len_q[0] = 1;
        }
        int32_t tq = 0;
        for (int32_t b = 0; b < c.batch; ++b) tq += c.len_q[b];
        if (tq == 0) c.len_q[0] = c.len_k[0] = 1;
        const int32_t ps = sizes[i % 4];
        const int share = (int)tu_rng_range(&rng, 0, 1), padded = (int)tu_rng_range(&rng, 0, 1);
        char label[600], base[512];
        vc_label(&c, seed, base, sizeof base);
        snprintf(label, sizeof label, "%s paged ps=%d share=%d padded=%d", base, (int)ps, share,
                 padded);
        vc_data x;
        vg_paged pg;
        memset(&pg, 0, sizeof pg);
        if (!vc_make(&c, &rng, &x) || !vg_paged_make(&c, &x, ps, share, padded, &rng, &pg))
            CHECK(0, "%s out of memory", label);
        else
            vg_check(&c, &x, &pg, label);
        vg_paged_free(&pg);
        vc_data_free(&x);
    }
    vg_report("gpu_paged_random", before);
}

/* Hand-picked lengths: empty sequences, one token, no keys, len_q > len_k
 * under causal (rows before len_q - len_k empty), exact blocks, tails. */
SK_TEST(gpu_varlen_edges) {
    const int before = vg_cases;
    static const int32_t lq[][6] = {{1, 0, 0, 1, 0, 1},     {0, 64, 0, 128, 1, 0},
                                    {300, 5, 0, 0, 200, 1}, {129, 1, 64, 63, 65, 127},
                                    {700, 0, 0, 0, 0, 0},   {1, 1, 1, 1, 1, 1}};
    static const int32_t lk[][6] = {{1, 5, 0, 0, 300, 1},   {10, 64, 0, 1, 1000, 7},
                                    {100, 500, 3, 0, 0, 1}, {129, 700, 1, 63, 65, 128},
                                    {300, 0, 0, 0, 0, 1},   {1, 64, 65, 128, 129, 1000}};
    for (int i = 0; i < 6; ++i)
        for (int v = 0; v < 4; ++v) {
            vc_case c = vc_base_case(v & 1 ? SK_DTYPE_BF16 : SK_DTYPE_F16, 6, lq[i], lk[i]);
            c.kernel_rules = 1;
            c.heads_q = v < 2 ? 4 : 8;
            c.heads_kv = v < 2 ? 1 : 2;
            c.head_dim = v & 2 ? 128 : 64;
            c.bq = v & 1 ? 128 : 64;
            c.bk = v == 1 || v == 2 ? 128 : 64;
            c.causal = i % 2 == 0 || v == 3;
            c.layout_heads = (int32_t)(v == 0 ? 1 : v == 1 ? c.heads_kv : c.heads_q);
            c.density = v == 2 ? 0.5 : 1.0;
            c.extra_rows = v;
            c.call = (vc_call)(v % 3);
            vg_blocks_for_backend(&c); /* --backend sm90: all at 128, the Hopper kernel's */
            const uint64_t seed = tu_base_seed() ^ (uint64_t)(i * 16 + v);
            tu_rng rng;
            tu_rng_seed(&rng, seed);
            char label[512];
            vc_label(&c, seed, label, sizeof label);
            vc_data x;
            if (!vc_make(&c, &rng, &x))
                CHECK(0, "%s out of memory", label);
            else
                vg_check(&c, &x, NULL, label);
            vc_data_free(&x);
        }
    vg_report("gpu_varlen_edges", before);
}

/* Chunked prefill through the paged form: a few new tokens per sequence
 * over a long cached context, sinks + window, every page size. */
SK_TEST(gpu_paged_chunked_prefill) {
    const int before = vg_cases;
    static const int32_t sizes[4] = {16, 32, 64, 128};
    const int32_t lq[4] = {200, 1, 64, 130}, lk[4] = {1500, 900, 64, 2000};
    for (int i = 0; i < 4; ++i) {
        vc_case c = vc_base_case(i & 1 ? SK_DTYPE_BF16 : SK_DTYPE_F16, 4, lq, lk);
        c.kernel_rules = 1;
        c.heads_q = 8;
        c.heads_kv = 2;
        c.head_dim = i < 2 ? 128 : 64;
        c.bq = 64;
        c.bk = i & 1 ? 128 : 64;
        c.causal = 1;
        c.layout_heads = 2;
        c.window_blocks = 4;
        c.sink_blocks = 1;
        c.call = VC_PLAN_RUN;
        vg_blocks_for_backend(&c);
        const uint64_t seed = tu_base_seed() ^ (0x6368756e6bull + (uint64_t)i);
        tu_rng rng;
        tu_rng_seed(&rng, seed);
        char label[600], base[512];
        vc_label(&c, seed, base, sizeof base);
        snprintf(label, sizeof label, "%s paged ps=%d", base, (int)sizes[i]);
        vc_data x;
        vg_paged pg;
        memset(&pg, 0, sizeof pg);
        if (!vc_make(&c, &rng, &x) || !vg_paged_make(&c, &x, sizes[i], 1, i & 1, &rng, &pg))
            CHECK(0, "%s out of memory", label);
        else
            vg_check(&c, &x, &pg, label);
        vg_paged_free(&pg);
        vc_data_free(&x);
    }
    vg_report("gpu_paged_chunked_prefill", before);
}
