/* The sync replicas hook (TensorFlow's SyncReplicasOptimizerHook and the chief's queue
 * runner). Uses only the public API.
 *
 * The apply loop runs on its own thread and its own session, not on the monitored session's:
 * the monitored session frees its session on a recovery or a close without telling hooks
 * first (end is skipped after a failed run), and the loop must never run on a freed session.
 * A session compiles a signature on its first run, and two sessions compiling one graph at
 * once would both write its nodes' placements; so every signature the loop runs is compiled
 * in after_create_session, on the creating thread, before the loop starts (the apply op once
 * with num_required 0, which every take rejects before touching its accumulator). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/ops.h"
#include "distgraph/monitored_session.h"
#include "distgraph/sync_replicas.h"

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

static void hook_free(void *ctx) {
    sync_hook *h = ctx;
    stop_loop(h);
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
