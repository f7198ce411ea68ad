/*
 * ptx.cuh - the only file with inline PTX. One small wrapper per
 * instruction, each with a one-line comment naming it; immediates are
 * template parameters with a static_assert on their range.
 *
 * Two sections, each owned by one kernel family: "sm_80 instructions"
 * (mma.sync, ldmatrix, cp.async, ex2, cvt; usable on sm_80 and later) and
 * "sm_90a instructions" (wgmma, TMA, mbarrier; Hopper only). Shared-memory
 * operands are 32-bit shared-window addresses (__cvta_generic_to_shared).
 */
#ifndef SK_CUDA_PTX_CUH
#define SK_CUDA_PTX_CUH

#include <stdint.h>

/* ===========================================================================
 * sm_80 instructions
 * ========================================================================= */

/* cp.async.cg.shared.global [dst], [src], 16, src_size: copy 16 bytes to shared
 * memory, bypassing L1; bytes past src_bytes (0..16) are zero-filled and
 * not read. */
__device__ __forceinline__ void sk_cp_async_16(uint32_t dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* cp.async.commit_group: close the group of this thread's cp.async issued so far. */
__device__ __forceinline__ void sk_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* cp.async.wait_group N: wait until at most N of this thread's groups are pending. */
template <int N>
__device__ __forceinline__ void sk_cp_async_wait(void) {
    static_assert(N >= 0 && N <= 7, "cp.async.wait_group takes 0..7 here");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices, rows from lanes 0-31. */
__device__ __forceinline__ void sk_ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: the same, each matrix transposed. */
__device__ __forceinline__ void sk_ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: d = a * b + d, fp16 in, fp32 accumulate. */
__device__ __forceinline__ void sk_mma_m16n8k16_f16(float d[4], const uint32_t a[4],
                                                    const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a * b + d, bf16 in, fp32 accumulate. */
__device__ __forceinline__ void sk_mma_m16n8k16_bf16(float d[4], const uint32_t a[4],
                                                     const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* prefetch.global.L2 [a]: bring the 128-byte line holding a into L2 (a hint). */
__device__ __forceinline__ void sk_prefetch_l2(const void *a) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
}

/* createpolicy.fractional.L2::evict_last.b64: an L2 policy keeping the lines (K/V,
 * reread; the pooled blocks, read next). */
__device__ __forceinline__ uint64_t sk_policy_evict_last(void) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

/* createpolicy.fractional.L2::evict_first.b64: an L2 policy for lines read once (Q). */
__device__ __forceinline__ uint64_t sk_policy_evict_first(void) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

/* st.global.L2::cache_hint.v4.u32 [a], v, policy: a 16-byte store under an L2 policy. */
__device__ __forceinline__ void sk_st_global_v4_hint(void *a, uint4 v, uint64_t policy) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(a), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
                 : "memory");
}

/* ex2.approx.ftz.f32: 2^x (MUFU.EX2); ex2(-inf) = +0. */
__device__ __forceinline__ float sk_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* cvt.rn.f16x2.f32: pack two floats as f16 (round to nearest even); hi in the upper half. */
__device__ __forceinline__ uint32_t sk_cvt_f16x2(float hi, float lo) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* cvt.rn.bf16x2.f32: pack two floats as bf16 (round to nearest even); hi in the upper half. */
__device__ __forceinline__ uint32_t sk_cvt_bf16x2(float hi, float lo) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* cvt.rna.tf32.f32: x rounded to tf32 (10 mantissa bits, nearest, ties away from zero), as an
 * fp32 bit pattern whose low 13 bits are zero. */
__device__ __forceinline__ uint32_t sk_cvt_rna_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/* red.global.add.f32 [a], x: a[0] += x in L2, no return value. Relaxed, unordered
 * with other adds (the sm_80 form of sk_red_add_v2_f32). */
__device__ __forceinline__ void sk_red_add_f32(float *a, float x) {
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(a), "f"(x) : "memory");
}

/* ===========================================================================
 * sm_90a instructions
 * ========================================================================= */

/*
 * Guarded: the portable kernels include this file in sm_80 passes, where
 * these instructions do not exist. Host passes see the declarations.
 */
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* The 64 accumulator operands %0..%63 of an m64n128 wgmma, and the 32 of an m64n64. */
#define SK_WGMMA_D32_STR                                                                           \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SK_WGMMA_D64_STR                                                                           \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
    "%56, %57, %58, %59, %60, %61, %62, %63}"
#define SK_WGMMA_D32_OPS(d)                                                                        \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),              \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),              \
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SK_WGMMA_D64_OPS(d)                                                                        \
    SK_WGMMA_D32_OPS(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),          \
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),              \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),              \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),              \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),              \
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16, A and B from shared memory (both K-major):
 * d = a * b (+ d when scale_d != 0). */
__device__ __forceinline__ void sk_wgmma_m64n128k16_ss_f16(float d[64], uint64_t desc_a,
                                                           uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " SK_WGMMA_D64_STR
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16, A and B from shared memory (K-major). */
__device__ __forceinline__ void sk_wgmma_m64n128k16_ss_bf16(float d[64], uint64_t desc_a,
                                                            uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SK_WGMMA_D64_STR
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* The same as write-only outputs, for the first K step (scale-d = 0: d = a * b): the old
 * accumulator is not an input, so the compiler keeps no dependency on it. */
#define SK_WGMMA_D64_OUT(d)                                                                        \
    "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),            \
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),    \
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]),              \
        "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]),              \
        "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]),              \
        "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]),              \
        "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]),              \
        "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]),              \
        "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),              \
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]),              \
        "=f"(d[62]), "=f"(d[63])

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 with scale-d = 0: d = a * b, both from
 * shared memory (K-major). */
__device__ __forceinline__ void sk_wgmma_m64n128k16_ss_f16_zero(float d[64], uint64_t desc_a,
                                                                uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " SK_WGMMA_D64_STR
                 ", %64, %65, 0, 1, 1, 0, 0;\n"
                 : SK_WGMMA_D64_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 with scale-d = 0: d = a * b. */
__device__ __forceinline__ void sk_wgmma_m64n128k16_ss_bf16_zero(float d[64], uint64_t desc_a,
                                                                 uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SK_WGMMA_D64_STR
                 ", %64, %65, 0, 1, 1, 0, 0;\n"
                 : SK_WGMMA_D64_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16, A from registers, B from shared memory
 * transposed (N-major, imm-trans-b = 1). */
__device__ __forceinline__ void sk_wgmma_m64n128k16_rs_f16(float d[64], const uint32_t a[4],
                                                           uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " SK_WGMMA_D64_STR
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16, A from registers, B N-major in shared memory. */
__device__ __forceinline__ void sk_wgmma_m64n128k16_rs_bf16(float d[64], const uint32_t a[4],
                                                            uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SK_WGMMA_D64_STR
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16, A from registers, B N-major in shared memory. */
__device__ __forceinline__ void sk_wgmma_m64n64k16_rs_f16(float d[32], const uint32_t a[4],
                                                          uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " SK_WGMMA_D32_STR
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16, A from registers, B N-major in shared memory. */
__device__ __forceinline__ void sk_wgmma_m64n64k16_rs_bf16(float d[32], const uint32_t a[4],
                                                           uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SK_WGMMA_D32_STR
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16, A and B from shared memory (both K-major):
 * d = a * b (+ d when scale_d != 0). (The backward's kernels: S and dP over 64 keys or queries.) */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_f16(float d[32], uint64_t desc_a,
                                                          uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " SK_WGMMA_D32_STR
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16, A and B from shared memory (K-major). */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_bf16(float d[32], uint64_t desc_a,
                                                           uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SK_WGMMA_D32_STR
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* The 128 accumulator operands %0..%127 of an m64n256 wgmma (the BSR GEMM). */
#define SK_WGMMA_D128_STR                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "  \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "  \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "  \
    "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "  \
    "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "  \
    "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define SK_WGMMA_D128_OPS(d)                                                                       \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
        "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), \
        "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), \
        "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), \
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
        "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), \
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), \
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), \
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16, A and B from shared memory; A K-major,
 * B K-major (TRANS_B = 0) or N-major (TRANS_B = 1): d = a * b + d. */
template <int TRANS_B>
__device__ __forceinline__ void sk_wgmma_m64n256k16_ss_f16(float d[128], uint64_t desc_a,
                                                           uint64_t desc_b) {
    static_assert(TRANS_B == 0 || TRANS_B == 1, "imm-trans-b is 0 or 1");
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " SK_WGMMA_D128_STR
                 ", %128, %129, 1, 1, 1, 0, %130;\n"
                 : SK_WGMMA_D128_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(TRANS_B));
}

/* wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16, as above for bf16. */
template <int TRANS_B>
__device__ __forceinline__ void sk_wgmma_m64n256k16_ss_bf16(float d[128], uint64_t desc_a,
                                                            uint64_t desc_b) {
    static_assert(TRANS_B == 0 || TRANS_B == 1, "imm-trans-b is 0 or 1");
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " SK_WGMMA_D128_STR
                 ", %128, %129, 1, 1, 1, 0, %130;\n"
                 : SK_WGMMA_D128_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "n"(TRANS_B));
}

/* wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32, A and B from shared memory (tf32 allows
 * K-major only): d += a * b. */
__device__ __forceinline__ void sk_wgmma_m64n128k8_ss_tf32(float d[64], uint64_t desc_a,
                                                           uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " SK_WGMMA_D64_STR
                 ", %64, %65, 1, 1, 1;\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* griddepcontrol.launch_dependents: the next kernel on the stream, if launched with programmatic
 * stream serialization, may start its CTAs once every CTA of this grid has executed this (or
 * exited). */
__device__ __forceinline__ void sk_griddep_launch_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* griddepcontrol.wait: wait until the grids this one programmatically depends on have completed
 * and their memory is visible (returns at once for a kernel launched without the attribute). */
__device__ __forceinline__ void sk_griddep_wait(void) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/* wgmma.fence.sync.aligned: order earlier register writes before the next wgmma reads them. */
__device__ __forceinline__ void sk_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

/* wgmma.commit_group.sync.aligned: close the group of wgmma issued so far. */
__device__ __forceinline__ void sk_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* wgmma.wait_group.sync.aligned N: wait until at most N wgmma groups are pending. */
template <int N>
__device__ __forceinline__ void sk_wgmma_wait(void) {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7 here");
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* No instruction: a compiler barrier on one register, so that reads of a wgmma
 * result are not hoisted above its wait and its inputs stay live until then. */
__device__ __forceinline__ void sk_reg_fence(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void sk_reg_fence_u32(uint32_t &r) {
    asm volatile("" : "+r"(r)::"memory");
}

/* stmatrix.sync.aligned.m8n8.x4.shared.b16: store four 8x8 b16 matrices, row addresses from lanes 0-31. */
__device__ __forceinline__ void sk_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1,
                                               uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* setmaxnreg.inc.sync.aligned.u32 N: raise this warpgroup's register allocation to N. */
template <int N>
__device__ __forceinline__ void sk_setmaxnreg_inc(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in 24..256");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* setmaxnreg.dec.sync.aligned.u32 N: lower this warpgroup's register allocation to N. */
template <int N>
__device__ __forceinline__ void sk_setmaxnreg_dec(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in 24..256");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* elect.sync _|p, 0xffffffff: true in exactly one active lane of the warp. */
__device__ __forceinline__ bool sk_elect_one(void) {
    uint32_t pred;
    asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(pred));
    return pred != 0;
}

/* bar.sync id, count: named barrier; waits for `count` threads (warp multiples) to arrive. */
__device__ __forceinline__ void sk_bar_sync(uint32_t id, uint32_t count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* bar.arrive id, count: arrive at a named barrier without waiting. */
__device__ __forceinline__ void sk_bar_arrive(uint32_t id, uint32_t count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* mbarrier.init.shared::cta.b64 [bar], count: a fresh barrier expecting `count` arrivals per phase. */
__device__ __forceinline__ void sk_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* fence.mbarrier_init.release.cluster: make mbarrier.init visible to the async proxy (TMA). */
__device__ __forceinline__ void sk_fence_mbar_init(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* mbarrier.arrive.shared::cta.b64 _, [bar]: one arrival (release semantics). */
__device__ __forceinline__ void sk_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes: one arrival plus `bytes` expected from TMA. */
__device__ __forceinline__ void sk_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* mbarrier.try_wait.parity.shared::cta.b64: true once the phase with this parity has completed
 * (acquire semantics); may return false after a time-out, so callers loop. */
__device__ __forceinline__ bool sk_mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}

/* prefetch.tensormap [tmap]: bring a __grid_constant__ tensor map into the descriptor cache. */
__device__ __forceinline__ void sk_prefetch_tensormap(const void *tmap) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
}

/* cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint:
 * TMA load of one box at coordinates (c0..c3) into shared memory, completing on `bar`. */
__device__ __forceinline__ void sk_tma_load_4d(uint32_t dst, const void *tmap, int c0, int c1,
                                               int c2, int c3, uint32_t bar, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
                 : "memory");
}

/* cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint:
 * TMA load of one box at (c0, c1). */
__device__ __forceinline__ void sk_tma_load_2d(uint32_t dst, const void *tmap, int c0, int c1,
                                               uint32_t bar, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
                 : "memory");
}

/* cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint:
 * TMA load of one box at (c0, c1, c2). */
__device__ __forceinline__ void sk_tma_load_3d(uint32_t dst, const void *tmap, int c0, int c1,
                                               int c2, uint32_t bar, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
                 : "memory");
}

/* cp.async.bulk.tensor.2d.global.shared::cta.bulk_group: TMA store of one box at (c0, c1);
 * elements outside the tensor are not written. */
__device__ __forceinline__ void sk_tma_store_2d(const void *tmap, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(tmap),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}

/* cp.async.bulk.tensor.4d.global.shared::cta.bulk_group: TMA store of one box from shared
 * memory; elements outside the tensor are not written. */
__device__ __forceinline__ void sk_tma_store_4d(const void *tmap, uint32_t src, int c0, int c1,
                                                int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], "
                 "[%1];\n" ::"l"(tmap),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/* cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` (a multiple of
 * 16) from global `src` (16-byte aligned) to shared `dst`, counted on the mbarrier `bar`. */
__device__ __forceinline__ void sk_bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                             uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* cp.async.bulk.commit_group: close the group of bulk stores issued so far. */
__device__ __forceinline__ void sk_bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* cp.async.bulk.wait_group.read N: wait until at most N bulk groups still read shared memory. */
template <int N>
__device__ __forceinline__ void sk_bulk_wait_read(void) {
    static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0..7 here");
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/* cp.async.bulk.wait_group N: wait until at most N bulk groups are pending (writes done). */
template <int N>
__device__ __forceinline__ void sk_bulk_wait(void) {
    static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0..7 here");
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* fence.proxy.async.shared::cta: order this thread's ordinary shared-memory writes before
 * later reads by the async proxy (TMA store, wgmma). */
__device__ __forceinline__ void sk_fence_proxy_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* --- FP8 (e4m3) attention (attention/fwd_sm90_fp8*.cu[h]) --- */

/* ld.shared.b32: one word of shared memory (volatile: kept after the barrier wait that
 * publishes it). */
__device__ __forceinline__ uint32_t sk_ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

/* st.shared.b32: one word to shared memory. */
__device__ __forceinline__ void sk_st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

/* cvt.rn.satfinite.e4m3x2.f32: two fp32 to e4m3 (nearest even, saturating to +-448, NaN
 * kept); lo in the low byte, hi in the high byte. */
__device__ __forceinline__ uint16_t sk_cvt_e4m3x2(float hi, float lo) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

/* wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3, A and B from shared memory (both
 * K-major, the only order FP8 wgmma takes): d = a * b (+ d when scale_d != 0). */
__device__ __forceinline__ void sk_wgmma_m64n128k32_ss_e4m3(float d[64], uint64_t desc_a,
                                                            uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " SK_WGMMA_D64_STR
                 ", %64, %65, p, 1, 1;\n}\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3, A and B from shared memory:
 * d = a * b (scale-d 0: d is written only, so its old values need not be live). */
__device__ __forceinline__ void sk_wgmma_m64n128k32_ss_e4m3_zero(float d[64], uint64_t desc_a,
                                                                 uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " SK_WGMMA_D64_STR
                 ", %64, %65, 0, 1, 1;\n"
                 : SK_WGMMA_D64_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3, A from registers (four b32 of four
 * e4m3 each), B K-major in shared memory: d = a * b (+ d when scale_d != 0). */
__device__ __forceinline__ void sk_wgmma_m64n128k32_rs_e4m3(float d[64], const uint32_t a[4],
                                                            uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " SK_WGMMA_D64_STR
                 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : SK_WGMMA_D64_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3, A from registers, B K-major in shared
 * memory (the FP8 P V at head dim 64): d = a * b (+ d when scale_d != 0). */
__device__ __forceinline__ void sk_wgmma_m64n64k32_rs_e4m3(float d[32], const uint32_t a[4],
                                                           uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " SK_WGMMA_D32_STR
                 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

/* --- Attention backward, Hopper dK/dV (attention/bwd_sm90_dkv.cu): the m64n64k16 ss forms
 * above, and their scale-d = 0 forms --- */

/* The 32 accumulators of an m64n64 wgmma as write-only outputs (scale-d = 0). */
#define SK_WGMMA_D32_OUT(d)                                                                        \
    "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),            \
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),    \
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]),              \
        "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]),              \
        "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 with scale-d = 0: d = a * b, both from
 * shared memory (K-major); the old accumulator is not an input. */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_f16_zero(float d[32], uint64_t desc_a,
                                                               uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " SK_WGMMA_D32_STR
                 ", %32, %33, 0, 1, 1, 0, 0;\n"
                 : SK_WGMMA_D32_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 with scale-d = 0: d = a * b. */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_bf16_zero(float d[32], uint64_t desc_a,
                                                                uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SK_WGMMA_D32_STR
                 ", %32, %33, 0, 1, 1, 0, 0;\n"
                 : SK_WGMMA_D32_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* --- FP8 attention on blocks of 64 keys (attention/fwd_sm90_fp8*.cu[h]; after the
 * SK_WGMMA_D32_OUT above) --- */

/* wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3, A and B from shared memory, both
 * K-major (the FP8 S = Q K^T on blocks of 64 keys): d = a * b (+ d when scale_d != 0). */
__device__ __forceinline__ void sk_wgmma_m64n64k32_ss_e4m3(float d[32], uint64_t desc_a,
                                                           uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " SK_WGMMA_D32_STR
                 ", %32, %33, p, 1, 1;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* The same with scale-d 0: d = a * b (d written only). */
__device__ __forceinline__ void sk_wgmma_m64n64k32_ss_e4m3_zero(float d[32], uint64_t desc_a,
                                                                uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " SK_WGMMA_D32_STR
                 ", %32, %33, 0, 1, 1;\n"
                 : SK_WGMMA_D32_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* --- Attention backward, fused dQ (attention/bwd_sm90_dkv_dq.cuh): dQ = dS K with dS stored
 * transposed (MN-major) and K read N-major, both from shared memory; the fp32 adds into dQaccum --- */

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16, A and B from shared memory, both MN-major
 * (imm-trans-a = imm-trans-b = 1): d = a * b (+ d when scale_d != 0). */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_tt_f16(float d[32], uint64_t desc_a,
                                                             uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " SK_WGMMA_D32_STR
                 ", %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16, A and B from shared memory, both MN-major. */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_tt_bf16(float d[32], uint64_t desc_a,
                                                              uint64_t desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SK_WGMMA_D32_STR
                 ", %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : SK_WGMMA_D32_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16, both MN-major, scale-d = 0: d = a * b
 * (the old accumulator is not an input). */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_tt_f16_zero(float d[32], uint64_t desc_a,
                                                                  uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " SK_WGMMA_D32_STR
                 ", %32, %33, 0, 1, 1, 1, 1;\n"
                 : SK_WGMMA_D32_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16, both MN-major, scale-d = 0: d = a * b. */
__device__ __forceinline__ void sk_wgmma_m64n64k16_ss_tt_bf16_zero(float d[32], uint64_t desc_a,
                                                                   uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SK_WGMMA_D32_STR
                 ", %32, %33, 0, 1, 1, 1, 1;\n"
                 : SK_WGMMA_D32_OUT(d)
                 : "l"(desc_a), "l"(desc_b));
}

/* red.global.add.v2.f32 [a], {x, y}: a[0] += x, a[1] += y in L2, no return value (8-byte
 * aligned a; the vector form needs sm_90). Relaxed, unordered with other adds. */
__device__ __forceinline__ void sk_red_add_v2_f32(float *a, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a), "f"(x), "f"(y) : "memory");
}

/* cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [dst], [src], bytes: dst[i] +=
 * src[i] over `bytes` (a multiple of 16; both 16-byte aligned) by the bulk-copy unit, in L2;
 * closed by sk_bulk_commit, src reusable after sk_bulk_wait_read. Unordered with other adds. */
__device__ __forceinline__ void sk_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                     dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}

#endif /* sm_90a section guard */

#endif /* SK_CUDA_PTX_CUH */
