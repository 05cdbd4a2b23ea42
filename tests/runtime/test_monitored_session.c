/* The monitored training session: initialization vs restore, stopping, checkpoint cadence and
 * retention, hooks (order, extra feeds and fetches, NaN guard, logging, summaries, final ops),
 * restore errors, a non-chief waiting for a chief (in-process servers on 127.0.0.1), and
 * recovery when an in-process ps server is freed and recreated mid-training. */
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "distgraph/monitored_session.h"


static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// ---- a toy model: w += delta and global_step += 1 per train run; loss = log(w), computed
// before the update of the same run ----
typedef struct toy {
    dg_graph *g;
    dg_output w, gs, loss, p, p2;   // p: a placeholder, p2 = 2 * p
    dg_node *train;
} toy;

static void build_toy(toy *t, float delta, const char *ps_dev, const char *worker_dev) {
    t->g = dg_graph_new();
    if (ps_dev) dg_graph_push_device(t->g, ps_dev);
    t->w = dg_variable(t->g, "w", DG_FLOAT32, dg_shape1(2), dg_init_constant(1));
    t->gs = dg_global_step(t->g);
    if (ps_dev) dg_graph_pop_device(t->g);
    if (worker_dev) dg_graph_push_device(t->g, worker_dev);
    t->loss = dg_log(t->g, "loss", t->w);
    t->p = dg_placeholder(t->g, "p", DG_FLOAT32, dg_shape_scalar());
    t->p2 = dg_mul(t->g, "p2", t->p, dg_scalar(t->g, NULL, DG_FLOAT32, 2));
    float dv[2] = {delta, delta};
    dg_tensor *dt = dg_tensor_from_data(DG_FLOAT32, dg_shape1(2), dv, NULL);
    dg_output d = dg_const(t->g, "delta", dt);
    dg_tensor_unref(dt);
    dg_graph_push_control_deps(t->g, &t->loss.node, 1);
    dg_node *deps[2] = {dg_assign_add(t->g, "update_w", t->w, d).node,
                        dg_assign_add(t->g, "step", t->gs, dg_scalar(t->g, NULL, DG_INT64, 1)).node};
    t->train = dg_group(t->g, "train", deps, 2);
    dg_graph_pop_control_deps(t->g);
    if (worker_dev) dg_graph_pop_device(t->g);
    assert_ok(dg_graph_status(t->g));
}

static float fetch_w0(dg_monitored_session *ms, toy *t) {
    dg_status *st = dg_status_new();
    dg_tensor *v = NULL;
    assert_true(dg_session_run(dg_monitored_session_session(ms), NULL, NULL, 0, &t->w, &v, 1, NULL, 0, st));
    float r = dg_tensor_f32(v)[0];
    dg_tensor_unref(v);
    dg_status_free(&st);
    return r;
}

// Trains until should_stop; returns the number of runs.
static int train_until_stop(dg_monitored_session *ms, toy *t, dg_status *st) {
    int n = 0;
    while (!dg_monitored_session_should_stop(ms)) {
        if (!dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t->train, 1, st)) return -1;
        n++;
    }
    return n;
}

static int list_steps(const char *path, int64_t *steps, int cap) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, false, st);
    assert_ok(st);
    int64_t *all = NULL;
    int n = dg_checkpoint_list(s, &all, st);
    assert_ok(st);
    for (int i = 0; i < n && i < cap; i++) steps[i] = all[i];
    free(all);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return n;
}

// ---- initialization, then restore ----
static void test_init_then_restore(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    dg_status *st = dg_status_new();
    toy a;
    build_toy(&a, 0.5f, NULL, NULL);
    dg_session_hook *stop = dg_stop_at_step_hook_new(-1, 5, st);
    assert_ok(st);
    dg_mts_options o = dg_mts_options_default();
    o.checkpoint_path = tp.path;
    o.hooks = &stop;
    o.n_hooks = 1;
    dg_monitored_session *ms = dg_monitored_session_new(a.g, &o, st);
    assert_ok(st);
    assert_int_equal(dg_monitored_session_restored_step(ms), -1);
    assert_true(dg_monitored_session_is_chief(ms));
    assert_int_equal(train_until_stop(ms, &a, st), 5);
    assert_ok(st);
    assert_int_equal(dg_monitored_session_global_step(ms, st), 5);
    assert_close(fetch_w0(ms, &a), 3.5, 1e-6, 0);
    assert_true(dg_monitored_session_close(ms, st));
    assert_ok(st);
    assert_null(dg_monitored_session_session(ms));
    assert_false(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &a.train, 1, st));
    assert_status(st, DG_FAILED_PRECONDITION, "closed");
    dg_status_reset(st);
    dg_monitored_session_free(&ms);
    int64_t steps[8];
    assert_int_equal(list_steps(tp.path, steps, 8), 2);   // at creation and at the end
    assert_int_equal(steps[0], 0);
    assert_int_equal(steps[1], 5);

    // A new graph of the same model restores step 5; the stop hook stops it at once.
    toy b;
    build_toy(&b, 0.5f, NULL, NULL);
    dg_monitored_session *mb = dg_monitored_session_new(b.g, &o, st);
    assert_ok(st);
    assert_int_equal(dg_monitored_session_restored_step(mb), 5);
    assert_int_equal(dg_monitored_session_global_step(mb, st), 5);
    assert_close(fetch_w0(mb, &b), 3.5, 1e-6, 0);
    assert_true(dg_monitored_session_should_stop(mb));
    dg_monitored_session_free(&mb);
    dg_graph_free(&b.g);

    // Without the stop hook it trains on from 5.
    toy c;
    build_toy(&c, 0.5f, NULL, NULL);
    o.hooks = NULL;
    o.n_hooks = 0;
    dg_monitored_session *mc = dg_monitored_session_new(c.g, &o, st);
    assert_ok(st);
    assert_false(dg_monitored_session_should_stop(mc));
    assert_true(dg_monitored_session_run(mc, NULL, NULL, 0, NULL, NULL, 0, &c.train, 1, st));
    assert_int_equal(dg_monitored_session_global_step(mc, st), 6);
    dg_monitored_session_free(&mc);
    dg_graph_free(&c.g);

    dg_session_hook_free(&stop);
    dg_graph_free(&a.g);
    dg_status_free(&st);
    dg_test_tmpdir_remove(&tp);
}

// ---- roles apart from is_chief ----
// Opens a monitored session of a new toy model with o, runs `runs` steps, frees it; returns
// the step it restored (-1: it initialized) and writes w[0] as it ended.
static int64_t session_with_roles(const dg_mts_options *o, int runs, float *w0) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 0.5f, NULL, NULL);
    dg_monitored_session *ms = dg_monitored_session_new(t.g, o, st);
    assert_ok(st);
    int64_t restored = dg_monitored_session_restored_step(ms);
    for (int i = 0; i < runs; i++) assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    *w0 = fetch_w0(ms, &t);
    assert_true(dg_monitored_session_close(ms, st));
    dg_monitored_session_free(&ms);
    dg_graph_free(&t.g);
    dg_status_free(&st);
    return restored;
}

// Initializing, restoring and saving are separate roles: a non-chief that initializes (an
// all-reduce worker), a chief that neither restores nor saves, a non-chief that restores.
static void test_roles_apart(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    float w0;
    int64_t steps[8];
    dg_mts_options o = dg_mts_options_default();
    o.checkpoint_path = tp.path;
    assert_int_equal(session_with_roles(&o, 2, &w0), -1);   // the chief: initializes, saves 0 and 2
    assert_int_equal(list_steps(tp.path, steps, 8), 2);
    o.is_chief = false;
    o.wait_for_chief_ms = 0;
    o.init_variables = DG_ROLE_YES;   // restore and save follow is_chief: no
    assert_int_equal(session_with_roles(&o, 3, &w0), -1);
    assert_close(w0, 2.5, 1e-6, 0);   // initialized to 1, three steps of 0.5
    assert_int_equal(list_steps(tp.path, steps, 8), 2);   // it saved nothing
    o.restore = DG_ROLE_YES;
    assert_int_equal(session_with_roles(&o, 1, &w0), 2);   // restores step 2 (w 2), one step
    assert_close(w0, 2.5, 1e-6, 0);
    o.is_chief = true;
    o.init_variables = DG_ROLE_DEFAULT;
    o.restore = DG_ROLE_NO;
    o.save_checkpoints = DG_ROLE_NO;
    assert_int_equal(session_with_roles(&o, 1, &w0), -1);   // a chief that starts afresh
    assert_close(w0, 1.5, 1e-6, 0);
    assert_int_equal(list_steps(tp.path, steps, 8), 2);
    assert_int_equal(steps[1], 2);
    o.write_summaries = (dg_role)7;
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 0.5f, NULL, NULL);
    assert_null(dg_monitored_session_new(t.g, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "write_summaries is 7, not DG_ROLE_DEFAULT, DG_ROLE_YES or DG_ROLE_NO");
    dg_status_reset(st);
    // An all-reduce graph's non-chief left to wait: refused at once, naming the fix.
    dg_collective_group grp = dg_collective_group_make("worker", 2);
    dg_output mean;
    assert_true(dg_collective_all_reduce(t.g, "ar", &t.loss, 1, &grp, DG_COLLECTIVE_KEY_AUTO, DG_REDUCE_MEAN, NULL, &mean));
    o = dg_mts_options_default();
    o.is_chief = false;
    assert_null(dg_monitored_session_new(t.g, &o, st));
    assert_status(st, DG_FAILED_PRECONDITION, "this graph all-reduces (node \"ar\")");
    assert_status(st, DG_FAILED_PRECONDITION, "init_variables = DG_ROLE_YES");
    dg_graph_free(&t.g);
    dg_status_free(&st);
    dg_test_tmpdir_remove(&tp);
}

// ---- stop at step ----
static void test_stop_at_step(void **state) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    dg_session_hook *h = dg_stop_at_step_hook_new(3, -1, st);
    assert_ok(st);
    dg_mts_options o = dg_mts_options_default();
    o.hooks = &h;
    o.n_hooks = 1;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_int_equal(train_until_stop(ms, &t, st), 3);
    assert_int_equal(dg_monitored_session_global_step(ms, st), 3);
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&h);
    dg_graph_free(&t.g);

    build_toy(&t, 1, NULL, NULL);
    h = dg_stop_at_step_hook_new(-1, 7, st);
    ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_int_equal(train_until_stop(ms, &t, st), 7);
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&h);
    dg_graph_free(&t.g);

    assert_null(dg_stop_at_step_hook_new(-1, -1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "exactly one of num_steps");
    dg_status_reset(st);
    assert_null(dg_stop_at_step_hook_new(3, 4, st));
    assert_status(st, DG_INVALID_ARGUMENT, "exactly one");
    dg_status_reset(st);

    // A graph without a global step.
    dg_graph *g = dg_graph_new();
    dg_variable(g, "v", DG_FLOAT32, dg_shape_scalar(), dg_init_zeros());
    h = dg_stop_at_step_hook_new(3, -1, st);
    ms = dg_monitored_session_new(g, &o, st);
    assert_null(ms);
    assert_status(st, DG_FAILED_PRECONDITION, "global step");
    assert_non_null(strstr(dg_status_message(st), "stop_at_step"));
    dg_session_hook_free(&h);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// ---- checkpoint cadence and retention ----
static void run_saving(const char *path, int64_t save_steps, int max_to_keep, int64_t last_step) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    dg_session_hook *h = dg_stop_at_step_hook_new(-1, last_step, st);
    dg_mts_options o = dg_mts_options_default();
    o.checkpoint_path = path;
    o.save_checkpoint_steps = save_steps;
    o.max_to_keep = max_to_keep;
    o.hooks = &h;
    o.n_hooks = 1;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_int_equal(train_until_stop(ms, &t, st), (int)last_step);
    assert_true(dg_monitored_session_close(ms, st));
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&h);
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

static void test_save_every_n_steps_and_at_end(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    run_saving(tp.path, 3, 0, 10);
    int64_t steps[16];
    int n = list_steps(tp.path, steps, 16);
    int64_t want[] = {0, 3, 6, 9, 10};
    assert_int_equal(n, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(steps[i], want[i]);
    dg_test_tmpdir_remove(&tp);
}

static void test_max_to_keep(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    run_saving(tp.path, 3, 2, 10);
    int64_t steps[16];
    assert_int_equal(list_steps(tp.path, steps, 16), 2);
    assert_int_equal(steps[0], 9);
    assert_int_equal(steps[1], 10);
    dg_test_tmpdir_remove(&tp);
}

// The checkpoint of a non-chief is not written, and a non-chief never opens the file.
static void test_saver_api(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    dg_saver *sv = dg_saver_new(t.g, st);
    assert_ok(st);
    assert_int_equal(dg_saver_num_variables(sv), 2);
    assert_string_equal(dg_saver_variable_name(sv, 0), "w");
    assert_non_null(dg_graph_find(t.g, "save/restore_w"));
    assert_non_null(dg_graph_find(t.g, "save/restore_w/value"));
    assert_non_null(dg_graph_find(t.g, "save/restore_all"));
    assert_string_equal(dg_node_op_type(dg_graph_find(t.g, "save/restore_global_step")), "Assign");
    dg_session *s = dg_session_new(t.g, "local", NULL, st);
    dg_checkpoint_store *store = dg_checkpoint_store_new(tp.path, true, st);
    assert_ok(st);
    assert_false(dg_saver_restore(sv, s, store, -1, NULL, st));
    assert_status(st, DG_NOT_FOUND, "no checkpoint");
    dg_status_reset(st);
    // Saving needs the variables initialized.
    assert_false(dg_saver_save(sv, s, store, -1, 0, NULL, st));
    assert_status(st, DG_FAILED_PRECONDITION, "uninitialized");
    dg_status_reset(st);
    assert_true(dg_session_run_target(s, dg_global_variables_initializer(t.g), st));
    int64_t step = -1;
    assert_true(dg_saver_save(sv, s, store, 42, 0, &step, st));
    assert_int_equal(step, 42);
    assert_true(dg_session_run_target(s, t.train, st));
    assert_true(dg_saver_restore(sv, s, store, -1, &step, st));
    assert_int_equal(step, 42);
    dg_tensor *v = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &t.gs, &v, 1, NULL, 0, st));
    assert_int_equal(dg_tensor_i64(v)[0], 0);
    dg_tensor_unref(v);
    dg_checkpoint_store_free(&store);
    dg_session_free(&s);
    dg_saver_free(&sv);
    dg_saver_free(&sv);
    dg_graph_free(&t.g);

    dg_graph *g = dg_graph_new();
    assert_null(dg_saver_new(g, st));
    assert_status(st, DG_FAILED_PRECONDITION, "no variables");
    dg_graph_free(&g);
    dg_status_free(&st);
    dg_test_tmpdir_remove(&tp);
}

// ---- restore errors ----
static dg_graph *vars_graph(const char *const *names, const dg_dtype *types, const int64_t *dims, int n) {
    dg_graph *g = dg_graph_new();
    for (int i = 0; i < n; i++) dg_variable(g, names[i], types[i], dg_shape1(dims[i]), dg_init_zeros());
    dg_global_step(g);
    assert_ok(dg_graph_status(g));
    return g;
}

static void test_restore_errors(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    dg_status *st = dg_status_new();
    const char *n1[] = {"a", "b", "c"};
    dg_dtype t1[] = {DG_FLOAT32, DG_FLOAT32, DG_FLOAT32};
    int64_t d1[] = {2, 3, 2};
    dg_graph *g1 = vars_graph(n1, t1, d1, 3);
    dg_mts_options o = dg_mts_options_default();
    o.checkpoint_path = tp.path;
    dg_monitored_session *ms = dg_monitored_session_new(g1, &o, st);   // saves step 0
    assert_ok(st);
    dg_monitored_session_free(&ms);

    // a: other shape; c: other dtype; d: missing from the checkpoint; b: not in the graph.
    const char *n2[] = {"a", "c", "d"};
    dg_dtype t2[] = {DG_FLOAT32, DG_FLOAT64, DG_FLOAT32};
    int64_t d2[] = {3, 2, 1};
    dg_graph *g2 = vars_graph(n2, t2, d2, 3);
    ms = dg_monitored_session_new(g2, &o, st);
    assert_null(ms);
    assert_status(st, DG_INVALID_ARGUMENT, "missing from the checkpoint: d");
    const char *msg = dg_status_message(st);
    assert_non_null(strstr(msg, "in the checkpoint but not in the graph: b"));
    assert_non_null(strstr(msg, "a (graph float32 [3], checkpoint float32 [2])"));
    assert_non_null(strstr(msg, "c (graph float64 [2], checkpoint float32 [2])"));
    assert_non_null(strstr(msg, tp.path));
    assert_non_null(strstr(msg, "step 0"));
    dg_status_reset(st);

    // Only missing variables.
    const char *n3[] = {"a", "b", "c", "e"};
    dg_dtype t3[] = {DG_FLOAT32, DG_FLOAT32, DG_FLOAT32, DG_INT32};
    int64_t d3[] = {2, 3, 2, 4};
    dg_graph *g3 = vars_graph(n3, t3, d3, 4);
    ms = dg_monitored_session_new(g3, &o, st);
    assert_null(ms);
    assert_status(st, DG_INVALID_ARGUMENT, "missing from the checkpoint: e");
    assert_null(strstr(dg_status_message(st), "not in the graph"));
    dg_status_reset(st);

    // A file that is not a checkpoint (the old -wal/-shm files go with the old database).
    unlink(tp.path);
    char p[160];
    snprintf(p, sizeof p, "%s-wal", tp.path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", tp.path);
    unlink(p);
    FILE *f = fopen(tp.path, "w");
    fputs("not a database, just text that is long enough to be read as a header ............", f);
    fclose(f);
    ms = dg_monitored_session_new(g1, &o, st);
    assert_null(ms);
    assert_true(dg_status_code(st) == DG_DATA_LOSS || dg_status_code(st) == DG_FAILED_PRECONDITION);
    assert_non_null(strstr(dg_status_message(st), tp.path));
    dg_graph_free(&g1);
    dg_graph_free(&g2);
    dg_graph_free(&g3);
    dg_status_free(&st);
    dg_test_tmpdir_remove(&tp);
}

// ---- NaN guard ----
static void test_nan_guard(void **state) {
    dg_status *st = dg_status_new();
    for (int fail = 1; fail >= 0; fail--) {
        toy t;
        build_toy(&t, -0.5f, NULL, NULL);   // w: 1, 0.5, 0, -0.5 -> log is NaN on run 4
        dg_session_hook *h = dg_nan_guard_hook_new(t.loss, fail, st);
        assert_ok(st);
        dg_mts_options o = dg_mts_options_default();
        o.hooks = &h;
        o.n_hooks = 1;
        dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
        assert_ok(st);
        for (int i = 0; i < 3; i++) assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
        assert_false(dg_monitored_session_should_stop(ms));
        bool ok = dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st);
        if (fail) {
            assert_false(ok);
            assert_status(st, DG_INVALID_ARGUMENT, "tensor \"loss\" is NaN");
            assert_non_null(strstr(dg_status_message(st), "NaN loss during training"));
            dg_status_reset(st);
        } else {
            assert_true(ok);
        }
        assert_true(dg_monitored_session_should_stop(ms));
        assert_true(dg_monitored_session_close(ms, st));
        dg_monitored_session_free(&ms);
        dg_session_hook_free(&h);
        dg_graph_free(&t.g);
    }
    assert_null(dg_nan_guard_hook_new((dg_output){NULL, 0}, true, st));
    assert_status(st, DG_INVALID_ARGUMENT, "floating-point");
    dg_status_free(&st);
}

// ---- hook order, extra feeds and fetches ----
typedef struct recorder {
    char log[2048];
} recorder;

typedef struct rec_hook {
    const char *name;
    recorder *r;
    dg_output fetches[2];
    int n_fetches;
    dg_output feed;
    dg_tensor *feed_value;   // NULL: feeds nothing
    double seen[2];          // values of the fetches at the last after_run
    bool fail_after_run;
} rec_hook;

static void rec(rec_hook *h, const char *what) {
    size_t len = strlen(h->r->log);
    snprintf(h->r->log + len, sizeof h->r->log - len, "%s%s.%s", len ? " " : "", h->name, what);
}

static bool rec_begin(void *ctx, dg_graph *g, dg_status *st) {
    rec(ctx, "begin");
    return true;
}
static bool rec_create(void *ctx, dg_monitored_session *ms, dg_session *s, dg_status *st) {
    rec(ctx, "create");
    return true;
}
static bool rec_before(void *ctx, const dg_run_context *rc, dg_hook_run_args *a, dg_status *st) {
    rec_hook *h = ctx;
    rec(h, "before");
    a->fetches = h->fetches;
    a->n_fetches = h->n_fetches;
    if (h->feed_value) {
        a->feeds = &h->feed;
        a->feed_values = &h->feed_value;
        a->n_feeds = 1;
    }
    return true;
}
static bool rec_after(void *ctx, const dg_run_context *rc, dg_tensor *const *v, int n, dg_status *st) {
    rec_hook *h = ctx;
    rec(h, "after");
    assert_int_equal(n, h->n_fetches);
    for (int i = 0; i < n; i++) h->seen[i] = dg_tensor_get_as_double(v[i], 0);
    if (h->fail_after_run) {
        dg_status_set(st, DG_INTERNAL, "recorder refuses");
        return false;
    }
    return true;
}
static bool rec_end(void *ctx, dg_monitored_session *ms, dg_session *s, dg_status *st) {
    rec(ctx, "end");
    return true;
}

static dg_session_hook rec_make(rec_hook *h) {
    dg_session_hook k = {.name = h->name, .ctx = h, .begin = rec_begin, .after_create_session = rec_create,
                         .before_run = rec_before, .after_run = rec_after, .end = rec_end};
    return k;
}

static void test_hooks_order_and_extra_fetches(void **state) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    recorder r = {""};
    dg_tensor *three = dg_tensor_scalar_f32(3);
    rec_hook a = {"A", &r, {t.w, t.gs}, 2, {0}, NULL, {0}, false};
    rec_hook b = {"B", &r, {t.gs, t.p2}, 2, t.p, three, {0}, false};
    dg_session_hook ha = rec_make(&a), hb = rec_make(&b);
    dg_session_hook *hooks[2] = {&ha, &hb};
    dg_mts_options o = dg_mts_options_default();
    o.hooks = hooks;
    o.n_hooks = 2;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_string_equal(r.log, "A.begin B.begin A.create B.create");
    r.log[0] = 0;
    for (int i = 0; i < 2; i++) {
        dg_tensor *gs = NULL;
        assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, &t.gs, &gs, 1, &t.train, 1, st));
        assert_ok(st);
        assert_int_equal(dg_tensor_i64(gs)[0], i + 1);
        dg_tensor_unref(gs);
    }
    assert_string_equal(r.log, "A.before B.before A.after B.after A.before B.before A.after B.after");
    assert_true(a.seen[0] == 3.0 && a.seen[1] == 2.0);   // w after two steps of +1; the step
    assert_true(b.seen[0] == 2.0 && b.seen[1] == 6.0);   // p fed 3 by B: p2 = 6

    // A hook feeding what the caller feeds is an error naming it.
    dg_tensor *one = dg_tensor_scalar_f32(1);
    r.log[0] = 0;
    assert_false(dg_monitored_session_run(ms, &t.p, &one, 1, NULL, NULL, 0, &t.train, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "hook \"B\" feeds \"p\"");
    assert_true(dg_monitored_session_should_stop(ms));   // the last run failed
    dg_status_reset(st);
    assert_string_equal(r.log, "A.before B.before");

    // A failing run ends with the original message; a later good run clears the failure.
    b.feed_value = NULL;
    dg_tensor *bad = dg_tensor_scalar_i64(1);
    r.log[0] = 0;
    assert_false(dg_monitored_session_run(ms, &t.p, &bad, 1, NULL, NULL, 0, &t.train, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "feed for \"p:0\": expected float32, got int64");
    assert_int_equal(strncmp(dg_status_message(st), "feed for", 8), 0);
    assert_int_equal(dg_monitored_session_num_recoveries(ms), 0);
    dg_status_reset(st);
    b.n_fetches = 1;   // p2 needs p, which nobody feeds now
    assert_true(dg_monitored_session_run(ms, &t.p, &one, 1, NULL, NULL, 0, &t.train, 1, st));
    assert_false(dg_monitored_session_should_stop(ms));

    // A failing after_run fails the step, naming the hook.
    b.fail_after_run = true;
    assert_false(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    assert_status(st, DG_INTERNAL, "hook \"B\" after_run: recorder refuses");
    dg_status_reset(st);
    b.fail_after_run = false;
    assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    r.log[0] = 0;
    assert_true(dg_monitored_session_close(ms, st));
    assert_string_equal(r.log, "A.end B.end");
    assert_true(dg_monitored_session_close(ms, st));   // twice: nothing more
    assert_string_equal(r.log, "A.end B.end");
    dg_monitored_session_free(&ms);

    // No end hooks when the last run failed.
    dg_graph_free(&t.g);
    build_toy(&t, 1, NULL, NULL);
    a.fetches[0] = t.w;
    a.fetches[1] = t.gs;
    ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_false(dg_monitored_session_run(ms, &t.p, &bad, 1, NULL, NULL, 0, &t.train, 1, st));
    dg_status_reset(st);
    r.log[0] = 0;
    assert_true(dg_monitored_session_close(ms, st));
    assert_string_equal(r.log, "");
    dg_monitored_session_free(&ms);

    dg_tensor_unref(bad);
    dg_tensor_unref(one);
    dg_tensor_unref(three);
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

// A stop hook listed before the hook that brings the global step (as a broadcast of rank 0's
// variables does) still reads the brought step: the setup hook's order runs it first. Rerunning
// a finished job then stops before its first run; taken in list order, the stop hook would read
// the fresh step 0 and train on.
static void test_setup_hooks_run_first(void **state) {
    dg_status *st = dg_status_new();
    for (int order_field = 0; order_field < 2; order_field++) {
        toy t;
        build_toy(&t, 1, NULL, NULL);
        dg_node *bring = dg_assign(t.g, "bring_step", t.gs, dg_scalar(t.g, NULL, DG_INT64, 5)).node;
        dg_session_hook *stop = dg_stop_at_last_step_hook_new(5, st);
        dg_session_hook *setup = dg_broadcast_variables_hook_new(bring, st);
        assert_ok(st);
        assert_int_equal(setup->order, DG_HOOK_ORDER_SETUP);
        if (!order_field) setup->order = 0;   // as before the field: list order
        dg_session_hook *hooks[2] = {stop, setup};
        dg_mts_options o = dg_mts_options_default();
        o.hooks = hooks;
        o.n_hooks = 2;
        dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
        assert_ok(st);
        assert_int_equal(dg_monitored_session_global_step(ms, st), 5);
        int runs = train_until_stop(ms, &t, st);
        assert_int_equal(runs, order_field ? 0 : 1);   // list order: one step past the end
        dg_monitored_session_free(&ms);
        dg_session_hook_free(&stop);
        dg_session_hook_free(&setup);
        dg_graph_free(&t.g);
    }
    // The constructors without a sentinel refuse negative steps.
    assert_null(dg_stop_at_last_step_hook_new(-1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "last_step -1 is negative");
    dg_status_reset(st);
    assert_null(dg_stop_after_steps_hook_new(-2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "num_steps -2 is negative");
    dg_status_reset(st);
    assert_null(dg_broadcast_variables_hook_new(NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "broadcast-variables hook: the op is NULL");
    dg_status_free(&st);
}

// Built-in and chief-only hooks come after the user's; a non-chief drops chief-only hooks.
static void test_hook_lists(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    recorder r = {""};
    rec_hook a = {"user", &r, {{0}}, 0, {0}, NULL, {0}, false};
    rec_hook c = {"chief", &r, {{0}}, 0, {0}, NULL, {0}, false};
    dg_session_hook ha = rec_make(&a), hc = rec_make(&c);
    dg_session_hook *user = &ha, *chief = &hc;
    FILE *out = tmpfile();
    dg_session_hook *logger = dg_logging_tensor_hook_new(&t.w, 1, 2, out, st);
    dg_session_hook *final = dg_final_ops_hook_new(&t.w, 1, NULL, 0, st);
    assert_ok(st);
    dg_session_hook *hooks[3] = {user, logger, final};
    dg_mts_options o = dg_mts_options_default();
    o.hooks = hooks;
    o.n_hooks = 3;
    o.chief_only_hooks = &chief;
    o.n_chief_only_hooks = 1;
    o.checkpoint_path = tp.path;
    o.log_step_count_steps = 2;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_string_equal(r.log, "user.begin chief.begin user.create chief.create");
    for (int i = 0; i < 5; i++) assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    assert_null(dg_final_ops_hook_value(final, 0));
    assert_true(dg_monitored_session_close(ms, st));
    assert_non_null(dg_final_ops_hook_value(final, 0));
    assert_true(dg_tensor_f32(dg_final_ops_hook_value(final, 0))[0] == 6.0f);
    dg_monitored_session_free(&ms);
    // The logger prints on runs 0, 2, 4 (values before... after each update), the step counter
    // every 2 global steps.
    rewind(out);
    char text[2048];
    size_t len = fread(text, 1, sizeof text - 1, out);
    text[len] = 0;
    fclose(out);
    assert_non_null(strstr(text, "w = [2, 2]"));
    assert_non_null(strstr(text, "w = [4, 4]"));
    assert_non_null(strstr(text, "w = [6, 6]"));
    assert_null(strstr(text, "w = [3, 3]"));
    dg_graph_free(&t.g);
    dg_test_tmpdir_remove(&tp);

    // Non-chief (local, so the variables are never ready): the chief-only hook is not used.
    build_toy(&t, 1, NULL, NULL);
    r.log[0] = 0;
    o.is_chief = false;
    o.checkpoint_path = NULL;
    o.n_hooks = 1;
    o.wait_for_chief_ms = 0;
    ms = dg_monitored_session_new(t.g, &o, st);
    assert_null(ms);
    assert_status(st, DG_DEADLINE_EXCEEDED, "waited 0 ms for the chief to initialize variables: w, global_step");
    assert_string_equal(r.log, "user.begin");
    dg_status_reset(st);
    dg_session_hook_free(&logger);
    dg_session_hook_free(&final);
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

// ---- summaries ----
static void test_summary_saver(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    // loss = log(w) is computed before the update of its run: at global step k, w = k.
    dg_output s = dg_sum(t.g, "loss_sum", t.loss, NULL, 0, false);
    dg_graph_add_to_collection(t.g, DG_SUMMARIES, s.node);
    // A NaN summary (log of w - 3 < 0 until w reaches 3) is stored as NULL, not an error.
    dg_output three = dg_scalar(t.g, "three", DG_FLOAT32, 3.0);
    dg_output nan_s = dg_sum(t.g, "nan_sum", dg_log(t.g, "nan_log", dg_sub(t.g, "w_minus_3", t.w, three)), NULL, 0, false);
    dg_graph_add_to_collection(t.g, DG_SUMMARIES, nan_s.node);
    dg_mts_options o = dg_mts_options_default();
    o.checkpoint_path = tp.path;
    o.save_summaries_steps = 2;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    for (int i = 0; i < 5; i++) assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    assert_true(dg_monitored_session_close(ms, st));
    dg_monitored_session_free(&ms);
    // The file is still a checkpoint file, with the summaries beside the checkpoints.
    int64_t steps[8];
    assert_int_equal(list_steps(tp.path, steps, 8), 2);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(tp.path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT step, tag, value, wall_time FROM summaries WHERE tag = 'loss_sum' "
                                        "ORDER BY step", -1, &q, NULL), SQLITE_OK);
    int n = 0;
    int64_t want[] = {1, 3, 5};
    while (sqlite3_step(q) == SQLITE_ROW) {
        assert_true(n < 3);
        assert_int_equal(sqlite3_column_int64(q, 0), want[n]);
        assert_string_equal((const char *)sqlite3_column_text(q, 1), "loss_sum");
        assert_close(sqlite3_column_double(q, 2), 2.0 * log((double)want[n]), 1e-5, 0);
        assert_true(sqlite3_column_double(q, 3) > 1.6e9);
        n++;
    }
    assert_int_equal(n, 3);
    sqlite3_finalize(q);
    // nan_sum at step k is 2 log(k - 3): NaN at step 1 (stored as NULL), -inf at step 3 and
    // log 4 at step 5 (stored as numbers).
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT step, value IS NULL FROM summaries WHERE tag = 'nan_sum' ORDER BY step",
                                        -1, &q, NULL), SQLITE_OK);
    int64_t want_nan[][2] = {{1, 1}, {3, 0}, {5, 0}};
    n = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        assert_true(n < 3);
        assert_int_equal(sqlite3_column_int64(q, 0), want_nan[n][0]);
        assert_int_equal(sqlite3_column_int(q, 1), (int)want_nan[n][1]);
        n++;
    }
    assert_int_equal(n, 3);
    sqlite3_finalize(q);
    sqlite3_close(db);
    dg_graph_free(&t.g);
    dg_status_free(&st);
    dg_test_tmpdir_remove(&tp);
}

// ---- several threads run one monitored session ----
typedef struct runner {
    dg_monitored_session *ms;
    toy *t;
    int runs;
    bool ok;
} runner;

static void *run_thread(void *arg) {
    runner *r = arg;
    dg_status *st = dg_status_new();
    r->ok = true;
    while (!dg_monitored_session_should_stop(r->ms)) {
        if (!dg_monitored_session_run(r->ms, NULL, NULL, 0, NULL, NULL, 0, &r->t->train, 1, st)) {
            // A run that starts after another thread's close began is refused.
            r->ok = dg_status_code(st) == DG_FAILED_PRECONDITION;
            break;
        }
        r->runs++;
    }
    dg_status_free(&st);
    return NULL;
}

static void test_concurrent_runs(void **state) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    dg_session_hook *h = dg_stop_at_step_hook_new(-1, 200, st);
    dg_mts_options o = dg_mts_options_default();
    o.hooks = &h;
    o.n_hooks = 1;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    runner r[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (runner){ms, &t, 0, false};
        pthread_create(&th[i], NULL, run_thread, &r[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    int total = 0;
    for (int i = 0; i < 4; i++) {
        assert_true(r[i].ok);
        total += r[i].runs;
    }
    int64_t gs = dg_monitored_session_global_step(ms, st);
    // Unlocked AssignAdds of concurrent steps may lose an increment, never add one.
    assert_true(gs >= 200 && gs <= total);
    assert_true(dg_monitored_session_close(ms, st));
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&h);
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

// close waits stop_grace_ms for a run of another thread, then gives up without closing; a
// later close, once the run has ended, closes.
typedef struct slow_hook {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool inside, release;
} slow_hook;

static bool slow_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *v, int n, dg_status *st) {
    slow_hook *h = ctx;
    pthread_mutex_lock(&h->mu);
    h->inside = true;
    pthread_cond_broadcast(&h->cv);
    while (!h->release) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return true;
}

static void *one_run(void *arg) {
    runner *r = arg;
    dg_status *st = dg_status_new();
    r->ok = dg_monitored_session_run(r->ms, NULL, NULL, 0, NULL, NULL, 0, &r->t->train, 1, st);
    dg_status_free(&st);
    return NULL;
}

static void test_close_grace(void **state) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    slow_hook sh = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    dg_session_hook h = {.name = "slow", .ctx = &sh, .after_run = slow_after_run};
    dg_session_hook *hp = &h;
    dg_session_hook *final = dg_final_ops_hook_new(&t.gs, 1, NULL, 0, st);
    dg_session_hook *hooks[2] = {hp, final};
    dg_mts_options o = dg_mts_options_default();
    o.hooks = hooks;
    o.n_hooks = 2;
    o.stop_grace_ms = 100;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    runner r = {ms, &t, 0, false};
    pthread_t th;
    pthread_create(&th, NULL, one_run, &r);
    pthread_mutex_lock(&sh.mu);
    while (!sh.inside) pthread_cond_wait(&sh.cv, &sh.mu);
    pthread_mutex_unlock(&sh.mu);
    int64_t t0 = now_ms();
    assert_false(dg_monitored_session_close(ms, st));
    assert_true(now_ms() - t0 >= 100);
    assert_status(st, DG_DEADLINE_EXCEEDED, "1 run(s) of other threads still in progress after the stop grace "
                  "period of 100 ms");
    dg_status_reset(st);
    assert_true(dg_monitored_session_should_stop(ms));
    assert_null(dg_final_ops_hook_value(final, 0));   // not closed: no end hooks yet
    pthread_mutex_lock(&sh.mu);
    sh.release = true;
    pthread_cond_broadcast(&sh.cv);
    pthread_mutex_unlock(&sh.mu);
    pthread_join(th, NULL);
    assert_true(r.ok);
    assert_true(dg_monitored_session_close(ms, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_i64(dg_final_ops_hook_value(final, 0))[0], 1);
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&final);
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

// ---- in-process clusters ----
// 1 ps + 2 workers on ports the kernel just handed out (fixed ranges can meet the ephemeral
// ports of other tests' connections).
static dg_cluster *cluster3(void) {
    char spec[256];
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|127.0.0.1:%d,127.0.0.1:%d", dg_test_free_port(),
             dg_test_free_port(), dg_test_free_port());
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_status_free(&st);
    return c;
}

static dg_server *start(dg_cluster *c, const char *job, int task, int64_t rpc_timeout_ms) {
    dg_status *st = dg_status_new();
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    so.rpc_timeout_ms = rpc_timeout_ms;
    dg_server *s = dg_server_new(c, job, task, &so, st);
    assert_ok(st);
    dg_status_free(&st);
    return s;
}

// A non-chief whose chief never comes fails after wait_for_chief_ms, naming the variables.
static void test_nonchief_times_out(void **state) {
    dg_status *st = dg_status_new();
    dg_cluster *c = cluster3();
    dg_server *ps = start(c, "ps", 0, 2000), *w1 = start(c, "worker", 1, 2000);
    toy t;
    build_toy(&t, 1, "/job:ps/task:0", "/job:worker/task:1");
    dg_mts_options o = dg_mts_options_default();
    o.master = dg_server_target(w1);
    o.is_chief = false;
    o.wait_for_chief_ms = 300;
    int64_t t0 = now_ms();
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    int64_t waited = now_ms() - t0;
    assert_null(ms);
    assert_status(st, DG_DEADLINE_EXCEEDED, "waited 300 ms for the chief to initialize variables: w, global_step");
    assert_null(strstr(dg_status_message(st), "init_variables"));   // a ps holds them: no all-reduce hint
    assert_true(waited >= 300 && waited < 5000);
    dg_graph_free(&t.g);
    dg_server_free(&w1);
    dg_server_free(&ps);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

typedef struct late_chief {
    dg_server *server;
    int64_t delay_ms;
    bool ok;
} late_chief;

static void *chief_thread(void *arg) {
    late_chief *lc = arg;
    usleep((useconds_t)lc->delay_ms * 1000);
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, "/job:ps/task:0", "/job:worker/task:0");
    dg_mts_options o = dg_mts_options_default();
    o.master = dg_server_target(lc->server);
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    lc->ok = ms && dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st);
    dg_monitored_session_free(&ms);
    dg_graph_free(&t.g);
    dg_status_free(&st);
    return NULL;
}

// A non-chief whose chief never comes says every 5 s what it waits for, before the deadline.
static void test_nonchief_says_what_it_waits_for(void **state) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);   // local: nobody ever initializes the variables
    FILE *log = tmpfile();
    dg_mts_options o = dg_mts_options_default();
    o.is_chief = false;
    o.wait_for_chief_ms = 5600;
    o.log = log;
    assert_null(dg_monitored_session_new(t.g, &o, st));
    assert_status(st, DG_DEADLINE_EXCEEDED, "waited 5600 ms for the chief to initialize variables: w, global_step");
    assert_status(st, DG_DEADLINE_EXCEEDED, "set dg_mts_options.init_variables = DG_ROLE_YES");   // no ps holds them
    rewind(log);
    char text[2048];
    size_t len = fread(text, 1, sizeof text - 1, log);
    text[len] = 0;
    fclose(log);
    print_message("%s", text);
    const char *line = strstr(text, ": waiting for the chief to initialize variables (5 s of 5 s): w, global_step\n");
    assert_non_null(line);
    assert_null(strstr(strchr(line, '\n'), "waiting for"));   // once in 5.6 s
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

// A non-chief started before the chief waits for it, then trains.
static void test_nonchief_waits_for_chief(void **state) {
    dg_status *st = dg_status_new();
    dg_cluster *c = cluster3();
    dg_server *ps = start(c, "ps", 0, 5000), *w0 = start(c, "worker", 0, 5000), *w1 = start(c, "worker", 1, 5000);
    late_chief lc = {w0, 400, false};
    pthread_t th;
    int64_t t0 = now_ms();
    pthread_create(&th, NULL, chief_thread, &lc);
    toy t;
    build_toy(&t, 1, "/job:ps/task:0", "/job:worker/task:1");
    dg_mts_options o = dg_mts_options_default();
    o.master = dg_server_target(w1);
    o.is_chief = false;
    o.wait_for_chief_ms = 20000;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_true(now_ms() - t0 >= 400);
    pthread_join(th, NULL);
    assert_true(lc.ok);
    assert_int_equal(dg_monitored_session_restored_step(ms), -1);
    assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    assert_ok(st);
    assert_int_equal(dg_monitored_session_global_step(ms, st), 2);
    dg_monitored_session_free(&ms);
    dg_graph_free(&t.g);
    dg_server_free(&w1);
    dg_server_free(&w0);
    dg_server_free(&ps);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

// The ps is freed and recreated on its port mid-training: the chief's next run fails, the
// session is recreated, the newest checkpoint restored, and training goes on to the last step.
static void test_recovery_after_ps_restart(void **state) {
    dg_test_tmpdir tp;
    dg_test_tmpdir_make(&tp, "dg_mts");
    dg_status *st = dg_status_new();
    dg_cluster *c = cluster3();
    dg_server *ps = start(c, "ps", 0, 1500), *w0 = start(c, "worker", 0, 1500);
    toy t;
    build_toy(&t, 0.5f, "/job:ps/task:0", "/job:worker/task:0");
    dg_session_hook *stop = dg_stop_at_step_hook_new(-1, 30, st);
    dg_mts_options o = dg_mts_options_default();
    o.master = dg_server_target(w0);
    o.checkpoint_path = tp.path;
    o.save_checkpoint_steps = 5;
    o.hooks = &stop;
    o.n_hooks = 1;
    o.max_recovery_attempts = 10;
    o.recovery_backoff_ms = 50;
    dg_monitored_session *ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    for (int i = 0; i < 12; i++) assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    assert_int_equal(dg_monitored_session_global_step(ms, st), 12);
    dg_server_free(&ps);
    ps = start(c, "ps", 0, 1500);   // a new incarnation: no variables, no graphs
    int runs = train_until_stop(ms, &t, st);
    assert_ok(st);
    assert_int_equal(runs, 20);   // from the checkpoint of step 10 to step 30
    assert_true(dg_monitored_session_num_recoveries(ms) >= 1);
    assert_int_equal(dg_monitored_session_restored_step(ms), 10);
    assert_int_equal(dg_monitored_session_global_step(ms, st), 30);
    assert_close(fetch_w0(ms, &t), 16.0, 1e-5, 0);   // 1 + 30 * 0.5
    assert_true(dg_monitored_session_close(ms, st));
    assert_ok(st);
    dg_monitored_session_free(&ms);
    int64_t steps[8];
    int n = list_steps(tp.path, steps, 8);
    assert_int_equal(steps[n - 1], 30);

    // The ps goes away for good: the run gives up after the attempts, UNAVAILABLE naming the ps.
    o.max_recovery_attempts = 2;
    dg_graph_free(&t.g);
    build_toy(&t, 0.5f, "/job:ps/task:0", "/job:worker/task:0");
    o.hooks = NULL;
    o.n_hooks = 0;
    ms = dg_monitored_session_new(t.g, &o, st);
    assert_ok(st);
    assert_int_equal(dg_monitored_session_restored_step(ms), 30);
    dg_server_free(&ps);
    assert_false(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &t.train, 1, st));
    assert_status(st, DG_UNAVAILABLE, "/job:ps/replica:0/task:0");
    assert_non_null(strstr(dg_status_message(st), "recovery: gave up after 2 attempts"));
    assert_true(dg_monitored_session_should_stop(ms));
    dg_status_reset(st);
    dg_monitored_session_free(&ms);

    dg_session_hook_free(&stop);
    dg_graph_free(&t.g);
    dg_server_free(&w0);
    dg_cluster_free(&c);
    dg_status_free(&st);
    dg_test_tmpdir_remove(&tp);
}

static void test_bad_options(void **state) {
    dg_status *st = dg_status_new();
    toy t;
    build_toy(&t, 1, NULL, NULL);
    dg_mts_options o = dg_mts_options_default();
    o.max_recovery_attempts = 0;
    assert_null(dg_monitored_session_new(t.g, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "max_recovery_attempts 0");
    dg_status_reset(st);
    o = dg_mts_options_default();
    o.master = "dg://127.0.0.1:1";   // a remote master nobody serves
    dg_session_options wo = dg_session_options_default();
    wo.wait_for_tasks_ms = 200;
    o.session_options = &wo;
    o.max_recovery_attempts = 2;
    assert_null(dg_monitored_session_new(t.g, &o, st));
    assert_status(st, DG_UNAVAILABLE, "the master at tcp://127.0.0.1:1 did not answer within 200 ms");
    dg_status_reset(st);
    assert_null(dg_monitored_session_new(NULL, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "graph is NULL");
    dg_monitored_session_free(NULL);
    dg_session_hook_free(NULL);
    dg_graph_free(&t.g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_then_restore),
        cmocka_unit_test(test_roles_apart),
        cmocka_unit_test(test_stop_at_step),
        cmocka_unit_test(test_save_every_n_steps_and_at_end),
        cmocka_unit_test(test_max_to_keep),
        cmocka_unit_test(test_saver_api),
        cmocka_unit_test(test_restore_errors),
        cmocka_unit_test(test_nan_guard),
        cmocka_unit_test(test_hooks_order_and_extra_fetches),
        cmocka_unit_test(test_hook_lists),
        cmocka_unit_test(test_setup_hooks_run_first),
        cmocka_unit_test(test_summary_saver),
        cmocka_unit_test(test_concurrent_runs),
        cmocka_unit_test(test_close_grace),
        cmocka_unit_test(test_nonchief_times_out),
        cmocka_unit_test(test_nonchief_says_what_it_waits_for),
        cmocka_unit_test(test_nonchief_waits_for_chief),
        cmocka_unit_test(test_recovery_after_ps_restart),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
