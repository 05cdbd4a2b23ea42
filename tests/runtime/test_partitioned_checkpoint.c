/* Checkpoints of partitioned variables (runtime/training/checkpoint.c's slices, the saver of
 * runtime/training/monitored_session.c), on real SQLite files in a temporary directory:
 * a monitored session saves a 2-part variable of known values, graphs of 3 parts, of none
 * and of 2 again restore it row for row (and save in turn); the store assembles any region
 * from slices of any boundaries (rows and columns); every error names the variable and the
 * file: rows no saved slice holds, another full shape or dtype, overlapping or disagreeing
 * slices in a damaged file, bad save arguments. Slice rows follow their tensors out when
 * checkpoints are pruned or replaced, also by a writer that knows nothing of slices, and
 * files without slices keep the schema of earlier releases. */
#include "testutil.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distgraph/monitored_session.h"
#include "graph_impl.h"

// ---- fixture: a temporary directory with ckpt.db in it ----
// A temporary directory, with path its ckpt.db (not created): testutil's fixture.
typedef dg_test_tmpdir fixture;

// ---- the variable "emb": float32 [rows, 3], element (r, c) = 10 r + c + 0.25 ----
static float emb_value(int64_t r, int64_t c) { return (float)(10 * r + c) + 0.25f; }

static dg_tensor *emb_rows(int64_t lo, int64_t hi, int64_t cols) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape2(hi - lo, cols), st);
    assert_ok(st);
    float *p = dg_tensor_f32(t);
    for (int64_t r = lo; r < hi; r++)
        for (int64_t c = 0; c < cols; c++) p[(r - lo) * cols + c] = emb_value(r, c);
    dg_status_free(&st);
    return t;
}

// Every element of t equals emb_value at rows from row0 on.
static void expect_emb_rows(const dg_tensor *t, int64_t row0) {
    assert_non_null(t);
    assert_int_equal(dg_tensor_dtype(t), DG_FLOAT32);
    int64_t cols = dg_tensor_dim(t, 1);
    const float *p = dg_tensor_f32(t);
    for (int64_t r = 0; r < dg_tensor_dim(t, 0); r++)
        for (int64_t c = 0; c < cols; c++)
            if (p[r * cols + c] != emb_value(row0 + r, c))
                fail_msg("row %lld col %lld: %g, expected %g", (long long)(row0 + r), (long long)c,
                         (double)p[r * cols + c], (double)emb_value(row0 + r, c));
}

// A model: the global step, "emb" [rows, 3] in n_parts parts (0: one plain variable) and a
// plain "bias" [3] of 0.5. set: assigns emb's known values to its parts; tick: adds 1 to the
// global step (the checkpoint saver saves at the end only when the step moved).
typedef struct model {
    dg_graph *g;
    dg_partitioned_variable emb;   // with n_parts 0: n = 1, parts[0] the plain variable
    dg_output bias;
    dg_node *set, *tick;
} model;

// With fn (a replica device setter), every node goes through it.
static void build_on(model *m, int n_parts, int64_t rows, dg_dtype dtype, dg_device_fn *fn) {
    m->g = dg_graph_new();
    if (fn) dg_graph_push_device_fn(m->g, fn);
    dg_output gs = dg_global_step(m->g);
    m->tick = dg_assign_add(m->g, "tick", gs, dg_scalar(m->g, NULL, DG_INT64, 1)).node;
    if (n_parts > 0) {
        m->emb = dg_partitioned_variable_new(m->g, "emb", dtype, dg_shape2(rows, 3), dg_init_zeros(),
                                             dg_fixed_size_partitioner(n_parts));
    } else {
        memset(&m->emb, 0, sizeof m->emb);
        m->emb.n = 1;
        m->emb.parts[0] = dg_variable(m->g, "emb", dtype, dg_shape2(rows, 3), dg_init_zeros());
        m->emb.offsets[1] = rows;
    }
    m->bias = dg_variable(m->g, "bias", DG_FLOAT32, dg_shape1(3), dg_init_constant(0.5));
    dg_node *assigns[DG_MAX_PARTITIONS];
    for (int i = 0; i < m->emb.n && dtype == DG_FLOAT32; i++) {
        dg_tensor *t = emb_rows(m->emb.offsets[i], m->emb.offsets[i + 1], 3);
        assigns[i] = dg_assign(m->g, NULL, m->emb.parts[i], dg_const(m->g, NULL, t)).node;
        dg_tensor_unref(t);
    }
    m->set = dtype == DG_FLOAT32 ? dg_group(m->g, "set_emb", assigns, m->emb.n) : NULL;
    if (fn) dg_graph_pop_device_fn(m->g);
    assert_ok(dg_graph_status(m->g));
}

static void build(model *m, int n_parts, int64_t rows, dg_dtype dtype) { build_on(m, n_parts, rows, dtype, NULL); }

static dg_mts_options options(const char *path) {
    dg_mts_options o = dg_mts_options_default();
    o.checkpoint_path = path;
    o.max_to_keep = 1;   // the slices table then holds the newest checkpoint's rows only
    return o;
}

// Fetches every part of emb through the monitored session and checks each row.
static void expect_emb(dg_monitored_session *ms, const model *m) {
    dg_status *st = dg_status_new();
    dg_tensor *v[DG_MAX_PARTITIONS + 1] = {NULL};
    dg_output fetches[DG_MAX_PARTITIONS + 1];
    for (int i = 0; i < m->emb.n; i++) fetches[i] = m->emb.parts[i];
    fetches[m->emb.n] = m->bias;
    assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, fetches, v, m->emb.n + 1, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < m->emb.n; i++) {
        assert_int_equal(dg_tensor_dim(v[i], 0), m->emb.offsets[i + 1] - m->emb.offsets[i]);
        expect_emb_rows(v[i], m->emb.offsets[i]);
        dg_tensor_free(&v[i]);
    }
    for (int k = 0; k < 3; k++) assert_true(dg_tensor_f32(v[m->emb.n])[k] == 0.5f);
    dg_tensor_free(&v[m->emb.n]);
    dg_status_free(&st);
}

// Restores the newest checkpoint into a new model of n_parts, checks every row, ticks and
// closes (which saves the next step) and frees it.
static void restore_and_check(const char *path, int n_parts, int64_t expect_step) {
    dg_status *st = dg_status_new();
    model m;
    build(&m, n_parts, 10, DG_FLOAT32);
    dg_mts_options o = options(path);
    dg_monitored_session *ms = dg_monitored_session_new(m.g, &o, st);
    assert_ok(st);
    assert_non_null(ms);
    assert_int_equal(dg_monitored_session_restored_step(ms), expect_step);
    expect_emb(ms, &m);
    assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &m.tick, 1, st));
    assert_true(dg_monitored_session_close(ms, st));
    assert_ok(st);
    dg_monitored_session_free(&ms);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

static int64_t sql_count(const char *path, const char *sql) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    return n;
}

static void sql_exec(const char *path, const char *sql) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) fail_msg("%s: %s", sql, err);
    sqlite3_close(db);
}

#define N_SLICE_ROWS "SELECT count(*) FROM slices"
#define HAS_SLICES_TABLE "SELECT count(*) FROM sqlite_master WHERE name = 'slices'"

// ---- the monitored session: 2 parts saved, 3 / none / 2 restored ----
static void test_two_parts_restore_into_three(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    model a;
    build(&a, 2, 10, DG_FLOAT32);
    assert_int_equal(a.emb.offsets[1], 5);
    dg_mts_options o = options(f->path);
    dg_monitored_session *ms = dg_monitored_session_new(a.g, &o, st);
    assert_ok(st);
    assert_int_equal(dg_monitored_session_restored_step(ms), -1);
    dg_node *set_tick[2] = {a.set, a.tick};
    assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, set_tick, 2, st));
    assert_ok(st);
    expect_emb(ms, &a);
    assert_true(dg_monitored_session_close(ms, st));   // saves step 1 with the values set
    assert_ok(st);
    dg_monitored_session_free(&ms);
    dg_graph_free(&a.g);

    // What the file says: two slices of "emb" [10,3], the other tensors whole.
    dg_checkpoint_store *store = dg_checkpoint_store_new(f->path, false, st);
    assert_ok(st);
    dg_checkpoint_var *vars = NULL;
    dg_checkpoint_slice *sl = NULL;
    int n = dg_checkpoint_variables_sliced(store, -1, &vars, &sl, st);
    assert_ok(st);
    assert_int_equal(n, 4);
    int seen = 0;
    dg_shape full = dg_shape2(10, 3);
    for (int i = 0; i < n; i++) {
        if (strncmp(vars[i].name, "emb/part_", 9) != 0) {
            assert_null(sl[i].full_name);
            continue;
        }
        int part = vars[i].name[9] - '0';
        seen |= 1 << part;
        assert_string_equal(sl[i].full_name, "emb");
        assert_true(dg_shape_equal(&sl[i].full_shape, &full));
        assert_int_equal(sl[i].offset[0], 5 * part);
        assert_int_equal(sl[i].offset[1], 0);
        assert_int_equal(vars[i].shape.dims[0], 5);
    }
    assert_int_equal(seen, 3);
    free(vars);
    free(sl);
    // A part reads back by its own name too (what dg-inspect and earlier releases do).
    const char *name = "emb/part_1";
    dg_tensor *t = NULL;
    assert_true(dg_checkpoint_restore(store, -1, &name, 1, &t, NULL, st));
    expect_emb_rows(t, 5);
    dg_tensor_free(&t);
    dg_checkpoint_store_free(&store);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 2);

    // 3 parts restore every row; closing saves step 2 as 3 slices (the 2 rows of the pruned
    // checkpoint went with their tensors).
    restore_and_check(f->path, 3, 1);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 3);
    // Unpartitioned: assembled from the 3 slices; its save holds "emb" whole.
    restore_and_check(f->path, 0, 2);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 0);
    // Partitioned again from the whole variable, in 4 and in 2 parts.
    restore_and_check(f->path, 4, 3);
    restore_and_check(f->path, 2, 4);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 2);
    assert_int_equal(sql_count(f->path, "SELECT max(global_step) FROM checkpoints"), 5);
    dg_status_free(&st);
}

// ---- the same on a cluster: 2 ps tasks (the parts spread by the replica device setter), a
// worker whose master runs the graph; 2 parts saved, 3 restored ----
static dg_server *start_server(dg_cluster *c, const char *job, int task) {
    dg_status *st = dg_status_new();
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *s = dg_server_new(c, job, task, &so, st);
    assert_ok(st);
    dg_status_free(&st);
    return s;
}

static void run_on_cluster(const char *path, const char *master, int n_parts, int64_t expect_restored,
                           const char *const *part_devices) {
    dg_status *st = dg_status_new();
    dg_replica_device_setter_options so = dg_replica_device_setter_options_default();
    so.ps_tasks = 2;
    so.worker_device = "/job:worker/task:0";
    dg_device_fn *fn = dg_replica_device_setter_new(&so, st);
    assert_ok(st);
    model m;
    build_on(&m, n_parts, 10, DG_FLOAT32, fn);
    for (int i = 0; i < n_parts; i++) assert_string_equal(dg_node_requested_device(m.emb.parts[i].node), part_devices[i]);
    dg_mts_options o = options(path);
    o.master = master;
    dg_monitored_session *ms = dg_monitored_session_new(m.g, &o, st);
    assert_ok(st);
    assert_int_equal(dg_monitored_session_restored_step(ms), expect_restored);
    if (expect_restored < 0) {
        dg_node *set_tick[2] = {m.set, m.tick};
        assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, set_tick, 2, st));
    } else {
        assert_true(dg_monitored_session_run(ms, NULL, NULL, 0, NULL, NULL, 0, &m.tick, 1, st));
    }
    assert_ok(st);
    expect_emb(ms, &m);
    assert_true(dg_monitored_session_close(ms, st));
    assert_ok(st);
    dg_monitored_session_free(&ms);
    dg_graph_free(&m.g);
    dg_device_fn_free(&fn);
    dg_status_free(&st);
}

static void test_cluster_two_ps(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    char spec[256];
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d,127.0.0.1:%d;worker|127.0.0.1:%d", dg_test_free_port(),
             dg_test_free_port(), dg_test_free_port());
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_server *ps0 = start_server(c, "ps", 0), *ps1 = start_server(c, "ps", 1), *w0 = start_server(c, "worker", 0);
    // Round robin over the ps ops: global_step, the parts, then bias.
    const char *two[] = {"/job:ps/task:1", "/job:ps/task:0"};
    const char *three[] = {"/job:ps/task:1", "/job:ps/task:0", "/job:ps/task:1"};
    run_on_cluster(f->path, dg_server_target(w0), 2, -1, two);
    // The ps tasks still hold emb/part_1 as [5,3], and a task refuses a variable of another
    // shape under a name it holds (dg_session_reset keeps the shapes): a graph cutting emb
    // otherwise needs new ps tasks.
    dg_server_free(&ps1);
    dg_server_free(&ps0);
    ps0 = start_server(c, "ps", 0);
    ps1 = start_server(c, "ps", 1);
    run_on_cluster(f->path, dg_server_target(w0), 3, 1, three);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 3);
    restore_and_check(f->path, 0, 2);   // and locally, unpartitioned
    dg_server_free(&w0);
    dg_server_free(&ps1);
    dg_server_free(&ps0);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

// ---- saver errors, each naming the variable and the file ----
static void expect_restore_fails(const char *path, model *m, dg_code code, const char *const *needles) {
    dg_status *st = dg_status_new();
    dg_saver *sv = dg_saver_new(m->g, st);
    assert_ok(st);
    dg_session *s = dg_session_new(m->g, "local", NULL, st);
    dg_checkpoint_store *store = dg_checkpoint_store_new(path, false, st);
    assert_ok(st);
    assert_true(dg_session_run_target(s, dg_global_variables_initializer(m->g), st));
    assert_false(dg_saver_restore(sv, s, store, -1, NULL, st));
    for (int i = 0; needles[i]; i++) assert_status(st, code, needles[i]);
    dg_checkpoint_store_free(&store);
    dg_session_free(&s);
    dg_saver_free(&sv);
    dg_status_free(&st);
}

static void save_model(const char *path, int n_parts, int64_t step) {
    dg_status *st = dg_status_new();
    model m;
    build(&m, n_parts, 10, DG_FLOAT32);
    dg_saver *sv = dg_saver_new(m.g, st);
    dg_session *s = dg_session_new(m.g, "local", NULL, st);
    dg_checkpoint_store *store = dg_checkpoint_store_new(path, true, st);
    assert_ok(st);
    assert_true(dg_session_run_target(s, dg_global_variables_initializer(m.g), st));
    assert_true(dg_session_run_target(s, m.set, st));
    assert_true(dg_saver_save(sv, s, store, step, 0, NULL, st));
    assert_ok(st);
    dg_checkpoint_store_free(&store);
    dg_session_free(&s);
    dg_saver_free(&sv);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

static void test_saver_errors(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    save_model(f->path, 2, 7);
    model m;

    // Another full shape: 12 rows asked, 10 saved.
    build(&m, 3, 12, DG_FLOAT32);
    const char *shape_needles[] = {f->path, "variable \"emb/part_0\" (rows [0, 4) of \"emb\" [12,3])",
                                   "holds \"emb\" as float32 [10,3], the graph asks for float32 [12,3]", NULL};
    expect_restore_fails(f->path, &m, DG_INVALID_ARGUMENT, shape_needles);
    // The same through the monitored session, which adds the file and the step.
    dg_mts_options o = options(f->path);
    assert_null(dg_monitored_session_new(m.g, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "restoring the checkpoint of step 7 from");
    assert_status(st, DG_INVALID_ARGUMENT, "the graph asks for float32 [12,3]");
    dg_status_reset(st);
    dg_graph_free(&m.g);

    // Another dtype.
    build(&m, 3, 10, DG_FLOAT64);
    const char *dtype_needles[] = {f->path, "\"emb/part_0\"", "float32 [10,3], the graph asks for float64 [10,3]", NULL};
    expect_restore_fails(f->path, &m, DG_INVALID_ARGUMENT, dtype_needles);
    dg_graph_free(&m.g);

    // A partitioned variable the checkpoint does not hold; slices of one the graph lacks.
    build(&m, 3, 10, DG_FLOAT32);
    dg_partitioned_variable_new(m.g, "other", DG_FLOAT32, dg_shape2(4, 2), dg_init_zeros(), dg_fixed_size_partitioner(2));
    const char *missing_needles[] = {"missing from the checkpoint: other/part_0 (a slice of other), "
                                     "other/part_1 (a slice of other)", NULL};
    expect_restore_fails(f->path, &m, DG_INVALID_ARGUMENT, missing_needles);
    dg_graph_free(&m.g);
    m.g = dg_graph_new();
    dg_global_step(m.g);
    dg_variable(m.g, "bias", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    const char *extra_needles[] = {"in the checkpoint but not in the graph: emb/part_0, emb/part_1", NULL};
    expect_restore_fails(f->path, &m, DG_INVALID_ARGUMENT, extra_needles);
    dg_graph_free(&m.g);

    // Slices that do not cover the rows asked for: a checkpoint holding rows [0, 5) only.
    dg_checkpoint_store *store = dg_checkpoint_store_new(f->path, false, st);
    assert_ok(st);
    dg_tensor *vals[3] = {emb_rows(0, 5, 3), dg_tensor_scalar_i64(8), NULL};
    float b[3] = {0.5f, 0.5f, 0.5f};
    vals[2] = dg_tensor_from_data(DG_FLOAT32, dg_shape1(3), b, st);
    const char *names[3] = {"emb/part_0", "global_step", "bias"};
    dg_checkpoint_slice slices[3];
    memset(slices, 0, sizeof slices);
    slices[0].full_name = "emb";
    slices[0].full_shape = dg_shape2(10, 3);
    assert_true(dg_checkpoint_save_slices(store, 8, names, vals, slices, 3, 0, st));
    assert_ok(st);
    for (int i = 0; i < 3; i++) dg_tensor_free(&vals[i]);
    dg_checkpoint_store_free(&store);
    build(&m, 3, 10, DG_FLOAT32);
    const char *cover_needles[] = {f->path, "variable \"emb/part_1\" (rows [4, 7) of \"emb\" [10,3])",
                                   "rows [5, 7) of \"emb\" are in none of the 1 saved slice of step 8", NULL};
    expect_restore_fails(f->path, &m, DG_NOT_FOUND, cover_needles);
    // Restoring the step that has them all still works with this graph.
    dg_saver *sv = dg_saver_new(m.g, st);
    dg_session *s = dg_session_new(m.g, "local", NULL, st);
    store = dg_checkpoint_store_new(f->path, false, st);
    assert_ok(st);
    int64_t got = -1;
    assert_true(dg_saver_restore(sv, s, store, 7, &got, st));
    assert_ok(st);
    assert_int_equal(got, 7);
    dg_tensor *v = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &m.emb.parts[2], &v, 1, NULL, 0, st));
    expect_emb_rows(v, 7);
    dg_tensor_free(&v);
    dg_checkpoint_store_free(&store);
    dg_session_free(&s);
    dg_saver_free(&sv);
    dg_graph_free(&m.g);

    // Malformed slice attributes stop the saver before it adds anything to the graph.
    m.g = dg_graph_new();
    dg_partitioned_variable pv = dg_partitioned_variable_new(m.g, "w", DG_FLOAT32, dg_shape2(4, 2), dg_init_zeros(),
                                                             dg_fixed_size_partitioner(2));
    int64_t bad_off[2] = {3, 0};   // part 1 holds 2 rows: they would end past row 4
    graph_set_attr_ints(pv.parts[1].node, "_save_slice_offset", bad_off, 2);
    int before = dg_graph_num_nodes(m.g);
    assert_null(dg_saver_new(m.g, st));
    assert_status(st, DG_INVALID_ARGUMENT, "saver: variable \"w/part_1\": bad save-slice attributes");
    assert_int_equal(dg_graph_num_nodes(m.g), before);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

// ---- the store: regions across slices of rows and of columns ----
static dg_tensor *counting(dg_dtype dt, dg_shape sh, double base) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(dt, sh, st);
    assert_ok(st);
    for (int64_t i = 0; i < dg_tensor_num_elements(t); i++) {
        if (dt == DG_FLOAT64) dg_tensor_f64(t)[i] = base + (double)i;
        else dg_tensor_i32(t)[i] = (int32_t)(base + (double)i);
    }
    dg_status_free(&st);
    return t;
}

static void test_store_regions(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->path, true, st);
    assert_ok(st);
    // m [4,6] float64, m(r, c) = 6 r + c, saved as two column halves; v [7] int32 as rows
    // [0, 2), [2, 7); u [5,2] whole.
    dg_tensor *full_m = counting(DG_FLOAT64, dg_shape2(4, 6), 0);
    dg_tensor *left = dg_tensor_new(DG_FLOAT64, dg_shape2(4, 3), st), *right = dg_tensor_new(DG_FLOAT64, dg_shape2(4, 3), st);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) {
            dg_tensor_f64(left)[r * 3 + c] = dg_tensor_f64(full_m)[r * 6 + c];
            dg_tensor_f64(right)[r * 3 + c] = dg_tensor_f64(full_m)[r * 6 + 3 + c];
        }
    dg_tensor *v0 = counting(DG_INT32, dg_shape1(2), 100), *v1 = counting(DG_INT32, dg_shape1(5), 102);
    dg_tensor *u = counting(DG_FLOAT64, dg_shape2(5, 2), 50);
    const char *names[5] = {"m/right", "m/left", "v/a", "v/b", "u"};
    dg_tensor *vals[5] = {right, left, v0, v1, u};
    dg_checkpoint_slice sl[5];
    memset(sl, 0, sizeof sl);
    sl[0] = (dg_checkpoint_slice){"m", dg_shape2(4, 6), {0, 3}};
    sl[1] = (dg_checkpoint_slice){"m", dg_shape2(4, 6), {0, 0}};
    sl[2] = (dg_checkpoint_slice){"v", dg_shape1(7), {0}};
    sl[3] = (dg_checkpoint_slice){"v", dg_shape1(7), {2}};
    assert_true(dg_checkpoint_save_slices(s, 3, names, vals, sl, 5, 0, st));
    assert_ok(st);

    // Requests: rows [1, 3) of m (both halves), m's block [1:3, 2:5], all of m, v [1, 6),
    // rows [2, 5) of u (saved whole), and v/b by its own name.
    dg_tensor *out[6];
    out[0] = dg_tensor_new(DG_FLOAT64, dg_shape2(2, 6), st);
    out[1] = dg_tensor_new(DG_FLOAT64, dg_shape2(2, 3), st);
    out[2] = dg_tensor_new(DG_FLOAT64, dg_shape2(4, 6), st);
    out[3] = dg_tensor_new(DG_INT32, dg_shape1(5), st);
    out[4] = dg_tensor_new(DG_FLOAT64, dg_shape2(3, 2), st);
    out[5] = dg_tensor_new(DG_INT32, dg_shape1(5), st);
    const char *rnames[6] = {"m rows", "m block", "m", "v mid", "u rows", "v/b"};
    dg_checkpoint_slice req[6];
    memset(req, 0, sizeof req);
    req[0] = (dg_checkpoint_slice){"m", dg_shape2(4, 6), {1, 0}};
    req[1] = (dg_checkpoint_slice){"m", dg_shape2(4, 6), {1, 2}};
    req[2] = (dg_checkpoint_slice){"m", dg_shape2(4, 6), {0, 0}};
    req[3] = (dg_checkpoint_slice){"v", dg_shape1(7), {1}};
    req[4] = (dg_checkpoint_slice){"u", dg_shape2(5, 2), {2, 0}};
    int64_t got = -1;
    assert_true(dg_checkpoint_restore_slices(s, -1, rnames, req, out, 6, &got, st));
    assert_ok(st);
    assert_int_equal(got, 3);
    for (int i = 0; i < 12; i++) assert_true(dg_tensor_f64(out[0])[i] == 6 + i);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) assert_true(dg_tensor_f64(out[1])[r * 3 + c] == 6 * (r + 1) + c + 2);
    assert_memory_equal(dg_tensor_data(out[2]), dg_tensor_data(full_m), dg_tensor_nbytes(full_m));
    for (int i = 0; i < 5; i++) assert_int_equal(dg_tensor_i32(out[3])[i], 101 + i);
    for (int i = 0; i < 6; i++) assert_true(dg_tensor_f64(out[4])[i] == 54 + i);
    assert_memory_equal(dg_tensor_data(out[5]), dg_tensor_data(v1), dg_tensor_nbytes(v1));

    // The listing, and a whole read of a name the checkpoint lacks.
    dg_checkpoint_var *vars = NULL;
    dg_checkpoint_slice *got_sl = NULL;
    assert_int_equal(dg_checkpoint_variables_sliced(s, 3, &vars, &got_sl, st), 5);
    assert_string_equal(vars[0].name, "m/right");
    assert_string_equal(got_sl[0].full_name, "m");
    assert_int_equal(got_sl[0].offset[1], 3);
    assert_string_equal(got_sl[3].full_name, "v");
    assert_int_equal(got_sl[3].offset[0], 2);
    assert_null(got_sl[4].full_name);
    free(vars);
    free(got_sl);
    assert_int_equal(dg_checkpoint_variables_sliced(s, 99, &vars, &got_sl, st), -1);
    assert_status(st, DG_NOT_FOUND, "no checkpoint of step 99");
    assert_null(vars);
    assert_null(got_sl);
    assert_int_equal(dg_checkpoint_variables_sliced(s, 3, &vars, NULL, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    const char *nope = "nope";
    assert_false(dg_checkpoint_restore_slices(s, -1, &nope, NULL, &out[3], 1, NULL, st));
    assert_status(st, DG_NOT_FOUND, "variable \"nope\" is not in the checkpoint of step 3");
    // A whole read into a tensor of another shape.
    const char *vb = "v/b";
    assert_false(dg_checkpoint_restore_slices(s, -1, &vb, NULL, &out[4], 1, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "variable \"v/b\" of step 3 is int32 [5], asked for float64 [3,2]");
    for (int i = 0; i < 6; i++) dg_tensor_free(&out[i]);
    for (int i = 0; i < 5; i++) dg_tensor_free(&vals[i]);
    dg_tensor_free(&full_m);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
}

// ---- the store: bad save arguments ----
static void test_store_save_errors(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->path, true, st);
    assert_ok(st);
    dg_tensor *a = emb_rows(0, 5, 3), *b = emb_rows(5, 10, 3), *d = counting(DG_FLOAT64, dg_shape2(5, 3), 0);
    const char *names[2] = {"emb/part_0", "emb/part_1"};
    dg_tensor *vals[2] = {a, b};
    dg_checkpoint_slice sl[2];
    static const struct {
        int64_t off1, rows1, rows0;   // offsets of part 1, full rows of part 0's and 1's slice
        int64_t full1;
        const char *needle;
    } cases[] = {
        {4, 10, 10, 10, "the slices \"emb/part_0\" (rows [0, 5)) and \"emb/part_1\" (rows [4, 9)) of \"emb\" overlap"},
        {5, 10, 10, 11, "disagree on the variable: float32 [10,3] and float32 [11,3]"},
        {6, 10, 10, 10, "\"emb/part_1\" ([5,3]) does not fit as a slice of \"emb\" [10,3]"},
        {-1, 10, 10, 10, "does not fit"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memset(sl, 0, sizeof sl);
        sl[0] = (dg_checkpoint_slice){"emb", dg_shape2(cases[k].rows0, 3), {0, 0}};
        sl[1] = (dg_checkpoint_slice){"emb", dg_shape2(cases[k].full1, 3), {cases[k].off1, 0}};
        assert_false(dg_checkpoint_save_slices(s, 1, names, vals, sl, 2, 0, st));
        assert_status(st, DG_INVALID_ARGUMENT, cases[k].needle);
        assert_status(st, DG_INVALID_ARGUMENT, f->path);
    }
    // Another dtype; another rank; a full name saved whole as well; bad full names.
    memset(sl, 0, sizeof sl);
    sl[0] = (dg_checkpoint_slice){"emb", dg_shape2(10, 3), {0, 0}};
    sl[1] = (dg_checkpoint_slice){"emb", dg_shape2(10, 3), {5, 0}};
    vals[1] = d;
    assert_false(dg_checkpoint_save_slices(s, 1, names, vals, sl, 2, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "float32 [10,3] and float64 [10,3]");
    vals[1] = b;
    sl[1].full_shape = dg_shape1(10);
    assert_false(dg_checkpoint_save_slices(s, 1, names, vals, sl, 2, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "does not fit");
    sl[1].full_shape = dg_shape2(10, 3);
    const char *clash[2] = {"emb/part_0", "emb"};
    sl[1].full_name = NULL;
    assert_false(dg_checkpoint_save_slices(s, 1, clash, vals, sl, 2, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "variable \"emb\" is saved whole and as the full variable of the slice");
    sl[1].full_name = "";
    assert_false(dg_checkpoint_save_slices(s, 1, names, vals, sl, 2, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "the full name of its slice is empty");
    char longname[300];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    sl[1].full_name = longname;
    assert_false(dg_checkpoint_save_slices(s, 1, names, vals, sl, 2, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "too long");
    // Nothing was written: no checkpoint, no slices table.
    assert_int_equal(dg_checkpoint_latest_step(s, st), -1);
    assert_int_equal(sql_count(f->path, HAS_SLICES_TABLE), 0);
    dg_tensor_free(&a);
    dg_tensor_free(&b);
    dg_tensor_free(&d);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
}

// ---- the store: requests that cannot be met, and files whose slices are damaged ----
static void save_emb_slices(const char *path, int64_t step, int max_to_keep) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, true, st);
    assert_ok(st);
    dg_tensor *vals[3] = {emb_rows(0, 4, 3), emb_rows(4, 7, 3), emb_rows(7, 10, 3)};
    const char *names[3] = {"emb/part_0", "emb/part_1", "emb/part_2"};
    dg_checkpoint_slice sl[3];
    memset(sl, 0, sizeof sl);
    for (int i = 0; i < 3; i++) {
        sl[i].full_name = "emb";
        sl[i].full_shape = dg_shape2(10, 3);
    }
    sl[1].offset[0] = 4;
    sl[2].offset[0] = 7;
    assert_true(dg_checkpoint_save_slices(s, step, names, vals, sl, 3, max_to_keep, st));
    assert_ok(st);
    for (int i = 0; i < 3; i++) dg_tensor_free(&vals[i]);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
}

// Reads rows [lo, hi) of "emb" [full_rows, 3] (dtype) from path; returns the status code, st
// keeps the message.
static dg_code read_rows(const char *path, int64_t lo, int64_t hi, int64_t full_rows, dg_dtype dt, dg_status *st) {
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, false, st);
    assert_ok(st);
    dg_tensor *t = dg_tensor_new(dt, dg_shape2(hi - lo, 3), st);
    dg_checkpoint_slice req = {"emb", dg_shape2(full_rows, 3), {lo, 0}};
    const char *name = "emb/part_x";
    bool ok = dg_checkpoint_restore_slices(s, -1, &name, &req, &t, 1, NULL, st);
    if (ok && dt == DG_FLOAT32) expect_emb_rows(t, lo);
    dg_tensor_free(&t);
    dg_checkpoint_store_free(&s);
    return ok ? DG_OK : dg_status_code(st);
}

static void test_store_restore_errors(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    save_emb_slices(f->path, 1, 0);
    assert_int_equal(read_rows(f->path, 2, 9, 10, DG_FLOAT32, st), DG_OK);
    assert_int_equal(read_rows(f->path, 0, 10, 10, DG_FLOAT32, st), DG_OK);
    assert_int_equal(read_rows(f->path, 4, 7, 10, DG_FLOAT32, st), DG_OK);
    assert_int_equal(read_rows(f->path, 5, 5, 10, DG_FLOAT32, st), DG_OK);   // no rows at all
    // A request that does not fit its own full shape.
    assert_int_equal(read_rows(f->path, 8, 12, 10, DG_FLOAT32, st), DG_INVALID_ARGUMENT);
    assert_status(st, DG_INVALID_ARGUMENT, "variable \"emb/part_x\" ([4,3]) does not fit as a slice of \"emb\" [10,3]");
    assert_int_equal(read_rows(f->path, 0, 4, 12, DG_FLOAT32, st), DG_INVALID_ARGUMENT);
    assert_status(st, DG_INVALID_ARGUMENT, "holds \"emb\" as float32 [10,3], the graph asks for float32 [12,3]");
    assert_status(st, DG_INVALID_ARGUMENT, f->path);
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_INT32, st), DG_INVALID_ARGUMENT);
    assert_status(st, DG_INVALID_ARGUMENT, "the graph asks for int32 [10,3]");

    // Part 1 gone: rows [4, 7) missing.
    sql_exec(f->path, "DELETE FROM chunks WHERE tensor_id IN (SELECT id FROM tensors WHERE name = 'emb/part_1');"
                      "DELETE FROM tensors WHERE name = 'emb/part_1';"
                      "UPDATE checkpoints SET n_tensors = n_tensors - 1");
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 2);   // the trigger took its row
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_FLOAT32, st), DG_OK);
    assert_int_equal(read_rows(f->path, 2, 9, 10, DG_FLOAT32, st), DG_NOT_FOUND);
    assert_status(st, DG_NOT_FOUND, "variable \"emb/part_x\" (rows [2, 9) of \"emb\" [10,3]): rows [4, 7) of \"emb\" "
                  "are in none of the 2 saved slices of step 1");
    assert_status(st, DG_NOT_FOUND, f->path);
    // Part 0's offset damaged: it overlaps part 2.
    sql_exec(f->path, "UPDATE slices SET offsets = '[6,0]' WHERE tensor_id = (SELECT id FROM tensors WHERE name = "
                      "'emb/part_0')");
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_FLOAT32, st), DG_DATA_LOSS);
    assert_status(st, DG_DATA_LOSS, "the saved slices \"emb/part_0\" (rows [6, 10)) and \"emb/part_2\" (rows [7, 10)) "
                  "of \"emb\" in step 1 overlap");
    assert_status(st, DG_DATA_LOSS, f->path);
    // ... past the end of the variable.
    sql_exec(f->path, "UPDATE slices SET offsets = '[8,0]' WHERE tensor_id = (SELECT id FROM tensors WHERE name = "
                      "'emb/part_0')");
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_FLOAT32, st), DG_DATA_LOSS);
    assert_status(st, DG_DATA_LOSS, "the description of the saved slice \"emb/part_0\" of step 1 is damaged");
    // ... not parsable.
    sql_exec(f->path, "UPDATE slices SET offsets = 'zero' WHERE tensor_id = (SELECT id FROM tensors WHERE name = "
                      "'emb/part_0')");
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_FLOAT32, st), DG_DATA_LOSS);
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->path, false, st);
    dg_checkpoint_var *vars = NULL;
    dg_checkpoint_slice *sl = NULL;
    assert_int_equal(dg_checkpoint_variables_sliced(s, -1, &vars, &sl, st), -1);
    assert_status(st, DG_DATA_LOSS, "the slice description of variable \"emb/part_0\" is damaged");
    // Listing without slices still works (it does not read them).
    assert_int_equal(dg_checkpoint_variables(s, -1, &vars, st), 2);
    free(vars);
    dg_checkpoint_store_free(&s);
    // Slices disagreeing on the full shape.
    sql_exec(f->path, "UPDATE slices SET offsets = '[0,0]', full_dims = '[11,3]' WHERE tensor_id = (SELECT id FROM "
                      "tensors WHERE name = 'emb/part_0')");
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_FLOAT32, st), DG_DATA_LOSS);
    assert_status(st, DG_DATA_LOSS, "the saved slices of \"emb\" in step 1 disagree on the variable: \"emb/part_0\" "
                  "says float32 [11,3], \"emb/part_2\" float32 [10,3]");
    // A table of other columns (tensor_id kept: the trigger on tensors names it, and without
    // it the file does not open: FAILED_PRECONDITION, "the tables do not match").
    sql_exec(f->path, "DROP TABLE slices; CREATE TABLE slices(tensor_id INTEGER)");
    assert_int_equal(read_rows(f->path, 0, 4, 10, DG_FLOAT32, st), DG_FAILED_PRECONDITION);
    assert_status(st, DG_FAILED_PRECONDITION, "the slices table does not have the columns");
    dg_status_free(&st);
}

// ---- pruning, replacing, and files without slices ----
static void test_store_schema(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    // Plain saves make no slices table: the schema of earlier releases.
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->path, true, st);
    dg_tensor *t = emb_rows(0, 10, 3);
    const char *name = "emb";
    assert_true(dg_checkpoint_save(s, 1, &name, &t, 1, 0, st));
    assert_true(dg_checkpoint_save_slices(s, 2, &name, &t, NULL, 1, 0, st));
    assert_ok(st);
    assert_int_equal(sql_count(f->path, HAS_SLICES_TABLE), 0);
    dg_checkpoint_var *vars = NULL;
    dg_checkpoint_slice *sl = NULL;
    assert_int_equal(dg_checkpoint_variables_sliced(s, -1, &vars, &sl, st), 1);
    assert_null(sl[0].full_name);
    free(vars);
    free(sl);
    // A partitioned graph restores from the whole variable of such a file.
    dg_tensor *part = dg_tensor_new(DG_FLOAT32, dg_shape2(3, 3), st);
    dg_checkpoint_slice req = {"emb", dg_shape2(10, 3), {7, 0}};
    const char *pname = "emb/part_2";
    assert_true(dg_checkpoint_restore_slices(s, 1, &pname, &req, &part, 1, NULL, st));
    assert_ok(st);
    expect_emb_rows(part, 7);
    dg_tensor_free(&part);
    dg_tensor_free(&t);
    dg_checkpoint_store_free(&s);

    // Slices saved with max_to_keep 2: pruned checkpoints take their slice rows along.
    for (int step = 3; step <= 6; step++) save_emb_slices(f->path, step, 2);
    assert_int_equal(sql_count(f->path, "SELECT count(*) FROM checkpoints"), 2);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 6);
    assert_int_equal(sql_count(f->path, "SELECT count(*) FROM slices WHERE tensor_id NOT IN (SELECT id FROM tensors)"), 0);
    // Replacing a step, and a writer deleting tensors the way an earlier release prunes.
    save_emb_slices(f->path, 6, 0);
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 6);
    sql_exec(f->path, "DELETE FROM chunks WHERE tensor_id IN (SELECT id FROM tensors WHERE checkpoint_id = "
                      "(SELECT min(id) FROM checkpoints)); DELETE FROM tensors WHERE checkpoint_id = "
                      "(SELECT min(id) FROM checkpoints); DELETE FROM checkpoints WHERE id = (SELECT min(id) FROM "
                      "checkpoints)");
    assert_int_equal(sql_count(f->path, N_SLICE_ROWS), 3);
    assert_int_equal(read_rows(f->path, 1, 10, 10, DG_FLOAT32, st), DG_OK);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_parts_restore_into_three, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_two_ps, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_saver_errors, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_store_regions, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_store_save_errors, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_store_restore_errors, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_store_schema, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
