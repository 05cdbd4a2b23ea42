/* The master service over real ZeroMQ in one process: a remote session (a target that is not
 * a server of this process, so the master client and the master service talk over TCP) trains
 * exactly as a local session; graphs that grow are sent again; closing frees every partition;
 * a silent client loses its session after the lease; reset drops the variables; and hostile or
 * malformed requests get a status naming what is wrong while the master keeps serving. A
 * client on the master's host runs its steps through the local channel (fast_channel_impl.h):
 * the same results, answers too large for it parked and taken over the socket, and a region
 * scribbled on by a hostile process answered with a status. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "testutil.h"

#include "fast_channel_impl.h"
#include "master_service_impl.h"
#include "transport_impl.h"

typedef struct cluster2 {
    dg_cluster *c;
    dg_server *ps, *worker;
    int ps_port, worker_port;
    char remote[64];   // the worker's master, by a name no server of this process answers to
} cluster2;

static void start_tasks(cluster2 *t, int64_t lease_ms, bool with_ps) {
    dg_status *st = dg_status_new();
    t->ps_port = dg_test_free_port();
    t->worker_port = dg_test_free_port();
    char spec[128];
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|127.0.0.1:%d", t->ps_port, t->worker_port);
    t->c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    so.client_lease_ms = lease_ms;
    t->ps = with_ps ? dg_server_new(t->c, "ps", 0, &so, st) : NULL;
    assert_ok(st);
    t->worker = dg_server_new(t->c, "worker", 0, &so, st);
    assert_ok(st);
    snprintf(t->remote, sizeof t->remote, "dg://localhost:%d", t->worker_port);
    dg_status_free(&st);
}

static void start(cluster2 *t, int64_t lease_ms) { start_tasks(t, lease_ms, true); }

static void stop(cluster2 *t) {
    dg_server_free(&t->worker);
    dg_server_free(&t->ps);
    dg_cluster_free(&t->c);
}

static dg_server_stats stats(int port) {
    dg_status *st = dg_status_new();
    dg_server_stats s;
    char target[64];
    snprintf(target, sizeof target, "dg://127.0.0.1:%d", port);
    assert_true(dg_server_query_stats(target, NULL, NULL, 5000, &s, st));
    assert_ok(st);
    dg_status_free(&st);
    return s;
}

typedef dg_test_model model;

static void test_remote_matches_local(void **state) {
    (void)state;
    cluster2 t;
    start(&t, 0);
    dg_status *st = dg_status_new();
    model local, remote;
    dg_test_model_build(&local, false);
    dg_test_model_build(&remote, true);
    dg_session *ls = dg_session_new(local.g, "local", NULL, st);
    dg_session *rs = dg_session_new(remote.g, t.remote, NULL, st);
    assert_ok(st);
    double wl[6], wr[6], ll[5], lr[5];
    dg_test_model_train(ls, &local, wl, ll);
    dg_test_model_train(rs, &remote, wr, lr);
    for (int i = 0; i < 5; i++) assert_close(ll[i], lr[i], 0, 1e-12);
    for (int i = 0; i < 6; i++) assert_close(wl[i], wr[i], 1e-12, 0);
    assert_true(lr[4] < lr[0]);
    // The session lives on the worker's master; its partition of the ps lives on the ps.
    assert_int_equal(stats(t.worker_port).master_sessions, 1);
    assert_true(stats(t.ps_port).registered_graphs >= 1);
    // A graph grown after the first run reaches the master with the next run.
    dg_output twice = dg_mul(remote.g, "twice", remote.w, dg_scalar(remote.g, NULL, DG_FLOAT64, 2));
    dg_tensor *tw = NULL;
    assert_true(dg_session_run(rs, NULL, NULL, 0, &twice, &tw, 1, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < 6; i++) assert_close(dg_tensor_f64(tw)[i], 2 * wr[i], 1e-12, 0);
    dg_tensor_unref(tw);
    // Feeds are checked by the client first, by name and dtype.
    dg_tensor *bad = dg_tensor_new(DG_FLOAT32, dg_shape2(2, 3), st);
    assert_false(dg_session_run(rs, &remote.x, &bad, 1, &remote.loss, &tw, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "expected float64, got float32");
    dg_status_reset(st);
    dg_tensor_unref(bad);
    // A second client sees the variables the first one trained (they live on the tasks).
    model again;
    dg_test_model_build(&again, true);
    dg_session *rs2 = dg_session_new(again.g, t.remote, NULL, st);
    assert_ok(st);
    dg_tensor *w2 = NULL;
    assert_true(dg_session_run(rs2, NULL, NULL, 0, &again.w, &w2, 1, NULL, 0, st));
    assert_ok(st);
    assert_memory_equal(dg_tensor_data(w2), wr, sizeof wr);
    dg_tensor_unref(w2);
    dg_session_free(&rs2);
    dg_graph_free(&again.g);
    // Closing frees what the sessions registered, on every task.
    dg_session_free(&rs);
    for (int i = 0; i < 100 && stats(t.ps_port).registered_graphs > 0; i++) usleep(10000);
    assert_int_equal(stats(t.ps_port).registered_graphs, 0);
    assert_int_equal(stats(t.worker_port).master_sessions, 0);
    // Reset: every task of the cluster drops its variables.
    assert_true(dg_session_reset(t.remote, NULL, st));
    assert_ok(st);
    model fresh;
    dg_test_model_build(&fresh, true);
    rs = dg_session_new(fresh.g, t.remote, NULL, st);
    assert_ok(st);
    assert_false(dg_session_run(rs, NULL, NULL, 0, &fresh.w, &w2, 1, NULL, 0, st));
    assert_status(st, DG_FAILED_PRECONDITION, "");
    dg_status_reset(st);
    dg_session_free(&rs);
    dg_session_free(&ls);
    dg_graph_free(&fresh.g);
    dg_graph_free(&local.g);
    dg_graph_free(&remote.g);
    dg_status_free(&st);
    stop(&t);
}

// A raw client: one request, its answer's status.
typedef struct raw {
    rt_transport *tp;
    char ep[64];
} raw;

static void raw_open(raw *r, int port) {
    dg_status *st = dg_status_new();
    rt_transport_options to;
    memset(&to, 0, sizeof to);
    to.name = "raw";
    to.quiet = true;
    r->tp = rt_transport_new(&to, NULL, NULL, st);
    assert_ok(st);
    snprintf(r->ep, sizeof r->ep, "tcp://127.0.0.1:%d", port);
    dg_status_free(&st);
}

// Sends h (consumed) with tensors; returns the answer's handle (0 on failure) and sets st.
static int64_t raw_call(raw *r, rt_header *h, dg_tensor *const *ts, int n, dg_status *st) {
    rt_header *resp = NULL;
    dg_tensor **out = NULL;
    int n_out = 0;
    int64_t handle = 0;
    if (rt_call_sync(r->tp, r->ep, h, ts, n, 5000, &resp, &out, &n_out, st)) {
        handle = resp->handle;
        rt_header_clear(resp);
        free(resp);
        for (int i = 0; i < n_out; i++) dg_tensor_unref(out[i]);
        free(out);
    }
    return handle;
}

static rt_header *req(int type, int64_t handle) {
    rt_header *h = malloc(sizeof *h);
    rt_header_init(h, type);
    h->handle = handle;
    return h;
}

// A session with graph g through a raw CREATE_SESSION; fails the test unless it is made.
static int64_t raw_create(raw *r, const dg_graph *g) {
    dg_status *st = dg_status_new();
    char *buf = NULL;
    size_t len = 0;
    assert_true(dg_graph_to_msgpack(g, &buf, &len, st));
    rt_header *h = req(RT_CREATE_SESSION, 0);
    rt_header_set_blob(h, buf, len);
    free(buf);
    int64_t handle = raw_call(r, h, NULL, 0, st);
    assert_ok(st);
    assert_true(handle != 0);
    dg_status_free(&st);
    return handle;
}

static void test_hostile_requests(void **state) {
    (void)state;
    cluster2 t;
    start(&t, 0);
    dg_status *st = dg_status_new();
    raw r;
    raw_open(&r, t.worker_port);
    // Not a graph.
    rt_header *h = req(RT_CREATE_SESSION, 0);
    rt_header_set_blob(h, "\x93\x01\x02garbage", 10);
    assert_int_equal(raw_call(&r, h, NULL, 0, st), 0);
    assert_status(st, DG_INVALID_ARGUMENT, "the client's graph");
    dg_status_reset(st);
    // No graph at all; an unknown option; an option out of range.
    assert_int_equal(raw_call(&r, req(RT_CREATE_SESSION, 0), NULL, 0, st), 0);
    assert_status(st, DG_INVALID_ARGUMENT, "without a graph");
    dg_status_reset(st);
    model m;
    dg_test_model_build(&m, true);
    char *buf = NULL;
    size_t len = 0;
    assert_true(dg_graph_to_msgpack(m.g, &buf, &len, st));
    const char *bad_opts[] = {"inter_op_threads=100000", "rm_rf=1", "inter_op_threads", "log_device_placement=x"};
    for (size_t i = 0; i < sizeof bad_opts / sizeof *bad_opts; i++) {
        h = req(RT_CREATE_SESSION, 0);
        rt_header_set_blob(h, buf, len);
        rt_header_add_name(h, bad_opts[i]);
        assert_int_equal(raw_call(&r, h, NULL, 0, st), 0);
        assert_status(st, DG_INVALID_ARGUMENT, bad_opts[i]);
        dg_status_reset(st);
    }
    // A graph placed on a task the cluster does not have fails at its first step, named.
    dg_graph *odd = dg_graph_new();
    dg_graph_push_device(odd, "/job:nowhere/task:7");
    dg_output c = dg_scalar(odd, "c", DG_FLOAT32, 1);
    dg_graph_pop_device(odd);
    char *obuf = NULL;
    size_t olen = 0;
    assert_true(dg_graph_to_msgpack(odd, &obuf, &olen, st));
    h = req(RT_CREATE_SESSION, 0);
    rt_header_set_blob(h, obuf, olen);
    int64_t oh = raw_call(&r, h, NULL, 0, st);
    assert_ok(st);
    h = req(RT_RUN_STEP, oh);
    rt_header_add_name(h, "c:0");
    raw_call(&r, h, NULL, 0, st);
    assert_status(st, DG_INVALID_ARGUMENT, "nowhere");
    dg_status_reset(st);
    (void)c;
    // A real session, then malformed steps on it.
    h = req(RT_CREATE_SESSION, 0);
    rt_header_set_blob(h, buf, len);
    int64_t handle = raw_call(&r, h, NULL, 0, st);
    assert_ok(st);
    assert_true(handle != 0);
    struct {
        const char *names[3];
        int n_names, n_feeds, n_values;
        dg_code code;
        const char *needle;
    } cases[] = {
        {{"no_such_node:0"}, 1, 0, 0, DG_NOT_FOUND, "no node \"no_such_node\""},
        {{"w"}, 1, 0, 0, DG_INVALID_ARGUMENT, "is not \"node:index\""},
        {{"w:99"}, 1, 0, 0, DG_INVALID_ARGUMENT, "fetch 0"},
        {{"w:-1"}, 1, 0, 0, DG_INVALID_ARGUMENT, "is not \"node:index\""},
        {{"x:0", "w:0"}, 2, 1, 0, DG_INVALID_ARGUMENT, "1 feeds named, 0 values sent"},
        {{"^w"}, 1, 1, 1, DG_INVALID_ARGUMENT, "feed 0 names a target"},
        {{"x:0", "w:0"}, 2, 1, 1, DG_INVALID_ARGUMENT, "expected float64, got float32"},
    };
    dg_tensor *f32[2] = {dg_tensor_new(DG_FLOAT32, dg_shape2(2, 3), st), dg_tensor_new(DG_FLOAT32, dg_shape2(2, 3), st)};
    memset(dg_tensor_data(f32[0]), 0, 6 * sizeof(float));
    memset(dg_tensor_data(f32[1]), 0, 6 * sizeof(float));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        h = req(RT_RUN_STEP, handle);
        for (int k = 0; k < cases[i].n_names; k++) rt_header_add_name(h, cases[i].names[k]);
        h->n_feeds = cases[i].n_feeds;
        for (int k = 0; k < cases[i].n_values; k++) rt_header_add_tensor(h, f32[k]);
        raw_call(&r, h, f32, cases[i].n_values, st);
        assert_status(st, cases[i].code, cases[i].needle);
        dg_status_reset(st);
    }
    dg_tensor_unref(f32[0]);
    dg_tensor_unref(f32[1]);
    dg_tensor *f64 = dg_tensor_new(DG_FLOAT64, dg_shape2(2, 3), st), *twice[2] = {f64, f64};
    memset(dg_tensor_data(f64), 0, 6 * sizeof(double));
    h = req(RT_RUN_STEP, handle);
    rt_header_add_name(h, "x:0");
    rt_header_add_name(h, "x:0");
    rt_header_add_name(h, "w:0");
    h->n_feeds = 2;
    rt_header_add_tensor(h, f64);
    rt_header_add_tensor(h, f64);
    raw_call(&r, h, twice, 2, st);
    assert_status(st, DG_INVALID_ARGUMENT, "fed twice");
    dg_status_reset(st);
    dg_tensor_unref(f64);
    // Unknown sessions.
    int types[] = {RT_RUN_STEP, RT_EXTEND_SESSION, RT_CLOSE_SESSION, RT_KEEPALIVE};
    for (size_t i = 0; i < 4; i++) {
        raw_call(&r, req(types[i], handle + 12345), NULL, 0, st);
        assert_status(st, DG_NOT_FOUND, "no session");
        dg_status_reset(st);
    }
    // Still serving: the real session runs a step.
    h = req(RT_RUN_STEP, handle);
    rt_header_add_name(h, "^init");
    raw_call(&r, h, NULL, 0, st);
    assert_ok(st);
    raw_call(&r, req(RT_CLOSE_SESSION, handle), NULL, 0, st);
    raw_call(&r, req(RT_CLOSE_SESSION, oh), NULL, 0, st);
    assert_ok(st);
    assert_int_equal(stats(t.worker_port).master_sessions, 0);
    free(buf);
    free(obuf);
    dg_graph_free(&odd);
    dg_graph_free(&m.g);
    rt_transport_free(&r.tp);
    dg_status_free(&st);
    stop(&t);
}

static void test_silent_client_loses_its_session(void **state) {
    (void)state;
    cluster2 t;
    start(&t, 1500);
    dg_status *st = dg_status_new();
    raw r;
    raw_open(&r, t.worker_port);
    model m;
    dg_test_model_build(&m, true);
    int64_t handle = raw_create(&r, m.g);
    rt_header *h;
    h = req(RT_RUN_STEP, handle);
    rt_header_add_name(h, "^init");
    raw_call(&r, h, NULL, 0, st);
    assert_ok(st);
    assert_true(stats(t.ps_port).registered_graphs >= 1);
    // No keepalives: after the lease the session and its partitions are gone.
    for (int i = 0; i < 400 && (stats(t.worker_port).master_sessions > 0 || stats(t.ps_port).registered_graphs > 0); i++)
        usleep(10000);
    assert_int_equal(stats(t.worker_port).master_sessions, 0);
    assert_int_equal(stats(t.ps_port).registered_graphs, 0);
    h = req(RT_RUN_STEP, handle);
    rt_header_add_name(h, "^init");
    raw_call(&r, h, NULL, 0, st);
    assert_status(st, DG_NOT_FOUND, "silent");
    dg_status_reset(st);
    // A client that keeps its session alive keeps it past the lease.
    dg_session *s = dg_session_new(m.g, t.remote, NULL, st);
    assert_ok(st);
    struct timespec pause = {2, 500 * 1000000};   // past the lease
    nanosleep(&pause, NULL);
    assert_true(dg_session_run_target(s, m.init, st));
    assert_ok(st);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    rt_transport_free(&r.tp);
    dg_status_free(&st);
    stop(&t);
}

typedef struct pending_answer {
    pthread_mutex_t mu;
    bool done;
    dg_code code;
    char msg[512];
} pending_answer;

static void on_answer(void *arg, const dg_status *st, rt_header *h, dg_tensor **ts, int n) {
    pending_answer *a = arg;
    pthread_mutex_lock(&a->mu);
    a->done = true;
    a->code = st && !dg_status_ok(st) ? dg_status_code(st) : h ? (dg_code)h->code : DG_OK;
    snprintf(a->msg, sizeof a->msg, "%s", st && !dg_status_ok(st) ? dg_status_message(st) : h && h->message ? h->message : "");
    pthread_mutex_unlock(&a->mu);
    if (h) {
        rt_header_clear(h);
        free(h);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
    free(ts);
}

// A step whose master waits for a task that never comes up, from a client that then falls
// silent: the master keeps answering others meanwhile, and the lease ends the wait and the
// session.
static void test_wait_for_a_missing_task_ends_with_the_session(void **state) {
    (void)state;
    cluster2 t;
    start_tasks(&t, 1500, false);   // no ps
    dg_status *st = dg_status_new();
    raw r;
    raw_open(&r, t.worker_port);
    model m;
    dg_test_model_build(&m, true);
    int64_t handle = raw_create(&r, m.g);
    rt_header *h;
    pending_answer a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.mu, NULL);
    h = req(RT_RUN_STEP, handle);
    rt_header_add_name(h, "^init");
    rt_call(r.tp, r.ep, h, NULL, 0, 60000, on_answer, &a);
    // The master waits for the ps; it still answers, and the session is there.
    struct timespec pause = {0, 500 * 1000000};
    nanosleep(&pause, NULL);
    assert_int_equal(stats(t.worker_port).master_sessions, 1);
    // Silent past the lease: the session goes, and the waiting step ends with why.
    bool done = false;
    for (int i = 0; i < 100 && !done; i++) {
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&a.mu);
        done = a.done;
        pthread_mutex_unlock(&a.mu);
    }
    assert_true(done);
    assert_int_equal(a.code, DG_ABORTED);
    assert_non_null(strstr(a.msg, "silent"));
    assert_non_null(strstr(a.msg, "/job:ps/replica:0/task:0"));
    assert_int_equal(stats(t.worker_port).master_sessions, 0);
    pthread_mutex_destroy(&a.mu);
    dg_graph_free(&m.g);
    rt_transport_free(&r.tp);
    dg_status_free(&st);
    stop(&t);
}

// Feeds over the frame limit of a task (32 MiB) reach a remote master: the client pushes
// them ahead in chunks. The sums are checked against float64 sums computed here; feeds of
// every size class go together (small inline, 6 MiB and 40 MiB pushed).
static void test_large_feeds(void **state) {
    (void)state;
    cluster2 t;
    start(&t, 5000);
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:0");
    const int64_t sizes[3] = {1000, (6 << 20) / 4, (40 << 20) / 4};   // float32 elements
    dg_output x[3], sum[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        x[i] = dg_placeholder(g, name, DG_FLOAT32, dg_shape1(-1));
        sum[i] = dg_sum(g, NULL, dg_cast(g, NULL, x[i], DG_FLOAT64), NULL, 0, false);
    }
    dg_graph_pop_device(g);
    assert_true(dg_graph_check(g, st));
    dg_session *s = dg_session_new(g, t.remote, NULL, st);
    assert_non_null(s);
    dg_tensor *vals[3];
    double want[3];
    for (int i = 0; i < 3; i++) {
        vals[i] = dg_tensor_new(DG_FLOAT32, dg_shape1(sizes[i]), st);
        assert_non_null(vals[i]);
        float *f = dg_tensor_f32(vals[i]);
        want[i] = 0;
        for (int64_t k = 0; k < sizes[i]; k++) {
            f[k] = (float)((k * 7 + i) % 13) - 6.0f;
            want[i] += f[k];
        }
    }
    for (int round = 0; round < 2; round++) {   // twice: the pushed values of a step are cleared
        dg_tensor *got[3] = {NULL, NULL, NULL};
        assert_true(dg_session_run(s, x, vals, 3, sum, got, 3, NULL, 0, st));
        assert_ok(st);
        for (int i = 0; i < 3; i++) {
            assert_true(dg_tensor_f64(got[i])[0] == want[i]);
            dg_tensor_unref(got[i]);
        }
    }
    for (int i = 0; i < 3; i++) dg_tensor_unref(vals[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
    stop(&t);
}


// A counter of the task by name ("local_channel_steps"), through dg_server_query_counters;
// -1 if absent.
static int64_t raw_counter(raw *r, const char *name) {
    dg_status *st = dg_status_new();
    char **names = NULL;
    int64_t *values = NULL, v = -1;
    int n = 0;
    assert_true(dg_server_query_counters(r->ep + strlen("tcp://"), NULL, NULL, 5000, &names, &values, &n, st));
    assert_ok(st);
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) v = values[i];
    dg_server_counters_free(names, values, n);
    dg_status_free(&st);
    return v;
}

// x * 2 and x * 3 on the worker for feeds of every size the channel treats apart: inline
// (4 KiB), a shared-memory slot (400 KiB), inline with an answer too large for the channel
// (3 MiB in, 6 MiB out: parked and taken over the socket), and a feed over 4 MiB, which goes
// ahead in chunks over the socket with its step. Values checked element by element.
static void test_local_channel(void **state) {
    (void)state;
    cluster2 t;
    start(&t, 5000);
    dg_status *st = dg_status_new();
    raw r;
    raw_open(&r, t.worker_port);
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(-1));
    dg_output y = dg_mul(g, "y", x, dg_scalar(g, NULL, DG_FLOAT32, 2));
    dg_output yz[2] = {y, dg_mul(g, "z", x, dg_scalar(g, NULL, DG_FLOAT32, 3))};
    dg_graph_pop_device(g);
    assert_true(dg_graph_check(g, st));
    dg_session *s = dg_session_new(g, t.remote, NULL, st);
    assert_non_null(s);
    assert_int_equal(raw_counter(&r, "local_channels"), 1);
    const int64_t sizes[4] = {1024, 100 * 1024, 3 << 18, 5 << 18};   // float32 elements
    for (int k = 0; k < 4; k++) {
        int64_t before = raw_counter(&r, "local_channel_steps");
        dg_tensor *v = dg_tensor_new(DG_FLOAT32, dg_shape1(sizes[k]), st), *got[2] = {NULL, NULL};
        float *f = dg_tensor_f32(v);
        for (int64_t i = 0; i < sizes[k]; i++) f[i] = (float)((i * 31 + k) % 1000) * 0.25f;
        assert_true(dg_session_run(s, &x, &v, 1, yz, got, 2, NULL, 0, st));
        assert_ok(st);
        for (int o = 0; o < 2; o++) {
            assert_int_equal(dg_tensor_num_elements(got[o]), sizes[k]);
            const float *g2 = dg_tensor_f32(got[o]);
            int64_t wrong = 0;
            for (int64_t i = 0; i < sizes[k]; i++) wrong += g2[i] != (float)(o + 2) * f[i];
            assert_int_equal(wrong, 0);
            dg_tensor_unref(got[o]);
        }
        assert_int_equal(raw_counter(&r, "local_channel_steps"), before + (k < 3));
        dg_tensor_unref(v);
    }
    dg_tensor *got = NULL;
    // A feed of the wrong rank is refused with a status; the channel stays usable (below).
    dg_tensor *bad = dg_tensor_new(DG_FLOAT32, dg_shape2(2, 2), st);
    assert_false(dg_session_run(s, &x, &bad, 1, &y, &got, 1, NULL, 0, st));
    assert_true(dg_status_code(st) != DG_OK);
    dg_status_reset(st);
    dg_tensor_unref(bad);
    // Without it (DG_LOCAL_CHANNEL=0) the steps take the socket.
    setenv("DG_LOCAL_CHANNEL", "0", 1);
    dg_session *s2 = dg_session_new(g, t.remote, NULL, st);
    unsetenv("DG_LOCAL_CHANNEL");
    assert_non_null(s2);
    assert_int_equal(raw_counter(&r, "local_channels"), 1);
    int64_t before = raw_counter(&r, "local_channel_steps");
    dg_tensor *v = dg_tensor_new(DG_FLOAT32, dg_shape1(10), st);
    for (int i = 0; i < 10; i++) dg_tensor_f32(v)[i] = (float)i;
    assert_true(dg_session_run(s2, &x, &v, 1, &y, &got, 1, NULL, 0, st));
    assert_ok(st);
    assert_true(dg_tensor_f32(got)[9] == 18.0f);
    dg_tensor_unref(got);
    assert_int_equal(raw_counter(&r, "local_channel_steps"), before);
    dg_session_free(&s2);
    // A reset closes the sessions: the next step through the channel learns it from the master.
    assert_true(dg_session_reset(t.remote, NULL, st));
    assert_ok(st);
    assert_false(dg_session_run(s, &x, &v, 1, &y, &got, 1, NULL, 0, st));
    assert_status(st, DG_NOT_FOUND, "no session");
    dg_status_reset(st);
    for (int i = 0; i < 200 && raw_counter(&r, "local_channels") > 0; i++) usleep(10000);
    assert_int_equal(raw_counter(&r, "local_channels"), 0);
    dg_tensor_unref(v);
    dg_session_free(&s);
    dg_graph_free(&g);
    rt_transport_free(&r.tp);
    dg_status_free(&st);
    stop(&t);
}

// Posts the request half of reg as it is (h, when not NULL, written there first and consumed)
// and returns the master's answer: its code, and its message in msg.
static dg_code channel_answer(fc_region *reg, uint32_t *seen, rt_header *h, char *msg, size_t cap) {
    if (h) {
        assert_true(fc_put(reg, FC_REQUEST, h, NULL, 0, NULL));
        rt_header_clear(h);
        free(h);
    }
    fc_post(reg, FC_REQUEST);
    assert_int_equal(fc_wait(reg, FC_ANSWER, seen, 10000), FC_READY);
    dg_status *st = dg_status_new();
    rt_header a;
    dg_tensor **ts = NULL;
    int n = 0;
    assert_true(fc_take(reg, FC_ANSWER, &a, &ts, &n, st));
    assert_ok(st);
    assert_int_equal(n, 0);
    dg_code code = (dg_code)a.code;
    snprintf(msg, cap, "%s", a.message ? a.message : "");
    rt_header_clear(&a);
    free(ts);
    dg_status_free(&st);
    return code;
}

// A hostile process of the same user: channels that are not channels are refused by name; a
// region attached twice is refused; garbage written into an attached region's request half is
// answered with a status naming the local channel; and the master keeps serving the session.
static void test_local_channel_hostile(void **state) {
    (void)state;
    cluster2 t;
    start(&t, 5000);
    dg_status *st = dg_status_new();
    raw r;
    raw_open(&r, t.worker_port);
    model m;
    dg_test_model_build(&m, true);
    int64_t handle = raw_create(&r, m.g);
    const char *names[] = {NULL, "", "/etc/passwd", "/dg-fc-1-2-zz", "/dg-fc- 1-2-00000001", "/dg-fc-1-2-00000001/x",
                           "/dg-fc-999999999-1-00000000"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        rt_header *h = req(RT_ATTACH_CHANNEL, handle);
        if (names[i]) h->key = strdup(names[i]);
        raw_call(&r, h, NULL, 0, st);
        assert_status(st, DG_INVALID_ARGUMENT, "channel");
        dg_status_reset(st);
    }
    rt_header *h = req(RT_ATTACH_CHANNEL, handle + 1);   // no such session
    raw_call(&r, h, NULL, 0, st);
    assert_status(st, DG_NOT_FOUND, "no session");
    dg_status_reset(st);
    raw_call(&r, req(RT_TAKE_ANSWER, handle), NULL, 0, st);
    assert_status(st, DG_NOT_FOUND, "no parked answer");
    dg_status_reset(st);
    fc_region *reg = fc_create(st);
    assert_non_null(reg);
    h = req(RT_ATTACH_CHANNEL, handle);
    h->key = strdup(fc_name(reg));
    raw_call(&r, h, NULL, 0, st);
    assert_ok(st);
    h = req(RT_ATTACH_CHANNEL, handle);   // the same region again
    h->key = strdup(fc_name(reg));
    raw_call(&r, h, NULL, 0, st);
    assert_status(st, DG_FAILED_PRECONDITION, "attached already");
    dg_status_reset(st);
    fc_unlink(reg);
    assert_int_equal(raw_counter(&r, "local_channels"), 1);
    uint32_t seen = fc_seq(reg, FC_ANSWER);
    unsigned seed = 12345;
    unsigned char junk[4096];
    char msg[512];
    for (int round = 0; round < 60; round++) {
        // Random bytes, random lengths (some past the half), a plausible header length now and then.
        uint64_t total = (uint64_t)rand_r(&seed) % sizeof junk;
        if (round % 7 == 0) total = FC_HALF_BYTES + 8;
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)rand_r(&seed);
        if (round % 3 == 0) {
            uint64_t hl = (uint64_t)rand_r(&seed) % 64;
            memcpy(junk, &hl, 8);
        }
        fc_put_raw(reg, FC_REQUEST, junk, sizeof junk, total);
        assert_int_equal(channel_answer(reg, &seen, NULL, msg, sizeof msg), DG_INVALID_ARGUMENT);
        assert_non_null(strstr(msg, "local channel"));
    }
    // A well-formed request of another type is refused too; then the real thing runs.
    assert_int_equal(channel_answer(reg, &seen, req(RT_RUN_GRAPH, handle), msg, sizeof msg), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "RUN_GRAPH"));
    rt_header *init = req(RT_RUN_STEP, handle);
    rt_header_add_name(init, "^init");
    assert_int_equal(channel_answer(reg, &seen, init, msg, sizeof msg), DG_OK);
    // Closing the session ends the channel's thread.
    raw_call(&r, req(RT_CLOSE_SESSION, handle), NULL, 0, st);
    assert_ok(st);
    for (int i = 0; i < 200 && raw_counter(&r, "local_channels") > 0; i++) usleep(10000);
    assert_int_equal(raw_counter(&r, "local_channels"), 0);
    assert_true(fc_closed(reg));
    fc_free(&reg);
    dg_graph_free(&m.g);
    rt_transport_free(&r.tp);
    dg_status_free(&st);
    stop(&t);
}

// A service that claims PING, which the worker service answers (rt_server_new must refuse it).
static bool claim_ping(const rt_task_env *env, rt_service *out, dg_status *st) {
    (void)env;
    (void)st;
    static const rt_type types[] = {RT_PING};
    *out = (rt_service){.name = "ping-thief", .types = types, .n_types = 1};
    return true;
}

// The server's dispatch table: a type two services claim is refused when the server is made;
// a server without the master service answers the master's messages UNIMPLEMENTED and still
// answers PING; with it (dg_server_new), the master's counters are in its status.
static void test_service_table(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    int port = dg_test_free_port();
    char spec[64];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d", port);
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    const rt_service_start thief[] = {master_service_start, claim_ping};
    dg_server *s = rt_server_new(c, "worker", 0, &so, thief, 2, st);
    assert_null(s);
    assert_status(st, DG_INTERNAL, "the ping-thief service claims message type PING, which another service answers");

    s = rt_server_new(c, "worker", 0, &so, NULL, 0, st);
    assert_ok(st);
    raw r;
    raw_open(&r, port);
    raw_call(&r, req(RT_CREATE_SESSION, 0), NULL, 0, st);
    assert_status(st, DG_UNIMPLEMENTED, "CREATE_SESSION is not a request");
    dg_status_reset(st);
    raw_call(&r, req(RT_PING, 0), NULL, 0, st);
    assert_ok(st);
    assert_int_equal(raw_counter(&r, "master_sessions"), -1);
    assert_int_equal(raw_counter(&r, "registered_graphs"), 0);
    rt_transport_free(&r.tp);
    dg_server_free(&s);

    s = dg_server_new(c, "worker", 0, &so, st);
    assert_ok(st);
    raw_open(&r, port);
    assert_int_equal(raw_counter(&r, "master_sessions"), 0);
    assert_int_equal(raw_counter(&r, "local_channels"), 0);
    raw_call(&r, req(RT_KEEPALIVE, 12345), NULL, 0, st);
    assert_status(st, DG_NOT_FOUND, "12345");
    rt_transport_free(&r.tp);
    dg_server_free(&s);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_channel),
        cmocka_unit_test(test_local_channel_hostile),
        cmocka_unit_test(test_large_feeds),
        cmocka_unit_test(test_remote_matches_local),
        cmocka_unit_test(test_hostile_requests),
        cmocka_unit_test(test_silent_client_loses_its_session),
        cmocka_unit_test(test_wait_for_a_missing_task_ends_with_the_session),
        cmocka_unit_test(test_service_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
