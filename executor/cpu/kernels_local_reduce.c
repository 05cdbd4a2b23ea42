/* LocalAllReduce across the devices of one task (local_reduce_impl.h): the group and its
 * rounds, the host reduction, and the CPU kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "device.h"
#include "exec_executor_impl.h"
#include "exec_kernel_registry_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_resources_impl.h"
#include "local_reduce_impl.h"
#include "status_impl.h"

#define LAR_ABORTED_KEPT 64

struct lar_round {
    int64_t step_id;
    int arrived;
    dg_tensor **ins;            // per rank, a reference each
    exec_async_handle *hs;      // per rank
    lar_kernel **ks;            // per rank
    int64_t cancel_token;
    exec_rendezvous *rv;        // borrowed; NULL without a rendezvous
    void *cancel_arg;
    lar_round *next;
};

typedef struct lar_group {
    pthread_mutex_t mu;
    int size;
    lar_round *rounds;
    int64_t aborted[LAR_ABORTED_KEPT];   // steps aborted lately: late arrivals fail at once
    dg_status aborted_why[LAR_ABORTED_KEPT];
    int n_aborted;
} lar_group;

typedef struct lar_cancel {
    lar_group *g;
    int64_t step_id;
} lar_cancel;

static void *group_create(void *arg, dg_status *st) {
    lar_group *g = calloc(1, sizeof *g);
    if (!g) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "LocalAllReduce group: out of memory");
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    g->size = *(int *)arg;
    for (int i = 0; i < LAR_ABORTED_KEPT; i++) g->aborted[i] = -1;
    return g;
}

static void round_free(lar_round *r, int size) {
    if (!r) return;
    for (int i = 0; r->ins && i < size; i++) dg_tensor_unref(r->ins[i]);
    free(r->ins);
    free(r->hs);
    free(r->ks);
    free(r);
}

static void group_destroy(void *obj) {
    lar_group *g = obj;
    while (g->rounds) {
        lar_round *r = g->rounds;
        g->rounds = r->next;
        round_free(r, g->size);
    }
    for (int i = 0; i < LAR_ABORTED_KEPT; i++) status_impl_clear(&g->aborted_why[i]);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

bool lar_kernel_init(lar_kernel *k, const dg_node *n, const exec_env *env, dg_status *st) {
    int64_t rank = 0, size = 0;
    dg_node_attr_int(n, "rank", &rank);
    dg_node_attr_int(n, "num_devices", &size);
    const char *red = dg_node_attr_string(n, "reduction");
    const char *shared = dg_node_attr_string(n, "shared_name");
    memset(k, 0, sizeof *k);
    k->rank = (int)rank;
    k->size = (int)size;
    k->mean = red && strcmp(red, "mean") == 0;
    if (!(k->shared_name = strdup(shared ? shared : ""))) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    int sz = k->size;
    k->group = exec_resources_object(env->rm, "LocalAllReduce", k->shared_name, group_create, &sz,
                                     group_destroy, st);
    if (k->group && ((lar_group *)k->group)->size != k->size) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "LocalAllReduce group \"%s\" has %d devices, this node "
                       "says %d", k->shared_name, ((lar_group *)k->group)->size, k->size);
        k->group = NULL;
    }
    if (!k->group) {
        free(k->shared_name);
        k->shared_name = NULL;
        return false;
    }
    return true;
}

void lar_kernel_clear(lar_kernel *k) {
    free(k->shared_name);
    k->shared_name = NULL;
}

// The host path: the inputs summed in rank order (then divided by the count), one tensor that
// every CPU participant shares and that device participants copy to their devices.
static bool host_reduce(lar_round *r, int n, bool mean, dg_tensor **outs, dg_status *st) {
    dg_tensor *sum = NULL;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        dg_tensor *h = exec_tensor_to_host(r->ins[i], st);
        if (!h) {
            ok = false;
            break;
        }
        if (i == 0) {
            sum = dg_tensor_copy(h, st);
            ok = sum != NULL;
        } else if (h->dtype == DG_FLOAT32) {
            float *a = sum->data;
            const float *b = h->data;
            for (int64_t e = 0; e < sum->n_elements; e++) a[e] += b[e];
        } else {
            double *a = sum->data;
            const double *b = h->data;
            for (int64_t e = 0; e < sum->n_elements; e++) a[e] += b[e];
        }
        dg_tensor_unref(h);
    }
    if (ok && mean && n > 1) {
        if (sum->dtype == DG_FLOAT32) {
            float *a = sum->data;
            for (int64_t e = 0; e < sum->n_elements; e++) a[e] /= (float)n;
        } else {
            double *a = sum->data;
            for (int64_t e = 0; e < sum->n_elements; e++) a[e] /= (double)n;
        }
    }
    for (int i = 0; i < n && ok; i++) {
        lar_kernel *k = r->ks[i];
        outs[i] = k->device ? k->to_device(k->device, sum, st) : dg_tensor_ref(sum);
        ok = outs[i] != NULL;
    }
    dg_tensor_unref(sum);
    return ok;
}

// Runs on the last arrival, outside the group's lock: reduces and completes every participant.
static void reduce_round(lar_round *r, int n) {
    dg_status *st = dg_status_new();
    dg_tensor **outs = calloc((size_t)n, sizeof *outs);
    void **devices = calloc((size_t)n, sizeof *devices);
    if (!outs || !devices) abort();
    bool all_device = true;
    for (int i = 0; i < n; i++) {
        devices[i] = r->ks[i]->device;
        all_device = all_device && r->ks[i]->device && r->ks[i]->device_reduce;
    }
    bool ok = false, done = false;
    if (all_device) {
        done = r->ks[0]->device_reduce(r->ins, devices, n, r->ks[0]->mean, outs, st);
        // UNIMPLEMENTED (no NCCL, say) is not an error: the host reduces instead.
        if (!done && dg_status_code(st) == DG_UNIMPLEMENTED) dg_status_reset(st);
        ok = done;
        if (!done && !dg_status_ok(st)) done = true;
    }
    if (!done) ok = host_reduce(r, n, r->ks[0]->mean, outs, st);
    if (!ok)
        for (int i = 0; i < n; i++) dg_tensor_free(&outs[i]);
    for (int i = 0; i < n; i++) exec_async_done(r->hs[i], ok ? outs[i] : NULL, ok ? NULL : st);
    free(outs);
    free(devices);
    dg_status_free(&st);
}

static void on_cancel(void *arg, const dg_status *why) {
    lar_cancel *c = arg;
    lar_group *g = c->g;
    lar_round *r = NULL;
    pthread_mutex_lock(&g->mu);
    for (lar_round **p = &g->rounds; *p; p = &(*p)->next)
        if ((*p)->step_id == c->step_id) {
            r = *p;
            *p = r->next;
            break;
        }
    int slot = g->n_aborted++ % LAR_ABORTED_KEPT;
    g->aborted[slot] = c->step_id;
    dg_status_copy(&g->aborted_why[slot], why);
    pthread_mutex_unlock(&g->mu);
    if (r) {
        for (int i = 0; i < g->size; i++)
            if (r->ins[i]) exec_async_done(r->hs[i], NULL, why);
        round_free(r, g->size);
    }
    free(c);
}

void lar_arrive(lar_kernel *k, exec_ctx *ctx, exec_async_handle h) {
    lar_group *g = k->group;
    const exec_step_options *o = exec_step_opts(ctx->step);
    dg_tensor *x = ctx->inputs[0];
    if (!x || (x->dtype != DG_FLOAT32 && x->dtype != DG_FLOAT64)) {
        exec_fail(ctx, DG_INVALID_ARGUMENT, "LocalAllReduce takes float32 or float64");
        exec_async_done(h, NULL, ctx->st);
        return;
    }
    if (k->size == 1) {
        exec_async_done(h, dg_tensor_ref(x), NULL);
        return;
    }
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < LAR_ABORTED_KEPT; i++)
        if (g->aborted[i] == o->step_id) {
            dg_status_copy(ctx->st, &g->aborted_why[i]);
            pthread_mutex_unlock(&g->mu);
            exec_async_done(h, NULL, ctx->st);
            return;
        }
    lar_round *r = g->rounds;
    while (r && r->step_id != o->step_id) r = r->next;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (r) {
            r->ins = calloc((size_t)g->size, sizeof *r->ins);
            r->hs = calloc((size_t)g->size, sizeof *r->hs);
            r->ks = calloc((size_t)g->size, sizeof *r->ks);
        }
        if (!r || !r->ins || !r->hs || !r->ks) abort();
        r->step_id = o->step_id;
        r->rv = o->rendezvous;
        r->next = g->rounds;
        g->rounds = r;
    }
    const char *err = NULL;
    char b1[128], b2[128];
    dg_tensor *first = NULL;
    for (int i = 0; i < g->size && !first; i++) first = r->ins[i];
    if (r->ins[k->rank]) err = "ran twice in one step";
    else if (first && (first->dtype != x->dtype || !dg_shape_equal(&first->shape, &x->shape)))
        err = "has an input unlike the others'";
    if (err) {
        pthread_mutex_unlock(&g->mu);
        exec_fail(ctx, DG_INVALID_ARGUMENT, "LocalAllReduce \"%s\" rank %d %s (%s %s vs %s %s)",
                  k->shared_name, k->rank, err, dg_dtype_name(x->dtype),
                  dg_shape_str(&x->shape, b1, sizeof b1), first ? dg_dtype_name(first->dtype) : "-",
                  first ? dg_shape_str(&first->shape, b2, sizeof b2) : "-");
        exec_async_done(h, NULL, ctx->st);
        return;
    }
    r->ins[k->rank] = dg_tensor_ref(x);
    r->hs[k->rank] = h;
    r->ks[k->rank] = k;
    bool last = ++r->arrived == g->size;
    bool first_arrival = r->arrived == 1;
    if (last)
        for (lar_round **p = &g->rounds; *p; p = &(*p)->next)
            if (*p == r) {
                *p = r->next;
                break;
            }
    pthread_mutex_unlock(&g->mu);
    if (first_arrival && !last && r->rv) {
        // The wait ends with the step: an abort fails whoever has arrived.
        lar_cancel *c = malloc(sizeof *c);
        if (!c) abort();
        c->g = g;
        c->step_id = o->step_id;
        dg_status why = DG_STATUS_INIT;
        int64_t token = exec_rendezvous_on_cancel(r->rv, o->step_id, on_cancel, c, &why);
        if (!token) {
            // Already aborted: run the cancellation ourselves.
            on_cancel(c, &why);
        } else {
            pthread_mutex_lock(&g->mu);
            // r may be gone (completed by the last arrival): compare, never dereference.
            lar_round *q = g->rounds;
            while (q && !(q == r && q->step_id == o->step_id)) q = q->next;
            bool pending = q != NULL;
            if (pending) {
                r->cancel_token = token;
                r->cancel_arg = c;
            }
            pthread_mutex_unlock(&g->mu);
            // The round completed meanwhile (the last arrival did not see the token yet).
            if (!pending && exec_rendezvous_forget_cancel(o->rendezvous, token)) free(c);
        }
        status_impl_clear(&why);
        return;
    }
    if (!last) return;
    // Completed: the canceller, if registered, is no longer wanted.
    if (r->cancel_token && exec_rendezvous_forget_cancel(r->rv, r->cancel_token)) free(r->cancel_arg);
    reduce_round(r, g->size);
    round_free(r, g->size);
}

// ---- the CPU kernel ----

static void *lar_cpu_create(const dg_node *n, const exec_env *env, dg_status *st) {
    lar_kernel *k = malloc(sizeof *k);
    if (!k) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (!lar_kernel_init(k, n, env, st)) {
        free(k);
        return NULL;
    }
    return k;
}

static void lar_cpu_destroy(void *state) {
    lar_kernel_clear(state);
    free(state);
}

static void lar_cpu_start(void *state, exec_ctx *ctx, exec_async_handle h) { lar_arrive(state, ctx, h); }

static const exec_kernel_def local_reduce_kernels[] = {
    {"LocalAllReduce", "CPU", DT_FLOATS, lar_cpu_create, NULL, lar_cpu_destroy, true, false, false,
     lar_cpu_start, false},
};

void cpu_register_local_reduce_kernels(void) {
    exec_register_kernels(local_reduce_kernels,
                          (int)(sizeof local_reduce_kernels / sizeof local_reduce_kernels[0]));
}
