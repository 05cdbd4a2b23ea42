/* Builders of the embedding and sparse ops of op_defs_sparse.c (distgraph/embedding.h), and
 * the sparse gradient: an UnsortedSegmentSum node marked "_sparse_gradient". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"

static const dg_output NULL_OUT = {NULL, 0};

static dg_output build(dg_graph *g, const char *type, const char *name, const dg_output *ins, int n) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    for (int i = 0; i < n; i++)
        if (!ins[i].node) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": input %d is the null output", type,
                               name ? name : type, i);
            return NULL_OUT;
        }
    return graph_build(g, type, name, ins, n);
}

dg_output dg_gather(dg_graph *g, const char *name, dg_output params, dg_output indices) {
    dg_output ins[2] = {params, indices};
    return build(g, "Gather", name, ins, 2);
}

dg_output dg_embedding_lookup(dg_graph *g, const char *name, dg_output params, dg_output ids) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    if (!params.node) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "embedding_lookup \"%s\": params is the null output",
                           name ? name : "embedding_lookup");
        return NULL_OUT;
    }
    dg_graph_push_colocate_with(g, params.node);
    dg_output o = dg_gather(g, name ? name : "embedding_lookup", params, ids);
    dg_graph_pop_colocate_with(g);
    return o;
}

dg_output dg_unsorted_segment_sum(dg_graph *g, const char *name, dg_output data, dg_output segment_ids,
                                  int64_t num_segments) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    if (num_segments < 0) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "unsorted_segment_sum \"%s\": num_segments %lld < 0",
                           name ? name : "UnsortedSegmentSum", (long long)num_segments);
        return NULL_OUT;
    }
    dg_output ins[3] = {data, segment_ids, dg_const_i64s(g, NULL, &num_segments, 1)};
    // A vector of one: the kernel reads its first element as TensorFlow's scalar.
    return build(g, "UnsortedSegmentSum", name, ins, 3);
}

dg_output graph_sparse_gradient(dg_graph *g, dg_output values, dg_output indices, int64_t rows) {
    dg_output o = dg_unsorted_segment_sum(g, "IndexedSlices", values, indices, rows);
    if (o.node) graph_set_attr_bool(o.node, "_sparse_gradient", true);
    return o;
}

bool dg_gradient_is_sparse(dg_output grad, dg_output *values, dg_output *indices) {
    bool sparse = false;
    if (!grad.node || strcmp(dg_node_op_type(grad.node), "UnsortedSegmentSum") != 0 ||
        !dg_node_attr_bool(grad.node, "_sparse_gradient", &sparse) || !sparse)
        return false;
    if (values) *values = grad.node->inputs[0];
    if (indices) *indices = grad.node->inputs[1];
    return true;
}

static dg_output scatter(dg_graph *g, const char *type, const char *name, dg_output ref, dg_output indices,
                         dg_output updates) {
    dg_output ins[3] = {ref, indices, updates};
    return build(g, type, name, ins, 3);
}

dg_output dg_scatter_add(dg_graph *g, const char *name, dg_output ref, dg_output indices, dg_output updates) {
    return scatter(g, "ScatterAdd", name, ref, indices, updates);
}
dg_output dg_scatter_sub(dg_graph *g, const char *name, dg_output ref, dg_output indices, dg_output updates) {
    return scatter(g, "ScatterSub", name, ref, indices, updates);
}
dg_output dg_scatter_update(dg_graph *g, const char *name, dg_output ref, dg_output indices, dg_output updates) {
    return scatter(g, "ScatterUpdate", name, ref, indices, updates);
}

dg_output dg_embedding_lookup_sharded(dg_graph *g, const char *name, const dg_output *parts, int n_parts,
                                      dg_output ids, dg_partition_strategy strategy) {
    if (!g || !dg_graph_ok(g)) return NULL_OUT;
    const char *nm = name ? name : "embedding_lookup";
    if (n_parts < 1 || n_parts > 4096 || !parts || !ids.node ||
        (strategy != DG_PARTITION_MOD && strategy != DG_PARTITION_DIV)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "embedding_lookup \"%s\": needs 1 to 4096 parts, ids and a "
                           "strategy (mod or div)", nm);
        return NULL_OUT;
    }
    if (n_parts == 1) return dg_embedding_lookup(g, name, parts[0], ids);
    // The parts' rows, and one row shape for all.
    int64_t *offsets = calloc((size_t)n_parts + 1, sizeof *offsets);
    if (!offsets) abort();
    dg_shape row0 = dg_output_shape(parts[0]);
    for (int k = 0; k < n_parts && dg_graph_ok(g); k++) {
        dg_shape s = parts[k].node ? dg_output_shape(parts[k]) : dg_shape_unknown();
        bool same = s.rank == row0.rank && s.rank >= 1 && dg_output_dtype(parts[k]) == dg_output_dtype(parts[0]);
        for (int d = 1; same && d < s.rank; d++) same = s.dims[d] == row0.dims[d] && s.dims[d] >= 0;
        if (!same || s.dims[0] < 0) {
            char a[128], b[128];
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "embedding_lookup \"%s\": part %d has shape %s, part 0 %s: "
                               "parts need known shapes, one dtype and one row shape", nm, k,
                               dg_shape_str(&s, a, sizeof a), dg_shape_str(&row0, b, sizeof b));
            break;
        }
        offsets[k + 1] = offsets[k] + s.dims[0];
    }
    dg_output out = NULL_OUT;
    if (dg_graph_ok(g)) {
        dg_graph_push_name_scope(g, nm);
        dg_node *route = graph_begin(g, "EmbeddingPartitionIds", "partition_ids");
        if (route) {
            graph_add_input(route, ids);
            graph_set_attr_ints(route, "offsets", offsets, n_parts + 1);
            graph_set_attr_string(route, "partition_strategy", strategy == DG_PARTITION_MOD ? "mod" : "div");
            route = graph_finish(route);
        }
        dg_node *pid = NULL, *ppos = NULL;
        if (route) {
            dg_output in_id[2] = {{route, 1}, {route, 0}}, in_pos[2] = {{route, 2}, {route, 0}};
            pid = graph_begin(g, "DynamicPartition", "partition_ids_split");
            if (pid) {
                graph_add_input(pid, in_id[0]);
                graph_add_input(pid, in_id[1]);
                graph_set_attr_int(pid, "num_partitions", n_parts);
                pid = graph_finish(pid);
            }
            ppos = pid ? graph_begin(g, "DynamicPartition", "positions_split") : NULL;
            if (ppos) {
                graph_add_input(ppos, in_pos[0]);
                graph_add_input(ppos, in_pos[1]);
                graph_set_attr_int(ppos, "num_partitions", n_parts);
                ppos = graph_finish(ppos);
            }
        }
        dg_output *stitch = calloc((size_t)n_parts * 2, sizeof *stitch);
        if (!stitch) abort();
        for (int k = 0; ppos && k < n_parts && dg_graph_ok(g); k++) {
            char b[64];
            snprintf(b, sizeof b, "gather_%d", k);
            stitch[k] = (dg_output){ppos, k};
            stitch[n_parts + k] = dg_embedding_lookup(g, b, parts[k], (dg_output){pid, k});
        }
        dg_output merged = dg_graph_ok(g) ? graph_build(g, "DynamicStitch", "stitch", stitch, 2 * n_parts) : NULL_OUT;
        free(stitch);
        // Back to ids' shape + the row shape.
        dg_shape is = dg_output_shape(ids);
        if (merged.node && is.rank >= 0 && is.rank + row0.rank - 1 <= DG_MAX_RANK) {
            int64_t shape[DG_MAX_RANK];
            bool known = true;
            for (int d = 0; d < is.rank; d++) known &= (shape[d] = is.dims[d]) >= 0 || is.rank == 1;
            if (is.rank == 1) shape[0] = -1;
            for (int d = 1; d < row0.rank; d++) shape[is.rank + d - 1] = row0.dims[d];
            out = known ? dg_reshape(g, NULL, merged, shape, is.rank + row0.rank - 1) : merged;
        } else {
            out = merged;
        }
        dg_graph_pop_name_scope(g);
    }
    free(offsets);
    return dg_graph_ok(g) ? out : NULL_OUT;
}
