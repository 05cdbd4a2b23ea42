/* Windows of the convolution and pooling ops (NHWC), shared by their shape inference
 * (graph/op_defs_nn.c) and their CPU and GPU kernels. TensorFlow's rules: attributes
 * "strides" [1, sh, sw, 1], "ksize" [1, kh, kw, 1] (pooling; a convolution's window is its
 * filter's [kh, kw, in, out]) and "padding" "SAME" or "VALID". Along an axis of size n, VALID
 * places windows inside the input, ceil((n - k + 1) / s) of them (none fits when k > n: an
 * error); SAME makes ceil(n / s) and pads max((out - 1) s + k - n, 0) in total, half of it
 * (rounded down) before. */
#ifndef DG_NN_IMPL_H
#define DG_NN_IMPL_H

#include "graph_impl.h"

typedef struct graph_window {
    int64_t kh, kw;   // window (pooling: from "ksize"; convolution: set from the filter)
    int64_t sh, sw;   // strides
    bool same;        // padding SAME (else VALID)
} graph_window;

// Reads n's "strides", "padding" and, for pooling (pool), "ksize". INVALID_ARGUMENT naming
// the attribute when one is missing or malformed.
bool graph_window_attrs(const dg_node *n, bool pool, graph_window *w, dg_status *st);
// The output size along one axis of input size in (< 0: unknown, out -1) for window k and
// stride s, and the padding before it (0 for VALID). INVALID_ARGUMENT naming the axis when
// a VALID window does not fit.
bool graph_window_dim(int64_t in, int64_t k, int64_t s, bool same, const char *axis,
                      int64_t *out, int64_t *pad_before, dg_status *st);

// The geometry of one run of a window op, checked against the actual shapes.
typedef struct graph_conv_geom {
    int64_t n, h, w, c;            // input [n, h, w, c]
    int64_t kh, kw, sh, sw;
    int64_t oh, ow, oc;            // output [n, oh, ow, oc] (pooling: oc = c)
    int64_t pad_top, pad_left;
} graph_conv_geom;

// Whether the window is a 1x1 with stride 1 and no padding: the input is its own window matrix.
static inline bool graph_conv_is_pointwise(const graph_conv_geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pad_top == 0 && g->pad_left == 0;
}

// Fills g for input shape x (rank 4), window w and output channels oc. false with st set.
bool graph_conv_geom_make(const dg_shape *x, const graph_window *w, int64_t oc,
                          graph_conv_geom *g, dg_status *st);

#endif
