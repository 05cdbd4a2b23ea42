/* GPU memory: a caching allocator of device memory per GPU (no cudaMalloc in the steady
 * state of a training loop), a cache of pinned host buffers, and host<->device copies staged
 * through pinned buffers. C only; no CUDA header needed by callers.
 *
 * Stream order makes the caching safe: every GPU kernel of a device runs on the device's one
 * stream, so a block freed while queued work still reads it can only be handed to work
 * queued later on the same stream. */
#ifndef DG_EXEC_CUDA_ALLOC_H
#define DG_EXEC_CUDA_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

// Device memory of dev, 256-byte aligned, from the device's cache (sizes are rounded up to a
// size class; cudaMalloc only when no cached block fits, after which a failure frees the
// cache and retries once). When the environment variable DG_GPU_POISON is set to 1, every
// returned block is filled with 0xff bytes (NaN for floats) on the stream first, so a kernel
// that leaves an output element unwritten is caught. n_bytes 0 returns NULL with st OK.
// Returns: new, release with exec_cuda_mem_free(); NULL with st set (RESOURCE_EXHAUSTED
// naming the size and the GPU).
void *exec_cuda_mem_alloc(exec_cuda_device *dev, size_t n_bytes, dg_status *st);
// With DG_GPU_POISON=1 (read once), queues a fill of p[0..n_bytes) with 0xff bytes on dev's
// stream (the allocator does this for every block it hands out; kernels that reuse an output
// buffer call it too). Does nothing otherwise. false with st set when the fill fails.
bool exec_cuda_poison(exec_cuda_device *dev, void *p, size_t n_bytes, dg_status *st);
// Returns a block to dev's cache. NULL does nothing. Safe while queued work still uses it.
void exec_cuda_mem_free(exec_cuda_device *dev, void *p);
// Gives every cached, unused block of dev back to the driver.
void exec_cuda_mem_trim(exec_cuda_device *dev);

typedef struct exec_cuda_mem_stats {
    int64_t device_mallocs;   // cudaMalloc calls so far
    int64_t allocs;           // exec_cuda_mem_alloc calls so far
    int64_t bytes_in_use;     // handed out and not freed (size-class bytes)
    int64_t bytes_cached;     // held in the cache, free for reuse
} exec_cuda_mem_stats;
void exec_cuda_mem_stats_get(exec_cuda_device *dev, exec_cuda_mem_stats *out);

// Pinned (page-locked) host memory, 64-byte aligned, from a process-wide cache.
// Returns: new, release with exec_cuda_host_free(); NULL with st set.
void *exec_cuda_host_alloc(size_t n_bytes, dg_status *st);
// Returns a pinned buffer to the cache. NULL does nothing. The caller must know no queued
// copy still uses it (exec_cuda_memcpy_* below take care of their own staging buffers).
void exec_cuda_host_free(void *p);
// True when p lies in a buffer from exec_cuda_host_alloc.
bool exec_cuda_host_is_pinned(const void *p);

// Copies n bytes of dev's memory to host memory and waits for the copy (and for all work
// queued on dev's stream before it). A pinned destination is copied into directly; any
// other goes through pinned staging buffers in chunks.
bool exec_cuda_memcpy_to_host(exec_cuda_device *dev, void *dst_host, const void *src_dev,
                              size_t n_bytes, dg_status *st);
// Queues a copy of n host bytes into dev's memory on dev's stream. src_host may be reused or
// freed as soon as the call returns (it is staged through pinned buffers, which go back to
// the cache once the copy has run); the copy itself is ordered before work queued later.
bool exec_cuda_memcpy_to_device(exec_cuda_device *dev, void *dst_dev, const void *src_host,
                                size_t n_bytes, dg_status *st);
// Queues a device-to-device copy of n bytes on dev's stream.
bool exec_cuda_memcpy_device(exec_cuda_device *dev, void *dst_dev, const void *src_dev,
                             size_t n_bytes, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
