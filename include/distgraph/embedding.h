/* Embeddings and sparse updates, as TensorFlow's: gathering rows of a table, gradients that
 * are rows rather than whole tables (IndexedSlices), sparse optimizer updates and scatter ops
 * on variables, and lookups over a table split into shards (embedding_lookup with the "mod"
 * and "div" partition strategies).
 *
 * The gradient of a gather with respect to its table is sparse: dg_gradients returns the
 * output of an UnsortedSegmentSum(values, indices, rows) node. Run, that node gives the dense
 * gradient, so any reader gets the right value; dg_gradient_is_sparse gives its rows and
 * indices instead, and the optimizers (gradient descent, Adagrad, Adam) apply only those rows
 * on the variable's device, so only the rows a step touches are computed and sent. Several
 * lookups of one table add their rows together (indices repeated as often as they occur). */
#ifndef DISTGRAPH_EMBEDDING_H
#define DISTGRAPH_EMBEDDING_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

// tf.gather(params, indices) along axis 0: shape indices' shape + params' shape[1:]. indices
// int32 or int64; an index outside [0, rows) fails the run with a status naming the node, the
// position and the index.
dg_output dg_gather(dg_graph *g, const char *name, dg_output params, dg_output indices);

// tf.nn.embedding_lookup(params, ids) for one table: a gather placed with params (on a
// parameter server the ids travel there and only the rows come back).
dg_output dg_embedding_lookup(dg_graph *g, const char *name, dg_output params, dg_output ids);

typedef enum dg_partition_strategy {
    DG_PARTITION_MOD = 0,   // id i lives in shard i % n, row i / n
    DG_PARTITION_DIV = 1,   // ids split into n contiguous ranges, the first (rows % n) one longer
} dg_partition_strategy;

// tf.nn.embedding_lookup(parts, ids, partition_strategy) over a table split along its first
// axis into n_parts shards of one dtype and row shape (a partitioned variable's parts, in
// order; their shapes known when built). Each shard's gather is
// placed with the shard; the routing and the final stitch where the lookup is built. An id
// outside [0, total rows) fails the run with a status naming the node and the id.
dg_output dg_embedding_lookup_sharded(dg_graph *g, const char *name, const dg_output *parts, int n_parts,
                                      dg_output ids, dg_partition_strategy strategy);

// tf.math.unsorted_segment_sum: out[segment_ids[i]] += data[i] (rows), num_segments rows.
dg_output dg_unsorted_segment_sum(dg_graph *g, const char *name, dg_output data, dg_output segment_ids,
                                  int64_t num_segments);

// tf.compat.v1.scatter_add / scatter_sub / scatter_update: rows of variable ref at indices
// changed in place by updates (shape indices' shape + the row shape). Repeated indices add
// (scatter_update: one of them wins). Returns the variable after the update.
dg_output dg_scatter_add(dg_graph *g, const char *name, dg_output ref, dg_output indices, dg_output updates);
dg_output dg_scatter_sub(dg_graph *g, const char *name, dg_output ref, dg_output indices, dg_output updates);
dg_output dg_scatter_update(dg_graph *g, const char *name, dg_output ref, dg_output indices, dg_output updates);

// Whether grad (from dg_gradients or compute_gradients) is sparse; if so, *values (rows) and
// *indices (int64, one per row) when not NULL.
bool dg_gradient_is_sparse(dg_output grad, dg_output *values, dg_output *indices);

#ifdef __cplusplus
}
#endif

#endif
