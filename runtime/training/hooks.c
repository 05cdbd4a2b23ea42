/* Built-in session hooks (TensorFlow's basic_session_run_hooks): stop at a step, checkpoint
 * saver, step counter, tensor logging, NaN guard, summary saver, final ops. They use only the
 * public API: the global step comes from the DG_GLOBAL_STEP collection, the saver from the
 * monitored session. Each keeps its state in its ctx; the monitored session serializes their
 * callbacks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base_impl.h"
#include "distgraph/monitored_session.h"
#include "distgraph/summary.h"
#include "training_impl.h"


dg_session_hook *training_new_hook(const char *name, void *ctx, void (*free_ctx)(void *), dg_status *st) {
    dg_session_hook *h = calloc(1, sizeof *h);
    if (!h) {
        if (free_ctx) free_ctx(ctx);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "hook \"%s\": %zu bytes", name, sizeof *h);
        return NULL;
    }
    h->name = name;
    h->ctx = ctx;
    h->free_ctx = free_ctx;
    return h;
}

void dg_session_hook_free(dg_session_hook **hp) {
    if (!hp || !*hp) return;
    if ((*hp)->free_ctx) (*hp)->free_ctx((*hp)->ctx);
    free(*hp);
    *hp = NULL;
}

static bool find_global_step(dg_graph *g, const char *hook, dg_output *gs, dg_status *st) {
    if (dg_graph_collection_size(g, DG_GLOBAL_STEP) == 0) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "%s needs the graph's global step (create it with "
                       "dg_global_step)", hook);
        return false;
    }
    *gs = (dg_output){dg_graph_collection_get(g, DG_GLOBAL_STEP, 0), 0};
    return true;
}

static bool read_step(dg_session *sess, dg_output gs, int64_t *step, dg_status *st) {
    dg_tensor *v = NULL;
    if (!dg_session_run(sess, NULL, NULL, 0, &gs, &v, 1, NULL, 0, st)) return false;
    *step = dg_tensor_i64(v)[0];
    dg_tensor_unref(v);
    return true;
}

// ---- stop at step ----
typedef struct stop_hook {
    int64_t num_steps, last_step;   // last_step -1 until the first creation fixes it
    dg_output gs;
} stop_hook;

static bool stop_begin(void *ctx, dg_graph *g, dg_status *st) {
    stop_hook *h = ctx;
    return find_global_step(g, "the stop-at-step hook", &h->gs, st);
}

static bool stop_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    stop_hook *h = ctx;
    int64_t step;
    if (!read_step(sess, h->gs, &step, st)) return false;
    if (h->last_step < 0) h->last_step = step + h->num_steps;
    if (step >= h->last_step) dg_monitored_session_request_stop(ms);
    return true;
}

static bool stop_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    stop_hook *h = ctx;
    args->fetches = &h->gs;
    args->n_fetches = 1;
    return true;
}

static bool stop_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    stop_hook *h = ctx;
    int64_t step = dg_tensor_i64(values[0])[0];
    // The fetched value may predate this run's increment (it is read concurrently with the
    // train op on another task): one short of the last step is read again.
    if (step + 1 >= h->last_step && step < h->last_step && !read_step(rc->raw_session, h->gs, &step, st))
        return false;
    if (step >= h->last_step) dg_monitored_session_request_stop(rc->session);
    return true;
}

dg_session_hook *dg_stop_at_step_hook_new(int64_t num_steps, int64_t last_step, dg_status *st) {
    dg_status_reset(st);
    if ((num_steps < 0) == (last_step < 0) || num_steps < -1 || last_step < -1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "stop-at-step hook: give exactly one of num_steps (%lld) and "
                       "last_step (%lld), the other -1", (long long)num_steps, (long long)last_step);
        return NULL;
    }
    stop_hook *c = calloc(1, sizeof *c);
    if (!c) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "stop-at-step hook: out of memory");
        return NULL;
    }
    c->num_steps = num_steps;
    c->last_step = last_step;
    dg_session_hook *h = training_new_hook("stop_at_step", c, free, st);
    if (!h) return NULL;
    h->begin = stop_begin;
    h->after_create_session = stop_after_create;
    h->before_run = stop_before_run;
    h->after_run = stop_after_run;
    return h;
}

dg_session_hook *dg_stop_at_last_step_hook_new(int64_t last_step, dg_status *st) {
    if (last_step < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "stop-at-step hook: last_step %lld is negative", (long long)last_step);
        return NULL;
    }
    return dg_stop_at_step_hook_new(-1, last_step, st);
}

dg_session_hook *dg_stop_after_steps_hook_new(int64_t num_steps, dg_status *st) {
    if (num_steps < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "stop-at-step hook: num_steps %lld is negative", (long long)num_steps);
        return NULL;
    }
    return dg_stop_at_step_hook_new(num_steps, -1, st);
}

// ---- broadcast of the variables ----
static bool bcast_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    (void)ms;
    if (dg_session_run_target(sess, ctx, st)) return true;
    dg_status_prepend(st, "broadcasting rank 0's variables (\"%s\")", dg_node_name(ctx));
    return false;
}

dg_session_hook *dg_broadcast_variables_hook_new(dg_node *op, dg_status *st) {
    if (!op) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "broadcast-variables hook: the op is NULL (did "
                      "dg_collective_broadcast_variables fail? the graph's status says why)");
        return NULL;
    }
    dg_session_hook *h = training_new_hook("broadcast_variables", op, NULL, st);
    if (!h) return NULL;
    h->after_create_session = bcast_after_create;
    h->order = DG_HOOK_ORDER_SETUP;
    return h;
}

// ---- checkpoint saver ----
typedef struct ckpt_hook {
    char *path;
    int64_t save_steps, save_secs;
    int max_to_keep;
    dg_checkpoint_store *store;   // opened at the first creation
    dg_output gs;
    int64_t last_trigger_step;    // step seen at the last save (or creation)
    int64_t last_trigger_ms;
    int64_t last_saved_step;      // -1 before the first save
    FILE *out;                    // where each save is reported
} ckpt_hook;

static void ckpt_free(void *ctx) {
    ckpt_hook *h = ctx;
    dg_checkpoint_store_free(&h->store);
    free(h->path);
    free(h);
}

static bool ckpt_begin(void *ctx, dg_graph *g, dg_status *st) {
    ckpt_hook *h = ctx;
    return find_global_step(g, "the checkpoint saver hook", &h->gs, st);
}

static bool ckpt_save(ckpt_hook *h, dg_saver *sv, dg_session *sess, dg_status *st) {
    int64_t step = -1;
    if (!dg_saver_save(sv, sess, h->store, -1, h->max_to_keep, &step, st)) {
        dg_status_prepend(st, "saving a checkpoint to \"%s\"", h->path);
        return false;
    }
    h->last_saved_step = step;
    h->last_trigger_step = step;
    h->last_trigger_ms = base_now_ms();
    // One line a save, with the Unix time, as TensorFlow's saver logs "Saving checkpoints for N".
    fprintf(h->out ? h->out : stdout, "%.6f: saved the checkpoint of global step %lld to %s\n", base_unix_s(),
            (long long)step, h->path);
    fflush(h->out ? h->out : stdout);
    return true;
}

static bool ckpt_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    ckpt_hook *h = ctx;
    dg_saver *sv = dg_monitored_session_saver(ms);
    if (!sv) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "the checkpoint saver hook needs a monitored session's saver");
        return false;
    }
    if (!h->store && !(h->store = dg_checkpoint_store_new(h->path, true, st))) return false;
    int64_t step;
    if (!read_step(sess, h->gs, &step, st)) return false;
    h->last_trigger_step = step;
    h->last_trigger_ms = base_now_ms();
    // Freshly initialized variables are saved at once, so a restart before the first periodic
    // save does not initialize them again with other random values.
    if (dg_monitored_session_restored_step(ms) < 0) return ckpt_save(h, sv, sess, st);
    h->last_saved_step = dg_monitored_session_restored_step(ms);
    return true;
}

static bool ckpt_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    ckpt_hook *h = ctx;
    args->fetches = &h->gs;
    args->n_fetches = 1;
    return true;
}

static bool ckpt_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    ckpt_hook *h = ctx;
    int64_t step = dg_tensor_i64(values[0])[0];
    bool by_time = h->save_secs > 0 && base_now_ms() - h->last_trigger_ms >= h->save_secs * 1000;
    bool by_steps = h->save_steps > 0 && step + 1 >= h->last_trigger_step + h->save_steps;
    // As in the stop hook, the fetched step may predate this run's increment: a step one short
    // of the next save is read again, so saves land on multiples of save_steps either way.
    if (by_steps && step < h->last_trigger_step + h->save_steps) {
        if (!read_step(rc->raw_session, h->gs, &step, st)) return false;
        by_steps = step >= h->last_trigger_step + h->save_steps;
    }
    if (!by_steps && !by_time) return true;
    return ckpt_save(h, dg_monitored_session_saver(rc->session), rc->raw_session, st);
}

static bool ckpt_end(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    ckpt_hook *h = ctx;
    int64_t step;
    if (!h->store) return true;   // never created a session
    if (!read_step(sess, h->gs, &step, st)) return false;
    if (step == h->last_saved_step) return true;
    return ckpt_save(h, dg_monitored_session_saver(ms), sess, st);
}

dg_session_hook *dg_checkpoint_saver_hook_new(const char *path, int64_t save_steps, int64_t save_secs,
                                              int max_to_keep, FILE *out, dg_status *st) {
    dg_status_reset(st);
    if (!path || !*path || save_steps < 0 || save_secs < 0 || max_to_keep < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint saver hook: need a path and save_steps (%lld), "
                       "save_secs (%lld), max_to_keep (%d) >= 0", (long long)save_steps, (long long)save_secs,
                       max_to_keep);
        return NULL;
    }
    ckpt_hook *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "checkpoint saver hook: out of memory");
        return NULL;
    }
    c->save_steps = save_steps;
    c->save_secs = save_secs;
    c->max_to_keep = max_to_keep;
    c->last_saved_step = -1;
    c->out = out;
    dg_session_hook *h = training_new_hook("checkpoint_saver", c, ckpt_free, st);
    if (!h) return NULL;
    h->begin = ckpt_begin;
    h->after_create_session = ckpt_after_create;
    h->before_run = ckpt_before_run;
    h->after_run = ckpt_after_run;
    h->end = ckpt_end;
    return h;
}

// ---- step counter ----
typedef struct counter_hook {
    int64_t every;
    FILE *out;
    dg_output gs;
    int64_t last_step;   // -1: nothing seen since the session was created
    double last_s;
} counter_hook;

static bool counter_begin(void *ctx, dg_graph *g, dg_status *st) {
    counter_hook *h = ctx;
    return find_global_step(g, "the step counter hook", &h->gs, st);
}

static bool counter_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    ((counter_hook *)ctx)->last_step = -1;
    return true;
}

static bool counter_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    counter_hook *h = ctx;
    args->fetches = &h->gs;
    args->n_fetches = 1;
    return true;
}

static bool counter_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    counter_hook *h = ctx;
    int64_t step = dg_tensor_i64(values[0])[0];
    double t = base_now_s();
    if (h->last_step < 0 || step < h->last_step) {
        h->last_step = step;
        h->last_s = t;
    } else if (step >= h->last_step + h->every) {
        double secs = t - h->last_s;
        fprintf(h->out ? h->out : stdout, "global_step/sec: %.4g (global step %lld)\n",
                secs > 0 ? (double)(step - h->last_step) / secs : 0.0, (long long)step);
        fflush(h->out ? h->out : stdout);
        h->last_step = step;
        h->last_s = t;
    }
    return true;
}

dg_session_hook *dg_step_counter_hook_new(int64_t every_n_steps, FILE *out, dg_status *st) {
    dg_status_reset(st);
    if (every_n_steps < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "step counter hook: every_n_steps must be >= 1, got %lld",
                       (long long)every_n_steps);
        return NULL;
    }
    counter_hook *c = calloc(1, sizeof *c);
    if (!c) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "step counter hook: out of memory");
        return NULL;
    }
    c->every = every_n_steps;
    c->out = out;
    c->last_step = -1;
    dg_session_hook *h = training_new_hook("step_counter", c, free, st);
    if (!h) return NULL;
    h->begin = counter_begin;
    h->after_create_session = counter_after_create;
    h->before_run = counter_before_run;
    h->after_run = counter_after_run;
    return h;
}

// ---- logging of tensors ----
typedef struct log_hook {
    dg_output *tensors;
    int n;
    int64_t every, iter;
    FILE *out;
} log_hook;

static void log_free(void *ctx) {
    log_hook *h = ctx;
    free(h->tensors);
    free(h);
}

static bool log_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    log_hook *h = ctx;
    if (h->iter % h->every == 0) {
        args->fetches = h->tensors;
        args->n_fetches = h->n;
    }
    return true;
}

static void print_value(FILE *f, const dg_tensor *t) {
    int64_t n = dg_tensor_num_elements(t);
    if (dg_tensor_rank(t) == 0) {
        fprintf(f, "%.6g", dg_tensor_get_as_double(t, 0));
        return;
    }
    char sb[128];
    if (n > 10) fprintf(f, "shape %s ", dg_shape_str(dg_tensor_shape(t), sb, sizeof sb));
    fputc('[', f);
    for (int64_t i = 0; i < n && i < 10; i++) fprintf(f, "%s%.6g", i ? ", " : "", dg_tensor_get_as_double(t, i));
    fprintf(f, "%s]", n > 10 ? ", ..." : "");
}

static bool log_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    log_hook *h = ctx;
    h->iter++;
    if (n == 0) return true;   // not a logging run (runs of several threads may interleave)
    FILE *f = h->out ? h->out : stdout;
    char buf[256];
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s%s = ", i ? ", " : "", dg_output_str(h->tensors[i], buf, sizeof buf));
        print_value(f, values[i]);
    }
    fputc('\n', f);
    fflush(f);
    return true;
}

dg_session_hook *dg_logging_tensor_hook_new(const dg_output *tensors, int n, int64_t every_n_iter, FILE *out,
                                            dg_status *st) {
    dg_status_reset(st);
    if (n < 1 || !tensors || every_n_iter < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "logging hook: need at least one tensor (got %d) and every_n_iter "
                       ">= 1 (got %lld)", n, (long long)every_n_iter);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!tensors[i].node) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "logging hook: tensor %d is the null output", i);
            return NULL;
        }
    log_hook *c = calloc(1, sizeof *c);
    if (!c || !(c->tensors = malloc((size_t)n * sizeof *c->tensors))) {
        free(c);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "logging hook: out of memory");
        return NULL;
    }
    memcpy(c->tensors, tensors, (size_t)n * sizeof *tensors);
    c->n = n;
    c->every = every_n_iter;
    c->out = out;
    dg_session_hook *h = training_new_hook("logging_tensor", c, log_free, st);
    if (!h) return NULL;
    h->before_run = log_before_run;
    h->after_run = log_after_run;
    return h;
}

// ---- NaN guard ----
typedef struct nan_hook {
    dg_output loss;
    bool fail;
    int64_t iter;
} nan_hook;

static bool nan_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    nan_hook *h = ctx;
    args->fetches = &h->loss;
    args->n_fetches = 1;
    return true;
}

static bool nan_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    nan_hook *h = ctx;
    h->iter++;
    bool nan = false;
    for (int64_t i = 0; i < dg_tensor_num_elements(values[0]) && !nan; i++)
        nan = isnan(dg_tensor_get_as_double(values[0], i));
    if (!nan) return true;
    char buf[256];
    dg_output_str(h->loss, buf, sizeof buf);
    if (h->fail) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "NaN loss during training: tensor \"%s\" is NaN (run %lld of this "
                       "process)", buf, (long long)h->iter);
        return false;
    }
    fprintf(stderr, "NaN guard: loss tensor \"%s\" is NaN (run %lld of this process); requesting a stop\n", buf,
            (long long)h->iter);
    dg_monitored_session_request_stop(rc->session);
    return true;
}

dg_session_hook *dg_nan_guard_hook_new(dg_output loss, bool fail_on_nan, dg_status *st) {
    dg_status_reset(st);
    if (!loss.node || !dg_dtype_is_float(dg_output_dtype(loss))) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "NaN guard hook: the loss must be a floating-point output");
        return NULL;
    }
    nan_hook *c = calloc(1, sizeof *c);
    if (!c) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "NaN guard hook: out of memory");
        return NULL;
    }
    c->loss = loss;
    c->fail = fail_on_nan;
    dg_session_hook *h = training_new_hook("nan_guard", c, free, st);
    if (!h) return NULL;
    h->before_run = nan_before_run;
    h->after_run = nan_after_run;
    return h;
}

// ---- summary saver ----
// Rows go into the checkpoint file through a checkpoint store of the hook's own (the file's
// schema, the summaries table included, belongs to checkpoint.c); checkpoint saves never touch
// them.
typedef struct summary_hook {
    char *path;              // the checkpoint file (summaries table), or NULL
    char *logdir;            // TensorBoard's log directory, or NULL
    dg_event_writer *events; // open while writing; NULL after a write error (warned once)
    dg_graph *graph;         // written to the event file after the first run (placed)
    bool graph_written;
    int64_t every;
    int n;                   // tensors fetched for summaries: n_scalars scalars, then histograms
    int n_scalars;
    char **tags;
    dg_output *scalars;      // followed by the global step at index n in `fetch`
    dg_output *fetch;        // n scalars + the global step
    double *values;          // n_scalars: the scalars of the step being written
    dg_checkpoint_store *store;   // open from the first session's creation to the hook's end
    dg_output gs;
    int64_t last_step;       // step of the last write, -1 none
    int64_t next_step;       // guess of the step this run makes, -1 unknown
} summary_hook;

static void summary_free(void *ctx) {
    summary_hook *h = ctx;
    dg_checkpoint_store_free(&h->store);
    dg_event_writer_free(&h->events);
    free(h->logdir);
    for (int i = 0; i < h->n; i++) free(h->tags[i]);
    free(h->tags);
    free(h->fetch);
    free(h->values);
    free(h->path);
    free(h);
}

static bool summary_set_scalars(summary_hook *h, const char *const *tags, const dg_output *scalars, int n,
                                dg_status *st) {
    h->tags = calloc((size_t)n + 1, sizeof *h->tags);
    h->fetch = calloc((size_t)n + 1, sizeof *h->fetch);
    h->values = calloc((size_t)n + 1, sizeof *h->values);
    if (!h->tags || !h->fetch || !h->values) abort();
    h->n = n;
    for (int i = 0; i < n; i++) {
        if (!scalars[i].node) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "summary saver hook: scalar %d is the null output", i);
            return false;
        }
        dg_shape sh = dg_output_shape(scalars[i]);
        if (dg_shape_num_elements(&sh) != 1 || dg_output_dtype(scalars[i]) == DG_BOOL) {
            char b[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT, "summary saver hook: \"%s\" is not a numeric scalar (%s %s)",
                           dg_node_name(scalars[i].node), dg_dtype_name(dg_output_dtype(scalars[i])),
                           dg_shape_str(&sh, b, sizeof b));
            return false;
        }
        h->fetch[i] = scalars[i];
        if (!(h->tags[i] = strdup(tags ? tags[i] : dg_node_name(scalars[i].node)))) abort();
    }
    h->scalars = h->fetch;
    h->n_scalars = n;
    return true;
}

// TensorBoard: the DG_HISTOGRAM_SUMMARIES tensors (float, any shape) after the scalars.
static bool summary_add_histograms(summary_hook *h, dg_graph *g, dg_status *st) {
    int k = dg_graph_collection_size(g, DG_HISTOGRAM_SUMMARIES);
    if (k == 0) return true;
    char **tags = realloc(h->tags, ((size_t)h->n + (size_t)k + 1) * sizeof *tags);
    if (tags) h->tags = tags;
    dg_output *fetch = realloc(h->fetch, ((size_t)h->n + (size_t)k + 1) * sizeof *fetch);
    if (!tags || !fetch) abort();
    h->fetch = h->scalars = fetch;
    for (int i = 0; i < k; i++) {
        dg_output o = {dg_graph_collection_get(g, DG_HISTOGRAM_SUMMARIES, i), 0};
        if (!dg_dtype_is_float(dg_output_dtype(o))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "TensorBoard hook: histogram \"%s\" is %s, not a float tensor",
                           dg_node_name(o.node), dg_dtype_name(dg_output_dtype(o)));
            return false;
        }
        h->fetch[h->n] = o;
        if (!(h->tags[h->n++] = strdup(dg_node_name(o.node)))) abort();
    }
    return true;
}

static bool summary_begin(void *ctx, dg_graph *g, dg_status *st) {
    summary_hook *h = ctx;
    h->graph = g;
    if (!find_global_step(g, h->logdir ? "the TensorBoard hook" : "the summary saver hook", &h->gs, st)) return false;
    if (!h->fetch) {   // the DG_SUMMARIES collection, as it is now
        int n = dg_graph_collection_size(g, DG_SUMMARIES);
        dg_output *outs = calloc((size_t)n + 1, sizeof *outs);
        if (!outs) abort();
        for (int i = 0; i < n; i++) outs[i] = (dg_output){dg_graph_collection_get(g, DG_SUMMARIES, i), 0};
        bool ok = summary_set_scalars(h, NULL, outs, n, st);
        free(outs);
        if (!ok) return false;
    }
    if (h->logdir && !summary_add_histograms(h, g, st)) return false;
    h->fetch[h->n] = h->gs;
    return true;
}

static bool summary_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    summary_hook *h = ctx;
    h->next_step = -1;
    if (h->logdir) {   // one file for the hook's life: recoveries keep appending to it
        if (!h->events && !h->graph_written && !(h->events = dg_event_writer_new(h->logdir, st))) {
            dg_status_prepend(st, "TensorBoard hook");
            return false;
        }
        return true;
    }
    if (h->store) return true;
    // Created with its checkpoint schema when missing, so the file is a checkpoint file; the
    // summaries table comes with the first write.
    if (!(h->store = dg_checkpoint_store_new(h->path, true, st))) {
        dg_status_prepend(st, "summary saver hook");
        return false;
    }
    return true;
}

static bool summary_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    summary_hook *h = ctx;
    bool requested = h->n > 0 && (!h->logdir || h->events) && (h->last_step < 0 || h->next_step < 0 || h->next_step >= h->last_step + h->every);
    args->fetches = requested ? h->fetch : &h->fetch[h->n];
    args->n_fetches = requested ? h->n + 1 : 1;
    return true;
}

static bool summary_write(summary_hook *h, int64_t step, dg_tensor *const *values, dg_status *st) {
    for (int i = 0; i < h->n_scalars; i++) h->values[i] = dg_tensor_get_as_double(values[i], 0);
    if (!dg_checkpoint_store_add_summaries(h->store, step, (const char *const *)h->tags, h->values, h->n_scalars,
                                           training_wall_s(), st)) {
        dg_status_prepend(st, "summary saver hook");
        return false;
    }
    h->last_step = step;
    return true;
}

// An event file that cannot be written (a full disk) costs the run nothing: one warning, and
// the hook stops writing. Training goes on.
static void events_failed(summary_hook *h, const dg_status *why) {
    fprintf(stderr, "distgraph: TensorBoard hook: %s; no more events are written, training goes on\n",
            dg_status_message(why));
    dg_event_writer_free(&h->events);
}

static void events_write(summary_hook *h, int64_t step, dg_tensor *const *values, int n) {
    dg_status *st = dg_status_new();
    if (!h->graph_written) {   // after the first run the graph's nodes carry their devices
        h->graph_written = true;
        if (!dg_event_writer_add_graph(h->events, h->graph, step, st)) goto fail;
    }
    for (int i = 0; n > 1 && i < h->n_scalars; i++)
        if (!dg_event_writer_add_scalar(h->events, h->tags[i], step, dg_tensor_get_as_double(values[i], 0), st))
            goto fail;
    for (int i = h->n_scalars; n > 1 && i < h->n; i++) {
        int64_t k = dg_tensor_num_elements(values[i]);
        double *v = malloc(((size_t)k + 1) * sizeof *v);
        if (!v) abort();
        for (int64_t j = 0; j < k; j++) v[j] = dg_tensor_get_as_double(values[i], j);
        bool ok = dg_event_writer_add_histogram(h->events, h->tags[i], step, v, k, st);
        free(v);
        if (!ok) goto fail;
    }
    if (n > 1) h->last_step = step;
    dg_status_free(&st);
    return;
fail:
    events_failed(h, st);
    dg_status_free(&st);
}

static bool summary_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    summary_hook *h = ctx;
    int64_t step = dg_tensor_i64(values[n - 1])[0];
    h->next_step = step + 1;
    if (h->logdir) {
        if (h->events) events_write(h, step, values, n);
        return true;
    }
    if (n == 1) return true;   // only the step was fetched
    return summary_write(h, step, values, st);
}

static bool summary_end(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    summary_hook *h = ctx;
    dg_status *fst = dg_status_new();
    if (h->events && !dg_event_writer_flush(h->events, fst)) events_failed(h, fst);
    dg_status_free(&fst);
    return true;
}

// Both summary hooks: to the checkpoint file at path (tensorboard false) or to event files in
// the log directory path (tensorboard true).
static dg_session_hook *summary_hook_new(bool tensorboard, const char *path, int64_t save_steps,
                                         const char *const *tags, const dg_output *scalars, int n, dg_status *st) {
    const char *what = tensorboard ? "TensorBoard hook" : "summary saver hook";
    dg_status_reset(st);
    if (!path || !*path || save_steps < 1 || n < 0 || (n > 0 && !scalars)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: need a %s, save_steps >= 1 (got %lld) and n >= 0 scalars (got %d)",
                       what, tensorboard ? "log directory" : "path", (long long)save_steps, n);
        return NULL;
    }
    summary_hook *c = calloc(1, sizeof *c);
    char *copy = c ? strdup(path) : NULL;
    if (!copy) {
        free(c);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s: out of memory", what);
        return NULL;
    }
    if (tensorboard)
        c->logdir = copy;
    else
        c->path = copy;
    c->every = save_steps;
    c->last_step = -1;
    c->next_step = -1;
    if (n > 0 && !summary_set_scalars(c, tags, scalars, n, st)) {
        summary_free(c);
        return NULL;
    }
    dg_session_hook *h = training_new_hook(tensorboard ? "tensorboard" : "summary_saver", c, summary_free, st);
    if (!h) return NULL;
    h->begin = summary_begin;
    h->after_create_session = summary_after_create;
    h->before_run = summary_before_run;
    h->after_run = summary_after_run;
    if (tensorboard) h->end = summary_end;
    return h;
}

dg_session_hook *dg_summary_saver_hook_new(const char *path, int64_t save_steps, const char *const *tags,
                                           const dg_output *scalars, int n, dg_status *st) {
    return summary_hook_new(false, path, save_steps, tags, scalars, n, st);
}

dg_session_hook *dg_tensorboard_hook_new(const char *logdir, int64_t save_steps, const char *const *tags,
                                         const dg_output *scalars, int n, dg_status *st) {
    return summary_hook_new(true, logdir, save_steps, tags, scalars, n, st);
}

// ---- final ops ----
typedef struct final_hook {
    dg_output *fetches;
    int n_fetches;
    dg_node **targets;
    int n_targets;
    dg_tensor **values;   // n_fetches, set at end
} final_hook;

static void final_free(void *ctx) {
    final_hook *h = ctx;
    for (int i = 0; i < h->n_fetches; i++) dg_tensor_unref(h->values[i]);
    free(h->values);
    free(h->fetches);
    free(h->targets);
    free(h);
}

static bool final_end(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    final_hook *h = ctx;
    dg_tensor **vals = calloc((size_t)h->n_fetches + 1, sizeof *vals);
    if (!vals) abort();
    if (!dg_session_run(sess, NULL, NULL, 0, h->fetches, vals, h->n_fetches, h->targets, h->n_targets, st)) {
        free(vals);
        return false;
    }
    for (int i = 0; i < h->n_fetches; i++) {
        dg_tensor_unref(h->values[i]);
        h->values[i] = vals[i];
    }
    free(vals);
    return true;
}

dg_session_hook *dg_final_ops_hook_new(const dg_output *fetches, int n_fetches, dg_node *const *targets,
                                       int n_targets, dg_status *st) {
    dg_status_reset(st);
    if (n_fetches < 0 || n_targets < 0 || (n_fetches && !fetches) || (n_targets && !targets) ||
        n_fetches + n_targets == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "final ops hook: need at least one fetch or target");
        return NULL;
    }
    final_hook *c = calloc(1, sizeof *c);
    if (c) {
        c->fetches = calloc((size_t)n_fetches + 1, sizeof *c->fetches);
        c->values = calloc((size_t)n_fetches + 1, sizeof *c->values);
        c->targets = calloc((size_t)n_targets + 1, sizeof *c->targets);
    }
    if (!c || !c->fetches || !c->values || !c->targets) {
        if (c) final_free(c);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "final ops hook: out of memory");
        return NULL;
    }
    if (n_fetches) memcpy(c->fetches, fetches, (size_t)n_fetches * sizeof *fetches);
    if (n_targets) memcpy(c->targets, targets, (size_t)n_targets * sizeof *targets);
    c->n_fetches = n_fetches;
    c->n_targets = n_targets;
    dg_session_hook *h = training_new_hook("final_ops", c, final_free, st);
    if (!h) return NULL;
    h->end = final_end;
    return h;
}

dg_tensor *dg_final_ops_hook_value(const dg_session_hook *h, int i) {
    if (!h || h->end != final_end) return NULL;
    const final_hook *c = h->ctx;
    return i >= 0 && i < c->n_fetches ? c->values[i] : NULL;
}
