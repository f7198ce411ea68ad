/*
 * harness.cu - development harness for the Hopper kernel (src/cuda/attention/fwd_sm90.cu),
 * usable before the CUDA dispatch and the GPU suite exist: it fills an
 * sk_attention_problem and a host-built schedule itself and calls
 * sk_attention_sm90_launch directly.
 *
 *   harness check [quick]   correctness cases against an fp64 reference
 *   harness bench [filter]  timings (CUDA events, median) + spot checks
 *
 * Inputs are a hash of (seed, memory offset) quantised to k/128 - 1, exact in
 * fp16 and bf16, so the host reference can recompute any element without a
 * copy. Padding inside strided tensors is NaN: a stray read shows. O and LSE
 * are poisoned with NaN before each run: an unwritten element shows.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/attention/kernels.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x);  \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

typedef sk_status (*launch_fn)(const sk_attention_problem *, const sk_attention_schedule *,
                               cudaStream_t);
struct Variant {
    const char *name;
    launch_fn launch;
};
#ifdef SK_VARIANTS_INC
#include SK_VARIANTS_INC
#else
static const Variant kVariants[] = {{"lib", sk_attention_sm90_launch}};
#endif
static const int kNumVariants = (int)(sizeof kVariants / sizeof kVariants[0]);
static double g_timeout = 20.0;
/* SK_VARIANT_ONLY=name restricts checks and timings to one variant. */
static int variant_enabled(int v) {
    const char *only = getenv("SK_VARIANT_ONLY");
    return only == NULL || !strcmp(only, kVariants[v].name);
}

/* ------------------------------------------------------------------------- */

static __host__ __device__ inline uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}
static __host__ __device__ inline float val_at(uint32_t seed, uint64_t off) {
    return (float)((hash32(off * 0x9E3779B97F4A7C15ull + seed) >> 9) & 255) / 128.0f - 1.0f;
}

/* SK_BENCH_RANDN=1 (bench only): N(0, 1) inputs, as in the benchmark suite
 * (Box-Muller on two hashes of the offset); the reference rounds the same
 * value to the dtype on the host. */
static int g_randn = 0;
static __host__ __device__ inline float normal_at(uint32_t seed, uint64_t off) {
    const uint32_t a = hash32(off * 0x9E3779B97F4A7C15ull + seed);
    const uint32_t b = hash32((off ^ 0x5BD1E995ull) * 0xC2B2AE3D27D4EB4Full + seed * 7919ull + 1);
    const float u1 = (float)((a >> 8) + 1) * (1.0f / 16777216.0f); /* (0, 1] */
    const float u2 = (float)(b >> 8) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

__global__ void fill_kernel(uint16_t *p, size_t n, uint32_t seed, int bf16, int randn) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = randn ? normal_at(seed, i) : val_at(seed, i);
        if (bf16) {
            __nv_bfloat16 h = __float2bfloat16_rn(v);
            p[i] = *(uint16_t *)&h;
        } else {
            __half h = __float2half_rn(v);
            p[i] = *(uint16_t *)&h;
        }
    }
}

static float h2f(uint16_t u, int bf16) {
    if (bf16) {
        uint32_t x = (uint32_t)u << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
}
static uint16_t f2h(float v, int bf16) {
    if (bf16) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        uint16_t u;
        memcpy(&u, &h, 2);
        return u;
    }
    __half h = __float2half_rn(v);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* ------------------------------------------------------------------------- */
/* Layouts (host) */

enum { L_DENSE, L_RANDOM, L_WINDOW, L_WINDOW_RANDOM, L_SOME_EMPTY, L_GARBAGE };

struct Layout {
    std::vector<int32_t> off, idx;
    int lb, lh, rb, cb;
};

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Block j is causal-admissible for query block i: some (q, k) pair with k <= q + Sk - Sq. */
static void build_layout(Layout &L, int kind, int lb, int lh, int64_t Sq, int64_t Sk, int causal,
                         int k_rand, int64_t window) {
    L.lb = lb;
    L.lh = lh;
    L.rb = (int)((Sq + 127) / 128);
    L.cb = (int)((Sk + 127) / 128);
    L.off.assign(1, 0);
    L.idx.clear();
    std::vector<int> cand, sel;
    for (int s = 0; s < lb * lh; ++s)
        for (int i = 0; i < L.rb; ++i) {
            const int64_t q0 = (int64_t)i * 128, q1 = std::min<int64_t>(q0 + 127, Sq - 1);
            const int64_t p0 = q0 + Sk - Sq, p1 = q1 + Sk - Sq;
            std::vector<char> keep(L.cb, 0);
            cand.clear();
            for (int j = 0; j < L.cb; ++j)
                if (!causal || (int64_t)j * 128 <= p1) cand.push_back(j);
            if (kind == L_DENSE) {
                for (int j : cand) keep[j] = 1;
            } else if (kind == L_RANDOM || kind == L_SOME_EMPTY || kind == L_GARBAGE) {
                int k = k_rand;
                if (kind == L_SOME_EMPTY && rnd() % 3 == 0) k = 0;
                sel = cand;
                for (int a = 0; a < (int)sel.size() && a < k; ++a) {
                    int b = a + (int)(rnd() % (sel.size() - a));
                    std::swap(sel[a], sel[b]);
                    keep[sel[a]] = 1;
                }
            } else if (kind == L_WINDOW || kind == L_WINDOW_RANDOM) {
                for (int j = 0; j < L.cb; ++j) {
                    const int64_t k0 = (int64_t)j * 128, k1 = std::min<int64_t>(k0 + 127, Sk - 1);
                    /* some q in [q0,q1] with p - window <= k <= p: ranges overlap */
                    if (k0 <= p1 && k1 >= p0 - window && p1 >= 0) keep[j] = 1;
                }
                if (kind == L_WINDOW_RANDOM) {
                    sel.clear();
                    for (int j : cand)
                        if (!keep[j]) sel.push_back(j);
                    for (int a = 0; a < (int)sel.size() && a < k_rand; ++a) {
                        int b = a + (int)(rnd() % (sel.size() - a));
                        std::swap(sel[a], sel[b]);
                        keep[sel[a]] = 1;
                    }
                }
            }
            for (int j = 0; j < L.cb; ++j)
                if (keep[j]) L.idx.push_back(j);
            L.off.push_back((int32_t)L.idx.size());
        }
    if (kind == L_GARBAGE) {
        /* Invalid content the kernel must survive: out-of-range and duplicate
         * indices, offsets past nnz, negative and decreasing offsets. */
        const int nnz = (int)L.idx.size();
        for (size_t a = 0; a < L.idx.size(); ++a) {
            const uint64_t r = rnd() % 16;
            if (r == 0) L.idx[a] = -1 - (int)(rnd() % 5);
            if (r == 1) L.idx[a] = L.cb + (int)(rnd() % 5);
            if (r == 2 && a > 0) L.idx[a] = L.idx[a - 1];
            if (r == 3) L.idx[a] = INT32_MAX - (int)(rnd() % 3);
        }
        for (size_t g = 1; g + 1 < L.off.size(); ++g) {
            const uint64_t r = rnd() % 12;
            if (r == 0) L.off[g] = -7;
            if (r == 1) L.off[g] = nnz + 1000;
            if (r == 2) L.off[g] = L.off[g - 1] - 3;
        }
        L.off.back() = nnz + 5;
    }
}

/* The tile order the plan writes: longest rows first, ties by tile id. */
static std::vector<int32_t> host_tile_order(const Layout &L, int B, int Hq, int head_div,
                                            int64_t *blocks_total, int nnz) {
    const int n = B * Hq * L.rb;
    std::vector<std::pair<int, int>> v(n);
    int64_t tot = 0;
    for (int t = 0; t < n; ++t) {
        int i = t % L.rb, bh = t / L.rb, h = bh % Hq, b = bh / Hq;
        int slice = (L.lb == 1 ? 0 : b) * L.lh + h / head_div;
        int g = slice * L.rb + i;
        int lo = std::min(std::max(L.off[g], 0), nnz);
        int hi = std::max(std::min(std::max(L.off[g + 1], 0), nnz), lo);
        v[t] = {-(hi - lo), t};
        tot += hi - lo;
    }
    std::stable_sort(v.begin(), v.end());
    std::vector<int32_t> o(n);
    for (int t = 0; t < n; ++t) o[t] = v[t].second;
    if (blocks_total) *blocks_total = tot;
    return o;
}

/* ------------------------------------------------------------------------- */
/* Problem + reference */

struct Tensors {
    int64_t qs[3], ks[3], vs[3], os[3]; /* element strides b, s, h */
    size_t qn, kn, vn, on;              /* elements spanned */
};

struct Case {
    const char *name;
    int bf16, D, B, Hq, Hkv;
    int64_t Sq, Sk;
    int causal, kind, k_rand;
    int64_t window;
    int lay_batch_full, lay_heads; /* 0: broadcast; heads: 1, Hkv or Hq */
    int strided;                   /* 0 packed, 1 padded, 2 [B,H,S,D] for Q/O + padded K/V */
    int check_rows;                /* 0 all rows, else a sample */
    double scale;                  /* 0: 1/sqrt(D) */
};

static void make_strides(const Case &c, Tensors &T) {
    const int64_t D = c.D;
    auto packed = [&](int64_t S, int64_t H, int64_t pad, int64_t st[3]) {
        st[2] = D + pad;
        st[1] = H * (D + pad);
        st[0] = S * H * (D + pad);
    };
    if (c.strided == 0) {
        packed(c.Sq, c.Hq, 0, T.qs);
        packed(c.Sk, c.Hkv, 0, T.ks);
        packed(c.Sk, c.Hkv, 0, T.vs);
        packed(c.Sq, c.Hq, 0, T.os);
    } else if (c.strided == 1) {
        packed(c.Sq, c.Hq, 8, T.qs);
        packed(c.Sk, c.Hkv, 16, T.ks);
        packed(c.Sk, c.Hkv, 24, T.vs);
        packed(c.Sq, c.Hq, 8, T.os);
    } else {
        /* [B, H, S, D] for Q and O: seq stride D, head stride S*D */
        T.qs[1] = D;
        T.qs[2] = c.Sq * D;
        T.qs[0] = c.Hq * c.Sq * D;
        T.os[1] = D + 8;
        T.os[2] = c.Sq * (D + 8);
        T.os[0] = c.Hq * c.Sq * (D + 8);
        packed(c.Sk, c.Hkv, 8, T.ks);
        packed(c.Sk, c.Hkv, 0, T.vs);
        T.vs[0] += 64; /* a batch gap */
    }
    auto span = [&](int64_t S, int64_t H, const int64_t st[3]) {
        return (size_t)((c.B - 1) * st[0] + (S - 1) * st[1] + (H - 1) * st[2] + D);
    };
    T.qn = span(c.Sq, c.Hq, T.qs);
    T.kn = span(c.Sk, c.Hkv, T.ks);
    T.vn = span(c.Sk, c.Hkv, T.vs);
    T.on = span(c.Sq, c.Hq, T.os);
}

/* Host copies of the inputs when small; else values from the hash. */
struct Inputs {
    const uint16_t *q, *k, *v; /* NULL: use the hash */
    uint32_t sq, sk, sv;
    int bf16;
    int randn;
    float get(int which, size_t off) const {
        const uint16_t *p = which == 0 ? q : which == 1 ? k : v;
        uint32_t s = which == 0 ? sq : which == 1 ? sk : sv;
        if (p) return h2f(p[off], bf16);
        if (randn) return h2f(f2h(normal_at(s, off), bf16), bf16);
        return val_at(s, off); /* exact in both dtypes */
    }
};

static void ref_row(const Case &c, const Tensors &T, const Layout &L, const Inputs &in, int nnz,
                    int b, int h, int64_t q, double *o, double *lse) {
    const int D = c.D;
    const double scale = c.scale != 0.0 ? c.scale : 1.0 / sqrt((double)D);
    const int group = c.Hq / c.Hkv, hk = h / group;
    const int head_div = L.lh == 1 ? c.Hq : (L.lh == c.Hq ? 1 : group);
    const int i = (int)(q / 128);
    const int slice = (L.lb == 1 ? 0 : b) * L.lh + h / head_div;
    const int g = slice * L.rb + i;
    const int lo = std::min(std::max(L.off[g], 0), nnz);
    const int hi = std::max(std::min(std::max(L.off[g + 1], 0), nnz), lo);
    std::vector<double> qv(D), s, vrow;
    for (int d = 0; d < D; ++d)
        qv[d] = in.get(0, b * T.qs[0] + q * T.qs[1] + h * T.qs[2] + d);
    std::vector<int64_t> keys;
    for (int a = lo; a < hi; ++a) {
        const int j = L.idx[a];
        if (j < 0 || j >= L.cb) continue;
        for (int64_t kk = (int64_t)j * 128; kk < (int64_t)j * 128 + 128; ++kk) {
            if (kk >= c.Sk) break;
            if (c.causal && kk > q + c.Sk - c.Sq) continue;
            keys.push_back(kk);
        }
    }
    for (int d = 0; d < D; ++d) o[d] = 0.0;
    if (keys.empty()) {
        *lse = -INFINITY;
        return;
    }
    s.resize(keys.size());
    double mx = -INFINITY;
    for (size_t a = 0; a < keys.size(); ++a) {
        double acc = 0;
        const size_t base = b * T.ks[0] + keys[a] * T.ks[1] + hk * T.ks[2];
        for (int d = 0; d < D; ++d) acc += qv[d] * in.get(1, base + d);
        s[a] = acc * scale;
        mx = std::max(mx, s[a]);
    }
    double sum = 0;
    for (size_t a = 0; a < keys.size(); ++a) {
        s[a] = exp(s[a] - mx);
        sum += s[a];
    }
    for (size_t a = 0; a < keys.size(); ++a) {
        const size_t base = b * T.vs[0] + keys[a] * T.vs[1] + hk * T.vs[2];
        const double w = s[a] / sum;
        for (int d = 0; d < D; ++d) o[d] += w * in.get(2, base + d);
    }
    *lse = mx + log(sum);
}

/* ------------------------------------------------------------------------- */

static int sync_timeout(double seconds) {
    const clock_t t0 = clock();
    for (;;) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            printf("  kernel error: %s\n", cudaGetErrorName(e));
            return 1;
        }
        if ((double)(clock() - t0) / CLOCKS_PER_SEC > seconds) {
            printf("  HANG: kernel still running after %.0f s\n", seconds);
            fflush(stdout);
            exit(3);
        }
    }
}

struct Dev {
    uint16_t *q, *k, *v, *o;
    float *lse;
    int32_t *off, *idx, *order, *counter;
};

static void fill_problem(sk_attention_problem &p, const Case &c, const Tensors &T, const Layout &L,
                         const Dev &d, int nnz) {
    memset(&p, 0, sizeof p);
    p.backend = SK_BACKEND_CUDA_SM90;
    p.dtype = c.bf16 ? SK_DTYPE_BF16 : SK_DTYPE_F16;
    p.batch = c.B;
    p.seq_q = c.Sq;
    p.seq_k = c.Sk;
    p.heads_q = c.Hq;
    p.heads_kv = c.Hkv;
    p.head_dim = c.D;
    p.scale = (float)(c.scale != 0.0 ? c.scale : 1.0 / sqrt((double)c.D));
    p.causal = c.causal;
    memcpy(p.q_stride, T.qs, sizeof T.qs);
    memcpy(p.k_stride, T.ks, sizeof T.ks);
    memcpy(p.v_stride, T.vs, sizeof T.vs);
    memcpy(p.o_stride, T.os, sizeof T.os);
    p.group = c.Hq / c.Hkv;
    p.block_q = 128;
    p.block_k = 128;
    p.row_blocks = L.rb;
    p.col_blocks = L.cb;
    p.layout_batch = L.lb;
    p.layout_heads = L.lh;
    p.head_div = L.lh == 1 ? c.Hq : (L.lh == c.Hq ? 1 : c.Hq / c.Hkv);
    p.nnz = nnz;
    p.row_offsets = d.off;
    p.col_indices = d.idx;
    p.q = d.q;
    p.k = d.k;
    p.v = d.v;
    p.o = d.o;
    p.lse = d.lse;
}

static int launch(const sk_attention_problem &p, const Dev &d, int num_tiles, int variant = 0) {
    sk_attention_schedule s;
    s.tile_order = d.order;
    s.tile_counter = d.counter;
    s.num_tiles = num_tiles;
    s.tile_info = NULL; /* the plan's per-slot info; the Hopper kernel does not read it */
    CK(cudaMemsetAsync(d.counter, 0, 4, 0));
    sk_status st = kVariants[variant].launch(&p, &s, 0);
    if (st != SK_STATUS_SUCCESS) {
        printf("  launch failed: %d %s\n", (int)st, sk_last_error());
        return 1;
    }
    return 0;
}

/* Host-side fill with NaN in every element no tensor element maps to. */
static std::vector<uint16_t> host_fill(const Case &c, int64_t S, int64_t H, const int64_t st[3],
                                       size_t n, uint32_t seed) {
    const uint16_t nan16 = c.bf16 ? 0x7FC0 : 0x7E00;
    std::vector<uint16_t> v(n, nan16);
    for (int b = 0; b < c.B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h) {
                size_t base = b * st[0] + s * st[1] + h * st[2];
                for (int d = 0; d < c.D; ++d) v[base + d] = f2h(val_at(seed, base + d), c.bf16);
            }
    return v;
}

static int run_check(const Case &c, int verbose) {
    Tensors T;
    make_strides(c, T);
    Layout L;
    const int lb = c.lay_batch_full ? c.B : 1;
    build_layout(L, c.kind, lb, c.lay_heads, c.Sq, c.Sk, c.causal, c.k_rand, c.window);
    const int nnz = c.kind == L_GARBAGE ? (int)L.idx.size() : L.off.back();
    const int head_div = L.lh == 1 ? c.Hq : (L.lh == c.Hq ? 1 : c.Hq / c.Hkv);
    int64_t blocks = 0;
    std::vector<int32_t> order = host_tile_order(L, c.B, c.Hq, head_div, &blocks, nnz);
    const int nt = (int)order.size();

    std::vector<uint16_t> hq = host_fill(c, c.Sq, c.Hq, T.qs, T.qn, 11);
    std::vector<uint16_t> hk = host_fill(c, c.Sk, c.Hkv, T.ks, T.kn, 22);
    std::vector<uint16_t> hv = host_fill(c, c.Sk, c.Hkv, T.vs, T.vn, 33);

    Dev d;
    CK(cudaMalloc(&d.q, T.qn * 2));
    CK(cudaMalloc(&d.k, T.kn * 2));
    CK(cudaMalloc(&d.v, T.vn * 2));
    CK(cudaMalloc(&d.o, T.on * 2));
    const size_t lse_n = (size_t)c.B * c.Hq * c.Sq;
    CK(cudaMalloc(&d.lse, lse_n * 4));
    CK(cudaMalloc(&d.off, L.off.size() * 4));
    CK(cudaMalloc(&d.idx, std::max<size_t>(L.idx.size(), 1) * 4));
    CK(cudaMalloc(&d.order, nt * 4));
    CK(cudaMalloc(&d.counter, 4));
    CK(cudaMemcpy(d.q, hq.data(), T.qn * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.k, hk.data(), T.kn * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.v, hv.data(), T.vn * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.off, L.off.data(), L.off.size() * 4, cudaMemcpyHostToDevice));
    if (!L.idx.empty())
        CK(cudaMemcpy(d.idx, L.idx.data(), L.idx.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.order, order.data(), nt * 4, cudaMemcpyHostToDevice));

    sk_attention_problem p;
    fill_problem(p, c, T, L, d, nnz);
    int fail = 0;
    if (!sk_attention_sm90_supports(&p)) {
        printf("%-34s UNSUPPORTED by supports()\n", c.name);
        return 1;
    }
    /* The reference, once for all variants. */
    Inputs in = {hq.data(), hk.data(), hv.data(), 11, 22, 33, c.bf16, 0};
    struct Row {
        int b, h;
        int64_t q;
    };
    std::vector<Row> rows;
    std::vector<double> ref_o, ref_l;
    {
        std::vector<double> ro(c.D);
        for (int b = 0; b < c.B; ++b)
            for (int h = 0; h < c.Hq; ++h)
                for (int64_t q = 0; q < c.Sq; ++q) {
                    if (c.check_rows &&
                        (hash32((uint64_t)(b * 131 + h) * 1000003 + q) % c.check_rows))
                        continue;
                    double rl;
                    ref_row(c, T, L, in, nnz, b, h, q, ro.data(), &rl);
                    rows.push_back({b, h, q});
                    ref_o.insert(ref_o.end(), ro.begin(), ro.end());
                    ref_l.push_back(rl);
                }
    }
    std::vector<uint16_t> o1(T.on), o2(T.on);
    std::vector<float> l1(lse_n), l2(lse_n);
    for (int var = 0; var < kNumVariants; ++var) {
        if (!variant_enabled(var)) continue;
        for (int rep = 0; rep < 2; ++rep) {
            CK(cudaMemset(d.o, 0xFF, T.on * 2)); /* NaN poison */
            CK(cudaMemset(d.lse, 0xFF, lse_n * 4));
            if (launch(p, d, nt, var)) return 1;
            if (sync_timeout(g_timeout)) return 1;
            CK(cudaMemcpy(rep ? o2.data() : o1.data(), d.o, T.on * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(rep ? l2.data() : l1.data(), d.lse, lse_n * 4, cudaMemcpyDeviceToHost));
        }
        const int deterministic = memcmp(o1.data(), o2.data(), T.on * 2) == 0 &&
                                  memcmp(l1.data(), l2.data(), lse_n * 4) == 0;
        const double atol = c.bf16 ? 1.6e-2 : 2.5e-3, rtol = c.bf16 ? 1.6e-2 : 4e-3;
        double max_err = 0, max_lse_err = 0, sum_err2 = 0, sum_ref2 = 0;
        int64_t bad = 0, bad_lse = 0, shown = 0;
        std::vector<int64_t> bad_by_warp(8, 0), bad_by_col(16, 0);
        for (size_t r = 0; r < rows.size(); ++r) {
            const int b = rows[r].b, h = rows[r].h;
            const int64_t q = rows[r].q;
            const double *ro = &ref_o[r * c.D];
            const double rl = ref_l[r];
            const size_t ob = b * T.os[0] + q * T.os[1] + h * T.os[2];
            for (int dd = 0; dd < c.D; ++dd) {
                const double gv = h2f(o1[ob + dd], c.bf16);
                const double e = fabs(gv - ro[dd]);
                sum_err2 += std::isnan(e) ? 1e30 : e * e;
                sum_ref2 += ro[dd] * ro[dd];
                if (!(e <= atol + rtol * fabs(ro[dd]))) {
                    ++bad;
                    bad_by_warp[(q % 128) / 16]++;
                    bad_by_col[dd / 8]++;
                    if (verbose && shown < 8) {
                        printf("    O[b%d q%lld h%d d%d] gpu %.5f ref %.5f\n", b, (long long)q, h,
                               dd, gv, ro[dd]);
                        ++shown;
                    }
                }
                if (!std::isnan(e)) max_err = std::max(max_err, e);
                else max_err = INFINITY;
            }
            const double gl = l1[((size_t)b * c.Hq + h) * c.Sq + q];
            const double le =
                (std::isinf(rl) && std::isinf(gl) && rl < 0 && gl < 0) ? 0.0 : fabs(gl - rl);
            if (!(le <= 2e-3 + 1e-4 * fabs(rl))) {
                ++bad_lse;
                if (verbose && shown < 12) {
                    printf("    LSE[b%d h%d q%lld] gpu %.5f ref %.5f\n", b, h, (long long)q, gl,
                           rl);
                    ++shown;
                }
            }
            max_lse_err = std::isnan(le) ? INFINITY : std::max(max_lse_err, le);
        }
        /* Output padding must stay untouched (poison) - only checked for strided O. */
        int64_t pad_written = 0;
        if (c.strided) {
            std::vector<char> is_elem(T.on, 0);
            for (int b = 0; b < c.B; ++b)
                for (int64_t q = 0; q < c.Sq; ++q)
                    for (int h = 0; h < c.Hq; ++h)
                        memset(&is_elem[b * T.os[0] + q * T.os[1] + h * T.os[2]], 1, c.D);
            for (size_t a = 0; a < T.on; ++a)
                if (!is_elem[a] && o1[a] != 0xFFFF) ++pad_written;
        }
        const int vfail = bad || bad_lse || !deterministic || pad_written;
        fail |= vfail;
        printf("%-30s %-8s %s tiles %d blocks %lld  max|dO| %.2e rel %.2e  max|dLSE| %.2e  bad "
               "%lld/%lld det %d pad %lld\n",
               c.name, kVariants[var].name, vfail ? "FAIL" : "ok  ", nt, (long long)blocks,
               max_err, sqrt(sum_err2 / std::max(sum_ref2, 1e-30)), max_lse_err, (long long)bad,
               (long long)bad_lse, deterministic, (long long)pad_written);
        if (bad && verbose) {
            printf("    bad by warp row-group:");
            for (int w = 0; w < 8; ++w) printf(" %lld", (long long)bad_by_warp[w]);
            printf("\n    bad by 8-col group:");
            for (int w = 0; w < c.D / 8; ++w) printf(" %lld", (long long)bad_by_col[w]);
            printf("\n");
        }
    }
    cudaFree(d.q);
    cudaFree(d.k);
    cudaFree(d.v);
    cudaFree(d.o);
    cudaFree(d.lse);
    cudaFree(d.off);
    cudaFree(d.idx);
    cudaFree(d.order);
    cudaFree(d.counter);
    return fail;
}

/* ------------------------------------------------------------------------- */

static const Case kChecks[] = {
    /* name, bf16, D, B, Hq, Hkv, Sq, Sk, causal, kind, k, window, lay_batch_full, lay_heads, strided, rows */
    {"one_tile_f16_d128", 0, 128, 1, 1, 1, 128, 128, 0, L_DENSE, 0, 0, 0, 1, 0, 0},
    {"one_tile_bf16_d64", 1, 64, 1, 1, 1, 128, 128, 0, L_DENSE, 0, 0, 0, 1, 0, 0},
    {"dense_f16_d128_s1024", 0, 128, 1, 2, 2, 1024, 1024, 0, L_DENSE, 0, 0, 0, 1, 0, 0},
    {"random_f16_d128_gqa", 0, 128, 2, 4, 2, 512, 640, 0, L_RANDOM, 3, 0, 1, 4, 0, 0},
    {"random_bf16_d128_causal", 1, 128, 2, 4, 2, 512, 512, 1, L_RANDOM, 3, 0, 1, 2, 0, 0},
    {"random_f16_d64", 0, 64, 2, 4, 4, 384, 512, 0, L_RANDOM, 2, 0, 1, 4, 0, 0},
    {"dense_bf16_d64_causal", 1, 64, 1, 2, 1, 640, 640, 1, L_DENSE, 0, 0, 0, 1, 0, 0},
    {"tails_f16_d128_causal_sq<sk", 0, 128, 2, 2, 1, 300, 700, 1, L_DENSE, 0, 0, 0, 1, 0, 0},
    {"tails_bf16_d64_causal_sq>sk", 1, 64, 1, 3, 1, 700, 300, 1, L_DENSE, 0, 0, 0, 3, 0, 0},
    {"tails_f16_d64_nocausal", 0, 64, 1, 2, 2, 77, 1000, 0, L_RANDOM, 4, 0, 1, 2, 0, 0},
    {"tiny_sq1_sk1_f16_d128", 0, 128, 1, 1, 1, 1, 1, 1, L_DENSE, 0, 0, 0, 1, 0, 0},
    {"empty_rows_bf16_d128", 1, 128, 2, 4, 4, 512, 512, 0, L_SOME_EMPTY, 2, 0, 1, 4, 0, 0},
    {"empty_rows_f16_d64_causal", 0, 64, 2, 2, 2, 512, 512, 1, L_SOME_EMPTY, 2, 0, 0, 1, 0, 0},
    {"garbage_layout_f16_d128", 0, 128, 2, 4, 2, 512, 600, 0, L_GARBAGE, 4, 0, 1, 4, 0, 0},
    {"garbage_layout_bf16_d64_causal", 1, 64, 2, 2, 2, 600, 512, 1, L_GARBAGE, 4, 0, 1, 2, 0, 0},
    {"window_f16_d128_causal", 0, 128, 1, 2, 1, 2048, 2048, 1, L_WINDOW, 0, 512, 0, 1, 0, 0},
    {"window_rand_bf16_d128", 1, 128, 1, 2, 2, 2048, 2048, 1, L_WINDOW_RANDOM, 3, 384, 0, 1, 0, 0},
    {"strided_f16_d128", 0, 128, 2, 4, 2, 300, 400, 1, L_RANDOM, 3, 0, 1, 4, 1, 0},
    {"strided_bhsd_bf16_d64", 1, 64, 2, 4, 1, 256, 384, 0, L_RANDOM, 2, 0, 1, 1, 2, 0},
    {"strided_bhsd_f16_d128", 0, 128, 1, 2, 2, 200, 333, 1, L_DENSE, 0, 0, 0, 1, 2, 0},
    {"many_tiles_f16_d128", 0, 128, 4, 16, 4, 1024, 1024, 1, L_RANDOM, 4, 0, 1, 16, 0, 7},
    {"long_rows_bf16_d64", 1, 64, 1, 4, 4, 512, 8192, 0, L_DENSE, 0, 0, 0, 1, 0, 3},
    {"neg_scale_f16_d128_causal", 0, 128, 2, 4, 2, 300, 400, 1, L_RANDOM, 3, 0, 1, 4, 0, 0, -0.15},
    {"neg_scale_bf16_d64_garbage", 1, 64, 2, 2, 2, 512, 512, 0, L_GARBAGE, 3, 0, 1, 2, 0, 0, -0.03},
    {"big_scale_f16_d64_empty", 0, 64, 2, 2, 1, 384, 640, 1, L_SOME_EMPTY, 3, 0, 0, 1, 0, 0, 2.5},
};
static const int kQuick[] = {0, 1, 4, 8, 9, 13, 18, 22, 23};

/* ------------------------------------------------------------------------- */
/* Benchmarks */

struct Bench {
    const char *name;
    int bf16, D, B, H;
    int64_t S;
    int causal, kind, k_rand;
    int64_t window;
    int per_head; /* layout slices per (b, h) (random), else broadcast */
};

static const Bench kBenches[] = {
    {"seed_rand50_f16_d128", 0, 128, 16, 96, 4096, 0, L_RANDOM, 16, 0, 1},
    {"seed_rand25_f16_d128", 0, 128, 16, 96, 4096, 0, L_RANDOM, 8, 0, 1},
    {"seed_rand12_f16_d128", 0, 128, 16, 96, 4096, 0, L_RANDOM, 4, 0, 1},
    {"seed_cwin1024_f16_d128", 0, 128, 16, 96, 4096, 1, L_WINDOW, 0, 1024, 0},
    {"seed_dense_f16_d128", 0, 128, 16, 96, 4096, 0, L_DENSE, 0, 0, 0},
    {"long16k_cwin2048_bf16_d128", 1, 128, 1, 32, 16384, 1, L_WINDOW, 0, 2048, 0},
    {"long32k_cwin2048_bf16_d128", 1, 128, 1, 32, 32768, 1, L_WINDOW, 0, 2048, 0},
    {"long64k_cwin2048_bf16_d128", 1, 128, 1, 32, 65536, 1, L_WINDOW, 0, 2048, 0},
    {"long128k_cwin2048_bf16_d128", 1, 128, 1, 32, 131072, 1, L_WINDOW, 0, 2048, 0},
    {"long256k_cwin2048_bf16_d128", 1, 128, 1, 32, 262144, 1, L_WINDOW, 0, 2048, 0},
    {"long128k_win4096_r8_bf16_d128", 1, 128, 1, 32, 131072, 1, L_WINDOW_RANDOM, 8, 4096, 1},
    {"long16k_cwin2048_bf16_d64", 1, 64, 1, 32, 16384, 1, L_WINDOW, 0, 2048, 0},
    {"long64k_cwin2048_bf16_d64", 1, 64, 1, 32, 65536, 1, L_WINDOW, 0, 2048, 0},
    {"long256k_cwin2048_bf16_d64", 1, 64, 1, 32, 262144, 1, L_WINDOW, 0, 2048, 0},
    {"seed_rand25_bf16_d64", 1, 64, 16, 96, 4096, 0, L_RANDOM, 8, 0, 1},
};

static int run_bench(const Bench &bc, int reps, FILE *json) {
    Case c = {bc.name, bc.bf16, bc.D, bc.B, bc.H, bc.H, bc.S, bc.S, bc.causal, bc.kind,
              bc.k_rand, bc.window, bc.per_head, bc.per_head ? bc.H : 1, 0, 0};
    Tensors T;
    make_strides(c, T);
    Layout L;
    build_layout(L, c.kind, c.lay_batch_full ? c.B : 1, c.lay_heads, c.Sq, c.Sk, c.causal, c.k_rand,
                 c.window);
    const int nnz = L.off.back();
    const int head_div = L.lh == 1 ? c.Hq : 1;
    int64_t blocks = 0;
    std::vector<int32_t> order = host_tile_order(L, c.B, c.Hq, head_div, &blocks, nnz);
    const int nt = (int)order.size();
    Dev d;
    CK(cudaMalloc(&d.q, T.qn * 2));
    CK(cudaMalloc(&d.k, T.kn * 2));
    CK(cudaMalloc(&d.v, T.vn * 2));
    CK(cudaMalloc(&d.o, T.on * 2));
    const size_t lse_n = (size_t)c.B * c.Hq * c.Sq;
    CK(cudaMalloc(&d.lse, lse_n * 4));
    CK(cudaMalloc(&d.off, L.off.size() * 4));
    CK(cudaMalloc(&d.idx, std::max<size_t>(L.idx.size(), 1) * 4));
    CK(cudaMalloc(&d.order, nt * 4));
    CK(cudaMalloc(&d.counter, 4));
    fill_kernel<<<1024, 256>>>(d.q, T.qn, 11, c.bf16, g_randn);
    fill_kernel<<<1024, 256>>>(d.k, T.kn, 22, c.bf16, g_randn);
    fill_kernel<<<1024, 256>>>(d.v, T.vn, 33, c.bf16, g_randn);
    CK(cudaGetLastError());
    CK(cudaMemcpy(d.off, L.off.data(), L.off.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.idx, L.idx.data(), L.idx.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.order, order.data(), nt * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d.o, 0xFF, T.on * 2));
    sk_attention_problem p;
    fill_problem(p, c, T, L, d, nnz);

    Inputs in = {NULL, NULL, NULL, 11, 22, 33, c.bf16, g_randn};
    const double flops = 4.0 * c.D * 128.0 * 128.0 * (double)blocks;
    const double dense_blocks = (double)c.B * c.Hq * L.rb * L.cb;
    int bad = 0;
    /* The 48 spot-check rows and their fp64 reference, once for all variants. */
    const int kSpot = 48;
    int spot_b[kSpot], spot_h[kSpot];
    int64_t spot_q[kSpot];
    std::vector<double> spot_o((size_t)kSpot * c.D), spot_l(kSpot);
    {
        uint64_t saved = g_rng;
        g_rng = 12345;
        for (int a = 0; a < kSpot; ++a) {
            spot_b[a] = (int)(rnd() % c.B);
            spot_h[a] = (int)(rnd() % c.Hq);
            spot_q[a] = (int64_t)(rnd() % c.Sq);
            ref_row(c, T, L, in, nnz, spot_b[a], spot_h[a], spot_q[a], &spot_o[(size_t)a * c.D],
                    &spot_l[a]);
        }
        g_rng = saved;
    }
    for (int var = 0; var < kNumVariants; ++var) {
        if (!variant_enabled(var)) continue;
        /* Warm-up (and the run that is checked), per variant. */
        CK(cudaMemset(d.o, 0xFF, T.on * 2));
        if (launch(p, d, nt, var) || sync_timeout(60.0)) return 1;
        /* Spot check 48 rows against the fp64 reference. */
        double max_err = 0;
        int vbad = 0;
        std::vector<uint16_t> orow(c.D);
        for (int a = 0; a < kSpot; ++a) {
            const int b = spot_b[a], h = spot_h[a];
            const int64_t q = spot_q[a];
            const double *ro = &spot_o[(size_t)a * c.D];
            const double rl = spot_l[a];
            CK(cudaMemcpy(orow.data(), d.o + b * T.os[0] + q * T.os[1] + h * T.os[2], c.D * 2,
                          cudaMemcpyDeviceToHost));
            float gl;
            CK(cudaMemcpy(&gl, d.lse + ((size_t)b * c.Hq + h) * c.Sq + q, 4,
                          cudaMemcpyDeviceToHost));
            for (int dd = 0; dd < c.D; ++dd) {
                const double e = fabs(h2f(orow[dd], c.bf16) - ro[dd]);
                if (!(e <= (c.bf16 ? 2e-2 : 3e-3) + 1e-2 * fabs(ro[dd]))) ++vbad;
                max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
            }
            if (!(fabs(gl - rl) <= 2e-3 + 1e-4 * fabs(rl))) ++vbad;
        }
        if (vbad) printf("  %s %s: spot check FAILED (%d, max err %.1e)\n", bc.name,
                         kVariants[var].name, vbad, max_err);
        bad += vbad;
        for (int w = 0; w < 2; ++w)
            if (launch(p, d, nt, var)) return 1;
    }
    CK(cudaDeviceSynchronize());
    std::vector<std::vector<float>> ms(kNumVariants);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* Interleaved: every variant sees the same clocks and temperature. */
    for (int r = 0; r < reps; ++r)
        for (int var = 0; var < kNumVariants; ++var) {
            if (!variant_enabled(var)) continue;
            CK(cudaEventRecord(e0, 0));
            if (launch(p, d, nt, var)) return 1;
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms[var].push_back(t);
        }
    CK(cudaGetLastError());
    for (int var = 0; var < kNumVariants; ++var) {
        if (!variant_enabled(var)) continue;
        std::vector<float> &v = ms[var];
        std::sort(v.begin(), v.end());
        const double med = v[v.size() / 2];
        const double tf = flops / (med * 1e-3) / 1e12;
        printf("%-30s %-8s %8.3f ms (min %.3f max %.3f) %6.1f TFLOPS (at min %6.1f) dens %.3f "
               "us/head %.1f\n",
               bc.name, kVariants[var].name, med, v.front(), v.back(), tf,
               flops / (v.front() * 1e-3) / 1e12, blocks / dense_blocks, med * 1e3 / (c.B * c.Hq));
        if (json)
            fprintf(json,
                    "{\"case\": \"%s\", \"variant\": \"%s\", \"dtype\": \"%s\", \"B\": %d, "
                    "\"H\": %d, \"S\": %lld, \"D\": %d, \"causal\": %d, \"blocks\": %lld, "
                    "\"density\": %.4f, \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
                    "\"reps\": %d, \"tflops_actual\": %.1f, \"us_per_head\": %.2f, "
                    "\"check\": \"%s\"}\n",
                    bc.name, kVariants[var].name, c.bf16 ? "bf16" : "fp16", c.B, c.Hq,
                    (long long)c.Sq, c.D, c.causal, (long long)blocks, blocks / dense_blocks, med,
                    v.front(), v.back(), reps, tf, med * 1e3 / (c.B * c.Hq), bad ? "fail" : "ok");
    }
    cudaFree(d.q);
    cudaFree(d.k);
    cudaFree(d.v);
    cudaFree(d.o);
    cudaFree(d.lse);
    cudaFree(d.off);
    cudaFree(d.idx);
    cudaFree(d.order);
    cudaFree(d.counter);
    return bad != 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "check";
    if (!strcmp(mode, "layouts")) { /* host only: layout statistics */
        for (const Bench &b : kBenches) {
            Layout L;
            build_layout(L, b.kind, 1, b.per_head ? b.H : 1, b.S, b.S, b.causal, b.k_rand, b.window);
            int64_t blocks = 0;
            host_tile_order(L, b.B, b.H, b.per_head ? 1 : b.H, &blocks, L.off.back());
            printf("%-32s rows %d cols %d blocks/row %.2f density %.3f\n", b.name, L.rb, L.cb,
                   (double)blocks / ((double)b.B * b.H * L.rb),
                   (double)blocks / ((double)b.B * b.H * L.rb * L.cb));
        }
        for (const Case &c : kChecks) {
            Layout L;
            build_layout(L, c.kind, c.lay_batch_full ? c.B : 1, c.lay_heads, c.Sq, c.Sk, c.causal,
                         c.k_rand, c.window);
            printf("%-34s nnz %d rows %zu first row %d..%d\n", c.name, (int)L.idx.size(),
                   L.off.size() - 1, L.off[0], L.off[1]);
        }
        return 0;
    }
    if (getenv("SK_HARNESS_TIMEOUT")) g_timeout = atof(getenv("SK_HARNESS_TIMEOUT"));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
           prop.minor);
    int fails = 0;
    if (!strcmp(mode, "check")) {
        const int quick = argc > 2 && !strcmp(argv[2], "quick");
        const int n = (int)(sizeof kChecks / sizeof kChecks[0]);
        if (quick) {
            for (int a : kQuick) fails += run_check(kChecks[a], 1);
        } else {
            for (int a = 0; a < n; ++a)
                if (argc <= 2 || strstr(kChecks[a].name, argv[2])) fails += run_check(kChecks[a], 1);
        }
        printf("check: %d failed\n", fails);
    } else if (!strcmp(mode, "bench")) {
        FILE *json = NULL;
        const char *jp = getenv("SK_BENCH_JSON");
        if (jp) json = fopen(jp, "w");
        const int reps = getenv("SK_BENCH_REPS") ? atoi(getenv("SK_BENCH_REPS")) : 20;
        g_randn = getenv("SK_BENCH_RANDN") && atoi(getenv("SK_BENCH_RANDN")) != 0;
        printf("inputs: %s\n", g_randn ? "N(0,1) (SK_BENCH_RANDN)" : "k/128 - 1");
        /* The filter: substrings separated by commas, any of which selects a case. */
        for (const Bench &b : kBenches) {
            int sel = argc <= 2;
            for (const char *f = argc > 2 ? argv[2] : ""; !sel && *f;) {
                const char *e = strchr(f, ',');
                const size_t len = e ? (size_t)(e - f) : strlen(f);
                char part[128];
                snprintf(part, sizeof part, "%.*s", (int)len, f);
                sel = len > 0 && strstr(b.name, part) != NULL;
                f += e ? len + 1 : len;
            }
            if (sel) fails += run_bench(b, reps, json);
        }
        if (json) fclose(json);
        printf("bench: %d failed checks\n", fails);
    }
    return fails ? 1 : 0;
}
