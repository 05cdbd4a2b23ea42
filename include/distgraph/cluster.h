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
