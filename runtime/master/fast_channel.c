/* The local channel of a remote session (fast_channel_impl.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fast_channel_impl.h"
#include "status_impl.h"
#include "tensor_impl.h"

#define HEADER_BYTES ((size_t)4096)
#define REGION_BYTES (HEADER_BYTES + 2 * FC_HALF_BYTES)
#define FC_MAGIC 0x314C4E4843464744ull   // "DGFCHNL1", little-endian
#define FC_VERSION 1u

typedef struct fc_header {
    uint64_t magic;
    uint32_t version;
    uint32_t creator_pid;
    uint64_t region_bytes;
    uint64_t half_bytes;
    atomic_uint seq[2];      // futex words: bumped when a side's message is published
    atomic_uint closed;      // futex-woken on both words when set
    atomic_uint claimed;     // set by the one master that attaches
    atomic_uint waiters[2];  // threads in FUTEX_WAIT on each word: a post wakes only if any
    _Atomic uint64_t len[2]; // bytes of each side's message
} fc_header;

_Static_assert(sizeof(fc_header) <= HEADER_BYTES, "the header fits its page");

struct fc_region {
    char name[FC_NAME_BYTES];
    bool linked;             // the creator still holds the name
    unsigned char *base;
    fc_header *hdr;
};

static atomic_uint next_region;

static long futex(atomic_uint *word, int op, unsigned val, const struct timespec *rel) {
    // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
    return syscall(SYS_futex, (unsigned *)word, op, val, rel, NULL, 0);
}

fc_region *fc_create(dg_status *st) {
    rt_shm_remove_stale("dg-fc-");   // a crash between creating and unlinking leaves one
    fc_region *r = calloc(1, sizeof *r);
    if (!r) abort();
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (uint32_t)time(NULL);
    snprintf(r->name, sizeof r->name, "/dg-fc-%u-%u-%08x", (unsigned)getpid(), atomic_fetch_add(&next_region, 1), rnd);
    int fd = shm_open(r->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        dg_status_setf(st, DG_UNAVAILABLE, "shm_open %s: %s", r->name, strerror(errno));
        free(r);
        return NULL;
    }
    // Reserved now: a full /dev/shm must fail here, not raise SIGBUS in a later memcpy.
    int rc = posix_fallocate(fd, 0, (off_t)REGION_BYTES);
    void *m = rc == 0 ? mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "reserving %zu bytes of shared memory for %s: %s", REGION_BYTES,
                       r->name, strerror(rc ? rc : errno));
        shm_unlink(r->name);
        free(r);
        return NULL;
    }
    r->linked = true;
    r->base = m;
    r->hdr = m;
    r->hdr->version = FC_VERSION;
    r->hdr->creator_pid = (uint32_t)getpid();
    r->hdr->region_bytes = REGION_BYTES;
    r->hdr->half_bytes = FC_HALF_BYTES;
    atomic_thread_fence(memory_order_release);
    r->hdr->magic = FC_MAGIC;
    return r;
}

const char *fc_name(const fc_region *r) { return r->name; }

void fc_unlink(fc_region *r) {
    if (r && r->linked) {
        shm_unlink(r->name);
        r->linked = false;
    }
}

fc_region *fc_attach(const char *name, dg_status *st) {
    unsigned pid, num, rnd;
    char tail, canonical[FC_NAME_BYTES];
    if (!name || strlen(name) >= FC_NAME_BYTES || sscanf(name, "/dg-fc-%u-%u-%x%c", &pid, &num, &rnd, &tail) != 3 ||
        (snprintf(canonical, sizeof canonical, "/dg-fc-%u-%u-%08x", pid, num, rnd), strcmp(canonical, name) != 0)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "the channel's name is not /dg-fc-<pid>-<n>-<8 hex digits>");
        return NULL;
    }
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "channel %s: %s (another host, or another /dev/shm?)", name,
                       strerror(errno));
        return NULL;
    }
    struct stat sb;
    const char *bad = NULL;
    if (fstat(fd, &sb) != 0) bad = "cannot be examined";
    else if (!S_ISREG(sb.st_mode)) bad = "is not a regular file";
    else if (sb.st_uid != geteuid()) bad = "belongs to another user";
    else if ((sb.st_mode & 0777) != 0600) bad = "is not mode 0600";
    else if ((size_t)sb.st_size != REGION_BYTES) bad = "has the wrong size";
    void *m = bad ? MAP_FAILED : mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "channel %s %s", name, bad ? bad : strerror(errno));
        return NULL;
    }
    fc_header *h = m;
    unsigned unclaimed = 0;
    if (h->magic != FC_MAGIC || h->version != FC_VERSION || h->region_bytes != REGION_BYTES ||
        h->half_bytes != FC_HALF_BYTES || h->creator_pid != pid) {
        munmap(m, REGION_BYTES);
        dg_status_setf(st, DG_INVALID_ARGUMENT, "channel %s: its header is not that of a channel of this version", name);
        return NULL;
    }
    if (!atomic_compare_exchange_strong(&h->claimed, &unclaimed, 1)) {   // one master per region
        munmap(m, REGION_BYTES);
        dg_status_setf(st, DG_FAILED_PRECONDITION, "channel %s is attached already", name);
        return NULL;
    }
    fc_region *r = calloc(1, sizeof *r);
    if (!r) abort();
    snprintf(r->name, sizeof r->name, "%s", name);
    r->base = m;
    r->hdr = h;
    return r;
}

void fc_free(fc_region **rp) {
    if (!rp || !*rp) return;
    fc_region *r = *rp;
    fc_unlink(r);
    munmap(r->base, REGION_BYTES);
    free(r);
    *rp = NULL;
}

static unsigned char *half(fc_region *r, int side) { return r->base + HEADER_BYTES + (size_t)side * FC_HALF_BYTES; }

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

bool fc_put(fc_region *r, int side, const rt_header *h, dg_tensor *const *ts, int n, rt_shm_pool *shm) {
    size_t hdr_len = 0;
    char *hdr = rt_header_encode(h, &hdr_len);
    // Only a message that fits with every tensor inline is written: then it fits whichever
    // tensors the slots take (a descriptor is smaller than the bytes it stands for), and no
    // slot is taken for a message that then goes over the socket.
    size_t need = 8 + pad8(hdr_len);
    for (int i = 0; i < n; i++) need += 8 + pad8(ts[i] ? ts[i]->nbytes : 0);
    if (need > FC_HALF_BYTES) {
        free(hdr);
        return false;
    }
    unsigned char *start = half(r, side), *p = start;
    uint64_t len = hdr_len;
    memcpy(p, &len, 8);
    memcpy(p + 8, hdr, hdr_len);
    free(hdr);
    p += 8 + pad8(hdr_len);
    for (int i = 0; i < n; i++) {
        size_t nb = ts[i] ? ts[i]->nbytes : 0;
        unsigned char desc[RT_SHM_DESC_BYTES];
        if (nb && shm && rt_shm_put(shm, ts[i]->data, nb, desc)) {   // read in place by the other side
            len = RT_SHM_DESC_BYTES;
            memcpy(p, &len, 8);
            memcpy(p + 8, desc, RT_SHM_DESC_BYTES);
            p += 8 + pad8(RT_SHM_DESC_BYTES);
        } else {
            len = nb;
            memcpy(p, &len, 8);
            if (nb) memcpy(p + 8, ts[i]->data, nb);
            p += 8 + pad8(nb);
        }
    }
    atomic_store_explicit(&r->hdr->len[side], (uint64_t)(p - start), memory_order_relaxed);
    return true;
}

void fc_put_raw(fc_region *r, int side, const void *bytes, size_t len, uint64_t declared_len) {
    memcpy(half(r, side), bytes, len < FC_HALF_BYTES ? len : FC_HALF_BYTES);
    atomic_store_explicit(&r->hdr->len[side], declared_len, memory_order_relaxed);
}

void fc_post(fc_region *r, int side) {
    // Sequentially consistent with the waiter's increment of waiters and its re-read of seq:
    // either it sees the new sequence, or we see it waiting and wake it.
    atomic_fetch_add(&r->hdr->seq[side], 1);
    if (atomic_load(&r->hdr->waiters[side])) futex(&r->hdr->seq[side], FUTEX_WAKE, INT_MAX, NULL);
}

uint32_t fc_seq(fc_region *r, int side) { return atomic_load_explicit(&r->hdr->seq[side], memory_order_acquire); }

bool fc_closed(fc_region *r) { return atomic_load_explicit(&r->hdr->closed, memory_order_acquire) != 0; }

void fc_close(fc_region *r) {
    if (!r) return;
    atomic_store_explicit(&r->hdr->closed, 1, memory_order_release);
    // A waiter between its check and FUTEX_WAIT misses this wake-up and sees the close when
    // its wait times out: every wait is bounded.
    for (int side = 0; side < 2; side++) futex(&r->hdr->seq[side], FUTEX_WAKE, INT_MAX, NULL);
}

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

fc_wait_result fc_wait_spin(fc_region *r, int side, uint32_t *seen, int64_t spin_us) {
    int64_t until = mono_ns() + spin_us * 1000;
    do {
        uint32_t now = fc_seq(r, side);
        if (now != *seen) {
            *seen = now;
            return FC_READY;
        }
        if (fc_closed(r)) return FC_CLOSED;
        sched_yield();
    } while (mono_ns() < until);
    return FC_TIMEOUT;
}

fc_wait_result fc_wait(fc_region *r, int side, uint32_t *seen, int64_t timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    for (;;) {
        uint32_t now = fc_seq(r, side);   // a message posted before the close is still read
        if (now != *seen) {
            *seen = now;
            return FC_READY;
        }
        if (fc_closed(r)) return FC_CLOSED;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t left_ns = (int64_t)(until.tv_sec - t.tv_sec) * 1000000000 + (until.tv_nsec - t.tv_nsec);
        if (left_ns <= 0) return FC_TIMEOUT;
        struct timespec rel = {(time_t)(left_ns / 1000000000), (long)(left_ns % 1000000000)};
        atomic_fetch_add(&r->hdr->waiters[side], 1);
        if (atomic_load(&r->hdr->seq[side]) == now) futex(&r->hdr->seq[side], FUTEX_WAIT, now, &rel);
        atomic_fetch_sub(&r->hdr->waiters[side], 1);
    }
}

bool fc_take(fc_region *r, int side, rt_header *h, dg_tensor ***tsp, int *np, dg_status *st) {
    *tsp = NULL;
    *np = 0;
    rt_header_init(h, 0);
    const unsigned char *base = half(r, side);
    uint64_t total = atomic_load_explicit(&r->hdr->len[side], memory_order_relaxed), len;
    if (total > FC_HALF_BYTES || total < 8) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "local channel: a message of %llu bytes in a half of %zu",
                       (unsigned long long)total, FC_HALF_BYTES);
        return false;
    }
    memcpy(&len, base, 8);
    if (len > total - 8) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "local channel: a header of %llu bytes in a message of %llu",
                       (unsigned long long)len, (unsigned long long)total);
        return false;
    }
    // Copied out first: the other side may write while we decode.
    char *copy = malloc(len ? len : 1);
    if (!copy) abort();
    memcpy(copy, base + 8, len);
    bool ok = rt_header_decode(copy, len, h, st);
    free(copy);
    if (!ok) {
        dg_status_prepend(st, "local channel");
        return false;
    }
    size_t off = 8 + pad8(len);
    dg_tensor **ts = calloc((size_t)h->n_tensors + 1, sizeof *ts);
    if (!ts) abort();
    for (int i = 0; ok && i < h->n_tensors; i++) {
        const rt_tensor_desc *d = &h->tensors[i];
        uint64_t flen;
        if (off + 8 > total) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "local channel: tensor %d of %d is missing", i, h->n_tensors);
            ok = false;
            break;
        }
        memcpy(&flen, base + off, 8);
        off += 8;
        if (flen > total - off) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "local channel: tensor %d has %llu bytes, past the message's end", i,
                           (unsigned long long)flen);
            ok = false;
            break;
        }
        unsigned char frame[RT_SHM_DESC_BYTES];
        if (flen == RT_SHM_DESC_BYTES && d->nbytes != RT_SHM_DESC_BYTES) {
            memcpy(frame, base + off, RT_SHM_DESC_BYTES);
            if (rt_shm_is_desc(frame, RT_SHM_DESC_BYTES, d->nbytes)) ts[i] = rt_shm_tensor(frame, d->dtype, d->shape, d->nbytes, st);
            else dg_status_setf(st, DG_INVALID_ARGUMENT, "local channel: tensor %d has %llu bytes, its header says %llu", i,
                                (unsigned long long)flen, (unsigned long long)d->nbytes);
        } else if (flen != d->nbytes) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "local channel: tensor %d has %llu bytes, its header says %llu", i,
                           (unsigned long long)flen, (unsigned long long)d->nbytes);
        } else {
            ts[i] = dg_tensor_from_data(d->dtype, d->shape, base + off, st);
        }
        ok = ts[i] != NULL;
        off += pad8(flen);
    }
    if (!ok) {
        for (int i = 0; i < h->n_tensors; i++) dg_tensor_unref(ts[i]);
        free(ts);
        rt_header_clear(h);
        return false;
    }
    *tsp = ts;
    *np = h->n_tensors;
    return true;
}
