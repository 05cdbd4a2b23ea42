/* Work split over the intra-op threads (cpu_parallel_for, executor/cpu/gemm.c's pool): every
 * piece runs once; and the kernels that split (Gelu, GeluGrad, the attention and its gradient)
 * give the same bits on three threads as on one, each element's arithmetic not depending on the
 * split, on tensors large enough to be split. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "exec_cpu_impl.h"
#include "testutil.h"

#include "cpu/cpu_impl.h"

static atomic_int hits[8];
static atomic_int pieces_seen;

static void count_piece(void *ctx, int i, int n) {
    (void)ctx;
    atomic_fetch_add(&hits[i], 1);
    atomic_store(&pieces_seen, n);
}

static void test_each_piece_once(void **state) {
    (void)state;
    exec_cpu_set_threads(3);
    assert_false(cpu_parallel_for(1, count_piece, NULL));   // one piece: the caller's to run
    for (int i = 0; i < 8; i++) atomic_store(&hits[i], 0);
    assert_true(cpu_parallel_for(3, count_piece, NULL));
    int n = atomic_load(&pieces_seen);
    assert_true(n >= 2 && n <= 3);
    for (int i = 0; i < 8; i++) assert_int_equal(atomic_load(&hits[i]), i < n ? 1 : 0);
    exec_cpu_set_threads(0);
}

// Gelu, its gradient, the attention and its gradients of fixed inputs on `threads` threads.
static void run_kernels(int threads, dg_tensor **out) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    enum { R = 300, C = 400, B = 6, T = 48, D = 16 };
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(R, C));
    dg_output y = dg_gelu(g, "y", x, false), gx;
    assert_true(dg_gradients(g, &y, 1, &x, 1, NULL, &gx));
    int64_t qd[3] = {B, T, D};
    dg_output q = dg_placeholder(g, "q", DG_FLOAT32, dg_shape_make(3, qd));
    dg_output a = dg_attention(g, "a", q, q, q, true, 0), gq;
    assert_true(dg_gradients(g, &a, 1, &q, 1, NULL, &gq));
    assert_ok(dg_graph_status(g));
    float *xv = malloc(R * C * sizeof *xv), *qv = malloc(B * T * D * sizeof *qv);
    uint64_t seed = 3;
    for (int i = 0; i < R * C; i++) xv[i] = (float)dg_test_uniform(&seed, -4, 4);
    for (int i = 0; i < B * T * D; i++) qv[i] = (float)dg_test_uniform(&seed, -1, 1);
    dg_tensor *vals[2] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(R, C), xv, st),
                          dg_tensor_from_data(DG_FLOAT32, dg_shape_make(3, qd), qv, st)};
    dg_output feeds[2] = {x, q}, fetches[4] = {y, gx, a, gq};
    dg_session_options o = dg_session_options_default();
    o.intra_op_threads = threads;   // the session sets the pool's count
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_true(dg_session_run(s, feeds, vals, 2, fetches, out, 4, NULL, 0, st));
    assert_int_equal(exec_cpu_threads(), threads);
    assert_ok(st);
    dg_tensor_unref(vals[0]);
    dg_tensor_unref(vals[1]);
    free(xv);
    free(qv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
    exec_cpu_set_threads(0);
}

static void test_split_kernels_same_bits(void **state) {
    (void)state;
    dg_tensor *one[4] = {0}, *three[4] = {0};
    run_kernels(1, one);
    run_kernels(3, three);
    const char *what[4] = {"Gelu", "GeluGrad", "attention", "attention gradient"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dg_tensor_nbytes(one[i]), dg_tensor_nbytes(three[i]));
        if (memcmp(dg_tensor_data(one[i]), dg_tensor_data(three[i]), dg_tensor_nbytes(one[i])) != 0)
            fail_msg("%s: three threads give other bits than one", what[i]);
        dg_tensor_unref(one[i]);
        dg_tensor_unref(three[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_piece_once),
        cmocka_unit_test(test_split_kernels_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
