/* dg-tfrecord: writes TFRecord shards from IDX image/label pairs or text files, and checks
 * TFRecord files. Record layouts in docs/DATASETS.md; uses the public API only. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

static const char usage[] =
    "usage:\n"
    "  dg-tfrecord idx --images FILE --labels FILE --out PREFIX [--shards N]\n"
    "      One record per example of an IDX pair (MNIST, Fashion-MNIST: uncompressed files).\n"
    "      Each record holds, in this order:\n"
    "        the label:  8 bytes, a signed integer, little-endian (the label file's value)\n"
    "        the image:  the image's values as stored in the IDX file's type, row-major\n"
    "                    (MNIST: 784 bytes, uint8, 28 rows of 28 pixels), little-endian\n"
    "      so a record of MNIST is 792 bytes.\n"
    "  dg-tfrecord text --out PREFIX [--shards N] FILE...\n"
    "      One record per line of the files (without its \"\\n\" or \"\\r\\n\").\n"
    "  dg-tfrecord count FILE...\n"
    "      Reads every record of the TFRecord files, checking each CRC-32C; prints\n"
    "      \"FILE: N records, B bytes\" per file and exits 1 on the first damaged record.\n"
    "Shards: record i goes to shard i mod N (1 to 4096, default 1), written to\n"
    "PREFIX-SSSSS-of-NNNNN.tfrecord (TensorFlow's naming), so each shard holds every N-th\n"
    "example; a reader (dg_dataset_tfrecord, tf.data.TFRecordDataset) reads them as they are.\n"
    "Shards are written under a temporary name (NAME.tmp-PID) and renamed once all are\n"
    "complete: a failed run leaves no shard of that name behind.\n";

#define MAX_SHARDS 4096

static int fail(const char *what, const dg_status *st) {
    fprintf(stderr, "dg-tfrecord: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

typedef struct shards {
    dg_tfrecord_writer **w;
    char **paths;   // the final names
    char **tmp;     // what is written until every shard is complete
    int n;          // entries of w, paths and tmp (set once they are allocated)
    int64_t written;
    bool renamed;
} shards;

static bool shards_open(shards *s, const char *prefix, int n, dg_status *st) {
    s->w = calloc((size_t)n, sizeof *s->w);
    s->paths = calloc((size_t)n, sizeof *s->paths);
    s->tmp = calloc((size_t)n, sizeof *s->tmp);
    if (!s->w || !s->paths || !s->tmp) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "out of memory for %d shards", n);
        return false;
    }
    s->n = n;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(prefix) + 64;
        s->paths[i] = malloc(len);
        s->tmp[i] = malloc(len);
        if (!s->paths[i] || !s->tmp[i]) {
            dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory for a shard's name");
            return false;
        }
        snprintf(s->paths[i], len, "%s-%05d-of-%05d.tfrecord", prefix, i, n);
        snprintf(s->tmp[i], len, "%s.tmp-%ld", s->paths[i], (long)getpid());
        s->w[i] = dg_tfrecord_writer_new(s->tmp[i], st);
        if (!s->w[i]) return false;
    }
    return true;
}

static bool shards_write(shards *s, const void *data, size_t n, dg_status *st) {
    return dg_tfrecord_writer_write(s->w[s->written++ % s->n], data, n, st);
}

// Closes every shard (fsync), then renames them to their names: a shard of the final name is
// always complete.
static bool shards_close(shards *s, dg_status *st) {
    for (int i = 0; i < s->n; i++)
        if (!dg_tfrecord_writer_close(s->w[i], true, st)) return false;
    for (int i = 0; i < s->n; i++) {
        if (rename(s->tmp[i], s->paths[i]) != 0) {
            dg_status_setf(st, DG_UNAVAILABLE, "renaming \"%s\" to \"%s\": %s", s->tmp[i], s->paths[i],
                           strerror(errno));
            return false;
        }
        printf("%s\n", s->paths[i]);
    }
    s->renamed = true;
    return true;
}

// Frees the writers; the temporary files of a run that did not finish are removed.
static void shards_free(shards *s) {
    for (int i = 0; i < s->n; i++) {
        dg_tfrecord_writer_free(&s->w[i]);
        if (!s->renamed && s->tmp[i]) unlink(s->tmp[i]);
        free(s->paths[i]);
        free(s->tmp[i]);
    }
    free(s->w);
    free(s->paths);
    free(s->tmp);
}

static int64_t label_of(const dg_tensor *t) {
    return dg_tensor_num_elements(t) == 1 ? (int64_t)dg_tensor_get_as_double(t, 0) : -1;
}

static int cmd_idx(const char *images, const char *labels, const char *prefix, int n_shards) {
    dg_status *st = dg_status_new();
    const char *files[2] = {images, labels};
    dg_dataset *ds = dg_dataset_idx(files, 2, st);
    dg_iterator *it = ds ? dg_iterator_new(ds, st) : NULL;
    shards sh = {0};
    dg_element e = {0};
    unsigned char *rec = NULL;
    size_t cap = 0;
    int rc = 1;
    if (!it || !shards_open(&sh, prefix, n_shards, st)) goto out;
    for (;;) {
        bool end;
        if (!dg_iterator_next(it, &e, &end, st)) goto out;
        if (end) break;
        const dg_tensor *img = e.components[0], *lab = e.components[1];
        if (dg_tensor_num_elements(lab) != 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "\"%s\": a label is not one value (%lld values)", labels,
                           (long long)dg_tensor_num_elements(lab));
            goto out;
        }
        size_t n = 8 + dg_tensor_nbytes(img);
        if (n > cap) {
            unsigned char *p = realloc(rec, n);
            if (!p) {
                dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
                goto out;
            }
            rec = p;
            cap = n;
        }
        uint64_t l = (uint64_t)label_of(lab);
        for (int i = 0; i < 8; i++) rec[i] = (unsigned char)(l >> (8 * i));
        memcpy(rec + 8, dg_tensor_data(img), dg_tensor_nbytes(img));
        if (!shards_write(&sh, rec, n, st)) goto out;
    }
    if (!shards_close(&sh, st)) goto out;
    fprintf(stderr, "dg-tfrecord: %lld records in %d shards\n", (long long)sh.written, n_shards);
    rc = 0;
out:
    if (rc) fail("idx", st);
    dg_element_clear(&e);
    free(rec);
    shards_free(&sh);
    dg_iterator_free(&it);
    dg_dataset_free(&ds);
    dg_status_free(&st);
    return rc;
}

static int cmd_text(const char *const *files, int n_files, const char *prefix, int n_shards) {
    dg_status *st = dg_status_new();
    dg_dataset *ds = dg_dataset_text_lines(files, n_files, NULL, st);
    dg_iterator *it = ds ? dg_iterator_new(ds, st) : NULL;
    shards sh = {0};
    dg_element e = {0};
    int rc = 1;
    if (!it || !shards_open(&sh, prefix, n_shards, st)) goto out;
    for (;;) {
        bool end;
        if (!dg_iterator_next(it, &e, &end, st)) goto out;
        if (end) break;
        if (!shards_write(&sh, dg_tensor_data(e.components[0]), dg_tensor_nbytes(e.components[0]), st)) goto out;
    }
    if (!shards_close(&sh, st)) goto out;
    fprintf(stderr, "dg-tfrecord: %lld records in %d shards\n", (long long)sh.written, n_shards);
    rc = 0;
out:
    if (rc) fail("text", st);
    dg_element_clear(&e);
    shards_free(&sh);
    dg_iterator_free(&it);
    dg_dataset_free(&ds);
    dg_status_free(&st);
    return rc;
}

static int cmd_count(const char *const *files, int n_files) {
    dg_status *st = dg_status_new();
    int rc = 0;
    for (int f = 0; f < n_files && rc == 0; f++) {
        dg_dataset *ds = dg_dataset_tfrecord(&files[f], 1, NULL, st);
        dg_iterator *it = ds ? dg_iterator_new(ds, st) : NULL;
        dg_element e = {0};
        int64_t n = 0, bytes = 0;
        bool end = false;
        while (it && dg_iterator_next(it, &e, &end, st) && !end) {
            n++;
            bytes += (int64_t)dg_tensor_nbytes(e.components[0]);
        }
        if (!dg_status_ok(st)) rc = fail("count", st);
        else printf("%s: %lld records, %lld bytes\n", files[f], (long long)n, (long long)bytes);
        dg_element_clear(&e);
        dg_iterator_free(&it);
        dg_dataset_free(&ds);
    }
    dg_status_free(&st);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1], *images = NULL, *labels = NULL, *prefix = NULL;
    int n_shards = 1;
    const char **files = calloc((size_t)argc, sizeof *files);
    int n_files = 0;
    if (!files) return 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--images") && has_value) images = argv[++i];
        else if (!strcmp(a, "--labels") && has_value) labels = argv[++i];
        else if (!strcmp(a, "--out") && has_value) prefix = argv[++i];
        else if (!strcmp(a, "--shards") && has_value) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > MAX_SHARDS) {
                fprintf(stderr, "dg-tfrecord: --shards takes 1 to %d (a file open for each), got \"%s\"\n",
                        MAX_SHARDS, argv[i]);
                free(files);
                return 2;
            }
            n_shards = (int)v;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "dg-tfrecord: unknown flag or missing value: %s\n%s", a, usage);
            free(files);
            return 2;
        } else {
            files[n_files++] = a;
        }
    }
    int rc = 2;
    if (!strcmp(cmd, "idx") && images && labels && prefix && n_files == 0) rc = cmd_idx(images, labels, prefix, n_shards);
    else if (!strcmp(cmd, "text") && prefix && n_files > 0) rc = cmd_text(files, n_files, prefix, n_shards);
    else if (!strcmp(cmd, "count") && n_files > 0) rc = cmd_count(files, n_files);
    else fprintf(stderr, "dg-tfrecord: bad command line for \"%s\"\n%s", cmd, usage);
    free(files);
    return rc;
}
