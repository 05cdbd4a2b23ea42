/* The count of this process's threads computing right now (exec_threads_computing in
 * exec_executor_impl.h): kernels inside their compute function (executor.c) and the intra-op
 * helpers working for them (cpu/gemm.c's cpu_parallel_for). A file of its own that uses nothing,
 * so that both can count without either using the other. */
#include <stdatomic.h>

#include "exec_executor_impl.h"

static atomic_int threads_computing;

int exec_threads_computing(void) { return atomic_load_explicit(&threads_computing, memory_order_relaxed); }

void exec_threads_computing_add(int d) { atomic_fetch_add_explicit(&threads_computing, d, memory_order_relaxed); }
