/* The master service (master_service_impl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base_impl.h"
#include "distgraph/placer.h"
#include "distgraph/serialize.h"
#include "fast_channel_impl.h"
#include "master_impl.h"
#include "master_service_impl.h"
#include "status_impl.h"
#include "step_trace_impl.h"

// One version of a remote session's graph and the master session compiled from it. A grown
// graph gets a new version; older ones stay until the session closes (steps may still run on
// them, and their partitions reference the old graph's nodes).
typedef struct version {
    struct version *older;
    dg_graph *graph;
    master_session *m;
} version;

struct fast;

typedef struct rsession {
    int64_t handle;
    version *cur;            // under the service's mu
    dg_session_options opts;
    int64_t last_heard_ms;   // under mu
    int refs;                // the table's, each job's and its channel thread's, under mu
    bool closed;             // out of the table: no new steps
    char client[160];        // for logs
    struct fast *fast;       // its local channel, or NULL (under mu)
    rt_header *parked;       // an answer too large for the channel, until TAKE_ANSWER (under mu)
    dg_tensor **parked_ts;
    int parked_n;
} rsession;

// The thread that serves a session's local channel (fast_channel_impl.h).
typedef struct fast {
    master_service *ms;
    rsession *rs;
    fc_region *region;
    uint32_t seen;           // the request sequence last served
} fast;

// Local channels open at once on one master: each is a thread and a mapping.
#define MAX_CHANNELS 64

struct master_service {
    const rt_task_env *task;
    int64_t lease_ms;
    exec_pool *pool;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rsession **sessions;
    int n_sessions, cap_sessions;
    int64_t next_handle;
    bool stopping;
    pthread_t reaper;
    bool has_reaper;
    int n_fast;              // channel threads alive (under mu; cv signalled as they end)
    int64_t fast_steps;      // steps run through local channels (atomic)
};

typedef struct mjob {
    master_service *ms;
    rt_peer *peer;
    rt_header *h;
    dg_tensor **ts;
    int n;
    rsession *rs;            // with a reference, or NULL
    int64_t recv_ns;         // a traced RUN_STEP: when it came
} mjob;

static void drop_parked(rsession *rs) {
    if (rs->parked) {
        rt_header_clear(rs->parked);
        free(rs->parked);
    }
    for (int i = 0; i < rs->parked_n; i++) dg_tensor_unref(rs->parked_ts[i]);
    free(rs->parked_ts);
    rs->parked = NULL;
    rs->parked_ts = NULL;
    rs->parked_n = 0;
}

static void free_session(rsession *rs) {
    drop_parked(rs);
    for (version *v = rs->cur, *older; v; v = older) {
        older = v->older;
        master_session_free(&v->m);   // deregisters its partitions
        dg_graph_free(&v->graph);
        free(v);
    }
    free(rs);
}

static void session_unref(master_service *ms, rsession *rs) {
    pthread_mutex_lock(&ms->mu);
    bool last = --rs->refs == 0;
    pthread_mutex_unlock(&ms->mu);
    if (last) free_session(rs);
}

// Takes rs out of the table (under mu) and aborts what runs; the last reference frees it.
static void close_locked(master_service *ms, int index, const dg_status *why) {
    rsession *rs = ms->sessions[index];
    ms->sessions[index] = ms->sessions[--ms->n_sessions];
    rs->closed = true;
    for (version *v = rs->cur; v; v = v->older) master_session_abort(v->m, why);
    if (rs->fast) fc_close(rs->fast->region);   // its thread ends after the step it runs
}

static void mjob_free(mjob *j) {
    if (j->rs) session_unref(j->ms, j->rs);
    if (j->h) {
        rt_header_clear(j->h);
        free(j->h);
    }
    for (int i = 0; i < j->n; i++) dg_tensor_unref(j->ts[i]);
    free(j->ts);
    rt_peer_free(j->peer);
    free(j);
}

static void reply_err(mjob *j, const dg_status *st) {
    rt_server_reply_error(j->ms->task->server, j->peer, j->h->id, st);
    j->peer = NULL;
}

static void reply_ok(mjob *j, rt_header *r, dg_tensor *const *ts, int n) {
    rt_server_reply(j->ms->task->server, j->peer, j->h->id, r, ts, n);
    j->peer = NULL;
}

static rt_header *response(void) {
    rt_header *r = malloc(sizeof *r);
    if (!r) abort();
    rt_header_init(r, RT_RESPONSE);
    return r;
}

// "name=value" session options from a client, checked: a client may not ask for what would
// harm the server (thousands of threads).
static bool parse_options(const rt_header *h, dg_session_options *o, dg_status *st) {
    *o = dg_session_options_default();
    o->inter_op_threads = 1;
    for (int i = 0; i < h->n_names; i++) {
        const char *eq = strchr(h->names[i], '=');
        char *end = NULL;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || end == eq + 1 || *end) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "session option \"%s\": expected name=integer", h->names[i]);
            return false;
        }
        size_t len = (size_t)(eq - h->names[i]);
#define IS(name) (len == strlen(name) && strncmp(h->names[i], name, len) == 0)
        if (IS("inter_op_threads") && v >= 0 && v <= 64) o->inter_op_threads = (int)v;
        else if (IS("intra_op_threads") && v >= 0 && v <= 64) o->intra_op_threads = (int)v;
        else if (IS("allow_soft_placement") && (v == 0 || v == 1)) o->allow_soft_placement = v;
        else if (IS("log_device_placement") && (v == 0 || v == 1)) o->log_device_placement = v;
        else if (IS("gpu_allow_tf32") && (v == 0 || v == 1)) o->gpu_allow_tf32 = v;
        else if (IS("wait_for_tasks_ms")) o->wait_for_tasks_ms = v;
        else {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "session option \"%s\" is unknown or out of range", h->names[i]);
            return false;
        }
#undef IS
    }
    return true;
}

static version *new_version(master_service *ms, const rt_header *h, const dg_session_options *o, dg_status *st) {
    if (!h->blob) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s without a graph", rt_type_name(h->type));
        return NULL;
    }
    dg_graph *g = dg_graph_from_msgpack(h->blob, h->blob_len, st);
    if (!g) {
        // A bad graph from a client is a bad argument, not lost data.
        dg_status tmp = DG_STATUS_INIT;
        dg_status_set(&tmp, DG_INVALID_ARGUMENT, dg_status_message(st));
        dg_status_copy(st, &tmp);
        status_impl_clear(&tmp);
        dg_status_prepend(st, "the client's graph");
        return NULL;
    }
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "the client's graph");
        dg_graph_free(&g);
        return NULL;
    }
    version *v = calloc(1, sizeof *v);
    if (!v) abort();
    v->graph = g;
    if (!(v->m = master_session_new(g, ms->task, o, st))) {
        dg_graph_free(&g);
        free(v);
        return NULL;
    }
    master_session_collect_placement(v->m);   // the client prints it (RUN_STEP's answer)
    return v;
}

static void do_create(mjob *j) {
    master_service *ms = j->ms;
    dg_status st = DG_STATUS_INIT;
    dg_session_options o;
    version *v = parse_options(j->h, &o, &st) ? new_version(ms, j->h, &o, &st) : NULL;
    if (!v) {
        dg_status_prepend(&st, "creating a session");
        reply_err(j, &st);
        status_impl_clear(&st);
        return;
    }
    rsession *rs = calloc(1, sizeof *rs);
    if (!rs) abort();
    rs->cur = v;
    rs->opts = o;
    rs->refs = 1;
    rs->last_heard_ms = base_now_ms();
    snprintf(rs->client, sizeof rs->client, "%s", j->h->from ? j->h->from : "a client");
    pthread_mutex_lock(&ms->mu);
    bool stopping = ms->stopping;
    if (!stopping) {
        base_reserve((void **)&ms->sessions, sizeof *ms->sessions, ms->n_sessions, &ms->cap_sessions, 1);
        rs->handle = ++ms->next_handle;
        ms->sessions[ms->n_sessions++] = rs;
    }
    pthread_mutex_unlock(&ms->mu);
    if (stopping) {
        dg_status_setf(&st, DG_UNAVAILABLE, "%s is shutting down", ms->task->task_name);
        reply_err(j, &st);
        free_session(rs);
    } else {
        rt_header *r = response();
        r->handle = rs->handle;
        reply_ok(j, r, NULL, 0);
    }
    status_impl_clear(&st);
}

static void do_extend(mjob *j) {
    master_service *ms = j->ms;
    dg_status st = DG_STATUS_INIT;
    version *v = new_version(ms, j->h, &j->rs->opts, &st);
    if (!v) {
        dg_status_prepend(&st, "extending session %lld", (long long)j->rs->handle);
        reply_err(j, &st);
    } else {
        pthread_mutex_lock(&ms->mu);
        v->older = j->rs->cur;
        j->rs->cur = v;
        pthread_mutex_unlock(&ms->mu);
        reply_ok(j, response(), NULL, 0);
    }
    status_impl_clear(&st);
}

// "node:index" (or "^node" for a target) in g.
static bool resolve(dg_graph *g, const char *name, bool target, dg_output *out, dg_status *st) {
    char buf[RT_MAX_STRING + 1];
    snprintf(buf, sizeof buf, "%s", name + (target ? 1 : 0));
    long idx = 0;
    if (!target) {
        char *colon = strrchr(buf, ':'), *end = NULL;
        idx = colon ? strtol(colon + 1, &end, 10) : -1;
        if (!colon || end == colon + 1 || *end || idx < 0 || idx > 1000000) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "\"%s\" is not \"node:index\"", name);
            return false;
        }
        *colon = 0;
    }
    dg_node *n = dg_graph_find(g, buf);
    if (!n) {
        dg_status_setf(st, DG_NOT_FOUND, "no node \"%s\" in the session's graph", buf);
        return false;
    }
    *out = (dg_output){n, (int)idx};
    return true;
}

// A feed the client pushed ahead in chunks (master_client_run): its value, taken from this
// task's rendezvous under (step, "feed:<i>"), where the push, sent before the call on the same
// connection, has normally arrived already.
typedef struct feed_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    dg_tensor *t;
    dg_status st;
} feed_wait;

static void feed_arrived(void *arg, int node, dg_tensor *t, const dg_status *st) {
    (void)node;
    feed_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->t = t;
    if (st && dg_status_code(st) != DG_OK) dg_status_copy(&w->st, st);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

// Replaces the placeholders of the feeds key names ("pushed:1,3") with their pushed values.
static bool take_pushed_feeds(master_service *ms, const rt_header *h, dg_tensor **ts, int n_feeds, dg_status *st) {
    if (h->step_id <= 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "RUN_STEP: pushed feeds need a step id");
        return false;
    }
    exec_rendezvous *rv = ms->task->rendezvous;
    int64_t timeout_ms = ms->task->rpc_timeout_ms;
    const char *p = h->key + 7;
    while (*p) {
        char *end;
        long i = strtol(p, &end, 10);
        if (end == p || i < 0 || i >= n_feeds || (*end && *end != ',')) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "RUN_STEP: pushed feeds \"%s\" do not name feeds 0 to %d", h->key,
                           n_feeds - 1);
            return false;
        }
        p = *end ? end + 1 : end;
        char key[32];
        snprintf(key, sizeof key, "feed:%ld", i);
        feed_wait w;
        memset(&w, 0, sizeof w);
        pthread_mutex_init(&w.mu, NULL);
        pthread_cond_init(&w.cv, NULL);
        exec_rendezvous_recv_async(rv, h->step_id, key, feed_arrived, &w, 0);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (timeout_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_mutex_lock(&w.mu);
        while (!w.done && pthread_cond_timedwait(&w.cv, &w.mu, &until) == 0) {
        }
        bool done = w.done;
        pthread_mutex_unlock(&w.mu);
        if (!done) {
            // The receive stays registered until the step ends: end it (the callback then
            // runs with ABORTED, into w, before we leave).
            dg_status why = DG_STATUS_INIT;
            dg_status_setf(&why, DG_DEADLINE_EXCEEDED, "feed %ld was not pushed within %lld ms", i, (long long)timeout_ms);
            exec_rendezvous_abort(rv, h->step_id, &why);
            status_impl_clear(&why);
            pthread_mutex_lock(&w.mu);
            while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
            pthread_mutex_unlock(&w.mu);
        }
        bool ok = done && w.t && dg_status_code(&w.st) == DG_OK;
        if (ok) {
            dg_tensor_unref(ts[i]);
            ts[i] = w.t;
        } else {
            dg_tensor_unref(w.t);
            dg_status_setf(st, done ? (dg_status_code(&w.st) ? dg_status_code(&w.st) : DG_INTERNAL) : DG_DEADLINE_EXCEEDED,
                           "RUN_STEP: feed %ld, pushed ahead in chunks, %s", i,
                           done ? dg_status_message(&w.st) : "did not arrive in time (max_inflight_bytes, transfer_timeout_ms)");
        }
        status_impl_clear(&w.st);
        pthread_mutex_destroy(&w.mu);
        pthread_cond_destroy(&w.cv);
        if (!ok) return false;
    }
    return true;
}

// One step of rs: h names the feeds, fetches and targets, ts holds the n feed values (pushed
// feeds are put in their places). recv_ns: when the request came, for a trace. On success
// *resp is the answer (new: the fetches' descriptions, the trace's blob) and *fetched_out the
// values (new array of *n_fetched references).
static bool run_step(master_service *ms, rsession *rs, const rt_header *h, dg_tensor **ts, int n, int64_t recv_ns,
                     rt_header **resp, dg_tensor ***fetched_out, int *n_fetched, dg_status *st) {
    pthread_mutex_lock(&ms->mu);
    version *v = rs->cur;
    bool closed = rs->closed;
    pthread_mutex_unlock(&ms->mu);
    if (closed) {
        dg_status_setf(st, DG_ABORTED, "session %lld was closed", (long long)rs->handle);
        return false;
    }
    int n_names = h->n_names;
    int n_feeds = (int)h->n_feeds, n_fetches = 0, n_targets = 0;
    dg_output *feeds = calloc((size_t)n_names + 1, sizeof *feeds);
    dg_output *fetches = calloc((size_t)n_names + 1, sizeof *fetches);
    dg_node **targets = calloc((size_t)n_names + 1, sizeof *targets);
    dg_tensor **fetched = NULL;
    dg_step_trace *trace = NULL;
    if (!feeds || !fetches || !targets) abort();
    bool ok = true;
    if (h->n_feeds < 0 || h->n_feeds > n_names || n_feeds != n) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "RUN_STEP: %lld feeds named, %d values sent", (long long)h->n_feeds, n);
        ok = false;
    }
    for (int i = 0; ok && i < n_names; i++) {
        bool target = h->names[i][0] == '^';
        dg_output o;
        if (i < n_feeds && target) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "RUN_STEP: feed %d names a target", i);
            ok = false;
        } else if ((ok = resolve(v->graph, h->names[i], target, &o, st))) {
            if (i < n_feeds) feeds[i] = o;
            else if (target) targets[n_targets++] = o.node;
            else fetches[n_fetches++] = o;
        }
    }
    bool pushed = h->key && strncmp(h->key, "pushed:", 7) == 0;
    if (ok && pushed) ok = take_pushed_feeds(ms, h, ts, n_feeds, st);
    ok = ok && master_check_args(v->graph, feeds, ts, n_feeds, fetches, n_fetches, targets, n_targets, st);
    if (ok) {
        fetched = calloc((size_t)n_fetches + 1, sizeof *fetched);
        if (!fetched) abort();
        trace = h->trace ? step_trace_new(recv_ns) : NULL;
        if (trace) {   // from the request's arrival: waiting for a thread, reading its names
            dg_trace_event e = {.kind = DG_TRACE_MASTER, .name = "RUN_STEP: read the request",
                                .task = ms->task->task_name, .start_ns = recv_ns,
                                .end_ns = exec_trace_now_ns(), .thread = exec_trace_thread()};
            step_trace_add(trace, &e);
        }
        ok = master_session_run(v->m, feeds, ts, n_feeds, fetches, fetched, n_fetches, targets, n_targets, trace, st);
    }
    if (pushed && h->step_id > 0) exec_rendezvous_end_step(ms->task->rendezvous, h->step_id);
    pthread_mutex_lock(&ms->mu);
    rs->last_heard_ms = base_now_ms();   // a long step is not silence
    pthread_mutex_unlock(&ms->mu);
    if (ok) {
        rt_header *r = response();
        for (int i = 0; i < n_fetches; i++) rt_header_add_tensor(r, fetched[i]);
        // log_device_placement's lines of a step that placed the graph, for the client to print.
        char **placed = NULL;
        int n_placed = master_session_take_placement(v->m, &placed);
        for (int i = 0; i < n_placed; i++) {
            if (strlen(placed[i]) >= RT_MAX_STRING) placed[i][RT_MAX_STRING - 1] = 0;
            rt_header_add_name(r, placed[i]);
            free(placed[i]);
        }
        free(placed);
        if (trace) {
            r->from = strdup(ms->task->task_name);
            int64_t now = exec_trace_now_ns();
            // Merging the tasks' notes is tracing's own cost: shown as such.
            dg_trace_event e = {.kind = DG_TRACE_MASTER, .name = "tracing: merge the notes",
                                .task = ms->task->task_name, .start_ns = step_trace_end(trace),
                                .end_ns = now, .thread = exec_trace_thread()};
            if (e.start_ns > 0 && e.start_ns <= now) step_trace_add(trace, &e);
            step_trace_set_end(trace, now);
            step_trace_finish(trace, now);
            size_t len = 0;
            char *blob = step_trace_encode(trace, recv_ns, now, &len);
            rt_header_set_blob(r, blob, len);
            free(blob);
        }
        *resp = r;
        *fetched_out = fetched;
        *n_fetched = n_fetches;
        fetched = NULL;
    }
    dg_step_trace_free(&trace);
    free(fetched);
    free(feeds);
    free(fetches);
    free(targets);
    return ok;
}

static void do_run(mjob *j) {
    dg_status st = DG_STATUS_INIT;
    rt_header *r = NULL;
    dg_tensor **fetched = NULL;
    int n_fetched = 0;
    if (run_step(j->ms, j->rs, j->h, j->ts, j->n, j->recv_ns, &r, &fetched, &n_fetched, &st)) {
        reply_ok(j, r, fetched, n_fetched);
        for (int i = 0; i < n_fetched; i++) dg_tensor_unref(fetched[i]);
        free(fetched);
    } else {
        reply_err(j, &st);
    }
    status_impl_clear(&st);
}

// The thread of a session's local channel: waits for a request in the region, runs it as
// RUN_STEP, writes the answer back (or parks it for TAKE_ANSWER when it does not fit). Ends
// when the channel is closed: the session closed, or the service stopping.
static void *fast_main(void *arg) {
    fast *f = arg;
    master_service *ms = f->ms;
    rsession *rs = f->rs;
    // The client's next step usually follows its last answer within a fraction of a
    // millisecond (its next batch): polled for, as the transport polls its sockets.
    int64_t spin_us = rt_transport_busy_poll_us(ms->task->transport);
    bool answered = false;
    for (;;) {
        fc_wait_result w = answered && spin_us > 0 ? fc_wait_spin(f->region, FC_REQUEST, &f->seen, spin_us) : FC_TIMEOUT;
        if (w == FC_TIMEOUT) w = fc_wait(f->region, FC_REQUEST, &f->seen, 1000);
        answered = false;
        if (w == FC_CLOSED) break;
        if (w == FC_TIMEOUT) continue;
        int64_t recv_ns = exec_trace_now_ns();
        dg_status st = DG_STATUS_INIT;
        rt_header h, *r = NULL;
        dg_tensor **ts = NULL, **fetched = NULL;
        int n = 0, n_fetched = 0;
        bool ok = fc_take(f->region, FC_REQUEST, &h, &ts, &n, &st);
        if (ok && (h.type != RT_RUN_STEP || h.handle != rs->handle || h.key)) {
            dg_status_setf(&st, DG_INVALID_ARGUMENT, "local channel of session %lld: a %s request (only RUN_STEP of "
                           "this session, without pushed feeds)", (long long)rs->handle, rt_type_name(h.type));
            ok = false;
        }
        if (ok) {
            pthread_mutex_lock(&ms->mu);
            rs->last_heard_ms = base_now_ms();
            pthread_mutex_unlock(&ms->mu);
            ok = run_step(ms, rs, &h, ts, n, recv_ns, &r, &fetched, &n_fetched, &st);
            __atomic_add_fetch(&ms->fast_steps, 1, __ATOMIC_RELAXED);
        }
        if (!ok) {
            r = response();
            r->code = dg_status_code(&st);
            rt_header_set_message(r, dg_status_message(&st));
        }
        if (!fc_put(f->region, FC_ANSWER, r, fetched, n_fetched, NULL)) {
            pthread_mutex_lock(&ms->mu);
            drop_parked(rs);
            rs->parked = r;
            rs->parked_ts = fetched;
            rs->parked_n = n_fetched;
            pthread_mutex_unlock(&ms->mu);
            r = response();
            r->key = strdup("parked");
            fetched = NULL;
            n_fetched = 0;
            if (!fc_put(f->region, FC_ANSWER, r, NULL, 0, NULL)) abort();   // a bare header always fits
        }
        fc_post(f->region, FC_ANSWER);
        answered = true;
        rt_header_clear(r);
        free(r);
        for (int i = 0; i < n_fetched; i++) dg_tensor_unref(fetched[i]);
        free(fetched);
        for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
        free(ts);
        rt_header_clear(&h);   // idempotent: fc_take cleared it on failure
        status_impl_clear(&st);
    }
    pthread_mutex_lock(&ms->mu);
    rs->fast = NULL;
    pthread_mutex_unlock(&ms->mu);
    fc_free(&f->region);
    session_unref(ms, rs);
    free(f);
    pthread_mutex_lock(&ms->mu);
    ms->n_fast--;
    pthread_cond_broadcast(&ms->cv);
    pthread_mutex_unlock(&ms->mu);
    return NULL;
}

static void do_attach(mjob *j) {
    master_service *ms = j->ms;
    rsession *rs = j->rs;
    dg_status st = DG_STATUS_INIT;
    fc_region *region = fc_attach(j->h->key, &st);
    fast *f = NULL;
    if (region) {
        f = calloc(1, sizeof *f);
        if (!f) abort();
        *f = (fast){ms, rs, region, fc_seq(region, FC_REQUEST)};
        pthread_mutex_lock(&ms->mu);
        if (rs->fast || rs->closed)
            dg_status_setf(&st, DG_FAILED_PRECONDITION, "session %lld has a local channel already, or was closed",
                           (long long)rs->handle);
        else if (ms->n_fast >= MAX_CHANNELS || ms->stopping)
            dg_status_setf(&st, DG_RESOURCE_EXHAUSTED, "%s has %d local channels open (or is stopping): the session's "
                           "steps go over the socket", ms->task->task_name, ms->n_fast);
        if (dg_status_ok(&st)) {
            rs->fast = f;
            rs->refs++;
            ms->n_fast++;
        }
        pthread_mutex_unlock(&ms->mu);
    }
    if (region && dg_status_ok(&st)) {
        pthread_attr_t attr;
        pthread_t th;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, fast_main, f) != 0) {
            pthread_mutex_lock(&ms->mu);
            rs->fast = NULL;
            rs->refs--;   // the job still holds one: never the last
            ms->n_fast--;
            pthread_mutex_unlock(&ms->mu);
            dg_status_set(&st, DG_RESOURCE_EXHAUSTED, "cannot start the local channel's thread");
        }
        pthread_attr_destroy(&attr);
    }
    if (dg_status_ok(&st)) {
        reply_ok(j, response(), NULL, 0);
    } else {
        if (f) {
            fc_free(&f->region);
            free(f);
        } else {
            fc_free(&region);
        }
        dg_status_prepend(&st, "ATTACH_CHANNEL");
        reply_err(j, &st);
    }
    status_impl_clear(&st);
}

static void do_take_answer(mjob *j) {
    master_service *ms = j->ms;
    pthread_mutex_lock(&ms->mu);
    rt_header *r = j->rs->parked;
    dg_tensor **ts = j->rs->parked_ts;
    int n = j->rs->parked_n;
    j->rs->parked = NULL;
    j->rs->parked_ts = NULL;
    j->rs->parked_n = 0;
    pthread_mutex_unlock(&ms->mu);
    if (!r) {
        dg_status st = DG_STATUS_INIT;
        dg_status_setf(&st, DG_NOT_FOUND, "TAKE_ANSWER: session %lld has no parked answer", (long long)j->rs->handle);
        reply_err(j, &st);
        status_impl_clear(&st);
        return;
    }
    if (r->code == DG_OK) {
        reply_ok(j, r, ts, n);
    } else {
        dg_status st = DG_STATUS_INIT;
        dg_status_set(&st, (dg_code)r->code, r->message ? r->message : "the step failed");
        reply_err(j, &st);
        status_impl_clear(&st);
        rt_header_clear(r);
        free(r);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
    free(ts);
}

static void do_close(mjob *j) {
    master_service *ms = j->ms;
    dg_status why = DG_STATUS_INIT;
    dg_status_set(&why, DG_CANCELLED, "the client closed the session");
    pthread_mutex_lock(&ms->mu);
    for (int i = 0; i < ms->n_sessions; i++)
        if (ms->sessions[i] == j->rs) {
            close_locked(ms, i, &why);
            j->rs->refs--;   // the table's
            break;
        }
    pthread_mutex_unlock(&ms->mu);
    status_impl_clear(&why);
    reply_ok(j, response(), NULL, 0);
}

// RESET with handle 1: this task only; otherwise (from a client): this master's sessions, then
// every task of the cluster.
static void do_reset(mjob *j) {
    master_service *ms = j->ms;
    dg_status st = DG_STATUS_INIT;
    if (j->h->handle != 1) {
        dg_status why = DG_STATUS_INIT;
        dg_status_set(&why, DG_CANCELLED, "the cluster was reset");
        pthread_mutex_lock(&ms->mu);
        while (ms->n_sessions > 0) {
            rsession *rs = ms->sessions[0];
            close_locked(ms, 0, &why);
            if (--rs->refs == 0) {
                pthread_mutex_unlock(&ms->mu);
                free_session(rs);
                pthread_mutex_lock(&ms->mu);
            }
        }
        pthread_mutex_unlock(&ms->mu);
        status_impl_clear(&why);
        char **tasks = NULL;
        int n = dg_cluster_devices(ms->task->cluster, 0, &tasks, &st);
        for (int i = 0; i < n && dg_status_ok(&st); i++) {
            char task[160];
            if (!rt_task_of_device(tasks[i], task, sizeof task) || strcmp(task, ms->task->task_name) == 0)
                continue;
            char *ep = rt_task_endpoint(ms->task, tasks[i], &st);
            rt_header *h = malloc(sizeof *h), *resp = NULL;
            if (!h) abort();
            rt_header_init(h, RT_RESET);
            h->handle = 1;
            if (ep && rt_call_sync(ms->task->transport, ep, h, NULL, 0, ms->task->rpc_timeout_ms,
                                   &resp, NULL, NULL, &st)) {
                rt_header_clear(resp);
                free(resp);
            } else if (ep) {
                dg_status_prepend(&st, "resetting %s (%s)", task, ep);
            }
            free(ep);
        }
        dg_device_list_free(tasks, n);
    }
    exec_resources_reset(ms->task->resources);
    if (dg_status_ok(&st)) reply_ok(j, response(), NULL, 0);
    else reply_err(j, &st);
    status_impl_clear(&st);
}

static void run_mjob(void *arg, int unused) {
    (void)unused;
    mjob *j = arg;
    switch (j->h->type) {
    case RT_CREATE_SESSION: do_create(j); break;
    case RT_EXTEND_SESSION: do_extend(j); break;
    case RT_RUN_STEP: do_run(j); break;
    case RT_CLOSE_SESSION: do_close(j); break;
    case RT_ATTACH_CHANNEL: do_attach(j); break;
    case RT_TAKE_ANSWER: do_take_answer(j); break;
    case RT_RESET: do_reset(j); break;
    default: break;
    }
    mjob_free(j);
}

static void master_service_handle(void *ctx, rt_peer *peer, rt_header *h, dg_tensor **ts, int n) {
    master_service *ms = ctx;
    mjob *j = calloc(1, sizeof *j);
    if (!j) abort();
    *j = (mjob){ms, peer, h, ts, n, NULL, h->trace ? exec_trace_now_ns() : 0};
    bool needs_session = h->type == RT_EXTEND_SESSION || h->type == RT_RUN_STEP || h->type == RT_CLOSE_SESSION ||
                         h->type == RT_KEEPALIVE || h->type == RT_ATTACH_CHANNEL || h->type == RT_TAKE_ANSWER;
    if (needs_session) {
        pthread_mutex_lock(&ms->mu);
        for (int i = 0; i < ms->n_sessions && !j->rs; i++)
            if (ms->sessions[i]->handle == h->handle) j->rs = ms->sessions[i];
        if (j->rs) {
            j->rs->refs++;
            j->rs->last_heard_ms = base_now_ms();
        }
        pthread_mutex_unlock(&ms->mu);
        if (!j->rs) {
            dg_status st = DG_STATUS_INIT;
            dg_status_setf(&st, DG_NOT_FOUND, "no session %lld on the master of %s (closed, or its client was "
                           "silent for over %lld ms, or the server restarted)", (long long)h->handle,
                           ms->task->task_name, (long long)ms->lease_ms);
            reply_err(j, &st);
            status_impl_clear(&st);
            mjob_free(j);
            return;
        }
    }
    if (h->type == RT_KEEPALIVE) {   // answered here: nothing to run
        reply_ok(j, response(), NULL, 0);
        mjob_free(j);
        return;
    }
    exec_pool_submit(ms->pool, run_mjob, j, 0);
}

// SERVER_STATUS: the sessions, the local channels open now and the steps run through them.
static void add_counters(void *ctx, rt_header *r) {
    master_service *ms = ctx;
    pthread_mutex_lock(&ms->mu);
    long long sessions = ms->n_sessions, channels = ms->n_fast;
    pthread_mutex_unlock(&ms->mu);
    long long steps = __atomic_load_n(&ms->fast_steps, __ATOMIC_RELAXED);
    char line[64];
    snprintf(line, sizeof line, "master_sessions=%lld", sessions);
    rt_header_add_name(r, line);
    snprintf(line, sizeof line, "local_channels=%lld", channels);
    rt_header_add_name(r, line);
    snprintf(line, sizeof line, "local_channel_steps=%lld", steps);
    rt_header_add_name(r, line);
}

// Closes sessions whose client fell silent. The closing (deregistering, freeing graphs) runs
// outside the lock.
static void *reaper_main(void *arg) {
    master_service *ms = arg;
    pthread_mutex_lock(&ms->mu);
    while (!ms->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&ms->cv, &ms->mu, &ts);
        int64_t now = base_now_ms();
        for (int i = 0; i < ms->n_sessions;) {
            rsession *rs = ms->sessions[i];
            if (now - rs->last_heard_ms <= ms->lease_ms) {
                i++;
                continue;
            }
            dg_status why = DG_STATUS_INIT;
            dg_status_setf(&why, DG_ABORTED, "the client of session %lld (%s) was silent for %lld ms",
                           (long long)rs->handle, rs->client, (long long)(now - rs->last_heard_ms));
            if (!ms->task->quiet)
                fprintf(stderr, "distgraph %s: closing a session: %s\n", ms->task->task_name,
                        dg_status_message(&why));
            close_locked(ms, i, &why);
            status_impl_clear(&why);
            if (--rs->refs == 0) {
                pthread_mutex_unlock(&ms->mu);
                free_session(rs);
                pthread_mutex_lock(&ms->mu);
            }
        }
    }
    pthread_mutex_unlock(&ms->mu);
    return NULL;
}

static void master_service_free(master_service **msp);

static master_service *master_service_new(const rt_task_env *task, int64_t lease_ms, int n_threads, dg_status *st) {
    master_service *ms = calloc(1, sizeof *ms);
    if (!ms) abort();
    ms->task = task;
    ms->lease_ms = lease_ms > 0 ? lease_ms : 5000;
    pthread_mutex_init(&ms->mu, NULL);
    pthread_cond_init(&ms->cv, NULL);
    uint64_t rnd = 0;   // handles from a random start: a restarted master never reuses one
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (uint64_t)time(NULL) * 2654435761u;
    ms->next_handle = (int64_t)(rnd >> 2);
    if (!(ms->pool = exec_pool_new(n_threads > 0 ? n_threads : 16, st)) ||
        pthread_create(&ms->reaper, NULL, reaper_main, ms) != 0) {
        if (dg_status_ok(st)) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "master service: cannot start a thread");
        master_service_free(&ms);
        return NULL;
    }
    ms->has_reaper = true;
    return ms;
}

static void master_service_free(master_service **msp) {
    if (!msp || !*msp) return;
    master_service *ms = *msp;
    dg_status why = DG_STATUS_INIT;
    dg_status_setf(&why, DG_UNAVAILABLE, "%s is shutting down", ms->task->task_name);
    pthread_mutex_lock(&ms->mu);
    ms->stopping = true;
    pthread_cond_broadcast(&ms->cv);
    for (int i = 0; i < ms->n_sessions; i++) {
        for (version *v = ms->sessions[i]->cur; v; v = v->older) master_session_abort(v->m, &why);
        if (ms->sessions[i]->fast) fc_close(ms->sessions[i]->fast->region);
    }
    while (ms->n_fast > 0) pthread_cond_wait(&ms->cv, &ms->mu);   // the channels' threads end
    pthread_mutex_unlock(&ms->mu);
    status_impl_clear(&why);
    if (ms->has_reaper) pthread_join(ms->reaper, NULL);
    exec_pool_free(&ms->pool);   // waits for the jobs (their steps were aborted)
    for (int i = 0; i < ms->n_sessions; i++) free_session(ms->sessions[i]);
    free(ms->sessions);
    pthread_cond_destroy(&ms->cv);
    pthread_mutex_destroy(&ms->mu);
    free(ms);
    *msp = NULL;
}

static void close_service(void *ctx) {
    master_service *ms = ctx;
    master_service_free(&ms);
}

static const rt_type master_types[] = {RT_CREATE_SESSION, RT_EXTEND_SESSION, RT_RUN_STEP, RT_CLOSE_SESSION,
                                       RT_KEEPALIVE, RT_RESET, RT_ATTACH_CHANNEL, RT_TAKE_ANSWER};

bool master_service_start(const rt_task_env *env, rt_service *out, dg_status *st) {
    master_service *ms = master_service_new(env, env->options->client_lease_ms, env->options->master_threads, st);
    if (!ms) return false;
    *out = (rt_service){.name = "master", .types = master_types,
                        .n_types = (int)(sizeof master_types / sizeof master_types[0]),
                        .handle = master_service_handle, .add_counters = add_counters, .close = close_service,
                        .ctx = ms};
    return true;
}
