/* One API for every way distgraph trains a model over several devices or tasks (TensorFlow's
 * tf.distribute strategies, written as the between-graph programs distgraph runs). A program:
 *
 *   1. makes a dg_distribution for its process: the kind of distribution, and for the kinds
 *      that span a cluster the cluster and this process's task (or TF_CONFIG). A ps task only
 *      serves (dg_distribution_join);
 *   2. writes its model once, as a dg_model_fn that creates its variables with
 *      dg_replica_variable and returns its loss (and any other scalars, such as an accuracy);
 *   3. builds the training step with dg_distribution_minimize, which puts the variables where
 *      the kind says, builds the replicas, and reduces and applies the gradients;
 *   4. trains under dg_distribution_session_new, a monitored session whose roles (who
 *      initializes, restores, broadcasts, saves and writes summaries), stop step and hooks the
 *      distribution sets, running dg_distribution_run until the session should stop.
 *
 * Changing the distribution is changing the kind (examples/strategies.c, docs/GUIDE.md).
 * Main objects: dg_distribution (one per process), dg_replica (what a model function sees).
 * Threads: build and run from one thread; dg_distribution_run may be called as
 * dg_monitored_session_run may. */
#ifndef DISTGRAPH_DISTRIBUTE_H
#define DISTGRAPH_DISTRIBUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/cluster.h"
#include "distgraph/graph.h"
#include "distgraph/monitored_session.h"
#include "distgraph/ops.h"
#include "distgraph/server.h"
#include "distgraph/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_distribution_kind {
    // One process; one replica per device of it (num_devices of device_type), a copy of every
    // variable on every device kept equal (TensorFlow's MirroredStrategy).
    DG_DISTRIBUTE_MIRRORED = 0,
    // One process; one replica per device, every variable once on its CPU
    // (CentralStorageStrategy).
    DG_DISTRIBUTE_CENTRAL_STORAGE = 1,
    // The tasks of the "worker" job, one replica each: every worker holds every variable, the
    // gradients are averaged by all-reduce, worker 0's values are broadcast after every
    // session creation (MultiWorkerMirroredStrategy). No ps tasks.
    DG_DISTRIBUTE_MULTI_WORKER_MIRRORED = 2,
    // The variables on the "ps" tasks (the replica device setter), every worker applies its
    // own gradients when it has them: asynchronous training (parameter servers).
    DG_DISTRIBUTE_PARAMETER_SERVER = 3,
    // The variables on the ps tasks; each step averages replicas_to_aggregate workers'
    // gradients (TensorFlow 1's SyncReplicasOptimizer).
    DG_DISTRIBUTE_SYNC_REPLICAS = 4,
    // TensorFlow 2's ParameterServerStrategy with a ClusterCoordinator: the variables on the ps
    // tasks, the worker tasks only serve, and one coordinator process (the "chief" task) runs
    // the program: each dg_distribution_run queues a training step that runs on whichever
    // worker is free, so the workers train asynchronously. A step whose worker fails runs
    // again on another (at least once); a worker that comes back takes work again.
    DG_DISTRIBUTE_PS_COORDINATOR = 5,
} dg_distribution_kind;

// "mirrored", "central_storage", "multi_worker_mirrored", "parameter_server",
// "sync_replicas", "ps_coordinator". Returns: static.
const char *dg_distribution_kind_name(dg_distribution_kind kind);
// The kind of one of those names; INVALID_ARGUMENT listing them for anything else.
bool dg_distribution_kind_parse(const char *name, dg_distribution_kind *out, dg_status *st);

typedef struct dg_distribution_options {
    dg_distribution_kind kind;
    // The kinds that span a cluster: the cluster (borrowed for the call; NULL: from slurm when
    // set, else TF_CONFIG) and this process's task in it (job_name NULL: the task Slurm or
    // TF_CONFIG gives).
    const dg_cluster *cluster;
    const char *job_name;           // "worker" or "ps"; "chief" for ps_coordinator's coordinator
    int task_index;
    const dg_server_options *server_options;   // NULL: the defaults
    // The one-process kinds: the devices (device_type NULL: "CPU"; extra CPUs are virtual).
    const char *device_type;
    int num_devices;                // default 2
    // Sync replicas: gradients averaged per step (0: every worker's).
    int replicas_to_aggregate;
    // How long a collective (all-reduce, broadcast) or a synchronous step waits for a peer
    // before failing with DEADLINE_EXCEEDED naming it; 0: 60000.
    int64_t peer_timeout_ms;
    // The cluster kinds: the cluster and task from the Slurm job step this process runs in
    // (srun), as dg_slurm_from_env resolves them with these options (jobs "ps:1,worker:2");
    // borrowed for the call. NULL: not from Slurm. Ignored when cluster is set.
    const dg_slurm_options *slurm;
} dg_distribution_options;

// The kind's options: num_devices 2, everything else zero (the cluster from TF_CONFIG).
dg_distribution_options dg_distribution_options_default(dg_distribution_kind kind);

typedef struct dg_distribution dg_distribution;

// The distribution of this process. The kinds that span a cluster start this task's server
// (dg_server_new) and check the cluster: a ps job for the parameter-server kinds, none for
// multi-worker mirrored, this task among them (INVALID_ARGUMENT naming what is missing).
// ps_coordinator's coordinator (job "chief", which the cluster may list or not) starts no
// server: it is a client of the workers' and the ps tasks' masters.
// Returns: new, caller frees with dg_distribution_free() after the session of its graph and
// before that graph; NULL with st set.
dg_distribution *dg_distribution_new(const dg_distribution_options *o, dg_status *st);
void dg_distribution_free(dg_distribution **d);

dg_distribution_kind dg_distribution_get_kind(const dg_distribution *d);
// A ps task: it holds variables and serves (dg_distribution_join); it builds no model.
bool dg_distribution_is_ps(const dg_distribution *d);
// A task that only serves until stopped (dg_distribution_join) and builds no model: a ps
// task, or a worker of ps_coordinator (the coordinator runs the steps there).
bool dg_distribution_only_serves(const dg_distribution *d);
// The chief: worker 0, ps_coordinator's coordinator, or the one process of the one-process
// kinds. It restores and saves checkpoints and writes summaries.
bool dg_distribution_is_chief(const dg_distribution *d);
// Replicas whose gradients one step averages: the devices (one-process kinds), the workers
// (multi-worker mirrored), replicas_to_aggregate (sync replicas), 1 (the asynchronous kinds).
int dg_distribution_num_replicas_in_sync(const dg_distribution *d);
// This process's index among the workers (0 for the one-process kinds; -1 on a ps task and
// on ps_coordinator's coordinator) and their number.
int dg_distribution_worker_index(const dg_distribution *d);
int dg_distribution_num_workers(const dg_distribution *d);
// This task's server (NULL for the one-process kinds). Returns: borrowed.
dg_server *dg_distribution_server(const dg_distribution *d);
// A ps task serves until a signal (SIGTERM, SIGINT) stops it, as dg_server_join.
bool dg_distribution_join(dg_distribution *d, dg_status *st);

// ---- the model, written once ----
typedef struct dg_replica dg_replica;

// The model function's variable: created by the first replica (where the distribution puts
// it: the ps tasks, this worker, every device, or this process's CPU), found by the later
// ones, which must create the same variables in the same order. Returns it as this replica
// reads it: its own copy, or the one variable. Errors (another name, dtype or shape than the
// first replica's; a builder error) go to the graph's sticky status; the null output then.
dg_output dg_replica_variable(dg_replica *r, const char *name, dg_dtype dtype, dg_shape shape,
                              dg_initializer init);
// This replica's index (0 .. replicas in this process - 1) and graph.
int dg_replica_id(const dg_replica *r);
dg_graph *dg_replica_graph(const dg_replica *r);

// Builds the model for one replica on its inputs (its share of the batch inputs), under the
// replica's device: outputs[0] its scalar mean loss, outputs[1 .. n_outputs-1] other float
// scalars to report (each a mean over the replica's examples, as an accuracy). Returns false
// (or leaves an output null) after a builder error. The distribution may call it more than
// once per replica (a first call creates the variables), so it must only build.
typedef bool (*dg_model_fn)(dg_replica *r, const dg_output *inputs, void *ctx, dg_output *outputs,
                            int n_outputs);

#define DG_DISTRIBUTE_MAX_OUTPUTS 8

typedef struct dg_distributed_step {
    dg_node *train;            // one training step; borrowed, valid until dg_graph_free()
    dg_output global_step;     // the graph's global step (int64), incremented once per step;
                               // fetched with a step that increments it, it may already count
                               // that step (where it lives on a ps, the value sent can be read
                               // after the increment, as TensorFlow's reads race with updates)
    // The model's outputs over this step's batch on this process: averaged over its replicas.
    dg_output outputs[DG_DISTRIBUTE_MAX_OUTPUTS];
    // The same outputs from the model built once over whole batch inputs with replica 0's
    // variables, outside training: feed test data here to evaluate (for the one-replica kinds
    // they are the same nodes as outputs).
    dg_output eval_outputs[DG_DISTRIBUTE_MAX_OUTPUTS];
    int n_outputs;
} dg_distributed_step;

// Builds the training step into g (a task that only serves has none to build): the global step, the
// variables and the replicas through model_fn (1 <= n_outputs <= DG_DISTRIBUTE_MAX_OUTPUTS),
// the gradients (each replica's on its device), their reduction and opt's update, where the
// kind puts them. batch_inputs (dim 0 the batch, e.g. placeholders) are split evenly over the
// devices of the one-process kinds (their known dim 0 must divide by num_devices); each worker
// of the cluster kinds feeds its own batch (ps_coordinator: each step its batch, built once
// with the computation on "/job:worker", which the master of the worker that runs a step
// places on itself). opt->graph must be g. Call once per graph.
// Returns false with st set; on success fills *out. Borrows its arguments for the call, and g
// until dg_distribution_free (which frees what it built for g: free it before the graph).
bool dg_distribution_minimize(dg_distribution *d, dg_graph *g, const dg_optimizer *opt, dg_model_fn model_fn,
                              void *ctx, const dg_output *batch_inputs, int n_inputs, int n_outputs,
                              dg_distributed_step *out, dg_status *st);

// ---- training ----
// A monitored session for the graph of dg_distribution_minimize: o's settings (NULL: the
// defaults; its master, is_chief and roles are the distribution's) with the kind's roles and
// hooks: every replica stops at global step last_step (-1: no stop hook); the chief
// initializes or restores (o->checkpoint_path), saves and writes summaries; multi-worker
// mirrored workers all initialize and take the chief's values by broadcast; sync replicas run
// their hook. ps_coordinator: the monitored session is the coordinator's, on ps task 0's
// master (it initializes or restores, saves, and runs the hooks once per step with no feeds,
// so hooks may fetch only what needs none); the steps run on the workers through sessions of
// their own, which the coordinator's threads open now and again after a worker failed (the
// workers may start in any order; one that is down takes work when it answers).
// o->hooks run after the distribution's. Returns: new, caller frees with
// dg_monitored_session_free() before freeing the distribution; NULL with st set.
dg_monitored_session *dg_distribution_session_new(dg_distribution *d, dg_graph *g, int64_t last_step,
                                                  const dg_mts_options *o, dg_status *st);
// One training step: step->train with the feeds, and fetches (may be 0). The end of training
// that a synchronous kind reports as OUT_OF_RANGE (the chief closed the token queue at the
// last step) requests the session's stop and returns true with nothing fetched (fetched[i]
// NULL). Other errors as dg_monitored_session_run.
// ps_coordinator: queues the step (the feed values are copied) for the next free worker and
// returns while it runs; fetched receives the fetches of the newest step that finished since
// the last call (when it fetched the same outputs), or NULLs when none did. The coordinator
// stops by the steps it scheduled: the call that schedules the one that reaches the session's
// last step waits for every step queued and requests the stop, so the loop ends with all of
// them run and the global step at last_step (past it by any step given back after its worker
// failed that had updated the variables already: each step runs at least once). Fails with the
// first error of a step whose worker still answers, or UNAVAILABLE when no worker has answered
// for peer_timeout_ms. The coordinator's threads read g until dg_distribution_free (they send
// it to workers that come back): add no node to g meanwhile.
bool dg_distribution_run(dg_distribution *d, dg_monitored_session *ms, const dg_distributed_step *step,
                         const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                         const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_status *st);

// ps_coordinator: waits until every step queued has run (TensorFlow's coordinator.join());
// fails as dg_distribution_run. The other kinds: true at once.
bool dg_distribution_wait(dg_distribution *d, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
