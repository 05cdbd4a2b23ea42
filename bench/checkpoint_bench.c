/* checkpoint_bench: save and restore throughput of the checkpoint store against a plain file
 * on the same disk. For each size (float32 variables of at most 64 MiB each) it alternates:
 *   plain write: fopen a new file, fwrite every tensor, fflush + fsync, fclose, unlink the
 *                previous round's file (what a saver writing one file per checkpoint does)
 *   plain rewrite: the same into the existing file, opened "r+b" (no block allocation)
 *   plain read:  fopen, fread every tensor into a fresh 64-byte aligned buffer
 *   save:        dg_checkpoint_save of a new step with max_to_keep 1 (the WAL commit is
 *                fsynced and the WAL is copied into the file and fsynced before it returns)
 *   restore:     dg_checkpoint_restore of the newest step into new tensors, CRCs checked
 * after one untimed round, and reports the median of --reps rounds (odd rounds run the
 * checkpoint side first). Before each read and restore it touches and frees as much fresh
 * memory as it will read (see warm_free_pages; --no_warm skips it). With --cold the files
 * read are dropped from the page cache (posix_fadvise DONTNEED) before each read or restore.
 * Prints JSON lines {"bench": "checkpoint_bench", "metric": ..., "value": ..., "unit": ...};
 * MiB = 2^20 bytes. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <distgraph/distgraph.h>

#include "flags.h"

#define MAX_TENSOR_BYTES ((size_t)64 << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Touches and frees n bytes of fresh memory, so the buffers a read or restore allocates next
// come from pages the kernel (and, on a VM, the hypervisor) has just backed. Without it the
// side that happened to free memory last (the plain write unlinks a file) gets warm pages,
// and the other pays for first-touch faults: up to 3x on the VM these figures come from.
static void warm_free_pages(size_t n) {
    unsigned char *p = malloc(n);
    if (!p) return;
    memset(p, 1, n);
    __asm__ __volatile__("" : : "r"(p) : "memory");
    free(p);
}

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

typedef struct set {
    int n;
    char **names;
    dg_tensor **t;
} set;

static void set_free(set *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        dg_tensor_unref(s->t[i]);
    }
    free(s->names);
    free(s->t);
}

// size_mib of float32 data as tensors of at most 64 MiB, filled with a xorshift stream.
static bool set_make(set *s, int64_t size_mib, dg_status *st) {
    size_t total = (size_t)size_mib << 20;
    s->n = (int)((total + MAX_TENSOR_BYTES - 1) / MAX_TENSOR_BYTES);
    s->names = calloc((size_t)s->n, sizeof *s->names);
    s->t = calloc((size_t)s->n, sizeof *s->t);
    if (!s->names || !s->t) return false;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < s->n; i++) {
        size_t bytes = total - (size_t)i * MAX_TENSOR_BYTES;
        if (bytes > MAX_TENSOR_BYTES) bytes = MAX_TENSOR_BYTES;
        char name[64];
        snprintf(name, sizeof name, "layer%03d/kernel", i);
        s->names[i] = strdup(name);
        s->t[i] = dg_tensor_new(DG_FLOAT32, dg_shape2((int64_t)(bytes / 4096), 1024), st);
        if (!s->names[i] || !s->t[i]) return false;
        uint64_t *w = dg_tensor_data(s->t[i]);
        for (size_t k = 0; k < bytes / 8; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w[k] = x;
        }
    }
    return true;
}

// fopen(path, "wb") creates a new file (the file system allocates every block);
// with is_rewrite the existing file is opened "r+b" and overwritten in place.
static bool plain_write(const set *s, const char *path, bool is_rewrite) {
    FILE *f = fopen(path, is_rewrite ? "r+b" : "wb");
    if (!f) return false;
    bool ok = true;
    for (int i = 0; i < s->n && ok; i++)
        ok = fwrite(dg_tensor_data(s->t[i]), 1, dg_tensor_nbytes(s->t[i]), f) ==
             dg_tensor_nbytes(s->t[i]);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    return fclose(f) == 0 && ok;
}

static bool plain_read(const set *s, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool ok = true;
    void **bufs = calloc((size_t)s->n, sizeof *bufs);
    for (int i = 0; i < s->n && ok && bufs; i++) {
        size_t n = dg_tensor_nbytes(s->t[i]);
        bufs[i] = aligned_alloc(64, (n + 63) & ~(size_t)63);
        ok = bufs[i] && fread(bufs[i], 1, n, f) == n;
    }
    fclose(f);
    for (int i = 0; bufs && i < s->n; i++) free(bufs[i]);
    ok = ok && bufs;
    free(bufs);
    return ok;
}

static void emit(const char *metric, int64_t mib, double value, const char *unit) {
    printf("{\"bench\": \"checkpoint_bench\", \"metric\": \"%s\", \"size_mib\": %lld, "
           "\"value\": %.3f, \"unit\": \"%s\"}\n",
           metric, (long long)mib, value, unit);
    fflush(stdout);
}

static bool run_size(const char *dir, int64_t mib, int reps, bool cold, bool warm,
                     dg_status *st) {
    set s = {0};
    char db[4200], wal[4300], plain[4300], prev[4300] = "";
    snprintf(db, sizeof db, "%s/ckpt-%lld.db", dir, (long long)mib);
    snprintf(wal, sizeof wal, "%s-wal", db);
    double *t_pw = calloc((size_t)reps, sizeof(double));    // plain write
    double *t_pr = calloc((size_t)reps, sizeof(double));    // plain read
    double *t_pw2 = calloc((size_t)reps, sizeof(double));   // plain rewrite
    double *t_cs = calloc((size_t)reps, sizeof(double));    // checkpoint save
    double *t_cr = calloc((size_t)reps, sizeof(double));    // checkpoint restore
    dg_checkpoint_store *store = NULL;
    bool ok = false;
    if (!t_pw || !t_pr || !t_cs || !t_cr || !t_pw2) goto done;
    if (!set_make(&s, mib, st)) goto done;
    if (!(store = dg_checkpoint_store_new(db, true, st))) goto done;
    for (int r = -1; r < reps; r++) {   // round -1 is the untimed warm-up
        // Odd rounds run the checkpoint first, so neither side always inherits the page
        // cache and free memory the other left behind.
        for (int half = 0; half < 2; half++) {
            if ((half == 0) == (r % 2 == 0)) {
                snprintf(plain, sizeof plain, "%s/plain-%lld.%d", dir, (long long)mib, r + 1);
                double t0 = now_s();
                if (!plain_write(&s, plain, false)) {
                    dg_status_setf(st, DG_UNAVAILABLE, "plain write of %s failed", plain);
                    goto done;
                }
                if (prev[0]) unlink(prev);
                double t1 = now_s();
                snprintf(prev, sizeof prev, "%s", plain);
                if (cold) drop_cache(plain);
                if (warm) warm_free_pages((size_t)mib << 20);
                double t2 = now_s();
                if (!plain_read(&s, plain)) {
                    dg_status_setf(st, DG_UNAVAILABLE, "plain read of %s failed", plain);
                    goto done;
                }
                double t3 = now_s();
                if (!plain_write(&s, plain, true)) {
                    dg_status_setf(st, DG_UNAVAILABLE, "plain rewrite of %s failed", plain);
                    goto done;
                }
                double t4 = now_s();
                if (r >= 0) {
                    t_pw[r] = t1 - t0;
                    t_pr[r] = t3 - t2;
                    t_pw2[r] = t4 - t3;
                }
            } else {
                double t0 = now_s();
                if (!dg_checkpoint_save(store, r + 1, (const char *const *)s.names, s.t, s.n, 1,
                                        st))
                    goto done;
                double t1 = now_s();
                if (cold) {
                    drop_cache(db);
                    drop_cache(wal);
                }
                dg_tensor **out = calloc((size_t)s.n, sizeof *out);
                if (warm) warm_free_pages((size_t)mib << 20);
                double t2 = now_s();
                bool restored = out && dg_checkpoint_restore(store, -1,
                                                             (const char *const *)s.names, s.n,
                                                             out, NULL, st);
                double t3 = now_s();
                for (int i = 0; out && i < s.n; i++) dg_tensor_unref(out[i]);
                free(out);
                if (!restored) goto done;
                if (r >= 0) {
                    t_cs[r] = t1 - t0;
                    t_cr[r] = t3 - t2;
                }
            }
        }
    }
    double mb = (double)mib, pw = median(t_pw, reps), pr = median(t_pr, reps);
    double cs = median(t_cs, reps), cr = median(t_cr, reps), pw2 = median(t_pw2, reps);
    const char *rd = cold ? "cold" : "cached";
    char m[96];
    emit("plain_write", mib, mb / pw, "MiB/s");
    emit("save", mib, mb / cs, "MiB/s");
    emit("save/plain_write", mib, pw / cs, "ratio");
    emit("plain_rewrite", mib, mb / pw2, "MiB/s");
    emit("save/plain_rewrite", mib, pw2 / cs, "ratio");
    snprintf(m, sizeof m, "plain_read_%s", rd);
    emit(m, mib, mb / pr, "MiB/s");
    snprintf(m, sizeof m, "restore_%s", rd);
    emit(m, mib, mb / cr, "MiB/s");
    snprintf(m, sizeof m, "restore/plain_read_%s", rd);
    emit(m, mib, pr / cr, "ratio");
    ok = true;
done:
    if (prev[0]) unlink(prev);
    dg_checkpoint_store_free(&store);
    unlink(db);
    unlink(wal);
    snprintf(plain, sizeof plain, "%s-shm", db);
    unlink(plain);
    set_free(&s);
    free(t_pw);
    free(t_pr);
    free(t_cs);
    free(t_cr);
    free(t_pw2);
    return ok;
}

int main(int argc, char **argv) {
    const char *dir = ".", *sizes = "10,100,1024";
    int64_t reps = 5;
    bool cold = false, no_warm = false, help = false;
    flag_def defs[] = {
        {"dir", FLAG_STRING, &dir, "where the temporary files go (default .): the disk measured"},
        {"sizes_mib", FLAG_STRING, &sizes, "comma-separated sizes (default 10,100,1024)"},
        {"reps", FLAG_INT, &reps, "timed rounds per size, median reported (default 5)"},
        {"cold", FLAG_BOOL, &cold, "drop the files from the page cache before reading"},
        {"no_warm", FLAG_BOOL, &no_warm, "skip touching fresh memory before reads/restores"},
    };
    if (!flags_parse(argc, argv, defs, 5, "checkpoint_bench [options]", &help)) return 2;
    if (help) return 0;
    if (reps < 1) {
        fprintf(stderr, "checkpoint_bench: --reps must be >= 1\n");
        return 2;
    }
    char tmpl[4000];
    if (snprintf(tmpl, sizeof tmpl, "%s/ckbench.XXXXXX", dir) >= (int)sizeof tmpl) return 2;
    if (!mkdtemp(tmpl)) {
        perror("checkpoint_bench: mkdtemp");
        return 1;
    }
    dg_status *st = dg_status_new();
    int rc = 0;
    for (const char *p = sizes; *p && rc == 0;) {
        char *end;
        long long mib = strtoll(p, &end, 10);
        if (end == p || mib < 1) {
            fprintf(stderr, "checkpoint_bench: bad --sizes_mib \"%s\"\n", sizes);
            rc = 2;
            break;
        }
        if (!run_size(tmpl, mib, (int)reps, cold, !no_warm, st)) {
            fprintf(stderr, "checkpoint_bench: %lld MiB: %s\n", mib, dg_status_message(st));
            rc = 1;
        }
        p = *end == ',' ? end + 1 : end;
    }
    rmdir(tmpl);
    dg_status_free(&st);
    return rc;
}
