/* What graph/train.c gives the rest of the graph room beyond distgraph/train.h. */
#ifndef DG_TRAIN_IMPL_H
#define DG_TRAIN_IMPL_H

#include "distgraph/train.h"

// Rewrites the n gradients in place before they are checked (an all-reduce of them); false
// once the graph has an error.
typedef bool (*graph_gradient_transform)(void *ctx, dg_graph *g, dg_output *grads, int n);

// dg_optimizer_minimize_with_loss_scale; with transform (not NULL) the scaled gradients go
// through it before the finite check: what dg_all_reduce_minimize_with_loss_scale builds
// (graph/collective.c), which passes its all-reduce, so that this file calls no collective.
dg_node *graph_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                        const dg_loss_scale_options *o, dg_loss_scale *ls,
                                        graph_gradient_transform transform, void *ctx);

#endif
