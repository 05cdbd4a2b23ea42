/* The replica device setter (TensorFlow's tf.train.replica_device_setter): a device
 * function that sends variables (and the other ps op types) to ps tasks and everything else
 * to the worker device. Push the returned function with dg_graph_push_device_fn. */
#ifndef DISTGRAPH_DEVICE_SETTER_H
#define DISTGRAPH_DEVICE_SETTER_H

#include <stdbool.h>

#include "distgraph/cluster.h"
#include "distgraph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_ps_strategy {
    DG_PS_ROUND_ROBIN = 0,   // ps task of the k-th ps op is k mod ps_tasks (creation order)
    DG_PS_GREEDY_BYTES = 1,  // ps task with the fewest bytes so far (ties: lowest index)
} dg_ps_strategy;

typedef struct dg_replica_device_setter_options {
    int ps_tasks;               // 0: taken from cluster's "ps" job (or no ps placement)
    const dg_cluster *cluster;  // optional; borrowed for the call only. When set, the number
                                // of tasks of ps_device's job in it replaces ps_tasks, and
                                // the k-th slot goes to that job's k-th task index (sparse ok)
    const char *ps_device;      // default "/job:ps"; NULL: the default; "": no ps placement
    const char *worker_device;  // default "/job:worker"; NULL: the default; "": none
    bool merge_devices;         // default true
    const char *const *ps_ops;  // NULL: {"Variable", "VariableV2", "VarHandleOp"}
    int n_ps_ops;
    dg_ps_strategy strategy;
} dg_replica_device_setter_options;

dg_replica_device_setter_options dg_replica_device_setter_options_default(void);

// Returns: new, caller frees with dg_device_fn_free(); NULL (st set) on bad options, e.g.
// a cluster without a "ps" job and ps_tasks 0 is fine (no ps placement) but a malformed
// ps_device or worker_device is INVALID_ARGUMENT. opts NULL means the defaults.
// With no ps tasks the function leaves every device unchanged (TensorFlow returns no device
// function then). Otherwise a ps op gets ps_device with its fields overridden by the op's
// own device; the strategy picks the task only when the op has no job or ps_device's job
// (an op pinned to another job keeps it and gets no task). Other ops get worker_device
// overridden by their own device. Without merge_devices an op that already has a device
// keeps it verbatim. The greedy strategy needs a single output of known dtype and fully
// defined shape (or a fully defined "shape" attr); otherwise choose fails with
// INVALID_ARGUMENT and the graph records it. The function keeps strategy state: use one per
// graph.
dg_device_fn *dg_replica_device_setter_new(const dg_replica_device_setter_options *opts,
                                       dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
