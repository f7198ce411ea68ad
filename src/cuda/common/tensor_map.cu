/*
 * tensor_map.cu - looking up cuTensorMapEncodeTiled once (tensor_map.h).
 */
#include <cuda_runtime.h>

#include "cuda/common/tensor_map.h"

static PFN_cuTensorMapEncodeTiled_v12000 sk_load_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* A thread-safe function-local static. */
PFN_cuTensorMapEncodeTiled_v12000 sk_tensor_map_encoder(void) {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = sk_load_encoder();
    return fn;
}

CUresult sk_tensor_map_encode_sw128(CUtensorMap *map, sk_dtype dtype, int rank, const void *ptr,
                                    const cuuint64_t *dims, const cuuint64_t *strides_bytes,
                                    const cuuint32_t *box) {
    return sk_tensor_map_encode_swizzled(map, dtype, rank, ptr, dims, strides_bytes, box, 128);
}

CUresult sk_tensor_map_encode_swizzled(CUtensorMap *map, sk_dtype dtype, int rank,
                                       const void *ptr, const cuuint64_t *dims,
                                       const cuuint64_t *strides_bytes, const cuuint32_t *box,
                                       int swizzle_bytes) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = sk_tensor_map_encoder();
    if (encode == NULL) return CUDA_ERROR_NOT_FOUND;
    const cuuint32_t estr[5] = {1, 1, 1, 1, 1};
    const CUtensorMapDataType dt = dtype == SK_DTYPE_BF16    ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == SK_DTYPE_F32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dtype == SK_DTYPE_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode(map, dt, (cuuint32_t)rank, (void *)ptr, dims, strides_bytes, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE,
                  swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
