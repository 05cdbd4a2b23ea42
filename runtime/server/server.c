/* The server of one task: transport, worker service (registered partitions run for a step
 * id, variables shared by name, the task's rendezvous) and the hooks the master uses. */
#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base_impl.h"
#include "device.h"
#include "distgraph/device_name.h"
#include "distgraph/placer.h"
#include "distgraph/serialize.h"
#include "exec_collective_group_impl.h"
#include "exec_executor_impl.h"
#include "keys_impl.h"
#include "server_impl.h"
#include "trace_blob_impl.h"
#include "strmap_impl.h"
#include "status_impl.h"
#include "tensor_impl.h"

#define DEFAULT_MAX_PING_ECHO_BYTES ((int64_t)64 << 10)
#define DEFAULT_ORPHAN_TIMEOUT_MS 60000

// A value held back for a task until the step's executor runs out of work (see flush).
typedef struct held {
    struct held *next;
    int64_t step_id;
    char *endpoint;
    char *key;
    dg_tensor *t;
} held;

// A registered partition. Runs hold a reference (under the server's mutex), so a
// deregistration while a step runs frees the graph when that step ends.
typedef struct registered {
    int64_t handle;
    dg_graph *graph;
    exec_graph *eg;
    int running;
    bool dead;            // deregistered while running
    rt_peer *owner;       // the connection of the master that registered it (or last ran it)
    int64_t orphaned_ms;  // when that connection closed (monotonic), 0: owned
} registered;

#define MAX_SPLIT_STEPS 64

struct dg_server {
    dg_cluster *cluster;
    char job[DG_DEVICE_JOB_MAX];
    int task;
    char task_name[160];
    char target[300];
    dg_server_options opts;
    rt_transport *tp;
    exec_resources *rm;
    exec_rendezvous *rv;
    exec_pool *pool;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    registered **graphs;
    int n_graphs, cap_graphs;
    int64_t next_handle;
    bool stopping;
    bool closing;           // dg_server_free has begun: no new steps, under mu
    int n_started;          // started RUN_GRAPH steps not yet done, under mu
    // Steps with several partitions here (RUN_GRAPH's parts): how many are not done yet. The
    // step ends in the rendezvous when the last is done, not the first (its values to the
    // others would go). Under mu; at most MAX_SPLIT_STEPS, beyond that a partition ends its
    // step itself as a lone one does.
    struct split_step { int64_t step_id; int left; } split_steps[MAX_SPLIT_STEPS];
    int n_split_steps;
    pthread_mutex_t out_mu;
    held *outbox;
    bool send_at_once;      // DG_SEND_AT_ONCE=1: no holding back (for measurements)
    graph_strmap routes;    // receiving device -> endpoint ("" for this task), under out_mu
    char **route_strs;      // keys and values of routes, owned
    int n_route_strs, cap_route_strs;
    rt_service services[RT_SERVER_MAX_SERVICES];   // [0]: the worker service of this file
    int n_services;
    int8_t service_of[RT_TYPE_MAX + 1];   // message type -> index in services, -1: none
    bool closed_types[RT_TYPE_MAX + 1];   // answered by a service that has closed
    rt_task_env env;                      // what the services get (server_impl.h)
    rt_keyring *keys;        // the key directory's members (key_dir), or NULL
    struct job *running;     // RUN_GRAPH steps started and not done, under mu
    int64_t graphs_orphaned; // graphs freed because their master left, under mu
    int64_t values_expired;  // rendezvous values dropped by sweep_orphans, under mu
    exec_coll_groups *groups;   // the task's collective groups (in rm)
    // The peers that sent collective values here, and the task each named (I/O thread only):
    // when such a peer's connection closes, that task is lost to the collectives.
    struct peer_task *peer_tasks;
    int n_peer_tasks, cap_peer_tasks;
};

typedef struct peer_task {
    rt_peer *peer;
    char job[DG_DEVICE_JOB_MAX];
    int task;
} peer_task;

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static dg_server *registry[64];
static int n_registry;
static volatile sig_atomic_t got_signal;

dg_server_options dg_server_options_default(void) {
    dg_server_options o;
    memset(&o, 0, sizeof o);
    o.rpc_timeout_ms = 30000;
    o.service_threads = 4;
    return o;
}

dg_server *rt_server_find(const char *target) {
    pthread_mutex_lock(&registry_mu);
    dg_server *found = NULL;
    for (int i = 0; i < n_registry && !found; i++)
        if (strcmp(registry[i]->target, target) == 0) found = registry[i];
    pthread_mutex_unlock(&registry_mu);
    return found;
}

const rt_task_env *rt_server_env(dg_server *s) { return &s->env; }
const char *dg_server_target(const dg_server *s) { return s->target; }
const char *dg_server_task_name(const dg_server *s) { return s->task_name; }

bool rt_task_of_device(const char *device, char *buf, size_t cap) {
    dg_device_name dn;
    dg_status st = DG_STATUS_INIT;
    bool ok = dg_device_name_parse(device, &dn, &st) && dn.has_job && dn.has_task;
    status_impl_clear(&st);
    if (!ok) return false;
    snprintf(buf, cap, "/job:%s/replica:%d/task:%d", dn.job, dn.has_replica ? dn.replica : 0, dn.task);
    return true;
}

char *rt_task_endpoint(const rt_task_env *env, const char *device, dg_status *st) {
    dg_device_name dn;
    if (!dg_device_name_parse(device, &dn, st)) return NULL;
    if (!dn.has_job || !dn.has_task) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "device \"%s\" names no task", device);
        return NULL;
    }
    const char *addr = dg_cluster_check_task(env->cluster, dn.job, dn.task, st);
    if (!addr) return NULL;
    char *ep = NULL;
    if (asprintf(&ep, "tcp://%s", addr) < 0) return NULL;
    return ep;
}

int64_t rt_new_step_id(void) {
    static uint64_t base;
    static uint32_t counter;
    uint64_t b = __atomic_load_n(&base, __ATOMIC_RELAXED);
    if (!b) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        uint64_t expected = 0;
        __atomic_compare_exchange_n(&base, &expected, r | 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        b = __atomic_load_n(&base, __ATOMIC_RELAXED);
    }
    uint32_t c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    return (int64_t)(((b << 24) ^ c) & 0x7FFFFFFFFFFFFFFFull);
}

// ---- the worker service ----

// Values bound for another task's device leave through the transport.
static int route(void *ctx, int64_t step_id, const char *key, dg_tensor *t, dg_status *st) {
    dg_server *s = ctx;
    // key: send_device;incarnation;recv_device;tensor;frame
    const char *a = strchr(key, ';');
    const char *b = a ? strchr(a + 1, ';') : NULL;
    const char *c = b ? strchr(b + 1, ';') : NULL;
    if (!c) {
        dg_status_setf(st, DG_INTERNAL, "malformed rendezvous key \"%s\"", key);
        return -1;
    }
    char dev[DG_DEVICE_NAME_MAX], task[160];
    snprintf(dev, sizeof dev, "%.*s", (int)(c - b - 1), b + 1);
    // Where a device's values go is decided once per device.
    pthread_mutex_lock(&s->out_mu);
    const char *cached = graph_strmap_get(&s->routes, dev);
    char *ep = cached && *cached ? strdup(cached) : NULL;
    pthread_mutex_unlock(&s->out_mu);
    if (cached && !*cached) return 0;
    if (!cached) {
        if (!rt_task_of_device(dev, task, sizeof task)) {
            dg_status_setf(st, DG_INTERNAL, "rendezvous key \"%s\": bad receiving device", key);
            return -1;
        }
        bool local = strcmp(task, s->task_name) == 0;
        if (!local && !(ep = rt_task_endpoint(&s->env, dev, st))) return -1;
        char *k = strdup(dev), *v = strdup(local ? "" : ep);
        if (!k || !v) abort();
        pthread_mutex_lock(&s->out_mu);
        BASE_PUSH(s->route_strs, s->n_route_strs, s->cap_route_strs, k);
        BASE_PUSH(s->route_strs, s->n_route_strs, s->cap_route_strs, v);
        graph_strmap_put(&s->routes, k, v);
        pthread_mutex_unlock(&s->out_mu);
        if (local) return 0;
    }
    if (t->nbytes > 4 * RT_CHUNK_BYTES || s->send_at_once) {   // now (big ones in chunks)
        rt_header *h = malloc(sizeof *h);
        if (!h) abort();
        rt_header_init(h, RT_TENSOR);
        h->step_id = step_id;
        h->key = strdup(key);
        rt_header_add_tensor(h, t);
        rt_push(s->tp, ep, h, &t, 1);
        free(ep);
        return 1;
    }
    held *e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) abort();
    e->step_id = step_id;
    e->endpoint = ep;
    e->t = dg_tensor_ref(t);
    pthread_mutex_lock(&s->out_mu);
    e->next = s->outbox;
    s->outbox = e;
    pthread_mutex_unlock(&s->out_mu);
    return 1;
}

// A step failed here that another task takes part in (a collective's execution): that task's
// receives for it fail at once with why, named as coming from here (one-way ABORT_STEP).
static void abort_remote(void *ctx, int64_t step_id, const char *device, const dg_status *why) {
    dg_server *s = ctx;
    char task[160];
    if (!rt_task_of_device(device, task, sizeof task) || strcmp(task, s->task_name) == 0) return;
    dg_status ignored = DG_STATUS_INIT;
    char *ep = rt_task_endpoint(&s->env, device, &ignored);
    status_impl_clear(&ignored);
    if (!ep) return;
    rt_header *h = malloc(sizeof *h);
    if (!h) abort();
    rt_header_init(h, RT_ABORT_STEP);
    h->step_id = step_id;
    h->code = dg_status_code(why) != DG_OK ? dg_status_code(why) : DG_ABORTED;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s failed it: %s", s->task_name, dg_status_message(why));
    rt_header_set_message(h, msg);
    rt_push(s->tp, ep, h, NULL, 0);
    free(ep);
}

// Sends the values held for a step: one message per destination task.
static void flush(void *ctx, int64_t step_id) {
    dg_server *s = ctx;
    held *mine = NULL;
    pthread_mutex_lock(&s->out_mu);
    for (held **pp = &s->outbox; *pp;) {
        held *e = *pp;
        if (e->step_id == step_id) {
            *pp = e->next;
            e->next = mine;   // reverses: back to send order
            mine = e;
        } else {
            pp = &e->next;
        }
    }
    pthread_mutex_unlock(&s->out_mu);
    while (mine) {
        const char *ep = mine->endpoint;
        rt_header *h = malloc(sizeof *h);
        if (!h) abort();
        rt_header_init(h, RT_TENSOR);
        h->step_id = step_id;
        dg_tensor *ts[256];
        int n = 0;
        size_t bytes = 0;   // one message holds at most RT_GROUP_BYTES (but always one value)
        held *rest = NULL, **tail = &rest;
        for (held *e = mine, *next; e; e = next) {
            next = e->next;
            e->next = NULL;
            if (strcmp(e->endpoint, ep) == 0 && n < 256 && (n == 0 || bytes + e->t->nbytes <= RT_GROUP_BYTES)) {
                bytes += e->t->nbytes;
                rt_header_add_name(h, e->key);
                rt_header_add_tensor(h, e->t);
                ts[n++] = e->t;
                e->t = NULL;
                if (e != mine) {
                    free(e->endpoint);
                    free(e->key);
                    free(e);
                }
            } else {
                *tail = e;
                tail = &e->next;
            }
        }
        rt_push(s->tp, ep, h, ts, n);
        for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
        free(mine->endpoint);
        free(mine->key);
        free(mine);
        mine = rest;
    }
}

typedef struct job {
    dg_server *s;
    rt_peer *peer;
    rt_header *h;
    dg_tensor **ts;
    int n;
    registered *r;   // RUN_GRAPH: its graph, acquired when the request came; NULL: none
    rt_peer *owner;  // a started RUN_GRAPH: who asked (kept after peer goes to the reply)
    struct job *prev_run, *next_run;   // in s->running, under mu
    exec_trace *trace;   // a traced RUN_GRAPH: this task's notes, answered as a blob (trace_blob_impl.h)
    int64_t recv_ns;     // when the traced request came
    bool split;          // a started RUN_GRAPH counted in s->split_steps
} job;

static void release_graph(dg_server *s, registered *r);

static void job_free(job *j) {
    if (j->trace) {
        exec_rendezvous_trace(j->s->rv, j->h->step_id, NULL);
        exec_trace_free(&j->trace);
    }
    rt_peer_free(j->owner);
    if (j->r) release_graph(j->s, j->r);
    if (j->h) {
        rt_header_clear(j->h);
        free(j->h);
    }
    for (int i = 0; i < j->n; i++) dg_tensor_unref(j->ts[i]);
    free(j->ts);
    rt_peer_free(j->peer);
    free(j);
}

// Replies go out unless the transport is already gone (a job left in the pool at shutdown).
static void reply_ok(job *j, rt_header *r, dg_tensor *const *ts, int n) {
    rt_server_reply(j->s, j->peer, j->h->id, r, ts, n);
    j->peer = NULL;
}

static void reply_err(job *j, const dg_status *st) {
    rt_server_reply_error(j->s, j->peer, j->h->id, st);
    j->peer = NULL;
}

void rt_server_reply(dg_server *s, rt_peer *peer, uint64_t id, rt_header *r, dg_tensor *const *ts, int n) {
    r->id = id;
    pthread_mutex_lock(&s->mu);
    if (s->tp) {
        rt_reply(s->tp, peer, r, ts, n);
        peer = NULL;
    } else {
        rt_header_clear(r);
        free(r);
    }
    pthread_mutex_unlock(&s->mu);
    rt_peer_free(peer);
}

void rt_server_reply_error(dg_server *s, rt_peer *peer, uint64_t id, const dg_status *st) {
    pthread_mutex_lock(&s->mu);
    if (s->tp) {
        rt_reply_error(s->tp, peer, id, st);
        peer = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    rt_peer_free(peer);
}

static rt_header *new_header(void) {
    rt_header *r = malloc(sizeof *r);
    if (!r) abort();
    rt_header_init(r, RT_RESPONSE);
    return r;
}

static void do_register(job *j) {
    dg_server *s = j->s;
    dg_status st = DG_STATUS_INIT;
    dg_graph *g = j->h->blob ? dg_graph_from_msgpack(j->h->blob, j->h->blob_len, &st) : NULL;
    if (!j->h->blob) dg_status_set(&st, DG_INVALID_ARGUMENT, "REGISTER_GRAPH without a graph");
    exec_graph *eg = NULL;
    if (g) {
        int n = dg_graph_num_nodes(g);
        dg_node **nodes = malloc(((size_t)n + 1) * sizeof *nodes);
        if (!nodes) abort();
        for (int i = 0; i < n; i++) {
            nodes[i] = dg_graph_node(g, i);
            char task[160];
            const char *dev = dg_node_assigned_device(nodes[i]);
            if (!*dev || !rt_task_of_device(dev, task, sizeof task) || strcmp(task, s->task_name) != 0) {
                dg_status_setf(&st, DG_INVALID_ARGUMENT, "node \"%s\" is placed on \"%s\", not on this task (%s)",
                               dg_node_name(nodes[i]), dev, s->task_name);
                break;
            }
        }
        char cpu[200];
        snprintf(cpu, sizeof cpu, "%s/device:CPU:0", s->task_name);
        exec_env env = {s->rm, cpu, 1};
        if (dg_status_ok(&st)) eg = exec_graph_new(nodes, n, NULL, 0, NULL, 0, &env, NULL, &st);
        if (eg) exec_graph_set_completion_pool(eg, s->pool);
        free(nodes);
    }
    if (!eg) {
        dg_status_prepend(&st, "registering a graph on %s", s->task_name);
        reply_err(j, &st);
        dg_graph_free(&g);
    } else {
        pthread_mutex_lock(&s->mu);
        base_reserve((void **)&s->graphs, sizeof *s->graphs, s->n_graphs, &s->cap_graphs, 1);
        int64_t handle = ++s->next_handle;
        registered *reg = calloc(1, sizeof *reg);
        if (!reg) abort();
        *reg = (registered){handle, g, eg, 0, false, j->peer ? rt_peer_copy(j->peer) : NULL, 0};
        s->graphs[s->n_graphs++] = reg;
        pthread_mutex_unlock(&s->mu);
        rt_header *r = new_header();
        r->handle = handle;
        reply_ok(j, r, NULL, 0);
    }
    status_impl_clear(&st);
}

static void free_registered(registered *r) {
    rt_peer_free(r->owner);
    exec_graph_free(&r->eg);
    dg_graph_free(&r->graph);
    free(r);
}

// The partition with this handle, with a run reference taken; NULL if unknown. A graph
// orphaned by its master's connection is claimed by the peer that runs it (a master whose
// connection broke and came back).
static registered *acquire_graph(dg_server *s, int64_t handle, const rt_peer *peer) {
    pthread_mutex_lock(&s->mu);
    registered *found = NULL;
    for (int i = 0; i < s->n_graphs && !found; i++)
        if (s->graphs[i]->handle == handle) found = s->graphs[i];
    if (found) {
        found->running++;
        if (found->orphaned_ms && peer) {
            rt_peer_free(found->owner);
            found->owner = rt_peer_copy(peer);
            found->orphaned_ms = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

static int64_t orphan_timeout_ms(const dg_server *s) {
    return s->opts.orphan_timeout_ms > 0 ? s->opts.orphan_timeout_ms : DEFAULT_ORPHAN_TIMEOUT_MS;
}

static bool step_running(void *ctx, int64_t step_id) {
    dg_server *s = ctx;
    pthread_mutex_lock(&s->mu);
    bool found = false;
    for (job *j = s->running; j && !found; j = j->next_run) found = j->h->step_id == step_id;
    pthread_mutex_unlock(&s->mu);
    return found;
}

// Frees what masters that are gone left here: graphs whose master's connection closed
// orphan_timeout_ms ago or more and that nobody has run since (a master killed without
// deregistering), and values that have waited as long for a step that never started here.
static void sweep_orphans(dg_server *s) {
    int dropped = exec_rendezvous_drop_stale(s->rv, orphan_timeout_ms(s), step_running, s);
    if (dropped) {
        pthread_mutex_lock(&s->mu);
        s->values_expired += dropped;
        pthread_mutex_unlock(&s->mu);
        if (!s->opts.quiet)
            fprintf(stderr, "distgraph %s: dropped %d values that waited %lld ms or more for steps that never ran here\n",
                    s->task_name, dropped, (long long)orphan_timeout_ms(s));
    }
    int64_t now = base_now_ms();
    registered *gone[64];
    int n_gone = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_graphs && n_gone < 64;) {
        registered *r = s->graphs[i];
        if (r->orphaned_ms && now - r->orphaned_ms >= orphan_timeout_ms(s)) {
            s->graphs[i] = s->graphs[--s->n_graphs];
            s->graphs_orphaned++;
            if (r->running) r->dead = true;   // the last run frees it
            else gone[n_gone++] = r;
            if (!s->opts.quiet)
                fprintf(stderr, "distgraph %s: freed graph %lld: the master that registered it left %lld ms ago\n",
                        s->task_name, (long long)r->handle, (long long)(now - r->orphaned_ms));
        } else {
            i++;
        }
    }
    bool none_left = n_gone > 0 && s->n_graphs == 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_gone; i++) free_registered(gone[i]);
    if (none_left) (void)dg_tensor_cache_release();   // as when the last graph is deregistered
}

// The transport's on_peer_gone (I/O thread): the steps that peer started here can never be
// answered, so they are aborted (their waits end, their values go); the graphs it registered
// are orphaned, and freed unless claimed within orphan_timeout_ms.
static void peer_gone(void *ctx, const rt_peer *peer) {
    dg_server *s = ctx;
    int64_t *steps = NULL;
    int n_steps = 0, cap = 0;
    int64_t now = base_now_ms();
    pthread_mutex_lock(&s->mu);
    for (job *j = s->running; j; j = j->next_run)
        if (rt_peer_equal(j->owner, peer)) BASE_PUSH(steps, n_steps, cap, j->h->step_id);
    for (int i = 0; i < s->n_graphs; i++)
        if (!s->graphs[i]->orphaned_ms && rt_peer_equal(s->graphs[i]->owner, peer)) s->graphs[i]->orphaned_ms = now;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_steps; i++) {
        dg_status st = DG_STATUS_INIT;
        dg_status_setf(&st, DG_ABORTED, "%s: the master that ran step %lld here left (its connection closed)",
                       s->task_name, (long long)steps[i]);
        exec_rendezvous_abort(s->rv, steps[i], &st);
        status_impl_clear(&st);
    }
    free(steps);
    for (int i = 0; i < s->n_peer_tasks;) {
        peer_task *pt = &s->peer_tasks[i];
        if (!rt_peer_equal(pt->peer, peer)) {
            i++;
            continue;
        }
        char why[200];
        snprintf(why, sizeof why, "its connection to %s closed", s->task_name);
        exec_coll_task_lost(s->groups, pt->job, pt->task, why);
        rt_peer_free(pt->peer);
        *pt = s->peer_tasks[--s->n_peer_tasks];
    }
    sweep_orphans(s);
}

// A collective's value came from peer under key ("send_device;..."): that peer is the sending
// task's connection (I/O thread). Only tasks of the cluster are noted, once per connection.
static void note_collective_sender(dg_server *s, const rt_peer *peer, const char *key) {
    const char *semi = strchr(key, ';');
    char dev[DG_DEVICE_NAME_MAX];
    if (!semi || (size_t)(semi - key) >= sizeof dev) return;
    snprintf(dev, sizeof dev, "%.*s", (int)(semi - key), key);
    dg_device_name dn;
    if (!dg_device_name_parse(dev, &dn, NULL) || !dn.has_job || !dn.has_task ||
        !dg_cluster_task_address(s->cluster, dn.job, dn.task, NULL))
        return;
    exec_coll_task_seen(s->groups, dn.job, dn.task);
    for (int i = 0; i < s->n_peer_tasks; i++)
        if (rt_peer_equal(s->peer_tasks[i].peer, peer)) return;
    peer_task pt = {.peer = rt_peer_copy(peer), .task = dn.task};
    if (!pt.peer) return;
    snprintf(pt.job, sizeof pt.job, "%s", dn.job);
    BASE_PUSH(s->peer_tasks, s->n_peer_tasks, s->cap_peer_tasks, pt);
}

// The task of the cluster at endpoint ("tcp://host:port"), into job and *task; false if none.
static bool task_at(const dg_server *s, const char *endpoint, char *job, size_t cap, int *task) {
    if (strncmp(endpoint, "tcp://", 6) != 0) return false;
    const char *addr = endpoint + 6;
    for (int j = 0; j < dg_cluster_num_jobs(s->cluster); j++) {
        const char *name = dg_cluster_job(s->cluster, j);
        for (int i = 0; i < dg_cluster_num_tasks(s->cluster, name); i++) {
            int t = dg_cluster_task_index(s->cluster, name, i);
            const char *a = dg_cluster_task_address(s->cluster, name, t, NULL);
            if (a && strcmp(a, addr) == 0) {
                snprintf(job, cap, "%s", name);
                *task = t;
                return true;
            }
        }
    }
    return false;
}

// The transport's outgoing connections (I/O thread): a task this one sends to that went away
// is lost to the collectives until it is back.
static void endpoint_down(void *ctx, const char *endpoint) {
    dg_server *s = ctx;
    char job[DG_DEVICE_JOB_MAX], why[400];
    int task;
    if (!task_at(s, endpoint, job, sizeof job, &task)) return;
    snprintf(why, sizeof why, "the connection from %s to %s closed", s->task_name, endpoint);
    exec_coll_task_lost(s->groups, job, task, why);
}

static void endpoint_up(void *ctx, const char *endpoint) {
    dg_server *s = ctx;
    char job[DG_DEVICE_JOB_MAX];
    int task;
    if (task_at(s, endpoint, job, sizeof job, &task)) exec_coll_task_seen(s->groups, job, task);
}

bool dg_server_set_collective_members(dg_server *s, const char *job, int64_t epoch, const int *tasks, int n,
                                      dg_status *st) {
    dg_status_reset(st);
    if (!s || !job) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "dg_server_set_collective_members: needs a server and a job");
        return false;
    }
    for (int i = 0; i < n && tasks; i++)
        if (!dg_cluster_task_address(s->cluster, job, tasks[i], NULL)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "collective group members: /job:%s/task:%d is not a task of the cluster",
                           job, tasks[i]);
            return false;
        }
    return exec_coll_set_members(s->groups, job, epoch, tasks, n, st);
}

static void release_graph(dg_server *s, registered *r) {
    pthread_mutex_lock(&s->mu);
    bool last = --r->running == 0 && r->dead;
    pthread_mutex_unlock(&s->mu);
    if (last) free_registered(r);
}

static void do_deregister(job *j) {
    dg_server *s = j->s;
    registered *gone = NULL;
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_graphs; i++)
        if (s->graphs[i]->handle == j->h->handle) {
            registered *r = s->graphs[i];
            s->graphs[i] = s->graphs[--s->n_graphs];
            if (r->running) r->dead = true;   // the last run frees it
            else gone = r;
            found = true;
            break;
        }
    bool none_left = s->n_graphs == 0;
    pthread_mutex_unlock(&s->mu);
    if (gone) free_registered(gone);
    // The last graph gone (its master's session closed): the buffers cached for reuse, many
    // of them the peers' tensors, go back to the system instead of waiting for another step.
    if (found && none_left) (void)dg_tensor_cache_release();
    if (!found) {
        dg_status st = DG_STATUS_INIT;
        dg_status_setf(&st, DG_NOT_FOUND, "no graph with handle %lld on %s", (long long)j->h->handle, s->task_name);
        reply_err(j, &st);
        status_impl_clear(&st);
    } else {
        reply_ok(j, new_header(), NULL, 0);
    }
}

// RUN_GRAPH: the step is started, not waited for, so no thread is held while it waits for
// values from other tasks (or, with sync replicas, for a token); run_done answers when the
// last node has finished, on whichever thread that is. A light partition (a ps's reads and
// updates) starts right on the I/O thread and its receives continue there; one with expensive
// kernels starts on the service pool and continues there.

static void run_finished(dg_server *s) {
    pthread_mutex_lock(&s->mu);
    if (--s->n_started == 0) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void unlink_run(dg_server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    if (j->prev_run) j->prev_run->next_run = j->next_run;
    else if (s->running == j) s->running = j->next_run;
    if (j->next_run) j->next_run->prev_run = j->prev_run;
    j->prev_run = j->next_run = NULL;
    pthread_mutex_unlock(&s->mu);
}

// A partition of a step with several here (j->h->parts > 1) starts: counted, the first one
// making the step's entry. Called with s->mu held.
static void split_step_begin_locked(dg_server *s, job *j) {
    if (j->h->parts <= 1) return;
    for (int i = 0; i < s->n_split_steps; i++)
        if (s->split_steps[i].step_id == j->h->step_id) {
            j->split = true;
            return;
        }
    if (s->n_split_steps == MAX_SPLIT_STEPS) return;   // not counted: ends its step itself
    s->split_steps[s->n_split_steps++] = (struct split_step){j->h->step_id, (int)j->h->parts};
    j->split = true;
}

// j's partition is done (or failed to start): its step ends in the rendezvous unless other
// partitions of it here are still to finish.
static void step_part_done(dg_server *s, job *j) {
    bool end = true;
    if (j->split) {
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n_split_steps; i++)
            if (s->split_steps[i].step_id == j->h->step_id) {
                end = --s->split_steps[i].left <= 0;
                if (end) s->split_steps[i] = s->split_steps[--s->n_split_steps];
                break;
            }
        pthread_mutex_unlock(&s->mu);
        j->split = false;
    }
    if (end) exec_rendezvous_end_step(s->rv, j->h->step_id);
}

// The step is over here (END_STEP): its count goes too.
static void split_step_forget(dg_server *s, int64_t step_id) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_split_steps; i++)
        if (s->split_steps[i].step_id == step_id) {
            s->split_steps[i] = s->split_steps[--s->n_split_steps];
            break;
        }
    pthread_mutex_unlock(&s->mu);
}

static void run_done(void *arg, const dg_status *st) {
    job *j = arg;
    dg_server *s = j->s;
    unlink_run(s, j);
    step_part_done(s, j);
    if (!st) {
        rt_header *r = new_header();
        if (j->trace) {   // the notes travel with the answer (also of a failed step: below)
            exec_rendezvous_trace(s->rv, j->h->step_id, NULL);
            size_t len = 0;
            char *blob = rt_trace_blob_encode_notes(j->trace, j->recv_ns, exec_trace_now_ns(), &len);
            rt_header_set_blob(r, blob, len);
            free(blob);
        }
        reply_ok(j, r, NULL, 0);
    } else {
        reply_err(j, st);
    }
    job_free(j);   // releases the graph
    run_finished(s);
}

// Starts j's step (j->r is its graph, or NULL when the handle is unknown). Returns true when
// the job now belongs to the step (run_done frees it); false after answering with an error.
static bool start_run(job *j) {
    dg_server *s = j->s;
    dg_status st = DG_STATUS_INIT;
    pthread_mutex_lock(&s->mu);
    bool closing = s->closing;
    if (!closing && j->r) {
        s->n_started++;
        split_step_begin_locked(s, j);
        j->owner = j->peer ? rt_peer_copy(j->peer) : NULL;
        j->next_run = s->running;
        if (s->running) s->running->prev_run = j;
        s->running = j;
    }
    pthread_mutex_unlock(&s->mu);
    if (closing || !j->r) {
        if (closing)
            dg_status_setf(&st, DG_UNAVAILABLE, "%s is shutting down", s->task_name);
        else
            dg_status_setf(&st, DG_ABORTED, "no graph with handle %lld on %s (did the task restart?)",
                           (long long)j->h->handle, s->task_name);
        reply_err(j, &st);
        status_impl_clear(&st);
        return false;
    }
    exec_step_options o = {j->h->step_id, s->rv, 0, NULL};
    if (j->h->trace && (j->trace = exec_trace_new())) {
        exec_rendezvous_trace(s->rv, j->h->step_id, j->trace);
        o.trace = j->trace;
        dg_trace_event e = {.kind = DG_TRACE_QUEUED, .name = "RUN_GRAPH", .start_ns = j->recv_ns,
                            .end_ns = exec_trace_now_ns(), .thread = exec_trace_thread()};
        exec_trace_add(j->trace, &e);
    }
    if (exec_graph_start(j->r->eg, &o, run_done, j, &st)) return true;
    unlink_run(s, j);
    run_finished(s);
    step_part_done(s, j);
    reply_err(j, &st);
    status_impl_clear(&st);
    return false;
}

void rt_server_add_devices(dg_server *s, rt_header *h) {
    int n;
    char **list = rt_task_device_list(&s->env, &n);
    for (int i = 0; i < n; i++) rt_header_add_name(h, list[i]);
    dg_device_list_free(list, n);
}

char **rt_task_device_list(const rt_task_env *env, int *n) {
    int virt = env->options ? env->options->n_virtual_cpus : 0;
    char **list = exec_local_device_names(env->task_name, virt > 0 && virt <= 64 ? virt : 0, n);
    if (!list) abort();
    return list;
}

static void do_get_variables(job *j) {
    dg_server *s = j->s;
    dg_status st = DG_STATUS_INIT;
    int n = j->h->n_names;
    dg_tensor **vals = calloc((size_t)n + 1, sizeof *vals);
    rt_header *r = new_header();
    if (!vals) abort();
    for (int i = 0; i < n; i++) {
        exec_variable *v = exec_resources_find(s->rm, j->h->names[i]);
        dg_tensor *cur = v ? exec_variable_get(v) : NULL;
        if (!cur) {
            dg_status_setf(&st, v ? DG_FAILED_PRECONDITION : DG_NOT_FOUND, "variable \"%s\" %s on %s",
                           j->h->names[i], v ? "is not initialized" : "does not exist", s->task_name);
            break;
        }
        dg_tensor *host = exec_tensor_to_host(cur, &st);   // a value in device memory
        dg_tensor_unref(cur);
        vals[i] = host ? dg_tensor_copy(host, &st) : NULL;
        dg_tensor_unref(host);
        if (!vals[i]) break;
        rt_header_add_name(r, j->h->names[i]);
        rt_header_add_tensor(r, vals[i]);
    }
    if (dg_status_ok(&st)) {
        reply_ok(j, r, vals, n);
    } else {
        rt_header_clear(r);
        free(r);
        reply_err(j, &st);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(vals[i]);
    free(vals);
    status_impl_clear(&st);
}

static void run_job(void *arg, int unused) {
    (void)unused;
    job *j = arg;
    switch (j->h->type) {
    case RT_REGISTER_GRAPH: do_register(j); break;
    case RT_DEREGISTER_GRAPH: do_deregister(j); break;
    case RT_RUN_GRAPH:
        if (start_run(j)) return;
        break;
    case RT_GET_VARIABLES: do_get_variables(j); break;
    default: break;
    }
    job_free(j);
}



// The worker service: runs on the transport's I/O thread, quick requests here, the rest on
// the service pool.
static void worker_handle(void *ctx, rt_peer *peer, rt_header *h, dg_tensor **ts, int n) {
    dg_server *s = ctx;
    job *j = calloc(1, sizeof *j);
    if (!j) abort();
    *j = (job){.s = s, .peer = peer, .h = h, .ts = ts, .n = n};
    dg_status st = DG_STATUS_INIT;
    switch (h->type) {
    case RT_PING: {
        int64_t limit = s->opts.max_ping_echo_bytes ? s->opts.max_ping_echo_bytes : DEFAULT_MAX_PING_ECHO_BYTES;
        uint64_t bytes = 0;
        for (int i = 0; i < n; i++) bytes += dg_tensor_nbytes(ts[i]);
        if (limit > 0 && bytes > (uint64_t)limit) {
            dg_status_setf(&st, DG_RESOURCE_EXHAUSTED, "PING: an echo of %llu bytes is over this server's limit "
                           "of %lld (dg_server_options.max_ping_echo_bytes)", (unsigned long long)bytes,
                           (long long)limit);
            rt_transport_refused(s->tp, "%s%s%s", dg_status_message(&st), h->from ? " from " : "",
                                 h->from ? h->from : "");
            reply_err(j, &st);
            break;
        }
        rt_header *r = new_header();
        for (int i = 0; i < n; i++) rt_header_add_tensor(r, ts[i]);
        reply_ok(j, r, ts, n);
        break;
    }
    case RT_LIST_DEVICES: {
        rt_header *r = new_header();
        rt_server_add_devices(s, r);
        reply_ok(j, r, NULL, 0);
        break;
    }
    case RT_TENSOR:
        // One tensor under "key", or several under "names" (pushes merged by the sender).
        if (n == 1 && h->key && h->n_names == 0) {
            if (h->step_id < 0) note_collective_sender(s, peer, h->key);
            exec_rendezvous_note_arrival(s->rv, h->step_id, h->key, dg_tensor_nbytes(ts[0]));
            if (!exec_rendezvous_deliver(s->rv, h->step_id, h->key, ts[0], &st))
                dg_status_reset(&st);   // the step was aborted or ended: no longer wanted
        } else if (n >= 1 && h->n_names == n && !h->key) {
            if (h->step_id < 0) note_collective_sender(s, peer, h->names[0]);
            for (int i = 0; i < n; i++) {
                exec_rendezvous_note_arrival(s->rv, h->step_id, h->names[i], dg_tensor_nbytes(ts[i]));
                if (!exec_rendezvous_deliver(s->rv, h->step_id, h->names[i], ts[i], &st)) dg_status_reset(&st);
            }
        } else {
            dg_status_set(&st, DG_INVALID_ARGUMENT, "TENSOR message: needs a key and one tensor, or one name "
                          "per tensor");
        }
        if (!dg_status_ok(&st) && !s->opts.quiet)
            fprintf(stderr, "distgraph %s: dropped a TENSOR from %s: %s\n", s->task_name,
                    h->from ? h->from : "?", dg_status_message(&st));
        break;
    case RT_ABORT_STEP: {
        dg_status why = DG_STATUS_INIT;
        dg_status_set(&why, h->code ? (dg_code)h->code : DG_ABORTED, h->message ? h->message : "aborted");
        exec_rendezvous_abort(s->rv, h->step_id, &why);
        status_impl_clear(&why);
        break;
    }
    case RT_END_STEP:
        split_step_forget(s, h->step_id);
        exec_rendezvous_end_step(s->rv, h->step_id);
        break;
    case RT_RUN_GRAPH:
        // A light partition (or an unknown handle, answered at once) starts here, on the I/O
        // thread; the others on the service pool.
        if (h->trace) j->recv_ns = exec_trace_now_ns();
        j->r = acquire_graph(s, h->handle, peer);
        if (!j->r || exec_graph_is_light(j->r->eg)) {
            if (!start_run(j)) job_free(j);
        } else {
            exec_pool_submit(s->pool, run_job, j, 0);
        }
        j = NULL;
        break;
    case RT_REGISTER_GRAPH:
    case RT_DEREGISTER_GRAPH:
    case RT_GET_VARIABLES:
        exec_pool_submit(s->pool, run_job, j, 0);
        j = NULL;
        break;
    case RT_SERVER_STATUS: {
        rt_header *r = new_header();
        char line[64];
        sweep_orphans(s);
        pthread_mutex_lock(&s->mu);
        int64_t graphs = s->n_graphs, steps = s->n_started, orphaned = s->graphs_orphaned;
        int64_t expired = s->values_expired;
        pthread_mutex_unlock(&s->mu);
        snprintf(line, sizeof line, "registered_graphs=%lld", (long long)graphs);
        rt_header_add_name(r, line);
        snprintf(line, sizeof line, "running_steps=%lld", (long long)steps);
        rt_header_add_name(r, line);
        snprintf(line, sizeof line, "graphs_orphaned=%lld", (long long)orphaned);
        rt_header_add_name(r, line);
        snprintf(line, sizeof line, "values_expired=%lld", (long long)expired);
        rt_header_add_name(r, line);
        snprintf(line, sizeof line, "abort_marks=%d", exec_rendezvous_num_abort_marks(s->rv));
        rt_header_add_name(r, line);
        rt_transport_stats tps = rt_transport_get_stats(s->tp);
        int64_t tensor_bytes, tensor_peak;
        dg_tensor_memory(&tensor_bytes, &tensor_peak);
        const struct { const char *name; long long v; } counters[] = {
            {"connections", (long long)tps.connections},
            {"max_connections", (long long)tps.max_connections},
            {"connections_closed", (long long)tps.connections_closed},
            {"accept_failures", (long long)tps.accept_failures},
            {"inflight_bytes", (long long)tps.inflight_bytes},
            {"transfers_refused", (long long)tps.transfers_refused},
            {"transfers_expired", (long long)tps.transfers_expired},
            {"transfers_abandoned", (long long)tps.transfers_abandoned},
            {"replies_dropped", (long long)tps.replies_dropped},
            {"requests_refused", (long long)tps.requests_refused},
            {"bad_messages", (long long)tps.bad_messages},
            {"shm_frames_sent", (long long)tps.shm_frames_sent},
            {"shm_frames_received", (long long)tps.shm_frames_received},
            {"tensor_bytes_sent", (long long)tps.tensor_bytes_sent},   // payload, TCP or shared memory
            {"tensor_bytes", (long long)tensor_bytes},        // this process's (dg_tensor_memory)
            {"tensor_bytes_peak", (long long)tensor_peak},
            {"tensor_cache_bytes", (long long)dg_tensor_cache_held()},   // freed buffers kept for reuse
        };
        for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
            snprintf(line, sizeof line, "%s=%lld", counters[i].name, counters[i].v);
            rt_header_add_name(r, line);
        }
        for (int i = 0; i < s->n_services; i++)
            if (s->services[i].add_counters) s->services[i].add_counters(s->services[i].ctx, r);
        reply_ok(j, r, NULL, 0);
        break;
    }
    default:
        dg_status_setf(&st, DG_UNIMPLEMENTED, "%s is not a request", rt_type_name(h->type));
        reply_err(j, &st);
        break;
    }
    if (j) job_free(j);
    status_impl_clear(&st);
}

static const rt_type worker_types[] = {RT_PING, RT_LIST_DEVICES, RT_REGISTER_GRAPH, RT_DEREGISTER_GRAPH,
                                       RT_RUN_GRAPH, RT_TENSOR, RT_ABORT_STEP, RT_END_STEP,
                                       RT_GET_VARIABLES, RT_SERVER_STATUS};

// The transport's handler: the service that entered the message's type in the dispatch table
// answers it.
static void handle(void *ctx, rt_peer *peer, rt_header *h, dg_tensor **ts, int n) {
    dg_server *s = ctx;
    int t = (int)h->type;
    int i = t >= 0 && t <= RT_TYPE_MAX ? __atomic_load_n(&s->service_of[t], __ATOMIC_ACQUIRE) : -1;
    if (i >= 0) {
        s->services[i].handle(s->services[i].ctx, peer, h, ts, n);
        return;
    }
    if (t >= 0 && t <= RT_TYPE_MAX && s->closed_types[t]) {   // its service has closed
        job *j = calloc(1, sizeof *j);
        if (!j) abort();
        *j = (job){.s = s, .peer = peer, .h = h, .ts = ts, .n = n};
        dg_status st = DG_STATUS_INIT;
        dg_status_setf(&st, DG_UNAVAILABLE, "%s is shutting down", s->task_name);
        reply_err(j, &st);
        job_free(j);
        status_impl_clear(&st);
        return;
    }
    worker_handle(s, peer, h, ts, n);   // answers UNIMPLEMENTED
}

// Enters svc in s's dispatch table.
static bool add_service(dg_server *s, const rt_service *svc, dg_status *st) {
    for (int k = 0; k < svc->n_types; k++) {
        int t = (int)svc->types[k];
        if (t < 0 || t > RT_TYPE_MAX || s->service_of[t] >= 0) {
            dg_status_setf(st, DG_INTERNAL, "server %s: the %s service claims message type %s, %s", s->task_name,
                           svc->name, rt_type_name(svc->types[k]),
                           t < 0 || t > RT_TYPE_MAX ? "which is not one" :
                           "which another service answers");
            return false;
        }
    }
    int i = s->n_services++;
    s->services[i] = *svc;
    for (int k = 0; k < svc->n_types; k++) s->service_of[svc->types[k]] = (int8_t)i;
    return true;
}

// ---- lifecycle ----

// Whether the host of address "host:port" (colon points at the port's ':') is a loopback one:
// every address it resolves to is in 127.0.0.0/8 or ::1. A name that does not resolve is not.
static bool host_is_loopback(const char *addr, const char *colon) {
    char host[256];
    size_t n = (size_t)(colon - addr);
    if (n == 0 || n >= sizeof host) return false;
    memcpy(host, addr, n);
    host[n] = 0;
    if (host[0] == '[' && n > 2 && host[n - 1] == ']') {   // [::1]
        memmove(host, host + 1, n - 2);
        host[n - 2] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return false;
    bool all = res != NULL;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET)
            all &= (ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (a->ai_family == AF_INET6)
            all &= IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
        else
            all = false;
    }
    freeaddrinfo(res);
    return all;
}

#define TUNED_TRIM_THRESHOLD ((size_t)512 << 20)
static bool malloc_tuning = true;   // dg_set_malloc_tuning; read once, by the first server
static bool malloc_tuned;

void dg_set_malloc_tuning(bool enabled) { __atomic_store_n(&malloc_tuning, enabled, __ATOMIC_RELAXED); }

static void tune_malloc(void) {
    if (!__atomic_load_n(&malloc_tuning, __ATOMIC_RELAXED)) return;
    malloc_tuned = true;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, (int)TUNED_TRIM_THRESHOLD);
}

dg_server *rt_server_new(const dg_cluster *c, const char *job, int task, const dg_server_options *opts,
                         const rt_service_start *services, int n_services, dg_status *st) {
    dg_status_reset(st);
    if (n_services < 0 || n_services > RT_SERVER_MAX_SERVICES - 1) {
        dg_status_setf(st, DG_INTERNAL, "server: %d services, at most %d", n_services, RT_SERVER_MAX_SERVICES - 1);
        return NULL;
    }
    if (!c || !job) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "server: cluster and job are required");
        return NULL;
    }
    const char *addr = dg_cluster_check_task(c, job, task, st);
    if (!addr) {
        dg_status_prepend(st, "server");
        return NULL;
    }
    dg_server *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "server: out of memory");
        return NULL;
    }
    s->opts = opts ? *opts : dg_server_options_default();
    static pthread_once_t malloc_once = PTHREAD_ONCE_INIT;
    pthread_once(&malloc_once, tune_malloc);
    if (s->opts.rpc_timeout_ms <= 0) s->opts.rpc_timeout_ms = 30000;
    if (s->opts.service_threads <= 0) s->opts.service_threads = 4;
    if (s->opts.n_virtual_cpus < 0 || s->opts.n_virtual_cpus > 64) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "server: n_virtual_cpus must be in 0..64, got %d", s->opts.n_virtual_cpus);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->out_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->cluster = dg_cluster_copy(c);
    snprintf(s->job, sizeof s->job, "%s", job);
    s->task = task;
    snprintf(s->task_name, sizeof s->task_name, "/job:%s/replica:0/task:%d", job, task);
    snprintf(s->target, sizeof s->target, "dg://%s", addr);
    s->rm = exec_resources_new();
    s->rv = exec_rendezvous_new();
    s->pool = exec_pool_new(s->opts.service_threads, st);
    if (s->rm) s->groups = exec_coll_groups_of(s->rm, st);
    if (!s->cluster || !s->rm || !s->rv || !s->pool || !s->groups) {
        if (dg_status_ok(st)) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "server: out of memory");
        dg_server_free(&s);
        return NULL;
    }
    exec_rendezvous_set_router(s->rv, route, flush, s);
    exec_rendezvous_set_remote_abort(s->rv, abort_remote);
    s->env = (rt_task_env){.server = s, .task_name = s->task_name, .cluster = s->cluster, .resources = s->rm,
                           .rendezvous = s->rv, .pool = s->pool, .rpc_timeout_ms = s->opts.rpc_timeout_ms,
                           .quiet = s->opts.quiet, .options = &s->opts};
    memset(s->service_of, -1, sizeof s->service_of);
    rt_service worker = {.name = "worker", .types = worker_types,
                         .n_types = (int)(sizeof worker_types / sizeof worker_types[0]),
                         .handle = worker_handle, .ctx = s};
    bool ok = add_service(s, &worker, st);
    for (int i = 0; ok && i < n_services; i++) {
        rt_service svc = {0};
        ok = services[i](&s->env, &svc, st) && add_service(s, &svc, st);
        if (!ok && svc.close && s->n_services == i + 1) svc.close(svc.ctx);   // made, not entered
    }
    if (!ok) {
        dg_server_free(&s);
        return NULL;
    }
    // Handles start at a random point, so a restarted task never takes a handle its earlier
    // incarnation gave out (masters still holding those get ABORTED, not another graph).
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    s->next_handle = (int64_t)(rnd >> 2);
    const char *sao = getenv("DG_SEND_AT_ONCE");
    s->send_at_once = sao && strcmp(sao, "1") == 0;
    // Where to listen, on the port of the cluster address: bind_address when given; a loopback
    // cluster address as it is (only this host can use it anyway); else every interface, as
    // TensorFlow's servers do, since the cluster may name this host by a name that resolves
    // elsewhere (a Kubernetes service, a load balancer, NAT).
    char bind[300];
    const char *colon = strrchr(addr, ':');
    bool loopback = host_is_loopback(addr, colon);
    const char *ba = s->opts.bind_address;
    if (ba && *ba) {
        bool v6 = strchr(ba, ':') && ba[0] != '[';
        snprintf(bind, sizeof bind, "tcp://%s%s%s:%s", v6 ? "[" : "", strcmp(ba, "0.0.0.0") == 0 ? "*" : ba,
                 v6 ? "]" : "", colon + 1);
    } else if (loopback) {
        snprintf(bind, sizeof bind, "tcp://%.*s:%s", (int)(colon - addr), addr, colon + 1);
        if (strncmp(addr, "localhost:", 10) == 0) snprintf(bind, sizeof bind, "tcp://127.0.0.1:%s", colon + 1);
    } else {
        snprintf(bind, sizeof bind, "tcp://*:%s", colon + 1);
    }
    const char *key_dir = s->opts.key_dir ? s->opts.key_dir : getenv("DG_KEY_DIR");
    bool pair = s->opts.curve_public_key && *s->opts.curve_public_key;
    char own_pub[RT_KEY_Z85], own_sec[RT_KEY_Z85];
    if (key_dir && *key_dir) {
        char name[256];
        rt_key_name_of(addr, name, sizeof name);
        if (pair) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "server %s: both a key directory (%s) and a cluster key pair "
                           "given; use one", s->task_name, key_dir);
        } else if ((s->keys = rt_keyring_load(key_dir, st)) && rt_keyring_pair(s->keys, name, own_pub, own_sec, st)) {
            s->opts.curve_public_key = own_pub;   // only for the transport below
            s->opts.curve_secret_key = own_sec;
            pair = true;
        }
        if (!pair) {
            dg_status_prepend(st, "server %s", s->task_name);
            dg_server_free(&s);
            return NULL;
        }
    }
    bool bind_loopback = loopback;
    if (ba && *ba) {
        char b[300];
        snprintf(b, sizeof b, "%s:0", ba);
        bind_loopback = host_is_loopback(b, strrchr(b, ':'));
    }
    if (!pair && !s->opts.allow_unauthenticated && !bind_loopback) {
        dg_status_setf(st, DG_FAILED_PRECONDITION,
                       "server %s: refusing to serve %s (cluster address %s) without authentication: anyone who "
                       "reaches the port could run graphs and rewrite variables. Give the cluster's CurveZMQ keys "
                       "(a key directory: dg-server --gen_keys DIR ..., then --key_dir DIR or DG_KEY_DIR=DIR; "
                       "dg_server_options.key_dir), serve a loopback address, or, on a network only trusted "
                       "machines reach, allow it (dg-server --allow_unauthenticated; "
                       "dg_server_options.allow_unauthenticated). See docs/SECURITY.md",
                       s->task_name, bind, addr);
        dg_server_free(&s);
        return NULL;
    }
    rt_transport_options to;
    memset(&to, 0, sizeof to);
    to.bind = bind;
    to.name = s->task_name;
    to.curve_public_key = s->opts.curve_public_key;
    to.curve_secret_key = s->opts.curve_secret_key;
    to.quiet = s->opts.quiet;
    to.liveness_timeout_ms = s->opts.liveness_timeout_ms;
    to.busy_poll_us = s->opts.busy_poll_us;
    to.max_connections = s->opts.max_connections;
    to.max_inflight_bytes = s->opts.max_inflight_bytes;
    to.max_frame_bytes = s->opts.max_message_bytes > 0 ? (size_t)s->opts.max_message_bytes : 0;
    to.transfer_timeout_ms = s->opts.transfer_timeout_ms;
    to.reply_queue_messages = s->opts.reply_queue_messages;
    to.on_peer_gone = peer_gone;
    to.on_endpoint_up = endpoint_up;
    to.on_endpoint_down = endpoint_down;
    if (malloc_tuned) to.trim_threshold = TUNED_TRIM_THRESHOLD;
    to.keys = s->keys;
    s->tp = rt_transport_new(&to, handle, s, st);
    s->env.transport = s->tp;
    explicit_bzero(own_sec, sizeof own_sec);
    if (s->keys) s->opts.curve_public_key = s->opts.curve_secret_key = NULL;   // pointed at the stack
    if (!s->tp) {
        dg_status_prepend(st, "server %s", s->task_name);
        dg_server_free(&s);
        return NULL;
    }
    pthread_mutex_lock(&registry_mu);
    if (n_registry < 64) registry[n_registry++] = s;
    pthread_mutex_unlock(&registry_mu);
    if (!s->opts.quiet) fprintf(stderr, "distgraph %s: serving at %s\n", s->task_name, bind);
    return s;
}

void dg_server_stop(dg_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void on_signal(int sig) {
    (void)sig;
    got_signal = 1;
}

bool dg_server_join(dg_server *s, bool handle_signals, dg_status *st) {
    dg_status_reset(st);
    if (handle_signals) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    pthread_mutex_lock(&s->mu);
    while (!s->stopping && !(handle_signals && got_signal)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    (void)st;
    if (!s->opts.quiet && got_signal) fprintf(stderr, "distgraph %s: stopping on a signal\n", s->task_name);
    return true;
}

void dg_server_free(dg_server **sp) {
    if (!sp || !*sp) return;
    dg_server *s = *sp;
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < n_registry; i++)
        if (registry[i] == s) {
            registry[i] = registry[--n_registry];
            break;
        }
    pthread_mutex_unlock(&registry_mu);
    // Started steps end first, answered through the live transport: no new ones, then the
    // rendezvous fails every wait, then wait for the last one to finish.
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_mutex_unlock(&s->mu);
    if (s->rv) {
        dg_status why = DG_STATUS_INIT;
        dg_status_setf(&why, DG_CANCELLED, "server %s is shutting down", s->task_name);
        exec_rendezvous_close(s->rv, &why);   // running steps stop waiting
        status_impl_clear(&why);
    }
    // The other services end while the transport still answers (the master service's remote
    // clients' sessions deregister their partitions), the last entered first.
    for (int i = s->n_services - 1; i > 0; i--) {
        for (int k = 0; k < s->services[i].n_types; k++) {
            int t = (int)s->services[i].types[k];
            s->closed_types[t] = true;
            __atomic_store_n(&s->service_of[t], (int8_t)-1, __ATOMIC_RELEASE);
        }
        if (s->services[i].close) s->services[i].close(s->services[i].ctx);
    }
    s->n_services = s->n_services > 0 ? 1 : 0;
    pthread_mutex_lock(&s->mu);
    while (s->n_started > 0) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->mu);
    rt_transport *tp = s->tp;
    s->tp = NULL;   // replies from jobs still queued are dropped
    s->env.transport = NULL;
    pthread_mutex_unlock(&s->mu);
    rt_transport_free(&tp);      // no more requests after this
    exec_pool_free(&s->pool);    // waits for running jobs
    for (int i = 0; i < s->n_graphs; i++) free_registered(s->graphs[i]);
    free(s->graphs);
    exec_rendezvous_free(&s->rv);
    for (held *e = s->outbox, *next; e; e = next) {
        next = e->next;
        dg_tensor_unref(e->t);
        free(e->endpoint);
        free(e->key);
        free(e);
    }
    graph_strmap_clear(&s->routes);
    for (int i = 0; i < s->n_route_strs; i++) free(s->route_strs[i]);
    free(s->route_strs);
    for (int i = 0; i < s->n_peer_tasks; i++) rt_peer_free(s->peer_tasks[i].peer);
    free(s->peer_tasks);
    pthread_mutex_destroy(&s->out_mu);
    exec_resources_free(&s->rm);
    rt_keyring_free(&s->keys);
    dg_cluster_free(&s->cluster);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *sp = NULL;
}

bool dg_curve_keypair(char public_key[41], char secret_key[41], dg_status *st) {
    dg_status_reset(st);
    return rt_curve_keypair(public_key, secret_key, st);
}

bool dg_key_generate(const char *dir, const char *name, dg_status *st) {
    dg_status_reset(st);
    if (!dir || !*dir) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "key directory: no path given");
        return false;
    }
    return rt_keyring_generate(dir, name, st);
}

void dg_key_name(const char *address, char *out, size_t cap) {
    if (!out || cap == 0) return;
    rt_key_name_of(address ? address : "", out, cap);
}
