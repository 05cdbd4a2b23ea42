#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void dg_test_assert_ok(const dg_status *st, const char *file, int line) {
    if (dg_status_ok(st)) return;
    print_error("%s:%d: status %s: %s\n", file, line, dg_code_name(dg_status_code(st)),
                dg_status_message(st));
    _fail(file, line);
}

void dg_test_assert_status(const dg_status *st, dg_code code, const char *needle,
                           const char *file, int line) {
    if (dg_status_code(st) == code && (!needle || strstr(dg_status_message(st), needle)))
        return;
    print_error("%s:%d: expected %s containing \"%s\", got %s: \"%s\"\n", file, line,
                dg_code_name(code), needle ? needle : "", dg_code_name(dg_status_code(st)),
                dg_status_message(st));
    _fail(file, line);
}

double dg_test_uniform(uint64_t *state, double lo, double hi) {
    uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return lo + (hi - lo) * ((double)(x >> 11) / 9007199254740992.0);
}

int dg_test_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

dg_session *dg_test_local_session(dg_graph *g, int n_devices, int inter_op_threads, dg_status *st) {
    dg_session_options o = dg_session_options_default();
    o.n_virtual_cpus = n_devices - 1;
    o.inter_op_threads = inter_op_threads;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    return s;
}
