/* MatMul in bfloat16 and float16 (executor/cpu/gemm16.c) against float64 products of the same
 * 16-bit inputs, for every transpose and shapes around the kernels' blocks. The tolerance is
 * the formats' own: the float32 sums may be off by (K + 2) * 2^-24 of the sum of |a b|, and
 * the result is then rounded once to the format, half its ulp: 2^-8 of the value for bfloat16
 * (7 fraction bits), 2^-11 for float16 (10). CTest runs it again under DG_MAX_CPU_ISA=avx2,
 * where bfloat16 takes the path through float32 instead of oneDNN's bfloat16 kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec_cpu_impl.h"
#include "testutil.h"

#include "cpu/cpu_impl.h"

static uint16_t to16(dg_dtype t, float v) { return t == DG_BFLOAT16 ? dg_float_to_bfloat16(v) : dg_float_to_float16(v); }
static double from16(dg_dtype t, uint16_t b) {
    return t == DG_BFLOAT16 ? dg_bfloat16_to_float(b) : dg_float16_to_float(b);
}

static void check_matmul(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, uint64_t *seed) {
    dg_status *st = dg_status_new();
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    uint16_t *a = malloc((size_t)(ar * ac + 1) * 2), *b = malloc((size_t)(br * bc + 1) * 2);
    for (int64_t i = 0; i < ar * ac; i++) a[i] = to16(t, (float)dg_test_uniform(seed, -2, 2));
    for (int64_t i = 0; i < br * bc; i++) b[i] = to16(t, (float)dg_test_uniform(seed, -2, 2));
    dg_graph *g = dg_graph_new();
    dg_output pa = dg_placeholder(g, "a", t, dg_shape2(ar, ac)), pb = dg_placeholder(g, "b", t, dg_shape2(br, bc));
    dg_output m = dg_matmul(g, "m", pa, pb, ta, tb);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    dg_tensor *va = dg_tensor_from_data(t, dg_shape2(ar, ac), a, st), *vb = dg_tensor_from_data(t, dg_shape2(br, bc), b, st);
    dg_output feeds[] = {pa, pb};
    dg_tensor *vals[] = {va, vb}, *out = NULL;
    assert_true(dg_session_run(s, feeds, vals, 2, &m, &out, 1, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_dtype(out), t);
    assert_int_equal(dg_tensor_dim(out, 0), M);
    assert_int_equal(dg_tensor_dim(out, 1), N);
    const uint16_t *c = dg_tensor_data(out);
    double half_ulp = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = from16(t, a[ta ? k * ac + i : i * ac + k]), y = from16(t, b[tb ? j * bc + k : k * bc + j]);
                ref += x * y;
                mag += fabs(x * y);
            }
            double got = from16(t, c[i * N + j]), tol = half_ulp * fabs(ref) + (double)(K + 2) * 0x1p-24 * mag * (1 + half_ulp);
            if (!(fabs(got - ref) <= tol))
                fail_msg("%s %s%s %lldx%lldx%lld: C[%lld,%lld] = %.9g, want %.9g (tolerance %.3g)", dg_dtype_name(t),
                         ta ? "A^T" : "A", tb ? "B^T" : "B", (long long)M, (long long)N, (long long)K, (long long)i,
                         (long long)j, got, ref, tol);
        }
    dg_tensor_unref(out);
    dg_tensor_unref(va);
    dg_tensor_unref(vb);
    free(a);
    free(b);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_matmul16(void **state) {
    (void)state;
    // The last two are past 2^21 multiply-adds: split over the intra-op threads (three here, so
    // the bands are uneven), by rows and, with few rows, by columns.
    exec_cpu_set_threads(3);
    const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {17, 33, 65},  {64, 64, 64},
                                 {100, 10, 100}, {31, 129, 300}, {200, 96, 160}, {20, 600, 200}};
    uint64_t seed = 17;
    for (dg_dtype t = DG_BFLOAT16;; t = DG_FLOAT16) {
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int tr = 0; tr < 4; tr++)
                check_matmul(t, tr & 1, tr & 2, shapes[s][0], shapes[s][1], shapes[s][2], &seed);
        if (t == DG_FLOAT16) break;
    }
    exec_cpu_set_threads(0);   // the default again
}

// K = 0: zeros; the gradient of a bfloat16 MatMul is bfloat16 MatMuls.
static void test_matmul16_edges(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    uint16_t c[6] = {1, 2, 3, 4, 5, 6};
    assert_true(cpu_gemm16(DG_BFLOAT16, false, false, 2, 3, 0, NULL, 0, NULL, 3, c, 3));
    for (int i = 0; i < 6; i++) assert_int_equal(c[i], 0);
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_BFLOAT16, dg_shape2(2, 3));
    dg_output w = dg_placeholder(g, "w", DG_BFLOAT16, dg_shape2(3, 2));
    dg_output y = dg_matmul(g, "y", x, w, false, false);
    uint16_t ones[4];
    for (int i = 0; i < 4; i++) ones[i] = dg_float_to_bfloat16(1.0f);
    dg_tensor *ot = dg_tensor_from_data(DG_BFLOAT16, dg_shape2(2, 2), ones, st);
    dg_output seed = dg_const(g, "seed", ot), gw;
    assert_true(dg_gradients(g, &y, 1, &w, 1, &seed, &gw));
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(gw), DG_BFLOAT16);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    uint16_t xv[6], wv[6];
    for (int i = 0; i < 6; i++) {
        xv[i] = dg_float_to_bfloat16((float)(i + 1) * 0.5f);
        wv[i] = dg_float_to_bfloat16(1.0f);
    }
    dg_tensor *xt = dg_tensor_from_data(DG_BFLOAT16, dg_shape2(2, 3), xv, st), *gv = NULL;
    dg_tensor *wt = dg_tensor_from_data(DG_BFLOAT16, dg_shape2(3, 2), wv, st);
    dg_output feeds[] = {x, w};
    dg_tensor *vals[] = {xt, wt};
    assert_true(dg_session_run(s, feeds, vals, 2, &gw, &gv, 1, NULL, 0, st));
    assert_ok(st);
    // d(sum y)/dw[k][j] = sum over rows of x[i][k]: 0.5 + 2 = 2.5, 1 + 2.5 = 3.5, 1.5 + 3 = 4.5.
    const uint16_t *gd = dg_tensor_data(gv);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 2; j++) assert_true(dg_bfloat16_to_float(gd[k * 2 + j]) == 2.5f + (float)k);
    dg_tensor_unref(wt);
    dg_tensor_unref(ot);
    dg_tensor_unref(xt);
    dg_tensor_unref(gv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul16),
        cmocka_unit_test(test_matmul16_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
