/* cuBLAS on a CUDA device: one handle per device, created on first use and bound to the
 * device's stream. */
#include <limits.h>
#include <string.h>

#include <cublas_v2.h>

#include "cuda_impl.h"

static dg_code blas_code(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        return DG_RESOURCE_EXHAUSTED;
    case CUBLAS_STATUS_INVALID_VALUE:
        return DG_INVALID_ARGUMENT;
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return DG_UNAVAILABLE;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return DG_FAILED_PRECONDITION;
    default:
        return DG_INTERNAL;
    }
}

void cuda_set_blas_status(dg_status *st, int status, const char *call, const char *file,
                          int line) {
    const char *slash = strrchr(file, '/');
    cublasStatus_t s = (cublasStatus_t)status;
    dg_status_setf(st, blas_code(s), "%s at %s:%d: %s (%s)", call, slash ? slash + 1 : file,
                   line, cublasGetStatusString(s), cublasGetStatusName(s));
}

// The device's handle, created on first use. Called with dev->mu held.
static cublasHandle_t blas_handle(exec_cuda_device *dev, dg_status *st) {
    cublasHandle_t h = NULL;
    if (dev->blas) return dev->blas;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, dev->stream));
    dev->blas = h;
    return h;
fail:
    if (h) (void)cublasDestroy(h);
    dg_status_prepend(st, "creating the cuBLAS handle");
    return NULL;
}

void cuda_blas_release(exec_cuda_device *dev) {
    if (dev->blas) (void)cublasDestroy(dev->blas);
    dev->blas = NULL;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

bool exec_cuda_sgemm(exec_cuda_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc, dg_status *st) {
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "GPU:%d: sgemm m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld: each "
                       "must be in [0, %d]",
                       dev->id, (long long)m, (long long)n, (long long)k, (long long)lda,
                       (long long)ldb, (long long)ldc, INT_MAX);
        return false;
    }
    if (m == 0 || n == 0) return true;
    pthread_mutex_lock(&dev->mu);
    cublasHandle_t h = blas_handle(dev, st);
    if (!h) goto fail;
    CUDA_CHECK(cudaSetDevice(dev->id));
    // Row-major C (m x n) is column-major C^T, and C^T = op(B)^T op(A)^T: swap the operands.
    CUBLAS_CHECK(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                             &alpha, b, (int)ldb, a, (int)lda, &beta, c, (int)ldc));
    pthread_mutex_unlock(&dev->mu);
    return true;
fail:
    pthread_mutex_unlock(&dev->mu);
    dg_status_prepend(st, "GPU:%d: sgemm %lldx%lldx%lld", dev->id, (long long)m, (long long)n,
                      (long long)k);
    return false;
}
