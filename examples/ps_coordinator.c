/* ps_coordinator: TensorFlow 2's parameter-server training with a cluster coordinator
 * (ParameterServerStrategy + ClusterCoordinator), on standing dg-server tasks. This one
 * process is the coordinator: it builds the MNIST-replica model once per worker (variables on
 * the ps tasks by the replica device setter, compute on that worker), opens a session on each
 * worker task's master service, initializes the variables, and schedules --train_steps
 * training steps: each step is a closure that runs on whichever worker is free. When a worker
 * fails (killed, unreachable), the step it was running goes back into the queue, the worker is
 * dropped, and the others finish the work. At the end it evaluates the ps's variables on the
 * test set through a live worker.
 *   build/bin/dg-server --cluster_spec 'ps|127.0.0.1:2222;worker|127.0.0.1:2223,127.0.0.1:2224,127.0.0.1:2225' \
 *       --job_name ps --task_index 0 &        (and each worker task)
 *   build/bin/ps_coordinator --ps_hosts 127.0.0.1:2222 \
 *       --worker_hosts 127.0.0.1:2223,127.0.0.1:2224,127.0.0.1:2225 --train_steps 3000
 * or all at once: build/bin/dg-launch --ps 1 --workers 3 --mode standing -- build/bin/ps_coordinator */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "mlp_model.h"
#include "mnist_data.h"

#define MAX_WORKERS 64

typedef struct coordinator coordinator;

typedef struct worker {
    coordinator *c;
    int index;
    char target[300];
    dg_graph *g;
    mlp_model m;
    dg_device_fn *setter;
    dg_session *s;
    bool alive;
    int64_t steps_done;
    pthread_t thread;
} worker;

struct coordinator {
    pthread_mutex_t mu;
    pthread_cond_t cv;       // a closure came back or the last one in flight ended
    int64_t in_flight;
    int64_t next_step, total, done, rescheduled;   // closures: next to hand out, all, finished
    int64_t *returned;       // closures of failed workers, to run again
    int n_returned;
    mnist_dataset data;
    int64_t batch;
    int log_every;
    worker workers[MAX_WORKERS];
    int n_workers, n_alive;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The next closure to run, or -1 when none is left. While closures are in flight on other
// workers it waits: one of them may fail and come back.
static int64_t take(coordinator *c) {
    pthread_mutex_lock(&c->mu);
    int64_t k = -1;
    for (;;) {
        if (c->n_returned > 0) k = c->returned[--c->n_returned];
        else if (c->next_step < c->total) k = c->next_step++;
        if (k >= 0 || c->in_flight == 0) break;
        pthread_cond_wait(&c->cv, &c->mu);
    }
    if (k >= 0) c->in_flight++;
    pthread_mutex_unlock(&c->mu);
    return k;
}

// Closure k ended (ok) or goes back to the queue.
static void finish(coordinator *c, int64_t k, bool ok) {
    pthread_mutex_lock(&c->mu);
    c->in_flight--;
    if (!ok) {
        c->returned[c->n_returned++] = k;
        c->rescheduled++;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    coordinator *c = w->c;
    int64_t dim = c->data.train.dim;
    float *x = malloc((size_t)(c->batch * dim) * sizeof *x);
    int64_t *y = malloc((size_t)c->batch * sizeof *y);
    dg_status *st = dg_status_new();
    dg_tensor *xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(c->batch, dim), x, (size_t)(c->batch * dim) * sizeof *x,
                                   NULL, NULL, st);
    dg_tensor *yt = dg_tensor_wrap(DG_INT64, dg_shape1(c->batch), y, (size_t)c->batch * sizeof *y, NULL, NULL, st);
    for (int64_t k; xt && yt && (k = take(c)) >= 0;) {
        pthread_mutex_lock(&c->mu);
        mnist_next_batch(&c->data.train, c->batch, x, y);   // the coordinator's one input stream
        pthread_mutex_unlock(&c->mu);
        dg_output feeds[2] = {w->m.x, w->m.y_};
        dg_tensor *vals[2] = {xt, yt}, *gs = NULL;
        if (!dg_session_run(w->s, feeds, vals, 2, &w->m.global_step, &gs, 1, &w->m.train, 1, st)) {
            // The closure goes back; this worker is done for.
            finish(c, k, false);
            pthread_mutex_lock(&c->mu);
            c->n_alive--;
            w->alive = false;
            int left = c->n_alive;
            pthread_mutex_unlock(&c->mu);
            printf("Coordinator: worker %d failed (%s: %s); its step goes to the %d others\n", w->index,
                   dg_code_name(dg_status_code(st)), dg_status_message(st), left);
            fflush(stdout);
            break;
        }
        int64_t global = dg_tensor_i64(gs)[0];
        dg_tensor_unref(gs);
        w->steps_done++;
        finish(c, k, true);
        pthread_mutex_lock(&c->mu);
        int64_t done = ++c->done;
        pthread_mutex_unlock(&c->mu);
        if (done % c->log_every == 0) {
            printf("Coordinator: %lld of %lld steps done (global step %lld)\n", (long long)done, (long long)c->total,
                   (long long)global);
            fflush(stdout);
        }
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    free(x);
    free(y);
    dg_status_free(&st);
    return NULL;
}

static int fail(dg_status *st, const char *what) {
    fprintf(stderr, "ps_coordinator: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

int main(int argc, char **argv) {
    const char *ps_hosts = "", *worker_hosts = "", *data_dir = MNIST_DEFAULT_DIR, *master = "";
    int64_t train_steps = 3000, batch_size = 100, hidden = 100, seed = 1, log_every = 500;
    double lr = 0.01;
    flag_def defs[] = {
        {"ps_hosts", FLAG_STRING, &ps_hosts, "comma list of host:port of the standing ps tasks"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "comma list of host:port of the standing worker tasks"},
        {"master", FLAG_STRING, &master, "accepted for dg-launch --mode standing; unused (each worker's own master is used)"},
        {"train_steps", FLAG_INT, &train_steps, "training steps to schedule (default 3000)"},
        {"batch_size", FLAG_INT, &batch_size, "examples per step (default 100)"},
        {"hidden_units", FLAG_INT, &hidden, "hidden layer width (default 100)"},
        {"learning_rate", FLAG_DOUBLE, &lr, "Adam learning rate (default 0.01)"},
        {"data_dir", FLAG_STRING, &data_dir, "IDX files (default " MNIST_DEFAULT_DIR ")"},
        {"seed", FLAG_INT, &seed, "initialisation and shuffling seed (default 1)"},
        {"log_every", FLAG_INT, &log_every, "progress line every N finished steps (default 500)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: ps_coordinator [flags]", &help))
        return 2;
    if (help) return 0;
    (void)master;
    if (train_steps < 1 || batch_size < 1 || batch_size > 60000 || hidden < 1 || log_every < 1) {
        fprintf(stderr, "ps_coordinator: --train_steps, --batch_size, --hidden_units and --log_every must be "
                        "positive (batch at most 60000)\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_cluster *cluster = dg_cluster_from_flags(ps_hosts, worker_hosts, st);
    if (!cluster) return fail(st, "cluster (give --ps_hosts and --worker_hosts)");
    coordinator *c = calloc(1, sizeof *c);
    if (!c) abort();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->total = train_steps;
    c->batch = batch_size;
    c->log_every = (int)log_every;
    c->n_workers = dg_cluster_num_tasks(cluster, "worker");
    c->returned = calloc((size_t)c->n_workers + 1, sizeof *c->returned);
    int rc = 1;
    if (c->n_workers < 1 || c->n_workers > MAX_WORKERS) {
        fprintf(stderr, "ps_coordinator: needs 1..%d workers, got %d\n", MAX_WORKERS, c->n_workers);
        rc = 2;
        goto out;
    }
    if (!mnist_load(data_dir, (uint64_t)seed, &c->data, st)) {
        fail(st, "loading data");
        goto out;
    }
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 1;
    for (int i = 0; i < c->n_workers; i++) {
        worker *w = &c->workers[i];
        w->c = c;
        w->index = i;
        const char *addr = dg_cluster_task_address(cluster, "worker", i, st);
        if (!addr) {
            fail(st, "a worker's address");
            goto out;
        }
        snprintf(w->target, sizeof w->target, "dg://%s", addr);
        // The same model for every worker: variables (same names, so the same ones on the ps)
        // placed by the replica device setter, compute on this worker.
        char dev[64];
        snprintf(dev, sizeof dev, "/job:worker/task:%d", i);
        dg_replica_device_setter_options ro = dg_replica_device_setter_options_default();
        ro.cluster = cluster;
        ro.worker_device = dev;
        w->g = dg_graph_new();
        if (!(w->setter = dg_replica_device_setter_new(&ro, st))) {
            fail(st, "replica device setter");
            goto out;
        }
        dg_graph_push_device_fn(w->g, w->setter);
        if (!mlp_build(w->g, c->data.train.dim, hidden, lr, seed, &w->m, st)) {
            fail(st, "building the model");
            goto out;
        }
        dg_graph_pop_device_fn(w->g);
        if (!(w->s = dg_session_new(w->g, w->target, &so, st))) {
            fail(st, "opening a session on a worker");
            goto out;
        }
        w->alive = true;
        c->n_alive++;
    }
    if (!dg_session_run_target(c->workers[0].s, c->workers[0].m.init, st)) {
        fail(st, "initializing the variables");
        goto out;
    }
    printf("Coordinator: %d workers, %lld steps of %lld examples\n", c->n_workers, (long long)train_steps,
           (long long)batch_size);
    fflush(stdout);
    double t0 = now_s();
    printf("Training begins @ %f\n", t0);
    for (int i = 0; i < c->n_workers; i++) pthread_create(&c->workers[i].thread, NULL, worker_main, &c->workers[i]);
    for (int i = 0; i < c->n_workers; i++) pthread_join(c->workers[i].thread, NULL);
    double t1 = now_s();
    printf("Training ends @ %f\n", t1);
    for (int i = 0; i < c->n_workers; i++)
        printf("Coordinator: worker %d ran %lld steps%s\n", i, (long long)c->workers[i].steps_done,
               c->workers[i].alive ? "" : " (failed)");
    printf("Coordinator: %lld of %lld steps done in %.2f s (%.1f steps/s), %lld rescheduled after failures\n",
           (long long)c->done, (long long)c->total, t1 - t0, (double)c->done / (t1 - t0), (long long)c->rescheduled);
    if (c->done != c->total) {
        fprintf(stderr, "ps_coordinator: every worker failed; %lld steps were not run\n",
                (long long)(c->total - c->done));
        goto out;
    }
    worker *live = NULL;
    for (int i = 0; i < c->n_workers && !live; i++)
        if (c->workers[i].alive) live = &c->workers[i];
    double loss = 0, acc = 0;
    if (!mlp_evaluate(live->s, &live->m, c->data.test.images, c->data.test.labels, c->data.test.n, c->data.test.dim,
                      1000, &loss, &acc, st)) {
        fail(st, "evaluating");
        goto out;
    }
    printf("After %lld training step(s), validation cross entropy = %g\n", (long long)c->done, loss);
    printf("Coordinator: validation accuracy = %.4f (on the %lld test images)\n", acc, (long long)c->data.test.n);
    rc = 0;
out:
    fflush(stdout);
    for (int i = 0; i < c->n_workers && i < MAX_WORKERS; i++) {
        worker *w = &c->workers[i];
        dg_session_free(&w->s);
        dg_graph_free(&w->g);
        dg_device_fn_free(&w->setter);
    }
    mnist_free(&c->data);
    free(c->returned);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    dg_cluster_free(&cluster);
    dg_status_free(&st);
    return rc;
}
