/* The sync replicas optimizer as graph construction (TensorFlow's sync_replicas_optimizer.py):
 * accumulators per variable, the token queue, the worker's train op, the chief's apply op and
 * the init ops. The hook that runs them is runtime/sync_replicas_hook.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/ops.h"
#include "distgraph/sync_replicas.h"
#include "graph_impl.h"
#include "train_impl.h"

#define TOKEN_QUEUE "sync_token_q"

static const dg_output NUL = {NULL, 0};

struct dg_sync_replicas {
    dg_optimizer opt;
    dg_sync_replicas_options o;
    dg_graph *g;
    bool built;
    int n;                      // variables
    dg_output *num_acc;         // per variable, NumAccumulated
    dg_node *train, *chief_apply, *chief_init, *local_init, *close, *cancel, *set_live, *enqueue_extra;
    dg_output num_required, new_gs, local_step, close_code, close_reason, queue_size, live, extra_tokens;
    bool scaled;                // minimize_with_loss_scale: the chief applies through the scaler
    graph_loss_scaler scaler;
    dg_loss_scale *ls;          // borrowed for the build
};

dg_sync_replicas_options dg_sync_replicas_options_default(void) {
    dg_sync_replicas_options o;
    memset(&o, 0, sizeof o);
    o.replicas_to_aggregate = 1;
    return o;
}

dg_sync_replicas *dg_sync_replicas_new(const dg_optimizer *opt, const dg_sync_replicas_options *o,
                                       dg_status *st) {
    dg_status_reset(st);
    dg_sync_replicas_options d = o ? *o : dg_sync_replicas_options_default();
    if (d.total_num_replicas == 0) d.total_num_replicas = d.replicas_to_aggregate;
    if (!opt || !opt->graph || d.replicas_to_aggregate < 1 || d.total_num_replicas < d.replicas_to_aggregate ||
        d.task_index < 0 || d.task_index >= d.total_num_replicas || d.timeout_ms < 0 || d.token_timeout_ms < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "sync replicas: bad options (optimizer %s, replicas_to_aggregate %d, "
                       "total_num_replicas %d, task_index %d, timeout_ms %lld, token_timeout_ms %lld): need "
                       "1 <= replicas_to_aggregate <= total_num_replicas, 0 <= task_index < total_num_replicas "
                       "and timeouts >= 0", opt && opt->graph ? "given" : "missing", d.replicas_to_aggregate,
                       d.total_num_replicas, d.task_index, (long long)d.timeout_ms, (long long)d.token_timeout_ms);
        return NULL;
    }
    if (opt->gradient_wire_dtype != 0 && opt->gradient_wire_dtype != DG_FLOAT32) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "sync replicas: the optimizer's gradient_wire_dtype (%s) is for "
                       "dg_optimizer_minimize's push to a ps; leave it 0 here",
                       dg_dtype_name(opt->gradient_wire_dtype));
        return NULL;
    }
    if (d.token_timeout_ms == 0) d.token_timeout_ms = 2 * d.timeout_ms;
    dg_sync_replicas *sr = calloc(1, sizeof *sr);
    if (!sr) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "sync replicas: %zu bytes", sizeof *sr);
        return NULL;
    }
    sr->opt = *opt;
    sr->o = d;
    sr->g = opt->graph;
    return sr;
}

void dg_sync_replicas_free(dg_sync_replicas **srp) {
    if (!srp || !*srp) return;
    free((*srp)->num_acc);
    free(*srp);
    *srp = NULL;
}

// An accumulator op on the variable's device (the caller holds colocate_with(var)).
static dg_node *accum_op(dg_graph *g, const char *type, const char *name, const char *shared, dg_output var) {
    dg_node *n = graph_begin(g, type, name);
    if (!n) return NULL;
    graph_set_attr_string(n, "shared_name", shared);
    graph_set_attr_type(n, "dtype", dg_output_dtype(var));
    graph_set_attr_shape(n, "shape", dg_output_shape(var));
    return n;
}

static dg_node *queue_op(dg_graph *g, const char *type, const char *name) {
    dg_node *n = graph_begin(g, type, name);
    if (n) graph_set_attr_string(n, "shared_name", TOKEN_QUEUE);
    return n;
}

static dg_output out0(dg_node *n) {
    dg_output o = {n, 0};
    return n ? o : NUL;
}

dg_node *dg_sync_replicas_apply_gradients(dg_sync_replicas *sr, const dg_output *grads, const dg_output *vars,
                                          int n, dg_output gs, dg_status *st) {
    dg_status_reset(st);
    dg_graph *g = sr->g;
    if (sr->built) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "sync replicas: apply_gradients was already called");
        return NULL;
    }
    if (!dg_graph_check(g, st)) return NULL;
    if (n < 1 || !grads || !vars || !gs.node) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "sync replicas: apply_gradients needs at least one (gradient, "
                       "variable) pair and the global step (got %d pairs%s)", n, gs.node ? "" : ", no global step");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!grads[i].node || !vars[i].node || strcmp(dg_node_op_type(vars[i].node), "VariableV2") != 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "sync replicas: pair %d: %s", i,
                           !grads[i].node || !vars[i].node ? "a null output" : "not a variable");
            return NULL;
        }
    sr->built = true;
    sr->n = n;
    sr->num_acc = calloc((size_t)n, sizeof *sr->num_acc);
    dg_node **applies = calloc((size_t)n, sizeof *applies);
    dg_node **set_steps = calloc((size_t)n + 2, sizeof *set_steps);
    dg_node **cancels = calloc((size_t)n, sizeof *cancels);
    dg_node **set_lives = calloc((size_t)n + 1, sizeof *set_lives);
    dg_output *takes = calloc((size_t)n, sizeof *takes);
    if (!sr->num_acc || !applies || !set_steps || !cancels || !set_lives || !takes) abort();
    const dg_sync_replicas_options *o = &sr->o;
    dg_graph_push_name_scope(g, "sync_replicas");
    // The local step lives on this worker: colocated with an op the device scopes put here
    // (a device setter would send a variable to a ps). It is not a global variable, so neither
    // checkpoints nor the non-chiefs' readiness checks see it.
    dg_node *anchor = dg_no_op(g, "local_anchor");
    if (anchor) dg_graph_push_colocate_with(g, anchor);
    dg_node *ls = graph_begin(g, "VariableV2", "local_step");
    if (ls) {
        graph_set_attr_type(ls, "dtype", dg_output_dtype(gs));
        graph_set_attr_shape(ls, "shape", dg_shape_scalar());
        ls = graph_finish(ls);
    }
    sr->local_step = out0(ls);
    dg_output ls_init = dg_assign(g, "local_step_init", sr->local_step, gs);
    if (anchor) dg_graph_pop_colocate_with(g);
    sr->num_required = dg_placeholder(g, "num_required", DG_INT32, dg_shape_scalar());
    sr->live = dg_placeholder(g, "live_replicas", DG_INT32, dg_shape_scalar());
    // The tokens an apply enqueues, [count], with the global step (and the queue): like the local
    // step, in no collection, set by the chief's init and by set_live_replicas.
    dg_graph_push_colocate_with(g, gs.node);
    dg_node *tc = graph_begin(g, "VariableV2", "token_count");
    if (tc) {
        graph_set_attr_type(tc, "dtype", DG_INT64);
        graph_set_attr_shape(tc, "shape", dg_shape1(1));
        tc = graph_finish(tc);
    }
    dg_output token_count = out0(tc);
    int64_t total = o->total_num_replicas;
    dg_output tc_init = dg_assign(g, "token_count_init", token_count, dg_const_i64s(g, "total_tokens", &total, 1));
    // live > 0: that many tokens; 0 (no cap): total_num_replicas again.
    const int64_t one[1] = {1};
    dg_output live64 = dg_cast(g, NULL, sr->live, DG_INT64);
    dg_output tc_live = dg_assign(g, "token_count_live", token_count,
                                  dg_reshape(g, NULL, dg_where(g, NULL, dg_greater(g, NULL, live64, dg_scalar(g, NULL, DG_INT64, 0)),
                                                               live64, dg_scalar(g, NULL, DG_INT64, (double)total)),
                                             one, 1));
    dg_graph_pop_colocate_with(g);
    for (int i = 0; i < n && dg_graph_ok(g); i++) {
        char shared[600];
        snprintf(shared, sizeof shared, "%s/grad_accum", dg_node_name(vars[i].node));
        dg_graph_push_colocate_with(g, vars[i].node);
        dg_node *a = accum_op(g, "AccumulatorApplyGradient", "apply_grad", shared, vars[i]);
        if (a) {
            graph_add_input(a, sr->local_step);
            graph_add_input(a, grads[i]);
            graph_set_attr_int(a, "replica", o->task_index);
            applies[i] = graph_finish(a);
        }
        dg_node *t = accum_op(g, "AccumulatorTakeGradient", "take_grad", shared, vars[i]);
        if (t) {
            graph_add_input(t, sr->num_required);
            graph_set_attr_int(t, "timeout_ms", o->timeout_ms);
            graph_set_attr_int(t, "total_replicas", o->total_num_replicas);
            takes[i] = out0(graph_finish(t));
        }
        dg_node *s = accum_op(g, "AccumulatorSetGlobalStep", "set_global_step", shared, vars[i]);
        if (s) {
            graph_add_input(s, gs);
            set_steps[i] = graph_finish(s);
        }
        dg_node *c = accum_op(g, "AccumulatorNumAccumulated", "num_accumulated", shared, vars[i]);
        if (c) sr->num_acc[i] = out0(graph_finish(c));
        dg_node *x = accum_op(g, "AccumulatorCancelTake", "cancel_take", shared, vars[i]);
        if (x) cancels[i] = graph_finish(x);
        dg_node *l = accum_op(g, "AccumulatorSetLiveReplicas", "set_live_replicas", shared, vars[i]);
        if (l) {
            graph_add_input(l, sr->live);
            set_lives[i] = graph_finish(l);
        }
        dg_graph_pop_colocate_with(g);
    }
    // The worker: gradients in, then a token: the step its next gradients are computed at.
    if (dg_graph_ok(g)) {
        dg_graph_push_control_deps(g, applies, n);
        dg_graph_push_colocate_with(g, gs.node);
        dg_node *dq = queue_op(g, "QueueDequeue", "token");
        if (dq) {
            graph_set_attr_int(dq, "timeout_ms", o->token_timeout_ms);
            dq = graph_finish(dq);
        }
        dg_graph_pop_colocate_with(g);
        dg_graph_pop_control_deps(g);
        if (anchor) dg_graph_push_colocate_with(g, anchor);
        dg_output upd = dg_assign(g, "update_local_step", sr->local_step, out0(dq));
        if (anchor) dg_graph_pop_colocate_with(g);
        if (upd.node) sr->train = dg_group(g, "train", &upd.node, 1);
    }
    // The chief: the averages through the wrapped optimizer (which increments the global step),
    // then one token per replica holding the new step.
    if (dg_graph_ok(g)) {
        // With loss scaling the averages are of scaled gradients, each computed at the step the
        // take is for (older ones are stale), hence under the scale the apply reads.
        dg_node *applied = sr->scaled ? graph_loss_scale_apply(&sr->opt, &sr->scaler, takes, vars, n, gs, sr->ls)
                                      : dg_optimizer_apply_gradients(&sr->opt, takes, vars, n, gs, "apply");
        if (applied) {
            dg_graph_push_control_deps(g, &applied, 1);
            dg_graph_push_colocate_with(g, gs.node);
            // gs reads the variable's buffer, which the apply has updated in place.
            sr->new_gs = dg_identity(g, "new_global_step", gs);
            // As many tokens as the token count holds once the takes are done (set_live_replicas
            // changes it while they wait): total_num_replicas, or the live workers.
            dg_output tokens = dg_fill(g, "tokens", dg_identity(g, "num_tokens", token_count), sr->new_gs);
            dg_node *enq = queue_op(g, "QueueEnqueueMany", "enqueue_tokens");
            if (enq) {
                graph_add_input(enq, tokens);
                enq = graph_finish(enq);
            }
            dg_graph_pop_colocate_with(g);
            dg_graph_pop_control_deps(g);
            if (enq) sr->chief_apply = dg_group(g, "chief_apply", &enq, 1);
        }
    }
    if (dg_graph_ok(g)) {
        set_steps[n] = ls_init.node;
        set_steps[n + 1] = tc_init.node;
        sr->chief_init = dg_group(g, "chief_init", set_steps, n + 2);
        sr->local_init = dg_group(g, "local_step_init_op", &ls_init.node, 1);
        sr->cancel = dg_group(g, "cancel_takes", cancels, n);
        set_lives[n] = tc_live.node;
        sr->set_live = dg_group(g, "set_live_replicas", set_lives, n + 1);
        sr->close_code = dg_placeholder(g, "close_code", DG_INT32, dg_shape_scalar());
        sr->close_reason = dg_placeholder(g, "close_reason", DG_UINT8, dg_shape1(-1));
        dg_graph_push_colocate_with(g, gs.node);
        dg_node *cl = queue_op(g, "QueueClose", "close_queue");
        if (cl) {
            graph_add_input(cl, sr->close_code);
            graph_add_input(cl, sr->close_reason);
            sr->close = graph_finish(cl);
        }
        sr->extra_tokens = dg_placeholder(g, "extra_tokens", DG_INT64, dg_shape1(-1));
        dg_node *ex = queue_op(g, "QueueEnqueueMany", "enqueue_extra_tokens");
        if (ex) {
            graph_add_input(ex, sr->extra_tokens);
            sr->enqueue_extra = graph_finish(ex);
        }
        dg_node *qs = queue_op(g, "QueueSize", "queue_size");
        if (qs) sr->queue_size = out0(graph_finish(qs));
        dg_graph_pop_colocate_with(g);
    }
    dg_graph_pop_name_scope(g);
    free(applies);
    free(set_steps);
    free(cancels);
    free(set_lives);
    free(takes);
    if (!dg_graph_check(g, st)) return NULL;
    return sr->train;
}

dg_node *dg_sync_replicas_minimize(dg_sync_replicas *sr, dg_output loss, dg_output gs, dg_status *st) {
    dg_status_reset(st);
    dg_graph *g = sr->g;
    int cap = dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES);
    dg_output *grads = calloc((size_t)(cap ? cap : 1), sizeof *grads);
    dg_output *vars = calloc((size_t)(cap ? cap : 1), sizeof *vars);
    if (!grads || !vars) abort();
    int n = dg_optimizer_compute_gradients(&sr->opt, loss, NULL, 0, grads, vars, cap);
    dg_node *train = NULL;
    if (n >= 0) train = dg_sync_replicas_apply_gradients(sr, grads, vars, n, gs, st);
    else dg_graph_check(g, st);
    free(grads);
    free(vars);
    return train;
}

dg_node *dg_sync_replicas_minimize_with_loss_scale(dg_sync_replicas *sr, dg_output loss, dg_output gs,
                                                  const dg_loss_scale_options *o, dg_loss_scale *ls, dg_status *st) {
    dg_status_reset(st);
    if (ls) memset(ls, 0, sizeof *ls);
    dg_output scaled;
    if (sr->built || !graph_loss_scale_begin(sr->g, loss, gs, o, &sr->scaler, &scaled)) {
        if (sr->built) dg_graph_set_error(sr->g, DG_FAILED_PRECONDITION, "sync replicas: the ops are built already");
        dg_graph_check(sr->g, st);
        return NULL;
    }
    sr->scaled = true;
    sr->ls = ls;
    dg_node *train = dg_sync_replicas_minimize(sr, scaled, gs, st);
    sr->ls = NULL;
    return train;
}

dg_node *dg_sync_replicas_train_op(const dg_sync_replicas *sr) { return sr->train; }
dg_node *dg_sync_replicas_chief_apply_op(const dg_sync_replicas *sr) { return sr->chief_apply; }
dg_output dg_sync_replicas_num_required(const dg_sync_replicas *sr) { return sr->num_required; }
dg_output dg_sync_replicas_new_global_step(const dg_sync_replicas *sr) { return sr->new_gs; }
dg_node *dg_sync_replicas_chief_init_op(const dg_sync_replicas *sr) { return sr->chief_init; }
dg_node *dg_sync_replicas_local_step_init_op(const dg_sync_replicas *sr) { return sr->local_init; }
dg_output dg_sync_replicas_local_step(const dg_sync_replicas *sr) { return sr->local_step; }
dg_node *dg_sync_replicas_cancel_take_op(const dg_sync_replicas *sr) { return sr->cancel; }
dg_output dg_sync_replicas_queue_size(const dg_sync_replicas *sr) { return sr->queue_size; }

dg_node *dg_sync_replicas_enqueue_tokens_op(const dg_sync_replicas *sr, dg_output *tokens) {
    if (tokens) *tokens = sr->extra_tokens;
    return sr->enqueue_extra;
}

dg_node *dg_sync_replicas_set_live_op(const dg_sync_replicas *sr, dg_output *live) {
    if (live) *live = sr->live;
    return sr->set_live;
}
int dg_sync_replicas_num_variables(const dg_sync_replicas *sr) { return sr->n; }
const dg_sync_replicas_options *dg_sync_replicas_options_of(const dg_sync_replicas *sr) { return &sr->o; }

dg_output dg_sync_replicas_num_accumulated(const dg_sync_replicas *sr, int i) {
    return i >= 0 && i < sr->n ? sr->num_acc[i] : NUL;
}

dg_node *dg_sync_replicas_close_queue_op(const dg_sync_replicas *sr, dg_output *code, dg_output *reason) {
    if (code) *code = sr->close_code;
    if (reason) *reason = sr->close_reason;
    return sr->close;
}
