/* The worker client (worker_client_impl.h): typed calls over the transport. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base_impl.h"
#include "distgraph/serialize.h"
#include "status_impl.h"
#include "worker_client_impl.h"

static rt_header *request(int type) {
    rt_header *h = malloc(sizeof *h);
    if (!h) abort();
    rt_header_init(h, type);
    return h;
}

static void drop_response(rt_header *resp) {
    if (!resp) return;
    rt_header_clear(resp);
    free(resp);
}

bool wc_register_graph(rt_transport *tp, const char *endpoint, const dg_graph *g, int64_t timeout_ms,
                       int64_t *handle, dg_status *st) {
    char *buf = NULL;
    size_t len = 0;
    if (!dg_graph_to_msgpack(g, &buf, &len, st)) return false;
    rt_header *h = request(RT_REGISTER_GRAPH);
    rt_header_set_blob(h, buf, len);
    free(buf);
    rt_header *resp = NULL;
    if (!rt_call_sync(tp, endpoint, h, NULL, 0, timeout_ms, &resp, NULL, NULL, st)) return false;
    *handle = resp->handle;
    drop_response(resp);
    return true;
}

void wc_deregister_graph(rt_transport *tp, const char *endpoint, int64_t handle) {
    rt_header *h = request(RT_DEREGISTER_GRAPH);
    h->handle = handle;
    rt_push(tp, endpoint, h, NULL, 0);
}

void wc_run_graph(rt_transport *tp, const char *endpoint, int64_t handle, int64_t step_id, int64_t timeout_ms,
                  bool trace, int parts, rt_response_cb done, void *arg) {
    rt_header *h = request(RT_RUN_GRAPH);
    h->handle = handle;
    h->step_id = step_id;
    h->trace = trace;
    h->parts = parts > 1 ? parts : 0;
    rt_call(tp, endpoint, h, NULL, 0, timeout_ms, done, arg);
}

void wc_ping(rt_transport *tp, const char *endpoint, int64_t timeout_ms, rt_response_cb done, void *arg) {
    rt_call(tp, endpoint, request(RT_PING), NULL, 0, timeout_ms, done, arg);
}

void wc_abort_step(rt_transport *tp, const char *endpoint, int64_t step_id, const dg_status *why) {
    rt_header *h = request(RT_ABORT_STEP);
    h->step_id = step_id;
    h->code = dg_status_code(why);
    rt_header_set_message(h, dg_status_message(why));
    rt_push(tp, endpoint, h, NULL, 0);
}

char **wc_list_devices(rt_transport *tp, const char *endpoint, int64_t timeout_ms, int *n, dg_status *st) {
    rt_header *resp = NULL;
    *n = 0;
    if (!rt_call_sync(tp, endpoint, request(RT_LIST_DEVICES), NULL, 0, timeout_ms, &resp, NULL, NULL, st))
        return NULL;
    char **list = calloc((size_t)resp->n_names + 1, sizeof *list);
    if (!list) abort();
    for (int k = 0; k < resp->n_names; k++)
        if (!(list[k] = strdup(resp->names[k]))) abort();
    *n = resp->n_names;
    drop_response(resp);
    return list;
}

bool wc_wait_for_task(rt_transport *tp, const char *endpoint, const char *task, int64_t max_wait_ms,
                      int64_t log_every_ms, const char *who, bool (*stopped)(void *arg, dg_status *why),
                      void *stop_arg, dg_status *st) {
    int64_t start = base_now_ms(), next_log = start + log_every_ms;
    dg_status refused = DG_STATUS_INIT;   // a refused handshake says more than a silence
    for (;;) {
        if (stopped && stopped(stop_arg, st)) {
            dg_status_prepend(st, "while waiting for %s at %s", task, endpoint);
            status_impl_clear(&refused);
            return false;
        }
        dg_status ping = DG_STATUS_INIT;
        rt_header *resp = NULL;
        int64_t attempt = base_now_ms();
        int64_t left = max_wait_ms > 0 ? start + max_wait_ms - attempt : 1000;
        bool ok = left > 0 && rt_call_sync(tp, endpoint, request(RT_PING), NULL, 0, left < 1000 ? left : 1000,
                                           &resp, NULL, NULL, &ping);
        drop_response(resp);
        if (!ok && dg_status_code(&ping) == DG_UNAUTHENTICATED) {   // keys: waiting will not help
            dg_status_copy(st, &ping);
            dg_status_prepend(st, "%s at %s", task, endpoint);
            status_impl_clear(&ping);
            status_impl_clear(&refused);
            return false;
        }
        if (!ok && strstr(dg_status_message(&ping), "refused")) dg_status_copy(&refused, &ping);
        if (ok) {
            status_impl_clear(&refused);
            if (log_every_ms > 0 && base_now_ms() >= start + log_every_ms)
                fprintf(stderr, "distgraph %s: %s at %s answers after %.1f s\n", who, task, endpoint,
                        (double)(base_now_ms() - start) / 1000.0);
            status_impl_clear(&ping);
            return true;
        }
        int64_t waited = base_now_ms() - start;
        if (max_wait_ms > 0 && waited >= max_wait_ms) {
            const dg_status *why = !dg_status_ok(&refused) ? &refused : &ping;
            dg_status_setf(st, DG_UNAVAILABLE, "%s at %s did not answer within %lld ms%s%s", task, endpoint,
                           (long long)max_wait_ms, dg_status_ok(why) ? "" : ": ",
                           dg_status_ok(why) ? "" : dg_status_message(why));
            status_impl_clear(&ping);
            status_impl_clear(&refused);
            return false;
        }
        if (log_every_ms > 0 && base_now_ms() >= next_log) {
            fprintf(stderr, "distgraph %s: waiting for %s at %s (no answer for %.0f s: %s)\n", who, task, endpoint,
                    (double)waited / 1000.0, dg_status_message(&ping));
            next_log = base_now_ms() + log_every_ms;
        }
        status_impl_clear(&ping);
        if (base_now_ms() - attempt < 200) {   // a call that failed at once: do not spin
            struct timespec pause = {0, 200 * 1000000};
            nanosleep(&pause, NULL);
        }
    }
}
