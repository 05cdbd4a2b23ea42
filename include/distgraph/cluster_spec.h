/* Cluster specs with TensorFlow's semantics (docs/TF_COMPAT.md lists where and why distgraph
 * departs from them): dg_cluster maps jobs -> task index -> address, TensorFlow's ClusterSpec.
 * A spec is data: any job name and address are taken (they are checked when a server binds or
 * a client connects, dg_cluster_check_task), task indices may be sparse and jobs empty. Built
 * from the C API, JSON, TensorFlow's "job|host:port;host:port,job|..." string or
 * --ps_hosts/--worker_hosts.
 * Errors: a lookup of a job or task that a cluster lacks is NOT_FOUND (TensorFlow: ValueError
 * "No such job in cluster", "No task with index"); any other input TensorFlow refuses
 * (TypeError, ValueError, ...) is INVALID_ARGUMENT, naming the field and the value.
 * A dg_cluster is not modified after construction by the runtime, so it may be shared. */
#ifndef DISTGRAPH_CLUSTER_SPEC_H
#define DISTGRAPH_CLUSTER_SPEC_H

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

#ifdef __cplusplus
}
#endif
#endif
