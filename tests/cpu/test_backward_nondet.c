/*
 * test_backward_nondet.c - bwd->deterministic = 0 on the host side: the
 * CUDA workspace grows by exactly the fp32 dQ accumulator of the fused
 * Hopper pass (B * Hq * ceil(Sq / 64) * 64 * D floats, 256-byte aligned)
 * and not at all for deterministic = 1; the CPU backend needs none in
 * either mode; bad arguments get the same status in both modes. (The GPU
 * results of the mode: tests/gpu/test_attention_backward_nondet_gpu.c.)
 */
#include <stdint.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

/* The workspace size of one mode; the status. */
static sk_status ws_size(const sk_attention_desc *d, int deterministic, const sk_bsr *layout,
                         size_t *bytes) {
    sk_attention_backward_desc bwd;
    if (sk_attention_backward_desc_init(&bwd, sizeof bwd) != SK_STATUS_SUCCESS)
        return SK_STATUS_INTERNAL_ERROR;
    bwd.deterministic = deterministic;
    *bytes = 777;
    return sk_attention_backward_workspace_size(d, &bwd, layout, bytes);
}

SK_TEST(backward_nondet_workspace_sizes) {
    const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
    static const int64_t shapes[3][4] = {/* Sq, Sk, D, batch */
                                         {100, 130, 64, 2},
                                         {64, 64, 128, 1},
                                         {129, 300, 128, 3}};
    static const sk_backend backends[4] = {SK_BACKEND_CPU, SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    for (int si = 0; si < 3; ++si) {
        const int64_t sq = shapes[si][0], sk = shapes[si][1], d = shapes[si][2],
                      batch = shapes[si][3];
        const int32_t rb = (int32_t)((sq + 63) / 64), cb = (int32_t)((sk + 63) / 64);
        uint8_t mask[2 * 3 * 5];
        memset(mask, 1, sizeof mask);
        sk_bsr layout;
        const sk_grid grid = tu_grid(sq, sk, 64, 64, 1, 2);
        REQUIRE(rb * cb <= 15 && nr_bsr_from_mask(&layout, &grid, mask) == 0, "layout");
        sk_attention_desc desc;
        REQUIRE(sk_attention_desc_init(&desc, sizeof desc) == SK_STATUS_SUCCESS, "desc init");
        desc.dtype = SK_DTYPE_BF16;
        desc.batch = batch;
        desc.seq_q = sq;
        desc.seq_k = sk;
        desc.heads_q = 8;
        desc.heads_kv = 2;
        desc.head_dim = d;
        const size_t acc = (size_t)(batch * 8 * rb * 64 * d * 4);
        const size_t want = (acc + 255) / 256 * 256;
        for (int bi = 0; bi < 4; ++bi) {
            desc.backend = backends[bi];
            size_t det = 0, nondet = 0;
            const sk_status s1 = ws_size(&desc, 1, &layout, &det);
            const sk_status s0 = ws_size(&desc, 0, &layout, &nondet);
            if (bi == 0) {
                CHECK(s1 == SK_STATUS_SUCCESS && s0 == SK_STATUS_SUCCESS && det == 0 &&
                          nondet == 0,
                      "CPU: %s %zu / %s %zu bytes, want 0 in both modes", sk_status_name(s1),
                      det, sk_status_name(s0), nondet);
            } else if (!has_cuda) {
                CHECK(s1 == SK_STATUS_NOT_SUPPORTED_BACKEND && s0 == s1,
                      "no CUDA: %s / %s", sk_status_name(s1), sk_status_name(s0));
            } else {
                CHECK(s1 == SK_STATUS_SUCCESS && s0 == SK_STATUS_SUCCESS,
                      "backend %d: %s / %s (%s)", (int)backends[bi], sk_status_name(s1),
                      sk_status_name(s0), sk_last_error());
                CHECK(det > 0 && nondet == det + want,
                      "backend %d, Sq %lld D %lld: deterministic %zu, non-deterministic %zu "
                      "bytes; want the difference %zu (the fp32 dQ accumulator)",
                      (int)backends[bi], (long long)sq, (long long)d, det, nondet, want);
            }
        }
        /* A bad argument: the same status and nothing written in both modes. */
        desc.backend = SK_BACKEND_CUDA;
        desc.head_dim = 0;
        for (int det = 0; det < 2; ++det) {
            size_t bytes = 0;
            const sk_status st = ws_size(&desc, det, &layout, &bytes);
            CHECK(st == SK_STATUS_BAD_PARAM_SHAPE && bytes == 777 &&
                      strstr(sk_last_error(), "head_dim") != NULL,
                  "head_dim 0, deterministic %d: %s, %zu bytes (%s)", det, sk_status_name(st),
                  bytes, sk_last_error());
        }
        nr_bsr_free(&layout);
    }
}
