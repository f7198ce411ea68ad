/*
 * decode.cu - the CUDA decode attention (the sk_cuda_decode_* calls of
 * backend.h): the split count and workspace, the kernel choice and the two
 * launches (the split-KV kernel of decode_kernel.cuh, then, with more than
 * one split, the merge). Design and status: docs/perf/decode.md.
 *
 * The split count is sk_decode_split_count's (src/core/decode.h): a pure
 * function of the descriptor, the layout's geometry and the current
 * device's CTA slots (SMs x CTAs per SM by shared memory), so the
 * workspace size is known on the host and a run enqueues the same grid
 * every time (graph safe). Rows of queries (group x q_len) are cut into row groups of
 * 16 (kMT = 1, when they fit) or 32 (kMT = 2) rows, each a CTA that reads
 * the KV again (from L2, the CTAs of one KV head run side by side).
 * Workspace (splits > 1): partial O [B Hq q_len, splits, D] fp32, then
 * partial LSE [B Hq q_len, splits] fp32; every entry is written by the
 * split kernel (empty splits too), so nothing is cleared first and the
 * plan enqueues nothing.
 *
 * Every CUDA backend runs this portable kernel (SK_BACKEND_CUDA_SM90 still
 * needs a 9.0 device, as for the other families); a Hopper-specific
 * kernel is a later step.
 */
#include <stdint.h>
#include <string.h>

#include <atomic>

#include "core/decode.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/decode/decode_kernel.cuh"

/* Rows of queries per CTA: 16 when the group's rows fit, else 32. */
static int mtiles_of(const sk_decode_problem *dp) {
    const int64_t rows = dp->paged.v.flat.group * (int64_t)dp->q_len;
    return rows <= 16 ? 1 : 2;
}

static int32_t row_groups_of(const sk_decode_problem *dp) {
    const int64_t rows = dp->paged.v.flat.group * (int64_t)dp->q_len;
    return (int32_t)((rows + 16 * mtiles_of(dp) - 1) / (16 * mtiles_of(dp)));
}

/* What the kernels cover (after the argument checks): NOT_SUPPORTED names
 * the limit. */
static sk_status check_supported(const sk_decode_problem *dp, int32_t splits) {
    const sk_attention_problem *p = &dp->paged.v.flat;
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_NOT_SUPPORTED, "the CUDA decode takes F16 or BF16");
    if (p->head_dim != 64 && p->head_dim != 128)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->head_dim = %lld: the CUDA decode takes 64 or 128",
                        (long long)p->head_dim);
    if (dp->paged.v.max_seqlen_k > INT32_MAX - 256)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->max_seqlen_k = %lld: the CUDA decode takes up to 2^31 - 257 keys",
                        (long long)dp->paged.v.max_seqlen_k);
    /* The loaders step a chunk's 16 slot rows with 32-bit byte offsets. */
    if (p->k_stride[1] * 2 * 16 > INT32_MAX || p->v_stride[1] * 2 * 16 > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "the caches' slot strides (%lld, %lld elements) must be below 2^26 for "
                        "the CUDA decode",
                        (long long)p->k_stride[1], (long long)p->v_stride[1]);
    const int64_t ctas = (int64_t)dp->paged.v.batch * p->heads_kv * splits * row_groups_of(dp);
    const int64_t merge = ((int64_t)dp->paged.v.batch * p->heads_q * dp->q_len + 3) / 4;
    if (ctas > INT32_MAX || merge > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "the CUDA decode grid (%lld CTAs) must stay below 2^31", (long long)ctas);
    return SK_STATUS_SUCCESS;
}

static_assert((int)SK_DECODE_MAX_SPLITS <= (int)SK_DECODE_MERGE_MAX_SPLITS,
              "the merge holds at most SK_DECODE_MERGE_MAX_SPLITS partials per row");

enum { SK_DECODE_MAX_DEVICES = 64 };

/* CTAs of one kernel instance resident per SM of `device` (its shared
 * memory and registers, as the occupancy calculator counts them); 0 on
 * failure. Asked once per device and kept, so that a call inside a stream
 * capture makes no query. */
template <int kDtype, int kD, int kMT>
static int resident_ctas(int device) {
    static std::atomic<int> known[SK_DECODE_MAX_DEVICES];
    const bool cache = device >= 0 && device < SK_DECODE_MAX_DEVICES;
    if (cache && known[device].load(std::memory_order_relaxed) > 0)
        return known[device].load(std::memory_order_relaxed);
    auto kernel = sk_decode_kernel<kDtype, kD, kMT>;
    const int smem = (int)sk_decode_smem<kD, kMT>::kTotal;
    int n = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, SK_DECODE_THREADS, (size_t)smem) !=
            cudaSuccess)
        return 0;
    if (cache && n > 0) known[device].store(n, std::memory_order_relaxed);
    return n;
}

template <int kDtype>
static int resident_ctas_dtype(int device, int d, int mt) {
    if (d == 64)
        return mt == 1 ? resident_ctas<kDtype, 64, 1>(device) : resident_ctas<kDtype, 64, 2>(device);
    return mt == 1 ? resident_ctas<kDtype, 128, 1>(device) : resident_ctas<kDtype, 128, 2>(device);
}

/* The CTAs the current device runs at once: SMs x the resident CTAs of
 * the kernel this problem takes (2 on an H100 at D 128, 1 on an A100),
 * and its SMs in *sm_count; SK_DECODE_TARGET_CTAS and
 * SK_DECODE_FALLBACK_SMS when the device cannot be asked. Host queries
 * only (no stream work; the occupancy is asked once per device), the same
 * on every call on one device. */
static int64_t target_ctas(const sk_decode_problem *dp, int64_t *sm_count) {
    const sk_attention_problem *p = &dp->paged.v.flat;
    int device = 0, sms = 0;
    *sm_count = SK_DECODE_FALLBACK_SMS;
    if (p->head_dim != 64 && p->head_dim != 128) return SK_DECODE_TARGET_CTAS; /* refused later */
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return SK_DECODE_TARGET_CTAS;
    }
    if (sms > 0) *sm_count = sms;
    const int d = (int)p->head_dim, mt = mtiles_of(dp);
    const int per_sm = p->dtype == SK_DTYPE_F16 ? resident_ctas_dtype<SK_DTYPE_F16>(device, d, mt)
                                                : resident_ctas_dtype<SK_DTYPE_BF16>(device, d, mt);
    (void)cudaGetLastError();
    return (int64_t)(sms > 0 ? sms : 132) * (per_sm > 0 ? per_sm : 1);
}

/* Splits, and the workspace bytes they need (0 for one split). */
static sk_status plan_sizes(const sk_decode_problem *dp, int32_t *splits, size_t *bytes) {
    int64_t sms = 0;
    const int64_t target = target_ctas(dp, &sms);
    *splits = sk_decode_split_count(dp, row_groups_of(dp), target, sms);
    SK_TRY(check_supported(dp, *splits));
    if (*splits == 1) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    const sk_attention_problem *p = &dp->paged.v.flat;
    /* B Hq q_len < 2^31 x 2^4 (merge grid checked) x 128 splits x (D + 1) x 4: fits. */
    const int64_t rows = (int64_t)dp->paged.v.batch * p->heads_q * dp->q_len * *splits;
    *bytes = (size_t)(rows * (p->head_dim + 1) * 4 + 256);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_decode_splits(const sk_decode_problem *dp, int32_t *num_splits) {
    size_t bytes;
    return plan_sizes(dp, num_splits, &bytes);
}

extern "C" sk_status sk_cuda_decode_workspace_size(const sk_decode_problem *dp, size_t *bytes) {
    int32_t splits;
    return plan_sizes(dp, &splits, bytes);
}

/* The device, the kernel's limits and the workspace: everything a plan or
 * a run checks before enqueuing. */
static sk_status prepare(const sk_decode_problem *dp, void *workspace, size_t workspace_size,
                         int32_t *splits) {
    int hopper = 0;
    size_t need;
    SK_TRY(plan_sizes(dp, splits, &need));
    SK_TRY(sk_cuda_check_arch(dp->paged.v.flat.backend, &hopper));
    if (need > 0 && (workspace == NULL || workspace_size < need))
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace of %zu bytes: the decode needs %zu (sk_decode_workspace_size, "
                        "%d splits)",
                        workspace == NULL ? (size_t)0 : workspace_size, need, (int)*splits);
    if (need > 0 && ((uintptr_t)workspace & 15u) != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT, "workspace = %p must be 16-byte aligned",
                        workspace);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_decode_plan(const sk_decode_problem *dp, void *workspace,
                                         size_t workspace_size, cudaStream_t) {
    int32_t splits;
    return prepare(dp, workspace, workspace_size, &splits); /* nothing to enqueue */
}

static sk_decode_params params_of(const sk_decode_problem *dp, int32_t splits, void *workspace) {
    const sk_attention_problem *p = &dp->paged.v.flat;
    sk_decode_params k;
    memset(&k, 0, sizeof k);
    k.q = (const char *)p->q;
    k.k = (const char *)p->k;
    k.v = (const char *)p->v;
    k.o = (char *)p->o;
    k.lse = p->lse;
    if (splits > 1) {
        const int64_t rows = (int64_t)dp->paged.v.batch * p->heads_q * dp->q_len * splits;
        k.part_o = (float *)workspace;
        k.part_lse = k.part_o + rows * p->head_dim;
    }
    k.seq_lens_k = dp->paged.seq_lens_k;
    k.page_table = dp->paged.page_table;
    k.row_offsets = p->row_offsets;
    k.col_indices = p->col_indices;
    for (int i = 0; i < 3; ++i) {
        k.q_stride[i] = p->q_stride[i] * 2;
        k.o_stride[i] = p->o_stride[i] * 2;
        k.k_stride[i] = p->k_stride[i] * 2;
        k.v_stride[i] = p->v_stride[i] * 2;
    }
    k.table_stride = dp->paged.page_table_stride;
    k.batch = dp->paged.v.batch;
    k.heads_q = (int32_t)p->heads_q;
    k.heads_kv = (int32_t)p->heads_kv;
    k.group = p->group;
    k.q_len = dp->q_len;
    k.rows = p->group * dp->q_len;
    k.row_groups = row_groups_of(dp);
    k.splits = splits;
    k.num_pages = (int32_t)dp->paged.num_pages;
    k.page_size = dp->paged.page_size;
    k.max_seqlen_k = (int32_t)dp->paged.v.max_seqlen_k;
    k.block_k = p->block_k;
    k.layout_heads = p->layout_heads;
    k.nnz = p->nnz;
    k.dense = dp->dense;
    k.causal = p->causal;
    k.scale_log2 = p->scale * 1.4426950408889634f;
    return k;
}

template <int kDtype, int kD, int kMT>
static sk_status launch(const sk_decode_params &k, cudaStream_t stream) {
    using S = sk_decode_smem<kD, kMT>;
    auto kernel = sk_decode_kernel<kDtype, kD, kMT>;
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)S::kTotal),
                "cudaFuncSetAttribute");
    const int64_t ctas = (int64_t)k.batch * k.heads_kv * k.splits * k.row_groups;
    kernel<<<(unsigned)ctas, SK_DECODE_THREADS, S::kTotal, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "decode kernel launch");
    if (k.splits > 1) {
        const int64_t rows = (int64_t)k.batch * k.heads_q * k.q_len;
        sk_decode_merge_kernel<kDtype, kD>
            <<<(unsigned)((rows + SK_DECODE_WARPS - 1) / SK_DECODE_WARPS), SK_DECODE_THREADS, 0,
               stream>>>(k);
        SK_CUDA_TRY(cudaGetLastError(), "decode merge kernel launch");
    }
    return SK_STATUS_SUCCESS;
}

template <int kDtype>
static sk_status launch_dtype(const sk_decode_params &k, int d, int mt, cudaStream_t stream) {
    if (d == 64) return mt == 1 ? launch<kDtype, 64, 1>(k, stream) : launch<kDtype, 64, 2>(k, stream);
    return mt == 1 ? launch<kDtype, 128, 1>(k, stream) : launch<kDtype, 128, 2>(k, stream);
}

extern "C" sk_status sk_cuda_decode_run(const sk_decode_problem *dp, void *workspace,
                                        size_t workspace_size, cudaStream_t stream) {
    int32_t splits;
    SK_TRY(prepare(dp, workspace, workspace_size, &splits));
    const sk_decode_params k = params_of(dp, splits, workspace);
    const int d = (int)dp->paged.v.flat.head_dim, mt = mtiles_of(dp);
    if (dp->paged.v.flat.dtype == SK_DTYPE_F16) return launch_dtype<SK_DTYPE_F16>(k, d, mt, stream);
    return launch_dtype<SK_DTYPE_BF16>(k, d, mt, stream);
}
