/* Automatic mixed precision as a rewrite of a built graph (dg_graph_rewrite_mixed_precision,
 * dg_session_options.mixed_precision) and the 16-bit kernels it relies on:
 * - every op of the infer and clear lists in bfloat16 and float16 against float64 on the
 *   widened inputs: the float32 op rounded once, so within half a unit in the last place of
 *   the format (2^-8 relative for bfloat16's 8 significant bits, 2^-11 for float16's 11) plus
 *   float32's own error;
 * - BatchMatMulV2 in both 16-bit formats (adjoints, broadcast batch dimensions) against float64;
 * - Conv2D and its two gradients in both formats (strides, SAME and VALID, pointwise) likewise,
 *   causal attention and LayerNorm with their gradients (their statistics kept float32);
 * - an MLP's rewritten graph: which nodes convert, the casts (one per value, a variable's
 *   shared by its forward product and its gradient's), float32 variables and updates, deny
 *   ops and what they feed, ids a topological order, and rewriting only what was added;
 * - its logits against a float64 forward pass with the same roundings, and training under
 *   the session option against float32;
 * - bad lists and options named. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static double round16(dg_dtype t, double v) {
    return t == DG_BFLOAT16 ? dg_bfloat16_to_float(dg_float_to_bfloat16((float)v))
                            : dg_float16_to_float(dg_float_to_float16((float)v));
}

static dg_tensor *tensor16(dg_dtype t, dg_shape s, const double *v, int n) {
    uint16_t *h = malloc((size_t)n * sizeof *h);
    for (int i = 0; i < n; i++) h[i] = t == DG_BFLOAT16 ? dg_float_to_bfloat16((float)v[i]) : dg_float_to_float16((float)v[i]);
    dg_status *st = dg_status_new();
    dg_tensor *x = dg_tensor_from_data(t, s, h, st);
    assert_ok(st);
    dg_status_free(&st);
    free(h);
    return x;
}

static double get16(const dg_tensor *x, int i) {
    const uint16_t *h = dg_tensor_data(x);
    return dg_tensor_dtype(x) == DG_BFLOAT16 ? dg_bfloat16_to_float(h[i]) : dg_float16_to_float(h[i]);
}


typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_MAX, OP_MIN, OP_NEG, OP_ADDN, OP_BIAS, OP_RELU, OP_SIGMOID, OP_TANH,
               OP_GELU, OP_RELU_GRAD, OP_SIGMOID_GRAD, OP_TANH_GRAD, OP_GELU_GRAD, N_OPS } op_kind;
static const char *const op_names[] = {"Add", "Sub", "Mul", "Maximum", "Minimum", "Neg", "AddN", "BiasAdd", "Relu",
                                       "Sigmoid", "Tanh", "Gelu", "ReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad"};

static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_d(double x) { return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI); }

// One op in dtype t on E elements of inputs a, b (widened values), against float64.
static void check_op(dg_dtype t, op_kind k, int E) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    uint64_t seed = 17 + (uint64_t)k;
    double *av = malloc(3 * sizeof(double) * (size_t)E), *bv = av + E, *cv = bv + E;
    for (int i = 0; i < E; i++) {
        av[i] = round16(t, dg_test_uniform(&seed, -3, 3));
        bv[i] = round16(t, dg_test_uniform(&seed, -3, 3));
        cv[i] = round16(t, dg_test_uniform(&seed, -3, 3));
    }
    av[0] = 0;   // Relu's and ReluGrad's edge
    dg_shape s = dg_shape1(E);
    dg_output a = dg_placeholder(g, "a", t, s), b = dg_placeholder(g, "b", t, s), c = dg_placeholder(g, "c", t, s);
    dg_output bias = dg_placeholder(g, "bias", t, dg_shape1(E));
    dg_output y = {0}, dy = {0};
    switch (k) {
    case OP_ADD: y = dg_add(g, "y", a, b); break;
    case OP_SUB: y = dg_sub(g, "y", a, b); break;
    case OP_MUL: y = dg_mul(g, "y", a, b); break;
    case OP_MAX: y = dg_maximum(g, "y", a, b); break;
    case OP_MIN: y = dg_minimum(g, "y", a, b); break;
    case OP_NEG: y = dg_neg(g, "y", a); break;
    case OP_ADDN: y = dg_add_n(g, "y", (dg_output[]){a, b, c}, 3); break;
    case OP_BIAS: y = dg_bias_add(g, "y", dg_reshape(g, NULL, a, (int64_t[]){1, E}, 2), bias); break;
    case OP_RELU: y = dg_relu(g, "y", a); break;
    case OP_SIGMOID: y = dg_sigmoid(g, "y", a); break;
    case OP_TANH: y = dg_tanh(g, "y", a); break;
    case OP_GELU: y = dg_gelu(g, "y", a, false); break;
    default: {   // the gradients, through dg_gradients with dy = b
        dg_output f = k == OP_RELU_GRAD ? dg_relu(g, "f", a) : k == OP_SIGMOID_GRAD ? dg_sigmoid(g, "f", a)
                    : k == OP_TANH_GRAD ? dg_tanh(g, "f", a) : dg_gelu(g, "f", a, false);
        assert_true(dg_gradients(g, &f, 1, &a, 1, &b, &dy));
        y = dy;
        break;
    }
    }
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(y), t);
    if (k >= OP_RELU_GRAD) assert_string_equal(dg_node_op_type(y.node), op_names[k]);
    dg_session *sess = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    dg_tensor *at = tensor16(t, s, av, E), *bt = tensor16(t, s, bv, E), *ct = tensor16(t, s, cv, E);
    dg_tensor *biast = tensor16(t, dg_shape1(E), cv, E), *out = NULL;
    dg_output feeds[] = {a, b, c, bias};
    dg_tensor *vals[] = {at, bt, ct, biast};
    assert_true(dg_session_run(sess, feeds, vals, 4, &y, &out, 1, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_dtype(out), t);
    double half_ulp = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11;   // the unit roundoff: 8 and 11 significant bits
    for (int i = 0; i < E; i++) {
        double x = av[i], z = bv[i], want, mag, fwd = 0;   // fwd: what a step of the rounded forward value moves
        switch (k) {
        case OP_ADD: want = x + z; mag = fabs(x) + fabs(z); break;
        case OP_SUB: want = x - z; mag = fabs(x) + fabs(z); break;
        case OP_MUL: want = x * z; mag = fabs(want); break;
        case OP_MAX: want = fmax(x, z); mag = fabs(want); break;
        case OP_MIN: want = fmin(x, z); mag = fabs(want); break;
        case OP_NEG: want = -x; mag = fabs(x); break;
        case OP_ADDN: want = x + z + cv[i]; mag = fabs(x) + fabs(z) + fabs(cv[i]); break;
        case OP_BIAS: want = x + cv[i]; mag = fabs(x) + fabs(cv[i]); break;
        case OP_RELU: want = x > 0 ? x : 0; mag = fabs(want); break;
        case OP_SIGMOID: want = sigm(x); mag = fabs(want); break;
        case OP_TANH: want = tanh(x); mag = fabs(want); break;
        case OP_GELU: want = gelu(x); mag = fabs(x); break;
        case OP_RELU_GRAD: want = x > 0 ? z : 0; mag = fabs(z); break;
        // The gradients read the forward output rounded to dtype, as the graph holds it; the
        // float32 forward value may round to the neighbouring 16-bit value where float64's
        // does not, which moves the gradient by fwd.
        case OP_SIGMOID_GRAD: {
            double f = round16(t, sigm(x));
            want = z * f * (1 - f);
            mag = fabs(want) + fabs(z * f * f);
            fwd = fabs(z * (1 - 2 * f)) * 2 * half_ulp * fabs(f);
            break;
        }
        case OP_TANH_GRAD: {
            double f = round16(t, tanh(x));
            want = z * (1 - f * f);
            mag = fabs(z) * (1 + f * f);
            fwd = fabs(z * 2 * f) * 2 * half_ulp * fabs(f);
            break;
        }
        default: want = z * gelu_d(x); mag = fabs(z) * (fabs(gelu_d(x)) + fabs(x)); break;
        }
        // One rounding to dtype of a float32 result whose own error is a few float32 ulps;
        // below float16's smallest normal (2^-14) its steps are 2^-24, so half of that at most.
        double tol = half_ulp * fabs(want) + 8 * 0x1p-24 * mag + (t == DG_FLOAT16 ? 0x1p-25 : 1e-30) + fwd;
        double got = get16(out, i);
        if (!(fabs(got - want) <= tol))
            fail_msg("%s in %s, element %d (a=%.9g b=%.9g): %.9g, want %.9g (tolerance %.3g)", op_names[k],
                     dg_dtype_name(t), i, x, z, got, want, tol);
    }
    dg_tensor_unref(out);
    dg_tensor_unref(at);
    dg_tensor_unref(bt);
    dg_tensor_unref(ct);
    dg_tensor_unref(biast);
    free(av);
    dg_session_free(&sess);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_kernels_16(void **state) {
    (void)state;
    // 257: odd, past one vector, one chunk; 140001: many chunks of kernels_16.c's one-pass
    // kernels, split over the intra-op threads.
    for (int k = 0; k < N_OPS; k++)
        for (int e = 0; e < 2; e++) {
            check_op(DG_BFLOAT16, (op_kind)k, e ? 140001 : 257);
            check_op(DG_FLOAT16, (op_kind)k, e ? 140001 : 257);
        }
}

// BatchMatMulV2 in 16 bits: x [2,1,5,7] (adjoint: [2,1,7,5]) times y [3,7,4], batch dims
// broadcast to [2,3]; sums in float32, each output rounded once.
static void check_bmm(dg_dtype t, bool adj_x, bool adj_y) {
    enum { M = 5, K = 7, N = 4 };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    int nx = 2 * M * K, ny = 3 * K * N;
    double xv[2 * M * K], yv[3 * K * N];
    uint64_t seed = 7;
    for (int i = 0; i < nx; i++) xv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    for (int i = 0; i < ny; i++) yv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    dg_shape xs = adj_x ? dg_shape_make(4, (int64_t[]){2, 1, K, M}) : dg_shape_make(4, (int64_t[]){2, 1, M, K});
    dg_shape ys = adj_y ? dg_shape_make(3, (int64_t[]){3, N, K}) : dg_shape_make(3, (int64_t[]){3, K, N});
    dg_output x = dg_placeholder(g, "x", t, xs), y = dg_placeholder(g, "y", t, ys);
    dg_output z = dg_batch_matmul(g, "z", x, y, adj_x, adj_y);
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(z), t);
    dg_session *sess = dg_session_new(g, "local", NULL, st);
    dg_tensor *xt = tensor16(t, xs, xv, nx), *yt = tensor16(t, ys, yv, ny), *out = NULL;
    dg_output feeds[] = {x, y};
    dg_tensor *vals[] = {xt, yt};
    assert_true(dg_session_run(sess, feeds, vals, 2, &z, &out, 1, NULL, 0, st));
    assert_ok(st);
    double u = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double ref = 0, mag = 0;
                    for (int k = 0; k < K; k++) {
                        double xe = adj_x ? xv[a * M * K + k * M + i] : xv[a * M * K + i * K + k];
                        double ye = adj_y ? yv[b * K * N + j * K + k] : yv[b * K * N + k * N + j];
                        ref += xe * ye;
                        mag += fabs(xe * ye);
                    }
                    double got = get16(out, ((a * 3 + b) * M + i) * N + j), tol = u * fabs(ref) + (K + 2) * 0x1p-24 * mag;
                    if (!(fabs(got - ref) <= tol))
                        fail_msg("BatchMatMulV2 %s adj %d %d [%d,%d,%d,%d] = %.9g, want %.9g", dg_dtype_name(t), adj_x,
                                 adj_y, a, b, i, j, got, ref);
                }
    dg_tensor_unref(out);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    dg_session_free(&sess);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// The gradient of that product in 16 bits, batch dimensions broadcast: dx sums over y's
// batch (x [2,1,5,7] met y's 3), dy over x's 2, each through SumToShape in 16 bits (the
// float32 sum rounded once). Each matrix's product is rounded once before the sum, so the
// bound holds a rounding per summed matrix.
static void check_bmm_grad(dg_dtype t) {
    enum { M = 5, K = 7, N = 4 };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    int nx = 2 * M * K, ny = 3 * K * N, nz = 6 * M * N;
    double xv[2 * M * K], yv[3 * K * N], zv[6 * M * N];
    uint64_t seed = 11;
    for (int i = 0; i < nx; i++) xv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    for (int i = 0; i < ny; i++) yv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    for (int i = 0; i < nz; i++) zv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    dg_shape xs = dg_shape_make(4, (int64_t[]){2, 1, M, K}), ys = dg_shape_make(3, (int64_t[]){3, K, N});
    dg_shape zs = dg_shape_make(4, (int64_t[]){2, 3, M, N});
    dg_output x = dg_placeholder(g, "x", t, xs), y = dg_placeholder(g, "y", t, ys), dz = dg_placeholder(g, "dz", t, zs);
    dg_output z = dg_batch_matmul(g, "z", x, y, false, false), xy[2] = {x, y}, d[2];
    assert_true(dg_gradients(g, &z, 1, xy, 2, &dz, d));
    assert_ok(dg_graph_status(g));
    dg_session *sess = dg_session_new(g, "local", NULL, st);
    dg_tensor *xt = tensor16(t, xs, xv, nx), *yt = tensor16(t, ys, yv, ny), *zt = tensor16(t, zs, zv, nz);
    dg_output feeds[] = {x, y, dz};
    dg_tensor *vals[] = {xt, yt, zt}, *out[2] = {0};
    assert_true(dg_session_run(sess, feeds, vals, 3, d, out, 2, NULL, 0, st));
    assert_ok(st);
    double u = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11;
    for (int r = 0; r < 2; r++) {
        assert_int_equal(dg_tensor_dtype(out[r]), t);
        assert_int_equal(dg_tensor_num_elements(out[r]), r ? ny : nx);
    }
    // dx[a,0,i,k] = sum_b sum_j dz[a,b,i,j] y[b,k,j]
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) {
                double ref = 0, tol = 0, parts = 0;
                for (int b = 0; b < 3; b++) {
                    double part = 0, mag = 0;
                    for (int j = 0; j < N; j++) {
                        double e = zv[((a * 3 + b) * M + i) * N + j] * yv[(b * K + k) * N + j];
                        part += e;
                        mag += fabs(e);
                    }
                    ref += part;
                    parts += fabs(part);
                    tol += u * fabs(part) + (N + 2) * 0x1p-24 * mag;
                }
                tol += u * fabs(ref) + 4 * 0x1p-24 * parts;   // the float32 sum of the parts, rounded once
                double got = get16(out[0], (a * M + i) * K + k);
                if (!(fabs(got - ref) <= tol))
                    fail_msg("d x %s [%d,0,%d,%d] = %.9g, want %.9g", dg_dtype_name(t), a, i, k, got, ref);
            }
    // dy[b,k,j] = sum_a sum_i x[a,0,i,k] dz[a,b,i,j]
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) {
                double ref = 0, tol = 0, parts = 0;
                for (int a = 0; a < 2; a++) {
                    double part = 0, mag = 0;
                    for (int i = 0; i < M; i++) {
                        double e = xv[(a * M + i) * K + k] * zv[((a * 3 + b) * M + i) * N + j];
                        part += e;
                        mag += fabs(e);
                    }
                    ref += part;
                    parts += fabs(part);
                    tol += u * fabs(part) + (M + 2) * 0x1p-24 * mag;
                }
                tol += u * fabs(ref) + 4 * 0x1p-24 * parts;   // the float32 sum of the parts, rounded once
                double got = get16(out[1], (b * K + k) * N + j);
                if (!(fabs(got - ref) <= tol))
                    fail_msg("d y %s [%d,%d,%d] = %.9g, want %.9g", dg_dtype_name(t), b, k, j, got, ref);
            }
    for (int r = 0; r < 2; r++) dg_tensor_unref(out[r]);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    dg_tensor_unref(zt);
    dg_session_free(&sess);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_batch_matmul_16(void **state) {
    (void)state;
    for (int f = 0; f < 4; f++) {
        check_bmm(DG_BFLOAT16, f & 1, f & 2);
        check_bmm(DG_FLOAT16, f & 1, f & 2);
    }
    check_bmm_grad(DG_BFLOAT16);
    check_bmm_grad(DG_FLOAT16);
}

// Conv2D in 16 bits and its two gradients (through dg_gradients, dy fed): x [2,7,6,3], filter
// [kh,kw,3,4], against float64 loops over the widened values; each output is one rounding of a
// float32 sum.
static void check_conv(dg_dtype t, int kh, int kw, int stride, dg_padding pad) {
    enum { NB = 2, H = 7, W = 6, C = 3, O = 4 };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    int oh = pad == DG_PADDING_SAME ? (H + stride - 1) / stride : (H - kh) / stride + 1;
    int ow = pad == DG_PADDING_SAME ? (W + stride - 1) / stride : (W - kw) / stride + 1;
    int pt = 0, pl = 0;
    if (pad == DG_PADDING_SAME) {
        int ph = (oh - 1) * stride + kh - H, pw = (ow - 1) * stride + kw - W;
        pt = ph > 0 ? ph / 2 : 0;
        pl = pw > 0 ? pw / 2 : 0;
    }
    int nx = NB * H * W * C, nf = kh * kw * C * O, ny = NB * oh * ow * O;
    double *xv = malloc(sizeof(double) * (size_t)nx), *fv = malloc(sizeof(double) * (size_t)nf);
    double *dyv = malloc(sizeof(double) * (size_t)ny);
    uint64_t seed = 23;
    for (int i = 0; i < nx; i++) xv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    for (int i = 0; i < nf; i++) fv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    for (int i = 0; i < ny; i++) dyv[i] = round16(t, dg_test_uniform(&seed, -2, 2));
    dg_shape xs = dg_shape_make(4, (int64_t[]){NB, H, W, C}), fs = dg_shape_make(4, (int64_t[]){kh, kw, C, O});
    dg_shape ys = dg_shape_make(4, (int64_t[]){NB, oh, ow, O});
    dg_output x = dg_placeholder(g, "x", t, xs), f = dg_placeholder(g, "f", t, fs), dy = dg_placeholder(g, "dy", t, ys);
    dg_output y = dg_conv2d(g, "y", x, f, stride, stride, pad), d[2];
    dg_output xf[] = {x, f};
    assert_true(dg_gradients(g, &y, 1, xf, 2, &dy, d));
    assert_ok(dg_graph_status(g));
    assert_string_equal(dg_node_op_type(d[0].node), "Conv2DBackpropInput");
    assert_string_equal(dg_node_op_type(d[1].node), "Conv2DBackpropFilter");
    dg_session *sess = dg_session_new(g, "local", NULL, st);
    dg_tensor *xt = tensor16(t, xs, xv, nx), *ft = tensor16(t, fs, fv, nf), *dyt = tensor16(t, ys, dyv, ny);
    dg_output feeds[] = {x, f, dy}, fetch[] = {y, d[0], d[1]};
    dg_tensor *vals[] = {xt, ft, dyt}, *out[3] = {0};
    assert_true(dg_session_run(sess, feeds, vals, 3, fetch, out, 3, NULL, 0, st));
    assert_ok(st);
    double u = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11;
    double *ref[3], *mag[3];
    int cnt[3] = {ny, nx, nf};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(dg_tensor_dtype(out[r]), t);
        assert_int_equal(dg_tensor_num_elements(out[r]), cnt[r]);
        ref[r] = calloc((size_t)cnt[r], sizeof(double));
        mag[r] = calloc((size_t)cnt[r], sizeof(double));
    }
    for (int n = 0; n < NB; n++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int ky = 0; ky < kh; ky++)
                    for (int kx = 0; kx < kw; kx++) {
                        int iy = oy * stride - pt + ky, ix = ox * stride - pl + kx;
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                        for (int c = 0; c < C; c++)
                            for (int o = 0; o < O; o++) {
                                int yi = ((n * oh + oy) * ow + ox) * O + o, xi = ((n * H + iy) * W + ix) * C + c;
                                int fi = ((ky * kw + kx) * C + c) * O + o;
                                ref[0][yi] += xv[xi] * fv[fi];
                                mag[0][yi] += fabs(xv[xi] * fv[fi]);
                                ref[1][xi] += dyv[yi] * fv[fi];
                                mag[1][xi] += fabs(dyv[yi] * fv[fi]);
                                ref[2][fi] += xv[xi] * dyv[yi];
                                mag[2][fi] += fabs(xv[xi] * dyv[yi]);
                            }
                    }
    const char *what[] = {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"};
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < cnt[r]; i++) {
            double got = get16(out[r], i), tol = u * fabs(ref[r][i]) + 64 * 0x1p-24 * mag[r][i];
            if (!(fabs(got - ref[r][i]) <= tol))
                fail_msg("%s in %s (k %dx%d, stride %d, %s), element %d: %.9g, want %.9g", what[r], dg_dtype_name(t), kh,
                         kw, stride, pad == DG_PADDING_SAME ? "SAME" : "VALID", i, got, ref[r][i]);
        }
        free(ref[r]);
        free(mag[r]);
        dg_tensor_unref(out[r]);
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(ft);
    dg_tensor_unref(dyt);
    free(xv);
    free(fv);
    free(dyv);
    dg_session_free(&sess);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_conv2d_16(void **state) {
    (void)state;
    for (int ti = 0; ti < 2; ti++) {
        dg_dtype t = ti ? DG_FLOAT16 : DG_BFLOAT16;
        check_conv(t, 3, 3, 1, DG_PADDING_SAME);
        check_conv(t, 3, 2, 2, DG_PADDING_SAME);
        check_conv(t, 2, 3, 1, DG_PADDING_VALID);
        check_conv(t, 1, 1, 1, DG_PADDING_VALID);   // pointwise: the input is its own window matrix
    }
}

// Causal attention in 16 bits, q, k, v [2, 2, 5, 4], and its gradient with dout fed, against
// float64: P = softmax(s q k^T) over the keys each query sees, out = P v; dv = P^T dout,
// dP = dout v^T, dS = P (dP - rowsum(dP P)), dq = s dS k, dk = s dS^T q. Each output is a
// float32 result rounded once; lse stays float32.
static void check_attention16(dg_dtype t) {
    enum { BH = 4, T = 5, D = 4, N = BH * T * D };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    double qv[N], kv[N], vv[N], dov[N];
    uint64_t seed = 31;
    for (int i = 0; i < N; i++) {
        qv[i] = round16(t, dg_test_uniform(&seed, -1, 1));
        kv[i] = round16(t, dg_test_uniform(&seed, -1, 1));
        vv[i] = round16(t, dg_test_uniform(&seed, -1, 1));
        dov[i] = round16(t, dg_test_uniform(&seed, -1, 1));
    }
    dg_shape s4 = dg_shape_make(4, (int64_t[]){2, 2, T, D});
    dg_output q = dg_placeholder(g, "q", t, s4), k = dg_placeholder(g, "k", t, s4), v = dg_placeholder(g, "v", t, s4);
    dg_output dout = dg_placeholder(g, "dout", t, s4);
    dg_output o = dg_attention(g, "att", q, k, v, true, 0), d[3];
    dg_output xs[] = {q, k, v};
    assert_true(dg_gradients(g, &o, 1, xs, 3, &dout, d));
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(o), t);
    assert_int_equal(dg_node_output_dtype(o.node, 1), DG_FLOAT32);   // lse
    dg_session *sess = dg_session_new(g, "local", NULL, st);
    dg_tensor *qt = tensor16(t, s4, qv, N), *kt = tensor16(t, s4, kv, N), *vt = tensor16(t, s4, vv, N);
    dg_tensor *dt = tensor16(t, s4, dov, N), *out[4] = {0};
    dg_output feeds[] = {q, k, v, dout}, fetch[] = {o, d[0], d[1], d[2]};
    dg_tensor *vals[] = {qt, kt, vt, dt};
    assert_true(dg_session_run(sess, feeds, vals, 4, fetch, out, 4, NULL, 0, st));
    assert_ok(st);
    double ref[4][N] = {{0}}, mag[4][N] = {{0}}, sc = 1 / sqrt((double)D);
    // The gradient reads the forward output as the graph holds it, rounded to dtype, for
    // rowsum(dout out): that moves dS by P times up to u * sum |dout out| (one[] below).
    double u = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11, one[4][N] = {{0}};
    for (int b = 0; b < BH; b++) {
        const double *Q = qv + b * T * D, *K = kv + b * T * D, *V = vv + b * T * D, *dO = dov + b * T * D;
        double P[T][T] = {{0}}, dS[T][T] = {{0}};
        for (int i = 0; i < T; i++) {
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                for (int e = 0; e < D; e++) P[i][j] += sc * Q[i * D + e] * K[j * D + e];
                m = fmax(m, P[i][j]);
            }
            for (int j = 0; j <= i; j++) sum += (P[i][j] = exp(P[i][j] - m));
            for (int j = 0; j <= i; j++) P[i][j] /= sum;
            double dP[T] = {0}, rs = 0;
            for (int j = 0; j <= i; j++) {
                for (int e = 0; e < D; e++) dP[j] += dO[i * D + e] * V[j * D + e];
                rs += dP[j] * P[i][j];
            }
            for (int j = 0; j <= i; j++) dS[i][j] = P[i][j] * (dP[j] - rs);
        }
        double rsmag[T] = {0};   // sum over e of |dout out| per query, out from float64
        for (int i = 0; i < T; i++)
            for (int e = 0; e < D; e++) {
                double oe = 0;
                for (int j = 0; j < T; j++) oe += P[i][j] * V[j * D + e];
                rsmag[i] += fabs(dO[i * D + e] * oe);
            }
        for (int i = 0; i < T; i++)
            for (int e = 0; e < D; e++) {
                int at = b * T * D + i * D + e;
                for (int j = 0; j < T; j++) {
                    ref[0][at] += P[i][j] * V[j * D + e];
                    mag[0][at] += fabs(P[i][j] * V[j * D + e]);
                    ref[1][at] += sc * dS[i][j] * K[j * D + e];   // dq
                    mag[1][at] += fabs(sc * dS[i][j] * K[j * D + e]) + sc * P[i][j] * fabs(K[j * D + e]);
                    one[1][at] += u * rsmag[i] * sc * P[i][j] * fabs(K[j * D + e]);
                    ref[2][at] += sc * dS[j][i] * Q[j * D + e];   // dk
                    mag[2][at] += fabs(sc * dS[j][i] * Q[j * D + e]) + sc * P[j][i] * fabs(Q[j * D + e]);
                    one[2][at] += u * rsmag[j] * sc * P[j][i] * fabs(Q[j * D + e]);
                    ref[3][at] += P[j][i] * dO[j * D + e];        // dv
                    mag[3][at] += fabs(P[j][i] * dO[j * D + e]);
                }
            }
    }
    const char *what[] = {"attention", "dq", "dk", "dv"};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(dg_tensor_dtype(out[r]), t);
        for (int i = 0; i < N; i++) {
            // One rounding to dtype of float32 arithmetic (exp's and the sums' errors a few
            // float32 ulps of what went in), plus float16's subnormal step.
            double got = get16(out[r], i), tol = u * fabs(ref[r][i]) + 64 * 0x1p-24 * mag[r][i] + one[r][i] + 0x1p-25;
            if (!(fabs(got - ref[r][i]) <= tol))
                fail_msg("%s in %s, element %d: %.9g, want %.9g (tolerance %.3g)", what[r], dg_dtype_name(t), i, got,
                         ref[r][i], tol);
        }
        dg_tensor_unref(out[r]);
    }
    dg_tensor_unref(qt);
    dg_tensor_unref(kt);
    dg_tensor_unref(vt);
    dg_tensor_unref(dt);
    dg_session_free(&sess);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_attention_16(void **state) {
    (void)state;
    check_attention16(DG_BFLOAT16);
    check_attention16(DG_FLOAT16);
}

// LayerNorm in 16 bits over rows of 40 and its gradient (dy fed), against float64: y = xhat
// gamma + beta, xhat = (x - mean) rstd; dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)),
// g = gamma; dgamma = sum over rows of dy xhat, dbeta = sum of dy. mean and rstd stay float32.
static void check_layer_norm16(dg_dtype t) {
    enum { R = 6, C = 40, N = R * C };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    double xv[N], dyv[N], gv[C], bv[C];
    uint64_t seed = 41;
    for (int i = 0; i < N; i++) {
        xv[i] = round16(t, dg_test_uniform(&seed, -2, 3));
        dyv[i] = round16(t, dg_test_uniform(&seed, -1, 1));
    }
    for (int c = 0; c < C; c++) {
        gv[c] = round16(t, dg_test_uniform(&seed, 0.5, 1.5));
        bv[c] = round16(t, dg_test_uniform(&seed, -0.5, 0.5));
    }
    dg_output x = dg_placeholder(g, "x", t, dg_shape2(R, C)), dy = dg_placeholder(g, "dy", t, dg_shape2(R, C));
    dg_output gamma = dg_placeholder(g, "gamma", t, dg_shape1(C)), beta = dg_placeholder(g, "beta", t, dg_shape1(C));
    dg_output y = dg_layer_norm(g, "ln", x, gamma, beta, 1e-5), d[3];
    dg_output xs[] = {x, gamma, beta};
    assert_true(dg_gradients(g, &y, 1, xs, 3, &dy, d));
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_node_output_dtype(y.node, 1), DG_FLOAT32);
    assert_int_equal(dg_node_output_dtype(y.node, 2), DG_FLOAT32);
    dg_session *sess = dg_session_new(g, "local", NULL, st);
    dg_tensor *xt = tensor16(t, dg_shape2(R, C), xv, N), *dyt = tensor16(t, dg_shape2(R, C), dyv, N);
    dg_tensor *gt = tensor16(t, dg_shape1(C), gv, C), *bt = tensor16(t, dg_shape1(C), bv, C), *out[4] = {0};
    dg_output feeds[] = {x, dy, gamma, beta}, fetch[] = {y, d[0], d[1], d[2]};
    dg_tensor *vals[] = {xt, dyt, gt, bt};
    assert_true(dg_session_run(sess, feeds, vals, 4, fetch, out, 4, NULL, 0, st));
    assert_ok(st);
    double ref[4][N] = {{0}}, mag[4][N] = {{0}};
    for (int r = 0; r < R; r++) {
        double mean = 0, var = 0, a = 0, b = 0, am = 0, bm = 0;
        for (int c = 0; c < C; c++) mean += xv[r * C + c] / C;
        for (int c = 0; c < C; c++) var += (xv[r * C + c] - mean) * (xv[r * C + c] - mean) / C;
        double rstd = 1 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) {
            double xh = (xv[r * C + c] - mean) * rstd, gd = gv[c] * dyv[r * C + c];
            a += gd / C;
            b += gd * xh / C;
            am += fabs(gd) / C;
            bm += fabs(gd * xh) / C;
        }
        for (int c = 0; c < C; c++) {
            int i = r * C + c;
            double xh = (xv[i] - mean) * rstd, gd = gv[c] * dyv[i];
            ref[0][i] = xh * gv[c] + bv[c];
            mag[0][i] = fabs(xh * gv[c]) + fabs(bv[c]) + 4 * fabs(gv[c]);   // xhat's own error, a few ulps of rstd's range
            ref[1][i] = rstd * (gd - a - xh * b);
            mag[1][i] = rstd * (fabs(gd) + am + fabs(xh) * bm) * 4;
            ref[2][c] += dyv[i] * xh;
            mag[2][c] += fabs(dyv[i] * xh) * 4;
            ref[3][c] += dyv[i];
            mag[3][c] += fabs(dyv[i]);
        }
    }
    double u = t == DG_BFLOAT16 ? 0x1p-8 : 0x1p-11;
    const char *what[] = {"LayerNorm", "dx", "dgamma", "dbeta"};
    int cnt[] = {N, N, C, C};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(dg_tensor_dtype(out[k]), t);
        for (int i = 0; i < cnt[k]; i++) {
            double got = get16(out[k], i), tol = u * fabs(ref[k][i]) + 64 * 0x1p-24 * mag[k][i] + 0x1p-25;
            if (!(fabs(got - ref[k][i]) <= tol))
                fail_msg("%s in %s, element %d: %.9g, want %.9g (tolerance %.3g)", what[k], dg_dtype_name(t), i, got,
                         ref[k][i], tol);
        }
        dg_tensor_unref(out[k]);
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(dyt);
    dg_tensor_unref(gt);
    dg_tensor_unref(bt);
    dg_session_free(&sess);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_layer_norm_16(void **state) {
    (void)state;
    check_layer_norm16(DG_BFLOAT16);
    check_layer_norm16(DG_FLOAT16);
}

// ---- the rewrite of an MLP ----

enum { B = 16, IN = 24, H = 20, OUT = 10 };

typedef struct mlp {
    dg_graph *g;
    dg_output x, labels, w1, b1, w2, b2, h, logits, loss, other;
    dg_node *train, *init;
} mlp;

static void mlp_build(mlp *m) {
    dg_graph *g = m->g = dg_graph_new();
    dg_graph_set_random_seed(g, 3);
    m->x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(B, IN));
    m->labels = dg_placeholder(g, "labels", DG_INT32, dg_shape1(B));
    m->w1 = dg_variable(g, "w1", DG_FLOAT32, dg_shape2(IN, H), dg_init_random_uniform(-0.4, 0.4, 1));
    m->b1 = dg_variable(g, "b1", DG_FLOAT32, dg_shape1(H), dg_init_random_uniform(-0.1, 0.1, 2));
    m->w2 = dg_variable(g, "w2", DG_FLOAT32, dg_shape2(H, OUT), dg_init_random_uniform(-0.4, 0.4, 3));
    m->b2 = dg_variable(g, "b2", DG_FLOAT32, dg_shape1(OUT), dg_init_random_uniform(-0.1, 0.1, 4));
    m->h = dg_relu(g, "h", dg_bias_add(g, "h_pre", dg_matmul(g, "mm1", m->x, m->w1, false, false), m->b1));
    m->logits = dg_bias_add(g, "logits", dg_matmul(g, "mm2", m->h, m->w2, false, false), m->b2);
    m->loss = dg_mean(g, "loss", dg_sparse_softmax_cross_entropy_with_logits(g, "xent", m->logits, m->labels), NULL, 0,
                      false);
    // A deny op feeding an infer op: exp(x) + x w1 stays float32.
    m->other = dg_add(g, "other", dg_exp(g, "ex", dg_slice(g, NULL, m->x, (int64_t[]){0, 0}, (int64_t[]){B, H}, 2)),
                      dg_matmul(g, "mm3", m->x, m->w1, false, false));
    dg_optimizer opt = dg_gradient_descent(g, 0.5);
    m->train = dg_optimizer_minimize(&opt, m->loss, (dg_output){NULL, 0});
    m->init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
}

static dg_node *find(const dg_graph *g, const char *name) {
    dg_node *n = dg_graph_find(g, name);
    if (!n) fail_msg("no node %s", name);
    return n;
}

static int readers(const dg_graph *g, const dg_node *src, const char *op, dg_node **last) {
    int c = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        for (int j = 0; j < dg_node_num_inputs(n); j++)
            if (dg_node_input(n, j).node == src && (!op || strcmp(dg_node_op_type(n), op) == 0)) {
                c++;
                if (last) *last = n;
                break;
            }
    }
    return c;
}

static void assert_topological(const dg_graph *g) {
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        for (int j = 0; j < dg_node_num_inputs(n); j++) {
            dg_node *src = dg_node_input(n, j).node;
            int sid = -1;
            for (int k = 0; k < dg_graph_num_nodes(g); k++)
                if (dg_graph_node(g, k) == src) sid = k;
            if (!(sid >= 0 && sid < i)) fail_msg("%s (%d) reads %s (%d)", dg_node_name(n), i, dg_node_name(src), sid);
        }
    }
}

static void test_rewrite_mlp(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    mlp m;
    mlp_build(&m);
    dg_graph *g = m.g;
    int before = dg_graph_num_nodes(g);
    dg_mixed_precision_options o = dg_mixed_precision_options_default(DG_BFLOAT16);
    dg_mixed_precision_report r;
    assert_true(dg_graph_rewrite_mixed_precision(g, &o, &r, st));
    assert_ok(st);
    print_message("MLP: %d nodes, %d converted, %d casts added\n", before, r.nodes_converted, r.casts_added);
    assert_int_equal(dg_graph_num_nodes(g), before + r.casts_added);
    assert_topological(g);
    // Converted: the products (forward and gradients), the biases' adds, the relu and its gradient.
    const char *low[] = {"mm1", "mm2", "mm3", "h_pre", "h", "logits"};
    for (size_t i = 0; i < sizeof low / sizeof *low; i++)
        if (dg_node_output_dtype(find(g, low[i]), 0) != DG_BFLOAT16) fail_msg("%s is not bfloat16", low[i]);
    int low_matmuls = 0, low_relu_grads = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        const char *op = dg_node_op_type(n);
        low_matmuls += strcmp(op, "MatMul") == 0 && dg_node_output_dtype(n, 0) == DG_BFLOAT16;
        low_relu_grads += strcmp(op, "ReluGrad") == 0 && dg_node_output_dtype(n, 0) == DG_BFLOAT16;
        // Variables, updates and every deny op stay float32.
        if (!strcmp(op, "VariableV2") || !strcmp(op, "ApplyGradientDescent") || !strcmp(op, "Exp") ||
            !strcmp(op, "SparseSoftmaxCrossEntropyWithLogits") || !strcmp(op, "Mean") || !strcmp(op, "BiasAddGrad"))
            if (dg_node_output_dtype(n, 0) != DG_FLOAT32) fail_msg("%s (%s) is not float32", dg_node_name(n), op);
        if (!strcmp(op, "ApplyGradientDescent"))
            for (int j = 1; j < dg_node_num_inputs(n); j++)
                assert_int_equal(dg_output_dtype(dg_node_input(n, j)), DG_FLOAT32);
    }
    assert_int_equal(low_matmuls, 3 + 4);   // mm1..3; the gradients of mm1 and mm2 by both operands
    assert_int_equal(low_relu_grads, 1);
    // exp(x) + x w1: the Add is fed by a deny op, so it stays float32 and reads mm3 cast back.
    dg_node *other = find(g, "other");
    assert_int_equal(dg_node_output_dtype(other, 0), DG_FLOAT32);
    assert_string_equal(dg_node_name(dg_node_input(other, 1).node), "mm3/CastToFloat32");
    // Each variable read by a product has one cast, read by every product of it: w2's by mm2
    // and the gradient for h; w1's by mm1, mm3 and the gradient for x.
    dg_node *cast = NULL;
    assert_int_equal(readers(g, find(g, "w2"), "Cast", &cast), 1);
    assert_string_equal(dg_node_name(cast), "w2/CastToBfloat16");
    assert_int_equal(readers(g, cast, "MatMul", NULL), 2);
    assert_int_equal(readers(g, find(g, "w1"), "Cast", &cast), 1);
    assert_int_equal(readers(g, cast, "MatMul", NULL), 3);
    // The loss reads the logits back in float32.
    dg_node *xent = find(g, "xent");
    assert_string_equal(dg_node_name(dg_node_input(xent, 0).node), "logits/CastToFloat32");
    // A second call has nothing new; nodes added later are rewritten then.
    int n_now = dg_graph_num_nodes(g);
    assert_true(dg_graph_rewrite_mixed_precision(g, &o, &r, st));
    assert_int_equal(dg_graph_num_nodes(g), n_now);
    assert_int_equal(r.nodes_converted, 0);
    // A node built after the rewrite reads a converted value as it was built, float32, through
    // its cast back; the next call converts the node and gives it the 16-bit value itself.
    dg_output more = dg_matmul(g, "more", m.h, m.w2, false, false);
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(more), DG_FLOAT32);
    assert_string_equal(dg_node_name(dg_node_input(more.node, 0).node), "h/CastToFloat32");
    dg_output p_in = dg_placeholder(g, "p_in", DG_FLOAT32, dg_shape2(2, 2));
    dg_output p = dg_relu(g, "p", dg_matmul(g, "pm", p_in, p_in, false, false));
    assert_true(dg_graph_rewrite_mixed_precision(g, &o, &r, st));
    assert_int_equal(r.nodes_converted, 3);   // more, the new product and its relu
    assert_int_equal(r.casts_added, 4);       // p_in's, and the three's casts back for fetches
                                              // (more reads h and w2's cast, both there)
    assert_int_equal(dg_output_dtype(more), DG_BFLOAT16);
    assert_ptr_equal(dg_node_input(more.node, 0).node, m.h.node);
    assert_string_equal(dg_node_name(dg_node_input(more.node, 1).node), "w2/CastToBfloat16");
    assert_int_equal(dg_output_dtype(p), DG_BFLOAT16);
    assert_topological(g);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_bad_options(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    mlp m;
    mlp_build(&m);
    dg_mixed_precision_options o = dg_mixed_precision_options_default(DG_FLOAT64);
    assert_false(dg_graph_rewrite_mixed_precision(m.g, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "must be bfloat16 or float16, got float64");
    o.dtype = DG_BFLOAT16;
    o.allow_add = "MatMul, NoSuchOp";
    assert_false(dg_graph_rewrite_mixed_precision(m.g, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "allow_add: unknown op type \"NoSuchOp\"");
    o.allow_add = NULL;
    o.infer_add = "Exp";
    assert_false(dg_graph_rewrite_mixed_precision(m.g, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "infer_add: Exp has no 16-bit kernel");
    assert_false(dg_graph_rewrite_mixed_precision(m.g, NULL, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    dg_graph_free(&m.g);
    // The builders' casts and the rewrite do not mix.
    dg_graph *g = dg_graph_new();
    assert_true(dg_graph_set_mixed_precision(g, DG_BFLOAT16, st));
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(2, 2));
    dg_matmul(g, "y", x, x, false, false);
    o = dg_mixed_precision_options_default(DG_BFLOAT16);
    assert_false(dg_graph_rewrite_mixed_precision(g, &o, NULL, st));
    assert_status(st, DG_FAILED_PRECONDITION, "dg_graph_set_mixed_precision");
    dg_graph_free(&g);
    // Lists changed: MatMul off the allow list leaves nothing to convert; Relu denied stays float32.
    mlp_build(&m);
    o.allow_remove = "MatMul";
    dg_mixed_precision_report r;
    assert_true(dg_graph_rewrite_mixed_precision(m.g, &o, &r, st));
    assert_int_equal(r.nodes_converted, 0);
    assert_int_equal(r.casts_added, 0);
    dg_graph_free(&m.g);
    mlp_build(&m);
    o = dg_mixed_precision_options_default(DG_BFLOAT16);
    o.deny_add = "Relu";
    assert_true(dg_graph_rewrite_mixed_precision(m.g, &o, &r, st));
    assert_int_equal(dg_output_dtype(m.h), DG_FLOAT32);
    assert_int_equal(dg_node_output_dtype(find(m.g, "h_pre"), 0), DG_BFLOAT16);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

// Fixed inputs and labels for the MLP.
static void mlp_data(float *xv, int32_t *lv) {
    uint64_t seed = 99;
    for (int i = 0; i < B * IN; i++) xv[i] = (float)dg_test_uniform(&seed, -1, 1);
    for (int i = 0; i < B; i++) lv[i] = (int32_t)(dg_test_uniform(&seed, 0, OUT)) % OUT;
}

static dg_session *mlp_session(mlp *m, bool mixed, dg_status *st) {
    dg_session_options so = dg_session_options_default();
    dg_mixed_precision_options o = dg_mixed_precision_options_default(DG_BFLOAT16);
    if (mixed) so.mixed_precision = &o;
    dg_session *s = dg_session_new(m->g, "local", &so, st);
    assert_ok(st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &m->init, 1, st));
    assert_ok(st);
    return s;
}

// The session option's logits against float64 with the rewrite's roundings: each converted op
// rounds its float32 result once to bfloat16.
static void test_logits_against_float64(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    mlp m;
    mlp_build(&m);
    dg_session *s = mlp_session(&m, true, st);
    float xv[B * IN];
    int32_t lv[B];
    mlp_data(xv, lv);
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, IN), xv, st);
    dg_tensor *out[5] = {0};
    dg_output fetch[] = {m.logits, m.w1, m.b1, m.w2, m.b2};
    assert_true(dg_session_run(s, &m.x, &xt, 1, fetch, out, 5, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < 5; i++) assert_int_equal(dg_tensor_dtype(out[i]), DG_FLOAT32);   // logits read back
    const float *lg = dg_tensor_f32(out[0]), *w1 = dg_tensor_f32(out[1]), *b1 = dg_tensor_f32(out[2]);
    const float *w2 = dg_tensor_f32(out[3]), *b2 = dg_tensor_f32(out[4]);
    int differs = 0;
    for (int i = 0; i < B; i++) {
        double h[H], hmag[H];
        for (int j = 0; j < H; j++) {
            double acc = 0, mag = 0;
            for (int k = 0; k < IN; k++) {
                double p = round16(DG_BFLOAT16, xv[i * IN + k]) * round16(DG_BFLOAT16, w1[k * H + j]);
                acc += p;
                mag += fabs(p);
            }
            double pre = round16(DG_BFLOAT16, round16(DG_BFLOAT16, acc) + round16(DG_BFLOAT16, b1[j]));
            h[j] = pre > 0 ? pre : 0;
            hmag[j] = mag + fabs(b1[j]);
        }
        for (int j = 0; j < OUT; j++) {
            double acc = 0, mag = 0, f32 = b2[j];
            for (int k = 0; k < H; k++) {
                acc += h[k] * round16(DG_BFLOAT16, w2[k * OUT + j]);
                mag += hmag[k] * fabs(w2[k * OUT + j]);
            }
            double want = round16(DG_BFLOAT16, round16(DG_BFLOAT16, acc) + round16(DG_BFLOAT16, b2[j]));
            mag += fabs(b2[j]);
            (void)f32;
            // The reference rounds as the graph does; the sums' order differs (float32 against
            // float64), which can move a rounding by one bfloat16 step: 2^-8 of what went in.
            double got = lg[i * OUT + j], tol = 0x1p-7 * mag;
            if (!(fabs(got - want) <= tol)) fail_msg("logit[%d,%d] = %.9g, want %.9g (tolerance %.3g)", i, j, got, want, tol);
            // What came back is a bfloat16 value read back in float32.
            if (round16(DG_BFLOAT16, got) != got) fail_msg("logit[%d,%d] = %.9g is not a bfloat16 value", i, j, got);
            differs += got != want;
        }
    }
    print_message("logits: %d of %d differ from the float64 reference's roundings\n", differs, B * OUT);
    assert_true(differs < B * OUT / 4);
    for (int i = 0; i < 5; i++) dg_tensor_unref(out[i]);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

// 60 steps on one batch under the session option and in float32: both losses fall, and end
// within a few percent of each other; the weights stay float32.
static double train(bool mixed, double *first) {
    dg_status *st = dg_status_new();
    mlp m;
    mlp_build(&m);
    dg_session *s = mlp_session(&m, mixed, st);
    float xv[B * IN];
    int32_t lv[B];
    mlp_data(xv, lv);
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, IN), xv, st);
    dg_tensor *lt = dg_tensor_from_data(DG_INT32, dg_shape1(B), lv, st);
    dg_output feeds[] = {m.x, m.labels};
    dg_tensor *vals[] = {xt, lt}, *loss = NULL, *w = NULL;
    for (int step = 0; step < 60; step++) {
        assert_true(dg_session_run(s, feeds, vals, 2, &m.loss, &loss, 1, &m.train, 1, st));
        assert_ok(st);
        if (step == 0) *first = dg_tensor_f32(loss)[0];
        if (step < 59) dg_tensor_unref(loss);
    }
    double last = dg_tensor_f32(loss)[0];
    assert_true(dg_session_run(s, NULL, NULL, 0, &m.w1, &w, 1, NULL, 0, st));
    assert_int_equal(dg_tensor_dtype(w), DG_FLOAT32);
    dg_tensor_unref(w);
    dg_tensor_unref(loss);
    dg_tensor_unref(xt);
    dg_tensor_unref(lt);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_status_free(&st);
    return last;
}

static void test_training(void **state) {
    (void)state;
    double f0, m0;
    double f32 = train(false, &f0), mixed = train(true, &m0);
    print_message("loss: float32 %.5f -> %.5f, bfloat16 rewrite %.5f -> %.5f\n", f0, f32, m0, mixed);
    assert_true(fabs(m0 - f0) <= 0.01 * f0);
    assert_true(f32 < 0.5 * f0);
    assert_true(mixed < 0.5 * m0);
    assert_true(fabs(mixed - f32) <= 0.05 * f32 + 0.01);
    assert_true(mixed != f32);   // the rewrite did change the arithmetic
}

// Float16 with loss scaling: the gradients are unscaled in float32 (the loss scaler marks its
// multiply), so a weight gradient below float16's smallest value (2^-24) still reaches the
// variable: one step of gradient descent moves w by exactly the float64 gradient's amount,
// which in float16 would have rounded to 0 or 2^-24.
static void test_loss_scale_unscales_in_float32(void **state) {
    (void)state;
    enum { R = 4, C = 8, O = 2 };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(R, C));
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(C, O), dg_init_constant(0.5));
    dg_output loss = dg_mul(g, "loss", dg_mean(g, NULL, dg_matmul(g, "y", x, w, false, false), NULL, 0, false),
                            dg_scalar(g, NULL, DG_FLOAT32, 1e-7));
    dg_optimizer opt = dg_gradient_descent(g, 1.0);
    dg_loss_scale ls;
    dg_node *train = dg_optimizer_minimize_with_loss_scale(&opt, loss, (dg_output){NULL, 0}, NULL, &ls);
    dg_node *init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    dg_mixed_precision_options o = dg_mixed_precision_options_default(DG_FLOAT16);
    dg_mixed_precision_report r;
    assert_true(dg_graph_rewrite_mixed_precision(g, &o, &r, st));
    assert_ok(st);
    assert_int_equal(dg_node_output_dtype(find(g, "y"), 0), DG_FLOAT16);
    int unscales = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        for (int j = 0; j < dg_node_num_inputs(n); j++)
            if (!strcmp(dg_node_op_type(n), "Mul") && !strcmp(dg_node_op_type(dg_node_input(n, j).node), "Div") &&
                strstr(dg_node_name(dg_node_input(n, j).node), "/inverse")) {
                unscales++;
                assert_int_equal(dg_node_output_dtype(n, 0), DG_FLOAT32);
            }
    }
    assert_int_equal(unscales, 1);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    float xv[R * C];
    for (int i = 0; i < R * C; i++) xv[i] = 1.0f + (float)(i % 3);   // 1, 2 or 3: exact in float16
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(R, C), xv, st), *wt = NULL;
    assert_true(dg_session_run(s, &x, &xt, 1, NULL, NULL, 0, &train, 1, st));
    assert_true(dg_session_run(s, NULL, NULL, 0, &w, &wt, 1, NULL, 0, st));
    assert_ok(st);
    const float *wv = dg_tensor_f32(wt);
    for (int k = 0; k < C; k++) {
        double grad = 0;   // d loss / d w[k][j] = 1e-7 / (R * O) * sum_i x[i][k]
        for (int i = 0; i < R; i++) grad += xv[i * C + k];
        grad *= 1e-7 / (R * O);
        for (int j = 0; j < O; j++) {
            double moved = 0.5 - (double)wv[k * O + j];
            // float32 steps near 0.5 are 2^-25; the float16 products of exact values with the
            // scale's power of two lose nothing more.
            if (!(fabs(moved - grad) <= 0x1p-24 + 1e-3 * grad))
                fail_msg("w[%d][%d] moved by %.4g, want %.4g", k, j, moved, grad);
        }
    }
    dg_tensor_unref(wt);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// A LayerNorm of float32 input stays float32 (nothing before it is converted), but its gradient,
// fed by a converted product's, converts: it reads the forward pass's mean and rstd in float32
// still, and a training step runs.
static void test_statistics_stay_float32(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, 8));
    dg_output gamma = dg_variable(g, "gamma", DG_FLOAT32, dg_shape1(8), dg_init_constant(1));
    dg_output beta = dg_variable(g, "beta", DG_FLOAT32, dg_shape1(8), dg_init_zeros());
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(8, 3), dg_init_random_uniform(-1, 1, 5));
    dg_output h = dg_layer_norm(g, "ln", x, gamma, beta, 1e-5);
    dg_output loss = dg_mean(g, "loss", dg_matmul(g, "y", h, w, false, false), NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    dg_node *init = dg_global_variables_initializer(g);
    dg_mixed_precision_options o = dg_mixed_precision_options_default(DG_BFLOAT16);
    assert_true(dg_graph_rewrite_mixed_precision(g, &o, NULL, st));
    assert_ok(st);
    assert_int_equal(dg_output_dtype(h), DG_FLOAT32);
    dg_node *lng = NULL;
    for (int i = 0; i < dg_graph_num_nodes(g); i++)
        if (!strcmp(dg_node_op_type(dg_graph_node(g, i)), "LayerNormGrad")) lng = dg_graph_node(g, i);
    assert_non_null(lng);
    assert_int_equal(dg_node_output_dtype(lng, 0), DG_BFLOAT16);
    assert_int_equal(dg_output_dtype(dg_node_input(lng, 3)), DG_FLOAT32);
    assert_int_equal(dg_output_dtype(dg_node_input(lng, 4)), DG_FLOAT32);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    float xv[32];
    for (int i = 0; i < 32; i++) xv[i] = (float)(i % 7) - 3;
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(4, 8), xv, st), *gt = NULL;
    assert_true(dg_session_run(s, &x, &xt, 1, NULL, NULL, 0, &train, 1, st));
    assert_true(dg_session_run(s, NULL, NULL, 0, &gamma, &gt, 1, NULL, 0, st));
    assert_ok(st);
    for (int c = 0; c < 8; c++) assert_true(isfinite(dg_tensor_f32(gt)[c]));
    dg_tensor_unref(gt);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// Cases a review found:
// - a broadcasting Add in bfloat16 ([3,1] + [1,3]) takes the general path, not the one-pass
//   kernel for equal element counts;
// - a product built under a control dependency on a variable's update reads the variable
//   through a cast of its own that waits for the update (a shared cast would read it before);
// - gradients through converted nodes are refused, naming the node;
// - a float32 feed of a converted intermediate is rounded to its dtype, and its fetch is float32;
// - a reader of LayerNorm's mean (float32 by design) next to a converted value converts.
static void test_review_cases(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_BFLOAT16, dg_shape2(3, 1)), b = dg_placeholder(g, "b", DG_BFLOAT16, dg_shape2(1, 3));
    dg_output ab = dg_add(g, "ab", a, b);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(2, 2));
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(2, 2), dg_init_constant(1));
    dg_output h = dg_relu(g, "h", dg_matmul(g, "hm", x, w, false, false));
    dg_output upd = dg_assign_add(g, "upd", w, dg_ones_like(g, NULL, w));
    dg_graph_push_control_deps(g, &upd.node, 1);
    dg_output after = dg_matmul(g, "after", x, w, false, false);
    dg_graph_pop_control_deps(g);
    dg_output gamma = dg_variable(g, "gamma", DG_FLOAT32, dg_shape1(2), dg_init_constant(1));
    dg_output ln = dg_layer_norm(g, "ln", h, gamma, dg_zeros_like(g, NULL, gamma), 1e-5);
    dg_output mixed = dg_add(g, "mixed", dg_reshape(g, NULL, (dg_output){ln.node, 1}, (int64_t[]){2, 1}, 2), h);
    dg_node *init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    dg_session_options so = dg_session_options_default();
    dg_mixed_precision_options o = dg_mixed_precision_options_default(DG_BFLOAT16);
    so.mixed_precision = &o;
    dg_session *s = dg_session_new(g, "local", &so, st);
    assert_ok(st);
    assert_int_equal(dg_output_dtype(mixed), DG_BFLOAT16);
    dg_node *wc = dg_node_input(after.node, 1).node;
    assert_string_equal(dg_node_op_type(wc), "Cast");
    assert_ptr_not_equal(wc, dg_node_input(dg_graph_find(g, "hm"), 1).node);   // not the shared cast
    assert_int_equal(dg_node_num_control_inputs(wc), 1);
    assert_ptr_equal(dg_node_control_input(wc, 0), upd.node);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    double av[3] = {1, 2, 3}, bv[3] = {10, 20, 30};
    dg_tensor *at = tensor16(DG_BFLOAT16, dg_shape2(3, 1), av, 3), *bt = tensor16(DG_BFLOAT16, dg_shape2(1, 3), bv, 3);
    float xv[4] = {1, 2, 3, 4}, hv[4] = {0.5f, 0.25f, 1.0f / 3, 2};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(2, 2), xv, st);
    dg_tensor *ht = dg_tensor_from_data(DG_FLOAT32, dg_shape2(2, 2), hv, st);
    dg_output feeds[] = {a, b, x}, fetch[] = {ab, after};
    dg_tensor *vals[] = {at, bt, xt}, *out[2] = {0};
    assert_true(dg_session_run(s, feeds, vals, 3, fetch, out, 2, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_num_elements(out[0]), 9);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) assert_true(get16(out[0], i * 3 + j) == av[i] + bv[j]);
    // w was 1 and the update ran first: x (w + 1) = 2 x [[1,1],[1,1]] row sums.
    assert_int_equal(dg_tensor_dtype(out[1]), DG_FLOAT32);
    const float *ov = dg_tensor_f32(out[1]);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) assert_true(ov[i * 2 + j] == 2 * (xv[i * 2] + xv[i * 2 + 1]));
    dg_tensor_unref(out[0]);
    dg_tensor_unref(out[1]);
    // Feeding the converted h with float32: rounded to bfloat16; fetched back in float32.
    dg_tensor *hf = NULL;
    assert_true(dg_session_run(s, &h, &ht, 1, &h, &hf, 1, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_dtype(hf), DG_FLOAT32);
    for (int i = 0; i < 4; i++) assert_true(dg_tensor_f32(hf)[i] == (float)round16(DG_BFLOAT16, hv[i]));
    dg_tensor_unref(hf);
    // Gradients through the converted product: refused, naming a node on the path.
    dg_output gx;
    assert_false(dg_gradients(g, &h, 1, &x, 1, NULL, &gx));
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "converted by the mixed-precision rewrite");
    dg_tensor_unref(at);
    dg_tensor_unref(bt);
    dg_tensor_unref(xt);
    dg_tensor_unref(ht);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_16),
        cmocka_unit_test(test_batch_matmul_16),
        cmocka_unit_test(test_conv2d_16),
        cmocka_unit_test(test_attention_16),
        cmocka_unit_test(test_layer_norm_16),
        cmocka_unit_test(test_rewrite_mlp),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_logits_against_float64),
        cmocka_unit_test(test_training),
        cmocka_unit_test(test_loss_scale_unscales_in_float32),
        cmocka_unit_test(test_statistics_stay_float32),
        cmocka_unit_test(test_review_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
