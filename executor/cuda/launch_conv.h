/* Launchers of conv.cu: the window matrix of a convolution (im2col) and its way back
 * (col2im), max and average pooling with their gradients, and an elementwise product for
 * Dropout. Pointers are device memory on the GPU of `stream`; the geometry is host values
 * (TensorFlow's NHWC windows, graph/nn_impl.h). `f64` picks double, else float. Each launcher
 * only queues work and returns the launch's error (cudaSuccess when there is nothing to do).
 * The gradients gather (each input element sums what its windows give it) rather than scatter
 * with atomics, so their results do not depend on thread timing. Usable from C and C++. */
#ifndef DG_EXEC_CUDA_LAUNCH_CONV_H
#define DG_EXEC_CUDA_LAUNCH_CONV_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// A window op's geometry: input [n, h, w, c], window kh x kw, strides sh x sw, output
// [n, oh, ow, *], padding before pad_top and pad_left.
typedef struct cuda_window {
    int64_t n, h, w, c, kh, kw, sh, sw, oh, ow, pad_top, pad_left;
} cuda_window;

// col [n * oh * ow, kh * kw * c] = the windows of x (zeros in the padding).
cudaError_t cuda_launch_im2col(bool f64, const cuda_window *g, const void *x, void *col,
                               cudaStream_t stream);
// dx [n, h, w, c] = the sum, over the windows holding each element, of col's entries for it.
cudaError_t cuda_launch_col2im(bool f64, const cuda_window *g, const void *col, void *dx,
                               cudaStream_t stream);
// y [n, oh, ow, c] = the maximum (max) or the mean over the elements inside the input (avg)
// of each window.
cudaError_t cuda_launch_pool(bool f64, bool max, const cuda_window *g, const void *x, void *y,
                             cudaStream_t stream);
// dx for MaxPool: each window's dy goes to the first element (row-major in the window) equal
// to the window's maximum y.
cudaError_t cuda_launch_max_pool_grad(bool f64, const cuda_window *g, const void *x,
                                      const void *y, const void *dy, void *dx,
                                      cudaStream_t stream);
// dx for AvgPool: each window's dy divided by its element count, to each of its elements.
cudaError_t cuda_launch_avg_pool_grad(bool f64, const cuda_window *g, const void *dy, void *dx,
                                      cudaStream_t stream);
// y = a * b elementwise, n elements.
cudaError_t cuda_launch_mul_n(bool f64, const void *a, const void *b, void *y, int64_t n,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
