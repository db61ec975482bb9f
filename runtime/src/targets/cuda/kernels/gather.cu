// Gather along an axis (an embedding lookup is axis 0) and its gradient,
// a scatter-add. `data` is seen as [outer, n, inner]; an index may be
// negative (counted from the end); one out of range is reported through
// the error word and reads or adds nothing. Mirrors
// runtime/src/cpu/kernels/gather.rs.

__device__ __forceinline__ i64 resolve(i64 i, i64 n, int* err) {
    i64 r = i < 0 ? i + n : i;
    if (r < 0 || r >= n) {
        fail(err, ERR_INDEX);
        return -1;
    }
    return r;
}

// y[b, i, c] = data[b, idx[i], c], elements of es bytes.
extern "C" __global__ void gather_fwd(const void* data, const void* idx, int idt, void* y, int es,
                                      i64 outer, i64 n, i64 inner, i64 nidx, int* err) {
    GRID_STRIDE(o, outer * nidx * inner) {
        i64 c = o % inner, i = (o / inner) % nidx, b = o / (inner * nidx);
        i64 r = resolve(ldi(idx, idt, i), n, err);
        if (r < 0) {
            for (int k = 0; k < es; ++k) ((u8*)y)[o * es + k] = 0;
        } else {
            copy_elem(y, o, data, (b * n + r) * inner + c, es);
        }
    }
}

// acc[b, idx[i], c] += dy[b, i, c] into an f32 accumulator zeroed before
// (the output itself when it is f32). Atomic: the order of additions into
// one row is not fixed.
extern "C" __global__ void gather_bwd(const void* idx, int idt, const void* dy, int dydt,
                                      float* acc, i64 outer, i64 n, i64 inner, i64 nidx,
                                      int* err) {
    GRID_STRIDE(o, outer * nidx * inner) {
        i64 c = o % inner, i = (o / inner) % nidx, b = o / (inner * nidx);
        i64 r = resolve(ldi(idx, idt, i), n, err);
        if (r >= 0) atomicAdd(&acc[(b * n + r) * inner + c], ldf(dy, dydt, o));
    }
}
