// Cross-entropy over the last axis of logits [rows, classes] with integer
// labels: the mean over the rows whose label is not ignored, and its
// gradient. Per-row losses go to scratch and one block adds them in row
// order in f64 (the CPU's order and precision). A label out of range is
// reported through the error word and its row counts as ignored. Mirrors
// runtime/src/cpu/kernels/loss.rs.

__device__ __forceinline__ bool row_class(const void* labels, int ldt, i64 r, int has_ignore,
                                          i64 ignore, i64 c, int* err, i64* t) {
    i64 l = ldi(labels, ldt, r);
    if (has_ignore && l == ignore) return false;
    if (l < 0 || l >= c) {
        fail(err, ERR_LABEL);
        return false;
    }
    *t = l;
    return true;
}

// row_loss[r] = logsumexp(row) - row[label] (0 for an ignored row),
// valid[r] = 1 if counted.
extern "C" __global__ void ce_rows(const void* logits, int xdt, const void* labels, int ldt,
                                   i64 rows, i64 c, int has_ignore, i64 ignore, double* row_loss,
                                   int* valid, int* err) {
    __shared__ float sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 t = 0;
        bool ok = row_class(labels, ldt, r, has_ignore, ignore, c, err, &t);
        if (!ok) {
            if (threadIdx.x == 0) { row_loss[r] = 0.0; valid[r] = 0; }
            continue;
        }
        const i64 base = r * c;
        float m, s;
        row_max_sum_exp(logits, xdt, base, c, 1, sh, &m, &s);
        if (threadIdx.x == 0) {
            row_loss[r] = (double)((m + logf(s)) - ldf(logits, xdt, base + t));
            valid[r] = 1;
        }
    }
}

// valid[r] = 1 where row r's label counts (the gradient's row count).
extern "C" __global__ void ce_valid(const void* labels, int ldt, i64 rows, i64 c, int has_ignore,
                                    i64 ignore, int* valid, int* err) {
    GRID_STRIDE(r, rows) {
        i64 t = 0;
        valid[r] = row_class(labels, ldt, r, has_ignore, ignore, c, err, &t) ? 1 : 0;
    }
}

// One block: loss = sum(row_loss) / count (row_loss may be null: count only) (0 when no row counts), and the
// count into *count.
extern "C" __global__ void ce_finish(const double* row_loss, const int* valid, i64 rows,
                                     float* loss, int* count) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    double s = 0.0;
    float n = 0.0f;
    // Each thread adds a contiguous run of rows, the runs then in order.
    const i64 per = (rows + blockDim.x - 1) / blockDim.x;
    const i64 r0 = threadIdx.x * per, r1 = r0 + per < rows ? r0 + per : rows;
    for (i64 r = r0; r < r1; ++r) {
        if (row_loss) s += row_loss[r];
        n += (float)valid[r];
    }
    s = block_sum_d(s, shd);
    n = block_sum(n, shf);
    if (threadIdx.x == 0) {
        int k = (int)n;
        if (count) *count = k;
        if (loss) *loss = k == 0 ? 0.0f : (float)(s / (double)k);
    }
}

// dlogits = (softmax(row) - onehot(label)) * dloss / count; zero rows for
// ignored labels. `count` comes from ce_finish.
extern "C" __global__ void ce_bwd(const void* logits, int xdt, const void* labels, int ldt,
                                  const float* dloss, const int* count, void* dx, int dxdt,
                                  i64 rows, i64 c, int has_ignore, i64 ignore, int* err) {
    __shared__ float sh[32];
    const int k = *count;
    const float scale = k == 0 ? 0.0f : *dloss / (float)k;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 base = r * c;
        i64 t = 0;
        bool ok = row_class(labels, ldt, r, has_ignore, ignore, c, err, &t);
        if (!ok) {
            for (i64 j = threadIdx.x; j < c; j += blockDim.x) stf(dx, dxdt, base + j, 0.0f);
            continue;
        }
        float m, s;
        row_max_sum_exp(logits, xdt, base, c, 1, sh, &m, &s);
        const float f = scale / s;
        for (i64 j = threadIdx.x; j < c; j += blockDim.x) {
            float v = expf(ldf(logits, xdt, base + j) - m) * f;
            if (j == t) v -= scale;
            stf(dx, dxdt, base + j, v);
        }
    }
}
