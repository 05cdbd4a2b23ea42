/* GPU math kernels: elementwise ops with broadcasting, activations and their gradients,
 * BiasAddGrad's column sums, AddN, ClipByValue(Grad), Cast and the optimizer updates.
 *
 * Each kernel computes what the CPU kernel of its op (executor/cpu/kernels_math.c,
 * kernels_state.c) computes, in the same operation order. The CPU code is C11 without
 * extensions, so GCC never contracts a*b+c into an FMA there; nvcc does by default, which
 * changes results by an ulp and, in 1 - y*y and similar, by much more in relative terms. Every
 * product that feeds an addition is therefore written with mul() (__fmul_rn/__dmul_rn), which
 * nvcc never fuses. Division and sqrt are IEEE-rounded (no fast-math).
 *
 * All loops are grid-stride loops over a bounded grid. */
#include "cuda_impl.h"
#include "launch_math.h"

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
    int64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > 65535) blocks = 65535;
    if (blocks < 1) blocks = 1;
    return (unsigned)blocks;
}

// ---- per-element math ----
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return log(x); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float d_erf(float x) { return erff(x); }
__device__ __forceinline__ double d_erf(double x) { return erf(x); }
__device__ __forceinline__ float d_sin(float x) { return sinf(x); }
__device__ __forceinline__ double d_sin(double x) { return sin(x); }
__device__ __forceinline__ float d_cos(float x) { return cosf(x); }
__device__ __forceinline__ double d_cos(double x) { return cos(x); }

// GELU and its derivative in double, in the CPU kernel's operation order (kernels_math.c).
constexpr double kSqrt2OverPi = 0.7978845608028654, kInvSqrt2 = 0.7071067811865476,
                 kInvSqrt2Pi = 0.3989422804014327;
__device__ __forceinline__ double gelu(double x) {
    return mul(mul(0.5, x), 1.0 + erf(mul(x, kInvSqrt2)));
}
__device__ __forceinline__ double gelu_grad(double x) {
    return mul(0.5, 1.0 + erf(mul(x, kInvSqrt2))) + mul(mul(x, kInvSqrt2Pi), exp(mul(mul(-0.5, x), x)));
}
__device__ __forceinline__ double gelu_tanh(double x) {
    double u = mul(kSqrt2OverPi, x + mul(mul(mul(0.044715, x), x), x));
    return mul(mul(0.5, x), 1.0 + tanh(u));
}
__device__ __forceinline__ double gelu_tanh_grad(double x) {
    double t = tanh(mul(kSqrt2OverPi, x + mul(mul(mul(0.044715, x), x), x)));
    return mul(0.5, 1.0 + t) +
           mul(mul(mul(mul(0.5, x), 1.0 - mul(t, t)), kSqrt2OverPi), 1.0 + mul(mul(3 * 0.044715, x), x));
}

template <cuda_binop OP, typename T>
__device__ __forceinline__ T bin(T x, T y) {
    switch (OP) {
    case CUDA_BIN_ADD: return x + y;
    case CUDA_BIN_SUB: return x - y;
    case CUDA_BIN_MUL: return mul(x, y);
    case CUDA_BIN_DIV: return x / y;
    case CUDA_BIN_MAX: return x >= y ? x : y;
    case CUDA_BIN_MIN: return x <= y ? x : y;
    case CUDA_BIN_RELU_GRAD: return y > T(0) ? x : T(0);                 // (dy, y)
    case CUDA_BIN_SIGMOID_GRAD: return mul(mul(y, x), T(1) - x);         // (y, dy)
    case CUDA_BIN_TANH_GRAD: return mul(y, T(1) - mul(x, x));            // (y, dy)
    case CUDA_BIN_SQRT_GRAD: return mul(y, T(0.5)) / x;                  // (y, dy)
    case CUDA_BIN_POW: return T(pow(double(x), double(y)));
    case CUDA_BIN_RSQRT_GRAD: return mul(y, T(-0.5)) * mul(mul(x, x), x);   // (y, dy)
    case CUDA_BIN_GELU_GRAD: return mul(x, T(gelu_grad(double(y))));        // (dy, x)
    case CUDA_BIN_GELU_TANH_GRAD: return mul(x, T(gelu_tanh_grad(double(y))));
    }
    return T(0);
}

template <cuda_unop OP, typename T>
__device__ __forceinline__ T un(T x) {
    switch (OP) {
    case CUDA_UN_RELU: return x > T(0) ? x : T(0);
    case CUDA_UN_SIGMOID: return T(1) / (T(1) + d_exp(-x));
    case CUDA_UN_TANH: return d_tanh(x);
    case CUDA_UN_EXP: return d_exp(x);
    case CUDA_UN_LOG: return d_log(x);
    case CUDA_UN_SQUARE: return mul(x, x);
    case CUDA_UN_SQRT: return d_sqrt(x);
    case CUDA_UN_NEG: return -x;
    case CUDA_UN_RSQRT: return T(1) / d_sqrt(x);
    case CUDA_UN_ERF: return d_erf(x);
    case CUDA_UN_GELU: return T(gelu(double(x)));
    case CUDA_UN_GELU_TANH: return T(gelu_tanh(double(x)));
    case CUDA_UN_SIN: return d_sin(x);
    case CUDA_UN_COS: return d_cos(x);
    }
    return T(0);
}

__device__ __forceinline__ int64_t operand_index(int kind, int64_t i, int64_t row, int64_t col) {
    return kind == CUDA_OPND_FULL ? i : kind == CUDA_OPND_SCALAR ? 0 : kind == CUDA_OPND_ROW ? col : row;
}

// ---- elementwise kernels ----
// The output is seen as [n / inner, inner]; row and col of element i are advanced by the grid
// stride incrementally, so the loop divides only once per thread.
template <cuda_binop OP, typename T>
__global__ void binary_fast(const T *a, int ka, const T *b, int kb, T *out, int64_t n,
                            int64_t inner) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t srow = stride / inner, scol = stride % inner;
    int64_t row = i / inner, col = i % inner;
    for (; i < n; i += stride) {
        out[i] = bin<OP, T>(a[operand_index(ka, i, row, col)], b[operand_index(kb, i, row, col)]);
        // col < inner and scol < inner, so one carry at most.
        col += scol;
        row += srow;
        if (col >= inner) {
            col -= inner;
            row++;
        }
    }
}

struct Bcast {
    int rank;
    int64_t dims[CUDA_MATH_MAX_RANK];
    int64_t sa[CUDA_MATH_MAX_RANK];
    int64_t sb[CUDA_MATH_MAX_RANK];
};

template <cuda_binop OP, typename T>
__global__ void binary_strided(const T *a, const T *b, T *out, int64_t n, Bcast bc) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rem = i, oa = 0, ob = 0;
        for (int d = bc.rank - 1; d >= 0; d--) {
            int64_t c = rem % bc.dims[d];
            rem /= bc.dims[d];
            oa += c * bc.sa[d];
            ob += c * bc.sb[d];
        }
        out[i] = bin<OP, T>(a[oa], b[ob]);
    }
}

template <cuda_unop OP, typename T>
__global__ void unary(const T *x, T *y, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = un<OP, T>(x[i]);
}

constexpr int kAddnMax = 16;
struct AddnSrc {
    const void *p[kAddnMax];
    int count;
};

// y may be src.p[0] (a later chunk of a long AddN): each element is read before it is written.
template <typename T>
__global__ void addn(AddnSrc src, T *y, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T acc = ((const T *)src.p[0])[i];
        for (int k = 1; k < src.count; k++) acc += ((const T *)src.p[k])[i];
        y[i] = acc;
    }
}

// ---- BiasAddGrad: column sums in two passes ----
// Pass 1: block (kBgCols, kBgLanes) sums a chunk of rows for 32 adjacent columns (a warp reads
// 32 consecutive elements of one row); the lanes' sums are added in shared memory and the
// chunk's partial sum goes to partial[chunk * cols + col]. Pass 2 adds the chunks in order.
constexpr int kBgCols = 32, kBgLanes = 8;
constexpr int64_t kBgMinRows = 64, kBgTargetBlocks = 1024, kBgMaxChunks = 65535;

void bias_grad_plan(int64_t rows, int64_t cols, int64_t *chunks, int64_t *rows_per_chunk) {
    *chunks = 0;
    *rows_per_chunk = 0;
    if (rows <= 0 || cols <= 0) return;
    int64_t tiles = (cols + kBgCols - 1) / kBgCols;
    int64_t want = (kBgTargetBlocks + tiles - 1) / tiles;
    int64_t most = (rows + kBgMinRows - 1) / kBgMinRows;
    int64_t c = want < most ? want : most;
    if (c > kBgMaxChunks) c = kBgMaxChunks;
    if (c < 1) c = 1;
    int64_t rpc = (rows + c - 1) / c;
    *rows_per_chunk = rpc;
    *chunks = (rows + rpc - 1) / rpc;
}

template <typename T>
__global__ void bias_grad_partial(const T *dy, double *partial, int64_t rows, int64_t cols,
                                  int64_t rows_per_chunk) {
    __shared__ double sums[kBgLanes][kBgCols + 1];
    const int64_t col = (int64_t)blockIdx.x * kBgCols + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    double acc = 0;
    if (col < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kBgLanes) acc += (double)dy[r * cols + col];
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        double s = 0;
        for (int k = 0; k < kBgLanes; k++) s += sums[k][threadIdx.x];
        partial[(int64_t)blockIdx.y * cols + col] = s;
    }
}

template <typename T>
__global__ void bias_grad_final(const double *partial, T *out, int64_t chunks, int64_t cols) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride) {
        double s = 0;
        for (int64_t k = 0; k < chunks; k++) s += partial[k * cols + c];
        out[c] = (T)s;
    }
}

// ---- ClipByValue, ClipByValueGrad, Cast ----
template <typename T>
__global__ void clip(const T *x, const T *lo, bool lo_scalar, const T *hi, bool hi_scalar, T *y,
                     int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T v = x[i], l = lo[lo_scalar ? 0 : i], h = hi[hi_scalar ? 0 : i];
        y[i] = v < l ? l : v > h ? h : v;
    }
}

template <typename T>
__global__ void clip_grad(const T *dy, const T *x, const T *lo, bool lo_scalar, const T *hi,
                          bool hi_scalar, T *dx, T *dlo, T *dhi, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T v = x[i], g = dy[i], l = lo[lo_scalar ? 0 : i], h = hi[hi_scalar ? 0 : i];
        dx[i] = v >= l && v <= h ? g : T(0);
        dlo[i] = v < l ? g : T(0);
        dhi[i] = v > h ? g : T(0);
    }
}

// The 16-bit floats as the CPU converts them (graph/tensor_impl.h, the same bit operations).
__device__ __forceinline__ uint16_t f32_to_bf16(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   // NaN, made quiet
    u += 0x7fffu + ((u >> 16) & 1);   // to nearest, ties to even; a carry raises the exponent
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint16_t f32_to_f16(float v) {
    uint32_t u = __float_as_uint(v), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));   // NaN, quiet
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   // rounds to 65520 or more: infinity
    if (a < 0x38800000u) {   // below 2^-14: float32's own rounding at 2^-24 after adding 0.5
        float r = __fadd_rn(__uint_as_float(a), 0.5f);
        return (uint16_t)(sign | (__float_as_uint(r) - __float_as_uint(0.5f)));
    }
    uint32_t m = a - 0x38000000u;   // rebias the exponent, round the 13 dropped bits
    m += 0xfffu + ((m >> 13) & 1);
    return (uint16_t)(sign | (m >> 13));
}
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));   // infinity or NaN
    if (e == 0) return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)m, 0x1p-24f)));   // exact
    return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

// Element i of a float32, bfloat16 or float16 x as a float32 (exact; bits moved, not
// computed on, so a NaN keeps its sign and payload), and a float32 stored as kind `to`.
__device__ __forceinline__ float load_f32(cuda_float_kind k, const void *x, int64_t i) {
    switch (k) {
    case CUDA_FLOAT_BF16: return bf16_to_f32(((const uint16_t *)x)[i]);
    case CUDA_FLOAT_F16: return f16_to_f32(((const uint16_t *)x)[i]);
    default: return ((const float *)x)[i];
    }
}
__device__ __forceinline__ void store_f32(cuda_float_kind k, void *y, int64_t i, float v) {
    switch (k) {
    case CUDA_FLOAT_F64: ((double *)y)[i] = (double)v; break;
    case CUDA_FLOAT_BF16: ((uint16_t *)y)[i] = f32_to_bf16(v); break;
    case CUDA_FLOAT_F16: ((uint16_t *)y)[i] = f32_to_f16(v); break;
    default: ((float *)y)[i] = v; break;
    }
}

// From float64: through float32 to a 16-bit float, as the CPU's Cast (it rounds twice).
__global__ void cast(cuda_float_kind from, const void *x, cuda_float_kind to, void *y, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        store_f32(to, y, i, from == CUDA_FLOAT_F64 ? (float)((const double *)x)[i] : load_f32(from, x, i));
}

// ---- optimizer updates, in place ----
template <typename T>
__global__ void apply_gd(T *w, const T *alpha, const T *delta, int64_t n) {
    const T a = *alpha;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        w[i] = w[i] - mul(a, delta[i]);
}

template <typename T>
__global__ void apply_momentum(T *w, T *accum, const T *lr, const T *grad, const T *momentum,
                               bool nesterov, int64_t n) {
    const T l = *lr, mo = *momentum;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T g = grad[i];
        T acc = mul(accum[i], mo) + g;
        accum[i] = acc;
        w[i] = w[i] - (nesterov ? mul(g, l) + mul(mul(acc, mo), l) : mul(acc, l));
    }
}

// The CPU computes lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power) in double and the
// moments in T (for float32: c1 = 1 - beta1 in float, as adam_f32 does).
template <typename T>
__global__ void apply_adam(T *w, T *m, T *v, const T *b1p, const T *b2p, const T *lr,
                           const T *beta1, const T *beta2, const T *epsilon, const T *grad,
                           int64_t n) {
    const double lr_t = __dmul_rn((double)*lr, sqrt(1.0 - (double)*b2p)) / (1.0 - (double)*b1p);
    const T l = (T)lr_t, b1 = *beta1, b2 = *beta2, e = *epsilon;
    const T c1 = T(1) - b1, c2 = T(1) - b2;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T gi = grad[i], mi = m[i], vi = v[i];
        mi = mi + mul(gi - mi, c1);
        vi = vi + mul(mul(gi, gi) - vi, c2);
        m[i] = mi;
        v[i] = vi;
        w[i] = w[i] - mul(mi, l) / (d_sqrt(vi) + e);
    }
}

template <typename T>
__global__ void assign_update(T *var, const T *val, bool subtract, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        var[i] = subtract ? var[i] - val[i] : var[i] + val[i];
}

// ---- dispatch from runtime enums to template instances ----
#define BINOP_CASES(X)                                                                   \
    X(CUDA_BIN_ADD) X(CUDA_BIN_SUB) X(CUDA_BIN_MUL) X(CUDA_BIN_DIV) X(CUDA_BIN_MAX)     \
    X(CUDA_BIN_MIN) X(CUDA_BIN_RELU_GRAD) X(CUDA_BIN_SIGMOID_GRAD) X(CUDA_BIN_TANH_GRAD) \
    X(CUDA_BIN_SQRT_GRAD) X(CUDA_BIN_POW) X(CUDA_BIN_RSQRT_GRAD) X(CUDA_BIN_GELU_GRAD)     \
    X(CUDA_BIN_GELU_TANH_GRAD)

#define UNOP_CASES(X)                                                                    \
    X(CUDA_UN_RELU) X(CUDA_UN_SIGMOID) X(CUDA_UN_TANH) X(CUDA_UN_EXP) X(CUDA_UN_LOG)    \
    X(CUDA_UN_SQUARE) X(CUDA_UN_SQRT) X(CUDA_UN_NEG) X(CUDA_UN_RSQRT) X(CUDA_UN_ERF)     \
    X(CUDA_UN_GELU) X(CUDA_UN_GELU_TANH) X(CUDA_UN_SIN) X(CUDA_UN_COS)

template <typename T>
cudaError_t binary_fast_t(cuda_binop op, const void *a, cuda_operand ka, const void *b,
                          cuda_operand kb, void *out, int64_t n, int64_t inner, cudaStream_t s) {
    const unsigned g = grid_for(n);
    switch (op) {
#define CASE(OP)                                                                          \
    case OP:                                                                              \
        binary_fast<OP, T><<<g, kThreads, 0, s>>>((const T *)a, (int)ka, (const T *)b,     \
                                                  (int)kb, (T *)out, n, inner);            \
        break;
        BINOP_CASES(CASE)
#undef CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <typename T>
cudaError_t binary_strided_t(cuda_binop op, const void *a, const void *b, void *out, int64_t n,
                             const Bcast &bc, cudaStream_t s) {
    const unsigned g = grid_for(n);
    switch (op) {
#define CASE(OP)                                                                          \
    case OP:                                                                              \
        binary_strided<OP, T><<<g, kThreads, 0, s>>>((const T *)a, (const T *)b, (T *)out, \
                                                     n, bc);                              \
        break;
        BINOP_CASES(CASE)
#undef CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <typename T>
cudaError_t unary_t(cuda_unop op, const void *x, void *y, int64_t n, cudaStream_t s) {
    const unsigned g = grid_for(n);
    switch (op) {
#define CASE(OP)                                                                          \
    case OP:                                                                              \
        unary<OP, T><<<g, kThreads, 0, s>>>((const T *)x, (T *)y, n);                      \
        break;
        UNOP_CASES(CASE)
#undef CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <typename T>
cudaError_t addn_t(const void *const *xs, int n_inputs, void *y, int64_t n, cudaStream_t s) {
    const unsigned g = grid_for(n);
    // Chunks of kAddnMax sources; every chunk after the first starts from y, so the sum is
    // still taken left to right.
    int next = 0;
    bool first = true;
    while (next < n_inputs) {
        AddnSrc src = {};
        if (!first) src.p[src.count++] = y;
        while (src.count < kAddnMax && next < n_inputs) src.p[src.count++] = xs[next++];
        addn<T><<<g, kThreads, 0, s>>>(src, (T *)y, n);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        first = false;
    }
    return cudaSuccess;
}

template <typename T>
cudaError_t bias_grad_t(const void *dy, void *out, int64_t rows, int64_t cols, double *scratch,
                        cudaStream_t s) {
    int64_t chunks, rpc;
    bias_grad_plan(rows, cols, &chunks, &rpc);
    if (chunks > 0) {
        dim3 grid((unsigned)((cols + kBgCols - 1) / kBgCols), (unsigned)chunks);
        dim3 block(kBgCols, kBgLanes);
        bias_grad_partial<T><<<grid, block, 0, s>>>((const T *)dy, scratch, rows, cols, rpc);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    // With no chunks (rows == 0) this writes zeros, like the CPU's memset.
    bias_grad_final<T><<<grid_for(cols), kThreads, 0, s>>>(scratch, (T *)out, chunks, cols);
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t cuda_launch_binary(cuda_math_dtype dt, cuda_binop op, const void *a,
                                          cuda_operand ka, const void *b, cuda_operand kb,
                                          void *out, int64_t n, int64_t inner,
                                          cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (inner <= 0) return cudaErrorInvalidValue;
    return dt == CUDA_MATH_F64 ? binary_fast_t<double>(op, a, ka, b, kb, out, n, inner, stream)
                               : binary_fast_t<float>(op, a, ka, b, kb, out, n, inner, stream);
}

extern "C" cudaError_t cuda_launch_binary_strided(cuda_math_dtype dt, cuda_binop op,
                                                  const void *a, const void *b, void *out,
                                                  int64_t n, const cuda_bcast *bc,
                                                  cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (bc->rank < 1 || bc->rank > CUDA_MATH_MAX_RANK) return cudaErrorInvalidValue;
    Bcast k = {};
    k.rank = bc->rank;
    for (int d = 0; d < bc->rank; d++) {
        if (bc->dims[d] <= 0) return cudaErrorInvalidValue;
        k.dims[d] = bc->dims[d];
        k.sa[d] = bc->a_strides[d];
        k.sb[d] = bc->b_strides[d];
    }
    return dt == CUDA_MATH_F64 ? binary_strided_t<double>(op, a, b, out, n, k, stream)
                               : binary_strided_t<float>(op, a, b, out, n, k, stream);
}

extern "C" cudaError_t cuda_launch_unary(cuda_math_dtype dt, cuda_unop op, const void *x,
                                         void *y, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    return dt == CUDA_MATH_F64 ? unary_t<double>(op, x, y, n, stream)
                               : unary_t<float>(op, x, y, n, stream);
}

extern "C" cudaError_t cuda_launch_addn(cuda_math_dtype dt, const void *const *xs, int n_inputs,
                                        void *y, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (n_inputs < 1) return cudaErrorInvalidValue;
    return dt == CUDA_MATH_F64 ? addn_t<double>(xs, n_inputs, y, n, stream)
                               : addn_t<float>(xs, n_inputs, y, n, stream);
}

extern "C" int64_t cuda_bias_grad_scratch_elems(int64_t rows, int64_t cols) {
    int64_t chunks, rpc;
    bias_grad_plan(rows, cols, &chunks, &rpc);
    return chunks * (cols > 0 ? cols : 0);
}

extern "C" cudaError_t cuda_launch_bias_grad(cuda_math_dtype dt, const void *dy, void *out,
                                             int64_t rows, int64_t cols, double *scratch,
                                             cudaStream_t stream) {
    if (cols <= 0) return cudaSuccess;
    if (rows < 0) return cudaErrorInvalidValue;
    if (cuda_bias_grad_scratch_elems(rows, cols) > 0 && !scratch) return cudaErrorInvalidValue;
    return dt == CUDA_MATH_F64 ? bias_grad_t<double>(dy, out, rows, cols, scratch, stream)
                               : bias_grad_t<float>(dy, out, rows, cols, scratch, stream);
}

extern "C" cudaError_t cuda_launch_clip(cuda_math_dtype dt, const void *x, const void *lo,
                                        bool lo_scalar, const void *hi, bool hi_scalar, void *y,
                                        int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dt == CUDA_MATH_F64)
        clip<double><<<grid_for(n), kThreads, 0, stream>>>(
            (const double *)x, (const double *)lo, lo_scalar, (const double *)hi, hi_scalar,
            (double *)y, n);
    else
        clip<float><<<grid_for(n), kThreads, 0, stream>>>((const float *)x, (const float *)lo,
                                                          lo_scalar, (const float *)hi,
                                                          hi_scalar, (float *)y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_clip_grad(cuda_math_dtype dt, const void *dy, const void *x,
                                             const void *lo, bool lo_scalar, const void *hi,
                                             bool hi_scalar, void *dx, void *dlo, void *dhi,
                                             int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dt == CUDA_MATH_F64)
        clip_grad<double><<<grid_for(n), kThreads, 0, stream>>>(
            (const double *)dy, (const double *)x, (const double *)lo, lo_scalar,
            (const double *)hi, hi_scalar, (double *)dx, (double *)dlo, (double *)dhi, n);
    else
        clip_grad<float><<<grid_for(n), kThreads, 0, stream>>>(
            (const float *)dy, (const float *)x, (const float *)lo, lo_scalar,
            (const float *)hi, hi_scalar, (float *)dx, (float *)dlo, (float *)dhi, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_cast(cuda_float_kind from, const void *x, cuda_float_kind to,
                                        void *y, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (from == to) {
        size_t size = from == CUDA_FLOAT_F64 ? sizeof(double) : from == CUDA_FLOAT_F32 ? sizeof(float) : 2;
        return cudaMemcpyAsync(y, x, (size_t)n * size, cudaMemcpyDeviceToDevice, stream);
    }
    cast<<<grid_for(n), kThreads, 0, stream>>>(from, x, to, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_apply_gd(cuda_math_dtype dt, void *var, const void *alpha,
                                            const void *delta, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dt == CUDA_MATH_F64)
        apply_gd<double><<<grid_for(n), kThreads, 0, stream>>>(
            (double *)var, (const double *)alpha, (const double *)delta, n);
    else
        apply_gd<float><<<grid_for(n), kThreads, 0, stream>>>(
            (float *)var, (const float *)alpha, (const float *)delta, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_apply_momentum(cuda_math_dtype dt, void *var, void *accum,
                                                  const void *lr, const void *grad,
                                                  const void *momentum, bool nesterov,
                                                  int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dt == CUDA_MATH_F64)
        apply_momentum<double><<<grid_for(n), kThreads, 0, stream>>>(
            (double *)var, (double *)accum, (const double *)lr, (const double *)grad,
            (const double *)momentum, nesterov, n);
    else
        apply_momentum<float><<<grid_for(n), kThreads, 0, stream>>>(
            (float *)var, (float *)accum, (const float *)lr, (const float *)grad,
            (const float *)momentum, nesterov, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_apply_adam(cuda_math_dtype dt, void *var, void *m, void *v,
                                              const void *beta1_power, const void *beta2_power,
                                              const void *lr, const void *beta1,
                                              const void *beta2, const void *epsilon,
                                              const void *grad, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dt == CUDA_MATH_F64)
        apply_adam<double><<<grid_for(n), kThreads, 0, stream>>>(
            (double *)var, (double *)m, (double *)v, (const double *)beta1_power,
            (const double *)beta2_power, (const double *)lr, (const double *)beta1,
            (const double *)beta2, (const double *)epsilon, (const double *)grad, n);
    else
        apply_adam<float><<<grid_for(n), kThreads, 0, stream>>>(
            (float *)var, (float *)m, (float *)v, (const float *)beta1_power,
            (const float *)beta2_power, (const float *)lr, (const float *)beta1,
            (const float *)beta2, (const float *)epsilon, (const float *)grad, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_assign_update(cuda_math_dtype dt, void *var, const void *val,
                                                 bool subtract, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (dt == CUDA_MATH_F64)
        assign_update<double><<<grid_for(n), kThreads, 0, stream>>>(
            (double *)var, (const double *)val, subtract, n);
    else
        assign_update<float><<<grid_for(n), kThreads, 0, stream>>>(
            (float *)var, (const float *)val, subtract, n);
    return cudaGetLastError();
}
