// Data movement: one strided copy serves transpose, slice, expand, concat,
// pad and slice_grad (each is a gather from, or a scatter into, a strided
// view), and a fill for padding and zeroing. Mirrors
// runtime/src/cpu/kernels/shape.rs.

// For every index of g's iteration space: dst[dbase + off1] =
// src[sbase + off0], elements of es bytes (g.st[0]: source strides,
// g.st[1]: destination strides).
extern "C" __global__ void strided_copy(const void* src, i64 sbase, void* dst, i64 dbase, int es,
                                        i64 n, Geo g) {
    GRID_STRIDE(i, n) {
        i64 off[2];
        offsets(g, i, 2, off);
        copy_elem(dst, dbase + off[1], src, sbase + off[0], es);
    }
}

// Sets n elements of dtype dt to v.
extern "C" __global__ void fill(void* dst, int dt, i64 n, double v) {
    bool ints = dt >= DT_I64;
    GRID_STRIDE(i, n) {
        if (ints) sti(dst, dt, i, (i64)v);
        else stf(dst, dt, i, (float)v);
    }
}
