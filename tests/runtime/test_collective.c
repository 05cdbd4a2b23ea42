/* Collectives between in-process servers over tcp://127.0.0.1 (real ZeroMQ sockets): the
 * all-reduce against a float64 reference for group sizes 1..4, both algorithms, many sizes
 * and both float dtypes, bit-identical on every rank; data-parallel training that matches a
 * single-process step on the whole batch; broadcast; a missing peer; bad attributes. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "testutil.h"

#define MAX_RANKS 4


// Four worker servers, shared by the tests of this file; a group of n uses tasks 0..n-1.
static dg_cluster *cluster;
static dg_server *servers[MAX_RANKS];

static int setup(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char spec[512];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", dg_test_free_port(),
             dg_test_free_port(), dg_test_free_port(), dg_test_free_port());
    cluster = dg_cluster_from_spec_string(spec, st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    so.rpc_timeout_ms = 10000;
    for (int r = 0; r < MAX_RANKS && cluster; r++) servers[r] = dg_server_new(cluster, "worker", r, &so, st);
    bool ok = dg_status_ok(st);
    if (!ok) fprintf(stderr, "setup: %s\n", dg_status_message(st));
    dg_status_free(&st);
    return ok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    for (int r = 0; r < MAX_RANKS; r++) dg_server_free(&servers[r]);
    dg_cluster_free(&cluster);
    return 0;
}

// ---- running one graph per rank, each on its own thread ----
typedef struct rank_job {
    dg_graph *g;
    dg_session *s;
    dg_node *init[2];           // run first when not NULL
    dg_node *target;            // run n_steps times when not NULL
    int n_steps;
    dg_output fetch[16];
    int n_fetch;
    dg_tensor *got[16];
    dg_status *st;
} rank_job;

static void *run_rank(void *arg) {
    rank_job *j = arg;
    bool ok = true;
    for (int i = 0; i < 2 && ok; i++) ok = !j->init[i] || dg_session_run_target(j->s, j->init[i], j->st);
    for (int i = 0; ok && j->target && i < j->n_steps; i++) ok = dg_session_run_target(j->s, j->target, j->st);
    if (ok && j->n_fetch) dg_session_run(j->s, NULL, NULL, 0, j->fetch, j->got, j->n_fetch, NULL, 0, j->st);
    return NULL;
}

// Opens a session per rank on its server and runs the jobs at once.
static void run_group(rank_job *jobs, int n) {
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r].st = dg_status_new();
        jobs[r].s = dg_session_new(jobs[r].g, dg_server_target(servers[r]), NULL, jobs[r].st);
        assert_ok(jobs[r].st);
    }
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

static void free_group(rank_job *jobs, int n) {
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < jobs[r].n_fetch; i++) dg_tensor_unref(jobs[r].got[i]);
        dg_session_free(&jobs[r].s);
        dg_graph_free(&jobs[r].g);
        dg_status_free(&jobs[r].st);
    }
}

// ---- all-reduce against a float64 reference ----
typedef struct ar_case {
    int n_inputs;
    dg_dtype dtype[4];
    int64_t len[4];
} ar_case;

static const ar_case cases[] = {
    {1, {DG_FLOAT32}, {0}},                                            // empty
    {1, {DG_FLOAT64}, {1}},                                            // tiny
    {1, {DG_FLOAT32}, {7}},                                            // fewer than 2 per rank
    {1, {DG_FLOAT64}, {1001}},                                         // not divisible
    {4, {DG_FLOAT32, DG_FLOAT64, DG_FLOAT32, DG_FLOAT64}, {3, 5, 0, 999}},   // packed, mixed
    {2, {DG_FLOAT32, DG_FLOAT32}, {2, 70001}},                         // over the direct limit
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))
#define BIG_ELEMS ((int64_t)1200 * 1000)   // 4.8 MB of float32: several 1 MiB chunks a segment

static double input_value(int rank, int c, int i, int64_t e) {
    uint64_t s = (uint64_t)(rank * 7919 + c * 104729 + i * 1299709) * 2654435761u + (uint64_t)e * 40503u + 1;
    for (int k = 0; k < 2; k++) (void)dg_test_uniform(&s, 0, 1);
    return dg_test_uniform(&s, -3, 3);
}

static dg_tensor *make_input(int rank, int c, int i, dg_dtype t, int64_t len) {
    dg_tensor *x = dg_tensor_new(t, dg_shape1(len), NULL);
    for (int64_t e = 0; e < len; e++) {
        double v = input_value(rank, c, i, e);
        if (t == DG_FLOAT32) dg_tensor_f32(x)[e] = (float)v;
        else dg_tensor_f64(x)[e] = v;
    }
    return x;
}

static double stored(const dg_tensor *x, int64_t e) { return dg_tensor_get_as_double(x, e); }

// Builds on every rank of a group of n the given cases, chained by control dependencies (so
// every rank runs them in one order), runs them once, and checks each output against the
// float64 sum (or mean) of what the ranks gave, and that all ranks got the same bits. wire
// DG_BFLOAT16: the values travel as bfloat16, so each rounding (one per value sent, at most n)
// is bfloat16's (relative 2^-9), and the ring's outputs (more than one rank) are bfloat16 values.
static void check_all_reduce_wire(int n, const char *hint, dg_reduce_op op, const ar_case *cs, int n_cs,
                                  int64_t key_base, dg_dtype wire) {
    rank_job jobs[MAX_RANKS];
    memset(jobs, 0, sizeof jobs);
    dg_tensor *inputs[MAX_RANKS][8][4];
    dg_collective_group grp = dg_collective_group_make("worker", n);
    grp.timeout_ms = 20000;
    grp.wire_dtype = wire;
    for (int r = 0; r < n; r++) {
        dg_graph *g = jobs[r].g = dg_graph_new();
        dg_node *prev = NULL;
        for (int c = 0; c < n_cs; c++) {
            dg_output xs[4], out[4];
            for (int i = 0; i < cs[c].n_inputs; i++) {
                inputs[r][c][i] = make_input(r, c, i, cs[c].dtype[i], cs[c].len[i]);
                xs[i] = dg_const(g, NULL, inputs[r][c][i]);
            }
            if (prev) dg_graph_push_control_deps(g, &prev, 1);
            assert_true(dg_collective_all_reduce(g, NULL, xs, cs[c].n_inputs, &grp, key_base + c, op, hint, out));
            if (prev) dg_graph_pop_control_deps(g);
            prev = out[0].node;
            for (int i = 0; i < cs[c].n_inputs; i++) jobs[r].fetch[jobs[r].n_fetch++] = out[i];
        }
        assert_ok(dg_graph_status(g));
    }
    run_group(jobs, n);
    for (int r = 0; r < n; r++) assert_ok(jobs[r].st);
    int f = 0;
    for (int c = 0; c < n_cs; c++)
        for (int i = 0; i < cs[c].n_inputs; i++, f++) {
            const dg_tensor *y = jobs[0].got[f];
            dg_dtype t = cs[c].dtype[i];
            assert_int_equal(dg_tensor_dtype(y), t);
            assert_int_equal(dg_tensor_num_elements(y), cs[c].len[i]);
            double eps = wire == DG_BFLOAT16 ? 0x1p-9 : t == DG_FLOAT32 ? 6e-8 : 1.2e-16;
            for (int64_t e = 0; e < cs[c].len[i]; e++) {
                double ref = 0, mag = 0;
                for (int r = 0; r < n; r++) {
                    ref += stored(inputs[r][c][i], e);
                    mag += fabs(stored(inputs[r][c][i], e));
                }
                if (op == DG_REDUCE_MEAN) {
                    ref /= n;
                    mag /= n;
                }
                double got = stored(y, e), tol = 2.0 * (n + 1) * eps * mag + 1e-300;
                if (!dg_test_is_close(got, ref, tol, 0))
                    fail_msg("n=%d hint=%s op=%d case %d input %d element %lld: got %.17g, want %.17g", n,
                             hint ? hint : "auto", (int)op, c, i, (long long)e, got, ref);
            }
            for (int r = 1; r < n; r++)
                assert_memory_equal(dg_tensor_data(jobs[r].got[f]), dg_tensor_data(y), dg_tensor_nbytes(y));
            bool ring = hint && strcmp(hint, "ring") == 0;
            for (int64_t e = 0; wire == DG_BFLOAT16 && ring && n > 1 && e < cs[c].len[i]; e++) {
                float v = dg_tensor_f32(y)[e];
                if (dg_bfloat16_to_float(dg_float_to_bfloat16(v)) != v)
                    fail_msg("n=%d hint=%s case %d element %lld: %.9g is not a bfloat16 value", n,
                             hint ? hint : "auto", c, (long long)e, (double)v);
            }
        }
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n_cs; c++)
            for (int i = 0; i < cs[c].n_inputs; i++) dg_tensor_unref(inputs[r][c][i]);
    free_group(jobs, n);
}

static void check_all_reduce(int n, const char *hint, dg_reduce_op op, const ar_case *cs, int n_cs,
                             int64_t key_base) {
    check_all_reduce_wire(n, hint, op, cs, n_cs, key_base, 0);
}

// Float32 values over the wire as bfloat16 (dg_collective_group.wire_dtype), every group size,
// algorithm and op; float64 inputs and other wire dtypes refused when the graph is built.
static void test_all_reduce_wire_bfloat16(void **state) {
    (void)state;
    static const ar_case wire_cases[] = {
        {1, {DG_FLOAT32}, {0}},
        {1, {DG_FLOAT32}, {7}},
        {1, {DG_FLOAT32}, {1001}},
        {2, {DG_FLOAT32, DG_FLOAT32}, {2, 70001}},
    };
    int64_t key = 5000;
    const char *hints[] = {"ring", "direct", NULL};
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int h = 0; h < 3; h++)
            for (int op = 0; op < 2; op++) {
                check_all_reduce_wire(n, hints[h], (dg_reduce_op)op, wire_cases, 4, key, DG_BFLOAT16);
                key += 4;
            }
    dg_graph *g = dg_graph_new();
    dg_collective_group grp = dg_collective_group_make("worker", 2);
    grp.wire_dtype = DG_BFLOAT16;
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(3)), out;
    assert_false(dg_collective_all_reduce(g, "ar", &x, 1, &grp, 1, DG_REDUCE_SUM, NULL, &out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "is float64: wire_dtype bfloat16 takes float32 values only");
    dg_graph_free(&g);
    g = dg_graph_new();
    grp.wire_dtype = DG_INT32;
    x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(3));
    assert_false(dg_collective_all_reduce(g, "ar", &x, 1, &grp, 1, DG_REDUCE_SUM, NULL, &out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "the group's wire_dtype is int32");
    dg_graph_free(&g);
    // The optimizer's gradient_wire_dtype is the ps push's: the all-reduce minimize names the
    // group's option instead, and loss scaling refuses it too.
    for (int k = 0; k < 2; k++) {
        g = dg_graph_new();
        dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
        dg_optimizer opt = dg_gradient_descent(g, 0.1);
        opt.gradient_wire_dtype = DG_BFLOAT16;
        dg_output loss = dg_mean(g, NULL, dg_square(g, NULL, w), NULL, 0, false);
        grp = dg_collective_group_make("worker", 2);
        dg_loss_scale ls;
        if (k == 0) assert_null(dg_all_reduce_minimize(&opt, loss, NULL, 0, (dg_output){NULL, 0}, &grp, 7));
        else assert_null(dg_optimizer_minimize_with_loss_scale(&opt, loss, (dg_output){NULL, 0}, NULL, &ls));
        assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "gradient_wire_dtype (bfloat16) is for");
        dg_graph_free(&g);
    }
}

static void test_all_reduce_sizes(void **state) {
    (void)state;
    int64_t key = 100;
    const char *hints[] = {"ring", "direct", NULL};
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int h = 0; h < 3; h++)
            for (int op = 0; op < 2; op++) {
                check_all_reduce(n, hints[h], (dg_reduce_op)op, cases, N_CASES, key);
                key += N_CASES;
            }
}

// Over 4 MiB: several chunks a segment, pipelined through the ring.
static void test_all_reduce_big(void **state) {
    (void)state;
    ar_case big[2] = {{1, {DG_FLOAT32}, {BIG_ELEMS}}, {1, {DG_FLOAT64}, {BIG_ELEMS / 2 + 3}}};
    check_all_reduce(2, NULL, DG_REDUCE_SUM, big, 2, 1000);
    check_all_reduce(3, "ring", DG_REDUCE_MEAN, big, 1, 1010);
    check_all_reduce(4, NULL, DG_REDUCE_MEAN, big, 2, 1020);
}

// The same instance run again: the execution counter keeps the runs apart, also in a graph
// compiled later.
static void test_all_reduce_repeats(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) check_all_reduce(3, NULL, DG_REDUCE_SUM, cases + 3, 2, 2000);
}

// ---- data parallel training equals one big batch ----
#define IN_DIM 3
#define HIDDEN 8

typedef struct mlp {
    dg_output x, y, w1, b1, w2, b2, loss;
    dg_node *init, *train;
} mlp;

// Builds y ~ tanh(x w1 + b1) w2 + b2 under mean squared error over the rows of x (fed as
// constants). Variables come first, so a given graph seed gives the same initial values.
static void build_mlp(dg_graph *g, mlp *m, const double *x, const double *y, int rows) {
    m->w1 = dg_variable(g, "w1", DG_FLOAT64, dg_shape2(IN_DIM, HIDDEN), dg_init_random_normal(0, 0.7, 0));
    m->b1 = dg_variable(g, "b1", DG_FLOAT64, dg_shape1(HIDDEN), dg_init_random_uniform(-0.1, 0.1, 0));
    m->w2 = dg_variable(g, "w2", DG_FLOAT64, dg_shape2(HIDDEN, 1), dg_init_random_normal(0, 0.7, 0));
    m->b2 = dg_variable(g, "b2", DG_FLOAT64, dg_shape1(1), dg_init_zeros());
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(rows, IN_DIM), x, NULL);
    dg_tensor *yt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(rows, 1), y, NULL);
    m->x = dg_const(g, "x", xt);
    m->y = dg_const(g, "y", yt);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    dg_output h = dg_tanh(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, m->x, m->w1, false, false), m->b1));
    dg_output p = dg_bias_add(g, NULL, dg_matmul(g, NULL, h, m->w2, false, false), m->b2);
    m->loss = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, p, m->y)), NULL, 0, false);
}

static void make_data(double *x, double *y, int rows) {
    uint64_t s = 12345;
    for (int i = 0; i < rows; i++) {
        double acc = 0;
        for (int k = 0; k < IN_DIM; k++) {
            x[i * IN_DIM + k] = dg_test_uniform(&s, -1, 1);
            acc += (k + 1) * x[i * IN_DIM + k];
        }
        y[i] = sin(acc);
    }
}

static dg_optimizer make_opt(dg_graph *g, bool adam) { return adam ? dg_adam(g, 0.05) : dg_gradient_descent(g, 0.3); }

static void check_exactness(int n, int batch, bool adam, int steps, int64_t key) {
    int rows = n * batch;
    double *x = malloc(sizeof(double) * (size_t)rows * IN_DIM), *y = malloc(sizeof(double) * (size_t)rows);
    make_data(x, y, rows);
    dg_status *st = dg_status_new();
    // The single-process reference on the whole batch.
    dg_graph *g1 = dg_graph_new();
    dg_graph_set_random_seed(g1, 77);
    mlp ref;
    build_mlp(g1, &ref, x, y, rows);
    dg_optimizer o1 = make_opt(g1, adam);
    ref.train = dg_optimizer_minimize(&o1, ref.loss, (dg_output){NULL, 0});
    ref.init = dg_global_variables_initializer(g1);
    assert_ok(dg_graph_status(g1));
    dg_session *s1 = dg_session_new(g1, "local", NULL, st);
    assert_true(dg_session_run_target(s1, ref.init, st));
    for (int i = 0; i < steps; i++) assert_true(dg_session_run_target(s1, ref.train, st));
    dg_output ref_vars[4] = {ref.w1, ref.b1, ref.w2, ref.b2};
    dg_tensor *want[4];
    assert_true(dg_session_run(s1, NULL, NULL, 0, ref_vars, want, 4, NULL, 0, st));
    assert_ok(st);
    // n workers, batch rows each; each starts from its own random values (another graph
    // seed) until the broadcast gives every worker those of rank 0 (seed 77, as above).
    rank_job jobs[MAX_RANKS];
    memset(jobs, 0, sizeof jobs);
    dg_collective_group grp = dg_collective_group_make("worker", n);
    grp.timeout_ms = 20000;
    for (int r = 0; r < n; r++) {
        dg_graph *g = jobs[r].g = dg_graph_new();
        dg_graph_set_random_seed(g, r == 0 ? 77 : 1000 + r);
        char scope[32];
        snprintf(scope, sizeof scope, "run%lld", (long long)key);
        dg_graph_push_name_scope(g, scope);
        mlp m;
        build_mlp(g, &m, x + (size_t)r * batch * IN_DIM, y + (size_t)r * batch, batch);
        dg_optimizer o = make_opt(g, adam);
        // Adam's run lets the builder choose its keys (they come from the node names, which the
        // scope above keeps apart between runs); SGD's gives them by hand.
        int64_t k_train = adam ? DG_COLLECTIVE_KEY_AUTO : key, k_bcast = adam ? DG_COLLECTIVE_KEY_AUTO : key + 1;
        jobs[r].target = dg_all_reduce_minimize(&o, m.loss, NULL, 0, (dg_output){NULL, 0}, &grp, k_train);
        jobs[r].init[0] = dg_global_variables_initializer(g);
        jobs[r].init[1] = dg_collective_broadcast_variables(g, NULL, 0, &grp, k_bcast);
        dg_graph_pop_name_scope(g);
        jobs[r].n_steps = steps;
        jobs[r].fetch[0] = m.w1;
        jobs[r].fetch[1] = m.b1;
        jobs[r].fetch[2] = m.w2;
        jobs[r].fetch[3] = m.b2;
        jobs[r].n_fetch = 4;
        assert_ok(dg_graph_status(g));
    }
    run_group(jobs, n);
    for (int r = 0; r < n; r++) {
        assert_ok(jobs[r].st);
        for (int v = 0; v < 4; v++) {
            assert_int_equal(dg_tensor_num_elements(jobs[r].got[v]), dg_tensor_num_elements(want[v]));
            assert_close_f64_msg(dg_tensor_f64(jobs[r].got[v]), dg_tensor_f64(want[v]),
                                 dg_tensor_num_elements(want[v]), 1e-10, 0, "n=%d %s, %d steps: rank %d parameter %d",
                                 n, adam ? "adam" : "sgd", steps, r, v);
            assert_memory_equal(dg_tensor_data(jobs[r].got[v]), dg_tensor_data(jobs[0].got[v]),
                                dg_tensor_nbytes(want[v]));
        }
    }
    // The step moved the parameters: a broken all-reduce could not pass by doing nothing.
    double moved = 0;
    dg_tensor *w1_0 = NULL;
    dg_session *s0 = dg_session_new(g1, "local", NULL, st);
    assert_true(dg_session_run_target(s0, ref.init, st));
    assert_true(dg_session_run(s0, NULL, NULL, 0, &ref.w1, &w1_0, 1, NULL, 0, st));
    for (int64_t e = 0; e < dg_tensor_num_elements(w1_0); e++)
        moved += fabs(dg_tensor_f64(w1_0)[e] - dg_tensor_f64(want[0])[e]);
    assert_true(moved > 1e-3);
    dg_tensor_unref(w1_0);
    dg_session_free(&s0);
    free_group(jobs, n);
    for (int v = 0; v < 4; v++) dg_tensor_unref(want[v]);
    dg_session_free(&s1);
    dg_graph_free(&g1);
    dg_status_free(&st);
    free(x);
    free(y);
}

static void test_exactness_sgd(void **state) {
    (void)state;
    check_exactness(2, 5, false, 3, 3000);
    check_exactness(4, 3, false, 3, 3010);
}

static void test_exactness_adam(void **state) {
    (void)state;
    check_exactness(2, 5, true, 3, 3020);
    check_exactness(4, 3, true, 3, 3030);
}

// ---- failures ----
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Rank 1 never runs its part: rank 0 fails in time, naming task 1.
// broadcast_variables takes integer variables too (a global step a restored chief has and a
// fresh worker does not), beside floats, with one packed broadcast.
static void test_broadcast_variables_integers(void **state) {
    int n = 3;
    rank_job jobs[MAX_RANKS];
    memset(jobs, 0, sizeof jobs);
    dg_collective_group grp = dg_collective_group_make("worker", n);
    grp.timeout_ms = 20000;
    for (int r = 0; r < n; r++) {
        dg_graph *g = jobs[r].g = dg_graph_new();
        dg_graph_push_name_scope(g, "bcast_int");
        dg_output gs = dg_variable(g, "step", DG_INT64, dg_shape_scalar(), dg_init_constant(100 * (r + 1)));
        dg_output iv = dg_variable(g, "counts", DG_INT32, dg_shape1(3), dg_init_constant(7 + r));
        dg_output fv = dg_variable(g, "w", DG_FLOAT32, dg_shape1(5), dg_init_constant(0.5 * (r + 1)));
        jobs[r].init[0] = dg_global_variables_initializer(g);
        jobs[r].init[1] = dg_collective_broadcast_variables(g, NULL, 0, &grp, 4300);
        dg_graph_pop_name_scope(g);
        jobs[r].fetch[0] = gs;
        jobs[r].fetch[1] = iv;
        jobs[r].fetch[2] = fv;
        jobs[r].n_fetch = 3;
        assert_ok(dg_graph_status(g));
    }
    run_group(jobs, n);
    for (int r = 0; r < n; r++) {
        assert_ok(jobs[r].st);
        assert_int_equal(dg_tensor_i64(jobs[r].got[0])[0], 100);
        for (int e = 0; e < 3; e++) assert_int_equal(((const int32_t *)dg_tensor_data(jobs[r].got[1]))[e], 7);
        for (int e = 0; e < 5; e++) assert_true(dg_tensor_f32(jobs[r].got[2])[e] == 0.5f);
    }
    free_group(jobs, n);
}

static void test_missing_peer_deadline(void **state) {
    (void)state;
    const char *hints[] = {"ring", "direct"};
    for (int h = 0; h < 2; h++) {
        rank_job jobs[1];
        memset(jobs, 0, sizeof jobs);
        dg_collective_group grp = dg_collective_group_make("worker", 2);
        grp.timeout_ms = 300;
        dg_graph *g = jobs[0].g = dg_graph_new();
        dg_output x = dg_scalar(g, "x", DG_FLOAT32, 1), out;
        assert_true(dg_collective_all_reduce(g, NULL, &x, 1, &grp, 4000 + h, DG_REDUCE_SUM, hints[h], &out));
        jobs[0].fetch[0] = out;
        jobs[0].n_fetch = 1;
        double t0 = now_s();
        run_group(jobs, 1);
        double took = now_s() - t0;
        assert_status(jobs[0].st, DG_DEADLINE_EXCEEDED, "no data from /job:worker/replica:0/task:1 within 300 ms");
        assert_non_null(strstr(dg_status_message(jobs[0].st), "all-reduce instance"));
        assert_true(took >= 0.29);   // not early; the message says the 300 ms timeout ended it
        jobs[0].n_fetch = 0;
        free_group(jobs, 1);
    }
    // A broadcast waits for rank 0.
    rank_job jobs[MAX_RANKS];
    memset(jobs, 0, sizeof jobs);
    dg_collective_group grp = dg_collective_group_make("worker", 2);
    grp.timeout_ms = 200;
    dg_graph *g = jobs[1].g = dg_graph_new();
    dg_output x = dg_scalar(g, "x", DG_FLOAT64, 1), out;
    assert_true(dg_collective_broadcast(g, NULL, &x, 1, &grp, 4100, &out));
    jobs[1].fetch[0] = out;
    jobs[1].n_fetch = 1;
    jobs[1].st = dg_status_new();
    jobs[1].s = dg_session_new(g, dg_server_target(servers[1]), NULL, jobs[1].st);
    run_rank(&jobs[1]);
    assert_status(jobs[1].st, DG_DEADLINE_EXCEEDED, "broadcast instance 4100 (execution 0): no data from "
                  "/job:worker/replica:0/task:0 within 200 ms");
    jobs[1].n_fetch = 0;
    dg_session_free(&jobs[1].s);
    dg_graph_free(&jobs[1].g);
    dg_status_free(&jobs[1].st);
}

// A failure elsewhere in the step (here task 3 reads an uninitialized variable) ends a
// collective waiting for a peer at once, with that cause, not after its timeout: set to 120 s,
// so that a step ended within 60 s was ended by the abort (a bound of causality, not of speed:
// no loaded machine or valgrind takes a minute over this step).
static void test_step_abort_ends_wait(void **state) {
    (void)state;
    rank_job jobs[1];
    memset(jobs, 0, sizeof jobs);
    dg_collective_group grp = dg_collective_group_make("worker", 2);
    grp.timeout_ms = 120000;
    dg_graph *g = jobs[0].g = dg_graph_new();
    dg_output x = dg_scalar(g, "x", DG_FLOAT32, 1), out;
    assert_true(dg_collective_all_reduce(g, NULL, &x, 1, &grp, 4400, DG_REDUCE_SUM, NULL, &out));
    dg_graph_push_device(g, "/job:worker/task:3");
    dg_output v = dg_variable(g, "never_initialized", DG_FLOAT32, dg_shape_scalar(), dg_init_zeros());
    dg_output bad = dg_identity(g, "read_it", v);
    dg_graph_pop_device(g);
    jobs[0].fetch[0] = out;
    jobs[0].fetch[1] = bad;
    jobs[0].n_fetch = 2;
    double t0 = now_s();
    run_group(jobs, 1);
    double took = now_s() - t0;
    assert_status(jobs[0].st, DG_FAILED_PRECONDITION, "never_initialized");
    print_message("aborted after %.3f s: %s\n", took, dg_status_message(jobs[0].st));
    assert_true(took < 60.0);
    jobs[0].n_fetch = 0;
    free_group(jobs, 1);
}

static void test_bad_attributes(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_collective_group grp = dg_collective_group_make("worker", -1);
    dg_output x = dg_scalar(g, "x", DG_FLOAT32, 1), out;
    assert_false(dg_collective_all_reduce(g, "ar", &x, 1, &grp, 1, DG_REDUCE_SUM, NULL, &out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "\"group_size\" is -1");
    dg_graph_free(&g);

    g = dg_graph_new();
    grp = dg_collective_group_make("worker", 2);
    x = dg_scalar(g, "x", DG_FLOAT32, 1);
    assert_false(dg_collective_all_reduce(g, "ar", &x, 1, &grp, 1, DG_REDUCE_SUM, "nccl", &out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "\"communication_hint\" must be");
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_output i = dg_scalar(g, "i", DG_INT32, 1);
    assert_false(dg_collective_all_reduce(g, "ar", &i, 1, &grp, 1, DG_REDUCE_SUM, NULL, &out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "must be float32 or float64, got int32");
    dg_graph_free(&g);

    g = dg_graph_new();   // a broadcast moves integers, but not bools
    dg_output one = dg_scalar(g, "one", DG_INT32, 1);
    dg_output bv = dg_equal(g, "eq", one, one);
    assert_false(dg_collective_broadcast(g, "bc", &bv, 1, &grp, 1, &out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "must be float32 or float64 (or int32, int64), got bool");
    dg_graph_free(&g);

    // Placed on a task outside the group: an error when the session compiles it.
    dg_status *st = dg_status_new();
    g = dg_graph_new();
    grp = dg_collective_group_make("ps", 2);
    x = dg_scalar(g, "x", DG_FLOAT32, 1);
    assert_true(dg_collective_all_reduce(g, "ar", &x, 1, &grp, 1, DG_REDUCE_SUM, NULL, &out));
    dg_session *s = dg_session_new(g, dg_server_target(servers[0]), NULL, st);
    dg_tensor *t = NULL;
    assert_false(dg_session_run(s, NULL, NULL, 0, &out, &t, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "not one of the group's tasks /job:ps/task:0..1");
    dg_session_free(&s);
    dg_graph_free(&g);
    // In a local session a group of one is the identity, a larger group has no peers.
    g = dg_graph_new();
    grp = dg_collective_group_make("worker", 1);
    x = dg_scalar(g, "x", DG_FLOAT64, 2.5);
    assert_true(dg_collective_all_reduce(g, "ar", &x, 1, &grp, 1, DG_REDUCE_MEAN, NULL, &out));
    s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, &out, &t, 1, NULL, 0, st));
    assert_true(dg_tensor_f64(t)[0] == 2.5);
    dg_tensor_free(&t);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static int64_t key_of(dg_output o) {
    int64_t k = -7;
    assert_true(dg_node_attr_int(o.node, "instance_key", &k));
    return k;
}

// Builds collectives "a" (all-reduce, auto key), "b" (broadcast, auto), "c" (all-reduce,
// hand_c unless negative, else auto) and "d" (all-reduce, auto) into a new graph, writing their keys.
static dg_graph *keyed_graph(int64_t hand_c, int64_t keys[4]) {
    dg_graph *g = dg_graph_new();
    dg_collective_group grp = dg_collective_group_make("worker", 2);
    dg_output x = dg_scalar(g, "x", DG_FLOAT32, 1), out;
    assert_true(dg_collective_all_reduce(g, "a", &x, 1, &grp, DG_COLLECTIVE_KEY_AUTO, DG_REDUCE_SUM, NULL, &out));
    keys[0] = key_of(out);
    assert_true(dg_collective_broadcast(g, "b", &x, 1, &grp, DG_COLLECTIVE_KEY_AUTO, &out));
    keys[1] = key_of(out);
    assert_true(dg_collective_all_reduce(g, "c", &x, 1, &grp, hand_c >= 0 ? hand_c : DG_COLLECTIVE_KEY_AUTO,
                                         DG_REDUCE_SUM, NULL, &out));
    keys[2] = key_of(out);
    assert_true(dg_collective_all_reduce(g, "d", &x, 1, &grp, DG_COLLECTIVE_KEY_AUTO, DG_REDUCE_SUM, NULL, &out));
    keys[3] = key_of(out);
    return g;
}

// Assigned instance keys: in range, distinct within a graph, the same for the same graph built
// again (another rank), clear of a hand-given key; a hand-given key used twice is an error
// naming both collectives.
static void test_instance_keys_assigned(void **state) {
    (void)state;
    int64_t k1[4], k2[4], k3[4];
    dg_graph *g1 = keyed_graph(-1, k1), *g2 = keyed_graph(-1, k2);
    for (int i = 0; i < 4; i++) {
        assert_true(k1[i] >= 0 && k1[i] <= INT32_MAX);
        assert_int_equal(k1[i], k2[i]);
        for (int j = 0; j < i; j++) assert_int_not_equal(k1[i], k1[j]);
    }
    // "c" given by hand the key "a" gets in the graphs above, then "a" built with an auto key:
    dg_graph *g3 = dg_graph_new();
    dg_collective_group grp = dg_collective_group_make("worker", 2);
    dg_output x = dg_scalar(g3, "x", DG_FLOAT32, 1), out;
    assert_true(dg_collective_all_reduce(g3, "c", &x, 1, &grp, k1[0], DG_REDUCE_SUM, NULL, &out));
    // the auto key moves on past the hand key.
    assert_true(dg_collective_all_reduce(g3, "a", &x, 1, &grp, DG_COLLECTIVE_KEY_AUTO, DG_REDUCE_SUM, NULL, &out));
    assert_int_not_equal(key_of(out), k1[0]);
    assert_true(key_of(out) >= 0 && key_of(out) <= INT32_MAX);
    assert_true(dg_graph_ok(g3));
    dg_graph_free(&g3);
    // A hand key in the graph: the auto keys stay clear of it.
    dg_graph *g4 = keyed_graph(k1[3], k3);
    assert_int_equal(k3[2], k1[3]);
    assert_int_not_equal(k3[3], k1[3]);
    dg_graph_free(&g4);
    // The same hand key twice for one type of collective.
    dg_graph *g5 = dg_graph_new();
    x = dg_scalar(g5, "x", DG_FLOAT32, 1);
    assert_true(dg_collective_all_reduce(g5, "first", &x, 1, &grp, 5, DG_REDUCE_SUM, NULL, &out));
    assert_true(dg_collective_broadcast(g5, "other_type", &x, 1, &grp, 5, &out));   // its own counter
    assert_false(dg_collective_all_reduce(g5, "second", &x, 1, &grp, 5, DG_REDUCE_SUM, NULL, &out));
    assert_status(dg_graph_status(g5), DG_ALREADY_EXISTS,
                  "\"second\": instance key 5 is already the key of \"first\"");
    dg_graph_free(&g5);
    dg_graph_free(&g1);
    dg_graph_free(&g2);
}


// ---- members lost and elastic groups (servers of their own: one of them goes away) ----
typedef struct trio {
    dg_cluster *cluster;
    dg_server *servers[3];
} trio;

static void trio_start(trio *t) {
    dg_status *st = dg_status_new();
    char spec[256];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", dg_test_free_port(),
             dg_test_free_port(), dg_test_free_port());
    t->cluster = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    for (int r = 0; r < 3; r++) {
        dg_server_options so = dg_server_options_default();
        so.quiet = true;
        t->servers[r] = dg_server_new(t->cluster, "worker", r, &so, st);
        assert_ok(st);
    }
    dg_status_free(&st);
}

static void trio_restart(trio *t, int r) {
    dg_status *st = dg_status_new();
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    // The port was this process's own a moment ago; binding it again can race the close.
    for (int tries = 0; tries < 50 && !t->servers[r]; tries++) {
        dg_status_reset(st);
        if (!(t->servers[r] = dg_server_new(t->cluster, "worker", r, &so, st))) usleep(20000);
    }
    assert_ok(st);
    dg_status_free(&st);
}

static void trio_free(trio *t) {
    for (int r = 0; r < 3; r++) dg_server_free(&t->servers[r]);
    dg_cluster_free(&t->cluster);
}

// The graph of task `task`: x = task + 1 (float64), summed over the group and broadcast from its rank 0.
static dg_graph *member_graph(int task, const dg_collective_group *grp, dg_output *sum, dg_output *bcast) {
    dg_graph *g = dg_graph_new();
    char dev[64];
    snprintf(dev, sizeof dev, "/job:worker/task:%d", task);
    dg_graph_push_device(g, dev);
    dg_output x = dg_scalar(g, "x", DG_FLOAT64, task + 1);
    assert_true(dg_collective_all_reduce(g, "sum", &x, 1, grp, DG_COLLECTIVE_KEY_AUTO, DG_REDUCE_SUM, NULL, sum));
    dg_node *after = sum->node;
    dg_graph_push_control_deps(g, &after, 1);
    assert_true(dg_collective_broadcast(g, "bcast", &x, 1, grp, DG_COLLECTIVE_KEY_AUTO, bcast));
    dg_graph_pop_control_deps(g);
    dg_graph_pop_device(g);
    assert_ok(dg_graph_status(g));
    return g;
}

typedef struct member_run {
    dg_session *s;
    dg_output fetch[2];
    dg_tensor *got[2];
    dg_status *st;
    double took_s;
} member_run;

static void *member_step(void *arg) {
    member_run *m = arg;
    double t0 = now_s();
    dg_status_reset(m->st);
    dg_session_run(m->s, NULL, NULL, 0, m->fetch, m->got, 2, NULL, 0, m->st);
    m->took_s = now_s() - t0;
    return NULL;
}

// Runs one step on the tasks listed (each on its own thread) and checks every one got `sum`
// and `bcast`.
static void members_step(member_run *runs, const int *tasks, int n, double sum, double bcast) {
    pthread_t th[3];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, member_step, &runs[tasks[i]]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++) {
        member_run *m = &runs[tasks[i]];
        assert_ok(m->st);
        assert_true(dg_tensor_f64(m->got[0])[0] == sum);
        assert_true(dg_tensor_f64(m->got[1])[0] == bcast);
        for (int k = 0; k < 2; k++) dg_tensor_free(&m->got[k]);
    }
}

// A graph and a session per task of t, on its server.
static void members_open(trio *t, const dg_collective_group *grp, member_run *runs, dg_graph **graphs) {
    memset(runs, 0, 3 * sizeof *runs);
    for (int r = 0; r < 3; r++) {
        graphs[r] = member_graph(r, grp, &runs[r].fetch[0], &runs[r].fetch[1]);
        runs[r].st = dg_status_new();
        runs[r].s = dg_session_new(graphs[r], dg_server_target(t->servers[r]), NULL, runs[r].st);
        assert_ok(runs[r].st);
    }
}

static void members_close(trio *t, member_run *runs, dg_graph **graphs) {
    for (int r = 0; r < 3; r++) {
        dg_session_free(&runs[r].s);
        dg_graph_free(&graphs[r]);
        dg_status_free(&runs[r].st);
    }
    trio_free(t);
}

static void set_members(trio *t, int server, int64_t epoch, const int *tasks, int n) {
    dg_status *st = dg_status_new();
    assert_true(dg_server_set_collective_members(t->servers[server], "worker", epoch, tasks, n, st));
    assert_ok(st);
    dg_status_free(&st);
}

// A member's failure naming the lost task: UNAVAILABLE when it saw the loss itself, ABORTED when
// another member that saw it first told it (both recoverable in a monitored session).
static void assert_lost(const dg_status *st, const char *lost) {
    dg_code c = dg_status_code(st);
    if ((c != DG_UNAVAILABLE && c != DG_ABORTED) || !strstr(dg_status_message(st), lost))
        fail_msg("expected UNAVAILABLE or ABORTED naming \"%s\", got %s: %s", lost, dg_code_name(c),
                 dg_status_message(st));
}

// A member whose server goes away ends the collectives waiting on it at once, naming it, though
// their timeout is two minutes (a bound of causality: nothing else ends them within a minute);
// the next one fails before it waits.
static void test_member_lost_fails_fast(void **state) {
    (void)state;
    trio t;
    trio_start(&t);
    dg_collective_group grp = dg_collective_group_make("worker", 3);
    grp.timeout_ms = 120000;
    member_run runs[3];
    dg_graph *graphs[3];
    members_open(&t, &grp, runs, graphs);
    const int all[3] = {0, 1, 2};
    members_step(runs, all, 3, 6, 1);   // every pair of tasks is connected now
    // Tasks 0 and 1 begin the next step; task 2's server goes away while they wait for it.
    pthread_t th[2];
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, member_step, &runs[r]);
    usleep(300000);
    dg_session_free(&runs[2].s);
    dg_server_free(&t.servers[2]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        assert_lost(runs[r].st, "member /job:worker/task:2 is lost");
        print_message("task %d: failed after %.3f s (300 ms before the loss): %s\n", r, runs[r].took_s,
                      dg_status_message(runs[r].st));
        assert_true(runs[r].took_s < 60.0);
    }
    // The loss is remembered: in the next step the wait for task 2's value ends at once.
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, member_step, &runs[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        assert_lost(runs[r].st, "member /job:worker/task:2 is lost");
        assert_true(runs[r].took_s < 60.0);
    }
    members_close(&t, runs, graphs);
}

// A ring of 4 where task 2 goes: task 3 receives from it and sees it go; task 0 has no
// connection to it and only waits for task 3's value (task 1, which sends to it, hears of the
// loss from task 0 or sees it itself). The member that fails tells the others
// (ABORT_STEP for the execution), so task 0 fails at once too, naming the lost member, though
// the group's timeout is 30 s. Before, task 0 waited out that timeout.
typedef struct ring_run {
    dg_session *s;
    dg_output sum;
    dg_tensor *got;
    dg_status *st;
    double took_s;
} ring_run;

static void *ring_step(void *arg) {
    ring_run *m = arg;
    double t0 = now_s();
    dg_status_reset(m->st);
    dg_session_run(m->s, NULL, NULL, 0, &m->sum, &m->got, 1, NULL, 0, m->st);
    m->took_s = now_s() - t0;
    return NULL;
}

static void test_ring_loss_reaches_non_neighbours(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char spec[256];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", dg_test_free_port(),
             dg_test_free_port(), dg_test_free_port(), dg_test_free_port());
    dg_cluster *cl = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server *srv[4];
    dg_graph *graphs[4];
    ring_run runs[4];
    memset(runs, 0, sizeof runs);
    dg_collective_group grp = dg_collective_group_make("worker", 4);
    grp.timeout_ms = 30000;
    for (int r = 0; r < 4; r++) {
        dg_server_options so = dg_server_options_default();
        so.quiet = true;
        srv[r] = dg_server_new(cl, "worker", r, &so, st);
        assert_ok(st);
        graphs[r] = dg_graph_new();
        char dev[64];
        snprintf(dev, sizeof dev, "/job:worker/task:%d", r);
        dg_graph_push_device(graphs[r], dev);
        double v[64];
        for (int i = 0; i < 64; i++) v[i] = r + 1;
        dg_tensor *x = dg_tensor_from_data(DG_FLOAT64, dg_shape1(64), v, st);
        dg_output xo = dg_const(graphs[r], "x", x);
        dg_tensor_unref(x);
        assert_true(dg_collective_all_reduce(graphs[r], "sum", &xo, 1, &grp, 4800, DG_REDUCE_SUM, "ring", &runs[r].sum));
        dg_graph_pop_device(graphs[r]);
        assert_ok(dg_graph_status(graphs[r]));
        runs[r].st = dg_status_new();
        runs[r].s = dg_session_new(graphs[r], dg_server_target(srv[r]), NULL, runs[r].st);
        assert_ok(runs[r].st);
    }
    pthread_t th[4];
    for (int r = 0; r < 4; r++) pthread_create(&th[r], NULL, ring_step, &runs[r]);
    for (int r = 0; r < 4; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 4; r++) {
        assert_ok(runs[r].st);
        assert_true(dg_tensor_f64(runs[r].got)[0] == 10.0 && dg_tensor_f64(runs[r].got)[63] == 10.0);
        dg_tensor_free(&runs[r].got);
    }
    const int alive[3] = {0, 1, 3};
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, ring_step, &runs[alive[i]]);
    usleep(300000);
    dg_session_free(&runs[2].s);
    dg_server_free(&srv[2]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        ring_run *m = &runs[alive[i]];
        print_message("task %d: failed after %.3f s (300 ms before the loss): %s\n", alive[i], m->took_s,
                      dg_status_message(m->st));
        assert_false(dg_status_ok(m->st));
        assert_non_null(strstr(dg_status_message(m->st), "member /job:worker/task:2 is lost"));
        assert_true(m->took_s < 15.0);   // half the group's timeout (a loaded machine's slack)
    }
    // Task 0 heard it from a neighbour: its step was aborted (a recovery follows, as after
    // UNAVAILABLE), naming who told it.
    assert_status(runs[0].st, DG_ABORTED, "/job:worker/replica:0/task:3 failed it: ");
    for (int r = 0; r < 4; r++) {
        dg_session_free(&runs[r].s);
        dg_graph_free(&graphs[r]);
        dg_status_free(&runs[r].st);
        dg_server_free(&srv[r]);
    }
    dg_cluster_free(&cl);
    dg_status_free(&st);
}

// A member that sent its values and then left (it finished) is not missed: the others take
// what it sent. Task 0 broadcasts alone, its server goes, then tasks 1 and 2 receive its value.
static void test_member_left_after_sending(void **state) {
    (void)state;
    trio t;
    trio_start(&t);
    dg_collective_group grp = dg_collective_group_make("worker", 3);
    grp.timeout_ms = 120000;
    member_run runs[3];
    memset(runs, 0, sizeof runs);
    dg_graph *graphs[3];
    const int all[3] = {0, 1, 2}, rest[2] = {1, 2};
    for (int r = 0; r < 3; r++) {
        graphs[r] = dg_graph_new();
        char dev[64];
        snprintf(dev, sizeof dev, "/job:worker/task:%d", r);
        dg_graph_push_device(graphs[r], dev);
        dg_output x = dg_scalar(graphs[r], "x", DG_FLOAT64, r + 1);
        assert_true(dg_collective_broadcast(graphs[r], "bcast", &x, 1, &grp, 4700, &runs[r].fetch[0]));
        runs[r].fetch[1] = runs[r].fetch[0];
        dg_graph_pop_device(graphs[r]);
        runs[r].st = dg_status_new();
        runs[r].s = dg_session_new(graphs[r], dg_server_target(t.servers[r]), NULL, runs[r].st);
        assert_ok(runs[r].st);
    }
    members_step(runs, all, 3, 1, 1);   // every task is connected to task 0 now
    member_step(&runs[0]);              // task 0 sends its next value and is done
    assert_ok(runs[0].st);
    for (int k = 0; k < 2; k++) dg_tensor_free(&runs[0].got[k]);
    usleep(300000);                     // the value is at tasks 1 and 2 (loopback)
    dg_session_free(&runs[0].s);
    dg_server_free(&t.servers[0]);
    members_step(runs, rest, 2, 1, 1);  // they take it, though task 0 is gone
    members_close(&t, runs, graphs);
}

// An elastic group: three members, then two when task 2's server goes away, then three again
// with task 2 back, then two in another rank order (task 2 is rank 0, so the broadcast gives its
// value). Every sum and broadcast is checked on every member.
static void test_elastic_membership(void **state) {
    (void)state;
    trio t;
    trio_start(&t);
    dg_collective_group grp = dg_collective_group_make("worker", DG_COLLECTIVE_ELASTIC);
    grp.timeout_ms = 120000;
    member_run runs[3];
    dg_graph *graphs[3];
    members_open(&t, &grp, runs, graphs);
    // No members yet: the collective says what is missing.
    member_step(&runs[0]);
    assert_status(runs[0].st, DG_FAILED_PRECONDITION, "has no members yet");
    const int all[3] = {0, 1, 2}, two[2] = {0, 1}, swapped[2] = {2, 0};
    for (int r = 0; r < 3; r++) set_members(&t, r, 0, all, 3);
    for (int step = 0; step < 3; step++) members_step(runs, all, 3, 6, 1);
    // Task 2 goes; the others go on as two.
    dg_session_free(&runs[2].s);
    dg_server_free(&t.servers[2]);
    for (int r = 0; r < 2; r++) set_members(&t, r, 1, two, 2);
    for (int step = 0; step < 3; step++) members_step(runs, two, 2, 3, 1);
    // An older epoch is refused; so is the same epoch with other members.
    dg_status *st = dg_status_new();
    assert_false(dg_server_set_collective_members(t.servers[0], "worker", 0, all, 3, st));
    assert_status(st, DG_FAILED_PRECONDITION, "epoch 0 is older than the epoch 1 in force");
    assert_false(dg_server_set_collective_members(t.servers[0], "worker", 1, all, 3, st));
    assert_status(st, DG_FAILED_PRECONDITION, "epoch 1 was set before with other members");
    const int dup[2] = {1, 1}, outside[2] = {0, 7};
    assert_false(dg_server_set_collective_members(t.servers[0], "worker", 5, dup, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "task 1 is named twice");
    assert_false(dg_server_set_collective_members(t.servers[0], "worker", 5, outside, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "/job:worker/task:7 is not a task of the cluster");
    dg_status_free(&st);
    // Task 2 comes back (a new server on its port) and joins in epoch 2.
    trio_restart(&t, 2);
    runs[2].s = dg_session_new(graphs[2], dg_server_target(t.servers[2]), NULL, runs[2].st);
    assert_ok(runs[2].st);
    for (int r = 0; r < 3; r++) set_members(&t, r, 2, all, 3);
    for (int step = 0; step < 3; step++) members_step(runs, all, 3, 6, 1);
    // Epoch 3: tasks 2 and 0, task 2 first; task 1 is not a member.
    for (int r = 0; r < 3; r++) set_members(&t, r, 3, swapped, 2);
    for (int step = 0; step < 2; step++) members_step(runs, swapped, 2, 4, 3);
    member_step(&runs[1]);
    assert_status(runs[1].st, DG_FAILED_PRECONDITION, "/job:worker/task:1 is not a member of its group in epoch 3");
    members_close(&t, runs, graphs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_instance_keys_assigned),
        cmocka_unit_test(test_all_reduce_sizes),
        cmocka_unit_test(test_all_reduce_wire_bfloat16),
        cmocka_unit_test(test_all_reduce_big),
        cmocka_unit_test(test_all_reduce_repeats),
        cmocka_unit_test(test_exactness_sgd),
        cmocka_unit_test(test_exactness_adam),
        cmocka_unit_test(test_broadcast_variables_integers),
        cmocka_unit_test(test_missing_peer_deadline),
        cmocka_unit_test(test_step_abort_ends_wait),
        cmocka_unit_test(test_bad_attributes),
        cmocka_unit_test(test_member_lost_fails_fast),
        cmocka_unit_test(test_member_left_after_sending),
        cmocka_unit_test(test_ring_loss_reaches_non_neighbours),
        cmocka_unit_test(test_elastic_membership),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
