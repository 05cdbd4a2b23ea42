/* The one strategy API (distgraph/distribute.h): the mirrored kind's first step against the
 * same step computed by hand in float64; a one-worker multi-worker mirrored job on a real
 * server; and the errors a user meets: an unknown kind, a cluster that does not fit the kind,
 * a model function whose replicas make other variables, minimize on a ps task or twice, a
 * session for another graph. The kinds training for real across processes are
 * tests/integration/strategies.sh and tests/smoke/guide_programs.sh. */
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mirrored_step_matches_float64),
        cmocka_unit_test(test_replicas_must_agree),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_one_worker_and_refusals),
        cmocka_unit_test(test_cluster_from_slurm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
