/* Tensor parallelism (distgraph/tensor_parallel.h): a transformer block (attention split by
 * heads, the MLP by hidden units) over 2 and 4 virtual CPUs gives the loss and the gradients of
 * every shard that the same block computes unsplit on one device from the shards put together
 * (same graph, same variables), within 1e-5; the LocalAllReduce's gradient is the reduction of
 * the output gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define ROWS 16   // 2 sequences of T
#define T 8
#define C 16
#define HEADS 4
#define HIDDEN 32

static dg_output part(dg_graph *g, const char *layer, const char *what, int r) {
    char name[128];
    snprintf(name, sizeof name, "%s/%s/part_%d", layer, what, r);
    dg_node *n = dg_graph_find(g, name);
    assert_non_null(n);
    return (dg_output){n, 0};
}

static dg_output whole(dg_graph *g, const char *layer, const char *what) {
    char name[128];
    snprintf(name, sizeof name, "%s/%s", layer, what);
    dg_node *n = dg_graph_find(g, name);
    assert_non_null(n);
    return (dg_output){n, 0};
}

// The parts of a column-parallel layer put together: [in, out] and [out]; with qkv, each
// part's q, k and v columns go to the q, k and v blocks.
static void column_whole(dg_graph *g, const char *layer, int n, bool qkv, dg_output *w, dg_output *b) {
    dg_output ws[3][8], bs[3][8];
    int blocks = qkv ? 3 : 1;
    for (int r = 0; r < n; r++) {
        dg_output wr = part(g, layer, "kernel", r), br = part(g, layer, "bias", r);
        if (qkv) {
            dg_output a[3], c[3];
            dg_split(g, NULL, wr, 1, 3, a);
            dg_split(g, NULL, br, 0, 3, c);
            for (int i = 0; i < 3; i++) {
                ws[i][r] = a[i];
                bs[i][r] = c[i];
            }
        } else {
            ws[0][r] = wr;
            bs[0][r] = br;
        }
    }
    dg_output wcat[3], bcat[3];
    for (int i = 0; i < blocks; i++) {
        wcat[i] = dg_concat(g, NULL, ws[i], n, 1);
        bcat[i] = dg_concat(g, NULL, bs[i], n, 0);
    }
    *w = blocks == 1 ? wcat[0] : dg_concat(g, NULL, wcat, 3, 1);
    *b = blocks == 1 ? bcat[0] : dg_concat(g, NULL, bcat, 3, 0);
}

static dg_output row_whole(dg_graph *g, const char *layer, int n) {
    dg_output ws[8];
    for (int r = 0; r < n; r++) ws[r] = part(g, layer, "kernel", r);
    return dg_concat(g, NULL, ws, n, 0);
}

// The unsplit block on the device scope in force.
static dg_output reference(dg_graph *g, dg_output x, int n) {
    const int64_t split[4] = {-1, T, HEADS, C / HEADS}, perm[4] = {0, 2, 1, 3}, rows[2] = {-1, C};
    dg_output w, b;
    column_whole(g, "blk/attn", n, true, &w, &b);
    dg_output qkv = dg_bias_add(g, NULL, dg_matmul(g, NULL, x, w, false, false), b), p[3], h[3];
    dg_split(g, NULL, qkv, 1, 3, p);
    for (int i = 0; i < 3; i++) h[i] = dg_transpose(g, NULL, dg_reshape(g, NULL, p[i], split, 4), perm, 4);
    dg_output a = dg_reshape(g, NULL, dg_transpose(g, NULL, dg_attention(g, NULL, h[0], h[1], h[2], true, 0), perm, 4),
                             rows, 2);
    a = dg_bias_add(g, NULL, dg_matmul(g, NULL, a, row_whole(g, "blk/attn_proj", n), false, false),
                    whole(g, "blk/attn_proj", "bias"));
    dg_output x1 = dg_add(g, NULL, x, a);
    column_whole(g, "blk/mlp/fc", n, false, &w, &b);
    dg_output f = dg_gelu(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, x1, w, false, false), b), false);
    f = dg_bias_add(g, NULL, dg_matmul(g, NULL, f, row_whole(g, "blk/mlp/mlp_proj", n), false, false),
                    whole(g, "blk/mlp/mlp_proj", "bias"));
    return dg_add(g, NULL, x1, f);
}

static void check_block(int n) {
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    char names[8][48];
    const char *devs[8];
    for (int r = 0; r < n; r++) {
        snprintf(names[r], sizeof names[r], "/job:localhost/replica:0/task:0/device:CPU:%d", r);
        devs[r] = names[r];
    }
    dg_tp_group grp = {devs, n};
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(ROWS, C));
    dg_output xs[8], a[8], x1[8], m[8], out[8];
    for (int r = 0; r < n; r++) xs[r] = x;
    dg_initializer init = dg_init_random_normal(0, 0.3, 5), proj = dg_init_random_normal(0, 0.2, 6);
    assert_true(dg_tp_attention(g, "blk", &grp, xs, T, C, HEADS, true, init, proj, a));
    dg_graph_push_device(g, devs[0]);
    for (int r = 0; r < n; r++) x1[r] = dg_add(g, NULL, xs[r], a[r]);
    dg_graph_pop_device(g);
    assert_true(dg_tp_mlp(g, "blk/mlp", &grp, x1, C, HIDDEN, init, proj, m));
    for (int r = 0; r < n; r++) out[r] = dg_add(g, NULL, x1[r], m[r]);
    // The loss reads rank 0's copy only: every shard's gradient still comes through the
    // all-reduces' gradients.
    dg_output loss = dg_mean(g, "loss", dg_square(g, NULL, out[0]), NULL, 0, false);
    dg_output ref = dg_mean(g, "ref_loss", dg_square(g, NULL, reference(g, x, n)), NULL, 0, false);
    // Every variable: the shards of the four layers and the two whole biases.
    dg_output vars[64];
    int nv = 0;
    const char *layers[4] = {"blk/attn", "blk/attn_proj", "blk/mlp/fc", "blk/mlp/mlp_proj"};
    for (int l = 0; l < 4; l++) {
        for (int r = 0; r < n; r++) vars[nv++] = part(g, layers[l], "kernel", r);
        if (l == 0 || l == 2)
            for (int r = 0; r < n; r++) vars[nv++] = part(g, layers[l], "bias", r);
        else
            vars[nv++] = whole(g, layers[l], "bias");
    }
    dg_output dv[64], dref[64];
    assert_true(dg_gradients(g, &loss, 1, vars, nv, NULL, dv));
    assert_true(dg_gradients(g, &ref, 1, vars, nv, NULL, dref));
    dg_node *initop = dg_global_variables_initializer(g);
    assert_true(dg_graph_ok(g));
    dg_session *s = dg_test_local_session(g, n, 0, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &initop, 1, st));
    assert_ok(st);
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(ROWS, C), st);
    float *xp = dg_tensor_data(xv);
    for (int i = 0; i < ROWS * C; i++) xp[i] = (float)sin(0.37 * i + 0.1);
    int nf = 2 + 2 * nv;
    dg_output *fetch = malloc((size_t)nf * sizeof *fetch);
    dg_tensor **got = calloc((size_t)nf, sizeof *got);
    fetch[0] = loss;
    fetch[1] = ref;
    for (int i = 0; i < nv; i++) {
        assert_non_null(dv[i].node);
        fetch[2 + 2 * i] = dv[i];
        fetch[3 + 2 * i] = dref[i];
    }
    assert_true(dg_session_run(s, &x, &xv, 1, fetch, got, nf, NULL, 0, st));
    assert_ok(st);
    double l = *(float *)dg_tensor_data(got[0]), lr = *(float *)dg_tensor_data(got[1]);
    assert_true(isfinite(lr) && lr > 0.1);
    assert_true(dg_test_is_close(l, lr, 0, 1e-5));
    for (int i = 0; i < nv; i++) {
        int64_t k = (int64_t)dg_tensor_num_elements(got[3 + 2 * i]);
        assert_int_equal(dg_tensor_num_elements(got[2 + 2 * i]), k);
        double *want = malloc((size_t)k * sizeof *want);
        for (int64_t j = 0; j < k; j++) want[j] = ((const float *)dg_tensor_data(got[3 + 2 * i]))[j];
        double scale = dg_test_max_abs_f64(want, k);
        assert_true(scale > 1e-7);
        int64_t far = dg_test_first_far_f32(dg_tensor_data(got[2 + 2 * i]), want, k, 1e-5 * scale, 1e-5);
        if (far >= 0) {
            fprintf(stderr, "%d ways: d %s [%lld] = %g, unsplit %g\n", n, dg_node_name(vars[i].node), (long long)far,
                    ((const float *)dg_tensor_data(got[2 + 2 * i]))[far], want[far]);
            fail();
        }
        free(want);
    }
    for (int i = 0; i < nf; i++) dg_tensor_free(&got[i]);
    free(got);
    free(fetch);
    dg_tensor_free(&xv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_block_two_ways_equals_unsplit(void **state) {
    (void)state;
    check_block(2);
}

static void test_block_four_ways_equals_unsplit(void **state) {
    (void)state;
    check_block(4);
}

static void test_one_way_is_the_plain_block(void **state) {
    (void)state;
    check_block(1);
}

// A step that fetches one device's output of a row-parallel layer runs the whole
// LocalAllReduce group (each member waits for the others): it finishes, with the sum.
static void test_one_copy_fetched_runs_the_group(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    const char *devs[2] = {"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"};
    dg_tp_group grp = {devs, 2};
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(2, 4)), xs[2], ys[2];
    dg_split(g, NULL, x, 1, 2, xs);
    assert_true(dg_tp_row_linear(g, "row", &grp, xs, 4, 3, dg_init_ones(), ys));
    dg_node *init = dg_global_variables_initializer(g);
    dg_session *s = dg_test_local_session(g, 2, 0, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(2, 4), st), *got = NULL;
    float *xp = dg_tensor_data(xv);
    for (int i = 0; i < 8; i++) xp[i] = (float)(i + 1);
    assert_true(dg_session_run(s, &x, &xv, 1, &ys[1], &got, 1, NULL, 0, st));
    assert_ok(st);
    const float *y = dg_tensor_data(got);
    // Ones for the weights, zero bias: each output is its row's sum.
    for (int j = 0; j < 3; j++) {
        assert_true(dg_test_is_close(y[j], 10, 0, 1e-6));
        assert_true(dg_test_is_close(y[3 + j], 26, 0, 1e-6));
    }
    dg_tensor_free(&got);
    dg_tensor_free(&xv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// How a row-parallel layer's partial products are summed: within one task by one
// LocalAllReduce per device; across tasks by an AddN on the first device that each device reads
// (an Identity on it), no LocalAllReduce. (The sums over tasks are run for real, against those
// over two CPUs of one process, by tests/integration/pipeline_training.sh.)
static int count_ops(dg_graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) n += strcmp(dg_node_op_type(dg_graph_node(g, i)), op) == 0;
    return n;
}

static void test_sums_within_and_across_tasks(void **state) {
    (void)state;
    const char *one_task[2] = {"/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:1"};
    const char *two_tasks[2] = {"/job:worker/task:0/device:CPU:0", "/job:ps/task:0/device:CPU:0"};
    const char *const *groups[2] = {one_task, two_tasks};
    for (int k = 0; k < 2; k++) {
        dg_graph *g = dg_graph_new();
        dg_tp_group grp = {groups[k], 2};
        dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(2, 4)), xs[2], ys[2];
        dg_split(g, NULL, x, 1, 2, xs);
        assert_true(dg_tp_row_linear(g, "row", &grp, xs, 4, 3, dg_init_ones(), ys));
        if (k == 0) {
            assert_int_equal(count_ops(g, "LocalAllReduce"), 2);
            assert_int_equal(count_ops(g, "AddN"), 0);
        } else {
            assert_int_equal(count_ops(g, "LocalAllReduce"), 0);
            dg_node *sum = dg_graph_find(g, "row/all_reduce/sum");
            assert_non_null(sum);
            assert_string_equal(dg_node_requested_device(sum), two_tasks[0]);
            for (int r = 0; r < 2; r++) {
                char name[64];
                snprintf(name, sizeof name, "row/all_reduce/copy_%d", r);
                dg_node *c = dg_graph_find(g, name);
                assert_non_null(c);
                assert_string_equal(dg_node_requested_device(c), two_tasks[r]);
                assert_ptr_equal(dg_node_input(c, 0).node, sum);
            }
        }
        dg_graph_free(&g);
    }
}

static void test_bad_splits_are_named(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    const char *devs[3] = {"/device:CPU:0", "/device:CPU:1", "/device:CPU:2"};
    dg_tp_group grp = {devs, 3};
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, C)), xs[3] = {x, x, x}, ys[3];
    assert_false(dg_tp_mlp(g, "m", &grp, xs, C, HIDDEN, dg_init_zeros(), dg_init_zeros(), ys));
    assert_false(dg_graph_check(g, st));
    assert_status(st, DG_INVALID_ARGUMENT, "out 32 does not divide into 3 parts");
    dg_graph_free(&g);
    g = dg_graph_new();
    x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, C));
    dg_output two[2] = {x, x};
    dg_tp_group g2 = {devs, 2};
    assert_false(dg_tp_attention(g, "a", &g2, two, T, C, 3, true, dg_init_zeros(), dg_init_zeros(), ys));
    assert_false(dg_graph_check(g, st));
    assert_status(st, DG_INVALID_ARGUMENT, "n_head 3 does not divide into 2 parts");
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_way_is_the_plain_block),
        cmocka_unit_test(test_block_two_ways_equals_unsplit),
        cmocka_unit_test(test_block_four_ways_equals_unsplit),
        cmocka_unit_test(test_one_copy_fetched_runs_the_group),
        cmocka_unit_test(test_sums_within_and_across_tasks),
        cmocka_unit_test(test_bad_splits_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
