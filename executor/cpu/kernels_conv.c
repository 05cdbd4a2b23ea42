/* CPU kernels of convolutional networks: Conv2D and its gradients by im2col and GEMM
 * (cpu_gemm, gemm.c), MaxPool, AvgPool and their gradients, Dropout.
 *
 * im2col: a chunk of output positions (over the whole batch, NHWC) becomes a matrix with one
 * row per position holding its window, [kh][kw][c] (zeros where the window hangs over the
 * padding); times the filter viewed as [kh * kw * c, out] it gives those positions' outputs,
 * already in NHWC order. Chunks hold at most CHUNK_BYTES of window matrix, so it stays in
 * cache and the scratch stays small. The input gradient is the same product transposed,
 * scattered back (col2im); the filter gradient sums window^T x out_backprop over the chunks. A
 * 1x1 window with stride 1 and no padding skips the copy: the input is its own matrix.
 * float32 convolutions of stride 1 and output channels in multiples of 16 (the common case)
 * take the direct kernels of conv_direct.c instead, about twice as fast. Conv2D in bfloat16 and
 * float16 takes the same im2col with cpu_gemm16 (sums in float32, one rounding); its gradients
 * go through float32 (cpu_compute_via_f32: the filter gradient registered by kernels_16.c, the
 * input gradient here). */
#include <float.h>
#include <pthread.h>
#include <stdlib.h>

#include "cpu_impl.h"

#define CHUNK_BYTES ((size_t)1 << 21)

// ---- shapes and geometry, shared with the GPU kernels ----

void *cpu_window_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    graph_window *w = calloc(1, sizeof *w);
    if (!w) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "window op: out of memory");
        return NULL;
    }
    bool pool = strstr(n->op->name, "Pool") != NULL;
    if (!graph_window_attrs(n, pool, w, st)) {
        free(w);
        return NULL;
    }
    return w;
}

static bool rank4(exec_ctx *ctx, const dg_tensor *t, const char *what) {
    if (t->shape.rank == 4) return true;
    char b[128];
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must have rank 4 (NHWC), got shape %s", what,
                     dg_shape_str(&t->shape, b, sizeof b));
}

static bool read_sizes(exec_ctx *ctx, const dg_tensor *t, const char *what, dg_shape *out) {
    int64_t d[4];
    int r = 0;
    if (!cpu_read_dims(t, d, &r, 4) || r != 4)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must be an int32 or int64 vector of 4", what);
    for (int i = 0; i < 4; i++)
        if (d[i] < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s has a negative dimension", what);
    *out = dg_shape_make(4, d);
    return true;
}

static bool geom(exec_ctx *ctx, const dg_shape *x, const graph_window *w, int64_t oc, graph_conv_geom *g) {
    if (graph_conv_geom_make(x, w, oc, g, ctx->st)) return true;
    dg_status_prepend(ctx->st, "node \"%s\" (%s)", ctx->node->name, ctx->node->op->name);
    return false;
}

static bool check_dy(exec_ctx *ctx, const dg_tensor *dy, const graph_conv_geom *g) {
    const int64_t *d = dy->shape.dims;
    if (dy->shape.rank == 4 && d[0] == g->n && d[1] == g->oh && d[2] == g->ow && d[3] == g->oc) return true;
    char b[128];
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "the output gradient has shape %s, the forward output was "
                     "[%lld,%lld,%lld,%lld]", dg_shape_str(&dy->shape, b, sizeof b), (long long)g->n,
                     (long long)g->oh, (long long)g->ow, (long long)g->oc);
}

// Input x [n,h,w,c] and filter f [kh,kw,c,oc].
static bool conv_filter_geom(exec_ctx *ctx, const graph_window *w0, const dg_shape *x, const dg_shape *f,
                             graph_conv_geom *g) {
    if (f->rank != 4) {
        char b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "the filter must be [height, width, in, out], got shape %s",
                         dg_shape_str(f, b, sizeof b));
    }
    if (x->rank == 4 && x->dims[3] != f->dims[2]) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "the input has %lld channels but the filter expects %lld "
                         "(input %s, filter %s)", (long long)x->dims[3], (long long)f->dims[2],
                         dg_shape_str(x, a, sizeof a), dg_shape_str(f, b, sizeof b));
    }
    graph_window w = *w0;
    w.kh = f->dims[0];
    w.kw = f->dims[1];
    if (w.kh < 1 || w.kw < 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "the filter has an empty window");
    return geom(ctx, x, &w, f->dims[3], g);
}

bool cpu_window_geom(exec_ctx *ctx, const graph_window *w, graph_conv_geom *g) {
    const char *op = ctx->node->op->name;
    if (strcmp(op, "Conv2D") == 0 || strncmp(op, "_FusedConv2D", 12) == 0)
        return rank4(ctx, IN(0), "the input") && conv_filter_geom(ctx, w, &IN(0)->shape, &IN(1)->shape, g);
    if (strcmp(op, "Conv2DBackpropInput") == 0) {
        dg_shape x;
        return read_sizes(ctx, IN(0), "input_sizes", &x) && conv_filter_geom(ctx, w, &x, &IN(1)->shape, g) &&
               check_dy(ctx, IN(2), g);
    }
    if (strcmp(op, "Conv2DBackpropFilter") == 0) {
        dg_shape f;
        return rank4(ctx, IN(0), "the input") && read_sizes(ctx, IN(1), "filter_sizes", &f) &&
               conv_filter_geom(ctx, w, &IN(0)->shape, &f, g) && check_dy(ctx, IN(2), g);
    }
    if (strcmp(op, "AvgPoolGrad") == 0) {
        dg_shape x;
        return read_sizes(ctx, IN(0), "orig_input_shape", &x) && geom(ctx, &x, w, x.dims[3], g) &&
               check_dy(ctx, IN(1), g);
    }
    // MaxPool, AvgPool, MaxPoolGrad
    if (!rank4(ctx, IN(0), "the input") || !geom(ctx, &IN(0)->shape, w, IN(0)->shape.dims[3], g)) return false;
    if (strcmp(op, "MaxPoolGrad") == 0 || strcmp(op, "_FusedMaxPoolGradReluGrad") == 0)
        return check_dy(ctx, IN(1), g) && check_dy(ctx, IN(2), g);
    return true;
}

// ---- im2col and col2im ----

// The output position after (n, oy, ox) in row-major order.
static inline void next_position(const graph_conv_geom *g, int64_t *n, int64_t *oy, int64_t *ox) {
    if (++*ox < g->ow) return;
    *ox = 0;
    if (++*oy < g->oh) return;
    *oy = 0;
    ++*n;
}

// A window row, kw * c elements, is contiguous in the input: one copy when it lies inside,
// element groups with zeros where it hangs over the padding.
#define DEFINE_IM2COL(T, SFX)                                                                     \
    /* Rows [r0, r0 + rows) of the window matrix of x into col ([rows][kh][kw][c]). */            \
    CPU_CLONES static void im2col_##SFX(const graph_conv_geom *g, const T *x, int64_t r0, int64_t rows, \
                                        T *col) {                                                 \
        const int64_t c = g->c, krow = g->kw * c;                                                 \
        int64_t ox = r0 % g->ow, oy = (r0 / g->ow) % g->oh, n = r0 / (g->ow * g->oh);             \
        for (int64_t r = 0; r < rows; r++, next_position(g, &n, &oy, &ox)) {                      \
            T *dst = col + r * g->kh * krow;                                                      \
            int64_t iy0 = oy * g->sh - g->pad_top, ix0 = ox * g->sw - g->pad_left;                \
            bool inside = ix0 >= 0 && ix0 + g->kw <= g->w;                                        \
            for (int64_t ky = 0; ky < g->kh; ky++, dst += krow) {                                 \
                int64_t iy = iy0 + ky;                                                            \
                if (iy < 0 || iy >= g->h) {                                                       \
                    for (int64_t k = 0; k < krow; k++) dst[k] = 0;                                \
                    continue;                                                                     \
                }                                                                                 \
                const T *src = x + ((n * g->h + iy) * g->w) * c;                                  \
                if (inside) {                                                                     \
                    const T *s = src + ix0 * c;                                                   \
                    for (int64_t k = 0; k < krow; k++) dst[k] = s[k];                             \
                    continue;                                                                     \
                }                                                                                 \
                for (int64_t kx = 0; kx < g->kw; kx++) {                                          \
                    int64_t ix = ix0 + kx;                                                        \
                    T *d = dst + kx * c;                                                          \
                    if (ix < 0 || ix >= g->w)                                                     \
                        for (int64_t k = 0; k < c; k++) d[k] = 0;                                 \
                    else                                                                          \
                        for (int64_t k = 0; k < c; k++) d[k] = src[ix * c + k];                   \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }
#define DEFINE_COL2IM(T, SFX)                                                                     \
    /* Adds rows [r0, r0 + rows) of a window-matrix gradient back into dx. */                     \
    CPU_CLONES static void col2im_##SFX(const graph_conv_geom *g, const T *col, int64_t r0, int64_t rows, \
                                        T *dx) {                                                  \
        const int64_t c = g->c, krow = g->kw * c;                                                 \
        int64_t ox = r0 % g->ow, oy = (r0 / g->ow) % g->oh, n = r0 / (g->ow * g->oh);             \
        for (int64_t r = 0; r < rows; r++, next_position(g, &n, &oy, &ox)) {                      \
            const T *src = col + r * g->kh * krow;                                                \
            int64_t iy0 = oy * g->sh - g->pad_top, ix0 = ox * g->sw - g->pad_left;                \
            bool inside = ix0 >= 0 && ix0 + g->kw <= g->w;                                        \
            for (int64_t ky = 0; ky < g->kh; ky++, src += krow) {                                 \
                int64_t iy = iy0 + ky;                                                            \
                if (iy < 0 || iy >= g->h) continue;                                               \
                T *dst = dx + ((n * g->h + iy) * g->w) * c;                                       \
                if (inside) {                                                                     \
                    T *d = dst + ix0 * c;                                                         \
                    for (int64_t k = 0; k < krow; k++) d[k] += src[k];                            \
                    continue;                                                                     \
                }                                                                                 \
                for (int64_t kx = 0; kx < g->kw; kx++) {                                          \
                    int64_t ix = ix0 + kx;                                                        \
                    if (ix < 0 || ix >= g->w) continue;                                           \
                    T *d = dst + ix * c;                                                          \
                    const T *s = src + kx * c;                                                    \
                    for (int64_t k = 0; k < c; k++) d[k] += s[k];                                 \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }
DEFINE_IM2COL(float, f32)
DEFINE_IM2COL(double, f64)
DEFINE_IM2COL(uint16_t, u16)   // the 16-bit floats: copies of their bits (0 is +0)
DEFINE_COL2IM(float, f32)
DEFINE_COL2IM(double, f64)

static void im2col(dg_dtype t, const graph_conv_geom *g, const void *x, int64_t r0, int64_t rows, void *col) {
    if (t == DG_FLOAT32)
        im2col_f32(g, x, r0, rows, col);
    else if (t == DG_FLOAT64)
        im2col_f64(g, x, r0, rows, col);
    else
        im2col_u16(g, x, r0, rows, col);
}

static void col2im(dg_dtype t, const graph_conv_geom *g, const void *col, int64_t r0, int64_t rows, void *dx) {
    if (t == DG_FLOAT32)
        col2im_f32(g, col, r0, rows, dx);
    else
        col2im_f64(g, col, r0, rows, dx);
}

// Output positions per chunk and a scratch window matrix for them (NULL for pointwise).
static bool chunk_scratch(exec_ctx *ctx, const graph_conv_geom *g, size_t elem, int64_t *rows, void **col) {
    int64_t total = g->n * g->oh * g->ow, k = g->kh * g->kw * g->c;
    *col = NULL;
    *rows = total;
    if (graph_conv_is_pointwise(g) || total == 0 || k == 0) return true;
    int64_t r = (int64_t)(CHUNK_BYTES / ((size_t)k * elem));
    *rows = r < 1 ? 1 : r > total ? total : r;
    *col = malloc((size_t)*rows * (size_t)k * elem);
    if (!*col)
        return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "%lld bytes of window matrix",
                         (long long)(*rows * k * (int64_t)elem));
    return true;
}

// ---- Conv2D and its gradients ----

// Rows [r0, r0 + m) of x's window matrix: x itself for a pointwise window (col NULL), else col
// filled by im2col.
static const void *window_rows(const dg_tensor *x, const graph_conv_geom *g, void *col, int64_t r0, int64_t m) {
    if (!col) return (const char *)x->data + (size_t)(r0 * g->kh * g->kw * g->c) * dg_dtype_size(x->dtype);
    im2col(x->dtype, g, x->data, r0, m, col);
    return col;
}

// Conv2D, and the fused Conv2D + BiasAdd [+ Relu] (fusion.c) when ep is given: bias input 2.
static bool conv2d_run(void *state, exec_ctx *ctx, const cpu_conv_epilogue *ep) {
    graph_conv_geom g;
    if (!cpu_window_geom(ctx, state, &g)) return false;
    dg_tensor *x = IN(0), *f = IN(1);
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, dg_shape_make(4, (int64_t[]){g.n, g.oh, g.ow, g.oc}));
    if (!o) return false;
    size_t elem = dg_dtype_size(x->dtype);
    int64_t total = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c, rows;
    if (total == 0 || g.oc == 0) return true;
    if (k == 0) {
        memset(o->data, 0, o->nbytes);
    } else if (x->dtype == DG_FLOAT32 && !graph_conv_is_pointwise(&g) &&
               cpu_conv_direct_fwd_f32(&g, x->data, f->data, ep, o->data)) {
        return true;
    } else {
        void *col;
        if (!chunk_scratch(ctx, &g, elem, &rows, &col)) return false;
        bool is16 = dg_dtype_is_float16_family(x->dtype), ok = true;
        for (int64_t r0 = 0; r0 < total && ok; r0 += rows) {
            int64_t m = total - r0 < rows ? total - r0 : rows;
            void *out = (char *)o->data + (size_t)(r0 * g.oc) * elem;
            if (is16)   // sums in float32, each output rounded once (cpu_gemm16)
                ok = cpu_gemm16(x->dtype, false, false, m, g.oc, k, window_rows(x, &g, col, r0, m), k, f->data, g.oc,
                                out, g.oc);
            else
                cpu_gemm(x->dtype, false, false, m, g.oc, k, 1.0, window_rows(x, &g, col, r0, m), k, f->data, g.oc,
                         0.0, out, g.oc);
        }
        free(col);
        if (!ok) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "Conv2D: no memory for a %s product", dg_dtype_name(x->dtype));
    }
    if (ep) {   // float32 only (fusion.c)
        float *y = o->data;
        for (int64_t i = 0; i < total; i++)
            for (int64_t c = 0; c < g.oc; c++) {
                float v = y[i * g.oc + c] + ep->bias[c];
                y[i * g.oc + c] = ep->relu ? (v > 0 ? v : 0) : v;
            }
    }
    return true;
}

static bool conv2d_compute(void *state, exec_ctx *ctx) { return conv2d_run(state, ctx, NULL); }

static bool fused_conv2d_compute(void *state, exec_ctx *ctx) {
    const dg_tensor *x = IN(0), *f = IN(1), *b = IN(2);
    if (x->dtype != DG_FLOAT32 || f->dtype != DG_FLOAT32 || b->dtype != DG_FLOAT32)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "fused Conv2D + BiasAdd takes float32 only");
    if (f->shape.rank == 4 && (b->shape.rank != 1 || b->shape.dims[0] != f->shape.dims[3])) {
        char a[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "BiasAdd: the bias has shape %s, the convolution makes %lld "
                         "channels", dg_shape_str(&b->shape, a, sizeof a), (long long)f->shape.dims[3]);
    }
    cpu_conv_epilogue ep = {b->data, strcmp(ctx->node->op->name, "_FusedConv2DBiasRelu") == 0};
    return conv2d_run(state, ctx, &ep);
}

static bool conv2d_bp_input_compute(void *state, exec_ctx *ctx) {
    // The 16-bit floats through float32 (the kernel is chosen by input 0, the int sizes).
    if (dg_dtype_is_float16_family(IN(1)->dtype)) return cpu_compute_via_f32(conv2d_bp_input_compute, state, ctx);
    graph_conv_geom g;
    if (!cpu_window_geom(ctx, state, &g)) return false;
    dg_tensor *f = IN(1), *dy = IN(2);
    dg_tensor *dx = exec_alloc_output(ctx, 0, f->dtype, dg_shape_make(4, (int64_t[]){g.n, g.h, g.w, g.c}));
    if (!dx) return false;
    size_t elem = dg_dtype_size(f->dtype);
    int64_t total = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c, rows;
    if (graph_conv_is_pointwise(&g) && total > 0 && k > 0) {   // dx = dy x f^T, written in place
        cpu_gemm(f->dtype, false, true, total, k, g.oc, 1.0, dy->data, g.oc, f->data, g.oc, 0.0, dx->data, k);
        return true;
    }
    if (total > 0 && k > 0 && f->dtype == DG_FLOAT32 && cpu_conv_direct_bp_input_f32(&g, f->data, dy->data, dx->data))
        return true;
    memset(dx->data, 0, dx->nbytes);
    if (total == 0 || k == 0) return true;
    void *col;
    if (!chunk_scratch(ctx, &g, elem, &rows, &col)) return false;
    for (int64_t r0 = 0; r0 < total; r0 += rows) {
        int64_t m = total - r0 < rows ? total - r0 : rows;
        cpu_gemm(f->dtype, false, true, m, k, g.oc, 1.0, (const char *)dy->data + (size_t)(r0 * g.oc) * elem, g.oc,
                 f->data, g.oc, 0.0, col, k);
        col2im(f->dtype, &g, col, r0, m, dx->data);
    }
    free(col);
    return true;
}

static bool conv2d_bp_filter_compute(void *state, exec_ctx *ctx) {
    graph_conv_geom g;
    if (!cpu_window_geom(ctx, state, &g)) return false;
    dg_tensor *x = IN(0), *dy = IN(2);
    dg_tensor *df = exec_alloc_output(ctx, 0, x->dtype, dg_shape_make(4, (int64_t[]){g.kh, g.kw, g.c, g.oc}));
    if (!df) return false;
    size_t elem = dg_dtype_size(x->dtype);
    int64_t total = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c, rows;
    if (total == 0 || k == 0 || g.oc == 0) {
        memset(df->data, 0, df->nbytes);
        return true;
    }
    if (x->dtype == DG_FLOAT32 && !graph_conv_is_pointwise(&g) &&
        cpu_conv_direct_bp_filter_f32(&g, x->data, dy->data, df->data))
        return true;
    void *col;
    if (!chunk_scratch(ctx, &g, elem, &rows, &col)) return false;
    for (int64_t r0 = 0; r0 < total; r0 += rows) {
        int64_t m = total - r0 < rows ? total - r0 : rows;
        cpu_gemm(x->dtype, true, false, k, g.oc, m, 1.0, window_rows(x, &g, col, r0, m), k,
                 (const char *)dy->data + (size_t)(r0 * g.oc) * elem, g.oc, r0 == 0 ? 0.0 : 1.0, df->data, g.oc);
    }
    free(col);
    return true;
}

// ---- pooling ----

// Visits the input rows (iy) and columns (ix) inside output position (oy, ox)'s window.
#define WINDOW_RANGE(g, oy, ox, y0, y1, x0, x1)                                     \
    int64_t y0 = (oy) * (g)->sh - (g)->pad_top, x0 = (ox) * (g)->sw - (g)->pad_left; \
    int64_t y1 = y0 + (g)->kh, x1 = x0 + (g)->kw;                                    \
    if (y0 < 0) y0 = 0;                                                              \
    if (x0 < 0) x0 = 0;                                                              \
    if (y1 > (g)->h) y1 = (g)->h;                                                    \
    if (x1 > (g)->w) x1 = (g)->w

#define DEFINE_POOL(T, SFX, LOWEST)                                                                \
    static void max_pool_##SFX(const graph_conv_geom *g, const T *x, T *y) {                      \
        const int64_t c = g->c;                                                                   \
        for (int64_t n = 0; n < g->n; n++)                                                        \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    T *o = y + ((n * g->oh + oy) * g->ow + ox) * c;                               \
                    for (int64_t k = 0; k < c; k++) o[k] = LOWEST;                                \
                    WINDOW_RANGE(g, oy, ox, y0, y1, x0, x1);                                      \
                    for (int64_t iy = y0; iy < y1; iy++)                                          \
                        for (int64_t ix = x0; ix < x1; ix++) {                                    \
                            const T *s = x + ((n * g->h + iy) * g->w + ix) * c;                   \
                            for (int64_t k = 0; k < c; k++) o[k] = s[k] > o[k] ? s[k] : o[k];     \
                        }                                                                         \
                }                                                                                 \
    }                                                                                             \
    /* The gradient goes to the first input of each window (in row-major order) equal to the     \
     * window's maximum, as TensorFlow's CPU kernel; done[k] (0 or 1) marks channels already     \
     * routed. Branch-free, so the channel loop vectorizes. */                                    \
    CPU_CLONES static void max_pool_grad_##SFX(const graph_conv_geom *g, const T *x, const T *y, const T *dy, \
                                               T *dx, T *done) {                                  \
        const int64_t c = g->c;                                                                   \
        for (int64_t n = 0; n < g->n; n++)                                                        \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    int64_t at = ((n * g->oh + oy) * g->ow + ox) * c;                             \
                    const T *m = y + at, *d = dy + at;                                            \
                    for (int64_t k = 0; k < c; k++) done[k] = 0;                                  \
                    WINDOW_RANGE(g, oy, ox, y0, y1, x0, x1);                                      \
                    for (int64_t iy = y0; iy < y1; iy++)                                          \
                        for (int64_t ix = x0; ix < x1; ix++) {                                    \
                            int64_t i = ((n * g->h + iy) * g->w + ix) * c;                        \
                            for (int64_t k = 0; k < c; k++) {                                     \
                                bool hit = x[i + k] == m[k] && done[k] == 0;                      \
                                dx[i + k] += hit ? d[k] : (T)0;                                   \
                                done[k] = hit ? (T)1 : done[k];                                   \
                            }                                                                     \
                        }                                                                         \
                }                                                                                 \
    }                                                                                             \
    static void avg_pool_##SFX(const graph_conv_geom *g, const T *x, T *y) {                      \
        const int64_t c = g->c;                                                                   \
        for (int64_t n = 0; n < g->n; n++)                                                        \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    T *o = y + ((n * g->oh + oy) * g->ow + ox) * c;                               \
                    for (int64_t k = 0; k < c; k++) o[k] = 0;                                     \
                    WINDOW_RANGE(g, oy, ox, y0, y1, x0, x1);                                      \
                    for (int64_t iy = y0; iy < y1; iy++)                                          \
                        for (int64_t ix = x0; ix < x1; ix++) {                                    \
                            const T *s = x + ((n * g->h + iy) * g->w + ix) * c;                   \
                            for (int64_t k = 0; k < c; k++) o[k] += s[k];                         \
                        }                                                                         \
                    T inv = (T)1 / (T)((y1 - y0) * (x1 - x0));                                    \
                    for (int64_t k = 0; k < c; k++) o[k] *= inv;                                  \
                }                                                                                 \
    }                                                                                             \
    static void avg_pool_grad_##SFX(const graph_conv_geom *g, const T *dy, T *dx) {               \
        const int64_t c = g->c;                                                                   \
        for (int64_t n = 0; n < g->n; n++)                                                        \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    const T *d = dy + ((n * g->oh + oy) * g->ow + ox) * c;                        \
                    WINDOW_RANGE(g, oy, ox, y0, y1, x0, x1);                                      \
                    T inv = (T)1 / (T)((y1 - y0) * (x1 - x0));                                    \
                    for (int64_t iy = y0; iy < y1; iy++)                                          \
                        for (int64_t ix = x0; ix < x1; ix++) {                                    \
                            T *s = dx + ((n * g->h + iy) * g->w + ix) * c;                        \
                            for (int64_t k = 0; k < c; k++) s[k] += d[k] * inv;                   \
                        }                                                                         \
                }                                                                                 \
    }
DEFINE_POOL(float, f32, -FLT_MAX)
DEFINE_POOL(double, f64, -DBL_MAX)

static bool pool_compute(void *state, exec_ctx *ctx) {
    graph_conv_geom g;
    if (!cpu_window_geom(ctx, state, &g)) return false;
    dg_tensor *x = IN(0);
    dg_tensor *y = exec_alloc_output(ctx, 0, x->dtype, dg_shape_make(4, (int64_t[]){g.n, g.oh, g.ow, g.c}));
    if (!y) return false;
    bool max = strcmp(ctx->node->op->name, "MaxPool") == 0;
    if (max && x->dtype == DG_FLOAT32 && cpu_max_pool_tiles(&g))
        cpu_max_pool_tiled_f32(&g, x->data, y->data);
    else if (x->dtype == DG_FLOAT32)
        (max ? max_pool_f32 : avg_pool_f32)(&g, x->data, y->data);
    else
        (max ? max_pool_f64 : avg_pool_f64)(&g, x->data, y->data);
    return true;
}

// MaxPoolGrad, and (fusion.c) MaxPoolGrad followed by ReluGrad with x as the Relu's output:
// the gradient reaches only inputs above 0.
static bool max_pool_grad_compute(void *state, exec_ctx *ctx) {
    graph_conv_geom g;
    if (!cpu_window_geom(ctx, state, &g)) return false;
    dg_tensor *x = IN(0);
    dg_tensor *dx = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    if (!dx) return false;
    bool relu = strcmp(ctx->node->op->name, "_FusedMaxPoolGradReluGrad") == 0;
    if (x->dtype == DG_FLOAT32 && cpu_max_pool_tiles(&g)) {
        cpu_max_pool_grad_tiled_f32(&g, x->data, IN(1)->data, IN(2)->data, relu, dx->data);
        return true;
    }
    void *done = malloc((size_t)(g.c + 1) * dg_dtype_size(x->dtype));
    if (!done) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "%lld channels of scratch", (long long)g.c + 1);
    memset(dx->data, 0, dx->nbytes);
    if (x->dtype == DG_FLOAT32)
        max_pool_grad_f32(&g, x->data, IN(1)->data, IN(2)->data, dx->data, done);
    else
        max_pool_grad_f64(&g, x->data, IN(1)->data, IN(2)->data, dx->data, done);
    free(done);
    if (relu)   // float32 only (fusion.c)
        for (int64_t i = 0; i < x->n_elements; i++)
            if (!(F32(x)[i] > 0)) F32(dx)[i] = 0;
    return true;
}

static bool avg_pool_grad_compute(void *state, exec_ctx *ctx) {
    graph_conv_geom g;
    if (!cpu_window_geom(ctx, state, &g)) return false;
    dg_tensor *dy = IN(1);
    dg_tensor *dx = exec_alloc_output(ctx, 0, dy->dtype, dg_shape_make(4, (int64_t[]){g.n, g.h, g.w, g.c}));
    if (!dx) return false;
    memset(dx->data, 0, dx->nbytes);
    if (dy->dtype == DG_FLOAT32)
        avg_pool_grad_f32(&g, dy->data, dx->data);
    else
        avg_pool_grad_f64(&g, dy->data, dx->data);
    return true;
}

// ---- Dropout ----

void *cpu_dropout_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    cpu_dropout_state *d = calloc(1, sizeof *d);
    if (!d) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "Dropout: out of memory");
        return NULL;
    }
    dg_node_attr_float(n, "rate", &d->rate);
    exec_philox_init_node(&d->rng, n);
    pthread_mutex_init(&d->mu, NULL);
    return d;
}

void cpu_dropout_destroy(void *state) {
    cpu_dropout_state *d = state;
    pthread_mutex_destroy(&d->mu);
    free(d);
}

bool cpu_dropout_training(exec_ctx *ctx, bool *training) {
    const dg_tensor *t = IN(1);
    if (t->dtype != DG_BOOL || t->n_elements != 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "training must be a bool scalar");
    *training = *(const uint8_t *)t->data != 0;
    return true;
}

void cpu_dropout_draw(cpu_dropout_state *d, dg_dtype t, bool training, void *mask, int64_t n) {
    if (!training || d->rate == 0) {
        for (int64_t i = 0; i < n; i++) {
            if (t == DG_FLOAT32)
                ((float *)mask)[i] = 1;
            else
                ((double *)mask)[i] = 1;
        }
        return;
    }
    pthread_mutex_lock(&d->mu);
    if (t == DG_FLOAT32) {
        float rate = (float)d->rate, scale = 1.0f / (1.0f - rate), *m = mask;
        for (int64_t i = 0; i < n; i++) m[i] = exec_philox_uniform_f(&d->rng) >= rate ? scale : 0.0f;
    } else {
        double scale = 1.0 / (1.0 - d->rate), *m = mask;
        for (int64_t i = 0; i < n; i++) m[i] = exec_philox_uniform_d(&d->rng) >= d->rate ? scale : 0.0;
    }
    pthread_mutex_unlock(&d->mu);
}

static bool dropout_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    bool training;
    if (!cpu_dropout_training(ctx, &training)) return false;
    dg_tensor *y = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    dg_tensor *m = y ? exec_alloc_output(ctx, 1, x->dtype, x->shape) : NULL;
    if (!m) return false;
    cpu_dropout_draw(state, x->dtype, training, m->data, x->n_elements);
    if (x->dtype == DG_FLOAT32)
        for (int64_t i = 0; i < x->n_elements; i++) F32(y)[i] = F32(x)[i] * F32(m)[i];
    else
        for (int64_t i = 0; i < x->n_elements; i++) F64(y)[i] = F64(x)[i] * F64(m)[i];
    return true;
}

#define K(op, mask, create, compute, destroy, expensive) \
    {op, "CPU", mask, create, compute, destroy, expensive, false, false, NULL, false}
// Kernels are chosen by input 0's dtype: the shape (int32 or int64) for the two gradients
// whose input 0 is the shape they produce.
#define DT_SIZES (DT_BIT(DG_INT32) | DT_BIT(DG_INT64))

const exec_kernel_def cpu_conv_kernels[] = {
    K("Conv2D", DT_FLOATS | DT_FLOAT16S, cpu_window_create, conv2d_compute, free, true),
    K("Conv2DBackpropInput", DT_SIZES, cpu_window_create, conv2d_bp_input_compute, free, true),
    K("Conv2DBackpropFilter", DT_FLOATS, cpu_window_create, conv2d_bp_filter_compute, free, true),
    K("MaxPool", DT_FLOATS, cpu_window_create, pool_compute, free, true),
    K("MaxPoolGrad", DT_FLOATS, cpu_window_create, max_pool_grad_compute, free, true),
    K("AvgPool", DT_FLOATS, cpu_window_create, pool_compute, free, true),
    K("AvgPoolGrad", DT_SIZES, cpu_window_create, avg_pool_grad_compute, free, true),
    K("_FusedConv2DBias", DT_BIT(DG_FLOAT32), cpu_window_create, fused_conv2d_compute, free, true),
    K("_FusedConv2DBiasRelu", DT_BIT(DG_FLOAT32), cpu_window_create, fused_conv2d_compute, free, true),
    K("_FusedMaxPoolGradReluGrad", DT_BIT(DG_FLOAT32), cpu_window_create, max_pool_grad_compute, free, true),
    K("Dropout", DT_FLOATS, cpu_dropout_create, dropout_compute, cpu_dropout_destroy, false),
};
const int cpu_n_conv_kernels = sizeof cpu_conv_kernels / sizeof cpu_conv_kernels[0];
