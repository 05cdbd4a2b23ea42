/* GPU kernels of convolutional networks: Conv2D and its gradients by im2col and cuBLAS (the
 * whole batch's window matrix at once, in the device's memory cache), MaxPool, AvgPool and
 * their gradients, Dropout (its mask drawn on the host from the CPU kernel's stream, so CPU and
 * GPU drop the same elements, then copied). Shapes are checked by the CPU kernels' code
 * (cpu_window_geom), so both give the same errors. */
#include <stdlib.h>

#include "cpu_impl.h"
#include "gpu_impl.h"
#include "launch_conv.h"

typedef struct conv_state {
    exec_cuda_device *dev;   // borrowed; first member (gpu_impl.h)
    graph_window w;
} conv_state;

static void *conv_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_node_device(n, st);
    graph_window *w = dev ? cpu_window_create(n, env, st) : NULL;
    conv_state *s = w ? calloc(1, sizeof *s) : NULL;
    if (w && !s) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "window op: out of memory");
    if (s) {
        s->dev = dev;
        s->w = *w;
    }
    free(w);
    return s;
}

static bool launched(exec_ctx *ctx, exec_cuda_device *dev, cudaError_t err) {
    return gpu_check_launch(ctx, dev, err, ctx->node->op->name);
}

static cuda_window to_cuda(const graph_conv_geom *g) {
    cuda_window c = {g->n, g->h, g->w, g->c, g->kh, g->kw, g->sh, g->sw, g->oh, g->ow, g->pad_top, g->pad_left};
    return c;
}

// Checks the float inputs listed (each must be in dev's memory, of one dtype) and the geometry.
static bool prepare(exec_ctx *ctx, conv_state *s, const int *floats, int n_floats, graph_conv_geom *g) {
    dg_dtype t = ctx->inputs[floats[0]]->dtype;
    for (int k = 0; k < n_floats; k++) {
        const dg_tensor *x = ctx->inputs[floats[k]];
        if (!gpu_dtype_on_device(x->dtype) || x->dtype != t)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d is %s, the GPU kernel takes %s", floats[k],
                             dg_dtype_name(x->dtype), dg_dtype_name(t));
        if (x->n_elements > 0 && !gpu_tensor_in(x, s->dev))
            return exec_fail(ctx, DG_INTERNAL, "input %d is not in the memory of GPU:%d", floats[k], s->dev->id);
    }
    return launched(ctx, s->dev, cudaSetDevice(s->dev->id)) && cpu_window_geom(ctx, &s->w, g);
}

static bool gemm(exec_ctx *ctx, exec_cuda_device *dev, dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                 const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc) {
    bool ok = t == DG_FLOAT32 ? exec_cuda_sgemm(dev, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, ctx->st)
                              : exec_cuda_dgemm(dev, ta, tb, M, N, K, 1.0, A, lda, B, ldb, 0.0, C, ldc, ctx->st);
    if (!ok) dg_status_prepend(ctx->st, "node \"%s\" (%s)", ctx->node->name, ctx->node->op->name);
    return ok;
}

// The window matrix of x in dev's memory (x itself for a pointwise window: *owned false).
static void *window_matrix(exec_ctx *ctx, conv_state *s, const graph_conv_geom *g, const dg_tensor *x, bool *owned) {
    *owned = false;
    if (graph_conv_is_pointwise(g)) return x->data;
    size_t bytes = (size_t)(g->n * g->oh * g->ow * g->kh * g->kw * g->c) * dg_dtype_size(x->dtype);
    void *col = exec_cuda_mem_alloc(s->dev, bytes, ctx->st);
    if (!col) {
        dg_status_prepend(ctx->st, "node \"%s\" (%s): the window matrix", ctx->node->name, ctx->node->op->name);
        return NULL;
    }
    *owned = true;
    cuda_window c = to_cuda(g);
    if (!launched(ctx, s->dev, cuda_launch_im2col(x->dtype == DG_FLOAT64, &c, x->data, col, s->dev->stream))) {
        exec_cuda_mem_free(s->dev, col);
        return NULL;
    }
    return col;
}

static dg_shape shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t v[4] = {a, b, c, d};
    return dg_shape_make(4, v);
}

static bool zero(exec_ctx *ctx, exec_cuda_device *dev, dg_tensor *t) {
    return t->nbytes == 0 || launched(ctx, dev, cudaMemsetAsync(t->data, 0, t->nbytes, dev->stream));
}

static bool conv2d_compute(void *state, exec_ctx *ctx) {
    conv_state *s = state;
    graph_conv_geom g;
    static const int floats[] = {0, 1};
    if (!prepare(ctx, s, floats, 2, &g)) return false;
    dg_tensor *x = IN(0), *f = IN(1);
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, x->dtype, shape4(g.n, g.oh, g.ow, g.oc));
    if (!o) return false;
    int64_t M = g.n * g.oh * g.ow, K = g.kh * g.kw * g.c;
    if (M == 0 || g.oc == 0) return true;
    if (K == 0) return zero(ctx, s->dev, o);
    bool owned;
    void *col = window_matrix(ctx, s, &g, x, &owned);
    if (!col) return false;
    bool ok = gemm(ctx, s->dev, x->dtype, false, false, M, g.oc, K, col, K, f->data, g.oc, o->data, g.oc);
    if (owned) exec_cuda_mem_free(s->dev, col);   // later work on the stream only
    return ok;
}

static bool conv2d_bp_input_compute(void *state, exec_ctx *ctx) {
    conv_state *s = state;
    graph_conv_geom g;
    static const int floats[] = {1, 2};
    if (!prepare(ctx, s, floats, 2, &g)) return false;
    dg_tensor *f = IN(1), *dy = IN(2);
    dg_tensor *dx = gpu_alloc_output(s->dev, ctx, 0, f->dtype, shape4(g.n, g.h, g.w, g.c));
    if (!dx) return false;
    int64_t M = g.n * g.oh * g.ow, K = g.kh * g.kw * g.c;
    if (M == 0 || K == 0 || g.oc == 0) return zero(ctx, s->dev, dx);
    if (graph_conv_is_pointwise(&g)) return gemm(ctx, s->dev, f->dtype, false, true, M, K, g.oc, dy->data, g.oc, f->data, g.oc,
                                      dx->data, K);
    void *col = exec_cuda_mem_alloc(s->dev, (size_t)(M * K) * dg_dtype_size(f->dtype), ctx->st);
    if (!col) return false;
    cuda_window c = to_cuda(&g);
    bool ok = gemm(ctx, s->dev, f->dtype, false, true, M, K, g.oc, dy->data, g.oc, f->data, g.oc, col, K) &&
              launched(ctx, s->dev, cuda_launch_col2im(f->dtype == DG_FLOAT64, &c, col, dx->data, s->dev->stream));
    exec_cuda_mem_free(s->dev, col);
    return ok;
}

static bool conv2d_bp_filter_compute(void *state, exec_ctx *ctx) {
    conv_state *s = state;
    graph_conv_geom g;
    static const int floats[] = {0, 2};
    if (!prepare(ctx, s, floats, 2, &g)) return false;
    dg_tensor *x = IN(0), *dy = IN(2);
    dg_tensor *df = gpu_alloc_output(s->dev, ctx, 0, x->dtype, shape4(g.kh, g.kw, g.c, g.oc));
    if (!df) return false;
    int64_t M = g.n * g.oh * g.ow, K = g.kh * g.kw * g.c;
    if (M == 0 || K == 0 || g.oc == 0) return zero(ctx, s->dev, df);
    bool owned;
    void *col = window_matrix(ctx, s, &g, x, &owned);
    if (!col) return false;
    bool ok = gemm(ctx, s->dev, x->dtype, true, false, K, g.oc, M, col, K, dy->data, g.oc, df->data, g.oc);
    if (owned) exec_cuda_mem_free(s->dev, col);
    return ok;
}

static bool pool_compute(void *state, exec_ctx *ctx) {
    conv_state *s = state;
    graph_conv_geom g;
    static const int floats[] = {0};
    if (!prepare(ctx, s, floats, 1, &g)) return false;
    dg_tensor *x = IN(0);
    dg_tensor *y = gpu_alloc_output(s->dev, ctx, 0, x->dtype, shape4(g.n, g.oh, g.ow, g.c));
    if (!y) return false;
    cuda_window c = to_cuda(&g);
    bool max = strcmp(ctx->node->op->name, "MaxPool") == 0;
    return launched(ctx, s->dev, cuda_launch_pool(x->dtype == DG_FLOAT64, max, &c, x->data, y->data, s->dev->stream));
}

static bool max_pool_grad_compute(void *state, exec_ctx *ctx) {
    conv_state *s = state;
    graph_conv_geom g;
    static const int floats[] = {0, 1, 2};
    if (!prepare(ctx, s, floats, 3, &g)) return false;
    dg_tensor *x = IN(0);
    dg_tensor *dx = gpu_alloc_output(s->dev, ctx, 0, x->dtype, x->shape);
    if (!dx) return false;
    cuda_window c = to_cuda(&g);
    return launched(ctx, s->dev, cuda_launch_max_pool_grad(x->dtype == DG_FLOAT64, &c, x->data, IN(1)->data,
                                                           IN(2)->data, dx->data, s->dev->stream));
}

static bool avg_pool_grad_compute(void *state, exec_ctx *ctx) {
    conv_state *s = state;
    graph_conv_geom g;
    static const int floats[] = {1};
    if (!prepare(ctx, s, floats, 1, &g)) return false;
    dg_tensor *dy = IN(1);
    dg_tensor *dx = gpu_alloc_output(s->dev, ctx, 0, dy->dtype, shape4(g.n, g.h, g.w, g.c));
    if (!dx) return false;
    cuda_window c = to_cuda(&g);
    return launched(ctx, s->dev,
                    cuda_launch_avg_pool_grad(dy->dtype == DG_FLOAT64, &c, dy->data, dx->data, s->dev->stream));
}

// ---- Dropout ----

typedef struct dropout_state {
    exec_cuda_device *dev;   // borrowed; first member
    cpu_dropout_state *cpu;  // the rate and the random stream, as on the CPU
} dropout_state;

static void *dropout_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_node_device(n, st);
    cpu_dropout_state *cpu = dev ? cpu_dropout_create(n, env, st) : NULL;
    dropout_state *s = cpu ? calloc(1, sizeof *s) : NULL;
    if (cpu && !s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "Dropout: out of memory");
        cpu_dropout_destroy(cpu);
        return NULL;
    }
    if (s) {
        s->dev = dev;
        s->cpu = cpu;
    }
    return s;
}

static void dropout_destroy(void *state) {
    dropout_state *s = state;
    cpu_dropout_destroy(s->cpu);
    free(s);
}

static bool dropout_compute(void *state, exec_ctx *ctx) {
    dropout_state *s = state;
    dg_tensor *x = IN(0);
    bool training;
    if (!gpu_prepare_inputs(ctx, s->dev, 1) || !cpu_dropout_training(ctx, &training)) return false;
    dg_tensor *y = gpu_alloc_output(s->dev, ctx, 0, x->dtype, x->shape);
    dg_tensor *m = y ? gpu_alloc_output(s->dev, ctx, 1, x->dtype, x->shape) : NULL;
    if (!m || x->n_elements == 0) return m != NULL;
    void *host = malloc(m->nbytes);
    if (!host) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "%zu bytes for the mask", m->nbytes);
    cpu_dropout_draw(s->cpu, x->dtype, training, host, x->n_elements);
    bool ok = exec_cuda_memcpy_to_device(s->dev, m->data, host, m->nbytes, ctx->st);   // staged: host is free
    free(host);
    if (!ok) return false;
    return launched(ctx, s->dev, cuda_launch_mul_n(x->dtype == DG_FLOAT64, x->data, m->data, y->data,
                                                   x->n_elements, s->dev->stream));
}

#define DT_SIZES (DT_BIT(DG_INT32) | DT_BIT(DG_INT64))

const exec_kernel_def gpu_conv_kernels[] = {
    GPU_KERNEL("Conv2D", DT_FLOATS, conv_create, conv2d_compute, free),
    GPU_KERNEL("Conv2DBackpropInput", DT_SIZES, conv_create, conv2d_bp_input_compute, free),
    GPU_KERNEL("Conv2DBackpropFilter", DT_FLOATS, conv_create, conv2d_bp_filter_compute, free),
    GPU_KERNEL("MaxPool", DT_FLOATS, conv_create, pool_compute, free),
    GPU_KERNEL("MaxPoolGrad", DT_FLOATS, conv_create, max_pool_grad_compute, free),
    GPU_KERNEL("AvgPool", DT_FLOATS, conv_create, pool_compute, free),
    GPU_KERNEL("AvgPoolGrad", DT_SIZES, conv_create, avg_pool_grad_compute, free),
    GPU_KERNEL("Dropout", DT_FLOATS, dropout_create, dropout_compute, dropout_destroy),
};
const int gpu_n_conv_kernels = sizeof gpu_conv_kernels / sizeof gpu_conv_kernels[0];
