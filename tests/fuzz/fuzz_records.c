/* libFuzzer target for the readers of record files (runtime/data/: tfrecord.c, sources.c): any
 * file content, read as TFRecord, as text lines and as IDX, gives either elements that the
 * file's bytes account for, or a status of the documented codes whose message names the file.
 * With skip_corrupt, a TFRecord file never fails. Built by hand, not by CMake: see README.md here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distgraph/distgraph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

static bool starts(const dg_status *st, const char *prefix) {
    return strncmp(dg_status_message(st), prefix, strlen(prefix)) == 0 && strstr(dg_status_message(st), path);
}

// Reads ds to its end (at most max elements); returns the elements' bytes, -1 on an error.
static int64_t drain(dg_dataset *ds, int64_t max, int64_t *n, int64_t *skipped, dg_status *st) {
    dg_iterator *it = dg_iterator_new(ds, st);
    if (!it) abort();
    dg_element e = {0};
    bool end = false;
    int64_t bytes = 0;
    *n = 0;
    while (*n < max && dg_iterator_next(it, &e, &end, st) && !end) {
        for (int i = 0; i < e.n; i++) bytes += (int64_t)dg_tensor_nbytes(e.components[i]);
        (*n)++;
    }
    bool failed = !dg_status_ok(st);
    if (skipped) *skipped = dg_iterator_skipped(it);
    dg_element_clear(&e);
    dg_iterator_free(&it);
    return failed ? -1 : bytes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_records_%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    dg_status *st = dg_status_new();
    const char *files[] = {path};
    int64_t n, skipped;

    // TFRecord: every record costs 16 bytes beside its data, so the file accounts for them all.
    dg_dataset *ds = dg_dataset_tfrecord(files, 1, NULL, st);
    int64_t bytes = drain(ds, INT64_MAX, &n, NULL, st);
    if (bytes >= 0 && bytes + 16 * n != (int64_t)size) abort();
    if (bytes < 0 && (dg_status_code(st) != DG_DATA_LOSS || !starts(st, "TFRecord file \""))) abort();
    dg_dataset_free(&ds);
    dg_file_source_options o = dg_file_source_options_default();
    o.skip_corrupt = true;
    ds = dg_dataset_tfrecord(files, 1, &o, st);
    bytes = drain(ds, INT64_MAX, &n, &skipped, st);
    if (bytes < 0 || bytes + 16 * n > (int64_t)size || (skipped == 0 && bytes + 16 * n != (int64_t)size)) abort();
    dg_dataset_free(&ds);

    // Text lines: the lines' bytes are the file's less the line ends.
    ds = dg_dataset_text_lines(files, 1, NULL, st);
    bytes = drain(ds, INT64_MAX, &n, NULL, st);
    if (bytes < 0 || bytes > (int64_t)size) abort();
    dg_dataset_free(&ds);

    // IDX: refused with a message naming the file, or elements of the header's sizes (at most
    // 10^5 read: a file of empty elements may declare 2^32 of them).
    ds = dg_dataset_idx(files, 1, st);
    if (!ds) {
        dg_code c = dg_status_code(st);
        if ((c != DG_INVALID_ARGUMENT && c != DG_UNIMPLEMENTED) || !starts(st, "IDX file \"")) abort();
    } else {
        bytes = drain(ds, 100000, &n, NULL, st);
        if (bytes < 0 || bytes > (int64_t)size) abort();
        dg_dataset_free(&ds);
    }
    dg_status_free(&st);
    return 0;
}
