/* exp_regression: y = e^x on [-1, 1] learned by a small float64 MLP, data parallel over the
 * worker tasks as TensorFlow's MultiWorkerMirroredStrategy does it. Every worker keeps its own
 * copy of the variables (rank 0's initial values, broadcast), computes gradients on its share
 * of each batch, the gradients are averaged with one all-reduce, and every worker applies the
 * same update. Worker 0 (the chief) also trains the same model in one process on the whole
 * batches, prints both loss curves side by side (step, loss_distributed, loss_single) and, at
 * the end, the largest difference between the two sets of parameters. The chief exits 3 when
 * the curves or the parameters differ by more than --tolerance, a loss is NaN or infinite, or
 * the loss did not fall.
 *   build/bin/dg-launch --workers 2 -- build/bin/exp_regression --train_steps 300 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

#include "flags.h"

#define N_VARS 4

typedef struct model {
    dg_output x, y, loss;
    dg_output vars[N_VARS];   // w1, b1, w2, b2
} model;

// Variables first, so one graph seed gives the same initial values in every graph.
static void build(dg_graph *g, model *m, int64_t hidden) {
    m->vars[0] = dg_variable(g, "w1", DG_FLOAT64, dg_shape2(1, hidden), dg_init_random_normal(0, 1, 0));
    m->vars[1] = dg_variable(g, "b1", DG_FLOAT64, dg_shape1(hidden), dg_init_random_uniform(-1, 1, 0));
    m->vars[2] = dg_variable(g, "w2", DG_FLOAT64, dg_shape2(hidden, 1),
                             dg_init_random_normal(0, 1.0 / sqrt((double)hidden), 0));
    m->vars[3] = dg_variable(g, "b2", DG_FLOAT64, dg_shape1(1), dg_init_zeros());
    m->x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, 1));
    m->y = dg_placeholder(g, "y", DG_FLOAT64, dg_shape2(-1, 1));
    dg_output h = dg_tanh(g, "hidden",
                          dg_bias_add(g, NULL, dg_matmul(g, NULL, m->x, m->vars[0], false, false), m->vars[1]));
    dg_output p = dg_bias_add(g, "prediction", dg_matmul(g, NULL, h, m->vars[2], false, false), m->vars[3]);
    m->loss = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, p, m->y)), NULL, 0, false);
}

static dg_optimizer optimizer(dg_graph *g, const char *name, double lr) {
    return strcmp(name, "sgd") == 0 ? dg_gradient_descent(g, lr) : dg_adam(g, lr);
}

// Batch `step` of the whole run: `rows` points x uniform in [-1, 1] (the same on every task),
// y = e^x. Rows [first, first + count) go to x and y.
static void batch(int64_t seed, int64_t step, int64_t first, int64_t count, double *x, double *y) {
    uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)(step + 1) * 0xBF58476D1CE4E5B9ull;
    for (int64_t i = 0; i < first + count; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        double v = -1 + 2 * ((double)(s >> 11) / 9007199254740992.0);
        if (i >= first) {
            x[i - first] = v;
            y[i - first] = exp(v);
        }
    }
}

static int fail(const dg_status *st, const char *what) {
    fprintf(stderr, "exp_regression: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

// One training step of session s: feeds x/y, runs train, sets *v to the fetched loss (which may
// be NaN or infinite: a diverging run is not a failed one). False when the step failed.
static bool step(dg_session *s, const model *m, dg_output loss, dg_node *train, double *x, double *y,
                 int64_t rows, double *v, dg_status *st) {
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(rows, 1), x, st);
    dg_tensor *yt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(rows, 1), y, st);
    dg_output feeds[2] = {m->x, m->y};
    dg_tensor *vals[2] = {xt, yt}, *l = NULL;
    bool ok = xt && yt && dg_session_run(s, feeds, vals, 2, &loss, &l, 1, &train, 1, st);
    if (ok) *v = dg_tensor_f64(l)[0];
    dg_tensor_unref(l);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    return ok;
}

int main(int argc, char **argv) {
    const char *job_name = "", *ps_hosts = "", *worker_hosts = "", *opt_name = "adam";
    int64_t task_index = -1, train_steps = 300, batch_size = 64, hidden = 16, seed = 1, log_every = 25;
    int64_t timeout_ms = 60000;
    double lr = 0.02, tolerance = 1e-9;
    bool quiet = false;
    flag_def defs[] = {
        {"job_name", FLAG_STRING, &job_name, "worker (default: from TF_CONFIG)"},
        {"task_index", FLAG_INT, &task_index, "index of this task among the workers"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "comma list of host:port, one per worker"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "accepted and ignored: all-reduce training has no ps"},
        {"train_steps", FLAG_INT, &train_steps, "steps (default 300)"},
        {"batch_size", FLAG_INT, &batch_size, "examples per step over all workers (default 64)"},
        {"hidden_units", FLAG_INT, &hidden, "hidden layer width (default 16)"},
        {"optimizer", FLAG_STRING, &opt_name, "adam (default) or sgd"},
        {"learning_rate", FLAG_DOUBLE, &lr, "learning rate (default 0.02)"},
        {"seed", FLAG_INT, &seed, "initialisation and data seed (default 1)"},
        {"log_every", FLAG_INT, &log_every, "print every N steps (default 25)"},
        {"timeout_ms", FLAG_INT, &timeout_ms, "how long an all-reduce waits for a peer (default 60000)"},
        {"tolerance", FLAG_DOUBLE, &tolerance, "largest relative loss difference called a match (default 1e-9)"},
        {"quiet", FLAG_BOOL, &quiet, "no server log lines"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: exp_regression [flags]", &help))
        return 2;
    if (help) return 0;
    if (strcmp(opt_name, "adam") != 0 && strcmp(opt_name, "sgd") != 0) {
        fprintf(stderr, "exp_regression: --optimizer must be adam or sgd, got \"%s\"\n", opt_name);
        return 2;
    }
    if (train_steps < 1 || batch_size < 1 || hidden < 1 || log_every < 1 || timeout_ms < 1) {
        fprintf(stderr, "exp_regression: --train_steps, --batch_size, --hidden_units, --log_every and "
                        "--timeout_ms must be positive\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_cluster *cluster = NULL;
    char job[64];
    snprintf(job, sizeof job, "%s", *job_name ? job_name : "worker");
    if (*worker_hosts) {
        cluster = dg_cluster_from_flags(NULL, worker_hosts, st);
    } else {
        dg_tf_config cfg;
        if (dg_tf_config_from_env(&cfg, st)) {
            cluster = cfg.cluster;
            cfg.cluster = NULL;
            if (!*job_name) snprintf(job, sizeof job, "%s", cfg.task_type);
            if (task_index < 0) task_index = cfg.task_index;
            dg_tf_config_clear(&cfg);
        }
    }
    if (!cluster) return fail(st, "cluster (give --worker_hosts or TF_CONFIG)");
    int n_workers = dg_cluster_num_tasks(cluster, "worker");
    if (strcmp(job, "worker") != 0 || task_index < 0 || task_index >= n_workers) {
        fprintf(stderr, "exp_regression: needs --job_name worker and --task_index in [0, %d), got %s %lld\n",
                n_workers, job, (long long)task_index);
        return 2;
    }
    if (batch_size % n_workers != 0) {
        fprintf(stderr, "exp_regression: --batch_size %lld does not split evenly over %d workers\n",
                (long long)batch_size, n_workers);
        return 2;
    }
    dg_server_options so = dg_server_options_default();
    so.quiet = quiet;
    dg_server *server = dg_server_new(cluster, "worker", (int)task_index, &so, st);
    if (!server) return fail(st, "starting the server");
    bool is_chief = task_index == 0;
    int64_t per_worker = batch_size / n_workers, first = task_index * per_worker;
    int rc = 1;
    dg_graph *gd = NULL, *gs = NULL;
    dg_session *sd = NULL, *ss = NULL;
    double *x = malloc(sizeof(double) * (size_t)batch_size), *y = malloc(sizeof(double) * (size_t)batch_size);
    if (!x || !y) abort();

    // The data-parallel model: this worker's copy, everything on this task.
    gd = dg_graph_new();
    dg_graph_set_random_seed(gd, seed * 1000 + task_index);   // only rank 0's values survive
    model md;
    build(gd, &md, hidden);
    dg_collective_group grp = dg_collective_group_make("worker", n_workers);
    grp.timeout_ms = timeout_ms;
    dg_optimizer od = optimizer(gd, opt_name, lr);
    dg_node *train_d = dg_all_reduce_minimize(&od, md.loss, NULL, 0, (dg_output){NULL, 0}, &grp, 1);
    // The loss over the whole batch: the mean of the workers' losses (equal shares), reduced
    // after the gradients so every worker runs the two collectives in one order.
    dg_output mean_loss = {NULL, 0};
    if (train_d) {
        dg_graph_push_control_deps(gd, &train_d, 1);
        dg_collective_all_reduce(gd, "allreduce_loss", &md.loss, 1, &grp, 2, DG_REDUCE_MEAN, NULL, &mean_loss);
        dg_graph_pop_control_deps(gd);
    }
    dg_node *init_d = dg_global_variables_initializer(gd);
    dg_node *bcast = dg_collective_broadcast_variables(gd, NULL, 0, &grp, 3);
    if (!dg_graph_ok(gd)) {
        fail(dg_graph_status(gd), "building the data-parallel graph");
        goto out;
    }
    sd = dg_session_new(gd, dg_server_target(server), NULL, st);
    if (!sd || !dg_session_run_target(sd, init_d, st) || !dg_session_run_target(sd, bcast, st)) {
        fail(st, "initializing");
        goto out;
    }
    // The chief's single-process reference: rank 0's initial values, whole batches.
    model ms;
    dg_node *train_s = NULL;
    if (is_chief) {
        gs = dg_graph_new();
        dg_graph_set_random_seed(gs, seed * 1000);
        build(gs, &ms, hidden);
        dg_optimizer os = optimizer(gs, opt_name, lr);
        train_s = dg_optimizer_minimize(&os, ms.loss, (dg_output){NULL, 0});
        dg_node *init_s = dg_global_variables_initializer(gs);
        if (!dg_graph_ok(gs)) {
            fail(dg_graph_status(gs), "building the single-process graph");
            goto out;
        }
        ss = dg_session_new(gs, "local", NULL, st);
        if (!ss || !dg_session_run_target(ss, init_s, st)) {
            fail(st, "initializing the single-process model");
            goto out;
        }
        printf("%d workers, %lld examples per step (%lld each), %s\n", n_workers, (long long)batch_size,
               (long long)per_worker, opt_name);
        printf("%6s  %16s  %16s\n", "step", "loss_distributed", "loss_single");
    }
    double first_loss = NAN, last_loss = NAN, max_rel = 0;
    bool finite = true;
    for (int64_t s = 0; s < train_steps; s++) {
        batch(seed, s, first, per_worker, x, y);
        double ld = NAN, ls = NAN;
        if (!step(sd, &md, mean_loss, train_d, x, y, per_worker, &ld, st)) {
            fail(st, "distributed step");
            goto out;
        }
        if (s == 0) first_loss = ld;
        last_loss = ld;
        if (!is_chief) continue;
        batch(seed, s, 0, batch_size, x, y);
        if (!step(ss, &ms, ms.loss, train_s, x, y, batch_size, &ls, st)) {
            fail(st, "single-process step");
            goto out;
        }
        finite = finite && isfinite(ld) && isfinite(ls);
        double rel = fabs(ld - ls) / fmax(fabs(ls), 1e-300);
        if (!(rel <= max_rel)) max_rel = rel;   // a NaN sticks and fails the match
        if (s % log_every == 0 || s == train_steps - 1) printf("%6lld  %16.10f  %16.10f\n", (long long)s, ld, ls);
        fflush(stdout);
    }
    if (is_chief) {
        dg_tensor *vd[N_VARS] = {0}, *vs[N_VARS] = {0};
        double max_diff = 0;
        bool ok = dg_session_run(sd, NULL, NULL, 0, md.vars, vd, N_VARS, NULL, 0, st) &&
                  dg_session_run(ss, NULL, NULL, 0, ms.vars, vs, N_VARS, NULL, 0, st);
        for (int v = 0; ok && v < N_VARS; v++)
            for (int64_t e = 0; e < dg_tensor_num_elements(vd[v]); e++) {
                double d = fabs(dg_tensor_f64(vd[v])[e] - dg_tensor_f64(vs[v])[e]);
                if (!(d <= max_diff)) max_diff = d;   // fmax would drop a NaN
            }
        for (int v = 0; v < N_VARS; v++) {
            dg_tensor_unref(vd[v]);
            dg_tensor_unref(vs[v]);
        }
        if (!ok) {
            fail(st, "reading the parameters");
            goto out;
        }
        printf("loss: first %.6g, last %.6g\n", first_loss, last_loss);
        printf("largest relative loss difference: %.3g\n", max_rel);
        printf("max parameter difference: %.3g\n", max_diff);
        // False for a NaN or an infinite loss: the script checks the numbers again on its own.
        bool match = finite && max_rel <= tolerance && max_diff <= tolerance && last_loss < first_loss;
        printf("curves match: %s\n", match ? "yes" : "no");
        fflush(stdout);
        if (!match) {
            rc = 3;
            goto out;
        }
    } else {
        printf("worker %lld: %lld steps, loss %.6g -> %.6g\n", (long long)task_index, (long long)train_steps,
               first_loss, last_loss);
    }
    fflush(stdout);
    rc = 0;
out:
    dg_session_free(&ss);
    dg_session_free(&sd);
    dg_graph_free(&gs);
    dg_graph_free(&gd);
    free(x);
    free(y);
    dg_server_free(&server);
    dg_cluster_free(&cluster);
    dg_status_free(&st);
    return rc;
}
