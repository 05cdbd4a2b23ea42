/* The one strategy API (distgraph/distribute.h): the mirrored kind's first step against the
 * same step computed by hand in float64; a one-worker multi-worker mirrored job on a real
 * server; and the errors a user meets: an unknown kind, a cluster that does not fit the kind,
 * a model function whose replicas make other variables, minimize on a ps task or twice, a
 * session for another graph; ps_coordinator's steps, run by its coordinator on a worker, against
 * gradient descent in float64, and a step's own error given back to the program. The kinds
 * training for real across processes are tests/integration/strategies.sh,
 * coordinator_strategy.sh and tests/smoke/guide_programs.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// y = x w + b, the mean squared error; a replica of id >= *bad (ctx) names its bias otherwise.
static bool linear(dg_replica *r, const dg_output *in, void *ctx, dg_output *out, int n_out) {
    const int *bad = ctx;
    dg_graph *g = dg_replica_graph(r);
    dg_output w = dg_replica_variable(r, "w", DG_FLOAT32, dg_shape2(2, 1), dg_init_zeros());
    dg_output b = dg_replica_variable(r, bad && dg_replica_id(r) >= *bad ? "bias" : "b", DG_FLOAT32, dg_shape1(1),
                                      dg_init_zeros());
    dg_output pred = dg_bias_add(g, NULL, dg_matmul(g, NULL, in[0], w, false, false), b);
    out[0] = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, pred, in[1])), NULL, 0, false);
    if (n_out > 1) out[1] = dg_mean(g, "mean_pred", pred, NULL, 0, false);
    return dg_graph_ok(g);
}

static const float X[4][2] = {{1, 2}, {-1, 0.5f}, {0.25f, -2}, {3, 1}};
static const float Y[4] = {1, -2, 0.5f, 4};

static float fetch_f32(dg_session *s, dg_graph *g, const char *name, int i) {
    dg_status *st = dg_status_new();
    dg_tensor *t = NULL;
    dg_output o = {dg_graph_find(g, name), 0};
    assert_non_null(o.node);
    assert_true(dg_session_run(s, NULL, NULL, 0, &o, &t, 1, NULL, 0, st));
    float v = dg_tensor_f32(t)[i];
    dg_tensor_unref(t);
    dg_status_free(&st);
    return v;
}

// Mirrored over 2 virtual CPUs, one gradient-descent step on a batch of 4 split 2 + 2: every
// copy of w and b is what one step on the whole batch gives, computed here in float64.
static void test_mirrored_step_matches_float64(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_distribution_options o = dg_distribution_options_default(DG_DISTRIBUTE_MIRRORED);
    dg_distribution *d = dg_distribution_new(&o, st);
    assert_ok(st);
    assert_true(dg_distribution_is_chief(d));
    assert_false(dg_distribution_is_ps(d));
    assert_int_equal(dg_distribution_num_replicas_in_sync(d), 2);
    assert_null(dg_distribution_server(d));
    dg_graph *g = dg_graph_new();
    dg_output in[2] = {dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, 2)),
                       dg_placeholder(g, "y", DG_FLOAT32, dg_shape2(4, 1))};
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_distributed_step step;
    assert_true(dg_distribution_minimize(d, g, &opt, linear, NULL, in, 2, 2, &step, st));
    assert_ok(st);
    assert_true(dg_distribution_minimize(d, g, &opt, linear, NULL, in, 2, 2, &step, st) == false);
    assert_status(st, DG_FAILED_PRECONDITION, "minimize was already called");
    dg_monitored_session *ms = dg_distribution_session_new(d, g, 1, NULL, st);
    assert_ok(st);
    dg_tensor *v[2] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 2), X, st),
                       dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 1), Y, st)};
    dg_tensor *got[2] = {NULL, NULL};
    dg_output fetch[2] = {step.outputs[0], step.outputs[1]};
    assert_true(dg_distribution_run(d, ms, &step, in, v, 2, fetch, got, 2, st));
    assert_ok(st);
    assert_true(dg_monitored_session_should_stop(ms));   // the stop step is 1
    // The reference: from w = 0, b = 0 every prediction is 0; loss = mean(y^2), the mean
    // prediction 0; grad w = 2/4 X^T (0 - y), grad b = 2/4 sum(0 - y).
    double loss = 0, gw[2] = {0, 0}, gb = 0;
    for (int i = 0; i < 4; i++) {
        loss += (double)Y[i] * Y[i] / 4;
        for (int j = 0; j < 2; j++) gw[j] += 2.0 / 4 * X[i][j] * -(double)Y[i];
        gb += 2.0 / 4 * -(double)Y[i];
    }
    assert_close(dg_tensor_f32(got[0])[0], loss, 1e-6, 1e-6);
    assert_close(dg_tensor_f32(got[1])[0], 0.0, 0, 1e-7);
    dg_session *s = dg_monitored_session_session(ms);
    const char *copies[2][2] = {{"w", "w/replica_1"}, {"b", "b/replica_1"}};
    for (int c = 0; c < 2; c++) {
        for (int j = 0; j < 2; j++) assert_close(fetch_f32(s, g, copies[0][c], j), -0.1 * gw[j], 1e-6, 1e-7);
        assert_close(fetch_f32(s, g, copies[1][c], 0), -0.1 * gb, 1e-6, 1e-7);
    }
    for (int i = 0; i < 2; i++) dg_tensor_unref(got[i]);
    for (int i = 0; i < 2; i++) dg_tensor_unref(v[i]);
    dg_monitored_session_free(&ms);
    dg_distribution_free(&d);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// A replica that makes another variable than the first replica is an error naming both.
static void test_replicas_must_agree(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_distribution_options o = dg_distribution_options_default(DG_DISTRIBUTE_CENTRAL_STORAGE);
    o.num_devices = 3;
    dg_distribution *d = dg_distribution_new(&o, st);
    assert_ok(st);
    dg_graph *g = dg_graph_new();
    dg_output in[2] = {dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(6, 2)),
                       dg_placeholder(g, "y", DG_FLOAT32, dg_shape2(6, 1))};
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_distributed_step step;
    int bad = 2;   // replica 2 names its bias "bias"
    assert_false(dg_distribution_minimize(d, g, &opt, linear, &bad, in, 2, 1, &step, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replica 2: variable 1 is \"bias\"");
    assert_status(st, DG_INVALID_ARGUMENT, "the first replica made \"b\"");
    dg_distribution_free(&d);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static dg_cluster *cluster_of(const char *spec) {
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_status_free(&st);
    return c;
}

// Clusters that do not fit the kind, and other bad options, each named.
static void test_bad_options(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_distribution_kind k;
    assert_false(dg_distribution_kind_parse("mirrorred", &k, st));
    assert_status(st, DG_INVALID_ARGUMENT, "unknown kind \"mirrorred\" (mirrored, central_storage");
    assert_true(dg_distribution_kind_parse("sync_replicas", &k, st));
    assert_int_equal(k, DG_DISTRIBUTE_SYNC_REPLICAS);
    assert_true(dg_distribution_kind_parse("ps_coordinator", &k, st));
    assert_int_equal(k, DG_DISTRIBUTE_PS_COORDINATOR);
    assert_string_equal(dg_distribution_kind_name(DG_DISTRIBUTE_PARAMETER_SERVER), "parameter_server");
    struct {
        dg_distribution_kind kind;
        const char *spec, *job;
        int task, rta;
        dg_code code;
        const char *want;
    } cases[] = {
        {DG_DISTRIBUTE_PARAMETER_SERVER, "worker|127.0.0.1:1", "worker", 0, 0, DG_INVALID_ARGUMENT,
         "no \"ps\" job to hold the variables"},
        {DG_DISTRIBUTE_MULTI_WORKER_MIRRORED, "ps|127.0.0.1:1;worker|127.0.0.1:2", "worker", 0, 0, DG_INVALID_ARGUMENT,
         "the cluster has 1 ps task, but every worker holds the variables here"},
        {DG_DISTRIBUTE_MULTI_WORKER_MIRRORED, "chief|127.0.0.1:1;worker|127.0.0.1:2", "worker", 0, 0,
         DG_INVALID_ARGUMENT, "the cluster has a \"chief\" job"},
        {DG_DISTRIBUTE_SYNC_REPLICAS, "ps|127.0.0.1:1;worker|127.0.0.1:2", "worker", 0, 2, DG_INVALID_ARGUMENT,
         "replicas_to_aggregate 2, with 1 workers"},
        {DG_DISTRIBUTE_PARAMETER_SERVER, "ps|127.0.0.1:1;worker|127.0.0.1:2", "worker", 3, 0, DG_NOT_FOUND,
         "distribution parameter_server: this task"},
        {DG_DISTRIBUTE_PARAMETER_SERVER, "ps|127.0.0.1:1;worker|127.0.0.1:2", "evaluator", 0, 0, DG_INVALID_ARGUMENT,
         "this task's job is \"evaluator\""},
        {DG_DISTRIBUTE_PS_COORDINATOR, "chief|127.0.0.1:3,127.0.0.1:4;ps|127.0.0.1:1;worker|127.0.0.1:2", "chief", 0,
         0, DG_INVALID_ARGUMENT, "the \"chief\" job (the coordinator) has 2 tasks"},
        {DG_DISTRIBUTE_PS_COORDINATOR, "evaluator|127.0.0.1:3;ps|127.0.0.1:1;worker|127.0.0.1:2", "chief", 0, 0,
         DG_INVALID_ARGUMENT, "a \"evaluator\" job; it takes \"worker\" and \"ps\" tasks and one \"chief\""},
        {DG_DISTRIBUTE_PS_COORDINATOR, "ps|127.0.0.1:1;worker|127.0.0.1:2", "chief", 1, 0, DG_INVALID_ARGUMENT,
         "the coordinator is chief task 0, not 1"},
        {DG_DISTRIBUTE_PS_COORDINATOR, "worker|127.0.0.1:2", "chief", 0, 0, DG_INVALID_ARGUMENT,
         "no \"ps\" job to hold the variables"},
        {DG_DISTRIBUTE_PARAMETER_SERVER, "ps|127.0.0.1:1;worker|127.0.0.1:2", "chief", 0, 0, DG_INVALID_ARGUMENT,
         "this task's job is \"chief\", not \"worker\" or \"ps\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dg_cluster *c = cluster_of(cases[i].spec);
        dg_distribution_options o = dg_distribution_options_default(cases[i].kind);
        o.cluster = c;
        o.job_name = cases[i].job;
        o.task_index = cases[i].task;
        o.replicas_to_aggregate = cases[i].rta;
        assert_null(dg_distribution_new(&o, st));
        assert_status(st, cases[i].code, cases[i].want);
        dg_cluster_free(&c);
    }
    dg_distribution_options o = dg_distribution_options_default(DG_DISTRIBUTE_MIRRORED);
    o.num_devices = 0;
    assert_null(dg_distribution_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "num_devices 0 (1..64)");
    o.kind = (dg_distribution_kind)9;
    assert_null(dg_distribution_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "unknown kind");
    dg_status_free(&st);
}

// One worker of multi-worker mirrored on a real server: a step runs (the all-reduce of a group
// of one, the broadcast hook after the session is made), the global step counts it; minimize
// on a ps task and a session for another graph are refused.
static void test_one_worker_and_refusals(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char spec[96];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d", dg_test_free_port());
    dg_cluster *c = cluster_of(spec);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_distribution_options o = dg_distribution_options_default(DG_DISTRIBUTE_MULTI_WORKER_MIRRORED);
    o.cluster = c;
    o.job_name = "worker";
    o.server_options = &so;
    dg_distribution *d = dg_distribution_new(&o, st);
    assert_ok(st);
    dg_cluster_free(&c);
    assert_non_null(dg_distribution_server(d));
    assert_int_equal(dg_distribution_num_replicas_in_sync(d), 1);
    dg_graph *g = dg_graph_new(), *other = dg_graph_new();
    dg_output in[2] = {dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 2)),
                       dg_placeholder(g, "y", DG_FLOAT32, dg_shape2(-1, 1))};
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_distributed_step step;
    assert_true(dg_distribution_minimize(d, g, &opt, linear, NULL, in, 2, 1, &step, st));
    assert_ok(st);
    assert_null(dg_distribution_session_new(d, other, 5, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "not the one dg_distribution_minimize built");
    dg_monitored_session *ms = dg_distribution_session_new(d, g, 5, NULL, st);
    assert_ok(st);
    dg_tensor *v[2] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 2), X, st),
                       dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 1), Y, st)};
    int runs = 0;
    while (!dg_monitored_session_should_stop(ms)) {
        assert_true(dg_distribution_run(d, ms, &step, in, v, 2, NULL, NULL, 0, st));
        runs++;
    }
    assert_int_equal(runs, 5);
    assert_int_equal(dg_monitored_session_global_step(ms, st), 5);
    for (int i = 0; i < 2; i++) dg_tensor_unref(v[i]);
    dg_monitored_session_free(&ms);
    dg_distribution_free(&d);
    dg_graph_free(&g);
    dg_graph_free(&other);

    // A ps task builds no model.
    char spec2[128];
    snprintf(spec2, sizeof spec2, "ps|127.0.0.1:%d;worker|127.0.0.1:%d", dg_test_free_port(), dg_test_free_port());
    c = cluster_of(spec2);
    o = dg_distribution_options_default(DG_DISTRIBUTE_PARAMETER_SERVER);
    o.cluster = c;
    o.job_name = "ps";
    o.server_options = &so;
    d = dg_distribution_new(&o, st);
    assert_ok(st);
    dg_cluster_free(&c);
    assert_true(dg_distribution_is_ps(d));
    assert_int_equal(dg_distribution_worker_index(d), -1);
    g = dg_graph_new();
    opt = dg_gradient_descent(g, 0.1);
    assert_false(dg_distribution_minimize(d, g, &opt, linear, NULL, in, 2, 1, &step, st));
    assert_status(st, DG_FAILED_PRECONDITION, "this is ps task 0, which builds no model");
    dg_distribution_free(&d);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// The cluster from a Slurm job step's environment (as srun sets it): 2 tasks on one node, this
// process rank 0, so worker 0 of 2 (multi-worker mirrored), its server on the port base. Outside
// a job step, NOT_FOUND naming Slurm.
static void test_cluster_from_slurm(void **state) {
    (void)state;
    const char *vars[] = {"SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_NODELIST",
                          "SLURM_TASKS_PER_NODE", "SLURM_PROCID"};
    for (int i = 0; i < 5; i++) unsetenv(vars[i]);
    dg_status *st = dg_status_new();
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    int port = dg_test_free_port();
    dg_slurm_options sl = {.jobs = "worker:2", .port_base = port};
    dg_distribution_options o = dg_distribution_options_default(DG_DISTRIBUTE_MULTI_WORKER_MIRRORED);
    o.slurm = &sl;
    o.server_options = &so;
    assert_null(dg_distribution_new(&o, st));
    assert_int_equal(dg_status_code(st), DG_NOT_FOUND);
    assert_non_null(strstr(dg_status_message(st), "the cluster from Slurm"));
    setenv("SLURM_JOB_NODELIST", "127.0.0.1", 1);
    setenv("SLURM_TASKS_PER_NODE", "2", 1);
    setenv("SLURM_PROCID", "0", 1);
    dg_distribution *d = dg_distribution_new(&o, st);
    assert_ok(st);
    assert_false(dg_distribution_is_ps(d));
    assert_true(dg_distribution_is_chief(d));
    assert_int_equal(dg_distribution_worker_index(d), 0);
    assert_int_equal(dg_distribution_num_replicas_in_sync(d), 2);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    assert_non_null(strstr(dg_server_target(dg_distribution_server(d)), want));
    dg_distribution_free(&d);
    // A rank beyond the jobs' tasks is refused by the resolver, named.
    setenv("SLURM_PROCID", "2", 1);
    assert_null(dg_distribution_new(&o, st));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "the cluster from Slurm"));
    for (int i = 0; i < 5; i++) unsetenv(vars[i]);
    dg_status_free(&st);
}

// A task of a cluster of one ps and one worker, servers in this process.
static dg_distribution *coordinated_task(const char *spec, const char *job, dg_status *st) {
    dg_cluster *c = cluster_of(spec);
    dg_server_options so = dg_server_options_default();
    so.quiet = getenv("DG_TEST_VERBOSE") == NULL;
    dg_distribution_options o = dg_distribution_options_default(DG_DISTRIBUTE_PS_COORDINATOR);
    o.cluster = c;
    o.job_name = job;
    o.server_options = &so;
    o.peer_timeout_ms = 10000;
    dg_distribution *d = dg_distribution_new(&o, st);
    dg_cluster_free(&c);
    return d;
}

// ps_coordinator with one ps and one worker (servers in this process) and the coordinator: the
// ps and the worker only serve and build no model; the coordinator's 20 steps run on the worker
// one after another (one worker), so the variables are 20 steps of gradient descent on the
// batch, computed here in float64; the global step ends at exactly 20, and the fetched losses
// are the float64 losses of the steps they come from. A step's own error (a feed of the wrong
// shape) comes back to the program, naming the worker.
static void test_ps_coordinator(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char spec[128];
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|127.0.0.1:%d", dg_test_free_port(), dg_test_free_port());
    dg_distribution *ps = coordinated_task(spec, "ps", st);
    assert_ok(st);
    dg_distribution *worker = coordinated_task(spec, "worker", st);
    assert_ok(st);
    dg_distribution *d = coordinated_task(spec, "chief", st);
    assert_ok(st);
    assert_true(dg_distribution_only_serves(ps));
    assert_true(dg_distribution_only_serves(worker));
    assert_false(dg_distribution_is_ps(worker));
    assert_false(dg_distribution_is_chief(worker));
    assert_false(dg_distribution_only_serves(d));
    assert_true(dg_distribution_is_chief(d));
    assert_null(dg_distribution_server(d));
    assert_int_equal(dg_distribution_worker_index(d), -1);
    assert_int_equal(dg_distribution_num_workers(d), 1);
    assert_int_equal(dg_distribution_num_replicas_in_sync(d), 1);
    dg_graph *g = dg_graph_new();
    dg_output in[2] = {dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 2)),
                       dg_placeholder(g, "y", DG_FLOAT32, dg_shape2(-1, 1))};
    dg_optimizer opt = dg_gradient_descent(g, 0.05);
    dg_distributed_step step;
    assert_false(dg_distribution_minimize(worker, g, &opt, linear, NULL, in, 2, 1, &step, st));
    assert_status(st, DG_FAILED_PRECONDITION, "this is worker task 0, which builds no model");
    assert_true(dg_distribution_minimize(d, g, &opt, linear, NULL, in, 2, 1, &step, st));
    assert_ok(st);
    dg_monitored_session *ms = dg_distribution_session_new(d, g, 20, NULL, st);
    assert_ok(st);
    dg_tensor *v[2] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 2), X, st),
                       dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 1), Y, st)};
    // The reference: w, b and the loss before each step, in float64.
    double w[2] = {0, 0}, b = 0, loss_before[21];
    for (int k = 0; k <= 20; k++) {
        double gw[2] = {0, 0}, gb = 0, l = 0;
        for (int i = 0; i < 4; i++) {
            double e = X[i][0] * w[0] + X[i][1] * w[1] + b - Y[i];
            l += e * e / 4;
            gw[0] += 2 * e * X[i][0] / 4;
            gw[1] += 2 * e * X[i][1] / 4;
            gb += 2 * e / 4;
        }
        loss_before[k] = l;
        if (k == 20) break;
        w[0] -= 0.05 * gw[0];
        w[1] -= 0.05 * gw[1];
        b -= 0.05 * gb;
    }
    int runs = 0, got_losses = 0;
    dg_output fetch[2] = {step.outputs[0], step.global_step};
    while (!dg_monitored_session_should_stop(ms)) {
        dg_tensor *got[2] = {NULL, NULL};
        assert_true(dg_distribution_run(d, ms, &step, in, v, 2, fetch, got, 2, st));
        assert_ok(st);
        runs++;
        assert_true((got[0] == NULL) == (got[1] == NULL));
        if (got[0]) {
            // The loss of the step that took the global step from k to k + 1; the global step
            // fetched with it may already count that step (read on the ps, where the step's own
            // increment can come first: distribute.h), so k + 1 may stand for it too. The losses
            // fall by far more than the tolerance, so no other step matches.
            int64_t k = dg_tensor_i64(got[1])[0];
            assert_true(k >= 0 && k <= 20);
            double l = dg_tensor_f32(got[0])[0];
            bool before = k < 20 && fabs(l - loss_before[k]) <= 1e-6 + 1e-5 * fabs(loss_before[k]);
            bool counted = k >= 1 && fabs(l - loss_before[k - 1]) <= 1e-6 + 1e-5 * fabs(loss_before[k - 1]);
            if (!before && !counted)
                fail_msg("loss %.9g fetched with global step %lld: want %.9g (or %.9g)", l, (long long)k,
                         k < 20 ? loss_before[k] : NAN, k >= 1 ? loss_before[k - 1] : NAN);
            got_losses++;
        }
        dg_tensor_unref(got[0]);
        dg_tensor_unref(got[1]);
        assert_true(runs <= 21);
    }
    assert_int_equal(runs, 20);
    assert_true(got_losses >= 1);
    // The loop ended with every step run: the last call waited for them.
    assert_int_equal(dg_monitored_session_global_step(ms, st), 20);
    assert_true(dg_distribution_wait(d, st));
    dg_session *s = dg_monitored_session_session(ms);
    assert_int_equal(dg_monitored_session_global_step(ms, st), 20);
    assert_close(fetch_f32(s, g, "w", 0), w[0], 1e-6, 1e-5);
    assert_close(fetch_f32(s, g, "w", 1), w[1], 1e-6, 1e-5);
    assert_close(fetch_f32(s, g, "b", 0), b, 1e-6, 1e-5);
    // A step that fails on its own (x of 3 columns): the program hears of it, not a retry.
    dg_tensor *bad = dg_tensor_new(DG_FLOAT32, dg_shape2(4, 3), st);
    memset(dg_tensor_data(bad), 0, dg_tensor_nbytes(bad));
    dg_tensor *bv[2] = {bad, v[1]};
    dg_monitored_session_free(&ms);
    ms = dg_distribution_session_new(d, g, -1, NULL, st);
    assert_null(ms);
    assert_status(st, DG_FAILED_PRECONDITION, "the coordinator has a session already");
    dg_distribution_free(&d);
    d = coordinated_task(spec, "chief", st);
    assert_ok(st);
    dg_graph *g2 = dg_graph_new();
    dg_output in2[2] = {dg_placeholder(g2, "x", DG_FLOAT32, dg_shape2(-1, -1)),
                        dg_placeholder(g2, "y", DG_FLOAT32, dg_shape2(-1, 1))};
    dg_optimizer opt2 = dg_gradient_descent(g2, 0.05);
    assert_true(dg_distribution_minimize(d, g2, &opt2, linear, NULL, in2, 2, 1, &step, st));
    ms = dg_distribution_session_new(d, g2, -1, NULL, st);
    assert_ok(st);
    bool ok = dg_distribution_run(d, ms, &step, in2, bv, 2, NULL, NULL, 0, st);
    if (ok) ok = dg_distribution_wait(d, st);
    assert_false(ok);
    // The kernel's error, or its abort as another task of the step saw it first.
    assert_true(dg_status_code(st) == DG_INVALID_ARGUMENT || dg_status_code(st) == DG_ABORTED);
    assert_non_null(strstr(dg_status_message(st), "a step on worker 0 (dg://127.0.0.1:"));
    assert_non_null(strstr(dg_status_message(st), "inner dimensions differ, 3 vs 2"));
    assert_false(dg_distribution_run(d, ms, &step, in2, v, 2, NULL, NULL, 0, st));   // kept
    assert_non_null(strstr(dg_status_message(st), "a step on worker 0"));
    dg_tensor_unref(bad);
    for (int i = 0; i < 2; i++) dg_tensor_unref(v[i]);
    dg_monitored_session_free(&ms);
    dg_distribution_free(&d);
    dg_distribution_free(&worker);
    dg_distribution_free(&ps);
    dg_graph_free(&g);
    dg_graph_free(&g2);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mirrored_step_matches_float64),
        cmocka_unit_test(test_replicas_must_agree),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_one_worker_and_refusals),
        cmocka_unit_test(test_cluster_from_slurm),
        cmocka_unit_test(test_ps_coordinator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
