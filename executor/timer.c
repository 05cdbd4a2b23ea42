/* The process-wide timer (see timer_impl.h). Pending timers are a list sorted by deadline:
 * the waiting kernels it serves are few (one per accumulator take and per blocked dequeue), so
 * an insertion walk is cheaper than a heap's bookkeeping. The thread starts on the first
 * exec_timer_add and is joined at exit (atexit), so leak checkers see no live thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "base_impl.h"
#include "timer_impl.h"

typedef struct timer {
    struct timer *next;
    uint64_t id;
    int64_t deadline_ms;
    exec_timer_fn fn;
    void *arg;
} timer;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;   // initialised with the monotonic clock when the thread starts
static timer *pending;      // sorted by deadline, then by id
static int n_pending;
static uint64_t next_id;
static bool started, stopping;
static pthread_t thread;
// What the thread waits for: INT64_MAX when it sleeps until signalled, a deadline when it
// sleeps until then, INT64_MIN while it is awake (it looks at the list before sleeping again).
// A new timer wakes it only when due before that: a timer added and cancelled per step (the
// sessions' grace timers) then costs no thread wake-up.
static int64_t wake_at = INT64_MIN;

int64_t exec_timer_now_ms(void) { return base_now_ms(); }

static void *run(void *unused) {
    (void)unused;
    pthread_mutex_lock(&mu);
    while (!stopping) {
        if (!pending) {
            wake_at = INT64_MAX;
            pthread_cond_wait(&cv, &mu);
            wake_at = INT64_MIN;
            continue;
        }
        int64_t now = exec_timer_now_ms();
        if (pending->deadline_ms > now) {
            struct timespec ts;
            ts.tv_sec = (time_t)(pending->deadline_ms / 1000);
            ts.tv_nsec = (long)(pending->deadline_ms % 1000) * 1000000L;
            wake_at = pending->deadline_ms;
            pthread_cond_timedwait(&cv, &mu, &ts);
            wake_at = INT64_MIN;
            continue;
        }
        timer *t = pending;
        pending = t->next;
        n_pending--;
        // Unlocked while the callback runs: it may add or cancel timers.
        pthread_mutex_unlock(&mu);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

// Pending timers are dropped without being called: at exit nobody waits for them.
static void stop_at_exit(void) {
    pthread_mutex_lock(&mu);
    bool was_started = started;
    stopping = true;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    if (was_started) pthread_join(thread, NULL);
    pthread_mutex_lock(&mu);
    for (timer *t = pending, *next; t; t = next) {
        next = t->next;
        free(t);
    }
    pending = NULL;
    n_pending = 0;
    started = false;
    pthread_mutex_unlock(&mu);
}

// Called with mu held.
static bool start_locked(void) {
    if (started) return true;
    if (stopping) return false;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&thread, NULL, run, NULL) != 0) {
        pthread_cond_destroy(&cv);
        return false;
    }
    started = true;
    atexit(stop_at_exit);
    return true;
}

uint64_t exec_timer_add(int64_t delay_ms, exec_timer_fn fn, void *arg) {
    timer *t = calloc(1, sizeof *t);
    if (!t) return 0;
    t->deadline_ms = exec_timer_now_ms() + (delay_ms > 0 ? delay_ms : 0);
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&mu);
    if (!start_locked()) {
        pthread_mutex_unlock(&mu);
        free(t);
        return 0;
    }
    t->id = ++next_id;
    timer **pp = &pending;
    while (*pp && (*pp)->deadline_ms <= t->deadline_ms) pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    n_pending++;
    // Only a deadline before the one the thread sleeps until changes how long it sleeps.
    if (t->deadline_ms < wake_at) pthread_cond_signal(&cv);
    uint64_t id = t->id;
    pthread_mutex_unlock(&mu);
    return id;
}

bool exec_timer_cancel(uint64_t id) {
    if (id == 0) return false;
    timer *found = NULL;
    pthread_mutex_lock(&mu);
    for (timer **pp = &pending; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            found = *pp;
            *pp = found->next;
            n_pending--;
            break;
        }
    pthread_mutex_unlock(&mu);
    free(found);
    return found != NULL;
}

int exec_timer_pending(void) {
    pthread_mutex_lock(&mu);
    int n = n_pending;
    pthread_mutex_unlock(&mu);
    return n;
}
