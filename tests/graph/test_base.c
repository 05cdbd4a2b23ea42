/* graph/base_impl.h, the plumbing every layer shares: the monotonic clock in its three units,
 * sleeping the whole time asked, allocation failure as a status, and growable arrays keeping
 * every element as they grow. */
#include "testutil.h"

#include <stdlib.h>

#include "base_impl.h"

static void test_clock(void **state) {
    (void)state;
    int64_t ns0 = base_now_ns(), ms0 = base_now_ms();
    double s0 = base_now_s();
    int64_t last = ns0;
    for (int i = 0; i < 1000; i++) {   // never goes back
        int64_t t = base_now_ns();
        assert_true(t >= last);
        last = t;
    }
    base_sleep_ms(20);
    int64_t ns1 = base_now_ns(), ms1 = base_now_ms();
    double s1 = base_now_s();
    assert_true(ns1 - ns0 >= 20 * 1000000LL);   // at least the time asked (no upper bound: loaded hosts)
    assert_true(ms1 - ms0 >= 19);
    assert_true(s1 - s0 >= 0.019);
    // The units agree: ms and s are the same clock as ns.
    int64_t a = base_now_ns(), m = base_now_ms(), b = base_now_ns();
    assert_true(m >= a / 1000000 && m <= b / 1000000);
    base_sleep_ms(0);
    base_sleep_ms(-5);   // nothing
}

static void test_oom(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    assert_false(base_oom(st, "cluster", 1234));
    assert_status(st, DG_RESOURCE_EXHAUSTED, "cluster: out of memory allocating 1234 bytes");
    dg_status_free(&st);
}

static void test_growable_array(void **state) {
    (void)state;
    int *xs = NULL, n = 0, cap = 0;
    for (int i = 0; i < 10000; i++) {
        BASE_PUSH(xs, n, cap, i * 3 + 1);
        assert_true(cap >= n);
    }
    assert_int_equal(n, 10000);
    for (int i = 0; i < n; i++) assert_int_equal(xs[i], i * 3 + 1);
    int before = cap;
    base_reserve((void **)&xs, sizeof *xs, n, &cap, 5 * cap);   // room for many at once
    assert_true(cap >= n + 5 * before);
    for (int i = 0; i < n; i++) assert_int_equal(xs[i], i * 3 + 1);
    int keep = cap;
    base_reserve((void **)&xs, sizeof *xs, n, &cap, 1);   // room already: unchanged
    assert_int_equal(cap, keep);
    free(xs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clock),
        cmocka_unit_test(test_oom),
        cmocka_unit_test(test_growable_array),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
