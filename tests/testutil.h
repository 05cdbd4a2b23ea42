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
