// The data movement of a 2-D convolution around cuBLAS's products, one
// image's group at a time as runtime/src/cpu/kernels/conv.rs: im2col
// unfolds the group's cg input planes into its taps x pixels matrix
// (taps = (channel, a, b) over cg x kh x kw, pixels = (i, j) over oh x ow),
// col2im folds such a matrix back onto the planes, and the bias is written
// where the products then accumulate.

// cols[t, p] = the input element tap t of pixel p reads (0 in the padding).
extern "C" __global__ void conv_im2col(const void* x, int xdt, void* cols, int cdt, int cg,
                                       Win g) {
    const i64 pix = (i64)g.oh * g.ow, taps = (i64)g.kh * g.kw;
    GRID_STRIDE(idx, cg * taps * pix) {
        const i64 t = idx / pix, p = idx % pix, ch = t / taps;
        const int a = (int)((t % taps) / g.kw), b = (int)(t % g.kw);
        const i64 r = (p / g.ow) * g.sh + (i64)a * g.dh - g.pt;
        const i64 c = (p % g.ow) * g.sw + (i64)b * g.dw - g.pl;
        float v = 0.0f;
        if (r >= 0 && r < g.h && c >= 0 && c < g.w) v = ldf(x, xdt, (ch * g.h + r) * g.w + c);
        stf(cols, cdt, idx, v);
    }
}

// dx[ch, r, c] = the sum of cols[t, p] over the (tap, pixel) pairs that read
// it, in tap order (the CPU's col2im order). Each thread gathers its own
// element: no atomics, the same sum on every run.
extern "C" __global__ void conv_col2im(const float* cols, void* dx, int dxdt, int cg, Win g) {
    const i64 pix = (i64)g.oh * g.ow, plane = (i64)g.h * g.w;
    GRID_STRIDE(idx, cg * plane) {
        const i64 ch = idx / plane, r = (idx % plane) / g.w, c = idx % g.w;
        float s = 0.0f;
        for (int a = 0; a < g.kh; ++a) {
            // Output row i reads r through tap a when i * sh = r + pt - a * dh.
            const i64 ro = r + g.pt - (i64)a * g.dh;
            if (ro < 0) break;
            if (ro % g.sh != 0 || ro / g.sh >= g.oh) continue;
            const i64 i = ro / g.sh;
            for (int b = 0; b < g.kw; ++b) {
                const i64 co = c + g.pl - (i64)b * g.dw;
                if (co < 0) break;
                if (co % g.sw != 0 || co / g.sw >= g.ow) continue;
                const i64 t = (ch * g.kh + a) * g.kw + b;
                s += cols[t * pix + i * g.ow + co / g.sw];
            }
        }
        stf(dx, dxdt, idx, s);
    }
}

// y[img, oc, p] = bias[oc] over n elements of o channels of pix pixels: the
// value the products are then added to.
extern "C" __global__ void conv_bias(const void* bias, int bdt, void* y, int ydt, i64 n, i64 o,
                                     i64 pix) {
    GRID_STRIDE(idx, n) stf(y, ydt, idx, ldf(bias, bdt, (idx / pix) % o));
}
