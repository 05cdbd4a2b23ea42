/* Pipelines (distgraph/pipeline.h): each schedule's bubble against the closed forms of the
 * papers, and one global step of a model cut into stages over virtual CPUs, whose accumulated
 * gradients must equal the unpipelined model's (same graph, same variables) for every schedule
 * and m in {1, 2, 4, 8}, with and without recomputation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// ---- schedules ----

// The bubbles the papers give, for pieces of equal times (F = B = W = 1).
static double theory(dg_pipeline_schedule s, int p, int v, int m) {
    switch (s) {
    case DG_PIPELINE_GPIPE:
    case DG_PIPELINE_1F1B: return (double)(p - 1) / (m + p - 1);
    case DG_PIPELINE_INTERLEAVED_1F1B: return ((p - 1) / (double)v) / (m + (p - 1) / (double)v);
    case DG_PIPELINE_ZB_H1: return (p - 1) * 1.0 / (3.0 * m + (p - 1) * 1.0);   // (p-1)(F+B-W) over 3m + that
    }
    return NAN;
}

static void test_schedules_have_the_papers_bubbles(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    const dg_pipeline_schedule all[] = {DG_PIPELINE_GPIPE, DG_PIPELINE_1F1B, DG_PIPELINE_INTERLEAVED_1F1B,
                                        DG_PIPELINE_ZB_H1};
    for (int si = 0; si < 4; si++)
        for (int p = 2; p <= 4; p += 2)
            for (int m = 1; m <= 8; m *= 2) {
                dg_pipeline_schedule s = all[si];
                int v = s == DG_PIPELINE_INTERLEAVED_1F1B ? 2 : 1;
                if (v > 1 && m % p != 0) continue;
                // ZB-H1's closed form holds once the steady state is reached (m >= p).
                if (s == DG_PIPELINE_ZB_H1 && m < p) continue;
                dg_pipeline_estimate e;
                assert_true(dg_pipeline_simulate(s, p, v, m, 1, 1, 1, &e, st));
                assert_ok(st);
                double want = theory(s, p, v, m);
                if (!dg_test_is_close(e.bubble, want, 1e-9, 0)) {
                    fprintf(stderr, "%s p=%d m=%d: bubble %.6f, theory %.6f\n", dg_pipeline_schedule_name(s), p, m,
                            e.bubble, want);
                    fail();
                }
                // Activations held: GPipe all m, 1F1B at most p.
                if (s == DG_PIPELINE_GPIPE) assert_int_equal(e.peak_in_flight, m);
                if (s == DG_PIPELINE_1F1B) assert_int_equal(e.peak_in_flight, m < p ? m : p);
            }
    // p = 2, m = 8 as the issue states them: 11.1%, about 5.9%, about 4%.
    dg_pipeline_estimate e;
    assert_true(dg_pipeline_simulate(DG_PIPELINE_1F1B, 2, 1, 8, 1, 1, 1, &e, st));
    assert_true(fabs(e.bubble - 1.0 / 9) < 1e-9);
    assert_true(dg_pipeline_simulate(DG_PIPELINE_INTERLEAVED_1F1B, 2, 2, 8, 1, 1, 1, &e, st));
    assert_true(fabs(e.bubble - 0.5 / 8.5) < 1e-9);
    assert_true(dg_pipeline_simulate(DG_PIPELINE_ZB_H1, 2, 1, 8, 1, 1, 1, &e, st));
    assert_true(fabs(e.bubble - 1.0 / 25) < 1e-9);
    dg_status_free(&st);
}

static void test_schedule_arguments_are_checked(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_pipeline_estimate e;
    assert_false(dg_pipeline_simulate(DG_PIPELINE_1F1B, 0, 1, 4, 1, 1, 1, &e, st));
    assert_status(st, DG_INVALID_ARGUMENT, "devices");
    assert_false(dg_pipeline_simulate(DG_PIPELINE_1F1B, 2, 1, 0, 1, 1, 1, &e, st));
    assert_status(st, DG_INVALID_ARGUMENT, "micro-batches");
    assert_false(dg_pipeline_simulate(DG_PIPELINE_1F1B, 2, 2, 4, 1, 1, 1, &e, st));
    assert_status(st, DG_INVALID_ARGUMENT, "chunks");
    assert_false(dg_pipeline_simulate(DG_PIPELINE_INTERLEAVED_1F1B, 4, 2, 6, 1, 1, 1, &e, st));
    assert_status(st, DG_INVALID_ARGUMENT, "groups");
    assert_false(dg_pipeline_simulate((dg_pipeline_schedule)9, 2, 1, 4, 1, 1, 1, &e, st));
    assert_status(st, DG_INVALID_ARGUMENT, "schedule");
    assert_false(dg_pipeline_simulate(DG_PIPELINE_ZB_H1, 2, 1, 4, NAN, 1, 1, &e, st));
    assert_status(st, DG_INVALID_ARGUMENT, "times");
    dg_pipeline_schedule s;
    assert_true(dg_pipeline_schedule_parse("zb-h1", &s) && s == DG_PIPELINE_ZB_H1);
    assert_true(dg_pipeline_schedule_parse("interleaved", &s) && s == DG_PIPELINE_INTERLEAVED_1F1B);
    assert_false(dg_pipeline_schedule_parse("2f2b", &s));
    assert_string_equal(dg_pipeline_schedule_name(DG_PIPELINE_GPIPE), "gpipe");
    dg_status_free(&st);
}

// ---- one global step ----

#define LAYERS 8
#define WIDTH 24
#define CLASSES 5
#define BATCH 16

typedef struct mlp {
    int n_stages;
    int layers_per_stage;
} mlp;

// The variable of that name, or a new one (dg_get_variable: inside a pipeline's stage, a
// reusing scope finds the one the stage's first call made).
static dg_output var(dg_graph *g, const char *name, dg_shape shape, dg_initializer init, bool find) {
    dg_node *n = find ? dg_graph_find(g, name) : NULL;
    return n ? (dg_output){n, 0} : dg_get_variable(g, name, DG_FLOAT32, shape, init);
}

// Layer l: tanh(x W_l + b_l), the last one's output the logits. find: the variables exist.
static dg_output layer(dg_graph *g, int l, dg_output x, bool find) {
    char w[16], b[16];
    snprintf(w, sizeof w, "w%d", l);
    snprintf(b, sizeof b, "b%d", l);
    int out = l == LAYERS - 1 ? CLASSES : WIDTH;
    dg_output wv = var(g, w, dg_shape2(WIDTH, out), dg_init_random_normal(0, 0.4, 100 + l), find);
    dg_output bv = var(g, b, dg_shape1(out), dg_init_random_normal(0, 0.1, 200 + l), find);
    dg_output y = dg_bias_add(g, NULL, dg_matmul(g, NULL, x, wv, false, false), bv);
    return l == LAYERS - 1 ? y : dg_tanh(g, NULL, y);
}

// Stage k: its layers; the labels travel along with the activations to the last stage.
static int stage_fn(dg_graph *g, int stage, int mb, const dg_output *in, int n_in, dg_output *out, int cap, void *arg) {
    (void)mb;
    (void)cap;
    const mlp *m = arg;
    assert_int_equal(n_in, 2);
    dg_output x = in[0];
    for (int l = stage * m->layers_per_stage; l < (stage + 1) * m->layers_per_stage; l++) x = layer(g, l, x, false);
    if (stage == m->n_stages - 1) {
        out[0] = dg_sparse_softmax_cross_entropy(g, "loss", x, in[1]);
        return 1;
    }
    out[0] = x;
    out[1] = in[1];
    return 2;
}

static void fill_batch(dg_tensor *x, dg_tensor *y) {
    float *xv = dg_tensor_data(x);
    int32_t *yv = dg_tensor_data(y);
    for (int i = 0; i < BATCH * WIDTH; i++) xv[i] = (float)sin(0.71 * i + 0.3);
    for (int i = 0; i < BATCH; i++) yv[i] = (i * 7 + 3) % CLASSES;
}

// One step's gradients of a pipeline against the unpipelined model's in the same graph.
// The test MLP's pipeline into g over devs (chunks stages each), fed by placeholders x [BATCH,
// WIDTH] and y [BATCH] (batch[0], batch[1]); *model must outlive the build.
static void build_test_pipeline(dg_graph *g, mlp *model, const char *const *devs, int n_devices, int chunks, int m,
                                dg_pipeline_schedule sch, bool recompute, dg_output batch[2], dg_pipeline *p) {
    dg_status *st = dg_status_new();
    batch[0] = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(BATCH, WIDTH));
    batch[1] = dg_placeholder(g, "y", DG_INT32, dg_shape1(BATCH));
    *model = (mlp){n_devices * chunks, LAYERS / (n_devices * chunks)};
    dg_pipeline_options o = dg_pipeline_options_default();
    o.devices = devs;
    o.n_devices = n_devices;
    o.chunks = chunks;
    o.micro_batches = m;
    o.schedule = sch;
    o.recompute = recompute;
    o.stage_fn = stage_fn;
    o.arg = model;
    assert_true(dg_pipeline_build(g, &o, batch, 2, p, st));
    assert_ok(st);
    dg_status_free(&st);
}

// With mp (DG_BFLOAT16), the products run in it (dg_graph_set_mixed_precision), the
// pipeline's and the reference's alike: a micro-batch's weight gradient is then rounded to
// bfloat16 on its own, where the reference rounds the whole batch's once, so gradients agree
// within a few of bfloat16's steps (2^-8 relative) of their largest element.
static void check_step_mp(dg_pipeline_schedule sch, int n_devices, int chunks, int m, bool recompute, dg_dtype mp) {
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    if (mp != DG_INVALID_DTYPE) {
        assert_true(dg_graph_set_mixed_precision(g, mp, st));
        assert_ok(st);
    }
    char names[4][48];
    const char *devs[4];
    for (int d = 0; d < n_devices; d++) {
        snprintf(names[d], sizeof names[d], "/job:localhost/replica:0/task:0/device:CPU:%d", d);
        devs[d] = names[d];
    }
    mlp model;
    dg_output batch[2];
    dg_pipeline p;
    build_test_pipeline(g, &model, devs, n_devices, chunks, m, sch, recompute, batch, &p);
    dg_output x = batch[0], y = batch[1];
    assert_int_equal(p.n_vars, 2 * LAYERS);
    for (int l = 0; l < LAYERS; l++) {   // in the order the stages read them
        char w[16];
        snprintf(w, sizeof w, "w%d", l);
        assert_string_equal(dg_node_name(p.vars[2 * l].node), w);
    }
    // The reference: the whole model on the whole batch, on CPU:0, reading the same variables
    // (in bfloat16, the pipeline's casts of them).
    dg_output h = x;
    for (int l = 0; l < LAYERS; l++) h = layer(g, l, h, true);
    dg_output ref_loss = dg_sparse_softmax_cross_entropy(g, "ref_loss", h, y);
    dg_output ref[2 * LAYERS];
    assert_true(dg_gradients(g, &ref_loss, 1, p.vars, p.n_vars, NULL, ref));
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_ok(g));
    dg_session *s = dg_test_local_session(g, n_devices, 0, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    assert_ok(st);
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(BATCH, WIDTH), st), *yv = dg_tensor_new(DG_INT32, dg_shape1(BATCH), st);
    fill_batch(xv, yv);
    int nf = 2 + 2 * p.n_vars;
    dg_output *fetch = malloc((size_t)nf * sizeof *fetch);
    dg_tensor **got = calloc((size_t)nf, sizeof *got);
    fetch[0] = p.loss;
    fetch[1] = ref_loss;
    for (int i = 0; i < p.n_vars; i++) {
        fetch[2 + 2 * i] = p.grads[i];
        fetch[3 + 2 * i] = ref[i];
    }
    dg_tensor *vals[2] = {xv, yv};
    assert_true(dg_session_run(s, batch, vals, 2, fetch, got, nf, NULL, 0, st));
    assert_ok(st);
    double loss = *(float *)dg_tensor_data(got[0]), want_loss = *(float *)dg_tensor_data(got[1]);
    assert_true(isfinite(want_loss) && want_loss > 0.5);   // an untrained model: about log 5
    // (bfloat16: a product's row can round differently when its kernel blocks another M)
    assert_true(dg_test_is_close(loss, want_loss, 0, mp == DG_INVALID_DTYPE ? 1e-5 : 1e-3));
    for (int i = 0; i < p.n_vars; i++) {
        int64_t n = (int64_t)dg_tensor_num_elements(got[3 + 2 * i]);
        assert_int_equal(dg_tensor_num_elements(got[2 + 2 * i]), n);
        const float *r = dg_tensor_data(got[3 + 2 * i]);
        double *want = malloc((size_t)n * sizeof *want);
        for (int64_t k = 0; k < n; k++) want[k] = r[k];
        double scale = dg_test_max_abs_f64(want, n);
        assert_true(scale > 1e-6);   // a gradient that is there to compare
        double tol = mp == DG_INVALID_DTYPE ? 1e-5 : 4 * 0x1p-8;
        int64_t far = dg_test_first_far_f32(dg_tensor_data(got[2 + 2 * i]), want, n, tol * scale, tol);
        if (far >= 0) {
            fprintf(stderr, "%s m=%d recompute=%d: d %s [%lld] = %g, unpipelined %g\n", dg_pipeline_schedule_name(sch),
                    m, recompute, dg_node_name(p.vars[i].node), (long long)far,
                    ((const float *)dg_tensor_data(got[2 + 2 * i]))[far], want[far]);
            fail();
        }
        free(want);
    }
    for (int i = 0; i < nf; i++) dg_tensor_free(&got[i]);
    free(got);
    free(fetch);
    dg_tensor_free(&xv);
    dg_tensor_free(&yv);
    dg_session_free(&s);
    dg_pipeline_free(&p);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void check_step(dg_pipeline_schedule sch, int n_devices, int chunks, int m, bool recompute) {
    check_step_mp(sch, n_devices, chunks, m, recompute, DG_INVALID_DTYPE);
}

// Products in bfloat16: each micro-batch's products read the variables' casts the first one
// made, and every micro-batch's gradient must still reach the variables.
static void test_mixed_precision_gradients_equal_unpipelined(void **state) {
    (void)state;
    check_step_mp(DG_PIPELINE_GPIPE, 2, 1, 4, false, DG_BFLOAT16);
    check_step_mp(DG_PIPELINE_1F1B, 2, 1, 4, false, DG_BFLOAT16);
    check_step_mp(DG_PIPELINE_INTERLEAVED_1F1B, 2, 2, 4, false, DG_BFLOAT16);
    check_step_mp(DG_PIPELINE_ZB_H1, 2, 1, 4, false, DG_BFLOAT16);
    check_step_mp(DG_PIPELINE_1F1B, 2, 1, 4, true, DG_BFLOAT16);
}

static void test_gpipe_gradients_equal_unpipelined(void **state) {
    (void)state;
    for (int m = 1; m <= 8; m *= 2) check_step(DG_PIPELINE_GPIPE, 2, 1, m, false);
    check_step(DG_PIPELINE_GPIPE, 4, 1, 8, false);
}

static void test_1f1b_gradients_equal_unpipelined(void **state) {
    (void)state;
    for (int m = 1; m <= 8; m *= 2) check_step(DG_PIPELINE_1F1B, 2, 1, m, false);
    for (int m = 1; m <= 8; m *= 2) check_step(DG_PIPELINE_1F1B, 4, 1, m, false);
}

static void test_interleaved_gradients_equal_unpipelined(void **state) {
    (void)state;
    for (int m = 2; m <= 8; m *= 2) check_step(DG_PIPELINE_INTERLEAVED_1F1B, 2, 2, m, false);
    check_step(DG_PIPELINE_INTERLEAVED_1F1B, 2, 4, 4, false);
}

static void test_zb_h1_gradients_equal_unpipelined(void **state) {
    (void)state;
    for (int m = 1; m <= 8; m *= 2) check_step(DG_PIPELINE_ZB_H1, 2, 1, m, false);
    check_step(DG_PIPELINE_ZB_H1, 4, 1, 8, false);
}

static void test_recomputation_gives_the_same_gradients(void **state) {
    (void)state;
    check_step(DG_PIPELINE_GPIPE, 2, 1, 4, true);
    check_step(DG_PIPELINE_1F1B, 4, 1, 8, true);
    check_step(DG_PIPELINE_ZB_H1, 2, 1, 8, true);
}

// ---- the order each device runs its pieces in ----

typedef struct span {
    int64_t start, end;
    bool seen;
} span;

// Runs one traced step of a 2-stage pipeline with 4 micro-batches and checks each stage's
// pieces ran one after another in the schedule's order: want[stage] lists them as "F0 B0 ...".
static void check_order(dg_pipeline_schedule sch, const char *const want[2]) {
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    const char *devs[2] = {"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"};
    mlp model;
    dg_output batch[2];
    dg_pipeline p;
    build_test_pipeline(g, &model, devs, 2, 1, 4, sch, false, batch, &p);
    dg_node *init = dg_global_variables_initializer(g);
    dg_session *s = dg_test_local_session(g, 2, 4, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(BATCH, WIDTH), st), *yv = dg_tensor_new(DG_INT32, dg_shape1(BATCH), st);
    fill_batch(xv, yv);
    dg_tensor *vals[2] = {xv, yv}, *got[2 * LAYERS] = {NULL};
    dg_run_options ro = {.trace = true};
    dg_step_trace *t = NULL;
    assert_true(dg_session_run_with_options(s, &ro, batch, vals, 2, p.grads, got, p.n_vars, NULL, 0, &t, st));
    assert_ok(st);
    span pieces[2][2][4];   // [stage][F, B][micro-batch]
    memset(pieces, 0, sizeof pieces);
    for (int i = 0; i < dg_step_trace_num_events(t); i++) {
        const dg_trace_event *e = dg_step_trace_event(t, i);
        int k, mb;
        char what[16];
        if (getenv("DG_TEST_PRINT_EVENTS")) fprintf(stderr, "%d %s %s\n", (int)e->kind, e->name, e->device);
        if (e->kind != DG_TRACE_OP || sscanf(e->name, "pipeline/s%d/mb%d/%15[^/]/", &k, &mb, what) != 3) continue;
        if (k < 0 || k > 1 || mb < 0 || mb > 3 || (strcmp(what, "fwd") != 0 && strcmp(what, "bwd") != 0)) continue;
        span *sp = &pieces[k][what[0] == 'b'][mb];
        if (!sp->seen || e->start_ns < sp->start) sp->start = e->start_ns;
        if (!sp->seen || e->end_ns > sp->end) sp->end = e->end_ns;
        sp->seen = true;
    }
    for (int k = 0; k < 2; k++) {
        // Each piece in the order given starts after the one before it ended.
        const char *w = want[k];
        int64_t last_end = -1;
        char prev[8] = "";
        for (int n = 0; n < 8; n++) {
            char ph;
            int mb, used;
            assert_int_equal(sscanf(w, " %c%d%n", &ph, &mb, &used), 2);
            w += used;
            const span *sp = &pieces[k][ph == 'B'][mb];
            assert_true(sp->seen);
            if (!(sp->start >= last_end)) {
                fprintf(stderr, "%s stage %d: %c%d started at %lld ns, before %s ended at %lld ns\n",
                        dg_pipeline_schedule_name(sch), k, ph, mb, (long long)sp->start, prev, (long long)last_end);
                fail();
            }
            last_end = sp->end;
            snprintf(prev, sizeof prev, "%c%d", ph, mb);
        }
    }
    dg_step_trace_free(&t);
    for (int i = 0; i < p.n_vars; i++) dg_tensor_free(&got[i]);
    dg_tensor_free(&xv);
    dg_tensor_free(&yv);
    dg_session_free(&s);
    dg_pipeline_free(&p);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_devices_run_pieces_in_schedule_order(void **state) {
    (void)state;
    const char *const gpipe[2] = {"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"};
    const char *const one_f_one_b[2] = {"F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"};
    check_order(DG_PIPELINE_GPIPE, gpipe);
    check_order(DG_PIPELINE_1F1B, one_f_one_b);
}

// ---- bad input ----

// Loss scaling through a pipeline (float16 training): with loss_scale, every gradient is the
// unpipelined model's times the scale; dg_optimizer_apply_gradients_with_loss_scale then makes
// the unscaled update (plain SGD here: w - lr g), and a step whose gradients are not finite (the
// scale times an infinite factor) changes no variable, counts a skipped step and halves the scale.
static void test_loss_scaled_pipeline(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    const char *devs[2] = {"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"};
    mlp model = {2, LAYERS / 2};
    dg_output batch[2] = {dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(BATCH, WIDTH)),
                          dg_placeholder(g, "y", DG_INT32, dg_shape1(BATCH))};
    dg_output gs = dg_global_step(g);
    dg_loss_scale_options lo = dg_loss_scale_options_default();
    lo.initial_scale = 1024;
    dg_loss_scale ls;
    assert_true(dg_loss_scale_make(g, gs, &lo, &ls));
    dg_output factor = dg_placeholder(g, "factor", DG_FLOAT32, dg_shape_scalar());
    dg_pipeline_options o = dg_pipeline_options_default();
    o.devices = devs;
    o.n_devices = 2;
    o.micro_batches = 4;
    o.stage_fn = stage_fn;
    o.arg = &model;
    o.loss_scale = dg_mul(g, NULL, ls.scale, factor);
    dg_pipeline p;
    assert_true(dg_pipeline_build(g, &o, batch, 2, &p, st));
    assert_ok(st);
    assert_int_equal(p.n_vars, 2 * LAYERS);
    dg_output h = batch[0];
    for (int l = 0; l < LAYERS; l++) h = layer(g, l, h, true);
    dg_output ref_loss = dg_sparse_softmax_cross_entropy(g, "ref_loss", h, batch[1]);
    dg_output ref[2 * LAYERS];
    assert_true(dg_gradients(g, &ref_loss, 1, p.vars, p.n_vars, NULL, ref));
    const double lr = 0.5;
    dg_optimizer opt = dg_gradient_descent(g, lr);
    dg_node *train = dg_optimizer_apply_gradients_with_loss_scale(&opt, p.grads, p.vars, p.n_vars, gs, &lo, &ls);
    assert_non_null(train);
    assert_non_null(ls.finite.node);
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_ok(g));
    dg_session *s = dg_test_local_session(g, 2, 0, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(BATCH, WIDTH), st), *yv = dg_tensor_new(DG_INT32, dg_shape1(BATCH), st);
    fill_batch(xv, yv);
    dg_tensor *one = dg_tensor_scalar_f32(1), *inf = dg_tensor_scalar_f32(INFINITY);
    dg_output feeds[3] = {batch[0], batch[1], factor};
    dg_tensor *vals[3] = {xv, yv, one};
    // The scaled gradients, the reference's and the variables before the step.
    enum { NV = 2 * LAYERS };
    dg_output fetch[3 * NV];
    dg_tensor *got[3 * NV] = {0}, *after[NV] = {0};
    for (int i = 0; i < NV; i++) {
        fetch[i] = p.grads[i];
        fetch[NV + i] = ref[i];
        fetch[2 * NV + i] = p.vars[i];
    }
    assert_true(dg_session_run(s, feeds, vals, 3, fetch, got, 3 * NV, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < NV; i++) {
        int64_t n = (int64_t)dg_tensor_num_elements(got[NV + i]);
        const float *r = dg_tensor_data(got[NV + i]);
        double *want = malloc((size_t)n * sizeof *want);
        for (int64_t k = 0; k < n; k++) want[k] = 1024.0 * r[k];
        double scale = dg_test_max_abs_f64(want, n);
        assert_true(scale > 1e-3);
        assert_int_equal(dg_test_first_far_f32(dg_tensor_data(got[i]), want, n, 1e-5 * scale, 1e-5), -1);
        free(want);
    }
    // One step: w - lr * (the unscaled gradient).
    assert_true(dg_session_run(s, feeds, vals, 3, NULL, NULL, 0, &train, 1, st));
    assert_true(dg_session_run(s, NULL, NULL, 0, p.vars, after, NV, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < NV; i++) {
        int64_t n = (int64_t)dg_tensor_num_elements(after[i]);
        const float *w0 = dg_tensor_data(got[2 * NV + i]), *r = dg_tensor_data(got[NV + i]);
        double *want = malloc((size_t)n * sizeof *want);
        for (int64_t k = 0; k < n; k++) want[k] = (double)w0[k] - lr * r[k];
        double scale = dg_test_max_abs_f64(want, n);
        assert_int_equal(dg_test_first_far_f32(dg_tensor_data(after[i]), want, n, 1e-5 * scale, 1e-5), -1);
        free(want);
    }
    // A step of infinite gradients: skipped, counted, the scale halved; no variable changes.
    vals[2] = inf;
    dg_output state_out[3] = {ls.finite, ls.skipped_steps, ls.scale};
    dg_tensor *sv[3] = {0}, *still[NV] = {0};
    assert_true(dg_session_run(s, feeds, vals, 3, &ls.finite, &sv[0], 1, &train, 1, st));
    assert_ok(st);
    assert_false(*(const bool *)dg_tensor_data(sv[0]));
    dg_tensor_free(&sv[0]);
    assert_true(dg_session_run(s, NULL, NULL, 0, state_out + 1, sv + 1, 2, NULL, 0, st));
    assert_true(dg_session_run(s, NULL, NULL, 0, p.vars, still, NV, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(*(const int64_t *)dg_tensor_data(sv[1]), 1);
    assert_true(*(const float *)dg_tensor_data(sv[2]) == 512.0f);
    for (int i = 0; i < NV; i++)
        assert_memory_equal(dg_tensor_data(still[i]), dg_tensor_data(after[i]), dg_tensor_nbytes(after[i]));
    for (int i = 0; i < 3 * NV; i++) dg_tensor_free(&got[i]);
    for (int i = 0; i < NV; i++) {
        dg_tensor_free(&after[i]);
        dg_tensor_free(&still[i]);
    }
    for (int i = 1; i < 3; i++) dg_tensor_free(&sv[i]);
    dg_tensor_free(&one);
    dg_tensor_free(&inf);
    dg_tensor_free(&xv);
    dg_tensor_free(&yv);
    dg_session_free(&s);
    dg_pipeline_free(&p);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static int bad_stage(dg_graph *g, int stage, int mb, const dg_output *in, int n_in, dg_output *out, int cap, void *arg) {
    (void)cap;
    (void)n_in;
    int kind = *(int *)arg;
    if (kind == 0) {   // the last stage returns a vector, not a scalar loss
        out[0] = in[0];
        return 1;
    }
    if (kind == 1) {   // a different number of outputs for micro-batch 1
        out[0] = dg_sum(g, NULL, in[0], NULL, 0, false);
        out[1] = out[0];
        return stage == 0 && mb == 1 ? 2 : 1;
    }
    dg_graph_set_error(g, DG_INVALID_ARGUMENT, "stage %d refuses", stage);
    return -1;
}

static void expect_build_error(int kind, int m, const char *needle) {
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(6, 3));
    const char *devs[2] = {"/device:CPU:0", "/device:CPU:1"};
    dg_pipeline_options o = dg_pipeline_options_default();
    o.devices = devs;
    o.n_devices = 2;
    o.micro_batches = m;
    o.stage_fn = bad_stage;
    o.arg = &kind;
    dg_pipeline p;
    assert_false(dg_pipeline_build(g, &o, &x, 1, &p, st));
    assert_status(st, DG_INVALID_ARGUMENT, needle);
    assert_int_equal(p.n_vars, 0);
    assert_null(p.vars);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// The stage an error concerns, named from the task the message names last: stages over two
// tasks (interleaved, two chunks each: stages 0 and 2 on the worker, 1 and 3 on ps 0).
static void test_errors_name_the_stage(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    const char *devs[2] = {"/job:worker/task:0", "/job:ps/task:0"};
    mlp model;
    dg_output batch[2];
    dg_pipeline p;
    build_test_pipeline(g, &model, devs, 2, 2, 4, DG_PIPELINE_INTERLEAVED_1F1B, false, batch, &p);
    struct {
        const char *msg, *want;   // want NULL: nothing named
    } cases[] = {
        {"/job:ps/replica:0/task:0 at tcp://127.0.0.1:1 did not answer",
         "pipeline stages 1, 3 (on /job:ps/task:0): /job:ps/replica:0/task:0 at"},
        {"node a on /job:ps/replica:0/task:0/device:CPU:0: waiting for /job:worker/replica:0/task:0: gone",
         "pipeline stages 0, 2 (on /job:worker/task:0): node a"},
        {"task /job:ps/task:0 is lost", "pipeline stages 1, 3 (on /job:ps/task:0): task"},
        {"task /job:ps/task:01 and /job:ps/replica:0/task:10 are lost", NULL},
        {"no task named here", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dg_status_set(st, DG_UNAVAILABLE, cases[i].msg);
        bool named = dg_pipeline_name_stage(&p, st);
        assert_int_equal(named, cases[i].want != NULL);
        assert_int_equal(dg_status_code(st), DG_UNAVAILABLE);
        if (cases[i].want) assert_non_null(strstr(dg_status_message(st), cases[i].want));
        else assert_string_equal(dg_status_message(st), cases[i].msg);
    }
    dg_status_reset(st);
    assert_false(dg_pipeline_name_stage(&p, st));   // no error: nothing to name
    dg_pipeline_free(&p);
    dg_status_free(&st);
    dg_graph_free(&g);
}

static void test_bad_pipelines_are_named(void **state) {
    (void)state;
    expect_build_error(0, 2, "the last stage's first output must be the loss");
    expect_build_error(1, 2, "stage 0 returned 2 outputs for micro-batch 1");
    expect_build_error(2, 2, "stage 0 refuses");
    expect_build_error(0, 4, "not a multiple of 4 micro-batches");
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(6, 3));
    dg_pipeline_options o = dg_pipeline_options_default();
    dg_pipeline p;
    assert_false(dg_pipeline_build(g, &o, &x, 1, &p, st));
    assert_status(st, DG_INVALID_ARGUMENT, "no stage function");
    dg_graph_free(&g);
    // A loss scale that is not a float scalar.
    g = dg_graph_new();
    x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(6, 3));
    mlp model = {1, LAYERS};
    const char *dev = "/job:localhost/replica:0/task:0/device:CPU:0";
    o.devices = &dev;
    o.n_devices = 1;
    o.stage_fn = stage_fn;
    o.arg = &model;
    o.loss_scale = dg_placeholder(g, "scale", DG_INT32, dg_shape_scalar());
    assert_false(dg_pipeline_build(g, &o, &x, 1, &p, st));
    assert_status(st, DG_INVALID_ARGUMENT, "loss_scale is int32 of rank 0, not a float scalar");
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedules_have_the_papers_bubbles),
        cmocka_unit_test(test_schedule_arguments_are_checked),
        cmocka_unit_test(test_gpipe_gradients_equal_unpipelined),
        cmocka_unit_test(test_1f1b_gradients_equal_unpipelined),
        cmocka_unit_test(test_interleaved_gradients_equal_unpipelined),
        cmocka_unit_test(test_zb_h1_gradients_equal_unpipelined),
        cmocka_unit_test(test_recomputation_gives_the_same_gradients),
        cmocka_unit_test(test_mixed_precision_gradients_equal_unpipelined),
        cmocka_unit_test(test_devices_run_pieces_in_schedule_order),
        cmocka_unit_test(test_bad_pipelines_are_named),
        cmocka_unit_test(test_loss_scaled_pipeline),
        cmocka_unit_test(test_errors_name_the_stage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
