/* Work split over the intra-op threads (cpu_parallel_for, executor/cpu/gemm.c's pool): every
 * piece runs once; and the kernels that split (Gelu, GeluGrad, the attention and its gradient,
 * LayerNorm and its gradient) give the same bits on three threads as on one, each element's
 * arithmetic not depending on the split, on tensors large enough to be split; LayerNorm's
 * gradient, whose sums over rows run in chunks, also against float64 sums. */
#include <math.h>
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

enum { R = 300, C = 400, B = 6, T = 48, D = 16, N_OUT = 8 };

// Gelu, its gradient, the attention and its gradient, LayerNorm of x and its gradients (x,
// gamma, beta; dy all ones) of fixed inputs on `threads` threads; *xv_out: x's values.
static void run_kernels(int threads, dg_tensor **out, float **xv_out) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(R, C));
    dg_output y = dg_gelu(g, "y", x, false), gx;
    assert_true(dg_gradients(g, &y, 1, &x, 1, NULL, &gx));
    int64_t qd[3] = {B, T, D};
    dg_output q = dg_placeholder(g, "q", DG_FLOAT32, dg_shape_make(3, qd));
    dg_output a = dg_attention(g, "a", q, q, q, true, 0), gq;
    assert_true(dg_gradients(g, &a, 1, &q, 1, NULL, &gq));
    dg_output gamma = dg_ones(g, "gamma", DG_FLOAT32, dg_shape1(C)), beta = dg_ones(g, "beta", DG_FLOAT32, dg_shape1(C));
    dg_output ln = dg_layer_norm(g, "ln", x, gamma, beta, 1e-5), lg[3];
    dg_output ln_wrt[3] = {x, gamma, beta};
    assert_true(dg_gradients(g, &ln, 1, ln_wrt, 3, NULL, lg));
    assert_ok(dg_graph_status(g));
    float *xv = malloc(R * C * sizeof *xv), *qv = malloc(B * T * D * sizeof *qv);
    uint64_t seed = 3;
    for (int i = 0; i < R * C; i++) xv[i] = (float)dg_test_uniform(&seed, -4, 4);
    for (int i = 0; i < B * T * D; i++) qv[i] = (float)dg_test_uniform(&seed, -1, 1);
    dg_tensor *vals[2] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(R, C), xv, st),
                          dg_tensor_from_data(DG_FLOAT32, dg_shape_make(3, qd), qv, st)};
    dg_output feeds[2] = {x, q}, fetches[N_OUT] = {y, gx, a, gq, ln, lg[0], lg[1], lg[2]};
    dg_session_options o = dg_session_options_default();
    o.intra_op_threads = threads;   // the session sets the pool's count
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_true(dg_session_run(s, feeds, vals, 2, fetches, out, N_OUT, NULL, 0, st));
    assert_int_equal(exec_cpu_threads(), threads);
    assert_ok(st);
    dg_tensor_unref(vals[0]);
    dg_tensor_unref(vals[1]);
    *xv_out = xv;
    free(qv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
    exec_cpu_set_threads(0);
}

static void test_split_kernels_same_bits(void **state) {
    (void)state;
    dg_tensor *one[N_OUT] = {0}, *three[N_OUT] = {0};
    float *xv = NULL, *xv3 = NULL;
    run_kernels(1, one, &xv);
    run_kernels(3, three, &xv3);
    free(xv3);
    // LayerNormGrad sums dgamma and dbeta over rows in chunks (ln_bwd_chunks): against float64
    // sums of the same terms with dy = 1 (dbeta: R exactly; dgamma: the normalised x summed),
    // to float32's rounding of the sum and the float32 inputs' error of each term (rtol 1e-5).
    double *dgamma = calloc(C, sizeof *dgamma), *dbeta = calloc(C, sizeof *dbeta);
    for (int r = 0; r < R; r++) {
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++) mu += xv[r * C + c];
        mu /= C;
        for (int c = 0; c < C; c++) var += (xv[r * C + c] - mu) * (xv[r * C + c] - mu);
        double rs = 1 / sqrt(var / C + 1e-5);
        for (int c = 0; c < C; c++) {
            dgamma[c] += (xv[r * C + c] - mu) * rs;
            dbeta[c] += 1;
        }
    }
    double scale = sqrt((double)R);   // dgamma's terms are O(1), their sum O(sqrt(R)) or less
    assert_close_f32(dg_tensor_f32(one[6]), dgamma, C, 1e-5 * scale, 1e-5);
    assert_close_f32(dg_tensor_f32(one[7]), dbeta, C, 0, 1e-6);
    free(dgamma);
    free(dbeta);
    free(xv);
    const char *what[N_OUT] = {"Gelu", "GeluGrad", "attention", "attention gradient", "LayerNorm",
                               "LayerNormGrad dx", "LayerNormGrad dgamma", "LayerNormGrad dbeta"};
    for (int i = 0; i < N_OUT; i++) {
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
