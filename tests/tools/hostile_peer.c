/* hostile_peer: plays a peer that misbehaves against a running task and measures what it costs
 * the task (its resident memory, from /proc/PID/status; its CPU time, from /proc/PID/stat).
 * For tests/integration/hostile_limits.sh; one JSON line per scenario on stdout.
 *
 *   hostile_peer --target 127.0.0.1:PORT --pid PID --scenario NAME [--connections N] [--hold_ms T]
 *
 * Scenarios:
 *   chunks       each of N connections sends 200 TENSOR_CHUNKs of 66 bytes far into fresh
 *                transfers announcing 1 GiB; then one of them sends 200 real first chunks
 *                (1 MiB each) of fresh transfers; then all disconnect.
 *   pings        one connection sends 8 PINGs of 100 MiB and 3000 PINGs of 60 KiB and never
 *                reads a reply; then it disconnects.
 *   abort_marks  N ABORT_STEP messages (--connections N) for steps that never run there.
 *   connections  N raw TCP connections that never speak, held for hold_ms, while one ZeroMQ
 *                client PINGs the task every 100 ms; the line gives how many of those PINGs
 *                were answered and the task's CPU time.
 * Figures: rss_before_kb (before), rss_peak_kb (highest seen while the peer misbehaves; one
 * message being received takes its size for that time), rss_held_kb (what the task still
 * holds once the peer has stopped sending but stays connected, reading nothing), rss_after_kb
 * (2 s after it left). Exits 1 when the task stops answering. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "distgraph/distgraph.h"
#include "wire_impl.h"

static int pid = -1;
static long rss_peak;

static long rss_kb(void) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    if (f) fclose(f);
    if (kb > rss_peak) rss_peak = kb;
    return kb;
}

static double cpu_s(void) {   // the task's user + system time
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

// Samples the task's memory for ms milliseconds.
static void watch(int ms) {
    for (int64_t end = now_ms() + ms; now_ms() < end; sleep_ms(20)) rss_kb();
}

static void *dealer(void *zctx, const char *ep) {
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    if (zmq_connect(s, ep) != 0) {
        fprintf(stderr, "hostile_peer: connect %s: %s\n", ep, zmq_strerror(zmq_errno()));
        exit(2);
    }
    return s;
}

static void send2(void *s, const void *a, size_t alen, const void *b, size_t blen) {
    zmq_send(s, a, alen, b ? ZMQ_SNDMORE : 0);
    if (b) zmq_send(s, b, blen, 0);
}

static char *chunk_header(uint64_t xfer, uint64_t total, uint64_t off, size_t *len) {
    rt_header h;
    rt_header_init(&h, RT_TENSOR_CHUNK);
    h.key = strdup("k");
    h.step_id = 1;
    h.xfer = xfer;
    h.total = total;
    h.offset = off;
    h.tensors = calloc(1, sizeof *h.tensors);
    h.tensors[0].dtype = DG_UINT8;
    h.tensors[0].shape = dg_shape1((int64_t)total);
    h.tensors[0].nbytes = total;
    h.n_tensors = 1;
    char *b = rt_header_encode(&h, len);
    rt_header_clear(&h);
    return b;
}

// One PING from a fresh, well-behaved client; true when answered within timeout_ms.
static bool answers(void *zctx, const char *ep, int timeout_ms) {
    void *s = dealer(zctx, ep);
    rt_header h;
    rt_header_init(&h, RT_PING);
    h.id = 7;
    size_t len;
    char *b = rt_header_encode(&h, &len);
    rt_header_clear(&h);
    send2(s, b, len, NULL, 0);
    free(b);
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    bool ok = zmq_poll(&it, 1, timeout_ms) == 1;
    zmq_close(s);
    return ok;
}

static void line(const char *scenario, long before, long held, long after, const char *extra) {
    printf("{\"bench\": \"hostile_peer\", \"scenario\": \"%s\", \"rss_before_kb\": %ld, \"rss_peak_kb\": %ld, "
           "\"rss_held_kb\": %ld, \"rss_after_kb\": %ld, \"growth_peak_kb\": %ld, \"growth_held_kb\": %ld, "
           "\"growth_after_kb\": %ld%s}\n",
           scenario, before, rss_peak, held, after, rss_peak - before, held - before, after - before, extra);
    fflush(stdout);
}

static int chunks(void *zctx, const char *ep, int n_conns) {
    long before = rss_kb();
    rss_peak = before;
    void **s = calloc((size_t)n_conns, sizeof *s);
    unsigned char *mib = calloc(1, 1 << 20);
    uint64_t xfer = 1, total = (uint64_t)1 << 30;
    long long sent = 0;
    for (int c = 0; c < n_conns; c++) s[c] = dealer(zctx, ep);
    // The original report: 66-byte chunks far into fresh 1 GiB transfers, from every connection.
    for (int k = 0; k < 200; k++) {
        for (int c = 0; c < n_conns; c++) {
            size_t len;
            char *b = chunk_header(xfer++, total, (uint64_t)(k + 1) << 22, &len);
            send2(s[c], b, len, mib, 66);
            sent += (long long)len + 66;
            free(b);
        }
    }
    // Real first chunks (1 MiB each, touching a 2 MiB page) of fresh transfers from one.
    for (int k = 0; k < 200; k++) {
        size_t len;
        char *b = chunk_header(xfer++, total, 0, &len);
        send2(s[0], b, len, mib, 1 << 20);
        sent += (long long)len + (1 << 20);
        free(b);
        if (k % 10 == 0) rss_kb();
    }
    watch(1500);
    long held = rss_kb();
    for (int c = 0; c < n_conns; c++) zmq_close(s[c]);
    free(s);
    free(mib);
    watch(2000);
    long after = rss_kb();
    bool ok = answers(zctx, ep, 5000);
    char extra[128];
    snprintf(extra, sizeof extra, ", \"connections\": %d, \"bytes_sent\": %lld, \"answers_after\": %s", n_conns,
             sent, ok ? "true" : "false");
    line("chunks", before, held, after, extra);
    return ok ? 0 : 1;
}

static int pings(void *zctx, const char *ep) {
    long before = rss_kb();
    rss_peak = before;
    void *s = dealer(zctx, ep);
    int one = 1, small = 4096;
    zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof one);   // read nothing, queue nothing here
    zmq_setsockopt(s, ZMQ_RCVBUF, &small, sizeof small);
    size_t big = (size_t)100 << 20, little = (size_t)60 << 10;
    unsigned char *payload = calloc(1, big);
    for (int i = 0; i < 8 + 3000; i++) {
        size_t n = i < 8 ? big : little;
        rt_header h;
        rt_header_init(&h, RT_PING);
        h.id = (uint64_t)i + 1;
        dg_tensor *t = dg_tensor_wrap(DG_UINT8, dg_shape1((int64_t)n), payload, n, NULL, NULL, NULL);
        rt_header_add_tensor(&h, t);
        size_t len;
        char *b = rt_header_encode(&h, &len);
        rt_header_clear(&h);
        dg_tensor_unref(t);
        send2(s, b, len, payload, n);
        free(b);
        if (i % 50 == 0) rss_kb();
    }
    watch(2000);
    long held = rss_kb();
    zmq_close(s);
    free(payload);
    watch(2000);
    long after = rss_kb();
    bool ok = answers(zctx, ep, 5000);
    char extra[96];
    snprintf(extra, sizeof extra, ", \"answers_after\": %s", ok ? "true" : "false");
    line("pings", before, held, after, extra);
    return ok ? 0 : 1;
}

// ABORT_STEP for n step ids that never run on the task (pushes: no answers), then a PING
// to know the task has taken them all in.
static int abort_marks(void *zctx, const char *ep, int n) {
    long before = rss_kb();
    rss_peak = before;
    void *s = dealer(zctx, ep);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        rt_header h;
        rt_header_init(&h, RT_ABORT_STEP);
        h.step_id = (int64_t)(x >> 2) + 1;
        h.code = DG_CANCELLED;
        size_t len;
        char *b = rt_header_encode(&h, &len);
        rt_header_clear(&h);
        send2(s, b, len, NULL, 0);
        free(b);
    }
    bool ok = false;
    rt_header h;
    rt_header_init(&h, RT_PING);
    h.id = 9;
    size_t len;
    char *b = rt_header_encode(&h, &len);
    rt_header_clear(&h);
    send2(s, b, len, NULL, 0);
    free(b);
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    ok = zmq_poll(&it, 1, 30000) == 1;
    zmq_close(s);
    char extra[64];
    snprintf(extra, sizeof extra, ", \"aborts_sent\": %d", n);
    line("abort_marks", before, rss_kb(), rss_kb(), extra);
    return ok ? 0 : 1;
}

static int connections(void *zctx, const char *ep, const char *host, int port, int n, int hold_ms) {
    long before = rss_kb();
    rss_peak = before;
    int *fds = malloc((size_t)n * sizeof *fds);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    int opened = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof sa) != 0) {
            fprintf(stderr, "hostile_peer: connection %d: %s\n", i, strerror(errno));
            if (fds[i] >= 0) close(fds[i]);
            fds[i] = -1;
            continue;
        }
        opened++;
    }
    double cpu0 = cpu_s();
    int64_t t0 = now_ms();
    int asked = 0, answered = 0;
    while (now_ms() - t0 < hold_ms) {
        asked++;
        answered += answers(zctx, ep, 2000);
        rss_kb();
        sleep_ms(100);
    }
    double cpu = (cpu_s() - cpu0) / ((double)(now_ms() - t0) / 1000.0);
    int closed = 0;   // connections the task closed (end of stream after its greeting)
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) continue;
        char buf[256];
        ssize_t r;
        while ((r = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT)) > 0) {}
        if (r == 0) closed++;
        close(fds[i]);
    }
    free(fds);
    watch(1000);
    long after = rss_kb();
    char extra[256];
    snprintf(extra, sizeof extra,
             ", \"held\": %d, \"closed_by_task\": %d, \"pings_asked\": %d, \"pings_answered\": %d, "
             "\"task_cpu_fraction\": %.3f",
             opened, closed, asked, answered, cpu);
    line("connections", before, rss_kb(), after, extra);
    return answered == asked ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *target = NULL, *scenario = NULL;
    int n_conns = 20, hold_ms = 3000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--target") == 0) target = argv[i + 1];
        else if (strcmp(argv[i], "--pid") == 0) pid = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--scenario") == 0) scenario = argv[i + 1];
        else if (strcmp(argv[i], "--connections") == 0) n_conns = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--hold_ms") == 0) hold_ms = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "hostile_peer: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    char host[64];
    int port = 0;
    if (!target || pid <= 0 || !scenario || sscanf(target, "%63[^:]:%d", host, &port) != 2 || n_conns < 1) {
        fprintf(stderr, "usage: hostile_peer --target HOST:PORT --pid PID --scenario chunks|pings|connections|abort_marks "
                        "[--connections N] [--hold_ms T]\n");
        return 2;
    }
    char ep[128];
    snprintf(ep, sizeof ep, "tcp://%s:%d", host, port);
    void *zctx = zmq_ctx_new();
    int max_sockets = 4096;
    zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, max_sockets);
    int rc = 2;
    if (strcmp(scenario, "chunks") == 0) rc = chunks(zctx, ep, n_conns);
    else if (strcmp(scenario, "pings") == 0) rc = pings(zctx, ep);
    else if (strcmp(scenario, "connections") == 0) rc = connections(zctx, ep, host, port, n_conns, hold_ms);
    else if (strcmp(scenario, "abort_marks") == 0) rc = abort_marks(zctx, ep, n_conns);
    else fprintf(stderr, "hostile_peer: unknown scenario %s\n", scenario);
    zmq_ctx_term(zctx);
    return rc;
}
