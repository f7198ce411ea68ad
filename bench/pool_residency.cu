/*
 * pool_residency.cu - how many resident pooling CTAs it takes to read Q and K
 * at full DRAM bandwidth (the premise of an overlapped top-k selection,
 * docs/perf/topk_log.md step 3). A tuning experiment, not built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a bench/pool_residency.cu -o build/pool_residency
 *   build/pool_residency            # one JSON line per configuration
 *
 * The data is laid out as the issue-7 Q: [S = 131072, 32 heads x 128] bf16
 * (8 KB per token), read twice (Q and K: 2 GiB). A persistent grid of
 * `ctas` CTAs of 256 threads takes work items from a counter; an item is
 * the pooling kernel's: 128 tokens x half of the heads (4 KB per token),
 * each thread summing one 16-byte column with INFLIGHT loads in flight,
 * as src/cuda/topk/pool.cu does. Reported: time and bandwidth per (ctas per
 * SM x SMs, INFLIGHT).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { THREADS = 256, TOKENS = 131072, ROW_BYTES = 8192, BLOCK = 128 };

template <int INFLIGHT>
__global__ void __launch_bounds__(THREADS) pool_kernel(const uint4 *src, float4 *dst, int items,
                                                       int *counter) {
    __shared__ int item_s;
    for (;;) {
        if (threadIdx.x == 0) item_s = atomicAdd(counter, 1);
        __syncthreads();
        const int item = item_s;
        __syncthreads();
        if (item >= items) return;
        /* item -> (tensor copy, block, half); 16-byte column per thread */
        const int half = item & 1, blk = (item >> 1) % (TOKENS / BLOCK);
        const int copy = (item >> 1) / (TOKENS / BLOCK);
        const uint4 *p = src + (size_t)copy * TOKENS * (ROW_BYTES / 16) +
                         (size_t)blk * BLOCK * (ROW_BYTES / 16) + half * THREADS + threadIdx.x;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int u0 = 0; u0 < BLOCK; u0 += INFLIGHT) {
            uint4 v[INFLIGHT];
#pragma unroll
            for (int u = 0; u < INFLIGHT; ++u) v[u] = __ldg(p + (size_t)(u0 + u) * (ROW_BYTES / 16));
#pragma unroll
            for (int u = 0; u < INFLIGHT; ++u) {
                const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[2 * e] += __uint_as_float(w[e] << 16);
                    acc[2 * e + 1] += __uint_as_float(w[e] & 0xffff0000u);
                }
            }
        }
        float4 *o = dst + (size_t)item * THREADS * 2 + threadIdx.x * 2;
        o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}

template <int INFLIGHT>
static float run(const uint4 *src, float4 *dst, int items, int *counter, int ctas) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int rep = 0; rep < 6; ++rep) {
        cudaMemsetAsync(counter, 0, 4);
        cudaEventRecord(e0);
        pool_kernel<INFLIGHT><<<ctas, THREADS>>>(src, dst, items, counter);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (rep > 0 && ms < best) best = ms; /* rep 0 warms up */
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

int main(void) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const size_t bytes = (size_t)2 * TOKENS * ROW_BYTES; /* Q and K */
    const int items = 2 * (TOKENS / BLOCK) * 2;
    uint4 *src;
    float4 *dst;
    int *counter;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, (size_t)items * THREADS * 32) ||
        cudaMalloc(&counter, 4)) {
        fprintf(stderr, "no device memory\n");
        return 1;
    }
    cudaMemset(src, 0x3c, bytes);
    /* CTAs per SM (x SMs) */
    const double per_sm[] = {0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4};
    for (int f = 0; f < 2; ++f) {
        const int inflight = f == 0 ? 8 : 16;
        for (double c : per_sm) {
            const int ctas = (int)(c * sms + 0.5);
            const float ms = f == 0 ? run<8>(src, dst, items, counter, ctas)
                                    : run<16>(src, dst, items, counter, ctas);
            printf("{\"gpu\": \"%s\", \"sms\": %d, \"ctas\": %d, \"ctas_per_sm\": %.2f, "
                   "\"inflight\": %d, \"kb_in_flight_per_cta\": %d, \"us\": %.1f, \"tbps\": %.2f}\n",
                   prop.name, sms, ctas, c, inflight, inflight * 16 * THREADS / 1024, ms * 1e3,
                   bytes / (ms * 1e-3) / 1e12);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) fprintf(stderr, "%s\n", cudaGetErrorName(e));
    return e != cudaSuccess;
}
