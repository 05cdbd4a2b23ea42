/* Tests for runtime/checkpoint.c: bit-exact round trips of every dtype and of scalars, empty
 * and multi-chunk tensors; listing, newest step, variables, max_to_keep and replacing a step;
 * and every bad input a caller or a damaged disk can produce (missing file, missing step or
 * variable, text file, random bytes, another SQLite schema, a newer format, truncation,
 * flipped data bytes, damaged metadata, a read-only file or directory, a full disk), each
 * checked for its code and for the file or variable named in the message. After every
 * failure the checkpoints already in the file still restore bit-exactly. */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// ---------------------------------------------------------------------------------------
// Helpers

// A temporary directory, with path its ckpt.db (not created): testutil's fixture.
typedef dg_test_tmpdir fixture;

// A tensor whose bytes are a function of seed (bools 0/1): NaN payloads, denormals and
// negative zeros all occur for floats, so "bit-exact" means more than "equal".
static dg_tensor *make(dg_dtype dt, dg_shape sh, uint64_t seed) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(dt, sh, st);
    assert_ok(st);
    unsigned char *p = dg_tensor_data(t);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < dg_tensor_nbytes(t); i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = dt == DG_BOOL ? (unsigned char)(x & 1) : (unsigned char)(x >> 24);
    }
    dg_status_free(&st);
    return t;
}

static void assert_same(const dg_tensor *a, const dg_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(dg_tensor_dtype(a), dg_tensor_dtype(b));
    assert_true(dg_shape_equal(dg_tensor_shape(a), dg_tensor_shape(b)));
    assert_int_equal(dg_tensor_nbytes(a), dg_tensor_nbytes(b));
    if (dg_tensor_nbytes(a))
        assert_memory_equal(dg_tensor_data(a), dg_tensor_data(b), dg_tensor_nbytes(a));
}

static dg_checkpoint_store *open_ok(const char *path, bool create) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, create, st);
    assert_ok(st);
    assert_non_null(s);
    dg_status_free(&st);
    return s;
}

static void save_ok(dg_checkpoint_store *s, int64_t step, const char *const *names,
                    dg_tensor *const *t, int n, int max_to_keep) {
    dg_status *st = dg_status_new();
    assert_true(dg_checkpoint_save(s, step, names, t, n, max_to_keep, st));
    assert_ok(st);
    dg_status_free(&st);
}

// Restores names of step (-1: newest) and compares them with want.
static void assert_restores(dg_checkpoint_store *s, int64_t step, const char *const *names,
                            dg_tensor *const *want, int n) {
    dg_status *st = dg_status_new();
    dg_tensor *out[16] = {0};
    int64_t got = -7;
    assert_true(n <= 16);
    assert_true(dg_checkpoint_restore(s, step, names, n, out, &got, st));
    assert_ok(st);
    if (step >= 0) assert_int_equal(got, step);
    for (int i = 0; i < n; i++) {
        assert_same(want[i], out[i]);
        dg_tensor_unref(out[i]);
    }
    dg_status_free(&st);
}

// Opens path afresh and checks that step restores as want: a failure elsewhere damaged nothing.
static void assert_file_restores(const char *path, int64_t step, const char *const *names,
                                 dg_tensor *const *want, int n) {
    dg_checkpoint_store *s = open_ok(path, false);
    assert_restores(s, step, names, want, n);
    dg_checkpoint_store_free(&s);
}

static void assert_msg_has(const dg_status *st, const char *needle) {
    if (strstr(dg_status_message(st), needle)) return;
    print_error("message \"%s\" lacks \"%s\"\n", dg_status_message(st), needle);
    fail();
}

static size_t file_size(const char *path) {
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (size_t)sb.st_size;
}

static unsigned char *read_file(const char *path, size_t *n) {
    *n = file_size(path);
    unsigned char *b = malloc(*n ? *n : 1);
    FILE *f = fopen(path, "rb");
    assert_non_null(b);
    assert_non_null(f);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void run_sql(const char *path, const char *sql) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *err = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
    if (rc != SQLITE_OK) print_error("%s: %s\n", sql, err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
    assert_int_equal(rc, SQLITE_OK);
}

// The small checkpoint most tests start from: step 1 with three variables.
static const char *const base_names[] = {"w", "b", "step"};

typedef struct base {
    dg_tensor *t[3];
} base;

static base base_make(uint64_t seed) {
    base b = {{make(DG_FLOAT32, dg_shape2(64, 33), seed), make(DG_FLOAT64, dg_shape1(33), seed + 1),
               make(DG_INT64, dg_shape_scalar(), seed + 2)}};
    return b;
}

static void base_free(base *b) {
    for (int i = 0; i < 3; i++) dg_tensor_unref(b->t[i]);
}

static void save_base(const char *path, int64_t step, base *b) {
    dg_checkpoint_store *s = open_ok(path, true);
    save_ok(s, step, base_names, b->t, 3, 0);
    dg_checkpoint_store_free(&s);
}

// Opening path (create or not) fails with code and a message naming path; the file's bytes
// do not change.
static void assert_open_fails(const char *path, bool create, dg_code code, const char *needle) {
    size_t n0 = 0, n1 = 0;
    unsigned char *before = read_file(path, &n0);
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, create, st);
    assert_null(s);
    assert_status(st, code, needle);
    assert_msg_has(st, path);
    unsigned char *after = read_file(path, &n1);
    assert_int_equal(n0, n1);
    if (n0) assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Round trips

static void test_round_trip_every_dtype_and_shape(void **state) {
    fixture *f = *state;
    int64_t rank8[8] = {1, 2, 1, 3, 1, 2, 1, 2};
    const char *names[] = {"f32/scalar", "f64/matrix", "i32/cube", "u8/bytes", "i64/empty",
                           "bool/mask", "f32/rank8", "f32/empty_middle", "f32/big",
                           "dense/kernel:0 (a name with spaces and :)"};
    dg_tensor *t[] = {
        make(DG_FLOAT32, dg_shape_scalar(), 1),
        make(DG_FLOAT64, dg_shape2(17, 9), 2),
        make(DG_INT32, dg_shape3(3, 4, 5), 3),
        make(DG_UINT8, dg_shape1(1001), 4),
        make(DG_INT64, dg_shape1(0), 5),
        make(DG_BOOL, dg_shape2(7, 3), 6),
        make(DG_FLOAT32, dg_shape_make(8, rank8), 7),
        make(DG_FLOAT32, dg_shape3(3, 0, 2), 8),
        // 20 MiB: more than one 16 MiB chunk, and the last chunk partial.
        make(DG_FLOAT32, dg_shape2(5, 1 << 20), 9),
        make(DG_INT64, dg_shape1(3), 10),
    };
    const int n = (int)(sizeof t / sizeof t[0]);
    dg_checkpoint_store *s = open_ok(f->path, true);
    save_ok(s, 42, names, t, n, 0);
    assert_restores(s, 42, names, t, n);
    dg_checkpoint_store_free(&s);

    // From a fresh open, newest step, in another order.
    const char *rev_names[16];
    dg_tensor *rev[16];
    for (int i = 0; i < n; i++) {
        rev_names[i] = names[n - 1 - i];
        rev[i] = t[n - 1 - i];
    }
    s = open_ok(f->path, false);
    assert_restores(s, -1, rev_names, rev, n);

    dg_status *st = dg_status_new();
    dg_checkpoint_var *vars = NULL;
    assert_int_equal(dg_checkpoint_variables(s, 42, &vars, st), n);
    assert_ok(st);
    for (int i = 0; i < n; i++) {   // in the order saved
        assert_string_equal(vars[i].name, names[i]);
        assert_int_equal(vars[i].dtype, dg_tensor_dtype(t[i]));
        assert_true(dg_shape_equal(&vars[i].shape, dg_tensor_shape(t[i])));
    }
    free(vars);
    assert_int_equal(dg_checkpoint_variables(s, -1, &vars, st), n);
    free(vars);
    dg_checkpoint_store_free(&s);
    for (int i = 0; i < n; i++) dg_tensor_unref(t[i]);
    dg_status_free(&st);
}

static void test_restore_subset_and_zero_variables(void **state) {
    fixture *f = *state;
    base b = base_make(3);
    save_base(f->path, 5, &b);
    dg_checkpoint_store *s = open_ok(f->path, false);
    const char *one[] = {"b"};
    assert_restores(s, 5, one, &b.t[1], 1);
    dg_status *st = dg_status_new();
    int64_t got = -1;
    assert_true(dg_checkpoint_restore(s, -1, NULL, 0, NULL, &got, st));   // resolves the step
    assert_int_equal(got, 5);
    assert_true(dg_checkpoint_save(s, 6, NULL, NULL, 0, 0, st));          // a step, no tensors
    assert_int_equal(dg_checkpoint_latest_step(s, st), 6);
    dg_checkpoint_var *vars = NULL;
    assert_int_equal(dg_checkpoint_variables(s, 6, &vars, st), 0);
    free(vars);
    assert_ok(st);
    dg_checkpoint_store_free(&s);
    base_free(&b);
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Steps: list, newest, max_to_keep, replacing

static void assert_steps(dg_checkpoint_store *s, const int64_t *want, int n) {
    dg_status *st = dg_status_new();
    int64_t *steps = NULL;
    int got = dg_checkpoint_list(s, &steps, st);
    assert_ok(st);
    assert_int_equal(got, n);
    for (int i = 0; i < n; i++) assert_int_equal(steps[i], want[i]);
    assert_int_equal(dg_checkpoint_latest_step(s, st), n ? want[n - 1] : -1);
    assert_ok(st);
    free(steps);
    dg_status_free(&st);
}

static void test_list_and_latest(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    assert_steps(s, NULL, 0);   // empty: -1 with OK
    base b = base_make(1);
    save_ok(s, 10, base_names, b.t, 3, 0);
    save_ok(s, 20, base_names, b.t, 3, 0);
    // Newest means most recently saved: a restarted run that went back to step 5 continues
    // from there, as TensorFlow's latest_checkpoint does.
    save_ok(s, 5, base_names, b.t, 3, 0);
    assert_steps(s, (const int64_t[]){10, 20, 5}, 3);
    dg_checkpoint_store_free(&s);
    s = open_ok(f->path, false);
    assert_steps(s, (const int64_t[]){10, 20, 5}, 3);
    dg_checkpoint_store_free(&s);
    base_free(&b);
}

static void test_max_to_keep(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    base b[7];
    for (int i = 0; i < 7; i++) b[i] = base_make(100 + (uint64_t)i);
    for (int i = 1; i <= 5; i++) save_ok(s, i, base_names, b[i].t, 3, 2);
    assert_steps(s, (const int64_t[]){4, 5}, 2);
    assert_restores(s, 4, base_names, b[4].t, 3);
    assert_restores(s, 5, base_names, b[5].t, 3);
    dg_status *st = dg_status_new();
    dg_tensor *out[3] = {0};
    assert_false(dg_checkpoint_restore(s, 3, base_names, 3, out, NULL, st));
    assert_status(st, DG_NOT_FOUND, "no checkpoint of step 3");
    assert_msg_has(st, f->path);
    assert_null(out[0]);
    // 0 keeps everything.
    save_ok(s, 6, base_names, b[6].t, 3, 0);
    assert_steps(s, (const int64_t[]){4, 5, 6}, 3);
    // Pruned pages are reused: 40 more saves keeping one do not grow the file 40 times.
    size_t size0 = file_size(f->path);
    dg_tensor *big = make(DG_FLOAT32, dg_shape1(1 << 18), 9);   // 1 MiB
    const char *nm[] = {"big"};
    for (int i = 0; i < 40; i++) save_ok(s, 100 + i, nm, &big, 1, 1);
    assert_steps(s, (const int64_t[]){139}, 1);
    assert_true(file_size(f->path) < size0 + ((size_t)4 << 20));
    assert_restores(s, 139, nm, &big, 1);
    dg_tensor_unref(big);
    dg_checkpoint_store_free(&s);
    for (int i = 0; i < 7; i++) base_free(&b[i]);
    dg_status_free(&st);
}

static void test_replacing_a_step(void **state) {
    fixture *f = *state;
    dg_checkpoint_store *s = open_ok(f->path, true);
    base a = base_make(1), c = base_make(2);
    save_ok(s, 7, base_names, a.t, 3, 0);
    save_ok(s, 8, base_names, a.t, 3, 0);
    // Step 7 again, with other values and only two of the variables.
    save_ok(s, 7, base_names, c.t, 2, 0);
    assert_steps(s, (const int64_t[]){8, 7}, 2);
    assert_restores(s, 7, base_names, c.t, 2);
    assert_restores(s, 8, base_names, a.t, 3);
    dg_status *st = dg_status_new();
    dg_tensor *out[3] = {0};
    assert_false(dg_checkpoint_restore(s, 7, base_names, 3, out, NULL, st));
    assert_status(st, DG_NOT_FOUND, "\"step\"");
    dg_checkpoint_store_free(&s);
    base_free(&a);
    base_free(&c);
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Missing things

static void test_missing_file_step_and_variable(void **state) {
    fixture *f = *state;
    dg_status *st = dg_status_new();
    assert_null(dg_checkpoint_store_new(f->path, false, st));
    assert_status(st, DG_NOT_FOUND, f->path);
    assert_int_equal(access(f->path, F_OK), -1);   // not created

    dg_checkpoint_store *s = open_ok(f->path, true);
    dg_tensor *out[3] = {0};
    dg_checkpoint_var *vars = NULL;
    assert_false(dg_checkpoint_restore(s, -1, base_names, 3, out, NULL, st));
    assert_status(st, DG_NOT_FOUND, "holds no checkpoint");
    assert_msg_has(st, f->path);
    assert_int_equal(dg_checkpoint_variables(s, -1, &vars, st), -1);
    assert_status(st, DG_NOT_FOUND, f->path);
    assert_null(vars);

    base b = base_make(4);
    save_ok(s, 1, base_names, b.t, 3, 0);
    assert_int_equal(dg_checkpoint_variables(s, 2, &vars, st), -1);
    assert_status(st, DG_NOT_FOUND, "no checkpoint of step 2");
    // A checkpoint of another graph: the names asked for are not there. NOT_FOUND names the
    // first missing variable and the file; nothing is returned.
    const char *other[] = {"w", "dense/kernel", "b"};
    out[0] = out[1] = out[2] = (dg_tensor *)&out;   // overwritten with NULL
    assert_false(dg_checkpoint_restore(s, -1, other, 3, out, NULL, st));
    assert_status(st, DG_NOT_FOUND, "variable \"dense/kernel\"");
    assert_msg_has(st, f->path);
    for (int i = 0; i < 3; i++) assert_null(out[i]);
    dg_checkpoint_store_free(&s);
    assert_file_restores(f->path, 1, base_names, b.t, 3);
    base_free(&b);
    dg_status_free(&st);
}

static void test_bad_arguments_save_nothing(void **state) {
    fixture *f = *state;
    base b = base_make(5);
    save_base(f->path, 1, &b);
    dg_checkpoint_store *s = open_ok(f->path, false);
    dg_status *st = dg_status_new();
    dg_tensor *big = make(DG_FLOAT32, dg_shape2(5, 1 << 20), 11);   // 20 MiB written first
    const char *dup[] = {"big", "x", "big"};
    dg_tensor *dup_t[] = {big, b.t[0], b.t[1]};
    assert_false(dg_checkpoint_save(s, 2, dup, dup_t, 3, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "variable \"big\" of step 2");
    assert_msg_has(st, "given twice");
    const char *with_null[] = {"w", NULL};
    assert_false(dg_checkpoint_save(s, 2, with_null, b.t, 2, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "name 1 is NULL");
    char long_name[300];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    const char *with_long[] = {long_name};
    assert_false(dg_checkpoint_save(s, 2, with_long, b.t, 1, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "too long");
    dg_tensor *none[] = {NULL};
    assert_false(dg_checkpoint_save(s, 2, base_names, none, 1, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "variable \"w\" has no value");
    assert_false(dg_checkpoint_save(s, -3, base_names, b.t, 3, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, f->path);
    assert_false(dg_checkpoint_save(s, 2, base_names, b.t, 3, -1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "max_to_keep -1");
    assert_false(dg_checkpoint_restore(s, -1, NULL, 2, NULL, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "restore");
    assert_steps(s, (const int64_t[]){1}, 1);
    assert_restores(s, 1, base_names, b.t, 3);
    dg_checkpoint_store_free(&s);
    // NULL and pointer-to-NULL closes do nothing.
    dg_checkpoint_store_free(&s);
    dg_checkpoint_store_free(NULL);
    dg_tensor_unref(big);
    base_free(&b);
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Files that are not checkpoints

static void test_text_file(void **state) {
    fixture *f = *state;
    const char text[] = "model_checkpoint_path: \"model.ckpt-1000\"\nall_model_checkpoint_paths: "
                        "\"model.ckpt-1000\"\n";
    write_file(f->path, text, sizeof text - 1);
    assert_open_fails(f->path, false, DG_DATA_LOSS, "not an SQLite database");
    assert_open_fails(f->path, true, DG_DATA_LOSS, "not an SQLite database");
}

static void test_random_bytes(void **state) {
    fixture *f = *state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        size_t n = (size_t)(seed * 40000);
        unsigned char *junk = malloc(n);
        uint64_t x = seed;
        for (size_t i = 0; i < n; i++) junk[i] = (unsigned char)(dg_test_uniform(&x, 0, 256));
        write_file(f->path, junk, n);
        free(junk);
        assert_open_fails(f->path, true, DG_DATA_LOSS, f->path);
    }
}

static void test_sqlite_file_of_another_schema(void **state) {
    fixture *f = *state;
    run_sql(f->path, "PRAGMA journal_mode=WAL; CREATE TABLE users(id INTEGER PRIMARY KEY, name "
                     "TEXT); INSERT INTO users(name) VALUES('ada');");
    assert_open_fails(f->path, true, DG_FAILED_PRECONDITION, "another schema");
    assert_open_fails(f->path, false, DG_FAILED_PRECONDITION, "not a distgraph checkpoint");
    // An SQLite database with no tables is not a checkpoint either, unless asked to create.
    unlink(f->path);
    run_sql(f->path, "PRAGMA user_version = 3;");
    assert_open_fails(f->path, false, DG_FAILED_PRECONDITION, "empty SQLite database");
}

static void test_newer_format_version(void **state) {
    fixture *f = *state;
    base b = base_make(6);
    save_base(f->path, 1, &b);
    run_sql(f->path, "UPDATE meta SET value = '2' WHERE key = 'version'");
    assert_open_fails(f->path, false, DG_FAILED_PRECONDITION, "format version 2 is newer");
    run_sql(f->path, "UPDATE meta SET value = 'x' WHERE key = 'version'");
    assert_open_fails(f->path, false, DG_DATA_LOSS, "version \"x\"");
    run_sql(f->path, "UPDATE meta SET value = '1' WHERE key = 'version'");
    assert_file_restores(f->path, 1, base_names, b.t, 3);
    base_free(&b);
}

// ---------------------------------------------------------------------------------------
// Damaged checkpoints

// Offset of the first occurrence of needle in path, or -1.
static long find_in_file(const char *path, const void *needle, size_t n) {
    size_t size = 0;
    unsigned char *b = read_file(path, &size);
    long at = -1;
    for (size_t i = 0; i + n <= size && at < 0; i++)
        if (memcmp(b + i, needle, n) == 0) at = (long)i;
    free(b);
    return at;
}

static void patch_file(const char *path, long off, const void *data, size_t n) {
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, n, off), (ssize_t)n);
    close(fd);
}

static void test_flipped_data_byte_is_data_loss(void **state) {
    fixture *f = *state;
    base old = base_make(7);
    save_base(f->path, 1, &old);
    const char *names[] = {"emb", "w"};
    dg_tensor *t[] = {make(DG_FLOAT32, dg_shape2(512, 300), 8), old.t[0]};   // 600 KiB
    dg_checkpoint_store *s = open_ok(f->path, false);
    save_ok(s, 2, names, t, 2, 0);
    dg_checkpoint_store_free(&s);
    // Flip one bit in the middle of emb's bytes, found by its contents.
    const unsigned char *emb = dg_tensor_data(t[0]);
    long at = find_in_file(f->path, emb + 300000, 64);
    assert_true(at > 0);
    unsigned char c = emb[300000] ^ 0x10;
    patch_file(f->path, at, &c, 1);

    dg_status *st = dg_status_new();
    dg_tensor *out[2] = {0};
    s = open_ok(f->path, false);
    assert_false(dg_checkpoint_restore(s, 2, names, 2, out, NULL, st));
    assert_status(st, DG_DATA_LOSS, "variable \"emb\" of step 2");
    assert_msg_has(st, "checksum mismatch");
    assert_msg_has(st, f->path);
    assert_null(out[0]);
    assert_null(out[1]);
    assert_restores(s, 2, &names[1], &t[1], 1);   // the other variable is intact
    dg_checkpoint_store_free(&s);
    assert_file_restores(f->path, 1, base_names, old.t, 3);
    dg_tensor_unref(t[0]);
    base_free(&old);
    dg_status_free(&st);
}

static void test_damaged_metadata_is_data_loss(void **state) {
    fixture *f = *state;
    base b = base_make(9);
    save_base(f->path, 1, &b);
    save_base(f->path, 2, &b);
    dg_status *st = dg_status_new();
    dg_tensor *out[3] = {0};
    const char *sqls[] = {
        "UPDATE tensors SET dims = '[64,34]' WHERE name = 'w' AND checkpoint_id = 2",
        "UPDATE tensors SET dims = '[64,33' WHERE name = 'w' AND checkpoint_id = 2",
        "UPDATE tensors SET dtype = 77 WHERE name = 'w' AND checkpoint_id = 2",
        "UPDATE tensors SET n_chunks = 2 WHERE name = 'w' AND checkpoint_id = 2",
        "DELETE FROM chunks WHERE tensor_id = (SELECT id FROM tensors WHERE name = 'w' AND "
        "checkpoint_id = 2)",
    };
    const char *needles[] = {"do not agree", "do not agree", "do not agree", "1 chunks",
                             "0 chunks"};
    for (int i = 0; i < 5; i++) {
        unlink(f->path);
        save_base(f->path, 1, &b);
        save_base(f->path, 2, &b);
        run_sql(f->path, sqls[i]);
        dg_checkpoint_store *s = open_ok(f->path, false);
        assert_false(dg_checkpoint_restore(s, -1, base_names, 3, out, NULL, st));
        assert_status(st, DG_DATA_LOSS, needles[i]);
        assert_msg_has(st, "variable \"w\" of step 2");
        assert_msg_has(st, f->path);
        dg_checkpoint_var *vars = NULL;
        int nv = dg_checkpoint_variables(s, 2, &vars, st);
        if (i == 1 || i == 2) {   // the description itself is damaged
            assert_int_equal(nv, -1);
            assert_status(st, DG_DATA_LOSS, "damaged");
        }
        free(vars);
        assert_restores(s, 1, base_names, b.t, 3);
        dg_checkpoint_store_free(&s);
    }
    // The checkpoint row's count of variables disagrees with its tensor rows.
    run_sql(f->path, "UPDATE checkpoints SET n_tensors = 4 WHERE global_step = 1");
    dg_checkpoint_store *s = open_ok(f->path, false);
    dg_checkpoint_var *vars = NULL;
    assert_int_equal(dg_checkpoint_variables(s, 1, &vars, st), -1);
    assert_status(st, DG_DATA_LOSS, "step 1 holds 3 variables");
    assert_msg_has(st, f->path);
    assert_null(vars);
    dg_checkpoint_store_free(&s);
    base_free(&b);
    dg_status_free(&st);
}

static void copy_file(const char *from, const char *to, size_t n) {
    size_t size = 0;
    unsigned char *b = read_file(from, &size);
    assert_true(n <= size);
    write_file(to, b, n);
    free(b);
}

static void test_truncated_file(void **state) {
    fixture *f = *state;
    base b = base_make(10);
    dg_tensor *big = make(DG_FLOAT32, dg_shape2(1024, 512), 12);   // 2 MiB
    const char *names[] = {"w", "b", "step", "big"};
    dg_tensor *t[] = {b.t[0], b.t[1], b.t[2], big};
    dg_checkpoint_store *s = open_ok(f->path, true);
    save_ok(s, 3, names, t, 4, 0);
    dg_checkpoint_store_free(&s);
    size_t size = file_size(f->path);
    char cut[160];
    snprintf(cut, sizeof cut, "%s/cut.db", f->dir);
    size_t lengths[] = {size - 65536, size - 1, size / 2, 65536 + 100, 4096, 100, 20};
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        copy_file(f->path, cut, lengths[i]);
        s = dg_checkpoint_store_new(cut, false, st);
        if (s) {
            dg_tensor *out[4] = {0};
            assert_false(dg_checkpoint_restore(s, -1, names, 4, out, NULL, st));
            dg_checkpoint_store_free(&s);
        }
        if (dg_status_code(st) != DG_DATA_LOSS) {
            print_error("truncated to %zu of %zu bytes\n", lengths[i], size);
            assert_status(st, DG_DATA_LOSS, cut);
        }
        assert_msg_has(st, cut);
        unlink(cut);
        snprintf(cut + strlen(cut), 8, "-wal");
        unlink(cut);
        cut[strlen(cut) - 4] = '\0';
    }
    // Cut to nothing: an empty file is not a checkpoint.
    copy_file(f->path, cut, 0);
    assert_open_fails(cut, false, DG_FAILED_PRECONDITION, "empty SQLite database");
    assert_file_restores(f->path, 3, names, t, 4);
    dg_tensor_unref(big);
    base_free(&b);
    dg_status_free(&st);
}

// Random bytes over random places of a checkpoint never crash and never restore wrong
// bytes: the open or the restore fails naming the file, or (damage in unused space) the
// restore is exact.
static void test_random_damage_never_restores_wrong_bytes(void **state) {
    fixture *f = *state;
    base b = base_make(13);
    dg_tensor *big = make(DG_FLOAT32, dg_shape2(256, 1024), 14);   // 1 MiB
    const char *names[] = {"w", "b", "step", "big"};
    dg_tensor *t[] = {b.t[0], b.t[1], b.t[2], big};
    dg_checkpoint_store *s = open_ok(f->path, true);
    save_ok(s, 1, names, t, 4, 0);
    dg_checkpoint_store_free(&s);
    size_t size = 0;
    unsigned char *orig = read_file(f->path, &size);
    char dmg[160];
    snprintf(dmg, sizeof dmg, "%s/damaged.db", f->dir);
    dg_status *st = dg_status_new();
    uint64_t rng = 99;
    int n_failed = 0;
    for (int trial = 0; trial < 40; trial++) {
        unsigned char *copy = malloc(size);
        memcpy(copy, orig, size);
        size_t at = (size_t)dg_test_uniform(&rng, 100, (double)size - 512);
        size_t len = (size_t)dg_test_uniform(&rng, 1, 512);
        for (size_t i = 0; i < len; i++)
            copy[at + i] = (unsigned char)dg_test_uniform(&rng, 0, 256);
        write_file(dmg, copy, size);
        free(copy);
        s = dg_checkpoint_store_new(dmg, false, st);
        bool ok = false;
        if (s) {
            dg_tensor *out[4] = {0};
            ok = dg_checkpoint_restore(s, -1, names, 4, out, NULL, st);
            if (ok) {
                for (int i = 0; i < 4; i++) assert_same(t[i], out[i]);
                for (int i = 0; i < 4; i++) dg_tensor_unref(out[i]);
            }
            dg_checkpoint_store_free(&s);
        }
        if (!ok) {
            n_failed++;
            dg_code c = dg_status_code(st);
            if (c != DG_DATA_LOSS && c != DG_NOT_FOUND && c != DG_FAILED_PRECONDITION) {
                print_error("damage of %zu bytes at %zu\n", len, at);
                assert_status(st, DG_DATA_LOSS, dmg);
            }
            assert_msg_has(st, dmg);
        }
        unlink(dmg);
    }
    assert_true(n_failed > 0);
    free(orig);
    dg_tensor_unref(big);
    base_free(&b);
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Read-only file and directory, full disk

static void test_read_only_uri(void **state) {
    fixture *f = *state;
    base b = base_make(15), c = base_make(16);
    save_base(f->path, 1, &b);
    char uri[200];
    snprintf(uri, sizeof uri, "file:%s?mode=ro", f->path);
    dg_checkpoint_store *s = open_ok(uri, false);
    assert_restores(s, 1, base_names, b.t, 3);
    dg_status *st = dg_status_new();
    assert_false(dg_checkpoint_save(s, 2, base_names, c.t, 3, 1, st));
    assert_status(st, DG_FAILED_PRECONDITION, "read-only");
    assert_msg_has(st, uri);
    assert_msg_has(st, "step 2");
    assert_steps(s, (const int64_t[]){1}, 1);
    dg_checkpoint_store_free(&s);
    assert_file_restores(f->path, 1, base_names, b.t, 3);
    base_free(&b);
    base_free(&c);
    dg_status_free(&st);
}

// Runs fn in a child process (as user nobody when we are root, since root ignores file
// modes) and returns its exit status; 77 means the child could not drop privileges.
static int run_as_other_user(void (*fn)(const fixture *), const fixture *f) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(77);
        fn(f);
        _exit(0);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    return WEXITSTATUS(ws);
}

#define CHILD_CHECK(cond, code)                                                            \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "child: %s failed: %s\n", #cond, dg_status_message(st));       \
            _exit(code);                                                                   \
        }                                                                                  \
    } while (0)

// In the child: opens, restores step 1, and fails to save step 2 with FAILED_PRECONDITION
// naming the file.
static void child_save_refused(const fixture *f) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->path, true, st);
    CHILD_CHECK(s != NULL, 10);
    dg_tensor *out[3] = {0};
    CHILD_CHECK(dg_checkpoint_restore(s, 1, base_names, 3, out, NULL, st), 11);
    base b = base_make(15);
    for (int i = 0; i < 3; i++) {
        CHILD_CHECK(dg_tensor_nbytes(out[i]) == dg_tensor_nbytes(b.t[i]), 12);
        CHILD_CHECK(memcmp(dg_tensor_data(out[i]), dg_tensor_data(b.t[i]),
                           dg_tensor_nbytes(out[i])) == 0, 12);
    }
    CHILD_CHECK(!dg_checkpoint_save(s, 2, base_names, b.t, 3, 1, st), 13);
    CHILD_CHECK(dg_status_code(st) == DG_FAILED_PRECONDITION, 14);
    CHILD_CHECK(strstr(dg_status_message(st), f->path) != NULL, 15);
    CHILD_CHECK(strstr(dg_status_message(st), "read-only") != NULL ||
                strstr(dg_status_message(st), "not writable") != NULL, 16);
    dg_checkpoint_store_free(&s);
    _exit(0);
}

static void test_read_only_file_and_directory(void **state) {
    fixture *f = *state;
    base b = base_make(15);
    save_base(f->path, 1, &b);
    // A 0444 file in a directory the other user may write (so SQLite can create -shm).
    assert_int_equal(chmod(f->dir, 0777), 0);
    assert_int_equal(chmod(f->path, 0444), 0);
    int rc = run_as_other_user(child_save_refused, f);
    if (rc == 77) {
        base_free(&b);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(chmod(f->path, 0644), 0);
    assert_file_restores(f->path, 1, base_names, b.t, 3);
    // A writable file in a directory the other user may not write: WAL mode cannot create
    // its -shm file there, so the store reads the file as immutable and refuses saves.
    assert_int_equal(chmod(f->path, 0666), 0);
    assert_int_equal(chmod(f->dir, 0555), 0);
    assert_int_equal(run_as_other_user(child_save_refused, f), 0);
    assert_int_equal(chmod(f->dir, 0700), 0);
    assert_file_restores(f->path, 1, base_names, b.t, 3);
    base_free(&b);
}

// In the child: with writes past 2 MiB failing (EFBIG, as on a full disk), saving 8 MiB
// fails with RESOURCE_EXHAUSTED naming the file.
static void child_disk_full(const fixture *f) {
    dg_status *st = dg_status_new();
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit r = {(rlim_t)2 << 20, (rlim_t)2 << 20};
    CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &r) == 0, 20);
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->path, false, st);
    CHILD_CHECK(s != NULL, 21);
    dg_tensor *big = make(DG_FLOAT32, dg_shape2(2048, 1024), 17);
    const char *nm[] = {"big"};
    CHILD_CHECK(!dg_checkpoint_save(s, 2, nm, &big, 1, 1, st), 22);
    CHILD_CHECK(dg_status_code(st) == DG_RESOURCE_EXHAUSTED, 23);
    CHILD_CHECK(strstr(dg_status_message(st), f->path) != NULL, 24);
    CHILD_CHECK(strstr(dg_status_message(st), "step 2") != NULL, 25);
    // The store stays usable: the older checkpoint still reads.
    dg_tensor *out[3] = {0};
    CHILD_CHECK(dg_checkpoint_restore(s, -1, base_names, 3, out, NULL, st), 26);
    CHILD_CHECK(dg_checkpoint_latest_step(s, st) == 1, 27);
    dg_checkpoint_store_free(&s);
    _exit(0);
}

static void test_full_disk(void **state) {
    fixture *f = *state;
    base b = base_make(15);
    save_base(f->path, 1, &b);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) child_disk_full(f);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    assert_file_restores(f->path, 1, base_names, b.t, 3);
    // Without the limit the same save succeeds, and step 1 is pruned by it.
    dg_checkpoint_store *s = open_ok(f->path, false);
    assert_steps(s, (const int64_t[]){1}, 1);
    dg_tensor *big = make(DG_FLOAT32, dg_shape2(2048, 1024), 17);
    const char *nm[] = {"big"};
    save_ok(s, 2, nm, &big, 1, 1);
    assert_steps(s, (const int64_t[]){2}, 1);
    assert_restores(s, 2, nm, &big, 1);
    dg_checkpoint_store_free(&s);
    dg_tensor_unref(big);
    base_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, dg_test_tmpdir_setup, dg_test_tmpdir_teardown)
        T(test_round_trip_every_dtype_and_shape),
        T(test_restore_subset_and_zero_variables),
        T(test_list_and_latest),
        T(test_max_to_keep),
        T(test_replacing_a_step),
        T(test_missing_file_step_and_variable),
        T(test_bad_arguments_save_nothing),
        T(test_text_file),
        T(test_random_bytes),
        T(test_sqlite_file_of_another_schema),
        T(test_newer_format_version),
        T(test_flipped_data_byte_is_data_loss),
        T(test_damaged_metadata_is_data_loss),
        T(test_truncated_file),
        T(test_random_damage_never_restores_wrong_bytes),
        T(test_read_only_uri),
        T(test_read_only_file_and_directory),
        T(test_full_disk),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
