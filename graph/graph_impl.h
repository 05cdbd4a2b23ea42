/* Graph internals shared by the layers: node layout, attributes, op definitions and the
 * builder protocol (graph_begin / graph_add_input / graph_set_attr_* / graph_finish). */
#ifndef DG_GRAPH_IMPL_H
#define DG_GRAPH_IMPL_H

#include "distgraph/graph.h"
#include "distgraph/embedding.h"
#include "distgraph/ops.h"
#include "strmap_impl.h"
#include "tensor_impl.h"

typedef enum graph_attr_kind {
    GA_INT = 1,
    GA_FLOAT = 2,
    GA_BOOL = 3,
    GA_TYPE = 4,
    GA_SHAPE = 5,
    GA_STRING = 6,
    GA_INTS = 7,
    GA_TENSOR = 8,
} graph_attr_kind;

typedef struct graph_attr {
    const char *name;   // interned in the node's graph (graph_intern)
    graph_attr_kind kind;
    union {
        int64_t i;
        double f;
        bool b;
        dg_dtype type;
        dg_shape shape;
        char *s;                           // owned unless borrowed_value
        struct { int64_t *v; int n; } ints;   // owned
        dg_tensor *t;                      // one reference held
    } u;
    bool borrowed_value;   // GA_STRING: u.s is interned, not owned
} graph_attr;

typedef struct graph_op_def graph_op_def;

struct dg_node {
    dg_graph *graph;
    int id;                     // index in graph->nodes
    char *name;                 // owned
    const graph_op_def *op;
    dg_output *inputs;          // owned array of n_inputs
    int n_inputs, cap_inputs;
    dg_node **ctrl_inputs;      // owned array
    int n_ctrl, cap_ctrl;
    graph_attr *attrs;          // owned array
    int n_attrs, cap_attrs;
    int n_outputs;
    dg_dtype *out_dtypes;       // owned, n_outputs
    dg_shape *out_shapes;       // owned, n_outputs
    const char *requested_device;   // interned in graph, "" if none
    const char *assigned_device;    // interned in graph, NULL before placement
    char **coloc;               // owned names of nodes to colocate with
    int n_coloc;
    dg_node *var_initializer;   // VariableV2: its Assign from the initial value
    bool shadow;                // a partition's copy: name, attrs, outputs and colocation
                                // belong to the original node, which outlives it
    uint8_t mixed;              // the mixed-precision rewrite's verdict: GRAPH_MIXED_*
};

// NONE: float32 as built; LOW: computes in the rewrite's 16-bit dtype; DENY: kept float32 by
// the deny list; CAST: a cast the rewrite (or a fetch of a converted value) added.
enum { GRAPH_MIXED_NONE = 0, GRAPH_MIXED_LOW = 1, GRAPH_MIXED_DENY = 2, GRAPH_MIXED_CAST = 3 };
// A bool attribute: the mixed-precision rewrite keeps the node float32 as if on its deny list
// (the loss scaler's unscaling multiply).
#define GRAPH_ATTR_KEEP_FLOAT32 "_mixed_precision_keep_float32"
// A fetch of x: x itself, or x's cast back to float32 (which the rewrite made) when the rewrite
// made x 16-bit (mixed_precision.c). Changes nothing.
dg_output graph_mixed_precision_fetch(const dg_graph *g, dg_output x);

// How the gradient of a node is built. dy has one entry per output (the null output where
// no gradient flows); the function fills dx, one entry per input (null: none). Returns
// false after recording an error in the graph.
typedef bool (*graph_grad_fn)(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx);

struct graph_op_def {
    const char *name;
    int min_inputs, max_inputs;   // max -1: variadic
    bool is_stateful;             // never pruned as constant, never deduplicated
    int ref_inputs;               // the first ref_inputs inputs must be variables the op
                                  // reads and updates in place (Assign*: 1, ApplyAdam: var, m, v)
    bool no_gradient;             // explicitly has no gradient (integer ops, initializers)
    bool (*infer)(dg_node *n, dg_status *st);   // sets n_outputs, dtypes and shapes
    graph_grad_fn grad;
};

// One entry of an op table: GRAPH_OP("MatMul", min_inputs, max_inputs, is_stateful, ref_inputs,
// no_gradient, infer, grad).
#define GRAPH_OP(name_, lo, hi, stateful, refs, nograd, infer_, grad_) \
    {name_, lo, hi, stateful, refs, nograd, infer_, grad_}

// The op definition named type, or NULL.
const graph_op_def *graph_op_lookup(const char *type);
// Op tables kept in their own files: set *defs to the table and return its length.
int graph_collective_op_defs(const graph_op_def **defs);   // op_defs_collective.c
// One LocalAllReduce group (dg_local_all_reduce): node r on devices[r] reads xs[r]; out[r] its
// output; mean: the mean, else the sum. false with the graph's error set. op_defs_collective.c
bool graph_local_all_reduce(dg_graph *g, const char *name, const dg_output *xs, const char *const *devices, int n,
                            bool mean, dg_output *out);
// Links the LocalAllReduce nodes among the first n_nodes of g by group (one "shared_name") in
// rings: next[id] is the group's next member (itself when alone), -1 for every other node.
// next holds n_nodes entries. op_defs_collective.c
void graph_local_all_reduce_rings(dg_graph *g, int n_nodes, int *next);
int graph_sync_op_defs(const graph_op_def **defs);         // op_defs_sync.c
int graph_nn_op_defs(const graph_op_def **defs);           // op_defs_nn.c
int graph_array_op_defs(const graph_op_def **defs);        // op_defs_array.c
int graph_sparse_op_defs(const graph_op_def **defs);       // op_defs_sparse.c
int graph_transformer_op_defs(const graph_op_def **defs);  // op_defs_transformer.c
// TensorFlow's _compute_fans of a variable of shape s (ops.c): its initializers' fan in and out.
void graph_compute_fans(dg_shape s, double *fan_in, double *fan_out);
// A sparse gradient (TensorFlow's IndexedSlices) of a table of rows rows: values (one row per
// index) added at indices; an UnsortedSegmentSum node marked "_sparse_gradient" (ops_sparse.c).
dg_output graph_sparse_gradient(dg_graph *g, dg_output values, dg_output indices, int64_t rows);
// Whether perm[0..n) is a permutation of 0..n-1 for an input of rank (-1: unknown); false
// with st naming the bad entry.
bool graph_check_perm(const int64_t *perm, int n, int rank, dg_status *st);
// Range's length for start, limit, delta (ints: integer arithmetic's rounding); false with st.
bool graph_range_size(double start, double limit, double delta, bool ints, int64_t *n, dg_status *st);
// How many leading inputs an op takes by reference (variables it reads and writes in place):
// these must share its device. Other variable inputs (Adam's beta powers) are plain reads.
int graph_num_ref_inputs(const dg_node *n);
// Every op definition, for listing.
int graph_num_op_defs(void);
const graph_op_def *graph_op_def_at(int i);
// NumPy broadcasting of two static shapes (unknown dims allowed).
bool graph_broadcast_shapes(dg_shape a, dg_shape b, dg_shape *out, dg_status *st);
// The reduction axes of n (attr "axes", empty: all) against rank r as a bit mask.
bool graph_reduction_mask(const dg_node *n, int r, uint32_t *mask, dg_status *st);
// The current variable scope path ("" at top level) and whether it reuses.
const char *graph_variable_scope(const dg_graph *g, bool *reuse);
// Sets a random op's "seed" (the graph seed, or TensorFlow's default) and "seed2" (seed, or
// when 0 one derived from the node's creation order).
void graph_set_random_seeds(dg_graph *g, dg_node *n, int64_t seed);
// The graph-level random seed.
int64_t graph_random_seed(const dg_graph *g, bool *has_seed);

// ---- builder protocol ----
// Starts a node of op `type` named under the current name scope (name NULL: the type).
// Returns NULL when the graph already holds an error or type is unknown (error recorded).
// Mixed precision's casts, one per (x, dtype) in the graph: the one made for x to `to`, or
// the null output; and the record of a new one (ops.c's cast_shared).
dg_output graph_cast_lookup(const dg_graph *g, dg_output x, dg_dtype to);
void graph_cast_remember(dg_graph *g, dg_output x, dg_output cast);
// The mixed-precision rewrite (mixed_precision.c): how many of the graph's nodes it has seen;
// x's cast to `to` (a Cast named after x, on x's requested device, outside every scope, marked
// GRAPH_MIXED_CAST, made once and shared like graph_cast_lookup's; with ctrl_from, a cast of
// its own that waits for ctrl_from's control inputs, for a reader that must see x after them);
// and the nodes from `from` on put in the given order (a permutation of them; their ids follow).
int graph_rewritten(const dg_graph *g);
void graph_set_rewritten(dg_graph *g, int n);
// Whether dg_graph_set_mixed_precision's builders made casts in g.
bool graph_has_builder_casts(const dg_graph *g);
dg_output graph_insert_cast(dg_graph *g, dg_output x, dg_dtype to, const dg_node *ctrl_from);
void graph_reorder_tail(dg_graph *g, int from, dg_node *const *order);
// Whether an op's CPU kernel computes in bfloat16 and float16 as well (op_defs.c; the kernels
// go through float32, executor/cpu/kernels_16.c), and the list of them.
bool graph_op_computes_16(const char *op);
int graph_ops_16(const char *const **names);
dg_node *graph_begin(dg_graph *g, const char *type, const char *name);
// Same, with the exact full name (no scope, no uniquifying); an existing name is an error.
dg_node *graph_begin_absolute(dg_graph *g, const char *type, const char *full_name);
void graph_add_input(dg_node *n, dg_output in);
void graph_set_attr_int(dg_node *n, const char *name, int64_t v);
void graph_set_attr_float(dg_node *n, const char *name, double v);
void graph_set_attr_bool(dg_node *n, const char *name, bool v);
void graph_set_attr_type(dg_node *n, const char *name, dg_dtype v);
void graph_set_attr_shape(dg_node *n, const char *name, dg_shape v);
void graph_set_attr_string(dg_node *n, const char *name, const char *v);
void graph_set_attr_ints(dg_node *n, const char *name, const int64_t *v, int count);
// Takes a new reference to t.
void graph_set_attr_tensor(dg_node *n, const char *name, dg_tensor *t);
// Validates the inputs, infers outputs, applies scopes and device functions, and adds the
// node. On failure the node is discarded, the error recorded, and NULL returned.
dg_node *graph_finish(dg_node *n);

const graph_attr *graph_node_attr(const dg_node *n, const char *name);
// Sets the output count and allocates dtype/shape arrays (shapes unknown).
bool graph_set_num_outputs(dg_node *n, int count, dg_status *st);
void graph_set_output(dg_node *n, int i, dg_dtype dtype, dg_shape shape);
// A copy of s owned by g, the same pointer for equal strings, valid until dg_graph_free.
const char *graph_intern(dg_graph *g, const char *s);
// Sets a string attribute to an interned value (no copy).
void graph_set_attr_string_interned(dg_node *n, const char *name, const char *interned);
// Adds a node of type def named name (must be unused: else NULL and a sticky error) without
// inputs, attributes or inference; the caller fills it in. The partitioner's _Send/_Recv.
// n_attrs sizes the attribute array.
dg_node *graph_insert_raw(dg_graph *g, const graph_op_def *def, const char *name, int n_attrs);
// Sets the placer's choice for n.
void graph_set_assigned_device(dg_node *n, const char *device);
// Records an error on g naming node n: "node \"<name>\" (<op>): <message>".
void graph_node_error(dg_graph *g, const dg_node *n, dg_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Pushes a name scope whose prefix is exactly full (no uniquifying); pop with
// dg_graph_pop_name_scope.
void graph_push_absolute_scope(dg_graph *g, const char *full);
// Pushes a variable scope of the current one's name that reuses variables (dg_get_variable
// finds them), and the current name scope again; pop with dg_graph_pop_variable_scope.
void graph_push_variable_reuse(dg_graph *g);
// Builds a node of `type` with the given inputs and no attributes; the null output on error.
dg_output graph_build(dg_graph *g, const char *type, const char *name, const dg_output *ins,
                      int n_ins);

// Adds a shadow copy of src to g with the given inputs: it shares src's name, attributes,
// outputs and colocation (src must outlive g), without validation or shape inference: the
// partitioner's building block. Inputs may refer to nodes of other graphs (fed outputs).
// Control inputs are not copied.
dg_node *graph_insert_copy(dg_graph *g, const dg_node *src, const dg_output *inputs, int n_inputs);

// ints attribute helper: pointer and count, NULL if absent.
const int64_t *graph_node_attr_ints(const dg_node *n, const char *name, int *count);

#endif
