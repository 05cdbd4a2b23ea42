/* bfloat16 and float16 kernels for the ops of graph_ops_16 (op_defs.c): the elementwise ops the
 * mixed-precision rewrite's infer and clear lists convert, Conv2D's filter gradient and
 * attention with its gradient (whose lse stays float32). Each 16-bit input is widened to float32,
 * the op's float32 kernel runs, and each float32 output is rounded once to the node's dtype
 * (to nearest, ties to even). So a 16-bit op gives the float32 op's value rounded once, as
 * TensorFlow's Eigen kernels for bfloat16 do. The table is made from the graph's list at
 * registration, so the ops that pass the graph's dtype checks and the ops with kernels are one
 * list. */
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "exec_cpu_impl.h"
#include "exec_kernel_registry_impl.h"
#include "graph_impl.h"

static bool fast_compute(const dg_node *node, exec_ctx *ctx, bool *done);

typedef struct via32 {
    const exec_kernel_def *inner;   // the op's float32 kernel
    void *state;                    // its state
} via32;

static void *via32_create(const dg_node *n, const exec_env *env, dg_status *st) {
    const exec_kernel_def *k = exec_kernel_find(n->op->name, "CPU", DG_FLOAT32);
    if (!k || !k->compute) {
        dg_status_setf(st, DG_INTERNAL, "%s: no float32 CPU kernel to compute 16-bit floats through", n->op->name);
        return NULL;
    }
    via32 *v = calloc(1, sizeof *v);
    if (!v) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    v->inner = k;
    v->state = k->create(n, env, st);
    if (!v->state) {
        free(v);
        return NULL;
    }
    return v;
}

static void via32_destroy(void *state) {
    via32 *v = state;
    if (!v) return;
    if (v->inner->destroy) v->inner->destroy(v->state);
    free(v);
}

static bool via32_compute(void *state, exec_ctx *ctx) {
    via32 *v = state;
    bool done;
    bool ok = fast_compute(ctx->node, ctx, &done);
    return done ? ok : cpu_compute_via_f32(v->inner->compute, v->state, ctx);
}

bool cpu_compute_via_f32(bool (*compute)(void *state, exec_ctx *ctx), void *state, exec_ctx *ctx) {
    int ni = ctx->n_inputs, no = ctx->n_outputs;
    dg_tensor **ins = calloc((size_t)ni + 1, sizeof *ins);
    dg_tensor **outs = calloc((size_t)no + 1, sizeof *outs);
    bool *owned = calloc((size_t)no + 1, sizeof *owned);
    bool ok = ins && outs && owned;
    if (!ok) exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "out of memory widening %d inputs", ni);
    for (int i = 0; ok && i < ni; i++) {
        dg_tensor *x = ctx->inputs[i];
        if (!dg_dtype_is_float16_family(x->dtype)) {
            ins[i] = dg_tensor_ref(x);
            continue;
        }
        if (!tensor_on_host(x)) {
            ok = exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d is not in host memory", i);
            break;
        }
        ins[i] = dg_tensor_new(DG_FLOAT32, x->shape, ctx->st);
        if (!ins[i]) {
            ok = false;
            break;
        }
        cpu_f16s_to_f32(x->dtype, x->data, ins[i]->data, x->n_elements);
    }
    if (ok) {
        exec_ctx sub = *ctx;
        sub.inputs = ins;
        sub.outputs = outs;
        sub.owned = owned;
        ok = compute(state, &sub);
    }
    for (int i = 0; ok && i < no; i++) {
        dg_tensor *t = outs[i];
        dg_dtype want = ctx->node->out_dtypes[i];
        if (!t) continue;
        if (t->dtype == DG_FLOAT32 && dg_dtype_is_float16_family(want)) {
            dg_tensor *o = exec_alloc_output(ctx, i, want, t->shape);
            if (!o) {
                ok = false;
                break;
            }
            cpu_f32_to_f16s(want, t->data, o->data, t->n_elements);
        } else {
            exec_set_output(ctx, i, t);
        }
    }
    for (int i = 0; ins && i < ni; i++) dg_tensor_unref(ins[i]);
    for (int i = 0; outs && i < no; i++) dg_tensor_unref(outs[i]);
    free(ins);
    free(outs);
    free(owned);
    return ok;
}

// ---- the hot ones in one pass ----
//
// Add, Sub, Mul, Maximum, Minimum and AddN of one shape, BiasAdd, Relu, ReluGrad, Gelu and
// GeluGrad go through float32 a chunk of CHUNK elements at a time, in buffers that stay in L1:
// the 16-bit values are read once and written once, with no float32 tensors in memory. The
// arithmetic is the float32 kernels' (gelu.c's loops for Gelu), so the results are the same
// bits as the generic path's, which takes every other case (broadcasting, the other ops).

enum { CHUNK = 2048, MAX_FAST_INPUTS = 8 };
#define FAST_SPLIT ((int64_t)1 << 16)

typedef enum fast_kind { F_NONE, F_ADD, F_SUB, F_MUL, F_MAX, F_MIN, F_ADDN, F_BIAS, F_RELU, F_RELU_GRAD, F_GELU,
                         F_GELU_GRAD } fast_kind;

typedef struct fast_job {
    fast_kind kind;
    bool tanh_form;
    dg_dtype t;
    const uint16_t *in[MAX_FAST_INPUTS];
    int n_in;
    const float *bias;   // F_BIAS: the bias widened, C of them
    int64_t C;
    uint16_t *out;
    int64_t n;
} fast_job;

CPU_CLONES static void fast_range(const fast_job *j, int64_t lo, int64_t hi) {
    float a[CHUNK], b[CHUNK], o[CHUNK];
    for (int64_t s = lo; s < hi; s += CHUNK) {
        int64_t m = hi - s < CHUNK ? hi - s : CHUNK;
        cpu_f16s_to_f32(j->t, j->in[0] + s, a, m);
        // The second input of one shape (BiasAdd's bias, C elements, is widened once before).
        if (j->n_in > 1 && j->kind != F_ADDN && j->kind != F_BIAS) cpu_f16s_to_f32(j->t, j->in[1] + s, b, m);
        switch (j->kind) {
        case F_ADD: for (int64_t i = 0; i < m; i++) o[i] = a[i] + b[i]; break;
        case F_SUB: for (int64_t i = 0; i < m; i++) o[i] = a[i] - b[i]; break;
        case F_MUL: for (int64_t i = 0; i < m; i++) o[i] = a[i] * b[i]; break;
        case F_MAX: for (int64_t i = 0; i < m; i++) o[i] = a[i] > b[i] ? a[i] : b[i]; break;
        case F_MIN: for (int64_t i = 0; i < m; i++) o[i] = a[i] < b[i] ? a[i] : b[i]; break;
        case F_ADDN:
            memcpy(o, a, (size_t)m * sizeof *o);
            for (int k = 1; k < j->n_in; k++) {
                cpu_f16s_to_f32(j->t, j->in[k] + s, b, m);
                for (int64_t i = 0; i < m; i++) o[i] += b[i];
            }
            break;
        case F_BIAS: {
            int64_t c = s % j->C;
            for (int64_t i = 0; i < m; i++) {
                o[i] = a[i] + j->bias[c];
                if (++c == j->C) c = 0;
            }
            break;
        }
        case F_RELU: for (int64_t i = 0; i < m; i++) o[i] = a[i] > 0 ? a[i] : 0; break;
        case F_RELU_GRAD: for (int64_t i = 0; i < m; i++) o[i] = b[i] > 0 ? a[i] : 0; break;   // (dy, x)
        case F_GELU: cpu_gelu_f32(a, o, m, j->tanh_form); break;
        case F_GELU_GRAD: cpu_gelu_grad_f32(a, b, o, m, j->tanh_form); break;   // (dy, x)
        default: break;
        }
        cpu_f32_to_f16s(j->t, o, j->out + s, m);
    }
}

static void fast_piece(void *ctx, int i, int n) {
    const fast_job *j = ctx;
    int64_t lo, hi;
    cpu_piece_range(j->n, i, n, &lo, &hi);
    if (lo < hi) fast_range(j, lo, hi);
}

static fast_kind fast_kind_of(const dg_node *n, bool *tanh_form) {
    static const struct {
        const char *op;
        fast_kind kind;
    } kinds[] = {{"Add", F_ADD}, {"Sub", F_SUB}, {"Mul", F_MUL}, {"Maximum", F_MAX}, {"Minimum", F_MIN},
                 {"AddN", F_ADDN}, {"BiasAdd", F_BIAS}, {"Relu", F_RELU}, {"ReluGrad", F_RELU_GRAD},
                 {"Gelu", F_GELU}, {"GeluGrad", F_GELU_GRAD}};
    *tanh_form = false;
    (void)dg_node_attr_bool(n, "approximate", tanh_form);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kinds[i].op, n->op->name) == 0) return kinds[i].kind;
    return F_NONE;
}

// The one-pass path when it applies (every input of the node's dtype, in host memory, of one
// shape, BiasAdd's bias excepted); false with *done false when it does not.
static bool fast_compute(const dg_node *node, exec_ctx *ctx, bool *done) {
    *done = false;
    fast_job j = {.t = ctx->node->out_dtypes[0], .n_in = ctx->n_inputs};
    j.kind = fast_kind_of(node, &j.tanh_form);
    if (j.kind == F_NONE || ctx->n_inputs > MAX_FAST_INPUTS || ctx->n_outputs != 1) return false;
    const dg_tensor *x = ctx->inputs[0];
    for (int i = 0; i < ctx->n_inputs; i++) {
        const dg_tensor *in = ctx->inputs[i];
        if (in->dtype != j.t || !tensor_on_host(in)) return false;
        // One shape (not just one count: [3,1] + [1,3] broadcasts to [3,3]).
        if (!(j.kind == F_BIAS && i == 1) && !dg_shape_equal(&in->shape, &x->shape)) return false;
        j.in[i] = in->data;
    }
    float *bias = NULL;
    if (j.kind == F_BIAS) {
        const dg_tensor *b = ctx->inputs[1];
        j.C = x->shape.rank > 0 ? x->shape.dims[x->shape.rank - 1] : -1;
        if (b->shape.rank != 1 || b->n_elements != j.C || j.C < 1) return false;   // the generic path names it
        if (!(bias = malloc((size_t)j.C * sizeof *bias))) return false;
        cpu_f16s_to_f32(j.t, b->data, bias, j.C);
        j.bias = bias;
    }
    *done = true;
    dg_tensor *o = exec_alloc_output(ctx, 0, j.t, x->shape);
    bool ok = o != NULL;
    if (ok) {
        j.out = o->data;
        j.n = x->n_elements;
        int threads = exec_cpu_threads();
        bool split = false;
        if (j.n >= 2 * FAST_SPLIT && threads > 1) {
            int64_t by_size = j.n / FAST_SPLIT;
            split = cpu_parallel_for(by_size < threads ? (int)by_size : threads, fast_piece, &j);
        }
        if (!split) fast_range(&j, 0, j.n);
    }
    free(bias);
    return ok;
}

#define MAX_OPS_16 64
static exec_kernel_def defs[MAX_OPS_16];

void cpu_register_16_kernels(void) {
    const char *const *names;
    int n = graph_ops_16(&names);
    if (n > MAX_OPS_16) abort();   // a programming error: raise MAX_OPS_16
    for (int i = 0; i < n; i++)
        defs[i] = (exec_kernel_def){.op = names[i], .device_type = "CPU", .dtype_mask = DT_FLOAT16S,
                                    .create = via32_create, .compute = via32_compute, .destroy = via32_destroy};
    exec_register_kernels(defs, n);
}
