/* multi_worker_util.py's rules over a cluster: which jobs a multi-worker cluster may hold, who
 * is chief, how many workers, a task's id and the collective and coordination leaders. */
#include "distgraph/tf_config.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "status_impl.h"

static bool mw_allowed(const char *type) {
    return strcmp(type, "chief") == 0 || strcmp(type, "worker") == 0 || strcmp(type, "evaluator") == 0 ||
           strcmp(type, "ps") == 0;
}

bool dg_multi_worker_validate(const dg_cluster *c, const char *task_type, int64_t task_id, dg_status *st) {
    dg_status_reset(st);
    if (!c) return cluster_refuse(st, "multi-worker", "NULL cluster");
    for (int j = 0; j < c->n_jobs; j++)
        if (!mw_allowed(c->jobs[j].name))
            return cluster_refuse(st, "multi-worker", "job \"%s\" is not allowed: jobs are \"chief\", \"worker\", \"evaluator\" and \"ps\"",
                          c->jobs[j].name);
    if (task_type && !mw_allowed(task_type))
        return cluster_refuse(st, "multi-worker", "task type \"%s\" is not \"chief\", \"worker\", \"evaluator\" or \"ps\"", task_type);
    if (task_type && !dg_cluster_has_job(c, task_type) && strcmp(task_type, "evaluator") != 0)
        return cluster_refuse(st, "multi-worker", "task type \"%s\" is not a job of the cluster", task_type);
    if (dg_cluster_num_tasks(c, "chief") > 1) return cluster_refuse(st, "multi-worker", "there must be at most one \"chief\" task");
    if (dg_cluster_num_tasks(c, "evaluator") > 1) return cluster_refuse(st, "multi-worker", "there must be at most one \"evaluator\" task");
    if (task_type && dg_cluster_has_job(c, task_type) && task_id >= dg_cluster_num_tasks(c, task_type))
        return cluster_refuse(st, "multi-worker", "task id %lld is past the last task of job \"%s\" (%d tasks)", (long long)task_id, task_type,
                      dg_cluster_num_tasks(c, task_type));
    return true;
}

static bool mw_validated(const dg_cluster *c, const char *task_type, int64_t task_id, dg_status *st) {
    if (!dg_multi_worker_validate(c, task_type, task_id, st)) return false;
    if (!cluster_as_dict_ok(c, st)) return dg_status_prepend(st, "multi-worker"), false;
    return true;
}

static bool type_is(const char *type, const char *want) { return type && strcmp(type, want) == 0; }

bool dg_multi_worker_is_chief(const dg_cluster *c, const char *task_type, int64_t task_id, bool *is_chief,
                              dg_status *st) {
    dg_status_reset(st);
    if (is_chief) *is_chief = false;
    if (!is_chief) return cluster_refuse(st, "multi-worker", "NULL output");
    if (!mw_validated(c, task_type, task_id, st)) return false;
    *is_chief = type_is(task_type, "chief") || type_is(task_type, "evaluator") ||
                (!dg_cluster_has_job(c, "chief") && type_is(task_type, "worker") && task_id == 0);
    return true;
}

int dg_multi_worker_count(const dg_cluster *c, const char *task_type, dg_status *st) {
    dg_status_reset(st);
    if (!mw_validated(c, task_type, 0, st)) return -1;
    if (!type_is(task_type, "chief") && !type_is(task_type, "worker") && !type_is(task_type, "evaluator")) {
        cluster_refuse(st, "multi-worker", "worker_count is for \"chief\", \"worker\" and \"evaluator\" tasks, not \"%s\"",
               task_type ? task_type : "None");
        return -1;
    }
    if (type_is(task_type, "evaluator")) {
        if (!dg_cluster_has_job(c, "evaluator")) {
            dg_status_setf(st, DG_NOT_FOUND, "multi-worker: the cluster has no \"evaluator\" job");
            return -1;
        }
        return dg_cluster_num_tasks(c, "evaluator");
    }
    return dg_cluster_num_tasks(c, "chief") + dg_cluster_num_tasks(c, "worker");
}

bool dg_multi_worker_id_in_cluster(const dg_cluster *c, const char *task_type, int64_t task_id, int64_t *id,
                                   dg_status *st) {
    dg_status_reset(st);
    if (!id) return cluster_refuse(st, "multi-worker", "NULL output");
    *id = -1;
    if (!mw_validated(c, task_type, task_id, st)) return false;
    if (type_is(task_type, "chief")) return *id = 0, true;
    if (type_is(task_type, "worker")) return *id = task_id + dg_cluster_num_tasks(c, "chief"), true;
    if (type_is(task_type, "evaluator")) return *id = task_id, true;
    return cluster_refuse(st, "multi-worker", "there is no id for task type \"%s\"", task_type ? task_type : "None");
}

const char *dg_multi_worker_collective_leader(const dg_cluster *c, const char *task_type, int64_t task_id,
                                              dg_status *st) {
    dg_status_reset(st);
    if (!c) return cluster_refuse(st, "multi-worker", "NULL cluster"), NULL;
    if (!cluster_as_dict_ok(c, st)) return dg_status_prepend(st, "multi-worker"), NULL;
    if (c->n_jobs == 0) return "";
    if (!dg_multi_worker_validate(c, task_type, task_id, st)) return NULL;
    if (type_is(task_type, "evaluator")) return "";
    if (dg_cluster_has_job(c, "chief")) return "/job:chief/replica:0/task:0";
    if (dg_cluster_has_job(c, "worker")) return "/job:worker/replica:0/task:0";
    return cluster_refuse(st, "multi-worker", "the cluster has neither a \"chief\" nor a \"worker\" job to lead collectives"), NULL;
}

const char *dg_multi_worker_coordination_leader(const dg_cluster *c, dg_status *st) {
    dg_status_reset(st);
    if (!c) return cluster_refuse(st, "multi-worker", "NULL cluster"), NULL;
    if (!cluster_as_dict_ok(c, st)) return dg_status_prepend(st, "multi-worker"), NULL;
    if (c->n_jobs == 0) return "";
    if (dg_cluster_has_job(c, "ps")) return "/job:ps/replica:0/task:0";
    if (dg_cluster_has_job(c, "chief")) return "/job:chief/replica:0/task:0";
    if (dg_cluster_has_job(c, "worker")) return "/job:worker/replica:0/task:0";
    return cluster_refuse(st, "multi-worker", "the cluster has no \"ps\", \"chief\" or \"worker\" job to lead coordination"), NULL;
}
