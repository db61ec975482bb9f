// Layer norm and RMS norm over the last axis, forward and backward. One
// block per row; the parameter gradients are summed over row chunks into
// f32 partials and the chunks added in order (deterministic). Mirrors
// runtime/src/cpu/kernels/norm.rs.

// y = (x - mean) * rstd * gamma (+ beta); beta may be null.
extern "C" __global__ void ln_fwd(const void* x, int xdt, const void* g, int gdt, const void* b,
                                  int bdt, void* y, int ydt, i64 rows, int d, float eps) {
    __shared__ float sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 base = r * d;
        float s = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) s += ldf(x, xdt, base + j);
        const float mean = block_sum(s, sh) / (float)d;
        float q = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float c = ldf(x, xdt, base + j) - mean;
            q += c * c;
        }
        const float rstd = 1.0f / sqrtf(block_sum(q, sh) / (float)d + eps);
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float v = (ldf(x, xdt, base + j) - mean) * rstd * ldf(g, gdt, j);
            if (b) v += ldf(b, bdt, j);
            stf(y, ydt, base + j, v);
        }
    }
}

// y = x * rsqrt(mean(x^2) + eps) * gamma.
extern "C" __global__ void rms_fwd(const void* x, int xdt, const void* g, int gdt, void* y,
                                   int ydt, i64 rows, int d, float eps) {
    __shared__ float sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 base = r * d;
        float q = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float v = ldf(x, xdt, base + j);
            q += v * v;
        }
        const float rr = 1.0f / sqrtf(block_sum(q, sh) / (float)d + eps);
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            stf(y, ydt, base + j, ldf(x, xdt, base + j) * rr * ldf(g, gdt, j));
        }
    }
}

// dx of layer norm (rms = 0) or RMS norm (rms = 1); leaves (shift, scale)
// per row in stats so that xhat = (x - shift) * scale.
extern "C" __global__ void norm_bwd_dx(const void* x, int xdt, const void* g, int gdt,
                                       const void* dy, int dydt, void* dx, int dxdt, i64 rows,
                                       int d, float eps, int rms, float* stats) {
    __shared__ float sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 base = r * d;
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            for (int j = threadIdx.x; j < d; j += blockDim.x) s += ldf(x, xdt, base + j);
            mean = block_sum(s, sh) / (float)d;
        }
        float q = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float c = ldf(x, xdt, base + j) - mean;
            q += c * c;
        }
        const float scale = 1.0f / sqrtf(block_sum(q, sh) / (float)d + eps);
        // Layer norm: mean(gy) and mean(gy * xhat); RMS: mean(gy * x).
        float s1 = 0.0f, s2 = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float xv = ldf(x, xdt, base + j);
            float gy = ldf(dy, dydt, base + j) * ldf(g, gdt, j);
            s1 += gy;
            s2 += gy * (rms ? xv : (xv - mean) * scale);
        }
        const float mg = block_sum(s1, sh) / (float)d;
        const float mgx = block_sum(s2, sh) / (float)d;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float xv = ldf(x, xdt, base + j);
            float gy = ldf(dy, dydt, base + j) * ldf(g, gdt, j);
            float v = rms ? scale * gy - xv * (scale * scale * scale * mgx)
                          : scale * (gy - mg - (xv - mean) * scale * mgx);
            stf(dx, dxdt, base + j, v);
        }
        if (threadIdx.x == 0) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = scale;
        }
    }
}

// Partial parameter gradients of the rows of chunk blockIdx.y (of gridDim.y
// chunks): part[c * d + j] = sum dy * xhat, part[(chunks + c) * d + j] =
// sum dy (dbeta, when has_beta).
extern "C" __global__ void norm_bwd_params_partial(const void* x, int xdt, const void* dy,
                                                   int dydt, i64 rows, int d,
                                                   const float* stats, float* part,
                                                   int has_beta) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const i64 chunks = gridDim.y, c = blockIdx.y;
    if (j >= d) return;
    const i64 per = (rows + chunks - 1) / chunks;
    const i64 r0 = c * per, r1 = r0 + per < rows ? r0 + per : rows;
    float sg = 0.0f, sb = 0.0f;
    for (i64 r = r0; r < r1; ++r) {
        float g = ldf(dy, dydt, r * d + j);
        sg += g * ((ldf(x, xdt, r * d + j) - stats[2 * r]) * stats[2 * r + 1]);
        sb += g;
    }
    part[c * d + j] = sg;
    if (has_beta) part[(chunks + c) * d + j] = sb;
}

// dgamma (and dbeta) = the chunks' partials added in chunk order.
extern "C" __global__ void norm_bwd_params_finish(const float* part, int chunks, int d,
                                                  void* dg, int dgdt, void* db, int dbdt) {
    GRID_STRIDE(j, d) {
        float sg = 0.0f, sb = 0.0f;
        for (int c = 0; c < chunks; ++c) {
            sg += part[(i64)c * d + j];
            if (db) sb += part[(i64)(chunks + c) * d + j];
        }
        stf(dg, dgdt, j, sg);
        if (db) stf(db, dbdt, j, sb);
    }
}
