/* Data parallelism inside one task, as graph construction: TensorFlow 2's tf.distribute
 * MirroredStrategy and CentralStorageStrategy. A dg_strategy is made for a graph and a list of
 * devices of one task, one replica ("tower") per device. Its variables are mirrored (one
 * identical copy per device) or stored once on the task's CPU:0 (central storage).
 * dg_strategy_minimize splits the batch along dim 0, builds one tower per device through a
 * callback, reduces the gradients on the task's CPU:0 to the mean over the whole batch and
 * applies it (to every copy, or to the one central variable). docs/STRATEGIES.md shows the
 * graph. A strategy is used by the thread building its graph and must not outlive it. */
#ifndef DISTGRAPH_STRATEGY_H
#define DISTGRAPH_STRATEGY_H

#include <stdbool.h>

#include "distgraph/graph.h"
#include "distgraph/ops.h"
#include "distgraph/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_strategy dg_strategy;

typedef enum dg_strategy_kind {
    DG_STRATEGY_MIRRORED = 0,          // a copy of every variable on every device
    DG_STRATEGY_CENTRAL_STORAGE = 1,   // every variable once, on the task's CPU:0
} dg_strategy_kind;

// A strategy over n_devices devices of one task, e.g. {"/device:CPU:0", "/device:CPU:1"} or
// {"/job:worker/task:1/device:GPU:0", ...}. Each string must name one device (a type and an
// id), all must share their job, replica and task fields, and none may repeat; anything else
// is INVALID_ARGUMENT naming the device. The strings are copied. Reductions, the batch split
// and central variables go to the "host": CPU:0 of that task (dg_strategy_host_device).
// Borrows g until dg_strategy_free(). Returns: new, caller frees with dg_strategy_free().
dg_strategy *dg_strategy_new(dg_graph *g, dg_strategy_kind kind, const char *const *devices,
                             int n_devices, dg_status *st);
// The same over /device:<device_type>:0 .. n-1 (device_type "CPU" or "GPU"; NULL: "CPU").
// A local session has CPU:1..k only with dg_session_options.n_virtual_cpus >= k.
// Returns: new, caller frees with dg_strategy_free().
dg_strategy *dg_strategy_new_local(dg_graph *g, dg_strategy_kind kind, const char *device_type,
                                   int n, dg_status *st);
void dg_strategy_free(dg_strategy **s);

dg_strategy_kind dg_strategy_get_kind(const dg_strategy *s);
int dg_strategy_num_replicas(const dg_strategy *s);
// The canonical device of a replica; NULL when replica is out of range.
// Returns: borrowed, valid until dg_strategy_free().
const char *dg_strategy_device(const dg_strategy *s, int replica);
// The task's CPU:0 (canonical). Returns: borrowed, valid until dg_strategy_free().
const char *dg_strategy_host_device(const dg_strategy *s);

// Creates a trainable strategy variable named under the current name scope, like
// dg_variable. Mirrored: the copy of replica 0 ("name", on device 0) and one copy per other
// replica ("name/replica_<r>", on device r), all assigned the one initial value computed on
// device 0 by the same initializer run, so the copies start identical. Central storage: one
// variable on the host device. Every copy is in the global and trainable collections.
// Returns the variable's handle (replica 0's copy), or the null output with st set (and the
// graph's sticky status when building failed). The handle is owned by the graph.
dg_output dg_strategy_variable(dg_strategy *s, const char *name, dg_dtype dtype, dg_shape shape,
                               dg_initializer init, dg_status *st);

// The variable as replica `replica` reads it: its own copy (mirrored) or the one variable
// (central storage). var is any copy of a variable made by dg_strategy_variable. A builder
// call, for use inside a tower callback: a var of another origin or a replica out of range
// records an INVALID_ARGUMENT naming them in the graph's sticky status and returns the null
// output.
dg_output dg_strategy_read_variable(dg_strategy *s, dg_output var, int replica);

// Builds replica `replica`'s tower on its device: inputs are its slices of the batch inputs
// (n_inputs, as passed to dg_strategy_minimize). Returns the tower's scalar mean loss over its
// slice, reading variables only through dg_strategy_read_variable; the null output after a
// builder error. Called inside the replica's device scope and a "replica_<r>" name scope.
typedef dg_output (*dg_tower_fn)(dg_graph *g, int replica, const dg_output *inputs, void *ctx);

typedef struct dg_strategy_step {
    dg_node *train;    // one training step; borrowed, valid until dg_graph_free()
    dg_output loss;    // mean of the tower losses = the mean loss over the whole batch
} dg_strategy_step;

// Builds one data-parallel training step: each batch input (a tensor whose dim 0 is the batch,
// e.g. a placeholder) is split into equal parts on the host, tower_fn builds replica r's loss
// on device r, its gradients with respect to the strategy's variables are computed there,
// summed on the host (AddN) and divided by the number of replicas, and opt applies the mean
// gradient: once per copy (mirrored, each update on its copy's device) or once (central
// storage). With a non-null global_step, the step increments it once. opt->graph must be the
// strategy's graph; opt is copied.
// Errors (INVALID_ARGUMENT unless noted): no strategy variables, a batch input of rank 0 or
// whose known dim 0 does not divide by the number of replicas (an unknown dim 0 that does not
// divide fails at run time in the Split node "split/input_<i>"), a tower loss that is not a
// scalar, a tower reading a trainable variable not made by the strategy or another replica's
// copy, and builder errors. Argument errors leave the graph unchanged; errors met while
// building are also recorded in the graph's sticky status. Returns false with st set; on
// success fills *out. Borrows batch_inputs and ctx for the duration of the call.
bool dg_strategy_minimize(dg_strategy *s, const dg_optimizer *opt, dg_tower_fn tower_fn, void *ctx,
                          const dg_output *batch_inputs, int n_inputs, dg_output global_step,
                          dg_strategy_step *out, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
