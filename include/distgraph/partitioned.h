/* Partitioned variables: TensorFlow's tf.compat.v1 partitioners and get_variable(partitioner=).
 * One logical variable NAME of shape [rows, ...] is held by n ordinary variables
 * "NAME/part_0" ... "NAME/part_<n-1>", each a run of rows in order, so device functions (the
 * replica device setter) spread the parts like any variables. Each part carries TensorFlow's
 * save-slice information as node attributes, and checkpoints store the parts as slices of NAME:
 * a graph with another number of parts (or none) restores from them. Builders follow the
 * graph's error rule (ops.h): the first failure is recorded in the graph. */
#ifndef DISTGRAPH_PARTITIONED_H
#define DISTGRAPH_PARTITIONED_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/ops.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_MAX_PARTITIONS 64

// How many parts a variable gets; make one with a function below (a zeroed struct is not a
// partitioner). Both partition along axis 0 only.
typedef struct dg_partitioner {
    int kind;                  // private
    int64_t num_shards;        // fixed size: the number of shards asked for
    int64_t max_partitions;    // min/max: the upper bound on parts
    int64_t min_slice_bytes;   // min/max: the least bytes per part
} dg_partitioner;

// tf.compat.v1.fixed_size_partitioner(num_shards, axis=0): min(num_shards, rows) parts (as
// TensorFlow: a variable of fewer rows than shards gets one row per part). num_shards must be
// 1 to DG_MAX_PARTITIONS.
dg_partitioner dg_fixed_size_partitioner(int64_t num_shards);
// tf.compat.v1.min_max_variable_partitioner(max_partitions, axis=0, min_slice_size):
// max(1, min(rows, max_partitions, ceil(bytes / min_slice_bytes))) parts, bytes being the whole
// variable's (elements times the dtype's size). Both arguments must be >= 1 (TensorFlow takes
// max_partitions < 1 as 1 and fails on min_slice_size 0), and the result at most
// DG_MAX_PARTITIONS.
dg_partitioner dg_min_max_variable_partitioner(int64_t max_partitions, int64_t min_slice_bytes);

// The number of parts p gives a variable of dtype and shape; -1 with INVALID_ARGUMENT in st
// when p cannot split it: rank 0 or a shape not fully defined, an invalid dtype, a fixed
// partitioner asked for fewer than 1 or more than DG_MAX_PARTITIONS shards or given 0 rows,
// a min/max partitioner with an argument below 1 or a result above DG_MAX_PARTITIONS.
int dg_partitioner_num_parts(dg_partitioner p, dg_dtype dtype, dg_shape shape, dg_status *st);

typedef struct dg_partitioned_variable {
    int n;                                   // number of parts; 0 after an error
    dg_output parts[DG_MAX_PARTITIONS];      // VariableV2 outputs "NAME/part_0" ... in row order
    int64_t offsets[DG_MAX_PARTITIONS + 1];  // first row of each part along axis 0; offsets[n] = rows
    dg_shape full_shape;
    dg_dtype dtype;
} dg_partitioned_variable;

// A partitioned variable "<variable scope>/name" (as dg_get_variable) of full_shape, split by
// p along axis 0 as TensorFlow does: of n parts, the first rows % n get rows / n + 1 rows, the
// others rows / n. Each part is a trainable variable of dg_get_variable named "name/part_<i>"
// with the initializer for its own shape: a DG_INIT_TENSOR value must have full_shape and
// dtype (each part gets its rows); glorot/he scale by the full shape's fans (TensorFlow's
// partition_info); random initializers with a seed give part 0 that seed and part i > 0 a
// seed derived from it and i (TensorFlow gives every part the same seed: equal parts draw
// equal values), seed 0 draws a fresh seed per part. Each part's VariableV2 carries the
// attributes "_save_slice_full_name" (string: the full name), "_save_slice_full_shape"
// (shape) and "_save_slice_offset" (ints: its first index in each dimension).
// With reuse on in the variable scope it returns the existing parts, which must have this
// full shape, dtype and number of parts. Errors (recorded in the graph, naming the variable;
// n is then 0): those of dg_partitioner_num_parts, a name in use, reuse of a missing or
// different partitioned variable, a bad DG_INIT_TENSOR value.
dg_partitioned_variable dg_partitioned_variable_new(dg_graph *g, const char *name, dg_dtype dtype,
                                                    dg_shape full_shape, dg_initializer init,
                                                    dg_partitioner p);

// Where a variable lies in a larger one (its save-slice attributes): the region
// [offset[d], offset[d] + shape[d]) of full_name's full_shape in each dimension d.
typedef struct dg_variable_slice {
    const char *full_name;          // borrowed, valid until dg_graph_free()
    dg_shape full_shape;
    int64_t offset[DG_MAX_RANK];    // first index in each dimension of full_shape
} dg_variable_slice;

// Reads var's save-slice attributes into *out. Returns 1 when var is a VariableV2 carrying
// them, 0 when it carries none (or is not a variable), -1 with INVALID_ARGUMENT naming the
// node when they are malformed (a missing or empty part, a rank or a region that does not fit
// the variable's shape).
int dg_variable_save_slice(const dg_node *var, dg_variable_slice *out, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
