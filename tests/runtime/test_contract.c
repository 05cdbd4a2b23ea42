/* The C contract of the public interface (include/distgraph/distgraph.h): a call that
 * succeeds leaves its status OK, whatever the status held before, as TensorFlow's C API does
 * (TF_SetStatus(TF_OK) on entry). Without it a status reused after a failure misreads: the
 * caller tests the return value, then prints an old message. Each family is tried with a
 * failure first, then a success on the same status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

// st carries an earlier, unrelated failure.
static void dirty(dg_status *st) { dg_status_set(st, DG_INTERNAL, "left over from an earlier call"); }

static void test_status_cleared_on_success(void **state) {
    (void)state;
    dg_status *st = dg_status_new();

    // Cluster: a bad spec, then a good one.
    assert_null(dg_cluster_from_json("{\"ps\": [1]}", st));   // an address must be a string
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    dg_cluster *c = dg_cluster_from_json("{\"ps\": [\"127.0.0.1:1\"]}", st);
    assert_non_null(c);
    assert_ok(st);
    assert_string_equal(dg_status_message(st), "");
    dirty(st);
    assert_non_null(dg_cluster_task_address(c, "ps", 0, st));
    assert_ok(st);
    dg_cluster_free(&c);

    // Device names.
    dg_device_name dn;
    assert_false(dg_device_name_parse("/job:ps/bogus:1", &dn, st));
    assert_int_not_equal(dg_status_code(st), DG_OK);
    assert_true(dg_device_name_parse("/job:ps/task:0", &dn, st));
    assert_ok(st);

    // Tensors.
    float v[2] = {1, 2};
    dirty(st);
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT32, dg_shape1(2), v, st);
    assert_non_null(t);
    assert_ok(st);
    dg_tensor_unref(t);

    // TF_CONFIG.
    dg_tf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    assert_false(dg_tf_config_parse("{\"cluster\": ", &cfg, st));
    assert_int_not_equal(dg_status_code(st), DG_OK);
    assert_true(dg_tf_config_parse("{\"cluster\": {\"worker\": [\"127.0.0.1:1\"]}, \"task\": {\"type\": \"worker\", "
                                   "\"index\": 0}}", &cfg, st));
    assert_ok(st);
    dg_tf_config_clear(&cfg);

    // Graph files: a missing file, then a saved graph.
    char dir[] = "/tmp/dg_contract_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/g.dgraph", dir);
    assert_null(dg_graph_load(path, st));
    assert_int_not_equal(dg_status_code(st), DG_OK);
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(2));
    dg_output y = dg_mul(g, "y", x, x);
    assert_true(dg_graph_save(g, path, st));
    assert_ok(st);
    dirty(st);
    dg_graph *loaded = dg_graph_load(path, st);
    assert_non_null(loaded);
    assert_ok(st);
    dg_graph_free(&loaded);

    // Sessions: a run that fails (the placeholder is not fed), then one that works.
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    assert_ok(st);
    dg_tensor *out = NULL;
    assert_false(dg_session_run(s, NULL, NULL, 0, &y, &out, 1, NULL, 0, st));
    assert_int_not_equal(dg_status_code(st), DG_OK);
    dg_tensor *xv = dg_tensor_from_data(DG_FLOAT32, dg_shape1(2), v, st);
    assert_true(dg_session_run(s, &x, &xv, 1, &y, &out, 1, NULL, 0, st));
    assert_ok(st);
    assert_true(dg_tensor_f32(out)[1] == 4.0f);
    dg_tensor_unref(out);
    dg_tensor_unref(xv);
    dg_session_free(&s);
    dg_graph_free(&g);

    // Checkpoints: a file that is not there (no create), then one made.
    snprintf(path, sizeof path, "%s/ckpt.db", dir);
    assert_null(dg_checkpoint_store_new(path, false, st));
    assert_int_not_equal(dg_status_code(st), DG_OK);
    dg_checkpoint_store *ck = dg_checkpoint_store_new(path, true, st);
    assert_non_null(ck);
    assert_ok(st);
    dirty(st);
    dg_checkpoint_store_free(&ck);
    unlink(path);
    snprintf(path, sizeof path, "%s/g.dgraph", dir);
    unlink(path);
    rmdir(dir);

    // Servers: a port that is taken, then one that is free.
    int port = dg_test_free_port();
    char spec[64];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d", port);
    dg_cluster *c1 = dg_cluster_from_spec_string(spec, st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *a = dg_server_new(c1, "worker", 0, &so, st);
    assert_non_null(a);
    assert_null(dg_server_new(c1, "worker", 0, &so, st));   // the address is in use
    assert_int_equal(dg_status_code(st), DG_UNAVAILABLE);
    dg_server_free(&a);
    dg_server *b = dg_server_new(c1, "worker", 0, &so, st);
    assert_non_null(b);
    assert_ok(st);
    dg_server_free(&b);
    dg_cluster_free(&c1);

    // Datasets: a bad batch size, then a good one; each iterator call on a dirty status.
    dg_tensor *rows = dg_tensor_new_zeros(DG_INT64, dg_shape1(3), st);
    assert_null(dg_dataset_batch(dg_dataset_from_tensors(&rows, 1, st), 0, false, st));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    dg_dataset *ds = dg_dataset_batch(dg_dataset_from_tensors(&rows, 1, st), 2, false, st);
    assert_non_null(ds);
    assert_ok(st);
    dirty(st);
    dg_iterator *it = dg_iterator_new(ds, st);
    assert_ok(st);
    dg_element e = {0};
    bool end;
    dirty(st);
    assert_true(dg_iterator_next(it, &e, &end, st));
    assert_ok(st);
    unsigned char *bytes;
    size_t nb;
    dirty(st);
    assert_true(dg_iterator_save(it, &bytes, &nb, st));
    assert_ok(st);
    dirty(st);
    assert_true(dg_iterator_restore(it, bytes, nb, st));
    assert_ok(st);
    free(bytes);
    dg_element_clear(&e);
    dg_iterator_free(&it);
    dg_dataset_free(&ds);
    dg_tensor_unref(rows);

    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_cleared_on_success),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
