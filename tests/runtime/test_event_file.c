/* TensorBoard event files (distgraph/summary.h): what is written reads back in order, every
 * record's checksums agree with a bitwise CRC32C computed here (independent of the writer's
 * table), and damaged, truncated or misplaced files give statuses naming the fault.
 * tests/integration/tensorboard_events.sh reads the files with TensorBoard's own loader. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "testutil.h"

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t masked(const uint8_t *p, size_t n) {
    uint32_t c = crc32c_bitwise(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint32_t le32(const uint8_t *b) { return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

typedef struct seen {
    int n;
    char kind[16][16], tag[16][32];
    int64_t step[16];
    double value[16];
} seen;

static bool collect(void *ctx, const dg_event *e) {
    seen *s = ctx;
    if (s->n < 16) {
        snprintf(s->kind[s->n], sizeof s->kind[0], "%s", e->kind);
        snprintf(s->tag[s->n], sizeof s->tag[0], "%s", e->tag);
        s->step[s->n] = e->step;
        s->value[s->n] = e->value;
    }
    s->n++;
    return true;
}

static char dir[] = "/tmp/dg_events_XXXXXX";

static void test_write_read(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char logdir[256];
    snprintf(logdir, sizeof logdir, "%s/run/a", dir);   // made with its parents
    dg_event_writer *w = dg_event_writer_new(logdir, st);
    assert_non_null(w);
    assert_true(strstr(dg_event_writer_path(w), "/events.out.tfevents.") != NULL);
    assert_true(dg_event_writer_add_scalar(w, "loss", 0, 2.5, st));
    assert_true(dg_event_writer_add_scalar(w, "loss", 100, 0.75, st));
    double v[101];
    for (int i = 0; i < 101; i++) v[i] = i - 50;
    assert_true(dg_event_writer_add_histogram(w, "weights", 100, v, 101, st));
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0");
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape1(3));
    dg_graph_pop_device(g);
    dg_output b = dg_relu(g, "b", a);
    (void)b;
    assert_true(dg_event_writer_add_graph(w, g, 100, st));
    assert_false(dg_event_writer_add_scalar(w, "", 1, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "tag");
    char path[512];
    snprintf(path, sizeof path, "%s", dg_event_writer_path(w));
    dg_event_writer_free(&w);
    dg_graph_free(&g);

    seen s = {0};
    int64_t n = 0;
    assert_true(dg_event_file_read(path, collect, &s, &n, st));
    assert_int_equal(n, 5);
    assert_int_equal(s.n, 5);
    assert_string_equal(s.kind[0], "file_version");
    assert_string_equal(s.tag[0], "brain.Event:2");
    assert_string_equal(s.kind[1], "scalar");
    assert_string_equal(s.tag[1], "loss");
    assert_true(s.value[1] == 2.5 && s.step[1] == 0);
    assert_true(s.value[2] == 0.75 && s.step[2] == 100);
    assert_string_equal(s.kind[3], "histogram");
    assert_true(s.value[3] == 101);   // the count of values
    assert_string_equal(s.kind[4], "graph");
    assert_true(s.value[4] == 2);     // nodes

    // Every record's checksums, recomputed bitwise.
    size_t len;
    uint8_t *f = slurp(path, &len);
    size_t off = 0;
    int records = 0;
    while (off < len) {
        assert_true(off + 12 <= len);
        uint64_t m = 0;
        for (int i = 7; i >= 0; i--) m = m << 8 | f[off + i];
        assert_int_equal(le32(f + off + 8), masked(f + off, 8));
        assert_true(off + 12 + m + 4 <= len);
        assert_int_equal(le32(f + off + 12 + m), masked(f + off + 12, m));
        off += 12 + m + 4;
        records++;
    }
    assert_int_equal(records, 5);

    // A damaged byte: DATA_LOSS naming the record's offset.
    char bad[600];
    snprintf(bad, sizeof bad, "%s.bad", path);
    f[60] ^= 0x40;   // inside the second record's message (the first ends at byte 40)
    spit(bad, f, len);
    assert_false(dg_event_file_read(bad, NULL, NULL, &n, st));
    assert_status(st, DG_DATA_LOSS, "damaged");
    assert_int_equal(n, 1);
    f[60] ^= 0x40;
    // Truncated inside the last record (a writer killed mid-write).
    spit(bad, f, len - 7);
    assert_false(dg_event_file_read(bad, NULL, NULL, &n, st));
    assert_status(st, DG_DATA_LOSS, "truncated");
    assert_int_equal(n, 4);
    // Not an event file at all.
    spit(bad, (const uint8_t *)"hello, this is no event file at all", 35);
    assert_false(dg_event_file_read(bad, NULL, NULL, &n, st));
    assert_status(st, DG_DATA_LOSS, "byte 0");
    assert_false(dg_event_file_read("/nonexistent/events", NULL, NULL, &n, st));
    assert_status(st, DG_NOT_FOUND, "/nonexistent/events");
    free(f);
    dg_status_free(&st);
}

static void test_bad_logdir(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char file[256];
    snprintf(file, sizeof file, "%s/plain_file", dir);
    spit(file, (const uint8_t *)"x", 1);
    assert_null(dg_event_writer_new(file, st));
    assert_status(st, DG_FAILED_PRECONDITION, "is not a directory");
    assert_status(st, DG_FAILED_PRECONDITION, "plain_file");
    char below[300];
    snprintf(below, sizeof below, "%s/sub", file);
    assert_null(dg_event_writer_new(below, st));
    assert_status(st, DG_FAILED_PRECONDITION, "cannot make its directory");
    assert_null(dg_event_writer_new("", st));
    assert_status(st, DG_INVALID_ARGUMENT, "log directory");
    dg_status_free(&st);
}

// A file size limit stands in for a full disk: the write fails with a status naming the file,
// and what was written before reads back.
static void test_write_error(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char logdir[256];
    snprintf(logdir, sizeof logdir, "%s/limited", dir);
    dg_event_writer *w = dg_event_writer_new(logdir, st);
    assert_non_null(w);
    assert_true(dg_event_writer_add_scalar(w, "loss", 1, 1.0, st));
    assert_true(dg_event_writer_flush(w, st));
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    bool failed = false;
    double big[20000];
    for (int i = 0; i < 20000; i++) big[i] = i * 1e-3;
    for (int i = 0; i < 50 && !failed; i++)
        failed = !dg_event_writer_add_histogram(w, "h", i, big, 20000, st) || !dg_event_writer_flush(w, st);
    setrlimit(RLIMIT_FSIZE, &old);
    assert_true(failed);
    assert_status(st, dg_status_code(st), dg_event_writer_path(w));
    char path[512];
    snprintf(path, sizeof path, "%s", dg_event_writer_path(w));
    dg_event_writer_free(&w);
    seen s = {0};
    int64_t n = 0;
    dg_event_file_read(path, collect, &s, &n, st);   // may end in a truncated record
    assert_true(n >= 2);
    assert_string_equal(s.kind[1], "scalar");
    dg_status_free(&st);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read),
        cmocka_unit_test(test_bad_logdir),
        cmocka_unit_test(test_write_error),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = 1;
    return rc;
}
