/* The model of mnist_replica and cnn_replica for replica.c: the MLP (or the CNN) of
 * mlp_model.h on Fashion-MNIST, Adam at the model's learning rate (the CNN's schedule), and at
 * the end the validation cross entropy and accuracy on the 10,000 test images. The training
 * batches come from the arrays in memory, or with --tfrecord from dg-tfrecord's shards through a
 * dataset (docs/DATASETS.md, "The examples"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_model.h"
#include "mnist_data.h"
#include "replica.h"
#include "replica_input.h"

typedef struct mnist_state {
    bool cnn;
    const char *data_dir;
    int64_t hidden, batch;
    mnist_dataset data;
    mlp_model m;
    float *xb;
    int64_t *yb;
    dg_tensor *xt, *yt, *on;   // the batch, and the CNN's dropout switch (true)
    const char *tfrecord;      // --tfrecord: the training records' shards ("" : the arrays)
    int64_t shuffle_buffer, seed;
    replica_input in;
} mnist_state;

#define IMAGE_BYTES 784

// A record of dg-tfrecord idx (docs/DATASETS.md): the label as an int64, little-endian, then the
// 784 uint8 pixels -> the image as float32 [784] scaled to [0, 1] as mnist_data.c scales it, and
// the label as the int64 scalar the model's y_ placeholder takes.
static bool parse_record(void *ctx, const dg_element *in, dg_element *out, dg_status *st) {
    (void)ctx;
    const dg_tensor *rec = in->components[0];
    if (dg_tensor_nbytes(rec) != 8 + IMAGE_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "a record of %zu bytes, not the %d of a label and a 28x28 image",
                       dg_tensor_nbytes(rec), 8 + IMAGE_BYTES);
        return false;
    }
    const unsigned char *b = dg_tensor_data(rec);
    uint64_t label = 0;
    for (int i = 7; i >= 0; i--) label = label << 8 | b[i];
    if (label > 9) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "label %llu is not a class 0..9", (unsigned long long)label);
        return false;
    }
    dg_tensor *img = dg_tensor_new(DG_FLOAT32, dg_shape1(IMAGE_BYTES), st);
    if (!img) return false;
    float *f = dg_tensor_f32(img);
    for (int i = 0; i < IMAGE_BYTES; i++) f[i] = b[8 + i] * (1.0f / 255.0f);
    out->components[0] = img;
    out->components[1] = dg_tensor_scalar_i64((int64_t)label);
    out->n = 2;
    return true;
}

static bool check_flags(void *state, int64_t batch_size) {
    mnist_state *s = state;
    if (s->hidden < 1 || batch_size > 60000 || s->shuffle_buffer < 1) {
        fprintf(stderr, "%s: bad --hidden_units, --shuffle_buffer or --batch_size (at most 60000)\n", s->cnn ? "cnn_replica" : "mnist_replica");
        return false;
    }
    s->batch = batch_size;
    return true;
}

static bool load(void *state, int64_t seed, dg_status *st) {
    mnist_state *s = state;
    s->seed = seed;   // --seed + the task: the shuffle's seed with --tfrecord
    return mnist_load(s->data_dir, (uint64_t)seed, &s->data, st);
}

// With --tfrecord: TFRecord shards -> interleave (4 files at a time, 16 records from each) ->
// this worker's shard of the records -> shuffle (raw records: the buffer goes into every
// checkpoint, 792 bytes an example rather than 3,136 parsed) -> repeat -> parse on 2 threads ->
// batch -> prefetch.
static bool after_session(void *state, dg_monitored_session *ms, int64_t task, int n_workers,
                          const char *checkpoint_path, dg_status *st) {
    mnist_state *s = state;
    if (!*s->tfrecord) return true;
    char **files;
    int n_files;
    if (!replica_input_files(s->tfrecord, ".tfrecord", &files, &n_files, st)) return false;
    dg_dataset *ds = dg_dataset_tfrecord((const char *const *)files, n_files, NULL, st);
    replica_input_files_free(files, n_files);
    ds = dg_dataset_interleave(ds, 4, 16, st);
    ds = dg_dataset_shard(ds, n_workers, task, st);
    ds = dg_dataset_shuffle(ds, s->shuffle_buffer, (uint64_t)s->seed, st);
    ds = dg_dataset_repeat(ds, -1, st);
    ds = dg_dataset_map(ds, parse_record, NULL, 2, st);
    ds = dg_dataset_batch(ds, s->batch, true, st);
    ds = dg_dataset_prefetch(ds, DG_PREFETCH_AUTO, st);
    s->in.task = task;
    if (!replica_input_start(&s->in, ds, ms, checkpoint_path, st)) {
        dg_status_prepend(st, "--tfrecord %s", s->tfrecord);
        return false;
    }
    return true;
}

static bool build(void *state, dg_graph *g, double lr, int64_t seed, int64_t train_steps, replica_net *net,
                  dg_status *st) {
    (void)train_steps;
    mnist_state *s = state;
    if (s->cnn)
        cnn_build_net(g, lr, seed, &s->m);
    else
        mlp_build_net(g, s->data.train.dim, s->hidden, seed, &s->m);
    net->loss = s->m.loss;
    net->global_step = s->m.global_step;
    net->opt = model_adam(g, &s->m, lr);
    return dg_graph_check(g, st);
}

static int next_batch(void *state, dg_output *feeds, dg_tensor **vals, int cap, dg_status *st) {
    mnist_state *s = state;
    if (cap < 3) {
        dg_status_set(st, DG_INTERNAL, "mnist_replica: room for 3 feeds needed");
        return -1;
    }
    if (*s->tfrecord) {
        // The CNN's dropout is on while training.
        if (s->m.training.node && !s->on && !(s->on = model_training_value(true, st))) return -1;
        if (!replica_input_next(&s->in, st)) return -1;
        feeds[0] = s->m.x;
        feeds[1] = s->m.y_;
        feeds[2] = s->m.training;
        vals[2] = s->on;
        if (!dg_element_feed(&s->in.batch, feeds, 2, vals, st)) return -1;
        return s->on ? 3 : 2;
    }
    if (!s->xt) {
        int64_t dim = s->data.train.dim;
        s->xb = malloc((size_t)(s->batch * dim) * sizeof *s->xb);
        s->yb = malloc((size_t)s->batch * sizeof *s->yb);
        s->xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(s->batch, dim), s->xb, (size_t)(s->batch * dim) * sizeof *s->xb,
                               NULL, NULL, st);
        s->yt = dg_tensor_wrap(DG_INT64, dg_shape1(s->batch), s->yb, (size_t)s->batch * sizeof *s->yb, NULL, NULL, st);
        if (!s->xt || !s->yt) return -1;
        // The CNN's dropout is on while training.
        if (s->m.training.node && !(s->on = model_training_value(true, st))) return -1;
    }
    mnist_next_batch(&s->data.train, s->batch, s->xb, s->yb);
    feeds[0] = s->m.x;
    feeds[1] = s->m.y_;
    feeds[2] = s->m.training;
    vals[0] = s->xt;
    vals[1] = s->yt;
    vals[2] = s->on;
    return s->on ? 3 : 2;
}

static bool evaluate(void *state, dg_session *sess, int64_t task, int64_t global_step, dg_status *st) {
    mnist_state *s = state;
    double loss, acc;
    if (!mlp_evaluate(sess, &s->m, s->data.test.images, s->data.test.labels, s->data.test.n, s->data.test.dim, 1000,
                      &loss, &acc, st))
        return false;
    printf("After %lld training step(s), validation cross entropy = %g\n", (long long)global_step, loss);
    printf("Worker %lld: validation accuracy = %.4f (on the %lld test images)\n", (long long)task, acc,
           (long long)s->data.test.n);
    replica_input_report(&s->in);
    return true;
}

static void free_state(void *state) {
    mnist_state *s = state;
    dg_tensor_unref(s->on);
    dg_tensor_unref(s->xt);
    dg_tensor_unref(s->yt);
    free(s->xb);
    free(s->yb);
    mnist_free(&s->data);
    replica_input_free(&s->in);
}

int mnist_replica_main(int argc, char **argv, const char *name, bool cnn, int64_t train_steps, double learning_rate) {
    mnist_state s;
    memset(&s, 0, sizeof s);
    s.cnn = cnn;
    s.data_dir = MNIST_DEFAULT_DIR;
    s.hidden = 100;
    s.tfrecord = "";
    s.shuffle_buffer = 10000;
    const flag_def flags[] = {
        {"hidden_units", FLAG_INT, &s.hidden, "hidden layer width of the MLP (default 100)"},
        {"data_dir", FLAG_STRING, &s.data_dir, "IDX files (default " MNIST_DEFAULT_DIR "); the test images always come from here"},
        {"tfrecord", FLAG_STRING, &s.tfrecord,
         "train on the records of these TFRecord shards (written by dg-tfrecord idx; a directory of *.tfrecord "
         "files or a glob pattern) read through a dataset, each worker its shard, instead of --data_dir's arrays; "
         "the chief's checkpoints keep its input position (docs/DATASETS.md)"},
        {"shuffle_buffer", FLAG_INT, &s.shuffle_buffer, "with --tfrecord: the shuffle buffer in records (default 10000)"},
        {"print_batch_hash", FLAG_BOOL, &s.in.print_hash,
         "with --tfrecord: print a hash of each training batch (to compare the batches of two runs)"},
    };
    char usage[96], lr_help[128];
    snprintf(usage, sizeof usage, "usage: %s [flags]", name);
    snprintf(lr_help, sizeof lr_help, "Adam learning rate (default %g%s)", learning_rate,
             cnn ? ", decaying by 0.95 every 500 steps" : "");
    replica_model m = {
        .name = name, .usage = usage, .what = "MNIST-replica", .train_steps = train_steps, .batch_size = 100,
        .learning_rate = learning_rate, .lr_help = lr_help, .flags = flags, .n_flags = (int)(sizeof flags / sizeof flags[0]), .state = &s,
        .check_flags = check_flags, .load = load, .build = build, .next_batch = next_batch, .evaluate = evaluate,
        .after_session = after_session, .free = free_state,
    };
    return replica_main(argc, argv, &m);
}
