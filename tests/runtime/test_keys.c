/* Key directories (runtime/transport/keys.c): generated pairs read back, members admitted by
 * key, a task's key found by address, and every unsafe or malformed directory or file refused
 * with a status naming it. Then two real servers sharing a directory: a session between them
 * runs, and a client whose key is not in the directory gets nothing. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "keys_impl.h"
#include "server_impl.h"
#include "transport_impl.h"

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/dg-test-keys-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_text(const char *name, const char *text, mode_t mode) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_generate_and_read(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char name[64];
    rt_key_name_of("tcp://127.0.0.1:2222", name, sizeof name);
    assert_string_equal(name, "127.0.0.1_2222");
    rt_key_name_of("dg://[::1]:7", name, sizeof name);
    assert_string_equal(name, "___1__7");
    assert_true(rt_keyring_generate(dir, "127.0.0.1_2222", st));
    assert_true(rt_keyring_generate(dir, "client", st));
    assert_false(rt_keyring_generate(dir, "client", st));   // never overwritten
    assert_status(st, DG_ALREADY_EXISTS, "client.key");
    dg_status_reset(st);
    assert_false(rt_keyring_generate(dir, "../evil", st));
    assert_status(st, DG_INVALID_ARGUMENT, "letters, digits");
    dg_status_reset(st);
    rt_keyring *k = rt_keyring_load(dir, st);
    assert_ok(st);
    assert_non_null(k);
    assert_int_equal(rt_keyring_size(k), 2);
    char pub[RT_KEY_Z85], sec[RT_KEY_Z85], server[RT_KEY_Z85];
    assert_true(rt_keyring_pair(k, "client", pub, sec, st));
    uint8_t raw[32], derived[41];
    assert_non_null(zmq_z85_decode(raw, pub));
    assert_true(rt_keyring_allows(k, raw));
    assert_int_equal(zmq_curve_public((char *)derived, sec), 0);   // the pair belongs together
    assert_string_equal((char *)derived, pub);
    assert_true(rt_keyring_server_key(k, "tcp://127.0.0.1:2222", server, st));
    assert_string_not_equal(server, pub);
    assert_false(rt_keyring_server_key(k, "tcp://127.0.0.1:2223", server, st));
    assert_status(st, DG_NOT_FOUND, "127.0.0.1_2223.pub");
    dg_status_reset(st);
    memset(raw, 7, sizeof raw);
    assert_false(rt_keyring_allows(k, raw));
    rt_keyring_free(&k);
    dg_status_free(&st);
}

static void expect_refused(dg_code code, const char *needle) {
    dg_status *st = dg_status_new();
    rt_keyring *k = rt_keyring_load(dir, st);
    assert_null(k);
    assert_status(st, code, needle);
    dg_status_free(&st);
}

static void test_unsafe_refused(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    expect_refused(DG_NOT_FOUND, "no .key or .pub files");
    assert_true(rt_keyring_generate(dir, "a", st));
    assert_int_equal(chmod(dir, 0777), 0);
    expect_refused(DG_PERMISSION_DENIED, "writable by nobody else");
    assert_int_equal(chmod(dir, 0700), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/a.key", dir);
    assert_int_equal(chmod(path, 0644), 0);
    expect_refused(DG_PERMISSION_DENIED, "a.key: mode 644 lets others read the secret key");
    assert_int_equal(chmod(path, 0600), 0);
    write_text("b.pub", "public tooshort\n", 0644);
    expect_refused(DG_INVALID_ARGUMENT, "b.pub: expected a line \"public <40-character Z85 key>\"");
    write_text("b.pub", "public 0123456789012345678901234567890123456789\n", 0666);
    expect_refused(DG_PERMISSION_DENIED, "b.pub: mode 666 lets others change it");
    snprintf(path, sizeof path, "%s/b.pub", dir);
    unlink(path);
    write_text("c.key", "public 0123456789012345678901234567890123456789\n", 0600);   // no secret line
    expect_refused(DG_INVALID_ARGUMENT, "c.key: expected a second line \"secret");
    snprintf(path, sizeof path, "%s/c.key", dir);
    unlink(path);
    rt_keyring *k = rt_keyring_load(dir, st);   // what is left is fine again
    assert_ok(st);
    assert_int_equal(rt_keyring_size(k), 1);
    rt_keyring_free(&k);
    dg_status_free(&st);
}

// Two servers with a key pair each in one directory: a session across them runs. A client
// whose own pair is not in the directory (it knows the tasks' public keys) gets no answer.
static void test_servers_admit_members_only(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    int p0 = dg_test_free_port(), p1 = dg_test_free_port();
    char spec[128], a0[32], a1[32], n0[64], n1[64];
    snprintf(spec, sizeof spec, "ps|127.0.0.1:%d;worker|127.0.0.1:%d", p0, p1);
    snprintf(a0, sizeof a0, "127.0.0.1:%d", p0);
    snprintf(a1, sizeof a1, "127.0.0.1:%d", p1);
    rt_key_name_of(a0, n0, sizeof n0);
    rt_key_name_of(a1, n1, sizeof n1);
    assert_true(rt_keyring_generate(dir, n0, st) && rt_keyring_generate(dir, n1, st) &&
                rt_keyring_generate(dir, "client", st));
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    dg_server_options o = dg_server_options_default();
    o.quiet = true;
    o.key_dir = dir;
    dg_server *ps = dg_server_new(c, "ps", 0, &o, st);
    assert_ok(st);
    dg_server *wk = dg_server_new(c, "worker", 0, &o, st);
    assert_ok(st);
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0");
    dg_output a = dg_scalar(g, "a", DG_FLOAT64, 3);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output y = dg_mul(g, "y", a, a);
    dg_graph_pop_device(g);
    dg_session *s = dg_session_new(g, dg_server_target(wk), NULL, st);   // worker -> ps, encrypted
    assert_ok(st);
    dg_tensor *yv = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &y, &yv, 1, NULL, 0, st));
    assert_ok(st);
    assert_true(*(double *)dg_tensor_data(yv) == 9.0);
    dg_tensor_unref(yv);
    dg_session_free(&s);

    // A member's client key (DG_KEY_DIR, as tools take it): the task's counters.
    setenv("DG_KEY_DIR", dir, 1);
    dg_server_stats stats;
    char target[64];
    snprintf(target, sizeof target, "dg://%s", a0);
    assert_true(dg_server_query_stats(target, NULL, NULL, 5000, &stats, st));
    assert_ok(st);
    // A stranger: its own directory with its own pair and copies of the tasks' public keys.
    char other[128];
    snprintf(other, sizeof other, "%s/stranger", dir);
    assert_true(rt_keyring_generate(other, "client", st));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp %s/%s.pub %s/%s.pub %s/", dir, n0, dir, n1, other);
    assert_int_equal(system(cmd), 0);
    setenv("DG_KEY_DIR", other, 1);
    assert_false(dg_server_query_stats(target, NULL, NULL, 1500, &stats, st));
    assert_int_equal(dg_status_code(st), DG_UNAUTHENTICATED);   // told by its handshake monitor
    assert_non_null(strstr(dg_status_message(st), "refused this process's CurveZMQ key"));
    dg_status_reset(st);
    unsetenv("DG_KEY_DIR");
    assert_true(rt_transport_get_stats(rt_server_env(ps)->transport).refused_peers >= 1);
    dg_graph_free(&g);
    dg_server_free(&wk);
    dg_server_free(&ps);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_generate_and_read, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_unsafe_refused, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_servers_admit_members_only, make_dir, remove_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
