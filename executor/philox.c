/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a
 * counter-based generator, so the same (seed, seed2) gives the same stream on any device. */
#include <math.h>

#include "exec_philox_impl.h"

void exec_philox_init(exec_philox *p, uint64_t seed, uint64_t seed2) {
    p->key[0] = (uint32_t)seed;
    p->key[1] = (uint32_t)(seed >> 32);
    p->ctr[0] = 0;
    p->ctr[1] = 0;
    p->ctr[2] = (uint32_t)seed2;
    p->ctr[3] = (uint32_t)(seed2 >> 32);
    p->avail = 0;
}

static void philox_block(const uint32_t key_in[2], const uint32_t ctr_in[4], uint32_t out[4]) {
    uint32_t k0 = key_in[0], k1 = key_in[1];
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint32_t exec_philox_next(exec_philox *p) {
    if (p->avail == 0) {
        philox_block(p->key, p->ctr, p->buf);
        if (++p->ctr[0] == 0) ++p->ctr[1];
        p->avail = 4;
    }
    return p->buf[4 - p->avail--];
}

float exec_philox_uniform_f(exec_philox *p) {
    return (float)(exec_philox_next(p) >> 8) * (1.0f / 16777216.0f);
}

double exec_philox_uniform_d(exec_philox *p) {
    uint64_t hi = exec_philox_next(p) >> 5, lo = exec_philox_next(p) >> 6;
    return (double)(hi * 67108864ull + lo) * (1.0 / 9007199254740992.0);
}

double exec_philox_normal(exec_philox *p) {
    // Box-Muller; u1 in (0, 1] so the log is finite.
    double u1 = 1.0 - exec_philox_uniform_d(p);
    double u2 = exec_philox_uniform_d(p);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void exec_philox_init_node(exec_philox *p, const dg_node *n) {
    int64_t s = 0, s2 = 0;
    dg_node_attr_int(n, "seed", &s);
    dg_node_attr_int(n, "seed2", &s2);
    exec_philox_init(p, (uint64_t)s, (uint64_t)s2);
}
