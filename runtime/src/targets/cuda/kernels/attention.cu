// Scaled dot-product attention over q [BH, sq, d], k [BH, sk, d],
// v [BH, sk, dv], optionally causal (query i sees keys j <= i), forward and
// backward, fused and memory-efficient (flash-attention style): one warp
// per query (or key) row, the other side streamed through shared memory
// in tiles of T rows, softmax online (running max and sum). No sq x sk
// matrix exists anywhere; the backward keeps two floats per query row
// (log-sum-exp and delta = dy . o). d and dv are at most 256 (8 elements
// per lane). Mirrors runtime/src/cpu/kernels/attention.rs.

#define WARPS 8
#define PER_LANE 8

// Loads rows [r0, r0 + t) of a [rows, w] matrix (type dt) into sh as f32.
__device__ __forceinline__ void load_tile(const void* src, int dt, i64 base, i64 r0, int t,
                                          i64 rows, int w, float* sh) {
    for (int e = threadIdx.x; e < t * w; e += blockDim.x) {
        i64 r = r0 + e / w;
        sh[e] = r < rows ? ldf(src, dt, base + r * w + e % w) : 0.0f;
    }
}

// Lane's share of a dot product of a register row and a shared-memory row,
// summed over the warp (every lane gets the total).
__device__ __forceinline__ float warp_dot(const float* reg, const float* row, int w) {
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) {
        int e = lane + 32 * c;
        if (e < w) s += reg[c] * row[e];
    }
    return warp_sum(s);
}

__device__ __forceinline__ void load_row(const void* src, int dt, i64 at, int w, float* reg) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) {
        int e = lane + 32 * c;
        reg[c] = e < w ? ldf(src, dt, at + e) : 0.0f;
    }
}

__device__ __forceinline__ void store_row(void* dst, int dt, i64 at, int w, const float* reg,
                                          float mul) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) {
        int e = lane + 32 * c;
        if (e < w) stf(dst, dt, at + e, reg[c] * mul);
    }
}

// Forward: o = softmax(scale * q k^T [masked]) v. With lse non-null also
// lse[row] = log-sum-exp of the scaled scores; with delta non-null also
// delta[row] = dy[row] . o[row] (the backward's statistics; o may then be
// null). Grid: (ceil(sq / WARPS), BH); block WARPS * 32; dynamic shared
// memory t * (d + dv) floats.
extern "C" __global__ void attn_fwd(const void* q, const void* k, const void* v, int xdt, void* o,
                                    int odt, i64 sq, i64 sk, int d, int dv, float scale,
                                    int causal, int t, float* lse, const void* dy, int dydt,
                                    float* delta) {
    extern __shared__ float sh[];
    float* ks = sh;
    float* vs = sh + t * d;
    const int warp = threadIdx.x >> 5;
    const i64 bh = blockIdx.y, row = (i64)blockIdx.x * WARPS + warp;
    const bool live = row < sq;
    float qr[PER_LANE], acc[PER_LANE];
    if (live) load_row(q, xdt, (bh * sq + row) * d, d, qr);
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) acc[c] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    i64 last_row = (i64)blockIdx.x * WARPS + WARPS - 1;
    if (last_row >= sq) last_row = sq - 1;
    const i64 kend = causal ? (last_row + 1 < sk ? last_row + 1 : sk) : sk;
    for (i64 j0 = 0; j0 < kend; j0 += t) {
        __syncthreads();
        load_tile(k, xdt, bh * sk * d, j0, t, sk, d, ks);
        load_tile(v, xdt, bh * sk * dv, j0, t, sk, dv, vs);
        __syncthreads();
        if (!live) continue;
        i64 jend = j0 + t < sk ? j0 + t : sk;
        if (causal && jend > row + 1) jend = row + 1;
        for (i64 j = j0; j < jend; ++j) {
            const float s = warp_dot(qr, ks + (j - j0) * d, d) * scale;
            const float mn = fmaxf(m, s);
            const float corr = expf(m - mn), p = expf(s - mn);
            l = l * corr + p;
            const float* vr = vs + (j - j0) * dv;
            const int lane = threadIdx.x & 31;
#pragma unroll
            for (int c = 0; c < PER_LANE; ++c) {
                int e = lane + 32 * c;
                acc[c] = acc[c] * corr + (e < dv ? p * vr[e] : 0.0f);
            }
            m = mn;
        }
    }
    if (!live) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (o) store_row(o, odt, (bh * sq + row) * dv, dv, acc, inv);
    const i64 r = bh * sq + row;
    if (lse && (threadIdx.x & 31) == 0) lse[r] = m + logf(l);
    if (delta) {
        float dyr[PER_LANE];
        load_row(dy, dydt, r * dv, dv, dyr);
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < PER_LANE; ++c) s += dyr[c] * acc[c] * inv;
        s = warp_sum(s);
        if ((threadIdx.x & 31) == 0) delta[r] = s;
    }
}

// Backward, dq: per query row i, dq = scale * sum_j p_ij (dy_i . v_j - D_i) k_j
// with p_ij = exp(scale q_i . k_j - lse_i). Launch as attn_fwd.
extern "C" __global__ void attn_bwd_dq(const void* q, const void* k, const void* v, int xdt,
                                       const void* dy, int dydt, const float* lse,
                                       const float* delta, void* dq, int odt, i64 sq, i64 sk,
                                       int d, int dv, float scale, int causal, int t) {
    extern __shared__ float sh[];
    float* ks = sh;
    float* vs = sh + t * d;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 bh = blockIdx.y, row = (i64)blockIdx.x * WARPS + warp;
    const bool live = row < sq;
    float qr[PER_LANE], dyr[PER_LANE], acc[PER_LANE];
    float li = 0.0f, di = 0.0f;
    if (live) {
        load_row(q, xdt, (bh * sq + row) * d, d, qr);
        load_row(dy, dydt, (bh * sq + row) * dv, dv, dyr);
        li = lse[bh * sq + row];
        di = delta[bh * sq + row];
    }
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) acc[c] = 0.0f;
    i64 last_row = (i64)blockIdx.x * WARPS + WARPS - 1;
    if (last_row >= sq) last_row = sq - 1;
    const i64 kend = causal ? (last_row + 1 < sk ? last_row + 1 : sk) : sk;
    for (i64 j0 = 0; j0 < kend; j0 += t) {
        __syncthreads();
        load_tile(k, xdt, bh * sk * d, j0, t, sk, d, ks);
        load_tile(v, xdt, bh * sk * dv, j0, t, sk, dv, vs);
        __syncthreads();
        if (!live) continue;
        i64 jend = j0 + t < sk ? j0 + t : sk;
        if (causal && jend > row + 1) jend = row + 1;
        for (i64 j = j0; j < jend; ++j) {
            const float* kr = ks + (j - j0) * d;
            const float p = expf(warp_dot(qr, kr, d) * scale - li);
            const float ds = p * (warp_dot(dyr, vs + (j - j0) * dv, dv) - di);
#pragma unroll
            for (int c = 0; c < PER_LANE; ++c) {
                int e = lane + 32 * c;
                if (e < d) acc[c] += ds * kr[e];
            }
        }
    }
    if (live) store_row(dq, odt, (bh * sq + row) * d, d, acc, scale);
}

// Backward, dk and dv: per key row j, dv = sum_i p_ij dy_i and
// dk = scale * sum_i p_ij (dy_i . v_j - D_i) q_i, over the queries that see
// j. Grid: (ceil(sk / WARPS), BH); dynamic shared memory
// t * (d + dv + 2) floats (q, dy, lse and delta tiles).
extern "C" __global__ void attn_bwd_dkdv(const void* q, const void* k, const void* v, int xdt,
                                         const void* dy, int dydt, const float* lse,
                                         const float* delta, void* dk, void* dvo, int odt,
                                         i64 sq, i64 sk, int d, int dv, float scale, int causal,
                                         int t) {
    extern __shared__ float sh[];
    float* qs = sh;
    float* dys = sh + t * d;
    float* ls = dys + t * dv;
    float* ds_ = ls + t;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 bh = blockIdx.y, col = (i64)blockIdx.x * WARPS + warp;
    const bool live = col < sk;
    float kr[PER_LANE], vr[PER_LANE], dka[PER_LANE], dva[PER_LANE];
    if (live) {
        load_row(k, xdt, (bh * sk + col) * d, d, kr);
        load_row(v, xdt, (bh * sk + col) * dv, dv, vr);
    }
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) { dka[c] = 0.0f; dva[c] = 0.0f; }
    // Causal: the first query that sees the block's first key is that key.
    const i64 first = causal ? (i64)blockIdx.x * WARPS : 0;
    for (i64 i0 = first; i0 < sq; i0 += t) {
        __syncthreads();
        load_tile(q, xdt, bh * sq * d, i0, t, sq, d, qs);
        load_tile(dy, dydt, bh * sq * dv, i0, t, sq, dv, dys);
        for (int e = threadIdx.x; e < t; e += blockDim.x) {
            i64 r = i0 + e;
            ls[e] = r < sq ? lse[bh * sq + r] : 0.0f;
            ds_[e] = r < sq ? delta[bh * sq + r] : 0.0f;
        }
        __syncthreads();
        if (!live) continue;
        i64 istart = i0;
        if (causal && istart < col) istart = col;
        const i64 iend = i0 + t < sq ? i0 + t : sq;
        for (i64 i = istart; i < iend; ++i) {
            const float* qrow = qs + (i - i0) * d;
            const float* dyrow = dys + (i - i0) * dv;
            const float p = expf(warp_dot(kr, qrow, d) * scale - ls[i - i0]);
            const float dsv = p * (warp_dot(vr, dyrow, dv) - ds_[i - i0]);
#pragma unroll
            for (int c = 0; c < PER_LANE; ++c) {
                int e = lane + 32 * c;
                if (e < dv) dva[c] += p * dyrow[e];
                if (e < d) dka[c] += dsv * qrow[e];
            }
        }
    }
    if (!live) return;
    store_row(dk, odt, (bh * sk + col) * d, d, dka, scale);
    store_row(dvo, odt, (bh * sk + col) * dv, dv, dva, 1.0f);
}
