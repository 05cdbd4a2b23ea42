/* Step traces (distgraph/trace.h): what a traced step records locally and across two tasks,
 * the clock-offset estimate against the truth (tasks of one process share one clock), the notes'
 * codec against malformed and hostile bytes, and the Chrome file's errors. */
#include <fcntl.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#include "exec_trace_impl.h"
#include "step_trace_impl.h"
#include "trace_blob_impl.h"

#define PS "/job:ps/replica:0/task:0"
#define WK "/job:worker/replica:0/task:0"

static int count_op(const dg_step_trace *t, const char *op, const char *task) {
    int n = 0;
    for (int i = 0; i < dg_step_trace_num_events(t); i++) {
        const dg_trace_event *e = dg_step_trace_event(t, i);
        if (e->kind == DG_TRACE_OP && strcmp(e->op, op) == 0 && (!task || strcmp(e->task, task) == 0)) n++;
    }
    return n;
}

// Every event inside the step, in order, and each node computed at most once.
static void check_well_formed(const dg_step_trace *t) {
    int64_t step = dg_step_trace_step_ns(t);
    assert_true(step > 0);
    int n = dg_step_trace_num_events(t);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        const dg_trace_event *e = dg_step_trace_event(t, i);
        assert_true(e->start_ns <= e->end_ns);
        assert_true(e->start_ns >= 0);
        assert_true(e->end_ns <= step);
        if (i > 0) assert_true(dg_step_trace_event(t, i - 1)->start_ns <= e->start_ns);
        if (e->kind != DG_TRACE_OP) continue;
        for (int j = i + 1; j < n; j++) {
            const dg_trace_event *f = dg_step_trace_event(t, j);
            if (f->kind == DG_TRACE_OP && strcmp(f->task, e->task) == 0) assert_string_not_equal(f->name, e->name);
        }
    }
    assert_null(dg_step_trace_event(t, n));
    assert_null(dg_step_trace_event(t, -1));
    int64_t busy = dg_step_trace_busy_ns(t);
    assert_true(busy > 0 && busy <= step);
}

static void test_local_trace(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_test_model m;
    dg_test_model_build(&m, false);
    dg_session *s = dg_test_local_session(m.g, 1, 1, st);
    assert_true(dg_session_run_target(s, m.init, st));
    double xv[6] = {1, 2, 3, -1, 0.5, 2};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(2, 3), xv, st);
    dg_run_options ro = {.trace = true};
    dg_step_trace *t = NULL;
    dg_tensor *loss = NULL;
    assert_true(dg_session_run_with_options(s, &ro, &m.x, &xt, 1, &m.loss, &loss, 1, &m.train, 1, &t, st));
    assert_ok(st);
    assert_non_null(t);
    check_well_formed(t);
    assert_int_equal(count_op(t, "MatMul", NULL), 2);   // x @ w and the gradient x^T @ dy
    assert_int_equal(count_op(t, "ApplyAdam", NULL), 1);
    assert_int_equal(dg_step_trace_num_tasks(t), 1);
    int64_t off = -1, unc = -1;
    assert_string_equal(dg_step_trace_task(t, 0, &off, &unc), "/job:localhost/replica:0/task:0");
    assert_int_equal(off, 0);
    assert_int_equal(unc, 0);
    assert_null(dg_step_trace_task(t, 1, NULL, NULL));
    dg_step_trace_free(&t);
    // Untraced: no trace, and options NULL is dg_session_run.
    ro.trace = false;
    dg_tensor_unref(loss);
    assert_true(dg_session_run_with_options(s, &ro, &m.x, &xt, 1, &m.loss, &loss, 1, &m.train, 1, &t, st));
    assert_null(t);
    dg_tensor_unref(loss);
    assert_true(dg_session_run_with_options(s, NULL, &m.x, &xt, 1, &m.loss, &loss, 1, NULL, 0, NULL, st));
    assert_ok(st);
    dg_tensor_unref(loss);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

static const dg_trace_event *find_transfer(const dg_step_trace *t, const char *to, const char *from) {
    for (int i = 0; i < dg_step_trace_num_events(t); i++) {
        const dg_trace_event *e = dg_step_trace_event(t, i);
        if (e->kind == DG_TRACE_TRANSFER && strcmp(e->task, to) == 0 && strcmp(e->peer, from) == 0) return e;
    }
    return NULL;
}

static void test_cluster_trace(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char spec[256];
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|127.0.0.1:%d", dg_test_free_port(), dg_test_free_port());
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *ps = dg_server_new(c, "ps", 0, &so, st);
    dg_server *wk = dg_server_new(c, "worker", 0, &so, st);
    assert_ok(st);
    dg_test_model m;
    dg_test_model_build(&m, true);
    dg_session *s = dg_session_new(m.g, dg_server_target(wk), NULL, st);
    assert_ok(st);
    assert_true(dg_session_run_target(s, m.init, st));
    double xv[6] = {1, 2, 3, -1, 0.5, 2};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(2, 3), xv, st);
    dg_run_options ro = {.trace = true};
    for (int round = 0; round < 3; round++) {   // traced and untraced steps alternate
        dg_step_trace *t = NULL;
        dg_tensor *loss = NULL;
        assert_true(dg_session_run_with_options(s, round == 1 ? NULL : &ro, &m.x, &xt, 1, &m.loss, &loss, 1,
                                                &m.train, 1, &t, st));
        assert_ok(st);
        dg_tensor_unref(loss);
        if (round == 1) {
            assert_null(t);
            continue;
        }
        check_well_formed(t);
        assert_int_equal(dg_step_trace_num_tasks(t), 2);
        int64_t off = 1, unc = -1;
        assert_string_equal(dg_step_trace_task(t, 0, &off, &unc), WK);
        assert_int_equal(off, 0);
        assert_int_equal(unc, 0);
        // Both tasks run in this process, on one clock: the true offset is 0, which the estimate
        // must bracket.
        assert_string_equal(dg_step_trace_task(t, 1, &off, &unc), PS);
        assert_true(unc >= 0);
        assert_true(off - unc <= 0 && off + unc >= 0);
        assert_int_equal(count_op(t, "MatMul", WK), 2);
        assert_int_equal(count_op(t, "ApplyAdam", PS), 1);
        // w (3x2 float64) goes to the worker and its gradient back.
        const dg_trace_event *in = find_transfer(t, WK, PS), *out = find_transfer(t, PS, WK);
        assert_non_null(in);
        assert_non_null(out);
        assert_int_equal(in->bytes, 48);
        assert_int_equal(out->bytes, 48);
        assert_string_equal(in->device, WK "/device:CPU:0");
        assert_true(in->end_ns <= out->start_ns);   // the gradient needs w
        bool request = false, answer = false;
        for (int i = 0; i < dg_step_trace_num_events(t); i++) {
            const dg_trace_event *e = dg_step_trace_event(t, i);
            if (e->kind != DG_TRACE_MESSAGE) continue;
            if (strcmp(e->name, "RUN_GRAPH") == 0 && strcmp(e->task, PS) == 0 && strcmp(e->peer, WK) == 0) request = true;
            if (strcmp(e->name, "RUN_GRAPH answer") == 0 && strcmp(e->task, WK) == 0) answer = true;
        }
        assert_true(request && answer);
        char path[] = "/tmp/dg_trace_XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        assert_true(dg_step_trace_write_chrome(t, path, st));
        assert_ok(st);
        FILE *f = fopen(path, "r");
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        unlink(path);
        assert_non_null(strstr(buf, "\"traceEvents\""));
        assert_non_null(strstr(buf, "\"name\":\"" PS "\""));
        assert_non_null(strstr(buf, "\"ph\":\"s\""));
        dg_step_trace_free(&t);
    }
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_server_free(&wk);
    dg_server_free(&ps);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

// The notes' codec with chosen clock readings: the offset and its bound are NTP's.
static void test_notes_round_trip(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    exec_trace *notes = exec_trace_new();
    dg_trace_event e = {DG_TRACE_OP, "a \"quoted\" node", "MatMul", "", "/job:ps/replica:0/task:0/device:CPU:0", "",
                        105000, 106000, 0, 3};
    exec_trace_add(notes, &e);
    size_t len = 0;
    // The task got the request at 104000 and answered at 107000 on its clock; the master sent
    // at 1000 and got the answer at 4200 on its own.
    char *blob = rt_trace_blob_encode_notes(notes, 104000, 107000, &len);
    dg_step_trace *t = step_trace_new(0);
    assert_true(step_trace_add_remote(t, blob, len, PS, WK, "RUN_GRAPH", 1000, 4200, st));
    assert_ok(st);
    step_trace_finish(t, 5000);
    int64_t off = 1, unc = 1;
    assert_string_equal(dg_step_trace_task(t, 0, &off, &unc), WK);   // the asking side: this clock
    assert_int_equal(off, 0);
    assert_int_equal(unc, 0);
    assert_string_equal(dg_step_trace_task(t, 1, &off, &unc), PS);
    assert_int_equal(off, ((104000 - 1000) + (107000 - 4200)) / 2);   // 102900
    assert_int_equal(unc, ((4200 - 1000) - (107000 - 104000)) / 2);  // 100
    bool found = false;
    for (int i = 0; i < dg_step_trace_num_events(t); i++) {
        const dg_trace_event *x = dg_step_trace_event(t, i);
        if (x->kind != DG_TRACE_OP) continue;
        found = true;
        assert_string_equal(x->name, "a \"quoted\" node");
        assert_string_equal(x->task, PS);
        assert_int_equal(x->start_ns, 105000 - 102900);
        assert_int_equal(x->end_ns, 106000 - 102900);
        assert_int_equal(x->thread, 3);
    }
    assert_true(found);
    assert_int_equal(dg_step_trace_step_ns(t), 5000);
    dg_step_trace_free(&t);
    free(blob);
    exec_trace_free(&notes);
    dg_status_free(&st);
}

static char *pack(void (*fill)(msgpack_packer *pk), size_t *len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    fill(&pk);
    *len = sb.size;
    return sb.data;
}

static void key(msgpack_packer *pk, const char *k) {
    msgpack_pack_str(pk, strlen(k));
    msgpack_pack_str_body(pk, k, strlen(k));
}

// A map of n_keys keys, the first two "recv" and "reply".
static void times(msgpack_packer *pk, uint32_t n_keys, int64_t recv, int64_t reply) {
    msgpack_pack_map(pk, n_keys);
    key(pk, "recv");
    msgpack_pack_int64(pk, recv);
    key(pk, "reply");
    msgpack_pack_int64(pk, reply);
}

static void fill_no_events(msgpack_packer *pk) { times(pk, 2, 1, 2); }

static void fill_times_reversed(msgpack_packer *pk) {
    times(pk, 3, 10, 2);
    key(pk, "ev");
    msgpack_pack_array(pk, 0);
}

static void fill_short_event(msgpack_packer *pk) {
    times(pk, 3, 1, 2);
    key(pk, "ev");
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, 0);
    key(pk, "x");
    key(pk, "y");
}

static void fill_bad_kind(msgpack_packer *pk) {
    times(pk, 3, 1, 2);
    key(pk, "ev");
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 10);
    msgpack_pack_int(pk, 99);   // no such kind
    for (int k = 0; k < 5; k++) key(pk, "s");
    msgpack_pack_int64(pk, 5);
    msgpack_pack_int64(pk, 4);   // ends before it starts, too
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_int(pk, 1);
}

// A declared count of four billion events in a few bytes: refused before anything is allocated.
static void fill_huge_count(msgpack_packer *pk) {
    times(pk, 3, 1, 2);
    key(pk, "ev");
    msgpack_pack_array(pk, 0xFFFFFFFFu);
}

static void test_bad_notes(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    void (*fills[])(msgpack_packer *) = {fill_no_events, fill_times_reversed, fill_short_event, fill_bad_kind,
                                         fill_huge_count};
    for (size_t i = 0; i < sizeof fills / sizeof *fills; i++) {
        size_t len = 0;
        char *blob = pack(fills[i], &len);
        dg_step_trace *t = step_trace_new(0);
        assert_false(step_trace_add_remote(t, blob, len, PS, WK, "RUN_GRAPH", 0, 10, st));
        assert_status(st, DG_INVALID_ARGUMENT, PS);
        step_trace_finish(t, 10);
        assert_int_equal(dg_step_trace_num_events(t), 0);
        dg_step_trace_free(&t);
        free(blob);
        dg_status_reset(st);
    }
    // Random bytes, and every truncation of a good blob.
    exec_trace *notes = exec_trace_new();
    dg_trace_event e = {DG_TRACE_OP, "n", "Add", "", "d", "", 1, 2, 0, 1};
    exec_trace_add(notes, &e);
    size_t len = 0;
    char *good = rt_trace_blob_encode_notes(notes, 1, 3, &len);
    for (size_t cut = 0; cut < len; cut++) {
        dg_step_trace *t = step_trace_new(0);
        assert_false(step_trace_add_remote(t, good, cut, PS, WK, "RUN_GRAPH", 0, 10, st));
        assert_status(st, DG_INVALID_ARGUMENT, PS);
        dg_step_trace_free(&t);
        dg_status_reset(st);
    }
    uint64_t seed = 7;
    unsigned char junk[256];
    for (int round = 0; round < 200; round++) {
        for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)dg_test_uniform(&seed, 0, 256);
        dg_step_trace *t = step_trace_new(0);
        bool ok = step_trace_add_remote(t, junk, 1 + (size_t)round % sizeof junk, PS, WK, "RUN_GRAPH", 0, 10, st);
        if (!ok) assert_status(st, DG_INVALID_ARGUMENT, PS);
        dg_step_trace_free(&t);
        dg_status_reset(st);
    }
    free(good);
    exec_trace_free(&notes);
    dg_status_free(&st);
}

static void test_write_errors(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_step_trace *t = step_trace_new(0);
    dg_trace_event e = {DG_TRACE_MASTER, "compile", "", WK, "", "", 1, 2, 0, 1};
    step_trace_add(t, &e);
    step_trace_finish(t, 10);
    assert_false(dg_step_trace_write_chrome(t, "/nonexistent-dir/trace.json", st));
    assert_status(st, DG_FAILED_PRECONDITION, "/nonexistent-dir/trace.json");
    dg_status_reset(st);
    assert_false(dg_step_trace_write_chrome(NULL, "/tmp/x.json", st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    dg_status_reset(st);
    if (access("/dev/full", W_OK) == 0) {   // a full disk
        assert_false(dg_step_trace_write_chrome(t, "/dev/full", st));
        assert_status(st, DG_RESOURCE_EXHAUSTED, "/dev/full");
    }
    dg_step_trace_free(&t);
    dg_step_trace_free(&t);   // NULL: nothing
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_trace),
        cmocka_unit_test(test_cluster_trace),
        cmocka_unit_test(test_notes_round_trip),
        cmocka_unit_test(test_bad_notes),
        cmocka_unit_test(test_write_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
