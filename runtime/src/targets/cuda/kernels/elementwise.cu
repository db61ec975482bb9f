// Element-wise kernels: unary functions and their gradients, broadcasting
// binary, compare, logical and where, casts, dropout, and the whole-buffer
// helpers the executor uses (convert-and-divide, accumulate, rounding).
// Mirrors runtime/src/cpu/kernels/{unary,elementwise,cast,dropout}.rs.

// UnaryFn codes, in `fsdpc_ir::UnaryFn` order.
#define U_NEG 0
#define U_EXP 1
#define U_LOG 2
#define U_SQRT 3
#define U_RSQRT 4
#define U_RECIP 5
#define U_TANH 6
#define U_RELU 7
#define U_SIGMOID 8
#define U_ERF 9
#define U_ABS 10
#define U_GELU_TANH 11
#define U_GELU_ERF 12
#define U_SILU 13
#define U_SQUARE 14
#define U_ISNAN 15

#define SQRT_2_OVER_PI 0.7978846f
#define GELU_C 0.044715f
#define FRAC_2_SQRT_PI 1.1283791671f
#define FRAC_1_SQRT_2PI 0.3989423f
#define FRAC_1_SQRT_2 0.70710678118f

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ float unary_apply(int f, float x) {
    switch (f) {
    case U_NEG: return -x;
    case U_EXP: return expf(x);
    case U_LOG: return logf(x);
    case U_SQRT: return sqrtf(x);
    case U_RSQRT: return 1.0f / sqrtf(x);
    case U_RECIP: return 1.0f / x;
    case U_TANH: return tanhf(x);
    case U_RELU: return x > 0.0f ? x : 0.0f;
    case U_SIGMOID: return sigmoidf(x);
    case U_ERF: return erff(x);
    case U_ABS: return fabsf(x);
    case U_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)));
    case U_GELU_ERF: return 0.5f * x * (1.0f + erff(x * FRAC_1_SQRT_2));
    case U_SILU: return x * sigmoidf(x);
    case U_SQUARE: return x * x;
    default: return x != x ? 1.0f : 0.0f;
    }
}

__device__ float unary_derivative(int f, float x) {
    switch (f) {
    case U_NEG: return -1.0f;
    case U_EXP: return expf(x);
    case U_LOG: return 1.0f / x;
    case U_SQRT: return 0.5f / sqrtf(x);
    case U_RSQRT: return -0.5f / (x * sqrtf(x));
    case U_RECIP: return -1.0f / (x * x);
    case U_TANH: { float t = tanhf(x); return 1.0f - t * t; }
    case U_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case U_SIGMOID: { float s = sigmoidf(x); return s * (1.0f - s); }
    case U_ERF: return FRAC_2_SQRT_PI * expf(-x * x);
    case U_ABS: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case U_GELU_TANH: {
        float u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
        float t = tanhf(u);
        return 0.5f * (1.0f + t)
            + 0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x * x);
    }
    case U_GELU_ERF:
        return 0.5f * (1.0f + erff(x * FRAC_1_SQRT_2)) + x * FRAC_1_SQRT_2PI * expf(-0.5f * x * x);
    case U_SILU: { float s = sigmoidf(x); return s + x * s * (1.0f - s); }
    case U_SQUARE: return 2.0f * x;
    default: return 0.0f;
    }
}

// y = f(x) on floats (is_nan writes bool through stf).
extern "C" __global__ void unary_f(const void* x, int xdt, void* y, int ydt, i64 n, int f) {
    GRID_STRIDE(i, n) { stf(y, ydt, i, unary_apply(f, ldf(x, xdt, i))); }
}

// y = f(x) on integers: neg, abs, square, relu (wrapping, as the CPU).
extern "C" __global__ void unary_i(const void* x, int xdt, void* y, int ydt, i64 n, int f) {
    GRID_STRIDE(i, n) {
        u64 v = (u64)ldi(x, xdt, i);
        u64 r;
        switch (f) {
        case U_NEG: r = (u64)0 - v; break;
        case U_ABS: r = (i64)v < 0 ? (u64)0 - v : v; break;
        case U_SQUARE: r = v * v; break;
        default: r = (i64)v > 0 ? v : 0; break;
        }
        sti(y, ydt, i, (i64)r);
    }
}

// dx = dy * f'(x).
extern "C" __global__ void unary_grad(const void* x, int xdt, const void* dy, int dydt,
                                      void* dx, int dxdt, i64 n, int f) {
    GRID_STRIDE(i, n) {
        stf(dx, dxdt, i, ldf(dy, dydt, i) * unary_derivative(f, ldf(x, xdt, i)));
    }
}

#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_POW 4
#define B_MAX 5
#define B_MIN 6

// y = a (op) b with numpy broadcasting: g.st[0], g.st[1] are a's and b's
// strides over y's dimensions.
extern "C" __global__ void binary_f(const void* a, int adt, const void* b, int bdt, void* y,
                                    int ydt, i64 n, int f, Geo g) {
    GRID_STRIDE(i, n) {
        i64 off[2];
        offsets(g, i, 2, off);
        float x = ldf(a, adt, off[0]), z = ldf(b, bdt, off[1]), r;
        switch (f) {
        case B_ADD: r = x + z; break;
        case B_SUB: r = x - z; break;
        case B_MUL: r = x * z; break;
        case B_DIV: r = x / z; break;
        case B_POW: r = powf(x, z); break;
        case B_MAX: r = fmaxf(x, z); break;
        default: r = fminf(x, z); break;
        }
        stf(y, ydt, i, r);
    }
}

// The integer form (wrapping; division by zero is an error, result 0).
extern "C" __global__ void binary_i(const void* a, int adt, const void* b, int bdt, void* y,
                                    int ydt, i64 n, int f, Geo g, int* err) {
    GRID_STRIDE(i, n) {
        i64 off[2];
        offsets(g, i, 2, off);
        i64 x = ldi(a, adt, off[0]), z = ldi(b, bdt, off[1]);
        u64 ux = (u64)x, uz = (u64)z, r;
        switch (f) {
        case B_ADD: r = ux + uz; break;
        case B_SUB: r = ux - uz; break;
        case B_MUL: r = ux * uz; break;
        case B_DIV:
            if (z == 0) { fail(err, ERR_INT_DIV); r = 0; }
            else if (x == (i64)0x8000000000000000ll && z == -1) r = ux;
            else r = (u64)(x / z);
            break;
        case B_POW: {
            u64 e = z < 0 ? 0 : (z > 0xffffffffll ? 0xffffffffull : (u64)z);
            u64 base = ux, acc = 1;
            while (e) { if (e & 1) acc *= base; base *= base; e >>= 1; }
            r = acc;
            break;
        }
        case B_MAX: r = (u64)(x > z ? x : z); break;
        default: r = (u64)(x < z ? x : z); break;
        }
        sti(y, ydt, i, (i64)r);
    }
}

#define C_EQ 0
#define C_LT 1
#define C_LE 2
#define C_GT 3
#define C_GE 4

// Bool y = a (cmp) b, integers compared exactly, floats as f64 (NaN: false).
extern "C" __global__ void compare(const void* a, int adt, const void* b, int bdt, u8* y,
                                   i64 n, int f, Geo g) {
    bool ints = adt >= DT_I64 && bdt >= DT_I64;
    GRID_STRIDE(i, n) {
        i64 off[2];
        offsets(g, i, 2, off);
        int ord; // -1 less, 0 equal, 1 greater, 2 unordered
        if (ints) {
            i64 x = ldi(a, adt, off[0]), z = ldi(b, bdt, off[1]);
            ord = x < z ? -1 : (x > z ? 1 : 0);
        } else {
            double x = ldd(a, adt, off[0]), z = ldd(b, bdt, off[1]);
            ord = x < z ? -1 : (x > z ? 1 : (x == z ? 0 : 2));
        }
        bool r;
        switch (f) {
        case C_EQ: r = ord == 0; break;
        case C_LT: r = ord == -1; break;
        case C_LE: r = ord == -1 || ord == 0; break;
        case C_GT: r = ord == 1; break;
        default: r = ord == 1 || ord == 0; break;
        }
        y[i] = (u8)r;
    }
}

// Bool y = a and/or/xor b (f: 0, 1, 2).
extern "C" __global__ void logical(const u8* a, const u8* b, u8* y, i64 n, int f, Geo g) {
    GRID_STRIDE(i, n) {
        i64 off[2];
        offsets(g, i, 2, off);
        bool x = a[off[0]] != 0, z = b[off[1]] != 0;
        y[i] = (u8)(f == 0 ? (x && z) : (f == 1 ? (x || z) : (x != z)));
    }
}

extern "C" __global__ void logical_not(const u8* a, u8* y, i64 n) {
    GRID_STRIDE(i, n) { y[i] = (u8)(a[i] == 0); }
}

// y = c ? a : b, broadcasting all three (g.st[0..3]: c, a, b), any dtype of
// es bytes.
extern "C" __global__ void where_(const u8* c, const void* a, const void* b, void* y, int es,
                                  i64 n, Geo g) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        offsets(g, i, 3, off);
        if (c[off[0]] != 0) copy_elem(y, i, a, off[1], es);
        else copy_elem(y, i, b, off[2], es);
    }
}

// Cast between any two dtypes with the CPU's rules: float to float through
// f32 (rounded to nearest even), integers exactly, float to integer
// truncating (NaN to 0), anything to bool as != 0.
extern "C" __global__ void cast(const void* x, int xdt, void* y, int ydt, i64 n) {
    bool xf = xdt <= DT_F16, yf = ydt <= DT_F16;
    GRID_STRIDE(i, n) {
        if (xf && yf) stf(y, ydt, i, ldf(x, xdt, i));
        else if (!xf) {
            if (yf) stf(y, ydt, i, (float)ldd(x, xdt, i));
            else sti(y, ydt, i, ldi(x, xdt, i));
        } else if (ydt == DT_BOOL) {
            ((u8*)y)[i] = (u8)(ldf(x, xdt, i) != 0.0f);
        } else {
            sti(y, ydt, i, ldi(x, xdt, i));
        }
    }
}

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Inverted dropout with the counter-based mask of `fsdpc_ir::init`:
// element e is kept iff unit_open(mix64(base + (first + e + 1) * GOLDEN))
// >= p, `base` being the host-computed `mix64(mix64(seed ^ GOLDEN) ^ key)`.
// A chunk of a whole tensor adds its offset in the whole, one integer at
// `off` (null for a whole input).
extern "C" __global__ void dropout(const void* x, int xdt, void* y, int ydt, i64 n, u64 base,
                                   u64 first, const void* off, int odt, double p,
                                   float scale) {
    const u64 golden = 0x9E3779B97F4A7C15ull;
    if (off) first += (u64)ldi(off, odt, 0);
    GRID_STRIDE(i, n) {
        u64 h = mix64(base + ((u64)(first + i) + 1ull) * golden);
        double u = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        stf(y, ydt, i, u >= p ? ldf(x, xdt, i) * scale : 0.0f);
    }
}

// dst = src / div, converting (a collective over one rank; widening a
// half-precision reduction into its f32 shard).
extern "C" __global__ void convert_div(const void* src, int sdt, void* dst, int ddt, i64 n,
                                       float div) {
    GRID_STRIDE(i, n) { stf(dst, ddt, i, ldf(src, sdt, i) / div); }
}

// dst += src in dtype dt, the sum in f32 rounded once.
extern "C" __global__ void accumulate(const void* src, void* dst, int dt, i64 n) {
    GRID_STRIDE(i, n) { stf(dst, dt, i, ldf(dst, dt, i) + ldf(src, dt, i)); }
}

// Rounds f32 values to the precision of dt (bf16 or f16), in place.
extern "C" __global__ void round_to(float* x, int dt, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        x[i] = dt == DT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
    }
}
