/* The executor: runs one device's subgraph for a step.
 * Compiled once per (graph, feeds, fetches): dependency counts, successor lists, value slots
 * and kernels. A step copies the counts, runs ready nodes on the caller's thread and, when a
 * pool is given, hands extra expensive ready nodes to it (TensorFlow's "inline the last ready
 * node" policy). Step bookkeeping is allocated once and reused; output buffers are kept
 * between steps and reused when nobody else holds them. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "device.h"
#include "distgraph/device_name.h"
#include "exec_executor_impl.h"
#include "exec_fp_impl.h"
#include "exec_fusion_impl.h"
#include "exec_kernel_registry_impl.h"
#include "exec_pool_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_trace_impl.h"
#include "graph_impl.h"
#include "ptrmap_impl.h"
#include "status_impl.h"

// A graph whose outputs hold more elements than this is not light (exec_graph_is_light).
#define EXEC_LIGHT_MAX_ELEMENTS ((int64_t)1 << 20)

typedef struct exec_node {
    dg_node *node;
    const exec_kernel_def *def;
    void *state;
    int n_in, in_off;       // input_slots[in_off ...]
    int n_out, out_off;     // value slots
    int n_succ, succ_off;   // succ[succ_off ...], unique successors
    int pending0;           // unique predecessors
    bool urgent;            // a _Send: run before the other ready nodes, so that the tensor leaves
                            // while this task goes on (a pipeline stage's next micro-batch)
} exec_node;

struct exec_graph {
    exec_node *nodes;
    int n;
    int *input_slots;
    int *uses0;         // per value slot: the inputs that read it (a fetched one: never released)
    int *succ;
    int n_values;       // produced outputs, then feeds
    int feed_base, n_feeds;
    int *fetch_slots;
    bool *fetch_copy;
    int n_fetches;
    int *roots;
    int n_roots;
    exec_pool *pool;    // borrowed, may be NULL
    exec_pool *completion_pool;   // borrowed, may be NULL: where async completions continue
                                  // when pool is NULL (exec_graph_set_completion_pool)
    bool light;         // no expensive (or blocking) kernel
    exec_env env;
    char *device;       // owned copy of env.device
    exec_fused fused;   // the node list run, with the fused nodes it owns
    _Atomic(exec_step *) idle;   // one cached step state
};

struct exec_step {
    exec_graph *eg;
    atomic_int *pending;
    atomic_int *uses;       // per value slot: readers still to run this step
    dg_tensor **values;
    bool *owned;
    dg_tensor **inbuf;
    int *ready;             // the caller's stack of ready nodes
    int *inbox;             // nodes made ready by async completions, under mu
    int n_inbox;
    bool runner_active;     // under mu: a thread runs this started step's nodes (async_run)
    atomic_bool caller_idle;   // exec_graph_run's caller waits on cv with an empty inbox
    atomic_int remaining;
    atomic_bool aborted;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    dg_status status;       // first error, under mu
    exec_step_options opts;
    // Started with exec_graph_start: nobody waits; the thread finishing the last node (or
    // releasing the last runner token, see async_run) calls done_fn.
    bool async;
    exec_done_fn done_fn;
    void *done_arg;
    int64_t *trace_t0;      // traced steps: when each async node started, or when a node was
                            // handed to the pool (allocated when a traced step begins)
    int64_t inbox_ns;       // traced steps: when the inbox last became non-empty, under mu
};

const exec_step_options *exec_step_opts(const exec_step *s) { return &s->opts; }
int exec_graph_num_nodes(const exec_graph *eg) { return eg->n; }
void exec_graph_set_completion_pool(exec_graph *eg, exec_pool *pool) { eg->completion_pool = pool; }

bool exec_graph_is_light(const exec_graph *eg) { return eg->light; }
int exec_graph_num_fetches(const exec_graph *eg) { return eg->n_fetches; }

// ---- compile ----

static void free_nodes(exec_graph *eg) {
    for (int i = 0; i < eg->n; i++)
        if (eg->nodes[i].def && eg->nodes[i].def->destroy && eg->nodes[i].state)
            eg->nodes[i].def->destroy(eg->nodes[i].state);
}

static void step_free(exec_step *s);

void exec_graph_free(exec_graph **egp) {
    if (!egp || !*egp) return;
    exec_graph *eg = *egp;
    step_free(atomic_exchange(&eg->idle, NULL));
    if (eg->nodes) free_nodes(eg);
    exec_fused_free(&eg->fused);
    free(eg->nodes);
    free(eg->input_slots);
    free(eg->uses0);
    free(eg->succ);
    free(eg->fetch_slots);
    free(eg->fetch_copy);
    free(eg->roots);
    free(eg->device);
    free(eg);
    *egp = NULL;
}

static int feed_index(const dg_output *feeds, int n_feeds, dg_output o) {
    for (int f = 0; f < n_feeds; f++)
        if (feeds[f].node == o.node && feeds[f].index == o.index) return f;
    return -1;
}

exec_graph *exec_graph_new(dg_node *const *nodes, int n_nodes, const dg_output *feeds, int n_feeds,
                           const dg_output *fetches, int n_fetches, const exec_env *env,
                           exec_pool *pool, dg_status *st) {
    exec_graph *eg = calloc(1, sizeof *eg);
    if (!eg) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "executor: out of memory");
        return NULL;
    }
    eg->env = *env;
    eg->device = strdup(env->device ? env->device : "");
    eg->env.device = eg->device;
    eg->pool = exec_pool_size(pool) > 0 ? pool : NULL;
    eg->n_feeds = n_feeds;
    eg->n_fetches = n_fetches;
    char dev_type[DG_DEVICE_TYPE_MAX] = DG_DEVICE_TYPE_CPU;
    {
        dg_device_name dn;
        dg_status tmp = DG_STATUS_INIT;
        if (dg_device_name_parse(eg->device, &dn, &tmp) && dn.has_type)
            snprintf(dev_type, sizeof dev_type, "%s", dn.type);
        status_impl_clear(&tmp);
    }
    if (!eg->device || !exec_fuse(nodes, n_nodes, feeds, n_feeds, fetches, n_fetches, dev_type, &eg->fused)) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "executor: out of memory");
        exec_graph_free(&eg);
        return NULL;
    }
    nodes = eg->fused.nodes;
    n_nodes = eg->fused.n;
    eg->n = n_nodes;
    int total_in = 0, total_out = 0;
    for (int i = 0; i < n_nodes; i++) {
        total_in += nodes[i]->n_inputs;
        total_out += nodes[i]->n_outputs;
    }
    ptrmap index = {0};
    bool index_ok = ptrmap_init(&index, n_nodes);
    int *stamp = malloc((size_t)(n_nodes + 1) * sizeof *stamp);
    int *pred_count = calloc((size_t)n_nodes + 1, sizeof *pred_count);
    eg->nodes = calloc((size_t)n_nodes + 1, sizeof *eg->nodes);
    eg->input_slots = malloc((size_t)(total_in + 1) * sizeof *eg->input_slots);
    eg->fetch_slots = malloc((size_t)(n_fetches + 1) * sizeof *eg->fetch_slots);
    eg->fetch_copy = calloc((size_t)n_fetches + 1, sizeof *eg->fetch_copy);
    if (!index_ok || !stamp || !pred_count || !eg->nodes || !eg->input_slots || !eg->fetch_slots ||
        !eg->fetch_copy) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "executor: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_nodes; i++) ptrmap_put(&index, nodes[i], i);
    // Readers of a fused chain's last node read the node standing for the chain.
    for (int m = 0; m < eg->fused.n_made; m++)
        ptrmap_put(&index, eg->fused.stands_for[m], ptrmap_get(&index, eg->fused.made[m]));
    eg->feed_base = total_out;
    eg->n_values = total_out + n_feeds;
    int in_off = 0, out_off = 0;
    for (int i = 0; i < n_nodes; i++) {
        exec_node *en = &eg->nodes[i];
        dg_node *nd = nodes[i];
        en->node = nd;
        en->n_in = nd->n_inputs;
        en->in_off = in_off;
        en->n_out = nd->n_outputs;
        en->out_off = out_off;
        out_off += nd->n_outputs;
        for (int k = 0; k < nd->n_inputs; k++) {
            dg_output src = nd->inputs[k];
            int f = feed_index(feeds, n_feeds, src);
            if (f >= 0) {
                eg->input_slots[in_off++] = eg->feed_base + f;
                continue;
            }
            int src_i = ptrmap_get(&index, src.node);
            if (src_i < 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "node \"%s\" (%s): input %d comes from \"%s\", which is neither run "
                               "nor fed", nd->name, nd->op->name, k, src.node->name);
                goto fail;
            }
            eg->input_slots[in_off++] = -1 - src_i;   // resolved below
        }
    }
    // Producer output slots are known now.
    for (int i = 0; i < n_nodes; i++) {
        exec_node *en = &eg->nodes[i];
        for (int k = 0; k < en->n_in; k++) {
            int *s = &eg->input_slots[en->in_off + k];
            if (*s < 0) *s = eg->nodes[-1 - *s].out_off + en->node->inputs[k].index;
        }
    }
    // Unique predecessor -> successor edges from data and control inputs.
    int n_edges = 0;
    for (int i = 0; i < n_nodes; i++) stamp[i] = -1;
    int cap_src = total_in + 16, cap_dst = cap_src;   // one per array, for base_reserve
    int *edge_src = malloc((size_t)cap_src * sizeof *edge_src);
    int *edge_dst = malloc((size_t)cap_dst * sizeof *edge_dst);
    if (!edge_src || !edge_dst) {
        free(edge_src);
        free(edge_dst);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "executor: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_nodes; i++) {
        dg_node *nd = nodes[i];
        int n_preds = nd->n_inputs + nd->n_ctrl;
        for (int k = 0; k < n_preds; k++) {
            dg_node *p;
            if (k < nd->n_inputs) {
                if (feed_index(feeds, n_feeds, nd->inputs[k]) >= 0) continue;
                p = nd->inputs[k].node;
            } else {
                p = nd->ctrl_inputs[k - nd->n_inputs];
            }
            int pi = ptrmap_get(&index, p);
            if (pi < 0) continue;   // a control input outside the run set
            if (stamp[pi] == i) continue;
            stamp[pi] = i;
            base_reserve((void **)&edge_src, sizeof *edge_src, n_edges, &cap_src, 1);
            base_reserve((void **)&edge_dst, sizeof *edge_dst, n_edges, &cap_dst, 1);
            edge_src[n_edges] = pi;
            edge_dst[n_edges] = i;
            n_edges++;
            eg->nodes[pi].n_succ++;
            eg->nodes[i].pending0++;
        }
    }
    eg->succ = malloc((size_t)(n_edges + 1) * sizeof *eg->succ);
    if (!eg->succ) abort();
    int off = 0;
    for (int i = 0; i < n_nodes; i++) {
        eg->nodes[i].succ_off = off;
        off += eg->nodes[i].n_succ;
        pred_count[i] = 0;
    }
    for (int e = 0; e < n_edges; e++) {
        exec_node *p = &eg->nodes[edge_src[e]];
        eg->succ[p->succ_off + pred_count[edge_src[e]]++] = edge_dst[e];
    }
    free(edge_src);
    free(edge_dst);
    // Roots, and a dry run of the schedule to find cycles before any step runs.
    eg->roots = malloc((size_t)(n_nodes + 1) * sizeof *eg->roots);
    if (!eg->roots) abort();
    for (int i = 0; i < n_nodes; i++) {
        pred_count[i] = eg->nodes[i].pending0;
        if (pred_count[i] == 0) eg->roots[eg->n_roots++] = i;
    }
    {
        int *q = stamp, head = 0, tail = 0;
        for (int r = 0; r < eg->n_roots; r++) q[tail++] = eg->roots[r];
        while (head < tail) {
            exec_node *en = &eg->nodes[q[head++]];
            for (int s = 0; s < en->n_succ; s++)
                if (--pred_count[eg->succ[en->succ_off + s]] == 0) q[tail++] = eg->succ[en->succ_off + s];
        }
        if (tail < n_nodes) {
            for (int i = 0; i < n_nodes; i++)
                if (pred_count[i] > 0) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "the graph has a cycle: node \"%s\" (%s) depends on itself "
                                   "through its inputs or control dependencies",
                                   nodes[i]->name, nodes[i]->op->name);
                    break;
                }
            goto fail;
        }
    }
    // Kernels, created once, for each node's own device.
    for (int i = 0; i < n_nodes; i++) {
        exec_node *en = &eg->nodes[i];
        dg_dtype t = exec_kernel_dtype(en->node);
        char node_type[DG_DEVICE_TYPE_MAX];
        exec_env node_env = eg->env;
        snprintf(node_type, sizeof node_type, "%s", dev_type);
        if (en->node->assigned_device && en->node->assigned_device[0]) {
            dg_device_name dn;
            dg_status tmp = DG_STATUS_INIT;
            if (dg_device_name_parse(en->node->assigned_device, &dn, &tmp) && dn.has_type)
                snprintf(node_type, sizeof node_type, "%s", dn.type);
            status_impl_clear(&tmp);
            node_env.device = en->node->assigned_device;
        }
        en->def = exec_kernel_find(en->node->op->name, node_type, t);
        en->urgent = strcmp(en->node->op->name, "_Send") == 0;
        if (!en->def) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "node \"%s\" (%s): no %s kernel for dtype %s",
                           en->node->name, en->node->op->name, node_type, dg_dtype_name(t));
            goto fail;
        }
        en->state = en->def->create ? en->def->create(en->node, &node_env, st) : (void *)1;
        if (!en->state) {
            dg_status_prepend(st, "node \"%s\" (%s)", en->node->name, en->node->op->name);
            goto fail;
        }
    }
    // Light: no expensive kernel and little data (by the static shapes; unknown dims count
    // as 1), so that running it on an I/O thread holds that thread for microseconds, not for
    // an update of a big variable.
    eg->light = true;
    int64_t elements = 0;
    for (int i = 0; i < n_nodes; i++) {
        const dg_node *nd = eg->nodes[i].node;
        // Kernels of a device with memory of its own wait for it in _Send: never on an I/O
        // thread.
        const exec_device_type *type = exec_device_type_find(eg->nodes[i].def->device_type);
        if (eg->nodes[i].def->expensive || !type || !type->host_memory) eg->light = false;
        for (int o = 0; o < nd->n_outputs; o++) {
            const dg_shape *sh = &nd->out_shapes[o];
            int64_t e = 1;
            for (int d = 0; d < sh->rank; d++) e *= sh->dims[d] > 0 ? sh->dims[d] : 1;
            elements += e;
        }
    }
    if (elements > EXEC_LIGHT_MAX_ELEMENTS) eg->light = false;
    for (int i = 0; i < n_fetches; i++) {
        dg_output o = fetches[i];
        int f = feed_index(feeds, n_feeds, o);
        if (f >= 0) {
            eg->fetch_slots[i] = eg->feed_base + f;
            continue;
        }
        int ni = o.node ? ptrmap_get(&index, o.node) : -1;
        if (ni < 0 || o.index < 0 || o.index >= o.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "fetch %d (\"%s\") is not computed by this graph",
                           i, o.node ? o.node->name : "<null>");
            goto fail;
        }
        eg->fetch_slots[i] = eg->nodes[ni].out_off + o.index;
        eg->fetch_copy[i] = eg->nodes[ni].def->output_is_ref;
    }
    // How many inputs read each value: a step releases a large one after its last reader.
    eg->uses0 = calloc((size_t)eg->n_values + 1, sizeof *eg->uses0);
    if (!eg->uses0) abort();
    for (int i = 0; i < eg->n; i++)
        for (int k = 0; k < eg->nodes[i].n_in; k++) eg->uses0[eg->input_slots[eg->nodes[i].in_off + k]]++;
    for (int i = 0; i < eg->n_fetches; i++) eg->uses0[eg->fetch_slots[i]] = INT_MAX / 2;
    ptrmap_free(&index);
    free(stamp);
    free(pred_count);
    return eg;
fail:
    ptrmap_free(&index);
    free(stamp);
    free(pred_count);
    exec_graph_free(&eg);
    return NULL;
}

// ---- run ----

static exec_step *step_new(exec_graph *eg) {
    exec_step *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->eg = eg;
    s->pending = calloc((size_t)eg->n + 1, sizeof *s->pending);
    s->uses = calloc((size_t)eg->n_values + 1, sizeof *s->uses);
    s->values = calloc((size_t)eg->n_values + 1, sizeof *s->values);
    s->owned = calloc((size_t)eg->n_values + 1, sizeof *s->owned);
    int total_in = 0;
    for (int i = 0; i < eg->n; i++) total_in += eg->nodes[i].n_in;
    s->inbuf = calloc((size_t)total_in + 1, sizeof *s->inbuf);
    s->ready = malloc(((size_t)eg->n + 1) * sizeof *s->ready);
    s->inbox = malloc(((size_t)eg->n + 1) * sizeof *s->inbox);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->pending || !s->uses || !s->values || !s->owned || !s->inbuf || !s->ready || !s->inbox) {
        step_free(s);
        return NULL;
    }
    return s;
}

static void step_release_values(exec_step *s) {
    exec_graph *eg = s->eg;
    // Forwarded references first, so the buffers their owners allocated become exclusive.
    for (int v = 0; v < eg->n_values; v++)
        if (s->values[v] && !s->owned[v]) {
            dg_tensor_unref(s->values[v]);
            s->values[v] = NULL;
        }
    for (int v = 0; v < eg->n_values; v++)
        if (s->values[v] && !tensor_is_exclusive(s->values[v])) {
            dg_tensor_unref(s->values[v]);
            s->values[v] = NULL;
            s->owned[v] = false;
        }
}

static void step_free(exec_step *s) {
    if (!s) return;
    if (s->values)
        for (int v = 0; v < s->eg->n_values; v++) dg_tensor_unref(s->values[v]);
    free(s->pending);
    free(s->uses);
    free(s->values);
    free(s->owned);
    free(s->inbuf);
    free(s->ready);
    free(s->inbox);
    free(s->trace_t0);
    status_impl_clear(&s->status);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static void record_error(exec_step *s, const exec_node *en, dg_status *kst) {
    pthread_mutex_lock(&s->mu);
    if (s->status.code == DG_OK) {
        s->status.code = dg_status_code(kst) != DG_OK ? dg_status_code(kst) : DG_INTERNAL;
        // The node's own device: an executable of the CPU also runs the nodes of a GPU.
        const char *dev = en->node->assigned_device && en->node->assigned_device[0] ? en->node->assigned_device
                          : s->eg->device[0]                                        ? s->eg->device
                                                                                    : "the local device";
        if (asprintf(&s->status.msg, "node \"%s\" (%s) on %s: %s", en->node->name, en->node->op->name, dev,
                     dg_status_message(kst)) < 0)
            s->status.msg = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    bool was = atomic_exchange(&s->aborted, true);
    if (!was && s->opts.rendezvous) exec_rendezvous_abort(s->opts.rendezvous, s->opts.step_id, &s->status);
}

static void trace_node(exec_step *s, const exec_node *en, dg_trace_kind kind, int64_t t0) {
    const char *dev = en->node->assigned_device ? en->node->assigned_device : s->eg->device;
    dg_trace_event e = {.kind = kind, .name = en->node->name, .op = en->node->op->name, .device = dev,
                        .start_ns = t0, .end_ns = exec_trace_now_ns(), .thread = exec_trace_thread()};
    exec_trace_add(s->opts.trace, &e);
}

// Values at least this large are released after their last reader in a step (TensorFlow frees
// every tensor so); smaller ones keep their buffers for the next step's output in the same slot
// (exec_reuse_output), which saves the allocation. A pipeline's micro-batches then hold only the
// activations the schedule keeps alive, not every micro-batch's.
#define RELEASE_MIN_BYTES ((size_t)64 << 10)

// Node en has run (or was skipped): the values it read that nobody else reads this step go.
static void release_inputs(exec_step *s, const exec_node *en) {
    exec_graph *eg = s->eg;
    for (int k = 0; k < en->n_in; k++) {
        int v = eg->input_slots[en->in_off + k];
        if (atomic_fetch_sub_explicit(&s->uses[v], 1, memory_order_acq_rel) != 1) continue;
        dg_tensor *t = s->values[v];
        if (!t || t->nbytes < RELEASE_MIN_BYTES) continue;
        s->values[v] = NULL;
        s->owned[v] = false;
        dg_tensor_unref(t);
    }
}

// Runs node i (unless the step is aborted) and returns how many successors became ready;
// they are written to out[] (at most the node's successor count).
static int run_node(exec_step *s, int i, int *out) {
    exec_graph *eg = s->eg;
    exec_node *en = &eg->nodes[i];
    if (!atomic_load_explicit(&s->aborted, memory_order_relaxed)) {
        dg_tensor **in = s->inbuf + en->in_off;
        dg_status kst = DG_STATUS_INIT;
        bool ok = true;
        for (int k = 0; k < en->n_in; k++) {
            in[k] = s->values[eg->input_slots[en->in_off + k]];
            if (!in[k] && !(k == 0 && en->def->takes_uninit)) {
                dg_output src = en->node->inputs[k];
                if (strcmp(src.node->op->name, "VariableV2") == 0)
                    dg_status_setf(&kst, DG_FAILED_PRECONDITION,
                                   "attempting to use uninitialized value \"%s\" (input %d)",
                                   src.node->name, k);
                else
                    dg_status_setf(&kst, DG_INTERNAL, "input %d from \"%s\" has no value", k,
                                   src.node->name);
                ok = false;
                break;
            }
        }
        int64_t t0 = s->opts.trace ? exec_trace_now_ns() : 0;
        if (ok && en->def->start_async) {
            exec_ctx ctx = {in, en->n_in, s->values + en->out_off, s->owned + en->out_off,
                            en->n_out, en->node, s, &kst};
            exec_async_handle h = {s, i};
            if (s->trace_t0) s->trace_t0[i] = t0;
            en->def->start_async(en->state, &ctx, h);
            status_impl_clear(&kst);   // an error went to exec_async_done, which copied it
            return -1;   // exec_async_done finishes the node
        }
        if (ok) {
            exec_ctx ctx = {in, en->n_in, s->values + en->out_off, s->owned + en->out_off,
                            en->n_out, en->node, s, &kst};
            exec_threads_computing_add(1);   // threads_computing.c
            ok = en->def->compute(en->state, &ctx);
            exec_threads_computing_add(-1);
            if (s->opts.trace) trace_node(s, en, DG_TRACE_OP, t0);
            if (ok) {
                for (int o = 0; o < en->n_out && ok; o++)
                    if (!ctx.outputs[o] && !en->def->takes_uninit) {
                        dg_status_setf(&kst, DG_INTERNAL, "kernel produced no output %d", o);
                        ok = false;
                    }
            } else if (kst.code == DG_OK) {
                dg_status_set(&kst, DG_INTERNAL, "kernel failed without a message");
            }
        }
        if (!ok) record_error(s, en, &kst);
        status_impl_clear(&kst);
    }
    release_inputs(s, en);
    int n_ready = 0;
    for (int k = 0; k < en->n_succ; k++) {
        int d = eg->succ[en->succ_off + k];
        if (atomic_fetch_sub_explicit(&s->pending[d], 1, memory_order_acq_rel) == 1) out[n_ready++] = d;
    }
    return n_ready;
}

static void finish_async(exec_step *s);

static void finish_one(exec_step *s, int count) {
    if (atomic_fetch_sub_explicit(&s->remaining, count, memory_order_acq_rel) == count) {
        if (s->async) {
            finish_async(s);
            return;
        }
        pthread_mutex_lock(&s->mu);
        s->done = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

#define WORKER_STACK 64

static void pool_task(void *arg, int i);

// The caller of exec_graph_run is one of the step's inter-op threads (the pool holds the
// others). When it sleeps with nothing to run (caller_idle, set and cleared under mu), node d
// (d >= 0) is handed to it, or (d < 0) it is woken to take back what was just queued. True when
// it was idle.
static bool wake_idle_caller(exec_step *s, int d) {
    if (!atomic_load_explicit(&s->caller_idle, memory_order_relaxed)) return false;
    pthread_mutex_lock(&s->mu);
    bool idle = atomic_load_explicit(&s->caller_idle, memory_order_relaxed);
    if (idle) {
        atomic_store_explicit(&s->caller_idle, false, memory_order_relaxed);
        if (d >= 0) {
            if (s->n_inbox == 0 && s->trace_t0) s->inbox_ns = exec_trace_now_ns();
            s->inbox[s->n_inbox++] = d;
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return idle;
}

// Hands node d to the pool. A started (async) step counts the task as a runner token, so the
// step cannot end while the task still has work to look at (see async_run).
static void submit(exec_step *s, int d) {
    // A sleeping caller gets the node rather than leave it queued behind busy pool threads.
    bool sync_node = !s->async && d >= 0;
    if (sync_node && wake_idle_caller(s, d)) return;
    if (s->trace_t0 && d >= 0) s->trace_t0[d] = exec_trace_now_ns();
    if (s->async) atomic_fetch_add_explicit(&s->remaining, 1, memory_order_relaxed);
    exec_pool_submit(s->eg->pool ? s->eg->pool : s->eg->completion_pool, pool_task, s, d);
    // The caller may have gone idle since the check above, after its last look at the pool
    // (it marks itself idle before it looks): wake it to take the node back. Safe: the
    // submitting thread still holds an unfinished unit of the step.
    if (sync_node && s->eg->pool) wake_idle_caller(s, -1);
}

// Drains a stack of ready nodes. Newly ready expensive nodes beyond the first go to the pool.
static void drain_nodes(exec_step *s, int *stack, int top, int cap);

// Kernels run with denormal floats flushed to zero (exec_fp_enter, exec_fp_impl.h).
static void drain(exec_step *s, int *stack, int top, int cap) {
    unsigned fp = exec_fp_enter();
    drain_nodes(s, stack, top, cap);
    exec_fp_leave(fp);
}

// How long values a _Send handed to the rendezvous may wait while this thread goes on computing:
// the server holds small values back to merge them into one message per task (the sends of a
// backward pass), which the drain's end sends; a drain that runs long (a pipeline stage's next
// micro-batch) sends them after this much time instead, and at once when they hold at least
// SEND_NOW_BYTES (an activation another stage waits for: merging saves nothing there).
#define SEND_HOLD_NS 100000
#define SEND_NOW_BYTES ((size_t)64 << 10)

static void drain_nodes(exec_step *s, int *stack, int top, int cap) {
    exec_graph *eg = s->eg;
    int64_t held_since = 0;   // when a send this drain ran last found nothing held
    size_t held_bytes = 0;    // what the sends since then handed over
    while (top > 0) {
        int i = stack[--top];
        exec_node *en = &eg->nodes[i];
        if (held_since && !en->urgent &&
            (held_bytes >= SEND_NOW_BYTES || base_now_ns() - held_since > SEND_HOLD_NS)) {
            exec_rendezvous_flush(s->opts.rendezvous, s->opts.step_id);
            held_since = 0;
            held_bytes = 0;
        }
        if (en->urgent && s->opts.rendezvous) {
            if (!held_since) held_since = base_now_ns();
            const dg_tensor *v = en->n_in > 0 ? s->values[eg->input_slots[en->in_off]] : NULL;
            if (v) held_bytes += v->nbytes;
        }
        // Successors are written above the stack top, then kept or handed off.
        int *out = stack + top;
        int room = cap - top;
        int n_ready;
        if (en->n_succ <= room) {
            n_ready = run_node(s, i, out);
            if (n_ready < 0) continue;   // async: finished elsewhere
        } else {
            int *tmp = malloc((size_t)en->n_succ * sizeof *tmp);
            if (!tmp) abort();
            n_ready = run_node(s, i, tmp);
            if (n_ready < 0) {
                free(tmp);
                continue;
            }
            for (int k = 0; k < n_ready; k++) {
                if (top < cap)
                    stack[top++] = tmp[k];
                else
                    submit(s, tmp[k]);
            }
            free(tmp);
            finish_one(s, 1);
            continue;
        }
        int kept = 0, urgent = 0;
        for (int k = 0; k < n_ready; k++) {
            int d = out[k];
            if (eg->pool && kept > 0 && eg->nodes[d].def->expensive &&
                !atomic_load_explicit(&s->aborted, memory_order_relaxed))
                submit(s, d);
            else
                urgent += eg->nodes[(stack[top + kept++] = d)].urgent;
        }
        // Sends on top of the stack: popped first, before work their node's other successors
        // start (TensorFlow sends as soon as a value is ready, too).
        for (int k = kept - 1, w = kept - 1; urgent > 0 && k >= 0; k--)
            if (eg->nodes[stack[top + k]].urgent) {
                int d = stack[top + k];
                memmove(&stack[top + k], &stack[top + k + 1], (size_t)(w - k) * sizeof *stack);
                stack[top + w--] = d;
                urgent--;
            }
        top += kept;
        finish_one(s, 1);
    }
}

static void async_completed(exec_step *s, int node);
static void async_run(exec_step *s, const int *nodes, int n);

void exec_async_done(exec_async_handle h, dg_tensor *out, const dg_status *st) {
    exec_step *s = h.step;
    exec_graph *eg = s->eg;
    exec_node *en = &eg->nodes[h.node];
    if (s->trace_t0) trace_node(s, en, DG_TRACE_WAIT, s->trace_t0[h.node]);
    if (st && dg_status_code(st) != DG_OK) {
        record_error(s, en, (dg_status *)st);
        dg_tensor_unref(out);
        out = NULL;
    } else if (!out) {
        dg_status err = DG_STATUS_INIT;
        dg_status_set(&err, DG_INTERNAL, "async kernel finished without an output");
        record_error(s, en, &err);
        status_impl_clear(&err);
    }
    if (en->n_out > 0) {
        dg_tensor_unref(s->values[en->out_off]);
        s->values[en->out_off] = out;
        s->owned[en->out_off] = false;
    } else {
        dg_tensor_unref(out);
    }
    release_inputs(s, en);
    if (s->async) {
        async_completed(s, h.node);
        return;
    }
    if (eg->pool) {
        // With inter-op threads, what the value made ready goes to the waiting caller or the
        // pool (submit), not behind the drain of the thread that delivered it: a _Send's thread
        // (often the caller, computing another device's nodes) goes on with its own work while
        // another thread runs the receiving device's.
        for (int k = 0; k < en->n_succ; k++) {
            int d = eg->succ[en->succ_off + k];
            if (atomic_fetch_sub_explicit(&s->pending[d], 1, memory_order_acq_rel) == 1) submit(s, d);
        }
        finish_one(s, 1);
        return;
    }
    pthread_mutex_lock(&s->mu);
    for (int k = 0; k < en->n_succ; k++) {
        int d = eg->succ[en->succ_off + k];
        if (atomic_fetch_sub_explicit(&s->pending[d], 1, memory_order_acq_rel) == 1) {
            if (s->n_inbox == 0 && s->trace_t0) s->inbox_ns = exec_trace_now_ns();
            s->inbox[s->n_inbox++] = d;
        }
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    finish_one(s, 1);
}

static void pool_task(void *arg, int i) {
    exec_step *s = arg;
    if (i < 0) {   // a runner for what waits in the inbox (async_completed)
        async_run(s, NULL, 0);
        return;
    }
    if (s->trace_t0) trace_node(s, &s->eg->nodes[i], DG_TRACE_QUEUED, s->trace_t0[i]);
    if (s->async) {
        async_run(s, &i, 1);   // releases the token submit() took
        return;
    }
    int stack[WORKER_STACK];
    stack[0] = i;
    exec_rendezvous *rv = s->opts.rendezvous;
    int64_t step_id = s->opts.step_id;
    drain(s, stack, 1, WORKER_STACK);
    // s may be finished and reused once drain returns: only the copies are used here.
    if (rv) exec_rendezvous_flush(rv, step_id);
}

// ---- started steps (exec_graph_start): nobody waits ----
//
// Whoever runs nodes of a started step holds a *runner token*, one unit of `remaining`: the
// starter, each pool task (taken by submit), and each async completion (its node's own unit,
// released last). A step therefore ends only when no thread can still touch it, and the one
// releasing the last unit calls finish_async. A completion that happens inside this thread's
// own drain of the same step (a kernel finishing inside start_async) only queues what it made
// ready in the inbox: the runner below takes it from there, so the stack never nests.

static _Thread_local exec_step *tls_running;

// Runs nodes[0..n) and everything they make ready, then what the inbox holds, then releases
// one token.
static void async_run(exec_step *s, const int *nodes, int n) {
    exec_graph *eg = s->eg;
    exec_rendezvous *rv = s->opts.rendezvous;
    int64_t step_id = s->opts.step_id;
    int *stack = malloc(((size_t)eg->n + 1) * sizeof *stack);
    if (!stack) abort();
    exec_step *outer = tls_running;
    tls_running = s;
    if (n > 0) memcpy(stack, nodes, (size_t)n * sizeof *stack);
    for (int k = n;;) {
        if (k > 0) drain(s, stack, k, eg->n);
        pthread_mutex_lock(&s->mu);
        k = s->n_inbox;
        memcpy(stack, s->inbox, (size_t)k * sizeof *stack);
        s->n_inbox = 0;
        if (k == 0) s->runner_active = false;
        pthread_mutex_unlock(&s->mu);
        if (k == 0) break;
    }
    tls_running = outer;
    free(stack);
    if (rv) exec_rendezvous_flush(rv, step_id);
    finish_one(s, 1);
}

// An async kernel of a started step finished (its output is recorded): run its successors.
static void async_completed(exec_step *s, int node) {
    exec_graph *eg = s->eg;
    exec_node *en = &eg->nodes[node];
    int small[16];
    int *ready = en->n_succ <= 16 ? small : malloc((size_t)en->n_succ * sizeof *ready);
    if (!ready) abort();
    int n = 0;
    for (int k = 0; k < en->n_succ; k++) {
        int d = eg->succ[en->succ_off + k];
        if (atomic_fetch_sub_explicit(&s->pending[d], 1, memory_order_acq_rel) == 1) ready[n++] = d;
    }
    if (tls_running == s) {
        // Inside this thread's drain: the runner takes them from the inbox.
        pthread_mutex_lock(&s->mu);
        memcpy(s->inbox + s->n_inbox, ready, (size_t)n * sizeof *ready);
        s->n_inbox += n;
        pthread_mutex_unlock(&s->mu);
        finish_one(s, 1);   // never the last unit: the runner holds one
    } else if (!eg->light && eg->pool) {
        // Expensive or blocking work stays off the completing thread (an I/O thread, say).
        for (int k = 0; k < n; k++) submit(s, ready[k]);
        finish_one(s, 1);
    } else if (!eg->light && eg->completion_pool) {
        // No inter-op threads: one thread at a time runs the step (a pipeline stage's process
        // uses one core). The one running takes these from the inbox; when none runs, a pool
        // thread starts to.
        pthread_mutex_lock(&s->mu);
        memcpy(s->inbox + s->n_inbox, ready, (size_t)n * sizeof *ready);
        s->n_inbox += n;
        bool start = !s->runner_active && n > 0;
        if (start) s->runner_active = true;
        pthread_mutex_unlock(&s->mu);
        if (start) submit(s, -1);
        finish_one(s, 1);
    } else {
        async_run(s, ready, n);   // releases the node's own unit
    }
    if (ready != small) free(ready);
}

static void finish_async(exec_step *s) {
    exec_graph *eg = s->eg;
    exec_done_fn done = s->done_fn;
    void *arg = s->done_arg;
    dg_status st = DG_STATUS_INIT;
    if (s->status.code != DG_OK) dg_status_set(&st, s->status.code, s->status.msg);
    step_release_values(s);
    s->async = false;
    exec_step *expected = NULL;
    if (!atomic_compare_exchange_strong(&eg->idle, &expected, s)) step_free(s);
    // Last: done may free the graph.
    done(arg, st.code == DG_OK ? NULL : &st);
    status_impl_clear(&st);
}

// The cached step state (or a new one), reset for a run with `remaining` units to finish.
static exec_step *step_begin(exec_graph *eg, const exec_step_options *opts, int remaining, dg_status *st) {
    exec_step *s = atomic_exchange(&eg->idle, NULL);
    if (!s && !(s = step_new(eg))) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "executor: out of memory for a step");
        return NULL;
    }
    if (opts)
        s->opts = *opts;
    else
        memset(&s->opts, 0, sizeof s->opts);
    if (s->opts.trace) {
        if (!s->trace_t0) s->trace_t0 = calloc((size_t)eg->n + 1, sizeof *s->trace_t0);
        if (!s->trace_t0) s->opts.trace = NULL;   // out of memory: the step runs untraced
    } else {
        free(s->trace_t0);
        s->trace_t0 = NULL;
    }
    for (int i = 0; i < eg->n; i++)
        atomic_store_explicit(&s->pending[i], eg->nodes[i].pending0, memory_order_relaxed);
    for (int v = 0; v < eg->n_values; v++) atomic_store_explicit(&s->uses[v], eg->uses0[v], memory_order_relaxed);
    atomic_store(&s->remaining, remaining);
    atomic_store(&s->aborted, false);
    s->done = false;
    s->n_inbox = 0;
    s->runner_active = false;
    atomic_store_explicit(&s->caller_idle, false, memory_order_relaxed);
    status_impl_clear(&s->status);
    return s;
}

bool exec_graph_start(exec_graph *eg, const exec_step_options *opts, exec_done_fn done, void *arg,
                      dg_status *st) {
    if (eg->n_feeds > 0 || eg->n_fetches > 0) {
        dg_status_set(st, DG_INTERNAL, "exec_graph_start: a graph with feeds or fetches");
        return false;
    }
    exec_step *s = step_begin(eg, opts, eg->n + 1, st);   // + the starter's token
    if (!s) return false;
    s->async = true;
    s->runner_active = true;   // this thread, in async_run below
    s->done_fn = done;
    s->done_arg = arg;
    async_run(s, eg->roots, eg->n_roots);
    return true;
}

bool exec_graph_run(exec_graph *eg, dg_tensor *const *feed_values, dg_tensor **fetched,
                    const exec_step_options *opts, dg_status *st) {
    exec_step *s = step_begin(eg, opts, eg->n, st);
    if (!s) return false;
    s->done = eg->n == 0;
    for (int f = 0; f < eg->n_feeds; f++) {
        dg_tensor_unref(s->values[eg->feed_base + f]);
        s->values[eg->feed_base + f] = dg_tensor_ref(feed_values[f]);
        s->owned[eg->feed_base + f] = false;
    }
    int top = 0;
    // Roots in their order, except that asynchronous ones (a _Recv between two devices of the
    // process, a queue's take) go on top: starting them costs nothing, and one left under
    // a long drain of the other roots would hold back the device that waits for its value.
    for (int r = eg->n_roots - 1; r >= 0; r--)
        if (!eg->nodes[eg->roots[r]].def->start_async) s->ready[top++] = eg->roots[r];
    for (int r = eg->n_roots - 1; r >= 0; r--)
        if (eg->nodes[eg->roots[r]].def->start_async) s->ready[top++] = eg->roots[r];
    exec_rendezvous *rv = s->opts.rendezvous;
    if (eg->n > 0) drain(s, s->ready, top, eg->n);
    if (rv) exec_rendezvous_flush(rv, s->opts.step_id);
    // Wait for pool threads and async kernels; run what their completions made ready.
    pthread_mutex_lock(&s->mu);
    while (!s->done) {
        if (s->n_inbox > 0) {
            int k = s->n_inbox;
            memcpy(s->ready, s->inbox, (size_t)k * sizeof *s->ready);
            s->n_inbox = 0;
            pthread_mutex_unlock(&s->mu);
            if (s->trace_t0) trace_node(s, &eg->nodes[s->ready[0]], DG_TRACE_QUEUED, s->inbox_ns);
            drain(s, s->ready, k, eg->n);
            if (rv) exec_rendezvous_flush(rv, s->opts.step_id);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        if (eg->pool) {
            // Nothing of its own to run: the caller is idle (submit hands it new nodes, or wakes
            // it for what it queued after this look) and first takes back a node of this step
            // still queued behind the pool's busy threads. mu stays held: no node is handed to it
            // while it takes another.
            atomic_store_explicit(&s->caller_idle, true, memory_order_relaxed);
            int d;
            if (exec_pool_take(eg->pool, pool_task, s, &d)) {
                atomic_store_explicit(&s->caller_idle, false, memory_order_relaxed);
                pthread_mutex_unlock(&s->mu);
                pool_task(s, d);
                pthread_mutex_lock(&s->mu);
                continue;
            }
        }
        pthread_cond_wait(&s->cv, &s->mu);
        atomic_store_explicit(&s->caller_idle, false, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->mu);
    if (rv) exec_rendezvous_flush(rv, s->opts.step_id);
    bool ok = s->status.code == DG_OK;
    if (!ok) {
        dg_status_set(st, s->status.code, s->status.msg);
    } else {
        for (int i = 0; i < eg->n_fetches; i++) {
            dg_tensor *t = s->values[eg->fetch_slots[i]];
            if (!t) {
                // Only a fetched variable that was never initialised has no value here.
                const char *name = "?";
                for (int k = 0; k < eg->n; k++)
                    if (eg->fetch_slots[i] >= eg->nodes[k].out_off &&
                        eg->fetch_slots[i] < eg->nodes[k].out_off + eg->nodes[k].n_out)
                        name = eg->nodes[k].node->name;
                dg_status_setf(st, DG_FAILED_PRECONDITION,
                               "attempting to use uninitialized value \"%s\" (fetch %d)", name, i);
            }
            // A value someone else also holds (a variable's buffer or a view of it, a feed,
            // a constant) is copied, so that the caller's result is a snapshot they own.
            fetched[i] = !t ? NULL
                         : eg->fetch_copy[i] || !tensor_is_exclusive(t) ? dg_tensor_copy(t, st)
                                                                        : dg_tensor_ref(t);
            if (!fetched[i]) {
                for (int j = 0; j < i; j++) dg_tensor_free(&fetched[j]);
                ok = false;
                break;
            }
        }
    }
    step_release_values(s);
    exec_step *expected = NULL;
    if (!atomic_compare_exchange_strong(&eg->idle, &expected, s)) step_free(s);
    return ok;
}
