/* mirrored: trains the MNIST-replica model (784 -> 100 ReLU -> 10, Adam) on Fashion-MNIST with
 * data parallelism inside one process: a mirrored or central-storage strategy over several
 * devices (virtual CPUs by default), each device computing the gradients of its share of the
 * batch. Reports test accuracy and cross entropy on the 10,000 test images.
 *   build/bin/mirrored --num_devices 2 --strategy mirrored --train_steps 2000 --batch_size 100 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "mlp_model.h"
#include "mnist_data.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct model_vars {
    dg_strategy *strategy;
    dg_output hid_w, hid_b, sm_w, sm_b;   // strategy variables (handles)
} model_vars;

static dg_output logits_of(dg_graph *g, const model_vars *m, int replica, dg_output x) {
    dg_strategy *s = m->strategy;
    dg_output hid_w = dg_strategy_read_variable(s, m->hid_w, replica);
    dg_output hid_b = dg_strategy_read_variable(s, m->hid_b, replica);
    dg_output sm_w = dg_strategy_read_variable(s, m->sm_w, replica);
    dg_output sm_b = dg_strategy_read_variable(s, m->sm_b, replica);
    dg_output mm = dg_matmul(g, NULL, x, hid_w, false, false);
    dg_output hid = dg_relu(g, "hid", dg_bias_add(g, "hid_lin", mm, hid_b));
    return dg_bias_add(g, "logits", dg_matmul(g, NULL, hid, sm_w, false, false), sm_b);
}

// The tower: replica r's mean cross entropy over its slice {images, labels} of the batch.
static dg_output tower(dg_graph *g, int replica, const dg_output *inputs, void *ctx) {
    dg_output logits = logits_of(g, ctx, replica, inputs[0]);
    return dg_sparse_softmax_cross_entropy(g, "cross_entropy", logits, inputs[1]);
}

// FNV-1a over n bytes, continuing from h.
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

// True when every mirrored copy of v holds the same bytes as replica 0's; each copy's bytes
// also go into hash[replica] (printed, so a test can compare the copies itself).
static bool copies_identical(dg_session *s, dg_strategy *strategy, dg_output v, bool *same,
                             uint64_t *hash, dg_status *st) {
    dg_tensor *first = NULL;
    *same = true;
    for (int r = 0; r < dg_strategy_num_replicas(strategy); r++) {
        dg_output c = dg_strategy_read_variable(strategy, v, r);
        dg_tensor *t = NULL;
        if (!dg_session_run(s, NULL, NULL, 0, &c, &t, 1, NULL, 0, st)) {
            dg_tensor_unref(first);
            return false;
        }
        hash[r] = fnv1a(hash[r], dg_tensor_data(t), dg_tensor_nbytes(t));
        if (!first) {
            first = t;
            continue;
        }
        size_t n = (size_t)dg_tensor_num_elements(t) * sizeof(float);
        if (memcmp(dg_tensor_f32(first), dg_tensor_f32(t), n) != 0) *same = false;
        dg_tensor_unref(t);
    }
    dg_tensor_unref(first);
    return true;
}

int main(int argc, char **argv) {
    int64_t train_steps = 2000, batch_size = 100, hidden = 100, seed = 1, log_every = 200, threads = 1;
    int64_t num_devices = 2;
    double lr = 0.01;
    const char *data_dir = MNIST_DEFAULT_DIR, *strategy_name = "mirrored", *device_type = "CPU";
    flag_def defs[] = {
        {"num_devices", FLAG_INT, &num_devices, "devices (replicas) in this process (default 2)"},
        {"strategy", FLAG_STRING, &strategy_name, "mirrored or central_storage (default mirrored)"},
        {"device_type", FLAG_STRING, &device_type, "CPU (virtual CPUs) or GPU (default CPU)"},
        {"train_steps", FLAG_INT, &train_steps, "training steps (default 2000)"},
        {"batch_size", FLAG_INT, &batch_size, "examples per step over all replicas (default 100)"},
        {"hidden_units", FLAG_INT, &hidden, "hidden layer width (default 100)"},
        {"learning_rate", FLAG_DOUBLE, &lr, "Adam learning rate (default 0.01)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files (default " MNIST_DEFAULT_DIR ")"},
        {"seed", FLAG_INT, &seed, "initialisation and shuffling seed (default 1)"},
        {"log_every", FLAG_INT, &log_every, "progress line every N steps (default 200)"},
        {"threads", FLAG_INT, &threads, "inter-op threads (default 1)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: mirrored [flags]", &help))
        return 2;
    if (help) return 0;
    dg_strategy_kind kind;
    if (strcmp(strategy_name, "mirrored") == 0) {
        kind = DG_STRATEGY_MIRRORED;
    } else if (strcmp(strategy_name, "central_storage") == 0) {
        kind = DG_STRATEGY_CENTRAL_STORAGE;
    } else {
        fprintf(stderr, "mirrored: --strategy must be mirrored or central_storage, got \"%s\"\n", strategy_name);
        return 2;
    }
    if (strcmp(device_type, "CPU") != 0 && strcmp(device_type, "GPU") != 0) {
        fprintf(stderr, "mirrored: --device_type must be CPU or GPU, got \"%s\"\n", device_type);
        return 2;
    }
    if (train_steps < 0 || batch_size < 1 || batch_size > 60000 || hidden < 1 || hidden > 100000 ||
        log_every < 1 || num_devices < 1 || num_devices > 64 || threads < 0) {
        fprintf(stderr, "mirrored: --train_steps must be >= 0, --batch_size in 1..60000, "
                        "--hidden_units in 1..100000, --log_every >= 1, --num_devices in 1..64, "
                        "--threads >= 0\n");
        return 2;
    }
    if (batch_size % num_devices != 0) {
        fprintf(stderr, "mirrored: --batch_size %lld does not split evenly across %lld devices\n",
                (long long)batch_size, (long long)num_devices);
        return 2;
    }
    dg_status *st = dg_status_new();
    mnist_dataset data;
    int rc = 1;
    dg_graph *g = NULL;
    dg_session *s = NULL;
    float *xb = NULL;
    int64_t *yb = NULL;
    dg_tensor *xt = NULL, *yt = NULL;
    model_vars m = {NULL, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    if (!mnist_load(data_dir, (uint64_t)seed, &data, st)) {
        fprintf(stderr, "mirrored: loading data: %s: %s\n", dg_code_name(dg_status_code(st)),
                dg_status_message(st));
        dg_status_free(&st);
        return 1;
    }
    printf("data: %lld training and %lld test images from %s\n", (long long)data.train.n,
           (long long)data.test.n, data_dir);
    int64_t pixels = data.train.dim;
    g = dg_graph_new();
    m.strategy = dg_strategy_new_local(g, kind, device_type, (int)num_devices, st);
    if (!m.strategy) goto out;
    printf("strategy: %s over %d devices:", strategy_name, dg_strategy_num_replicas(m.strategy));
    for (int r = 0; r < dg_strategy_num_replicas(m.strategy); r++)
        printf(" %s", dg_strategy_device(m.strategy, r));
    printf(" (variables %s, reduction on %s)\n",
           kind == DG_STRATEGY_MIRRORED ? "on every device" : dg_strategy_host_device(m.strategy),
           dg_strategy_host_device(m.strategy));
    m.hid_w = dg_strategy_variable(m.strategy, "hid_w", DG_FLOAT32, dg_shape2(pixels, hidden),
                                   dg_init_truncated_normal(0, 1.0 / sqrt((double)pixels), seed), st);
    if (!m.hid_w.node) goto out;
    m.hid_b = dg_strategy_variable(m.strategy, "hid_b", DG_FLOAT32, dg_shape1(hidden), dg_init_zeros(), st);
    if (!m.hid_b.node) goto out;
    m.sm_w = dg_strategy_variable(m.strategy, "sm_w", DG_FLOAT32, dg_shape2(hidden, 10),
                                  dg_init_truncated_normal(0, 1.0 / sqrt((double)hidden), seed + 1), st);
    if (!m.sm_w.node) goto out;
    m.sm_b = dg_strategy_variable(m.strategy, "sm_b", DG_FLOAT32, dg_shape1(10), dg_init_zeros(), st);
    if (!m.sm_b.node) goto out;
    mlp_model eval;   // the evaluation model on replica 0's device, reading replica 0's copies
    memset(&eval, 0, sizeof eval);
    eval.x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, pixels));
    eval.y_ = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
    eval.global_step = dg_global_step(g);
    dg_optimizer opt = dg_adam(g, lr);
    dg_output batch[2] = {eval.x, eval.y_};
    dg_strategy_step step;
    if (!dg_strategy_minimize(m.strategy, &opt, tower, &m, batch, 2, eval.global_step, &step, st)) goto out;
    dg_graph_push_device(g, dg_strategy_device(m.strategy, 0));
    dg_graph_push_name_scope(g, "eval");
    eval.logits = logits_of(g, &m, 0, eval.x);
    eval.loss = dg_sparse_softmax_cross_entropy(g, "cross_entropy", eval.logits, eval.y_);
    dg_output correct = dg_equal(g, "correct", dg_argmax(g, NULL, eval.logits, 1), eval.y_);
    eval.accuracy = dg_mean(g, "accuracy", dg_cast(g, NULL, correct, DG_FLOAT32), NULL, 0, false);
    dg_graph_pop_name_scope(g);
    dg_graph_pop_device(g);
    dg_node *init = dg_global_variables_initializer(g);
    if (!dg_graph_check(g, st)) goto out;

    dg_session_options opts = dg_session_options_default();
    opts.inter_op_threads = (int)threads;
    if (strcmp(device_type, "CPU") == 0) opts.n_virtual_cpus = (int)num_devices - 1;
    s = dg_session_new(g, "local", &opts, st);
    if (!s || !dg_session_run_target(s, init, st)) goto out;
    xb = malloc((size_t)(batch_size * pixels) * sizeof *xb);
    yb = malloc((size_t)batch_size * sizeof *yb);
    if (!xb || !yb) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "batch buffers for %lld images", (long long)batch_size);
        goto out;
    }
    xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(batch_size, pixels), xb,
                        (size_t)(batch_size * pixels) * sizeof *xb, NULL, NULL, st);
    yt = dg_tensor_wrap(DG_INT64, dg_shape1(batch_size), yb, (size_t)batch_size * sizeof *yb, NULL, NULL, st);
    if (!xt || !yt) goto out;
    dg_tensor *vals[2] = {xt, yt};
    double t0 = now_s(), train_s = 0;
    for (int64_t k = 1; k <= train_steps; k++) {
        mnist_next_batch(&data.train, batch_size, xb, yb);
        double a = now_s();
        bool want_loss = k % log_every == 0 || k == train_steps;
        dg_tensor *loss = NULL;
        bool ok = dg_session_run(s, batch, vals, 2, &step.loss, &loss, want_loss ? 1 : 0, &step.train, 1, st);
        train_s += now_s() - a;
        if (!ok) goto out;
        if (want_loss) {
            printf("step %lld/%lld: loss %.4f (%.0f steps/s)\n", (long long)k, (long long)train_steps,
                   dg_tensor_f32(loss)[0], (double)k / train_s);
            fflush(stdout);
            dg_tensor_unref(loss);
        }
    }
    double test_loss, test_acc;
    if (!mlp_evaluate(s, &eval, data.test.images, data.test.labels, data.test.n, data.test.dim, 1000,
                      &test_loss, &test_acc, st))
        goto out;
    printf("trained %lld steps in %.2f s (%.0f steps/s, %.2f s total)\n", (long long)train_steps,
           train_s, train_steps ? (double)train_steps / train_s : 0.0, now_s() - t0);
    if (kind == DG_STRATEGY_MIRRORED) {
        bool all_same = true;
        dg_output vs[4] = {m.hid_w, m.hid_b, m.sm_w, m.sm_b};
        uint64_t hash[64];
        for (int r = 0; r < 64; r++) hash[r] = 0xcbf29ce484222325ull;
        for (int i = 0; i < 4; i++) {
            bool same;
            if (!copies_identical(s, m.strategy, vs[i], &same, hash, st)) goto out;
            all_same = all_same && same;
        }
        for (int r = 0; r < dg_strategy_num_replicas(m.strategy) && r < 64; r++)
            printf("mirrored copy %d: parameters fnv1a %016llx\n", r, (unsigned long long)hash[r]);
        printf("mirrored copies identical: %s\n", all_same ? "yes" : "NO");
        if (!all_same) {
            dg_status_set(st, DG_INTERNAL, "the mirrored copies of the variables differ");
            goto out;
        }
    }
    printf("test accuracy %.4f, test cross entropy %.4f (%lld images)\n", test_acc, test_loss,
           (long long)data.test.n);
    rc = 0;
out:
    if (rc) fprintf(stderr, "mirrored: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    free(xb);
    free(yb);
    dg_session_free(&s);
    dg_strategy_free(&m.strategy);
    dg_graph_free(&g);
    mnist_free(&data);
    dg_status_free(&st);
    return rc;
}
