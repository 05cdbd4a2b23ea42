/* The CUDA device: GPU discovery, a device table (exec_device_ops, executor/device.h) backed
 * by the CUDA runtime, and thin cuBLAS/NCCL wrappers; the executor sees the GPU only as the
 * device type exec_cuda_device_type (executor/cuda/kernels/cuda_device_type.c). Built
 * whenever the CUDA toolkit is found, so it must behave on machines without a GPU or driver:
 * discovery then reports zero GPUs and never prints or aborts. No CUDA header is needed to
 * include this file.
 * Thread safety: an exec_cuda_device may be used from several threads; its work is ordered
 * on one CUDA stream per device. */
#ifndef DG_EXEC_CUDA_DEVICE_H
#define DG_EXEC_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Registers the GPU kernels with the kernel registry: the GPU device type's register_kernels,
// called once by the registry (defined in executor/cuda/kernels/gpu_register.c).
void exec_cuda_register(void);

// ---- discovery ----

// Number of visible GPUs; 0 when there is no driver, no device, or the runtime fails to
// start. Never prints, never aborts. The probe runs once per process and is cached.
int exec_cuda_device_count(void);
// Why exec_cuda_device_count() is 0, e.g. "cudaGetDeviceCount: no CUDA-capable device is
// detected (cudaErrorNoDevice)"; "" when GPUs are present.
// Returns: borrowed, a static string valid for the life of the process.
const char *exec_cuda_unavailable_reason(void);
// Name (truncated to cap - 1 bytes, always terminated) and total memory of GPU id. Either
// output may be NULL. An id out of range is INVALID_ARGUMENT; no GPU is UNAVAILABLE.
bool exec_cuda_device_info(int id, char *name, size_t cap, int64_t *memory_bytes,
                           dg_status *st);

// ---- device table ----

// The GPU table. Its ctx is an exec_cuda_device. Returns: borrowed, static.
const exec_device_ops *exec_cuda_device_ops(void);

typedef struct exec_cuda_device exec_cuda_device;

// Opens GPU id: its stream is created now, its cuBLAS handle on first use.
// Returns: new, caller frees with exec_cuda_device_free(); NULL with st set.
exec_cuda_device *exec_cuda_device_new(int id, dg_status *st);
// Waits for the device's queued work and releases it; NULL or a pointer to NULL does nothing.
void exec_cuda_device_free(exec_cuda_device **dev);
int exec_cuda_device_id(const exec_cuda_device *dev);

// ---- helpers on device memory, queued on the device's stream ----

// dst[0..n) = value. dst is device memory from the table's alloc.
bool exec_cuda_fill_f32(exec_cuda_device *dev, float *dst, int64_t n, float value,
                        dg_status *st);
// Row-major C = alpha * op(A) * op(B) + beta * C with op(A) m x k, op(B) k x n, like
// cblas_sgemm(CblasRowMajor, ...). a, b, c are device memory; dimensions must fit an int.
bool exec_cuda_sgemm(exec_cuda_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc, dg_status *st);
// The same in float64 (cublasDgemm).
bool exec_cuda_dgemm(exec_cuda_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, double alpha, const double *a, int64_t lda, const double *b,
                     int64_t ldb, double beta, double *c, int64_t ldc, dg_status *st);
// The same with A, B and C in bfloat16 (bf16) or float16, the products summed in float32 on
// tensor cores (cublasGemmEx, CUBLAS_COMPUTE_32F) and C rounded once to its 16 bits.
bool exec_cuda_gemm16(exec_cuda_device *dev, bool bf16, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      float beta, void *c, int64_t ldc, dg_status *st);

// Opens cuBLAS, once per process (the first GEMM on a GPU does it; no GPU is needed): its
// SONAME, then the file the build found. FAILED_PRECONDITION naming the library and the
// loader's error when it cannot be loaded or lacks an entry point.
bool exec_cuda_blas_load(dg_status *st);
// The name (SONAME, e.g. "libcublas.so.13") or path cuBLAS was opened by; "" before
// exec_cuda_blas_load or when it failed. Returns: borrowed, static.
const char *exec_cuda_blas_library(void);
// Lets later sgemm calls use TF32 tensor cores (CUBLAS_TF32_TENSOR_OP_MATH); off by default
// (CUBLAS_DEFAULT_MATH, which never uses TF32). Process-wide. (cuda_blas.c)
void exec_cuda_set_allow_tf32(bool allow);

// NCCL's version (e.g. 22804 for 2.28.4). UNIMPLEMENTED when built without NCCL.
bool exec_cuda_nccl_version(int *version, dg_status *st);
// Sums n floats in place across the devices in devs[0..n_devs) with NCCL (one process,
// one communicator per device), then synchronizes them. bufs[i] is device memory on
// devs[i]. UNIMPLEMENTED when built without NCCL.
bool exec_cuda_all_reduce_sum_f32(exec_cuda_device *const *devs, float *const *bufs,
                                  int n_devs, int64_t n, dg_status *st);

// Queues an all-reduce of count elements (float32, or float64 with f64) in place across
// devs[0..n_devs) on their streams (no wait), summing or averaging (mean). Communicators are
// created on the first call for a device list and kept. UNIMPLEMENTED without NCCL.
bool exec_cuda_nccl_all_reduce(exec_cuda_device *const *devs, void *const *bufs, int n_devs,
                               int64_t count, bool f64, bool mean, dg_status *st);

// Gives back what the process holds on its GPUs, for the end of a program or of a test (a
// leak checker then sees only what was never freed): the NCCL communicators, the executor's
// devices (streams, cuBLAS handles) and every cached block of device and pinned host memory.
// Call it only when no session or tensor uses a GPU any more. Returns the bytes still handed
// out (device and pinned memory freed by nobody: a leak); 0 when there is no GPU.
int64_t exec_cuda_release_all(void);

#ifdef __cplusplus
}
#endif
#endif
