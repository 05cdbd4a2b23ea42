/* Cluster specs: jobs -> task index -> "host:port" (TensorFlow's ClusterSpec).
 * Task indices may be sparse. Built from the C API, JSON, TF_CONFIG, --ps_hosts/--worker_hosts
 * comma lists, or the "job|host:port,host:port;job|..." form. Errors quote the bad part.
 * A dg_cluster is not modified after construction by the runtime, so it may be shared. */
#ifndef DISTGRAPH_CLUSTER_H
#define DISTGRAPH_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_cluster dg_cluster;

// Returns: new empty cluster, caller frees with dg_cluster_free().
dg_cluster *dg_cluster_new(void);
void dg_cluster_free(dg_cluster **c);
// Returns: new deep copy, caller frees with dg_cluster_free().
dg_cluster *dg_cluster_copy(const dg_cluster *c);

// Adds task `task` of `job` at addr ("host:port"). Job names are [A-Za-z][A-Za-z0-9_-]*, at
// most 63 bytes (the device-name grammar, so every job can be named in a device string);
// the address needs a nonempty host (printable ASCII without spaces, quotes or ",;|/", or a
// bracketed IPv6 "[::1]") and a port in 1..65535. A bad name, negative task or bad address is
// INVALID_ARGUMENT, a duplicate task ALREADY_EXISTS; on failure c is unchanged.
bool dg_cluster_add_task(dg_cluster *c, const char *job, int task, const char *addr,
                         dg_status *st);

// {"ps": ["h:1", "h:2"], "worker": {"0": "h:3", "2": "h:4"}}: a list gives dense indices,
// an object sparse ones (keys are decimal indices without leading zeros); "ps": [] is a job
// with no tasks. Strict JSON: duplicate keys, comments and trailing commas are errors, which
// give the byte offset. Returns: new, caller frees with dg_cluster_free(); NULL on error.
dg_cluster *dg_cluster_from_json(const char *json, dg_status *st);
// "ps|h:1,h:2;worker|h:3": jobs separated by ';', tasks 0.. by ','. Empty entries, a job
// without '|' or tasks, and a repeated job are INVALID_ARGUMENT. Returns: new, caller frees;
// NULL on error.
dg_cluster *dg_cluster_from_spec_string(const char *spec, dg_status *st);
// --ps_hosts and --worker_hosts comma lists (either may be NULL or "", then that job is
// absent). Returns: new, caller frees; NULL on error.
dg_cluster *dg_cluster_from_flags(const char *ps_hosts, const char *worker_hosts,
                                  dg_status *st);

// What TF_CONFIG says: the cluster and this process's task.
typedef struct dg_tf_config {
    dg_cluster *cluster;     // owned; NULL if TF_CONFIG has no "cluster"
    char task_type[64];      // "" if no "task"
    int task_index;          // -1 if no "task"
    bool is_chief;           // task type "chief", or "worker" 0 when there is no chief job
    char rpc_layer[32];      // "" if absent
} dg_tf_config;
// Parses a TF_CONFIG JSON document into out (out->cluster is new; free it with
// dg_tf_config_clear). out is overwritten without freeing what it held; on failure it is left
// cleared (nothing to free). Rules, after TensorFlow's TFConfigClusterResolver and
// multi_worker_util: the document is an object; "cluster" (optional) is read as by
// dg_cluster_from_json; "task" (optional) must then have a string "type" and an integer
// "index" >= 0 (a string "0" or 1.0 is rejected); "rpc_layer" (optional) is a string; other
// keys ("environment", ...) are ignored. The task type must be a job of the cluster, except
// "evaluator", which may be absent from it (or there may be no cluster at all); the index
// must name a task of that job. "chief" and "evaluator" jobs may have at most one task.
// is_chief follows the struct comment; unlike multi_worker_util.is_chief, the evaluator is
// not a chief. Errors are INVALID_ARGUMENT naming the field, e.g.
// `TF_CONFIG: "task.index" must be an integer, got "abc"`.
bool dg_tf_config_parse(const char *json, dg_tf_config *out, dg_status *st);
// Parses the TF_CONFIG environment variable; NOT_FOUND if it is unset or empty.
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

int dg_cluster_num_jobs(const dg_cluster *c);
// Job i, sorted by name. Returns: borrowed, valid until dg_cluster_free().
const char *dg_cluster_job(const dg_cluster *c, int i);
bool dg_cluster_has_job(const dg_cluster *c, const char *job);
// Number of tasks of job (0 if no such job).
int dg_cluster_num_tasks(const dg_cluster *c, const char *job);
// Task index i (sorted ascending) of job, -1 if out of range.
int dg_cluster_task_index(const dg_cluster *c, const char *job, int i);
// Address of a task. Returns: borrowed, valid until dg_cluster_free(); NULL (and st set to
// NOT_FOUND naming the job and task) if there is no such task. st may be NULL.
const char *dg_cluster_task_address(const dg_cluster *c, const char *job, int task,
                                    dg_status *st);
// Total tasks over all jobs.
int dg_cluster_total_tasks(const dg_cluster *c);
// JSON form, as dg_cluster_from_json reads. Returns: new string, caller frees with free().
char *dg_cluster_to_json(const dg_cluster *c);

#ifdef __cplusplus
}
#endif
#endif
