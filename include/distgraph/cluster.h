/* Cluster specs and TF_CONFIG, with TensorFlow's semantics (docs/TF_COMPAT.md lists where and
 * why distgraph departs from them).
 * - dg_cluster: jobs -> task index -> address, TensorFlow's ClusterSpec. A spec is data: any job
 *   name and address are taken (they are checked when a server binds or a client connects,
 *   dg_cluster_check_task), task indices may be sparse and jobs empty. Built from the C API,
 *   JSON, TensorFlow's "job|host:port;host:port,job|..." string or --ps_hosts/--worker_hosts.
 * - dg_server_def: the server definition tf.distribute.Server builds (its defaults).
 * - dg_tf_resolver: TF_CONFIG as TFConfigClusterResolver reads it; dg_run_config: as the
 *   estimator's RunConfig reads it; dg_multi_worker_*: multi_worker_util's rules;
 *   dg_tf_config: what a task needs to start, read as the resolver reads it.
 * Errors: a lookup of a job or task that a cluster lacks is NOT_FOUND (TensorFlow: ValueError
 * "No such job in cluster", "No task with index"); any other input TensorFlow refuses
 * (TypeError, ValueError, ...) is INVALID_ARGUMENT, naming the field and the value.
 * A dg_cluster is not modified after construction by the runtime, so it may be shared. */
#ifndef DISTGRAPH_CLUSTER_H
#define DISTGRAPH_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_cluster dg_cluster;

// ---- building ----

// Returns: new empty cluster, caller frees with dg_cluster_free().
dg_cluster *dg_cluster_new(void);
void dg_cluster_free(dg_cluster **c);
// Returns: new deep copy, caller frees with dg_cluster_free().
dg_cluster *dg_cluster_copy(const dg_cluster *c);

// Adds task `task` of `job` at addr. As in TensorFlow's ClusterSpec any job name (the empty one
// too) and any address are taken, as long as both are UTF-8 text, and any index, negative ones
// included; the address is checked when it is used (dg_cluster_check_task). NULL arguments and
// text that is not UTF-8 are INVALID_ARGUMENT, a task given twice ALREADY_EXISTS; on failure c
// is unchanged.
bool dg_cluster_add_task(dg_cluster *c, const char *job, int task, const char *addr,
                         dg_status *st);
// Adds a job without tasks (TensorFlow: "ps": []); a job that exists is left as it is.
// INVALID_ARGUMENT as dg_cluster_add_task.
bool dg_cluster_add_job(dg_cluster *c, const char *job, dg_status *st);

// tf.train.ClusterSpec(json.loads(json)): {"ps": ["h:1", "h:2"], "worker": {"0": "h:3",
// "2": "h:4"}}. A list gives indices 0.., an object sparse ones, its keys read as Python's
// int() reads them (" 1", "+1", "01", "1_0"); "ps": [] or {} is a job with no tasks. The JSON
// is what Python's json.loads reads (NaN, Infinity, lone surrogates), except that a key given
// twice is an error, as is a sparse index given twice ("1" and "01"). A document that is not
// an object, a job that is not a list or an object, an address that is not a string, an index
// outside int32, text that is not UTF-8 or that holds a NUL byte: INVALID_ARGUMENT naming it,
// with the byte offset for syntax errors. Returns: new, caller frees with dg_cluster_free();
// NULL on error.
dg_cluster *dg_cluster_from_json(const char *json, dg_status *st);
// TensorFlow's cluster spec string (grpc_tensorflow_server's --cluster_spec):
// "ps|h:1;h:2,worker|h:3", jobs separated by ',', a job's tasks 0.. by ';'. As TensorFlow,
// an empty string, a job without exactly one '|', an empty job name and an empty task are
// INVALID_ARGUMENT (a job named twice is too; TensorFlow keeps the last). distgraph's older
// form "ps|h:1,h:2;worker|h:3" (jobs by ';', tasks by ',') is also read when TensorFlow's
// reading fails or gives a job name that is no device-name job ([A-Za-z][A-Za-z0-9_-]*) and
// the older one gives only such names. Returns: new, caller frees; NULL on error.
dg_cluster *dg_cluster_from_spec_string(const char *spec, dg_status *st);
// The cluster spec string of c, jobs by name, tasks by index: "ps|h:1;h:2,worker|h:3", which
// dg_cluster_from_spec_string (and TensorFlow) read back as c. INVALID_ARGUMENT when the form
// cannot say it: no jobs, an empty job, sparse or negative indices, an empty job name or
// address, or a name or address holding ',', ';' or '|'. Returns: new string, caller frees
// with free(); NULL on error.
char *dg_cluster_to_spec_string(const dg_cluster *c, dg_status *st);
// --ps_hosts and --worker_hosts comma lists (either may be NULL or "", then that job is
// absent); an empty entry is INVALID_ARGUMENT. Returns: new, caller frees; NULL on error.
dg_cluster *dg_cluster_from_flags(const char *ps_hosts, const char *worker_hosts,
                                  dg_status *st);

// ---- lookups ----

int dg_cluster_num_jobs(const dg_cluster *c);
// Job i, sorted by name (TensorFlow's ClusterDef order). Returns: borrowed, valid until
// dg_cluster_free().
const char *dg_cluster_job(const dg_cluster *c, int i);
bool dg_cluster_has_job(const dg_cluster *c, const char *job);
// Number of tasks of job (0 if no such job; multi_worker_util.task_count).
int dg_cluster_num_tasks(const dg_cluster *c, const char *job);
// ClusterSpec.num_tasks(job): the number of tasks, -1 and NOT_FOUND if there is no such job.
int dg_cluster_job_num_tasks(const dg_cluster *c, const char *job, dg_status *st);
// len(ClusterSpec.job_tasks(job)): the highest index + 1, what TensorFlow counts as a job's
// size where it lays tasks out by index (RunConfig, the single-task rule of master()). -1 with
// NOT_FOUND if there is no such job, INVALID_ARGUMENT for a job without tasks (TensorFlow:
// ValueError) or with a negative index its list cannot hold (IndexError).
int64_t dg_cluster_job_task_span(const dg_cluster *c, const char *job, dg_status *st);
// Task index i (sorted ascending) of job, -1 if out of range (ClusterSpec.task_indices). A
// negative index can be a task's too: count with dg_cluster_num_tasks.
int dg_cluster_task_index(const dg_cluster *c, const char *job, int i);
// Address of a task (ClusterSpec.task_address). Returns: borrowed, valid until
// dg_cluster_free(); NULL (and st set to NOT_FOUND naming the job and task) if there is no such
// task. st may be NULL.
const char *dg_cluster_task_address(const dg_cluster *c, const char *job, int task,
                                    dg_status *st);
// The address of a task that a server is to bind or a client to reach: as
// dg_cluster_task_address, and INVALID_ARGUMENT naming the job, task and address unless the job
// can be named in a device string (dg_device_name_parse: [A-Za-z][A-Za-z0-9_-]*, at most 63
// bytes) and the address is "host:port" (a host of printable ASCII without spaces, quotes or
// ",;|/", or a bracketed IPv6 "[::1]"; a port in 1..65535). Returns: borrowed, valid until
// dg_cluster_free(); NULL on error.
const char *dg_cluster_check_task(const dg_cluster *c, const char *job, int task, dg_status *st);
// Total tasks over all jobs.
int dg_cluster_total_tasks(const dg_cluster *c);
// JSON form, as json.dumps prints ClusterSpec.as_dict() with the jobs sorted by name: a job with
// indices 0..n-1 as a list, any other as an object keyed by index ("{}" when empty), non-ASCII
// as \u escapes. dg_cluster_from_json reads it back. Returns: new string, caller frees with
// free(); NULL when out of memory.
char *dg_cluster_to_json(const dg_cluster *c);

// ---- server definitions (tf.train.ServerDef as tf.distribute.Server fills it) ----

typedef struct dg_server_def dg_server_def;
typedef struct dg_server_def_options {
    const char *job_name;   // NULL: the cluster's only job (else INVALID_ARGUMENT)
    bool has_task_index;    // false: the job's only task (else INVALID_ARGUMENT)
    int task_index;
    const char *protocol;   // NULL: "grpc", TensorFlow's default (a name only: distgraph's
                            // servers speak ZeroMQ whatever it says)
} dg_server_def_options;
dg_server_def_options dg_server_def_options_default(void);
// The definition of a server of cluster c: as TensorFlow, a given job or task need not be in
// the cluster (the server refuses it when it starts); an omitted task index of a job the cluster
// lacks is NOT_FOUND. Borrows c for the duration of the call. Returns: new, caller frees with
// dg_server_def_free(); NULL on error.
dg_server_def *dg_server_def_new(const dg_cluster *c, const dg_server_def_options *o,
                                 dg_status *st);
void dg_server_def_free(dg_server_def **d);
// Returns: borrowed, valid until dg_server_def_free().
const dg_cluster *dg_server_def_cluster(const dg_server_def *d);
// Returns: borrowed, valid until dg_server_def_free().
const char *dg_server_def_job_name(const dg_server_def *d);
int dg_server_def_task_index(const dg_server_def *d);
// Returns: borrowed, valid until dg_server_def_free().
const char *dg_server_def_protocol(const dg_server_def *d);

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

// ---- Slurm ----
// A cluster from a Slurm allocation, as TensorFlow's SlurmClusterResolver makes it: the nodes
// of the node list, in order, each with its tasks per node, give the slots host:port_base,
// host:port_base+1, ...; the jobs, in name order ("ps" before "worker"), take consecutive
// slots; this process's rank (SLURM_PROCID) is its slot, hence its job and task index.
#define DG_SLURM_DEFAULT_PORT_BASE 8888
typedef struct dg_slurm_options {
    const char *jobs;       // tasks of each job, "ps:1,worker:3" (required)
    int port_base;          // first port on each node; 0: DG_SLURM_DEFAULT_PORT_BASE
    int tasks_per_node;     // slots on every node; 0: from the allocation's tasks per node
} dg_slurm_options;
// Expands a Slurm node list: "node[01-04,07],gpu5" is node01..node04, node07, gpu5 (a range
// keeps its start's leading zeros; several bracket groups in one name multiply). *hosts gets a
// new array of new strings (free with dg_slurm_hosts_free). Returns the count; -1 with
// INVALID_ARGUMENT naming the byte at fault (an empty name, '[' without ']', a backward or
// non-numeric range, more than 65536 hosts).
int dg_slurm_expand_nodelist(const char *nodelist, char ***hosts, dg_status *st);
void dg_slurm_hosts_free(char **hosts, int n);
// Resolves from given values: the node list, the tasks per node as Slurm writes them ("2(x3),1":
// 2 on each of three nodes, then 1; ignored when o->tasks_per_node is set) and this process's
// rank. out is filled as dg_tf_config_parse fills it (out->cluster new: dg_tf_config_clear).
// INVALID_ARGUMENT for a malformed list or jobs, tasks per node that do not match the nodes,
// more tasks asked than slots, ports past 65535, or a rank beyond the jobs' tasks.
bool dg_slurm_resolve(const dg_slurm_options *o, const char *nodelist, const char *tasks_per_node, int rank,
                      dg_tf_config *out, dg_status *st);
// The same from the environment of a Slurm job step: SLURM_STEP_NODELIST (else
// SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE), SLURM_PROCID.
// NOT_FOUND outside a Slurm job step.
bool dg_slurm_from_env(const dg_slurm_options *o, dg_tf_config *out, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
