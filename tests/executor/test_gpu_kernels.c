/* The GPU kernels against the CPU kernels, the semantic reference (one
 * table-driven test runs each op on CPU and CUDA and compares within a stated tolerance;
 * adding a kernel means adding a row to `cases` below).
 *
 * Every case builds its ops twice from the same seeded inputs, once under "/gpu:0" and once
 * under "/cpu:0", runs each graph in its own local session and compares the fetched values:
 * float32 within 1e-5, float64 within 1e-12, relative to max(1, |cpu value|) or, for sums
 * (MatMul, reductions), to a bound on the sum of the magnitudes that were added; bfloat16 and
 * float16 within one unit in the last place of the CPU's value (2^-7 and 2^-10 of it) plus the
 * float32 bound of the sum they were rounded from. Random ops and casts must match bit for bit. A case may also name nodes that must fail (a bad index): each runs
 * alone after the updates, fails on both devices with the same message (the device's name
 * aside), and what it left is fetched and compared like the rest.
 *
 * Part A runs everywhere. Without a GPU, every case runs under "/gpu:0" with soft placement
 * (the default) and must land on CPU:0 with the CPU's numbers; with soft placement off, a GPU
 * request is an error naming the node and the device.
 * Part B needs a GPU: soft placement is off, so an op without a GPU kernel fails to place, and
 * every node of the op under test must be assigned GPU:0; DG_GPU_POISON=1 makes unwritten
 * output elements NaN. It also checks that every op listed in `gpu_ops` has a GPU kernel and
 * ran on the GPU in some case, and that a training step in steady state makes no cudaMalloc.
 * Without a GPU the test exits 77 (skipped) after part A. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "exec_kernel_registry_impl.h"
#include "graph_impl.h"
#ifdef DG_WITH_CUDA
#include "cuda_alloc.h"
#include "cuda_device.h"
#include "gpu_impl.h"
#endif

// A rank-4 shape.
static dg_shape shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    const int64_t dims[4] = {a, b, c, d};
    return dg_shape_make(4, dims);
}

// The ops with a GPU kernel. Part B checks each has one and ran on GPU:0 in some case.
static const char *const gpu_ops[] = {
    "MatMul", "Add", "Sub", "Mul", "Div", "Maximum", "Minimum", "ReluGrad", "SigmoidGrad",
    "TanhGrad", "SqrtGrad", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Square", "Sqrt", "Neg",
    "BiasAdd", "BiasAddGrad", "AddN", "ClipByValue", "ClipByValueGrad", "Cast",
    "ApplyGradientDescent", "ApplyMomentum", "ApplyAdam", "AssignAdd", "AssignSub", "Assign",
    "VariableV2", "Identity", "Const", "RandomUniform", "RandomStandardNormal",
    "TruncatedNormal", "Softmax", "LogSoftmax", "SoftmaxGrad", "LogSoftmaxGrad",
    "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits", "Sum", "Mean",
    "Max", "SumGrad", "MaxGrad", "SumToShape", "BroadcastTo", "Reshape", "Shape", "Fill",
    "ZerosLike", "OnesLike", "Concat", "Split", "Slice", "SliceGrad", "Conv2D",
    "Conv2DBackpropInput", "Conv2DBackpropFilter", "MaxPool", "MaxPoolGrad", "AvgPool",
    "AvgPoolGrad", "Dropout", "Pow", "Transpose", "StopGradient", "Tile", "Select", "OneHot",
    "Gather", "UnsortedSegmentSum", "ScatterAdd", "ScatterSub", "ScatterUpdate",
    "SparseApplyAdagrad", "SparseApplyAdam", "SparseApplyMomentum", "DynamicStitch",
    "Rsqrt", "RsqrtGrad", "Erf", "Gelu", "GeluGrad", "LayerNorm", "LayerNormGrad", "BatchMatMulV2",
    "ScaledDotProductAttention", "ScaledDotProductAttentionGrad", "Sin", "Cos",
};
#define N_GPU_OPS ((int)(sizeof gpu_ops / sizeof gpu_ops[0]))
static bool gpu_op_seen[N_GPU_OPS];

// ---- building a case ----

#define MAX_FEEDS 64
#define MAX_FETCHES 64
#define MAX_STAGE 16

enum { IN_UNIFORM, IN_POSITIVE, IN_NEGATIVE, IN_PROBS };   // [-1,1), [0.5,2), [-1,-0.1), rows sum to 1

enum { TOL_ELEMENT, TOL_SCALED, TOL_EXACT };

// What a case's build function fills: placeholders with their values, the fetches and how to
// compare them, and the targets to run before fetching.
typedef struct bctx {
    dg_graph *g;
    dg_dtype t;            // the float dtype of this run
    uint64_t rng;          // reseeded identically for the GPU and CPU builds
    int n_vars;
    dg_output feeds[MAX_FEEDS];
    dg_tensor *vals[MAX_FEEDS];
    int n_feeds;
    dg_output fetches[MAX_FETCHES];
    int tol[MAX_FETCHES];
    double scale[MAX_FETCHES];   // TOL_SCALED: the error bound's scale
    int n_fetches;
    dg_node *inits[MAX_STAGE];     // run after the global initializer (fed Assigns)
    int n_inits;
    dg_node *updates[MAX_STAGE];   // run once after the inits, before fetching
    int n_updates;
    dg_node *failing[MAX_STAGE];   // run one at a time after the updates: each must fail
    const char *fail_want[MAX_STAGE];   // with a message holding this
    int n_failing;
    int fetch_runs;                // how many times to fetch (random ops: draws per run)
} bctx;

static double urand(bctx *c, double lo, double hi) { return dg_test_uniform(&c->rng, lo, hi); }

static void set_elem(dg_tensor *t, int64_t i, double v) {
    if (dg_tensor_dtype(t) == DG_FLOAT32) dg_tensor_f32(t)[i] = (float)v;
    else dg_tensor_f64(t)[i] = v;
}

// A float placeholder of c->t fed with values of the given kind.
static dg_output ph_kind(bctx *c, int kind, dg_shape s) {
    assert_true(c->n_feeds < MAX_FEEDS);
    dg_status *st = dg_status_new();
    dg_tensor *v = dg_tensor_new(c->t, s, st);
    assert_ok(st);
    dg_status_free(&st);
    int64_t n = dg_tensor_num_elements(v);
    int64_t row = s.rank > 0 ? s.dims[s.rank - 1] : 1;
    for (int64_t i = 0; i < n; i++) {
        double x = kind == IN_POSITIVE ? urand(c, 0.5, 2.0)
                   : kind == IN_NEGATIVE ? urand(c, -1.0, -0.1)
                   : kind == IN_PROBS ? urand(c, 0.1, 1.0) : urand(c, -1.0, 1.0);
        set_elem(v, i, x);
    }
    if (kind == IN_PROBS && row > 0)
        for (int64_t r = 0; r < n / row; r++) {
            double sum = 0;
            for (int64_t j = 0; j < row; j++) sum += dg_tensor_get_as_double(v, r * row + j);
            for (int64_t j = 0; j < row; j++)
                set_elem(v, r * row + j, dg_tensor_get_as_double(v, r * row + j) / sum);
        }
    dg_output p = dg_placeholder(c->g, NULL, c->t, s);
    c->feeds[c->n_feeds] = p;
    c->vals[c->n_feeds++] = v;
    return p;
}

static dg_output ph(bctx *c, dg_shape s) { return ph_kind(c, IN_UNIFORM, s); }

// A scalar placeholder of c->t fed with v.
static dg_output ph_value(bctx *c, double v) {
    dg_output p = ph_kind(c, IN_UNIFORM, dg_shape_scalar());
    set_elem(c->vals[c->n_feeds - 1], 0, v);
    return p;
}

// Ints of dtype t (int32 or int64) and shape s, drawn from [lo, hi).
static dg_output ph_ints(bctx *c, dg_dtype t, dg_shape s, int64_t lo, int64_t hi) {
    assert_true(c->n_feeds < MAX_FEEDS);
    dg_status *st = dg_status_new();
    dg_tensor *v = dg_tensor_new(t, s, st);
    assert_ok(st);
    dg_status_free(&st);
    for (int64_t i = 0; i < dg_tensor_num_elements(v); i++) {
        int64_t k = (int64_t)floor(urand(c, (double)lo, (double)hi));
        if (k >= hi) k = hi - 1;
        if (t == DG_INT32) dg_tensor_i32(v)[i] = (int32_t)k;
        else dg_tensor_i64(v)[i] = k;
    }
    dg_output p = dg_placeholder(c->g, NULL, t, s);
    c->feeds[c->n_feeds] = p;
    c->vals[c->n_feeds++] = v;
    return p;
}

// Ints of dtype t (int32 or int64) and shape s fed with v (one value per element).
static dg_output ph_int_values(bctx *c, dg_dtype t, dg_shape s, const int64_t *v) {
    assert_true(c->n_feeds < MAX_FEEDS);
    dg_status *st = dg_status_new();
    dg_tensor *x = dg_tensor_new(t, s, st);
    assert_ok(st);
    dg_status_free(&st);
    for (int64_t i = 0; i < dg_tensor_num_elements(x); i++)
        if (t == DG_INT32) dg_tensor_i32(x)[i] = (int32_t)v[i];
        else dg_tensor_i64(x)[i] = v[i];
    dg_output p = dg_placeholder(c->g, NULL, t, s);
    c->feeds[c->n_feeds] = p;
    c->vals[c->n_feeds++] = x;
    return p;
}

// Class ids in [0, classes) of dtype t (int32 or int64), shape [n].
static dg_output ph_labels(bctx *c, dg_dtype t, int64_t n, int64_t classes) {
    return ph_ints(c, t, dg_shape1(n), 0, classes);
}

// A bool placeholder of shape s, each element true with probability 1/2.
static dg_output ph_bool(bctx *c, dg_shape s) {
    assert_true(c->n_feeds < MAX_FEEDS);
    dg_status *st = dg_status_new();
    dg_tensor *v = dg_tensor_new(DG_BOOL, s, st);
    assert_ok(st);
    dg_status_free(&st);
    uint8_t *b = dg_tensor_data(v);
    for (int64_t i = 0; i < dg_tensor_num_elements(v); i++) b[i] = urand(c, 0, 1) < 0.5;
    dg_output p = dg_placeholder(c->g, NULL, DG_BOOL, s);
    c->feeds[c->n_feeds] = p;
    c->vals[c->n_feeds++] = v;
    return p;
}

// Sum of |x| over the last fed value, the scale of a reduction's rounding error.
static double fed_abs_sum(bctx *c, int feed) {
    double s = 0;
    const dg_tensor *t = c->vals[feed];
    for (int64_t i = 0; i < dg_tensor_num_elements(t); i++) s += fabs(dg_tensor_get_as_double(t, i));
    return s;
}

// An int64 vector constant pinned to CPU:0 (shapes, like TensorFlow's HostMemory inputs).
static dg_output aux_i64(bctx *c, const int64_t *v, int n) {
    dg_graph_push_device(c->g, "/cpu:0");
    dg_output o = dg_const_i64s(c->g, NULL, v, n);
    dg_graph_pop_device(c->g);
    return o;
}

static void fetch_tol(bctx *c, dg_output o, int tol, double scale) {
    assert_true(c->n_fetches < MAX_FETCHES);
    c->fetches[c->n_fetches] = o;
    c->tol[c->n_fetches] = tol;
    c->scale[c->n_fetches++] = scale;
}
static void fetch(bctx *c, dg_output o) { fetch_tol(c, o, TOL_ELEMENT, 1); }
static void fetch_exact(bctx *c, dg_output o) { fetch_tol(c, o, TOL_EXACT, 1); }
// A reduction of the value fed as `feed` to n_out outputs: error scale sum|x| / n_out.
static void fetch_reduced(bctx *c, dg_output o, int feed) {
    dg_shape s = dg_output_shape(o);
    int64_t n_out = dg_shape_num_elements(&s);
    fetch_tol(c, o, TOL_SCALED, fed_abs_sum(c, feed) / (double)(n_out > 0 ? n_out : 1));
}

// A variable of c->t initialised (after the zeros initializer) from a fed value of kind.
static dg_output var_fed(bctx *c, int kind, dg_shape s) {
    char name[32];
    snprintf(name, sizeof name, "var%d", c->n_vars++);
    dg_output v = dg_variable(c->g, name, c->t, s, dg_init_zeros());
    dg_output a = dg_assign(c->g, NULL, v, ph_kind(c, kind, s));
    assert_true(c->n_inits < MAX_STAGE);
    if (a.node) c->inits[c->n_inits++] = a.node;
    return v;
}

static void update(bctx *c, dg_output o) {
    assert_true(c->n_updates < MAX_STAGE);
    if (o.node) c->updates[c->n_updates++] = o.node;
}

// o's node, run alone after the updates, must fail with a message holding want.
static void must_fail(bctx *c, dg_output o, const char *want) {
    assert_true(c->n_failing < MAX_STAGE);
    assert_non_null(o.node);
    c->failing[c->n_failing] = o.node;
    c->fail_want[c->n_failing++] = want;
}

static dg_output op2(bctx *c, const char *type, dg_output a, dg_output b) {
    dg_output ins[2] = {a, b};
    return graph_build(c->g, type, NULL, ins, 2);
}

static dg_shape shape_n(int n, const int64_t *d) { return dg_shape_make(n, d); }

// ---- the cases ----

static void build_matmul(bctx *c) {
    static const int64_t sizes[][3] = {{1, 1, 1}, {1, 7, 1}, {3, 5, 7}, {17, 33, 9}, {64, 67, 65}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int t = 0; t < 4; t++) {
            int64_t m = sizes[s][0], k = sizes[s][1], n = sizes[s][2];
            bool ta = t & 1, tb = t & 2;
            dg_output a = ph(c, ta ? dg_shape2(k, m) : dg_shape2(m, k));
            dg_output b = ph(c, tb ? dg_shape2(n, k) : dg_shape2(k, n));
            // Inputs in [-1, 1): a sum of k products is off by at most ~k rounding errors.
            fetch_tol(c, dg_matmul(c->g, NULL, a, b, ta, tb), TOL_SCALED, (double)k);
        }
}

typedef dg_output (*binary_fn)(dg_graph *, const char *, dg_output, dg_output);

static void build_binary(bctx *c, binary_fn f, bool positive_b) {
    static const int64_t pats[][2][4] = {
        // rank a, dims a..., | rank b, dims b...
        {{2, 5, 7}, {2, 5, 7}},    // same shape
        {{2, 5, 7}, {0}},          // scalar right
        {{0}, {2, 5, 7}},          // scalar left
        {{2, 5, 7}, {1, 7}},       // row broadcast
        {{2, 5, 7}, {2, 5, 1}},    // column broadcast
        {{1, 7}, {2, 5, 7}},       // row broadcast, left
        {{3, 4, 1, 6}, {3, 1, 5, 1}},   // general 3-d
        {{3, 2, 3, 4}, {2, 3, 1}},      // rank 3 against rank 2
        {{2, 300, 1001}, {1, 1001}},    // more than one block's worth
    };
    int kb = positive_b ? IN_POSITIVE : IN_UNIFORM;
    for (size_t p = 0; p < sizeof pats / sizeof pats[0]; p++) {
        dg_output a = ph(c, shape_n((int)pats[p][0][0], &pats[p][0][1]));
        dg_output b = ph_kind(c, kb, shape_n((int)pats[p][1][0], &pats[p][1][1]));
        fetch(c, f(c->g, NULL, a, b));
    }
}
static void build_add(bctx *c) { build_binary(c, dg_add, false); }
static void build_sub(bctx *c) { build_binary(c, dg_sub, false); }
static void build_mul(bctx *c) { build_binary(c, dg_mul, false); }
static void build_div(bctx *c) { build_binary(c, dg_div, true); }
static void build_maximum(bctx *c) { build_binary(c, dg_maximum, false); }
static void build_minimum(bctx *c) { build_binary(c, dg_minimum, false); }

typedef dg_output (*unary_fn)(dg_graph *, const char *, dg_output);

static void build_unary(bctx *c, unary_fn f, int kind) {
    dg_shape shapes[] = {dg_shape1(1), dg_shape2(37, 29), dg_shape2(300, 1001), dg_shape3(2, 3, 4)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) fetch(c, f(c->g, NULL, ph_kind(c, kind, shapes[i])));
}
static void build_relu(bctx *c) { build_unary(c, dg_relu, IN_UNIFORM); }
static void build_sigmoid(bctx *c) { build_unary(c, dg_sigmoid, IN_UNIFORM); }
static void build_tanh(bctx *c) { build_unary(c, dg_tanh, IN_UNIFORM); }
static void build_exp(bctx *c) { build_unary(c, dg_exp, IN_UNIFORM); }
static void build_log(bctx *c) { build_unary(c, dg_log, IN_POSITIVE); }
static void build_square(bctx *c) { build_unary(c, dg_square, IN_UNIFORM); }
static void build_sqrt(bctx *c) { build_unary(c, dg_sqrt, IN_POSITIVE); }
static void build_neg(bctx *c) { build_unary(c, dg_neg, IN_UNIFORM); }
static void build_rsqrt(bctx *c) { build_unary(c, dg_rsqrt, IN_POSITIVE); }
static void build_erf(bctx *c) { build_unary(c, dg_erf, IN_UNIFORM); }
static void build_sin(bctx *c) { build_unary(c, dg_sin, IN_UNIFORM); }
static void build_cos(bctx *c) { build_unary(c, dg_cos, IN_UNIFORM); }
// Both forms of GELU, and their GeluGrad as the gradient function builds it (with the form).
static void build_gelu(bctx *c) {
    dg_shape shapes[] = {dg_shape1(1), dg_shape2(37, 29), dg_shape2(300, 1001)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int approximate = 0; approximate < 2; approximate++) {
            dg_output x = ph(c, shapes[i]), dy = ph(c, shapes[i]), dx;
            dg_output y = dg_gelu(c->g, NULL, x, approximate);
            fetch(c, y);
            if (dg_gradients(c->g, &y, 1, &x, 1, &dy, &dx)) fetch(c, dx);
        }
}
static void build_identity(bctx *c) { build_unary(c, dg_identity, IN_UNIFORM); }
static void build_zeros_like(bctx *c) { build_unary(c, dg_zeros_like, IN_UNIFORM); }
static void build_ones_like(bctx *c) { build_unary(c, dg_ones_like, IN_UNIFORM); }

// Elementwise gradients as the gradient functions build them (graph/gradients.c):
// ReluGrad(dy, features), the others (y, dy).
// BatchMatMulV2 with each adjoint, broadcast batch dimensions, and its gradient (which sums
// over the broadcast dimensions).
static void build_batch_matmul(bctx *c) {
    for (int v = 0; v < 4; v++) {
        bool ax = v & 1, ay = v & 2;
        dg_output x = ph(c, ax ? shape4(2, 1, 33, 17) : shape4(2, 1, 17, 33));
        dg_output y = ph(c, ay ? dg_shape3(3, 9, 33) : dg_shape3(3, 33, 9));
        dg_output z = dg_batch_matmul(c->g, NULL, x, y, ax, ay), dz = ph(c, shape4(2, 3, 17, 9));
        fetch(c, z);
        dg_output xs[2] = {x, y}, dx[2];
        if (dg_gradients(c->g, &z, 1, xs, 2, &dz, dx)) {
            fetch(c, dx[0]);
            fetch(c, dx[1]);
        }
    }
}

// LayerNorm and its gradient: widths that take each row-group size of nn.cu (1 thread up to 16
// columns, a warp up to 512, the block beyond) and their tails, rank 3, one row, one column.
static void build_layer_norm(bctx *c) {
    dg_shape shapes[] = {dg_shape2(1, 1), dg_shape2(37, 16), dg_shape2(5, 17), dg_shape2(3, 512),
                         dg_shape2(3, 513), dg_shape3(2, 3, 600), dg_shape2(300, 96)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_shape s = shapes[i];
        dg_shape v = dg_shape1(s.dims[s.rank - 1]);
        dg_output x = ph(c, s), gamma = ph(c, v), beta = ph(c, v), dy = ph(c, s);
        dg_output y = dg_layer_norm(c->g, NULL, x, gamma, beta, 1e-5);
        fetch(c, y);
        fetch(c, (dg_output){y.node, 1});
        fetch(c, (dg_output){y.node, 2});
        dg_output xs[3] = {x, gamma, beta}, dx[3];
        if (dg_gradients(c->g, &y, 1, xs, 3, &dy, dx))
            for (int k = 0; k < 3; k++) fetch(c, dx[k]);
    }
}

// ScaledDotProductAttention and its gradient: query and key lengths over attention.cu's blocks
// of 32 rows with tails, causal and not, one query over a long cache, rows that see no key
// (lse -inf on both devices), batch dimensions, head widths 64 and odd ones. Gradients sum
// over up to Tq rows: their error bound scales with it.
static void build_attention(bctx *c) {
    static const struct {
        int64_t b, h, Tq, Tk, D, Dv;
        bool causal;
    } cfg[] = {
        {2, 2, 70, 70, 16, 16, true}, {2, 2, 70, 70, 16, 16, false}, {1, 3, 1, 100, 64, 64, true},
        {1, 2, 40, 90, 5, 7, true},   {1, 1, 90, 40, 5, 3, true},    {3, 2, 33, 33, 64, 64, true},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_output q = ph(c, shape4(cfg[i].b, cfg[i].h, cfg[i].Tq, cfg[i].D));
        dg_output k = ph(c, shape4(cfg[i].b, cfg[i].h, cfg[i].Tk, cfg[i].D));
        dg_output v = ph(c, shape4(cfg[i].b, cfg[i].h, cfg[i].Tk, cfg[i].Dv));
        dg_output dy = ph(c, shape4(cfg[i].b, cfg[i].h, cfg[i].Tq, cfg[i].Dv));
        dg_output o = dg_attention(c->g, NULL, q, k, v, cfg[i].causal, 0);
        fetch(c, o);
        fetch(c, (dg_output){o.node, 1});
        dg_output xs[3] = {q, k, v}, dx[3];
        if (dg_gradients(c->g, &o, 1, xs, 3, &dy, dx))
            for (int j = 0; j < 3; j++) fetch_tol(c, dx[j], TOL_SCALED, (double)(cfg[i].Tq > cfg[i].Tk ? cfg[i].Tq : cfg[i].Tk));
    }
}

static void build_elem_grads(bctx *c) {
    dg_shape shapes[] = {dg_shape1(1), dg_shape2(37, 29), dg_shape2(300, 1001)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_shape s = shapes[i];
        fetch(c, op2(c, "ReluGrad", ph(c, s), ph(c, s)));
        fetch(c, op2(c, "SigmoidGrad", ph(c, s), ph(c, s)));
        fetch(c, op2(c, "TanhGrad", ph(c, s), ph(c, s)));
        fetch(c, op2(c, "SqrtGrad", ph_kind(c, IN_POSITIVE, s), ph(c, s)));
        fetch(c, op2(c, "RsqrtGrad", ph_kind(c, IN_POSITIVE, s), ph(c, s)));
    }
}

static void build_bias_add(bctx *c) {
    fetch(c, dg_bias_add(c->g, NULL, ph(c, dg_shape2(37, 29)), ph(c, dg_shape1(29))));
    fetch(c, dg_bias_add(c->g, NULL, ph(c, dg_shape3(4, 5, 6)), ph(c, dg_shape1(6))));
    fetch(c, dg_bias_add(c->g, NULL, ph(c, dg_shape2(1, 1)), ph(c, dg_shape1(1))));
    fetch(c, dg_bias_add(c->g, NULL, ph(c, dg_shape2(1000, 100)), ph(c, dg_shape1(100))));
}

static void build_bias_add_grad(bctx *c) {
    dg_shape shapes[] = {dg_shape2(37, 29), dg_shape3(4, 5, 6), dg_shape2(1, 1), dg_shape2(1000, 10)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_output dy = ph(c, shapes[i]);
        fetch_reduced(c, graph_build(c->g, "BiasAddGrad", NULL, &dy, 1), c->n_feeds - 1);
    }
}

static void build_add_n(bctx *c) {
    // dg_add_n of one input is the input itself: no AddN node to test.
    for (int n = 2; n <= 5; n++) {
        dg_output xs[5];
        for (int i = 0; i < n; i++) xs[i] = ph(c, dg_shape2(37, 29));
        fetch(c, dg_add_n(c->g, NULL, xs, n));
    }
    dg_output ys[2] = {ph(c, dg_shape2(300, 1001)), ph(c, dg_shape2(300, 1001))};
    fetch(c, dg_add_n(c->g, NULL, ys, 2));
}

static void build_clip(bctx *c) {
    dg_shape s = dg_shape2(37, 29);
    fetch(c, dg_clip_by_value(c->g, NULL, ph(c, s), ph_value(c, -0.3), ph_value(c, 0.4)));
    fetch(c, dg_clip_by_value(c->g, NULL, ph(c, s), ph_kind(c, IN_NEGATIVE, s), ph_kind(c, IN_POSITIVE, s)));
    // Bounds that meet: everything becomes 0.25.
    fetch(c, dg_clip_by_value(c->g, NULL, ph(c, s), ph_value(c, 0.25), ph_value(c, 0.25)));
}

static void build_clip_grad(bctx *c) {
    dg_shape s = dg_shape2(37, 29);
    for (int bounds = 0; bounds < 2; bounds++) {
        dg_node *n = graph_begin(c->g, "ClipByValueGrad", NULL);
        graph_add_input(n, ph(c, s));
        graph_add_input(n, ph(c, s));
        graph_add_input(n, bounds ? ph_kind(c, IN_NEGATIVE, s) : ph_value(c, -0.3));
        graph_add_input(n, bounds ? ph_kind(c, IN_POSITIVE, s) : ph_value(c, 0.4));
        n = graph_finish(n);
        assert_non_null(n);
        for (int k = 0; k < 3; k++) fetch(c, (dg_output){n, k});
    }
}

static void build_cast(bctx *c) {
    dg_dtype other = c->t == DG_FLOAT32 ? DG_FLOAT64 : DG_FLOAT32;
    fetch(c, dg_cast(c->g, NULL, ph(c, dg_shape2(37, 29)), other));
    fetch(c, dg_cast(c->g, NULL, ph(c, dg_shape1(1)), other));
    fetch(c, dg_cast(c->g, NULL, ph(c, dg_shape2(300, 1001)), other));
}

// Cast to and from the 16-bit floats: random values, and values at their edges (ties at the
// rounding point, the largest finite ones and beyond, subnormals, zeros and infinities), bit
// for bit against the CPU; from float64 through float32, as the CPU.
static void build_cast16(bctx *c) {
    static const double edges[] = {
        0.0, -0.0, 1.0, -1.0, 1.0 + 0x1p-8, 1.0 + 0x1p-7 + 0x1p-8, 1.0 + 0x1p-11, 1.0 + 0x1p-10 + 0x1p-11,
        65504.0, 65519.0, 65520.0, -70000.0, 0x1p-14, 0x1p-24, 0x1p-25, 0x1.8p-25, 0x1p-26, 3e-7, -5.96e-8,
        3.3895313892515355e38, 3.4e38, 1e-40, -1e-45, INFINITY, -INFINITY, 0.1, -2.5, 1e10};
    const int n_edges = (int)(sizeof edges / sizeof edges[0]);
    assert_true(c->n_feeds < MAX_FEEDS);
    dg_status *st = dg_status_new();
    dg_tensor *v = dg_tensor_new(c->t, dg_shape1(n_edges), st);
    assert_ok(st);
    dg_status_free(&st);
    for (int i = 0; i < n_edges; i++) set_elem(v, i, edges[i]);
    dg_output e = dg_placeholder(c->g, NULL, c->t, dg_shape1(n_edges));
    c->feeds[c->n_feeds] = e;
    c->vals[c->n_feeds++] = v;
    dg_output r = ph(c, dg_shape2(300, 1001));
    const dg_dtype halves[2] = {DG_BFLOAT16, DG_FLOAT16};
    // NaNs (quiet and signalling, either sign, with payloads), infinities and zeros given in
    // 16 bits, cast to the other format: their bits (the bits move through float32 unchanged).
    static const uint16_t nan_bits[2][8] = {{0x7fc0, 0xffc1, 0x7f81, 0xff95, 0x7f80, 0xff80, 0x8000, 0x0001},
                                            {0x7e00, 0xfe01, 0x7c01, 0xfd55, 0x7c00, 0xfc00, 0x8000, 0x0001}};
    for (int h = 0; h < 2; h++) {
        assert_true(c->n_feeds < MAX_FEEDS);
        dg_status *nst = dg_status_new();
        dg_tensor *nv = dg_tensor_new(halves[h], dg_shape1(8), nst);
        assert_ok(nst);
        dg_status_free(&nst);
        memcpy(dg_tensor_data(nv), nan_bits[h], sizeof nan_bits[h]);
        dg_output np = dg_placeholder(c->g, NULL, halves[h], dg_shape1(8));
        c->feeds[c->n_feeds] = np;
        c->vals[c->n_feeds++] = nv;
        fetch_exact(c, dg_cast(c->g, NULL, np, halves[1 - h]));
    }
    for (int h = 0; h < 2; h++) {
        dg_output eh = dg_cast(c->g, NULL, e, halves[h]), rh = dg_cast(c->g, NULL, r, halves[h]);
        fetch_exact(c, eh);
        fetch_exact(c, rh);
        fetch_exact(c, dg_cast(c->g, NULL, eh, c->t));   // back, exactly
        fetch_exact(c, dg_cast(c->g, NULL, rh, halves[1 - h]));   // one 16-bit float to the other
    }
}

// MatMul and BatchMatMulV2 (with its gradient) in bfloat16 and float16: float32 sums rounded
// once, as the CPU's 16-bit GEMM.
static void build_matmul16(bctx *c) {
    static const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 67, 65}, {128, 256, 64}};
    const dg_dtype halves[2] = {DG_BFLOAT16, DG_FLOAT16};
    for (int h = 0; h < 2; h++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int t = 0; t < 4; t++) {
                if (h == 1 && t != (int)(s % 4)) continue;   // float16: one transposition a size (feeds run out)
                int64_t m = sizes[s][0], k = sizes[s][1], n = sizes[s][2];
                bool ta = t & 1, tb = t & 2;
                dg_output a = dg_cast(c->g, NULL, ph(c, ta ? dg_shape2(k, m) : dg_shape2(m, k)), halves[h]);
                dg_output b = dg_cast(c->g, NULL, ph(c, tb ? dg_shape2(n, k) : dg_shape2(k, n)), halves[h]);
                fetch_tol(c, dg_matmul(c->g, NULL, a, b, ta, tb), TOL_SCALED, (double)k);
            }
        // Batch dimensions equal: a broadcast one's gradient needs SumToShape, which has a
        // 16-bit kernel on the CPU only.
        dg_output x = dg_cast(c->g, NULL, ph(c, shape4(2, 3, 17, 33)), halves[h]);
        dg_output y = dg_cast(c->g, NULL, ph(c, shape4(2, 3, 33, 9)), halves[h]);
        dg_output z = dg_batch_matmul(c->g, NULL, x, y, false, false);
        dg_output dz = dg_cast(c->g, NULL, ph(c, shape4(2, 3, 17, 9)), halves[h]);
        fetch_tol(c, z, TOL_SCALED, 33.0);
        dg_output xs[2] = {x, y}, dx[2];
        assert_true(dg_gradients(c->g, &z, 1, xs, 2, &dz, dx));
        {
            fetch_tol(c, dx[0], TOL_SCALED, 9.0);
            fetch_tol(c, dx[1], TOL_SCALED, 17.0);
        }
    }
}

static void build_random(bctx *c) {
    dg_shape shapes[] = {dg_shape1(1), dg_shape2(7, 13), dg_shape2(1000, 37), dg_shape3(3, 5, 7)};
    c->fetch_runs = 2;   // two draws: each must match the CPU's bit for bit
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t seed = 42 + (int64_t)i;
        fetch_exact(c, dg_random_uniform(c->g, NULL, c->t, shapes[i], -2.0, 3.0, seed));
        fetch_exact(c, dg_random_normal(c->g, NULL, c->t, shapes[i], 0.5, 2.0, seed));
        fetch_exact(c, dg_truncated_normal(c->g, NULL, c->t, shapes[i], -1.0, 0.5, seed));
    }
}

static void build_softmax(bctx *c) {
    dg_shape shapes[] = {dg_shape2(1, 1), dg_shape2(37, 29), dg_shape2(5, 1000), dg_shape3(3, 4, 10),
                         dg_shape1(17)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        fetch(c, dg_softmax(c->g, NULL, ph(c, shapes[i])));
        fetch(c, dg_log_softmax(c->g, NULL, ph(c, shapes[i])));
    }
    // Large logits: the max must be subtracted first.
    dg_output big = dg_mul(c->g, NULL, ph(c, dg_shape2(8, 10)), ph_value(c, 80.0));
    fetch(c, dg_softmax(c->g, NULL, big));
    fetch(c, dg_log_softmax(c->g, NULL, big));
}

static void build_softmax_grads(bctx *c) {
    dg_shape shapes[] = {dg_shape2(1, 1), dg_shape2(37, 29), dg_shape2(5, 1000)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_shape s = shapes[i];
        // From real forward values, as the gradient functions use them.
        dg_output sm = dg_softmax(c->g, NULL, ph(c, s));
        fetch_tol(c, op2(c, "SoftmaxGrad", sm, ph(c, s)), TOL_SCALED, 2.0);
        dg_output lsm = dg_log_softmax(c->g, NULL, ph(c, s));
        fetch_tol(c, op2(c, "LogSoftmaxGrad", lsm, ph(c, s)), TOL_SCALED, (double)s.dims[1]);
    }
}

static void build_xent(bctx *c) {
    int64_t sizes[][2] = {{1, 1}, {37, 10}, {64, 1000}, {3, 2}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        dg_shape s = dg_shape2(sizes[i][0], sizes[i][1]);
        dg_output x = dg_softmax_cross_entropy_with_logits(c->g, NULL, ph(c, s), ph_kind(c, IN_PROBS, s));
        fetch(c, x);
        fetch(c, (dg_output){x.node, 1});
    }
}

static void build_sparse_xent(bctx *c) {
    int64_t sizes[][2] = {{1, 1}, {37, 10}, {64, 1000}, {3, 2}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int lt = 0; lt < 2; lt++) {
            dg_shape s = dg_shape2(sizes[i][0], sizes[i][1]);
            dg_output logits = ph(c, s);
            dg_output labels = ph_labels(c, lt ? DG_INT32 : DG_INT64, sizes[i][0], sizes[i][1]);
            dg_output x = dg_sparse_softmax_cross_entropy_with_logits(c->g, NULL, logits, labels);
            fetch(c, x);
            fetch(c, (dg_output){x.node, 1});
        }
}

typedef dg_output (*reduce_fn)(dg_graph *, const char *, dg_output, const int64_t *, int, bool);

static const struct {
    int n;
    int64_t axes[3];
} reduce_axes[] = {{0, {0}}, {1, {0}}, {1, {1}}, {1, {2}}, {2, {0, 2}}, {1, {-1}}, {2, {1, -1}}, {3, {0, 1, 2}}};

static void build_reduce(bctx *c, reduce_fn f) {
    for (size_t a = 0; a < sizeof reduce_axes / sizeof reduce_axes[0]; a++)
        for (int keep = 0; keep < 2; keep++) {
            dg_output x = ph(c, dg_shape3(4, 5, 6));
            fetch_reduced(c, f(c->g, NULL, x, reduce_axes[a].axes, reduce_axes[a].n, keep), c->n_feeds - 1);
        }
    // Larger: rows and columns of a matrix, and a whole one.
    int64_t ax0 = 0, ax1 = 1;
    dg_output y = ph(c, dg_shape2(1000, 37));
    fetch_reduced(c, f(c->g, NULL, y, &ax0, 1, false), c->n_feeds - 1);
    fetch_reduced(c, f(c->g, NULL, y, &ax1, 1, false), c->n_feeds - 1);
    fetch_reduced(c, f(c->g, NULL, y, NULL, 0, false), c->n_feeds - 1);
    dg_output z = ph(c, dg_shape1(1));
    fetch_reduced(c, f(c->g, NULL, z, NULL, 0, true), c->n_feeds - 1);
}
static void build_sum(bctx *c) { build_reduce(c, dg_sum); }
static void build_mean(bctx *c) { build_reduce(c, dg_mean); }
static void build_max(bctx *c) { build_reduce(c, dg_max); }

// The shape of reducing [4,5,6] over axes (keep: reduced dims as 1).
static dg_shape reduced(const int64_t *axes, int n, bool keep) {
    int64_t x[3] = {4, 5, 6};
    bool red[3] = {n == 0, n == 0, n == 0};
    for (int i = 0; i < n; i++) red[axes[i] < 0 ? axes[i] + 3 : axes[i]] = true;
    dg_shape s = dg_shape_scalar();
    for (int d = 0; d < 3; d++)
        if (!red[d]) s.dims[s.rank++] = x[d];
        else if (keep) s.dims[s.rank++] = 1;
    return s;
}

static void build_sum_grad(bctx *c) {
    static const int64_t xs[3] = {4, 5, 6};
    for (size_t a = 0; a < sizeof reduce_axes / sizeof reduce_axes[0]; a++)
        for (int v = 0; v < 4; v++) {
            bool keep = v & 1, mean = v & 2;
            dg_node *n = graph_begin(c->g, "SumGrad", NULL);
            graph_add_input(n, ph(c, reduced(reduce_axes[a].axes, reduce_axes[a].n, keep)));
            graph_add_input(n, aux_i64(c, xs, 3));
            graph_set_attr_ints(n, "axes", reduce_axes[a].axes, reduce_axes[a].n);
            graph_set_attr_bool(n, "keep_dims", keep);
            graph_set_attr_bool(n, "mean", mean);
            n = graph_finish(n);
            assert_non_null(n);
            fetch(c, (dg_output){n, 0});
        }
}

static void build_max_grad(bctx *c) {
    for (size_t a = 0; a < sizeof reduce_axes / sizeof reduce_axes[0]; a++)
        for (int keep = 0; keep < 2; keep++) {
            dg_output x = ph(c, dg_shape3(4, 5, 6));
            dg_output y = dg_max(c->g, NULL, x, reduce_axes[a].axes, reduce_axes[a].n, keep);
            dg_node *n = graph_begin(c->g, "MaxGrad", NULL);
            graph_add_input(n, ph(c, reduced(reduce_axes[a].axes, reduce_axes[a].n, keep)));
            graph_add_input(n, x);
            graph_add_input(n, y);
            graph_set_attr_ints(n, "axes", reduce_axes[a].axes, reduce_axes[a].n);
            graph_set_attr_bool(n, "keep_dims", keep);
            n = graph_finish(n);
            assert_non_null(n);
            fetch(c, (dg_output){n, 0});
        }
}

static void build_sum_to_shape(bctx *c) {
    static const int64_t to[][4] = {{1, 6}, {2, 5, 1}, {3, 1, 5, 6}, {0}, {3, 4, 1, 6}, {3, 4, 5, 6}, {2, 1, 1}};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        dg_output x = ph(c, dg_shape3(4, 5, 6));
        int feed = c->n_feeds - 1;
        dg_output s = aux_i64(c, &to[i][1], (int)to[i][0]);
        fetch_reduced(c, op2(c, "SumToShape", x, s), feed);
    }
}

static void build_broadcast_to(bctx *c) {
    static const int64_t from[][4] = {{1, 6}, {2, 5, 1}, {0}, {3, 4, 5, 6}, {3, 1, 5, 1}};
    static const int64_t to[3] = {4, 5, 6};
    for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
        dg_output x = ph(c, shape_n((int)from[i][0], &from[i][1]));
        fetch(c, op2(c, "BroadcastTo", x, aux_i64(c, to, 3)));
    }
}

static void build_reshape_shape(bctx *c) {
    static const int64_t to[][4] = {{2, 20, 6}, {2, -1, 4}, {1, 120}, {3, 2, 2, 30}};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        dg_output x = ph(c, dg_shape3(4, 5, 6));
        fetch(c, dg_reshape_to(c->g, NULL, x, aux_i64(c, &to[i][1], (int)to[i][0])));
    }
    fetch_exact(c, dg_shape_of(c->g, NULL, ph(c, dg_shape3(4, 5, 6))));
    fetch_exact(c, dg_shape_of(c->g, NULL, ph(c, dg_shape_scalar())));
}

static void build_fill(bctx *c) {
    static const int64_t dims[][4] = {{2, 3, 4}, {1, 1}, {2, 300, 1001}, {0}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        fetch(c, dg_fill(c->g, NULL, aux_i64(c, &dims[i][1], (int)dims[i][0]), ph_value(c, urand(c, -3, 3))));
}

static void build_const(bctx *c) {
    dg_status *st = dg_status_new();
    dg_shape shapes[] = {dg_shape_scalar(), dg_shape2(37, 29), dg_shape1(1)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_tensor *v = dg_tensor_new(c->t, shapes[i], st);
        assert_ok(st);
        for (int64_t k = 0; k < dg_tensor_num_elements(v); k++) set_elem(v, k, urand(c, -5, 5));
        fetch_exact(c, dg_const(c->g, NULL, v));
        dg_tensor_unref(v);
    }
    fetch_exact(c, dg_scalar(c->g, NULL, c->t, 2.5));
    dg_status_free(&st);
}

static void build_concat(bctx *c) {
    dg_output a[2] = {ph(c, dg_shape2(3, 4)), ph(c, dg_shape2(5, 4))};
    fetch(c, dg_concat(c->g, NULL, a, 2, 0));
    dg_output b[3] = {ph(c, dg_shape2(3, 4)), ph(c, dg_shape2(3, 2)), ph(c, dg_shape2(3, 1))};
    fetch(c, dg_concat(c->g, NULL, b, 3, 1));
    fetch(c, dg_concat(c->g, NULL, b, 3, -1));
    dg_output d[2] = {ph(c, dg_shape3(2, 3, 4)), ph(c, dg_shape3(2, 5, 4))};
    fetch(c, dg_concat(c->g, NULL, d, 2, 1));
    dg_output e[1] = {ph(c, dg_shape2(3, 4))};
    fetch(c, dg_concat(c->g, NULL, e, 1, 0));
    dg_output f[2] = {ph(c, dg_shape2(300, 1001)), ph(c, dg_shape2(300, 7))};
    fetch(c, dg_concat(c->g, NULL, f, 2, 1));
}

static void build_split(bctx *c) {
    dg_output parts[4];
    assert_true(dg_split(c->g, NULL, ph(c, dg_shape2(6, 4)), 0, 3, parts));
    for (int i = 0; i < 3; i++) fetch(c, parts[i]);
    assert_true(dg_split(c->g, NULL, ph(c, dg_shape3(4, 6, 2)), 1, 2, parts));
    for (int i = 0; i < 2; i++) fetch(c, parts[i]);
    assert_true(dg_split(c->g, NULL, ph(c, dg_shape3(4, 6, 4)), -1, 4, parts));
    for (int i = 0; i < 4; i++) fetch(c, parts[i]);
    assert_true(dg_split(c->g, NULL, ph(c, dg_shape2(5, 3)), 1, 1, parts));
    fetch(c, parts[0]);
}

static void build_slice(bctx *c) {
    static const int64_t b1[2] = {2, 3}, s1[2] = {4, -1};
    fetch(c, dg_slice(c->g, NULL, ph(c, dg_shape2(10, 12)), b1, s1, 2));
    static const int64_t b2[3] = {1, 0, 2}, s2[3] = {2, -1, 3};
    fetch(c, dg_slice(c->g, NULL, ph(c, dg_shape3(4, 5, 6)), b2, s2, 3));
    static const int64_t b3[2] = {0, 0}, s3[2] = {1, 1};
    fetch(c, dg_slice(c->g, NULL, ph(c, dg_shape2(10, 12)), b3, s3, 2));
    static const int64_t b4[2] = {0, 0}, s4[2] = {-1, -1};
    fetch(c, dg_slice(c->g, NULL, ph(c, dg_shape2(10, 12)), b4, s4, 2));
}

static void build_slice_grad(bctx *c) {
    static const int64_t xs2[2] = {10, 12}, b2[2] = {2, 3};
    static const int64_t xs3[3] = {4, 5, 6}, b3[3] = {1, 0, 2};
    static const int64_t z2[2] = {0, 0};
    struct { dg_shape dy; const int64_t *x, *begin; int rank; } v[] = {
        {dg_shape2(4, 9), xs2, b2, 2},
        {dg_shape3(2, 5, 3), xs3, b3, 3},
        {dg_shape2(10, 12), xs2, z2, 2},
        {dg_shape2(1, 1), xs2, b2, 2},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        dg_node *n = graph_begin(c->g, "SliceGrad", NULL);
        graph_add_input(n, ph(c, v[i].dy));
        graph_add_input(n, aux_i64(c, v[i].x, v[i].rank));
        graph_set_attr_ints(n, "begin", v[i].begin, v[i].rank);
        n = graph_finish(n);
        assert_non_null(n);
        fetch(c, (dg_output){n, 0});
    }
}

// Variables: zeros initializer (Const, Assign, VariableV2), then a fed Assign, an update, and
// the variable fetched.
static void build_assign(bctx *c) {
    dg_output v = var_fed(c, IN_UNIFORM, dg_shape2(37, 29));
    fetch(c, v);
    fetch(c, dg_identity(c->g, NULL, v));
    char name[32];
    snprintf(name, sizeof name, "var%d", c->n_vars++);
    dg_output w = dg_variable(c->g, name, c->t, dg_shape1(1), dg_init_constant(1.5));
    fetch(c, w);
}

static void build_assign_add(bctx *c) {
    dg_output v = var_fed(c, IN_UNIFORM, dg_shape2(37, 29));
    update(c, dg_assign_add(c->g, NULL, v, ph(c, dg_shape2(37, 29))));
    fetch(c, v);
}

static void build_assign_sub(bctx *c) {
    dg_output v = var_fed(c, IN_UNIFORM, dg_shape2(37, 29));
    update(c, dg_assign_sub(c->g, NULL, v, ph(c, dg_shape2(37, 29))));
    fetch(c, v);
}

static void build_apply_gd(bctx *c) {
    dg_shape shapes[] = {dg_shape2(37, 29), dg_shape_scalar(), dg_shape2(300, 1001)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_output v = var_fed(c, IN_UNIFORM, shapes[i]);
        dg_node *n = graph_begin(c->g, "ApplyGradientDescent", NULL);
        graph_add_input(n, v);
        graph_add_input(n, ph_value(c, 0.1));
        graph_add_input(n, ph(c, shapes[i]));
        n = graph_finish(n);
        assert_non_null(n);
        update(c, (dg_output){n, 0});
        fetch(c, v);
    }
}

static void build_apply_momentum(bctx *c) {
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        dg_shape s = dg_shape2(37, 29);
        dg_output v = var_fed(c, IN_UNIFORM, s), acc = var_fed(c, IN_UNIFORM, s);
        dg_node *n = graph_begin(c->g, "ApplyMomentum", NULL);
        graph_add_input(n, v);
        graph_add_input(n, acc);
        graph_add_input(n, ph_value(c, 0.1));
        graph_add_input(n, ph(c, s));
        graph_add_input(n, ph_value(c, 0.9));
        graph_set_attr_bool(n, "use_nesterov", nesterov);
        n = graph_finish(n);
        assert_non_null(n);
        update(c, (dg_output){n, 0});
        fetch(c, v);
        fetch(c, acc);
    }
}

static void build_apply_adam(bctx *c) {
    dg_shape shapes[] = {dg_shape2(37, 29), dg_shape1(1), dg_shape2(300, 1001)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dg_shape s = shapes[i];
        dg_output v = var_fed(c, IN_UNIFORM, s), m = var_fed(c, IN_UNIFORM, s);
        dg_output vv = var_fed(c, IN_POSITIVE, s);   // second moments are positive
        dg_node *n = graph_begin(c->g, "ApplyAdam", NULL);
        graph_add_input(n, v);
        graph_add_input(n, m);
        graph_add_input(n, vv);
        graph_add_input(n, ph_value(c, 0.81));     // beta1^2
        graph_add_input(n, ph_value(c, 0.998));    // beta2^2
        graph_add_input(n, ph_value(c, 0.01));
        graph_add_input(n, ph_value(c, 0.9));
        graph_add_input(n, ph_value(c, 0.999));
        graph_add_input(n, ph_value(c, 1e-8));
        graph_add_input(n, ph(c, s));
        n = graph_finish(n);
        assert_non_null(n);
        update(c, (dg_output){n, 0});
        fetch(c, v);
        fetch(c, m);
        fetch(c, vv);
    }
}

// ---- convolutional networks ----

// A window op node with the given inputs, strides and padding (and ksize for pooling).
static dg_output window_op(bctx *c, const char *type, const dg_output *ins, int n, const int64_t *ksize,
                           int64_t sh, int64_t sw, bool same) {
    dg_node *node = graph_begin(c->g, type, NULL);
    for (int i = 0; i < n; i++) graph_add_input(node, ins[i]);
    int64_t strides[4] = {1, sh, sw, 1};
    graph_set_attr_ints(node, "strides", strides, 4);
    if (ksize) graph_set_attr_ints(node, "ksize", ksize, 4);
    graph_set_attr_string(node, "padding", same ? "SAME" : "VALID");
    node = graph_finish(node);
    assert_non_null(node);
    return (dg_output){node, 0};
}

static void build_conv(bctx *c) {
    static const struct {
        int64_t x[4], f[4], sh, sw;
        bool same;
    } cfg[] = {
        {{2, 7, 7, 3}, {3, 3, 3, 4}, 1, 1, true},   {{2, 8, 6, 2}, {5, 5, 2, 3}, 2, 2, true},
        {{1, 9, 9, 4}, {3, 2, 4, 5}, 2, 3, false},  {{2, 5, 5, 4}, {1, 1, 4, 6}, 1, 1, false},
        {{20, 28, 28, 1}, {5, 5, 1, 16}, 1, 1, true}, {{3, 14, 14, 16}, {5, 5, 16, 32}, 1, 1, true},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_shape xs = dg_shape_make(4, cfg[i].x), fs = dg_shape_make(4, cfg[i].f);
        dg_output x = ph(c, xs), f = ph(c, fs);
        dg_output y = dg_conv2d(c->g, NULL, x, f, (int)cfg[i].sh, (int)cfg[i].sw,
                                cfg[i].same ? DG_PADDING_SAME : DG_PADDING_VALID);
        int64_t k = cfg[i].f[0] * cfg[i].f[1] * cfg[i].f[2];
        fetch_tol(c, y, TOL_SCALED, (double)k);
        dg_shape ys = dg_output_shape(y);
        dg_output dy = ph(c, ys);
        dg_output a[3] = {aux_i64(c, cfg[i].x, 4), f, dy};
        fetch_tol(c, window_op(c, "Conv2DBackpropInput", a, 3, NULL, cfg[i].sh, cfg[i].sw, cfg[i].same),
                  TOL_SCALED, (double)(cfg[i].f[0] * cfg[i].f[1] * cfg[i].f[3]));
        dg_output b[3] = {x, aux_i64(c, cfg[i].f, 4), dy};
        fetch_tol(c, window_op(c, "Conv2DBackpropFilter", b, 3, NULL, cfg[i].sh, cfg[i].sw, cfg[i].same),
                  TOL_SCALED, (double)(ys.dims[0] * ys.dims[1] * ys.dims[2]));
    }
}

static void build_pool(bctx *c) {
    static const struct {
        int64_t x[4], k[4], sh, sw;
        bool same;
    } cfg[] = {
        {{2, 8, 8, 3}, {1, 2, 2, 1}, 2, 2, false}, {{1, 7, 9, 2}, {1, 3, 3, 1}, 2, 2, true},
        {{2, 6, 5, 4}, {1, 3, 2, 1}, 1, 2, true},  {{20, 28, 28, 16}, {1, 2, 2, 1}, 2, 2, false},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_output x = ph(c, dg_shape_make(4, cfg[i].x));
        dg_output mp = window_op(c, "MaxPool", &x, 1, cfg[i].k, cfg[i].sh, cfg[i].sw, cfg[i].same);
        dg_output ap = window_op(c, "AvgPool", &x, 1, cfg[i].k, cfg[i].sh, cfg[i].sw, cfg[i].same);
        fetch_exact(c, mp);
        fetch(c, ap);
        dg_output dy = ph(c, dg_output_shape(mp));
        dg_output m[3] = {x, mp, dy};
        fetch_exact(c, window_op(c, "MaxPoolGrad", m, 3, cfg[i].k, cfg[i].sh, cfg[i].sw, cfg[i].same));
        dg_output a[2] = {aux_i64(c, cfg[i].x, 4), dy};
        fetch_tol(c, window_op(c, "AvgPoolGrad", a, 2, cfg[i].k, cfg[i].sh, cfg[i].sw, cfg[i].same), TOL_SCALED,
                  (double)(cfg[i].k[1] * cfg[i].k[2]));
    }
}

// Dropout draws its mask on the host from the CPU kernel's stream: the same elements drop.
static void build_dropout(bctx *c) {
    dg_status *st = dg_status_new();
    for (int training = 0; training < 2; training++) {
        dg_tensor *b = dg_tensor_new(DG_BOOL, dg_shape_scalar(), st);
        assert_ok(st);
        *(uint8_t *)dg_tensor_data(b) = (uint8_t)training;
        dg_graph_push_device(c->g, "/cpu:0");
        dg_output flag = dg_const(c->g, NULL, b);
        dg_graph_pop_device(c->g);
        dg_tensor_unref(b);
        dg_output d = dg_dropout(c->g, NULL, ph(c, dg_shape2(37, 129)), 0.3, flag, 7);
        fetch_exact(c, d);
        fetch_exact(c, (dg_output){d.node, 1});
    }
    dg_status_free(&st);
    c->fetch_runs = 2;   // the second draw must match too
}

static void build_pow(bctx *c) {
    dg_shape s = dg_shape2(37, 29);
    fetch(c, dg_pow(c->g, NULL, ph_kind(c, IN_POSITIVE, s), ph(c, s)));
    fetch(c, dg_pow(c->g, NULL, ph_kind(c, IN_POSITIVE, s), ph_value(c, 2.5)));   // broadcast exponent
}

static void build_transpose(bctx *c) {
    static const int64_t p2[] = {1, 0}, p3[] = {2, 0, 1}, p4[] = {0, 3, 1, 2};
    fetch_exact(c, dg_transpose(c->g, NULL, ph(c, dg_shape2(37, 29)), p2, 2));
    fetch_exact(c, dg_transpose(c->g, NULL, ph(c, dg_shape3(5, 6, 7)), p3, 3));
    fetch_exact(c, dg_transpose(c->g, NULL, ph(c, dg_shape_make(4, (int64_t[]){2, 8, 8, 3})), p4, 4));
}

static void build_stop_gradient(bctx *c) { fetch_exact(c, dg_stop_gradient(c->g, NULL, ph(c, dg_shape2(37, 29)))); }

static void build_tile(bctx *c) {
    static const struct {
        int rank;
        int64_t x[4], m[4];
    } cfg[] = {
        {2, {37, 29}, {1, 1}},             // nothing tiled: a copy
        {2, {5, 7}, {3, 2}},
        {3, {2, 3, 4}, {2, 1, 3}},
        {1, {7}, {5}},
        {4, {2, 1, 3, 2}, {1, 4, 1, 3}},   // a dim of 1 tiled
        {0, {0}, {0}},                     // a scalar
        {2, {3, 4}, {0, 2}},               // an empty result
        {2, {300, 1001}, {2, 1}},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        fetch_exact(c, dg_tile(c->g, NULL, ph(c, shape_n(cfg[i].rank, cfg[i].x)), cfg[i].m, cfg[i].rank));
}

// Select (dg_where) with NumPy broadcasting of all three inputs; the condition is a fed bool,
// host memory on the GPU.
static void build_select(bctx *c) {
    static const int64_t pats[][3][4] = {
        // rank, dims... of the condition | t | e
        {{2, 5, 7}, {2, 5, 7}, {2, 5, 7}},           // same shape
        {{0}, {2, 5, 7}, {2, 5, 7}},                 // scalar condition
        {{2, 5, 1}, {2, 5, 7}, {2, 5, 7}},           // one condition per row
        {{2, 5, 7}, {1, 7}, {0}},                    // t a row, e a scalar
        {{3, 4, 1, 6}, {3, 1, 5, 1}, {2, 5, 6}},     // all three broadcast
        {{2, 300, 1001}, {2, 300, 1001}, {2, 300, 1001}},
    };
    for (size_t p = 0; p < sizeof pats / sizeof pats[0]; p++) {
        dg_output cond = ph_bool(c, shape_n((int)pats[p][0][0], &pats[p][0][1]));
        dg_output t = ph(c, shape_n((int)pats[p][1][0], &pats[p][1][1]));
        dg_output e = ph(c, shape_n((int)pats[p][2][0], &pats[p][2][1]));
        fetch_exact(c, dg_where(c->g, NULL, cond, t, e));
    }
}

// OneHot with int32 and int64 indices (fed, host memory on the GPU), some outside [0, depth):
// those rows are all off_value.
static void build_one_hot(bctx *c) {
    static const struct {
        int rank;
        int64_t dims[2], depth;
    } cfg[] = {
        {1, {37}, 10}, {2, {4, 6}, 5}, {0, {0}, 7}, {1, {300}, 1001}, {1, {5}, 0},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        for (int lt = 0; lt < 2; lt++) {
            int64_t depth = cfg[i].depth;
            dg_output ix = ph_ints(c, lt ? DG_INT32 : DG_INT64, shape_n(cfg[i].rank, cfg[i].dims), -2, depth + 2);
            fetch_exact(c, dg_one_hot(c->g, NULL, ix, depth, lt ? 1.0 : 0.75, lt ? 0.0 : -0.25, c->t));
        }
}

// ---- embeddings and sparse updates ----

// Indices are fed ints, host memory on the GPU. Rows are drawn from fewer rows than there are
// indices, so indices repeat; results that add rows at a repeated index must equal the CPU's
// exactly (the GPU adds them in the CPU's order), the optimizers within the tolerance.

static void build_gather(bctx *c) {
    static const struct {
        int p_rank, i_rank;
        int64_t p[3], i[2], hi;   // params' dims, indices' dims drawn from [0, hi)
    } cfg[] = {
        {2, 1, {10, 7}, {20}, 5},
        {1, 2, {10}, {3, 4}, 10},
        {3, 0, {5, 3, 2}, {0}, 5},       // a scalar index
        {2, 1, {300, 101}, {1000}, 300},
        {2, 1, {10, 7}, {0}, 10},        // no indices
        {2, 1, {0, 4}, {0}, 1},          // no indices into no rows
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_dtype it = i % 2 ? DG_INT32 : DG_INT64;
        dg_output p = ph(c, shape_n(cfg[i].p_rank, cfg[i].p));
        dg_output ix = ph_ints(c, it, shape_n(cfg[i].i_rank, cfg[i].i), 0, cfg[i].hi);
        fetch_exact(c, dg_gather(c->g, NULL, p, ix));
    }
    static const int64_t bad[3] = {1, 12, 3}, neg[2] = {0, -1};
    dg_output p = ph(c, dg_shape2(10, 7));
    must_fail(c, dg_gather(c->g, NULL, p, ph_int_values(c, DG_INT64, dg_shape1(3), bad)),
              "indices[1] = 12 is not in [0, 10)");
    must_fail(c, dg_gather(c->g, NULL, p, ph_int_values(c, DG_INT32, dg_shape1(2), neg)),
              "indices[1] = -1 is not in [0, 10)");
}

static void build_segment_sum(bctx *c) {
    static const struct {
        int64_t rows, row, segments, hi;   // data [rows, row], ids drawn from [0, hi)
    } cfg[] = {
        {20, 7, 8, 5},       // segments 5..7 get nothing: zeros
        {1000, 33, 50, 50},  // twenty rows a segment
        {1, 1, 1, 1},
        {0, 7, 4, 1},        // no ids: zeros
        {0, 7, 0, 1},        // an empty result
        {40, 3, 9000, 8},    // few ids into many segments: grouped by sorting, not counting
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_output d = ph(c, dg_shape2(cfg[i].rows, cfg[i].row));
        dg_output ids = ph_ints(c, i % 2 ? DG_INT32 : DG_INT64, dg_shape1(cfg[i].rows), 0, cfg[i].hi);
        fetch_exact(c, dg_unsorted_segment_sum(c->g, NULL, d, ids, cfg[i].segments));
    }
    // Rank 3 data: rows of 4 x 3.
    dg_output d3 = ph(c, dg_shape3(12, 4, 3));
    fetch_exact(c, dg_unsorted_segment_sum(c->g, NULL, d3, ph_ints(c, DG_INT32, dg_shape1(12), 0, 3), 3));
    static const int64_t bad[2] = {3, 9};
    must_fail(c, dg_unsorted_segment_sum(c->g, NULL, ph(c, dg_shape2(2, 3)),
                                         ph_int_values(c, DG_INT64, dg_shape1(2), bad), 5),
              "segment_ids[1] = 9 is not in [0, 5)");
}

typedef dg_output (*scatter_fn)(dg_graph *, const char *, dg_output, dg_output, dg_output);

// A fed variable, updated by f at indices (repeating), fetched after; then one whose update
// fails on an index past the end and must be left as it was.
static void build_scatter(bctx *c, scatter_fn f) {
    static const struct {
        int v_rank, i_rank;
        int64_t v[2], i[2], hi;
    } cfg[] = {
        {2, 1, {10, 7}, {20}, 5},
        {1, 2, {10}, {3, 4}, 10},
        {2, 1, {300, 101}, {1000}, 300},
        {2, 1, {10, 7}, {0}, 10},    // no indices: nothing changes
        {2, 1, {9000, 3}, {40}, 8},  // few indices into many rows: grouped by sorting
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_shape vs = shape_n(cfg[i].v_rank, cfg[i].v), is = shape_n(cfg[i].i_rank, cfg[i].i), us = is;
        for (int k = 1; k < vs.rank; k++) us.dims[us.rank++] = vs.dims[k];
        dg_output v = var_fed(c, IN_UNIFORM, vs);
        dg_output ix = ph_ints(c, i % 2 ? DG_INT32 : DG_INT64, is, 0, cfg[i].hi);
        update(c, f(c->g, NULL, v, ix, ph(c, us)));
        fetch_exact(c, v);
    }
    static const int64_t bad[3] = {0, 2, 6};
    dg_output v = var_fed(c, IN_UNIFORM, dg_shape2(6, 3));
    must_fail(c, f(c->g, NULL, v, ph_int_values(c, DG_INT32, dg_shape1(3), bad), ph(c, dg_shape2(3, 3))),
              "indices[2] = 6 is not in [0, 6)");
    fetch_exact(c, v);
}
static void build_scatter_add(bctx *c) { build_scatter(c, dg_scatter_add); }
static void build_scatter_sub(bctx *c) { build_scatter(c, dg_scatter_sub); }
static void build_scatter_update(bctx *c) { build_scatter(c, dg_scatter_update); }

// SparseApplyAdagrad(var, accum, lr, grad, indices), or SparseApplyMomentum (then momentum 0.9
// after the indices, and use_nesterov), fetching var and accum after it ran.
static dg_output sparse_accum_update(bctx *c, const char *op, bool nesterov, dg_shape vs, dg_output ix, int64_t n) {
    bool momentum = strcmp(op, "SparseApplyMomentum") == 0;
    dg_output v = var_fed(c, IN_UNIFORM, vs), acc = var_fed(c, momentum ? IN_UNIFORM : IN_POSITIVE, vs);
    dg_shape gs = dg_shape1(n);
    for (int k = 1; k < vs.rank; k++) gs.dims[gs.rank++] = vs.dims[k];
    dg_node *u = graph_begin(c->g, op, NULL);
    graph_add_input(u, v);
    graph_add_input(u, acc);
    graph_add_input(u, ph_value(c, 0.1));
    graph_add_input(u, ph(c, gs));
    graph_add_input(u, ix);
    if (momentum) {
        graph_add_input(u, ph_value(c, 0.9));
        graph_set_attr_bool(u, "use_nesterov", nesterov);
    }
    u = graph_finish(u);
    assert_non_null(u);
    fetch(c, v);
    fetch(c, acc);
    return (dg_output){u, 0};
}

static void build_sparse_accum(bctx *c, const char *op) {
    static const struct {
        int64_t rows, row, n, hi;
    } cfg[] = {{10, 7, 20, 5}, {300, 101, 1000, 300}, {10, 1, 6, 2}, {10, 7, 0, 10}, {9000, 3, 40, 8}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_output ix = ph_ints(c, i % 2 ? DG_INT32 : DG_INT64, dg_shape1(cfg[i].n), 0, cfg[i].hi);
        update(c, sparse_accum_update(c, op, i % 2 == 0, dg_shape2(cfg[i].rows, cfg[i].row), ix, cfg[i].n));
    }
    static const int64_t bad[3] = {4, -2, 1};
    dg_output ix = ph_int_values(c, DG_INT64, dg_shape1(3), bad);
    must_fail(c, sparse_accum_update(c, op, false, dg_shape2(5, 4), ix, 3), "indices[1] = -2 is not in [0, 5)");
}
static void build_sparse_adagrad(bctx *c) { build_sparse_accum(c, "SparseApplyAdagrad"); }
static void build_sparse_momentum(bctx *c) { build_sparse_accum(c, "SparseApplyMomentum"); }

// SparseApplyAdam with TensorFlow's defaults after two steps, fetching var, m and v.
static dg_output sparse_adam(bctx *c, dg_shape vs, dg_output ix, int64_t n) {
    dg_output v = var_fed(c, IN_UNIFORM, vs), m = var_fed(c, IN_UNIFORM, vs);
    dg_output vv = var_fed(c, IN_POSITIVE, vs);   // second moments are positive
    dg_shape gs = dg_shape1(n);
    for (int k = 1; k < vs.rank; k++) gs.dims[gs.rank++] = vs.dims[k];
    dg_node *u = graph_begin(c->g, "SparseApplyAdam", NULL);
    graph_add_input(u, v);
    graph_add_input(u, m);
    graph_add_input(u, vv);
    graph_add_input(u, ph_value(c, 0.81));    // beta1^2
    graph_add_input(u, ph_value(c, 0.998));   // beta2^2
    graph_add_input(u, ph_value(c, 0.01));
    graph_add_input(u, ph_value(c, 0.9));
    graph_add_input(u, ph_value(c, 0.999));
    graph_add_input(u, ph_value(c, 1e-8));
    graph_add_input(u, ph(c, gs));
    graph_add_input(u, ix);
    u = graph_finish(u);
    assert_non_null(u);
    fetch(c, v);
    fetch(c, m);
    fetch(c, vv);
    return (dg_output){u, 0};
}

static void build_sparse_adam(bctx *c) {
    static const struct {
        int64_t rows, row, n, hi;
    } cfg[] = {{10, 7, 20, 5}, {300, 101, 1000, 300}, {10, 7, 0, 10}};   // no indices: decay and step only
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        dg_output ix = ph_ints(c, i % 2 ? DG_INT32 : DG_INT64, dg_shape1(cfg[i].n), 0, cfg[i].hi);
        update(c, sparse_adam(c, dg_shape2(cfg[i].rows, cfg[i].row), ix, cfg[i].n));
    }
    // A bad index: var, m and v not even decayed.
    static const int64_t bad[2] = {1, 7};
    dg_output ix = ph_int_values(c, DG_INT32, dg_shape1(2), bad);
    must_fail(c, sparse_adam(c, dg_shape2(7, 3), ix, 2), "indices[1] = 7 is not in [0, 7)");
}

// DynamicStitch over int32 indices (fed) and float data, as embedding_lookup_sharded merges.
static dg_output stitch(bctx *c, const dg_output *ix, const dg_output *data, int n) {
    dg_output ins[8];
    assert_true(n <= 4);
    for (int k = 0; k < n; k++) {
        ins[k] = ix[k];
        ins[n + k] = data[k];
    }
    return graph_build(c->g, "DynamicStitch", NULL, ins, 2 * n);
}

static void build_dynamic_stitch(bctx *c) {
    // A row given twice within a part (4) and across parts (2: part 1's, the later, wins).
    static const int64_t a0[4] = {0, 4, 2, 4}, a1[4] = {1, 3, 5, 2};
    dg_output ix[2] = {ph_int_values(c, DG_INT32, dg_shape1(4), a0), ph_int_values(c, DG_INT32, dg_shape2(2, 2), a1)};
    dg_output d[2] = {ph(c, dg_shape2(4, 3)), ph(c, dg_shape3(2, 2, 3))};
    fetch_exact(c, stitch(c, ix, d, 2));
    // Row 1 given by none: zeros. Rows of one element (data of the indices' shape).
    static const int64_t b0[2] = {0, 2}, b1[1] = {2};
    dg_output jx[2] = {ph_int_values(c, DG_INT32, dg_shape1(2), b0), ph_int_values(c, DG_INT32, dg_shape1(1), b1)};
    dg_output e[2] = {ph(c, dg_shape2(2, 5)), ph(c, dg_shape2(1, 5))};
    fetch_exact(c, stitch(c, jx, e, 2));
    dg_output e1[2] = {ph(c, dg_shape1(2)), ph(c, dg_shape1(1))};
    fetch_exact(c, stitch(c, jx, e1, 2));
    // An empty part, and nothing at all.
    static const int64_t none[1] = {0};
    dg_output kx[2] = {ph_int_values(c, DG_INT32, dg_shape1(0), none), ph_int_values(c, DG_INT32, dg_shape1(1), none)};
    dg_output f[2] = {ph(c, dg_shape2(0, 3)), ph(c, dg_shape2(1, 3))};
    fetch_exact(c, stitch(c, kx, f, 2));
    fetch_exact(c, stitch(c, kx, f, 1));
    // A shuffled 0..999 over three parts, rows of 64.
    int64_t perm[1000];
    for (int i = 0; i < 1000; i++) perm[i] = i;
    for (int i = 999; i > 0; i--) {
        int j = (int)floor(urand(c, 0, i + 1));
        if (j > i) j = i;
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    dg_output px[3] = {ph_int_values(c, DG_INT32, dg_shape1(300), perm),
                       ph_int_values(c, DG_INT32, dg_shape1(500), perm + 300),
                       ph_int_values(c, DG_INT32, dg_shape1(200), perm + 800)};
    dg_output pd[3] = {ph(c, dg_shape2(300, 64)), ph(c, dg_shape2(500, 64)), ph(c, dg_shape2(200, 64))};
    fetch_exact(c, stitch(c, px, pd, 3));
    // A negative index, and one that leaves rows without a value.
    static const int64_t neg[2] = {1, -3}, far[2] = {0, 9};
    dg_output nx[2] = {ph_int_values(c, DG_INT32, dg_shape1(2), neg), ph_int_values(c, DG_INT32, dg_shape1(2), far)};
    dg_output nd[2] = {ph(c, dg_shape2(2, 3)), ph(c, dg_shape2(2, 3))};
    must_fail(c, stitch(c, nx, nd, 1), "indices 0[1] = -3 is negative");
    must_fail(c, stitch(c, nx + 1, nd + 1, 1), "index 9 leaves rows without a value (2 indices in all)");
}

typedef struct gk_case {
    const char *name;
    void (*build)(bctx *c);
} gk_case;

static const gk_case cases[] = {
    {"MatMul", build_matmul},
    {"Add", build_add},
    {"Sub", build_sub},
    {"Mul", build_mul},
    {"Div", build_div},
    {"Maximum", build_maximum},
    {"Minimum", build_minimum},
    {"Relu", build_relu},
    {"Sigmoid", build_sigmoid},
    {"Tanh", build_tanh},
    {"Exp", build_exp},
    {"Log", build_log},
    {"Square", build_square},
    {"Sqrt", build_sqrt},
    {"Neg", build_neg},
    {"Identity", build_identity},
    {"ZerosLike", build_zeros_like},
    {"OnesLike", build_ones_like},
    {"Rsqrt", build_rsqrt},
    {"Erf", build_erf},
    {"Sin", build_sin},
    {"Cos", build_cos},
    {"Gelu/GeluGrad", build_gelu},
    {"LayerNorm/LayerNormGrad", build_layer_norm},
    {"BatchMatMulV2", build_batch_matmul},
    {"ScaledDotProductAttention/Grad", build_attention},
    {"ReluGrad/SigmoidGrad/TanhGrad/SqrtGrad/RsqrtGrad", build_elem_grads},
    {"BiasAdd", build_bias_add},
    {"BiasAddGrad", build_bias_add_grad},
    {"AddN", build_add_n},
    {"ClipByValue", build_clip},
    {"ClipByValueGrad", build_clip_grad},
    {"Cast", build_cast},
    {"Cast (bfloat16, float16)", build_cast16},
    {"MatMul/BatchMatMulV2 (bfloat16, float16)", build_matmul16},
    {"RandomUniform/RandomStandardNormal/TruncatedNormal", build_random},
    {"Softmax/LogSoftmax", build_softmax},
    {"SoftmaxGrad/LogSoftmaxGrad", build_softmax_grads},
    {"SoftmaxCrossEntropyWithLogits", build_xent},
    {"SparseSoftmaxCrossEntropyWithLogits", build_sparse_xent},
    {"Sum", build_sum},
    {"Mean", build_mean},
    {"Max", build_max},
    {"SumGrad", build_sum_grad},
    {"MaxGrad", build_max_grad},
    {"SumToShape", build_sum_to_shape},
    {"BroadcastTo", build_broadcast_to},
    {"Reshape/Shape", build_reshape_shape},
    {"Fill", build_fill},
    {"Const", build_const},
    {"Concat", build_concat},
    {"Split", build_split},
    {"Slice", build_slice},
    {"SliceGrad", build_slice_grad},
    {"Assign/VariableV2", build_assign},
    {"AssignAdd", build_assign_add},
    {"AssignSub", build_assign_sub},
    {"ApplyGradientDescent", build_apply_gd},
    {"ApplyMomentum", build_apply_momentum},
    {"ApplyAdam", build_apply_adam},
    {"Conv2D/Conv2DBackpropInput/Conv2DBackpropFilter", build_conv},
    {"MaxPool/AvgPool/MaxPoolGrad/AvgPoolGrad", build_pool},
    {"Dropout", build_dropout},
    {"Pow", build_pow},
    {"Transpose", build_transpose},
    {"StopGradient", build_stop_gradient},
    {"Tile", build_tile},
    {"Select", build_select},
    {"OneHot", build_one_hot},
    {"Gather", build_gather},
    {"UnsortedSegmentSum", build_segment_sum},
    {"ScatterAdd", build_scatter_add},
    {"ScatterSub", build_scatter_sub},
    {"ScatterUpdate", build_scatter_update},
    {"SparseApplyAdagrad", build_sparse_adagrad},
    {"SparseApplyMomentum", build_sparse_momentum},
    {"SparseApplyAdam", build_sparse_adam},
    {"DynamicStitch", build_dynamic_stitch},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

// ---- running a case on one device ----

typedef struct run_result {
    dg_graph *g;
    bctx c;
    dg_tensor *out[2][MAX_FETCHES];   // per fetch run
    char *errors[MAX_STAGE];          // the messages of c.failing's runs
} run_result;

static void run_result_free(run_result *r) {
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < r->c.n_fetches; i++) dg_tensor_unref(r->out[k][i]);
    for (int i = 0; i < r->c.n_failing; i++) free(r->errors[i]);
    for (int i = 0; i < r->c.n_feeds; i++) dg_tensor_unref(r->c.vals[i]);
    dg_graph_free(&r->g);
}

// Builds case k for dtype t under device and runs it: global initializer, fed assigns,
// updates, then the fetches (fetch_runs times).
static void run_case(const gk_case *k, int case_index, dg_dtype t, const char *device, bool soft,
                     run_result *r) {
    memset(r, 0, sizeof *r);
    r->g = dg_graph_new();
    dg_graph_set_random_seed(r->g, 7);
    bctx *c = &r->c;
    c->g = r->g;
    c->t = t;
    c->rng = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)case_index * 1000003u + (uint64_t)t);
    c->fetch_runs = 1;
    dg_graph_push_device(r->g, device);
    k->build(c);
    dg_graph_pop_device(r->g);
    dg_status *st = dg_status_new();
    if (!dg_graph_check(r->g, st)) fail_msg("%s (%s) on %s: building: %s", k->name, dg_dtype_name(t), device,
                                            dg_status_message(st));
    dg_session_options o = dg_session_options_default();
    o.allow_soft_placement = soft;
    o.inter_op_threads = 1;
    dg_session *s = dg_session_new(r->g, "local", &o, st);
    assert_ok(st);
    bool ok = true;
    const char *stage = "initializing";
    if (dg_graph_collection_size(r->g, DG_GLOBAL_VARIABLES) > 0) {
        dg_node *init = dg_global_variables_initializer(r->g);
        ok = dg_session_run_target(s, init, st);
    }
    if (ok && c->n_inits) {
        stage = "assigning fed values";
        ok = dg_session_run(s, c->feeds, c->vals, c->n_feeds, NULL, NULL, 0, c->inits, c->n_inits, st);
    }
    if (ok && c->n_updates) {
        stage = "updating";
        ok = dg_session_run(s, c->feeds, c->vals, c->n_feeds, NULL, NULL, 0, c->updates, c->n_updates, st);
    }
    for (int i = 0; ok && i < c->n_failing; i++) {
        dg_status *fst = dg_status_new();
        if (dg_session_run(s, c->feeds, c->vals, c->n_feeds, NULL, NULL, 0, &c->failing[i], 1, fst))
            fail_msg("%s (%s) on %s: node \"%s\" (%s) ran; it must fail with \"%s\"", k->name,
                     dg_dtype_name(t), device, dg_node_name(c->failing[i]), dg_node_op_type(c->failing[i]),
                     c->fail_want[i]);
        if (!strstr(dg_status_message(fst), c->fail_want[i]))
            fail_msg("%s (%s) on %s: node \"%s\" failed with %s: %s; want \"%s\"", k->name, dg_dtype_name(t),
                     device, dg_node_name(c->failing[i]), dg_code_name(dg_status_code(fst)),
                     dg_status_message(fst), c->fail_want[i]);
        r->errors[i] = strdup(dg_status_message(fst));
        assert_non_null(r->errors[i]);
        dg_status_free(&fst);
    }
    for (int run = 0; ok && run < c->fetch_runs && run < 2; run++) {
        stage = "fetching";
        ok = dg_session_run(s, c->feeds, c->vals, c->n_feeds, c->fetches, r->out[run], c->n_fetches, NULL, 0, st);
    }
    if (!ok)
        fail_msg("%s (%s) on %s, soft placement %s: %s: %s: %s", k->name, dg_dtype_name(t), device,
                 soft ? "on" : "off", stage, dg_code_name(dg_status_code(st)), dg_status_message(st));
    dg_session_free(&s);
    dg_status_free(&st);
}

// Every node that was placed and asked for want_type's device must be on device 0 of it.
// Records the op types that ran on the GPU.
static void check_placement(const gk_case *k, dg_dtype t, dg_graph *g, const char *want) {
    int n_checked = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        const char *req = dg_node_requested_device(n), *got = dg_node_assigned_device(n);
        if (!got || !*got || !strstr(req, "GPU")) continue;   // pruned (fed), or pinned to CPU
        n_checked++;
        if (!strstr(got, want))
            fail_msg("%s (%s): node \"%s\" (%s) asked for %s, ran on %s, want %s", k->name,
                     dg_dtype_name(t), dg_node_name(n), dg_node_op_type(n), req, got, want);
        if (strstr(got, "GPU"))
            for (int j = 0; j < N_GPU_OPS; j++)
                if (strcmp(gpu_ops[j], dg_node_op_type(n)) == 0) gpu_op_seen[j] = true;
    }
    if (n_checked == 0) fail_msg("%s (%s): no node asking for a GPU was placed", k->name, dg_dtype_name(t));
}

static void compare(const gk_case *k, dg_dtype t, const bctx *c, int run, dg_tensor *const *got,
                    dg_tensor *const *want) {
    char a[128], b[128], name[300];
    for (int f = 0; f < c->n_fetches; f++) {
        dg_output_str(c->fetches[f], name, sizeof name);
        const dg_tensor *x = got[f], *y = want[f];
        assert_non_null(x);
        assert_non_null(y);
        if (dg_tensor_dtype(x) != dg_tensor_dtype(y) || !dg_shape_equal(dg_tensor_shape(x), dg_tensor_shape(y)))
            fail_msg("%s (%s) fetch %d \"%s\": got %s%s, want %s%s", k->name, dg_dtype_name(t), f, name,
                     dg_dtype_name(dg_tensor_dtype(x)), dg_shape_str(dg_tensor_shape(x), a, sizeof a),
                     dg_dtype_name(dg_tensor_dtype(y)), dg_shape_str(dg_tensor_shape(y), b, sizeof b));
        dg_dtype yt = dg_tensor_dtype(y);
        double rel = yt == DG_FLOAT64 ? 1e-12 : 1e-5;
        // A 16-bit value: one unit in the last place of the CPU's, over what float32 allows.
        double half_ulp = yt == DG_BFLOAT16 ? 0x1p-7 : yt == DG_FLOAT16 ? 0x1p-10 : 0;
        for (int64_t i = 0; i < dg_tensor_num_elements(y); i++) {
            double u = dg_tensor_get_as_double(x, i), v = dg_tensor_get_as_double(y, i);
            bool ok;
            if (half_ulp > 0 && c->tol[f] == TOL_EXACT)   // 16-bit casts: the bits (NaN payloads, -0)
                ok = ((const uint16_t *)dg_tensor_data(x))[i] == ((const uint16_t *)dg_tensor_data(y))[i];
            else if (isnan(u) || isnan(v)) ok = false;   // poison (unwritten) or a broken reference
            else if (c->tol[f] == TOL_EXACT || (!dg_dtype_is_float(yt) && half_ulp == 0)) ok = u == v;
            else {
                // rel of max(1, |v|), or of the case's scale when that is larger
                double scale = c->tol[f] == TOL_SCALED && c->scale[f] > 1 ? c->scale[f] : 1;
                ok = half_ulp > 0 ? fabs(u - v) <= half_ulp * fabs(v) + rel * scale : dg_test_is_close(u, v, rel * scale, rel);
            }
            if (!ok && half_ulp > 0)
                fail_msg("%s (%s) fetch %d \"%s\" %s%s run %d: element %lld is %.17g (bits %04x), CPU gives %.17g "
                         "(bits %04x)", k->name, dg_dtype_name(t), f, name, dg_dtype_name(yt),
                         dg_shape_str(dg_tensor_shape(y), a, sizeof a), run, (long long)i, u,
                         ((const uint16_t *)dg_tensor_data(x))[i], v, ((const uint16_t *)dg_tensor_data(y))[i]);
            if (!ok)
                fail_msg("%s (%s) fetch %d \"%s\" %s%s run %d: element %lld is %.17g, CPU gives %.17g",
                         k->name, dg_dtype_name(t), f, name, dg_dtype_name(dg_tensor_dtype(y)),
                         dg_shape_str(dg_tensor_shape(y), a, sizeof a), run, (long long)i, u, v);
        }
    }
}

// The failing runs gave the same messages on both devices, but for the device's name.
static void compare_errors(const gk_case *k, dg_dtype t, const run_result *dev, const run_result *cpu) {
    static const char gpu_name[] = "/device:GPU:0", cpu_name[] = "/device:CPU:0";
    for (int i = 0; i < dev->c.n_failing; i++) {
        char got[1024];
        snprintf(got, sizeof got, "%s", dev->errors[i]);
        for (char *p = strstr(got, gpu_name); p; p = strstr(p, gpu_name)) memcpy(p, cpu_name, strlen(cpu_name));
        if (strcmp(got, cpu->errors[i]) != 0)
            fail_msg("%s (%s): node \"%s\" failed with\n  %s\nthe CPU's message is\n  %s", k->name, dg_dtype_name(t),
                     dg_node_name(dev->c.failing[i]), dev->errors[i], cpu->errors[i]);
    }
}

// Runs case *state on device (soft placement as given) and on /cpu:0, and compares. want:
// the device the GPU-requesting nodes must end up on.
static void run_and_compare(const gk_case *k, const char *device, bool soft, const char *want) {
    int idx = (int)(k - cases);
    for (int ti = 0; ti < 2; ti++) {
        dg_dtype t = ti ? DG_FLOAT64 : DG_FLOAT32;
        run_result dev, cpu;
        run_case(k, idx, t, device, soft, &dev);
        check_placement(k, t, dev.g, want);
        run_case(k, idx, t, "/cpu:0", false, &cpu);
        compare_errors(k, t, &dev, &cpu);
        for (int run = 0; run < dev.c.fetch_runs && run < 2; run++)
            compare(k, t, &dev.c, run, dev.out[run], cpu.out[run]);
        run_result_free(&dev);
        run_result_free(&cpu);
    }
}

// ---- part A: no GPU (also meaningful with one) ----

// Part A: without a GPU, each case requested on /gpu:0 runs on CPU:0 under soft placement.
static void test_case_soft(void **state) {
    run_and_compare(*state, "/gpu:0", true, "/device:CPU:0");
}

// A MatMul asking for /gpu:0 under the default options: right numbers, on GPU:0 when there is
// one, else on CPU:0.
static void test_soft_placement_matmul(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    float av[4] = {1, 2, 3, 4}, bv[4] = {5, 6, 7, 8};
    dg_tensor *at = dg_tensor_from_data(DG_FLOAT32, dg_shape2(2, 2), av, st);
    dg_tensor *bt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(2, 2), bv, st);
    assert_ok(st);
    dg_graph_push_device(g, "/gpu:0");
    dg_output a = dg_const(g, "a", at), b = dg_const(g, "b", bt);
    dg_output mm = dg_matmul(g, "mm", a, b, false, false);
    dg_output r = dg_relu(g, "r", dg_sub(g, "s", mm, dg_scalar(g, "c", DG_FLOAT32, 20.0)));
    dg_graph_pop_device(g);
    assert_true(dg_graph_ok(g));
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    dg_tensor *out = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &r, &out, 1, NULL, 0, st));
    assert_ok(st);
    const float want[4] = {0, 2, 23, 30};
    for (int i = 0; i < 4; i++) assert_true(dg_tensor_f32(out)[i] == want[i]);
    const char *dev =
        exec_device_count(DG_DEVICE_TYPE_GPU) > 0 ? "/device:GPU:0" : "/device:CPU:0";
    assert_non_null(strstr(dg_node_assigned_device(mm.node), dev));
    assert_non_null(strstr(dg_node_assigned_device(r.node), dev));
    dg_tensor_unref(out);
    dg_session_free(&s);
    // A kernel's error names the device its node ran on (not the CPU that drives the step).
    dg_graph *g2 = dg_graph_new();
    dg_graph_push_device(g2, "/gpu:0");
    dg_output p = dg_placeholder(g2, "p", DG_FLOAT32, dg_shape2(-1, -1));
    dg_output bad = dg_matmul(g2, "mm_bad", p, p, false, false);
    dg_graph_pop_device(g2);
    s = dg_session_new(g2, "local", NULL, st);
    assert_ok(st);
    dg_tensor *pv = dg_tensor_new(DG_FLOAT32, dg_shape2(2, 3), st);
    memset(dg_tensor_data(pv), 0, 6 * sizeof(float));
    assert_false(dg_session_run(s, &p, &pv, 1, &bad, &out, 1, NULL, 0, st));
    assert_true(dg_status_code(st) != DG_OK);
    const char *msg = dg_status_message(st);
    if (!strstr(msg, "mm_bad") || !strstr(msg, dev)) fail_msg("expected the node and %s: %s", dev, msg);
    dg_status_reset(st);
    dg_tensor_unref(pv);
    dg_session_free(&s);
    dg_graph_free(&g2);
    dg_graph_free(&g);
    dg_tensor_unref(at);
    dg_tensor_unref(bt);
    dg_status_free(&st);
}

// With soft placement off, a node asking for a GPU this process lacks (GPU:0 without a GPU,
// one past the last with GPUs) is an error naming the node, its op and the device.
static void test_hard_placement_fails(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output a = dg_scalar(g, "a", DG_FLOAT32, 2.0);   // on CPU: the only GPU request is "mm"
    dg_output x = dg_reshape(g, "x", a, (const int64_t[]){1, 1}, 2);
    char dev[32], want[32];
    int n_gpus = exec_device_count(DG_DEVICE_TYPE_GPU);
    snprintf(dev, sizeof dev, "/gpu:%d", n_gpus);
    snprintf(want, sizeof want, "GPU:%d", n_gpus);
    dg_graph_push_device(g, dev);
    dg_output mm = dg_matmul(g, "mm", x, x, false, false);
    dg_graph_pop_device(g);
    assert_true(dg_graph_ok(g));
    dg_session_options o = dg_session_options_default();
    o.allow_soft_placement = false;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    dg_tensor *out = NULL;
    assert_false(dg_session_run(s, NULL, NULL, 0, &mm, &out, 1, NULL, 0, st));
    assert_null(out);
    assert_status(st, DG_INVALID_ARGUMENT, "cannot place node \"mm\" (MatMul)");
    assert_status(st, DG_INVALID_ARGUMENT, want);
    assert_status(st, DG_INVALID_ARGUMENT, "soft placement is off");
    assert_status(st, DG_INVALID_ARGUMENT, "Devices: ");   // GPUs (if any) are listed first
    assert_status(st, DG_INVALID_ARGUMENT, "/job:localhost/replica:0/task:0/device:CPU:0");
    // The same graph with soft placement on runs on a device that exists.
    dg_session_free(&s);
    dg_status_reset(st);
    s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    assert_true(dg_session_run(s, NULL, NULL, 0, &mm, &out, 1, NULL, 0, st));
    assert_ok(st);
    assert_true(dg_tensor_f32(out)[0] == 4.0f);
    dg_tensor_unref(out);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// ---- part B: with a GPU ----

#ifdef DG_WITH_CUDA

static void test_case_gpu(void **state) {
    run_and_compare(*state, "/gpu:0", false, "/device:GPU:0");
}

// Every listed op has a GPU kernel (for some dtype).
static void test_kernel_table(void **state) {
    (void)state;
    for (int i = 0; i < N_GPU_OPS; i++)
        if (!exec_kernel_find(gpu_ops[i], "GPU", DG_INVALID_DTYPE)) fail_msg("no GPU kernel for %s", gpu_ops[i]);
    assert_non_null(exec_kernel_find("MatMul", "GPU", DG_FLOAT32));
    assert_non_null(exec_kernel_find("MatMul", "GPU", DG_FLOAT64));
}

// Runs after the cases: each listed op ran on GPU:0 in at least one of them.
static void test_every_op_ran_on_gpu(void **state) {
    (void)state;
    for (int i = 0; i < N_GPU_OPS; i++)
        if (!gpu_op_seen[i]) fail_msg("no case ran %s on GPU:0 (add a row to the case table)", gpu_ops[i]);
}

// An MLP training step (MatMul, BiasAdd, Relu, sparse softmax cross entropy, gradients, Adam)
// on GPU:0: after the second step, the device allocator's cache serves everything.
static void test_steady_state_no_malloc(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    const int64_t batch = 64, in = 784, hidden = 100, classes = 10;
    dg_graph_push_device(g, "/gpu:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, in));
    dg_output y = dg_placeholder(g, "y", DG_INT64, dg_shape1(-1));
    dg_output w1 = dg_variable(g, "w1", DG_FLOAT32, dg_shape2(in, hidden), dg_init_truncated_normal(0, 0.03, 1));
    dg_output b1 = dg_variable(g, "b1", DG_FLOAT32, dg_shape1(hidden), dg_init_zeros());
    dg_output w2 = dg_variable(g, "w2", DG_FLOAT32, dg_shape2(hidden, classes), dg_init_truncated_normal(0, 0.1, 2));
    dg_output b2 = dg_variable(g, "b2", DG_FLOAT32, dg_shape1(classes), dg_init_zeros());
    dg_output h = dg_relu(g, "h", dg_bias_add(g, NULL, dg_matmul(g, "mm1", x, w1, false, false), b1));
    dg_output logits = dg_bias_add(g, NULL, dg_matmul(g, "mm2", h, w2, false, false), b2);
    dg_output loss = dg_sparse_softmax_cross_entropy(g, "loss", logits, y);
    dg_optimizer opt = dg_adam(g, 0.01);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    dg_node *init = dg_global_variables_initializer(g);
    dg_graph_pop_device(g);
    assert_true(dg_graph_check(g, st));

    dg_tensor *xt = dg_tensor_new(DG_FLOAT32, dg_shape2(batch, in), st);
    dg_tensor *yt = dg_tensor_new(DG_INT64, dg_shape1(batch), st);
    assert_ok(st);
    uint64_t rng = 99;
    for (int64_t i = 0; i < batch * in; i++) dg_tensor_f32(xt)[i] = (float)dg_test_uniform(&rng, 0, 1);
    for (int64_t i = 0; i < batch; i++) dg_tensor_i64(yt)[i] = i % classes;
    dg_session *s = dg_session_new(g, "local", NULL, st);   // soft: int64 bookkeeping may stay on CPU
    assert_ok(st);
    assert_true(dg_session_run_target(s, init, st));
    assert_ok(st);
    exec_cuda_device *dev = gpu_device(0, st);
    assert_ok(st);
    assert_non_null(dev);
    dg_output feeds[2] = {x, y};
    dg_tensor *vals[2] = {xt, yt};
    exec_cuda_mem_stats after2 = {0}, after20 = {0};
    float first = 0, last = 0;
    for (int step = 1; step <= 20; step++) {
        dg_tensor *l = NULL;
        assert_true(dg_session_run(s, feeds, vals, 2, &loss, &l, 1, &train, 1, st));
        assert_ok(st);
        if (step == 1) first = dg_tensor_f32(l)[0];
        last = dg_tensor_f32(l)[0];
        dg_tensor_unref(l);
        if (step == 2) exec_cuda_mem_stats_get(dev, &after2);
        if (step == 20) exec_cuda_mem_stats_get(dev, &after20);
    }
    print_message("GPU:0 memory: %lld cudaMalloc after step 2, %lld after step 20; %lld allocations, "
                  "%lld bytes in use, %lld cached\n",
                  (long long)after2.device_mallocs, (long long)after20.device_mallocs,
                  (long long)after20.allocs, (long long)after20.bytes_in_use, (long long)after20.bytes_cached);
    assert_true(after2.device_mallocs > 0);
    assert_int_equal(after20.device_mallocs, after2.device_mallocs);
    assert_true(isfinite(last) && last < first);   // it trains
    // The heavy ops really ran on the GPU.
    const char *gpu_nodes[] = {"mm1", "mm2", "h"};
    for (size_t i = 0; i < sizeof gpu_nodes / sizeof gpu_nodes[0]; i++)
        assert_non_null(strstr(dg_node_assigned_device(dg_graph_find(g, gpu_nodes[i])), "/device:GPU:0"));
    int n_adam = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        if (strcmp(dg_node_op_type(n), "ApplyAdam") != 0) continue;
        n_adam++;
        if (!strstr(dg_node_assigned_device(n), "/device:GPU:0"))
            fail_msg("%s ran on %s", dg_node_name(n), dg_node_assigned_device(n));
    }
    assert_int_equal(n_adam, 4);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

#endif

// One cmocka test per case, named after it.
static struct CMUnitTest *case_tests(void (*fn)(void **), const char *prefix, char names[][128]) {
    struct CMUnitTest *t = calloc(N_CASES, sizeof *t);
    if (!t) abort();
    for (int i = 0; i < N_CASES; i++) {
        snprintf(names[i], 128, "%s %s", prefix, cases[i].name);
        t[i].name = names[i];
        t[i].test_func = fn;
        t[i].initial_state = (void *)&cases[i];
    }
    return t;
}

int main(void) {
    // Before the first session: GPU outputs start as NaN, so unwritten elements fail.
    setenv("DG_GPU_POISON", "1", 1);
    static char names[N_CASES][128];
    const struct CMUnitTest common[] = {
        cmocka_unit_test(test_soft_placement_matmul),
        cmocka_unit_test(test_hard_placement_fails),
    };
    int failed = cmocka_run_group_tests_name("placement", common, NULL, NULL);
    if (exec_device_count(DG_DEVICE_TYPE_GPU) == 0) {
        struct CMUnitTest *soft = case_tests(test_case_soft, "soft /gpu:0 -> CPU:", names);
        failed += _cmocka_run_group_tests("soft_placement_cases", soft, N_CASES, NULL, NULL);
        free(soft);
        if (failed) return 1;
#ifdef DG_WITH_CUDA
        printf("no CUDA device: %s\n", exec_cuda_unavailable_reason());
#else
        printf("no CUDA device: built without CUDA (DG_WITH_CUDA is off or no toolkit was found)\n");
#endif
        return 77;
    }
#ifdef DG_WITH_CUDA
    const struct CMUnitTest table[] = {
        cmocka_unit_test(test_kernel_table),
    };
    failed += cmocka_run_group_tests_name("kernel_table", table, NULL, NULL);
    struct CMUnitTest *gpu = case_tests(test_case_gpu, "GPU:0 vs CPU:", names);
    failed += _cmocka_run_group_tests("gpu_cases", gpu, N_CASES, NULL, NULL);
    free(gpu);
    const struct CMUnitTest after[] = {
        cmocka_unit_test(test_every_op_ran_on_gpu),
        cmocka_unit_test(test_steady_state_no_malloc),
    };
    failed += cmocka_run_group_tests_name("gpu", after, NULL, NULL);
    // Every session is gone: no device or pinned block may still be handed out, and giving
    // the caches back leaves a leak checker (compute-sanitizer --leak-check full) only leaks.
    int64_t left = exec_cuda_release_all();
    if (left != 0) {
        printf("GPU memory: %lld bytes still handed out after every session was freed\n",
               (long long)left);
        failed++;
    }
#endif
    return failed ? 1 : 0;
}
