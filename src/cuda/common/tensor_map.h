/*
 * tensor_map.h - the driver's cuTensorMapEncodeTiled, reached through the
 * runtime (cudaGetDriverEntryPointByVersion), so the library does not link
 * libcuda. Used by the Hopper kernels to build their TMA descriptors.
 */
#ifndef SK_CUDA_TENSOR_MAP_H
#define SK_CUDA_TENSOR_MAP_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "sparsek.h"

/* The encoder, looked up once; NULL when the driver does not provide it. */
PFN_cuTensorMapEncodeTiled_v12000 sk_tensor_map_encoder(void);

/* A tiled map of rank 1..5 over ptr, elements of dtype (F16, BF16, F32, or
 * E4M3 as bytes),
 * 128B swizzle (the layout the Hopper kernels' shared-memory tiles use),
 * L2 promotion 256 B, unit element strides, out-of-bounds elements zero on
 * load. dims[rank], strides_bytes[rank - 1], box[rank]. CUDA_ERROR_NOT_FOUND
 * without an encoder. */
CUresult sk_tensor_map_encode_sw128(CUtensorMap *map, sk_dtype dtype, int rank, const void *ptr,
                                    const cuuint64_t *dims, const cuuint64_t *strides_bytes,
                                    const cuuint32_t *box);

/* The same with 64B (swizzle_bytes 64: the FP8 kernel's 64-byte rows) or
 * 128B swizzle (128). */
CUresult sk_tensor_map_encode_swizzled(CUtensorMap *map, sk_dtype dtype, int rank,
                                       const void *ptr, const cuuint64_t *dims,
                                       const cuuint64_t *strides_bytes, const cuuint32_t *box,
                                       int swizzle_bytes);

#endif /* SK_CUDA_TENSOR_MAP_H */
