/* The cluster spec's representation, shared by the files of cluster/ that read it directly
 * (the spec and its forms, the server definition, the TF_CONFIG rules). Jobs are kept sorted by
 * name and tasks by index, so lookups bisect and every printed form is deterministic. */
#ifndef DG_CLUSTER_IMPL_H
#define DG_CLUSTER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/cluster_spec.h"
#include "distgraph/status.h"
#include "json_impl.h"

typedef struct cl_task {
    int index;
    char *addr;   // owned, any UTF-8 text
} cl_task;

typedef struct cl_job {
    char *name;       // owned, any UTF-8 text
    cl_task *tasks;   // sorted by index
    int n_tasks;
    int cap;
} cl_job;

struct dg_cluster {
    cl_job *jobs;   // sorted by name (bytewise, which is code point order for UTF-8)
    int n_jobs;
    int cap;
};

// INVALID_ARGUMENT with the message, prefixed "what: " (what NULL: no prefix). Returns false.
bool cluster_refuse(dg_status *st, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Well-formed UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
bool cluster_utf8_valid(const char *s);
// A name or address given to the C API: INVALID_ARGUMENT naming what (a "job name") when s is
// NULL or not UTF-8.
bool cluster_check_text(const char *what, const char *s, dg_status *st);
// The job named job, or NULL. Returns: borrowed.
const cl_job *cluster_lookup_job(const dg_cluster *c, const char *job);
// The position of task index task in j->tasks, or -1.
int cluster_find_task(const cl_job *j, int task);
// len(job_tasks(job)): the highest index + 1, -1 with INVALID_ARGUMENT for a job without tasks
// or with an index below -(highest + 1) (dg_cluster_job_task_span).
int64_t cluster_task_span(const cl_job *j, dg_status *st);
// ClusterSpec.as_dict(): builds each job's list through job_tasks() when its indices look dense
// (highest + 1 equals the count), which fails for a negative index below -count.
bool cluster_as_dict_ok(const dg_cluster *c, dg_status *st);
// At most 40 bytes of v's source text, for messages. Returns buf.
const char *cluster_raw(const char *src, const cluster_json *v, char *buf, size_t cap);
// Fills c from a JSON object of jobs (src: the text root was parsed from), as
// tf.train.ClusterSpec reads the dict. Messages are relative (the caller prefixes them).
bool cluster_from_dom(dg_cluster *c, const char *src, const cluster_json *root, dg_status *st);

#endif
