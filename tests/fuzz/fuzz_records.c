/* libFuzzer target for the readers of record files (runtime/data/: tfrecord.c, sources.c) and
 * of iterator states (dataset.c): any file content, read as TFRecord, as text lines, as
 * fixed-size records and as IDX, gives either elements that the file's bytes account for, or a
 * status of the documented codes whose message names the file. With skip_corrupt, a TFRecord
 * or fixed-record file never fails. The same bytes given to dg_iterator_restore of a pipeline
 * with every kind of state (file offsets, shuffle buffer, map results, prefetched elements,
 * repeat) are refused with INVALID_ARGUMENT, DATA_LOSS or FAILED_PRECONDITION, or restore an
 * iterator that then runs; and so are those bytes with a valid frame and CRC around them.
 * Built by hand, not by CMake: see README.md here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c_impl.h"

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

static bool copy_one(void *ctx, const dg_element *in, dg_element *out, dg_status *st) {
    out->components[0] = dg_tensor_ref(in->components[0]);
    out->n = 1;
    return true;
}

// Restores bytes into a pipeline over the file: refused with a documented code, or the
// iterator runs (at most 64 elements).
static void fuzz_restore(const uint8_t *bytes, size_t n, dg_status *st) {
    const char *files[] = {path};
    dg_file_source_options o = dg_file_source_options_default();
    o.skip_corrupt = true;
    dg_dataset *ds = dg_dataset_fixed_records(files, 1, 3, 1, 0, &o, st);
    ds = dg_dataset_repeat(dg_dataset_shuffle(ds, 4, 9, st), 2, st);
    ds = dg_dataset_prefetch(dg_dataset_map(ds, copy_one, NULL, 2, st), 2, st);
    if (!ds) abort();
    dg_iterator *it = dg_iterator_new(ds, st);
    if (!it) abort();
    if (dg_iterator_restore(it, bytes, n, st)) {
        dg_element e = {0};
        bool end = false;
        for (int i = 0; i < 64 && dg_iterator_next(it, &e, &end, st) && !end; i++) {
        }
        dg_element_clear(&e);
    } else {
        dg_code c = dg_status_code(st);
        if (c != DG_INVALID_ARGUMENT && c != DG_DATA_LOSS && c != DG_FAILED_PRECONDITION && c != DG_NOT_FOUND)
            abort();
    }
    dg_iterator_free(&it);
    dg_dataset_free(&ds);
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

    // Fixed-size records of 3 bytes after a 1-byte header: with skip_corrupt never a failure,
    // and whole records only.
    ds = dg_dataset_fixed_records(files, 1, 3, 1, 0, &o, st);
    bytes = drain(ds, INT64_MAX, &n, &skipped, st);
    if (bytes < 0 || bytes != 3 * n || bytes > (int64_t)size) abort();
    dg_dataset_free(&ds);

    // Iterator states: the raw bytes, and the bytes framed as a state of this format (magic,
    // version 2, their CRC-32C) so that the fuzzer reaches the stages' readers.
    fuzz_restore(data, size, st);
    uint8_t *framed = malloc(size + 12);
    if (!framed) abort();
    memcpy(framed, "DGIT", 4);
    uint32_t v = 2, crc = data_crc32c(0, data, size);
    for (int i = 0; i < 4; i++) {
        framed[4 + i] = (uint8_t)(v >> (8 * i));
        framed[8 + i] = (uint8_t)(crc >> (8 * i));
    }
    if (size) memcpy(framed + 12, data, size);
    fuzz_restore(framed, size + 12, st);
    free(framed);

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
