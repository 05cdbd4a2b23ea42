/* Op builders: the public functions of distgraph/ops.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"

static const dg_output NULL_OUT = {NULL, 0};

static dg_output out0(dg_node *n) {
    dg_output o = {n, 0};
    return n ? o : NULL_OUT;
}

static dg_graph *graph_of(dg_output a) { return a.node ? a.node->graph : NULL; }

static dg_output null_input(dg_graph *g, const char *op) {
    if (g) dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s: an input is the null output", op);
    return NULL_OUT;
}

dg_output graph_build(dg_graph *g, const char *type, const char *name, const dg_output *ins,
                      int n_ins) {
    dg_node *n = graph_begin(g, type, name);
    for (int i = 0; i < n_ins && n; i++) graph_add_input(n, ins[i]);
    return out0(graph_finish(n));
}

static dg_output unary(dg_graph *g, const char *type, const char *name, dg_output x) {
    if (!x.node) return null_input(g, type);
    return graph_build(g, type, name, &x, 1);
}

static dg_output binary(dg_graph *g, const char *type, const char *name, dg_output a, dg_output b) {
    if (!a.node || !b.node) return null_input(g ? g : graph_of(a.node ? a : b), type);
    dg_output ins[2] = {a, b};
    return graph_build(g, type, name, ins, 2);
}

// ---- sources ----
dg_output dg_const(dg_graph *g, const char *name, dg_tensor *value) {
    if (!value) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "Const \"%s\": value is NULL", name ? name : "Const");
        return NULL_OUT;
    }
    dg_node *n = graph_begin(g, "Const", name);
    graph_set_attr_tensor(n, "value", value);
    graph_set_attr_type(n, "dtype", value->dtype);
    return out0(graph_finish(n));
}

dg_output dg_scalar(dg_graph *g, const char *name, dg_dtype dtype, double v) {
    dg_tensor *t = dg_tensor_new(dtype, dg_shape_scalar(), NULL);
    if (!t) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "scalar \"%s\": invalid dtype %d",
                           name ? name : "Const", (int)dtype);
        return NULL_OUT;
    }
    switch (dtype) {
    case DG_FLOAT32: *(float *)t->data = (float)v; break;
    case DG_FLOAT64: *(double *)t->data = v; break;
    case DG_INT32: *(int32_t *)t->data = (int32_t)v; break;
    case DG_INT64: *(int64_t *)t->data = (int64_t)v; break;
    case DG_UINT8:
    case DG_BOOL: *(uint8_t *)t->data = (uint8_t)v; break;
    default: break;
    }
    dg_output o = dg_const(g, name, t);
    dg_tensor_unref(t);
    return o;
}

dg_output dg_const_i64s(dg_graph *g, const char *name, const int64_t *v, int n) {
    dg_tensor *t = dg_tensor_from_data(DG_INT64, dg_shape1(n), v, NULL);
    if (!t) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "const \"%s\": bad length %d", name ? name : "Const", n);
        return NULL_OUT;
    }
    dg_output o = dg_const(g, name, t);
    dg_tensor_unref(t);
    return o;
}

dg_output dg_placeholder(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape) {
    dg_node *n = graph_begin(g, "Placeholder", name);
    graph_set_attr_type(n, "dtype", dtype);
    graph_set_attr_shape(n, "shape", shape);
    return out0(graph_finish(n));
}

// ---- random ----
void graph_set_random_seeds(dg_graph *g, dg_node *n, int64_t seed) {
    bool has;
    int64_t gs = graph_random_seed(g, &has);
    if (!has) gs = 87654321;   // TensorFlow's default graph seed
    int64_t s2 = seed ? seed : dg_graph_num_nodes(g) + 1;
    graph_set_attr_int(n, "seed", gs);
    graph_set_attr_int(n, "seed2", s2);
}

static dg_output random_op(dg_graph *g, const char *type, const char *name, dg_dtype dtype,
                           dg_shape shape, double a, double b, int64_t seed) {
    dg_node *n = graph_begin(g, type, name);
    if (!n) return NULL_OUT;
    graph_set_attr_type(n, "dtype", dtype);
    graph_set_attr_shape(n, "shape", shape);
    graph_set_attr_float(n, "a", a);
    graph_set_attr_float(n, "b", b);
    graph_set_random_seeds(g, n, seed);
    return out0(graph_finish(n));
}

dg_output dg_random_uniform(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                            double lo, double hi, int64_t seed) {
    return random_op(g, "RandomUniform", name, dtype, shape, lo, hi, seed);
}
dg_output dg_random_normal(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                           double mean, double stddev, int64_t seed) {
    return random_op(g, "RandomStandardNormal", name, dtype, shape, mean, stddev, seed);
}
dg_output dg_truncated_normal(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                              double mean, double stddev, int64_t seed) {
    return random_op(g, "TruncatedNormal", name, dtype, shape, mean, stddev, seed);
}

// ---- variables ----
static dg_initializer init_of(dg_init_kind k, double a, double b, int64_t seed) {
    dg_initializer i;
    memset(&i, 0, sizeof i);
    i.kind = k;
    i.a = a;
    i.b = b;
    i.seed = seed;
    return i;
}
dg_initializer dg_init_zeros(void) { return init_of(DG_INIT_ZEROS, 0, 0, 0); }
dg_initializer dg_init_ones(void) { return init_of(DG_INIT_ONES, 1, 0, 0); }
dg_initializer dg_init_constant(double v) { return init_of(DG_INIT_CONSTANT, v, 0, 0); }
dg_initializer dg_init_random_uniform(double lo, double hi, int64_t seed) {
    return init_of(DG_INIT_RANDOM_UNIFORM, lo, hi, seed);
}
dg_initializer dg_init_random_normal(double mean, double stddev, int64_t seed) {
    return init_of(DG_INIT_RANDOM_NORMAL, mean, stddev, seed);
}
dg_initializer dg_init_truncated_normal(double mean, double stddev, int64_t seed) {
    return init_of(DG_INIT_TRUNCATED_NORMAL, mean, stddev, seed);
}
dg_initializer dg_init_glorot_uniform(int64_t seed) { return init_of(DG_INIT_GLOROT_UNIFORM, 0, 0, seed); }
dg_initializer dg_init_glorot_normal(int64_t seed) { return init_of(DG_INIT_GLOROT_NORMAL, 0, 0, seed); }
dg_initializer dg_init_he_uniform(int64_t seed) { return init_of(DG_INIT_HE_UNIFORM, 0, 0, seed); }
dg_initializer dg_init_he_normal(int64_t seed) { return init_of(DG_INIT_HE_NORMAL, 0, 0, seed); }

// The fans of a variable of this shape, as TensorFlow's _compute_fans.
void graph_compute_fans(dg_shape s, double *fan_in, double *fan_out) {
    if (s.rank < 1) {
        *fan_in = *fan_out = 1;
    } else if (s.rank == 1) {
        *fan_in = *fan_out = (double)s.dims[0];
    } else {
        double receptive = 1;
        for (int i = 0; i < s.rank - 2; i++) receptive *= (double)s.dims[i];
        *fan_in = (double)s.dims[s.rank - 2] * receptive;
        *fan_out = (double)s.dims[s.rank - 1] * receptive;
    }
}

dg_initializer dg_init_tensor(dg_tensor *value) {
    dg_initializer i = init_of(DG_INIT_TENSOR, 0, 0, 0);
    i.value = value;
    return i;
}

// The initial value as a node, built under the "<var>/Initializer" scope.
static dg_output initial_value(dg_graph *g, dg_dtype dtype, dg_shape shape, dg_initializer init) {
    switch (init.kind) {
    case DG_INIT_ZEROS:
    case DG_INIT_ONES:
    case DG_INIT_CONSTANT: {
        double v = init.kind == DG_INIT_ZEROS ? 0 : init.kind == DG_INIT_ONES ? 1 : init.a;
        // A big variable starts from Fill (TensorFlow's zeros() does the same): a Const of its
        // full size would travel in every graph that initializes it (a 64 MB table: 64 MB).
        if (dg_shape_is_fully_defined(&shape) && dg_shape_num_elements(&shape) > 1024 &&
            (dg_dtype_is_float(dtype) || dtype == DG_INT32 || dtype == DG_INT64))
            return dg_fill(g, "Const", dg_const_i64s(g, NULL, shape.dims, shape.rank), dg_scalar(g, NULL, dtype, v));
        dg_tensor *t = dg_tensor_new(dtype, shape, NULL);
        if (!t) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "initializer: cannot make a %s tensor",
                               dg_dtype_name(dtype));
            return NULL_OUT;
        }
        for (int64_t i = 0; i < t->n_elements; i++) {
            switch (dtype) {
            case DG_FLOAT32: ((float *)t->data)[i] = (float)v; break;
            case DG_FLOAT64: ((double *)t->data)[i] = v; break;
            case DG_INT32: ((int32_t *)t->data)[i] = (int32_t)v; break;
            case DG_INT64: ((int64_t *)t->data)[i] = (int64_t)v; break;
            case DG_BFLOAT16: ((uint16_t *)t->data)[i] = dg_float_to_bfloat16((float)v); break;
            case DG_FLOAT16: ((uint16_t *)t->data)[i] = dg_float_to_float16((float)v); break;
            default: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
            }
        }
        dg_output o = dg_const(g, "Const", t);
        dg_tensor_unref(t);
        return o;
    }
    case DG_INIT_RANDOM_UNIFORM:
        return dg_random_uniform(g, NULL, dtype, shape, init.a, init.b, init.seed);
    case DG_INIT_RANDOM_NORMAL:
        return dg_random_normal(g, NULL, dtype, shape, init.a, init.b, init.seed);
    case DG_INIT_TRUNCATED_NORMAL:
        return dg_truncated_normal(g, NULL, dtype, shape, init.a, init.b, init.seed);
    case DG_INIT_TENSOR:
        return dg_const(g, "Const", init.value);
    case DG_INIT_GLOROT_UNIFORM:
    case DG_INIT_GLOROT_NORMAL:
    case DG_INIT_HE_UNIFORM:
    case DG_INIT_HE_NORMAL: {
        double fan_in, fan_out;
        graph_compute_fans(shape, &fan_in, &fan_out);
        bool he = init.kind == DG_INIT_HE_UNIFORM || init.kind == DG_INIT_HE_NORMAL;
        double scale = he ? 2.0 : 1.0, n = he ? fan_in : (fan_in + fan_out) / 2;
        if (n < 1) n = 1;
        if (init.kind == DG_INIT_GLOROT_UNIFORM || init.kind == DG_INIT_HE_UNIFORM) {
            double limit = sqrt(3.0 * scale / n);
            return dg_random_uniform(g, NULL, dtype, shape, -limit, limit, init.seed);
        }
        // A normal truncated at 2 standard deviations has 0.8796... of the untruncated one's.
        return dg_truncated_normal(g, NULL, dtype, shape, 0, sqrt(scale / n) / 0.87962566103423978, init.seed);
    }
    }
    dg_graph_set_error(g, DG_INVALID_ARGUMENT, "unknown initializer kind %d", (int)init.kind);
    return NULL_OUT;
}

static dg_output make_variable(dg_graph *g, const char *full_name, bool absolute, dg_dtype dtype,
                               dg_shape shape, dg_initializer init, bool trainable) {
    dg_node *n = absolute ? graph_begin_absolute(g, "VariableV2", full_name)
                          : graph_begin(g, "VariableV2", full_name);
    if (!n) return NULL_OUT;
    graph_set_attr_type(n, "dtype", dtype);
    graph_set_attr_shape(n, "shape", shape);
    n = graph_finish(n);
    if (!n) return NULL_OUT;
    dg_output v = {n, 0};
    // Initializer ops: colocated with the variable, named under it.
    dg_graph_push_colocate_with(g, n);
    char *scope = NULL;
    if (asprintf(&scope, "%s/Initializer", n->name) < 0) abort();
    dg_node *assign = NULL;
    graph_push_absolute_scope(g, scope);
    dg_output iv = initial_value(g, dtype, shape, init);
    dg_graph_pop_name_scope(g);
    char *aname = NULL;
    if (asprintf(&aname, "%s/Assign", n->name) < 0) abort();
    if (iv.node) {
        assign = graph_begin_absolute(g, "Assign", aname);
        graph_add_input(assign, v);
        graph_add_input(assign, iv);
        assign = graph_finish(assign);
    }
    free(aname);
    free(scope);
    dg_graph_pop_colocate_with(g);
    if (!assign) return NULL_OUT;
    n->var_initializer = assign;
    dg_graph_add_to_collection(g, DG_GLOBAL_VARIABLES, n);
    if (trainable) dg_graph_add_to_collection(g, DG_TRAINABLE_VARIABLES, n);
    return v;
}

dg_output dg_variable_ex(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                         dg_initializer init, bool trainable) {
    return make_variable(g, name ? name : "Variable", false, dtype, shape, init, trainable);
}

dg_output dg_variable(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                      dg_initializer init) {
    return dg_variable_ex(g, name, dtype, shape, init, true);
}

dg_output dg_get_variable(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape,
                          dg_initializer init) {
    if (!dg_graph_ok(g)) return NULL_OUT;
    bool reuse;
    const char *scope = graph_variable_scope(g, &reuse);
    char full[512];
    snprintf(full, sizeof full, "%s%s%s", scope, *scope ? "/" : "", name ? name : "");
    dg_node *existing = dg_graph_find(g, full);
    if (reuse) {
        if (!existing || strcmp(existing->op->name, "VariableV2") != 0) {
            dg_graph_set_error(g, DG_NOT_FOUND, "variable \"%s\" does not exist, or was not created "
                               "with get_variable (reuse is on)", full);
            return NULL_OUT;
        }
        char a[128], b[128];
        if (existing->out_dtypes[0] != dtype || !dg_shape_equal(&existing->out_shapes[0], &shape)) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "variable \"%s\" is %s %s, asked for %s %s", full,
                               dg_dtype_name(existing->out_dtypes[0]),
                               dg_shape_str(&existing->out_shapes[0], a, sizeof a),
                               dg_dtype_name(dtype), dg_shape_str(&shape, b, sizeof b));
            return NULL_OUT;
        }
        dg_output o = {existing, 0};
        return o;
    }
    if (existing) {
        dg_graph_set_error(g, DG_ALREADY_EXISTS, "variable \"%s\" already exists; set reuse on the "
                           "variable scope to share it", full);
        return NULL_OUT;
    }
    return make_variable(g, full, true, dtype, shape, init, true);
}

dg_node *dg_variable_initializer(dg_output v) {
    return v.node && strcmp(v.node->op->name, "VariableV2") == 0 ? v.node->var_initializer : NULL;
}

static dg_output assign_op(dg_graph *g, const char *type, const char *name, dg_output var,
                           dg_output value) {
    if (!var.node || !value.node) return null_input(g, type);
    dg_graph_push_colocate_with(g, var.node);
    dg_output o = binary(g, type, name, var, value);
    dg_graph_pop_colocate_with(g);
    return o;
}
dg_output dg_assign(dg_graph *g, const char *name, dg_output var, dg_output value) {
    return assign_op(g, "Assign", name, var, value);
}
dg_output dg_assign_add(dg_graph *g, const char *name, dg_output var, dg_output value) {
    return assign_op(g, "AssignAdd", name, var, value);
}
dg_output dg_assign_sub(dg_graph *g, const char *name, dg_output var, dg_output value) {
    return assign_op(g, "AssignSub", name, var, value);
}

dg_output dg_is_variable_initialized(dg_graph *g, const char *name, dg_output var) {
    if (!var.node) return null_input(g, "IsVariableInitialized");
    dg_graph_push_colocate_with(g, var.node);
    dg_output o = unary(g, "IsVariableInitialized", name, var);
    dg_graph_pop_colocate_with(g);
    return o;
}

dg_node *dg_global_variables_initializer(dg_graph *g) {
    int n = dg_graph_collection_size(g, DG_GLOBAL_VARIABLES);
    dg_node **deps = calloc((size_t)(n ? n : 1), sizeof *deps);
    if (!deps) abort();
    int k = 0;
    for (int i = 0; i < n; i++) {
        dg_node *v = dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, i);
        if (v->var_initializer) deps[k++] = v->var_initializer;
    }
    dg_node *op = dg_group(g, "init", deps, k);
    free(deps);
    return op;
}

// ---- math ----
static dg_output matmul_node(dg_graph *g, const char *name, dg_output a, dg_output b, bool ta, bool tb);

// x cast to the 16-bit float `to`: one Cast node per (x, to), made at the first call (under the
// scopes then in force) and shared by later ones.
static dg_output cast_shared(dg_graph *g, dg_output x, dg_dtype to) {
    if (dg_output_dtype(x) == to) return x;
    dg_output c = graph_cast_lookup(g, x, to);
    if (c.node) return c;
    c = dg_cast(g, to == DG_BFLOAT16 ? "CastToBfloat16" : "CastToFloat16", x, to);
    if (c.node) graph_cast_remember(g, x, c);
    return c;
}

dg_output dg_matmul(dg_graph *g, const char *name, dg_output a, dg_output b, bool ta, bool tb) {
    if (!a.node || !b.node) return null_input(g, "MatMul");
    dg_dtype mp = dg_graph_mixed_precision(g);
    if (mp != DG_INVALID_DTYPE && dg_output_dtype(a) == DG_FLOAT32 && dg_output_dtype(b) == DG_FLOAT32) {
        dg_output y = matmul_node(g, name, cast_shared(g, a, mp), cast_shared(g, b, mp), ta, tb);
        return dg_cast(g, "CastToFloat32", y, DG_FLOAT32);
    }
    return matmul_node(g, name, a, b, ta, tb);
}

static dg_output matmul_node(dg_graph *g, const char *name, dg_output a, dg_output b, bool ta, bool tb) {
    if (!a.node || !b.node) return null_input(g, "MatMul");
    dg_node *n = graph_begin(g, "MatMul", name);
    graph_add_input(n, a);
    graph_add_input(n, b);
    graph_set_attr_bool(n, "transpose_a", ta);
    graph_set_attr_bool(n, "transpose_b", tb);
    return out0(graph_finish(n));
}

dg_output dg_batch_matmul(dg_graph *g, const char *name, dg_output x, dg_output y, bool adj_x, bool adj_y) {
    if (!x.node || !y.node) return null_input(g, "BatchMatMulV2");
    dg_node *n = graph_begin(g, "BatchMatMulV2", name);
    graph_add_input(n, x);
    graph_add_input(n, y);
    graph_set_attr_bool(n, "adj_x", adj_x);
    graph_set_attr_bool(n, "adj_y", adj_y);
    return out0(graph_finish(n));
}

static dg_output attention(dg_graph *g, const char *name, dg_output q, dg_output k, dg_output v, const dg_output *mask,
                           bool causal, double scale) {
    if (!q.node || !k.node || !v.node || (mask && !mask->node)) return null_input(g, "ScaledDotProductAttention");
    dg_node *n = graph_begin(g, "ScaledDotProductAttention", name);
    graph_add_input(n, q);
    graph_add_input(n, k);
    graph_add_input(n, v);
    if (mask) graph_add_input(n, *mask);
    graph_set_attr_bool(n, "causal", causal);
    graph_set_attr_float(n, "scale", scale);
    return out0(graph_finish(n));
}

dg_output dg_attention(dg_graph *g, const char *name, dg_output q, dg_output k, dg_output v, bool causal,
                       double scale) {
    return attention(g, name, q, k, v, NULL, causal, scale);
}

dg_output dg_attention_masked(dg_graph *g, const char *name, dg_output q, dg_output k, dg_output v, dg_output mask,
                              bool causal, double scale) {
    return attention(g, name, q, k, v, &mask, causal, scale);
}

dg_output dg_add(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Add", name, a, b); }
dg_output dg_sub(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Sub", name, a, b); }
dg_output dg_mul(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Mul", name, a, b); }
dg_output dg_div(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Div", name, a, b); }
dg_output dg_maximum(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Maximum", name, a, b); }
dg_output dg_minimum(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Minimum", name, a, b); }
dg_output dg_equal(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Equal", name, a, b); }
dg_output dg_greater(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Greater", name, a, b); }
dg_output dg_greater_equal(dg_graph *g, const char *name, dg_output a, dg_output b) {
    return binary(g, "GreaterEqual", name, a, b);
}
dg_output dg_less(dg_graph *g, const char *name, dg_output a, dg_output b) { return binary(g, "Less", name, a, b); }
dg_output dg_less_equal(dg_graph *g, const char *name, dg_output a, dg_output b) {
    return binary(g, "LessEqual", name, a, b);
}
dg_output dg_pow(dg_graph *g, const char *name, dg_output x, dg_output y) { return binary(g, "Pow", name, x, y); }

dg_output dg_add_n(dg_graph *g, const char *name, const dg_output *xs, int n) {
    if (n < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "AddN needs at least one input");
        return NULL_OUT;
    }
    if (n == 1) return xs[0];
    for (int i = 0; i < n; i++)
        if (!xs[i].node) return null_input(g, "AddN");
    return graph_build(g, "AddN", name, xs, n);
}

dg_output dg_bias_add(dg_graph *g, const char *name, dg_output v, dg_output b) { return binary(g, "BiasAdd", name, v, b); }
dg_output dg_relu(dg_graph *g, const char *name, dg_output x) { return unary(g, "Relu", name, x); }
dg_output dg_sigmoid(dg_graph *g, const char *name, dg_output x) { return unary(g, "Sigmoid", name, x); }
dg_output dg_tanh(dg_graph *g, const char *name, dg_output x) { return unary(g, "Tanh", name, x); }
dg_output dg_exp(dg_graph *g, const char *name, dg_output x) { return unary(g, "Exp", name, x); }

dg_output dg_abs(dg_graph *g, const char *name, dg_output x) {
    return dg_add(g, name, dg_relu(g, NULL, x), dg_relu(g, NULL, dg_neg(g, NULL, x)));
}

dg_output dg_sigmoid_cross_entropy_with_logits(dg_graph *g, const char *name, dg_output labels, dg_output logits) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_graph_push_name_scope(g, name ? name : "logistic_loss");
    dg_dtype t = dg_output_dtype(logits);
    dg_output e = dg_exp(g, NULL, dg_neg(g, NULL, dg_abs(g, NULL, logits)));
    dg_output log1p = dg_log(g, NULL, dg_add(g, NULL, dg_scalar(g, NULL, t, 1), e));
    dg_output y = dg_add(g, "loss", dg_sub(g, NULL, dg_relu(g, NULL, logits), dg_mul(g, NULL, logits, labels)), log1p);
    dg_graph_pop_name_scope(g);
    return y;
}

dg_output dg_l2_loss(dg_graph *g, const char *name, dg_output t) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_graph_push_name_scope(g, name ? name : "L2Loss");
    dg_output s = dg_sum(g, NULL, dg_square(g, NULL, t), NULL, 0, false);
    dg_output y = dg_mul(g, "loss", s, dg_scalar(g, NULL, dg_output_dtype(t), 0.5));
    dg_graph_pop_name_scope(g);
    return y;
}

void dg_clip_by_global_norm(dg_graph *g, const dg_output *ts, int n, double clip_norm, dg_output *out,
                            dg_output *global_norm) {
    for (int i = 0; out && i < n; i++) out[i] = ts ? ts[i] : NULL_OUT;
    if (global_norm) *global_norm = NULL_OUT;
    if (!g || !dg_graph_ok(g)) return;
    if (!ts || !out || n < 1 || !(clip_norm > 0)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "clip_by_global_norm: needs tensors and clip_norm > 0 (got %d "
                           "tensors, clip_norm %g)", n, clip_norm);
        return;
    }
    dg_graph_push_name_scope(g, "clip_by_global_norm");
    dg_output *sq = malloc((size_t)n * sizeof *sq);
    if (!sq) abort();
    for (int i = 0; i < n; i++)
        sq[i] = dg_sum(g, NULL, dg_square(g, NULL, dg_cast(g, NULL, ts[i], DG_FLOAT64)), NULL, 0, false);
    dg_output norm = dg_sqrt(g, "global_norm", n == 1 ? sq[0] : dg_add_n(g, NULL, sq, n));
    free(sq);
    dg_output c = dg_scalar(g, NULL, DG_FLOAT64, clip_norm);
    dg_output factor = dg_div(g, NULL, c, dg_maximum(g, NULL, norm, c));
    for (int i = 0; i < n; i++) {
        dg_dtype t = dg_output_dtype(ts[i]);
        dg_output f = t == DG_FLOAT64 ? factor : dg_cast(g, NULL, factor, t);
        out[i] = dg_mul(g, NULL, ts[i], f);
    }
    if (global_norm) *global_norm = norm;
    dg_graph_pop_name_scope(g);
}

// x reshaped to dims (n of them; at most one unknown, written -1).
static dg_output reshape_known(dg_graph *g, const char *name, const char *what, dg_output x, int64_t *dims, int n) {
    int unknown = 0;
    for (int i = 0; i < n; i++) unknown += dims[i] < 0;
    if (unknown > 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s: %d unknown dimensions (at most one)", what, unknown);
        return NULL_OUT;
    }
    return dg_reshape(g, name, x, dims, n);
}

dg_output dg_expand_dims(dg_graph *g, const char *name, dg_output x, int axis) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_shape s = dg_output_shape(x);
    if (!x.node || s.rank < 0 || s.rank >= DG_MAX_RANK || axis < -(s.rank + 1) || axis > s.rank) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "expand_dims: axis %d of an input of rank %d (a known rank below "
                           "%d, axis in [%d, %d])", axis, s.rank, DG_MAX_RANK, -(s.rank + 1), s.rank);
        return NULL_OUT;
    }
    if (axis < 0) axis += s.rank + 1;
    int64_t dims[DG_MAX_RANK];
    for (int i = 0, k = 0; i <= s.rank; i++) dims[i] = i == axis ? 1 : s.dims[k++];
    return reshape_known(g, name, "expand_dims", x, dims, s.rank + 1);
}

dg_output dg_squeeze(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_shape s = dg_output_shape(x);
    if (!x.node || s.rank < 0 || n < 0 || (n > 0 && !axes)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "squeeze: needs an input of known rank");
        return NULL_OUT;
    }
    bool drop[DG_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + s.rank : axes[i];
        if (a < 0 || a >= s.rank || s.dims[a] != 1) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "squeeze: axis %lld of shape %s is not a dimension of size 1",
                               (long long)axes[i], dg_shape_str(&s, (char[64]){0}, 64));
            return NULL_OUT;
        }
        drop[a] = true;
    }
    if (n == 0)
        for (int i = 0; i < s.rank; i++) drop[i] = s.dims[i] == 1;
    int64_t dims[DG_MAX_RANK];
    int k = 0;
    for (int i = 0; i < s.rank; i++)
        if (!drop[i]) dims[k++] = s.dims[i];
    return reshape_known(g, name, "squeeze", x, dims, k);
}

dg_output dg_stack(dg_graph *g, const char *name, const dg_output *xs, int n, int axis) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    if (n < 1 || n > 4096 || !xs) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "stack \"%s\": needs 1 to 4096 inputs, got %d", name ? name : "Pack", n);
        return NULL_OUT;
    }
    dg_output parts[4096];
    for (int i = 0; i < n; i++) {
        dg_shape s = dg_output_shape(xs[i]), s0 = dg_output_shape(xs[0]);
        if (!xs[i].node || s.rank < 0 || !dg_shape_compatible(&s, &s0)) {
            char a[128], b[128];
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "stack \"%s\": input %d has shape %s, input 0 %s (all must be "
                               "one known shape)", name ? name : "Pack", i, dg_shape_str(&s, a, sizeof a),
                               dg_shape_str(&s0, b, sizeof b));
            return NULL_OUT;
        }
        parts[i] = dg_expand_dims(g, NULL, xs[i], axis);
    }
    int64_t ax = axis < 0 ? axis + dg_output_shape(xs[0]).rank + 1 : axis;
    return dg_concat(g, name, parts, n, ax);
}

int dg_unstack(dg_graph *g, const char *name, dg_output x, int axis, dg_output *out, int cap) {
    if (!g || !dg_graph_ok(g)) return -1;
    dg_shape s = dg_output_shape(x);
    int64_t ax = axis < 0 ? axis + s.rank : axis;
    if (!x.node || s.rank < 1 || ax < 0 || ax >= s.rank || s.dims[ax] < 1 || s.dims[ax] > cap) {
        char a[128];
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "unstack \"%s\": axis %d of shape %s must be known, at least 1 and "
                           "at most %d (the room given)", name ? name : "Unpack", axis, dg_shape_str(&s, a, sizeof a), cap);
        return -1;
    }
    int n = (int)s.dims[ax];
    if (n == 1) {
        out[0] = dg_squeeze(g, name, x, &ax, 1);
        return dg_graph_ok(g) ? 1 : -1;
    }
    if (!dg_split(g, name, x, ax, n, out)) return -1;
    for (int i = 0; i < n; i++) out[i] = dg_squeeze(g, NULL, out[i], &ax, 1);
    return dg_graph_ok(g) ? n : -1;
}

dg_output dg_range(dg_graph *g, const char *name, dg_output start, dg_output limit, dg_output delta) {
    if (!start.node || !limit.node || !delta.node) return null_input(g, "Range");
    dg_node *n = graph_begin(g, "Range", name);
    graph_add_input(n, start);
    graph_add_input(n, limit);
    graph_add_input(n, delta);
    return out0(graph_finish(n));
}

dg_output dg_dense(dg_graph *g, const char *name, dg_output x, int64_t units, dg_activation activation,
                   dg_initializer kernel_init) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_shape xs = dg_output_shape(x);
    if (!x.node || xs.rank < 1 || xs.dims[xs.rank - 1] < 0 || units < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT,
                           "dense \"%s\": needs an input whose last dimension is known and units >= 1 (got rank %d, "
                           "units %lld)", name ? name : "dense", xs.rank, (long long)units);
        return NULL_OUT;
    }
    if (activation < DG_ACT_NONE || activation > DG_ACT_TANH) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "dense \"%s\": unknown activation %d", name ? name : "dense",
                           (int)activation);
        return NULL_OUT;
    }
    dg_graph_push_name_scope(g, name ? name : "dense");
    dg_dtype t = dg_output_dtype(x);
    dg_output kernel = dg_variable(g, "kernel", t, dg_shape2(xs.dims[xs.rank - 1], units), kernel_init);
    dg_output bias = dg_variable(g, "bias", t, dg_shape1(units), dg_init_zeros());
    dg_output in = x;
    int64_t flat[2] = {-1, xs.dims[xs.rank - 1]};
    if (xs.rank != 2) in = dg_reshape(g, NULL, x, flat, 2);
    dg_output y = dg_bias_add(g, "BiasAdd", dg_matmul(g, "MatMul", in, kernel, false, false), bias);
    switch (activation) {
    case DG_ACT_RELU: y = dg_relu(g, "Relu", y); break;
    case DG_ACT_SIGMOID: y = dg_sigmoid(g, "Sigmoid", y); break;
    case DG_ACT_TANH: y = dg_tanh(g, "Tanh", y); break;
    default: break;
    }
    if (xs.rank != 2) {   // back to [..., units]; at most one leading dimension unknown
        int64_t dims[DG_MAX_RANK];
        int unknown = 0;
        for (int i = 0; i < xs.rank - 1; i++) unknown += (dims[i] = xs.dims[i]) < 0;
        dims[xs.rank - 1] = units;
        if (unknown > 1)
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "dense \"%s\": an input of rank %d with %d unknown leading "
                               "dimensions (at most one)", name ? name : "dense", xs.rank, unknown);
        else
            y = dg_reshape(g, NULL, y, dims, xs.rank);
    }
    dg_graph_pop_name_scope(g);
    return y;
}
dg_output dg_log(dg_graph *g, const char *name, dg_output x) { return unary(g, "Log", name, x); }
dg_output dg_square(dg_graph *g, const char *name, dg_output x) { return unary(g, "Square", name, x); }
dg_output dg_sqrt(dg_graph *g, const char *name, dg_output x) { return unary(g, "Sqrt", name, x); }
dg_output dg_rsqrt(dg_graph *g, const char *name, dg_output x) { return unary(g, "Rsqrt", name, x); }
dg_output dg_erf(dg_graph *g, const char *name, dg_output x) { return unary(g, "Erf", name, x); }
dg_output dg_sin(dg_graph *g, const char *name, dg_output x) { return unary(g, "Sin", name, x); }
dg_output dg_cos(dg_graph *g, const char *name, dg_output x) { return unary(g, "Cos", name, x); }

dg_output dg_gelu(dg_graph *g, const char *name, dg_output x, bool approximate) {
    if (!x.node) return null_input(g, "Gelu");
    dg_node *n = graph_begin(g, "Gelu", name);
    graph_add_input(n, x);
    graph_set_attr_bool(n, "approximate", approximate);
    return out0(graph_finish(n));
}
dg_output dg_neg(dg_graph *g, const char *name, dg_output x) { return unary(g, "Neg", name, x); }
dg_output dg_softmax(dg_graph *g, const char *name, dg_output x) { return unary(g, "Softmax", name, x); }
dg_output dg_log_softmax(dg_graph *g, const char *name, dg_output x) { return unary(g, "LogSoftmax", name, x); }
dg_output dg_identity(dg_graph *g, const char *name, dg_output x) { return unary(g, "Identity", name, x); }
dg_output dg_shape_of(dg_graph *g, const char *name, dg_output x) { return unary(g, "Shape", name, x); }
dg_output dg_zeros_like(dg_graph *g, const char *name, dg_output x) { return unary(g, "ZerosLike", name, x); }
dg_output dg_ones_like(dg_graph *g, const char *name, dg_output x) { return unary(g, "OnesLike", name, x); }

dg_output dg_clip_by_value(dg_graph *g, const char *name, dg_output x, dg_output lo, dg_output hi) {
    if (!x.node || !lo.node || !hi.node) return null_input(g, "ClipByValue");
    dg_output ins[3] = {x, lo, hi};
    return graph_build(g, "ClipByValue", name, ins, 3);
}

dg_output dg_softmax_cross_entropy_with_logits(dg_graph *g, const char *name, dg_output logits,
                                               dg_output labels) {
    return binary(g, "SoftmaxCrossEntropyWithLogits", name, logits, labels);
}

dg_output dg_sparse_softmax_cross_entropy_with_logits(dg_graph *g, const char *name,
                                                      dg_output logits, dg_output labels) {
    return binary(g, "SparseSoftmaxCrossEntropyWithLogits", name, logits, labels);
}

dg_output dg_sparse_softmax_cross_entropy(dg_graph *g, const char *name, dg_output logits,
                                          dg_output labels) {
    dg_graph_push_name_scope(g, name ? name : "sparse_softmax_cross_entropy_loss");
    dg_output xent = dg_sparse_softmax_cross_entropy_with_logits(g, "xentropy", logits, labels);
    dg_output loss = dg_mean(g, "value", xent, NULL, 0, false);
    dg_graph_pop_name_scope(g);
    return loss;
}

static dg_output reduce(dg_graph *g, const char *type, const char *name, dg_output x,
                        const int64_t *axes, int n_axes, bool keep) {
    if (!x.node) return null_input(g, type);
    dg_node *n = graph_begin(g, type, name);
    graph_add_input(n, x);
    graph_set_attr_ints(n, "axes", axes, axes ? n_axes : 0);
    graph_set_attr_bool(n, "keep_dims", keep);
    return out0(graph_finish(n));
}
dg_output dg_sum(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n_axes, bool keep) {
    return reduce(g, "Sum", name, x, axes, n_axes, keep);
}
dg_output dg_mean(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n_axes, bool keep) {
    return reduce(g, "Mean", name, x, axes, n_axes, keep);
}
dg_output dg_max(dg_graph *g, const char *name, dg_output x, const int64_t *axes, int n_axes, bool keep) {
    return reduce(g, "Max", name, x, axes, n_axes, keep);
}

dg_output dg_argmax(dg_graph *g, const char *name, dg_output x, int64_t axis) {
    if (!x.node) return null_input(g, "ArgMax");
    dg_node *n = graph_begin(g, "ArgMax", name);
    graph_add_input(n, x);
    graph_set_attr_int(n, "axis", axis);
    return out0(graph_finish(n));
}

dg_output dg_cast(dg_graph *g, const char *name, dg_output x, dg_dtype to) {
    if (!x.node) return null_input(g, "Cast");
    if (dg_output_dtype(x) == to) return x;
    dg_node *n = graph_begin(g, "Cast", name);
    graph_add_input(n, x);
    graph_set_attr_type(n, "DstT", to);
    return out0(graph_finish(n));
}

// ---- shapes ----
dg_output dg_reshape_to(dg_graph *g, const char *name, dg_output x, dg_output shape) {
    return binary(g, "Reshape", name, x, shape);
}

dg_output dg_reshape(dg_graph *g, const char *name, dg_output x, const int64_t *dims, int n) {
    if (!x.node) return null_input(g, "Reshape");
    if (n < 0 || n > DG_MAX_RANK) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "reshape: rank %d is out of range 0..%d", n, DG_MAX_RANK);
        return NULL_OUT;
    }
    // The shape constant goes under the op's name, so the Reshape itself keeps `name`.
    char shape_name[512];
    snprintf(shape_name, sizeof shape_name, "%s/shape", name ? name : "Reshape");
    dg_output s = dg_const_i64s(g, shape_name, dims, n);
    return dg_reshape_to(g, name, x, s);
}

dg_output dg_fill(dg_graph *g, const char *name, dg_output dims, dg_output value) {
    return binary(g, "Fill", name, dims, value);
}

static dg_output filled(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape, double v) {
    if (!dg_shape_is_fully_defined(&shape)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "zeros/ones need a fully defined shape");
        return NULL_OUT;
    }
    dg_initializer init = dg_init_constant(v);
    dg_graph_push_name_scope(g, name ? name : (v == 0 ? "zeros" : "ones"));
    dg_output o = initial_value(g, dtype, shape, init);
    dg_graph_pop_name_scope(g);
    return o;
}
dg_output dg_zeros(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape) {
    return filled(g, name, dtype, shape, 0);
}
dg_output dg_ones(dg_graph *g, const char *name, dg_dtype dtype, dg_shape shape) {
    return filled(g, name, dtype, shape, 1);
}

dg_output dg_concat(dg_graph *g, const char *name, const dg_output *xs, int n, int64_t axis) {
    if (n < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "Concat needs at least one input");
        return NULL_OUT;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i].node) return null_input(g, "Concat");
    dg_node *nd = graph_begin(g, "Concat", name);
    for (int i = 0; i < n && nd; i++) graph_add_input(nd, xs[i]);
    graph_set_attr_int(nd, "axis", axis);
    return out0(graph_finish(nd));
}

bool dg_split(dg_graph *g, const char *name, dg_output x, int64_t axis, int n_splits, dg_output *out) {
    if (!x.node) {
        null_input(g, "Split");
        return false;
    }
    dg_node *n = graph_begin(g, "Split", name);
    graph_add_input(n, x);
    graph_set_attr_int(n, "axis", axis);
    graph_set_attr_int(n, "num_split", n_splits);
    n = graph_finish(n);
    for (int i = 0; i < n_splits; i++) {
        out[i].node = n;
        out[i].index = n ? i : 0;
    }
    return n != NULL;
}

dg_output dg_slice(dg_graph *g, const char *name, dg_output x, const int64_t *begin,
                   const int64_t *size, int n) {
    if (!x.node) return null_input(g, "Slice");
    dg_node *nd = graph_begin(g, "Slice", name);
    graph_add_input(nd, x);
    graph_set_attr_ints(nd, "begin", begin, n);
    graph_set_attr_ints(nd, "size", size, n);
    return out0(graph_finish(nd));
}

// ---- control ----
dg_node *dg_no_op(dg_graph *g, const char *name) {
    return graph_finish(graph_begin(g, "NoOp", name));
}

dg_node *dg_group(dg_graph *g, const char *name, dg_node *const *deps, int n) {
    dg_node *op = graph_begin(g, "NoOp", name ? name : "group_deps");
    for (int i = 0; i < n && op; i++) {
        if (!deps[i]) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "group: dependency %d is NULL", i);
            break;
        }
        dg_node_add_control_input(op, deps[i]);
    }
    return graph_finish(op);
}
