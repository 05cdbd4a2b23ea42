/* Mirrored and central-storage strategies (graph/strategy.c) run in local multi-device
 * sessions: exactness against one plain single-device step on the whole batch, mirrored
 * copies staying bit-identical, placement, and the errors a user can trigger. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 5, H = 4, C = 3, B = 3 };   // input width, hidden units, classes, batch per replica

#define LOCAL "/job:localhost/replica:0/task:0/device:CPU:"

// The initial values of the MLP's parameters, shared by the reference and the strategies.
typedef struct mlp_init {
    dg_tensor *w1, *b1, *w2, *b2;
} mlp_init;

static mlp_init make_init(uint64_t seed) {
    double w1[D * H], b1[H], w2[H * C], b2[C];
    for (int i = 0; i < D * H; i++) w1[i] = dg_test_uniform(&seed, -0.8, 0.8);
    for (int i = 0; i < H; i++) b1[i] = dg_test_uniform(&seed, -0.1, 0.1);
    for (int i = 0; i < H * C; i++) w2[i] = dg_test_uniform(&seed, -0.8, 0.8);
    for (int i = 0; i < C; i++) b2[i] = dg_test_uniform(&seed, -0.1, 0.1);
    mlp_init m = {dg_tensor_from_data(DG_FLOAT64, dg_shape2(D, H), w1, NULL),
                  dg_tensor_from_data(DG_FLOAT64, dg_shape1(H), b1, NULL),
                  dg_tensor_from_data(DG_FLOAT64, dg_shape2(H, C), w2, NULL),
                  dg_tensor_from_data(DG_FLOAT64, dg_shape1(C), b2, NULL)};
    return m;
}

static void free_init(mlp_init *m) {
    dg_tensor_unref(m->w1);
    dg_tensor_unref(m->b1);
    dg_tensor_unref(m->w2);
    dg_tensor_unref(m->b2);
}

static dg_output mlp_loss(dg_graph *g, dg_output x, dg_output y, const dg_output *p) {
    dg_output h = dg_relu(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, x, p[0], false, false), p[1]));
    dg_output logits = dg_bias_add(g, NULL, dg_matmul(g, NULL, h, p[2], false, false), p[3]);
    return dg_sparse_softmax_cross_entropy(g, "loss", logits, y);
}

// Batches: step k's inputs for the whole batch of n*B examples.
static void make_batch(int step, int n_ex, dg_tensor **xt, dg_tensor **yt) {
    uint64_t seed = 1000 + (uint64_t)step;
    double *x = malloc((size_t)n_ex * D * sizeof *x);
    int64_t *y = malloc((size_t)n_ex * sizeof *y);
    for (int i = 0; i < n_ex * D; i++) x[i] = dg_test_uniform(&seed, -1, 1);
    for (int i = 0; i < n_ex; i++) y[i] = (int64_t)(dg_test_uniform(&seed, 0, C)) % C;
    *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(n_ex, D), x, NULL);
    *yt = dg_tensor_from_data(DG_INT64, dg_shape1(n_ex), y, NULL);
    free(x);
    free(y);
}

static dg_optimizer make_opt(dg_graph *g, bool adam) {
    return adam ? dg_adam(g, 0.05) : dg_gradient_descent(g, 0.5);
}

static void fetch_f64(dg_session *s, dg_output o, double *out, int n, dg_status *st) {
    dg_tensor *t = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &o, &t, 1, NULL, 0, st));
    assert_int_equal(dg_tensor_num_elements(t), n);
    memcpy(out, dg_tensor_f64(t), (size_t)n * sizeof *out);
    dg_tensor_unref(t);
}

static const int sizes[4] = {D * H, H, H * C, C};

// The reference: one device, the whole batch of n_ex examples. Writes the parameters after
// `steps` steps into params (concatenated) and the first step's loss into *loss0.
static void train_reference(const mlp_init *init, bool adam, int n_ex, int steps, double *params,
                            double *loss0) {
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, D));
    dg_output y = dg_placeholder(g, "y", DG_INT64, dg_shape1(-1));
    dg_output p[4] = {dg_variable(g, "w1", DG_FLOAT64, dg_shape2(D, H), dg_init_tensor(init->w1)),
                      dg_variable(g, "b1", DG_FLOAT64, dg_shape1(H), dg_init_tensor(init->b1)),
                      dg_variable(g, "w2", DG_FLOAT64, dg_shape2(H, C), dg_init_tensor(init->w2)),
                      dg_variable(g, "b2", DG_FLOAT64, dg_shape1(C), dg_init_tensor(init->b2))};
    dg_output loss = mlp_loss(g, x, y, p);
    dg_optimizer opt = make_opt(g, adam);
    dg_node *train = dg_optimizer_minimize(&opt, loss, dg_global_step(g));
    dg_node *init_op = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    dg_session *s = dg_test_local_session(g, 1, 1, st);
    assert_true(dg_session_run_target(s, init_op, st));
    for (int k = 0; k < steps; k++) {
        dg_tensor *xt, *yt;
        make_batch(k, n_ex, &xt, &yt);
        dg_output feeds[2] = {x, y};
        dg_tensor *vals[2] = {xt, yt};
        dg_tensor *lt = NULL;
        assert_true(dg_session_run(s, feeds, vals, 2, &loss, &lt, 1, &train, 1, st));
        if (k == 0) *loss0 = dg_tensor_f64(lt)[0];
        dg_tensor_unref(lt);
        dg_tensor_unref(xt);
        dg_tensor_unref(yt);
    }
    for (int i = 0, off = 0; i < 4; off += sizes[i], i++) fetch_f64(s, p[i], params + off, sizes[i], st);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

typedef struct tower_ctx {
    dg_strategy *strategy;
    dg_output vars[4];
} tower_ctx;

static dg_output tower(dg_graph *g, int replica, const dg_output *inputs, void *ctx) {
    tower_ctx *t = ctx;
    dg_output p[4];
    for (int i = 0; i < 4; i++) p[i] = dg_strategy_read_variable(t->strategy, t->vars[i], replica);
    return mlp_loss(g, inputs[0], inputs[1], p);
}

typedef struct strat_run {
    dg_graph *g;
    dg_strategy *strategy;
    tower_ctx tc;
    dg_output x, y, global_step;
    dg_strategy_step step;
    dg_node *init;
    dg_session *session;
} strat_run;

static void build_strategy(strat_run *r, dg_strategy_kind kind, int n, const mlp_init *init, bool adam,
                           int threads, dg_status *st) {
    memset(r, 0, sizeof *r);
    r->g = dg_graph_new();
    r->strategy = dg_strategy_new_local(r->g, kind, "CPU", n, st);
    assert_ok(st);
    r->x = dg_placeholder(r->g, "x", DG_FLOAT64, dg_shape2(-1, D));
    r->y = dg_placeholder(r->g, "y", DG_INT64, dg_shape1(-1));
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    dg_tensor *vals[4] = {init->w1, init->b1, init->w2, init->b2};
    r->tc.strategy = r->strategy;
    for (int i = 0; i < 4; i++) {
        r->tc.vars[i] = dg_strategy_variable(r->strategy, names[i], DG_FLOAT64, *dg_tensor_shape(vals[i]),
                                             dg_init_tensor(vals[i]), st);
        assert_ok(st);
    }
    r->global_step = dg_global_step(r->g);
    dg_optimizer opt = make_opt(r->g, adam);
    dg_output ins[2] = {r->x, r->y};
    assert_true(dg_strategy_minimize(r->strategy, &opt, tower, &r->tc, ins, 2, r->global_step, &r->step, st));
    assert_ok(st);
    r->init = dg_global_variables_initializer(r->g);
    assert_ok(dg_graph_status(r->g));
    r->session = dg_test_local_session(r->g, n, threads, st);
    assert_true(dg_session_run_target(r->session, r->init, st));
}

static void free_strategy_run(strat_run *r) {
    dg_session_free(&r->session);
    dg_strategy_free(&r->strategy);
    dg_graph_free(&r->g);
}

static void step_strategy(strat_run *r, int k, int n_ex, double *loss, dg_status *st) {
    dg_tensor *xt, *yt;
    make_batch(k, n_ex, &xt, &yt);
    dg_output feeds[2] = {r->x, r->y};
    dg_tensor *vals[2] = {xt, yt};
    dg_tensor *lt = NULL;
    assert_true(dg_session_run(r->session, feeds, vals, 2, &r->step.loss, &lt, 1, &r->step.train, 1, st));
    assert_ok(st);
    if (loss) *loss = dg_tensor_f64(lt)[0];
    dg_tensor_unref(lt);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
}

// Parameters of one copy (replica `replica`'s) after training, concatenated.
static void fetch_params(strat_run *r, int replica, double *params, dg_status *st) {
    for (int i = 0, off = 0; i < 4; off += sizes[i], i++) {
        dg_output v = dg_strategy_read_variable(r->strategy, r->tc.vars[i], replica);
        fetch_f64(r->session, v, params + off, sizes[i], st);
    }
}

enum { N_PARAMS = D * H + H + H * C + C };

static void check_exact(dg_strategy_kind kind, int n, bool adam) {
    dg_status *st = dg_status_new();
    mlp_init init = make_init(42 + (uint64_t)n);
    double want[N_PARAMS], got[N_PARAMS], want_loss = 0, got_loss = 0;
    train_reference(&init, adam, n * B, 1, want, &want_loss);
    strat_run r;
    build_strategy(&r, kind, n, &init, adam, 1, st);
    step_strategy(&r, 0, n * B, &got_loss, st);
    assert_close(got_loss, want_loss, 1e-12, 0);
    for (int c = 0; c < n; c++) {
        fetch_params(&r, c, got, st);
        assert_close_f64_msg(got, want, N_PARAMS, 1e-10, 0, "%s n=%d %s copy %d",
                             kind == DG_STRATEGY_MIRRORED ? "mirrored" : "central", n, adam ? "adam" : "sgd", c);
    }
    // The step changed the parameters (so the comparison is not trivially of initial values).
    double w0 = dg_tensor_f64(init.w1)[0];
    assert_true(fabs(got[0] - w0) > 1e-6);
    // The global step advanced once.
    dg_tensor *gs = NULL;
    assert_true(dg_session_run(r.session, NULL, NULL, 0, &r.global_step, &gs, 1, NULL, 0, st));
    assert_int_equal(dg_tensor_i64(gs)[0], 1);
    dg_tensor_unref(gs);
    free_strategy_run(&r);
    free_init(&init);
    dg_status_free(&st);
}

static void test_mirrored_exact_sgd(void **state) {
    check_exact(DG_STRATEGY_MIRRORED, 2, false);
    check_exact(DG_STRATEGY_MIRRORED, 4, false);
}
static void test_mirrored_exact_adam(void **state) {
    check_exact(DG_STRATEGY_MIRRORED, 2, true);
    check_exact(DG_STRATEGY_MIRRORED, 4, true);
}
static void test_central_exact_sgd(void **state) {
    check_exact(DG_STRATEGY_CENTRAL_STORAGE, 2, false);
    check_exact(DG_STRATEGY_CENTRAL_STORAGE, 4, false);
}
static void test_central_exact_adam(void **state) {
    check_exact(DG_STRATEGY_CENTRAL_STORAGE, 2, true);
    check_exact(DG_STRATEGY_CENTRAL_STORAGE, 4, true);
}

// Several Adam steps on a thread pool: every copy ends bit-identical, and close to the
// single-device run.
static void test_mirrored_copies_identical(void **state) {
    dg_status *st = dg_status_new();
    mlp_init init = make_init(7);
    enum { N = 4, STEPS = 6 };
    double want[N_PARAMS], loss0;
    train_reference(&init, true, N * B, STEPS, want, &loss0);
    strat_run r;
    build_strategy(&r, DG_STRATEGY_MIRRORED, N, &init, true, 4, st);
    for (int k = 0; k < STEPS; k++) step_strategy(&r, k, N * B, NULL, st);
    double first[N_PARAMS], other[N_PARAMS];
    fetch_params(&r, 0, first, st);
    for (int c = 1; c < N; c++) {
        fetch_params(&r, c, other, st);
        assert_memory_equal(first, other, sizeof first);
    }
    for (int i = 0; i < N_PARAMS; i++) assert_close(first[i], want[i], 1e-9, 0);
    free_strategy_run(&r);
    free_init(&init);
    dg_status_free(&st);
}

static const char *assigned(dg_graph *g, const char *name) {
    dg_node *n = dg_graph_find(g, name);
    if (!n) fail_msg("no node \"%s\"", name);
    return dg_node_assigned_device(n);
}

static void check_placement(dg_strategy_kind kind) {
    dg_status *st = dg_status_new();
    mlp_init init = make_init(3);
    enum { N = 3 };
    strat_run r;
    build_strategy(&r, kind, N, &init, true, 1, st);
    step_strategy(&r, 0, N * B, NULL, st);
    char dev[128], name[128];
    for (int k = 0; k < N; k++) {
        snprintf(dev, sizeof dev, LOCAL "%d", k);
        snprintf(name, sizeof name, "/device:CPU:%d", k);
        assert_string_equal(dg_strategy_device(r.strategy, k), name);
        snprintf(name, sizeof name, "replica_%d/MatMul", k);
        assert_string_equal(assigned(r.g, name), dev);
        snprintf(name, sizeof name, "replica_%d/MatMul_1", k);
        assert_string_equal(assigned(r.g, name), dev);
        if (kind == DG_STRATEGY_MIRRORED) {
            if (k) snprintf(name, sizeof name, "w1/replica_%d", k);
            else snprintf(name, sizeof name, "w1");
            assert_string_equal(assigned(r.g, name), dev);
            char slot[160];
            snprintf(slot, sizeof slot, "%s/Adam", name);
            assert_string_equal(assigned(r.g, slot), dev);
            // The gradients are all-reduced across the replicas' devices, one node on each.
            snprintf(name, sizeof name, "reduce/w1_%d", k);
            dg_node *ar = dg_graph_find(r.g, name);
            assert_non_null(ar);
            assert_string_equal(dg_node_op_type(ar), "LocalAllReduce");
            assert_string_equal(dg_node_assigned_device(ar), dev);
        }
    }
    assert_string_equal(dg_strategy_host_device(r.strategy), "/device:CPU:0");
    assert_string_equal(assigned(r.g, "split/input_0"), LOCAL "0");
    if (kind == DG_STRATEGY_CENTRAL_STORAGE) assert_string_equal(assigned(r.g, "reduce/w1"), LOCAL "0");
    assert_string_equal(assigned(r.g, "reduce/loss"), LOCAL "0");
    if (kind == DG_STRATEGY_CENTRAL_STORAGE) {
        assert_string_equal(assigned(r.g, "w1"), LOCAL "0");
        assert_string_equal(assigned(r.g, "w2/Adam_1"), LOCAL "0");
        assert_null(dg_graph_find(r.g, "w1/replica_1"));
    }
    free_strategy_run(&r);
    free_init(&init);
    dg_status_free(&st);
}

static void test_placement_mirrored(void **state) { check_placement(DG_STRATEGY_MIRRORED); }
static void test_placement_central(void **state) { check_placement(DG_STRATEGY_CENTRAL_STORAGE); }

// Mirrored copies start identical even from a random initializer (one draw, copied).
static void test_mirrored_random_init_identical(void **state) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_strategy *s = dg_strategy_new_local(g, DG_STRATEGY_MIRRORED, NULL, 3, st);
    dg_output v = dg_strategy_variable(s, "v", DG_FLOAT64, dg_shape2(4, 4), dg_init_random_normal(0, 1, 0), st);
    assert_ok(st);
    dg_node *init = dg_global_variables_initializer(g);
    dg_session *sess = dg_test_local_session(g, 3, 1, st);
    assert_true(dg_session_run_target(sess, init, st));
    double a[16], b[16];
    fetch_f64(sess, v, a, 16, st);
    for (int r = 1; r < 3; r++) {
        fetch_f64(sess, dg_strategy_read_variable(s, v, r), b, 16, st);
        assert_memory_equal(a, b, sizeof a);
    }
    assert_true(a[0] != a[1]);
    assert_string_equal(dg_node_assigned_device(dg_strategy_read_variable(s, v, 2).node), LOCAL "2");
    dg_session_free(&sess);
    dg_strategy_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// ---- errors ----
static void test_bad_devices(void **state) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    assert_null(dg_strategy_new_local(g, DG_STRATEGY_MIRRORED, "CPU", 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "got 0");
    const char *none[1] = {NULL};
    assert_null(dg_strategy_new(g, DG_STRATEGY_MIRRORED, none, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "at least one device, got 0");
    const char *bad[2] = {"/device:CPU:0", "/device:CPU:0:junk"};
    assert_null(dg_strategy_new(g, DG_STRATEGY_MIRRORED, bad, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "device 1");
    assert_status(st, DG_INVALID_ARGUMENT, "/device:CPU:0:junk");
    const char *wild[2] = {"/device:CPU:0", "/device:GPU:*"};
    assert_null(dg_strategy_new(g, DG_STRATEGY_MIRRORED, wild, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"/device:GPU:*\" does not name one device");
    const char *dup[2] = {"/cpu:1", "/device:CPU:1"};
    assert_null(dg_strategy_new(g, DG_STRATEGY_CENTRAL_STORAGE, dup, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"/device:CPU:1\" is listed twice");
    const char *tasks[2] = {"/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"};
    assert_null(dg_strategy_new(g, DG_STRATEGY_MIRRORED, tasks, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "not in the task of device 0");
    assert_null(dg_strategy_new(g, (dg_strategy_kind)7, tasks, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "unknown kind 7");
    // A task-qualified list: the host is that task's CPU:0.
    dg_status_reset(st);
    dg_strategy *s = dg_strategy_new(g, DG_STRATEGY_CENTRAL_STORAGE, tasks + 1, 1, st);
    assert_ok(st);
    assert_string_equal(dg_strategy_host_device(s), "/job:worker/task:1/device:CPU:0");
    assert_int_equal(dg_strategy_num_replicas(s), 1);
    assert_null(dg_strategy_device(s, 1));
    dg_strategy_free(&s);
    dg_strategy_free(&s);
    assert_true(dg_graph_ok(g));
    dg_graph_free(&g);
    dg_status_free(&st);
}

typedef struct bad_ctx {
    dg_strategy *s;
    dg_output strat_var, plain_var;
    int mode;   // 0: reads a plain variable, 1: read_variable on a plain variable, 2: another
                // replica's copy, 3: a non-scalar loss, 4: ok
} bad_ctx;

static dg_output bad_tower(dg_graph *g, int replica, const dg_output *inputs, void *ctx) {
    bad_ctx *b = ctx;
    dg_output w;
    switch (b->mode) {
    case 0: w = b->plain_var; break;
    case 1: w = dg_strategy_read_variable(b->s, b->plain_var, replica); break;
    case 2: w = dg_strategy_read_variable(b->s, b->strat_var, 0); break;
    default: w = dg_strategy_read_variable(b->s, b->strat_var, replica); break;
    }
    dg_output y = dg_matmul(g, NULL, inputs[0], w, false, false);
    if (b->mode == 3) return y;
    return dg_mean(g, NULL, dg_square(g, NULL, y), NULL, 0, false);
}

static void build_bad(int mode, dg_shape xshape, dg_strategy_kind kind, dg_status *st) {
    dg_graph *g = dg_graph_new();
    bad_ctx b = {dg_strategy_new_local(g, kind, "CPU", 2, st), {NULL, 0}, {NULL, 0}, mode};
    b.strat_var = dg_strategy_variable(b.s, "w", DG_FLOAT64, dg_shape2(D, 1), dg_init_ones(), st);
    b.plain_var = dg_variable(g, "plain", DG_FLOAT64, dg_shape2(D, 1), dg_init_ones());
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, xshape);
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_strategy_step step;
    assert_false(dg_strategy_minimize(b.s, &opt, bad_tower, &b, &x, 1, (dg_output){NULL, 0}, &step, st));
    dg_strategy_free(&b.s);
    dg_graph_free(&g);
}

static void test_variable_outside_strategy(void **state) {
    dg_status *st = dg_status_new();
    build_bad(0, dg_shape2(-1, D), DG_STRATEGY_MIRRORED, st);
    assert_status(st, DG_INVALID_ARGUMENT,
                  "reads the trainable variable \"plain\", which was not made by this strategy");
    build_bad(1, dg_shape2(-1, D), DG_STRATEGY_CENTRAL_STORAGE, st);
    assert_status(st, DG_INVALID_ARGUMENT, "\"plain\" is not a variable of this strategy");
    build_bad(2, dg_shape2(-1, D), DG_STRATEGY_MIRRORED, st);
    assert_status(st, DG_INVALID_ARGUMENT, "the tower of replica 1 reads \"w\", the copy of replica 0");
    build_bad(3, dg_shape2(-1, D), DG_STRATEGY_MIRRORED, st);
    assert_status(st, DG_INVALID_ARGUMENT, "of replica 0 has shape [?,1]");
    dg_status_free(&st);
}

static void test_uneven_batch(void **state) {
    dg_status *st = dg_status_new();
    // Known at build time.
    build_bad(4, dg_shape2(7, D), DG_STRATEGY_MIRRORED, st);
    assert_status(st, DG_INVALID_ARGUMENT, "has 7 examples, which do not split evenly across 2 replicas");
    // Known only at run time: the split fails naming its node.
    dg_status_reset(st);
    dg_graph *g = dg_graph_new();
    bad_ctx b = {dg_strategy_new_local(g, DG_STRATEGY_MIRRORED, "CPU", 2, st), {NULL, 0}, {NULL, 0}, 4};
    b.strat_var = dg_strategy_variable(b.s, "w", DG_FLOAT64, dg_shape2(D, 1), dg_init_ones(), st);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, D));
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_strategy_step step;
    assert_true(dg_strategy_minimize(b.s, &opt, bad_tower, &b, &x, 1, (dg_output){NULL, 0}, &step, st));
    dg_node *init = dg_global_variables_initializer(g);
    dg_session *sess = dg_test_local_session(g, 2, 1, st);
    assert_true(dg_session_run_target(sess, init, st));
    double xv[7 * D] = {0};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(7, D), xv, st);
    assert_false(dg_session_run(sess, &x, &xt, 1, NULL, NULL, 0, &step.train, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "split/input_0");
    assert_status(st, DG_INVALID_ARGUMENT, "does not split into 2");
    dg_tensor_unref(xt);
    dg_session_free(&sess);
    dg_strategy_free(&b.s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_minimize_arguments(void **state) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new(), *other = dg_graph_new();
    dg_strategy *s = dg_strategy_new_local(g, DG_STRATEGY_MIRRORED, "CPU", 2, st);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, D));
    dg_output scalar = dg_scalar(g, "s", DG_FLOAT64, 1);
    dg_optimizer opt = dg_gradient_descent(g, 0.1), wrong = dg_gradient_descent(other, 0.1);
    dg_strategy_step step;
    bad_ctx b = {s, {NULL, 0}, {NULL, 0}, 4};
    assert_false(dg_strategy_minimize(s, &opt, bad_tower, &b, &x, 1, (dg_output){NULL, 0}, &step, st));
    assert_status(st, DG_INVALID_ARGUMENT, "has no variables");
    b.strat_var = dg_strategy_variable(s, "w", DG_FLOAT64, dg_shape2(D, 1), dg_init_ones(), st);
    assert_false(dg_strategy_minimize(s, &wrong, bad_tower, &b, &x, 1, (dg_output){NULL, 0}, &step, st));
    assert_status(st, DG_INVALID_ARGUMENT, "another graph");
    assert_false(dg_strategy_minimize(s, &opt, bad_tower, &b, &scalar, 1, (dg_output){NULL, 0}, &step, st));
    assert_status(st, DG_INVALID_ARGUMENT, "batch input 0 (\"s\") is a scalar");
    dg_output nul = {NULL, 0};
    assert_false(dg_strategy_minimize(s, &opt, bad_tower, &b, &nul, 1, nul, &step, st));
    assert_status(st, DG_INVALID_ARGUMENT, "batch input 0 is not an output");
    assert_false(dg_strategy_minimize(s, &opt, NULL, &b, &x, 1, nul, &step, st));
    assert_status(st, DG_INVALID_ARGUMENT, "tower function");
    assert_true(dg_graph_ok(g));   // argument errors leave the graph unchanged
    // A strategy variable name that is taken.
    dg_variable(g, "taken/replica_1", DG_FLOAT64, dg_shape1(1), dg_init_ones());
    dg_output t = dg_strategy_variable(s, "taken", DG_FLOAT64, dg_shape1(1), dg_init_ones(), st);
    assert_null(t.node);
    assert_status(st, DG_ALREADY_EXISTS, "taken/replica_1");
    dg_strategy_free(&s);
    dg_graph_free(&g);
    dg_graph_free(&other);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mirrored_exact_sgd),
        cmocka_unit_test(test_mirrored_exact_adam),
        cmocka_unit_test(test_central_exact_sgd),
        cmocka_unit_test(test_central_exact_adam),
        cmocka_unit_test(test_mirrored_copies_identical),
        cmocka_unit_test(test_placement_mirrored),
        cmocka_unit_test(test_placement_central),
        cmocka_unit_test(test_mirrored_random_init_identical),
        cmocka_unit_test(test_bad_devices),
        cmocka_unit_test(test_variable_outside_strategy),
        cmocka_unit_test(test_uneven_batch),
        cmocka_unit_test(test_minimize_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
