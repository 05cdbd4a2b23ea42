/* MNIST / Fashion-MNIST from IDX files (gzip or plain), as the examples and benchmarks use
 * them: images scaled to [0, 1] floats, labels as int64 class ids. */
#ifndef DG_MNIST_DATA_H
#define DG_MNIST_DATA_H

#include <stdint.h>

#include "distgraph/distgraph.h"

#define MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

typedef struct mnist_split {
    int64_t n;          // examples
    int64_t dim;        // pixels per image (rows * cols)
    float *images;      // n * dim, owned
    int64_t *labels;    // n, owned
    // next_batch state: an epoch-wise shuffled order
    int64_t *order;
    int64_t pos;
    uint64_t rng;
} mnist_split;

typedef struct mnist_dataset {
    mnist_split train, test;
} mnist_dataset;

// Loads the four files of dir (train-images-idx3-ubyte[.gz], ...). A missing or corrupt file
// is NOT_FOUND or DATA_LOSS naming the file and what is wrong. seed shuffles the batches.
bool mnist_load(const char *dir, uint64_t seed, mnist_dataset *out, dg_status *st);
void mnist_free(mnist_dataset *d);
// Copies the next batch (reshuffling at each epoch's end) into x (batch*dim) and y (batch).
void mnist_next_batch(mnist_split *s, int64_t batch, float *x, int64_t *y);

#endif
