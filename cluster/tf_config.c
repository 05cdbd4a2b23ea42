/* What a task needs to start from TF_CONFIG (dg_tf_config): the fields as the resolver reads
 * them (tf_resolver.c), then the rules of a server's task, multi_worker_util's limits of one
 * chief and one evaluator, and a check for typos of the keys it reads. */
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

// The task a server starts for: in the cluster (the evaluator may stand beside it), and
// multi_worker_util's limits of one chief and one evaluator.
static bool check_task(const dg_tf_config *cfg, bool index_big, dg_status *st) {
    const dg_cluster *c = cfg->cluster;
    if (dg_cluster_num_tasks(c, "chief") > 1)
        return cluster_refuse(st, "TF_CONFIG", "\"cluster\": job \"chief\" has %d tasks, at most 1 is allowed",
                      dg_cluster_num_tasks(c, "chief"));
    if (dg_cluster_num_tasks(c, "evaluator") > 1)
        return cluster_refuse(st, "TF_CONFIG", "\"cluster\": job \"evaluator\" has %d tasks, at most 1 is allowed",
                      dg_cluster_num_tasks(c, "evaluator"));
    if (cfg->task_type[0] == '\0') return true;
    const cl_job *j = cluster_lookup_job(c, cfg->task_type);
    bool evaluator = strcmp(cfg->task_type, "evaluator") == 0;
    if (index_big)
        return cluster_refuse(st, "TF_CONFIG", "\"task.index\" is out of range for job \"%s\"", cfg->task_type);
    if (!j) {
        // The evaluator runs beside the cluster and need not be listed in it.
        if (evaluator) return true;
        if (!c) return cluster_refuse(st, "TF_CONFIG", "\"task.type\" is \"%s\" but there is no \"cluster\"",
                              cfg->task_type);
        return cluster_refuse(st, "TF_CONFIG", "\"task.type\" \"%s\" is not a job in \"cluster\"", cfg->task_type);
    }
    if (cluster_find_task(j, cfg->task_index) < 0) {
        bool dense = j->n_tasks == 0 || (j->tasks[0].index == 0 && j->tasks[j->n_tasks - 1].index == j->n_tasks - 1);
        if (dense)
            return cluster_refuse(st, "TF_CONFIG", "\"task.index\" %d is out of range: job \"%s\" has %d task%s",
                          cfg->task_index, j->name, j->n_tasks, j->n_tasks == 1 ? "" : "s");
        return cluster_refuse(st, "TF_CONFIG", "\"task.index\" %d is out of range: job \"%s\" has no task %d",
                      cfg->task_index, j->name, cfg->task_index);
    }
    return true;
}

// Whether a and b are within two edits (insertions, deletions, substitutions, adjacent swaps)
// of each other: "clsuter" and "cluster", "taks" and "task".
static bool edit_distance_at_most2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32 || (la > lb ? la - lb : lb - la) > 2) return false;
    int d[34][34];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb] <= 2 && !(lb <= 4 && d[la][lb] == 2 && la < 3);
}

static void tf_config_reset(dg_tf_config *cfg) {
    cfg->cluster = NULL;
    cfg->task_type[0] = '\0';
    cfg->task_index = -1;
    cfg->is_chief = false;
    cfg->rpc_layer[0] = '\0';
}

// Other keys ("environment", "session_master", ...) are TensorFlow's business, not a server's,
// but one a letter or two away from a key we read is a typo that would silently drop it.
static bool check_typos(const cluster_json *root, dg_status *st) {
    if (root->kind != CLUSTER_JSON_OBJECT) return true;
    static const char *const ours[] = {"cluster", "task", "rpc_layer"};
    for (size_t i = 0; i < root->n; i++) {
        const char *k = root->members[i].key;
        for (size_t j = 0; j < sizeof ours / sizeof *ours; j++) {
            if (strcmp(k, ours[j]) != 0 && !cluster_json_get(root, ours[j]) && edit_distance_at_most2(k, ours[j]))
                return cluster_refuse(st, "TF_CONFIG", "unknown key \"%s\" at byte %zu (did you mean \"%s\"?)", k,
                              root->members[i].key_offset, ours[j]);
        }
    }
    return true;
}

bool dg_tf_config_parse(const char *json, dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    if (!out) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "TF_CONFIG: NULL output");
        return false;
    }
    tf_config_reset(out);
    if (!json) return cluster_refuse(st, "TF_CONFIG", "NULL string");
    dg_tf_resolver *r = dg_tf_resolver_new(json, NULL, st);
    if (!r) return false;
    if (!check_typos(r->doc, st)) goto fail;
    // The cluster, as the resolver reads it; NULL when TF_CONFIG has none.
    const cluster_json *cl = NULL;
    if (cluster_tf_lookup(r->doc, "cluster", &cl, "TF_CONFIG", st) < 0) {
        dg_status_prepend(st, "TF_CONFIG");
        goto fail;
    }
    if (cl) {
        if (!cluster_tf_replay(&r->cluster_st, st)) goto fail;
        out->cluster = r->cluster;
        r->cluster = NULL;
    }
    // The task: both fields or neither (TensorFlow fails later, when a strategy or a server
    // needs the missing one).
    const char *type = NULL;
    bool has_id;
    int64_t id;
    if (!dg_tf_resolver_task_type(r, &type, st)) goto fail;
    if (!dg_tf_resolver_task_id(r, &has_id, &id, st) && !r->task_id_big) goto fail;
    dg_status_reset(st);
    if (type || r->has_task_id) {
        if (!type) {
            cluster_refuse(st, "TF_CONFIG", "\"task\" has no \"type\"");
            goto fail;
        }
        if (!r->has_task_id) {
            cluster_refuse(st, "TF_CONFIG", "\"task\" has no \"index\"");
            goto fail;
        }
        if (type[0] == '\0') {
            cluster_refuse(st, "TF_CONFIG", "\"task.type\" is empty");
            goto fail;
        }
        if (strlen(type) >= sizeof out->task_type) {
            cluster_refuse(st, "TF_CONFIG", "\"task.type\" \"%.40s...\" is longer than %zu bytes", type, sizeof out->task_type - 1);
            goto fail;
        }
        if (!cluster_utf8_valid(type)) {
            cluster_refuse(st, "TF_CONFIG", "\"task.type\" \"%s\" is not Unicode text", type);
            goto fail;
        }
        memcpy(out->task_type, type, strlen(type) + 1);
        out->task_index = !r->task_id_big && r->task_id >= INT_MIN && r->task_id <= INT_MAX ? (int)r->task_id : -1;
    }
    const char *rpc = NULL;
    if (!dg_tf_resolver_rpc_layer(r, &rpc, st)) goto fail;
    if (rpc) {
        if (strlen(rpc) >= sizeof out->rpc_layer) {
            cluster_refuse(st, "TF_CONFIG", "\"rpc_layer\" \"%s\" is longer than %zu bytes", rpc, sizeof out->rpc_layer - 1);
            goto fail;
        }
        memcpy(out->rpc_layer, rpc, strlen(rpc) + 1);
    }
    bool index_big = out->task_type[0] && (r->task_id_big || r->task_id < INT_MIN || r->task_id > INT_MAX);
    if (!check_task(out, index_big, st)) goto fail;
    // multi_worker_util.is_chief, except that the evaluator is not a chief here: in a
    // parameter-server cluster it must not initialize or save the variables.
    out->is_chief = strcmp(out->task_type, "chief") == 0 ||
                    (strcmp(out->task_type, "worker") == 0 && out->task_index == 0 &&
                     !dg_cluster_has_job(out->cluster, "chief"));
    dg_tf_resolver_free(&r);
    return true;
fail:
    dg_tf_resolver_free(&r);
    dg_tf_config_clear(out);
    return false;
}

bool dg_tf_config_from_env(dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    const char *env = getenv("TF_CONFIG");
    if (!env || !*env) {
        if (out) tf_config_reset(out);
        dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG is %s", env ? "empty" : "not set");
        return false;
    }
    return dg_tf_config_parse(env, out, st);
}

void dg_tf_config_clear(dg_tf_config *cfg) {
    if (!cfg) return;
    dg_cluster_free(&cfg->cluster);
    tf_config_reset(cfg);
}
