/* The master client (master_client_impl.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "distgraph/serialize.h"
#include "fast_channel_impl.h"
#include "graph_impl.h"
#include "keys_impl.h"
#include "master_client_impl.h"
#include "server_impl.h"
#include "status_impl.h"
#include "step_trace_impl.h"
#include "transport_impl.h"
#include "worker_client_impl.h"

// A step may wait long (a sync replica for its token); a dead master is noticed by the
// transport's liveness probes within seconds, so the deadline itself is only a backstop.
#define STEP_TIMEOUT_MS (7LL * 24 * 3600 * 1000)
#define CONTROL_TIMEOUT_MS 30000
#define KEEPALIVE_MS 1000

struct master_client {
    dg_graph *graph;
    dg_session_options opts;
    rt_transport *tp;
    rt_keyring *keys;        // the key directory's members, or NULL
    char *endpoint;          // "tcp://host:port" of the master
    int64_t handle;          // of the session on the master
    pthread_mutex_t mu;      // guards sent_nodes and the graph's (de)serialization
    int sent_nodes;          // nodes the master has
    pthread_t beat;
    bool has_beat, stopping; // stopping under beat_mu
    pthread_mutex_t beat_mu;
    pthread_cond_t beat_cv;
    int master_gone;         // a keepalive failed (atomic): a step waiting on the channel gives up
    // The local channel (fast_channel_impl.h), when the master is on this host and took it.
    fc_region *fast;
    pthread_mutex_t fast_mu; // one step at a time through it; the others take the socket
    bool fast_broken;        // a step was abandoned on it: the socket from then on (under fast_mu)
    uint32_t fast_seen;      // the answer sequence last read (under fast_mu)
    rt_shm_pool *fast_shm;   // slots for feeds of 64 KiB to 1 MiB (under fast_mu)
    bool fast_shm_off;
};

static rt_header *request(int type) {
    rt_header *h = malloc(sizeof *h);
    if (!h) abort();
    rt_header_init(h, type);
    return h;
}

static void drop(rt_header *h, dg_tensor **ts, int n) {
    if (h) {
        rt_header_clear(h);
        free(h);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
    free(ts);
}

// A transport for a client in this process, with the credentials of o (see
// dg_session_options): a cluster key pair, or a key directory (*ring gets the keyring, which
// must outlive the transport), or none.
static rt_transport *client_transport(const dg_session_options *o, rt_keyring **ring, dg_status *st) {
    rt_transport_options to;
    memset(&to, 0, sizeof to);
    char name[96];
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, "client %d@%s", (int)getpid(), host);
    to.name = name;
    to.quiet = true;
    to.curve_public_key = o->curve_public_key;
    to.curve_secret_key = o->curve_secret_key;
    if (!to.curve_public_key && !to.curve_secret_key) {   // as dg-server takes them
        to.curve_public_key = getenv("DG_CURVE_PUBLIC_KEY");
        to.curve_secret_key = getenv("DG_CURVE_SECRET_KEY");
    }
    char pub[RT_KEY_Z85], sec[RT_KEY_Z85];
    const char *dir = o->key_dir ? o->key_dir : getenv("DG_KEY_DIR");
    if (!to.curve_public_key && !to.curve_secret_key && dir && *dir) {
        const char *key_name = o->key_name ? o->key_name : "client";
        if (!(*ring = rt_keyring_load(dir, st)) || !rt_keyring_pair(*ring, key_name, pub, sec, st)) {
            dg_status_prepend(st, "client keys");
            rt_keyring_free(ring);
            return NULL;
        }
        to.curve_public_key = pub;
        to.curve_secret_key = sec;
        to.keys = *ring;
    }
    rt_transport *tp = rt_transport_new(&to, NULL, NULL, st);
    explicit_bzero(sec, sizeof sec);
    if (!tp) rt_keyring_free(ring);
    return tp;
}

static void *beat_main(void *arg);

static void beat_done(void *arg, const dg_status *st, rt_header *h, dg_tensor **ts, int n) {
    master_client *c = arg;
    // A failure (no answer within 5 s, or the session gone) tells a step waiting on the local
    // channel to give up; an answer clears it.
    bool failed = (st && dg_status_code(st) != DG_OK) || !h || h->code != DG_OK;
    __atomic_store_n(&c->master_gone, failed ? 1 : 0, __ATOMIC_RELEASE);
    drop(h, ts, n);
}

static void *beat_main(void *arg) {
    master_client *c = arg;
    pthread_mutex_lock(&c->beat_mu);
    while (!c->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += KEEPALIVE_MS / 1000;
        pthread_cond_timedwait(&c->beat_cv, &c->beat_mu, &ts);
        if (c->stopping) break;
        rt_header *h = request(RT_KEEPALIVE);
        h->handle = c->handle;
        rt_call(c->tp, c->endpoint, h, NULL, 0, 5 * KEEPALIVE_MS, beat_done, c);
    }
    pthread_mutex_unlock(&c->beat_mu);
    return NULL;
}

static void option(rt_header *h, const char *name, long long v) {
    char buf[96];
    snprintf(buf, sizeof buf, "%s=%lld", name, v);
    rt_header_add_name(h, buf);
}

// Sends the graph (CREATE_SESSION, or EXTEND_SESSION when it has grown). Called with mu held.
static bool send_graph_locked(master_client *c, int type, dg_status *st) {
    int n_nodes = dg_graph_num_nodes(c->graph);
    char *buf = NULL;
    size_t len = 0;
    if (!dg_graph_to_msgpack(c->graph, &buf, &len, st)) return false;
    rt_header *h = request(type), *resp = NULL;
    rt_header_set_blob(h, buf, len);
    free(buf);
    h->handle = c->handle;
    if (type == RT_CREATE_SESSION) {
        // 0 (the default, or below): one thread per core of the server, as a local session has.
        option(h, "inter_op_threads", c->opts.inter_op_threads > 0 ? c->opts.inter_op_threads : 0);
        option(h, "intra_op_threads", c->opts.intra_op_threads);
        option(h, "allow_soft_placement", c->opts.allow_soft_placement);
        option(h, "log_device_placement", c->opts.log_device_placement);
        option(h, "gpu_allow_tf32", c->opts.gpu_allow_tf32);
        option(h, "wait_for_tasks_ms", (long long)c->opts.wait_for_tasks_ms);
    }
    if (!rt_call_sync(c->tp, c->endpoint, h, NULL, 0, STEP_TIMEOUT_MS, &resp, NULL, NULL, st)) {
        dg_status_prepend(st, "%s at the master %s", type == RT_CREATE_SESSION ? "creating the session"
                                                   : "sending the grown graph", c->endpoint);
        return false;
    }
    if (type == RT_CREATE_SESSION) c->handle = resp->handle;
    drop(resp, NULL, 0);
    c->sent_nodes = n_nodes;
    return true;
}

// A master on this host (a loopback endpoint) is offered a local channel for the steps
// (fast_channel_impl.h); DG_LOCAL_CHANNEL=0 turns it off. Any failure leaves the socket.
static void try_attach(master_client *c) {
    const char *env = getenv("DG_LOCAL_CHANNEL");
    if (env && strcmp(env, "0") == 0) return;
    if (strncmp(c->endpoint, "tcp://127.", 10) != 0 && strncmp(c->endpoint, "tcp://localhost:", 16) != 0 &&
        strncmp(c->endpoint, "tcp://[::1]:", 12) != 0)
        return;
    dg_status st = DG_STATUS_INIT;
    fc_region *r = fc_create(&st);
    if (r) {
        rt_header *h = request(RT_ATTACH_CHANNEL), *resp = NULL;
        h->handle = c->handle;
        h->key = strdup(fc_name(r));
        if (rt_call_sync(c->tp, c->endpoint, h, NULL, 0, CONTROL_TIMEOUT_MS, &resp, NULL, NULL, &st)) {
            drop(resp, NULL, 0);
            c->fast = r;
            c->fast_seen = fc_seq(r, FC_ANSWER);
            const char *shm_env = getenv("DG_SHM");
            c->fast_shm_off = shm_env && strcmp(shm_env, "0") == 0;
        }
        fc_unlink(r);   // mapped on both sides now (or by nobody else)
        if (!c->fast) fc_free(&r);
    }
    status_impl_clear(&st);
}

// A step through the local channel: 1 answered (*resp, *out, *n_out as rt_call_sync's), 0
// failed (st set), -1 use the socket: it does not fit the channel (nothing sent), or the
// master closed the channel before answering (the session was closed or the server is
// stopping: the socket then gets the master's own answer, and the step cannot run twice as
// the session is gone). Called with fast_mu held.
static int fast_call(master_client *c, const rt_header *h, dg_tensor *const *ts, int n, rt_header **resp,
                     dg_tensor ***out, int *n_out, dg_status *st) {
    bool in_slot_range = false;
    for (int i = 0; i < n; i++)
        in_slot_range |= ts[i] && ts[i]->nbytes >= RT_SHM_MIN_BYTES && ts[i]->nbytes <= RT_SHM_SLOT_BYTES;
    if (in_slot_range && !c->fast_shm && !c->fast_shm_off) {   // DG_SHM=0: inline (try_attach)
        dg_status ignored = DG_STATUS_INIT;
        c->fast_shm_off = !(c->fast_shm = rt_shm_pool_new(&ignored));   // then inline
        status_impl_clear(&ignored);
    }
    if (!fc_put(c->fast, FC_REQUEST, h, ts, n, c->fast_shm)) return -1;
    fc_post(c->fast, FC_REQUEST);
    for (;;) {
        fc_wait_result w = fc_wait(c->fast, FC_ANSWER, &c->fast_seen, 250);
        if (w == FC_READY) break;
        if (w == FC_CLOSED) {
            c->fast_broken = true;
            return -1;
        }
        if (__atomic_load_n(&c->master_gone, __ATOMIC_ACQUIRE)) {
            c->fast_broken = true;
            dg_status_setf(st, DG_UNAVAILABLE, "master %s stopped answering keepalives during the step", c->endpoint);
            return 0;
        }
    }
    rt_header *r = malloc(sizeof *r);
    if (!r) abort();
    if (!fc_take(c->fast, FC_ANSWER, r, out, n_out, st)) {
        free(r);
        c->fast_broken = true;
        dg_status_prepend(st, "master %s", c->endpoint);
        return 0;
    }
    if (r->key && strcmp(r->key, "parked") == 0) {   // too large for the channel: over the socket
        drop(r, *out, *n_out);
        *out = NULL;
        *n_out = 0;
        rt_header *t = request(RT_TAKE_ANSWER);
        t->handle = c->handle;
        return rt_call_sync(c->tp, c->endpoint, t, NULL, 0, STEP_TIMEOUT_MS, resp, out, n_out, st) ? 1 : 0;
    }
    if (r->code != DG_OK) {
        dg_status_set(st, (dg_code)r->code, r->message ? r->message : "remote error");
        drop(r, *out, *n_out);
        *out = NULL;
        *n_out = 0;
        return 0;
    }
    *resp = r;
    return 1;
}

master_client *master_client_new(dg_graph *g, const char *target, const dg_session_options *opts, dg_status *st) {
    char *ep = rt_endpoint_of(target, st);
    if (!ep) return NULL;
    master_client *c = calloc(1, sizeof *c);
    if (!c) abort();
    c->graph = g;
    c->endpoint = ep;
    c->opts = opts ? *opts : dg_session_options_default();
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->fast_mu, NULL);
    pthread_mutex_init(&c->beat_mu, NULL);
    pthread_cond_init(&c->beat_cv, NULL);
    bool ok = (c->tp = client_transport(&c->opts, &c->keys, st)) != NULL;
    if (ok && c->opts.wait_for_tasks_ms >= 0)
        ok = wc_wait_for_task(c->tp, ep, "the master", c->opts.wait_for_tasks_ms, 5000, "client", NULL, NULL, st);
    if (ok) {
        pthread_mutex_lock(&c->mu);
        ok = send_graph_locked(c, RT_CREATE_SESSION, st);
        pthread_mutex_unlock(&c->mu);
    }
    if (ok) try_attach(c);
    if (ok && pthread_create(&c->beat, NULL, beat_main, c) != 0) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: cannot start the keepalive thread");
        ok = false;
    }
    c->has_beat = ok;
    if (!ok) master_client_free(&c);
    return c;
}

void master_client_free(master_client **cp) {
    if (!cp || !*cp) return;
    master_client *c = *cp;
    if (c->has_beat) {
        pthread_mutex_lock(&c->beat_mu);
        c->stopping = true;
        pthread_cond_signal(&c->beat_cv);
        pthread_mutex_unlock(&c->beat_mu);
        pthread_join(c->beat, NULL);
    }
    if (c->fast) fc_close(c->fast);   // its thread on the master ends
    if (c->handle && c->tp) {   // closed on the master; a master that is gone must not delay us long
        rt_header *h = request(RT_CLOSE_SESSION), *resp = NULL;
        h->handle = c->handle;
        dg_status ignored = DG_STATUS_INIT;
        if (rt_call_sync(c->tp, c->endpoint, h, NULL, 0, 5000, &resp, NULL, NULL, &ignored)) drop(resp, NULL, 0);
        status_impl_clear(&ignored);
    }
    rt_transport_free(&c->tp);   // fails the keepalives still waiting, before c goes
    rt_keyring_free(&c->keys);
    fc_free(&c->fast);
    rt_shm_pool_free(&c->fast_shm);
    free(c->endpoint);
    pthread_cond_destroy(&c->beat_cv);
    pthread_mutex_destroy(&c->beat_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->fast_mu);
    free(c);
    *cp = NULL;
}

static void add_output_name(rt_header *h, dg_output o) {
    char buf[RT_MAX_STRING];
    snprintf(buf, sizeof buf, "%s:%d", o.node->name, o.index);
    rt_header_add_name(h, buf);
}

bool master_client_run(master_client *c, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                       const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                       int n_targets, dg_step_trace *trace, dg_status *st) {
    pthread_mutex_lock(&c->mu);
    bool ok = dg_graph_num_nodes(c->graph) == c->sent_nodes || send_graph_locked(c, RT_EXTEND_SESSION, st);
    pthread_mutex_unlock(&c->mu);
    if (!ok) return false;
    rt_header *h = request(RT_RUN_STEP), *resp = NULL;
    h->handle = c->handle;
    h->n_feeds = n_feeds;
    h->trace = trace != NULL;
    // A feed over 4 MiB goes ahead of the call as a chunked push to the master's task, under
    // (step, "feed:<i>"): a task takes frames of at most its max_message_bytes, while chunks
    // are bounded by its transfer limits instead. The call carries an empty tensor in its
    // place and names the pushed feeds in its key ("pushed:1,3"); the push and the call leave
    // on one connection, in order (docs/PROTOCOL.md, RUN_STEP).
    dg_tensor **sent = calloc((size_t)n_feeds + 1, sizeof *sent);
    if (!sent) abort();
    char pushed[512] = "pushed:";
    size_t used = strlen(pushed);
    bool any_pushed = false;
    for (int i = 0; i < n_feeds; i++) {
        add_output_name(h, feeds[i]);
        dg_tensor *t = feed_values[i];
        if (t && dg_tensor_nbytes(t) > 4 * RT_CHUNK_BYTES && used + 12 < sizeof pushed) {
            if (!h->step_id) h->step_id = rt_new_step_id();
            rt_header *ph = request(RT_TENSOR);
            ph->step_id = h->step_id;
            char key[32];
            snprintf(key, sizeof key, "feed:%d", i);
            ph->key = strdup(key);
            rt_header_add_tensor(ph, t);
            rt_push(c->tp, c->endpoint, ph, &t, 1);
            used += (size_t)snprintf(pushed + used, sizeof pushed - used, "%s%d", any_pushed ? "," : "", i);
            any_pushed = true;
            sent[i] = dg_tensor_new(dg_tensor_dtype(t), dg_shape1(0), st);
            if (!sent[i]) {
                for (int k = 0; k < i; k++) dg_tensor_unref(sent[k]);
                free(sent);
                drop(h, NULL, 0);
                return false;
            }
        } else {
            sent[i] = t ? dg_tensor_ref(t) : NULL;
        }
        rt_header_add_tensor(h, sent[i]);
    }
    if (any_pushed) h->key = strdup(pushed);
    for (int i = 0; i < n_fetches; i++) add_output_name(h, fetches[i]);
    for (int i = 0; i < n_targets; i++) {
        char buf[RT_MAX_STRING];
        snprintf(buf, sizeof buf, "^%s", targets[i]->name);
        rt_header_add_name(h, buf);
    }
    dg_tensor **out = NULL;
    int n_out = 0;
    int64_t sent_ns = exec_trace_now_ns();
    char client[64] = "";
    if (trace) {   // from the step's start: the arguments checked, the request and its feeds made
        snprintf(client, sizeof client, "client (pid %d)", (int)getpid());
        dg_trace_event e = {.kind = DG_TRACE_MASTER, .name = "RUN_STEP: prepare", .task = client,
                            .start_ns = step_trace_origin(trace), .end_ns = sent_ns, .thread = exec_trace_thread()};
        step_trace_add(trace, &e);
    }
    int fast = -1;
    if (c->fast && !any_pushed && pthread_mutex_trylock(&c->fast_mu) == 0) {
        if (!c->fast_broken) fast = fast_call(c, h, sent, n_feeds, &resp, &out, &n_out, st);
        pthread_mutex_unlock(&c->fast_mu);
    }
    bool called;
    if (fast >= 0) {
        called = fast == 1;
        drop(h, NULL, 0);
    } else {
        called = rt_call_sync(c->tp, c->endpoint, h, sent, n_feeds, STEP_TIMEOUT_MS, &resp, &out, &n_out, st);
    }
    if (called && trace && resp->blob) {
        // The master's trace, its clock put on ours (a bad one is reported, the step stands).
        // The step ended when the answer came; reading the notes is tracing's own cost.
        int64_t answered_ns = exec_trace_now_ns();
        step_trace_set_end(trace, answered_ns);
        char master[300];
        snprintf(master, sizeof master, "%s", resp->from ? resp->from : c->endpoint);
        dg_status bad = DG_STATUS_INIT;
        if (!step_trace_add_remote(trace, resp->blob, resp->blob_len, master, client, "RUN_STEP", sent_ns,
                                   answered_ns, &bad))
            fprintf(stderr, "distgraph: %s\n", dg_status_message(&bad));
        status_impl_clear(&bad);
    }
    for (int i = 0; i < n_feeds; i++) dg_tensor_unref(sent[i]);
    free(sent);
    // A step that placed the graph with log_device_placement: the master's lines, printed here
    // as a local session prints them.
    for (int i = 0; called && c->opts.log_device_placement && i < resp->n_names; i++) {
        for (char *p = resp->names[i]; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';   // text from another process
        fprintf(stderr, "%s\n", resp->names[i]);
    }
    if (!called) {
        if (dg_status_code(st) != DG_OK && !strstr(dg_status_message(st), c->endpoint))
            dg_status_prepend(st, "master %s", c->endpoint);
        return false;
    }
    if (n_out != n_fetches) {
        dg_status_setf(st, DG_INTERNAL, "the master %s answered with %d values for %d fetches", c->endpoint, n_out,
                       n_fetches);
        drop(resp, out, n_out);
        return false;
    }
    for (int i = 0; i < n_fetches; i++) fetched[i] = out[i];
    drop(resp, out, 0);
    return true;
}

// One control call to target on a transport of its own, with o's credentials.
static bool control_call(const char *target, const dg_session_options *o, rt_header *h, int64_t timeout_ms,
                         rt_header **resp, dg_status *st) {
    char *ep = rt_endpoint_of(target, st);
    rt_keyring *ring = NULL;
    rt_transport *tp = ep ? client_transport(o, &ring, st) : NULL;
    bool ok = tp && rt_call_sync(tp, ep, h, NULL, 0, timeout_ms, resp, NULL, NULL, st);
    if (!tp) drop(h, NULL, 0);
    rt_transport_free(&tp);
    rt_keyring_free(&ring);
    free(ep);
    return ok;
}

bool master_client_reset(const char *target, const dg_session_options *opts, dg_status *st) {
    dg_session_options o = opts ? *opts : dg_session_options_default();
    rt_header *resp = NULL;
    if (!control_call(target, &o, request(RT_RESET), CONTROL_TIMEOUT_MS, &resp, st)) {
        dg_status_prepend(st, "resetting the cluster of %s", target ? target : "");
        return false;
    }
    drop(resp, NULL, 0);
    return true;
}

bool dg_server_query_counters(const char *target, const char *curve_public_key, const char *curve_secret_key,
                              int64_t timeout_ms, char ***names, int64_t **values, int *n, dg_status *st) {
    dg_status_reset(st);
    if (!names || !values || !n) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "query_counters: names, values or n is NULL");
        return false;
    }
    *names = NULL;
    *values = NULL;
    *n = 0;
    rt_header *resp = NULL;
    dg_session_options o = dg_session_options_default();
    o.curve_public_key = curve_public_key;
    o.curve_secret_key = curve_secret_key;
    if (!control_call(target, &o, request(RT_SERVER_STATUS), timeout_ms > 0 ? timeout_ms : CONTROL_TIMEOUT_MS,
                      &resp, st)) {
        dg_status_prepend(st, "asking %s for its counters", target ? target : "");
        return false;
    }
    char **nm = calloc((size_t)resp->n_names + 1, sizeof *nm);
    int64_t *v = calloc((size_t)resp->n_names + 1, sizeof *v);
    if (!nm || !v) abort();
    int k = 0;
    for (int i = 0; i < resp->n_names; i++) {   // "name=value"; anything else is skipped
        const char *eq = strchr(resp->names[i], '=');
        char *end = NULL;
        long long x = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == resp->names[i] || end == eq + 1 || *end) continue;
        // A name is a word of [a-z0-9_] (a caller may print it into JSON): nothing else is taken.
        if (strspn(resp->names[i], "abcdefghijklmnopqrstuvwxyz0123456789_") != (size_t)(eq - resp->names[i])) continue;
        if (!(nm[k] = strndup(resp->names[i], (size_t)(eq - resp->names[i])))) abort();
        v[k++] = x;
    }
    drop(resp, NULL, 0);
    *names = nm;
    *values = v;
    *n = k;
    return true;
}

void dg_server_counters_free(char **names, int64_t *values, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(values);
}

bool dg_server_query_stats(const char *target, const char *curve_public_key, const char *curve_secret_key,
                           int64_t timeout_ms, dg_server_stats *out, dg_status *st) {
    dg_status_reset(st);
    if (!out) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "query_stats: out is NULL");
        return false;
    }
    memset(out, 0, sizeof *out);
    char **names = NULL;
    int64_t *values = NULL;
    int n = 0;
    if (!dg_server_query_counters(target, curve_public_key, curve_secret_key, timeout_ms, &names, &values, &n, st))
        return false;
    const struct { const char *name; int64_t *v; } fields[] = {
        {"registered_graphs", &out->registered_graphs}, {"master_sessions", &out->master_sessions},
        {"running_steps", &out->running_steps}, {"graphs_orphaned", &out->graphs_orphaned},
        {"values_expired", &out->values_expired}, {"abort_marks", &out->abort_marks}, {"connections", &out->connections},
        {"max_connections", &out->max_connections}, {"connections_closed", &out->connections_closed},
        {"accept_failures", &out->accept_failures}, {"inflight_bytes", &out->inflight_bytes},
        {"transfers_refused", &out->transfers_refused}, {"transfers_expired", &out->transfers_expired},
        {"transfers_abandoned", &out->transfers_abandoned}, {"replies_dropped", &out->replies_dropped},
        {"requests_refused", &out->requests_refused},
        {"bad_messages", &out->bad_messages},
        {"shm_frames_sent", &out->shm_frames_sent},
        {"shm_frames_received", &out->shm_frames_received},
    };
    for (int i = 0; i < n; i++)   // names this build does not know are skipped
        for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
            if (strcmp(names[i], fields[k].name) == 0) *fields[k].v = values[i];
    dg_server_counters_free(names, values, n);
    return true;
}
