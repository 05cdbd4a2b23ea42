/* Test and benchmark hooks over a server's transport (ping_impl.h): a PING echo and one-way
 * pushes, for the transport's tests and bench/transport_bench.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ping_impl.h"
#include "server_impl.h"
#include "status_impl.h"

static rt_header *new_header(int type) {
    rt_header *h = malloc(sizeof *h);
    if (!h) abort();
    rt_header_init(h, type);
    return h;
}

bool rt_server_ping(dg_server *client, const char *target_task_address, dg_tensor *const *tensors, int n,
                    int64_t timeout_ms, dg_tensor ***echo, int *n_echo, dg_status *st) {
    dg_status_reset(st);
    if (echo) *echo = NULL;
    if (n_echo) *n_echo = 0;
    if (!client || n < 0 || (n > 0 && !tensors)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "ping: a client server and n >= 0 tensors are required");
        return false;
    }
    if (n > RT_MAX_TENSORS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "ping: %d tensors, at most %d fit in a message", n,
                       RT_MAX_TENSORS);
        return false;
    }
    char *ep = rt_endpoint_of(target_task_address, st);
    if (!ep) return false;
    rt_header *h = new_header(RT_PING);
    for (int i = 0; i < n; i++) rt_header_add_tensor(h, tensors[i]);
    rt_header *resp = NULL;
    dg_tensor **out = NULL;
    int n_out = 0;
    bool ok = rt_call_sync(rt_server_env(client)->transport, ep, h, tensors, n, timeout_ms, &resp, &out, &n_out, st);
    if (ok) {
        rt_header_clear(resp);
        free(resp);
        if (echo) {
            *echo = out;
        } else {
            for (int i = 0; i < n_out; i++) dg_tensor_unref(out[i]);
            free(out);
        }
        if (n_echo) *n_echo = n_out;
    } else {
        dg_status_prepend(st, "ping %s", ep);
    }
    free(ep);
    return ok;
}

bool rt_server_push_bench(dg_server *client, const char *target_task_address, dg_tensor *t, int n_pushes,
                          int64_t timeout_ms, dg_status *st) {
    dg_status_reset(st);
    if (!client || !t || n_pushes < 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "push bench: a client server, a tensor and n_pushes >= 0 are required");
        return false;
    }
    char *ep = rt_endpoint_of(target_task_address, st);
    if (!ep) return false;
    rt_transport *tp = rt_server_env(client)->transport;
    // One DEALER carries everything to ep, and the task handles its messages in order: the
    // abort lands before the first value and the PING is answered after the last.
    int64_t step = rt_new_step_id();
    rt_header *h = new_header(RT_ABORT_STEP);
    h->step_id = step;
    h->code = DG_CANCELLED;
    rt_header_set_message(h, "transport benchmark: values are dropped");
    rt_push(tp, ep, h, NULL, 0);
    for (int i = 0; i < n_pushes; i++) {
        h = new_header(RT_TENSOR);
        h->step_id = step;
        char key[64];
        snprintf(key, sizeof key, "bench;0;bench;value;%d", i);
        h->key = strdup(key);
        if (!h->key) abort();
        rt_header_add_tensor(h, t);
        rt_push(tp, ep, h, &t, 1);
    }
    h = new_header(RT_PING);
    rt_header *resp = NULL;
    bool ok = rt_call_sync(tp, ep, h, NULL, 0, timeout_ms, &resp, NULL, NULL, st);
    if (ok) {
        rt_header_clear(resp);
        free(resp);
    } else {
        dg_status_prepend(st, "push bench to %s", ep);
    }
    h = new_header(RT_END_STEP);   // forgets the aborted step
    h->step_id = step;
    rt_push(tp, ep, h, NULL, 0);
    free(ep);
    return ok;
}
