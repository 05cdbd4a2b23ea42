/* Collectives across the tasks of a job: all-reduce and broadcast (TensorFlow's
 * CollectiveAllReduce / CollectiveBcast), and data-parallel training on them
 * (MultiWorkerMirroredStrategy). A group is the tasks 0..size-1 of one job; a collective's
 * rank is the task index of the device it runs on. An elastic group's members (and so the
 * ranks) are set while the job runs. Every task of the group builds the same
 * collectives with the same instance keys and runs each once per step, in the same order
 * (independent collectives in one step need a control dependency between them). Each task
 * runs its graph in a session whose target is its own server (dg_server_target); values
 * travel between the tasks' servers (docs/COLLECTIVES.md). */
#ifndef DISTGRAPH_COLLECTIVE_H
#define DISTGRAPH_COLLECTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/train.h"

#ifdef __cplusplus
extern "C" {
#endif

// The tasks taking part, and how long a collective waits for a peer's data before it fails
// with DEADLINE_EXCEEDED naming the peer. A member whose connection closes (its process
// exited) fails the collectives waiting on it at once, UNAVAILABLE naming it.
typedef struct dg_collective_group {
    const char *job;        // e.g. "worker"; borrowed for the builder call
    int size;               // tasks 0..size-1 of job, >= 1; or DG_COLLECTIVE_ELASTIC
    int64_t timeout_ms;     // 0: 60000
    // What an all-reduce's float32 values travel as between tasks: 0 (or DG_FLOAT32) as they
    // are; DG_BFLOAT16 rounded to bfloat16 (half the bytes), widened and summed in float32 on
    // arrival, every rank ending with the same values (about 3 significant digits: the direct
    // exchange rounds each input once; the ring rounds each partial sum as it passes a rank, so
    // its error grows with the group, and the two give different bits). float64 inputs are
    // refused with it. Broadcasts ignore it.
    dg_dtype wire_dtype;
} dg_collective_group;

// An elastic group's size: its members are the tasks of job that the task's server was last
// told (dg_server_set_collective_members, distgraph/server.h), numbered by epochs, so that
// workers can leave and join while a job runs (docs/ELASTIC.md).
#define DG_COLLECTIVE_ELASTIC 0

// An instance key the builder chooses: derived from the collective's node name (the same on
// every rank that builds the same graph, since names are), distinct from every other key of
// the graph's collectives. Hand-given keys (0..2^31-1) still work; a key already given to a
// collective of the same type in the graph is an error (ALREADY_EXISTS naming both).
#define DG_COLLECTIVE_KEY_AUTO ((int64_t)-1)

// {job, size, 0, 0}.
dg_collective_group dg_collective_group_make(const char *job, int size);

typedef enum dg_reduce_op {
    DG_REDUCE_SUM = 0,
    DG_REDUCE_MEAN = 1,
} dg_reduce_op;

// One CollectiveAllReduce node: out[i] = the sum (or mean) over the group of xs[i], the same
// bits on every rank. xs are float32/float64 tensors of any shapes (all ranks must give the
// same shapes); they are packed into one exchange. instance_key (0..2^31-1, or
// DG_COLLECTIVE_KEY_AUTO) names the collective across the group. hint: "auto" (NULL), "ring" or "direct". Returns false (the
// graph's sticky status says why) on error; out receives n outputs.
bool dg_collective_all_reduce(dg_graph *g, const char *name, const dg_output *xs, int n,
                              const dg_collective_group *group, int64_t instance_key,
                              dg_reduce_op op, const char *hint, dg_output *out);
// An all-reduce across devices of one task: one LocalAllReduce node per device, node r built
// on devices[r] with input xs[r]; out[r] is the sum (or mean) of all xs, on devices[r]. All xs
// must have one dtype (float32/float64) and shape. GPUs reduce with NCCL when every device is
// a GPU and NCCL is built in; otherwise the host sums in device order, so CPU devices get
// bit-identical results. Nodes are named "<name>_<r>". false with the graph's error set.
bool dg_local_all_reduce(dg_graph *g, const char *name, const dg_output *xs,
                         const char *const *devices, int n, dg_reduce_op op, dg_output *out);
// One CollectiveBroadcast node: out[i] = rank 0's xs[i] on every rank (float32, float64,
// int32 or int64).
bool dg_collective_broadcast(dg_graph *g, const char *name, const dg_output *xs, int n,
                             const dg_collective_group *group, int64_t instance_key,
                             dg_output *out);

// ---- data-parallel training (MultiWorkerMirrored) ----
// Gradients of loss with respect to vars (NULL: the trainable variables), averaged over the
// group by one CollectiveAllReduce, then one update of this task's copy of the variables
// (with a non-null global_step also incremented). Every task holds its own variables.
// Returns: the train op, borrowed, valid until dg_graph_free(); NULL on error.
dg_node *dg_all_reduce_minimize(const dg_optimizer *opt, dg_output loss, const dg_output *vars,
                                int n_vars, dg_output global_step, const dg_collective_group *group,
                                int64_t instance_key);
// dg_all_reduce_minimize with dynamic loss scaling (dg_optimizer_minimize_with_loss_scale, o
// NULL: its defaults): the scaled gradients over the trainable variables are averaged, then
// checked, so every worker skips the same steps and its scale (a global variable: broadcast
// with the others) stays the same. Returns: the train op, borrowed, valid until dg_graph_free();
// NULL once the graph has an error.
dg_node *dg_all_reduce_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                                const dg_collective_group *group, int64_t instance_key,
                                                const dg_loss_scale_options *o, dg_loss_scale *ls);
// Assigns rank 0's values to vars (NULL: every float32/float64/int32/int64 global variable at
// the time of the call, the global step and optimizer slots included when built after them) with one
// CollectiveBroadcast. Run it on every rank once the variables are initialized, in a run of
// its own (a variable is read when its node runs, which no control dependency delays).
// Returns: the op to run, borrowed, valid until dg_graph_free(); NULL on error.
dg_node *dg_collective_broadcast_variables(dg_graph *g, const dg_output *vars, int n_vars,
                                           const dg_collective_group *group, int64_t instance_key);

#ifdef __cplusplus
}
#endif
#endif
