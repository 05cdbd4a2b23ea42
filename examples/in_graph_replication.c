/* in_graph_replication: TensorFlow's in-graph replication from a client process. Three
 * standing servers (jobs "master", "worker" and "worker_", one task each) are started first;
 * this program starts no server. It builds ONE graph: the variables of a small float64 MLP
 * learning y = e^x live on the master task, a copy of the model on each worker task is fed its
 * half of every batch and computes gradients there (compute_gradients), the gradients are
 * averaged on the master task and applied there (apply_gradients). The graph runs through the
 * master service of --master. The same model is also trained in this process on the whole
 * batches; both loss curves are printed side by side with their largest difference, and the
 * program fails unless they agree and the loss fell.
 *   build/bin/dg-server --cluster_spec 'master|localhost:2222;worker|localhost:2223;worker_|localhost:2224' \
 *       --job_name master --task_index 0 &   (and worker, worker_)
 *   build/bin/in_graph_replication --master dg://localhost:2222
 * With --ps_hosts/--worker_hosts (as dg-launch --mode standing passes them) the variables go
 * to /job:ps/task:0 (or the first worker without ps) and a replica to each worker task:
 *   build/bin/dg-launch --ps 1 --workers 2 --mode standing -- build/bin/in_graph_replication
 * --scope keeps a client's variables apart from another client's on the same cluster;
 * --read_variables only reads the variables a previous client trained (nothing is initialized)
 * and prints their checksum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

#include "flags.h"

#define N_VARS 4
#define MAX_REPLICAS 16

typedef struct replica {
    dg_output x, y, loss;
} replica;

static void make_vars(dg_graph *g, int64_t hidden, dg_output *vars) {
    vars[0] = dg_variable(g, "w1", DG_FLOAT64, dg_shape2(1, hidden), dg_init_random_normal(0, 1, 0));
    vars[1] = dg_variable(g, "b1", DG_FLOAT64, dg_shape1(hidden), dg_init_random_uniform(-1, 1, 0));
    vars[2] = dg_variable(g, "w2", DG_FLOAT64, dg_shape2(hidden, 1), dg_init_random_normal(0, 1.0 / sqrt((double)hidden), 0));
    vars[3] = dg_variable(g, "b2", DG_FLOAT64, dg_shape1(1), dg_init_zeros());
}

static replica make_tower(dg_graph *g, const dg_output *vars) {
    replica r;
    r.x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, 1));
    r.y = dg_placeholder(g, "y", DG_FLOAT64, dg_shape2(-1, 1));
    dg_output h = dg_tanh(g, "hidden", dg_bias_add(g, NULL, dg_matmul(g, NULL, r.x, vars[0], false, false), vars[1]));
    dg_output p = dg_bias_add(g, "prediction", dg_matmul(g, NULL, h, vars[2], false, false), vars[3]);
    r.loss = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, p, r.y)), NULL, 0, false);
    return r;
}

// Batch `step`: `rows` points x uniform in [-1, 1], y = e^x.
static void batch(int64_t seed, int64_t step, int64_t rows, double *x, double *y) {
    uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)(step + 1) * 0xBF58476D1CE4E5B9ull;
    for (int64_t i = 0; i < rows; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = -1 + 2 * ((double)(s >> 11) / 9007199254740992.0);
        y[i] = exp(x[i]);
    }
}

static int fail(const dg_status *st, const char *what) {
    fprintf(stderr, "in_graph_replication: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)),
            dg_status_message(st));
    return 1;
}

// Splits a comma list into at most max items (copied into buf). Returns the count.
static int split(const char *list, char *buf, size_t cap, char **items, int max) {
    snprintf(buf, cap, "%s", list);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save))
        items[n++] = t;
    return n;
}

static double checksum(dg_tensor *const *vals) {
    double sum = 0;
    for (int v = 0; v < N_VARS; v++)
        for (int64_t e = 0; e < dg_tensor_num_elements(vals[v]); e++) sum += dg_tensor_f64(vals[v])[e] * (double)(e + 1 + v);
    return sum;
}

int main(int argc, char **argv) {
    const char *master = "dg://localhost:2222", *ps_device = "/job:master/task:0",
               *worker_devices = "/job:worker/task:0,/job:worker_/task:0", *scope = "", *opt_name = "adam";
    int64_t train_steps = 200, batch_size = 64, hidden = 16, seed = 1, log_every = 20, wait_ms = 0;
    double lr = 0.02, tolerance = 1e-9;
    bool read_variables = false;
    const char *ps_hosts = "", *worker_hosts = "";
    flag_def defs[] = {
        {"master", FLAG_STRING, &master, "the master's target (default dg://localhost:2222)"},
        {"ps_device", FLAG_STRING, &ps_device, "where the variables live (default /job:master/task:0)"},
        {"worker_devices", FLAG_STRING, &worker_devices,
         "comma list of the replicas' devices (default /job:worker/task:0,/job:worker_/task:0)"},
        {"scope", FLAG_STRING, &scope, "name scope of this client's nodes and variables (default none)"},
        {"train_steps", FLAG_INT, &train_steps, "steps (default 200)"},
        {"batch_size", FLAG_INT, &batch_size, "examples per step over all replicas (default 64)"},
        {"hidden_units", FLAG_INT, &hidden, "hidden layer width (default 16)"},
        {"optimizer", FLAG_STRING, &opt_name, "adam (default) or sgd"},
        {"learning_rate", FLAG_DOUBLE, &lr, "learning rate (default 0.02)"},
        {"seed", FLAG_INT, &seed, "initialisation and data seed (default 1)"},
        {"log_every", FLAG_INT, &log_every, "print every N steps (default 20)"},
        {"tolerance", FLAG_DOUBLE, &tolerance, "largest relative loss difference called a match (default 1e-9)"},
        {"wait_for_tasks_ms", FLAG_INT, &wait_ms, "how long to wait for servers not up yet (default 0: no limit)"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "comma list of ps addresses: variables on /job:ps/task:0"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "comma list of worker addresses: a replica on each worker task"},
        {"read_variables", FLAG_BOOL, &read_variables,
         "only read the variables (trained by an earlier client) and print their checksum"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: in_graph_replication [flags]", &help))
        return 2;
    if (help) return 0;
    char derived[1024] = "";
    if (*worker_hosts) {   // devices from the cluster flags
        int n_w = 1;
        for (const char *p = worker_hosts; *p; p++) n_w += *p == ',';
        for (int i = 0; i < n_w && i < MAX_REPLICAS; i++) {
            size_t len = strlen(derived);
            snprintf(derived + len, sizeof derived - len, "%s/job:worker/task:%d", i ? "," : "", i);
        }
        worker_devices = derived;
        ps_device = *ps_hosts ? "/job:ps/task:0" : "/job:worker/task:0";
    }
    char dev_buf[1024], *devs[MAX_REPLICAS];
    int n_rep = split(worker_devices, dev_buf, sizeof dev_buf, devs, MAX_REPLICAS);
    if (n_rep < 1 || train_steps < 1 || batch_size < n_rep || batch_size % n_rep != 0 || hidden < 1 || log_every < 1 ||
        (strcmp(opt_name, "adam") != 0 && strcmp(opt_name, "sgd") != 0)) {
        fprintf(stderr, "in_graph_replication: needs 1..%d --worker_devices, positive --train_steps, --hidden_units "
                        "and --log_every, a --batch_size that the replicas share evenly, --optimizer adam or sgd\n",
                MAX_REPLICAS);
        return 2;
    }
    int64_t per = batch_size / n_rep;
    dg_status *st = dg_status_new();
    int rc = 1;
    dg_graph *gd = dg_graph_new(), *gs = NULL;
    dg_session *sd = NULL, *ss = NULL;
    dg_tensor *xt[MAX_REPLICAS] = {0}, *yt[MAX_REPLICAS] = {0}, *xs = NULL, *ys = NULL;
    double *x = malloc(sizeof(double) * (size_t)batch_size), *y = malloc(sizeof(double) * (size_t)batch_size);
    if (!x || !y) abort();

    // ONE graph: variables on the ps device, a tower per replica device, the average and the
    // update back on the ps device.
    dg_graph_set_random_seed(gd, seed);
    if (*scope) dg_graph_push_name_scope(gd, scope);
    dg_output vars[N_VARS];
    dg_graph_push_device(gd, ps_device);
    make_vars(gd, hidden, vars);
    dg_graph_pop_device(gd);
    dg_optimizer opt = strcmp(opt_name, "sgd") == 0 ? dg_gradient_descent(gd, lr) : dg_adam(gd, lr);
    replica reps[MAX_REPLICAS];
    dg_output grads[MAX_REPLICAS][N_VARS], losses[MAX_REPLICAS];
    for (int r = 0; r < n_rep; r++) {
        char name[32];
        snprintf(name, sizeof name, "replica_%d", r);
        dg_graph_push_device(gd, devs[r]);
        dg_graph_push_name_scope(gd, name);
        reps[r] = make_tower(gd, vars);
        dg_output vout[N_VARS];
        int n = dg_optimizer_compute_gradients(&opt, reps[r].loss, vars, N_VARS, grads[r], vout, N_VARS);
        if (n != N_VARS && dg_graph_ok(gd)) {
            fprintf(stderr, "in_graph_replication: %d of %d variables have gradients\n", n, N_VARS);
            goto out;
        }
        dg_graph_pop_name_scope(gd);
        dg_graph_pop_device(gd);
        losses[r] = reps[r].loss;
    }
    dg_graph_push_device(gd, ps_device);
    dg_output avg[N_VARS], inv = dg_scalar(gd, "inv_replicas", DG_FLOAT64, 1.0 / n_rep);
    for (int v = 0; v < N_VARS; v++) {
        dg_output parts[MAX_REPLICAS];
        for (int r = 0; r < n_rep; r++) parts[r] = grads[r][v];
        avg[v] = dg_mul(gd, "average_gradient", dg_add_n(gd, NULL, parts, n_rep), inv);
    }
    dg_node *train = dg_optimizer_apply_gradients(&opt, avg, vars, N_VARS, (dg_output){NULL, 0}, "train");
    dg_output mean_loss = dg_mul(gd, "mean_loss", dg_add_n(gd, NULL, losses, n_rep), inv);
    dg_graph_pop_device(gd);
    dg_node *init = dg_global_variables_initializer(gd);
    if (*scope) dg_graph_pop_name_scope(gd);
    if (!dg_graph_ok(gd)) {
        fail(dg_graph_status(gd), "building the graph");
        goto out;
    }
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 1;
    so.wait_for_tasks_ms = wait_ms;
    if (!(sd = dg_session_new(gd, master, &so, st))) {
        fail(st, "opening a session on the master");
        goto out;
    }
    if (read_variables) {
        dg_tensor *vals[N_VARS] = {0};
        if (!dg_session_run(sd, NULL, NULL, 0, vars, vals, N_VARS, NULL, 0, st)) {
            fail(st, "reading the variables");
            goto out;
        }
        printf("parameter checksum: %.17g\n", checksum(vals));
        for (int v = 0; v < N_VARS; v++) dg_tensor_unref(vals[v]);
        rc = 0;
        goto out;
    }
    if (!dg_session_run_target(sd, init, st)) {
        fail(st, "initializing the variables on the master task");
        goto out;
    }
    // The single-process reference: the same seed and variables, whole batches.
    gs = dg_graph_new();
    dg_graph_set_random_seed(gs, seed);
    if (*scope) dg_graph_push_name_scope(gs, scope);
    dg_output svars[N_VARS];
    make_vars(gs, hidden, svars);
    dg_optimizer sopt = strcmp(opt_name, "sgd") == 0 ? dg_gradient_descent(gs, lr) : dg_adam(gs, lr);
    replica one = make_tower(gs, svars);
    dg_node *strain = dg_optimizer_minimize(&sopt, one.loss, (dg_output){NULL, 0});
    dg_node *sinit = dg_global_variables_initializer(gs);
    if (!dg_graph_ok(gs)) {
        fail(dg_graph_status(gs), "building the single-process graph");
        goto out;
    }
    if (!(ss = dg_session_new(gs, "local", NULL, st)) || !dg_session_run_target(ss, sinit, st)) {
        fail(st, "the single-process session");
        goto out;
    }
    printf("%d replicas (%s), %lld examples per step (%lld each), %s\n", n_rep, worker_devices,
           (long long)batch_size, (long long)per, opt_name);
    printf("%6s  %16s  %16s\n", "step", "loss_distributed", "loss_single");
    double first = NAN, last = NAN, max_rel = 0;
    bool finite = true;
    for (int64_t s = 0; s < train_steps; s++) {
        batch(seed, s, batch_size, x, y);
        dg_output feeds[2 * MAX_REPLICAS];
        dg_tensor *vals[2 * MAX_REPLICAS];
        for (int r = 0; r < n_rep; r++) {
            dg_tensor_unref(xt[r]);
            dg_tensor_unref(yt[r]);
            xt[r] = dg_tensor_from_data(DG_FLOAT64, dg_shape2(per, 1), x + r * per, st);
            yt[r] = dg_tensor_from_data(DG_FLOAT64, dg_shape2(per, 1), y + r * per, st);
            feeds[2 * r] = reps[r].x;
            feeds[2 * r + 1] = reps[r].y;
            vals[2 * r] = xt[r];
            vals[2 * r + 1] = yt[r];
        }
        dg_tensor_unref(xs);
        dg_tensor_unref(ys);
        xs = dg_tensor_from_data(DG_FLOAT64, dg_shape2(batch_size, 1), x, st);
        ys = dg_tensor_from_data(DG_FLOAT64, dg_shape2(batch_size, 1), y, st);
        dg_output sfeeds[2] = {one.x, one.y};
        dg_tensor *svals[2] = {xs, ys}, *ld = NULL, *ls = NULL;
        if (!dg_session_run(sd, feeds, vals, 2 * n_rep, &mean_loss, &ld, 1, &train, 1, st)) {
            fail(st, "distributed step");
            goto out;
        }
        if (!dg_session_run(ss, sfeeds, svals, 2, &one.loss, &ls, 1, &strain, 1, st)) {
            dg_tensor_unref(ld);
            fail(st, "single-process step");
            goto out;
        }
        double a = dg_tensor_f64(ld)[0], b = dg_tensor_f64(ls)[0];
        dg_tensor_unref(ld);
        dg_tensor_unref(ls);
        finite = finite && isfinite(a) && isfinite(b);
        double rel = fabs(a - b) / fmax(fabs(b), 1e-300);
        if (!(rel <= max_rel)) max_rel = rel;   // a NaN sticks
        if (s == 0) first = a;
        last = a;
        if (s % log_every == 0 || s == train_steps - 1) printf("%6lld  %16.10f  %16.10f\n", (long long)s, a, b);
        fflush(stdout);
    }
    dg_tensor *vd[N_VARS] = {0};
    if (!dg_session_run(sd, NULL, NULL, 0, vars, vd, N_VARS, NULL, 0, st)) {
        fail(st, "reading the trained variables");
        goto out;
    }
    printf("parameter checksum: %.17g\n", checksum(vd));
    for (int v = 0; v < N_VARS; v++) dg_tensor_unref(vd[v]);
    printf("loss: first %.6g, last %.6g\n", first, last);
    printf("largest relative loss difference: %.3g\n", max_rel);
    bool match = finite && max_rel <= tolerance && last < first;
    printf("curves match: %s\n", match ? "yes" : "no");
    rc = match ? 0 : 3;
out:
    for (int r = 0; r < MAX_REPLICAS; r++) {
        dg_tensor_unref(xt[r]);
        dg_tensor_unref(yt[r]);
    }
    dg_tensor_unref(xs);
    dg_tensor_unref(ys);
    dg_session_free(&ss);
    dg_session_free(&sd);
    dg_graph_free(&gs);
    dg_graph_free(&gd);
    free(x);
    free(y);
    dg_status_free(&st);
    return rc;
}
