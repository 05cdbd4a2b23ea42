/* The monitored training session (TensorFlow's MonitoredTrainingSession and SessionManager,
 * rewritten for distgraph; the saver is saver.c).
 *
 * Layers of one run, outermost first: recovery (a run that fails with UNAVAILABLE or ABORTED
 * recreates the underlying session and runs again), hooks (before_run, one merged
 * dg_session_run, after_run), the dg_session. Creation is "make a session, then make its
 * variables ready": the chief restores the newest checkpoint or runs the initializers, a
 * non-chief polls IsVariableInitialized ops until the chief has done so.
 *
 * Concurrency: runs of several threads share the underlying session. `in_flight` counts the
 * runs (and accessor reads) using it; a recovery marks `recovering` (new runs wait), waits for
 * in_flight to reach 0, then replaces the session and bumps `generation`. A run that fails on
 * an old generation just runs again on the new session. Hook callbacks are serialized by
 * hook_mu, which is never held while waiting for mu's condition. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base_impl.h"
#include "distgraph/monitored_session.h"
#include "distgraph/ops.h"
#include "distgraph/partitioned.h"
#include "status_impl.h"
#include "training_impl.h"

// ---- small helpers ----

static bool is_recoverable(dg_code c) { return c == DG_UNAVAILABLE || c == DG_ABORTED; }

// ---- the monitored session ----
struct dg_monitored_session {
    training_run_state rs;          // first: what hooks see (run_context.c)
    dg_graph *g;                    // borrowed
    char *master;                   // owned copy; NULL: local
    dg_session_options sopts;
    bool is_chief;
    bool init_variables, restore;   // the roles (dg_mts_options), resolved against is_chief
    char *checkpoint_path;          // owned copy; NULL: no checkpoints
    int64_t stop_grace_ms, wait_for_chief_ms, backoff_ms;
    FILE *log;                      // where a waiting non-chief says what it waits for
    int max_attempts;
    dg_session_hook **hooks;        // in call order; the user's are borrowed
    int n_hooks, cap_hooks;
    dg_session_hook **owned;        // built-in hooks this session made and frees
    int n_owned, cap_owned;
    dg_output *ready;               // IsVariableInitialized, one per saver variable
    dg_node *init_op;
    dg_output global_step;          // {NULL, 0} when the graph has none
    dg_checkpoint_store *store;     // chief with a checkpoint path; used under mu's protocol
                                    // (only by the creating/recovering thread)

    pthread_mutex_t mu;             // guards the fields below
    pthread_cond_t cv;
    pthread_mutex_t hook_mu;        // serializes hook callbacks
    dg_session *sess;               // NULL while recovering, after a failed recovery, after close
    uint64_t generation;            // bumped by every successful recovery
    int in_flight;                  // runs and reads using sess
    bool recovering, closing;
    atomic_int n_recoveries;
    atomic_bool in_recovery;        // sessions are being made after a failure
};

dg_mts_options dg_mts_options_default(void) {
    dg_mts_options o;
    memset(&o, 0, sizeof o);
    o.is_chief = true;
    o.max_to_keep = 5;
    o.save_summaries_steps = 100;
    o.stop_grace_ms = 120000;
    o.wait_for_chief_ms = 7200000;
    o.max_recovery_attempts = 5;
    o.recovery_backoff_ms = 100;
    return o;
}

static const char *hook_name(const dg_session_hook *h) { return h->name ? h->name : "(unnamed)"; }

// Calls after_create_session of every hook, in order.
static bool hooks_after_create(dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    bool ok = true;
    pthread_mutex_lock(&ms->hook_mu);
    for (int i = 0; i < ms->n_hooks && ok; i++) {
        dg_session_hook *h = ms->hooks[i];
        if (h->after_create_session && !(ok = h->after_create_session(h->ctx, ms, sess, st)))
            dg_status_prepend(st, "hook \"%s\" after_create_session", hook_name(h));
    }
    pthread_mutex_unlock(&ms->hook_mu);
    return ok;
}

// Lists up to 20 names of vars whose flag is false (all when flags is NULL).
static void list_names(strbuf *b, const dg_saver *sv, dg_tensor *const *flags) {
    int n = 0;
    for (int i = 0; i < dg_saver_num_variables(sv); i++) {
        if (flags && *(const uint8_t *)dg_tensor_data(flags[i])) continue;
        if (n < 20) sb_addf(b, "%s%s", n ? ", " : "", dg_saver_variable_name(sv, i));
        n++;
    }
    if (n > 20) sb_addf(b, " and %d more", n - 20);
}

// A fresh underlying session. The first one waits for tasks not up yet as the session options
// say (by default without limit); one made to recover from a failure waits at most
// RECOVERY_WAIT_MS per attempt, so a task gone for good ends training after the attempts.
#define RECOVERY_WAIT_MS 5000
// max_wait_ms > 0 bounds the wait further (a non-chief's time left to wait for its chief).
static dg_session *new_session(dg_monitored_session *ms, int64_t max_wait_ms, dg_status *st) {
    dg_session_options o = ms->sopts;
    if (atomic_load(&ms->in_recovery) && (o.wait_for_tasks_ms == 0 || o.wait_for_tasks_ms > RECOVERY_WAIT_MS))
        o.wait_for_tasks_ms = RECOVERY_WAIT_MS;
    if (max_wait_ms > 0 && o.wait_for_tasks_ms >= 0 && (o.wait_for_tasks_ms == 0 || o.wait_for_tasks_ms > max_wait_ms))
        o.wait_for_tasks_ms = max_wait_ms;
    return dg_session_new(ms->g, ms->master, &o, st);
}

// A task that makes its variables ready (the chief, by default): a new session whose variables
// are restored from the newest checkpoint, or initialized when there is none (or the task does
// not restore: ms->store is NULL).
static dg_session *create_chief(dg_monitored_session *ms, dg_status *st) {
    dg_session *sess = new_session(ms, 0, st);
    if (!sess) return NULL;
    int64_t latest = -1;
    if (ms->store) {
        latest = dg_checkpoint_latest_step(ms->store, st);
        if (latest < 0 && !dg_status_ok(st)) {
            dg_status_prepend(st, "reading the checkpoints of \"%s\"", ms->checkpoint_path);
            dg_session_free(&sess);
            return NULL;
        }
    }
    bool ok;
    if (latest >= 0) {
        int64_t got = -1;
        ok = dg_saver_restore(ms->rs.saver, sess, ms->store, latest, &got, st);
        if (ok) ms->rs.restored_step = got;
        else dg_status_prepend(st, "restoring the checkpoint of step %lld from \"%s\"", (long long)latest,
                               ms->checkpoint_path);
    } else {
        ms->rs.restored_step = -1;
        ok = dg_session_run_target(sess, ms->init_op, st);
        if (!ok) dg_status_prepend(st, "initializing the variables");
    }
    if (!ok) dg_session_free(&sess);
    return sess;
}

// A non-chief: polls the IsVariableInitialized ops (50 ms backoff doubling to 1 s) until every
// variable is initialized, saying every WAIT_REPORT_MS which ones it still waits for. A check that fails with UNAVAILABLE or ABORTED (a task not up yet,
// or restarted) counts as "not yet" and the next check uses a fresh session, since the old
// one's registered partitions may be gone.
#define WAIT_REPORT_MS 5000
static dg_session *create_worker(dg_monitored_session *ms, dg_status *st) {
    ms->rs.restored_step = -1;
    int64_t start = base_now_ms(), deadline = start + ms->wait_for_chief_ms, backoff = 50;
    int64_t next_report = start + WAIT_REPORT_MS;
    dg_session *sess = NULL;
    int n_vars = dg_saver_num_variables(ms->rs.saver);
    dg_tensor **flags = calloc((size_t)n_vars, sizeof *flags);
    if (!flags) abort();
    dg_status check = DG_STATUS_INIT;
    strbuf pending = {0};
    bool have_flags = false;
    for (;;) {
        int64_t left = deadline - base_now_ms();
        if (!sess && !(sess = new_session(ms, left > 1 ? left : 1, st))) break;
        status_impl_clear(&check);
        if (dg_session_run(sess, NULL, NULL, 0, ms->ready, flags, n_vars, NULL, 0, &check)) {
            bool all = true;
            for (int i = 0; i < n_vars; i++) all = all && *(const uint8_t *)dg_tensor_data(flags[i]);
            pending.len = 0;
            if (pending.p) pending.p[0] = 0;
            list_names(&pending, ms->rs.saver, flags);
            have_flags = true;
            for (int i = 0; i < n_vars; i++) dg_tensor_free(&flags[i]);
            if (all) break;
        } else if (is_recoverable(dg_status_code(&check))) {
            dg_session_free(&sess);
        } else {
            dg_status_copy(st, &check);
            dg_status_prepend(st, "checking whether the variables are initialized");
            dg_session_free(&sess);
            break;
        }
        if (atomic_load(&ms->rs.stop_requested)) {
            dg_status_set(st, DG_CANCELLED, "stop requested while waiting for the chief to initialize variables");
            dg_session_free(&sess);
            break;
        }
        int64_t now = base_now_ms();
        if (now >= next_report) {
            fprintf(ms->log, "%.3f: waiting for the chief to initialize variables (%lld s of %lld s): %s%s%s\n",
                    base_unix_s(), (long long)((now - start) / 1000), (long long)(ms->wait_for_chief_ms / 1000),
                    have_flags ? sb_str(&pending) : "no check answered yet",
                    dg_status_code(&check) != DG_OK ? "; the last check: " : "",
                    dg_status_code(&check) != DG_OK ? dg_status_message(&check) : "");
            fflush(ms->log);
            next_report = now + WAIT_REPORT_MS;
        }
        if (now >= deadline) {
            strbuf msg = {0};
            sb_addf(&msg, "waited %lld ms for the chief to initialize variables: ", (long long)ms->wait_for_chief_ms);
            if (have_flags) sb_addf(&msg, "%s", sb_str(&pending));
            else list_names(&msg, ms->rs.saver, NULL);
            if (dg_status_code(&check) != DG_OK)
                sb_addf(&msg, " (the last check failed: %s: %s)", dg_code_name(dg_status_code(&check)),
                        dg_status_message(&check));
            // Variables no ps holds may be this task's own, which no chief initializes.
            bool on_ps = false;
            for (int i = 0; i < n_vars && !on_ps; i++)
                on_ps = strstr(dg_node_requested_device(training_saver_variable(ms->rs.saver, i).node), "/job:ps") != NULL;
            if (!on_ps)
                sb_addf(&msg, ". If no other task makes these variables ready (all-reduce, where each "
                        "worker holds its own), set dg_mts_options.init_variables = DG_ROLE_YES");
            dg_status_set(st, DG_DEADLINE_EXCEEDED, sb_str(&msg));
            free(msg.p);
            dg_session_free(&sess);
            break;
        }
        int64_t nap = deadline - now < backoff ? deadline - now : backoff;
        base_sleep_ms(next_report - now < nap ? next_report - now : nap);   // wake for the report too
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
    }
    free(pending.p);
    status_impl_clear(&check);
    free(flags);
    return sess;
}

// Creates the underlying session and makes it ready, retrying UNAVAILABLE and ABORTED with
// backoff up to max_attempts times; then runs the after_create_session hooks. Called by one
// thread at a time (creation, or the recovering thread); sets ms->sess.
static bool create_session(dg_monitored_session *ms, dg_status *st) {
    int64_t backoff = ms->backoff_ms;
    for (int attempt = 1;; attempt++) {
        dg_session *sess = ms->init_variables ? create_chief(ms, st) : create_worker(ms, st);
        if (sess) {
            pthread_mutex_lock(&ms->mu);
            ms->sess = sess;
            pthread_mutex_unlock(&ms->mu);
            if (hooks_after_create(ms, sess, st)) return true;
            pthread_mutex_lock(&ms->mu);
            ms->sess = NULL;
            pthread_mutex_unlock(&ms->mu);
            dg_session_free(&sess);
        }
        if (!is_recoverable(dg_status_code(st))) return false;
        if (attempt >= ms->max_attempts) {
            dg_status_prepend(st, "recovery: gave up after %d attempts to create the session", attempt);
            return false;
        }
        if (atomic_load(&ms->rs.stop_requested)) {
            dg_status_prepend(st, "stop requested while creating the session");
            return false;
        }
        base_sleep_ms(backoff);
        backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
    }
}

static bool add_hook(dg_monitored_session *ms, dg_session_hook *h, bool owned, dg_status *st) {
    if (!h) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "monitored session: hook %d is NULL", ms->n_hooks);
        return false;
    }
    BASE_PUSH(ms->hooks, ms->n_hooks, ms->cap_hooks, h);
    if (owned) BASE_PUSH(ms->owned, ms->n_owned, ms->cap_owned, h);
    return true;
}

// Orders the hooks by their order field, keeping the given order within one (insertion sort:
// stable, and there are a handful).
static void sort_hooks(dg_monitored_session *ms) {
    for (int i = 1; i < ms->n_hooks; i++) {
        dg_session_hook *h = ms->hooks[i];
        int j = i;
        for (; j > 0 && ms->hooks[j - 1]->order > h->order; j--) ms->hooks[j] = ms->hooks[j - 1];
        ms->hooks[j] = h;
    }
}

// Whether a task takes role r: its own answer, or is_chief's.
static bool takes(dg_role r, bool is_chief) { return r == DG_ROLE_DEFAULT ? is_chief : r == DG_ROLE_YES; }

// The built-in hooks of the roles (TensorFlow adds them after the user's).
static bool add_builtin_hooks(dg_monitored_session *ms, const dg_mts_options *o, dg_status *st) {
    bool summaries = takes(o->write_summaries, o->is_chief), saves = takes(o->save_checkpoints, o->is_chief);
    dg_session_hook *h;
    if (summaries && o->log_step_count_steps > 0) {
        if (!(h = dg_step_counter_hook_new(o->log_step_count_steps, o->log, st))) return false;
        add_hook(ms, h, true, st);
    }
    if (summaries && o->logdir && *o->logdir) {
        if (!(h = dg_tensorboard_hook_new(o->logdir, o->save_summaries_steps > 0 ? o->save_summaries_steps : 100, NULL,
                                          NULL, 0, st)))
            return false;
        add_hook(ms, h, true, st);
    }
    if (!o->checkpoint_path) return true;
    if (summaries && o->save_summaries_steps > 0 && dg_graph_collection_size(ms->g, DG_SUMMARIES) > 0) {
        if (!(h = dg_summary_saver_hook_new(o->checkpoint_path, o->save_summaries_steps, NULL, NULL, 0, st)))
            return false;
        add_hook(ms, h, true, st);
    }
    if (!saves) return true;
    if (!(h = dg_checkpoint_saver_hook_new(o->checkpoint_path, o->save_checkpoint_steps, o->save_checkpoint_secs,
                                           o->max_to_keep, o->log, st)))
        return false;
    add_hook(ms, h, true, st);
    return true;
}

// The ops the session needs, added before any session exists: saver, readiness checks, init.
static bool build_ops(dg_monitored_session *ms, dg_status *st) {
    if (!(ms->rs.saver = dg_saver_new(ms->g, st))) return false;
    int n = dg_saver_num_variables(ms->rs.saver);
    ms->ready = calloc((size_t)n, sizeof *ms->ready);
    if (!ms->ready) abort();
    dg_graph_push_name_scope(ms->g, "ready");
    for (int i = 0; i < n; i++)
        ms->ready[i] = dg_is_variable_initialized(ms->g, dg_saver_variable_name(ms->rs.saver, i), training_saver_variable(ms->rs.saver, i));
    dg_graph_pop_name_scope(ms->g);
    ms->init_op = dg_global_variables_initializer(ms->g);
    if (dg_graph_collection_size(ms->g, DG_GLOBAL_STEP) > 0)
        ms->global_step = (dg_output){dg_graph_collection_get(ms->g, DG_GLOBAL_STEP, 0), 0};
    if (!dg_graph_check(ms->g, st)) {
        dg_status_prepend(st, "monitored session: building the readiness and init ops");
        return false;
    }
    return true;
}

dg_monitored_session *dg_monitored_session_new(dg_graph *g, const dg_mts_options *opts,
                                                        dg_status *st) {
    dg_status_reset(st);
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "monitored session: graph is NULL");
        return NULL;
    }
    dg_mts_options o = opts ? *opts : dg_mts_options_default();
    const dg_role roles[4] = {o.init_variables, o.restore, o.save_checkpoints, o.write_summaries};
    const char *role_names[4] = {"init_variables", "restore", "save_checkpoints", "write_summaries"};
    for (int i = 0; i < 4; i++)
        if ((unsigned)roles[i] > DG_ROLE_NO) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "monitored session: %s is %d, not DG_ROLE_DEFAULT, "
                           "DG_ROLE_YES or DG_ROLE_NO", role_names[i], (int)roles[i]);
            return NULL;
        }
    if (o.n_hooks < 0 || o.n_chief_only_hooks < 0 || (o.n_hooks && !o.hooks) ||
        (o.n_chief_only_hooks && !o.chief_only_hooks) || o.max_to_keep < 0 || o.save_checkpoint_steps < 0 ||
        o.save_checkpoint_secs < 0 || o.stop_grace_ms < 0 || o.wait_for_chief_ms < 0 ||
        o.max_recovery_attempts < 1 || o.recovery_backoff_ms < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "monitored session: bad options (n_hooks %d, n_chief_only_hooks %d, "
                       "max_to_keep %d, save_checkpoint_steps %lld, save_checkpoint_secs %lld, stop_grace_ms %lld, "
                       "wait_for_chief_ms %lld, max_recovery_attempts %d, recovery_backoff_ms %lld)",
                       o.n_hooks, o.n_chief_only_hooks, o.max_to_keep, (long long)o.save_checkpoint_steps,
                       (long long)o.save_checkpoint_secs, (long long)o.stop_grace_ms,
                       (long long)o.wait_for_chief_ms, o.max_recovery_attempts, (long long)o.recovery_backoff_ms);
        return NULL;
    }
    // All-reduce training keeps a copy of the variables on every worker, and no other task
    // initializes a worker's copy: a non-chief left to wait would wait for its whole deadline.
    if (!o.is_chief && o.init_variables == DG_ROLE_DEFAULT)
        for (int i = 0; i < dg_graph_num_nodes(g); i++) {
            const dg_node *n = dg_graph_node(g, i);
            if (strcmp(dg_node_op_type(n), "CollectiveAllReduce") != 0) continue;
            dg_status_setf(st, DG_FAILED_PRECONDITION, "monitored session: this graph all-reduces (node \"%s\"), "
                           "so every worker holds its own variables and no chief initializes this worker's: set "
                           "dg_mts_options.init_variables = DG_ROLE_YES (and keep is_chief for worker 0, which "
                           "restores and saves), and broadcast worker 0's values (dg_broadcast_variables_hook_new); "
                           "DG_ROLE_NO if another task really initializes them", dg_node_name(n));
            return NULL;
        }
    dg_monitored_session *ms = calloc(1, sizeof *ms);
    if (!ms) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "monitored session: %zu bytes", sizeof *ms);
        return NULL;
    }
    ms->g = g;
    ms->is_chief = o.is_chief;
    ms->init_variables = takes(o.init_variables, o.is_chief);
    ms->restore = ms->init_variables && takes(o.restore, o.is_chief);
    ms->sopts = o.session_options ? *o.session_options : dg_session_options_default();
    ms->stop_grace_ms = o.stop_grace_ms;
    ms->wait_for_chief_ms = o.wait_for_chief_ms;
    ms->log = o.log ? o.log : stdout;
    ms->backoff_ms = o.recovery_backoff_ms;
    ms->max_attempts = o.max_recovery_attempts;
    atomic_init(&ms->rs.restored_step, -1);
    atomic_init(&ms->n_recoveries, 0);
    pthread_mutex_init(&ms->mu, NULL);
    pthread_cond_init(&ms->cv, NULL);
    pthread_mutex_init(&ms->hook_mu, NULL);
    atomic_init(&ms->rs.stop_requested, false);
    atomic_init(&ms->rs.last_run_failed, false);
    atomic_init(&ms->rs.closed, false);
    if ((o.master && !(ms->master = strdup(o.master))) ||
        (o.checkpoint_path && !(ms->checkpoint_path = strdup(o.checkpoint_path))))
        abort();
    bool ok = true;
    for (int i = 0; i < o.n_hooks && ok; i++) ok = add_hook(ms, o.hooks[i], false, st);
    for (int i = 0; i < o.n_chief_only_hooks && ok && o.is_chief; i++)
        ok = add_hook(ms, o.chief_only_hooks[i], false, st);
    ok = ok && add_builtin_hooks(ms, &o, st);
    if (ok) sort_hooks(ms);
    for (int i = 0; i < ms->n_hooks && ok; i++) {
        dg_session_hook *h = ms->hooks[i];
        if (h->begin && !(ok = h->begin(h->ctx, g, st))) dg_status_prepend(st, "hook \"%s\" begin", hook_name(h));
    }
    ok = ok && build_ops(ms, st);
    if (ok && ms->restore && ms->checkpoint_path) {
        ms->store = dg_checkpoint_store_new(ms->checkpoint_path, true, st);
        ok = ms->store != NULL;
    }
    ok = ok && create_session(ms, st);
    if (!ok) {
        atomic_store(&ms->rs.last_run_failed, true);   // no end hooks for a session never made
        dg_monitored_session_free(&ms);
        return NULL;
    }
    return ms;
}

// Replaces the session of generation gen after a recoverable failure. Returns true when a
// session of a newer generation is ready (made here or by another thread).
static bool recover(dg_monitored_session *ms, uint64_t gen, dg_status *st) {
    pthread_mutex_lock(&ms->mu);
    while (ms->recovering) pthread_cond_wait(&ms->cv, &ms->mu);
    if (ms->generation != gen && ms->sess) {
        pthread_mutex_unlock(&ms->mu);
        return true;
    }
    if (ms->closing) {
        pthread_mutex_unlock(&ms->mu);
        dg_status_prepend(st, "the monitored session is closing, not recovering");
        return false;
    }
    ms->recovering = true;
    // Runs still using the old session end within their deadlines; it is freed after them.
    while (ms->in_flight > 0) pthread_cond_wait(&ms->cv, &ms->mu);
    dg_session *old = ms->sess;
    ms->sess = NULL;
    pthread_mutex_unlock(&ms->mu);
    dg_session_free(&old);
    atomic_store(&ms->in_recovery, true);
    bool ok = create_session(ms, st);
    atomic_store(&ms->in_recovery, false);
    pthread_mutex_lock(&ms->mu);
    ms->recovering = false;
    if (ok) {
        ms->generation++;
        ms->n_recoveries++;
    }
    pthread_cond_broadcast(&ms->cv);
    pthread_mutex_unlock(&ms->mu);
    return ok;
}

// One run with the hooks on sess.
static bool hooked_run(dg_monitored_session *ms, dg_session *sess, const dg_output *feeds,
                       dg_tensor *const *feed_values, int n_feeds, const dg_output *fetches, dg_tensor **fetched,
                       int n_fetches, dg_node *const *targets, int n_targets, dg_status *st) {
    dg_run_context rc = {ms, sess, fetches, n_fetches, feeds, feed_values, n_feeds, targets, n_targets, NULL};
    int nh = ms->n_hooks;
    dg_hook_run_args *args = calloc((size_t)nh + 1, sizeof *args);
    if (!args) abort();
    bool ok = true;
    pthread_mutex_lock(&ms->hook_mu);
    for (int i = 0; i < nh && ok; i++) {
        dg_session_hook *h = ms->hooks[i];
        if (h->before_run && !(ok = h->before_run(h->ctx, &rc, &args[i], st)))
            dg_status_prepend(st, "hook \"%s\" before_run", hook_name(h));
        else if (args[i].n_feeds < 0 || args[i].n_fetches < 0 || args[i].n_targets < 0 ||
                 (args[i].n_feeds && (!args[i].feeds || !args[i].feed_values)) ||
                 (args[i].n_fetches && !args[i].fetches) || (args[i].n_targets && !args[i].targets)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "hook \"%s\" before_run: a count is negative or an array is NULL",
                           hook_name(h));
            ok = false;
        }
    }
    pthread_mutex_unlock(&ms->hook_mu);
    if (!ok) {
        free(args);
        return false;
    }
    // Merge: the caller's fetches first, then each distinct hook fetch once.
    int tf = n_feeds, tg = n_fetches, tt = n_targets, th = 0;
    for (int i = 0; i < nh; i++) {
        tf += args[i].n_feeds;
        tg += args[i].n_fetches;
        tt += args[i].n_targets;
        th += args[i].n_fetches;
    }
    dg_output *mfeeds = malloc(((size_t)tf + 1) * sizeof *mfeeds);
    dg_tensor **mvals = malloc(((size_t)tf + 1) * sizeof *mvals);
    dg_output *mfetch = malloc(((size_t)tg + 1) * sizeof *mfetch);
    dg_tensor **out = calloc((size_t)tg + 1, sizeof *out);
    dg_node **mtargets = malloc(((size_t)tt + 1) * sizeof *mtargets);
    int *map = malloc(((size_t)th + 1) * sizeof *map);
    dg_tensor **hv = malloc(((size_t)th + 1) * sizeof *hv);
    if (!mfeeds || !mvals || !mfetch || !out || !mtargets || !map || !hv) abort();
    int nf = 0, ng = 0, nt = 0, nm = 0;
    for (int i = 0; i < n_feeds; i++, nf++) {
        mfeeds[nf] = feeds[i];
        mvals[nf] = feed_values[i];
    }
    for (int i = 0; i < n_fetches; i++) mfetch[ng++] = fetches[i];
    for (int i = 0; i < n_targets; i++) mtargets[nt++] = targets[i];
    char buf[256];
    for (int i = 0; i < nh && ok; i++) {
        for (int k = 0; k < args[i].n_feeds && ok; k++) {
            dg_output f = args[i].feeds[k];
            for (int j = 0; j < nf && ok; j++)
                if (mfeeds[j].node == f.node && mfeeds[j].index == f.index) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT, "hook \"%s\" feeds \"%s\", which is already fed "
                                   "by the caller or an earlier hook", hook_name(ms->hooks[i]),
                                   dg_output_str(f, buf, sizeof buf));
                    ok = false;
                }
            mfeeds[nf] = f;
            mvals[nf++] = args[i].feed_values[k];
        }
        for (int k = 0; k < args[i].n_fetches; k++) {
            dg_output f = args[i].fetches[k];
            int at = -1;
            for (int j = 0; j < ng && at < 0; j++)
                if (mfetch[j].node == f.node && mfetch[j].index == f.index) at = j;
            if (at < 0) {
                at = ng;
                mfetch[ng++] = f;
            }
            map[nm++] = at;
        }
        for (int k = 0; k < args[i].n_targets; k++) {
            bool dup = false;
            for (int j = 0; j < nt && !dup; j++) dup = mtargets[j] == args[i].targets[k];
            if (!dup) mtargets[nt++] = args[i].targets[k];
        }
    }
    dg_run_options ro = {0};
    for (int i = 0; i < nh; i++) ro.trace |= args[i].trace;
    dg_step_trace *trace = NULL;
    ok = ok && dg_session_run_with_options(sess, &ro, mfeeds, mvals, nf, mfetch, out, ng, mtargets, nt,
                                           ro.trace ? &trace : NULL, st);
    rc.trace = trace;
    if (ok) {
        pthread_mutex_lock(&ms->hook_mu);
        for (int i = 0, m = 0; i < nh; m += args[i].n_fetches, i++) {
            dg_session_hook *h = ms->hooks[i];
            if (!h->after_run) continue;
            for (int k = 0; k < args[i].n_fetches; k++) hv[k] = out[map[m + k]];
            if (!(ok = h->after_run(h->ctx, &rc, hv, args[i].n_fetches, st))) {
                dg_status_prepend(st, "hook \"%s\" after_run", hook_name(h));
                break;
            }
        }
        pthread_mutex_unlock(&ms->hook_mu);
    }
    if (ok)
        for (int i = 0; i < n_fetches; i++) {
            fetched[i] = out[i];
            out[i] = NULL;
        }
    for (int i = 0; i < ng; i++) dg_tensor_unref(out[i]);
    dg_step_trace_free(&trace);
    free(mfeeds);
    free(mvals);
    free(mfetch);
    free(out);
    free(mtargets);
    free(map);
    free(hv);
    free(args);
    return ok;
}

// Takes a reference on the current session for a run or a read: *sess and *gen, or false
// with st set (closed, or no session after a failed recovery). With wait, waits out a recovery.
static bool acquire(dg_monitored_session *ms, bool wait, dg_session **sess, uint64_t *gen, dg_status *st) {
    pthread_mutex_lock(&ms->mu);
    while (wait && ms->recovering) pthread_cond_wait(&ms->cv, &ms->mu);
    if (ms->closing || atomic_load(&ms->rs.closed)) {
        pthread_mutex_unlock(&ms->mu);
        dg_status_set(st, DG_FAILED_PRECONDITION, "the monitored session is closed");
        return false;
    }
    *sess = ms->sess;
    *gen = ms->generation;
    if (*sess) ms->in_flight++;
    pthread_mutex_unlock(&ms->mu);
    return true;
}

static void release(dg_monitored_session *ms) {
    pthread_mutex_lock(&ms->mu);
    ms->in_flight--;
    pthread_cond_broadcast(&ms->cv);
    pthread_mutex_unlock(&ms->mu);
}

bool dg_monitored_session_run(dg_monitored_session *s, const dg_output *feeds,
                              dg_tensor *const *feed_values, int n_feeds, const dg_output *fetches,
                              dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                              int n_targets, dg_status *st) {
    dg_status_reset(st);
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "monitored session is NULL");
        return false;
    }
    if (n_feeds < 0 || n_fetches < 0 || n_targets < 0 || (n_feeds && (!feeds || !feed_values)) ||
        (n_fetches && (!fetches || !fetched)) || (n_targets && !targets)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "monitored session run: a count is negative or an array is NULL");
        return false;
    }
    // Each pass either succeeds, fails for good, or recovers; a step that keeps failing after
    // fresh sessions gives up like a creation that keeps failing.
    for (int pass = 1;; pass++) {
        dg_session *sess = NULL;
        uint64_t gen = 0;
        if (!acquire(s, true, &sess, &gen, st)) return false;
        bool ok;
        if (sess) {
            ok = hooked_run(s, sess, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, targets, n_targets, st);
            release(s);
        } else {
            ok = false;
            dg_status_set(st, DG_UNAVAILABLE, "the monitored session has no session (a recovery failed)");
        }
        if (ok) {
            if (pass > 1) dg_status_reset(st);   // the failures before the recovery are over
            atomic_store(&s->rs.last_run_failed, false);
            return true;
        }
        if (!is_recoverable(dg_status_code(st))) {
            atomic_store(&s->rs.last_run_failed, true);
            return false;
        }
        if (pass > s->max_attempts) {
            dg_status_prepend(st, "recovery: gave up after %d attempts: the step failed on each fresh session",
                              pass);
            atomic_store(&s->rs.last_run_failed, true);
            return false;
        }
        if (!recover(s, gen, st)) {
            atomic_store(&s->rs.last_run_failed, true);
            return false;
        }
    }
}

bool dg_monitored_session_close(dg_monitored_session *s, dg_status *st) {
    dg_status_reset(st);
    if (!s || atomic_load(&s->rs.closed)) return true;
    atomic_store(&s->rs.stop_requested, true);
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    int64_t deadline = base_now_ms() + s->stop_grace_ms;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t abs_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + s->stop_grace_ms;
    ts.tv_sec = (time_t)(abs_ms / 1000);
    ts.tv_nsec = (long)(abs_ms % 1000) * 1000000L;
    while ((s->in_flight > 0 || s->recovering) && base_now_ms() < deadline)
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    if (s->in_flight > 0 || s->recovering) {
        int n = s->in_flight;
        pthread_mutex_unlock(&s->mu);
        dg_status_setf(st, DG_DEADLINE_EXCEEDED, "monitored session close: %d run(s) of other threads still in "
                       "progress after the stop grace period of %lld ms", n, (long long)s->stop_grace_ms);
        return false;
    }
    dg_session *sess = s->sess;
    pthread_mutex_unlock(&s->mu);
    bool ok = true;
    if (sess && !atomic_load(&s->rs.last_run_failed)) {
        dg_status err = DG_STATUS_INIT;
        pthread_mutex_lock(&s->hook_mu);
        for (int i = 0; i < s->n_hooks; i++) {
            dg_session_hook *h = s->hooks[i];
            if (!h->end || h->end(h->ctx, s, sess, &err)) continue;
            if (ok) {
                dg_status_copy(st, &err);
                dg_status_prepend(st, "hook \"%s\" end", hook_name(h));
            }
            ok = false;
            status_impl_clear(&err);
        }
        pthread_mutex_unlock(&s->hook_mu);
        status_impl_clear(&err);
    }
    pthread_mutex_lock(&s->mu);
    s->sess = NULL;
    atomic_store(&s->rs.closed, true);
    pthread_mutex_unlock(&s->mu);
    dg_session_free(&sess);
    return ok;
}

void dg_monitored_session_free(dg_monitored_session **sp) {
    if (!sp || !*sp) return;
    dg_monitored_session *s = *sp;
    dg_status err = DG_STATUS_INIT;
    s->stop_grace_ms = INT64_MAX / 4;   // free waits for the other threads' runs
    dg_monitored_session_close(s, &err);
    status_impl_clear(&err);
    for (int i = 0; i < s->n_owned; i++) dg_session_hook_free(&s->owned[i]);
    free(s->owned);
    free(s->hooks);
    dg_checkpoint_store_free(&s->store);
    dg_saver_free(&s->rs.saver);
    free(s->ready);
    free(s->master);
    free(s->checkpoint_path);
    pthread_mutex_destroy(&s->hook_mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *sp = NULL;
}

int64_t dg_monitored_session_global_step(dg_monitored_session *s, dg_status *st) {
    dg_status_reset(st);
    if (!s || !s->global_step.node) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "the graph has no global step (create it with dg_global_step)");
        return -1;
    }
    dg_session *sess = NULL;
    uint64_t gen;
    // No waiting for a recovery: hooks of the recovering thread read the step too.
    if (!acquire(s, false, &sess, &gen, st)) return -1;
    if (!sess) {
        dg_status_set(st, DG_UNAVAILABLE, "the monitored session has no session now (recovering)");
        return -1;
    }
    dg_tensor *v = NULL;
    bool ok = dg_session_run(sess, NULL, NULL, 0, &s->global_step, &v, 1, NULL, 0, st);
    release(s);
    if (!ok) return -1;
    int64_t step = dg_tensor_i64(v)[0];
    dg_tensor_unref(v);
    return step;
}

dg_session *dg_monitored_session_session(dg_monitored_session *s) {
    if (!s) return NULL;
    pthread_mutex_lock(&s->mu);
    dg_session *sess = s->sess;
    pthread_mutex_unlock(&s->mu);
    return sess;
}

int dg_monitored_session_num_recoveries(const dg_monitored_session *s) {
    return s ? atomic_load(&((dg_monitored_session *)s)->n_recoveries) : 0;
}
bool dg_monitored_session_is_chief(const dg_monitored_session *s) { return s && s->is_chief; }
dg_graph *dg_monitored_session_graph(const dg_monitored_session *s) { return s ? s->g : NULL; }
