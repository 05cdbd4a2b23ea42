/* CPU kernels of synchronous replicas: conditional accumulators and the token queue. */
#include "cpu_impl.h"

void cpu_register_sync_kernels(void) {}
