/* pipeline_mlp: a pipeline of equal stages, for measuring a schedule's bubble where the theory
 * holds (docs/PIPELINES.md). Every device holds --layers_per_device dense layers of --width
 * units (x W + b, then GELU), split evenly over its stages (--chunks of them with the
 * interleaved schedule, else one), so every stage's forward and backward pass cost the same;
 * the last stage adds a loss of a few elementwise ops (the mean of the squares of its output),
 * and stage 0 scales its input by a learned vector so that its backward pass, too, computes
 * its input's gradient. One process per device of the pipeline, each a server of the cluster
 * "pipeline|127.0.0.1:P0,...": task 0 (this program with --task_index 0) is stage 0 and the
 * client, the others serve their stages until killed. Task 0 runs --warm steps, traces the
 * last of them (--trace_file, for bench/pipeline_bubble.py), then times --steps steps and
 * prints one JSON line (steps/s, the schedule, the shape). bench/pipeline_bench.sh runs it.
 *   build/bin/pipeline_mlp --cluster pipeline|127.0.0.1:2300,127.0.0.1:2301 --task_index 1 &
 *   build/bin/pipeline_mlp --cluster pipeline|127.0.0.1:2300,127.0.0.1:2301 --task_index 0 \
 *       --schedule 1f1b --micro_batches 8 --trace_file /tmp/p.json */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distgraph/distgraph.h>

#include "flags.h"

typedef struct model {
    int64_t width, layers_per_stage;   // layers_per_stage: --layers_per_device / chunks
    int n_stages;
} model;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(dg_status *st, const char *what) {
    fprintf(stderr, "pipeline_mlp: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

// Stage k: its layers, each GELU(x W + b) with W [width, width]; the last stage's loss is
// mean(y^2). Equal stages: the same ops on the same shapes.
static int stage_fn(dg_graph *g, int stage, int mb, const dg_output *in, int n_in, dg_output *out, int cap, void *arg) {
    (void)mb;
    (void)cap;
    const model *m = arg;
    if (n_in != 1) {
        dg_graph_set_error(g, DG_INTERNAL, "pipeline_mlp stage %d: %d inputs, not 1", stage, n_in);
        return -1;
    }
    dg_output x = in[0];
    // Stage 0 scales its input by a learned vector: its backward pass then computes its input's
    // gradient through its first layer, as every later stage does for the stage before it.
    if (stage == 0)
        x = dg_mul(g, NULL, x, dg_get_variable(g, "input_scale", DG_FLOAT32, dg_shape1(m->width), dg_init_ones()));
    for (int64_t l = stage * m->layers_per_stage; l < (stage + 1) * m->layers_per_stage; l++) {
        char w[32], b[32];
        snprintf(w, sizeof w, "w%lld", (long long)l);
        snprintf(b, sizeof b, "b%lld", (long long)l);
        double std = 1.0 / sqrt((double)m->width);
        dg_output wv = dg_get_variable(g, w, DG_FLOAT32, dg_shape2(m->width, m->width),
                                       dg_init_random_normal(0, std, 100 + l));
        dg_output bv = dg_get_variable(g, b, DG_FLOAT32, dg_shape1(m->width), dg_init_zeros());
        x = dg_gelu(g, NULL, dg_bias_add(g, NULL, dg_matmul(g, NULL, x, wv, false, false), bv), true);
    }
    if (stage == m->n_stages - 1) {
        out[0] = dg_mean(g, "loss", dg_square(g, NULL, x), NULL, 0, false);
        return dg_graph_ok(g) ? 1 : -1;
    }
    out[0] = x;
    return dg_graph_ok(g) ? 1 : -1;
}

int main(int argc, char **argv) {
    const char *spec = "", *schedule = "1f1b", *trace_file = "";
    int64_t task = 0, micro_batches = 8, chunks = 2, width = 256, layers_per_device = 4, batch = 4096, steps = 30,
            warm = 10;
    bool recompute = false, help = false;
    flag_def defs[] = {
        {"cluster", FLAG_STRING, &spec, "the cluster, 'pipeline|HOST:PORT,HOST:PORT,...': one task per device"},
        {"task_index", FLAG_INT, &task, "this process's task: 0 is stage 0 and the client, the others serve"},
        {"schedule", FLAG_STRING, &schedule, "gpipe, 1f1b, interleaved or zb-h1"},
        {"micro_batches", FLAG_INT, &micro_batches, "m: micro-batches a step (1: the naive split)"},
        {"chunks", FLAG_INT, &chunks, "stages per device with --schedule interleaved"},
        {"width", FLAG_INT, &width, "units of every layer"},
        {"layers_per_device", FLAG_INT, &layers_per_device, "dense layers on each device (divisible by its stages)"},
        {"batch", FLAG_INT, &batch, "rows a step (divisible by --micro_batches)"},
        {"steps", FLAG_INT, &steps, "timed steps"},
        {"warm", FLAG_INT, &warm, "steps before timing; the last one is traced"},
        {"recompute", FLAG_BOOL, &recompute, "recompute each stage's forward pass in its backward pass"},
        {"trace_file", FLAG_STRING, &trace_file, "write the traced step here (Chrome trace events)"},
    };
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: pipeline_mlp --cluster SPEC --task_index K [flags]",
                     &help))
        return 2;
    if (help) return 0;
    dg_pipeline_schedule sch;
    if (!*spec || !dg_pipeline_schedule_parse(schedule, &sch) || micro_batches < 1 || width < 1 ||
        layers_per_device < 1 || batch < 1 || batch % micro_batches != 0 || steps < 1 || warm < 1 || chunks < 1) {
        fprintf(stderr, "pipeline_mlp: --cluster is required; --schedule gpipe|1f1b|interleaved|zb-h1; --batch a "
                        "multiple of --micro_batches; sizes, --steps and --warm at least 1\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    if (!c) return die(st, "--cluster");
    int n_dev = dg_cluster_num_tasks(c, "pipeline");
    if (n_dev < 1 || task < 0 || task >= n_dev) {
        fprintf(stderr, "pipeline_mlp: --cluster needs a job 'pipeline' with --task_index among its tasks\n");
        return 2;
    }
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *server = dg_server_new(c, "pipeline", (int)task, &so, st);
    if (!server) return die(st, "server");
    if (task > 0) return dg_server_join(server, true, st) ? 0 : die(st, "server");

    int v = sch == DG_PIPELINE_INTERLEAVED_1F1B ? (int)chunks : 1;
    if (layers_per_device % v != 0) {
        fprintf(stderr, "pipeline_mlp: --layers_per_device %lld does not divide into %d stages a device\n",
                (long long)layers_per_device, v);
        return 2;
    }
    model m = {width, layers_per_device / v, n_dev * v};
    char names[64][48];
    const char *devs[64];
    if (n_dev > 64) {
        fprintf(stderr, "pipeline_mlp: at most 64 tasks\n");
        return 2;
    }
    for (int d = 0; d < n_dev; d++) {
        snprintf(names[d], sizeof names[d], "/job:pipeline/task:%d", d);
        devs[d] = names[d];
    }
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(batch, width));
    dg_pipeline_options o = dg_pipeline_options_default();
    o.devices = devs;
    o.n_devices = n_dev;
    o.chunks = v;
    o.micro_batches = (int)micro_batches;
    o.schedule = sch;
    o.recompute = recompute;
    o.stage_fn = stage_fn;
    o.arg = &m;
    dg_pipeline p;
    if (!dg_pipeline_build(g, &o, &x, 1, &p, st)) return die(st, "pipeline");
    dg_optimizer opt = dg_gradient_descent(g, 1e-3);
    dg_node *train = dg_optimizer_apply_gradients(&opt, p.grads, p.vars, p.n_vars, (dg_output){0}, "train");
    dg_node *init = dg_global_variables_initializer(g);
    if (!train || !init || !dg_graph_check(g, st)) return die(st, "graph");
    dg_session *s = dg_session_new(g, dg_server_target(server), NULL, st);
    if (!s || !dg_session_run_target(s, init, st)) return die(st, "session");
    dg_tensor *xt = dg_tensor_new(DG_FLOAT32, dg_shape2(batch, width), st);
    if (!xt) return die(st, "input");
    float *xv = dg_tensor_f32(xt);
    for (int64_t i = 0; i < batch * width; i++) xv[i] = (float)sin(0.37 * (double)i + 0.1);
    dg_tensor *loss = NULL;
    double first = NAN, t0 = 0;
    for (int64_t i = 0; i < warm + steps; i++) {
        if (i == warm) t0 = now_s();
        dg_run_options ro = {.trace = i == warm - 1 && *trace_file};
        dg_step_trace *tr = NULL;
        dg_tensor_unref(loss);
        loss = NULL;
        if (!dg_session_run_with_options(s, &ro, &x, &xt, 1, &p.loss, &loss, 1, &train, 1, ro.trace ? &tr : NULL, st))
            return die(st, "step");
        if (i == 0) first = dg_tensor_f32(loss)[0];
        if (tr && !dg_step_trace_write_chrome(tr, trace_file, st)) return die(st, "--trace_file");
        dg_step_trace_free(&tr);
    }
    double rate = (double)steps / (now_s() - t0), last = dg_tensor_f32(loss)[0];
    // A step that trains: the loss must fall (a NaN fails this too).
    if (!(last < first)) {
        fprintf(stderr, "pipeline_mlp: the loss went from %g to %g in %lld steps: not training\n", first, last,
                (long long)(warm + steps));
        return 1;
    }
    printf("{\"bench\": \"pipeline_mlp\", \"stages\": %d, \"chunks\": %d, \"micro_batches\": %lld, \"schedule\": \"%s\", "
           "\"recompute\": %s, \"width\": %lld, \"layers_per_device\": %lld, \"batch\": %lld, \"steps\": %lld, "
           "\"steps_per_s\": %.3f, \"loss_first\": %.6g, \"loss_last\": %.6g}\n",
           n_dev, v, (long long)micro_batches, dg_pipeline_schedule_name(sch), recompute ? "true" : "false",
           (long long)width, (long long)layers_per_device, (long long)batch, (long long)steps, rate, first, last);
    dg_tensor_unref(loss);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_pipeline_free(&p);
    dg_graph_free(&g);
    dg_server_free(&server);
    dg_cluster_free(&c);
    dg_status_free(&st);
    return 0;
}
