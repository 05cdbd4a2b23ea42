/* Launchers of nn.cu: softmax and cross entropy over the last axis, reductions, max gradient,
 * strided box copies and fills. Every pointer is device memory on the GPU of `stream`; shapes,
 * strides and masks are host values. `f64` picks the element type: double when true, float
 * otherwise. Each launcher only queues work on the stream and returns the launch's error
 * (cudaSuccess when there is nothing to do). Usable from C and C++. */
#ifndef DG_EXEC_CUDA_LAUNCH_NN_H
#define DG_EXEC_CUDA_LAUNCH_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- rows of the last axis: x is [rows, cols] ----

// y = softmax(x) or, with is_log, log_softmax(x), per row.
cudaError_t cuda_launch_softmax(bool f64, const void *x, void *y, int64_t rows, int64_t cols,
                                bool is_log, cudaStream_t stream);
// dx = (dy - sum(dy * y)) * y per row, or with is_log dx = dy - exp(y) * sum(dy).
cudaError_t cuda_launch_softmax_grad(bool f64, const void *y, const void *dy, void *dx,
                                     int64_t rows, int64_t cols, bool is_log,
                                     cudaStream_t stream);
// LayerNorm per row: y = (x - mean) * rstd * gamma + beta, mean [rows], rstd [rows] =
// 1 / sqrt(var + eps); gamma and beta [cols].
cudaError_t cuda_launch_layer_norm(bool f64, const void *x, const void *gamma, const void *beta, void *y,
                                   void *mean, void *rstd, int64_t rows, int64_t cols, double eps,
                                   cudaStream_t stream);
// LayerNormGrad: dx [rows, cols] per row, dgamma and dbeta [cols] summed over the rows (zeros
// when there are none).
cudaError_t cuda_launch_layer_norm_grad(bool f64, const void *dy, const void *x, const void *gamma,
                                        const void *mean, const void *rstd, void *dx, void *dgamma, void *dbeta,
                                        int64_t rows, int64_t cols, cudaStream_t stream);
// Softmax cross entropy per row: loss [rows], backprop [rows, cols] = softmax(logits) - p.
// Exactly one of probs ([rows, cols], the element type) and ids ([rows] int64, each in
// [0, cols), checked by the caller) is non-NULL.
cudaError_t cuda_launch_xent(bool f64, const void *logits, const void *probs, const int64_t *ids,
                             void *loss, void *backprop, int64_t rows, int64_t cols,
                             cudaStream_t stream);

// ---- reductions of x (shape dims[0..rank)) over the axes in mask (bit d: axis d) ----

enum { CUDA_REDUCE_SUM = 0, CUDA_REDUCE_MEAN = 1, CUDA_REDUCE_MAX = 2 };

// Device scratch bytes cuda_launch_reduce needs for this reduction (0: none; then scratch may
// be NULL).
size_t cuda_reduce_scratch_bytes(bool f64, int kind, int rank, const int64_t *dims,
                                 uint32_t mask);
// y (the kept axes in order, row-major) = sum, mean or max of x over the masked axes. Sum and
// mean accumulate float32 in double; max ignores NaN (as `v > m ? v : m` from -inf does) and
// gives -inf for an all-NaN group. A reduction over zero elements gives 0 (sum, mean); the
// caller rejects max of an empty group. scratch: cuda_reduce_scratch_bytes(...) bytes.
cudaError_t cuda_launch_reduce(bool f64, int kind, const void *x, void *y, int rank,
                               const int64_t *dims, uint32_t mask, void *scratch,
                               cudaStream_t stream);
// Device scratch bytes cuda_launch_max_grad needs.
size_t cuda_max_grad_scratch_bytes(int rank, const int64_t *dims, uint32_t mask);
// dx (shape of x) = dy at the maxima of each group of x over the masked axes, split evenly
// between ties, 0 elsewhere (NaN for a group without a maximum, as the CPU's 0/0). y and dy
// hold one value per group (the reduced shape, row-major).
cudaError_t cuda_launch_max_grad(bool f64, const void *dy, const void *x, const void *y, void *dx,
                                 int rank, const int64_t *dims, uint32_t mask, void *scratch,
                                 cudaStream_t stream);

// ---- copies and fills ----

// For every index i of the box dims[0..rank): dst[sum i_d * dst_strides[d]] =
// src[sum i_d * src_strides[d]], divided by divisor when divisor > 0. Strides are in
// elements and may be 0 in src (broadcasting); dst positions must not repeat. rank 0 copies
// one element.
cudaError_t cuda_launch_copy_box(bool f64, void *dst, const int64_t *dst_strides, const void *src,
                                 const int64_t *src_strides, int rank, const int64_t *dims,
                                 int64_t divisor, cudaStream_t stream);
// dst[0..n) = value.
cudaError_t cuda_launch_fill_value(bool f64, void *dst, int64_t n, double value,
                                   cudaStream_t stream);
// dst[0..n) = *value_dev (one element in device memory).
cudaError_t cuda_launch_fill_from(bool f64, void *dst, int64_t n, const void *value_dev,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
