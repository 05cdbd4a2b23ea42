/* Internals shared by the files of executor/cuda/: the device object, the error-checking
 * macros for the CUDA runtime and cuBLAS, and the kernel launchers of the .cu files.
 * Included from C and from CUDA C++ (.cu). */
#ifndef DG_EXEC_CUDA_IMPL_H
#define DG_EXEC_CUDA_IMPL_H

#include <pthread.h>

#include <cuda_runtime_api.h>

#include "cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

// Opaque to the rest of the executor. The stream is created when the device is opened;
// the cuBLAS handle (bound to the stream) on first use under mu.
struct exec_cuda_device {
    int id;
    cudaStream_t stream;
    pthread_mutex_t mu;   // guards blas and its use (a cuBLAS handle is not thread-safe)
    void *blas;           // cublasHandle_t or NULL
};

// Sets st from a failed CUDA runtime call: "<call> at <file>:<line>: <error string>
// (<error name>)". The code follows the error: out of memory is RESOURCE_EXHAUSTED, a bad
// value INVALID_ARGUMENT, no driver or device UNAVAILABLE, anything else INTERNAL.
void cuda_set_status(dg_status *st, cudaError_t err, const char *call, const char *file,
                     int line);
// The same for a cuBLAS status (an int so that this header needs no cuBLAS include).
void cuda_set_blas_status(dg_status *st, int status, const char *call, const char *file,
                          int line);

// The checking macros: on failure record the call, file:line and the library's error text
// in `st` (which must be in scope) and jump to the function's `fail` label.
#define CUDA_CHECK(call)                                                     \
    do {                                                                     \
        cudaError_t cuda_err_ = (call);                                      \
        if (cuda_err_ != cudaSuccess) {                                      \
            cuda_set_status(st, cuda_err_, #call, __FILE__, __LINE__);       \
            goto fail;                                                       \
        }                                                                    \
    } while (0)
#define CUBLAS_CHECK(call)                                                   \
    do {                                                                     \
        cublasStatus_t blas_err_ = (call);                                   \
        if (blas_err_ != CUBLAS_STATUS_SUCCESS) {                            \
            cuda_set_blas_status(st, (int)blas_err_, #call, __FILE__, __LINE__); \
            goto fail;                                                       \
        }                                                                    \
    } while (0)

// Destroys the device's cuBLAS handle, if any (cuda_blas.c).
void cuda_blas_release(exec_cuda_device *dev);
// Destroys every cached NCCL communicator (nccl.c; nothing without NCCL).
void exec_cuda_nccl_release(void);
// Gives every cached block of every GPU and of pinned host memory back to the driver and
// returns the bytes still handed out (kernels/cuda_alloc.c).
int64_t cuda_mem_release_all(void);

// ---- launchers (fill.cu); they only queue work and return the launch error ----
cudaError_t cuda_launch_fill_f32(float *dst, int64_t n, float value, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
