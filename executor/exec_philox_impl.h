/* Random streams for kernels (philox.c): Philox 4x32-10, seeded per node. */
#ifndef DG_EXEC_PHILOX_IMPL_H
#define DG_EXEC_PHILOX_IMPL_H

#include <stdint.h>

#include "distgraph/graph.h"

// A seeded random stream for a kernel (Philox 4x32-10).
typedef struct exec_philox {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t buf[4];
    int avail;
} exec_philox;
void exec_philox_init(exec_philox *p, uint64_t seed, uint64_t seed2);
// The stream of a random node: its "seed" and "seed2" attributes (0 when absent).
void exec_philox_init_node(exec_philox *p, const dg_node *n);
uint32_t exec_philox_next(exec_philox *p);
// Uniform in [0, 1) with 24 (float) or 53 (double) bits.
float exec_philox_uniform_f(exec_philox *p);
double exec_philox_uniform_d(exec_philox *p);
double exec_philox_normal(exec_philox *p);

#endif
