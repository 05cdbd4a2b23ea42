/* A session's inter-op threads: the caller of a step and the pool's threads. With two of them
 * (the caller and one pool thread), a node that a pool thread makes ready while it is busy
 * must not wait in the pool's queue while the caller sleeps: the caller takes it back
 * (exec_pool_take), or is handed it when it already waits (submit).
 *
 * The graph: z0 (fed) -> z -> {a, b}; b -> {c, d}. The caller keeps a and hands b to the pool; the pool
 * thread runs b, keeps c and queues d. c then waits for d to start. Before the fix, d stayed in
 * the queue behind c (the pool's only thread), the caller slept, and c waited out its guard.
 * Case 3: a value crossing between the process's two CPUs (a _Send/_Recv pair) makes its
 * reader ready on a pool thread while the caller is busy.
 * The test kernels are ZerosLike on bfloat16 (a dtype the library's own ZerosLike kernel does
 * not take),
 * registered by the test; each waits for its partner with a guard, never by timing. */
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "exec_kernel_impl.h"
#include "exec_kernel_registry_impl.h"
#include "exec_pool_impl.h"
#include "testutil.h"

#define GUARD_S 20
#define ONE_BF16 0x3f80   // 1.0 in bfloat16

static atomic_bool c_started, d_started;
static atomic_bool a_waits_for_c;   // case 1: the caller is still busy (in a) when d is queued
static atomic_bool a_waits_for_d;   // case 3: d, on another device, must run while a waits
static atomic_int a_met, c_met, d_met;

// Waits until flag is set or the guard passes; true when set.
static bool wait_for(atomic_bool *flag) {
    time_t end = time(NULL) + GUARD_S;
    while (!atomic_load(flag)) {
        if (time(NULL) > end) return false;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return true;
}

static void *meet_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    (void)st;
    return (void *)n;
}

static bool meet_compute(void *state, exec_ctx *ctx) {
    const dg_node *n = state;
    const char *name = dg_node_name(n);
    if (strcmp(name, "a") == 0 && atomic_load(&a_waits_for_c)) {
        wait_for(&c_started);
    } else if (strcmp(name, "a") == 0 && atomic_load(&a_waits_for_d)) {
        atomic_store(&a_met, wait_for(&d_started) ? 1 : -1);
    } else if (strcmp(name, "c") == 0 && atomic_load(&a_waits_for_d)) {
        // case 3: c only runs.
    } else if (strcmp(name, "d") == 0 && atomic_load(&a_waits_for_d)) {
        atomic_store(&d_started, true);
    } else if (strcmp(name, "c") == 0) {
        atomic_store(&c_started, true);
        atomic_store(&c_met, wait_for(&d_started) ? 1 : -1);
    } else if (strcmp(name, "d") == 0) {
        atomic_store(&d_started, true);
        atomic_store(&d_met, wait_for(&c_started) ? 1 : -1);
    }
    dg_tensor *out = exec_alloc_output(ctx, 0, DG_BFLOAT16, dg_shape_scalar());
    if (!out) return false;
    ((uint16_t *)out->data)[0] = ONE_BF16;
    return true;
}

static exec_kernel_def meet_kernel = {.op = "ZerosLike", .device_type = DG_DEVICE_TYPE_CPU,
                                      .dtype_mask = DT_BIT(DG_BFLOAT16), .create = meet_create,
                                      .compute = meet_compute, .expensive = true};

static void run_case(bool caller_busy) {
    atomic_store(&a_waits_for_d, false);
    atomic_store(&c_started, false);
    atomic_store(&d_started, false);
    atomic_store(&c_met, 0);
    atomic_store(&d_met, 0);
    atomic_store(&a_waits_for_c, caller_busy);
    dg_graph *g = dg_graph_new();
    dg_output z0 = dg_placeholder(g, "z0", DG_BFLOAT16, dg_shape_scalar());
    dg_output z = dg_zeros_like(g, "z", z0);
    dg_output a = dg_zeros_like(g, "a", z);
    dg_output b = dg_zeros_like(g, "b", z);
    dg_output c = dg_zeros_like(g, "c", b);
    dg_output d = dg_zeros_like(g, "d", b);
    assert_true(dg_graph_ok(g));
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.inter_op_threads = 2;   // the caller and one pool thread
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    uint16_t one = ONE_BF16;
    dg_tensor *zv = dg_tensor_from_data(DG_BFLOAT16, dg_shape_scalar(), &one, st);
    assert_ok(st);
    dg_output fetches[] = {a, c, d};
    dg_tensor *out[3] = {NULL};
    assert_true(dg_session_run(s, &z0, &zv, 1, fetches, out, 3, NULL, 0, st));
    assert_ok(st);
    // Both waited for each other and met: each ran while the other did.
    assert_int_equal(atomic_load(&c_met), 1);
    assert_int_equal(atomic_load(&d_met), 1);
    for (int i = 0; i < 3; i++) {
        assert_non_null(out[i]);
        assert_int_equal(((uint16_t *)out[i]->data)[0], ONE_BF16);
        dg_tensor_unref(out[i]);
    }
    dg_tensor_unref(zv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// d is queued while the caller still runs a: the caller, idle after it, takes d back.
static void test_caller_takes_back_queued_node(void **state) {
    (void)state;
    run_case(true);
}

// The caller may already wait when d is made ready: it is handed d, or takes it back.
static void test_idle_caller_runs_new_node(void **state) {
    (void)state;
    for (int k = 0; k < 5; k++) run_case(false);
}

// Case 3, a value crossing between two CPUs of the process: b on CPU:0, d reads it on CPU:1
// through a _Send/_Recv pair. The pool thread runs b, whose _Send completes d's _Recv; a, on
// the caller, waits for d to start. d must not wait behind the caller's drain (where an
// asynchronous completion used to put it): it goes to the pool, whose thread runs it after c.
static void test_crossing_value_runs_beside_busy_caller(void **state) {
    (void)state;
    atomic_store(&a_waits_for_c, false);
    atomic_store(&a_waits_for_d, true);
    atomic_store(&d_started, false);
    atomic_store(&a_met, 0);
    dg_graph *g = dg_graph_new();
    dg_output z0 = dg_placeholder(g, "z0", DG_BFLOAT16, dg_shape_scalar());
    dg_graph_push_device(g, "/device:CPU:0");
    dg_output z1 = dg_zeros_like(g, "z1", z0);
    dg_output z = dg_zeros_like(g, "z", z1);
    dg_output a = dg_zeros_like(g, "a", z);
    dg_output b = dg_zeros_like(g, "b", z);
    dg_output c = dg_zeros_like(g, "c", b);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/device:CPU:1");
    dg_output d = dg_zeros_like(g, "d", b);
    dg_graph_pop_device(g);
    assert_true(dg_graph_ok(g));
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.inter_op_threads = 2;
    o.n_virtual_cpus = 1;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    uint16_t one = ONE_BF16;
    dg_tensor *zv = dg_tensor_from_data(DG_BFLOAT16, dg_shape_scalar(), &one, st);
    dg_output fetches[] = {a, c, d};
    dg_tensor *out[3] = {NULL};
    assert_true(dg_session_run(s, &z0, &zv, 1, fetches, out, 3, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(atomic_load(&a_met), 1);
    assert_string_equal(dg_node_assigned_device(d.node), "/job:localhost/replica:0/task:0/device:CPU:1");
    for (int i = 0; i < 3; i++) {
        assert_non_null(out[i]);
        dg_tensor_unref(out[i]);
    }
    atomic_store(&a_waits_for_d, false);
    dg_tensor_unref(zv);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void count_task(void *arg, int a) {
    atomic_fetch_add((atomic_int *)arg, a);
}

static atomic_bool hold_started, hold_release;

static void hold_task(void *arg, int a) {
    (void)arg;
    (void)a;
    atomic_store(&hold_started, true);
    wait_for(&hold_release);
}

// exec_pool_take: the oldest queued task of (fn, arg) only, the others kept in order, nothing
// taken that a thread already started.
static void test_pool_take(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    exec_pool *p = exec_pool_new(1, st);
    assert_non_null(p);
    atomic_store(&hold_started, false);
    atomic_store(&hold_release, false);
    static atomic_int x, y;
    atomic_store(&x, 0);
    atomic_store(&y, 0);
    int a = -1;
    exec_pool_submit(p, hold_task, NULL, 0);   // occupies the pool's only thread
    assert_true(wait_for(&hold_started));
    exec_pool_submit(p, count_task, &x, 1);
    exec_pool_submit(p, count_task, &y, 10);
    exec_pool_submit(p, count_task, &x, 2);
    exec_pool_submit(p, count_task, &y, 20);
    assert_false(exec_pool_take(p, hold_task, NULL, &a));   // started
    assert_false(exec_pool_take(p, count_task, NULL, &a));  // no such (fn, arg)
    assert_true(exec_pool_take(p, count_task, &y, &a));
    assert_int_equal(a, 10);                                   // the oldest of y's
    assert_true(exec_pool_take(p, count_task, &x, &a));
    assert_int_equal(a, 1);
    atomic_store(&hold_release, true);
    exec_pool_free(&p);   // runs what is left: x's 2 and y's 20
    assert_int_equal(atomic_load(&x), 2);
    assert_int_equal(atomic_load(&y), 20);
    dg_status_free(&st);
}

int main(void) {
    exec_register_kernels(&meet_kernel, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_take),
        cmocka_unit_test(test_caller_takes_back_queued_node),
        cmocka_unit_test(test_idle_caller_runs_new_node),
        cmocka_unit_test(test_crossing_value_runs_beside_busy_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
