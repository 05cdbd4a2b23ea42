/* Optimizers and the global step, as graph construction (TensorFlow's training/optimizer.py,
 * gradient_descent.py, momentum.py, adam.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"
#include "graph_impl.h"
#include "status_impl.h"
#include "train_impl.h"

static const dg_output NUL = {NULL, 0};

dg_output dg_global_step(dg_graph *g) {
    if (dg_graph_collection_size(g, DG_GLOBAL_STEP) > 0) {
        dg_output o = {dg_graph_collection_get(g, DG_GLOBAL_STEP, 0), 0};
        return o;
    }
    dg_output v = dg_variable_ex(g, "global_step", DG_INT64, dg_shape_scalar(), dg_init_zeros(), false);
    if (v.node) dg_graph_add_to_collection(g, DG_GLOBAL_STEP, v.node);
    return v;
}

static dg_optimizer base(dg_graph *g, dg_optimizer_kind k, double lr, const char *name) {
    dg_optimizer o;
    memset(&o, 0, sizeof o);
    o.kind = k;
    o.graph = g;
    o.learning_rate = lr;
    o.name = name;
    return o;
}

dg_optimizer dg_gradient_descent(dg_graph *g, double lr) {
    return base(g, DG_OPT_GRADIENT_DESCENT, lr, "GradientDescent");
}

dg_optimizer dg_momentum(dg_graph *g, double lr, double momentum, bool use_nesterov) {
    dg_optimizer o = base(g, DG_OPT_MOMENTUM, lr, "Momentum");
    o.momentum = momentum;
    o.use_nesterov = use_nesterov;
    return o;
}

dg_optimizer dg_adam(dg_graph *g, double lr) {
    dg_optimizer o = base(g, DG_OPT_ADAM, lr, "Adam");
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.epsilon = 1e-8;
    return o;
}

dg_optimizer dg_adamw(dg_graph *g, double lr, double weight_decay) {
    dg_optimizer o = dg_adam(g, lr);
    o.kind = DG_OPT_ADAMW;
    o.name = "AdamW";
    o.weight_decay = weight_decay;
    return o;
}

dg_optimizer dg_adagrad(dg_graph *g, double lr, double initial_accumulator_value) {
    dg_optimizer o = base(g, DG_OPT_ADAGRAD, lr, "Adagrad");
    o.initial_accumulator_value = initial_accumulator_value;
    return o;
}

dg_optimizer dg_rmsprop(dg_graph *g, double lr, double rho, double momentum, double epsilon) {
    dg_optimizer o = base(g, DG_OPT_RMSPROP, lr, "RMSProp");
    o.rho = rho;
    o.momentum = momentum;
    o.epsilon = epsilon;
    return o;
}

int dg_optimizer_compute_gradients(const dg_optimizer *opt, dg_output loss, const dg_output *vars,
                                   int n_vars, dg_output *grads, dg_output *vars_out, int cap) {
    dg_graph *g = opt->graph;
    if (!dg_graph_ok(g)) return -1;
    if (!loss.node) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "compute_gradients: loss is the null output");
        return -1;
    }
    int n = vars ? n_vars : dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES);
    dg_output *xs = calloc((size_t)(n ? n : 1), sizeof *xs);
    dg_output *dx = calloc((size_t)(n ? n : 1), sizeof *dx);
    if (!xs || !dx) abort();
    for (int i = 0; i < n; i++) {
        if (vars) {
            xs[i] = vars[i];
        } else {
            xs[i].node = dg_graph_collection_get(g, DG_TRAINABLE_VARIABLES, i);
            xs[i].index = 0;
        }
    }
    int k = -1;
    dg_gradients_options gopts = {.colocate_gradients_with_ops = opt->colocate_gradients_with_ops};
    if (dg_gradients_ex(g, &loss, 1, xs, n, NULL, &gopts, dx)) {
        k = 0;
        for (int i = 0; i < n; i++) {
            if (!dx[i].node) continue;
            if (k >= cap) {
                dg_graph_set_error(g, DG_INVALID_ARGUMENT, "compute_gradients: more than %d "
                                   "gradients for a buffer of %d", k, cap);
                k = -1;
                break;
            }
            grads[k] = dx[i];
            vars_out[k] = xs[i];
            k++;
        }
    }
    free(xs);
    free(dx);
    return k;
}

// A slot variable "<var>/<name>" initialised to zeros, colocated with var.
static dg_output make_slot_init(dg_graph *g, dg_output var, const char *name, dg_initializer init);
static dg_output make_slot(dg_graph *g, dg_output var, const char *name) {
    return make_slot_init(g, var, name, dg_init_zeros());
}

static dg_output make_slot_init(dg_graph *g, dg_output var, const char *name, dg_initializer init) {
    char full[600];
    snprintf(full, sizeof full, "%s/%s", dg_node_name(var.node), name);
    dg_graph_push_colocate_with(g, var.node);
    bool reuse;
    (void)graph_variable_scope(g, &reuse);
    graph_push_absolute_scope(g, "");
    dg_output s = dg_variable_ex(g, full, dg_output_dtype(var), dg_output_shape(var), init, false);
    dg_graph_pop_name_scope(g);
    dg_graph_pop_colocate_with(g);
    return s;
}

static dg_output hyper(dg_graph *g, dg_dtype t, const char *name, double v) {
    return dg_scalar(g, name, t, v);
}

// The learning rate of opt as an input of an update of dtype t.
static dg_output learning_rate(dg_graph *g, const dg_optimizer *opt, dg_dtype t) {
    dg_output lr = opt->learning_rate_tensor;
    if (!lr.node) return hyper(g, t, "learning_rate", opt->learning_rate);
    return dg_output_dtype(lr) == t ? lr : dg_cast(g, "learning_rate", lr, t);
}

dg_output dg_exponential_decay(dg_graph *g, double learning_rate, dg_output global_step, double decay_steps,
                               double decay_rate) {
    const dg_output none = {NULL, 0};
    if (!g || !dg_graph_ok(g)) return none;
    if (!global_step.node || !(decay_steps > 0) || !(decay_rate > 0)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "exponential_decay: needs a global step, decay_steps > 0 and "
                           "decay_rate > 0 (got %g and %g)", decay_steps, decay_rate);
        return none;
    }
    dg_graph_push_name_scope(g, "ExponentialDecay");
    // lr * exp(log(rate) * step / steps), in float64, then float32 as TensorFlow's.
    dg_output p = dg_div(g, NULL, dg_cast(g, NULL, global_step, DG_FLOAT64), dg_scalar(g, NULL, DG_FLOAT64, decay_steps));
    dg_output f = dg_exp(g, NULL, dg_mul(g, NULL, p, dg_scalar(g, NULL, DG_FLOAT64, log(decay_rate))));
    dg_output lr = dg_mul(g, NULL, f, dg_scalar(g, NULL, DG_FLOAT64, learning_rate));
    dg_output out = dg_cast(g, "learning_rate", lr, DG_FLOAT32);
    dg_graph_pop_name_scope(g);
    return out;
}

dg_output dg_warmup_cosine_decay(dg_graph *g, const char *name, dg_output global_step, double peak,
                                 int64_t warmup_steps, int64_t decay_steps, double final) {
    const dg_output none = {NULL, 0};
    const char *what = name ? name : "WarmupCosineDecay";
    if (!g || !dg_graph_ok(g)) return none;
    if (!global_step.node || warmup_steps < 0 || decay_steps <= 0 || !(final >= 0) || !(peak >= final) ||
        !(peak < 1e30)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "warmup_cosine_decay \"%s\": needs a global step, warmup_steps "
                           ">= 0, decay_steps > 0 and 0 <= final <= peak (got %lld, %lld, final %g, peak %g)", what,
                           (long long)warmup_steps, (long long)decay_steps, final, peak);
        return none;
    }
    dg_graph_push_name_scope(g, what);
    dg_output s = dg_cast(g, NULL, global_step, DG_FLOAT64);
    dg_output w = dg_scalar(g, NULL, DG_FLOAT64, (double)warmup_steps);
    // The warmup ramp (0 when there is none), and the decay's fraction clipped to [0, 1].
    dg_output ramp = warmup_steps ? dg_mul(g, NULL, s, dg_scalar(g, NULL, DG_FLOAT64, peak / (double)warmup_steps))
                                  : dg_scalar(g, NULL, DG_FLOAT64, peak);
    dg_output frac = dg_clip_by_value(g, NULL, dg_div(g, NULL, dg_sub(g, NULL, s, w),
                                                      dg_scalar(g, NULL, DG_FLOAT64, (double)decay_steps)),
                                      dg_scalar(g, NULL, DG_FLOAT64, 0), dg_scalar(g, NULL, DG_FLOAT64, 1));
    dg_output c = dg_cos(g, NULL, dg_mul(g, NULL, frac, dg_scalar(g, NULL, DG_FLOAT64, 3.14159265358979323846)));
    dg_output cosine = dg_add(g, NULL, dg_scalar(g, NULL, DG_FLOAT64, final),
                              dg_mul(g, NULL, dg_add(g, NULL, c, dg_scalar(g, NULL, DG_FLOAT64, 1)),
                                     dg_scalar(g, NULL, DG_FLOAT64, (peak - final) / 2)));
    dg_output lr = dg_where(g, NULL, dg_less(g, NULL, s, w), ramp, cosine);
    dg_output out = dg_cast(g, "learning_rate", lr, DG_FLOAT32);
    dg_graph_pop_name_scope(g);
    return out;
}

dg_output dg_piecewise_constant(dg_graph *g, const char *name, dg_output global_step, const int64_t *boundaries,
                                int n_boundaries, const double *values) {
    const dg_output none = {NULL, 0};
    const char *what = name ? name : "PiecewiseConstant";
    if (!g || !dg_graph_ok(g)) return none;
    if (!global_step.node || n_boundaries < 0 || n_boundaries > 100000 || !values || (n_boundaries > 0 && !boundaries)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "piecewise_constant \"%s\": needs a global step, 0 to 100000 "
                           "boundaries and one more value than boundaries (got %d boundaries)", what, n_boundaries);
        return none;
    }
    for (int i = 1; i < n_boundaries; i++)
        if (boundaries[i] <= boundaries[i - 1]) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "piecewise_constant \"%s\": boundaries must increase, but "
                               "boundary %d is %lld after %lld", what, i, (long long)boundaries[i],
                               (long long)boundaries[i - 1]);
            return none;
        }
    dg_graph_push_name_scope(g, what);
    // Exactly one indicator [b(i-1) < step] - [b(i) < step] is 1: the sum is the value itself.
    dg_output step = dg_cast(g, NULL, global_step, DG_INT64), sum = {NULL, 0};
    dg_output above_prev = dg_scalar(g, NULL, DG_FLOAT32, 1.0);
    for (int i = 0; i <= n_boundaries; i++) {
        dg_output above = i < n_boundaries ? dg_cast(g, NULL, dg_greater(g, NULL, step, dg_scalar(g, NULL, DG_INT64,
                                                                                                   (double)boundaries[i])),
                                                     DG_FLOAT32)
                                           : dg_scalar(g, NULL, DG_FLOAT32, 0.0);
        dg_output term = dg_mul(g, NULL, dg_sub(g, NULL, above_prev, above), dg_scalar(g, NULL, DG_FLOAT32, values[i]));
        sum = sum.node ? dg_add(g, NULL, sum, term) : term;
        above_prev = above;
    }
    dg_output out = dg_identity(g, "learning_rate", sum);
    dg_graph_pop_name_scope(g);
    return out;
}

static bool is_adam(const dg_optimizer *opt) { return opt->kind == DG_OPT_ADAM || opt->kind == DG_OPT_ADAMW; }

// Whether AdamW decays var: the user's rule, or rank >= 2.
static bool decays(const dg_optimizer *opt, dg_output var) {
    if (opt->kind != DG_OPT_ADAMW || !(opt->weight_decay > 0)) return false;
    if (opt->decay_filter) return opt->decay_filter(var, opt->decay_filter_arg);
    return dg_output_shape(var).rank >= 2;
}

// ApplyAdam or SparseApplyAdam begun with its inputs up to the gradient (the sparse one's
// indices follow).
static dg_node *adam_update(dg_graph *g, const char *op, const dg_optimizer *opt, dg_output v, dg_output m,
                            dg_output vs, dg_output b1p, dg_output b2p, dg_output grad) {
    dg_dtype vt = dg_output_dtype(v);
    dg_node *u = graph_begin(g, op, NULL);
    dg_output ins[10] = {v, m, vs, b1p, b2p};
    ins[5] = learning_rate(g, opt, vt);   // made in this order: the nodes' names and ids do not vary
    ins[6] = hyper(g, vt, "beta1", opt->beta1);
    ins[7] = hyper(g, vt, "beta2", opt->beta2);
    ins[8] = hyper(g, vt, "epsilon", opt->epsilon);
    ins[9] = grad;
    for (int k = 0; u && k < 10; k++) graph_add_input(u, ins[k]);
    return u;
}

// apply_gradients; with gate (a bool scalar, else the null output) the updates apply only when it
// is true: ApplyGradientDescent, ApplyMomentum and ApplyAdam take it as their last input, AdamW's
// decay and Adam's beta powers keep their values when it is false, the global step advances
// either way. Other kinds and sparse gradients are not gated (UNIMPLEMENTED).
static dg_node *apply_gated(const dg_optimizer *opt, const dg_output *grads, const dg_output *vars, int n,
                            dg_output global_step, const char *name, dg_output gate) {
    dg_graph *g = opt->graph;
    if (!dg_graph_ok(g)) return NULL;
    if (n < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "apply_gradients: no gradients given (does the "
                           "loss depend on any trainable variable?)");
        return NULL;
    }
    if (opt->kind == DG_OPT_ADAMW && !(opt->weight_decay >= 0 && opt->weight_decay < 1e30)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s: weight_decay must be finite and >= 0, got %g",
                           opt->name ? opt->name : "AdamW", opt->weight_decay);
        return NULL;
    }
    if ((opt->kind == DG_OPT_ADAGRAD && !(opt->initial_accumulator_value > 0)) ||
        (opt->kind == DG_OPT_RMSPROP && (!(opt->rho >= 0 && opt->rho < 1) || !(opt->momentum >= 0) ||
                                         !(opt->epsilon > 0)))) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s: initial_accumulator_value must be > 0 (Adagrad); rho in "
                           "[0, 1), momentum >= 0 and epsilon > 0 (RMSProp)", opt->name ? opt->name : "optimizer");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!grads[i].node || !vars[i].node) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "apply_gradients: pair %d has a null output", i);
            return NULL;
        }
        if (strcmp(dg_node_op_type(vars[i].node), "VariableV2") != 0) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "apply_gradients: \"%s\" is not a variable",
                               dg_node_name(vars[i].node));
            return NULL;
        }
        dg_output sv, si;
        if (gate.node && dg_gradient_is_sparse(grads[i], &sv, &si)) {
            dg_graph_set_error(g, DG_UNIMPLEMENTED, "loss scaling: the gradient of \"%s\" is sparse (an embedding "
                               "lookup's); the skip of a step with gradients that are not finite takes dense "
                               "gradients only", dg_node_name(vars[i].node));
            return NULL;
        }
    }
    if (gate.node && opt->kind != DG_OPT_GRADIENT_DESCENT && opt->kind != DG_OPT_MOMENTUM && !is_adam(opt)) {
        dg_graph_set_error(g, DG_UNIMPLEMENTED, "loss scaling: %s cannot skip a step yet; use gradient descent, "
                           "momentum, Adam or AdamW", opt->name ? opt->name : "this optimizer");
        return NULL;
    }
    if (!(opt->global_clipnorm >= 0 && opt->global_clipnorm < 1e300)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s: global_clipnorm must be >= 0 (0: none), got %g",
                           opt->name ? opt->name : "optimizer", opt->global_clipnorm);
        return NULL;
    }
    dg_output *clipped = NULL;
    if (opt->global_clipnorm > 0) {
        clipped = calloc((size_t)n, sizeof *clipped);
        if (!clipped) abort();
        dg_graph_push_name_scope(g, "clip_by_global_norm");
        dg_clip_by_global_norm(g, grads, n, opt->global_clipnorm, clipped, NULL);
        dg_graph_pop_name_scope(g);
        if (!dg_graph_ok(g)) {
            free(clipped);
            return NULL;
        }
        grads = clipped;
    }
    const char *oname = opt->name ? opt->name : "Optimizer";
    dg_output *slot1 = calloc((size_t)n, sizeof *slot1), *slot2 = calloc((size_t)n, sizeof *slot2);
    dg_node **updates = calloc((size_t)n + 2, sizeof *updates);
    dg_node **grad_nodes = calloc((size_t)n * 2 + 1, sizeof *grad_nodes);
    if (!slot1 || !slot2 || !updates || !grad_nodes) abort();
    dg_output b1p = NUL, b2p = NUL;
    // Slots and non-slot variables first, outside the control-dependency scope below, so
    // their initializers do not depend on the gradients.
    for (int i = 0; i < n; i++) {
        if (opt->kind == DG_OPT_MOMENTUM) slot1[i] = make_slot(g, vars[i], oname);
        if (opt->kind == DG_OPT_ADAGRAD)
            slot1[i] = make_slot_init(g, vars[i], oname, dg_init_constant(opt->initial_accumulator_value));
        if (opt->kind == DG_OPT_RMSPROP) {
            char b[128];
            slot1[i] = make_slot_init(g, vars[i], oname, dg_init_ones());
            snprintf(b, sizeof b, "%s_1", oname);
            slot2[i] = make_slot(g, vars[i], b);
        }
        if (is_adam(opt)) {
            char b[128];
            slot1[i] = make_slot(g, vars[i], oname);
            snprintf(b, sizeof b, "%s_1", oname);
            slot2[i] = make_slot(g, vars[i], b);
        }
    }
    dg_dtype t = dg_output_dtype(vars[0]);
    if (is_adam(opt)) {
        dg_graph_push_colocate_with(g, vars[0].node);
        b1p = dg_variable_ex(g, "beta1_power", t, dg_shape_scalar(), dg_init_constant(opt->beta1), false);
        b2p = dg_variable_ex(g, "beta2_power", t, dg_shape_scalar(), dg_init_constant(opt->beta2), false);
        dg_graph_pop_colocate_with(g);
    }
    // Updates wait for every gradient; for a sparse one, for its rows and indices (its dense
    // form never runs).
    int n_grad_nodes = 0;
    for (int i = 0; i < n; i++) {
        dg_output sv, si;
        if (dg_gradient_is_sparse(grads[i], &sv, &si)) {
            grad_nodes[n_grad_nodes++] = sv.node;
            grad_nodes[n_grad_nodes++] = si.node;
        } else {
            grad_nodes[n_grad_nodes++] = grads[i].node;
        }
    }
    dg_graph_push_name_scope(g, name ? name : oname);
    dg_graph_push_control_deps(g, grad_nodes, n_grad_nodes);
    for (int i = 0; i < n && dg_graph_ok(g); i++) {
        dg_output v = vars[i];
        dg_dtype vt = dg_output_dtype(v);
        char scope[600];
        snprintf(scope, sizeof scope, "update_%s", dg_node_name(v.node));
        dg_graph_push_name_scope(g, scope);
        dg_graph_push_colocate_with(g, v.node);
        dg_node *u = NULL, *composed = NULL;   // composed: an update built of Assign ops
        dg_output sv, si;   // a sparse gradient's rows and indices
        bool sparse = dg_gradient_is_sparse(grads[i], &sv, &si);
        // AdamW: var -= lr * weight_decay * var first; Adam's update waits for it.
        dg_node *decay = NULL;
        if (decays(opt, v)) {
            dg_output rate = dg_mul(g, NULL, learning_rate(g, opt, vt), hyper(g, vt, "weight_decay", opt->weight_decay));
            dg_output amount = dg_mul(g, NULL, rate, v);
            if (gate.node) amount = dg_where(g, NULL, gate, amount, dg_zeros_like(g, NULL, amount));
            decay = dg_assign_sub(g, "weight_decay", v, amount).node;
            if (decay) dg_graph_push_control_deps(g, &decay, 1);
        }
        if (sparse && opt->kind == DG_OPT_GRADIENT_DESCENT) {
            // TensorFlow 1: var[indices] -= lr * rows, repeated indices adding up.
            composed = dg_scatter_sub(g, "update", v, si, dg_mul(g, NULL, sv, learning_rate(g, opt, vt))).node;
        } else if (sparse && opt->kind == DG_OPT_ADAGRAD) {
            u = graph_begin(g, "SparseApplyAdagrad", NULL);
            graph_add_input(u, v);
            graph_add_input(u, slot1[i]);
            graph_add_input(u, learning_rate(g, opt, vt));
            graph_add_input(u, sv);
            graph_add_input(u, si);
        } else if (sparse && opt->kind == DG_OPT_MOMENTUM) {
            u = graph_begin(g, "SparseApplyMomentum", NULL);
            graph_add_input(u, v);
            graph_add_input(u, slot1[i]);
            graph_add_input(u, learning_rate(g, opt, vt));
            graph_add_input(u, sv);
            graph_add_input(u, si);
            graph_add_input(u, hyper(g, vt, "momentum", opt->momentum));
            graph_set_attr_bool(u, "use_nesterov", opt->use_nesterov);
        } else if (sparse && is_adam(opt)) {
            u = adam_update(g, "SparseApplyAdam", opt, v, slot1[i], slot2[i], b1p, b2p, sv);
            graph_add_input(u, si);
        } else {
            switch (opt->kind) {
            case DG_OPT_GRADIENT_DESCENT:
                u = graph_begin(g, "ApplyGradientDescent", NULL);
                graph_add_input(u, v);
                graph_add_input(u, learning_rate(g, opt, vt));
                graph_add_input(u, grads[i]);
                break;
            case DG_OPT_MOMENTUM:
                u = graph_begin(g, "ApplyMomentum", NULL);
                graph_add_input(u, v);
                graph_add_input(u, slot1[i]);
                graph_add_input(u, learning_rate(g, opt, vt));
                graph_add_input(u, grads[i]);
                graph_add_input(u, hyper(g, vt, "momentum", opt->momentum));
                graph_set_attr_bool(u, "use_nesterov", opt->use_nesterov);
                break;
            case DG_OPT_ADAM:
            case DG_OPT_ADAMW:
                u = adam_update(g, "ApplyAdam", opt, v, slot1[i], slot2[i], b1p, b2p, grads[i]);
                break;
            case DG_OPT_ADAGRAD: {
                // accum += g^2; var -= lr * g / sqrt(accum): the update reads the new accum.
                dg_output acc = dg_assign_add(g, "accum", slot1[i], dg_square(g, NULL, grads[i]));
                dg_output step = dg_div(g, NULL, dg_mul(g, NULL, learning_rate(g, opt, vt), grads[i]), dg_sqrt(g, NULL, acc));
                composed = dg_assign_sub(g, "update", v, step).node;
                break;
            }
            case DG_OPT_RMSPROP: {
                dg_output ms = slot1[i], mom = slot2[i];
                dg_output ms_new = dg_assign(g, "ms", ms, dg_add(g, NULL, dg_mul(g, NULL, hyper(g, vt, "rho", opt->rho), ms),
                                                                  dg_mul(g, NULL, hyper(g, vt, "one_minus_rho", 1 - opt->rho),
                                                                         dg_square(g, NULL, grads[i]))));
                dg_output scaled = dg_div(g, NULL, dg_mul(g, NULL, learning_rate(g, opt, vt), grads[i]),
                                          dg_sqrt(g, NULL, dg_add(g, NULL, ms_new, hyper(g, vt, "epsilon", opt->epsilon))));
                dg_output mom_new = dg_assign(g, "mom", mom,
                                              dg_add(g, NULL, dg_mul(g, NULL, hyper(g, vt, "momentum", opt->momentum), mom), scaled));
                composed = dg_assign_sub(g, "update", v, mom_new).node;
                break;
            }
            }
        }
        if (u && gate.node) graph_add_input(u, gate);   // dense GD, momentum, Adam: checked above
        updates[i] = composed ? composed : graph_finish(u);
        if (decay) dg_graph_pop_control_deps(g);
        dg_graph_pop_colocate_with(g);
        dg_graph_pop_name_scope(g);
    }
    dg_graph_pop_control_deps(g);
    int n_up = n;
    if (is_adam(opt) && dg_graph_ok(g)) {
        // beta powers advance after every update has read them.
        dg_graph_push_control_deps(g, updates, n);
        dg_graph_push_colocate_with(g, vars[0].node);
        // Built in this order (beta1's update whole, then beta2's): the nodes' names and ids do
        // not vary. A skipped step (gate false) leaves them.
        dg_output n1 = dg_mul(g, NULL, b1p, hyper(g, t, "beta1", opt->beta1));
        if (gate.node) n1 = dg_where(g, NULL, gate, n1, b1p);
        dg_output a1 = dg_assign(g, "update_beta1_power", b1p, n1);
        dg_output n2 = dg_mul(g, NULL, b2p, hyper(g, t, "beta2", opt->beta2));
        if (gate.node) n2 = dg_where(g, NULL, gate, n2, b2p);
        dg_output a2 = dg_assign(g, "update_beta2_power", b2p, n2);
        dg_graph_pop_colocate_with(g);
        dg_graph_pop_control_deps(g);
        updates[n_up++] = a1.node;
        updates[n_up++] = a2.node;
    }
    dg_node *train = NULL;
    if (dg_graph_ok(g)) {
        // With a global step, the finishing NoOp, the increment (and its constant) and the
        // train op live with the global step. On a ps the end of the updates then travels once
        // (to the worker, or from the other ps tasks) instead of bouncing through the worker,
        // where a device function would put them: one round trip less per step.
        if (global_step.node) dg_graph_push_colocate_with(g, global_step.node);
        dg_node *finish = dg_group(g, "update", updates, n_up);
        if (global_step.node && finish) {
            dg_output one = dg_scalar(g, NULL, dg_output_dtype(global_step), 1);
            dg_graph_push_control_deps(g, &finish, 1);
            dg_output inc = dg_assign_add(g, "global_step_inc", global_step, one);
            dg_graph_pop_control_deps(g);
            finish = inc.node;
        }
        if (finish) train = dg_group(g, "train", &finish, 1);
        if (global_step.node) dg_graph_pop_colocate_with(g);
    }
    dg_graph_pop_name_scope(g);
    free(slot1);
    free(slot2);
    free(updates);
    free(grad_nodes);
    free(clipped);
    return dg_graph_ok(g) ? train : NULL;
}

dg_node *dg_optimizer_apply_gradients(const dg_optimizer *opt, const dg_output *grads, const dg_output *vars, int n,
                                      dg_output global_step, const char *name) {
    return apply_gated(opt, grads, vars, n, global_step, name, NUL);
}

// Whether two device requests name different jobs or tasks (both must name them to differ).
static bool other_task(const dg_node *a, const dg_node *b) {
    dg_device_name x, y;
    dg_status st = DG_STATUS_INIT;
    bool ok = dg_device_name_parse(a->requested_device, &x, &st) && dg_device_name_parse(b->requested_device, &y, &st);
    status_impl_clear(&st);
    return ok && ((x.has_job && y.has_job && strcmp(x.job, y.job) != 0) ||
                  (x.has_task && y.has_task && x.task != y.task));
}

// opt->gradient_wire_dtype: the dense float32 gradients that cross to their variable's task go
// as bfloat16 (cast beside the gradient, cast back beside the variable).
static void gradients_on_the_wire(const dg_optimizer *opt, dg_output *grads, const dg_output *vars, int n) {
    dg_graph *g = opt->graph;
    if (opt->gradient_wire_dtype == 0 || opt->gradient_wire_dtype == DG_FLOAT32) return;
    if (opt->gradient_wire_dtype != DG_BFLOAT16) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s: gradient_wire_dtype is %s; it takes float32 (0: as "
                           "computed) or bfloat16", opt->name ? opt->name : "optimizer",
                           dg_dtype_name(opt->gradient_wire_dtype));
        return;
    }
    for (int i = 0; i < n; i++) {
        dg_output sv, si;
        if (!grads[i].node || dg_gradient_is_sparse(grads[i], &sv, &si) || dg_output_dtype(grads[i]) != DG_FLOAT32 ||
            !other_task(grads[i].node, vars[i].node))
            continue;
        char name[600], back[600];
        snprintf(name, sizeof name, "%s/gradient_wire_bfloat16", dg_node_name(vars[i].node));
        snprintf(back, sizeof back, "%s/gradient_wire_float32", dg_node_name(vars[i].node));
        dg_graph_push_colocate_with(g, grads[i].node);
        dg_output half = dg_cast(g, name, grads[i], DG_BFLOAT16);
        dg_graph_pop_colocate_with(g);
        dg_graph_push_colocate_with(g, vars[i].node);
        grads[i] = dg_cast(g, back, half, DG_FLOAT32);
        dg_graph_pop_colocate_with(g);
    }
}

dg_node *dg_optimizer_minimize(const dg_optimizer *opt, dg_output loss, dg_output global_step) {
    dg_graph *g = opt->graph;
    int cap = dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES);
    dg_output *grads = calloc((size_t)(cap ? cap : 1), sizeof *grads);
    dg_output *vars = calloc((size_t)(cap ? cap : 1), sizeof *vars);
    if (!grads || !vars) abort();
    int n = dg_optimizer_compute_gradients(opt, loss, NULL, 0, grads, vars, cap);
    if (n > 0) gradients_on_the_wire(opt, grads, vars, n);
    dg_node *train = n < 0 ? NULL : dg_optimizer_apply_gradients(opt, grads, vars, n, global_step, NULL);
    free(grads);
    free(vars);
    return train;
}

// ---- dynamic loss scaling ----

dg_loss_scale_options dg_loss_scale_options_default(void) {
    dg_loss_scale_options o = {.initial_scale = 32768.0, .growth_interval = 2000, .multiplier = 2.0};
    return o;
}

// Whether every gradient is finite: the sum of g * 0 over all of them is 0, NaN when any element
// is an infinity or NaN (inf * 0 and NaN * 0 are NaN, and NaN spreads through the sums).
static dg_output all_finite(dg_graph *g, const dg_output *grads, int n) {
    dg_output *sums = calloc((size_t)n, sizeof *sums);
    if (!sums) abort();
    for (int i = 0; i < n; i++) {
        dg_output z = dg_mul(g, NULL, grads[i], dg_scalar(g, NULL, dg_output_dtype(grads[i]), 0));
        sums[i] = dg_sum(g, NULL, z, NULL, 0, false);
        if (dg_output_dtype(sums[i]) != DG_FLOAT32) sums[i] = dg_cast(g, NULL, sums[i], DG_FLOAT32);
    }
    dg_output total = n == 1 ? sums[0] : dg_add_n(g, "sum_of_zeros", sums, n);
    free(sums);
    return dg_equal(g, "all_finite", total, dg_scalar(g, NULL, DG_FLOAT32, 0));
}

bool graph_no_gradient_wire(const dg_optimizer *opt, const char *what, const char *instead) {
    if (opt->gradient_wire_dtype == 0 || opt->gradient_wire_dtype == DG_FLOAT32) return true;
    dg_graph_set_error(opt->graph, DG_INVALID_ARGUMENT, "%s: the optimizer's gradient_wire_dtype (%s) is for "
                       "dg_optimizer_minimize's push to a ps; %s", what, dg_dtype_name(opt->gradient_wire_dtype),
                       instead);
    return false;
}

dg_node *dg_optimizer_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                               const dg_loss_scale_options *o, dg_loss_scale *ls) {
    if (!graph_no_gradient_wire(opt, "minimize_with_loss_scale", "leave it 0 with loss scaling")) {
        if (ls) memset(ls, 0, sizeof *ls);
        return NULL;
    }
    return graph_minimize_with_loss_scale(opt, loss, global_step, o, ls, NULL, NULL);
}

// Checks the options and makes the scale and its counters, colocated with home (not trainable).
static bool loss_scale_vars(dg_graph *g, dg_node *home, const dg_loss_scale_options *o, graph_loss_scaler *sc) {
    memset(sc, 0, sizeof *sc);
    sc->o = o ? *o : dg_loss_scale_options_default();
    const dg_loss_scale_options d = sc->o;
    if (!dg_graph_ok(g)) return false;
    if (!(d.initial_scale >= 1 && d.initial_scale <= 1e30) || d.growth_interval < 1 ||
        !(d.multiplier > 1 && d.multiplier <= 1e6)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "loss scaling: initial_scale must be in [1, 1e30], growth_interval "
                           ">= 1 and multiplier in (1, 1e6]; got %g, %lld and %g", d.initial_scale,
                           (long long)d.growth_interval, d.multiplier);
        return false;
    }
    sc->home = home;
    dg_graph_push_name_scope(g, "loss_scale");
    if (home) dg_graph_push_colocate_with(g, home);
    sc->scale = dg_variable_ex(g, "current", DG_FLOAT32, dg_shape_scalar(), dg_init_constant(d.initial_scale), false);
    sc->good = dg_variable_ex(g, "good_steps", DG_INT64, dg_shape_scalar(), dg_init_zeros(), false);
    sc->skipped = dg_variable_ex(g, "skipped_steps", DG_INT64, dg_shape_scalar(), dg_init_zeros(), false);
    if (home) dg_graph_pop_colocate_with(g);
    dg_graph_pop_name_scope(g);
    if (!sc->home) sc->home = sc->scale.node;
    return dg_graph_ok(g);
}

bool graph_loss_scale_begin(dg_graph *g, dg_output loss, dg_output global_step, const dg_loss_scale_options *o,
                            graph_loss_scaler *sc, dg_output *scaled) {
    if (!dg_graph_ok(g)) return false;
    if (!loss.node || !dg_dtype_is_float(dg_output_dtype(loss))) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "loss scaling: the loss must be a float tensor");
        return false;
    }
    // The scale and its counters live with the global step (or the loss).
    if (!loss_scale_vars(g, global_step.node ? global_step.node : loss.node, o, sc)) return false;
    dg_graph_push_name_scope(g, "loss_scale");
    *scaled = dg_mul(g, "scaled_loss", loss, dg_output_dtype(loss) == DG_FLOAT32
                                                 ? sc->scale : dg_cast(g, NULL, sc->scale, dg_output_dtype(loss)));
    dg_graph_pop_name_scope(g);
    return dg_graph_ok(g);
}

bool dg_loss_scale_make(dg_graph *g, dg_output global_step, const dg_loss_scale_options *o, dg_loss_scale *ls) {
    graph_loss_scaler sc;
    if (ls) memset(ls, 0, sizeof *ls);
    if (!ls) {
        if (g) dg_graph_set_error(g, DG_INVALID_ARGUMENT, "dg_loss_scale_make: ls is NULL");
        return false;
    }
    if (!g || !loss_scale_vars(g, global_step.node, o, &sc)) return false;
    *ls = (dg_loss_scale){sc.scale, sc.good, sc.skipped, {0}};
    return true;
}

dg_node *dg_optimizer_apply_gradients_with_loss_scale(const dg_optimizer *opt, const dg_output *grads,
                                                      const dg_output *vars, int n, dg_output global_step,
                                                      const dg_loss_scale_options *o, dg_loss_scale *ls) {
    dg_graph *g = opt->graph;
    if (!dg_graph_ok(g)) return NULL;
    if (!ls || !ls->scale.node || !ls->good_steps.node || !ls->skipped_steps.node || n < 1 || !grads || !vars) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "apply_gradients_with_loss_scale: a loss scale from "
                           "dg_loss_scale_make and at least one gradient are needed");
        return NULL;
    }
    if (!graph_no_gradient_wire(opt, "apply_gradients_with_loss_scale", "leave it 0 with loss scaling")) return NULL;
    graph_loss_scaler sc = {o ? *o : dg_loss_scale_options_default(), ls->scale.node, ls->scale, ls->good_steps,
                            ls->skipped_steps};
    dg_output *gs = malloc((size_t)n * sizeof *gs);
    if (!gs) abort();
    memcpy(gs, grads, (size_t)n * sizeof *gs);
    dg_node *train = graph_loss_scale_apply(opt, &sc, gs, vars, n, global_step, ls);
    free(gs);
    return train;
}

dg_node *graph_loss_scale_apply(const dg_optimizer *opt, const graph_loss_scaler *sc, dg_output *grads,
                                const dg_output *vars, int n, dg_output global_step, dg_loss_scale *ls) {
    dg_graph *g = opt->graph;
    const dg_loss_scale_options d = sc->o;
    dg_output scale = sc->scale, good = sc->good, skipped = sc->skipped;
    dg_node *home = sc->home;
    if (ls) memset(ls, 0, sizeof *ls);
    if (!dg_graph_ok(g)) return NULL;
    dg_graph_push_name_scope(g, "loss_scale");
    dg_output finite = all_finite(g, grads, n);
    dg_output inv = dg_div(g, "inverse", dg_scalar(g, NULL, DG_FLOAT32, 1), scale);
    for (int i = 0; i < n; i++) {
        dg_dtype gt = dg_output_dtype(grads[i]);
        grads[i] = dg_mul(g, NULL, grads[i], gt == DG_FLOAT32 ? inv : dg_cast(g, NULL, inv, gt));
        // Unscaled in float32 also under the mixed-precision rewrite: in float16 the small
        // gradients the scale kept would round to zero again.
        if (grads[i].node) graph_set_attr_bool(grads[i].node, GRAPH_ATTR_KEEP_FLOAT32, true);
    }
    dg_graph_pop_name_scope(g);
    dg_node *train = apply_gated(opt, grads, vars, n, global_step, NULL, finite);
    if (!train) return NULL;
    // After the updates, which read the scale through the gradients: a finite step counts
    // towards growth (the scale times multiplier after growth_interval of them, when that
    // is finite); one that is not halves the scale (not below 1) and is counted skipped.
    dg_graph_push_name_scope(g, "loss_scale");
    dg_graph_push_control_deps(g, &train, 1);
    dg_graph_push_colocate_with(g, home);
    dg_output good1 = dg_where(g, NULL, finite, dg_add(g, NULL, good, dg_scalar(g, NULL, DG_INT64, 1)),
                               dg_scalar(g, NULL, DG_INT64, 0));
    dg_output grown = dg_mul(g, NULL, scale, dg_scalar(g, NULL, DG_FLOAT32, d.multiplier));
    dg_output grow = dg_greater_equal(g, "grow", good1, dg_scalar(g, NULL, DG_INT64, (double)d.growth_interval));
    dg_output halved = dg_maximum(g, NULL, dg_mul(g, NULL, scale, dg_scalar(g, NULL, DG_FLOAT32, 1 / d.multiplier)),
                                  dg_scalar(g, NULL, DG_FLOAT32, 1));
    dg_output grown_ok = dg_where(g, NULL, all_finite(g, &grown, 1), grown, scale);
    dg_output next = dg_where(g, NULL, grow, grown_ok, dg_where(g, NULL, finite, scale, halved));
    dg_node *ups[3] = {
        dg_assign(g, "update_scale", scale, next).node,
        dg_assign(g, "update_good_steps", good, dg_where(g, NULL, grow, dg_scalar(g, NULL, DG_INT64, 0), good1)).node,
        dg_assign_add(g, "count_skipped", skipped, dg_where(g, NULL, finite, dg_scalar(g, NULL, DG_INT64, 0),
                                                             dg_scalar(g, NULL, DG_INT64, 1))).node,
    };
    dg_graph_pop_colocate_with(g);
    dg_graph_pop_control_deps(g);
    dg_node *all[4] = {train, ups[0], ups[1], ups[2]};
    train = dg_graph_ok(g) ? dg_group(g, "train", all, 4) : NULL;
    dg_graph_pop_name_scope(g);
    if (ls && train) *ls = (dg_loss_scale){scale, good, skipped, finite};
    return train;
}

dg_node *graph_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                        const dg_loss_scale_options *o, dg_loss_scale *ls,
                                        graph_gradient_transform transform, void *ctx) {
    dg_graph *g = opt->graph;
    if (ls) memset(ls, 0, sizeof *ls);
    graph_loss_scaler sc;
    dg_output scaled;
    if (!graph_loss_scale_begin(g, loss, global_step, o, &sc, &scaled)) return NULL;
    int cap = dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES);
    dg_output *grads = calloc((size_t)(cap ? cap : 1), sizeof *grads);
    dg_output *vars = calloc((size_t)(cap ? cap : 1), sizeof *vars);
    if (!grads || !vars) abort();
    dg_node *train = NULL;
    int n = dg_graph_ok(g) ? dg_optimizer_compute_gradients(opt, scaled, NULL, 0, grads, vars, cap) : -1;
    // All-reduce (the transform): the scaled gradients are averaged first, so every worker
    // checks the same values (an infinity anywhere is in every mean) and skips the same steps;
    // the scale, a global variable that starts equal, then stays equal everywhere.
    if (n > 0 && transform && !transform(ctx, g, grads, n)) n = -1;
    if (n > 0) {
        train = graph_loss_scale_apply(opt, &sc, grads, vars, n, global_step, ls);
    } else if (n == 0 && dg_graph_ok(g)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "loss scaling: the loss depends on no trainable variable");
    }
    free(grads);
    free(vars);
    return dg_graph_ok(g) ? train : NULL;
}
