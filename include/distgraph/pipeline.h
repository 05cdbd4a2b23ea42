/* Pipeline parallelism: a model cut into stages over devices or tasks, a global batch run as
 * micro-batches through them under a schedule (GPipe, 1F1B, interleaved 1F1B, ZB-H1), the
 * gradients accumulated over the micro-batches and applied once. docs/PIPELINES.md is the
 * user's guide.
 *
 * The pipeline is built into the graph: each stage's forward pass is built once per
 * micro-batch by the caller's stage function, its backward pass by dg_gradients from the next
 * stage's input gradients, and the schedule is the order in which each device runs these
 * pieces, kept by control dependencies between them (a piece starts when the device's previous
 * piece has finished). Stage boundaries are ordinary edges between devices: the partitioner
 * turns them into Send/Recv pairs (shared memory between tasks of one host, the transport
 * between hosts), and a received tensor waits in the rendezvous until its stage's turn comes.
 * One session run is one global step. Node names say where each piece is:
 * "<name>/s<stage>/mb<micro-batch>/fwd/...", ".../bwd/..." (and ".../recompute/..." when
 * activations are recomputed), so the step timeline shows every micro-batch's forward and
 * backward pass on every stage. */
#ifndef DISTGRAPH_PIPELINE_H
#define DISTGRAPH_PIPELINE_H

#include <stdbool.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_pipeline_schedule {
    // Every micro-batch's forward pass, then every backward pass (GPipe). Holds m micro-batches'
    // activations per stage.
    DG_PIPELINE_GPIPE = 0,
    // One forward, one backward (PipeDream-flush): stage s runs p - 1 - s forward passes ahead,
    // then alternates. The same bubble as GPipe, at most p micro-batches' activations held.
    DG_PIPELINE_1F1B = 1,
    // Megatron's interleaved 1F1B: each device holds `chunks` stages (device d: stages d, d + D,
    // d + 2D, ...), the bubble divided by chunks. micro_batches must be a multiple of the devices.
    DG_PIPELINE_INTERLEAVED_1F1B = 2,
    // Zero-bubble ZB-H1 (Qi et al., 2024): each backward pass split into its input-gradient part
    // (B: what the previous stage waits for) and its weight-gradient part (W), the W parts
    // deferred to fill the time a stage would wait (stage s keeps at most s of them waiting).
    // Its bubble is (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W).
    DG_PIPELINE_ZB_H1 = 3,
} dg_pipeline_schedule;

// "gpipe", "1f1b", "interleaved" and "zb-h1" (also "zbh1", "zb_h1"). false if s is none of them.
bool dg_pipeline_schedule_parse(const char *s, dg_pipeline_schedule *out);
// The name dg_pipeline_schedule_parse reads; "unknown" for another value.
const char *dg_pipeline_schedule_name(dg_pipeline_schedule s);

// Builds one stage of the model for one micro-batch. stage: 0 .. n_stages - 1; micro_batch:
// 0 .. micro_batches - 1 (the same micro-batch index again when activations are recomputed).
// in: the previous stage's outputs for this micro-batch (stage 0: the micro-batch's slices of
// the pipeline's batch inputs, in their order). Writes the stage's outputs into out (at most
// cap) and returns how many, or -1 (the graph's sticky status says why). The last stage's
// out[0] is the micro-batch's loss, a float scalar: the mean over its examples; any other
// output of the last stage is left alone.
//
// The function is called once per micro-batch (and once more per micro-batch for recomputation),
// under the stage's device scope: variables must be found by name when they exist (as
// dg_get_variable under a reusing variable scope does: the pipeline pushes such a scope for
// every call after a stage's first), never created twice. A stage should return the same number
// of outputs for every micro-batch; with recompute, its ops must give the same values when
// built again (random ops with fixed seeds).
typedef int (*dg_pipeline_stage_fn)(dg_graph *g, int stage, int micro_batch, const dg_output *in, int n_in,
                                    dg_output *out, int cap, void *arg);

typedef struct dg_pipeline_options {
    const char *name;              // the name scope of the pipeline's nodes ("pipeline")
    // The devices (or tasks: "/job:worker/task:1") the stages run on: stage k on
    // devices[k % n_devices]. Each stage's nodes, forward and backward, ask for its device
    // whatever scopes are in force where dg_pipeline_build is called.
    const char *const *devices;
    int n_devices;
    int chunks;                    // stages per device (interleaved only; 1 otherwise)
    int micro_batches;             // m >= 1; every batch input's first dimension must divide by it
    dg_pipeline_schedule schedule;
    // Recompute each stage's forward pass in its backward pass (GPipe's rematerialization): a
    // stage keeps only its inputs between the two passes, at the cost of a second forward.
    bool recompute;
    // The relative times of a forward, an input-gradient and a weight-gradient part, from which
    // ZB-H1 places its W parts (the order is found by simulating them); 0: 1 each.
    double t_forward, t_backward, t_weight;
    dg_pipeline_stage_fn stage_fn;
    void *arg;
    // Dynamic loss scaling (float16 products): a float32 scalar by which every micro-batch's
    // loss is multiplied before its backward pass, so that the gradients are of the scaled loss
    // (dg_loss_scale_make's scale; apply them with dg_optimizer_apply_gradients_with_loss_scale).
    // The pipeline's loss stays unscaled. The null output: none.
    dg_output loss_scale;
} dg_pipeline_options;

// The defaults: name "pipeline", one chunk, one micro-batch, 1F1B, no recomputation.
dg_pipeline_options dg_pipeline_options_default(void);

// A built pipeline.
typedef struct dg_pipeline {
    dg_output loss;     // the mean of the micro-batches' losses, on the last stage's device
    // The trainable variables the stages read and the gradient of loss with respect to each:
    // the micro-batches' gradients summed as they finish, on the variable's device. Pass them to
    // dg_optimizer_apply_gradients. Owned by the pipeline.
    int n_vars;
    dg_output *vars, *grads;
    int n_stages;
    char **stage_devices;   // stage k's device or task as the options gave it; owned
} dg_pipeline;
// (A dg_pipeline owns its arrays: free it once, never a copy as well.)

// Splits each of batch[0..n_batch) into micro_batches along its first axis and builds the
// pipeline into g. false (the graph's sticky status and st name the option or the stage) on
// bad options, a stage function that fails or returns a different number of outputs, or a last
// stage whose out[0] is not a float scalar. dg_pipeline_free frees what p holds either way.
bool dg_pipeline_build(dg_graph *g, const dg_pipeline_options *o, const dg_output *batch, int n_batch, dg_pipeline *p,
                       dg_status *st);
void dg_pipeline_free(dg_pipeline *p);

// An error of a step (st) that names the task of one of p's stages, as a lost or unreachable
// task's does: prepends "pipeline stage K (on DEVICE)" (or "pipeline stages K, L (on ...)" when
// the task holds several) for the task the message names last, which is its innermost cause;
// returns whether it named one. st unchanged otherwise.
bool dg_pipeline_name_stage(const dg_pipeline *p, dg_status *st);

// What a schedule does with pieces of fixed times: the step's length (its makespan, in the
// times' unit), the bubble (the mean over devices of the idle fraction of the step), and the
// most micro-batches whose activations one device holds at once (forward done, backward, or
// with ZB-H1 its W part, not yet).
typedef struct dg_pipeline_estimate {
    double step;
    double bubble;
    int peak_in_flight;
} dg_pipeline_estimate;

// Simulates schedule s on n_devices devices with chunks stages each and micro_batches
// micro-batches, each stage's forward taking t_forward, its input-gradient part t_backward
// and its weight-gradient part t_weight (schedules that do not split the backward run both
// together); no time between stages. The theory the measured bubbles are held to: GPipe and
// 1F1B (p - 1)/(m + p - 1), interleaved ((p - 1)/v)/(m + (p - 1)/v). false with st set on bad
// arguments.
bool dg_pipeline_simulate(dg_pipeline_schedule s, int n_devices, int chunks, int micro_batches, double t_forward,
                          double t_backward, double t_weight, dg_pipeline_estimate *e, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
