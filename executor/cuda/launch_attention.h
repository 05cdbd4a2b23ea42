/* Launchers of attention.cu: ScaledDotProductAttention and its gradient. Every pointer is device
 * memory on the GPU of `stream`: q [batches, Tq, D], k [batches, Tk, D], v [batches, Tk, Dv],
 * out and dout [batches, Tq, Dv], lse [batches, Tq]. `f64` picks double, else float. Each
 * launcher only queues work on the stream and returns the launch's error (cudaSuccess when
 * there is nothing to do; cudaErrorInvalidValue when cuda_attention_fits is false). Usable
 * from C and C++. */
#ifndef DG_EXEC_CUDA_LAUNCH_ATTENTION_H
#define DG_EXEC_CUDA_LAUNCH_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// Whether the kernels' accumulators for widths D and Dv fit in a block's shared memory (float:
// D + Dv up to about 370; double: about half that).
bool cuda_attention_fits(bool f64, int64_t D, int64_t Dv);
// out = softmax(scale q k^T, causal as the op says) v; lse the log-sum-exp of each row's scores.
cudaError_t cuda_launch_attention(bool f64, const void *q, const void *k, const void *v, void *out, void *lse,
                                  int64_t batches, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, double scale,
                                  bool causal, cudaStream_t stream);
// dq, dk and dv of the same, from dout, out and lse.
cudaError_t cuda_launch_attention_grad(bool f64, const void *dout, const void *q, const void *k, const void *v,
                                       const void *out, const void *lse, void *dq, void *dk, void *dv,
                                       int64_t batches, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, double scale,
                                       bool causal, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
