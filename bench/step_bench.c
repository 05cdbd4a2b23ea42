/* step_bench: training steps per second of the MNIST-replica model (batch 100, one thread)
 * on a fixed batch after warm-up; --model cnn times cnn_replica's CNN instead (dropout on, the
 * learning rate decaying), the network of bench/peers/torch_cnn.py and tf_cnn.py; --model wide
 * a 1024-wide MLP (784-1024-1024-10, ReLU, Adam 1e-3), the network of bench/peers/wide_mlp.py.
 * --mixed_precision bf16|fp16 runs the products in 16 bits: built so (--amp build,
 * dg_graph_set_mixed_precision) or by the session's rewrite (--amp rewrite). Prints JSON
 * lines:
 *   {"bench": "step_bench", "metric": ..., "value": ..., "unit": ...} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "mlp_model.h"
#include "mnist_data.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct op_time {
    const char *op;
    int64_t ns;
} op_time;

static int by_time(const void *a, const void *b) {
    int64_t x = ((const op_time *)a)->ns, y = ((const op_time *)b)->ns;
    return x > y ? -1 : x < y;
}

// One traced step: the file, and each op type's total time on stderr, largest first.
static bool trace_one_step(dg_session *s, const dg_output *feeds, dg_tensor *const *vals, int n_feeds,
                           dg_node *const *train, const char *path, dg_status *st) {
    dg_run_options ro = {.trace = true};
    dg_step_trace *t = NULL;
    if (!dg_session_run_with_options(s, &ro, feeds, vals, n_feeds, NULL, NULL, 0, train, 1, &t, st)) return false;
    bool ok = dg_step_trace_write_chrome(t, path, st);
    op_time ops[256];
    int n = 0;
    for (int i = 0; i < dg_step_trace_num_events(t); i++) {
        const dg_trace_event *e = dg_step_trace_event(t, i);
        if (e->kind != DG_TRACE_OP) continue;
        int k = 0;
        while (k < n && strcmp(ops[k].op, e->op) != 0) k++;
        if (k == n && n < 256) ops[n++] = (op_time){e->op, 0};
        if (k < n) ops[k].ns += e->end_ns - e->start_ns;
    }
    qsort(ops, (size_t)n, sizeof *ops, by_time);
    fprintf(stderr, "traced step: %.3f ms\n", (double)dg_step_trace_step_ns(t) / 1e6);
    for (int k = 0; k < n && k < 20; k++)
        fprintf(stderr, "  %-28s %8.3f ms\n", ops[k].op, (double)ops[k].ns / 1e6);
    dg_step_trace_free(&t);
    return ok;
}

int main(int argc, char **argv) {
    int64_t steps = 2000, warmup = 200, batch = 100, threads = 1;
    const char *data_dir = MNIST_DEFAULT_DIR, *model = "mlp", *device = "", *trace = "", *mixed = "off", *amp = "build";
    flag_def defs[] = {
        {"model", FLAG_STRING, &model, "mlp (default), cnn or wide (784-1024-1024-10)"},
        {"mixed_precision", FLAG_STRING, &mixed, "off (default), bf16 or fp16: the products in 16 bits"},
        {"amp", FLAG_STRING, &amp, "build (default: dg_graph_set_mixed_precision) or rewrite (the session's rewrite)"},
        {"device", FLAG_STRING, &device, "build the model under this device scope, e.g. /gpu:0 (soft placement)"},
        {"steps", FLAG_INT, &steps, "timed steps (default 2000)"},
        {"warmup", FLAG_INT, &warmup, "untimed steps first (default 200)"},
        {"batch_size", FLAG_INT, &batch, "batch (default 100)"},
        {"threads", FLAG_INT, &threads, "inter-op threads (default 1)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files"},
        {"trace", FLAG_STRING, &trace, "after the timed steps, one traced step written to this file (Chrome trace-event "
                                       "JSON) with each op's share of it on stderr"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: step_bench [flags]", &help))
        return 2;
    if (help) return 0;
    bool cnn = strcmp(model, "cnn") == 0, wide = strcmp(model, "wide") == 0;
    dg_dtype mp = strcmp(mixed, "bf16") == 0 ? DG_BFLOAT16 : strcmp(mixed, "fp16") == 0 ? DG_FLOAT16 : DG_INVALID_DTYPE;
    bool rewrite = strcmp(amp, "rewrite") == 0;
    if (steps < 1 || steps > 10000000 || warmup < 0 || batch < 1 || batch > 60000 ||
        (!cnn && !wide && strcmp(model, "mlp")) || (mp == DG_INVALID_DTYPE && strcmp(mixed, "off")) ||
        (!rewrite && strcmp(amp, "build"))) {
        fprintf(stderr, "step_bench: bad --steps, --warmup, --batch_size, --model, --mixed_precision or --amp\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    mnist_dataset data;
    if (!mnist_load(data_dir, 1, &data, st)) {
        fprintf(stderr, "step_bench: %s\n", dg_status_message(st));
        return 1;
    }
    dg_graph *g = dg_graph_new();
    mlp_model m;
    dg_session *s = NULL;
    double *times = malloc((size_t)steps * sizeof *times);
    int rc = 1;
    dg_tensor *xt = NULL, *yt = NULL, *on = NULL;
    if (*device) dg_graph_push_device(g, device);
    if (mp != DG_INVALID_DTYPE && !rewrite && !dg_graph_set_mixed_precision(g, mp, st)) goto out;
    if (wide) {
        memset(&m, 0, sizeof m);
        m.x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, data.train.dim));
        m.y_ = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
        dg_output h = dg_dense(g, "fc1", m.x, 1024, DG_ACT_RELU, dg_init_glorot_uniform(1));
        h = dg_dense(g, "fc2", h, 1024, DG_ACT_RELU, dg_init_glorot_uniform(2));
        m.logits = dg_dense(g, "logits", h, 10, DG_ACT_NONE, dg_init_glorot_uniform(3));
        m.loss = dg_sparse_softmax_cross_entropy(g, "cross_entropy", m.logits, m.y_);
        m.global_step = dg_global_step(g);
        dg_optimizer opt = dg_adam(g, 0.001);
        m.train = dg_optimizer_minimize(&opt, m.loss, m.global_step);
        m.init = dg_global_variables_initializer(g);
        if (!dg_graph_check(g, st)) goto out;
    } else if (cnn) {
        cnn_build_net(g, 0.001, 1, &m);
        dg_optimizer opt = model_adam(g, &m, 0.001);
        m.train = dg_optimizer_minimize(&opt, m.loss, m.global_step);
        m.init = dg_global_variables_initializer(g);
        if (!dg_graph_check(g, st) || !(on = model_training_value(true, st))) goto out;
    } else if (!mlp_build(g, data.train.dim, 100, 0.01, 1, &m, st)) {
        goto out;
    }
    if (*device) dg_graph_pop_device(g);
    dg_session_options o = dg_session_options_default();
    o.allow_soft_placement = true;
    o.inter_op_threads = (int)threads;
    o.intra_op_threads = 1;
    dg_mixed_precision_options mpo = dg_mixed_precision_options_default(mp);
    if (mp != DG_INVALID_DTYPE && rewrite) o.mixed_precision = &mpo;
    if (!(s = dg_session_new(g, "local", &o, st)) || !dg_session_run_target(s, m.init, st)) goto out;
    xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(batch, data.train.dim), data.train.images, st);
    yt = dg_tensor_from_data(DG_INT64, dg_shape1(batch), data.train.labels, st);
    if (!xt || !yt) goto out;
    dg_output feeds[3] = {m.x, m.y_, m.training};
    dg_tensor *vals[3] = {xt, yt, on};
    for (int64_t i = 0; i < warmup + steps; i++) {
        double a = now_ms();
        if (!dg_session_run(s, feeds, vals, on ? 3 : 2, NULL, NULL, 0, &m.train, 1, st)) goto out;
        if (i >= warmup) times[i - warmup] = now_ms() - a;
    }
    if (*trace && !trace_one_step(s, feeds, vals, on ? 3 : 2, &m.train, trace, st)) goto out;
    double total = 0;
    for (int64_t i = 0; i < steps; i++) total += times[i];
    qsort(times, (size_t)steps, sizeof *times, cmp);
    double median = times[steps / 2];
    printf("{\"bench\": \"step_bench\", \"metric\": \"median_step\", \"value\": %.4f, \"unit\": \"ms\", \"batch\": %lld, \"threads\": %lld, \"model\": \"%s\", \"device\": \"%s\", \"mixed_precision\": \"%s\", \"amp\": \"%s\"}\n",
           median, (long long)batch, (long long)threads, model, *device ? device : "/cpu:0", mixed, amp);
    printf("{\"bench\": \"step_bench\", \"metric\": \"p90_step\", \"value\": %.4f, \"unit\": \"ms\"}\n",
           times[(steps * 9) / 10]);
    printf("{\"bench\": \"step_bench\", \"metric\": \"steps_per_s\", \"value\": %.1f, \"unit\": \"steps/s\"}\n",
           1000.0 / median);
    printf("{\"bench\": \"step_bench\", \"metric\": \"mean_steps_per_s\", \"value\": %.1f, \"unit\": \"steps/s\"}\n",
           (double)steps * 1000.0 / total);
    rc = 0;
out:
    if (rc) fprintf(stderr, "step_bench: %s\n", dg_status_message(st));
    dg_tensor_unref(on);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    free(times);
    dg_session_free(&s);
    dg_graph_free(&g);
    mnist_free(&data);
    dg_status_free(&st);
    return rc;
}
