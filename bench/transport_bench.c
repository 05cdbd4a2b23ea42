/* transport_bench: the ZeroMQ transport between two processes over tcp://127.0.0.1, through
 * the public API and the server's transport benchmark hooks (runtime/server/ping_impl.h). A
 * 2-task cluster "bench|127.0.0.1:A,127.0.0.1:B": task 0 is served by a forked child, task 1 by this process, which measures
 *   - PING round trips (rt_server_ping; the payload goes out and is echoed back) for payloads
 *     of 4 B, 4 KiB, 256 KiB, 4 MiB and 64 MiB: median and p90 after warm-up;
 *   - one-way bandwidth of 64 MiB tensors pushed as rendezvous values (rt_server_push_bench,
 *     the path Send/Recv takes: 1 MiB chunks), and of the 64 MiB echo (bytes both ways / time);
 *   - iperf3 over the same loopback in the same run, for scale: as it comes (128 KiB writes)
 *     and with 1 MiB writes like our chunks (skipped with a note when iperf3 is missing);
 *   - for the 4 B round trip, two floors under it: plain ZeroMQ REQ/REP between two processes
 *     (no headers, no threads of ours), and a plain TCP socket with blocking reads (no
 *     ZeroMQ: the cheapest round trip for threads that sleep while they wait), with ratios.
 *     Our transport busy-polls briefly (dg_server_options.busy_poll_us; DG_BUSY_POLL_US=0
 *     turns it off to compare).
 * On a loaded machine the figures move a lot; compare runs taken side by side.
 * Prints JSON lines: {"bench": "transport_bench", "metric": ..., "value": ..., "unit": ...} */
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "distgraph/distgraph.h"
#include "flags.h"
#include "ping_impl.h"   // the transport's own test and benchmark hooks

extern char **environ;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void emit(const char *metric, double value, const char *unit) {
    printf("{\"bench\": \"transport_bench\", \"metric\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"}\n", metric, value,
           unit);
    fflush(stdout);
}

static void emit_n(const char *metric, double value, const char *unit, long n) {
    printf("{\"bench\": \"transport_bench\", \"metric\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"n\": %ld}\n", metric,
           value, unit, n);
    fflush(stdout);
}

// Task 0: serve until SIGTERM.
static int child_main(const dg_cluster *c) {
    dg_status *st = dg_status_new();
    dg_server_options o = dg_server_options_default();
    o.quiet = true;
    o.max_ping_echo_bytes = -1;   // the round trips echo up to 64 MiB,
    o.max_message_bytes = (int64_t)1 << 30;   // in one frame each way
    dg_server *s = dg_server_new(c, "bench", 0, &o, st);
    if (!s) {
        fprintf(stderr, "transport_bench (task 0): %s\n", dg_status_message(st));
        return 1;
    }
    dg_server_join(s, true, st);
    dg_server_free(&s);
    dg_status_free(&st);
    return 0;
}

// Plain ZeroMQ: a forked REP process echoes 4 bytes, this one times REQ round trips. Returns
// the median in microseconds, or -1.
static double raw_zmq_rtt_us(int port, long iters, long warmup) {
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    long total = iters + warmup;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        void *ctx = zmq_ctx_new();
        void *rep = zmq_socket(ctx, ZMQ_REP);
        char b[8];
        if (zmq_bind(rep, ep) != 0) _exit(1);
        for (long i = 0; i < total; i++)
            if (zmq_recv(rep, b, sizeof b, 0) < 0 || zmq_send(rep, b, 4, 0) < 0) _exit(1);
        zmq_close(rep);
        zmq_ctx_term(ctx);
        _exit(0);
    }
    void *ctx = zmq_ctx_new();
    void *req = zmq_socket(ctx, ZMQ_REQ);
    int timeout = 5000, zero = 0;
    zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof zero);
    double *d = malloc((size_t)iters * sizeof *d), med = -1;
    char b[8];
    long i = 0;
    if (d && zmq_connect(req, ep) == 0)
        for (; i < total; i++) {
            double t0 = now_s();
            if (zmq_send(req, "ping", 4, 0) < 0 || zmq_recv(req, b, sizeof b, 0) < 0) break;
            if (i >= warmup) d[i - warmup] = (now_s() - t0) * 1e6;
        }
    if (i == total) {
        qsort(d, (size_t)iters, sizeof *d, cmp);
        med = d[iters / 2];
    }
    free(d);
    zmq_close(req);
    zmq_ctx_term(ctx);
    if (i < total) kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return med;
}

// Plain TCP: a forked process echoes 4 bytes with blocking reads and writes (TCP_NODELAY);
// this one times round trips. Returns the median in microseconds, or -1.
static double raw_tcp_rtt_us(int port, long iters, long warmup) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) return -1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0) {
        close(ls);
        return -1;
    }
    long total = iters + warmup;
    pid_t pid = fork();
    if (pid < 0) {
        close(ls);
        return -1;
    }
    if (pid == 0) {
        int s = accept(ls, NULL, NULL);
        if (s < 0) _exit(1);
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char b[4];
        for (long i = 0; i < total; i++)
            if (recv(s, b, 4, MSG_WAITALL) != 4 || send(s, b, 4, 0) != 4) _exit(1);
        _exit(0);
    }
    close(ls);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    double *d = malloc((size_t)iters * sizeof *d), med = -1;
    long i = 0;
    if (s >= 0 && d && connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char b[4] = "ping";
        for (; i < total; i++) {
            double t0 = now_s();
            if (send(s, b, 4, 0) != 4 || recv(s, b, 4, MSG_WAITALL) != 4) break;
            if (i >= warmup) d[i - warmup] = (now_s() - t0) * 1e6;
        }
    }
    if (i == total) {
        qsort(d, (size_t)iters, sizeof *d, cmp);
        med = d[iters / 2];
    }
    free(d);
    if (s >= 0) close(s);
    if (i < total) kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return med;
}

static dg_tensor *payload(size_t n_bytes) {
    dg_tensor *t = dg_tensor_new(DG_UINT8, dg_shape1((int64_t)n_bytes), NULL);
    if (t) memset(dg_tensor_data(t), 0x5a, n_bytes);
    return t;
}

// Round trips of one payload size: median and p90 in microseconds.
static bool rtt(dg_server *me, const char *peer, size_t n_bytes, const char *label, long iters, long warmup,
                double max_seconds, double *median, dg_status *st) {
    dg_tensor *t = payload(n_bytes);
    if (!t) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "payload of %zu bytes", n_bytes);
        return false;
    }
    double *us = malloc((size_t)iters * sizeof *us);
    long n = 0;
    bool ok = true;
    for (long i = 0; i < warmup && ok; i++) ok = rt_server_ping(me, peer, &t, 1, 30000, NULL, NULL, st);
    double start = now_s();
    while (ok && n < iters && (n < 20 || now_s() - start < max_seconds)) {
        dg_tensor **echo = NULL;
        int n_echo = 0;
        double t0 = now_s();
        ok = rt_server_ping(me, peer, &t, 1, 30000, &echo, &n_echo, st);
        double t1 = now_s();
        if (ok) {
            us[n++] = (t1 - t0) * 1e6;
            if (n_echo != 1 || dg_tensor_nbytes(echo[0]) != n_bytes) {
                dg_status_setf(st, DG_DATA_LOSS, "echo of %zu bytes came back wrong", n_bytes);
                ok = false;
            }
            for (int k = 0; k < n_echo; k++) dg_tensor_unref(echo[k]);
            free(echo);
        }
    }
    if (ok) {
        qsort(us, (size_t)n, sizeof *us, cmp);
        char m[64];
        snprintf(m, sizeof m, "rtt_median_%s", label);
        emit_n(m, us[n / 2], "us", n);
        *median = us[n / 2];
        snprintf(m, sizeof m, "rtt_p90_%s", label);
        emit_n(m, us[(n * 9) / 10], "us", n);
        if (n_bytes >= (64u << 20)) {
            // The echo moves the payload both ways.
            emit_n("echo_bandwidth_64MiB", 2.0 * (double)n_bytes / (us[n / 2] * 1e-6) * 8 / 1e9, "Gbit/s", n);
        }
    }
    free(us);
    dg_tensor_unref(t);
    return ok;
}

// One-way pushes of 64 MiB tensors: rounds of n_pushes, each ended by a PING the task answers
// after taking in every byte. Returns the median over rounds in Gbit/s, or -1.
static double push_bandwidth(dg_server *me, const char *peer, size_t n_bytes, int n_pushes, int rounds, dg_status *st) {
    dg_tensor *t = payload(n_bytes);
    if (!t) return -1;
    double *gbps = malloc((size_t)rounds * sizeof *gbps);
    bool ok = rt_server_push_bench(me, peer, t, 2, 60000, st);   // warm-up
    for (int r = 0; r < rounds && ok; r++) {
        double t0 = now_s();
        ok = rt_server_push_bench(me, peer, t, n_pushes, 120000, st);
        double dt = now_s() - t0;
        gbps[r] = (double)n_bytes * n_pushes * 8 / dt / 1e9;
    }
    double med = -1;
    if (ok) {
        qsort(gbps, (size_t)rounds, sizeof *gbps, cmp);
        med = gbps[rounds / 2];
        emit_n("push_bandwidth_64MiB", med, "Gbit/s", (long)rounds * n_pushes);
        emit_n("push_bandwidth_64MiB_best", gbps[rounds - 1], "Gbit/s", (long)rounds * n_pushes);
    }
    free(gbps);
    dg_tensor_unref(t);
    return med;
}

// iperf3 over loopback: one server (-1: one test, then exit) and a client for `seconds`
// writing `write_len` bytes per call ("" for iperf3's default, 128 KiB). Returns the
// receiver's bits per second / 1e9, or -1 with a note on stderr.
static double iperf3_gbps(int port, int seconds, const char *write_len) {
    if (system("command -v iperf3 > /dev/null 2>&1") != 0) {
        fprintf(stderr, "transport_bench: iperf3 is not installed (apt-get install iperf3); no reference figure\n");
        return -1;
    }
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    char *srv_argv[] = {"iperf3", "-s", "-B", "127.0.0.1", "-p", port_s, "-1", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t srv;
    if (posix_spawnp(&srv, "iperf3", &fa, NULL, srv_argv, environ) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        fprintf(stderr, "transport_bench: cannot start iperf3 -s\n");
        return -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    double gbps = -1;
    for (int attempt = 0; attempt < 20 && gbps < 0; attempt++) {
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "iperf3 -c 127.0.0.1 -p %d -t %d %s%s -J 2>/dev/null", port, seconds,
                 *write_len ? "-l " : "", write_len);
        FILE *p = popen(cmd, "r");
        if (!p) break;
        size_t cap = 1 << 16, len = 0;
        char *json = malloc(cap);
        size_t got;
        while ((got = fread(json + len, 1, cap - len - 1, p)) > 0) {
            len += got;
            if (len + 1 >= cap) json = realloc(json, cap *= 2);
        }
        json[len] = 0;
        pclose(p);
        const char *sum = strstr(json, "\"sum_received\"");
        const char *bps = sum ? strstr(sum, "\"bits_per_second\"") : NULL;
        if (bps) gbps = strtod(strchr(bps, ':') + 1, NULL) / 1e9;
        free(json);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (gbps < 0) fprintf(stderr, "transport_bench: iperf3 gave no result\n");
    return gbps;
}

int main(int argc, char **argv) {
    int64_t iters = 2000, warmup = 200, port = 0, rounds = 5, pushes = 16, iperf_seconds = 3, max_bytes = 64 << 20;
    double max_seconds = 30;
    bool skip_iperf = false, auth = false;
    flag_def defs[] = {
        {"iters", FLAG_INT, &iters, "timed round trips per payload size (default 2000)"},
        {"warmup", FLAG_INT, &warmup, "untimed round trips first (default 200; 10 for 64 MiB)"},
        {"max_seconds", FLAG_DOUBLE, &max_seconds, "stop a size's round trips after this long (default 30)"},
        {"rounds", FLAG_INT, &rounds, "bandwidth rounds (default 5)"},
        {"pushes", FLAG_INT, &pushes, "64 MiB pushes per bandwidth round (default 16)"},
        {"port", FLAG_INT, &port, "first of five ports (default: from the process id)"},
        {"iperf_seconds", FLAG_INT, &iperf_seconds, "iperf3 -t (default 3)"},
        {"skip_iperf", FLAG_BOOL, &skip_iperf, "do not run iperf3"},
        {"max_bytes", FLAG_INT, &max_bytes, "largest round-trip payload; under 64 MiB also skips bandwidth"},
        {"auth", FLAG_BOOL, &auth, "CurveZMQ between the two tasks (a fresh key directory, DG_KEY_DIR)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: transport_bench [flags]", &help))
        return 2;
    if (help) return 0;
    if (iters < 1 || warmup < 0 || rounds < 1 || pushes < 1 || port < 0 || port > 65000) {
        fprintf(stderr, "transport_bench: bad flag value\n");
        return 2;
    }
    // Below the kernel's ephemeral range (32768 on, by default): a port from it may be taken
    // meanwhile by any outgoing connection's local end (the bind then fails, "in use").
    if (!port) port = 12000 + (getpid() % 4000) * 5;   // five ports each: 12000..31999
    char spec[128];
    snprintf(spec, sizeof spec, "bench|127.0.0.1:%d,127.0.0.1:%d", (int)port, (int)port + 1);
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", (int)port);
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    if (!c) {
        fprintf(stderr, "transport_bench: %s\n", dg_status_message(st));
        return 1;
    }
    char key_dir[64] = "";
    if (auth) {   // a key pair per task, named by address; both tasks read DG_KEY_DIR
        snprintf(key_dir, sizeof key_dir, "/tmp/dg-bench-keys-XXXXXX");
        bool ok = mkdtemp(key_dir) != NULL;
        for (int i = 0; ok && i < 2; i++) {
            char addr[32], name[64];
            snprintf(addr, sizeof addr, "127.0.0.1:%d", (int)port + i);
            dg_key_name(addr, name, sizeof name);
            ok = dg_key_generate(key_dir, name, st);
        }
        if (!ok || setenv("DG_KEY_DIR", key_dir, 1) != 0) {
            fprintf(stderr, "transport_bench: keys: %s\n", dg_status_message(st));
            return 1;
        }
        printf("{\"bench\": \"transport_bench\", \"metric\": \"auth\", \"value\": 1, \"unit\": \"CurveZMQ on\"}\n");
    }
    fflush(stdout);
    // The floor under the 4 B round trip on this machine now, measured before any thread of
    // ours exists (it forks).
    double raw = raw_zmq_rtt_us((int)port + 4, iters, warmup);
    double raw_tcp = raw_tcp_rtt_us((int)port + 5, iters, warmup);
    pid_t child = fork();   // before any thread exists here
    if (child < 0) {
        perror("transport_bench: fork");
        return 1;
    }
    if (child == 0) _exit(child_main(c));

    int rc = 1;
    dg_server_options o = dg_server_options_default();
    o.quiet = true;
    o.max_message_bytes = (int64_t)1 << 30;   // its 64 MiB echoes go in one frame
    dg_server *me = dg_server_new(c, "bench", 1, &o, st);
    if (!me) goto out;
    // Wait for task 0.
    bool up = false;
    for (int i = 0; i < 100 && !up; i++) {
        up = rt_server_ping(me, peer, NULL, 0, 200, NULL, NULL, st);
        if (!up) dg_status_reset(st);
    }
    if (!up) {
        dg_status_set(st, DG_UNAVAILABLE, "task 0 did not come up");
        goto out;
    }
    const struct {
        size_t n;
        const char *label;
    } sizes[] = {{4, "4B"}, {4096, "4KiB"}, {256u << 10, "256KiB"}, {4u << 20, "4MiB"}, {64u << 20, "64MiB"}};
    double rtt_median_4b = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes && sizes[i].n <= (size_t)max_bytes; i++) {
        long w = sizes[i].n >= (64u << 20) ? (warmup < 10 ? warmup : 10) : warmup;
        double med = 0;
        if (!rtt(me, peer, sizes[i].n, sizes[i].label, iters, w, max_seconds, &med, st)) goto out;
        if (sizes[i].n == 4) rtt_median_4b = med;
    }
    if (raw > 0) {
        emit_n("raw_zmq_rtt_median_4B", raw, "us", iters);
        if (rtt_median_4b > 0) emit("rtt_median_4B_vs_raw_zmq", rtt_median_4b / raw, "ratio");
    }
    if (raw_tcp > 0) {
        emit_n("raw_tcp_rtt_median_4B", raw_tcp, "us", iters);
        if (rtt_median_4b > 0) emit("rtt_median_4B_vs_raw_tcp", rtt_median_4b / raw_tcp, "ratio");
    }
    double ours = 0;
    if (max_bytes >= (64 << 20) && (ours = push_bandwidth(me, peer, 64u << 20, (int)pushes, (int)rounds, st)) < 0)
        goto out;
    if (!skip_iperf && ours > 0) {
        // iperf3 as it comes (128 KiB writes), and with the 1 MiB writes our chunks make.
        double ref = iperf3_gbps((int)port + 2, (int)iperf_seconds, "");
        if (ref > 0) {
            emit("iperf3_loopback", ref, "Gbit/s");
            emit("push_bandwidth_vs_iperf3", ours / ref, "ratio");
        }
        double ref1m = iperf3_gbps((int)port + 3, (int)iperf_seconds, "1M");
        if (ref1m > 0) {
            emit("iperf3_loopback_1MiB_writes", ref1m, "Gbit/s");
            emit("push_bandwidth_vs_iperf3_1MiB_writes", ours / ref1m, "ratio");
        }
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "transport_bench: %s\n", dg_status_message(st));
    dg_server_free(&me);
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    if (key_dir[0]) {   // the two pairs written above
        for (int i = 0; i < 2; i++) {
            char addr[32], name[64], path[160];
            snprintf(addr, sizeof addr, "127.0.0.1:%d", (int)port + i);
            dg_key_name(addr, name, sizeof name);
            snprintf(path, sizeof path, "%s/%s.key", key_dir, name);
            unlink(path);
            snprintf(path, sizeof path, "%s/%s.pub", key_dir, name);
            unlink(path);
        }
        rmdir(key_dir);
    }
    dg_cluster_free(&c);
    dg_status_free(&st);
    return rc;
}
