/* Mirrored and central-storage strategies (TensorFlow 2's tf.distribute) as graph
 * construction: batch split, one tower per device, gradient reduction on the host CPU, and
 * the optimizer updates. docs/STRATEGIES.md describes the graph this builds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/collective.h"
#include "distgraph/device_name.h"
#include "distgraph/strategy.h"
#include "graph_impl.h"

static const dg_output NUL = {NULL, 0};

// One strategy variable: n_copies == n_replicas (mirrored) or 1 (central storage).
typedef struct strategy_var {
    dg_node **copies;   // owned array; the nodes belong to the graph
} strategy_var;

struct dg_strategy {
    dg_graph *graph;                    // borrowed
    dg_strategy_kind kind;
    int n_replicas;
    char **devices;                     // owned canonical names, n_replicas
    char host[DG_DEVICE_NAME_MAX];      // CPU:0 of the replicas' task
    strategy_var *vars;                 // owned, n_vars
    int n_vars, cap_vars;
};

static int n_copies(const dg_strategy *s) {
    return s->kind == DG_STRATEGY_MIRRORED ? s->n_replicas : 1;
}

void dg_strategy_free(dg_strategy **sp) {
    if (!sp || !*sp) return;
    dg_strategy *s = *sp;
    for (int i = 0; s->devices && i < s->n_replicas; i++) free(s->devices[i]);
    free(s->devices);
    for (int i = 0; i < s->n_vars; i++) free(s->vars[i].copies);
    free(s->vars);
    free(s);
    *sp = NULL;
}

static bool same_task_fields(const dg_device_name *a, const dg_device_name *b) {
    if (a->has_job != b->has_job || (a->has_job && strcmp(a->job, b->job) != 0)) return false;
    if (a->has_replica != b->has_replica || (a->has_replica && a->replica != b->replica)) return false;
    return a->has_task == b->has_task && (!a->has_task || a->task == b->task);
}

dg_strategy *dg_strategy_new(dg_graph *g, dg_strategy_kind kind, const char *const *devices,
                             int n_devices, dg_status *st) {
    dg_status_reset(st);
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "strategy: graph is NULL");
        return NULL;
    }
    if (kind != DG_STRATEGY_MIRRORED && kind != DG_STRATEGY_CENTRAL_STORAGE) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: unknown kind %d", (int)kind);
        return NULL;
    }
    if (n_devices < 1 || !devices) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: needs at least one device, got %d%s",
                       n_devices, n_devices >= 1 ? " and a NULL list" : "");
        return NULL;
    }
    dg_strategy *s = calloc(1, sizeof *s);
    dg_device_name *names = calloc((size_t)n_devices, sizeof *names);
    if (s) s->devices = calloc((size_t)n_devices, sizeof *s->devices);
    if (!s || !names || !s->devices) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "strategy: out of memory for %d devices", n_devices);
        free(names);
        dg_strategy_free(&s);
        return NULL;
    }
    s->graph = g;
    s->kind = kind;
    s->n_replicas = n_devices;
    char buf[DG_DEVICE_NAME_MAX];
    for (int i = 0; i < n_devices; i++) {
        if (!devices[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: device %d is NULL", i);
            goto fail;
        }
        // Read as TensorFlow's strategies read devices (device_util.canonicalize):
        // "/device:gpu:0" is GPU:0.
        if (!dg_device_spec_from_string(devices[i], &names[i], st)) {
            dg_status_prepend(st, "strategy: device %d", i);
            goto fail;
        }
        if (!names[i].has_type || !names[i].has_id) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: device %d \"%s\" does not name one "
                           "device (it needs a type and an id, e.g. /device:CPU:1)", i, devices[i]);
            goto fail;
        }
        if (!same_task_fields(&names[i], &names[0])) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: device %d \"%s\" is not in the task of "
                           "device 0 \"%s\" (a strategy replicates inside one task)", i, devices[i],
                           devices[0]);
            goto fail;
        }
        if (!dg_device_name_str(&names[i], buf, sizeof buf) || !(s->devices[i] = strdup(buf))) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "strategy: out of memory for device \"%s\"",
                           devices[i]);
            goto fail;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(s->devices[j], s->devices[i]) == 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: device \"%s\" is listed twice "
                               "(devices %d and %d)", s->devices[i], j, i);
                goto fail;
            }
    }
    dg_device_name host = names[0];
    snprintf(host.type, sizeof host.type, "CPU");
    host.id = 0;
    dg_device_name_str(&host, s->host, sizeof s->host);
    free(names);
    return s;
fail:
    free(names);
    dg_strategy_free(&s);
    return NULL;
}

dg_strategy *dg_strategy_new_local(dg_graph *g, dg_strategy_kind kind, const char *device_type,
                                   int n, dg_status *st) {
    dg_status_reset(st);
    if (n < 1 || n > 4096) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy: needs 1..4096 devices, got %d", n);
        return NULL;
    }
    const char *type = device_type ? device_type : "CPU";
    char **devs = calloc((size_t)n, sizeof *devs);
    if (!devs) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "strategy: out of memory for %d devices", n);
        return NULL;
    }
    dg_strategy *s = NULL;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) ok = asprintf(&devs[i], "/device:%s:%d", type, i) >= 0;
    if (ok) s = dg_strategy_new(g, kind, (const char *const *)devs, n, st);
    else dg_status_set(st, DG_RESOURCE_EXHAUSTED, "strategy: out of memory for device names");
    for (int i = 0; i < n; i++) free(devs[i]);
    free(devs);
    return s;
}

dg_strategy_kind dg_strategy_get_kind(const dg_strategy *s) { return s->kind; }
int dg_strategy_num_replicas(const dg_strategy *s) { return s ? s->n_replicas : 0; }

const char *dg_strategy_device(const dg_strategy *s, int replica) {
    return s && replica >= 0 && replica < s->n_replicas ? s->devices[replica] : NULL;
}

const char *dg_strategy_host_device(const dg_strategy *s) { return s ? s->host : NULL; }

// A copy of the mirrored variable v0 for another device: a VariableV2 "<v0>/replica_<r>" whose
// initializer assigns it the very output v0's initializer assigns, so one run of the
// initializers computes the initial value once (on device 0) and every copy receives it.
static dg_node *make_copy(dg_graph *g, dg_node *v0, int r) {
    char *name = NULL, *aname = NULL;
    if (asprintf(&name, "%s/replica_%d", v0->name, r) < 0 || asprintf(&aname, "%s/Assign", name) < 0)
        abort();
    dg_node *n = graph_begin_absolute(g, "VariableV2", name);
    graph_set_attr_type(n, "dtype", v0->out_dtypes[0]);
    graph_set_attr_shape(n, "shape", v0->out_shapes[0]);
    n = graph_finish(n);
    dg_node *assign = NULL;
    if (n) {
        dg_output v = {n, 0};
        dg_graph_push_colocate_with(g, n);
        assign = graph_begin_absolute(g, "Assign", aname);
        graph_add_input(assign, v);
        graph_add_input(assign, v0->var_initializer->inputs[1]);
        assign = graph_finish(assign);
        dg_graph_pop_colocate_with(g);
    }
    free(name);
    free(aname);
    if (!assign) return NULL;
    n->var_initializer = assign;
    dg_graph_add_to_collection(g, DG_GLOBAL_VARIABLES, n);
    dg_graph_add_to_collection(g, DG_TRAINABLE_VARIABLES, n);
    return n;
}

dg_output dg_strategy_variable(dg_strategy *s, const char *name, dg_dtype dtype, dg_shape shape,
                               dg_initializer init, dg_status *st) {
    dg_status_reset(st);
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "strategy variable: strategy is NULL");
        return NUL;
    }
    dg_graph *g = s->graph;
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "strategy variable \"%s\": the graph has an error", name ? name : "Variable");
        return NUL;
    }
    base_reserve((void **)&s->vars, sizeof *s->vars, s->n_vars, &s->cap_vars, 1);
    dg_node **copies = calloc((size_t)n_copies(s), sizeof *copies);
    if (!copies) abort();
    dg_graph_push_device(g, s->kind == DG_STRATEGY_MIRRORED ? s->devices[0] : s->host);
    dg_output v0 = dg_variable_ex(g, name, dtype, shape, init, true);
    dg_graph_pop_device(g);
    copies[0] = v0.node;
    for (int r = 1; r < n_copies(s) && dg_graph_ok(g); r++) {
        dg_graph_push_device(g, s->devices[r]);
        copies[r] = make_copy(g, v0.node, r);
        dg_graph_pop_device(g);
    }
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "strategy variable \"%s\"", name ? name : "Variable");
        free(copies);
        return NUL;
    }
    s->vars[s->n_vars++].copies = copies;
    return v0;
}

// Finds the strategy variable holding node n: sets *var and *copy and returns true.
static bool find_var(const dg_strategy *s, const dg_node *n, int *var, int *copy) {
    for (int i = 0; i < s->n_vars; i++)
        for (int c = 0; c < n_copies(s); c++)
            if (s->vars[i].copies[c] == n) {
                *var = i;
                *copy = c;
                return true;
            }
    return false;
}

dg_output dg_strategy_read_variable(dg_strategy *s, dg_output var, int replica) {
    if (!s) return NUL;
    dg_graph *g = s->graph;
    if (!dg_graph_ok(g)) return NUL;
    int vi, ci;
    if (!var.node || !find_var(s, var.node, &vi, &ci)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: \"%s\" is not a variable of this "
                           "strategy (make it with dg_strategy_variable)",
                           var.node ? var.node->name : "(null output)");
        return NUL;
    }
    if (replica < 0 || replica >= s->n_replicas) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: reading \"%s\" for replica %d, but "
                           "the strategy has replicas 0..%d", var.node->name, replica, s->n_replicas - 1);
        return NUL;
    }
    dg_output o = {s->vars[vi].copies[s->kind == DG_STRATEGY_MIRRORED ? replica : 0], 0};
    return o;
}

// Checks that the tower of `replica` reads no trainable variable other than its own strategy
// copies: a variable made outside the strategy would get no reduced gradient and no update,
// and another replica's copy would pull its values across devices and break the mirroring.
static bool check_tower_vars(dg_strategy *s, dg_output loss, int replica) {
    dg_graph *g = s->graph;
    int n_nodes = dg_graph_num_nodes(g);
    unsigned char *seen = calloc((size_t)n_nodes + 1, 1);
    dg_node **stack = malloc(((size_t)n_nodes + 1) * sizeof *stack);
    if (!seen || !stack) abort();
    int top = 0;
    stack[top++] = loss.node;
    seen[loss.node->id] = 1;
    bool ok = true;
    while (top > 0 && ok) {
        dg_node *n = stack[--top];
        if (strcmp(n->op->name, "VariableV2") == 0) {
            int vi, ci;
            int want = s->kind == DG_STRATEGY_MIRRORED ? replica : 0;
            if (find_var(s, n, &vi, &ci)) {
                if (ci != want) {
                    dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: the tower of replica %d reads "
                                       "\"%s\", the copy of replica %d; read variables with "
                                       "dg_strategy_read_variable(strategy, var, %d)", replica,
                                       n->name, ci, replica);
                    ok = false;
                }
            } else {
                bool trainable = false;
                for (int i = 0; i < dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES) && !trainable; i++)
                    trainable = dg_graph_collection_get(g, DG_TRAINABLE_VARIABLES, i) == n;
                if (trainable) {
                    dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: the tower of replica %d reads "
                                       "the trainable variable \"%s\", which was not made by this "
                                       "strategy (make it with dg_strategy_variable)", replica, n->name);
                    ok = false;
                }
            }
        }
        for (int k = 0; k < n->n_inputs; k++) {
            dg_node *in = n->inputs[k].node;
            if (!seen[in->id]) {
                seen[in->id] = 1;
                stack[top++] = in;
            }
        }
        for (int k = 0; k < n->n_ctrl; k++) {
            dg_node *in = n->ctrl_inputs[k];
            if (!seen[in->id]) {
                seen[in->id] = 1;
                stack[top++] = in;
            }
        }
    }
    free(seen);
    free(stack);
    return ok;
}

// Builds tower r: its loss and its gradients with respect to every strategy variable (grads
// row r, the null output where the variable does not affect this tower's loss).
static bool build_tower(dg_strategy *s, dg_tower_fn tower_fn, void *ctx, const dg_output *inputs,
                        int replica, dg_output *loss, dg_output *grads) {
    dg_graph *g = s->graph;
    char scope[32];
    snprintf(scope, sizeof scope, "replica_%d", replica);
    dg_graph_push_device(g, s->devices[replica]);
    dg_graph_push_name_scope(g, scope);
    *loss = tower_fn(g, replica, inputs, ctx);
    bool ok = dg_graph_ok(g);
    if (ok && !loss->node) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: the tower function returned the null "
                           "output for replica %d without a graph error", replica);
        ok = false;
    }
    if (ok && (loss->node->graph != g || loss->index < 0 || loss->index >= loss->node->n_outputs)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: the tower function of replica %d "
                           "returned an output that is not of the strategy's graph", replica);
        ok = false;
    }
    if (ok) {
        dg_shape ls = dg_output_shape(*loss);
        if (ls.rank != 0) {
            char b[128];
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy: the loss \"%s\" of replica %d has "
                               "shape %s; a tower returns its scalar mean loss", loss->node->name,
                               replica, dg_shape_str(&ls, b, sizeof b));
            ok = false;
        }
    }
    ok = ok && check_tower_vars(s, *loss, replica);
    if (ok) {
        dg_output *xs = calloc((size_t)s->n_vars, sizeof *xs);
        if (!xs) abort();
        for (int i = 0; i < s->n_vars; i++) {
            dg_output handle = {s->vars[i].copies[0], 0};
            xs[i] = dg_strategy_read_variable(s, handle, replica);
        }
        ok = dg_gradients(g, loss, 1, xs, s->n_vars, NULL, grads);
        free(xs);
    }
    dg_graph_pop_name_scope(g);
    dg_graph_pop_device(g);
    return ok && dg_graph_ok(g);
}

// Sums the n present outputs of xs on the current device and divides by `divisor`.
static dg_output mean_of(dg_graph *g, const char *name, const dg_output *xs, int n, int divisor) {
    dg_output sum = n == 1 ? xs[0] : dg_add_n(g, NULL, xs, n);
    if (divisor == 1) return n == 1 ? dg_identity(g, name, sum) : sum;
    return dg_div(g, name, sum, dg_scalar(g, NULL, dg_output_dtype(sum), divisor));
}

bool dg_strategy_minimize(dg_strategy *s, const dg_optimizer *opt, dg_tower_fn tower_fn, void *ctx,
                          const dg_output *batch_inputs, int n_inputs, dg_output global_step,
                          dg_strategy_step *out, dg_status *st) {
    dg_status_reset(st);
    if (!s || !opt || !tower_fn || !out || n_inputs < 0 || (n_inputs > 0 && !batch_inputs)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "strategy minimize: the strategy, optimizer, tower "
                      "function or result is NULL, or the batch inputs are a NULL array or a negative count");
        return false;
    }
    dg_graph *g = s->graph;
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "strategy minimize: the graph has an error");
        return false;
    }
    if (opt->graph != g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "strategy minimize: the optimizer was made for another "
                      "graph than the strategy's");
        return false;
    }
    if (s->n_vars == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "strategy minimize: the strategy has no variables "
                      "(make them with dg_strategy_variable)");
        return false;
    }
    int n = s->n_replicas;
    char b[128];
    for (int i = 0; i < n_inputs; i++) {
        dg_output x = batch_inputs[i];
        if (!x.node || x.node->graph != g || x.index < 0 || x.index >= x.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy minimize: batch input %d is not an output "
                           "of the strategy's graph (a null output from a failed builder call?)", i);
            return false;
        }
        dg_shape xs = dg_output_shape(x);
        if (xs.rank == 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy minimize: batch input %d (\"%s\") is a "
                           "scalar; batch inputs are split along dimension 0", i, x.node->name);
            return false;
        }
        if (xs.rank > 0 && xs.dims[0] >= 0 && xs.dims[0] % n != 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "strategy minimize: batch input %d (\"%s\", shape %s) "
                           "has %lld examples, which do not split evenly across %d replicas", i,
                           x.node->name, dg_shape_str(&xs, b, sizeof b), (long long)xs.dims[0], n);
            return false;
        }
    }
    const dg_optimizer o = *opt;
    int nv = s->n_vars;
    dg_output *slices = calloc((size_t)n * (size_t)(n_inputs ? n_inputs : 1), sizeof *slices);
    dg_output *grads = calloc((size_t)n * (size_t)nv, sizeof *grads);
    dg_output *losses = calloc((size_t)n, sizeof *losses);
    dg_output *present = calloc((size_t)n, sizeof *present);
    dg_output *mean_grads = calloc((size_t)nv, sizeof *mean_grads);
    dg_output *replica_grads = calloc((size_t)n * (size_t)nv, sizeof *replica_grads);
    dg_output *vars = calloc((size_t)nv, sizeof *vars);
    dg_node **trains = calloc((size_t)n, sizeof *trains);
    if (!slices || !grads || !losses || !present || !mean_grads || !replica_grads || !vars || !trains)
        abort();
    bool ok = true;

    // The split runs on the host, where the batch arrives; each slice then travels to its tower.
    if (n > 1 && n_inputs > 0) {
        dg_graph_push_device(g, s->host);
        dg_graph_push_name_scope(g, "split");
        dg_output *parts = calloc((size_t)n, sizeof *parts);
        if (!parts) abort();
        for (int i = 0; i < n_inputs && ok; i++) {
            char name[32];
            snprintf(name, sizeof name, "input_%d", i);
            ok = dg_split(g, name, batch_inputs[i], 0, n, parts);
            for (int r = 0; r < n && ok; r++) slices[r * n_inputs + i] = parts[r];
        }
        free(parts);
        dg_graph_pop_name_scope(g);
        dg_graph_pop_device(g);
    } else {
        for (int i = 0; i < n_inputs; i++) slices[i] = batch_inputs[i];
    }

    for (int r = 0; r < n && ok; r++)
        ok = build_tower(s, tower_fn, ctx, slices + r * n_inputs, r, &losses[r], grads + r * nv);

    // The sum of the towers' mean gradients over the number of towers is the gradient of the
    // mean loss over the whole (evenly split) batch. Mirrored: an all-reduce across the
    // replicas' devices (LocalAllReduce: NCCL between GPUs, the host in device order between
    // CPUs), each copy updated with the result on its own device. Central storage, or a
    // variable some tower has no gradient for: reduced on the host.
    int n_trained = 0;
    dg_output loss = NUL;
    if (ok) {
        dg_graph_push_device(g, s->host);
        dg_graph_push_name_scope(g, "reduce");
        for (int v = 0; v < nv && ok; v++) {
            int k = 0;
            for (int r = 0; r < n; r++)
                if (grads[r * nv + v].node) present[k++] = grads[r * nv + v];
            if (k == 0) continue;   // the variable does not affect the loss
            char name[600];
            snprintf(name, sizeof name, "%s", s->vars[v].copies[0]->name);
            for (char *c = name; *c; c++)
                if (*c == '/') *c = '_';
            if (s->kind == DG_STRATEGY_MIRRORED && k == n && n > 1) {
                ok = dg_local_all_reduce(g, name, present, (const char *const *)s->devices, n,
                                         DG_REDUCE_MEAN, replica_grads + (size_t)n_trained * n);
                mean_grads[n_trained] = replica_grads[(size_t)n_trained * n];
            } else {
                mean_grads[n_trained] = mean_of(g, name, present, k, n);
                for (int r = 0; r < n; r++) replica_grads[(size_t)n_trained * n + r] = mean_grads[n_trained];
            }
            vars[n_trained++] = (dg_output){s->vars[v].copies[0], 0};
        }
        loss = mean_of(g, "loss", losses, n, n);
        dg_graph_pop_name_scope(g);
        dg_graph_pop_device(g);
        ok = dg_graph_ok(g);
        if (ok && n_trained == 0) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "strategy minimize: no strategy variable "
                               "affects the tower losses");
            ok = false;
        }
    }

    // Updates: one optimizer application per copy (mirrored), each on its copy's device and fed
    // the same reduced gradient, so the copies stay bit-identical; or one (central storage).
    int n_trains = 0;
    for (int c = 0; c < n_copies(s) && ok; c++) {
        char scope[32];
        if (s->kind == DG_STRATEGY_MIRRORED) snprintf(scope, sizeof scope, "update_replica_%d", c);
        else snprintf(scope, sizeof scope, "update");
        dg_output *cv = calloc((size_t)n_trained, sizeof *cv);
        if (!cv) abort();
        dg_output *cg = calloc((size_t)n_trained + 1, sizeof *cg);
        if (!cg) abort();
        for (int i = 0; i < n_trained; i++) {
            cv[i] = dg_strategy_read_variable(s, vars[i], c);
            cg[i] = replica_grads[(size_t)i * n + (s->kind == DG_STRATEGY_MIRRORED ? c : 0)];
        }
        dg_graph_push_device(g, s->kind == DG_STRATEGY_MIRRORED ? s->devices[c] : s->host);
        dg_graph_push_name_scope(g, scope);
        trains[n_trains] = dg_optimizer_apply_gradients(&o, cg, cv, n_trained, NUL, NULL);
        free(cg);
        ok = trains[n_trains++] != NULL;
        dg_graph_pop_name_scope(g);
        dg_graph_pop_device(g);
        free(cv);
    }
    dg_node *train = NULL;
    if (ok) {
        dg_graph_push_device(g, s->host);
        dg_node *finish = dg_group(g, "update_copies", trains, n_trains);
        if (finish && global_step.node) {
            dg_graph_push_control_deps(g, &finish, 1);
            dg_output inc = dg_assign_add(g, "global_step_inc", global_step,
                                          dg_scalar(g, NULL, dg_output_dtype(global_step), 1));
            dg_graph_pop_control_deps(g);
            finish = inc.node;
        }
        if (finish) train = dg_group(g, "train", &finish, 1);
        dg_graph_pop_device(g);
        ok = train && dg_graph_ok(g);
    }
    free(slices);
    free(grads);
    free(losses);
    free(present);
    free(mean_grads);
    free(replica_grads);
    free(vars);
    free(trains);
    if (!ok) {
        if (!dg_graph_check(g, st)) dg_status_prepend(st, "strategy minimize");
        else dg_status_set(st, DG_INTERNAL, "strategy minimize: failed without a graph error");
        return false;
    }
    out->train = train;
    out->loss = loss;
    return true;
}
