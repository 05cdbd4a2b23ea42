/* GPU kernels of the transformer ops: BatchMatMulV2 (cuBLAS, a GEMM a matrix), LayerNorm and
 * LayerNormGrad, ScaledDotProductAttention and its gradient. Each checks its inputs as the CPU
 * kernel does (executor/cpu/kernels_transformer.c) and queues the work through the launchers of
 * nn.cu and attention.cu. */
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "gpu_impl.h"
#include "launch_attention.h"
#include "launch_nn.h"

typedef struct ln_state {
    exec_cuda_device *dev;   // borrowed; first member (gpu_impl.h)
    double eps;
} ln_state;

static void *ln_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    ln_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s kernel: %zu bytes", n->op->name, sizeof *s);
        return NULL;
    }
    s->dev = dev;
    s->eps = 1e-5;
    (void)dg_node_attr_float(n, "epsilon", &s->eps);
    return s;
}

// ---- BatchMatMulV2: one cuBLAS GEMM per output matrix, on the device's stream ----

typedef struct bmm_state {
    exec_cuda_device *dev;   // borrowed; first member (gpu_impl.h)
    bool adj_x, adj_y;
} bmm_state;

static void *bmm_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    bmm_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s kernel: %zu bytes", n->op->name, sizeof *s);
        return NULL;
    }
    s->dev = dev;
    (void)dg_node_attr_bool(n, "adj_x", &s->adj_x);
    (void)dg_node_attr_bool(n, "adj_y", &s->adj_y);
    return s;
}

static bool batch_matmul_compute(void *state, exec_ctx *ctx) {
    bmm_state *s = state;
    exec_cuda_device *dev = s->dev;
    if (!gpu_prepare_inputs(ctx, dev, 2)) return false;
    dg_tensor *x = IN(0), *y = IN(1);
    cpu_bmm_plan p;
    if (!cpu_bmm_plan_make(ctx, x, y, s->adj_x, s->adj_y, &p)) return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, x->dtype, p.out);
    if (!o) return false;
    if (o->n_elements == 0) return true;
    if (p.K == 0)   // empty sums: zeros, as the CPU kernel gives
        return gpu_check_launch(ctx, dev, cudaMemsetAsync(o->data, 0, o->nbytes, dev->stream), "cudaMemsetAsync");
    for (int64_t b = 0; b < p.batches; b++) {
        int64_t xo, yo, oo = b * p.M * p.N;
        cpu_bmm_offsets(&p, b, &xo, &yo);
        size_t es = dg_dtype_size(x->dtype);
        bool ok = gpu_gemm(ctx, dev, x->dtype, s->adj_x, s->adj_y, p.M, p.N, p.K, (const char *)x->data + xo * es,
                           p.lda, (const char *)y->data + yo * es, p.ldb, (char *)o->data + oo * es, p.N);
        if (!ok) {
            dg_status_prepend(ctx->st, "BatchMatMulV2, matrix %lld of %lld", (long long)b, (long long)p.batches);
            return false;
        }
    }
    return true;
}

// ---- LayerNorm ----

static bool layer_norm_compute(void *state, exec_ctx *ctx) {
    ln_state *s = state;
    if (!gpu_prepare_inputs(ctx, s->dev, 3)) return false;
    dg_tensor *x = IN(0), *gamma = IN(1), *beta = IN(2);
    int64_t rows = 0, C = 0;
    if (!cpu_layer_norm_check(ctx, x, gamma, beta, NULL, NULL, NULL, &rows, &C)) return false;
    dg_shape rs = x->shape;
    rs.rank--;
    dg_tensor *y = gpu_alloc_output(s->dev, ctx, 0, x->dtype, x->shape);
    dg_tensor *mean = y ? gpu_alloc_output(s->dev, ctx, 1, x->dtype, rs) : NULL;
    dg_tensor *rstd = mean ? gpu_alloc_output(s->dev, ctx, 2, x->dtype, rs) : NULL;
    if (!rstd) return false;
    cudaError_t err = cuda_launch_layer_norm(x->dtype == DG_FLOAT64, x->data, gamma->data, beta->data, y->data,
                                             mean->data, rstd->data, rows, C, s->eps, s->dev->stream);
    return gpu_check_launch(ctx, s->dev, err, "LayerNorm");
}

static bool layer_norm_grad_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    if (!gpu_prepare_inputs(ctx, dev, 5)) return false;
    dg_tensor *dy = IN(0), *x = IN(1), *gamma = IN(2), *mean = IN(3), *rstd = IN(4);
    int64_t rows = 0, C = 0;
    if (!cpu_layer_norm_check(ctx, x, gamma, NULL, dy, mean, rstd, &rows, &C)) return false;
    dg_tensor *dx = gpu_alloc_output(dev, ctx, 0, x->dtype, x->shape);
    dg_tensor *dgamma = dx ? gpu_alloc_output(dev, ctx, 1, x->dtype, dg_shape1(C)) : NULL;
    dg_tensor *dbeta = dgamma ? gpu_alloc_output(dev, ctx, 2, x->dtype, dg_shape1(C)) : NULL;
    if (!dbeta) return false;
    cudaError_t err =
        cuda_launch_layer_norm_grad(x->dtype == DG_FLOAT64, dy->data, x->data, gamma->data, mean->data, rstd->data,
                                    dx->data, dgamma->data, dbeta->data, rows, C, dev->stream);
    return gpu_check_launch(ctx, dev, err, "LayerNormGrad");
}

// ---- ScaledDotProductAttention: tiled kernels, the scores never in memory ----

typedef struct att_state {
    exec_cuda_device *dev;   // borrowed; first member (gpu_impl.h)
    bool causal;
    double scale;            // the attribute; 0: 1 / sqrt(D)
} att_state;

static void *att_create(const dg_node *n, const exec_env *env, dg_status *st) {
    if (n->n_inputs > (strcmp(n->op->name, "ScaledDotProductAttention") == 0 ? 3 : 6)) {
        dg_status_setf(st, DG_UNIMPLEMENTED, "%s: the attention with a mask has no GPU kernel yet; place it on a CPU",
                       n->op->name);
        return NULL;
    }
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    att_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s kernel: %zu bytes", n->op->name, sizeof *s);
        return NULL;
    }
    s->dev = dev;
    (void)dg_node_attr_bool(n, "causal", &s->causal);
    (void)dg_node_attr_float(n, "scale", &s->scale);
    return s;
}

static bool att_fits(exec_ctx *ctx, const dg_tensor *q, const cpu_attention_dims *d) {
    if (cuda_attention_fits(q->dtype == DG_FLOAT64, d->D, d->Dv)) return true;
    return exec_fail(ctx, DG_UNIMPLEMENTED, "the GPU attention kernel holds a row of widths D %lld + Dv %lld of %s "
                     "in shared memory, more than fits: place this op on the CPU", (long long)d->D, (long long)d->Dv,
                     dg_dtype_name(q->dtype));
}

static bool attention_compute(void *state, exec_ctx *ctx) {
    att_state *s = state;
    if (!gpu_prepare_inputs(ctx, s->dev, 3)) return false;
    dg_tensor *q = IN(0), *k = IN(1), *v = IN(2);
    cpu_attention_dims d;
    if (!cpu_attention_check(ctx, q, k, v, NULL, NULL, NULL, NULL, &d) || !att_fits(ctx, q, &d)) return false;
    dg_tensor *out = gpu_alloc_output(s->dev, ctx, 0, q->dtype, d.out);
    dg_tensor *lse = out ? gpu_alloc_output(s->dev, ctx, 1, q->dtype, d.lse) : NULL;
    if (!lse) return false;
    cudaError_t err = cuda_launch_attention(q->dtype == DG_FLOAT64, q->data, k->data, v->data, out->data, lse->data,
                                            d.batches, d.Tq, d.Tk, d.D, d.Dv, cpu_attention_scale(s->scale, d.D),
                                            s->causal, s->dev->stream);
    return gpu_check_launch(ctx, s->dev, err, "ScaledDotProductAttention");
}

static bool attention_grad_compute(void *state, exec_ctx *ctx) {
    att_state *s = state;
    if (!gpu_prepare_inputs(ctx, s->dev, 6)) return false;
    dg_tensor *dout = IN(0), *q = IN(1), *k = IN(2), *v = IN(3), *out = IN(4), *lse = IN(5);
    cpu_attention_dims d;
    if (!cpu_attention_check(ctx, q, k, v, NULL, dout, out, lse, &d) || !att_fits(ctx, q, &d)) return false;
    dg_tensor *dq = gpu_alloc_output(s->dev, ctx, 0, q->dtype, q->shape);
    dg_tensor *dk = dq ? gpu_alloc_output(s->dev, ctx, 1, q->dtype, k->shape) : NULL;
    dg_tensor *dv = dk ? gpu_alloc_output(s->dev, ctx, 2, q->dtype, v->shape) : NULL;
    if (!dv) return false;
    cudaError_t err = cuda_launch_attention_grad(q->dtype == DG_FLOAT64, dout->data, q->data, k->data, v->data,
                                                 out->data, lse->data, dq->data, dk->data, dv->data, d.batches, d.Tq,
                                                 d.Tk, d.D, d.Dv, cpu_attention_scale(s->scale, d.D), s->causal,
                                                 s->dev->stream);
    return gpu_check_launch(ctx, s->dev, err, "ScaledDotProductAttentionGrad");
}

const exec_kernel_def gpu_transformer_kernels[] = {
    GPU_KERNEL("BatchMatMulV2", DT_FLOATS | DT_FLOAT16S, bmm_create, batch_matmul_compute, free),
    GPU_KERNEL("LayerNorm", DT_FLOATS, ln_create, layer_norm_compute, free),
    GPU_KERNEL("LayerNormGrad", DT_FLOATS, gpu_dev_create, layer_norm_grad_compute, NULL),
    GPU_KERNEL("ScaledDotProductAttention", DT_FLOATS, att_create, attention_compute, free),
    GPU_KERNEL("ScaledDotProductAttentionGrad", DT_FLOATS, att_create, attention_grad_compute, free),
};
const int gpu_n_transformer_kernels = sizeof gpu_transformer_kernels / sizeof gpu_transformer_kernels[0];
