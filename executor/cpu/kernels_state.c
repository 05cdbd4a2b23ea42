/* CPU kernels for sources, variables, random ops and optimizer updates. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"
#include "exec_resources_impl.h"

// ---- Const, Placeholder, Identity, NoOp ----
static void *const_create(const dg_node *n, const exec_env *env, dg_status *st) {
    const dg_tensor *t = dg_node_const_value(n);
    if (!t) dg_status_set(st, DG_INVALID_ARGUMENT, "Const has no value");
    return (void *)t;
}
static bool const_compute(void *state, exec_ctx *ctx) {
    exec_set_output(ctx, 0, state);
    return true;
}

bool cpu_placeholder_compute(void *state, exec_ctx *ctx) {
    char b[128];
    return exec_fail(ctx, DG_INVALID_ARGUMENT,
                     "you must feed a value for placeholder \"%s\" (%s %s)", ctx->node->name,
                     dg_dtype_name(ctx->node->out_dtypes[0]),
                     dg_shape_str(&ctx->node->out_shapes[0], b, sizeof b));
}

bool cpu_identity_compute(void *state, exec_ctx *ctx) {
    exec_set_output(ctx, 0, IN(0));
    return true;
}

bool cpu_noop_compute(void *state, exec_ctx *ctx) { return true; }

// ---- variables ----
// The variable behind input k of n (a VariableV2 node), or n itself.
static exec_variable *variable_of(const dg_node *vn, const exec_env *env, dg_status *st) {
    const char *shared = dg_node_attr_string(vn, "shared_name");
    const char *name = shared && *shared ? shared : vn->name;
    return exec_resources_variable(env->rm, name, vn->out_dtypes[0], vn->out_shapes[0], st);
}

static void *variable_create(const dg_node *n, const exec_env *env, dg_status *st) {
    return variable_of(n, env, st);
}

static bool variable_compute(void *state, exec_ctx *ctx) {
    dg_tensor *t = exec_variable_get(state);
    dg_tensor_unref(ctx->outputs[0]);
    ctx->outputs[0] = t;   // NULL while uninitialised; consumers report it
    ctx->owned[0] = false;
    return true;
}

static void *assign_create(const dg_node *n, const exec_env *env, dg_status *st) {
    return variable_of(n->inputs[0].node, env, st);
}

static bool assign_compute(void *state, exec_ctx *ctx) {
    exec_variable *v = state;
    dg_tensor *val = IN(1);
    if (!exec_variable_check_shape(v, val, ctx->st)) return false;
    dg_tensor *cur = exec_variable_get(v);
    if (cur && cur->nbytes == val->nbytes) {
        if (cur->data != val->data) memcpy(cur->data, val->data, val->nbytes);
    } else {
        dg_tensor_unref(cur);
        cur = dg_tensor_copy(val, ctx->st);
        if (!cur) return false;
        exec_variable_set(v, cur);
    }
    exec_set_output(ctx, 0, cur);
    dg_tensor_unref(cur);
    return true;
}

#define ASSIGN_OP(NAME, OP)                                                           \
    static bool NAME(void *state, exec_ctx *ctx) {                                    \
        dg_tensor *var = IN(0), *val = IN(1);                                         \
        if (var->n_elements != val->n_elements)                                       \
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "value has %lld elements, "    \
                             "variable %lld", (long long)val->n_elements,             \
                             (long long)var->n_elements);                             \
        int64_t n = var->n_elements;                                                  \
        switch (var->dtype) {                                                         \
        case DG_FLOAT32: { float *a = var->data; const float *b = val->data;          \
            { for (int64_t i = 0; i < n; i++) a[i] OP b[i]; } break; }                    \
        case DG_FLOAT64: { double *a = var->data; const double *b = val->data;        \
            { for (int64_t i = 0; i < n; i++) a[i] OP b[i]; } break; }                    \
        case DG_INT32: { int32_t *a = var->data; const int32_t *b = val->data;        \
            { for (int64_t i = 0; i < n; i++) a[i] OP b[i]; } break; }                    \
        case DG_INT64: { int64_t *a = var->data; const int64_t *b = val->data;        \
            { for (int64_t i = 0; i < n; i++) a[i] OP b[i]; } break; }                    \
        default: return exec_fail(ctx, DG_INVALID_ARGUMENT, "unsupported dtype");     \
        }                                                                             \
        exec_set_output(ctx, 0, var);                                                 \
        return true;                                                                  \
    }
ASSIGN_OP(assign_add_compute, +=)
ASSIGN_OP(assign_sub_compute, -=)

bool cpu_is_init_compute(void *state, exec_ctx *ctx) {
    dg_tensor *o = exec_alloc_output(ctx, 0, DG_BOOL, dg_shape_scalar());
    if (!o) return false;
    *(uint8_t *)o->data = IN(0) != NULL;
    return true;
}

// ---- random ----
typedef struct rand_state {
    pthread_mutex_t mu;   // guards rng: concurrent steps of one graph share the kernel
    exec_philox rng;
    double a, b;
    int kind;   // 0 uniform, 1 normal, 2 truncated normal
} rand_state;

static void *rand_create(const dg_node *n, const exec_env *env, dg_status *st) {
    rand_state *r = calloc(1, sizeof *r);
    if (!r) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "random op: out of memory");
        return NULL;
    }
    dg_node_attr_float(n, "a", &r->a);
    dg_node_attr_float(n, "b", &r->b);
    exec_philox_init_node(&r->rng, n);
    pthread_mutex_init(&r->mu, NULL);
    const char *op = n->op->name;
    r->kind = strcmp(op, "RandomUniform") == 0 ? 0 : strcmp(op, "RandomStandardNormal") == 0 ? 1 : 2;
    return r;
}

static bool rand_compute(void *state, exec_ctx *ctx) {
    rand_state *r = state;
    dg_dtype t = ctx->node->out_dtypes[0];
    dg_tensor *o = exec_alloc_output(ctx, 0, t, ctx->node->out_shapes[0]);
    if (!o) return false;
    pthread_mutex_lock(&r->mu);
    for (int64_t i = 0; i < o->n_elements; i++) {
        double v;
        if (r->kind == 0) {
            v = r->a + (r->b - r->a) * (t == DG_FLOAT32 ? exec_philox_uniform_f(&r->rng)
                                                        : exec_philox_uniform_d(&r->rng));
        } else {
            double z = exec_philox_normal(&r->rng);
            while (r->kind == 2 && fabs(z) > 2.0) z = exec_philox_normal(&r->rng);
            v = r->a + r->b * z;
        }
        if (t == DG_FLOAT32)
            F32(o)[i] = (float)v;
        else
            F64(o)[i] = v;
    }
    pthread_mutex_unlock(&r->mu);
    return true;
}

static void rand_destroy(void *state) {
    rand_state *r = state;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

// ---- optimizer updates (in place on the variables) ----
static double scalar_of(const dg_tensor *t) { return dg_tensor_get_as_double(t, 0); }

// An update's inputs against its variable (input 0): inputs same[] of its dtype and shape,
// inputs scalars[] one element of its dtype. Shapes unknown when the graph was built (or a
// graph from elsewhere) can bring anything here; a mismatch would read or write past a buffer.
static bool check_update(exec_ctx *ctx, const int *same, int n_same, const int *scalars, int n_scalars) {
    const dg_tensor *var = IN(0);
    char a[128], b[128];
    for (int k = 0; k < n_same; k++) {
        const dg_tensor *t = IN(same[k]);
        if (t->dtype != var->dtype || !dg_shape_equal(&t->shape, &var->shape))
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d (\"%s\") is %s %s; the variable is %s %s", same[k],
                             ctx->node->inputs[same[k]].node->name, dg_dtype_name(t->dtype),
                             dg_shape_str(&t->shape, a, sizeof a), dg_dtype_name(var->dtype),
                             dg_shape_str(&var->shape, b, sizeof b));
    }
    for (int k = 0; k < n_scalars; k++) {
        const dg_tensor *t = IN(scalars[k]);
        if (t->dtype != var->dtype || t->n_elements != 1)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be one %s, got %s %s", scalars[k],
                             ctx->node->inputs[scalars[k]].node->name, dg_dtype_name(var->dtype),
                             dg_dtype_name(t->dtype), dg_shape_str(&t->shape, a, sizeof a));
    }
    return true;
}

static bool apply_gd_compute(void *state, exec_ctx *ctx) {
    int skipped = exec_update_skipped(ctx, 3);
    if (skipped) return skipped > 0;
    if (!check_update(ctx, (const int[]){2}, 1, (const int[]){1}, 1)) return false;
    dg_tensor *var = IN(0), *delta = IN(2);
    double alpha = scalar_of(IN(1));
    int64_t n = var->n_elements;
    if (var->dtype == DG_FLOAT32) {
        float *w = var->data, a = (float)alpha;
        const float *d = delta->data;
        for (int64_t i = 0; i < n; i++) w[i] -= a * d[i];
    } else {
        double *w = var->data;
        const double *d = delta->data;
        for (int64_t i = 0; i < n; i++) w[i] -= alpha * d[i];
    }
    exec_set_output(ctx, 0, var);
    return true;
}

typedef struct momentum_state {
    bool nesterov;
} momentum_state;

static void *momentum_create(const dg_node *n, const exec_env *env, dg_status *st) {
    momentum_state *m = calloc(1, sizeof *m);
    if (!m) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    dg_node_attr_bool(n, "use_nesterov", &m->nesterov);
    return m;
}

#define MOMENTUM_LOOP(T)                                                            \
    do {                                                                            \
        T *w = var->data, *acc = accum->data;                                       \
        const T *g = grad->data;                                                    \
        T l = (T)lr, mo = (T)mom;                                                   \
        for (int64_t i = 0; i < n; i++) {                                           \
            acc[i] = acc[i] * mo + g[i];                                            \
            w[i] -= nesterov ? g[i] * l + acc[i] * mo * l : acc[i] * l;             \
        }                                                                           \
    } while (0)

static bool apply_momentum_compute(void *state, exec_ctx *ctx) {
    int skipped = exec_update_skipped(ctx, 5);
    if (skipped) return skipped > 0;
    if (!check_update(ctx, (const int[]){1, 3}, 2, (const int[]){2, 4}, 2)) return false;
    dg_tensor *var = IN(0), *accum = IN(1), *grad = IN(3);
    double lr = scalar_of(IN(2)), mom = scalar_of(IN(4));
    bool nesterov = ((momentum_state *)state)->nesterov;
    int64_t n = var->n_elements;
    if (var->dtype == DG_FLOAT32)
        MOMENTUM_LOOP(float);
    else
        MOMENTUM_LOOP(double);
    exec_set_output(ctx, 0, var);
    return true;
}

CPU_CLONES static void adam_f32(float *restrict w, float *restrict m, float *restrict v,
                                 const float *restrict g, int64_t n, float l, float b1, float b2,
                                 float e) {
    float c1 = 1 - b1, c2 = 1 - b2;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = m[i] + (gi - m[i]) * c1;
        float vi = v[i] + (gi * gi - v[i]) * c2;
        m[i] = mi;
        v[i] = vi;
        w[i] -= mi * l / (sqrtf(vi) + e);
    }
}

static void adam_f64(double *restrict w, double *restrict m, double *restrict v,
                     const double *restrict g, int64_t n, double l, double b1, double b2, double e) {
    for (int64_t i = 0; i < n; i++) {
        m[i] += (g[i] - m[i]) * (1 - b1);
        v[i] += (g[i] * g[i] - v[i]) * (1 - b2);
        w[i] -= m[i] * l / (sqrt(v[i]) + e);
    }
}

static bool apply_adam_compute(void *state, exec_ctx *ctx) {
    int skipped = exec_update_skipped(ctx, 10);
    if (skipped) return skipped > 0;
    if (!check_update(ctx, (const int[]){1, 2, 9}, 3, (const int[]){3, 4, 5, 6, 7, 8}, 6)) return false;
    dg_tensor *var = IN(0), *mt = IN(1), *vt = IN(2), *grad = IN(9);
    double b1p = scalar_of(IN(3)), b2p = scalar_of(IN(4)), lr = scalar_of(IN(5));
    double beta1 = scalar_of(IN(6)), beta2 = scalar_of(IN(7)), eps = scalar_of(IN(8));
    double lr_t = lr * sqrt(1 - b2p) / (1 - b1p);
    int64_t n = var->n_elements;
    if (var->dtype == DG_FLOAT32)
        adam_f32(var->data, mt->data, vt->data, grad->data, n, (float)lr_t, (float)beta1,
                 (float)beta2, (float)eps);
    else
        adam_f64(var->data, mt->data, vt->data, grad->data, n, lr_t, beta1, beta2, eps);
    exec_set_output(ctx, 0, var);
    return true;
}

#define K(op, mask, create, compute, destroy, expensive, is_ref, uninit) \
    {op, "CPU", mask, create, compute, destroy, expensive, is_ref, uninit, NULL, false}

const exec_kernel_def cpu_state_kernels[] = {
    K("Const", DT_STORAGE, const_create, const_compute, NULL, false, false, false),
    K("Placeholder", DT_STORAGE, cpu_no_state, cpu_placeholder_compute, NULL, false, false, false),
    K("Identity", DT_STORAGE, cpu_no_state, cpu_identity_compute, NULL, false, false, false),
    K("NoOp", DT_STORAGE | DT_BIT(DG_INVALID_DTYPE), cpu_no_state, cpu_noop_compute, NULL, false, false, false),
    K("VariableV2", DT_STORAGE, variable_create, variable_compute, NULL, false, true, true),
    K("Assign", DT_STORAGE, assign_create, assign_compute, NULL, false, true, true),
    K("AssignAdd", DT_NUMERIC, cpu_no_state, assign_add_compute, NULL, false, true, false),
    K("AssignSub", DT_NUMERIC, cpu_no_state, assign_sub_compute, NULL, false, true, false),
    K("IsVariableInitialized", DT_STORAGE, cpu_no_state, cpu_is_init_compute, NULL, false, false, true),
    K("RandomUniform", DT_FLOATS, rand_create, rand_compute, rand_destroy, false, false, false),
    K("RandomStandardNormal", DT_FLOATS, rand_create, rand_compute, rand_destroy, false, false, false),
    K("TruncatedNormal", DT_FLOATS, rand_create, rand_compute, rand_destroy, false, false, false),
    K("ApplyGradientDescent", DT_FLOATS, cpu_no_state, apply_gd_compute, NULL, false, true, false),
    K("ApplyMomentum", DT_FLOATS, momentum_create, apply_momentum_compute, free, false, true, false),
    K("ApplyAdam", DT_FLOATS, cpu_no_state, apply_adam_compute, NULL, false, true, false),
};
const int cpu_n_state_kernels = sizeof cpu_state_kernels / sizeof cpu_state_kernels[0];
