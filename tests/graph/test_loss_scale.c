/* Dynamic loss scaling (dg_optimizer_minimize_with_loss_scale). Scaling by a power of two and
 * dividing again is exact in binary floating point, so on the steps it applies, a loss-scaled
 * float32 model must track the same model trained without scaling bit for bit, for each
 * optimizer that can skip (gradient descent, momentum, Adam, AdamW); on the steps whose loss is
 * forced to overflow it must change no variable or slot, halve the scale and count the skip; the
 * scale must double after growth_interval finite steps. With float16 products, a loss multiplied
 * by 1e30 for three steps is skipped three times, no NaN reaches a variable, and training goes
 * on. Unsupported optimizers and bad options are refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { B = 16, K = 12, N = 3, STEPS = 12 };

typedef struct model {
    dg_graph *g;
    dg_output x, y, factor, w, b, loss;
    dg_node *train, *init;
    dg_loss_scale ls;
    dg_session *s;
} model;

static dg_optimizer make_opt(dg_graph *g, int kind) {
    switch (kind) {
    case 0: return dg_gradient_descent(g, 0.05);
    case 1: return dg_momentum(g, 0.05, 0.9, true);
    case 2: return dg_adam(g, 0.01);
    default: return dg_adamw(g, 0.01, 0.1);
    }
}

// A linear least-squares model, loss = mean((x w + b - y)^2) * factor; with loss scaling (o not
// NULL) or without; products in float16 when f16.
static void model_make(model *m, int kind, const dg_loss_scale_options *o, bool f16) {
    dg_status *st = dg_status_new();
    memset(m, 0, sizeof *m);
    m->g = dg_graph_new();
    if (f16) assert_true(dg_graph_set_mixed_precision(m->g, DG_FLOAT16, st));
    m->x = dg_placeholder(m->g, "x", DG_FLOAT32, dg_shape2(B, K));
    m->y = dg_placeholder(m->g, "y", DG_FLOAT32, dg_shape2(B, N));
    m->factor = dg_placeholder(m->g, "factor", DG_FLOAT32, dg_shape_scalar());
    m->w = dg_variable(m->g, "w", DG_FLOAT32, dg_shape2(K, N), dg_init_random_uniform(-0.5, 0.5, 11));
    m->b = dg_variable(m->g, "b", DG_FLOAT32, dg_shape1(N), dg_init_zeros());
    dg_output err = dg_sub(m->g, NULL, dg_add(m->g, NULL, dg_matmul(m->g, "xw", m->x, m->w, false, false), m->b), m->y);
    m->loss = dg_mul(m->g, "loss", dg_mean(m->g, NULL, dg_square(m->g, NULL, err), NULL, 0, false), m->factor);
    dg_optimizer opt = make_opt(m->g, kind);
    dg_output gs = dg_global_step(m->g);
    m->train = o ? dg_optimizer_minimize_with_loss_scale(&opt, m->loss, gs, o, &m->ls)
                 : dg_optimizer_minimize(&opt, m->loss, gs);
    assert_ok(dg_graph_status(m->g));
    assert_non_null(m->train);
    m->init = dg_global_variables_initializer(m->g);
    m->s = dg_session_new(m->g, "local", NULL, st);
    assert_ok(st);
    assert_true(dg_session_run(m->s, NULL, NULL, 0, NULL, NULL, 0, &m->init, 1, st));
    dg_status_free(&st);
}

static void model_free(model *m) {
    dg_session_free(&m->s);
    dg_graph_free(&m->g);
}

// The batch of step i (the same for every model) and the factor.
static void batch(int i, float *xv, float *yv) {
    uint64_t seed = 100 + (uint64_t)i;
    for (int k = 0; k < B * K; k++) xv[k] = (float)dg_test_uniform(&seed, -1, 1);
    for (int k = 0; k < B * N; k++) yv[k] = (float)dg_test_uniform(&seed, -1, 1);
}

// One training step; fetches (when out is not NULL) the given outputs after it.
static void step(model *m, int i, float factor, const dg_output *fetch, dg_tensor **out, int n_fetch) {
    dg_status *st = dg_status_new();
    float xv[B * K], yv[B * N];
    batch(i, xv, yv);
    dg_tensor *feed[3] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, K), xv, st),
                          dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, N), yv, st), dg_tensor_scalar_f32(factor)};
    dg_output feeds[3] = {m->x, m->y, m->factor};
    assert_true(dg_session_run(m->s, feeds, feed, 3, NULL, NULL, 0, &m->train, 1, st));
    assert_ok(st);
    if (n_fetch) {
        assert_true(dg_session_run(m->s, NULL, NULL, 0, fetch, out, n_fetch, NULL, 0, st));
        assert_ok(st);
    }
    for (int k = 0; k < 3; k++) dg_tensor_unref(feed[k]);
    dg_status_free(&st);
}

// Every variable of the model's graph, by name, in creation order: the values of all of them.
static int variables(model *m, dg_output *vars, int cap) {
    int n = dg_graph_collection_size(m->g, DG_GLOBAL_VARIABLES);
    assert_true(n <= cap);
    for (int i = 0; i < n; i++) vars[i] = (dg_output){dg_graph_collection_get(m->g, DG_GLOBAL_VARIABLES, i), 0};
    return n;
}

static bool same_bits(const dg_tensor *a, const dg_tensor *b) {
    return dg_tensor_nbytes(a) == dg_tensor_nbytes(b) && memcmp(dg_tensor_data(a), dg_tensor_data(b), dg_tensor_nbytes(a)) == 0;
}

// Steps 4, 5 and 6 overflow (factor 1e35: the scaled loss is infinite); growth_interval 3.
static bool overflows(int i) { return i >= 4 && i <= 6; }

static void test_tracks_unscaled_and_skips(void **state) {
    (void)state;
    const char *names[] = {"GradientDescent", "Momentum", "Adam", "AdamW"};
    for (int kind = 0; kind < 4; kind++) {
        dg_loss_scale_options o = dg_loss_scale_options_default();
        o.growth_interval = 3;
        model scaled, plain;
        model_make(&scaled, kind, &o, false);
        model_make(&plain, kind, NULL, false);
        dg_output vars[16];
        int nv = variables(&scaled, vars, 16);
        double want_scale = o.initial_scale;
        int64_t want_skipped = 0, good = 0;
        for (int i = 1; i <= STEPS; i++) {
            dg_tensor *before[16] = {0}, *after[16] = {0};
            dg_status *st = dg_status_new();
            assert_true(dg_session_run(scaled.s, NULL, NULL, 0, vars, before, nv, NULL, 0, st));
            dg_output f[3] = {scaled.ls.scale, scaled.ls.skipped_steps, scaled.ls.good_steps};
            dg_tensor *fo[3] = {0};
            step(&scaled, i, overflows(i) ? 1e35f : 1.0f, f, fo, 3);
            if (overflows(i)) {
                want_scale /= 2;
                want_skipped++;
                good = 0;
            } else {
                step(&plain, i, 1.0f, NULL, NULL, 0);
                if (++good == o.growth_interval) {
                    want_scale *= 2;
                    good = 0;
                }
            }
            if (!(dg_tensor_f32(fo[0])[0] == (float)want_scale))
                fail_msg("%s step %d: scale %g, want %g", names[kind], i, dg_tensor_f32(fo[0])[0], want_scale);
            assert_int_equal(dg_tensor_i64(fo[1])[0], want_skipped);
            assert_int_equal(dg_tensor_i64(fo[2])[0], good);
            assert_true(dg_session_run(scaled.s, NULL, NULL, 0, vars, after, nv, NULL, 0, st));
            for (int v = 0; v < nv; v++) {
                const char *vn = dg_node_name(vars[v].node);
                if (dg_output_dtype(vars[v]) == DG_FLOAT32) {
                    const float *a = dg_tensor_f32(after[v]);
                    for (int64_t e = 0; e < dg_tensor_num_elements(after[v]); e++)
                        if (!isfinite(a[e])) fail_msg("%s step %d: %s[%lld] = %g", names[kind], i, vn, (long long)e, a[e]);
                }
                // A skipped step leaves every variable and slot (the scaler's own and the
                // global step apart) as it was, bit for bit.
                if (overflows(i) && strncmp(vn, "loss_scale/", 11) != 0 && strcmp(vn, "global_step") != 0 &&
                    !same_bits(before[v], after[v]))
                    fail_msg("%s step %d (skipped): %s changed", names[kind], i, vn);
                dg_tensor_unref(before[v]);
                dg_tensor_unref(after[v]);
            }
            for (int k = 0; k < 3; k++) dg_tensor_unref(fo[k]);
            dg_status_free(&st);
        }
        // The applied steps equal the unscaled model's, bit for bit: w, b and the slots.
        dg_output pv[16];
        int np = variables(&plain, pv, 16);
        dg_status *st = dg_status_new();
        for (int v = 0; v < np; v++) {
            const char *vn = dg_node_name(pv[v].node);
            if (strcmp(vn, "global_step") == 0) continue;   // counts the skipped steps too, in the scaled model
            int match = -1;
            for (int u = 0; u < nv; u++)
                if (strcmp(dg_node_name(vars[u].node), vn) == 0) match = u;
            if (match < 0) fail_msg("%s: the scaled model has no variable %s", names[kind], vn);
            dg_tensor *a = NULL, *b = NULL;
            assert_true(dg_session_run(plain.s, NULL, NULL, 0, &pv[v], &a, 1, NULL, 0, st));
            assert_true(dg_session_run(scaled.s, NULL, NULL, 0, &vars[match], &b, 1, NULL, 0, st));
            if (!same_bits(a, b)) fail_msg("%s: %s differs from the unscaled model's", names[kind], vn);
            dg_tensor_unref(a);
            dg_tensor_unref(b);
        }
        dg_status_free(&st);
        model_free(&scaled);
        model_free(&plain);
    }
}

// The loss of batch 0 at factor 1, no training.
static double eval_loss(model *m) {
    dg_status *st = dg_status_new();
    float xv[B * K], yv[B * N];
    batch(0, xv, yv);
    dg_tensor *feed[3] = {dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, K), xv, st),
                          dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, N), yv, st), dg_tensor_scalar_f32(1)};
    dg_output feeds[3] = {m->x, m->y, m->factor};
    dg_tensor *out = NULL;
    assert_true(dg_session_run(m->s, feeds, feed, 3, &m->loss, &out, 1, NULL, 0, st));
    assert_ok(st);
    double v = dg_tensor_f32(out)[0];
    dg_tensor_unref(out);
    for (int k = 0; k < 3; k++) dg_tensor_unref(feed[k]);
    dg_status_free(&st);
    return v;
}

// Float16 products: a loss multiplied by 1e30 for three steps overflows the float16 gradient
// (past 65504); each such step is skipped and counted, nothing turns NaN or infinite, and
// training goes on: the loss of a fixed batch falls below 80% of where it started.
static void test_float16_forced_overflow(void **state) {
    (void)state;
    dg_loss_scale_options o = dg_loss_scale_options_default();
    model m;
    model_make(&m, 2, &o, true);
    double first = eval_loss(&m);
    dg_output vars[16];
    int nv = variables(&m, vars, 16);
    for (int i = 1; i <= 80; i++) {
        bool force = i >= 10 && i < 13;
        dg_tensor *out[1] = {0};
        step(&m, i, force ? 1e30f : 1.0f, &m.ls.skipped_steps, out, 1);
        assert_int_equal(dg_tensor_i64(out[0])[0], i < 10 ? 0 : i < 13 ? i - 9 : 3);
        dg_tensor_unref(out[0]);
        dg_tensor *vals[16] = {0};
        dg_status *st = dg_status_new();
        assert_true(dg_session_run(m.s, NULL, NULL, 0, vars, vals, nv, NULL, 0, st));
        for (int v = 0; v < nv; v++) {
            if (dg_output_dtype(vars[v]) == DG_FLOAT32) {
                const float *a = dg_tensor_f32(vals[v]);
                for (int64_t e = 0; e < dg_tensor_num_elements(vals[v]); e++)
                    if (!isfinite(a[e]))
                        fail_msg("step %d: %s[%lld] = %g", i, dg_node_name(vars[v].node), (long long)e, a[e]);
            }
            dg_tensor_unref(vals[v]);
        }
        dg_status_free(&st);
    }
    double last = eval_loss(&m);
    if (!(isfinite(first) && last < 0.8 * first)) fail_msg("loss of batch 0: %g before, %g after 80 steps", first, last);
    model_free(&m);
}

static void test_refused(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    dg_output loss = dg_sum(g, NULL, dg_square(g, NULL, w), NULL, 0, false);
    dg_optimizer opt = dg_adagrad(g, 0.1, 0.1);
    assert_null(dg_optimizer_minimize_with_loss_scale(&opt, loss, dg_global_step(g), NULL, NULL));
    assert_status(dg_graph_status(g), DG_UNIMPLEMENTED, "Adagrad cannot skip a step");
    dg_graph_free(&g);

    g = dg_graph_new();
    w = dg_variable(g, "w", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    loss = dg_sum(g, NULL, dg_square(g, NULL, w), NULL, 0, false);
    opt = dg_adam(g, 0.1);
    dg_loss_scale_options o = dg_loss_scale_options_default();
    o.multiplier = 1;
    dg_loss_scale ls;
    assert_null(dg_optimizer_minimize_with_loss_scale(&opt, loss, dg_global_step(g), &o, &ls));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "multiplier in (1, 1e6]");
    assert_null(ls.scale.node);
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tracks_unscaled_and_skips),
        cmocka_unit_test(test_float16_forced_overflow),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
