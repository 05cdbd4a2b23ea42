/* The monitored training session (TensorFlow's MonitoredTrainingSession): a session that
 * initializes or restores the variables (chief) or waits for them (non-chief), runs hooks
 * around every step, saves checkpoints, and recreates itself when a task restarts.
 * Main objects: dg_monitored_session, dg_session_hook (callbacks + user data), dg_saver.
 * Threads: dg_monitored_session_run may be called from several threads at once (hook
 * callbacks are serialized); should_stop and request_stop from any thread; close and free
 * from one thread once no other thread will start a run. */
#ifndef DISTGRAPH_MONITORED_SESSION_H
#define DISTGRAPH_MONITORED_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "distgraph/checkpoint.h"
#include "distgraph/graph.h"
#include "distgraph/server.h"
#include "distgraph/session.h"
#include "distgraph/sync_replicas.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_monitored_session dg_monitored_session;

// ---- saver: checkpoint save and restore as graph construction ----
typedef struct dg_saver dg_saver;

// Adds, for every variable of DG_GLOBAL_VARIABLES, a placeholder "save/restore_<var>/value"
// and an Assign "save/restore_<var>" colocated with the variable, grouped under
// "save/restore_all" (the scope is "save_1" ... when "save" is taken). Variables added to the
// graph later are not covered. A graph without variables is FAILED_PRECONDITION; a variable
// with malformed save-slice attributes (partitioned.h) INVALID_ARGUMENT naming it.
// Borrows g until dg_saver_free(). Returns: new, caller frees with dg_saver_free(); NULL on
// error (the graph's sticky error, or st).
dg_saver *dg_saver_new(dg_graph *g, dg_status *st);
void dg_saver_free(dg_saver **sv);
// Fetches every variable in one run (copies, also of variables on other tasks) and saves them
// under their node names as the checkpoint of `step` (the parts of partitioned variables, those
// with save-slice attributes, as slices of their full variables: dg_checkpoint_save_slices);
// step -1 takes the value of the graph's
// global step (DG_GLOBAL_STEP) fetched in the same run (FAILED_PRECONDITION if there is none).
// Keeps the newest max_to_keep checkpoints (0: all). *saved_step (may be NULL) gets the step.
// Borrows sess and store for the call.
bool dg_saver_save(dg_saver *sv, dg_session *sess, dg_checkpoint_store *store, int64_t step,
                   int max_to_keep, int64_t *saved_step, dg_status *st);
// Restores the checkpoint of step (-1: newest) by one run feeding the stored values to the
// restore Assigns. The checkpoint must hold exactly the saver's variables with their dtypes and
// shapes, else INVALID_ARGUMENT naming every variable missing from the checkpoint, not in the
// graph, or of another dtype/shape (NOT_FOUND when there is no checkpoint at all). A part of a
// partitioned variable reads its rows of the full variable from whatever slices of it the
// checkpoint holds, or from the full variable saved whole; a whole variable the checkpoint holds
// only as slices is assembled from them (dg_checkpoint_restore_slices, whose errors name the
// file: rows no slice holds, another full shape or dtype, overlapping slices).
// *restored_step (may be NULL) gets the step. Borrows sess and store for the call.
bool dg_saver_restore(dg_saver *sv, dg_session *sess, dg_checkpoint_store *store, int64_t step,
                      int64_t *restored_step, dg_status *st);
// Fills *bytes (new, freed by the saver with free()) and *n_bytes with what to save; false
// with st set fails the save.
typedef bool (*dg_saver_blob_fn)(void *ctx, unsigned char **bytes, size_t *n_bytes, dg_status *st);
// Every later dg_saver_save (and so the checkpoint saver hook) calls fn and saves its bytes
// under name (1 to 255 bytes; ALREADY_EXISTS when added before) in the checkpoint's own
// transaction (dg_checkpoint_save_with_blobs); read them back with dg_checkpoint_read_blob.
// dg_saver_restore leaves these blobs alone (an iterator attached with dg_iterator_attach_saver
// is restored with the variables). Borrows ctx until dg_saver_free() or dg_saver_remove_blob().
bool dg_saver_add_blob(dg_saver *sv, const char *name, dg_saver_blob_fn fn, void *ctx, dg_status *st);
// Stops saving the blob name: later saves do not call its function, and the saver no longer
// borrows its ctx. NOT_FOUND when no blob of that name is added.
bool dg_saver_remove_blob(dg_saver *sv, const char *name, dg_status *st);
// With convert true, dg_saver_restore reads a variable saved in another float dtype
// (float32, float64, bfloat16, float16) and converts it as Cast does (to a 16-bit float through
// float32, to nearest, ties to even). Off by default: a checkpoint of another dtype is
// INVALID_ARGUMENT naming the variable and both dtypes. Parts of partitioned variables (and a
// variable saved as parts) are converted the same way.
void dg_saver_set_convert_dtypes(dg_saver *sv, bool convert);
// Number of variables and the name of variable i. Returns: borrowed, valid until
// dg_saver_free().
int dg_saver_num_variables(const dg_saver *sv);
const char *dg_saver_variable_name(const dg_saver *sv, int i);

// ---- hooks ----
// What a hook's before_run adds to a run: extra feeds, fetches and targets, borrowed by the
// monitored session until the matching after_run returns (keep them in the hook's context).
// A feed of a tensor the caller (or another hook) also feeds is INVALID_ARGUMENT.
typedef struct dg_hook_run_args {
    const dg_output *feeds;
    dg_tensor *const *feed_values;
    int n_feeds;
    const dg_output *fetches;
    int n_fetches;
    dg_node *const *targets;
    int n_targets;
    bool trace;   // record a timeline of this run (after_run finds it in dg_run_context.trace)
} dg_hook_run_args;

// The run a hook sees. All pointers are borrowed for the callback.
typedef struct dg_run_context {
    dg_monitored_session *session;   // e.g. for dg_monitored_session_request_stop
    dg_session *raw_session;         // the underlying session of this run
    const dg_output *fetches;        // the caller's fetches, feeds and targets
    int n_fetches;
    const dg_output *feeds;
    dg_tensor *const *feed_values;
    int n_feeds;
    dg_node *const *targets;
    int n_targets;
    // after_run of a run a hook asked to trace (dg_hook_run_args.trace): its timeline; else NULL
    const dg_step_trace *trace;
} dg_run_context;

// A hook: callbacks (each optional, NULL skips it) and the user data they get as ctx. A
// callback that returns false with st set fails the step (or the creation, or the close) with
// that status; UNAVAILABLE or ABORTED from a hook leads to recovery like a failed run. Calls:
// begin (once, before the session exists; the graph may still be extended), after_create_session
// (after every creation of the underlying session, also after a recovery, variables ready),
// before_run / after_run (around each dg_monitored_session_run; after_run gets the values of the
// hook's extra fetches, borrowed for the call, and is skipped when the run fails), end (at
// dg_monitored_session_close, unless the last run failed). Hooks run by their order field,
// lowest first, and those of one order as given (the user's hooks, the chief-only ones, then
// the built-in ones). Fill a hook by field names ({.name = "report", .ctx = r,
// .after_create_session = report_after_create}); fields left out are NULL and order 0.
typedef struct dg_session_hook {
    const char *name;   // for messages; may be NULL
    void *ctx;
    bool (*begin)(void *ctx, dg_graph *g, dg_status *st);
    bool (*after_create_session)(void *ctx, dg_monitored_session *ms, dg_session *sess,
                                 dg_status *st);
    bool (*before_run)(void *ctx, const dg_run_context *rc, dg_hook_run_args *args,
                       dg_status *st);
    bool (*after_run)(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n_values,
                      dg_status *st);
    bool (*end)(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st);
    void (*free_ctx)(void *ctx);   // called by dg_session_hook_free; NULL: ctx is not freed
    // DG_HOOK_ORDER_SETUP for a hook that makes the state other hooks read (a broadcast of
    // the variables, which brings the global step a stop hook compares); 0 for the rest.
    int order;
} dg_session_hook;

// Hooks of this order run before those of order 0 wherever they are in the list.
#define DG_HOOK_ORDER_SETUP (-100)

// Frees a hook made by one of the dg_*_hook_new constructors (calls free_ctx, then frees the
// struct). NULL or a pointer to NULL does nothing. Hooks in caller memory need no free.
void dg_session_hook_free(dg_session_hook **h);

// Requests a stop when the global step reaches last_step, or num_steps global steps after the
// step found when the session is first created; exactly one of them >= 0, the other -1 (else
// INVALID_ARGUMENT). Needs the graph's global step. A session created at or past the last step
// stops before its first run. Returns: new, caller frees with dg_session_hook_free().
dg_session_hook *dg_stop_at_step_hook_new(int64_t num_steps, int64_t last_step, dg_status *st);
// The same without the sentinel: stop at global step last_step (>= 0), or num_steps (>= 0)
// global steps after the first creation; a negative argument is INVALID_ARGUMENT.
dg_session_hook *dg_stop_at_last_step_hook_new(int64_t last_step, dg_status *st);
dg_session_hook *dg_stop_after_steps_hook_new(int64_t num_steps, dg_status *st);

// Saves a checkpoint of all variables into the SQLite file `path` (through a dg_saver the
// monitored session built) right after a creation that did not restore, every save_steps
// global steps and/or every save_secs seconds (whichever comes first; both 0: only those and
// the end), and at the end. Keeps max_to_keep checkpoints (0: all). Needs the global step.
// Each save prints "<unix time>: saved the checkpoint of global step N to PATH" to out (NULL:
// stdout). Returns: new, caller frees with dg_session_hook_free(). Borrows path for the call.
dg_session_hook *dg_checkpoint_saver_hook_new(const char *path, int64_t save_steps, int64_t save_secs,
                                              int max_to_keep, FILE *out, dg_status *st);
// Prints "global_step/sec: X" to out (NULL: stdout) every every_n_steps global steps.
// Returns: new, caller frees with dg_session_hook_free().
dg_session_hook *dg_step_counter_hook_new(int64_t every_n_steps, FILE *out, dg_status *st);
// Prints "<tensor> = <value>" for each tensor (values of small tensors in full, else the
// shape and the first values) to out (NULL: stdout) on the first run and then every
// every_n_iter runs of this process. Borrows tensors for the call (copies the list).
// Returns: new, caller frees with dg_session_hook_free().
dg_session_hook *dg_logging_tensor_hook_new(const dg_output *tensors, int n, int64_t every_n_iter,
                                            FILE *out, dg_status *st);
// Fetches loss on every run. When it is NaN: with fail_on_nan the run fails with
// INVALID_ARGUMENT naming the loss tensor and the step; else a stop is requested and a
// warning naming it goes to stderr. Returns: new, caller frees with dg_session_hook_free().
dg_session_hook *dg_nan_guard_hook_new(dg_output loss, bool fail_on_nan, dg_status *st);
// On the first run and then every save_steps global steps, fetches scalar tensors with the
// run and appends one row per tensor to the table
//   summaries(step INTEGER, tag TEXT, value REAL, wall_time REAL)   -- wall_time: Unix seconds
// of the checkpoint file at path (created with its checkpoint schema if missing; the hook
// writes through a checkpoint store of its own, dg_checkpoint_store_add_summaries, which
// creates the table if missing; checkpoints never touch it). tags[i] names scalars[i] (tags
// NULL: the node names). n 0: output 0 of every node of the DG_SUMMARIES collection, taken at
// begin. Needs the global step. Borrows its arguments for the call. Returns: new, caller frees
// with dg_session_hook_free().
dg_session_hook *dg_summary_saver_hook_new(const char *path, int64_t save_steps,
                                           const char *const *tags, const dg_output *scalars,
                                           int n, dg_status *st);
// The same scalars (and schedule) written as TensorBoard events (distgraph/summary.h), with
// the DG_HISTOGRAM_SUMMARIES tensors as histograms, into a new event file of logdir (made when missing; one that cannot be written fails the session's
// creation naming it), and after the first run the graph, its nodes with the devices they were
// placed on. A write that fails later (a full disk) prints one warning to stderr and stops the
// hook's writing; training goes on. Borrows its arguments for the call. Returns: new, caller
// frees with dg_session_hook_free().
dg_session_hook *dg_tensorboard_hook_new(const char *logdir, int64_t save_steps, const char *const *tags,
                                         const dg_output *scalars, int n, dg_status *st);
// Records a timeline of the at_run-th run of this process (1: the first) and writes it as a
// Chrome trace-event file to path (distgraph/trace.h, dg_step_trace_write_chrome), then prints
// "<unix time>: wrote the timeline of run N (step X ms, events account for Y ms) to PATH" to out
// (NULL: stdout). A file that cannot be written prints a warning to stderr; training goes on.
// Borrows path for the call. Returns: new, caller frees with dg_session_hook_free().
dg_session_hook *dg_trace_hook_new(int64_t at_run, const char *path, FILE *out, dg_status *st);

// Runs op (e.g. dg_collective_broadcast_variables' op) after every creation of the session, so
// every rank starts (and restarts) from rank 0's values: the all-reduce recipe. Its order is
// DG_HOOK_ORDER_SETUP, so a stop hook anywhere in the list sees the broadcast global step.
// Borrows op (owned by its graph). Returns: new, caller frees with dg_session_hook_free().
dg_session_hook *dg_broadcast_variables_hook_new(dg_node *op, dg_status *st);

// Runs targets and fetches once at the end (dg_monitored_session_close) and keeps the fetched
// values. Borrows the arrays for the call (copies them). Returns: new, caller frees with
// dg_session_hook_free().
dg_session_hook *dg_final_ops_hook_new(const dg_output *fetches, int n_fetches,
                                       dg_node *const *targets, int n_targets, dg_status *st);
// The values fetched at the end, NULL before. Returns: borrowed, valid until the hook is freed.
dg_tensor *dg_final_ops_hook_value(const dg_session_hook *h, int i);

// ---- the hook of synchronous replicas (distgraph/sync_replicas.h) ----
// The hook (TensorFlow's SyncReplicasOptimizerHook). after_create_session: a worker sets its
// local step from the global step; the chief runs the chief init, reopens the token queue and
// starts the apply loop on its own thread and its own session on `master` (copied; NULL:
// local) until the global step reaches last_step (-1: no limit), when it closes the queue, so
// waiting workers end (OUT_OF_RANGE: treat it as the normal end of training). A failed step
// of the loop (a take past its deadline names the missing workers) closes the queue with that
// error, so the workers fail with the same cause. end and freeing the hook stop the loop.
// Borrows sr until the hook is freed (free the hook before the graph). Returns: new, caller
// frees with dg_session_hook_free().
dg_session_hook *dg_sync_replicas_hook_new(dg_sync_replicas *sr, bool is_chief, const char *master,
                                           int64_t last_step, dg_status *st);
// The apply loop's error, if it stopped on one (copied into st; returns false). True while it
// runs or after a clean stop.
bool dg_sync_replicas_hook_status(const dg_session_hook *h, dg_status *st);
// Makes the chief's hook follow the live workers (before the session is created; a no-op on
// other workers): every probe_ms (>= 10) the chief PINGs each other task of job in server's
// cluster through server (its own task). While only k of the workers answer (the chief
// included, at most total_num_replicas), a step averages min(replicas_to_aggregate, k)
// gradients, a take already waiting ends as soon as it has them, and the chief enqueues k
// tokens per step instead of total_num_replicas: a killed worker holds the chief for about a
// probe, not for timeout_ms. A worker counts again once its server answers, and the next takes
// wait for its gradients (up to timeout_ms). Each change is a line on stdout. Borrows server
// until the hook is freed. INVALID_ARGUMENT for a missing argument or a job not in the cluster.
bool dg_sync_replicas_hook_follow_live_workers(dg_session_hook *h, dg_server *server, const char *job,
                                               int64_t probe_ms, dg_status *st);

// ---- the monitored session ----
// Whether a task takes one of the session's roles; DG_ROLE_DEFAULT follows is_chief.
typedef enum dg_role { DG_ROLE_DEFAULT = 0, DG_ROLE_YES = 1, DG_ROLE_NO = 2 } dg_role;

typedef struct dg_mts_options {
    const char *master;                     // NULL/"local", or dg_server_target(server)
    const dg_session_options *session_options;   // NULL: defaults; copied
    bool is_chief;                          // the chief: the roles below by default, and the
                                            // chief-only hooks; default true
    const char *checkpoint_path;            // SQLite file; NULL: no checkpoints (copied)
    int64_t save_checkpoint_steps;          // chief: save every N global steps; 0: not by steps
    int64_t save_checkpoint_secs;           // chief: save every N seconds; 0: not by time
    int max_to_keep;                        // checkpoints kept (default 5; 0: all)
    int64_t save_summaries_steps;           // chief with a checkpoint path: DG_SUMMARIES
                                            // scalars every N steps (default 100; 0: off)
    const char *logdir;                     // chief: TensorBoard event files there (the
                                            // DG_SUMMARIES scalars every save_summaries_steps
                                            // and the placed graph); NULL: none
    int64_t log_step_count_steps;           // global_step/sec every N steps (default 0: off)
    FILE *log;                              // where the built-in hooks print (a line per checkpoint
                                            // saved, global_step/sec); NULL: stdout
    dg_session_hook *const *hooks;          // borrowed until dg_monitored_session_free()
    int n_hooks;
    dg_session_hook *const *chief_only_hooks;   // used only when is_chief; borrowed likewise
    int n_chief_only_hooks;
    int64_t stop_grace_ms;                  // close waits this long for runs of other threads
                                            // (default 120000)
    int64_t wait_for_chief_ms;              // non-chief: wait for initialization (default 7200000),
                                            // printing to log every 5 s what it waits for
    int max_recovery_attempts;              // session creations per failure (default 5)
    int64_t recovery_backoff_ms;            // first pause between creations, doubling up to
                                            // 5 s (default 100)
    // The roles TensorFlow ties to is_chief, apart (each DG_ROLE_DEFAULT: is_chief's answer).
    // All-reduce training, where every worker holds its own variables, has every worker
    // initialize and only worker 0 restore, save and write summaries (then broadcast its
    // values: dg_broadcast_variables_hook_new).
    dg_role init_variables;     // YES: makes the variables ready itself (restores or initializes);
                                // NO: waits until another task has (wait_for_chief_ms). A
                                // non-chief's graph holding a CollectiveAllReduce with this left
                                // DEFAULT is FAILED_PRECONDITION naming the fix (nobody else
                                // initializes an all-reduce worker's own variables)
    dg_role restore;            // with init_variables and a checkpoint_path: restores the newest
                                // checkpoint if there is one (NO: always initializes)
    dg_role save_checkpoints;   // with a checkpoint_path: the checkpoint saver
    dg_role write_summaries;    // the summary saver (checkpoint file), TensorBoard (logdir) and
                                // the step counter (log_step_count_steps)
} dg_mts_options;

dg_mts_options dg_mts_options_default(void);

// Builds the monitored session: calls each hook's begin, adds the save/restore ops
// (dg_saver_new), IsVariableInitialized ops "ready/<var>" and an init op to g, then creates the
// session. The chief restores the newest checkpoint of checkpoint_path if there is one, else runs
// the variables' initializers; a non-chief waits (50 ms backoff doubling to 1 s) until every
// variable is initialized, and after wait_for_chief_ms fails with DEADLINE_EXCEEDED
// "waited N ms for the chief to initialize variables: <names>". Creation that fails with
// UNAVAILABLE or ABORTED is retried (max_recovery_attempts). Hooks: user hooks, then the
// chief-only ones, then the built-in step counter, TensorBoard, summary saver and checkpoint saver.
// Borrows g until dg_monitored_session_free() (and adds nodes to it); o may be NULL.
// Returns: new, caller frees with dg_monitored_session_free(); NULL on error.
dg_monitored_session *dg_monitored_session_new(dg_graph *g, const dg_mts_options *o,
                                                        dg_status *st);

// True once a stop was requested (hook or dg_monitored_session_request_stop), the last run
// failed, or the session was closed.
bool dg_monitored_session_should_stop(const dg_monitored_session *s);
void dg_monitored_session_request_stop(dg_monitored_session *s);

// Runs one step with the hooks: before_run of each hook, one dg_session_run with the caller's
// feeds/fetches/targets plus the hooks' (fetches shared when equal), after_run of each hook.
// fetched[i] receives a new reference (caller unrefs); on failure none is set. A run that fails
// with UNAVAILABLE or ABORTED (a task restarted) frees the underlying session, creates a new one
// (the chief restores the newest checkpoint, non-chiefs wait again; after_create_session hooks
// run again) and runs the step again. After max_recovery_attempts failed creations in a row (or
// a step failing that often on fresh sessions) the last error is returned, its code kept, with
// "recovery: gave up after N attempts ..." prepended. Other errors are returned as they are. A
// hook must not call dg_monitored_session_run (it may use rc->raw_session). After close:
// FAILED_PRECONDITION.
bool dg_monitored_session_run(dg_monitored_session *s, const dg_output *feeds,
                              dg_tensor *const *feed_values, int n_feeds, const dg_output *fetches,
                              dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                              int n_targets, dg_status *st);

// Requests a stop, waits up to stop_grace_ms for runs of other threads (DEADLINE_EXCEEDED if
// some are still running; the session stays open and close may be called again), calls each
// hook's end unless the last run failed, and frees the underlying session. Closing twice does
// nothing.
bool dg_monitored_session_close(dg_monitored_session *s, dg_status *st);
// Closes (ignoring errors; waits for runs of other threads) and frees. NULL or a pointer to
// NULL does nothing.
void dg_monitored_session_free(dg_monitored_session **s);

// The global step's current value, read by a run of the underlying session; -1 on error
// (FAILED_PRECONDITION when the graph has no global step or the session is closed).
int64_t dg_monitored_session_global_step(dg_monitored_session *s, dg_status *st);
// The underlying session. Returns: borrowed, valid until the next recovery or close; NULL after
// close.
dg_session *dg_monitored_session_session(dg_monitored_session *s);
// The step of the checkpoint the latest creation restored; -1 when it initialized the variables
// (or waited for them: non-chief).
int64_t dg_monitored_session_restored_step(const dg_monitored_session *s);
// How many times the underlying session was recreated after a failure.
int dg_monitored_session_num_recoveries(const dg_monitored_session *s);
bool dg_monitored_session_is_chief(const dg_monitored_session *s);
// Returns: borrowed, valid until dg_monitored_session_free().
dg_graph *dg_monitored_session_graph(const dg_monitored_session *s);
// Returns: borrowed, valid until dg_monitored_session_free().
dg_saver *dg_monitored_session_saver(const dg_monitored_session *s);

#ifdef __cplusplus
}
#endif
#endif
