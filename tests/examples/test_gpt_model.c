/* The GPT of examples/common/gpt_model.c, small (1 layer, width 16, 2 heads, context 8): its
 * first loss is that of uniform guesses over the 256 bytes, a training step runs, and bad input
 * (a byte id outside the vocabulary, a sequence longer than the context, a target outside the
 * vocabulary) fails the step with a status naming the node and the sizes, with no variable
 * changed. With the token embedding partitioned, the tied model trains exactly as the whole one.
 * Tensor parallelism inside pipeline stages: a two-stage pipeline whose stages split their
 * blocks over two devices gives, after one global step of two micro-batches, the gradients of
 * the same split model unpipelined (the same variables), within 1e-5. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_model.h"
#include "testutil.h"

enum { B = 2, T = 8 };

typedef struct tiny {
    dg_graph *g;
    gpt_model m;
    dg_node *train;
    dg_session *s;
    int n_vars;
    dg_output vars[64];
} tiny;

static void tiny_build_parts(tiny *t, int wte_parts) {
    memset(t, 0, sizeof *t);
    t->g = dg_graph_new();
    gpt_config c = {256, 1, 2, 16, T, 0.0, wte_parts};
    assert_true(gpt_build(t->g, &c, 7, &t->m));
    dg_optimizer opt = dg_adamw(t->g, 1e-2, 0.1);
    opt.global_clipnorm = 1.0;
    t->train = dg_optimizer_minimize(&opt, t->m.loss, t->m.global_step);
    dg_node *init = dg_global_variables_initializer(t->g);
    assert_ok(dg_graph_status(t->g));
    t->n_vars = dg_graph_collection_size(t->g, DG_GLOBAL_VARIABLES);
    assert_true(t->n_vars > 10 && t->n_vars <= 64);
    for (int i = 0; i < t->n_vars; i++) t->vars[i] = (dg_output){dg_graph_collection_get(t->g, DG_GLOBAL_VARIABLES, i), 0};
    dg_status *st = dg_status_new();
    t->s = dg_session_new(t->g, "local", NULL, st);
    assert_ok(st);
    assert_true(dg_session_run_target(t->s, init, st));
    dg_status_free(&st);
}

static void tiny_build(tiny *t) { tiny_build_parts(t, 0); }

static void tiny_free(tiny *t) {
    dg_session_free(&t->s);
    dg_graph_free(&t->g);
}

// Every global variable's bytes, concatenated (malloc'd; *n bytes).
static uint8_t *snapshot(tiny *t, size_t *n) {
    dg_tensor *out[64];
    dg_status *st = dg_status_new();
    assert_true(dg_session_run(t->s, NULL, NULL, 0, t->vars, out, t->n_vars, NULL, 0, st));
    dg_status_free(&st);
    size_t total = 0;
    for (int i = 0; i < t->n_vars; i++) total += dg_tensor_nbytes(out[i]);
    uint8_t *buf = malloc(total ? total : 1);
    assert_non_null(buf);
    size_t o = 0;
    for (int i = 0; i < t->n_vars; i++) {
        memcpy(buf + o, dg_tensor_data(out[i]), dg_tensor_nbytes(out[i]));
        o += dg_tensor_nbytes(out[i]);
        dg_tensor_unref(out[i]);
    }
    *n = total;
    return buf;
}

// Runs a training step on idx (rows x len) and targets; returns the loss (NaN on failure, with
// st holding why).
static double step(tiny *t, const int32_t *idx, const int32_t *tgt, int64_t rows, int64_t len, dg_status *st) {
    dg_tensor *x = dg_tensor_from_data(DG_INT32, dg_shape2(rows, len), idx, NULL);
    dg_tensor *y = dg_tensor_from_data(DG_INT32, dg_shape2(rows, len), tgt, NULL);
    dg_tensor *on = dg_tensor_new(DG_BOOL, dg_shape_scalar(), NULL);
    *(uint8_t *)dg_tensor_data(on) = 1;
    dg_output feeds[3] = {t->m.idx, t->m.targets, t->m.training};
    dg_tensor *vals[3] = {x, y, on}, *loss = NULL;
    double v = NAN;
    if (dg_session_run(t->s, feeds, vals, 3, &t->m.loss, &loss, 1, &t->train, 1, st)) v = dg_tensor_f32(loss)[0];
    dg_tensor_unref(loss);
    dg_tensor_unref(x);
    dg_tensor_unref(y);
    dg_tensor_unref(on);
    return v;
}

static void test_gpt_trains_and_refuses_bad_input(void **state) {
    (void)state;
    tiny t;
    tiny_build(&t);
    int32_t idx[B * (T + 1)], tgt[B * (T + 1)];
    for (int i = 0; i < B * (T + 1); i++) {
        idx[i] = (i * 37 + 11) % 256;
        tgt[i] = (i * 53 + 5) % 256;
    }
    dg_status *st = dg_status_new();
    // Weights N(0, 0.02): the logits are near 0, the loss near ln 256.
    double first = step(&t, idx, tgt, B, T, st);
    assert_ok(st);
    assert_close(first, log(256.0), 0.05, 0);
    // Bad input: each fails the step, names what is wrong, and changes no variable.
    size_t n0, n1;
    uint8_t *before = snapshot(&t, &n0);
    idx[3] = 300;   // a byte id outside the vocabulary
    assert_true(isnan(step(&t, idx, tgt, B, T, st)));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "tok_emb"));
    assert_non_null(strstr(dg_status_message(st), "300"));
    idx[3] = 3;
    dg_status_reset(st);
    assert_true(isnan(step(&t, idx, tgt, B, T + 1, st)));   // a sequence longer than the context
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "idx"));
    assert_non_null(strstr(dg_status_message(st), "[2,9]"));
    dg_status_reset(st);
    tgt[5] = 256;   // a target outside the vocabulary
    assert_true(isnan(step(&t, idx, tgt, B, T, st)));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "256"));
    tgt[5] = 5;
    uint8_t *after = snapshot(&t, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    // A good step still trains afterwards.
    dg_status_reset(st);
    double again = step(&t, idx, tgt, B, T, st);
    assert_ok(st);
    assert_true(isfinite(again));
    dg_status_free(&st);
    tiny_free(&t);
}

// The value of the variable called name in t (new; NULL when t has none).
static dg_tensor *read_var(tiny *t, const char *name) {
    dg_node *n = dg_graph_find(t->g, name);
    if (!n) return NULL;
    dg_output v = {n, 0};
    dg_tensor *out = NULL;
    dg_status *st = dg_status_new();
    assert_true(dg_session_run(t->s, NULL, NULL, 0, &v, &out, 1, NULL, 0, st));
    dg_status_free(&st);
    return out;
}

// Assigns value to t's variable var (a placeholder and an Assign added to t's graph).
static void write_var(tiny *t, dg_output var, const dg_tensor *value) {
    dg_status *st = dg_status_new();
    dg_output ph = dg_placeholder(t->g, NULL, dg_output_dtype(var), dg_output_shape(var));
    dg_node *set = dg_assign(t->g, NULL, var, ph).node;
    assert_ok(dg_graph_status(t->g));
    dg_tensor *v = (dg_tensor *)value;
    assert_true(dg_session_run(t->s, &ph, &v, 1, NULL, NULL, 0, &set, 1, st));
    dg_status_free(&st);
}

// Weight tying with the token embedding in 3 parts (86 + 85 + 85 rows): each part's gradient is
// the sum of its rows' sparse gradient from the lookup and its slice of the output projection's
// dense gradient. Started from the whole model's values, 4 AdamW steps (weight decay, global
// clipping) give the whole model's losses and table, to float32 rounding.
static void test_gpt_partitioned_tying_matches_whole(void **state) {
    (void)state;
    tiny whole, split;
    tiny_build(&whole);
    tiny_build_parts(&split, 3);
    assert_null(dg_graph_find(split.g, "wte/part_3"));
    const int64_t offsets[4] = {0, 86, 171, 256};
    dg_tensor *table = read_var(&whole, "wte");
    assert_non_null(table);
    for (int i = 0; i < dg_graph_collection_size(split.g, DG_TRAINABLE_VARIABLES); i++) {
        dg_output v = {dg_graph_collection_get(split.g, DG_TRAINABLE_VARIABLES, i), 0};
        const char *name = dg_node_name(v.node);
        int part = -1;
        if (sscanf(name, "wte/part_%d", &part) == 1) {
            assert_true(part >= 0 && part < 3);
            assert_int_equal(dg_output_shape(v).dims[0], offsets[part + 1] - offsets[part]);
            dg_tensor *rows = dg_tensor_from_data(DG_FLOAT32, dg_output_shape(v),
                                                  dg_tensor_f32(table) + offsets[part] * 16, NULL);
            write_var(&split, v, rows);
            dg_tensor_unref(rows);
        } else {
            dg_tensor *same = read_var(&whole, name);
            assert_non_null(same);
            write_var(&split, v, same);
            dg_tensor_unref(same);
        }
    }
    dg_tensor_unref(table);
    dg_status *st = dg_status_new();
    int32_t idx[B * T], tgt[B * T];
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < B * T; i++) {
            idx[i] = (i * 37 + 11 * k + 3) % 256;   // rows of all three parts, some twice
            tgt[i] = (i * 53 + 7 * k + 5) % 256;
        }
        double a = step(&whole, idx, tgt, B, T, st);
        assert_ok(st);
        double b = step(&split, idx, tgt, B, T, st);
        assert_ok(st);
        assert_true(isfinite(a) && isfinite(b));
        assert_close(b, a, 1e-6, 1e-6);
    }
    table = read_var(&whole, "wte");
    for (int part = 0; part < 3; part++) {
        char name[32];
        snprintf(name, sizeof name, "wte/part_%d", part);
        dg_tensor *rows = read_var(&split, name);
        assert_non_null(rows);
        const float *x = dg_tensor_f32(rows), *y = dg_tensor_f32(table) + offsets[part] * 16;
        double worst = 0;
        for (int64_t i = 0; i < (offsets[part + 1] - offsets[part]) * 16; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            if (!(d <= worst)) worst = d;   // a NaN counts as the worst
        }
        assert_true(worst < 1e-6);
        dg_tensor_unref(rows);
    }
    dg_tensor_unref(table);
    dg_status_free(&st);
    tiny_free(&split);
    tiny_free(&whole);
}

// The decoder with its key/value cache (built into the same graph, so on the same variables)
// gives at each position the logits the full forward pass gives for that position: T steps
// of one byte against one pass over the T bytes, after a few training steps.
static void test_gpt_decoder_matches_forward(void **state) {
    (void)state;
    tiny t;
    tiny_build(&t);
    gpt_config c = {256, 1, 2, 16, T, 0.0, 0};
    gpt_decoder d;
    assert_true(gpt_build_decoder(t.g, &c, &d));
    assert_ok(dg_graph_status(t.g));
    int32_t idx[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        idx[i] = (i * 37 + 11) % 256;
        tgt[i] = (i * 53 + 5) % 256;
    }
    dg_status *st = dg_status_new();
    for (int k = 0; k < 3; k++) assert_true(isfinite(step(&t, idx, tgt, B, T, st)));
    // The full pass over row 0 of the batch.
    dg_tensor *x = dg_tensor_from_data(DG_INT32, dg_shape2(1, T), idx, NULL), *off = dg_tensor_new(DG_BOOL, dg_shape_scalar(), NULL);
    *(uint8_t *)dg_tensor_data(off) = 0;
    dg_output feeds[2] = {t.m.idx, t.m.training};
    dg_tensor *fv[2] = {x, off}, *full = NULL;
    assert_true(dg_session_run(t.s, feeds, fv, 2, &t.m.logits, &full, 1, NULL, 0, st));
    // One position at a time, the keys and values of the earlier ones fed back.
    const int64_t H = 2, Dh = 8;
    float kc[T][2][8], vc[T][2][8];   // [position][head][Dh]
    for (int p = 0; p < T; p++) {
        const int64_t dims[4] = {1, H, p, Dh};
        dg_tensor *pk = dg_tensor_new(DG_FLOAT32, dg_shape_make(4, dims), NULL), *pv = dg_tensor_new(DG_FLOAT32, dg_shape_make(4, dims), NULL);
        for (int64_t h = 0; h < H; h++)
            for (int q = 0; q < p; q++)
                for (int64_t e = 0; e < Dh; e++) {
                    dg_tensor_f32(pk)[(h * p + q) * Dh + e] = kc[q][h][e];
                    dg_tensor_f32(pv)[(h * p + q) * Dh + e] = vc[q][h][e];
                }
        int32_t tok = idx[p], pos = p;
        dg_tensor *tt = dg_tensor_from_data(DG_INT32, dg_shape1(1), &tok, NULL), *pt = dg_tensor_from_data(DG_INT32, dg_shape1(1), &pos, NULL);
        dg_output df[4] = {d.tok, d.pos, d.past_k[0], d.past_v[0]}, dout[3] = {d.logits, d.new_k[0], d.new_v[0]};
        dg_tensor *dv[4] = {tt, pt, pk, pv}, *got[3];
        assert_true(dg_session_run(t.s, df, dv, 4, dout, got, 3, NULL, 0, st));
        assert_ok(st);
        double want[256], have[256];
        for (int v = 0; v < 256; v++) {
            want[v] = dg_tensor_f32(full)[p * 256 + v];
            have[v] = dg_tensor_f32(got[0])[v];
        }
        assert_close_f64_msg(have, want, 256, 1e-5, 1e-4, "position %d: the cached decoder's logits", p);
        for (int64_t h = 0; h < H; h++)
            for (int64_t e = 0; e < Dh; e++) {
                kc[p][h][e] = dg_tensor_f32(got[1])[h * Dh + e];
                vc[p][h][e] = dg_tensor_f32(got[2])[h * Dh + e];
            }
        for (int i = 0; i < 3; i++) dg_tensor_unref(got[i]);
        dg_tensor_unref(tt);
        dg_tensor_unref(pt);
        dg_tensor_unref(pk);
        dg_tensor_unref(pv);
    }
    // A position beyond the context is refused, naming the position table's lookup.
    int32_t tok = 1, pos = T;
    dg_tensor *tt = dg_tensor_from_data(DG_INT32, dg_shape1(1), &tok, NULL), *pt = dg_tensor_from_data(DG_INT32, dg_shape1(1), &pos, NULL);
    const int64_t dims0[4] = {1, H, 0, Dh};
    dg_tensor *e0 = dg_tensor_new(DG_FLOAT32, dg_shape_make(4, dims0), NULL), *got = NULL;
    dg_output df[4] = {d.tok, d.pos, d.past_k[0], d.past_v[0]};
    dg_tensor *dv[4] = {tt, pt, e0, e0};
    assert_false(dg_session_run(t.s, df, dv, 4, &d.logits, &got, 1, NULL, 0, st));
    assert_non_null(strstr(dg_status_message(st), "= 8 is not in [0, 8)"));
    dg_tensor_unref(tt);
    dg_tensor_unref(pt);
    dg_tensor_unref(e0);
    dg_tensor_unref(full);
    dg_tensor_unref(x);
    dg_tensor_unref(off);
    dg_status_free(&st);
    tiny_free(&t);
}

// grads[0..n) fetched from session s with the feeds, into out.
static void fetch_grads(dg_session *s, const dg_output *grads, int n, dg_output *feeds, dg_tensor **vals, int n_feeds,
                        dg_tensor **out) {
    dg_status *st = dg_status_new();
    assert_true(dg_session_run(s, feeds, vals, n_feeds, grads, out, n, NULL, 0, st));
    assert_ok(st);
    dg_status_free(&st);
}

static void test_gpt_pipeline_with_tensor_parallel_stages(void **state) {
    (void)state;
    enum { ROWS = 4 };
    gpt_config c = {256, 2, 2, 16, T, 0.0, 0};
    const char *shards[2] = {"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"};
    int32_t idx[ROWS * T], tgt[ROWS * T];
    for (int i = 0; i < ROWS * T; i++) {
        idx[i] = (i * 37 + 11) % 256;
        tgt[i] = (i * 91 + 5) % 256;
    }
    dg_status *st = dg_status_new();
    // The reference: the blocks split over two devices, not pipelined.
    dg_graph *ga = dg_graph_new();
    gpt_model ma;
    assert_true(gpt_build_tensor_parallel(ga, &c, 7, shards, 2, &ma));
    int na = dg_graph_collection_size(ga, DG_TRAINABLE_VARIABLES);
    assert_true(na > 10 && na <= 64);
    dg_output va[64], gra[64];
    for (int i = 0; i < na; i++) va[i] = (dg_output){dg_graph_collection_get(ga, DG_TRAINABLE_VARIABLES, i), 0};
    assert_true(dg_gradients(ga, &ma.loss, 1, va, na, NULL, gra));
    dg_node *inita = dg_global_variables_initializer(ga);
    // The pipeline: two stages (both on this task, as two stages of one process), each its
    // blocks over the task's devices 0 and 1.
    dg_graph *gb = dg_graph_new();
    const char *stages[2] = {"/job:localhost/replica:0/task:0", "/job:localhost/replica:0/task:0"};
    dg_pipeline_options o = dg_pipeline_options_default();
    o.devices = stages;
    o.n_devices = 2;
    o.micro_batches = 2;
    o.schedule = DG_PIPELINE_1F1B;
    gpt_pipeline_arg arg = {0};
    arg.tp = 2;
    arg.tp_device_type = "CPU";
    gpt_model mb;
    dg_pipeline p;
    assert_true(gpt_build_pipeline(gb, &c, 7, &o, 1, &arg, &mb, &p, st));
    assert_ok(st);
    assert_int_equal(p.n_vars, na);
    dg_node *initb = dg_global_variables_initializer(gb);
    assert_ok(dg_graph_status(gb));
    dg_session *sa = dg_test_local_session(ga, 2, 0, st), *sb = dg_test_local_session(gb, 2, 0, st);
    assert_ok(st);
    assert_true(dg_session_run_target(sa, inita, st) && dg_session_run_target(sb, initb, st));
    // The second stage's shard 1 ran on device 1.
    dg_node *h1 = dg_graph_find(gb, "h1/attn/kernel/part_1");
    assert_non_null(h1);
    assert_non_null(strstr(dg_node_assigned_device(h1), "/device:CPU:1"));
    // The backward pass is split too: shard 1's gradients ask for device 1.
    int bwd_on_1 = 0;
    for (int i = 0; i < dg_graph_num_nodes(gb); i++) {
        dg_node *nd = dg_graph_node(gb, i);
        if (strstr(dg_node_name(nd), "/bwd/") && strstr(dg_node_requested_device(nd), "/device:CPU:1")) bwd_on_1++;
    }
    assert_true(bwd_on_1 > 20);
    dg_tensor *x = dg_tensor_from_data(DG_INT32, dg_shape2(ROWS, T), idx, NULL);
    dg_tensor *y = dg_tensor_from_data(DG_INT32, dg_shape2(ROWS, T), tgt, NULL);
    dg_output fa[2] = {ma.idx, ma.targets}, fb[2] = {mb.idx, mb.targets};
    dg_tensor *vals[2] = {x, y}, *ga_out[64], *gb_out[64];
    fetch_grads(sa, gra, na, fa, vals, 2, ga_out);
    fetch_grads(sb, p.grads, p.n_vars, fb, vals, 2, gb_out);
    for (int i = 0; i < p.n_vars; i++) {
        const char *name = dg_node_name(p.vars[i].node);
        int j = 0;
        while (j < na && strcmp(dg_node_name(va[j].node), name) != 0) j++;
        if (j == na) fail_msg("pipeline variable %s is not the split model's", name);
        int64_t n = dg_tensor_num_elements(ga_out[j]);
        assert_int_equal(dg_tensor_num_elements(gb_out[i]), n);
        double *want = malloc((size_t)n * sizeof *want);
        assert_non_null(want);
        for (int64_t k = 0; k < n; k++) want[k] = dg_tensor_f32(ga_out[j])[k];
        double scale = dg_test_max_abs_f64(want, n);
        assert_true(scale > 1e-7);   // a gradient there to compare (NaN fails too)
        int64_t far = dg_test_first_far_f32(dg_tensor_f32(gb_out[i]), want, n, 1e-5 * scale, 1e-5);
        if (far >= 0)
            fail_msg("d %s [%lld] = %g pipelined, %g unpipelined", name, (long long)far, dg_tensor_f32(gb_out[i])[far],
                     want[far]);
        free(want);
    }
    for (int i = 0; i < na; i++) dg_tensor_unref(ga_out[i]);
    for (int i = 0; i < p.n_vars; i++) dg_tensor_unref(gb_out[i]);
    dg_tensor_unref(x);
    dg_tensor_unref(y);
    dg_session_free(&sa);
    dg_session_free(&sb);
    dg_pipeline_free(&p);
    dg_graph_free(&ga);
    dg_graph_free(&gb);
    // A stage on a device, not a task, cannot hold shards: named.
    dg_graph *gc = dg_graph_new();
    const char *on_devices[2] = {"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"};
    o.devices = on_devices;
    arg = (gpt_pipeline_arg){0};
    arg.tp = 2;
    assert_false(gpt_build_pipeline(gc, &c, 7, &o, 1, &arg, &mb, &p, st));
    assert_non_null(strstr(dg_status_message(st), "each stage runs on a task"));
    dg_pipeline_free(&p);
    dg_graph_free(&gc);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_trains_and_refuses_bad_input),
        cmocka_unit_test(test_gpt_decoder_matches_forward),
        cmocka_unit_test(test_gpt_partitioned_tying_matches_whole),
        cmocka_unit_test(test_gpt_pipeline_with_tensor_parallel_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
