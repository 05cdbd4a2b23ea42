/* The host buffers of large tensors, kept for the next step. A training step frees the same
 * large activations it allocates again a step later; glibc hands buffers this large back to
 * the kernel (mmap'd chunks are unmapped, arena tops trimmed), so each step paid a page fault
 * and a zeroed page for every 4 KiB it wrote first (a 12-block transformer on two CPUs: 5,000
 * faults a step, 15% of its time). Buffers of TENSOR_CACHE_MIN bytes or more are rounded to a
 * size class (eight a doubling, at most 12.5% over) and, when freed, kept on their class's list
 * while the cache holds less than its bound (when full, buffers of other classes, the largest
 * first, are freed to make room); a later buffer of the same class reuses one.
 * The bound: DG_TENSOR_CACHE_MB (0 turns the cache off), else 1 GiB or an eighth of the
 * machine's memory, whichever is less; always 0 under AddressSanitizer (DG_SANITIZE), which then
 * sees a freed tensor's buffer used. dg_tensor_cache_release gives everything back. Smaller
 * buffers go straight to malloc, which keeps them itself. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "distgraph/tensor.h"
#include "tensor_cache_impl.h"

#define CLASSES_PER_DOUBLING 8
#define MIN_LOG2 16   // TENSOR_CACHE_MIN is 1 << MIN_LOG2
#define MAX_LOG2 47
#define N_CLASSES ((MAX_LOG2 - MIN_LOG2 + 1) * CLASSES_PER_DOUBLING)

// A free buffer's first bytes link it to the next one of its class.
typedef struct free_buffer {
    struct free_buffer *next;
} free_buffer;

static struct {
    pthread_mutex_t mu;
    pthread_once_t once;
    free_buffer *lists[N_CLASSES];
    size_t held, bound;
} cache = {.mu = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

static void cache_init(void) {
    size_t bound = (size_t)1 << 30;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (size_t)pages / 8 * (size_t)page < bound) bound = (size_t)pages / 8 * (size_t)page;
    const char *env = getenv("DG_TENSOR_CACHE_MB");
    if (env && *env) {
        char *end;
        unsigned long long mb = strtoull(env, &end, 10);
        if (*end == '\0' && mb <= (1ULL << 30)) bound = (size_t)mb << 20;   // else the default stays
    }
#if defined(DG_SANITIZE_BUILD) || defined(__SANITIZE_ADDRESS__)
    bound = 0;   // AddressSanitizer sees a buffer used after its tensor is freed only if it is freed
#endif
    cache.bound = bound;
}

// The class of a buffer of n >= TENSOR_CACHE_MIN bytes, and its size; -1 past the largest.
static int class_of(size_t n, size_t *size) {
    int lg = 63 - __builtin_clzll((unsigned long long)n);
    if (lg > MAX_LOG2) return -1;
    size_t step = ((size_t)1 << lg) / CLASSES_PER_DOUBLING;
    size_t k = (n + step - 1) / step;   // CLASSES_PER_DOUBLING .. 2 * CLASSES_PER_DOUBLING
    if (k == 2 * CLASSES_PER_DOUBLING) {
        if (++lg > MAX_LOG2) return -1;
        k = CLASSES_PER_DOUBLING;
        step *= 2;
    }
    *size = k * step;
    return (lg - MIN_LOG2) * CLASSES_PER_DOUBLING + (int)(k - CLASSES_PER_DOUBLING);
}

// The size of class c (the inverse of class_of).
static size_t class_size(int c) {
    int lg = MIN_LOG2 + c / CLASSES_PER_DOUBLING;
    size_t step = ((size_t)1 << lg) / CLASSES_PER_DOUBLING;
    return (size_t)(CLASSES_PER_DOUBLING + c % CLASSES_PER_DOUBLING) * step;
}

// The bytes a buffer of n takes into *size, and its class; -1 for one the cache does not keep.
static int classify(size_t n, size_t *size) {
    int c = n >= TENSOR_CACHE_MIN ? class_of(n, size) : -1;
    if (c < 0) {
        *size = (n + 63) & ~(size_t)63;
        if (!*size) *size = 64;
    }
    return c;
}

size_t tensor_cache_bytes(size_t n) {
    size_t size;
    classify(n, &size);
    return size;
}

void *tensor_cache_alloc(size_t n) {
    size_t size;
    int c = classify(n, &size);
    if (c >= 0) {
        pthread_once(&cache.once, cache_init);
        pthread_mutex_lock(&cache.mu);
        free_buffer *b = cache.lists[c];
        if (b) {
            cache.lists[c] = b->next;
            cache.held -= size;
        }
        pthread_mutex_unlock(&cache.mu);
        if (b) return b;
    }
    return aligned_alloc(64, size);
}

void tensor_cache_free(void *p, size_t n) {
    if (!p) return;
    size_t size;
    int c = classify(n, &size);
    if (c >= 0) {
        pthread_once(&cache.once, cache_init);
        free_buffer *evicted = NULL;
        pthread_mutex_lock(&cache.mu);
        // Full: buffers of other classes make room, the largest first (a workload whose sizes
        // changed does not keep the old ones and lose the reuse).
        for (int k = N_CLASSES - 1; k >= 0 && size <= cache.bound && cache.held + size > cache.bound; k--) {
            while (k != c && cache.lists[k] && cache.held + size > cache.bound) {
                free_buffer *b = cache.lists[k];
                cache.lists[k] = b->next;
                cache.held -= class_size(k);
                b->next = evicted;
                evicted = b;
            }
        }
        bool keep = cache.held + size <= cache.bound;
        if (keep) {
            free_buffer *b = p;
            b->next = cache.lists[c];
            cache.lists[c] = b;
            cache.held += size;
        }
        pthread_mutex_unlock(&cache.mu);
        while (evicted) {
            free_buffer *next = evicted->next;
            free(evicted);
            evicted = next;
        }
        if (keep) return;
    }
    free(p);
}

size_t dg_tensor_cache_release(void) {
    pthread_once(&cache.once, cache_init);
    pthread_mutex_lock(&cache.mu);
    size_t freed = cache.held;
    for (int c = 0; c < N_CLASSES; c++) {
        free_buffer *b = cache.lists[c];
        cache.lists[c] = NULL;
        while (b) {
            free_buffer *next = b->next;
            free(b);
            b = next;
        }
    }
    cache.held = 0;
    pthread_mutex_unlock(&cache.mu);
    return freed;
}

size_t dg_tensor_cache_held(void) {
    pthread_mutex_lock(&cache.mu);
    size_t h = cache.held;
    pthread_mutex_unlock(&cache.mu);
    return h;
}
