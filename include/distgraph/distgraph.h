/* distgraph: distributed dataflow graphs in C. The one header users include.
 *
 * The C contract (every public header keeps it; tests/runtime/test_contract.c and
 * tests/smoke/abi_symbols.sh hold parts of it):
 * - Objects are opaque, made by dg_<type>_new (or a named maker: _from_json, _copy, _load) and
 *   released by dg_<type>_free(&p), which is NULL-safe and sets p to NULL. Tensors are
 *   reference counted: dg_tensor_ref/dg_tensor_unref (dg_tensor_free(&t) drops one).
 * - Ownership: each function returning a pointer says "Returns: new ..." (the caller frees it
 *   as said) or "Returns: borrowed ..." (and until when it stays valid). Arguments are
 *   borrowed for the call unless the comment says otherwise.
 * - Errors, one channel per family: calls that can fail for a reason other than building a
 *   graph take `dg_status *st` last and return a testable value (NULL, false, -1); a call that
 *   succeeds leaves st OK whatever it held before (TensorFlow's convention). Graph builders
 *   (ops.h, train.h, the builders of graph.h and collective.h) take no status: their first
 *   failure is recorded in the graph, later builders do nothing, and dg_graph_check /
 *   dg_graph_status read it. Strategy and sync-replica builders, which also fail on their
 *   arguments, report through their status like every other fallible call; a failure met
 *   while building is in the graph as well.
 * - Process-wide settings are functions (dg_set_malloc_tuning), never options of one object.
 * - Headers follow the layers: graph (status, tensor, graph, ops, partitioned, train, pipeline,
 *   tensor_parallel, strategy,
 *   sync_replicas, collective, device_name, serialize, version) <- cluster (cluster_spec,
 *   server_def, tf_config, slurm; cluster includes the four) <- placer (device_setter,
 *   placer) <- executor (trace_event: the events it notes in a traced step,
 *   types only) <- runtime (session, server, checkpoint, monitored_session, distribute,
 *   trace, dataset); a header declares functions of its own layer and includes none to its right.
 * - The shared library exports exactly the functions of these headers (abi/distgraph.symbols);
 *   version.h gives the version, and the SONAME changes when the interface breaks. */
#ifndef DISTGRAPH_DISTGRAPH_H
#define DISTGRAPH_DISTGRAPH_H

#include "distgraph/version.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"
#include "distgraph/graph.h"
#include "distgraph/ops.h"
#include "distgraph/partitioned.h"
#include "distgraph/train.h"
#include "distgraph/pipeline.h"
#include "distgraph/tensor_parallel.h"
#include "distgraph/embedding.h"
#include "distgraph/strategy.h"
#include "distgraph/session.h"
#include "distgraph/device_name.h"
#include "distgraph/cluster.h"
#include "distgraph/device_setter.h"
#include "distgraph/placer.h"
#include "distgraph/auto_place.h"
#include "distgraph/serialize.h"
#include "distgraph/server.h"
#include "distgraph/checkpoint.h"
#include "distgraph/monitored_session.h"
#include "distgraph/summary.h"
#include "distgraph/sync_replicas.h"
#include "distgraph/collective.h"
#include "distgraph/distribute.h"
#include "distgraph/elastic.h"
#include "distgraph/dataset.h"

#endif
