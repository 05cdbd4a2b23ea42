/* IDX reader for MNIST-format data sets. Every header field is checked before use. */
#include "mnist_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

// Reads a whole (possibly gzipped) file. Returns: new buffer, caller frees.
static unsigned char *read_file(const char *path, size_t *len, dg_status *st) {
    gzFile f = gzopen(path, "rb");
    if (!f) {
        dg_status_setf(st, DG_NOT_FOUND, "%s: cannot open (%s)", path, strerror(errno ? errno : ENOENT));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n == cap) {
            if (cap > ((size_t)1 << 31)) {
                free(buf);
                buf = NULL;
                dg_status_setf(st, DG_DATA_LOSS, "%s: larger than 2 GiB, not an MNIST file", path);
                gzclose(f);
                return NULL;
            }
            cap *= 2;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        int r = gzread(f, buf + n, (unsigned)(cap - n));
        if (r < 0) {
            int errnum;
            dg_status_setf(st, DG_DATA_LOSS, "%s: corrupt gzip data (%s)", path, gzerror(f, &errnum));
            free(buf);
            gzclose(f);
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    gzclose(f);
    if (!buf) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        return NULL;
    }
    *len = n;
    return buf;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static unsigned char *open_idx(const char *dir, const char *base, size_t *len, char *path,
                               size_t path_cap, dg_status *st) {
    snprintf(path, path_cap, "%s/%s.gz", dir, base);
    FILE *probe = fopen(path, "rb");
    if (probe)
        fclose(probe);
    else
        snprintf(path, path_cap, "%s/%s", dir, base);
    return read_file(path, len, st);
}

static bool load_split(const char *dir, const char *prefix, mnist_split *s, dg_status *st) {
    char ipath[1024], lpath[1024], base[64];
    size_t ilen = 0, llen = 0;
    snprintf(base, sizeof base, "%s-images-idx3-ubyte", prefix);
    unsigned char *img = open_idx(dir, base, &ilen, ipath, sizeof ipath, st);
    if (!img) return false;
    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", prefix);
    unsigned char *lab = open_idx(dir, base, &llen, lpath, sizeof lpath, st);
    bool ok = false;
    if (!lab) goto done;
    if (ilen < 16 || be32(img) != 0x803) {
        dg_status_setf(st, DG_DATA_LOSS, "%s: not an IDX image file (bad magic or too short)", ipath);
        goto done;
    }
    if (llen < 8 || be32(lab) != 0x801) {
        dg_status_setf(st, DG_DATA_LOSS, "%s: not an IDX label file (bad magic or too short)", lpath);
        goto done;
    }
    uint64_t n = be32(img + 4), rows = be32(img + 8), cols = be32(img + 12);
    if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || n == 0 || n > 10000000 ||
        ilen != 16 + n * rows * cols) {
        dg_status_setf(st, DG_DATA_LOSS, "%s: header says %llu images of %llux%llu but the file has %zu bytes",
                       ipath, (unsigned long long)n, (unsigned long long)rows, (unsigned long long)cols, ilen);
        goto done;
    }
    if (be32(lab + 4) != n || llen != 8 + n) {
        dg_status_setf(st, DG_DATA_LOSS, "%s: %u labels in the header, %zu bytes of labels, %llu images in %s",
                       lpath, be32(lab + 4), llen - 8, (unsigned long long)n, ipath);
        goto done;
    }
    s->n = (int64_t)n;
    s->dim = (int64_t)(rows * cols);
    s->images = malloc(n * rows * cols * sizeof(float));
    s->labels = malloc(n * sizeof(int64_t));
    s->order = malloc(n * sizeof(int64_t));
    if (!s->images || !s->labels || !s->order) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s: out of memory", ipath);
        goto done;
    }
    for (uint64_t i = 0; i < n * rows * cols; i++) s->images[i] = img[16 + i] * (1.0f / 255.0f);
    for (uint64_t i = 0; i < n; i++) {
        if (lab[8 + i] > 9) {
            dg_status_setf(st, DG_DATA_LOSS, "%s: label %u of example %llu is not a class 0..9", lpath,
                           lab[8 + i], (unsigned long long)i);
            goto done;
        }
        s->labels[i] = lab[8 + i];
        s->order[i] = (int64_t)i;
    }
    s->pos = 0;
    ok = true;
done:
    free(img);
    free(lab);
    return ok;
}

static uint64_t next_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void shuffle(mnist_split *s) {
    for (int64_t i = s->n - 1; i > 0; i--) {
        int64_t j = (int64_t)(next_rand(&s->rng) % (uint64_t)(i + 1));
        int64_t t = s->order[i];
        s->order[i] = s->order[j];
        s->order[j] = t;
    }
}

bool mnist_load(const char *dir, uint64_t seed, mnist_dataset *out, dg_status *st) {
    memset(out, 0, sizeof *out);
    if (!dir) dir = MNIST_DEFAULT_DIR;
    if (!load_split(dir, "train", &out->train, st) || !load_split(dir, "t10k", &out->test, st)) {
        mnist_free(out);
        return false;
    }
    out->train.rng = seed;
    shuffle(&out->train);
    return true;
}

void mnist_free(mnist_dataset *d) {
    mnist_split *s[2] = {&d->train, &d->test};
    for (int i = 0; i < 2; i++) {
        free(s[i]->images);
        free(s[i]->labels);
        free(s[i]->order);
    }
    memset(d, 0, sizeof *d);
}

void mnist_next_batch(mnist_split *s, int64_t batch, float *x, int64_t *y) {
    for (int64_t b = 0; b < batch; b++) {
        if (s->pos >= s->n) {
            shuffle(s);
            s->pos = 0;
        }
        int64_t i = s->order[s->pos++];
        memcpy(x + b * s->dim, s->images + i * s->dim, (size_t)s->dim * sizeof(float));
        y[b] = s->labels[i];
    }
}
