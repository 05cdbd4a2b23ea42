/* Shared-memory slots for tensor frames between processes of one host (shm_impl.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm_impl.h"

#define HEADER_BYTES ((size_t)4096)
#define REGION_BYTES (HEADER_BYTES + (size_t)RT_SHM_SLOTS * RT_SHM_SLOT_BYTES)
#define REGION_MAGIC 0x0031304D48534744ull   // "DGSHM01" and a 0 byte, little-endian
#define REGION_VERSION 1u

typedef struct region_header {
    uint64_t magic;
    uint32_t version;
    uint32_t n_slots;
    uint64_t slot_bytes;
    uint64_t region_bytes;
    uint32_t creator_pid;
    uint32_t nonce;                    // random: tells this region from an earlier one of the
                                       // same name (a dead process whose pid came back)
    atomic_uint state[RT_SHM_SLOTS];   // 0 free, 1 in flight (sent), 2 being read
} region_header;

_Static_assert(sizeof(region_header) <= HEADER_BYTES, "the slot states fit the header page");

typedef struct desc {
    char magic[8];
    uint32_t pid;
    uint32_t region;
    uint64_t offset;
    uint64_t len;
    uint32_t slot;
    uint32_t nonce;   // the region's
} desc;

_Static_assert(sizeof(desc) == RT_SHM_DESC_BYTES, "descriptor layout");

struct rt_shm_pool {
    char name[64];
    uint32_t pid, region, nonce;
    unsigned char *base;
    region_header *hdr;
};

static atomic_uint next_region;

static void region_name(char *buf, size_t cap, uint32_t pid, uint32_t region) {
    snprintf(buf, cap, "/dg-shm-%u-%u", pid, region);
}

void rt_shm_remove_stale(const char *prefix) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    size_t plen = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned pid;
        char dash;
        if (strncmp(e->d_name, prefix, plen) != 0 || sscanf(e->d_name + plen, "%u%c", &pid, &dash) != 2 || dash != '-')
            continue;
        if (pid == 0 || (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
    }
    closedir(d);
}

rt_shm_pool *rt_shm_pool_new(dg_status *st) {
    rt_shm_remove_stale("dg-shm-");
    rt_shm_pool *p = calloc(1, sizeof *p);
    if (!p) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "shared memory pool: out of memory");
        return NULL;
    }
    p->pid = (uint32_t)getpid();
    p->region = atomic_fetch_add(&next_region, 1);
    region_name(p->name, sizeof p->name, p->pid, p->region);
    if (getrandom(&p->nonce, sizeof p->nonce, 0) != (ssize_t)sizeof p->nonce)
        p->nonce = (uint32_t)time(NULL) ^ (p->pid << 8) ^ p->region;
    int fd = shm_open(p->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        // This process has not made this (pid, number) yet: the name is left from a dead
        // process that had our pid.
        shm_unlink(p->name);
        fd = shm_open(p->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0) {
        dg_status_setf(st, DG_UNAVAILABLE, "shm_open %s: %s", p->name, strerror(errno));
        free(p);
        return NULL;
    }
    // Reserved now, not on first touch: a full /dev/shm (a container's is often 64 MB) must
    // turn shared memory off here, not kill the process with SIGBUS in a later memcpy.
    int rc = posix_fallocate(fd, 0, (off_t)REGION_BYTES);
    if (rc != 0) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "reserving %zu bytes for %s: %s", REGION_BYTES,
                       p->name, strerror(rc));
        close(fd);
        shm_unlink(p->name);
        free(p);
        return NULL;
    }
    void *m = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "mmap %s (%zu bytes): %s", p->name, REGION_BYTES,
                       strerror(errno));
        shm_unlink(p->name);
        free(p);
        return NULL;
    }
    p->base = m;
    p->hdr = m;
    p->hdr->version = REGION_VERSION;
    p->hdr->n_slots = RT_SHM_SLOTS;
    p->hdr->slot_bytes = RT_SHM_SLOT_BYTES;
    p->hdr->region_bytes = REGION_BYTES;
    p->hdr->creator_pid = p->pid;
    p->hdr->nonce = p->nonce;
    for (int i = 0; i < RT_SHM_SLOTS; i++) atomic_init(&p->hdr->state[i], 0);
    atomic_thread_fence(memory_order_release);
    p->hdr->magic = REGION_MAGIC;   // last: a reader that sees it sees the rest
    return p;
}

void rt_shm_pool_free(rt_shm_pool **pp) {
    if (!pp || !*pp) return;
    rt_shm_pool *p = *pp;
    // Receivers that mapped the region keep it (and their slots) until they let go.
    shm_unlink(p->name);
    munmap(p->base, REGION_BYTES);
    free(p);
    *pp = NULL;
}

bool rt_shm_put(rt_shm_pool *p, const void *data, size_t len, unsigned char out[RT_SHM_DESC_BYTES]) {
    if (!p || len < RT_SHM_MIN_BYTES || len > RT_SHM_SLOT_BYTES) return false;
    for (int i = 0; i < RT_SHM_SLOTS; i++) {
        int s = i;   // the lowest free slot: the one freed last is likely still in the caches
        unsigned free_state = 0;
        if (!atomic_compare_exchange_strong_explicit(&p->hdr->state[s], &free_state, 1,
                                                     memory_order_acquire, memory_order_relaxed))
            continue;
        size_t off = HEADER_BYTES + (size_t)s * RT_SHM_SLOT_BYTES;
        memcpy(p->base + off, data, len);
        desc d;
        memset(&d, 0, sizeof d);
        memcpy(d.magic, RT_SHM_MAGIC, sizeof d.magic);
        d.pid = p->pid;
        d.region = p->region;
        d.offset = off;
        d.len = len;
        d.slot = (uint32_t)s;
        d.nonce = p->nonce;
        memcpy(out, &d, sizeof d);
        return true;
    }
    return false;
}

int rt_shm_pool_in_use(rt_shm_pool *p) {
    int n = 0;
    for (int i = 0; p && i < RT_SHM_SLOTS; i++) n += atomic_load(&p->hdr->state[i]) != 0;
    return n;
}

// ---- the receiving side: regions of other processes ----
// A region is mapped on its first descriptor and kept while the sender lives: its header page
// writable (to free slots), its slots read-only (a receiver never writes the sender's bytes).
// Every slot handed out holds a reference; a region nobody holds whose creator has exited is
// unmapped by rt_shm_sweep (a restarted peer's old region must not stay mapped for good).

typedef struct mapping {
    uint32_t pid, region, nonce;
    unsigned char *hdr;      // HEADER_BYTES, read-write
    unsigned char *slots;    // the slots, read-only
    atomic_int refs;         // slots handed out and not yet released
    struct mapping *next;
} mapping;

// A slot handed out: rt_shm_release frees it and drops the reference.
typedef struct hold {
    mapping *m;
    atomic_uint *state;
} hold;

static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;

bool rt_shm_is_desc(const void *frame, size_t frame_len, size_t expected_len) {
    return frame_len == RT_SHM_DESC_BYTES && expected_len >= RT_SHM_MIN_BYTES &&
           memcmp(frame, RT_SHM_MAGIC, sizeof RT_SHM_MAGIC) == 0;
}

static bool process_gone(uint32_t pid) { return kill((pid_t)pid, 0) != 0 && errno == ESRCH; }

static void unmap(mapping *m) {
    munmap(m->hdr, HEADER_BYTES);
    munmap(m->slots, REGION_BYTES - HEADER_BYTES);
    free(m);
}

static int sweep_locked(void) {
    int n = 0;
    for (mapping **pp = &maps; *pp;) {
        mapping *m = *pp;
        if (atomic_load(&m->refs) == 0 && process_gone(m->pid)) {
            *pp = m->next;
            unmap(m);
            n++;
        } else {
            pp = &m->next;
        }
    }
    return n;
}

int rt_shm_sweep(void) {
    pthread_mutex_lock(&maps_mu);
    int n = sweep_locked();
    pthread_mutex_unlock(&maps_mu);
    return n;
}

int rt_shm_num_mappings(void) {
    pthread_mutex_lock(&maps_mu);
    int n = 0;
    for (mapping *m = maps; m; m = m->next) n++;
    pthread_mutex_unlock(&maps_mu);
    return n;
}

// Maps (or finds) the region and takes a reference on it.
static mapping *map_region(uint32_t pid, uint32_t region, uint32_t nonce, dg_status *st) {
    pthread_mutex_lock(&maps_mu);
    for (mapping *m = maps; m; m = m->next)
        if (m->pid == pid && m->region == region && m->nonce == nonce) {
            atomic_fetch_add(&m->refs, 1);
            pthread_mutex_unlock(&maps_mu);
            return m;
        }
    sweep_locked();   // a new region: often a peer that restarted, whose old one can go
    char name[64];
    region_name(name, sizeof name, pid, region);
    mapping *mp = NULL;
    int fd = shm_open(name, O_RDWR | O_NOFOLLOW, 0);
    struct stat sb;
    if (fd < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "shared memory %s: %s", name, strerror(errno));
    } else if (fstat(fd, &sb) != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "shared memory %s: %s", name, strerror(errno));
    } else if ((size_t)sb.st_size != REGION_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "shared memory %s: %lld bytes, expected %zu", name,
                       (long long)sb.st_size, REGION_BYTES);
    } else if (sb.st_uid != geteuid() || (sb.st_mode & 077) != 0) {
        // Only a region of our own user that nobody else may open: another user's file (or one
        // others could write) would let them feed us bytes.
        dg_status_setf(st, DG_PERMISSION_DENIED, "shared memory %s: owned by uid %u with mode %03o; only "
                       "regions of this user (uid %u) with mode 0600 are read", name, (unsigned)sb.st_uid,
                       (unsigned)(sb.st_mode & 0777), (unsigned)geteuid());
    } else {
        void *h = mmap(NULL, HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        void *sl = h == MAP_FAILED ? MAP_FAILED
                                   : mmap(NULL, REGION_BYTES - HEADER_BYTES, PROT_READ, MAP_SHARED, fd, HEADER_BYTES);
        if (h == MAP_FAILED || sl == MAP_FAILED) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "mmap %s: %s", name, strerror(errno));
            if (h != MAP_FAILED) munmap(h, HEADER_BYTES);
        } else {
            const region_header *rh = h;
            if (rh->magic != REGION_MAGIC || rh->version != REGION_VERSION || rh->n_slots != RT_SHM_SLOTS ||
                rh->slot_bytes != RT_SHM_SLOT_BYTES || rh->region_bytes != REGION_BYTES ||
                rh->creator_pid != pid || rh->nonce != nonce) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "shared memory %s: not the region the "
                               "descriptor names (magic, version, slots, size or nonce differ)", name);
                munmap(h, HEADER_BYTES);
                munmap(sl, REGION_BYTES - HEADER_BYTES);
            } else {
                mp = calloc(1, sizeof *mp);
                if (!mp) abort();
                mp->pid = pid;
                mp->region = region;
                mp->nonce = nonce;
                mp->hdr = h;
                mp->slots = sl;
                atomic_init(&mp->refs, 1);
                mp->next = maps;
                maps = mp;
            }
        }
    }
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&maps_mu);
    return mp;
}

bool rt_shm_get(const void *dp, size_t expected_len, void **data, void **slot_state, dg_status *st) {
    desc d;
    memcpy(&d, dp, sizeof d);
    if (memcmp(d.magic, RT_SHM_MAGIC, sizeof d.magic) != 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "shared memory descriptor: bad magic");
        return false;
    }
    if (d.len != expected_len || d.len < RT_SHM_MIN_BYTES || d.len > RT_SHM_SLOT_BYTES ||
        d.slot >= RT_SHM_SLOTS || d.offset != HEADER_BYTES + (uint64_t)d.slot * RT_SHM_SLOT_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "shared memory descriptor: slot %u, offset %llu, "
                       "%llu bytes for a tensor of %zu bytes", d.slot, (unsigned long long)d.offset,
                       (unsigned long long)d.len, expected_len);
        return false;
    }
    mapping *m = map_region(d.pid, d.region, d.nonce, st);
    if (!m) return false;
    region_header *h = (region_header *)m->hdr;
    // Taken once: in flight (1) -> read (2). A descriptor sent twice is refused the second
    // time, so the first reader's release cannot hand the sender a slot someone still reads.
    unsigned in_flight = 1;
    if (!atomic_compare_exchange_strong_explicit(&h->state[d.slot], &in_flight, 2, memory_order_acquire,
                                                 memory_order_relaxed)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "shared memory descriptor: slot %u of region %u-%u "
                       "is not held, or was read already", d.slot, d.pid, d.region);
        atomic_fetch_sub(&m->refs, 1);
        return false;
    }
    hold *hd = malloc(sizeof *hd);
    if (!hd) abort();
    hd->m = m;
    hd->state = &h->state[d.slot];
    *data = m->slots + (d.offset - HEADER_BYTES);
    *slot_state = hd;
    return true;
}

void rt_shm_release(void *slot_state) {
    hold *hd = slot_state;
    if (!hd) return;
    atomic_store_explicit(hd->state, 0, memory_order_release);
    atomic_fetch_sub(&hd->m->refs, 1);
    free(hd);
}

static void release_tensor(void *data, size_t n, void *arg) {
    (void)data;
    (void)n;
    rt_shm_release(arg);
}

dg_tensor *rt_shm_tensor(const void *dp, dg_dtype dtype, dg_shape shape, size_t nbytes, dg_status *st) {
    void *data = NULL, *state = NULL;
    if (!rt_shm_get(dp, nbytes, &data, &state, st)) return NULL;
    dg_tensor *t = dg_tensor_wrap(dtype, shape, data, nbytes, release_tensor, state, st);
    if (!t) rt_shm_release(state);
    return t;
}
