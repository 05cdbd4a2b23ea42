/* The replica device setter (TensorFlow's tf.compat.v1.train.replica_device_setter): a device
 * function that sends variables (and the other ps op types) to ps tasks and everything else
 * to the worker device, reading device strings as Python's DeviceSpec does. Push the returned
 * function with dg_graph_push_device_fn. A setter keeps strategy state (the next task, the
 * loads): use one per graph, from one thread. docs/TF_COMPAT.md lists the deliberate
 * differences from TensorFlow. */
#ifndef DISTGRAPH_DEVICE_SETTER_H
#define DISTGRAPH_DEVICE_SETTER_H

#include <stdbool.h>

#include "distgraph/cluster.h"
#include "distgraph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_ps_strategy {
    DG_PS_ROUND_ROBIN = 0,   // the k-th ps op goes to task k mod ps_tasks (creation order)
    DG_PS_GREEDY_BYTES = 1,  // GreedyLoadBalancingStrategy(byte_size_load_fn): the greedy
                             // strategy with dg_byte_size_load_fn as its load function
    DG_PS_GREEDY = 2,        // GreedyLoadBalancingStrategy(load_fn): the task with the least
                             // load so far (first on ties), then its load grows by load_fn(op)
} dg_ps_strategy;

// A load function for the greedy strategy: writes op's load (any unit; negative and
// fractional values are allowed, loads add up as doubles) to *load. Returns false and sets st
// to refuse the op; the graph then records the error for the node.
typedef bool (*dg_ps_load_fn)(void *ctx, const dg_node *op, double *load, dg_status *st);

typedef struct dg_replica_device_setter_options {
    int ps_tasks;               // tasks of the ps job; 0: no ps placement at all. Ignored when
                                // cluster is set. Negative is INVALID_ARGUMENT.
    const dg_cluster *cluster;  // optional; borrowed for the call only. When set, the number
                                // of tasks of ps_device's job in it replaces ps_tasks, and
                                // the k-th slot goes to that job's k-th task index (sparse ok)
    const char *ps_device;      // default "/job:ps"; NULL: the default; "": no ps placement
    const char *worker_device;  // default "/job:worker"; NULL: the default; "": none
    bool merge_devices;         // default true
    const char *const *ps_ops;  // NULL: TensorFlow's STANDARD_PS_OPS (dg_standard_ps_ops)
    int n_ps_ops;
    dg_ps_strategy strategy;
    dg_ps_load_fn load_fn;      // DG_PS_GREEDY only (required there)
    void *load_ctx;             // passed to load_fn; borrowed until the setter is freed
} dg_replica_device_setter_options;

dg_replica_device_setter_options dg_replica_device_setter_options_default(void);

// Returns: new, caller frees with dg_device_fn_free(); NULL (st set, INVALID_ARGUMENT) on bad
// options: negative ps_tasks or n_ps_ops, a NULL ps op name, an unknown strategy, DG_PS_GREEDY
// without load_fn, or, with a cluster, a malformed ps_device. opts NULL means the defaults.
// With no ps tasks (ps_tasks 0, or a cluster without ps_device's job) the function leaves
// every device unchanged (TensorFlow returns no device function then). Otherwise, for a node
// whose current device is cur (parsed with dg_device_spec_from_string): without
// merge_devices a non-empty cur is kept verbatim; a ps op gets ps_device, with the strategy's
// task when ps_device has a job and cur has none or the same one, merged under cur's fields;
// any other op gets worker_device merged under cur's fields. Like TensorFlow, ps_device and
// worker_device are read when an op needs them, so a malformed one fails that op (the graph
// records INVALID_ARGUMENT naming it), not the setter.
dg_device_fn *dg_replica_device_setter_new(const dg_replica_device_setter_options *opts,
                                           dg_status *st);

// TensorFlow's STANDARD_PS_OPS, the op types sent to ps tasks when opts.ps_ops is NULL:
// reference and resource variables (Variable, VariableV2, AutoReloadVariable, VarHandleOp),
// hash tables, boosted-trees resources, ResourceConditionalAccumulator and
// DecisionTreeResource. Sets *n_out. Returns: borrowed, static.
const char *const *dg_standard_ps_ops(int *n_out);

// byte_size_load_fn: the bytes of op's single output (dtype size times elements). An output
// shape that is not fully defined falls back to the op's "shape" attribute, as TensorFlow's
// does for scalar variables. A resource variable's handle op (VarHandleOp) counts the bytes
// of its variable ("dtype" and "shape" attributes), so resource variables balance like
// reference variables (TensorFlow counts 0 bytes: docs/TF_COMPAT.md). Fails with
// INVALID_ARGUMENT if op has not exactly one output or its shape is not fully defined.
// ctx is unused.
bool dg_byte_size_load_fn(void *ctx, const dg_node *op, double *load, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
