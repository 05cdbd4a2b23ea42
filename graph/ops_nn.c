/* Builders of convolutional networks (distgraph/ops.h): conv2d, pooling, dropout, and the
 * conv2d and flatten layers. The ops are defined in op_defs_nn.c. */
#include <stdio.h>

#include "graph_impl.h"

static const dg_output NULL_OUT = {NULL, 0};

static bool check_window(dg_graph *g, const char *what, const char *name, int kh, int kw, int sh, int sw,
                         dg_padding padding) {
    if (!g || !dg_graph_ok(g)) return false;
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || (padding != DG_PADDING_VALID && padding != DG_PADDING_SAME)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT,
                           "%s \"%s\": window %dx%d, strides %dx%d and padding %d: windows and strides must be "
                           ">= 1 and padding DG_PADDING_VALID or DG_PADDING_SAME",
                           what, name ? name : what, kh, kw, sh, sw, (int)padding);
        return false;
    }
    return true;
}

static void set_window(dg_node *n, int kh, int kw, int sh, int sw, dg_padding padding, bool pool) {
    int64_t strides[4] = {1, sh, sw, 1}, ksize[4] = {1, kh, kw, 1};
    graph_set_attr_ints(n, "strides", strides, 4);
    if (pool) graph_set_attr_ints(n, "ksize", ksize, 4);
    graph_set_attr_string(n, "padding", padding == DG_PADDING_SAME ? "SAME" : "VALID");
}

dg_output dg_conv2d(dg_graph *g, const char *name, dg_output x, dg_output filter, int stride_h, int stride_w,
                    dg_padding padding) {
    if (!check_window(g, "Conv2D", name, 1, 1, stride_h, stride_w, padding)) return NULL_OUT;
    dg_node *n = graph_begin(g, "Conv2D", name);
    if (!n) return NULL_OUT;
    graph_add_input(n, x);
    graph_add_input(n, filter);
    set_window(n, 1, 1, stride_h, stride_w, padding, false);
    n = graph_finish(n);
    return n ? (dg_output){n, 0} : NULL_OUT;
}

static dg_output pool(dg_graph *g, const char *type, const char *name, dg_output x, int kh, int kw, int sh,
                      int sw, dg_padding padding) {
    if (!check_window(g, type, name, kh, kw, sh, sw, padding)) return NULL_OUT;
    dg_node *n = graph_begin(g, type, name);
    if (!n) return NULL_OUT;
    graph_add_input(n, x);
    set_window(n, kh, kw, sh, sw, padding, true);
    n = graph_finish(n);
    return n ? (dg_output){n, 0} : NULL_OUT;
}

dg_output dg_max_pool(dg_graph *g, const char *name, dg_output x, int kh, int kw, int stride_h, int stride_w,
                      dg_padding padding) {
    return pool(g, "MaxPool", name, x, kh, kw, stride_h, stride_w, padding);
}

dg_output dg_avg_pool(dg_graph *g, const char *name, dg_output x, int kh, int kw, int stride_h, int stride_w,
                      dg_padding padding) {
    return pool(g, "AvgPool", name, x, kh, kw, stride_h, stride_w, padding);
}

dg_output dg_dropout(dg_graph *g, const char *name, dg_output x, double rate, dg_output training, int64_t seed) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_node *n = graph_begin(g, "Dropout", name);
    if (!n) return NULL_OUT;
    graph_add_input(n, x);
    graph_add_input(n, training);
    graph_set_attr_float(n, "rate", rate);
    graph_set_random_seeds(g, n, seed);
    n = graph_finish(n);
    return n ? (dg_output){n, 0} : NULL_OUT;
}

dg_output dg_layer_norm(dg_graph *g, const char *name, dg_output x, dg_output gamma, dg_output beta,
                        double epsilon) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_node *n = graph_begin(g, "LayerNorm", name);
    if (!n) return NULL_OUT;
    graph_add_input(n, x);
    graph_add_input(n, gamma);
    graph_add_input(n, beta);
    graph_set_attr_float(n, "epsilon", epsilon);
    n = graph_finish(n);
    return n ? (dg_output){n, 0} : NULL_OUT;
}

dg_output dg_conv2d_layer(dg_graph *g, const char *name, dg_output x, int64_t filters, int kh, int kw, int stride,
                          dg_padding padding, dg_activation activation, dg_initializer kernel_init) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    const char *what = name ? name : "conv2d";
    dg_shape xs = dg_output_shape(x);
    if (!x.node || xs.rank != 4 || xs.dims[3] < 1 || filters < 1 || kh < 1 || kw < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT,
                           "conv2d layer \"%s\": needs an NHWC input of rank 4 with known channels, filters >= 1 and "
                           "a window >= 1 (got rank %d, filters %lld, window %dx%d)",
                           what, xs.rank, (long long)filters, kh, kw);
        return NULL_OUT;
    }
    if (activation < DG_ACT_NONE || activation > DG_ACT_TANH) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "conv2d layer \"%s\": unknown activation %d", what,
                           (int)activation);
        return NULL_OUT;
    }
    dg_graph_push_name_scope(g, what);
    dg_dtype t = dg_output_dtype(x);
    int64_t kdims[4] = {kh, kw, xs.dims[3], filters};
    dg_output kernel = dg_variable(g, "kernel", t, dg_shape_make(4, kdims), kernel_init);
    dg_output bias = dg_variable(g, "bias", t, dg_shape1(filters), dg_init_zeros());
    dg_output y = dg_bias_add(g, "BiasAdd", dg_conv2d(g, "Conv2D", x, kernel, stride, stride, padding), bias);
    switch (activation) {
    case DG_ACT_RELU: y = dg_relu(g, "Relu", y); break;
    case DG_ACT_SIGMOID: y = dg_sigmoid(g, "Sigmoid", y); break;
    case DG_ACT_TANH: y = dg_tanh(g, "Tanh", y); break;
    default: break;
    }
    dg_graph_pop_name_scope(g);
    return y;
}

dg_output dg_flatten(dg_graph *g, const char *name, dg_output x) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_shape xs = dg_output_shape(x);
    int64_t inner = 1;
    bool known = x.node && xs.rank >= 1;
    for (int i = 1; known && i < xs.rank; i++) {
        known = xs.dims[i] >= 0;
        inner *= xs.dims[i];
    }
    if (!known) {
        char b[128];
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "flatten \"%s\": needs rank >= 1 and known trailing dimensions, got %s",
                           name ? name : "flatten", x.node ? dg_shape_str(&xs, b, sizeof b) : "the null output");
        return NULL_OUT;
    }
    int64_t dims[2] = {-1, inner};
    return dg_reshape(g, name ? name : "flatten", x, dims, 2);
}

dg_output dg_batch_normalization(dg_graph *g, const char *name, dg_output x, dg_output training, double momentum,
                                 double epsilon) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    const char *what = name ? name : "batch_normalization";
    dg_shape xs = dg_output_shape(x);
    if (!x.node || xs.rank < 1 || xs.dims[xs.rank - 1] < 1 || !(momentum >= 0 && momentum < 1) || !(epsilon > 0)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT,
                           "batch_normalization \"%s\": needs an input whose last dimension is known, 0 <= momentum < 1 "
                           "and epsilon > 0 (got rank %d, momentum %g, epsilon %g)", what, xs.rank, momentum, epsilon);
        return NULL_OUT;
    }
    dg_graph_push_name_scope(g, what);
    dg_dtype t = dg_output_dtype(x);
    dg_shape cs = dg_shape1(xs.dims[xs.rank - 1]);
    dg_output gamma = dg_variable(g, "gamma", t, cs, dg_init_ones());
    dg_output beta = dg_variable(g, "beta", t, cs, dg_init_zeros());
    dg_output mm = dg_variable_ex(g, "moving_mean", t, cs, dg_init_zeros(), false);
    dg_output mv = dg_variable_ex(g, "moving_variance", t, cs, dg_init_ones(), false);
    int64_t axes[DG_MAX_RANK];
    for (int i = 0; i < xs.rank - 1; i++) axes[i] = i;
    dg_output mean = dg_mean(g, "mean", x, axes, xs.rank - 1, false);
    dg_output var = dg_mean(g, "variance", dg_square(g, NULL, dg_sub(g, NULL, x, mean)), axes, xs.rank - 1, false);
    dg_output m = dg_where(g, NULL, training, mean, mm), v = dg_where(g, NULL, training, var, mv);
    dg_output inv = dg_div(g, NULL, gamma, dg_sqrt(g, NULL, dg_add(g, NULL, v, dg_scalar(g, NULL, t, epsilon))));
    dg_output y = dg_add(g, "y", dg_mul(g, NULL, dg_sub(g, NULL, x, m), inv), beta);
    dg_output decay = dg_scalar(g, NULL, t, 1 - momentum);
    dg_output um = dg_assign_sub(g, "update_moving_mean", mm, dg_mul(g, NULL, dg_sub(g, NULL, mm, dg_stop_gradient(g, NULL, mean)), decay));
    dg_output uv = dg_assign_sub(g, "update_moving_variance", mv, dg_mul(g, NULL, dg_sub(g, NULL, mv, dg_stop_gradient(g, NULL, var)), decay));
    if (um.node) dg_graph_add_to_collection(g, DG_UPDATE_OPS, um.node);
    if (uv.node) dg_graph_add_to_collection(g, DG_UPDATE_OPS, uv.node);
    dg_graph_pop_name_scope(g);
    return y;
}
