/* The caching block allocator (block_cache.h).
 *
 * Two sorted arrays under one mutex:
 *   blocks: every block the backend gave us (in use or cached), sorted by address, so that
 *           free_block finds p exactly and find() finds the block around an interior pointer
 *           by binary search;
 *   cached: the free blocks as (size, address), sorted by size then address, so that the best
 *           fit for a request is the first entry not smaller than its class.
 * Both have room for every block at all times (grown when a block is added), so freeing a
 * block never allocates and cannot fail. Counts stay small (hundreds to thousands of
 * blocks), and insertions move pointers with memmove; steady-state allocation and freeing
 * touch no backend and no malloc. */
#include "block_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    uintptr_t addr;
    size_t size;     // class size the backend was asked for
    bool is_used;    // handed out and not freed
} block;

typedef struct cached_block {
    size_t size;
    uintptr_t addr;
} cached_block;

struct exec_block_cache {
    pthread_mutex_t mu;
    exec_block_backend_alloc backend_alloc;
    exec_block_backend_free backend_free;
    void *ctx;
    block *blocks;          // sorted by addr, n_blocks of cap
    size_t n_blocks;
    cached_block *cached;   // sorted by (size, addr), n_cached of cap (cap >= n_blocks)
    size_t n_cached;
    size_t cap;
    exec_block_cache_stats stats;
};

size_t exec_block_cache_class(size_t n_bytes) {
    size_t round = n_bytes <= EXEC_BLOCK_SMALL_MAX ? EXEC_BLOCK_SMALL_ROUND
                                                   : EXEC_BLOCK_LARGE_ROUND;
    if (n_bytes > SIZE_MAX - (round - 1)) return SIZE_MAX;
    return (n_bytes + round - 1) / round * round;
}

// Whether a cached block of size have may serve a request of class size want.
static bool fits(size_t have, size_t want) {
    if (have < want) return false;
    if (want <= EXEC_BLOCK_SMALL_MAX) return have == want;
    return have - want <= want / 3;
}

// Index of the first block with addr >= a.
static size_t blocks_lower(const exec_block_cache *c, uintptr_t a) {
    size_t lo = 0, hi = c->n_blocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->blocks[mid].addr < a) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Index of the first cached entry not less than (size, addr).
static size_t cached_lower(const exec_block_cache *c, size_t size, uintptr_t addr) {
    size_t lo = 0, hi = c->n_cached;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const cached_block *e = &c->cached[mid];
        if (e->size < size || (e->size == size && e->addr < addr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The block starting exactly at a, or NULL.
static block *block_at(exec_block_cache *c, uintptr_t a) {
    size_t i = blocks_lower(c, a);
    return i < c->n_blocks && c->blocks[i].addr == a ? &c->blocks[i] : NULL;
}

static void blocks_remove(exec_block_cache *c, uintptr_t a) {
    size_t i = blocks_lower(c, a);
    if (i >= c->n_blocks || c->blocks[i].addr != a) abort();   // broken invariant
    memmove(&c->blocks[i], &c->blocks[i + 1], (c->n_blocks - i - 1) * sizeof *c->blocks);
    c->n_blocks--;
}

// Makes room for one more block in both arrays. Under mu.
static bool reserve_one(exec_block_cache *c) {
    if (c->n_blocks < c->cap) return true;
    size_t cap = c->cap ? c->cap * 2 : 64;
    block *b = realloc(c->blocks, cap * sizeof *b);
    if (!b) return false;
    c->blocks = b;
    cached_block *e = realloc(c->cached, cap * sizeof *e);
    if (!e) return false;   // blocks is larger but cap unchanged: still consistent
    c->cached = e;
    c->cap = cap;
    return true;
}

exec_block_cache *exec_block_cache_new(exec_block_backend_alloc alloc,
                                       exec_block_backend_free free_fn, void *ctx) {
    if (!alloc || !free_fn) return NULL;
    exec_block_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return NULL;
    }
    c->backend_alloc = alloc;
    c->backend_free = free_fn;
    c->ctx = ctx;
    return c;
}

void exec_block_cache_free(exec_block_cache **pc) {
    if (!pc || !*pc) return;
    exec_block_cache *c = *pc;
    // No other thread may use the cache now, so the lock is not needed.
    for (size_t i = 0; i < c->n_blocks; i++) c->backend_free(c->ctx, (void *)c->blocks[i].addr);
    free(c->cached);
    free(c->blocks);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *pc = NULL;
}

// Takes the best cached block for class size want, or returns NULL. Under mu.
static void *take_cached(exec_block_cache *c, size_t want) {
    size_t i = cached_lower(c, want, 0);
    if (i >= c->n_cached || !fits(c->cached[i].size, want)) return NULL;
    cached_block e = c->cached[i];
    memmove(&c->cached[i], &c->cached[i + 1], (c->n_cached - i - 1) * sizeof *c->cached);
    c->n_cached--;
    block *b = block_at(c, e.addr);
    if (!b || b->is_used) abort();   // broken invariant
    b->is_used = true;
    c->stats.hits++;
    c->stats.n_cached--;
    c->stats.bytes_cached -= (int64_t)e.size;
    c->stats.n_in_use++;
    c->stats.bytes_in_use += (int64_t)e.size;
    return (void *)e.addr;
}

static void *backend_alloc(exec_block_cache *c, size_t size) {
    void *p = c->backend_alloc(c->ctx, size);
    pthread_mutex_lock(&c->mu);
    c->stats.backend_allocs++;
    if (!p) c->stats.backend_failures++;
    pthread_mutex_unlock(&c->mu);
    return p;
}

void *exec_block_cache_alloc(exec_block_cache *c, size_t n_bytes) {
    if (n_bytes == 0) return NULL;
    size_t want = exec_block_cache_class(n_bytes);
    pthread_mutex_lock(&c->mu);
    c->stats.allocs++;
    void *p = want == SIZE_MAX ? NULL : take_cached(c, want);
    pthread_mutex_unlock(&c->mu);
    if (want == SIZE_MAX) return NULL;
    if (p) return p;

    // The backend runs without the lock (see block_cache.h); other threads may meanwhile
    // free blocks that would have fitted, which only costs a backend call.
    p = backend_alloc(c, want);
    if (!p && exec_block_cache_trim(c) > 0) p = backend_alloc(c, want);
    if (!p) return NULL;

    pthread_mutex_lock(&c->mu);
    if (!reserve_one(c)) {
        pthread_mutex_unlock(&c->mu);
        c->backend_free(c->ctx, p);
        pthread_mutex_lock(&c->mu);
        c->stats.backend_frees++;
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    uintptr_t a = (uintptr_t)p;
    size_t i = blocks_lower(c, a);
    memmove(&c->blocks[i + 1], &c->blocks[i], (c->n_blocks - i) * sizeof *c->blocks);
    c->blocks[i] = (block){.addr = a, .size = want, .is_used = true};
    c->n_blocks++;
    c->stats.n_in_use++;
    c->stats.bytes_in_use += (int64_t)want;
    pthread_mutex_unlock(&c->mu);
    return p;
}

bool exec_block_cache_free_block(exec_block_cache *c, void *p) {
    if (!c || !p) return false;
    pthread_mutex_lock(&c->mu);
    block *b = block_at(c, (uintptr_t)p);
    if (!b || !b->is_used) {
        pthread_mutex_unlock(&c->mu);
        return false;
    }
    b->is_used = false;
    // Room is guaranteed: cap >= n_blocks > n_cached.
    size_t i = cached_lower(c, b->size, b->addr);
    memmove(&c->cached[i + 1], &c->cached[i], (c->n_cached - i) * sizeof *c->cached);
    c->cached[i] = (cached_block){.size = b->size, .addr = b->addr};
    c->n_cached++;
    c->stats.n_in_use--;
    c->stats.bytes_in_use -= (int64_t)b->size;
    c->stats.n_cached++;
    c->stats.bytes_cached += (int64_t)b->size;
    pthread_mutex_unlock(&c->mu);
    return true;
}

size_t exec_block_cache_trim(exec_block_cache *c) {
    // In batches: detach up to a batch of cached blocks under the lock, give them back
    // without it. No allocation, so trimming works when memory is short.
    enum { BATCH = 64 };
    size_t total = 0;
    for (;;) {
        void *ptrs[BATCH];
        size_t n = 0;
        pthread_mutex_lock(&c->mu);
        while (n < BATCH && c->n_cached > 0) {
            cached_block e = c->cached[--c->n_cached];
            blocks_remove(c, e.addr);
            c->stats.n_cached--;
            c->stats.bytes_cached -= (int64_t)e.size;
            c->stats.backend_frees++;
            total += e.size;
            ptrs[n++] = (void *)e.addr;
        }
        pthread_mutex_unlock(&c->mu);
        if (n == 0) break;
        for (size_t i = 0; i < n; i++) c->backend_free(c->ctx, ptrs[i]);
    }
    return total;
}

void exec_block_cache_stats_get(exec_block_cache *c, exec_block_cache_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

size_t exec_block_cache_size_of(exec_block_cache *c, const void *p) {
    pthread_mutex_lock(&c->mu);
    block *b = block_at(c, (uintptr_t)p);
    size_t size = b && b->is_used ? b->size : 0;
    pthread_mutex_unlock(&c->mu);
    return size;
}

bool exec_block_cache_find(exec_block_cache *c, const void *p, void **base, size_t *n_bytes) {
    if (!c || !p) return false;
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&c->mu);
    // The last block starting at or before a.
    size_t i = blocks_lower(c, a + 1);
    bool found = false;
    if (i > 0) {
        const block *b = &c->blocks[i - 1];
        if (b->is_used && a - b->addr < b->size) {
            found = true;
            if (base) *base = (void *)b->addr;
            if (n_bytes) *n_bytes = b->size;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}
