// Vocabulary parallelism: the embedding lookup and the logits' per-row
// statistics over the rows (columns) of the whole vocabulary this member
// holds from `offset` (one integer on the device). An index or label
// outside the whole vocabulary is reported through the error word. A
// padded vocabulary's columns past `whole` count in no statistic and get a
// zero gradient. Mirrors runtime/src/cpu/kernels/vocab.rs.

// Row of whole index i in this member's n rows from off, or -1 (another
// member's, or out of range: reported).
__device__ __forceinline__ i64 member_row(i64 i, i64 off, i64 n, i64 whole, int* err) {
    i64 r = i < 0 ? i + whole : i;
    if (r < 0 || r >= whole) {
        fail(err, ERR_INDEX);
        return -1;
    }
    r -= off;
    return (r >= 0 && r < n) ? r : -1;
}

// y[i, c] = table[idx[i] - off, c] where held, else 0; es-byte elements.
extern "C" __global__ void vocab_lookup_fwd(const void* table, const void* idx, int idt,
                                            const void* offset, int odt, void* y, int es, i64 n,
                                            i64 whole, i64 inner, i64 nidx, int* err) {
    const i64 off = ldi(offset, odt, 0);
    GRID_STRIDE(o, nidx * inner) {
        i64 c = o % inner, i = o / inner;
        i64 r = member_row(ldi(idx, idt, i), off, n, whole, err);
        if (r < 0) {
            for (int k = 0; k < es; ++k) ((u8*)y)[o * es + k] = 0;
        } else {
            copy_elem(y, o, table, r * inner + c, es);
        }
    }
}

// acc[idx[i] - off, c] += dy[i, c] where held, into an f32 accumulator
// zeroed before. Atomic: the order of additions into one row is not fixed.
extern "C" __global__ void vocab_lookup_bwd(const void* idx, int idt, const void* offset, int odt,
                                            const void* dy, int dydt, float* acc, i64 n,
                                            i64 whole, i64 inner, i64 nidx, int* err) {
    const i64 off = ldi(offset, odt, 0);
    GRID_STRIDE(o, nidx * inner) {
        i64 c = o % inner, i = o / inner;
        i64 r = member_row(ldi(idx, idt, i), off, n, whole, err);
        if (r >= 0) atomicAdd(&acc[r * inner + c], ldf(dy, dydt, o));
    }
}

// Column of row r's label in this member's c columns from off, or -1
// (ignored, another member's, or out of range: reported).
__device__ __forceinline__ i64 member_col(const void* labels, int ldt, i64 r, int has_ignore,
                                          i64 ignore, i64 off, i64 c, i64 whole, int* err) {
    i64 l = ldi(labels, ldt, r);
    if (has_ignore && l == ignore) return -1;
    if (l < 0 || l >= whole) {
        fail(err, ERR_LABEL);
        return -1;
    }
    l -= off;
    return (l >= 0 && l < c) ? l : -1;
}

// How many of this member's c columns from off are the whole vocabulary's
// (the rest are padding).
__device__ __forceinline__ i64 held_cols(i64 off, i64 c, i64 whole) {
    i64 h = whole - off;
    return h < 0 ? 0 : (h < c ? h : c);
}

// stats[r] = (max m, sum(exp(x - m)), x[label] or 0) over the columns
// held, one block per row.
extern "C" __global__ void vocab_stats(const void* logits, int xdt, const void* labels, int ldt,
                                       const void* offset, int odt, i64 rows, i64 c, i64 whole,
                                       int has_ignore, i64 ignore, float* stats, int* err) {
    __shared__ float sh[32];
    const i64 off = ldi(offset, odt, 0);
    const i64 held = held_cols(off, c, whole);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 base = r * c;
        float m, s;
        row_max_sum_exp(logits, xdt, base, held, 1, sh, &m, &s);
        if (threadIdx.x == 0) {
            i64 t = member_col(labels, ldt, r, has_ignore, ignore, off, c, whole, err);
            stats[3 * r] = m;
            stats[3 * r + 1] = s;
            stats[3 * r + 2] = t < 0 ? 0.0f : ldf(logits, xdt, base + t);
        }
    }
}

// dx = dstats[1] * exp(x - m), plus dstats[2] at the label's column and
// dstats[0] - dstats[1] * s at the row's first maximum, 0 at the padding;
// one block per row.
extern "C" __global__ void vocab_stats_bwd(const void* logits, int xdt, const void* labels,
                                           int ldt, const void* offset, int odt,
                                           const float* stats, const float* dstats, void* dx,
                                           int dxdt, i64 rows, i64 c, i64 whole, int has_ignore,
                                           i64 ignore, int* err) {
    __shared__ float sh[32];
    const i64 off = ldi(offset, odt, 0);
    const i64 held = held_cols(off, c, whole);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 base = r * c;
        const float m = stats[3 * r], s = stats[3 * r + 1];
        const float dm = dstats[3 * r], ds = dstats[3 * r + 1], dt = dstats[3 * r + 2];
        // The first column holding the maximum (columns are below 2^24).
        float first = NEG_INF;
        for (i64 j = threadIdx.x; j < held; j += blockDim.x)
            if (ldf(logits, xdt, base + j) == m) first = fmaxf(first, -(float)j);
        const float fa = -block_max(first, sh);
        const i64 a = held > 0 ? (i64)fa : -1;  // none held: no maximum
        const i64 t = member_col(labels, ldt, r, has_ignore, ignore, off, c, whole, err);
        for (i64 j = threadIdx.x; j < c; j += blockDim.x) {
            if (j >= held) {
                stf(dx, dxdt, base + j, 0.0f);
                continue;
            }
            float v = ds * expf(ldf(logits, xdt, base + j) - m);
            if (j == a) v += dm - ds * s;
            if (j == t) v += dt;
            stf(dx, dxdt, base + j, v);
        }
    }
}
