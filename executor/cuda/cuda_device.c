/* The CUDA device: discovery, the GPU device table (alloc, free, async copies and events on
 * one stream per device, synchronize) and the error mapping shared by executor/cuda/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_impl.h"
#include "cuda_impl.h"

// ---- errors ----

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static dg_code cuda_code(cudaError_t err) {
    switch (err) {
    case cudaErrorMemoryAllocation:
        return DG_RESOURCE_EXHAUSTED;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidConfiguration:
        return DG_INVALID_ARGUMENT;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorInitializationError:
        return DG_UNAVAILABLE;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return DG_FAILED_PRECONDITION;
    default:
        return DG_INTERNAL;
    }
}

void cuda_set_status(dg_status *st, cudaError_t err, const char *call, const char *file,
                     int line) {
    char where[256] = "";
    if (status_impl_debug_errors()) snprintf(where, sizeof where, " [%s at %s:%d]", call, base_name(file), line);
    dg_status_setf(st, cuda_code(err), "CUDA: %s (%s)%s", cudaGetErrorString(err), cudaGetErrorName(err), where);
    // Clears a non-sticky error so that the next call does not report it again.
    (void)cudaGetLastError();
}

// ---- discovery ----

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int n_gpus;
static char no_gpu_reason[256];

static void probe(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err == cudaSuccess && n > 0) {
        n_gpus = n;
        return;
    }
    int driver = 0;
    (void)cudaDriverGetVersion(&driver);
    if (err == cudaSuccess)
        snprintf(no_gpu_reason, sizeof no_gpu_reason, "cudaGetDeviceCount found 0 devices");
    else
        snprintf(no_gpu_reason, sizeof no_gpu_reason, "cudaGetDeviceCount: %s (%s)%s",
                 cudaGetErrorString(err), cudaGetErrorName(err),
                 driver == 0 ? "; no NVIDIA driver is loaded" : "");
    (void)cudaGetLastError();
    n_gpus = 0;
}

int exec_cuda_device_count(void) {
    pthread_once(&probe_once, probe);
    return n_gpus;
}

const char *exec_cuda_unavailable_reason(void) {
    pthread_once(&probe_once, probe);
    return no_gpu_reason;
}

// OK when id names a visible GPU; otherwise st says why.
static bool check_id(int id, dg_status *st) {
    int n = exec_cuda_device_count();
    if (n == 0) {
        dg_status_setf(st, DG_UNAVAILABLE, "GPU:%d: no CUDA device: %s", id, no_gpu_reason);
        return false;
    }
    if (id < 0 || id >= n) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d does not exist: %d GPU%s visible", id,
                       n, n == 1 ? " is" : "s are");
        return false;
    }
    return true;
}

bool exec_cuda_device_info(int id, char *name, size_t cap, int64_t *memory_bytes,
                           dg_status *st) {
    if (!check_id(id, st)) return false;
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, id));
    if (name && cap > 0) snprintf(name, cap, "%s", prop.name);
    if (memory_bytes) *memory_bytes = (int64_t)prop.totalGlobalMem;
    return true;
fail:
    dg_status_prepend(st, "GPU:%d", id);
    return false;
}

// ---- devices ----

exec_cuda_device *exec_cuda_device_new(int id, dg_status *st) {
    if (!check_id(id, st)) return NULL;
    exec_cuda_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "GPU:%d: %zu bytes for the device", id,
                       sizeof *dev);
        return NULL;
    }
    dev->id = id;
    pthread_mutex_init(&dev->mu, NULL);
    CUDA_CHECK(cudaSetDevice(id));
    CUDA_CHECK(cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking));
    return dev;
fail:
    dg_status_prepend(st, "opening GPU:%d", id);
    exec_cuda_device_free(&dev);
    return NULL;
}

void exec_cuda_device_free(exec_cuda_device **pdev) {
    if (!pdev || !*pdev) return;
    exec_cuda_device *dev = *pdev;
    if (cudaSetDevice(dev->id) == cudaSuccess && dev->stream) {
        (void)cudaStreamSynchronize(dev->stream);
        cuda_blas_release(dev);
        (void)cudaStreamDestroy(dev->stream);
    }
    (void)cudaGetLastError();
    pthread_mutex_destroy(&dev->mu);
    free(dev);
    *pdev = NULL;
}

int exec_cuda_device_id(const exec_cuda_device *dev) { return dev->id; }

// ---- the device table ----

static void *gpu_alloc(void *ctx, size_t n_bytes, dg_status *st) {
    exec_cuda_device *dev = ctx;
    void *p = NULL;
    if (n_bytes == 0) return NULL;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaMalloc(&p, n_bytes));
    return p;
fail:
    dg_status_prepend(st, "GPU:%d: allocating %zu bytes", dev->id, n_bytes);
    return NULL;
}

static void gpu_free(void *ctx, void *ptr) {
    exec_cuda_device *dev = ctx;
    if (!ptr) return;
    // cudaFree waits for the device's work; an error here is one of earlier work, which
    // synchronize reports.
    if (cudaSetDevice(dev->id) == cudaSuccess) (void)cudaFree(ptr);
    (void)cudaGetLastError();
}

static bool gpu_copy(exec_cuda_device *dev, void *dst, const void *src, size_t n_bytes,
                     enum cudaMemcpyKind kind, dg_status *st) {
    const char *what = kind == cudaMemcpyHostToDevice ? "host to device" : "device to host";
    if (n_bytes == 0) return true;
    if (!dst || !src) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d: copying %zu bytes %s: NULL %s",
                       dev->id, n_bytes, what, dst ? "source" : "destination");
        return false;
    }
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, kind, dev->stream));
    return true;
fail:
    dg_status_prepend(st, "GPU:%d: copying %zu bytes %s", dev->id, n_bytes, what);
    return false;
}

static bool gpu_copy_to_device(void *ctx, void *dst, const void *src, size_t n_bytes,
                               dg_status *st) {
    return gpu_copy(ctx, dst, src, n_bytes, cudaMemcpyHostToDevice, st);
}

static bool gpu_copy_to_host(void *ctx, void *dst, const void *src, size_t n_bytes,
                             dg_status *st) {
    return gpu_copy(ctx, dst, src, n_bytes, cudaMemcpyDeviceToHost, st);
}

static bool gpu_synchronize(void *ctx, dg_status *st) {
    exec_cuda_device *dev = ctx;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaStreamSynchronize(dev->stream));
    return true;
fail:
    dg_status_prepend(st, "GPU:%d: synchronize", dev->id);
    return false;
}

static void *gpu_event_record(void *ctx, dg_status *st) {
    exec_cuda_device *dev = ctx;
    cudaEvent_t ev = NULL;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev, dev->stream));
    return ev;
fail:
    if (ev) (void)cudaEventDestroy(ev);
    dg_status_prepend(st, "GPU:%d: recording an event", dev->id);
    return NULL;
}

static bool gpu_event_wait(void *ctx, void *event, dg_status *st) {
    exec_cuda_device *dev = ctx;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaStreamWaitEvent(dev->stream, (cudaEvent_t)event, 0));
    return true;
fail:
    dg_status_prepend(st, "GPU:%d: waiting for an event", dev->id);
    return false;
}

static void gpu_event_free(void *ctx, void *event) {
    (void)ctx;
    // Safe while the event is pending: its resources go once it completes.
    if (event) (void)cudaEventDestroy((cudaEvent_t)event);
    (void)cudaGetLastError();
}

static const exec_device_ops gpu_ops = {
    .version = EXEC_DEVICE_OPS_VERSION,
    .type = "GPU",
    .alloc = gpu_alloc,
    .free = gpu_free,
    .copy_to_device = gpu_copy_to_device,
    .copy_to_host = gpu_copy_to_host,
    .synchronize = gpu_synchronize,
    .event_record = gpu_event_record,
    .event_wait = gpu_event_wait,
    .event_free = gpu_event_free,
};

const exec_device_ops *exec_cuda_device_ops(void) { return &gpu_ops; }

// ---- helpers ----

bool exec_cuda_fill_f32(exec_cuda_device *dev, float *dst, int64_t n, float value,
                        dg_status *st) {
    if (n < 0 || (n > 0 && !dst)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d: fill of %lld floats at %p", dev->id,
                       (long long)n, (void *)dst);
        return false;
    }
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cuda_launch_fill_f32(dst, n, value, dev->stream));
    return true;
fail:
    dg_status_prepend(st, "GPU:%d: fill of %lld floats", dev->id, (long long)n);
    return false;
}
