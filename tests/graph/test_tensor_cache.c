/* graph/tensor_cache.c: large tensor buffers kept for reuse. The size classes hold what is
 * asked and waste at most an eighth; a freed buffer serves the next tensor of its class and no
 * other; the live-bytes accounting (dg_tensor_memory) counts tensors, not the cache; the cache
 * stays under its bound (DG_TENSOR_CACHE_MB, set to 1 here before the first use), makes room
 * for a new class by freeing others, and gives everything back on dg_tensor_cache_release. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "tensor_cache_impl.h"

static dg_tensor *floats(int64_t n) {
    dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape_make(1, (int64_t[]){n}), NULL);
    assert_non_null(t);
    return t;
}

static void test_size_classes(void **state) {
    (void)state;
    // Below the cache: 64-byte multiples, never 0.
    assert_int_equal(tensor_cache_bytes(0), 64);
    assert_int_equal(tensor_cache_bytes(1), 64);
    assert_int_equal(tensor_cache_bytes(65), 128);
    assert_int_equal(tensor_cache_bytes(TENSOR_CACHE_MIN - 1), TENSOR_CACHE_MIN);
    // From 64 KiB: eight classes a doubling.
    assert_int_equal(tensor_cache_bytes(TENSOR_CACHE_MIN), TENSOR_CACHE_MIN);
    assert_int_equal(tensor_cache_bytes(TENSOR_CACHE_MIN + 1), TENSOR_CACHE_MIN + TENSOR_CACHE_MIN / 8);
    assert_int_equal(tensor_cache_bytes(2 * TENSOR_CACHE_MIN - 1), 2 * TENSOR_CACHE_MIN);
    assert_int_equal(tensor_cache_bytes((size_t)3 << 20), (size_t)3 << 20);
    assert_int_equal(tensor_cache_bytes(((size_t)3 << 20) + 1), ((size_t)3 << 20) + ((size_t)1 << 18));
    // Every size: holds it, at most an eighth more, a multiple of 64; and the class of a class
    // size is itself.
    uint64_t x = 12345;
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = (size_t)(x % ((uint64_t)1 << (10 + i % 30)));
        size_t c = tensor_cache_bytes(n);
        assert_true(c >= n);
        assert_true(c % 64 == 0);
        if (n >= TENSOR_CACHE_MIN) assert_true((double)c <= (double)n * 1.125);
        assert_int_equal(tensor_cache_bytes(c), c);
    }
}

static void test_reuse_by_class(void **state) {
    (void)state;
    dg_tensor_cache_release();
    int64_t live0;
    dg_tensor_memory(&live0, NULL);
    dg_tensor *a = floats(100000);   // 400,000 bytes: class 425,984
    void *pa = dg_tensor_data(a);
    memset(pa, 1, dg_tensor_nbytes(a));
    int64_t live;
    dg_tensor_memory(&live, NULL);
    assert_int_equal(live - live0, 425984);
    dg_tensor_unref(a);
    dg_tensor_memory(&live, NULL);
    assert_int_equal(live, live0);   // a cached buffer is not a live tensor
    assert_int_equal(dg_tensor_cache_held(), 425984);
    // Another class: a fresh buffer, the cached one stays.
    dg_tensor *b = floats(30000);   // 120,000 bytes: class 122,880
    assert_true(dg_tensor_data(b) != pa);
    assert_int_equal(dg_tensor_cache_held(), 425984);
    // The same class (a slightly smaller tensor): the cached buffer, whole and aligned.
    dg_tensor *c = floats(99000);
    assert_ptr_equal(dg_tensor_data(c), pa);
    assert_int_equal((uintptr_t)dg_tensor_data(c) % 64, 0);
    assert_int_equal(dg_tensor_cache_held(), 0);
    memset(dg_tensor_data(c), 2, dg_tensor_nbytes(c));
    dg_tensor_unref(c);
    dg_tensor_unref(b);
    assert_int_equal(dg_tensor_cache_held(), 425984 + 122880);
    assert_int_equal(dg_tensor_cache_release(), 425984 + 122880);
    assert_int_equal(dg_tensor_cache_held(), 0);
    // Small tensors never enter the cache.
    dg_tensor *s = floats(1000);
    dg_tensor_unref(s);
    assert_int_equal(dg_tensor_cache_held(), 0);
}

static void test_bound(void **state) {
    (void)state;
    dg_tensor_cache_release();
    // 1 MiB bound (main sets it): 20 buffers of 131,072 bytes freed, 8 kept.
    dg_tensor *t[20];
    for (int i = 0; i < 20; i++) t[i] = floats(32768);
    for (int i = 0; i < 20; i++) dg_tensor_unref(t[i]);
    assert_int_equal(dg_tensor_cache_held(), (size_t)8 << 17);
    // A buffer larger than the bound is never kept, and evicts nothing.
    dg_tensor *big = floats((int64_t)1 << 19);   // 2 MiB
    dg_tensor_unref(big);
    assert_int_equal(dg_tensor_cache_held(), (size_t)8 << 17);
    // Full: a buffer of another class (204,800 bytes: class 212,992) makes room by freeing two
    // of 131,072.
    dg_tensor *other = floats(51200);
    assert_int_equal(dg_tensor_cache_held(), (size_t)8 << 17);   // a fresh buffer: none of its class
    dg_tensor_unref(other);
    assert_int_equal(dg_tensor_cache_held(), ((size_t)6 << 17) + 212992);
    // A buffer of a full class's own size is kept without evicting its own class: the cache
    // stays under its bound and keeps the newest.
    dg_tensor *t8[8];
    for (int i = 0; i < 8; i++) t8[i] = floats(32768);   // six from the cache, two fresh
    assert_int_equal(dg_tensor_cache_held(), 212992);
    for (int i = 0; i < 8; i++) dg_tensor_unref(t8[i]);
    assert_true(dg_tensor_cache_held() <= (size_t)1 << 20);
    assert_int_equal(dg_tensor_cache_held(), (size_t)8 << 17);   // the 212,992 went for the last two
    assert_int_equal(dg_tensor_cache_release(), (size_t)8 << 17);
}

int main(void) {
    setenv("DG_TENSOR_CACHE_MB", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_classes),
        cmocka_unit_test(test_reuse_by_class),
        cmocka_unit_test(test_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
