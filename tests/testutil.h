/* Helpers shared by the cmocka unit tests. Include after <cmocka.h>'s prerequisites. */
#ifndef DG_TESTUTIL_H
#define DG_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "distgraph/distgraph.h"

// Fails the test with the status message when st is not OK.
#define assert_ok(st) dg_test_assert_ok((st), __FILE__, __LINE__)
// Fails unless st has `code` and its message contains `needle`.
#define assert_status(st, code, needle) \
    dg_test_assert_status((st), (code), (needle), __FILE__, __LINE__)

void dg_test_assert_ok(const dg_status *st, const char *file, int line);
void dg_test_assert_status(const dg_status *st, dg_code code, const char *needle,
                           const char *file, int line);
// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick, handed back): free
// to bind, and nobody listens on it. Fails the test if the kernel gives none.
int dg_test_free_port(void);
// A local session over CPU:0 and n_devices - 1 virtual CPUs with inter_op_threads threads;
// fails the test if it cannot be made.
dg_session *dg_test_local_session(dg_graph *g, int n_devices, int inter_op_threads, dg_status *st);
// Tables of recorded answers (tests/tf_conformance/*.tsv): a line's tab-separated cells, split
// in place (at most max; the count is returned), and a cell's escapes undone in place (\\ \t
// \n \r \xHH; a cell of just \e is the empty string). Returns: the cell.
int dg_test_tsv_split(char *line, char **cells, int max);
char *dg_test_tsv_unescape(char *cell);
// Removes dir and everything under it (no symbolic link followed); errors are ignored.
void dg_test_rmtree(const char *dir);
// A fresh directory for one test: dir made by mkdtemp as /tmp/<prefix>_XXXXXX, and path, the
// file dir/ckpt.db (not created), the checkpoint tests' store. dg_test_tmpdir_make fails the
// test when the directory cannot be made; dg_test_tmpdir_remove restores the directory's
// permissions (a test may take them away) and removes it with all it holds.
typedef struct dg_test_tmpdir {
    char dir[96];
    char path[128];
} dg_test_tmpdir;
void dg_test_tmpdir_make(dg_test_tmpdir *t, const char *prefix);
void dg_test_tmpdir_remove(dg_test_tmpdir *t);
// The same as a cmocka fixture (cmocka_unit_test_setup_teardown or a group's): *state becomes
// a new dg_test_tmpdir with the prefix "dg_test", freed by the teardown.
int dg_test_tmpdir_setup(void **state);
int dg_test_tmpdir_teardown(void **state);
// Numeric comparisons: the one way a test here compares computed numbers with a reference
// (docs/CONTRIBUTING.md, "Numeric checks"). A value got is close to its reference want when
// both are finite and |got - want| <= atol + rtol * |want|; an infinity matches only the same
// infinity in want; NaN never matches, not even a NaN reference. Written so that a NaN makes
// every comparison false: the checks below fail on it instead of passing.
bool dg_test_is_close(double got, double want, double atol, double rtol);
// The index of the first element of got[0..n) not close to want, or -1 when all are.
int64_t dg_test_first_far_f64(const double *got, const double *want, int64_t n, double atol, double rtol);
int64_t dg_test_first_far_f32(const float *got, const double *want, int64_t n, double atol, double rtol);
// The largest |want[i]| (the scale of a reference, for an atol relative to it); NaN when a
// reference element is NaN or infinite, which then fails every comparison against it.
double dg_test_max_abs_f64(const double *want, int64_t n);
double dg_test_max_abs_f32(const float *want, int64_t n);
// Fail the test unless every element is close, naming what (the expression or a label), the
// index and both values.
void dg_test_assert_close_f64(const double *got, const double *want, int64_t n, double atol, double rtol,
                              const char *what, const char *file, int line);
void dg_test_assert_close_f32(const float *got, const double *want, int64_t n, double atol, double rtol,
                              const char *what, const char *file, int line);
// Arrays: got (double * or float *), want (double *), n elements.
#define assert_close_f64(got, want, n, atol, rtol) \
    dg_test_assert_close_f64((got), (want), (n), (atol), (rtol), #got, __FILE__, __LINE__)
#define assert_close_f32(got, want, n, atol, rtol) \
    dg_test_assert_close_f32((got), (want), (n), (atol), (rtol), #got, __FILE__, __LINE__)
// One value against its reference.
#define assert_close(got, want, atol, rtol) \
    dg_test_assert_close_f64(&(double){(got)}, &(double){(want)}, 1, (atol), (rtol), #got, __FILE__, __LINE__)
// As the above, with a label of the caller's (printf format) in place of the expression.
void dg_test_assert_close_f64_msg(const double *got, const double *want, int64_t n, double atol, double rtol,
                                  const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
#define assert_close_f64_msg(got, want, n, atol, rtol, ...) \
    dg_test_assert_close_f64_msg((got), (want), (n), (atol), (rtol), __FILE__, __LINE__, __VA_ARGS__)

// A deterministic uniform double in [lo, hi) from *state (xorshift).
double dg_test_uniform(uint64_t *state, double lo, double hi);

// A toy model: w (3x2, float64) on /job:ps/task:0 when distributed, x @ w summed and squared
// on /job:worker/task:0, Adam 0.1 with a global step.
typedef struct dg_test_model {
    dg_graph *g;
    dg_output x, w, loss;
    dg_node *train, *init;
} dg_test_model;
void dg_test_model_build(dg_test_model *m, bool distributed);
// Initializes, runs 5 steps on a fixed batch (loss_out[5]) and fetches w (w_out[6]); fails the
// test on any error.
void dg_test_model_train(dg_session *s, dg_test_model *m, double *w_out, double *loss_out);

#endif
