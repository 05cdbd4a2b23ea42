/* executor/timer.c: callbacks run at their deadlines, in order; cancel works; a timer due
 * before the one the thread sleeps for wakes it, also after that one was cancelled. */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "timer_impl.h"

typedef struct fired {
    atomic_int order;
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
}

static void wait_count(fired *f, int n, int timeout_ms) {
    int64_t end = exec_timer_now_ms() + timeout_ms;
    while (atomic_load(&f->order) < n && exec_timer_now_ms() < end) usleep(1000);
}

// A far timer puts the thread to sleep; a near one added later must fire near its own time.
static void test_earlier_timer_wakes_the_thread(void **state) {
    fired f = {0};
    mark far = {&f, 0}, near = {&f, 1};
    int64_t t0 = exec_timer_now_ms();
    uint64_t a = exec_timer_add(3000, on_fire, &far);
    assert_true(a > 0);
    usleep(20000);   // the thread now sleeps until the far deadline
    assert_true(exec_timer_add(50, on_fire, &near) > 0);
    wait_count(&f, 1, 2000);
    assert_int_equal(atomic_load(&f.order), 1);
    assert_int_equal(f.seq[0], 1);
    assert_true(f.at[1] - t0 < 1500);
    assert_true(exec_timer_cancel(a));
    assert_false(exec_timer_cancel(a));
    usleep(20000);
    assert_int_equal(exec_timer_pending(), 0);
}

// After a cancel the thread still sleeps until the cancelled deadline: an earlier timer wakes
// it, a later one fires at its own time once the thread has woken and looked again.
static void test_after_cancel(void **state) {
    fired f = {0};
    mark m0 = {&f, 0}, m1 = {&f, 1}, m2 = {&f, 2};
    int64_t t0 = exec_timer_now_ms();
    uint64_t a = exec_timer_add(400, on_fire, &m0);
    usleep(20000);
    assert_true(exec_timer_cancel(a));
    assert_true(exec_timer_add(600, on_fire, &m2) > 0);   // after the cancelled deadline
    assert_true(exec_timer_add(100, on_fire, &m1) > 0);   // before it
    wait_count(&f, 2, 3000);
    assert_int_equal(atomic_load(&f.order), 2);
    assert_int_equal(f.seq[0], 1);
    assert_int_equal(f.seq[1], 2);
    assert_true(f.at[1] - t0 >= 100 && f.at[1] - t0 < 380);
    assert_true(f.at[2] - t0 >= 600 && f.at[2] - t0 < 2000);
    assert_int_equal(exec_timer_pending(), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_earlier_timer_wakes_the_thread),
        cmocka_unit_test(test_after_cancel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
