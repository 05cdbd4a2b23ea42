/* model_parallel: one model split across two tasks, trained on the same batches as the same
 * model in one process; prints both loss curves and whether they agree.
 *   --mode layers: the hidden layer on the worker, the output layer on the second task
 *   --mode units:  the hidden layer's units in two halves, one per task
 * The worker task trains; the second task only holds and runs its part of the model, so it
 * runs as a "ps" task (dg-launch stops it when the worker is done). Each part's backward pass
 * runs on its own task (the optimizer's colocate_gradients_with_ops); --colocate_gradients=false
 * computes every gradient on the worker, as TensorFlow does by default. The mean step time of
 * the split model is printed at the end (the median over steps after the tenth).
 *   build/bin/dg-launch --ps 1 --workers 1 -- build/bin/model_parallel --mode layers */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "mnist_data.h"

typedef struct net {
    dg_output x, y_, loss;
    dg_node *train, *init;
} net;

static void dev(dg_graph *g, bool split, int task) {
    dg_graph_push_device(g, !split ? "" : task == 0 ? "/job:worker/task:0" : "/job:ps/task:0");
}

static dg_output var(dg_graph *g, const char *name, int64_t a, int64_t b, int64_t seed) {
    dg_shape s = b ? dg_shape2(a, b) : dg_shape1(a);
    dg_initializer init = b ? dg_init_truncated_normal(0, 1.0 / sqrt((double)a), seed) : dg_init_zeros();
    return dg_variable(g, name, DG_FLOAT32, s, init);
}

static void build(dg_graph *g, const char *mode, bool split, bool colocate, int64_t pixels, int64_t hidden,
                  net *n) {
    n->x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, pixels));
    n->y_ = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
    dg_output logits;
    if (strcmp(mode, "layers") == 0) {
        dev(g, split, 0);
        dg_output w1 = var(g, "hid_w", pixels, hidden, 1), b1 = var(g, "hid_b", hidden, 0, 0);
        dg_output h = dg_relu(g, "hid", dg_bias_add(g, NULL, dg_matmul(g, NULL, n->x, w1, false, false), b1));
        dg_graph_pop_device(g);
        dev(g, split, 1);
        dg_output w2 = var(g, "sm_w", hidden, 10, 2), b2 = var(g, "sm_b", 10, 0, 0);
        logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, h, w2, false, false), b2);
        dg_graph_pop_device(g);
    } else {
        int64_t half = hidden / 2;
        dg_output parts[2];
        for (int t = 0; t < 2; t++) {
            char nw[32], nb[32], nw2[32];
            snprintf(nw, sizeof nw, "hid_w_%d", t);
            snprintf(nb, sizeof nb, "hid_b_%d", t);
            snprintf(nw2, sizeof nw2, "sm_w_%d", t);
            dev(g, split, t);
            dg_output w1 = var(g, nw, pixels, half, 1 + t), b1 = var(g, nb, half, 0, 0);
            dg_output h = dg_relu(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, n->x, w1, false, false), b1));
            dg_output w2 = var(g, nw2, half, 10, 3 + t);
            parts[t] = dg_matmul(g, NULL, h, w2, false, false);
            dg_graph_pop_device(g);
        }
        dev(g, split, 0);
        dg_output b2 = var(g, "sm_b", 10, 0, 0);
        logits = dg_bias_add(g, "logits", dg_add(g, NULL, parts[0], parts[1]), b2);
        dg_graph_pop_device(g);
    }
    dev(g, split, 0);
    n->loss = dg_sparse_softmax_cross_entropy(g, "loss", logits, n->y_);
    dg_optimizer opt = dg_adam(g, 0.01);
    opt.colocate_gradients_with_ops = colocate;
    n->train = dg_optimizer_minimize(&opt, n->loss, dg_global_step(g));
    dg_graph_pop_device(g);
    n->init = dg_global_variables_initializer(g);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *job = "worker", *worker_hosts = "", *ps_hosts = "", *mode = "layers", *data_dir = MNIST_DEFAULT_DIR;
    int64_t task_index = 0, steps = 300, log_every = 30, hidden = 100;
    bool quiet = false, colocate = true;
    flag_def defs[] = {
        {"mode", FLAG_STRING, &mode, "layers or units (default layers)"},
        {"job_name", FLAG_STRING, &job, "worker (trains) or ps (holds the second part)"},
        {"task_index", FLAG_INT, &task_index, "0"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "one host:port"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "one host:port"},
        {"train_steps", FLAG_INT, &steps, "steps (default 300)"},
        {"log_every", FLAG_INT, &log_every, "loss line every N steps (default 30)"},
        {"hidden_units", FLAG_INT, &hidden, "hidden width, even (default 100)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files"},
        {"colocate_gradients", FLAG_BOOL, &colocate, "each gradient on its op's task (default true)"},
        {"quiet", FLAG_BOOL, &quiet, "no server log lines"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: model_parallel [flags]", &help)) return 2;
    if (help) return 0;
    if ((strcmp(mode, "layers") && strcmp(mode, "units")) || steps < 1 || log_every < 1 || hidden < 2 || hidden % 2) {
        fprintf(stderr, "model_parallel: --mode must be layers or units; steps, log_every >= 1; even hidden_units\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_flags(ps_hosts, worker_hosts, st);
    if (!c || dg_cluster_num_tasks(c, "worker") != 1 || dg_cluster_num_tasks(c, "ps") != 1 ||
        (strcmp(job, "worker") && strcmp(job, "ps")) || task_index != 0) {
        fprintf(stderr, "model_parallel: needs one worker and one ps task (--worker_hosts, --ps_hosts, "
                        "--job_name worker|ps, --task_index 0)%s%s\n", c ? "" : ": ", c ? "" : dg_status_message(st));
        return 2;
    }
    dg_server_options so = dg_server_options_default();
    so.quiet = quiet;
    dg_server *server = dg_server_new(c, job, 0, &so, st);
    if (!server) {
        fprintf(stderr, "model_parallel: %s\n", dg_status_message(st));
        return 1;
    }
    int rc = 1;
    if (strcmp(job, "ps") == 0) {   // the second task only holds and runs its part
        dg_server_join(server, true, st);
        rc = 0;
        goto done;
    }
    mnist_dataset data;
    if (!mnist_load(data_dir, 7, &data, st)) {
        fprintf(stderr, "model_parallel: %s\n", dg_status_message(st));
        goto done;
    }
    dg_graph *g[2] = {dg_graph_new(), dg_graph_new()};
    net n[2];
    build(g[0], mode, true, colocate, data.train.dim, hidden, &n[0]);
    build(g[1], mode, false, colocate, data.train.dim, hidden, &n[1]);
    dg_session *s[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (!dg_graph_check(g[k], st)) break;
        s[k] = dg_session_new(g[k], k == 0 ? dg_server_target(server) : "local", NULL, st);
        if (!s[k] || !dg_session_run_target(s[k], n[k].init, st)) break;
    }
    float *xb = malloc((size_t)(100 * data.train.dim) * sizeof *xb);
    int64_t *yb = malloc(100 * sizeof *yb);
    dg_tensor *xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(100, data.train.dim), xb,
                                   (size_t)(100 * data.train.dim) * sizeof *xb, NULL, NULL, st);
    dg_tensor *yt = dg_tensor_wrap(DG_INT64, dg_shape1(100), yb, 100 * sizeof *yb, NULL, NULL, st);
    double max_rel = 0, *step_ms = calloc((size_t)steps, sizeof *step_ms);
    int64_t n_timed = 0;
    bool ok = s[0] && s[1];
    printf("mode %s: step, loss split over two tasks, loss in one process\n", mode);
    for (int64_t step = 1; step <= steps && ok; step++) {
        mnist_next_batch(&data.train, 100, xb, yb);
        double l[2];
        for (int k = 0; k < 2 && ok; k++) {
            dg_output feeds[2] = {n[k].x, n[k].y_};
            dg_tensor *vals[2] = {xt, yt}, *loss = NULL;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            ok = dg_session_run(s[k], feeds, vals, 2, &n[k].loss, &loss, 1, &n[k].train, 1, st);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (k == 0 && step > 10)
                step_ms[n_timed++] = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
            if (ok) {
                l[k] = dg_tensor_f32(loss)[0];
                dg_tensor_unref(loss);
            }
        }
        if (!ok) break;
        double rel = fabs(l[0] - l[1]) / fmax(1e-12, fabs(l[1]));
        if (!(rel <= max_rel)) max_rel = rel;   // a NaN sticks and fails the match
        if (step % log_every == 0 || step == 1) printf("step %4lld  %.6f  %.6f\n", (long long)step, l[0], l[1]);
    }
    if (ok) {
        printf("largest relative loss difference: %.3g\n", max_rel);
        if (n_timed > 0) {
            qsort(step_ms, (size_t)n_timed, sizeof *step_ms, cmp_double);
            printf("split step: median %.3f ms over %lld steps (gradients %s)\n", step_ms[n_timed / 2],
                   (long long)n_timed, colocate ? "beside their ops" : "on the worker");
        }
        bool match = max_rel <= 1e-5;   // false for a NaN
        printf("curves match: %s\n", match ? "yes" : "no");
        rc = match ? 0 : 3;
    } else {
        fprintf(stderr, "model_parallel: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    free(xb);
    free(yb);
    free(step_ms);
    for (int k = 0; k < 2; k++) {
        dg_session_free(&s[k]);
        dg_graph_free(&g[k]);
    }
    mnist_free(&data);
done:
    dg_server_free(&server);
    dg_cluster_free(&c);
    dg_status_free(&st);
    return rc;
}
