/* mlp_local: trains the MNIST-replica model (784 -> 100 ReLU -> 10, Adam) on Fashion-MNIST
 * in one process, then reports test accuracy and cross entropy on the 10,000 test images.
 *   build/bin/mlp_local --train_steps 2000 --batch_size 100 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flags.h"
#include "mlp_model.h"
#include "mnist_data.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int64_t train_steps = 2000, batch_size = 100, hidden = 100, seed = 1, log_every = 200, threads = 1;
    double lr = 0.01;
    const char *data_dir = MNIST_DEFAULT_DIR, *device = "";
    flag_def defs[] = {
        {"train_steps", FLAG_INT, &train_steps, "training steps (default 2000)"},
        {"batch_size", FLAG_INT, &batch_size, "examples per step (default 100)"},
        {"hidden_units", FLAG_INT, &hidden, "hidden layer width (default 100)"},
        {"learning_rate", FLAG_DOUBLE, &lr, "Adam learning rate (default 0.01)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files (default " MNIST_DEFAULT_DIR ")"},
        {"seed", FLAG_INT, &seed, "initialisation and shuffling seed (default 1)"},
        {"log_every", FLAG_INT, &log_every, "progress line every N steps (default 200)"},
        {"threads", FLAG_INT, &threads, "inter-op threads (default 1)"},
        {"device", FLAG_STRING, &device, "device for the model, e.g. /gpu:0 (soft placement)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: mlp_local [flags]", &help))
        return 2;
    if (help) return 0;
    if (train_steps < 0 || batch_size < 1 || batch_size > 60000 || hidden < 1 || hidden > 100000 ||
        log_every < 1) {
        fprintf(stderr, "mlp_local: --train_steps must be >= 0, --batch_size in 1..60000, "
                        "--hidden_units in 1..100000, --log_every >= 1\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    mnist_dataset data;
    int rc = 1;
    dg_graph *g = NULL;
    dg_session *s = NULL;
    float *xb = NULL;
    int64_t *yb = NULL;
    if (!mnist_load(data_dir, (uint64_t)seed, &data, st)) {
        fprintf(stderr, "mlp_local: loading data: %s: %s\n", dg_code_name(dg_status_code(st)),
                dg_status_message(st));
        dg_status_free(&st);
        return 1;
    }
    printf("data: %lld training and %lld test images from %s\n", (long long)data.train.n,
           (long long)data.test.n, data_dir);
    g = dg_graph_new();
    if (*device) dg_graph_push_device(g, device);
    mlp_model m;
    if (!mlp_build(g, data.train.dim, hidden, lr, seed, &m, st)) goto out;
    if (*device) dg_graph_pop_device(g);
    dg_session_options opts = dg_session_options_default();
    opts.inter_op_threads = (int)threads;
    s = dg_session_new(g, "local", &opts, st);
    if (!s || !dg_session_run_target(s, m.init, st)) goto out;
    xb = malloc((size_t)(batch_size * data.train.dim) * sizeof *xb);
    yb = malloc((size_t)batch_size * sizeof *yb);
    dg_tensor *xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(batch_size, data.train.dim), xb,
                                   (size_t)(batch_size * data.train.dim) * sizeof *xb, NULL, NULL, st);
    dg_tensor *yt = dg_tensor_wrap(DG_INT64, dg_shape1(batch_size), yb, (size_t)batch_size * sizeof *yb,
                                   NULL, NULL, st);
    if (!xt || !yt) goto out;
    dg_output feeds[2] = {m.x, m.y_};
    dg_tensor *vals[2] = {xt, yt};
    double t0 = now_s(), train_s = 0;
    for (int64_t step = 1; step <= train_steps; step++) {
        mnist_next_batch(&data.train, batch_size, xb, yb);
        double a = now_s();
        bool want_loss = step % log_every == 0 || step == train_steps;
        dg_tensor *loss = NULL;
        bool ok = dg_session_run(s, feeds, vals, 2, &m.loss, &loss, want_loss ? 1 : 0, &m.train, 1, st);
        train_s += now_s() - a;
        if (!ok) {
            dg_tensor_unref(xt);
            dg_tensor_unref(yt);
            goto out;
        }
        if (want_loss) {
            printf("step %lld/%lld: loss %.4f (%.0f steps/s)\n", (long long)step, (long long)train_steps,
                   dg_tensor_f32(loss)[0], (double)step / train_s);
            fflush(stdout);
            dg_tensor_unref(loss);
        }
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    double test_loss, test_acc;
    if (!mlp_evaluate(s, &m, data.test.images, data.test.labels, data.test.n, data.test.dim, 1000,
                      &test_loss, &test_acc, st))
        goto out;
    printf("trained %lld steps in %.2f s (%.0f steps/s, %.2f s total)\n", (long long)train_steps,
           train_s, train_steps ? (double)train_steps / train_s : 0.0, now_s() - t0);
    printf("test accuracy %.4f, test cross entropy %.4f (%lld images)\n", test_acc, test_loss,
           (long long)data.test.n);
    rc = 0;
out:
    if (rc) fprintf(stderr, "mlp_local: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
    free(xb);
    free(yb);
    dg_session_free(&s);
    dg_graph_free(&g);
    mnist_free(&data);
    dg_status_free(&st);
    return rc;
}
