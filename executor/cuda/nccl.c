/* NCCL inside one process: its version and an all-reduce across local GPUs. Built when CMake
 * finds NCCL; nccl_none.c stands in otherwise. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>

#include "status_impl.h"
#include "cuda_impl.h"

static dg_code nccl_code(ncclResult_t r) {
    switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return DG_INVALID_ARGUMENT;
    case ncclRemoteError:
        return DG_UNAVAILABLE;
    default:
        return DG_INTERNAL;
    }
}

static void nccl_set_status(dg_status *st, ncclResult_t r, const char *call, const char *file,
                            int line) {
    const char *slash = strrchr(file, '/');
    const char *last = ncclGetLastError(NULL);
    char where[256] = "";
    if (status_impl_debug_errors()) snprintf(where, sizeof where, " [%s at %s:%d]", call, slash ? slash + 1 : file, line);
    dg_status_setf(st, nccl_code(r), "NCCL: %s%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
                   last ? last : "", where);
}

// The NCCL checking macro: records the call and NCCL's error text in st, jumps to fail.
#define NCCL_CHECK(call)                                                 \
    do {                                                                 \
        ncclResult_t nccl_err_ = (call);                                 \
        if (nccl_err_ != ncclSuccess) {                                  \
            nccl_set_status(st, nccl_err_, #call, __FILE__, __LINE__);   \
            goto fail;                                                   \
        }                                                                \
    } while (0)

bool exec_cuda_nccl_version(int *version, dg_status *st) {
    NCCL_CHECK(ncclGetVersion(version));
    return true;
fail:
    return false;
}

bool exec_cuda_all_reduce_sum_f32(exec_cuda_device *const *devs, float *const *bufs,
                                  int n_devs, int64_t n, dg_status *st) {
    ncclComm_t *comms = NULL;
    int *ids = NULL;
    int n_comms = 0;
    bool in_group = false;
    if (n_devs <= 0 || n < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "all-reduce of %lld floats over %d devices",
                       (long long)n, n_devs);
        return false;
    }
    comms = calloc((size_t)n_devs, sizeof *comms);
    ids = calloc((size_t)n_devs, sizeof *ids);
    if (!comms || !ids) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "all-reduce: %d communicators", n_devs);
        goto fail;
    }
    for (int i = 0; i < n_devs; i++) ids[i] = devs[i]->id;
    // One communicator per device for this call; caching them is for the collectives issue.
    NCCL_CHECK(ncclCommInitAll(comms, n_devs, ids));
    n_comms = n_devs;
    NCCL_CHECK(ncclGroupStart());
    in_group = true;
    for (int i = 0; i < n_devs; i++)
        NCCL_CHECK(ncclAllReduce(bufs[i], bufs[i], (size_t)n, ncclFloat, ncclSum, comms[i],
                                 devs[i]->stream));
    in_group = false;
    NCCL_CHECK(ncclGroupEnd());
    for (int i = 0; i < n_devs; i++) {
        CUDA_CHECK(cudaSetDevice(devs[i]->id));
        CUDA_CHECK(cudaStreamSynchronize(devs[i]->stream));
    }
    for (int i = 0; i < n_comms; i++) (void)ncclCommDestroy(comms[i]);
    free(ids);
    free(comms);
    return true;
fail:
    if (in_group) (void)ncclGroupEnd();
    for (int i = 0; i < n_comms; i++) (void)ncclCommDestroy(comms[i]);
    free(ids);
    free(comms);
    dg_status_prepend(st, "all-reduce of %lld floats over %d GPUs", (long long)n, n_devs);
    return false;
}

// ---- cached communicators for repeated all-reduces over the same GPUs ----

typedef struct comm_set {
    int n;
    int *ids;
    ncclComm_t *comms;
    struct comm_set *next;
} comm_set;

static pthread_mutex_t comms_mu = PTHREAD_MUTEX_INITIALIZER;   // also serialises the launches
static comm_set *comm_sets;

// The communicators of devs (in order), created on first use. Called with comms_mu held.
static comm_set *comms_for(exec_cuda_device *const *devs, int n, dg_status *st) {
    for (comm_set *c = comm_sets; c; c = c->next) {
        bool same = c->n == n;
        for (int i = 0; same && i < n; i++) same = c->ids[i] == devs[i]->id;
        if (same) return c;
    }
    comm_set *c = calloc(1, sizeof *c);
    if (c) c->ids = calloc((size_t)n, sizeof *c->ids);
    if (c) c->comms = calloc((size_t)n, sizeof *c->comms);
    if (!c || !c->ids || !c->comms) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "NCCL: %d communicators", n);
        goto fail;
    }
    c->n = n;
    for (int i = 0; i < n; i++) c->ids[i] = devs[i]->id;
    NCCL_CHECK(ncclCommInitAll(c->comms, n, c->ids));
    c->next = comm_sets;
    comm_sets = c;
    return c;
fail:
    if (c) {
        free(c->ids);
        free(c->comms);
        free(c);
    }
    return NULL;
}

void exec_cuda_nccl_release(void) {
    pthread_mutex_lock(&comms_mu);
    while (comm_sets) {
        comm_set *c = comm_sets;
        comm_sets = c->next;
        for (int i = 0; i < c->n; i++)
            if (c->comms[i]) (void)ncclCommDestroy(c->comms[i]);
        free(c->ids);
        free(c->comms);
        free(c);
    }
    pthread_mutex_unlock(&comms_mu);
}

bool exec_cuda_nccl_all_reduce(exec_cuda_device *const *devs, void *const *bufs, int n_devs,
                               int64_t count, bool f64, bool mean, dg_status *st) {
    bool in_group = false;
    if (n_devs <= 0 || count < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "all-reduce of %lld elements over %d devices",
                       (long long)count, n_devs);
        return false;
    }
    pthread_mutex_lock(&comms_mu);
    comm_set *c = comms_for(devs, n_devs, st);
    if (!c) goto fail;
    NCCL_CHECK(ncclGroupStart());
    in_group = true;
    for (int i = 0; i < n_devs; i++)
        NCCL_CHECK(ncclAllReduce(bufs[i], bufs[i], (size_t)count, f64 ? ncclDouble : ncclFloat,
                                 mean ? ncclAvg : ncclSum, c->comms[i], devs[i]->stream));
    in_group = false;
    NCCL_CHECK(ncclGroupEnd());
    pthread_mutex_unlock(&comms_mu);
    return true;
fail:
    if (in_group) (void)ncclGroupEnd();
    pthread_mutex_unlock(&comms_mu);
    dg_status_prepend(st, "NCCL all-reduce of %lld %s over %d GPUs", (long long)count,
                      f64 ? "doubles" : "floats", n_devs);
    return false;
}
