/* dg-launch: runs a local cluster of N ps and M worker processes of one program on
 * 127.0.0.1, tells each its task (flags or TF_CONFIG), prefixes and interleaves their output
 * line by line, and stops the ps tasks once every worker is done. Any failing task stops the
 * whole cluster. Each child is the leader of its own process group, and every stop signal
 * goes to the group, so nothing a task started is left behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <distgraph/distgraph.h>

extern char **environ;

#define EXIT_USAGE 2
#define EXIT_TIMEOUT 124
#define STOP_GRACE_MS 5000
#define MAX_TASKS 1024
#define MAX_LINE_BYTES 65536   // a longer line is emitted in pieces of this size
#define DRAIN_MAX_BYTES (1 << 20)   // read at most this much after a task exits

static void usage(FILE *f) {
    fprintf(f,
        "usage: dg-launch --ps N --workers M [OPTIONS] -- PROGRAM [ARGS...]\n"
        "Starts a local cluster on 127.0.0.1: N ps and M worker processes, each running\n"
        "PROGRAM ARGS with its task appended, and waits for the workers.\n"
        "\n"
        "Options:\n"
        "  --ps N             number of ps tasks (0 or more, default 0)\n"
        "  --workers M        number of worker tasks (1 or more, required)\n"
        "  --workers MIN:MAX  a range, for programs whose workers come and go (an elastic\n"
        "                     all-reduce): the cluster has MAX worker tasks, workers\n"
        "                     0..MIN-1 start, and --control adds or removes the others\n"
        "  --control PATH     makes PATH a FIFO (it must not exist; removed at the end) and\n"
        "                     reads lines from it while the job runs: \"add [N]\" starts a\n"
        "                     worker that is not running (the lowest, or N), \"remove [N]\"\n"
        "                     stops one with SIGTERM (the highest, or N; not below MIN), and\n"
        "                     \"status\"; each change is one line: the workers running now\n"
        "  --base_port P      use the first N+M free ports from P upward (P, P+1, ... when\n"
        "                     they are free); default: ports the kernel picks as free\n"
        "  --mode MODE        how a task learns the cluster (default flags):\n"
        "                       flags      appends --job_name ps|worker --task_index I\n"
        "                                  --ps_hosts h:p,... --worker_hosts h:p,...\n"
        "                                  (--ps_hosts is left out when N is 0) and removes\n"
        "                                  TF_CONFIG from the task's environment\n"
        "                       tf_config  sets TF_CONFIG to {\"cluster\": {\"ps\": [...],\n"
        "                                  \"worker\": [...]}, \"task\": {\"type\": \"worker\",\n"
        "                                  \"index\": I}} and appends nothing\n"
        "                       standing   every ps and worker task is a standing dg-server\n"
        "                                  (the one beside dg-launch), and PROGRAM runs once\n"
        "                                  as a client, with --master dg://<worker 0>\n"
        "                                  --ps_hosts h:p,... --worker_hosts h:p,...\n"
        "                                  appended; the servers stop when it is done\n"
        "                       coordinator  as standing, but PROGRAM runs once as the\n"
        "                                  coordinator of a parameter-server job\n"
        "                                  (TensorFlow 2's ParameterServerStrategy): it gets\n"
        "                                  TF_CONFIG with a \"chief\" job beside ps and\n"
        "                                  worker and task {\"type\": \"chief\", \"index\": 0},\n"
        "                                  and nothing appended\n"
        "  --timeout S        stop everything after S seconds (decimals allowed), exit 124\n"
        "  --max_restarts K   a ps or worker task that fails (exits non-zero, or is killed by\n"
        "                     a signal) is started again, the same command, after 0.5 s,\n"
        "                     doubling up to 10 s, at most K times per task; the others go on\n"
        "                     (default 0: a failure stops every task). For programs that\n"
        "                     recover: a ps restores the chief's newest checkpoint, an elastic\n"
        "                     worker (mnist_replica --all_reduce --elastic) joins the group\n"
        "  --keep_ps          do not stop the ps tasks when the workers are done; wait for\n"
        "                     them to exit by themselves (or for Ctrl-C, or --timeout)\n"
        "  --no_auth          no keys: any process that reaches a port may run graphs\n"
        "                     (default: a fresh key pair per task and one for clients in a\n"
        "                     private directory, DG_KEY_DIR in every task's environment, so\n"
        "                     each task admits only this job's members; removed at the end.\n"
        "                     DG_KEY_DIR or DG_CURVE_* already set are used as they are)\n"
        "  --quiet            no dg-launch lines except errors\n"
        "  -h, --help         this text\n"
        "  --version          the distgraph version\n"
        "Flags take their value as the next argument or after '=' (--ps=2). Options end at\n"
        "'--' or at the first argument that does not start with '-'.\n"
        "\n");
    fprintf(f,
        "Threads: every task gets DG_INTRA_OP_THREADS = this host's cores / (N+M), at least 1,\n"
        "the threads one large op is split over, unless the environment sets it already.\n"
        "\n"        "Output: stdout and stderr of each task go to dg-launch's stdout, line by line, each\n"
        "line prefixed with the task, \"[ps0] \" or \"[worker1] \". dg-launch's own lines\n"
        "(\"dg-launch: ...\") go to stderr. Tasks read stdin from /dev/null. A task's stdout is\n"
        "a pipe, so C stdio buffers it fully: flush, or use setvbuf, to see lines as they come.\n"
        "\n"
        "Lifecycle: when every worker has exited with status 0, the ps tasks (which serve\n"
        "forever) get SIGTERM, and SIGKILL if they are still there after 5 s. When any task\n"
        "exits with a non-zero status or is killed by a signal, dg-launch reports it\n"
        "(\"dg-launch: worker 1 exited with status 3\", \"... killed by signal 9\") and stops\n"
        "all other tasks the same way (with --max_restarts, a ps or worker task with restarts\n"
        "left is started again instead). SIGINT or SIGTERM to dg-launch stops all tasks (a second\n"
        "one kills them at once). Each task is its own process group and every signal goes to\n"
        "the whole group; tasks also get SIGKILL if dg-launch itself dies.\n"
        "\n"
        "Exit status: 0 when every worker exited 0; 1 when a task failed or could not be\n"
        "started; 2 for bad usage; 124 on --timeout; 130 after SIGINT, 143 after SIGTERM.\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dg-launch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see dg-launch --help)\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

static void note(bool quiet, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(bool quiet, const char *fmt, ...) {
    if (quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("dg-launch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

// ---- options ----

typedef struct options {
    long n_ps, n_workers;     // n_workers: the most (--workers MIN:MAX's MAX)
    long min_workers;         // started at first, and the fewest a remove leaves
    const char *control;      // --control: a FIFO created here for add/remove/status lines
    long base_port;           // 0: kernel-picked ports
    bool tf_config_mode;
    bool standing;            // --mode standing or coordinator: dg-server tasks and one client
    bool coordinator;         // --mode coordinator: the client is the chief, told by TF_CONFIG
    double timeout_s;         // 0: none
    long max_restarts;        // per ps or worker task
    bool keep_ps, quiet, no_auth;
    char **program;           // PROGRAM ARGS..., NULL-terminated (points into argv)
} options;

static bool parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

// Returns 0 after filling o, -1 for --help (printed), or the usage exit status.
static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->n_workers = -1;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-') break;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--version") == 0) {
            printf("dg-launch (distgraph) %s\n", dg_version());
            return -1;
        }
        if (strncmp(a, "--", 2) != 0) return usage_error("unknown flag \"%s\"", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        char flag[64];
        snprintf(flag, sizeof flag, "%.*s", (int)(len < 63 ? len : 63), name);
        if (strcmp(flag, "keep_ps") == 0 || strcmp(flag, "quiet") == 0 || strcmp(flag, "no_auth") == 0) {
            if (eq) return usage_error("flag --%s takes no value, got \"%s\"", flag, eq + 1);
            if (flag[0] == 'k') o->keep_ps = true;
            else if (flag[0] == 'q') o->quiet = true;
            else o->no_auth = true;
            continue;
        }
        bool known = strcmp(flag, "ps") == 0 || strcmp(flag, "workers") == 0 || strcmp(flag, "base_port") == 0 ||
                     strcmp(flag, "mode") == 0 || strcmp(flag, "timeout") == 0 || strcmp(flag, "max_restarts") == 0 ||
                     strcmp(flag, "control") == 0;
        if (!known) return usage_error("unknown flag \"--%s\"", flag);
        const char *v;
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else return usage_error("flag --%s needs a value", flag);
        if (strcmp(flag, "ps") == 0) {
            if (!parse_long(v, 0, MAX_TASKS, &o->n_ps))
                return usage_error("--ps must be an integer in 0..%d, got \"%s\"", MAX_TASKS, v);
        } else if (strcmp(flag, "workers") == 0) {
            const char *colon = strchr(v, ':');
            char lo[32];
            snprintf(lo, sizeof lo, "%.*s", colon ? (int)(colon - v < 31 ? colon - v : 31) : 31, v);
            if (!parse_long(lo, 1, MAX_TASKS, &o->min_workers) ||
                !parse_long(colon ? colon + 1 : v, o->min_workers, MAX_TASKS, &o->n_workers))
                return usage_error("--workers must be M or MIN:MAX with 1 <= MIN <= MAX <= %d, got \"%s\"", MAX_TASKS,
                                   v);
        } else if (strcmp(flag, "control") == 0) {
            if (!*v || *v == '-') return usage_error("--control needs the path of a FIFO to make, got \"%s\"", v);
            o->control = v;
        } else if (strcmp(flag, "max_restarts") == 0) {
            if (!parse_long(v, 0, 1000000, &o->max_restarts))
                return usage_error("--max_restarts must be an integer in 0..1000000, got \"%s\"", v);
        } else if (strcmp(flag, "base_port") == 0) {
            if (!parse_long(v, 1, 65535, &o->base_port))
                return usage_error("--base_port must be a port in 1..65535, got \"%s\"", v);
        } else if (strcmp(flag, "mode") == 0) {
            o->tf_config_mode = strcmp(v, "tf_config") == 0;
            o->coordinator = strcmp(v, "coordinator") == 0;
            o->standing = o->coordinator || strcmp(v, "standing") == 0;
            if (!o->tf_config_mode && !o->standing && strcmp(v, "flags") != 0)
                return usage_error("--mode must be \"flags\", \"tf_config\", \"standing\" or \"coordinator\", got "
                                   "\"%s\"", v);
        } else {
            char *end;
            errno = 0;
            double t = strtod(v, &end);
            if (errno || *end || end == v || !(t > 0) || t > 1e7)
                return usage_error("--timeout must be a positive number of seconds, got \"%s\"", v);
            o->timeout_s = t;
        }
    }
    if (o->n_workers < 0) return usage_error("--workers is required");
    if (o->standing && (o->min_workers != o->n_workers || o->control))
        return usage_error("--mode %s takes a fixed number of workers and no --control",
                           o->coordinator ? "coordinator" : "standing");
    if (o->coordinator && o->n_ps < 1) return usage_error("--mode coordinator needs --ps 1 or more");
    if (o->n_ps + o->n_workers > MAX_TASKS) return usage_error("at most %d tasks in all", MAX_TASKS);
    if (i >= argc) return usage_error("no PROGRAM given (dg-launch ... -- PROGRAM ARGS...)");
    o->program = argv + i;
    return 0;
}

// ---- ports ----

static int probe_socket(int port, int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    // Same SO_REUSEADDR as the servers' listeners, so a port in TIME_WAIT counts as free.
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return -1;
    }
    *fd_out = fd;
    return ntohs(sa.sin_port);
}

// Picks n distinct free ports. All probe sockets stay open until every port is picked, so
// the kernel cannot hand out the same port twice.
static bool pick_ports(int n, long base_port, int *ports) {
    int *fds = calloc((size_t)n, sizeof *fds);
    if (!fds) return false;
    int got = 0;
    bool ok = true;
    long next = base_port;
    while (got < n) {
        int fd = -1, port;
        if (base_port) {
            if (next > 65535) {
                fprintf(stderr, "dg-launch: only %d free ports from %ld to 65535, need %d\n", got, base_port, n);
                ok = false;
                break;
            }
            port = probe_socket((int)next++, &fd);
            if (port < 0) continue;
        } else {
            port = probe_socket(0, &fd);
            if (port < 0) {
                fprintf(stderr, "dg-launch: cannot find a free port on 127.0.0.1: %s\n", strerror(errno));
                ok = false;
                break;
            }
        }
        fds[got] = fd;
        ports[got++] = port;
    }
    for (int k = 0; k < got; k++) close(fds[k]);
    free(fds);
    return ok;
}

// ---- tasks ----

typedef struct task {
    const char *job;     // "ps" or "worker"; "client" in standing mode
    bool waited;         // the workers (standing mode: the client): when they are done, all stop
    int index;
    char name[32];       // "ps0", for the prefix
    pid_t pid;           // also the process group id; 0 before the start
    int fd;              // read end of the output pipe, -1 when closed
    char *line;          // partial line
    size_t n_line;
    bool running;        // started and not yet reaped
    bool stopped;        // got a stop signal from us, so its exit is not a failure
    int status;          // from waitpid, valid once !running
    char **argv, **envp; // prepared before fork
    long restarts;       // times started again after a failure (--max_restarts)
    int64_t restart_at;  // when to start it again, -1: not pending
    bool standby;        // a worker of --workers MIN:MAX not started (yet), or removed: not waited for
    int64_t remove_kill_at;   // a removed worker still running then gets SIGKILL; -1: none
} task;

static int wake_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(wake_pipe[1], &b, 1) < 0) {}   // a full pipe already wakes the loop
    errno = saved;
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;   // stdout gone (EPIPE): keep managing the tasks anyway
        }
        p += w;
        n -= (size_t)w;
    }
}

// Writes "[name] " + line + "\n" in one write, so lines of different tasks never mix.
static void emit_line(const task *t, const char *s, size_t n) {
    size_t prefix = strlen(t->name) + 3;
    char stackbuf[4096];
    char *buf = prefix + n + 1 <= sizeof stackbuf ? stackbuf : malloc(prefix + n + 1);
    if (!buf) return;
    buf[0] = '[';
    memcpy(buf + 1, t->name, prefix - 3);
    memcpy(buf + prefix - 2, "] ", 2);
    memcpy(buf + prefix, s, n);
    buf[prefix + n] = '\n';
    write_all(STDOUT_FILENO, buf, prefix + n + 1);
    if (buf != stackbuf) free(buf);
}

static void take_output(task *t, const char *p, size_t n) {
    while (n > 0) {
        const char *nl = memchr(p, '\n', n);
        size_t chunk = nl ? (size_t)(nl - p) : n;
        if (t->n_line == 0 && nl) {
            emit_line(t, p, chunk);
        } else {
            size_t room = MAX_LINE_BYTES - t->n_line;
            size_t take = chunk < room ? chunk : room;
            memcpy(t->line + t->n_line, p, take);
            t->n_line += take;
            if (t->n_line == MAX_LINE_BYTES || nl) {
                emit_line(t, t->line, t->n_line);
                t->n_line = 0;
            }
            if (take < chunk) {   // the rest of an overlong line starts a new piece
                p += take;
                n -= take;
                continue;
            }
        }
        p += chunk + (nl ? 1 : 0);
        n -= chunk + (nl ? 1 : 0);
    }
}

static void close_output(task *t) {
    if (t->fd < 0) return;
    if (t->n_line) {
        emit_line(t, t->line, t->n_line);
        t->n_line = 0;
    }
    close(t->fd);
    t->fd = -1;
}

// Reads what is available; at EOF (or, with drain, after the task exited) closes the pipe.
// A grandchild may keep the pipe open after the task exits, so draining stops at EAGAIN
// instead of waiting for EOF.
static void read_output(task *t, bool drain) {
    char buf[16384];
    size_t total = 0;
    while (t->fd >= 0) {
        ssize_t r = read(t->fd, buf, sizeof buf);
        if (r > 0) {
            take_output(t, buf, (size_t)r);
            total += (size_t)r;
            if (!drain) return;
            if (total >= DRAIN_MAX_BYTES) break;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN && !drain) return;
        break;   // EOF, error, or drained
    }
    close_output(t);
}

static void describe_exit(const task *t, char *buf, size_t n) {
    if (WIFEXITED(t->status)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(t->status));
    else if (WIFSIGNALED(t->status)) snprintf(buf, n, "killed by signal %d", WTERMSIG(t->status));
    else snprintf(buf, n, "ended with wait status %d", t->status);
}

static bool exited_ok(const task *t) {
    return WIFEXITED(t->status) && WEXITSTATUS(t->status) == 0;
}

// Standing mode: the dg-server beside dg-launch, the cluster spec, the client's --master.
static char standing_server_path[4200], standing_spec[MAX_TASKS * 24 + 32], standing_master[64];
// Coordinator mode: "\"chief\": [\"127.0.0.1:<port>\"]", the coordinator's place in TF_CONFIG (no
// task serves there: the coordinator is a client of the others).
static char coordinator_job[64];
// The job's key directory ("DG_KEY_DIR=<dir>" for the tasks' environment; "" for none).
static char key_dir_env[4200];
static char key_dir[4096];
// "DG_INTRA_OP_THREADS=<n>": the host's cores shared among the tasks ("" when the environment
// sets it already).
static char threads_env[48];

// The cores dg-launch may use (its affinity mask), shared among n_tasks: at least 1 each.
static void share_cores(int n_tasks) {
    if (getenv("DG_INTRA_OP_THREADS")) return;
    cpu_set_t set;
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    long each = n_tasks > 0 && cores > n_tasks ? cores / n_tasks : 1;
    snprintf(threads_env, sizeof threads_env, "DG_INTRA_OP_THREADS=%ld", each);
}

// Makes a private key directory for the job: a key pair per task (named by its address) and
// one for clients. Returns false after printing why.
static bool make_job_keys(const int *ports, int n_tasks) {
    const char *tmp = getenv("TMPDIR");
    snprintf(key_dir, sizeof key_dir, "%s/dg-launch-keys-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(key_dir)) {
        fprintf(stderr, "dg-launch: cannot make a key directory %s: %s\n", key_dir, strerror(errno));
        key_dir[0] = 0;
        return false;
    }
    dg_status *st = dg_status_new();
    bool ok = dg_key_generate(key_dir, "client", st);
    for (int i = 0; ok && i < n_tasks; i++) {
        char addr[32], name[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", ports[i]);
        dg_key_name(addr, name, sizeof name);
        ok = dg_key_generate(key_dir, name, st);
    }
    if (!ok) fprintf(stderr, "dg-launch: making the job's keys: %s\n", dg_status_message(st));
    dg_status_free(&st);
    snprintf(key_dir_env, sizeof key_dir_env, "DG_KEY_DIR=%s", key_dir);
    return ok;
}

// Removes the key directory made by make_job_keys (its files, then itself).
static void remove_job_keys(void) {
    if (!key_dir[0]) return;
    DIR *d = opendir(key_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", key_dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(key_dir);
    key_dir[0] = 0;
}

// Builds the argv and environment of one task (before fork, so the child only calls
// async-signal-safe functions: the launcher may have library threads).
static bool prepare_task(task *t, const options *o, const char *ps_hosts, const char *worker_hosts,
                         const char *cluster_json) {
    int n_prog = 0;
    while (o->program[n_prog]) n_prog++;
    t->argv = calloc((size_t)n_prog + 9, sizeof *t->argv);
    if (!t->argv) return false;
    int k = 0;
    char index[16];
    snprintf(index, sizeof index, "%d", t->index);
    if (o->standing && strcmp(t->job, "client") != 0) {   // a standing server
        t->argv[k++] = standing_server_path;
        t->argv[k++] = "--cluster_spec";
        t->argv[k++] = standing_spec;
        t->argv[k++] = "--job_name";
        t->argv[k++] = (char *)t->job;
        t->argv[k++] = "--task_index";
        if (!(t->argv[k++] = strdup(index))) return false;
    } else if (o->coordinator) {   // the coordinator: its task from TF_CONFIG
        for (int i = 0; i < n_prog; i++) t->argv[k++] = o->program[i];
    } else if (o->standing) {   // the client
        for (int i = 0; i < n_prog; i++) t->argv[k++] = o->program[i];
        t->argv[k++] = "--master";
        t->argv[k++] = standing_master;
        if (o->n_ps > 0) {
            t->argv[k++] = "--ps_hosts";
            t->argv[k++] = (char *)ps_hosts;
        }
        t->argv[k++] = "--worker_hosts";
        t->argv[k++] = (char *)worker_hosts;
    }
    for (int i = 0; i < n_prog && !o->standing; i++) t->argv[k++] = o->program[i];
    if (!o->tf_config_mode && !o->standing) {
        t->argv[k++] = "--job_name";
        t->argv[k++] = (char *)t->job;
        t->argv[k++] = "--task_index";
        if (!(t->argv[k++] = strdup(index))) return false;
        if (o->n_ps > 0) {
            t->argv[k++] = "--ps_hosts";
            t->argv[k++] = (char *)ps_hosts;
        }
        t->argv[k++] = "--worker_hosts";
        t->argv[k++] = (char *)worker_hosts;
    }
    t->argv[k] = NULL;

    int n_env = 0;
    while (environ[n_env]) n_env++;
    t->envp = calloc((size_t)n_env + 4, sizeof *t->envp);
    if (!t->envp) return false;
    k = 0;
    for (int i = 0; i < n_env; i++)
        if (strncmp(environ[i], "TF_CONFIG=", 10) != 0 && (!key_dir_env[0] || strncmp(environ[i], "DG_KEY_DIR=", 11) != 0))
            t->envp[k++] = environ[i];
    if (key_dir_env[0]) t->envp[k++] = key_dir_env;
    if (threads_env[0]) t->envp[k++] = threads_env;
    if (o->tf_config_mode || (o->coordinator && strcmp(t->job, "client") == 0)) {
        size_t n = strlen(cluster_json) + strlen(coordinator_job) + strlen(t->job) + 80;
        char *e = malloc(n);
        if (!e) return false;
        if (o->coordinator)   // {"chief": [...], "ps": ...}: the chief job first, then the others
            snprintf(e, n, "TF_CONFIG={\"cluster\": {%s, %s, \"task\": {\"type\": \"chief\", \"index\": 0}}",
                     coordinator_job, cluster_json + 1);
        else
            snprintf(e, n, "TF_CONFIG={\"cluster\": %s, \"task\": {\"type\": \"%s\", \"index\": %d}}", cluster_json,
                     t->job, t->index);
        t->envp[k++] = e;
    }
    t->envp[k] = NULL;
    return true;
}

static void free_task(task *t, const options *o) {
    if (t->argv && o->standing && strcmp(t->job, "client") != 0) {
        free(t->argv[6]);
    } else if (t->argv && !o->tf_config_mode && !o->standing) {
        int n_prog = 0;
        while (o->program[n_prog]) n_prog++;
        free(t->argv[n_prog + 3]);
    }
    if (t->envp && (o->tf_config_mode || o->coordinator)) {
        for (int k = 0; t->envp[k]; k++)
            if (strncmp(t->envp[k], "TF_CONFIG=", 10) == 0) free(t->envp[k]);
    }
    free(t->argv);
    free(t->envp);
    free(t->line);
    if (t->fd >= 0) close(t->fd);
}

// In the child: only async-signal-safe calls from fork to exec.
static void child_exec(const task *t, int out_fd, pid_t launcher) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(127);   // the launcher died before prctl
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != STDIN_FILENO) {
        dup2(devnull, STDIN_FILENO);
        close(devnull);
    }
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(out_fd, STDERR_FILENO) < 0) _exit(127);
    if (out_fd != STDOUT_FILENO && out_fd != STDERR_FILENO) close(out_fd);
    execvpe(t->argv[0], t->argv, t->envp);
    // strerror is not async-signal-safe; name the common causes.
    const char *why = errno == ENOENT ? "no such file or command" : errno == EACCES ? "permission denied"
                    : errno == ENOEXEC ? "not an executable format" : "exec failed";
    const char *parts[] = {"dg-launch: cannot run \"", t->argv[0], "\": ", why, "\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (write(STDERR_FILENO, parts[i], strlen(parts[i])) < 0) break;
    _exit(127);
}

static bool start_task(task *t) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "dg-launch: cannot create a pipe for %s: %s\n", t->name, strerror(errno));
        return false;
    }
    pid_t launcher = getpid();
    // Signals wait until the child has its default handlers: run between fork and exec, this
    // process's handler would write into the wake pipe the child shares, and a stop signal
    // meant for the task would read as one sent to dg-launch.
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        fprintf(stderr, "dg-launch: cannot fork %s: %s\n", t->name, strerror(errno));
        close(p[0]);
        close(p[1]);
        return false;
    }
    if (pid == 0) {
        close(p[0]);
        child_exec(t, p[1], launcher);   // resets the handlers, then unblocks
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    // Also set here, so the group exists before the first signal we might send to it.
    setpgid(pid, pid);
    close(p[1]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    t->pid = pid;
    t->fd = p[0];
    t->running = true;
    return true;
}

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
    }
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Whether the task's process group still has members (the task or what it started).
static bool group_alive(const task *t) {
    return t->pid > 0 && kill(-t->pid, 0) == 0;
}

static void signal_group(task *t, int sig) {
    if (t->pid <= 0) return;
    if (t->running) t->stopped = true;
    kill(-t->pid, sig);
}

// ---- the worker range (--workers MIN:MAX) and the control FIFO (--control) ----

static bool worker_active(const task *t) {
    return strcmp(t->job, "worker") == 0 && !t->standby && (t->running || t->restart_at >= 0);
}

// One line per change of the job's workers: what changed, who runs now, the range.
static void print_members(const task *tasks, int n, const options *o, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void print_members(const task *tasks, int n, const options *o, const char *fmt, ...) {
    char what[160], list[MAX_TASKS * 6 + 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t len = 0;
    int k = 0;
    list[0] = 0;
    for (int i = 0; i < n && len + 8 < sizeof list; i++)
        if (worker_active(&tasks[i]))
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k++ ? "," : "", tasks[i].index);
    fprintf(stderr, "dg-launch: %s; workers [%s] (%d, range %ld..%ld)\n", what, list, k, o->min_workers, o->n_workers);
}

typedef struct control {
    int rd, wr;            // the FIFO, opened both ways so that a writer closing it is no end
    char line[256];
    size_t n;
    bool overlong;         // the line being read passed 255 bytes: dropped up to its newline
    bool made;             // the FIFO is ours to remove
} control;

// "add [N]", "remove [N]" or "status" from the control FIFO.
static void control_command(const char *cmd, task *tasks, int n, const options *o) {
    char verb[16] = "";
    long which = -1;
    char extra[8] = "";
    char num[32] = "";
    int got = sscanf(cmd, "%15s %31s %7s", verb, num, extra);
    if (got < 1) return;   // an empty line
    if (got == 3 || (got == 2 && !parse_long(num, 0, o->n_workers - 1, &which))) {
        fprintf(stderr, "dg-launch: control: \"%s\": expected add [N], remove [N] or status, N a worker in 0..%ld\n",
                cmd, o->n_workers - 1);
        return;
    }
    task *workers = tasks + o->n_ps;
    int active = 0;
    for (int i = 0; i < o->n_workers; i++) active += worker_active(&workers[i]);
    if (strcmp(verb, "status") == 0 && which < 0) {
        print_members(tasks, n, o, "status");
    } else if (strcmp(verb, "add") == 0) {
        task *t = NULL;
        for (int i = 0; i < o->n_workers && !t; i++)
            if ((which < 0 || i == which) && workers[i].standby && !workers[i].running) t = &workers[i];
        if (!t) {
            if (which >= 0)
                fprintf(stderr, "dg-launch: control: add: worker %ld %s\n", which,
                        workers[which].running ? "runs (or is still stopping)" : "is not free");
            else
                fprintf(stderr, "dg-launch: control: add: all %ld workers run (--workers ..%ld)\n", o->n_workers,
                        o->n_workers);
            return;
        }
        if (t->fd >= 0) {
            close(t->fd);
            t->fd = -1;
        }
        t->standby = false;
        t->waited = true;
        t->stopped = false;
        t->restarts = 0;
        t->remove_kill_at = -1;
        if (start_task(t)) {
            print_members(tasks, n, o, "worker %d added (pid %d)", t->index, (int)t->pid);
        } else {
            t->standby = true;
            t->waited = false;
        }
    } else if (strcmp(verb, "remove") == 0) {
        if (active <= o->min_workers) {
            fprintf(stderr, "dg-launch: control: remove refused: %d workers run, the least --workers allows is %ld\n",
                    active, o->min_workers);
            return;
        }
        task *t = NULL;
        for (int i = (int)o->n_workers - 1; i >= 0 && !t; i--)
            if ((which < 0 || i == which) && worker_active(&workers[i])) t = &workers[i];
        if (!t) {
            fprintf(stderr, "dg-launch: control: remove: worker %ld does not run\n", which);
            return;
        }
        t->standby = true;
        t->waited = false;
        t->restart_at = -1;
        if (t->running) {
            signal_group(t, SIGTERM);
            t->remove_kill_at = now_ms() + STOP_GRACE_MS;
        }
        print_members(tasks, n, o, "worker %d removed (SIGTERM)", t->index);
    } else {
        fprintf(stderr, "dg-launch: control: unknown command \"%s\" (add [N], remove [N], status)\n", cmd);
    }
}

// Reads what the FIFO has and runs each whole line.
static void control_read(control *c, task *tasks, int n, const options *o) {
    char b[512];
    ssize_t got;
    while ((got = read(c->rd, b, sizeof b)) > 0) {
        for (ssize_t i = 0; i < got; i++) {
            if (b[i] == '\n') {
                c->line[c->n] = 0;
                if (c->overlong) fprintf(stderr, "dg-launch: control: a line over 255 bytes, ignored\n");
                else control_command(c->line, tasks, n, o);
                c->n = 0;
                c->overlong = false;
            } else if (c->n + 1 < sizeof c->line) {
                c->line[c->n++] = b[i];
            } else {
                c->overlong = true;
            }
        }
    }
}

// ---- main loop ----

typedef enum phase { RUNNING, STOPPING, KILLED } phase;

int main(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc == -1) return 0;
    if (rc) return rc;

    int n = (int)(o.n_ps + o.n_workers) + (o.standing ? 1 : 0);
    control ctl = {.rd = -1, .wr = -1};   // before the first goto out, which reads it
    task *tasks = calloc((size_t)n, sizeof *tasks);
    int *ports = calloc((size_t)n, sizeof *ports);
    char *ps_hosts = NULL, *worker_hosts = NULL, *cluster_json = NULL;
    dg_cluster *cluster = NULL;
    dg_status *st = dg_status_new();
    rc = 1;
    if (!tasks || !ports || !st) {
        fprintf(stderr, "dg-launch: out of memory\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        tasks[i].fd = -1;
        tasks[i].restart_at = -1;
        tasks[i].remove_kill_at = -1;
    }
    if (!pick_ports((int)(o.n_ps + o.n_workers) + (o.coordinator ? 1 : 0), o.base_port, ports)) goto out;
    if (o.coordinator)
        snprintf(coordinator_job, sizeof coordinator_job, "\"chief\": [\"127.0.0.1:%d\"]", ports[o.n_ps + o.n_workers]);

    size_t hosts_cap = (size_t)n * 24 + 1;
    ps_hosts = calloc(1, hosts_cap);
    worker_hosts = calloc(1, hosts_cap);
    if (!ps_hosts || !worker_hosts) {
        fprintf(stderr, "dg-launch: out of memory\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        task *t = &tasks[i];
        bool is_ps = i < o.n_ps, is_client = i == o.n_ps + o.n_workers;
        t->job = is_client ? "client" : is_ps ? "ps" : "worker";
        t->index = is_client ? 0 : is_ps ? i : i - (int)o.n_ps;
        t->standby = !is_ps && !is_client && t->index >= o.min_workers;   // --workers MIN:MAX: MIN start
        t->waited = o.standing ? is_client : !is_ps && !t->standby;
        snprintf(t->name, sizeof t->name, "%s%d", t->job, t->index);
        char *list = is_ps ? ps_hosts : worker_hosts;
        size_t len = strlen(list);
        if (!is_client) snprintf(list + len, hosts_cap - len, "%s127.0.0.1:%d", len ? "," : "", ports[i]);
        t->line = malloc(MAX_LINE_BYTES);
        if (!t->line) {
            fprintf(stderr, "dg-launch: out of memory\n");
            goto out;
        }
    }
    // Keys: each task admits only this job's members, unless told otherwise or the
    // environment has keys of its own.
    bool env_keys = (getenv("DG_KEY_DIR") && *getenv("DG_KEY_DIR")) ||
                    (getenv("DG_CURVE_PUBLIC_KEY") && *getenv("DG_CURVE_PUBLIC_KEY"));
    if (!o.no_auth && !env_keys) {
        if (!make_job_keys(ports, (int)(o.n_ps + o.n_workers))) goto out;
        note(o.quiet, "keys for this job in %s (each task admits only its members; --no_auth runs without)", key_dir);
    } else if (o.no_auth) {
        note(o.quiet, "no authentication (--no_auth): any process that reaches these ports may run graphs");
    }
    // The library checks the addresses and writes the cluster JSON that TF_CONFIG carries.
    cluster = dg_cluster_from_flags(ps_hosts, worker_hosts, st);
    if (!cluster || !(cluster_json = dg_cluster_to_json(cluster))) {
        fprintf(stderr, "dg-launch: building the cluster: %s\n", dg_status_message(st));
        goto out;
    }
    if (o.standing) {
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        char *slash = len > 0 ? (self[len] = 0, strrchr(self, '/')) : NULL;
        if (!slash) {
            fprintf(stderr, "dg-launch: cannot find its own directory to run dg-server from\n");
            goto out;
        }
        *slash = 0;
        snprintf(standing_server_path, sizeof standing_server_path, "%s/dg-server", self);
        if (access(standing_server_path, X_OK) != 0) {
            fprintf(stderr, "dg-launch: --mode standing needs %s: %s\n", standing_server_path, strerror(errno));
            goto out;
        }
        snprintf(standing_spec, sizeof standing_spec, "%s%s%sworker|%s", o.n_ps ? "ps|" : "", o.n_ps ? ps_hosts : "",
                 o.n_ps ? ";" : "", worker_hosts);
        snprintf(standing_master, sizeof standing_master, "dg://127.0.0.1:%d", ports[o.n_ps]);
    }
    // Threads inside one op: the host's cores shared among the tasks (each taking every core,
    // they would preempt one another's executors).
    share_cores((int)(o.n_ps + o.n_workers));
    if (threads_env[0]) note(o.quiet, "%s for each task (this host's cores shared among %d tasks)", threads_env,
                             (int)(o.n_ps + o.n_workers));
    for (int i = 0; i < n; i++)
        if (!prepare_task(&tasks[i], &o, ps_hosts, worker_hosts, cluster_json)) {
            fprintf(stderr, "dg-launch: out of memory\n");
            goto out;
        }

    if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "dg-launch: cannot create a pipe: %s\n", strerror(errno));
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    // Orphans of the tasks become our children, so waitpid reaps them and a group whose
    // members are all dead does not linger as zombies (PID 1 in a container may not reap).
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (o.control) {
        if (mkfifo(o.control, 0600) != 0) {
            fprintf(stderr, "dg-launch: --control %s: %s (dg-launch makes the FIFO, and removes it at the end)\n",
                    o.control, strerror(errno));
            goto out;
        }
        ctl.made = true;
        ctl.rd = open(o.control, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        ctl.wr = ctl.rd >= 0 ? open(o.control, O_WRONLY | O_CLOEXEC) : -1;
        if (ctl.wr < 0) {
            fprintf(stderr, "dg-launch: --control %s: %s\n", o.control, strerror(errno));
            goto out;
        }
        note(o.quiet, "control: write \"add [N]\", \"remove [N]\" or \"status\" lines to %s", o.control);
    }
    struct pollfd *pfd = calloc((size_t)n + 2, sizeof *pfd);
    task **pfd_task = calloc((size_t)n + 2, sizeof *pfd_task);
    if (!pfd || !pfd_task) {
        fprintf(stderr, "dg-launch: out of memory\n");
        free(pfd);
        free(pfd_task);
        goto out;
    }
    note(o.quiet, "cluster %s; %s mode", cluster_json,
         o.coordinator ? "coordinator" : o.standing ? "standing" : o.tf_config_mode ? "tf_config" : "flags");
    int64_t start = now_ms();
    int64_t deadline = o.timeout_s > 0 ? start + (int64_t)(o.timeout_s * 1000.0 + 0.5) : -1;
    phase ph = RUNNING;
    int64_t kill_at = -1;
    int exit_code = 0;

    for (int i = 0; i < n; i++)
        if (!tasks[i].standby && !start_task(&tasks[i])) {
            exit_code = 1;
            ph = STOPPING;
            kill_at = now_ms() + STOP_GRACE_MS;
            for (int k = 0; k < i; k++) signal_group(&tasks[k], SIGTERM);
            break;
        }
    if (ph == RUNNING && (o.min_workers < o.n_workers || o.control)) print_members(tasks, n, &o, "started");

    for (;;) {
        int got_signal = 0;
        // Reap first, so the exit of a task is seen with all of its output. Other pids are
        // orphans the tasks left (we are their subreaper).
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int i = 0; i < n; i++) {
                task *t = &tasks[i];
                if (t->pid != pid || !t->running) continue;
                t->running = false;
                t->status = status;
                read_output(t, true);
                if (t->standby) {   // removed by a control command: its end is no failure
                    char why[64];
                    describe_exit(t, why, sizeof why);
                    t->remove_kill_at = -1;
                    note(o.quiet, "%s %d (removed) %s", t->job, t->index, why);
                    break;
                }
                bool restartable = strcmp(t->job, "ps") == 0 || strcmp(t->job, "worker") == 0;
                if (ph == RUNNING && !t->stopped && !exited_ok(t) && restartable && t->restarts < o.max_restarts) {
                    char why[64];
                    describe_exit(t, why, sizeof why);
                    int64_t backoff = 500;
                    for (long k = 0; k < t->restarts && backoff < 10000; k++) backoff *= 2;
                    if (backoff > 10000) backoff = 10000;
                    t->restart_at = now_ms() + backoff;
                    // One line per change of the job's tasks.
                    fprintf(stderr, "dg-launch: %s %d %s; starting it again in %.1f s (restart %ld of %ld)\n", t->job,
                            t->index, why, (double)backoff / 1000.0, t->restarts + 1, o.max_restarts);
                } else if (ph == RUNNING && !t->stopped && !exited_ok(t)) {
                    char why[64];
                    describe_exit(t, why, sizeof why);
                    fprintf(stderr, "dg-launch: %s %d %s%s\n", t->job, t->index, why,
                            o.max_restarts > 0 && restartable ? " (no restarts left)" : "");
                    exit_code = 1;
                    ph = STOPPING;
                    kill_at = now_ms() + STOP_GRACE_MS;
                    for (int k = 0; k < n; k++) signal_group(&tasks[k], SIGTERM);
                } else if (ph == RUNNING && !t->waited) {
                    note(o.quiet, "%s %d exited with status 0", t->job, t->index);
                }
                break;
            }
        }
        if (ph == RUNNING)
            for (int i = 0; i < n; i++) {
                task *t = &tasks[i];
                if (t->restart_at < 0 || now_ms() < t->restart_at) continue;
                t->restart_at = -1;
                t->restarts++;
                if (t->fd >= 0) {
                    close(t->fd);
                    t->fd = -1;
                }
                t->stopped = false;
                if (start_task(t)) {
                    fprintf(stderr, "dg-launch: %s %d started again (pid %d)\n", t->job, t->index, (int)t->pid);
                } else {
                    exit_code = 1;
                    ph = STOPPING;
                    kill_at = now_ms() + STOP_GRACE_MS;
                    for (int k = 0; k < n; k++) signal_group(&tasks[k], SIGTERM);
                }
            }
        for (int i = 0; i < n && ph == RUNNING; i++) {
            task *t = &tasks[i];
            if (t->remove_kill_at < 0 || now_ms() < t->remove_kill_at) continue;
            t->remove_kill_at = -1;
            if (group_alive(t)) {
                note(false, "%s %d (removed) did not stop within %d s, sending SIGKILL", t->job, t->index,
                     STOP_GRACE_MS / 1000);
                signal_group(t, SIGKILL);
            }
        }
        if (ph == RUNNING) {
            bool workers_done = true, all_done = true;
            for (int i = 0; i < n; i++) {
                bool alive = tasks[i].running || tasks[i].restart_at >= 0;
                if (alive) all_done = false;
                if (alive && tasks[i].waited) workers_done = false;
            }
            if (all_done || (workers_done && !o.keep_ps)) {
                if (!all_done && o.standing) note(o.quiet, "the client exited with status 0, stopping the servers");
                else if (!all_done) note(o.quiet, "the workers exited with status 0, stopping the ps tasks");
                ph = STOPPING;
                kill_at = now_ms() + STOP_GRACE_MS;
                // Every group, also of tasks that are done, so nothing they started stays.
                for (int k = 0; k < n; k++) signal_group(&tasks[k], SIGTERM);
            }
        }
        if (ph != RUNNING) {
            // After SIGKILL only our own children are waited for without limit; a group member
            // that survives it (in uninterruptible sleep) gets 2 s.
            bool give_up_groups = ph == KILLED && now_ms() >= kill_at + 2000;
            bool any = false;
            for (int i = 0; i < n && !any; i++)
                any = tasks[i].running || (!give_up_groups && group_alive(&tasks[i]));
            if (!any) break;
        }

        int64_t now = now_ms();
        if (ph == RUNNING && deadline >= 0 && now >= deadline) {
            fprintf(stderr, "dg-launch: timeout: still running after %g s, stopping all tasks\n", o.timeout_s);
            exit_code = EXIT_TIMEOUT;
            ph = STOPPING;
            kill_at = now + STOP_GRACE_MS;
            for (int k = 0; k < n; k++) signal_group(&tasks[k], SIGTERM);
        }
        if (ph == STOPPING && now >= kill_at) {
            for (int k = 0; k < n; k++) {
                if (tasks[k].running)
                    note(false, "%s %d did not stop within %d s, sending SIGKILL", tasks[k].job, tasks[k].index,
                         STOP_GRACE_MS / 1000);
                if (group_alive(&tasks[k])) signal_group(&tasks[k], SIGKILL);
            }
            ph = KILLED;
        }

        int n_pfd = 0;
        pfd[n_pfd].fd = wake_pipe[0];
        pfd[n_pfd].events = POLLIN;
        pfd_task[n_pfd++] = NULL;
        int ctl_slot = -1;
        if (ctl.rd >= 0 && ph == RUNNING) {
            ctl_slot = n_pfd;
            pfd[n_pfd].fd = ctl.rd;
            pfd[n_pfd].events = POLLIN;
            pfd_task[n_pfd++] = NULL;
        }
        for (int i = 0; i < n; i++)
            if (tasks[i].fd >= 0) {
                pfd[n_pfd].fd = tasks[i].fd;
                pfd[n_pfd].events = POLLIN;
                pfd_task[n_pfd++] = &tasks[i];
            }
        // While stopping, check every 50 ms for the kill time and for groups that still have
        // members after their task exited (nothing else would wake us for those).
        int64_t wait_ms = 1000;
        if (ph == RUNNING && deadline >= 0 && deadline - now < wait_ms) wait_ms = deadline > now ? deadline - now : 0;
        for (int i = 0; i < n && ph == RUNNING; i++) {
            if (tasks[i].restart_at >= 0 && tasks[i].restart_at - now < wait_ms)
                wait_ms = tasks[i].restart_at > now ? tasks[i].restart_at - now : 0;
            if (tasks[i].remove_kill_at >= 0 && tasks[i].remove_kill_at - now < wait_ms)
                wait_ms = tasks[i].remove_kill_at > now ? tasks[i].remove_kill_at - now : 0;
        }
        if (ph != RUNNING) wait_ms = 50;
        int r = poll(pfd, (nfds_t)n_pfd, (int)wait_ms);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "dg-launch: poll: %s\n", strerror(errno));
            for (int k = 0; k < n; k++) signal_group(&tasks[k], SIGKILL);
            exit_code = 1;
            ph = KILLED;
            continue;
        }
        if (r <= 0) continue;
        if (pfd[0].revents) {
            unsigned char b[64];
            ssize_t got;
            while ((got = read(wake_pipe[0], b, sizeof b)) > 0)
                for (ssize_t k = 0; k < got; k++)
                    if (b[k] != SIGCHLD) got_signal = b[k];
        }
        for (int k = 1; k < n_pfd; k++) {
            if (!pfd[k].revents) continue;
            if (k == ctl_slot) control_read(&ctl, tasks, n, &o);
            else read_output(pfd_task[k], false);
        }
        if (got_signal) {
            if (ph == RUNNING) {
                fprintf(stderr, "dg-launch: got %s, stopping all tasks\n", signal_name(got_signal));
                exit_code = 128 + got_signal;
                ph = STOPPING;
                kill_at = now_ms() + STOP_GRACE_MS;
                for (int k = 0; k < n; k++) signal_group(&tasks[k], SIGTERM);
            } else if (ph == STOPPING) {
                fprintf(stderr, "dg-launch: got %s while stopping, killing all tasks\n", signal_name(got_signal));
                if (exit_code == 0) exit_code = 128 + got_signal;
                for (int k = 0; k < n; k++)
                    if (group_alive(&tasks[k])) signal_group(&tasks[k], SIGKILL);
                ph = KILLED;
                kill_at = now_ms();
            }
        }
    }
    free(pfd);
    free(pfd_task);
    rc = exit_code;
out:
    if (ctl.rd >= 0) close(ctl.rd);
    if (ctl.wr >= 0) close(ctl.wr);
    if (ctl.made) unlink(o.control);
    remove_job_keys();
    if (tasks)
        for (int i = 0; i < n; i++) free_task(&tasks[i], &o);
    free(tasks);
    free(ports);
    free(ps_hosts);
    free(worker_hosts);
    free(cluster_json);
    dg_cluster_free(&cluster);
    dg_status_free(&st);
    return rc;
}
