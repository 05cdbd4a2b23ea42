/* Sessions run a graph: feeds in, fetches out, targets run for their effects.
 * dg_session_new(graph, "local", ...) runs in this process on its devices; with
 * "dg://host:port" it runs on that task's cluster: through the master of a server in this
 * process when one has that address, otherwise through the master service of the task at that
 * address, from any process (the graph travels to it; feeds and fetches travel with each
 * step; the master frees what the session registered when it closes or its client dies).
 * A session caches
 * the pruned, compiled graph per (feeds, fetches, targets) signature, so the first run of a
 * signature compiles and later runs do no set-up work. dg_session_run may be called from
 * several threads at once. The graph must outlive the session and not change while a run is
 * in progress (nodes may be added between runs). */
#ifndef DISTGRAPH_SESSION_H
#define DISTGRAPH_SESSION_H

#include <stdbool.h>

#include "distgraph/graph.h"
#include "distgraph/tensor.h"
#include "distgraph/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_session dg_session;

typedef struct dg_session_options {
    int inter_op_threads;    // threads running independent ops; 0: one per core, 1: inline only
    int intra_op_threads;    // threads inside one op (a large GEMM); 0: DG_INTRA_OP_THREADS where
                             // set (dg-launch shares the host's cores among its tasks with it),
                             // else the cores this process may use
    bool allow_soft_placement;   // default true
    int n_virtual_cpus;      // extra CPU devices (/device:CPU:1 ...) for multi-device tests
    // Print "node: (Op): device" for every node a step places, to this process's standard
    // error, also when the master is another process's (the lines come back with the answer).
    bool log_device_placement;
    // GPU MatMul may use TF32 tensor cores (10-bit mantissa inputs, about 1e-3 relative
    // error; several times faster on A100/H100). Off by default: float32 results then match
    // the CPU to float32 rounding. The setting is process-wide: the last session created wins.
    bool gpu_allow_tf32;
    // Cluster sessions: before a task's first partition is registered, wait until the task
    // answers (servers start in any order), logging every 5 s which task at which address is
    // still awaited. 0: no limit (as TensorFlow); > 0: at most this many ms, then UNAVAILABLE
    // naming the task; < 0: do not wait (the first call fails if the task is not up).
    int64_t wait_for_tasks_ms;
    // Remote sessions (a master in another process) when the cluster uses CurveZMQ: the
    // cluster's key pair (Z85, 40 characters each), both or neither. Neither: the
    // environment's DG_CURVE_PUBLIC_KEY and DG_CURVE_SECRET_KEY when set, as dg-server.
    const char *curve_public_key;
    const char *curve_secret_key;
    // Remote sessions when the cluster has a key directory (docs/SECURITY.md, "Keys"): the
    // client's key pair is DIR/<key_name>.key and each task's public key is found there by
    // its address. key_dir NULL: the environment's DG_KEY_DIR when set (and no DG_CURVE_*
    // pair is); key_name NULL: "client".
    const char *key_dir;
    const char *key_name;
    // Automatic placement (docs/PLACEMENT.md): the first step places the whole graph with
    // dg_auto_place over the session's devices (a cluster's: every task's), honouring requests
    // and colocation; nodes added later are placed by later steps, and a node keeps its device
    // once it has one. Without it a node with no request goes to the first device that matches.
    bool auto_place;
    const char *auto_place_cost_file;   // a calibration (dg-inspect calibrate); NULL: nominal
    int64_t auto_place_unknown_dim;     // what an unknown dimension (the batch) stands for; 0: 32
    // Automatic mixed precision (dg_graph_rewrite_mixed_precision, graph.h; borrowed, copied by
    // dg_session_new): the graph is rewritten when the session is made and, for nodes added
    // since, before a step; a fetch of a value the rewrite made 16-bit returns it in float32,
    // and a float32 feed of one is rounded to its dtype. Build the graph's gradients and updates
    // before the session. Each rewrite that converts nodes says so on standard error. NULL: off.
    const dg_mixed_precision_options *mixed_precision;
} dg_session_options;

dg_session_options dg_session_options_default(void);

// What runs this process's CPU kernels, in one line: the CPU model, the widest vector
// instructions it offers, what runs float32 and float64 GEMM (provider, kernel; marked when
// narrower than the CPU offers, or capped by the environment's DG_MAX_CPU_ISA: avx512, avx2,
// sse41, baseline) and the intra-op threads. Every process that makes a session prints it to
// stderr once ("distgraph: cpu: ..."); dg-inspect cpu prints it. Returns: borrowed, valid on
// this thread until its next call.
const char *dg_cpu_summary(void);

// target: "local" (or "" / NULL) runs in this process. Borrows g until dg_session_free().
// opts may be NULL for the defaults. Returns: new, caller frees with dg_session_free().
dg_session *dg_session_new(dg_graph *g, const char *target, const dg_session_options *opts,
                           dg_status *st);
void dg_session_free(dg_session **s);

// Runs one step. feed_values[i] is the value of feeds[i] (borrowed). fetched[i] receives a
// new reference to the value of fetches[i] (caller releases with dg_tensor_unref); on
// failure no fetched entry is set. targets are run for their side effects.
bool dg_session_run(dg_session *s, const dg_output *feeds, dg_tensor *const *feed_values,
                    int n_feeds, const dg_output *fetches, dg_tensor **fetched, int n_fetches,
                    dg_node *const *targets, int n_targets, dg_status *st);

// dg_session_run with options (NULL: none). With ro->trace, *trace (trace may be NULL to
// drop it) receives a timeline of the step (distgraph/trace.h; caller frees with
// dg_step_trace_free), also when the step failed part way; NULL when nothing was recorded.
bool dg_session_run_with_options(dg_session *s, const dg_run_options *ro, const dg_output *feeds,
                                 dg_tensor *const *feed_values, int n_feeds, const dg_output *fetches,
                                 dg_tensor **fetched, int n_fetches, dg_node *const *targets, int n_targets,
                                 dg_step_trace **trace, dg_status *st);

// Convenience: runs a single target node.
bool dg_session_run_target(dg_session *s, dg_node *target, dg_status *st);

// TensorFlow's Session.reset: the master at target ("dg://host:port") closes its sessions and
// every task of its cluster drops its variables' values and shared objects (queues,
// accumulators), so the next client starts afresh. opts may be NULL (it gives the CurveZMQ
// keys). Sessions of other clients on that cluster fail afterwards.
bool dg_session_reset(const char *target, const dg_session_options *opts, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
