/* dg-inspect calibrate: measures this machine for the automatic placer's cost model and writes
 * a calibration file (docs/PLACEMENT.md): the CPU's dense arithmetic (a 512^3 float32 MatMul),
 * its memory traffic (Adds of 4M-float vectors), the cost of one op (a chain of 1x1 MatMuls),
 * and the links between two CPUs of one process and between two tasks of this host
 * (two servers in this process on 127.0.0.1, talking as two processes do). Each figure is a
 * median of runs; the figures it writes are printed as they are measured. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "inspect.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median seconds of running target (feeding feed) over about budget seconds, at least 5
// runs after 2 warm-ups; -1 on error.
static double time_runs(dg_session *s, dg_node *target, dg_output *feed, dg_tensor *value, double budget,
                        dg_status *st) {
    double t[512];
    int n = 0;
    double start = now_s();
    for (int k = 0; k < 2 + 512 && (k < 7 || now_s() - start < budget); k++) {
        double t0 = now_s();
        if (!dg_session_run(s, feed, &value, feed ? 1 : 0, NULL, NULL, 0, &target, 1, st)) return -1;
        if (k >= 2 && n < 512) t[n++] = now_s() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

static dg_tensor *filled(int64_t n, dg_status *st) {
    dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape1(n), st);
    if (!t) return NULL;
    float *v = dg_tensor_data(t);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(i % 7) * 0.25f;
    return t;
}

// A graph reading placeholder x ([n] floats) on device a, adding it to itself there, and adding
// the sum to itself on device b; NULL a and b: no device asked for. Returns the second Add.
static dg_node *pair_graph(dg_graph *g, int64_t n, const char *a, const char *b, dg_output *x) {
    *x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(n));
    dg_graph_push_device(g, a ? a : "");
    dg_output y = dg_add(g, "y", *x, *x);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, b ? b : "");
    dg_output z = dg_add(g, "z", y, y);
    dg_graph_pop_device(g);
    return z.node;
}

// The seconds a tensor of n floats takes from device a to device b of session target (minus
// the same graph on one device), and the local time.
static double transfer_s(const char *target, const dg_session_options *so, int64_t n, const char *a, const char *b,
                         double budget, dg_status *st) {
    double t[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        dg_graph *g = dg_graph_new();
        dg_output x;
        dg_node *z = pair_graph(g, n, a, k == 0 ? a : b, &x);
        dg_session *s = dg_session_new(g, target, so, st);
        dg_tensor *v = filled(n, st);
        if (s && v) t[k] = time_runs(s, z, &x, v, budget, st);
        dg_tensor_unref(v);
        dg_session_free(&s);
        dg_graph_free(&g);
        if (t[k] < 0) return -1;
    }
    double d = t[1] - t[0];
    return d > 1e-7 ? d : 1e-7;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static bool link_figures(double small_s, double large_s, int64_t large_bytes, dg_link_perf *out) {
    double bw_time = large_s - small_s;
    if (bw_time < 1e-6) bw_time = 1e-6;
    out->latency_s = small_s;
    out->bytes_per_s = (double)large_bytes / bw_time;
    return out->bytes_per_s > 0;
}

int inspect_cmd_calibrate(const inspect_options *o) {
    dg_status *st = dg_status_new();
    dg_cost_model *m = dg_cost_model_new();
    int rc = 1;
    const double budget = 0.5;
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 1;
    dg_device_perf cpu = {0, 0, 0};
    dg_link_perf same_task, same_host;
    dg_server *servers[2] = {NULL, NULL};
    dg_cluster *c = NULL;
    fprintf(stderr, "calibrating (%s) ...\n", dg_cpu_summary());
    {   // Dense arithmetic: 2 n^3 FLOPs.
        const int64_t n = 512;
        dg_graph *g = dg_graph_new();
        dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(n, n));
        dg_output mm = dg_matmul(g, "mm", a, a, false, false);
        dg_session *s = dg_session_new(g, "local", &so, st);
        dg_tensor *v = dg_tensor_new(DG_FLOAT32, dg_shape2(n, n), st);
        if (v) memset(dg_tensor_data(v), 0, (size_t)(n * n) * sizeof(float));
        double t = s && v ? time_runs(s, mm.node, &a, v, budget, st) : -1;
        dg_tensor_unref(v);
        dg_session_free(&s);
        dg_graph_free(&g);
        if (t <= 0) goto out;
        cpu.flops_per_s = 2.0 * (double)(n * n * n) / t;
    }
    {   // Memory traffic: two 16 MB inputs read, one written.
        const int64_t n = (int64_t)4 << 20;
        dg_graph *g = dg_graph_new();
        dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(n));
        dg_output y = dg_placeholder(g, "w", DG_FLOAT32, dg_shape1(n));
        dg_output sum = dg_add(g, "sum", x, dg_add(g, "w2", y, y));
        (void)sum;
        dg_session *s = dg_session_new(g, "local", &so, st);
        dg_tensor *v = filled(n, st);
        dg_output feeds[2] = {x, y};   // both fed the same tensor
        dg_tensor *vals[2] = {v, v};
        double times[64];
        int k = 0;
        double start = now_s();
        dg_node *target = dg_graph_find(g, "sum");
        for (int r = 0; s && v && r < 66 && (r < 9 || now_s() - start < budget); r++) {
            double t0 = now_s();
            if (!dg_session_run(s, feeds, vals, 2, NULL, NULL, 0, &target, 1, st)) break;
            if (r >= 2 && k < 64) times[k++] = now_s() - t0;
        }
        dg_tensor_unref(v);
        dg_session_free(&s);
        dg_graph_free(&g);
        if (k == 0) goto out;
        qsort(times, (size_t)k, sizeof *times, cmp_double);
        // Two Adds: each reads 2 and writes 1 vector of 16 MB.
        cpu.bytes_per_s = 6.0 * (double)n * 4 / times[k / 2];
    }
    {   // One op: a chain of 200 MatMuls of 1x1 (elementwise chains would be fused into one).
        dg_graph *g = dg_graph_new();
        dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(1, 1)), h = x;
        for (int i = 0; i < 200; i++) h = dg_matmul(g, NULL, h, x, false, false);
        dg_session *s = dg_session_new(g, "local", &so, st);
        dg_tensor *v = dg_tensor_new(DG_FLOAT32, dg_shape2(1, 1), st);
        if (v) *(float *)dg_tensor_data(v) = 1.0f;
        double t = s && v ? time_runs(s, h.node, &x, v, budget, st) : -1;
        dg_tensor_unref(v);
        dg_session_free(&s);
        dg_graph_free(&g);
        if (t <= 0) goto out;
        cpu.op_overhead_s = t / 200;
    }
    printf("CPU: %.3g FLOP/s, %.3g B/s, %.3g s an op\n", cpu.flops_per_s, cpu.bytes_per_s, cpu.op_overhead_s);
    if (!dg_cost_model_set_device(m, "CPU", cpu, st)) goto out;
    {   // Two CPUs of one process.
        dg_session_options two = so;
        two.n_virtual_cpus = 1;
        two.inter_op_threads = 2;
        const char *a = "/job:localhost/replica:0/task:0/device:CPU:0", *b = "/job:localhost/replica:0/task:0/device:CPU:1";
        double small = transfer_s("local", &two, 1, a, b, budget, st);
        double large = small >= 0 ? transfer_s("local", &two, (int64_t)4 << 20, a, b, budget, st) : -1;
        if (large < 0 || !link_figures(small, large, (int64_t)16 << 20, &same_task)) goto out;
    }
    printf("same task: %.3g s + bytes / %.3g B/s\n", same_task.latency_s, same_task.bytes_per_s);
    if (!dg_cost_model_set_link(m, DG_LINK_SAME_TASK, same_task, st)) goto out;
    {   // Two tasks on this host: two servers in this process.
        int p0 = free_port(), p1 = free_port();
        char spec[96];
        snprintf(spec, sizeof spec, "worker|127.0.0.1:%d;127.0.0.1:%d", p0, p1);
        c = p0 > 0 && p1 > 0 ? dg_cluster_from_spec_string(spec, st) : NULL;
        dg_server_options sv = dg_server_options_default();
        sv.quiet = true;
        for (int t = 0; c && t < 2; t++) servers[t] = dg_server_new(c, "worker", t, &sv, st);
        if (!servers[0] || !servers[1]) goto out;
        const char *a = "/job:worker/task:0", *b = "/job:worker/task:1";
        double small = transfer_s(dg_server_target(servers[0]), &so, 1, a, b, budget, st);
        double large = small >= 0 ? transfer_s(dg_server_target(servers[0]), &so, (int64_t)4 << 20, a, b, budget, st) : -1;
        if (large < 0 || !link_figures(small, large, (int64_t)16 << 20, &same_host)) goto out;
    }
    printf("same host: %.3g s + bytes / %.3g B/s\n", same_host.latency_s, same_host.bytes_per_s);
    if (!dg_cost_model_set_link(m, DG_LINK_SAME_HOST, same_host, st)) goto out;
    if (o->out) {
        if (!dg_cost_model_save(m, o->out, st)) goto out;
        printf("wrote %s\n", o->out);
    }
    rc = 0;
out:
    if (rc) inspect_die_status("calibrate", st);
    for (int t = 0; t < 2; t++) dg_server_free(&servers[t]);
    dg_cluster_free(&c);
    dg_cost_model_free(&m);
    dg_status_free(&st);
    return rc;
}
