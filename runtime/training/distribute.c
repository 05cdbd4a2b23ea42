/* One strategy API (distgraph/distribute.h): each kind of distribution as the pieces distgraph
 * already has, put together the way their examples put them together by hand. The one-process
 * kinds are a dg_strategy (graph/strategy.c) over this process's devices; multi-worker
 * mirrored is an all-reduce of the gradients and a broadcast of worker 0's values
 * (distgraph/collective.h); the parameter-server kinds are the replica device setter, and for
 * sync replicas the sync replicas optimizer and its hook; ps_coordinator runs the steps through
 * the cluster coordinator (coordinator.c). The monitored session gets the kind's roles and
 * hooks (docs/GUIDE.md). Built on the public API only, and the coordinator's internal one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "coordinator_impl.h"
#include "distgraph/collective.h"
#include "distgraph/device_setter.h"
#include "distgraph/distribute.h"
#include "distgraph/strategy.h"
#include "distgraph/sync_replicas.h"

static const dg_output NUL = {NULL, 0};

static const char *const KIND_NAMES[] = {"mirrored", "central_storage", "multi_worker_mirrored", "parameter_server",
                                         "sync_replicas", "ps_coordinator"};
#define N_KINDS 6

// A variable the first replica created: what the later ones must ask for.
typedef struct dist_var {
    char *name;
    dg_dtype dtype;
    dg_shape shape;
    dg_output handle;   // the variable (a strategy variable's handle for the one-process kinds)
} dist_var;

struct dg_distribution {
    dg_distribution_kind kind;
    bool one_process;
    // The kinds that span a cluster.
    dg_cluster *cluster;            // owned copy
    dg_server *server;
    char job[64];
    int task, n_workers, n_ps;
    int replicas_to_aggregate;
    int64_t peer_timeout_ms;
    // The one-process kinds.
    char device_type[16];
    int num_devices;
    // What dg_distribution_minimize built, for its one graph.
    dg_graph *g;                    // borrowed
    dg_strategy *strategy;
    dg_sync_replicas *sr;
    dg_device_fn *setter;
    dg_node *bcast;
    // ps_coordinator's coordinator: the steps' runner, and what dg_distribution_run counts.
    bool coordinator;               // this process is the coordinator (job "chief")
    bool log;
    training_coordinator *coord;
    int64_t last_step, start_step, n_scheduled;
    bool started;
    dg_node *train;                 // what dg_distribution_minimize built
    dg_output global_step;
    dist_var *vars;
    int n_vars, cap_vars;
    // Hooks made for sessions, and the lists given to them (borrowed by the sessions).
    dg_session_hook **hooks;
    int n_hooks, cap_hooks;
    dg_session_hook ***lists;
    int n_lists, cap_lists;
};

struct dg_replica {
    dg_distribution *d;
    dg_graph *g;
    int id;
    bool creating;   // the first pass: variables are made, not found
    int next;        // later passes: the index of the next variable asked for
};

const char *dg_distribution_kind_name(dg_distribution_kind kind) {
    return (unsigned)kind < N_KINDS ? KIND_NAMES[kind] : "unknown";
}

bool dg_distribution_kind_parse(const char *name, dg_distribution_kind *out, dg_status *st) {
    for (int i = 0; name && i < N_KINDS; i++)
        if (strcmp(name, KIND_NAMES[i]) == 0) {
            *out = (dg_distribution_kind)i;
            return true;
        }
    dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution: unknown kind \"%s\" (mirrored, central_storage, "
                   "multi_worker_mirrored, parameter_server or sync_replicas)", name ? name : "(null)");
    return false;
}

dg_distribution_options dg_distribution_options_default(dg_distribution_kind kind) {
    dg_distribution_options o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.num_devices = 2;
    return o;
}

void dg_distribution_free(dg_distribution **dp) {
    if (!dp || !*dp) return;
    dg_distribution *d = *dp;
    for (int i = 0; i < d->n_hooks; i++) dg_session_hook_free(&d->hooks[i]);   // the sync hook before sr
    free(d->hooks);
    for (int i = 0; i < d->n_lists; i++) free(d->lists[i]);
    free(d->lists);
    dg_sync_replicas_free(&d->sr);
    training_coordinator_free(&d->coord);
    dg_strategy_free(&d->strategy);
    dg_device_fn_free(&d->setter);
    for (int i = 0; i < d->n_vars; i++) free(d->vars[i].name);
    free(d->vars);
    dg_server_free(&d->server);
    dg_cluster_free(&d->cluster);
    free(d);
    *dp = NULL;
}

// The cluster and task of a cluster kind: from the options, Slurm's environment, or TF_CONFIG.
static bool find_task(dg_distribution *d, const dg_distribution_options *o, dg_status *st) {
    if (o->cluster) {
        if (!o->job_name) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "distribution: a cluster without job_name (\"worker\" or \"ps\")");
            return false;
        }
        if (!(d->cluster = dg_cluster_copy(o->cluster))) {
            dg_status_set(st, DG_RESOURCE_EXHAUSTED, "distribution: out of memory copying the cluster");
            return false;
        }
        snprintf(d->job, sizeof d->job, "%s", o->job_name);
        d->task = o->task_index;
        return true;
    }
    dg_tf_config cfg;
    if (o->slurm) {
        if (!dg_slurm_from_env(o->slurm, &cfg, st)) {
            dg_status_prepend(st, "distribution %s: the cluster from Slurm", dg_distribution_kind_name(d->kind));
            return false;
        }
    } else if (!dg_tf_config_from_env(&cfg, st)) {
        dg_status_prepend(st, "distribution %s: no cluster given, and TF_CONFIG", dg_distribution_kind_name(d->kind));
        return false;
    }
    d->cluster = cfg.cluster;
    cfg.cluster = NULL;
    snprintf(d->job, sizeof d->job, "%s", o->job_name ? o->job_name : cfg.task_type);
    d->task = o->job_name ? o->task_index : cfg.task_index;
    dg_tf_config_clear(&cfg);
    if (!d->cluster) {
        dg_status_set(st, DG_INVALID_ARGUMENT, o->slurm ? "distribution: Slurm gave no cluster"
                                                        : "distribution: TF_CONFIG has no \"cluster\"");
        return false;
    }
    return true;
}

// The cluster fits the kind, and this task is one of its ps or worker tasks (or
// ps_coordinator's coordinator, its "chief").
static bool check_cluster(dg_distribution *d, dg_status *st) {
    const char *kind = dg_distribution_kind_name(d->kind);
    bool wants_ps = d->kind != DG_DISTRIBUTE_MULTI_WORKER_MIRRORED;
    bool coordinated = d->kind == DG_DISTRIBUTE_PS_COORDINATOR;
    d->n_workers = dg_cluster_num_tasks(d->cluster, "worker");
    d->n_ps = dg_cluster_num_tasks(d->cluster, "ps");
    for (int i = 0; i < dg_cluster_num_jobs(d->cluster); i++) {
        const char *j = dg_cluster_job(d->cluster, i);
        if (coordinated && strcmp(j, "chief") == 0) {
            if (dg_cluster_num_tasks(d->cluster, "chief") != 1) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the \"chief\" job (the coordinator) has "
                               "%d tasks; it takes one", kind, dg_cluster_num_tasks(d->cluster, "chief"));
                return false;
            }
            continue;
        }
        if (strcmp(j, "worker") != 0 && strcmp(j, "ps") != 0) {
            if (coordinated) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the cluster has a \"%s\" job; it takes "
                               "\"worker\" and \"ps\" tasks and one \"chief\" (the coordinator)", kind, j);
                return false;
            }
            dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the cluster has a \"%s\" job; it takes "
                           "\"worker\" tasks%s (worker 0 is the chief)", kind, j, wants_ps ? " and \"ps\" tasks" : "");
            return false;
        }
    }
    if (d->n_workers < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the cluster has no \"worker\" job", kind);
        return false;
    }
    if (wants_ps && d->n_ps < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the cluster has no \"ps\" job to hold the "
                       "variables (multi_worker_mirrored keeps them on the workers)", kind);
        return false;
    }
    if (!wants_ps && d->n_ps > 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the cluster has %d ps task%s, but every worker "
                       "holds the variables here (parameter_server or sync_replicas use ps tasks)", kind, d->n_ps,
                       d->n_ps == 1 ? "" : "s");
        return false;
    }
    d->coordinator = coordinated && strcmp(d->job, "chief") == 0;
    if (strcmp(d->job, "worker") != 0 && strcmp(d->job, "ps") != 0 && !d->coordinator) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: this task's job is \"%s\", not \"worker\"%s or "
                       "\"ps\"", kind, d->job, coordinated ? ", \"chief\" (the coordinator)" : "");
        return false;
    }
    if (d->coordinator && !dg_cluster_has_job(d->cluster, "chief")) {
        if (d->task != 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the coordinator is chief task 0, not %d", kind,
                           d->task);
            return false;
        }
    } else if (!dg_cluster_check_task(d->cluster, d->job, d->task, st)) {
        dg_status_prepend(st, "distribution %s: this task", kind);
        return false;
    }
    int rta = d->replicas_to_aggregate ? d->replicas_to_aggregate : d->n_workers;
    if (d->kind == DG_DISTRIBUTE_SYNC_REPLICAS && (rta < 1 || rta > d->n_workers)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: replicas_to_aggregate %d, with %d workers "
                       "(1..%d)", kind, rta, d->n_workers, d->n_workers);
        return false;
    }
    d->replicas_to_aggregate = rta;
    return true;
}

dg_distribution *dg_distribution_new(const dg_distribution_options *o, dg_status *st) {
    dg_status_reset(st);
    if (!o || (unsigned)o->kind >= N_KINDS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution: %s", o ? "unknown kind" : "options are NULL");
        return NULL;
    }
    dg_distribution *d = calloc(1, sizeof *d);
    if (!d) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "distribution: out of memory");
        return NULL;
    }
    d->kind = o->kind;
    d->one_process = o->kind == DG_DISTRIBUTE_MIRRORED || o->kind == DG_DISTRIBUTE_CENTRAL_STORAGE;
    d->replicas_to_aggregate = o->replicas_to_aggregate;
    d->peer_timeout_ms = o->peer_timeout_ms > 0 ? o->peer_timeout_ms : 60000;
    if (o->replicas_to_aggregate < 0 || o->peer_timeout_ms < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution: replicas_to_aggregate %d and peer_timeout_ms %lld "
                       "must not be negative", o->replicas_to_aggregate, (long long)o->peer_timeout_ms);
        goto fail;
    }
    if (d->one_process) {
        const char *type = o->device_type ? o->device_type : "CPU";
        if ((strcmp(type, "CPU") != 0 && strcmp(type, "GPU") != 0) || o->num_devices < 1 || o->num_devices > 64) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: device_type \"%s\" (CPU or GPU) and "
                           "num_devices %d (1..64)", dg_distribution_kind_name(d->kind), type, o->num_devices);
            goto fail;
        }
        snprintf(d->device_type, sizeof d->device_type, "%s", type);
        d->num_devices = o->num_devices;
        d->n_workers = 1;
        return d;
    }
    if (!find_task(d, o, st) || !check_cluster(d, st)) goto fail;
    dg_server_options so = o->server_options ? *o->server_options : dg_server_options_default();
    // Sync replicas: each worker's step waits on the ps for its token (sync_replicas.h).
    if (d->kind == DG_DISTRIBUTE_SYNC_REPLICAS && strcmp(d->job, "ps") == 0 && so.service_threads < d->n_workers + 3)
        so.service_threads = d->n_workers + 3;
    d->log = !so.quiet;
    if (d->coordinator) return d;   // a client of the other tasks' masters: no server of its own
    if (!(d->server = dg_server_new(d->cluster, d->job, d->task, &so, st))) goto fail;
    return d;
fail:
    dg_distribution_free(&d);
    return NULL;
}

dg_distribution_kind dg_distribution_get_kind(const dg_distribution *d) { return d->kind; }
bool dg_distribution_is_ps(const dg_distribution *d) { return !d->one_process && strcmp(d->job, "ps") == 0; }
bool dg_distribution_only_serves(const dg_distribution *d) {
    return dg_distribution_is_ps(d) ||
           (d->kind == DG_DISTRIBUTE_PS_COORDINATOR && !d->one_process && strcmp(d->job, "worker") == 0);
}
bool dg_distribution_is_chief(const dg_distribution *d) {
    if (d->kind == DG_DISTRIBUTE_PS_COORDINATOR) return d->coordinator;
    return d->one_process || (strcmp(d->job, "worker") == 0 && d->task == 0);
}
int dg_distribution_num_replicas_in_sync(const dg_distribution *d) {
    switch (d->kind) {
    case DG_DISTRIBUTE_MIRRORED:
    case DG_DISTRIBUTE_CENTRAL_STORAGE: return d->num_devices;
    case DG_DISTRIBUTE_MULTI_WORKER_MIRRORED: return d->n_workers;
    case DG_DISTRIBUTE_SYNC_REPLICAS: return d->replicas_to_aggregate;
    default: return 1;
    }
}
int dg_distribution_worker_index(const dg_distribution *d) {
    return d->one_process ? 0 : dg_distribution_is_ps(d) || d->coordinator ? -1 : d->task;
}
int dg_distribution_num_workers(const dg_distribution *d) { return d->n_workers; }
dg_server *dg_distribution_server(const dg_distribution *d) { return d->server; }

bool dg_distribution_join(dg_distribution *d, dg_status *st) {
    if (!d->server) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "distribution %s: %s, no server to join",
                       dg_distribution_kind_name(d->kind), d->coordinator ? "the coordinator" : "one process");
        return false;
    }
    return dg_server_join(d->server, true, st);
}

// ---- the model ----
int dg_replica_id(const dg_replica *r) { return r->id; }
dg_graph *dg_replica_graph(const dg_replica *r) { return r->g; }

dg_output dg_replica_variable(dg_replica *r, const char *name, dg_dtype dtype, dg_shape shape, dg_initializer init) {
    dg_distribution *d = r->d;
    dg_graph *g = r->g;
    if (!dg_graph_ok(g)) return NUL;
    if (!name || !*name) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "replica %d: a variable without a name", r->id);
        return NUL;
    }
    if (r->creating) {
        dg_output v;
        if (d->strategy) {
            dg_status *st = dg_status_new();
            v = dg_strategy_variable(d->strategy, name, dtype, shape, init, st);
            if (!v.node && dg_graph_ok(g)) dg_graph_set_error(g, dg_status_code(st), "%s", dg_status_message(st));
            dg_status_free(&st);
        } else {
            v = dg_variable(g, name, dtype, shape, init);
        }
        if (!v.node) return NUL;
        base_reserve((void **)&d->vars, sizeof *d->vars, d->n_vars, &d->cap_vars, 1);
        dist_var *dv = &d->vars[d->n_vars++];
        if (!(dv->name = strdup(name))) abort();
        dv->dtype = dtype;
        dv->shape = shape;
        dv->handle = v;
        return d->strategy ? dg_strategy_read_variable(d->strategy, v, r->id) : v;
    }
    int k = r->next++;
    if (k >= d->n_vars || strcmp(d->vars[k].name, name) != 0 || d->vars[k].dtype != dtype ||
        !dg_shape_equal(&d->vars[k].shape, &shape)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "replica %d: variable %d is \"%s\" (%s), but the first replica "
                           "made %s%s%s: a model function must make the same variables in the same order every time",
                           r->id, k, name, dg_dtype_name(dtype), k < d->n_vars ? "\"" : "only ",
                           k < d->n_vars ? d->vars[k].name : "", k < d->n_vars ? "\"" : "those before it");
        return NUL;
    }
    return d->strategy ? dg_strategy_read_variable(d->strategy, d->vars[k].handle, r->id) : d->vars[k].handle;
}

// Calls the model function for replica r; false (the graph's status or st says why) unless it
// gave every output.
static bool build_replica(dg_replica *r, dg_model_fn fn, void *ctx, const dg_output *inputs, dg_output *outs, int n,
                          dg_status *st) {
    for (int i = 0; i < n; i++) outs[i] = NUL;
    bool ok = fn(r, inputs, ctx, outs, n) && dg_graph_ok(r->g);
    for (int i = 0; i < n && ok; i++)
        if (!outs[i].node) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution: the model function gave no output %d (of %d) for "
                           "replica %d", i, n, r->id);
            return false;
        }
    if (ok && !r->creating && r->next != r->d->n_vars) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution: replica %d made %d variables, the first replica %d",
                       r->id, r->next, r->d->n_vars);
        return false;
    }
    if (!ok && dg_status_ok(st)) {
        if (!dg_graph_ok(r->g)) dg_status_copy(st, dg_graph_status(r->g));
        else dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution: the model function failed for replica %d", r->id);
    }
    return ok;
}

typedef struct tower_ctx {
    dg_distribution *d;
    dg_model_fn fn;
    void *user;
    int n_outputs;
    dg_output *per_replica;   // [replica * n_outputs + i]
    dg_status *st;
} tower_ctx;

static dg_output tower(dg_graph *g, int replica, const dg_output *inputs, void *arg) {
    tower_ctx *t = arg;
    dg_replica r = {t->d, g, replica, false, 0};
    dg_output *outs = &t->per_replica[(size_t)replica * (size_t)t->n_outputs];
    if (!build_replica(&r, t->fn, t->user, inputs, outs, t->n_outputs, t->st)) {
        if (dg_graph_ok(g)) dg_graph_set_error(g, dg_status_code(t->st), "%s", dg_status_message(t->st));
        return NUL;
    }
    return outs[0];
}

// The one-process kinds: a first pass on device 0 over the whole batch makes the variables
// (plain names) and is the evaluation model; dg_strategy_minimize then builds the towers.
static bool minimize_local(dg_distribution *d, dg_graph *g, const dg_optimizer *opt, dg_model_fn fn, void *ctx,
                           const dg_output *inputs, int n_inputs, int n_out, dg_distributed_step *out,
                           dg_status *st) {
    dg_strategy_kind sk = d->kind == DG_DISTRIBUTE_MIRRORED ? DG_STRATEGY_MIRRORED : DG_STRATEGY_CENTRAL_STORAGE;
    if (!(d->strategy = dg_strategy_new_local(g, sk, d->device_type, d->num_devices, st))) return false;
    const char *host = dg_strategy_host_device(d->strategy);
    dg_graph_push_device(g, host);
    out->global_step = dg_global_step(g);
    dg_graph_pop_device(g);
    // No name scope: the variables keep the names the model gives them, as in the other kinds.
    dg_graph_push_device(g, dg_strategy_device(d->strategy, 0));
    dg_replica first = {d, g, 0, true, 0};
    bool ok = build_replica(&first, fn, ctx, inputs, out->eval_outputs, n_out, st);
    dg_graph_pop_device(g);
    if (!ok) return false;
    int n_rep = d->num_devices;
    tower_ctx t = {d, fn, ctx, n_out, calloc((size_t)n_rep * (size_t)n_out, sizeof(dg_output)), st};
    if (!t.per_replica) abort();
    dg_strategy_step step;
    ok = dg_strategy_minimize(d->strategy, opt, tower, &t, inputs, n_inputs, out->global_step, &step, st);
    if (ok) {
        out->train = step.train;
        out->outputs[0] = step.loss;
        // The other outputs: the mean over the replicas, on the host.
        dg_graph_push_device(g, host);
        dg_graph_push_name_scope(g, "replica_mean");
        dg_output *col = calloc((size_t)n_rep, sizeof *col);
        if (!col) abort();
        for (int i = 1; i < n_out; i++) {
            for (int r = 0; r < n_rep; r++) col[r] = t.per_replica[(size_t)r * (size_t)n_out + (size_t)i];
            dg_output sum = n_rep == 1 ? col[0] : dg_add_n(g, NULL, col, n_rep);
            out->outputs[i] = n_rep == 1 ? sum
                                         : dg_div(g, NULL, sum, dg_scalar(g, NULL, dg_output_dtype(sum), (double)n_rep));
        }
        free(col);
        dg_graph_pop_name_scope(g);
        dg_graph_pop_device(g);
        ok = dg_graph_check(g, st);
    }
    free(t.per_replica);
    return ok;
}

// The cluster kinds: one replica in this process, built once.
static bool minimize_cluster(dg_distribution *d, dg_graph *g, const dg_optimizer *opt, dg_model_fn fn, void *ctx,
                             const dg_output *inputs, int n_out, dg_distributed_step *out, dg_status *st) {
    char worker[96];
    // ps_coordinator: one graph for every worker; the master of the worker that runs a step
    // puts what asks for "/job:worker" on its own task.
    if (d->coordinator) snprintf(worker, sizeof worker, "/job:worker");
    else snprintf(worker, sizeof worker, "/job:worker/task:%d", d->task);
    bool mwm = d->kind == DG_DISTRIBUTE_MULTI_WORKER_MIRRORED;
    if (mwm) {
        dg_graph_push_device(g, worker);
    } else {
        dg_replica_device_setter_options ro = dg_replica_device_setter_options_default();
        ro.cluster = d->cluster;
        ro.worker_device = worker;
        if (!(d->setter = dg_replica_device_setter_new(&ro, st))) return false;
        dg_graph_push_device_fn(g, d->setter);
    }
    out->global_step = dg_global_step(g);
    dg_replica only = {d, g, 0, true, 0};
    bool ok = build_replica(&only, fn, ctx, inputs, out->outputs, n_out, st);
    if (ok && mwm) {
        dg_collective_group grp = dg_collective_group_make("worker", d->n_workers);
        grp.timeout_ms = d->peer_timeout_ms;
        out->train = dg_all_reduce_minimize(opt, out->outputs[0], NULL, 0, out->global_step, &grp,
                                            DG_COLLECTIVE_KEY_AUTO);
        // After the optimizer: its slots and the global step are broadcast too.
        d->bcast = out->train ? dg_collective_broadcast_variables(g, NULL, 0, &grp, DG_COLLECTIVE_KEY_AUTO) : NULL;
        ok = out->train && d->bcast;
    } else if (ok && d->kind == DG_DISTRIBUTE_SYNC_REPLICAS) {
        dg_sync_replicas_options so = dg_sync_replicas_options_default();
        so.replicas_to_aggregate = d->replicas_to_aggregate;
        so.total_num_replicas = d->n_workers;
        so.task_index = d->task;
        so.timeout_ms = d->peer_timeout_ms;
        ok = (d->sr = dg_sync_replicas_new(opt, &so, st)) &&
             (out->train = dg_sync_replicas_minimize(d->sr, out->outputs[0], out->global_step, st));
    } else if (ok) {
        ok = (out->train = dg_optimizer_minimize(opt, out->outputs[0], out->global_step)) != NULL;
    }
    if (mwm) dg_graph_pop_device(g);
    else dg_graph_pop_device_fn(g);
    if (ok) ok = dg_graph_check(g, st);
    else if (dg_status_ok(st)) dg_status_copy(st, dg_graph_status(g));
    for (int i = 0; i < n_out; i++) out->eval_outputs[i] = out->outputs[i];
    return ok;
}

bool dg_distribution_minimize(dg_distribution *d, dg_graph *g, const dg_optimizer *opt, dg_model_fn model_fn,
                              void *ctx, const dg_output *batch_inputs, int n_inputs, int n_outputs,
                              dg_distributed_step *out, dg_status *st) {
    dg_status_reset(st);
    const char *kind = dg_distribution_kind_name(d->kind);
    if (!g || !opt || opt->graph != g || !model_fn || !out || n_inputs < 0 || (n_inputs > 0 && !batch_inputs) ||
        n_outputs < 1 || n_outputs > DG_DISTRIBUTE_MAX_OUTPUTS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: minimize needs a graph, an optimizer of that graph, "
                       "a model function and 1..%d outputs (got %d)", kind, DG_DISTRIBUTE_MAX_OUTPUTS, n_outputs);
        return false;
    }
    if (dg_distribution_only_serves(d)) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "distribution %s: this is %s task %d, which builds no model (it "
                       "serves: dg_distribution_join)", kind, d->job, d->task);
        return false;
    }
    if (d->g) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "distribution %s: minimize was already called (once per "
                       "distribution)", kind);
        return false;
    }
    if (!dg_graph_check(g, st)) return false;
    d->g = g;
    memset(out, 0, sizeof *out);
    out->n_outputs = n_outputs;
    bool ok = d->one_process ? minimize_local(d, g, opt, model_fn, ctx, batch_inputs, n_inputs, n_outputs, out, st)
                             : minimize_cluster(d, g, opt, model_fn, ctx, batch_inputs, n_outputs, out, st);
    if (!ok) dg_status_prepend(st, "distribution %s", kind);
    else {
        d->train = out->train;
        d->global_step = out->global_step;
    }
    return ok;
}

// ---- training ----
static bool keep_hook(dg_distribution *d, dg_session_hook *h) {
    if (!h) return false;
    BASE_PUSH(d->hooks, d->n_hooks, d->cap_hooks, h);
    return true;
}

// ps_coordinator: a session on every worker's master, and the threads that run the steps there.
static bool start_coordinator(dg_distribution *d, dg_graph *g, const dg_session_options *so, int64_t last_step,
                              dg_status *st) {
    char **targets = calloc((size_t)d->n_workers, sizeof *targets);
    if (!targets) abort();
    bool ok = true;
    for (int i = 0; i < d->n_workers && ok; i++) {
        const char *a = dg_cluster_task_address(d->cluster, "worker", i, st);
        ok = a && asprintf(&targets[i], "dg://%s", a) >= 0;
        if (a && !ok) abort();
    }
    if (ok)
        ok = (d->coord = training_coordinator_new(g, d->train, d->global_step, (const char *const *)targets, d->n_workers, so,
                                                  d->peer_timeout_ms, d->log, st)) != NULL;
    for (int i = 0; i < d->n_workers; i++) free(targets[i]);
    free(targets);
    if (!ok) dg_status_prepend(st, "distribution %s", dg_distribution_kind_name(d->kind));
    d->last_step = last_step;
    d->started = false;
    d->n_scheduled = 0;
    return ok;
}

dg_monitored_session *dg_distribution_session_new(dg_distribution *d, dg_graph *g, int64_t last_step,
                                                  const dg_mts_options *o, dg_status *st) {
    dg_status_reset(st);
    const char *kind = dg_distribution_kind_name(d->kind);
    if (!g || g != d->g) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "distribution %s: the session's graph is not the one "
                       "dg_distribution_minimize built", kind);
        return NULL;
    }
    dg_mts_options mo = o ? *o : dg_mts_options_default();
    dg_session_options so = mo.session_options ? *mo.session_options : dg_session_options_default();
    bool chief = dg_distribution_is_chief(d);
    mo.session_options = &so;
    mo.is_chief = chief;
    mo.init_variables = mo.restore = mo.save_checkpoints = mo.write_summaries = DG_ROLE_DEFAULT;
    char ps0[300];
    if (d->one_process) {
        mo.master = NULL;
        if (strcmp(d->device_type, "CPU") == 0 && so.n_virtual_cpus < d->num_devices - 1)
            so.n_virtual_cpus = d->num_devices - 1;
    } else if (d->coordinator) {
        // The coordinator's own session (initialize, restore, save, hooks) on ps task 0's master:
        // the variables live on the ps tasks, and losing a ps ends the job anyway.
        const char *a = dg_cluster_task_address(d->cluster, "ps", 0, st);
        if (!a) return NULL;
        snprintf(ps0, sizeof ps0, "dg://%s", a);
        mo.master = ps0;
        // Every wait has a deadline: a ps that never answers fails the session, naming it.
        if (so.wait_for_tasks_ms == 0) so.wait_for_tasks_ms = d->peer_timeout_ms;
    } else {
        mo.master = dg_server_target(d->server);
    }
    if (d->coordinator && d->coord) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "distribution %s: the coordinator has a session already (one per "
                       "distribution)", kind);
        return NULL;
    }
    // The distribution's hooks first: the stop step, then what the kind needs.
    dg_session_hook *mine[2];
    int n_mine = 0;
    if (last_step >= 0 && !d->coordinator) {   // the coordinator stops by the steps it scheduled
        if (!keep_hook(d, dg_stop_at_last_step_hook_new(last_step, st))) return NULL;
        mine[n_mine++] = d->hooks[d->n_hooks - 1];
    }
    if (d->kind == DG_DISTRIBUTE_MULTI_WORKER_MIRRORED) {
        mo.init_variables = DG_ROLE_YES;   // every worker holds its own copy; the chief's is broadcast
        if (!keep_hook(d, dg_broadcast_variables_hook_new(d->bcast, st))) return NULL;
        mine[n_mine++] = d->hooks[d->n_hooks - 1];
    } else if (d->kind == DG_DISTRIBUTE_SYNC_REPLICAS) {
        if (!keep_hook(d, dg_sync_replicas_hook_new(d->sr, chief, mo.master, last_step, st))) return NULL;
        mine[n_mine++] = d->hooks[d->n_hooks - 1];
    }
    int n_user = o && o->n_hooks > 0 ? o->n_hooks : 0;
    dg_session_hook **list = calloc((size_t)(n_mine + n_user) + 1, sizeof *list);
    if (!list) abort();
    for (int i = 0; i < n_mine; i++) list[i] = mine[i];
    for (int i = 0; i < n_user; i++) list[n_mine + i] = o->hooks[i];
    BASE_PUSH(d->lists, d->n_lists, d->cap_lists, list);
    mo.hooks = list;
    mo.n_hooks = n_mine + n_user;
    dg_monitored_session *ms = dg_monitored_session_new(g, &mo, st);
    if (!ms) {
        dg_status_prepend(st, "distribution %s: %s %d's session", kind, d->one_process ? "process" : d->job, d->task);
        return NULL;
    }
    if (d->coordinator && !start_coordinator(d, g, &so, last_step, st)) {
        dg_monitored_session_free(&ms);
        return NULL;
    }
    return ms;
}

// ps_coordinator: the step queued for a free worker; the session's hooks run once with no feeds.
static bool run_coordinated(dg_distribution *d, dg_monitored_session *ms, const dg_distributed_step *step,
                            const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                            const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_status *st) {
    const char *kind = dg_distribution_kind_name(d->kind);
    if (!d->coord) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "distribution %s: no session: dg_distribution_session_new first",
                       kind);
        return false;
    }
    if (!d->started) {   // where this session starts: 0, or the step a checkpoint restored
        dg_tensor *gs = NULL;
        if (!dg_session_run(dg_monitored_session_session(ms), NULL, NULL, 0, &step->global_step, &gs, 1, NULL, 0, st)) {
            dg_status_prepend(st, "distribution %s: reading the global step", kind);
            return false;
        }
        d->start_step = dg_tensor_i64(gs)[0];
        dg_tensor_unref(gs);
        d->started = true;
    }
    // The stop comes from the steps scheduled, not from the global step: a step given back after
    // its worker failed may have counted twice there.
    bool bounded = d->last_step >= 0;
    if (!(bounded && d->start_step + d->n_scheduled >= d->last_step)) {
        if (!training_coordinator_schedule(d->coord, feeds, feed_values, n_feeds, fetches, n_fetches, st)) return false;
        d->n_scheduled++;
    }
    // The last step waits for every step queued, so that the loop ends with all of them run.
    bool last = bounded && d->start_step + d->n_scheduled >= d->last_step;
    if (last && !training_coordinator_wait(d->coord, st)) return false;
    dg_tensor *gs = NULL;
    if (!dg_monitored_session_run(ms, NULL, NULL, 0, &step->global_step, &gs, 1, NULL, 0, st)) return false;
    dg_tensor_unref(gs);
    training_coordinator_take_latest(d->coord, fetches, fetched, n_fetches);
    if (last) dg_monitored_session_request_stop(ms);
    return true;
}

bool dg_distribution_wait(dg_distribution *d, dg_status *st) {
    dg_status_reset(st);
    return !d->coord || training_coordinator_wait(d->coord, st);
}

bool dg_distribution_run(dg_distribution *d, dg_monitored_session *ms, const dg_distributed_step *step,
                         const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                         const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_status *st) {
    for (int i = 0; i < n_fetches; i++) fetched[i] = NULL;
    if (d->coordinator)
        return run_coordinated(d, ms, step, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, st);
    if (dg_monitored_session_run(ms, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, &step->train, 1, st))
        return true;
    // Sync replicas: the chief closed the token queue at the last step; a worker's next take
    // ends as OUT_OF_RANGE, the normal end of training.
    if (d->kind == DG_DISTRIBUTE_SYNC_REPLICAS && dg_status_code(st) == DG_OUT_OF_RANGE) {
        dg_monitored_session_request_stop(ms);
        dg_status_reset(st);
        return true;
    }
    return false;
}
