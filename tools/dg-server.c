/* dg-server: runs one task of a cluster and serves until SIGINT or SIGTERM (a ps task, or a
 * worker that a remote client drives). The cluster comes from --cluster_spec, else
 * --ps_hosts/--worker_hosts, else TF_CONFIG; the task from --job_name/--task_index, else
 * TF_CONFIG's "task". Exit status: 0 after a clean stop, 1 when the server cannot start
 * (address in use, ...), 2 for bad input. `dg-server --gen_curve_keys` prints a CurveZMQ key
 * pair as DG_CURVE_PUBLIC_KEY=... / DG_CURVE_SECRET_KEY=... lines. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <distgraph/distgraph.h>

#define EXIT_BAD_INPUT 2

static void usage(FILE *f) {
    fprintf(f,
        "usage: dg-server [FLAGS]\n"
        "       dg-server --gen_keys DIR [cluster flags | --key_name NAME]\n"
        "       dg-server --gen_curve_keys\n"
        "Runs one task of a distgraph cluster and serves until SIGINT or SIGTERM.\n"
        "\n"
        "Cluster (first one given wins):\n"
        "  --cluster_spec SPEC     jobs as 'ps|h:p;h:p,worker|h:p' (TensorFlow's form, tasks 0..\n"
        "                          in order; the older 'ps|h:p,h:p;worker|h:p' is read too)\n"
        "  --ps_hosts LIST         comma list of ps addresses, with --worker_hosts\n"
        "  --worker_hosts LIST     comma list of worker addresses\n"
        "  TF_CONFIG (env)         {\"cluster\": {...}, \"task\": {\"type\": J, \"index\": I}}\n"
        "  --slurm_jobs JOBS       from the Slurm job step this runs in (srun): JOBS as\n"
        "                          'ps:1,worker:3'; jobs take the allocation's slots in name\n"
        "                          order, this task is the slot of SLURM_PROCID (job and index)\n"
        "  --slurm_port_base P     first port on each node (default 8888)\n"
        "  --slurm_tasks_per_node N  slots per node (default: SLURM_TASKS_PER_NODE)\n"
        "Task:\n"
        "  --job_name JOB          this task's job (default: TF_CONFIG's task.type)\n"
        "  --task_index I          this task's index in JOB (default: TF_CONFIG's task.index\n"
        "                          when the job comes from TF_CONFIG, else 0)\n"
        "Options:\n"
        "  --rpc_timeout_ms MS     deadline of each remote call (default 30000)\n"
        "  --busy_poll_us US       poll this long after each message before sleeping\n"
        "                          (default 150, or env DG_BUSY_POLL_US; 0: off)\n"
        "  --client_lease_ms MS    a remote client's session silent this long is closed and\n"
        "                          what it registered freed (default 5000)\n"
        "  (env) DG_CURVE_PUBLIC_KEY and DG_CURVE_SECRET_KEY: one CurveZMQ key pair for the\n"
        "                          whole cluster, 40-character Z85 strings, both or neither\n"
        "                          (never on the command line, where other users see it)\n"
        "  --key_dir DIR           CurveZMQ with a key pair per member (docs/SECURITY.md):\n"
        "                          this task's pair is DIR/<host>_<port>.key, it admits the\n"
        "                          public keys in DIR (default: env DG_KEY_DIR)\n"
        "  --bind_address ADDR     listen on ADDR (an IP address; 0.0.0.0: every interface) at\n"
        "                          the port of the task's address (default: a loopback address\n"
        "                          as it is, any other on every interface, as TensorFlow does)\n"
        "  --allow_unauthenticated serve an address other than loopback without CurveZMQ keys\n"
        "                          (refused otherwise: anyone reaching the port could run graphs)\n"
        "Limits (docs/PROTOCOL.md; each hit is logged and counted, dg-inspect server shows them):\n"
        "  --max_connections N     connections at once; the one idle longest makes room\n"
        "                          (default 4096, kept within the descriptor limit)\n"
        "  --max_inflight_mb MB    chunked transfers being received, all peers (default 4096)\n"
        "  --max_message_mb MB     largest frame taken in one message: a graph, a feed, a\n"
        "                          tensor up to 4 MiB (default 32); larger tensors go in chunks\n"
        "  --transfer_timeout_ms MS  a chunked transfer silent this long is dropped (30000)\n"
        "  --max_ping_echo_bytes B largest PING echoed (default 65536; -1: no limit)\n"
        "  --orphan_timeout_ms MS  graphs of a master whose connection closed are freed after\n"
        "                          this long unless it runs them again (default 60000)\n"
        "  --quiet                 no log lines\n"
        "  --gen_keys DIR          write a key pair for every task of the cluster and one\n"
        "                          for clients (client.key) into DIR (made mode 0700), exit;\n"
        "                          with --key_name NAME only DIR/NAME.key and .pub\n"
        "  --gen_curve_keys        print a fresh key pair as two lines\n"
        "                          DG_CURVE_PUBLIC_KEY=... and DG_CURVE_SECRET_KEY=..., exit\n"
        "  -h, --help              this text\n"
        "  --version               the distgraph version\n"
        "Flags take their value as the next argument or after '=' (--task_index=1).\n"
        "\n"
        "Exit status: 0 after a clean stop (SIGINT/SIGTERM), 1 when the server cannot start\n"
        "(e.g. its address is in use), 2 for bad flags, cluster or task.\n");
}

// Prints "dg-server: <message>" as one line and returns the bad-input exit status.
static int bad_input(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_input(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dg-server: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_BAD_INPUT;
}

typedef struct flags {
    const char *cluster_spec, *ps_hosts, *worker_hosts;
    const char *job_name, *task_index, *rpc_timeout_ms, *busy_poll_us, *client_lease_ms;
    const char *curve_public_key, *curve_secret_key;
    const char *max_connections, *max_inflight_mb, *max_message_mb, *transfer_timeout_ms, *max_ping_echo_bytes, *orphan_timeout_ms;
    const char *key_dir, *gen_keys, *key_name, *bind_address, *slurm_jobs, *slurm_port_base, *slurm_tasks_per_node;
    bool quiet, help, version, gen_curve_keys, allow_unauthenticated;
} flags;

typedef struct flag_def {
    const char *name;
    size_t offset;     // of the const char * (value flags) or bool (switches) in struct flags
    bool takes_value;
} flag_def;

static const flag_def flag_defs[] = {
    {"cluster_spec", offsetof(flags, cluster_spec), true},
    {"ps_hosts", offsetof(flags, ps_hosts), true},
    {"worker_hosts", offsetof(flags, worker_hosts), true},
    {"job_name", offsetof(flags, job_name), true},
    {"task_index", offsetof(flags, task_index), true},
    {"rpc_timeout_ms", offsetof(flags, rpc_timeout_ms), true},
    {"busy_poll_us", offsetof(flags, busy_poll_us), true},
    {"client_lease_ms", offsetof(flags, client_lease_ms), true},
    {"curve_public_key", offsetof(flags, curve_public_key), true},
    {"curve_secret_key", offsetof(flags, curve_secret_key), true},
    {"max_connections", offsetof(flags, max_connections), true},
    {"max_inflight_mb", offsetof(flags, max_inflight_mb), true},
    {"max_message_mb", offsetof(flags, max_message_mb), true},
    {"transfer_timeout_ms", offsetof(flags, transfer_timeout_ms), true},
    {"max_ping_echo_bytes", offsetof(flags, max_ping_echo_bytes), true},
    {"orphan_timeout_ms", offsetof(flags, orphan_timeout_ms), true},
    {"key_dir", offsetof(flags, key_dir), true},
    {"bind_address", offsetof(flags, bind_address), true},
    {"slurm_jobs", offsetof(flags, slurm_jobs), true},
    {"slurm_port_base", offsetof(flags, slurm_port_base), true},
    {"slurm_tasks_per_node", offsetof(flags, slurm_tasks_per_node), true},
    {"gen_keys", offsetof(flags, gen_keys), true},
    {"key_name", offsetof(flags, key_name), true},
    {"allow_unauthenticated", offsetof(flags, allow_unauthenticated), false},
    {"quiet", offsetof(flags, quiet), false},
    {"help", offsetof(flags, help), false},
    {"gen_curve_keys", offsetof(flags, gen_curve_keys), false},
};

// Fills f from argv; returns 0, or the exit status after printing the error.
static int parse_flags(int argc, char **argv, flags *f) {
    memset(f, 0, sizeof *f);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0) {
            f->help = true;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            f->version = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
            return bad_input("unexpected argument \"%s\" (flags start with --; see dg-server --help)", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag_def *d = NULL;
        for (size_t k = 0; k < sizeof flag_defs / sizeof flag_defs[0] && !d; k++)
            if (strlen(flag_defs[k].name) == len && strncmp(flag_defs[k].name, name, len) == 0)
                d = &flag_defs[k];
        if (!d) return bad_input("unknown flag \"--%.*s\" (see dg-server --help)", (int)len, name);
        char *field = (char *)f + d->offset;
        if (!d->takes_value) {
            if (eq) return bad_input("flag --%s takes no value, got \"%s\"", d->name, eq + 1);
            *(bool *)field = true;
            continue;
        }
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return bad_input("flag --%s needs a value", d->name);
        }
        *(const char **)field = value;
    }
    return 0;
}

// Strict decimal integer in [lo, hi].
static bool parse_int64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool is_z85_key(const char *k) {
    static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              ".-:+=^!/*?&<>()[]{}@%$#";
    return strlen(k) == 40 && strspn(k, z85) == 40;
}

// Describes the task indices of job for an error message: "0..3" or "0, 2, 5".
static void describe_tasks(const dg_cluster *c, const char *job, char *buf, size_t n_bytes) {
    int n = dg_cluster_num_tasks(c, job);
    if (n == 0) {
        snprintf(buf, n_bytes, "none");
        return;
    }
    if (dg_cluster_task_index(c, job, n - 1) == n - 1) {
        if (n == 1) snprintf(buf, n_bytes, "0");
        else snprintf(buf, n_bytes, "0..%d", n - 1);
        return;
    }
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 16 < n_bytes; i++)
        used += (size_t)snprintf(buf + used, n_bytes - used, "%s%d", i ? ", " : "",
                                 dg_cluster_task_index(c, job, i));
}

static void describe_jobs(const dg_cluster *c, char *buf, size_t n_bytes) {
    size_t used = 0;
    buf[0] = '\0';
    int n = dg_cluster_num_jobs(c);
    for (int i = 0; i < n && used + 70 < n_bytes; i++)
        used += (size_t)snprintf(buf + used, n_bytes - used, "%s%s", i ? ", " : "", dg_cluster_job(c, i));
    if (n == 0) snprintf(buf, n_bytes, "none");
}

// SIGINT/SIGTERM go through a self-pipe: the handler (installed before the server starts, so
// a signal that arrives while it is still starting is not lost) writes the signal number, and
// a thread reading the pipe stops the server. Blocking the signals and using sigwait is not
// enough, because threads that libraries start before main (the BLAS pool) keep them
// unblocked and a signal delivered there would take the default action.
static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(signal_pipe[1], &b, 1) < 0) {}
    errno = saved;
}

typedef struct signal_waiter {
    dg_server *server;
    bool quiet;
} signal_waiter;

static void *wait_for_signal(void *arg) {
    signal_waiter *w = arg;
    unsigned char sig = 0;
    while (read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {}
    if (!w->quiet) {
        fprintf(stderr, "dg-server %s: %s, stopping\n", dg_server_task_name(w->server),
                sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    dg_server_stop(w->server);
    return NULL;
}

static bool install_signal_handlers(void) {
    if (pipe(signal_pipe) != 0) return false;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return sigaction(SIGINT, &sa, NULL) == 0 && sigaction(SIGTERM, &sa, NULL) == 0;
}

static int gen_curve_keys(void) {
    char pub[41], sec[41];
    dg_status *st = dg_status_new();
    if (!dg_curve_keypair(pub, sec, st)) {
        fprintf(stderr, "dg-server: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
        dg_status_free(&st);
        return 1;
    }
    dg_status_free(&st);
    printf("DG_CURVE_PUBLIC_KEY=%s\nDG_CURVE_SECRET_KEY=%s\n", pub, sec);
    return fflush(stdout) == 0 ? 0 : 1;
}

// Writes DIR/name.key and .pub; says so, or why not.
static bool gen_key(const char *dir, const char *name) {
    dg_status *st = dg_status_new();
    bool ok = dg_key_generate(dir, name, st);
    if (ok) printf("%s/%s.key\n", dir, name);
    else fprintf(stderr, "dg-server: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
    dg_status_free(&st);
    return ok;
}

// --gen_keys DIR: a key pair for every task of c, named by its address, and client.key.
static int gen_cluster_keys(const char *dir, const dg_cluster *c) {
    bool ok = gen_key(dir, "client");
    dg_status *st = dg_status_new();
    for (int j = 0; ok && j < dg_cluster_num_jobs(c); j++) {
        const char *job = dg_cluster_job(c, j);
        for (int i = 0; ok && i < dg_cluster_num_tasks(c, job); i++) {
            const char *addr = dg_cluster_task_address(c, job, dg_cluster_task_index(c, job, i), st);
            char name[300];
            dg_key_name(addr ? addr : "", name, sizeof name);
            ok = addr && gen_key(dir, name);
        }
    }
    dg_status_free(&st);
    if (ok) fprintf(stderr, "dg-server: copy %s/*.pub and each machine's own .key files to the machines; "
                    "never a .key file to a machine that does not run it\n", dir);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    flags f;
    int rc = parse_flags(argc, argv, &f);
    if (rc) return rc;
    if (f.help) {
        usage(stdout);
        return 0;
    }
    if (f.version) {
        printf("dg-server (distgraph) %s\n", dg_version());
        return 0;
    }
    if (f.gen_curve_keys) return gen_curve_keys();
    if (f.gen_keys && f.key_name) return gen_key(f.gen_keys, f.key_name) ? 0 : 1;

    dg_status *st = dg_status_new();
    dg_tf_config tf;
    memset(&tf, 0, sizeof tf);
    tf.task_index = -1;
    bool have_tf = false;
    dg_cluster *cluster = NULL;
    dg_server *server = NULL;
    const char *cluster_source = NULL;
    rc = EXIT_BAD_INPUT;

    // TF_CONFIG is read only when it supplies something the flags do not, so a stale or
    // broken TF_CONFIG in the environment does not stop a fully flagged start.
    bool need_tf = !f.cluster_spec && !f.ps_hosts && !f.worker_hosts;
    if (!f.job_name) need_tf = true;
    const char *tf_source = "TF_CONFIG";
    if (f.slurm_jobs) {
        // A Slurm job step: the cluster and this task from its environment (srun).
        dg_slurm_options so = {.jobs = f.slurm_jobs};
        int64_t v = 0;
        if (f.slurm_port_base && !parse_int64(f.slurm_port_base, 1, 65535, &v)) {
            bad_input("--slurm_port_base must be a port (1..65535), got \"%s\"", f.slurm_port_base);
            goto out;
        }
        so.port_base = (int)v;
        v = 0;
        if (f.slurm_tasks_per_node && !parse_int64(f.slurm_tasks_per_node, 1, 65535, &v)) {
            bad_input("--slurm_tasks_per_node must be 1 or more, got \"%s\"", f.slurm_tasks_per_node);
            goto out;
        }
        so.tasks_per_node = (int)v;
        if (!dg_slurm_from_env(&so, &tf, st)) {
            bad_input("--slurm_jobs %s: %s", f.slurm_jobs, dg_status_message(st));
            goto out;
        }
        have_tf = true;
        tf_source = "Slurm";
    } else if (need_tf) {
        if (dg_tf_config_from_env(&tf, st)) {
            have_tf = true;
        } else if (dg_status_code(st) != DG_NOT_FOUND) {
            bad_input("%s", dg_status_message(st));
            goto out;
        }
        dg_status_reset(st);
    }

    if (f.cluster_spec) {
        cluster_source = "--cluster_spec";
        cluster = dg_cluster_from_spec_string(f.cluster_spec, st);
    } else if (f.ps_hosts || f.worker_hosts) {
        cluster_source = "--ps_hosts/--worker_hosts";
        if ((!f.ps_hosts || !*f.ps_hosts) && (!f.worker_hosts || !*f.worker_hosts)) {
            bad_input("--ps_hosts and --worker_hosts are both empty");
            goto out;
        }
        cluster = dg_cluster_from_flags(f.ps_hosts, f.worker_hosts, st);
    } else if (have_tf && tf.cluster) {
        cluster_source = tf_source;
        cluster = dg_cluster_copy(tf.cluster);
        if (!cluster) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory copying the cluster");
    } else {
        bad_input(have_tf ? "TF_CONFIG has no \"cluster\" and no --cluster_spec or --ps_hosts/--worker_hosts was given"
                          : "no cluster: give --cluster_spec, --ps_hosts/--worker_hosts, or set TF_CONFIG");
        goto out;
    }
    if (!cluster) {
        bad_input("%s: %s", cluster_source, dg_status_message(st));
        goto out;
    }
    if (dg_cluster_total_tasks(cluster) == 0) {
        bad_input("%s: the cluster has no tasks", cluster_source);
        goto out;
    }
    if (f.gen_keys) {
        rc = gen_cluster_keys(f.gen_keys, cluster);
        goto out;
    }

    const char *job = f.job_name;
    int64_t task = 0;
    if (!job) {
        if (!have_tf || tf.task_type[0] == '\0') {
            bad_input(have_tf ? "missing --job_name (TF_CONFIG has no \"task\")"
                              : "missing --job_name (and TF_CONFIG is not set)");
            goto out;
        }
        job = tf.task_type;
        task = tf.task_index;
    }
    if (!*job) {
        bad_input("--job_name is empty");
        goto out;
    }
    if (f.task_index && !parse_int64(f.task_index, 0, INT_MAX, &task)) {
        bad_input("--task_index must be a non-negative integer, got \"%s\"", f.task_index);
        goto out;
    }
    char list[512];
    if (!dg_cluster_has_job(cluster, job)) {
        describe_jobs(cluster, list, sizeof list);
        bad_input("job \"%s\" is not in the cluster from %s (jobs: %s)", job, cluster_source, list);
        goto out;
    }
    if (!dg_cluster_task_address(cluster, job, (int)task, NULL)) {
        describe_tasks(cluster, job, list, sizeof list);
        bad_input("task index %lld is out of range for job \"%s\" in the cluster from %s (tasks: %s)",
                  (long long)task, job, cluster_source, list);
        goto out;
    }
    // A cluster takes any address, as TensorFlow's does; the one this task binds must be usable.
    if (!dg_cluster_check_task(cluster, job, (int)task, st)) {
        bad_input("%s: %s", cluster_source, dg_status_message(st));
        goto out;
    }

    dg_server_options opts = dg_server_options_default();
    if (f.rpc_timeout_ms && !parse_int64(f.rpc_timeout_ms, 1, INT64_MAX / 1000000, &opts.rpc_timeout_ms)) {
        bad_input("--rpc_timeout_ms must be a positive integer, got \"%s\"", f.rpc_timeout_ms);
        goto out;
    }
    if (f.busy_poll_us && !parse_int64(f.busy_poll_us, 0, 1000000, &opts.busy_poll_us)) {
        bad_input("--busy_poll_us must be an integer from 0 (off) to 1000000, got \"%s\"", f.busy_poll_us);
        goto out;
    }
    if (f.busy_poll_us && opts.busy_poll_us == 0) opts.busy_poll_us = -1;   // the option's 0 is the default
    if (f.client_lease_ms && !parse_int64(f.client_lease_ms, 100, 86400000, &opts.client_lease_ms)) {
        bad_input("--client_lease_ms must be an integer from 100 to 86400000, got \"%s\"", f.client_lease_ms);
        goto out;
    }
    int64_t v = 0;
    if (f.max_connections && !parse_int64(f.max_connections, 16, 1 << 20, &v)) {
        bad_input("--max_connections must be an integer from 16 to 1048576, got \"%s\"", f.max_connections);
        goto out;
    }
    opts.max_connections = (int)v;
    if (f.max_inflight_mb && !parse_int64(f.max_inflight_mb, 8, (int64_t)1 << 30, &opts.max_inflight_bytes)) {
        bad_input("--max_inflight_mb must be an integer from 8 to 1073741824, got \"%s\"", f.max_inflight_mb);
        goto out;
    }
    opts.max_inflight_bytes <<= 20;
    if (f.max_message_mb && !parse_int64(f.max_message_mb, 1, 2047, &opts.max_message_bytes)) {
        bad_input("--max_message_mb must be an integer from 1 to 2047, got \"%s\"", f.max_message_mb);
        goto out;
    }
    opts.max_message_bytes <<= 20;
    if (f.transfer_timeout_ms && !parse_int64(f.transfer_timeout_ms, 100, 86400000, &opts.transfer_timeout_ms)) {
        bad_input("--transfer_timeout_ms must be an integer from 100 to 86400000, got \"%s\"", f.transfer_timeout_ms);
        goto out;
    }
    if (f.max_ping_echo_bytes && !parse_int64(f.max_ping_echo_bytes, -1, INT64_MAX, &opts.max_ping_echo_bytes)) {
        bad_input("--max_ping_echo_bytes must be -1 (no limit) or a number of bytes, got \"%s\"",
                  f.max_ping_echo_bytes);
        goto out;
    }
    if (f.max_ping_echo_bytes && opts.max_ping_echo_bytes == 0) opts.max_ping_echo_bytes = 1;   // 0 is the default
    if (f.orphan_timeout_ms && !parse_int64(f.orphan_timeout_ms, 100, 86400000, &opts.orphan_timeout_ms)) {
        bad_input("--orphan_timeout_ms must be an integer from 100 to 86400000, got \"%s\"", f.orphan_timeout_ms);
        goto out;
    }
    opts.allow_unauthenticated = f.allow_unauthenticated;
    opts.bind_address = f.bind_address;
    opts.key_dir = f.key_dir;
    if (f.curve_public_key || f.curve_secret_key) {
        bad_input("--curve_public_key/--curve_secret_key: keys are not taken from the command line (every user "
                  "of the host sees it in /proc/*/cmdline); set DG_CURVE_PUBLIC_KEY and DG_CURVE_SECRET_KEY in "
                  "the environment, or use a key directory (--key_dir; docs/SECURITY.md)");
        goto out;
    }
    const char *pub = getenv("DG_CURVE_PUBLIC_KEY"), *sec = getenv("DG_CURVE_SECRET_KEY");
    const char *pub_src = "DG_CURVE_PUBLIC_KEY", *sec_src = "DG_CURVE_SECRET_KEY";
    if (pub && !*pub) pub = NULL;
    if (sec && !*sec) sec = NULL;
    if (!pub != !sec) {
        bad_input("%s is given without %s; CurveZMQ needs both keys or neither", pub ? pub_src : sec_src,
                  pub ? sec_src : pub_src);
        goto out;
    }
    if (pub && !is_z85_key(pub)) {
        bad_input("%s must be a 40-character Z85 key, got %zu characters", pub_src, strlen(pub));
        goto out;
    }
    if (sec && !is_z85_key(sec)) {
        bad_input("%s must be a 40-character Z85 key, got %zu characters", sec_src, strlen(sec));
        goto out;
    }
    opts.curve_public_key = pub;
    opts.curve_secret_key = sec;
    opts.quiet = f.quiet;

    signal_waiter waiter;
    memset(&waiter, 0, sizeof waiter);
    if (!install_signal_handlers()) {
        fprintf(stderr, "dg-server: cannot install the SIGINT/SIGTERM handlers: %s\n", strerror(errno));
        rc = 1;
        goto out;
    }
    rc = 1;
    server = dg_server_new(cluster, job, (int)task, &opts, st);
    if (!server) {
        fprintf(stderr, "dg-server: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
        goto out;
    }
    waiter.server = server;
    waiter.quiet = f.quiet;
    pthread_t tid;
    if (pthread_create(&tid, NULL, wait_for_signal, &waiter) != 0) {
        fprintf(stderr, "dg-server: cannot start the signal thread\n");
        goto out;
    }
    pthread_detach(tid);
    // The waiter thread stops the server on a signal; join then returns.
    if (!dg_server_join(server, false, st)) {
        fprintf(stderr, "dg-server: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
        goto out;
    }
    rc = 0;
out:
    dg_server_free(&server);
    dg_cluster_free(&cluster);
    dg_tf_config_clear(&tf);
    dg_status_free(&st);
    return rc;
}
