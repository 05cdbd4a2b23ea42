/* Tests for executor/block_cache.c over a malloc-backed fake backend that counts its calls
 * and can be given a byte limit, so that out-of-memory and the trim-and-retry path can be
 * driven without a GPU. */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_cache.h"

#define MiB ((size_t)1 << 20)

typedef struct fake_backend {
    pthread_mutex_t mu;
    size_t limit_bytes;   // 0: no limit
    size_t live_bytes;
    int64_t n_allocs;     // calls, failed ones included
    int64_t n_failures;
    int64_t n_frees;
    int64_t n_live;
} fake_backend;

// The fake keeps each block's size in a header in front of it.
typedef struct fake_header {
    size_t size;
    size_t pad[7];   // the block after the header stays 64-byte aligned, like malloc's
} fake_header;

static void *fake_alloc(void *ctx, size_t n_bytes) {
    fake_backend *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->n_allocs++;
    bool refuse = f->limit_bytes && f->live_bytes + n_bytes > f->limit_bytes;
    if (refuse) f->n_failures++;
    pthread_mutex_unlock(&f->mu);
    if (refuse) return NULL;
    fake_header *h = malloc(sizeof *h + n_bytes);
    if (!h) return NULL;
    h->size = n_bytes;
    pthread_mutex_lock(&f->mu);
    f->live_bytes += n_bytes;
    f->n_live++;
    pthread_mutex_unlock(&f->mu);
    return h + 1;
}

static void fake_free(void *ctx, void *p) {
    fake_backend *f = ctx;
    fake_header *h = (fake_header *)p - 1;
    pthread_mutex_lock(&f->mu);
    f->n_frees++;
    f->live_bytes -= h->size;
    f->n_live--;
    pthread_mutex_unlock(&f->mu);
    free(h);
}

typedef struct fixture {
    fake_backend fake;
    exec_block_cache *cache;
} fixture;

static int setup(void **state) {
    fixture *fx = calloc(1, sizeof *fx);
    if (!fx) return -1;
    pthread_mutex_init(&fx->fake.mu, NULL);
    fx->cache = exec_block_cache_new(fake_alloc, fake_free, &fx->fake);
    if (!fx->cache) return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fixture *fx = *state;
    exec_block_cache_free(&fx->cache);
    // Freeing the cache gives every block back, those in use included.
    int leaked = fx->fake.n_live != 0 || fx->fake.live_bytes != 0;
    pthread_mutex_destroy(&fx->fake.mu);
    free(fx);
    return leaked ? -1 : 0;
}

static exec_block_cache_stats stats_of(exec_block_cache *c) {
    exec_block_cache_stats s;
    exec_block_cache_stats_get(c, &s);
    return s;
}

static void test_classes(void **state) {
    (void)state;
    assert_int_equal(exec_block_cache_class(0), 0);
    assert_int_equal(exec_block_cache_class(1), 512);
    assert_int_equal(exec_block_cache_class(512), 512);
    assert_int_equal(exec_block_cache_class(513), 1024);
    assert_int_equal(exec_block_cache_class(MiB - 1), MiB);
    assert_int_equal(exec_block_cache_class(MiB), MiB);
    assert_int_equal(exec_block_cache_class(MiB + 1), 2 * MiB);
    assert_int_equal(exec_block_cache_class(2 * MiB + 1), 4 * MiB);
    assert_int_equal(exec_block_cache_class(10 * MiB + 3), 12 * MiB);
    assert_true(exec_block_cache_class(SIZE_MAX) == SIZE_MAX);
    assert_true(exec_block_cache_class(SIZE_MAX - MiB) == SIZE_MAX);
}

static void test_new_free(void **state) {
    (void)state;
    fake_backend f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    assert_null(exec_block_cache_new(NULL, fake_free, &f));
    assert_null(exec_block_cache_new(fake_alloc, NULL, &f));
    exec_block_cache *c = NULL;
    exec_block_cache_free(NULL);
    exec_block_cache_free(&c);
    c = exec_block_cache_new(fake_alloc, fake_free, &f);
    assert_non_null(c);
    void *used = exec_block_cache_alloc(c, 100);
    void *cached = exec_block_cache_alloc(c, 5 * MiB);
    assert_true(exec_block_cache_free_block(c, cached));
    assert_int_equal(f.n_live, 2);
    exec_block_cache_free(&c);
    assert_null(c);
    assert_non_null(used);
    assert_int_equal(f.n_live, 0);   // the cached and the in-use block both went back
    assert_int_equal(f.n_frees, 2);
}

static void test_zero_and_overflow(void **state) {
    fixture *fx = *state;
    assert_null(exec_block_cache_alloc(fx->cache, 0));
    assert_null(exec_block_cache_alloc(fx->cache, SIZE_MAX));
    assert_null(exec_block_cache_alloc(fx->cache, SIZE_MAX - 100));
    exec_block_cache_stats s = stats_of(fx->cache);
    assert_int_equal(s.allocs, 2);   // the zero-byte call is not counted
    assert_int_equal(s.backend_allocs, 0);
    assert_int_equal(fx->fake.n_allocs, 0);
}

// Allocates one block of each size, writes all of each, frees them in the given order.
static void round_of(exec_block_cache *c, const size_t *sizes, int n, const int *order) {
    void *ptrs[16];
    for (int i = 0; i < n; i++) {
        ptrs[i] = exec_block_cache_alloc(c, sizes[i]);
        assert_non_null(ptrs[i]);
        assert_true(exec_block_cache_size_of(c, ptrs[i]) >= sizes[i]);
        memset(ptrs[i], i + 1, sizes[i]);
    }
    for (int i = 0; i < n; i++) {
        unsigned char *p = ptrs[order[i]];
        size_t sz = sizes[order[i]];
        assert_int_equal(p[0], order[i] + 1);
        assert_int_equal(p[sz - 1], order[i] + 1);
        assert_true(exec_block_cache_free_block(c, p));
    }
}

static void test_steady_state(void **state) {
    fixture *fx = *state;
    // Repeated sizes, small and large, the same size twice, the class boundaries.
    const size_t sizes[] = {1,       100,         512,         513,     4096,   70000,
                            70000,   MiB,         MiB + 1,     3 * MiB + 5,    10 * MiB,
                            16 * MiB + 7};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    const int forward[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const int backward[] = {11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    const int mixed[] = {5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7};
    round_of(fx->cache, sizes, n, forward);
    exec_block_cache_stats first = stats_of(fx->cache);
    assert_int_equal(first.backend_allocs, n);
    assert_int_equal(first.n_in_use, 0);
    assert_int_equal(first.n_cached, n);
    for (int r = 0; r < 20; r++) round_of(fx->cache, sizes, n, r % 3 == 0 ? backward
                                                                : r % 3 == 1 ? mixed : forward);
    exec_block_cache_stats s = stats_of(fx->cache);
    assert_int_equal(s.backend_allocs, first.backend_allocs);   // nothing new from the backend
    assert_int_equal(fx->fake.n_allocs, n);
    assert_int_equal(s.backend_frees, 0);
    assert_int_equal(s.allocs, 21 * n);
    assert_int_equal(s.hits, 20 * n);
    assert_int_equal(s.bytes_cached, first.bytes_cached);
    assert_int_equal(s.bytes_in_use, 0);
}

static void test_reuse_class(void **state) {
    fixture *fx = *state;
    exec_block_cache *c = fx->cache;
    // Small: exactly the same class only.
    void *a = exec_block_cache_alloc(c, 1000);   // class 1024
    assert_true(exec_block_cache_free_block(c, a));
    assert_ptr_equal(exec_block_cache_alloc(c, 600), a);   // class 1024 too
    assert_int_equal(exec_block_cache_size_of(c, a), 1024);
    assert_true(exec_block_cache_free_block(c, a));
    void *b = exec_block_cache_alloc(c, 400);   // class 512: not the 1024 block
    assert_ptr_not_equal(b, a);
    void *d = exec_block_cache_alloc(c, 1100);   // class 1536: not the 1024 block either
    assert_ptr_not_equal(d, a);
    assert_int_equal(exec_block_cache_size_of(c, d), 1536);
    assert_ptr_equal(exec_block_cache_alloc(c, 1024), a);
    assert_int_equal(stats_of(c).backend_allocs, 3);

    // Large: the smallest cached block at least the class, at most a third larger.
    void *big8 = exec_block_cache_alloc(c, 8 * MiB);
    void *big6 = exec_block_cache_alloc(c, 6 * MiB);
    assert_true(exec_block_cache_free_block(c, big8));
    assert_true(exec_block_cache_free_block(c, big6));
    assert_ptr_equal(exec_block_cache_alloc(c, 5 * MiB), big6);    // best fit: the 6 MiB one
    assert_ptr_equal(exec_block_cache_alloc(c, 5 * MiB), big8);    // next: 8 <= 6 + 6/3
    assert_int_equal(exec_block_cache_size_of(c, big8), 8 * MiB);  // keeps its size
    assert_true(exec_block_cache_free_block(c, big8));
    void *big4 = exec_block_cache_alloc(c, 4 * MiB);   // 8 MiB is too big for 4 MiB
    assert_ptr_not_equal(big4, big8);
    void *big10 = exec_block_cache_alloc(c, 10 * MiB);   // 8 MiB is too small for 10 MiB
    assert_ptr_not_equal(big10, big8);
    assert_int_equal(exec_block_cache_size_of(c, big10), 10 * MiB);
    void *two = exec_block_cache_alloc(c, MiB + 1);   // class 2 MiB: a new block
    assert_int_equal(exec_block_cache_size_of(c, two), 2 * MiB);
    assert_true(exec_block_cache_free_block(c, two));
    assert_ptr_equal(exec_block_cache_alloc(c, 2 * MiB), two);
    assert_int_equal(stats_of(c).backend_allocs, 8);
}

static void test_stats(void **state) {
    fixture *fx = *state;
    exec_block_cache *c = fx->cache;
    exec_block_cache_stats s = stats_of(c), zero = {0};
    assert_memory_equal(&s, &zero, sizeof s);
    void *p1 = exec_block_cache_alloc(c, 10);          // 512
    void *p2 = exec_block_cache_alloc(c, 3 * MiB);     // 4 MiB
    void *p3 = exec_block_cache_alloc(c, 2000);        // 2048
    s = stats_of(c);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(s.backend_allocs, 3);
    assert_int_equal(s.hits, 0);
    assert_int_equal(s.n_in_use, 3);
    assert_int_equal(s.bytes_in_use, 512 + 4 * MiB + 2048);
    assert_int_equal(s.n_cached, 0);
    assert_int_equal(s.bytes_cached, 0);
    assert_true(exec_block_cache_free_block(c, p2));
    assert_true(exec_block_cache_free_block(c, p1));
    s = stats_of(c);
    assert_int_equal(s.n_in_use, 1);
    assert_int_equal(s.bytes_in_use, 2048);
    assert_int_equal(s.n_cached, 2);
    assert_int_equal(s.bytes_cached, 512 + 4 * MiB);
    assert_ptr_equal(exec_block_cache_alloc(c, 4 * MiB), p2);
    s = stats_of(c);
    assert_int_equal(s.allocs, 4);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.bytes_in_use, 2048 + 4 * MiB);
    assert_int_equal(s.bytes_cached, 512);
    assert_int_equal(fx->fake.live_bytes, 512 + 4 * MiB + 2048);
    assert_true(exec_block_cache_free_block(c, p2));
    assert_true(exec_block_cache_free_block(c, p3));
}

static void test_trim(void **state) {
    fixture *fx = *state;
    exec_block_cache *c = fx->cache;
    assert_int_equal(exec_block_cache_trim(c), 0);   // nothing cached
    // More blocks than one trim batch.
    void *ptrs[150];
    for (int i = 0; i < 150; i++) {
        ptrs[i] = exec_block_cache_alloc(c, (size_t)(i % 5 + 1) * 512);
        assert_non_null(ptrs[i]);
    }
    void *kept = exec_block_cache_alloc(c, 3 * MiB);
    size_t want = 0;
    for (int i = 0; i < 150; i++) {
        want += (size_t)(i % 5 + 1) * 512;
        assert_true(exec_block_cache_free_block(c, ptrs[i]));
    }
    exec_block_cache_stats s = stats_of(c);
    assert_int_equal(s.bytes_cached, want);
    assert_int_equal(exec_block_cache_trim(c), want);
    s = stats_of(c);
    assert_int_equal(s.n_cached, 0);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.backend_frees, 150);
    assert_int_equal(s.n_in_use, 1);
    assert_int_equal(fx->fake.n_live, 1);   // only the block in use is left
    assert_int_equal(fx->fake.live_bytes, 4 * MiB);
    assert_int_equal(exec_block_cache_size_of(c, kept), 4 * MiB);
    // Trimmed blocks are forgotten: freeing one again is refused.
    assert_false(exec_block_cache_free_block(c, ptrs[0]));
    // The next allocation goes to the backend again.
    void *p = exec_block_cache_alloc(c, 512);
    assert_non_null(p);
    assert_int_equal(stats_of(c).backend_allocs, 152);
    assert_true(exec_block_cache_free_block(c, p));
    assert_true(exec_block_cache_free_block(c, kept));
    assert_int_equal(exec_block_cache_trim(c), 512 + 4 * MiB);
    assert_int_equal(fx->fake.n_live, 0);
}

static void test_retry_after_trim(void **state) {
    fixture *fx = *state;
    exec_block_cache *c = fx->cache;
    fx->fake.limit_bytes = 8 * MiB;
    void *a = exec_block_cache_alloc(c, 6 * MiB);
    void *small = exec_block_cache_alloc(c, 1000);
    assert_non_null(a);
    assert_non_null(small);
    assert_true(exec_block_cache_free_block(c, a));
    assert_true(exec_block_cache_free_block(c, small));
    // 4 MiB does not fit the cached 6 MiB block (more than a third larger) and the backend
    // is full: the cache gives its blocks back and the second backend call succeeds.
    void *b = exec_block_cache_alloc(c, 4 * MiB);
    assert_non_null(b);
    exec_block_cache_stats s = stats_of(c);
    assert_int_equal(s.backend_allocs, 4);
    assert_int_equal(s.backend_failures, 1);
    assert_int_equal(s.backend_frees, 2);
    assert_int_equal(s.n_cached, 0);
    assert_int_equal(s.bytes_in_use, 4 * MiB);
    assert_int_equal(fx->fake.live_bytes, 4 * MiB);

    // Nothing cached: a failure is final after one backend call.
    assert_null(exec_block_cache_alloc(c, 6 * MiB));
    s = stats_of(c);
    assert_int_equal(s.backend_allocs, 5);
    assert_int_equal(s.backend_failures, 2);
    assert_int_equal(s.bytes_in_use, 4 * MiB);
    // Still fully usable.
    void *d = exec_block_cache_alloc(c, 4 * MiB);
    assert_non_null(d);
    assert_true(exec_block_cache_free_block(c, d));
    assert_true(exec_block_cache_free_block(c, b));
    // Trim-and-retry that still fails leaves the cache empty and consistent.
    assert_null(exec_block_cache_alloc(c, 9 * MiB));
    s = stats_of(c);
    assert_int_equal(s.n_cached, 0);
    assert_int_equal(s.n_in_use, 0);
    assert_int_equal(fx->fake.n_live, 0);
    assert_int_equal(s.backend_failures, 4);
}

static void test_foreign_pointer(void **state) {
    fixture *fx = *state;
    exec_block_cache *c = fx->cache;
    char *mine = exec_block_cache_alloc(c, 5000);   // class 5120
    char *other = malloc(64);
    assert_non_null(other);
    exec_block_cache_stats before = stats_of(c);
    assert_false(exec_block_cache_free_block(c, NULL));
    assert_false(exec_block_cache_free_block(NULL, mine));
    assert_false(exec_block_cache_free_block(c, other));
    assert_false(exec_block_cache_free_block(c, mine + 8));   // inside, not the start
    assert_int_equal(exec_block_cache_size_of(c, other), 0);
    assert_int_equal(exec_block_cache_size_of(c, mine + 8), 0);
    exec_block_cache_stats after = stats_of(c);
    assert_memory_equal(&before, &after, sizeof before);

    void *base = NULL;
    size_t n = 0;
    assert_true(exec_block_cache_find(c, mine, &base, &n));
    assert_ptr_equal(base, mine);
    assert_int_equal(n, 5120);
    assert_true(exec_block_cache_find(c, mine + 5119, NULL, NULL));
    assert_false(exec_block_cache_find(c, mine + 5120, NULL, NULL));   // one past the end
    assert_false(exec_block_cache_find(c, other, &base, &n));
    assert_ptr_equal(base, mine);   // untouched on a miss
    assert_false(exec_block_cache_find(c, NULL, NULL, NULL));

    assert_true(exec_block_cache_free_block(c, mine));
    assert_false(exec_block_cache_free_block(c, mine));   // twice
    assert_false(exec_block_cache_find(c, mine, NULL, NULL));   // cached, not in use
    assert_int_equal(exec_block_cache_size_of(c, mine), 0);
    assert_int_equal(stats_of(c).n_cached, 1);
    assert_ptr_equal(exec_block_cache_alloc(c, 5000), mine);   // handed out once only
    assert_ptr_not_equal(exec_block_cache_alloc(c, 5000), mine);
    free(other);
}

// ---- threads ----

enum { N_THREADS = 8, N_ITERS = 20000, N_HELD = 8 };

typedef struct worker {
    exec_block_cache *cache;
    int id;
    int n_errors;
} worker;

static void *hammer(void *arg) {
    worker *w = arg;
    static const size_t sizes[] = {16, 512, 700, 4096, 100000, MiB + 5, 3 * MiB};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    unsigned char *held[N_HELD] = {NULL};
    size_t held_size[N_HELD] = {0};
    uint64_t rng = 0x9e3779b97f4a7c15ULL * (uint64_t)(w->id + 1);
    const unsigned char tag = (unsigned char)(0x10 + w->id);
    for (int it = 0; it < N_ITERS; it++) {
        int slot = (int)dg_test_uniform(&rng, 0, N_HELD);
        if (held[slot]) {
            // A block handed to two holders at once would show another thread's tag.
            size_t sz = held_size[slot];
            if (held[slot][0] != tag || held[slot][sz - 1] != tag || held[slot][sz / 2] != tag)
                w->n_errors++;
            if (!exec_block_cache_free_block(w->cache, held[slot])) w->n_errors++;
            held[slot] = NULL;
        } else {
            size_t sz = sizes[(int)dg_test_uniform(&rng, 0, n_sizes)];
            unsigned char *p = exec_block_cache_alloc(w->cache, sz);
            if (!p) {
                w->n_errors++;
                continue;
            }
            p[0] = p[sz / 2] = p[sz - 1] = tag;
            held[slot] = p;
            held_size[slot] = sz;
        }
        if (it % 5000 == 4999 && w->id == 0) exec_block_cache_trim(w->cache);
    }
    for (int i = 0; i < N_HELD; i++)
        if (held[i] && !exec_block_cache_free_block(w->cache, held[i])) w->n_errors++;
    return NULL;
}

static void test_threads(void **state) {
    fixture *fx = *state;
    pthread_t threads[N_THREADS];
    worker workers[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        workers[i] = (worker){.cache = fx->cache, .id = i};
        assert_int_equal(pthread_create(&threads[i], NULL, hammer, &workers[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(workers[i].n_errors, 0);
    }
    exec_block_cache_stats s = stats_of(fx->cache);
    assert_int_equal(s.n_in_use, 0);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.backend_allocs - s.backend_frees, fx->fake.n_live);
    assert_int_equal(s.n_cached, fx->fake.n_live);
    assert_int_equal(s.bytes_cached, fx->fake.live_bytes);
    assert_true(s.hits > s.allocs / 2);   // mostly served from the cache
    print_message("%lld allocs, %lld hits, %lld backend allocs, %lld frees\n",
                  (long long)s.allocs, (long long)s.hits, (long long)s.backend_allocs,
                  (long long)s.backend_frees);
    exec_block_cache_trim(fx->cache);
    assert_int_equal(fx->fake.n_live, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classes),
        cmocka_unit_test(test_new_free),
        cmocka_unit_test_setup_teardown(test_zero_and_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_steady_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_class, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_after_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_pointer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
