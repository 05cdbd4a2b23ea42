/* CRC-32C (crc32c_impl.h). The portable path processes 8 bytes per step with eight tables
 * (each table k gives the CRC of a byte followed by k zero bytes), so the loop carries one
 * dependency per 8 bytes instead of one per byte. On x86-64 with SSE4.2 the crc32
 * instruction computes the same polynomial; the choice is made once, from CPUID. */
#include <pthread.h>
#include <string.h>

#include "crc32c_impl.h"

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++) table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
}

static uint32_t crc_portable(uint32_t crc, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        // The stream's first byte is the low byte of lo, whatever the host's byte order.
        uint32_t lo = ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24) ^ crc;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
              table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static int use_sse42 = -1;   // set once by init_once

static void init_once(void) {
    build_tables();
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    use_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    use_sse42 = 0;
#endif
}

uint32_t data_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&table_once, init_once);
    crc = ~crc;
#ifdef HAVE_SSE42_PATH
    if (use_sse42) return ~crc_sse42(crc, data, n);
#endif
    return ~crc_portable(crc, data, n);
}

uint32_t data_crc32c_portable(uint32_t crc, const void *data, size_t n) {
    pthread_once(&table_once, init_once);
    return ~crc_portable(~crc, data, n);
}

uint32_t data_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t data_crc32c_unmask(uint32_t masked) {
    uint32_t r = masked - 0xa282ead8u;
    return (r >> 17) | (r << 15);
}
