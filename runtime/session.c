/* The local session: prunes the graph to what a run needs, compiles it once per signature
 * and runs it on this process's CPU device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distgraph/device_name.h"
#include "distgraph/placer.h"
#include "distgraph/session.h"
#include "distgraph/serialize.h"
#include "exec_impl.h"
#include "timer_impl.h"
#include "graph_impl.h"
#include "server_impl.h"
#include "status_impl.h"

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

struct dg_session {
    dg_graph *graph;
    dg_session_options opts;
    exec_resources *rm;
    exec_pool *pool;
    pthread_mutex_t mu;
    compiled *cache;
    int n_cache, cap_cache;
    char **devices;          // this process's devices, canonical names
    int n_devices;
    exec_rendezvous *rendezvous;
    int64_t next_step_id;
    dg_server *server;       // cluster sessions: the master's own task; NULL for local
    bool devices_listed;     // cluster sessions: devices as the tasks reported them
    char client_device[200];
};

void exec_cpu_set_threads(int n);

dg_session_options dg_session_options_default(void) {
    dg_session_options o;
    memset(&o, 0, sizeof o);
    o.allow_soft_placement = true;
    return o;
}

dg_session *dg_session_new(dg_graph *g, const char *target, const dg_session_options *opts,
                           dg_status *st) {
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session: graph is NULL");
        return NULL;
    }
    dg_server *server = NULL;
    if (target && *target && strcmp(target, "local") != 0) {
        if (strncmp(target, "dg://", 5) != 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "session target \"%s\": expected \"local\" or "
                           "\"dg://host:port\"", target);
            return NULL;
        }
        server = rt_server_find(target);
        if (!server) {
            dg_status_setf(st, DG_UNIMPLEMENTED, "session target \"%s\": no server with that address runs "
                           "in this process (start one with dg_server_new; a session talks to the "
                           "master of a server in its own process)", target);
            return NULL;
        }
    }
    dg_session *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    s->graph = g;
    s->server = server;
    s->opts = opts ? *opts : dg_session_options_default();
    pthread_mutex_init(&s->mu, NULL);
    s->rm = exec_resources_new();
    int inter = s->opts.inter_op_threads;
    if (inter <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        inter = n > 0 ? (int)n : 1;
    }
    if (inter > 1 && !(s->pool = exec_pool_new(inter - 1, st))) {
        dg_session_free(&s);
        return NULL;
    }
    exec_cpu_set_threads(s->opts.intra_op_threads > 0 ? s->opts.intra_op_threads : 1);
    exec_gpu_set_allow_tf32(s->opts.gpu_allow_tf32);
    s->rendezvous = exec_rendezvous_new();
    if (s->opts.n_virtual_cpus < 0 || s->opts.n_virtual_cpus > 64) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "session: n_virtual_cpus must be in 0..64, got %d",
                       s->opts.n_virtual_cpus);
        dg_session_free(&s);
        return NULL;
    }
    if (server) {
        int n = dg_cluster_devices(rt_server_cluster(server), 0, &s->devices, st);
        if (n < 0) {
            dg_session_free(&s);
            return NULL;
        }
        s->n_devices = n;
        snprintf(s->client_device, sizeof s->client_device, "%s/device:CPU:0", dg_server_task_name(server));
        exec_cpu_set_threads(s->opts.intra_op_threads > 0 ? s->opts.intra_op_threads : 1);
        return s;
    }
    int n_gpus = exec_gpu_count();
    s->devices = calloc((size_t)(1 + s->opts.n_virtual_cpus + n_gpus), sizeof *s->devices);
    for (int i = 0; s->devices && i < 1 + s->opts.n_virtual_cpus + n_gpus; i++) {
        bool gpu = i > s->opts.n_virtual_cpus;
        if (asprintf(&s->devices[i], "/job:localhost/replica:0/task:0/device:%s:%d", gpu ? "GPU" : "CPU",
                     gpu ? i - 1 - s->opts.n_virtual_cpus : i) < 0)
            abort();
        s->n_devices++;
    }
    if (!s->rm || !s->rendezvous || !s->devices) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        dg_session_free(&s);
        return NULL;
    }
    return s;
}

void dg_session_free(dg_session **sp) {
    if (!sp || !*sp) return;
    dg_session *s = *sp;
    for (int i = 0; i < s->n_cache; i++) {
        compiled *c = &s->cache[i];
        for (int r = 0; r < c->n_remotes; r++) {
            // Best effort and without waiting: a task that is gone must not delay the close.
            rt_header *h = malloc(sizeof *h);
            if (!h) abort();
            rt_header_init(h, RT_DEREGISTER_GRAPH);
            h->handle = c->remotes[r].handle;
            rt_push(rt_server_transport(s->server), c->remotes[r].endpoint, h, NULL, 0);
            free(c->remotes[r].task);
            free(c->remotes[r].endpoint);
        }
        free(c->remotes);
        free(c->key);
        exec_graph_free(&c->eg);
        dg_partitions_free(&c->parts);
    }
    free(s->cache);
    for (int i = 0; i < s->n_devices; i++) free(s->devices[i]);
    free(s->devices);
    // The pool first: a pool task may still flush the rendezvous after its step has finished.
    exec_pool_free(&s->pool);
    exec_rendezvous_free(&s->rendezvous);
    exec_resources_free(&s->rm);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *sp = NULL;
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

// Nodes needed for the fetches and targets, stopping at fed outputs.
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
    while (top > 0) {
        dg_node *n = stack[--top];
        for (int k = 0; k < n->n_inputs; k++) {
            dg_output in = n->inputs[k];
            if (is_fed(feeds, n_feeds, in.node, in.index) || seen[in.node->id]) continue;
            seen[in.node->id] = 1;
            stack[top++] = in.node;
        }
        for (int k = 0; k < n->n_ctrl; k++)
            if (!seen[n->ctrl_inputs[k]->id]) {
                seen[n->ctrl_inputs[k]->id] = 1;
                stack[top++] = n->ctrl_inputs[k];
            }
    }
    int k = 0;
    for (int i = 0; i < n_nodes; i++)
        if (seen[i]) stack[k++] = dg_graph_node(g, i);
    free(seen);
    *n_out = k;
    return stack;
}

static bool check_args(dg_session *s, const dg_output *feeds, dg_tensor *const *feed_values,
                       int n_feeds, const dg_output *fetches, int n_fetches,
                       dg_node *const *targets, int n_targets, dg_status *st) {
    if (!dg_graph_check(s->graph, st)) {
        dg_status_prepend(st, "the graph has an error from building it");
        return false;
    }
    char a[128], b[128];
    for (int i = 0; i < n_feeds; i++) {
        dg_output o = feeds[i];
        if (!o.node || o.node->graph != s->graph || o.index < 0 || o.index >= o.node->n_outputs) {
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
        if (!o.node || o.node->graph != s->graph || o.index < 0 || o.index >= o.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "fetch %d is not an output of this session's graph "
                           "(a null output from a failed builder call?)", i);
            return false;
        }
    }
    for (int i = 0; i < n_targets; i++)
        if (!targets[i] || targets[i]->graph != s->graph) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "target %d is not a node of this session's graph", i);
            return false;
        }
    return true;
}

// Places the pruned nodes on this process's devices; when they span several devices,
// partitions them (Send/Recv through the session's rendezvous) and compiles all partitions
// into one executable.
static bool compile(dg_session *s, dg_node **run, int n_run, const dg_output *feeds, int n_feeds,
                    const dg_output *fetches, int n_fetches, compiled *out, dg_status *st) {
    dg_placement_options po = dg_placement_options_default();
    po.allow_soft_placement = s->opts.allow_soft_placement;
    po.supports = exec_kernel_supports;
    if (!dg_place(run, n_run, (const char *const *)s->devices, s->n_devices, &po, st)) return false;
    if (s->opts.log_device_placement)
        for (int i = 0; i < n_run; i++)
            fprintf(stderr, "%s: (%s): %s\n", run[i]->name, run[i]->op->name, run[i]->assigned_device);
    bool multi = false, gpu = false;
    for (int i = 1; i < n_run && !multi; i++)
        multi = strcmp(run[i]->assigned_device, run[0]->assigned_device) != 0;
    for (int i = 0; i < n_run && !gpu; i++) gpu = strstr(run[i]->assigned_device, "/device:GPU:") != NULL;
    exec_env env = {s->rm, s->devices[0], s->opts.intra_op_threads};
    if (!multi && !gpu) {
        out->eg = exec_graph_new(run, n_run, feeds, n_feeds, fetches, n_fetches, &env, s->pool, st);
        return out->eg != NULL;
    }
    // With GPUs the CPU is the client: feeds enter and fetches leave through its partition,
    // so values cross to and from device memory only in _Send/_Recv.
    dg_output *fetch_at = NULL;
    if (gpu) {
        fetch_at = malloc(((size_t)n_fetches + 1) * sizeof *fetch_at);
        if (!fetch_at) abort();
        out->parts = dg_partition_ex(run, n_run, feeds, n_feeds, fetches, n_fetches, s->devices[0], 1,
                                     fetch_at, st);
    } else {
        out->parts = dg_partition(run, n_run, feeds, n_feeds, 1, st);
    }
    if (!out->parts) {
        free(fetch_at);
        return false;
    }
    int total = 0;
    for (int p = 0; p < dg_partitions_count(out->parts); p++)
        total += dg_graph_num_nodes(dg_partitions_graph(out->parts, p));
    dg_node **all = malloc(((size_t)total + 1) * sizeof *all);
    dg_output *pf = malloc(((size_t)n_fetches + 1) * sizeof *pf);
    if (!all || !pf) abort();
    int k = 0;
    for (int p = 0; p < dg_partitions_count(out->parts); p++) {
        dg_graph *pg = dg_partitions_graph(out->parts, p);
        for (int i = 0; i < dg_graph_num_nodes(pg); i++) all[k++] = dg_graph_node(pg, i);
    }
    for (int i = 0; i < n_fetches; i++) {
        pf[i] = fetch_at ? fetch_at[i] : fetches[i];
        if (fetch_at) continue;
        dg_node *c = is_fed(feeds, n_feeds, fetches[i].node, fetches[i].index)
                         ? NULL : dg_partitions_find(out->parts, fetches[i].node);
        if (c) pf[i].node = c;
    }
    free(fetch_at);
    out->eg = exec_graph_new(all, k, feeds, n_feeds, pf, n_fetches, &env, s->pool, st);
    free(all);
    free(pf);
    return out->eg != NULL;
}

// The devices of every task as the tasks report them (LIST_DEVICES): a task's GPUs count only
// where it has them. Asked once, on the first compile that needs a GPU; until then (and for
// graphs that request no GPU) the cluster's CPUs are the devices, which needs no peer.
static bool list_cluster_devices(dg_session *s, dg_status *st) {
    char **list = NULL;
    int n = 0, cap = 0;
    bool ok = true;
    for (int i = 0; i < s->n_devices && ok; i++) {
        char task[200];
        // The CPU-only list has one device per task, its CPU:0.
        if (!rt_task_of_device(s->devices[i], task, sizeof task)) continue;
        rt_header *resp = NULL;
        if (strcmp(task, dg_server_task_name(s->server)) == 0) {
            resp = calloc(1, sizeof *resp);
            if (!resp) abort();
            rt_header_init(resp, RT_RESPONSE);
            rt_server_add_devices(s->server, resp);
        } else {
            char *ep = rt_server_task_endpoint(s->server, s->devices[i], st);
            rt_header *h = ep ? malloc(sizeof *h) : NULL;
            if (h) rt_header_init(h, RT_LIST_DEVICES);
            ok = h && rt_call_sync(rt_server_transport(s->server), ep, h, NULL, 0,
                                   rt_server_timeout_ms(s->server), &resp, NULL, NULL, st);
            if (!ok) dg_status_prepend(st, "listing the devices of %s (%s)", task, ep ? ep : "?");
            free(ep);
        }
        for (int k = 0; ok && k < resp->n_names; k++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                list = realloc(list, (size_t)cap * sizeof *list);
                if (!list) abort();
            }
            if (!(list[n++] = strdup(resp->names[k]))) abort();
        }
        if (resp) {
            rt_header_clear(resp);
            free(resp);
        }
    }
    if (!ok) {
        dg_device_list_free(list, n);
        return false;
    }
    dg_device_list_free(s->devices, s->n_devices);
    s->devices = list;
    s->n_devices = n;
    s->devices_listed = true;
    return true;
}

// True when some node asks for a GPU.
static bool wants_gpu(dg_node *const *run, int n_run) {
    for (int i = 0; i < n_run; i++) {
        const char *r = run[i]->requested_device;
        if (r && (strstr(r, "GPU") || strstr(r, "gpu"))) return true;
    }
    return false;
}

// Cluster sessions: place over every task, partition with this task as the client, run this
// task's partitions here and register the others with their tasks.
static bool compile_cluster(dg_session *s, dg_node **run, int n_run, const dg_output *feeds, int n_feeds,
                            const dg_output *fetches, int n_fetches, compiled *out, dg_status *st) {
    dg_placement_options po = dg_placement_options_default();
    po.allow_soft_placement = s->opts.allow_soft_placement;
    po.supports = exec_kernel_supports;
    po.default_device = dg_server_task_name(s->server);
    if (!s->devices_listed && wants_gpu(run, n_run) && !list_cluster_devices(s, st)) return false;
    if (!dg_place(run, n_run, (const char *const *)s->devices, s->n_devices, &po, st)) return false;
    if (s->opts.log_device_placement)
        for (int i = 0; i < n_run; i++)
            fprintf(stderr, "%s: (%s): %s\n", run[i]->name, run[i]->op->name, run[i]->assigned_device);
    dg_output *fetch_at = malloc(((size_t)n_fetches + 1) * sizeof *fetch_at);
    if (!fetch_at) abort();
    out->parts = dg_partition_ex(run, n_run, feeds, n_feeds, fetches, n_fetches, s->client_device,
                                 rt_new_step_id(), fetch_at, st);
    if (!out->parts) {
        free(fetch_at);
        return false;
    }
    const char *own = dg_server_task_name(s->server);
    int total = 0, n_parts = dg_partitions_count(out->parts);
    for (int p = 0; p < n_parts; p++) total += dg_graph_num_nodes(dg_partitions_graph(out->parts, p));
    dg_node **local = malloc(((size_t)total + 1) * sizeof *local);
    out->remotes = calloc((size_t)n_parts + 1, sizeof *out->remotes);
    if (!local || !out->remotes) abort();
    int k = 0;
    bool ok = true;
    for (int p = 0; p < n_parts && ok; p++) {
        dg_graph *pg = dg_partitions_graph(out->parts, p);
        const char *dev = dg_partitions_device(out->parts, p);
        char task[200];
        if (!rt_task_of_device(dev, task, sizeof task)) {
            dg_status_setf(st, DG_INTERNAL, "partition device \"%s\" names no task", dev);
            ok = false;
            break;
        }
        if (strcmp(task, own) == 0) {
            for (int i = 0; i < dg_graph_num_nodes(pg); i++) local[k++] = dg_graph_node(pg, i);
            continue;
        }
        char *buf = NULL;
        size_t len = 0;
        char *ep = rt_server_task_endpoint(s->server, dev, st);
        ok = ep && dg_graph_to_msgpack(pg, &buf, &len, st);
        if (ok) {
            rt_header *h = malloc(sizeof *h);
            if (!h) abort();
            rt_header_init(h, RT_REGISTER_GRAPH);
            rt_header_set_blob(h, buf, len);
            rt_header *resp = NULL;
            ok = rt_call_sync(rt_server_transport(s->server), ep, h, NULL, 0, rt_server_timeout_ms(s->server),
                              &resp, NULL, NULL, st);
            if (ok) {
                remote *r = &out->remotes[out->n_remotes++];
                r->task = strdup(task);
                r->endpoint = ep;
                r->handle = resp->handle;
                ep = NULL;
                rt_header_clear(resp);
                free(resp);
            } else {
                dg_status_prepend(st, "registering the partition of %s with task %s (%s)", dev, task, ep);
            }
        }
        free(ep);
        free(buf);
    }
    if (ok) {
        exec_env env = {rt_server_resources(s->server), s->client_device, s->opts.intra_op_threads};
        out->eg = exec_graph_new(local, k, feeds, n_feeds, fetch_at, n_fetches, &env, s->pool, st);
        ok = out->eg != NULL;
    }
    free(local);
    free(fetch_at);
    return ok;
}

// Called with s->mu held; the returned entry is valid while it stays held.
static compiled *lookup_or_compile_locked(dg_session *s, const dg_output *feeds, int n_feeds,
                                   const dg_output *fetches, int n_fetches,
                                   dg_node *const *targets, int n_targets, dg_status *st) {
    char *key = signature(feeds, n_feeds, fetches, n_fetches, targets, n_targets);
    if (!key) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    for (int i = 0; i < s->n_cache; i++)
        if (strcmp(s->cache[i].key, key) == 0) {
            free(key);
            return &s->cache[i];
        }
    int n_run;
    dg_node **run = prune(s->graph, feeds, n_feeds, fetches, n_fetches, targets, n_targets, &n_run);
    compiled c = {key, NULL, NULL, NULL, 0};
    bool ok = s->server ? compile_cluster(s, run, n_run, feeds, n_feeds, fetches, n_fetches, &c, st)
                        : compile(s, run, n_run, feeds, n_feeds, fetches, n_fetches, &c, st);
    free(run);
    compiled *res = NULL;
    if (ok) {
        if (s->n_cache == s->cap_cache) {
            s->cap_cache = s->cap_cache ? s->cap_cache * 2 : 8;
            compiled *nc = realloc(s->cache, (size_t)s->cap_cache * sizeof *nc);
            if (!nc) abort();
            s->cache = nc;
        }
        s->cache[s->n_cache] = c;
        res = &s->cache[s->n_cache++];
    } else {
        for (int r = 0; r < c.n_remotes; r++) {
            free(c.remotes[r].task);
            free(c.remotes[r].endpoint);
        }
        free(c.remotes);
        free(c.key);
        exec_graph_free(&c.eg);
        dg_partitions_free(&c.parts);
    }
    return res;
}

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
} step_call;

// Once every remote partition of a step has answered OK, every value they send this task has
// been sent; it arrives within moments. But a task can die after its answer left and before its
// pushes (another socket) did: then the values never come, and without a bound this task's
// partitions would wait forever. The grace timer bounds that wait.
struct step_grace {
    pthread_mutex_t mu;
    int refs;               // the step's and the timer's, under mu
    bool ended;             // the step is over: the timer does nothing
    exec_rendezvous *rv;
    int64_t step_id;
    int64_t ms;
    uint64_t timer;         // under the step_wait's mu
};

static void grace_unref(step_grace *g) {
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
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

static void step_done(void *arg, const dg_status *st, rt_header *h, dg_tensor **ts, int n) {
    step_call *sc = arg;
    step_wait *w = sc->w;
    dg_status err = DG_STATUS_INIT;
    if (st && dg_status_code(st) != DG_OK) dg_status_copy(&err, st);
    else if (h && h->code != DG_OK) dg_status_set(&err, (dg_code)h->code, h->message ? h->message : "error");
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
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    status_impl_clear(&err);
    if (h) {
        rt_header_clear(h);
        free(h);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
    free(ts);
}

static bool run_cluster_step(dg_session *s, exec_graph *eg, const remote *remotes, int n_remotes,
                             dg_tensor *const *feed_values, dg_tensor **fetched, dg_status *st) {
    step_wait w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    w.remaining = n_remotes;
    w.rv = rt_server_rendezvous(s->server);
    w.step_id = rt_new_step_id();
    w.remotes = remotes;
    step_call *calls = calloc((size_t)n_remotes + 1, sizeof *calls);
    w.grace = calloc(1, sizeof *w.grace);
    if (!calls || !w.grace) abort();
    pthread_mutex_init(&w.grace->mu, NULL);
    w.grace->refs = 1;
    w.grace->rv = w.rv;
    w.grace->step_id = w.step_id;
    w.grace->ms = rt_server_timeout_ms(s->server);
    rt_transport *tp = rt_server_transport(s->server);
    for (int r = 0; r < n_remotes; r++) {
        calls[r] = (step_call){&w, r};
        rt_header *h = malloc(sizeof *h);
        if (!h) abort();
        rt_header_init(h, RT_RUN_GRAPH);
        h->handle = remotes[r].handle;
        h->step_id = w.step_id;
        rt_call(tp, remotes[r].endpoint, h, NULL, 0, rt_server_timeout_ms(s->server), step_done, &calls[r]);
    }
    exec_step_options o = {w.step_id, w.rv, 0};
    dg_status local = DG_STATUS_INIT;
    bool ok = exec_graph_run(eg, feed_values, fetched, &o, &local);
    if (!ok)
        for (int r = 0; r < n_remotes; r++) rt_server_abort_remote(s->server, remotes[r].endpoint, w.step_id, &local);
    pthread_mutex_lock(&w.mu);
    while (w.remaining > 0) pthread_cond_wait(&w.cv, &w.mu);
    uint64_t timer = w.grace->timer;
    pthread_mutex_unlock(&w.mu);
    // The step is over: the grace timer must not abort it (nor a later one) any more.
    pthread_mutex_lock(&w.grace->mu);
    w.grace->ended = true;
    pthread_mutex_unlock(&w.grace->mu);
    if (timer && exec_timer_cancel(timer)) grace_unref(w.grace);
    grace_unref(w.grace);
    exec_rendezvous_end_step(w.rv, w.step_id);
    if (w.err.code != DG_OK) {
        // The remote failure is the cause; the local one (if any) its consequence.
        if (ok)
            for (int i = 0; i < exec_graph_num_fetches(eg); i++) dg_tensor_free(&fetched[i]);
        for (int r = 0; r < n_remotes; r++) rt_server_abort_remote(s->server, remotes[r].endpoint, w.step_id, &w.err);
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

bool dg_session_run(dg_session *s, const dg_output *feeds, dg_tensor *const *feed_values,
                    int n_feeds, const dg_output *fetches, dg_tensor **fetched, int n_fetches,
                    dg_node *const *targets, int n_targets, dg_status *st) {
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session is NULL");
        return false;
    }
    if (n_feeds < 0 || n_fetches < 0 || n_targets < 0 || (n_feeds && (!feeds || !feed_values)) ||
        (n_fetches && (!fetches || !fetched)) || (n_targets && !targets)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session run: a count is negative or an array is NULL");
        return false;
    }
    if (!check_args(s, feeds, feed_values, n_feeds, fetches, n_fetches, targets, n_targets, st))
        return false;
    pthread_mutex_lock(&s->mu);
    compiled *c = lookup_or_compile_locked(s, feeds, n_feeds, fetches, n_fetches, targets, n_targets, st);
    exec_graph *eg = c ? c->eg : NULL;
    bool partitioned = c && c->parts;
    remote *remotes = NULL;
    int n_remotes = c ? c->n_remotes : 0;
    if (n_remotes) {   // copied: the cache may move once the lock is released
        remotes = malloc((size_t)n_remotes * sizeof *remotes);
        if (!remotes) abort();
        memcpy(remotes, c->remotes, (size_t)n_remotes * sizeof *remotes);
    }
    pthread_mutex_unlock(&s->mu);
    if (!eg) return false;
    if (s->server) {
        bool ok = run_cluster_step(s, eg, remotes, n_remotes, feed_values, fetched, st);
        free(remotes);
        return ok;
    }
    exec_step_options o = {__atomic_add_fetch(&s->next_step_id, 1, __ATOMIC_RELAXED),
                           partitioned ? s->rendezvous : NULL, 0};
    bool ok = exec_graph_run(eg, feed_values, fetched, &o, st);
    if (partitioned) exec_rendezvous_end_step(s->rendezvous, o.step_id);
    return ok;
}

bool dg_session_run_target(dg_session *s, dg_node *target, dg_status *st) {
    if (!target) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "run_target: target is NULL (did building it fail?)");
        return false;
    }
    return dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &target, 1, st);
}
