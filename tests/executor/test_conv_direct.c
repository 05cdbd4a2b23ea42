/* The direct float32 convolutions and tiled max pooling (executor/cpu/conv_direct.c) against
 * float64 references computed here from the definitions, over geometries that reach every
 * register block and tail: output widths around the 7- and 14-pixel blocks, 16 and 48 output
 * channels (one and two vector blocks), 1, 16, 32 and 48 input channels (the kernels take 16
 * and 32 as constants), filters above 16 KB (window rows in the outer loop) and below, window
 * rows of 1 to 11 entries, SAME and VALID padding, the bias and ReLU epilogue, the gradients
 * from a mostly-zero dy (the sparse kernels), and where the kernels must decline (stride 2,
 * channels not in sixteens). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cpu/cpu_impl.h"

static float *random_floats(int64_t n, uint64_t *seed) {
    float *p = malloc((size_t)n * sizeof *p + 1);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)dg_test_uniform(seed, -1, 1);
    return p;
}

static graph_conv_geom geom(int64_t n, int64_t h, int64_t w, int64_t c, int64_t k, int64_t oc, bool same) {
    graph_conv_geom g = {n, h, w, c, k, k, 1, 1, 0, 0, oc, 0, 0};
    if (same) {
        g.oh = h;
        g.ow = w;
        g.pad_top = (k - 1) / 2;
        g.pad_left = (k - 1) / 2;
    } else {
        g.oh = h - k + 1;
        g.ow = w - k + 1;
    }
    return g;
}

static double xat(const graph_conv_geom *g, const float *x, int64_t n, int64_t iy, int64_t ix, int64_t c) {
    if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) return 0;
    return x[((n * g->h + iy) * g->w + ix) * g->c + c];
}

// The forward pass ry, input gradient rdx and filter gradient rdf (zeroed by the caller) in
// float64, from the definitions.
static void reference(const graph_conv_geom *gp, const float *x, const float *f, const float *dy, double *ry,
                      double *rdx, double *rdf) {
    const graph_conv_geom g = *gp;
    for (int64_t n = 0; n < g.n; n++)
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++)
                for (int64_t ky = 0; ky < g.kh; ky++)
                    for (int64_t kx = 0; kx < g.kw; kx++)
                        for (int64_t c = 0; c < g.c; c++) {
                            int64_t iy = oy - g.pad_top + ky, ix = ox - g.pad_left + kx;
                            double xv = xat(&g, x, n, iy, ix, c);
                            for (int64_t o = 0; o < g.oc; o++) {
                                int64_t fi = ((ky * g.kw + kx) * g.c + c) * g.oc + o;
                                int64_t yi = ((n * g.oh + oy) * g.ow + ox) * g.oc + o;
                                ry[yi] += xv * f[fi];
                                rdf[fi] += xv * dy[yi];
                                if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                                    rdx[((n * g.h + iy) * g.w + ix) * g.c + c] += (double)dy[yi] * f[fi];
                            }
                        }
}

static void test_conv_geometries(void **state) {
    (void)state;
    // n, h, w, c, k, oc, same
    const int64_t cases[][7] = {
        {2, 14, 14, 16, 5, 32, 1}, {2, 28, 28, 1, 5, 16, 1}, {1, 9, 8, 3, 3, 48, 1},  {3, 6, 13, 16, 3, 16, 0},
        {1, 5, 5, 32, 1, 16, 1},   {2, 7, 15, 2, 4, 16, 1},  {1, 4, 4, 16, 5, 32, 1}, {1, 12, 3, 5, 2, 32, 0},
        {1, 6, 30, 32, 5, 16, 1},  // 32 channels in, 14-pixel blocks and a tail, a 51 KB filter: window rows outside
        {1, 3, 9, 48, 3, 48, 0},   // 48 channels: no constant for them
    };
    uint64_t seed = 11;
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        const int64_t *cs = cases[t];
        graph_conv_geom g = geom(cs[0], cs[1], cs[2], cs[3], cs[4], cs[5], cs[6]);
        int64_t nx = g.n * g.h * g.w * g.c, nf = g.kh * g.kw * g.c * g.oc, ny = g.n * g.oh * g.ow * g.oc;
        float *x = random_floats(nx, &seed), *f = random_floats(nf, &seed), *dy = random_floats(ny, &seed);
        float *y = malloc((size_t)ny * sizeof *y), *dx = malloc((size_t)nx * sizeof *dx), *df = malloc((size_t)nf * sizeof *df);
        double *ry = calloc((size_t)ny, sizeof *ry), *rdx = calloc((size_t)nx, sizeof *rdx),
               *rdf = calloc((size_t)nf, sizeof *rdf);
        reference(&g, x, f, dy, ry, rdx, rdf);
        double window = (double)(g.kh * g.kw * g.c), positions = (double)(g.n * g.oh * g.ow);
        assert_true(cpu_conv_direct_fwd_f32(&g, x, f, NULL, y));
        assert_close_f32(y, ry, ny, 1e-5 * window, 1e-5);
        // With the epilogue: bias, then ReLU, once, after the last window row.
        float *bias = random_floats(g.oc, &seed);
        cpu_conv_epilogue ep = {bias, true};
        assert_true(cpu_conv_direct_fwd_f32(&g, x, f, &ep, y));
        for (int64_t i = 0; i < ny; i++) {
            double v = ry[i] + bias[i % g.oc];
            ry[i] = v > 0 ? v : 0;
        }
        assert_close_f32(y, ry, ny, 1e-5 * window, 1e-5);
        free(bias);
        assert_true(cpu_conv_direct_bp_filter_f32(&g, x, dy, df));
        assert_close_f32(df, rdf, nf, 1e-5 * positions, 1e-5);
        bool input_applies = g.c % 16 == 0;
        assert_int_equal(cpu_conv_direct_bp_input_f32(&g, f, dy, dx), input_applies);
        if (input_applies) assert_close_f32(dx, rdx, nx, 1e-5 * (double)(g.kh * g.kw * g.oc), 1e-5);
        free(x);
        free(f);
        free(dy);
        free(y);
        free(dx);
        free(df);
        free(ry);
        free(rdx);
        free(rdf);
    }
}

static void test_conv_declines(void **state) {
    (void)state;
    float x[64] = {0}, f[64] = {0}, y[64];
    graph_conv_geom g = geom(1, 4, 4, 1, 1, 16, false);
    g.sh = g.sw = 2;   // stride 2: im2col's
    g.oh = g.ow = 2;
    assert_false(cpu_conv_direct_fwd_f32(&g, x, f, NULL, y));
    graph_conv_geom h = geom(1, 2, 2, 1, 1, 8, false);   // 8 output channels
    assert_false(cpu_conv_direct_fwd_f32(&h, x, f, NULL, y));
    assert_false(cpu_conv_direct_bp_filter_f32(&h, x, y, f));
}

// Keeps dy [n, oh, ow, oc] as a 2 x 2 max pool behind a ReLU leaves it: in each 2 x 2 block of
// positions of a channel one position (drawn) keeps its value, and a third of those are zero.
static int64_t pool_like(const graph_conv_geom *g, float *dy, uint64_t *seed) {
    int64_t nz = 0;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t by = 0; by < g->oh; by += 2)
            for (int64_t bx = 0; bx < g->ow; bx += 2)
                for (int64_t o = 0; o < g->oc; o++) {
                    int64_t keep = (int64_t)dg_test_uniform(seed, 0, 6);   // 0..3: that position; 4, 5: none
                    for (int64_t i = 0; i < 4; i++) {
                        int64_t y = by + i / 2, x = bx + i % 2;
                        if (y >= g->oh || x >= g->ow) continue;
                        float *d = dy + ((n * g->oh + y) * g->ow + x) * g->oc + o;
                        if (i == keep) nz++;
                        else *d = 0;
                    }
                }
    return nz;
}

// Behind a max pool most of dy is zero, and both gradients take the sparse kernels (16, 32 and 64
// input channels, 3 x 3 and 5 x 5 windows, SAME and VALID, fewer and more than four images,
// an odd output size): the same values as the float64 reference. A NaN in dy reaches every
// filter entry of its channel and the inputs its window covers; a dense dy takes the dense
// kernels.
static void test_conv_sparse_gradients(void **state) {
    (void)state;
    // n, h, w, c, k, oc, same
    const int64_t cases[][7] = {
        {5, 14, 14, 16, 5, 32, 1}, {2, 9, 11, 32, 3, 16, 0}, {1, 8, 8, 64, 3, 32, 1},
        {6, 7, 9, 16, 5, 16, 0},   {4, 5, 5, 64, 5, 16, 1},
    };
    uint64_t seed = 23;
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        const int64_t *cs = cases[t];
        graph_conv_geom g = geom(cs[0], cs[1], cs[2], cs[3], cs[4], cs[5], cs[6]);
        int64_t nx = g.n * g.h * g.w * g.c, nf = g.kh * g.kw * g.c * g.oc, ny = g.n * g.oh * g.ow * g.oc;
        float *x = random_floats(nx, &seed), *f = random_floats(nf, &seed), *dy = random_floats(ny, &seed);
        int64_t nz = pool_like(&g, dy, &seed);
        assert_true(nz > 0 && (double)nz < 0.3 * (double)ny);
        float *dx = malloc((size_t)nx * sizeof *dx), *df = malloc((size_t)nf * sizeof *df);
        double *ry = calloc((size_t)ny, sizeof *ry), *rdx = calloc((size_t)nx, sizeof *rdx),
               *rdf = calloc((size_t)nf, sizeof *rdf);
        reference(&g, x, f, dy, ry, rdx, rdf);
        int64_t before = cpu_conv_sparse_calls;
        assert_true(cpu_conv_direct_bp_filter_f32(&g, x, dy, df));
        assert_close_f32(df, rdf, nf, 1e-5 * (double)(g.n * g.oh * g.ow), 1e-5);
        assert_true(cpu_conv_direct_bp_input_f32(&g, f, dy, dx));
        assert_close_f32(dx, rdx, nx, 1e-5 * (double)(g.kh * g.kw * g.oc), 1e-5);
        assert_int_equal(cpu_conv_sparse_calls, before + 2);

        // A NaN at one nonzero entry: its channel's filter gradient is NaN everywhere, and so is
        // the input gradient over its window (inside the image); other channels stay finite.
        int64_t at = 0;
        while (dy[at] == 0) at++;
        dy[at] = NAN;
        int64_t o = at % g.oc, pix = at / g.oc, ox = pix % g.ow, oy = pix / g.ow % g.oh, b = pix / (g.ow * g.oh);
        assert_true(cpu_conv_direct_bp_filter_f32(&g, x, dy, df));
        for (int64_t i = 0; i < nf; i++) assert_true(isnan(df[i]) == (i % g.oc == o));
        assert_true(cpu_conv_direct_bp_input_f32(&g, f, dy, dx));
        for (int64_t iy = 0; iy < g.h; iy++)
            for (int64_t ix = 0; ix < g.w; ix++) {
                int64_t ky = iy - oy + g.pad_top, kx = ix - ox + g.pad_left;
                bool covered = ky >= 0 && ky < g.kh && kx >= 0 && kx < g.kw;
                assert_true(isnan(dx[((b * g.h + iy) * g.w + ix) * g.c]) == covered);
            }
        assert_int_equal(cpu_conv_sparse_calls, before + 4);

        // Dense: the dense kernels.
        free(dy);
        dy = random_floats(ny, &seed);
        assert_true(cpu_conv_direct_bp_filter_f32(&g, x, dy, df));
        assert_true(cpu_conv_direct_bp_input_f32(&g, f, dy, dx));
        assert_int_equal(cpu_conv_sparse_calls, before + 4);
        free(x);
        free(f);
        free(dy);
        free(dx);
        free(df);
        free(ry);
        free(rdx);
        free(rdf);
    }
}

// Ties go to the first input of the window (row-major), as TensorFlow's CPU kernel; NaN never
// wins a window.
static void test_max_pool_tiled(void **state) {
    (void)state;
    graph_conv_geom g = {2, 6, 4, 32, 2, 2, 2, 2, 3, 2, 32, 0, 0};
    assert_true(cpu_max_pool_tiles(&g));
    enum { nx = 2 * 6 * 4 * 32, ny = 2 * 3 * 2 * 32 };
    uint64_t seed = 5;
    float *x = random_floats(nx, &seed), *dy = random_floats(ny, &seed);
    for (int64_t i = 0; i < nx; i += 7) x[i] = 0.5f;   // ties
    x[3] = NAN;
    float *y = malloc((size_t)ny * sizeof *y), *dx = malloc((size_t)nx * sizeof *dx);
    cpu_max_pool_tiled_f32(&g, x, y);
    cpu_max_pool_grad_tiled_f32(&g, x, y, dy, false, dx);
    double *rdx = calloc((size_t)nx, sizeof *rdx);
    for (int64_t n = 0; n < g.n; n++)
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++)
                for (int64_t c = 0; c < g.c; c++) {
                    float m = -FLT_MAX;
                    int64_t first = -1;
                    for (int64_t iy = oy * 2; iy < oy * 2 + 2; iy++)
                        for (int64_t ix = ox * 2; ix < ox * 2 + 2; ix++) {
                            float v = x[((n * g.h + iy) * g.w + ix) * g.c + c];
                            if (v > m) m = v;
                        }
                    int64_t yi = ((n * g.oh + oy) * g.ow + ox) * g.c + c;
                    assert_true(y[yi] == m);
                    for (int64_t iy = oy * 2; iy < oy * 2 + 2 && first < 0; iy++)
                        for (int64_t ix = ox * 2; ix < ox * 2 + 2 && first < 0; ix++) {
                            int64_t i = ((n * g.h + iy) * g.w + ix) * g.c + c;
                            if (x[i] == m) first = i;
                        }
                    assert_true(first >= 0);
                    rdx[first] = dy[yi];
                }
    for (int64_t i = 0; i < nx; i++) assert_true(dx[i] == (float)rdx[i]);
    graph_conv_geom odd = g;
    odd.h = 7;   // a row no window covers
    assert_false(cpu_max_pool_tiles(&odd));
    free(x);
    free(dy);
    free(y);
    free(dx);
    free(rdx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_geometries),
        cmocka_unit_test(test_conv_sparse_gradients),
        cmocka_unit_test(test_conv_declines),
        cmocka_unit_test(test_max_pool_tiled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
