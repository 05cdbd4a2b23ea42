/* Power-loss VFS shim: see powerloss_vfs.h for what it models. Every call goes to the wrapped
 * VFS, so SQLite reads back what it wrote, as it would on a machine that has not lost power
 * yet. Durability is only modelled: xSync moves a file's pending writes into its durable
 * image and does not fsync the real file (the real files are thrown away; fsyncs would only
 * make the test slow). The shim knows files by the full path SQLite opens them under, so a
 * file that is closed and opened again keeps its history. */
#include "powerloss_vfs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

typedef struct pl_op {
    int64_t offset;          // write: first byte; truncate: the new size
    int64_t n_bytes;         // write: length; truncate: -1
    unsigned char *data;     // write: a copy of the bytes; truncate: NULL
} pl_op;

// One tracked file (main database, rollback journal or WAL).
typedef struct pl_file {
    char *path;              // full path as SQLite opened it
    unsigned char *durable;  // content as of its last xSync
    int64_t durable_bytes;
    int64_t durable_cap;
    pl_op *pending;          // writes and truncations since the last xSync, in order
    int n_pending, cap_pending;
    int n_handles;           // open handles on it
    bool is_deleted;         // xDelete succeeded (taken as durable at once)
} pl_file;

typedef struct pl_handle {
    sqlite3_file base;       // base.pMethods: &pl_io_methods once opened
    pl_file *file;           // NULL for files not tracked (temporary files)
    sqlite3_file *real;      // the wrapped VFS's file, in the same allocation after this struct
} pl_handle;

static struct {
    sqlite3_vfs vfs;         // the shim, registered as "powerloss"
    sqlite3_vfs *real;       // the wrapped VFS (the default when plvfs_install ran)
    bool is_registered;
    pl_file **files;
    int n_files, cap_files;
    int64_t n_ops;           // counted calls that succeeded since plvfs_reset
    int64_t cut_after_ops;   // < 0: never
    bool is_cut;
    char *op_kinds;          // 'w', 's' or 't' per counted call that succeeded
    int cap_op_kinds;
} g;

// ---- bookkeeping ----

static bool grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void clear_pending(pl_file *f) {
    for (int i = 0; i < f->n_pending; i++) free(f->pending[i].data);
    f->n_pending = 0;
}

static void file_free(pl_file *f) {
    clear_pending(f);
    free(f->pending);
    free(f->durable);
    free(f->path);
    free(f);
}

// Sets *image's size to n_bytes (new bytes zero), growing its buffer as needed.
static bool image_resize(unsigned char **image, int64_t *n, int64_t *cap, int64_t n_bytes) {
    if (n_bytes > *cap) {
        int64_t c = *cap ? *cap : 65536;
        while (c < n_bytes) c *= 2;
        unsigned char *q = realloc(*image, (size_t)c);
        if (!q) return false;
        *image = q;
        *cap = c;
    }
    if (n_bytes > *n) memset(*image + *n, 0, (size_t)(n_bytes - *n));
    *n = n_bytes;
    return true;
}

static bool image_write(unsigned char **image, int64_t *n, int64_t *cap, int64_t offset,
                        const unsigned char *data, int64_t n_bytes) {
    if (offset + n_bytes > *n && !image_resize(image, n, cap, offset + n_bytes)) return false;
    memcpy(*image + offset, data, (size_t)n_bytes);
    return true;
}

static pl_file *find_file(const char *path) {
    for (int i = 0; i < g.n_files; i++)
        if (strcmp(g.files[i]->path, path) == 0) return g.files[i];
    return NULL;
}

static pl_file *add_file(const char *path) {
    pl_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path)) ||
        !grow((void **)&g.files, &g.cap_files, g.n_files + 1, sizeof *g.files)) {
        if (f) free(f->path);
        free(f);
        return NULL;
    }
    g.files[g.n_files++] = f;
    return f;
}

// Counts one xWrite/xSync/xTruncate ('w', 's', 't'); false when the power is gone (from
// this call on).
static bool count_op(char kind) {
    if (g.is_cut) return false;
    if (g.cut_after_ops >= 0 && g.n_ops >= g.cut_after_ops) {
        g.is_cut = true;
        return false;
    }
    if (g.n_ops < INT_MAX &&
        grow((void **)&g.op_kinds, &g.cap_op_kinds, (int)g.n_ops + 1, sizeof *g.op_kinds))
        g.op_kinds[g.n_ops] = kind;
    g.n_ops++;
    return true;
}

// ---- sqlite3_io_methods ----

static int pl_close(sqlite3_file *pf) {
    pl_handle *h = (pl_handle *)pf;
    if (h->file) h->file->n_handles--;
    // Closing releases the real descriptor and locks even after the cut: nothing is written.
    return h->real->pMethods->xClose(h->real);
}

static int pl_read(sqlite3_file *pf, void *buf, int n, sqlite3_int64 offset) {
    pl_handle *h = (pl_handle *)pf;
    if (g.is_cut) return SQLITE_IOERR_READ;
    return h->real->pMethods->xRead(h->real, buf, n, offset);
}

static int pl_write(sqlite3_file *pf, const void *buf, int n, sqlite3_int64 offset) {
    pl_handle *h = (pl_handle *)pf;
    if (!count_op('w')) return SQLITE_IOERR_WRITE;
    int rc = h->real->pMethods->xWrite(h->real, buf, n, offset);
    if (rc != SQLITE_OK || !h->file) return rc;
    pl_file *f = h->file;
    if (!grow((void **)&f->pending, &f->cap_pending, f->n_pending + 1, sizeof *f->pending))
        return SQLITE_IOERR_NOMEM;
    pl_op *op = &f->pending[f->n_pending];
    op->data = malloc(n > 0 ? (size_t)n : 1);
    if (!op->data) return SQLITE_IOERR_NOMEM;
    memcpy(op->data, buf, (size_t)n);
    op->offset = offset;
    op->n_bytes = n;
    f->n_pending++;
    return SQLITE_OK;
}

static int pl_truncate(sqlite3_file *pf, sqlite3_int64 size) {
    pl_handle *h = (pl_handle *)pf;
    if (!count_op('t')) return SQLITE_IOERR_TRUNCATE;
    int rc = h->real->pMethods->xTruncate(h->real, size);
    if (rc != SQLITE_OK || !h->file) return rc;
    pl_file *f = h->file;
    if (!grow((void **)&f->pending, &f->cap_pending, f->n_pending + 1, sizeof *f->pending))
        return SQLITE_IOERR_NOMEM;
    f->pending[f->n_pending++] = (pl_op){.offset = size, .n_bytes = -1, .data = NULL};
    return SQLITE_OK;
}

// Everything written to this file so far becomes durable, in order.
static int pl_sync(sqlite3_file *pf, int flags) {
    pl_handle *h = (pl_handle *)pf;
    (void)flags;
    if (!count_op('s')) return SQLITE_IOERR_FSYNC;
    pl_file *f = h->file;
    if (!f) return SQLITE_OK;
    for (int i = 0; i < f->n_pending; i++) {
        const pl_op *op = &f->pending[i];
        bool ok = op->n_bytes < 0
                      ? image_resize(&f->durable, &f->durable_bytes, &f->durable_cap, op->offset)
                      : image_write(&f->durable, &f->durable_bytes, &f->durable_cap, op->offset,
                                    op->data, op->n_bytes);
        if (!ok) return SQLITE_IOERR_NOMEM;
    }
    clear_pending(f);
    return SQLITE_OK;
}

static int pl_file_size(sqlite3_file *pf, sqlite3_int64 *size) {
    pl_handle *h = (pl_handle *)pf;
    if (g.is_cut) return SQLITE_IOERR_FSTAT;
    return h->real->pMethods->xFileSize(h->real, size);
}

static int pl_lock(sqlite3_file *pf, int level) {
    pl_handle *h = (pl_handle *)pf;
    if (g.is_cut) return SQLITE_IOERR_LOCK;
    return h->real->pMethods->xLock(h->real, level);
}

static int pl_unlock(sqlite3_file *pf, int level) {
    pl_handle *h = (pl_handle *)pf;
    return h->real->pMethods->xUnlock(h->real, level);
}

static int pl_check_reserved(sqlite3_file *pf, int *out) {
    pl_handle *h = (pl_handle *)pf;
    if (g.is_cut) return SQLITE_IOERR_CHECKRESERVEDLOCK;
    return h->real->pMethods->xCheckReservedLock(h->real, out);
}

static int pl_file_control(sqlite3_file *pf, int op, void *arg) {
    pl_handle *h = (pl_handle *)pf;
    return h->real->pMethods->xFileControl(h->real, op, arg);
}

static int pl_sector_size(sqlite3_file *pf) {
    pl_handle *h = (pl_handle *)pf;
    return h->real->pMethods->xSectorSize(h->real);
}

static int pl_device_characteristics(sqlite3_file *pf) {
    pl_handle *h = (pl_handle *)pf;
    return h->real->pMethods->xDeviceCharacteristics(h->real);
}

// The -shm file is shared memory the wrapped VFS maps itself; it is never durable, so only
// its availability is simulated: gone after the cut.
static int pl_shm_map(sqlite3_file *pf, int region, int region_bytes, int extend,
                      void volatile **p) {
    pl_handle *h = (pl_handle *)pf;
    if (g.is_cut) return SQLITE_IOERR_SHMMAP;
    return h->real->pMethods->xShmMap(h->real, region, region_bytes, extend, p);
}

static int pl_shm_lock(sqlite3_file *pf, int offset, int n, int flags) {
    pl_handle *h = (pl_handle *)pf;
    if (g.is_cut && (flags & SQLITE_SHM_LOCK)) return SQLITE_IOERR_SHMLOCK;
    return h->real->pMethods->xShmLock(h->real, offset, n, flags);
}

static void pl_shm_barrier(sqlite3_file *pf) {
    pl_handle *h = (pl_handle *)pf;
    h->real->pMethods->xShmBarrier(h->real);
}

static int pl_shm_unmap(sqlite3_file *pf, int delete_flag) {
    pl_handle *h = (pl_handle *)pf;
    return h->real->pMethods->xShmUnmap(h->real, delete_flag);
}

// Version 2: shared memory for WAL, no memory-mapped I/O (every page goes through xRead and
// xWrite, where the shim sees it).
static const sqlite3_io_methods pl_io_methods = {
    .iVersion = 2,
    .xClose = pl_close,
    .xRead = pl_read,
    .xWrite = pl_write,
    .xTruncate = pl_truncate,
    .xSync = pl_sync,
    .xFileSize = pl_file_size,
    .xLock = pl_lock,
    .xUnlock = pl_unlock,
    .xCheckReservedLock = pl_check_reserved,
    .xFileControl = pl_file_control,
    .xSectorSize = pl_sector_size,
    .xDeviceCharacteristics = pl_device_characteristics,
    .xShmMap = pl_shm_map,
    .xShmLock = pl_shm_lock,
    .xShmBarrier = pl_shm_barrier,
    .xShmUnmap = pl_shm_unmap,
};

// ---- sqlite3_vfs ----

// Loads a file that existed before the shim first saw it: its content counts as durable.
static int load_existing(pl_file *f, sqlite3_file *real) {
    sqlite3_int64 size = 0;
    int rc = real->pMethods->xFileSize(real, &size);
    if (rc != SQLITE_OK || size == 0) return rc;
    if (!image_resize(&f->durable, &f->durable_bytes, &f->durable_cap, size))
        return SQLITE_IOERR_NOMEM;
    for (int64_t at = 0; at < size;) {
        int n = size - at > (1 << 20) ? (1 << 20) : (int)(size - at);
        rc = real->pMethods->xRead(real, f->durable + at, n, at);
        if (rc != SQLITE_OK) return rc;
        at += n;
    }
    return SQLITE_OK;
}

static int pl_open(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *pf, int flags,
                   int *out_flags) {
    (void)vfs;
    pl_handle *h = (pl_handle *)pf;
    h->base.pMethods = NULL;   // SQLite calls xClose only when this is set
    h->file = NULL;
    h->real = (sqlite3_file *)(h + 1);
    if (g.is_cut) return SQLITE_IOERR;
    int rc = g.real->xOpen(g.real, name, h->real, flags, out_flags);
    if (rc != SQLITE_OK) return rc;
    bool is_tracked =
        name && (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL));
    if (is_tracked) {
        pl_file *f = find_file(name);
        if (f && f->is_deleted) {
            f->is_deleted = false;
            f->durable_bytes = 0;
            clear_pending(f);
        }
        if (!f) {
            f = add_file(name);
            rc = f ? load_existing(f, h->real) : SQLITE_NOMEM;
            if (rc != SQLITE_OK) {
                h->real->pMethods->xClose(h->real);
                return rc;
            }
        }
        f->n_handles++;
        h->file = f;
    }
    h->base.pMethods = &pl_io_methods;
    return SQLITE_OK;
}

static int pl_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
    (void)vfs;
    if (g.is_cut) return SQLITE_IOERR_DELETE;
    int rc = g.real->xDelete(g.real, name, sync_dir);
    pl_file *f = rc == SQLITE_OK ? find_file(name) : NULL;
    if (f) {
        // Taken as durable at once: SQLite deletes a journal or WAL only once the database
        // holds its content durably, so an old copy that came back would be harmless too.
        f->is_deleted = true;
        f->durable_bytes = 0;
        clear_pending(f);
    }
    return rc;
}

static int pl_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
    (void)vfs;
    if (g.is_cut) return SQLITE_IOERR_ACCESS;
    return g.real->xAccess(g.real, name, flags, out);
}

static int pl_full_pathname(sqlite3_vfs *vfs, const char *name, int n_out, char *out) {
    (void)vfs;
    return g.real->xFullPathname(g.real, name, n_out, out);
}

static void *pl_dl_open(sqlite3_vfs *vfs, const char *name) {
    (void)vfs;
    return g.real->xDlOpen(g.real, name);
}

static void pl_dl_error(sqlite3_vfs *vfs, int n, char *msg) {
    (void)vfs;
    g.real->xDlError(g.real, n, msg);
}

static void (*pl_dl_sym(sqlite3_vfs *vfs, void *lib, const char *sym))(void) {
    (void)vfs;
    return g.real->xDlSym(g.real, lib, sym);
}

static void pl_dl_close(sqlite3_vfs *vfs, void *lib) {
    (void)vfs;
    g.real->xDlClose(g.real, lib);
}

static int pl_randomness(sqlite3_vfs *vfs, int n, char *out) {
    (void)vfs;
    return g.real->xRandomness(g.real, n, out);
}

static int pl_sleep(sqlite3_vfs *vfs, int us) {
    (void)vfs;
    return g.real->xSleep(g.real, us);
}

static int pl_current_time(sqlite3_vfs *vfs, double *t) {
    (void)vfs;
    return g.real->xCurrentTime(g.real, t);
}

static int pl_get_last_error(sqlite3_vfs *vfs, int n, char *msg) {
    (void)vfs;
    return g.real->xGetLastError ? g.real->xGetLastError(g.real, n, msg) : 0;
}

static int pl_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *t) {
    (void)vfs;
    return g.real->xCurrentTimeInt64(g.real, t);
}

// ---- public ----

bool plvfs_install(void) {
    if (g.is_registered) {
        plvfs_set_default(true);
        return true;
    }
    g.real = sqlite3_vfs_find(NULL);
    if (!g.real || g.real->iVersion < 2) return false;
    g.vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)(sizeof(pl_handle) + (size_t)g.real->szOsFile),
        .mxPathname = g.real->mxPathname,
        .zName = "powerloss",
        .xOpen = pl_open,
        .xDelete = pl_delete,
        .xAccess = pl_access,
        .xFullPathname = pl_full_pathname,
        .xDlOpen = pl_dl_open,
        .xDlError = pl_dl_error,
        .xDlSym = pl_dl_sym,
        .xDlClose = pl_dl_close,
        .xRandomness = pl_randomness,
        .xSleep = pl_sleep,
        .xCurrentTime = pl_current_time,
        .xGetLastError = pl_get_last_error,
        .xCurrentTimeInt64 = pl_current_time_int64,
    };
    g.cut_after_ops = -1;
    if (sqlite3_vfs_register(&g.vfs, 1) != SQLITE_OK) return false;
    g.is_registered = true;
    return true;
}

void plvfs_uninstall(void) {
    if (!g.is_registered) return;
    sqlite3_vfs_register(g.real, 1);
    sqlite3_vfs_unregister(&g.vfs);
    g.is_registered = false;
    plvfs_reset(-1);
    free(g.files);
    g.files = NULL;
    g.cap_files = 0;
    free(g.op_kinds);
    g.op_kinds = NULL;
    g.cap_op_kinds = 0;
}

void plvfs_set_default(bool use_shim) {
    if (g.is_registered) sqlite3_vfs_register(use_shim ? &g.vfs : g.real, 1);
}

void plvfs_reset(int64_t cut_after_ops) {
    for (int i = 0; i < g.n_files; i++) {
        if (g.files[i]->n_handles) {
            // A handle would point at freed memory: the test left a connection open.
            fprintf(stderr, "powerloss_vfs: reset while \"%s\" is open\n", g.files[i]->path);
            abort();
        }
        file_free(g.files[i]);
    }
    g.n_files = 0;
    g.n_ops = 0;
    g.cut_after_ops = cut_after_ops;
    g.is_cut = false;
}

int64_t plvfs_n_ops(void) { return g.n_ops; }

bool plvfs_is_cut(void) { return g.is_cut; }

char plvfs_op_kind(int64_t i) {
    return i >= 0 && i < g.n_ops && i < g.cap_op_kinds ? g.op_kinds[i] : 0;
}

// xorshift64*: a small PRNG whose stream depends on the seed alone, so a seed reproduces.
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static bool keep(uint64_t *s, double keep_prob) {
    return (double)(next_rand(s) >> 11) * 0x1.0p-53 < keep_prob;
}

static bool write_all(const char *path, const unsigned char *data, int64_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        fprintf(stderr, "powerloss_vfs: creating %s: %s\n", path, strerror(errno));
        return false;
    }
    for (int64_t at = 0; at < n;) {
        ssize_t w = write(fd, data + at, (size_t)(n - at));
        if (w <= 0) {
            fprintf(stderr, "powerloss_vfs: writing %s: %s\n", path, strerror(errno));
            close(fd);
            return false;
        }
        at += w;
    }
    return close(fd) == 0;
}

bool plvfs_write_crash_state(const char *dir, uint64_t seed, double keep_prob,
                             plvfs_crash_stats *stats) {
    plvfs_crash_stats sum = {0};
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    if (!rng) rng = 1;
    bool ok = true;
    for (int i = 0; i < g.n_files && ok; i++) {
        const pl_file *f = g.files[i];
        if (f->is_deleted) continue;
        unsigned char *image = NULL;
        int64_t n = 0, cap = 0;
        ok = image_resize(&image, &n, &cap, f->durable_bytes);
        if (ok && n) memcpy(image, f->durable, (size_t)n);
        // Each sector piece lands or not on its own: a later write may land while an earlier
        // one (even to the same sector) does not, and a write may land in part.
        for (int k = 0; k < f->n_pending && ok; k++) {
            const pl_op *op = &f->pending[k];
            if (op->n_bytes < 0) {
                sum.n_pieces++;
                if (keep(&rng, keep_prob)) {
                    sum.n_applied++;
                    ok = image_resize(&image, &n, &cap, op->offset);
                }
                continue;
            }
            for (int64_t at = op->offset; at < op->offset + op->n_bytes && ok;) {
                int64_t end = (at / PLVFS_SECTOR_BYTES + 1) * PLVFS_SECTOR_BYTES;
                if (end > op->offset + op->n_bytes) end = op->offset + op->n_bytes;
                sum.n_pieces++;
                if (keep(&rng, keep_prob)) {
                    sum.n_applied++;
                    ok = image_write(&image, &n, &cap, at, op->data + (at - op->offset),
                                     end - at);
                }
                at = end;
            }
        }
        const char *base = strrchr(f->path, '/');
        base = base ? base + 1 : f->path;
        char path[4096];
        if (ok && snprintf(path, sizeof path, "%s/%s", dir, base) >= (int)sizeof path) ok = false;
        if (ok) ok = write_all(path, image, n);
        if (ok) sum.n_files++;
        free(image);
    }
    if (stats) *stats = sum;
    return ok;
}
