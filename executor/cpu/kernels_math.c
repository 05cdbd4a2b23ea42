/* CPU kernels for MatMul, elementwise ops with broadcasting, activations and their
 * gradients, BiasAdd, AddN, ClipByValue, Cast and comparisons. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"

// ---- MatMul ----
typedef struct matmul_state {
    bool ta, tb;
} matmul_state;

static void *matmul_create(const dg_node *n, const exec_env *env, dg_status *st) {
    matmul_state *m = calloc(1, sizeof *m);
    if (!m) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    dg_node_attr_bool(n, "transpose_a", &m->ta);
    dg_node_attr_bool(n, "transpose_b", &m->tb);
    return m;
}

static bool matmul_compute(void *state, exec_ctx *ctx) {
    matmul_state *m = state;
    dg_tensor *a = IN(0), *b = IN(1);
    int64_t M, N, K;
    if (!cpu_matmul_dims(ctx, a, b, m->ta, m->tb, &M, &N, &K)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, a->dtype, dg_shape2(M, N));
    if (!o) return false;
    if (M == 0 || N == 0) return true;
    if (K == 0) {
        memset(o->data, 0, o->nbytes);
        return true;
    }
    if (dg_dtype_is_float16_family(a->dtype)) {
        if (!cpu_gemm16(a->dtype, m->ta, m->tb, M, N, K, a->data, a->shape.dims[1], b->data, b->shape.dims[1],
                        o->data, N))
            return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "out of memory for a %s product", dg_dtype_name(a->dtype));
        return true;
    }
    cpu_gemm(a->dtype, m->ta, m->tb, M, N, K, 1.0, a->data, a->shape.dims[1], b->data, b->shape.dims[1], 0.0,
             o->data, N);
    return true;
}

// ---- binary elementwise ops with broadcasting ----
typedef enum binop {
    B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN,
    B_EQ, B_GT, B_GE, B_LT, B_LE,
    B_RELU_GRAD, B_SIGMOID_GRAD, B_TANH_GRAD, B_SQRT_GRAD, B_POW,
    B_SOFTMAX_GRAD_UNUSED, B_RSQRT_GRAD, B_GELU_GRAD, B_GELU_TANH_GRAD,
} binop;

static bool is_compare(binop op) { return op >= B_EQ && op <= B_LE; }

#define BIN_EXPR(op, x, y)                                                \
    ((op) == B_ADD ? (x) + (y) : (op) == B_SUB ? (x) - (y)                \
     : (op) == B_MUL ? (x) * (y) : (op) == B_DIV ? (x) / (y)              \
     : (op) == B_MAX ? ((x) >= (y) ? (x) : (y)) : ((x) <= (y) ? (x) : (y)))

#define CMP_EXPR(op, x, y)                                                \
    ((op) == B_EQ ? (x) == (y) : (op) == B_GT ? (x) > (y)                 \
     : (op) == B_GE ? (x) >= (y) : (op) == B_LT ? (x) < (y) : (x) <= (y))


// One run of n outputs; a and b advance by sa and sb (0 or 1).
#define DEFINE_RUN(T, NAME)                                                                 \
    CPU_CLONES static void NAME(binop op, const T *a, int64_t sa, const T *b, int64_t sb, void *out,  \
                     int64_t n) {                                                           \
        if (is_compare(op)) {                                                               \
            uint8_t *o = out;                                                               \
            for (int64_t i = 0; i < n; i++) o[i] = CMP_EXPR(op, a[i * sa], b[i * sb]);      \
            return;                                                                         \
        }                                                                                   \
        T *o = out;                                                                         \
        if (sa == 1 && sb == 1) {                                                           \
            switch (op) {                                                                   \
            case B_ADD: { for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i]; } return;         \
            case B_SUB: { for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i]; } return;         \
            case B_MUL: { for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i]; } return;         \
            case B_DIV: { for (int64_t i = 0; i < n; i++) o[i] = a[i] / b[i]; } return;         \
            case B_RELU_GRAD: /* (dy, y) */                                                 \
                { for (int64_t i = 0; i < n; i++) o[i] = b[i] > 0 ? a[i] : 0; } return;         \
            case B_SIGMOID_GRAD: /* (y, dy) */                                              \
                { for (int64_t i = 0; i < n; i++) o[i] = b[i] * a[i] * (1 - a[i]); } return;    \
            case B_TANH_GRAD:                                                               \
                { for (int64_t i = 0; i < n; i++) o[i] = b[i] * (1 - a[i] * a[i]); } return;    \
            case B_SQRT_GRAD:                                                               \
                { for (int64_t i = 0; i < n; i++) o[i] = b[i] * (T)0.5 / a[i]; } return;        \
            case B_RSQRT_GRAD: /* (y, dy): dy * -0.5 * y^3 */                                \
                { for (int64_t i = 0; i < n; i++) o[i] = b[i] * (T)-0.5 * (a[i] * a[i] * a[i]); } return; \
            default: break;                                                                 \
            }                                                                               \
        }                                                                                   \
        if (sa + sb == 1) {  /* one side a scalar: the common arithmetic as vector loops */ \
            T v = sa ? b[0] : a[0];                                                         \
            const T *w = sa ? a : b;                                                        \
            switch (op) {                                                                   \
            case B_ADD: { for (int64_t i = 0; i < n; i++) o[i] = w[i] + v; } return;            \
            case B_MUL: { for (int64_t i = 0; i < n; i++) o[i] = w[i] * v; } return;            \
            case B_SUB:                                                                     \
                if (sa) { for (int64_t i = 0; i < n; i++) o[i] = w[i] - v; }                    \
                else { for (int64_t i = 0; i < n; i++) o[i] = v - w[i]; }                       \
                return;                                                                     \
            case B_DIV:                                                                     \
                if (sa) { for (int64_t i = 0; i < n; i++) o[i] = w[i] / v; }                    \
                else { for (int64_t i = 0; i < n; i++) o[i] = v / w[i]; }                       \
                return;                                                                     \
            default: break;                                                                 \
            }                                                                               \
        }                                                                                   \
        if (op == B_POW) {   /* float32 through double: within half an ulp of the true power */ \
            for (int64_t i = 0; i < n; i++) o[i] = (T)pow((double)a[i * sa], (double)b[i * sb]); \
            return;                                                                         \
        }                                                                                   \
        for (int64_t i = 0; i < n; i++) o[i] = BIN_EXPR(op, a[i * sa], b[i * sb]);          \
    }
DEFINE_RUN(float, run_f32)
DEFINE_RUN(double, run_f64)
DEFINE_RUN(int32_t, run_i32)
DEFINE_RUN(int64_t, run_i64)

// Gelu (a: x, b NULL) and GeluGrad (a: dy, b: x), float only (gelu.c): large tensors in pieces
// over the intra-op threads (cpu_parallel_for), each a run of whole 16s.
#define GELU_SPLIT ((int64_t)1 << 15)

typedef struct gelu_job {
    dg_dtype t;
    bool tanh_form;
    const char *a, *b;
    char *out;
    int64_t n;
} gelu_job;

static void gelu_range(const gelu_job *j, int64_t lo, int64_t hi) {
    size_t es = dg_dtype_size(j->t);
    const char *a = j->a + lo * (int64_t)es, *b = j->b ? j->b + lo * (int64_t)es : NULL;
    char *o = j->out + lo * (int64_t)es;
    int64_t n = hi - lo;
    if (j->t == DG_FLOAT32) {
        if (b) cpu_gelu_grad_f32((const float *)a, (const float *)b, (float *)o, n, j->tanh_form);
        else cpu_gelu_f32((const float *)a, (float *)o, n, j->tanh_form);
    } else if (j->t == DG_FLOAT64) {
        if (b) cpu_gelu_grad_f64((const double *)a, (const double *)b, (double *)o, n, j->tanh_form);
        else cpu_gelu_f64((const double *)a, (double *)o, n, j->tanh_form);
    }
}

static void gelu_piece(void *ctx, int i, int n) {
    const gelu_job *j = ctx;
    int64_t lo, hi;
    cpu_piece_range(j->n, i, n, &lo, &hi);
    if (lo < hi) gelu_range(j, lo, hi);
}

static void gelu_run(dg_dtype t, bool tanh_form, const char *a, const char *b, char *out, int64_t n) {
    gelu_job j = {t, tanh_form, a, b, out, n};
    int threads = exec_cpu_threads();
    if (n >= 2 * GELU_SPLIT && threads > 1) {
        int64_t by_size = n / GELU_SPLIT;
        int pieces = by_size < threads ? (int)by_size : threads;
        if (cpu_parallel_for(pieces, gelu_piece, &j)) return;
    }
    gelu_range(&j, 0, n);
}

static void run_any(dg_dtype t, binop op, const char *a, int64_t sa, const char *b, int64_t sb,
                    char *out, int64_t n) {
    // GeluGrad (dy, x): same shapes, float only (gelu.c).
    if (op == B_GELU_GRAD || op == B_GELU_TANH_GRAD) {
        gelu_run(t, op == B_GELU_TANH_GRAD, a, b, out, n);
        return;
    }
    switch (t) {
    case DG_FLOAT32: run_f32(op, (const float *)a, sa, (const float *)b, sb, out, n); break;
    case DG_FLOAT64: run_f64(op, (const double *)a, sa, (const double *)b, sb, out, n); break;
    case DG_INT32: run_i32(op, (const int32_t *)a, sa, (const int32_t *)b, sb, out, n); break;
    case DG_INT64: run_i64(op, (const int64_t *)a, sa, (const int64_t *)b, sb, out, n); break;
    default: break;
    }
}

typedef struct bin_state {
    binop op;
} bin_state;

static binop binop_of(const char *name) {
    static const struct { const char *n; binop op; } map[] = {
        {"Add", B_ADD}, {"Sub", B_SUB}, {"Mul", B_MUL}, {"Div", B_DIV}, {"Maximum", B_MAX},
        {"Minimum", B_MIN}, {"Equal", B_EQ}, {"Greater", B_GT}, {"GreaterEqual", B_GE},
        {"Less", B_LT}, {"LessEqual", B_LE}, {"ReluGrad", B_RELU_GRAD},
        {"SigmoidGrad", B_SIGMOID_GRAD}, {"TanhGrad", B_TANH_GRAD}, {"SqrtGrad", B_SQRT_GRAD}, {"Pow", B_POW},
        {"RsqrtGrad", B_RSQRT_GRAD}, {"GeluGrad", B_GELU_GRAD}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].n, name) == 0) return map[i].op;
    return B_ADD;
}

static void *bin_create(const dg_node *n, const exec_env *env, dg_status *st) {
    bin_state *b = calloc(1, sizeof *b);
    if (!b) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    b->op = binop_of(n->op->name);
    bool approximate = false;
    if (b->op == B_GELU_GRAD && dg_node_attr_bool(n, "approximate", &approximate) && approximate)
        b->op = B_GELU_TANH_GRAD;
    return b;
}

static bool bin_compute(void *state, exec_ctx *ctx) {
    binop op = ((bin_state *)state)->op;
    dg_tensor *a = IN(0), *b = IN(1);
    dg_shape os;
    if (dg_shape_equal(&a->shape, &b->shape)) {
        os = a->shape;
    } else if (!graph_broadcast_shapes(a->shape, b->shape, &os, ctx->st)) {
        return false;
    }
    if ((a->dtype == DG_INT32 || a->dtype == DG_INT64) && op == B_DIV) {
        for (int64_t i = 0; i < b->n_elements; i++)
            if (dg_tensor_get_as_double(b, i) == 0)
                return exec_fail(ctx, DG_INVALID_ARGUMENT, "integer division by zero");
    }
    dg_dtype ot = is_compare(op) ? DG_BOOL : a->dtype;
    dg_tensor *o = exec_alloc_output(ctx, 0, ot, os);
    if (!o) return false;
    size_t es = dg_dtype_size(a->dtype), eo = dg_dtype_size(ot);
    int64_t n = o->n_elements;
    if (n == 0) return true;
    if (a->n_elements == n && b->n_elements == n) {
        run_any(a->dtype, op, a->data, 1, b->data, 1, o->data, n);
        return true;
    }
    if (b->n_elements == 1 && a->n_elements == n) {
        run_any(a->dtype, op, a->data, 1, b->data, 0, o->data, n);
        return true;
    }
    if (a->n_elements == 1 && b->n_elements == n) {
        run_any(a->dtype, op, a->data, 0, b->data, 1, o->data, n);
        return true;
    }
    // General case: loop over rows of the last output dimension.
    int r = os.rank;
    int64_t sa[DG_MAX_RANK], sb[DG_MAX_RANK], ta[DG_MAX_RANK], tb[DG_MAX_RANK];
    cpu_strides(&a->shape, ta);
    cpu_strides(&b->shape, tb);
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->shape.rank), ib = i - (r - b->shape.rank);
        sa[i] = ia >= 0 && a->shape.dims[ia] != 1 ? ta[ia] : 0;
        sb[i] = ib >= 0 && b->shape.dims[ib] != 1 ? tb[ib] : 0;
    }
    int64_t inner = os.dims[r - 1], rows = n / inner;
    int64_t idx[DG_MAX_RANK] = {0}, oa = 0, ob = 0;
    for (int64_t row = 0; row < rows; row++) {
        run_any(a->dtype, op, (const char *)a->data + oa * (int64_t)es, sa[r - 1] ? 1 : 0,
                (const char *)b->data + ob * (int64_t)es, sb[r - 1] ? 1 : 0,
                (char *)o->data + row * inner * (int64_t)eo, inner);
        for (int k = r - 2; k >= 0; k--) {
            if (++idx[k] < os.dims[k]) {
                oa += sa[k];
                ob += sb[k];
                break;
            }
            oa -= sa[k] * (idx[k] - 1);
            ob -= sb[k] * (idx[k] - 1);
            idx[k] = 0;
        }
    }
    return true;
}

// Same-shape gradient helpers (ReluGrad etc.) reuse the binary path.
static bool grad2_compute(void *state, exec_ctx *ctx) {
    if (!dg_shape_equal(&IN(0)->shape, &IN(1)->shape)) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "inputs differ in shape: %s vs %s",
                         dg_shape_str(&IN(0)->shape, a, sizeof a), dg_shape_str(&IN(1)->shape, b, sizeof b));
    }
    return bin_compute(state, ctx);
}

// ---- unary ----
typedef enum unop {
    U_RELU, U_SIGMOID, U_TANH, U_EXP, U_LOG, U_SQUARE, U_SQRT, U_NEG, U_RSQRT, U_ERF, U_GELU,
    U_SIN, U_COS, U_GELU_TANH
} unop;

static void *un_create(const dg_node *n, const exec_env *env, dg_status *st) {
    static const char *names[] = {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Square", "Sqrt", "Neg",
                                  "Rsqrt", "Erf", "Gelu", "Sin", "Cos"};
    bool approximate = false;
    if (strcmp(n->op->name, "Gelu") == 0 && dg_node_attr_bool(n, "approximate", &approximate) && approximate)
        return (void *)(intptr_t)(U_GELU_TANH + 1);
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(n->op->name, names[i]) == 0) return (void *)(intptr_t)(i + 1);
    dg_status_setf(st, DG_INTERNAL, "no unary op %s", n->op->name);
    return NULL;
}

#define UN_LOOP(T, EXP, LOG, SQRT, TANH, ERF, SIN, COS)                                         \
    do {                                                                                 \
        const T *x = in->data;                                                           \
        T *y = o->data;                                                                  \
        switch (op) {                                                                    \
        case U_RELU: for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0; break;  \
        case U_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = 1 / (1 + EXP(-x[i])); break; \
        case U_TANH: for (int64_t i = 0; i < n; i++) y[i] = TANH(x[i]); break;           \
        case U_EXP: for (int64_t i = 0; i < n; i++) y[i] = EXP(x[i]); break;             \
        case U_LOG: for (int64_t i = 0; i < n; i++) y[i] = LOG(x[i]); break;             \
        case U_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;        \
        case U_SQRT: for (int64_t i = 0; i < n; i++) y[i] = SQRT(x[i]); break;           \
        case U_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;                 \
        case U_RSQRT: for (int64_t i = 0; i < n; i++) y[i] = 1 / SQRT(x[i]); break;      \
        case U_ERF: for (int64_t i = 0; i < n; i++) y[i] = ERF(x[i]); break;             \
        case U_SIN: for (int64_t i = 0; i < n; i++) y[i] = SIN(x[i]); break;             \
        case U_COS: for (int64_t i = 0; i < n; i++) y[i] = COS(x[i]); break;             \
        case U_GELU: case U_GELU_TANH: break;   /* gelu.c, before the switch */          \
        }                                                                                \
    } while (0)

#define ID(x) (x)
CPU_CLONES static bool un_compute(void *state, exec_ctx *ctx) {
    unop op = (unop)((intptr_t)state - 1);
    dg_tensor *in = IN(0);
    dg_tensor *o = exec_alloc_output(ctx, 0, in->dtype, in->shape);
    if (!o) return false;
    int64_t n = in->n_elements;
    if (op == U_GELU || op == U_GELU_TANH) {   // float only (gelu.c)
        gelu_run(in->dtype, op == U_GELU_TANH, in->data, NULL, o->data, n);
        return true;
    }
    switch (in->dtype) {
    case DG_FLOAT32: UN_LOOP(float, expf, logf, sqrtf, tanhf, erff, sinf, cosf); break;
    case DG_FLOAT64: UN_LOOP(double, exp, log, sqrt, tanh, erf, sin, cos); break;
    case DG_INT32: UN_LOOP(int32_t, ID, ID, ID, ID, ID, ID, ID); break;
    case DG_INT64: UN_LOOP(int64_t, ID, ID, ID, ID, ID, ID, ID); break;
    default: return exec_fail(ctx, DG_INVALID_ARGUMENT, "unsupported dtype %s", dg_dtype_name(in->dtype));
    }
    return true;
}

// ---- BiasAdd, BiasAddGrad, AddN ----
#define BIAS_LOOP(T)                                                                     \
    do {                                                                                 \
        const T *x = v->data, *bb = b->data;                                             \
        T *y = o->data;                                                                  \
        for (int64_t r = 0; r < rows; r++)                                               \
            for (int64_t c = 0; c < C; c++) y[r * C + c] = x[r * C + c] + bb[c];         \
    } while (0)

CPU_CLONES static bool bias_add_compute(void *state, exec_ctx *ctx) {
    dg_tensor *v = IN(0), *b = IN(1);
    int64_t C = v->shape.rank > 0 ? v->shape.dims[v->shape.rank - 1] : -1;
    if (b->shape.rank != 1 || b->shape.dims[0] != C)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "bias has %lld elements, value's last dimension is %lld",
                         (long long)b->n_elements, (long long)C);
    dg_tensor *o = exec_alloc_output(ctx, 0, v->dtype, v->shape);
    if (!o) return false;
    int64_t rows = C ? v->n_elements / C : 0;
    if (v->dtype == DG_FLOAT32)
        BIAS_LOOP(float);
    else
        BIAS_LOOP(double);
    return true;
}

#define BIAS_GRAD_LOOP(T)                                                                \
    do {                                                                                 \
        const T *x = dy->data;                                                           \
        T *y = o->data;                                                                  \
        memset(y, 0, o->nbytes);                                                         \
        for (int64_t r = 0; r < rows; r++)                                               \
            for (int64_t c = 0; c < C; c++) y[c] += x[r * C + c];                        \
    } while (0)

// float32 with few channels: four rows at a time into four partial sums, so that each
// channel's additions are four independent chains, not one through memory.
#define BIAS_GRAD_PARTS_MAX 1024
static void bias_grad_f32_parts(const float *x, int64_t rows, int64_t C, float *y) {
    float part[4][BIAS_GRAD_PARTS_MAX];
    for (int k = 0; k < 4; k++) memset(part[k], 0, (size_t)C * sizeof **part);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        for (int k = 0; k < 4; k++) {
            const float *xr = x + (r + k) * C;
            float *pk = part[k];
            for (int64_t c = 0; c < C; c++) pk[c] += xr[c];
        }
    for (; r < rows; r++)
        for (int64_t c = 0; c < C; c++) part[0][c] += x[r * C + c];
    for (int64_t c = 0; c < C; c++) y[c] = (part[0][c] + part[1][c]) + (part[2][c] + part[3][c]);
}

CPU_CLONES static bool bias_add_grad_compute(void *state, exec_ctx *ctx) {
    dg_tensor *dy = IN(0);
    if (dy->shape.rank < 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "BiasAddGrad needs rank >= 1");
    int64_t C = dy->shape.dims[dy->shape.rank - 1];
    dg_tensor *o = exec_alloc_output(ctx, 0, dy->dtype, dg_shape1(C));
    if (!o) return false;
    int64_t rows = C ? dy->n_elements / C : 0;
    if (dy->dtype == DG_FLOAT32 && C > 0 && C <= BIAS_GRAD_PARTS_MAX)
        bias_grad_f32_parts(dy->data, rows, C, o->data);
    else if (dy->dtype == DG_FLOAT32)
        BIAS_GRAD_LOOP(float);
    else
        BIAS_GRAD_LOOP(double);
    return true;
}

#define ADDN_LOOP(T)                                                                     \
    do {                                                                                 \
        T *y = o->data;                                                                  \
        const T *x0 = IN(0)->data;                                                       \
        for (int64_t i = 0; i < n; i++) y[i] = x0[i];                                    \
        for (int k = 1; k < ctx->n_inputs; k++) {                                        \
            const T *x = IN(k)->data;                                                    \
            for (int64_t i = 0; i < n; i++) y[i] += x[i];                                \
        }                                                                                \
    } while (0)

static bool addn_compute(void *state, exec_ctx *ctx) {
    dg_tensor *a = IN(0);
    for (int k = 1; k < ctx->n_inputs; k++)
        if (!dg_shape_equal(&IN(k)->shape, &a->shape)) {
            char x[128], y[128];
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d has shape %s, input 0 has %s", k,
                             dg_shape_str(&IN(k)->shape, x, sizeof x), dg_shape_str(&a->shape, y, sizeof y));
        }
    dg_tensor *o = exec_alloc_output(ctx, 0, a->dtype, a->shape);
    if (!o) return false;
    int64_t n = a->n_elements;
    switch (a->dtype) {
    case DG_FLOAT32: ADDN_LOOP(float); break;
    case DG_FLOAT64: ADDN_LOOP(double); break;
    case DG_INT32: ADDN_LOOP(int32_t); break;
    case DG_INT64: ADDN_LOOP(int64_t); break;
    default: return exec_fail(ctx, DG_INVALID_ARGUMENT, "unsupported dtype");
    }
    return true;
}

// ---- ClipByValue and its gradient ----
// Broadcasts lo/hi (scalars or x-shaped) to x's element i.
static double at(const dg_tensor *t, int64_t i) {
    return dg_tensor_get_as_double(t, t->n_elements == 1 ? 0 : i);
}

static bool bounds_ok(exec_ctx *ctx, const dg_tensor *x, const dg_tensor *b) {
    if (b->n_elements == 1 || dg_shape_equal(&b->shape, &x->shape)) return true;
    return exec_fail(ctx, DG_UNIMPLEMENTED, "clip bounds must be scalars or have the shape of x");
}

static bool clip_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0), *lo = IN(1), *hi = IN(2);
    if (!bounds_ok(ctx, x, lo) || !bounds_ok(ctx, x, hi)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    if (!o) return false;
    for (int64_t i = 0; i < x->n_elements; i++) {
        double v = dg_tensor_get_as_double(x, i), l = at(lo, i), h = at(hi, i);
        v = v < l ? l : v > h ? h : v;
        if (x->dtype == DG_FLOAT32) F32(o)[i] = (float)v;
        else F64(o)[i] = v;
    }
    return true;
}

static bool clip_grad_compute(void *state, exec_ctx *ctx) {
    dg_tensor *dy = IN(0), *x = IN(1), *lo = IN(2), *hi = IN(3);
    if (!bounds_ok(ctx, x, lo) || !bounds_ok(ctx, x, hi)) return false;
    dg_tensor *o[3];
    for (int k = 0; k < 3; k++)
        if (!(o[k] = exec_alloc_output(ctx, k, x->dtype, x->shape))) return false;
    for (int64_t i = 0; i < x->n_elements; i++) {
        double v = dg_tensor_get_as_double(x, i), g = dg_tensor_get_as_double(dy, i);
        double l = at(lo, i), h = at(hi, i);
        double r[3] = {v >= l && v <= h ? g : 0, v < l ? g : 0, v > h ? g : 0};
        for (int k = 0; k < 3; k++) {
            if (x->dtype == DG_FLOAT32) F32(o[k])[i] = (float)r[k];
            else F64(o[k])[i] = r[k];
        }
    }
    return true;
}

// ---- Cast ----
#define CAST_TO(TO)                                                                    \
    do {                                                                               \
        TO *y = o->data;                                                               \
        switch (x->dtype) {                                                            \
        case DG_FLOAT32: { const float *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)s[i]; break; } \
        case DG_FLOAT64: { const double *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)s[i]; break; } \
        case DG_INT32: { const int32_t *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)s[i]; break; } \
        case DG_INT64: { const int64_t *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)s[i]; break; } \
        case DG_BFLOAT16: { const uint16_t *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)dg_bfloat16_to_float(s[i]); break; } \
        case DG_FLOAT16: { const uint16_t *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)dg_float16_to_float(s[i]); break; } \
        default: { const uint8_t *s = x->data; for (int64_t i = 0; i < n; i++) y[i] = (TO)s[i]; break; } \
        }                                                                              \
    } while (0)

// To a 16-bit float: through float32 (from float64 that rounds twice, as TensorFlow's Cast does).
static void cast_to_16(const dg_tensor *x, uint16_t *y, int64_t n, dg_dtype to) {
    if (x->dtype == DG_FLOAT32) {
        cpu_f32_to_f16s(to, x->data, y, n);
    } else if (x->dtype == to) {
        memcpy(y, x->data, (size_t)n * sizeof *y);
    } else {   // the other types (the other 16-bit float too) through their float32 value
        for (int64_t i = 0; i < n; i++) {
            float v = (float)dg_tensor_get_as_double(x, i);
            y[i] = to == DG_BFLOAT16 ? tensor_f32_to_bf16(v) : tensor_f32_to_f16(v);
        }
    }
}

static bool cast_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    dg_dtype to = ctx->node->out_dtypes[0];
    dg_tensor *o = exec_alloc_output(ctx, 0, to, x->shape);
    if (!o) return false;
    int64_t n = x->n_elements;
    switch (to) {
    case DG_FLOAT32:
        if (dg_dtype_is_float16_family(x->dtype))
            cpu_f16s_to_f32(x->dtype, x->data, o->data, n);
        else
            CAST_TO(float);
        break;
    case DG_FLOAT64: CAST_TO(double); break;
    case DG_INT32: CAST_TO(int32_t); break;
    case DG_INT64: CAST_TO(int64_t); break;
    case DG_UINT8: CAST_TO(uint8_t); break;
    case DG_BFLOAT16:
    case DG_FLOAT16: cast_to_16(x, o->data, n, to); break;
    case DG_BOOL: {
        uint8_t *y = o->data;
        for (int64_t i = 0; i < n; i++) y[i] = dg_tensor_get_as_double(x, i) != 0;
        break;
    }
    default: return exec_fail(ctx, DG_INVALID_ARGUMENT, "cannot cast to %s", dg_dtype_name(to));
    }
    return true;
}

#define K(op, mask, create, compute, destroy, expensive) \
    {op, "CPU", mask, create, compute, destroy, expensive, false, false, NULL, false}

const exec_kernel_def cpu_math_kernels[] = {
    K("MatMul", DT_FLOATS | DT_FLOAT16S, matmul_create, matmul_compute, free, true),
    K("Add", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Sub", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Mul", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Div", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Maximum", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Minimum", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Pow", DT_FLOATS, bin_create, bin_compute, free, false),
    K("Equal", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Greater", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("GreaterEqual", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("Less", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("LessEqual", DT_NUMERIC, bin_create, bin_compute, free, false),
    K("ReluGrad", DT_FLOATS, bin_create, grad2_compute, free, false),
    K("SigmoidGrad", DT_FLOATS, bin_create, grad2_compute, free, false),
    K("TanhGrad", DT_FLOATS, bin_create, grad2_compute, free, false),
    K("RsqrtGrad", DT_FLOATS, bin_create, grad2_compute, free, false),
    K("GeluGrad", DT_FLOATS, bin_create, grad2_compute, free, false),
    K("SqrtGrad", DT_FLOATS, bin_create, grad2_compute, free, false),
    K("Relu", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Sigmoid", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Tanh", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Rsqrt", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Erf", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Sin", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Cos", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Gelu", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Exp", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Log", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Square", DT_NUMERIC, un_create, un_compute, NULL, false),
    K("Sqrt", DT_FLOATS, un_create, un_compute, NULL, false),
    K("Neg", DT_NUMERIC, un_create, un_compute, NULL, false),
    K("BiasAdd", DT_FLOATS, cpu_no_state, bias_add_compute, NULL, false),
    K("BiasAddGrad", DT_FLOATS, cpu_no_state, bias_add_grad_compute, NULL, false),
    K("AddN", DT_NUMERIC, cpu_no_state, addn_compute, NULL, false),
    K("ClipByValue", DT_FLOATS, cpu_no_state, clip_compute, NULL, false),
    K("ClipByValueGrad", DT_FLOATS, cpu_no_state, clip_grad_compute, NULL, false),
    K("Cast", DT_STORAGE, cpu_no_state, cast_compute, NULL, false),
};
const int cpu_n_math_kernels = sizeof cpu_math_kernels / sizeof cpu_math_kernels[0];
