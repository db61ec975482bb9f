// fsdpc CUDA prelude: element types and their conversions, the index
// geometry every strided kernel takes, warp and block reductions.
// Prepended to every kernel file before NVRTC compiles it; it includes no
// header, so it compiles with NVRTC alone (no CUDA toolkit headers).
//
// Element types travel as runtime codes (the `DT_*` below, the order of
// `fsdpc_ir::DType`): kernels read any float operand as f32 and write it
// back rounded to nearest even, so one kernel serves f32, bf16 and f16.

typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;
typedef unsigned long long u64;

#define DT_F32 0
#define DT_BF16 1
#define DT_F16 2
#define DT_I64 3
#define DT_I32 4
#define DT_BOOL 5

#define MAXD 8
#define NEG_INF __int_as_float(0xff800000)

// Error codes a kernel leaves in the stream's error word (first one wins).
#define ERR_INDEX 1
#define ERR_LABEL 2
#define ERR_INT_DIV 3

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((unsigned)h) << 16);
}

// Round to nearest even, NaN kept quiet (what `half::bf16::from_f32` does).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Element i of a buffer of type dt, as f32.
__device__ __forceinline__ float ldf(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float*)p)[i];
    case DT_BF16: return bf16_to_f32(((const u16*)p)[i]);
    case DT_F16: return f16_to_f32(((const u16*)p)[i]);
    case DT_I64: return (float)((const i64*)p)[i];
    case DT_I32: return (float)((const int*)p)[i];
    default: return (float)((const u8*)p)[i];
    }
}

// Element i as f64 (exact for every type but i64 beyond 2^53).
__device__ __forceinline__ double ldd(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_I64: return (double)((const i64*)p)[i];
    case DT_I32: return (double)((const int*)p)[i];
    default: return (double)ldf(p, dt, i);
    }
}

// Element i as an integer (floats truncate toward zero, NaN is 0).
__device__ __forceinline__ i64 ldi(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_I64: return ((const i64*)p)[i];
    case DT_I32: return (i64)((const int*)p)[i];
    case DT_BOOL: return (i64)((const u8*)p)[i];
    default: {
        float v = ldf(p, dt, i);
        return v != v ? 0 : (i64)v;
    }
    }
}

// Stores f32 v at element i of a buffer of type dt.
__device__ __forceinline__ void stf(void* p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float*)p)[i] = v; break;
    case DT_BF16: ((u16*)p)[i] = f32_to_bf16(v); break;
    case DT_F16: ((u16*)p)[i] = f32_to_f16(v); break;
    case DT_I64: ((i64*)p)[i] = (i64)v; break;
    case DT_I32: ((int*)p)[i] = (int)v; break;
    default: ((u8*)p)[i] = (u8)(v != 0.0f); break;
    }
}

// Stores integer v at element i (exact for integer types).
__device__ __forceinline__ void sti(void* p, int dt, i64 i, i64 v) {
    switch (dt) {
    case DT_I64: ((i64*)p)[i] = v; break;
    case DT_I32: ((int*)p)[i] = (int)v; break;
    case DT_BOOL: ((u8*)p)[i] = (u8)(v != 0); break;
    default: stf(p, dt, i, (float)v); break;
    }
}

// Copies one element of es bytes.
__device__ __forceinline__ void copy_elem(void* dst, i64 di, const void* src, i64 si, int es) {
    switch (es) {
    case 1: ((u8*)dst)[di] = ((const u8*)src)[si]; break;
    case 2: ((u16*)dst)[di] = ((const u16*)src)[si]; break;
    case 4: ((unsigned*)dst)[di] = ((const unsigned*)src)[si]; break;
    default: ((u64*)dst)[di] = ((const u64*)src)[si]; break;
    }
}

// Records the first error of a launch in the stream's error word.
__device__ __forceinline__ void fail(int* err, int code) {
    if (err) atomicCAS(err, 0, code);
}

// The iteration space of a strided kernel: `nd` dimensions and, for up to
// four operands, the element stride of each dimension (0: broadcast).
// Mirrors `cuda::geometry::Geo` (repr(C)).
struct Geo {
    int nd;
    int pad;
    i64 dims[MAXD];
    i64 st[4][MAXD];
};

// The element offsets of linear index o in operands 0..n.
__device__ __forceinline__ void offsets(const Geo& g, i64 o, int n, i64* off) {
    for (int k = 0; k < n; ++k) off[k] = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
        i64 c = o % g.dims[d];
        o /= g.dims[d];
        for (int k = 0; k < n; ++k) off[k] += c * g.st[k][d];
    }
}

// A 2-D sliding window over [h, w] planes giving [oh, ow] ones: fsdpc_ir's
// `Window2d` with its sizes. Tap (a, b) of output (i, j) reads input row
// i * sh + a * dh - pt and column j * sw + b * dw - pl (outside the input:
// padding); pb and pr pad the bottom and right. Mirrors
// `cuda::geometry::Win` (repr(C)).
struct Win {
    int h, w, oh, ow;
    int kh, kw, sh, sw, dh, dw;
    int pt, pl, pb, pr;
};

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum (every thread gets it); blockDim.x a multiple of 32, at
// most 1024. `sh` is 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : NEG_INF;
    return warp_max(v);
}

// The maximum m of row x[base + j * stride] (j < len) and the sum of
// exp(x - m) over it, block-wide (every thread gets both). `sh` is 32
// floats of shared memory.
__device__ __forceinline__ void row_max_sum_exp(const void* x, int dt, i64 base, i64 len,
                                                i64 stride, float* sh, float* m_out,
                                                float* s_out) {
    float m = NEG_INF;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, ldf(x, dt, base + j * stride));
    m = block_max(m, sh);
    float s = 0.0f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += expf(ldf(x, dt, base + j * stride) - m);
    *m_out = m;
    *s_out = block_sum(s, sh);
}

__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(v);
}
