/* The cluster coordinator of the ps_coordinator distribution (distgraph/distribute.h): TensorFlow
 * 2's ClusterCoordinator for C. One thread per worker task holds a session on that worker's
 * master and runs the closures the program schedules (a training step: its feeds, copied, its
 * fetches and the train op), each on whichever worker is free. A step that fails while its
 * worker no longer answers a probe (a read of the global step through its session: a lost task,
 * or a restarted one that forgot the session) goes back to the queue, and the worker is set
 * aside; its thread asks the worker's server for its counters after a backoff (0.5 s doubling
 * to 5 s) and opens a fresh session once it answers. An error whose worker still answers (a
 * kernel's error reaches the other tasks as ABORTED), or a step's MAX_TRIES-th failure, is the
 * program's: it is kept and given to the next call. A step counts as in flight until it is
 * settled so, so a wait never ends while one is being probed. Built on the public API only. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator_impl.h"
#include "distgraph/server.h"
#include "training_impl.h"

#define RETRY_FIRST_MS 500
#define RETRY_MAX_MS 5000
#define PING_MS 1000             // how long a set-aside worker's server has to answer
#define MAX_TRIES 5              // a step that failed on this many workers fails the job

typedef struct closure {
    int n_feeds, n_fetches;
    int tries;
    int64_t id;          // its number in the order scheduled
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
    dg_output *latest_of;   // ... and what they are
    int n_latest;
    int64_t latest_id;   // the step they come from (-1: none yet)
    int64_t next_id;
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

// Now plus ms on CLOCK_MONOTONIC (the condition's clock).
static struct timespec deadline_in(int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

// Waits on the condition until it is signalled or ms pass. Called with c->mu held.
static void wait_ms(training_coordinator *c, int64_t ms) {
    struct timespec ts = deadline_in(ms);
    (void)pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

// Waits the whole ms (however often the condition is signalled) or until closing. Called with
// c->mu held.
static void sleep_ms(training_coordinator *c, int64_t ms) {
    struct timespec until = deadline_in(ms);
    while (!c->closing && pthread_cond_timedwait(&c->cv, &c->mu, &until) != ETIMEDOUT) {
    }
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

// A set-aside worker: a fresh session, once its server answers within PING_MS (the session's
// own options, its wait for the ps tasks included, stay the program's).
static bool reconnect(coord_worker *w, dg_status *st) {
    dg_session_free(&w->s);
    const dg_session_options *so = &w->c->so;
    dg_server_stats stats;
    if (!dg_server_query_stats(w->target, so->curve_public_key, so->curve_secret_key, PING_MS, &stats, st))
        return false;
    w->s = dg_session_new(w->c->g, w->target, so, st);
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
            if (retry > 0) sleep_ms(c, retry);
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
        if (ok) {
            w->steps++;
            c->finished++;
            if (k->id > c->latest_id) {   // a step given back may finish after later ones
                for (int i = 0; i < c->n_latest; i++) dg_tensor_unref(c->latest[i]);
                free(c->latest);
                free(c->latest_of);
                c->latest = got;
                c->latest_of = k->fetches;
                k->fetches = NULL;
                c->n_latest = k->n_fetches;
                c->latest_id = k->id;
            } else {
                for (int i = 0; i < k->n_fetches; i++) dg_tensor_unref(got[i]);
                free(got);
            }
            closure_free(k);
        } else if (++k->tries < MAX_TRIES && !answers(w)) {
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
        c->in_flight--;   // settled: finished, given back or failed
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->latest_id = -1;
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
        int rc = pthread_create(&c->workers[i].thread, NULL, worker_main, &c->workers[i]);
        if (rc != 0) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "coordinator: cannot start a thread: %s", strerror(rc));
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
    k->id = c->next_id++;
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

int training_coordinator_take_latest(training_coordinator *c, const dg_output *fetches, dg_tensor **fetched, int n) {
    pthread_mutex_lock(&c->mu);
    int got = 0;
    bool same = c->latest && c->n_latest == n;
    for (int i = 0; same && i < n; i++)
        same = c->latest_of[i].node == fetches[i].node && c->latest_of[i].index == fetches[i].index;
    if (same) {
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
    free(c->latest_of);
    dg_status_free(&c->error);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->workers);
    free(c);
    *cp = NULL;
}
