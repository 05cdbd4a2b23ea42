/* GPU kernels for sources, variables and random ops, and _Send/_Recv on a GPU.
 * Variables of float dtypes keep their value in device memory. Random ops draw on the host
 * with the CPU kernel's Philox stream and copy the result to the device, so an initializer
 * gives bit-identical values on CPU and GPU (they run once per initialisation). */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"
#include "exec_executor_impl.h"
#include "exec_kernel_registry_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_resources_impl.h"
#include "gpu_impl.h"

#define IN(i) (ctx->inputs[i])

// ---- Const: float values are copied to the device once, when the kernel is created ----

typedef struct const_state {
    exec_cuda_device *dev;
    dg_tensor *value;   // device copy (floats) or the node's host value; one reference
} const_state;

static void const_destroy(void *state) {
    const_state *c = state;
    dg_tensor_unref(c->value);
    free(c);
}

static void *const_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    const dg_tensor *host = dg_node_const_value(n);
    if (!host) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Const has no value");
        return NULL;
    }
    exec_cuda_device *dev = gpu_node_device(n, st);
    if (!dev) return NULL;
    const_state *c = calloc(1, sizeof *c);
    if (!c) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "Const: out of memory");
        return NULL;
    }
    c->dev = dev;
    c->value = gpu_to_device(dev, (dg_tensor *)host, st);
    if (!c->value) {
        free(c);
        return NULL;
    }
    return c;
}

static bool const_compute(void *state, exec_ctx *ctx) {
    const_state *c = state;
    exec_set_output(ctx, 0, c->value);
    return true;
}

// Placeholder, Identity, NoOp and IsVariableInitialized touch no element: the CPU kernels'
// compute serves (kernels_state.c).

// ---- variables ----

typedef struct var_state {
    exec_cuda_device *dev;
    exec_variable *v;
} var_state;

static void *var_state_new(const dg_node *n, const dg_node *vn, const exec_env *env,
                           dg_status *st) {
    exec_cuda_device *dev = gpu_node_device(n, st);
    if (!dev) return NULL;
    const char *shared = dg_node_attr_string(vn, "shared_name");
    const char *name = shared && *shared ? shared : vn->name;
    exec_variable *v =
        exec_resources_variable(env->rm, name, vn->out_dtypes[0], vn->out_shapes[0], st);
    if (!v) return NULL;
    var_state *s = malloc(sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "variable: out of memory");
        return NULL;
    }
    s->dev = dev;
    s->v = v;
    return s;
}

static void *variable_create(const dg_node *n, const exec_env *env, dg_status *st) {
    return var_state_new(n, n, env, st);
}

static void *assign_create(const dg_node *n, const exec_env *env, dg_status *st) {
    return var_state_new(n, n->inputs[0].node, env, st);
}

// The output is the variable's value in this GPU's memory: a value set on the host (restored,
// or assigned before the variable moved here) is moved to the device once.
static bool variable_compute(void *state, exec_ctx *ctx) {
    var_state *s = state;
    dg_tensor *t = exec_variable_get(s->v);
    if (t && !gpu_tensor_in(t, s->dev)) {
        dg_tensor *d = gpu_to_device(s->dev, t, ctx->st);
        dg_tensor_unref(t);
        if (!d) return false;
        exec_variable_set(s->v, d);
        t = d;
    }
    dg_tensor_unref(ctx->outputs[0]);
    ctx->outputs[0] = t;   // NULL while uninitialised; consumers report it
    ctx->owned[0] = false;
    return true;
}

static bool assign_compute(void *state, exec_ctx *ctx) {
    var_state *s = state;
    exec_variable *v = s->v;
    dg_tensor *val = IN(1);
    if (!exec_variable_check_shape(v, val, ctx->st)) return false;
    // An empty value may be anywhere (gpu_prepare_inputs): nothing of it is copied.
    if (val->n_elements > 0 && !gpu_tensor_in(val, s->dev))
        return exec_fail(ctx, DG_INTERNAL, "assigning a value that is not in the memory of GPU:%d",
                         s->dev->id);
    dg_tensor *cur = exec_variable_get(v);
    if (!cur || !gpu_tensor_in(cur, s->dev) || cur->nbytes != val->nbytes) {
        dg_tensor_unref(cur);
        if (!(cur = gpu_tensor_new(s->dev, val->dtype, val->shape, ctx->st))) return false;
        exec_variable_set(v, cur);
    }
    if (cur->data != val->data &&
        !exec_cuda_memcpy_device(s->dev, cur->data, val->data, val->nbytes, ctx->st)) {
        dg_tensor_unref(cur);
        return false;
    }
    exec_set_output(ctx, 0, cur);
    dg_tensor_unref(cur);
    return true;
}

// ---- random: the CPU kernel draws, the result is copied to the device ----

typedef struct rand_state {
    exec_cuda_device *dev;
    const exec_kernel_def *cpu;
    void *cpu_state;
} rand_state;

static void rand_destroy(void *state) {
    rand_state *r = state;
    if (r->cpu->destroy) r->cpu->destroy(r->cpu_state);
    free(r);
}

static void *rand_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_node_device(n, st);
    if (!dev) return NULL;
    const exec_kernel_def *cpu = exec_kernel_find(n->op->name, "CPU", exec_kernel_dtype(n));
    if (!cpu || !cpu->compute) {
        dg_status_setf(st, DG_INTERNAL, "%s: no CPU kernel to draw with", n->op->name);
        return NULL;
    }
    rand_state *r = calloc(1, sizeof *r);
    if (!r) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "random op: out of memory");
        return NULL;
    }
    r->dev = dev;
    r->cpu = cpu;
    if (!(r->cpu_state = cpu->create(n, env, st))) {
        free(r);
        return NULL;
    }
    return r;
}

static bool rand_compute(void *state, exec_ctx *ctx) {
    rand_state *r = state;
    dg_tensor *host = NULL;
    bool owned = false;
    exec_ctx c = *ctx;
    c.outputs = &host;
    c.owned = &owned;
    c.n_outputs = 1;
    if (!r->cpu->compute(r->cpu_state, &c)) {
        dg_tensor_unref(host);
        return false;
    }
    dg_tensor *d = gpu_to_device(r->dev, host, ctx->st);
    dg_tensor_unref(host);
    if (!d) return false;
    dg_tensor_unref(ctx->outputs[0]);
    ctx->outputs[0] = d;
    ctx->owned[0] = false;
    return true;
}

// ---- _Send / _Recv on a GPU: values cross as host tensors in pinned memory ----

char *exec_rendezvous_key(const dg_node *n);   // executor/cpu/kernels_sendrecv.c

typedef struct sr_state {
    exec_cuda_device *dev;
    char *key;
} sr_state;

static void sr_destroy(void *state) {
    sr_state *s = state;
    free(s->key);
    free(s);
}

static void *sr_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    exec_cuda_device *dev = gpu_node_device(n, st);
    if (!dev) return NULL;
    sr_state *s = calloc(1, sizeof *s);
    if (!s || !(s->key = exec_rendezvous_key(n))) {
        free(s);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    s->dev = dev;
    return s;
}

// Device -> pinned host (waits for the value), then the host tensor goes on unchanged: to
// this task's rendezvous, or out through the transport without another copy.
static bool send_compute(void *state, exec_ctx *ctx) {
    sr_state *s = state;
    const exec_step_options *o = exec_step_opts(ctx->step);
    if (!o->rendezvous) return exec_fail(ctx, DG_INTERNAL, "no rendezvous for this step");
    if (!IN(0)) return exec_fail(ctx, DG_FAILED_PRECONDITION, "sending an uninitialized value");
    dg_tensor *h = gpu_to_host(s->dev, IN(0), ctx->st);
    if (!h) return false;
    bool ok = exec_rendezvous_send(o->rendezvous, o->step_id, s->key, h, ctx->st);
    dg_tensor_unref(h);
    return ok;
}

typedef struct recv_wait {
    exec_async_handle h;
    exec_cuda_device *dev;
} recv_wait;

// The value arrived (in host memory): floats are queued for the device, others stay.
static void recv_done(void *arg, int node, dg_tensor *t, const dg_status *st) {
    (void)node;
    recv_wait *w = arg;
    exec_async_handle h = w->h;
    exec_cuda_device *dev = w->dev;
    free(w);
    if (!t) {
        exec_async_done(h, NULL, st);
        return;
    }
    dg_status *cst = dg_status_new();
    dg_tensor *d = gpu_to_device(dev, t, cst);
    dg_tensor_unref(t);
    exec_async_done(h, d, d ? NULL : cst);
    dg_status_free(&cst);
}

static void recv_start(void *state, exec_ctx *ctx, exec_async_handle h) {
    sr_state *s = state;
    const exec_step_options *o = exec_step_opts(ctx->step);
    recv_wait *w = malloc(sizeof *w);
    if (!o->rendezvous || !w) {
        free(w);
        dg_status_set(ctx->st, o->rendezvous ? DG_RESOURCE_EXHAUSTED : DG_INTERNAL,
                      o->rendezvous ? "out of memory" : "no rendezvous for this step");
        exec_async_done(h, NULL, ctx->st);
        return;
    }
    w->h = h;
    w->dev = s->dev;
    exec_rendezvous_recv_async(o->rendezvous, o->step_id, s->key, recv_done, w, h.node);
}

// {op, type, dtypes, create, compute, destroy, expensive, output_is_ref, takes_uninit,
//  start_async, host_outputs}
const exec_kernel_def gpu_state_kernels[] = {
    {"Const", "GPU", DT_STORAGE, const_create, const_compute, const_destroy, false, false, false, NULL, true},
    {"Placeholder", "GPU", DT_STORAGE, gpu_dev_create, cpu_placeholder_compute, NULL, false, false, false, NULL, true},
    {"Identity", "GPU", DT_STORAGE, gpu_dev_create, cpu_identity_compute, NULL, false, false, false, NULL, true},
    {"StopGradient", "GPU", DT_STORAGE, gpu_dev_create, cpu_identity_compute, NULL, false, false, false, NULL, true},
    {"NoOp", "GPU", DT_STORAGE | DT_BIT(DG_INVALID_DTYPE), gpu_dev_create, cpu_noop_compute, NULL, false, false, false, NULL, true},
    {"VariableV2", "GPU", DT_FLOATS, variable_create, variable_compute, free, false, true, true, NULL, false},
    {"Assign", "GPU", DT_FLOATS, assign_create, assign_compute, free, false, true, true, NULL, false},
    {"IsVariableInitialized", "GPU", DT_FLOATS, gpu_dev_create, cpu_is_init_compute, NULL, false, false, true, NULL, true},
    {"RandomUniform", "GPU", DT_FLOATS, rand_create, rand_compute, rand_destroy, false, false, false, NULL, false},
    {"RandomStandardNormal", "GPU", DT_FLOATS, rand_create, rand_compute, rand_destroy, false, false, false, NULL, false},
    {"TruncatedNormal", "GPU", DT_FLOATS, rand_create, rand_compute, rand_destroy, false, false, false, NULL, false},
};
const int gpu_n_state_kernels = sizeof gpu_state_kernels / sizeof gpu_state_kernels[0];

const exec_kernel_def gpu_sendrecv_kernels[] = {
    {"_Send", "GPU", DT_STORAGE, sr_create, send_compute, sr_destroy, false, false, false, NULL, true},
    {"_Recv", "GPU", DT_STORAGE, sr_create, NULL, sr_destroy, false, false, false, recv_start, true},
};
const int gpu_n_sendrecv_kernels = sizeof gpu_sendrecv_kernels / sizeof gpu_sendrecv_kernels[0];
