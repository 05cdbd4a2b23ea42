/* Servers in one process talking over tcp://127.0.0.1 (real ZeroMQ sockets): placement over
 * a ps and a worker task, Send/Recv across tasks, and agreement with a local session. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "device.h"
#include "timer_impl.h"
#include "wire_impl.h"


typedef dg_test_model model;

// A ps and a worker task on free ports of 127.0.0.1, each served in this process (ps NULL:
// the ps is left to the caller, who binds spec's first port).
typedef struct two_tasks {
    dg_cluster *c;
    dg_server *ps, *wk;
    int ps_port;
} two_tasks;

// ps_port: the ps's port when the caller has bound it already (0: pick a free one).
// liveness_ms: dg_server_options.liveness_timeout_ms (0: the default). virtual_cpus: each
// task's dg_server_options.n_virtual_cpus.
static void two_tasks_start_on(two_tasks *tt, bool serve_ps, int64_t rpc_timeout_ms, int ps_port,
                               int64_t liveness_ms, int virtual_cpus) {
    dg_status *st = dg_status_new();
    char spec[256];
    tt->ps_port = ps_port ? ps_port : dg_test_free_port();
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|127.0.0.1:%d", tt->ps_port, dg_test_free_port());
    tt->c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    so.rpc_timeout_ms = rpc_timeout_ms;
    so.liveness_timeout_ms = liveness_ms;
    so.n_virtual_cpus = virtual_cpus;
    tt->ps = serve_ps ? dg_server_new(tt->c, "ps", 0, &so, st) : NULL;
    assert_ok(st);
    tt->wk = dg_server_new(tt->c, "worker", 0, &so, st);
    assert_ok(st);
    dg_status_free(&st);
}

static void two_tasks_start(two_tasks *tt, bool serve_ps, int64_t rpc_timeout_ms) {
    two_tasks_start_on(tt, serve_ps, rpc_timeout_ms, 0, 0, 0);
}

static void two_tasks_stop(two_tasks *tt) {
    dg_server_free(&tt->wk);
    dg_server_free(&tt->ps);
    dg_cluster_free(&tt->c);
}

static void test_ps_worker_matches_local(void **state) {
    dg_status *st = dg_status_new();
    two_tasks tt;
    two_tasks_start(&tt, true, 5000);
    model a, b;
    dg_test_model_build(&a, true);
    dg_test_model_build(&b, false);
    assert_ok(dg_graph_status(a.g));
    dg_session *sa = dg_session_new(a.g, dg_server_target(tt.wk), NULL, st);
    assert_ok(st);
    dg_session *sb = dg_session_new(b.g, "local", NULL, st);
    double wa[6], wb[6], la[5], lb[5];
    dg_test_model_train(sa, &a, wa, la);
    dg_test_model_train(sb, &b, wb, lb);
    assert_memory_equal(wa, wb, sizeof wa);
    assert_memory_equal(la, lb, sizeof la);
    assert_string_equal(dg_node_assigned_device(a.w.node), "/job:ps/replica:0/task:0/device:CPU:0");
    dg_session_free(&sa);
    dg_session_free(&sb);
    dg_graph_free(&a.g);
    dg_graph_free(&b.g);
    two_tasks_stop(&tt);
    dg_status_free(&st);
}

// The value of the counter `name` in srv's SERVER_STATUS answer (-1: not there).
static int64_t status_counter(dg_server *srv, const char *name) {
    dg_status *st = dg_status_new();
    char **names = NULL;
    int64_t *values = NULL, v = -1;
    int n = 0;
    assert_true(dg_server_query_counters(dg_server_target(srv), NULL, NULL, 5000, &names, &values, &n, st));
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) v = values[i];
    dg_server_counters_free(names, values, n);
    dg_status_free(&st);
    return v;
}

// x [256, 256] fed, z = sum(tanh(x) x): 256 KiB values, on ps_device when given (z on the
// session's own task, so that y crosses). Returns z; *x the placeholder.
static dg_output cache_graph(dg_graph *g, const char *ps_device, dg_output *x) {
    if (ps_device) dg_graph_push_device(g, ps_device);
    *x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(256, 256));
    dg_output y = dg_matmul(g, NULL, dg_tanh(g, NULL, *x), *x, false, false);
    if (ps_device) dg_graph_pop_device(g);
    return dg_sum(g, NULL, y, NULL, 0, false);
}

// Three steps of cache_graph's z, each finite; returns the fed value (the caller's).
static dg_tensor *cache_steps(dg_session *s, dg_output x, dg_output z, dg_status *st) {
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(256, 256), st);
    for (int i = 0; i < 256 * 256; i++) dg_tensor_f32(xv)[i] = (float)(i % 7) * 0.01f;
    for (int k = 0; k < 3; k++) {
        dg_tensor *out = NULL;
        assert_true(dg_session_run(s, &x, &xv, 1, &z, &out, 1, NULL, 0, st));
        assert_true(isfinite(dg_tensor_f32(out)[0]));
        dg_tensor_unref(out);
    }
    return xv;
}

// Whether this build and environment keep freed buffers in the tensor cache.
static bool cache_on_here(void) {
#if defined(DG_SANITIZE_BUILD) || defined(__SANITIZE_ADDRESS__)
    return false;
#else
    const char *mb = getenv("DG_TENSOR_CACHE_MB");
    return !(mb && strcmp(mb, "0") == 0);
#endif
}

// The tensor cache (graph/tensor_cache.c) keeps a step's large freed buffers, and
// SERVER_STATUS reports them; when the session closes, its partitions are deregistered from
// both tasks (the last graph gone, a server gives the cache back) and the process's last master
// session is freed (which gives it back too). These servers share the test's process, and so
// its cache.
static void test_cache_released_when_sessions_end(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    two_tasks tt;
    two_tasks_start(&tt, true, 5000);
    dg_graph *g = dg_graph_new();
    dg_output x, z = cache_graph(g, "/job:ps/task:0", &x);
    dg_session *s = dg_session_new(g, dg_server_target(tt.wk), NULL, st);
    assert_ok(st);
    dg_tensor *xv = cache_steps(s, x, z, st);
    if (cache_on_here()) assert_true(dg_tensor_cache_held() >= 256 * 256 * 4);
    else printf("note: the tensor cache is off here (DG_TENSOR_CACHE_MB=0 or a sanitizer build)\n");
    assert_int_equal(status_counter(tt.wk, "tensor_cache_bytes"), (int64_t)dg_tensor_cache_held());
    dg_session_free(&s);
    assert_int_equal(dg_tensor_cache_held(), 0);
    assert_int_equal(status_counter(tt.wk, "tensor_cache_bytes"), 0);
    dg_tensor_unref(xv);
    dg_graph_free(&g);
    two_tasks_stop(&tt);
    dg_status_free(&st);
}

// The same for a local session, where no server's graph holds the cache: only the master's
// release, when the process's last session is freed, gives it back.
static void test_cache_released_when_local_session_ends(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x, z = cache_graph(g, NULL, &x);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    dg_tensor_unref(cache_steps(s, x, z, st));   // its buffer goes to the cache too
    if (cache_on_here()) assert_true(dg_tensor_cache_held() >= 256 * 256 * 4);
    dg_session_free(&s);
    assert_int_equal(dg_tensor_cache_held(), 0);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// The ps goes away: the worker's step fails with UNAVAILABLE naming the ps task, in time.
static void test_dead_ps_is_unavailable(void **state) {
    dg_status *st = dg_status_new();
    two_tasks tt;
    two_tasks_start(&tt, true, 1000);
    model a;
    dg_test_model_build(&a, true);
    dg_session *sa = dg_session_new(a.g, dg_server_target(tt.wk), NULL, st);
    assert_true(dg_session_run_target(sa, a.init, st));
    dg_server_free(&tt.ps);
    assert_false(dg_session_run_target(sa, a.train, st));
    // Either the run fails fast or at the deadline, naming the ps task.
    assert_true(dg_status_code(st) == DG_UNAVAILABLE || dg_status_code(st) == DG_CANCELLED ||
                dg_status_code(st) == DG_ABORTED);
    assert_non_null(strstr(dg_status_message(st), "/job:ps/replica:0/task:0"));
    dg_session_free(&sa);
    dg_graph_free(&a.g);
    two_tasks_stop(&tt);
    dg_status_free(&st);
}

// A graph that asks for GPUs makes the master ask every task for its devices (LIST_DEVICES):
// the variable lands on the ps's GPU when the ps has one, else (soft placement) on its CPU,
// and the step computes the same as on CPUs. Without soft placement and without GPUs the
// error lists the devices the tasks reported. A ps that is gone fails the listing, naming it.
static void test_gpu_request_in_cluster(void **state) {
    dg_status *st = dg_status_new();
    two_tasks tt;
    two_tasks_start(&tt, true, 2000);
    for (int soft = 1; soft >= 0; soft--) {
        dg_graph *g = dg_graph_new();
        dg_graph_push_device(g, "/job:ps/task:0/device:GPU:0");
        dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape1(3), dg_init_constant(2));
        dg_graph_pop_device(g);
        dg_graph_push_device(g, "/job:worker/task:0/device:GPU:0");
        dg_output y = dg_sum(g, "y", dg_square(g, NULL, w), NULL, 0, false);
        dg_graph_pop_device(g);
        dg_node *init = dg_global_variables_initializer(g);
        dg_session_options o = dg_session_options_default();
        o.allow_soft_placement = soft;
        dg_session *s = dg_session_new(g, dg_server_target(tt.wk), &o, st);
        assert_ok(st);
        bool gpus = exec_device_count(DG_DEVICE_TYPE_GPU) > 0;
        bool ok = dg_session_run_target(s, init, st);
        if (soft || gpus) {
            assert_true(ok);
            assert_ok(st);
            dg_tensor *yv = NULL;
            assert_true(dg_session_run(s, NULL, NULL, 0, &y, &yv, 1, NULL, 0, st));
            assert_true(dg_tensor_f64(yv)[0] == 12.0);
            dg_tensor_unref(yv);
            assert_string_equal(dg_node_assigned_device(w.node),
                                gpus ? "/job:ps/replica:0/task:0/device:GPU:0"
                                     : "/job:ps/replica:0/task:0/device:CPU:0");
        } else {
            assert_false(ok);
            assert_status(st, DG_INVALID_ARGUMENT, "/job:ps/replica:0/task:0/device:CPU:0");
            dg_status_reset(st);
        }
        dg_session_free(&s);
        dg_graph_free(&g);
    }
    // The ps is gone: asking for its devices fails, naming it, within the deadline.
    dg_server_free(&tt.ps);
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0/device:GPU:0");
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape1(3), dg_init_constant(2));
    dg_graph_pop_device(g);
    dg_session *s = dg_session_new(g, dg_server_target(tt.wk), NULL, st);
    assert_false(dg_session_run(s, NULL, NULL, 0, &w, NULL, 0, &w.node, 1, st));
    assert_non_null(strstr(dg_status_message(st), "/job:ps/replica:0/task:0"));
    dg_session_free(&s);
    dg_graph_free(&g);
    two_tasks_stop(&tt);
    dg_status_free(&st);
}

// ---- a ps that answers every call OK and never sends a value (as one that died after its
// answers left and before its pushes did); with mute_after_run, it answers nothing after its
// first RUN_GRAPH (as one that died) ----

typedef struct fake_ps {
    void *zctx, *router;
    pthread_t thread;
    atomic_bool stop;
    atomic_int run_graphs;
    bool mute_after_run;
} fake_ps;

static void *fake_ps_main(void *arg) {
    fake_ps *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        zmq_msg_t parts[8];
        int n = 0;
        for (;;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, f->router, 0) < 0) break;
            bool more = zmq_msg_more(&m);
            if (n < 8) parts[n++] = m;
            else zmq_msg_close(&m);
            if (!more) break;
        }
        rt_header req;
        dg_status *st = dg_status_new();
        bool ok = n >= 2 && rt_header_decode(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), &req, st);
        bool mute = f->mute_after_run && atomic_load(&f->run_graphs) > 0;
        if (ok && req.id != 0 && req.type != RT_RESPONSE && !mute) {
            if (req.type == RT_RUN_GRAPH) atomic_fetch_add(&f->run_graphs, 1);
            rt_header a;
            rt_header_init(&a, RT_RESPONSE);
            a.id = req.id;
            if (req.type == RT_REGISTER_GRAPH) a.handle = 42;
            size_t len;
            char *b = rt_header_encode(&a, &len);
            zmq_send(f->router, zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]), ZMQ_SNDMORE);
            zmq_send(f->router, b, len, 0);
            free(b);
            rt_header_clear(&a);
        }
        if (ok) rt_header_clear(&req);
        dg_status_free(&st);
        for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
    }
    return NULL;
}

// The worker's partition waits for a value the ps will never send, though the ps answered
// RUN_GRAPH OK. Returns the failed step's status (caller frees).
static dg_status *run_values_lost(bool mute_after_run, int64_t rpc_timeout_ms, int64_t liveness_ms) {
    dg_status *st = dg_status_new();
    // The fake ps binds first (a port picked free and bound later may be taken meanwhile by
    // another test's outgoing connection).
    fake_ps f = {.mute_after_run = mute_after_run};
    f.zctx = zmq_ctx_new();
    f.router = zmq_socket(f.zctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(f.router, "tcp://127.0.0.1:*"), 0);
    char ep[64];
    size_t ep_len = sizeof ep;
    assert_int_equal(zmq_getsockopt(f.router, ZMQ_LAST_ENDPOINT, ep, &ep_len), 0);
    two_tasks tt;
    two_tasks_start_on(&tt, false, rpc_timeout_ms, atoi(strrchr(ep, ':') + 1), liveness_ms, 0);
    assert_int_equal(pthread_create(&f.thread, NULL, fake_ps_main, &f), 0);
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0");
    dg_output a = dg_scalar(g, "a", DG_FLOAT64, 3);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output y = dg_mul(g, "y", a, a);
    dg_graph_pop_device(g);
    dg_session *s = dg_session_new(g, dg_server_target(tt.wk), NULL, st);
    assert_ok(st);
    dg_tensor *yv = NULL;
    assert_false(dg_session_run(s, NULL, NULL, 0, &y, &yv, 1, NULL, 0, st));
    assert_true(atomic_load(&f.run_graphs) >= 1);
    dg_session_free(&s);
    dg_graph_free(&g);
    two_tasks_stop(&tt);
    atomic_store(&f.stop, true);
    pthread_join(f.thread, NULL);
    zmq_close(f.router);
    zmq_ctx_term(f.zctx);
    return st;
}

// Virtual CPUs (dg_server_options.n_virtual_cpus) are known only from the tasks' own device
// lists: a node asking for the worker's CPU:1, or the ps's, runs there, where soft placement
// used to move it to CPU:0 without a word. On the ps the step then has two partitions that
// pass a value (w from its CPU:0 to its CPU:1): the ps ends the step when both are done, not
// the first (its value to the other was dropped, and the step failed at the deadline). A CPU
// the task lacks is refused without soft placement.
static void test_virtual_cpu_request_in_cluster(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    two_tasks tt;
    two_tasks_start_on(&tt, true, 10000, 0, 0, 1);
    static const char *const asks[] = {"/job:worker/task:0/device:CPU:1", "/job:ps/task:0/device:CPU:1",
                                       "/job:ps/task:0/device:CPU:2"};
    static const char *const got[] = {"/job:worker/replica:0/task:0/device:CPU:1",
                                      "/job:ps/replica:0/task:0/device:CPU:1", NULL};
    for (int k = 0; k < 3; k++) {
        dg_graph *g = dg_graph_new();
        dg_graph_push_device(g, "/job:ps/task:0");
        dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape1(3), dg_init_constant(2));
        dg_graph_pop_device(g);
        dg_graph_push_device(g, asks[k]);
        dg_output y = dg_sum(g, "y", dg_square(g, NULL, w), NULL, 0, false);
        dg_graph_pop_device(g);
        dg_session_options o = dg_session_options_default();
        o.allow_soft_placement = false;
        dg_session *s = dg_session_new(g, dg_server_target(tt.wk), &o, st);
        assert_ok(st);
        bool ok = dg_session_run_target(s, dg_global_variables_initializer(g), st);
        for (int step = 0; ok && step < 3; step++) {   // steps after the first reuse the partitions
            dg_tensor *yv = NULL;
            ok = dg_session_run(s, NULL, NULL, 0, &y, &yv, 1, NULL, 0, st);
            if (ok) assert_true(dg_tensor_f64(yv)[0] == 12.0);
            dg_tensor_unref(yv);
        }
        if (got[k]) {
            assert_ok(st);
            assert_true(ok);
            assert_string_equal(dg_node_assigned_device(y.node), got[k]);
            assert_string_equal(dg_node_assigned_device(w.node), "/job:ps/replica:0/task:0/device:CPU:0");
        } else {
            assert_false(ok);
            assert_status(st, DG_INVALID_ARGUMENT, "CPU:2");
        }
        dg_session_free(&s);
        dg_graph_free(&g);
    }
    two_tasks_stop(&tt);
    dg_status_free(&st);
}

// A ps that stays alive but never sends: the step fails within the RPC deadline instead of
// waiting forever.
static void test_values_lost_after_answer(void **state) {
    int64_t t0 = exec_timer_now_ms();
    dg_status *st = run_values_lost(false, 1000, 0);
    int64_t took = exec_timer_now_ms() - t0;
    assert_status(st, DG_ABORTED, "did not arrive within 1000 ms (did a task die after answering?)");
    assert_true(took >= 900);   // not early; the message names the 1000 ms wait that ended it
    dg_status_free(&st);
}

// A ps that answers RUN_GRAPH and then nothing (it died after its answer left): the PINGs sent
// while the step waits find it gone, and the step fails naming it, long before the 60 s RPC
// deadline (whose own message would say "did not arrive within 60000 ms").
static void test_task_dead_after_answer(void **state) {
    dg_status *st = run_values_lost(true, 60000, 1000);
    assert_status(st, DG_ABORTED, "task /job:ps/replica:0/task:0 (tcp://127.0.0.1:");
    assert_status(st, DG_ABORTED, "finished its part of the step, then stopped answering");
    assert_null(strstr(dg_status_message(st), "did not arrive within"));
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ps_worker_matches_local),
        cmocka_unit_test(test_dead_ps_is_unavailable),
        cmocka_unit_test(test_cache_released_when_sessions_end),
        cmocka_unit_test(test_cache_released_when_local_session_ends),
        cmocka_unit_test(test_gpu_request_in_cluster),
        cmocka_unit_test(test_virtual_cpu_request_in_cluster),
        cmocka_unit_test(test_values_lost_after_answer),
        cmocka_unit_test(test_task_dead_after_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
