/* Inference from a saved graph and a checkpoint: what a program that did not train does.
 * It loads the graph MNIST-replica or cnn_replica wrote (--save_graph), restores a checkpoint of its
 * variables (--checkpoint_path of the same run), and evaluates the test images, printing the
 * accuracy the training run printed for the same checkpoint.
 *   build/bin/dg-launch --ps 1 --workers 2 -- build/bin/mnist_replica --checkpoint_path ckpt.db \
 *       --save_graph mnist.dgraph
 *   build/bin/inference --graph mnist.dgraph --checkpoint ckpt.db
 * The graph names the devices it was placed on (/job:ps/..., /job:worker/...); the program
 * forgets them (dg_graph_clear_devices, TensorFlow's clear_devices) and runs on this process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

#include "flags.h"
#include "mnist_data.h"

static int fail(const char *what, const dg_status *st) {
    fprintf(stderr, "inference: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

int main(int argc, char **argv) {
    const char *graph_path = "", *ckpt_path = "", *data_dir = MNIST_DEFAULT_DIR;
    const char *x_name = "x:0", *y_name = "y_:0", *acc_name = "accuracy:0", *loss_name = "cross_entropy/value:0";
    const char *training_name = "training:0";
    int64_t step = -1, batch = 1000;
    flag_def defs[] = {
        {"graph", FLAG_STRING, &graph_path, "the saved graph (mnist_replica --save_graph)"},
        {"checkpoint", FLAG_STRING, &ckpt_path, "the checkpoint file (mnist_replica --checkpoint_path)"},
        {"step", FLAG_INT, &step, "the checkpoint's global step (-1: the newest)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files"},
        {"batch", FLAG_INT, &batch, "images per run"},
        {"input", FLAG_STRING, &x_name, "the images placeholder"},
        {"labels", FLAG_STRING, &y_name, "the labels placeholder"},
        {"accuracy", FLAG_STRING, &acc_name, "the accuracy tensor"},
        {"loss", FLAG_STRING, &loss_name, "the loss tensor"},
        {"training", FLAG_STRING, &training_name,
         "a bool placeholder fed false when the graph has it (cnn_replica's dropout switch)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: inference --graph FILE --checkpoint FILE",
                     &help))
        return 2;
    if (help) return 0;
    if (!*graph_path || !*ckpt_path || batch < 1) {
        fprintf(stderr, "inference: needs --graph and --checkpoint (and --batch >= 1); see --help\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    int rc = 1;
    dg_graph *g = NULL;
    dg_saver *sv = NULL;
    dg_session *s = NULL;
    dg_checkpoint_store *store = NULL;
    dg_tensor *not_training = NULL;   // the training switch's value, when the graph has one
    mnist_dataset data;
    memset(&data, 0, sizeof data);
    if (!(g = dg_graph_load(graph_path, st))) {
        rc = fail("loading the graph", st);
        goto out;
    }
    dg_graph_clear_devices(g);   // trained on a cluster, evaluated here
    dg_output x = dg_graph_output(g, x_name, st), y = {NULL, 0}, acc = {NULL, 0}, loss = {NULL, 0};
    if (x.node) y = dg_graph_output(g, y_name, st);
    if (y.node) acc = dg_graph_output(g, acc_name, st);
    if (acc.node) loss = dg_graph_output(g, loss_name, st);
    if (!loss.node) {
        rc = fail("finding the model's tensors", st);
        goto out;
    }
    // A model with dropout (cnn_replica) has a training switch: off here.
    dg_output training = {NULL, 0};
    if (*training_name) {
        dg_status *tst = dg_status_new();
        training = dg_graph_output(g, training_name, tst);
        dg_status_free(&tst);
        if (training.node && !(not_training = dg_tensor_new(DG_BOOL, dg_shape_scalar(), st))) {
            rc = fail("the training switch", st);
            goto out;
        }
        if (not_training) *(uint8_t *)dg_tensor_data(not_training) = 0;
    }
    // Restore ops for every variable of the graph, the training's slots included, since a
    // checkpoint holds exactly the variables of the graph that wrote it.
    if (!(sv = dg_saver_new(g, st)) || !(store = dg_checkpoint_store_new(ckpt_path, false, st))) {
        rc = fail("the checkpoint", st);
        goto out;
    }
    dg_session_options so = dg_session_options_default();
    so.allow_soft_placement = true;
    if (!(s = dg_session_new(g, "local", &so, st))) {
        rc = fail("the session", st);
        goto out;
    }
    int64_t restored = -1;
    if (!dg_saver_restore(sv, s, store, step, &restored, st)) {
        rc = fail("restoring", st);
        goto out;
    }
    if (!mnist_load(data_dir, 0, &data, st)) {
        rc = fail("loading the test images", st);
        goto out;
    }
    double sum_acc = 0, sum_loss = 0;
    int64_t seen = 0;
    for (int64_t off = 0; off < data.test.n; off += batch) {
        int64_t n = data.test.n - off < batch ? data.test.n - off : batch;
        dg_tensor *xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(n, data.test.dim), data.test.images + off * data.test.dim,
                                       (size_t)(n * data.test.dim) * sizeof(float), NULL, NULL, st);
        dg_tensor *yt = dg_tensor_wrap(DG_INT64, dg_shape1(n), data.test.labels + off, (size_t)n * sizeof(int64_t), NULL,
                                       NULL, st);
        dg_output feeds[3] = {x, y, training}, fetches[2] = {acc, loss};
        dg_tensor *vals[3] = {xt, yt, not_training}, *got[2] = {NULL, NULL};
        bool ok = xt && yt && dg_session_run(s, feeds, vals, not_training ? 3 : 2, fetches, got, 2, NULL, 0, st);
        if (ok) {
            sum_acc += dg_tensor_get_as_double(got[0], 0) * (double)n;
            sum_loss += dg_tensor_get_as_double(got[1], 0) * (double)n;
            seen += n;
        }
        dg_tensor_unref(got[0]);
        dg_tensor_unref(got[1]);
        dg_tensor_unref(xt);
        dg_tensor_unref(yt);
        if (!ok) {
            rc = fail("evaluating", st);
            goto out;
        }
    }
    printf("restored global step %lld from %s into %s\n", (long long)restored, ckpt_path, graph_path);
    printf("test accuracy = %.4f, cross entropy = %.6f (on the %lld test images)\n", sum_acc / (double)seen,
           sum_loss / (double)seen, (long long)seen);
    rc = 0;
out:
    dg_tensor_unref(not_training);
    mnist_free(&data);
    dg_session_free(&s);
    dg_saver_free(&sv);
    dg_checkpoint_store_free(&store);
    dg_graph_free(&g);
    dg_status_free(&st);
    return rc;
}
