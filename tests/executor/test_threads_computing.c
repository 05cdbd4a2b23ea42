/* exec_threads_computing: the count of kernels inside their compute function, which the
 * transport reads to decide whether its I/O thread may poll busily. While another thread runs
 * matrix products it is seen above zero; once they are done it is zero again. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "exec_executor_impl.h"
#include "testutil.h"

#define HANG_GUARD_S 60

typedef struct runner {
    dg_session *s;
    dg_output x, y;   // y = x x, x fed (a constant product would be folded away)
    dg_tensor *xv;
    atomic_bool stop;
    atomic_int steps;
    bool ok;          // true until a step fails
} runner;

static void *run_steps(void *arg) {
    runner *r = arg;
    dg_status *st = dg_status_new();
    time_t end = time(NULL) + HANG_GUARD_S;
    while (!atomic_load(&r->stop) && r->ok && time(NULL) < end) {
        dg_tensor *out = NULL;
        r->ok = dg_session_run(r->s, &r->x, &r->xv, 1, &r->y, &out, 1, NULL, 0, st);
        dg_tensor_unref(out);
        atomic_fetch_add(&r->steps, 1);
    }
    dg_status_free(&st);
    return NULL;
}

static void test_counts_kernels_while_they_compute(void **state) {
    (void)state;
    assert_int_equal(exec_threads_computing(), 0);
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    runner r = {.x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(300, 300))};
    r.y = dg_matmul(g, NULL, r.x, r.x, false, false);
    r.xv = dg_tensor_new(DG_FLOAT32, dg_shape2(300, 300), st);
    assert_non_null(r.xv);
    for (int i = 0; i < 300 * 300; i++) dg_tensor_f32(r.xv)[i] = 0.5f;
    r.s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    r.ok = true;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_steps, &r), 0);
    int seen = 0;
    time_t end = time(NULL) + HANG_GUARD_S;
    // Short sleeps between looks: a thread switch under valgrind, which runs one thread at a time.
    while (seen == 0 && time(NULL) < end && r.ok) {
        seen = exec_threads_computing();
        nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    assert_true(r.ok);
    if (seen < 1) fail_msg("no kernel seen running in %d steps of a 300x300 product", atomic_load(&r.steps));
    assert_int_equal(exec_threads_computing(), 0);
    dg_session_free(&r.s);
    dg_tensor_unref(r.xv);
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_kernels_while_they_compute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
