/*
 * tensor_map.h - the driver's cuTensorMapEncodeTiled, reached through the
 * runtime (cudaGetDriverEntryPointByVersion), so the library does not link
 * libcuda. Used by the Hopper kernels to build their TMA descriptors.
 */
#ifndef SK_CUDA_TENSOR_MAP_H
#define SK_CUDA_TENSOR_MAP_H

#include <cuda.h>
#include <cudaTypedefs.h>

/* The encoder, looked up once; NULL when the driver does not provide it. */
PFN_cuTensorMapEncodeTiled_v12000 sk_tensor_map_encoder(void);

#endif /* SK_CUDA_TENSOR_MAP_H */
