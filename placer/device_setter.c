/* replica_device_setter (TensorFlow's device_setter.py): _ReplicaDeviceChooser with the
 * round-robin strategy or GreedyLoadBalancingStrategy(byte_size_load_fn). The device
 * function owns a copy of everything it needs, so the options (and the cluster) are only
 * borrowed while the setter is made. */
#include "distgraph/device_setter.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"

static const char *const default_ps_ops[] = {"Variable", "VariableV2", "VarHandleOp"};

typedef struct setter_ctx {
    int ps_tasks;            // 0: the function leaves every device as it is (TF returns None)
    int *task_ids;           // ps_tasks entries: strategy slot -> ps task index
    bool has_ps_device;      // false when ps_device is "": no ps placement
    dg_device_name ps_spec;
    dg_device_name worker_spec;   // all unset when worker_device is ""
    bool merge_devices;
    char **ps_ops;
    int n_ps_ops;
    dg_ps_strategy strategy;
    int next_slot;           // round robin
    uint64_t *loads_bytes;   // greedy: bytes placed on each slot so far
} setter_ctx;

static void ctx_free(void *p) {
    setter_ctx *c = p;
    if (!c) return;
    for (int i = 0; i < c->n_ps_ops; i++) free(c->ps_ops[i]);
    free(c->ps_ops);
    free(c->task_ids);
    free(c->loads_bytes);
    free(c);
}

static bool write_out(const dg_device_name *d, char *out, size_t out_cap, dg_status *st) {
    if (!dg_device_name_str(d, out, out_cap)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "replica_device_setter: device name does not fit %zu bytes", out_cap);
        return false;
    }
    return true;
}

// byte_size_load_fn: bytes of the op's single output. Variables whose output shape is not
// known yet fall back to their "shape" attribute, as TensorFlow does.
static bool byte_size(const dg_node *node, uint64_t *out, dg_status *st) {
    int n_out = dg_node_num_outputs(node);
    if (n_out != 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "op \"%s\" (%s) must have a single output for byte-size load "
                       "balancing, has %d",
                       dg_node_name(node), dg_node_op_type(node), n_out);
        return false;
    }
    dg_dtype dtype = dg_node_output_dtype(node, 0);
    size_t elem = dg_dtype_size(dtype);
    if (elem == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "op \"%s\" (%s): output dtype %d has no size",
                       dg_node_name(node), dg_node_op_type(node), (int)dtype);
        return false;
    }
    dg_shape shape = dg_node_output_shape(node, 0);
    if (!dg_shape_is_fully_defined(&shape)) {
        dg_shape attr;
        if (dg_node_attr_shape(node, "shape", &attr) && dg_shape_is_fully_defined(&attr)) {
            shape = attr;
        } else {
            char buf[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "op \"%s\" (%s): shape %s is not fully defined, so its size in bytes "
                           "is unknown",
                           dg_node_name(node), dg_node_op_type(node),
                           dg_shape_str(&shape, buf, sizeof buf));
            return false;
        }
    }
    int64_t n = dg_shape_num_elements(&shape);
    if (n < 0) n = 0;
    // Saturate rather than wrap: a huge variable should look huge to the balancer.
    uint64_t bytes = (uint64_t)n > UINT64_MAX / elem ? UINT64_MAX : (uint64_t)n * elem;
    *out = bytes;
    return true;
}

// The strategy's choice of slot (0..ps_tasks-1) for node.
static bool choose_slot(setter_ctx *c, const dg_node *node, int *slot, dg_status *st) {
    if (c->strategy == DG_PS_ROUND_ROBIN) {
        *slot = c->next_slot;
        c->next_slot = (c->next_slot + 1) % c->ps_tasks;
        return true;
    }
    uint64_t bytes;
    if (!byte_size(node, &bytes, st)) return false;
    int best = 0;   // argmin, ties to the lowest index as numpy's argmin
    for (int i = 1; i < c->ps_tasks; i++)
        if (c->loads_bytes[i] < c->loads_bytes[best]) best = i;
    uint64_t *l = &c->loads_bytes[best];
    *l = *l > UINT64_MAX - bytes ? UINT64_MAX : *l + bytes;
    *slot = best;
    return true;
}

static bool is_ps_op(const setter_ctx *c, const char *op_type) {
    for (int i = 0; i < c->n_ps_ops; i++)
        if (strcmp(c->ps_ops[i], op_type) == 0) return true;
    return false;
}

static bool choose(void *p, const dg_node *node, const char *current, char *out,
                   size_t out_cap, dg_status *st) {
    setter_ctx *c = p;
    if (!current) current = "";
    // No ps tasks: TensorFlow installs no device function at all, so nothing changes.
    // Without merging, an op that already has a device keeps it verbatim.
    if (c->ps_tasks == 0 || (!c->merge_devices && current[0])) {
        size_t n = strlen(current);
        if (n >= out_cap) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "replica_device_setter: device \"%s\" does not fit %zu bytes", current,
                           out_cap);
            return false;
        }
        memcpy(out, current, n + 1);
        return true;
    }
    dg_device_name cur;
    if (!dg_device_name_parse(current, &cur, st)) {
        dg_status_prepend(st, "replica_device_setter: op \"%s\"", dg_node_name(node));
        return false;
    }
    if (c->has_ps_device && is_ps_op(c, dg_node_op_type(node))) {
        dg_device_name ps = c->ps_spec;
        // The task is only chosen when the op's own job (if any) is the ps job; an op pinned
        // to another job keeps that job and gets no task.
        if (ps.has_job && (!cur.has_job || strcmp(cur.job, ps.job) == 0)) {
            int slot;
            if (!choose_slot(c, node, &slot, st)) {
                dg_status_prepend(st, "replica_device_setter");
                return false;
            }
            ps.has_task = true;
            ps.task = c->task_ids[slot];
        }
        dg_device_name_merge_override(&ps, &cur);
        return write_out(&ps, out, out_cap, st);
    }
    dg_device_name w = c->worker_spec;
    dg_device_name_merge_override(&w, &cur);
    return write_out(&w, out, out_cap, st);
}

dg_replica_device_setter_options dg_replica_device_setter_options_default(void) {
    dg_replica_device_setter_options o;
    memset(&o, 0, sizeof o);
    o.ps_tasks = 0;
    o.cluster = NULL;
    o.ps_device = "/job:ps";
    o.worker_device = "/job:worker";
    o.merge_devices = true;
    o.ps_ops = NULL;
    o.n_ps_ops = 0;
    o.strategy = DG_PS_ROUND_ROBIN;
    return o;
}

static dg_device_fn *oom(dg_status *st, size_t n_bytes) {
    dg_status_setf(st, DG_RESOURCE_EXHAUSTED,
                   "replica_device_setter: out of memory allocating %zu bytes", n_bytes);
    return NULL;
}

dg_device_fn *dg_replica_device_setter_new(const dg_replica_device_setter_options *opts,
                                       dg_status *st) {
    dg_status_reset(st);
    dg_replica_device_setter_options defaults = dg_replica_device_setter_options_default();
    if (!opts) opts = &defaults;
    if (opts->ps_tasks < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "replica_device_setter: ps_tasks must be >= 0, got %d", opts->ps_tasks);
        return NULL;
    }
    if (opts->strategy != DG_PS_ROUND_ROBIN && opts->strategy != DG_PS_GREEDY_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "replica_device_setter: unknown strategy %d",
                       (int)opts->strategy);
        return NULL;
    }
    if (opts->ps_ops && opts->n_ps_ops < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "replica_device_setter: n_ps_ops must be >= 0, got %d", opts->n_ps_ops);
        return NULL;
    }
    const char *const *ps_ops = opts->ps_ops ? opts->ps_ops : default_ps_ops;
    int n_ps_ops = opts->ps_ops ? opts->n_ps_ops : (int)(sizeof default_ps_ops / sizeof *default_ps_ops);
    for (int i = 0; i < n_ps_ops; i++) {
        if (!ps_ops[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "replica_device_setter: ps_ops[%d] is NULL", i);
            return NULL;
        }
    }

    dg_device_fn *fn = NULL;
    setter_ctx *c = calloc(1, sizeof *c);
    if (!c) return oom(st, sizeof *c);
    c->merge_devices = opts->merge_devices;
    c->strategy = opts->strategy;

    // NULL means the default; "" means none, as a falsy device in Python.
    const char *ps_device = opts->ps_device ? opts->ps_device : "/job:ps";
    const char *worker_device = opts->worker_device ? opts->worker_device : "/job:worker";
    if (!dg_device_name_parse(ps_device, &c->ps_spec, st)) {
        dg_status_prepend(st, "replica_device_setter: ps_device");
        goto fail;
    }
    c->has_ps_device = ps_device[0] != '\0';
    if (!dg_device_name_parse(worker_device, &c->worker_spec, st)) {
        dg_status_prepend(st, "replica_device_setter: worker_device");
        goto fail;
    }

    c->ps_tasks = opts->ps_tasks;
    if (opts->cluster) {
        // The cluster decides the ps task count; a missing ps job means no ps placement.
        const char *job = c->ps_spec.has_job ? c->ps_spec.job : NULL;
        c->ps_tasks = job ? dg_cluster_num_tasks(opts->cluster, job) : 0;
    }
    if (c->ps_tasks > 0) {
        size_t n = (size_t)c->ps_tasks;
        c->task_ids = malloc(n * sizeof *c->task_ids);
        c->loads_bytes = calloc(n, sizeof *c->loads_bytes);
        if (!c->task_ids || !c->loads_bytes) {
            oom(st, n * (sizeof *c->task_ids + sizeof *c->loads_bytes));
            goto fail;
        }
        // With a cluster, slots map to the ps job's real (possibly sparse) task indices.
        for (int i = 0; i < c->ps_tasks; i++)
            c->task_ids[i] = opts->cluster ? dg_cluster_task_index(opts->cluster, c->ps_spec.job, i)
                                           : i;
    }

    if (n_ps_ops > 0) {
        c->ps_ops = calloc((size_t)n_ps_ops, sizeof *c->ps_ops);
        if (!c->ps_ops) {
            oom(st, (size_t)n_ps_ops * sizeof *c->ps_ops);
            goto fail;
        }
        for (int i = 0; i < n_ps_ops; i++) {
            c->ps_ops[i] = strdup(ps_ops[i]);
            if (!c->ps_ops[i]) {
                oom(st, strlen(ps_ops[i]) + 1);
                goto fail;
            }
            c->n_ps_ops = i + 1;
        }
    }

    fn = calloc(1, sizeof *fn);
    if (!fn) {
        oom(st, sizeof *fn);
        goto fail;
    }
    fn->choose = choose;
    fn->free_ctx = ctx_free;
    fn->ctx = c;
    return fn;
fail:
    ctx_free(c);
    return NULL;
}
