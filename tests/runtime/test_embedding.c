/* Embeddings and sparse updates (graph/op_defs_sparse.c, executor/cpu/kernels_sparse.c):
 * Gather's values and its sparse gradient against central differences in float64 (one and
 * two lookups of a table, repeated ids); sharded lookups ("mod" and "div") against a gather
 * from the whole table, with their gradients; the sparse optimizer updates (gradient descent,
 * Adagrad, Adam) against TensorFlow's formulas computed here by hand; scatter ops; and bad
 * input (ids out of range, mismatched updates) failing with a status that names the node and
 * the id while the variable keeps its value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { ROWS = 10, DIM = 3 };

static dg_tensor *f64_tensor(dg_shape s, const double *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, s, v, st);
    assert_non_null(t);
    dg_status_free(&st);
    return t;
}

static dg_tensor *i64_tensor(int64_t n, const int64_t *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_INT64, dg_shape1(n), v, st);
    assert_non_null(t);
    dg_status_free(&st);
    return t;
}

static void table_values(double *t, int rows, uint64_t seed) {
    for (int i = 0; i < rows * DIM; i++) t[i] = dg_test_uniform(&seed, -1, 1);
}

// Runs fetches with the feeds; returns the new fetched tensors in out.
static bool run(dg_session *s, const dg_output *feeds, dg_tensor *const *vals, int nf, const dg_output *fetches,
                dg_tensor **out, int n, dg_status *st) {
    return dg_session_run(s, feeds, vals, nf, fetches, out, n, NULL, 0, st);
}

// loss = sum over lookups of sum(w * rows^3) with w fixed weights: a gradient that differs
// per element and per lookup.
static dg_output cubic_loss(dg_graph *g, dg_output rows, int n_ids, uint64_t seed) {
    double *w = malloc((size_t)n_ids * DIM * sizeof *w);
    for (int i = 0; i < n_ids * DIM; i++) w[i] = dg_test_uniform(&seed, 0.5, 1.5);
    dg_tensor *wt = f64_tensor(dg_shape2(n_ids, DIM), w);
    dg_output c = dg_const(g, NULL, wt);
    dg_tensor_unref(wt);
    free(w);
    dg_output cube = dg_mul(g, NULL, rows, dg_mul(g, NULL, rows, rows));
    return dg_sum(g, NULL, dg_mul(g, NULL, c, cube), NULL, 0, false);
}

// The loss's value with table fed as the placeholder's value.
static double loss_at(dg_session *s, dg_output table, dg_output loss, const double *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = f64_tensor(dg_shape2(ROWS, DIM), v), *out = NULL;
    if (!run(s, &table, &t, 1, &loss, &out, 1, st)) fail_msg("%s", dg_status_message(st));
    double r = dg_tensor_get_as_double(out, 0);
    dg_tensor_unref(t);
    dg_tensor_unref(out);
    dg_status_free(&st);
    return r;
}

// The gradient of loss with respect to table (a placeholder) is sparse, and its dense value
// equals central differences.
static void check_table_gradient(dg_graph *g, dg_output table, dg_output loss, int want_rows) {
    dg_output grad;
    assert_true(dg_gradients(g, &loss, 1, &table, 1, NULL, &grad));
    dg_output values, indices;
    assert_true(dg_gradient_is_sparse(grad, &values, &indices));
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    double v[ROWS * DIM];
    table_values(v, ROWS, 3);
    dg_tensor *t = f64_tensor(dg_shape2(ROWS, DIM), v);
    dg_output fetches[3] = {grad, values, indices};
    dg_tensor *out[3] = {NULL};
    if (!run(s, &table, &t, 1, fetches, out, 3, st)) fail_msg("%s", dg_status_message(st));
    assert_int_equal(dg_tensor_num_elements(out[2]), want_rows);   // one row per id looked up
    assert_int_equal(dg_tensor_num_elements(out[1]), want_rows * DIM);
    // The rows added at their indices give the dense gradient.
    double from_rows[ROWS * DIM] = {0};
    for (int i = 0; i < want_rows; i++)
        for (int k = 0; k < DIM; k++)
            from_rows[(int64_t)dg_tensor_get_as_double(out[2], i) * DIM + k] += dg_tensor_get_as_double(out[1], i * DIM + k);
    for (int i = 0; i < ROWS * DIM; i++) {
        double h = 1e-5, save = v[i];
        v[i] = save + h;
        double up = loss_at(s, table, loss, v);
        v[i] = save - h;
        double down = loss_at(s, table, loss, v);
        v[i] = save;
        double fd = (up - down) / (2 * h), got = dg_tensor_get_as_double(out[0], i);
        if (!dg_test_is_close(got, fd, 1e-6, 1e-6) || !dg_test_is_close(from_rows[i], fd, 1e-6, 1e-6))
            fail_msg("element %d: dense %.12g, from rows %.12g, central difference %.12g", i, got, from_rows[i], fd);
    }
    for (int i = 0; i < 3; i++) dg_tensor_unref(out[i]);
    dg_tensor_unref(t);
    dg_session_free(&s);
    dg_status_free(&st);
}

static void test_gather_gradient(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output table = dg_placeholder(g, "table", DG_FLOAT64, dg_shape2(ROWS, DIM));
    int64_t ids[5] = {7, 2, 7, 0, 9};   // 7 twice
    dg_tensor *it = i64_tensor(5, ids);
    dg_output rows = dg_gather(g, "lookup", table, dg_const(g, "ids", it));
    dg_tensor_unref(it);
    assert_true(dg_shape_equal((dg_shape[]){dg_output_shape(rows)}, (dg_shape[]){dg_shape2(5, DIM)}));
    check_table_gradient(g, table, cubic_loss(g, rows, 5, 11), 5);
    dg_graph_free(&g);
}

// Two lookups of one table: their sparse gradients add up into one sparse gradient.
static void test_two_lookups_stay_sparse(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output table = dg_placeholder(g, "table", DG_FLOAT64, dg_shape2(ROWS, DIM));
    int64_t a[3] = {1, 4, 1}, b[2] = {4, 8};
    dg_tensor *at = i64_tensor(3, a), *bt = i64_tensor(2, b);
    dg_output ra = dg_gather(g, NULL, table, dg_const(g, NULL, at));
    dg_output rb = dg_gather(g, NULL, table, dg_const(g, NULL, bt));
    dg_tensor_unref(at);
    dg_tensor_unref(bt);
    dg_output loss = dg_add(g, NULL, cubic_loss(g, ra, 3, 5), cubic_loss(g, rb, 2, 6));
    check_table_gradient(g, table, loss, 5);
    dg_graph_free(&g);
}

// Sharded lookups against a gather from the whole table; their gradient (through
// DynamicStitch and the per-shard gathers) against central differences on the whole table.
static void check_sharded(dg_partition_strategy strategy, const int64_t *part_rows, int n_parts) {
    dg_graph *g = dg_graph_new();
    dg_output table = dg_placeholder(g, "table", DG_FLOAT64, dg_shape2(ROWS, DIM));
    // The parts, cut from the fed table as the strategy lays ids out.
    dg_output parts[4];
    int64_t ids[7] = {9, 0, 3, 3, 5, 8, 1};
    int64_t off = 0;
    for (int k = 0; k < n_parts; k++) {
        int64_t rows_k[4];
        for (int64_t r = 0; r < part_rows[k]; r++) rows_k[r] = strategy == DG_PARTITION_MOD ? k + r * n_parts : off + r;
        dg_tensor *rt = i64_tensor(part_rows[k], rows_k);
        parts[k] = dg_gather(g, NULL, table, dg_const(g, NULL, rt));
        dg_tensor_unref(rt);
        off += part_rows[k];
    }
    dg_tensor *it = i64_tensor(7, ids);
    dg_output idc = dg_const(g, "ids", it);
    dg_tensor_unref(it);
    dg_output looked = dg_embedding_lookup_sharded(g, "lookup", parts, n_parts, idc, strategy);
    dg_output direct = dg_gather(g, NULL, table, idc);
    assert_true(dg_graph_ok(g));
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    double v[ROWS * DIM];
    table_values(v, ROWS, 9);
    dg_tensor *t = f64_tensor(dg_shape2(ROWS, DIM), v);
    dg_output fetches[2] = {looked, direct};
    dg_tensor *out[2] = {NULL};
    if (!run(s, &table, &t, 1, fetches, out, 2, st)) fail_msg("%s", dg_status_message(st));
    assert_int_equal(dg_tensor_num_elements(out[0]), 7 * DIM);
    for (int i = 0; i < 7 * DIM; i++)
        assert_true(dg_tensor_get_as_double(out[0], i) == dg_tensor_get_as_double(out[1], i));
    dg_tensor_unref(out[0]);
    dg_tensor_unref(out[1]);
    dg_tensor_unref(t);
    dg_session_free(&s);
    dg_status_free(&st);
    // The gradient with respect to the table: through the stitch, the shard gathers and the
    // gathers that cut the parts (dense there: the parts are not variables here).
    // Each part's gather of the table gives one row per row of the part: 10 in all.
    check_table_gradient(g, table, cubic_loss(g, looked, 7, 13), (int)off);
    dg_graph_free(&g);
}

static void test_sharded_lookup_mod(void **state) {
    (void)state;
    check_sharded(DG_PARTITION_MOD, (int64_t[]){4, 3, 3}, 3);
}

static void test_sharded_lookup_div(void **state) {
    (void)state;
    check_sharded(DG_PARTITION_DIV, (int64_t[]){4, 3, 3}, 3);
}

// ---- optimizers on a sparse gradient, against TensorFlow's formulas ----

enum { VR = 4, VD = 2 };

typedef struct opt_case {
    dg_graph *g;
    dg_output var;
    dg_node *init, *set, *train;
} opt_case;

// var [4, 2] starting at v0; loss = sum(c * gather(var, ids)) so the gradient's rows are c:
// ids {1, 3, 1}, rows c[0..2].
static const int64_t IDS[3] = {1, 3, 1};
static const double C[3][VD] = {{0.5, -1.0}, {2.0, 0.25}, {-0.75, 1.5}};
static const double V0[VR * VD] = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8};

static opt_case build_opt_ex(dg_optimizer_kind kind, bool nesterov) {
    opt_case o;
    o.g = dg_graph_new();
    dg_graph *g = o.g;
    o.var = dg_variable(g, "emb", DG_FLOAT64, dg_shape2(VR, VD), dg_init_zeros());
    dg_tensor *v0 = f64_tensor(dg_shape2(VR, VD), V0), *ct = f64_tensor(dg_shape2(3, VD), &C[0][0]);
    dg_tensor *it = i64_tensor(3, IDS);
    dg_output set = dg_assign(g, "set", o.var, dg_const(g, NULL, v0));
    dg_output loss = dg_sum(g, NULL, dg_mul(g, NULL, dg_const(g, NULL, ct), dg_gather(g, NULL, o.var, dg_const(g, NULL, it))),
                            NULL, 0, false);
    dg_tensor_unref(v0);
    dg_tensor_unref(ct);
    dg_tensor_unref(it);
    dg_optimizer opt = kind == DG_OPT_ADAM       ? dg_adam(g, 0.1)
                       : kind == DG_OPT_ADAGRAD  ? dg_adagrad(g, 0.1, 0.1)
                       : kind == DG_OPT_MOMENTUM ? dg_momentum(g, 0.1, 0.9, nesterov)
                                                 : dg_gradient_descent(g, 0.1);
    dg_output grad, var;
    assert_int_equal(dg_optimizer_compute_gradients(&opt, loss, &o.var, 1, &grad, &var, 1), 1);
    assert_true(dg_gradient_is_sparse(grad, NULL, NULL));
    o.train = dg_optimizer_apply_gradients(&opt, &grad, &var, 1, (dg_output){NULL, 0}, NULL);
    assert_non_null(o.train);
    o.init = dg_global_variables_initializer(g);
    o.set = set.node;
    return o;
}

static opt_case build_opt(dg_optimizer_kind kind) { return build_opt_ex(kind, false); }

// Runs init, sets var to V0, takes `steps` steps; returns var.
static void run_opt(opt_case *o, int steps, double *out) {
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(o->g, "local", NULL, st);
    assert_non_null(s);
    assert_true(dg_session_run_target(s, o->init, st));
    assert_true(dg_session_run_target(s, o->set, st));
    for (int i = 0; i < steps; i++)
        if (!dg_session_run_target(s, o->train, st)) fail_msg("%s", dg_status_message(st));
    dg_tensor *t = NULL;
    assert_true(run(s, NULL, NULL, 0, &o->var, &t, 1, st));
    for (int i = 0; i < VR * VD; i++) out[i] = dg_tensor_get_as_double(t, i);
    dg_tensor_unref(t);
    dg_session_free(&s);
    dg_status_free(&st);
    dg_graph_free(&o->g);
}

static void expect_var(const double *got, const double *want) {
    for (int i = 0; i < VR * VD; i++)
        if (!dg_test_is_close(got[i], want[i], 1e-12, 1e-12))
            fail_msg("var[%d] = %.15g, TensorFlow's rule gives %.15g", i, got[i], want[i]);
}

static void test_sparse_gradient_descent(void **state) {
    (void)state;
    opt_case o = build_opt(DG_OPT_GRADIENT_DESCENT);
    double got[VR * VD], want[VR * VD];
    run_opt(&o, 2, got);
    memcpy(want, V0, sizeof want);
    for (int step = 0; step < 2; step++)
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < VD; k++) want[IDS[i] * VD + k] -= 0.1 * C[i][k];
    expect_var(got, want);
}

// TensorFlow's SparseApplyAdagrad: index by index, accum += g^2 then var -= lr g / sqrt(accum).
static void test_sparse_adagrad(void **state) {
    (void)state;
    opt_case o = build_opt(DG_OPT_ADAGRAD);
    double got[VR * VD], want[VR * VD], acc[VR * VD];
    run_opt(&o, 2, got);
    memcpy(want, V0, sizeof want);
    for (int i = 0; i < VR * VD; i++) acc[i] = 0.1;
    for (int step = 0; step < 2; step++)
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < VD; k++) {
                int j = (int)IDS[i] * VD + k;
                acc[j] += C[i][k] * C[i][k];
                want[j] -= 0.1 * C[i][k] / sqrt(acc[j]);
            }
    expect_var(got, want);
}

// TensorFlow's SparseApplyMomentum: index by index, accum = accum * momentum + g, then var -=
// lr * accum (or, Nesterov, lr * g + lr * momentum * accum). Rows not looked up neither decay
// nor move (row 0 and row 2 keep V0), unlike the dense update; the update op is the sparse one.
static void sparse_momentum(bool nesterov) {
    opt_case o = build_opt_ex(DG_OPT_MOMENTUM, nesterov);
    bool sparse_op = false;
    for (int i = 0; i < dg_graph_num_nodes(o.g); i++)
        sparse_op |= strcmp(dg_node_op_type(dg_graph_node(o.g, i)), "SparseApplyMomentum") == 0;
    assert_true(sparse_op);
    double got[VR * VD], want[VR * VD], acc[VR * VD] = {0};
    run_opt(&o, 3, got);
    memcpy(want, V0, sizeof want);
    for (int step = 0; step < 3; step++)
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < VD; k++) {
                int j = (int)IDS[i] * VD + k;
                acc[j] = acc[j] * 0.9 + C[i][k];
                want[j] -= nesterov ? 0.1 * C[i][k] + 0.1 * 0.9 * acc[j] : 0.1 * acc[j];
            }
    expect_var(got, want);
}

static void test_sparse_momentum(void **state) {
    (void)state;
    sparse_momentum(false);
    sparse_momentum(true);
}

// TensorFlow 1 AdamOptimizer._apply_sparse_shared: m, v decay on every row, the rows added,
// every row stepped by lr_t m / (sqrt(v) + epsilon).
static void test_sparse_adam(void **state) {
    (void)state;
    opt_case o = build_opt(DG_OPT_ADAM);
    double got[VR * VD], want[VR * VD], m[VR * VD] = {0}, v[VR * VD] = {0};
    run_opt(&o, 2, got);
    memcpy(want, V0, sizeof want);
    double b1 = 0.9, b2 = 0.999, eps = 1e-8, b1p = b1, b2p = b2;
    for (int step = 0; step < 2; step++) {
        double lr_t = 0.1 * sqrt(1 - b2p) / (1 - b1p);
        for (int j = 0; j < VR * VD; j++) {
            m[j] *= b1;
            v[j] *= b2;
        }
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < VD; k++) {
                int j = (int)IDS[i] * VD + k;
                m[j] += (1 - b1) * C[i][k];
                v[j] += (1 - b2) * C[i][k] * C[i][k];
            }
        for (int j = 0; j < VR * VD; j++) want[j] -= lr_t * m[j] / (sqrt(v[j]) + eps);
        b1p *= b1;
        b2p *= b2;
    }
    expect_var(got, want);
}

// ---- scatter ops and bad input ----

static void test_scatter_and_bad_ids(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output var = dg_variable(g, "w", DG_FLOAT64, dg_shape2(VR, VD), dg_init_constant(1.0));
    dg_output ids = dg_placeholder(g, "ids", DG_INT64, dg_shape1(-1));
    dg_output up = dg_placeholder(g, "up", DG_FLOAT64, dg_shape2(-1, VD));
    dg_output add = dg_scatter_add(g, "add", var, ids, up), sub = dg_scatter_sub(g, "sub", var, ids, up);
    dg_output set = dg_scatter_update(g, "set", var, ids, up);
    dg_output look = dg_gather(g, "look", var, ids);
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_ok(g));
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run_target(s, init, st));
    int64_t good[3] = {2, 0, 2}, bad[2] = {1, 4};
    double rows[6] = {1, 2, 3, 4, 5, 6};
    dg_tensor *gi = i64_tensor(3, good), *bi = i64_tensor(2, bad), *u3 = f64_tensor(dg_shape2(3, VD), rows);
    dg_tensor *u2 = f64_tensor(dg_shape2(2, VD), rows);
    dg_output feeds[2] = {ids, up};
    dg_tensor *out = NULL;
    assert_true(run(s, feeds, (dg_tensor *[]){gi, u3}, 2, &add, &out, 1, st));
    double want[VR * VD] = {1 + 3, 1 + 4, 1, 1, 1 + 1 + 5, 1 + 2 + 6, 1, 1};
    for (int i = 0; i < VR * VD; i++) assert_true(dg_tensor_get_as_double(out, i) == want[i]);
    dg_tensor_unref(out);
    // An id past the end: the step fails naming the node and the id; nothing changes.
    for (int k = 0; k < 3; k++) {
        dg_output which = k == 0 ? sub : k == 1 ? set : look;
        assert_false(run(s, feeds, (dg_tensor *[]){bi, u2}, 2, &which, &out, 1, st));
        assert_status(st, DG_INVALID_ARGUMENT, "indices[1] = 4 is not in [0, 4)");
        assert_status(st, DG_INVALID_ARGUMENT, dg_node_name(which.node));
        dg_status_reset(st);
    }
    // Updates with the wrong number of rows.
    assert_false(run(s, feeds, (dg_tensor *[]){gi, u2}, 2, &sub, &out, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "one row per index");
    dg_status_reset(st);
    assert_true(run(s, NULL, NULL, 0, &var, &out, 1, st));
    for (int i = 0; i < VR * VD; i++) assert_true(dg_tensor_get_as_double(out, i) == want[i]);
    dg_tensor_unref(out);
    dg_tensor_unref(gi);
    dg_tensor_unref(bi);
    dg_tensor_unref(u3);
    dg_tensor_unref(u2);
    dg_session_free(&s);
    dg_status_free(&st);
    dg_graph_free(&g);
}

static void test_sharded_bad_id(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output parts[2] = {dg_variable(g, "p0", DG_FLOAT32, dg_shape2(3, 2), dg_init_zeros()),
                          dg_variable(g, "p1", DG_FLOAT32, dg_shape2(2, 2), dg_init_zeros())};
    dg_output ids = dg_placeholder(g, "ids", DG_INT64, dg_shape1(-1));
    dg_output look = dg_embedding_lookup_sharded(g, "emb", parts, 2, ids, DG_PARTITION_DIV);
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_ok(g));
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run_target(s, init, st));
    int64_t bad[3] = {0, 4, 5};
    dg_tensor *bt = i64_tensor(3, bad), *out = NULL;
    assert_false(run(s, &ids, &bt, 1, &look, &out, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "ids[2] = 5 is not in [0, 5)");
    assert_status(st, DG_INVALID_ARGUMENT, "emb/partition_ids");
    dg_tensor_unref(bt);
    // Parts of different row shapes: a graph error naming the lookup.
    dg_output odd = dg_variable(g, "p2", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros());
    (void)odd;
    dg_session_free(&s);
    dg_status_free(&st);
    dg_graph_free(&g);
    g = dg_graph_new();
    dg_output mixed[2] = {dg_variable(g, "a", DG_FLOAT32, dg_shape2(3, 2), dg_init_zeros()),
                          dg_variable(g, "b", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros())};
    dg_output ids2 = dg_placeholder(g, "ids", DG_INT64, dg_shape1(-1));
    dg_output none = dg_embedding_lookup_sharded(g, "emb", mixed, 2, ids2, DG_PARTITION_MOD);
    assert_null(none.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "one row shape");
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_gradient),     cmocka_unit_test(test_two_lookups_stay_sparse),
        cmocka_unit_test(test_sharded_lookup_mod),  cmocka_unit_test(test_sharded_lookup_div),
        cmocka_unit_test(test_sparse_gradient_descent), cmocka_unit_test(test_sparse_adagrad),
        cmocka_unit_test(test_sparse_momentum),
        cmocka_unit_test(test_sparse_adam),         cmocka_unit_test(test_scatter_and_bad_ids),
        cmocka_unit_test(test_sharded_bad_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
