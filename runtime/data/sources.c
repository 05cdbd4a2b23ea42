/* The sources (distgraph/dataset.h): TFRecord files, text lines and fixed-size records (one
 * file iterator for the three, which also interleaves them), IDX arrays and tensors in
 * memory. Everything read from a file is bounded by the file's size (taken when it is opened)
 * or by the record limit before it is allocated; damage is DATA_LOSS naming the file and the
 * byte offset. A file source's state is its interleave cycle and each open file's index, byte
 * offset and size, so a restore reopens the files, checks they kept their sizes, and seeks;
 * its description holds a hash of the files' names and sizes, so a state restores only into
 * the files it was saved from. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base_impl.h"
#include "data_impl.h"
#include "tfrecord_impl.h"

#define DEFAULT_MAX_RECORD_BYTES ((int64_t)256 << 20)
#define FILE_BUFFER_BYTES ((size_t)256 << 10)
#define TEXT_WINDOW_BYTES ((size_t)256 << 10)

dg_file_source_options dg_file_source_options_default(void) {
    return (dg_file_source_options){.skip_corrupt = false, .max_record_bytes = DEFAULT_MAX_RECORD_BYTES};
}

// Opens path for reading: NOT_FOUND naming a missing file, another failure by its errno.
static FILE *open_file(const char *what, const char *path, int64_t *size, dg_status *st) {
    FILE *f = fopen(path, "rbe");   // close-on-exec: a child the program starts does not inherit it
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        int e = errno;
        if (f) fclose(f);
        dg_status_setf(st, e == ENOENT || e == ENOTDIR ? DG_NOT_FOUND : DG_UNAVAILABLE, "%s file \"%s\": %s", what,
                       path, e == ENOENT ? "not found" : strerror(e));
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) {
        fclose(f);
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s file \"%s\": is a directory", what, path);
        return NULL;
    }
    // A pipe, a socket or a device has no size: it is read to its end (DATA_STREAM_BYTES).
    *size = S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : DATA_STREAM_BYTES;
    return f;
}

static void free_strings(char **s, int n) {
    for (int i = 0; s && i < n; i++) free(s[i]);
    free(s);
}

static char **copy_files(const char *what, const char *const *files, int n, dg_status *st) {
    if (n < 1 || !files) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s dataset: no files (%d)", what, n);
        return NULL;
    }
    char **c = calloc((size_t)n, sizeof *c);
    if (!c) {
        base_oom(st, what, (size_t)n * sizeof *c);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!files[i] || !*files[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s dataset: file %d has no name", what, i);
            free_strings(c, n);
            return NULL;
        }
        c[i] = strdup(files[i]);
        if (!c[i]) {
            free_strings(c, n);
            base_oom(st, what, strlen(files[i]));
            return NULL;
        }
    }
    return c;
}

// ---- file sources: TFRecord, text lines, fixed records ----

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// FNV-1a over each name and its size now (-1 for a file that cannot be read now: it is
// NOT_FOUND when the iterator reaches it).
static uint64_t files_hash(char *const *files, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        struct stat sb;
        int64_t size = stat(files[i], &sb) == 0 ? (int64_t)sb.st_size : -1;
        unsigned char le[8];
        for (int k = 0; k < 8; k++) le[k] = (unsigned char)((uint64_t)size >> (8 * k));
        h = fnv1a(h, files[i], strlen(files[i]) + 1);
        h = fnv1a(h, le, 8);
    }
    return h;
}

enum { K_TFRECORD, K_TEXT, K_FIXED };
static const char *const kind_name[] = {"TFRecord", "text", "fixed-record"};

typedef struct file_params {
    int kind;
    char **files;
    int n_files;
    uint64_t files_hash;   // of the names and the sizes when the dataset was made
    dg_file_source_options opts;
    int64_t record_bytes, header_bytes, footer_bytes;   // K_FIXED
    int cycle_length, block_length;                     // 1, 1: one file after the other
    bool interleaved;
} file_params;

typedef struct file_reader {
    FILE *f;           // NULL: the slot is empty
    int file;          // index into files
    int64_t offset;    // of the next record
    int64_t size;      // the file's bytes when it was opened: reading stops there
    // Text: bytes read past offset, win[wpos, wlen); the stream stands at offset + wlen - wpos.
    unsigned char *win;   // TEXT_WINDOW_BYTES, kept for the slot's next file
    size_t wpos, wlen;
} file_reader;

typedef struct file_iter {
    data_iter base;
    const file_params *p;
    file_reader *slots;       // cycle_length
    int cycle_index, block_index, next_file, n_open;
    bool end_of_input;
    unsigned char *buf;       // a text line that spans two windows
    int cap;
} file_iter;

static void reader_close(file_reader *r) {
    if (r->f) fclose(r->f);
    r->f = NULL;
    r->wpos = r->wlen = 0;
}

// A stream (a pipe, a device) starts at its first record: the header of fixed records is read
// past; a position further in cannot be gone back to, and a footer cannot be found before the end.
static bool stream_open(const file_params *p, file_reader *r, int64_t offset, int64_t first, dg_status *st) {
    const char *path = p->files[r->file];
    if (offset != first) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "%s file \"%s\" is a pipe or a device: it cannot be read again from "
                       "byte %lld (a saved position in a stream cannot be restored)", kind_name[p->kind], path,
                       (long long)offset);
        reader_close(r);
        return false;
    }
    if (p->kind == K_FIXED && p->footer_bytes > 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "fixed-record file \"%s\" is a pipe or a device: its %lld-byte footer "
                       "cannot be told from records before the end", path, (long long)p->footer_bytes);
        reader_close(r);
        return false;
    }
    for (int64_t i = 0; i < first; i++) {
        if (fgetc(r->f) == EOF) {
            dg_status_setf(st, DG_DATA_LOSS, "fixed-record file \"%s\": the stream ended in its %lld-byte header",
                           path, (long long)p->header_bytes);
            reader_close(r);
            return false;
        }
    }
    r->offset = offset;
    return true;
}

static bool reader_open(const file_params *p, file_reader *r, int file, int64_t offset, dg_status *st) {
    const char *path = p->files[file];
    r->f = open_file(kind_name[p->kind], path, &r->size, st);
    if (!r->f) return false;
    r->wpos = r->wlen = 0;
    if (p->kind == K_TEXT) {
        // Lines are scanned in a window of our own, filled by reads of its size.
        if (!r->win && !(r->win = malloc(TEXT_WINDOW_BYTES))) {
            reader_close(r);
            return base_oom(st, "text file window", TEXT_WINDOW_BYTES);
        }
        setvbuf(r->f, NULL, _IONBF, 0);
    } else {
        setvbuf(r->f, NULL, _IOFBF, FILE_BUFFER_BYTES);
    }
    r->file = file;
    int64_t first = p->kind == K_FIXED ? p->header_bytes : 0;
    if (offset < 0) offset = first;
    if (r->size == DATA_STREAM_BYTES) return stream_open(p, r, offset, first, st);
    if (p->kind == K_FIXED && p->header_bytes + p->footer_bytes > r->size) {
        dg_status_setf(st, DG_DATA_LOSS, "fixed-record file \"%s\": %lld bytes, shorter than its header and footer "
                       "(%lld + %lld)", path, (long long)r->size, (long long)p->header_bytes, (long long)p->footer_bytes);
        reader_close(r);
        return false;
    }
    if (offset > r->size || fseeko(r->f, (off_t)offset, SEEK_SET) != 0) {
        dg_status_setf(st, DG_DATA_LOSS, "%s file \"%s\": cannot go to byte %lld of %lld (was the file changed since "
                       "the state was saved?)", kind_name[p->kind], path, (long long)offset, (long long)r->size);
        reader_close(r);
        return false;
    }
    r->offset = offset;
    return true;
}

// One line (without "\n" or "\r\n") as *line (borrowed: the window or it->buf, valid until the
// next read) of *n bytes: 1, 0 at the file's end (its size when opened), -1 on error. After a
// read error the reader stands at the end: the stream's error cannot be read past.
static int read_line(file_iter *it, file_reader *r, const unsigned char **line, size_t *n, dg_status *st) {
    if (r->offset >= r->size) return 0;
    const char *path = it->p->files[r->file];
    const int64_t start = r->offset, max = it->p->opts.max_record_bytes;
    size_t len = 0;   // bytes gathered in it->buf when the line spans windows
    for (;;) {
        if (r->wpos == r->wlen) {
            int64_t at = r->offset;   // the stream stands here: the window is empty
            if (at >= r->size) break;  // a last line without "\n"
            size_t want = r->size - at < (int64_t)TEXT_WINDOW_BYTES ? (size_t)(r->size - at) : TEXT_WINDOW_BYTES;
            size_t got = fread(r->win, 1, want, r->f);
            if (got == 0 && r->size == DATA_STREAM_BYTES && feof(r->f) && !ferror(r->f)) {
                r->size = at;   // the stream's end, found
                if (len == 0) return 0;
                break;
            }
            if (got == 0) {
                dg_status_setf(st, DG_DATA_LOSS, "text file \"%s\": read failed at byte %lld: %s", path,
                               (long long)at, ferror(r->f) ? strerror(errno) : "the file shrank");
                clearerr(r->f);
                r->offset = r->size;
                return -1;
            }
            r->wpos = 0;
            r->wlen = got;
        }
        unsigned char *p = r->win + r->wpos;
        size_t avail = r->wlen - r->wpos;
        unsigned char *nl = memchr(p, '\n', avail);
        size_t take = nl ? (size_t)(nl - p) : avail;
        if ((int64_t)(len + take) > max) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "text file \"%s\": line at byte %lld is longer than the limit "
                           "of %lld bytes", path, (long long)start, (long long)max);
            return -1;
        }
        size_t step = take + (nl ? 1 : 0);
        r->wpos += step;
        r->offset += (int64_t)step;
        if (nl && len == 0) {   // the whole line lies in the window: no copy
            *line = p;
            *n = take;
            goto strip;
        }
        if (take > (size_t)INT32_MAX - len ||
            !BASE_GROW(it->buf, (int)len, it->cap, (int)take, "text line", st)) {
            dg_status_prepend(st, "text file \"%s\": line at byte %lld", path, (long long)start);
            return -1;
        }
        memcpy(it->buf + len, p, take);
        len += take;
        if (nl) break;
    }
    *line = it->buf;
    *n = len;
strip:
    if (*n && (*line)[*n - 1] == '\r') (*n)--;
    return 1;
}

// One record read straight into a new tensor *t.
static int read_fixed(file_iter *it, file_reader *r, dg_tensor **t, dg_status *st) {
    const file_params *p = it->p;
    const char *path = p->files[r->file];
    int64_t body_end = r->size - p->footer_bytes;
    if (r->offset >= body_end) return 0;
    if (body_end - r->offset < p->record_bytes) {
        dg_status_setf(st, DG_DATA_LOSS, "fixed-record file \"%s\": record at byte %lld: truncated (%lld of %lld "
                       "bytes before the footer)", path, (long long)r->offset, (long long)(body_end - r->offset),
                       (long long)p->record_bytes);
        r->offset = body_end;
        return -1;
    }
    *t = dg_tensor_new(DG_UINT8, dg_shape1(p->record_bytes), st);
    if (!*t) {
        dg_status_prepend(st, "fixed-record file \"%s\": record at byte %lld", path, (long long)r->offset);
        return -1;
    }
    size_t got = fread(dg_tensor_data(*t), 1, (size_t)p->record_bytes, r->f);
    if (got == 0 && r->size == DATA_STREAM_BYTES && feof(r->f) && !ferror(r->f)) {
        dg_tensor_unref(*t);
        *t = NULL;
        r->size = r->offset;   // the stream's end, found
        return 0;
    }
    if (got != (size_t)p->record_bytes) {
        dg_status_setf(st, DG_DATA_LOSS, "fixed-record file \"%s\": record at byte %lld: read failed (%s)", path,
                       (long long)r->offset, ferror(r->f) ? strerror(errno) :
                       r->size == DATA_STREAM_BYTES ? "truncated: the stream ended" : "the file shrank");
        dg_tensor_unref(*t);
        *t = NULL;
        clearerr(r->f);
        r->offset = body_end;
        return -1;
    }
    r->offset += p->record_bytes;
    return 1;
}

// The next record of the open file r as an element: 1, 0 at its end, -1 on error.
static int reader_next(file_iter *it, file_reader *r, dg_element *out, dg_status *st) {
    const file_params *p = it->p;
    for (;;) {
        dg_tensor *t = NULL;
        int got;
        if (p->kind == K_TFRECORD) {
            got = data_tfrecord_read(r->f, p->files[r->file], r->size, p->opts.max_record_bytes, &r->offset, &t, st);
        } else if (p->kind == K_TEXT) {
            const unsigned char *line = NULL;
            size_t n = 0;
            got = read_line(it, r, &line, &n, st);
            if (got > 0 && !(t = dg_tensor_from_data(DG_UINT8, dg_shape1((int64_t)n), line, st))) got = -1;
        } else {
            got = read_fixed(it, r, &t, st);
        }
        if (got < 0 && p->opts.skip_corrupt && dg_status_code(st) == DG_DATA_LOSS) {
            atomic_fetch_add(&it->base.ctx->n_skipped, 1);
            dg_status_reset(st);
            // After a bad record the reader either stands past it or at the file's end; the
            // stream must stand there too, without the error of a failed read.
            clearerr(r->f);
            if (r->size == DATA_STREAM_BYTES) continue;   // read past the record already
            r->wpos = r->wlen = 0;
            if (r->offset < r->size && fseeko(r->f, (off_t)r->offset, SEEK_SET) != 0) r->offset = r->size;
            continue;
        }
        if (got <= 0) return got;
        out->components[0] = t;
        out->n = 1;
        return 1;
    }
}

static void advance(file_iter *it) {
    it->block_index = 0;
    it->cycle_index = (it->cycle_index + 1) % it->p->cycle_length;
}

// tf.data's deterministic interleave over the file list: a slot whose file ends is refilled
// from the list when the cycle comes back to it.
static int file_next(data_iter *base, dg_element *out, dg_status *st) {
    file_iter *it = (file_iter *)base;
    while (!it->end_of_input || it->n_open > 0) {
        file_reader *r = &it->slots[it->cycle_index];
        if (r->f) {
            int got = reader_next(it, r, out, st);
            if (got < 0) return -1;
            if (got > 0) {
                if (++it->block_index == it->p->block_length) advance(it);
                return 1;
            }
            reader_close(r);
            it->n_open--;
            advance(it);
        } else if (!it->end_of_input) {
            if (it->next_file >= it->p->n_files) {
                it->end_of_input = true;
                continue;
            }
            if (!reader_open(it->p, r, it->next_file, -1, st)) {
                // A fixed-record file shorter than its header and footer holds no record to
                // find: skipped whole, counted once.
                if (!it->p->opts.skip_corrupt || dg_status_code(st) != DG_DATA_LOSS) return -1;
                atomic_fetch_add(&it->base.ctx->n_skipped, 1);
                dg_status_reset(st);
                it->next_file++;
                continue;
            }
            it->next_file++;
            it->n_open++;
        } else {
            advance(it);
        }
    }
    return 0;
}

static bool file_save(data_iter *base, data_wr *w, dg_status *st) {
    file_iter *it = (file_iter *)base;
    data_put_i64(w, it->cycle_index);
    data_put_i64(w, it->block_index);
    data_put_i64(w, it->next_file);
    data_put_u64(w, it->end_of_input);
    for (int i = 0; i < it->p->cycle_length; i++) {
        data_put_i64(w, it->slots[i].f ? it->slots[i].file : -1);
        data_put_i64(w, it->slots[i].offset);
        data_put_i64(w, it->slots[i].size);
    }
    return true;
}

static bool file_restore(data_iter *base, data_rd *r, dg_status *st) {
    file_iter *it = (file_iter *)base;
    const file_params *p = it->p;
    int64_t ci, bi, nf;
    uint64_t eoi;
    if (!data_get_i64(r, &ci, st) || !data_get_i64(r, &bi, st) || !data_get_i64(r, &nf, st) ||
        !data_get_u64(r, &eoi, st))
        return false;
    if (ci < 0 || ci >= p->cycle_length || bi < 0 || bi >= p->block_length || nf < 0 || nf > p->n_files) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: %s files: cycle %lld, block %lld, next file %lld out "
                       "of range", kind_name[p->kind], (long long)ci, (long long)bi, (long long)nf);
        return false;
    }
    it->cycle_index = (int)ci;
    it->block_index = (int)bi;
    it->next_file = (int)nf;
    it->end_of_input = eoi != 0;
    for (int i = 0; i < p->cycle_length; i++) {
        int64_t file, off, size;
        if (!data_get_i64(r, &file, st) || !data_get_i64(r, &off, st) || !data_get_i64(r, &size, st)) return false;
        if (file < -1 || file >= p->n_files || off < 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: %s files: slot %d holds file %lld at byte %lld",
                           kind_name[p->kind], i, (long long)file, (long long)off);
            return false;
        }
        if (file >= 0) {
            file_reader *fr = &it->slots[i];
            if (!reader_open(p, fr, (int)file, off, st)) return false;
            it->n_open++;
            // The offsets mean something only in the file they were read from.
            if (fr->size != size) {
                dg_status_setf(st, DG_FAILED_PRECONDITION, "%s file \"%s\": %lld bytes, %lld when the state was saved "
                               "(the file changed since the state was saved)", kind_name[p->kind], p->files[file],
                               (long long)fr->size, (long long)size);
                return false;
            }
        }
    }
    return true;
}

static void file_free(data_iter *base) {
    file_iter *it = (file_iter *)base;
    for (int i = 0; it->slots && i < it->p->cycle_length; i++) {
        reader_close(&it->slots[i]);
        free(it->slots[i].win);
    }
    free(it->slots);
    free(it->buf);
    free(it);
}

static const data_iter_ops file_ops = {file_next, file_save, file_restore, file_free};

static data_iter *file_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    const file_params *p = ds->params;
    file_iter *it = calloc(1, sizeof *it);
    if (it) it->slots = calloc((size_t)p->cycle_length, sizeof *it->slots);
    if (!it || !it->slots) {
        free(it);
        base_oom(st, "file source", (size_t)p->cycle_length * sizeof *it->slots);
        return NULL;
    }
    it->base.ops = &file_ops;
    it->base.ctx = ctx;
    it->p = p;
    return &it->base;
}

static void file_params_free(dg_dataset *ds) {
    file_params *p = ds->params;
    if (!p) return;
    free_strings(p->files, p->n_files);
    free(p);
}

static void file_desc(dg_dataset *ds) {
    const file_params *p = ds->params;
    int n = snprintf(ds->desc, sizeof ds->desc, "%s(%d files, names and sizes %016llx", kind_name[p->kind], p->n_files,
                     (unsigned long long)p->files_hash);
    if (p->kind == K_FIXED)
        n += snprintf(ds->desc + n, sizeof ds->desc - (size_t)n, ", record %lld, header %lld, footer %lld",
                      (long long)p->record_bytes, (long long)p->header_bytes, (long long)p->footer_bytes);
    if (p->interleaved)
        n += snprintf(ds->desc + n, sizeof ds->desc - (size_t)n, ", interleave cycle %d block %d", p->cycle_length,
                      p->block_length);
    snprintf(ds->desc + n, sizeof ds->desc - (size_t)n, ")");
}

static dg_dataset *file_source(int kind, const char *const *files, int n_files, const dg_file_source_options *opts,
                               int64_t record_bytes, int64_t header_bytes, int64_t footer_bytes, dg_status *st) {
    dg_status_reset(st);
    dg_file_source_options o = opts ? *opts : dg_file_source_options_default();
    if (o.max_record_bytes <= 0) o.max_record_bytes = DEFAULT_MAX_RECORD_BYTES;
    if (kind == K_FIXED && (record_bytes <= 0 || header_bytes < 0 || footer_bytes < 0 ||
                            record_bytes > o.max_record_bytes || header_bytes > INT64_MAX - footer_bytes)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "fixed-record dataset: record %lld bytes (1 to %lld), header %lld, "
                       "footer %lld (>= 0, their sum under 2^63)", (long long)record_bytes,
                       (long long)o.max_record_bytes, (long long)header_bytes, (long long)footer_bytes);
        return NULL;
    }
    file_params *p = calloc(1, sizeof *p);
    if (!p) {
        base_oom(st, "file source", sizeof *p);
        return NULL;
    }
    p->kind = kind;
    p->opts = o;
    p->record_bytes = record_bytes;
    p->header_bytes = header_bytes;
    p->footer_bytes = footer_bytes;
    p->cycle_length = p->block_length = 1;
    p->files = copy_files(kind_name[kind], files, n_files, st);
    if (!p->files) {
        free(p);
        return NULL;
    }
    p->n_files = n_files;
    p->files_hash = files_hash(p->files, n_files);
    dg_dataset *ds = data_dataset_new(NULL, p, file_params_free, file_make, st);
    if (!ds) {
        free_strings(p->files, n_files);
        free(p);
        return NULL;
    }
    ds->is_file_source = true;
    file_desc(ds);
    return ds;
}

dg_dataset *dg_dataset_tfrecord(const char *const *files, int n_files, const dg_file_source_options *opts,
                                dg_status *st) {
    return file_source(K_TFRECORD, files, n_files, opts, 0, 0, 0, st);
}

dg_dataset *dg_dataset_text_lines(const char *const *files, int n_files, const dg_file_source_options *opts,
                                  dg_status *st) {
    return file_source(K_TEXT, files, n_files, opts, 0, 0, 0, st);
}

dg_dataset *dg_dataset_fixed_records(const char *const *files, int n_files, int64_t record_bytes,
                                     int64_t header_bytes, int64_t footer_bytes,
                                     const dg_file_source_options *opts, dg_status *st) {
    return file_source(K_FIXED, files, n_files, opts, record_bytes, header_bytes, footer_bytes, st);
}

bool data_file_source_interleave(dg_dataset *ds, int cycle_length, int block_length, dg_status *st) {
    file_params *p = ds->params;
    if (!ds->is_file_source || p->interleaved) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "interleave: the input must be a file source not yet interleaved, "
                       "got %s", ds->desc);
        return false;
    }
    if (cycle_length < 1 || block_length < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "interleave: cycle_length %d and block_length %d must be >= 1",
                       cycle_length, block_length);
        return false;
    }
    p->cycle_length = cycle_length;
    p->block_length = block_length;
    p->interleaved = true;
    file_desc(ds);
    return true;
}

// ---- IDX ----

typedef struct idx_file {
    char *path;
    dg_dtype dtype;
    int rank;                 // of an element: the file's dimensions less the first
    int64_t dims[DG_MAX_RANK];
    int64_t header_bytes, element_bytes;
} idx_file;

typedef struct idx_params {
    idx_file *files;
    int n_files;
    int64_t n_elements;
} idx_params;

static void idx_params_free(dg_dataset *ds) {
    idx_params *p = ds->params;
    if (!p) return;
    for (int i = 0; i < p->n_files; i++) free(p->files[i].path);
    free(p->files);
    free(p);
}

// Reads and checks the header of an IDX file; *n0 gets its first dimension.
static bool idx_header(const char *path, idx_file *out, int64_t *n0, dg_status *st) {
    int64_t size;
    FILE *f = open_file("IDX", path, &size, st);
    if (!f) return false;
    unsigned char h[4 + 4 * 255];
    bool ok = false;
    if (size == DATA_STREAM_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": is a pipe or a device; IDX elements are read "
                       "where they lie, so the file must be a regular one", path);
        goto done;
    }
    if (fread(h, 1, 4, f) != 4) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": %lld bytes, shorter than the 4-byte magic", path,
                       (long long)size);
        goto done;
    }
    if (h[0] != 0 || h[1] != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": bad magic %02x %02x %02x %02x (must start with two "
                       "zero bytes)", path, h[0], h[1], h[2], h[3]);
        goto done;
    }
    switch (h[2]) {
    case 0x08: out->dtype = DG_UINT8; break;
    case 0x0C: out->dtype = DG_INT32; break;
    case 0x0D: out->dtype = DG_FLOAT32; break;
    case 0x0E: out->dtype = DG_FLOAT64; break;
    case 0x09:
    case 0x0B:
        dg_status_setf(st, DG_UNIMPLEMENTED, "IDX file \"%s\": type 0x%02x (int8 or int16) is not read", path, h[2]);
        goto done;
    default:
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": unknown type byte 0x%02x", path, h[2]);
        goto done;
    }
    int nd = h[3];
    if (nd < 1 || nd > DG_MAX_RANK + 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": %d dimensions (1 to %d read)", path, nd,
                       DG_MAX_RANK + 1);
        goto done;
    }
    if (fread(h + 4, 1, (size_t)nd * 4, f) != (size_t)nd * 4) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": header cut short (%d dimensions, %lld bytes)", path,
                       nd, (long long)size);
        goto done;
    }
    int64_t count = 1;   // values per element
    *n0 = 0;
    for (int d = 0; d < nd; d++) {
        const unsigned char *q = h + 4 + 4 * d;
        int64_t v = (int64_t)((uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3]);
        if (d == 0) {
            *n0 = v;
        } else {
            out->dims[d - 1] = v;
            // Capped past the file's size: the check below refuses it without overflow.
            count = v > 0 && count > (size + 1) / v ? size + 1 : count * v;
        }
    }
    out->rank = nd - 1;
    // An element of a zero dimension is empty, but its other dimensions must still make a shape
    // a tensor can have (their product fits in 64 bits), or no element could be made.
    dg_shape esh = dg_shape_make(out->rank, out->dims);
    if (dg_shape_num_elements(&esh) < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": the dimensions of an element (%d of them) multiply "
                       "past 2^63", path, out->rank);
        goto done;
    }
    out->header_bytes = 4 + 4 * (int64_t)nd;
    out->element_bytes = count * (int64_t)dg_dtype_size(out->dtype);
    int64_t body = size - out->header_bytes;
    if (out->element_bytes > body || (out->element_bytes > 0 && *n0 > body / out->element_bytes) ||
        *n0 * out->element_bytes != body) {
        char dims[128];
        int k = snprintf(dims, sizeof dims, "%lld", (long long)*n0);
        for (int d = 0; d < out->rank && k < (int)sizeof dims; d++)
            k += snprintf(dims + k, sizeof dims - (size_t)k, "x%lld", (long long)out->dims[d]);
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX file \"%s\": header says %s %s values, the file holds %lld bytes "
                       "after its %lld-byte header", path, dims, dg_dtype_name(out->dtype), (long long)body,
                       (long long)out->header_bytes);
        goto done;
    }
    ok = true;
done:
    fclose(f);
    return ok;
}

typedef struct idx_iter {
    data_iter base;
    const idx_params *p;
    FILE **f;
    int64_t index;
} idx_iter;

static int idx_next(data_iter *base, dg_element *out, dg_status *st) {
    idx_iter *it = (idx_iter *)base;
    const idx_params *p = it->p;
    if (it->index >= p->n_elements) return 0;
    for (int i = 0; i < p->n_files; i++) {
        const idx_file *x = &p->files[i];
        dg_tensor *t = dg_tensor_new(x->dtype, dg_shape_make(x->rank, x->dims), st);
        if (!t) {
            dg_element_clear(out);
            return -1;
        }
        out->components[out->n++] = t;
        unsigned char *d = dg_tensor_data(t);
        int64_t off = x->header_bytes + it->index * x->element_bytes;
        if (fseeko(it->f[i], (off_t)off, SEEK_SET) != 0 ||
            fread(d, 1, (size_t)x->element_bytes, it->f[i]) != (size_t)x->element_bytes) {
            dg_status_setf(st, DG_DATA_LOSS, "IDX file \"%s\": element %lld at byte %lld: read failed (%s)", x->path,
                           (long long)it->index, (long long)off,
                           ferror(it->f[i]) ? strerror(errno) : "the file shrank");
            clearerr(it->f[i]);
            dg_element_clear(out);   // no part of an element leaves on an error
            return -1;
        }
        // Values are big-endian in the file.
        size_t w = dg_dtype_size(x->dtype);
        if (w > 1 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
            for (int64_t k = 0; k < x->element_bytes; k += (int64_t)w)
                for (size_t a = 0, b = w - 1; a < b; a++, b--) {
                    unsigned char c = d[k + (int64_t)a];
                    d[k + (int64_t)a] = d[k + (int64_t)b];
                    d[k + (int64_t)b] = c;
                }
    }
    it->index++;
    return 1;
}

static bool idx_save(data_iter *base, data_wr *w, dg_status *st) {
    data_put_i64(w, ((idx_iter *)base)->index);
    return true;
}

static bool idx_restore(data_iter *base, data_rd *r, dg_status *st) {
    idx_iter *it = (idx_iter *)base;
    int64_t i;
    if (!data_get_i64(r, &i, st)) return false;
    if (i < 0 || i > it->p->n_elements) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: IDX element %lld of %lld", (long long)i,
                       (long long)it->p->n_elements);
        return false;
    }
    it->index = i;
    return true;
}

static void idx_free(data_iter *base) {
    idx_iter *it = (idx_iter *)base;
    for (int i = 0; it->f && i < it->p->n_files; i++)
        if (it->f[i]) fclose(it->f[i]);
    free(it->f);
    free(it);
}

static const data_iter_ops idx_ops = {idx_next, idx_save, idx_restore, idx_free};

static data_iter *idx_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    const idx_params *p = ds->params;
    idx_iter *it = calloc(1, sizeof *it);
    if (it) it->f = calloc((size_t)p->n_files, sizeof *it->f);
    if (!it || !it->f) {
        free(it);
        base_oom(st, "IDX source", sizeof *it);
        return NULL;
    }
    it->base.ops = &idx_ops;
    it->base.ctx = ctx;
    it->p = p;
    for (int i = 0; i < p->n_files; i++) {
        int64_t size;
        it->f[i] = open_file("IDX", p->files[i].path, &size, st);
        if (!it->f[i]) {
            idx_free(&it->base);
            return NULL;
        }
    }
    return &it->base;
}

dg_dataset *dg_dataset_idx(const char *const *files, int n_files, dg_status *st) {
    dg_status_reset(st);
    if (!files || n_files < 1 || n_files > DG_ELEMENT_MAX_COMPONENTS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX dataset: %d files (1 to %d)", n_files, DG_ELEMENT_MAX_COMPONENTS);
        return NULL;
    }
    idx_params *p = calloc(1, sizeof *p);
    if (p) p->files = calloc((size_t)n_files, sizeof *p->files);
    if (!p || !p->files) {
        free(p);
        base_oom(st, "IDX dataset", sizeof *p);
        return NULL;
    }
    dg_dataset tmp = {.params = p};
    for (int i = 0; i < n_files; i++) {
        if (!files[i]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX dataset: file %d has no name", i);
            goto fail;
        }
        int64_t n0 = 0;
        p->files[i].path = strdup(files[i]);
        p->n_files = i + 1;
        if (!p->files[i].path) {
            base_oom(st, "IDX dataset", strlen(files[i]));
            goto fail;
        }
        if (!idx_header(files[i], &p->files[i], &n0, st)) goto fail;
        if (i == 0) {
            p->n_elements = n0;
        } else if (n0 != p->n_elements) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "IDX dataset: \"%s\" holds %lld elements, \"%s\" %lld", files[0],
                           (long long)p->n_elements, files[i], (long long)n0);
            goto fail;
        }
    }
    dg_dataset *ds = data_dataset_new(NULL, p, idx_params_free, idx_make, st);
    if (!ds) goto fail;
    snprintf(ds->desc, sizeof ds->desc, "IDX(%d files, %lld elements)", n_files, (long long)p->n_elements);
    return ds;
fail:
    idx_params_free(&tmp);
    return NULL;
}

// ---- tensors in memory ----

typedef struct tensor_params {
    dg_tensor *c[DG_ELEMENT_MAX_COMPONENTS];
    int n;
    int64_t n_elements;
} tensor_params;

typedef struct tensor_iter {
    data_iter base;
    const tensor_params *p;
    int64_t index;
} tensor_iter;

static int tensor_next(data_iter *base, dg_element *out, dg_status *st) {
    tensor_iter *it = (tensor_iter *)base;
    const tensor_params *p = it->p;
    if (it->index >= p->n_elements) return 0;
    for (int i = 0; i < p->n; i++) {
        const dg_tensor *src = p->c[i];
        const dg_shape *sh = dg_tensor_shape(src);
        dg_shape es = dg_shape_make(sh->rank - 1, sh->dims + 1);
        size_t bytes = dg_tensor_nbytes(src) / (size_t)p->n_elements;
        dg_tensor *t = dg_tensor_from_data(dg_tensor_dtype(src), es,
                                           (const unsigned char *)dg_tensor_data(src) + (size_t)it->index * bytes, st);
        if (!t) {
            dg_element_clear(out);
            return -1;
        }
        out->components[out->n++] = t;
    }
    it->index++;
    return 1;
}

static bool tensor_restore(data_iter *base, data_rd *r, dg_status *st) {
    tensor_iter *it = (tensor_iter *)base;
    int64_t i;
    if (!data_get_i64(r, &i, st)) return false;
    if (i < 0 || i > it->p->n_elements) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: tensor slice %lld of %lld", (long long)i,
                       (long long)it->p->n_elements);
        return false;
    }
    it->index = i;
    return true;
}

static bool tensor_save(data_iter *base, data_wr *w, dg_status *st) {
    data_put_i64(w, ((tensor_iter *)base)->index);
    return true;
}

static void tensor_free(data_iter *base) { free(base); }

static const data_iter_ops tensor_ops = {tensor_next, tensor_save, tensor_restore, tensor_free};

static data_iter *tensor_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    tensor_iter *it = calloc(1, sizeof *it);
    if (!it) {
        base_oom(st, "tensor source", sizeof *it);
        return NULL;
    }
    it->base.ops = &tensor_ops;
    it->base.ctx = ctx;
    it->p = ds->params;
    return &it->base;
}

static void tensor_params_free(dg_dataset *ds) {
    tensor_params *p = ds->params;
    if (!p) return;
    for (int i = 0; i < p->n; i++) dg_tensor_unref(p->c[i]);
    free(p);
}

dg_dataset *dg_dataset_from_tensors(dg_tensor *const *components, int n, dg_status *st) {
    dg_status_reset(st);
    if (!components || n < 1 || n > DG_ELEMENT_MAX_COMPONENTS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "tensor dataset: %d components (1 to %d)", n, DG_ELEMENT_MAX_COMPONENTS);
        return NULL;
    }
    int64_t n0 = -1;
    for (int i = 0; i < n; i++) {
        if (!components[i] || dg_tensor_rank(components[i]) < 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "tensor dataset: component %d is NULL or a scalar (rank >= 1 needed)",
                           i);
            return NULL;
        }
        int64_t d0 = dg_tensor_dim(components[i], 0);
        if (n0 >= 0 && d0 != n0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "tensor dataset: component %d has %lld rows, component 0 %lld", i,
                           (long long)d0, (long long)n0);
            return NULL;
        }
        n0 = d0;
    }
    tensor_params *p = calloc(1, sizeof *p);
    if (!p) {
        base_oom(st, "tensor dataset", sizeof *p);
        return NULL;
    }
    for (int i = 0; i < n; i++) p->c[i] = dg_tensor_ref(components[i]);
    p->n = n;
    p->n_elements = n0;
    dg_dataset *ds = data_dataset_new(NULL, p, tensor_params_free, tensor_make, st);
    if (!ds) {
        dg_dataset tmp = {.params = p};
        tensor_params_free(&tmp);
        return NULL;
    }
    snprintf(ds->desc, sizeof ds->desc, "tensors(%d components, %lld elements)", n, (long long)n0);
    return ds;
}
