// Max and average pooling over [planes, h, w], forward and backward.
// Forward: one thread per output. Backward: one thread per input element,
// gathering the outputs whose windows read it in their row-major order (no
// atomics; the CPU's summation order). A max window keeps its first
// maximum in row-major order, a NaN replacing any value. Mirrors
// runtime/src/cpu/kernels/pool.rs.

// The in-plane index of tap (a, b) of output (i, j), or -1 in the padding.
__device__ __forceinline__ i64 pool_tap(const Win& g, i64 i, i64 j, int a, int b) {
    const i64 r = i * g.sh + (i64)a * g.dh - g.pt, c = j * g.sw + (i64)b * g.dw - g.pl;
    return (r >= 0 && r < g.h && c >= 0 && c < g.w) ? r * g.w + c : -1;
}

// The in-plane index of output (i, j)'s first maximum (-1 if its window
// holds no input element, which `Window2d::out_len` rules out).
__device__ __forceinline__ i64 pool_arg_max(const Win& g, const void* x, int xdt, i64 base,
                                            i64 i, i64 j) {
    i64 best = -1;
    float bv = 0.0f;
    for (int a = 0; a < g.kh; ++a) {
        for (int b = 0; b < g.kw; ++b) {
            const i64 k = pool_tap(g, i, j, a, b);
            if (k < 0) continue;
            const float v = ldf(x, xdt, base + k);
            if (best < 0 || v > bv || v != v) {
                best = k;
                bv = v;
            }
        }
    }
    return best;
}

// Taps of output position i along one axis (stride s, dilation d, kernel
// k, pads p0 and p1) inside an input of len, or inside the padded input
// when include_pad: an average's divisor along that axis.
__device__ __forceinline__ int pool_count(i64 i, int s, int d, int k, int p0, int p1, int len,
                                          int include_pad) {
    const i64 lo = include_pad ? -(i64)p0 : 0, hi = include_pad ? (i64)len + p1 : len;
    int n = 0;
    for (int a = 0; a < k; ++a) {
        const i64 r = i * s + (i64)a * d - p0;
        n += (r >= lo && r < hi);
    }
    return n;
}

__device__ __forceinline__ float pool_divisor(const Win& g, i64 i, i64 j, int include_pad) {
    return (float)(pool_count(i, g.sh, g.dh, g.kh, g.pt, g.pb, g.h, include_pad) *
                   pool_count(j, g.sw, g.dw, g.kw, g.pl, g.pr, g.w, include_pad));
}

// The outputs along one axis (of out) whose windows may read input
// position r: [*lo, *hi); `pool_tap` says which do.
__device__ __forceinline__ void pool_reach(i64 r, int s, int d, int k, int p, int out, i64* lo,
                                           i64* hi) {
    const i64 top = r + p, first = top - (i64)(k - 1) * d;
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    const i64 last = top / s + 1;
    *hi = last < out ? last : out;
}

// y = the maximum of each window.
extern "C" __global__ void maxpool_fwd(const void* x, int xdt, void* y, int ydt, i64 planes,
                                       Win g) {
    const i64 opix = (i64)g.oh * g.ow, plane = (i64)g.h * g.w;
    GRID_STRIDE(idx, planes * opix) {
        const i64 base = (idx / opix) * plane, i = (idx % opix) / g.ow, j = idx % g.ow;
        const i64 k = pool_arg_max(g, x, xdt, base, i, j);
        stf(y, ydt, idx, k < 0 ? NEG_INF : ldf(x, xdt, base + k));
    }
}

// dx[e] = the sum of dy over the outputs whose first maximum is e.
extern "C" __global__ void maxpool_bwd(const void* x, int xdt, const void* dy, int dydt,
                                       void* dx, int dxdt, i64 planes, Win g) {
    const i64 opix = (i64)g.oh * g.ow, plane = (i64)g.h * g.w;
    GRID_STRIDE(idx, planes * plane) {
        const i64 q = idx / plane, e = idx % plane, r = e / g.w, c = e % g.w;
        i64 i0, i1, j0, j1;
        pool_reach(r, g.sh, g.dh, g.kh, g.pt, g.oh, &i0, &i1);
        pool_reach(c, g.sw, g.dw, g.kw, g.pl, g.ow, &j0, &j1);
        float s = 0.0f;
        for (i64 i = i0; i < i1; ++i) {
            for (i64 j = j0; j < j1; ++j) {
                if (pool_arg_max(g, x, xdt, q * plane, i, j) == e) {
                    s += ldf(dy, dydt, q * opix + i * g.ow + j);
                }
            }
        }
        stf(dx, dxdt, idx, s);
    }
}

// y = the mean of each window over its counted taps.
extern "C" __global__ void avgpool_fwd(const void* x, int xdt, void* y, int ydt, i64 planes,
                                       Win g, int include_pad) {
    const i64 opix = (i64)g.oh * g.ow, plane = (i64)g.h * g.w;
    GRID_STRIDE(idx, planes * opix) {
        const i64 base = (idx / opix) * plane, i = (idx % opix) / g.ow, j = idx % g.ow;
        float s = 0.0f;
        for (int a = 0; a < g.kh; ++a) {
            for (int b = 0; b < g.kw; ++b) {
                const i64 k = pool_tap(g, i, j, a, b);
                if (k >= 0) s += ldf(x, xdt, base + k);
            }
        }
        stf(y, ydt, idx, s / pool_divisor(g, i, j, include_pad));
    }
}

// dx[e] = the sum of dy / divisor over the outputs whose windows read e.
extern "C" __global__ void avgpool_bwd(const void* dy, int dydt, void* dx, int dxdt, i64 planes,
                                       Win g, int include_pad) {
    const i64 opix = (i64)g.oh * g.ow, plane = (i64)g.h * g.w;
    GRID_STRIDE(idx, planes * plane) {
        const i64 q = idx / plane, e = idx % plane, r = e / g.w, c = e % g.w;
        i64 i0, i1, j0, j1;
        pool_reach(r, g.sh, g.dh, g.kh, g.pt, g.oh, &i0, &i1);
        pool_reach(c, g.sw, g.dw, g.kw, g.pl, g.ow, &j0, &j1);
        float s = 0.0f;
        for (i64 i = i0; i < i1; ++i) {
            const i64 ra = r + g.pt - i * g.sh;
            if (ra % g.dh != 0) continue;
            for (i64 j = j0; j < j1; ++j) {
                const i64 ca = c + g.pl - j * g.sw;
                if (ca % g.dw != 0) continue;
                s += ldf(dy, dydt, q * opix + i * g.ow + j) / pool_divisor(g, i, j, include_pad);
            }
        }
        stf(dx, dxdt, idx, s);
    }
}
