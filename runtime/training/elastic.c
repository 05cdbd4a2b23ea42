/* The elastic hook (distgraph/elastic.h, docs/ELASTIC.md): commits in memory, rollback,
 * and the coordinator's epochs, around a monitored session whose workers all-reduce over an
 * elastic group.
 *
 * After every creation of the session (the first, and each recovery from a failed step) the
 * hook waits at the coordinator (ElasticRendezvous, executor/cpu/kernels_sync.c) for an epoch:
 * the first time as a joiner, later as a member that failed (naming the tasks its server saw go).
 * It gives the members to its server's collective groups, goes back to its last commit, and runs
 * the broadcast of the variables over the elastic group, so every member starts the epoch with
 * rank 0's values (rank 0 is a member that was in the last epoch, when there is one). Every
 * commit_steps steps it copies the variables (the commit) and meets the others at the
 * coordinator: when someone joined, or someone did not come, a new epoch begins there and the
 * broadcast runs again. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/collective.h"
#include "distgraph/device_name.h"
#include "distgraph/elastic.h"
#include "distgraph/ops.h"
#include "distgraph/train.h"
#include "base_impl.h"
#include "exec_collective_group_impl.h"
#include "graph_impl.h"
#include "server_impl.h"
#include "status_impl.h"
#include "training_impl.h"

#define MEMBERS_COLLECTION "elastic_members"   // dg_elastic_members' variable

// Why a worker comes to the coordinator (the op's "kind"; kernels_sync.c has the same numbers).
enum { KIND_COMMIT = 0, KIND_JOIN = 1, KIND_REFORM = 2, KIND_DONE = 3 };
// The longest one wait at the coordinator lasts before the task comes again (rendezvous).
#define POLL_MS 500

typedef struct elastic_hook {
    dg_elastic_options o;
    char job[DG_DEVICE_JOB_MAX];
    char coordinator[DG_DEVICE_NAME_MAX];
    int task;
    FILE *log;
    // Graph pieces (begin).
    dg_output ph_task, ph_kind, ph_epoch, ph_lost, ph_fingerprint, answer;
    int64_t fingerprint;          // of the variables' names, types and shapes
    dg_output gs;                 // the global step, {NULL, 0} when the graph has none
    dg_output *vars;              // the state: the global variables the broadcast moves
    dg_output *values;            // a placeholder per variable, for the rollback
    int n_vars;
    dg_node *rollback, *broadcast;
    dg_output members_value;      // dg_elastic_members: its value fed to set_members
    dg_node *set_members;         // NULL: the graph has no dg_elastic_members
    // State.
    bool joined;                  // came to the coordinator once in this process
    dg_tensor **commit;           // the last commit, one copy per variable (NULL: none yet)
    int64_t commit_step;          // the global step of the last commit (-1: none)
    int64_t steps_since_commit;
    dg_elastic_stats stats;
} elastic_hook;

dg_elastic_options dg_elastic_options_default(void) {
    dg_elastic_options o;
    memset(&o, 0, sizeof o);
    o.min_workers = 1;
    o.commit_steps = 10;
    o.barrier_timeout_ms = 10000;
    o.coordinator_log = true;
    return o;
}

static void drop_commit(elastic_hook *h) {
    if (h->commit)
        for (int i = 0; i < h->n_vars; i++) dg_tensor_unref(h->commit[i]);
    free(h->commit);
    h->commit = NULL;
}

static void hook_free(void *ctx) {
    elastic_hook *h = ctx;
    drop_commit(h);
    free(h->vars);
    free(h->values);
    free(h);
}

// ---- the graph ----
static bool hook_begin(void *ctx, dg_graph *g, dg_status *st) {
    elastic_hook *h = ctx;
    // The state: what dg_collective_broadcast_variables moves (float and integer variables,
    // the global step and the optimizer's slots included), in the graph's order.
    int n_global = dg_graph_collection_size(g, DG_GLOBAL_VARIABLES);
    h->vars = calloc((size_t)(n_global > 0 ? n_global : 1), sizeof *h->vars);
    h->values = calloc((size_t)(n_global > 0 ? n_global : 1), sizeof *h->values);
    if (!h->vars || !h->values) return base_oom(st, "elastic hook", (size_t)n_global * sizeof *h->vars);
    for (int i = 0; i < n_global; i++) {
        dg_output v = {dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, i), 0};
        dg_dtype t = dg_output_dtype(v);
        if (strcmp(dg_node_op_type(v.node), "VariableV2") == 0 && (dg_dtype_is_float(t) || t == DG_INT32 || t == DG_INT64))
            h->vars[h->n_vars++] = v;
    }
    if (h->n_vars == 0) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "the elastic hook needs the graph's variables (none of float or "
                      "integer type when it began)");
        return false;
    }
    if (dg_graph_collection_size(g, DG_GLOBAL_STEP) > 0) h->gs = (dg_output){dg_graph_collection_get(g, DG_GLOBAL_STEP, 0), 0};
    char own[DG_DEVICE_NAME_MAX];
    snprintf(own, sizeof own, "/job:%s/task:%d", h->job, h->task);
    dg_graph_push_name_scope(g, "elastic");
    dg_graph_push_device(g, own);
    h->ph_task = dg_placeholder(g, "task", DG_INT64, dg_shape_scalar());
    h->ph_kind = dg_placeholder(g, "kind", DG_INT64, dg_shape_scalar());
    h->ph_epoch = dg_placeholder(g, "epoch", DG_INT64, dg_shape_scalar());
    h->ph_lost = dg_placeholder(g, "lost", DG_INT64, dg_shape1(-1));
    h->ph_fingerprint = dg_placeholder(g, "fingerprint", DG_INT64, dg_shape_scalar());
    // FNV-1a over "name dtype dims;" of every variable of the state.
    uint64_t fp = 14695981039346656037ull;
    for (int i = 0; i < h->n_vars; i++) {
        char line[DG_DEVICE_NAME_MAX + 256];
        dg_shape sh = dg_output_shape(h->vars[i]);
        char dims[192];
        int len = snprintf(line, sizeof line, "%s %s %s;", dg_node_name(h->vars[i].node),
                           dg_dtype_name(dg_output_dtype(h->vars[i])), dg_shape_str(&sh, dims, sizeof dims));
        for (int k = 0; k < len && k < (int)sizeof line; k++) fp = (fp ^ (unsigned char)line[k]) * 1099511628211ull;
    }
    h->fingerprint = (int64_t)fp;
    dg_node **assigns = calloc((size_t)h->n_vars, sizeof *assigns);
    if (!assigns) abort();
    for (int i = 0; i < h->n_vars && dg_graph_ok(g); i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "commit_%d", i);
        h->values[i] = dg_placeholder(g, nm, dg_output_dtype(h->vars[i]), dg_output_shape(h->vars[i]));
        snprintf(nm, sizeof nm, "rollback_%d", i);
        assigns[i] = dg_assign(g, nm, h->vars[i], h->values[i]).node;
    }
    if (dg_graph_ok(g)) h->rollback = dg_group(g, "rollback", assigns, h->n_vars);
    free(assigns);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, h->coordinator);
    dg_node *nd = dg_graph_ok(g) ? graph_begin(g, "ElasticRendezvous", "coordinator") : NULL;
    if (nd) {
        dg_output ins[5] = {h->ph_task, h->ph_kind, h->ph_epoch, h->ph_lost, h->ph_fingerprint};
        for (int i = 0; i < 5; i++) graph_add_input(nd, ins[i]);
        char shared[DG_DEVICE_JOB_MAX + 16];
        snprintf(shared, sizeof shared, "elastic/%s", h->job);
        graph_set_attr_string(nd, "shared_name", shared);
        graph_set_attr_string(nd, "group_job", h->job);
        graph_set_attr_int(nd, "min_members", h->o.min_workers);
        graph_set_attr_int(nd, "barrier_timeout_ms", h->o.barrier_timeout_ms);
        graph_set_attr_int(nd, "timeout_ms", POLL_MS);
        graph_set_attr_int(nd, "log", h->o.coordinator_log);
        nd = graph_finish(nd);
        h->answer = (dg_output){nd, 0};
    }
    dg_graph_pop_device(g);
    dg_graph_push_device(g, own);
    if (dg_graph_collection_size(g, MEMBERS_COLLECTION) > 0 && dg_graph_ok(g)) {
        dg_output members = {dg_graph_collection_get(g, MEMBERS_COLLECTION, 0), 0};
        h->members_value = dg_placeholder(g, "members_value", DG_FLOAT32, dg_shape_scalar());
        dg_graph_push_colocate_with(g, members.node);
        h->set_members = dg_assign(g, "set_members", members, h->members_value).node;
        dg_graph_pop_colocate_with(g);
    }
    dg_collective_group grp = dg_collective_group_make(h->job, DG_COLLECTIVE_ELASTIC);
    if (dg_graph_ok(g)) h->broadcast = dg_collective_broadcast_variables(g, h->vars, h->n_vars, &grp, DG_COLLECTIVE_KEY_AUTO);
    dg_graph_pop_device(g);
    dg_graph_pop_name_scope(g);
    if (!dg_graph_ok(g)) {
        dg_status_copy(st, dg_graph_status(g));
        dg_status_prepend(st, "building the elastic hook's ops");
        return false;
    }
    return true;
}

// ---- commits and epochs ----
static bool take_commit(elastic_hook *h, dg_session *sess, dg_status *st) {
    dg_tensor **got = calloc((size_t)h->n_vars, sizeof *got);
    if (!got) return base_oom(st, "elastic commit", (size_t)h->n_vars * sizeof *got);
    if (!dg_session_run(sess, NULL, NULL, 0, h->vars, got, h->n_vars, NULL, 0, st)) {
        free(got);
        dg_status_prepend(st, "elastic commit: reading the variables");
        return false;
    }
    // Copies: a fetched variable may share its buffer with the variable, which later steps update.
    bool ok = true;
    for (int i = 0; i < h->n_vars; i++) {
        dg_tensor *c = ok ? dg_tensor_copy(got[i], st) : NULL;
        ok = ok && c;
        dg_tensor_unref(got[i]);
        got[i] = c;
    }
    if (!ok) {
        for (int i = 0; i < h->n_vars; i++) dg_tensor_unref(got[i]);
        free(got);
        return false;
    }
    drop_commit(h);
    h->commit = got;
    h->commit_step = -1;
    if (h->gs.node)
        for (int i = 0; i < h->n_vars; i++)
            if (h->vars[i].node == h->gs.node) h->commit_step = dg_tensor_get_as_double(got[i], 0);
    h->steps_since_commit = 0;
    h->stats.commits++;
    return true;
}

// One wait at the coordinator, naming the tasks this task's server knows to be lost.
static bool rendezvous_once(elastic_hook *h, dg_session *sess, int kind, dg_tensor **answer, dg_status *st) {
    int lost[EXEC_COLL_MAX_MEMBERS];
    exec_coll_groups *grp = exec_coll_groups_of(rt_server_env(h->o.server)->resources, st);
    if (!grp) return false;
    int n_lost = exec_coll_lost_tasks(grp, h->job, lost, EXEC_COLL_MAX_MEMBERS);
    if (n_lost > EXEC_COLL_MAX_MEMBERS) n_lost = EXEC_COLL_MAX_MEMBERS;
    dg_tensor *vals[5] = {dg_tensor_scalar_i64(h->task), dg_tensor_scalar_i64(kind),
                          dg_tensor_scalar_i64(h->stats.epoch), dg_tensor_new(DG_INT64, dg_shape1(n_lost), st),
                          dg_tensor_scalar_i64(h->fingerprint)};
    bool ok = vals[0] && vals[1] && vals[2] && vals[3] && vals[4];
    if (ok) {
        for (int i = 0; i < n_lost; i++) dg_tensor_i64(vals[3])[i] = lost[i];
        dg_output feeds[5] = {h->ph_task, h->ph_kind, h->ph_epoch, h->ph_lost, h->ph_fingerprint};
        ok = dg_session_run(sess, feeds, vals, 5, &h->answer, answer, 1, NULL, 0, st);
        if (!ok) dg_status_prepend(st, "elastic: waiting at the coordinator %s", h->coordinator);
    } else if (dg_status_ok(st)) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "elastic: out of memory");
    }
    for (int i = 0; i < 5; i++) dg_tensor_unref(vals[i]);
    return ok;
}

// Waits at the coordinator; on success *answer is [epoch, members...] (new). A wait lasts at
// most POLL_MS there; then this task comes again with what its server has learnt meanwhile, so
// a member that died before reaching a commit is reported by the others (whose connections to
// it closed) instead of holding the round up until its deadline.
static bool rendezvous(elastic_hook *h, dg_session *sess, int kind, dg_tensor **answer, dg_status *st) {
    int64_t start = base_now_ms();
    for (;;) {
        if (rendezvous_once(h, sess, kind, answer, st)) return true;
        bool polled = dg_status_code(st) == DG_DEADLINE_EXCEEDED && strstr(dg_status_message(st), "elastic coordinator");
        if (!polled || (h->o.join_timeout_ms > 0 && base_now_ms() - start >= h->o.join_timeout_ms)) return false;
        dg_status_reset(st);
    }
}

// dg_elastic_members := the epoch's members.
static bool set_members(elastic_hook *h, dg_session *sess, dg_status *st) {
    if (!h->set_members) return true;
    float n = (float)h->stats.n_members;
    dg_tensor *v = dg_tensor_from_data(DG_FLOAT32, dg_shape_scalar(), &n, st);
    bool ok = v && dg_session_run(sess, &h->members_value, &v, 1, NULL, NULL, 0, &h->set_members, 1, st);
    dg_tensor_unref(v);
    if (!ok) dg_status_prepend(st, "elastic: setting the members count of epoch %lld", (long long)h->stats.epoch);
    return ok;
}

// Puts the epoch in answer in force on this task (its members count too) and says so.
static bool enter_epoch(elastic_hook *h, dg_session *sess, const dg_tensor *answer, const char *why, dg_status *st) {
    int64_t n = dg_tensor_num_elements(answer) - 1;
    if (n < 1 || n > EXEC_COLL_MAX_MEMBERS) {
        dg_status_setf(st, DG_INTERNAL, "elastic: the coordinator answered %lld members", (long long)n);
        return false;
    }
    const int64_t *a = dg_tensor_i64(answer);
    int members[EXEC_COLL_MAX_MEMBERS], rank = -1;
    for (int64_t i = 0; i < n; i++) {
        members[i] = (int)a[1 + i];
        if (members[i] == h->task) rank = (int)i;
    }
    if (rank < 0) {
        dg_status_setf(st, DG_UNAVAILABLE, "elastic: /job:%s/task:%d was left out of epoch %lld (it came late)",
                       h->job, h->task, (long long)a[0]);
        return false;
    }
    if (!dg_server_set_collective_members(h->o.server, h->job, a[0], members, (int)n, st)) return false;
    bool changed = a[0] != h->stats.epoch;
    h->stats.epoch = a[0];
    h->stats.n_members = (int)n;
    h->stats.rank = rank;
    if (changed) {
        h->stats.epochs_joined++;
        char list[256];
        size_t len = 0;
        list[0] = 0;
        for (int64_t i = 0; i < n && len + 16 < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", members[i]);
        fprintf(h->log, "%f: elastic: /job:%s/task:%d: epoch %lld (%s): %lld members [%s], rank %d\n", training_wall_s(),
                h->job, h->task, (long long)a[0], why, (long long)n, list, rank);
        fflush(h->log);
    }
    // Every creation too: a session made for a recovery reads a fresh variable.
    return set_members(h, sess, st);
}

static bool run_broadcast(elastic_hook *h, dg_session *sess, dg_status *st) {
    if (dg_session_run_target(sess, h->broadcast, st)) return true;
    dg_status_prepend(st, "elastic: taking rank 0's variables in epoch %lld", (long long)h->stats.epoch);
    return false;
}

static bool hook_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    (void)ms;
    elastic_hook *h = ctx;
    int kind = h->joined ? KIND_REFORM : KIND_JOIN;
    dg_tensor *answer = NULL;
    if (!rendezvous(h, sess, kind, &answer, st)) return false;
    if (dg_tensor_num_elements(answer) == 1 && dg_tensor_i64(answer)[0] == -2) {
        dg_tensor_unref(answer);
        dg_status_setf(st, DG_OUT_OF_RANGE, "elastic: the job had ended (its members finished) before /job:%s/task:%d "
                       "could join", h->job, h->task);
        return false;
    }
    h->joined = true;
    bool ok = enter_epoch(h, sess, answer, kind == KIND_JOIN ? "joined" : "after a failure", st);
    dg_tensor_unref(answer);
    if (ok && h->commit) {
        // Back to the last commit: the failed step may have updated some members and not others.
        // The steps run since the commit are undone (the session made for the recovery has
        // fresh variables, so they are counted, not read).
        int64_t undone = h->steps_since_commit;
        dg_output *feeds = h->values;
        ok = dg_session_run(sess, feeds, h->commit, h->n_vars, NULL, NULL, 0, &h->rollback, 1, st);
        if (!ok) dg_status_prepend(st, "elastic: rolling back to the commit of global step %lld", (long long)h->commit_step);
        if (ok) {
            h->stats.rollbacks++;
            h->stats.steps_rolled_back += undone;
            fprintf(h->log, "%f: elastic: /job:%s/task:%d: rolled back to the commit of global step %lld (%lld steps "
                    "undone)\n", training_wall_s(), h->job, h->task, (long long)h->commit_step, (long long)undone);
            fflush(h->log);
        }
    }
    ok = ok && run_broadcast(h, sess, st);
    ok = ok && take_commit(h, sess, st);
    return ok;
}

static bool hook_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n_values,
                           dg_status *st) {
    (void)values;
    (void)n_values;
    elastic_hook *h = ctx;
    if (++h->steps_since_commit < h->o.commit_steps) return true;
    dg_session *sess = rc->raw_session;
    if (!take_commit(h, sess, st)) return false;
    dg_tensor *answer = NULL;
    if (!rendezvous(h, sess, KIND_COMMIT, &answer, st)) return false;
    int64_t before = h->stats.epoch;
    bool ok = enter_epoch(h, sess, answer, "at a commit", st);
    dg_tensor_unref(answer);
    // A new epoch (someone joined, or did not come): everyone takes rank 0's values, and commits
    // them (they are not this member's commit when rank 0 had gone back to an older one).
    if (ok && h->stats.epoch != before) ok = run_broadcast(h, sess, st) && take_commit(h, sess, st);
    return ok;
}

// At the end: tell the coordinator this member is done, so that the others' commits do not wait
// for it and workers that come later are told the job has ended. A coordinator already gone
// changes nothing.
static bool hook_end(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    (void)ms;
    (void)st;
    elastic_hook *h = ctx;
    if (!h->joined) return true;
    dg_status *ignored = dg_status_new();
    dg_tensor *answer = NULL;
    if (rendezvous(h, sess, KIND_DONE, &answer, ignored)) dg_tensor_unref(answer);
    dg_status_free(&ignored);
    return true;
}

dg_session_hook *dg_elastic_hook_new(const dg_elastic_options *o, dg_status *st) {
    const char *bad = !o                            ? "options"
                      : !o->server                  ? "server"
                      : o->min_workers < 1 || o->min_workers > EXEC_COLL_MAX_MEMBERS ? "min_workers"
                      : o->commit_steps < 1         ? "commit_steps"
                      : o->barrier_timeout_ms < 1   ? "barrier_timeout_ms"
                      : o->join_timeout_ms < 0      ? "join_timeout_ms"
                                                    : NULL;
    if (bad) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "elastic hook: option %s is missing or out of range", bad);
        return NULL;
    }
    elastic_hook *h = calloc(1, sizeof *h);
    if (!h) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "elastic hook: out of memory");
        return NULL;
    }
    h->o = *o;
    h->log = o->log ? o->log : stdout;
    h->stats.epoch = -1;
    h->commit_step = -1;
    dg_device_name dn;
    const char *own = dg_server_task_name(o->server);
    const char *job = o->job ? o->job : "worker";
    if (!dg_device_name_parse(own, &dn, st) || !dn.has_job || !dn.has_task || strcmp(dn.job, job) != 0) {
        if (dg_status_ok(st))
            dg_status_setf(st, DG_INVALID_ARGUMENT, "elastic hook: the server is %s, not a task of job \"%s\"", own, job);
        free(h);
        return NULL;
    }
    snprintf(h->job, sizeof h->job, "%s", job);
    h->task = dn.task;
    h->o.job = h->job;
    const char *coord = o->coordinator;
    char dflt[DG_DEVICE_NAME_MAX];
    if (!coord) {
        snprintf(dflt, sizeof dflt, "/job:%s/task:0", h->job);
        coord = dflt;
    }
    if (!dg_device_name_parse(coord, &dn, st) || !dn.has_job || !dn.has_task) {
        if (dg_status_ok(st))
            dg_status_setf(st, DG_INVALID_ARGUMENT, "elastic hook: coordinator \"%s\" names no task", coord);
        dg_status_prepend(st, "elastic hook: coordinator");
        free(h);
        return NULL;
    }
    snprintf(h->coordinator, sizeof h->coordinator, "/job:%s/task:%d", dn.job, dn.task);
    h->o.coordinator = h->coordinator;
    dg_session_hook *hk = training_new_hook("elastic", h, hook_free, st);
    if (!hk) return NULL;
    hk->begin = hook_begin;
    hk->after_create_session = hook_after_create;
    hk->after_run = hook_after_run;
    hk->end = hook_end;
    hk->order = DG_HOOK_ORDER_SETUP;
    return hk;
}

bool dg_elastic_hook_stats(const dg_session_hook *h, dg_elastic_stats *out) {
    if (!h || h->free_ctx != hook_free || !out) return false;
    *out = ((const elastic_hook *)h->ctx)->stats;
    return true;
}

dg_output dg_elastic_members(dg_graph *g, dg_status *st) {
    dg_status_reset(st);
    dg_output none = {NULL, 0};
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "elastic members: the graph is NULL");
        return none;
    }
    if (dg_graph_collection_size(g, MEMBERS_COLLECTION) > 0)
        return (dg_output){dg_graph_collection_get(g, MEMBERS_COLLECTION, 0), 0};
    // A local variable of this worker: colocated with an op the device scopes put here (a
    // device setter would send a variable to a ps). It is in no variable collection, so
    // checkpoints, initializers and the broadcast leave it alone: the hook sets it.
    dg_node *anchor = dg_no_op(g, "elastic_members_anchor");
    if (anchor) dg_graph_push_colocate_with(g, anchor);
    dg_node *v = graph_begin(g, "VariableV2", "elastic_members");
    if (v) {
        graph_set_attr_type(v, "dtype", DG_FLOAT32);
        graph_set_attr_shape(v, "shape", dg_shape_scalar());
        v = graph_finish(v);
    }
    if (anchor) dg_graph_pop_colocate_with(g);
    if (!v || !dg_graph_ok(g)) {
        dg_status_copy(st, dg_graph_status(g));
        if (dg_status_ok(st)) dg_status_set(st, DG_INTERNAL, "elastic members: the variable was not made");
        return none;
    }
    dg_graph_add_to_collection(g, MEMBERS_COLLECTION, v);
    return (dg_output){v, 0};
}
