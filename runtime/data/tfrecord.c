/* TFRecord records (tfrecord_impl.h): the reader of one record and the public writer. Lengths
 * read from a file are checked against the bytes the file has left before anything is
 * allocated, so a damaged length never becomes a huge allocation. A writer whose write failed
 * refuses later writes: the file may end in a torn record. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base_impl.h"
#include "crc32c_impl.h"
#include "distgraph/dataset.h"
#include "tfrecord_impl.h"

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

int data_tfrecord_read(FILE *f, const char *path, int64_t file_bytes, int64_t max_bytes, int64_t *offset,
                       dg_tensor **out, dg_status *st) {
    int64_t at = *offset;
    *out = NULL;
    if (at >= file_bytes) return 0;
    unsigned char head[12], foot[4];
    if (file_bytes - at < 12) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: truncated length (%lld bytes left, "
                       "12 needed)", path, (long long)at, (long long)(file_bytes - at));
        *offset = file_bytes;
        return -1;
    }
    size_t n_head = fread(head, 1, 12, f);
    if (n_head == 0 && file_bytes == DATA_STREAM_BYTES && feof(f) && !ferror(f)) return 0;   // the stream's end
    if (n_head != 12) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: read failed (%s)", path,
                       (long long)at, ferror(f) ? strerror(errno) : file_bytes == DATA_STREAM_BYTES ? "the stream ended" : "the file shrank");
        clearerr(f);
        *offset = file_bytes;
        return -1;
    }
    uint32_t want = data_crc32c_unmask(le32(head + 8));
    if (data_crc32c(0, head, 8) != want) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: corrupted length (CRC-32C "
                       "mismatch)", path, (long long)at);
        *offset = file_bytes;
        return -1;
    }
    uint64_t len = le64(head);
    int64_t left = file_bytes - at - 12;
    bool fits = left >= 4 && len <= (uint64_t)(left - 4);
    if (len > (uint64_t)max_bytes) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: length %llu is over the limit "
                       "of %lld bytes", path, (long long)at, (unsigned long long)len, (long long)max_bytes);
        // The length passed its CRC: the next record follows this one when it fits in the file.
        *offset = fits ? at + 16 + (int64_t)len : file_bytes;
        if (file_bytes == DATA_STREAM_BYTES && fits) {   // no seeking in a stream: read past the record
            unsigned char skip[4096];
            for (uint64_t left_bytes = len + 4; left_bytes > 0;) {   // fits: len + 4 does not wrap
                size_t want_bytes = left_bytes < sizeof skip ? (size_t)left_bytes : sizeof skip;
                size_t got = fread(skip, 1, want_bytes, f);
                if (got == 0) {
                    clearerr(f);
                    *offset = file_bytes;
                    break;
                }
                left_bytes -= got;
            }
        }
        return -1;
    }
    if (!fits) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: truncated data (length %llu, "
                       "%lld bytes left)", path, (long long)at, (unsigned long long)len, (long long)left);
        *offset = file_bytes;
        return -1;
    }
    // Straight into the element's tensor: one copy of the bytes, from the stream's buffer.
    dg_tensor *t = dg_tensor_new(DG_UINT8, dg_shape1((int64_t)len), st);
    if (!t) {
        dg_status_prepend(st, "TFRecord file \"%s\": record at byte %lld", path, (long long)at);
        return -1;
    }
    unsigned char *data = dg_tensor_data(t);
    if (fread(data, 1, (size_t)len, f) != (size_t)len || fread(foot, 1, 4, f) != 4) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: read failed (%s)", path,
                       (long long)at, ferror(f) ? strerror(errno) : file_bytes == DATA_STREAM_BYTES ? "the stream ended" : "the file shrank");
        clearerr(f);
        dg_tensor_unref(t);
        *offset = file_bytes;
        return -1;
    }
    *offset = at + 16 + (int64_t)len;
    if (data_crc32c(0, data, (size_t)len) != data_crc32c_unmask(le32(foot))) {
        dg_status_setf(st, DG_DATA_LOSS, "TFRecord file \"%s\": record at byte %lld: corrupted data (CRC-32C "
                       "mismatch, %llu bytes)", path, (long long)at, (unsigned long long)len);
        dg_tensor_unref(t);
        return -1;
    }
    *out = t;
    return 1;
}

// ---- writer ----

struct dg_tfrecord_writer {
    FILE *f;
    char *path;
    bool failed;   // a write failed, perhaps part way: the file may end in a torn record
};

static dg_code code_of_errno(int e) {
    switch (e) {
    case ENOENT:
    case ENOTDIR:
        return DG_NOT_FOUND;
    case EACCES:
    case EPERM:
    case EROFS:
    case EISDIR:
        return DG_FAILED_PRECONDITION;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return DG_RESOURCE_EXHAUSTED;
    default:
        return DG_UNAVAILABLE;
    }
}

dg_tfrecord_writer *dg_tfrecord_writer_new(const char *path, dg_status *st) {
    dg_status_reset(st);
    if (!path || !*path) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "TFRecord writer: no path");
        return NULL;
    }
    dg_tfrecord_writer *w = calloc(1, sizeof *w);
    if (w) w->path = strdup(path);
    if (!w || !w->path) {
        free(w);
        base_oom(st, "TFRecord writer", strlen(path));
        return NULL;
    }
    w->f = fopen(path, "wbe");
    if (!w->f) {
        int e = errno;
        dg_status_setf(st, code_of_errno(e), "TFRecord writer: cannot create \"%s\": %s", path, strerror(e));
        dg_tfrecord_writer_free(&w);
        return NULL;
    }
    return w;
}

bool dg_tfrecord_writer_write(dg_tfrecord_writer *w, const void *data, size_t n_bytes, dg_status *st) {
    dg_status_reset(st);
    if (!w || !w->f || (!data && n_bytes)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "TFRecord writer: write on a NULL or closed writer, or NULL data");
        return false;
    }
    if (w->failed) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "TFRecord writer: \"%s\": an earlier write failed; the file may "
                       "end in a partial record", w->path);
        return false;
    }
    unsigned char head[12], foot[4];
    put_le64(head, (uint64_t)n_bytes);
    put_le32(head + 8, data_crc32c_mask(data_crc32c(0, head, 8)));
    put_le32(foot, data_crc32c_mask(data_crc32c(0, data, n_bytes)));
    if (fwrite(head, 1, 12, w->f) != 12 || (n_bytes && fwrite(data, 1, n_bytes, w->f) != n_bytes) ||
        fwrite(foot, 1, 4, w->f) != 4) {
        int e = errno;
        w->failed = true;
        dg_status_setf(st, code_of_errno(e), "TFRecord writer: writing \"%s\": %s", w->path, strerror(e));
        return false;
    }
    return true;
}

bool dg_tfrecord_writer_close(dg_tfrecord_writer *w, bool sync, dg_status *st) {
    dg_status_reset(st);
    if (!w || !w->f) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "TFRecord writer: close on a NULL or closed writer");
        return false;
    }
    bool ok = fflush(w->f) == 0 && (!sync || fsync(fileno(w->f)) == 0);
    int e = errno;
    if (fclose(w->f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    w->f = NULL;
    if (!ok) {
        dg_status_setf(st, code_of_errno(e), "TFRecord writer: closing \"%s\": %s", w->path, strerror(e));
    } else if (w->failed) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "TFRecord writer: closing \"%s\": an earlier write failed; the file "
                       "may end in a partial record", w->path);
        ok = false;
    }
    return ok;
}

void dg_tfrecord_writer_free(dg_tfrecord_writer **wp) {
    if (!wp || !*wp) return;
    dg_tfrecord_writer *w = *wp;
    if (w->f) fclose(w->f);
    free(w->path);
    free(w);
    *wp = NULL;
}
