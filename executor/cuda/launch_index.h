/* Launchers of index.cu: Tile, Select and OneHot, the array ops that move whole elements by
 * index. Every pointer is device memory on the GPU of `stream`; dims and strides are host
 * values, in elements. `f64` picks the element type of the float data: double when true,
 * float otherwise. Each launcher only queues work on the stream and returns the launch's error
 * (cudaSuccess when there is nothing to do; cudaErrorInvalidValue for a rank outside
 * 0..CUDA_INDEX_MAX_RANK or a negative dim). Usable from C and C++. */
#ifndef DG_EXEC_CUDA_LAUNCH_INDEX_H
#define DG_EXEC_CUDA_LAUNCH_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_INDEX_MAX_RANK 8   // DG_MAX_RANK

// Tile: out (row-major, out_dims[0..rank)) at index (i_0, ..., i_r-1) is x (row-major,
// x_dims[0..rank)) at (i_0 mod x_dims[0], ...). Each out_dims[k] is a multiple of x_dims[k];
// x_dims[k] is 0 only where out_dims[k] is. rank 0 copies one element.
cudaError_t cuda_launch_tile(bool f64, const void *x, const int64_t *x_dims, void *out,
                             const int64_t *out_dims, int rank, cudaStream_t stream);

// Select: for every index of the output (row-major, dims[0..rank)), out = cond ? t : e, each
// operand read through its own strides (0 along the dims where it is broadcast). cond holds
// one byte per element, true when not 0 (the host's bool). rank 0 selects one element.
cudaError_t cuda_launch_select(bool f64, const uint8_t *cond, const int64_t *cond_strides,
                               const void *t, const int64_t *t_strides, const void *e,
                               const int64_t *e_strides, void *out, int rank,
                               const int64_t *dims, cudaStream_t stream);

// OneHot: out [n_indices, depth] (row-major) is *on_value at (i, indices[i]) and *off_value
// everywhere else, so an index outside [0, depth) gives a row of off_value. indices are int64
// when idx64, int32 otherwise; on_value and off_value are one element each.
cudaError_t cuda_launch_one_hot(bool f64, const void *indices, bool idx64, int64_t n_indices,
                                int64_t depth, const void *on_value, const void *off_value,
                                void *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
