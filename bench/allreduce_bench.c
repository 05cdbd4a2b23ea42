/* allreduce_bench: all-reduce (sum) of float32 buffers between N processes on 127.0.0.1, one
 * server each, through CollectiveAllReduce; prints a JSON line per (N, size) as nccl-tests
 * reports them: time per all-reduce, algorithm bandwidth (bytes / time) and bus bandwidth
 * (algbw * 2(N-1)/N, what each link carries in a ring).
 *   build/bin/allreduce_bench --nprocs 2,4 --min_bytes 4096 --max_bytes 268435456
 * bench/peers/torch_allreduce.py does the same with torch.distributed (gloo);
 * bench/allreduce_compare.sh runs both. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <distgraph/distgraph.h>

#include "flags.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

// Iterations per size: enough to average out scheduling noise on small buffers, a few on big
// ones. Every rank computes the same count.
static int iterations(int64_t bytes, int64_t scale) {
    int64_t it = ((int64_t)64 << 20) * scale / (bytes > 0 ? bytes : 1);
    return (int)(it < 3 ? 3 : it > 200 ? 200 : it);
}

static int die(dg_status *st, int rank, const char *what) {
    fprintf(stderr, "allreduce_bench rank %d: %s: %s: %s\n", rank, what, dg_code_name(dg_status_code(st)),
            dg_status_message(st));
    return 1;
}

// One rank: its server, a graph with one all-reduce over a fed vector, every size in turn.
static int run_rank(const char *spec, int n, int rank, int64_t min_bytes, int64_t max_bytes, int64_t scale,
                    const char *hint) {
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    if (!c) return die(st, rank, "cluster");
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *server = dg_server_new(c, "worker", rank, &so, st);
    if (!server) return die(st, rank, "server");
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(-1)), y;
    dg_collective_group grp = dg_collective_group_make("worker", n);
    grp.timeout_ms = 120000;
    dg_collective_all_reduce(g, "allreduce", &x, 1, &grp, 1, DG_REDUCE_SUM, *hint ? hint : NULL, &y);
    if (!dg_graph_ok(g)) return die(st, rank, "graph");
    dg_session *s = dg_session_new(g, dg_server_target(server), NULL, st);
    if (!s) return die(st, rank, "session");
    int rc = 0;
    for (int64_t bytes = min_bytes; bytes <= max_bytes && rc == 0; bytes *= 4) {
        int64_t len = bytes / 4;
        dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape1(len), st);
        if (!t) {
            rc = die(st, rank, "input");
            break;
        }
        for (int64_t i = 0; i < len; i++) dg_tensor_f32(t)[i] = (float)(rank + 1) + (float)(i % 7);
        // Check the result once, then warm up (and line the ranks up) before timing.
        dg_tensor *out = NULL;
        if (!dg_session_run(s, &x, &t, 1, &y, &out, 1, NULL, 0, st)) {
            rc = die(st, rank, "all-reduce");
            dg_tensor_unref(t);
            break;
        }
        for (int64_t i = 0; i < len; i += len / 3 + 1) {
            float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
            if (dg_tensor_f32(out)[i] != want) {
                fprintf(stderr, "allreduce_bench rank %d: element %lld is %g, want %g\n", rank, (long long)i,
                        dg_tensor_f32(out)[i], want);
                rc = 1;
            }
        }
        dg_tensor_unref(out);
        int iters = iterations(bytes, scale);
        for (int w = 0; w < 2 && rc == 0; w++)
            if (!dg_session_run(s, &x, &t, 1, NULL, NULL, 0, &y.node, 1, st)) rc = die(st, rank, "all-reduce");
        double t0 = now_s();
        for (int i = 0; i < iters && rc == 0; i++)
            if (!dg_session_run(s, &x, &t, 1, NULL, NULL, 0, &y.node, 1, st)) rc = die(st, rank, "all-reduce");
        double ms = (now_s() - t0) * 1e3 / iters;
        dg_tensor_unref(t);
        if (rc == 0 && rank == 0) {
            double algbw = (double)bytes / (ms * 1e-3) / 1e9;
            printf("{\"bench\":\"allreduce\",\"impl\":\"distgraph\",\"nprocs\":%d,\"bytes\":%lld,\"time_ms\":%.4f,"
                   "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"iters\":%d}\n",
                   n, (long long)bytes, ms, algbw, algbw * 2.0 * (n - 1) / n, iters);
            fflush(stdout);
        }
    }
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_server_free(&server);
    dg_cluster_free(&c);
    dg_status_free(&st);
    return rc;
}

int main(int argc, char **argv) {
    const char *nprocs = "2,3,4", *hint = "";
    int64_t min_bytes = 4096, max_bytes = (int64_t)256 << 20, scale = 1, rank = -1, n_flag = 0;
    const char *spec = "";
    flag_def defs[] = {
        {"nprocs", FLAG_STRING, &nprocs, "comma list of process counts (default 2,3,4)"},
        {"min_bytes", FLAG_INT, &min_bytes, "smallest buffer (default 4096); sizes go up by 4x"},
        {"max_bytes", FLAG_INT, &max_bytes, "largest buffer (default 268435456)"},
        {"scale", FLAG_INT, &scale, "iteration multiplier (default 1: about 64 MiB moved per size, 3..200 runs)"},
        {"hint", FLAG_STRING, &hint, "communication_hint: auto (default), ring or direct"},
        {"rank", FLAG_INT, &rank, "internal: run one rank of --cluster with --n ranks"},
        {"n", FLAG_INT, &n_flag, "internal"},
        {"cluster", FLAG_STRING, &spec, "internal"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: allreduce_bench [flags]", &help))
        return 2;
    if (help) return 0;
    if (min_bytes < 4 || max_bytes < min_bytes || scale < 1) {
        fprintf(stderr, "allreduce_bench: bad --min_bytes, --max_bytes or --scale\n");
        return 2;
    }
    if (rank >= 0) return run_rank(spec, (int)n_flag, (int)rank, min_bytes, max_bytes, scale, hint);
    int rc = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", nprocs);
    for (char *tok = strtok(list, ","); tok && rc == 0; tok = strtok(NULL, ",")) {
        int n = atoi(tok);
        if (n < 1 || n > 64) {
            fprintf(stderr, "allreduce_bench: bad process count \"%s\"\n", tok);
            return 2;
        }
        char cl[4096] = "worker|";
        for (int r = 0; r < n; r++) {
            size_t l = strlen(cl);
            snprintf(cl + l, sizeof cl - l, "%s127.0.0.1:%d", r ? "," : "", free_port());
        }
        // Each rank is this program again (exec, not just fork: a fresh process, as a
        // launcher would start it).
        pid_t pids[64];
        for (int r = 0; r < n; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                char a_rank[32], a_n[32], a_min[32], a_max[32], a_scale[32];
                snprintf(a_rank, sizeof a_rank, "--rank=%d", r);
                snprintf(a_n, sizeof a_n, "--n=%d", n);
                snprintf(a_min, sizeof a_min, "--min_bytes=%lld", (long long)min_bytes);
                snprintf(a_max, sizeof a_max, "--max_bytes=%lld", (long long)max_bytes);
                snprintf(a_scale, sizeof a_scale, "--scale=%lld", (long long)scale);
                char *args[] = {argv[0], a_rank, a_n, a_min, a_max, a_scale, "--cluster", cl, "--hint",
                                (char *)hint, NULL};
                execv("/proc/self/exe", args);
                _exit(127);
            }
        }
        for (int r = 0; r < n; r++) {
            int status;
            waitpid(pids[r], &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "allreduce_bench: rank %d of %d failed\n", r, n);
                rc = 1;
            }
        }
    }
    return rc;
}
