/* The suite's own numeric comparison (testutil.h): NaN and infinities where the reference is
 * finite never compare close, tolerances are absolute plus relative to the reference, and the
 * first element out of tolerance is the one reported. */
#include <math.h>
#include <stdint.h>

#include "testutil.h"

static void test_is_close_scalars(void **state) {
    (void)state;
    assert_true(dg_test_is_close(1.0, 1.0, 0, 0));
    assert_true(dg_test_is_close(1.0 + 1e-9, 1.0, 1e-8, 0));
    assert_false(dg_test_is_close(1.0 + 1e-7, 1.0, 1e-8, 0));
    assert_true(dg_test_is_close(100.5, 100.0, 0, 0.01));   // 0.5 <= 0.01 * 100
    assert_false(dg_test_is_close(102.0, 100.0, 0, 0.01));
    assert_true(dg_test_is_close(-3.0, -3.0 + 1e-6, 2e-6, 0));
    // NaN never matches: not in got, not in want, not with itself, not under a NaN tolerance.
    assert_false(dg_test_is_close(NAN, 1.0, 1e300, 1e300));
    assert_false(dg_test_is_close(1.0, NAN, 1e300, 1e300));
    assert_false(dg_test_is_close(NAN, NAN, 1e300, 1e300));
    assert_false(dg_test_is_close(1.0, 1.0, NAN, 0));
    assert_false(dg_test_is_close(1.0, 1.0, 0, NAN));
    // An infinity matches only the same infinity.
    assert_false(dg_test_is_close(INFINITY, 1.0, 1e300, 1e300));
    assert_false(dg_test_is_close(-INFINITY, 1.0, 1e300, 1e300));
    assert_false(dg_test_is_close(1e308, INFINITY, 1e300, 1e300));
    assert_false(dg_test_is_close(-INFINITY, INFINITY, 0, 0));
    assert_true(dg_test_is_close(INFINITY, INFINITY, 0, 0));
    assert_true(dg_test_is_close(-INFINITY, -INFINITY, 0, 0));
    // A tolerance too large to add up (infinite) still refuses NaN and infinities.
    assert_true(dg_test_is_close(1e308, -1e308, INFINITY, 0));
    assert_false(dg_test_is_close(INFINITY, -1e308, INFINITY, 0));
}

static void test_first_far(void **state) {
    (void)state;
    const double want[5] = {1, -2, 3, 0, 1e6};
    double got[5] = {1, -2, 3, 0, 1e6};
    assert_int_equal(dg_test_first_far_f64(got, want, 5, 0, 0), -1);
    got[3] = 1e-9;
    assert_int_equal(dg_test_first_far_f64(got, want, 5, 0, 0), 3);
    assert_int_equal(dg_test_first_far_f64(got, want, 5, 1e-8, 0), -1);
    got[1] = NAN;
    assert_int_equal(dg_test_first_far_f64(got, want, 5, 1e-8, 0), 1);
    got[1] = -2;
    got[4] = 1e6 + 1;   // relative 1e-6
    assert_int_equal(dg_test_first_far_f64(got, want, 5, 1e-8, 1e-7), 4);
    assert_int_equal(dg_test_first_far_f64(got, want, 5, 1e-8, 1e-6), -1);
    float f[5] = {1, -2, 3, 0, 1e6f};
    assert_int_equal(dg_test_first_far_f32(f, want, 5, 0, 0), -1);
    f[2] = INFINITY;
    assert_int_equal(dg_test_first_far_f32(f, want, 5, 1e30, 1e30), 2);
    f[2] = NAN;
    assert_int_equal(dg_test_first_far_f32(f, want, 5, 1e30, 1e30), 2);
    assert_int_equal(dg_test_first_far_f64(got, want, 0, 0, 0), -1);
}

static void test_max_abs(void **state) {
    (void)state;
    const double a[4] = {0.5, -7, 3, 2};
    assert_true(dg_test_max_abs_f64(a, 4) == 7);
    assert_true(dg_test_max_abs_f64(a, 0) == 0);
    const double b[3] = {1, NAN, 2};
    assert_true(isnan(dg_test_max_abs_f64(b, 3)));
    const double c[3] = {1, -INFINITY, 2};
    assert_true(isnan(dg_test_max_abs_f64(c, 3)));
    const float d[3] = {1, -9, NAN};
    assert_true(isnan(dg_test_max_abs_f32(d, 3)));
    assert_true(dg_test_max_abs_f32(d, 2) == 9);
}

static void test_assert_close_passes(void **state) {
    (void)state;
    const double want[3] = {1, 2, 3};
    const double got[3] = {1, 2, 3 + 1e-12};
    assert_close_f64(got, want, 3, 1e-11, 0);
    const float gf[3] = {1, 2, 3};
    assert_close_f32(gf, want, 3, 0, 0);
    assert_close(0.1 + 0.2, 0.3, 1e-15, 0);
    assert_close_f64_msg(got, want, 3, 0, 1e-12, "case %d", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_is_close_scalars),
        cmocka_unit_test(test_first_far),
        cmocka_unit_test(test_max_abs),
        cmocka_unit_test(test_assert_close_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
