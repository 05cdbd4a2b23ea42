/* strategies: the MNIST-replica model (784 -> 100 ReLU -> 10, Adam) written once, trained on
 * Fashion-MNIST under any distribution of distgraph/distribute.h, chosen by --strategy:
 *   mirrored, central_storage     one process, --num_devices replicas (virtual CPUs)
 *   multi_worker_mirrored         worker tasks, each holding the variables (all-reduce)
 *   parameter_server              ps tasks holding the variables, asynchronous workers
 *   sync_replicas                 ps tasks, every step averaging the workers' gradients
 *   ps_coordinator                ps tasks holding the variables, standing workers, one
 *                                 coordinator process handing each step to a free worker
 * Prints the loss as it trains and the accuracy on the 10,000 test images.
 *   build/bin/strategies --strategy mirrored
 *   build/bin/dg-launch --workers 2 -- build/bin/strategies --strategy multi_worker_mirrored
 *   build/bin/dg-launch --ps 1 --workers 2 -- build/bin/strategies --strategy sync_replicas
 *   build/bin/dg-launch --ps 1 --workers 2 --mode coordinator -- build/bin/strategies --strategy ps_coordinator
 * The cluster comes from --ps_hosts/--worker_hosts with --job_name/--task_index (the
 * coordinator's job is "chief"), or TF_CONFIG. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "mnist_data.h"

typedef struct model {
    int64_t pixels, hidden, seed;
} model;

// The model, as every strategy builds it: inputs[0] the images, inputs[1] the labels;
// outputs[0] the mean cross entropy, outputs[1] the accuracy.
static bool mlp(dg_replica *r, const dg_output *inputs, void *ctx, dg_output *out, int n_out) {
    const model *m = ctx;
    dg_graph *g = dg_replica_graph(r);
    dg_output hid_w = dg_replica_variable(r, "hid_w", DG_FLOAT32, dg_shape2(m->pixels, m->hidden),
                                          dg_init_truncated_normal(0, 1.0 / sqrt((double)m->pixels), m->seed));
    dg_output hid_b = dg_replica_variable(r, "hid_b", DG_FLOAT32, dg_shape1(m->hidden), dg_init_zeros());
    dg_output sm_w = dg_replica_variable(r, "sm_w", DG_FLOAT32, dg_shape2(m->hidden, 10),
                                         dg_init_truncated_normal(0, 1.0 / sqrt((double)m->hidden), m->seed + 1));
    dg_output sm_b = dg_replica_variable(r, "sm_b", DG_FLOAT32, dg_shape1(10), dg_init_zeros());
    dg_output hid = dg_relu(g, "hid", dg_bias_add(g, NULL, dg_matmul(g, NULL, inputs[0], hid_w, false, false), hid_b));
    dg_output logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, hid, sm_w, false, false), sm_b);
    out[0] = dg_sparse_softmax_cross_entropy(g, "cross_entropy", logits, inputs[1]);
    dg_output correct = dg_equal(g, "correct", dg_argmax(g, NULL, logits, 1), inputs[1]);
    if (n_out > 1) out[1] = dg_mean(g, "accuracy", dg_cast(g, NULL, correct, DG_FLOAT32), NULL, 0, false);
    return dg_graph_ok(g);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const char *what, dg_status *st) {
    fprintf(stderr, "strategies: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

// Loss and accuracy over the test set through the model's evaluation outputs.
static bool evaluate(dg_session *s, const dg_output *inputs, const dg_output *outs, const mnist_split *test,
                     double *loss, double *acc, dg_status *st) {
    double sum[2] = {0, 0};
    const int64_t batch = 1000;
    for (int64_t off = 0; off < test->n; off += batch) {
        int64_t b = test->n - off < batch ? test->n - off : batch;
        dg_tensor *v[2] = {
            dg_tensor_wrap(DG_FLOAT32, dg_shape2(b, test->dim), test->images + off * test->dim,
                           (size_t)(b * test->dim) * sizeof(float), NULL, NULL, st),
            dg_tensor_wrap(DG_INT64, dg_shape1(b), test->labels + off, (size_t)b * sizeof(int64_t), NULL, NULL, st)};
        dg_tensor *got[2] = {NULL, NULL};
        bool ok = v[0] && v[1] && dg_session_run(s, inputs, v, 2, outs, got, 2, NULL, 0, st);
        dg_tensor_unref(v[0]);
        dg_tensor_unref(v[1]);
        if (!ok) return false;
        for (int i = 0; i < 2; i++) {
            sum[i] += dg_tensor_f32(got[i])[0] * (double)b;
            dg_tensor_unref(got[i]);
        }
    }
    *loss = sum[0] / (double)test->n;
    *acc = sum[1] / (double)test->n;
    return true;
}

int main(int argc, char **argv) {
    const char *strategy = "mirrored", *job = "", *ps_hosts = "", *worker_hosts = "", *data_dir = MNIST_DEFAULT_DIR;
    const char *checkpoint_path = "";
    int64_t task_index = 0, steps = 2000, batch = 100, num_devices = 2, hidden = 100, seed = 1, log_every = 500;
    int64_t replicas_to_aggregate = 0, peer_timeout_ms = 60000;
    double lr = 0.01;
    bool quiet = false;
    flag_def defs[] = {
        {"strategy", FLAG_STRING, &strategy,
         "mirrored, central_storage, multi_worker_mirrored, parameter_server, sync_replicas or ps_coordinator "
         "(default mirrored)"},
        {"num_devices", FLAG_INT, &num_devices, "mirrored, central_storage: replicas, one per CPU (default 2)"},
        {"job_name", FLAG_STRING, &job, "worker, ps, or chief (ps_coordinator's coordinator) (default: TF_CONFIG's "
         "task)"},
        {"task_index", FLAG_INT, &task_index, "this task's index in its job"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "comma list of host:port"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "comma list of host:port (none: TF_CONFIG)"},
        {"train_steps", FLAG_INT, &steps, "global steps (default 2000)"},
        {"batch_size", FLAG_INT, &batch, "examples per step and worker (default 100)"},
        {"learning_rate", FLAG_DOUBLE, &lr, "Adam's (default 0.01)"},
        {"replicas_to_aggregate", FLAG_INT, &replicas_to_aggregate, "sync_replicas: gradients per step (default: all)"},
        {"peer_timeout_ms", FLAG_INT, &peer_timeout_ms, "how long a step waits for another task (default 60000)"},
        {"checkpoint_path", FLAG_STRING, &checkpoint_path, "SQLite checkpoint file of the chief (default: none)"},
        {"log_every", FLAG_INT, &log_every, "loss line every N local steps (default 500)"},

        {"seed", FLAG_INT, &seed, "initialization; batches are shuffled by seed + worker (default 1)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files (default " MNIST_DEFAULT_DIR ")"},
        {"quiet", FLAG_BOOL, &quiet, "no server log lines"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: strategies [flags]", &help)) return 2;
    if (help) return 0;
    if (steps < 1 || batch < 1 || batch > 60000 || num_devices < 1 || num_devices > 64 || log_every < 1 ||
        replicas_to_aggregate < 0 || peer_timeout_ms < 1) {
        fprintf(stderr, "strategies: bad --train_steps, --batch_size, --num_devices, --log_every, "
                        "--replicas_to_aggregate or --peer_timeout_ms\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_distribution_kind kind;
    if (!dg_distribution_kind_parse(strategy, &kind, st)) {
        fail("--strategy", st);
        dg_status_free(&st);
        return 2;
    }
    dg_distribution_options o = dg_distribution_options_default(kind);
    dg_cluster *cluster = NULL;
    if (*worker_hosts) {
        if (!(cluster = dg_cluster_from_flags(ps_hosts, worker_hosts, st))) return fail("--ps_hosts/--worker_hosts", st);
        o.cluster = cluster;
        o.job_name = *job ? job : "worker";
        o.task_index = (int)task_index;
    }
    o.num_devices = (int)num_devices;
    o.replicas_to_aggregate = (int)replicas_to_aggregate;
    o.peer_timeout_ms = peer_timeout_ms;
    dg_server_options so = dg_server_options_default();
    so.quiet = quiet;
    o.server_options = &so;
    // -- the one line that differs between strategies is o.kind --
    dg_distribution *d = dg_distribution_new(&o, st);
    dg_cluster_free(&cluster);
    if (!d) return fail("the distribution", st);
    int rc = 1;
    if (dg_distribution_only_serves(d)) {   // a ps task (or a coordinated worker) serves until stopped
        rc = dg_distribution_join(d, st) ? 0 : fail("serving", st);
        dg_distribution_free(&d);
        dg_status_free(&st);
        return rc;
    }
    int worker = dg_distribution_worker_index(d);
    mnist_dataset data;
    memset(&data, 0, sizeof data);
    dg_graph *g = dg_graph_new();
    dg_monitored_session *ms = NULL;
    float *xb = NULL;
    int64_t *yb = NULL;
    dg_tensor *xt = NULL, *yt = NULL;
    if (!mnist_load(data_dir, (uint64_t)(seed + worker), &data, st)) {
        fail("loading data", st);
        goto out;
    }
    model m = {data.train.dim, hidden, seed};
    dg_output inputs[2] = {dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, data.train.dim)),
                           dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1))};
    dg_optimizer opt = dg_adam(g, lr);
    dg_distributed_step step;
    if (!dg_distribution_minimize(d, g, &opt, mlp, &m, inputs, 2, 2, &step, st)) {
        fail("building the model", st);
        goto out;
    }
    dg_mts_options mo = dg_mts_options_default();
    mo.checkpoint_path = *checkpoint_path ? checkpoint_path : NULL;
    if (!(ms = dg_distribution_session_new(d, g, steps, &mo, st))) {
        fail("the session", st);
        goto out;
    }
    // Who speaks: a worker, or ps_coordinator's coordinator (worker index -1).
    char who[32];
    if (worker >= 0) snprintf(who, sizeof who, "worker %d", worker);
    else snprintf(who, sizeof who, "coordinator");
    if (worker >= 0)
        printf("%s: worker %d of %d, %d replica(s) in sync%s\n", strategy, worker, dg_distribution_num_workers(d),
               dg_distribution_num_replicas_in_sync(d), dg_distribution_is_chief(d) ? " (chief)" : "");
    else
        printf("%s: coordinator of %d workers, %d replica(s) in sync (chief)\n", strategy,
               dg_distribution_num_workers(d), dg_distribution_num_replicas_in_sync(d));
    xb = malloc((size_t)(batch * data.train.dim) * sizeof *xb);
    yb = malloc((size_t)batch * sizeof *yb);
    if (!xb || !yb) {
        fprintf(stderr, "strategies: out of memory for a batch of %lld\n", (long long)batch);
        goto out;
    }
    xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(batch, data.train.dim), xb, (size_t)(batch * data.train.dim) * sizeof *xb,
                        NULL, NULL, st);
    yt = dg_tensor_wrap(DG_INT64, dg_shape1(batch), yb, (size_t)batch * sizeof *yb, NULL, NULL, st);
    if (!xt || !yt) {
        fail("batch tensors", st);
        goto out;
    }
    double t0 = now_s();
    int64_t local = 0, gs = 0, next_log = 1;
    while (!dg_monitored_session_should_stop(ms)) {
        mnist_next_batch(&data.train, batch, xb, yb);
        dg_tensor *vals[2] = {xt, yt}, *got[2] = {NULL, NULL};
        dg_output fetch[2] = {step.outputs[0], step.global_step};
        if (!dg_distribution_run(d, ms, &step, inputs, vals, 2, fetch, got, 2, st)) {
            fail("training", st);
            goto out;
        }
        // Nothing fetched: sync replicas' chief ended training, or no step of ps_coordinator's
        // finished since the last call (the steps run on the workers while this loop goes on).
        local++;
        if (got[0]) {
            gs = dg_tensor_i64(got[1])[0];
            if (local >= next_log) {
                printf("%s: local step %lld (global step %lld): loss %.4f\n", who, (long long)local, (long long)gs,
                       dg_tensor_f32(got[0])[0]);
                fflush(stdout);
                next_log = (local / log_every + 1) * log_every;
            }
        }
        dg_tensor_unref(got[0]);
        dg_tensor_unref(got[1]);
    }
    double took = now_s() - t0;
    double loss = 0, acc = 0;
    if (!evaluate(dg_monitored_session_session(ms), inputs, step.eval_outputs, &data.test, &loss, &acc, st)) {
        fail("evaluating", st);
        goto out;
    }
    if (worker < 0) {   // the coordinator: the global step every worker's steps reached
        dg_tensor *g_end = NULL;
        if (!dg_session_run(dg_monitored_session_session(ms), NULL, NULL, 0, &step.global_step, &g_end, 1, NULL, 0, st)) {
            fail("reading the global step", st);
            goto out;
        }
        gs = dg_tensor_i64(g_end)[0];
        dg_tensor_unref(g_end);
    }
    printf("%s: %lld local steps in %.2f s, global step %lld; test accuracy %.4f, cross entropy %.4f\n", who,
           (long long)local, took, (long long)gs, acc, loss);
    rc = isfinite(loss) && acc > 0 ? 0 : 3;
out:
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    free(xb);
    free(yb);
    if (ms && !dg_monitored_session_close(ms, st) && rc == 0) rc = fail("closing the session", st);
    dg_monitored_session_free(&ms);
    dg_distribution_free(&d);   // before the graph it built for
    dg_graph_free(&g);
    mnist_free(&data);
    dg_status_free(&st);
    return rc;
}
