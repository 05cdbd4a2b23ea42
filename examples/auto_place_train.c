/* auto_place_train: a model without a single device scope, placed over two tasks by the
 * automatic placer (dg_session_options.auto_place), or by hand as an expert splits it (its
 * layers in two halves, one per task, gradients beside their ops); trained on the same random
 * batches either way. Prints the median step time, the placer's prediction of it, where the ops
 * went and the loss at the first and last step. First (--profile split, the default) it runs
 * traced steps of the model on the expert's split (dg_step_traces_measure: each op's median
 * time and, between two tasks, the link's latency under load): the placer and the predictions
 * then use those figures.
 *   --model transformer|inception|gnmt, --placement auto|manual
 *   build/bin/dg-launch --ps 1 --workers 1 -- build/bin/auto_place_train --placement auto
 *   build/bin/auto_place_train --local --placement auto        (two CPUs of one process)
 * The worker task trains; the second task only holds and runs its part, so it runs as a "ps"
 * task (dg-launch stops it when the worker is done). bench/auto_place_e2e.sh compares the two
 * placements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "flags.h"
#include "place_models.h"

// The two devices: the CPUs of the two tasks, or (--local) two CPUs of this process; the
// scopes that ask for them.
static const char *const TASK_DEVICES[2] = {"/job:worker/replica:0/task:0/device:CPU:0",
                                            "/job:ps/replica:0/task:0/device:CPU:0"};
static const char *const TASK_SCOPES[2] = {"/job:worker/task:0", "/job:ps/task:0"};
static const char *const LOCAL_DEVICES[2] = {"/job:worker/replica:0/task:0/device:CPU:0",
                                             "/job:worker/replica:0/task:0/device:CPU:1"};
static const char *const LOCAL_SCOPES[2] = {"/job:worker/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:1"};
static const char *const *DEVICES = TASK_DEVICES, *const *SCOPES = TASK_SCOPES;

typedef struct split {
    const place_model_config *c;
} split;

// The expert's split: units in order, the first half on the first device, the rest on the other.
static const char *unit_task(void *ctx, int unit) {
    split *s = ctx;
    return SCOPES[place_model_expert_device(s->c, unit, 2) == 0 ? 0 : 1];
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// A port of 127.0.0.1 free now (the kernel's pick for a socket bound to port 0); -1 if none.
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static uint64_t next_u64(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

// Random values for every placeholder the step needs: ints below the vocabulary (labels below
// 1000 for the CNN), floats in [-1, 1).
static int feeds_make(dg_node **step, int n_step, const place_model_config *c, dg_output *feeds, dg_tensor **vals,
                      int max, dg_status *st) {
    int n = 0;
    uint64_t rng = 42;
    for (int i = 0; i < n_step && n < max; i++) {
        if (strcmp(dg_node_op_type(step[i]), "Placeholder") != 0) continue;
        dg_output o = {step[i], 0};
        dg_shape sh = dg_output_shape(o);
        dg_tensor *t = dg_tensor_new(dg_output_dtype(o), sh, st);
        if (!t) return -1;
        int64_t e = dg_shape_num_elements(&sh);
        if (dg_output_dtype(o) == DG_INT32) {
            int32_t *v = dg_tensor_data(t);
            int64_t hi = c->kind == PLACE_INCEPTION ? 1000 : c->vocab;
            for (int64_t k = 0; k < e; k++) v[k] = (int32_t)(next_u64(&rng) % (uint64_t)hi);
        } else {
            float *v = dg_tensor_data(t);
            for (int64_t k = 0; k < e; k++) v[k] = (float)((double)(next_u64(&rng) >> 11) / 4503599627370496.0 - 1.0);
        }
        feeds[n] = o;
        vals[n++] = t;
    }
    return n;
}

// Runs the model, built again, on target with session options so (split_it: the expert's split
// over the two devices, else nothing asked for): warm-up steps, then traced ones whose kernel
// times (each op's median) and transfers between tasks go into cost. Returns the ops measured; -1
// on error.
static int profile_model(const place_model_config *c, const char *target, bool split_it, const dg_session_options *so,
                         const dg_output *feeds_in, dg_tensor *const *vals, int n_feeds, dg_cost_model *cost,
                         dg_status *st) {
    dg_graph *g = dg_graph_new();
    dg_output loss;
    split sp = {c};
    dg_node *train = place_model_build(g, c, split_it ? unit_task : NULL, &sp, &loss);
    dg_session *s = train ? dg_session_new(g, target, so, st) : NULL;
    int n = -1;
    dg_output *feeds = malloc(((size_t)n_feeds + 1) * sizeof *feeds);
    bool ok = s && feeds && dg_session_run_target(s, dg_global_variables_initializer(g), st);
    // The same placeholders by name in this graph.
    for (int i = 0; ok && i < n_feeds; i++) {
        feeds[i] = (dg_output){dg_graph_find(g, dg_node_name(feeds_in[i].node)), 0};
        ok = feeds[i].node != NULL;
    }
    // PROFILE_WARM untraced steps (allocations settle), then PROFILE_TRACED traced ones: each op's
    // median time over them goes into the cost model.
    enum { PROFILE_WARM = 3, PROFILE_TRACED = 5 };
    dg_step_trace *traces[PROFILE_TRACED] = {NULL};
    dg_run_options ro = {.trace = true};
    for (int k = 0; ok && k < PROFILE_WARM + PROFILE_TRACED; k++) {
        bool traced = k >= PROFILE_WARM;
        ok = dg_session_run_with_options(s, traced ? &ro : NULL, feeds, vals, n_feeds, NULL, NULL, 0, &train, 1,
                                         traced ? &traces[k - PROFILE_WARM] : NULL, st);
        if (ok && traced && !traces[k - PROFILE_WARM]) {
            dg_status_set(st, DG_INTERNAL, "no trace of the profiled step");
            ok = false;
        }
    }
    if (ok) n = dg_step_traces_measure((const dg_step_trace *const *)traces, PROFILE_TRACED, cost, st);
    else if (!train && dg_status_ok(st)) dg_status_set(st, DG_INTERNAL, "no trace of the profiled step");
    for (int k = 0; k < PROFILE_TRACED; k++) dg_step_trace_free(&traces[k]);
    free(feeds);
    dg_session_free(&s);
    dg_graph_free(&g);
    return n;
}

int main(int argc, char **argv) {
    const char *job = "worker", *worker_hosts = "", *ps_hosts = "", *model = "transformer", *placement = "auto",
               *cost_file = "", *trace_path = "";
    int64_t task_index = 0, steps = 30, layers = 0, length = 0, vocab = 0, units = 0, batch = 0;
    bool quiet = false, local = false;
    const char *profile = "split";
    char profiled[64] = "";
    flag_def defs[] = {
        {"model", FLAG_STRING, &model, "transformer, inception or gnmt"},
        {"placement", FLAG_STRING, &placement, "auto (the automatic placer) or manual (the expert's halves)"},
        {"job_name", FLAG_STRING, &job, "worker (trains) or ps (holds its part)"},
        {"task_index", FLAG_INT, &task_index, "0"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "one host:port"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "one host:port"},
        {"train_steps", FLAG_INT, &steps, "steps; the median step is over those after the fifth"},
        {"layers", FLAG_INT, &layers, "blocks / modules / LSTM layers (0: the model's small default)"},
        {"length", FLAG_INT, &length, "sequence length, or image side (0: default)"},
        {"vocab", FLAG_INT, &vocab, "vocabulary (0: default)"},
        {"units", FLAG_INT, &units, "width, or input channels (0: default)"},
        {"batch", FLAG_INT, &batch, "batch (0: default)"},
        {"cost", FLAG_STRING, &cost_file, "a calibration (dg-inspect calibrate) for the placer and the prediction"},
        {"trace", FLAG_STRING, &trace_path, "write the last step's timeline here (Chrome trace-event JSON)"},
        {"profile", FLAG_STRING, &profile, "split (a traced step on the expert's split: op and link times), local (op "
                                           "times on one CPU) or none; the placer and the prediction use them"},
        {"local", FLAG_BOOL, &local, "two CPUs of this process (a server of one task with a virtual CPU) "
                                     "instead of two tasks"},
        {"quiet", FLAG_BOOL, &quiet, "no server log lines"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: auto_place_train [flags]", &help)) return 2;
    if (help) return 0;
    place_model_config c;
    if (strcmp(model, "transformer") == 0) c = (place_model_config){PLACE_TRANSFORMER, 8, 4, 64, 1000, 128};
    else if (strcmp(model, "inception") == 0) c = (place_model_config){PLACE_INCEPTION, 4, 4, 9, 0, 32};
    else if (strcmp(model, "gnmt") == 0) c = (place_model_config){PLACE_GNMT, 16, 2, 8, 1000, 128};
    else {
        fprintf(stderr, "auto_place_train: --model must be transformer, inception or gnmt\n");
        return 2;
    }
    if (layers) c.layers = layers;
    if (length) c.length = length;
    if (vocab) c.vocab = vocab;
    if (units) c.units = units;
    if (batch) c.batch = batch;
    bool manual = strcmp(placement, "manual") == 0;
    if (strcmp(profile, "split") && strcmp(profile, "local") && strcmp(profile, "none")) {
        fprintf(stderr, "auto_place_train: --profile must be split, local or none\n");
        return 2;
    }
    if ((!manual && strcmp(placement, "auto") != 0) || steps < 6 || c.layers < 1 || c.length < 1 || c.units < 1 ||
        c.batch < 1 || (c.kind != PLACE_INCEPTION && c.vocab < 2) || c.length > 4096 || c.layers > 16) {
        fprintf(stderr, "auto_place_train: --placement auto|manual; train_steps >= 6; sizes positive (layers <= 16, "
                        "length <= 4096)\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_cluster *cl = NULL;
    dg_server *server = NULL;
    // --profile local: a local session on one CPU, one thread.
    dg_session_options local_opts = dg_session_options_default();
    local_opts.inter_op_threads = 1;
    local_opts.intra_op_threads = 1;
    // The timed runs and the split profile: with --local, two inter-op threads the two devices
    // share; over two tasks, one process per core with one inter-op thread each (the default, a
    // thread per core in each process, would put four threads on the two cores the tasks share).
    dg_session_options run_opts = dg_session_options_default();
    run_opts.inter_op_threads = local ? 2 : 1;
    if (local) {
        // Two CPUs of this process: a server of one task, on a free port of 127.0.0.1, with a
        // virtual CPU beside its CPU:0 (the master compiles both devices' partitions into one
        // executable on its threads, which the devices share).
        DEVICES = LOCAL_DEVICES;
        SCOPES = LOCAL_SCOPES;
        int port = free_port();
        char spec[64];
        snprintf(spec, sizeof spec, "worker|127.0.0.1:%d", port);
        cl = port > 0 ? dg_cluster_from_spec_string(spec, st) : NULL;
        dg_server_options so = dg_server_options_default();
        so.quiet = true;
        so.n_virtual_cpus = 1;
        server = cl ? dg_server_new(cl, "worker", 0, &so, st) : NULL;
        if (!server) {
            fprintf(stderr, "auto_place_train: a server for --local: %s\n",
                    port > 0 ? dg_status_message(st) : "no free port on 127.0.0.1");
            dg_cluster_free(&cl);
            dg_status_free(&st);
            return 1;
        }
    } else {
        cl = dg_cluster_from_flags(ps_hosts, worker_hosts, st);
        if (!cl || dg_cluster_num_tasks(cl, "worker") != 1 || dg_cluster_num_tasks(cl, "ps") != 1 ||
            (strcmp(job, "worker") && strcmp(job, "ps")) || task_index != 0) {
            fprintf(stderr, "auto_place_train: needs one worker and one ps task (--worker_hosts, --ps_hosts, "
                            "--job_name worker|ps, --task_index 0), or --local%s%s\n", cl ? "" : ": ",
                    cl ? "" : dg_status_message(st));
            return 2;
        }
        dg_server_options so = dg_server_options_default();
        so.quiet = quiet;
        server = dg_server_new(cl, job, 0, &so, st);
        if (!server) {
            fprintf(stderr, "auto_place_train: %s\n", dg_status_message(st));
            return 1;
        }
    }
    const char *target = dg_server_target(server);
    int rc = 1;
    if (!local && strcmp(job, "ps") == 0) {   // the second task only holds and runs its part
        dg_server_join(server, true, st);
        rc = 0;
        goto done;
    }
    dg_graph *g = dg_graph_new();
    split sp = {&c};
    dg_output loss;
    dg_node *train = place_model_build(g, &c, manual ? unit_task : NULL, &sp, &loss);
    dg_cost_model *cost = dg_cost_model_new();
    dg_session *s = NULL;
    int n_step = 0, n_feeds = 0;
    dg_node **step = NULL;
    dg_output feeds[4096 * 3 + 8];
    dg_tensor *vals[4096 * 3 + 8];
    double *ms = calloc((size_t)steps, sizeof *ms), first = NAN, last = NAN;
    if (!train) {
        fprintf(stderr, "auto_place_train: building the model: %s\n", dg_status_message(dg_graph_status(g)));
        goto out;
    }
    // A task's CPUs run on its inter-op threads (run_opts: with --local two, which both CPUs
    // share; over two tasks one each): that many streams a task's CPUs share, run by the
    // executor's rule once the profile has measured it, in the predictions and for the placer
    // (the profile written below carries them to the session).
    if ((cost_file[0] && !dg_cost_model_load(cost, cost_file, st)) || (cl && !dg_cost_model_set_hosts(cost, cl, st)) ||
        !dg_cost_model_set_task_streams(cost, "CPU", run_opts.inter_op_threads, st)) {
        fprintf(stderr, "auto_place_train: %s\n", dg_status_message(st));
        goto out;
    }
    step = place_model_step_nodes(g, &train, 1, &n_step);
    n_feeds = feeds_make(step, n_step, &c, feeds, vals, (int)(sizeof feeds / sizeof *feeds), st);
    if (n_feeds < 0) goto out;
    // Profile: the same model in this process on one CPU, a traced step's kernel times into the
    // cost model, which the placer and the predictions then use.
    if (strcmp(profile, "none") != 0) {
        bool on_one = strcmp(profile, "local") == 0;
        int measured = profile_model(&c, on_one ? "local" : target, !on_one, on_one ? &local_opts : &run_opts,
                                     feeds, vals, n_feeds, cost, st);
        if (measured < 0) {
            fprintf(stderr, "auto_place_train: profiling: %s\n", dg_status_message(st));
            goto out;
        }
        snprintf(profiled, sizeof profiled, "/tmp/auto_place_train_XXXXXX");
        int fd = mkstemp(profiled);
        if (fd < 0 || (close(fd), !dg_cost_model_save(cost, profiled, st))) {
            fprintf(stderr, "auto_place_train: writing the profile: %s\n", fd < 0 ? "mkstemp failed" : dg_status_message(st));
            goto out;
        }
        dg_link_perf lk = dg_cost_model_link(cost, local ? DG_LINK_SAME_TASK : DG_LINK_SAME_HOST);
        printf("profiled %d ops (%s); link between the devices: %.1f us + %.2f GB/s (%s); a thread wakes in %.1f us\n",
               measured, on_one ? "on one CPU" : "on the expert's split", lk.latency_s * 1e6, lk.bytes_per_s / 1e9,
               local || on_one ? "calibrated" : "latency measured under load", dg_cost_model_wake(cost, "CPU") * 1e6);
    }
    dg_session_options o = run_opts;
    o.auto_place = !manual;
    o.auto_place_cost_file = profiled[0] ? profiled : cost_file[0] ? cost_file : NULL;
    s = dg_session_new(g, target, &o, st);
    if (!s || !dg_session_run_target(s, dg_global_variables_initializer(g), st)) {
        fprintf(stderr, "auto_place_train: %s\n", dg_status_message(st));
        goto out;
    }
    printf("%s, %s placement over 2 %s: %d ops a step\n", place_model_name(c.kind), placement,
           local ? "CPUs of this process" : "tasks", n_step);
    for (int64_t k = 0; k < steps; k++) {
        struct timespec t0, t1;
        dg_tensor *lv = NULL;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        dg_run_options ro = {.trace = trace_path[0] && k == steps - 1};
        dg_step_trace *tr = NULL;
        if (!dg_session_run_with_options(s, &ro, feeds, vals, n_feeds, &loss, &lv, 1, &train, 1, &tr, st)) {
            fprintf(stderr, "auto_place_train: step %lld: %s\n", (long long)k, dg_status_message(st));
            goto out;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (tr && !dg_step_trace_write_chrome(tr, trace_path, st))
            fprintf(stderr, "auto_place_train: %s\n", dg_status_message(st));
        dg_step_trace_free(&tr);
        ms[k] = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        last = dg_tensor_f32(lv)[0];
        if (k == 0) first = last;
        dg_tensor_unref(lv);
    }
    // Where the ops went, and what the cost model predicted for this placement.
    // Fed placeholders are not placed (their values come from the client): left out.
    int on_worker = 0, n_placed = 0;
    for (int i = 0; i < n_step; i++) {
        const char *d = dg_node_assigned_device(step[i]);
        on_worker += strcmp(d, DEVICES[0]) == 0;
        if (d[0]) step[n_placed++] = step[i];
    }
    dg_step_estimate est;
    double predicted = -1;
    if (dg_simulate_step(step, n_placed, DEVICES, 2, cost, &est, st)) {
        predicted = est.step_s * 1e3;
        dg_step_estimate_clear(&est);
    } else {
        fprintf(stderr, "auto_place_train: predicting: %s\n", dg_status_message(st));
    }
    qsort(ms + 5, (size_t)(steps - 5), sizeof *ms, cmp_double);
    double median = ms[5 + (steps - 5) / 2];
    printf("ops: %d on the %s, %d on the %s\n", on_worker, local ? "first CPU" : "worker", n_placed - on_worker,
           local ? "second CPU" : "ps task");
    printf("loss: first %.6f, last %.6f\n", first, last);
    printf("step: median %.3f ms over %lld steps, predicted %.3f ms\n", median, (long long)(steps - 5), predicted);
    rc = isfinite(first) && isfinite(last) && last < first ? 0 : 3;
    if (rc) fprintf(stderr, "auto_place_train: the loss did not fall (%g -> %g)\n", first, last);
out:
    if (profiled[0]) unlink(profiled);
    for (int i = 0; i < n_feeds; i++) dg_tensor_unref(vals[i]);
    free(step);
    free(ms);
    dg_session_free(&s);
    dg_cost_model_free(&cost);
    dg_graph_free(&g);
done:
    dg_server_free(&server);
    dg_cluster_free(&cl);
    dg_status_free(&st);
    return rc;
}
