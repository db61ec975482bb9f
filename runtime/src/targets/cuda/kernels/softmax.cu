// Softmax and log-softmax along any axis, forward and backward. The tensor
// is seen as [outer, len, inner]: one block per (outer, inner) row, whose
// elements lie `inner` apart. Mirrors runtime/src/cpu/kernels/softmax.rs.

// log = 0: y = softmax(x); log = 1: y = log_softmax(x).
extern "C" __global__ void softmax_fwd(const void* x, int xdt, void* y, int ydt, i64 outer,
                                       i64 len, i64 inner, int log) {
    __shared__ float sh[32];
    for (i64 row = blockIdx.x; row < outer * inner; row += gridDim.x) {
        const i64 base = (row / inner) * len * inner + row % inner;
        float m, s;
        row_max_sum_exp(x, xdt, base, len, inner, sh, &m, &s);
        const float ls = logf(s), inv = 1.0f / s;
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
            float v = ldf(x, xdt, base + j * inner) - m;
            stf(y, ydt, base + j * inner, log ? v - ls : expf(v) * inv);
        }
    }
}

// From the forward output y: softmax dx = y * (dy - sum(y * dy));
// log-softmax dx = dy - exp(y) * sum(dy).
extern "C" __global__ void softmax_bwd(const void* y, int ydt, const void* dy, int dydt, void* dx,
                                       int dxdt, i64 outer, i64 len, i64 inner, int log) {
    __shared__ float sh[32];
    for (i64 row = blockIdx.x; row < outer * inner; row += gridDim.x) {
        const i64 base = (row / inner) * len * inner + row % inner;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
            float g = ldf(dy, dydt, base + j * inner);
            s += log ? g : g * ldf(y, ydt, base + j * inner);
        }
        s = block_sum(s, sh);
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
            float yv = ldf(y, ydt, base + j * inner), g = ldf(dy, dydt, base + j * inner);
            stf(dx, dxdt, base + j * inner, log ? g - expf(yv) * s : yv * (g - s));
        }
    }
}
