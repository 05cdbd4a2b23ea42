/* A caching block allocator over a backend (cudaMalloc, cudaHostAlloc, or malloc in tests):
 * freed blocks stay in the cache and are handed out again, so a loop that allocates the same
 * sizes every step calls the backend only in its first step. Pure C, no CUDA.
 *
 * Size classes: a request of n bytes is served by a block of its class size, n rounded up to
 * a multiple of 512 bytes when n <= 1 MiB ("small"), to a multiple of 2 MiB above ("large").
 * A small request reuses only a cached block of exactly its class; a large one the smallest
 * cached block at least its class and at most a third larger (so at most a quarter of the
 * block is unused). Blocks are never split or merged.
 *
 * The backend is never called with the cache's lock held, so a backend call that waits for
 * other threads (cudaFree, cudaFreeHost wait for queued work, host callbacks included) cannot
 * deadlock against exec_block_cache_free_block, which never calls the backend.
 * Thread safety: every call may come from any thread. */
#ifndef DG_EXEC_BLOCK_CACHE_H
#define DG_EXEC_BLOCK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Class boundaries (see above).
#define EXEC_BLOCK_SMALL_ROUND ((size_t)512)
#define EXEC_BLOCK_SMALL_MAX ((size_t)1 << 20)
#define EXEC_BLOCK_LARGE_ROUND ((size_t)2 << 20)

// The backend: alloc returns n_bytes of memory or NULL; free releases what alloc returned.
// Both may be called from any thread, never under the cache's lock.
typedef void *(*exec_block_backend_alloc)(void *ctx, size_t n_bytes);
typedef void (*exec_block_backend_free)(void *ctx, void *p);

typedef struct exec_block_cache exec_block_cache;

typedef struct exec_block_cache_stats {
    int64_t backend_allocs;    // backend alloc calls, failed ones included
    int64_t backend_failures;  // backend alloc calls that returned NULL
    int64_t backend_frees;     // backend free calls (trim, retry, cache free)
    int64_t allocs;            // exec_block_cache_alloc calls with n_bytes > 0
    int64_t hits;              // of those, served from the cache
    int64_t n_in_use;          // blocks handed out and not freed
    int64_t n_cached;          // blocks held for reuse
    int64_t bytes_in_use;      // their sizes (class sizes, i.e. block sizes)
    int64_t bytes_cached;
} exec_block_cache_stats;

// The class size of a request (0 for 0; SIZE_MAX when rounding overflows).
size_t exec_block_cache_class(size_t n_bytes);

// A cache over the backend; ctx is passed to both backend functions.
// Returns: new, caller frees with exec_block_cache_free(); NULL when out of host memory.
exec_block_cache *exec_block_cache_new(exec_block_backend_alloc alloc,
                                       exec_block_backend_free free_fn, void *ctx);
// Gives every block back to the backend, those still in use included (their users must be
// done with them), and frees the cache. NULL or a pointer to NULL does nothing.
void exec_block_cache_free(exec_block_cache **c);

// A block of at least n_bytes (exec_block_cache_size_of tells its size), from the cache when
// one fits, else from the backend; when the backend fails and the cache holds blocks, they
// are given back (trim) and the backend is asked once more.
// Returns: new, release with exec_block_cache_free_block(); NULL when n_bytes is 0, when the
// class size overflows, or when the backend (or host memory for bookkeeping) fails.
void *exec_block_cache_alloc(exec_block_cache *c, size_t n_bytes);
// Returns block p to the cache (never to the backend; no backend call). True when p was a
// block in use; false, with nothing changed, for NULL, a pointer this cache did not hand out
// (or not a block's start), and a block already freed.
bool exec_block_cache_free_block(exec_block_cache *c, void *p);
// Gives every cached block back to the backend. Returns the bytes given back.
size_t exec_block_cache_trim(exec_block_cache *c);
void exec_block_cache_stats_get(exec_block_cache *c, exec_block_cache_stats *out);
// The size of in-use block p (its start), 0 when p is not one.
size_t exec_block_cache_size_of(exec_block_cache *c, const void *p);
// True when p lies inside a block in use (anywhere in [start, start + size)); then *base and
// *n_bytes (each may be NULL) receive the block's start and size.
bool exec_block_cache_find(exec_block_cache *c, const void *p, void **base, size_t *n_bytes);

#endif
