/* The model of mnist_replica and cnn_replica for replica.c: the MLP (or the CNN) of
 * mlp_model.h on Fashion-MNIST, Adam at the model's learning rate (the CNN's schedule), and at
 * the end the validation cross entropy and accuracy on the 10,000 test images. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_model.h"
#include "mnist_data.h"
#include "replica.h"

typedef struct mnist_state {
    bool cnn;
    const char *data_dir;
    int64_t hidden, batch;
    mnist_dataset data;
    mlp_model m;
    float *xb;
    int64_t *yb;
    dg_tensor *xt, *yt, *on;   // the batch, and the CNN's dropout switch (true)
} mnist_state;

static bool check_flags(void *state, int64_t batch_size) {
    mnist_state *s = state;
    if (s->hidden < 1 || batch_size > 60000) {
        fprintf(stderr, "%s: bad --hidden_units or --batch_size (at most 60000)\n", s->cnn ? "cnn_replica" : "mnist_replica");
        return false;
    }
    s->batch = batch_size;
    return true;
}

static bool load(void *state, int64_t seed, dg_status *st) {
    mnist_state *s = state;
    return mnist_load(s->data_dir, (uint64_t)seed, &s->data, st);
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
}

int mnist_replica_main(int argc, char **argv, const char *name, bool cnn, int64_t train_steps, double learning_rate) {
    mnist_state s;
    memset(&s, 0, sizeof s);
    s.cnn = cnn;
    s.data_dir = MNIST_DEFAULT_DIR;
    s.hidden = 100;
    const flag_def flags[] = {
        {"hidden_units", FLAG_INT, &s.hidden, "hidden layer width of the MLP (default 100)"},
        {"data_dir", FLAG_STRING, &s.data_dir, "IDX files (default " MNIST_DEFAULT_DIR ")"},
    };
    char usage[96], lr_help[128];
    snprintf(usage, sizeof usage, "usage: %s [flags]", name);
    snprintf(lr_help, sizeof lr_help, "Adam learning rate (default %g%s)", learning_rate,
             cnn ? ", decaying by 0.95 every 500 steps" : "");
    replica_model m = {
        .name = name, .usage = usage, .what = "MNIST-replica", .train_steps = train_steps, .batch_size = 100,
        .learning_rate = learning_rate, .lr_help = lr_help, .flags = flags, .n_flags = 2, .state = &s,
        .check_flags = check_flags, .load = load, .build = build, .next_batch = next_batch, .evaluate = evaluate,
        .free = free_state,
    };
    return replica_main(argc, argv, &m);
}
