/* The coordinator of an elastic group (ElasticRendezvous, executor/cpu/kernels_sync.c), driven
 * from threads as workers would drive it, in a local session: the first epoch waits for its
 * minimum; a commit of every member keeps the epoch; a joiner starts a new one at the next
 * commit, after the members that keep their state; reported losses and the commit deadline
 * leave members out; another model's fingerprint and bad inputs are refused. And the elastic
 * hook's options. Every answer is compared with the epoch and member list worked out by hand. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph_impl.h"
#include "testutil.h"

enum { COMMIT = 0, JOIN = 1, REFORM = 2 };

typedef struct coord {
    dg_graph *g;
    dg_session *s;
    dg_output task, kind, epoch, lost, fingerprint, answer;
} coord;

static void coord_new(coord *c, int min_members, int64_t barrier_ms) {
    c->g = dg_graph_new();
    c->task = dg_placeholder(c->g, "task", DG_INT64, dg_shape_scalar());
    c->kind = dg_placeholder(c->g, "kind", DG_INT64, dg_shape_scalar());
    c->epoch = dg_placeholder(c->g, "epoch", DG_INT64, dg_shape_scalar());
    c->lost = dg_placeholder(c->g, "lost", DG_INT64, dg_shape1(-1));
    c->fingerprint = dg_placeholder(c->g, "fingerprint", DG_INT64, dg_shape_scalar());
    dg_node *nd = graph_begin(c->g, "ElasticRendezvous", "coordinator");
    dg_output ins[5] = {c->task, c->kind, c->epoch, c->lost, c->fingerprint};
    for (int i = 0; i < 5; i++) graph_add_input(nd, ins[i]);
    graph_set_attr_string(nd, "shared_name", "elastic/worker");
    graph_set_attr_string(nd, "group_job", "worker");
    graph_set_attr_int(nd, "min_members", min_members);
    graph_set_attr_int(nd, "barrier_timeout_ms", barrier_ms);
    graph_set_attr_int(nd, "timeout_ms", 20000);
    c->answer = (dg_output){graph_finish(nd), 0};
    assert_ok(dg_graph_status(c->g));
    dg_status *st = dg_status_new();
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 8;
    c->s = dg_session_new(c->g, "local", &so, st);
    assert_ok(st);
    dg_status_free(&st);
}

static void coord_free(coord *c) {
    dg_session_free(&c->s);
    dg_graph_free(&c->g);
}

typedef struct arrival {
    coord *c;
    int64_t task, kind, epoch, fingerprint;
    int n_lost;
    int64_t lost[4];
    int64_t delay_ms;       // before arriving
    dg_tensor *answer;
    dg_status *st;
    double took_s;
} arrival;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *arrive(void *arg) {
    arrival *a = arg;
    if (a->delay_ms) usleep((useconds_t)a->delay_ms * 1000);
    dg_tensor *v[5] = {dg_tensor_scalar_i64(a->task), dg_tensor_scalar_i64(a->kind), dg_tensor_scalar_i64(a->epoch),
                       dg_tensor_new(DG_INT64, dg_shape1(a->n_lost), NULL), dg_tensor_scalar_i64(a->fingerprint)};
    for (int i = 0; i < a->n_lost; i++) dg_tensor_i64(v[3])[i] = a->lost[i];
    dg_output feeds[5] = {a->c->task, a->c->kind, a->c->epoch, a->c->lost, a->c->fingerprint};
    a->st = dg_status_new();
    double t0 = now_s();
    dg_session_run(a->c->s, feeds, v, 5, &a->c->answer, &a->answer, 1, NULL, 0, a->st);
    a->took_s = now_s() - t0;
    for (int i = 0; i < 5; i++) dg_tensor_unref(v[i]);
    return NULL;
}

// Runs the arrivals at once (each after its delay) and waits for all.
static void round_of(arrival *as, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, arrive, &as[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

// The answer is [epoch, members...] exactly.
static void expect_answer(arrival *a, int64_t epoch, const int64_t *members, int n) {
    assert_ok(a->st);
    assert_int_equal(dg_tensor_num_elements(a->answer), 1 + n);
    assert_int_equal(dg_tensor_i64(a->answer)[0], epoch);
    for (int i = 0; i < n; i++) assert_int_equal(dg_tensor_i64(a->answer)[1 + i], members[i]);
}

static void done(arrival *as, int n) {
    for (int i = 0; i < n; i++) {
        dg_tensor_free(&as[i].answer);
        dg_status_free(&as[i].st);
    }
}

static arrival at(coord *c, int64_t task, int64_t kind, int64_t epoch) {
    return (arrival){.c = c, .task = task, .kind = kind, .epoch = epoch, .fingerprint = 77};
}

static void test_epochs(void **state) {
    (void)state;
    coord c;
    coord_new(&c, 2, 60000);
    // The first epoch waits for two; the joiners are ranked by task.
    arrival r1[2] = {at(&c, 3, JOIN, -1), at(&c, 1, JOIN, -1)};
    r1[0].delay_ms = 0;
    r1[1].delay_ms = 200;
    round_of(r1, 2);
    const int64_t m0[2] = {1, 3};
    for (int i = 0; i < 2; i++) expect_answer(&r1[i], 0, m0, 2);
    assert_true(r1[0].took_s >= 0.19);   // it waited for the second
    done(r1, 2);
    // A commit of both keeps the epoch.
    arrival r2[2] = {at(&c, 1, COMMIT, 0), at(&c, 3, COMMIT, 0)};
    round_of(r2, 2);
    for (int i = 0; i < 2; i++) expect_answer(&r2[i], 0, m0, 2);
    done(r2, 2);
    // Task 0 joins: it waits for the members' next commit, and comes after them.
    arrival r3[3] = {at(&c, 0, JOIN, -1), at(&c, 3, COMMIT, 0), at(&c, 1, COMMIT, 0)};
    r3[1].delay_ms = 150;
    r3[2].delay_ms = 250;
    round_of(r3, 3);
    const int64_t m1[3] = {1, 3, 0};
    for (int i = 0; i < 3; i++) expect_answer(&r3[i], 1, m1, 3);
    assert_true(r3[0].took_s >= 0.24);
    done(r3, 3);
    // Task 3 is lost: task 1 says so; the epoch forms without waiting for it.
    arrival r4[2] = {at(&c, 1, REFORM, 1), at(&c, 0, REFORM, 1)};
    r4[0].n_lost = 1;
    r4[0].lost[0] = 3;
    round_of(r4, 2);
    const int64_t m2[2] = {1, 0};
    for (int i = 0; i < 2; i++) expect_answer(&r4[i], 2, m2, 2);
    done(r4, 2);
    coord_free(&c);
}

// A member that does not come to a commit is left out at the deadline; the one that came is
// answered then, not before.
static void test_commit_deadline(void **state) {
    (void)state;
    coord c;
    coord_new(&c, 2, 300);
    arrival r1[2] = {at(&c, 0, JOIN, -1), at(&c, 1, JOIN, -1)};
    round_of(r1, 2);
    const int64_t m0[2] = {0, 1};
    for (int i = 0; i < 2; i++) expect_answer(&r1[i], 0, m0, 2);
    done(r1, 2);
    arrival r2[1] = {at(&c, 0, COMMIT, 0)};
    round_of(r2, 1);
    const int64_t m1[1] = {0};
    expect_answer(&r2[0], 1, m1, 1);
    print_message("the commit ended at its deadline after %.3f s\n", r2[0].took_s);
    assert_true(r2[0].took_s >= 0.29);
    done(r2, 1);
    // The one left out comes late, with its old epoch: it is taken in at the next commit, after
    // the member that kept its state.
    arrival r3[2] = {at(&c, 1, COMMIT, 0), at(&c, 0, COMMIT, 1)};
    r3[1].delay_ms = 100;
    round_of(r3, 2);
    const int64_t m2[2] = {0, 1};
    for (int i = 0; i < 2; i++) expect_answer(&r3[i], 2, m2, 2);
    done(r3, 2);
    coord_free(&c);
}

static void test_refusals(void **state) {
    (void)state;
    coord c;
    coord_new(&c, 1, 60000);
    arrival a[1] = {at(&c, 0, JOIN, -1)};
    round_of(a, 1);
    const int64_t m0[1] = {0};
    expect_answer(&a[0], 0, m0, 1);
    done(a, 1);
    // Another model: refused, naming the task and both fingerprints; the group is unchanged.
    arrival b[1] = {at(&c, 1, JOIN, -1)};
    b[0].fingerprint = 78;
    round_of(b, 1);
    assert_status(b[0].st, DG_FAILED_PRECONDITION, "refused task 1: its variables");
    assert_non_null(strstr(dg_status_message(b[0].st), "000000000000004e"));
    assert_non_null(strstr(dg_status_message(b[0].st), "000000000000004d"));
    done(b, 1);
    arrival d[1] = {at(&c, 0, COMMIT, 0)};
    round_of(d, 1);
    expect_answer(&d[0], 0, m0, 1);
    done(d, 1);
    // Bad inputs: a kind that is none, a negative task.
    arrival e[2] = {at(&c, 0, 7, 0), at(&c, -2, COMMIT, 0)};
    round_of(e, 2);
    assert_status(e[0].st, DG_INVALID_ARGUMENT, "kind 7");
    assert_status(e[1].st, DG_INVALID_ARGUMENT, "task -2");
    done(e, 2);
    coord_free(&c);
}

// A member that finished: the member still at its commit goes on without it, a joiner waiting
// and one that comes later are told the job has ended ([-2]).
static void test_done(void **state) {
    (void)state;
    coord c;
    coord_new(&c, 2, 60000);
    arrival r1[2] = {at(&c, 0, JOIN, -1), at(&c, 1, JOIN, -1)};
    round_of(r1, 2);
    const int64_t m0[2] = {0, 1};
    for (int i = 0; i < 2; i++) expect_answer(&r1[i], 0, m0, 2);
    done(r1, 2);
    arrival r2[3] = {at(&c, 0, COMMIT, 0), at(&c, 2, JOIN, -1), at(&c, 1, 3, 0)};
    r2[2].delay_ms = 200;
    round_of(r2, 3);
    const int64_t m1[1] = {0};
    expect_answer(&r2[0], 1, m1, 1);   // task 1 is done: a new epoch of task 0 alone
    const int64_t ended[1] = {-2};
    assert_ok(r2[1].st);
    assert_int_equal(dg_tensor_num_elements(r2[1].answer), 1);
    assert_int_equal(dg_tensor_i64(r2[1].answer)[0], ended[0]);
    assert_ok(r2[2].st);
    assert_true(r2[0].took_s < 30 && r2[1].took_s < 30);
    done(r2, 3);
    arrival r3[1] = {at(&c, 3, JOIN, -1)};
    round_of(r3, 1);
    assert_ok(r3[0].st);
    assert_int_equal(dg_tensor_i64(r3[0].answer)[0], -2);
    done(r3, 1);
    coord_free(&c);
}

static void test_hook_options(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_elastic_options o = dg_elastic_options_default();
    assert_null(dg_elastic_hook_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "option server");
    char spec[128];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d", dg_test_free_port());
    dg_cluster *cl = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *srv = dg_server_new(cl, "worker", 0, &so, st);
    assert_ok(st);
    o.server = srv;
    o.commit_steps = 0;
    assert_null(dg_elastic_hook_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "option commit_steps");
    o.commit_steps = 10;
    o.job = "ps";
    assert_null(dg_elastic_hook_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "not a task of job \"ps\"");
    o.job = NULL;
    o.coordinator = "/device:CPU:0";
    assert_null(dg_elastic_hook_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "names no task");
    o.coordinator = NULL;
    dg_session_hook *h = dg_elastic_hook_new(&o, st);
    assert_ok(st);
    dg_elastic_stats es;
    assert_true(dg_elastic_hook_stats(h, &es));
    assert_int_equal(es.epoch, -1);
    dg_session_hook *other = dg_stop_after_steps_hook_new(5, st);
    assert_false(dg_elastic_hook_stats(other, &es));
    dg_session_hook_free(&other);
    dg_session_hook_free(&h);
    dg_server_free(&srv);
    dg_cluster_free(&cl);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epochs),
        cmocka_unit_test(test_commit_deadline),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_done),
        cmocka_unit_test(test_hook_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
