/* CPU kernels of the transformer ops (graph/op_defs_transformer.c): BatchMatMulV2 (one GEMM a
 * matrix, cpu_gemm), LayerNorm and its gradient, one pass over each row each way, and the
 * scaled dot-product attention and its gradient, blocked by query rows. Sums run in float64 for float32 tensors too: a
 * row's mean and variance over a width of thousands keep float32's precision that way, and the
 * row is read once more at most. The GPU kernels (executor/cuda/nn.cu) follow the same
 * formulas in the same order. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "exec_kernel_registry_impl.h"

// The softmax loops below call exp or expf on whole rows: glibc's libmvec (2.35 on) has vector
// versions, which <math.h> declares only under -ffast-math. Declared here (this file alone),
// the loops run 8 or 16 lanes at a time; the results may differ from the scalar functions' by
// a few units in the last place.
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
__attribute__((simd("notinbranch"))) float expf(float);
__attribute__((simd("notinbranch"))) double exp(double);
#endif

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

// The row sums below run in CPU_LANES float64 lanes (cpu_impl.h): with one running sum,
// LayerNorm and its gradient took 9% of a GPT step. The order differs from one running sum by
// float64 roundings only.
// One row: its mean and 1 / sqrt(var + eps), the variance from the centred values.
#define LN_FWD_ROWS(NAME, T)                                                                            \
    CPU_CLONES static void NAME(const T *xx, const T *ga, const T *be, T *yy, T *mm, T *rr, int64_t rows, \
                                int64_t C, double eps) {                                                \
        for (int64_t r = 0; r < rows; r++) {                                                            \
            const T *xr = xx + r * C;                                                                   \
            T *yr = yy + r * C;                                                                         \
            double qp[CPU_LANES] = {0}, mu = C ? cpu_sum_##T(xr, C) / (double)C : 0;                    \
            int64_t c = 0;                                                                              \
            for (; c + CPU_LANES <= C; c += CPU_LANES)                                                  \
                for (int j = 0; j < CPU_LANES; j++) {                                                    \
                    double d = (double)xr[c + j] - mu;                                                  \
                    qp[j] += d * d;                                                                     \
                }                                                                                       \
            for (int j = 0; c < C; c++, j++) {                                                          \
                double d = (double)xr[c] - mu;                                                          \
                qp[j] += d * d;                                                                         \
            }                                                                                           \
            double rs = 1 / sqrt((C ? cpu_lanes_total(qp) / (double)C : 0) + eps);                              \
            for (c = 0; c < C; c++) yr[c] = (T)(((double)xr[c] - mu) * rs * (double)ga[c] + (double)be[c]); \
            mm[r] = (T)mu;                                                                              \
            rr[r] = (T)rs;                                                                              \
        }                                                                                               \
    }
LN_FWD_ROWS(ln_fwd_f32, float)
LN_FWD_ROWS(ln_fwd_f64, double)

// dx per row; the rows' terms of dgamma and dbeta added into acc in float64 (2 C doubles: dgamma's,
// then dbeta's).
#define LN_BWD_ROWS(NAME, T)                                                                              \
    CPU_CLONES static void NAME(const T *dyy, const T *xx, const T *ga, const T *mm, const T *rr, T *dxx,   \
                                double *acc, int64_t rows, int64_t C) {                                   \
        for (int64_t r = 0; r < rows; r++) {                                                              \
            const T *dyr = dyy + r * C, *xr = xx + r * C;                                                 \
            T *dxr = dxx + r * C;                                                                         \
            double mu = (double)mm[r], rs = (double)rr[r], sg[CPU_LANES] = {0}, sgx[CPU_LANES] = {0};       \
            int64_t c = 0;                                                                                \
            for (; c + CPU_LANES <= C; c += CPU_LANES)                                                      \
                for (int j = 0; j < CPU_LANES; j++) {                                                      \
                    double xh = ((double)xr[c + j] - mu) * rs, gg = (double)dyr[c + j] * (double)ga[c + j]; \
                    sg[j] += gg;                                                                          \
                    sgx[j] += gg * xh;                                                                    \
                }                                                                                         \
            for (int j = 0; c < C; c++, j++) {                                                            \
                double xh = ((double)xr[c] - mu) * rs, gg = (double)dyr[c] * (double)ga[c];               \
                sg[j] += gg;                                                                              \
                sgx[j] += gg * xh;                                                                        \
            }                                                                                             \
            double mg = C ? cpu_lanes_total(sg) / (double)C : 0, mgx = C ? cpu_lanes_total(sgx) / (double)C : 0;          \
            for (c = 0; c < C; c++) {                                                                     \
                double xh = ((double)xr[c] - mu) * rs, d = (double)dyr[c];                                \
                acc[c] += d * xh;                                                                         \
                acc[C + c] += d;                                                                          \
                dxr[c] = (T)(rs * (d * (double)ga[c] - mg - xh * mgx));                                   \
            }                                                                                             \
        }                                                                                                 \
    }
LN_BWD_ROWS(ln_bwd_f32, float)
LN_BWD_ROWS(ln_bwd_f64, double)

// LayerNorm and its gradient over the intra-op threads (cpu_parallel_for): the forward pass by
// runs of rows; the gradient by chunks of rows, each with its own dgamma and dbeta sums.
#define LN_SPLIT ((int64_t)1 << 15)   // elements below which one thread does it all
#define LN_CHUNKS 64                  // the gradient's chunks, at most
#define LN_MIN_CHUNK 16               // rows of a chunk, at least

typedef struct ln_job {
    bool f32;
    const void *x, *gamma, *beta, *mean_in, *rstd_in, *dy;
    void *y, *mean, *rstd, *dx;
    double *acc;
    int64_t rows, C, chunk_rows, n_chunks;
    double eps;
} ln_job;

// Pieces for `units` runs of work over rows x C elements: 1 when small or on one thread.
static int ln_pieces(int64_t units, int64_t rows, int64_t C) {
    int threads = exec_cpu_threads();
    if (threads < 2 || units < 2 || rows * C < 2 * LN_SPLIT) return 1;
    return units < threads ? (int)units : threads;
}

static void ln_fwd_range(const ln_job *j, int64_t lo, int64_t hi) {
    int64_t o = lo * j->C;
    if (j->f32)
        ln_fwd_f32((const float *)j->x + o, j->gamma, j->beta, (float *)j->y + o, (float *)j->mean + lo,
                   (float *)j->rstd + lo, hi - lo, j->C, j->eps);
    else
        ln_fwd_f64((const double *)j->x + o, j->gamma, j->beta, (double *)j->y + o, (double *)j->mean + lo,
                   (double *)j->rstd + lo, hi - lo, j->C, j->eps);
}

static void ln_fwd_piece(void *ctx, int i, int n) {
    const ln_job *j = ctx;
    int64_t lo, hi;
    cpu_piece_range(j->rows, i, n, &lo, &hi);
    if (lo < hi) ln_fwd_range(j, lo, hi);
}

static void ln_bwd_chunks(const ln_job *j, int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++) {
        int64_t lo = k * j->chunk_rows, hi = lo + j->chunk_rows < j->rows ? lo + j->chunk_rows : j->rows;
        int64_t o = lo * j->C;
        double *acc = j->acc + k * 2 * j->C;
        if (j->f32)
            ln_bwd_f32((const float *)j->dy + o, (const float *)j->x + o, j->gamma, (const float *)j->mean_in + lo,
                       (const float *)j->rstd_in + lo, (float *)j->dx + o, acc, hi - lo, j->C);
        else
            ln_bwd_f64((const double *)j->dy + o, (const double *)j->x + o, j->gamma,
                       (const double *)j->mean_in + lo, (const double *)j->rstd_in + lo, (double *)j->dx + o, acc,
                       hi - lo, j->C);
    }
}

static void ln_bwd_piece(void *ctx, int i, int n) {
    const ln_job *j = ctx;
    int64_t lo, hi;
    cpu_piece_range(j->n_chunks, i, n, &lo, &hi);
    ln_bwd_chunks(j, lo, hi);
}

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
    ln_job j = {.f32 = x->dtype == DG_FLOAT32, .x = x->data, .gamma = gamma->data, .beta = beta->data,
                .y = y->data, .mean = mean->data, .rstd = rstd->data, .rows = rows, .C = C, .eps = eps};
    int n = ln_pieces(rows, rows, C);
    if (n > 1 && cpu_parallel_for(n, ln_fwd_piece, &j)) return true;
    ln_fwd_range(&j, 0, rows);
    return true;
}


static bool layer_norm_grad_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *dy = IN(0), *x = IN(1), *gamma = IN(2), *mean = IN(3), *rstd = IN(4);
    int64_t rows = 0, C = 0;
    if (!cpu_layer_norm_check(ctx, x, gamma, NULL, dy, mean, rstd, &rows, &C)) return false;
    dg_tensor *dx = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    dg_tensor *dgamma = dx ? exec_alloc_output(ctx, 1, x->dtype, dg_shape1(C)) : NULL;
    dg_tensor *dbeta = dgamma ? exec_alloc_output(ctx, 2, x->dtype, dg_shape1(C)) : NULL;
    if (!dbeta) return false;
    // The rows in LN_CHUNKS runs at most, each adding into sums of its own, added up in order:
    // the same bits whatever the number of threads.
    int64_t chunk_rows = rows > LN_CHUNKS * LN_MIN_CHUNK ? (rows + LN_CHUNKS - 1) / LN_CHUNKS : LN_MIN_CHUNK;
    int64_t n_chunks = rows ? (rows + chunk_rows - 1) / chunk_rows : 0;
    double *acc = calloc((size_t)(2 * C * n_chunks + 1), sizeof *acc);
    if (!acc)
        return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "LayerNormGrad: %lld sums", (long long)(2 * C * n_chunks));
    ln_job j = {.f32 = x->dtype == DG_FLOAT32, .x = x->data, .gamma = gamma->data, .mean_in = mean->data,
                .rstd_in = rstd->data, .dy = dy->data, .dx = dx->data, .acc = acc, .rows = rows, .C = C,
                .chunk_rows = chunk_rows, .n_chunks = n_chunks};
    int n = ln_pieces(n_chunks, rows, C);
    if (!(n > 1 && cpu_parallel_for(n, ln_bwd_piece, &j))) ln_bwd_chunks(&j, 0, n_chunks);
    for (int64_t c = 0; c < C; c++) {
        double sg = 0, sb = 0;
        for (int64_t k = 0; k < n_chunks; k++) {
            sg += acc[k * 2 * C + c];
            sb += acc[k * 2 * C + C + c];
        }
        if (j.f32) {
            ((float *)dgamma->data)[c] = (float)sg;
            ((float *)dbeta->data)[c] = (float)sb;
        } else {
            ((double *)dgamma->data)[c] = sg;
            ((double *)dbeta->data)[c] = sb;
        }
    }
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
    bool is16 = dg_dtype_is_float16_family(x->dtype);
    for (int64_t b = 0; b < p.batches; b++) {
        int64_t xo, yo;
        cpu_bmm_offsets(&p, b, &xo, &yo);
        if (is16) {   // sums in float32, each output rounded once (cpu_gemm16)
            if (!cpu_gemm16(x->dtype, s->adj_x, s->adj_y, p.M, p.N, p.K, (const char *)x->data + xo * (int64_t)es,
                            p.lda, (const char *)y->data + yo * (int64_t)es, p.ldb,
                            (char *)o->data + b * p.M * p.N * (int64_t)es, p.N))
                return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "BatchMatMulV2: no memory for a %s product",
                                 dg_dtype_name(x->dtype));
            continue;
        }
        cpu_gemm(x->dtype, s->adj_x, s->adj_y, p.M, p.N, p.K, 1.0, (const char *)x->data + xo * (int64_t)es, p.lda,
                 (const char *)y->data + yo * (int64_t)es, p.ldb, 0.0, (char *)o->data + b * p.M * p.N * (int64_t)es,
                 p.N);
    }
    return true;
}

// ---- ScaledDotProductAttention: blocks of query rows, the scores of one block at a time ----
//
// A block of ATT_ROWS query rows takes three GEMMs forward (scores, then probabilities times
// v) and five backward, all through cpu_gemm, with the block's scores (ATT_ROWS x Tk) as the
// only scratch: the Tq x Tk matrix is never formed. Under the causal mask a block computes the
// keys its last row sees and no more. Softmax sums run in float64.

enum { ATT_ROWS = 64 };

typedef struct att_state {
    bool causal;
    double scale;   // the attribute; 0: 1 / sqrt(D)
} att_state;

static void *att_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    att_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    (void)dg_node_attr_bool(n, "causal", &s->causal);
    (void)dg_node_attr_float(n, "scale", &s->scale);
    return s;
}

// The keys query row i sees: all, or under the causal mask those up to i + Tk - Tq.
static int64_t att_keys_seen(bool causal, int64_t i, int64_t Tq, int64_t Tk) {
    if (!causal) return Tk;
    int64_t lim = i + Tk - Tq + 1;
    return lim < 0 ? 0 : lim > Tk ? Tk : lim;
}

// C = alpha op(A) op(B) + beta C, where an empty inner dimension gives beta C (BLAS refuses
// leading dimensions of 0).
static void att_gemm(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                     int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K > 0) {
        // Dense always: the causal probabilities are half zeros in a pattern the dense GEMM
        // handles better than listing them (gemm_sparse.c), at these sizes.
        cpu_gemm_dense(t, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (beta != 0) return;   // only beta 0 and 1 are used here
    size_t es = dg_dtype_size(t);
    for (int64_t i = 0; i < M; i++) memset((char *)C + i * ldc * (int64_t)es, 0, (size_t)N * es);
}

// Forward: the block's scaled scores s [rb, kend] become probabilities in place; lse per row.
#define ATT_SOFTMAX(T, EXP)                                                                  \
    CPU_CLONES static void att_softmax_##T(T *s, int64_t rb, int64_t kend, int64_t i0, const att_state *a, \
                                int64_t Tq, int64_t Tk, T *lse, bool masked) {               \
        for (int64_t r = 0; r < rb; r++) {                                                   \
            T *sr = s + r * kend;                                                            \
            int64_t lim = att_keys_seen(a->causal, i0 + r, Tq, Tk);                          \
            if (lim > kend) lim = kend;                                                      \
            double m = lim ? (double)cpu_max_##T(sr, lim) : 0;                               \
            if (masked && m == -INFINITY) lim = 0;   /* the mask left the row no key */      \
            for (int64_t j = 0; j < lim; j++) sr[j] = EXP((T)((double)sr[j] - m));           \
            double sum = cpu_sum_##T(sr, lim), inv = lim ? 1 / sum : 0;                      \
            for (int64_t j = 0; j < lim; j++) sr[j] = (T)((double)sr[j] * inv);              \
            for (int64_t j = lim; j < kend; j++) sr[j] = 0;                                  \
            lse[r] = lim ? (T)(m + log(sum)) : (T)-INFINITY;                                 \
        }                                                                                    \
    }
ATT_SOFTMAX(float, expf)
ATT_SOFTMAX(double, exp)

// Backward: s [rb, kend] holds the block's scaled scores, dp [rb, kend] dout v^T; s becomes the
// probabilities (from lse) and dp the scores' gradient, p * (dp - rowsum(dout * out)).
#define ATT_SOFTMAX_GRAD(T, EXP)                                                             \
    CPU_CLONES static void att_softmax_grad_##T(T *s, T *dp, int64_t rb, int64_t kend, int64_t i0,      \
                                     const att_state *a, int64_t Tq, int64_t Tk, const T *lse, \
                                     const T *dout, const T *out, int64_t Dv, bool masked) { \
        for (int64_t r = 0; r < rb; r++) {                                                   \
            T *sr = s + r * kend, *dr = dp + r * kend;                                       \
            int64_t lim = att_keys_seen(a->causal, i0 + r, Tq, Tk);                          \
            if (lim > kend) lim = kend;                                                      \
            double dp8[CPU_LANES] = {0}, l = (double)lse[r];                                  \
            const T *dor = dout + r * Dv, *orow = out + r * Dv;                              \
            int64_t c0 = 0;                                                                  \
            for (; c0 + CPU_LANES <= Dv; c0 += CPU_LANES)                                      \
                for (int c = 0; c < CPU_LANES; c++) dp8[c] += (double)dor[c0 + c] * (double)orow[c0 + c]; \
            for (int c = 0; c0 < Dv; c0++, c++) dp8[c] += (double)dor[c0] * (double)orow[c0]; \
            double di = cpu_lanes_total(dp8);                                                        \
            if (masked && l == -INFINITY) lim = 0;                                           \
            for (int64_t j = 0; j < lim; j++) {                                              \
                double p = (double)EXP((T)((double)sr[j] - l));                              \
                sr[j] = (T)p;                                                                \
                dr[j] = (T)(p * ((double)dr[j] - di));                                       \
            }                                                                                \
            for (int64_t j = lim; j < kend; j++) sr[j] = dr[j] = 0;                          \
        }                                                                                    \
    }
ATT_SOFTMAX_GRAD(float, expf)
ATT_SOFTMAX_GRAD(double, exp)

// The block of query rows [i0, i0 + rb): the keys its last row sees.
static int64_t att_block_keys(const att_state *a, int64_t i0, int64_t rb, int64_t Tq, int64_t Tk) {
    return att_keys_seen(a->causal, i0 + rb - 1, Tq, Tk);
}

// The block's scores [rb, kend] of the pairs the mask leaves out become -inf (batch index b).
static void att_mask_scores(dg_dtype t, void *s, int64_t rb, int64_t kend, int64_t i0, const cpu_attention_dims *d,
                            int64_t b) {
    const uint8_t *mb = d->mask + cpu_attention_mask_base(d, b);
    for (int64_t r = 0; r < rb; r++) {
        const uint8_t *mr = mb + (i0 + r) * d->mask_row;
        for (int64_t j = 0; j < kend; j++)
            if (!mr[j * d->mask_col]) {
                if (t == DG_FLOAT32) ((float *)s)[r * kend + j] = -INFINITY;
                else ((double *)s)[r * kend + j] = -INFINITY;
            }
    }
}

// The attention's (batch, head) matrices are independent: the forward pass and the gradient
// split them over the intra-op threads (cpu_parallel_for), each piece with its own scores.
typedef struct att_job {
    const att_state *a;
    const cpu_attention_dims *d;
    dg_dtype t;
    const dg_tensor *q, *k, *v, *out, *lse, *dout;   // dout NULL: the forward pass
    dg_tensor *o, *l, *dq, *dk, *dv;
    atomic_bool failed;                             // a piece found no memory for its scores
} att_job;

// Matrices [b0, b1) of the forward pass.
static bool att_forward(const att_job *j, int64_t b0, int64_t b1) {
    const att_state *a = j->a;
    cpu_attention_dims d = *j->d;
    dg_dtype t = j->t;
    size_t es = dg_dtype_size(t);
    int64_t br = d.Tq < ATT_ROWS ? d.Tq : ATT_ROWS;
    void *s = malloc((size_t)(br * (d.Tk ? d.Tk : 1)) * es);
    if (!s) return false;
    double scale = cpu_attention_scale(a->scale, d.D);
    for (int64_t b = b0; b < b1; b++) {
        const char *qb = (const char *)j->q->data + b * d.Tq * d.D * (int64_t)es;
        const char *kb = (const char *)j->k->data + b * d.Tk * d.D * (int64_t)es;
        const char *vb = (const char *)j->v->data + b * d.Tk * d.Dv * (int64_t)es;
        char *ob = (char *)j->o->data + b * d.Tq * d.Dv * (int64_t)es;
        char *lb = (char *)j->l->data + b * d.Tq * (int64_t)es;
        for (int64_t i0 = 0; i0 < d.Tq; i0 += br) {
            int64_t rb = d.Tq - i0 < br ? d.Tq - i0 : br, kend = att_block_keys(a, i0, rb, d.Tq, d.Tk);
            att_gemm(t, false, true, rb, kend, d.D, scale, qb + i0 * d.D * (int64_t)es, d.D, kb, d.D, 0, s, kend);
            if (d.mask) att_mask_scores(t, s, rb, kend, i0, &d, b);
            if (t == DG_FLOAT32) att_softmax_float(s, rb, kend, i0, a, d.Tq, d.Tk, (float *)lb + i0, d.mask != NULL);
            else att_softmax_double(s, rb, kend, i0, a, d.Tq, d.Tk, (double *)lb + i0, d.mask != NULL);
            att_gemm(t, false, false, rb, d.Dv, kend, 1, s, kend, vb, d.Dv, 0, ob + i0 * d.Dv * (int64_t)es, d.Dv);
        }
    }
    free(s);
    return true;
}

// Matrices [b0, b1) of the gradient (dk and dv zeroed by the caller).
static bool att_backward(const att_job *j, int64_t b0, int64_t b1) {
    const att_state *a = j->a;
    cpu_attention_dims d = *j->d;
    dg_dtype t = j->t;
    size_t es = dg_dtype_size(t);
    int64_t br = d.Tq < ATT_ROWS ? d.Tq : ATT_ROWS, cols = d.Tk ? d.Tk : 1;
    char *s = malloc(2 * (size_t)(br * cols) * es);
    if (!s) return false;
    char *dp = s + (size_t)(br * cols) * es;
    double scale = cpu_attention_scale(a->scale, d.D);
    for (int64_t b = b0; b < b1; b++) {
        int64_t qo = b * d.Tq * d.D, ko = b * d.Tk * d.D, vo = b * d.Tk * d.Dv, oo = b * d.Tq * d.Dv;
        for (int64_t i0 = 0; i0 < d.Tq; i0 += br) {
            int64_t rb = d.Tq - i0 < br ? d.Tq - i0 : br, kend = att_block_keys(a, i0, rb, d.Tq, d.Tk);
            const char *qi = (const char *)j->q->data + (qo + i0 * d.D) * (int64_t)es;
            const char *doi = (const char *)j->dout->data + (oo + i0 * d.Dv) * (int64_t)es;
            const char *oi = (const char *)j->out->data + (oo + i0 * d.Dv) * (int64_t)es;
            const char *li = (const char *)j->lse->data + (b * d.Tq + i0) * (int64_t)es;
            const char *kb = (const char *)j->k->data + ko * (int64_t)es, *vb = (const char *)j->v->data + vo * (int64_t)es;
            char *dqi = (char *)j->dq->data + (qo + i0 * d.D) * (int64_t)es;
            char *dkb = (char *)j->dk->data + ko * (int64_t)es, *dvb = (char *)j->dv->data + vo * (int64_t)es;
            att_gemm(t, false, true, rb, kend, d.D, scale, qi, d.D, kb, d.D, 0, s, kend);
            if (d.mask) att_mask_scores(t, s, rb, kend, i0, &d, b);
            att_gemm(t, false, true, rb, kend, d.Dv, 1, doi, d.Dv, vb, d.Dv, 0, dp, kend);
            if (t == DG_FLOAT32)
                att_softmax_grad_float((float *)s, (float *)dp, rb, kend, i0, a, d.Tq, d.Tk, (const float *)li,
                                       (const float *)doi, (const float *)oi, d.Dv, d.mask != NULL);
            else
                att_softmax_grad_double((double *)s, (double *)dp, rb, kend, i0, a, d.Tq, d.Tk, (const double *)li,
                                        (const double *)doi, (const double *)oi, d.Dv, d.mask != NULL);
            att_gemm(t, true, false, kend, d.Dv, rb, 1, s, kend, doi, d.Dv, 1, dvb, d.Dv);          // dv += p^T dout
            att_gemm(t, false, false, rb, d.D, kend, scale, dp, kend, kb, d.D, 0, dqi, d.D);         // dq = ds k
            att_gemm(t, true, false, kend, d.D, rb, scale, dp, kend, qi, d.D, 1, dkb, d.D);           // dk += ds^T q
        }
    }
    free(s);
    return true;
}

static void att_piece(void *ctx, int i, int n) {
    att_job *j = ctx;
    int64_t B = j->d->batches, b0 = B * i / n, b1 = B * (i + 1) / n;
    if (b0 < b1 && !(j->dout ? att_backward(j, b0, b1) : att_forward(j, b0, b1))) atomic_store(&j->failed, true);
}

// Runs the job over all its matrices: in pieces on the intra-op threads when there are several
// matrices, on this thread otherwise (or when the pool is busy).
static bool att_run(att_job *j) {
    int64_t B = j->d->batches;
    int n = exec_cpu_threads();
    if (n > B) n = (int)B;
    if (n > 1 && cpu_parallel_for(n, att_piece, j)) return !atomic_load(&j->failed);
    return j->dout ? att_backward(j, 0, B) : att_forward(j, 0, B);
}

static bool attention_compute(void *state, exec_ctx *ctx) {
    const att_state *a = state;
    dg_tensor *q = IN(0), *k = IN(1), *v = IN(2), *mask = ctx->n_inputs > 3 ? IN(3) : NULL;
    cpu_attention_dims d;
    if (!cpu_attention_check(ctx, q, k, v, mask, NULL, NULL, NULL, &d)) return false;
    dg_tensor *out = exec_alloc_output(ctx, 0, q->dtype, d.out);
    dg_tensor *lse = out ? exec_alloc_output(ctx, 1, q->dtype, d.lse) : NULL;
    if (!lse) return false;
    if (d.batches == 0 || d.Tq == 0) return true;
    att_job j = {a, &d, q->dtype, q, k, v, NULL, NULL, NULL, out, lse, NULL, NULL, NULL, false};
    if (!att_run(&j))
        return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "attention: no memory for the scores of %lld keys", (long long)d.Tk);
    return true;
}

static bool attention_grad_compute(void *state, exec_ctx *ctx) {
    const att_state *a = state;
    dg_tensor *dout = IN(0), *q = IN(1), *k = IN(2), *v = IN(3), *out = IN(4), *lse = IN(5);
    dg_tensor *mask = ctx->n_inputs > 6 ? IN(6) : NULL;
    cpu_attention_dims d;
    if (!cpu_attention_check(ctx, q, k, v, mask, dout, out, lse, &d)) return false;
    dg_tensor *dq = exec_alloc_output(ctx, 0, q->dtype, q->shape);
    dg_tensor *dk = dq ? exec_alloc_output(ctx, 1, q->dtype, k->shape) : NULL;
    dg_tensor *dv = dk ? exec_alloc_output(ctx, 2, q->dtype, v->shape) : NULL;
    if (!dv) return false;
    memset(dk->data, 0, dk->nbytes);   // sums over the blocks of query rows
    memset(dv->data, 0, dv->nbytes);
    if (d.batches == 0 || d.Tq == 0) return true;
    att_job j = {a, &d, q->dtype, q, k, v, out, lse, dout, NULL, NULL, dq, dk, dv, false};
    if (!att_run(&j))
        return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "attention gradient: no memory for 2 x %lld scores a row",
                         (long long)d.Tk);
    return true;
}

#define K(op, create, compute, destroy) \
    {op, "CPU", DT_FLOATS, create, compute, destroy, true, false, false, NULL, false}

static const exec_kernel_def transformer_kernels[] = {
    {"BatchMatMulV2", "CPU", DT_FLOATS | DT_FLOAT16S, bmm_create, batch_matmul_compute, free, true, false, false, NULL, false},
    K("LayerNorm", ln_create, layer_norm_compute, free),
    K("LayerNormGrad", cpu_no_state, layer_norm_grad_compute, NULL),
    K("ScaledDotProductAttention", att_create, attention_compute, free),
    K("ScaledDotProductAttentionGrad", att_create, attention_grad_compute, free),
};

void cpu_register_transformer_kernels(void) {
    exec_register_kernels(transformer_kernels,
                          (int)(sizeof transformer_kernels / sizeof transformer_kernels[0]));
}
