/* CUDA kernels for the nn, reduction and array ops (launch_nn.h): softmax and cross entropy
 * over rows, one general reduction, the max gradient, a general strided-box copy and fills.
 *
 * Rows and reductions share one scheme: a "group" of G consecutive threads (G = 1, a warp,
 * or the whole 256-thread block) owns one row or one output, strides over its elements, and
 * combines the partial results with warp shuffles (and shared memory across warps). All
 * loops over groups are grid-stride loops whose bound is uniform across a block, so every
 * thread reaches every shuffle and barrier. Sums accumulate in double, also for float32
 * data: the result is then the correctly rounded sum up to double rounding, whatever the
 * summation order, and differs from the CPU's sequential float sum only by the CPU's own
 * rounding error. */
#include <stdint.h>

#include "launch_nn.h"

namespace {

constexpr int kThreads = 256;           // threads per block everywhere
constexpr int64_t kMaxBlocks = 65535;   // grid bound; grid-stride loops cover the rest
constexpr int kMaxDims = 8;             // DG_MAX_RANK

unsigned grid_for(int64_t work_items, int64_t items_per_block) {
    int64_t b = (work_items + items_per_block - 1) / items_per_block;
    if (b < 1) b = 1;
    if (b > kMaxBlocks) b = kMaxBlocks;
    return (unsigned)b;
}

// ---- element helpers ----
__device__ __forceinline__ float dexp(float v) { return expf(v); }
__device__ __forceinline__ double dexp(double v) { return exp(v); }
__device__ __forceinline__ float dlog(float v) { return logf(v); }
__device__ __forceinline__ double dlog(double v) { return log(v); }

template <class T> __device__ __forceinline__ T neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return __longlong_as_double((long long)0xfff0000000000000ULL);
}

struct SumOp {
    template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
// The CPU's `m = v > m ? v : m`: a NaN operand b is skipped; a never becomes NaN when it starts
// at -inf, so the maximum of a group ignores NaNs (and is -inf when all are NaN).
struct MaxOp {
    template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// Combines v over a group of G consecutive threads: G is 1, 32 (a warp) or kThreads (the
// block). Every thread of the block must make the same sequence of calls. With SumOp every
// lane gets the same bits (IEEE addition commutes, so both lanes of a butterfly pair agree).
template <int G, class T, class Op>
__device__ __forceinline__ T group_reduce(T v, Op op) {
    static_assert(G == 1 || G == 32 || G == kThreads, "group of 1, 32 or kThreads threads");
    if constexpr (G > 1) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    if constexpr (G == kThreads) {
        __shared__ T part[kThreads / 32];
        __syncthreads();   // the previous call's readers are done with part
        if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
        __syncthreads();
        v = part[0];
#pragma unroll
        for (int w = 1; w < kThreads / 32; w++) v = op(v, part[w]);
    }
    return v;
}

// Offset of linear index idx of a row-major box of n dims d[] under strides s[].
__host__ __device__ __forceinline__ int64_t unravel(int64_t idx, int n, const int64_t *d, const int64_t *s) {
    int64_t off = 0;
    for (int k = n - 1; k > 0; k--) {
        int64_t q = idx / d[k];
        off += (idx - q * d[k]) * s[k];
        idx = q;
    }
    if (n > 0) off += idx * s[0];
    return off;
}

// ---- rows: softmax, its gradients, cross entropy ----

// The row kernels: a group of G threads per row, kThreads / G rows per block per iteration
// of a grid-stride loop whose bound (base < rows) is uniform across the block; threads past
// the last row (active false) still join the group reductions.
template <class T, int G>
__global__ void softmax_rows(const T *x, T *y, int64_t rows, int64_t cols, bool is_log) {
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * (kThreads / G); base < rows;
         base += (int64_t)gridDim.x * (kThreads / G)) {
        const int64_t r = base + threadIdx.x / G;
        const bool active = r < rows;
        const int64_t row_off = (active ? r : 0) * cols;
        const T *xr = x + row_off;
        T m = neg_inf<T>();
        if (active)
            for (int64_t c = lane; c < cols; c += G) m = MaxOp()(m, xr[c]);
        m = group_reduce<G>(m, MaxOp());
        double acc = 0;
        if (active)
            for (int64_t c = lane; c < cols; c += G) acc += (double)dexp(xr[c] - m);
        const T s = (T)group_reduce<G>(acc, SumOp());
        if (active) {
            T *yr = y + row_off;
            if (is_log) {
                const T ls = dlog(s) + m;
                for (int64_t c = lane; c < cols; c += G) yr[c] = xr[c] - ls;
            } else {
                const T inv = (T)1 / s;
                for (int64_t c = lane; c < cols; c += G) yr[c] = dexp(xr[c] - m) * inv;
            }
        }
    }
}

template <class T, int G>
__global__ void softmax_grad_rows(const T *y, const T *dy, T *dx, int64_t rows, int64_t cols,
                                  bool is_log) {
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * (kThreads / G); base < rows;
         base += (int64_t)gridDim.x * (kThreads / G)) {
        const int64_t r = base + threadIdx.x / G;
        const bool active = r < rows;
        const int64_t row_off = (active ? r : 0) * cols;
        const T *yr = y + row_off, *gr = dy + row_off;
        double acc = 0;
        if (active)
            for (int64_t c = lane; c < cols; c += G) acc += (double)(is_log ? gr[c] : gr[c] * yr[c]);
        const T s = (T)group_reduce<G>(acc, SumOp());
        if (active) {
            T *dr = dx + row_off;
            if (is_log)
                for (int64_t c = lane; c < cols; c += G) dr[c] = gr[c] - dexp(yr[c]) * s;
            else
                for (int64_t c = lane; c < cols; c += G) dr[c] = (gr[c] - s) * yr[c];
        }
    }
}

// probs or ids is NULL (dense or sparse labels).
template <class T, int G>
__global__ void xent_rows(const T *x, const T *probs, const int64_t *ids, T *loss, T *bp,
                          int64_t rows, int64_t cols) {
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * (kThreads / G); base < rows;
         base += (int64_t)gridDim.x * (kThreads / G)) {
        const int64_t r = base + threadIdx.x / G;
        const bool active = r < rows;
        const int64_t row_off = (active ? r : 0) * cols;
        const T *xr = x + row_off;
        T m = neg_inf<T>();
        if (active)
            for (int64_t c = lane; c < cols; c += G) m = MaxOp()(m, xr[c]);
        m = group_reduce<G>(m, MaxOp());
        double acc = 0;
        if (active)
            for (int64_t c = lane; c < cols; c += G) acc += (double)dexp(xr[c] - m);
        const T s = (T)group_reduce<G>(acc, SumOp());
        const T ls = dlog(s), inv = (T)1 / s;
        T *br = bp + row_off;
        if (ids) {
            if (active) {
                const int64_t id = ids[r];
                for (int64_t c = lane; c < cols; c += G) {
                    T v = dexp(xr[c] - m) * inv;
                    if (c == id) v -= (T)1;
                    br[c] = v;
                }
                if (lane == 0) loss[r] = ls - (xr[id] - m);
            }
        } else {
            const T *pr = probs + row_off;
            double l = 0;
            if (active)
                for (int64_t c = lane; c < cols; c += G) {
                    const T p = pr[c];
                    l += (double)(p * (ls - (xr[c] - m)));
                    br[c] = dexp(xr[c] - m) * inv - p;
                }
            l = group_reduce<G>(l, SumOp());
            if (active && lane == 0) loss[r] = (T)l;
        }
    }
}

// ---- LayerNorm (executor/cpu/kernels_transformer.c: the same formulas, sums in double) ----
// Products that feed a sum are rounded first (__dmul_rn), as the CPU computes them.

template <class T, int G>
__global__ void layer_norm_rows(const T *x, const T *gamma, const T *beta, T *y, T *mean, T *rstd,
                                int64_t rows, int64_t cols, double eps) {
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * (kThreads / G); base < rows;
         base += (int64_t)gridDim.x * (kThreads / G)) {
        const int64_t r = base + threadIdx.x / G;
        const bool active = r < rows;
        const T *xr = x + (active ? r : 0) * cols;
        double s = 0;
        if (active)
            for (int64_t c = lane; c < cols; c += G) s += (double)xr[c];
        const double sum = group_reduce<G>(s, SumOp());
        const double mu = cols ? sum / (double)cols : 0;
        double q = 0;
        if (active)
            for (int64_t c = lane; c < cols; c += G) {
                const double d = (double)xr[c] - mu;
                q += __dmul_rn(d, d);
            }
        const double qs = group_reduce<G>(q, SumOp());
        const double rs = 1 / sqrt((cols ? qs / (double)cols : 0) + eps);
        if (active) {
            T *yr = y + r * cols;
            for (int64_t c = lane; c < cols; c += G)
                yr[c] = (T)(__dmul_rn(__dmul_rn((double)xr[c] - mu, rs), (double)gamma[c]) + (double)beta[c]);
            if (lane == 0) {
                mean[r] = (T)mu;
                rstd[r] = (T)rs;
            }
        }
    }
}

template <class T, int G>
__global__ void layer_norm_grad_rows(const T *dy, const T *x, const T *gamma, const T *mean, const T *rstd,
                                     T *dx, int64_t rows, int64_t cols) {
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * (kThreads / G); base < rows;
         base += (int64_t)gridDim.x * (kThreads / G)) {
        const int64_t r = base + threadIdx.x / G;
        const bool active = r < rows;
        const int64_t off = (active ? r : 0) * cols;
        const double mu = active ? (double)mean[r] : 0, rs = active ? (double)rstd[r] : 0;
        double sg = 0, sgx = 0;
        if (active)
            for (int64_t c = lane; c < cols; c += G) {
                const double xh = __dmul_rn((double)x[off + c] - mu, rs);
                const double gg = __dmul_rn((double)dy[off + c], (double)gamma[c]);
                sg += gg;
                sgx += __dmul_rn(gg, xh);
            }
        const double mg = group_reduce<G>(sg, SumOp()) / (double)cols;
        const double mgx = group_reduce<G>(sgx, SumOp()) / (double)cols;
        if (active)
            for (int64_t c = lane; c < cols; c += G) {
                const double xh = __dmul_rn((double)x[off + c] - mu, rs);
                const double gg = __dmul_rn((double)dy[off + c], (double)gamma[c]);
                dx[off + c] = (T)__dmul_rn(rs, gg - mg - __dmul_rn(xh, mgx));
            }
    }
}

// dgamma and dbeta: one thread per column sums its rows in order, as the CPU does.
template <class T>
__global__ void layer_norm_grad_params(const T *dy, const T *x, const T *mean, const T *rstd, T *dgamma,
                                       T *dbeta, int64_t rows, int64_t cols) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride) {
        double g = 0, b = 0;
        for (int64_t r = 0; r < rows; r++) {
            const double d = (double)dy[r * cols + c];
            g += __dmul_rn(d, __dmul_rn((double)x[r * cols + c] - (double)mean[r], (double)rstd[r]));
            b += d;
        }
        dgamma[c] = (T)g;
        dbeta[c] = (T)b;
    }
}

// Threads per row: one for short rows (the whole row in one thread, in the CPU's order),
// a warp up to a few hundred columns, the block beyond.
int row_group(int64_t cols) { return cols <= 16 ? 1 : cols <= 512 ? 32 : kThreads; }

#define LAUNCH_ROWS(KERNEL, T, ...)                                                     \
    do {                                                                                \
        const int g_ = row_group(cols);                                                 \
        const unsigned grid_ = grid_for(rows, kThreads / g_);                           \
        if (g_ == 1) KERNEL<T, 1><<<grid_, kThreads, 0, stream>>>(__VA_ARGS__);         \
        else if (g_ == 32) KERNEL<T, 32><<<grid_, kThreads, 0, stream>>>(__VA_ARGS__);  \
        else KERNEL<T, kThreads><<<grid_, kThreads, 0, stream>>>(__VA_ARGS__);          \
    } while (0)

// ---- reductions ----

enum { KIND_SUM = 0, KIND_MAX = 2, KIND_COUNT_EQ = 3 };

// x viewed as kept dims (kd, input strides ks) by reduced dims (rd, input strides rs), both
// after dropping 1s and merging neighbours; the outputs are the kept dims in row-major order.
struct Layout {
    int nk, nr;
    int64_t kd[kMaxDims], ks[kMaxDims];
    int64_t rd[kMaxDims], rs[kMaxDims];
};

// One task is (output o, chunk s) with task = s * n_out + o; it reduces elements
// [s * chunk, min(R, (s + 1) * chunk)) of o's group into y[task]. With n_split 1, y is the
// result (divided by mean_div when > 0); otherwise partials of Acc for a second pass.
// KIND_COUNT_EQ counts the elements equal to eq[o].
template <class TIn, class Acc, class TOut, int G, int KIND>
__global__ void reduce_k(const TIn *x, TOut *y, Layout L, int64_t R, int64_t n_out,
                         int64_t n_split, int64_t chunk, int64_t mean_div, const TIn *eq) {
    const int lane = threadIdx.x % G;
    const int64_t per_block = kThreads / G;
    const int64_t n_tasks = n_out * n_split;
    for (int64_t base = (int64_t)blockIdx.x * per_block; base < n_tasks;
         base += (int64_t)gridDim.x * per_block) {
        const int64_t task = base + threadIdx.x / G;
        const bool active = task < n_tasks;
        Acc acc = KIND == KIND_MAX ? neg_inf<Acc>() : (Acc)0;
        if (active) {
            const int64_t o = task % n_out, s = task / n_out;
            const TIn *xo = x + unravel(o, L.nk, L.kd, L.ks);
            const int64_t lo = s * chunk, hi = lo + chunk < R ? lo + chunk : R;
            const TIn target = KIND == KIND_COUNT_EQ ? eq[o] : TIn();
            // One reduced dim (the usual case) steps by a stride; several unravel.
            const bool one_dim = L.nr == 1;
            const int64_t st = L.rs[0];
            for (int64_t i = lo + lane; i < hi; i += G) {
                const TIn v = xo[one_dim ? i * st : unravel(i, L.nr, L.rd, L.rs)];
                if constexpr (KIND == KIND_MAX) acc = MaxOp()(acc, (Acc)v);
                else if constexpr (KIND == KIND_COUNT_EQ) acc += v == target ? (Acc)1 : (Acc)0;
                else acc += (Acc)v;
            }
        }
        if constexpr (KIND == KIND_MAX) acc = group_reduce<G>(acc, MaxOp());
        else acc = group_reduce<G>(acc, SumOp());
        if (active && lane == 0) {
            // Mean as the CPU: the sum rounded to the element type, then divided.
            if (mean_div > 0) y[task] = (TOut)acc / (TOut)mean_div;
            else y[task] = (TOut)acc;
        }
    }
}

struct Plan {
    Layout L;
    int64_t n_out, R;     // outputs, elements per output
    int64_t n_split;      // chunks per output (> 1: two passes through scratch)
    int64_t chunk;
    int G;
    // The second pass over the partials [n_split, n_out].
    Layout L2;
    int G2;
};

int pick_group(const Layout &L, int64_t n_out, int64_t R) {
    const bool contiguous = L.nr == 1 && L.rs[0] == 1;
    // Strided groups with many outputs: a thread per output reads neighbouring outputs'
    // elements in one coalesced access.
    if (!contiguous && n_out >= 8192) return 1;
    if (R >= 256) return kThreads;
    if (R >= 32 && contiguous) return 32;
    return 1;
}

// Fills p for x of dims[0..rank) reduced over mask. Returns false when rank is too large or
// a dim negative. p->n_out and p->R are set also for empty tensors (then no layout is built).
bool make_plan(int rank, const int64_t *dims, uint32_t mask, bool allow_split, Plan *p) {
    if (rank < 0 || rank > kMaxDims) return false;
    int64_t n_out = 1, R = 1;
    for (int d = 0; d < rank; d++) {
        if (dims[d] < 0) return false;
        if (mask & (1u << d)) R *= dims[d];
        else n_out *= dims[d];
    }
    p->n_out = n_out;
    p->R = R;
    p->n_split = 1;
    p->chunk = R;
    p->G = 1;
    p->G2 = 1;
    if (n_out == 0 || R == 0) return true;
    // Groups of neighbouring dims of one kind (size-1 dims dropped: they move nothing).
    int n_g = 0;
    int64_t gsize[kMaxDims];
    bool gred[kMaxDims];
    for (int d = 0; d < rank; d++) {
        if (dims[d] == 1) continue;
        const bool red = (mask & (1u << d)) != 0;
        if (n_g > 0 && gred[n_g - 1] == red) {
            gsize[n_g - 1] *= dims[d];
        } else {
            gsize[n_g] = dims[d];
            gred[n_g] = red;
            n_g++;
        }
    }
    int64_t gstride[kMaxDims];
    int64_t acc = 1;
    for (int g = n_g - 1; g >= 0; g--) {
        gstride[g] = acc;
        acc *= gsize[g];
    }
    Layout &L = p->L;
    L.nk = L.nr = 0;
    for (int g = 0; g < n_g; g++) {
        if (gred[g]) {
            L.rd[L.nr] = gsize[g];
            L.rs[L.nr++] = gstride[g];
        } else {
            L.kd[L.nk] = gsize[g];
            L.ks[L.nk++] = gstride[g];
        }
    }
    if (L.nr == 0) {   // nothing to reduce: one element per output
        L.nr = 1;
        L.rd[0] = 1;
        L.rs[0] = 1;
    }
    p->G = pick_group(L, n_out, R);
    if (allow_split) {
        // Few outputs over many elements: split each output's elements into chunks (of at
        // least 64 elements per thread) so that about 2^18 threads work, then combine.
        const int64_t target = (int64_t)1 << 18, min_per_thread = 64;
        if (n_out * p->G < target) {
            int64_t s = target / (n_out * p->G);
            const int64_t by_work = R / (p->G * min_per_thread);
            if (s > by_work) s = by_work;
            if (s > 4096) s = 4096;
            if (s > 1) {
                p->chunk = (R + s - 1) / s;
                p->n_split = (R + p->chunk - 1) / p->chunk;
            }
        }
    }
    if (p->n_split > 1) {
        Layout &M = p->L2;
        M.nk = 1;
        M.kd[0] = n_out;
        M.ks[0] = 1;
        M.nr = 1;
        M.rd[0] = p->n_split;
        M.rs[0] = n_out;
        p->G2 = pick_group(M, n_out, p->n_split);
    }
    return true;
}

template <class TIn, class Acc, class TOut, int KIND>
void launch_reduce_k(int G, const TIn *x, TOut *y, const Layout &L, int64_t R, int64_t n_out,
                     int64_t n_split, int64_t chunk, int64_t mean_div, const TIn *eq,
                     cudaStream_t stream) {
    const unsigned grid = grid_for(n_out * n_split, kThreads / G);
    if (G == 1)
        reduce_k<TIn, Acc, TOut, 1, KIND><<<grid, kThreads, 0, stream>>>(x, y, L, R, n_out, n_split, chunk, mean_div, eq);
    else if (G == 32)
        reduce_k<TIn, Acc, TOut, 32, KIND><<<grid, kThreads, 0, stream>>>(x, y, L, R, n_out, n_split, chunk, mean_div, eq);
    else
        reduce_k<TIn, Acc, TOut, kThreads, KIND><<<grid, kThreads, 0, stream>>>(x, y, L, R, n_out, n_split, chunk, mean_div, eq);
}

template <class T>
__global__ void fill_value_k(T *dst, int64_t n, T value) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = value;
}

template <class T>
__global__ void fill_from_k(T *dst, int64_t n, const T *value) {
    const T v = *value;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = v;
}

// Accumulator of sums and maxima for element type T (sums of float32 in double).
template <class T, int KIND> struct AccOf { typedef double type; };
template <class T> struct AccOf<T, KIND_MAX> { typedef T type; };

template <class T, int KIND>
cudaError_t reduce_typed(const Plan &p, const T *x, T *y, int64_t mean_div, void *scratch,
                         cudaStream_t stream) {
    typedef typename AccOf<T, KIND>::type Acc;
    if (p.n_split == 1) {
        launch_reduce_k<T, Acc, T, KIND>(p.G, x, y, p.L, p.R, p.n_out, 1, p.R, mean_div, nullptr,
                                         stream);
    } else {
        Acc *part = (Acc *)scratch;
        launch_reduce_k<T, Acc, Acc, KIND>(p.G, x, part, p.L, p.R, p.n_out, p.n_split, p.chunk, 0,
                                           nullptr, stream);
        launch_reduce_k<Acc, Acc, T, KIND>(p.G2, part, y, p.L2, p.n_split, p.n_out, 1, p.n_split,
                                           mean_div, nullptr, stream);
    }
    return cudaGetLastError();
}

// dx[i] = (x[i] == y[o]) * dy[o] / cnt[o], o the output index of i, in double like the CPU.
// Merged dims d[0..n) of x with output strides os[] (0 on reduced dims).
struct GradLayout {
    int n;
    int64_t d[kMaxDims], os[kMaxDims];
};

// The groups of make_plan again, in order, each with its output stride (0 where reduced).
void make_grad_layout(int rank, const int64_t *dims, uint32_t mask, GradLayout *M) {
    M->n = 0;
    int64_t gsize[kMaxDims];
    bool gred[kMaxDims];
    for (int d = 0; d < rank; d++) {
        if (dims[d] == 1) continue;
        const bool red = (mask & (1u << d)) != 0;
        if (M->n > 0 && gred[M->n - 1] == red) {
            gsize[M->n - 1] *= dims[d];
        } else {
            gsize[M->n] = dims[d];
            gred[M->n] = red;
            M->n++;
        }
    }
    int64_t ostride = 1;
    for (int g = M->n - 1; g >= 0; g--) {
        M->d[g] = gsize[g];
        M->os[g] = gred[g] ? 0 : ostride;
        if (!gred[g]) ostride *= gsize[g];
    }
}

template <class T>
__global__ void max_grad_k(const T *dy, const T *x, const T *y, const double *cnt, T *dx,
                           int64_t n, GradLayout M) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t o = unravel(i, M.n, M.d, M.os);
        const double m = x[i] == y[o] ? 1.0 : 0.0;
        dx[i] = (T)(m * (double)dy[o] / cnt[o]);
    }
}

// ---- strided box copy ----
struct Box {
    int n;
    int64_t d[kMaxDims], ss[kMaxDims], ds[kMaxDims];
};

// B = the box dims[0..rank) without its 1s, neighbours merged where both sides step over them
// contiguously; *n its element count. Returns -1 for a bad rank or dim, 0 for an empty box.
int make_box(int rank, const int64_t *dims, const int64_t *dst_strides,
             const int64_t *src_strides, Box *B, int64_t *n) {
    if (rank < 0 || rank > kMaxDims) return -1;
    B->n = 0;
    *n = 1;
    for (int d = 0; d < rank; d++) {
        if (dims[d] < 0) return -1;
        if (dims[d] == 0) return 0;
        *n *= dims[d];
        if (dims[d] == 1) continue;
        const int k = B->n - 1;
        if (k >= 0 && B->ss[k] == src_strides[d] * dims[d] && B->ds[k] == dst_strides[d] * dims[d]) {
            B->d[k] *= dims[d];
            B->ss[k] = src_strides[d];
            B->ds[k] = dst_strides[d];
            continue;
        }
        B->d[B->n] = dims[d];
        B->ss[B->n] = src_strides[d];
        B->ds[B->n] = dst_strides[d];
        B->n++;
    }
    return 1;
}

template <class T>
__global__ void copy_box_k(T *dst, const T *src, Box B, int64_t n, int64_t divisor) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t idx = i, so = 0, dof = 0;
        for (int k = B.n - 1; k >= 0; k--) {
            const int64_t q = k > 0 ? idx / B.d[k] : 0;
            const int64_t rem = idx - q * B.d[k];
            so += rem * B.ss[k];
            dof += rem * B.ds[k];
            idx = q;
        }
        T v = src[so];
        if (divisor > 0) v = v / (T)divisor;
        dst[dof] = v;
    }
}

}  // namespace

// ---- launchers ----

extern "C" cudaError_t cuda_launch_softmax(bool f64, const void *x, void *y, int64_t rows,
                                           int64_t cols, bool is_log, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if (f64) LAUNCH_ROWS(softmax_rows, double, (const double *)x, (double *)y, rows, cols, is_log);
    else LAUNCH_ROWS(softmax_rows, float, (const float *)x, (float *)y, rows, cols, is_log);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_layer_norm(bool f64, const void *x, const void *gamma, const void *beta,
                                              void *y, void *mean, void *rstd, int64_t rows, int64_t cols,
                                              double eps, cudaStream_t stream) {
    if (rows <= 0 || cols < 0) return cudaSuccess;   // width 0: each row's mean 0, rstd 1 / sqrt(eps)
    if (f64)
        LAUNCH_ROWS(layer_norm_rows, double, (const double *)x, (const double *)gamma, (const double *)beta,
                    (double *)y, (double *)mean, (double *)rstd, rows, cols, eps);
    else
        LAUNCH_ROWS(layer_norm_rows, float, (const float *)x, (const float *)gamma, (const float *)beta,
                    (float *)y, (float *)mean, (float *)rstd, rows, cols, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_layer_norm_grad(bool f64, const void *dy, const void *x, const void *gamma,
                                                   const void *mean, const void *rstd, void *dx, void *dgamma,
                                                   void *dbeta, int64_t rows, int64_t cols,
                                                   cudaStream_t stream) {
    if (cols <= 0) return cudaSuccess;
    const unsigned pgrid = grid_for(cols, kThreads);
    if (f64) {
        if (rows > 0)
            LAUNCH_ROWS(layer_norm_grad_rows, double, (const double *)dy, (const double *)x,
                        (const double *)gamma, (const double *)mean, (const double *)rstd, (double *)dx, rows,
                        cols);
        layer_norm_grad_params<double><<<pgrid, kThreads, 0, stream>>>(
            (const double *)dy, (const double *)x, (const double *)mean, (const double *)rstd, (double *)dgamma,
            (double *)dbeta, rows, cols);
    } else {
        if (rows > 0)
            LAUNCH_ROWS(layer_norm_grad_rows, float, (const float *)dy, (const float *)x, (const float *)gamma,
                        (const float *)mean, (const float *)rstd, (float *)dx, rows, cols);
        layer_norm_grad_params<float><<<pgrid, kThreads, 0, stream>>>(
            (const float *)dy, (const float *)x, (const float *)mean, (const float *)rstd, (float *)dgamma,
            (float *)dbeta, rows, cols);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_softmax_grad(bool f64, const void *y, const void *dy, void *dx,
                                                int64_t rows, int64_t cols, bool is_log,
                                                cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if (f64)
        LAUNCH_ROWS(softmax_grad_rows, double, (const double *)y, (const double *)dy, (double *)dx,
                    rows, cols, is_log);
    else
        LAUNCH_ROWS(softmax_grad_rows, float, (const float *)y, (const float *)dy, (float *)dx, rows,
                    cols, is_log);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_xent(bool f64, const void *logits, const void *probs,
                                        const int64_t *ids, void *loss, void *backprop,
                                        int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if ((probs == nullptr) == (ids == nullptr)) return cudaErrorInvalidValue;
    if (f64)
        LAUNCH_ROWS(xent_rows, double, (const double *)logits, (const double *)probs, ids,
                    (double *)loss, (double *)backprop, rows, cols);
    else
        LAUNCH_ROWS(xent_rows, float, (const float *)logits, (const float *)probs, ids,
                    (float *)loss, (float *)backprop, rows, cols);
    return cudaGetLastError();
}

extern "C" size_t cuda_reduce_scratch_bytes(bool f64, int kind, int rank, const int64_t *dims,
                                            uint32_t mask) {
    Plan p;
    if (!make_plan(rank, dims, mask, true, &p) || p.n_split <= 1) return 0;
    const size_t acc_size = kind == CUDA_REDUCE_MAX && !f64 ? sizeof(float) : sizeof(double);
    return (size_t)(p.n_split * p.n_out) * acc_size;
}

extern "C" cudaError_t cuda_launch_reduce(bool f64, int kind, const void *x, void *y, int rank,
                                          const int64_t *dims, uint32_t mask, void *scratch,
                                          cudaStream_t stream) {
    Plan p;
    if (!make_plan(rank, dims, mask, true, &p)) return cudaErrorInvalidValue;
    if (p.n_out == 0) return cudaSuccess;
    if (p.R == 0) {   // sums over nothing are 0 (a max over nothing is the caller's error)
        if (kind == CUDA_REDUCE_MAX) return cudaErrorInvalidValue;
        return cudaMemsetAsync(y, 0, (size_t)p.n_out * (f64 ? sizeof(double) : sizeof(float)),
                               stream);
    }
    if (p.n_split > 1 && !scratch) return cudaErrorInvalidValue;
    const int64_t mean_div = kind == CUDA_REDUCE_MEAN ? p.R : 0;
    if (kind == CUDA_REDUCE_MAX)
        return f64 ? reduce_typed<double, KIND_MAX>(p, (const double *)x, (double *)y, 0, scratch, stream)
                   : reduce_typed<float, KIND_MAX>(p, (const float *)x, (float *)y, 0, scratch, stream);
    return f64 ? reduce_typed<double, KIND_SUM>(p, (const double *)x, (double *)y, mean_div, scratch, stream)
               : reduce_typed<float, KIND_SUM>(p, (const float *)x, (float *)y, mean_div, scratch, stream);
}

extern "C" size_t cuda_max_grad_scratch_bytes(int rank, const int64_t *dims, uint32_t mask) {
    Plan p;
    if (!make_plan(rank, dims, mask, false, &p)) return 0;
    return (size_t)p.n_out * sizeof(double);
}

extern "C" cudaError_t cuda_launch_max_grad(bool f64, const void *dy, const void *x, const void *y,
                                            void *dx, int rank, const int64_t *dims, uint32_t mask,
                                            void *scratch, cudaStream_t stream) {
    Plan p;
    if (!make_plan(rank, dims, mask, false, &p)) return cudaErrorInvalidValue;
    if (p.n_out == 0 || p.R == 0) return cudaSuccess;   // dx has no elements
    if (!scratch) return cudaErrorInvalidValue;
    double *cnt = (double *)scratch;
    GradLayout M;
    make_grad_layout(rank, dims, mask, &M);
    const int64_t n = p.n_out * p.R;
    const unsigned grid = grid_for(n, kThreads);
    if (f64) {
        launch_reduce_k<double, double, double, KIND_COUNT_EQ>(p.G, (const double *)x, cnt, p.L, p.R,
                                                               p.n_out, 1, p.R, 0, (const double *)y,
                                                               stream);
        max_grad_k<double><<<grid, kThreads, 0, stream>>>((const double *)dy, (const double *)x,
                                                          (const double *)y, cnt, (double *)dx, n, M);
    } else {
        launch_reduce_k<float, double, double, KIND_COUNT_EQ>(p.G, (const float *)x, cnt, p.L, p.R,
                                                              p.n_out, 1, p.R, 0, (const float *)y,
                                                              stream);
        max_grad_k<float><<<grid, kThreads, 0, stream>>>((const float *)dy, (const float *)x,
                                                         (const float *)y, cnt, (float *)dx, n, M);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_copy_box(bool f64, void *dst, const int64_t *dst_strides,
                                            const void *src, const int64_t *src_strides, int rank,
                                            const int64_t *dims, int64_t divisor,
                                            cudaStream_t stream) {
    Box B;
    int64_t n;
    const int got = make_box(rank, dims, dst_strides, src_strides, &B, &n);
    if (got < 0) return cudaErrorInvalidValue;
    if (got == 0) return cudaSuccess;
    const size_t es = f64 ? sizeof(double) : sizeof(float);
    if (divisor <= 0) {
        if (B.n == 0) return cudaMemcpyAsync(dst, src, es, cudaMemcpyDeviceToDevice, stream);
        if (B.n == 1 && B.ss[0] == 1 && B.ds[0] == 1)
            return cudaMemcpyAsync(dst, src, (size_t)n * es, cudaMemcpyDeviceToDevice, stream);
        // Rows of contiguous elements at pitches (Concat, Split, most Slices); cudaMemcpy2D
        // takes pitches below 2^31 bytes.
        const int64_t max_pitch = ((int64_t)1 << 31) / (int64_t)es;
        if (B.n == 2 && B.ss[1] == 1 && B.ds[1] == 1 && B.ss[0] >= B.d[1] && B.ds[0] >= B.d[1] &&
            B.ss[0] < max_pitch && B.ds[0] < max_pitch)
            return cudaMemcpy2DAsync(dst, (size_t)B.ds[0] * es, src, (size_t)B.ss[0] * es,
                                     (size_t)B.d[1] * es, (size_t)B.d[0], cudaMemcpyDeviceToDevice,
                                     stream);
    }
    const unsigned grid = grid_for(n, kThreads);
    if (f64)
        copy_box_k<double><<<grid, kThreads, 0, stream>>>((double *)dst, (const double *)src, B, n,
                                                          divisor);
    else
        copy_box_k<float><<<grid, kThreads, 0, stream>>>((float *)dst, (const float *)src, B, n,
                                                         divisor);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_fill_value(bool f64, void *dst, int64_t n, double value,
                                              cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const unsigned grid = grid_for(n, kThreads);
    if (f64) fill_value_k<double><<<grid, kThreads, 0, stream>>>((double *)dst, n, value);
    else fill_value_k<float><<<grid, kThreads, 0, stream>>>((float *)dst, n, (float)value);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_fill_from(bool f64, void *dst, int64_t n, const void *value_dev,
                                             cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const unsigned grid = grid_for(n, kThreads);
    if (f64)
        fill_from_k<double><<<grid, kThreads, 0, stream>>>((double *)dst, n, (const double *)value_dev);
    else
        fill_from_k<float><<<grid, kThreads, 0, stream>>>((float *)dst, n, (const float *)value_dev);
    return cudaGetLastError();
}
