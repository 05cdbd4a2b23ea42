/* Tests for graph/partitioned.c: the partitioners against results worked out by hand from
 * TensorFlow's partitioned_variables.py, every variable they cannot split (a graph error
 * naming the variable, n = 0), the parts' names, shapes, offsets and slice attributes, reuse,
 * the initializers of the parts (a whole DG_INIT_TENSOR value cut into rows, distinct seeds,
 * glorot scaled by the full shape), the replica device setter spreading the parts, the
 * attributes through graph serialization, and a training step through the parts. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"

static int parts_of(dg_partitioner p, dg_dtype dt, dg_shape sh) {
    dg_status *st = dg_status_new();
    int n = dg_partitioner_num_parts(p, dt, sh, st);
    if (n < 0) fail_msg("num_parts: %s", dg_status_message(st));
    assert_ok(st);
    dg_status_free(&st);
    return n;
}

static void expect_bad(dg_partitioner p, dg_dtype dt, dg_shape sh, const char *needle) {
    dg_status *st = dg_status_new();
    assert_int_equal(dg_partitioner_num_parts(p, dt, sh, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, needle);
    dg_status_free(&st);
}

// ---- the partitioners ----
static void test_fixed_size(void **state) {
    (void)state;
    assert_int_equal(parts_of(dg_fixed_size_partitioner(3), DG_FLOAT32, dg_shape2(10, 3)), 3);
    assert_int_equal(parts_of(dg_fixed_size_partitioner(1), DG_FLOAT32, dg_shape1(7)), 1);
    assert_int_equal(parts_of(dg_fixed_size_partitioner(64), DG_INT64, dg_shape2(1000, 2)), 64);
    // TensorFlow: min(num_shards, rows).
    assert_int_equal(parts_of(dg_fixed_size_partitioner(5), DG_FLOAT32, dg_shape2(3, 2)), 3);
    assert_int_equal(parts_of(dg_fixed_size_partitioner(2), DG_FLOAT64, dg_shape3(2, 4, 4)), 2);
}

static void test_min_max(void **state) {
    (void)state;
    // max(1, min(rows, max_partitions, ceil(bytes / min_slice_size))), worked by hand.
    // TensorFlow's docstring: float32 [1024, 1024] with 256 KiB slices is 16 parts...
    dg_shape big = dg_shape2(1024, 1024);
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(16, 256 << 10), DG_FLOAT32, big), 16);
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(64, 256 << 10), DG_FLOAT32, big), 16);
    // ... or max_partitions when fewer.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(8, 256 << 10), DG_FLOAT32, big), 8);
    // float32 [10, 3]: 120 bytes; / 50 = 2.4 -> 3.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(4, 50), DG_FLOAT32, dg_shape2(10, 3)), 3);
    // 120 / 1000 = 0.12 -> 1.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(4, 1000), DG_FLOAT32, dg_shape2(10, 3)), 1);
    // float32 [8, 4]: 128 bytes / 32 = 4 exactly, not 5.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(10, 32), DG_FLOAT32, dg_shape2(8, 4)), 4);
    // float64 [10, 3]: 240 / 8 = 30, capped by the 10 rows.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(40, 8), DG_FLOAT64, dg_shape2(10, 3)), 10);
    // int64 [7]: 56 / 16 = 3.5 -> 4.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(5, 16), DG_INT64, dg_shape1(7)), 4);
    // uint8 [100]: 100 / 30 -> 4; bool likewise (1 byte).
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(9, 30), DG_UINT8, dg_shape1(100)), 4);
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(9, 30), DG_BOOL, dg_shape1(100)), 4);
    // No rows: max(1, min(0, ...)) = 1 part of 0 rows.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(4, 1), DG_FLOAT32, dg_shape2(0, 4)), 1);
    // The default of TensorFlow (max_partitions 1): one part.
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(1, 256 << 10), DG_FLOAT32, big), 1);
    // A byte count beyond int64 is just "many".
    int64_t huge[3] = {40, INT64_C(1) << 40, INT64_C(1) << 40};
    assert_int_equal(parts_of(dg_min_max_variable_partitioner(7, 1), DG_FLOAT64, dg_shape_make(3, huge)), 7);
}

static void test_partitioner_errors(void **state) {
    (void)state;
    expect_bad(dg_fixed_size_partitioner(2), DG_FLOAT32, dg_shape_scalar(), "rank 1 or more");
    expect_bad(dg_min_max_variable_partitioner(2, 4), DG_FLOAT32, dg_shape_scalar(), "rank 1 or more");
    expect_bad(dg_fixed_size_partitioner(2), DG_FLOAT32, dg_shape2(-1, 3), "not fully defined");
    expect_bad(dg_fixed_size_partitioner(0), DG_FLOAT32, dg_shape2(4, 3), "num_shards must be 1 to 64");
    expect_bad(dg_fixed_size_partitioner(-3), DG_FLOAT32, dg_shape2(4, 3), "num_shards must be 1 to 64");
    expect_bad(dg_fixed_size_partitioner(65), DG_FLOAT32, dg_shape2(100, 3), "num_shards must be 1 to 64");
    expect_bad(dg_fixed_size_partitioner(2), DG_FLOAT32, dg_shape2(0, 3), "0 rows");
    expect_bad(dg_min_max_variable_partitioner(0, 16), DG_FLOAT32, dg_shape2(4, 3), "must be >= 1");
    expect_bad(dg_min_max_variable_partitioner(4, 0), DG_FLOAT32, dg_shape2(4, 3), "must be >= 1");
    expect_bad(dg_min_max_variable_partitioner(1000, 4), DG_FLOAT32, dg_shape2(100, 1), "needs 100 parts");
    expect_bad(dg_fixed_size_partitioner(2), DG_INVALID_DTYPE, dg_shape2(4, 3), "invalid dtype");
    dg_partitioner zero;
    memset(&zero, 0, sizeof zero);
    expect_bad(zero, DG_FLOAT32, dg_shape2(4, 3), "not a partitioner");
}

// Each refusal through the builder: a graph error naming the variable and the reason, n = 0.
static void expect_variable_error(dg_shape sh, dg_partitioner p, dg_code code, const char *needle) {
    dg_graph *g = dg_graph_new();
    dg_partitioned_variable pv = dg_partitioned_variable_new(g, "emb", DG_FLOAT32, sh, dg_init_zeros(), p);
    assert_int_equal(pv.n, 0);
    assert_null(pv.parts[0].node);
    assert_status(dg_graph_status(g), code, "partitioned variable \"emb\"");
    assert_status(dg_graph_status(g), code, needle);
    assert_int_equal(dg_graph_collection_size(g, DG_GLOBAL_VARIABLES), 0);
    // Later builders do nothing, and a second partitioned variable is refused quietly.
    pv = dg_partitioned_variable_new(g, "other", DG_FLOAT32, dg_shape2(4, 4), dg_init_zeros(),
                                     dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    assert_status(dg_graph_status(g), code, "\"emb\"");
    dg_graph_free(&g);
}

static void test_builder_errors(void **state) {
    (void)state;
    expect_variable_error(dg_shape_scalar(), dg_fixed_size_partitioner(2), DG_INVALID_ARGUMENT, "rank 1 or more");
    expect_variable_error(dg_shape2(0, 3), dg_fixed_size_partitioner(2), DG_INVALID_ARGUMENT, "0 rows");
    expect_variable_error(dg_shape2(4, 3), dg_fixed_size_partitioner(0), DG_INVALID_ARGUMENT, "num_shards");
    expect_variable_error(dg_shape2(400, 3), dg_fixed_size_partitioner(DG_MAX_PARTITIONS + 1), DG_INVALID_ARGUMENT,
                          "num_shards must be 1 to 64");
    expect_variable_error(dg_shape2(4, 3), dg_min_max_variable_partitioner(4, -1), DG_INVALID_ARGUMENT, ">= 1");
    expect_variable_error(dg_shape2(1000, 1), dg_min_max_variable_partitioner(100, 1), DG_INVALID_ARGUMENT,
                          "more than DG_MAX_PARTITIONS");

    // A whole value of another shape for DG_INIT_TENSOR.
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    double v[6] = {0};
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, dg_shape2(2, 3), v, st);
    assert_ok(st);
    dg_partitioned_variable pv = dg_partitioned_variable_new(g, "w", DG_FLOAT64, dg_shape2(4, 3), dg_init_tensor(t),
                                                             dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "partitioned variable \"w\": the initial value is float64 [2,3]");
    dg_graph_free(&g);
    // ... and of another dtype.
    g = dg_graph_new();
    pv = dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(2, 3), dg_init_tensor(t), dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "float64 [2,3], the variable float32 [2,3]");
    dg_graph_free(&g);
    dg_tensor_unref(t);

    // An empty name; a name in use (the whole variable's, or its first part's).
    g = dg_graph_new();
    pv = dg_partitioned_variable_new(g, "", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros(), dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "the name is empty");
    dg_graph_free(&g);
    g = dg_graph_new();
    dg_variable(g, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros());
    pv = dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros(), dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    assert_status(dg_graph_status(g), DG_ALREADY_EXISTS, "\"w\" already exists");
    dg_graph_free(&g);
    g = dg_graph_new();
    pv = dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros(), dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 2);
    pv = dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros(), dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    assert_status(dg_graph_status(g), DG_ALREADY_EXISTS, "\"w/part_0\" already exists");
    dg_graph_free(&g);
    // A NULL graph is not a crash.
    pv = dg_partitioned_variable_new(NULL, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros(), dg_fixed_size_partitioner(2));
    assert_int_equal(pv.n, 0);
    dg_status_free(&st);
}

// ---- parts: names, shapes, offsets, attributes ----
static void expect_parts(const dg_partitioned_variable *pv, const char *full, const int64_t *rows, int n) {
    assert_int_equal(pv->n, n);
    int64_t at = 0;
    char name[128], a[64];
    for (int i = 0; i < n; i++) {
        dg_node *v = pv->parts[i].node;
        assert_non_null(v);
        snprintf(name, sizeof name, "%s/part_%d", full, i);
        assert_string_equal(dg_node_name(v), name);
        assert_string_equal(dg_node_op_type(v), "VariableV2");
        dg_shape want = pv->full_shape;
        want.dims[0] = rows[i];
        dg_shape got = dg_node_output_shape(v, 0);
        if (!dg_shape_equal(&got, &want)) fail_msg("%s: shape %s", name, dg_shape_str(&got, a, sizeof a));
        assert_int_equal(pv->offsets[i], at);
        // The attributes, read raw and through dg_variable_save_slice.
        assert_string_equal(dg_node_attr_string(v, "_save_slice_full_name"), full);
        dg_shape fs;
        assert_true(dg_node_attr_shape(v, "_save_slice_full_shape", &fs));
        assert_true(dg_shape_equal(&fs, &pv->full_shape));
        int n_off = 0;
        const int64_t *off = graph_node_attr_ints(v, "_save_slice_offset", &n_off);
        assert_non_null(off);
        assert_int_equal(n_off, pv->full_shape.rank);
        assert_int_equal(off[0], at);
        for (int d = 1; d < n_off; d++) assert_int_equal(off[d], 0);
        dg_status *st = dg_status_new();
        dg_variable_slice sl;
        assert_int_equal(dg_variable_save_slice(v, &sl, st), 1);
        assert_ok(st);
        assert_string_equal(sl.full_name, full);
        assert_true(dg_shape_equal(&sl.full_shape, &pv->full_shape));
        assert_int_equal(sl.offset[0], at);
        dg_status_free(&st);
        at += rows[i];
    }
    assert_int_equal(pv->offsets[n], at);
    assert_int_equal(at, pv->full_shape.dims[0]);
}

static void test_parts(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_partitioned_variable a = dg_partitioned_variable_new(g, "emb", DG_FLOAT32, dg_shape2(10, 3), dg_init_zeros(),
                                                            dg_fixed_size_partitioner(3));
    static const int64_t rows_a[] = {4, 3, 3};
    expect_parts(&a, "emb", rows_a, 3);
    assert_int_equal(a.dtype, DG_FLOAT32);
    dg_partitioned_variable b = dg_partitioned_variable_new(g, "b", DG_FLOAT64, dg_shape2(10, 3), dg_init_ones(),
                                                            dg_fixed_size_partitioner(4));
    static const int64_t rows_b[] = {3, 3, 2, 2};
    expect_parts(&b, "b", rows_b, 4);
    dg_partitioned_variable c = dg_partitioned_variable_new(g, "c", DG_INT64, dg_shape3(5, 2, 2), dg_init_zeros(),
                                                            dg_fixed_size_partitioner(5));
    static const int64_t rows_c[] = {1, 1, 1, 1, 1};
    expect_parts(&c, "c", rows_c, 5);
    // More shards than rows: one row a part (TensorFlow's min(num_shards, rows)).
    dg_partitioned_variable d = dg_partitioned_variable_new(g, "d", DG_FLOAT32, dg_shape1(2), dg_init_zeros(),
                                                            dg_fixed_size_partitioner(6));
    static const int64_t rows_d[] = {1, 1};
    expect_parts(&d, "d", rows_d, 2);
    // A variable scope names the full variable.
    dg_graph_push_variable_scope(g, "model", false);
    dg_partitioned_variable e = dg_partitioned_variable_new(g, "e", DG_FLOAT32, dg_shape2(7, 2), dg_init_zeros(),
                                                            dg_min_max_variable_partitioner(3, 16));
    static const int64_t rows_e[] = {3, 2, 2};   // 56 bytes / 16 -> 4, capped at 3
    expect_parts(&e, "model/e", rows_e, 3);
    assert_non_null(dg_graph_find(g, "model/e/part_2/Assign"));
    dg_graph_pop_variable_scope(g);
    assert_ok(dg_graph_status(g));
    // Every part is an ordinary variable: global and trainable, with an initializer.
    assert_int_equal(dg_graph_collection_size(g, DG_GLOBAL_VARIABLES), 3 + 4 + 5 + 2 + 3);
    assert_int_equal(dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES), 3 + 4 + 5 + 2 + 3);
    assert_non_null(dg_variable_initializer(a.parts[2]));

    // An ordinary variable has no slice; malformed attributes are an error naming it.
    dg_status *st = dg_status_new();
    dg_output plain = dg_variable(g, "plain", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros());
    dg_variable_slice sl;
    assert_int_equal(dg_variable_save_slice(plain.node, &sl, st), 0);
    assert_ok(st);
    assert_int_equal(dg_variable_save_slice(dg_variable_initializer(plain), &sl, st), 0);
    graph_set_attr_string(plain.node, "_save_slice_full_name", "big");
    assert_int_equal(dg_variable_save_slice(plain.node, &sl, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "variable \"plain\": bad save-slice attributes (no fully defined full shape)");
    graph_set_attr_shape(plain.node, "_save_slice_full_shape", dg_shape2(6, 3));
    int64_t off[2] = {3, 0};
    graph_set_attr_ints(plain.node, "_save_slice_offset", off, 2);
    assert_int_equal(dg_variable_save_slice(plain.node, &sl, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "does not fit the full shape");
    off[0] = 2;
    graph_set_attr_ints(plain.node, "_save_slice_offset", off, 2);
    assert_int_equal(dg_variable_save_slice(plain.node, &sl, st), 1);
    assert_ok(st);
    assert_int_equal(sl.offset[0], 2);
    graph_set_attr_ints(plain.node, "_save_slice_offset", off, 1);
    assert_int_equal(dg_variable_save_slice(plain.node, &sl, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "ranks");
    dg_status_free(&st);
    dg_graph_free(&g);
}

static void test_reuse(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_variable_scope(g, "s", false);
    dg_partitioned_variable a = dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(9, 2), dg_init_zeros(),
                                                            dg_fixed_size_partitioner(2));
    dg_graph_pop_variable_scope(g);
    assert_int_equal(a.n, 2);
    int n_nodes = dg_graph_num_nodes(g);
    dg_graph_push_variable_scope(g, "s", true);
    dg_partitioned_variable b = dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(9, 2), dg_init_zeros(),
                                                            dg_fixed_size_partitioner(2));
    assert_ok(dg_graph_status(g));
    assert_int_equal(b.n, 2);
    assert_ptr_equal(b.parts[0].node, a.parts[0].node);
    assert_ptr_equal(b.parts[1].node, a.parts[1].node);
    assert_int_equal(b.offsets[1], 5);
    assert_int_equal(dg_graph_num_nodes(g), n_nodes);
    dg_graph_pop_variable_scope(g);
    dg_graph_free(&g);

    static const struct {
        const char *name;
        dg_shape shape;
        dg_dtype dtype;
        int shards;
        dg_code code;
        const char *needle;
    } bad[] = {
        {"nope", {2, {9, 2}}, DG_FLOAT32, 2, DG_NOT_FOUND, "\"s/nope/part_0\" is missing"},
        {"w", {2, {9, 3}}, DG_FLOAT32, 2, DG_INVALID_ARGUMENT, "is float32 [9,2], asked for float32 [9,3]"},
        {"w", {2, {9, 2}}, DG_FLOAT64, 2, DG_INVALID_ARGUMENT, "asked for float64"},
        {"w", {2, {9, 2}}, DG_FLOAT32, 3, DG_INVALID_ARGUMENT, "reuse with 3 parts, but it has 2"},
        {"w", {2, {9, 2}}, DG_FLOAT32, 1, DG_INVALID_ARGUMENT, "reuse with 1 parts, but it has 2"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        g = dg_graph_new();
        dg_graph_push_variable_scope(g, "s", false);
        dg_partitioned_variable_new(g, "w", DG_FLOAT32, dg_shape2(9, 2), dg_init_zeros(), dg_fixed_size_partitioner(2));
        dg_graph_pop_variable_scope(g);
        dg_graph_push_variable_scope(g, "s", true);
        dg_partitioned_variable r = dg_partitioned_variable_new(g, bad[k].name, bad[k].dtype, bad[k].shape,
                                                                dg_init_zeros(), dg_fixed_size_partitioner(bad[k].shards));
        assert_int_equal(r.n, 0);
        assert_status(dg_graph_status(g), bad[k].code, bad[k].needle);
        dg_graph_free(&g);
    }
    // A plain variable that only has a part's name.
    g = dg_graph_new();
    dg_graph_push_variable_scope(g, "s", false);
    dg_get_variable(g, "x/part_0", DG_FLOAT32, dg_shape2(9, 2), dg_init_zeros());
    dg_graph_pop_variable_scope(g);
    dg_graph_push_variable_scope(g, "s", true);
    dg_partitioned_variable r = dg_partitioned_variable_new(g, "x", DG_FLOAT32, dg_shape2(9, 2), dg_init_zeros(),
                                                            dg_fixed_size_partitioner(1));
    assert_int_equal(r.n, 0);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "\"s/x/part_0\" is not a part of it");
    dg_graph_free(&g);
}

// ---- initializers ----
static void fetch(dg_session *s, const dg_output *outs, int n, dg_tensor **vals) {
    dg_status *st = dg_status_new();
    assert_true(dg_session_run(s, NULL, NULL, 0, outs, vals, n, NULL, 0, st));
    assert_ok(st);
    dg_status_free(&st);
}

static void test_initializers(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    double whole[10 * 3];
    for (int i = 0; i < 30; i++) whole[i] = 100 + i;
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, dg_shape2(10, 3), whole, st);
    assert_ok(st);
    dg_partitioned_variable tv = dg_partitioned_variable_new(g, "t", DG_FLOAT64, dg_shape2(10, 3), dg_init_tensor(t),
                                                             dg_fixed_size_partitioner(3));
    dg_tensor_unref(t);   // the parts hold their own rows
    // Seeded: four equal shapes, each its own draw; the first part keeps the seed.
    dg_partitioned_variable ru = dg_partitioned_variable_new(g, "ru", DG_FLOAT32, dg_shape2(8, 5),
                                                             dg_init_random_uniform(-1, 1, 7),
                                                             dg_fixed_size_partitioner(4));
    dg_output single = dg_variable(g, "single", DG_FLOAT32, dg_shape2(2, 5), dg_init_random_uniform(-1, 1, 7));
    dg_partitioned_variable rn = dg_partitioned_variable_new(g, "rn", DG_FLOAT64, dg_shape2(6, 4),
                                                             dg_init_truncated_normal(0, 1, 3),
                                                             dg_fixed_size_partitioner(2));
    dg_partitioned_variable r0 = dg_partitioned_variable_new(g, "r0", DG_FLOAT32, dg_shape2(6, 4),
                                                             dg_init_random_normal(0, 1, 0),
                                                             dg_fixed_size_partitioner(2));
    // Glorot over the full shape [30, 10]: limit sqrt(6 / 40).
    dg_partitioned_variable gl = dg_partitioned_variable_new(g, "gl", DG_FLOAT32, dg_shape2(30, 10),
                                                             dg_init_glorot_uniform(5), dg_fixed_size_partitioner(3));
    dg_partitioned_variable he = dg_partitioned_variable_new(g, "he", DG_FLOAT32, dg_shape2(30, 10),
                                                             dg_init_he_normal(0), dg_fixed_size_partitioner(3));
    dg_partitioned_variable c = dg_partitioned_variable_new(g, "c", DG_INT32, dg_shape1(5), dg_init_constant(4),
                                                            dg_fixed_size_partitioner(2));
    dg_node *init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "gl/part_%d/Initializer/RandomUniform", i);
        dg_node *r = dg_graph_find(g, name);
        assert_non_null(r);
        double lo, hi;
        assert_true(dg_node_attr_float(r, "a", &lo));
        assert_true(dg_node_attr_float(r, "b", &hi));
        assert_close(hi, sqrt(6.0 / 40), 1e-12, 0);
        assert_close(lo, -(sqrt(6.0 / 40)), 1e-12, 0);
        snprintf(name, sizeof name, "he/part_%d/Initializer/TruncatedNormal", i);
        r = dg_graph_find(g, name);
        assert_non_null(r);
        assert_true(dg_node_attr_float(r, "b", &hi));
        assert_close(hi, sqrt(2.0 / 30) / 0.87962566103423978, 1e-12, 0);
    }
    int64_t s0 = 0, s1 = 0;
    assert_true(dg_node_attr_int(dg_graph_find(g, "ru/part_0/Initializer/RandomUniform"), "seed2", &s0));
    assert_true(dg_node_attr_int(dg_graph_find(g, "ru/part_1/Initializer/RandomUniform"), "seed2", &s1));
    assert_int_equal(s0, 7);
    assert_true(s1 != 7 && s1 > 0);

    dg_session *s = dg_test_local_session(g, 1, 2, st);
    assert_true(dg_session_run_target(s, init, st));
    assert_ok(st);
    dg_tensor *v[4] = {NULL};
    fetch(s, tv.parts, 3, v);
    for (int i = 0; i < 3; i++) {
        const double *p = dg_tensor_f64(v[i]);
        for (int64_t r = tv.offsets[i]; r < tv.offsets[i + 1]; r++)
            for (int k = 0; k < 3; k++) assert_true(p[(r - tv.offsets[i]) * 3 + k] == whole[r * 3 + k]);
        dg_tensor_free(&v[i]);
    }
    fetch(s, ru.parts, 4, v);
    dg_tensor *sv = NULL;
    fetch(s, &single, 1, &sv);
    // Part 0 draws what an unpartitioned variable of its shape and seed draws.
    assert_memory_equal(dg_tensor_data(v[0]), dg_tensor_data(sv), dg_tensor_nbytes(sv));
    dg_tensor_free(&sv);
    for (int i = 0; i < 4; i++) {
        const float *p = dg_tensor_f32(v[i]);
        for (int k = 0; k < 10; k++) assert_true(p[k] >= -1 && p[k] < 1);
        for (int j = 0; j < i; j++)
            assert_true(memcmp(dg_tensor_data(v[i]), dg_tensor_data(v[j]), dg_tensor_nbytes(v[i])) != 0);
    }
    for (int i = 0; i < 4; i++) dg_tensor_free(&v[i]);
    fetch(s, rn.parts, 2, v);
    assert_true(memcmp(dg_tensor_data(v[0]), dg_tensor_data(v[1]), dg_tensor_nbytes(v[0])) != 0);
    dg_tensor_free(&v[0]);
    dg_tensor_free(&v[1]);
    fetch(s, r0.parts, 2, v);
    assert_true(memcmp(dg_tensor_data(v[0]), dg_tensor_data(v[1]), dg_tensor_nbytes(v[0])) != 0);
    dg_tensor_free(&v[0]);
    dg_tensor_free(&v[1]);
    fetch(s, c.parts, 2, v);
    assert_int_equal(dg_tensor_num_elements(v[0]), 3);
    assert_int_equal(dg_tensor_num_elements(v[1]), 2);
    assert_int_equal(dg_tensor_i32(v[1])[1], 4);
    dg_tensor_free(&v[0]);
    dg_tensor_free(&v[1]);
    fetch(s, gl.parts, 3, v);
    for (int i = 0; i < 3; i++) {
        const float *p = dg_tensor_f32(v[i]);
        for (int64_t k = 0; k < dg_tensor_num_elements(v[i]); k++) assert_true(fabsf(p[k]) <= (float)sqrt(6.0 / 40));
        dg_tensor_free(&v[i]);
    }
    fetch(s, he.parts, 3, v);
    for (int i = 0; i < 3; i++) dg_tensor_free(&v[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// ---- device placement, serialization, training ----
static void test_replica_device_setter(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    dg_device_fn *fn = dg_replica_device_setter_new(&o, st);
    assert_ok(st);
    dg_graph_push_device_fn(g, fn);
    dg_partitioned_variable pv = dg_partitioned_variable_new(g, "emb", DG_FLOAT32, dg_shape2(10, 3), dg_init_zeros(),
                                                             dg_fixed_size_partitioner(3));
    dg_output after = dg_variable(g, "after", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    dg_graph_pop_device_fn(g);
    assert_ok(dg_graph_status(g));
    // Round robin over the ps tasks, as for any variables; the initializers follow their part.
    assert_string_equal(dg_node_requested_device(pv.parts[0].node), "/job:ps/task:0");
    assert_string_equal(dg_node_requested_device(pv.parts[1].node), "/job:ps/task:1");
    assert_string_equal(dg_node_requested_device(pv.parts[2].node), "/job:ps/task:0");
    assert_string_equal(dg_node_requested_device(after.node), "/job:ps/task:1");
    assert_string_equal(dg_node_requested_device(dg_variable_initializer(pv.parts[1])), "/job:ps/task:1");
    dg_device_fn_free(&fn);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_serialize(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_partitioned_variable pv = dg_partitioned_variable_new(g, "emb", DG_FLOAT64, dg_shape3(7, 2, 3),
                                                             dg_init_zeros(), dg_fixed_size_partitioner(3));
    assert_int_equal(pv.n, 3);
    char *buf = NULL;
    size_t len = 0;
    assert_true(dg_graph_to_msgpack(g, &buf, &len, st));
    assert_ok(st);
    dg_graph *h = dg_graph_from_msgpack(buf, len, st);
    assert_ok(st);
    assert_non_null(h);
    free(buf);
    for (int i = 0; i < 3; i++) {
        dg_variable_slice sl;
        dg_node *v = dg_graph_find(h, dg_node_name(pv.parts[i].node));
        assert_non_null(v);
        assert_int_equal(dg_variable_save_slice(v, &sl, st), 1);
        assert_string_equal(sl.full_name, "emb");
        dg_shape want = dg_shape3(7, 2, 3);
        assert_true(dg_shape_equal(&sl.full_shape, &want));
        assert_int_equal(sl.offset[0], pv.offsets[i]);
        assert_int_equal(sl.offset[1], 0);
        assert_int_equal(sl.offset[2], 0);
    }
    dg_graph_free(&h);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_training_step(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    double whole[5 * 2] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, dg_shape2(5, 2), whole, st);
    dg_partitioned_variable pv = dg_partitioned_variable_new(g, "w", DG_FLOAT64, dg_shape2(5, 2), dg_init_tensor(t),
                                                             dg_fixed_size_partitioner(2));
    dg_tensor_unref(t);
    // loss = sum(concat(parts)^2): each element x steps to x - 0.1 * 2x = 0.8x.
    dg_output all = dg_concat(g, "all", pv.parts, pv.n, 0);
    dg_output loss = dg_sum(g, "loss", dg_square(g, NULL, all), NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    dg_node *init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    dg_session *s = dg_test_local_session(g, 2, 2, st);
    assert_true(dg_session_run_target(s, init, st));
    assert_true(dg_session_run_target(s, train, st));
    assert_ok(st);
    dg_tensor *v = NULL;
    fetch(s, &all, 1, &v);
    for (int i = 0; i < 10; i++) assert_close(dg_tensor_f64(v)[i], 0.8 * whole[i], 1e-12, 0);
    dg_tensor_free(&v);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_size),
        cmocka_unit_test(test_min_max),
        cmocka_unit_test(test_partitioner_errors),
        cmocka_unit_test(test_builder_errors),
        cmocka_unit_test(test_parts),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_initializers),
        cmocka_unit_test(test_replica_device_setter),
        cmocka_unit_test(test_serialize),
        cmocka_unit_test(test_training_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
