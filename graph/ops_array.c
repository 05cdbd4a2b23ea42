/* Builders of the array ops of op_defs_array.c (distgraph/ops.h): transpose, tile,
 * stop_gradient, where and one_hot; and the summary helpers (Identity nodes in collections). */
#include <stdio.h>

#include "graph_impl.h"

static const dg_output NULL_OUT = {NULL, 0};

static dg_output build(dg_graph *g, const char *type, const char *name, const dg_output *ins, int n) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    return graph_build(g, type, name, ins, n);
}

// x and a constant int64 vector v[0..n) (the null output when n is out of range).
static dg_output with_vector(dg_graph *g, const char *type, const char *name, dg_output x, const int64_t *v, int n) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    if (n < 0 || n > DG_MAX_RANK || (n > 0 && !v)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": %d entries (0 to %d)", type, name ? name : type, n,
                           DG_MAX_RANK);
        return NULL_OUT;
    }
    dg_output ins[2] = {x, dg_const_i64s(g, NULL, v, n)};
    return build(g, type, name, ins, 2);
}

dg_output dg_transpose(dg_graph *g, const char *name, dg_output x, const int64_t *perm, int n) {
    return with_vector(g, "Transpose", name, x, perm, n);
}

dg_output dg_tile(dg_graph *g, const char *name, dg_output x, const int64_t *multiples, int n) {
    return with_vector(g, "Tile", name, x, multiples, n);
}

dg_output dg_stop_gradient(dg_graph *g, const char *name, dg_output x) { return build(g, "StopGradient", name, &x, 1); }

dg_output dg_where(dg_graph *g, const char *name, dg_output cond, dg_output t, dg_output e) {
    dg_output ins[3] = {cond, t, e};
    return build(g, "Select", name, ins, 3);
}

dg_output dg_one_hot(dg_graph *g, const char *name, dg_output indices, int64_t depth, double on_value,
                     double off_value, dg_dtype dtype) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    if (depth < 0 || !dg_dtype_is_float(dtype)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "one_hot \"%s\": depth %lld must be >= 0 and the dtype a float",
                           name ? name : "OneHot", (long long)depth);
        return NULL_OUT;
    }
    dg_tensor *d = dg_tensor_from_data(DG_INT64, dg_shape_scalar(), &depth, NULL);
    dg_output ins[4] = {indices, dg_const(g, NULL, d), dg_scalar(g, NULL, dtype, on_value),
                        dg_scalar(g, NULL, dtype, off_value)};
    dg_tensor_unref(d);
    return build(g, "OneHot", name, ins, 4);
}

static dg_output summary(dg_graph *g, const char *what, const char *collection, const char *name, dg_output x,
                         bool scalar) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    dg_shape s = dg_output_shape(x);
    dg_dtype t = dg_output_dtype(x);
    bool ok = x.node && name && *name &&
              (scalar ? dg_shape_num_elements(&s) == 1 && t != DG_BOOL : dg_dtype_is_float(t));
    if (!ok) {
        char b[128];
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": needs a tag and %s, got %s %s", what,
                           name ? name : "", scalar ? "a numeric scalar" : "a float tensor",
                           x.node ? dg_dtype_name(t) : "the null output", x.node ? dg_shape_str(&s, b, sizeof b) : "");
        return NULL_OUT;
    }
    dg_output y = dg_identity(g, name, x);
    if (y.node) dg_graph_add_to_collection(g, collection, y.node);
    return y;
}

dg_output dg_summary_scalar(dg_graph *g, const char *name, dg_output x) {
    return summary(g, "summary_scalar", DG_SUMMARIES, name, x, true);
}

dg_output dg_summary_histogram(dg_graph *g, const char *name, dg_output x) {
    return summary(g, "summary_histogram", DG_HISTOGRAM_SUMMARIES, name, x, false);
}
