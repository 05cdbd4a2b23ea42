/* What graph/train.c gives the rest of the graph room beyond distgraph/train.h. */
#ifndef DG_TRAIN_IMPL_H
#define DG_TRAIN_IMPL_H

#include "distgraph/train.h"

// A trainer that does not send gradients as dg_optimizer_minimize does (what) refuses an
// optimizer whose gradient_wire_dtype is set: INVALID_ARGUMENT on the graph, false.
bool graph_no_gradient_wire(const dg_optimizer *opt, const char *what, const char *instead);

// Rewrites the n gradients in place before they are checked (an all-reduce of them); false
// once the graph has an error.
typedef bool (*graph_gradient_transform)(void *ctx, dg_graph *g, dg_output *grads, int n);

// dg_optimizer_minimize_with_loss_scale; with transform (not NULL) the scaled gradients go
// through it before the finite check: what dg_all_reduce_minimize_with_loss_scale builds
// (graph/collective.c), which passes its all-reduce, so that this file calls no collective.
dg_node *graph_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                        const dg_loss_scale_options *o, dg_loss_scale *ls,
                                        graph_gradient_transform transform, void *ctx);

// A loss scaler's pieces, for trainers whose gradients travel between computing and applying
// (sync replicas: workers compute, the chief applies).
typedef struct graph_loss_scaler {
    dg_loss_scale_options o;
    dg_node *home;                  // the scale's variables are colocated with it
    dg_output scale, good, skipped;
} graph_loss_scaler;
// Checks the options and makes the scale's variables (with global_step, else the loss);
// *scaled: the loss times the scale. false once the graph has an error.
bool graph_loss_scale_begin(dg_graph *g, dg_output loss, dg_output global_step, const dg_loss_scale_options *o,
                            graph_loss_scaler *sc, dg_output *scaled);
// Applies the scaled gradients (rewritten in place, unscaled) only when all are finite, then
// updates the scale and its counters; *ls (may be NULL) gets them. Returns the train op, NULL
// once the graph has an error.
dg_node *graph_loss_scale_apply(const dg_optimizer *opt, const graph_loss_scaler *sc, dg_output *grads,
                                const dg_output *vars, int n, dg_output global_step, dg_loss_scale *ls);

#endif
