/* replica_device_setter (TensorFlow's training/device_setter.py): _ReplicaDeviceChooser with
 * the round-robin strategy or tf.contrib's GreedyLoadBalancingStrategy and byte_size_load_fn.
 * Device strings are read with dg_device_spec_from_string, as device_setter.py reads them with
 * DeviceSpec.from_string. The device function owns a copy of everything it needs, so the
 * options (and the cluster) are only borrowed while the setter is made. */
#include "base_impl.h"
#include "distgraph/device_setter.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"

static const char *const standard_ps_ops[] = {
    "Variable",
    "VariableV2",
    "AutoReloadVariable",
    "MutableHashTable",
    "MutableHashTableV2",
    "MutableHashTableOfTensors",
    "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable",
    "MutableDenseHashTableV2",
    "VarHandleOp",
    "BoostedTreesEnsembleResourceHandleOp",
    "BoostedTreesQuantileStreamResourceHandleOp",
    "ResourceConditionalAccumulator",
    "DecisionTreeResource",
};

const char *const *dg_standard_ps_ops(int *n_out) {
    if (n_out) *n_out = (int)(sizeof standard_ps_ops / sizeof standard_ps_ops[0]);
    return standard_ps_ops;
}

// A device string of the options, parsed once. TensorFlow parses ps_device and worker_device
// each time an op needs them, so a malformed one is reported then, for that op.
typedef struct setter_device {
    bool is_set;            // false for "": no such device
    dg_device_name spec;
    char *error;            // the parse error, NULL if it parsed
} setter_device;

typedef struct setter_ctx {
    int ps_tasks;            // 0: the function leaves every device as it is (TF returns None)
    int *task_ids;           // ps_tasks entries: strategy slot -> ps task index
    setter_device ps, worker;
    bool merge_devices;
    char **ps_ops;
    int n_ps_ops;
    dg_ps_strategy strategy;
    dg_ps_load_fn load_fn;   // greedy strategies
    void *load_ctx;
    int next_slot;           // round robin
    double *loads;           // greedy: load placed on each slot so far (numpy float64 in TF)
} setter_ctx;

static void ctx_free(void *p) {
    setter_ctx *c = p;
    if (!c) return;
    for (int i = 0; i < c->n_ps_ops; i++) free(c->ps_ops[i]);
    free(c->ps_ops);
    free(c->task_ids);
    free(c->loads);
    free(c->ps.error);
    free(c->worker.error);
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

static bool is_handle_op(const char *op_type) { return strcmp(op_type, "VarHandleOp") == 0; }

bool dg_byte_size_load_fn(void *ctx, const dg_node *node, double *load, dg_status *st) {
    (void)ctx;
    dg_status_reset(st);
    int n_out = dg_node_num_outputs(node);
    if (n_out != 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "op \"%s\" (%s) must have a single output for byte-size load "
                       "balancing, has %d",
                       dg_node_name(node), dg_node_op_type(node), n_out);
        return false;
    }
    dg_dtype dtype = dg_node_output_dtype(node, 0);
    dg_shape shape = dg_node_output_shape(node, 0);
    dg_dtype var_dtype;
    dg_shape var_shape;
    // A handle's own size says nothing about the variable behind it; its attributes do.
    if (is_handle_op(dg_node_op_type(node)) && dg_node_attr_type(node, "dtype", &var_dtype) &&
        dg_node_attr_shape(node, "shape", &var_shape)) {
        dtype = var_dtype;
        shape = var_shape;
    }
    if (!dg_shape_is_fully_defined(&shape)) {
        // As TensorFlow: variables are placed before their output shape is set.
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
    // A dtype without a size (none in distgraph yet) counts 0 bytes, as TensorFlow's
    // DType.size is 0 for strings, variants and resources.
    *load = (double)dg_shape_num_elements(&shape) * (double)dg_dtype_size(dtype);
    return true;
}

// numpy's argmin: the first minimum, or the first NaN if there is one.
static int argmin(const double *x, int n) {
    int best = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) return i;
        if (x[i] < x[best]) best = i;
    }
    return best;
}

// The strategy's choice of slot (0..ps_tasks-1) for node.
static bool choose_slot(setter_ctx *c, const dg_node *node, int *slot, dg_status *st) {
    if (c->strategy == DG_PS_ROUND_ROBIN) {
        *slot = c->next_slot;
        c->next_slot = (c->next_slot + 1) % c->ps_tasks;
        return true;
    }
    int best = argmin(c->loads, c->ps_tasks);
    double load = 0;
    if (!c->load_fn(c->load_ctx, node, &load, st)) {
        if (dg_status_code(st) == DG_OK)
            dg_status_setf(st, DG_INVALID_ARGUMENT, "load function failed for op \"%s\"",
                           dg_node_name(node));
        return false;
    }
    c->loads[best] += load;
    *slot = best;
    return true;
}

static bool is_ps_op(const setter_ctx *c, const char *op_type) {
    for (int i = 0; i < c->n_ps_ops; i++)
        if (strcmp(c->ps_ops[i], op_type) == 0) return true;
    return false;
}

static bool device_error(const setter_device *d, const char *which, dg_status *st) {
    dg_status_setf(st, DG_INVALID_ARGUMENT, "replica_device_setter: %s: %s", which, d->error);
    return false;
}

// A DeviceSpec job is truthy in Python when it is set and not "".
static bool has_job_text(const dg_device_name *d) { return d->has_job && d->job[0] != '\0'; }

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
    if (!dg_device_spec_from_string(current, &cur, st)) {
        dg_status_prepend(st, "replica_device_setter: op \"%s\"", dg_node_name(node));
        return false;
    }
    if (c->ps.is_set && is_ps_op(c, dg_node_op_type(node))) {
        if (c->ps.error) return device_error(&c->ps, "ps_device", st);
        dg_device_name ps = c->ps.spec;
        // The task is only chosen when ps_device has a job that the op's own job (if any) does
        // not change; an op pinned to another job keeps it and gets no task.
        if (has_job_text(&ps) && (!has_job_text(&cur) || strcmp(cur.job, ps.job) == 0)) {
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
    if (c->worker.error) return device_error(&c->worker, "worker_device", st);
    dg_device_name w = c->worker.spec;
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
    o.load_fn = NULL;
    o.load_ctx = NULL;
    return o;
}

// Parses s into d; a parse error is kept in d for the ops that need the device.
static bool read_device(const char *s, setter_device *d, dg_status *st) {
    d->is_set = s[0] != '\0';
    dg_status *err = dg_status_new();
    bool ok = err != NULL;
    if (ok && !dg_device_spec_from_string(s, &d->spec, err)) {
        memset(&d->spec, 0, sizeof d->spec);
        d->error = strdup(dg_status_message(err));
        ok = d->error != NULL;
    }
    dg_status_free(&err);
    if (!ok) base_oom(st, "replica_device_setter", strlen(s) + 1);
    return ok;
}

dg_device_fn *dg_replica_device_setter_new(const dg_replica_device_setter_options *opts,
                                           dg_status *st) {
    dg_status_reset(st);
    dg_replica_device_setter_options defaults = dg_replica_device_setter_options_default();
    if (!opts) opts = &defaults;
    // TensorFlow accepts a negative count and then hands out tasks 0, -1, ... (Python's
    // modulo of a negative number); distgraph refuses it.
    if (opts->ps_tasks < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "replica_device_setter: ps_tasks must be >= 0, got %d", opts->ps_tasks);
        return NULL;
    }
    if (opts->strategy != DG_PS_ROUND_ROBIN && opts->strategy != DG_PS_GREEDY_BYTES &&
        opts->strategy != DG_PS_GREEDY) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "replica_device_setter: unknown strategy %d",
                       (int)opts->strategy);
        return NULL;
    }
    if (opts->strategy == DG_PS_GREEDY && !opts->load_fn) {
        dg_status_set(st, DG_INVALID_ARGUMENT,
                      "replica_device_setter: the greedy strategy needs a load_fn");
        return NULL;
    }
    if (opts->ps_ops && opts->n_ps_ops < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "replica_device_setter: n_ps_ops must be >= 0, got %d", opts->n_ps_ops);
        return NULL;
    }
    int n_standard;
    const char *const *standard = dg_standard_ps_ops(&n_standard);
    const char *const *ps_ops = opts->ps_ops ? opts->ps_ops : standard;
    int n_ps_ops = opts->ps_ops ? opts->n_ps_ops : n_standard;
    for (int i = 0; i < n_ps_ops; i++) {
        if (!ps_ops[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "replica_device_setter: ps_ops[%d] is NULL", i);
            return NULL;
        }
    }

    dg_device_fn *fn = NULL;
    setter_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        base_oom(st, "replica_device_setter", sizeof *c);
        return NULL;
    }
    c->merge_devices = opts->merge_devices;
    c->strategy = opts->strategy;
    c->load_fn = opts->strategy == DG_PS_GREEDY ? opts->load_fn : dg_byte_size_load_fn;
    c->load_ctx = opts->load_ctx;

    // NULL means the default; "" means none, as a falsy device in Python.
    const char *ps_device = opts->ps_device ? opts->ps_device : "/job:ps";
    const char *worker_device = opts->worker_device ? opts->worker_device : "/job:worker";
    if (!read_device(ps_device, &c->ps, st) || !read_device(worker_device, &c->worker, st)) goto fail;

    c->ps_tasks = opts->ps_tasks;
    if (opts->cluster) {
        // TensorFlow reads ps_device's job here, so a malformed ps_device fails now. The
        // cluster decides the ps task count; a missing ps job means no ps placement.
        if (c->ps.error) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "replica_device_setter: ps_device: %s",
                           c->ps.error);
            goto fail;
        }
        const char *job = c->ps.spec.has_job ? c->ps.spec.job : NULL;
        c->ps_tasks = job ? dg_cluster_num_tasks(opts->cluster, job) : 0;
    }
    if (c->ps_tasks > 0) {
        size_t n = (size_t)c->ps_tasks;
        c->task_ids = malloc(n * sizeof *c->task_ids);
        c->loads = calloc(n, sizeof *c->loads);
        if (!c->task_ids || !c->loads) {
            base_oom(st, "replica_device_setter", n * (sizeof *c->task_ids + sizeof *c->loads));
            goto fail;
        }
        // With a cluster, slots map to the ps job's real (possibly sparse) task indices.
        for (int i = 0; i < c->ps_tasks; i++)
            c->task_ids[i] = opts->cluster ? dg_cluster_task_index(opts->cluster, c->ps.spec.job, i)
                                           : i;
    }

    if (n_ps_ops > 0) {
        c->ps_ops = calloc((size_t)n_ps_ops, sizeof *c->ps_ops);
        if (!c->ps_ops) {
            base_oom(st, "replica_device_setter", (size_t)n_ps_ops * sizeof *c->ps_ops);
            goto fail;
        }
        for (int i = 0; i < n_ps_ops; i++) {
            c->ps_ops[i] = strdup(ps_ops[i]);
            if (!c->ps_ops[i]) {
                base_oom(st, "replica_device_setter", strlen(ps_ops[i]) + 1);
                goto fail;
            }
            c->n_ps_ops = i + 1;
        }
    }

    fn = calloc(1, sizeof *fn);
    if (!fn) {
        base_oom(st, "replica_device_setter", sizeof *fn);
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
