/* cuBLAS on a CUDA device: one handle per device, created on first use and bound to the
 * device's stream.
 *
 * cuBLAS is opened with dlopen on the first GEMM of a GPU, not linked: libcublas and
 * libcublasLt are several hundred megabytes, and a process that never runs a GEMM on a GPU
 * (every CPU-only machine, every process under valgrind) would otherwise map and relocate
 * them at start-up. The library's SONAME is tried first (LD_LIBRARY_PATH, the system's
 * paths), then the file the build found (DG_CUBLAS_PATH). */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>

#include "status_impl.h"
#include "cuda_impl.h"

#ifndef DG_CUBLAS_SONAME
#define DG_CUBLAS_SONAME "libcublas.so"
#endif

// The entry points used, typed from cublas_v2.h (whose macros map cublasCreate to
// cublasCreate_v2 and so on: BLAS_SYM names the symbol the header means).
static struct {
    __typeof__(cublasCreate) *create;
    __typeof__(cublasDestroy) *destroy;
    __typeof__(cublasSetStream) *set_stream;
    __typeof__(cublasSetMathMode) *set_math_mode;
    __typeof__(cublasSgemm) *sgemm;
    __typeof__(cublasDgemm) *dgemm;
    __typeof__(cublasGemmEx) *gemm_ex;
    __typeof__(cublasGetStatusString) *status_string;
    __typeof__(cublasGetStatusName) *status_name;
} cublas;

#define BLAS_STR2(x) #x
#define BLAS_STR(x) BLAS_STR2(x)
#define BLAS_SYM(field, fn) {(void *)&cublas.field, BLAS_STR(fn)}

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static char blas_error[512];   // empty when cuBLAS loaded
static const char *blas_name = "";   // the name or path that loaded

static void blas_load_once(void) {
    static const struct {
        void *slot;
        const char *name;
    } syms[] = {
        BLAS_SYM(create, cublasCreate),          BLAS_SYM(destroy, cublasDestroy),
        BLAS_SYM(set_stream, cublasSetStream),   BLAS_SYM(set_math_mode, cublasSetMathMode),
        BLAS_SYM(sgemm, cublasSgemm),            BLAS_SYM(dgemm, cublasDgemm),
        BLAS_SYM(gemm_ex, cublasGemmEx),
        BLAS_SYM(status_string, cublasGetStatusString),
        BLAS_SYM(status_name, cublasGetStatusName),
    };
    void *lib = dlopen(DG_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    char first[200] = "", second[200] = "";
    blas_name = DG_CUBLAS_SONAME;
    if (!lib) {
        snprintf(first, sizeof first, "%s", dlerror());
#ifdef DG_CUBLAS_PATH
        lib = dlopen(DG_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
        blas_name = DG_CUBLAS_PATH;
        if (!lib) snprintf(second, sizeof second, "; %s", dlerror());
#endif
    }
    if (!lib) {
        blas_name = "";
        snprintf(blas_error, sizeof blas_error,
                 "cuBLAS could not be loaded (%s%s); install the CUDA toolkit's cuBLAS or put "
                 "its directory on LD_LIBRARY_PATH",
                 first, second);
        return;
    }
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(lib, syms[i].name);
        if (!f) {
            snprintf(blas_error, sizeof blas_error,
                     "cuBLAS (" DG_CUBLAS_SONAME ") has no %s: it is older than the cuBLAS "
                     "distgraph was built with",
                     syms[i].name);
            memset(&cublas, 0, sizeof cublas);
            return;   // the library stays open: unloading cuBLAS is not worth the risk
        }
        memcpy(syms[i].slot, &f, sizeof f);
    }
}

bool exec_cuda_blas_load(dg_status *st) {
    pthread_once(&blas_once, blas_load_once);
    if (blas_error[0]) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "%s", blas_error);
        return false;
    }
    return true;
}

const char *exec_cuda_blas_library(void) { return blas_error[0] ? "" : blas_name; }

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
    char where[256] = "";
    if (status_impl_debug_errors()) snprintf(where, sizeof where, " [%s at %s:%d]", call, slash ? slash + 1 : file, line);
    dg_status_setf(st, blas_code(s), "cuBLAS: %s (%s)%s", cublas.status_string(s),
                   cublas.status_name(s), where);
}

// The device's handle, created on first use. Called with dev->mu held.
static cublasHandle_t blas_handle(exec_cuda_device *dev, dg_status *st) {
    cublasHandle_t h = NULL;
    if (dev->blas) return dev->blas;
    if (!exec_cuda_blas_load(st)) goto fail;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUBLAS_CHECK(cublas.create(&h));
    CUBLAS_CHECK(cublas.set_stream(h, dev->stream));
    dev->blas = h;
    return h;
fail:
    if (h) (void)cublas.destroy(h);
    dg_status_prepend(st, "creating the cuBLAS handle");
    return NULL;
}

void cuda_blas_release(exec_cuda_device *dev) {
    if (dev->blas) (void)cublas.destroy(dev->blas);
    dev->blas = NULL;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

// Whether sgemm may use TF32 tensor cores; read at every call.
static atomic_bool allow_tf32;

void exec_cuda_set_allow_tf32(bool allow) { atomic_store(&allow_tf32, allow); }

// The element types of gemm().
typedef enum gemm_kind { GEMM_F32, GEMM_F64, GEMM_BF16, GEMM_F16 } gemm_kind;

// Row-major C = alpha * op(A) * op(B) + beta * C in float32, float64, or a 16-bit float with
// float32 sums (cublasGemmEx, CUBLAS_COMPUTE_32F: tensor cores); alpha and beta point to a
// double for float64, to a float otherwise.
static bool gemm(exec_cuda_device *dev, gemm_kind kind, bool trans_a, bool trans_b, int64_t m,
                 int64_t n, int64_t k, const void *alpha, const void *a, int64_t lda,
                 const void *b, int64_t ldb, const void *beta, void *c, int64_t ldc,
                 dg_status *st) {
    static const char *const names[] = {"sgemm", "dgemm", "gemm_ex bfloat16", "gemm_ex float16"};
    const char *name = names[kind];
    bool is_f64 = kind == GEMM_F64;
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "GPU:%d: %s m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld: each "
                       "must be in [0, %d]",
                       dev->id, name, (long long)m, (long long)n, (long long)k, (long long)lda,
                       (long long)ldb, (long long)ldc, INT_MAX);
        return false;
    }
    if (m == 0 || n == 0) return true;
    pthread_mutex_lock(&dev->mu);
    cublasHandle_t h = blas_handle(dev, st);
    if (!h) goto fail;
    CUDA_CHECK(cudaSetDevice(dev->id));
    // The math mode is set on every call: the handle is shared by all kernels of the device,
    // and CUBLAS_DEFAULT_MATH never uses TF32.
    // The 16-bit products keep float32 sums throughout: no split-K reduction in 16 bits.
    cublasMath_t math = kind == GEMM_F32 && atomic_load(&allow_tf32) ? CUBLAS_TF32_TENSOR_OP_MATH
                        : kind == GEMM_BF16 || kind == GEMM_F16
                            ? (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
                            : CUBLAS_DEFAULT_MATH;
    CUBLAS_CHECK(cublas.set_math_mode(h, math));
    // Row-major C (m x n) is column-major C^T, and C^T = op(B)^T op(A)^T: swap the operands.
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (kind == GEMM_BF16 || kind == GEMM_F16) {
        cudaDataType_t t = kind == GEMM_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        CUBLAS_CHECK(cublas.gemm_ex(h, op_b, op_a, (int)n, (int)m, (int)k, alpha, b, t, (int)ldb, a, t, (int)lda,
                                    beta, c, t, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else if (is_f64)
        CUBLAS_CHECK(cublas.dgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                 alpha, b, (int)ldb, a, (int)lda, beta, c, (int)ldc));
    else
        CUBLAS_CHECK(cublas.sgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                 alpha, b, (int)ldb, a, (int)lda, beta, c, (int)ldc));
    pthread_mutex_unlock(&dev->mu);
    return true;
fail:
    pthread_mutex_unlock(&dev->mu);
    dg_status_prepend(st, "GPU:%d: %s %lldx%lldx%lld", dev->id, name, (long long)m, (long long)n,
                      (long long)k);
    return false;
}

bool exec_cuda_sgemm(exec_cuda_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc, dg_status *st) {
    return gemm(dev, GEMM_F32, trans_a, trans_b, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc, st);
}

bool exec_cuda_dgemm(exec_cuda_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, double alpha, const double *a, int64_t lda, const double *b,
                     int64_t ldb, double beta, double *c, int64_t ldc, dg_status *st) {
    return gemm(dev, GEMM_F64, trans_a, trans_b, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc, st);
}

bool exec_cuda_gemm16(exec_cuda_device *dev, bool bf16, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      float beta, void *c, int64_t ldc, dg_status *st) {
    return gemm(dev, bf16 ? GEMM_BF16 : GEMM_F16, trans_a, trans_b, m, n, k, &alpha, a, lda, b, ldb, &beta, c,
                ldc, st);
}
