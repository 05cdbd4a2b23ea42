/* The master (master_impl.h): one compile pipeline and one step runner for local sessions
 * and for sessions over a cluster. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base_impl.h"
#include "device.h"
#include "distgraph/device_name.h"
#include "distgraph/auto_place.h"
#include "distgraph/placer.h"
#include "exec_cpu_impl.h"
#include "exec_executor_impl.h"
#include "exec_kernel_registry_impl.h"
#include "graph_impl.h"
#include "master_impl.h"
#include "server_impl.h"
#include "status_impl.h"
#include "step_trace_impl.h"
#include "timer_impl.h"
#include "worker_client_impl.h"

#define LOCAL_TASK "/job:localhost/replica:0/task:0"

typedef struct remote {
    char *task;       // "/job:ps/replica:0/task:0"
    char *endpoint;   // "tcp://host:port"
    int64_t handle;   // of the registered partition
} remote;

typedef struct compiled {
    char *key;
    exec_graph *eg;         // what runs in this process
    dg_partitions *parts;   // NULL when everything runs on one device
    remote *remotes;        // partitions registered with other tasks
    int n_remotes;
} compiled;

struct master_session {
    dg_graph *graph;
    dg_session_options opts;
    exec_resources *rm;      // local masters: the session's variables; NULL in a cluster
    exec_pool *pool;
    pthread_mutex_t mu;
    compiled *cache;
    int n_cache, cap_cache;
    char **devices;          // canonical names of the devices placement may use
    int n_devices;
    exec_rendezvous *rendezvous;   // local masters' own; the server's in a cluster
    int64_t next_step_id;
    const rt_task_env *task;  // the cluster's task this master runs in; NULL for local
    bool devices_listed;     // cluster: devices as the tasks reported them
    char own_task[160];
    char client_device[200];
    char **answered;         // cluster: tasks known to answer (waited for once), under mu
    int n_answered, cap_answered;
    pthread_mutex_t run_mu;  // guards running and cancel (never held while waiting)
    dg_status cancel;        // set by master_session_abort: the session is going away
    struct running_step {    // steps running now, under run_mu
        int64_t step_id;
        const remote *remotes;
        int n_remotes;
    } *running;
    int n_running, cap_running;
    bool collect_placement;  // log_device_placement lines kept for the client (a remote one)
    char **placed;           // those lines, under mu, until master_session_take_placement
    int n_placed, cap_placed;
    int64_t placed_dropped;  // lines past PLACEMENT_LOG_MAX since the last take
    int auto_placed;         // auto_place: the graph's nodes placed so far (under mu)
    dg_cost_model *cost;     // auto_place: the cost model, loaded on first use
};

// At most this many placement lines wait for a remote client; the rest are counted.
#define PLACEMENT_LOG_MAX 20000

// The session options' defaults live with the master, which reads them, below the session
// room that hands them in.
dg_session_options dg_session_options_default(void) {
    dg_session_options o;
    memset(&o, 0, sizeof o);
    o.allow_soft_placement = true;
    return o;
}

// Master sessions alive in this process: when the last one is freed, the tensor cache's
// buffers (graph/tensor_cache.c) go back to the system, as a server's do when its last
// registered graph goes.
static atomic_int sessions_alive;

master_session *master_session_new(dg_graph *g, const rt_task_env *task, const dg_session_options *opts,
                                   dg_status *st) {
    master_session *m = calloc(1, sizeof *m);
    if (!m) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    atomic_fetch_add(&sessions_alive, 1);
    m->graph = g;
    m->task = task;
    m->opts = opts ? *opts : dg_session_options_default();
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->run_mu, NULL);
    if (m->opts.n_virtual_cpus < 0 || m->opts.n_virtual_cpus > 64) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "session: n_virtual_cpus must be in 0..64, got %d",
                       m->opts.n_virtual_cpus);
        master_session_free(&m);
        return NULL;
    }
    int inter = m->opts.inter_op_threads;
    if (inter <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        inter = n > 0 ? (int)n : 1;
    }
    if (inter > 1 && !(m->pool = exec_pool_new(inter - 1, st))) {
        master_session_free(&m);
        return NULL;
    }
    exec_cpu_set_threads(m->opts.intra_op_threads);
    exec_cpu_announce();
    exec_devices_configure(&(exec_device_config){.allow_tf32 = m->opts.gpu_allow_tf32});
    if (task) {
        int n = dg_cluster_devices(task->cluster, 0, &m->devices, st);
        if (n < 0) {
            master_session_free(&m);
            return NULL;
        }
        m->n_devices = n;
        m->rendezvous = task->rendezvous;
        snprintf(m->own_task, sizeof m->own_task, "%s", task->task_name);
        snprintf(m->client_device, sizeof m->client_device, "%s/device:CPU:0", m->own_task);
        return m;
    }
    snprintf(m->own_task, sizeof m->own_task, "%s", LOCAL_TASK);
    snprintf(m->client_device, sizeof m->client_device, "%s/device:CPU:0", LOCAL_TASK);
    m->rm = exec_resources_new();
    m->rendezvous = exec_rendezvous_new();
    m->devices = exec_local_device_names(LOCAL_TASK, m->opts.n_virtual_cpus, &m->n_devices);
    if (!m->rm || !m->rendezvous || !m->devices) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        master_session_free(&m);
        return NULL;
    }
    return m;
}

static void free_remotes(remote *rs, int n, rt_transport *tp) {
    for (int r = 0; r < n; r++) {
        if (tp) wc_deregister_graph(tp, rs[r].endpoint, rs[r].handle);
        free(rs[r].task);
        free(rs[r].endpoint);
    }
    free(rs);
}

static void free_compiled(compiled *c, rt_transport *tp) {
    free_remotes(c->remotes, c->n_remotes, tp);
    free(c->key);
    exec_graph_free(&c->eg);
    dg_partitions_free(&c->parts);
}

void master_session_free(master_session **mp) {
    if (!mp || !*mp) return;
    master_session *m = *mp;
    rt_transport *tp = m->task ? m->task->transport : NULL;
    for (int i = 0; i < m->n_cache; i++) free_compiled(&m->cache[i], tp);
    free(m->cache);
    dg_device_list_free(m->devices, m->n_devices);
    dg_device_list_free(m->answered, m->n_answered);
    dg_cost_model_free(&m->cost);
    free(m->running);
    for (int i = 0; i < m->n_placed; i++) free(m->placed[i]);
    free(m->placed);
    // The pool first: a pool task may still flush the rendezvous after its step has finished.
    exec_pool_free(&m->pool);
    if (!m->task) exec_rendezvous_free(&m->rendezvous);
    exec_resources_free(&m->rm);
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->run_mu);
    status_impl_clear(&m->cancel);
    free(m);
    *mp = NULL;
    if (atomic_fetch_sub(&sessions_alive, 1) == 1) (void)dg_tensor_cache_release();
}

void master_session_collect_placement(master_session *m) { m->collect_placement = true; }

int master_session_take_placement(master_session *m, char ***lines) {
    pthread_mutex_lock(&m->mu);
    if (m->placed_dropped > 0) {
        char *line;
        if (asprintf(&line, "(%lld more placement lines not sent)", (long long)m->placed_dropped) < 0) abort();
        BASE_PUSH(m->placed, m->n_placed, m->cap_placed, line);
        m->placed_dropped = 0;
    }
    int n = m->n_placed;
    *lines = m->placed;
    m->placed = NULL;
    m->n_placed = m->cap_placed = 0;
    pthread_mutex_unlock(&m->mu);
    return n;
}

static char *signature(const dg_output *feeds, int n_feeds, const dg_output *fetches, int n_fetches,
                       dg_node *const *targets, int n_targets) {
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = 0;
    for (int part = 0; part < 3; part++) {
        int n = part == 0 ? n_feeds : part == 1 ? n_fetches : n_targets;
        for (int i = 0; i < n; i++) {
            const char *name;
            int idx = 0;
            if (part == 2) {
                name = targets[i]->name;
            } else {
                dg_output o = part == 0 ? feeds[i] : fetches[i];
                name = o.node->name;
                idx = o.index;
            }
            size_t need = strlen(name) + 24;
            if (len + need >= cap) {
                cap = (len + need) * 2;
                char *nb = realloc(buf, cap);
                if (!nb) {
                    free(buf);
                    return NULL;
                }
                buf = nb;
            }
            len += (size_t)snprintf(buf + len, cap - len, "%c%s:%d,", "FOT"[part], name, idx);
        }
    }
    return buf;
}

static bool is_fed(const dg_output *feeds, int n_feeds, dg_node *n, int index) {
    for (int f = 0; f < n_feeds; f++)
        if (feeds[f].node == n && feeds[f].index == index) return true;
    return false;
}

// Whether every output of n is fed: the node itself never runs (as TensorFlow replaces fed
// nodes), so a control dependency on it waits for nothing.
static bool all_fed(const dg_output *feeds, int n_feeds, dg_node *n) {
    if (n->n_outputs < 1) return false;
    for (int i = 0; i < n->n_outputs; i++)
        if (!is_fed(feeds, n_feeds, n, i)) return false;
    return true;
}

// Nodes needed for the fetches and targets, stopping at fed outputs (and at control inputs
// whose outputs are all fed). A LocalAllReduce member brings its whole group: each member waits
// for every other's input, so a step that ran one alone would never finish.
static dg_node **prune(dg_graph *g, const dg_output *feeds, int n_feeds, const dg_output *fetches,
                       int n_fetches, dg_node *const *targets, int n_targets, int *n_out) {
    int n_nodes = dg_graph_num_nodes(g);
    unsigned char *seen = calloc((size_t)n_nodes + 1, 1);
    dg_node **stack = malloc(((size_t)n_nodes + 1) * sizeof *stack);
    if (!seen || !stack) abort();
    int top = 0;
    for (int i = 0; i < n_fetches; i++) {
        dg_output o = fetches[i];
        if (is_fed(feeds, n_feeds, o.node, o.index) || seen[o.node->id]) continue;
        seen[o.node->id] = 1;
        stack[top++] = o.node;
    }
    for (int i = 0; i < n_targets; i++)
        if (!seen[targets[i]->id]) {
            seen[targets[i]->id] = 1;
            stack[top++] = targets[i];
        }
    int *ring = NULL;   // the LocalAllReduce groups (graph_local_all_reduce_rings), once one is met
    while (top > 0) {
        dg_node *n = stack[--top];
        if (strcmp(n->op->name, "LocalAllReduce") == 0) {
            if (!ring) {
                if (!(ring = malloc(((size_t)n_nodes + 1) * sizeof *ring))) abort();
                graph_local_all_reduce_rings(g, n_nodes, ring);
            }
            for (int m = ring[n->id]; m >= 0 && m != n->id; m = ring[m])
                if (!seen[m]) {
                    seen[m] = 1;
                    stack[top++] = dg_graph_node(g, m);
                }
        }
        for (int k = 0; k < n->n_inputs; k++) {
            dg_output in = n->inputs[k];
            if (is_fed(feeds, n_feeds, in.node, in.index) || seen[in.node->id]) continue;
            seen[in.node->id] = 1;
            stack[top++] = in.node;
        }
        for (int k = 0; k < n->n_ctrl; k++)
            if (!seen[n->ctrl_inputs[k]->id] && !all_fed(feeds, n_feeds, n->ctrl_inputs[k])) {
                seen[n->ctrl_inputs[k]->id] = 1;
                stack[top++] = n->ctrl_inputs[k];
            }
    }
    int k = 0;
    for (int i = 0; i < n_nodes; i++)
        if (seen[i]) stack[k++] = dg_graph_node(g, i);
    free(seen);
    free(ring);
    *n_out = k;
    return stack;
}

bool master_check_args(const dg_graph *g, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                       const dg_output *fetches, int n_fetches, dg_node *const *targets, int n_targets,
                       dg_status *st) {
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "the graph has an error from building it");
        return false;
    }
    char a[128], b[128];
    for (int i = 0; i < n_feeds; i++) {
        dg_output o = feeds[i];
        if (!o.node || o.node->graph != g || o.index < 0 || o.index >= o.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed %d is not an output of this session's graph", i);
            return false;
        }
        const dg_tensor *t = feed_values[i];
        if (!t) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed %d (\"%s\"): value is NULL", i, o.node->name);
            return false;
        }
        dg_dtype want = o.node->out_dtypes[o.index];
        dg_shape ws = o.node->out_shapes[o.index];
        if (t->dtype != want) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed for \"%s:%d\": expected %s, got %s",
                           o.node->name, o.index, dg_dtype_name(want), dg_dtype_name(t->dtype));
            return false;
        }
        if (!dg_shape_compatible(&ws, &t->shape)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed for \"%s:%d\": expected shape %s, got %s",
                           o.node->name, o.index, dg_shape_str(&ws, a, sizeof a),
                           dg_shape_str(&t->shape, b, sizeof b));
            return false;
        }
        for (int j = 0; j < i; j++)
            if (feeds[j].node == o.node && feeds[j].index == o.index) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "\"%s:%d\" is fed twice", o.node->name, o.index);
                return false;
            }
    }
    for (int i = 0; i < n_fetches; i++) {
        dg_output o = fetches[i];
        if (!o.node || o.node->graph != g || o.index < 0 || o.index >= o.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "fetch %d is not an output of this session's graph "
                           "(a null output from a failed builder call?)", i);
            return false;
        }
    }
    for (int i = 0; i < n_targets; i++)
        if (!targets[i] || targets[i]->graph != g) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "target %d is not a node of this session's graph", i);
            return false;
        }
    return true;
}

// ---- the compile pipeline ----

// The devices of every task as the tasks report them (LIST_DEVICES): a task's accelerators
// (GPUs) count only where it has them. Asked once, on the first compile that needs one; until
// then (and for graphs that request none) the cluster's CPUs are the devices, which needs no
// peer.
static bool list_cluster_devices(master_session *m, dg_status *st) {
    char **list = NULL;
    int n = 0, cap = 0;
    bool ok = true;
    for (int i = 0; i < m->n_devices && ok; i++) {
        char task[200];
        // The CPU-only list has one device per task, its CPU:0.
        if (!rt_task_of_device(m->devices[i], task, sizeof task)) continue;
        char **got = NULL;
        int n_got = 0;
        if (strcmp(task, m->own_task) == 0) {
            got = rt_task_device_list(m->task, &n_got);
        } else {
            char *ep = rt_task_endpoint(m->task, m->devices[i], st);
            got = ep ? wc_list_devices(m->task->transport, ep, m->task->rpc_timeout_ms, &n_got, st)
                     : NULL;
            if (!got) dg_status_prepend(st, "listing the devices of %s (%s)", task, ep ? ep : "?");
            free(ep);
        }
        ok = got != NULL;
        // Sized by the tasks' answers: out of memory is a status, not an abort.
        for (int k = 0; k < n_got; k++) {
            if (ok && !BASE_GROW(list, n, cap, 1, "the cluster's device list", st)) ok = false;
            if (ok) list[n++] = got[k];
            else free(got[k]);
        }
        free(got);
    }
    if (!ok) {
        dg_device_list_free(list, n);
        return false;
    }
    dg_device_list_free(m->devices, m->n_devices);
    m->devices = list;
    m->n_devices = n;
    m->devices_listed = true;
    return true;
}

// True when the tasks' own device lists are needed: automatic placement (it chooses among
// every device), or a node asking for an accelerator or for a virtual CPU (CPU:1 and on:
// dg_server_options.n_virtual_cpus), which the cluster's CPU:0s lack: soft placement moved
// such nodes to CPU:0 without a word.
static bool wants_listed_device(const master_session *m, dg_node *const *run, int n_run) {
    if (m->opts.auto_place) return true;
    for (int i = 0; i < n_run; i++) {
        const char *req = run[i]->requested_device;
        if (exec_device_name_is_accelerator(req)) return true;
        dg_device_name dn;
        if (req && req[0] && dg_device_name_parse(req, &dn, NULL) && dn.has_id && dn.id > 0) return true;
    }
    return false;
}

// Ends a wait for a task once the session is cancelled (why set).
static bool wait_cancelled(void *arg, dg_status *why) {
    master_session *m = arg;
    pthread_mutex_lock(&m->run_mu);
    bool stop = !dg_status_ok(&m->cancel);
    if (stop) dg_status_copy(why, &m->cancel);
    pthread_mutex_unlock(&m->run_mu);
    return stop;
}

// A task's first partition waits until the task answers (standing servers start in any
// order); later ones go straight to it. Called with m->mu held.
static bool wait_for_task_locked(master_session *m, const char *task, const char *ep, dg_status *st) {
    for (int i = 0; i < m->n_answered; i++)
        if (strcmp(m->answered[i], task) == 0) return true;
    if (m->opts.wait_for_tasks_ms >= 0 &&
        !wc_wait_for_task(m->task->transport, ep, task, m->opts.wait_for_tasks_ms, 5000, m->own_task,
                          wait_cancelled, m, st))
        return false;
    char *copy = strdup(task);
    if (!copy) abort();
    BASE_PUSH(m->answered, m->n_answered, m->cap_answered, copy);
    return true;
}

// Registers partition pg (placed on dev, a device of task) with its task.
static bool register_remote(master_session *m, dg_graph *pg, const char *dev, const char *task, compiled *out,
                            dg_status *st) {
    char *ep = rt_task_endpoint(m->task, dev, st);
    int64_t handle = 0;
    bool ok = ep && wait_for_task_locked(m, task, ep, st) &&
              wc_register_graph(m->task->transport, ep, pg, m->task->rpc_timeout_ms, &handle, st);
    if (!ok) {
        dg_status_prepend(st, "registering the partition of %s with task %s (%s)", dev, task, ep ? ep : "?");
        free(ep);
        return false;
    }
    remote *r = &out->remotes[out->n_remotes++];
    if (!(r->task = strdup(task))) abort();
    r->endpoint = ep;
    r->handle = handle;
    return true;
}

// Automatic placement (opts.auto_place): the graph's nodes not placed yet, with those placed
// before kept where they are, over the session's devices (no default device: every task's may
// take them). Says on standard error what it predicts and how long it took.
static bool auto_place_graph(master_session *m, const dg_placement_options *base, dg_status *st) {
    int n = dg_graph_num_nodes(m->graph);
    if (n <= m->auto_placed) return true;
    if (!m->cost) {
        m->cost = dg_cost_model_new();
        if (!m->cost) return base_oom(st, "cost model", sizeof(void *));
        if (m->opts.auto_place_cost_file && !dg_cost_model_load(m->cost, m->opts.auto_place_cost_file, st)) {
            dg_cost_model_free(&m->cost);
            dg_status_prepend(st, "session: auto_place_cost_file");
            return false;
        }
        if (m->task && !dg_cost_model_set_hosts(m->cost, m->task->cluster, st)) {
            dg_cost_model_free(&m->cost);
            return false;
        }
        dg_cost_model_set_handoff(m->cost, step_trace_executor_handoff, NULL);   // this executor's rule
    }
    dg_node **all = malloc(((size_t)n + 1) * sizeof *all);
    if (!all) return base_oom(st, "automatic placement", (size_t)n * sizeof *all);
    for (int i = 0; i < n; i++) all[i] = dg_graph_node(m->graph, i);
    dg_auto_place_options o = dg_auto_place_options_default();
    o.placement = *base;
    o.placement.default_device = NULL;
    o.cost = m->cost;
    o.unknown_dim = m->opts.auto_place_unknown_dim > 0 ? m->opts.auto_place_unknown_dim : 32;
    o.keep_assigned = true;
    dg_auto_place_report r;
    bool ok = dg_auto_place_nodes(all, n, (const char *const *)m->devices, m->n_devices, &o, &r, st);
    free(all);
    if (!ok) {
        dg_status_prepend(st, "session: automatic placement");
        return false;
    }
    fprintf(stderr, "distgraph: automatic placement of %d nodes on %d devices (%s): predicted step %.3f ms, "
            "placed in %.2f s\n", n - m->auto_placed, m->n_devices, dg_auto_placer_name(r.chosen),
            r.predicted_step_s * 1e3, r.seconds);
    dg_auto_place_report_clear(&r);
    m->auto_placed = n;
    return true;
}

// Prune, place, partition, register, compile. Local masters place over this process's
// devices; cluster masters over every task's (default device: their own task), with their
// own CPU as the client. Partitions of this process's task become one local executable; the
// others are registered with their tasks. Called with m->mu held.
static bool compile(master_session *m, const dg_output *feeds, int n_feeds, const dg_output *fetches, int n_fetches,
                    dg_node *const *targets, int n_targets, compiled *out, dg_status *st) {
    int n_run;
    dg_node **run = prune(m->graph, feeds, n_feeds, fetches, n_fetches, targets, n_targets, &n_run);
    dg_placement_options po = dg_placement_options_default();
    po.allow_soft_placement = m->opts.allow_soft_placement;
    po.supports = exec_kernel_supports;
    if (m->task) po.default_device = m->own_task;
    bool ok = (!m->task || m->devices_listed || !wants_listed_device(m, run, n_run) || list_cluster_devices(m, st)) &&
              (m->opts.auto_place ? auto_place_graph(m, &po, st)
                                  : dg_place(run, n_run, (const char *const *)m->devices, m->n_devices, &po, st));
    if (ok && m->opts.log_device_placement)
        for (int i = 0; i < n_run; i++) {
            if (!m->collect_placement) {
                fprintf(stderr, "%s: (%s): %s\n", run[i]->name, run[i]->op->name, run[i]->assigned_device);
            } else if (m->n_placed >= PLACEMENT_LOG_MAX) {
                m->placed_dropped++;
            } else {
                char *line;
                if (asprintf(&line, "%s: (%s): %s", run[i]->name, run[i]->op->name, run[i]->assigned_device) < 0)
                    abort();
                BASE_PUSH(m->placed, m->n_placed, m->cap_placed, line);
            }
        }
    bool multi = false, accelerator = false;
    for (int i = 1; ok && i < n_run && !multi; i++)
        multi = strcmp(run[i]->assigned_device, run[0]->assigned_device) != 0;
    for (int i = 0; ok && i < n_run && !accelerator; i++)
        accelerator = exec_device_name_is_accelerator(run[i]->assigned_device);
    exec_env env = {m->task ? m->task->resources : m->rm, m->client_device, m->opts.intra_op_threads};
    if (ok && !m->task && !multi && !accelerator) {   // one device: nothing to cut
        out->eg = exec_graph_new(run, n_run, feeds, n_feeds, fetches, n_fetches, &env, m->pool, st);
        free(run);
        return out->eg != NULL;
    }
    // A cluster master, or a local one with an accelerator (a GPU), is the client: feeds enter
    // and fetches leave through its CPU's partition, so values cross to other tasks and to
    // device memory only in _Send/_Recv. Several local CPUs cut without a client; fetches are read where computed.
    bool client = m->task || accelerator;
    dg_output *fetch_at = malloc(((size_t)n_fetches + 1) * sizeof *fetch_at);
    if (!fetch_at) abort();
    if (ok) {
        out->parts = client ? dg_partition_ex(run, n_run, feeds, n_feeds, fetches, n_fetches, m->client_device,
                                              m->task ? rt_new_step_id() : 1, fetch_at, st)
                            : dg_partition(run, n_run, feeds, n_feeds, 1, st);
        ok = out->parts != NULL;
    }
    free(run);
    int total = 0, n_parts = ok ? dg_partitions_count(out->parts) : 0;
    for (int p = 0; p < n_parts; p++) total += dg_graph_num_nodes(dg_partitions_graph(out->parts, p));
    dg_node **local = malloc(((size_t)total + 1) * sizeof *local);
    out->remotes = calloc((size_t)n_parts + 1, sizeof *out->remotes);
    if (!local || !out->remotes) abort();
    int k = 0;
    for (int p = 0; p < n_parts && ok; p++) {
        dg_graph *pg = dg_partitions_graph(out->parts, p);
        const char *dev = dg_partitions_device(out->parts, p);
        char task[200];
        if (!rt_task_of_device(dev, task, sizeof task)) {
            dg_status_setf(st, DG_INTERNAL, "partition device \"%s\" names no task", dev);
            ok = false;
        } else if (strcmp(task, m->own_task) == 0) {
            for (int i = 0; i < dg_graph_num_nodes(pg); i++) local[k++] = dg_graph_node(pg, i);
        } else {
            ok = register_remote(m, pg, dev, task, out, st);
        }
    }
    if (ok && !client)
        for (int i = 0; i < n_fetches; i++) {
            fetch_at[i] = fetches[i];
            dg_node *c = is_fed(feeds, n_feeds, fetches[i].node, fetches[i].index)
                             ? NULL : dg_partitions_find(out->parts, fetches[i].node);
            if (c) fetch_at[i].node = c;
        }
    if (ok) {
        out->eg = exec_graph_new(local, k, feeds, n_feeds, fetch_at, n_fetches, &env, m->pool, st);
        ok = out->eg != NULL;
    }
    free(local);
    free(fetch_at);
    return ok;
}

// Called with m->mu held; the returned entry is valid while it stays held.
static compiled *lookup_or_compile_locked(master_session *m, const dg_output *feeds, int n_feeds,
                                          const dg_output *fetches, int n_fetches, dg_node *const *targets,
                                          int n_targets, dg_status *st) {
    char *key = signature(feeds, n_feeds, fetches, n_fetches, targets, n_targets);
    if (!key) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    for (int i = 0; i < m->n_cache; i++)
        if (strcmp(m->cache[i].key, key) == 0) {
            free(key);
            return &m->cache[i];
        }
    compiled c = {key, NULL, NULL, NULL, 0};
    if (!compile(m, feeds, n_feeds, fetches, n_fetches, targets, n_targets, &c, st)) {
        free_compiled(&c, m->task ? m->task->transport : NULL);
        return NULL;
    }
    BASE_PUSH(m->cache, m->n_cache, m->cap_cache, c);
    return &m->cache[m->n_cache - 1];
}

// ---- steps across a cluster ----

// One step across the cluster: RUN_GRAPH to every remote partition, this task's partitions
// here, everyone sharing one step id. The first failure aborts the step everywhere.
typedef struct step_grace step_grace;

typedef struct step_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remaining;
    dg_status err;          // first remote error
    exec_rendezvous *rv;
    int64_t step_id;
    const remote *remotes;
    step_grace *grace;
} step_wait;

typedef struct step_call {
    step_wait *w;
    int index;
    bool traced;            // the step is traced: the answer's notes are kept here
    int64_t sent_ns, answered_ns;
    uint8_t *notes;
    size_t notes_len;
} step_call;

// Once every remote partition of a step has answered OK, every value they send this task has
// been sent; it arrives within moments. But a task can die after its answer left and before its
// pushes (another socket) did: then the values never come, and without a bound this task's
// partitions would wait forever. Two timers bound that wait: every GRACE_CHECK_MS while the step
// lasts, each remote task is sent a PING, and a PING that fails (the transport's liveness probe
// finds a dead peer within seconds) aborts the step naming the task; the grace timer (the RPC
// deadline) aborts it whatever happens.
#define GRACE_CHECK_MS 1000

struct step_grace {
    pthread_mutex_t mu;
    int refs;               // the step's, the timers' and the PINGs in flight, under mu
    bool ended;             // the step is over: the timers and PINGs do nothing
    exec_rendezvous *rv;
    int64_t step_id;
    int64_t ms;
    uint64_t timer;         // under the step_wait's mu
    uint64_t check_timer;   // under mu; 0: none armed
    int pings;              // PINGs of the current check in flight, under mu
    bool failed;            // a PING failed and aborted the step: no more checks, under mu
    rt_transport *tp;
    int n_remotes;
    char **endpoints, **tasks;   // copies: PINGs can answer after the session is gone
};

// A call's failure: the transport's (st) or the answer's own code; OK leaves err as it is.
static void answer_status(const dg_status *st, const rt_header *h, dg_status *err) {
    if (st && dg_status_code(st) != DG_OK) dg_status_copy(err, st);
    else if (h && h->code != DG_OK) dg_status_set(err, (dg_code)h->code, h->message ? h->message : "error");
}

// Frees what a call's callback was handed.
static void drop_answer(rt_header *h, dg_tensor **ts, int n) {
    if (h) {
        rt_header_clear(h);
        free(h);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
    free(ts);
}

static void grace_unref(step_grace *g) {
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    for (int r = 0; r < g->n_remotes; r++) {
        free(g->endpoints[r]);
        free(g->tasks[r]);
    }
    free(g->endpoints);
    free(g->tasks);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void grace_fire(void *arg) {
    step_grace *g = arg;
    pthread_mutex_lock(&g->mu);
    if (!g->ended) {
        dg_status why = DG_STATUS_INIT;
        dg_status_setf(&why, DG_UNAVAILABLE, "every remote partition of the step finished, but values "
                       "they sent did not arrive within %lld ms (did a task die after answering?)",
                       (long long)g->ms);
        exec_rendezvous_abort(g->rv, g->step_id, &why);
        status_impl_clear(&why);
    }
    pthread_mutex_unlock(&g->mu);
    grace_unref(g);
}

static void grace_check(void *arg);

// Arms the next check; called with g->mu held.
static void grace_arm_check_locked(step_grace *g) {
    g->refs++;
    if (!(g->check_timer = exec_timer_add(GRACE_CHECK_MS, grace_check, g))) g->refs--;
}

typedef struct grace_ping {
    step_grace *g;
    int index;
} grace_ping;

static void grace_pinged(void *arg, const dg_status *st, rt_header *h, dg_tensor **ts, int n) {
    grace_ping *gp = arg;
    step_grace *g = gp->g;
    dg_status err = DG_STATUS_INIT;
    answer_status(st, h, &err);
    pthread_mutex_lock(&g->mu);
    if (!g->ended && !g->failed && err.code != DG_OK) {
        g->failed = true;
        dg_status why = DG_STATUS_INIT;
        dg_status_setf(&why, DG_UNAVAILABLE, "task %s (%s) finished its part of the step, then stopped answering "
                       "(%s): the values it sent this task may never arrive",
                       g->tasks[gp->index], g->endpoints[gp->index], dg_status_message(&err));
        exec_rendezvous_abort(g->rv, g->step_id, &why);
        status_impl_clear(&why);
    }
    if (--g->pings == 0 && !g->ended && !g->failed) grace_arm_check_locked(g);
    pthread_mutex_unlock(&g->mu);
    status_impl_clear(&err);
    drop_answer(h, ts, n);
    free(gp);
    grace_unref(g);
}

// The step still waits for values GRACE_CHECK_MS after the last answer: PING every remote task.
// Sent under mu, so that a step that ended (and a session that closed) is never pinged for; the
// transport queues the calls and answers them on its own thread.
static void grace_check(void *arg) {
    step_grace *g = arg;
    pthread_mutex_lock(&g->mu);
    g->check_timer = 0;
    if (!g->ended) {
        g->pings = g->n_remotes;
        g->refs += g->n_remotes;
        for (int r = 0; r < g->n_remotes; r++) {
            grace_ping *gp = malloc(sizeof *gp);
            if (!gp) abort();
            *gp = (grace_ping){g, r};
            wc_ping(g->tp, g->endpoints[r], g->ms, grace_pinged, gp);
        }
    }
    pthread_mutex_unlock(&g->mu);
    grace_unref(g);
}

static void step_done(void *arg, const dg_status *st, rt_header *h, dg_tensor **ts, int n) {
    step_call *sc = arg;
    step_wait *w = sc->w;
    dg_status err = DG_STATUS_INIT;
    if (sc->traced) {
        sc->answered_ns = exec_trace_now_ns();
        if (h && h->blob) {
            sc->notes = h->blob;
            sc->notes_len = h->blob_len;
            h->blob = NULL;
            h->blob_len = 0;
        }
    }
    answer_status(st, h, &err);
    if (err.code != DG_OK) {
        const remote *r = &w->remotes[sc->index];
        dg_status_prepend(&err, "task %s (%s)", r->task, r->endpoint);
        // Stop this task's partitions from waiting for values that will not come.
        exec_rendezvous_abort(w->rv, w->step_id, &err);
    }
    pthread_mutex_lock(&w->mu);
    if (err.code != DG_OK && w->err.code == DG_OK) dg_status_copy(&w->err, &err);
    w->remaining--;
    if (w->remaining == 0 && w->err.code == DG_OK) {
        step_grace *g = w->grace;
        pthread_mutex_lock(&g->mu);
        g->refs++;
        pthread_mutex_unlock(&g->mu);
        if (!(g->timer = exec_timer_add(g->ms, grace_fire, g))) grace_unref(g);
        pthread_mutex_lock(&g->mu);
        if (g->ms > GRACE_CHECK_MS) grace_arm_check_locked(g);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    status_impl_clear(&err);
    drop_answer(h, ts, n);
}

static void abort_remotes(rt_transport *tp, const remote *remotes, int n_remotes, int64_t step_id,
                          const dg_status *why) {
    for (int r = 0; r < n_remotes; r++) wc_abort_step(tp, remotes[r].endpoint, step_id, why);
}

// Returns false (st set) when the session was cancelled: the step must not start.
static bool running_add(master_session *m, int64_t step_id, const remote *remotes, int n_remotes, dg_status *st) {
    pthread_mutex_lock(&m->run_mu);
    if (!dg_status_ok(&m->cancel)) {
        dg_status_copy(st, &m->cancel);
        pthread_mutex_unlock(&m->run_mu);
        return false;
    }
    base_reserve((void **)&m->running, sizeof *m->running, m->n_running, &m->cap_running, 1);
    m->running[m->n_running++] = (struct running_step){step_id, remotes, n_remotes};
    pthread_mutex_unlock(&m->run_mu);
    return true;
}

static void running_remove(master_session *m, int64_t step_id) {
    pthread_mutex_lock(&m->run_mu);
    for (int i = 0; i < m->n_running; i++)
        if (m->running[i].step_id == step_id) {
            m->running[i] = m->running[--m->n_running];
            break;
        }
    pthread_mutex_unlock(&m->run_mu);
}

void master_session_abort(master_session *m, const dg_status *why) {
    pthread_mutex_lock(&m->run_mu);
    if (dg_status_ok(&m->cancel)) dg_status_set(&m->cancel, dg_status_code(why), dg_status_message(why));
    for (int i = 0; i < m->n_running; i++) {
        struct running_step *r = &m->running[i];
        exec_rendezvous_abort(m->rendezvous, r->step_id, why);
        abort_remotes(m->task->transport, r->remotes, r->n_remotes, r->step_id, why);
    }
    pthread_mutex_unlock(&m->run_mu);
}

// The notes of the remote partitions of a traced step (their answers') into trace.
static void add_remote_notes(master_session *m, dg_step_trace *trace, const remote *remotes, step_call *calls,
                             int n_remotes) {
    for (int r = 0; r < n_remotes; r++) {
        dg_status bad = DG_STATUS_INIT;
        if (calls[r].notes &&
            !step_trace_add_remote(trace, calls[r].notes, calls[r].notes_len, remotes[r].task, m->own_task,
                                   "RUN_GRAPH", calls[r].sent_ns, calls[r].answered_ns, &bad))
            fprintf(stderr, "distgraph: %s\n", dg_status_message(&bad));
        status_impl_clear(&bad);
        free(calls[r].notes);
    }
}

static bool run_cluster_step(master_session *m, exec_graph *eg, const remote *remotes, int n_remotes,
                             dg_tensor *const *feed_values, dg_tensor **fetched, dg_step_trace *trace,
                             dg_status *st) {
    step_wait w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    w.remaining = n_remotes;
    w.rv = m->rendezvous;
    w.step_id = rt_new_step_id();
    w.remotes = remotes;
    step_call *calls = calloc((size_t)n_remotes + 1, sizeof *calls);
    w.grace = calloc(1, sizeof *w.grace);
    if (!calls || !w.grace) abort();
    pthread_mutex_init(&w.grace->mu, NULL);
    w.grace->refs = 1;
    w.grace->rv = w.rv;
    w.grace->step_id = w.step_id;
    w.grace->ms = m->task->rpc_timeout_ms;
    rt_transport *tp = m->task->transport;
    w.grace->tp = tp;
    w.grace->n_remotes = n_remotes;
    w.grace->endpoints = calloc((size_t)n_remotes + 1, sizeof(char *));
    w.grace->tasks = calloc((size_t)n_remotes + 1, sizeof(char *));
    if (!w.grace->endpoints || !w.grace->tasks) abort();
    for (int r = 0; r < n_remotes; r++)
        if (!(w.grace->endpoints[r] = strdup(remotes[r].endpoint)) || !(w.grace->tasks[r] = strdup(remotes[r].task)))
            abort();
    if (!running_add(m, w.step_id, remotes, n_remotes, st)) {
        pthread_mutex_destroy(&w.mu);
        pthread_cond_destroy(&w.cv);
        grace_unref(w.grace);
        free(calls);
        return false;
    }
    exec_trace *notes = trace ? exec_trace_new() : NULL;
    if (notes) exec_rendezvous_trace(w.rv, w.step_id, notes);
    int64_t t0 = trace ? exec_trace_now_ns() : 0;
    for (int r = 0; r < n_remotes; r++) {
        calls[r] = (step_call){.w = &w, .index = r, .traced = notes != NULL};
        if (notes) calls[r].sent_ns = exec_trace_now_ns();
        int parts = 0;   // this task's partitions in the step
        for (int q = 0; q < n_remotes; q++) parts += strcmp(remotes[q].task, remotes[r].task) == 0;
        wc_run_graph(tp, remotes[r].endpoint, remotes[r].handle, w.step_id, m->task->rpc_timeout_ms,
                     notes != NULL, parts, step_done, &calls[r]);
    }
    if (notes) {
        dg_trace_event e = {.kind = DG_TRACE_MASTER, .name = "dispatch", .start_ns = t0,
                            .end_ns = exec_trace_now_ns(), .thread = exec_trace_thread()};
        exec_trace_add(notes, &e);
    }
    exec_step_options o = {w.step_id, w.rv, 0, notes};
    dg_status local = DG_STATUS_INIT;
    bool ok = exec_graph_run(eg, feed_values, fetched, &o, &local);
    int64_t t_local = notes ? exec_trace_now_ns() : 0;
    if (!ok) abort_remotes(tp, remotes, n_remotes, w.step_id, &local);
    pthread_mutex_lock(&w.mu);
    while (w.remaining > 0) pthread_cond_wait(&w.cv, &w.mu);
    // The step's work ended with the local partition or the last answer, whichever came
    // later; from there to the end the master finishes (waking up included).
    int64_t t_done = t_local;
    for (int r = 0; notes && r < n_remotes; r++)
        if (calls[r].answered_ns > t_done) t_done = calls[r].answered_ns;
    uint64_t timer = w.grace->timer;
    pthread_mutex_unlock(&w.mu);
    running_remove(m, w.step_id);
    // The step is over: the grace timer must not abort it (nor a later one) any more.
    pthread_mutex_lock(&w.grace->mu);
    w.grace->ended = true;
    uint64_t check = w.grace->check_timer;
    w.grace->check_timer = 0;
    pthread_mutex_unlock(&w.grace->mu);
    if (timer && exec_timer_cancel(timer)) grace_unref(w.grace);
    if (check && exec_timer_cancel(check)) grace_unref(w.grace);
    grace_unref(w.grace);
    exec_rendezvous_end_step(w.rv, w.step_id);
    if (notes) {
        exec_rendezvous_trace(w.rv, w.step_id, NULL);
        int64_t t_end = exec_trace_now_ns();
        dg_trace_event e = {.kind = DG_TRACE_MASTER, .name = "finish", .start_ns = t_done, .end_ns = t_end,
                            .thread = exec_trace_thread()};
        exec_trace_add(notes, &e);
        step_trace_set_end(trace, t_end);
        step_trace_add_local(trace, notes, m->own_task);
        exec_trace_free(&notes);
        add_remote_notes(m, trace, remotes, calls, n_remotes);
    }
    if (w.err.code != DG_OK) {
        // The remote failure is the cause; the local one (if any) its consequence.
        if (ok)
            for (int i = 0; i < exec_graph_num_fetches(eg); i++) dg_tensor_free(&fetched[i]);
        abort_remotes(tp, remotes, n_remotes, w.step_id, &w.err);
        dg_status_copy(st, &w.err);
        ok = false;
    } else if (!ok) {
        dg_status_copy(st, &local);
    }
    status_impl_clear(&local);
    status_impl_clear(&w.err);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    free(calls);
    return ok;
}

bool master_session_run(master_session *m, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                        const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                        int n_targets, dg_step_trace *trace, dg_status *st) {
    pthread_mutex_lock(&m->mu);
    compiled *c = lookup_or_compile_locked(m, feeds, n_feeds, fetches, n_fetches, targets, n_targets, st);
    if (trace) {
        // From the step's start: the session's checks of the arguments, then the cache lookup.
        dg_trace_event e = {.kind = DG_TRACE_MASTER, .name = "check and compile", .task = m->own_task,
                            .start_ns = step_trace_origin(trace),
                            .end_ns = exec_trace_now_ns(), .thread = exec_trace_thread()};
        step_trace_add(trace, &e);
    }
    exec_graph *eg = c ? c->eg : NULL;
    bool partitioned = c && c->parts;
    remote *remotes = NULL;
    int n_remotes = c ? c->n_remotes : 0;
    if (n_remotes) {   // copied: the cache may move once the lock is released
        remotes = malloc((size_t)n_remotes * sizeof *remotes);
        if (!remotes) abort();
        memcpy(remotes, c->remotes, (size_t)n_remotes * sizeof *remotes);
    }
    pthread_mutex_unlock(&m->mu);
    if (!eg) return false;
    if (m->task) {
        bool ok = run_cluster_step(m, eg, remotes, n_remotes, feed_values, fetched, trace, st);
        free(remotes);
        return ok;
    }
    exec_trace *notes = trace ? exec_trace_new() : NULL;
    exec_step_options o = {__atomic_add_fetch(&m->next_step_id, 1, __ATOMIC_RELAXED),
                           partitioned ? m->rendezvous : NULL, 0, notes};
    bool ok = exec_graph_run(eg, feed_values, fetched, &o, st);
    if (partitioned) exec_rendezvous_end_step(m->rendezvous, o.step_id);
    if (notes) {
        step_trace_set_end(trace, exec_trace_now_ns());
        step_trace_add_local(trace, notes, m->own_task);
        exec_trace_free(&notes);
    }
    return ok;
}
