/* Stands in for nccl.c when CMake finds no NCCL: the collectives report UNIMPLEMENTED. */
#include "cuda_impl.h"

bool exec_cuda_nccl_version(int *version, dg_status *st) {
    *version = 0;
    dg_status_set(st, DG_UNIMPLEMENTED, "NCCL: distgraph was built without NCCL");
    return false;
}

bool exec_cuda_all_reduce_sum_f32(exec_cuda_device *const *devs, float *const *bufs,
                                  int n_devs, int64_t n, dg_status *st) {
    dg_status_setf(st, DG_UNIMPLEMENTED,
                   "all-reduce of %lld floats over %d GPUs: distgraph was built without NCCL",
                   (long long)n, n_devs);
    return false;
}

bool exec_cuda_nccl_all_reduce(exec_cuda_device *const *devs, void *const *bufs, int n_devs,
                               int64_t count, bool f64, bool mean, dg_status *st) {
    (void)devs;
    (void)bufs;
    (void)f64;
    (void)mean;
    dg_status_setf(st, DG_UNIMPLEMENTED,
                   "all-reduce of %lld elements over %d GPUs: distgraph was built without NCCL",
                   (long long)count, n_devs);
    return false;
}

void exec_cuda_nccl_release(void) {}
