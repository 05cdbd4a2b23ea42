/* TF_CONFIG as TFConfigClusterResolver (tfconfig_cluster_resolver.py) reads it: the one parser
 * of TF_CONFIG. A resolver parses the text once and computes each property as TensorFlow does,
 * keeping its error, so each accessor fails only where the same property raises. RunConfig and
 * dg_tf_config read through it (tf_config_impl.h). */
#include "base_impl.h"
#include "distgraph/tf_config.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "distgraph/device_name.h"
#include "json_impl.h"
#include "status_impl.h"
#include "tf_config_impl.h"

dg_tf_resolver_options dg_tf_resolver_options_default(void) {
    dg_tf_resolver_options o = {.task_type = NULL, .has_task_id = false, .task_id = 0, .rpc_layer = NULL,
                                .environment = NULL};
    return o;
}

void dg_tf_resolver_free(dg_tf_resolver **rp) {
    if (!rp || !*rp) return;
    dg_tf_resolver *r = *rp;
    free(r->text);
    cluster_json_free(&r->doc);
    free(r->environment);
    dg_cluster_free(&r->cluster);
    status_impl_clear(&r->cluster_st);
    free(r->task_type);
    status_impl_clear(&r->task_type_st);
    status_impl_clear(&r->task_id_st);
    free(r->rpc_layer);
    status_impl_clear(&r->rpc_st);
    free(r->session_master);
    status_impl_clear(&r->session_master_st);
    free(r);
    *rp = NULL;
}

// cluster_spec(): ClusterSpec(tf_config['cluster']) when present, else an empty one.
static void resolve_cluster(dg_tf_resolver *r) {
    const cluster_json *cl = NULL;
    int found = cluster_tf_lookup(r->doc, "cluster", &cl, "TF_CONFIG", &r->cluster_st);
    if (found < 0) return;
    dg_cluster *c = dg_cluster_new();
    if (!c) {
        base_oom(&r->cluster_st, "cluster", sizeof *c);
        return;
    }
    if (found && !cluster_from_dom(c, r->text, cl, &r->cluster_st)) {
        dg_status_prepend(&r->cluster_st, "TF_CONFIG: \"cluster\"");
        dg_cluster_free(&c);
        return;
    }
    r->cluster = c;
}

// The "task" entry's field key: 1 with *out, 0 for None, -1 on error.
static int task_field(const dg_tf_resolver *r, const char *key, const cluster_json **out, dg_status *st) {
    const cluster_json *task = NULL;
    int found = cluster_tf_lookup(r->doc, "task", &task, "TF_CONFIG", st);
    if (found <= 0) return found;   // absent: {} has no fields
    return cluster_tf_lookup(task, key, out, "TF_CONFIG \"task\"", st);
}

static void resolve_task(dg_tf_resolver *r, const dg_tf_resolver_options *o) {
    const cluster_json *v = NULL;
    if (o->task_type) {
        if (!(r->task_type = strdup(o->task_type))) base_oom(&r->task_type_st, "cluster", strlen(o->task_type) + 1);
    } else if (task_field(r, "type", &v, &r->task_type_st) > 0) {
        if (!(r->task_type = cluster_json_py_str(v))) base_oom(&r->task_type_st, "cluster", v->src_len);   // null: "None"
    }
    if (o->has_task_id) {
        r->has_task_id = true;
        r->task_id = o->task_id;
    } else if (task_field(r, "index", &v, &r->task_id_st) > 0) {
        r->has_task_id = cluster_tf_int_field(r->text, "TF_CONFIG: \"task.index\"", v, &r->task_id, &r->task_id_big,
                                      &r->task_id_st);
        if (r->task_id_big) r->has_task_id = true;
    }
}

static void resolve_rpc(dg_tf_resolver *r, const dg_tf_resolver_options *o) {
    if (o->rpc_layer) {
        if (!(r->rpc_layer = strdup(o->rpc_layer))) base_oom(&r->rpc_st, "cluster", strlen(o->rpc_layer) + 1);
        r->rpc_truthy = o->rpc_layer[0] != '\0';
        return;
    }
    const cluster_json *v = NULL;
    if (cluster_tf_lookup(r->doc, "rpc_layer", &v, "TF_CONFIG", &r->rpc_st) > 0) {
        cluster_tf_str_or_none(v, &r->rpc_layer, &r->rpc_st);
        r->rpc_truthy = cluster_json_py_truthy(v);
    }
}

static void resolve_session_master(dg_tf_resolver *r) {
    const cluster_json *v = NULL;
    if (cluster_tf_lookup(r->doc, "session_master", &v, "TF_CONFIG", &r->session_master_st) > 0 &&
        v->kind != CLUSTER_JSON_NULL) {
        r->has_session_master = cluster_tf_str_or_none(v, &r->session_master, &r->session_master_st);
    }
}

dg_tf_resolver *dg_tf_resolver_new(const char *tf_config, const dg_tf_resolver_options *o,
                                   dg_status *st) {
    dg_status_reset(st);
    dg_tf_resolver_options opts = o ? *o : dg_tf_resolver_options_default();
    dg_tf_resolver *r = calloc(1, sizeof *r);
    if (!r) {
        base_oom(st, "cluster", sizeof *r);
        return NULL;
    }
    r->text = strdup(tf_config ? tf_config : "{}");
    if (!r->text || (opts.environment && !(r->environment = strdup(opts.environment)))) {
        base_oom(st, "cluster", 0);
        goto fail;
    }
    if (!(r->doc = cluster_json_parse(r->text, strlen(r->text), "TF_CONFIG", st))) goto fail;
    resolve_cluster(r);
    resolve_task(r, &opts);
    resolve_rpc(r, &opts);
    resolve_session_master(r);
    return r;
fail:
    dg_tf_resolver_free(&r);
    return NULL;
}

dg_tf_resolver *dg_tf_resolver_from_env(const dg_tf_resolver_options *o, dg_status *st) {
    return dg_tf_resolver_new(getenv("TF_CONFIG"), o, st);
}

// Replays a property's stored outcome into st: true when it succeeded.
bool cluster_tf_replay(const dg_status *stored, dg_status *st) {
    if (dg_status_ok(stored)) return true;
    dg_status_copy(st, stored);
    return false;
}

dg_cluster *dg_tf_resolver_cluster_spec(const dg_tf_resolver *r, dg_status *st) {
    dg_status_reset(st);
    if (!r) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "TF_CONFIG resolver: NULL");
        return NULL;
    }
    if (!cluster_tf_replay(&r->cluster_st, st)) return NULL;
    dg_cluster *c = dg_cluster_copy(r->cluster);
    if (!c) base_oom(st, "cluster", 0);
    return c;
}

bool dg_tf_resolver_task_type(const dg_tf_resolver *r, const char **task_type, dg_status *st) {
    dg_status_reset(st);
    if (task_type) *task_type = NULL;
    if (!r || !task_type) return cluster_refuse(st, NULL, "TF_CONFIG resolver: NULL argument");
    if (!cluster_tf_replay(&r->task_type_st, st)) return false;
    *task_type = r->task_type;
    return true;
}

bool dg_tf_resolver_task_id(const dg_tf_resolver *r, bool *has_id, int64_t *task_id, dg_status *st) {
    dg_status_reset(st);
    if (!r || !has_id || !task_id) return cluster_refuse(st, NULL, "TF_CONFIG resolver: NULL argument");
    *has_id = false;
    *task_id = 0;
    if (!cluster_tf_replay(&r->task_id_st, st)) return false;
    *has_id = r->has_task_id;
    *task_id = r->task_id;
    return true;
}

bool dg_tf_resolver_rpc_layer(const dg_tf_resolver *r, const char **rpc_layer, dg_status *st) {
    dg_status_reset(st);
    if (rpc_layer) *rpc_layer = NULL;
    if (!r || !rpc_layer) return cluster_refuse(st, NULL, "TF_CONFIG resolver: NULL argument");
    if (!cluster_tf_replay(&r->rpc_st, st)) return false;
    *rpc_layer = r->rpc_layer;
    return true;
}

const char *dg_tf_resolver_environment(const dg_tf_resolver *r) { return r ? r->environment : NULL; }

// The single-task rule: a cluster of no jobs, or of one job whose task list holds one entry,
// runs in process (master ""). -1 on error (the span of an empty job), else 0 or 1.
int cluster_tf_single_task(const dg_cluster *c, dg_status *st) {
    if (c->n_jobs == 0) return 1;
    if (c->n_jobs > 1) return 0;
    int64_t span = cluster_task_span(&c->jobs[0], st);
    if (span < 0) return -1;
    return span == 1;
}

// The task a master() call means, as TensorFlow's arguments and properties give it.
typedef struct tf_task {
    const char *type;    // NULL: None
    bool has_id, id_big;
    int64_t id;
} tf_task;

static bool resolve_call_task(const dg_tf_resolver *r, const char *task_type, bool has_task_id,
                              int64_t task_id, tf_task *t, dg_status *st) {
    t->type = task_type;
    if (!task_type) {
        if (!cluster_tf_replay(&r->task_type_st, st)) return false;
        t->type = r->task_type;
    }
    t->has_id = has_task_id;
    t->id = task_id;
    t->id_big = false;
    if (!has_task_id) {
        // A TensorFlow integer past int64 is still an index: it names no task.
        if (!r->task_id_big && !cluster_tf_replay(&r->task_id_st, st)) return false;
        t->has_id = r->has_task_id;
        t->id = r->task_id;
        t->id_big = r->task_id_big;
    }
    return true;
}

static char *master_of(const dg_tf_resolver *r, const tf_task *t, const char *rpc_layer, dg_status *st) {
    if (!cluster_tf_replay(&r->session_master_st, st)) return NULL;
    if (r->has_session_master) {
        char *s = strdup(r->session_master);
        if (!s) base_oom(st, "cluster", 0);
        return s;
    }
    if (!cluster_tf_replay(&r->cluster_st, st)) return NULL;
    int single = cluster_tf_single_task(r->cluster, st);
    if (single < 0) {
        dg_status_prepend(st, "TF_CONFIG: \"cluster\"");
        return NULL;
    }
    if (single) {
        char *s = strdup("");
        if (!s) base_oom(st, "cluster", 1);
        return s;
    }
    const char *rpc = rpc_layer;
    bool rpc_truthy = rpc && rpc[0];
    if (!rpc) {
        if (!cluster_tf_replay(&r->rpc_st, st)) return NULL;
        rpc = r->rpc_layer;
        rpc_truthy = r->rpc_truthy;
    }
    const cl_job *j = cluster_lookup_job(r->cluster, t->type);
    if (!j) {
        dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG: no job \"%s\" in the cluster",
                       t->type ? t->type : "None");
        return NULL;
    }
    int pos = t->has_id && !t->id_big && t->id >= INT_MIN && t->id <= INT_MAX ? cluster_find_task(j, (int)t->id) : -1;
    if (pos < 0) {
        if (t->has_id && !t->id_big)
            dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG: job \"%s\" has no task %lld", j->name, (long long)t->id);
        else
            dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG: job \"%s\" has no task %s", j->name,
                           t->id_big ? "with that index" : "None");
        return NULL;
    }
    char *s = NULL;
    if (asprintf(&s, "%s%s%s", rpc_truthy ? rpc : "", rpc_truthy ? "://" : "", j->tasks[pos].addr) < 0) {
        base_oom(st, "cluster", 0);
        return NULL;
    }
    return s;
}

char *dg_tf_resolver_master(const dg_tf_resolver *r, const char *task_type, bool has_task_id,
                            int64_t task_id, const char *rpc_layer, dg_status *st) {
    dg_status_reset(st);
    if (!r) {
        cluster_refuse(st, NULL, "TF_CONFIG resolver: NULL");
        return NULL;
    }
    // As TensorFlow: session_master first, then the cluster and the single-task rule, and only
    // then the task (so a broken task does not matter to a single-task cluster).
    if (!cluster_tf_replay(&r->session_master_st, st)) return NULL;
    if (!r->has_session_master) {
        if (!cluster_tf_replay(&r->cluster_st, st)) return NULL;
        dg_status tmp = DG_STATUS_INIT;
        int single = cluster_tf_single_task(r->cluster, &tmp);
        status_impl_clear(&tmp);
        if (single == 0) {
            tf_task t;
            if (!resolve_call_task(r, task_type, has_task_id, task_id, &t, st)) return NULL;
            return master_of(r, &t, rpc_layer, st);
        }
    }
    tf_task none = {0};
    return master_of(r, &none, rpc_layer, st);
}

static int cmp_accel(const void *a, const void *b) {
    return strcmp(((const dg_accelerator_count *)a)->device_type, ((const dg_accelerator_count *)b)->device_type);
}

int dg_tf_resolver_num_accelerators(const dg_tf_resolver *r, const char *task_type,
                                    bool has_task_id, int64_t task_id,
                                    const char *const *devices, int n_devices,
                                    dg_accelerator_count *counts, int max_counts,
                                    dg_status *st) {
    dg_status_reset(st);
    if (!r || (n_devices > 0 && !devices) || n_devices < 0) {
        cluster_refuse(st, NULL, "TF_CONFIG resolver: NULL or negative argument");
        return -1;
    }
    // task_type and task_id default to the resolver's; TensorFlow then asks master() for the
    // target to list devices on, which can fail on its own.
    tf_task t;
    if (!resolve_call_task(r, task_type, has_task_id, task_id, &t, st)) return -1;
    if (t.id_big) {
        cluster_refuse(st, NULL, "TF_CONFIG: \"task.index\" does not fit 64 bits");
        return -1;
    }
    char *master = dg_tf_resolver_master(r, t.type, t.has_id, t.id, NULL, st);
    if (!master) return -1;
    free(master);
    char *job_part = NULL, task_part[32];
    bool filter = t.type && t.has_id;
    if (filter) {
        if (asprintf(&job_part, "/job:%s", t.type) < 0) {
            base_oom(st, "cluster", strlen(t.type) + 6);
            return -1;
        }
        snprintf(task_part, sizeof task_part, "/task:%lld", (long long)t.id);
    }
    dg_accelerator_count found[64];
    int n_found = 0;
    for (int i = 0; i < n_devices; i++) {
        dg_device_name dn;
        if (!devices[i] || !dg_device_name_parse(devices[i], &dn, st) || !dn.has_type) {
            if (dg_status_ok(st))
                dg_status_setf(st, DG_INVALID_ARGUMENT, "device \"%s\" names no device type",
                               devices[i] ? devices[i] : "(null)");
            dg_status_prepend(st, "num_accelerators");
            free(job_part);
            return -1;
        }
        if (strcmp(dn.type, "CPU") == 0 || strcmp(dn.type, "XLA_CPU") == 0) continue;
        if (filter && (!strstr(devices[i], job_part) || !strstr(devices[i], task_part))) continue;
        int k = 0;
        while (k < n_found && strcmp(found[k].device_type, dn.type) != 0) k++;
        if (k == n_found) {
            if (n_found == (int)(sizeof found / sizeof *found)) continue;
            snprintf(found[k].device_type, sizeof found[k].device_type, "%s", dn.type);
            found[k].count = 0;
            n_found++;
        }
        found[k].count++;
    }
    free(job_part);
    qsort(found, (size_t)n_found, sizeof *found, cmp_accel);
    for (int k = 0; k < n_found && k < max_counts && counts; k++) counts[k] = found[k];
    return n_found;
}
