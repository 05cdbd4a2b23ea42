/* A program of a user's own, built outside the distgraph tree against the installed library:
 * a cluster of one ps task and one worker task, both served from this process on 127.0.0.1,
 * learns y = 2x + 1 with the variables on the ps and the arithmetic on the worker. It prints
 * the loss at the first and last step and exits 0 only when the loss fell at least tenfold.
 *   ./train_linear [--steps N] [--ps_port P --worker_port Q]   (ports: free ones by default) */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <distgraph/distgraph.h>

// A TCP port of 127.0.0.1 free right now (the kernel picks it).
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static int fail(const char *what, const dg_status *st) {
    fprintf(stderr, "train_linear: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

int main(int argc, char **argv) {
    int steps = 200, ps_port = 0, worker_port = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--ps_port") == 0) ps_port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--worker_port") == 0) worker_port = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: train_linear [--steps N] [--ps_port P --worker_port Q]\n");
            return 2;
        }
    }
    if (steps < 2) steps = 2;
    if (!ps_port) ps_port = free_port();
    if (!worker_port) worker_port = free_port();
    printf("distgraph %s (built against %s)\n", dg_version(), DG_VERSION_STRING);

    dg_status *st = dg_status_new();
    char ps_addr[32], worker_addr[32];
    snprintf(ps_addr, sizeof ps_addr, "127.0.0.1:%d", ps_port);
    snprintf(worker_addr, sizeof worker_addr, "127.0.0.1:%d", worker_port);
    dg_cluster *c = dg_cluster_from_flags(ps_addr, worker_addr, st);
    if (!c) return fail("cluster", st);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *ps = dg_server_new(c, "ps", 0, &so, st);
    if (!ps) return fail("ps server", st);
    dg_server *worker = dg_server_new(c, "worker", 0, &so, st);
    if (!worker) return fail("worker server", st);

    // y = w x + b, the variables on the ps, the loss and its gradients on the worker.
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0");
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(1, 1), dg_init_zeros());
    dg_output b = dg_variable(g, "b", DG_FLOAT32, dg_shape1(1), dg_init_zeros());
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 1));
    dg_output y = dg_placeholder(g, "y", DG_FLOAT32, dg_shape2(-1, 1));
    dg_output pred = dg_bias_add(g, "pred", dg_matmul(g, NULL, x, w, false, false), b);
    dg_output loss = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, pred, y)), NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    dg_graph_pop_device(g);
    dg_node *init = dg_global_variables_initializer(g);
    if (!dg_graph_ok(g)) return fail("building the graph", dg_graph_status(g));

    dg_session *s = dg_session_new(g, dg_server_target(worker), NULL, st);
    if (!s || !dg_session_run_target(s, init, st)) return fail("initializing", st);
    enum { ROWS = 32 };
    float xs[ROWS], ys[ROWS];
    for (int i = 0; i < ROWS; i++) {
        xs[i] = -1.0f + 2.0f * (float)i / (ROWS - 1);
        ys[i] = 2.0f * xs[i] + 1.0f;
    }
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(ROWS, 1), xs, st);
    dg_tensor *yt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(ROWS, 1), ys, st);
    if (!xt || !yt) return fail("feeds", st);
    dg_output feeds[2] = {x, y};
    dg_tensor *vals[2] = {xt, yt};
    double first = NAN, last = NAN;
    for (int i = 0; i < steps; i++) {
        dg_tensor *l = NULL;
        if (!dg_session_run(s, feeds, vals, 2, &loss, &l, 1, &train, 1, st)) return fail("training step", st);
        double v = dg_tensor_f32(l)[0];
        dg_tensor_unref(l);
        if (i == 0) first = v;
        last = v;
    }
    printf("loss at step 1: %.6f, at step %d: %.6f\n", first, steps, last);
    bool fell = isfinite(first) && isfinite(last) && last < first / 10;
    printf("%s\n", fell ? "the loss fell tenfold" : "the loss did not fall tenfold");

    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_server_free(&worker);
    dg_server_free(&ps);
    dg_cluster_free(&c);
    dg_status_free(&st);
    return fell ? 0 : 1;
}
