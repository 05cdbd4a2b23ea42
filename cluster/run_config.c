/* TF_CONFIG as the estimator's RunConfig (run_config.py) reads it: the distributed settings
 * of a chief (or legacy master), its workers and ps, or the evaluator, over what the resolver
 * parsed (tf_resolver.c). */
#include "base_impl.h"
#include "distgraph/tf_config.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "json_impl.h"
#include "status_impl.h"
#include "tf_config_impl.h"

// The address at index i of job_tasks(job), the list TensorFlow indexes by task id: negative
// indices wrap into it (TensorFlow assigns them in dict order; here in index order). NULL: None.
static const char *job_tasks_at(const cl_job *j, int64_t span, int64_t i) {
    const char *at = NULL;
    for (int t = 0; t < j->n_tasks; t++) {
        int64_t slot = j->tasks[t].index < 0 ? j->tasks[t].index + span : j->tasks[t].index;
        if (slot == i) at = j->tasks[t].addr;
    }
    return at;
}

// _validate_task_type_and_task_id: the task of task_env, checked against the cluster.
static bool rc_validate_task(const dg_cluster *c, const char *src, const cluster_json *task_env,
                             const char *chief, const cluster_json **type_out, int64_t *id_out,
                             dg_status *st) {
    const cl_job *cj = cluster_lookup_job(c, chief);
    if (!cj) return cluster_refuse(st, "TF_CONFIG", "\"cluster\" must have one \"%s\" task", chief);
    int64_t span = cluster_task_span(cj, st);
    if (span < 0) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    if (span > 1)
        return cluster_refuse(st, "TF_CONFIG", "\"cluster\" must have only one \"%s\" task, its tasks span 0..%lld", chief,
                      (long long)span - 1);
    const cluster_json *type = NULL, *index = NULL;
    if (cluster_tf_dict_get(task_env, "type", &type, "\"task\"", st) < 0 ||
        cluster_tf_dict_get(task_env, "index", &index, "\"task\"", st) < 0)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    if (!type || !cluster_json_py_truthy(type)) return cluster_refuse(st, "TF_CONFIG", "with a \"cluster\", \"task.type\" must be set");
    if (!index || index->kind == CLUSTER_JSON_NULL) return cluster_refuse(st, "TF_CONFIG", "with a \"cluster\", \"task.index\" must be set");
    int64_t id;
    bool big;
    if (!cluster_tf_int_field(src, "\"task.index\"", index, &id, &big, st) && !big)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    if (id < 0) return cluster_refuse(st, "TF_CONFIG", "\"task.index\" must not be negative, got %lld", (long long)id);
    *type_out = type;
    *id_out = id;
    if (cluster_json_py_str_eq(type, "evaluator")) {
        if (big) return dg_status_prepend(st, "TF_CONFIG"), false;
        dg_status_reset(st);
        return true;
    }
    const cl_job *tj = type->kind == CLUSTER_JSON_STRING && cluster_json_is_cstring(type) ? cluster_lookup_job(c, type->str)
                                                                                          : NULL;
    char r[48];
    if (!tj) return cluster_refuse(st, "TF_CONFIG", "\"task.type\" %s is not a job of \"cluster\"", cluster_raw(src, type, r, sizeof r));
    int64_t tspan = cluster_task_span(tj, st);
    if (tspan < 0) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    if (big || id >= tspan)
        return cluster_refuse(st, "TF_CONFIG", "\"task.index\" %s is not a task of job \"%s\" (0..%lld)", cluster_raw(src, index, r, sizeof r),
                      tj->name, (long long)tspan - 1);
    dg_status_reset(st);
    return true;
}

// _get_session_master for a validated task of the cluster.
static bool rc_session_master(const dg_cluster *c, const cluster_json *root, const char *type, int64_t id,
                              char **out, dg_status *st) {
    const cluster_json *sm = cluster_json_get(root, "session_master");
    if (sm) return cluster_tf_str_or_none(sm, out, st);
    int single = cluster_tf_single_task(c, st);
    if (single < 0) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    if (single) return (*out = strdup("")) != NULL || base_oom(st, "cluster", 1);
    const cl_job *j = cluster_lookup_job(c, type);
    const char *addr = job_tasks_at(j, cluster_task_span(j, st), id);
    if (!addr) return cluster_refuse(st, "TF_CONFIG", "job \"%s\" has no task %lld to be the master", type, (long long)id);
    if (asprintf(out, "grpc://%s", addr) < 0) return base_oom(st, "cluster", 0);
    return true;
}

// _get_global_id_in_cluster: the chief first, then the other jobs by name, "ps" last, each
// counted by its task span.
static bool rc_global_id(const dg_cluster *c, const char *chief, const char *type, int64_t id, int64_t *out,
                         dg_status *st) {
    int64_t next = 0;
    const cl_job *cj = cluster_lookup_job(c, chief);
    if (strcmp(type, chief) == 0) return *out = next + id, true;
    int64_t span = cluster_task_span(cj, st);
    if (span < 0) return false;
    next += span;
    for (int pass = 0; pass < 2; pass++) {
        for (int j = 0; j < c->n_jobs; j++) {
            const cl_job *job = &c->jobs[j];
            if (strcmp(job->name, chief) == 0 || (strcmp(job->name, "ps") == 0) != (pass == 1)) continue;
            if (strcmp(job->name, type) == 0) return *out = next + id, true;
            if ((span = cluster_task_span(job, st)) < 0) return false;
            next += span;
        }
    }
    return cluster_refuse(st, "TF_CONFIG", "task type \"%s\" is not in the cluster", type);
}

static bool rc_text(const cluster_json *root, const char *key, char **out, dg_status *st) {
    const cluster_json *v = cluster_json_get(root, key);
    if (!v) return (*out = strdup("")) != NULL || base_oom(st, "cluster", 1);
    return cluster_tf_str_or_none(v, out, st);
}

static void run_config_reset(dg_run_config *rc) { memset(rc, 0, sizeof *rc); }

void dg_run_config_clear(dg_run_config *rc) {
    if (!rc) return;
    dg_cluster_free(&rc->cluster);
    free(rc->task_type);
    free(rc->master);
    free(rc->evaluation_master);
    free(rc->model_dir);
    run_config_reset(rc);
}

// The training cluster's settings: a "chief" (or legacy "master") job and a task of it.
static bool rc_distributed(dg_run_config *out, const char *src, const cluster_json *root, const cluster_json *task_env,
                           const char *chief, dg_status *st) {
    dg_cluster *c = out->cluster;
    const cluster_json *type = NULL;
    int64_t id = 0;
    if (!rc_validate_task(c, src, task_env, chief, &type, &id, st)) return false;
    bool evaluator = cluster_json_py_str_eq(type, "evaluator");
    bool master_mode = strcmp(chief, "master") == 0;
    if (evaluator && master_mode) return cluster_refuse(st, "TF_CONFIG", "with a \"master\" job, the evaluator is not supported");
    if (!(out->task_type = strdup(type->str))) return base_oom(st, "cluster", type->str_len + 1);
    out->task_id = id;
    out->is_chief = strcmp(out->task_type, chief) == 0;
    if (evaluator) {
        // The evaluator is not part of the training cluster.
        if (!rc_text(root, "eval_session_master", &out->evaluation_master, st)) return false;
        dg_cluster_free(&out->cluster);
        if (!(out->cluster = dg_cluster_new()) || !(out->master = strdup(""))) return base_oom(st, "cluster", 0);
        return true;
    }
    if (!(out->evaluation_master = strdup(""))) return base_oom(st, "cluster", 1);
    if (!rc_session_master(c, root, out->task_type, id, &out->master, st)) return false;
    if (!cluster_as_dict_ok(c, st)) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    out->num_ps_replicas = dg_cluster_num_tasks(c, "ps");
    out->num_worker_replicas = dg_cluster_num_tasks(c, "worker") + dg_cluster_num_tasks(c, chief);
    if (!rc_global_id(c, chief, out->task_type, id, &out->global_id_in_cluster, st))
        return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    out->has_global_id = true;
    return true;
}

// Without a cluster: one local worker, the chief.
static bool rc_local(dg_run_config *out, const char *src, const cluster_json *root, const cluster_json *task_env,
                     dg_status *st) {
    const cluster_json *type = NULL, *index = NULL;
    if (cluster_tf_dict_get(task_env, "type", &type, "\"task\"", st) < 0 ||
        cluster_tf_dict_get(task_env, "index", &index, "\"task\"", st) < 0)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    int64_t id = 0;
    bool big = false;
    if (index && !cluster_tf_int_field(src, "\"task.index\"", index, &id, &big, st) && !big)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    dg_status_reset(st);
    if (type && !cluster_json_py_str_eq(type, "worker")) return cluster_refuse(st, "TF_CONFIG", "without a \"cluster\", \"task.type\" must be \"worker\"");
    if (big || id != 0) return cluster_refuse(st, "TF_CONFIG", "without a \"cluster\", \"task.index\" must be 0");
    if (!(out->task_type = strdup("worker"))) return base_oom(st, "cluster", 7);
    out->is_chief = true;
    out->num_worker_replicas = 1;
    out->has_global_id = true;
    return rc_text(root, "session_master", &out->master, st) &&
           rc_text(root, "eval_session_master", &out->evaluation_master, st);
}

bool dg_run_config_parse(const char *tf_config, dg_run_config *out, dg_status *st) {
    dg_status_reset(st);
    if (!out) return cluster_refuse(st, NULL, "TF_CONFIG: NULL output");
    run_config_reset(out);
    // The one parser of TF_CONFIG; RunConfig's rules read its document and its cluster.
    dg_tf_resolver *r = dg_tf_resolver_new(tf_config, NULL, st);
    if (!r) return false;
    const char *src = r->text;
    const cluster_json *root = r->doc;
    bool ok = false;
    const cluster_json *v = NULL;
    // RunConfig calls tf_config.get(...): the document must be a dict.
    if (cluster_tf_dict_get(root, "model_dir", &v, "the document", st) < 0) {
        dg_status_prepend(st, "TF_CONFIG");
        goto out;
    }
    if (v && v->kind != CLUSTER_JSON_NULL) {
        if (!cluster_json_py_truthy(v)) {
            cluster_refuse(st, "TF_CONFIG", "\"model_dir\" must not be empty");
            goto out;
        }
        if (!cluster_tf_str_or_none(v, &out->model_dir, st)) goto out;
    }
    v = cluster_json_get(root, "service");
    if (v && v->kind != CLUSTER_JSON_NULL && v->kind != CLUSTER_JSON_OBJECT) {
        cluster_refuse(st, "TF_CONFIG", "\"service\" must be an object, got a %s", cluster_json_py_type(v));
        goto out;
    }
    // The document is a dict, so the resolver's `"cluster" in tf_config` is RunConfig's
    // tf_config.get("cluster"): the same cluster (empty without one), the same error.
    if (!cluster_tf_replay(&r->cluster_st, st)) goto out;
    out->cluster = r->cluster;
    r->cluster = NULL;
    static const cluster_json empty_task = {.kind = CLUSTER_JSON_OBJECT};
    const cluster_json *task_env = cluster_json_get(root, "task");
    if (!task_env) task_env = &empty_task;
    if (out->cluster->n_jobs > 0 && dg_cluster_has_job(out->cluster, "master")) {
        if (dg_cluster_has_job(out->cluster, "chief")) {
            cluster_refuse(st, "TF_CONFIG", "with a \"master\" job, a \"chief\" job is not supported");
            goto out;
        }
        ok = rc_distributed(out, src, root, task_env, "master", st);
    } else if (out->cluster->n_jobs > 0) {
        ok = rc_distributed(out, src, root, task_env, "chief", st);
    } else {
        ok = rc_local(out, src, root, task_env, st);
    }
out:
    dg_tf_resolver_free(&r);
    if (!ok) dg_run_config_clear(out);
    return ok;
}

bool dg_run_config_from_env(dg_run_config *out, dg_status *st) {
    return dg_run_config_parse(getenv("TF_CONFIG"), out, st);
}
