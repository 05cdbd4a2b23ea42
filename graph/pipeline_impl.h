/* The pipeline's schedules (pipeline_schedule.c), shared with the builder (pipeline.c): each
 * device's order of pieces, and the simulation that checks an order and measures it. */
#ifndef DG_PIPELINE_IMPL_H
#define DG_PIPELINE_IMPL_H

#include <stdbool.h>

#include "distgraph/pipeline.h"

enum { PIPE_F = 0, PIPE_B = 1, PIPE_W = 2 };

// One piece of the pipeline: a phase (PIPE_F forward; PIPE_B backward, or its input-gradient
// part when the schedule splits it; PIPE_W the weight-gradient part) of one stage for one
// micro-batch.
typedef struct pipe_unit {
    int phase, stage, mb;
} pipe_unit;

typedef struct pipe_plan {
    int n_devices, chunks, n_stages, m;
    bool split;        // backward passes split into B and W (ZB-H1)
    pipe_unit **order; // order[d][0 .. n_order[d]): what device d runs, in turn
    int *n_order;
} pipe_plan;

// Checks the arguments (st names the bad one) and makes each device's order; for ZB-H1 the W
// parts are placed by simulating pieces of times t[PIPE_F], t[PIPE_B], t[PIPE_W].
bool pipe_plan_make(dg_pipeline_schedule s, int n_devices, int chunks, int m, const double t[3], pipe_plan *p,
                    dg_status *st);
void pipe_plan_free(pipe_plan *p);
// Runs the plan's orders with pieces of times t: false (a schedule that cannot finish) when a
// device waits forever.
bool pipe_plan_simulate(const pipe_plan *p, const double t[3], dg_pipeline_estimate *e);

#endif
