/* remote_step_bench: what a step through a remote master costs. A trivial graph (a float32
 * scalar fed, x + 1 fetched, pinned to --device) is run --steps times through a session on
 * --target (a standing dg-server: the client/master split over TCP), and the same graph in a
 * local session for reference. JSON lines:
 *   {"bench": "remote_step_bench", "metric": "trivial_step_us", "impl": "distgraph", "value": median, ...}
 *   build/bin/dg-server --cluster_spec 'worker|127.0.0.1:2223' --job_name worker --task_index 0 &
 *   build/bin/remote_step_bench --target dg://127.0.0.1:2223 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distgraph/distgraph.h>

#include "flags.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Times n steps of s after warm-up steps; fills median, p90, mean (us). Returns false on error.
static bool time_steps(dg_session *s, dg_output x, dg_output y, int64_t n, int64_t warm, double *med, double *p90,
                       double *mean, dg_status *st) {
    dg_tensor *xt = dg_tensor_new(DG_FLOAT32, dg_shape_scalar(), st);
    double *t = malloc((size_t)n * sizeof *t), sum = 0;
    bool ok = xt && t;
    for (int64_t i = 0; ok && i < warm + n; i++) {
        dg_tensor_f32(xt)[0] = (float)i;
        dg_tensor *out = NULL;
        double a = now_us();
        ok = dg_session_run(s, &x, &xt, 1, &y, &out, 1, NULL, 0, st);
        double b = now_us();
        if (ok && dg_tensor_f32(out)[0] != (float)i + 1) {
            dg_status_setf(st, DG_INTERNAL, "step %lld fetched %g, expected %g", (long long)i, dg_tensor_f32(out)[0],
                           (double)i + 1);
            ok = false;
        }
        dg_tensor_unref(out);
        if (ok && i >= warm) {
            t[i - warm] = b - a;
            sum += b - a;
        }
    }
    if (ok) {
        qsort(t, (size_t)n, sizeof *t, cmp);
        *med = t[n / 2];
        *p90 = t[n * 9 / 10];
        *mean = sum / (double)n;
    }
    free(t);
    dg_tensor_unref(xt);
    return ok;
}

int main(int argc, char **argv) {
    const char *target = "", *device = "/job:worker/task:0";
    int64_t steps = 2000, warm = 200;
    flag_def defs[] = {
        {"target", FLAG_STRING, &target, "dg://host:port of a standing dg-server (required)"},
        {"device", FLAG_STRING, &device, "where the graph runs (default /job:worker/task:0)"},
        {"steps", FLAG_INT, &steps, "timed steps (default 2000)"},
        {"warmup", FLAG_INT, &warm, "untimed steps first (default 200)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: remote_step_bench --target dg://h:p", &help))
        return 2;
    if (help) return 0;
    if (!*target || steps < 10 || warm < 0) {
        fprintf(stderr, "remote_step_bench: needs --target and --steps >= 10\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    int rc = 1;
    dg_graph *g = dg_graph_new(), *lg = dg_graph_new();
    dg_graph_push_device(g, device);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape_scalar());
    dg_output y = dg_add(g, "y", x, dg_scalar(g, NULL, DG_FLOAT32, 1));
    dg_graph_pop_device(g);
    dg_output lx = dg_placeholder(lg, "x", DG_FLOAT32, dg_shape_scalar());
    dg_output ly = dg_add(lg, "y", lx, dg_scalar(lg, NULL, DG_FLOAT32, 1));
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 1;
    dg_session *rs = dg_session_new(g, target, &so, st), *ls = rs ? dg_session_new(lg, "local", &so, st) : NULL;
    double rm, rp, ra, lm, lp, la;
    if (!ls || !time_steps(rs, x, y, steps, warm, &rm, &rp, &ra, st) ||
        !time_steps(ls, lx, ly, steps, warm, &lm, &lp, &la, st)) {
        fprintf(stderr, "remote_step_bench: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
        goto out;
    }
    printf("{\"bench\": \"remote_step_bench\", \"impl\": \"distgraph\", \"metric\": \"trivial_step_us\", \"value\": %.1f, "
           "\"unit\": \"us\", \"median_us\": %.1f, \"p90_us\": %.1f, \"mean_us\": %.1f, \"local_median_us\": %.1f, "
           "\"overhead_us\": %.1f, \"steps\": %lld}\n", rm, rm, rp, ra, lm, rm - lm, (long long)steps);
    printf("{\"bench\": \"remote_step_bench\", \"impl\": \"distgraph\", \"metric\": \"trivial_step_local_us\", "
           "\"value\": %.1f, \"unit\": \"us\", \"median_us\": %.1f, \"p90_us\": %.1f, \"mean_us\": %.1f}\n",
           lm, lm, lp, la);
    rc = 0;
out:
    dg_session_free(&rs);
    dg_session_free(&ls);
    dg_graph_free(&g);
    dg_graph_free(&lg);
    dg_status_free(&st);
    return rc;
}
