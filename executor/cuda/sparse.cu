/* CUDA kernels for the embedding and sparse ops (launch_sparse.h).
 *
 * Gather and DynamicStitch copy whole elements: each thread writes output elements found from
 * the output's linear index. The ops that meet a row more than once (UnsortedSegmentSum,
 * ScatterAdd/Sub/Update, SparseApplyAdagrad, SparseApplyMomentum, SparseApplyAdam's m and v)
 * gather rather than
 * scatter, as the convolution gradients of conv.cu do: the host groups the positions of the
 * indices by row (cuda_row_groups), and the thread of element k of a touched row goes through
 * the row's positions in their order and is the only one to write that element. No atomics:
 * results do not depend on thread timing, and the operations are the CPU kernels'
 * (executor/cpu/kernels_sparse.c) in the CPU's order. As in math.cu, every product that feeds
 * an addition is written with mul() (__fmul_rn/__dmul_rn), which nvcc never fuses into a
 * multiply-add, since the CPU code rounds the product first; division and sqrt are
 * IEEE-rounded (no fast-math).
 *
 * A row repeated many times is applied by one thread in sequence: that is the semantics
 * (TensorFlow's SparseApplyAdagrad applies a repeated index twice), and the price of sums
 * that equal the CPU's. All loops are grid-stride loops over a bounded grid. */
#include <stdint.h>

#include "launch_sparse.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned grid_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > kMaxBlocks) b = kMaxBlocks;
    return (unsigned)b;
}

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }

// A scalar operand: its element, or 0 for an empty tensor (NULL), as the CPU reads it.
template <class T>
__device__ __forceinline__ T scalar(const T *p) {
    return p ? *p : T(0);
}

// ---- Gather ----

template <class T, class I>
__global__ void gather_k(const T *params, const I *indices, int64_t row, T *out, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t i = e / row, k = e - i * row;
        out[e] = params[(int64_t)indices[i] * row + k];
    }
}

// ---- the grouped ops: thread e is element k of group g's row ----

template <class T>
__global__ void segment_sum_k(const T *data, cuda_row_groups G, int64_t row, T *out,
                              int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t g = e / row, k = e - g * row;
        T acc = T(0);   // the CPU adds into a zeroed output: 0 + x turns -0 into +0 there too
        for (int64_t j = G.first[g]; j < G.first[g + 1]; j++) acc = acc + data[G.pos[j] * row + k];
        out[G.rows[g] * row + k] = acc;
    }
}

template <class T>
__global__ void scatter_k(cuda_scatter_op op, T *var, cuda_row_groups G, const T *updates,
                          int64_t row, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t g = e / row, k = e - g * row;
        T *w = var + G.rows[g] * row + k;
        const int64_t j0 = G.first[g], j1 = G.first[g + 1];
        if (op == CUDA_SCATTER_UPDATE) {
            *w = updates[G.pos[j1 - 1] * row + k];   // the last one written wins
            continue;
        }
        T x = *w;
        for (int64_t j = j0; j < j1; j++) {
            const T u = updates[G.pos[j] * row + k];
            x = op == CUDA_SCATTER_ADD ? x + u : x - u;
        }
        *w = x;
    }
}

// SparseApplyAdagrad and SparseApplyMomentum: one accumulator slot, a row updated position by
// position.
template <class T>
__global__ void sparse_accum_k(cuda_accum_rule rule, T *var, T *accum, const T *lr,
                               const T *momentum, cuda_row_groups G, const T *grad, int64_t row,
                               int64_t n) {
    const T l = scalar(lr), mo = scalar(momentum);
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t g = e / row, k = e - g * row, o = G.rows[g] * row + k;
        T a = accum[o], w = var[o];
        for (int64_t j = G.first[g]; j < G.first[g + 1]; j++) {
            const T gr = grad[G.pos[j] * row + k];
            if (rule == CUDA_ACCUM_ADAGRAD) {
                a = a + mul(gr, gr);
                w = w - mul(l, gr) / d_sqrt(a);
            } else {
                a = mul(a, mo) + gr;
                w = w - (rule == CUDA_ACCUM_NESTEROV ? mul(gr, l) + mul(mul(a, mo), l) : mul(a, l));
            }
        }
        accum[o] = a;
        var[o] = w;
    }
}

// ---- SparseApplyAdam: decay everywhere, the rows added, the step everywhere ----

template <class T>
struct AdamScalars {
    const T *b1p, *b2p, *lr, *beta1, *beta2, *eps;
};

template <class T>
__global__ void adam_decay_k(T *m, T *v, AdamScalars<T> S, int64_t n) {
    const T b1 = scalar(S.beta1), b2 = scalar(S.beta2);
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        m[i] = mul(m[i], b1);
        v[i] = mul(v[i], b2);
    }
}

template <class T>
__global__ void adam_rows_k(T *m, T *v, AdamScalars<T> S, cuda_row_groups G, const T *grad,
                            int64_t row, int64_t n) {
    // 1 - beta in T, as the CPU's (1 - b1) with b1 of type T.
    const T c1 = T(1) - scalar(S.beta1), c2 = T(1) - scalar(S.beta2);
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t g = e / row, k = e - g * row, o = G.rows[g] * row + k;
        T mo = m[o], vo = v[o];
        for (int64_t j = G.first[g]; j < G.first[g + 1]; j++) {
            const T gr = grad[G.pos[j] * row + k];
            mo = mo + mul(gr, c1);
            vo = vo + mul(mul(gr, gr), c2);
        }
        m[o] = mo;
        v[o] = vo;
    }
}

template <class T>
__global__ void adam_step_k(T *w, const T *m, const T *v, AdamScalars<T> S, int64_t n) {
    // The CPU computes lr_t in double from the scalars (as doubles), then rounds it to T.
    const double b1p = (double)scalar(S.b1p), b2p = (double)scalar(S.b2p);
    const double lr_t = __dmul_rn((double)scalar(S.lr), sqrt(1.0 - b2p)) / (1.0 - b1p);
    const T l = (T)lr_t, eps = scalar(S.eps);
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        w[i] = w[i] - mul(l, m[i]) / (d_sqrt(v[i]) + eps);
}

// ---- DynamicStitch ----

template <class T>
__global__ void stitch_k(const void *const *src, int64_t row, T *out, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t r = e / row, k = e - r * row;
        const T *s = (const T *)src[r];
        out[e] = s ? s[k] : T(0);
    }
}

// ---- typed launchers ----

template <class T>
cudaError_t sparse_adam_t(void *var, void *m, void *v, const void *const scalars[6],
                          const cuda_row_groups &G, const void *grad, int64_t row, int64_t n,
                          cudaStream_t stream) {
    const AdamScalars<T> S = {(const T *)scalars[0], (const T *)scalars[1], (const T *)scalars[2],
                              (const T *)scalars[3], (const T *)scalars[4], (const T *)scalars[5]};
    adam_decay_k<T><<<grid_for(n), kThreads, 0, stream>>>((T *)m, (T *)v, S, n);
    const int64_t nr = G.n_groups * row;
    if (nr > 0)
        adam_rows_k<T><<<grid_for(nr), kThreads, 0, stream>>>((T *)m, (T *)v, S, G,
                                                             (const T *)grad, row, nr);
    adam_step_k<T><<<grid_for(n), kThreads, 0, stream>>>((T *)var, (const T *)m, (const T *)v,
                                                        S, n);
    return cudaGetLastError();
}

}  // namespace

// ---- launchers ----

extern "C" cudaError_t cuda_launch_gather(bool f64, const void *params, const void *indices,
                                          bool idx64, int64_t n_indices, int64_t row, void *out,
                                          cudaStream_t stream) {
    if (n_indices < 0 || row < 0) return cudaErrorInvalidValue;
    const int64_t n = n_indices * row;
    if (n == 0) return cudaSuccess;
    const unsigned grid = grid_for(n);
#define GATHER(T, I)                                                                      \
    gather_k<T, I><<<grid, kThreads, 0, stream>>>((const T *)params, (const I *)indices, row, \
                                                  (T *)out, n)
    if (f64) {
        if (idx64) GATHER(double, int64_t);
        else GATHER(double, int32_t);
    } else {
        if (idx64) GATHER(float, int64_t);
        else GATHER(float, int32_t);
    }
#undef GATHER
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_segment_sum(bool f64, const void *data, cuda_row_groups groups,
                                               int64_t row, void *out, int64_t n_segments,
                                               cudaStream_t stream) {
    if (groups.n_groups < 0 || row < 0 || n_segments < 0) return cudaErrorInvalidValue;
    const size_t es = f64 ? sizeof(double) : sizeof(float);
    if (n_segments * row == 0) return cudaSuccess;
    cudaError_t err = cudaMemsetAsync(out, 0, (size_t)(n_segments * row) * es, stream);
    const int64_t n = groups.n_groups * row;
    if (err != cudaSuccess || n == 0) return err;
    if (f64)
        segment_sum_k<double><<<grid_for(n), kThreads, 0, stream>>>((const double *)data, groups,
                                                                   row, (double *)out, n);
    else
        segment_sum_k<float><<<grid_for(n), kThreads, 0, stream>>>((const float *)data, groups,
                                                                  row, (float *)out, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_scatter(bool f64, cuda_scatter_op op, void *var,
                                           cuda_row_groups groups, const void *updates,
                                           int64_t row, cudaStream_t stream) {
    if (groups.n_groups < 0 || row < 0) return cudaErrorInvalidValue;
    const int64_t n = groups.n_groups * row;
    if (n == 0) return cudaSuccess;
    if (f64)
        scatter_k<double><<<grid_for(n), kThreads, 0, stream>>>(op, (double *)var, groups,
                                                               (const double *)updates, row, n);
    else
        scatter_k<float><<<grid_for(n), kThreads, 0, stream>>>(op, (float *)var, groups,
                                                              (const float *)updates, row, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_sparse_accum(bool f64, cuda_accum_rule rule, void *var,
                                                void *accum, const void *lr, const void *momentum,
                                                cuda_row_groups groups, const void *grad,
                                                int64_t row, cudaStream_t stream) {
    if (groups.n_groups < 0 || row < 0) return cudaErrorInvalidValue;
    const int64_t n = groups.n_groups * row;
    if (n == 0) return cudaSuccess;
    if (f64)
        sparse_accum_k<double><<<grid_for(n), kThreads, 0, stream>>>(
            rule, (double *)var, (double *)accum, (const double *)lr, (const double *)momentum,
            groups, (const double *)grad, row, n);
    else
        sparse_accum_k<float><<<grid_for(n), kThreads, 0, stream>>>(
            rule, (float *)var, (float *)accum, (const float *)lr, (const float *)momentum, groups,
            (const float *)grad, row, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_sparse_adam(bool f64, void *var, void *m, void *v,
                                               const void *const scalars[6],
                                               cuda_row_groups groups, const void *grad,
                                               int64_t row, int64_t n, cudaStream_t stream) {
    if (groups.n_groups < 0 || row < 0 || n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    return f64 ? sparse_adam_t<double>(var, m, v, scalars, groups, grad, row, n, stream)
               : sparse_adam_t<float>(var, m, v, scalars, groups, grad, row, n, stream);
}

extern "C" cudaError_t cuda_launch_dynamic_stitch(bool f64, const void *const *src,
                                                  int64_t n_rows, int64_t row, void *out,
                                                  cudaStream_t stream) {
    if (n_rows < 0 || row < 0) return cudaErrorInvalidValue;
    const int64_t n = n_rows * row;
    if (n == 0) return cudaSuccess;
    if (f64)
        stitch_k<double><<<grid_for(n), kThreads, 0, stream>>>(src, row, (double *)out, n);
    else
        stitch_k<float><<<grid_for(n), kThreads, 0, stream>>>(src, row, (float *)out, n);
    return cudaGetLastError();
}
