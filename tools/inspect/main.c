/* dg-inspect: looks inside graph files (written by dg_graph_save, e.g. by dg-mlp-graph),
 * checkpoint files (written by dg_checkpoint_save and the summary saver hook), TensorBoard
 * event files, and running servers.
 *   dg-inspect graph FILE [--json]                 nodes: inputs, devices, output dtype/shape
 *   dg-inspect place FILE --cluster_spec SPEC      node -> device on SPEC's devices; with
 *                                                  --auto placed automatically, with the
 *                                                  predicted step, each device's load, memory
 *   dg-inspect partition FILE --cluster_spec SPEC  per-device node lists and Send/Recv pairs
 *   dg-inspect svg FILE --cluster_spec SPEC -o OUT.svg
 *   dg-inspect checkpoints CKPT [--json]           step, time written, variables, bytes
 *   dg-inspect variables CKPT [--step N] [--values K] [--json]
 *                                                  name, dtype, shape, step, bytes (, values)
 *   dg-inspect summaries CKPT [--json]             scalar summary tags: count, step range
 *   dg-inspect plot CKPT --tag T [--tag U ...] -o OUT.svg|OUT.png
 *                                                  value against step, as SVG or PNG (800x480)
 *   dg-inspect events FILE [--json]                every event of a TensorBoard event file
 *   dg-inspect calibrate [-o FILE]                 measures this machine for the automatic
 *                                                  placer's cost model (docs/PLACEMENT.md)
 *   dg-inspect server dg://HOST:PORT [--json]     a running task's counters: registered
 *                                                  partitions, remote sessions, running steps
 * SPEC is "ps|h:1,h:2;worker|h:3"; every task has /device:CPU:0 and --gpus_per_task GPUs.
 * Errors print the status and exit 1; bad usage exits 2. Every file is read through the
 * public API (graph, checkpoint, summary headers); the tool holds no SQL and no file format.
 * This file parses the arguments and dispatches; inspect.h lists where each command lives. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

static int usage(FILE *f) {
    fprintf(f,
            "usage: dg-inspect COMMAND FILE [options]\n"
            "commands on graph files:\n"
            "  graph FILE [--json] [--mixed_precision bf16]\n"
            "                                  list nodes: op, inputs, devices, outputs\n"
            "  place FILE --cluster_spec SPEC  place the graph on SPEC's devices\n"
            "  partition FILE --cluster_spec SPEC\n"
            "                                  per-device node lists and Send/Recv pairs\n"
            "  svg FILE --cluster_spec SPEC -o OUT.svg\n"
            "                                  draw the placed, partitioned graph\n"
            "commands on checkpoint files:\n"
            "  checkpoints FILE [--json]       list checkpoints: step, time written, variables,\n"
            "                                  bytes; the newest marked\n"
            "  variables FILE [--step N] [--values K] [--json]\n"
            "                                  the variables of the newest checkpoint (or of\n"
            "                                  step N): name, dtype, shape, step, bytes\n"
            "  summaries FILE [--json]         scalar summary tags: count, steps, last value\n"
            "  plot FILE --tag TAG [--tag TAG ...] -o OUT.svg|OUT.png\n"
            "                                  line chart of value against step, 800x480\n"
            "commands on TensorBoard event files:\n"
            "  events FILE [--json]            every event: wall time, step, kind, tag, value;\n"
            "                                  checks each record's checksums\n"
            "commands on running servers:\n"
            "  server dg://HOST:PORT [--json]  registered partitions, remote clients' sessions\n"
            "                                  and running steps of the task at that address\n"
            "commands on this machine:\n"
            "  cpu                             the CPU, its vector instructions, what runs\n"
            "                                  float32 and float64 GEMM, intra-op threads\n"
            "  calibrate [-o FILE]             measure compute, memory, op and link costs for\n"
            "                                  the automatic placer (--cost FILE)\n"
            "options:\n"
            "  --cluster_spec SPEC   \"ps|host:port,host:port;worker|host:port\"\n"
            "  --gpus_per_task N     GPUs per task besides /device:CPU:0 (default 0)\n"
            "  --no_soft_placement   fail instead of falling back to another device\n"
            "  --auto                place automatically (dg_auto_place: cost model, simulator); place\n"
            "                        also prints the predicted step, each device's load and memory\n"
            "  --cost FILE           --auto: a calibration (dg-inspect calibrate); default: nominal\n"
            "  --memory_cap BYTES    --auto: bytes each device may hold (default: no cap)\n"
            "  --unknown_dim N       --auto: what an unknown dimension (a batch) stands for\n"
            "  --mixed_precision bf16|fp16\n"
            "                        graph commands: first apply the automatic mixed-precision\n"
            "                        rewrite (dg_graph_rewrite_mixed_precision, default lists)\n"
            "  --json                JSON instead of a table (all but svg and plot)\n"
            "  -o, --output FILE     where svg and plot write (plot: .svg or .png)\n"
            "  --step N              variables: the checkpoint of global step N\n"
            "  --values K            variables: also print each variable's first K values\n"
            "  --tag TAG             plot: a summary tag to draw (repeat for several)\n"
            "  --show_init           svg: also draw initializers (hidden by default: nodes\n"
            "                        named */Initializer/*, */Assign and init)\n"
            "  -h, --help, --version\n"
            "Exit status: 0 on success, 1 when a file or server cannot be read (the message\n"
            "says why), 2 for bad usage.\n");
    return f == stdout ? 0 : 2;
}

// Parses a count option's value: an integer in [lo, hi]; false (after a message) otherwise.
static bool parse_int(const char *opt, const char *val, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (!*val || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "dg-inspect: %s must be an integer in %lld..%lld, got \"%s\"\n", opt, (long long)lo,
                (long long)hi, val);
        return false;
    }
    *out = v;
    return true;
}

static bool is_cmd(const char *cmd, const char *const *names) {
    for (; *names; names++)
        if (strcmp(cmd, *names) == 0) return true;
    return false;
}

// Runs a command on a graph file: loads it, then the command. Returns the exit status.
static int run_graph_cmd(const inspect_options *o) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_load(o->file, st);
    int rc = 1;
    if (!g) {
        inspect_die_status("loading", st);
    } else if (o->mixed_precision != DG_INVALID_DTYPE) {
        dg_mixed_precision_options mo = dg_mixed_precision_options_default(o->mixed_precision);
        dg_mixed_precision_report r;
        if (!dg_graph_rewrite_mixed_precision(g, &mo, &r, st)) {
            inspect_die_status("the mixed-precision rewrite", st);
            dg_graph_free(&g);
        } else {
            fprintf(stderr, "dg-inspect: mixed precision: %d nodes compute in %s, %d casts added\n",
                    r.nodes_converted, dg_dtype_name(o->mixed_precision), r.casts_added);
        }
    }
    if (!g) rc = 1;
    else if (strcmp(o->cmd, "graph") == 0) rc = inspect_cmd_graph(o, g);
    else if (strcmp(o->cmd, "place") == 0) rc = inspect_cmd_place(o, g, st);
    else if (strcmp(o->cmd, "partition") == 0) rc = inspect_cmd_partition(o, g, st);
    else rc = inspect_cmd_svg(o, g, st);
    dg_graph_free(&g);
    dg_status_free(&st);
    return rc;
}

int main(int argc, char **argv) {
    static const char *const graph_cmds[] = {"graph", "place", "partition", "svg", NULL};
    static const char *const ckpt_cmds[] = {"checkpoints", "variables", "summaries", "plot", NULL};
    inspect_options o;
    memset(&o, 0, sizeof o);
    o.soft_placement = true;
    o.hide_init = true;
    o.step = -1;
    if (argc < 2) return usage(stderr);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) return usage(stdout);
    if (strcmp(argv[1], "--version") == 0) {
        printf("dg-inspect (distgraph) %s\n", dg_version());
        return 0;
    }
    if (strcmp(argv[1], "calibrate") == 0) {
        // calibrate [-o FILE]
        for (int i = 2; i < argc; i++) {
            if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) && i + 1 < argc) {
                o.out = argv[++i];
            } else if (strncmp(argv[i], "--output=", 9) == 0) {
                o.out = argv[i] + 9;
            } else {
                fprintf(stderr, "dg-inspect: calibrate takes only -o FILE, got \"%s\"\n", argv[i]);
                return usage(stderr);
            }
        }
        return inspect_cmd_calibrate(&o);
    }
    if (strcmp(argv[1], "cpu") == 0) {
        if (argc > 2) {
            fprintf(stderr, "dg-inspect: cpu takes no arguments\n");
            return usage(stderr);
        }
        printf("%s\n", dg_cpu_summary());
        return 0;
    }
    o.cmd = argv[1];
    o.tags = inspect_xcalloc((size_t)argc, sizeof *o.tags);
    bool has_step = false, has_values = false;
    int rc = 2;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *opt = a, *val = NULL;
        static const char *const valued[] = {"--cluster_spec", "--gpus_per_task", "-o", "--output",
                                             "--step", "--values", "--tag", "--cost", "--memory_cap",
                                             "--unknown_dim", "--mixed_precision", NULL};
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            rc = usage(stdout);
            goto done;
        }
        // "--opt=value" and "--opt value" alike.
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        char name[32] = "";
        if (eq && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            if (is_cmd(name, valued)) {
                opt = name;
                val = eq + 1;
            }
        }
        if (!val && is_cmd(a, valued)) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dg-inspect: %s needs a value\n", a);
                goto done;
            }
            val = argv[++i];
        }
        if (val) {
            int64_t v = 0;
            if (strcmp(opt, "-o") == 0 || strcmp(opt, "--output") == 0) {
                o.out = val;
            } else if (strcmp(opt, "--cluster_spec") == 0) {
                o.cluster_spec = val;
            } else if (strcmp(opt, "--gpus_per_task") == 0) {
                if (!parse_int(opt, val, 0, 1024, &v)) goto done;
                o.gpus_per_task = (int)v;
            } else if (strcmp(opt, "--cost") == 0) {
                o.cost_file = val;
            } else if (strcmp(opt, "--memory_cap") == 0) {
                if (!parse_int(opt, val, 0, INT64_MAX, &o.memory_cap)) goto done;
            } else if (strcmp(opt, "--mixed_precision") == 0) {
                if (strcmp(val, "bf16") == 0 || strcmp(val, "bfloat16") == 0) {
                    o.mixed_precision = DG_BFLOAT16;
                } else if (strcmp(val, "fp16") == 0 || strcmp(val, "float16") == 0) {
                    o.mixed_precision = DG_FLOAT16;
                } else {
                    fprintf(stderr, "dg-inspect: --mixed_precision: \"%s\" is not bf16 or fp16\n", val);
                    goto done;
                }
            } else if (strcmp(opt, "--unknown_dim") == 0) {
                if (!parse_int(opt, val, 0, INT64_MAX, &o.unknown_dim)) goto done;
            } else if (strcmp(opt, "--step") == 0) {
                if (!parse_int(opt, val, 0, INT64_MAX, &o.step)) goto done;
                has_step = true;
            } else if (strcmp(opt, "--values") == 0) {
                if (!parse_int(opt, val, 0, INT64_MAX, &o.n_values)) goto done;
                has_values = true;
            } else {
                if (!*val) {
                    fprintf(stderr, "dg-inspect: --tag needs a non-empty tag\n");
                    goto done;
                }
                bool seen = false;
                for (int k = 0; k < o.n_tags; k++) seen = seen || strcmp(o.tags[k], val) == 0;
                if (!seen) o.tags[o.n_tags++] = val;
            }
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--auto") == 0) {
            o.auto_place = true;
        } else if (strcmp(a, "--no_soft_placement") == 0) {
            o.soft_placement = false;
        } else if (strcmp(a, "--hide_init") == 0) {
            o.hide_init = true;
        } else if (strcmp(a, "--show_init") == 0 || strcmp(a, "--nohide_init") == 0 ||
                   strcmp(a, "--hide_init=false") == 0) {
            o.hide_init = false;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dg-inspect: unknown option \"%s\"\n", a);
            rc = usage(stderr);
            goto done;
        } else if (!o.file) {
            o.file = a;
        } else {
            fprintf(stderr, "dg-inspect: unexpected argument \"%s\"\n", a);
            rc = usage(stderr);
            goto done;
        }
    }
    bool is_graph = is_cmd(o.cmd, graph_cmds), is_ckpt = is_cmd(o.cmd, ckpt_cmds);
    if (strcmp(o.cmd, "events") == 0) {
        if (!o.file) {
            fprintf(stderr, "dg-inspect: events needs an event FILE\n");
            goto done;
        }
        rc = inspect_cmd_events(&o);
        goto done;
    }
    if (strcmp(o.cmd, "server") == 0) {
        if (!o.file) {
            fprintf(stderr, "dg-inspect: server needs a target dg://HOST:PORT\n");
            goto done;
        }
        rc = inspect_cmd_server(&o);
        goto done;
    }
    if (!is_graph && !is_ckpt) {
        fprintf(stderr, "dg-inspect: unknown command \"%s\"\n", o.cmd);
        rc = usage(stderr);
        goto done;
    }
    if (!o.file) {
        fprintf(stderr, "dg-inspect: %s needs a %s FILE\n", o.cmd, is_graph ? "graph" : "checkpoint");
        rc = usage(stderr);
        goto done;
    }
    bool is_variables = strcmp(o.cmd, "variables") == 0, is_plot = strcmp(o.cmd, "plot") == 0;
    if ((has_step || has_values) && !is_variables) {
        fprintf(stderr, "dg-inspect: %s applies to variables only\n", has_step ? "--step" : "--values");
        goto done;
    }
    if (o.n_tags && !is_plot) {
        fprintf(stderr, "dg-inspect: --tag applies to plot only\n");
        goto done;
    }
    if (is_plot) {
        if (!o.n_tags || !o.out) {
            fprintf(stderr, "dg-inspect: plot needs --tag TAG and -o OUT.svg|OUT.png\n");
            goto done;
        }
        if (!inspect_has_ext(o.out, ".svg") && !inspect_has_ext(o.out, ".png")) {
            fprintf(stderr, "dg-inspect: plot writes SVG or PNG, by the extension of -o: got \"%s\"\n", o.out);
            goto done;
        }
        if (o.json) {
            fprintf(stderr, "dg-inspect: plot has no --json\n");
            goto done;
        }
    }
    if (is_graph) rc = run_graph_cmd(&o);
    else if (strcmp(o.cmd, "checkpoints") == 0) rc = inspect_cmd_checkpoints(&o);
    else if (is_variables) rc = inspect_cmd_variables(&o);
    else if (strcmp(o.cmd, "summaries") == 0) rc = inspect_cmd_summaries(&o);
    else rc = inspect_cmd_plot(&o);
done:
    free(o.tags);
    return rc;
}
