/* bfloat16 and float16 kernels for the elementwise ops the mixed-precision rewrite's infer
 * and clear lists convert (graph_ops_16, op_defs.c): each 16-bit input is widened to float32,
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
    return cpu_compute_via_f32(v->inner->compute, v->state, ctx);
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
