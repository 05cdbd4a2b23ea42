/* _Send and _Recv: the ends of a cross-device edge. The rendezvous key is
 * "send_device;incarnation;recv_device;tensor_name;frame:iter" (TensorFlow's form), scoped
 * by the step id. _Recv is asynchronous: it never blocks a thread while it waits. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"
#include "exec_executor_impl.h"
#include "exec_rendezvous_impl.h"

char *exec_rendezvous_key(const dg_node *n);
char *exec_rendezvous_key(const dg_node *n) {
    int64_t inc = 1;
    dg_node_attr_int(n, "send_device_incarnation", &inc);
    char *key = NULL;
    if (asprintf(&key, "%s;%016" PRIx64 ";%s;%s;0:0", dg_node_attr_string(n, "send_device"),
                 (uint64_t)inc, dg_node_attr_string(n, "recv_device"),
                 dg_node_attr_string(n, "tensor_name")) < 0)
        return NULL;
    return key;
}

static void *key_create(const dg_node *n, const exec_env *env, dg_status *st) {
    char *key = exec_rendezvous_key(n);
    if (!key) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
    return key;
}

static bool send_compute(void *state, exec_ctx *ctx) {
    const exec_step_options *o = exec_step_opts(ctx->step);
    if (!o->rendezvous) return exec_fail(ctx, DG_INTERNAL, "no rendezvous for this step");
    return exec_rendezvous_send(o->rendezvous, o->step_id, state, IN(0), ctx->st);
}

static void recv_done(void *arg, int node, dg_tensor *t, const dg_status *st) {
    exec_async_handle h = {arg, node};
    exec_async_done(h, t, st);
}

static void recv_start(void *state, exec_ctx *ctx, exec_async_handle h) {
    const exec_step_options *o = exec_step_opts(ctx->step);
    if (!o->rendezvous) {
        dg_status_set(ctx->st, DG_INTERNAL, "no rendezvous for this step");
        exec_async_done(h, NULL, ctx->st);
        return;
    }
    exec_rendezvous_recv_async(o->rendezvous, o->step_id, state, recv_done, h.step, h.node);
}

const exec_kernel_def cpu_sendrecv_kernels[] = {
    {"_Send", "CPU", DT_STORAGE, key_create, send_compute, free, false, false, false, NULL, false},
    {"_Recv", "CPU", DT_STORAGE, key_create, NULL, free, false, false, false, recv_start, false},
};
const int cpu_n_sendrecv_kernels = sizeof cpu_sendrecv_kernels / sizeof cpu_sendrecv_kernels[0];
