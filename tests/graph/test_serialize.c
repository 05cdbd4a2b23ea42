/* Tests for graph/serialize.c: graphs round-trip through msgpack exactly (structure, every
 * attribute kind, devices, colocation, initializers, collections) and a reloaded MLP trains to
 * the same losses bit for bit; the loader survives truncation at every length, thousands of
 * random byte mutations and a list of hand-made hostile files, each giving the documented
 * code and a message naming the node and field. Hostile documents are written in a small
 * JSON-like notation (see pack_spec) so each case reads as the file it stands for. */
#include "testutil.h"

#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distgraph/serialize.h"
#include "graph_impl.h"

// ---------------------------------------------------------------------------------------
// A JSON-like notation for msgpack documents: {k: v, ...}, [v, ...], "str" (escapes for
// quote, backslash, \0 and \xNN), integers (-1, 18446744073709551615), floats (1.5), true, false, nil,
// <hex> for a bin, and #hex# for raw bytes taken verbatim as one value.

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void skip_ws(const char **s) {
    while (**s == ' ' || **s == '\n' || **s == '\t' || **s == ':' || **s == ',') (*s)++;
}

static size_t read_hex(const char **s, char end, char *out) {
    size_t n = 0;
    while (**s && **s != end) {
        if (**s == ' ') {
            (*s)++;
            continue;
        }
        int hi = hexval((*s)[0]), lo = hexval((*s)[1]);
        assert_true(hi >= 0 && lo >= 0);
        out[n++] = (char)(hi * 16 + lo);
        *s += 2;
    }
    assert_int_equal(**s, end);
    (*s)++;
    return n;
}

static void pack_value(const char **s, msgpack_sbuffer *out);

static void pack_container(const char **s, msgpack_sbuffer *out, char close, bool is_map) {
    msgpack_sbuffer child;
    msgpack_sbuffer_init(&child);
    size_t count = 0;
    (*s)++;
    for (;;) {
        skip_ws(s);
        if (**s == close) break;
        pack_value(s, &child);
        count++;
    }
    (*s)++;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    if (is_map) {
        assert_int_equal(count % 2, 0);
        msgpack_pack_map(&pk, count / 2);
    } else {
        msgpack_pack_array(&pk, count);
    }
    msgpack_sbuffer_write(out, child.data, child.size);
    msgpack_sbuffer_destroy(&child);
}

static void pack_value(const char **s, msgpack_sbuffer *out) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    skip_ws(s);
    char c = **s;
    if (c == '{' || c == '[') {
        pack_container(s, out, c == '{' ? '}' : ']', c == '{');
        return;
    }
    if (c == '"') {
        char *buf = malloc(strlen(*s) + 1);
        size_t n = 0;
        (*s)++;
        while (**s != '"') {
            assert_true(**s != 0);
            if (**s == '\\') {
                char e = (*s)[1];
                if (e == 'x') {
                    buf[n++] = (char)(hexval((*s)[2]) * 16 + hexval((*s)[3]));
                    *s += 4;
                } else {
                    buf[n++] = e == '0' ? 0 : e;
                    *s += 2;
                }
            } else {
                buf[n++] = *(*s)++;
            }
        }
        (*s)++;
        msgpack_pack_str(&pk, n);
        msgpack_pack_str_body(&pk, buf, n);
        free(buf);
        return;
    }
    if (c == '<' || c == '#') {
        char *buf = malloc(strlen(*s) + 1);
        (*s)++;
        size_t n = read_hex(s, c == '<' ? '>' : '#', buf);
        if (c == '<') {
            msgpack_pack_bin(&pk, n);
            msgpack_pack_bin_body(&pk, buf, n);
        } else {
            msgpack_sbuffer_write(out, buf, n);
        }
        free(buf);
        return;
    }
    if (strncmp(*s, "true", 4) == 0) {
        *s += 4;
        msgpack_pack_true(&pk);
        return;
    }
    if (strncmp(*s, "false", 5) == 0) {
        *s += 5;
        msgpack_pack_false(&pk);
        return;
    }
    if (strncmp(*s, "nil", 3) == 0) {
        *s += 3;
        msgpack_pack_nil(&pk);
        return;
    }
    const char *start = *s;
    size_t n = strspn(start, "-+0123456789.eE");
    assert_true(n > 0);
    char num[64];
    snprintf(num, sizeof num, "%.*s", (int)n, start);
    *s += n;
    if (strpbrk(num, ".eE")) msgpack_pack_double(&pk, strtod(num, NULL));
    else if (num[0] == '-') msgpack_pack_int64(&pk, strtoll(num, NULL, 10));
    else msgpack_pack_uint64(&pk, strtoull(num, NULL, 10));
}

// Packs spec into a new buffer (caller frees).
static char *pack_spec(const char *spec, size_t *len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const char *s = spec;
    // Several top-level values are concatenated (for raw headers followed by their items).
    for (skip_ws(&s); *s; skip_ws(&s)) pack_value(&s, &sb);
    *len = sb.size;
    return msgpack_sbuffer_release(&sb);
}

// A document with the standard header around a nodes list (and optional extra top keys).
#define DOC(nodes) "{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": [" nodes "]}"
#define PH(name) "{\"name\": \"" name "\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": " \
                 "{\"type\": \"float32\"}, \"shape\": {\"shape\": [2, 3]}}}"

// Loads spec; returns the graph (may be NULL) with st set.
static dg_graph *load_spec(const char *spec, dg_status *st) {
    size_t len;
    char *buf = pack_spec(spec, &len);
    dg_graph *g = dg_graph_from_msgpack(buf, len, st);
    free(buf);
    return g;
}

static void expect_error(const char *spec, dg_code code, const char *needle) {
    dg_status *st = dg_status_new();
    dg_graph *g = load_spec(spec, st);
    if (g) print_error("loaded, expected %s \"%s\" for: %s\n", dg_code_name(code), needle, spec);
    assert_null(g);
    assert_status(st, code, needle);
    dg_status_free(&st);
}

static dg_graph *expect_load(const char *spec) {
    dg_status *st = dg_status_new();
    dg_graph *g = load_spec(spec, st);
    assert_ok(st);
    assert_non_null(g);
    dg_status_free(&st);
    return g;
}

// ---------------------------------------------------------------------------------------
// Graph comparison

static void assert_attr_equal(const graph_attr *a, const graph_attr *b) {
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->kind, b->kind);
    switch (a->kind) {
    case GA_INT: assert_true(a->u.i == b->u.i); break;
    case GA_FLOAT: assert_memory_equal(&a->u.f, &b->u.f, sizeof(double)); break;
    case GA_BOOL: assert_int_equal(a->u.b, b->u.b); break;
    case GA_TYPE: assert_int_equal(a->u.type, b->u.type); break;
    case GA_SHAPE: assert_true(dg_shape_equal(&a->u.shape, &b->u.shape)); break;
    case GA_STRING: assert_string_equal(a->u.s, b->u.s); break;
    case GA_INTS:
        assert_int_equal(a->u.ints.n, b->u.ints.n);
        if (a->u.ints.n) assert_memory_equal(a->u.ints.v, b->u.ints.v, (size_t)a->u.ints.n * 8);
        break;
    case GA_TENSOR:
        assert_int_equal(dg_tensor_dtype(a->u.t), dg_tensor_dtype(b->u.t));
        assert_true(dg_shape_equal(dg_tensor_shape(a->u.t), dg_tensor_shape(b->u.t)));
        assert_int_equal(dg_tensor_nbytes(a->u.t), dg_tensor_nbytes(b->u.t));
        if (dg_tensor_nbytes(a->u.t))
            assert_memory_equal(dg_tensor_data(a->u.t), dg_tensor_data(b->u.t), dg_tensor_nbytes(a->u.t));
        break;
    }
}

static void assert_graphs_equal(const dg_graph *a, const dg_graph *b) {
    assert_int_equal(dg_graph_num_nodes(a), dg_graph_num_nodes(b));
    for (int i = 0; i < dg_graph_num_nodes(a); i++) {
        const dg_node *x = dg_graph_node(a, i), *y = dg_graph_node(b, i);
        assert_string_equal(dg_node_name(x), dg_node_name(y));
        assert_string_equal(dg_node_op_type(x), dg_node_op_type(y));
        assert_string_equal(dg_node_requested_device(x), dg_node_requested_device(y));
        assert_string_equal(dg_node_assigned_device(x), dg_node_assigned_device(y));
        assert_int_equal(dg_node_num_inputs(x), dg_node_num_inputs(y));
        for (int k = 0; k < dg_node_num_inputs(x); k++) {
            assert_string_equal(dg_node_name(dg_node_input(x, k).node), dg_node_name(dg_node_input(y, k).node));
            assert_int_equal(dg_node_input(x, k).index, dg_node_input(y, k).index);
        }
        assert_int_equal(dg_node_num_control_inputs(x), dg_node_num_control_inputs(y));
        for (int k = 0; k < dg_node_num_control_inputs(x); k++)
            assert_string_equal(dg_node_name(dg_node_control_input(x, k)),
                                dg_node_name(dg_node_control_input(y, k)));
        assert_int_equal(dg_node_num_colocations(x), dg_node_num_colocations(y));
        for (int k = 0; k < dg_node_num_colocations(x); k++)
            assert_string_equal(dg_node_colocation(x, k), dg_node_colocation(y, k));
        assert_int_equal(x->n_attrs, y->n_attrs);
        for (int k = 0; k < x->n_attrs; k++) assert_attr_equal(&x->attrs[k], &y->attrs[k]);
        assert_int_equal(dg_node_num_outputs(x), dg_node_num_outputs(y));
        for (int k = 0; k < dg_node_num_outputs(x); k++) {
            assert_int_equal(dg_node_output_dtype(x, k), dg_node_output_dtype(y, k));
            dg_shape sx = dg_node_output_shape(x, k), sy = dg_node_output_shape(y, k);
            assert_true(dg_shape_equal(&sx, &sy));
        }
        assert_int_equal(x->var_initializer != NULL, y->var_initializer != NULL);
        if (x->var_initializer) assert_string_equal(x->var_initializer->name, y->var_initializer->name);
    }
    static const char *const colls[] = {DG_GLOBAL_VARIABLES, DG_TRAINABLE_VARIABLES, DG_GLOBAL_STEP,
                                        DG_SUMMARIES};
    for (int c = 0; c < 4; c++) {
        assert_int_equal(dg_graph_collection_size(a, colls[c]), dg_graph_collection_size(b, colls[c]));
        for (int i = 0; i < dg_graph_collection_size(a, colls[c]); i++)
            assert_string_equal(dg_node_name(dg_graph_collection_get(a, colls[c], i)),
                                dg_node_name(dg_graph_collection_get(b, colls[c], i)));
    }
}

// Serializes g, loads it back, checks both graphs match and that the reloaded graph
// serializes to the same bytes. Returns the reloaded graph.
static dg_graph *round_trip(const dg_graph *g) {
    dg_status *st = dg_status_new();
    char *buf = NULL, *buf2 = NULL;
    size_t len = 0, len2 = 0;
    assert_true(dg_graph_to_msgpack(g, &buf, &len, st));
    assert_ok(st);
    dg_graph *g2 = dg_graph_from_msgpack(buf, len, st);
    assert_ok(st);
    assert_non_null(g2);
    assert_graphs_equal(g, g2);
    assert_true(dg_graph_to_msgpack(g2, &buf2, &len2, st));
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    free(buf);
    free(buf2);
    dg_status_free(&st);
    return g2;
}

// ---------------------------------------------------------------------------------------
// The MLP

typedef struct mlp {
    dg_graph *g;
    dg_output x, y, loss, hid_w;
    dg_node *train, *init;
} mlp;

static void build_mlp(mlp *m, int64_t pixels, int64_t hidden) {
    dg_graph *g = m->g = dg_graph_new();
    m->x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, pixels));
    m->y = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
    m->hid_w = dg_variable(g, "hid_w", DG_FLOAT32, dg_shape2(pixels, hidden),
                           dg_init_truncated_normal(0, 1.0 / sqrt((double)pixels), 7));
    dg_output hid_b = dg_variable(g, "hid_b", DG_FLOAT32, dg_shape1(hidden), dg_init_zeros());
    dg_output sm_w = dg_variable(g, "sm_w", DG_FLOAT32, dg_shape2(hidden, 10),
                                 dg_init_truncated_normal(0, 1.0 / sqrt((double)hidden), 8));
    dg_output sm_b = dg_variable(g, "sm_b", DG_FLOAT32, dg_shape1(10), dg_init_constant(0.1));
    dg_output hid = dg_relu(g, "hid", dg_bias_add(g, "hid_lin", dg_matmul(g, NULL, m->x, m->hid_w, false, false), hid_b));
    dg_output logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, hid, sm_w, false, false), sm_b);
    m->loss = dg_sparse_softmax_cross_entropy(g, "cross_entropy", logits, m->y);
    dg_optimizer opt = dg_adam(g, 0.01);
    m->train = dg_optimizer_minimize(&opt, m->loss, dg_global_step(g));
    m->init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
}

// Runs init and `steps` Adam steps; writes the loss of each step and the final hid_w.
static void train(dg_graph *g, dg_output x, dg_output y, dg_output loss, dg_output hid_w,
                  dg_node *train_op, dg_node *init, int steps, int64_t pixels, float *losses,
                  float *w_out, size_t w_bytes) {
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.inter_op_threads = 1;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    assert_true(dg_session_run_target(s, init, st));
    const int64_t batch = 8;
    uint64_t rng = 42;
    for (int step = 0; step < steps; step++) {
        dg_tensor *xt = dg_tensor_new(DG_FLOAT32, dg_shape2(batch, pixels), st);
        dg_tensor *yt = dg_tensor_new(DG_INT64, dg_shape1(batch), st);
        for (int64_t i = 0; i < batch * pixels; i++) dg_tensor_f32(xt)[i] = (float)dg_test_uniform(&rng, 0, 1);
        for (int64_t i = 0; i < batch; i++) dg_tensor_i64(yt)[i] = (int64_t)dg_test_uniform(&rng, 0, 10);
        dg_output feeds[2] = {x, y};
        dg_tensor *vals[2] = {xt, yt};
        dg_tensor *out = NULL;
        assert_true(dg_session_run(s, feeds, vals, 2, &loss, &out, 1, &train_op, 1, st));
        assert_ok(st);
        losses[step] = dg_tensor_f32(out)[0];
        dg_tensor_unref(out);
        dg_tensor_unref(xt);
        dg_tensor_unref(yt);
    }
    dg_tensor *w = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &hid_w, &w, 1, NULL, 0, st));
    assert_int_equal(dg_tensor_nbytes(w), w_bytes);
    memcpy(w_out, dg_tensor_data(w), w_bytes);
    dg_tensor_unref(w);
    dg_session_free(&s);
    dg_status_free(&st);
}

static void test_mlp_round_trip_trains_identically(void **state) {
    (void)state;
    const int64_t pixels = 20, hidden = 16;
    const int steps = 5;
    mlp m;
    build_mlp(&m, pixels, hidden);
    dg_graph *g2 = round_trip(m.g);
    dg_status *st = dg_status_new();
    dg_output x2 = dg_graph_output(g2, "x", st), y2 = dg_graph_output(g2, "y_", st);
    dg_output loss2 = dg_graph_output(g2, dg_node_name(m.loss.node), st);
    dg_output w2 = dg_graph_output(g2, "hid_w", st);
    dg_node *train2 = dg_graph_find(g2, dg_node_name(m.train));
    dg_node *init2 = dg_graph_find(g2, dg_node_name(m.init));
    assert_ok(st);
    assert_non_null(train2);
    assert_non_null(init2);
    float l1[5], l2[5];
    size_t w_bytes = (size_t)(pixels * hidden) * sizeof(float);
    float *w1 = malloc(w_bytes), *wb = malloc(w_bytes);
    train(m.g, m.x, m.y, m.loss, m.hid_w, m.train, m.init, steps, pixels, l1, w1, w_bytes);
    train(g2, x2, y2, loss2, w2, train2, init2, steps, pixels, l2, wb, w_bytes);
    assert_memory_equal(l1, l2, sizeof l1);
    assert_memory_equal(w1, wb, w_bytes);
    assert_true(l1[steps - 1] != l1[0]);   // it did train
    // The reloaded graph keeps its variables' initializers and collections working.
    assert_true(dg_graph_collection_size(g2, DG_GLOBAL_VARIABLES) >= 5);
    dg_node *init3 = dg_global_variables_initializer(g2);
    assert_non_null(init3);
    assert_int_equal(dg_node_num_control_inputs(init3), dg_node_num_control_inputs(m.init));
    free(w1);
    free(wb);
    dg_status_free(&st);
    dg_graph_free(&g2);
    dg_graph_free(&m.g);
}

// ---------------------------------------------------------------------------------------
// Every attribute kind

static void test_every_attr_kind_round_trips(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_node *n = graph_begin(g, "NoOp", "attrs");
    graph_set_attr_int(n, "i", -123456789012345);
    graph_set_attr_int(n, "i_min", INT64_MIN);
    graph_set_attr_int(n, "i_max", INT64_MAX);
    graph_set_attr_float(n, "f", 0.1);
    graph_set_attr_float(n, "f_negzero", -0.0);
    graph_set_attr_float(n, "f_inf", -INFINITY);
    graph_set_attr_float(n, "f_nan", NAN);
    graph_set_attr_float(n, "f_tiny", 4.9e-324);
    graph_set_attr_bool(n, "b_true", true);
    graph_set_attr_bool(n, "b_false", false);
    graph_set_attr_type(n, "t_f32", DG_FLOAT32);
    graph_set_attr_type(n, "t_bool", DG_BOOL);
    graph_set_attr_type(n, "t_invalid", DG_INVALID_DTYPE);
    graph_set_attr_shape(n, "s_unknown", dg_shape_unknown());
    graph_set_attr_shape(n, "s_scalar", dg_shape_scalar());
    int64_t dims[DG_MAX_RANK] = {1, -1, 3, 0, 5, -1, 7, 8};
    graph_set_attr_shape(n, "s_rank8", dg_shape_make(DG_MAX_RANK, dims));
    graph_set_attr_shape(n, "s_partial", dg_shape2(-1, 10));
    graph_set_attr_string(n, "str", "hello");
    graph_set_attr_string(n, "str_empty", "");
    graph_set_attr_string(n, "str_bytes", "\xff\xfe not utf-8 \x80 \x01\x7f");
    int64_t ints[] = {INT64_MIN, -1, 0, 1, INT64_MAX};
    graph_set_attr_ints(n, "ints", ints, 5);
    graph_set_attr_ints(n, "ints_empty", NULL, 0);
    assert_non_null(graph_finish(n));
    // Const tensors of every dtype, including an empty one, a scalar and rank 8.
    double f64[6] = {1.5, -2.25, 1e300, -0.0, INFINITY, 3};
    float f32[6] = {1.5f, -2.25f, 1e30f, -0.0f, 7, 3};
    int32_t i32[6] = {INT32_MIN, -1, 0, 1, 2, INT32_MAX};
    uint8_t u8[6] = {0, 1, 127, 128, 254, 255};
    int64_t i64[6] = {INT64_MIN, -1, 0, 1, 2, INT64_MAX};
    uint8_t bl[6] = {1, 0, 0, 1, 1, 0};
    struct { dg_dtype dt; const void *data; } cases[] = {
        {DG_FLOAT64, f64}, {DG_FLOAT32, f32}, {DG_INT32, i32}, {DG_UINT8, u8}, {DG_INT64, i64}, {DG_BOOL, bl}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dg_tensor *t = dg_tensor_from_data(cases[c].dt, dg_shape2(2, 3), cases[c].data, NULL);
        dg_const(g, NULL, t);
        dg_tensor_unref(t);
    }
    dg_tensor *empty = dg_tensor_new(DG_FLOAT32, dg_shape3(0, 4, 2), NULL);
    dg_const(g, "empty", empty);
    dg_tensor_unref(empty);
    dg_tensor *scalar = dg_tensor_scalar_f64(2.5);
    dg_const(g, "scalar", scalar);
    dg_tensor_unref(scalar);
    int64_t ones[DG_MAX_RANK] = {1, 1, 1, 2, 1, 1, 1, 1};
    dg_tensor *r8 = dg_tensor_from_data(DG_INT64, dg_shape_make(DG_MAX_RANK, ones), i64, NULL);
    dg_node *holder = graph_begin(g, "NoOp", "tensor_holder");
    graph_set_attr_tensor(holder, "value", r8);
    assert_non_null(graph_finish(holder));
    dg_tensor_unref(r8);
    assert_ok(dg_graph_status(g));
    dg_graph *g2 = round_trip(g);
    const graph_attr *nan_attr = graph_node_attr(dg_graph_find(g2, "attrs"), "f_nan");
    assert_non_null(nan_attr);
    assert_true(isnan(nan_attr->u.f));
    dg_graph_free(&g2);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Devices, colocation, control inputs, seeds

static void test_devices_colocation_control(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_set_random_seed(g, -77);
    dg_graph_push_device(g, "/job:ps/task:1");
    dg_output v = dg_variable(g, "v", DG_FLOAT32, dg_shape1(3), dg_init_random_uniform(-1, 1, 0));
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:0/gpu:1");
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape1(3));
    dg_output s = dg_add(g, "s", a, v);
    dg_graph_push_colocate_with(g, v.node);
    dg_output u = dg_assign_add(g, "u", v, s);
    dg_graph_pop_colocate_with(g);
    dg_graph_pop_device(g);
    dg_node *late = dg_no_op(g, "late");
    dg_node_add_control_input(s.node, late);   // a control edge to a later node
    dg_node_add_control_input(late, u.node);
    graph_set_assigned_device(a.node, "/job:worker/replica:0/task:0/device:CPU:0");
    dg_output parts[3];
    assert_true(dg_split(g, "split", dg_concat(g, "cat", (dg_output[]){a, s, s}, 3, 0), 0, 3, parts));
    dg_identity(g, "second", parts[1]);
    assert_ok(dg_graph_status(g));
    assert_string_equal(dg_node_requested_device(u.node), "/job:ps/task:1");
    dg_graph *g2 = round_trip(g);
    bool has_seed;
    assert_int_equal(graph_random_seed(g2, &has_seed), -77);
    assert_true(has_seed);
    assert_string_equal(dg_node_requested_device(dg_graph_find(g2, "s")),
                        "/job:worker/task:0/device:GPU:1");
    assert_string_equal(dg_node_colocation(dg_graph_find(g2, "u"), 0), "v");
    assert_string_equal(dg_node_input(dg_graph_find(g2, "second"), 0).node->name, "split");
    assert_int_equal(dg_node_input(dg_graph_find(g2, "second"), 0).index, 1);
    dg_graph_free(&g2);
    dg_graph_free(&g);
}

static void test_empty_graph(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph *g2 = round_trip(g);
    assert_int_equal(dg_graph_num_nodes(g2), 0);
    dg_graph_free(&g2);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Files

static void test_files(void **state) {
    (void)state;
    char dir[] = "/tmp/dg_serialize_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], garbage[256], missing[256], nodir[256];
    snprintf(path, sizeof path, "%s/mlp.graph", dir);
    snprintf(garbage, sizeof garbage, "%s/garbage.graph", dir);
    snprintf(missing, sizeof missing, "%s/missing.graph", dir);
    snprintf(nodir, sizeof nodir, "%s/no/such/dir.graph", dir);
    mlp m;
    build_mlp(&m, 6, 4);
    dg_status *st = dg_status_new();
    assert_true(dg_graph_save(m.g, path, st));
    assert_ok(st);
    dg_graph *g2 = dg_graph_load(path, st);
    assert_ok(st);
    assert_non_null(g2);
    assert_graphs_equal(m.g, g2);
    dg_graph_free(&g2);
    // Saving again replaces the file.
    assert_true(dg_graph_save(m.g, path, st));

    assert_null(dg_graph_load(missing, st));
    assert_status(st, DG_NOT_FOUND, missing);
    assert_null(dg_graph_load(dir, st));
    assert_status(st, DG_INVALID_ARGUMENT, "is a directory");
    FILE *f = fopen(garbage, "wb");
    fputs("this is not a graph\n", f);
    fclose(f);
    assert_null(dg_graph_load(garbage, st));
    assert_status(st, DG_DATA_LOSS, garbage);
    assert_status(st, DG_DATA_LOSS, "not a distgraph graph");
    // A truncated file.
    char *buf;
    size_t len;
    assert_true(dg_graph_to_msgpack(m.g, &buf, &len, st));
    f = fopen(garbage, "wb");
    fwrite(buf, 1, len / 2, f);
    fclose(f);
    free(buf);
    assert_null(dg_graph_load(garbage, st));
    assert_status(st, DG_DATA_LOSS, "truncated");
    assert_status(st, DG_DATA_LOSS, garbage);
    assert_false(dg_graph_save(m.g, nodir, st));
    assert_status(st, DG_NOT_FOUND, "saving");
    assert_false(dg_graph_save(m.g, "", st));
    assert_status(st, DG_INVALID_ARGUMENT, "empty path");

    unlink(path);
    unlink(garbage);
    rmdir(dir);
    dg_status_free(&st);
    dg_graph_free(&m.g);
}

static void test_writer_errors(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char *buf = NULL;
    size_t len = 0;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape1(2));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT32, dg_shape1(3));
    dg_add(g, "bad", a, b);
    assert_false(dg_graph_to_msgpack(g, &buf, &len, st));
    assert_status(st, DG_FAILED_PRECONDITION, "builder error");
    assert_null(buf);
    // A node reading a node of another graph (a partition's fed input).
    dg_graph *h = dg_graph_new();
    dg_output in = dg_placeholder(h, "in", DG_FLOAT32, dg_shape1(2));
    dg_graph *p = dg_graph_new();
    dg_node *idn = dg_identity(h, "id", in).node;
    assert_non_null(graph_insert_copy(p, idn, &in, 1));
    assert_false(dg_graph_to_msgpack(p, &buf, &len, st));
    assert_status(st, DG_INVALID_ARGUMENT, "input 0 (\"in\") belongs to another graph");
    assert_false(dg_graph_to_msgpack(NULL, &buf, &len, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    dg_graph_free(&p);
    dg_graph_free(&h);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Robustness: truncation and mutation

static void check_outcome(dg_graph *g, dg_status *st, int *n_ok, int *n_err) {
    if (g) {
        assert_ok(st);
        char *buf = NULL;
        size_t len;
        assert_true(dg_graph_to_msgpack(g, &buf, &len, st));
        free(buf);
        dg_graph_free(&g);
        (*n_ok)++;
    } else {
        dg_code c = dg_status_code(st);
        if (c != DG_INVALID_ARGUMENT && c != DG_DATA_LOSS)
            print_error("unexpected %s: %s\n", dg_code_name(c), dg_status_message(st));
        assert_true(c == DG_INVALID_ARGUMENT || c == DG_DATA_LOSS);
        assert_true(strncmp(dg_status_message(st), "graph file: ", 12) == 0);
        (*n_err)++;
    }
    dg_status_reset(st);
}

// A small graph with every kind of field, for the byte-level tests.
static dg_graph *small_graph(void) {
    mlp m;
    build_mlp(&m, 3, 2);
    dg_graph *g = m.g;
    dg_node *n = graph_begin(g, "NoOp", "attrs");
    graph_set_attr_float(n, "f", 0.5);
    graph_set_attr_string(n, "s", "str");
    int64_t iv[] = {1, -2};
    graph_set_attr_ints(n, "ints", iv, 2);
    graph_set_attr_shape(n, "shape", dg_shape2(-1, 4));
    graph_set_attr_shape(n, "unknown", dg_shape_unknown());
    dg_graph_push_device(g, "/job:worker/task:0");
    assert_non_null(graph_finish(n));
    dg_graph_pop_device(g);
    graph_set_assigned_device(n, "/job:worker/replica:0/task:0/device:CPU:0");
    dg_node_add_control_input(dg_graph_node(g, 0), n);
    assert_ok(dg_graph_status(g));
    return g;
}

static void test_truncation_at_every_length(void **state) {
    (void)state;
    dg_graph *g = small_graph();
    dg_status *st = dg_status_new();
    char *buf;
    size_t len;
    assert_true(dg_graph_to_msgpack(g, &buf, &len, st));
    for (size_t cut = 0; cut < len; cut++) {
        // A fresh allocation of exactly `cut` bytes, so reading past it is a memory error.
        char *part = malloc(cut ? cut : 1);
        memcpy(part, buf, cut);
        dg_graph *h = dg_graph_from_msgpack(part, cut, st);
        if (h) print_error("a %zu-byte prefix of %zu loaded\n", cut, len);
        assert_null(h);
        assert_int_equal(dg_status_code(st), DG_DATA_LOSS);
        free(part);
        dg_status_reset(st);
    }
    dg_graph *h = dg_graph_from_msgpack(buf, len, st);
    assert_non_null(h);
    dg_graph_free(&h);
    free(buf);
    dg_status_free(&st);
    dg_graph_free(&g);
}

static void test_random_mutations(void **state) {
    (void)state;
    dg_graph *g = small_graph();
    dg_status *st = dg_status_new();
    char *buf;
    size_t len;
    assert_true(dg_graph_to_msgpack(g, &buf, &len, st));
    uint64_t rng = 0x5eed;
    int n_ok = 0, n_err = 0;
    char *m = malloc(len + 16);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(m, buf, len);
        size_t mlen = len;
        int flips = 1 + (int)dg_test_uniform(&rng, 0, 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)dg_test_uniform(&rng, 0, (double)mlen);
            int how = (int)dg_test_uniform(&rng, 0, 4);
            if (how == 0) m[at] ^= (char)(1u << (int)dg_test_uniform(&rng, 0, 8));
            else if (how == 1) m[at] = (char)(int)dg_test_uniform(&rng, 0, 256);
            else if (how == 2) m[at] = (char)(0xdc + (int)dg_test_uniform(&rng, 0, 4));   // big headers
            else mlen = at;   // truncate as well
        }
        check_outcome(dg_graph_from_msgpack(m, mlen, st), st, &n_ok, &n_err);
    }
    print_message("mutations: %d loaded, %d rejected\n", n_ok, n_err);
    assert_true(n_err > 0);
    free(m);
    free(buf);
    dg_status_free(&st);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Hostile documents

static void test_bad_envelope(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    assert_null(dg_graph_from_msgpack("", 0, st));
    assert_status(st, DG_DATA_LOSS, "empty");
    const char *json = "{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": []}";
    assert_null(dg_graph_from_msgpack(json, strlen(json), st));
    assert_status(st, DG_DATA_LOSS, "not a distgraph graph");
    assert_null(dg_graph_from_msgpack("\x85\xa6" "form", 6, st));
    assert_status(st, DG_DATA_LOSS, "truncated after 6 bytes");
    char big[16] = {0};
    assert_null(dg_graph_from_msgpack(big, DG_GRAPH_FILE_MAX_BYTES + 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "1073741825 bytes is more than the 1073741824");
    assert_null(dg_graph_from_msgpack(NULL, 4, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    dg_status_free(&st);

    expect_error("{\"format\": \"tensorflow\", \"version\": 1, \"nodes\": []}", DG_DATA_LOSS,
                 "not a distgraph graph");
    expect_error("[\"format\", \"distgraph-graph\"]", DG_DATA_LOSS, "not a distgraph graph");
    expect_error("{\"version\": 1, \"format\": \"distgraph-graph\", \"nodes\": []}", DG_DATA_LOSS,
                 "not a distgraph graph");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 2, \"nodes\": []}",
                 DG_INVALID_ARGUMENT, "version 2 is not supported");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": \"1\", \"nodes\": []}",
                 DG_INVALID_ARGUMENT, "\"version\": expected int, got str");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1}", DG_INVALID_ARGUMENT, "no \"nodes\"");
    expect_error("{\"format\": \"distgraph-graph\", \"nodes\": []}", DG_INVALID_ARGUMENT, "no \"version\"");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, \"version\": 1, \"nodes\": []}",
                 DG_INVALID_ARGUMENT, "\"version\" appears twice");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": [], \"extra\": 1}",
                 DG_INVALID_ARGUMENT, "unknown top-level key \"extra\"");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, 7: 1, \"nodes\": []}",
                 DG_INVALID_ARGUMENT, "top-level key 2 is not a str");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": {}}",
                 DG_INVALID_ARGUMENT, "\"nodes\": expected an array, got map");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, \"random_seed\": 1.5, \"nodes\": []}",
                 DG_INVALID_ARGUMENT, "\"random_seed\": expected int, got float");
    // Trailing bytes, a reserved byte, and declared sizes far past the end.
    expect_error("#83# \"format\" \"distgraph-graph\" \"version\" 1 \"nodes\" [] 1 2 3 4",
                 DG_INVALID_ARGUMENT, "unexpected bytes after the graph");
    expect_error("#84# \"format\" \"distgraph-graph\" \"version\" 1 \"nodes\" [] \"random_seed\" #c1#",
                 DG_INVALID_ARGUMENT, "0xc1 is not a msgpack type");
    expect_error(DOC("#dd ffffffff#"), DG_DATA_LOSS, "declares 4294967295 elements");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"attrs\": #df ffffffff#}"), DG_DATA_LOSS,
                 "declares 4294967295 entries");
    expect_error(DOC("{\"name\": #db ffffffff 61#}"), DG_DATA_LOSS, "truncated");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"attrs\": {\"x\": {\"tensor\": "
                     "{\"dtype\": \"uint8\", \"shape\": [4], \"data\": #c6 7fffffff#}}}}"),
                 DG_DATA_LOSS, "truncated");
    // Deep nesting.
    char deep[512];
    snprintf(deep, sizeof deep, DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"attrs\": {\"x\": {\"ints\": "
                                    "%s1%s}}}"),
             "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]");
    expect_error(deep, DG_INVALID_ARGUMENT, "nested more than 24 levels deep");
}

static void test_too_many_nodes(void **state) {
    (void)state;
    // The node limit needs a buffer that really has that many elements.
    size_t n = (size_t)DG_GRAPH_FILE_MAX_NODES + 1;
    size_t hlen;
    char *head = pack_spec("{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": #dd 02faf081#}", &hlen);
    char *buf = calloc(hlen + n, 1);
    memcpy(buf, head, hlen);
    dg_status *st = dg_status_new();
    assert_null(dg_graph_from_msgpack(buf, hlen + n, st));
    assert_status(st, DG_INVALID_ARGUMENT, "50000001 nodes is more than the 50000000");
    dg_status_free(&st);
    free(buf);
    free(head);
}

static void test_bad_node_fields(void **state) {
    (void)state;
    expect_error(DOC("7"), DG_INVALID_ARGUMENT, "graph file: node 0: expected a map, got int");
    expect_error(DOC("{\"name\": 1, \"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT,
                 "node 0: field \"name\": expected str, got int");
    expect_error(DOC("{\"name\": \"a\"}"), DG_INVALID_ARGUMENT, "node 0 (\"a\"): has no \"op\"");
    expect_error(DOC("{\"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT, "node 0: has no \"name\"");
    expect_error(DOC("{\"name\": \"a\", \"op\": 3}"), DG_INVALID_ARGUMENT,
                 "node 0 (\"a\"): field \"op\": expected str, got int");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"Frobnicate\"}"), DG_INVALID_ARGUMENT,
                 "node 0 (\"a\"): field \"op\": unknown op type \"Frobnicate\"");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"color\": \"red\"}"), DG_INVALID_ARGUMENT,
                 "node 0 (\"a\"): unknown field \"color\"");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT,
                 "field \"op\" appears twice");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", 5: 1}"), DG_INVALID_ARGUMENT,
                 "field 2: expected a str key, got int");
    expect_error(DOC("{\"name\": \"a b\", \"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT,
                 "\"a b\" is not a valid node name");
    expect_error(DOC("{\"name\": \"\", \"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT, "is not a valid node name");
    expect_error(DOC("{\"name\": \"a\\0b\", \"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT,
                 "node 0 (\"a\\x00b\"): field \"name\": contains a NUL byte");
    expect_error(DOC("{\"name\": #d4 0102#, \"op\": \"NoOp\"}"), DG_INVALID_ARGUMENT,
                 "field \"name\": expected str, got ext");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\"}, {\"name\": \"a\", \"op\": \"NoOp\"}"),
                 DG_INVALID_ARGUMENT, "node 1 (\"a\"): duplicate node name (node 0 has it too)");
    // Devices.
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"device\": 0}"), DG_INVALID_ARGUMENT,
                 "field \"device\": expected str, got int");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"device\": \"/job:/bad\"}"),
                 DG_INVALID_ARGUMENT, "node 0 (\"a\"): field \"device\": ");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"assigned_device\": \"/gpu:x\"}"),
                 DG_INVALID_ARGUMENT, "field \"assigned_device\": ");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"colocation\": \"v\"}"), DG_INVALID_ARGUMENT,
                 "field \"colocation\": expected an array, got str");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"colocation\": [\"v\", 2]}"),
                 DG_INVALID_ARGUMENT, "field \"colocation\": entry 1: expected str, got int");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"initializer\": \"b\"}"), DG_INVALID_ARGUMENT,
                 "field \"initializer\" is only for VariableV2 nodes");
}

static void test_bad_inputs(void **state) {
    (void)state;
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": \"x\"}"),
                 DG_INVALID_ARGUMENT, "node 1 (\"b\"): field \"inputs\": expected an array, got str");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [0]}"),
                 DG_INVALID_ARGUMENT, "node 1 (\"b\"): input 0: expected \"name:index\" or [name, index], got int");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [[\"x\", 0, 1]]}"),
                 DG_INVALID_ARGUMENT, "input 0: expected [name, index], got an array of 3");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [[\"x\", \"0\"]]}"),
                 DG_INVALID_ARGUMENT, "input 0: expected int, got str");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [[\"x\", -1]]}"),
                 DG_INVALID_ARGUMENT, "input 0: output index -1 is out of range");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [\"x:zero\"]}"),
                 DG_INVALID_ARGUMENT, "input 0: \"x:zero\" has a malformed output index");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [\"x:99999999999\"]}"),
                 DG_INVALID_ARGUMENT, "malformed output index");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [\"x:1\"]}"),
                 DG_INVALID_ARGUMENT, "node 1: node \"b\" (Relu): input 0 asks for output 1 of \"x\", which has 1 outputs");
    // An input naming a later node, or none: the error names both.
    expect_error(DOC("{\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [\"x\"]}, " PH("x")),
                 DG_INVALID_ARGUMENT,
                 "node 0 (\"b\"): input 0 names \"x\", which is not an earlier node in the file");
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [\"nope\"]}"),
                 DG_INVALID_ARGUMENT, "node 1 (\"b\"): input 0 names \"nope\"");
    // Arity and shape inference run again.
    expect_error(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [\"x\", \"x\"]}"),
                 DG_INVALID_ARGUMENT, "node \"b\" (Relu): takes 1 inputs, got 2");
    expect_error(DOC(PH("x") ", {\"name\": \"mm\", \"op\": \"MatMul\", \"inputs\": [\"x\", \"x\"]}"),
                 DG_INVALID_ARGUMENT, "node 1: node \"mm\" (MatMul): inner dimensions differ, 3 vs 2");
    expect_error(DOC("{\"name\": \"v\", \"op\": \"VariableV2\", \"attrs\": {\"dtype\": {\"type\": \"float32\"}, "
                     "\"shape\": {\"shape\": [-1]}}}"),
                 DG_INVALID_ARGUMENT, "variable shape must be fully defined");
    expect_error(DOC(PH("x") ", {\"name\": \"a\", \"op\": \"Assign\", \"inputs\": [\"x\", \"x\"]}"),
                 DG_INVALID_ARGUMENT, "input 0 must be a variable");
    // [name, index] pairs work.
    dg_graph *g = expect_load(DOC(PH("x") ", {\"name\": \"b\", \"op\": \"Relu\", \"inputs\": [[\"x\", 0]]}"));
    assert_string_equal(dg_node_name(dg_node_input(dg_graph_find(g, "b"), 0).node), "x");
    dg_graph_free(&g);
}

static void test_bad_control_inputs(void **state) {
    (void)state;
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"control_inputs\": {}}"), DG_INVALID_ARGUMENT,
                 "field \"control_inputs\": expected an array, got map");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"control_inputs\": [1]}"), DG_INVALID_ARGUMENT,
                 "node 0 (\"a\"): control input 0: expected str, got int");
    expect_error(DOC("{\"name\": \"a\", \"op\": \"NoOp\"}, {\"name\": \"b\", \"op\": \"NoOp\", "
                     "\"control_inputs\": [\"a\", \"zzz\"]}"),
                 DG_INVALID_ARGUMENT, "node 1 (\"b\"): control input 1 names \"zzz\", which is not a node");
    // Cycles through control inputs (and self-loops) load; nothing walks them.
    dg_graph *g = expect_load(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"control_inputs\": [\"b\", \"a\"]}, "
                                  "{\"name\": \"b\", \"op\": \"NoOp\", \"control_inputs\": [\"a\", \"a\"]}"));
    dg_node *a = dg_graph_find(g, "a"), *b = dg_graph_find(g, "b");
    assert_int_equal(dg_node_num_control_inputs(a), 2);
    assert_ptr_equal(dg_node_control_input(a, 0), b);
    assert_ptr_equal(dg_node_control_input(a, 1), a);
    assert_int_equal(dg_node_num_control_inputs(b), 1);   // duplicates fold
    dg_graph *g2 = round_trip(g);
    dg_graph_free(&g2);
    dg_graph_free(&g);
    // Initializers and collections must name nodes.
    expect_error(DOC("{\"name\": \"v\", \"op\": \"VariableV2\", \"initializer\": \"v/Assign\", \"attrs\": "
                     "{\"dtype\": {\"type\": \"float32\"}, \"shape\": {\"shape\": [1]}}}"),
                 DG_INVALID_ARGUMENT, "node 0 (\"v\"): field \"initializer\" names \"v/Assign\", which is not a node");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": [" PH("x") "], "
                 "\"collections\": {\"variables\": [\"x\", \"y\"]}}",
                 DG_INVALID_ARGUMENT, "collection \"variables\": entry 1 names \"y\", which is not a node");
    expect_error("{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": [], \"collections\": []}",
                 DG_INVALID_ARGUMENT, "\"collections\": expected a map, got array");
}

#define ATTR_DOC(attrs) DOC(PH("x") ", " PH("w") ", " PH("b") ", {\"name\": \"dense/MatMul\", \"op\": " \
                            "\"MatMul\", \"inputs\": [\"x\", \"w\"], \"attrs\": {" attrs "}}")

static void test_bad_attrs(void **state) {
    (void)state;
    expect_error(ATTR_DOC("\"transpose_a\": {\"bool\": 1}"), DG_INVALID_ARGUMENT,
                 "graph file: node 3 (\"dense/MatMul\"): attr \"transpose_a\": expected bool, got int");
    expect_error(ATTR_DOC("\"transpose_a\": true"), DG_INVALID_ARGUMENT,
                 "attr \"transpose_a\": expected a map with one entry {kind: value}, got bool");
    expect_error(ATTR_DOC("\"transpose_a\": {\"bool\": true, \"int\": 1}"), DG_INVALID_ARGUMENT,
                 "expected a map with one entry {kind: value}, got map of another form");
    expect_error(ATTR_DOC("\"x\": {\"complex\": [1, 2]}"), DG_INVALID_ARGUMENT,
                 "node 3 (\"dense/MatMul\"): attr \"x\": unknown kind \"complex\"");
    expect_error(ATTR_DOC("\"x\": {\"int\": 9223372036854775808}"), DG_INVALID_ARGUMENT,
                 "attr \"x\": 9223372036854775808 does not fit in int64");
    expect_error(ATTR_DOC("\"x\": {\"int\": 1.5}"), DG_INVALID_ARGUMENT, "attr \"x\": expected int, got float");
    expect_error(ATTR_DOC("\"x\": {\"float\": \"1.5\"}"), DG_INVALID_ARGUMENT, "attr \"x\": expected float, got str");
    expect_error(ATTR_DOC("\"x\": {\"type\": \"complex64\"}"), DG_INVALID_ARGUMENT,
                 "attr \"x\": unknown dtype \"complex64\"");
    expect_error(ATTR_DOC("\"x\": {\"type\": 5}"), DG_INVALID_ARGUMENT, "attr \"x\": 5 is not a dtype code");
    expect_error(ATTR_DOC("\"x\": {\"type\": [1]}"), DG_INVALID_ARGUMENT, "expected a dtype name, got array");
    expect_error(ATTR_DOC("\"x\": {\"shape\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}"), DG_INVALID_ARGUMENT,
                 "attr \"x\": rank 9 is more than 8");
    expect_error(ATTR_DOC("\"x\": {\"shape\": [3, -2]}"), DG_INVALID_ARGUMENT,
                 "attr \"x\": dimension 1 is -2 (must be >= -1)");
    expect_error(ATTR_DOC("\"x\": {\"shape\": \"[3]\"}"), DG_INVALID_ARGUMENT,
                 "attr \"x\": expected an array of dims or nil, got str");
    expect_error(ATTR_DOC("\"x\": {\"shape\": [true]}"), DG_INVALID_ARGUMENT, "attr \"x\": expected int, got bool");
    expect_error(ATTR_DOC("\"x\": {\"string\": \"a\\0b\"}"), DG_INVALID_ARGUMENT,
                 "attr \"x\": contains a NUL byte");
    expect_error(ATTR_DOC("\"x\": {\"string\": <00>}"), DG_INVALID_ARGUMENT, "attr \"x\": expected str, got bin");
    expect_error(ATTR_DOC("\"x\": {\"ints\": [1, \"2\"]}"), DG_INVALID_ARGUMENT, "attr \"x\": expected int, got str");
    expect_error(ATTR_DOC("\"x\": {\"ints\": 1}"), DG_INVALID_ARGUMENT, "attr \"x\": expected an array of ints, got int");
    expect_error(ATTR_DOC("\"x\": {\"int\": 1}, \"x\": {\"int\": 2}"), DG_INVALID_ARGUMENT,
                 "attr \"x\" appears twice");
    expect_error(ATTR_DOC("7: {\"int\": 1}"), DG_INVALID_ARGUMENT, "attr 0 name: expected str, got int");
    // Tensors.
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"float32\", \"shape\": [2], \"data\": <00000000000000>}}"),
                 DG_INVALID_ARGUMENT, "attr \"t\": tensor data has 7 bytes, but float32 [2] needs 8");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"float32\", \"shape\": [4294967296, 4294967296, 16], "
                          "\"data\": <00000000>}}"),
                 DG_INVALID_ARGUMENT, "tensor data has 4 bytes, but float32 [4294967296,4294967296,16] needs more than 2^64");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"int64\", \"shape\": [9223372036854775807, 2], "
                          "\"data\": <00>}}"),
                 DG_INVALID_ARGUMENT, "needs more than 2^64");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"int64\", \"shape\": [1000000, 1000000], "
                          "\"data\": <00>}}"),
                 DG_INVALID_ARGUMENT, "tensor data has 1 bytes, but int64 [1000000,1000000] needs 8000000000000");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"bool\", \"shape\": [3], \"data\": <000102>}}"),
                 DG_INVALID_ARGUMENT, "attr \"t\": bool tensor element 2 is 2, not 0 or 1");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"float32\", \"shape\": [1]}}"), DG_INVALID_ARGUMENT,
                 "attr \"t\": tensor has no \"data\"");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"float32\", \"shape\": nil, \"data\": <>}}"),
                 DG_INVALID_ARGUMENT, "attr \"t\": tensor shape: expected an array of dims, got nil");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"float32\", \"shape\": [-1], \"data\": <>}}"),
                 DG_INVALID_ARGUMENT, "tensor shape: dimension 0 is -1 (must be >= 0)");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": 0, \"shape\": [], \"data\": <>}}"),
                 DG_INVALID_ARGUMENT, "tensor dtype: 0 is not a dtype code");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"int32\", \"shape\": [1], \"data\": \"abcd\"}}"),
                 DG_INVALID_ARGUMENT, "tensor data: expected bin, got str");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"int32\", \"shape\": [1], \"data\": <00000000>, \"x\": 1}}"),
                 DG_INVALID_ARGUMENT, "unknown tensor field \"x\"");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": {\"dtype\": \"int32\", \"dtype\": \"int32\", \"shape\": [1], "
                          "\"data\": <00000000>}}"),
                 DG_INVALID_ARGUMENT, "tensor field \"dtype\" appears twice");
    expect_error(ATTR_DOC("\"t\": {\"tensor\": [1]}"), DG_INVALID_ARGUMENT,
                 "attr \"t\": expected a map {dtype, shape, data}, got array");
    expect_error(DOC("{\"name\": \"c\", \"op\": \"Const\"}"), DG_INVALID_ARGUMENT,
                 "Const needs a \"value\" tensor attribute");
    // Too many attributes.
    size_t cap = 64 * 300 + 1024, o = 0;
    char *spec = malloc(cap);
    o += (size_t)snprintf(spec + o, cap - o, "{\"format\": \"distgraph-graph\", \"version\": 1, \"nodes\": "
                          "[{\"name\": \"a\", \"op\": \"NoOp\", \"attrs\": {");
    for (int i = 0; i < 257; i++) o += (size_t)snprintf(spec + o, cap - o, "%s\"a%d\": {\"int\": %d}", i ? ", " : "", i, i);
    snprintf(spec + o, cap - o, "}}]}");
    expect_error(spec, DG_INVALID_ARGUMENT, "257 attributes, more than the 256 a node may have");
    free(spec);
}

static void test_odd_but_valid(void **state) {
    (void)state;
    // Non-UTF-8 strings, fields in any order, keys missing where optional, a float attr
    // written as an int, dtype codes, "name:0".
    dg_graph *g = expect_load(
        "{\"format\": \"distgraph-graph\", \"nodes\": [{\"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
        "{\"type\": 1}, \"shape\": {\"shape\": nil}}, \"name\": \"x\"}, {\"name\": \"y\", \"inputs\": "
        "[\"x:0\"], \"op\": \"Identity\", \"attrs\": {\"s\": {\"string\": \"\\xff\\xfe\\x80\"}, "
        "\"f\": {\"float\": -3}}}], \"version\": 1}");
    dg_node *y = dg_graph_find(g, "y");
    assert_string_equal(dg_node_attr_string(y, "s"), "\xff\xfe\x80");
    double f;
    assert_true(dg_node_attr_float(y, "f", &f));
    assert_true(f == -3.0);
    assert_int_equal(dg_node_output_dtype(y, 0), DG_FLOAT32);
    assert_int_equal(dg_node_output_shape(y, 0).rank, -1);
    dg_graph_free(&g);
    // Device strings are canonicalised by the builders; the assigned device is kept.
    g = expect_load(DOC("{\"name\": \"a\", \"op\": \"NoOp\", \"device\": \"/gpu:0\", "
                        "\"assigned_device\": \"/job:w/replica:0/task:0/device:GPU:0\"}"));
    assert_string_equal(dg_node_requested_device(dg_graph_find(g, "a")), "/device:GPU:0");
    assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "a")), "/job:w/replica:0/task:0/device:GPU:0");
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_round_trip_trains_identically),
        cmocka_unit_test(test_every_attr_kind_round_trips),
        cmocka_unit_test(test_devices_colocation_control),
        cmocka_unit_test(test_empty_graph),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_truncation_at_every_length),
        cmocka_unit_test(test_random_mutations),
        cmocka_unit_test(test_bad_envelope),
        cmocka_unit_test(test_too_many_nodes),
        cmocka_unit_test(test_bad_node_fields),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_bad_control_inputs),
        cmocka_unit_test(test_bad_attrs),
        cmocka_unit_test(test_odd_but_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
