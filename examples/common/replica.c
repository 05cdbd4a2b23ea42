/* The training program behind the replica examples (mnist_replica, cnn_replica, gpt_replica):
 * between-graph replication of one model (a replica_model, replica.h), asynchronous with ps
 * tasks, synchronous replicas or all-reduce, under the monitored session. See
 * examples/mnist_replica.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/monitored_session.h"
#include "flags.h"
#include "replica.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Wall-clock time in seconds since the Unix epoch, as TensorFlow's time.time() prints it.
static double unix_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Reports each creation of the monitored session's underlying session: the first, and those
// after a failure (a restarted ps or worker).
typedef struct report_hook {
    long long task;
    int n_created;
    bool own_variables;   // all-reduce: this worker initializes its own copy
} report_hook;

static bool report_after_create(void *ctx, dg_monitored_session *ms, dg_session *sess, dg_status *st) {
    report_hook *r = ctx;
    if (r->n_created++ > 0) printf("Worker %lld: recreated the session after a failure (recovery %d)\n", r->task,
                                   r->n_created - 1);
    if (!dg_monitored_session_is_chief(ms) && !r->own_variables)
        printf("Worker %lld: the chief has initialized the variables\n", r->task);
    else if (dg_monitored_session_restored_step(ms) >= 0)
        printf("Worker %lld: restored checkpoint of global step %lld\n", r->task,
               (long long)dg_monitored_session_restored_step(ms));
    else
        printf("Worker %lld: initialized variables\n", r->task);
    fflush(stdout);
    return true;
}

// The model's network and its training: its optimizer applied as the mode says. Sync: the
// sync replicas optimizer wraps it. All-reduce (MultiWorkerMirrored): every worker holds the
// whole model on its own task; one packed all-reduce averages the gradients, every worker
// applies the same update, and *bcast copies worker 0's values (restored from a checkpoint,
// say) to every worker.
// With float16 products (ls not NULL), the loss times *factor (a placeholder: 1, or 1e30 to force
// an overflow) is minimized with dynamic loss scaling, whose scale and counters *ls gets.
// scale_workers > 0 (--elastic_lr_scaling): the learning rate times the elastic group's members
// over scale_workers.
static bool build_model(dg_graph *g, const replica_model *p, double lr, int64_t seed, int64_t train_steps,
                        const dg_sync_replicas_options *so, dg_sync_replicas **sr, const dg_collective_group *grp,
                        dg_node **bcast, replica_net *net, dg_node **train, dg_loss_scale *ls, dg_output *factor,
                        int scale_workers, dg_dtype wire, const char *task_device, bool variables_on_ps,
                        dg_status *st) {
    memset(net, 0, sizeof *net);
    net->task_device = task_device;
    net->variables_on_ps = variables_on_ps;
    if (ls) {
        *factor = dg_placeholder(g, "loss_factor", DG_FLOAT32, dg_shape_scalar());
        net->want_loss_scale = true;
        net->loss_factor = *factor;
    }
    if (!p->build(p->state, g, lr, seed, train_steps, net, st)) return false;
    // The ps push (dg_optimizer_minimize); the all-reduce's wire dtype is its group's.
    if (!grp && !so && !ls) net->opt.gradient_wire_dtype = wire;
    if (net->n_grads > 0) {
        if (so || scale_workers > 0 || (grp && ls)) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "this model computes its own gradients (a pipeline): without "
                          "--sync_replicas or --elastic, and --all_reduce without --mixed_precision fp16");
            return false;
        }
        if (ls && !net->ls.scale.node) {
            dg_status_set(st, DG_INTERNAL, "the model computed its gradients without the loss scale fp16 asks for");
            return false;
        }
        if (grp) {
            // --all_reduce: each worker's pipeline gradients averaged over the workers by one
            // CollectiveAllReduce, then applied to this worker's copy of the variables.
            dg_output *mean = calloc((size_t)net->n_grads, sizeof *mean);
            if (!mean) abort();
            if (dg_collective_all_reduce(g, "allreduce_gradients", net->grads, net->n_grads, grp,
                                         DG_COLLECTIVE_KEY_AUTO, DG_REDUCE_MEAN, NULL, mean))
                *train = dg_optimizer_apply_gradients(&net->opt, mean, net->vars, net->n_grads, net->global_step,
                                                      "train");
            free(mean);
        } else {
            *train = ls ? dg_optimizer_apply_gradients_with_loss_scale(&net->opt, net->grads, net->vars, net->n_grads,
                                                                      net->global_step, NULL, &net->ls)
                        : dg_optimizer_apply_gradients(&net->opt, net->grads, net->vars, net->n_grads,
                                                       net->global_step, "train");
        }
        if (ls) *ls = net->ls;
        (void)dg_global_variables_initializer(g);
        if (grp && bcast) *bcast = dg_collective_broadcast_variables(g, NULL, 0, grp, DG_COLLECTIVE_KEY_AUTO);
        return dg_graph_check(g, st);
    }
    if (scale_workers > 0) {
        dg_output members = dg_elastic_members(g, st);
        if (!members.node) return false;
        dg_output base = net->opt.learning_rate_tensor.node ? net->opt.learning_rate_tensor
                                                            : dg_scalar(g, "base_learning_rate", DG_FLOAT32, lr);
        net->opt.learning_rate_tensor =
            dg_mul(g, "elastic_learning_rate", base,
                   dg_div(g, NULL, members, dg_scalar(g, "reference_workers", DG_FLOAT32, scale_workers)));
    }
    if (ls) {
        dg_output scaled = dg_mul(g, "forced_loss", net->loss, *factor);
        if (so) {
            if (!(*sr = dg_sync_replicas_new(&net->opt, so, st))) return false;
            if (!(*train = dg_sync_replicas_minimize_with_loss_scale(*sr, scaled, net->global_step, NULL, ls, st)))
                return false;
        } else {
            *train = grp ? dg_all_reduce_minimize_with_loss_scale(&net->opt, scaled, net->global_step, grp,
                                                                   DG_COLLECTIVE_KEY_AUTO, NULL, ls)
                         : dg_optimizer_minimize_with_loss_scale(&net->opt, scaled, net->global_step, NULL, ls);
        }
    } else if (so) {
        if (!(*sr = dg_sync_replicas_new(&net->opt, so, st))) return false;
        if (!(*train = dg_sync_replicas_minimize(*sr, net->loss, net->global_step, st))) return false;
    } else if (grp) {
        *train = dg_all_reduce_minimize(&net->opt, net->loss, NULL, 0, net->global_step, grp, DG_COLLECTIVE_KEY_AUTO);
    } else {
        *train = dg_optimizer_minimize(&net->opt, net->loss, net->global_step);
    }
    (void)dg_global_variables_initializer(g);
    if (grp && bcast) *bcast = dg_collective_broadcast_variables(g, NULL, 0, grp, DG_COLLECTIVE_KEY_AUTO);
    return dg_graph_check(g, st);
}

static const char *prog = "replica";

static int fail(dg_status *st, const char *what) {
    fprintf(stderr, "%s: %s: %s: %s\n", prog, what, dg_code_name(dg_status_code(st)),
            dg_status_message(st));
    return 1;
}

int replica_main(int argc, char **argv, const replica_model *p) {
    prog = p->name;
    const char *job_name = "", *ps_hosts = "", *worker_hosts = "";
    int64_t task_index = -1, train_steps = p->train_steps, batch_size = p->batch_size, seed = 1, log_every = 100;
    int64_t wait_ms = 60000, rpc_timeout_ms = 30000, save_checkpoint_steps = 100, recovery_attempts = 3;
    const char *checkpoint_path = "", *slurm_jobs = "", *save_graph = "", *logdir = "", *trace_file = "";
    const char *mixed_precision = "off", *gradient_wire = "float32", *amp = "build";
    int64_t trace_step = 0, force_overflow_at = 0, force_overflow_steps = 3;
    int64_t slurm_port_base = DG_SLURM_DEFAULT_PORT_BASE;
    int64_t virtual_cpus = 0;
    int64_t replicas_to_aggregate = 0, num_gpus = 0, sync_timeout_ms = 60000, wait_for_tasks_ms = 0;
    int64_t elastic_min_workers = 0, elastic_commit_steps = 10, elastic_barrier_ms = 10000, sync_live_probe_ms = 0;
    bool elastic = false, elastic_lr_scaling = false;
    double lr = p->learning_rate;
    char steps_help[64], batch_help[64];
    snprintf(steps_help, sizeof steps_help, "global steps to train (default %lld)", (long long)p->train_steps);
    snprintf(batch_help, sizeof batch_help, "examples per step (default %lld)", (long long)p->batch_size);
    bool quiet = false, print_placement = false, log_device_placement = false, sync_replicas = false, all_reduce = false, existing_servers = false;
    bool gpu_allow_tf32 = false;
    flag_def defs[] = {
        {"job_name", FLAG_STRING, &job_name, "ps or worker (default: from TF_CONFIG)"},
        {"task_index", FLAG_INT, &task_index, "index of this task in its job"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "comma list of host:port"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "comma list of host:port"},
        {"slurm_jobs", FLAG_STRING, &slurm_jobs,
         "cluster and task from the Slurm job step (srun), e.g. ps:1,worker:2 (examples/slurm/)"},
        {"slurm_port_base", FLAG_INT, &slurm_port_base, "with --slurm_jobs: first port on each node (default 8888)"},
        {"train_steps", FLAG_INT, &train_steps, steps_help},
        {"batch_size", FLAG_INT, &batch_size, batch_help},
        {"learning_rate", FLAG_DOUBLE, &lr, p->lr_help},
        {"seed", FLAG_INT, &seed, "initialisation seed; batches are shuffled by seed + task (default 1)"},
        {"log_every", FLAG_INT, &log_every, "progress line every N local steps (default 100)"},
        {"wait_for_chief_ms", FLAG_INT, &wait_ms, "how long a non-chief waits for initialization"},
        {"rpc_timeout_ms", FLAG_INT, &rpc_timeout_ms, "deadline of each remote call (default 30000)"},
        {"quiet", FLAG_BOOL, &quiet, "no server log lines"},
        {"log_device_placement", FLAG_BOOL, &log_device_placement,
         "print every node's device to stderr when a step is placed (also through --existing_servers)"},
        {"print_placement", FLAG_BOOL, &print_placement,
         "print where each trainable variable lives and a checksum of its value fetched from there"},
        {"save_graph", FLAG_STRING, &save_graph,
         "chief: write the training graph to this file (examples/inference.c loads it with a checkpoint)"},
        {"checkpoint_path", FLAG_STRING, &checkpoint_path,
         "SQLite checkpoint file the chief saves to and restores from (default: none)"},
        {"logdir", FLAG_STRING, &logdir,
         "chief: TensorBoard event files in this directory (the loss every 100 steps, the placed graph)"},
        {"trace_step", FLAG_INT, &trace_step,
         "worker: record a timeline of this worker's Nth training step across every task it runs on "
         "(a Chrome trace-event file; Perfetto and chrome://tracing open it)"},
        {"trace_file", FLAG_STRING, &trace_file,
         "with --trace_step: where to write it (default: timeline_worker<task>_step<N>.json, in --logdir when given)"},
        {"save_checkpoint_steps", FLAG_INT, &save_checkpoint_steps, "chief: checkpoint every N global steps (default 100)"},
        {"recovery_attempts", FLAG_INT, &recovery_attempts,
         "session creations tried after a ps or worker failure before giving up (default 3)"},
        {"sync_replicas", FLAG_BOOL, &sync_replicas, "train synchronously: average the workers' gradients each step"},
        {"replicas_to_aggregate", FLAG_INT, &replicas_to_aggregate,
         "sync: gradients averaged per step (default: the number of workers; fewer: backup workers)"},
        {"sync_timeout_ms", FLAG_INT, &sync_timeout_ms,
         "sync: how long the chief waits for one step's gradients before failing (default 60000)"},
        {"sync_live_probe_ms", FLAG_INT, &sync_live_probe_ms,
         "sync: the chief probes the other workers this often and averages the gradients of those that "
         "answer, so a lost worker holds no step (default 0: off, every step waits for replicas_to_aggregate)"},
        {"all_reduce", FLAG_BOOL, &all_reduce,
         "train synchronously without ps: every worker holds the variables, gradients are averaged by "
         "all-reduce (MultiWorkerMirrored)"},
        {"elastic", FLAG_BOOL, &elastic,
         "with --all_reduce: workers may leave (killed) and join (started) while the job runs; the group "
         "is coordinated by the first ps task, or worker 0 when there is none (docs/ELASTIC.md)"},
        {"elastic_min_workers", FLAG_INT, &elastic_min_workers,
         "elastic: workers the first epoch waits for (default: the number of workers in the cluster)"},
        {"elastic_commit_steps", FLAG_INT, &elastic_commit_steps,
         "elastic: commit the variables in memory every N steps, the most steps a failure undoes (default 10)"},
        {"elastic_lr_scaling", FLAG_BOOL, &elastic_lr_scaling,
         "elastic: the learning rate follows the group's size, --learning_rate times the members over the "
         "cluster's workers (Horovod's rule; default: it stays)"},
        {"elastic_barrier_ms", FLAG_INT, &elastic_barrier_ms,
         "elastic: how long members wait for each other at a commit before leaving out those missing "
         "(default 10000)"},
        {"num_gpus", FLAG_INT, &num_gpus, "GPUs per worker machine: worker i computes on GPU i % num_gpus (default 0)"},
        {"gpu_allow_tf32", FLAG_BOOL, &gpu_allow_tf32,
         "GPU MatMuls may use TF32 tensor cores (about 1e-3 relative error; dg_session_options.gpu_allow_tf32; "
         "default off)"},
        {"virtual_cpus", FLAG_INT, &virtual_cpus,
         "extra CPU devices of this task, /device:CPU:1 .. N (gpt_replica --tensor_parallel's shards; default 0)"},
        {"wait_for_tasks_ms", FLAG_INT, &wait_for_tasks_ms,
         "how long to wait for tasks (ps, workers) not up yet, logging every 5 s (default 0: no limit)"},
        {"existing_servers", FLAG_BOOL, &existing_servers,
         "start no server: train through the standing dg-server of this worker's task (dg://worker host)"},
        {"mixed_precision", FLAG_STRING, &mixed_precision,
         "bf16: the model's float32 products (MatMul) in bfloat16, variables and the rest in float32 "
         "(dg_graph_set_mixed_precision); fp16: in float16, with dynamic loss scaling; off (default)"},
        {"amp", FLAG_STRING, &amp,
         "how --mixed_precision is applied: build (default: while the model is built, its MatMuls alone) or "
         "rewrite (the session rewrites the built graph: products, the elementwise ops between them and their "
         "gradients; dg_session_options.mixed_precision)"},
        {"gradient_wire", FLAG_STRING, &gradient_wire,
         "bf16: gradients travel as bfloat16 (half the bytes), summed and applied in float32: the all-reduce's "
         "(--all_reduce) or the push to the ps (asynchronous); float32 (default)"},
        {"force_overflow_at", FLAG_INT, &force_overflow_at,
         "with fp16: multiply the loss by 1e30 from this local step on (default 0: never), to see steps skipped"},
        {"force_overflow_steps", FLAG_INT, &force_overflow_steps, "with --force_overflow_at: for this many steps (default 3)"},
    };
    // The program's flags, then the model's.
    int n_generic = (int)(sizeof defs / sizeof defs[0]), n_defs = n_generic + p->n_flags;
    flag_def *all = calloc((size_t)n_defs, sizeof *all);
    if (!all) return 1;
    memcpy(all, defs, sizeof defs);
    if (p->n_flags) memcpy(all + n_generic, p->flags, (size_t)p->n_flags * sizeof *all);
    bool help, parsed = flags_parse(argc, argv, all, n_defs, p->usage, &help);
    free(all);
    if (!parsed) return 2;
    if (help) return 0;
    if (train_steps < 0 || batch_size < 1 || log_every < 1 || save_checkpoint_steps < 0 || recovery_attempts < 1 ||
        recovery_attempts > 1000000 || wait_ms < 0 || replicas_to_aggregate < 0 || num_gpus < 0 ||
        sync_timeout_ms < 1 || sync_live_probe_ms < 0 || (sync_live_probe_ms > 0 && sync_live_probe_ms < 10)) {
        fprintf(stderr, "%s: bad --train_steps, --batch_size, --log_every, "
                        "--save_checkpoint_steps, --recovery_attempts, --wait_for_chief_ms, "
                        "--replicas_to_aggregate, --num_gpus, --sync_timeout_ms or --sync_live_probe_ms (0, or >= 10)\n", prog);
        return 2;
    }
    if (p->check_flags && !p->check_flags(p->state, batch_size)) return 2;
    dg_status *st = dg_status_new();
    dg_cluster *cluster = NULL;
    char job[64];
    snprintf(job, sizeof job, "%s", job_name);
    const char *job_from = "--job_name", *task_from = "--task_index";   // for messages
    if (*ps_hosts || *worker_hosts) {
        cluster = dg_cluster_from_flags(ps_hosts, worker_hosts, st);
    } else if (*slurm_jobs) {
        dg_slurm_options so = {.jobs = slurm_jobs, .port_base = (int)slurm_port_base};
        dg_tf_config cfg;
        if (slurm_port_base < 1 || slurm_port_base > 65535) {
            fprintf(stderr, "%s: --slurm_port_base must be a port (1..65535)\n", prog);
            return 2;
        }
        if (dg_slurm_from_env(&so, &cfg, st)) {
            cluster = cfg.cluster;
            cfg.cluster = NULL;
            if (!*job) snprintf(job, sizeof job, "%s", cfg.task_type), job_from = "Slurm's task";
            if (task_index < 0) task_index = cfg.task_index, task_from = "Slurm's task";
            dg_tf_config_clear(&cfg);
        }
    } else {
        dg_tf_config cfg;
        if (dg_tf_config_from_env(&cfg, st)) {
            cluster = cfg.cluster;
            cfg.cluster = NULL;
            if (!*job) snprintf(job, sizeof job, "%s", cfg.task_type), job_from = "TF_CONFIG's task.type";
            if (task_index < 0) task_index = cfg.task_index, task_from = "TF_CONFIG's task.index";
            dg_tf_config_clear(&cfg);
        }
    }
    if (!cluster) return fail(st, "cluster (give --ps_hosts/--worker_hosts, --slurm_jobs or TF_CONFIG)");
    if (!*job) {
        fprintf(stderr, "%s: no job for this task: give --job_name ps or worker (or TF_CONFIG's task)\n", prog);
        return 2;
    }
    if (strcmp(job, "ps") != 0 && strcmp(job, "worker") != 0) {
        fprintf(stderr, "%s: %s is \"%s\", but %s runs only ps and worker tasks%s\n", prog, job_from, job, p->what,
                strcmp(job, "chief") == 0 ? " (its chief is worker 0: list that task as worker 0)" : "");
        return 2;
    }
    int n_tasks = dg_cluster_num_tasks(cluster, job);
    if (task_index < 0) {
        fprintf(stderr, "%s: missing --task_index: which of the %d %s task%s this is (0 to %d)\n", prog, n_tasks, job,
                n_tasks == 1 ? "" : "s", n_tasks - 1);
        return 2;
    }
    if (task_index >= n_tasks) {
        fprintf(stderr, "%s: %s %lld is out of range: job %s has %d task%s (0 to %d)\n", prog, task_from,
                (long long)task_index, job, n_tasks, n_tasks == 1 ? "" : "s", n_tasks - 1);
        return 2;
    }
    int n_workers = dg_cluster_num_tasks(cluster, "worker");
    if (sync_replicas && all_reduce) {
        fprintf(stderr, "%s: --sync_replicas and --all_reduce exclude each other\n", prog);
        return 2;
    }
    if (elastic && !all_reduce) {
        fprintf(stderr, "%s: --elastic needs --all_reduce\n", prog);
        return 2;
    }
    dg_dtype wire = 0;
    if (strcmp(gradient_wire, "bf16") == 0 || strcmp(gradient_wire, "bfloat16") == 0) {
        wire = DG_BFLOAT16;
    } else if (strcmp(gradient_wire, "float32") != 0) {
        fprintf(stderr, "%s: --gradient_wire \"%s\" is not bf16 or float32\n", prog, gradient_wire);
        return 2;
    }
    if (wire && (sync_replicas || strcmp(mixed_precision, "off") != 0)) {
        fprintf(stderr, "%s: --gradient_wire bf16 works with --all_reduce and the asynchronous ps, without "
                "--sync_replicas or --mixed_precision\n", prog);
        return 2;
    }
    if (sync_replicas && replicas_to_aggregate == 0) replicas_to_aggregate = n_workers;
    if (sync_replicas && replicas_to_aggregate > n_workers) {
        fprintf(stderr, "%s: --replicas_to_aggregate %lld is more than the %d workers\n", prog,
                (long long)replicas_to_aggregate, n_workers);
        return 2;
    }
    dg_server_options so = dg_server_options_default();
    so.quiet = quiet;
    so.rpc_timeout_ms = rpc_timeout_ms;
    so.n_virtual_cpus = virtual_cpus >= 0 && virtual_cpus <= 64 ? (int)virtual_cpus : -1;   // refused below
    if (sync_replicas) {
        // A worker's step waits on the ps for its token (up to twice the take's deadline) inside
        // a remote call (the wait holds no thread of the ps).
        if (so.rpc_timeout_ms < 2 * sync_timeout_ms + 10000) so.rpc_timeout_ms = 2 * sync_timeout_ms + 10000;
    }
    dg_server *server = NULL;
    char master[300];
    if (existing_servers) {
        if (strcmp(job, "ps") == 0) {
            fprintf(stderr, "%s: with --existing_servers the ps tasks are standing dg-server processes; "
                            "start only the worker programs\n", prog);
            return 2;
        }
        const char *addr = dg_cluster_task_address(cluster, "worker", (int)task_index, st);
        if (!addr) return fail(st, "the worker's address");
        snprintf(master, sizeof master, "dg://%s", addr);
    } else {
        if (!(server = dg_server_new(cluster, job, (int)task_index, &so, st))) return fail(st, "starting the server");
        snprintf(master, sizeof master, "%s", dg_server_target(server));
    }
    if (strcmp(job, "ps") == 0) {
        dg_server_join(server, true, st);
        dg_server_free(&server);
        dg_cluster_free(&cluster);
        dg_status_free(&st);
        return 0;
    }
    int rc = 1;
    bool is_chief = task_index == 0;
    dg_graph *g = NULL;
    dg_monitored_session *ms = NULL;
    dg_session_hook *stop = NULL, *mode_hook = NULL, *trace_hook = NULL;   // mode_hook: sync replicas or broadcast
    dg_sync_replicas *sr = NULL;
    dg_tensor *factor_one = NULL, *factor_big = NULL;   // --mixed_precision fp16: the loss factor's feeds
    dg_node *bcast = NULL;
    dg_device_fn *setter = NULL;
    if (!p->load(p->state, seed + task_index, st)) {
        fail(st, "loading data");
        goto out;
    }
    g = dg_graph_new();
    bool fp16 = strcmp(mixed_precision, "fp16") == 0 || strcmp(mixed_precision, "float16") == 0;
    bool rewrite = strcmp(amp, "rewrite") == 0;
    if (!rewrite && strcmp(amp, "build") != 0) {
        fprintf(stderr, "--amp: \"%s\" is not build or rewrite\n", amp);
        goto out;
    }
    dg_mixed_precision_options mpo = dg_mixed_precision_options_default(DG_INVALID_DTYPE);
    if (strcmp(mixed_precision, "bf16") == 0 || strcmp(mixed_precision, "bfloat16") == 0) {
        mpo.dtype = DG_BFLOAT16;
    } else if (fp16) {
        mpo.dtype = DG_FLOAT16;
    } else if (strcmp(mixed_precision, "off") != 0) {
        fprintf(stderr, "--mixed_precision: \"%s\" is not bf16, fp16 or off\n", mixed_precision);
        goto out;
    }
    if (mpo.dtype != DG_INVALID_DTYPE && !rewrite && !dg_graph_set_mixed_precision(g, mpo.dtype, st)) goto out;
    char worker_device[128];
    if (num_gpus > 0)
        snprintf(worker_device, sizeof worker_device, "/job:worker/task:%lld/device:GPU:%lld", (long long)task_index,
                 (long long)(task_index % num_gpus));
    else
        snprintf(worker_device, sizeof worker_device, "/job:worker/task:%lld", (long long)task_index);
    char task_device[64];
    snprintf(task_device, sizeof task_device, "/job:worker/task:%lld", (long long)task_index);
    dg_replica_device_setter_options ro = dg_replica_device_setter_options_default();
    ro.cluster = cluster;
    ro.worker_device = worker_device;
    // All-reduce keeps everything on this worker; otherwise variables go to the ps tasks.
    if (all_reduce) {
        dg_graph_push_device(g, worker_device);
    } else if ((setter = dg_replica_device_setter_new(&ro, st))) {
        dg_graph_push_device_fn(g, setter);
    } else {
        fail(st, "replica device setter");
        goto out;
    }
    replica_net m;
    dg_node *train = NULL;
    dg_loss_scale ls = {0};
    dg_output loss_factor = {NULL, 0};
    factor_one = dg_tensor_scalar_f32(1.0f);
    factor_big = dg_tensor_scalar_f32(1e30f);
    dg_sync_replicas_options sro = dg_sync_replicas_options_default();
    sro.replicas_to_aggregate = (int)replicas_to_aggregate;
    sro.total_num_replicas = n_workers;
    sro.task_index = (int)task_index;
    sro.timeout_ms = sync_timeout_ms;
    dg_collective_group grp = dg_collective_group_make("worker", elastic ? DG_COLLECTIVE_ELASTIC : n_workers);
    grp.timeout_ms = sync_timeout_ms;
    grp.wire_dtype = wire;
    bool built = build_model(g, p, lr, seed, train_steps, sync_replicas ? &sro : NULL, &sr, all_reduce ? &grp : NULL,
                             elastic ? NULL : &bcast, &m,
                             &train, fp16 ? &ls : NULL, &loss_factor, elastic && elastic_lr_scaling ? n_workers : 0,
                             wire, task_device, !all_reduce && dg_cluster_num_tasks(cluster, "ps") > 0, st);
    if (!built) {
        fail(st, "building the model");
        goto out;
    }
    if (m.n_grads > 0 && n_workers > 1 && !all_reduce) {
        fprintf(stderr, "%s: a pipeline over tasks runs with one worker (its first stage and the client) and a ps task "
                        "for each further stage; the cluster has %d workers (--all_reduce: a pipeline in each worker)\n",
                prog, n_workers);
        goto out;
    }
    if (all_reduce)
        dg_graph_pop_device(g);
    else
        dg_graph_pop_device_fn(g);
    // The loss as a scalar summary: with --checkpoint_path the chief writes it beside the
    // checkpoints every 100 steps (dg-inspect plot FILE --tag loss).
    dg_graph_push_device(g, worker_device);
    dg_summary_scalar(g, "loss", m.loss);
    // The first layer's weights as a TensorBoard histogram (written with --logdir only).
    if (dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES) > 0)
        dg_summary_histogram(g, "first_layer_weights",
                             (dg_output){dg_graph_collection_get(g, DG_TRAINABLE_VARIABLES, 0), 0});
    dg_graph_pop_device(g);
    if (*save_graph && task_index == 0 && !dg_graph_save(g, save_graph, st)) {
        fail(st, "--save_graph");
        goto out;
    }
    // Worker 0 is the chief: it restores the newest checkpoint or initializes the variables;
    // the others wait for it (IsVariableInitialized polls inside the monitored session).
    if (!(stop = dg_stop_at_last_step_hook_new(train_steps, st))) {
        fail(st, "stop hook");
        goto out;
    }
    report_hook report = {(long long)task_index, 0, all_reduce};
    dg_session_hook report_h = {.name = "report", .ctx = &report, .after_create_session = report_after_create};
    if (sync_replicas && !(mode_hook = dg_sync_replicas_hook_new(sr, is_chief, master, train_steps, st))) {
        fail(st, "sync replicas hook");
        goto out;
    }
    if (sync_replicas && sync_live_probe_ms > 0 &&
        (!server || !dg_sync_replicas_hook_follow_live_workers(mode_hook, server, "worker", sync_live_probe_ms, st))) {
        if (!server) dg_status_set(st, DG_INVALID_ARGUMENT, "--sync_live_probe_ms needs the worker's own server");
        fail(st, "sync replicas: following the live workers");
        goto out;
    }
    // All-reduce: after each creation (and restore) every worker takes worker 0's values. The
    // stop hook reads the global step the broadcast brings; the broadcast hook's order
    // (DG_HOOK_ORDER_SETUP) runs it first wherever it is in the list.
    // Elastic: the elastic hook does the broadcast, after each epoch it enters.
    if (elastic) {
        dg_elastic_options eo = dg_elastic_options_default();
        eo.server = server;
        eo.coordinator = dg_cluster_has_job(cluster, "ps") ? "/job:ps/task:0" : "/job:worker/task:0";
        eo.min_workers = elastic_min_workers > 0 ? (int)elastic_min_workers : n_workers;
        eo.commit_steps = elastic_commit_steps;
        eo.barrier_timeout_ms = elastic_barrier_ms;
        if (!server) {
            fprintf(stderr, "%s: --elastic runs with the worker's own server, not --existing_servers\n", prog);
            goto out;
        }
        if (!(mode_hook = dg_elastic_hook_new(&eo, st))) {
            fail(st, "elastic hook");
            goto out;
        }
    } else if (all_reduce && !(mode_hook = dg_broadcast_variables_hook_new(bcast, st))) {
        fail(st, "broadcast hook");
        goto out;
    }
    dg_session_hook *hooks[4] = {&report_h, stop, mode_hook};
    int n_hooks = sync_replicas || all_reduce ? 3 : 2;
    if (trace_step > 0) {
        char def[512];
        snprintf(def, sizeof def, "%s%stimeline_worker%lld_step%lld.json", logdir, *logdir ? "/" : "",
                 (long long)task_index, (long long)trace_step);
        if (!(trace_hook = dg_trace_hook_new(trace_step, *trace_file ? trace_file : def, NULL, st))) {
            fail(st, "--trace_step");
            goto out;
        }
        hooks[n_hooks++] = trace_hook;
    }
    // One thread per step: this model has little to run in parallel, and the cores are
    // better left to the other tasks and the transport.
    dg_session_options sopt = dg_session_options_default();
    sopt.inter_op_threads = 1;
    sopt.wait_for_tasks_ms = wait_for_tasks_ms;
    sopt.log_device_placement = log_device_placement;
    sopt.gpu_allow_tf32 = gpu_allow_tf32;
    if (rewrite && mpo.dtype != DG_INVALID_DTYPE) sopt.mixed_precision = &mpo;
    dg_mts_options mo = dg_mts_options_default();
    mo.session_options = &sopt;
    mo.master = master;
    // All-reduce: every worker initializes its own copy; worker 0, the chief, restores, saves
    // and writes summaries, and the broadcast hook gives every worker its values.
    mo.is_chief = is_chief;
    if (all_reduce) mo.init_variables = DG_ROLE_YES;
    mo.checkpoint_path = *checkpoint_path ? checkpoint_path : NULL;
    mo.logdir = *logdir ? logdir : NULL;
    mo.save_checkpoint_steps = save_checkpoint_steps;
    mo.wait_for_chief_ms = wait_ms;
    mo.max_recovery_attempts = (int)recovery_attempts;
    mo.hooks = hooks;
    mo.n_hooks = n_hooks;
    if (!is_chief && !all_reduce) {
        printf("Worker %lld: waiting for the chief to initialize the variables\n", (long long)task_index);
        fflush(stdout);
    }
    ms = dg_monitored_session_new(g, &mo, st);
    if (!ms && elastic && dg_status_code(st) == DG_OUT_OF_RANGE) {
        // Started after the group finished: nothing left to train.
        printf("Worker %lld: %s\n", (long long)task_index, dg_status_message(st));
        rc = 0;
        goto out;
    }
    if (!ms) {
        fail(st, "creating the monitored session");
        goto out;
    }
    if (p->after_session && !p->after_session(p->state, ms, task_index, n_workers, checkpoint_path, st)) {
        fail(st, "after creating the monitored session");
        goto out;
    }
    dg_session *s = dg_monitored_session_session(ms);
    if (print_placement) {
        for (int i = 0; i < dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES); i++) {
            dg_output v = {dg_graph_collection_get(g, DG_TRAINABLE_VARIABLES, i), 0};
            dg_tensor *val = NULL;
            if (!dg_session_run(s, NULL, NULL, 0, &v, &val, 1, NULL, 0, st)) {
                fail(st, "fetching a variable");
                goto out;
            }
            double sum = 0;
            for (int64_t k = 0; k < dg_tensor_num_elements(val); k++) sum += dg_tensor_get_as_double(val, k);
            printf("Worker %lld: variable %s on %s, %lld values summing to %.6f\n", (long long)task_index,
                   dg_node_name(v.node), dg_node_assigned_device(v.node),
                   (long long)dg_tensor_num_elements(val), sum);
            dg_tensor_unref(val);
        }
    }
    fflush(stdout);
    dg_output feeds[8];
    dg_tensor *vals[8];
    double t_start = now_s();
    int64_t local_step = 0, global_step = 0, skipped_steps = 0;
    double loss_scale = 0;
    printf("Training begins @ %f\n", unix_s());
    while (!dg_monitored_session_should_stop(ms)) {
        int n_feeds = p->next_batch(p->state, feeds, vals, (int)(sizeof feeds / sizeof feeds[0]), st);
        if (n_feeds < 0) {
            fail(st, "the next batch");
            goto out;
        }
        // The global step, the loss when the model logs it, the loss scaler's state with fp16.
        dg_output fetches[4] = {m.global_step};
        dg_tensor *got[4] = {NULL, NULL, NULL, NULL};
        int n_fetch = 1, at_loss = -1, at_scaler = -1, at_lr = -1;
        if (m.log_loss) fetches[at_loss = n_fetch++] = m.loss;
        if (elastic && elastic_lr_scaling) fetches[at_lr = n_fetch++] = m.opt.learning_rate_tensor;
        if (fp16) {   // the loss factor (1e30 while an overflow is forced), and the scaler's state
            bool force = force_overflow_at > 0 && local_step + 1 >= force_overflow_at &&
                         local_step + 1 < force_overflow_at + force_overflow_steps;
            if (n_feeds + 1 > (int)(sizeof feeds / sizeof feeds[0])) {
                dg_status_setf(st, DG_INTERNAL, "no room for the loss factor's feed");
                fail(st, "the next batch");
                goto out;
            }
            feeds[n_feeds] = loss_factor;
            vals[n_feeds++] = force ? factor_big : factor_one;
            at_scaler = n_fetch;
            fetches[n_fetch++] = ls.skipped_steps;
            fetches[n_fetch++] = ls.scale;
        }
        if (!dg_monitored_session_run(ms, feeds, vals, n_feeds, fetches, got, n_fetch, &train, 1, st)) {
            // Sync: the chief closed the token queue at the last step.
            if (sync_replicas && dg_status_code(st) == DG_OUT_OF_RANGE) {
                dg_status_reset(st);
                break;
            }
            if (p->explain_failure) p->explain_failure(p->state, st);
            fail(st, "training step");
            goto out;
        }
        global_step = dg_tensor_i64(got[0])[0];
        double step_loss = at_loss >= 0 ? dg_tensor_get_as_double(got[at_loss], 0) : 0;
        double step_lr = at_lr >= 0 ? dg_tensor_get_as_double(got[at_lr], 0) : 0;
        if (at_scaler >= 0) {
            int64_t skipped_now = dg_tensor_i64(got[at_scaler])[0];
            loss_scale = dg_tensor_get_as_double(got[at_scaler + 1], 0);
            if (skipped_now > skipped_steps)
                printf("%f: Worker %lld: local step %lld: gradients not finite, update skipped (loss scale now %g; "
                       "%lld steps skipped so far)\n", unix_s(), (long long)task_index, (long long)local_step + 1,
                       loss_scale, (long long)skipped_now);
            skipped_steps = skipped_now;
        }
        for (int k = 0; k < n_fetch; k++) dg_tensor_unref(got[k]);
        local_step++;
        if (local_step % log_every == 0) {
            // The loss of the step's batch, before its update (when the model asks for it).
            char lossbuf[96] = "";
            if (m.log_loss) snprintf(lossbuf, sizeof lossbuf, ", loss %.6f", step_loss);
            if (at_lr >= 0) snprintf(lossbuf + strlen(lossbuf), sizeof lossbuf - strlen(lossbuf), ", learning rate %g",
                                     step_lr);
            printf("%f: Worker %lld: training step %lld done (global step: %lld)%s\n", unix_s(), (long long)task_index,
                   (long long)local_step, (long long)global_step, lossbuf);
            fflush(stdout);
        }
    }
    double elapsed = now_s() - t_start;
    printf("Training ends @ %f\n", unix_s());
    printf("Training elapsed time: %f s (%lld local steps, %.1f local steps/s)\n", elapsed,
           (long long)local_step, (double)local_step / elapsed);
    if (fp16) printf("Loss scaling: scale %g, %lld steps skipped\n", loss_scale, (long long)skipped_steps);
    if (server) {   // what this task sent (gradients to the ps or the all-reduce, and the rest)
        char **names = NULL;
        int64_t *values = NULL;
        int n_counters = 0;
        dg_status *cst = dg_status_new();
        if (dg_server_query_counters(dg_server_target(server), NULL, NULL, 2000, &names, &values, &n_counters, cst))
            for (int i = 0; i < n_counters; i++)
                if (strcmp(names[i], "tensor_bytes_sent") == 0 && local_step > 0)
                    printf("Worker %lld: transport: %lld tensor bytes sent, %.0f per local step (gradients as %s)\n",
                           (long long)task_index, (long long)values[i], (double)values[i] / (double)local_step,
                           wire ? "bfloat16" : "float32");
        dg_server_counters_free(names, values, n_counters);
        dg_status_free(&cst);
    }
    dg_elastic_stats es;
    if (elastic && dg_elastic_hook_stats(mode_hook, &es))
        printf("Elastic: epoch %lld, %d members, rank %d; %lld epochs joined, %lld commits, %lld rollbacks undoing "
               "%lld global steps\n", (long long)es.epoch, es.n_members, es.rank, (long long)es.epochs_joined,
               (long long)es.commits, (long long)es.rollbacks, (long long)es.steps_rolled_back);
    // The step this worker stops at (a restored chief may not have trained at all).
    if ((global_step = dg_monitored_session_global_step(ms, st)) < 0) {
        fail(st, "reading the global step");
        goto out;
    }
    // The session may have been recreated during training.
    s = dg_monitored_session_session(ms);
    if (!p->evaluate(p->state, s, task_index, global_step, st)) {
        fail(st, "evaluating");
        goto out;
    }
    fflush(stdout);
    // The chief's final checkpoint is saved here.
    if (!dg_monitored_session_close(ms, st)) {
        fail(st, "closing the monitored session");
        goto out;
    }
    rc = 0;
out:
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&stop);
    dg_session_hook_free(&mode_hook);   // before the graph: a sync apply loop's session uses it
    dg_session_hook_free(&trace_hook);
    dg_sync_replicas_free(&sr);
    dg_graph_free(&g);
    dg_device_fn_free(&setter);
    p->free(p->state);
    dg_server_free(&server);
    dg_cluster_free(&cluster);
    dg_tensor_unref(factor_one);
    dg_tensor_unref(factor_big);
    dg_status_free(&st);
    return rc;
}
