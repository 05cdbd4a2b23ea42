/* Launchers of sparse.cu: Gather, UnsortedSegmentSum, ScatterAdd/Sub/Update,
 * SparseApplyAdagrad, SparseApplyAdam and DynamicStitch, the ops that read or change rows of a
 * table at indices. Every pointer is device memory on the GPU of `stream`; sizes are host
 * values, in elements. `f64` picks the element type of the float data: double when true, float
 * otherwise. A row is `row` consecutive elements; row i of a table starts at element i * row.
 * Each launcher only queues work on the stream and returns the launch's error (cudaSuccess
 * when there is nothing to do; cudaErrorInvalidValue for a negative size). Usable from C and
 * C++.
 *
 * The ops that add or apply several rows at one index take the indices grouped by the row
 * they name (cuda_row_groups, built on the host): one thread per element of a touched row
 * goes through that row's positions in their order, as the CPU kernels' loops do, so results
 * do not depend on thread timing and equal the CPU's rounding for rounding. */
#ifndef DG_EXEC_CUDA_LAUNCH_SPARSE_H
#define DG_EXEC_CUDA_LAUNCH_SPARSE_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// The positions 0 .. n-1 of an index list grouped by the row each names: group g is row
// rows[g] (no row twice), named at positions pos[first[g]] .. pos[first[g + 1] - 1], in
// increasing order. n_groups groups; rows, first (n_groups + 1 entries) and pos are device
// memory.
typedef struct cuda_row_groups {
    int64_t n_groups;
    const int64_t *rows, *first, *pos;
} cuda_row_groups;

// Gather: out row i = params row indices[i], for i < n_indices. indices are int64 when idx64,
// int32 otherwise, each in [0, rows of params) (checked by the caller).
cudaError_t cuda_launch_gather(bool f64, const void *params, const void *indices, bool idx64,
                               int64_t n_indices, int64_t row, void *out, cudaStream_t stream);

// UnsortedSegmentSum: out (n_segments rows) = 0, then for each group, out row rows[g] = 0 +
// data row pos[first[g]] + data row pos[first[g] + 1] + ..., added in that order.
cudaError_t cuda_launch_segment_sum(bool f64, const void *data, cuda_row_groups groups,
                                    int64_t row, void *out, int64_t n_segments,
                                    cudaStream_t stream);

typedef enum cuda_scatter_op {
    CUDA_SCATTER_ADD,
    CUDA_SCATTER_SUB,
    CUDA_SCATTER_UPDATE
} cuda_scatter_op;

// ScatterAdd/Sub/Update in place on var: for each group, var row rows[g] gets the update rows
// at its positions added (subtracted) in order, or, for UPDATE, the last of them.
cudaError_t cuda_launch_scatter(bool f64, cuda_scatter_op op, void *var, cuda_row_groups groups,
                                const void *updates, int64_t row, cudaStream_t stream);

typedef enum cuda_accum_rule {
    CUDA_ACCUM_ADAGRAD,    // accum += g * g; var -= lr * g / sqrt(accum)
    CUDA_ACCUM_MOMENTUM,   // accum = accum * momentum + g; var -= lr * accum
    CUDA_ACCUM_NESTEROV    // accum = accum * momentum + g; var -= g * lr + accum * momentum * lr
} cuda_accum_rule;

// SparseApplyAdagrad and SparseApplyMomentum (TensorFlow's) in place on var and accum: for each
// group, position by position in order, with g the grad row at the position, the rule's
// update. lr, momentum (unused by Adagrad): one element each, or NULL for 0 (an empty tensor,
// which the CPU reads as 0).
cudaError_t cuda_launch_sparse_accum(bool f64, cuda_accum_rule rule, void *var, void *accum,
                                     const void *lr, const void *momentum, cuda_row_groups groups,
                                     const void *grad, int64_t row, cudaStream_t stream);

// SparseApplyAdam (TensorFlow 1's _apply_sparse_shared) in place on var, m and v (n elements
// each): m *= beta1, v *= beta2 everywhere; for each group, position by position, m += g * (1 -
// beta1), v += g * g * (1 - beta2); then var -= lr_t * m / (sqrt(v) + epsilon) everywhere, with
// lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power) in double. scalars: beta1_power,
// beta2_power, lr, beta1, beta2, epsilon, one element each, or NULL for 0.
cudaError_t cuda_launch_sparse_adam(bool f64, void *var, void *m, void *v,
                                    const void *const scalars[6], cuda_row_groups groups,
                                    const void *grad, int64_t row, int64_t n,
                                    cudaStream_t stream);

// DynamicStitch: out row r (r < n_rows) = the row src[r] points to (a device address, row
// elements), or zeros where src[r] is NULL. src is a device array of n_rows pointers.
cudaError_t cuda_launch_dynamic_stitch(bool f64, const void *const *src, int64_t n_rows,
                                       int64_t row, void *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
