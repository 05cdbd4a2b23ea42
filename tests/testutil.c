#include "testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
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

bool dg_test_is_close(double got, double want, double atol, double rtol) {
    if (isinf(want)) return got == want;
    if (!isfinite(got) || !isfinite(want)) return false;
    return fabs(got - want) <= atol + rtol * fabs(want);   // false for a NaN tolerance too
}

int64_t dg_test_first_far_f64(const double *got, const double *want, int64_t n, double atol, double rtol) {
    for (int64_t i = 0; i < n; i++)
        if (!dg_test_is_close(got[i], want[i], atol, rtol)) return i;
    return -1;
}

int64_t dg_test_first_far_f32(const float *got, const double *want, int64_t n, double atol, double rtol) {
    for (int64_t i = 0; i < n; i++)
        if (!dg_test_is_close((double)got[i], want[i], atol, rtol)) return i;
    return -1;
}

double dg_test_max_abs_f64(const double *want, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(want[i])) return NAN;
        if (fabs(want[i]) > m) m = fabs(want[i]);
    }
    return m;
}

double dg_test_max_abs_f32(const float *want, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(want[i])) return NAN;
        if (fabs((double)want[i]) > m) m = fabs((double)want[i]);
    }
    return m;
}

static void report_far(const char *what, int64_t i, int64_t n, double got, double want, double atol,
                       double rtol, const char *file, int line) {
    print_error("%s:%d: %s: element %lld of %lld is %.17g, want %.17g (atol %g, rtol %g%s)\n", file, line,
                what, (long long)i, (long long)n, got, want, atol, rtol,
                isnan(got) ? ", NaN" : isinf(got) && !isinf(want) ? ", an infinity" : "");
    _fail(file, line);
}

void dg_test_assert_close_f64(const double *got, const double *want, int64_t n, double atol, double rtol,
                              const char *what, const char *file, int line) {
    int64_t i = dg_test_first_far_f64(got, want, n, atol, rtol);
    if (i >= 0) report_far(what, i, n, got[i], want[i], atol, rtol, file, line);
}

void dg_test_assert_close_f32(const float *got, const double *want, int64_t n, double atol, double rtol,
                              const char *what, const char *file, int line) {
    int64_t i = dg_test_first_far_f32(got, want, n, atol, rtol);
    if (i >= 0) report_far(what, i, n, got[i], want[i], atol, rtol, file, line);
}

void dg_test_assert_close_f64_msg(const double *got, const double *want, int64_t n, double atol, double rtol,
                                  const char *file, int line, const char *fmt, ...) {
    int64_t i = dg_test_first_far_f64(got, want, n, atol, rtol);
    if (i < 0) return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    report_far(what, i, n, got[i], want[i], atol, rtol, file, line);
}

double dg_test_uniform(uint64_t *state, double lo, double hi) {
    uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return lo + (hi - lo) * ((double)(x >> 11) / 9007199254740992.0);
}

// A free port below the kernel's ephemeral range where it leaves room (as the integration
// tests' free_ports): an ephemeral one can be taken by any outgoing connection meanwhile.
static bool bind_loopback(int port, int *got) {   // port 0: any
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    socklen_t len = sizeof a;
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    close(fd);
    *got = ntohs(a.sin_port);
    return ok;
}

int dg_test_free_port(void) {
    int lo = 15000, hi = 32767, eph = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &eph) == 1 && eph - 1 < hi) hi = eph - 1;
        fclose(f);
    }
    // Tests run side by side (ctest -j, the script's valgrind pass) and each binds its ports a
    // while after picking them: each process draws from a slice of its own (by pid) first, so
    // two of them rarely pick the same port ("Address already in use" once in a valgrind pass).
    if (hi - lo > 16 * 1000) {
        int slice = (hi - lo) / 16;
        lo += (int)((unsigned)getpid() % 16u) * slice;
        hi = lo + slice;
    }
    // One stream per process, and no port handed out twice: the caller binds it later.
    static unsigned seed;
    static int given[64], n_given;
    if (!seed) seed = ((unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL)) | 1;
    int port = 0;
    for (int attempt = 0; hi - lo > 1000 && attempt < 200; attempt++) {
        int want = lo + (int)(rand_r(&seed) % (unsigned)(hi - lo));
        bool seen = false;
        for (int i = 0; i < n_given && i < 64; i++) seen |= given[i] == want;
        if (!seen && bind_loopback(want, &port)) break;
        port = 0;
    }
    if (!port) assert_true(bind_loopback(0, &port));
    given[n_given++ % 64] = port;
    return port;
}

dg_session *dg_test_local_session(dg_graph *g, int n_devices, int inter_op_threads, dg_status *st) {
    dg_session_options o = dg_session_options_default();
    o.n_virtual_cpus = n_devices - 1;
    o.inter_op_threads = inter_op_threads;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    return s;
}

void dg_test_model_build(dg_test_model *m, bool distributed) {
    m->g = dg_graph_new();
    if (distributed) dg_graph_push_device(m->g, "/job:ps/task:0");
    m->w = dg_variable(m->g, "w", DG_FLOAT64, dg_shape2(3, 2), dg_init_random_normal(0, 1, 3));
    if (distributed) {
        dg_graph_pop_device(m->g);
        dg_graph_push_device(m->g, "/job:worker/task:0");
    }
    m->x = dg_placeholder(m->g, "x", DG_FLOAT64, dg_shape2(-1, 3));
    dg_output y = dg_matmul(m->g, NULL, m->x, m->w, false, false);
    m->loss = dg_sum(m->g, NULL, dg_square(m->g, NULL, y), NULL, 0, false);
    dg_optimizer opt = dg_adam(m->g, 0.1);
    m->train = dg_optimizer_minimize(&opt, m->loss, dg_global_step(m->g));
    if (distributed) dg_graph_pop_device(m->g);
    m->init = dg_global_variables_initializer(m->g);
}

void dg_test_model_train(dg_session *s, dg_test_model *m, double *w_out, double *loss_out) {
    dg_status *st = dg_status_new();
    assert_true(dg_session_run_target(s, m->init, st));
    assert_ok(st);
    double xv[6] = {1, 2, 3, -1, 0.5, 2};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(2, 3), xv, st);
    for (int i = 0; i < 5; i++) {
        dg_tensor *loss = NULL;
        assert_true(dg_session_run(s, &m->x, &xt, 1, &m->loss, &loss, 1, &m->train, 1, st));
        assert_ok(st);
        loss_out[i] = dg_tensor_f64(loss)[0];
        dg_tensor_unref(loss);
    }
    dg_tensor *wv = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &m->w, &wv, 1, NULL, 0, st));
    assert_ok(st);
    memcpy(w_out, dg_tensor_data(wv), 6 * sizeof(double));
    dg_tensor_unref(wv);
    dg_tensor_unref(xt);
    dg_status_free(&st);
}

int dg_test_tsv_split(char *line, char **cells, int max) {
    int n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *p = line; n < max;) {
        cells[n++] = p;
        char *tab = strchr(p, '\t');
        if (!tab) break;
        *tab = '\0';
        p = tab + 1;
    }
    return n;
}

char *dg_test_tsv_unescape(char *s) {
    if (strcmp(s, "\\e") == 0) {
        s[0] = '\0';
        return s;
    }
    char *o = s;
    for (const char *p = s; *p; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 't': *o++ = '\t'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 'x': {
            char hex[3] = {p[1], p[1] ? p[2] : 0, 0};
            *o++ = (char)strtol(hex, NULL, 16);
            p += p[1] && p[2] ? 2 : p[1] ? 1 : 0;
            break;
        }
        case '\0': p--; break;   // a lone trailing backslash
        default: *o++ = *p; break;
        }
    }
    *o = '\0';
    return s;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void dg_test_rmtree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

void dg_test_tmpdir_make(dg_test_tmpdir *t, const char *prefix) {
    int n = snprintf(t->dir, sizeof t->dir, "/tmp/%s_XXXXXX", prefix);
    if (n < 0 || (size_t)n >= sizeof t->dir) fail_msg("temporary directory prefix \"%s\" is too long", prefix);
    if (!mkdtemp(t->dir)) fail_msg("mkdtemp(%s): %s", t->dir, strerror(errno));
    snprintf(t->path, sizeof t->path, "%s/ckpt.db", t->dir);
}

void dg_test_tmpdir_remove(dg_test_tmpdir *t) {
    chmod(t->dir, 0700);
    dg_test_rmtree(t->dir);
}

int dg_test_tmpdir_setup(void **state) {
    dg_test_tmpdir *t = calloc(1, sizeof *t);
    if (!t) return -1;
    snprintf(t->dir, sizeof t->dir, "/tmp/dg_test_XXXXXX");
    if (!mkdtemp(t->dir)) {
        free(t);
        return -1;
    }
    snprintf(t->path, sizeof t->path, "%s/ckpt.db", t->dir);
    *state = t;
    return 0;
}

int dg_test_tmpdir_teardown(void **state) {
    dg_test_tmpdir *t = *state;
    if (t) dg_test_tmpdir_remove(t);
    free(t);
    *state = NULL;
    return 0;
}
