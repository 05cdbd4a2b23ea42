/* The rendezvous's abort marks: a hash set by step id that ends with its step and is capped
 * (the oldest go first), so a server told to abort many steps that never end here neither
 * slows down nor grows without bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "exec_rendezvous_impl.h"

typedef struct got {
    int calls;
    dg_code code;
    dg_tensor *t;
} got;

static void on_recv(void *arg, int node, dg_tensor *t, const dg_status *st) {
    (void)node;
    got *g = arg;
    g->calls++;
    g->code = st ? dg_status_code(st) : DG_OK;
    g->t = t;
}

// Sends then receives one value in step; returns the receive's code.
static dg_code round_trip(exec_rendezvous *r, int64_t step, dg_tensor *t) {
    dg_status *st = dg_status_new();
    bool sent = exec_rendezvous_send(r, step, "a;1;b;x;0:0", t, st);
    dg_code code = dg_status_code(st);
    dg_status_free(&st);
    if (!sent) return code;
    got g = {0, DG_OK, NULL};
    exec_rendezvous_recv_async(r, step, "a;1;b;x;0:0", on_recv, &g, 0);
    assert_int_equal(g.calls, 1);
    dg_tensor_unref(g.t);
    return g.code;
}

static void test_abort_marks(void **state) {
    (void)state;
    exec_rendezvous *r = exec_rendezvous_new();
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape1(4), st);
    memset(dg_tensor_data(t), 0, 4 * sizeof(float));
    dg_status *why = dg_status_new();
    dg_status_set(why, DG_ABORTED, "test");
    for (int64_t s = 1; s <= 60000; s++) exec_rendezvous_abort(r, s, why);
    assert_int_equal(exec_rendezvous_num_abort_marks(r), 60000);
    exec_rendezvous_abort(r, 17, why);   // once per step
    assert_int_equal(exec_rendezvous_num_abort_marks(r), 60000);
    // An aborted step fails; another step goes through.
    assert_int_equal(round_trip(r, 30000, t), DG_ABORTED);
    assert_int_equal(round_trip(r, 70000, t), DG_OK);
    exec_rendezvous_end_step(r, 70000);
    // Ending a step drops its mark; the others stay.
    exec_rendezvous_end_step(r, 30000);
    assert_int_equal(exec_rendezvous_num_abort_marks(r), 59999);
    assert_int_equal(round_trip(r, 30000, t), DG_OK);
    exec_rendezvous_end_step(r, 30000);
    assert_int_equal(round_trip(r, 29999, t), DG_ABORTED);
    // Past 100000 marks the oldest go: step 1 runs again, the newest are still aborted.
    for (int64_t s = 100001; s <= 160000; s++) exec_rendezvous_abort(r, s, why);
    assert_int_equal(exec_rendezvous_num_abort_marks(r), 100000);
    assert_int_equal(round_trip(r, 1, t), DG_OK);
    exec_rendezvous_end_step(r, 1);
    assert_int_equal(round_trip(r, 160000, t), DG_ABORTED);
    assert_int_equal(round_trip(r, 59000, t), DG_ABORTED);
    assert_int_equal(round_trip(r, 19999, t), DG_OK);   // the 19999 oldest went
    exec_rendezvous_end_step(r, 19999);
    assert_int_equal(round_trip(r, 20000, t), DG_ABORTED);
    for (int64_t s = 20000; s <= 60000; s++) exec_rendezvous_end_step(r, s);
    for (int64_t s = 100001; s <= 160000; s++) exec_rendezvous_end_step(r, s);
    assert_int_equal(exec_rendezvous_num_abort_marks(r), 0);
    dg_tensor_unref(t);
    dg_status_free(&why);
    dg_status_free(&st);
    exec_rendezvous_free(&r);
}

static bool step_7_runs(void *ctx, int64_t step) {
    (void)ctx;
    return step == 7;
}

// Values no step ever takes (their master died before starting it here) are dropped once
// stale, unless their step runs here; a late start of a dropped step fails at once.
static void test_drop_stale(void **state) {
    (void)state;
    exec_rendezvous *r = exec_rendezvous_new();
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_scalar_f32(1.5f);
    assert_true(exec_rendezvous_deliver(r, 5, "k;0", t, st));
    assert_true(exec_rendezvous_deliver(r, 5, "k;1", t, st));
    assert_true(exec_rendezvous_deliver(r, 7, "k;0", t, st));
    assert_ok(st);
    assert_int_equal(exec_rendezvous_drop_stale(r, 60000, NULL, NULL), 0);   // not stale yet
    assert_int_equal(exec_rendezvous_drop_stale(r, 0, step_7_runs, NULL), 2);
    got g = {0};
    exec_rendezvous_recv_async(r, 5, "k;0", on_recv, &g, 0);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.code, DG_ABORTED);
    got h = {0};
    exec_rendezvous_recv_async(r, 7, "k;0", on_recv, &h, 0);   // kept: its step runs
    assert_int_equal(h.calls, 1);
    assert_int_equal(h.code, DG_OK);
    assert_true(dg_tensor_data(h.t) && *(float *)dg_tensor_data(h.t) == 1.5f);
    dg_tensor_unref(h.t);
    dg_tensor_unref(t);
    dg_status_free(&st);
    exec_rendezvous_free(&r);
}

static void on_cancel(void *arg, const dg_status *why) {
    got *g = arg;
    g->calls++;
    g->code = dg_status_code(why);
}

// A step ended while one of its receives waited (a peer's END_STEP out of turn): the receive
// fails and the step's cancellers run, so that the step ends instead of waiting for ever; a
// receive of another step is not touched.
static void test_end_step_fails_waiting(void **state) {
    (void)state;
    exec_rendezvous *r = exec_rendezvous_new();
    got g = {0, DG_OK, NULL}, other = {0, DG_OK, NULL}, c = {0, DG_OK, NULL};
    exec_rendezvous_recv_async(r, 9, "k;0", on_recv, &g, 0);
    exec_rendezvous_recv_async(r, 10, "k;0", on_recv, &other, 0);
    dg_status *st = dg_status_new();
    assert_true(exec_rendezvous_on_cancel(r, 9, on_cancel, &c, st) != 0);
    assert_int_equal(g.calls, 0);
    exec_rendezvous_end_step(r, 9);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.code, DG_ABORTED);
    assert_null(g.t);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.code, DG_ABORTED);
    assert_int_equal(other.calls, 0);
    dg_status_set(st, DG_CANCELLED, "the test is done");
    exec_rendezvous_abort(r, 10, st);
    assert_int_equal(other.calls, 1);
    dg_status_free(&st);
    exec_rendezvous_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_marks),
        cmocka_unit_test(test_drop_stale),
        cmocka_unit_test(test_end_step_fails_waiting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
