/* The ops of real models (issue "Real models, part 1"), forward values against references
 * computed here in float64 (a direct convolution, pooling loops, index arithmetic), Dropout's
 * statistics, the learning-rate schedules, batch normalization and the summary helpers, and bad
 * input: each error a
 * status naming the node or schedule. Gradients are checked by finite differences in
 * tests/graph/test_gradients.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static dg_tensor *filled(dg_dtype t, dg_shape s, uint64_t *rng, double lo, double hi) {
    dg_status *st = dg_status_new();
    dg_tensor *x = dg_tensor_new(t, s, st);
    assert_ok(st);
    for (int64_t i = 0; i < dg_tensor_num_elements(x); i++) {
        double v = dg_test_uniform(rng, lo, hi);
        if (t == DG_FLOAT32) dg_tensor_f32(x)[i] = (float)v;
        else if (t == DG_FLOAT64) dg_tensor_f64(x)[i] = v;
        else if (t == DG_INT64) dg_tensor_i64(x)[i] = (int64_t)floor(v);
        else if (t == DG_INT32) dg_tensor_i32(x)[i] = (int32_t)floor(v);
    }
    dg_status_free(&st);
    return x;
}

static dg_tensor *bool_scalar(bool v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_new(DG_BOOL, dg_shape_scalar(), st);
    assert_ok(st);
    *(uint8_t *)dg_tensor_data(t) = v;
    dg_status_free(&st);
    return t;
}

// Runs fetches with feeds on a fresh local session (after the initializers); outs new.
static void run(dg_graph *g, const dg_output *feeds, dg_tensor *const *vals, int n_feeds, const dg_output *fetches,
                dg_tensor **outs, int n_fetches) {
    dg_status *st = dg_status_new();
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_check(g, st));
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    assert_true(dg_session_run_target(s, init, st));
    if (!dg_session_run(s, feeds, vals, n_feeds, fetches, outs, n_fetches, NULL, 0, st))
        fail_msg("run: %s", dg_status_message(st));
    dg_session_free(&s);
    dg_status_free(&st);
}

static void expect_tensor_close(const dg_tensor *got, const double *want, int64_t n, double tol, const char *what) {
    assert_int_equal(dg_tensor_num_elements(got), n);
    for (int64_t i = 0; i < n; i++) {
        double u = dg_tensor_get_as_double(got, i);
        if (!dg_test_is_close(u, want[i], tol, tol))
            fail_msg("%s: element %lld is %.17g, want %.17g", what, (long long)i, u, want[i]);
    }
}

// ---- convolution and pooling against direct loops ----

typedef struct win {
    int64_t n, h, w, c, kh, kw, sh, sw, oc;
    bool same;
} win;

static void out_dims(const win *p, int64_t *oh, int64_t *ow, int64_t *pt, int64_t *pl) {
    if (p->same) {
        *oh = (p->h + p->sh - 1) / p->sh;
        *ow = (p->w + p->sw - 1) / p->sw;
        int64_t ph = (*oh - 1) * p->sh + p->kh - p->h, pw = (*ow - 1) * p->sw + p->kw - p->w;
        *pt = ph > 0 ? ph / 2 : 0;
        *pl = pw > 0 ? pw / 2 : 0;
    } else {
        *oh = (p->h - p->kh) / p->sh + 1;
        *ow = (p->w - p->kw) / p->sw + 1;
        *pt = *pl = 0;
    }
}

static void test_conv2d_forward(void **state) {
    (void)state;
    const win cases[] = {
        {2, 7, 6, 3, 3, 3, 1, 1, 4, true},  {1, 8, 9, 2, 5, 4, 2, 3, 3, true}, {2, 9, 7, 2, 3, 2, 2, 2, 5, false},
        {3, 4, 4, 5, 1, 1, 1, 1, 2, false}, {1, 5, 5, 1, 5, 5, 1, 1, 2, false},
    };
    uint64_t rng = 11;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const win *p = &cases[ci];
        for (int ti = 0; ti < 2; ti++) {
            dg_dtype t = ti ? DG_FLOAT64 : DG_FLOAT32;
            int64_t xd[4] = {p->n, p->h, p->w, p->c}, fd[4] = {p->kh, p->kw, p->c, p->oc};
            dg_tensor *x = filled(t, dg_shape_make(4, xd), &rng, -1, 1), *f = filled(t, dg_shape_make(4, fd), &rng, -1, 1);
            dg_graph *g = dg_graph_new();
            dg_output px = dg_placeholder(g, "x", t, dg_shape_make(4, xd)), pf = dg_placeholder(g, "f", t, dg_shape_make(4, fd));
            dg_output y = dg_conv2d(g, NULL, px, pf, (int)p->sh, (int)p->sw, p->same ? DG_PADDING_SAME : DG_PADDING_VALID);
            dg_output feeds[2] = {px, pf};
            dg_tensor *vals[2] = {x, f}, *out = NULL;
            run(g, feeds, vals, 2, &y, &out, 1);
            int64_t oh, ow, pt, pl;
            out_dims(p, &oh, &ow, &pt, &pl);
            int64_t n_out = p->n * oh * ow * p->oc;
            double *want = calloc((size_t)n_out, sizeof *want);
            for (int64_t b = 0; b < p->n; b++)
                for (int64_t oy = 0; oy < oh; oy++)
                    for (int64_t ox = 0; ox < ow; ox++)
                        for (int64_t o = 0; o < p->oc; o++) {
                            double acc = 0;
                            for (int64_t ky = 0; ky < p->kh; ky++)
                                for (int64_t kx = 0; kx < p->kw; kx++)
                                    for (int64_t c = 0; c < p->c; c++) {
                                        int64_t iy = oy * p->sh - pt + ky, ix = ox * p->sw - pl + kx;
                                        if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w) continue;
                                        acc += dg_tensor_get_as_double(x, ((b * p->h + iy) * p->w + ix) * p->c + c) *
                                               dg_tensor_get_as_double(f, ((ky * p->kw + kx) * p->c + c) * p->oc + o);
                                    }
                            want[((b * oh + oy) * ow + ox) * p->oc + o] = acc;
                        }
            char what[64];
            snprintf(what, sizeof what, "conv case %zu %s", ci, dg_dtype_name(t));
            assert_int_equal(dg_tensor_shape(out)->dims[1], oh);
            assert_int_equal(dg_tensor_shape(out)->dims[2], ow);
            expect_tensor_close(out, want, n_out, t == DG_FLOAT32 ? 1e-5 : 1e-12, what);
            free(want);
            dg_tensor_unref(out);
            dg_tensor_unref(x);
            dg_tensor_unref(f);
            dg_graph_free(&g);
        }
    }
}

static void test_pool_forward(void **state) {
    (void)state;
    const win cases[] = {
        {2, 6, 6, 3, 2, 2, 2, 2, 3, false}, {1, 7, 5, 2, 3, 3, 2, 2, 2, true}, {2, 5, 6, 4, 3, 2, 1, 2, 4, true},
    };
    uint64_t rng = 12;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const win *p = &cases[ci];
        int64_t xd[4] = {p->n, p->h, p->w, p->c};
        dg_tensor *x = filled(DG_FLOAT64, dg_shape_make(4, xd), &rng, -1, 1);
        dg_graph *g = dg_graph_new();
        dg_output px = dg_placeholder(g, "x", DG_FLOAT64, dg_shape_make(4, xd));
        dg_padding pad = p->same ? DG_PADDING_SAME : DG_PADDING_VALID;
        dg_output y[2] = {dg_max_pool(g, NULL, px, (int)p->kh, (int)p->kw, (int)p->sh, (int)p->sw, pad),
                          dg_avg_pool(g, NULL, px, (int)p->kh, (int)p->kw, (int)p->sh, (int)p->sw, pad)};
        dg_tensor *out[2];
        run(g, &px, &x, 1, y, out, 2);
        int64_t oh, ow, pt, pl;
        out_dims(p, &oh, &ow, &pt, &pl);
        int64_t n_out = p->n * oh * ow * p->c;
        double *wmax = calloc((size_t)n_out, sizeof *wmax), *wavg = calloc((size_t)n_out, sizeof *wavg);
        for (int64_t b = 0; b < p->n; b++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++)
                    for (int64_t c = 0; c < p->c; c++) {
                        double mx = -INFINITY, sum = 0;
                        int cnt = 0;
                        for (int64_t ky = 0; ky < p->kh; ky++)
                            for (int64_t kx = 0; kx < p->kw; kx++) {
                                int64_t iy = oy * p->sh - pt + ky, ix = ox * p->sw - pl + kx;
                                if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w) continue;
                                double v = dg_tensor_f64(x)[((b * p->h + iy) * p->w + ix) * p->c + c];
                                if (v > mx) mx = v;   // the reference's inputs are finite
                                sum += v;
                                cnt++;
                            }
                        int64_t at = ((b * oh + oy) * ow + ox) * p->c + c;
                        wmax[at] = mx;
                        wavg[at] = sum / cnt;   // SAME: only the elements inside count
                    }
        expect_tensor_close(out[0], wmax, n_out, 0, "max pool");
        expect_tensor_close(out[1], wavg, n_out, 1e-14, "avg pool");
        free(wmax);
        free(wavg);
        dg_tensor_unref(out[0]);
        dg_tensor_unref(out[1]);
        dg_tensor_unref(x);
        dg_graph_free(&g);
    }
}

// ---- Dropout ----

static void test_dropout(void **state) {
    (void)state;
    const int64_t n = 200000;
    const double rate = 0.3;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(n));
    dg_output tr = dg_placeholder(g, "training", DG_BOOL, dg_shape_scalar());
    dg_output d = dg_dropout(g, NULL, x, rate, tr, 42);
    dg_output f = dg_sum(g, NULL, d, NULL, 0, false), dx;
    assert_true(dg_gradients(g, &f, 1, &x, 1, NULL, &dx));
    uint64_t rng = 3;
    dg_tensor *xv = filled(DG_FLOAT64, dg_shape1(n), &rng, 0.5, 1.5), *on = bool_scalar(true), *off = bool_scalar(false);
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    dg_output feeds[2] = {x, tr}, fetches[3] = {d, {d.node, 1}, dx};
    dg_tensor *vals[2] = {xv, on}, *a[3], *b[3];
    assert_true(dg_session_run(s, feeds, vals, 2, fetches, a, 3, NULL, 0, st));
    assert_true(dg_session_run(s, feeds, vals, 2, fetches, b, 3, NULL, 0, st));
    int64_t kept = 0, differ = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = dg_tensor_f64(a[1])[i], y = dg_tensor_f64(a[0])[i], xi = dg_tensor_f64(xv)[i];
        if (m != 0 && m != 1 / (1 - rate)) fail_msg("mask %lld is %g", (long long)i, m);
        if (y != xi * m) fail_msg("y %lld is %g, x * mask %g", (long long)i, y, xi * m);
        if (dg_tensor_f64(a[2])[i] != m) fail_msg("gradient %lld is %g, the mask %g", (long long)i, dg_tensor_f64(a[2])[i], m);
        kept += m != 0;
        differ += m != dg_tensor_f64(b[1])[i];
    }
    // Kept fraction 0.7 within 5 standard deviations (sqrt(0.21 / n) ~ 0.001).
    double frac = (double)kept / (double)n;
    if (!dg_test_is_close(frac, 1 - rate, 0.0052, 0)) fail_msg("kept %g of the elements, want %g", frac, 1 - rate);
    if (!(differ > n / 4)) fail_msg("the second run's mask differs in only %lld elements", (long long)differ);
    for (int k = 0; k < 3; k++) {
        dg_tensor_unref(a[k]);
        dg_tensor_unref(b[k]);
    }
    // Not training: x itself, a mask of ones.
    vals[1] = off;
    assert_true(dg_session_run(s, feeds, vals, 2, fetches, a, 2, NULL, 0, st));
    for (int64_t i = 0; i < n; i++)
        if (dg_tensor_f64(a[0])[i] != dg_tensor_f64(xv)[i] || dg_tensor_f64(a[1])[i] != 1) fail_msg("not training: %lld", (long long)i);
    dg_tensor_unref(a[0]);
    dg_tensor_unref(a[1]);
    // A bad rate is refused when built.
    dg_dropout(g, "bad", x, 1.0, tr, 0);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "rate");
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_tensor_unref(xv);
    dg_tensor_unref(on);
    dg_tensor_unref(off);
    dg_status_free(&st);
}

// ---- array ops ----

static void test_array_ops(void **state) {
    (void)state;
    uint64_t rng = 5;
    dg_graph *g = dg_graph_new();
    dg_tensor *x = filled(DG_FLOAT64, dg_shape3(2, 3, 4), &rng, -1, 1);
    dg_tensor *ix = filled(DG_INT32, dg_shape2(2, 3), &rng, -1, 4);   // some outside [0, 3)
    dg_tensor *c = filled(DG_FLOAT64, dg_shape2(3, 1), &rng, -1, 1);
    dg_tensor *t = filled(DG_FLOAT64, dg_shape1(4), &rng, -1, 1), *e = filled(DG_FLOAT64, dg_shape2(3, 4), &rng, -1, 1);
    dg_tensor *p = filled(DG_FLOAT64, dg_shape2(3, 4), &rng, 0.5, 2), *q = filled(DG_FLOAT64, dg_shape2(3, 4), &rng, -2, 2);
    dg_output px = dg_placeholder(g, "x", DG_FLOAT64, dg_shape3(2, 3, 4));
    dg_output pi = dg_placeholder(g, "ix", DG_INT32, dg_shape2(2, 3));
    dg_output pc = dg_placeholder(g, "c", DG_FLOAT64, dg_shape2(3, 1));
    dg_output pt = dg_placeholder(g, "t", DG_FLOAT64, dg_shape1(4)), pe = dg_placeholder(g, "e", DG_FLOAT64, dg_shape2(3, 4));
    dg_output pp = dg_placeholder(g, "p", DG_FLOAT64, dg_shape2(3, 4)), pq = dg_placeholder(g, "q", DG_FLOAT64, dg_shape2(3, 4));
    static const int64_t perm[] = {2, 0, 1}, mult[] = {2, 1, 3};
    dg_output fetches[5] = {
        dg_transpose(g, NULL, px, perm, 3),
        dg_tile(g, NULL, px, mult, 3),
        dg_one_hot(g, NULL, pi, 3, 5.0, -1.0, DG_FLOAT32),
        dg_where(g, NULL, dg_greater(g, NULL, pc, dg_scalar(g, NULL, DG_FLOAT64, 0)), pt, pe),
        dg_pow(g, NULL, pp, pq),
    };
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_shape(fetches[0]).dims[0], 4);
    assert_int_equal(dg_output_shape(fetches[1]).dims[2], 12);
    assert_int_equal(dg_output_shape(fetches[2]).rank, 3);
    dg_output feeds[7] = {px, pi, pc, pt, pe, pp, pq};
    dg_tensor *vals[7] = {x, ix, c, t, e, p, q}, *out[5];
    run(g, feeds, vals, 7, fetches, out, 5);
    const double *xv = dg_tensor_f64(x);
    double want[144];
    for (int a = 0; a < 4; a++)   // transpose: out[a][b][c] = x[b][c][a]
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 3; k++) want[(a * 2 + b) * 3 + k] = xv[(b * 3 + k) * 4 + a];
    expect_tensor_close(out[0], want, 24, 0, "transpose");
    for (int a = 0; a < 4; a++)   // tile [4, 3, 12]: x[a % 2][b][k % 4]
        for (int b = 0; b < 3; b++)
            for (int k = 0; k < 12; k++) want[(a * 3 + b) * 12 + k] = xv[((a % 2) * 3 + b) * 4 + k % 4];
    expect_tensor_close(out[1], want, 144, 0, "tile");
    for (int r = 0; r < 6; r++)
        for (int k = 0; k < 3; k++) want[r * 3 + k] = dg_tensor_i32(ix)[r] == k ? 5.0 : -1.0;
    expect_tensor_close(out[2], want, 18, 0, "one_hot");
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 4; k++) want[r * 4 + k] = dg_tensor_f64(c)[r] > 0 ? dg_tensor_f64(t)[k] : dg_tensor_f64(e)[r * 4 + k];
    expect_tensor_close(out[3], want, 12, 0, "where");
    for (int i = 0; i < 12; i++) want[i] = pow(dg_tensor_f64(p)[i], dg_tensor_f64(q)[i]);
    expect_tensor_close(out[4], want, 12, 1e-15, "pow");
    for (int k = 0; k < 5; k++) dg_tensor_unref(out[k]);
    // stop_gradient: d/dx sum(x * stop(x)) = stop(x) = x, not 2x.
    dg_output f = dg_sum(g, NULL, dg_mul(g, NULL, pp, dg_stop_gradient(g, NULL, pp)), NULL, 0, false), dp;
    assert_true(dg_gradients(g, &f, 1, &pp, 1, NULL, &dp));
    run(g, &pp, &p, 1, &dp, out, 1);
    expect_tensor_close(out[0], dg_tensor_f64(p), 12, 0, "stop_gradient");
    dg_tensor_unref(out[0]);
    // Bad input names the node.
    static const int64_t bad_perm[] = {0, 0, 1};
    dg_transpose(g, "bad_perm", px, bad_perm, 3);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "bad_perm");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "permutation");
    dg_tensor *vv[7] = {x, ix, c, t, e, p, q};
    // Shapes known only when run that do not broadcast: the node named once.
    dg_graph *g2 = dg_graph_new();
    dg_output ut = dg_placeholder(g2, "ut", DG_FLOAT64, dg_shape1(-1)), ue = dg_placeholder(g2, "ue", DG_FLOAT64, dg_shape1(-1));
    dg_output sel = dg_where(g2, "sel_bad", dg_greater(g2, NULL, ut, dg_scalar(g2, NULL, DG_FLOAT64, 0)), ut, ue);
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g2, "local", NULL, st);
    assert_non_null(s);
    dg_output uf[2] = {ut, ue};
    dg_tensor *uv[2] = {t, dg_tensor_new(DG_FLOAT64, dg_shape1(3), st)}, *uo = NULL;
    assert_false(dg_session_run(s, uf, uv, 2, &sel, &uo, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "sel_bad");
    const char *m = dg_status_message(st), *first = strstr(m, "sel_bad");
    if (strstr(first + 1, "sel_bad")) fail_msg("the node is named twice: %s", m);
    dg_tensor_unref(uv[1]);
    dg_session_free(&s);
    dg_status_free(&st);
    dg_graph_free(&g2);
    for (int k = 0; k < 7; k++) dg_tensor_unref(vv[k]);
    dg_graph_free(&g);
}

// ---- schedules and batch normalization ----

static void test_piecewise_constant(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output step = dg_placeholder(g, "step", DG_INT64, dg_shape_scalar());
    static const int64_t bounds[] = {100, 200};
    static const double values[] = {0.1, 0.05, 0.01};
    dg_output lr = dg_piecewise_constant(g, "lr", step, bounds, 2, values);
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(lr), DG_FLOAT32);
    const int64_t steps[] = {0, 99, 100, 101, 200, 201, 100000};
    const double want[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.01, 0.01};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        dg_tensor *sv = dg_tensor_from_data(DG_INT64, dg_shape_scalar(), &steps[i], NULL), *out;
        run(g, &step, &sv, 1, &lr, &out, 1);
        if (dg_tensor_f32(out)[0] != (float)want[i])   // exactly the value, as float32
            fail_msg("step %lld: %.9g, want %.9g", (long long)steps[i], dg_tensor_f32(out)[0], (float)want[i]);
        dg_tensor_unref(out);
        dg_tensor_unref(sv);
    }
    static const int64_t unsorted[] = {100, 300, 200};
    static const double four[] = {1, 2, 3, 4};
    dg_piecewise_constant(g, "schedule", step, unsorted, 3, four);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "piecewise_constant \"schedule\"");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "boundary 2 is 200 after 300");
    dg_graph_free(&g);
}

// The schedule against its formula in float64 (then float32), and its landmarks: 0 at step 0,
// the peak at the end of the warmup, the mean of peak and final half-way through the decay,
// final from the end on; arguments it refuses.
static void test_warmup_cosine_decay(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output step = dg_placeholder(g, "step", DG_INT64, dg_shape_scalar());
    const double peak = 1e-3, final = 1e-4;
    const int64_t warm = 100, decay = 1900;
    dg_output lr = dg_warmup_cosine_decay(g, "lr", step, peak, warm, decay, final);
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(lr), DG_FLOAT32);
    const int64_t steps[] = {0, 1, 50, 99, 100, 101, 1050, 1999, 2000, 2001, 100000};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        double s = (double)steps[i], want;
        if (s < warm) {
            want = peak * s / (double)warm;
        } else {
            double f = (s - (double)warm) / (double)decay;
            if (f > 1) f = 1;
            want = final + 0.5 * (peak - final) * (1 + cos(3.14159265358979323846 * f));
        }
        dg_tensor *sv = dg_tensor_from_data(DG_INT64, dg_shape_scalar(), &steps[i], NULL), *out;
        run(g, &step, &sv, 1, &lr, &out, 1);
        double got = dg_tensor_f32(out)[0];
        if (!dg_test_is_close(got, want, 0, 1.2e-7))
            fail_msg("step %lld: %.9g, want %.9g", (long long)steps[i], got, want);
        if (steps[i] == 0) assert_true(got == 0);
        if (steps[i] == warm) assert_true(dg_test_is_close(got, peak, 0, 1.2e-7));
        if (steps[i] == warm + decay / 2) assert_true(dg_test_is_close(got, (peak + final) / 2, 0, 1.2e-7));
        if (steps[i] >= warm + decay) assert_true(dg_test_is_close(got, final, 0, 1.2e-7));
        dg_tensor_unref(out);
        dg_tensor_unref(sv);
    }
    dg_warmup_cosine_decay(g, NULL, step, 1e-4, 10, 0, 0);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "warmup_cosine_decay \"WarmupCosineDecay\"");
    dg_graph_free(&g);
    g = dg_graph_new();
    step = dg_placeholder(g, "step", DG_INT64, dg_shape_scalar());
    dg_warmup_cosine_decay(g, "up", step, 1e-4, 10, 100, 1e-3);   // final above the peak
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "0 <= final <= peak");
    dg_graph_free(&g);
}

static void test_batch_normalization(void **state) {
    (void)state;
    uint64_t rng = 9;
    const int rows = 6, cols = 3;
    const double momentum = 0.9, eps = 1e-3;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(rows, cols));
    dg_output tr = dg_placeholder(g, "training", DG_BOOL, dg_shape_scalar());
    dg_output y = dg_batch_normalization(g, "bn", x, tr, momentum, eps);
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_graph_collection_size(g, DG_UPDATE_OPS), 2);
    dg_output mm = dg_graph_output(g, "bn/moving_mean:0", NULL), mv = dg_graph_output(g, "bn/moving_variance:0", NULL);
    assert_non_null(mm.node);
    dg_tensor *xv = filled(DG_FLOAT64, dg_shape2(rows, cols), &rng, -2, 3), *on = bool_scalar(true), *off = bool_scalar(false);
    dg_status *st = dg_status_new();
    dg_node *init = dg_global_variables_initializer(g);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    assert_true(dg_session_run_target(s, init, st));
    dg_node *updates[2] = {dg_graph_collection_get(g, DG_UPDATE_OPS, 0), dg_graph_collection_get(g, DG_UPDATE_OPS, 1)};
    dg_output feeds[2] = {x, tr};
    dg_tensor *vals[2] = {xv, on}, *out = NULL;
    assert_true(dg_session_run(s, feeds, vals, 2, &y, &out, 1, updates, 2, st));
    double mean[3], var[3], want[18];
    const double *xd = dg_tensor_f64(xv);
    for (int k = 0; k < cols; k++) {
        mean[k] = var[k] = 0;
        for (int r = 0; r < rows; r++) mean[k] += xd[r * cols + k] / rows;
        for (int r = 0; r < rows; r++) var[k] += (xd[r * cols + k] - mean[k]) * (xd[r * cols + k] - mean[k]) / rows;
        for (int r = 0; r < rows; r++) want[r * cols + k] = (xd[r * cols + k] - mean[k]) / sqrt(var[k] + eps);
    }
    expect_tensor_close(out, want, 18, 1e-12, "batch statistics");
    dg_tensor_unref(out);
    // The moving averages moved once: 0 -> 0.1 mean, 1 -> 0.9 + 0.1 var.
    dg_output mf[2] = {mm, mv};
    dg_tensor *m[2];
    assert_true(dg_session_run(s, NULL, NULL, 0, mf, m, 2, NULL, 0, st));
    double wm[3], wv[3];
    for (int k = 0; k < cols; k++) {
        wm[k] = (1 - momentum) * mean[k];
        wv[k] = momentum + (1 - momentum) * var[k];
    }
    expect_tensor_close(m[0], wm, 3, 1e-12, "moving mean");
    expect_tensor_close(m[1], wv, 3, 1e-12, "moving variance");
    // Not training: the moving averages normalize.
    vals[1] = off;
    assert_true(dg_session_run(s, feeds, vals, 2, &y, &out, 1, NULL, 0, st));
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) want[r * cols + k] = (xd[r * cols + k] - wm[k]) / sqrt(wv[k] + eps);
    expect_tensor_close(out, want, 18, 1e-12, "moving statistics");
    dg_tensor_unref(out);
    dg_tensor_unref(m[0]);
    dg_tensor_unref(m[1]);
    // Only gamma and beta train.
    assert_int_equal(dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES), 2);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_tensor_unref(xv);
    dg_tensor_unref(on);
    dg_tensor_unref(off);
    dg_status_free(&st);
}

// ---- bad input: each a status naming the node ----

static void test_bad_windows(void **state) {
    (void)state;
    // Mismatched channels, known when built.
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape_make(4, (int64_t[]){1, 8, 8, 3}));
    dg_output f = dg_placeholder(g, "f", DG_FLOAT32, dg_shape_make(4, (int64_t[]){3, 3, 2, 4}));
    dg_conv2d(g, "conv_bad", x, f, 1, 1, DG_PADDING_SAME);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "conv_bad");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "3 channels but the filter expects 2");
    dg_graph_free(&g);
    // A pool window larger than its input.
    g = dg_graph_new();
    x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape_make(4, (int64_t[]){1, 4, 4, 3}));
    dg_max_pool(g, "pool_bad", x, 5, 2, 1, 1, DG_PADDING_VALID);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "pool_bad");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "larger than the input's height");
    dg_graph_free(&g);
    // The same when the shapes are known only at run time.
    g = dg_graph_new();
    x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape_make(4, (int64_t[]){-1, -1, -1, -1}));
    f = dg_placeholder(g, "f", DG_FLOAT32, dg_shape_make(4, (int64_t[]){-1, -1, -1, -1}));
    dg_output c = dg_conv2d(g, "conv_late", x, f, 1, 1, DG_PADDING_SAME);
    dg_output p = dg_avg_pool(g, "pool_late", x, 5, 5, 1, 1, DG_PADDING_VALID);
    assert_ok(dg_graph_status(g));
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(g, "local", NULL, st);
    uint64_t rng = 1;
    dg_tensor *xv = filled(DG_FLOAT32, dg_shape_make(4, (int64_t[]){1, 4, 4, 3}), &rng, -1, 1);
    dg_tensor *fv = filled(DG_FLOAT32, dg_shape_make(4, (int64_t[]){3, 3, 2, 4}), &rng, -1, 1);
    dg_output feeds[2] = {x, f};
    dg_tensor *vals[2] = {xv, fv}, *out = NULL;
    assert_false(dg_session_run(s, feeds, vals, 2, &c, &out, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "conv_late");
    assert_status(st, DG_INVALID_ARGUMENT, "3 channels but the filter expects 2");
    dg_status_reset(st);
    assert_false(dg_session_run(s, feeds, vals, 1, &p, &out, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "pool_late");
    assert_status(st, DG_INVALID_ARGUMENT, "larger than the input's height");
    // Bad attributes: strides of zero, a padding nobody knows.
    dg_status_reset(st);
    dg_conv2d(g, "zero_stride", x, f, 0, 1, DG_PADDING_SAME);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "zero_stride");
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_tensor_unref(xv);
    dg_tensor_unref(fv);
    dg_status_free(&st);
}

static void test_summary_helpers(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(3, 4));
    dg_output l = dg_summary_scalar(g, "loss", dg_mean(g, NULL, x, NULL, 0, false));
    dg_output h = dg_summary_histogram(g, "weights", x);
    assert_ok(dg_graph_status(g));
    assert_string_equal(dg_node_name(l.node), "loss");
    assert_int_equal(dg_graph_collection_size(g, DG_SUMMARIES), 1);
    assert_ptr_equal(dg_graph_collection_get(g, DG_SUMMARIES, 0), l.node);
    assert_int_equal(dg_graph_collection_size(g, DG_HISTOGRAM_SUMMARIES), 1);
    assert_ptr_equal(dg_graph_collection_get(g, DG_HISTOGRAM_SUMMARIES, 0), h.node);
    dg_summary_scalar(g, "not_scalar", x);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "summary_scalar \"not_scalar\"");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "numeric scalar");
    dg_graph_free(&g);
    g = dg_graph_new();
    dg_summary_histogram(g, "ids", dg_placeholder(g, "i", DG_INT64, dg_shape1(3)));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "float tensor");
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_helpers),
        cmocka_unit_test(test_conv2d_forward),    cmocka_unit_test(test_pool_forward),
        cmocka_unit_test(test_dropout),           cmocka_unit_test(test_array_ops),
        cmocka_unit_test(test_piecewise_constant), cmocka_unit_test(test_warmup_cosine_decay),
        cmocka_unit_test(test_batch_normalization),
        cmocka_unit_test(test_bad_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
