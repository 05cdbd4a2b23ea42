/* Tests for the scalar summaries of runtime/training/checkpoint.c (and dg_checkpoint_list_info):
 * rows written read back in order (tag, step, write order) with NaN and infinities intact,
 * per tag and all at once, from a fresh store too, untouched by checkpoint saves and pruning;
 * the tag list; stopping early; a table as earlier releases created it reads and takes rows;
 * and what a caller or a damaged file can produce: bad arguments, a read-only file, no
 * summaries table, a table of other columns, a row of the wrong types, each checked for its
 * code and for the file named in the message. */
#include "testutil.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

// A temporary directory, with path its ckpt.db (not created): testutil's fixture.
typedef dg_test_tmpdir fixture;

static dg_checkpoint_store *open_ok(const char *path, bool create) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, create, st);
    assert_ok(st);
    assert_non_null(s);
    dg_status_free(&st);
    return s;
}

// A checkpoint of step holding one float scalar, so the file has checkpoints beside the rows.
static void save_step(dg_checkpoint_store *s, int64_t step, int max_to_keep) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape_scalar(), st);
    assert_ok(st);
    ((float *)dg_tensor_data(t))[0] = (float)step;
    const char *name = "w";
    assert_true(dg_checkpoint_save(s, step, &name, &t, 1, max_to_keep, st));
    assert_ok(st);
    dg_tensor_unref(t);
    dg_status_free(&st);
}

static void add_ok(dg_checkpoint_store *s, int64_t step, const char *const *tags, const double *values, int n,
                   double wall) {
    dg_status *st = dg_status_new();
    assert_true(dg_checkpoint_store_add_summaries(s, step, tags, values, n, wall, st));
    assert_ok(st);
    dg_status_free(&st);
}

// Rows read back, copied (the tag is borrowed only for the callback).
typedef struct rows {
    int n, stop_after;   // stop_after: the callback returns false after that many (0: never)
    int64_t step[32];
    char tag[32][16];
    double value[32], wall[32];
} rows;

static bool collect(void *ctx, const dg_checkpoint_summary *r) {
    rows *out = ctx;
    assert_true(out->n < 32);
    out->step[out->n] = r->step;
    snprintf(out->tag[out->n], sizeof out->tag[out->n], "%s", r->tag);
    out->value[out->n] = r->value;
    out->wall[out->n] = r->wall_time;
    out->n++;
    return out->stop_after == 0 || out->n < out->stop_after;
}

static void read_ok(dg_checkpoint_store *s, const char *tag, rows *out) {
    dg_status *st = dg_status_new();
    int stop_after = out->stop_after;
    memset(out, 0, sizeof *out);
    out->stop_after = stop_after;
    assert_true(dg_checkpoint_store_read_summaries(s, tag, collect, out, st));
    assert_ok(st);
    dg_status_free(&st);
}

// Runs sql on path through a connection of its own (what another program, or damage, does).
static void sql(const char *path, const char *text) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *err = NULL;
    if (sqlite3_exec(db, text, NULL, NULL, &err) != SQLITE_OK) {
        print_error("%s: %s\n", text, err ? err : "?");
        fail();
    }
    sqlite3_close(db);
}

static void test_round_trip(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    save_step(s, 1, 2);
    static const char *const tags[] = {"loss", "accuracy", "lr"};
    add_ok(s, 1, tags, (const double[]){2.5, NAN, 0.1}, 3, 1e9 + 1);
    add_ok(s, 2, tags, (const double[]){INFINITY, 0.5, -INFINITY}, 3, 1e9 + 2);
    add_ok(s, 1, tags, (const double[]){1.5, 0.25, 0.1}, 2, 1e9 + 3);   // step 1 again, after a restart
    // Checkpoint saves and their pruning leave the rows alone.
    save_step(s, 2, 1);
    save_step(s, 3, 1);

    rows r = {0};
    read_ok(s, NULL, &r);
    // By tag, then step, then write order.
    static const struct { const char *tag; int64_t step; double value, wall; } want[] = {
        {"accuracy", 1, NAN, 1e9 + 1}, {"accuracy", 1, 0.25, 1e9 + 3}, {"accuracy", 2, 0.5, 1e9 + 2},
        {"loss", 1, 2.5, 1e9 + 1},     {"loss", 1, 1.5, 1e9 + 3},      {"loss", 2, INFINITY, 1e9 + 2},
        {"lr", 1, 0.1, 1e9 + 1},       {"lr", 2, -INFINITY, 1e9 + 2},
    };
    assert_int_equal(r.n, 8);
    for (int i = 0; i < 8; i++) {
        assert_string_equal(r.tag[i], want[i].tag);
        assert_int_equal(r.step[i], want[i].step);
        if (isnan(want[i].value)) assert_true(isnan(r.value[i]));
        else assert_true(r.value[i] == want[i].value);
        assert_true(r.wall[i] == want[i].wall);
    }
    read_ok(s, "loss", &r);
    assert_int_equal(r.n, 3);
    assert_true(r.value[0] == 2.5 && r.value[1] == 1.5 && isinf(r.value[2]) && r.value[2] > 0);
    read_ok(s, "nope", &r);
    assert_int_equal(r.n, 0);
    r.stop_after = 2;
    read_ok(s, NULL, &r);
    assert_int_equal(r.n, 2);

    dg_status *st = dg_status_new();
    char **t = NULL;
    assert_int_equal(dg_checkpoint_store_summary_tags(s, &t, st), 3);
    assert_ok(st);
    assert_string_equal(t[0], "accuracy");
    assert_string_equal(t[1], "loss");
    assert_string_equal(t[2], "lr");
    assert_null(t[3]);
    free(t);
    dg_checkpoint_store_free(&s);

    // A fresh store (another program: dg-inspect) sees the same rows and the checkpoints.
    s = open_ok(f->path, false);
    r.stop_after = 0;
    read_ok(s, "lr", &r);
    assert_int_equal(r.n, 2);
    assert_true(r.value[0] == 0.1 && isinf(r.value[1]) && r.value[1] < 0);
    int64_t *steps = NULL;
    assert_int_equal(dg_checkpoint_list(s, &steps, st), 1);
    assert_int_equal(steps[0], 3);
    free(steps);
    dg_status_free(&st);
    dg_checkpoint_store_free(&s);
}

static void test_list_info(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    dg_status *st = dg_status_new();
    dg_checkpoint_info *info = NULL;
    assert_int_equal(dg_checkpoint_list_info(s, &info, st), 0);
    assert_ok(st);
    free(info);
    int64_t before_ms = (int64_t)time(NULL) * 1000 - 1000;
    save_step(s, 7, 0);
    save_step(s, 3, 0);   // saved later: listed after 7
    assert_int_equal(dg_checkpoint_list_info(s, &info, st), 2);
    assert_ok(st);
    assert_int_equal(info[0].step, 7);
    assert_int_equal(info[1].step, 3);
    for (int i = 0; i < 2; i++) {
        assert_true(info[i].created_unix_ms >= before_ms);
        assert_true(info[i].created_unix_ms <= (int64_t)time(NULL) * 1000 + 1000);
    }
    assert_true(info[0].created_unix_ms <= info[1].created_unix_ms);
    free(info);
    assert_int_equal(dg_checkpoint_list_info(s, NULL, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "list_info");
    dg_status_free(&st);
    dg_checkpoint_store_free(&s);
}

// Files written before checkpoint.c owned the table: the hook's one-line DDL, and a variant
// with value NOT NULL (what tests/smoke/dg_inspect_ckpt_smoke.sh creates).
static void test_earlier_tables(void **state) {
    fixture *f = *state;
    static const char *const ddl[] = {
        "CREATE TABLE IF NOT EXISTS summaries(step INTEGER NOT NULL, tag TEXT NOT NULL, value REAL, "
        "wall_time REAL NOT NULL)",
        "CREATE TABLE summaries(step INTEGER NOT NULL, tag TEXT NOT NULL, value REAL NOT NULL, "
        "wall_time REAL NOT NULL)",
    };
    for (int k = 0; k < 2; k++) {
        remove(f->path);
        dg_checkpoint_store *s = open_ok(f->path, true);
        save_step(s, 1, 0);
        sql(f->path, ddl[k]);
        sql(f->path, "INSERT INTO summaries VALUES (5, 'loss', 0.75, 1e9), (4, 'loss', 1, 1e9)");
        const char *tag = "loss";
        add_ok(s, 6, &tag, (const double[]){0.5}, 1, 1e9 + 6);
        rows r = {0};
        read_ok(s, NULL, &r);
        assert_int_equal(r.n, 3);
        assert_int_equal(r.step[0], 4);
        assert_true(r.value[0] == 1.0);   // an integer in a REAL column reads as a double
        assert_int_equal(r.step[1], 5);
        assert_int_equal(r.step[2], 6);
        assert_true(r.value[2] == 0.5);
        if (k == 1) {   // NaN cannot go into a NOT NULL column: the write fails whole
            dg_status *st = dg_status_new();
            static const char *const two[] = {"loss", "acc"};
            assert_false(dg_checkpoint_store_add_summaries(s, 7, two, (const double[]){0.25, NAN}, 2, 1e9, st));
            assert_status(st, DG_INVALID_ARGUMENT, f->path);
            dg_status_free(&st);
            read_ok(s, NULL, &r);
            assert_int_equal(r.n, 3);
        }
        dg_checkpoint_store_free(&s);
    }
}

static void test_bad_arguments(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    dg_status *st = dg_status_new();
    static const char *const tags[] = {"a", NULL};
    const double v[] = {1, 2};
    assert_false(dg_checkpoint_store_add_summaries(s, 1, tags, v, 2, 1e9, st));
    assert_status(st, DG_INVALID_ARGUMENT, "tag 1 is NULL");
    assert_true(strstr(dg_status_message(st), f->path) != NULL);
    assert_false(dg_checkpoint_store_add_summaries(s, -1, tags, v, 1, 1e9, st));
    assert_status(st, DG_INVALID_ARGUMENT, "steps are >= 0");
    assert_false(dg_checkpoint_store_add_summaries(s, 1, tags, v, 1, NAN, st));
    assert_status(st, DG_INVALID_ARGUMENT, "wall_time");
    assert_false(dg_checkpoint_store_add_summaries(s, 1, NULL, v, 1, 1e9, st));
    assert_status(st, DG_INVALID_ARGUMENT, f->path);
    assert_false(dg_checkpoint_store_add_summaries(NULL, 1, tags, v, 1, 1e9, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL store");
    assert_false(dg_checkpoint_store_read_summaries(s, NULL, NULL, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "read_summaries");
    assert_int_equal(dg_checkpoint_store_summary_tags(s, NULL, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "summary_tags");
    // n 0 writes nothing, not even the table.
    assert_true(dg_checkpoint_store_add_summaries(s, 1, NULL, NULL, 0, 1e9, st));
    assert_ok(st);
    rows r = {0};
    assert_false(dg_checkpoint_store_read_summaries(s, NULL, collect, &r, st));
    assert_status(st, DG_NOT_FOUND, "no summaries table");
    dg_status_free(&st);
    dg_checkpoint_store_free(&s);
}

static void test_read_only(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    const char *tag = "loss";
    add_ok(s, 1, &tag, (const double[]){3}, 1, 1e9);
    dg_checkpoint_store_free(&s);
    char uri[256];
    snprintf(uri, sizeof uri, "file:%s?mode=ro", f->path);
    s = open_ok(uri, false);
    dg_status *st = dg_status_new();
    assert_false(dg_checkpoint_store_add_summaries(s, 2, &tag, (const double[]){2}, 1, 1e9, st));
    assert_status(st, DG_FAILED_PRECONDITION, "cannot write the summaries of step 2");
    rows r = {0};
    read_ok(s, NULL, &r);   // reading a read-only file works
    assert_int_equal(r.n, 1);
    dg_status_free(&st);
    dg_checkpoint_store_free(&s);
}

// A checkpoint file no summary saver wrote to: NOT_FOUND naming the file, for every reader.
static void test_no_table(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    save_step(s, 1, 0);
    dg_status *st = dg_status_new();
    rows r = {0};
    assert_false(dg_checkpoint_store_read_summaries(s, NULL, collect, &r, st));
    assert_status(st, DG_NOT_FOUND, "no summaries table");
    assert_status(st, DG_NOT_FOUND, f->path);
    assert_false(dg_checkpoint_store_read_summaries(s, "loss", collect, &r, st));
    assert_status(st, DG_NOT_FOUND, "no summaries table");
    char *dummy[1] = {NULL};
    char **tags = dummy;   // set to NULL on failure
    assert_int_equal(dg_checkpoint_store_summary_tags(s, &tags, st), -1);
    assert_null(tags);
    assert_status(st, DG_NOT_FOUND, f->path);
    assert_int_equal(r.n, 0);
    // The store still works afterwards (no transaction left open).
    save_step(s, 2, 0);
    dg_status_free(&st);
    dg_checkpoint_store_free(&s);
}

// A summaries table of other columns (another program's), and rows of the wrong types.
static void test_damaged_table(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    save_step(s, 1, 0);
    sql(f->path, "CREATE TABLE summaries(a, b)");
    dg_status *st = dg_status_new();
    rows r = {0};
    assert_false(dg_checkpoint_store_read_summaries(s, NULL, collect, &r, st));
    assert_status(st, DG_FAILED_PRECONDITION, "the summaries table does not have the columns");
    assert_status(st, DG_FAILED_PRECONDITION, f->path);
    const char *tag = "loss";
    assert_false(dg_checkpoint_store_add_summaries(s, 1, &tag, (const double[]){1}, 1, 1e9, st));
    assert_status(st, DG_FAILED_PRECONDITION, "the summaries table does not have the columns");
    char **tags = NULL;
    assert_int_equal(dg_checkpoint_store_summary_tags(s, &tags, st), -1);
    assert_status(st, DG_FAILED_PRECONDITION, f->path);

    sql(f->path, "DROP TABLE summaries");
    add_ok(s, 1, &tag, (const double[]){1}, 1, 1e9);
    static const struct { const char *insert, *needle; } bad[] = {
        {"INSERT INTO summaries VALUES ('x', 'loss', 1, 1e9)", "the step is not an integer"},
        {"INSERT INTO summaries VALUES (2, 'loss', 'high', 1e9)", "the value is not a number"},
        {"INSERT INTO summaries VALUES (2, 'loss', 1, 'noon')", "the wall_time is not a number"},
        {"INSERT INTO summaries VALUES (2, x'00ff', 1, 1e9)", "the tag is not text"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sql(f->path, bad[i].insert);
        assert_false(dg_checkpoint_store_read_summaries(s, NULL, collect, &r, st));
        assert_status(st, DG_DATA_LOSS, bad[i].needle);
        assert_status(st, DG_DATA_LOSS, "the summaries table is damaged: in row 2");
        assert_status(st, DG_DATA_LOSS, f->path);
        sql(f->path, "DELETE FROM summaries WHERE rowid > 1");
    }
    sql(f->path, "INSERT INTO summaries VALUES (2, x'00ff', 1, 1e9)");
    assert_int_equal(dg_checkpoint_store_summary_tags(s, &tags, st), -1);
    assert_status(st, DG_DATA_LOSS, "a tag is not text");
    dg_status_free(&st);
    dg_checkpoint_store_free(&s);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, dg_test_tmpdir_setup, dg_test_tmpdir_teardown)
    const struct CMUnitTest tests[] = {
        T(test_round_trip),  T(test_list_info), T(test_earlier_tables), T(test_bad_arguments),
        T(test_read_only),   T(test_no_table),  T(test_damaged_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
