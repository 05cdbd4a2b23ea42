/* Tests for graph/gradients.c and graph/train.c, after TensorFlow's gradient_checker and
 * gradients_test.py. Every differentiable op is checked against central finite differences
 * in float64: f = sum_k sum(op(x...)_k * W_k) with fixed random weights W_k, so every output
 * element matters. Optimizers are checked against hand-computed float64 references of
 * TensorFlow's update formulas. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IN 6
#define MAX_OUT 4
// Largest allowed max|analytic - numeric| / max(|analytic|, |numeric|) per input.
#define GRAD_TOL 1e-6
// Central-difference step, relative to max(1, |x|).
#define FD_STEP 1e-6

// ---------------------------------------------------------------------------------------
// Helpers

// A rank-4 shape.
static dg_shape shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    const int64_t dims[4] = {a, b, c, d};
    return dg_shape_make(4, dims);
}

static dg_session *new_session(dg_graph *g) {
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.inter_op_threads = 1;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    assert_non_null(s);
    dg_status_free(&st);
    return s;
}

static dg_tensor *tensor_f64(dg_shape s, const double *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, s, v, st);
    assert_ok(st);
    dg_status_free(&st);
    return t;
}

static dg_tensor *random_f64(dg_shape s, double lo, double hi, uint64_t *rng) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(DG_FLOAT64, s, st);
    assert_ok(st);
    for (int64_t i = 0; i < dg_tensor_num_elements(t); i++)
        dg_tensor_f64(t)[i] = dg_test_uniform(rng, lo, hi);
    dg_status_free(&st);
    return t;
}

// Runs fetches with feeds; asserts success.
static void run_ok(dg_session *s, const dg_output *feeds, dg_tensor *const *vals, int n_feeds,
                   const dg_output *fetches, dg_tensor **out, int n_fetches) {
    dg_status *st = dg_status_new();
    bool ok = dg_session_run(s, feeds, vals, n_feeds, fetches, out, n_fetches, NULL, 0, st);
    assert_ok(st);
    assert_true(ok);
    dg_status_free(&st);
}

static void assert_graph_ok(const dg_graph *g) { assert_ok(dg_graph_status(g)); }

// The tolerance of an element, relative to the reference's largest magnitude (at least 1e-8):
// |got - want| <= tol * scale, checked by testutil (a NaN or an infinity fails).
static double scaled_atol(const double *want, int64_t n, double tol) {
    double scale = dg_test_max_abs_f64(want, n);
    return tol * (scale > 1e-8 ? scale : 1e-8);
}

// ---------------------------------------------------------------------------------------
// The table of gradient checks

typedef enum gen_kind {
    G_UNIFORM = 0,   // uniform in [lo, hi)
    G_AWAY0,         // magnitude uniform in [lo, hi), random sign (keeps off 0 for Relu, Div)
    G_SIMPLEX,       // positive, each row of the last axis sums to 1 (cross-entropy labels)
    G_LABELS,        // integer class ids in [0, hi)
} gen_kind;

typedef struct in_spec {
    int rank;
    int64_t d[4];
    gen_kind gen;
    double lo, hi;
    dg_dtype dtype;    // 0: float64
    bool no_diff;      // fed but not differentiated
    bool unknown0;     // the placeholder declares dimension 0 as unknown
} in_spec;

// Builds op(x...) and writes its outputs to out; returns how many.
typedef int (*build_fn)(dg_graph *g, const dg_output *x, dg_output *out);

typedef struct grad_case {
    const char *name;
    build_fn build;
    int n_in;
    in_spec in[MAX_IN];
} grad_case;

#define U G_UNIFORM, -1.0, 1.0
#define NZ G_AWAY0, 0.5, 2.0
#define AWAY G_AWAY0, 0.1, 1.0
#define POS G_UNIFORM, 0.5, 2.0
#define SX G_SIMPLEX, 0.1, 1.0
// Input specs: shape, then a generator (kind, lo, hi).
#define T0(...) {0, {0}, __VA_ARGS__, 0, false, false}
#define T1(a, ...) {1, {a}, __VA_ARGS__, 0, false, false}
#define T2(a, b, ...) {2, {a, b}, __VA_ARGS__, 0, false, false}
#define T3(a, b, c, ...) {3, {a, b, c}, __VA_ARGS__, 0, false, false}
#define T2Q(a, b, ...) {2, {a, b}, __VA_ARGS__, 0, false, true}
#define T4(a, b, c, d, ...) {4, {a, b, c, d}, __VA_ARGS__, 0, false, false}
#define T2N(a, b, ...) {2, {a, b}, __VA_ARGS__, 0, true, false}
#define LABELS(n, classes, dt) {1, {n}, G_LABELS, 0, classes, dt, true, false}

#define B1(fname, expr)                                                          \
    static int fname(dg_graph *g, const dg_output *x, dg_output *o) {            \
        o[0] = (expr);                                                           \
        return 1;                                                                \
    }

B1(b_matmul_nn, dg_matmul(g, NULL, x[0], x[1], false, false))
B1(b_matmul_nt, dg_matmul(g, NULL, x[0], x[1], false, true))
B1(b_matmul_tn, dg_matmul(g, NULL, x[0], x[1], true, false))
B1(b_matmul_tt, dg_matmul(g, NULL, x[0], x[1], true, true))
B1(b_add, dg_add(g, NULL, x[0], x[1]))
B1(b_sub, dg_sub(g, NULL, x[0], x[1]))
B1(b_mul, dg_mul(g, NULL, x[0], x[1]))
B1(b_div, dg_div(g, NULL, x[0], x[1]))
B1(b_maximum, dg_maximum(g, NULL, x[0], x[1]))
B1(b_minimum, dg_minimum(g, NULL, x[0], x[1]))
B1(b_add_n, dg_add_n(g, NULL, x, 3))
B1(b_bias_add, dg_bias_add(g, NULL, x[0], x[1]))
B1(b_relu, dg_relu(g, NULL, x[0]))
B1(b_sigmoid, dg_sigmoid(g, NULL, x[0]))
B1(b_tanh, dg_tanh(g, NULL, x[0]))
B1(b_exp, dg_exp(g, NULL, x[0]))
B1(b_log, dg_log(g, NULL, x[0]))
B1(b_square, dg_square(g, NULL, x[0]))
B1(b_sqrt, dg_sqrt(g, NULL, x[0]))
B1(b_rsqrt, dg_rsqrt(g, NULL, x[0]))
B1(b_layer_norm, dg_layer_norm(g, NULL, x[0], x[1], x[2], 1e-5))
B1(b_bmm_nn, dg_batch_matmul(g, NULL, x[0], x[1], false, false))
B1(b_bmm_nt, dg_batch_matmul(g, NULL, x[0], x[1], false, true))
B1(b_bmm_tn, dg_batch_matmul(g, NULL, x[0], x[1], true, false))
B1(b_bmm_tt, dg_batch_matmul(g, NULL, x[0], x[1], true, true))
B1(b_att, dg_attention(g, NULL, x[0], x[1], x[2], false, 0))
B1(b_att_causal, dg_attention(g, NULL, x[0], x[1], x[2], true, 0))
B1(b_att_causal_scaled, dg_attention(g, NULL, x[0], x[1], x[2], true, 0.7))

// A bool mask constant of the given shape, about one pair in five left out (a fixed pattern).
static dg_output mask_const(dg_graph *g, dg_shape shape) {
    dg_tensor *m = dg_tensor_new(DG_BOOL, shape, NULL);
    assert_non_null(m);
    uint8_t *p = dg_tensor_data(m);
    for (int64_t i = 0; i < dg_tensor_num_elements(m); i++) p[i] = (i * 7 + 3) % 5 != 0;
    dg_output c = dg_const(g, NULL, m);
    dg_tensor_unref(m);
    return c;
}
B1(b_att_mask_pad, dg_attention_masked(g, NULL, x[0], x[1], x[2], mask_const(g, shape4(2, 1, 1, 4)), false, 0))
B1(b_att_mask_2d_causal, dg_attention_masked(g, NULL, x[0], x[1], x[2], mask_const(g, dg_shape2(3, 3)), true, 0))
B1(b_erf, dg_erf(g, NULL, x[0]))
B1(b_sin, dg_sin(g, NULL, x[0]))
B1(b_stack1, dg_stack(g, NULL, x, 3, 1))
B1(b_stack_last, dg_stack(g, NULL, x, 2, -1))
static int b_unstack(dg_graph *g, const dg_output *x, dg_output *o) { return dg_unstack(g, NULL, x[0], 1, o, 8); }
B1(b_cos, dg_cos(g, NULL, x[0]))
B1(b_gelu, dg_gelu(g, NULL, x[0], false))
B1(b_gelu_tanh, dg_gelu(g, NULL, x[0], true))
B1(b_neg, dg_neg(g, NULL, x[0]))
B1(b_clip, dg_clip_by_value(g, NULL, x[0], x[1], x[2]))
B1(b_softmax, dg_softmax(g, NULL, x[0]))
B1(b_log_softmax, dg_log_softmax(g, NULL, x[0]))
B1(b_xent, dg_softmax_cross_entropy_with_logits(g, NULL, x[0], x[1]))
B1(b_sparse_xent, dg_sparse_softmax_cross_entropy_with_logits(g, NULL, x[0], x[1]))
B1(b_sparse_xent_mean, dg_sparse_softmax_cross_entropy(g, NULL, x[0], x[1]))
B1(b_identity, dg_identity(g, NULL, x[0]))
B1(b_abs, dg_abs(g, NULL, x[0]))
B1(b_sigmoid_xent, dg_sigmoid_cross_entropy_with_logits(g, NULL, x[1], x[0]))
B1(b_l2_loss, dg_l2_loss(g, NULL, x[0]))
B1(b_expand_dims1, dg_expand_dims(g, NULL, x[0], 1))
B1(b_conv_valid, dg_conv2d(g, NULL, x[0], x[1], 1, 1, DG_PADDING_VALID))
B1(b_conv_same_s2, dg_conv2d(g, NULL, x[0], x[1], 2, 2, DG_PADDING_SAME))
B1(b_conv_same_s12, dg_conv2d(g, NULL, x[0], x[1], 1, 2, DG_PADDING_SAME))
B1(b_conv_valid_s3, dg_conv2d(g, NULL, x[0], x[1], 3, 2, DG_PADDING_VALID))
B1(b_max_pool_valid, dg_max_pool(g, NULL, x[0], 2, 2, 2, 2, DG_PADDING_VALID))
B1(b_max_pool_same, dg_max_pool(g, NULL, x[0], 3, 3, 2, 2, DG_PADDING_SAME))
B1(b_avg_pool_valid, dg_avg_pool(g, NULL, x[0], 2, 2, 2, 2, DG_PADDING_VALID))
B1(b_avg_pool_same, dg_avg_pool(g, NULL, x[0], 3, 2, 2, 1, DG_PADDING_SAME))
static const int64_t PERM201[] = {2, 0, 1}, PERM10[] = {1, 0}, TILE23[] = {2, 3}, TILE131[] = {1, 3, 1};
B1(b_pow, dg_pow(g, NULL, x[0], x[1]))
B1(b_transpose3, dg_transpose(g, NULL, x[0], PERM201, 3))
B1(b_transpose2, dg_transpose(g, NULL, x[0], PERM10, 2))
static const int64_t PERM0213[] = {0, 2, 1, 3};
B1(b_transpose4, dg_transpose(g, NULL, x[0], PERM0213, 4))
B1(b_tile2, dg_tile(g, NULL, x[0], TILE23, 2))
B1(b_tile3, dg_tile(g, NULL, x[0], TILE131, 3))
// x0 (not differentiated) picks: where(x0 > 0, x1, x2), the values broadcast.
B1(b_where, dg_where(g, NULL, dg_greater(g, NULL, x[0], dg_scalar(g, NULL, DG_FLOAT64, 0)), x[1], x[2]))
// A small CNN: conv, relu, pool, flatten, dense logits, mean cross-entropy.
static int b_cnn(dg_graph *g, const dg_output *x, dg_output *o) {
    dg_output h = dg_relu(g, NULL, dg_conv2d(g, NULL, x[0], x[1], 1, 1, DG_PADDING_SAME));
    h = dg_flatten(g, NULL, dg_max_pool(g, NULL, h, 2, 2, 2, 2, DG_PADDING_VALID));
    o[0] = dg_sparse_softmax_cross_entropy(g, NULL, dg_matmul(g, NULL, h, x[2], false, false), x[3]);
    return 1;
}
static const int64_t SQ_AX1[] = {1};
B1(b_squeeze1, dg_squeeze(g, NULL, x[0], SQ_AX1, 1))
// Two tensors clipped together. Clipping: the first is scaled up past the norm; not clipping:
// both are scaled down below it (scaling both when clipping would make the output independent
// of the scale, a zero gradient no relative error can judge).
static int b_clip_global(dg_graph *g, const dg_output *x, dg_output *o) {
    dg_output in[2] = {dg_mul(g, NULL, x[0], x[2]), x[1]};
    dg_clip_by_global_norm(g, in, 2, 1.0, o, NULL);
    return 2;
}
static int b_clip_global_small(dg_graph *g, const dg_output *x, dg_output *o) {
    dg_output in[2] = {dg_mul(g, NULL, x[0], x[2]), dg_mul(g, NULL, x[1], x[2])};
    dg_clip_by_global_norm(g, in, 2, 1.0, o, NULL);
    return 2;
}

static const int64_t AX0[] = {0}, AX1[] = {1}, AXM1[] = {-1}, AX02[] = {0, 2}, AX12[] = {1, 2};
#define BRED(fname, op, axes, n, keep) B1(fname, op(g, NULL, x[0], axes, n, keep))
BRED(b_sum_1, dg_sum, AX1, 1, false)
BRED(b_sum_1k, dg_sum, AX1, 1, true)
BRED(b_sum_02, dg_sum, AX02, 2, false)
BRED(b_sum_02k, dg_sum, AX02, 2, true)
BRED(b_sum_m1, dg_sum, AXM1, 1, false)
BRED(b_sum_all, dg_sum, NULL, 0, false)
BRED(b_sum_allk, dg_sum, NULL, 0, true)
BRED(b_mean_0, dg_mean, AX0, 1, false)
BRED(b_mean_12k, dg_mean, AX12, 2, true)
BRED(b_mean_02, dg_mean, AX02, 2, false)
BRED(b_mean_all, dg_mean, NULL, 0, false)
BRED(b_mean_allk, dg_mean, NULL, 0, true)
BRED(b_max_1, dg_max, AX1, 1, false)
BRED(b_max_1k, dg_max, AX1, 1, true)
BRED(b_max_02, dg_max, AX02, 2, false)
BRED(b_max_m1k, dg_max, AXM1, 1, true)
BRED(b_max_all, dg_max, NULL, 0, false)
BRED(b_max_allk, dg_max, NULL, 0, true)

static const int64_t R_2_M1[] = {2, -1}, R_6_2[] = {6, 2}, R_FLAT[] = {-1};
B1(b_reshape_2m1, dg_reshape(g, NULL, x[0], R_2_M1, 2))
B1(b_reshape_62, dg_reshape(g, NULL, x[0], R_6_2, 2))
B1(b_reshape_flat, dg_reshape(g, NULL, x[0], R_FLAT, 1))
// Reshape to a shape computed at run time (the Shape of another input).
B1(b_reshape_to_shape_of, dg_reshape_to(g, NULL, x[0], dg_shape_of(g, NULL, x[1])))

B1(b_concat0, dg_concat(g, NULL, x, 2, 0))
B1(b_concat1, dg_concat(g, NULL, x, 3, 1))
B1(b_concat_m1, dg_concat(g, NULL, x, 2, -1))

static int b_split1(dg_graph *g, const dg_output *x, dg_output *o) {
    return dg_split(g, NULL, x[0], 1, 3, o) ? 3 : 0;
}
static int b_split0(dg_graph *g, const dg_output *x, dg_output *o) {
    return dg_split(g, NULL, x[0], 0, 2, o) ? 2 : 0;
}
// Only outputs 0 and 2 are used: output 1's gradient is zeros.
static int b_split_partial(dg_graph *g, const dg_output *x, dg_output *o) {
    dg_output parts[3];
    if (!dg_split(g, NULL, x[0], -1, 3, parts)) return 0;
    o[0] = parts[0];
    o[1] = parts[2];
    return 2;
}

static const int64_t SL_B[] = {1, 1}, SL_S[] = {2, -1}, SL3_B[] = {0, 1, 2}, SL3_S[] = {2, 1, -1};
B1(b_slice2, dg_slice(g, NULL, x[0], SL_B, SL_S, 2))
B1(b_slice3, dg_slice(g, NULL, x[0], SL3_B, SL3_S, 3))

static const int64_t FILL_DIMS[] = {3, 2};
B1(b_fill, dg_fill(g, NULL, dg_const_i64s(g, NULL, FILL_DIMS, 2), x[0]))

// x is used three times: the contributions are summed.
B1(b_shared, dg_add(g, NULL, dg_tanh(g, NULL, x[0]), dg_mul(g, NULL, x[0], x[0])))

// Several outputs of one graph, fed from shared inputs.
static int b_multi_out(dg_graph *g, const dg_output *x, dg_output *o) {
    o[0] = dg_sigmoid(g, NULL, dg_matmul(g, NULL, x[0], x[1], false, false));
    o[1] = dg_exp(g, NULL, x[1]);
    return 2;
}

// A two-layer network with the usual loss.
static int b_mlp(dg_graph *g, const dg_output *x, dg_output *o) {
    dg_output h = dg_tanh(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, x[0], x[1], false, false), x[2]));
    dg_output logits = dg_matmul(g, NULL, h, x[3], false, false);
    o[0] = dg_sparse_softmax_cross_entropy(g, NULL, logits, x[4]);
    return 1;
}

#define BIN_ROWS(op, bgen)                                                             \
    {#op " [3,4] [3,4]", b_##op, 2, {T2(3, 4, U), T2(3, 4, bgen)}},                    \
    {#op " [3,4] [4]", b_##op, 2, {T2(3, 4, U), T1(4, bgen)}},                         \
    {#op " [4] [3,4]", b_##op, 2, {T1(4, U), T2(3, 4, bgen)}},                         \
    {#op " [3,1] [1,4]", b_##op, 2, {T2(3, 1, U), T2(1, 4, bgen)}},                    \
    {#op " [3,4] scalar", b_##op, 2, {T2(3, 4, U), T0(bgen)}},                         \
    {#op " scalar [3,4]", b_##op, 2, {T0(U), T2(3, 4, bgen)}},                         \
    {#op " [2,3,4] [3,1]", b_##op, 2, {T3(2, 3, 4, U), T2(3, 1, bgen)}},               \
    {#op " [?,4] [4]", b_##op, 2, {T2Q(3, 4, U), T1(4, bgen)}}

static const grad_case grad_cases[] = {
    {"MatMul", b_matmul_nn, 2, {T2(3, 4, U), T2(4, 5, U)}},
    {"MatMul transpose_b", b_matmul_nt, 2, {T2(3, 4, U), T2(5, 4, U)}},
    {"MatMul transpose_a", b_matmul_tn, 2, {T2(4, 3, U), T2(4, 5, U)}},
    {"MatMul transpose_a transpose_b", b_matmul_tt, 2, {T2(4, 3, U), T2(5, 4, U)}},
    {"MatMul [?,4]", b_matmul_nn, 2, {T2Q(3, 4, U), T2(4, 2, U)}},
    BIN_ROWS(add, U),
    BIN_ROWS(sub, U),
    BIN_ROWS(mul, U),
    BIN_ROWS(div, NZ),
    BIN_ROWS(maximum, U),
    BIN_ROWS(minimum, U),
    {"AddN", b_add_n, 3, {T2(3, 4, U), T2(3, 4, U), T2(3, 4, U)}},
    {"BiasAdd", b_bias_add, 2, {T2(3, 4, U), T1(4, U)}},
    {"BiasAdd rank 3", b_bias_add, 2, {T3(2, 3, 4, U), T1(4, U)}},
    {"Relu", b_relu, 1, {T2(3, 4, AWAY)}},
    {"Sigmoid", b_sigmoid, 1, {T2(3, 4, G_UNIFORM, -3, 3)}},
    {"Tanh", b_tanh, 1, {T2(3, 4, G_UNIFORM, -2, 2)}},
    {"Exp", b_exp, 1, {T2(3, 4, U)}},
    {"Log", b_log, 1, {T2(3, 4, POS)}},
    {"Square", b_square, 1, {T2(3, 4, U)}},
    {"Sqrt", b_sqrt, 1, {T2(3, 4, POS)}},
    {"Rsqrt", b_rsqrt, 1, {T2(3, 4, POS)}},
    {"BatchMatMulV2", b_bmm_nn, 2, {T3(2, 3, 4, U), T3(2, 4, 5, U)}},
    {"BatchMatMulV2 adj_y", b_bmm_nt, 2, {T3(2, 3, 4, U), T3(2, 5, 4, U)}},
    {"BatchMatMulV2 adj_x", b_bmm_tn, 2, {T3(2, 4, 3, U), T3(2, 4, 5, U)}},
    {"BatchMatMulV2 adj_x adj_y", b_bmm_tt, 2, {T3(2, 4, 3, U), T3(2, 5, 4, U)}},
    {"BatchMatMulV2 x broadcast (rank 2)", b_bmm_nn, 2, {T2(3, 4, U), T3(2, 4, 5, U)}},
    {"BatchMatMulV2 both broadcast", b_bmm_nt, 2, {T4(2, 1, 3, 4, U), T3(3, 5, 4, U)}},
    {"LayerNorm", b_layer_norm, 3, {T2(3, 5, G_UNIFORM, -2, 2), T1(5, U), T1(5, U)}},
    {"LayerNorm rank 3, odd width", b_layer_norm, 3, {T3(2, 3, 7, G_UNIFORM, -2, 2), T1(7, U), T1(7, U)}},
    {"LayerNorm width 1", b_layer_norm, 3, {T2(4, 1, U), T1(1, U), T1(1, U)}},
    {"Attention", b_att, 3, {T3(2, 3, 4, U), T3(2, 5, 4, U), T3(2, 5, 3, U)}},
    {"Attention causal", b_att_causal, 3, {T3(2, 4, 3, U), T3(2, 4, 3, U), T3(2, 4, 2, U)}},
    {"Attention causal, Tq < Tk, scale 0.7", b_att_causal_scaled, 3, {T3(1, 3, 2, U), T3(1, 5, 2, U), T3(1, 5, 3, U)}},
    {"Attention causal, Tq > Tk (rows that see no key)", b_att_causal, 3, {T2(5, 2, U), T2(3, 2, U), T2(3, 2, U)}},
    {"Attention rank 4 (batch, heads)", b_att_causal, 3, {T4(2, 2, 3, 2, U), T4(2, 2, 3, 2, U), T4(2, 2, 3, 2, U)}},
    {"Attention masked (padding mask [2,1,1,4] over batch and heads)", b_att_mask_pad, 3,
     {T4(2, 2, 3, 2, U), T4(2, 2, 4, 2, U), T4(2, 2, 4, 3, U)}},
    {"Attention masked and causal (mask [3,3] for every batch index)", b_att_mask_2d_causal, 3,
     {T3(2, 3, 2, U), T3(2, 3, 2, U), T3(2, 3, 2, U)}},
    {"Attention causal, 67 rows (a block of 64 and a tail)", b_att_causal, 3,
     {T2(67, 2, G_UNIFORM, -2, 2), T2(67, 2, G_UNIFORM, -2, 2), T2(67, 1, U)}},
    {"Erf", b_erf, 1, {T2(3, 4, G_UNIFORM, -2.5, 2.5)}},
    {"Sin", b_sin, 1, {T2(3, 4, G_UNIFORM, -4, 4)}},
    {"stack (Pack) axis 1", b_stack1, 3, {T2(2, 3, U), T2(2, 3, U), T2(2, 3, U)}},
    {"stack (Pack) axis -1", b_stack_last, 2, {T1(4, U), T1(4, U)}},
    {"unstack (Unpack) axis 1", b_unstack, 1, {T3(2, 3, 4, U)}},
    {"Cos", b_cos, 1, {T2(3, 4, G_UNIFORM, -4, 4)}},
    {"Gelu", b_gelu, 1, {T2(3, 4, G_UNIFORM, -4, 4)}},
    {"Gelu approximate", b_gelu_tanh, 1, {T2(3, 4, G_UNIFORM, -4, 4)}},
    {"Neg", b_neg, 1, {T2(3, 4, U)}},
    {"ClipByValue scalar bounds", b_clip, 3,
     {T2(4, 5, G_UNIFORM, -2, 2), T0(G_UNIFORM, -0.6, -0.4), T0(G_UNIFORM, 0.4, 0.6)}},
    {"ClipByValue x-shaped bounds", b_clip, 3,
     {T2(4, 5, G_UNIFORM, -2, 2), T2(4, 5, G_UNIFORM, -0.9, -0.1), T2(4, 5, G_UNIFORM, 0.1, 0.9)}},
    {"Softmax", b_softmax, 1, {T2(3, 5, G_UNIFORM, -2, 2)}},
    {"Softmax rank 3", b_softmax, 1, {T3(2, 3, 4, G_UNIFORM, -2, 2)}},
    {"LogSoftmax", b_log_softmax, 1, {T2(3, 5, G_UNIFORM, -2, 2)}},
    {"LogSoftmax rank 3", b_log_softmax, 1, {T3(2, 3, 4, G_UNIFORM, -2, 2)}},
    {"SoftmaxCrossEntropyWithLogits", b_xent, 2, {T2(4, 5, G_UNIFORM, -2, 2), T2(4, 5, SX)}},
    {"SparseSoftmaxCrossEntropyWithLogits int64", b_sparse_xent, 2,
     {T2(4, 5, G_UNIFORM, -2, 2), LABELS(4, 5, DG_INT64)}},
    {"SparseSoftmaxCrossEntropyWithLogits int32", b_sparse_xent, 2,
     {T2(4, 5, G_UNIFORM, -2, 2), LABELS(4, 5, DG_INT32)}},
    {"sparse_softmax_cross_entropy (mean)", b_sparse_xent_mean, 2,
     {T2(4, 5, G_UNIFORM, -2, 2), LABELS(4, 5, DG_INT64)}},
    {"Sum axis 1", b_sum_1, 1, {T2(3, 4, U)}},
    {"Sum axis 1 keep_dims", b_sum_1k, 1, {T2(3, 4, U)}},
    {"Sum axes 0,2", b_sum_02, 1, {T3(2, 3, 4, U)}},
    {"Sum axes 0,2 keep_dims", b_sum_02k, 1, {T3(2, 3, 4, U)}},
    {"Sum axis -1", b_sum_m1, 1, {T3(2, 3, 4, U)}},
    {"Sum all", b_sum_all, 1, {T3(2, 3, 4, U)}},
    {"Sum all keep_dims", b_sum_allk, 1, {T3(2, 3, 4, U)}},
    {"Sum all [?,4]", b_sum_all, 1, {T2Q(3, 4, U)}},
    {"Mean axis 0", b_mean_0, 1, {T2(3, 4, U)}},
    {"Mean axes 1,2 keep_dims", b_mean_12k, 1, {T3(2, 3, 4, U)}},
    {"Mean axes 0,2", b_mean_02, 1, {T3(2, 3, 4, U)}},
    {"Mean all", b_mean_all, 1, {T3(2, 3, 4, U)}},
    {"Mean all keep_dims", b_mean_allk, 1, {T2(3, 4, U)}},
    {"Mean axis 0 [?,4]", b_mean_0, 1, {T2Q(3, 4, U)}},
    {"Max axis 1", b_max_1, 1, {T2(3, 4, U)}},
    {"Max axis 1 keep_dims", b_max_1k, 1, {T2(3, 4, U)}},
    {"Max axes 0,2", b_max_02, 1, {T3(2, 3, 4, U)}},
    {"Max axis -1 keep_dims", b_max_m1k, 1, {T3(2, 3, 4, U)}},
    {"Max all", b_max_all, 1, {T3(2, 3, 4, U)}},
    {"Max all keep_dims", b_max_allk, 1, {T2(3, 4, U)}},
    {"Reshape [2,-1]", b_reshape_2m1, 1, {T2(3, 4, U)}},
    {"Reshape [6,2] from rank 3", b_reshape_62, 1, {T3(2, 3, 2, U)}},
    {"Reshape [-1] from [?,4]", b_reshape_flat, 1, {T2Q(3, 4, U)}},
    // x1 only gives its shape: not differentiated (see test_unconnected_x).
    {"Reshape to a run-time shape", b_reshape_to_shape_of, 2,
     {T2(3, 4, U), {3, {2, 2, 3}, U, 0, true, false}}},
    {"Concat axis 0", b_concat0, 2, {T2(2, 3, U), T2(4, 3, U)}},
    {"Concat axis 1", b_concat1, 3, {T2(2, 3, U), T2(2, 1, U), T2(2, 2, U)}},
    {"Concat axis -1 rank 3", b_concat_m1, 2, {T3(2, 3, 1, U), T3(2, 3, 2, U)}},
    {"Split axis 1", b_split1, 1, {T2(2, 6, U)}},
    {"Split axis 0 rank 3", b_split0, 1, {T3(4, 2, 3, U)}},
    {"Split, some outputs unused", b_split_partial, 1, {T2(2, 6, U)}},
    {"Slice", b_slice2, 1, {T2(4, 5, U)}},
    {"Slice rank 3", b_slice3, 1, {T3(3, 2, 5, U)}},
    {"Identity", b_identity, 1, {T2(3, 4, U)}},
    {"abs (composed)", b_abs, 1, {T2(3, 4, AWAY)}},
    {"sigmoid_cross_entropy_with_logits (composed)", b_sigmoid_xent, 2,
     {T2(3, 4, G_AWAY0, 0.1, 3.0), T2(3, 4, G_UNIFORM, 0, 1)}},
    {"l2_loss (composed)", b_l2_loss, 1, {T2(3, 4, U)}},
    {"expand_dims axis 1", b_expand_dims1, 1, {T2(3, 4, U)}},
    {"squeeze axis 1", b_squeeze1, 1, {T3(3, 1, 4, U)}},
    {"clip_by_global_norm, clipping", b_clip_global, 3, {T2(3, 4, U), T1(4, U), T0(G_UNIFORM, 4, 5)}},
    {"clip_by_global_norm, not clipping", b_clip_global_small, 3, {T2(3, 4, U), T1(4, U), T0(G_UNIFORM, 0.05, 0.1)}},
    {"Fill value", b_fill, 1, {T0(U)}},
    {"shared input", b_shared, 1, {T2(3, 4, U)}},
    {"several outputs", b_multi_out, 2, {T2(3, 4, U), T2(4, 2, U)}},
    {"Pow", b_pow, 2, {T2(3, 4, POS), T2(3, 4, U)}},
    {"Pow, scalar exponent", b_pow, 2, {T2(3, 4, POS), T0(G_UNIFORM, 0.5, 3)}},
    {"Pow, broadcast base", b_pow, 2, {T1(4, POS), T2(3, 4, U)}},
    {"Transpose [2,0,1]", b_transpose3, 1, {T3(2, 3, 4, U)}},
    {"Transpose [1,0]", b_transpose2, 1, {T2(3, 5, U)}},
    {"Transpose [0,2,1,3] (rows copied whole)", b_transpose4, 1, {T4(2, 3, 4, 5, U)}},
    {"Tile [2,3]", b_tile2, 1, {T2(2, 3, U)}},
    {"Tile [1,3,1]", b_tile3, 1, {T3(2, 2, 3, U)}},
    {"where, same shapes", b_where, 3, {T2N(3, 4, NZ), T2(3, 4, U), T2(3, 4, U)}},
    {"where, broadcast", b_where, 3, {T2N(3, 1, NZ), T1(4, U), T2(3, 4, U)}},
    {"Conv2D VALID", b_conv_valid, 2, {T4(2, 5, 5, 3, U), T4(3, 3, 3, 4, U)}},
    {"Conv2D SAME stride 2", b_conv_same_s2, 2, {T4(2, 6, 5, 2, U), T4(3, 2, 2, 3, U)}},
    {"Conv2D SAME even window, strides 1x2", b_conv_same_s12, 2, {T4(1, 4, 5, 2, U), T4(2, 2, 2, 2, U)}},
    {"Conv2D VALID strides 3x2", b_conv_valid_s3, 2, {T4(2, 7, 6, 2, U), T4(2, 3, 2, 3, U)}},
    {"Conv2D 1x1", b_conv_valid, 2, {T4(2, 3, 3, 4, U), T4(1, 1, 4, 2, U)}},
    {"MaxPool 2x2 VALID", b_max_pool_valid, 1, {T4(2, 4, 5, 3, U)}},
    {"MaxPool 3x3 SAME stride 2", b_max_pool_same, 1, {T4(1, 5, 5, 2, U)}},
    {"AvgPool 2x2 VALID", b_avg_pool_valid, 1, {T4(2, 4, 5, 3, U)}},
    {"AvgPool 3x2 SAME strides 2x1", b_avg_pool_same, 1, {T4(1, 5, 4, 2, U)}},
    {"CNN", b_cnn, 4, {T4(2, 4, 4, 1, U), T4(3, 3, 1, 2, U), T2(8, 3, U), LABELS(2, 3, DG_INT64)}},
    {"MLP", b_mlp, 5,
     {T2(4, 3, U), T2(3, 5, U), T1(5, U), T2(5, 3, U), LABELS(4, 3, DG_INT64)}},
};
#define N_GRAD_CASES ((int)(sizeof grad_cases / sizeof grad_cases[0]))

static dg_shape spec_shape(const in_spec *sp) {
    return dg_shape_make(sp->rank, sp->d);
}

static dg_tensor *make_input(const in_spec *sp, uint64_t *rng) {
    dg_status *st = dg_status_new();
    dg_shape s = spec_shape(sp);
    dg_dtype dt = sp->dtype ? sp->dtype : DG_FLOAT64;
    dg_tensor *t = dg_tensor_new(dt, s, st);
    assert_ok(st);
    int64_t n = dg_tensor_num_elements(t);
    for (int64_t i = 0; i < n; i++) {
        double v = dg_test_uniform(rng, sp->lo, sp->hi);
        if (sp->gen == G_AWAY0 && dg_test_uniform(rng, 0, 1) < 0.5) v = -v;
        if (sp->gen == G_LABELS) v = floor(v);
        switch (dt) {
        case DG_FLOAT64: dg_tensor_f64(t)[i] = v; break;
        case DG_INT64: dg_tensor_i64(t)[i] = (int64_t)v; break;
        case DG_INT32: dg_tensor_i32(t)[i] = (int32_t)v; break;
        default: fail_msg("unsupported input dtype");
        }
    }
    if (sp->gen == G_SIMPLEX) {
        int64_t c = s.rank ? s.dims[s.rank - 1] : 1;
        for (int64_t r = 0; r < n / c; r++) {
            double sum = 0;
            for (int64_t j = 0; j < c; j++) sum += dg_tensor_f64(t)[r * c + j];
            for (int64_t j = 0; j < c; j++) dg_tensor_f64(t)[r * c + j] /= sum;
        }
    }
    dg_status_free(&st);
    return t;
}

static double run_scalar(dg_session *s, const dg_output *feeds, dg_tensor *const *vals, int n,
                         dg_output f) {
    dg_tensor *out = NULL;
    run_ok(s, feeds, vals, n, &f, &out, 1);
    assert_int_equal(dg_tensor_num_elements(out), 1);
    double v = dg_tensor_f64(out)[0];
    dg_tensor_unref(out);
    return v;
}

static void check_grad_case(void **state) {
    const grad_case *c = *state;
    uint64_t rng = 0x5eed0000u + (uint64_t)(c - grad_cases) * 7919u;
    dg_graph *g = dg_graph_new();
    dg_output x[MAX_IN];
    dg_tensor *val[MAX_IN];
    for (int k = 0; k < c->n_in; k++) {
        const in_spec *sp = &c->in[k];
        dg_shape ps = spec_shape(sp);
        if (sp->unknown0) ps.dims[0] = -1;
        char name[16];
        snprintf(name, sizeof name, "x%d", k);
        x[k] = dg_placeholder(g, name, sp->dtype ? sp->dtype : DG_FLOAT64, ps);
        val[k] = make_input(sp, &rng);
    }
    dg_output outs[MAX_OUT];
    int n_out = c->build(g, x, outs);
    assert_graph_ok(g);
    assert_true(n_out >= 1 && n_out <= MAX_OUT);

    // The forward values give the output shapes for the weights.
    dg_session *s = new_session(g);
    dg_tensor *fwd[MAX_OUT];
    run_ok(s, x, val, c->n_in, outs, fwd, n_out);
    dg_output terms[MAX_OUT];
    for (int k = 0; k < n_out; k++) {
        assert_int_equal(dg_tensor_dtype(fwd[k]), DG_FLOAT64);
        dg_tensor *w = random_f64(*dg_tensor_shape(fwd[k]), -1, 1, &rng);
        dg_output wk = dg_const(g, NULL, w);
        terms[k] = dg_sum(g, NULL, dg_mul(g, NULL, outs[k], wk), NULL, 0, false);
        dg_tensor_unref(w);
        dg_tensor_unref(fwd[k]);
    }
    dg_output f = dg_add_n(g, "f", terms, n_out);
    assert_graph_ok(g);

    dg_output xs[MAX_IN], dx[MAX_IN];
    int idx[MAX_IN], n_xs = 0;
    for (int k = 0; k < c->n_in; k++)
        if (!c->in[k].no_diff) {
            idx[n_xs] = k;
            xs[n_xs++] = x[k];
        }
    bool ok = dg_gradients(g, &f, 1, xs, n_xs, NULL, dx);
    assert_graph_ok(g);
    assert_true(ok);
    for (int i = 0; i < n_xs; i++) assert_non_null(dx[i].node);

    dg_tensor *analytic[MAX_IN];
    run_ok(s, x, val, c->n_in, dx, analytic, n_xs);

    for (int i = 0; i < n_xs; i++) {
        dg_tensor *xv = val[idx[i]];
        const dg_shape *want = dg_tensor_shape(xv);
        assert_true(dg_shape_equal(dg_tensor_shape(analytic[i]), want));
        int64_t n = dg_tensor_num_elements(xv);
        double *numeric = calloc((size_t)n + 1, sizeof *numeric);
        assert_non_null(numeric);
        double *p = dg_tensor_f64(xv);
        for (int64_t e = 0; e < n; e++) {
            double x0 = p[e], h = FD_STEP * fmax(1.0, fabs(x0));
            p[e] = x0 + h;
            double fp = run_scalar(s, x, val, c->n_in, f);
            p[e] = x0 - h;
            double fm = run_scalar(s, x, val, c->n_in, f);
            p[e] = x0;
            numeric[e] = (fp - fm) / (2 * h);
        }
        double atol = scaled_atol(numeric, n, GRAD_TOL);
        int64_t far = dg_test_first_far_f64(dg_tensor_f64(analytic[i]), numeric, n, atol, 0);
        if (far >= 0) {
            for (int64_t e = 0; e < n; e++)
                print_message("  %s x%d[%lld]: analytic %.12g numeric %.12g\n", c->name, idx[i],
                              (long long)e, dg_tensor_f64(analytic[i])[e], numeric[e]);
            fail_msg("%s: gradient of x%d, element %lld, beyond %g of the largest", c->name, idx[i],
                     (long long)far, GRAD_TOL);
        }
        free(numeric);
        dg_tensor_unref(analytic[i]);
    }
    for (int k = 0; k < c->n_in; k++) dg_tensor_unref(val[k]);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Gradients: special cases

// Cast float64 -> float32 -> float64: the gradient is the weight rounded to float32.
static void test_cast_chain(void **state) {
    (void)state;
    uint64_t rng = 42;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(2, 3));
    dg_output y = dg_cast(g, NULL, dg_cast(g, NULL, x, DG_FLOAT32), DG_FLOAT64);
    assert_string_equal(dg_node_op_type(y.node), "Cast");
    dg_tensor *w = random_f64(dg_shape2(2, 3), -1, 1, &rng);
    dg_output f = dg_sum(g, NULL, dg_mul(g, NULL, y, dg_const(g, NULL, w)), NULL, 0, false);
    dg_output dx;
    assert_true(dg_gradients(g, &f, 1, &x, 1, NULL, &dx));
    assert_graph_ok(g);
    assert_non_null(dx.node);
    assert_int_equal(dg_output_dtype(dx), DG_FLOAT64);
    dg_session *s = new_session(g);
    dg_tensor *xv = random_f64(dg_shape2(2, 3), -1, 1, &rng), *out[2];
    dg_output fetches[2] = {dx, y};
    run_ok(s, &x, &xv, 1, fetches, out, 2);
    for (int i = 0; i < 6; i++) {
        assert_true(dg_tensor_f64(out[0])[i] == (double)(float)dg_tensor_f64(w)[i]);
        assert_true(dg_tensor_f64(out[1])[i] == (double)(float)dg_tensor_f64(xv)[i]);
    }
    // A cast to the same type is no node at all.
    assert_true(dg_cast(g, NULL, x, DG_FLOAT64).node == x.node);
    dg_tensor_unref(out[0]);
    dg_tensor_unref(out[1]);
    dg_tensor_unref(xv);
    dg_tensor_unref(w);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// Element i of a float32 or float64 tensor := v (rounded for float32).
static void set_elem(dg_tensor *t, int64_t i, double v) {
    if (dg_tensor_dtype(t) == DG_FLOAT32) dg_tensor_f32(t)[i] = (float)v;
    else dg_tensor_f64(t)[i] = v;
}

// Rsqrt, Erf and both GELUs, float64 and float32, against values computed here from their
// definitions with the C library (erf, tanh, sqrt in float64) and against tabulated points.
static void test_rsqrt_erf_gelu_values(void **state) {
    (void)state;
    enum { N = 9 };
    const double xs[N] = {-4, -2.5, -1, -0.3, 0, 0.3, 1, 2.5, 4};
    // erf(1) and erf(0.3) to 16 digits (Abramowitz and Stegun, table 7.1).
    const double erf1 = 0.8427007929497149, erf03 = 0.3286267594591274;
    for (int f32 = 0; f32 < 2; f32++) {
        dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
        dg_graph *g = dg_graph_new();
        dg_output x = dg_placeholder(g, "x", dt, dg_shape1(N));
        dg_output ax = dg_placeholder(g, "ax", dt, dg_shape1(N));   // |x| + 0.25, for Rsqrt
        dg_output outs[4] = {dg_erf(g, NULL, x), dg_gelu(g, NULL, x, false), dg_gelu(g, NULL, x, true),
                             dg_rsqrt(g, NULL, ax)};
        assert_graph_ok(g);
        dg_tensor *xv = dg_tensor_new(dt, dg_shape1(N), NULL), *av = dg_tensor_new(dt, dg_shape1(N), NULL);
        assert_non_null(xv);
        assert_non_null(av);
        for (int i = 0; i < N; i++) {
            set_elem(xv, i, xs[i]);
            set_elem(av, i, fabs(xs[i]) + 0.25);
        }
        dg_session *s = new_session(g);
        dg_output feeds[2] = {x, ax};
        dg_tensor *fv[2] = {xv, av}, *got[4];
        run_ok(s, feeds, fv, 2, outs, got, 4);
        double want[4][N];
        for (int i = 0; i < N; i++) {
            double v = dg_tensor_get_as_double(xv, i);   // the float32 input, exactly
            double u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
            want[0][i] = erf(v);
            want[1][i] = 0.5 * v * (1 + erf(v / sqrt(2.0)));
            want[2][i] = 0.5 * v * (1 + tanh(u));
            want[3][i] = 1 / sqrt(dg_tensor_get_as_double(av, i));
        }
        double tol = f32 ? 2e-7 : 1e-15;
        for (int k = 0; k < 4; k++) {
            double gv[N];
            for (int i = 0; i < N; i++) gv[i] = dg_tensor_get_as_double(got[k], i);
            assert_close_f64_msg(gv, want[k], N, tol, tol, "output %d, %s", k, f32 ? "float32" : "float64");
            dg_tensor_unref(got[k]);
        }
        if (!f32) {
            // Independent points: erf(1), erf(-0.3) = -erf(0.3), GELU(0) = 0, GELU(-4) about
            // -1.27e-4, the tanh form within 1e-3 of the erf form everywhere here.
            assert_close(want[0][6], erf1, 1e-15, 0);
            assert_close(want[0][3], -erf03, 1e-15, 0);
            assert_close(want[1][4], 0, 0, 0);
            // GELU(-4) = -4 Phi(-4), Phi(-4) = 3.1671241833e-5 (tables of the normal distribution).
            assert_close(want[1][0], -4 * 3.1671241833e-05, 0, 1e-9);
            for (int i = 0; i < N; i++) assert_close(want[2][i], want[1][i], 1e-3, 0);
        }
        dg_tensor_unref(xv);
        dg_tensor_unref(av);
        dg_session_free(&s);
        dg_graph_free(&g);
    }
}

// Sum and Mean over every non-empty subset of the axes of a [3, 4, 21] tensor (rows of 21: the 8-lane
// loop and its tail; leading, trailing and middle axes), float32 and float64, against sums in
// long double.
static void test_reduce_values(void **state) {
    (void)state;
    enum { D0 = 3, D1 = 4, D2 = 21, N = D0 * D1 * D2 };
    const int64_t dims[3] = {D0, D1, D2};
    for (int f32 = 0; f32 < 2; f32++)
        for (int mean = 0; mean < 2; mean++)
            for (unsigned mask = 1; mask < 8; mask++) {   // no axes means all: mask 7
                dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
                dg_graph *g = dg_graph_new();
                dg_output x = dg_placeholder(g, "x", dt, dg_shape3(D0, D1, D2));
                int64_t axes[3];
                int n_axes = 0;
                for (int d = 0; d < 3; d++)
                    if (mask & (1u << d)) axes[n_axes++] = d;
                dg_output y = (mean ? dg_mean : dg_sum)(g, NULL, x, axes, n_axes, true);
                assert_graph_ok(g);
                dg_tensor *xv = dg_tensor_new(dt, dg_shape3(D0, D1, D2), NULL);
                assert_non_null(xv);
                for (int i = 0; i < N; i++) set_elem(xv, i, 1000.0 + 0.37 * (i % 17) - 0.011 * i);
                dg_session *s = new_session(g);
                dg_tensor *got;
                run_ok(s, &x, &xv, 1, &y, &got, 1);
                long double want[D0 * D1 * D2] = {0};
                int64_t cnt = 1;
                for (int d = 0; d < 3; d++)
                    if (mask & (1u << d)) cnt *= dims[d];
                int64_t kd[3];
                for (int d = 0; d < 3; d++) kd[d] = (mask & (1u << d)) ? 1 : dims[d];
                for (int i0 = 0; i0 < D0; i0++)
                    for (int i1 = 0; i1 < D1; i1++)
                        for (int i2 = 0; i2 < D2; i2++) {
                            int64_t k0 = kd[0] == 1 ? 0 : i0, k1 = kd[1] == 1 ? 0 : i1, k2 = kd[2] == 1 ? 0 : i2;
                            want[(k0 * kd[1] + k1) * kd[2] + k2] +=
                                dg_tensor_get_as_double(xv, ((int64_t)i0 * D1 + i1) * D2 + i2);
                        }
                int64_t n_out = kd[0] * kd[1] * kd[2];
                assert_int_equal(dg_tensor_num_elements(got), n_out);
                double have[D0 * D1 * D2], w[D0 * D1 * D2];
                for (int64_t i = 0; i < n_out; i++) {
                    have[i] = dg_tensor_get_as_double(got, i);
                    w[i] = (double)(mean ? want[i] / cnt : want[i]);
                }
                double tol = f32 ? 1e-6 : 1e-13;
                assert_close_f64_msg(have, w, n_out, 0, tol, "%s over mask %u, %s", mean ? "Mean" : "Sum", mask,
                                     f32 ? "float32" : "float64");
                dg_tensor_unref(got);
                dg_tensor_unref(xv);
                dg_session_free(&s);
                dg_graph_free(&g);
            }
}

// LayerNorm's three outputs against a two-pass reference in long double, float64 and float32,
// on rows with a large mean (where a one-pass variance loses digits) and a constant row.
static void test_layer_norm_values(void **state) {
    (void)state;
    enum { R = 4, C = 6 };
    double xs[R][C] = {{1, 2, 3, 4, 5, 6},
                       {1e4 + 0.5, 1e4 - 0.25, 1e4 + 0.125, 1e4, 1e4 - 1, 1e4 + 2},
                       {-3, -3, -3, -3, -3, -3},
                       {0.1, -0.7, 2.5, -1.25, 0.3, 0.05}};
    const double gs[C] = {1, 0.5, -2, 1.5, 0.25, 3}, bs[C] = {0, 1, -1, 0.5, 2, -0.5}, eps = 1e-3;
    long double mean[R], rstd[R], want[R][C];
    for (int r = 0; r < R; r++) {
        long double s = 0, q = 0;
        for (int c = 0; c < C; c++) s += xs[r][c];
        mean[r] = s / C;
        for (int c = 0; c < C; c++) q += (xs[r][c] - mean[r]) * (xs[r][c] - mean[r]);
        rstd[r] = 1 / sqrtl(q / C + eps);
        for (int c = 0; c < C; c++) want[r][c] = (xs[r][c] - mean[r]) * rstd[r] * gs[c] + bs[c];
    }
    // The constant row normalises to beta exactly.
    for (int c = 0; c < C; c++) assert_close((double)want[2][c], bs[c], 0, 0);
    for (int f32 = 0; f32 < 2; f32++) {
        dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
        dg_graph *g = dg_graph_new();
        dg_output x = dg_placeholder(g, "x", dt, dg_shape2(R, C));
        dg_tensor *xv = dg_tensor_new(dt, dg_shape2(R, C), NULL), *gv = dg_tensor_new(dt, dg_shape1(C), NULL),
                  *bv = dg_tensor_new(dt, dg_shape1(C), NULL);
        for (int i = 0; i < R * C; i++) set_elem(xv, i, xs[i / C][i % C]);
        for (int c = 0; c < C; c++) {
            set_elem(gv, c, gs[c]);
            set_elem(bv, c, bs[c]);
        }
        dg_output y = dg_layer_norm(g, "ln", x, dg_const(g, NULL, gv), dg_const(g, NULL, bv), eps);
        assert_graph_ok(g);
        dg_output outs[3] = {y, {y.node, 1}, {y.node, 2}};
        dg_session *s = new_session(g);
        dg_tensor *got[3];
        run_ok(s, &x, &xv, 1, outs, got, 3);
        double gy[R * C], wy[R * C], gm[R], wm[R], gr[R], wr[R];
        for (int r = 0; r < R; r++) {
            // float32: the reference of the float32 input (row 1 rounds to float32's grid).
            long double s = 0, q = 0, xr[C];
            for (int c = 0; c < C; c++) s += xr[c] = dg_tensor_get_as_double(xv, r * C + c);
            long double mu = s / C;
            for (int c = 0; c < C; c++) q += (xr[c] - mu) * (xr[c] - mu);
            long double rs = 1 / sqrtl(q / C + eps);
            wm[r] = (double)mu;
            wr[r] = (double)rs;
            gm[r] = dg_tensor_get_as_double(got[1], r);
            gr[r] = dg_tensor_get_as_double(got[2], r);
            for (int c = 0; c < C; c++) {
                wy[r * C + c] = (double)((xr[c] - mu) * rs * (long double)dg_tensor_get_as_double(gv, c) +
                                         (long double)dg_tensor_get_as_double(bv, c));
                gy[r * C + c] = dg_tensor_get_as_double(got[0], r * C + c);
            }
        }
        if (!f32)
            for (int i = 0; i < R * C; i++) assert_close((double)want[i / C][i % C], wy[i], 0, 0);
        // float64: row 1's mean (1e4) is rounded to 2e-12, which x - mean carries into y (times
        // rstd and gamma, up to 3.3): 1e-11 absolute is that bound, not slack.
        double atol = f32 ? 1e-6 : 1e-11, rtol = f32 ? 1e-6 : 1e-13;
        assert_close_f64_msg(gy, wy, R * C, atol, rtol, "LayerNorm y, %s", f32 ? "float32" : "float64");
        assert_close_f64_msg(gm, wm, R, 0, f32 ? 1e-7 : 1e-15, "LayerNorm mean, %s", f32 ? "float32" : "float64");
        assert_close_f64_msg(gr, wr, R, 0, f32 ? 1e-6 : 1e-13, "LayerNorm rstd, %s", f32 ? "float32" : "float64");
        for (int k = 0; k < 3; k++) dg_tensor_unref(got[k]);
        // Differentiating through the mean output is refused, naming the node.
        dg_output dx;
        dg_output m = {y.node, 1};
        assert_false(dg_gradients(g, &m, 1, &x, 1, NULL, &dx));
        assert_int_equal(dg_status_code(dg_graph_status(g)), DG_UNIMPLEMENTED);
        assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "ln"));
        dg_tensor_unref(xv);
        dg_tensor_unref(gv);
        dg_tensor_unref(bv);
        dg_session_free(&s);
        dg_graph_free(&g);
    }
}

// BatchMatMulV2 against a triple loop in long double, with broadcast batch dimensions, each
// adjoint, float64 and float32; and the shapes it refuses.
static void test_batch_matmul_values(void **state) {
    (void)state;
    uint64_t rng = 7;
    // x [2, 1, 3, 4] (adj_x: [2, 1, 4, 3]), y [3, 4, 5] (adj_y: [3, 5, 4]): output [2, 3, 3, 5].
    enum { B0 = 2, B1 = 3, M = 3, K = 4, N = 5 };
    for (int variant = 0; variant < 8; variant++) {
        bool ax = variant & 1, ay = variant & 2, f32 = variant & 4;
        dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
        dg_shape xs = ax ? shape4(B0, 1, K, M) : shape4(B0, 1, M, K);
        dg_shape ys = ay ? dg_shape3(B1, N, K) : dg_shape3(B1, K, N);
        dg_graph *g = dg_graph_new();
        dg_output x = dg_placeholder(g, "x", dt, xs), y = dg_placeholder(g, "y", dt, ys);
        dg_output z = dg_batch_matmul(g, NULL, x, y, ax, ay);
        assert_graph_ok(g);
        dg_shape zs = dg_output_shape(z);
        assert_int_equal(zs.rank, 4);
        assert_true(zs.dims[0] == B0 && zs.dims[1] == B1 && zs.dims[2] == M && zs.dims[3] == N);
        dg_tensor *xv = dg_tensor_new(dt, xs, NULL), *yv = dg_tensor_new(dt, ys, NULL);
        for (int64_t i = 0; i < dg_tensor_num_elements(xv); i++) set_elem(xv, i, dg_test_uniform(&rng, -1, 1));
        for (int64_t i = 0; i < dg_tensor_num_elements(yv); i++) set_elem(yv, i, dg_test_uniform(&rng, -1, 1));
        dg_output feeds[2] = {x, y};
        dg_tensor *fv[2] = {xv, yv}, *got;
        dg_session *s = new_session(g);
        run_ok(s, feeds, fv, 2, &z, &got, 1);
        double want[B0 * B1 * M * N], have[B0 * B1 * M * N];
        for (int b0 = 0; b0 < B0; b0++)
            for (int b1 = 0; b1 < B1; b1++)
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        long double acc = 0;
                        for (int k = 0; k < K; k++) {
                            int64_t xi = b0 * M * K + (ax ? k * M + i : i * K + k);
                            int64_t yi = b1 * K * N + (ay ? j * K + k : k * N + j);
                            acc += (long double)dg_tensor_get_as_double(xv, xi) * dg_tensor_get_as_double(yv, yi);
                        }
                        int64_t o = ((b0 * B1 + b1) * M + i) * N + j;
                        want[o] = (double)acc;
                        have[o] = dg_tensor_get_as_double(got, o);
                    }
        double tol = f32 ? 1e-6 : 1e-14;
        assert_close_f64_msg(have, want, B0 * B1 * M * N, tol, tol, "BatchMatMulV2 adj_x=%d adj_y=%d %s", ax, ay,
                             f32 ? "float32" : "float64");
        dg_tensor_unref(got);
        dg_tensor_unref(xv);
        dg_tensor_unref(yv);
        dg_session_free(&s);
        dg_graph_free(&g);
    }
    // Inner dimensions that differ, batch dimensions that do not broadcast, a vector.
    const dg_shape bad[][2] = {{dg_shape3(2, 3, 4), dg_shape3(2, 5, 6)},
                               {dg_shape3(2, 3, 4), dg_shape3(3, 4, 5)},
                               {dg_shape1(4), dg_shape2(4, 5)}};
    const char *why[] = {"inner dimensions differ", "batch dimensions", "rank >= 2"};
    for (int i = 0; i < 3; i++) {
        dg_graph *g = dg_graph_new();
        dg_batch_matmul(g, "bad", dg_placeholder(g, "x", DG_FLOAT32, bad[i][0]),
                        dg_placeholder(g, "y", DG_FLOAT32, bad[i][1]), false, false);
        assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
        assert_non_null(strstr(dg_status_message(dg_graph_status(g)), why[i]));
        dg_graph_free(&g);
    }
}

// The attention's reference: softmax over the keys each row sees, in long double; rows that
// see none give 0 and a log-sum-exp of -inf.
// The same with a mask given in full, [B, Tq, Tk] (NULL: none): a left-out pair gets no weight.
static void attention_reference_masked(const dg_tensor *q, const dg_tensor *k, const dg_tensor *v, const uint8_t *mask,
                                       int64_t B, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool causal,
                                       double scale, double *out, double *lse) {
    long double *sc = malloc((size_t)(Tk ? Tk : 1) * sizeof *sc);
    assert_non_null(sc);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t lim = causal ? i + Tk - Tq + 1 : Tk;
            if (lim < 0) lim = 0;
            if (lim > Tk) lim = Tk;
            long double m = -INFINITY, sum = 0;
            int64_t seen = 0;
            for (int64_t j = 0; j < lim; j++) {
                if (mask && !mask[(b * Tq + i) * Tk + j]) {
                    sc[j] = -INFINITY;
                    continue;
                }
                seen++;
                long double acc = 0;
                for (int64_t c = 0; c < D; c++)
                    acc += (long double)dg_tensor_get_as_double(q, (b * Tq + i) * D + c) *
                           dg_tensor_get_as_double(k, (b * Tk + j) * D + c);
                sc[j] = acc * scale;
                if (sc[j] > m) m = sc[j];
            }
            // The pairs seen are read from the mask again (not from sc[j] == -inf: valgrind's
            // long double is a double, and its comparisons of infinities are not to be trusted).
#define REF_SEES(j) (!mask || mask[(b * Tq + i) * Tk + (j)])
            for (int64_t j = 0; j < lim; j++)
                if (REF_SEES(j)) sum += expl(sc[j] - m);
            for (int64_t c = 0; c < Dv; c++) {
                long double acc = 0;
                for (int64_t j = 0; j < lim; j++)
                    if (REF_SEES(j)) acc += expl(sc[j] - m) / sum * dg_tensor_get_as_double(v, (b * Tk + j) * Dv + c);
                out[(b * Tq + i) * Dv + c] = (double)acc;
            }
#undef REF_SEES
            lse[b * Tq + i] = seen ? (double)(m + logl(sum)) : -INFINITY;
        }
    free(sc);
}
static void attention_reference(const dg_tensor *q, const dg_tensor *k, const dg_tensor *v, int64_t B, int64_t Tq,
                                int64_t Tk, int64_t D, int64_t Dv, bool causal, double scale, double *out,
                                double *lse) {
    attention_reference_masked(q, k, v, NULL, B, Tq, Tk, D, Dv, causal, scale, out, lse);
}
// ScaledDotProductAttention's output and log-sum-exp against attention_reference: several
// blocks of query rows and a tail, a single query row over a long cache, rows that see no key,
// batch dimensions, a given scale; float64 and float32. Then the shapes it refuses.
static void test_attention_values(void **state) {
    (void)state;
    uint64_t rng = 11;
    static const struct {
        int64_t b0, b1, Tq, Tk, D, Dv;
        bool causal;
        double scale;
    } cases[] = {
        {2, 3, 130, 130, 8, 5, true, 0},    // two blocks of 64 and a tail of 2
        {2, 3, 130, 130, 8, 5, false, 0},
        {1, 2, 1, 70, 4, 3, false, 0.3},    // one new token over a cache of 70
        {1, 2, 1, 70, 4, 3, true, 0},       // causal: the last row sees every key
        {2, 1, 70, 3, 2, 2, true, 0},       // rows 0..66 see no key
        {1, 1, 5, 0, 3, 2, false, 0},       // no keys at all
        {1, 1, 4, 6, 0, 2, false, 1},       // width 0: uniform weights
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int f32 = 0; f32 < 2; f32++) {
            int64_t B = cases[ci].b0 * cases[ci].b1, Tq = cases[ci].Tq, Tk = cases[ci].Tk, D = cases[ci].D,
                    Dv = cases[ci].Dv;
            dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
            dg_shape qs = shape4(cases[ci].b0, cases[ci].b1, Tq, D), ks = shape4(cases[ci].b0, cases[ci].b1, Tk, D),
                     vs = shape4(cases[ci].b0, cases[ci].b1, Tk, Dv);
            dg_graph *g = dg_graph_new();
            dg_output q = dg_placeholder(g, "q", dt, qs), k = dg_placeholder(g, "k", dt, ks),
                      v = dg_placeholder(g, "v", dt, vs);
            dg_output o = dg_attention(g, "att", q, k, v, cases[ci].causal, cases[ci].scale);
            assert_graph_ok(g);
            dg_tensor *qv = dg_tensor_new(dt, qs, NULL), *kv = dg_tensor_new(dt, ks, NULL),
                      *vv = dg_tensor_new(dt, vs, NULL);
            dg_tensor *in[3] = {qv, kv, vv};
            for (int t = 0; t < 3; t++)
                for (int64_t i = 0; i < dg_tensor_num_elements(in[t]); i++)
                    set_elem(in[t], i, dg_test_uniform(&rng, -1.5, 1.5));
            dg_output feeds[3] = {q, k, v}, outs[2] = {o, {o.node, 1}};
            dg_tensor *got[2];
            dg_session *s = new_session(g);
            run_ok(s, feeds, in, 3, outs, got, 2);
            double scale = cases[ci].scale > 0 ? cases[ci].scale : D ? 1 / sqrt((double)D) : 1;
            double *want = malloc((size_t)(B * Tq * Dv + 1) * sizeof *want),
                   *wl = malloc((size_t)(B * Tq) * sizeof *wl), *have = malloc((size_t)(B * Tq * Dv + 1) * sizeof *have),
                   *hl = malloc((size_t)(B * Tq) * sizeof *hl);
            attention_reference(qv, kv, vv, B, Tq, Tk, D, Dv, cases[ci].causal, scale, want, wl);
            for (int64_t i = 0; i < B * Tq * Dv; i++) have[i] = dg_tensor_get_as_double(got[0], i);
            for (int64_t i = 0; i < B * Tq; i++) hl[i] = dg_tensor_get_as_double(got[1], i);
            double tol = f32 ? 2e-6 : 1e-13;
            assert_close_f64_msg(have, want, B * Tq * Dv, tol, tol, "attention case %zu output, %s", ci,
                                 f32 ? "float32" : "float64");
            assert_close_f64_msg(hl, wl, B * Tq, tol, tol, "attention case %zu lse, %s", ci, f32 ? "float32" : "float64");
            free(want);
            free(wl);
            free(have);
            free(hl);
            for (int t = 0; t < 2; t++) dg_tensor_unref(got[t]);
            for (int t = 0; t < 3; t++) dg_tensor_unref(in[t]);
            dg_session_free(&s);
            dg_graph_free(&g);
        }
    // Shapes that do not fit together, a wrong dtype, a negative scale: refused at build time,
    // naming the op and the shapes.
    const dg_shape bad[][3] = {{dg_shape3(2, 3, 4), dg_shape3(2, 5, 3), dg_shape3(2, 5, 3)},    // D differs
                               {dg_shape3(2, 3, 4), dg_shape3(2, 5, 4), dg_shape3(2, 6, 3)},    // Tk differs
                               {dg_shape3(2, 3, 4), dg_shape3(3, 5, 4), dg_shape3(3, 5, 3)},    // batch differs
                               {dg_shape1(4), dg_shape1(4), dg_shape1(4)}};
    for (int i = 0; i < 4; i++) {
        dg_graph *g = dg_graph_new();
        dg_attention(g, "bad", dg_placeholder(g, "q", DG_FLOAT32, bad[i][0]), dg_placeholder(g, "k", DG_FLOAT32, bad[i][1]),
                     dg_placeholder(g, "v", DG_FLOAT32, bad[i][2]), true, 0);
        assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
        const char *msg = dg_status_message(dg_graph_status(g));
        assert_non_null(strstr(msg, "ScaledDotProductAttention"));
        assert_non_null(strstr(msg, "[..., Tq, D]"));
        dg_graph_free(&g);
    }
    dg_graph *g = dg_graph_new();
    dg_output q = dg_placeholder(g, "q", DG_FLOAT32, dg_shape2(3, 4));
    dg_attention(g, "neg", q, q, q, false, -1);
    assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "scale -1"));
    dg_graph_free(&g);
    // Unknown shapes pass the build; the kernel refuses the fed ones, naming the node and sizes.
    g = dg_graph_new();
    const int64_t unknown[3] = {-1, -1, -1};
    dg_output uq = dg_placeholder(g, "q", DG_FLOAT64, dg_shape_make(3, unknown));
    dg_output uk = dg_placeholder(g, "k", DG_FLOAT64, dg_shape_make(3, unknown));
    dg_output o = dg_attention(g, "att_run", uq, uk, uk, true, 0);
    assert_graph_ok(g);
    dg_tensor *qv = dg_tensor_new(DG_FLOAT64, dg_shape3(1, 3, 4), NULL), *kv = dg_tensor_new(DG_FLOAT64, dg_shape3(1, 5, 3), NULL);
    memset(dg_tensor_f64(qv), 0, 12 * sizeof(double));
    memset(dg_tensor_f64(kv), 0, 15 * sizeof(double));
    dg_session *s = new_session(g);
    dg_output feeds[2] = {uq, uk};
    dg_tensor *fv[2] = {qv, kv}, *got = NULL;
    dg_status *st = dg_status_new();
    assert_false(dg_session_run(s, feeds, fv, 2, &o, &got, 1, NULL, 0, st));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "att_run"));
    assert_non_null(strstr(dg_status_message(st), "[1,3,4]"));
    dg_status_free(&st);
    dg_tensor_unref(qv);
    dg_tensor_unref(kv);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// The attention with a mask against attention_reference_masked: masks of every broadcast form
// ([Tq, Tk] for every batch index, [b0, 1, 1, Tk] padding, [b1, Tq, 1] a query row left out, the
// full shape), with and without the causal rule, two blocks of 64 query rows and a tail, one row
// left with no key; float64 and float32. Then masks the op refuses, at build and at run time.
static void test_attention_mask_values(void **state) {
    (void)state;
    uint64_t rng = 23;
    enum { B0 = 2, B1 = 3, TQ = 130, TK = 130, D = 4, DV = 3 };
    static const struct {
        int rank;
        int64_t dims[4];
        bool causal;
    } cases[] = {
        {2, {TQ, TK}, true}, {2, {TQ, TK}, false}, {4, {B0, 1, 1, TK}, false}, {3, {B1, TQ, 1}, true},
        {4, {B0, B1, TQ, TK}, true},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int f32 = 0; f32 < 2; f32++) {
            dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
            dg_shape qs = shape4(B0, B1, TQ, D), ks = shape4(B0, B1, TK, D), vs = shape4(B0, B1, TK, DV),
                     ms = dg_shape_make(cases[ci].rank, cases[ci].dims);
            dg_graph *g = dg_graph_new();
            dg_output q = dg_placeholder(g, "q", dt, qs), k = dg_placeholder(g, "k", dt, ks),
                      v = dg_placeholder(g, "v", dt, vs), mk = dg_placeholder(g, "mask", DG_BOOL, ms);
            dg_output o = dg_attention_masked(g, "att", q, k, v, mk, cases[ci].causal, 0);
            assert_graph_ok(g);
            dg_tensor *qv = dg_tensor_new(dt, qs, NULL), *kv = dg_tensor_new(dt, ks, NULL),
                      *vv = dg_tensor_new(dt, vs, NULL), *mv = dg_tensor_new(DG_BOOL, ms, NULL);
            dg_tensor *in[4] = {qv, kv, vv, mv};
            for (int t = 0; t < 3; t++)
                for (int64_t i = 0; i < dg_tensor_num_elements(in[t]); i++)
                    set_elem(in[t], i, dg_test_uniform(&rng, -1.5, 1.5));
            uint8_t *mp = dg_tensor_data(mv);
            for (int64_t i = 0; i < dg_tensor_num_elements(mv); i++) mp[i] = dg_test_uniform(&rng, 0, 1) < 0.7;
            if (cases[ci].rank == 2)
                for (int64_t j = 0; j < TK; j++) mp[5 * TK + j] = 0;   // query row 5 sees no key
            // The mask in full, [B0 * B1, TQ, TK], for the reference.
            uint8_t *full = malloc((size_t)(B0 * B1 * TQ * TK));
            assert_non_null(full);
            int64_t str[4], tdims[4] = {B0, B1, TQ, TK}, acc = 1;
            for (int i = 3; i >= 0; i--) {
                int a = i - (4 - cases[ci].rank);
                str[i] = a >= 0 && cases[ci].dims[a] != 1 ? acc : 0;
                if (a >= 0) acc *= cases[ci].dims[a];
            }
            for (int64_t b0 = 0; b0 < B0; b0++)
                for (int64_t b1 = 0; b1 < B1; b1++)
                    for (int64_t i = 0; i < TQ; i++)
                        for (int64_t j = 0; j < TK; j++)
                            full[((b0 * B1 + b1) * TQ + i) * TK + j] =
                                mp[b0 * str[0] + b1 * str[1] + i * str[2] + j * str[3]];
            (void)tdims;
            dg_output feeds[4] = {q, k, v, mk}, outs[2] = {o, {o.node, 1}};
            dg_tensor *got[2];
            dg_session *s = new_session(g);
            run_ok(s, feeds, in, 4, outs, got, 2);
            int64_t B = B0 * B1;
            double *want = malloc((size_t)(B * TQ * DV) * sizeof *want), *wl = malloc((size_t)(B * TQ) * sizeof *wl),
                   *have = malloc((size_t)(B * TQ * DV) * sizeof *have), *hl = malloc((size_t)(B * TQ) * sizeof *hl);
            attention_reference_masked(qv, kv, vv, full, B, TQ, TK, D, DV, cases[ci].causal, 1 / sqrt((double)D), want,
                                       wl);
            for (int64_t i = 0; i < B * TQ * DV; i++) have[i] = dg_tensor_get_as_double(got[0], i);
            for (int64_t i = 0; i < B * TQ; i++) hl[i] = dg_tensor_get_as_double(got[1], i);
            double tol = f32 ? 2e-6 : 1e-13;
            assert_close_f64_msg(have, want, B * TQ * DV, tol, tol, "masked attention case %zu output, %s", ci,
                                 f32 ? "float32" : "float64");
            assert_close_f64_msg(hl, wl, B * TQ, tol, tol, "masked attention case %zu lse, %s", ci,
                                 f32 ? "float32" : "float64");
            if (cases[ci].rank == 2)   // row 5 of every batch index: no key, 0 and -inf
                for (int64_t b = 0; b < B; b++) {
                    assert_true(hl[b * TQ + 5] == -INFINITY);
                    for (int64_t c = 0; c < DV; c++) assert_true(have[(b * TQ + 5) * DV + c] == 0);
                }
            free(want);
            free(wl);
            free(have);
            free(hl);
            free(full);
            for (int t = 0; t < 2; t++) dg_tensor_unref(got[t]);
            for (int t = 0; t < 4; t++) dg_tensor_unref(in[t]);
            dg_session_free(&s);
            dg_graph_free(&g);
        }
    // Refused at build time, naming the op and the sizes: a mask that does not broadcast, one
    // of higher rank, one not bool.
    const dg_shape bad[] = {dg_shape2(3, 4), shape4(1, 2, 3, 5), dg_shape3(3, 1, 5)};
    const char *want_msg[] = {"[3,4]", "[1,2,3,5]", "[3,1,5]"};
    for (int i = 0; i < 3; i++) {
        dg_graph *g = dg_graph_new();
        dg_attention_masked(g, "bad_mask", dg_placeholder(g, "q", DG_FLOAT32, dg_shape3(2, 3, 4)),
                            dg_placeholder(g, "k", DG_FLOAT32, dg_shape3(2, 5, 4)),
                            dg_placeholder(g, "v", DG_FLOAT32, dg_shape3(2, 5, 2)),
                            dg_placeholder(g, "m", DG_BOOL, bad[i]), false, 0);
        assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
        const char *msg = dg_status_message(dg_graph_status(g));
        assert_non_null(strstr(msg, "ScaledDotProductAttention"));
        assert_non_null(strstr(msg, want_msg[i]));
        assert_non_null(strstr(msg, "[2,3,5]"));   // what it must broadcast to
        dg_graph_free(&g);
    }
    dg_graph *g = dg_graph_new();
    dg_output q3 = dg_placeholder(g, "q", DG_FLOAT32, dg_shape3(2, 3, 4));
    dg_attention_masked(g, "float_mask", q3, q3, q3, dg_placeholder(g, "m", DG_FLOAT32, dg_shape2(3, 3)), false, 0);
    assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "mask must be bool"));
    dg_graph_free(&g);
    // A mask of unknown shape passes the build; fed with the wrong one, the run fails naming the
    // node and the sizes, and a variable the step would have changed keeps its value.
    g = dg_graph_new();
    const int64_t unknown2[2] = {-1, -1};
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape2(4, 4), dg_init_constant(0.5));
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape3(1, 3, 4));
    dg_output mk = dg_placeholder(g, "mask", DG_BOOL, dg_shape_make(2, unknown2));
    dg_output qw = dg_matmul(g, NULL, dg_reshape(g, NULL, x, (int64_t[]){3, 4}, 2), w, false, false);
    dg_output q = dg_reshape(g, NULL, qw, (int64_t[]){1, 3, 4}, 3);
    dg_output o = dg_attention_masked(g, "att_mask_run", q, q, q, mk, true, 0);
    dg_output loss = dg_sum(g, NULL, o, NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){0}), *init = dg_global_variables_initializer(g);
    assert_graph_ok(g);
    dg_session *s = new_session(g);
    dg_status *st = dg_status_new();
    assert_true(dg_session_run_target(s, init, st));
    dg_tensor *xv = dg_tensor_new(DG_FLOAT64, dg_shape3(1, 3, 4), NULL), *bad_m = dg_tensor_new(DG_BOOL, dg_shape2(3, 5), NULL);
    for (int i = 0; i < 12; i++) dg_tensor_f64(xv)[i] = 0.1 * i;
    memset(dg_tensor_data(bad_m), 1, 15);
    dg_output feeds[2] = {x, mk};
    dg_tensor *fv[2] = {xv, bad_m};
    assert_false(dg_session_run(s, feeds, fv, 2, NULL, NULL, 0, &train, 1, st));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "att_mask_run"));
    assert_non_null(strstr(dg_status_message(st), "[3,5]"));
    assert_non_null(strstr(dg_status_message(st), "[1,3,3]"));
    dg_tensor *wv = NULL;
    run_ok(s, NULL, NULL, 0, &w, &wv, 1);
    for (int i = 0; i < 16; i++) assert_true(dg_tensor_f64(wv)[i] == 0.5);
    dg_tensor_unref(wv);
    // The same step with a mask of the right shape changes w (so the check above can fail).
    dg_tensor *good_m = dg_tensor_new(DG_BOOL, dg_shape2(3, 3), NULL);
    memset(dg_tensor_data(good_m), 1, 9);
    fv[1] = good_m;
    assert_true(dg_session_run(s, feeds, fv, 2, NULL, NULL, 0, &train, 1, st));
    run_ok(s, NULL, NULL, 0, &w, &wv, 1);
    int changed = 0;
    for (int i = 0; i < 16; i++) changed += dg_tensor_f64(wv)[i] != 0.5;
    assert_true(changed > 0);
    dg_tensor_unref(wv);
    dg_tensor_unref(good_m);
    dg_status_free(&st);
    dg_tensor_unref(xv);
    dg_tensor_unref(bad_m);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// The fused attention's gradients against the unfused composition TensorFlow would build
// (BatchMatMul, scale, an additive mask of -inf, Softmax, BatchMatMul), each differentiated by
// its own ops, with an upstream gradient of random weights: 70 query rows (a block of 64 and a
// tail), causal, float64 and float32, larger than the finite-difference rows can afford.
static void test_attention_matches_composition(void **state) {
    (void)state;
    uint64_t rng = 5;
    enum { B = 2, T = 70, D = 6, DV = 5 };
    for (int f32 = 0; f32 < 2; f32++) {
        dg_dtype dt = f32 ? DG_FLOAT32 : DG_FLOAT64;
        dg_graph *g = dg_graph_new();
        dg_output q = dg_placeholder(g, "q", dt, dg_shape3(B, T, D)), k = dg_placeholder(g, "k", dt, dg_shape3(B, T, D)),
                  v = dg_placeholder(g, "v", dt, dg_shape3(B, T, DV));
        dg_tensor *sc = dg_tensor_new(dt, dg_shape_scalar(), NULL), *mask = dg_tensor_new(dt, dg_shape2(T, T), NULL),
                  *w = dg_tensor_new(dt, dg_shape3(B, T, DV), NULL);
        set_elem(sc, 0, 1 / sqrt((double)D));
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) set_elem(mask, i * T + j, j <= i ? 0 : -INFINITY);
        for (int i = 0; i < B * T * DV; i++) set_elem(w, i, dg_test_uniform(&rng, -1, 1));
        dg_output fused = dg_attention(g, "fused", q, k, v, true, 0);
        dg_output scores = dg_add(g, NULL, dg_mul(g, NULL, dg_batch_matmul(g, NULL, q, k, false, true), dg_const(g, NULL, sc)),
                                  dg_const(g, NULL, mask));
        dg_output composed = dg_batch_matmul(g, NULL, dg_softmax(g, NULL, scores), v, false, false);
        dg_output wc = dg_const(g, NULL, w), xs[3] = {q, k, v}, df[3], dc[3];
        assert_true(dg_gradients(g, &fused, 1, xs, 3, &wc, df));
        assert_true(dg_gradients(g, &composed, 1, xs, 3, &wc, dc));
        assert_graph_ok(g);
        dg_tensor *in[3];
        const int64_t n_in[3] = {B * T * D, B * T * D, B * T * DV};
        for (int t = 0; t < 3; t++) {
            in[t] = dg_tensor_new(dt, t == 2 ? dg_shape3(B, T, DV) : dg_shape3(B, T, D), NULL);
            for (int64_t i = 0; i < n_in[t]; i++) set_elem(in[t], i, dg_test_uniform(&rng, -2, 2));
        }
        dg_output outs[8] = {fused, composed, df[0], df[1], df[2], dc[0], dc[1], dc[2]};
        dg_tensor *got[8];
        dg_session *s = new_session(g);
        run_ok(s, xs, in, 3, outs, got, 8);
        double tol = f32 ? 2e-5 : 1e-12;
        for (int t = 0; t < 4; t++) {   // the output, then dq, dk, dv
            const int64_t n = t == 0 || t == 3 ? B * T * DV : B * T * D;
            dg_tensor *a = got[t == 0 ? 0 : 1 + t], *b = got[t == 0 ? 1 : 4 + t];
            double *ha = malloc((size_t)n * sizeof *ha), *hb = malloc((size_t)n * sizeof *hb);
            for (int64_t i = 0; i < n; i++) {
                ha[i] = dg_tensor_get_as_double(a, i);
                hb[i] = dg_tensor_get_as_double(b, i);
            }
            assert_close_f64_msg(ha, hb, n, tol, tol, "fused vs composed %s, %s", t == 0 ? "output" : t == 1 ? "dq" : t == 2 ? "dk" : "dv",
                                 f32 ? "float32" : "float64");
            free(ha);
            free(hb);
        }
        for (int t = 0; t < 8; t++) dg_tensor_unref(got[t]);
        for (int t = 0; t < 3; t++) dg_tensor_unref(in[t]);
        dg_tensor_unref(sc);
        dg_tensor_unref(mask);
        dg_tensor_unref(w);
        // Differentiating through the log-sum-exp output is refused, naming the node.
        dg_output lse = {fused.node, 1}, dx;
        assert_false(dg_gradients(g, &lse, 1, &q, 1, NULL, &dx));
        assert_int_equal(dg_status_code(dg_graph_status(g)), DG_UNIMPLEMENTED);
        assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "fused"));
        dg_session_free(&s);
        dg_graph_free(&g);
    }
}

// Range against its definition (TensorFlow's lengths: ceil(|limit - start| / |delta|)), each
// dtype, negative and fractional steps, a constant length known when built; stack and
// unstack's values; the arguments Range refuses, at build time and when run.
static void test_range_stack_values(void **state) {
    (void)state;
    static const struct {
        dg_dtype t;
        double start, limit, delta;
        int64_t n;
    } cases[] = {{DG_INT32, 0, 5, 1, 5},      {DG_INT64, 3, -4, -2, 4},   {DG_INT32, 2, 2, 1, 0},
                 {DG_FLOAT32, 0, 1, 0.3, 4},  {DG_FLOAT64, 1, 0, -0.25, 4}, {DG_INT64, -7, 8, 5, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dg_graph *g = dg_graph_new();
        dg_output r = dg_range(g, "r", dg_scalar(g, NULL, cases[c].t, cases[c].start),
                               dg_scalar(g, NULL, cases[c].t, cases[c].limit), dg_scalar(g, NULL, cases[c].t, cases[c].delta));
        assert_graph_ok(g);
        assert_int_equal(dg_output_shape(r).dims[0], cases[c].n);   // constants: the length is known when built
        dg_session *s = new_session(g);
        dg_tensor *got;
        run_ok(s, NULL, NULL, 0, &r, &got, 1);
        assert_int_equal(dg_tensor_num_elements(got), cases[c].n);
        for (int64_t i = 0; i < cases[c].n; i++) {
            // float32: the scalars as stored (0.3 is 0.300000012), the product and sum in float64.
            bool f = cases[c].t == DG_FLOAT32;
            double st0 = f ? (float)cases[c].start : cases[c].start, d0 = f ? (float)cases[c].delta : cases[c].delta;
            double want = st0 + (double)i * d0;
            if (f) want = (float)want;
            assert_close(dg_tensor_get_as_double(got, i), want, 0, 0);
        }
        dg_tensor_unref(got);
        dg_session_free(&s);
        dg_graph_free(&g);
    }
    // Refused when built: delta 0, a limit below start with delta > 0, mixed dtypes.
    dg_graph *g = dg_graph_new();
    dg_range(g, "zero", dg_scalar(g, NULL, DG_INT32, 0), dg_scalar(g, NULL, DG_INT32, 5), dg_scalar(g, NULL, DG_INT32, 0));
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "delta must not be 0"));
    dg_graph_free(&g);
    g = dg_graph_new();
    dg_range(g, "back", dg_scalar(g, NULL, DG_INT32, 5), dg_scalar(g, NULL, DG_INT32, 0), dg_scalar(g, NULL, DG_INT32, 1));
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "start 5 is above limit 0"));
    dg_graph_free(&g);
    g = dg_graph_new();
    dg_range(g, "mixed", dg_scalar(g, NULL, DG_INT32, 0), dg_scalar(g, NULL, DG_INT64, 5), dg_scalar(g, NULL, DG_INT32, 1));
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "one of int32"));
    dg_graph_free(&g);
    // Fed: the length comes when run; a zero delta fails the run naming the node.
    g = dg_graph_new();
    dg_output lim = dg_placeholder(g, "limit", DG_INT64, dg_shape_scalar()), dl = dg_placeholder(g, "delta", DG_INT64, dg_shape_scalar());
    dg_output r = dg_range(g, "fed_range", dg_scalar(g, NULL, DG_INT64, 1), lim, dl);
    assert_graph_ok(g);
    assert_int_equal(dg_output_shape(r).dims[0], -1);
    dg_session *s = new_session(g);
    dg_tensor *lv = dg_tensor_scalar_i64(10), *dv = dg_tensor_scalar_i64(0), *got = NULL;
    dg_output feeds[2] = {lim, dl};
    dg_tensor *fv[2] = {lv, dv};
    dg_status *st = dg_status_new();
    assert_false(dg_session_run(s, feeds, fv, 2, &r, &got, 1, NULL, 0, st));
    assert_non_null(strstr(dg_status_message(st), "fed_range"));
    assert_non_null(strstr(dg_status_message(st), "delta must not be 0"));
    dg_status_free(&st);
    dg_tensor_unref(dv);
    dv = dg_tensor_scalar_i64(4);
    fv[1] = dv;
    run_ok(s, feeds, fv, 2, &r, &got, 1);
    assert_int_equal(dg_tensor_num_elements(got), 3);   // 1, 5, 9
    assert_int_equal(dg_tensor_i64(got)[2], 9);
    dg_tensor_unref(got);
    dg_tensor_unref(lv);
    dg_tensor_unref(dv);
    dg_session_free(&s);
    dg_graph_free(&g);
    // stack then unstack gives the inputs back; the stacked layout is the new axis's.
    g = dg_graph_new();
    dg_tensor *a = dg_tensor_new(DG_FLOAT64, dg_shape2(2, 3), NULL), *b = dg_tensor_new(DG_FLOAT64, dg_shape2(2, 3), NULL);
    for (int i = 0; i < 6; i++) {
        dg_tensor_f64(a)[i] = i;
        dg_tensor_f64(b)[i] = 10 + i;
    }
    dg_output xs[2] = {dg_const(g, NULL, a), dg_const(g, NULL, b)}, parts[4];
    dg_output st1 = dg_stack(g, "stacked", xs, 2, 1);   // [2, 2, 3]
    assert_int_equal(dg_unstack(g, "parts", st1, 1, parts, 4), 2);
    assert_graph_ok(g);
    s = new_session(g);
    dg_output outs[3] = {st1, parts[0], parts[1]};
    dg_tensor *o[3];
    run_ok(s, NULL, NULL, 0, outs, o, 3);
    // stacked[i][k][j] = (k ? b : a)[i][j]
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++)
                assert_close(dg_tensor_f64(o[0])[(i * 2 + k) * 3 + j], (k ? 10 : 0) + i * 3 + j, 0, 0);
    assert_close_f64(dg_tensor_f64(o[1]), dg_tensor_f64(a), 6, 0, 0);
    assert_close_f64(dg_tensor_f64(o[2]), dg_tensor_f64(b), 6, 0, 0);
    for (int i = 0; i < 3; i++) dg_tensor_unref(o[i]);
    dg_tensor_unref(a);
    dg_tensor_unref(b);
    assert_int_equal(dg_unstack(g, "too_many", st1, 2, parts, 2), -1);   // 3 parts, room for 2
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "too_many"));
    dg_session_free(&s);
    dg_graph_free(&g);
}

// Rows of width 0: y is empty, each row's mean is 0 and its rstd 1 / sqrt(epsilon), and the
// gradient runs (dgamma and dbeta empty, dx empty).
static void test_layer_norm_width_zero(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(3, 0));
    dg_output gamma = dg_placeholder(g, "gamma", DG_FLOAT64, dg_shape1(0));
    dg_output beta = dg_placeholder(g, "beta", DG_FLOAT64, dg_shape1(0));
    dg_output y = dg_layer_norm(g, NULL, x, gamma, beta, 0.25);
    dg_output xs[3] = {x, gamma, beta}, dx[3];
    assert_true(dg_gradients(g, &y, 1, xs, 3, NULL, dx));
    assert_graph_ok(g);
    dg_tensor *xv = dg_tensor_new(DG_FLOAT64, dg_shape2(3, 0), NULL), *gv = dg_tensor_new(DG_FLOAT64, dg_shape1(0), NULL),
              *bv = dg_tensor_new(DG_FLOAT64, dg_shape1(0), NULL);
    dg_output feeds[3] = {x, gamma, beta}, outs[6] = {y, {y.node, 1}, {y.node, 2}, dx[0], dx[1], dx[2]};
    dg_tensor *fv[3] = {xv, gv, bv}, *got[6];
    dg_session *s = new_session(g);
    run_ok(s, feeds, fv, 3, outs, got, 6);
    const double zeros[3] = {0, 0, 0}, twos[3] = {2, 2, 2};   // 1 / sqrt(0.25)
    assert_int_equal(dg_tensor_num_elements(got[0]), 0);
    assert_close_f64(dg_tensor_f64(got[1]), zeros, 3, 0, 0);
    assert_close_f64(dg_tensor_f64(got[2]), twos, 3, 0, 0);
    for (int k = 3; k < 6; k++) assert_int_equal(dg_tensor_num_elements(got[k]), 0);
    for (int k = 0; k < 6; k++) dg_tensor_unref(got[k]);
    dg_tensor_unref(xv);
    dg_tensor_unref(gv);
    dg_tensor_unref(bv);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// x used three times: d/dx sum(W * (tanh(x) + x*x)) = W * (1 - tanh(x)^2 + 2x).
static void test_shared_input_closed_form(void **state) {
    (void)state;
    uint64_t rng = 7;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(5));
    dg_tensor *w = random_f64(dg_shape1(5), -1, 1, &rng);
    dg_output y = dg_add(g, NULL, dg_tanh(g, NULL, x), dg_mul(g, NULL, x, x));
    dg_output f = dg_sum(g, NULL, dg_mul(g, NULL, y, dg_const(g, NULL, w)), NULL, 0, false);
    dg_output dx;
    assert_true(dg_gradients(g, &f, 1, &x, 1, NULL, &dx));
    dg_session *s = new_session(g);
    dg_tensor *xv = random_f64(dg_shape1(5), -1, 1, &rng), *out;
    run_ok(s, &x, &xv, 1, &dx, &out, 1);
    for (int i = 0; i < 5; i++) {
        double xi = dg_tensor_f64(xv)[i], t = tanh(xi);
        double want = dg_tensor_f64(w)[i] * (1 - t * t + 2 * xi);
        assert_close(dg_tensor_f64(out)[i], want, 1e-14, 1e-14);
    }
    dg_tensor_unref(out);
    dg_tensor_unref(xv);
    dg_tensor_unref(w);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// Several ys are summed, each weighted by its grad_ys entry.
static void test_grad_ys_and_several_ys(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(3));
    dg_output y1 = dg_square(g, NULL, x);          // dy1/dx = 2x
    dg_output y2 = dg_mul(g, NULL, x, dg_scalar(g, NULL, DG_FLOAT64, 3.0));   // 3
    double gv[3] = {1, 2, -1};
    dg_tensor *gt = tensor_f64(dg_shape1(3), gv);
    dg_output ys[2] = {y1, y2}, gys[2] = {dg_const(g, NULL, gt), {NULL, 0}};
    dg_output dx;
    assert_true(dg_gradients(g, ys, 2, &x, 1, gys, &dx));
    dg_session *s = new_session(g);
    double xv[3] = {0.5, -1, 2};
    dg_tensor *xt = tensor_f64(dg_shape1(3), xv), *out;
    run_ok(s, &x, &xt, 1, &dx, &out, 1);
    for (int i = 0; i < 3; i++) assert_true(dg_tensor_f64(out)[i] == 2 * xv[i] * gv[i] + 3.0);
    dg_tensor_unref(out);
    dg_tensor_unref(xt);
    dg_tensor_unref(gt);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// An x that does not reach the ys gets the null output; so does one reaching it only
// through an integer path (ArgMax).
static void test_unconnected_x(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(2, 3));
    dg_output z = dg_placeholder(g, "z", DG_FLOAT64, dg_shape2(2, 3));
    dg_output a = dg_placeholder(g, "a", DG_FLOAT64, dg_shape2(2, 3));
    dg_output unrelated = dg_exp(g, NULL, z);   // z feeds something, just not f
    (void)unrelated;
    dg_output through_int = dg_cast(g, NULL, dg_argmax(g, NULL, a, 1), DG_FLOAT64);
    dg_output f = dg_add(g, NULL, dg_sum(g, NULL, dg_square(g, NULL, x), NULL, 0, false),
                         dg_sum(g, NULL, through_int, NULL, 0, false));
    assert_graph_ok(g);
    dg_output xs[3] = {x, z, a}, dx[3];
    assert_true(dg_gradients(g, &f, 1, xs, 3, NULL, dx));
    assert_graph_ok(g);
    assert_non_null(dx[0].node);
    assert_null(dx[1].node);
    assert_int_equal(dx[1].index, 0);
    assert_null(dx[2].node);
    assert_false(dg_output_ok(dx[1]));
    // A y that is an x: the seed itself.
    dg_output ones;
    assert_true(dg_gradients(g, &x, 1, &x, 1, NULL, &ones));
    dg_session *s = new_session(g);
    double xv[6] = {1, 2, 3, 4, 5, 6};
    dg_tensor *xt = tensor_f64(dg_shape2(2, 3), xv), *out;
    run_ok(s, &x, &xt, 1, &ones, &out, 1);
    for (int i = 0; i < 6; i++) assert_true(dg_tensor_f64(out)[i] == 1.0);
    dg_tensor_unref(out);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// Differentiating through ReluGrad (a second derivative of Relu) has no gradient.
static void test_no_gradient_relu_grad(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(2, 3));
    dg_output f = dg_sum(g, NULL, dg_relu(g, NULL, x), NULL, 0, false);
    dg_output dx;
    assert_true(dg_gradients(g, &f, 1, &x, 1, NULL, &dx));
    assert_string_equal(dg_node_op_type(dx.node), "ReluGrad");
    dg_output f2 = dg_sum(g, NULL, dx, NULL, 0, false);
    dg_output ddx;
    assert_false(dg_gradients(g, &f2, 1, &x, 1, NULL, &ddx));
    assert_null(ddx.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "no gradient");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "(ReluGrad)");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, dg_node_name(dx.node));
    // The graph is now unusable: later calls return false too.
    assert_false(dg_gradients(g, &f, 1, &x, 1, NULL, &ddx));
    dg_graph_free(&g);
}

// BiasAddGrad (the bias gradient of BiasAdd) has no gradient either.
static void test_no_gradient_bias_add_grad(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output v = dg_placeholder(g, "v", DG_FLOAT64, dg_shape2(3, 4));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT64, dg_shape1(4));
    dg_output dy = dg_placeholder(g, "dy", DG_FLOAT64, dg_shape2(3, 4));
    dg_output y = dg_bias_add(g, NULL, v, b);
    dg_output db;
    assert_true(dg_gradients(g, &y, 1, &b, 1, &dy, &db));
    assert_string_equal(dg_node_op_type(db.node), "BiasAddGrad");
    dg_output f = dg_sum(g, NULL, db, NULL, 0, false);
    dg_output d2;
    assert_false(dg_gradients(g, &f, 1, &dy, 1, NULL, &d2));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "no gradient");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "BiasAddGrad");
    dg_graph_free(&g);
}

static void test_gradients_bad_arguments(void **state) {
    (void)state;
    dg_output nul = {NULL, 0}, dx;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(2));
    assert_false(dg_gradients(g, &nul, 1, &x, 1, NULL, &dx));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "y 0 is the null output");
    dg_graph_free(&g);

    g = dg_graph_new();
    x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(2));
    dg_output xs[2] = {x, nul};
    dg_output dxs[2];
    assert_false(dg_gradients(g, &x, 1, xs, 2, NULL, dxs));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "x 1 is the null output");
    assert_null(dxs[0].node);
    dg_graph_free(&g);

    // A graph holding an error gives no gradients.
    g = dg_graph_new();
    x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(2));
    dg_output y = dg_exp(g, NULL, x);
    dg_graph_set_error(g, DG_INTERNAL, "earlier failure");
    assert_false(dg_gradients(g, &y, 1, &x, 1, NULL, &dx));
    assert_null(dx.node);
    assert_status(dg_graph_status(g), DG_INTERNAL, "earlier failure");
    dg_graph_free(&g);
}

// Concat along an axis of unknown size cannot be differentiated statically.
static void test_concat_unknown_axis_size(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT64, dg_shape2(-1, 3));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT64, dg_shape2(2, 3));
    dg_output ab[2] = {a, b};
    dg_output c = dg_concat(g, "cat", ab, 2, 0);
    dg_output f = dg_sum(g, NULL, c, NULL, 0, false);
    dg_output dx[2];
    assert_false(dg_gradients(g, &f, 1, ab, 2, NULL, dx));
    assert_status(dg_graph_status(g), DG_UNIMPLEMENTED, "\"cat\" (Concat)");
    assert_status(dg_graph_status(g), DG_UNIMPLEMENTED, "size of input 0 along axis 0");
    dg_graph_free(&g);
}

// Gradient nodes live under "gradients/<op>_grad/"; a second call gets "gradients_1".
static void test_gradient_scopes(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(2));
    dg_output y = dg_tanh(g, "t", x);
    dg_output dx;
    assert_true(dg_gradients(g, &y, 1, &x, 1, NULL, &dx));
    assert_string_equal(dg_node_name(dx.node), "gradients/t_grad/TanhGrad");
    assert_true(dg_gradients(g, &y, 1, &x, 1, NULL, &dx));
    assert_string_equal(dg_node_name(dx.node), "gradients_1/t_grad/TanhGrad");
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Optimizers: three steps on a small float64 least-squares problem against hand-computed
// TensorFlow update formulas.
//   loss = 0.5 * sum((X W + b - Y)^2), X [4,3], W [3,2], b [2], Y [4,2]
// Both variables' gradients depend on both values, so an update that ran before the other
// variable's gradient was computed would show.

#define NX 4
#define NI 3
#define NO 2
#define N_STEPS 3

typedef struct problem {
    double X[NX * NI], Y[NX * NO], W[NI * NO], b[NO];
} problem;

static void problem_init(problem *p) {
    uint64_t rng = 2024;
    for (int i = 0; i < NX * NI; i++) p->X[i] = dg_test_uniform(&rng, -1, 1);
    for (int i = 0; i < NX * NO; i++) p->Y[i] = dg_test_uniform(&rng, -1, 1);
    for (int i = 0; i < NI * NO; i++) p->W[i] = dg_test_uniform(&rng, -1, 1);
    for (int i = 0; i < NO; i++) p->b[i] = dg_test_uniform(&rng, -1, 1);
}

// Gradients at (W, b): gW = X^T R, gb = sum_rows R, R = X W + b - Y.
static void problem_grads(const problem *p, const double *W, const double *b, double *gW, double *gb) {
    double R[NX * NO];
    for (int r = 0; r < NX; r++)
        for (int o = 0; o < NO; o++) {
            double acc = b[o] - p->Y[r * NO + o];
            for (int i = 0; i < NI; i++) acc += p->X[r * NI + i] * W[i * NO + o];
            R[r * NO + o] = acc;
        }
    for (int i = 0; i < NI; i++)
        for (int o = 0; o < NO; o++) {
            double acc = 0;
            for (int r = 0; r < NX; r++) acc += p->X[r * NI + i] * R[r * NO + o];
            gW[i * NO + o] = acc;
        }
    for (int o = 0; o < NO; o++) {
        double acc = 0;
        for (int r = 0; r < NX; r++) acc += R[r * NO + o];
        gb[o] = acc;
    }
}

typedef struct opt_graph {
    dg_graph *g;
    dg_output W, b, loss, gs;
    dg_node *train, *init;
    dg_session *s;
} opt_graph;

static void opt_graph_build(opt_graph *og, const problem *p, dg_optimizer (*make)(dg_graph *, const void *),
                            const void *arg) {
    dg_graph *g = og->g = dg_graph_new();
    dg_tensor *w0 = tensor_f64(dg_shape2(NI, NO), p->W), *b0 = tensor_f64(dg_shape1(NO), p->b);
    dg_tensor *xt = tensor_f64(dg_shape2(NX, NI), p->X), *yt = tensor_f64(dg_shape2(NX, NO), p->Y);
    og->W = dg_variable(g, "W", DG_FLOAT64, dg_shape2(NI, NO), dg_init_tensor(w0));
    og->b = dg_variable(g, "b", DG_FLOAT64, dg_shape1(NO), dg_init_tensor(b0));
    dg_output pred = dg_bias_add(g, NULL, dg_matmul(g, NULL, dg_const(g, "X", xt), og->W, false, false), og->b);
    dg_output r = dg_sub(g, NULL, pred, dg_const(g, "Y", yt));
    og->loss = dg_mul(g, "loss", dg_scalar(g, NULL, DG_FLOAT64, 0.5),
                      dg_sum(g, NULL, dg_square(g, NULL, r), NULL, 0, false));
    og->gs = dg_global_step(g);
    dg_optimizer opt = make(g, arg);
    og->train = dg_optimizer_minimize(&opt, og->loss, og->gs);
    assert_graph_ok(g);
    assert_non_null(og->train);
    og->init = dg_global_variables_initializer(g);
    assert_non_null(og->init);
    og->s = new_session(g);
    dg_status *st = dg_status_new();
    assert_true(dg_session_run_target(og->s, og->init, st));
    assert_ok(st);
    dg_status_free(&st);
    dg_tensor_unref(w0);
    dg_tensor_unref(b0);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
}

static void opt_graph_free(opt_graph *og) {
    dg_session_free(&og->s);
    dg_graph_free(&og->g);
}

// Runs one training step and compares W, b and the global step with the reference.
static void opt_step_check(opt_graph *og, const double *W, const double *b, int64_t step) {
    dg_status *st = dg_status_new();
    assert_true(dg_session_run_target(og->s, og->train, st));
    assert_ok(st);
    dg_status_free(&st);
    dg_output fetches[3] = {og->W, og->b, og->gs};
    dg_tensor *out[3];
    run_ok(og->s, NULL, NULL, 0, fetches, out, 3);
    double aw = scaled_atol(W, NI * NO, 1e-12), ab = scaled_atol(b, NO, 1e-12);
    if (dg_test_first_far_f64(dg_tensor_f64(out[0]), W, NI * NO, aw, 0) >= 0 ||
        dg_test_first_far_f64(dg_tensor_f64(out[1]), b, NO, ab, 0) >= 0) {
        for (int i = 0; i < NI * NO; i++)
            print_message("  W[%d] got %.17g want %.17g\n", i, dg_tensor_f64(out[0])[i], W[i]);
        for (int i = 0; i < NO; i++)
            print_message("  b[%d] got %.17g want %.17g\n", i, dg_tensor_f64(out[1])[i], b[i]);
        fail_msg("step %lld: W or b differs from the reference by more than 1e-12 of its largest", (long long)step);
    }
    assert_int_equal(dg_tensor_dtype(out[2]), DG_INT64);
    assert_int_equal(dg_tensor_i64(out[2])[0], step);
    for (int i = 0; i < 3; i++) dg_tensor_unref(out[i]);
}

static dg_optimizer make_gd(dg_graph *g, const void *arg) { return dg_gradient_descent(g, 0.1); }

static void test_gradient_descent(void **state) {
    (void)state;
    problem p;
    problem_init(&p);
    opt_graph og;
    opt_graph_build(&og, &p, make_gd, NULL);
    double W[NI * NO], b[NO], gW[NI * NO], gb[NO];
    memcpy(W, p.W, sizeof W);
    memcpy(b, p.b, sizeof b);
    for (int t = 1; t <= N_STEPS; t++) {
        problem_grads(&p, W, b, gW, gb);
        for (int i = 0; i < NI * NO; i++) W[i] -= 0.1 * gW[i];
        for (int i = 0; i < NO; i++) b[i] -= 0.1 * gb[i];
        opt_step_check(&og, W, b, t);
    }
    opt_graph_free(&og);
}

static dg_optimizer make_gd_clipped(dg_graph *g, const void *arg) {
    dg_optimizer o = dg_gradient_descent(g, 0.1);
    o.global_clipnorm = *(const double *)arg;
    return o;
}

// global_clipnorm: the step uses the gradients scaled by clip / max(global norm, clip), the
// norm over W's and b's gradients together (float64 reference); a clip above the norm changes
// nothing; a negative one is refused.
static void test_global_clipnorm(void **state) {
    (void)state;
    for (int big = 0; big < 2; big++) {
        problem p;
        problem_init(&p);
        const double clip = big ? 1e6 : 0.05;
        opt_graph og;
        opt_graph_build(&og, &p, make_gd_clipped, &clip);
        double W[NI * NO], b[NO], gW[NI * NO], gb[NO];
        memcpy(W, p.W, sizeof W);
        memcpy(b, p.b, sizeof b);
        for (int t = 1; t <= N_STEPS; t++) {
            problem_grads(&p, W, b, gW, gb);
            double sq = 0;
            for (int i = 0; i < NI * NO; i++) sq += gW[i] * gW[i];
            for (int i = 0; i < NO; i++) sq += gb[i] * gb[i];
            double norm = sqrt(sq), f = clip / (norm > clip ? norm : clip);
            if (!big) assert_true(norm > clip);   // the case clips
            for (int i = 0; i < NI * NO; i++) W[i] -= 0.1 * gW[i] * f;
            for (int i = 0; i < NO; i++) b[i] -= 0.1 * gb[i] * f;
            opt_step_check(&og, W, b, t);
        }
        opt_graph_free(&og);
    }
    dg_graph *g = dg_graph_new();
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape2(2, 2), dg_init_zeros());
    dg_optimizer o = dg_gradient_descent(g, 0.1);
    o.global_clipnorm = -1;
    dg_output grads[1] = {dg_fill(g, NULL, dg_shape_of(g, NULL, w), dg_scalar(g, NULL, DG_FLOAT64, 1))};
    assert_null(dg_optimizer_apply_gradients(&o, grads, &w, 1, (dg_output){NULL, 0}, NULL));
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "global_clipnorm must be >= 0"));
    dg_graph_free(&g);
}

typedef struct momentum_args {
    double lr, mom;
    bool nesterov;
} momentum_args;

static dg_optimizer make_momentum(dg_graph *g, const void *arg) {
    const momentum_args *a = arg;
    return dg_momentum(g, a->lr, a->mom, a->nesterov);
}

static void momentum_case(bool nesterov) {
    problem p;
    problem_init(&p);
    momentum_args a = {0.05, 0.9, nesterov};
    opt_graph og;
    opt_graph_build(&og, &p, make_momentum, &a);
    // Slots: "<var>/Momentum", zeros, colocated with the variable, not trainable.
    dg_node *slot = dg_graph_find(og.g, "W/Momentum");
    assert_non_null(slot);
    assert_string_equal(dg_node_op_type(slot), "VariableV2");
    assert_int_equal(dg_node_num_colocations(slot), 1);
    assert_string_equal(dg_node_colocation(slot, 0), "W");
    assert_non_null(dg_graph_find(og.g, "b/Momentum"));
    assert_int_equal(dg_graph_collection_size(og.g, DG_TRAINABLE_VARIABLES), 2);

    double W[NI * NO], b[NO], gW[NI * NO], gb[NO], aW[NI * NO] = {0}, ab[NO] = {0};
    memcpy(W, p.W, sizeof W);
    memcpy(b, p.b, sizeof b);
    for (int t = 1; t <= N_STEPS; t++) {
        problem_grads(&p, W, b, gW, gb);
        // accum = accum * momentum + g; var -= lr * accum, or with Nesterov
        // var -= lr * g + lr * momentum * accum.
        for (int i = 0; i < NI * NO; i++) {
            aW[i] = aW[i] * a.mom + gW[i];
            W[i] -= nesterov ? a.lr * gW[i] + a.lr * a.mom * aW[i] : a.lr * aW[i];
        }
        for (int i = 0; i < NO; i++) {
            ab[i] = ab[i] * a.mom + gb[i];
            b[i] -= nesterov ? a.lr * gb[i] + a.lr * a.mom * ab[i] : a.lr * ab[i];
        }
        opt_step_check(&og, W, b, t);
    }
    // The accumulator holds the reference's.
    dg_output acc = {slot, 0};
    dg_tensor *out;
    run_ok(og.s, NULL, NULL, 0, &acc, &out, 1);
    assert_close_f64(dg_tensor_f64(out), aW, NI * NO, scaled_atol(aW, NI * NO, 1e-12), 0);
    dg_tensor_unref(out);
    opt_graph_free(&og);
}

static void test_momentum(void **state) {
    (void)state;
    momentum_case(false);
}

static void test_momentum_nesterov(void **state) {
    (void)state;
    momentum_case(true);
}

static dg_optimizer make_adam(dg_graph *g, const void *arg) { return dg_adam(g, 0.01); }

static void test_adam(void **state) {
    (void)state;
    problem p;
    problem_init(&p);
    opt_graph og;
    opt_graph_build(&og, &p, make_adam, NULL);
    assert_non_null(dg_graph_find(og.g, "W/Adam"));
    assert_non_null(dg_graph_find(og.g, "W/Adam_1"));
    assert_non_null(dg_graph_find(og.g, "b/Adam"));
    assert_non_null(dg_graph_find(og.g, "b/Adam_1"));
    dg_node *b1p = dg_graph_find(og.g, "beta1_power");
    assert_non_null(b1p);
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double W[NI * NO], b[NO], gW[NI * NO], gb[NO];
    double mW[NI * NO] = {0}, vW[NI * NO] = {0}, mb[NO] = {0}, vb[NO] = {0};
    memcpy(W, p.W, sizeof W);
    memcpy(b, p.b, sizeof b);
    for (int t = 1; t <= N_STEPS; t++) {
        problem_grads(&p, W, b, gW, gb);
        double lr_t = lr * sqrt(1 - pow(b2, t)) / (1 - pow(b1, t));
        for (int i = 0; i < NI * NO; i++) {
            mW[i] = b1 * mW[i] + (1 - b1) * gW[i];
            vW[i] = b2 * vW[i] + (1 - b2) * gW[i] * gW[i];
            W[i] -= lr_t * mW[i] / (sqrt(vW[i]) + eps);
        }
        for (int i = 0; i < NO; i++) {
            mb[i] = b1 * mb[i] + (1 - b1) * gb[i];
            vb[i] = b2 * vb[i] + (1 - b2) * gb[i] * gb[i];
            b[i] -= lr_t * mb[i] / (sqrt(vb[i]) + eps);
        }
        opt_step_check(&og, W, b, t);
        // beta1_power advances once per step.
        dg_output bp = {b1p, 0};
        dg_tensor *out;
        run_ok(og.s, NULL, NULL, 0, &bp, &out, 1);
        assert_close(dg_tensor_f64(out)[0], pow(b1, t + 1), 1e-15, 0);
        dg_tensor_unref(out);
    }
    opt_graph_free(&og);
}

static dg_optimizer make_adamw(dg_graph *g, const void *arg) {
    dg_optimizer o = dg_adamw(g, 0.01, 0.5);
    if (arg) {   // the rule: every variable decays, the bias too
        o.decay_filter = *(bool (*const *)(dg_output, void *))arg;
        o.decay_filter_arg = NULL;
    }
    return o;
}

static bool decay_all(dg_output var, void *arg) {
    (void)var;
    (void)arg;
    return true;
}

// AdamW: var -= lr * wd * var, then Adam's update with the gradient of the pre-step values,
// against a float64 reference; by default only W (rank 2) decays, with a rule of the user's b
// as well; a negative weight decay is refused.
static void adamw_case(bool all) {
    problem p;
    problem_init(&p);
    opt_graph og;
    bool (*rule)(dg_output, void *) = decay_all;
    opt_graph_build(&og, &p, make_adamw, all ? (const void *)&rule : NULL);
    assert_non_null(dg_graph_find(og.g, "W/AdamW"));
    assert_non_null(dg_graph_find(og.g, "b/AdamW_1"));
    const double lr = 0.01, wd = 0.5, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double W[NI * NO], b[NO], gW[NI * NO], gb[NO];
    double mW[NI * NO] = {0}, vW[NI * NO] = {0}, mb[NO] = {0}, vb[NO] = {0};
    memcpy(W, p.W, sizeof W);
    memcpy(b, p.b, sizeof b);
    for (int t = 1; t <= N_STEPS; t++) {
        problem_grads(&p, W, b, gW, gb);
        double lr_t = lr * sqrt(1 - pow(b2, t)) / (1 - pow(b1, t));
        for (int i = 0; i < NI * NO; i++) {
            W[i] -= lr * wd * W[i];
            mW[i] = b1 * mW[i] + (1 - b1) * gW[i];
            vW[i] = b2 * vW[i] + (1 - b2) * gW[i] * gW[i];
            W[i] -= lr_t * mW[i] / (sqrt(vW[i]) + eps);
        }
        for (int i = 0; i < NO; i++) {
            if (all) b[i] -= lr * wd * b[i];
            mb[i] = b1 * mb[i] + (1 - b1) * gb[i];
            vb[i] = b2 * vb[i] + (1 - b2) * gb[i] * gb[i];
            b[i] -= lr_t * mb[i] / (sqrt(vb[i]) + eps);
        }
        opt_step_check(&og, W, b, t);
    }
    opt_graph_free(&og);
}

static void test_adamw(void **state) {
    (void)state;
    adamw_case(false);
    adamw_case(true);
    dg_graph *g = dg_graph_new();
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape2(2, 2), dg_init_zeros());
    dg_optimizer o = dg_adamw(g, 0.1, -1);
    dg_output gr = dg_scalar(g, NULL, DG_FLOAT64, 1);
    dg_output grads[1] = {dg_fill(g, NULL, dg_shape_of(g, NULL, w), gr)};
    assert_null(dg_optimizer_apply_gradients(&o, grads, &w, 1, (dg_output){NULL, 0}, NULL));
    assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(dg_graph_status(g)), "AdamW: weight_decay must be finite and >= 0"));
    dg_graph_free(&g);
}

// compute_gradients / apply_gradients separately, with the gradients averaged in between
// (as in synchronous replicas): the step uses the averaged gradient.
static void test_apply_averaged_gradients(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double w0[2] = {1, -2};
    dg_tensor *wt = tensor_f64(dg_shape1(2), w0);
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape1(2), dg_init_tensor(wt));
    dg_output l1 = dg_sum(g, NULL, dg_square(g, NULL, w), NULL, 0, false);          // 2w
    dg_output l2 = dg_sum(g, NULL, dg_mul(g, NULL, w, dg_scalar(g, NULL, DG_FLOAT64, 4)), NULL, 0, false);  // 4
    dg_optimizer opt = dg_gradient_descent(g, 0.5);
    dg_output g1[1], g2[1], v1[1], v2[1];
    assert_int_equal(dg_optimizer_compute_gradients(&opt, l1, NULL, 0, g1, v1, 1), 1);
    assert_int_equal(dg_optimizer_compute_gradients(&opt, l2, &w, 1, g2, v2, 1), 1);
    assert_true(v1[0].node == w.node && v2[0].node == w.node);
    dg_output pair[2] = {g1[0], g2[0]};
    dg_output avg = dg_mul(g, NULL, dg_add_n(g, NULL, pair, 2), dg_scalar(g, NULL, DG_FLOAT64, 0.5));
    dg_node *train = dg_optimizer_apply_gradients(&opt, &avg, &w, 1, (dg_output){NULL, 0}, "apply");
    assert_non_null(train);
    assert_graph_ok(g);
    dg_session *s = new_session(g);
    dg_status *st = dg_status_new();
    assert_true(dg_session_run_target(s, dg_global_variables_initializer(g), st));
    assert_true(dg_session_run_target(s, train, st));
    assert_ok(st);
    dg_tensor *out;
    run_ok(s, NULL, NULL, 0, &w, &out, 1);
    for (int i = 0; i < 2; i++) assert_true(dg_tensor_f64(out)[i] == w0[i] - 0.5 * (w0[i] + 2));
    dg_tensor_unref(out);
    // A loss that does not depend on any variable has no gradients to apply.
    dg_output c = dg_scalar(g, NULL, DG_FLOAT64, 1);
    assert_int_equal(dg_optimizer_compute_gradients(&opt, c, NULL, 0, g1, v1, 1), 0);
    assert_null(dg_optimizer_minimize(&opt, c, (dg_output){NULL, 0}));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "no gradients");
    dg_status_free(&st);
    dg_tensor_unref(wt);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_global_step(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output gs = dg_global_step(g);
    assert_string_equal(dg_node_name(gs.node), "global_step");
    assert_int_equal(dg_output_dtype(gs), DG_INT64);
    assert_int_equal(dg_output_shape(gs).rank, 0);
    assert_true(dg_global_step(g).node == gs.node);
    assert_int_equal(dg_graph_collection_size(g, DG_GLOBAL_STEP), 1);
    assert_int_equal(dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES), 0);
    assert_int_equal(dg_graph_collection_size(g, DG_GLOBAL_VARIABLES), 1);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------

int main(void) {
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_cast_chain),
        cmocka_unit_test(test_rsqrt_erf_gelu_values),
        cmocka_unit_test(test_reduce_values),
        cmocka_unit_test(test_layer_norm_values),
        cmocka_unit_test(test_layer_norm_width_zero),
        cmocka_unit_test(test_batch_matmul_values),
        cmocka_unit_test(test_attention_values),
        cmocka_unit_test(test_attention_mask_values),
        cmocka_unit_test(test_range_stack_values),
        cmocka_unit_test(test_attention_matches_composition),
        cmocka_unit_test(test_shared_input_closed_form),
        cmocka_unit_test(test_grad_ys_and_several_ys),
        cmocka_unit_test(test_unconnected_x),
        cmocka_unit_test(test_no_gradient_relu_grad),
        cmocka_unit_test(test_no_gradient_bias_add_grad),
        cmocka_unit_test(test_gradients_bad_arguments),
        cmocka_unit_test(test_concat_unknown_axis_size),
        cmocka_unit_test(test_gradient_scopes),
        cmocka_unit_test(test_gradient_descent),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_momentum_nesterov),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_global_clipnorm),
        cmocka_unit_test(test_apply_averaged_gradients),
        cmocka_unit_test(test_global_step),
    };
    int n_fixed = (int)(sizeof fixed / sizeof fixed[0]);
    int n = N_GRAD_CASES + n_fixed;
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests) return 1;
    for (int i = 0; i < N_GRAD_CASES; i++) {
        tests[i].name = grad_cases[i].name;
        tests[i].test_func = check_grad_case;
        tests[i].initial_state = (void *)&grad_cases[i];
    }
    for (int i = 0; i < n_fixed; i++) tests[N_GRAD_CASES + i] = fixed[i];
    int rc = _cmocka_run_group_tests("test_gradients", tests, (size_t)n, NULL, NULL);
    free(tests);
    return rc;
}
