/* executor/timer.c: callbacks run at their deadlines, in order; cancel works; a timer due
 * before the one the thread sleeps for wakes it, also after that one was cancelled.
 *
 * No check here bounds how late a timer may fire on a normal run: the test runs under
 * valgrind and beside other tests, where any such bound is a guess. A timer's lateness is
 * checked against deadlines of its own (a timer never fires early) and against causality: a
 * thread that failed to wake for a near timer would fire it only at the far deadline it slept
 * for, so that deadline is set far out (SLEPT_THROUGH_MS) and the near timer must come first.
 * HANG_GUARD_MS only ends a test whose timer never fires, with a failure instead of a hang;
 * neither is a claim about speed. */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "timer_impl.h"

// How long a test waits for a timer that must fire before failing: a deadlock guard only.
#define HANG_GUARD_MS 60000
// A deadline the thread sleeps for when the test wants it asleep: a timer fired this late
// was not woken for. Far beyond any scheduling delay, well within HANG_GUARD_MS.
#define SLEPT_THROUGH_MS 30000

typedef struct fired {
    atomic_int order;   // callbacks begun
    atomic_int done;    // callbacks that have written seq[] and at[]
    int64_t at[4];
    int seq[4];
} fired;

typedef struct mark {
    fired *f;
    int which;
} mark;

static void on_fire(void *arg) {
    mark *m = arg;
    int k = atomic_fetch_add(&m->f->order, 1);
    if (k < 4) m->f->seq[k] = m->which;
    m->f->at[m->which] = exec_timer_now_ms();
    atomic_fetch_add(&m->f->done, 1);   // publishes seq[] and at[] to the waiting test
}

// Waits until n timers fired; fails the test when HANG_GUARD_MS pass first.
static void wait_count(fired *f, int n) {
    int64_t end = exec_timer_now_ms() + HANG_GUARD_MS;
    while (atomic_load(&f->done) < n) {
        if (exec_timer_now_ms() > end)
            fail_msg("%d of %d timers fired in %d ms (hang guard)", atomic_load(&f->done), n, HANG_GUARD_MS);
        usleep(1000);
    }
}

// A far timer puts the thread to sleep; a near one added later must wake it and fire first,
// while the far one is still pending (it can still be cancelled).
static void test_earlier_timer_wakes_the_thread(void **state) {
    static fired f;   // static: a timer still pending after a failed check writes to no dead frame
    memset(&f, 0, sizeof f);
    static mark far, near;
    far = (mark){&f, 0};
    near = (mark){&f, 1};
    int64_t t0 = exec_timer_now_ms();
    uint64_t a = exec_timer_add(SLEPT_THROUGH_MS, on_fire, &far);
    assert_true(a > 0);
    usleep(20000);   // the thread now sleeps until the far deadline
    int64_t t_near = exec_timer_now_ms();
    assert_true(exec_timer_add(50, on_fire, &near) > 0);
    wait_count(&f, 1);
    assert_int_equal(f.seq[0], 1);
    assert_true(f.at[1] - t_near >= 50);   // not early
    // Woken for it: fired before the deadline the thread slept for, the far timer still pending.
    assert_true(f.at[1] - t0 < SLEPT_THROUGH_MS);
    assert_true(exec_timer_cancel(a));
    assert_false(exec_timer_cancel(a));
    assert_int_equal(atomic_load(&f.order), 1);
    assert_int_equal(exec_timer_pending(), 0);
}

// After a cancel the thread still sleeps until the cancelled deadline: an earlier timer wakes
// it (fires before that deadline, set far out here).
static void test_earlier_timer_after_cancel(void **state) {
    static fired f;   // static: a timer still pending after a failed check writes to no dead frame
    memset(&f, 0, sizeof f);
    static mark m0, m1;
    m0 = (mark){&f, 0};
    m1 = (mark){&f, 1};
    int64_t t0 = exec_timer_now_ms();
    uint64_t a = exec_timer_add(SLEPT_THROUGH_MS, on_fire, &m0);   // cancelled: never fires
    assert_true(a > 0);
    usleep(20000);   // the thread now sleeps until a's deadline
    assert_true(exec_timer_cancel(a));
    int64_t t1 = exec_timer_now_ms();
    assert_true(exec_timer_add(100, on_fire, &m1) > 0);
    wait_count(&f, 1);
    assert_int_equal(f.seq[0], 1);
    assert_true(f.at[1] - t1 >= 100);
    assert_true(f.at[1] - t0 < SLEPT_THROUGH_MS);
    assert_int_equal(atomic_load(&f.order), 1);
    assert_int_equal(exec_timer_pending(), 0);
}

// A later timer, due after a cancelled deadline, fires at its own time once the thread has
// woken and looked again; an earlier one fires first. Both fire, in deadline order, neither
// early.
static void test_after_cancel(void **state) {
    static fired f;   // static: a timer still pending after a failed check writes to no dead frame
    memset(&f, 0, sizeof f);
    static mark m0, m1, m2;
    m0 = (mark){&f, 0};
    m1 = (mark){&f, 1};
    m2 = (mark){&f, 2};
    uint64_t a = exec_timer_add(400, on_fire, &m0);
    usleep(20000);
    assert_true(exec_timer_cancel(a));
    int64_t t1 = exec_timer_now_ms();
    assert_true(exec_timer_add(600, on_fire, &m2) > 0);   // after the cancelled deadline
    int64_t t2 = exec_timer_now_ms();
    assert_true(exec_timer_add(100, on_fire, &m1) > 0);   // before it
    wait_count(&f, 2);
    assert_int_equal(atomic_load(&f.order), 2);   // the cancelled one never fired
    assert_int_equal(f.seq[0], 1);
    assert_int_equal(f.seq[1], 2);
    assert_true(f.at[1] - t2 >= 100);
    assert_true(f.at[2] - t1 >= 600);
    assert_true(f.at[2] >= f.at[1]);
    assert_int_equal(exec_timer_pending(), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_earlier_timer_wakes_the_thread),
        cmocka_unit_test(test_earlier_timer_after_cancel),
        cmocka_unit_test(test_after_cancel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
