/* Graphs and nodes: the dataflow graph a program builds before running it.
 * A dg_graph owns its nodes. Builder calls never abort: the first error is recorded in the
 * graph (sticky, see dg_graph_status) and later builder calls return the null output.
 * Scopes (name, device, control dependencies, colocation, variable scopes) are stacks kept
 * in the graph. A graph is built by one thread; once built it may be read concurrently. */
#ifndef DISTGRAPH_GRAPH_H
#define DISTGRAPH_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_graph dg_graph;
typedef struct dg_node dg_node;

// One output of a node. {NULL, 0} is the null output builders return on error.
typedef struct dg_output {
    dg_node *node;
    int index;
} dg_output;

// Returns: new, caller frees with dg_graph_free().
dg_graph *dg_graph_new(void);
void dg_graph_free(dg_graph **g);

// The sticky builder status: OK, or the first error any builder call met.
// Returns: borrowed, valid until dg_graph_free().
const dg_status *dg_graph_status(const dg_graph *g);

// Mixed precision while building (PyTorch's autocast, on the ops built after the call): with
// dtype DG_BFLOAT16 or DG_FLOAT16, dg_matmul of two float32 operands casts them to dtype,
// multiplies in dtype (sums in float32) and returns the product cast back to float32; each
// float32 value is cast once however many products read it (a weight's cast serves its
// forward product and its gradient's). Everything else stays float32: variables (the master
// weights), their updates, reductions, softmax, normalisation. Gradients of the products are
// computed in dtype and reach the variables in float32. DG_INVALID_DTYPE turns it off; any
// other dtype is INVALID_ARGUMENT.
bool dg_graph_set_mixed_precision(dg_graph *g, dg_dtype dtype, dg_status *st);
// The dtype set by dg_graph_set_mixed_precision, DG_INVALID_DTYPE when off.
dg_dtype dg_graph_mixed_precision(const dg_graph *g);

// Automatic mixed precision as a rewrite of a built graph, as TensorFlow's grappler pass
// (enable_mixed_precision_graph_rewrite): call it once the model, its gradients and its
// updates are built, or let a session do it (dg_session_options.mixed_precision). Op types on
// four lists decide:
//   allow: always in dtype (MatMul, BatchMatMulV2, Conv2D and its gradients);
//   infer: in dtype when one of their float inputs already is (Add, Sub, Mul, Maximum, Minimum,
//          Neg, AddN, BiasAdd, Sigmoid, Tanh, Gelu, ScaledDotProductAttention, LayerNorm and
//          their gradients; attention and LayerNorm keep their statistics float32);
//   clear: in dtype when all their float inputs are (Identity, Reshape, StopGradient,
//          Transpose, Relu, ReluGrad);
//   deny:  float32, and so are infer and clear ops they feed (Exp, Log, Pow, Softmax,
//          LogSoftmax, the cross entropies, Sum, Mean).
// Ops on no list stay float32. A converted node reads its float32 inputs through Casts to
// dtype, and float32 readers of its output read it through a Cast back; each cast is made
// once per value (a variable is cast once a step, for its product and its gradient's), named
// "<value>/CastToBfloat16" (or ToFloat16, ToFloat32), on the value's requested device. Variables
// and their updates stay float32 (master weights). Node ids stay a topological order (the
// casts come just before their first reader). A variable read by a node with control inputs
// gets a cast of its own that waits for them. Every converted value also gets its cast back
// (for fetches). A node built after the rewrite reads a converted value through that cast, as
// the float32 it was built as; a second call rewrites only the nodes added since (and gives
// them the 16-bit values directly). Gradients through converted nodes are FAILED_PRECONDITION:
// build gradients and updates first. Not with dg_graph_set_mixed_precision's casts in the graph
// (FAILED_PRECONDITION).
typedef struct dg_mixed_precision_options {
    dg_dtype dtype;   // DG_BFLOAT16 or DG_FLOAT16
    // Changes to the lists: op types separated by commas (TensorFlow's
    // TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD and its siblings). Removes apply
    // first; an added op leaves its other list. Only ops with 16-bit kernels (those on the
    // default allow, infer and clear lists) may be added to allow, infer or clear; an unknown
    // op type is INVALID_ARGUMENT.
    const char *allow_add, *allow_remove, *infer_add, *infer_remove;
    const char *clear_add, *clear_remove, *deny_add, *deny_remove;
} dg_mixed_precision_options;
dg_mixed_precision_options dg_mixed_precision_options_default(dg_dtype dtype);
typedef struct dg_mixed_precision_report {
    int nodes_converted;   // nodes now computing in dtype
    int casts_added;
} dg_mixed_precision_report;
// report may be NULL.
bool dg_graph_rewrite_mixed_precision(dg_graph *g, const dg_mixed_precision_options *o,
                                      dg_mixed_precision_report *report, dg_status *st);
bool dg_graph_ok(const dg_graph *g);
// Copies the sticky status into st; returns true when it is OK.
bool dg_graph_check(const dg_graph *g, dg_status *st);
// Records err as the graph's error if none is recorded yet.
void dg_graph_set_error(dg_graph *g, dg_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int dg_graph_num_nodes(const dg_graph *g);
// Node i in creation order. Returns: borrowed, valid until dg_graph_free().
dg_node *dg_graph_node(const dg_graph *g, int i);
// Node by full name, NULL if none. Returns: borrowed, valid until dg_graph_free().
dg_node *dg_graph_find(const dg_graph *g, const char *name);
// Output by "name" or "name:i"; the null output (and st set) if not found.
dg_output dg_graph_output(const dg_graph *g, const char *name, dg_status *st);

// Forgets every node's requested and assigned device (TensorFlow's import with
// clear_devices=True): a graph placed on a cluster (a loaded training graph) can then run in
// one process. Colocation constraints stay.
void dg_graph_clear_devices(dg_graph *g);

// ---- node accessors (borrowed strings, valid until dg_graph_free) ----
const char *dg_node_name(const dg_node *n);
// Returns: borrowed, valid until dg_graph_free().
const char *dg_node_op_type(const dg_node *n);
// The device the builder asked for (scopes and device functions merged); "" if none.
// Returns: borrowed, valid until dg_graph_free().
const char *dg_node_requested_device(const dg_node *n);
// The device the placer chose; "" before placement. Returns: borrowed, valid until
// dg_graph_free().
const char *dg_node_assigned_device(const dg_node *n);
int dg_node_num_inputs(const dg_node *n);
dg_output dg_node_input(const dg_node *n, int i);
int dg_node_num_outputs(const dg_node *n);
dg_dtype dg_node_output_dtype(const dg_node *n, int i);
dg_shape dg_node_output_shape(const dg_node *n, int i);
int dg_node_num_control_inputs(const dg_node *n);
// Control input i. Returns: borrowed, valid until dg_graph_free().
dg_node *dg_node_control_input(const dg_node *n, int i);
// Colocation: names of the nodes this node must share a device with (via "loc:@name").
int dg_node_num_colocations(const dg_node *n);
// Returns: borrowed, valid until dg_graph_free().
const char *dg_node_colocation(const dg_node *n, int i);
// Attribute lookups; false if absent or of another kind.
bool dg_node_attr_int(const dg_node *n, const char *name, int64_t *out);
bool dg_node_attr_float(const dg_node *n, const char *name, double *out);
bool dg_node_attr_bool(const dg_node *n, const char *name, bool *out);
bool dg_node_attr_type(const dg_node *n, const char *name, dg_dtype *out);
bool dg_node_attr_shape(const dg_node *n, const char *name, dg_shape *out);
// Returns: borrowed, valid until dg_graph_free(); NULL if absent.
const char *dg_node_attr_string(const dg_node *n, const char *name);
// Const nodes: the value. Returns: borrowed, valid until dg_graph_free(); else NULL.
const dg_tensor *dg_node_const_value(const dg_node *n);

static inline dg_dtype dg_output_dtype(dg_output o) {
    return o.node ? dg_node_output_dtype(o.node, o.index) : DG_INVALID_DTYPE;
}
static inline dg_shape dg_output_shape(dg_output o) {
    if (o.node) return dg_node_output_shape(o.node, o.index);
    dg_shape s;
    s.rank = -1;
    return s;
}
static inline bool dg_output_ok(dg_output o) { return o.node != NULL; }
// Writes "name" or "name:i" into buf. Returns: buf (the caller's).
char *dg_output_str(dg_output o, char *buf, size_t cap);

// ---- name scopes ----
// Pushes a name scope ("dense" makes "dense/MatMul"). Nested scopes join with '/'.
// A scope name already used at this level becomes "dense_1" as in TensorFlow.
void dg_graph_push_name_scope(dg_graph *g, const char *name);
void dg_graph_pop_name_scope(dg_graph *g);
// A name unique in the graph, under the current scope. Returns: borrowed, valid until
// the next builder call.
const char *dg_graph_unique_name(dg_graph *g, const char *base);

// ---- device scopes and device functions ----
// Pushes a device scope. Nested scopes merge: the inner scope's fields win where set
// ("/job:worker" then "/device:GPU:0" gives "/job:worker/device:GPU:0"). A malformed
// string is a sticky error. "" clears the device for the scope.
void dg_graph_push_device(dg_graph *g, const char *device);
void dg_graph_pop_device(dg_graph *g);

// A device function picks the device of each new node (TensorFlow's device functions, such
// as replica_device_setter). It is called after the node's outputs are known, with the
// device requested so far (scopes merged, "" if none); it writes the device to use into
// out (NUL-terminated, at most out_cap bytes). Returns false and sets st on error.
typedef struct dg_device_fn {
    bool (*choose)(void *ctx, const dg_node *node, const char *current, char *out,
                   size_t out_cap, dg_status *st);
    void (*free_ctx)(void *ctx);   // optional; called by dg_device_fn_free
    void *ctx;
} dg_device_fn;
void dg_device_fn_free(dg_device_fn **fn);
// Pushes a device function; the innermost runs last and sees the earlier ones' results.
// Borrows fn until it is popped.
void dg_graph_push_device_fn(dg_graph *g, dg_device_fn *fn);
void dg_graph_pop_device_fn(dg_graph *g);

// ---- control dependencies ----
// Nodes created inside the scope depend on every node in deps (and on the outer scope's).
void dg_graph_push_control_deps(dg_graph *g, dg_node *const *deps, int n_deps);
void dg_graph_pop_control_deps(dg_graph *g);
// Adds a control edge dep -> n after the fact.
void dg_node_add_control_input(dg_node *n, dg_node *dep);

// ---- colocation ----
// Nodes created inside the scope are colocated with op (TensorFlow's colocate_with).
void dg_graph_push_colocate_with(dg_graph *g, dg_node *op);
void dg_graph_pop_colocate_with(dg_graph *g);

// ---- collections ----
#define DG_GLOBAL_VARIABLES "variables"
#define DG_TRAINABLE_VARIABLES "trainable_variables"
#define DG_GLOBAL_STEP "global_step"
#define DG_SUMMARIES "summaries"
// Float tensors whose values TensorBoard shows as histograms (dg_tensorboard_hook_new, the
// monitored session's logdir), as tf.summary.histogram.
#define DG_HISTOGRAM_SUMMARIES "histogram_summaries"
// Updates to run with each training step (the moving averages of dg_batch_normalization), as
// TensorFlow's tf.GraphKeys.UPDATE_OPS.
#define DG_UPDATE_OPS "update_ops"
// Adds a node to a named collection (a node may be in several; duplicates are kept once).
void dg_graph_add_to_collection(dg_graph *g, const char *collection, dg_node *n);
// Number of nodes in a collection (0 if it does not exist).
int dg_graph_collection_size(const dg_graph *g, const char *collection);
// Node i of a collection in insertion order. Returns: borrowed, valid until dg_graph_free.
dg_node *dg_graph_collection_get(const dg_graph *g, const char *collection, int i);

// ---- variable scopes ----
// Pushes a variable scope: it is also a name scope, and dg_get_variable under it creates or
// (with reuse) finds "scope/name". reuse is inherited by inner scopes.
void dg_graph_push_variable_scope(dg_graph *g, const char *name, bool reuse);
void dg_graph_pop_variable_scope(dg_graph *g);

#ifdef __cplusplus
}
#endif
#endif
