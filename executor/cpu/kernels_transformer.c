/* CPU kernels of the transformer ops (graph/op_defs_transformer.c): BatchMatMulV2 (one GEMM a
 * matrix, cpu_gemm), LayerNorm and its gradient, one pass over each row each way. Sums run in float64 for float32 tensors too: a
 * row's mean and variance over a width of thousands keep float32's precision that way, and the
 * row is read once more at most. The GPU kernels (executor/cuda/nn.cu) follow the same
 * formulas in the same order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

typedef struct ln_state {
    double eps;
} ln_state;

static void *ln_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    ln_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    s->eps = 1e-5;
    (void)dg_node_attr_float(n, "epsilon", &s->eps);
    return s;
}

// One row: its mean and 1 / sqrt(var + eps), the variance from the centred values.
#define LN_FWD(T)                                                                          \
    do {                                                                                   \
        const T *xx = x->data, *ga = gamma->data, *be = beta->data;                        \
        T *yy = y->data, *mm = mean->data, *rr = rstd->data;                               \
        for (int64_t r = 0; r < rows; r++) {                                               \
            const T *xr = xx + r * C;                                                      \
            T *yr = yy + r * C;                                                            \
            double s = 0, q = 0;                                                           \
            for (int64_t c = 0; c < C; c++) s += (double)xr[c];                            \
            double mu = C ? s / (double)C : 0;                                             \
            for (int64_t c = 0; c < C; c++) {                                              \
                double d = (double)xr[c] - mu;                                             \
                q += d * d;                                                                \
            }                                                                              \
            double rs = 1 / sqrt((C ? q / (double)C : 0) + eps);                           \
            for (int64_t c = 0; c < C; c++)                                                \
                yr[c] = (T)(((double)xr[c] - mu) * rs * (double)ga[c] + (double)be[c]);    \
            mm[r] = (T)mu;                                                                 \
            rr[r] = (T)rs;                                                                 \
        }                                                                                  \
    } while (0)

static bool layer_norm_compute(void *state, exec_ctx *ctx) {
    double eps = ((ln_state *)state)->eps;
    dg_tensor *x = IN(0), *gamma = IN(1), *beta = IN(2);
    int64_t rows = 0, C = 0;
    if (!cpu_layer_norm_check(ctx, x, gamma, beta, NULL, NULL, NULL, &rows, &C)) return false;
    dg_shape rs = x->shape;
    rs.rank--;
    dg_tensor *y = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    dg_tensor *mean = y ? exec_alloc_output(ctx, 1, x->dtype, rs) : NULL;
    dg_tensor *rstd = mean ? exec_alloc_output(ctx, 2, x->dtype, rs) : NULL;
    if (!rstd) return false;
    if (x->dtype == DG_FLOAT32) LN_FWD(float);
    else LN_FWD(double);
    return true;
}

// dx per row; dgamma and dbeta summed over the rows in float64 (acc: 2 C doubles).
#define LN_BWD(T)                                                                          \
    do {                                                                                   \
        const T *dyy = dy->data, *xx = x->data, *ga = gamma->data, *mm = mean->data,       \
                *rr = rstd->data;                                                          \
        T *dxx = dx->data;                                                                 \
        for (int64_t r = 0; r < rows; r++) {                                               \
            const T *dyr = dyy + r * C, *xr = xx + r * C;                                  \
            T *dxr = dxx + r * C;                                                          \
            double mu = (double)mm[r], rs = (double)rr[r], sg = 0, sgx = 0;                \
            for (int64_t c = 0; c < C; c++) {                                              \
                double xh = ((double)xr[c] - mu) * rs, gg = (double)dyr[c] * (double)ga[c]; \
                sg += gg;                                                                  \
                sgx += gg * xh;                                                            \
                acc[c] += (double)dyr[c] * xh;                                             \
                acc[C + c] += (double)dyr[c];                                              \
            }                                                                              \
            double mg = C ? sg / (double)C : 0, mgx = C ? sgx / (double)C : 0;             \
            for (int64_t c = 0; c < C; c++) {                                              \
                double xh = ((double)xr[c] - mu) * rs, gg = (double)dyr[c] * (double)ga[c]; \
                dxr[c] = (T)(rs * (gg - mg - xh * mgx));                                   \
            }                                                                              \
        }                                                                                  \
        T *dgg = dgamma->data, *dbb = dbeta->data;                                         \
        for (int64_t c = 0; c < C; c++) {                                                  \
            dgg[c] = (T)acc[c];                                                            \
            dbb[c] = (T)acc[C + c];                                                        \
        }                                                                                  \
    } while (0)

static bool layer_norm_grad_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *dy = IN(0), *x = IN(1), *gamma = IN(2), *mean = IN(3), *rstd = IN(4);
    int64_t rows = 0, C = 0;
    if (!cpu_layer_norm_check(ctx, x, gamma, NULL, dy, mean, rstd, &rows, &C)) return false;
    dg_tensor *dx = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    dg_tensor *dgamma = dx ? exec_alloc_output(ctx, 1, x->dtype, dg_shape1(C)) : NULL;
    dg_tensor *dbeta = dgamma ? exec_alloc_output(ctx, 2, x->dtype, dg_shape1(C)) : NULL;
    if (!dbeta) return false;
    double *acc = calloc((size_t)(2 * C + 1), sizeof *acc);
    if (!acc) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "LayerNormGrad: %lld sums", (long long)(2 * C));
    if (x->dtype == DG_FLOAT32) LN_BWD(float);
    else LN_BWD(double);
    free(acc);
    return true;
}

// ---- BatchMatMulV2: one GEMM per output matrix ----

typedef struct bmm_state {
    bool adj_x, adj_y;
} bmm_state;

static void *bmm_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    bmm_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    (void)dg_node_attr_bool(n, "adj_x", &s->adj_x);
    (void)dg_node_attr_bool(n, "adj_y", &s->adj_y);
    return s;
}

static bool batch_matmul_compute(void *state, exec_ctx *ctx) {
    bmm_state *s = state;
    dg_tensor *x = IN(0), *y = IN(1);
    cpu_bmm_plan p;
    if (!cpu_bmm_plan_make(ctx, x, y, s->adj_x, s->adj_y, &p)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, p.out);
    if (!o) return false;
    if (o->n_elements == 0) return true;
    size_t es = dg_dtype_size(x->dtype);
    if (p.K == 0) {
        memset(o->data, 0, o->nbytes);
        return true;
    }
    for (int64_t b = 0; b < p.batches; b++) {
        int64_t xo, yo;
        cpu_bmm_offsets(&p, b, &xo, &yo);
        cpu_gemm(x->dtype, s->adj_x, s->adj_y, p.M, p.N, p.K, 1.0, (const char *)x->data + xo * (int64_t)es, p.lda,
                 (const char *)y->data + yo * (int64_t)es, p.ldb, 0.0, (char *)o->data + b * p.M * p.N * (int64_t)es,
                 p.N);
    }
    return true;
}

#define K(op, create, compute, destroy) \
    {op, "CPU", DT_FLOATS, create, compute, destroy, true, false, false, NULL, false}

static const exec_kernel_def transformer_kernels[] = {
    K("BatchMatMulV2", bmm_create, batch_matmul_compute, free),
    K("LayerNorm", ln_create, layer_norm_compute, free),
    K("LayerNormGrad", cpu_no_state, layer_norm_grad_compute, NULL),
};

void cpu_register_transformer_kernels(void) {
    exec_register_kernels(transformer_kernels,
                          (int)(sizeof transformer_kernels / sizeof transformer_kernels[0]));
}
