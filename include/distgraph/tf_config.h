/* TF_CONFIG, with TensorFlow's semantics (docs/TF_COMPAT.md lists the departures). One parser
 * reads it (dg_tf_resolver, as TFConfigClusterResolver does); the estimator's RunConfig
 * (dg_run_config) and what a task needs to start (dg_tf_config) are rules over what it read.
 * dg_multi_worker_*: multi_worker_util's rules over a cluster. Errors as in
 * distgraph/cluster_spec.h: NOT_FOUND for a job or task a cluster lacks, INVALID_ARGUMENT for
 * what TensorFlow refuses, naming the field and the value. */
#ifndef DISTGRAPH_TF_CONFIG_H
#define DISTGRAPH_TF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/cluster_spec.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- TF_CONFIG: TFConfigClusterResolver ----
// TensorFlow reads TF_CONFIG lazily and loosely: a missing field is None, task.type is str()
// of whatever is there, task.index int() of it ("1", 1.0 and true are 1), rpc_layer and
// session_master are taken as they are. Each accessor fails only where the same property of
// TensorFlow's resolver raises, with that error. A resolver reads the text once, when made.

typedef struct dg_tf_resolver dg_tf_resolver;
typedef struct dg_tf_resolver_options {
    const char *task_type;     // NULL: TF_CONFIG's task.type (TFConfigClusterResolver(task_type=))
    bool has_task_id;          // false: TF_CONFIG's task.index
    int64_t task_id;
    const char *rpc_layer;     // NULL: TF_CONFIG's rpc_layer
    const char *environment;   // NULL: none; TF_CONFIG's "environment" is not read, as in TF
} dg_tf_resolver_options;
dg_tf_resolver_options dg_tf_resolver_options_default(void);
// A resolver over the TF_CONFIG text tf_config (NULL: TF_CONFIG unset, read as "{}"); o may be
// NULL. Text that is not JSON (the empty string too) is INVALID_ARGUMENT with the offset, as
// every property of TensorFlow's resolver raises then. Returns: new, caller frees with
// dg_tf_resolver_free(); NULL on error.
dg_tf_resolver *dg_tf_resolver_new(const char *tf_config, const dg_tf_resolver_options *o,
                                   dg_status *st);
// The same over the TF_CONFIG environment variable, read now. Returns: new, caller frees.
dg_tf_resolver *dg_tf_resolver_from_env(const dg_tf_resolver_options *o, dg_status *st);
void dg_tf_resolver_free(dg_tf_resolver **r);
// cluster_spec(): TF_CONFIG's "cluster" as dg_cluster_from_json reads it, empty without one.
// Returns: new, caller frees with dg_cluster_free(); NULL on error.
dg_cluster *dg_tf_resolver_cluster_spec(const dg_tf_resolver *r, dg_status *st);
// task_type: *task_type gets the type (borrowed, valid until dg_tf_resolver_free()) or NULL
// for None. False on error (task or TF_CONFIG of a type whose `in` raises).
bool dg_tf_resolver_task_type(const dg_tf_resolver *r, const char **task_type, dg_status *st);
// task_id: *has_id false for None. INVALID_ARGUMENT when int() fails, or when TensorFlow's
// integer does not fit int64 (a distgraph limit).
bool dg_tf_resolver_task_id(const dg_tf_resolver *r, bool *has_id, int64_t *task_id,
                            dg_status *st);
// rpc_layer: str() of the value (borrowed, valid until dg_tf_resolver_free()) or NULL for None.
bool dg_tf_resolver_rpc_layer(const dg_tf_resolver *r, const char **rpc_layer, dg_status *st);
// environment: the override, or NULL. Returns: borrowed, valid until dg_tf_resolver_free().
const char *dg_tf_resolver_environment(const dg_tf_resolver *r);
// master(task_type, task_id, rpc_layer): TF_CONFIG's session_master when it has one (str() of
// it); else "" when the cluster has no jobs, or one job whose job_task_span is 1 (the
// single-task rule: such a task runs in process); else "<rpc_layer>://<address>" of the task
// (no prefix when rpc_layer is empty, or None and TF_CONFIG's is falsy). NULL arguments and
// has_task_id false take the resolver's own. NOT_FOUND for a task the cluster lacks.
// Returns: new string, caller frees with free(); NULL on error.
char *dg_tf_resolver_master(const dg_tf_resolver *r, const char *task_type, bool has_task_id,
                            int64_t task_id, const char *rpc_layer, dg_status *st);
typedef struct dg_accelerator_count {
    char device_type[32];   // "GPU", "TPU", ...
    int count;
} dg_accelerator_count;
// num_accelerators(task_type, task_id): of the devices the master lists (device names, e.g. from
// dg_cluster_devices; TensorFlow asks the master), counts those that are no CPU or XLA_CPU per
// device type, keeping, when both a task type and id are known, only names that contain
// "/job:<type>" and "/task:<id>" (substrings, as TensorFlow matches, so task 1 also counts
// task 10's). Fails where master() fails, and INVALID_ARGUMENT for a name that does not parse.
// Fills counts (sorted by type) and returns how many types there are (entries beyond
// max_counts are not written); -1 on error.
int dg_tf_resolver_num_accelerators(const dg_tf_resolver *r, const char *task_type,
                                    bool has_task_id, int64_t task_id,
                                    const char *const *devices, int n_devices,
                                    dg_accelerator_count *counts, int max_counts,
                                    dg_status *st);

// ---- TF_CONFIG: the estimator's RunConfig ----

typedef struct dg_run_config {
    dg_cluster *cluster;        // owned; empty in local mode and for the evaluator
    char *task_type;            // owned
    int64_t task_id;
    bool is_chief;
    char *master;               // owned; "" in process; NULL where TensorFlow's is None
    char *evaluation_master;    // owned; as master
    int num_ps_replicas;
    int num_worker_replicas;
    bool has_global_id;         // false for the evaluator
    int64_t global_id_in_cluster;
    char *model_dir;            // owned; NULL when TF_CONFIG has none
} dg_run_config;
// RunConfig()'s distributed settings from TF_CONFIG (NULL: unset). Local mode without a
// cluster (task worker 0, the chief, 1 worker); with one, a "chief" job of one task (or a legacy
// "master" job) and a task of the cluster, or the evaluator; the global id counts the chief, then
// the other jobs by name, then "ps", each by its job_task_span. out is overwritten; on failure
// it is left cleared. INVALID_ARGUMENT for what RunConfig refuses. Free with
// dg_run_config_clear().
bool dg_run_config_parse(const char *tf_config, dg_run_config *out, dg_status *st);
// The same from the TF_CONFIG environment variable (unset: local mode).
bool dg_run_config_from_env(dg_run_config *out, dg_status *st);
void dg_run_config_clear(dg_run_config *rc);

// ---- multi_worker_util ----
// task_type NULL is TensorFlow's None. INVALID_ARGUMENT for what the helper refuses.

// _validate_cluster_spec: jobs only of "chief", "worker", "evaluator", "ps"; the task type one
// of those or NULL, and a job of c unless it is "evaluator"; at most one chief and one
// evaluator task; task_id below the task count of its job (negative ids pass, as in TF).
bool dg_multi_worker_validate(const dg_cluster *c, const char *task_type, int64_t task_id,
                              dg_status *st);
// is_chief: after validation, the chief, the evaluator, or worker 0 when there is no chief job.
bool dg_multi_worker_is_chief(const dg_cluster *c, const char *task_type, int64_t task_id,
                              bool *is_chief, dg_status *st);
// worker_count: chief and worker tasks, or the evaluator's for an evaluator (NOT_FOUND when the
// cluster has no evaluator job); only for "chief", "worker" and "evaluator". -1 on error.
int dg_multi_worker_count(const dg_cluster *c, const char *task_type, dg_status *st);
// id_in_cluster: chief 0, worker i after the chief, evaluator its index; other types refused.
bool dg_multi_worker_id_in_cluster(const dg_cluster *c, const char *task_type, int64_t task_id,
                                   int64_t *id, dg_status *st);
// collective_leader: "" for an empty cluster or the evaluator, else "/job:chief/replica:0/task:0"
// with a chief job, "/job:worker/replica:0/task:0" with a worker job (else INVALID_ARGUMENT).
// Returns: a static string; NULL on error.
const char *dg_multi_worker_collective_leader(const dg_cluster *c, const char *task_type,
                                              int64_t task_id, dg_status *st);
// coordination_leader: "" for an empty cluster, else ps 0, the chief, or worker 0, the first
// job present (no validation). Returns: a static string; NULL on error.
const char *dg_multi_worker_coordination_leader(const dg_cluster *c, dg_status *st);

// ---- TF_CONFIG: what a task needs to start ----

typedef struct dg_tf_config {
    dg_cluster *cluster;     // owned; NULL if TF_CONFIG has no "cluster"
    char task_type[64];      // "" if no task
    int task_index;          // -1 if no task
    bool is_chief;           // task type "chief", or "worker" 0 when there is no chief job
    char rpc_layer[32];      // str() of TF_CONFIG's rpc_layer, "" if absent or null
} dg_tf_config;
// Parses a TF_CONFIG document into out (out->cluster is new; free it with dg_tf_config_clear).
// out is overwritten without freeing what it held; on failure it is left cleared (nothing to
// free). The fields are read as dg_tf_resolver reads them (task.index "1" is 1); then the task
// must be a server's: a task with a type but no index or the other way round, an empty type, a
// type that is not a job of the cluster (except "evaluator", which may be absent from it, or
// there may be no cluster at all) or an index that names no task of it, a "chief" or "evaluator"
// job of more than one task (multi_worker_util's rules) are INVALID_ARGUMENT naming the field,
// e.g. `TF_CONFIG: "task.index" must be an integer, got "abc"`. Also refused, where
// TensorFlow ignores them: a top-level key a letter or two away from "cluster", "task" or
// "rpc_layer" ("clsuter": a typo that would drop the field), a task type longer than 63 bytes
// or an rpc_layer longer than 31. is_chief follows the struct comment; multi_worker_util's
// is_chief also calls the evaluator a chief (dg_multi_worker_is_chief).
bool dg_tf_config_parse(const char *json, dg_tf_config *out, dg_status *st);
// Parses the TF_CONFIG environment variable; NOT_FOUND if it is unset or empty (TensorFlow
// reads an empty TF_CONFIG as bad JSON; tools treat it as unset).
bool dg_tf_config_from_env(dg_tf_config *out, dg_status *st);
void dg_tf_config_clear(dg_tf_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
