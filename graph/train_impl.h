/* What graph/train.c gives the rest of the graph room beyond distgraph/train.h. */
#ifndef DG_TRAIN_IMPL_H
#define DG_TRAIN_IMPL_H

#include "distgraph/collective.h"
#include "distgraph/train.h"

// dg_optimizer_minimize_with_loss_scale; with group (not NULL) the scaled gradients are
// all-reduced (mean, under instance_key) before the finite check: what
// dg_all_reduce_minimize_with_loss_scale builds.
dg_node *graph_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                        const dg_loss_scale_options *o, dg_loss_scale *ls,
                                        const dg_collective_group *group, int64_t instance_key);

#endif
