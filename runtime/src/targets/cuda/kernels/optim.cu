// The optimizer updates over flat f32 shards (AdamW, SGD with or without
// momentum) and the gradient-clipping helpers: the sum of squares of
// gradient buffers and the scaling by PyTorch's clip coefficient. Mirrors
// runtime/src/optim.rs; the gradient may be bf16/f16 (no_shard mixed
// precision), read as f32.

// AdamW, element by element, with host-computed constants (see optim.rs):
// p *= decay; m = lerp(m, g, w1); v = v * b2 + w2 * g^2;
// p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
extern "C" __global__ void adamw(float* p, const void* g, int gdt, float* m, float* v, i64 n,
                                 float decay, float w1, float b2, float w2, float bc2_sqrt,
                                 float step_size, float eps) {
    GRID_STRIDE(i, n) {
        float gi = ldf(g, gdt, i);
        float pi = p[i] * decay;
        float mi = m[i];
        mi = fabsf(w1) < 0.5f ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1.0f - w1);
        float vi = v[i] * b2 + w2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        pi += -step_size * (mi / denom);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

// SGD: d = g + wd * p; with momentum buf = momentum * buf + d, p -= lr * buf;
// without (buf null) p -= lr * d.
extern "C" __global__ void sgd(float* p, const void* g, int gdt, float* buf, i64 n, float lr,
                               float momentum, float wd) {
    GRID_STRIDE(i, n) {
        float d = ldf(g, gdt, i) + wd * p[i];
        if (buf) {
            float b = momentum * buf[i] + d;
            buf[i] = b;
            p[i] -= lr * b;
        } else {
            p[i] -= lr * d;
        }
    }
}

// part[blockIdx.x] = sum of x^2 (f64) over this block's grid-stride share.
extern "C" __global__ void sumsq_partial(const void* x, int dt, i64 n, double* part) {
    __shared__ double sh[32];
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)ldf(x, dt, i);
        s += v * v;
    }
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// One block: *total += sum of the parts (in order); with store, also
// *out = (float)*total.
extern "C" __global__ void sumsq_finish(const double* part, int nparts, double* total, float* out,
                                        int store) {
    if (threadIdx.x != 0) return;
    double s = *total;
    for (int k = 0; k < nparts; ++k) s += part[k];
    *total = s;
    if (store) *out = (float)s;
}

// grads *= min(1, max_norm / (sqrt(*norm_sq) + 1e-6)), NaN when the norm is
// not finite (PyTorch's clip_grad_norm_), skipped when the coefficient is 1.
extern "C" __global__ void clip(void* grads, int dt, i64 n, const float* norm_sq,
                                double max_norm) {
    double norm = sqrt((double)*norm_sq);
    float c;
    if (!(norm - norm == 0.0)) c = __int_as_float(0x7fc00000);
    else {
        double k = max_norm / (norm + 1e-6);
        c = (float)(k < 1.0 ? k : 1.0);
    }
    if (c == 1.0f) return;
    GRID_STRIDE(i, n) { stf(grads, dt, i, ldf(grads, dt, i) * c); }
}
