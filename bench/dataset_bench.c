/* dataset_bench: records per second of an input pipeline over TFRecord shards of an IDX pair
 * written by dg-tfrecord (docs/DATASETS.md: each record is the label as 8 bytes, then the
 * image's bytes): TFRecord -> map(parse: a float32 image [784] scaled by 1/255 and an int64
 * label, --parallelism threads) -> shuffle(--shuffle) -> batch(--batch) -> prefetch, read
 * --epochs times, each epoch by a new iterator. The pipeline of bench/peers/tf_dataset.py.
 * Prints one JSON line:
 *   {"bench": "dataset", "system": "distgraph", "records_per_s": ..., "records": ..., ...}
 * Usage: dataset_bench [--epochs N] [--parallelism P] [--shuffle B] [--batch K] FILE... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distgraph/distgraph.h>

#define IMAGE_BYTES 784

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A record: the label (int64, little-endian), then 784 uint8 pixels.
static bool parse(void *ctx, const dg_element *in, dg_element *out, dg_status *st) {
    const dg_tensor *rec = in->components[0];
    if (dg_tensor_nbytes(rec) != 8 + IMAGE_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "a record of %zu bytes, %d expected", dg_tensor_nbytes(rec),
                       8 + IMAGE_BYTES);
        return false;
    }
    const unsigned char *b = dg_tensor_data(rec);
    int64_t label = 0;
    for (int i = 7; i >= 0; i--) label = (int64_t)((uint64_t)label << 8 | b[i]);
    dg_tensor *img = dg_tensor_new(DG_FLOAT32, dg_shape1(IMAGE_BYTES), st);
    if (!img) return false;
    float *f = dg_tensor_f32(img);
    for (int i = 0; i < IMAGE_BYTES; i++) f[i] = (float)b[8 + i] * (1.0f / 255.0f);
    out->components[0] = img;
    out->components[1] = dg_tensor_scalar_i64(label);
    out->n = 2;
    return true;
}

int main(int argc, char **argv) {
    int epochs = 5, parallelism = 2, batch = 100;
    int64_t shuffle = 10000;
    const char **files = calloc((size_t)argc, sizeof *files);
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--parallelism") && i + 1 < argc) parallelism = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shuffle") && i + 1 < argc) shuffle = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else files[n_files++] = argv[i];
    }
    if (n_files == 0 || epochs < 1) {
        fprintf(stderr, "usage: dataset_bench [--epochs N] [--parallelism P] [--shuffle B] [--batch K] FILE...\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_dataset *ds = dg_dataset_tfrecord(files, n_files, NULL, st);
    ds = dg_dataset_map(ds, parse, NULL, parallelism, st);
    ds = dg_dataset_shuffle(ds, shuffle, 1, st);
    ds = dg_dataset_batch(ds, batch, false, st);
    ds = dg_dataset_prefetch(ds, DG_PREFETCH_AUTO, st);
    if (!ds) {
        fprintf(stderr, "dataset_bench: %s\n", dg_status_message(st));
        return 1;
    }
    int64_t records = 0;
    double sum = 0;   // of the first pixel and the label of every batch: the data are used
    double t0 = now_s();
    for (int e = 0; e < epochs; e++) {
        dg_iterator *it = dg_iterator_new(ds, st);
        dg_element b = {0};
        bool end = false;
        while (it && dg_iterator_next(it, &b, &end, st) && !end) {
            records += dg_tensor_dim(b.components[0], 0);
            sum += dg_tensor_f32(b.components[0])[0] + (double)dg_tensor_i64(b.components[1])[0];
        }
        dg_element_clear(&b);
        dg_iterator_free(&it);
        if (!dg_status_ok(st)) {
            fprintf(stderr, "dataset_bench: %s\n", dg_status_message(st));
            return 1;
        }
    }
    double s = now_s() - t0;
    printf("{\"bench\": \"dataset\", \"system\": \"distgraph\", \"records_per_s\": %.0f, \"records\": %lld, "
           "\"epochs\": %d, \"seconds\": %.3f, \"parallelism\": %d, \"shuffle\": %lld, \"batch\": %d, "
           "\"checksum\": %.1f}\n",
           (double)records / s, (long long)records, epochs, s, parallelism, (long long)shuffle, batch, sum);
    dg_dataset_free(&ds);
    dg_status_free(&st);
    free(files);
    return 0;
}
