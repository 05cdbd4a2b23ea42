/* The cluster coordinator of the ps_coordinator distribution (distgraph/distribute.h): TensorFlow
 * 2's ClusterCoordinator for C. One thread per worker task holds a session on that worker's
 * master and runs the closures the program schedules (a training step: its feeds, copied, its
 * fetches and the train op), each on whichever worker is free. A step that fails with an error
 * a lost task gives (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, CANCELLED) while the worker no
 * longer answers a probe (a read of the global step through its session) goes back to the
 * queue, and the worker is set aside; its thread tries a fresh session every retry interval and
 * takes work again once the worker answers. Any other error, one whose worker still answers
 * (a kernel's error reaches the other tasks as ABORTED), or a step's MAX_TRIES-th failure is
 * the program's: it is kept and given to the next call. Built on the public session API only. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator_impl.h"
#include "training_impl.h"

#define RETRY_FIRST_MS 500
#define RETRY_MAX_MS 5000
#define RECONNECT_WAIT_MS 1000   // how long a fresh session waits for a returning worker's master
#define MAX_TRIES 5              // a step that failed on this many workers fails the job

typedef struct closure {
    int n_feeds, n_fetches;
    int tries;
    dg_output *feeds, *fetches;
    dg_tensor **values;   // owned copies of the feed values
} closure;

typedef struct coord_worker {
    training_coordinator *c;
    int index;
    char target[300];
    dg_session *s;
    bool alive;
    int64_t steps, failures, steps_when_back;
    bool said_down;   // a line said it was down or failed
    pthread_t thread;
    bool started;
} coord_worker;

struct training_coordinator {
    pthread_mutex_t mu;
    pthread_cond_t cv;   // the queue, the alive set, the work in flight or the error changed
    dg_graph *g;
    dg_node *train;
    dg_output probe;     // what a worker that failed a step is asked for
    dg_session_options so;
    int64_t no_worker_timeout_ms;
    bool log;
    closure **queue;     // FIFO; a step given back goes to the front
    int q_len, q_cap;
    int64_t in_flight, finished, rescheduled;
    dg_tensor **latest;  // the newest finished step's fetches, not yet handed out
    int n_latest;
    dg_status *error;    // the first step error that is not a worker's
    bool closing;
    int n_workers, n_alive;
    struct timespec none_alive_since;
    coord_worker *workers;
};

static void closure_free(closure *k) {
    if (!k) return;
    for (int i = 0; i < k->n_feeds; i++) dg_tensor_unref(k->values[i]);
    free(k->values);
    free(k->feeds);
    free(k->fetches);
    free(k);
}

// Waits on the condition until it is signalled or ms pass. Called with c->mu held.
static void wait_ms(training_coordinator *c, int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

bool training_coordinator_worker_error(dg_code code) {
    return code == DG_UNAVAILABLE || code == DG_ABORTED || code == DG_DEADLINE_EXCEEDED || code == DG_CANCELLED;
}

// Called with c->mu held.
static void push(training_coordinator *c, closure *k, bool front) {
    if (c->q_len == c->q_cap) {
        int cap = c->q_cap ? 2 * c->q_cap : 8;
        closure **q = realloc(c->queue, (size_t)cap * sizeof *q);
        if (!q) abort();
        c->queue = q;
        c->q_cap = cap;
    }
    if (front) {
        memmove(c->queue + 1, c->queue, (size_t)c->q_len * sizeof *c->queue);
        c->queue[0] = k;
    } else {
        c->queue[c->q_len] = k;
    }
    c->q_len++;
}

static closure *pop(training_coordinator *c) {
    closure *k = c->queue[0];
    memmove(c->queue, c->queue + 1, (size_t)(c->q_len - 1) * sizeof *c->queue);
    c->q_len--;
    return k;
}

// The worker is set aside (called with c->mu held).
static void set_dead(coord_worker *w, const dg_status *why) {
    training_coordinator *c = w->c;
    w->alive = false;
    w->failures++;
    if (--c->n_alive == 0) clock_gettime(CLOCK_MONOTONIC, &c->none_alive_since);
    w->said_down = true;
    if (c->log)
        fprintf(stderr, "distgraph: coordinator: worker %d (%s) failed: %s: %s; its step goes back to the queue, %d "
                "worker%s left\n", w->index, w->target, dg_code_name(dg_status_code(why)), dg_status_message(why),
                c->n_alive, c->n_alive == 1 ? "" : "s");
    pthread_cond_broadcast(&c->cv);
}

// A set-aside worker: a fresh session, when its master answers.
static bool reconnect(coord_worker *w, dg_status *st) {
    dg_session_free(&w->s);
    dg_session_options so = w->c->so;
    so.wait_for_tasks_ms = RECONNECT_WAIT_MS;
    w->s = dg_session_new(w->c->g, w->target, &so, st);
    return w->s != NULL;
}

// Whether a worker whose step failed still runs steps: the probe through its session. Called
// with c->mu held; unlocks it for the call.
static bool answers(coord_worker *w) {
    training_coordinator *c = w->c;
    pthread_mutex_unlock(&c->mu);
    dg_status *st = dg_status_new();
    dg_tensor *v = NULL;
    bool ok = dg_session_run(w->s, NULL, NULL, 0, &c->probe, &v, 1, NULL, 0, st);
    dg_tensor_unref(v);
    dg_status_free(&st);
    pthread_mutex_lock(&c->mu);
    return ok;
}

static void *worker_main(void *arg) {
    coord_worker *w = arg;
    training_coordinator *c = w->c;
    dg_status *st = dg_status_new();
    int64_t retry = 0;   // the first session at once
    pthread_mutex_lock(&c->mu);
    while (!c->closing) {
        if (!w->alive) {
            if (retry > 0) wait_ms(c, retry);
            if (c->closing) break;
            pthread_mutex_unlock(&c->mu);
            bool back = reconnect(w, st);
            pthread_mutex_lock(&c->mu);
            if (!back) {
                if (!w->said_down && c->log)
                    fprintf(stderr, "distgraph: coordinator: worker %d (%s) is not up (%s: %s); it takes work when it "
                            "answers\n", w->index, w->target, dg_code_name(dg_status_code(st)), dg_status_message(st));
                w->said_down = true;
                retry = retry == 0 ? RETRY_FIRST_MS : retry * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : retry * 2;
                continue;
            }
            retry = RETRY_FIRST_MS;
            w->alive = true;
            w->steps_when_back = w->steps;
            c->n_alive++;
            if (c->log && w->said_down)
                fprintf(stderr, "distgraph: coordinator: worker %d (%s) is %s\n", w->index, w->target,
                        w->failures ? "back" : "up");
            w->said_down = false;
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        if (c->q_len == 0) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        closure *k = pop(c);
        c->in_flight++;
        pthread_mutex_unlock(&c->mu);
        dg_tensor **got = k->n_fetches ? calloc((size_t)k->n_fetches, sizeof *got) : NULL;
        if (k->n_fetches && !got) abort();
        bool ok = dg_session_run(w->s, k->feeds, k->values, k->n_feeds, k->fetches, got, k->n_fetches, &c->train, 1,
                                 st);
        pthread_mutex_lock(&c->mu);
        c->in_flight--;
        if (ok) {
            w->steps++;
            c->finished++;
            for (int i = 0; i < c->n_latest; i++) dg_tensor_unref(c->latest[i]);
            free(c->latest);
            c->latest = got;
            c->n_latest = k->n_fetches;
            closure_free(k);
        } else if (training_coordinator_worker_error(dg_status_code(st)) && ++k->tries < MAX_TRIES &&
                   !answers(w)) {
            free(got);
            push(c, k, true);
            c->rescheduled++;
            set_dead(w, st);
        } else {
            free(got);
            if (dg_status_ok(c->error)) {
                dg_status_copy(c->error, st);
                if (k->tries >= MAX_TRIES)
                    dg_status_prepend(c->error, "a step failed %d times, on worker %d (%s) last", k->tries, w->index,
                                      w->target);
                else
                    dg_status_prepend(c->error, "a step on worker %d (%s)", w->index, w->target);
            }
            closure_free(k);
        }
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    dg_status_free(&st);
    return NULL;
}

training_coordinator *training_coordinator_new(dg_graph *g, dg_node *train, dg_output probe,
                                               const char *const *worker_targets,
                                               int n_workers, const dg_session_options *so,
                                               int64_t no_worker_timeout_ms, bool log, dg_status *st) {
    training_coordinator *c = calloc(1, sizeof *c);
    if (!c || !(c->workers = calloc((size_t)n_workers, sizeof *c->workers)) || !(c->error = dg_status_new())) {
        if (c) free(c->workers);
        free(c);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "coordinator: out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->g = g;
    c->train = train;
    c->probe = probe;
    c->so = so ? *so : dg_session_options_default();
    c->no_worker_timeout_ms = no_worker_timeout_ms;
    c->log = log;
    c->n_workers = n_workers;
    // Each worker's thread opens its session (the workers in any order, and a worker that is
    // not up takes work when it answers); until one has, steps wait in the queue.
    clock_gettime(CLOCK_MONOTONIC, &c->none_alive_since);
    for (int i = 0; i < n_workers; i++) {
        coord_worker *w = &c->workers[i];
        w->c = c;
        w->index = i;
        snprintf(w->target, sizeof w->target, "%s", worker_targets[i]);
    }
    for (int i = 0; i < n_workers; i++) {
        if (pthread_create(&c->workers[i].thread, NULL, worker_main, &c->workers[i]) != 0) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "coordinator: cannot start a thread: %s", strerror(errno));
            training_coordinator_free(&c);
            return NULL;
        }
        c->workers[i].started = true;
    }
    return c;
}

// Called with c->mu held: false (st set) when the program's error is kept or no worker has
// answered for the timeout.
static bool healthy(training_coordinator *c, dg_status *st) {
    if (!dg_status_ok(c->error)) {
        dg_status_copy(st, c->error);
        return false;
    }
    if (c->n_alive == 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t gone = (int64_t)(now.tv_sec - c->none_alive_since.tv_sec) * 1000 +
                       (now.tv_nsec - c->none_alive_since.tv_nsec) / 1000000;
        if (gone >= c->no_worker_timeout_ms) {
            char who[64];
            if (c->n_workers == 1) snprintf(who, sizeof who, "the worker has");
            else snprintf(who, sizeof who, "none of the %d workers has", c->n_workers);
            dg_status_setf(st, DG_UNAVAILABLE, "coordinator: %s answered for %lld ms (the first at %s; %d step%s "
                           "waiting): start the worker tasks, or check the cluster's worker addresses", who,
                           (long long)gone, c->workers[0].target, c->q_len, c->q_len == 1 ? "" : "s");
            return false;
        }
    }
    return true;
}

bool training_coordinator_schedule(training_coordinator *c, const dg_output *feeds, dg_tensor *const *values,
                                   int n_feeds, const dg_output *fetches, int n_fetches, dg_status *st) {
    closure *k = calloc(1, sizeof *k);
    if (!k) abort();
    k->n_feeds = n_feeds;
    k->n_fetches = n_fetches;
    if ((n_feeds && (!(k->feeds = malloc((size_t)n_feeds * sizeof *k->feeds)) ||
                     !(k->values = calloc((size_t)n_feeds, sizeof *k->values)))) ||
        (n_fetches && !(k->fetches = malloc((size_t)n_fetches * sizeof *k->fetches))))
        abort();
    if (n_feeds) memcpy(k->feeds, feeds, (size_t)n_feeds * sizeof *feeds);
    if (n_fetches) memcpy(k->fetches, fetches, (size_t)n_fetches * sizeof *fetches);
    // Copies: the caller may refill its buffers for the next step while this one waits.
    for (int i = 0; i < n_feeds; i++)
        if (!(k->values[i] = dg_tensor_copy(values[i], st))) {
            dg_status_prepend(st, "coordinator: feed %d", i);
            closure_free(k);
            return false;
        }
    pthread_mutex_lock(&c->mu);
    // At most one step waits per live worker: the program's loop stays a step or two ahead.
    bool ok;
    while ((ok = healthy(c, st)) && c->q_len >= (c->n_alive > 0 ? c->n_alive : 1)) wait_ms(c, 100);
    if (ok) {
        push(c, k, false);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (!ok) closure_free(k);
    return ok;
}

int training_coordinator_take_latest(training_coordinator *c, dg_tensor **fetched, int n) {
    pthread_mutex_lock(&c->mu);
    int got = 0;
    if (c->latest && c->n_latest == n) {
        for (int i = 0; i < n; i++) fetched[i] = c->latest[i];
        free(c->latest);
        c->latest = NULL;
        c->n_latest = 0;
        got = n;
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}

bool training_coordinator_wait(training_coordinator *c, dg_status *st) {
    pthread_mutex_lock(&c->mu);
    bool ok;
    while ((ok = healthy(c, st)) && c->q_len + c->in_flight > 0) wait_ms(c, 100);
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void training_coordinator_counts(training_coordinator *c, int64_t *finished, int64_t *rescheduled, int *alive) {
    pthread_mutex_lock(&c->mu);
    if (finished) *finished = c->finished;
    if (rescheduled) *rescheduled = c->rescheduled;
    if (alive) *alive = c->n_alive;
    pthread_mutex_unlock(&c->mu);
}

void training_coordinator_free(training_coordinator **cp) {
    training_coordinator *c = cp ? *cp : NULL;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_workers; i++) {
        if (c->workers[i].started) pthread_join(c->workers[i].thread, NULL);
        dg_session_free(&c->workers[i].s);
    }
    if (c->log) {
        strbuf b = {0};
        for (int i = 0; i < c->n_workers; i++) {
            const coord_worker *w = &c->workers[i];
            sb_addf(&b, "%s worker %d %lld", i ? "," : "", i, (long long)w->steps);
            if (w->failures)
                sb_addf(&b, " (failed %lld time%s, %lld since it came back)", (long long)w->failures,
                        w->failures == 1 ? "" : "s", (long long)(w->steps - w->steps_when_back));
        }
        fprintf(stderr, "distgraph: coordinator: %lld steps ran:%s; %lld given back after a worker failed, %d "
                "dropped unrun\n", (long long)c->finished, sb_str(&b), (long long)c->rescheduled, c->q_len);
        free(b.p);
    }
    for (int i = 0; i < c->q_len; i++) closure_free(c->queue[i]);
    free(c->queue);
    for (int i = 0; i < c->n_latest; i++) dg_tensor_unref(c->latest[i]);
    free(c->latest);
    dg_status_free(&c->error);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->workers);
    free(c);
    *cp = NULL;
}
