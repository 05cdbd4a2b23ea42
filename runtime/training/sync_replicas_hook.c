/* The sync replicas hook (TensorFlow's SyncReplicasOptimizerHook and the chief's queue
 * runner). Uses only the public API.
 *
 * The apply loop runs on its own thread and its own session, not on the monitored session's:
 * the monitored session frees its session on a recovery or a close without telling hooks
 * first (end is skipped after a failed run), and the loop must never run on a freed session.
 * A session compiles a signature on its first run, and two sessions compiling one graph at
 * once would both write its nodes' placements; so every signature the loop runs is compiled
 * in after_create_session, on the creating thread, before the loop starts (the apply op once
 * with num_required 0, which every take rejects before touching its accumulator).
 *
 * Following the live workers (dg_sync_replicas_hook_follow_live_workers), a probe thread of the
 * chief PINGs every other worker task through the chief's server every probe_ms. When the count
 * that answers changes, it sets the accumulators' live count (a waiting take ends with the
 * gradients of the live workers) and the number of tokens an apply enqueues (one per live
 * worker), and gives each worker that came back one token. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/device_name.h"
#include "distgraph/ops.h"
#include "distgraph/monitored_session.h"
#include "distgraph/sync_replicas.h"
#include "base_impl.h"
#include "ping_impl.h"
#include "server_impl.h"
#include "status_impl.h"

typedef struct sync_hook {
    dg_sync_replicas *sr;       // borrowed
    bool is_chief;
    char *master;               // owned; NULL: local
    int64_t last_step;          // -1: none

    pthread_mutex_t mu;         // guards the fields below
    pthread_cond_t cv;
    bool has_thread;            // a loop thread exists (joinable)
    bool finished;              // it has left its loop
    bool stop;                  // asked to stop
    dg_status *err;             // the loop's failure; OK otherwise
    pthread_t thread;
    dg_session *sess;           // the loop's own session (chief), owned
    int64_t step;               // the global step the loop last saw

    // Following the live workers: the tasks probed (endpoints, owned), and what they answered.
    dg_server *server;          // borrowed; NULL: not following
    int64_t probe_ms;
    char **endpoints;           // per task of the job but the chief's own, NULL for it
    int *tasks;
    int n_tasks;
    bool *alive;                // under mu
    int n_live;                 // under mu: the live count in force (the chief and the tasks that answered, capped at total)
    bool has_prober;            // the probe thread exists (joinable)
    pthread_t prober;
} sync_hook;

static bool run_close(sync_hook *h, dg_session *sess, int32_t code, const char *reason, dg_status *st) {
    dg_output feeds[2];
    dg_node *close = dg_sync_replicas_close_queue_op(h->sr, &feeds[0], &feeds[1]);
    size_t len = reason ? strlen(reason) : 0;
    dg_tensor *vals[2] = {dg_tensor_from_data(DG_INT32, dg_shape_scalar(), &code, st),
                          dg_tensor_new(DG_UINT8, dg_shape1((int64_t)len), st)};
    bool ok = vals[0] && vals[1];
    if (ok) {
        if (len) memcpy(dg_tensor_data(vals[1]), reason, len);
        ok = dg_session_run(sess, feeds, vals, 2, NULL, NULL, 0, &close, 1, st);
    }
    dg_tensor_unref(vals[0]);
    dg_tensor_unref(vals[1]);
    return ok;
}

static bool run_apply(sync_hook *h, int32_t num_required, int64_t *new_step, dg_status *st) {
    dg_output feed = dg_sync_replicas_num_required(h->sr);
    dg_output fetch = dg_sync_replicas_new_global_step(h->sr);
    dg_node *target = dg_sync_replicas_chief_apply_op(h->sr);
    dg_tensor *nr = dg_tensor_from_data(DG_INT32, dg_shape_scalar(), &num_required, st);
    dg_tensor *out = NULL;
    bool ok = nr && dg_session_run(h->sess, &feed, &nr, 1, &fetch, &out, 1, &target, 1, st);
    if (ok) *new_step = dg_tensor_i64(out)[0];
    dg_tensor_unref(out);
    dg_tensor_unref(nr);
    return ok;
}

// ---- following the live workers ----

// Whether the task at endpoint answers a PING within timeout_ms.
static bool task_answers(dg_server *server, const char *endpoint, int64_t timeout_ms) {
    dg_status st = DG_STATUS_INIT;
    bool ok = rt_server_ping(server, endpoint, NULL, 0, timeout_ms, NULL, NULL, &st);
    status_impl_clear(&st);
    return ok;
}

// n tokens carrying step, for workers that came back.
static bool run_extra_tokens(sync_hook *h, dg_session *sess, int n, int64_t step, dg_status *st) {
    dg_output feed;
    dg_node *op = dg_sync_replicas_enqueue_tokens_op(h->sr, &feed);
    dg_tensor *v = dg_tensor_new(DG_INT64, dg_shape1(n), st);
    if (v)
        for (int i = 0; i < n; i++) dg_tensor_i64(v)[i] = step;
    bool ok = v && dg_session_run(sess, &feed, &v, 1, NULL, NULL, 0, &op, 1, st);
    dg_tensor_unref(v);
    if (!ok) dg_status_prepend(st, "sync replicas: enqueuing %d tokens for workers that came back", n);
    return ok;
}

static bool run_set_live(sync_hook *h, dg_session *sess, int32_t live, dg_status *st) {
    dg_output feed;
    dg_node *op = dg_sync_replicas_set_live_op(h->sr, &feed);
    dg_tensor *v = dg_tensor_from_data(DG_INT32, dg_shape_scalar(), &live, st);
    bool ok = v && dg_session_run(sess, &feed, &v, 1, NULL, NULL, 0, &op, 1, st);
    dg_tensor_unref(v);
    if (!ok) dg_status_prepend(st, "sync replicas: setting the live worker count %d", live);
    return ok;
}

// One round of probes: which tasks answer now, and how many workers are live (the chief
// included, at most total_num_replicas). Says on stdout which tasks were lost or came back.
static int probe_round(sync_hook *h, bool quiet) {
    const dg_sync_replicas_options *o = dg_sync_replicas_options_of(h->sr);
    int n_live = 1;
    for (int i = 0; i < h->n_tasks; i++) {
        if (!h->endpoints[i]) continue;
        bool up = task_answers(h->server, h->endpoints[i], h->probe_ms);
        pthread_mutex_lock(&h->mu);
        bool was = h->alive[i];
        h->alive[i] = up;
        pthread_mutex_unlock(&h->mu);
        if (up) n_live++;
        if (!quiet && up != was)
            printf("sync replicas: worker task %d %s\n", h->tasks[i], up ? "answers again" : "is lost (no answer)");
    }
    return n_live < o->total_num_replicas ? n_live : o->total_num_replicas;
}

static bool prober_stopped(sync_hook *h) {
    pthread_mutex_lock(&h->mu);
    bool stop = h->stop;
    pthread_mutex_unlock(&h->mu);
    return stop;
}

static void *prober(void *arg) {
    sync_hook *h = arg;
    const dg_sync_replicas_options *o = dg_sync_replicas_options_of(h->sr);
    dg_status *st = dg_status_new();
    while (!prober_stopped(h)) {
        int64_t start = base_now_ms();
        int n_live = probe_round(h, false);
        pthread_mutex_lock(&h->mu);
        int before = h->n_live;
        pthread_mutex_unlock(&h->mu);
        if (n_live != before && !prober_stopped(h)) {
            pthread_mutex_lock(&h->mu);
            int64_t step = h->step;
            pthread_mutex_unlock(&h->mu);
            // The cap and the token count (an apply waiting in its takes enqueues the new
            // count). A worker that came back may have given its first gradients to an apply
            // that enqueued tokens for the others only: one more token each, or it would wait
            // for one while the next take waits for it (a token too many costs one step).
            bool ok = run_set_live(h, h->sess, n_live, st) &&
                      (n_live <= before || run_extra_tokens(h, h->sess, n_live - before, step, st));
            // Kept only once in force: a failed change is tried again on the next round.
            if (ok) {
                pthread_mutex_lock(&h->mu);
                h->n_live = n_live;
                pthread_mutex_unlock(&h->mu);
            }
            if (ok) {
                printf("sync replicas: %d of %d workers live: a step averages %d gradients, %d tokens\n", n_live,
                       o->total_num_replicas, n_live < o->replicas_to_aggregate ? n_live : o->replicas_to_aggregate,
                       n_live);
            } else if (!prober_stopped(h)) {
                fprintf(stderr, "distgraph: %s\n", dg_status_message(st));
            }
            fflush(stdout);
            dg_status_reset(st);
        }
        int64_t left = h->probe_ms - (base_now_ms() - start);
        while (left > 0 && !prober_stopped(h)) {
            int64_t nap = left < 50 ? left : 50;
            struct timespec ts = {0, (long)nap * 1000000L};
            nanosleep(&ts, NULL);
            left -= nap;
        }
    }
    dg_status_free(&st);
    return NULL;
}

static void *loop(void *arg) {
    sync_hook *h = arg;
    const dg_sync_replicas_options *o = dg_sync_replicas_options_of(h->sr);
    dg_status *st = dg_status_new();
    for (;;) {
        pthread_mutex_lock(&h->mu);
        bool stop = h->stop;
        int64_t step = h->step;
        pthread_mutex_unlock(&h->mu);
        if (stop) break;
        if (h->last_step >= 0 && step >= h->last_step) {
            // The last step is made: waiting workers end (OUT_OF_RANGE once the tokens are gone).
            char reason[128];
            snprintf(reason, sizeof reason, "the chief stopped at global step %lld", (long long)step);
            if (!run_close(h, h->sess, 0, reason, st)) {
                pthread_mutex_lock(&h->mu);
                dg_status_copy(h->err, st);
                dg_status_prepend(h->err, "sync replicas: closing the token queue at the last step");
                pthread_mutex_unlock(&h->mu);
            }
            break;
        }
        int64_t new_step = -1;
        if (run_apply(h, o->replicas_to_aggregate, &new_step, st)) {
            pthread_mutex_lock(&h->mu);
            h->step = new_step;
            pthread_mutex_unlock(&h->mu);
            continue;
        }
        pthread_mutex_lock(&h->mu);
        stop = h->stop;
        if (!stop) {
            dg_status_copy(h->err, st);
            dg_status_prepend(h->err, "sync replicas apply loop");
        }
        pthread_mutex_unlock(&h->mu);
        // The workers waiting for tokens fail with the same cause instead of waiting on.
        if (!stop) {
            dg_status *ignored = dg_status_new();
            run_close(h, h->sess, (int32_t)dg_status_code(st), dg_status_message(st), ignored);
            dg_status_free(&ignored);
        }
        break;
    }
    dg_status_free(&st);
    pthread_mutex_lock(&h->mu);
    h->finished = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

// Stops the loop (cancelling a take it waits in) and frees its session. Idempotent.
static void stop_loop(sync_hook *h) {
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    bool has = h->has_thread;
    pthread_mutex_unlock(&h->mu);
    if (has) {
        dg_node *cancel = dg_sync_replicas_cancel_take_op(h->sr);
        dg_status *st = dg_status_new();
        pthread_mutex_lock(&h->mu);
        // A cancel may come just before the loop starts its next take: repeat until it is out.
        while (!h->finished) {
            pthread_mutex_unlock(&h->mu);
            dg_status_reset(st);
            dg_session_run(h->sess, NULL, NULL, 0, NULL, NULL, 0, &cancel, 1, st);
            pthread_mutex_lock(&h->mu);
            if (h->finished) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        }
        pthread_mutex_unlock(&h->mu);
        dg_status_free(&st);
        pthread_join(h->thread, NULL);
    }
    if (h->has_prober) pthread_join(h->prober, NULL);   // it sees stop within 50 ms and a probe
    h->has_prober = false;
    pthread_mutex_lock(&h->mu);
    h->has_thread = false;
    h->finished = false;
    pthread_mutex_unlock(&h->mu);
    dg_session_free(&h->sess);
}

static bool hook_begin(void *ctx, dg_graph *g, dg_status *st) {
    sync_hook *h = ctx;
    if (!dg_sync_replicas_train_op(h->sr) || !dg_sync_replicas_chief_apply_op(h->sr)) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "the sync replicas hook needs the ops: call "
                      "dg_sync_replicas_apply_gradients (or minimize) first");
        return false;
    }
    return true;
}

static bool after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    sync_hook *h = ctx;
    if (!h->is_chief) {
        dg_node *init = dg_sync_replicas_local_step_init_op(h->sr);
        if (!dg_session_run_target(sess, init, st)) {
            dg_status_prepend(st, "sync replicas: initializing the local step");
            return false;
        }
        return true;
    }
    stop_loop(h);   // a recovery: the loop of the previous session
    dg_graph *g = dg_monitored_session_graph(ms);
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 1;
    so.wait_for_tasks_ms = 30000;   // the tasks answered the monitored session moments ago
    if (!(h->sess = dg_session_new(g, h->master, &so, st))) {
        dg_status_prepend(st, "sync replicas: the apply loop's session");
        return false;
    }
    dg_node *init = dg_sync_replicas_chief_init_op(h->sr);
    dg_node *cancel = dg_sync_replicas_cancel_take_op(h->sr);
    int64_t step = -1;
    bool ok = dg_session_run_target(h->sess, init, st);
    // Reopen the queue (closed at the end of an earlier run) and end takes an earlier chief left.
    ok = ok && run_close(h, h->sess, -1, NULL, st) && dg_session_run_target(h->sess, cancel, st);
    if (ok) {
        // Compiles the apply signature here (see the top of the file): fails at the takes.
        if (run_apply(h, 0, &step, st)) {
            dg_status_set(st, DG_INTERNAL, "sync replicas: the dry run of the apply op applied a step");
            ok = false;
        } else if (dg_status_code(st) == DG_INVALID_ARGUMENT && strstr(dg_status_message(st), "num_required must be")) {
            dg_status_reset(st);
        } else {
            ok = false;
        }
    }
    if (ok && h->server) {
        // The live count now (compiling the set-live signature here too), then the probes go on
        // on their own thread.
        int n_live = probe_round(h, true);
        ok = run_set_live(h, h->sess, n_live, st) && run_extra_tokens(h, h->sess, 0, 0, st);
        pthread_mutex_lock(&h->mu);
        h->n_live = n_live;
        pthread_mutex_unlock(&h->mu);
        if (ok && n_live < dg_sync_replicas_options_of(h->sr)->total_num_replicas)
            printf("sync replicas: %d of %d workers answer at the start\n", n_live,
                   dg_sync_replicas_options_of(h->sr)->total_num_replicas);
    }
    dg_output gs = dg_sync_replicas_local_step(h->sr);   // just set from the global step
    dg_tensor *v = NULL;
    if (ok && (ok = dg_session_run(h->sess, NULL, NULL, 0, &gs, &v, 1, NULL, 0, st))) step = dg_tensor_i64(v)[0];
    dg_tensor_unref(v);
    if (!ok) {
        dg_status_prepend(st, "sync replicas: chief initialization");
        dg_session_free(&h->sess);
        return false;
    }
    pthread_mutex_lock(&h->mu);
    h->stop = false;
    h->finished = false;
    h->step = step;
    dg_status_reset(h->err);
    ok = pthread_create(&h->thread, NULL, loop, h) == 0;
    h->has_thread = ok;
    pthread_mutex_unlock(&h->mu);
    if (ok && h->server) {
        h->has_prober = pthread_create(&h->prober, NULL, prober, h) == 0;
        if (!h->has_prober) {
            stop_loop(h);
            dg_status_set(st, DG_RESOURCE_EXHAUSTED, "sync replicas: cannot start the probe thread");
            return false;
        }
    }
    if (!ok) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "sync replicas: cannot start the apply loop's thread");
        dg_session_free(&h->sess);
    }
    return ok;
}

static bool loop_status(sync_hook *h, dg_status *st) {
    pthread_mutex_lock(&h->mu);
    bool ok = dg_status_ok(h->err);
    if (!ok) dg_status_copy(st, h->err);
    pthread_mutex_unlock(&h->mu);
    return ok;
}

static bool hook_end(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    sync_hook *h = ctx;
    if (!h->is_chief) return true;
    stop_loop(h);
    return loop_status(h, st);
}

// The tasks to probe, freed (the hook follows nobody after this).
static void drop_tasks(sync_hook *h) {
    for (int i = 0; h->endpoints && i < h->n_tasks; i++) free(h->endpoints[i]);
    free(h->endpoints);
    free(h->tasks);
    free(h->alive);
    h->endpoints = NULL;
    h->tasks = NULL;
    h->alive = NULL;
    h->n_tasks = 0;
}

static void hook_free(void *ctx) {
    sync_hook *h = ctx;
    stop_loop(h);
    drop_tasks(h);
    dg_status_free(&h->err);
    free(h->master);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

dg_session_hook *dg_sync_replicas_hook_new(dg_sync_replicas *sr, bool is_chief, const char *master,
                                           int64_t last_step, dg_status *st) {
    dg_status_reset(st);
    if (!sr || last_step < -1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "sync replicas hook: %s", !sr ? "no optimizer given"
                       : "last_step must be >= 0, or -1 for none");
        return NULL;
    }
    sync_hook *c = calloc(1, sizeof *c);
    dg_session_hook *h = calloc(1, sizeof *h);
    if (!c || !h || !(c->err = dg_status_new()) || (master && !(c->master = strdup(master)))) {
        if (c) dg_status_free(&c->err);
        free(c);
        free(h);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "sync replicas hook: out of memory");
        return NULL;
    }
    c->sr = sr;
    c->is_chief = is_chief;
    c->last_step = last_step;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    h->name = "sync_replicas";
    h->ctx = c;
    h->begin = hook_begin;
    h->after_create_session = after_create;
    h->end = hook_end;
    h->free_ctx = hook_free;
    return h;
}

bool dg_sync_replicas_hook_status(const dg_session_hook *h, dg_status *st) {
    dg_status_reset(st);
    if (!h || h->free_ctx != hook_free) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "not a sync replicas hook");
        return false;
    }
    return loop_status(h->ctx, st);
}

bool dg_sync_replicas_hook_follow_live_workers(dg_session_hook *hook, dg_server *server, const char *job,
                                               int64_t probe_ms, dg_status *st) {
    dg_status_reset(st);
    if (!hook || hook->free_ctx != hook_free || !server || !job || probe_ms < 10) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "sync replicas follow live workers: needs a sync replicas hook, a "
                      "server, a job and probe_ms >= 10");
        return false;
    }
    sync_hook *h = hook->ctx;
    if (!h->is_chief) return true;   // only the chief's apply loop takes gradients
    if (h->server) {
        dg_status_set(st, DG_ALREADY_EXISTS, "sync replicas follow live workers: called already");
        return false;
    }
    const rt_task_env *env = rt_server_env(server);
    dg_device_name own;
    if (!dg_device_name_parse(env->task_name, &own, st)) return false;
    int n = dg_cluster_num_tasks(env->cluster, job);
    if (n < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "sync replicas follow live workers: the cluster has no job \"%s\"",
                       job);
        return false;
    }
    h->endpoints = calloc((size_t)n, sizeof *h->endpoints);
    h->tasks = calloc((size_t)n, sizeof *h->tasks);
    h->alive = calloc((size_t)n, sizeof *h->alive);
    h->n_tasks = n;
    if (!h->endpoints || !h->tasks || !h->alive) {
        drop_tasks(h);
        return base_oom(st, "sync replicas follow live workers", (size_t)n);
    }
    for (int i = 0; i < n; i++) {
        int t = dg_cluster_task_index(env->cluster, job, i);
        h->tasks[i] = t;
        h->alive[i] = true;   // until a probe says otherwise: a loss is what is reported
        if (strcmp(own.job, job) == 0 && own.task == t) continue;   // the chief itself
        const char *addr = dg_cluster_task_address(env->cluster, job, t, NULL);
        if (!addr || !(h->endpoints[i] = rt_endpoint_of(addr, st))) {
            if (dg_status_ok(st)) dg_status_setf(st, DG_INVALID_ARGUMENT, "task %d of job %s has no address", t, job);
            drop_tasks(h);
            return false;
        }
    }
    h->server = server;
    h->probe_ms = probe_ms;
    h->n_live = dg_sync_replicas_options_of(h->sr)->total_num_replicas;
    return true;
}
