/* Op definitions of synchronous replicas (TensorFlow's SyncReplicasOptimizer): conditional
 * accumulators, one per trainable variable and colocated with it, and the token queue on the
 * task of the global step. Every op names its resource by the "shared_name" attribute; the
 * resource lives in the task's resource manager, so all workers' graphs share it by name.
 * Accumulator ops carry the gradient's "dtype" and "shape"; the queue holds int64 tokens. */
#include <stdio.h>
#include <string.h>

#include "graph_impl.h"

static dg_dtype in_dt(const dg_node *n, int i) { return dg_output_dtype(n->inputs[i]); }
static dg_shape in_sh(const dg_node *n, int i) { return dg_output_shape(n->inputs[i]); }

static bool need_shared_name(const dg_node *n, const char *kind, dg_status *st) {
    const char *s = dg_node_attr_string(n, "shared_name");
    if (s && *s) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "%s op needs a non-empty \"shared_name\" attribute", kind);
    return false;
}

// An accumulator's dtype (float32/float64) and fully defined shape.
static bool accum_attrs(const dg_node *n, dg_dtype *dt, dg_shape *sh, dg_status *st) {
    if (!need_shared_name(n, "accumulator", st)) return false;
    const char *name = dg_node_attr_string(n, "shared_name");
    if (!dg_node_attr_type(n, "dtype", dt) || !dg_dtype_is_float(*dt)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "accumulator \"%s\": \"dtype\" must be float32 or float64", name);
        return false;
    }
    if (!dg_node_attr_shape(n, "shape", sh) || !dg_shape_is_fully_defined(sh)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "accumulator \"%s\": \"shape\" must be fully defined", name);
        return false;
    }
    return true;
}

// Input i must be a scalar (or of unknown shape) of dtype want.
static bool scalar_input(const dg_node *n, int i, dg_dtype want, const char *what, dg_status *st) {
    dg_shape s = in_sh(n, i);
    if (in_dt(n, i) == want && s.rank <= 0) return true;
    char b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (%s, \"%s\") must be a %s scalar, got %s %s", i, what,
                   n->inputs[i].node->name, dg_dtype_name(want), dg_dtype_name(in_dt(n, i)),
                   dg_shape_str(&s, b, sizeof b));
    return false;
}

static bool vector_input(const dg_node *n, int i, dg_dtype want, const char *what, dg_status *st) {
    dg_shape s = in_sh(n, i);
    if (in_dt(n, i) == want && (s.rank < 0 || s.rank == 1)) return true;
    char b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (%s, \"%s\") must be a %s vector, got %s %s", i, what,
                   n->inputs[i].node->name, dg_dtype_name(want), dg_dtype_name(in_dt(n, i)),
                   dg_shape_str(&s, b, sizeof b));
    return false;
}

// (local_step int64, gradient) -> nothing; attr replica: the worker's task index (-1: unknown).
static bool infer_apply_gradient(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    if (!accum_attrs(n, &dt, &sh, st) || !scalar_input(n, 0, DG_INT64, "local_step", st)) return false;
    dg_shape g = in_sh(n, 1);
    if (in_dt(n, 1) != dt || !dg_shape_compatible(&g, &sh)) {
        char a[128], b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "accumulator \"%s\" holds %s %s gradients, got %s %s from \"%s\"",
                       dg_node_attr_string(n, "shared_name"), dg_dtype_name(dt), dg_shape_str(&sh, a, sizeof a),
                       dg_dtype_name(in_dt(n, 1)), dg_shape_str(&g, b, sizeof b), n->inputs[1].node->name);
        return false;
    }
    return graph_set_num_outputs(n, 0, st);
}

// (num_required int32) -> the average of the gradients taken.
static bool infer_take_gradient(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    if (!accum_attrs(n, &dt, &sh, st) || !scalar_input(n, 0, DG_INT32, "num_required", st)) return false;
    graph_set_num_outputs(n, 1, st);
    graph_set_output(n, 0, dt, sh);
    return true;
}

// (new_global_step int64) -> nothing.
static bool infer_set_global_step(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    return accum_attrs(n, &dt, &sh, st) && scalar_input(n, 0, DG_INT64, "new_global_step", st) &&
           graph_set_num_outputs(n, 0, st);
}

// () -> int32 scalar.
static bool infer_num_accumulated(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    if (!accum_attrs(n, &dt, &sh, st)) return false;
    graph_set_num_outputs(n, 1, st);
    graph_set_output(n, 0, DG_INT32, dg_shape_scalar());
    return true;
}

// () -> nothing: fails the takes waiting on the accumulator (CANCELLED).
static bool infer_cancel_take(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    return accum_attrs(n, &dt, &sh, st) && graph_set_num_outputs(n, 0, st);
}

// (live int32 scalar) -> nothing: a take needs at most live gradients (0: no cap).
static bool infer_set_live(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    return accum_attrs(n, &dt, &sh, st) && scalar_input(n, 0, DG_INT32, "live", st) &&
           graph_set_num_outputs(n, 0, st);
}

// (tokens int64 [n]) -> nothing.
static bool infer_enqueue_many(dg_node *n, dg_status *st) {
    return need_shared_name(n, "queue", st) && vector_input(n, 0, DG_INT64, "values", st) &&
           graph_set_num_outputs(n, 0, st);
}

// () -> int64 scalar.
static bool infer_dequeue(dg_node *n, dg_status *st) {
    if (!need_shared_name(n, "queue", st)) return false;
    graph_set_num_outputs(n, 1, st);
    graph_set_output(n, 0, DG_INT64, dg_shape_scalar());
    return true;
}

static bool infer_queue_size(dg_node *n, dg_status *st) {
    if (!need_shared_name(n, "queue", st)) return false;
    graph_set_num_outputs(n, 1, st);
    graph_set_output(n, 0, DG_INT32, dg_shape_scalar());
    return true;
}

// (code int32, reason uint8 [n]) -> nothing.
static bool infer_queue_close(dg_node *n, dg_status *st) {
    return need_shared_name(n, "queue", st) && scalar_input(n, 0, DG_INT32, "code", st) &&
           vector_input(n, 1, DG_UINT8, "reason", st) && graph_set_num_outputs(n, 0, st);
}

// The coordinator of an elastic group (runtime/training/elastic.c): (task int64, kind int64,
// epoch_seen int64, lost int64 [n], fingerprint int64) -> int64 [1 + members]: the epoch, then
// its members in rank order. Attributes: shared_name, group_job, min_members (>= 1), barrier_timeout_ms (>= 1),
// timeout_ms (>= 0; 0: no deadline), log (0 or 1: a line per epoch on stderr).
static bool infer_elastic_rendezvous(dg_node *n, dg_status *st) {
    if (!need_shared_name(n, "elastic coordinator", st)) return false;
    const char *job = dg_node_attr_string(n, "group_job");
    int64_t min_members = 0, barrier = 0, timeout = 0;
    if (!job || !*job || !dg_node_attr_int(n, "min_members", &min_members) || min_members < 1 ||
        min_members > 1024 || !dg_node_attr_int(n, "barrier_timeout_ms", &barrier) || barrier < 1 ||
        (dg_node_attr_int(n, "timeout_ms", &timeout) && timeout < 0)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "elastic coordinator \"%s\": needs \"group_job\", \"min_members\" in 1..1024, "
                       "\"barrier_timeout_ms\" >= 1 and \"timeout_ms\" >= 0",
                       dg_node_attr_string(n, "shared_name"));
        return false;
    }
    if (!scalar_input(n, 0, DG_INT64, "task", st) || !scalar_input(n, 1, DG_INT64, "kind", st) ||
        !scalar_input(n, 2, DG_INT64, "epoch_seen", st) || !vector_input(n, 3, DG_INT64, "lost", st) ||
        !scalar_input(n, 4, DG_INT64, "fingerprint", st))
        return false;
    graph_set_num_outputs(n, 1, st);
    graph_set_output(n, 0, DG_INT64, dg_shape1(-1));
    return true;
}

#define S_(name_, lo, hi, infer_) {name_, lo, hi, true, false, true, infer_, NULL}

static const graph_op_def sync_op_defs[] = {
    S_("AccumulatorApplyGradient", 2, 2, infer_apply_gradient),
    S_("AccumulatorTakeGradient", 1, 1, infer_take_gradient),
    S_("AccumulatorSetGlobalStep", 1, 1, infer_set_global_step),
    S_("AccumulatorNumAccumulated", 0, 0, infer_num_accumulated),
    S_("AccumulatorCancelTake", 0, 0, infer_cancel_take),
    S_("AccumulatorSetLiveReplicas", 1, 1, infer_set_live),
    S_("QueueEnqueueMany", 1, 1, infer_enqueue_many),
    S_("QueueDequeue", 0, 0, infer_dequeue),
    S_("QueueSize", 0, 0, infer_queue_size),
    S_("QueueClose", 2, 2, infer_queue_close),
    S_("ElasticRendezvous", 5, 5, infer_elastic_rendezvous),
};

int graph_sync_op_defs(const graph_op_def **defs) {
    *defs = sync_op_defs;
    return (int)(sizeof sync_op_defs / sizeof sync_op_defs[0]);
}
