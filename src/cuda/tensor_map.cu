/*
 * tensor_map.cu - looking up cuTensorMapEncodeTiled once (tensor_map.h).
 */
#include <cuda_runtime.h>

#include "cuda/tensor_map.h"

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
