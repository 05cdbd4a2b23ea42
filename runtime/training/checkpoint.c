/* Checkpoint store: one SQLite file in WAL mode, schema and guarantees in docs/CHECKPOINT.md.
 * A save is one write transaction (delete the step if present, insert the checkpoint row,
 * its tensor rows and their data chunks, prune beyond max_to_keep, commit), so a kill at any
 * moment leaves the file as it was before the save or as it is after it. Tensor data is
 * split into chunks of at most CHUNK_BYTES because SQLite builds each row in memory and caps
 * a value at SQLITE_MAX_LENGTH (10^9 bytes by default). Every tensor carries a CRC-32 of its
 * bytes, checked on restore; a mismatch is DATA_LOSS naming the variable and the file.
 * Chunks are bound in place (SQLITE_STATIC) on save and read with incremental blob I/O
 * straight into the new tensor's buffer on restore; the CRC runs on a helper thread
 * meanwhile. Settings that matter for speed are explained where they are set. The scalar
 * summaries live in the same file, in a table of their own (the end of this file), and so do
 * the slice descriptions of tensors saved as slices of larger variables (a table of their own,
 * made by the first save holding a slice), so this file is the one owner of the file's schema. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "training_impl.h"

#include <sqlite3.h>
#include <zlib.h>

#include "base_impl.h"
#include "distgraph/checkpoint.h"
#include "status_impl.h"

#define CKPT_APP_ID 0x64674370            // "dgCp" in the SQLite header (PRAGMA application_id)
#define CKPT_FORMAT "distgraph-checkpoint"
#define CKPT_VERSION 1                    // bump only with a migration; readers refuse newer
#define CKPT_PAGE_BYTES 65536             // SQLite's largest page: fewer, larger I/O calls
#define CKPT_CACHE_KIB 2048               // page cache per store: small keeps restore's copies
                                          // in CPU caches; saves spill pages to the WAL anyway
#define CHUNK_BYTES ((size_t)16 << 20)    // tensor bytes per chunks row (writer's choice)
#define BUSY_TIMEOUT_MS 10000             // another process holding the write lock

enum {
    Q_FIND_STEP,
    Q_NEWEST,
    Q_DEL_CHUNKS,
    Q_DEL_TENSORS,
    Q_DEL_CKPT,
    Q_INS_CKPT,
    Q_INS_TENSOR,
    Q_SET_CRC,
    Q_INS_CHUNK,
    Q_OLDER,
    Q_LIST,
    Q_LIST_INFO,
    Q_VARS,
    Q_TENSOR,
    Q_CHUNKS,
    N_QUERIES
};

static const char *const query_sql[N_QUERIES] = {
    [Q_FIND_STEP] = "SELECT id, global_step, n_tensors FROM checkpoints WHERE global_step = ?1",
    [Q_NEWEST] = "SELECT id, global_step, n_tensors FROM checkpoints ORDER BY id DESC LIMIT 1",
    [Q_DEL_CHUNKS] = "DELETE FROM chunks WHERE tensor_id IN "
                     "(SELECT id FROM tensors WHERE checkpoint_id = ?1)",
    [Q_DEL_TENSORS] = "DELETE FROM tensors WHERE checkpoint_id = ?1",
    [Q_DEL_CKPT] = "DELETE FROM checkpoints WHERE id = ?1",
    [Q_INS_CKPT] = "INSERT INTO checkpoints(global_step, created_unix_ms, n_tensors) "
                   "VALUES(?1, ?2, ?3)",
    [Q_INS_TENSOR] = "INSERT INTO tensors(checkpoint_id, name, dtype, dims, n_bytes, n_chunks, "
                     "crc32) VALUES(?1, ?2, ?3, ?4, ?5, ?6, 0)",
    [Q_SET_CRC] = "UPDATE tensors SET crc32 = ?2 WHERE id = ?1",
    [Q_INS_CHUNK] = "INSERT INTO chunks(tensor_id, seq, data) VALUES(?1, ?2, ?3)",
    [Q_OLDER] = "SELECT id FROM checkpoints ORDER BY id DESC LIMIT -1 OFFSET ?1",
    [Q_LIST] = "SELECT global_step FROM checkpoints ORDER BY id",
    [Q_LIST_INFO] = "SELECT global_step, created_unix_ms FROM checkpoints ORDER BY id",
    [Q_VARS] = "SELECT name, dtype, dims FROM tensors WHERE checkpoint_id = ?1 ORDER BY id",
    [Q_TENSOR] = "SELECT id, dtype, dims, n_bytes, n_chunks, crc32 FROM tensors "
                 "WHERE checkpoint_id = ?1 AND name = ?2",
    // length() of a blob comes from the record header: the chunk's bytes are not loaded.
    [Q_CHUNKS] = "SELECT rowid, seq, length(data) FROM chunks WHERE tensor_id = ?1 ORDER BY seq",
};

// Kept readable: `sqlite3 FILE .schema` shows it as written here.
static const char schema_sql[] =
    "CREATE TABLE meta(\n"
    "  key TEXT PRIMARY KEY NOT NULL,\n"
    "  value TEXT NOT NULL\n"
    ");\n"
    "INSERT INTO meta(key, value) VALUES('format', '" CKPT_FORMAT "'), ('version', '1'),\n"
    "  ('checksum', 'crc32');\n"
    "CREATE TABLE checkpoints(\n"
    "  id INTEGER PRIMARY KEY,              -- save order: larger is newer\n"
    "  global_step INTEGER NOT NULL UNIQUE,\n"
    "  created_unix_ms INTEGER NOT NULL,\n"
    "  n_tensors INTEGER NOT NULL\n"
    ");\n"
    "CREATE TABLE tensors(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  checkpoint_id INTEGER NOT NULL,      -- checkpoints.id\n"
    "  name TEXT NOT NULL,\n"
    "  dtype INTEGER NOT NULL,              -- dg_dtype (TensorFlow DataType numbers)\n"
    "  dims TEXT NOT NULL,                  -- '[]' scalar, '[2,3]'\n"
    "  n_bytes INTEGER NOT NULL,\n"
    "  n_chunks INTEGER NOT NULL,\n"
    "  crc32 INTEGER NOT NULL,              -- zlib CRC-32 of the n_bytes data bytes\n"
    "  UNIQUE(checkpoint_id, name)\n"
    ");\n"
    "CREATE TABLE chunks(\n"
    "  tensor_id INTEGER NOT NULL,          -- tensors.id\n"
    "  seq INTEGER NOT NULL,                -- 0, 1, ...: the data in order\n"
    "  data BLOB NOT NULL,\n"
    "  PRIMARY KEY(tensor_id, seq)\n"
    ");\n";

struct dg_checkpoint_store {
    sqlite3 *db;
    char *path;                      // as the caller gave it, for messages
    const char *readonly_why;        // static text when saves are refused, else NULL
    sqlite3_stmt *q[N_QUERIES];      // prepared at open, reset after each use
    sqlite3_blob *blob;              // restore's reader, reopened per chunk; NULL between calls
    char doing[384];                 // what the current call does, prefixed to SQLite errors
    int last_rc;                     // extended code of the last SQLite failure
};

// ---- errors ----

// Maps an SQLite result (extended codes on) to what the caller should do next.
static dg_code code_for(int rc, int sys_errno) {
    switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return DG_DATA_LOSS;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_TOOBIG:
        return DG_RESOURCE_EXHAUSTED;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
        return DG_FAILED_PRECONDITION;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return DG_UNAVAILABLE;
    case SQLITE_INTERRUPT:
        return DG_CANCELLED;
    case SQLITE_CONSTRAINT:
        return DG_INVALID_ARGUMENT;
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
        // A write past RLIMIT_FSIZE fails with EFBIG, which SQLite reports as an I/O error.
        if (sys_errno == ENOSPC || sys_errno == EFBIG || sys_errno == EDQUOT)
            return DG_RESOURCE_EXHAUSTED;
        if (sys_errno == EACCES || sys_errno == EPERM || sys_errno == EROFS)
            return DG_FAILED_PRECONDITION;
        if (sys_errno == ENOENT && (rc & 0xff) == SQLITE_CANTOPEN) return DG_NOT_FOUND;
        return DG_UNAVAILABLE;
    default:
        return DG_INTERNAL;
    }
}

// Records the SQLite failure rc of `call` (source line `line`) into st: the file, what the
// store was doing, SQLite's message and extended result code, errno where SQLite saw one.
static void sq_fail(dg_checkpoint_store *s, int rc, const char *call, int line, dg_status *st) {
    s->last_rc = rc;
    int sys_errno = s->db ? sqlite3_system_errno(s->db) : 0;
    const char *msg = s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
    char sys[160] = "";
    if (sys_errno && ((rc & 0xff) == SQLITE_IOERR || (rc & 0xff) == SQLITE_CANTOPEN ||
                      (rc & 0xff) == SQLITE_FULL))
        snprintf(sys, sizeof sys, ", errno %d: %s", sys_errno, strerror(sys_errno));
    const char *hint = "";
    if ((rc & 0xff) == SQLITE_NOTADB)
        hint = " (not an SQLite database: a wrong file, or its header is damaged)";
    else if ((rc & 0xff) == SQLITE_CORRUPT)
        hint = " (the file is damaged)";
    // Where in the code and which SQLite call: for developers, behind DG_DEBUG_ERRORS=1.
    char where[256] = "";
    if (status_impl_debug_errors())
        snprintf(where, sizeof where, " [SQLite %d in %s at runtime/training/checkpoint.c:%d]", rc, call, line);
    dg_status_setf(st, code_for(rc, sys_errno), "checkpoint \"%s\": %s: %s%s%s%s", s->path,
                   s->doing[0] ? s->doing : "opening", msg, hint, sys, where);
}

// Third-party check for SQLite calls that return SQLITE_OK on success.
#define SQ_CHECK(s, call, st)                                    \
    do {                                                         \
        int rc_ = (call);                                        \
        if (rc_ != SQLITE_OK) {                                  \
            sq_fail((s), rc_, #call, __LINE__, (st));            \
            goto fail;                                           \
        }                                                        \
    } while (0)

// Steps a statement into rcvar (SQLITE_ROW or SQLITE_DONE), else records and jumps to fail.
#define SQ_STEP(s, stmt, rcvar, st)                              \
    do {                                                         \
        (rcvar) = sqlite3_step(stmt);                            \
        if ((rcvar) != SQLITE_ROW && (rcvar) != SQLITE_DONE) {   \
            sq_fail((s), (rcvar), "sqlite3_step(" #stmt ")", __LINE__, (st)); \
            goto fail;                                           \
        }                                                        \
    } while (0)

static void set_doing(dg_checkpoint_store *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_doing(dg_checkpoint_store *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->doing, sizeof s->doing, fmt, ap);
    va_end(ap);
}

// Resets every statement (releasing read locks and bound blob pointers) and rolls back an
// open transaction. Used on every exit path, so nothing is left half-done.
static void end_call(dg_checkpoint_store *s, bool rollback) {
    if (s->blob) {
        sqlite3_blob_close(s->blob);
        s->blob = NULL;
    }
    for (int i = 0; i < N_QUERIES; i++) {
        if (!s->q[i]) continue;
        sqlite3_reset(s->q[i]);
        sqlite3_clear_bindings(s->q[i]);
    }
    if (rollback && !sqlite3_get_autocommit(s->db))
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    s->doing[0] = '\0';
}

// ---- CRC-32 on a helper thread ----

// Big chunks get their CRC computed on a helper thread while SQLite copies them (save) or
// while the next chunk is read (restore): the CRC costs about as much CPU as the copies.
#define CRC_THREAD_MIN_BYTES ((size_t)1 << 20)
#define RESTORE_PIECE_BYTES ((int64_t)4 << 20)   // restore reads and checks chunks in pieces

typedef struct crc_job {
    pthread_t thread;
    const unsigned char *data;
    size_t len;
    uLong crc;        // in: CRC of the bytes before data; out: CRC through data[len - 1]
    bool is_running;  // on the helper thread: crc_finish() before reading crc or freeing data
} crc_job;

static void *crc_run(void *arg) {
    crc_job *j = arg;
    j->crc = crc32_z(j->crc, j->data, j->len);
    return NULL;
}

static void crc_start(crc_job *j, uLong crc, const unsigned char *data, size_t len) {
    j->crc = crc;
    j->data = data;
    j->len = len;
    j->is_running =
        len >= CRC_THREAD_MIN_BYTES && pthread_create(&j->thread, NULL, crc_run, j) == 0;
    if (!j->is_running) crc_run(j);
}

// Waits for the job (if any runs) and returns the CRC through its chunk. Idempotent.
static uLong crc_finish(crc_job *j) {
    if (j->is_running) {
        pthread_join(j->thread, NULL);
        j->is_running = false;
    }
    return j->crc;
}

// ---- dims text: "[]" for a scalar, "[2,3]" ----

static void dims_text(const dg_shape *sh, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < sh->rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)sh->dims[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

// Strict parse of dims_text's output; false for anything else.
static bool parse_dims(const char *text, dg_shape *out) {
    if (!text || *text != '[') return false;
    const char *p = text + 1;
    int rank = 0;
    int64_t dims[DG_MAX_RANK];
    if (*p == ']') {
        p++;
    } else {
        for (;;) {
            if (rank == DG_MAX_RANK || *p < '0' || *p > '9') return false;
            int64_t v = 0;
            while (*p >= '0' && *p <= '9') {
                if (v > (INT64_MAX - 9) / 10) return false;
                v = v * 10 + (*p++ - '0');
            }
            dims[rank++] = v;
            if (*p == ']') {
                p++;
                break;
            }
            if (*p++ != ',') return false;
        }
    }
    if (*p) return false;
    *out = dg_shape_make(rank, dims);
    return true;
}

// Bytes of a tensor of dtype and shape; -1 when invalid or beyond SIZE_MAX/INT64_MAX.
static int64_t shape_bytes(dg_dtype dtype, const dg_shape *sh) {
    if (!dg_dtype_is_valid(dtype) || sh->rank < 0 || sh->rank > DG_MAX_RANK) return -1;
    int64_t n = (int64_t)dg_dtype_size(dtype);
    for (int i = 0; i < sh->rank; i++) {
        int64_t d = sh->dims[i];
        if (d < 0) return -1;
        if (d && n > INT64_MAX / d) return -1;
        n *= d;
    }
    if ((uint64_t)n > SIZE_MAX) return -1;
    return n;
}

// ---- open / close ----

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

// "file:<path, percent-encoded>?immutable=1": read-only, no locks, no WAL, no -shm.
static char *immutable_uri(const char *path) {
    size_t n = strlen(path);
    char *u = malloc(3 * n + 32);
    if (!u) return NULL;
    char *w = u + sprintf(u, "file:");
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("/-._~", *p))
            *w++ = (char)*p;
        else
            w += sprintf(w, "%%%02X", *p);
    }
    strcpy(w, "?immutable=1");
    return u;
}

static bool prepare_all(dg_checkpoint_store *s, dg_status *st) {
    for (int i = 0; i < N_QUERIES; i++) {
        int rc = sqlite3_prepare_v3(s->db, query_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->q[i],
                                    NULL);
        if (rc != SQLITE_OK) {
            // The tables exist (we checked meta) but lack our columns: not our format 1.
            dg_status_setf(st, (rc & 0xff) == SQLITE_ERROR ? DG_FAILED_PRECONDITION
                                                           : code_for(rc, 0),
                           "checkpoint \"%s\": the tables do not match checkpoint format %d: %s",
                           s->path, CKPT_VERSION, sqlite3_errmsg(s->db));
            return false;
        }
    }
    return true;
}

// Runs a one-row integer query (a PRAGMA or a count) into *v.
static bool query_int(dg_checkpoint_store *s, const char *sql, int64_t *v, dg_status *st) {
    sqlite3_stmt *q = NULL;
    int rc;
    SQ_CHECK(s, sqlite3_prepare_v2(s->db, sql, -1, &q, NULL), st);
    SQ_STEP(s, q, rc, st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0;
    sqlite3_finalize(q);
    return true;
fail:
    sqlite3_finalize(q);
    return false;
}

// Creates the schema in an empty database, in one transaction (a kill leaves it empty).
static bool init_schema(dg_checkpoint_store *s, dg_status *st) {
    int64_t n_tables = 0;
    char sql[64];
    set_doing(s, "creating the checkpoint schema");
    // page_size takes effect only before the first page is written, i.e. now.
    snprintf(sql, sizeof sql, "PRAGMA page_size = %d", CKPT_PAGE_BYTES);
    SQ_CHECK(s, sqlite3_exec(s->db, sql, NULL, NULL, NULL), st);
    // With auto_vacuum the file keeps a map of each page's parent, so deleting a pruned
    // checkpoint frees its overflow chains without reading them (1 GiB less to read per GiB
    // pruned). INCREMENTAL: pages are never moved; later saves reuse the free ones.
    SQ_CHECK(s, sqlite3_exec(s->db, "PRAGMA auto_vacuum = INCREMENTAL", NULL, NULL, NULL), st);
    SQ_CHECK(s, sqlite3_exec(s->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL), st);
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), st);
    // Another process may have created it between our check and our write lock.
    if (!query_int(s, "SELECT count(*) FROM sqlite_master", &n_tables, st)) goto fail;
    if (n_tables == 0) {
        SQ_CHECK(s, sqlite3_exec(s->db, schema_sql, NULL, NULL, NULL), st);
        snprintf(sql, sizeof sql, "PRAGMA application_id = %d", CKPT_APP_ID);
        SQ_CHECK(s, sqlite3_exec(s->db, sql, NULL, NULL, NULL), st);
    }
    SQ_CHECK(s, sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL), st);
    s->doing[0] = '\0';
    return true;
fail:
    if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    s->doing[0] = '\0';
    return false;
}

// Detects a truncated file. SQLite reads pages past the end of the file as zeros, so a cut
// that removes only unused bytes of the last pages, or whole pages that a query never
// reaches, would otherwise go unnoticed. Only checked without WAL content: pages still in
// the WAL may legitimately lie beyond the end of the main file.
static bool check_size(dg_checkpoint_store *s, dg_status *st) {
    const char *db_name = sqlite3_db_filename(s->db, "main");
    const char *wal_name = db_name ? sqlite3_filename_wal(db_name) : NULL;
    struct stat db_sb, wal_sb;
    int64_t n_pages = 0, page_bytes = 0;
    if (!db_name || !*db_name || stat(db_name, &db_sb) != 0) return true;
    if (wal_name && stat(wal_name, &wal_sb) == 0 && wal_sb.st_size > 0) return true;
    if (!query_int(s, "PRAGMA page_count", &n_pages, st) ||
        !query_int(s, "PRAGMA page_size", &page_bytes, st))
        return false;
    if ((int64_t)db_sb.st_size < n_pages * page_bytes) {
        dg_status_setf(st, DG_DATA_LOSS,
                       "checkpoint \"%s\": the file is truncated: %lld bytes, its header "
                       "describes %lld pages of %lld bytes",
                       s->path, (long long)db_sb.st_size, (long long)n_pages,
                       (long long)page_bytes);
        return false;
    }
    return true;
}

// Checks that the file is a distgraph checkpoint this build can read; creates the schema in
// an empty database when create is set. Reads only, unless it creates.
static bool check_format(dg_checkpoint_store *s, bool create, dg_status *st) {
    int64_t app_id = 0, n_tables = 0;
    sqlite3_stmt *q = NULL;
    int rc;
    set_doing(s, "reading the header and the schema");
    // The first read of the header: a file that is not SQLite fails here with NOTADB.
    if (!query_int(s, "PRAGMA application_id", &app_id, st)) return false;
    if (!query_int(s, "SELECT count(*) FROM sqlite_master", &n_tables, st)) return false;
    if (n_tables == 0) {
        if (!create) {
            dg_status_setf(st, DG_FAILED_PRECONDITION,
                           "checkpoint \"%s\": an empty SQLite database, not a distgraph "
                           "checkpoint (open with create to start one)",
                           s->path);
            return false;
        }
        if (s->readonly_why) {
            dg_status_setf(st, DG_FAILED_PRECONDITION,
                           "checkpoint \"%s\": cannot create the checkpoint schema: %s", s->path,
                           s->readonly_why);
            return false;
        }
        if (!init_schema(s, st)) return false;
        if (!query_int(s, "PRAGMA application_id", &app_id, st)) return false;
    }
    if (app_id != CKPT_APP_ID) {
        dg_status_setf(st, DG_FAILED_PRECONDITION,
                       "checkpoint \"%s\": an SQLite database of another schema, not a "
                       "distgraph checkpoint (application_id 0x%llx, expected 0x%x)",
                       s->path, (unsigned long long)app_id, CKPT_APP_ID);
        return false;
    }
    char format[64] = "", version[32] = "";
    rc = sqlite3_prepare_v2(s->db, "SELECT key, value FROM meta", -1, &q, NULL);
    if (rc != SQLITE_OK) {
        dg_status_setf(st, DG_FAILED_PRECONDITION,
                       "checkpoint \"%s\": carries the distgraph application_id but %s", s->path,
                       sqlite3_errmsg(s->db));
        sqlite3_finalize(q);
        return false;
    }
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(q, 0);
        const char *v = (const char *)sqlite3_column_text(q, 1);
        if (!k || !v) continue;
        if (strcmp(k, "format") == 0) snprintf(format, sizeof format, "%s", v);
        if (strcmp(k, "version") == 0) snprintf(version, sizeof version, "%s", v);
    }
    if (rc != SQLITE_DONE) {
        sq_fail(s, rc, "sqlite3_step(SELECT key, value FROM meta)", __LINE__, st);
        sqlite3_finalize(q);
        return false;
    }
    sqlite3_finalize(q);
    char *end = NULL;
    long ver = strtol(version, &end, 10);
    if (strcmp(format, CKPT_FORMAT) != 0 || !version[0] || *end || ver < 1) {
        dg_status_setf(st, DG_DATA_LOSS,
                       "checkpoint \"%s\": table meta holds format \"%s\" version \"%s\", "
                       "expected \"%s\" version %d",
                       s->path, format, version, CKPT_FORMAT, CKPT_VERSION);
        return false;
    }
    if (ver > CKPT_VERSION) {
        dg_status_setf(st, DG_FAILED_PRECONDITION,
                       "checkpoint \"%s\": format version %ld is newer than this build reads (%d)",
                       s->path, ver, CKPT_VERSION);
        return false;
    }
    return check_size(s, st);
}

bool training_make_dir(const char *dir, const char *what, const char *name, dg_status *st) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s \"%s\": the path is too long", what, name);
        return false;
    }
    struct stat sb;
    if (stat(buf, &sb) != 0) {
        // mkdir -p, each missing level in turn.
        for (char *p = buf + 1;; p++) {
            if (*p != '/' && *p != '\0') continue;
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                dg_status_setf(st, e == EACCES || e == EROFS ? DG_PERMISSION_DENIED : DG_FAILED_PRECONDITION,
                               "%s \"%s\": cannot make its directory \"%s\": %s", what, name, buf, strerror(e));
                return false;
            }
            *p = c;
            if (!c) break;
        }
        return true;
    }
    if (!S_ISDIR(sb.st_mode)) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "%s \"%s\": \"%s\" is not a directory", what, name, buf);
        return false;
    }
    if (access(buf, W_OK | X_OK) != 0) {
        int e = errno;
        dg_status_setf(st, e == EACCES || e == EROFS ? DG_PERMISSION_DENIED : DG_FAILED_PRECONDITION,
                       "%s \"%s\": cannot create it: the directory \"%s\" is not writable (%s); pick "
                       "a directory this user can write to", what, name, buf, strerror(e));
        return false;
    }
    return true;
}

// Creating path: its directory is made when missing (as TensorFlow's savers make theirs), and
// one this user cannot write to is named as such, before SQLite reports it as a missing file.
static bool make_parent(const char *path, dg_status *st) {
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": the path is too long", path);
        return false;
    }
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    return training_make_dir(dir, "checkpoint", path, st);
}

static bool open_db(dg_checkpoint_store *s, const char *name, int flags, dg_status *st) {
    if (s->db) {
        sqlite3_close_v2(s->db);
        s->db = NULL;
    }
    int rc = sqlite3_open_v2(name, &s->db, flags | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        sq_fail(s, rc, "sqlite3_open_v2", __LINE__, st);
        return false;
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);
    if (sqlite3_db_readonly(s->db, "main") == 1 && !s->readonly_why)
        s->readonly_why = "the file is read-only";
    return true;
}

dg_checkpoint_store *dg_checkpoint_store_new(const char *path, bool create, dg_status *st) {
    dg_status_reset(st);
    if (!path || !*path) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: empty path");
        return NULL;
    }
    dg_checkpoint_store *s = calloc(1, sizeof *s);
    if (!s || !(s->path = dup_str(path))) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", path);
        free(s);
        return NULL;
    }
    bool is_uri = strncmp(path, "file:", 5) == 0;
    dg_status *probe = dg_status_new();
    char *uri = NULL;
    if (!is_uri) {
        struct stat sb;
        if (stat(path, &sb) != 0 && errno == ENOENT && create && !make_parent(path, st)) goto fail;
        if (stat(path, &sb) != 0) {
            if (errno != ENOENT || !create) {
                dg_status_setf(st, errno == ENOENT ? DG_NOT_FOUND : DG_FAILED_PRECONDITION,
                               "checkpoint \"%s\": %s", path, strerror(errno));
                goto fail;
            }
        } else if (!S_ISREG(sb.st_mode)) {
            dg_status_setf(st, DG_FAILED_PRECONDITION, "checkpoint \"%s\": not a regular file",
                           path);
            goto fail;
        }
    }
    if (!probe) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", path);
        goto fail;
    }
    int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
    if (!open_db(s, path, flags, st)) goto fail;
    if (!check_format(s, create, probe)) {
        // WAL mode needs the -shm (and -wal) file beside the database; in a directory we may
        // not write, SQLite refuses even to read. Without a -wal file every committed
        // checkpoint is in the main file, so reading it as immutable is exact.
        int ext = s->last_rc;
        char wal[PATH_MAX];
        bool no_wal = snprintf(wal, sizeof wal, "%s-wal", path) < (int)sizeof wal &&
                      access(wal, F_OK) != 0;
        if (is_uri || (ext != SQLITE_READONLY_DIRECTORY && ext != SQLITE_READONLY_CANTINIT &&
                       ext != SQLITE_CANTOPEN) || !no_wal) {
            dg_status_copy(st, probe);
            goto fail;
        }
        if (!(uri = immutable_uri(path))) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", path);
            goto fail;
        }
        s->readonly_why = "its directory is not writable (opened read-only, as immutable)";
        if (!open_db(s, uri, SQLITE_OPEN_READONLY, st) || !check_format(s, false, st))
            goto fail;
    }
    set_doing(s, "setting up the connection");
    if (!s->readonly_why)
        SQ_CHECK(s, sqlite3_exec(s->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL), st);
    // FULL: the commit fsyncs the WAL, so a returned save also survives a power cut, not just
    // a killed process (which NORMAL would already survive in WAL mode).
    SQ_CHECK(s, sqlite3_exec(s->db, "PRAGMA synchronous = FULL", NULL, NULL, NULL), st);
    // Some builds (Debian's) default to secure_delete, which overwrites every page a pruned
    // checkpoint frees with zeros: as many bytes written again as the checkpoint holds.
    SQ_CHECK(s, sqlite3_exec(s->db, "PRAGMA secure_delete = OFF", NULL, NULL, NULL), st);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA cache_size = -%d", CKPT_CACHE_KIB);
    SQ_CHECK(s, sqlite3_exec(s->db, sql, NULL, NULL, NULL), st);
    // Saves checkpoint the WAL themselves right after their commit (see dg_checkpoint_save).
    SQ_CHECK(s, sqlite3_exec(s->db, "PRAGMA wal_autocheckpoint = 0", NULL, NULL, NULL), st);
    s->doing[0] = '\0';
    if (!prepare_all(s, st)) goto fail;
    free(uri);
    dg_status_free(&probe);
    return s;
fail:
    free(uri);
    dg_status_free(&probe);
    dg_checkpoint_store_free(&s);
    return NULL;
}

void dg_checkpoint_store_free(dg_checkpoint_store **sp) {
    if (!sp || !*sp) return;
    dg_checkpoint_store *s = *sp;
    if (s->blob) sqlite3_blob_close(s->blob);
    for (int i = 0; i < N_QUERIES; i++) sqlite3_finalize(s->q[i]);
    // The last connection to close checkpoints the WAL into the file and deletes it.
    if (s->db) sqlite3_close_v2(s->db);
    free(s->path);
    free(s);
    *sp = NULL;
}

// ---- sliced variables: schema, regions, checks ----
// The table is made by the first save that holds a slice, as the summaries table by its first
// write: a file without it holds no slices, and files that never held one keep the schema of
// earlier releases. A row says that tensor tensor_id is a slice of full_name. The trigger
// deletes a tensor's row with the tensor, so pruning and replacing checkpoints need not know
// of the table, also when an earlier release saves into a file that has one (tensors.id values
// are reused after deletes: a row left behind would describe another tensor). Its statements
// are prepared per call, since the table may appear after the store opened.

static const char slices_sql[] =
    "CREATE TABLE IF NOT EXISTS slices(\n"
    "  tensor_id INTEGER PRIMARY KEY,       -- tensors.id: this tensor is a slice of\n"
    "  full_name TEXT NOT NULL,             -- the whole variable\n"
    "  full_dims TEXT NOT NULL,             -- the whole variable's shape, as tensors.dims\n"
    "  offsets TEXT NOT NULL                -- the slice's first index in each dimension, '[4,0]'\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS slices_by_full_name ON slices(full_name);\n"
    "CREATE TRIGGER IF NOT EXISTS slices_follow_tensors AFTER DELETE ON tensors BEGIN\n"
    "  DELETE FROM slices WHERE tensor_id = old.id;\n"
    "END;\n";

// Whether the file has a table of this name (inside the caller's transaction, if any).
static bool has_table(dg_checkpoint_store *s, const char *name, bool *has, dg_status *st) {
    sqlite3_stmt *q = NULL;
    int rc;
    SQ_CHECK(s, sqlite3_prepare_v2(s->db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                                   -1, &q, NULL), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC), st);
    SQ_STEP(s, q, rc, st);
    *has = rc == SQLITE_ROW && sqlite3_column_int64(q, 0) > 0;
    sqlite3_finalize(q);
    return true;
fail:
    sqlite3_finalize(q);
    return false;
}

// Prepares sql over one of the tables made on demand (table, with the columns named in
// columns); a table without our columns is FAILED_PRECONDITION.
static bool prepare_on_demand(dg_checkpoint_store *s, const char *sql, const char *table, const char *columns,
                              sqlite3_stmt **q, dg_status *st) {
    int rc = sqlite3_prepare_v2(s->db, sql, -1, q, NULL);
    if (rc == SQLITE_OK) return true;
    if ((rc & 0xff) == SQLITE_ERROR) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "checkpoint \"%s\": %s: the %s table does not have the columns %s: %s",
                       s->path, s->doing, table, columns, sqlite3_errmsg(s->db));
        return false;
    }
    char what[64];
    snprintf(what, sizeof what, "sqlite3_prepare_v2(%s)", table);
    sq_fail(s, rc, what, __LINE__, st);
    return false;
}

static bool prepare_slices(dg_checkpoint_store *s, const char *sql, sqlite3_stmt **q, dg_status *st) {
    return prepare_on_demand(s, sql, "slices", "(tensor_id, full_name, full_dims, offsets)", q, st);
}

// A box in a variable of some full shape: [off[d], off[d] + dims[d]) in each dimension d.
typedef struct region {
    int rank;
    int64_t off[DG_MAX_RANK];
    int64_t dims[DG_MAX_RANK];
} region;

static region region_of(const dg_shape *shape, const int64_t *offset) {
    region r;
    memset(&r, 0, sizeof r);
    r.rank = shape->rank;
    for (int d = 0; d < shape->rank; d++) {
        r.off[d] = offset[d];
        r.dims[d] = shape->dims[d];
    }
    return r;
}

// Whether r lies inside a variable of shape full (ranks equal, >= 1).
static bool region_fits(const region *r, const dg_shape *full) {
    if (r->rank < 1 || r->rank > DG_MAX_RANK || r->rank != full->rank) return false;
    for (int d = 0; d < r->rank; d++)
        if (full->dims[d] < 0 || r->dims[d] < 0 || r->off[d] < 0 || r->off[d] > full->dims[d] - r->dims[d])
            return false;
    return true;
}

// The common part of a and b in *both; false when it holds no element.
static bool regions_meet(const region *a, const region *b, region *both) {
    both->rank = a->rank;
    for (int d = 0; d < a->rank; d++) {
        int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        int64_t ha = a->off[d] + a->dims[d], hb = b->off[d] + b->dims[d];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo) return false;
        both->off[d] = lo;
        both->dims[d] = hi - lo;
    }
    return true;
}

// "rows [a, b)" when r spans every other dimension of full, else "[a:b,c:d]".
static char *region_str(const region *r, const dg_shape *full, char *buf, size_t cap) {
    bool rows = true;
    for (int d = 1; d < r->rank; d++) rows = rows && r->off[d] == 0 && r->dims[d] == full->dims[d];
    if (rows) {
        snprintf(buf, cap, "rows [%lld, %lld)", (long long)r->off[0], (long long)(r->off[0] + r->dims[0]));
        return buf;
    }
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < r->rank && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld:%lld", d ? "," : "", (long long)r->off[d],
                              (long long)(r->off[d] + r->dims[d]));
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

// Parses a slices row (full name, full dims and offsets as text) of a tensor of shape into
// *full and *r; false when it does not parse or the tensor does not fit the full shape there.
static bool read_slice_row(const char *full_name, const char *full_dims, const char *offsets, const dg_shape *shape,
                           dg_shape *full, region *r) {
    dg_shape off;
    if (!full_name || !*full_name || strlen(full_name) >= sizeof ((dg_checkpoint_var *)0)->name ||
        !parse_dims(full_dims, full) || !parse_dims(offsets, &off) || off.rank != shape->rank)
        return false;
    *r = region_of(shape, off.dims);
    return region_fits(r, full);
}

// The slice arguments of a save (names and values already checked): each slice fits its full
// shape, the slices of one full name agree on it and on the dtype and do not overlap, and no
// whole tensor of the save carries a full name. *any: whether there is a slice at all.
static bool check_slice_args(const dg_checkpoint_store *s, int64_t step, const char *const *names,
                             dg_tensor *const *values, const dg_checkpoint_slice *slices, int n, bool *any,
                             dg_status *st) {
    char a[160], b[160];
    for (int i = 0; i < n; i++) {
        const dg_checkpoint_slice *si = &slices[i];
        if (!si->full_name) continue;
        *any = true;
        const dg_shape *sh = dg_tensor_shape(values[i]);
        size_t len = strlen(si->full_name);
        if (len == 0 || len >= sizeof ((dg_checkpoint_var *)0)->name) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "checkpoint \"%s\": save of step %lld: variable \"%s\": the full name of its slice is "
                           "%s (1 to %zu bytes)", s->path, (long long)step, names[i], len ? "too long" : "empty",
                           sizeof ((dg_checkpoint_var *)0)->name - 1);
            return false;
        }
        region ri = region_of(sh, si->offset);
        if (!dg_shape_is_fully_defined(&si->full_shape) || !region_fits(&ri, &si->full_shape)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "checkpoint \"%s\": save of step %lld: variable \"%s\" (%s) does not fit as a slice of "
                           "\"%s\" %s at its offsets", s->path, (long long)step, names[i],
                           dg_shape_str(sh, a, sizeof a), si->full_name, dg_shape_str(&si->full_shape, b, sizeof b));
            return false;
        }
        for (int j = 0; j < n; j++) {
            const dg_checkpoint_slice *sj = &slices[j];
            if (!sj->full_name) {
                if (strcmp(names[j], si->full_name) == 0) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "checkpoint \"%s\": save of step %lld: variable \"%s\" is saved whole and as "
                                   "the full variable of the slice \"%s\"", s->path, (long long)step, names[j],
                                   names[i]);
                    return false;
                }
                continue;
            }
            if (j >= i || strcmp(sj->full_name, si->full_name) != 0) continue;
            if (dg_tensor_dtype(values[j]) != dg_tensor_dtype(values[i]) ||
                !dg_shape_equal(&sj->full_shape, &si->full_shape)) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "checkpoint \"%s\": save of step %lld: the slices \"%s\" and \"%s\" of \"%s\" disagree "
                               "on the variable: %s %s and %s %s", s->path, (long long)step, names[j], names[i],
                               si->full_name, dg_dtype_name(dg_tensor_dtype(values[j])),
                               dg_shape_str(&sj->full_shape, a, sizeof a), dg_dtype_name(dg_tensor_dtype(values[i])),
                               dg_shape_str(&si->full_shape, b, sizeof b));
                return false;
            }
            region rj = region_of(dg_tensor_shape(values[j]), sj->offset), both;
            if (regions_meet(&ri, &rj, &both)) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "checkpoint \"%s\": save of step %lld: the slices \"%s\" (%s) and \"%s\" (%s) of \"%s\" "
                               "overlap", s->path, (long long)step, names[j],
                               region_str(&rj, &sj->full_shape, a, sizeof a), names[i], region_str(&ri, &si->full_shape, b, sizeof b), si->full_name);
                return false;
            }
        }
    }
    return true;
}

// Inserts the slices row of tensor_id (inside the save's transaction).
static bool save_slice_row(dg_checkpoint_store *s, sqlite3_stmt *q, int64_t tensor_id, const dg_checkpoint_slice *sl,
                           const dg_tensor *t, dg_status *st) {
    char full[DG_MAX_RANK * 21 + 4], offs[DG_MAX_RANK * 21 + 4];
    int rc;
    dims_text(&sl->full_shape, full, sizeof full);
    dg_shape off = dg_shape_make(dg_tensor_rank(t), sl->offset);
    dims_text(&off, offs, sizeof offs);
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, tensor_id), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 2, sl->full_name, -1, SQLITE_STATIC), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 3, full, -1, SQLITE_STATIC), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 4, offs, -1, SQLITE_STATIC), st);
    SQ_STEP(s, q, rc, st);
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    return true;
fail:
    sqlite3_reset(q);
    return false;
}

// ---- save ----

static bool check_save_args(const dg_checkpoint_store *s, int64_t step, const char *const *names,
                            dg_tensor *const *values, int n, int max_to_keep, dg_status *st) {
    if (step < 0 || n < 0 || max_to_keep < 0 || (n > 0 && (!names || !values))) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "checkpoint \"%s\": save of step %lld: bad arguments (n %d, max_to_keep "
                       "%d, steps are >= 0)",
                       s->path, (long long)step, n, max_to_keep);
        return false;
    }
    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        size_t len = name ? strlen(name) : 0;
        if (len == 0 || len >= sizeof ((dg_checkpoint_var *)0)->name) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "checkpoint \"%s\": save of step %lld: name %d is %s (1 to %zu bytes)",
                           s->path, (long long)step, i, name ? "too long" : "NULL",
                           sizeof ((dg_checkpoint_var *)0)->name - 1);
            return false;
        }
        const dg_tensor *t = values[i];
        if (!t) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "checkpoint \"%s\": save of step %lld: variable \"%s\" has no value",
                           s->path, (long long)step, name);
            return false;
        }
        int64_t nb = shape_bytes(dg_tensor_dtype(t), dg_tensor_shape(t));
        if (nb < 0 || (size_t)nb != dg_tensor_nbytes(t) || (nb > 0 && !dg_tensor_data(t))) {
            char sb[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "checkpoint \"%s\": save of step %lld: variable \"%s\": a %s %s "
                           "tensor of %zu bytes cannot be stored",
                           s->path, (long long)step, name, dg_dtype_name(dg_tensor_dtype(t)),
                           dg_shape_str(dg_tensor_shape(t), sb, sizeof sb),
                           dg_tensor_nbytes(t));
            return false;
        }
    }
    return true;
}

// Deletes checkpoint id with its tensors and chunks (inside the caller's transaction).
static bool delete_checkpoint(dg_checkpoint_store *s, int64_t id, dg_status *st) {
    static const int order[] = {Q_DEL_CHUNKS, Q_DEL_TENSORS, Q_DEL_CKPT};
    int rc;
    for (int i = 0; i < 3; i++) {
        sqlite3_stmt *q = s->q[order[i]];
        SQ_CHECK(s, sqlite3_bind_int64(q, 1, id), st);
        SQ_STEP(s, q, rc, st);
        sqlite3_reset(q);
    }
    return true;
fail:
    return false;
}

// Writes one tensor's row and chunks; the CRC is computed chunk by chunk just before SQLite
// copies the chunk, while it is still in the CPU caches.
static bool save_tensor(dg_checkpoint_store *s, int64_t ckpt_id, const char *name,
                        const dg_tensor *t, int64_t *tensor_id_out, dg_status *st) {
    char dims[DG_MAX_RANK * 21 + 4];
    dims_text(dg_tensor_shape(t), dims, sizeof dims);
    size_t nbytes = dg_tensor_nbytes(t);
    const unsigned char *data = dg_tensor_data(t);
    int64_t n_chunks = (int64_t)((nbytes + CHUNK_BYTES - 1) / CHUNK_BYTES);
    sqlite3_stmt *q = s->q[Q_INS_TENSOR];
    crc_job job = {.is_running = false};
    int rc;
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, ckpt_id), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC), st);
    SQ_CHECK(s, sqlite3_bind_int(q, 3, (int)dg_tensor_dtype(t)), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 4, dims, -1, SQLITE_STATIC), st);
    SQ_CHECK(s, sqlite3_bind_int64(q, 5, (int64_t)nbytes), st);
    SQ_CHECK(s, sqlite3_bind_int64(q, 6, n_chunks), st);
    rc = sqlite3_step(q);
    if (rc == SQLITE_CONSTRAINT_UNIQUE) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": %s: the name is given twice",
                       s->path, s->doing);
        goto fail;
    }
    if (rc != SQLITE_DONE) {
        sq_fail(s, rc, "sqlite3_step(insert tensor)", __LINE__, st);
        goto fail;
    }
    sqlite3_reset(q);
    int64_t tensor_id = sqlite3_last_insert_rowid(s->db);
    *tensor_id_out = tensor_id;
    uLong crc = crc32_z(0L, Z_NULL, 0);
    q = s->q[Q_INS_CHUNK];
    for (int64_t k = 0; k < n_chunks; k++) {
        size_t off = (size_t)k * CHUNK_BYTES;
        size_t len = nbytes - off < CHUNK_BYTES ? nbytes - off : CHUNK_BYTES;
        crc_start(&job, crc, data + off, len);
        SQ_CHECK(s, sqlite3_bind_int64(q, 1, tensor_id), st);
        SQ_CHECK(s, sqlite3_bind_int64(q, 2, k), st);
        // SQLITE_STATIC: SQLite reads the tensor's buffer in place during the step.
        SQ_CHECK(s, sqlite3_bind_blob64(q, 3, data + off, len, SQLITE_STATIC), st);
        SQ_STEP(s, q, rc, st);
        sqlite3_reset(q);
        sqlite3_clear_bindings(q);
        crc = crc_finish(&job);
    }
    q = s->q[Q_SET_CRC];
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, tensor_id), st);
    SQ_CHECK(s, sqlite3_bind_int64(q, 2, (int64_t)crc), st);
    SQ_STEP(s, q, rc, st);
    sqlite3_reset(q);
    return true;
fail:
    crc_finish(&job);
    return false;
}

bool dg_checkpoint_save(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                        dg_tensor *const *values, int n, int max_to_keep, dg_status *st) {
    return dg_checkpoint_save_slices(s, global_step, names, values, NULL, n, max_to_keep, st);
}

// ---- named blobs ----
// Bytes saved with a checkpoint under a name, in the same transaction as its tensors (an input
// pipeline's position: distgraph/dataset.h). The table is made by the first save holding a
// blob; a trigger removes a checkpoint's blobs with it (replaced, pruned), also when an earlier
// release deletes the checkpoint.

#define BLOB_MAX_BYTES ((size_t)512 << 20)   // under SQLite's 10^9-byte value limit

static bool find_checkpoint(dg_checkpoint_store *s, int64_t step, int64_t *id, int64_t *found,
                            int64_t *n_tensors, dg_status *st);

static const char blobs_sql[] =
    "CREATE TABLE IF NOT EXISTS blobs(\n"
    "  checkpoint_id INTEGER NOT NULL,      -- checkpoints.id\n"
    "  name TEXT NOT NULL,\n"
    "  crc32 INTEGER NOT NULL,              -- zlib CRC-32 of data\n"
    "  data BLOB NOT NULL,\n"
    "  PRIMARY KEY(checkpoint_id, name)\n"
    ");\n"
    "CREATE TRIGGER IF NOT EXISTS blobs_follow_checkpoints AFTER DELETE ON checkpoints BEGIN\n"
    "  DELETE FROM blobs WHERE checkpoint_id = old.id;\n"
    "END;\n";

static bool check_blob_args(const dg_checkpoint_store *s, const dg_checkpoint_blob *blobs, int n_blobs,
                            dg_status *st) {
    if (n_blobs < 0 || (n_blobs > 0 && !blobs)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": save: %d blobs, array %s", s->path, n_blobs,
                       blobs ? "given" : "NULL");
        return false;
    }
    for (int i = 0; i < n_blobs; i++) {
        const dg_checkpoint_blob *b = &blobs[i];
        size_t len = b->name ? strlen(b->name) : 0;
        if (len < 1 || len > 255 || (!b->data && b->n_bytes) || b->n_bytes > BLOB_MAX_BYTES) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": save: blob %d (\"%s\"): name of 1 to 255 bytes "
                           "and at most %zu bytes of data needed, got %zu", s->path, i, b->name ? b->name : "(null)",
                           BLOB_MAX_BYTES, b->n_bytes);
            return false;
        }
        for (int k = 0; k < i; k++)
            if (strcmp(blobs[k].name, b->name) == 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": save: blob \"%s\" is given twice", s->path,
                               b->name);
                return false;
            }
    }
    return true;
}

static bool save_blobs(dg_checkpoint_store *s, int64_t ckpt_id, const dg_checkpoint_blob *blobs, int n_blobs,
                       dg_status *st) {
    sqlite3_stmt *q = NULL;
    int rc;
    SQ_CHECK(s, sqlite3_exec(s->db, blobs_sql, NULL, NULL, NULL), st);
    if (!prepare_on_demand(s, "INSERT INTO blobs(checkpoint_id, name, crc32, data) VALUES(?1, ?2, ?3, ?4)", "blobs",
                           "(checkpoint_id, name, crc32, data)", &q, st))
        goto fail;
    for (int i = 0; i < n_blobs; i++) {
        const dg_checkpoint_blob *b = &blobs[i];
        uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), b->data ? b->data : (const void *)"", b->n_bytes);
        SQ_CHECK(s, sqlite3_bind_int64(q, 1, ckpt_id), st);
        SQ_CHECK(s, sqlite3_bind_text(q, 2, b->name, -1, SQLITE_STATIC), st);
        SQ_CHECK(s, sqlite3_bind_int64(q, 3, (int64_t)crc), st);
        SQ_CHECK(s, sqlite3_bind_blob64(q, 4, b->data ? b->data : (const void *)"", b->n_bytes, SQLITE_STATIC), st);
        SQ_STEP(s, q, rc, st);
        sqlite3_reset(q);
        sqlite3_clear_bindings(q);
    }
    sqlite3_finalize(q);
    return true;
fail:
    sqlite3_finalize(q);
    return false;
}

bool dg_checkpoint_read_blob(dg_checkpoint_store *s, int64_t step, const char *name, void **data, size_t *n_bytes,
                             int64_t *read_step, dg_status *st) {
    dg_status_reset(st);
    if (!s || !name || !data || !n_bytes) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: read blob with a NULL store, name or output");
        return false;
    }
    *data = NULL;
    *n_bytes = 0;
    sqlite3_stmt *q = NULL;
    int64_t id, found = -1;
    bool has = false;
    int rc;
    set_doing(s, "reading blob \"%s\" of step %lld", name, (long long)step);
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL), st);
    if (!find_checkpoint(s, step, &id, &found, NULL, st)) goto fail;
    if (!has_table(s, "blobs", &has, st)) goto fail;
    if (!has) {
        dg_status_setf(st, DG_NOT_FOUND, "checkpoint \"%s\": step %lld holds no blob \"%s\" (the file has no blobs)",
                       s->path, (long long)found, name);
        goto fail;
    }
    // The length first (length() reads the record's header, not the bytes): a size over what
    // a save may write is damage, refused before anything is allocated.
    if (!prepare_on_demand(s, "SELECT crc32, typeof(data), length(data), rowid FROM blobs WHERE checkpoint_id = ?1 "
                           "AND name = ?2", "blobs", "(checkpoint_id, name, crc32, data)", &q, st))
        goto fail;
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, id), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC), st);
    SQ_STEP(s, q, rc, st);
    if (rc != SQLITE_ROW) {
        dg_status_setf(st, DG_NOT_FOUND, "checkpoint \"%s\": step %lld holds no blob \"%s\"", s->path,
                       (long long)found, name);
        goto fail;
    }
    const char *type = (const char *)sqlite3_column_text(q, 1);
    if (!type || (strcmp(type, "blob") != 0 && strcmp(type, "null") != 0)) {
        dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": blob \"%s\" of step %lld is not a blob", s->path, name,
                       (long long)found);
        goto fail;
    }
    int64_t want_crc = sqlite3_column_int64(q, 0), len64 = sqlite3_column_int64(q, 2);
    int64_t rowid = sqlite3_column_int64(q, 3);
    if (len64 < 0 || (uint64_t)len64 > BLOB_MAX_BYTES) {
        dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": blob \"%s\" of step %lld holds %lld bytes, over the "
                       "%zu a save writes", s->path, name, (long long)found, (long long)len64, BLOB_MAX_BYTES);
        goto fail;
    }
    size_t len = (size_t)len64;
    sqlite3_finalize(q);
    q = NULL;
    *data = malloc(len ? len : 1);
    if (!*data) {
        base_oom(st, "checkpoint blob", len);
        goto fail;
    }
    if (len) {
        // Incremental blob I/O reads into our buffer: SQLite holds no second copy.
        sqlite3_blob *bl = NULL;
        rc = sqlite3_blob_open(s->db, "main", "blobs", "data", rowid, 0, &bl);
        if (rc == SQLITE_OK && sqlite3_blob_bytes(bl) != (int)len) rc = SQLITE_CORRUPT;
        if (rc == SQLITE_OK) rc = sqlite3_blob_read(bl, *data, (int)len, 0);
        if (bl) sqlite3_blob_close(bl);
        if (rc != SQLITE_OK) {
            dg_status_setf(st, rc == SQLITE_CORRUPT ? DG_DATA_LOSS : DG_UNAVAILABLE, "checkpoint \"%s\": reading "
                           "blob \"%s\" of step %lld: %s", s->path, name, (long long)found, sqlite3_errstr(rc));
            goto fail;
        }
    }
    uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), len ? *data : (const void *)"", len);
    if ((int64_t)crc != want_crc) {
        dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": blob \"%s\" of step %lld: CRC-32 mismatch over %zu bytes",
                       s->path, name, (long long)found, len);
        goto fail;
    }
    *n_bytes = len;
    end_call(s, true);
    if (read_step) *read_step = found;
    return true;
fail:
    sqlite3_finalize(q);
    free(*data);
    *data = NULL;
    end_call(s, true);
    return false;
}

bool dg_checkpoint_save_slices(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                               dg_tensor *const *values, const dg_checkpoint_slice *slices, int n,
                               int max_to_keep, dg_status *st) {
    return dg_checkpoint_save_with_blobs(s, global_step, names, values, slices, n, NULL, 0, max_to_keep, st);
}

bool dg_checkpoint_save_with_blobs(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                                   dg_tensor *const *values, const dg_checkpoint_slice *slices, int n,
                                   const dg_checkpoint_blob *blobs, int n_blobs, int max_to_keep, dg_status *st) {
    dg_status_reset(st);
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: save on a NULL store");
        return false;
    }
    if (!check_save_args(s, global_step, names, values, n, max_to_keep, st)) return false;
    if (!check_blob_args(s, blobs, n_blobs, st)) return false;
    bool has_slices = false;
    if (slices && !check_slice_args(s, global_step, names, values, slices, n, &has_slices, st)) return false;
    if (s->readonly_why) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "checkpoint \"%s\": cannot save step %lld: %s",
                       s->path, (long long)global_step, s->readonly_why);
        return false;
    }
    int64_t *old = NULL;
    sqlite3_stmt *ins_slice = NULL;
    int rc;
    set_doing(s, "saving step %lld", (long long)global_step);
    // IMMEDIATE takes the write lock now, so a concurrent writer waits here, not mid-save.
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), st);
    sqlite3_stmt *q = s->q[Q_FIND_STEP];
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, global_step), st);
    SQ_STEP(s, q, rc, st);
    int64_t existing = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_reset(q);
    if (existing >= 0 && !delete_checkpoint(s, existing, st)) goto fail;

    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    q = s->q[Q_INS_CKPT];
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, global_step), st);
    SQ_CHECK(s, sqlite3_bind_int64(q, 2, (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000), st);
    SQ_CHECK(s, sqlite3_bind_int(q, 3, n), st);
    SQ_STEP(s, q, rc, st);
    sqlite3_reset(q);
    // Ids only grow (a new row gets max(id) + 1), so id order is save order.
    int64_t ckpt_id = sqlite3_last_insert_rowid(s->db);

    if (has_slices) {
        set_doing(s, "saving step %lld: making the slices table", (long long)global_step);
        SQ_CHECK(s, sqlite3_exec(s->db, slices_sql, NULL, NULL, NULL), st);
        if (!prepare_slices(s, "INSERT INTO slices(tensor_id, full_name, full_dims, offsets) VALUES(?1, ?2, ?3, ?4)",
                            &ins_slice, st))
            goto fail;
    }
    for (int i = 0; i < n; i++) {
        set_doing(s, "saving variable \"%s\" of step %lld", names[i], (long long)global_step);
        int64_t tensor_id;
        if (!save_tensor(s, ckpt_id, names[i], values[i], &tensor_id, st)) goto fail;
        if (slices && slices[i].full_name && !save_slice_row(s, ins_slice, tensor_id, &slices[i], values[i], st))
            goto fail;
    }

    if (n_blobs > 0) {
        set_doing(s, "saving the blobs of step %lld", (long long)global_step);
        if (!save_blobs(s, ckpt_id, blobs, n_blobs, st)) goto fail;
    }

    if (max_to_keep > 0) {
        set_doing(s, "saving step %lld: removing checkpoints beyond the newest %d",
                  (long long)global_step, max_to_keep);
        // Collect first: deleting rows while a SELECT walks the same table is not defined.
        int n_old = 0, cap = 0;
        q = s->q[Q_OLDER];
        SQ_CHECK(s, sqlite3_bind_int(q, 1, max_to_keep), st);
        for (;;) {
            SQ_STEP(s, q, rc, st);
            if (rc != SQLITE_ROW) break;
            if (!BASE_GROW(old, n_old, cap, 1, "old checkpoints", NULL)) {
                dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", s->path);
                goto fail;
            }
            old[n_old++] = sqlite3_column_int64(q, 0);
        }
        sqlite3_reset(q);
        for (int i = 0; i < n_old; i++)
            if (!delete_checkpoint(s, old[i], st)) goto fail;
    }
    set_doing(s, "saving step %lld: committing", (long long)global_step);
    SQ_CHECK(s, sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL), st);
    // The save is durable now (the WAL is fsynced). Copy the WAL into the file at once rather
    // than leave it to a later commit: restores then read the file directly (SQLite reads
    // overflow pages straight into our buffer only for pages not in the WAL), and the next
    // save rewrites the WAL from its start. A failure here loses nothing: the WAL keeps the
    // frames and the next checkpoint (or close) copies them.
    sqlite3_wal_checkpoint_v2(s->db, "main", SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    free(old);
    sqlite3_finalize(ins_slice);
    end_call(s, false);
    return true;
fail:
    free(old);
    sqlite3_finalize(ins_slice);
    end_call(s, true);
    return false;
}

// ---- queries ----

// Finds the checkpoint of step (-1: newest) inside the caller's read transaction.
static bool find_checkpoint(dg_checkpoint_store *s, int64_t step, int64_t *id, int64_t *found,
                            int64_t *n_tensors, dg_status *st) {
    sqlite3_stmt *q = s->q[step < 0 ? Q_NEWEST : Q_FIND_STEP];
    int rc;
    if (step >= 0) SQ_CHECK(s, sqlite3_bind_int64(q, 1, step), st);
    SQ_STEP(s, q, rc, st);
    if (rc != SQLITE_ROW) {
        if (step < 0)
            dg_status_setf(st, DG_NOT_FOUND, "checkpoint \"%s\": holds no checkpoint", s->path);
        else
            dg_status_setf(st, DG_NOT_FOUND, "checkpoint \"%s\": no checkpoint of step %lld",
                           s->path, (long long)step);
        sqlite3_reset(q);
        return false;
    }
    *id = sqlite3_column_int64(q, 0);
    *found = sqlite3_column_int64(q, 1);
    if (n_tensors) *n_tensors = sqlite3_column_int64(q, 2);
    sqlite3_reset(q);
    return true;
fail:
    return false;
}

int64_t dg_checkpoint_latest_step(dg_checkpoint_store *s, dg_status *st) {
    dg_status_reset(st);
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: latest_step on a NULL store");
        return -1;
    }
    int rc;
    int64_t step = -1;
    set_doing(s, "reading the newest step");
    sqlite3_stmt *q = s->q[Q_NEWEST];
    SQ_STEP(s, q, rc, st);
    if (rc == SQLITE_ROW) step = sqlite3_column_int64(q, 1);
    end_call(s, false);
    return step;
fail:
    end_call(s, false);
    return -1;
}

int dg_checkpoint_list(dg_checkpoint_store *s, int64_t **steps, dg_status *st) {
    dg_status_reset(st);
    if (!s || !steps) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: list with a NULL argument");
        return -1;
    }
    *steps = NULL;
    int n = 0, cap = 0, rc;
    set_doing(s, "listing checkpoints");
    sqlite3_stmt *q = s->q[Q_LIST];
    for (;;) {
        SQ_STEP(s, q, rc, st);
        if (rc != SQLITE_ROW) break;
        if (!BASE_GROW(*steps, n, cap, 1, "checkpoint steps", NULL)) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", s->path);
            goto fail;
        }
        (*steps)[n++] = sqlite3_column_int64(q, 0);
    }
    end_call(s, false);
    return n;
fail:
    free(*steps);
    *steps = NULL;
    end_call(s, false);
    return -1;
}

int dg_checkpoint_list_info(dg_checkpoint_store *s, dg_checkpoint_info **infos, dg_status *st) {
    dg_status_reset(st);
    if (!s || !infos) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: list_info with a NULL argument");
        return -1;
    }
    *infos = NULL;
    int n = 0, cap = 0, rc;
    set_doing(s, "listing checkpoints");
    sqlite3_stmt *q = s->q[Q_LIST_INFO];
    for (;;) {
        SQ_STEP(s, q, rc, st);
        if (rc != SQLITE_ROW) break;
        if (!BASE_GROW(*infos, n, cap, 1, "checkpoint infos", NULL)) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", s->path);
            goto fail;
        }
        (*infos)[n].step = sqlite3_column_int64(q, 0);
        (*infos)[n].created_unix_ms = sqlite3_column_int64(q, 1);
        n++;
    }
    end_call(s, false);
    return n;
fail:
    free(*infos);
    *infos = NULL;
    end_call(s, false);
    return -1;
}

// dg_checkpoint_variables, and with slices dg_checkpoint_variables_sliced.
static int list_variables(dg_checkpoint_store *s, int64_t step, dg_checkpoint_var **vars,
                          dg_checkpoint_slice **slices, dg_status *st) {
    dg_status_reset(st);
    if (!s || !vars) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: variables with a NULL argument");
        return -1;
    }
    *vars = NULL;
    if (slices) *slices = NULL;
    int n = 0, cap = 0, cap_sl = 0, cap_name_at = 0, rc;
    int64_t id, found, n_tensors = 0;
    sqlite3_stmt *joined = NULL;        // tensors LEFT JOIN slices, when slices are asked for and kept
    dg_checkpoint_slice *sl = NULL;     // with slices: one per variable, full names set at the end
    size_t *name_at = NULL;             // where variable i's full name starts in text; SIZE_MAX: none
    char *text = NULL;                  // the full names, each NUL-terminated
    size_t n_text = 0, cap_text = 0;
    bool has_slices = false;
    set_doing(s, "listing the variables of step %lld", (long long)step);
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL), st);
    if (!find_checkpoint(s, step, &id, &found, &n_tensors, st)) goto fail;
    if (slices && !has_table(s, "slices", &has_slices, st)) goto fail;
    sqlite3_stmt *q = s->q[Q_VARS];
    if (has_slices) {
        if (!prepare_slices(s, "SELECT t.name, t.dtype, t.dims, s.full_name, s.full_dims, s.offsets FROM tensors t "
                               "LEFT JOIN slices s ON s.tensor_id = t.id WHERE t.checkpoint_id = ?1 ORDER BY t.id",
                            &joined, st))
            goto fail;
        q = joined;
    }
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, id), st);
    for (;;) {
        SQ_STEP(s, q, rc, st);
        if (rc != SQLITE_ROW) break;
        // sl and name_at run beside *vars, each with a capacity of its own.
        if (!BASE_GROW(*vars, n, cap, 1, "checkpoint variables", NULL) ||
            (slices && (!BASE_GROW(sl, n, cap_sl, 1, "checkpoint slices", NULL) ||
                        !BASE_GROW(name_at, n, cap_name_at, 1, "checkpoint slices", NULL)))) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", s->path);
            goto fail;
        }
        dg_checkpoint_var *v = &(*vars)[n];
        const char *name = (const char *)sqlite3_column_text(q, 0);
        v->dtype = (dg_dtype)sqlite3_column_int(q, 1);
        if (!name || strlen(name) >= sizeof v->name || !dg_dtype_is_valid(v->dtype) ||
            !parse_dims((const char *)sqlite3_column_text(q, 2), &v->shape)) {
            dg_status_setf(st, DG_DATA_LOSS,
                           "checkpoint \"%s\": step %lld: the description of variable %d "
                           "(\"%.64s\") is damaged",
                           s->path, (long long)found, n, name ? name : "");
            goto fail;
        }
        memcpy(v->name, name, strlen(name) + 1);
        if (slices) {
            memset(&sl[n], 0, sizeof sl[n]);
            name_at[n] = SIZE_MAX;
            if (has_slices && sqlite3_column_type(q, 3) != SQLITE_NULL) {
                const char *full_name = (const char *)sqlite3_column_text(q, 3);
                region r;
                if (!read_slice_row(full_name, (const char *)sqlite3_column_text(q, 4),
                                    (const char *)sqlite3_column_text(q, 5), &v->shape, &sl[n].full_shape, &r)) {
                    dg_status_setf(st, DG_DATA_LOSS,
                                   "checkpoint \"%s\": step %lld: the slice description of variable \"%s\" is "
                                   "damaged", s->path, (long long)found, v->name);
                    goto fail;
                }
                memcpy(sl[n].offset, r.off, sizeof sl[n].offset);
                size_t len = strlen(full_name) + 1;
                if (n_text + len > cap_text) {
                    cap_text = 2 * (n_text + len) + 256;
                    char *grown = realloc(text, cap_text);
                    if (!grown) {
                        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", s->path);
                        goto fail;
                    }
                    text = grown;
                }
                memcpy(text + n_text, full_name, len);
                name_at[n] = n_text;
                n_text += len;
            }
        }
        n++;
    }
    if (n != n_tensors) {
        dg_status_setf(st, DG_DATA_LOSS,
                       "checkpoint \"%s\": step %lld holds %d variables, its checkpoint row "
                       "says %lld",
                       s->path, (long long)found, n, (long long)n_tensors);
        goto fail;
    }
    if (slices && n > 0) {
        // One block: the descriptions, then the full names they point to.
        dg_checkpoint_slice *block = malloc((size_t)n * sizeof *block + n_text + 1);
        if (!block) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": out of memory", s->path);
            goto fail;
        }
        char *names_copy = (char *)(block + n);
        if (n_text) memcpy(names_copy, text, n_text);
        for (int i = 0; i < n; i++) {
            block[i] = sl[i];
            block[i].full_name = name_at[i] == SIZE_MAX ? NULL : names_copy + name_at[i];
        }
        *slices = block;
    }
    free(sl);
    free(name_at);
    free(text);
    sqlite3_finalize(joined);
    end_call(s, true);
    return n;
fail:
    free(*vars);
    *vars = NULL;
    free(sl);
    free(name_at);
    free(text);
    sqlite3_finalize(joined);
    end_call(s, true);
    return -1;
}

int dg_checkpoint_variables(dg_checkpoint_store *s, int64_t step, dg_checkpoint_var **vars,
                            dg_status *st) {
    return list_variables(s, step, vars, NULL, st);
}

int dg_checkpoint_variables_sliced(dg_checkpoint_store *s, int64_t step, dg_checkpoint_var **vars,
                                   dg_checkpoint_slice **slices, dg_status *st) {
    if (!slices) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: variables_sliced with a NULL argument");
        if (vars) *vars = NULL;
        return -1;
    }
    return list_variables(s, step, vars, slices, st);
}

// ---- restore ----

// Reads one variable of checkpoint ckpt_id into a new tensor *out, or with into (out NULL)
// into that tensor, which must have the stored dtype and shape (else INVALID_ARGUMENT).
static bool restore_tensor(dg_checkpoint_store *s, int64_t ckpt_id, int64_t step,
                           const char *name, dg_tensor *into, dg_tensor **out, dg_status *st) {
    dg_tensor *t = NULL;
    crc_job job = {.is_running = false};
    int rc;
    sqlite3_stmt *q = s->q[Q_TENSOR];
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, ckpt_id), st);
    SQ_CHECK(s, sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC), st);
    SQ_STEP(s, q, rc, st);
    if (rc != SQLITE_ROW) {
        dg_status_setf(st, DG_NOT_FOUND,
                       "checkpoint \"%s\": variable \"%s\" is not in the checkpoint of step %lld",
                       s->path, name, (long long)step);
        goto fail;
    }
    int64_t tensor_id = sqlite3_column_int64(q, 0);
    dg_dtype dtype = (dg_dtype)sqlite3_column_int(q, 1);
    dg_shape shape;
    bool dims_ok = parse_dims((const char *)sqlite3_column_text(q, 2), &shape);
    int64_t n_bytes = sqlite3_column_int64(q, 3);
    int64_t n_chunks = sqlite3_column_int64(q, 4);
    int64_t stored_crc = sqlite3_column_int64(q, 5);
    sqlite3_reset(q);
    if (!dims_ok || shape_bytes(dtype, &shape) != n_bytes || n_chunks < 0) {
        dg_status_setf(st, DG_DATA_LOSS,
                       "checkpoint \"%s\": variable \"%s\" of step %lld: its dtype %d, dims and "
                       "size %lld bytes do not agree",
                       s->path, name, (long long)step, (int)dtype, (long long)n_bytes);
        goto fail;
    }
    if (into) {
        if (dg_tensor_dtype(into) != dtype || !dg_shape_equal(dg_tensor_shape(into), &shape)) {
            char a[128], b[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "checkpoint \"%s\": variable \"%s\" of step %lld is %s %s, asked for %s %s",
                           s->path, name, (long long)step, dg_dtype_name(dtype),
                           dg_shape_str(&shape, a, sizeof a), dg_dtype_name(dg_tensor_dtype(into)),
                           dg_shape_str(dg_tensor_shape(into), b, sizeof b));
            goto fail;
        }
    } else {
        t = dg_tensor_new(dtype, shape, st);
        if (!t) {
            dg_status_prepend(st, "checkpoint \"%s\": variable \"%s\" of step %lld", s->path, name,
                              (long long)step);
            goto fail;
        }
    }
    unsigned char *data = dg_tensor_data(into ? into : t);
    uLong crc = crc32_z(0L, Z_NULL, 0);
    int64_t off = 0, k = 0;
    q = s->q[Q_CHUNKS];
    SQ_CHECK(s, sqlite3_bind_int64(q, 1, tensor_id), st);
    for (;;) {
        SQ_STEP(s, q, rc, st);
        if (rc != SQLITE_ROW) break;
        int64_t rowid = sqlite3_column_int64(q, 0);
        int64_t seq = sqlite3_column_int64(q, 1);
        int64_t len = sqlite3_column_int64(q, 2);
        if (seq != k || len <= 0 || len > INT_MAX || len > n_bytes - off) {
            dg_status_setf(st, DG_DATA_LOSS,
                           "checkpoint \"%s\": variable \"%s\" of step %lld: chunk %lld (#%lld, "
                           "%lld bytes) does not fit its %lld bytes",
                           s->path, name, (long long)step, (long long)k, (long long)seq,
                           (long long)len, (long long)n_bytes);
            goto fail;
        }
        if (!s->blob)
            SQ_CHECK(s, sqlite3_blob_open(s->db, "main", "chunks", "data", rowid, 0, &s->blob), st);
        else
            SQ_CHECK(s, sqlite3_blob_reopen(s->blob, rowid), st);
        if (sqlite3_blob_bytes(s->blob) != len) {
            dg_status_setf(st, DG_DATA_LOSS,
                           "checkpoint \"%s\": variable \"%s\" of step %lld: chunk %lld changed "
                           "size while read",
                           s->path, name, (long long)step, (long long)k);
            goto fail;
        }
        // Read in pieces, each checked on the helper thread while the next is read, so only
        // the last piece's CRC is not hidden behind reading.
        for (int64_t at = 0; at < len; at += RESTORE_PIECE_BYTES) {
            int piece = (int)(len - at < RESTORE_PIECE_BYTES ? len - at : RESTORE_PIECE_BYTES);
            SQ_CHECK(s, sqlite3_blob_read(s->blob, data + off + at, piece, (int)at), st);
            crc = crc_finish(&job);
            crc_start(&job, crc, data + off + at, (size_t)piece);
        }
        off += len;
        k++;
    }
    sqlite3_reset(q);
    crc = crc_finish(&job);
    if (k != n_chunks || off != n_bytes) {
        dg_status_setf(st, DG_DATA_LOSS,
                       "checkpoint \"%s\": variable \"%s\" of step %lld: %lld chunks with %lld "
                       "bytes stored, %lld chunks with %lld bytes expected",
                       s->path, name, (long long)step, (long long)k, (long long)off,
                       (long long)n_chunks, (long long)n_bytes);
        goto fail;
    }
    if ((int64_t)crc != stored_crc) {
        dg_status_setf(st, DG_DATA_LOSS,
                       "checkpoint \"%s\": variable \"%s\" of step %lld: checksum mismatch "
                       "(CRC-32 stored 0x%08llx, of the bytes read 0x%08lx): the file is damaged",
                       s->path, name, (long long)step, (unsigned long long)stored_crc,
                       (unsigned long)crc);
        goto fail;
    }
    if (out) *out = t;
    return true;
fail:
    crc_finish(&job);
    dg_tensor_unref(t);
    return false;
}

bool dg_checkpoint_restore(dg_checkpoint_store *s, int64_t step, const char *const *names, int n,
                           dg_tensor **out, int64_t *restored_step, dg_status *st) {
    dg_status_reset(st);
    if (!s || n < 0 || (n > 0 && (!names || !out))) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: restore with bad arguments");
        return false;
    }
    for (int i = 0; i < n; i++) out[i] = NULL;
    int64_t id, found = -1;
    set_doing(s, "restoring step %lld", (long long)step);
    // One read transaction: every variable comes from the same snapshot of the file.
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL), st);
    if (!find_checkpoint(s, step, &id, &found, NULL, st)) goto fail;
    for (int i = 0; i < n; i++) {
        if (!names[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": restore: name %d is NULL",
                           s->path, i);
            goto fail;
        }
        set_doing(s, "restoring variable \"%s\" of step %lld", names[i], (long long)found);
        if (!restore_tensor(s, id, found, names[i], NULL, &out[i], st)) goto fail;
    }
    end_call(s, true);
    if (restored_step) *restored_step = found;
    return true;
fail:
    end_call(s, true);
    for (int i = 0; i < n; i++) dg_tensor_free(&out[i]);
    return false;
}

// ---- restore of slices ----

// A saved tensor that holds part of a requested variable: a slice of it, or all of it saved
// whole (full is then its shape and r all of it).
typedef struct piece {
    char *name;       // owned: the tensor's name in the checkpoint
    dg_dtype dtype;
    dg_shape full;
    region r;
} piece;

static void free_pieces(piece *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].name);
    free(p);
}

// The tensors of checkpoint ckpt_id that hold parts of full_name (inside the caller's read
// transaction) into *out (new, free_pieces). `what` names the request in messages.
static int find_pieces(dg_checkpoint_store *s, int64_t ckpt_id, int64_t step, bool has_slices, const char *full_name,
                       const char *what, piece **out, dg_status *st) {
    sqlite3_stmt *q = NULL;
    piece *p = NULL;
    int n = 0, cap = 0, rc;
    *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !has_slices) break;
        const char *sql =
            pass == 1 ? "SELECT t.name, t.dtype, t.dims, s.full_dims, s.offsets FROM slices s JOIN tensors t "
                        "ON t.id = s.tensor_id WHERE t.checkpoint_id = ?1 AND s.full_name = ?2 ORDER BY t.id"
            : has_slices ? "SELECT t.name, t.dtype, t.dims FROM tensors t WHERE t.checkpoint_id = ?1 AND t.name = ?2 "
                           "AND NOT EXISTS (SELECT 1 FROM slices s WHERE s.tensor_id = t.id)"
                         : "SELECT name, dtype, dims FROM tensors WHERE checkpoint_id = ?1 AND name = ?2";
        if (has_slices) {
            if (!prepare_slices(s, sql, &q, st)) goto fail;
        } else {
            SQ_CHECK(s, sqlite3_prepare_v2(s->db, sql, -1, &q, NULL), st);
        }
        SQ_CHECK(s, sqlite3_bind_int64(q, 1, ckpt_id), st);
        SQ_CHECK(s, sqlite3_bind_text(q, 2, full_name, -1, SQLITE_STATIC), st);
        for (;;) {
            SQ_STEP(s, q, rc, st);
            if (rc != SQLITE_ROW) break;
            if (!BASE_GROW(p, n, cap, 1, what, NULL)) {
                dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": %s: out of memory", s->path, what);
                goto fail;
            }
            piece *k = &p[n];
            const char *name = (const char *)sqlite3_column_text(q, 0);
            k->name = dup_str(name ? name : "");
            if (!k->name) {
                dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": %s: out of memory", s->path, what);
                goto fail;
            }
            n++;
            k->dtype = (dg_dtype)sqlite3_column_int(q, 1);
            dg_shape shape;
            bool ok = dg_dtype_is_valid(k->dtype) && parse_dims((const char *)sqlite3_column_text(q, 2), &shape);
            if (ok && pass == 0) {
                int64_t zero[DG_MAX_RANK] = {0};
                k->full = shape;
                k->r = region_of(&shape, zero);
                ok = shape.rank >= 1;
            } else if (ok) {
                ok = read_slice_row(full_name, (const char *)sqlite3_column_text(q, 3),
                                    (const char *)sqlite3_column_text(q, 4), &shape, &k->full, &k->r);
            }
            if (!ok) {
                dg_status_setf(st, DG_DATA_LOSS,
                               "checkpoint \"%s\": %s: the description of the saved %s \"%s\" of step %lld is %s",
                               s->path, what, pass ? "slice" : "variable", k->name, (long long)step,
                               pass == 0 && dg_dtype_is_valid(k->dtype) ? "a scalar, not a variable with rows"
                                                                        : "damaged");
                goto fail;
            }
        }
        sqlite3_finalize(q);
        q = NULL;
    }
    *out = p;
    return n;
fail:
    sqlite3_finalize(q);
    free_pieces(p, n);
    return -1;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

// Rows (along dimension 0) of want that the pieces (which do not overlap) do not wholly hold,
// written into buf as "[a, b), [c, d)". Returns the number of missing ranges; -1 out of memory.
static int missing_rows(const region *want, const piece *p, int n, char *buf, size_t cap) {
    int64_t row_elems = 1;
    for (int d = 1; d < want->rank; d++) row_elems *= want->dims[d];
    buf[0] = '\0';
    if (row_elems == 0 || want->dims[0] == 0) return 0;
    // Between consecutive cuts every piece covers either all rows or none.
    int64_t *cut = malloc((2 * (size_t)n + 2) * sizeof *cut);
    if (!cut) return -1;
    int n_cut = 0;
    cut[n_cut++] = want->off[0];
    cut[n_cut++] = want->off[0] + want->dims[0];
    for (int k = 0; k < n; k++) {
        region both;
        if (!regions_meet(want, &p[k].r, &both)) continue;
        cut[n_cut++] = both.off[0];
        cut[n_cut++] = both.off[0] + both.dims[0];
    }
    qsort(cut, (size_t)n_cut, sizeof *cut, cmp_i64);
    int n_unique = 0;
    for (int i = 0; i < n_cut; i++)
        if (n_unique == 0 || cut[i] != cut[n_unique - 1]) cut[n_unique++] = cut[i];
    int n_missing = 0;
    int64_t run_lo = -1, run_hi = -1;   // the missing range being merged
    size_t used = 0;
    // The last pass (no segment) only ends the range being merged.
    for (int i = 0; i < n_unique; i++) {
        bool is_missing = false;
        int64_t a = cut[i], b = i + 1 < n_unique ? cut[i + 1] : a;
        if (b > a) {
            int64_t covered = 0;
            for (int k = 0; k < n; k++) {
                region both;
                if (!regions_meet(want, &p[k].r, &both) || both.off[0] > a || both.off[0] + both.dims[0] < b) continue;
                int64_t e = 1;
                for (int d = 1; d < want->rank; d++) e *= both.dims[d];
                covered += e;
            }
            is_missing = covered < row_elems;
        }
        if (is_missing && run_hi == a) {
            run_hi = b;
            continue;
        }
        if (run_lo >= 0) {
            if (n_missing < 8 && used < cap)
                used += (size_t)snprintf(buf + used, cap - used, "%s[%lld, %lld)", n_missing ? ", " : "",
                                         (long long)run_lo, (long long)run_hi);
            else if (n_missing == 8 && used < cap)
                used += (size_t)snprintf(buf + used, cap - used, ", ...");
            n_missing++;
            run_lo = run_hi = -1;
        }
        if (is_missing) {
            run_lo = a;
            run_hi = b;
        }
    }
    free(cut);
    return n_missing;
}

// Copies the elements of both (a part of src_r and of dst_r) from src (holding src_r) to dst
// (holding dst_r), a run of the last dimension at a time.
static void copy_region(const region *both, const region *src_r, const unsigned char *src, const region *dst_r,
                        unsigned char *dst, size_t elem) {
    int r = both->rank;
    int64_t s_stride[DG_MAX_RANK], d_stride[DG_MAX_RANK], idx[DG_MAX_RANK];
    s_stride[r - 1] = d_stride[r - 1] = 1;
    for (int d = r - 2; d >= 0; d--) {
        s_stride[d] = s_stride[d + 1] * src_r->dims[d + 1];
        d_stride[d] = d_stride[d + 1] * dst_r->dims[d + 1];
    }
    for (int d = 0; d < r; d++) idx[d] = both->off[d];
    size_t run = (size_t)both->dims[r - 1] * elem;
    for (;;) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < r; d++) {
            so += (idx[d] - src_r->off[d]) * s_stride[d];
            dof += (idx[d] - dst_r->off[d]) * d_stride[d];
        }
        memcpy(dst + (size_t)dof * elem, src + (size_t)so * elem, run);
        int d = r - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < both->off[d] + both->dims[d]) break;
            idx[d] = both->off[d];
        }
        if (d < 0) break;
    }
}

// Fills value with the region sl of its full variable from the pieces of checkpoint ckpt_id
// (inside the caller's read transaction).
static bool restore_region(dg_checkpoint_store *s, int64_t ckpt_id, int64_t step, bool has_slices, const char *name,
                           const dg_checkpoint_slice *sl, dg_tensor *value, dg_status *st) {
    const dg_shape *vs = dg_tensor_shape(value);
    dg_dtype dt = dg_tensor_dtype(value);
    region want = region_of(vs, sl->offset);
    char what[640], a[160], b[160], list[400];
    piece *p = NULL;
    dg_tensor *tmp = NULL;
    int n = 0;
    size_t len = strlen(sl->full_name);
    if (len == 0 || len >= sizeof ((dg_checkpoint_var *)0)->name || !dg_shape_is_fully_defined(&sl->full_shape) ||
        !region_fits(&want, &sl->full_shape)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "checkpoint \"%s\": restore: variable \"%s\" (%s) does not fit as a slice of \"%.255s\" %s at "
                       "its offsets", s->path, name, dg_shape_str(vs, a, sizeof a), sl->full_name,
                       dg_shape_str(&sl->full_shape, b, sizeof b));
        return false;
    }
    snprintf(what, sizeof what, "variable \"%s\" (%s of \"%s\" %s)", name,
             region_str(&want, &sl->full_shape, a, sizeof a), sl->full_name, dg_shape_str(&sl->full_shape, b, sizeof b));
    set_doing(s, "restoring %s of step %lld", what, (long long)step);
    if ((n = find_pieces(s, ckpt_id, step, has_slices, sl->full_name, what, &p, st)) < 0) return false;
    if (n == 0) {
        dg_status_setf(st, DG_NOT_FOUND, "checkpoint \"%s\": %s: \"%s\" is not in the checkpoint of step %lld, "
                       "neither whole nor as slices", s->path, what, sl->full_name, (long long)step);
        goto fail;
    }
    // What the file holds must be one variable cut in pieces: the same dtype and full shape,
    // no element twice. Save refuses anything else, so a file breaking this is damaged.
    for (int k = 0; k < n; k++) {
        if (p[k].dtype != p[0].dtype || !dg_shape_equal(&p[k].full, &p[0].full)) {
            dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": %s: the saved slices of \"%s\" in step %lld disagree "
                           "on the variable: \"%s\" says %s %s, \"%s\" %s %s", s->path, what, sl->full_name,
                           (long long)step, p[0].name, dg_dtype_name(p[0].dtype), dg_shape_str(&p[0].full, a, sizeof a),
                           p[k].name, dg_dtype_name(p[k].dtype), dg_shape_str(&p[k].full, b, sizeof b));
            goto fail;
        }
        for (int j = 0; j < k; j++) {
            region both;
            if (!regions_meet(&p[j].r, &p[k].r, &both)) continue;
            dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": %s: the saved slices \"%s\" (%s) and \"%s\" (%s) of "
                           "\"%s\" in step %lld overlap", s->path, what, p[j].name,
                           region_str(&p[j].r, &p[j].full, a, sizeof a), p[k].name,
                           region_str(&p[k].r, &p[k].full, b, sizeof b), sl->full_name, (long long)step);
            goto fail;
        }
    }
    if (p[0].dtype != dt || !dg_shape_equal(&p[0].full, &sl->full_shape)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": %s: the checkpoint of step %lld holds \"%s\" as "
                       "%s %s, the graph asks for %s %s", s->path, what, (long long)step, sl->full_name,
                       dg_dtype_name(p[0].dtype), dg_shape_str(&p[0].full, a, sizeof a), dg_dtype_name(dt),
                       dg_shape_str(&sl->full_shape, b, sizeof b));
        goto fail;
    }
    int n_missing = missing_rows(&want, p, n, list, sizeof list);
    if (n_missing != 0) {
        if (n_missing < 0)
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": %s: out of memory", s->path, what);
        else
            dg_status_setf(st, DG_NOT_FOUND, "checkpoint \"%s\": %s: rows %s of \"%s\" are in none of the %d saved "
                           "slice%s of step %lld", s->path, what, list, sl->full_name, n, n == 1 ? "" : "s",
                           (long long)step);
        goto fail;
    }
    size_t elem = dg_dtype_size(dt);
    for (int k = 0; k < n; k++) {
        region both;
        if (!regions_meet(&want, &p[k].r, &both)) continue;
        bool exact = true;
        for (int d = 0; d < want.rank; d++)
            exact = exact && p[k].r.off[d] == want.off[d] && p[k].r.dims[d] == want.dims[d];
        // The same cut as saved: read straight into the caller's tensor.
        if (exact) {
            if (!restore_tensor(s, ckpt_id, step, p[k].name, value, NULL, st)) goto fail;
            continue;
        }
        if (!restore_tensor(s, ckpt_id, step, p[k].name, NULL, &tmp, st)) goto fail;
        copy_region(&both, &p[k].r, dg_tensor_data(tmp), &want, dg_tensor_data(value), elem);
        dg_tensor_free(&tmp);
    }
    free_pieces(p, n);
    return true;
fail:
    dg_tensor_free(&tmp);
    free_pieces(p, n);
    return false;
}

bool dg_checkpoint_restore_slices(dg_checkpoint_store *s, int64_t step, const char *const *names,
                                  const dg_checkpoint_slice *slices, dg_tensor *const *values, int n,
                                  int64_t *restored_step, dg_status *st) {
    dg_status_reset(st);
    if (!s || n < 0 || (n > 0 && (!names || !values))) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: restore_slices with bad arguments");
        return false;
    }
    for (int i = 0; i < n; i++)
        if (!names[i] || !values[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": restore: %s %d is NULL", s->path,
                           names[i] ? "value" : "name", i);
            return false;
        }
    int64_t id, found = -1;
    bool has_slices = false;
    set_doing(s, "restoring step %lld", (long long)step);
    // One read transaction: every variable comes from the same snapshot of the file.
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL), st);
    if (!find_checkpoint(s, step, &id, &found, NULL, st)) goto fail;
    if (!has_table(s, "slices", &has_slices, st)) goto fail;
    for (int i = 0; i < n; i++) {
        if (slices && slices[i].full_name) {
            if (!restore_region(s, id, found, has_slices, names[i], &slices[i], values[i], st)) goto fail;
            continue;
        }
        set_doing(s, "restoring variable \"%s\" of step %lld", names[i], (long long)found);
        if (!restore_tensor(s, id, found, names[i], values[i], NULL, st)) goto fail;
    }
    end_call(s, true);
    if (restored_step) *restored_step = found;
    return true;
fail:
    end_call(s, true);
    return false;
}

// ---- scalar summaries ----
// The table is made by the first write, not with the checkpoint schema: a file without it
// tells a reader that no summary saver ever wrote to it. Its statements are prepared per
// call rather than at open, since the table may appear after the store opened (another
// connection's first write). Rows are appended only: a step written again after a restart
// adds rows, and readers take write order (rowid) within a step.

static const char summaries_sql[] =
    "CREATE TABLE IF NOT EXISTS summaries(\n"
    "  step INTEGER NOT NULL,               -- global step\n"
    "  tag TEXT NOT NULL,\n"
    "  value REAL,                          -- NULL: NaN (SQLite stores no NaN)\n"
    "  wall_time REAL NOT NULL              -- Unix seconds\n"
    ")";

// NOT_FOUND (and false) when the file has no summaries table; inside the caller's transaction.
static bool find_summaries(dg_checkpoint_store *s, dg_status *st) {
    int64_t n = 0;
    if (!query_int(s, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'summaries'", &n, st))
        return false;
    if (n == 0) {
        dg_status_setf(st, DG_NOT_FOUND,
                       "checkpoint \"%s\": no summaries table (no summary saver has written to this file)",
                       s->path);
        return false;
    }
    return true;
}

static bool prepare_summaries(dg_checkpoint_store *s, const char *sql, sqlite3_stmt **q, dg_status *st) {
    return prepare_on_demand(s, sql, "summaries", "(step, tag, value, wall_time)", q, st);
}

// The row q stands on (rowid, step, tag, value, wall_time) as *row; DATA_LOSS for a column of
// the wrong type (a file written by something else, or damaged).
static bool summary_row(dg_checkpoint_store *s, sqlite3_stmt *q, dg_checkpoint_summary *row, dg_status *st) {
    int vt = sqlite3_column_type(q, 3), wt = sqlite3_column_type(q, 4);
    const char *bad = NULL;
    if (sqlite3_column_type(q, 1) != SQLITE_INTEGER) bad = "step is not an integer";
    else if (sqlite3_column_type(q, 2) != SQLITE_TEXT) bad = "tag is not text";
    else if (vt != SQLITE_FLOAT && vt != SQLITE_INTEGER && vt != SQLITE_NULL) bad = "value is not a number";
    else if (wt != SQLITE_FLOAT && wt != SQLITE_INTEGER) bad = "wall_time is not a number";
    if (bad) {
        dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": %s: the summaries table is damaged: in row %lld, the %s",
                       s->path, s->doing, (long long)sqlite3_column_int64(q, 0), bad);
        return false;
    }
    row->step = sqlite3_column_int64(q, 1);
    row->tag = (const char *)sqlite3_column_text(q, 2);
    row->value = vt == SQLITE_NULL ? NAN : sqlite3_column_double(q, 3);
    row->wall_time = sqlite3_column_double(q, 4);
    return true;
}

bool dg_checkpoint_store_add_summaries(dg_checkpoint_store *s, int64_t step, const char *const *tags,
                                       const double *values, int n, double wall_time, dg_status *st) {
    dg_status_reset(st);
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: add_summaries on a NULL store");
        return false;
    }
    if (step < 0 || n < 0 || (n > 0 && (!tags || !values)) || !isfinite(wall_time)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "checkpoint \"%s\": summaries of step %lld: bad arguments (n %d, wall_time %g; steps "
                       "are >= 0)",
                       s->path, (long long)step, n, wall_time);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (!tags[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "checkpoint \"%s\": summaries of step %lld: tag %d is NULL",
                           s->path, (long long)step, i);
            return false;
        }
    if (s->readonly_why) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "checkpoint \"%s\": cannot write the summaries of step %lld: %s",
                       s->path, (long long)step, s->readonly_why);
        return false;
    }
    if (n == 0) return true;
    sqlite3_stmt *q = NULL;
    int rc;
    set_doing(s, "writing the summaries of step %lld", (long long)step);
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), st);
    SQ_CHECK(s, sqlite3_exec(s->db, summaries_sql, NULL, NULL, NULL), st);
    if (!prepare_summaries(s, "INSERT INTO summaries(step, tag, value, wall_time) VALUES(?1, ?2, ?3, ?4)", &q, st))
        goto fail;
    for (int i = 0; i < n; i++) {
        SQ_CHECK(s, sqlite3_bind_int64(q, 1, step), st);
        SQ_CHECK(s, sqlite3_bind_text(q, 2, tags[i], -1, SQLITE_STATIC), st);
        // SQLite would turn NaN into NULL itself; binding NULL says so here.
        SQ_CHECK(s, isnan(values[i]) ? sqlite3_bind_null(q, 3) : sqlite3_bind_double(q, 3, values[i]), st);
        SQ_CHECK(s, sqlite3_bind_double(q, 4, wall_time), st);
        SQ_STEP(s, q, rc, st);
        sqlite3_reset(q);
    }
    sqlite3_finalize(q);
    q = NULL;
    SQ_CHECK(s, sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL), st);
    // As after a save: the store's connection never checkpoints the WAL by itself
    // (wal_autocheckpoint 0), so copy it into the file now and keep it from growing.
    sqlite3_wal_checkpoint_v2(s->db, "main", SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    end_call(s, false);
    return true;
fail:
    sqlite3_finalize(q);
    end_call(s, true);
    return false;
}

bool dg_checkpoint_store_read_summaries(dg_checkpoint_store *s, const char *tag, dg_checkpoint_summary_fn fn,
                                        void *ctx, dg_status *st) {
    dg_status_reset(st);
    if (!s || !fn) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: read_summaries with a NULL argument");
        return false;
    }
    sqlite3_stmt *q = NULL;
    int rc;
    if (tag) set_doing(s, "reading the summaries of tag \"%s\"", tag);
    else set_doing(s, "reading the summaries");
    // One read transaction: the rows come from one snapshot, however long fn takes.
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL), st);
    if (!find_summaries(s, st)) goto fail;
    if (!prepare_summaries(s, tag ? "SELECT rowid, step, tag, value, wall_time FROM summaries WHERE tag = ?1 "
                                    "ORDER BY step, rowid"
                                  : "SELECT rowid, step, tag, value, wall_time FROM summaries "
                                    "ORDER BY tag, step, rowid",
                           &q, st))
        goto fail;
    if (tag) SQ_CHECK(s, sqlite3_bind_text(q, 1, tag, -1, SQLITE_STATIC), st);
    for (;;) {
        SQ_STEP(s, q, rc, st);
        if (rc != SQLITE_ROW) break;
        dg_checkpoint_summary row;
        if (!summary_row(s, q, &row, st)) goto fail;
        if (!fn(ctx, &row)) break;
    }
    sqlite3_finalize(q);
    end_call(s, true);
    return true;
fail:
    sqlite3_finalize(q);
    end_call(s, true);
    return false;
}

int dg_checkpoint_store_summary_tags(dg_checkpoint_store *s, char ***tags, dg_status *st) {
    dg_status_reset(st);
    if (!s || !tags) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "checkpoint: summary_tags with a NULL argument");
        return -1;
    }
    *tags = NULL;
    sqlite3_stmt *q = NULL;
    char *text = NULL;   // the tags one after another, each NUL-terminated
    size_t n_bytes = 0, cap = 0;
    int n = 0, rc;
    set_doing(s, "listing the summary tags");
    SQ_CHECK(s, sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL), st);
    if (!find_summaries(s, st)) goto fail;
    if (!prepare_summaries(s, "SELECT DISTINCT tag FROM summaries ORDER BY tag", &q, st)) goto fail;
    for (;;) {
        SQ_STEP(s, q, rc, st);
        if (rc != SQLITE_ROW) break;
        if (sqlite3_column_type(q, 0) != SQLITE_TEXT) {
            dg_status_setf(st, DG_DATA_LOSS, "checkpoint \"%s\": %s: the summaries table is damaged: a tag is not text",
                           s->path, s->doing);
            goto fail;
        }
        size_t len = (size_t)sqlite3_column_bytes(q, 0) + 1;
        if (n_bytes + len > cap) {
            cap = 2 * (n_bytes + len) + 256;
            char *grown = realloc(text, cap);
            if (!grown) goto oom;
            text = grown;
        }
        memcpy(text + n_bytes, sqlite3_column_text(q, 0), len);
        n_bytes += len;
        n++;
    }
    // One block: the pointers, then the strings they point to.
    char **block = malloc(((size_t)n + 1) * sizeof *block + n_bytes + 1);
    if (!block) goto oom;
    char *at = (char *)(block + n + 1);
    if (n_bytes) memcpy(at, text, n_bytes);
    for (int i = 0; i < n; i++) {
        block[i] = at;
        at += strlen(at) + 1;
    }
    block[n] = NULL;
    *tags = block;
    free(text);
    sqlite3_finalize(q);
    end_call(s, true);
    return n;
oom:
    dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "checkpoint \"%s\": %s: out of memory", s->path, s->doing);
fail:
    free(text);
    sqlite3_finalize(q);
    end_call(s, true);
    return -1;
}
