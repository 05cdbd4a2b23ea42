/* Op builders. Each adds one node (or a few) to the graph and returns its output.
 * `name` may be NULL (the op type is used); it is placed under the current name scope and
 * made unique ("MatMul", "MatMul_1"). On error the graph's sticky status is set and the null
 * output is returned; passing a null output to a builder is itself an error.
 * Floating ops accept float32 and float64 unless noted; binary ops broadcast as NumPy. */
#ifndef DISTGRAPH_OPS_H
#define DISTGRAPH_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- sources ----
// A constant holding value. Borrows value (takes its own reference).
dg_output dg_const(dg_graph *g, const char *name, dg_tensor *value);
dg_output dg_scalar(dg_graph *g, const char *name, dg_dtype dtype, double v);
dg_output dg_const_i64s(dg_graph *g, const char *name, const int64_t *v, int n);
// A value fed at run time; dims of shape may be -1 (unknown).
dg_output dg_placeholder(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape);

// ---- variables ----
typedef enum dg_init_kind {
    DG_INIT_ZEROS = 0,
    DG_INIT_ONES,
    DG_INIT_CONSTANT,
    DG_INIT_RANDOM_UNIFORM,
    DG_INIT_RANDOM_NORMAL,
    DG_INIT_TRUNCATED_NORMAL,
    DG_INIT_TENSOR,
    // Variance scaling (TensorFlow's glorot_* and he_* initializers), from the variable's
    // fans: a matrix [in, out] has fan_in = in, fan_out = out; a higher rank [..., in, out]
    // multiplies both by the product of the leading dimensions (a convolution's window); a
    // vector has both equal to its length. Glorot: scale 1 over (fan_in + fan_out) / 2; He:
    // scale 2 over fan_in. Uniform draws from [-sqrt(3 scale / n), sqrt(3 scale / n)); normal
    // from a normal truncated at two standard deviations whose spread makes the variance
    // scale / n (stddev sqrt(scale / n) / 0.87962566103423978).
    DG_INIT_GLOROT_UNIFORM,
    DG_INIT_GLOROT_NORMAL,
    DG_INIT_HE_UNIFORM,
    DG_INIT_HE_NORMAL,
} dg_init_kind;

// How a variable gets its first value. Random initializers are reproducible: the same
// seed gives the same values (seed 0 draws a fresh seed per graph node, deterministically
// from the graph's random seed and the node's creation order).
typedef struct dg_initializer {
    dg_init_kind kind;
    double a, b;        // constant: a; uniform: [a, b); normal/truncated: mean a, stddev b
    int64_t seed;
    dg_tensor *value;   // DG_INIT_TENSOR: borrowed for the dg_variable call
} dg_initializer;

dg_initializer dg_init_zeros(void);
dg_initializer dg_init_ones(void);
dg_initializer dg_init_constant(double v);
dg_initializer dg_init_random_uniform(double lo, double hi, int64_t seed);
dg_initializer dg_init_random_normal(double mean, double stddev, int64_t seed);
dg_initializer dg_init_truncated_normal(double mean, double stddev, int64_t seed);
dg_initializer dg_init_tensor(dg_tensor *value);
dg_initializer dg_init_glorot_uniform(int64_t seed);
dg_initializer dg_init_glorot_normal(int64_t seed);
dg_initializer dg_init_he_uniform(int64_t seed);
dg_initializer dg_init_he_normal(int64_t seed);

// A variable (op VariableV2) with an initializer (an Assign under "<name>/Assign"), added
// to the global and (if trainable) trainable collections. The output is the variable
// itself: ops reading it see its current value. The shape must be fully defined.
dg_output dg_variable_ex(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                         dg_initializer init, bool trainable);
dg_output dg_variable(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                      dg_initializer init);
// TensorFlow's get_variable: creates "<variable scope>/<name>", or with reuse finds it
// (error if missing, or if it exists and reuse is off, or on a shape/dtype mismatch).
dg_output dg_get_variable(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                          dg_initializer init);
// The initializer (Assign node) of a variable; NULL if v is not a variable. Returns:
// borrowed, valid until dg_graph_free().
dg_node *dg_variable_initializer(dg_output v);
dg_output dg_assign(dg_graph *g, const char *name, dg_output var, dg_output value);
dg_output dg_assign_add(dg_graph *g, const char *name, dg_output var, dg_output value);
dg_output dg_assign_sub(dg_graph *g, const char *name, dg_output var, dg_output value);
// A bool scalar: has var been assigned a value?
dg_output dg_is_variable_initialized(dg_graph *g, const char *name, dg_output var);
// A NoOp depending on the initializers of every variable in DG_GLOBAL_VARIABLES. Returns:
// borrowed, valid until dg_graph_free(); NULL once the graph has an error.
dg_node *dg_global_variables_initializer(dg_graph *g);
// Sets the graph-level seed used when an op's seed is 0.
void dg_graph_set_random_seed(dg_graph *g, int64_t seed);

// ---- random tensors (a new draw on every run) ----
dg_output dg_random_uniform(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                            double lo, double hi, int64_t seed);
dg_output dg_random_normal(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                           double mean, double stddev, int64_t seed);
dg_output dg_truncated_normal(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                              double mean, double stddev, int64_t seed);

// ---- math ----
dg_output dg_matmul(dg_graph *g, const char *name, dg_output a, dg_output b, bool transpose_a,
                    bool transpose_b);
dg_output dg_add(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_sub(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_mul(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_div(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_maximum(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_minimum(dg_graph *g, const char *name, dg_output a, dg_output b);
// Sums n tensors of one shape.
dg_output dg_add_n(dg_graph *g, const char *name, const dg_output *xs, int n);
// value [..., C] + bias [C].
dg_output dg_bias_add(dg_graph *g, const char *name, dg_output value, dg_output bias);
dg_output dg_relu(dg_graph *g, const char *name, dg_output x);
dg_output dg_sigmoid(dg_graph *g, const char *name, dg_output x);
dg_output dg_tanh(dg_graph *g, const char *name, dg_output x);

// ---- losses and helpers composed of the ops above (their gradients follow) ----
// |x|, as relu(x) + relu(-x) (gradient 0 at 0, as TensorFlow's sign).
dg_output dg_abs(dg_graph *g, const char *name, dg_output x);
// Elementwise max(x, 0) - x * z + log(1 + exp(-|x|)) for logits x and labels z of one shape
// (tf.nn.sigmoid_cross_entropy_with_logits: labels first), stable for large |x|.
dg_output dg_sigmoid_cross_entropy_with_logits(dg_graph *g, const char *name, dg_output labels, dg_output logits);
// sum(t^2) / 2, a scalar (tf.nn.l2_loss); weight decay is scale * dg_l2_loss(w).
dg_output dg_l2_loss(dg_graph *g, const char *name, dg_output t);
// tf.clip_by_global_norm: global_norm = sqrt(sum of sum(t_i^2)); each out[i] = t[i] *
// clip_norm / max(global_norm, clip_norm), in t[i]'s dtype. Writes n outputs (out may alias
// ts) and, if global_norm is not NULL, the norm (float64). clip_norm > 0, else the graph's
// sticky status says so.
void dg_clip_by_global_norm(dg_graph *g, const dg_output *ts, int n, double clip_norm, dg_output *out,
                            dg_output *global_norm);
// A dimension of size 1 inserted at axis (0..rank; negative counts from the end, -1 appends),
// as a Reshape: x may have at most one unknown dimension.
dg_output dg_expand_dims(dg_graph *g, const char *name, dg_output x, int axis);
// The dimensions of size 1 at axes (n 0: every dimension known to be 1) removed, as a Reshape;
// an axis whose size is not 1 is an error naming it.
dg_output dg_squeeze(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n);
// tf.stack (Pack): n tensors of one known shape joined along a new axis (-(rank+1)..rank),
// composed of a Reshape each and one Concat (their gradients are Pack's).
dg_output dg_stack(dg_graph *g, const char *name, const dg_output *xs, int n, int axis);
// tf.unstack (Unpack): the slices of x along axis (of known size, at most cap) without that
// axis, written to out; composed of Split and a Reshape each. Returns: how many; -1 with the
// graph's sticky status set.
int dg_unstack(dg_graph *g, const char *name, dg_output x, int axis, dg_output *out, int cap);
// tf.range: start, start + delta, ... below limit (above it for delta < 0); three scalars of
// one dtype (int32, int64, float32, float64). Computed on the CPU (no gradient, as TensorFlow);
// delta 0, or a limit on the wrong side of start, fails the run naming the node.
dg_output dg_range(dg_graph *g, const char *name, dg_output start, dg_output limit, dg_output delta);

// A dense layer (tf.layers.dense): activation(x @ kernel + bias), x of shape [..., in] with a
// known in; variables "<name>/kernel" [in, units] (kernel_init) and "<name>/bias" [units]
// (zeros), trainable, of x's dtype. name NULL: "dense" (made unique). Errors (in unknown,
// units < 1) are the graph's sticky status.
typedef enum dg_activation { DG_ACT_NONE = 0, DG_ACT_RELU, DG_ACT_SIGMOID, DG_ACT_TANH } dg_activation;
dg_output dg_dense(dg_graph *g, const char *name, dg_output x, int64_t units, dg_activation activation,
                   dg_initializer kernel_init);
dg_output dg_exp(dg_graph *g, const char *name, dg_output x);
// x ** y elementwise with broadcasting (float32/float64). Gradients as TensorFlow's: y x^(y-1)
// for x, x^y log(x) for y where x > 0 (0 elsewhere).
dg_output dg_pow(dg_graph *g, const char *name, dg_output x, dg_output y);
dg_output dg_log(dg_graph *g, const char *name, dg_output x);
dg_output dg_square(dg_graph *g, const char *name, dg_output x);
dg_output dg_sqrt(dg_graph *g, const char *name, dg_output x);
// TensorFlow's BatchMatMulV2 (tf.linalg.matmul of rank >= 2): x [..., M, K] times
// y [..., K, N] for every batch index, the batch dimensions broadcast; adj_x and adj_y
// transpose the last two dimensions of x and y first. float32, float64, bfloat16 or float16
// (sums in float32).
dg_output dg_batch_matmul(dg_graph *g, const char *name, dg_output x, dg_output y, bool adj_x, bool adj_y);
// Scaled dot-product attention (PyTorch's F.scaled_dot_product_attention, one fused op with
// a fused gradient): softmax(scale * q k^T) v for q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]
// (the batch dimensions equal, e.g. [batch, heads]), giving [..., Tq, Dv]. scale 0 means
// 1 / sqrt(D). causal: query i sees key j only if j <= i + Tk - Tq (for Tq = Tk, the keys up to
// its own position); a query that sees no key gives 0. The Tq x Tk scores are never kept: the
// node's output 1 holds each query's log-sum-exp, from which the gradient recomputes them.
// bfloat16 and float16 q, k, v compute in float32 (output 1 then stays float32).
dg_output dg_attention(dg_graph *g, const char *name, dg_output q, dg_output k, dg_output v, bool causal,
                       double scale);
// The same with a boolean mask (PyTorch's boolean attn_mask, Keras' attention_mask): query i
// sees key j only where the mask is true (and, with causal, the causal rule allows it). The
// mask broadcasts to [..., Tq, Tk] (NumPy's rules, aligned at the right: [Tq, Tk] for every
// batch index, [batch, 1, 1, Tk] for padded keys); a row that sees no key gives 0. No gradient
// flows to the mask.
dg_output dg_attention_masked(dg_graph *g, const char *name, dg_output q, dg_output k, dg_output v, dg_output mask,
                              bool causal, double scale);
// 1 / sqrt(x) (TensorFlow's Rsqrt), float32/float64.
dg_output dg_rsqrt(dg_graph *g, const char *name, dg_output x);
// The error function (TensorFlow's Erf), float32/float64.
dg_output dg_erf(dg_graph *g, const char *name, dg_output x);
// Sine and cosine (TensorFlow's Sin and Cos), float32/float64.
dg_output dg_sin(dg_graph *g, const char *name, dg_output x);
dg_output dg_cos(dg_graph *g, const char *name, dg_output x);
// GELU as tf.nn.gelu: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), or with approximate the tanh
// form 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). One fused op (and one fused
// gradient, GeluGrad) where TensorFlow composes it from its pieces; the values and gradients
// are the composition's.
dg_output dg_gelu(dg_graph *g, const char *name, dg_output x, bool approximate);
dg_output dg_neg(dg_graph *g, const char *name, dg_output x);
// min(max(x, lo), hi); lo and hi are scalars or broadcast to x.
dg_output dg_clip_by_value(dg_graph *g, const char *name, dg_output x, dg_output lo,
                           dg_output hi);
// Softmax and log-softmax over the last axis.
dg_output dg_softmax(dg_graph *g, const char *name, dg_output logits);
dg_output dg_log_softmax(dg_graph *g, const char *name, dg_output logits);
// Per-example cross entropy of logits [N, C] against probabilities labels [N, C].
dg_output dg_softmax_cross_entropy_with_logits(dg_graph *g, const char *name,
                                               dg_output logits, dg_output labels);
// Per-example cross entropy of logits [N, C] against class ids labels [N] (int32/int64).
dg_output dg_sparse_softmax_cross_entropy_with_logits(dg_graph *g, const char *name,
                                                      dg_output logits, dg_output labels);
// Mean of the sparse cross entropy over the batch (a scalar): the usual loss.
dg_output dg_sparse_softmax_cross_entropy(dg_graph *g, const char *name, dg_output logits,
                                          dg_output labels);

// ---- convolutional networks (NHWC: [batch, height, width, channels]) ----
// Padding of a window op (TensorFlow's): VALID keeps windows inside the input; SAME pads so
// that the output has ceil(input / stride) positions along each axis.
typedef enum dg_padding { DG_PADDING_VALID = 0, DG_PADDING_SAME = 1 } dg_padding;
// tf.nn.conv2d: x [n, h, w, in] with filter [kh, kw, in, out] gives [n, oh, ow, out]; float32,
// float64, bfloat16 or float16 (sums in float32). Strides >= 1. Mismatched channels, a VALID
// filter larger than the input or a bad stride are errors naming the node (at build time when
// the shapes are known, else when run).
dg_output dg_conv2d(dg_graph *g, const char *name, dg_output x, dg_output filter, int stride_h,
                    int stride_w, dg_padding padding);
// tf.nn.max_pool2d and tf.nn.avg_pool2d over windows of kh x kw per channel. Average pooling
// with SAME padding divides by the number of input elements inside each window, as TensorFlow.
dg_output dg_max_pool(dg_graph *g, const char *name, dg_output x, int kh, int kw, int stride_h,
                      int stride_w, dg_padding padding);
dg_output dg_avg_pool(dg_graph *g, const char *name, dg_output x, int kh, int kw, int stride_h,
                      int stride_w, dg_padding padding);
// tf.nn.dropout when training (a bool scalar, e.g. a placeholder fed per run) is true: each
// element is kept with probability 1 - rate and scaled by 1 / (1 - rate), else zeroed, from a
// Philox stream seeded as the random ops are (seed 0: from the graph seed and the node); a new
// draw every run. When training is false, x passes unchanged. 0 <= rate < 1.
dg_output dg_dropout(dg_graph *g, const char *name, dg_output x, double rate, dg_output training,
                     int64_t seed);
// Layer normalisation over the last axis (one fused op, LayerNorm, with a fused gradient):
// (x - mean) / sqrt(var + epsilon) * gamma + beta, mean and the biased variance taken over each
// row of the last axis; gamma and beta have shape [C], C the last dimension of x (float32,
// float64, or bfloat16 and float16 computed in float32). The values and gradients of Keras's
// LayerNormalization (axis -1). The node's outputs 1 and 2 are each row's mean and
// 1 / sqrt(var + epsilon) (float32 for the 16-bit floats).
dg_output dg_layer_norm(dg_graph *g, const char *name, dg_output x, dg_output gamma, dg_output beta,
                        double epsilon);
// A convolution layer (tf.layers.conv2d): activation(conv2d(x, kernel) + bias) with variables
// "<name>/kernel" [kh, kw, in, filters] (kernel_init) and "<name>/bias" [filters] (zeros), of
// x's dtype; x's channels must be known. name NULL: "conv2d" (made unique).
dg_output dg_conv2d_layer(dg_graph *g, const char *name, dg_output x, int64_t filters, int kh,
                          int kw, int stride, dg_padding padding, dg_activation activation,
                          dg_initializer kernel_init);
// Batch normalization (tf.layers.batch_normalization) over the last axis of x (its size known):
// y = gamma (x - mean) / sqrt(variance + epsilon) + beta. While training (a bool scalar) is true
// mean and variance are the batch's (over every axis but the last; the biased variance), else
// the moving averages. Variables "<name>/gamma" (ones) and "<name>/beta" (zeros), trainable, and
// "<name>/moving_mean" (zeros) and "<name>/moving_variance" (ones), not trainable; the updates
// moving = moving - (moving - batch) (1 - momentum) go into the DG_UPDATE_OPS collection, to run
// with each training step (dg_graph_collection_get). 0 <= momentum < 1, epsilon > 0.
dg_output dg_batch_normalization(dg_graph *g, const char *name, dg_output x, dg_output training, double momentum,
                                 double epsilon);
// [n, d1, d2, ...] reshaped to [n, d1 * d2 * ...] (tf.layers.flatten); the trailing dimensions
// must be known.
dg_output dg_flatten(dg_graph *g, const char *name, dg_output x);

// ---- summaries (what the monitored session records: distgraph/monitored_session.h) ----
// tf.summary.scalar: an Identity of x named name (the summary's tag) added to DG_SUMMARIES, so
// the summary saver and TensorBoard hooks record it; x must be a numeric scalar.
dg_output dg_summary_scalar(dg_graph *g, const char *name, dg_output x);
// tf.summary.histogram: an Identity of x named name added to DG_HISTOGRAM_SUMMARIES, which the
// TensorBoard hook writes as a histogram of all of x's values; x must be float.
dg_output dg_summary_histogram(dg_graph *g, const char *name, dg_output x);

// ---- reductions (axes NULL/n_axes 0: all axes; negative axes count from the end) ----
dg_output dg_sum(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n_axes,
                 bool keep_dims);
dg_output dg_mean(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n_axes,
                  bool keep_dims);
dg_output dg_max(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n_axes,
                 bool keep_dims);
// Index of the largest value along axis (int64 output).
dg_output dg_argmax(dg_graph *g, const char *name, dg_output x, int64_t axis);

// ---- comparison and types ----
// Elementwise comparisons with broadcasting; bool outputs (no gradient).
dg_output dg_equal(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_greater(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_greater_equal(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_less(dg_graph *g, const char *name, dg_output a, dg_output b);
dg_output dg_less_equal(dg_graph *g, const char *name, dg_output a, dg_output b);
// tf.where (SelectV2): t where cond holds, e elsewhere; cond (bool), t and e broadcast together
// as NumPy. The gradient goes to t where cond holds and to e elsewhere.
dg_output dg_where(dg_graph *g, const char *name, dg_output cond, dg_output t, dg_output e);
dg_output dg_cast(dg_graph *g, const char *name, dg_output x, dg_dtype to);

// ---- shapes ----
// tf.transpose: output dimension k is x's dimension perm[k]; perm a permutation of 0..n-1 with
// n = x's rank.
dg_output dg_transpose(dg_graph *g, const char *name, dg_output x, const int64_t *perm, int n);
// tf.tile: x repeated multiples[k] >= 0 times along each dimension k (n = x's rank).
dg_output dg_tile(dg_graph *g, const char *name, dg_output x, const int64_t *multiples, int n);
// tf.stop_gradient: x, through which no gradient flows (dg_gradients treats it as a constant).
dg_output dg_stop_gradient(dg_graph *g, const char *name, dg_output x);
// tf.one_hot: indices [...] (int32/int64) -> [..., depth] of dtype (float32/float64) holding
// on_value at each index and off_value elsewhere; an index outside [0, depth) gives a row of
// off_value, as TensorFlow.
dg_output dg_one_hot(dg_graph *g, const char *name, dg_output indices, int64_t depth, double on_value,
                     double off_value, dg_dtype dtype);
// New shape (one dim may be -1, inferred from the element count).
dg_output dg_reshape(dg_graph *g, const char *name, dg_output x, const int64_t *dims, int n);
// Reshape to a shape given as an int32/int64 vector tensor.
dg_output dg_reshape_to(dg_graph *g, const char *name, dg_output x, dg_output shape);
// The shape of x as an int64 vector.
dg_output dg_shape_of(dg_graph *g, const char *name, dg_output x);
// A tensor of shape `dims` (int64 vector) filled with the scalar value.
dg_output dg_fill(dg_graph *g, const char *name, dg_output dims, dg_output value);
dg_output dg_zeros(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape);
dg_output dg_ones(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape);
dg_output dg_zeros_like(dg_graph *g, const char *name, dg_output x);
dg_output dg_ones_like(dg_graph *g, const char *name, dg_output x);
dg_output dg_concat(dg_graph *g, const char *name, const dg_output *xs, int n, int64_t axis);
// Splits x into n_splits equal parts along axis; out receives n_splits outputs.
bool dg_split(dg_graph *g, const char *name, dg_output x, int64_t axis, int n_splits,
              dg_output *out);
// x[begin : begin+size] per axis; size -1 takes the rest.
dg_output dg_slice(dg_graph *g, const char *name, dg_output x, const int64_t *begin,
                   const int64_t *size, int n);
dg_output dg_identity(dg_graph *g, const char *name, dg_output x);

// ---- control ----
// Returns: borrowed, valid until dg_graph_free(); NULL once the graph has an error.
dg_node *dg_no_op(dg_graph *g, const char *name);
// A NoOp that runs after every node in deps. Returns: borrowed, valid until dg_graph_free();
// NULL once the graph has an error.
dg_node *dg_group(dg_graph *g, const char *name, dg_node *const *deps, int n);

#ifdef __cplusplus
}
#endif
#endif
