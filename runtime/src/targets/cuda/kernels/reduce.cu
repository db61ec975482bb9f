// Reductions onto a kept shape: `Reduce` (sum, mean, max), `SumTo` (the
// inverse of broadcasting) and `ReduceMaxGrad`. One thread per output
// element walks its reduced elements in row-major order, the order the
// CPU adds them in. Mirrors runtime/src/cpu/kernels/reduce.rs.

// The kept dimensions (the output's, row-major) and the reduced ones, with
// the input's element strides of each. Mirrors `cuda::geometry::RGeo`.
struct RGeo {
    int nk;
    int nr;
    i64 kdims[MAXD];
    i64 kst[MAXD];
    i64 rdims[MAXD];
    i64 rst[MAXD];
    i64 count; // reduced elements per output
};

__device__ __forceinline__ i64 kept_offset(const RGeo& g, i64 o) {
    i64 off = 0;
    for (int d = g.nk - 1; d >= 0; --d) {
        off += (o % g.kdims[d]) * g.kst[d];
        o /= g.kdims[d];
    }
    return off;
}

__device__ __forceinline__ i64 reduced_offset(const RGeo& g, i64 r) {
    i64 off = 0;
    for (int d = g.nr - 1; d >= 0; --d) {
        off += (r % g.rdims[d]) * g.rst[d];
        r /= g.rdims[d];
    }
    return off;
}

// f: 0 sum, 1 mean, 2 max.
extern "C" __global__ void reduce_to(const void* x, int xdt, void* y, int ydt, i64 n_out, int f,
                                     RGeo g) {
    GRID_STRIDE(o, n_out) {
        i64 base = kept_offset(g, o);
        float acc = f == 2 ? NEG_INF : 0.0f;
        for (i64 r = 0; r < g.count; ++r) {
            float v = ldf(x, xdt, base + reduced_offset(g, r));
            acc = f == 2 ? fmaxf(acc, v) : acc + v;
        }
        if (f == 1 && g.count > 0) acc /= (float)g.count;
        stf(y, ydt, o, acc);
    }
}

// dx: dy routed to the first arg-max (row-major) of each output, zero
// elsewhere; dx has x's layout.
extern "C" __global__ void reduce_max_grad(const void* x, int xdt, const void* y, int ydt,
                                           const void* dy, int dydt, void* dx, int dxdt,
                                           i64 n_out, RGeo g) {
    GRID_STRIDE(o, n_out) {
        i64 base = kept_offset(g, o);
        float m = ldf(y, ydt, o), d = ldf(dy, dydt, o);
        bool taken = false;
        for (i64 r = 0; r < g.count; ++r) {
            i64 at = base + reduced_offset(g, r);
            bool hit = !taken && ldf(x, xdt, at) == m;
            taken = taken || hit;
            stf(dx, dxdt, at, hit ? d : 0.0f);
        }
    }
}

// The chunked form for long reductions: chunk blockIdx.y of gridDim.y
// reduces its share of each output's reduced elements (in order) into
// part[chunk * n_out + o]; reduce_finish then combines the chunks in order.
extern "C" __global__ void reduce_partial(const void* x, int xdt, float* part, i64 n_out, int f,
                                          RGeo g) {
    const i64 chunks = gridDim.y, c = blockIdx.y;
    const i64 per = (g.count + chunks - 1) / chunks;
    const i64 r0 = c * per, r1 = r0 + per < g.count ? r0 + per : g.count;
    for (i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x; o < n_out; o += (i64)gridDim.x * blockDim.x) {
        i64 base = kept_offset(g, o);
        float acc = f == 2 ? NEG_INF : 0.0f;
        for (i64 r = r0; r < r1; ++r) {
            float v = ldf(x, xdt, base + reduced_offset(g, r));
            acc = f == 2 ? fmaxf(acc, v) : acc + v;
        }
        part[c * n_out + o] = acc;
    }
}

// y[o] = the chunks' partials combined in chunk order (mean: / count).
extern "C" __global__ void reduce_finish(const float* part, int chunks, void* y, int ydt, i64 n_out,
                                         int f, i64 count) {
    GRID_STRIDE(o, n_out) {
        float acc = f == 2 ? NEG_INF : 0.0f;
        for (int c = 0; c < chunks; ++c) {
            float v = part[(i64)c * n_out + o];
            acc = f == 2 ? fmaxf(acc, v) : acc + v;
        }
        if (f == 1 && count > 0) acc /= (float)count;
        stf(y, ydt, o, acc);
    }
}
