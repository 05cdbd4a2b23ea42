/* The server definition tf.distribute.Server builds: TensorFlow's ServerDef defaults (the job
 * of a one-job cluster, task 0 of a job of one task, protocol "grpc"). */
#include "base_impl.h"
#include "distgraph/server_def.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "distgraph/device_name.h"
#include "status_impl.h"

struct dg_server_def {
    dg_cluster *cluster;   // owned copy
    char *job_name;        // owned
    int task_index;
    char *protocol;        // owned
};

dg_server_def_options dg_server_def_options_default(void) {
    dg_server_def_options o = {.job_name = NULL, .has_task_index = false, .task_index = 0,
                               .protocol = NULL};
    return o;
}

void dg_server_def_free(dg_server_def **dp) {
    if (!dp || !*dp) return;
    dg_server_def *d = *dp;
    dg_cluster_free(&d->cluster);
    free(d->job_name);
    free(d->protocol);
    free(d);
    *dp = NULL;
}

dg_server_def *dg_server_def_new(const dg_cluster *c, const dg_server_def_options *o,
                                 dg_status *st) {
    dg_status_reset(st);
    dg_server_def_options opts = o ? *o : dg_server_def_options_default();
    if (!c) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "server definition: NULL cluster");
        return NULL;
    }
    const char *job = opts.job_name;
    if (!job) {
        if (c->n_jobs != 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "server definition: the cluster has %d jobs: give the job name", c->n_jobs);
            return NULL;
        }
        job = c->jobs[0].name;
    }
    int task = opts.task_index;
    if (!opts.has_task_index) {
        const cl_job *j = cluster_lookup_job(c, job);
        if (!j) {
            dg_status_setf(st, DG_NOT_FOUND, "server definition: no job \"%s\" in the cluster", job);
            return NULL;
        }
        if (j->n_tasks != 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "server definition: job \"%s\" has %d tasks: give the task index", job, j->n_tasks);
            return NULL;
        }
        task = j->tasks[0].index;
    }
    dg_status text_st = DG_STATUS_INIT;
    bool text_ok = cluster_check_text("job name", job, &text_st) &&
                   (!opts.protocol || cluster_check_text("protocol", opts.protocol, &text_st));
    if (!text_ok) {
        dg_status_copy(st, &text_st);
        status_impl_clear(&text_st);
        dg_status_prepend(st, "server definition");
        return NULL;
    }
    status_impl_clear(&text_st);
    dg_server_def *d = calloc(1, sizeof *d);
    if (!d) {
        base_oom(st, "cluster", sizeof *d);
        return NULL;
    }
    d->cluster = dg_cluster_copy(c);
    d->job_name = strdup(job);
    d->protocol = strdup(opts.protocol ? opts.protocol : "grpc");
    d->task_index = task;
    if (!d->cluster || !d->job_name || !d->protocol) {
        dg_server_def_free(&d);
        base_oom(st, "cluster", 0);
        return NULL;
    }
    return d;
}

const dg_cluster *dg_server_def_cluster(const dg_server_def *d) { return d ? d->cluster : NULL; }
const char *dg_server_def_job_name(const dg_server_def *d) { return d ? d->job_name : NULL; }
int dg_server_def_task_index(const dg_server_def *d) { return d ? d->task_index : -1; }
const char *dg_server_def_protocol(const dg_server_def *d) { return d ? d->protocol : NULL; }
