/* Graph files: a graph as msgpack bytes and back, in memory or in a file.
 * A file holds every node in creation order (so inputs come before their consumers) with its
 * op, inputs, control inputs, requested and assigned device, colocation list and attributes.
 * Loading rebuilds each node through the ordinary builders, so shape inference and every
 * other check run again; a file is untrusted input and bad bytes never crash the loader.
 * Functions here keep no state: they may run on several threads (on different graphs). */
#ifndef DISTGRAPH_SERIALIZE_H
#define DISTGRAPH_SERIALIZE_H

#include <stdbool.h>
#include <stddef.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Format version written by this build; the loader reads exactly this version.
#define DG_GRAPH_FILE_VERSION 1
// Loader limits: bigger buffers or files, or more nodes, are INVALID_ARGUMENT.
#define DG_GRAPH_FILE_MAX_BYTES ((size_t)1 << 30)
#define DG_GRAPH_FILE_MAX_NODES 50000000

// The file is one msgpack map; "format" must be its first key (the magic):
//   {"format": "distgraph-graph", "version": 1, "random_seed": int (optional),
//    "nodes": [{"name": str, "op": str,
//               "inputs": ["name" | "name:idx" | [name, idx], ...],
//               "control_inputs": [name, ...],    // may name later nodes (cycles load)
//               "device": str,                    // requested, "" if none
//               "assigned_device": str,           // optional: the placer's choice
//               "colocation": [name, ...],
//               "attrs": {name: {kind: value}},
//               "initializer": name}, ...],      // optional: a variable's Assign
//    "collections": {name: [node name, ...]}}     // optional
// Attribute kinds: "int" int64, "float" float64, "bool", "type" dtype name ("float32"),
// "shape" [dims] (-1: unknown dimension) or nil (unknown rank), "string", "ints" [int64],
// "tensor" {"dtype": name, "shape": [dims], "data": bin, little-endian elements}.
// Only the nodes and the built-in collections (DG_GLOBAL_VARIABLES, DG_TRAINABLE_VARIABLES,
// DG_GLOBAL_STEP, DG_SUMMARIES) are written; scopes and device functions are not.

// Serializes g. A graph holding a sticky builder error, or a node whose input belongs to
// another graph (a partition's fed input), is FAILED_PRECONDITION / INVALID_ARGUMENT.
// Returns: *buf new, caller frees with free(); false (buf untouched) on error.
bool dg_graph_to_msgpack(const dg_graph *g, char **buf, size_t *len, dg_status *st);

// Builds a new graph from len bytes of buf. Malformed input is INVALID_ARGUMENT naming the
// node index, name and field (`graph file: node 3 ("dense/MatMul"): attr "transpose_a":
// expected bool, got int`); truncated input or a wrong magic is DATA_LOSS.
// Borrows buf for the call. Returns: new, caller frees with dg_graph_free(); NULL on error.
dg_graph *dg_graph_from_msgpack(const void *buf, size_t len, dg_status *st);

// dg_graph_to_msgpack into a file, written to a temporary file in the same directory and
// renamed over path, so readers never see half a file. I/O errors name the path.
bool dg_graph_save(const dg_graph *g, const char *path, dg_status *st);
// dg_graph_from_msgpack of a file's contents; errors are prefixed with the path. A missing
// file is NOT_FOUND. Returns: new, caller frees with dg_graph_free(); NULL on error.
dg_graph *dg_graph_load(const char *path, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
