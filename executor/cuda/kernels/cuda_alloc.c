/* GPU memory (cuda_alloc.h): one block cache per GPU over cudaMalloc/cudaFree, one
 * process-wide block cache of pinned host buffers over cudaHostAlloc/cudaFreeHost, and copies
 * between host and device staged through pinned buffers.
 *
 * Why staging: a copy from pageable memory makes the driver stage it itself, and it may wait
 * for the stream first; a copy from pinned memory is a plain DMA that runs in stream order.
 * Staging buffers of copies to the device go back to the pinned cache from a host function
 * queued after their copy (cudaLaunchHostFunc): it may make no CUDA call, and returning a
 * block to a cache calls none (block_cache.h), nor does it wait on anything that waits for
 * the stream, because the caches never call their backend under their lock.
 *
 * The device caches are per GPU, not per stream: a block freed while work queued on the
 * GPU's stream still uses it is safe to hand out again only to work queued on that same
 * stream. The executor opens one exec_cuda_device (one stream) per GPU (gpu_device()); a
 * second device object on the same GPU must synchronize before its blocks are reused by the
 * other (exec_cuda_device_free does). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "block_cache.h"
#include "cuda_alloc.h"
#include "cuda_impl.h"

#define ALLOC_MAX_GPUS 64
#define STAGE_CHUNK_BYTES ((size_t)4 << 20)
#define SMALL_COPY_BYTES ((size_t)64 << 10)
// Staging buffers one copy to the device may have in flight (bounds its pinned memory).
#define STAGE_SLOTS 4

// The error of this thread's last failed backend call, for the status of a failed alloc
// (the cache only sees NULL).
static _Thread_local cudaError_t backend_err;

// ---- device memory ----

static void *device_backend_alloc(void *ctx, size_t n_bytes) {
    int id = *(const int *)ctx;
    void *p = NULL;
    cudaError_t err = cudaSetDevice(id);
    if (err == cudaSuccess) err = cudaMalloc(&p, n_bytes);
    if (err != cudaSuccess) {
        backend_err = err;
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void device_backend_free(void *ctx, void *p) {
    int id = *(const int *)ctx;
    // cudaFree waits for the GPU's queued work; an error here belongs to that work, which
    // the next synchronize reports.
    if (cudaSetDevice(id) == cudaSuccess) (void)cudaFree(p);
    (void)cudaGetLastError();
}

static pthread_mutex_t caches_mu = PTHREAD_MUTEX_INITIALIZER;
static exec_block_cache *_Atomic device_caches[ALLOC_MAX_GPUS];
static int device_ids[ALLOC_MAX_GPUS];   // backend ctx of cache i points at device_ids[i]

// GPU id's cache; created on first use when create is set (else NULL when there is none).
static exec_block_cache *device_cache(int id, bool create, dg_status *st) {
    if (id < 0 || id >= ALLOC_MAX_GPUS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d: the allocator handles ids 0 to %d",
                       id, ALLOC_MAX_GPUS - 1);
        return NULL;
    }
    exec_block_cache *c = atomic_load_explicit(&device_caches[id], memory_order_acquire);
    if (c || !create) return c;
    pthread_mutex_lock(&caches_mu);
    c = atomic_load_explicit(&device_caches[id], memory_order_relaxed);
    if (!c) {
        device_ids[id] = id;
        c = exec_block_cache_new(device_backend_alloc, device_backend_free, &device_ids[id]);
        if (c) atomic_store_explicit(&device_caches[id], c, memory_order_release);
    }
    pthread_mutex_unlock(&caches_mu);
    if (!c)
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "GPU:%d: no host memory for the memory cache",
                       id);
    return c;
}

static pthread_once_t poison_once = PTHREAD_ONCE_INIT;
static bool is_poison_on;

static void read_poison(void) {
    const char *e = getenv("DG_GPU_POISON");
    is_poison_on = e && strcmp(e, "1") == 0;
}

// Sets st for a cache alloc of n_bytes that returned NULL.
static void set_alloc_status(dg_status *st, size_t n_bytes, const char *call) {
    if (backend_err != cudaSuccess)
        cuda_set_status(st, backend_err, call, __FILE__, __LINE__);
    else if (exec_block_cache_class(n_bytes) == SIZE_MAX)
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "larger than any allocation");
    else
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "no host memory for the cache's bookkeeping");
}

void *exec_cuda_mem_alloc(exec_cuda_device *dev, size_t n_bytes, dg_status *st) {
    void *p = NULL;
    if (n_bytes == 0) return NULL;
    exec_block_cache *c = device_cache(dev->id, true, st);
    if (!c) return NULL;
    backend_err = cudaSuccess;
    p = exec_block_cache_alloc(c, n_bytes);
    if (!p) {
        set_alloc_status(st, n_bytes, "cudaMalloc");
        dg_status_prepend(st, "GPU:%d: allocating %zu bytes", dev->id, n_bytes);
        return NULL;
    }
    if (!exec_cuda_poison(dev, p, n_bytes, st)) {
        exec_block_cache_free_block(c, p);
        dg_status_prepend(st, "GPU:%d: allocating %zu bytes", dev->id, n_bytes);
        return NULL;
    }
    return p;
}

bool exec_cuda_poison(exec_cuda_device *dev, void *p, size_t n_bytes, dg_status *st) {
    pthread_once(&poison_once, read_poison);
    if (!is_poison_on || n_bytes == 0) return true;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, n_bytes, dev->stream));
    return true;
fail:
    dg_status_prepend(st, "GPU:%d: poisoning %zu bytes", dev->id, n_bytes);
    return false;
}

void exec_cuda_mem_free(exec_cuda_device *dev, void *p) {
    if (!dev || !p) return;
    exec_block_cache *c = device_cache(dev->id, false, NULL);
    // A pointer the cache did not hand out is ignored rather than corrupting it.
    if (c) (void)exec_block_cache_free_block(c, p);
}

void exec_cuda_mem_trim(exec_cuda_device *dev) {
    exec_block_cache *c = dev ? device_cache(dev->id, false, NULL) : NULL;
    if (c) (void)exec_block_cache_trim(c);
}

void exec_cuda_mem_stats_get(exec_cuda_device *dev, exec_cuda_mem_stats *out) {
    memset(out, 0, sizeof *out);
    exec_block_cache *c = dev ? device_cache(dev->id, false, NULL) : NULL;
    if (!c) return;
    exec_block_cache_stats s;
    exec_block_cache_stats_get(c, &s);
    out->device_mallocs = s.backend_allocs;
    out->allocs = s.allocs;
    out->bytes_in_use = s.bytes_in_use;
    out->bytes_cached = s.bytes_cached;
}

// ---- pinned host memory ----

static exec_block_cache *_Atomic host_cache_ptr;

// Trims c and returns the bytes it still has handed out.
static int64_t trim_in_use(exec_block_cache *c) {
    if (!c) return 0;
    (void)exec_block_cache_trim(c);
    exec_block_cache_stats s;
    exec_block_cache_stats_get(c, &s);
    return s.bytes_in_use;
}

int64_t cuda_mem_release_all(void) {
    int64_t in_use = 0;
    for (int id = 0; id < ALLOC_MAX_GPUS; id++)
        in_use += trim_in_use(atomic_load_explicit(&device_caches[id], memory_order_acquire));
    in_use += trim_in_use(atomic_load_explicit(&host_cache_ptr, memory_order_acquire));
    return in_use;
}

static void *host_backend_alloc(void *ctx, size_t n_bytes) {
    (void)ctx;
    void *p = NULL;
    // Portable: pinned for every GPU of the process, not just the current one.
    cudaError_t err = cudaHostAlloc(&p, n_bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
        backend_err = err;
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void host_backend_free(void *ctx, void *p) {
    (void)ctx;
    (void)cudaFreeHost(p);
    (void)cudaGetLastError();
}

static exec_block_cache *host_cache(bool create) {
    exec_block_cache *c = atomic_load_explicit(&host_cache_ptr, memory_order_acquire);
    if (c || !create) return c;
    pthread_mutex_lock(&caches_mu);
    c = atomic_load_explicit(&host_cache_ptr, memory_order_relaxed);
    if (!c) {
        c = exec_block_cache_new(host_backend_alloc, host_backend_free, NULL);
        if (c) atomic_store_explicit(&host_cache_ptr, c, memory_order_release);
    }
    pthread_mutex_unlock(&caches_mu);
    return c;
}

// A pinned block, or NULL with st set (st may be NULL).
static void *host_block(size_t n_bytes, dg_status *st) {
    exec_block_cache *c = host_cache(true);
    if (!c) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED,
                       "pinned host memory: no host memory for the cache");
        return NULL;
    }
    backend_err = cudaSuccess;
    void *p = exec_block_cache_alloc(c, n_bytes);
    if (!p) {
        set_alloc_status(st, n_bytes, "cudaHostAlloc");
        dg_status_prepend(st, "pinned host memory: allocating %zu bytes", n_bytes);
    }
    return p;
}

void *exec_cuda_host_alloc(size_t n_bytes, dg_status *st) {
    return n_bytes == 0 ? NULL : host_block(n_bytes, st);
}

void exec_cuda_host_free(void *p) {
    exec_block_cache *c = host_cache(false);
    if (c && p) (void)exec_block_cache_free_block(c, p);
}

bool exec_cuda_host_is_pinned(const void *p) {
    exec_block_cache *c = host_cache(false);
    return c && exec_block_cache_find(c, p, NULL, NULL);
}

// True when all of [p, p + n_bytes) lies in one pinned block.
static bool is_range_pinned(const void *p, size_t n_bytes) {
    exec_block_cache *c = host_cache(false);
    void *base = NULL;
    size_t size = 0;
    if (!c || !exec_block_cache_find(c, p, &base, &size)) return false;
    return n_bytes <= size - (size_t)((const char *)p - (const char *)base);
}

// ---- copies ----

static bool check_copy(const exec_cuda_device *dev, const void *dst, const void *src,
                       size_t n_bytes, const char *what, dg_status *st) {
    if (dst && src) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d: copying %zu bytes %s: NULL %s", dev->id,
                   n_bytes, what, dst ? "source" : "destination");
    return false;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

bool exec_cuda_memcpy_to_host(exec_cuda_device *dev, void *dst_host, const void *src_dev,
                              size_t n_bytes, dg_status *st) {
    static const char what[] = "device to host";
    char *buf[2] = {NULL, NULL};
    cudaEvent_t ev[2] = {NULL, NULL};
    if (n_bytes > 0 && !check_copy(dev, dst_host, src_dev, n_bytes, what, st)) return false;
    CUDA_CHECK(cudaSetDevice(dev->id));
    if (n_bytes == 0) {
        CUDA_CHECK(cudaStreamSynchronize(dev->stream));
        return true;
    }
    // Direct: into pinned memory (a DMA), or a small copy (the driver stages it).
    bool is_direct = n_bytes < SMALL_COPY_BYTES || is_range_pinned(dst_host, n_bytes);
    const size_t chunk = min_size(n_bytes, STAGE_CHUNK_BYTES);
    const size_t n_chunks = (n_bytes + chunk - 1) / chunk;
    if (!is_direct) {
        for (size_t i = 0; i < 2 && i < n_chunks; i++) {
            if (!(buf[i] = host_block(chunk, NULL))) break;
            CUDA_CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
        }
        // Short of pinned memory: the driver's own staging still gives the right bytes.
        is_direct = !buf[0] || (n_chunks > 1 && !buf[1]);
    }
    if (is_direct) {
        CUDA_CHECK(cudaMemcpyAsync(dst_host, src_dev, n_bytes, cudaMemcpyDeviceToHost,
                                   dev->stream));
        CUDA_CHECK(cudaStreamSynchronize(dev->stream));
    } else {
        // Two buffers: chunk k + 1 is copied off the GPU while chunk k is copied out of its
        // buffer. Buffer (k + 1) % 2 last held chunk k - 1, already copied out.
        for (size_t k = 0; k < n_chunks; k++) {
            for (size_t j = k == 0 ? 0 : k + 1; j <= k + 1 && j < n_chunks; j++) {
                size_t off = j * chunk, len = min_size(chunk, n_bytes - off);
                CUDA_CHECK(cudaMemcpyAsync(buf[j % 2], (const char *)src_dev + off, len,
                                           cudaMemcpyDeviceToHost, dev->stream));
                CUDA_CHECK(cudaEventRecord(ev[j % 2], dev->stream));
            }
            size_t off = k * chunk, len = min_size(chunk, n_bytes - off);
            // Also waits for all work queued before (stream order), as promised.
            CUDA_CHECK(cudaEventSynchronize(ev[k % 2]));
            memcpy((char *)dst_host + off, buf[k % 2], len);
        }
    }
    for (int i = 0; i < 2; i++) {
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
        exec_cuda_host_free(buf[i]);
    }
    return true;
fail:
    // A queued copy may still write a staging buffer: wait before it goes back to the cache.
    (void)cudaStreamSynchronize(dev->stream);
    for (int i = 0; i < 2; i++) {
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
        exec_cuda_host_free(buf[i]);
    }
    (void)cudaGetLastError();
    dg_status_prepend(st, "GPU:%d: copying %zu bytes %s", dev->id, n_bytes, what);
    return false;
}

// Runs on a CUDA thread once the copy out of the staging buffer has run: no CUDA calls here.
static void CUDART_CB release_staging(void *p) { exec_cuda_host_free(p); }

bool exec_cuda_memcpy_to_device(exec_cuda_device *dev, void *dst_dev, const void *src_host,
                                size_t n_bytes, dg_status *st) {
    static const char what[] = "host to device";
    // Slot s holds the staging buffer of chunks s, s + STAGE_SLOTS, ...; buf[s] is non-NULL
    // while this call owns it (a host function releases it after its last copy).
    char *buf[STAGE_SLOTS] = {NULL};
    cudaEvent_t ev[STAGE_SLOTS] = {NULL};
    if (n_bytes == 0) return true;
    if (!check_copy(dev, dst_dev, src_host, n_bytes, what, st)) return false;
    CUDA_CHECK(cudaSetDevice(dev->id));
    // A small pageable source is consumed by the driver before the call returns. A pinned
    // source would be read by a DMA later, after the caller may have reused it: staged too.
    if (n_bytes < SMALL_COPY_BYTES && !exec_cuda_host_is_pinned(src_host)) {
        CUDA_CHECK(cudaMemcpyAsync(dst_dev, src_host, n_bytes, cudaMemcpyHostToDevice,
                                   dev->stream));
        return true;
    }
    const size_t chunk = min_size(n_bytes, STAGE_CHUNK_BYTES);
    const size_t n_chunks = (n_bytes + chunk - 1) / chunk;
    for (size_t k = 0; k < n_chunks; k++) {
        size_t s = k % STAGE_SLOTS, off = k * chunk, len = min_size(chunk, n_bytes - off);
        if (k >= STAGE_SLOTS) {
            // Chunk k - STAGE_SLOTS's copy out of this buffer must have run.
            CUDA_CHECK(cudaEventSynchronize(ev[s]));
        } else if (!(buf[s] = host_block(chunk, NULL))) {
            // Short of pinned memory: copy the rest through the driver and wait for it, so
            // the source may be reused on return.
            CUDA_CHECK(cudaMemcpyAsync((char *)dst_dev + off, (const char *)src_host + off,
                                       n_bytes - off, cudaMemcpyHostToDevice, dev->stream));
            CUDA_CHECK(cudaStreamSynchronize(dev->stream));
            break;
        }
        memcpy(buf[s], (const char *)src_host + off, len);
        CUDA_CHECK(cudaMemcpyAsync((char *)dst_dev + off, buf[s], len, cudaMemcpyHostToDevice,
                                   dev->stream));
        if (k + STAGE_SLOTS < n_chunks) {
            if (!ev[s]) CUDA_CHECK(cudaEventCreateWithFlags(&ev[s], cudaEventDisableTiming));
            CUDA_CHECK(cudaEventRecord(ev[s], dev->stream));
        } else {
            // The buffer's last chunk: it goes back to the cache once this copy has run.
            CUDA_CHECK(cudaLaunchHostFunc(dev->stream, release_staging, buf[s]));
            buf[s] = NULL;
        }
    }
    for (int s = 0; s < STAGE_SLOTS; s++) {
        if (ev[s]) (void)cudaEventDestroy(ev[s]);   // fine while pending
        // Left only after the synchronous fallback, so nothing reads it any more.
        exec_cuda_host_free(buf[s]);
    }
    return true;
fail:
    // Buffers still owned may be read by queued copies: wait before returning them.
    (void)cudaStreamSynchronize(dev->stream);
    for (int s = 0; s < STAGE_SLOTS; s++) {
        if (ev[s]) (void)cudaEventDestroy(ev[s]);
        exec_cuda_host_free(buf[s]);
    }
    (void)cudaGetLastError();
    dg_status_prepend(st, "GPU:%d: copying %zu bytes %s", dev->id, n_bytes, what);
    return false;
}

bool exec_cuda_memcpy_device(exec_cuda_device *dev, void *dst_dev, const void *src_dev,
                             size_t n_bytes, dg_status *st) {
    static const char what[] = "device to device";
    if (n_bytes == 0) return true;
    if (!check_copy(dev, dst_dev, src_dev, n_bytes, what, st)) return false;
    CUDA_CHECK(cudaSetDevice(dev->id));
    CUDA_CHECK(cudaMemcpyAsync(dst_dev, src_dev, n_bytes, cudaMemcpyDeviceToDevice,
                               dev->stream));
    return true;
fail:
    dg_status_prepend(st, "GPU:%d: copying %zu bytes %s", dev->id, n_bytes, what);
    return false;
}
