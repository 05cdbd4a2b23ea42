/* auto_place_bench: the automatic placer against an expert's layer-wise placement and against
 * Baechi's three placers, on simulated devices (docs/PLACEMENT.md). JSON lines.
 * --mode models: for each model (Inception-like, GNMT, transformer), 4 and 8 devices and memory
 *   caps of 35%, 45% and 60% of the model's single-device bytes: each placement's predicted step,
 *   its time to place, and whether every device stays under its cap; a summary line per model
 *   and one over all: the automatic placement's mean speedup over the expert's.
 * --mode size: the time to place GNMT unrolled to about 20,000 and 200,000 ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/distgraph.h"
#include "flags.h"
#include "place_models.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct devices {
    int n;
    char names[16][64];
    const char *ptr[16];
} devices;

static void make_devices(devices *d, int n, const char *type) {
    d->n = n;
    for (int i = 0; i < n; i++) {
        snprintf(d->names[i], sizeof d->names[i], "/job:worker/replica:0/task:0/device:%s:%d", type, i);
        d->ptr[i] = d->names[i];
    }
}

typedef struct expert_ctx {
    const place_model_config *c;
    const devices *d;
} expert_ctx;

static const char *expert_device(void *ctx, int unit) {
    expert_ctx *e = ctx;
    return e->d->ptr[place_model_expert_device(e->c, unit, e->d->n)];
}

static dg_graph *build(const place_model_config *c, const devices *expert, dg_node **train) {
    dg_graph *g = dg_graph_new();
    expert_ctx e = {c, expert};
    *train = place_model_build(g, c, expert ? expert_device : NULL, &e, NULL);
    if (!*train) {
        fprintf(stderr, "auto_place_bench: building %s: %s\n", place_model_name(c->kind),
                dg_status_message(dg_graph_status(g)));
        exit(1);
    }
    return g;
}

// s as a JSON string (quotes, backslashes and control characters escaped).
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int64_t sum64(const int64_t *v, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

static bool under_caps(const dg_step_estimate *e, const int64_t *caps) {
    for (int d = 0; d < e->n_devices; d++)
        if (caps && caps[d] > 0 && (e->static_bytes[d] > caps[d] || e->peak_bytes[d] > caps[d])) return false;
    return true;
}

static double max_fraction(const dg_step_estimate *e, int64_t footprint) {
    int64_t m = 0;
    for (int d = 0; d < e->n_devices; d++)
        if (e->static_bytes[d] > m) m = e->static_bytes[d];
    return (double)m / (double)footprint;
}

static void line(const char *model, int nd, double cap, const char *placer, double step, double secs, bool fits,
                 double frac, int64_t ops, int64_t xfer) {
    printf("{\"bench\": \"auto_place\", \"model\": \"%s\", \"ops\": %lld, \"devices\": %d, \"memory_cap\": %.2f, "
           "\"placer\": \"%s\", \"predicted_step_ms\": %.3f, \"placement_s\": %.3f, \"under_caps\": %s, "
           "\"max_device_fraction\": %.3f, \"transfer_mb\": %.1f}\n",
           model, (long long)ops, nd, cap, placer, step * 1e3, secs, fits ? "true" : "false", frac, (double)xfer / 1e6);
    fflush(stdout);
}

static int models_mode(const char *which, const char *type, const dg_cost_model *cost, double budget) {
    static const int n_devs[2] = {4, 8};
    static const double caps_frac[3] = {0.35, 0.45, 0.60};
    double all_speedup = 0, fit_speedup = 0;
    int all_n = 0, fit_n = 0, failures = 0;
    for (int k = 0; k < 3; k++) {
        place_model_config c = place_model_default((place_model_kind)k);
        const char *name = place_model_name(c.kind);
        if (which[0] && !strstr(which, name)) continue;
        double speedup_sum = 0;
        int speedup_n = 0;
        for (int di = 0; di < 2; di++) {
            devices d;
            make_devices(&d, n_devs[di], type);
            for (int ci = 0; ci < 3; ci++) {
                dg_status *st = dg_status_new();
                // The expert's: scopes, then the placer as a session runs it.
                dg_node *train;
                dg_graph *ge = build(&c, &d, &train);
                int n;
                dg_node **nodes = place_model_step_nodes(ge, &train, 1, &n);
                double t0 = now_s();
                if (!dg_place(nodes, n, d.ptr, d.n, NULL, st)) {
                    fprintf(stderr, "auto_place_bench: expert placement of %s: %s\n", name, dg_status_message(st));
                    return 1;
                }
                double expert_place_s = now_s() - t0;
                dg_step_estimate ex;
                if (!dg_simulate_step(nodes, n, d.ptr, d.n, cost, &ex, st)) {
                    fprintf(stderr, "auto_place_bench: %s\n", dg_status_message(st));
                    return 1;
                }
                int64_t footprint = sum64(ex.static_bytes, d.n);
                int64_t caps[16];
                for (int i = 0; i < d.n; i++) caps[i] = (int64_t)(caps_frac[ci] * (double)footprint);
                bool expert_fits = under_caps(&ex, caps);
                line(name, d.n, caps_frac[ci], "expert", ex.step_s, expert_place_s, expert_fits,
                     max_fraction(&ex, footprint), n, ex.transfer_bytes);
                free(nodes);
                dg_graph_free(&ge);
                // The placers, on the same model without scopes.
                double auto_step = 0, crit = 0;
                for (int p = DG_AUTO_PLACER_M_TOPO; p <= DG_AUTO_PLACER_METIS + 1; p++) {
                    dg_auto_placer which_p = p <= DG_AUTO_PLACER_METIS ? (dg_auto_placer)p : DG_AUTO_PLACER_AUTO;
                    dg_graph *g = build(&c, NULL, &train);
                    dg_auto_place_options o = dg_auto_place_options_default();
                    const dg_node *targets[1] = {train};
                    o.targets = targets;
                    o.n_targets = 1;
                    o.placer = which_p;
                    o.cost = cost;
                    o.memory_caps = caps;
                    o.time_budget_s = budget;
                    dg_auto_place_report r;
                    t0 = now_s();
                    bool ok = dg_auto_place(g, d.ptr, d.n, &o, &r, st);
                    double secs = now_s() - t0;
                    if (!ok) {
                        printf("{\"bench\": \"auto_place\", \"model\": \"%s\", \"devices\": %d, \"memory_cap\": %.2f, "
                               "\"placer\": \"%s\", \"error\": ",
                               name, d.n, caps_frac[ci], dg_auto_placer_name(which_p));
                        json_str(stdout, dg_status_message(st));
                        printf("}\n");
                        failures += which_p == DG_AUTO_PLACER_AUTO;
                    } else {
                        bool fits = under_caps(&r.estimate, caps);
                        failures += !fits;
                        line(name, d.n, caps_frac[ci], dg_auto_placer_name(which_p), r.predicted_step_s, secs, fits,
                             max_fraction(&r.estimate, footprint), n, r.estimate.transfer_bytes);
                        if (which_p == DG_AUTO_PLACER_AUTO) {
                            auto_step = r.predicted_step_s;
                            crit = r.critical_path_s;
                            double best3 = INFINITY;
                            for (int j = 1; j <= 4; j++)
                                if (r.candidate_step_s[j] > 0 && r.candidate_step_s[j] < best3) best3 = r.candidate_step_s[j];
                            if (auto_step > best3) failures++;
                        }
                        dg_auto_place_report_clear(&r);
                    }
                    dg_graph_free(&g);
                }
                if (auto_step > 0) {
                    double s = ex.step_s / auto_step;
                    speedup_sum += s;
                    speedup_n++;
                    all_speedup += s;
                    all_n++;
                    if (expert_fits) {
                        fit_speedup += s;
                        fit_n++;
                    }
                    printf("{\"bench\": \"auto_place\", \"model\": \"%s\", \"devices\": %d, \"memory_cap\": %.2f, "
                           "\"expert_over_auto\": %.3f, \"expert_under_caps\": %s, \"critical_path_ms\": %.3f, "
                           "\"expert_over_critical_path\": %.3f, \"auto_over_critical_path\": %.3f}\n",
                           name, d.n, caps_frac[ci], s, expert_fits ? "true" : "false", crit * 1e3,
                           crit > 0 ? ex.step_s / crit : 0, crit > 0 ? auto_step / crit : 0);
                }
                dg_step_estimate_clear(&ex);
                dg_status_free(&st);
            }
        }
        if (speedup_n)
            printf("{\"bench\": \"auto_place\", \"model\": \"%s\", \"summary\": true, \"mean_expert_over_auto\": %.3f, "
                   "\"runs\": %d}\n",
                   name, speedup_sum / speedup_n, speedup_n);
    }
    if (all_n)
        printf("{\"bench\": \"auto_place\", \"summary\": \"all\", \"mean_expert_over_auto\": %.3f, \"runs\": %d, "
               "\"mean_where_the_expert_fits_the_caps\": %.3f, \"runs_where_it_fits\": %d, \"bar\": 1.16, "
               "\"failures\": %d}\n",
               all_speedup / all_n, all_n, fit_n ? fit_speedup / fit_n : 0, fit_n, failures);
    return failures ? 1 : 0;
}

static int size_mode(const char *type, const dg_cost_model *cost) {
    static const int64_t lengths[2] = {64, 640};   // about 20,000 and 200,000 ops
    for (int i = 0; i < 2; i++) {
        place_model_config c = place_model_default(PLACE_GNMT);
        c.length = lengths[i];
        devices d;
        make_devices(&d, 8, type);
        dg_node *train;
        dg_graph *g = build(&c, NULL, &train);
        dg_status *st = dg_status_new();
        dg_auto_place_options o = dg_auto_place_options_default();
        const dg_node *targets[1] = {train};
        o.targets = targets;
        o.n_targets = 1;
        o.cost = cost;
        dg_auto_place_report r;
        double t0 = now_s();
        bool ok = dg_auto_place(g, d.ptr, d.n, &o, &r, st);
        double secs = now_s() - t0;
        if (!ok) {
            fprintf(stderr, "auto_place_bench: %s\n", dg_status_message(st));
            return 1;
        }
        int n;
        dg_node **nodes = place_model_step_nodes(g, &train, 1, &n);
        printf("{\"bench\": \"auto_place_size\", \"model\": \"gnmt\", \"length\": %lld, \"ops\": %d, \"devices\": 8, "
               "\"placement_s\": %.3f, \"bar_s\": %.0f, \"refine_moves\": %d, \"predicted_step_ms\": %.3f}\n",
               (long long)c.length, n, secs, n <= 40000 ? 1.0 : 10.0, r.n_moves, r.predicted_step_s * 1e3);
        printf("{\"bench\": \"auto_place_sim\", \"ops\": %d, \"simulated_ops_per_s\": %.0f, \"note\": \"the placer's "
               "own simulations (%d of them)\"}\n", n, r.simulated_ops_per_s, r.n_simulations);
        fflush(stdout);
        // Simulation speed: ops simulated per second.
        dg_step_estimate e;
        t0 = now_s();
        int reps = 0;
        do {
            dg_simulate_step(nodes, n, d.ptr, d.n, cost, &e, st);
            dg_step_estimate_clear(&e);
            reps++;
        } while (now_s() - t0 < 1.0);
        printf("{\"bench\": \"auto_place_sim\", \"ops\": %d, \"simulated_ops_per_s\": %.0f, \"note\": \"whole "
               "dg_simulate_step calls: building the problem, simulating, memory by liveness\"}\n",
               n, (double)n * reps / (now_s() - t0));
        free(nodes);
        dg_auto_place_report_clear(&r);
        dg_status_free(&st);
        dg_graph_free(&g);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = "models", *which = "", *type = "GPU", *cost_file = "";
    double budget = 0;
    flag_def defs[] = {
        {"mode", FLAG_STRING, &mode, "models or size"},
        {"models", FLAG_STRING, &which, "comma-separated: inception, gnmt, transformer (default: all)"},
        {"device_type", FLAG_STRING, &type, "the simulated devices' type (GPU or CPU)"},
        {"cost", FLAG_STRING, &cost_file, "a calibration file (dg-inspect calibrate); default: nominal figures"},
        {"budget", FLAG_DOUBLE, &budget, "the refinement's seconds (0: by graph size)"},
    };
    bool help = false;
    if (!flags_parse(argc, argv, defs, (int)(sizeof defs / sizeof *defs), "auto_place_bench [flags]", &help))
        return 2;
    if (help) return 0;
    dg_cost_model *cost = dg_cost_model_new();
    dg_status *st = dg_status_new();
    if (cost_file[0] && !dg_cost_model_load(cost, cost_file, st)) {
        fprintf(stderr, "auto_place_bench: %s\n", dg_status_message(st));
        return 2;
    }
    printf("{\"bench\": \"auto_place\", \"device_type\": \"%s\", \"cost\": \"%s\"}\n", type,
           cost_file[0] ? cost_file : "nominal");
    int rc = strcmp(mode, "size") == 0 ? size_mode(type, cost) : models_mode(which, type, cost, budget);
    dg_cost_model_free(&cost);
    dg_status_free(&st);
    return rc;
}
