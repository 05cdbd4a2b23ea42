/* Sync replicas: accumulator and token-queue kernels in a local session, and the optimizer in
 * in-process clusters (one ps, N workers, real ZeroMQ on free 127.0.0.1 ports): exactness
 * against one big-batch local step, stale and backup gradients, the take's deadline naming
 * the missing worker, cancellation by an aborted step, and the hook's stop at the last step. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "graph_impl.h"
#include "timer_impl.h"

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


// ---- kernels in a local session ----
static dg_node *accum_node(dg_graph *g, const char *type, const char *shared, dg_dtype dt, dg_shape sh) {
    dg_node *n = graph_begin(g, type, NULL);
    graph_set_attr_string(n, "shared_name", shared);
    graph_set_attr_type(n, "dtype", dt);
    graph_set_attr_shape(n, "shape", sh);
    return n;
}

static dg_tensor *f64s(const double *v, int n) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, dg_shape1(n), v, st);
    assert_ok(st);
    dg_status_free(&st);
    return t;
}

static dg_tensor *i64(int64_t v) { return dg_tensor_scalar_i64(v); }

static dg_tensor *i32(int32_t v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_INT32, dg_shape_scalar(), &v, st);
    dg_status_free(&st);
    return t;
}

typedef struct local_acc {
    dg_graph *g;
    dg_session *s;
    dg_output step, grad, num_required, new_step, count;
    dg_node *apply, *set_step, *set_live;
    dg_output take, live;
} local_acc;

static void local_acc_build(local_acc *a, int64_t timeout_ms, int total_replicas, int replica) {
    a->g = dg_graph_new();
    dg_graph *g = a->g;
    a->step = dg_placeholder(g, "local_step", DG_INT64, dg_shape_scalar());
    a->grad = dg_placeholder(g, "grad", DG_FLOAT64, dg_shape1(-1));
    a->num_required = dg_placeholder(g, "num_required", DG_INT32, dg_shape_scalar());
    a->new_step = dg_placeholder(g, "new_step", DG_INT64, dg_shape_scalar());
    dg_node *n = accum_node(g, "AccumulatorApplyGradient", "acc", DG_FLOAT64, dg_shape1(3));
    graph_add_input(n, a->step);
    graph_add_input(n, a->grad);
    graph_set_attr_int(n, "replica", replica);
    a->apply = graph_finish(n);
    n = accum_node(g, "AccumulatorTakeGradient", "acc", DG_FLOAT64, dg_shape1(3));
    graph_add_input(n, a->num_required);
    graph_set_attr_int(n, "timeout_ms", timeout_ms);
    graph_set_attr_int(n, "total_replicas", total_replicas);
    a->take = (dg_output){graph_finish(n), 0};
    n = accum_node(g, "AccumulatorSetGlobalStep", "acc", DG_FLOAT64, dg_shape1(3));
    graph_add_input(n, a->new_step);
    a->set_step = graph_finish(n);
    a->count = (dg_output){graph_finish(accum_node(g, "AccumulatorNumAccumulated", "acc", DG_FLOAT64, dg_shape1(3))), 0};
    a->live = dg_placeholder(g, "live", DG_INT32, dg_shape_scalar());
    n = accum_node(g, "AccumulatorSetLiveReplicas", "acc", DG_FLOAT64, dg_shape1(3));
    graph_add_input(n, a->live);
    a->set_live = graph_finish(n);
    assert_ok(dg_graph_status(g));
    dg_status *st = dg_status_new();
    a->s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    dg_status_free(&st);
}

static void local_acc_free(local_acc *a) {
    dg_session_free(&a->s);
    dg_graph_free(&a->g);
}

static bool acc_apply(local_acc *a, int64_t step, const double *v, int n, dg_status *st) {
    dg_output feeds[2] = {a->step, a->grad};
    dg_tensor *vals[2] = {i64(step), f64s(v, n)};
    bool ok = dg_session_run(a->s, feeds, vals, 2, NULL, NULL, 0, &a->apply, 1, st);
    dg_tensor_unref(vals[0]);
    dg_tensor_unref(vals[1]);
    return ok;
}

static int acc_count(local_acc *a) {
    dg_status *st = dg_status_new();
    dg_tensor *t = NULL;
    assert_true(dg_session_run(a->s, NULL, NULL, 0, &a->count, &t, 1, NULL, 0, st));
    int c = dg_tensor_i32(t)[0];
    dg_tensor_unref(t);
    dg_status_free(&st);
    return c;
}

static dg_tensor *acc_take(local_acc *a, int32_t num_required, dg_status *st) {
    dg_tensor *nr = i32(num_required), *out = NULL;
    dg_session_run(a->s, &a->num_required, &nr, 1, &a->take, &out, 1, NULL, 0, st);
    dg_tensor_unref(nr);
    return out;
}

static void test_accumulator_average_and_stale(void **state) {
    local_acc a;
    local_acc_build(&a, 0, 0, 0);
    dg_status *st = dg_status_new();
    double g1[3] = {1, 2, 3}, g2[3] = {3, 4, 5.5}, g3[3] = {100, 100, 100};
    assert_true(acc_apply(&a, 0, g1, 3, st));
    assert_true(acc_apply(&a, 0, g2, 3, st));
    dg_tensor *avg = acc_take(&a, 2, st);
    assert_ok(st);
    assert_true(dg_tensor_f64(avg)[0] == 2.0 && dg_tensor_f64(avg)[1] == 3.0 && dg_tensor_f64(avg)[2] == 4.25);
    dg_tensor_unref(avg);
    // The take moved the accumulator to step 1: a gradient of step 0 is stale and dropped.
    assert_true(acc_apply(&a, 0, g3, 3, st));
    assert_int_equal(acc_count(&a), 0);
    assert_true(acc_apply(&a, 1, g1, 3, st));
    assert_int_equal(acc_count(&a), 1);
    // Moving the step drops what was accumulated for the old one.
    dg_tensor *ns = i64(5);
    assert_true(dg_session_run(a.s, &a.new_step, &ns, 1, NULL, NULL, 0, &a.set_step, 1, st));
    dg_tensor_unref(ns);
    assert_int_equal(acc_count(&a), 0);
    assert_true(acc_apply(&a, 4, g3, 3, st));
    assert_int_equal(acc_count(&a), 0);
    assert_true(acc_apply(&a, 6, g2, 3, st));
    avg = acc_take(&a, 1, st);
    assert_ok(st);
    assert_true(dg_tensor_f64(avg)[2] == 5.5);
    dg_tensor_unref(avg);
    // Gradients computed at exactly the new step are kept (a worker that recovered first
    // applies at the restored step before the chief sets it); any other step drops the sum.
    assert_true(acc_apply(&a, 9, g1, 3, st));
    ns = i64(9);
    assert_true(dg_session_run(a.s, &a.new_step, &ns, 1, NULL, NULL, 0, &a.set_step, 1, st));
    assert_int_equal(acc_count(&a), 1);
    assert_true(acc_apply(&a, 9, g2, 3, st));
    assert_true(acc_apply(&a, 11, g3, 3, st));
    assert_true(dg_session_run(a.s, &a.new_step, &ns, 1, NULL, NULL, 0, &a.set_step, 1, st));
    dg_tensor_unref(ns);
    assert_int_equal(acc_count(&a), 0);
    assert_true(acc_apply(&a, 9, g2, 3, st));
    avg = acc_take(&a, 1, st);
    assert_ok(st);
    assert_true(dg_tensor_f64(avg)[0] == 3.0 && dg_tensor_f64(avg)[2] == 5.5);
    dg_tensor_unref(avg);
    // num_required below 1 is rejected before touching the accumulator.
    assert_null(acc_take(&a, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "accumulator \"acc\": num_required must be >= 1, got 0");
    dg_status_free(&st);
    local_acc_free(&a);
}

static void test_accumulator_bad_inputs(void **state) {
    local_acc a;
    local_acc_build(&a, 0, 0, 0);
    dg_status *st = dg_status_new();
    double g4[4] = {1, 2, 3, 4};
    assert_false(acc_apply(&a, 0, g4, 4, st));
    assert_status(st, DG_INVALID_ARGUMENT, "accumulator \"acc\" holds float64 [3] gradients, got float64 [4]");
    // A float32 gradient is refused when the graph is built, naming the accumulator.
    dg_graph *g = dg_graph_new();
    dg_output step = dg_placeholder(g, "s", DG_INT64, dg_shape_scalar());
    dg_output grad = dg_placeholder(g, "g", DG_FLOAT32, dg_shape1(3));
    dg_node *n = accum_node(g, "AccumulatorApplyGradient", "acc", DG_FLOAT64, dg_shape1(3));
    graph_add_input(n, step);
    graph_add_input(n, grad);
    assert_null(graph_finish(n));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "accumulator \"acc\" holds float64 [3] gradients, got float32 [3]");
    dg_graph_free(&g);
    // Two ops declaring one accumulator differently: the second kernel is refused.
    g = dg_graph_new();
    dg_output c1 = {graph_finish(accum_node(g, "AccumulatorNumAccumulated", "acc", DG_FLOAT64, dg_shape1(3))), 0};
    dg_output c2 = {graph_finish(accum_node(g, "AccumulatorNumAccumulated", "acc", DG_FLOAT32, dg_shape1(2))), 0};
    dg_session *s = dg_session_new(g, "local", NULL, st);
    dg_tensor *out = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &c1, &out, 1, NULL, 0, st));
    dg_tensor_unref(out);
    assert_false(dg_session_run(s, NULL, NULL, 0, &c2, &out, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "accumulator \"acc\" on ");
    assert_non_null(strstr(dg_status_message(st), "holds float64 [3] gradients; this op declares float32 [2]"));
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
    local_acc_free(&a);
}

static void test_take_deadline_names_missing_replicas(void **state) {
    local_acc a;
    local_acc_build(&a, 150, 3, 0);
    dg_status *st = dg_status_new();
    double g1[3] = {1, 2, 3};
    assert_true(acc_apply(&a, 0, g1, 3, st));
    int64_t t0 = now_ms();
    assert_null(acc_take(&a, 2, st));
    int64_t took = now_ms() - t0;
    assert_true(took >= 140);   // not early; the message says the deadline ended it (no upper bound: valgrind)
    assert_status(st, DG_DEADLINE_EXCEEDED,
                  "sync replicas: global step 0: got 1 of 2 gradients within 150 ms; no gradient from worker "
                  "task 1 (never contributed), worker task 2 (never contributed)");
    assert_int_equal(acc_count(&a), 1);   // nothing was taken
    assert_int_equal(exec_timer_pending(), 0);
    dg_status_free(&st);
    local_acc_free(&a);
}

// AccumulatorSetLiveReplicas: a take waiting for 3 gradients with 2 in ends, with the average of
// those 2, as soon as the live count drops to 2; with the cap lifted (0) a take needs its
// num_required again; a negative count is refused.
typedef struct take_job {
    local_acc *a;
    int32_t num_required;
    dg_tensor *out;
    dg_status *st;
} take_job;

static void *take_thread(void *arg) {
    take_job *j = arg;
    j->out = acc_take(j->a, j->num_required, j->st);
    return NULL;
}

static bool acc_set_live(local_acc *a, int32_t n, dg_status *st) {
    dg_tensor *v = i32(n);
    bool ok = dg_session_run(a->s, &a->live, &v, 1, NULL, NULL, 0, &a->set_live, 1, st);
    dg_tensor_unref(v);
    return ok;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_live_count_ends_waiting_take(void **state) {
    (void)state;
    local_acc a;
    local_acc_build(&a, 20000, 3, 0);
    dg_status *st = dg_status_new();
    double g1[3] = {1, 2, 3}, g2[3] = {3, 4, 5}, g3[3] = {5, 6, 7};
    assert_true(acc_apply(&a, 0, g1, 3, st));
    assert_true(acc_apply(&a, 0, g2, 3, st));
    take_job j = {&a, 3, NULL, dg_status_new()};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, take_thread, &j), 0);
    nap_ms(500);   // the take parks meanwhile (were it late, the cap would serve it at once: no failure)
    assert_int_equal(acc_count(&a), 2);   // the take still waits for a third
    int64_t t0 = now_ms();
    assert_true(acc_set_live(&a, 2, st));
    pthread_join(t, NULL);
    assert_ok(j.st);
    assert_non_null(j.out);
    assert_true(now_ms() - t0 < 10000);   // ended by the count, not by its 20 s deadline
    const double *avg = dg_tensor_data(j.out);
    assert_true(avg[0] == 2.0 && avg[1] == 3.0 && avg[2] == 4.0);
    dg_tensor_unref(j.out);
    assert_int_equal(acc_count(&a), 0);
    // Capped at 2, a take of 3 ends with 2 at once.
    assert_true(acc_apply(&a, 1, g1, 3, st));
    assert_true(acc_apply(&a, 1, g2, 3, st));
    dg_tensor *two = acc_take(&a, 3, st);
    assert_ok(st);
    assert_non_null(two);
    dg_tensor_unref(two);
    // The cap lifted (0), a take of 3 with 2 in waits until the third comes.
    assert_true(acc_set_live(&a, 0, st));
    assert_true(acc_apply(&a, 2, g1, 3, st));
    assert_true(acc_apply(&a, 2, g2, 3, st));
    j = (take_job){&a, 3, NULL, j.st};
    assert_int_equal(pthread_create(&t, NULL, take_thread, &j), 0);
    nap_ms(200);
    assert_int_equal(acc_count(&a), 2);
    assert_true(acc_apply(&a, 2, g3, 3, st));
    pthread_join(t, NULL);
    assert_ok(j.st);
    avg = dg_tensor_data(j.out);
    assert_true(avg[0] == 3.0 && avg[1] == 4.0 && avg[2] == 5.0);
    dg_tensor_unref(j.out);
    assert_false(acc_set_live(&a, -1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "live replica count must be an int32 scalar >= 0");
    dg_status_free(&j.st);
    dg_status_free(&st);
    local_acc_free(&a);
}

typedef struct queue_ops {
    dg_graph *g;
    dg_session *s;
    dg_output values, code, reason, size, deq;
    dg_node *enq, *close;
} queue_ops;

static void queue_build(queue_ops *q, int64_t timeout_ms) {
    q->g = dg_graph_new();
    dg_graph *g = q->g;
    q->values = dg_placeholder(g, "values", DG_INT64, dg_shape1(-1));
    q->code = dg_placeholder(g, "code", DG_INT32, dg_shape_scalar());
    q->reason = dg_placeholder(g, "reason", DG_UINT8, dg_shape1(-1));
    dg_node *n = graph_begin(g, "QueueEnqueueMany", NULL);
    graph_set_attr_string(n, "shared_name", "q");
    graph_add_input(n, q->values);
    q->enq = graph_finish(n);
    n = graph_begin(g, "QueueDequeue", NULL);
    graph_set_attr_string(n, "shared_name", "q");
    graph_set_attr_int(n, "timeout_ms", timeout_ms);
    q->deq = (dg_output){graph_finish(n), 0};
    n = graph_begin(g, "QueueSize", NULL);
    graph_set_attr_string(n, "shared_name", "q");
    q->size = (dg_output){graph_finish(n), 0};
    n = graph_begin(g, "QueueClose", NULL);
    graph_set_attr_string(n, "shared_name", "q");
    graph_add_input(n, q->code);
    graph_add_input(n, q->reason);
    q->close = graph_finish(n);
    assert_ok(dg_graph_status(g));
    dg_status *st = dg_status_new();
    q->s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    dg_status_free(&st);
}

static void queue_close(queue_ops *q, int32_t code, const char *reason) {
    dg_status *st = dg_status_new();
    size_t len = strlen(reason);
    dg_tensor *r = dg_tensor_new(DG_UINT8, dg_shape1((int64_t)len), st);
    memcpy(dg_tensor_data(r), reason, len);
    dg_output feeds[2] = {q->code, q->reason};
    dg_tensor *vals[2] = {i32(code), r};
    assert_true(dg_session_run(q->s, feeds, vals, 2, NULL, NULL, 0, &q->close, 1, st));
    assert_ok(st);
    dg_tensor_unref(vals[0]);
    dg_tensor_unref(vals[1]);
    dg_status_free(&st);
}

static int64_t queue_dequeue(queue_ops *q, dg_status *st) {
    dg_tensor *t = NULL;
    if (!dg_session_run(q->s, NULL, NULL, 0, &q->deq, &t, 1, NULL, 0, st)) return -1;
    int64_t v = dg_tensor_i64(t)[0];
    dg_tensor_unref(t);
    return v;
}

static void test_token_queue(void **state) {
    queue_ops q;
    queue_build(&q, 100);
    dg_status *st = dg_status_new();
    int64_t v[3] = {7, 8, 9};
    dg_tensor *vt = dg_tensor_from_data(DG_INT64, dg_shape1(3), v, st);
    assert_true(dg_session_run(q.s, &q.values, &vt, 1, NULL, NULL, 0, &q.enq, 1, st));
    assert_int_equal(queue_dequeue(&q, st), 7);
    assert_int_equal(queue_dequeue(&q, st), 8);
    // Closed normally: what is queued is still handed out, then OUT_OF_RANGE.
    queue_close(&q, 0, "done");
    assert_int_equal(queue_dequeue(&q, st), 9);
    assert_int_equal(queue_dequeue(&q, st), -1);
    assert_status(st, DG_OUT_OF_RANGE, "queue \"q\" is closed and empty: done");
    assert_false(dg_session_run(q.s, &q.values, &vt, 1, NULL, NULL, 0, &q.enq, 1, st));
    assert_status(st, DG_CANCELLED, "queue \"q\" is closed");
    // Reopened: an empty queue waits until its deadline.
    queue_close(&q, -1, "");
    int64_t t0 = now_ms();
    assert_int_equal(queue_dequeue(&q, st), -1);
    assert_true(now_ms() - t0 >= 90);
    assert_status(st, DG_DEADLINE_EXCEEDED, "queue \"q\": nothing to dequeue within 100 ms");
    // Closed with an error: dequeues fail with that code and reason.
    queue_close(&q, DG_DEADLINE_EXCEEDED, "the take timed out");
    assert_int_equal(queue_dequeue(&q, st), -1);
    assert_status(st, DG_DEADLINE_EXCEEDED, "queue \"q\" was closed: the take timed out");
    dg_tensor_unref(vt);
    dg_status_free(&st);
    dg_session_free(&q.s);
    dg_graph_free(&q.g);
}

// ---- the optimizer in in-process clusters ----
#define B 3   // examples per worker

typedef struct replica {
    dg_graph *g;
    dg_sync_replicas *sr;
    dg_output x, t, w, b, gs, loss;
    dg_node *train, *init;
    dg_session *s;
} replica;

static const double W0[6] = {0.1, -0.2, 0.3, 0.05, -0.15, 0.25};
static const double B0[2] = {0.01, -0.02};

static void data(int n, double *x, double *t) {
    uint64_t seed = 12345;
    for (int i = 0; i < n * 3; i++) x[i] = dg_test_uniform(&seed, -1, 1);
    for (int i = 0; i < n * 2; i++) t[i] = dg_test_uniform(&seed, -1, 1);
}

// The model: mean((tanh(x w + b) - t)^2), Adam. With sr_opts NULL, a plain local model.
static void build_replica(replica *r, int task, const dg_sync_replicas_options *so) {
    dg_status *st = dg_status_new();
    memset(r, 0, sizeof *r);
    r->g = dg_graph_new();
    dg_graph *g = r->g;
    char dev[64];
    if (so) dg_graph_push_device(g, "/job:ps/task:0");
    dg_tensor *w0 = dg_tensor_from_data(DG_FLOAT64, dg_shape2(3, 2), W0, st);
    dg_tensor *b0 = dg_tensor_from_data(DG_FLOAT64, dg_shape1(2), B0, st);
    r->w = dg_variable(g, "w", DG_FLOAT64, dg_shape2(3, 2), dg_init_tensor(w0));
    r->b = dg_variable(g, "b", DG_FLOAT64, dg_shape1(2), dg_init_tensor(b0));
    dg_tensor_unref(w0);
    dg_tensor_unref(b0);
    r->gs = dg_global_step(g);
    if (so) {
        dg_graph_pop_device(g);
        snprintf(dev, sizeof dev, "/job:worker/task:%d", task);
        dg_graph_push_device(g, dev);
    }
    r->x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, 3));
    r->t = dg_placeholder(g, "t", DG_FLOAT64, dg_shape2(-1, 2));
    dg_output y = dg_tanh(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, r->x, r->w, false, false), r->b));
    r->loss = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, y, r->t)), NULL, 0, false);
    dg_optimizer opt = dg_adam(g, 0.05);
    if (so) {
        r->sr = dg_sync_replicas_new(&opt, so, st);
        assert_ok(st);
        r->train = dg_sync_replicas_minimize(r->sr, r->loss, r->gs, st);
        assert_ok(st);
    } else {
        r->train = dg_optimizer_minimize(&opt, r->loss, r->gs);
    }
    if (so) dg_graph_pop_device(g);
    r->init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    dg_status_free(&st);
}

static void free_replica(replica *r) {
    dg_session_free(&r->s);
    dg_sync_replicas_free(&r->sr);
    dg_graph_free(&r->g);
}

typedef struct cluster {
    int n;
    dg_cluster *c;
    dg_server *ps;
    dg_server *workers[8];
} cluster;

static void cluster_start(cluster *cl, int n_workers, int64_t rpc_timeout_ms) {
    dg_status *st = dg_status_new();
    char spec[512];
    int len = snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|", dg_test_free_port());
    for (int i = 0; i < n_workers; i++)
        len += snprintf(spec + len, sizeof spec - (size_t)len, "%s127.0.0.1:%d", i ? "," : "", dg_test_free_port());
    cl->n = n_workers;
    cl->c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    so.rpc_timeout_ms = rpc_timeout_ms;
    cl->ps = dg_server_new(cl->c, "ps", 0, &so, st);
    assert_ok(st);
    for (int i = 0; i < n_workers; i++) {
        cl->workers[i] = dg_server_new(cl->c, "worker", i, &so, st);
        assert_ok(st);
    }
    dg_status_free(&st);
}

static void cluster_stop(cluster *cl) {
    for (int i = 0; i < cl->n; i++) dg_server_free(&cl->workers[i]);
    dg_server_free(&cl->ps);
    dg_cluster_free(&cl->c);
}

typedef struct step_job {
    replica *r;
    const double *x, *t;   // this worker's rows
    int rows;
    bool ok;
    dg_status *st;
    bool apply;            // the chief's apply op instead of the train op
    int32_t num_required;
    int64_t new_step;
} step_job;

static void *step_thread(void *arg) {
    step_job *j = arg;
    j->st = dg_status_new();
    if (j->apply) {
        dg_output feed = dg_sync_replicas_num_required(j->r->sr), fetch = dg_sync_replicas_new_global_step(j->r->sr);
        dg_node *target = dg_sync_replicas_chief_apply_op(j->r->sr);
        dg_tensor *nr = i32(j->num_required), *out = NULL;
        j->ok = dg_session_run(j->r->s, &feed, &nr, 1, &fetch, &out, 1, &target, 1, j->st);
        if (j->ok) j->new_step = dg_tensor_i64(out)[0];
        dg_tensor_unref(out);
        dg_tensor_unref(nr);
        return NULL;
    }
    dg_status *st = j->st;
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(j->rows, 3), j->x, st);
    dg_tensor *tt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(j->rows, 2), j->t, st);
    dg_output feeds[2] = {j->r->x, j->r->t};
    dg_tensor *vals[2] = {xt, tt};
    j->ok = dg_session_run(j->r->s, feeds, vals, 2, NULL, NULL, 0, &j->r->train, 1, st);
    dg_tensor_unref(xt);
    dg_tensor_unref(tt);
    return NULL;
}

static void sync_setup(cluster *cl, replica *reps, int n, int r_agg, int64_t timeout_ms, int64_t rpc_timeout_ms) {
    cluster_start(cl, n, rpc_timeout_ms);
    dg_status *st = dg_status_new();
    for (int i = 0; i < n; i++) {
        dg_sync_replicas_options so = dg_sync_replicas_options_default();
        so.replicas_to_aggregate = r_agg;
        so.total_num_replicas = n;
        so.task_index = i;
        so.timeout_ms = timeout_ms;
        build_replica(&reps[i], i, &so);
        reps[i].s = dg_session_new(reps[i].g, dg_server_target(cl->workers[i]), NULL, st);
        assert_ok(st);
    }
    assert_true(dg_session_run_target(reps[0].s, reps[0].init, st));
    assert_ok(st);
    assert_true(dg_session_run_target(reps[0].s, dg_sync_replicas_chief_init_op(reps[0].sr), st));
    for (int i = 1; i < n; i++) assert_true(dg_session_run_target(reps[i].s, dg_sync_replicas_local_step_init_op(reps[i].sr), st));
    assert_ok(st);
    dg_status_free(&st);
}

// Runs a train step on the given workers and one apply, all at once; returns the apply's job.
static void sync_step(replica *reps, const int *which, int n_which, int r_agg, const double *x, const double *t,
                      step_job *jobs, step_job *apply) {
    pthread_t th[9];
    for (int k = 0; k < n_which; k++) {
        int i = which[k];
        jobs[k] = (step_job){&reps[i], x + i * B * 3, t + i * B * 2, B, false, NULL, false, 0, 0};
        assert_int_equal(pthread_create(&th[k], NULL, step_thread, &jobs[k]), 0);
    }
    *apply = (step_job){&reps[0], NULL, NULL, 0, false, NULL, true, r_agg, -1};
    assert_int_equal(pthread_create(&th[n_which], NULL, step_thread, apply), 0);
    for (int k = 0; k <= n_which; k++) pthread_join(th[k], NULL);
}

static int64_t fetch_i64(dg_session *s, dg_output o) {
    dg_status *st = dg_status_new();
    dg_tensor *t = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &o, &t, 1, NULL, 0, st));
    assert_ok(st);
    int64_t v = (int64_t)dg_tensor_get_as_double(t, 0);   // int64 or int32
    dg_tensor_unref(t);
    dg_status_free(&st);
    return v;
}

static void check_exact(int n) {
    double x[8 * B * 3], t[8 * B * 2];
    data(n * B, x, t);
    // One local step with batch n * B.
    replica loc;
    build_replica(&loc, 0, NULL);
    dg_status *st = dg_status_new();
    loc.s = dg_session_new(loc.g, "local", NULL, st);
    assert_true(dg_session_run_target(loc.s, loc.init, st));
    step_job lj = {&loc, x, t, n * B, false, NULL, false, 0, 0};
    step_thread(&lj);
    assert_true(lj.ok);
    dg_status_free(&lj.st);
    // One synchronous step of n workers with B each.
    cluster cl;
    replica reps[8];
    sync_setup(&cl, reps, n, n, 10000, 20000);
    int which[8];
    for (int i = 0; i < n; i++) which[i] = i;
    step_job jobs[8], apply;
    sync_step(reps, which, n, n, x, t, jobs, &apply);
    for (int k = 0; k < n; k++) {
        if (!jobs[k].ok) fail_msg("worker %d: %s", k, dg_status_message(jobs[k].st));
        dg_status_free(&jobs[k].st);
    }
    if (!apply.ok) fail_msg("apply: %s", dg_status_message(apply.st));
    dg_status_free(&apply.st);
    assert_int_equal(apply.new_step, 1);
    dg_output vars[2] = {reps[0].w, reps[0].b}, lvars[2] = {loc.w, loc.b};
    dg_tensor *got[2], *want[2];
    assert_true(dg_session_run(reps[0].s, NULL, NULL, 0, vars, got, 2, NULL, 0, st));
    assert_true(dg_session_run(loc.s, NULL, NULL, 0, lvars, want, 2, NULL, 0, st));
    double max_move = 0;
    for (int v = 0; v < 2; v++) {
        assert_close_f64_msg(dg_tensor_f64(got[v]), dg_tensor_f64(want[v]), dg_tensor_num_elements(got[v]), 1e-10, 0,
                             "sync %d workers: %s against the local step", n, v == 0 ? "w" : "b");
        for (int64_t i = 0; i < dg_tensor_num_elements(got[v]); i++) {
            double m = dg_tensor_f64(want[v])[i] - (v == 0 ? W0[i] : B0[i]);
            if (m < 0) m = -m;
            if (m > max_move) max_move = m;   // want is finite: checked above
        }
    }
    printf("sync %d workers: the same as the local step (parameters moved up to %g)\n", n, max_move);
    assert_true(max_move > 1e-3);
    for (int i = 0; i < n; i++) {
        assert_int_equal(fetch_i64(reps[i].s, reps[i].gs), 1);
        assert_int_equal(fetch_i64(reps[i].s, dg_sync_replicas_local_step(reps[i].sr)), 1);
    }
    for (int v = 0; v < 2; v++) {
        dg_tensor_unref(got[v]);
        dg_tensor_unref(want[v]);
    }
    for (int i = 0; i < n; i++) free_replica(&reps[i]);
    cluster_stop(&cl);
    free_replica(&loc);
    dg_status_free(&st);
}

static void test_exact_2_workers(void **state) { check_exact(2); }
static void test_exact_4_workers(void **state) { check_exact(4); }

// 3 workers, 2 gradients per step: the third worker's gradient of the old step is dropped and
// it still gets a token.
static void test_backup_worker(void **state) {
    double x[3 * B * 3], t[3 * B * 2];
    data(3 * B, x, t);
    cluster cl;
    replica reps[3];
    sync_setup(&cl, reps, 3, 2, 10000, 20000);
    int which[2] = {0, 1};
    step_job jobs[2], apply;
    sync_step(reps, which, 2, 2, x, t, jobs, &apply);
    assert_true(jobs[0].ok && jobs[1].ok && apply.ok);
    for (int k = 0; k < 2; k++) dg_status_free(&jobs[k].st);
    dg_status_free(&apply.st);
    step_job late = {&reps[2], x + 2 * B * 3, t + 2 * B * 2, B, false, NULL, false, 0, 0};
    step_thread(&late);
    if (!late.ok) fail_msg("late worker: %s", dg_status_message(late.st));
    dg_status_free(&late.st);
    assert_int_equal(fetch_i64(reps[2].s, dg_sync_replicas_num_accumulated(reps[2].sr, 0)), 0);
    assert_int_equal(fetch_i64(reps[2].s, dg_sync_replicas_local_step(reps[2].sr)), 1);
    assert_int_equal(fetch_i64(reps[0].s, reps[0].gs), 1);
    for (int i = 0; i < 3; i++) free_replica(&reps[i]);
    cluster_stop(&cl);
}

static void close_with(replica *r, const dg_status *why) {
    dg_status *st = dg_status_new();
    dg_output feeds[2];
    dg_node *close = dg_sync_replicas_close_queue_op(r->sr, &feeds[0], &feeds[1]);
    const char *msg = dg_status_message(why);
    dg_tensor *reason = dg_tensor_new(DG_UINT8, dg_shape1((int64_t)strlen(msg)), st);
    memcpy(dg_tensor_data(reason), msg, strlen(msg));
    dg_tensor *vals[2] = {i32((int32_t)dg_status_code(why)), reason};
    assert_true(dg_session_run(r->s, feeds, vals, 2, NULL, NULL, 0, &close, 1, st));
    dg_tensor_unref(vals[0]);
    dg_tensor_unref(vals[1]);
    dg_status_free(&st);
}

// Worker 1 stops contributing: the take fails at its deadline naming it, and closing the queue
// with that error fails worker 0's wait for its token with the same cause.
static void test_missing_worker(void **state) {
    double x[2 * B * 3], t[2 * B * 2];
    data(2 * B, x, t);
    cluster cl;
    replica reps[2];
    sync_setup(&cl, reps, 2, 2, 300, 20000);
    int both[2] = {0, 1}, only0[1] = {0};
    step_job jobs[2], apply;
    sync_step(reps, both, 2, 2, x, t, jobs, &apply);
    assert_true(jobs[0].ok && jobs[1].ok && apply.ok);
    for (int k = 0; k < 2; k++) dg_status_free(&jobs[k].st);
    dg_status_free(&apply.st);
    // Step 1 without worker 1: worker 0 waits for its token while the take times out.
    pthread_t th;
    jobs[0] = (step_job){&reps[0], x, t, B, false, NULL, false, 0, 0};
    assert_int_equal(pthread_create(&th, NULL, step_thread, &jobs[0]), 0);
    apply = (step_job){&reps[0], NULL, NULL, 0, false, NULL, true, 2, -1};
    int64_t t0 = now_ms();
    step_thread(&apply);
    int64_t took = now_ms() - t0;
    assert_false(apply.ok);
    assert_status(apply.st, DG_DEADLINE_EXCEEDED, "sync replicas: global step 1: got 1 of 2 gradients within 300 ms; "
                  "no gradient from worker task 1 (last contributed at step 0)");
    assert_true(took >= 290);   // not early; the message says the deadline ended it
    close_with(&reps[0], apply.st);
    pthread_join(th, NULL);
    assert_false(jobs[0].ok);
    assert_status(jobs[0].st, DG_DEADLINE_EXCEEDED, "no gradient from worker task 1 (last contributed at step 0)");
    assert_non_null(strstr(dg_status_message(jobs[0].st), "queue \"sync_token_q\" was closed"));
    dg_status_free(&jobs[0].st);
    dg_status_free(&apply.st);
    (void)only0;
    for (int i = 0; i < 2; i++) free_replica(&reps[i]);
    cluster_stop(&cl);
}

// A worker's step whose deadline passes while it waits on the ps for a token is aborted there:
// the dequeue ends (its timer is cancelled) instead of holding a ps thread and stealing a token.
static void test_abort_cancels_dequeue(void **state) {
    double x[2 * B * 3], t[2 * B * 2];
    data(2 * B, x, t);
    cluster cl;
    replica reps[2];
    sync_setup(&cl, reps, 2, 2, 30000, 400);
    int64_t t0 = now_ms();
    step_job j = {&reps[0], x, t, B, false, NULL, false, 0, 0};
    step_thread(&j);
    assert_false(j.ok);
    assert_true(now_ms() - t0 < 5000);
    dg_status_free(&j.st);
    // The ps learns of the abort by message: wait for the dequeue's deadline timer to go.
    int64_t deadline = now_ms() + 5000;
    while (exec_timer_pending() > 0 && now_ms() < deadline) usleep(10000);
    assert_int_equal(exec_timer_pending(), 0);
    assert_int_equal(fetch_i64(reps[1].s, dg_sync_replicas_num_accumulated(reps[1].sr, 0)), 1);
    for (int i = 0; i < 2; i++) free_replica(&reps[i]);
    cluster_stop(&cl);
}

// The hook in monitored sessions: training stops at the last step exactly, workers see the
// end (a token of the last step, or OUT_OF_RANGE from the closed queue).
typedef struct mts_job {
    replica *r;
    cluster *cl;
    int task;
    int64_t last_step;
    const double *x, *t;
    int64_t final_step;
    int runs;
    dg_status *st;
} mts_job;

static void *mts_thread(void *arg) {
    mts_job *j = arg;
    dg_status *st = j->st = dg_status_new();
    dg_session_hook *sync = dg_sync_replicas_hook_new(j->r->sr, j->task == 0, dg_server_target(j->cl->workers[j->task]),
                                                      j->last_step, st);
    dg_session_hook *stop = dg_stop_at_step_hook_new(-1, j->last_step, st);
    dg_session_hook *hooks[2] = {sync, stop};
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 1;
    dg_mts_options mo = dg_mts_options_default();
    mo.master = dg_server_target(j->cl->workers[j->task]);
    mo.session_options = &so;
    mo.is_chief = j->task == 0;
    mo.hooks = hooks;
    mo.n_hooks = 2;
    mo.wait_for_chief_ms = 20000;
    dg_monitored_session *ms = dg_monitored_session_new(j->r->g, &mo, st);
    if (!ms) goto out;
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(B, 3), j->x, st);
    dg_tensor *tt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(B, 2), j->t, st);
    dg_output feeds[2] = {j->r->x, j->r->t};
    dg_tensor *vals[2] = {xt, tt};
    while (!dg_monitored_session_should_stop(ms)) {
        if (!dg_monitored_session_run(ms, feeds, vals, 2, NULL, NULL, 0, &j->r->train, 1, st)) {
            if (dg_status_code(st) == DG_OUT_OF_RANGE) dg_status_reset(st);
            break;
        }
        j->runs++;
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(tt);
    if (dg_status_ok(st)) {
        dg_session *s = dg_monitored_session_session(ms);
        j->final_step = s ? fetch_i64(s, j->r->gs) : -1;
        if (j->task == 0) dg_monitored_session_close(ms, st);
    }
    dg_monitored_session_free(&ms);
out:
    dg_session_hook_free(&sync);
    dg_session_hook_free(&stop);
    return NULL;
}

static void test_hook_stops_at_last_step(void **state) {
    double x[3 * B * 3], t[3 * B * 2];
    data(3 * B, x, t);
    cluster cl;
    cluster_start(&cl, 3, 20000);
    replica reps[3];
    mts_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        dg_sync_replicas_options so = dg_sync_replicas_options_default();
        so.replicas_to_aggregate = 2;
        so.total_num_replicas = 3;
        so.task_index = i;
        so.timeout_ms = 10000;
        build_replica(&reps[i], i, &so);
        jobs[i] = (mts_job){&reps[i], &cl, i, 7, x + i * B * 3, t + i * B * 2, -1, 0, NULL};
    }
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, mts_thread, &jobs[i]), 0);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    // Each of the 7 applies took 2 gradients, and a worker's gradients all come from
    // successful runs but its last (which may end with the closed queue), so the successful
    // runs number at least 14 - 3. Under load a backup worker may get none of them.
    int runs = 0;
    for (int i = 0; i < 3; i++) {
        if (!dg_status_ok(jobs[i].st)) fail_msg("worker %d: %s", i, dg_status_message(jobs[i].st));
        assert_int_equal(jobs[i].final_step, 7);
        runs += jobs[i].runs;
        dg_status_free(&jobs[i].st);
    }
    assert_true(runs >= 2 * 7 - 3);
    for (int i = 0; i < 3; i++) free_replica(&reps[i]);
    cluster_stop(&cl);
}

static void test_bad_options(void **state) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_optimizer opt = dg_adam(g, 0.1);
    dg_sync_replicas_options o = dg_sync_replicas_options_default();
    o.replicas_to_aggregate = 3;
    o.total_num_replicas = 2;
    assert_null(dg_sync_replicas_new(&opt, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replicas_to_aggregate 3, total_num_replicas 2");
    assert_null(dg_sync_replicas_hook_new(NULL, true, NULL, -1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "sync replicas hook");
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accumulator_average_and_stale),
        cmocka_unit_test(test_accumulator_bad_inputs),
        cmocka_unit_test(test_take_deadline_names_missing_replicas),
        cmocka_unit_test(test_live_count_ends_waiting_take),
        cmocka_unit_test(test_token_queue),
        cmocka_unit_test(test_exact_2_workers),
        cmocka_unit_test(test_exact_4_workers),
        cmocka_unit_test(test_backup_worker),
        cmocka_unit_test(test_missing_worker),
        cmocka_unit_test(test_abort_cancels_dequeue),
        cmocka_unit_test(test_hook_stops_at_last_step),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
