/* Gradients and optimizers, as graph construction.
 * dg_gradients adds the nodes computing d(sum ys)/d(xs). Optimizers are value structs: make
 * one with dg_gradient_descent / dg_momentum / dg_adam / dg_adagrad / dg_rmsprop, then
 * compute_gradients and apply_gradients (kept separate so gradients can be averaged between
 * the two, as in TensorFlow), or minimize. Slots (momentum accumulators, Adam's m and v,
 * Adagrad's and RMSProp's accumulators) are variables colocated with their variable and named
 * "<var>/<Optimizer>" and "<var>/<Optimizer>_1". */
#ifndef DISTGRAPH_TRAIN_H
#define DISTGRAPH_TRAIN_H

#include <stdbool.h>

#include "distgraph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

// Adds gradient nodes: dx[i] = sum over ys of d ys / d xs[i], each y weighted by grad_ys[j]
// (NULL: ones). dx[i] is the null output when xs[i] does not affect ys. Returns false (and
// the graph's sticky status names the op) when an op on the path has no gradient.
bool dg_gradients(dg_graph *g, const dg_output *ys, int n_ys, const dg_output *xs, int n_xs,
                  const dg_output *grad_ys, dg_output *dx);

// Where gradient nodes go. By default every node dg_gradients adds asks for the device scopes
// and functions in force where it is called (often the client's task). With
// colocate_gradients_with_ops (TensorFlow's flag of that name), the nodes computing the
// gradient of each op ask for that op's device instead (for an op that asks for none but is
// colocated, the device of the node it is colocated with), and the caller's scopes no longer
// apply to them: a model split over tasks or devices runs its backward pass where its forward
// pass ran. Unlike TensorFlow, they do not join the op's colocation group: one a device cannot
// run falls back to its task's CPU under soft placement, and the op keeps its device.
typedef struct dg_gradients_options {
    bool colocate_gradients_with_ops;
} dg_gradients_options;

// dg_gradients with options (NULL: the defaults, as dg_gradients).
bool dg_gradients_ex(dg_graph *g, const dg_output *ys, int n_ys, const dg_output *xs, int n_xs,
                     const dg_output *grad_ys, const dg_gradients_options *opts, dg_output *dx);

// The global step: an int64 scalar variable "global_step" (created on first use, kept in the
// DG_GLOBAL_STEP collection, not trainable).
dg_output dg_global_step(dg_graph *g);

typedef enum dg_optimizer_kind {
    DG_OPT_GRADIENT_DESCENT = 0,
    DG_OPT_MOMENTUM = 1,
    DG_OPT_ADAM = 2,
    DG_OPT_ADAGRAD = 3,
    DG_OPT_RMSPROP = 4,
    DG_OPT_ADAMW = 5,
} dg_optimizer_kind;

typedef struct dg_optimizer {
    dg_optimizer_kind kind;
    dg_graph *graph;
    double learning_rate;
    // A scalar that replaces learning_rate when set (its node not NULL): a schedule such as
    // dg_exponential_decay, or any float tensor; cast to each variable's dtype.
    dg_output learning_rate_tensor;
    double momentum;        // momentum
    bool use_nesterov;      // momentum
    double beta1, beta2, epsilon;   // adam; epsilon also rmsprop
    double rho;                     // rmsprop: the decay of the mean square
    double initial_accumulator_value;   // adagrad
    const char *name;       // "GradientDescent", "Momentum", "Adam" by default
    // compute_gradients and minimize build each op's gradient on that op's device (see
    // dg_gradients_options); false by default, as in TensorFlow.
    bool colocate_gradients_with_ops;
    // adamw: the decoupled weight decay (see dg_adamw) and which variables it applies to:
    // decay_filter(var, decay_filter_arg) true. NULL: the variables of rank 2 or more.
    double weight_decay;
    bool (*decay_filter)(dg_output var, void *arg);
    void *decay_filter_arg;
    // > 0: apply_gradients first scales the gradients it is given by clip / max(global norm,
    // clip), as Keras's global_clipnorm (dg_clip_by_global_norm): under all-reduce and sync
    // replicas that is the averaged gradient, as PyTorch's clip_grad_norm_ after DDP. A sparse
    // gradient is clipped (and applied) as a dense one. Under the mirrored strategy each copy
    // computes the norm on its own device: copies on devices that round differently can drift.
    double global_clipnorm;
    // DG_BFLOAT16: dg_optimizer_minimize sends each dense float32 gradient whose device request
    // names another job or task than its variable's (a worker's gradient of a ps task's
    // variable) as bfloat16, half the bytes: cast where it is computed, cast back to float32
    // beside the variable, which is updated in float32. 0: as computed. Only minimize does
    // this: loss scaling, sync replicas and the all-reduce minimize refuse it (the all-reduce
    // takes dg_collective_group.wire_dtype); apply_gradients ignores it.
    dg_dtype gradient_wire_dtype;
} dg_optimizer;

dg_optimizer dg_gradient_descent(dg_graph *g, double learning_rate);
dg_optimizer dg_momentum(dg_graph *g, double learning_rate, double momentum, bool use_nesterov);
// beta1 0.9, beta2 0.999, epsilon 1e-8 as in TensorFlow.
dg_optimizer dg_adam(dg_graph *g, double learning_rate);
// Adam with decoupled weight decay (tf.keras.optimizers.AdamW; torch.optim.AdamW): each step,
// before Adam's update, var -= learning_rate * weight_decay * var for the variables the
// optimizer's decay_filter accepts (by default the matrices and embedding tables, rank >= 2:
// not biases or layer-norm scales); the decay never enters the gradient or Adam's moments.
// Adam's update is TensorFlow's (ApplyAdam; slots "<var>/AdamW" and "<var>/AdamW_1").
// beta1 0.9, beta2 0.999, epsilon 1e-8; weight_decay >= 0.
dg_optimizer dg_adamw(dg_graph *g, double learning_rate, double weight_decay);
// TensorFlow 1's AdagradOptimizer: accum += g^2; var -= lr * g / sqrt(accum), the slot
// "<var>/Adagrad" starting at initial_accumulator_value (TensorFlow's default 0.1; > 0).
dg_optimizer dg_adagrad(dg_graph *g, double learning_rate, double initial_accumulator_value);
// TensorFlow 1's RMSPropOptimizer (not centered): ms = rho ms + (1 - rho) g^2;
// mom = momentum mom + lr g / sqrt(ms + epsilon); var -= mom; slots "<var>/RMSProp" (ms,
// starting at 1) and "<var>/RMSProp_1" (mom, 0). TensorFlow's defaults: rho 0.9, momentum 0,
// epsilon 1e-10.
dg_optimizer dg_rmsprop(dg_graph *g, double learning_rate, double rho, double momentum, double epsilon);
// Adagrad and RMSProp are built from Assign ops on the variable's device, so they run wherever
// the variables live; their arguments are checked when the updates are built.

// A learning rate that decays with the global step, as tf.train.exponential_decay without
// staircase: learning_rate * decay_rate ^ (global_step / decay_steps), a float32 scalar to
// put in dg_optimizer.learning_rate_tensor. decay_steps > 0 and decay_rate > 0, else the
// graph's sticky status says which. Returns: the output; the null output once the graph has an
// error.
dg_output dg_exponential_decay(dg_graph *g, double learning_rate, dg_output global_step, double decay_steps,
                               double decay_rate);
// Linear warmup, then cosine decay (tf.keras.optimizers.schedules.CosineDecay with
// initial_learning_rate 0, warmup_target peak, alpha final / peak): peak * step / warmup_steps
// while step < warmup_steps; then final + (peak - final) * (1 + cos(pi * min(1, (step -
// warmup_steps) / decay_steps))) / 2, so final from warmup_steps + decay_steps on. A float32
// scalar for dg_optimizer.learning_rate_tensor, computed in float64. warmup_steps >= 0,
// decay_steps > 0, 0 <= final <= peak; otherwise the graph's sticky status names the schedule
// (name, or "WarmupCosineDecay").
dg_output dg_warmup_cosine_decay(dg_graph *g, const char *name, dg_output global_step, double peak,
                                 int64_t warmup_steps, int64_t decay_steps, double final);
// tf.train.piecewise_constant: values[0] while global_step <= boundaries[0], values[i] while
// boundaries[i-1] < global_step <= boundaries[i], values[n_boundaries] after the last; a float32
// scalar for dg_optimizer.learning_rate_tensor, exactly the value given (as float32).
// Boundaries must increase strictly; otherwise, or with n_boundaries < 0, the graph's sticky
// status names the schedule (name, or "PiecewiseConstant") and the first boundary out of order.
dg_output dg_piecewise_constant(dg_graph *g, const char *name, dg_output global_step, const int64_t *boundaries,
                                int n_boundaries, const double *values);

// Gradients of loss with respect to vars (NULL: the trainable variables collection).
// Writes n pairs into grads/vars_out (both at least cap long) and returns n, or -1 on error.
// Pairs whose gradient is the null output (variable does not affect loss) are left out.
int dg_optimizer_compute_gradients(const dg_optimizer *opt, dg_output loss, const dg_output *vars,
                                   int n_vars, dg_output *grads, dg_output *vars_out, int cap);
// Applies the updates; with a non-null global_step also increments it. Every update runs
// after every gradient is computed, so all of them read the pre-step values.
// Returns: the train op (a NoOp), borrowed, valid until dg_graph_free(); NULL on error.
dg_node *dg_optimizer_apply_gradients(const dg_optimizer *opt, const dg_output *grads,
                                      const dg_output *vars, int n, dg_output global_step,
                                      const char *name);
// compute_gradients then apply_gradients over the trainable variables. Returns: the train op,
// borrowed, valid until dg_graph_free(); NULL once the graph has an error.
dg_node *dg_optimizer_minimize(const dg_optimizer *opt, dg_output loss, dg_output global_step);

// Dynamic loss scaling, for products in float16 (dg_graph_set_mixed_precision), whose small
// gradients would round to zero: tf.keras.mixed_precision.LossScaleOptimizer's dynamic scale.
// Each step multiplies the loss by the scale, divides the gradients by it again, and applies
// them only when every one is finite. A step whose gradients hold an infinity or NaN (the scale
// was too large) changes no variable and no optimizer slot: the scale is divided by multiplier
// (not below 1) and the step counted in skipped_steps. After growth_interval finite steps in a
// row the scale is multiplied by multiplier (when the product is finite). The global step
// advances either way, as Keras's iterations.
typedef struct dg_loss_scale_options {
    double initial_scale;      // 2^15 (Keras's default); in [1, 1e30]
    int64_t growth_interval;   // 2000; >= 1
    double multiplier;         // 2; in (1, 1e6]
} dg_loss_scale_options;
dg_loss_scale_options dg_loss_scale_options_default(void);
// What the scaler keeps, to fetch or log (outputs of the graph).
typedef struct dg_loss_scale {
    dg_output scale;           // float32 scalar variable "loss_scale/current"
    dg_output good_steps;      // int64 variable: finite steps since the scale last grew or halved
    dg_output skipped_steps;   // int64 variable: steps skipped, their gradients not finite
    dg_output finite;          // bool: whether this step's gradients were finite (it applied them)
} dg_loss_scale;
// minimize with dynamic loss scaling (o NULL: the defaults); *ls (may be NULL) gets the
// scaler's outputs. Gradient descent, momentum, Adam and AdamW over dense gradients; another
// optimizer, or a sparse gradient, is UNIMPLEMENTED naming it. Returns: the train op, borrowed,
// valid until dg_graph_free(); NULL once the graph has an error.
dg_node *dg_optimizer_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                               const dg_loss_scale_options *o, dg_loss_scale *ls);
// The same scaling for gradients computed elsewhere (a pipeline's: dg_pipeline_options.loss_scale
// multiplies each micro-batch's loss by ls->scale). dg_loss_scale_make makes the scale and its
// counters, colocated with global_step, into *ls (finite unset); false once the graph has an
// error (bad options). dg_optimizer_apply_gradients_with_loss_scale divides grads (of the
// scaled loss) by ls->scale, applies them only when every one is finite and updates the scale
// and counters as dg_optimizer_minimize_with_loss_scale does; o (NULL: the defaults) must be
// what ls was made with; it sets ls->finite. Returns: the train op, borrowed, valid until
// dg_graph_free(); NULL once the graph has an error.
bool dg_loss_scale_make(dg_graph *g, dg_output global_step, const dg_loss_scale_options *o, dg_loss_scale *ls);
dg_node *dg_optimizer_apply_gradients_with_loss_scale(const dg_optimizer *opt, const dg_output *grads,
                                                      const dg_output *vars, int n, dg_output global_step,
                                                      const dg_loss_scale_options *o, dg_loss_scale *ls);

#ifdef __cplusplus
}
#endif
#endif
