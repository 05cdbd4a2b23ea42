/* libFuzzer target for the shared-memory descriptor reader (runtime/transport/shm.c): the
 * 40-byte frame a peer on this host sends in place of a tensor's bytes, which makes the
 * receiver open and map a region it names. Any descriptor must give either a clean refusal
 * (false, INVALID_ARGUMENT, PERMISSION_DENIED or RESOURCE_EXHAUSTED, a message starting
 * "shared memory", the out-parameters untouched) or a read of a slot this process really
 * filled and still holds: the bytes it wrote, all of the slot readable. Nothing crashes, no
 * descriptor is followed outside its region, and the mappings and file descriptors a run
 * leaves behind stay bounded (a region is mapped once, with a reference per slot handed out).
 *
 * So that inputs reach real regions (whose pid, number and nonce a fuzzer cannot guess), a
 * descriptor is a template overridden field by field from the input:
 *   byte 0   template: 0..63 the held slot of pool A with that index; 64..127 a slot of pool B
 *            (a real region, every slot free); 128 a region of the wrong size; 129 a region of
 *            the right size with a blank header; 130 a region that does not exist; 131 a region
 *            others may read (mode 0644); else zeros
 *   byte 1   bits 0..6: which fields (magic, pid, region, offset, len, slot, nonce) the input
 *            overrides, in that order and with their widths (8, 4, 4, 8, 8, 4, 4 bytes);
 *            bit 7: the expected length is the input's (8 bytes, after the fields), else the
 *            descriptor's own length
 *   byte 2   bit 0: read through rt_shm_tensor (a uint8 tensor) instead of rt_shm_get
 * Every input is also offered whole to rt_shm_is_desc as a frame of its own length.
 * Built by hand or by run_fuzz.sh shm_desc SECONDS, not by CMake: see README.md here. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distgraph/distgraph.h"
#include "shm_impl.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// The descriptor layout of docs/PROTOCOL.md, section 2 (shm.c keeps its struct private).
typedef struct desc {
    char magic[8];
    uint32_t pid, region;
    uint64_t offset, len;
    uint32_t slot, nonce;
} desc;
_Static_assert(sizeof(desc) == RT_SHM_DESC_BYTES, "descriptor layout");

#define HEADER_BYTES 4096u
#define REGION_BYTES (HEADER_BYTES + (size_t)RT_SHM_SLOTS * RT_SHM_SLOT_BYTES)
#define FAKE_SMALL 1000000u   // region numbers no pool of this process takes
#define FAKE_BLANK 1000001u
#define MISSING 1000002u
#define FAKE_OPEN 1000003u

static rt_shm_pool *pool_a, *pool_b;
static desc held[RT_SHM_SLOTS];   // pool A's descriptor for each slot (all held)
static desc free_b;               // a descriptor of pool B, whose slots are all free
static int fds_at_start;
static char fake_small[64], fake_blank[64], fake_open[64];

static unsigned char pattern(uint32_t slot, size_t i) { return (unsigned char)(slot * 131u + i * 7u + (i >> 9)); }

static size_t slot_len(uint32_t slot) { return RT_SHM_MIN_BYTES + (size_t)slot * 4096u + slot; }

static int count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

// Mappings of dg-shm regions in this process: the two pools' own, and the reader's of each
// (a header page and the slots) are all there may ever be.
static int count_shm_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) abort();
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "/dev/shm/dg-shm-")) n++;
    fclose(f);
    return n;
}

static void put_slot(uint32_t want_slot) {
    unsigned char *buf = malloc(slot_len(want_slot));
    if (!buf) abort();
    for (size_t i = 0; i < slot_len(want_slot); i++) buf[i] = pattern(want_slot, i);
    unsigned char d[RT_SHM_DESC_BYTES];
    if (!rt_shm_put(pool_a, buf, slot_len(want_slot), d)) abort();
    free(buf);
    desc got;
    memcpy(&got, d, sizeof got);
    // Pool A has exactly one free slot whenever this runs, so the frame lands in it.
    if (got.slot != want_slot) abort();
    held[want_slot] = got;
}

static void make_fake(char *name, size_t cap, uint32_t region, size_t bytes, mode_t mode) {
    snprintf(name, cap, "/dg-shm-%u-%u", (unsigned)getpid(), region);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0 || fchmod(fd, mode) != 0) abort();
    close(fd);
}

static void cleanup(void) {
    shm_unlink(fake_small);
    shm_unlink(fake_blank);
    shm_unlink(fake_open);
    rt_shm_pool_free(&pool_a);
    rt_shm_pool_free(&pool_b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    dg_status *st = dg_status_new();
    pool_a = rt_shm_pool_new(st);
    pool_b = rt_shm_pool_new(st);
    if (!pool_a || !pool_b) {
        fprintf(stderr, "fuzz_shm_desc: no shared memory here: %s\n", dg_status_message(st));
        abort();
    }
    // Fill every slot of A in order (a fresh pool hands them out from 0), then B's first
    // slot, which is freed again at once: its descriptor stays, naming a free slot.
    unsigned char d[RT_SHM_DESC_BYTES];
    for (uint32_t s = 0; s < RT_SHM_SLOTS; s++) {
        size_t n = slot_len(s);
        unsigned char *buf = malloc(n);
        if (!buf) abort();
        for (size_t i = 0; i < n; i++) buf[i] = pattern(s, i);
        if (!rt_shm_put(pool_a, buf, n, d)) abort();
        free(buf);
        memcpy(&held[s], d, sizeof d);
        if (held[s].slot != s) abort();
    }
    unsigned char zeros[RT_SHM_MIN_BYTES] = {0};
    void *data, *slot;
    if (!rt_shm_put(pool_b, zeros, sizeof zeros, d) || !rt_shm_get(d, sizeof zeros, &data, &slot, st)) abort();
    rt_shm_release(slot);
    memcpy(&free_b, d, sizeof d);
    make_fake(fake_small, sizeof fake_small, FAKE_SMALL, 4096, 0600);
    make_fake(fake_blank, sizeof fake_blank, FAKE_BLANK, REGION_BYTES, 0600);
    make_fake(fake_open, sizeof fake_open, FAKE_OPEN, REGION_BYTES, 0644);
    atexit(cleanup);
    dg_status_free(&st);
    fds_at_start = -1;
    return 0;
}

// Reads n bytes of the input into out (zeros past its end).
static void take(const uint8_t **p, const uint8_t *end, void *out, size_t n) {
    size_t have = (size_t)(end - *p) < n ? (size_t)(end - *p) : n;
    memset(out, 0, n);
    memcpy(out, *p, have);
    *p += have;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint64_t runs;
    // Any bytes as a frame of their own length: only a 40-byte frame with the magic, standing
    // for a tensor of at least RT_SHM_MIN_BYTES, is a descriptor.
    for (size_t expected = 0; expected <= RT_SHM_SLOT_BYTES; expected += RT_SHM_MIN_BYTES) {
        bool is = rt_shm_is_desc(data, size, expected);
        bool want = size == RT_SHM_DESC_BYTES && expected >= RT_SHM_MIN_BYTES && memcmp(data, RT_SHM_MAGIC, 8) == 0;
        if (is != want) abort();
    }

    const uint8_t *p = data, *end = data + size;
    uint8_t sel = 0, fields = 0, how = 0;
    take(&p, end, &sel, 1);
    take(&p, end, &fields, 1);
    take(&p, end, &how, 1);
    desc d;
    memset(&d, 0, sizeof d);
    if (sel < 64) {
        d = held[sel];
    } else if (sel < 128) {
        d = free_b;
        d.slot = sel - 64u;
        d.offset = HEADER_BYTES + (uint64_t)d.slot * RT_SHM_SLOT_BYTES;
    } else if (sel <= 131) {
        d = held[0];
        d.region = sel == 128 ? FAKE_SMALL : sel == 129 ? FAKE_BLANK : sel == 130 ? MISSING : FAKE_OPEN;
    }
    if (fields & 1) take(&p, end, d.magic, sizeof d.magic);
    if (fields & 2) take(&p, end, &d.pid, sizeof d.pid);
    if (fields & 4) take(&p, end, &d.region, sizeof d.region);
    if (fields & 8) take(&p, end, &d.offset, sizeof d.offset);
    if (fields & 16) take(&p, end, &d.len, sizeof d.len);
    if (fields & 32) take(&p, end, &d.slot, sizeof d.slot);
    if (fields & 64) take(&p, end, &d.nonce, sizeof d.nonce);
    uint64_t expected = d.len;
    if (fields & 128) take(&p, end, &expected, sizeof expected);
    // Lengths past what a tensor of this process could have are not asked for by any caller.
    if (expected > ((uint64_t)1 << 40)) expected &= ((uint64_t)1 << 40) - 1;

    unsigned char frame[RT_SHM_DESC_BYTES];
    memcpy(frame, &d, sizeof frame);
    dg_status *st = dg_status_new();
    void *bytes = (void *)&runs, *state = (void *)&runs;   // sentinels: untouched on failure
    dg_tensor *t = NULL;
    bool ok;
    if (how & 1) {
        t = rt_shm_tensor(frame, DG_UINT8, dg_shape1((int64_t)expected), (size_t)expected, st);
        ok = t != NULL;
        if (ok) bytes = dg_tensor_data(t);
    } else {
        ok = rt_shm_get(frame, (size_t)expected, &bytes, &state, st);
    }

    if (ok) {
        // Only pool A's held slots can be read, and what comes back is what was written there.
        if (!dg_status_ok(st) || d.pid != (uint32_t)getpid() || d.region != held[0].region ||
            d.nonce != held[0].nonce || d.slot >= RT_SHM_SLOTS || memcmp(&d, &held[d.slot], 24) != 0 ||
            d.len != expected || expected < RT_SHM_MIN_BYTES || expected > RT_SHM_SLOT_BYTES ||
            !rt_shm_is_desc(frame, sizeof frame, (size_t)expected))
            abort();
        const unsigned char *b = bytes;
        size_t n = expected < slot_len(d.slot) ? (size_t)expected : slot_len(d.slot);
        for (size_t i = 0; i < n; i += 1 + (i & 255))
            if (b[i] != pattern(d.slot, i)) abort();
        if (b[n - 1] != pattern(d.slot, n - 1)) abort();
        // Reading the whole slot must be possible (the region is mapped in full).
        volatile unsigned char last = b[expected - 1];
        (void)last;
        // Free the slot and fill it again, so every run sees the same pool.
        if (t) dg_tensor_unref(t);
        else rt_shm_release(state);
        if (rt_shm_pool_in_use(pool_a) != RT_SHM_SLOTS - 1) abort();
        put_slot(d.slot);
    } else {
        dg_code c = dg_status_code(st);
        if ((c != DG_INVALID_ARGUMENT && c != DG_PERMISSION_DENIED && c != DG_RESOURCE_EXHAUSTED) ||
            bytes != (void *)&runs)
            abort();
        if (strncmp(dg_status_message(st), "shared memory", 13) != 0) abort();
        if (!(how & 1) && state != (void *)&runs) abort();
    }
    if (rt_shm_pool_in_use(pool_a) != RT_SHM_SLOTS || rt_shm_pool_in_use(pool_b) != 0) abort();
    dg_status_free(&st);

    // Every 1024 runs: no mapping or file descriptor piles up.
    if ((runs++ & 1023) == 0) {
        int fds = count_dir("/proc/self/fd");
        if (fds_at_start < 0) fds_at_start = fds;
        if (fds > fds_at_start + 2 || count_shm_maps() > 6 || rt_shm_num_mappings() > 2) {
            fprintf(stderr, "fuzz_shm_desc: %d open files (%d at the start), %d shared-memory mappings, %d regions "
                    "mapped by the reader\n", fds, fds_at_start, count_shm_maps(), rt_shm_num_mappings());
            abort();
        }
    }
    return 0;
}
